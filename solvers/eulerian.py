"""The forward Eulerian solver: rho_t of M members at once, in spectral space.

    d_t c = eps Lap c - div(rho v[rho])^        (c = spectral coefficients of rho)

The diffusion is diagonal in the basis (implicit, or an integrating factor), the transport
(spherepde.model.transport) is evaluated on the dealiased grid and returned to spectral space through the weak
divergence, whose degree-0 coefficient is zero: mass is conserved to round-off by construction.

Members share the grid, the scheme and the save times, and may differ in the initial law and the model's
B, V, W, beta, eps (`ForwardProblem` of several cases; solvers.timegrid.integrate steps them together).  A model
whose matrices vary over L layers (spherepde.model.parameters.model_layers) switches them at t_end l / L, knots
of the time grid.  A
member's file is the file its serial run writes: its numbers are those of a run of its case alone to
round-off (tests/test_ensembles.py), `wall_seconds` is the batch's, and `batch_members` says how many ran
together.  Each interval between saves is split into equal steps no longer than dt (given, or from the CFL
number and the member's current max |v|).
"""

import math

import numpy as np
import torch

from solvers.eulerian_recorder import Recorder
from solvers.forward_problem import ForwardProblem
from solvers.timegrid import Hooks, Plan, TimeGrid, check_max_steps, fixed_steps, integrate, show_step
from spherepde.base.errors import NumericalFailure
from spherepde.base.progress import Progress
from spherepde.base.real_view import real_state
from spherepde.io.output import time_text

MAX_STEPS_PER_SAVE = 1e12  # a CFL step asking for more means the velocity blew up
# A finite state is no density any more when |rho| exceeds this many times the densest one the grid holds
# (all the mass in the smallest cell; a truncated delta peaks at about that on S^1, below it on S^2).
BLOW_UP_FACTOR = 10.0


def checked_state(recorder: Recorder, candidate: torch.Tensor, t0: float, t1: float, dt: float,
                  cause=lambda: None) -> tuple[np.ndarray, dict]:
    """(density, diagnostics row) of the member's coefficients stepped from t0 to t1, or NumericalFailure (the
    recorder's dataset so far) when they are not finite or no longer a density of the run (`departures`), with
    cause() (a sentence, or None for the recorder's own) as its cause."""
    if not bool(torch.isfinite(torch.view_as_real(candidate)).all()):
        raise recorder.failure(f"the density became non-finite between t = {t0:.6g} and {t1:.6g} (dt = {dt:.3g})",
                               cause())
    density, row = recorder.measure(candidate)
    (reason,) = departures(density[None], recorder.weights, np.array([float(recorder.masses_0.sum())]),
                           recorder.basis.placement.real)
    if reason is not None:
        raise recorder.failure(f"{reason} between t = {t0:.6g} and {t1:.6g} (dt = {dt:.3g}): the solution blew up",
                               cause())
    return density, row


def departures(densities: np.ndarray, weights: np.ndarray, masses_0: np.ndarray, real: torch.dtype) -> list:
    """Why each grid density of `densities` (M, P) is no longer one of its run, or None (a list of M): its mass
    int rho dsigma moved from its masses_0 (M,) by more than sqrt(machine epsilon of `real`) relative (the scheme
    conserves it to round-off: module doc; a density that is not finite fails here, its mass not being finite), or
    |rho| exceeds BLOW_UP_FACTOR times that mass over the smallest quadrature cell.  Where both hold the peak is
    named: the mass of a blown-up density is a sum cancelling far above round-off (a drift of -6.2e199 in a batch,
    -1 alone, from values near 1e216), its peak a maximum, the same in any order.  One program for all members: a
    training's batch checks them at every knot."""
    members = len(masses_0)
    masses = densities.reshape(members, -1) @ weights.reshape(-1)
    peaks = np.abs(densities).reshape(members, -1).max(1)
    tolerance = math.sqrt(torch.finfo(real).eps)
    bounds = BLOW_UP_FACTOR * np.abs(masses_0) / weights.min()
    drifted = ~(np.abs(masses - masses_0) <= tolerance * np.abs(masses_0))
    blown_up = np.isfinite(peaks) & ~(peaks <= bounds)
    reasons = [None] * members
    if not (drifted | blown_up).any():
        return reasons
    for m in np.flatnonzero(drifted | blown_up):
        reasons[m] = (f"|rho| reached {peaks[m]:.3g}, above {bounds[m]:.3g} ({BLOW_UP_FACTOR:g} x all the mass in one "
                      "cell)" if blown_up[m] else
                      f"the mass drifted from {masses_0[m]:.6g} by {masses[m] - masses_0[m]:.3g} (relative "
                      f"tolerance {tolerance:.2g})")
    return reasons


