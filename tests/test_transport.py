"""The transport term (spherepde/model/transport.py): the rate against the model's ambient formula, its paths and
attention modes against each other, and its hand-written transpose against torch autograd."""

import copy

import numpy as np
import pytest
import torch

from solvers.forward_problem import ForwardProblem
from solvers.timegrid import Plan, TimeGrid
from spherepde.base.device import placement
from spherepde.base.real_view import complex_state, real_state
from spherepde.discretisation.bases import make_basis
from spherepde.discretisation.timesteppers import SCHEMES
from spherepde.io.case import case_from_dict
from spherepde.kernels.choice import MemberKernels
from spherepde.model.attention import Model, ModelBatch, attention, velocity
from spherepde.model.dense_operator import truncated_svd
from spherepde.model.initial import initial_density
from spherepde.model.transport import Transport

CPU64 = placement("cpu", "float64")

# (dim, kernel, beta, lmax, field): the attention modes and both paths on S^1 and S^2
SETUPS = [(2, "unnormalized", 1.0, 16, "dense"), (2, "softmax", 3.0, 16, "dense"), (2, "softmax", 3.0, 16, "spectral"),
          (2, "unnormalized", 0.0, 16, "dense"), (2, "softmax", "inf", 16, "dense"), (3, "softmax", 2.0, 8, "dense"),
          (3, "unnormalized", 1.0, 8, "spectral"), (3, "softmax", 2.0, 8, "spectral")]


def member_cases(dim, kernel, beta, lmax, field):
    """Two members: the seed's A = diag(1, 0.65(, 0.4)) as B = V, and another V and B, with different starts."""
    diagonal = [1.0, 0.65, 0.4][:dim]
    A = [[diagonal[i] * (i == j) for j in range(dim)] for i in range(dim)]
    other = [[0.5 * (i == j) + 0.1 * (i != j) for j in range(dim)] for i in range(dim)]
    cases = []
    for B, V, mean in ((A, A, [1.0, 0.2, 0.1]), (other, other, [0.3, 1.0, -0.2])):
        cases.append(case_from_dict({
            "sphere": {"dim": dim, "lmax": lmax},
            "model": {"kernel": kernel, "beta": beta, "B": B, "V": V, "eps": 0.05},
            "initial": {"kind": "vmf", "mean": mean[:dim], "kappa": 2.0}, "time": {"t_end": 1.0, "dt": 0.1},
            "solver": {"device": "cpu", "field": field}}))
    return cases


