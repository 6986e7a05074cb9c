"""The training gradient: the forward map with a piecewise-constant control and its adjoint (DESIGN §2).

Cost (nondimensional, t is network depth):

    J(W) = l(mu_T) + lambda_reg / 2 sum_l |W_l|_F^2 |slice_l|,     W_t = W_l on slice l = [l T/L, (l+1) T/L).

Step grid: each slice is split into the same number of equal steps no longer than time.dt,
so that W is constant over every step (no stage of a Runge-Kutta step sees two slices).

Two gradients, one step grid (control.gradient):

* "discrete" (the training default): the exact gradient of the discretised J, i.e. of the
  map W -> c_N = S_{N-1} o ... o S_0 (c_0) with S_n one step of the case's IMEX / RK scheme
  (transforms, dealiasing, attention transform and filter included), composed with l on the
  grid.  It is reverse-mode differentiation done step by step: the cotangent a_n of c_n obeys
  a_n = (dS_n/dc)^* a_{n+1}, and dJ/dW_l collects (dS_n/dW)^* a_{n+1} over the steps of slice l;
  each vector-Jacobian product is torch autograd through one step.  It agrees with central
  finite differences of the discrete J to round-off (tests/test_adjoint.py).  The cotangent is
  the discrete adjoint state: phi_n has coefficients a_n / multiplicity (Parseval).
* "continuous": the adjoint PDE discretised on its own.  phi solves, backward from
  phi_T = dl/dmu(mu_T),

      -d_t phi = eps Lap phi + v[rho_t] . grad phi + NL[rho_t, phi],
      unnormalized:  NL(x) = <V x, G(x)>,                 G(x) = int e^{beta <x, B^T y>} grad phi(y) rho(y) dsigma(y)
      softmax:       NL(x) = <x, T[(rho / Z) V^T grad phi](x)> - T[(rho / Z) <m, V^T grad phi>](x),
                     T f(x) = int e^{beta <x, B^T y>} f(y) dsigma(y)
      beta = inf:    NL = 0 (m = B^T x / |B^T x| does not depend on rho)

  (the nonlocal term is the first variation of v: d m(y) / d rho(x) = e^{beta <y, B x>} x for the
  unnormalized kernel, e^{beta <y, B x>} (x - m(y)) / Z(y) for softmax), and

      dJ/dW_l = lambda_reg W_l |slice_l| + int_{slice_l} int grad phi(x) x^T rho_t(x) dsigma dt.

  In s = T - t the equation is d_s phi = eps Lap phi + (explicit terms): the same IMEX stepper,
  diffusion implicit.  The explicit stages need rho at the stage times: cubic Hermite
  interpolation of the stored step states and their rates (error O(dt^4)).  The time integral
  of the gradient is carried as extra ODE components integrated by the explicit part of the
  same scheme, so it is as accurate as phi.  It differs from the discrete gradient by the
  scheme's truncation error, O(dt^p) (p = 4 for imex-ark436 and rk4, 3 for imex-ars443), plus
  the spectrally small difference between the adjoint of the discretised operator and the
  discretised adjoint operator (results/adjoint_verification.md measures both).

Forward states: the forward run stores c at every `checkpoint_every`-th step (default
ceil(sqrt(steps))); the backward pass recomputes one segment at a time from its checkpoint.
Memory: (steps / K + K + 1) coefficient arrays, i.e. about 2 sqrt(steps) x 16 (lmax + 1) bytes on
S^1 and 2 sqrt(steps) x 16 (lmax + 1)^2 bytes on S^2 (complex128), for one extra forward run of work.
The discrete gradient additionally holds one step's autograd graph at a time (a few grid fields
per stage).
"""

import math
from dataclasses import dataclass, field, replace

import torch

from spherepde.ambient import inner
from spherepde.errors import CaseError, NumericalFailure
from spherepde.exp_kernel import make_exp_kernel
from spherepde.losses import make_loss
from spherepde.model import attention, attention_mean, velocity

from .eulerian import ForwardProblem, departure
from .timesteppers import choose_scheme, make_stepper


@dataclass
class Gradient:
    """J, dJ/dW (layers, d, d), |grad phi_t|_{L2(mu_t)} at the step times (ascending) and, at the steps asked
    for, the adjoint's coefficients {step: phi}."""

    cost: float
    loss: float
    dW: torch.Tensor
    times: list
    adjoint_norm: list
    phi: dict = field(default_factory=dict)


