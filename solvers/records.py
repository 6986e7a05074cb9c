"""What every run keeps while it steps, whatever its solver: its saves, the wall time it has taken, and the
failure that ends it carrying the saves made so far (a numerical failure keeps the last good state:
docs/design.md "Command line"). A recorder hands its saves to spherepde.io.output as a plain `Saves` record."""

import time as wallclock

from spherepde.base.errors import NumericalFailure
from spherepde.io.output import Saves


class RunRecord:
    """Saves (`times`, diagnostics `rows`), `notes` for the output, and `wall_seconds` of a run, a failed one
    included: counted from `start_clock`, added up at each `tick` (checkpoints, the end, a failure).  Each solver's
    recorder adds `dataset(status)`, its output Dataset so far, built from `saves`."""

    def __init__(self, case):
        self.case = case
        self.lyapunov_p = list(case["diagnostics"]["lyapunov_p"])
        self.times, self.rows, self.notes = [], [], []
        self.wall_seconds = 0.0
        self._clock = wallclock.perf_counter()

    def start_clock(self) -> None:
        """Time stepping starts (or resumes) now: wall_seconds counts from here."""
        self._clock = wallclock.perf_counter()

    def tick(self) -> None:
        """Add the wall time since the clock started, or since the last tick, to wall_seconds."""
        now = wallclock.perf_counter()
        self.wall_seconds += now - self._clock
        self._clock = now

    def saves(self, status: str, attrs: dict, **fields) -> Saves:
        """The plain record of the saves so far, with the output attributes `attrs` after solver and status."""
        return Saves(self.case, self.times, self.rows, self.lyapunov_p,
                     {"solver": attrs.pop("solver"), "status": status} | attrs, **fields)

    def failure_cause(self) -> str:
        """What the failure message adds about the likely cause ("" when nothing is known)."""
        return ""

    def failure(self, reason: str, cause: str | None = None) -> NumericalFailure:
        """The failure of the run, carrying its dataset up to the last good save; `cause`, when the caller knows
        it, is said after `failure_cause`: a density under-resolved before the failure moves faster than its
        model allows (|v| > |V| with the softmax), so that a step from it passes the bound at any dt, and the step's
        advice alone was followed from failure to failure."""
        self.notes.append(reason)
        self.tick()
        cause = self.failure_cause() + ("" if cause is None else f"; {cause}")
        return NumericalFailure(f"numerical failure: {reason}; the last good state (t = {self.times[-1]:.6g}) "
                                f"is kept{cause}", self.dataset(f"failed: {reason}"))
