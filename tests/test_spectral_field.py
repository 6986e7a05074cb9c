"""The spectral (Funk-Hecke) exponential-kernel transform against quadrature, exact rotations and the dense field."""

import math

import numpy as np
import pytest
import torch

from solvers.eulerian import run_eulerian
from spherepde.base.device import placement
from spherepde.base.errors import CaseError
from spherepde.discretisation.bases import CircleBasis, SphereBasis
from spherepde.discretisation.rotations import SphereRotation, grid_permutation
from spherepde.discretisation.scattered import (
    CircleEvaluator,
    DegreeRaisedTransform,
    DuccEvaluator,
    TorusNUFFT,
    barycentric_weights,
    harmonics_at,
    stored_coefficients,
)
from spherepde.kernels.choice import make_exp_kernel
from spherepde.kernels.dense import DenseExpKernel, dense_exp_kernel
from spherepde.kernels.funk_hecke import chebyshev_nodes, funk_hecke
from spherepde.kernels.spectral import (
    SPECTRAL_MATRIX_BYTES,
    InterpolatedMode,
    MatrixMode,
    ScaledMode,
    SpectralExpKernel,
)

CPU64 = placement("cpu", "float64")
GENERAL = np.array([[1.0, 0.3, -0.2], [0.1, 0.8, 0.4], [-0.3, 0.2, 1.2]])
GENERAL = GENERAL / np.linalg.svd(GENERAL, compute_uv=False)[0]  # sigma_max = 1, sigma_max / sigma_min = 3.0
ROTATION = np.linalg.qr(np.random.default_rng(1).standard_normal((3, 3)))[0]
ROTATION = ROTATION * np.sign(np.linalg.det(ROTATION))  # det +1
MATRICES = {"sign flips": np.diag([-1.0, -1.0, 1.0]), "rotation": ROTATION, "reflection": -ROTATION,
            "general": GENERAL}


def random_coefficients(basis, seed=0):
    """Random band-limited coefficients of a real field (zero for l < m, real for m = 0)."""
    generator = torch.Generator().manual_seed(seed)
    shape = basis.coefficient_shape(basis.lmax)
    c = torch.view_as_complex(torch.randn(*shape, 2, generator=generator, dtype=torch.float64))
    c.imag[0] = 0
    return c if basis.dim == 2 else c * (basis.degree >= torch.arange(basis.lmax + 1)[:, None])


def smooth_density(basis):
    """A band-limited, positive two-cluster density (vMF-like bumps, contrast ~ e^-6)."""
    x = basis.points.to(torch.float64)
    first = torch.tensor([0.3, 0.5, 0.8][: basis.dim], dtype=torch.float64, device=x.device)
    second = torch.tensor([-0.6, 0.2, -0.3][: basis.dim], dtype=torch.float64, device=x.device)
    rho = torch.exp(3 * x @ (first / first.norm())) + 0.5 * torch.exp(2 * x @ (second / second.norm()))
    return basis.synthesis(basis.analysis(rho.to(basis.placement.real)))


def field_difference(basis, C, beta, tol=1e-10, matrix_bytes=0, spectral_bytes=SPECTRAL_MATRIX_BYTES):
    """max |m_spectral - m_dense| of the attention mean N / Z, and the max relative difference of T_C
    (the dense transform keeping its kernel matrix when it takes at most matrix_bytes, the spectral one its
    MatrixMode for a general C at most spectral_bytes)."""
    rho = smooth_density(basis)
    channels = torch.cat([rho[..., None], rho[..., None] * basis.points], dim=-1)
    C = torch.as_tensor(C, dtype=basis.placement.real, device=basis.placement.device)
    dense, log_dense = DenseExpKernel(basis, C, beta, matrix_bytes=matrix_bytes)(channels)
    spectral, log_spectral = SpectralExpKernel(basis, C, beta, tol, matrix_bytes=spectral_bytes)(channels)
    assert bool((log_dense <= log_spectral * (1 + 10 * torch.finfo(log_dense.dtype).eps)).all())  # the bound
    dense = dense * torch.exp(log_dense - log_spectral)[..., None]  # both on the spectral field's scale
    mean_dense, mean_spectral = dense[..., 1:] / dense[..., :1], spectral[..., 1:] / spectral[..., :1]
    return (float((mean_spectral - mean_dense).abs().max()),
            float((spectral - dense).abs().max() / dense.abs().max()))


