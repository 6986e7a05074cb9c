"""The training gradient: the adjoint of the forward map with a piecewise-constant control
(solvers/controlled_forward.py, docs/design.md "The model"), for M members at once.

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
  operator and the discretised adjoint operator (results/adjoint_verification.md measures both).  With
  solver.filter_order the filter, applied once a step and absent from the PDE and from the Hermite
  interpolation of the states, adds a difference that shrinks far slower than dt^p (docs/guide/training.md).
  Beyond the seeds' model (ForwardProblem.layered: several heads, B and V per layer or trained, a two-layer
  feed-forward; docs/model.md "Beyond the seeds") the control of layer l is its parameter vector theta_l, the
  nonlocal term has one such term per head and the integrand is dF/dtheta, both by
  spherepde.model.layered_adjoint.LayeredAdjoint; the stepping is the same, and dJ/dtheta is zero in the
  untrained entries (ControlledForward.trained_part), as the discrete one.

The tape (what the backward pass reads of the forward one) is chosen by memory (`Tape`): every step's state,
and the stage tokens (Transport.rate_token: on S^1's matrix and fourier paths the rows of each stage's first
product, (rho, v) or (r, y), so that the transpose skips it, where every step's fit; else the stage's state) of as
many of the first steps as fit controlled_forward.TAPE_BYTES beside them (a step whose tokens are kept costs the
backward pass no recomputation; one without is recomputed once, with its stages), else the state at every K-th step,
K = control.checkpoint_every or ceil(sqrt(steps)) (segments recomputed: one forward run more).  Memory in
the last case: (steps / K + K + 1) states per member, about 2 sqrt(steps) x 16 (lmax + 1) bytes on S^1 and
2 sqrt(steps) x 16 (lmax + 1)^2 bytes on S^2.  None changes the gradient beyond round-off.
"""


import torch

from solvers.controlled_forward import ControlledForward, Gradient, Tape, _batched
from solvers.eulerian import only
from spherepde.base.errors import NumericalFailure
from spherepde.base.real_view import complex_state, real_state
from spherepde.geometry.ambient import inner
from spherepde.kernels.choice import MemberKernels
from spherepde.model.attention import attention, velocity
from spherepde.model.layered_adjoint import LayeredAdjoint


def discrete_gradients(forward: ControlledForward, states: torch.Tensor, controls: torch.Tensor,
                       keep: frozenset = frozenset()) -> list:
    """Per member the exact dJ/dW of the discretised J (a Gradient), or the NumericalFailure of its forward run;
    the adjoint's coefficients are kept at the steps in `keep`.  Beyond the seeds' model dJ/dtheta (L, p), zero
    in the untrained entries: the layered transport's drive is theta_l, its cotangent dJ/dtheta_l's share."""
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
        norms = {forward.steps: forward.adjoint_norms([final], [cotangent])[0]}
        kept = {}
        if forward.steps in keep:
            kept[forward.steps] = cotangent.clone()
        for segment, stages, states_of in tape.segments(drives):
            cotangents = []
            for n, plan in reversed(segment):
                layer = plan.interval.layer
                cotangent, _ = problem.step_adjoint(cotangent, stages(n, plan), drives[layer], forward.factors(plan),
                                                    layer_drive_bar[layer])
                cotangents.append(cotangent)
                if n - 1 in keep:
                    kept[n - 1] = cotangent.clone()
            # |grad phi_n|_{L2(mu_n)} of the segment, in batches of transforms
            numbers = [n - 1 for n, _ in reversed(segment)]
            norms.update(zip(numbers, forward.adjoint_norms([states_of[n] for n in numbers], cotangents)))
        dW = torch.stack([problem.transport.feed_forward_adjoint(bar) for bar in layer_drive_bar], dim=1)
        dW = forward.trained_part(dW + forward.regulariser_gradients(controls))
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
    """`discrete_gradients` of one member (c0 its coefficients, controls (L, d, d) or (L, p)) as a Gradient, or of the
    batch (states (M, N), controls (M, L, d, d)) as the list; raises a single member's NumericalFailure."""
    states, controls, single = _batched(forward, c0, controls)
    results = discrete_gradients(forward, states, controls, keep)
    return only(results) if single else results


class AdjointOperator:
    """The explicit part of the continuous adjoint equation in s = T - t (module docstring), for the batch.

    The softmax term applies the scalings exp(-beta |B^T y|) (in rho / Z) and exp(beta |B x|) (of the
    transposed transform) separately, so it stays in floating-point range only while beta sigma_max(B)
    is at most ln of the dtype's largest number (709.78 in float64, 88.72 in float32;
    forward_problem.check_kernel_range refuses a case beyond); the discrete gradient has no such limit.
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


def adjoint_operator(forward: ControlledForward):
    """The explicit part of the continuous adjoint of the forward map's model: the hand-written AdjointOperator for
    the seeds' model (spherepde.model.transport's paths), LayeredAdjoint (autograd of the quadrature functional,
    docs/model.md "Beyond the seeds") for a general layout, whose controls are the layers' parameters theta_l."""
    problem = forward.problem
    if forward.layered:
        return LayeredAdjoint(problem.basis, problem.layout, forward.case["solver"]["chunk"])
    return AdjointOperator(forward)


