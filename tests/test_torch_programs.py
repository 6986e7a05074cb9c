"""The torch branches of the one-program functions (spherepde.base.arrays) that a CPU run never takes: numpy is the
CPU's program outside autograd, torch the program of a CUDA run.  Each runs here on the CPU in torch, forced the way
a CUDA run chooses it (a tensor under autograd for base.arrays.program_namespace, a DirectStep without numpy
arrays for solvers.particle_adjoint), against the numpy program on the same inputs: the same values to round-off."""

import numpy as np
import pytest
import torch
from conftest import make_case
from test_particle_step import controls_of, seed_member
from test_particles import batch_of, generator, uniform
from test_transport import CPU64, member_cases, relative, setup

from solvers.controlled_forward import central_differences_of
from solvers.particle_field import ParticleField
from solvers.particle_training import ParticleControl
from spherepde.base.real_view import real_state
from spherepde.discretisation.bases import make_basis
from spherepde.kernels.choice import MemberKernels
from spherepde.model.attention import NEGLIGIBLE_DENSITY, Model, ModelBatch, softmax_mean_adjoint
from spherepde.model.initial import initial_density
from spherepde.model.matrix_path import NUMPY_MEMBERS, TRANSPOSED_MEMBERS
from spherepde.model.transport import Transport


def torch_program(function, *arguments):
    """function(*arguments) with its tensor arguments tracked by autograd, so that base.arrays.program_namespace
    picks torch on the CPU as it does on CUDA; the values detached."""
    with torch.enable_grad():
        tracked = [a.clone().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                   for a in arguments]
        values = function(*tracked)
    return tuple(v.detach() for v in values) if isinstance(values, tuple) else values.detach()


@pytest.mark.parametrize("integrator", ["heun", "euler", "rk4"])
@pytest.mark.parametrize("kernel, B, beta", [("unnormalized", ((1.0, 0.0), (0.0, 0.65)), 1.0),
                                             ("softmax", ((1.0, 0.3), (-0.2, 0.65)), 1.0),
                                             ("softmax", ((1.0, 0.3), (-0.2, 0.65)), 1000.0)])
def test_the_by_hand_particle_gradient_is_the_same_in_torch(integrator, kernel, B, beta):
    """A training's forward run and its transposed steps by hand (particle_adjoint.taped_run, transposed_run:
    DirectStep.advance and retreat) in torch, as on CUDA, against numpy's: two members of two replica systems each,
    noisy steps, the softmax's kernel shifted at beta = 1000 too; J and dJ/dW to 1e-13."""
    cases = [seed_member(seed, kernel, B, beta=beta).with_overrides([f"particles.integrator='{integrator}'",
                                                                     "particles.replicas=2"]) for seed in (0, 1)]
    forward = ParticleControl(cases)
    assert forward.by_hand
    controls = controls_of(2)
    by_numpy = forward.gradients(controls)
    program = forward.system.integrator.direct_step(forward.x0)
    assert np in program.arrays
    del program.arrays[np]  # what a CUDA run's program holds: its tensors alone
    by_torch = forward.gradients(controls)
    for numpy_member, torch_member in zip(by_numpy, by_torch):
        assert abs(torch_member.cost - numpy_member.cost) <= 1e-13 * abs(numpy_member.cost)
        assert float((torch_member.dW - numpy_member.dW).norm() / numpy_member.dW.norm()) <= 1e-13


@pytest.mark.parametrize("kernel, beta", [("softmax", 3.0), ("unnormalized", 3.0), ("softmax", 1000.0)])
def test_the_direct_mean_field_is_the_same_in_torch(kernel, beta):
    """ParticleField.mean_field's direct sums (particle_step.direct_mean) in torch, whole kernels as on CUDA, against
    numpy's blocks of query rows: two systems of 600 tokens on S^2, a general B (shifted rows at beta = 1000)."""
    case = make_case(3, 12, model={"kernel": kernel, "beta": beta,
                                   "B": [[1.0, 0.2, 0.0], [0.0, 0.9, 0.1], [0.1, 0.0, 1.1]]})
    field = ParticleField(batch_of(case), "dense", "auto", replicas=2)
    x = torch.cat([uniform(600, 3, generator(seed)) for seed in (5, 6)])[None]
    by_numpy = field.mean_field(x)
    assert field.direct and field.shifted == (beta == 1000.0)
    assert relative(torch_program(field.mean_field, x), by_numpy) <= 1e-13


