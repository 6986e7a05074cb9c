"""The training gradient: the forward map with a piecewise-constant control and its adjoint (DESIGN §2), for M
members at once.

Cost (nondimensional, t is network depth):

    J(W) = l(mu_T) + lambda_reg / 2 sum_l |W_l|_F^2 |slice_l|,     W_t = W_l on slice l = [l T/L, (l+1) T/L).

Step grid: solvers.timegrid.TimeGrid of the case (knots at the save times and the slice boundaries), each
interval split into equal steps no longer than time.dt, so that W is constant over every step and the trained
run (solvers/training.py) is this very forward map, recorded.

Two gradients, one step grid (control.gradient):

* "discrete" (the training default): the exact gradient of the discretised J, i.e. of the map
  W -> c_N = S_{N-1} o ... o S_0 (c_0) with S_n one step of the case's scheme (transforms, dealiasing,
  attention, filter included), composed with l on the grid.  Reverse-mode differentiation written out: the
  cotangent a_n of c_n obeys a_n = (dS_n/dc)^* a_{n+1}, and dJ/dW_l collects (dS_n/dW)^* a_{n+1} over the
  steps of slice l, each a transpose of the scheme's linear algebra (timesteppers.RungeKutta.adjoint) around
  the transport's (spherepde.model.transport.Transport.vjp).  It agrees with central finite differences of the
  discrete J to round-off (tests/test_adjoint.py).  The cotangent is the discrete adjoint state: phi_n has
  coefficients a_n / multiplicity (Parseval).
* "continuous": the adjoint PDE discretised on its own.  phi solves, backward from phi_T = dl/dmu(mu_T),

      -d_t phi = eps Lap phi + v[rho_t] . grad phi + NL[rho_t, phi],
      unnormalized:  NL(x) = <V x, G(x)>,                 G(x) = int e^{beta <x, B^T y>} grad phi(y) rho(y) dsigma(y)
      softmax:       NL(x) = <x, T[(rho / Z) V^T grad phi](x)> - T[(rho / Z) <m, V^T grad phi>](x),
                     T f(x) = int e^{beta <x, B^T y>} f(y) dsigma(y)
      beta = inf:    NL = 0 (m = B^T x / |B^T x| does not depend on rho)

  (the nonlocal term is the first variation of v: d m(y) / d rho(x) = e^{beta <y, B x>} x for the
  unnormalized kernel, e^{beta <y, B x>} (x - m(y)) / Z(y) for softmax), and

      dJ/dW_l = lambda_reg W_l |slice_l| + int_{slice_l} int grad phi(x) x^T rho_t(x) dsigma dt.

  In s = T - t the equation is d_s phi = eps Lap phi + (explicit terms): the same IMEX stepper,
  diffusion implicit.  The explicit stages need rho at the stage times: cubic Hermite interpolation of the
  stored step states and their rates (error O(dt^4)).  The time integral of the gradient is carried as extra
  ODE components integrated by the explicit part of the same scheme, so it is as accurate as phi.  It
  differs from the discrete gradient by the scheme's truncation error, O(dt^p) (p = 4 for imex-ark436 and
  rk4, 3 for imex-ars443), plus the spectrally small difference between the adjoint of the discretised
  operator and the discretised adjoint operator (results/adjoint_verification.md measures both).

The tape (what the backward pass reads of the forward one) is chosen by memory (`Tape`): every step's state,
and the stage tokens (Transport.rate_token: on S^1's matrix path the rows (rho, v) of each stage, so that the
transpose skips their product; else the stage's state) of as many of the first steps as fit TAPE_BYTES beside
them (a step whose tokens are kept costs the backward pass no recomputation; one without is recomputed once,
with its stages), else the state at every K-th step,
K = control.checkpoint_every or ceil(sqrt(steps)) (segments recomputed: one forward run more).  Memory in
the last case: (steps / K + K + 1) states per member, about 2 sqrt(steps) x 16 (lmax + 1) bytes on S^1 and
2 sqrt(steps) x 16 (lmax + 1)^2 bytes on S^2.  None changes the gradient beyond round-off.
"""

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from spherepde.geometry.ambient import inner
from spherepde.base.errors import CaseError, NumericalFailure
from spherepde.kernels.exp_kernel import MemberKernels
from spherepde.model.losses import make_loss
from spherepde.model.attention import attention, velocity
from spherepde.base.real_view import complex_state, real_state

