"""The training gradient (solvers/adjoint.py) and the losses (spherepde/model/losses.py)."""

import math

import pytest
import torch

import solvers.controlled_forward as controlled_forward
import spherepde.model.transport as transport
from solvers.adjoint import coefficients_to_field, continuous_gradient, discrete_gradient
from solvers.controlled_forward import ControlledForward, Tape, central_differences, evaluate_cost
from spherepde.io.case import case_from_dict
from spherepde.model.initial import initial_density
from spherepde.model.losses import LOSSES, make_loss
from spherepde.model.sampling import uniform


def training_case(kernel="unnormalized", dim=2, lmax=12, t_end=0.5, dt=0.05, scheme="auto", control=None,
                  beta=1.0, field="auto"):
    """A2 = diag(1, 0.65) (the seed's attention matrix) as B = V, eps = 0.05, a tilted vMF start."""
    diagonal = [1.0, 0.65, 0.4][:dim]
    A = [[diagonal[i] * (i == j) for j in range(dim)] for i in range(dim)]
    table = {"sphere": {"dim": dim, "lmax": lmax},
             "model": {"kernel": kernel, "beta": beta, "B": A, "V": A, "eps": 0.05},
             "initial": {"kind": "vmf", "mean": [1.0, 0.2, 0.1][:dim], "kappa": 2.0},
             "time": {"t_end": t_end, "dt": dt, "scheme": scheme},
             "solver": {"device": "cpu", "field": field},
             "control": {"loss": "align", "layers": 2, "lambda_reg": 0.1} | (control or {})}
    return case_from_dict(table)


def setup(case, scale=0.3):
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    generator = torch.Generator().manual_seed(1)
    d = case.dim
    controls = scale * torch.randn(case["control"]["layers"], d, d, generator=generator, dtype=torch.float64)
    return forward, c0, controls


def relative(a, b):
    return float((a - b).norm() / b.norm())


# --- losses ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_first_variation_is_the_derivative_in_the_masses(name):
    control = {"loss": name, "target": [0.0, 1.0, 0.0], "K": 5, "kappa_cand": 2.0, "tau": 3.0, "seed": 7}
    loss = make_loss(control, 3)
    points = uniform(40, 3, torch.Generator().manual_seed(0))
    masses = torch.rand(40, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    masses = (masses / masses.sum()).requires_grad_(True)
    (autograd,) = torch.autograd.grad(loss.value(points, masses), masses)
    assert torch.allclose(loss.first_variation(points, masses.detach()), autograd, rtol=1e-12, atol=1e-14)


def test_align_loss_is_one_minus_the_target_component_of_the_mean():
    loss = make_loss({"loss": "align", "target": [0.0, 1.0]}, 2)
    points = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    masses = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    assert float(loss.value(points, masses)) == pytest.approx(1 - 0.1, abs=1e-15)


def test_bow_candidates_are_seeded_and_the_uniform_measure_is_near_log_k():
    control = {"loss": "bow", "target": [0.0, 1.0], "K": 8, "kappa_cand": 0.0, "tau": 1e-9, "seed": 3}
    a, b = make_loss(control, 2), make_loss(control, 2)
    assert torch.equal(a.candidates, b.candidates)
    points = uniform(10, 2, torch.Generator().manual_seed(0))
    masses = torch.full((10,), 0.1, dtype=torch.float64)
    # tau -> 0: every softmax is 1/K, p_k = 1/K, l = log K
    assert float(a.value(points, masses)) == pytest.approx(math.log(8), rel=1e-8)


# --- gradients -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel, path", [("unnormalized", "fourier"), ("unnormalized", "matrix"),
                                          ("softmax", "matrix")])
def test_discrete_gradient_matches_central_differences(kernel, path, monkeypatch):
    """On S^1's paths: the unnormalized kernel's fourier path (its numpy program on the CPU) and, with torch's
    cost rule (the GPU's choice), its matrix path; the softmax's matrix path."""
    if path == "matrix":
        monkeypatch.setattr(transport, "NUMPY_OPERATION_COST", transport.OPERATION_COST)
    forward, c0, controls = setup(training_case(kernel))
    assert forward.problem.transport.path == path
    gradient = discrete_gradient(forward, c0, controls)
    assert gradient.cost == pytest.approx(evaluate_cost(forward, c0, controls), rel=1e-14)
    assert relative(gradient.dW, central_differences(forward, c0, controls)) <= 1e-6