# --- Funk-Hecke eigenvalues --------------------------------------------------------------------------


@pytest.mark.parametrize("kappa", [0.3, 30.0, 1000.0])
def test_funk_hecke_eigenvalues_match_quadrature(kappa):
    """mu_l = exp(-kappa) lambda_l: S^2  2 pi int_{-1}^{1} e^{kappa (t - 1)} P_l(t) dt,  \
S^1  int e^{kappa (cos t - 1)} cos(l t) dt."""
    degree = np.arange(40)
    # S^2: Gauss-Legendre in s = 1 - t on [0, 2], graded towards s = 0 where the integrand lives (width 1/kappa).
    x, w = np.polynomial.legendre.leggauss(400)
    s = 2 * ((x + 1) / 2) ** 3
    ds = 2 * 3 * ((x + 1) / 2) ** 2 / 2 * w
    legendre = np.polynomial.legendre.legvander(1 - s, degree[-1])  # (nodes, l)
    sphere = 2 * np.pi * (ds * np.exp(-kappa * s)) @ legendre
    # S^1: the trapezoid rule is spectrally accurate for periodic integrands.
    t = 2 * np.pi * np.arange(4096) / 4096
    circle = (2 * np.pi / 4096) * np.exp(kappa * (np.cos(t) - 1)) @ np.cos(np.outer(t, degree))
    for dim, reference in ((3, sphere), (2, circle)):
        mu = funk_hecke(dim, kappa, degree)
        assert np.abs(mu - reference).max() <= 1e-12 * mu[0]
        assert np.all(np.diff(mu) <= 0) and mu[0] <= (2 if dim == 2 else 4) * np.pi


def test_funk_hecke_at_zero_and_huge_kappa():
    assert np.array_equal(funk_hecke(3, 0.0, np.arange(4)), [4 * np.pi, 0, 0, 0])
    assert np.array_equal(funk_hecke(2, 0.0, np.arange(4)), [2 * np.pi, 0, 0, 0])
    # kappa = 5000: lambda_0 = 4 pi sinh(k)/k overflows by far; mu_0 = 2 pi (1 - e^{-2k}) / k does not.
    assert funk_hecke(3, 5000.0, 0) == pytest.approx(2 * np.pi / 5000, rel=1e-14)


# --- exact maps x -> Q^T x ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rotation", "reflection", "sign flips"])
def test_wigner_rotation_is_exact(name):
    Q = MATRICES[name]
    basis = SphereBasis(20, CPU64)
    c = random_coefficients(basis)
    rotated = SphereRotation(Q, basis.lmax, torch.device("cpu"), torch.float64)(c)
    points = basis.points.reshape(-1, 3)
    expected = basis.evaluate(c, points @ torch.as_tensor(Q))  # g(Q^T x)
    assert float((basis.synthesis(rotated).reshape(-1) - expected).abs().max()) <= 1e-13 * float(expected.abs().max())


def test_grid_permutation_for_sign_flips_only():
    basis = SphereBasis(16, CPU64)
    c = random_coefficients(basis)
    values = basis.synthesis(c).reshape(-1)
    for signs in ([-1, -1, 1], [1, -1, -1], [-1, 1, 1], [-1, -1, -1]):
        Q = np.diag(np.array(signs, dtype=float))
        permutation = grid_permutation(basis, Q)
        expected = basis.evaluate(c, basis.points.reshape(-1, 3) @ torch.as_tensor(Q))
        assert float((values[permutation] - expected).abs().max()) <= 1e-12
    assert grid_permutation(basis, ROTATION) is None


@pytest.mark.parametrize("reflect", [False, True])
def test_circle_rotation_is_exact(reflect):
    a = 0.7
    Q = np.array([[math.cos(a), math.sin(a)], [math.sin(a), -math.cos(a)]]) if reflect else \
        np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    basis = CircleBasis(12, CPU64)
    c = random_coefficients(basis)
    kernel = SpectralExpKernel(basis, torch.as_tensor(Q), 0.0, 1e-10)  # beta = 0: plain integral, no rotation
    assert isinstance(kernel.mode, ScaledMode)
    from spherepde.discretisation.rotations import CircleRotation

    rotated = CircleRotation(Q, basis.lmax, torch.device("cpu"), torch.float64)(c)
    expected = basis.evaluate(c, basis.points @ torch.as_tensor(Q))
    assert float((basis.synthesis(rotated) - expected).abs().max()) <= 1e-13