from solvers.eulerian import BLOW_UP_FACTOR, ForwardProblem, departure, only
from solvers.timegrid import Hooks, Plan, TimeGrid, fixed_steps, integrate

# Largest tape of a gradient evaluation kept in memory whole (the stages' tokens, else step states), all members.
TAPE_BYTES = 512 * 2 ** 20


@dataclass
class Gradient:
    """J, l(mu_T), dJ/dW (layers, d, d), |grad phi_t|_{L2(mu_t)} at the step times (ascending) and, at the steps
    asked for, the adjoint's coefficients {step: phi}."""

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
        self.lambda_reg = self.problem.placement.tensor([member["control"]["lambda_reg"] for member in cases])
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
        """The drive of each layer (Transport.feed_forward of controls[:, l]) for controls (M, L, d, d)."""
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
        """lambda_reg / 2 sum_l |W_l|_F^2 T / L per member (M,)."""
        return 0.5 * self.lambda_reg * (controls ** 2).flatten(1).sum(1) * (self.t_end / self.layers)

    def run(self, states: torch.Tensor, controls: torch.Tensor, tape: "Tape | None" = None):
        """The forward map: (final states (M, N), per member the reason it departed from a density, or None).

        A member whose state leaves the densities of the run (not finite, its mass drifting, |rho| beyond what
        the grid holds; eulerian.departure's tests, on the device at every step: a W beyond the explicit
        transport's stability limit can blow up and leave a terminal state that looks like a density) is
        stopped there, with the interval it happened in."""
        drives = self.drives(controls)
        check = DensityCheck(self, states)
        hooks = TapeHooks(tape, check)
        current = {}

        def begin(plan):
            current["drive"], current["factors"] = drives[plan.interval.layer], self.factors(plan)

        def step(state):
            keep = [] if tape is not None and tape.keeps_next() else None
            state = self.problem.step(state, current["drive"], current["factors"], keep)
            hooks.kept = keep[0] if keep else None
            return state

        plans = iter(self.plans)
        final, _, _ = integrate(self.grid, states, lambda interval, state: next(plans), begin, step, hooks)
        return final, check.reasons()

    def adjoint_norms(self, states: torch.Tensor, cotangents: torch.Tensor) -> torch.Tensor:
        """|grad phi|_{L2(mu)} = (int |grad phi|^2 rho dsigma)^(1/2) for states and cotangents (B, N), phi the
        field of the cotangent (coefficients a / multiplicity)."""
        basis, problem = self.problem.basis, self.problem
        phi = problem.coefficients(cotangents) * basis.inverse_multiplicity
        gradient = basis.gradient_frame(phi).reshape(states.shape[0], basis.dim - 1, -1)
        rho = basis.synthesis(problem.coefficients(states)).reshape(states.shape[0], -1)
        return torch.sqrt(((gradient ** 2).sum(1) * rho * self.weights).sum(1).clamp_min(0))