def test_the_softmax_mean_transpose_is_the_same_in_torch():
    """model.attention.softmax_mean_adjoint in torch against numpy, on channels with void points (|rho| below
    NEGLIGIBLE_DENSITY of its largest) where |N / Z| > 1 is bounded and where Z <= 0, and ordinary points."""
    rng = torch.Generator().manual_seed(3)
    members, points, d = 2, 40, 3
    N = torch.randn(members, points, d, generator=rng, dtype=torch.float64)
    Z = torch.rand(members, points, generator=rng, dtype=torch.float64) + 0.2
    rho = torch.rand(members, points, generator=rng, dtype=torch.float64) + 0.1
    m_bar = torch.randn(members, points, d, generator=rng, dtype=torch.float64)
    rho[:, :10] = 0.1 * NEGLIGIBLE_DENSITY  # void points, of which some with |m| > 1 and some with Z <= 0
    N[:, :5] *= 10
    Z[:, 5:8] = -Z[:, 5:8]
    Z[:, 8] = 0.0
    by_numpy = softmax_mean_adjoint(N, Z, rho, m_bar)
    by_torch = torch_program(softmax_mean_adjoint, N, Z, rho, m_bar)
    for numpy_value, torch_value in zip(by_numpy, by_torch):
        assert bool(torch.isfinite(numpy_value).all())
        assert relative(torch_value, numpy_value) <= 1e-14


@pytest.mark.parametrize("setup_", [(2, "softmax", 3.0, 16, "spectral"), (3, "softmax", 2.0, 8, "spectral"),
                                    (3, "unnormalized", 1.0, 8, "spectral"), (3, "softmax", 2.0, 8, "dense")])
