"""The forward map of a training: M members' densities driven by a piecewise-constant control W (layers, d, d)
on the step grid of solvers.timegrid, its cost

    J(W) = l(mu_T) + lambda_reg / 2 sum_l |W_l|_F^2 |slice_l|

(nondimensional; t is network depth), the density checks of its runs, and J by central differences: the
independent check of the adjoint gradients of solvers/adjoint.py.

Beyond the seeds' model (ForwardProblem.layered) the control is every layer's parameter vector theta
(layers, p) (spherepde.model.parameters) and

    J(theta) = l(mu_T) + sum_g lambda_g / 2 sum_l |theta_{l,g}|^2 |slice_l|

over the trained groups g of control.train (Layout.entry_weights: lambda_g per entry, 0 where untrained); the
entries of the untrained groups keep their case values (their gradient is not formed: `trained_part`).
"""

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from solvers.eulerian import BLOW_UP_FACTOR, departures, only
from solvers.forward_problem import ForwardProblem
from solvers.timegrid import Hooks, Plan, TimeGrid, fixed_steps, integrate
from spherepde.base.arrays import as_namespace, as_tensor
from spherepde.base.errors import CaseError, NumericalFailure
from spherepde.base.real_view import real_state
from spherepde.model.losses import make_loss

# Largest tape of a gradient evaluation kept in memory whole (the stages' tokens, else step states), all members.
TAPE_BYTES = 512 * 2 ** 20
# A batch of `ControlledForward.adjoint_norms`: steps whose grid arrays hold about this many bytes (cache-sized; one
# batch of a whole tape, 128 MB at M = 20 and T = 80 on S^1, took 6x longer per step: page faults and memory traffic).
NORM_BYTES = 2 * 2 ** 20


@dataclass
class Gradient:
    """J, l(mu_T), dJ/dW (layers, d, d) (dJ/dtheta (layers, p) beyond the seeds' model), |grad phi_t|_{L2(mu_t)}
    at the step times (ascending) and, at the steps asked for, the adjoint's coefficients {step: phi}."""

    cost: float
    loss: float
    dW: torch.Tensor
    times: list
    adjoint_norm: list
    phi: dict = field(default_factory=dict)