# --- Chebyshev interpolation and scattered evaluation -------------------------------------------------


def test_chebyshev_node_count_is_the_smallest_meeting_the_tolerance():
    nodes = chebyshev_nodes(3, 100.0, 1 / 3, 1.0, 40, 1e-12)
    r = np.random.default_rng(0).uniform(1 / 3, 1.0, 500)
    degree = np.arange(41)
    exact = funk_hecke(3, 100.0 * r[:, None], degree)

    def error(points):
        interpolated = barycentric_weights(points, r) @ funk_hecke(3, 100.0 * points[:, None], degree)
        return (np.abs(interpolated - exact) / exact[:, :1]).max()

    from spherepde.discretisation.scattered import chebyshev_points

    assert error(nodes) <= 1.5e-12
    assert error(chebyshev_points(len(nodes) - 1, 1 / 3, 1.0)) > 1e-12
    assert 15 <= len(nodes) <= 25  # docs/design.md "Facts measured while planning": ~20 nodes at 1e-11


@pytest.mark.parametrize("evaluator", ["ducc", "torch"])
def test_scattered_evaluation_matches_exact_series(evaluator):
    if evaluator == "ducc":
        pytest.importorskip("ducc0")
    basis = SphereBasis(30, CPU64)
    c = torch.stack([random_coefficients(basis, seed) for seed in range(3)])
    points = np.random.default_rng(2).standard_normal((700, 3))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    points[:2] = [[0, 0, 1], [0, 0, -1]]  # the poles
    if evaluator == "ducc":
        evaluate = DuccEvaluator(basis.lmax, points, 1e-12, torch.float64)
    else:
        evaluate = TorusNUFFT(basis.lmax, points, 1e-12, torch.device("cpu"), torch.float64)
    expected = torch.stack([basis.evaluate(ci, torch.as_tensor(points)) for ci in c], dim=1)
    assert float((evaluate(c) - expected).abs().max()) <= 1e-11 * float(expected.abs().max())


@pytest.mark.parametrize("dim", [2, 3])
def test_harmonics_at_scattered_points_match_the_basis_series(dim):
    """Re(H c) over the stored coefficients (harmonics_at: basis functions times multiplicity) is the basis's own
    series at random points and at the poles."""
    basis = SphereBasis(30, CPU64) if dim == 3 else CircleBasis(20, CPU64)
    c = torch.stack([random_coefficients(basis, seed) for seed in range(3)])
    points = np.random.default_rng(4).standard_normal((500, dim))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    if dim == 3:
        points[:2] = [[0, 0, 1], [0, 0, -1]]
    harmonics, degree = harmonics_at(dim, basis.lmax, points)
    stored = c[:, torch.as_tensor(stored_coefficients(dim, basis.lmax))].numpy()
    assert np.array_equal(degree, basis.degree.numpy()[stored_coefficients(dim, basis.lmax)] if dim == 3
                          else np.arange(basis.lmax + 1))
    expected = torch.stack([basis.evaluate(ci, torch.as_tensor(points)) for ci in c], dim=1).numpy()
    assert np.abs((harmonics @ stored.T).real - expected).max() <= 1e-13 * np.abs(expected).max()


def test_circle_evaluator_matches_exact_series():
    basis = CircleBasis(20, CPU64)
    c = torch.stack([random_coefficients(basis, seed) for seed in range(2)])
    angle = np.random.default_rng(3).uniform(0, 2 * np.pi, 50)
    points = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    values = CircleEvaluator(basis.lmax, points, torch.device("cpu"), torch.float64)(c)
    expected = torch.stack([basis.evaluate(ci, torch.as_tensor(points)) for ci in c], dim=1)
    assert float((values - expected).abs().max()) <= 1e-13 * float(expected.abs().max())