def test_the_transform_attention_transpose_is_the_same_in_torch(setup_):
    """Transport.vjp on the grid path with the transform attention (its frame transpose, frame_sum over the
    components, and the softmax mean's transpose: numpy on the CPU) in torch, as on CUDA: the state's and the
    drive's cotangents to 1e-13."""
    basis, batch, kernels, state, W = setup(*setup_)
    transport = Transport(basis, batch, kernels, path="grid")
    assert transport.attention_mode == "transform"
    drive = transport.feed_forward(W)
    b = torch.randn(state.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    by_numpy = transport.vjp(state, drive, b)
    by_torch = torch_program(lambda b: transport.vjp(state, drive, b), b)
    for numpy_value, torch_value in zip(by_numpy, by_torch):
        assert relative(torch_value, numpy_value) <= 1e-13


@pytest.mark.parametrize("members", [1, 2, TRANSPOSED_MEMBERS, NUMPY_MEMBERS])
@pytest.mark.parametrize("dim, kernel, beta, lmax, shared", [
    (2, "softmax", 3.0, 16, True), (2, "softmax", "inf", 16, True), (3, "softmax", 2.0, 8, True),
    (3, "unnormalized", 1.0, 8, True), (3, "unnormalized", 1.0, 8, False)])
def test_the_matrix_path_is_the_same_in_each_program(dim, kernel, beta, lmax, shared, members):
    """Transport's matrix path (model.matrix_path) outside autograd on the CPU, in numpy (one member, and from
    NUMPY_MEMBERS on) or in torch (contiguous products, or from TRANSPOSED_MEMBERS on transposed views), against its
    torch program under autograd (as on CUDA): the rate and the velocity, and the transpose's cotangents, to 1e-13;
    and autograd's derivative of the torch program, an independent transpose, equal to the hand-written one (`vjp`)
    to 1e-12.  Members of one model (one operator, read by all members' products at once) and of two alternating
    (an operator per member)."""
    two = member_cases(dim, kernel, beta, lmax, "dense")
    cases = [two[0] if shared else two[member % 2] for member in range(members)]
    basis = make_basis(dim, lmax, CPU64)
    batch = ModelBatch.of([Model.from_case(case, CPU64) for case in cases])
    kernels = MemberKernels(basis, batch.B, [model.beta for model in batch.models], "dense", 1e-10)
    transport = Transport(basis, batch, kernels, path="matrix")
    assert transport.path == "matrix"
    rng = torch.Generator().manual_seed(4)
    state = real_state(torch.stack([initial_density(case["initial"], basis) for case in cases]))
    state += 0.01 * state.abs().max() * torch.randn(state.shape, generator=rng, dtype=torch.float64)
    W = 0.3 * torch.randn(members, dim, dim, generator=rng, dtype=torch.float64)
    drive = transport.feed_forward(W)
    b = torch.randn(state.shape, generator=rng, dtype=torch.float64)
    library, products = transport._folded.products(state, drive)
    assert library is (np if members in (1, NUMPY_MEMBERS) else torch)
    transposed = library is torch and not products.divergence.is_contiguous()
    assert transposed == (members == TRANSPOSED_MEMBERS)
    rate, velocity = transport(state, drive), transport.velocity(state, drive)
    transpose = transport.vjp(state, drive, b)
    assert relative(torch_program(transport, state, drive), rate) <= 1e-13
    for ours, theirs in zip(torch_program(transport.velocity, state, drive), velocity):
        assert relative(ours, theirs) <= 1e-13
    for ours, theirs in zip(torch_program(lambda b: transport.vjp(state, drive, b), b), transpose):
        assert relative(ours, theirs) <= 1e-13
    with torch.enable_grad():
        leaves = state.clone().requires_grad_(True), drive.clone().requires_grad_(True)
        by_autograd = torch.autograd.grad(transport(*leaves), leaves, b)
    for ours, theirs in zip(by_autograd, transpose):
        assert relative(ours, theirs) <= 1e-12


def test_central_differences_step_where_the_controls_are():
    """central_differences_of perturbs the controls on their own device (a CUDA run's controls: here the meta
    device, which holds no values and refuses CPU operands), and on the CPU gives the gradient of a quadratic,
    2 W, to its round-off over h."""
    meta = torch.zeros(2, 3, device="meta", dtype=torch.float64)
    devices = []
    central_differences_of(lambda W: devices.append(W.device) or 0.0, meta)
    assert set(devices) == {torch.device("meta")} and len(devices) == 2 * meta.numel()
    W = torch.tensor([[0.3, -1.2, 0.5], [2.0, 0.1, -0.7]], dtype=torch.float64)
    gradient = central_differences_of(lambda W: float((W * W).sum()), W)
    assert float((gradient - 2 * W).abs().max()) <= 1e-9


@pytest.mark.parametrize("kernel, B", [("unnormalized", ((1.0, 0.0), (0.0, 0.65))),
                                       ("softmax", ((1.0, 0.3), (-0.2, 0.65)))])
def test_the_by_hand_particle_gradient_matches_the_cpu_gradient(kernel, B, accelerator):
    """On the device (the torch program, whole kernels, solver.field = "dense": the direct sums) against the CPU's
    numpy program: without noise (the device's generator draws another sequence) and from the same x_0 (drawn on
    the CPU), J and dJ/dW to 1e-12."""
    def gradients(where):
        cases = [seed_member(seed, kernel, B).with_overrides(["model.eps=0.0", f"solver.device='{where}'"])
                 for seed in (0, 1)]
        forward = ParticleControl(cases)
        assert forward.by_hand
        return forward.gradients(controls_of(2).to(forward.placement.device))

    for device_member, cpu_member in zip(gradients(accelerator), gradients("cpu")):
        assert abs(device_member.cost - cpu_member.cost) <= 1e-12 * abs(cpu_member.cost)
        assert float((device_member.dW.cpu() - cpu_member.dW).norm() / cpu_member.dW.norm()) <= 1e-12


@pytest.mark.parametrize("vectorised, dtype", [(True, np.float64), (False, np.float64), (False, np.float32)],
                         ids=["numpy-float64", "torch-float64", "torch-float32"])
def test_the_in_place_exp_is_exp_either_way(monkeypatch, vectorised, dtype):
    """base.arrays.exp_ takes numpy's exp or torch's over the same memory by the machine (_numpy_exp_vectorised):
    either way exp to 1 ulp of the dtype over the exponents a kernel holds, from its floor to 0 and beyond, in place
    (numpy's float32 exp, which a float32 run took before on any machine, is its own: 2.3 ulp on an AVX2 core)."""
    from spherepde.base import arrays

    monkeypatch.setattr(arrays, "_numpy_exp_vectorised", lambda dt: vectorised)
    exponents = np.linspace(-700.0 if dtype == np.float64 else -85.0, 20.0, 100_001)
    values = exponents.astype(dtype)
    exact = np.exp(values.astype(np.longdouble))
    result = arrays.exp_(values)
    assert result is values
    assert np.max(np.abs(values - exact) / (np.spacing(exact.astype(dtype)))) <= 1.0