class ControlledForward:
    """The forward map of the training members `cases` on their step grid: W piecewise constant over `layers`
    slices (members share sphere, solver, time and control.layers; they may differ in the model, the initial
    law and the loss's keys)."""

    def __init__(self, cases, problem: ForwardProblem | None = None):
        cases = [cases] if not isinstance(cases, (list, tuple)) else list(cases)
        self.cases, self.case = cases, cases[0]
        self.problem = problem or ForwardProblem(cases)
        control, timing = self.case["control"], self.case["time"]
        self.layers, self.t_end = control["layers"], timing["t_end"]
        self.grid = TimeGrid.from_case(self.case)
        self.plans = []
        for interval in self.grid.intervals:
            steps = fixed_steps(interval, timing["dt"])
            self.plans.append(Plan(interval, np.full(len(cases), steps), np.full(len(cases), interval.length / steps)))
        self.steps = sum(int(plan.steps[0]) for plan in self.plans)
        if "max_steps" in timing and self.steps > timing["max_steps"]:
            raise CaseError(f"time.max_steps: a forward run of the training needs {self.steps} steps, "
                            f"more than {timing['max_steps']}")
        self.step_times = np.concatenate([[0.0]] + [plan.interval.t0 + plan.dt[0] * np.arange(1, plan.steps[0] + 1)
                                                    for plan in self.plans])
        self.losses = [make_loss(member["control"], member.dim) for member in cases]
        self.layered = self.problem.layered
        placement = self.problem.placement
        if self.layered:  # lambda per entry of theta_l (M, p), and the trained entries (p,)
            like = placement.tensor(0.0)
            self.entry_weights = torch.stack([layout.entry_weights(like) for layout in self.problem.layouts])
            self.trained = self.problem.layout.trained(like)
        else:
            self.lambda_reg = placement.tensor([dict(layout.lambda_reg).get("W", 0.0)  # a number or {W = ..}
                                                for layout in self.problem.layouts])
        basis = self.problem.basis
        self.points, self.flat_points = basis.points, basis.points.reshape(-1, basis.dim)
        self.weights = basis.weights.reshape(-1)
        self._factors = {}

    @property
    def members(self) -> int:
        return len(self.cases)

    def select(self, members: list) -> "ControlledForward":
        """The forward map of the members at the indices `members` (a list), sharing the problem's basis and
        matrices (solvers/training.py: L-BFGS members that stop drop out of the batch)."""
        chosen = copy.copy(self)
        chosen.cases = [self.cases[m] for m in members]
        chosen.problem = self.problem.select(members)
        chosen.plans = [Plan(plan.interval, plan.steps[members], plan.dt[members]) for plan in self.plans]
        chosen.losses = [self.losses[m] for m in members]
        if self.layered:
            chosen.entry_weights = self.entry_weights[members]
        else:
            chosen.lambda_reg = self.lambda_reg[members]
        chosen._factors = {}
        return chosen

    @property
    def dt(self) -> float:
        """The longest step of the grid (time.dt when it divides every interval)."""
        return float(max(plan.dt[0] for plan in self.plans))

    def initial(self) -> torch.Tensor:
        return self.problem.initial()

    def factors(self, plan: Plan):
        """The step factors of an interval, kept: every evaluation steps the same grid."""
        key = (float(plan.dt[0]),)
        if key not in self._factors:
            self._factors[key] = self.problem.factors(plan)
        return self._factors[key]

    def drives(self, controls: torch.Tensor) -> list:
        """The drive of each layer (Transport.feed_forward of controls[:, l]) for controls (M, L, d, d), or
        theta (M, L, p) itself beyond the seeds' model."""
        return [self.problem.transport.feed_forward(controls[:, layer]) for layer in range(self.layers)]

    def masses(self, state: torch.Tensor) -> torch.Tensor:
        """rho(x_i) w_i (M, P) on the flattened grid: the atoms the losses see."""
        basis = self.problem.basis
        return basis.synthesis(self.problem.coefficients(state)).reshape(state.shape[0], -1) * self.weights

    def terminal_losses(self, state: torch.Tensor) -> list:
        """l_m(mu_T) of every member (0-d tensors)."""
        masses = self.masses(state)
        return [loss.value(self.flat_points, masses[m]) for m, loss in enumerate(self.losses)]

    def terminal_cotangent(self, state: torch.Tensor) -> torch.Tensor:
        """d l_m / d state (M, N): synthesis^T (w dl/dmu), dl/dmu the losses' first variations."""
        masses = self.masses(state)
        variation = torch.stack([loss.first_variation(self.flat_points, masses[m])
                                 for m, loss in enumerate(self.losses)])
        basis = self.problem.basis
        return real_state(basis.synthesis_adjoint((variation * self.weights).reshape((-1,) + basis.grid_shape)))

    def regularisers(self, controls: torch.Tensor) -> torch.Tensor:
        """lambda_reg / 2 sum_l |W_l|_F^2 T / L per member (M,); sum_g lambda_g / 2 sum_l |theta_{l,g}|^2 T / L
        beyond the seeds' model."""
        if self.layered:
            return 0.5 * (self.entry_weights[:, None] * controls ** 2).sum((1, 2)) * (self.t_end / self.layers)
        return 0.5 * self.lambda_reg * (controls ** 2).flatten(1).sum(1) * (self.t_end / self.layers)

    def regulariser_gradients(self, controls: torch.Tensor) -> torch.Tensor:
        """The gradient of `regularisers`: lambda_reg W_l T / L (M, L, d, d), or lambda_g theta_l T / L
        (M, L, p) entry by entry."""
        if self.layered:
            return self.entry_weights[:, None] * (self.t_end / self.layers) * controls
        return (self.lambda_reg * (self.t_end / self.layers))[:, None, None, None] * controls

    def trained_part(self, gradient: torch.Tensor) -> torch.Tensor:
        """dJ/dtheta (M, L, p) with its untrained entries zero (control.train); dJ/dW unchanged."""
        return torch.where(self.trained, gradient, 0.0) if self.layered else gradient

    def run(self, states: torch.Tensor, controls: torch.Tensor, tape: "Tape | None" = None):
        """The forward map: (final states (M, N), per member the reason it departed from a density, or None).

        A member whose state leaves the densities of the run (not finite, its mass drifting, |rho| beyond what
        the grid holds; eulerian.departures' tests, on the device at every step: a W beyond the explicit
        transport's stability limit can blow up and leave a terminal state that looks like a density) is
        stopped there, with the interval it happened in."""
        drives = self.drives(controls)
        check = DensityCheck(self, states, drives)
        hooks = TapeHooks(tape, check)
        current = {}

        def begin(plan):
            current["drive"], current["factors"] = drives[plan.interval.layer], self.factors(plan)

        def step(state):
            keep = [] if tape is not None and tape.keeps_next() else None
            state = self.problem.step(state, current["drive"], current["factors"], keep, tape is None or tape.rows)
            hooks.kept = keep[0] if keep else None
            return state

        plans = iter(self.plans)
        final, _, _ = integrate(self.grid, states, lambda interval, state: next(plans), begin, step, hooks)
        return final, check.reasons()

    def adjoint_norms(self, states: list, cotangents: list) -> torch.Tensor:
        """|grad phi|_{L2(mu)} = (int |grad phi|^2 rho dsigma)^(1/2) (K, M) for K states and cotangents, each (M, N),
        phi the field of the cotangent (coefficients a / multiplicity): in batches of steps of about NORM_BYTES."""
        basis, problem = self.problem.basis, self.problem
        members = states[0].shape[0]
        batch = max(1, NORM_BYTES // (members * self.weights.numel() * states[0].element_size()))
        values = []
        for first in range(0, len(states), batch):
            state, cotangent = torch.cat(states[first:first + batch]), torch.cat(cotangents[first:first + batch])
            phi = problem.coefficients(cotangent) * basis.inverse_multiplicity
            gradient = basis.gradient_frame(phi).reshape(state.shape[0], basis.dim - 1, -1)
            rho = basis.synthesis(problem.coefficients(state)).reshape(state.shape[0], -1)
            values.append(torch.sqrt(((gradient ** 2).sum(1) * rho * self.weights).sum(1).clamp_min(0)))
        return torch.cat(values).reshape(len(states), members)


class DensityCheck:
    """eulerian.departures' tests of every member's forward run, without a host round trip per step: after every
    step the largest coefficient magnitude is kept on the device (a NaN or an infinity stays in it), and at each
    knot the state is tested as a density on the host (finite, its mass within sqrt(machine epsilon), |rho| at
    most BLOW_UP_FACTOR x all the mass in the smallest cell) and the kept peak against the largest coefficient such
    a density has, |c| <= ||rho||_L2 <= |S^{d-1}|^(1/2) max |rho| (Parseval).  The first failing interval of each
    member is remembered.  The peak is kept in the step's array library (Transport.namespace: numpy on the CPU's
    fourier path, where the three torch operations of `step` cost 8 us of a 150 us step at one member).  A failure
    says when the interval's steps were too long for the explicit transport (ForwardProblem.first_unstable_step from
    the interval's start, which passed, with the layer's drive of `drives`)."""

    def __init__(self, forward: ControlledForward, states: torch.Tensor, drives: list):
        basis = forward.problem.basis
        self.forward, self.drives, self.start = forward, drives, states
        self.weights = basis.weights.reshape(-1).cpu().double().numpy()
        self.mass_0 = forward.masses(states).sum(1).cpu().double().numpy()
        self.xp = xp = forward.problem.transport.namespace
        limit = math.sqrt(basis.area) * BLOW_UP_FACTOR * np.abs(self.mass_0) / self.weights.min()
        self.limit = as_namespace(torch.as_tensor(limit, dtype=states.dtype, device=states.device), xp)
        self.peak = as_namespace(torch.zeros(states.shape[0], dtype=states.dtype, device=states.device), xp)
        self.first, self.causes = {}, {}

    def step(self, state: torch.Tensor) -> None:
        xp = self.xp
        xp.maximum(self.peak, xp.amax(xp.abs(as_namespace(state, xp)), 1), out=self.peak)

    def knot(self, plan: Plan, state: torch.Tensor) -> None:
        problem = self.forward.problem
        densities = problem.basis.synthesis(problem.coefficients(state)).reshape(state.shape[0], -1)
        densities = densities.cpu().double().numpy()
        exceeded = ~as_tensor(self.peak <= self.limit).cpu().numpy()
        reasons = departures(densities, self.weights, self.mass_0, problem.basis.placement.real)
        failing = [m for m, reason in enumerate(reasons) if (exceeded[m] or reason is not None) and m not in self.first]
        for m in failing:
            self.first[m] = plan.interval
            self.causes[m] = problem.first_unstable_step(self.start, plan.interval.t0, [plan], self.drives,
                                                         "time.dt", m)
        self.start = state

    def reasons(self) -> list:
        return [None if m not in self.first else
                (f"the forward run blew up between t = {self.first[m].t0:g} and {self.first[m].t1:g} (not finite, "
                 f"its mass drifting or |rho| beyond {BLOW_UP_FACTOR:g} x all the mass in one cell)"
                 + ("" if self.causes[m] is None else f": {self.causes[m]} (or keep the controls smaller)"))
                for m in range(self.peak.shape[0])]


class TapeHooks(Hooks):
    """Keeps the tape of a forward run and checks every step's state (DensityCheck)."""

    def __init__(self, tape: "Tape | None", check: DensityCheck):
        self.tape, self.check, self.kept = tape, check, None

    def after_step(self, plan: Plan, done: int, state: torch.Tensor) -> None:
        self.check.step(state)
        if self.tape is not None:
            self.tape.record(plan, done, state, self.kept)

    def at_knot(self, plan: Plan, state: torch.Tensor) -> list:
        self.check.knot(plan, state)
        return []


class Tape:
    """What the forward pass keeps for the backward one (module docstring): its end state at every `every`-th
    step, and for the steps n = 1..`token_steps` (numbered from 1 after the start) their stages' tokens
    (ForwardProblem.step's, what the transport's transpose reads; none with `tokens` False: the continuous
    gradient reads states only): the rows of the path's first product (Transport.rate_token) where every step's
    fit TAPE_BYTES beside the states, else the stages' states (`rows` False: on S^1's paths a third of the memory
    or less, the transpose recomputing the rows from them, a fraction of the step a recomputed step would cost)."""

    def __init__(self, forward: ControlledForward, states: torch.Tensor, every: int, tokens: bool = True):
        self.forward = forward
        scheme, transport = forward.problem.scheme, forward.problem.transport
        state_bytes = states.numel() * states.element_size()

        def step_tokens_bytes(rows):  # a first stage's state is the step's start, kept already
            stages = scheme.stages_count - (scheme.starts_at_start and not transport.token_rows(rows))
            return stages * transport.token_size(rows) * states.shape[0] * states.element_size()
        self.token_steps, self.rows = 0, True
        if every == 0:
            every = 1 if forward.steps * state_bytes <= TAPE_BYTES else max(1, math.ceil(math.sqrt(forward.steps)))
            if every == 1 and tokens:
                room = TAPE_BYTES - forward.steps * state_bytes
                self.rows = forward.steps * step_tokens_bytes(True) <= room
                self.token_steps = min(forward.steps, room // step_tokens_bytes(self.rows))
        self.every = every
        self.states = {0: states}
        self.stage_tokens = {}
        self.count = 0

    def keeps_next(self) -> bool:
        """Whether the next step's stage tokens are to be kept."""
        return self.count < self.token_steps

    def record(self, plan: Plan, done: int, state: torch.Tensor, kept: list | None) -> None:
        self.count += 1
        if kept is not None:
            self.stage_tokens[self.count] = kept
        if self.count % self.every == 0 or self.count == self.forward.steps:
            self.states[self.count] = state

    def step_list(self) -> list:
        """(n, plan) for every step n = 1..steps, in order: step n goes from state n - 1 to state n."""
        return [(n, plan) for n, plan in zip(range(1, self.forward.steps + 1),
                                             (plan for plan in self.forward.plans for _ in range(int(plan.steps[0]))))]

    def segments(self, controls_drives: list):
        """Backward over the stored states: (steps [(n, plan), ...], stages(n, plan) -> the stage tokens of step n,
        {n: state}) of each segment between stored states, from the last to the first, recomputing what is not
        stored (with every state stored, one segment: the whole run, its stages recomputed a step at a time when
        not kept)."""
        forward = self.forward
        steps = self.step_list()
        stored = sorted(self.states)
        bounds = [(0, forward.steps)] if self.every == 1 else list(zip(stored[:-1], stored[1:]))
        for start, stop in reversed(bounds):
            segment = steps[start:stop]
            states = dict(self.states) if self.every == 1 else {start: self.states[start]}
            for n, plan in segment if self.every > 1 else ():
                states[n] = forward.problem.step(states[n - 1], controls_drives[plan.interval.layer],
                                                 forward.factors(plan))

            def stages(n, plan, states=states):
                if n in self.stage_tokens:
                    return self.stage_tokens[n]
                keep = []
                forward.problem.step(states[n - 1], controls_drives[plan.interval.layer], forward.factors(plan), keep)
                return keep[0]
            yield segment, stages, states


def _batched(forward: ControlledForward, c0, controls: torch.Tensor):
    """(states (M, N), controls (M, L, d, d), single) from either the batch's own arguments or one member's
    coefficients (*coeff, complex) and controls (L, d, d); (M, L, p) and (L, p) beyond the seeds' model."""
    single = controls.dim() == (2 if forward.layered else 3)
    if c0 is None:
        states = forward.initial()
    elif c0.is_complex():
        states = real_state(c0[None] if c0.dim() == len(forward.problem.transport.coefficient_shape) else c0)
    else:
        states = c0
    controls = controls[None] if single else controls
    return states, controls.to(forward.problem.placement.real), single


def evaluate_costs(forward: ControlledForward, states: torch.Tensor, controls: torch.Tensor) -> list:
    """J(W) of the discretised forward map per member (no adjoint), or the NumericalFailure of its run: for
    finite differences and line searches."""
    with torch.no_grad():
        final, reasons = forward.run(states, controls)
        costs = torch.stack(forward.terminal_losses(final)) + forward.regularisers(controls)
    return [float(cost) if reason is None else NumericalFailure(f"numerical failure: {reason}")
            for cost, reason in zip(costs, reasons)]


def evaluate_cost(forward: ControlledForward, c0, controls: torch.Tensor):
    """`evaluate_costs` of one member (c0 its coefficients, controls (L, d, d)), raising its failure."""
    states, controls, single = _batched(forward, c0, controls)
    costs = evaluate_costs(forward, states, controls)
    return only(costs) if single else costs


def central_differences(forward: ControlledForward, c0, controls: torch.Tensor, h: float = 1e-5) -> torch.Tensor:
    """dJ/dW of the discretised forward map by central differences (`central_differences_of`): the independent
    check of the adjoint gradients (one member)."""
    return central_differences_of(lambda W: evaluate_cost(forward, c0, W), controls, h)


def central_differences_of(cost, controls: torch.Tensor, h: float = 1e-5) -> torch.Tensor:
    """dJ/dW by central differences (J(W + h E_k) - J(W - h E_k)) / (2h) in every entry k, J = cost(W) a
    float (error O(h^2) plus round-off of J over h)."""
    gradient = torch.zeros_like(controls)
    for index in range(controls.numel()):
        # on the controls' device: a CPU step cannot be added to CUDA controls
        step = torch.zeros(controls.shape, dtype=controls.dtype, device=controls.device)
        step.view(-1)[index] = h
        gradient.view(-1)[index] = (cost(controls + step) - cost(controls - step)) / (2 * h)
    return gradient