# --- spectral vs dense field --------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MATRICES))
@pytest.mark.parametrize("beta", [1.0, 10.0, 30.0])
@pytest.mark.parametrize("matrix_bytes", [0, 2 ** 30], ids=["row-blocks", "kept-matrix"])
def test_spectral_field_matches_dense_on_the_sphere(name, beta, matrix_bytes, device):
    """lmax 24 >= what the resolution rule asks at beta = 30 (18): the dense quadrature is exact to ~1e-10."""
    basis = SphereBasis(24, placement(device, "float64"))
    mean, transform = field_difference(basis, MATRICES[name], beta, matrix_bytes=matrix_bytes)
    assert mean <= 1e-10 and transform <= 1e-11


@pytest.mark.parametrize("beta", [1.0, 10.0, 30.0])
@pytest.mark.parametrize("spectral_bytes", [0, SPECTRAL_MATRIX_BYTES], ids=["interpolated", "kept-matrix"])
def test_general_spectral_field_of_either_mode_matches_dense(beta, spectral_bytes, device):
    """A general C on S^2 (lmax 24, where the dense quadrature is exact to round-off): the Chebyshev
    interpolation in r (InterpolatedMode, accurate to tol / 100) agrees with the dense quadrature to 1e-11, the
    kept matrix (MatrixMode, the weights at every point's own r: exact) to round-off, 1e-13 (measured
    0.7-3.4e-14; the interpolated mode 0.5-1.1e-12)."""
    basis = SphereBasis(24, placement(device, "float64"))
    kept = MatrixMode.matrix_bytes(basis, DegreeRaisedTransform(basis)) <= spectral_bytes
    assert kept == (spectral_bytes > 0)
    mode = SpectralExpKernel(basis, torch.as_tensor(GENERAL), beta, 1e-10, matrix_bytes=spectral_bytes).mode
    assert isinstance(mode, MatrixMode if kept else InterpolatedMode)
    mean, transform = field_difference(basis, GENERAL, beta, spectral_bytes=spectral_bytes)
    tolerance = (1e-13, 1e-13) if kept else (1e-10, 1e-11)
    assert mean <= tolerance[0] and transform <= tolerance[1]


@pytest.mark.parametrize("name", ["rotation", "general"])
def test_spectral_field_with_the_shtns_backend(name):
    pytest.importorskip("shtns")
    mean, transform = field_difference(SphereBasis(24, CPU64, backend="shtns"), MATRICES[name], 10.0)
    assert mean <= 1e-10 and transform <= 1e-11


@pytest.mark.parametrize("C", [[[0.6, -0.8], [0.8, 0.6]], [[0.6, 0.8], [0.8, -0.6]], [[1.0, 0.3], [0.2, 0.7]]])
@pytest.mark.parametrize("beta", [1.0, 30.0])
@pytest.mark.parametrize("matrix_bytes", [0, 2 ** 30], ids=["row-blocks", "kept-matrix"])
def test_spectral_field_matches_dense_on_the_circle(C, beta, matrix_bytes):
    mean, transform = field_difference(CircleBasis(48, CPU64), np.array(C), beta, matrix_bytes=matrix_bytes)
    assert mean <= 1e-10 and transform <= 1e-11


def test_zero_beta_and_zero_matrix_give_the_plain_integral():
    basis = SphereBasis(12, CPU64)
    rho = smooth_density(basis)[..., None]
    total = float(basis.integrate(rho[..., 0]))
    for C, beta in ((GENERAL, 0.0), (np.zeros((3, 3)), 5.0)):
        scaled, log_scale = SpectralExpKernel(basis, torch.as_tensor(C), beta, 1e-10)(rho)
        assert float((scaled - total).abs().max()) <= 1e-13 * total and float(log_scale.abs().max()) == 0