class DensityCheck:
    """eulerian.departure's tests of every member's forward run, without a host round trip per step: after every
    step the largest coefficient magnitude is kept on the device (a NaN or an infinity stays in it), and at each
    knot the state is tested as a density on the host (finite, its mass within sqrt(machine epsilon), |rho| at
    most BLOW_UP_FACTOR x all the mass in the smallest cell) and the kept peak against the largest coefficient such
    a density has, |c| <= ||rho||_L2 <= |S^{d-1}|^(1/2) max |rho| (Parseval).  The first failing interval of each
    member is remembered."""

    def __init__(self, forward: ControlledForward, states: torch.Tensor):
        basis = forward.problem.basis
        self.forward = forward
        self.weights = basis.weights.reshape(-1).cpu().double().numpy()
        self.mass_0 = forward.masses(states).sum(1).cpu().double().numpy()
        self.limit = torch.as_tensor(math.sqrt(basis.area) * BLOW_UP_FACTOR * np.abs(self.mass_0) / self.weights.min(),
                                     dtype=states.dtype, device=states.device)
        self.peak = torch.zeros(states.shape[0], dtype=states.dtype, device=states.device)
        self.first = {}

    def step(self, state: torch.Tensor) -> None:
        torch.maximum(self.peak, state.abs().amax(1), out=self.peak)

    def knot(self, plan: Plan, state: torch.Tensor) -> None:
        problem = self.forward.problem
        densities = problem.basis.synthesis(problem.coefficients(state)).reshape(state.shape[0], -1)
        densities = densities.cpu().double().numpy()
        exceeded = ~(self.peak <= self.limit).cpu().numpy()
        for m in range(state.shape[0]):
            if m in self.first:
                continue
            reason = departure(densities[m], self.weights, float(self.mass_0[m]), problem.basis.placement.real)
            if exceeded[m] or not np.isfinite(densities[m]).all() or reason is not None:
                self.first[m] = plan.interval

    def reasons(self) -> list:
        return [None if m not in self.first else
                (f"the forward run blew up between t = {self.first[m].t0:g} and {self.first[m].t1:g} (not finite, "
                 f"its mass drifting or |rho| beyond {BLOW_UP_FACTOR:g} x all the mass in one cell)")
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
    gradient reads states only)."""

    def __init__(self, forward: ControlledForward, states: torch.Tensor, every: int, tokens: bool = True):
        self.forward = forward
        scheme, transport = forward.problem.scheme, forward.problem.transport
        state_bytes = states.numel() * states.element_size()
        step_tokens_bytes = scheme.stages_count * transport.token_size() * states.shape[0] * states.element_size()
        self.token_steps = 0
        if every == 0:
            every = 1 if forward.steps * state_bytes <= TAPE_BYTES else max(1, math.ceil(math.sqrt(forward.steps)))
            if every == 1 and tokens:
                self.token_steps = min(forward.steps, (TAPE_BYTES - forward.steps * state_bytes) // step_tokens_bytes)
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
    coefficients (*coeff, complex) and controls (L, d, d)."""
    single = controls.dim() == 3
    if c0 is None:
        states = forward.initial()
    elif c0.is_complex():
        states = real_state(c0[None] if c0.dim() == len(forward.problem.transport.coefficient_shape) else c0)
    else:
        states = c0
    controls = controls[None] if single else controls
    return states, controls.to(forward.problem.placement.real), single


def discrete_gradients(forward: ControlledForward, states: torch.Tensor, controls: torch.Tensor,
                       keep: frozenset = frozenset()) -> list:
    """Per member the exact dJ/dW of the discretised J (a Gradient), or the NumericalFailure of its forward run;
    the adjoint's coefficients are kept at the steps in `keep`."""
    problem = forward.problem
    tape = Tape(forward, states, forward.case["control"]["checkpoint_every"])
    with torch.no_grad():
        final, reasons = forward.run(states, controls, tape)
        if all(reasons):  # no member's backward pass is worth making
            return [NumericalFailure(f"numerical failure: {reason}") for reason in reasons]
        losses = torch.stack(forward.terminal_losses(final))
        cotangent = forward.terminal_cotangent(final)
        drives = forward.drives(controls)
        layer_drive_bar = [torch.zeros_like(drive) for drive in drives]
        norms = {forward.steps: forward.adjoint_norms(final, cotangent)}
        kept = {}
        if forward.steps in keep:
            kept[forward.steps] = cotangent.clone()
        for segment, stages, states_of in tape.segments(drives):
            cotangents = []
            for n, plan in reversed(segment):
                layer = plan.interval.layer
                cotangent, drive_bar = problem.step_adjoint(cotangent, stages(n, plan), drives[layer],
                                                            forward.factors(plan))
                layer_drive_bar[layer] += drive_bar
                cotangents.append(cotangent)
                if n - 1 in keep:
                    kept[n - 1] = cotangent.clone()
            # |grad phi_n|_{L2(mu_n)} of the whole segment in one batch of transforms
            numbers = [n - 1 for n, _ in reversed(segment)]
            values = forward.adjoint_norms(torch.cat([states_of[n] for n in numbers]), torch.cat(cotangents))
            norms.update(zip(numbers, values.reshape(len(numbers), -1)))
        dW = torch.stack([problem.transport.feed_forward_adjoint(bar) for bar in layer_drive_bar], dim=1)
        dW = dW + (forward.lambda_reg * (forward.t_end / forward.layers))[:, None, None, None] * controls
        costs = losses + forward.regularisers(controls)
    return _gradients(forward, costs, losses, dW, norms, kept, reasons)