class ControlledForward:
    """The forward map of a training case on its step grid: W piecewise constant over `layers` slices.

    Builds on :class:`solvers.eulerian.ForwardProblem` (basis, model, attention transform, filter);
    `step(c, W)` is one step of the case's scheme with W_t = W throughout.
    """

    def __init__(self, case, problem: ForwardProblem | None = None):
        self.case = case
        self.problem = problem or ForwardProblem(case)
        control, timing = case["control"], case["time"]
        self.layers, self.t_end = control["layers"], timing["t_end"]
        slice_length = self.t_end / self.layers
        self.steps_per_layer = max(1, math.ceil(slice_length / timing["dt"] - 1e-9))
        self.steps = self.layers * self.steps_per_layer
        if "max_steps" in timing and self.steps > timing["max_steps"]:
            raise CaseError(f"time.max_steps: a forward run of the training needs {self.steps} steps, "
                            f"more than {timing['max_steps']}")
        self.dt = slice_length / self.steps_per_layer
        self.stepper = make_stepper(choose_scheme(timing["scheme"], self.problem.model.eps))
        self.loss = make_loss(control, case.dim)
        self.lambda_reg = control["lambda_reg"]
        every = control["checkpoint_every"]
        self.checkpoint_every = every if every > 0 else max(1, math.ceil(math.sqrt(self.steps)))
        basis = self.problem.basis
        self.points = basis.points
        self.flat_points = basis.points.reshape(-1, basis.dim)

    def layer_of_step(self, n: int) -> int:
        return n // self.steps_per_layer

    def layer_at(self, t: float) -> int:
        """The slice holding t (t inside a step; boundaries go to the later slice)."""
        return min(int(t * self.layers / self.t_end), self.layers - 1)

    def time(self, n: int) -> float:
        return n * self.dt

    def transport(self, c: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """-div(rho v) in spectral space with v = P_x(W x + V m[rho](x))."""
        problem = self.problem
        rho = problem.basis.synthesis(c)
        model = replace(problem.model, W=W, controls=None)
        mean_field = attention_mean(problem.model, problem.exp_kernel, self.points, rho)
        return -problem.basis.divergence(rho[..., None] * velocity(model, self.points, mean_field, 0.0))

    def step(self, c: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        c = self.stepper(self.problem.lam, lambda t, u: self.transport(u, W), 0.0, c, self.dt)
        return c if self.problem.filter is None else c * self.problem.filter

    def masses(self, c: torch.Tensor) -> torch.Tensor:
        """rho(x_i) w_i on the flattened grid: the atoms the loss sees."""
        basis = self.problem.basis
        return (basis.synthesis(c) * basis.weights).reshape(-1)

    def terminal_loss(self, c: torch.Tensor) -> torch.Tensor:
        return self.loss.value(self.flat_points, self.masses(c))

    def regulariser(self, controls: torch.Tensor) -> torch.Tensor:
        return 0.5 * self.lambda_reg * (controls ** 2).sum() * (self.t_end / self.layers)

    def checkpoints(self, c0: torch.Tensor, controls: torch.Tensor) -> dict:
        """Forward run storing c at the steps n = 0, K, 2K, ... and at the end; {n: c_n}."""
        stored, c, check = {0: c0}, c0, self.density_check(c0)
        with torch.no_grad():
            for n in range(self.steps):
                c = self.step(c, controls[self.layer_of_step(n)])
                check(c, n + 1)
                if (n + 1) % self.checkpoint_every == 0 or n + 1 == self.steps:
                    stored[n + 1] = c
        return stored

    def density_check(self, c0: torch.Tensor):
        """check(c, n): NumericalFailure when the state c after step n, stepped from c0, is not finite or no
        longer a density (eulerian.departure).  A W beyond the explicit transport's stability limit is caught
        at every step, even while finite: a blow-up can pass and leave a terminal state that looks like a
        density, and the trained run, which checks each save, would then fail at the W a line search accepted."""
        basis = self.problem.basis
        weights = basis.weights.cpu().double().numpy()
        mass_0 = float(basis.integrate(basis.synthesis(c0)))

        def check(c: torch.Tensor, n: int) -> None:
            reason = departure(basis.synthesis(c).cpu().double().numpy(), weights, mass_0, basis.placement.real)
            if reason is not None:
                raise NumericalFailure(f"numerical failure: {reason} at t = {self.time(n):g}: the forward run "
                                       "blew up")
        return check

    def segments(self, stored: dict, controls: torch.Tensor):
        """Backward over the segments: (n0, [c_n0, ..., c_n1]) from the last segment to the first."""
        starts = sorted(stored)[:-1]
        for n0 in reversed(starts):
            n1 = min(n0 + self.checkpoint_every, self.steps)
            states = [stored[n0]]
            with torch.no_grad():
                for n in range(n0, n1):
                    states.append(self.step(states[-1], controls[self.layer_of_step(n)]))
            yield n0, states

    def adjoint_norm(self, phi: torch.Tensor, c: torch.Tensor) -> float:
        """|grad phi|_{L2(mu)} = (int |grad phi|^2 rho dsigma)^{1/2}."""
        basis = self.problem.basis
        grad = basis.gradient(phi)
        return math.sqrt(max(float(basis.integrate((grad * grad).sum(-1) * basis.synthesis(c))), 0.0))


def coefficients_to_field(basis, a: torch.Tensor) -> torch.Tensor:
    """Coefficients of the grid function represented by a cotangent a of the coefficients c.

    For real fields, int phi rho dsigma = sum multiplicity Re(conj(phi_k) c_k), whose torch
    gradient with respect to c is multiplicity * phi_k; modes outside the triangle (multiplicity 0) are 0.
    """
    multiplicity = basis.multiplicity
    return torch.where(multiplicity > 0, a / torch.where(multiplicity > 0, multiplicity, 1.0), 0.0)


def discrete_gradient(forward: ControlledForward, c0: torch.Tensor, controls: torch.Tensor,
                      keep: frozenset = frozenset()) -> Gradient:
    """Exact dJ/dW of the discretised J by reverse-mode differentiation, one step at a time; the adjoint's
    coefficients are kept at the steps in `keep`."""
    stored = forward.checkpoints(c0, controls)
    basis = forward.problem.basis
    c_end = stored[forward.steps].detach().requires_grad_(True)
    with torch.enable_grad():
        loss = forward.terminal_loss(c_end)
        (a,) = torch.autograd.grad(loss, c_end)
    loss = loss.detach()
    dW = forward.lambda_reg * (forward.t_end / forward.layers) * controls.detach().clone()
    norms, kept = {}, {}

    def record(n, c):
        phi = coefficients_to_field(basis, a)
        norms[n] = forward.adjoint_norm(phi, c)
        if n in keep:
            kept[n] = phi.detach().clone()

    record(forward.steps, stored[forward.steps])
    for n0, states in forward.segments(stored, controls):
        for n in reversed(range(n0, n0 + len(states) - 1)):
            layer = forward.layer_of_step(n)
            with torch.enable_grad():
                c = states[n - n0].detach().requires_grad_(True)
                W = controls[layer].detach().requires_grad_(True)
                a, dW_step = torch.autograd.grad(forward.step(c, W), (c, W), grad_outputs=a)
            dW[layer] += dW_step
            record(n, states[n - n0])
    cost = float(loss) + float(forward.regulariser(controls))
    times = sorted(norms)
    return Gradient(cost, float(loss), dW, [forward.time(n) for n in times], [norms[n] for n in times], kept)


class AdjointOperator:
    """The explicit part of the continuous adjoint equation in s = T - t (module docstring).

    The softmax term applies the scalings exp(-beta |B^T y|) (in rho / Z) and exp(beta |B x|) (of the
    transposed transform) separately, so it stays in floating-point range only while beta sigma_max(B)
    is below ~700 in float64 (~80 in float32); the discrete gradient has no such limit.
    """

    def __init__(self, forward: ControlledForward):
        problem = forward.problem
        solver = forward.case["solver"]
        self.forward, self.problem, self.basis = forward, problem, problem.basis
        model = problem.model
        self.transpose_kernel = None if model.zero_temperature else make_exp_kernel(
            self.basis, model.B.T.contiguous(), model.beta, solver["field"], solver["kernel_tol"], solver["chunk"])

    def rate(self, rho: torch.Tensor, W: torch.Tensor, phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(coefficients of v . grad phi + NL, grid of the gradient integrand grad phi x^T rho (d, d))."""
        basis, model, points = self.basis, self.problem.model, self.basis.points
        mean_field, rho_over_Z = attention(model, self.problem.exp_kernel, points, rho)
        v = velocity(replace(model, W=W, controls=None), points, mean_field, 0.0)
        grad_phi = basis.gradient(phi)
        value = inner(v, grad_phi)
        if self.transpose_kernel is not None:
            pulled = grad_phi @ model.V  # V^T grad phi, row-wise
            if rho_over_Z is None:
                scaled, log_scale = self.transpose_kernel(rho[..., None] * grad_phi)
                value = value + inner(points @ model.V.T, scaled) * torch.exp(log_scale)
            else:
                channels = torch.cat([rho_over_Z[..., None] * pulled,
                                      (rho_over_Z * inner(mean_field, pulled))[..., None]], dim=-1)
                scaled, log_scale = self.transpose_kernel(channels)
                value = value + (inner(points, scaled[..., :-1]) - scaled[..., -1]) * torch.exp(log_scale)
        integrand = torch.einsum("...i,...j,...->ij", grad_phi, points, rho * basis.weights)
        return basis.analysis(value), integrand


def continuous_gradient(forward: ControlledForward, c0: torch.Tensor, controls: torch.Tensor,
                        keep: frozenset = frozenset()) -> Gradient:
    """dJ/dW from the adjoint PDE stepped backward with the case's scheme (module docstring); the adjoint's
    coefficients are kept at the steps in `keep`."""
    problem, basis = forward.problem, forward.problem.basis
    operator = AdjointOperator(forward)
    stored = forward.checkpoints(c0, controls)
    c_end = stored[forward.steps]
    loss = forward.terminal_loss(c_end)
    phi = basis.analysis(forward.loss.first_variation(forward.flat_points, forward.masses(c_end))
                         .reshape(basis.grid_shape))
    dW = forward.lambda_reg * (forward.t_end / forward.layers) * controls.detach().clone()
    norms = {forward.steps: forward.adjoint_norm(phi, c_end)}
    kept = {forward.steps: phi.clone()} if forward.steps in keep else {}
    shape, size = phi.shape, phi.numel()
    d = basis.dim
    # The packed state (phi coefficients, int grad phi x^T rho over the step): the integral has no linear part.
    lam = torch.cat([problem.lam.reshape(-1), torch.zeros(d * d, dtype=problem.lam.dtype, device=problem.lam.device)])
    dt = forward.dt
    for n0, states in forward.segments(stored, controls):
        for n in reversed(range(n0, n0 + len(states) - 1)):
            layer = forward.layer_of_step(n)
            W = controls[layer]
            c_start, c_stop = states[n - n0], states[n + 1 - n0]
            rate_start = problem.lam * c_start + forward.transport(c_start, W)
            rate_stop = problem.lam * c_stop + forward.transport(c_stop, W)

            def explicit(s, packed):
                theta = 1 - s / dt  # stage at backward time s within the step is forward fraction theta
                c = _hermite(theta, dt, c_start, rate_start, c_stop, rate_stop)
                value, integrand = operator.rate(basis.synthesis(c), W, packed[:size].reshape(shape))
                return torch.cat([value.reshape(-1), integrand.reshape(-1).to(value.dtype)])

            packed = torch.cat([phi.reshape(-1), torch.zeros(d * d, dtype=phi.dtype, device=phi.device)])
            packed = forward.stepper(lam, explicit, 0.0, packed, dt)
            phi = packed[:size].reshape(shape)
            if problem.filter is not None:
                phi = phi * problem.filter
            dW[layer] += packed[size:].real.reshape(d, d)
            norms[n] = forward.adjoint_norm(phi, c_start)
            if n in keep:
                kept[n] = phi.clone()
    cost = float(loss) + float(forward.regulariser(controls))
    times = sorted(norms)
    return Gradient(cost, float(loss), dW, [forward.time(n) for n in times], [norms[n] for n in times], kept)


def _hermite(theta: float, dt: float, c0, f0, c1, f1):
    """Cubic Hermite interpolant at fraction theta of a step from values c0, c1 and rates f0, f1."""
    t2, t3 = theta * theta, theta * theta * theta
    return ((2 * t3 - 3 * t2 + 1) * c0 + (t3 - 2 * t2 + theta) * dt * f0
            + (-2 * t3 + 3 * t2) * c1 + (t3 - t2) * dt * f1)


GRADIENTS = {"discrete": discrete_gradient, "continuous": continuous_gradient}


def evaluate_cost(forward: ControlledForward, c0: torch.Tensor, controls: torch.Tensor) -> float:
    """J(W) of the discretised forward map (no adjoint): for finite differences and line searches."""
    c = forward.checkpoints(c0, controls)[forward.steps]
    with torch.no_grad():
        return float(forward.terminal_loss(c)) + float(forward.regulariser(controls))


def central_differences(forward: ControlledForward, c0: torch.Tensor, controls: torch.Tensor,
                        h: float = 1e-5) -> torch.Tensor:
    """dJ/dW of the discretised forward map by central differences (`central_differences_of`): the
    independent check of the adjoint gradients."""
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