@pytest.mark.parametrize("loss", ["align", "bow"])
def test_continuous_gradient_is_within_the_truncation_error(loss):
    control = {"loss": loss} | ({"K": 4, "kappa_cand": 2.0, "tau": 2.0} if loss == "bow" else {})
    forward, c0, controls = setup(training_case("softmax", dt=0.025, control=control))
    assert relative(continuous_gradient(forward, c0, controls).dW, discrete_gradient(forward, c0, controls).dW) < 1e-6


@pytest.mark.parametrize("dim, kernel", [(2, "unnormalized"), (2, "softmax"), (3, "softmax")])
def test_the_gradient_matches_the_cpu_gradient(dim, kernel, accelerator):
    def gradient(where):
        case = training_case(kernel, dim=dim, lmax=12 if dim == 2 else 6).with_overrides([f"solver.device={where}"])
        forward, c0, controls = setup(case)
        return discrete_gradient(forward, c0, controls.to(c0.device)).dW.cpu()

    reference = gradient("cpu")
    assert relative(gradient(accelerator), reference) <= 1e-10


def test_discrete_gradient_on_the_sphere_matches_central_differences():
    forward, c0, controls = setup(training_case("softmax", dim=3, lmax=6, t_end=0.2, dt=0.1,
                                                control={"layers": 1}))
    gradient = discrete_gradient(forward, c0, controls)
    assert relative(gradient.dW, central_differences(forward, c0, controls)) <= 1e-6
    assert relative(continuous_gradient(forward, c0, controls).dW, gradient.dW) < 1e-4