@pytest.mark.parametrize("spectral_bytes", [0, SPECTRAL_MATRIX_BYTES], ids=["torch-NUFFT", "kept-matrix"])
def test_float32_spectral_field_matches_float64(spectral_bytes):
    """The float32 channels (Z, N) agree with float64 to 16 units of float32 roundoff of their largest
    value, and the ratio N / Z as that error propagates: |d(N/Z)| <= (|dN| + |N/Z| |dZ|) / Z, so
    2 * 16 eps max|channel| / Z(x) with |N/Z| <= 1.  (The ratio's error is largest where Z is smallest:
    Z spans 0.45..13.4 here, so a uniform 1e-5 on the ratio was within 15% of its measured maximum.)"""
    basis64, basis32 = SphereBasis(24, CPU64), SphereBasis(24, placement("cpu", "float32"))
    channels, ratios = [], []
    for basis in (basis64, basis32):
        rho = smooth_density(basis)
        values = torch.cat([rho[..., None], rho[..., None] * basis.points], dim=-1)
        C = torch.as_tensor(GENERAL, dtype=basis.placement.real)
        scaled, log_scale = SpectralExpKernel(basis, C, 10.0, 1e-10, evaluator="torch",
                                              matrix_bytes=spectral_bytes)(values)
        channels.append(scaled.double() * torch.exp(log_scale.double())[..., None])
        ratios.append((scaled[..., 1:] / scaled[..., :1]).double())
    bound = 16 * torch.finfo(torch.float32).eps * float(channels[0].abs().max())
    assert float((channels[0] - channels[1]).abs().max()) <= bound
    assert bool(((ratios[0] - ratios[1]).abs() <= 2 * bound / channels[0][..., :1]).all())


def test_selection_of_the_field():
    sphere = SphereBasis(32, CPU64)
    identity = torch.eye(3, dtype=torch.float64)
    assert make_exp_kernel(sphere, identity, 10.0, "dense", 1e-10).name == "dense"
    assert make_exp_kernel(sphere, identity, 10.0, "spectral", 1e-10).name == "spectral"
    assert make_exp_kernel(sphere, identity, 10.0, "auto", 1e-10).name == "spectral"
    assert make_exp_kernel(sphere, identity, math.inf, "auto", 1e-10).name == "dense"  # never called at beta = inf
    # beta = 0: the dense "quadrature" is one sum over the grid, cheaper than the two transforms.
    zero = make_exp_kernel(sphere, identity, 0.0, "auto", 1e-10)
    assert zero.name == "dense" and zero.cost(4) == 2.0 * 4 * sphere.grid_size
    # S^1 with a general C: Chebyshev nodes times direct sums cost more than the O(N^2) quadrature.
    circle = CircleBasis(16, CPU64)
    assert make_exp_kernel(circle, torch.tensor([[1.0, 0.3], [0.2, 0.7]], dtype=torch.float64), 10.0, "auto",
                           1e-10).name == "dense"
    with pytest.raises(CaseError, match="Chebyshev nodes"):
        SpectralExpKernel(sphere, torch.as_tensor(GENERAL), 10.0, 1e-30, matrix_bytes=0)
    # the kept matrix is exact whatever the tolerance: no nodes to find
    assert isinstance(SpectralExpKernel(sphere, torch.as_tensor(GENERAL), 10.0, 1e-30).mode, MatrixMode)


# --- the solver -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [2, 3])
def test_eulerian_run_spectral_matches_dense(case_factory, dim):
    B = GENERAL if dim == 3 else np.array([[1.0, 0.3], [0.2, 0.7]])
    V = np.diag([-1.0, 1.0, -2.0][:dim])
    results = {}
    for field in ("dense", "spectral"):
        case = case_factory(dim=dim, lmax=12, model={"beta": 4.0, "B": B.tolist(), "V": V.tolist(), "eps": 0.05},
                            time={"t_end": 0.1, "dt": 0.025, "save_every": 0.05},
                            solver={"field": field}, diagnostics={"w2": False, "tail_tol": 1.0})
        results[field] = run_eulerian(case, progress=False)
        assert results[field].attrs["field"] == field
    difference = np.abs(results["spectral"]["density"].values - results["dense"]["density"].values).max()
    assert difference <= 1e-9 * np.abs(results["dense"]["density"].values).max()


def test_resolution_rule_refuses_a_coarse_grid_for_the_spectral_field(case_factory):
    case = case_factory(lmax=32, model={"beta": 1000.0}, solver={"field": "spectral"})
    with pytest.raises(CaseError, match=r"sphere.lmax: 32 is too coarse .* use lmax >= 106"):
        run_eulerian(case, progress=False)


# --- done-criterion 1 at lmax 64 and beta = 1000 (slow) ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rotation", "general"])
@pytest.mark.parametrize("beta, lmax, tolerance", [(1.0, 64, 1e-10), (10.0, 64, 1e-10), (30.0, 64, 1e-10),
                                                   (1000.0, 106, 1e-8)])