def _gradients(forward, costs, losses, dW, norms, kept, reasons) -> list:
    """Per member its Gradient from the batch's results, or the NumericalFailure of its forward run."""
    steps = sorted(norms)
    table = torch.stack([norms[n] for n in steps], dim=1).cpu().double().numpy()  # (M, steps + 1)
    times = [float(forward.step_times[n]) for n in steps]
    basis = forward.problem.basis
    results = []
    for m in range(forward.members):
        if reasons[m] is not None:
            results.append(NumericalFailure(f"numerical failure: {reasons[m]}"))
            continue
        phi = {n: complex_state(a[m:m + 1], forward.problem.transport.coefficient_shape)[0] * basis.inverse_multiplicity
               for n, a in kept.items()}
        results.append(Gradient(float(costs[m]), float(losses[m]), dW[m], times, table[m].tolist(), phi))
    return results


def coefficients_to_field(basis, a: torch.Tensor) -> torch.Tensor:
    """Coefficients of the grid function represented by a cotangent a of the coefficients c.

    For real fields, int phi rho dsigma = sum multiplicity Re(conj(phi_k) c_k), whose gradient with respect to
    c (torch's convention) is multiplicity * phi_k; modes outside the triangle (multiplicity 0) are 0.
    """
    return a * basis.inverse_multiplicity


def discrete_gradient(forward: ControlledForward, c0, controls: torch.Tensor, keep: frozenset = frozenset()):
    """`discrete_gradients` of one member (c0 its coefficients, controls (L, d, d)) as a Gradient, or of the
    batch (states (M, N), controls (M, L, d, d)) as the list; raises a single member's NumericalFailure."""
    states, controls, single = _batched(forward, c0, controls)
    results = discrete_gradients(forward, states, controls, keep)
    return only(results) if single else results