def step_plan(problem: ForwardProblem, interval, c: torch.Tensor, a: torch.Tensor, timing: dict) -> tuple[Plan, list]:
    """(the plan of an interval, the members' max |v| at its start or None): time.dt, or the CFL rule
    dt = cfl / (lmax max|v|) of each member's own velocity, dt = cfl / (lmax max|v| + max|eps lam|) where the
    scheme takes the diffusion explicitly too (rk4: stable to 2.78 / max|eps lam| for the diffusion alone, as to
    2.83 / (lmax max|v|) for the transport alone; the sum keeps the modes of both within the region), dt = cfl /
    (lmax max(max|v|, eps)) where it takes the diffusion implicitly (ForwardProblem.implicit_diffusion_speed);
    members whose velocity is not finite or asks for more than MAX_STEPS_PER_SAVE steps are stopped."""
    members = c.shape[0]
    if "dt" in timing:
        steps = np.full(members, fixed_steps(interval, timing["dt"]))
        return Plan(interval, steps, interval.length / steps), None
    speeds = problem.transport.max_speed(c, a).cpu().double().numpy()
    lmax = problem.basis.lmax
    rates = np.maximum(speeds * lmax + problem.explicit_stiffness(), problem.implicit_diffusion_speed() * lmax)
    steps, stopped = np.ones(members, dtype=np.int64), {}
    for m, (speed, rate) in enumerate(zip(speeds, rates)):
        dt_max = interval.length if rate == 0 else min(interval.length, timing["cfl"] / rate)
        if not math.isfinite(speed):
            stopped[m] = f"the velocity became non-finite (max |v| = {speed}) at t = {interval.t0:.6g}"
        elif not interval.length / dt_max <= MAX_STEPS_PER_SAVE:
            stopped[m] = (f"max |v| = {speed:.3g} at t = {interval.t0:.6g} asks for steps of {dt_max:.3g}: too many "
                          f"(more than {MAX_STEPS_PER_SAVE:.0e}) before the next save")
        else:
            steps[m] = max(1, math.ceil(interval.length / dt_max - 1e-9))
    return Plan(interval, steps, interval.length / steps, stopped), list(speeds)


class ForwardHooks(Hooks):
    """The Eulerian run's saves (one Recorder per member), failures, progress and (one member) checkpoints.
    A failure says when the steps were too long for the explicit transport (ForwardProblem.unstable_steps), found
    by taking the steps again from the last save every running member passed (`saved`: (state, t, steps of its
    interval already taken there, whether it is the checkpoint a resumed run started from), the run's start or its
    checkpoint at first; `since_save`: the plans of the intervals from it) with each layer's drive (`drives`);
    `timing` holds the case key that set the steps ("dt" or "cfl", with its value); `last_interval` the index of
    the run's last interval (where a checkpoint marked `at_end` is due at the last step)."""

    def __init__(self, problem: ForwardProblem, recorders: list, bar: Progress, saved: tuple, drives: list,
                 timing: dict, checkpoint=None, last_interval: int = -1):
        self.problem, self.recorders, self.bar, self.checkpoint = problem, recorders, bar, checkpoint
        self.last_interval = last_interval
        self.saved, self.drives = saved, drives
        self.step_key, self.cfl = ("time.dt", None) if "dt" in timing else ("time.cfl", timing["cfl"])
        self.since_save, self.failures = [], {}

    def unstable(self, member: int) -> str | None:
        """ForwardProblem.first_unstable_step of the member since the last save."""
        state, t, done, resumed = self.saved
        said = self.problem.first_unstable_step(state, t, self.since_save, self.drives, self.step_key, member,
                                                self.cfl, done)
        if said is None or not resumed:
            return said
        # the checkpoint holds no state at the last save: the steps before it, where the bound may have been passed
        # first, cannot be taken again
        return (f"{said} (the steps taken again from the checkpoint at t = {time_text(t)} that the run resumed from: "
                f"run it again without --resume to find the first step beyond the bound)")

    def stop(self, member: int, reason: str, plan: Plan) -> None:
        self.failures[member] = self.recorders[member].failure(reason)

    def after_step(self, plan: Plan, done: int, state: torch.Tensor) -> None:
        show_step(self.bar, plan, done)
        checkpoint, recorder = self.checkpoint, self.recorders[0]
        last = plan.interval.index == self.last_interval and done == int(plan.steps[0])
        if checkpoint is not None and checkpoint.due(recorder.steps + done, last):
            # a state that is not finite is not stored, and the failure is left to the knot ahead: reported here,
            # its status and steps depended on where a checkpoint fell (--checkpoint-minutes: the wall clock), and
            # the file differed from an uninterrupted run's.  Interrupted, the run stops on its last checkpoint,
            # whose resume fails at that knot the same way.
            if not bool(torch.isfinite(state).all()):
                if checkpoint.interrupted:
                    raise KeyboardInterrupt
                return
            recorder.tick()
            checkpoint.write(recorder.checkpoint_state(self.problem.coefficients(state)[0], plan, done),
                             recorder.unsaved(checkpoint.saves), recorder.steps + done)
            if checkpoint.interrupted:
                raise KeyboardInterrupt

    def at_knot(self, plan: Plan, state: torch.Tensor) -> list:
        stopped = []
        interval = plan.interval
        self.since_save.append(plan)
        c = self.problem.coefficients(state)
        for m, recorder in enumerate(self.recorders):
            if m in self.failures:
                continue
            recorder.steps += int(plan.steps[m])
            if not interval.save:
                continue
            try:
                density, row = checked_state(recorder, c[m], interval.t0, interval.t1, float(plan.dt[m]),
                                             lambda m=m: self.unstable(m))
            except NumericalFailure as error:
                self.failures[m] = error
                stopped.append(m)
                continue
            recorder.keep(interval.t1, density, row)
        if interval.save:
            self.saved, self.since_save = (state, interval.t1, 0, False), []
        if len(self.recorders) == 1 and not stopped and interval.save:
            row = self.recorders[0].rows[-1]
            self.bar.update(interval.t1, mass=row["mass"], min_density=row["min_density"], tail=row["spectral_tail"])
        return stopped