def test_spectral_field_matches_dense_at_issue_resolutions(name, beta, lmax, tolerance):
    """lmax 106 is what the resolution rule asks at beta = 1000 (sigma_max(B) = 1, kernel_tol 1e-10)."""
    mean, _ = field_difference(SphereBasis(lmax, CPU64), MATRICES[name], beta)
    assert mean <= tolerance


# --- the checks whose reference is a CPU float64 computation, on a GPU ------------------------------------


def test_float32_spectral_field_on_an_accelerator_matches_float64(accelerator):
    mean, _ = field_difference(SphereBasis(24, placement(accelerator, "float32")), GENERAL, 10.0)
    assert mean <= 1e-4  # both transforms in float32; the dense one against the spectral one


def test_eulerian_run_on_an_accelerator_matches_cpu(case_factory, accelerator):
    results = {}
    for device in ("cpu", accelerator):
        case = case_factory(lmax=24, model={"beta": 10.0, "B": GENERAL.tolist(), "eps": 0.05},
                            time={"t_end": 0.1, "dt": 0.01, "save_every": 0.05},
                            solver={"field": "spectral", "device": device}, diagnostics={"w2": False})
        results[device] = run_eulerian(case, progress=False)["density"].values
    assert np.abs(results[accelerator] - results["cpu"]).max() <= 1e-10 * np.abs(results["cpu"]).max()


def test_dense_kernel_over_scattered_points_does_not_underflow():
    """Few points far from the maximiser of <x, C y> (particles at beta = 2000): the bound
    beta |C^T x| exceeds every logit by hundreds, yet log T_C f must equal an independent
    log-sum-exp, to round-off."""
    generator = torch.Generator().manual_seed(5)
    x = torch.nn.functional.normalize(torch.randn(7, 3, generator=generator, dtype=torch.float64), dim=1)
    y = torch.nn.functional.normalize(torch.randn(5, 3, generator=generator, dtype=torch.float64), dim=1)
    f = torch.rand(5, 1, generator=generator, dtype=torch.float64) + 0.1
    C, beta = torch.diag(torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64)), 2000.0
    scaled, log_scale = dense_exp_kernel(x, y, f, C, beta, chunk=3)
    expected = torch.logsumexp(beta * (x @ C @ y.T) + torch.log(f[:, 0]), dim=1)
    assert float((beta * (x @ C).norm(dim=1) - expected).min()) > 100  # the old shift underflowed here
    assert float((torch.log(scaled[:, 0]) + log_scale - expected).abs().max()) <= 1e-12 * float(expected.abs().max())


def test_dense_kernel_at_beta_1000_where_most_entries_underflow():
    """At beta = 1000 most shifted exponents lie below log(smallest normal) (the CPU's slow path, hence
    kernels.dense.exponent_floor): Z must still equal an independent log-sum-exp and N / Z the softmax mean
    to round-off, in blocks of any size (`solver.chunk` "auto" and 7 rows)."""
    generator = torch.Generator().manual_seed(11)
    points = torch.nn.functional.normalize(torch.randn(600, 3, generator=generator, dtype=torch.float64), dim=1)
    weights = torch.rand(600, generator=generator, dtype=torch.float64) + 0.5
    C, beta = torch.diag(torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64)), 1000.0
    logits = beta * (points @ C @ points.T)
    floor = math.log(torch.finfo(torch.float64).tiny)
    assert float(((logits - logits.amax(1, keepdim=True)) < floor).double().mean()) > 0.5
    channels = torch.cat([weights[:, None], weights[:, None] * points], dim=1)
    expected_log_z = torch.logsumexp(logits + torch.log(weights), dim=1)
    expected_mean = torch.softmax(logits + torch.log(weights), dim=1) @ points
    for chunk in ("auto", 7):
        scaled, log_scale = dense_exp_kernel(points, points, channels, C, beta, chunk)
        log_z = torch.log(scaled[:, 0]) + log_scale
        assert float((log_z - expected_log_z).abs().max()) <= 1e-13 * float(expected_log_z.abs().max())
        assert float((scaled[:, 1:] / scaled[:, :1] - expected_mean).abs().max()) <= 1e-13