@pytest.mark.parametrize("kernel", ["softmax", "unnormalized"])
def test_discrete_gradient_on_the_frame_route_matches_the_channels_route_and_central_differences(kernel, monkeypatch):
    """S^2, spectral field, B = I, V = 0.8 I: the rate and its transpose take N on the frame (Transport.
    _frame_velocity and its adjoint); dJ/dW is the channels' route's to round-off, and its component along a random
    direction D is the central difference (J(W + h D) - J(W - h D)) / 2h (two runs, where all entries take 18)."""
    case = training_case(kernel, dim=3, lmax=6, t_end=0.04, dt=0.04, control={"layers": 1}, field="spectral")
    forward, c0, controls = setup(case.with_overrides(["model.B=[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]",
                                                       "model.V=[[0.8, 0.0, 0.0], [0.0, 0.8, 0.0], [0.0, 0.0, 0.8]]"]))
    transport = forward.problem.transport
    assert transport._frame_scale is not None
    gradient = discrete_gradient(forward, c0, controls)
    direction = torch.randn(controls.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    h = 1e-5
    difference = (evaluate_cost(forward, c0, controls + h * direction)
                  - evaluate_cost(forward, c0, controls - h * direction)) / (2 * h)
    assert abs(float((gradient.dW * direction).sum()) - difference) <= 1e-6 * abs(difference)
    monkeypatch.setattr(transport, "_frame_scale", None)
    assert relative(gradient.dW, discrete_gradient(forward, c0, controls).dW) <= 1e-12


def test_zero_temperature_gradient_matches_central_differences():
    forward, c0, controls = setup(training_case("softmax", beta="inf"))
    assert relative(discrete_gradient(forward, c0, controls).dW, central_differences(forward, c0, controls)) <= 1e-6
    assert relative(continuous_gradient(forward, c0, controls).dW, discrete_gradient(forward, c0, controls).dW) < 1e-6


def test_discrete_adjoint_state_at_the_end_is_the_first_variation():
    """phi_N (from the cotangent of c_N) = dl_align/dmu = -<x, e_2>: the mode k = 1 only; the hand-written
    cotangent (synthesis^T of w dl/dmu) equals torch autograd's of the loss."""
    forward, c0, controls = setup(training_case())
    end, _ = forward.run(forward.initial(), controls[None])
    cotangent = forward.terminal_cotangent(end)
    basis, problem = forward.problem.basis, forward.problem
    expected = basis.analysis(-basis.points[..., 1])
    assert torch.allclose(coefficients_to_field(basis, problem.coefficients(cotangent)[0]), expected, atol=1e-14)
    coefficients = problem.coefficients(end)[0].clone().requires_grad_(True)
    masses = (basis.synthesis(coefficients) * basis.weights).reshape(-1)
    (autograd,) = torch.autograd.grad(forward.losses[0].value(forward.flat_points, masses), coefficients)
    assert torch.allclose(problem.coefficients(cotangent)[0], autograd, rtol=0, atol=1e-15)


def test_checkpointing_does_not_change_the_gradient():
    case = training_case(control={"checkpoint_every": 3})
    forward, c0, controls = setup(case)
    every_step = ControlledForward(training_case(control={"checkpoint_every": 1}))
    assert torch.allclose(discrete_gradient(forward, c0, controls).dW, discrete_gradient(every_step, c0, controls).dW,
                          rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kernel, dim", [("unnormalized", 2), ("softmax", 3)])
def test_a_tape_keeping_the_tokens_of_some_steps_gives_the_gradient_of_one_keeping_all(monkeypatch, kernel, dim):
    """Steps whose stage tokens did not fit the tape are recomputed in the backward pass, and where the rows of the
    stages' first products do not all fit the tape keeps the stages' states, from which the transpose recomputes
    them: the same arithmetic, so the same dW bit for bit, whichever steps and tokens those are."""
    case = training_case(kernel, dim=dim, lmax=12 if dim == 2 else 6)
    forward, c0, controls = setup(case)
    assert Tape(forward, forward.initial(), 0).rows
    whole = discrete_gradient(forward, c0, controls).dW
    state_bytes = forward.initial().numel() * 8
    transport = forward.problem.transport
    scheme = forward.problem.scheme
    step_bytes = (scheme.stages_count - scheme.starts_at_start) * transport.token_size(rows=False) * 8
    rows_larger = transport.token_size(rows=True) > transport.token_size(rows=False)
    assert rows_larger == (dim == 2)  # S^1's fourier path keeps (r, y); the S^2 grid path's token is the state
    for steps in (3, forward.steps):
        monkeypatch.setattr(controlled_forward, "TAPE_BYTES", forward.steps * state_bytes + steps * step_bytes)
        tape = Tape(forward, forward.initial(), 0)
        assert (tape.every, tape.token_steps) == (1, steps) and forward.steps > 3
        assert tape.rows == (steps == forward.steps and not rows_larger)
        assert torch.equal(discrete_gradient(forward, c0, controls).dW, whole)


def test_the_tape_of_the_training_papers_case_is_the_guides():
    """docs/guide/training.md: one member of cases/seed004-align-l065.toml (8000 steps) keeps every step's state and
    stage rows; twenty keep every state and, in what TAPE_BYTES leaves, the stage states (the 5 stages of imex-ark436
    after the step's start, each a state) of floor((2^29 - 8000 x 20 S) / (5 x 20 S)) = 1001 steps, S the bytes of
    one member's state (the guide said twenty kept every step's stage states)."""
    import spherepde

    case = spherepde.load_case("cases/seed004-align-l065.toml", ["solver.device='cpu'"])
    one, twenty = (ControlledForward([case] * members) for members in (1, 20))
    tape = Tape(one, one.initial(), 0)
    assert (one.steps, tape.every, tape.rows, tape.token_steps) == (8000, 1, True, 8000)
    states = twenty.initial()
    tape = Tape(twenty, states, 0)
    S = states[0].numel() * states.element_size()
    assert (tape.every, tape.rows) == (1, False)
    assert tape.token_steps == (2 ** 29 - 8000 * 20 * S) // (5 * 20 * S) == 1001


@pytest.mark.parametrize("batch_bytes", [1, 10 ** 9])
def test_adjoint_norms_are_the_kept_adjoints_gradients_in_the_forward_densities(monkeypatch, batch_bytes):
    """Gradient.adjoint_norm[n] = (int |grad phi_n|^2 rho_n dsigma)^(1/2), phi_n the kept adjoint and rho_n the
    forward run's density at step n, for every member of a batch, whether the norms are computed a step at a
    time or all at once (NORM_BYTES)."""
    monkeypatch.setattr(controlled_forward, "NORM_BYTES", batch_bytes)
    case = training_case()
    forward = ControlledForward([case, case])
    generator = torch.Generator().manual_seed(3)
    controls = 0.3 * torch.randn(2, case["control"]["layers"], 2, 2, generator=generator, dtype=torch.float64)
    tape = Tape(forward, forward.initial(), 1, tokens=False)
    forward.run(forward.initial(), controls, tape)
    gradients = discrete_gradient(forward, None, controls, keep=frozenset(range(forward.steps + 1)))
    basis, problem = forward.problem.basis, forward.problem
    for member, gradient in enumerate(gradients):
        assert len(gradient.adjoint_norm) == forward.steps + 1
        for n, norm in enumerate(gradient.adjoint_norm):
            rho = basis.synthesis(problem.coefficients(tape.states[n])[member])
            grad_phi = basis.gradient(gradient.phi[n])
            expected = math.sqrt(float((basis.weights * rho * (grad_phi ** 2).sum(-1)).sum()))
            assert norm == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("kernel, scheme, order", [("unnormalized", "imex-ark436", 4), ("softmax", "imex-ars443", 3)])
def test_continuous_gradient_converges_to_the_discrete_one_at_the_scheme_order(kernel, scheme, order):
    errors = []
    for dt in (0.1, 0.05, 0.025):
        forward, c0, controls = setup(training_case(kernel, lmax=16, t_end=2.0, dt=dt, scheme=scheme))
        errors.append(relative(continuous_gradient(forward, c0, controls).dW,
                               discrete_gradient(forward, c0, controls).dW))
    rates = [math.log2(errors[i] / errors[i + 1]) for i in range(2)]
    assert all(abs(rate - order) < 0.35 for rate in rates), (errors, rates)


@pytest.mark.parametrize("order, gap", [(None, None), (8, 2.7e-5), (16, 2.2e-7)])
def test_a_filter_keeps_the_continuous_gradient_from_the_discrete_one_at_any_step(order, gap):
    """docs/guide/training.md: the filter acts once a step, outside the adjoint PDE, so the continuous gradient's
    difference from the discrete one does not shrink with dt as the scheme's truncation error (20 -> 40 steps: 16x
    smaller without a filter, the same with filter_order 8 or 16)."""
    errors = []
    for dt in (0.05, 0.02):
        case = training_case(lmax=12, dt=dt)
        forward, c0, controls = setup(case if order is None else case.with_overrides([f"solver.filter_order={order}"]))
        errors.append(relative(continuous_gradient(forward, c0, controls).dW,
                               discrete_gradient(forward, c0, controls).dW))
    if order is None:
        assert errors[0] / errors[1] > 10 and errors[0] < 1e-8
    else:
        assert errors == [pytest.approx(gap, rel=0.1)] * 2


def test_continuous_gradient_of_members_on_the_sphere_is_each_members_own():
    """Two S^2 members in one batch (d = 3: nine entries of W, so the adjoint's packed rows have an odd length):
    each member's continuous gradient is its serial one and agrees with central differences of its own J to the
    scheme's truncation error (the batch raised in torch.view_as_complex on the odd row stride)."""
    cases = [training_case("softmax", dim=3, lmax=6, t_end=0.2, dt=0.1, control={"layers": 1, "target": target})
             for target in ([0.0, 1.0, 0.0], [1.0, 0.0, 0.5])]
    generator = torch.Generator().manual_seed(2)
    controls = 0.3 * torch.randn(2, 1, 3, 3, generator=generator, dtype=torch.float64)
    batch = continuous_gradient(ControlledForward(cases), None, controls)
    for member, case in enumerate(cases):
        forward = ControlledForward(case)
        alone = continuous_gradient(forward, None, controls[member])
        assert torch.allclose(batch[member].dW, alone.dW, rtol=1e-12, atol=1e-15)
        assert relative(batch[member].dW, central_differences(forward, None, controls[member])) < 1e-4
