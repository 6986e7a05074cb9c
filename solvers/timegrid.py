"""The time grid of a run and the one loop that steps it: forward runs, trainings, particles, and the adjoint.

Knots are the save times 0, save_every, 2 save_every, ..., t_end and, with a trained control of L layers or a model
whose matrices vary over L layers (spherepde.model.parameters.model_layers), the layer boundaries l t_end / L
(coincident ones, to 1e-12 t_end, merged). Between two knots the velocity does not change in time (W_t is constant
on a layer), so every interval is split into equal steps no longer than the case's dt (time.dt, particles.dt, or
the CFL rule at the interval's start), every save time is hit exactly, and no Runge-Kutta stage sees two layers.
The layer of an interval is the one holding its midpoint.

`integrate` advances M members together over the intervals, each member with its own number of steps and
step length where a CFL rule gives them (a member that needs fewer steps is masked, its state kept, while
the others go on), and calls the run's hooks: after every step (checkpoints, interrupts, progress) and at
every knot (saves, finiteness checks, which may stop a member).  The solver supplies the step itself.
"""

import math
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import torch

from spherepde.base.errors import CaseError
from spherepde.model.parameters import model_layers


def save_times(t_end: float, save_every: float) -> np.ndarray:
    """0, save_every, 2 save_every, ..., t_end (the last interval may be shorter).  Each k save_every is the decimal
    product of the numbers as written (the float nearest to k times repr(save_every)), and a last save within
    round-off of t_end is t_end: in floats 3 x 0.3 is 0.8999999999999999 and 9 x 0.1 is 0.9000000000000001, so
    runs saving every 0.3 and every 0.1 to t_end = 0.9 shared no save time but 0, and the last was not t_end."""
    count = int(math.floor(t_end / save_every + 1e-9))
    step = Decimal(repr(float(save_every)))
    times = [float(k * step) for k in range(count + 1)]
    # round-off relative to t_end: an absolute 1e-12 took t_end <= 1e-12 (save_every above it) for the save at 0,
    # and the run ended there, "completed" with no step taken
    if t_end - times[-1] > 1e-12 * t_end:
        times.append(t_end)
    elif count:
        times[-1] = t_end
    return np.array(times)


@dataclass(frozen=True)
class Interval:
    """[t0, t1] between consecutive knots: its index, the layer holding it, and whether t1 is a save time."""

    index: int
    t0: float
    t1: float
    layer: int
    save: bool

    @property
    def length(self) -> float:
        return self.t1 - self.t0


class TimeGrid:
    """The knots of a run (module docstring): `intervals`, `saves`, `layers` (1 without a control)."""

    def __init__(self, t_end: float, save_every: float, layers: int = 1):
        self.t_end, self.layers = t_end, layers
        self.saves = save_times(t_end, save_every)
        boundaries = t_end * np.arange(layers + 1) / layers
        close = np.abs(boundaries[:, None] - self.saves[None, :]).min(1) <= 1e-12 * t_end  # as save_times
        knots = np.unique(np.concatenate([self.saves, boundaries[~close]]))  # a save's own value where they meet
        self.intervals = [Interval(k, float(t0), float(t1), self.layer_at(0.5 * (t0 + t1)), self._is_save(t1))
                          for k, (t0, t1) in enumerate(zip(knots[:-1], knots[1:]))]

    @classmethod
    def from_case(cls, case) -> "TimeGrid":
        timing = case["time"]
        return cls(timing["t_end"], timing["save_every"], model_layers(case))

    def _is_save(self, t: float) -> bool:
        return bool(np.any(np.abs(self.saves - t) <= 1e-12 * self.t_end))

    def layer_at(self, t: float) -> int:
        """The layer l whose slice [l T / L, (l + 1) T / L) holds t (t = T in the last)."""
        return min(max(int(math.floor(t * self.layers / self.t_end)), 0), self.layers - 1)


def fixed_steps(interval: Interval, dt: float) -> int:
    """Equal steps no longer than dt over the interval."""
    return max(1, math.ceil(interval.length / dt - 1e-9))