def continuous_gradients(forward: ControlledForward, states: torch.Tensor, controls: torch.Tensor,
                         keep: frozenset = frozenset()) -> list:
    """Per member dJ/dW (dJ/dtheta (L, p) of a general layout, zero in its untrained entries) from the adjoint
    PDE stepped backward with the case's scheme (module docstring), or the NumericalFailure of its forward run;
    the adjoint's coefficients are kept at the steps in `keep`."""
    problem, basis = forward.problem, forward.problem.basis
    operator = adjoint_operator(forward)
    tape = Tape(forward, states, forward.case["control"]["checkpoint_every"], tokens=False)
    members, control_shape = states.shape[0], controls.shape[2:]  # a layer's control: W (d, d) or theta_l (p,)
    shape = problem.transport.coefficient_shape
    with torch.no_grad():
        final, reasons = forward.run(states, controls, tape)
        losses = torch.stack(forward.terminal_losses(final))
        variation = torch.stack([loss.first_variation(forward.flat_points, forward.masses(final)[m])
                                 for m, loss in enumerate(forward.losses)])
        phi = basis.analysis(variation.reshape((members,) + basis.grid_shape))
        dW = forward.regulariser_gradients(controls)
        norms = {forward.steps: forward.adjoint_norms([final], [real_state(phi * basis.multiplicity)])[0]}
        kept = {forward.steps: real_state(phi * basis.multiplicity)} if forward.steps in keep else {}
        # The packed state: phi's real view and the gradient integrand's integral over the step (no linear part).
        integral = torch.zeros(members, control_shape.numel(), dtype=problem.lam.dtype, device=problem.lam.device)
        lam = torch.cat([problem.lam, integral], 1)
        scheme = problem.scheme
        drives = forward.drives(controls)
        for segment, _, states_of in tape.segments(drives):
            for n, plan in reversed(segment):
                layer, dt = plan.interval.layer, float(plan.dt[0])
                control = controls[:, layer]
                start, stop = states_of[n - 1], states_of.get(n)
                if stop is None:
                    stop = problem.step(start, drives[layer], forward.factors(plan))
                rate_start = problem.lam * start + problem.transport(start, drives[layer])
                rate_stop = problem.lam * stop + problem.transport(stop, drives[layer])
                size = start.shape[1]

                def explicit(stage, packed):
                    fraction = 1 - scheme.fractions[stage]  # backward stage time s = fraction dt: forward 1 - fraction
                    state = _hermite(fraction, dt, start, rate_start, stop, rate_stop)
                    rho = basis.synthesis(problem.coefficients(state)).reshape(members, -1)
                    value, integrand = operator.rate(rho, control, complex_state(packed[:, :size], shape))
                    return torch.cat([real_state(value), integrand.reshape(members, -1)], dim=1)

                packed = torch.cat([real_state(phi), torch.zeros_like(integral)], 1)
                packed = scheme.step(packed, explicit, scheme.factors(lam, dt))
                phi_real = packed[:, :size] if problem.filter is None else packed[:, :size] * problem.filter
                phi = complex_state(phi_real.contiguous(), shape)
                dW[:, layer] += packed[:, size:].reshape((members,) + control_shape)
                cotangent = real_state(phi * basis.multiplicity)
                norms[n - 1] = forward.adjoint_norms([start], [cotangent])[0]
                if n - 1 in keep:
                    kept[n - 1] = cotangent
        costs = losses + forward.regularisers(controls)
    return _gradients(forward, costs, losses, forward.trained_part(dW), norms, kept, reasons)


def continuous_gradient(forward: ControlledForward, c0, controls: torch.Tensor, keep: frozenset = frozenset()):
    """`continuous_gradients` of one member (as `discrete_gradient`) or of the batch."""
    states, controls, single = _batched(forward, c0, controls)
    results = continuous_gradients(forward, states, controls, keep)
    return only(results) if single else results


def _hermite(fraction: float, dt: float, c0, f0, c1, f1):
    """Cubic Hermite interpolant at `fraction` of a step from values c0, c1 and rates f0, f1."""
    t2, t3 = fraction * fraction, fraction * fraction * fraction
    return ((2 * t3 - 3 * t2 + 1) * c0 + (t3 - 2 * t2 + fraction) * dt * f0
            + (-2 * t3 + 3 * t2) * c1 + (t3 - t2) * dt * f1)


GRADIENTS = {"discrete": discrete_gradients, "continuous": continuous_gradients}