def run_members(problem: ForwardProblem, progress: bool | None = None, checkpoint=None) -> list:
    """Integrate the forward equation of every member; per member its Dataset, or the NumericalFailure that
    stopped it (carrying its dataset up to its last good save).

    Finiteness is checked at save times and checkpoints only, so that a GPU run never waits on the host inside a
    save interval.  With a `checkpoint` (solvers.checkpoint.Checkpoint; one member only) the state is stored
    whenever one is due, and a checkpoint marked `resume` continues from its state: the result is bit for bit that
    of an uninterrupted run."""
    case, timing = problem.cases[0], problem.cases[0]["time"]
    drives = problem.layer_drives()
    grid = TimeGrid(timing["t_end"], timing["save_every"], len(drives))
    check_max_steps(grid, timing.get("dt"), timing, "time.dt")
    start = (0, 0, None, 0)
    if checkpoint is not None and checkpoint.resume:
        state, segments = checkpoint.load(case)
        recorders = [Recorder.restored(problem, segments, state["recorder"])]
        c = real_state(state["c"].to(problem.placement.device)[None])
        interval = grid.intervals[state["interval"]]
        plan = Plan(interval, np.array([state["substeps"]]), np.array([state["dt"]]))
        start = (state["interval"], state["substep"], plan, recorders[0].steps)
        t_start = state["t"]
    else:
        c = problem.initial()
        coefficients = problem.coefficients(c)
        densities = problem.basis.synthesis(coefficients).cpu().double().numpy()
        recorders = [Recorder(problem, m, densities[m]) for m in range(problem.members)]
        for m, recorder in enumerate(recorders):
            recorder.record(0.0, coefficients[m])
        t_start = 0.0
    bar = Progress(timing["t_end"], enabled=progress, start=t_start)
    hooks = ForwardHooks(problem, recorders, bar, (c, t_start, start[1], start[2] is not None), drives, timing,
                         checkpoint, len(grid.intervals) - 1)

    def plan_of(interval, state):
        plan, speeds = step_plan(problem, interval, state, drives[interval.layer], timing)
        if speeds is not None and len(speeds) == 1:
            bar.update(interval.t0, max_speed=speeds[0], dt=float(plan.dt[0]))
        return plan

    current = {}

    def begin(plan):
        current["drive"], current["factors"] = drives[plan.interval.layer], problem.factors(plan)

    for recorder in recorders:
        recorder.start_clock()
    if checkpoint is not None:
        checkpoint.stepping = True
    try:
        with torch.no_grad():
            integrate(grid, c, plan_of, begin, lambda state: problem.step(state, current["drive"], current["factors"]),
                      hooks, timing.get("max_steps"), start)
    finally:
        if checkpoint is not None:
            checkpoint.stepping = False
        # closed on an interrupt too: left open, the bar was drawn again below the command's last line as the
        # process ended, and that line ran on after the bar
        bar.close()
    return outcomes(recorders, hooks.failures)


def outcomes(recorders: list, failures: dict) -> list:
    """Per member of a finished run its Dataset, or the NumericalFailure that stopped it (`failures` by member)."""
    results = []
    for m, recorder in enumerate(recorders):
        recorder.tick()
        results.append(failures.get(m) or recorder.dataset("completed"))
    return results


def only(results: list):
    """The one member's result of a run of one case, its NumericalFailure raised."""
    (result,) = results
    if isinstance(result, NumericalFailure):
        raise result
    return result


def run_eulerian(case, progress: bool | None = None, checkpoint=None):
    """Integrate the forward equation of `case`; returns the output xarray.Dataset.

    Raises NumericalFailure (with `.dataset`, the run up to its last good save) on NaN, and when a finite state
    stops being a density (`departures`: mass drift or |rho| beyond what the grid can hold).  See `run_members`.
    """
    return only(run_members(ForwardProblem(case), progress, checkpoint))