def check_max_steps(grid: TimeGrid, dt: float | None, timing: dict, key: str) -> None:
    """A fixed step dt (`key`) against time.max_steps over the whole grid, before any step: each interval takes
    whole steps, so saves and layer boundaries that dt does not divide cut more than the t_end / dt steps that the
    case's own check counts (a run then stopped at the limit midway, exit 3, as if the numerics had failed)."""
    if dt is None or "max_steps" not in timing:
        return
    steps = sum(fixed_steps(interval, dt) for interval in grid.intervals)
    if steps > timing["max_steps"]:
        raise CaseError(f"time.max_steps: {timing['max_steps']} steps cannot reach t_end = {grid.t_end:g} with "
                        f"{key} = {dt:g}: its {len(grid.intervals)} intervals (saves and layer boundaries) take "
                        f"{steps}")


@dataclass
class Plan:
    """How an interval is stepped: steps[m] equal steps of length dt[m] for member m (numpy arrays); members
    that cannot step it (a non-finite velocity, too many steps) are in `stopped` with the reason."""

    interval: Interval
    steps: np.ndarray
    dt: np.ndarray
    stopped: dict = None

    def __post_init__(self):
        self.stopped = dict(self.stopped or {})

    @property
    def uniform(self) -> bool:
        return bool((self.steps == self.steps[0]).all() and (self.dt == self.dt[0]).all())


def show_step(bar, plan: Plan, done: int) -> float:
    """Move the progress `bar` (spherepde.base.progress.Progress) after `done` steps of `plan`: to the time of the
    member with the longest step, within the interval, its dt the shortest step (from the plan alone: no wait on a
    GPU); returns that time."""
    t = plan.interval.t0 + done * float(plan.dt.max())
    bar.update(min(t, plan.interval.t1), dt=float(plan.dt.min()))
    return t


class Hooks:
    """What a run does around its steps (every method optional): `after_step(plan, done, state)` after each
    step of all members (done of plan.steps taken), `at_knot(plan, state)` at the end of each interval,
    returning the members that stop there (indices; e.g. failed ones, which the hook has recorded), and
    `stop(member, reason, plan)` for a member that cannot step the interval of `plan` (the loop's limits and
    the plan's `stopped`)."""

    def after_step(self, plan: Plan, done: int, state) -> None:
        pass

    def at_knot(self, plan: Plan, state) -> list:
        return []

    def stop(self, member: int, reason: str, plan: Plan) -> None:
        pass


def integrate(grid: TimeGrid, state: torch.Tensor, plan_of, begin, step, hooks: Hooks, max_steps: int | None = None,
              start: tuple = (0, 0, None, 0), active: np.ndarray | None = None):
    """Advance `state` (M, ...) over the grid's intervals; returns (state, plans, active).

    plan_of(interval, state) -> Plan (the steps of each member); begin(plan) prepares an interval (the layer's
    W, the step factors of dt); step(state) -> state is one step of every member.  `max_steps` bounds each
    member's total step count (the member stops before the interval that would exceed it).  `start` = (interval
    index, steps already taken in it, its plan, and the steps taken before it) resumes an interrupted run;
    `active` (bool per member) marks the members still running (a stopped member keeps its state).  `plans`
    lists the intervals' plans in order (what an adjoint steps back through).
    """
    members = state.shape[0]
    active = np.ones(members, dtype=bool) if active is None else active
    first, done, plan, taken = start
    taken = np.broadcast_to(np.asarray(taken, dtype=np.int64), (members,)).copy()
    plans = []
    for interval in grid.intervals[first:]:
        if not active.any():
            break
        if plan is None or interval.index != first:
            plan = plan_of(interval, state)
            done = 0
        if max_steps is not None:
            for m in np.nonzero(active & (taken + plan.steps > max_steps))[0]:
                plan.stopped.setdefault(int(m), f"time.max_steps = {max_steps} would be exceeded before "
                                                f"t = {interval.t1:.6g}")
        for m, reason in plan.stopped.items():
            if active[m]:
                active[m] = False
                hooks.stop(m, reason, plan)
        if not active.any():
            break
        taken += np.where(active, plan.steps, 0)
        plans.append(plan)
        begin(plan)
        steps = np.where(active, plan.steps, 0)
        masked = not (steps == steps[0]).all()
        for k in range(done, int(steps.max(initial=0))):
            stepped = step(state)
            if masked:
                moving = torch.as_tensor(k < steps, device=state.device).reshape((members,) + (1,) * (state.dim() - 1))
                stepped = torch.where(moving, stepped, state)
            state = stepped
            hooks.after_step(plan, k + 1, state)
        for m in hooks.at_knot(plan, state):
            active[m] = False
    return state, plans, active