class AdjointOperator:
    """The explicit part of the continuous adjoint equation in s = T - t (module docstring), for the batch.

    The softmax term applies the scalings exp(-beta |B^T y|) (in rho / Z) and exp(beta |B x|) (of the
    transposed transform) separately, so it stays in floating-point range only while beta sigma_max(B)
    is below ~700 in float64 (~80 in float32); the discrete gradient has no such limit.
    """

    def __init__(self, forward: ControlledForward):
        problem = forward.problem
        solver = forward.case["solver"]
        self.forward, self.problem, self.basis = forward, problem, problem.basis
        batch = problem.batch
        self.transpose_kernels = None if batch.zero_temperature else MemberKernels(
            self.basis, batch.B.transpose(-1, -2).contiguous(), [m.beta for m in batch.models], solver["field"],
            solver["kernel_tol"], solver["chunk"])

    def rate(self, rho: torch.Tensor, W: torch.Tensor, phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(coefficients of v . grad phi + NL (M, *coeff), the gradient integrand's integral int grad phi x^T rho
        dsigma (M, d, d)) for grid densities rho (M, P), W (M, d, d) and adjoint coefficients phi (M, *coeff)."""
        basis, batch = self.basis, self.problem.batch
        points = basis.points.reshape(-1, basis.dim)
        mean_field, rho_over_Z = attention(batch, self.problem.kernels, points, rho)
        v = velocity(batch, points, mean_field, W)
        grad_phi = basis.gradient(phi).reshape(rho.shape + (basis.dim,))
        value = inner(v, grad_phi)
        if self.transpose_kernels is not None:
            pulled = torch.matmul(grad_phi, batch.V)  # V^T grad phi, row-wise
            if rho_over_Z is None:
                scaled, log_scale = self.transpose_kernels(rho[..., None] * grad_phi)
                value = value + inner(torch.matmul(points, batch.V.transpose(-1, -2)), scaled) * torch.exp(log_scale)
            else:
                channels = torch.cat([rho_over_Z[..., None] * pulled,
                                      (rho_over_Z * inner(mean_field, pulled))[..., None]], dim=-1)
                scaled, log_scale = self.transpose_kernels(channels)
                value = value + (inner(points, scaled[..., :-1]) - scaled[..., -1]) * torch.exp(log_scale)
        integrand = torch.einsum("mpi,pj,mp->mij", grad_phi, points, rho * basis.weights.reshape(-1))
        return basis.analysis(value.reshape((-1,) + basis.grid_shape)), integrand


def continuous_gradients(forward: ControlledForward, states: torch.Tensor, controls: torch.Tensor,
                         keep: frozenset = frozenset()) -> list:
    """Per member dJ/dW from the adjoint PDE stepped backward with the case's scheme (module docstring), or the
    NumericalFailure of its forward run; the adjoint's coefficients are kept at the steps in `keep`."""
    problem, basis = forward.problem, forward.problem.basis
    operator = AdjointOperator(forward)
    tape = Tape(forward, states, forward.case["control"]["checkpoint_every"], tokens=False)
    members, d = states.shape[0], basis.dim
    shape = problem.transport.coefficient_shape
    with torch.no_grad():
        final, reasons = forward.run(states, controls, tape)
        losses = torch.stack(forward.terminal_losses(final))
        variation = torch.stack([loss.first_variation(forward.flat_points, forward.masses(final)[m])
                                 for m, loss in enumerate(forward.losses)])
        phi = basis.analysis(variation.reshape((members,) + basis.grid_shape))
        dW = (forward.lambda_reg * (forward.t_end / forward.layers))[:, None, None, None] * controls.clone()
        norms = {forward.steps: forward.adjoint_norms(final, real_state(phi * basis.multiplicity))}
        kept = {forward.steps: real_state(phi * basis.multiplicity)} if forward.steps in keep else {}
        # The packed state: phi's real view and int grad phi x^T rho over the step (no linear part).
        integral = torch.zeros(members, d * d, dtype=problem.lam.dtype, device=problem.lam.device)
        lam = torch.cat([problem.lam, integral], 1)
        scheme = problem.scheme
        drives = forward.drives(controls)
        for segment, _, states_of in tape.segments(drives):
            for n, plan in reversed(segment):
                layer, dt = plan.interval.layer, float(plan.dt[0])
                W = controls[:, layer]
                start, stop = states_of[n - 1], states_of.get(n)
                if stop is None:
                    stop = problem.step(start, drives[layer], forward.factors(plan))
                rate_start = problem.lam * start + problem.transport(start, drives[layer])
                rate_stop = problem.lam * stop + problem.transport(stop, drives[layer])
                size = start.shape[1]

                def explicit(stage, packed):
                    theta = 1 - scheme.fractions[stage]  # backward stage time s = fraction dt: forward 1 - fraction
                    state = _hermite(theta, dt, start, rate_start, stop, rate_stop)
                    rho = basis.synthesis(problem.coefficients(state)).reshape(members, -1)
                    value, integrand = operator.rate(rho, W, complex_state(packed[:, :size], shape))
                    return torch.cat([real_state(value), integrand.reshape(members, -1)], dim=1)

                packed = torch.cat([real_state(phi), torch.zeros_like(integral)], 1)
                packed = scheme.step(packed, explicit, scheme.factors(lam, dt))
                phi_real = packed[:, :size] if problem.filter is None else packed[:, :size] * problem.filter
                phi = complex_state(phi_real.contiguous(), shape)
                dW[:, layer] += packed[:, size:].reshape(members, d, d)
                cotangent = real_state(phi * basis.multiplicity)
                norms[n - 1] = forward.adjoint_norms(start, cotangent)
                if n - 1 in keep:
                    kept[n - 1] = cotangent
        costs = losses + forward.regularisers(controls)
    return _gradients(forward, costs, losses, dW, norms, kept, reasons)


def continuous_gradient(forward: ControlledForward, c0, controls: torch.Tensor, keep: frozenset = frozenset()):
    """`continuous_gradients` of one member (as `discrete_gradient`) or of the batch."""
    states, controls, single = _batched(forward, c0, controls)
    results = continuous_gradients(forward, states, controls, keep)
    return only(results) if single else results


def _hermite(theta: float, dt: float, c0, f0, c1, f1):
    """Cubic Hermite interpolant at fraction theta of a step from values c0, c1 and rates f0, f1."""
    t2, t3 = theta * theta, theta * theta * theta
    return ((2 * t3 - 3 * t2 + 1) * c0 + (t3 - 2 * t2 + theta) * dt * f0
            + (-2 * t3 + 3 * t2) * c1 + (t3 - t2) * dt * f1)


GRADIENTS = {"discrete": discrete_gradients, "continuous": continuous_gradients}


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
        step = torch.zeros(controls.numel(), dtype=controls.dtype).reshape(controls.shape)
        step.view(-1)[index] = h
        gradient.view(-1)[index] = (cost(controls + step) - cost(controls - step)) / (2 * h)
    return gradient