def setup(dim, kernel, beta, lmax, field):
    cases = member_cases(dim, kernel, beta, lmax, field)
    basis = make_basis(dim, lmax, CPU64)
    batch = ModelBatch.of([Model.from_case(case, CPU64) for case in cases])
    kernels = MemberKernels(basis, batch.B, [m.beta for m in batch.models], field, 1e-10)
    state = real_state(torch.stack([initial_density(case["initial"], basis) for case in cases]))
    W = 0.3 * torch.randn(2, dim, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return basis, batch, kernels, state, W


def relative(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("setup_", SETUPS)
def test_rate_is_minus_the_divergence_of_rho_v(setup_):
    """The frame-component rate, on whichever path and attention mode, against -div(rho v) computed from the
    model's ambient velocity P_x(W x + V m[rho]) (spherepde.model.attention) and the basis's ambient divergence."""
    basis, batch, kernels, state, W = setup(*setup_)
    transport = Transport(basis, batch, kernels)
    rate = transport(state, transport.feed_forward(W))
    points = basis.points.reshape(-1, basis.dim)
    rho = basis.synthesis(complex_state(state, transport.coefficient_shape)).reshape(2, -1)
    v = velocity(batch, points, attention(batch, kernels, points, rho)[0], W)
    reference = -basis.divergence((rho[..., None] * v).reshape((2,) + basis.grid_shape + (basis.dim,)))
    assert relative(rate, real_state(reference)) < 1e-13


def forced_paths(basis, batch, kernels):
    """Every path this setup has, forced: {path: Transport}."""
    transports = {}
    for path in ("matrix", "fourier", "grid"):
        try:
            transport = Transport(basis, batch, kernels, path=path)
        except ValueError:
            continue
        if transport.path == path:
            transports[path] = transport
    return transports


@pytest.mark.parametrize("setup_", SETUPS)
def test_paths_agree(setup_):
    """Forcing each path (the grid path's basis transforms, the matrix path's dense matrices, the fourier path's
    FFTs with the low-rank attention) gives the same rate."""
    basis, batch, kernels, state, W = setup(*setup_)
    transports = forced_paths(basis, batch, kernels)
    assert "grid" in transports
    if setup_[0] == 2 and setup_[1] == "unnormalized":
        assert "fourier" in transports
    grid = transports["grid"]
    for transport in transports.values():
        assert relative(transport(state, transport.feed_forward(W)), grid(state, grid.feed_forward(W))) < 1e-13


@pytest.mark.parametrize("setup_", SETUPS)
def test_vjp_is_the_transpose_of_the_derivative(setup_):
    """On every path, the hand-written cotangents of the state and of W (from `vjp` and from the tokens of
    `rate_token`) equal torch autograd's through the grid path."""
    basis, batch, kernels, state, W = setup(*setup_)
    reference = Transport(basis, batch, kernels, path="grid")
    b = torch.randn(state.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    leaf_state, leaf_W = state.clone().requires_grad_(True), W.clone().requires_grad_(True)
    expected_state, expected_W = torch.autograd.grad(reference(leaf_state, reference.feed_forward(leaf_W)),
                                                     (leaf_state, leaf_W), b)
    for transport in forced_paths(basis, batch, kernels).values():
        drive = transport.feed_forward(W)
        rate, token = transport.rate_token(state, drive)
        assert relative(rate, transport(state, drive)) == 0
        for state_bar, drive_bar in (transport.vjp(state, drive, b), transport.vjp_token(token, drive, b)):
            assert relative(state_bar, expected_state) < 1e-12, transport.path
            assert relative(transport.feed_forward_adjoint(drive_bar), expected_W) < 1e-12, transport.path


def test_the_seed_case_runs_the_fourier_path_with_a_low_rank_operator():
    """S^1, A = diag(1, 0.65), lmax 64: the kernel's numerical rank is far below the 200 points; its truncated SVD
    reproduces the full operator's attention to round-off.  On the CPU the fourier path's numpy program is the
    cheapest from one member on (benchmarks/ensembles.py --paths)."""
    basis, batch, kernels, state, W = setup(2, "unnormalized", 1.0, 64, "dense")
    transport = Transport(basis, batch, kernels)
    assert (transport.attention_mode, transport.path, transport.namespace) == ("operator", "fourier", np)
    operator = transport._operator
    assert operator.left is not None and operator.left.shape[-1] < 60
    rho = basis.synthesis(complex_state(state, transport.coefficient_shape)).reshape(2, -1)
    full = torch.matmul(rho[:, None, :], operator.matrix)[:, 0]
    assert relative(operator._product(rho), full) < 1e-14


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_truncated_svd_keeps_the_low_rank_at_the_dtypes_round_off(dtype):
    """The seed operator (S^1, A = diag(1, 0.65), lmax 64): in float64 and in float32 the factors reproduce the
    matrix to a few units of that dtype's round-off, at a rank far below the 200 points (a float32 SVD alone keeps
    197 of them: its small singular values are its own round-off)."""
    basis, batch, kernels, state, W = setup(2, "unnormalized", 1.0, 64, "dense")
    matrix = Transport(basis, batch, kernels)._operator.matrix.to(dtype)
    left, right = truncated_svd(matrix)
    assert left.dtype == right.dtype == dtype
    assert left.shape[-1] < (40 if dtype == torch.float64 else 25)
    error = float((left.double() @ right.double() - matrix.double()).norm() / matrix.double().norm())
    assert error < 20 * torch.finfo(dtype).eps


def fourier_against_grid(transport, grid, state, W):
    """The fourier path's rate and transpose against the grid path's rate and torch autograd through it."""
    assert relative(transport(state, transport.feed_forward(W)), grid(state, grid.feed_forward(W))) < 1e-13
    b = torch.randn(state.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    leaf_state, leaf_W = state.clone().requires_grad_(True), W.clone().requires_grad_(True)
    expected_state, expected_W = torch.autograd.grad(grid(leaf_state, grid.feed_forward(leaf_W)), (leaf_state, leaf_W),
                                                     b)
    state_bar, drive_bar = transport.vjp(state, transport.feed_forward(W), b)
    assert relative(state_bar, expected_state) < 1e-12
    assert relative(transport.feed_forward_adjoint(drive_bar), expected_W) < 1e-12


def test_the_fourier_path_with_one_operator_for_the_batch():
    """Members sharing one model (one folded operator, the factors broadcast over the batch), seed 004's case at
    lmax 64: the fourier path's rate and its transpose against the grid path and torch autograd through it, and
    the low rank (the kernel's smoothness) that makes it pay."""
    cases = member_cases(2, "unnormalized", 1.0, 64, "dense")
    basis = make_basis(2, 64, CPU64)
    batch = ModelBatch.of([Model.from_case(cases[0], CPU64)] * 3)
    kernels = MemberKernels(basis, batch.B, [m.beta for m in batch.models], "dense", 1e-10)
    state = real_state(torch.stack([initial_density(case["initial"], basis) for case in cases + cases[:1]]))
    W = 0.3 * torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fourier, grid = (Transport(basis, batch, kernels, path=path) for path in ("fourier", "grid"))
    assert fourier._folded.R.shape[0] == 1 and fourier._folded.rank < 40
    fourier_against_grid(fourier, grid, state, W)


@pytest.mark.parametrize("beta, lmax, level", [(1.0, 128, 32), (5.0, 64, 32), (20.0, 128, 64), (20.0, 64, 64)])
def test_the_fourier_path_factors_come_from_the_coarsest_resolving_basis(beta, lmax, level):
    """Two members with their own models: the factors from the first of lmax 16, 32, ... that resolves the folded
    attention (the kernel's degree grows with beta, not with the grid), lifted to the case's grid, give the grid
    path's rate and autograd's transpose; at beta = 20 and lmax 64 no coarser basis resolves it and the case's own
    operator is factorized."""
    basis, batch, kernels, state, W = setup(2, "unnormalized", beta, lmax, "dense")
    transport = Transport(basis, batch, kernels)
    assert (transport.path, transport._folded.level, transport._folded.R.shape[0]) == ("fourier", level, 2)
    fourier_against_grid(transport, Transport(basis, batch, kernels, path="grid"), state, W)


def test_a_coarse_basis_resolves_the_attention_of_every_member_on_its_own_scale():
    """`resolved` at lmax 32 on seed 004's folded operator (beta 1: resolved) and on a second member 1e-12 times
    smaller whose top degree carries 1e-3 of it: that member is not resolved, though its content is 1e-15 of the
    batch's largest entry."""
    from spherepde.model.dense_operator import attention_operator
    from spherepde.model.fourier_path import folded_attention, resolved

    basis, batch, kernels, state, W = setup(2, "unnormalized", 1.0, 32, "dense")
    folded = folded_attention(basis, attention_operator(basis, batch, kernels))[:1]
    assert resolved(folded, 32)
    small = 1e-12 * folded.clone()
    small[..., -2] = 1e-3 * small.abs().max()
    assert not resolved(small, 32) and not resolved(torch.cat([folded, small]), 32)


def test_the_fourier_path_beyond_the_operators_memory(monkeypatch):
    """A grid whose N x N operator is not kept (here: as if beyond OPERATOR_BYTES) still takes the fourier path, its
    factors from a coarse basis: seed 004's eps = 1e-4 case at lmax 1344 (4050 points) steps in 0.5 ms on it, 370-380 ms
    on the grid path that recomputes the kernel at every stage (benchmarks/ensembles.py --paths)."""
    import spherepde.model.transport as transport_module

    basis, batch, kernels, state, W = setup(2, "unnormalized", 1.0, 128, "dense")
    grid = Transport(basis, batch, kernels, path="grid")
    monkeypatch.setattr(transport_module, "attention_operator", lambda *arguments: None)
    transport = Transport(basis, batch, kernels)
    assert (transport.attention_mode, transport.path, transport._operator) == ("operator", "fourier", None)
    assert transport._folded.level == 32
    fourier_against_grid(transport, grid, state, W)


@pytest.mark.parametrize("setup_", SETUPS[:2])
def test_selected_members_are_the_batch_rows(setup_):
    """Transport.select (members leaving a batch: trainings that stop) on every path: the rate and the transpose of
    the members [1, 0] are the batch's rows in that order."""
    basis, batch, kernels, state, W = setup(*setup_)
    b = torch.randn(state.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    order = [1, 0]
    for transport in forced_paths(basis, batch, kernels).values():
        chosen = transport.select(order)
        drive, chosen_drive = transport.feed_forward(W), chosen.feed_forward(W[order])
        assert relative(chosen(state[order], chosen_drive), transport(state, drive)[order]) == 0, transport.path
        state_bar = transport.vjp(state, drive, b)[0]
        assert relative(chosen.vjp(state[order], chosen_drive, b[order])[0], state_bar[order]) < 1e-15


@pytest.mark.parametrize("kernel", ["softmax", "unnormalized"])
def test_the_spectral_field_from_the_coefficients_is_the_grid_route(kernel):
    """On S^2 with B = s I (two scales: two transforms) and a reflection (a permutation of the grid), the spectral
    field gives rho and its channels' transforms from the coefficients (MemberKernels.density_fields): the rate
    equals the one from the channels formed on the grid and transformed there, and the transpose is unchanged."""
    V = [[0.7, 0.2, 0.0], [0.0, 1.0, 0.1], [0.3, 0.0, 0.5]]
    basis, transport, state, W = grid_path_members(kernel, [V] * 3, [[1, 0, 0], [0, -1, 0], [0, 0, 1]])
    assert transport._from_density
    on_grid = copy.copy(transport)
    on_grid._from_density = False
    drive = transport.feed_forward(W)
    assert relative(transport(state, drive), on_grid(state, drive)) <= 1e-13
    b = torch.randn(state.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for ours, theirs in zip(transport.vjp(state, drive, b), on_grid.vjp(state, drive, b)):
        assert relative(ours, theirs) <= 1e-13


def grid_path_members(kernel: str, Vs: list, reflection: list):
    """(basis, the grid-path transport of three S^2 members with the spectral field, their state, W (3, 3, 3)): the
    members' V `Vs`, B = I at beta 2 and 1 (two transforms) and B = `reflection` (a permutation of the grid)."""
    identity = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    cases = [case_from_dict({
        "sphere": {"dim": 3, "lmax": 12},
        "model": {"kernel": kernel, "beta": beta, "B": B, "V": V, "eps": 0.05},
        "initial": {"kind": "vmf", "mean": mean, "kappa": 2.0}, "time": {"t_end": 1.0, "dt": 0.1},
        "solver": {"device": "cpu", "field": "spectral"}})
        for beta, B, V, mean in zip((2.0, 1.0, 1.5), (identity, identity, reflection), Vs,
                                    ([1.0, 0.2, 0.1], [0.3, 1.0, -0.2], [0.0, -0.4, 1.0]))]
    basis = make_basis(3, 12, CPU64)
    batch = ModelBatch.of([Model.from_case(case, CPU64) for case in cases])
    kernels = MemberKernels(basis, batch.B, [m.beta for m in batch.models], "spectral", 1e-10)
    state = real_state(torch.stack([initial_density(case["initial"], basis) for case in cases]))
    W = 0.3 * torch.randn(3, 3, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    return basis, Transport(basis, batch, kernels, path="grid"), state, W


def frame_route(kernel: str = "softmax"):
    """(basis, the transport of three members with V_m = a_m I on the frame route, a copy on the channels' route,
    their state, a drive): B = s I (two transforms) and a reflection in the tables."""
    scales = (1.0, 0.5, -0.7)
    Vs = [[[a * (i == j) for j in range(3)] for i in range(3)] for a in scales]
    basis, transport, state, W = grid_path_members(kernel, Vs, [[1, 0, 0], [0, 1, 0], [0, 0, -1]])
    assert transport._frame_scale.tolist() == list(scales)
    channels = copy.copy(transport)
    channels._frame_scale = None
    return basis, transport, channels, state, transport.feed_forward(W)


def signed_density(basis, offset: float) -> torch.Tensor:
    """The state of offset + z + x / 2 (degree 1; negative where z + x / 2 < -offset) for each of three members."""
    x, _, z = basis.points.unbind(-1)
    return real_state(basis.analysis(offset + z + 0.5 * x)[None]).expand(3, -1).contiguous()


def test_the_frame_route_is_the_channels_route(monkeypatch):
    """Where every V_m = a_m I (softmax, spectral field on S^2), the rate takes rho, Z and N's components along the
    frame from the coefficients (Transport._frame_velocity): the rate and the velocity equal those of the channels'
    route (`_softmax_components`) to round-off, with B = s I (two transforms) and a reflection in the tables.  With
    the void threshold raised over a density of both signs (Z <= 0 and |m| > 1 at some void and some other points)
    the bounded m takes |N| from the frame and the radial component: the same velocity, its NaNs and zeros."""
    import spherepde.model.transport as transport_module

    basis, transport, channels, state, drive = frame_route()
    assert relative(transport(state, drive), channels(state, drive)) <= 1e-13
    assert relative(transport.velocity(state, drive)[1], channels.velocity(state, drive)[1]) <= 1e-13
    signed = signed_density(basis, 0.1)
    monkeypatch.setattr(transport_module, "NEGLIGIBLE_DENSITY", 0.3)
    rho, v = transport.velocity(signed, drive)
    expected = channels.velocity(signed, drive)[1]
    void = rho.abs() <= 0.3 * rho.abs().amax(-1, keepdim=True)
    assert bool(void.any()) and bool((~void).any()) and bool(expected.isnan().any())
    assert bool(((expected - drive).abs() > 0).any())
    torch.testing.assert_close(v, expected, rtol=1e-13, atol=1e-13 * float(expected.nan_to_num().abs().max()),
                               equal_nan=True)


def test_the_unnormalized_frame_route_and_its_transpose_are_the_channels_routes():
    """With the unnormalized kernel and every V_m = a_m I, u_k = a_m <e_k, N> from N's frame components (Z unused):
    the rate, the velocity and the cotangents of `vjp` equal the channels' route's to round-off."""
    _, transport, channels, state, drive = frame_route("unnormalized")
    assert relative(transport(state, drive), channels(state, drive)) <= 1e-13
    assert relative(transport.velocity(state, drive)[1], channels.velocity(state, drive)[1]) <= 1e-13
    b = torch.randn(state.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for ours, theirs in zip(transport.vjp(state, drive, b), channels.vjp(state, drive, b)):
        assert relative(ours, theirs) <= 1e-13


def test_the_frame_routes_transpose_is_the_channels_routes(monkeypatch):
    """On the frame route `vjp` goes back through it (Transport._frame_velocity_adjoint, TorchSHT.
    frame_moments_adjoint): the cotangents of the state and of the drive equal the channels' route's (its
    moments_adjoint) to round-off.  With the void threshold raised over a density of both signs whose Z is positive
    off the void (finite cotangents), m is bounded at void points with |m| > 1, where N_bar has a radial component:
    the same cotangents, which differ from those of the frame's two components alone."""
    import spherepde.model.attention as attention_module
    import spherepde.model.transport as transport_module

    basis, transport, channels, state, drive = frame_route()
    b = torch.randn(state.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for ours, theirs in zip(transport.vjp(state, drive, b), channels.vjp(state, drive, b)):
        assert relative(ours, theirs) <= 1e-13
    signed = signed_density(basis, 0.6)
    for module in (transport_module, attention_module):
        monkeypatch.setattr(module, "NEGLIGIBLE_DENSITY", 0.5)
    rho, v, (Z, along, radial) = transport._frame_velocity(signed, drive, kept=True)
    void = rho.abs() <= 0.5 * rho.abs().amax(-1, keepdim=True)
    length = torch.from_numpy(((along * along).sum(1) + radial * radial) ** 0.5 / Z)
    assert bool((void & (length > 1)).any()) and bool((~void).any()) and bool(v.isfinite().all())
    expected = channels.vjp(signed, drive, b)
    for ours, theirs in zip(transport.vjp(signed, drive, b), expected):
        assert relative(ours, theirs) <= 1e-13
    transport._frame_velocity = lambda *arguments, kept: (rho, v, (Z, along, None))  # the radial component left out
    assert relative(transport.vjp(signed, drive, b)[0], expected[0]) > 1e-3


def test_softmax_components_are_those_of_the_softmax_mean():
    """Transport._softmax_components (u from the channels, m never formed) against model.softmax_mean and the
    frame components of its m, on channels with Z <= 0 and |m| > 1 both inside and outside the void (|rho| below
    NEGLIGIBLE_DENSITY of its maximum): the same values to round-off, the same NaNs and zeros."""
    from spherepde.model.attention import softmax_mean

    basis, batch, kernels, state, W = setup(3, "softmax", 2.0, 8, "dense")
    transport = Transport(basis, batch, kernels, path="grid")
    generator = torch.Generator().manual_seed(4)
    points = basis.grid_size
    N = torch.randn(2, 3, points, generator=generator, dtype=torch.float64)
    Z = torch.rand(2, points, generator=generator, dtype=torch.float64) * 2 - 0.2  # |m| > 1 and Z <= 0 at some points
    rho = torch.rand(2, points, generator=generator, dtype=torch.float64)
    rho[:, ::3] *= 1e-12  # a void at every third point
    expected = transport._frame_components(softmax_mean(N.transpose(1, 2), Z, rho))
    u = transport._softmax_components(N, Z, rho)
    assert torch.equal(torch.isnan(u), torch.isnan(expected)) and bool(torch.isnan(u).any())
    finite = ~torch.isnan(expected)
    assert bool((expected[finite] == 0).any()) and torch.equal(u[finite] == 0, expected[finite] == 0)
    assert relative(u[finite], expected[finite]) < 1e-14


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_numpy_and_the_torch_program_take_the_same_step(scheme, dtype):
    """The fourier path's step and its transpose (ForwardProblem.step, step_adjoint: RungeKutta over the path's
    rate and vjp, one program over numpy and torch) run as numpy arrays (Transport.namespace on the CPU) and as
    torch tensors, forced both ways: the same state, cotangent and drive cotangent to round-off, for one member
    and for two with their own operators and steps."""
    cases = member_cases(2, "unnormalized", 1.0, 32, "dense")
    for case in cases:
        case["time"]["scheme"] = scheme
        case["solver"]["dtype"] = dtype
    tolerance = 1e-14 if dtype == "float64" else 1e-6
    for members, dt in (([cases[0]], [0.1]), (cases, [0.1, 0.05])):
        problem = ForwardProblem(members)
        transport = Transport(problem.basis, problem.batch, problem.kernels, path="fourier")
        assert transport.namespace is np
        problem.transport = transport
        factors = problem.factors(Plan(TimeGrid(1.0, 0.1).intervals[0], np.full(len(dt), 1), np.array(dt)))
        drive = transport.feed_forward(problem.placement.tensor([[[0.3, -0.2], [0.1, 0.4]]] * len(dt)))
        state = problem.initial()
        b = torch.randn(state.shape, generator=torch.Generator().manual_seed(2), dtype=state.dtype)
        results = {}
        for xp in (np, torch):
            transport.namespace = xp
            kept = []
            end = problem.step(state, drive, factors, kept)
            assert torch.equal(problem.step(state, drive, factors), end)
            results[xp] = (end,) + problem.step_adjoint(b, kept[0], drive, factors)
        for numpy_value, torch_value in zip(results[np], results[torch]):
            assert isinstance(numpy_value, torch.Tensor) and numpy_value.dtype == state.dtype
            assert relative(numpy_value, torch_value) < tolerance


def transport_estimates(problem) -> dict:
    """Transport.cost of `problem`'s batch with the dense and with the spectral field, every member alike."""
    basis, batch = problem.basis, problem.batch
    return {name: Transport(basis, batch, MemberKernels(basis, batch.B, [model.beta for model in batch.models], name,
                                                        1e-10)).cost for name in ("dense", "spectral")}


@pytest.mark.parametrize("kernel, lmax, field, path, batch_field", [
    ("unnormalized", 8, "dense", "matrix", "dense"), ("softmax", 8, "spectral", "grid", "dense"),
    ("softmax", 10, "spectral", "grid", "spectral"), ("softmax", 16, "spectral", "grid", "spectral")])
def test_auto_field_is_the_dense_one_where_the_transport_folds_it_more_cheaply(kernel, lmax, field, path, batch_field):
    """convergence-s2 (general B): its transform alone is cheaper spectral at every lmax (make_exp_kernel), but with
    the unnormalized kernel at lmax 8 the dense field lets the transport fold the attention into the matrix path,
    estimated cheaper for one member than the spectral field's grid path (measured 1.15 against 1.7 ms a step);
    the softmax kernel's matrix path reads more rows, and from lmax 8 on its reading costs more than the spectral
    grid path (measured at lmax 10: 3.5 against 2.7 ms; at 8 within 6%, 2.6 against 2.4); at lmax 16 the operator
    no longer fits.  The pick is each member's own: a batch of four picks what one member does, though at lmax 8
    with the softmax kernel the batch's own estimates favour the dense field (its matrices read once for four)."""
    import spherepde
    from spherepde.kernels.choice import make_exp_kernel

    overrides = [f"sphere.lmax={lmax}", f"model.kernel='{kernel}'"]
    serial = ForwardProblem(spherepde.load_case("cases/convergence-s2.toml", overrides))
    model = serial.batch.models[0]
    assert make_exp_kernel(serial.basis, model.B, model.beta, "auto", 1e-10).name == "spectral"
    assert (serial.kernels.name, serial.transport.path) == (field, path)
    estimates = transport_estimates(serial)
    assert min(estimates, key=estimates.get) == field
    batch = ForwardProblem([spherepde.load_case("cases/convergence-s2.toml", overrides + [f"particles.seed={seed}"])
                            for seed in range(4)])
    assert (batch.kernels.name, batch.transport.path) == (field, path)
    batch_estimates = transport_estimates(batch)
    assert min(batch_estimates, key=batch_estimates.get) == batch_field
