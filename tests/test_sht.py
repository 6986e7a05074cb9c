"""Spherical-harmonic transforms: Gauss grid, Legendre tables, torch backend vs shtns, analytic identities."""

import math

import mpmath
import numpy as np
import pytest
import torch

from spherepde.discretisation.bases import dealiased_circle_points, dealiased_gauss_grid
from spherepde.discretisation.transforms.legendre import gauss_legendre, legendre_tables
from spherepde.discretisation.transforms.legendre_layouts import PACKED_FROM_LMAX, SPARSE_FROM_LMAX
from spherepde.discretisation.transforms.sht_torch import TorchSHT

LMAX, NLAT, NLON = 63, 96, 192


def relative_difference(x: torch.Tensor, reference: torch.Tensor) -> float:
    """max |x - reference| / max |reference| (both moved to CPU complex128 / float64)."""
    x, reference = x.cpu(), reference.cpu()
    if reference.is_complex():
        x = x.to(torch.complex128)
    else:
        x = x.to(torch.float64)
    return ((x - reference).abs().max() / reference.abs().max()).item()


def random_coefficients(*batch: int, lmax: int = LMAX, seed: int = 0) -> torch.Tensor:
    """Random band-limited coefficients [.., m, l]: zero for l < m, real for m = 0."""
    generator = torch.Generator().manual_seed(seed)
    c = torch.view_as_complex(torch.randn(*batch, lmax + 1, lmax + 1, 2, generator=generator, dtype=torch.float64))
    c[..., 0, :] = c[..., 0, :].real
    degree = torch.arange(lmax + 1)
    return c * (degree[None, :] >= degree[:, None])


@pytest.fixture(scope="module")
def shtns_sht():
    pytest.importorskip("shtns")
    from spherepde.discretisation.transforms.sht_shtns import ShtnsSHT

    return ShtnsSHT(LMAX, NLAT, NLON)


@pytest.fixture(scope="module", params=["dense", "packed", "sparse"],
                ids=["dense tables", "packed tables", "sparse tables"])
def torch_sht(request):
    return TorchSHT(LMAX, NLAT, NLON, layout=request.param)


# --- 1. Gauss grid and Legendre tables ---------------------------------------------------------


def test_gauss_nodes_and_weights_match_leggauss_and_shtns():
    x, w = gauss_legendre(NLAT)
    x_ref, w_ref = np.polynomial.legendre.leggauss(NLAT)
    assert np.all(np.diff(x) < 0)  # north to south
    assert np.max(np.abs(x - x_ref[::-1])) <= 1e-15
    # numpy's weights are themselves off by ~1.5e-12 at nlat 96 (ours agree with shtns to 1 ulp).
    assert np.max(np.abs(w / w_ref[::-1] - 1)) <= 1e-11
    assert abs(w.sum() - 2) <= 1e-14
    x2, w2 = gauss_legendre(2)
    assert np.max(np.abs(x2 - [1 / math.sqrt(3), -1 / math.sqrt(3)])) <= 2.3e-16
    assert np.max(np.abs(w2 - 1)) <= 1e-15
    x3, w3 = gauss_legendre(3)
    assert x3[1] == 0.0 and x3[0] == -x3[2] and abs(w3[1] - 8 / 9) <= 2e-16


def test_gauss_grid_is_shtns_grid(shtns_sht):
    x, w = gauss_legendre(NLAT)
    assert np.max(np.abs(shtns_sht.cos_theta.numpy() - x)) <= 1e-16
    assert np.max(np.abs(shtns_sht.weights.numpy() / w - 1)) <= 1e-15
    assert abs(shtns_sht.weights.sum().item() - 2) <= 1e-14


def test_legendre_tables_orthonormal_and_derivatives():
    x, w = gauss_legendre(NLAT)
    P, dP, mP_sin = legendre_tables(LMAX, x)
    gram = 2 * np.pi * np.einsum("mlj,mkj,j->mlk", P, P, w)
    identity = np.zeros_like(gram)
    for m in range(LMAX + 1):
        identity[m, m:, m:] = np.eye(LMAX + 1 - m)
    assert np.max(np.abs(gram - identity)) <= 1e-13
    sin_theta = np.sqrt(1 - x**2)
    assert np.max(np.abs(P[1, 1] + math.sqrt(3 / (8 * math.pi)) * sin_theta)) <= 1e-15  # Condon–Shortley phase
    # sin(theta) dPbar_lm/dtheta = l x Pbar_lm - sqrt((2l+1)(l^2-m^2)/(2l-1)) Pbar_{l-1,m}, a different identity
    # from the ladder formulas used in legendre_tables.
    m = np.arange(LMAX + 1)[:, None, None]
    ell = np.arange(LMAX + 1)[None, :, None]
    P_lower = np.concatenate([np.zeros_like(P[:, :1]), P[:, :-1]], axis=1)
    c = np.sqrt(np.maximum((2 * ell + 1) * (ell**2 - m**2), 0) / np.maximum(2 * ell - 1, 1))
    expected = np.where(ell >= m, ell * x * P - c * P_lower, 0.0)
    assert np.max(np.abs(sin_theta * dP - expected)) <= 1e-12 * np.max(np.abs(expected))
    assert np.max(np.abs(mP_sin * sin_theta - m * P)) <= 1e-12 * np.max(np.abs(m * P))


def _pbar_reference(ell: int, m: int, x: float) -> float:
    """Pbar_lm(x) by the same recurrence in 30-digit arithmetic (no underflow)."""
    mpmath.mp.dps = 30
    x = mpmath.mpf(x)
    s = mpmath.sqrt((1 - x) * (1 + x))
    p = 1 / mpmath.sqrt(4 * mpmath.pi)
    for k in range(1, m + 1):
        p = -mpmath.sqrt(mpmath.mpf(2 * k + 1) / (2 * k)) * s * p
    previous, a_previous = mpmath.mpf(0), mpmath.mpf(1)
    for n in range(m + 1, ell + 1):
        a = mpmath.sqrt(mpmath.mpf(4 * n * n - 1) / (n * n - m * m))
        previous, p, a_previous = p, a * (x * p - previous / a_previous), a
    return float(p)


def test_legendre_tables_high_degree_underflow():
    theta = np.array([1e-3, 0.3, 1.2])
    P, dP, mP_sin = legendre_tables(1000, np.cos(theta))
    assert np.isfinite(P).all() and np.isfinite(dP).all() and np.isfinite(mP_sin).all()
    # sin(0.3)^700 underflows in double, Pbar_{1000,700}(0.3) ~ 4e-207 does not.
    for ell, m in [(1000, 700), (1000, 3), (900, 899)]:
        for j, x in enumerate(np.cos(theta)):
            reference = _pbar_reference(ell, m, x)
            assert abs(P[m, ell, j] - reference) <= 1e-12 * abs(reference) + 1e-300
    assert 1e-210 < P[700, 1000, 1] < 1e-200


# --- 2. torch vs shtns -------------------------------------------------------------------------


def _compare_backends(sht, reference, tolerance):
    c = random_coefficients(2)
    S, T = random_coefficients(2, seed=1), random_coefficients(2, seed=2)
    S[..., 0, 0] = 0
    T[..., 0, 0] = 0
    f = reference.synthesis(c)
    v_theta, v_phi = reference.vector_synthesis(S, T)
    differences = {
        "synthesis": relative_difference(sht.synthesis(c.to(sht.device)), f),
        "analysis": relative_difference(sht.analysis(f.to(sht.device)), reference.analysis(f)),
    }
    for name, x, y in zip(("v_theta", "v_phi"), sht.vector_synthesis(S.to(sht.device), T.to(sht.device)),
                          (v_theta, v_phi)):
        differences["vector_synthesis " + name] = relative_difference(x, y)
    S_ref, T_ref = reference.vector_analysis(v_theta, v_phi)
    for name, x, y in zip("ST", sht.vector_analysis(v_theta.to(sht.device), v_phi.to(sht.device)), (S_ref, T_ref)):
        differences["vector_analysis " + name] = relative_difference(x, y)
    for name, x, y in zip(("v_theta", "v_phi"), sht.gradient(c.to(sht.device)), reference.gradient(c)):
        differences["gradient " + name] = relative_difference(x, y)
    differences["divergence"] = relative_difference(
        sht.divergence(v_theta.to(sht.device), v_phi.to(sht.device)), reference.divergence(v_theta, v_phi)
    )
    worst = max(differences, key=differences.get)
    assert differences[worst] <= tolerance, differences
    return differences


@pytest.mark.parametrize("layout", ["dense", "packed", "sparse"])
def test_torch_float64_matches_shtns(shtns_sht, layout, device):
    if device == "cuda" and layout == "sparse":
        pytest.skip("the sparse layout is the CPU's (legendre_layouts.default_layout)")
    sht = TorchSHT(LMAX, NLAT, NLON, device=torch.device(device), layout=layout)
    assert torch.equal(sht.cos_theta.cpu(), shtns_sht.cos_theta)
    _compare_backends(sht, shtns_sht, 1e-12)


@pytest.mark.parametrize("layout", ["dense", "packed", "sparse"])
def test_torch_float32_matches_shtns(shtns_sht, layout):
    _compare_backends(TorchSHT(LMAX, NLAT, NLON, dtype=torch.float32, layout=layout), shtns_sht, 1e-5)


@pytest.mark.parametrize("layout", ["dense", "packed", "sparse"])
def test_torch_matches_shtns_on_odd_grid(layout):
    pytest.importorskip("shtns")
    from spherepde.discretisation.transforms.sht_shtns import ShtnsSHT

    lmax, nlat, nlon = 20, 33, 41
    reference, sht = ShtnsSHT(lmax, nlat, nlon), TorchSHT(lmax, nlat, nlon, layout=layout)
    assert abs(reference.weights[nlat // 2].item() / sht.weights[nlat // 2].item() - 1) <= 1e-15
    c = random_coefficients(lmax=lmax)
    f = reference.synthesis(c)
    assert relative_difference(sht.synthesis(c), f) <= 1e-13
    assert relative_difference(sht.analysis(f), reference.analysis(f)) <= 1e-13
    v = reference.vector_synthesis(c, 0)
    assert relative_difference(sht.divergence(*v), reference.divergence(*v)) <= 1e-13


def test_shtns_round_trip_and_analysis_of_arbitrary_field(torch_sht, shtns_sht):
    c = random_coefficients(3)
    assert relative_difference(shtns_sht.analysis(shtns_sht.synthesis(c)), c) <= 1e-13
    f = torch.randn(NLAT, NLON, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    # same quadrature, not band-limited
    assert relative_difference(torch_sht.analysis(f), shtns_sht.analysis(f)) <= 1e-12


# --- 3. analytic identities (torch backend alone) ----------------------------------------------


def test_round_trip(torch_sht):
    c = random_coefficients(2, 3)
    assert relative_difference(torch_sht.analysis(torch_sht.synthesis(c)), c) <= 1e-13
    f = torch_sht.synthesis(c)
    quadrature = (torch_sht.weights[:, None] * f**2).sum((-2, -1)) * (2 * math.pi / NLON)
    parseval = (c[..., 0, :].abs() ** 2).sum(-1) + 2 * (c[..., 1:, :].abs() ** 2).sum((-2, -1))
    assert torch.max(torch.abs(quadrature / parseval - 1)).item() <= 1e-13


def test_divergence_of_gradient_is_laplacian(torch_sht):
    c = random_coefficients(2)
    ell = torch.arange(LMAX + 1, dtype=torch.float64)
    expected = -ell * (ell + 1) * c
    assert relative_difference(torch_sht.divergence(*torch_sht.gradient(c)), expected) <= 1e-12
    v_theta, v_phi = torch_sht.vector_synthesis(c, 0)
    assert relative_difference(v_theta, torch_sht.gradient(c)[0]) <= 1e-14


def test_gradient_of_cos_theta(torch_sht):
    c = torch.zeros(LMAX + 1, LMAX + 1, dtype=torch.complex128)
    c[0, 1] = math.sqrt(4 * math.pi / 3)  # cos(theta) = sqrt(4 pi / 3) Y_10
    assert torch.max(torch.abs(torch_sht.synthesis(c) - torch_sht.cos_theta[:, None])).item() <= 1e-15
    v_theta, v_phi = torch_sht.gradient(c)
    assert torch.max(torch.abs(v_theta + torch.sin(torch_sht.theta)[:, None])).item() <= 1e-15
    assert torch.max(torch.abs(v_phi)).item() <= 1e-15


def test_toroidal_convention_is_minus_er_cross_grad(torch_sht):
    c = torch.zeros(LMAX + 1, LMAX + 1, dtype=torch.complex128)
    c[0, 1] = math.sqrt(4 * math.pi / 3)  # T = cos(theta): v = -e_r x grad T = sin(theta) e_phi
    v_theta, v_phi = torch_sht.vector_synthesis(0, c)
    assert torch.max(torch.abs(v_phi - torch.sin(torch_sht.theta)[:, None])).item() <= 1e-15
    assert torch.max(torch.abs(v_theta)).item() <= 1e-15


def test_divergence_has_no_mean(torch_sht):
    generator = torch.Generator().manual_seed(4)
    v_theta, v_phi = torch.randn(2, 3, NLAT, NLON, dtype=torch.float64, generator=generator)
    div = torch_sht.divergence(v_theta, v_phi)
    assert torch.max(torch.abs(div[..., 0, 0])).item() <= 1e-15
    assert torch.max(torch.abs(div)).item() > 1.0


def test_dense_programs_agree():
    """The dense tables' transforms run in numpy on the CPU and in torch under autograd (base.arrays): both give
    the packed tables' (another product) to round-off."""
    generator = torch.Generator().manual_seed(7)
    v_theta, v_phi = torch.randn(2, 4, NLAT, NLON, dtype=torch.float64, generator=generator)
    c = random_coefficients(4)
    packed, dense = TorchSHT(LMAX, NLAT, NLON, layout="packed"), TorchSHT(LMAX, NLAT, NLON, layout="dense")
    cases = [("divergence", (v_theta, v_phi), packed.divergence(v_theta, v_phi)),
             ("gradient_frame", (c,), torch.stack(packed.gradient(c), dim=-3)),
             ("analysis", (v_theta,), packed.analysis(v_theta)),
             ("synthesis", (c,), packed.synthesis(c))]
    for name, arguments, expected in cases:
        transform = getattr(dense, name)
        assert relative_difference(transform(*arguments), expected) <= 1e-14, name
        tracked = transform(arguments[0].clone().requires_grad_(True), *arguments[1:])
        assert tracked.requires_grad and relative_difference(tracked.detach(), expected) <= 1e-14, name


@pytest.mark.parametrize("budget", [3000, 40_000, 2 ** 40], ids=["cut twice", "cut once", "whole"])
def test_blocked_ffts_are_numpy_ffts(monkeypatch, budget):
    """irfft_into and rfft_into cut their work into pieces of at most FFT_BLOCK_BYTES (base.arrays.fft_blocks); in
    the layouts of the transforms (spectrum: order, field, ring, member; grid: member, field, ring, longitude) they
    give numpy.fft's values, every entry written (NaN before), whether cut along one axis, two, or not at all."""
    from spherepde.base import arrays

    monkeypatch.setattr(arrays, "FFT_BLOCK_BYTES", budget)
    rng = np.random.default_rng(3)
    members, fields, rings, points = 7, 5, 9, 20
    spectrum = rng.standard_normal((points // 2 + 1, fields, rings, members)) * (1 + 1j)
    spectrum[0].imag = spectrum[-1].imag = 0.0  # irfft does not read them
    grid = np.full((members, fields, rings, points), np.nan)
    arrays.irfft_into(grid.transpose(3, 1, 2, 0), spectrum, points, 0)
    expected = np.fft.irfft(spectrum, n=points, axis=0, norm="forward").transpose(3, 1, 2, 0)
    assert np.abs(grid - expected).max() <= 1e-13 * np.abs(expected).max()
    back = np.full(spectrum.shape, np.nan, dtype=complex)
    arrays.rfft_into(back.transpose(3, 1, 2, 0), grid, 3)
    assert np.abs(back - np.fft.rfft(grid, axis=3).transpose(3, 1, 2, 0)).max() <= 1e-13 * np.abs(back).max()
    pieces = list(arrays.fft_blocks(grid.transpose(3, 1, 2, 0), spectrum, 0))
    assert all(out.nbytes + data.nbytes <= budget for out, data in pieces) or len(pieces) == 1
    assert sum(out.size for out, _ in pieces) == grid.size


def test_degree_filter_is_analysis_weights_synthesis(torch_sht):
    """The per-order ring operator of a multiplier of the degree (the spectral field's Funk-Hecke weights) equals
    the analysis, the multiplication and the synthesis it replaces, on a field that is not band-limited, and
    reproduces an eigenfunction's own eigenvalue: mu_l Y_lm for Y_lm."""
    mu = np.exp(-0.1 * np.arange(LMAX + 1)) * (1 + 0.5 * np.cos(np.arange(LMAX + 1)))
    operator = torch_sht.degree_filter(mu)
    f = torch.randn(2, 3, NLAT, NLON, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    expected = torch_sht.synthesis(torch_sht.analysis(f) * torch.as_tensor(mu))
    assert relative_difference(torch_sht.filtered(f, operator), expected) <= 1e-13
    c = torch.zeros(LMAX + 1, LMAX + 1, dtype=torch.complex128)
    c[5, 9] = 1.0 + 0.5j
    Y = torch_sht.synthesis(c)
    assert relative_difference(torch_sht.filtered(Y, operator), mu[9] * Y) <= 1e-13


def test_moments_are_the_filtered_channels_of_the_density(torch_sht):
    """rho and the degree filter of (rho, rho x_1, rho x_2, rho x_3) from rho's coefficients (degree LMAX - 1, so
    that rho x_k is exact on the grid) equal the synthesis and `filtered` of the channels formed on the grid."""
    mu = np.exp(-0.1 * np.arange(LMAX + 1)) * (1 + 0.5 * np.cos(np.arange(LMAX + 1)))
    generator = torch.Generator().manual_seed(6)
    c = torch.randn(2, 3, LMAX, LMAX, dtype=torch.complex128, generator=generator)
    c = c * (torch.arange(LMAX)[None, :] >= torch.arange(LMAX)[:, None])
    c[..., 0, :] = c[..., 0, :].real
    padded = torch.nn.functional.pad(c, (0, 1, 0, 1))
    rho = torch_sht.synthesis(padded)
    theta, phi = torch_sht.theta[:, None], torch_sht.phi[None, :]
    y = [torch.ones_like(theta * phi), torch.sin(theta) * torch.cos(phi), torch.sin(theta) * torch.sin(phi),
         torch.cos(theta).expand_as(theta * phi)]
    operator = torch_sht.degree_filter(mu)
    expected = torch.stack([rho] + [torch_sht.filtered(rho * y_k, operator) for y_k in y], dim=-3)
    tables = torch_sht.moment_filter(mu)
    assert relative_difference(torch_sht.moments(c, tables), expected) <= 1e-13
    # The same program in torch (coefficients under autograd; numpy's above): its values, and its transpose by
    # autograd against the map itself, <moments(dc), g> = <J^T g, dc> (the map is linear in c).
    tracked = c.clone().requires_grad_(True)
    values = torch_sht.moments(tracked, tables)
    assert relative_difference(values.detach(), expected) <= 1e-13
    g = torch.randn(values.shape, dtype=torch.float64, generator=generator)
    dc = torch.randn(c.shape, dtype=torch.complex128, generator=generator)
    (c_bar,) = torch.autograd.grad((values * g).sum(), tracked)
    forward, transpose = float((torch_sht.moments(dc, tables) * g).sum()), float((c_bar.conj() * dc).real.sum())
    assert abs(forward - transpose) <= 1e-12 * abs(forward)
    # The written-out transpose, in numpy and in torch (a cotangent under autograd), is autograd's (the imaginary
    # parts of the order-0 coefficients, which a real field does not have, read as zero both ways).
    assert relative_difference(torch_sht.moments_adjoint(g, tables), c_bar) <= 1e-13
    assert relative_difference(torch_sht.moments_adjoint(g.clone().requires_grad_(True), tables).detach(),
                               c_bar) <= 1e-13
    assert float(c_bar[..., 0, :].imag.abs().max()) == 0.0


@pytest.mark.parametrize("signs", [(-1, -1, 1), (1, 1, -1), (-1, -1, -1)])
def test_signed_moments_are_the_moments_at_the_reflected_points(torch_sht, signs):
    """The tables of moment_filter(mu, signs) give the filtered channels at diag(signs) x: turned by pi in longitude
    (a = -1: a roll by half the ring) and reflected in the equator (b = -1: the rings reversed), rho itself
    unchanged; the transpose likewise (the cotangents' grid moved back)."""
    mu = np.exp(-0.1 * np.arange(LMAX + 1))
    generator = torch.Generator().manual_seed(7)
    c = torch.randn(2, LMAX, LMAX, dtype=torch.complex128, generator=generator)
    c = c * (torch.arange(LMAX)[None, :] >= torch.arange(LMAX)[:, None])

    def reflected(fields):
        moved = fields.roll(NLON // 2, -1) if signs[0] < 0 else fields
        return moved.flip(-2) if signs[2] < 0 else moved

    plain, signed = torch_sht.moment_filter(mu), torch_sht.moment_filter(mu, signs)
    expected = torch_sht.moments(c, plain)
    expected[:, 1:] = reflected(expected[:, 1:])
    assert relative_difference(torch_sht.moments(c, signed), expected) <= 1e-14
    g = torch.randn(expected.shape, dtype=torch.float64, generator=generator)
    moved_back = g.clone()
    moved_back[:, 1:] = reflected(g[:, 1:])  # each reflection is its own inverse
    assert relative_difference(torch_sht.moments_adjoint(g, signed), torch_sht.moments_adjoint(moved_back, plain)) \
        <= 1e-14


@pytest.mark.parametrize("signs", [(1, 1, 1), (-1, -1, -1)])
def test_frame_moments_are_the_moments_on_the_frame(torch_sht, signs):
    """frame_moments gives rho, the components of the filtered N = (rho x_1, rho x_2, rho x_3) along e_theta and
    e_phi and the filtered rho (the last left out without `normaliser`), and with `radial` N's component along x,
    equal to `moments` projected on the frame at every point of the grid (plain and reflected tables), in numpy and
    in torch under autograd."""
    mu = np.exp(-0.1 * np.arange(LMAX + 1)) * (1 + 0.5 * np.cos(np.arange(LMAX + 1)))
    generator = torch.Generator().manual_seed(8)
    c = torch.randn(2, LMAX, LMAX, dtype=torch.complex128, generator=generator)
    c = c * (torch.arange(LMAX)[None, :] >= torch.arange(LMAX)[:, None])
    tables = torch_sht.moment_filter(mu, signs)
    fields = torch_sht.moments(c, tables)
    theta, phi = torch_sht.theta[:, None], torch_sht.phi[None, :]
    zero = torch.zeros_like(theta * phi)
    frame = [(torch.cos(theta) * torch.cos(phi), torch.cos(theta) * torch.sin(phi), zero - torch.sin(theta)),
             (zero - torch.sin(phi), zero + torch.cos(phi), zero),
             (torch.sin(theta) * torch.cos(phi), torch.sin(theta) * torch.sin(phi), zero + torch.cos(theta))]
    along = [sum(e_k * fields[:, 2 + k] for k, e_k in enumerate(e)) for e in frame]
    expected = torch.stack([fields[:, 0], along[0], along[1], fields[:, 1]], dim=1)
    assert relative_difference(torch_sht.frame_moments(c, tables), expected) <= 1e-13
    assert relative_difference(torch_sht.frame_moments(c, tables, normaliser=False), expected[:, :3]) <= 1e-13
    assert relative_difference(torch_sht.frame_moments(c, tables, radial=True), along[2][:, None]) <= 1e-13
    tracked = torch_sht.frame_moments(c.clone().requires_grad_(True), tables)
    assert relative_difference(tracked.detach(), expected) <= 1e-13


@pytest.mark.parametrize("signs", [(1, 1, 1), (-1, -1, -1)])
def test_frame_moments_adjoint_is_the_transpose_of_frame_moments(signs):
    """<frame_moments(c), g> = <c, frame_moments_adjoint(g)> for random c (a real field's: real order-0
    coefficients) and cotangents g of the four fields or, without the normaliser, three, and with a fifth g_r the
    transpose of both calls, <x, N> included: <frame_moments(c), g> + <frame_moments(c, radial=True), g_r>; in numpy
    and in torch (a cotangent under autograd), plain and reflected tables (which the layout of the Legendre tables
    does not enter: one grid)."""
    lmax = 24
    torch_sht = TorchSHT(lmax, 40, 80)
    mu = np.exp(-0.1 * np.arange(lmax + 1)) * (1 + 0.5 * np.cos(np.arange(lmax + 1)))
    generator = torch.Generator().manual_seed(9)
    c = torch.randn(2, 3, lmax, lmax, dtype=torch.complex128, generator=generator)
    c = c * (torch.arange(lmax)[None, :] >= torch.arange(lmax)[:, None])
    c[..., 0, :] = c[..., 0, :].real
    tables = torch_sht.moment_filter(mu, signs)
    fields = torch_sht.frame_moments(c, tables)
    outputs = [torch_sht.frame_moments(c, tables, normaliser=False), fields,
               torch.cat([fields, torch_sht.frame_moments(c, tables, radial=True)], dim=-3)]
    for values in outputs:
        g = torch.randn(values.shape, dtype=torch.float64, generator=generator)
        forward = float((values * g).sum())
        for cotangent in (g, g.clone().requires_grad_(True)):
            c_bar = torch_sht.frame_moments_adjoint(cotangent, tables).detach()
            assert c_bar.shape == c.shape and float(c_bar[..., 0, :].imag.abs().max()) == 0.0
            assert abs(forward - float((c_bar.conj() * c).real.sum())) <= 1e-13 * abs(forward)


# --- interface guards --------------------------------------------------------------------------


def test_grid_size_and_dtype_guards():
    with pytest.raises(ValueError, match="nlon"):
        TorchSHT(63, 96, 126)
    with pytest.raises(ValueError, match="nlat"):
        TorchSHT(63, 63, 192)
    with pytest.raises(ValueError, match="dtype"):
        TorchSHT(15, 32, 32, dtype=torch.float16)
    assert TorchSHT(15, 32, 32, layout="packed").table_bytes == 3 * 8 * 2 * 9 * 16 * 8  # [pair, parity, k, northern j]
    # sparse: (S, S^T) with a value and an int32 column index per (m, l >= m, northern j), and row pointers
    values = 16 * 17 // 2 * 16
    assert TorchSHT(15, 32, 32, layout="sparse").table_bytes == 3 * (2 * values * 12 + 4 * (2 * 16 * 16 + 16 * 16 + 2))
    with pytest.raises(ValueError, match="layout"):
        TorchSHT(15, 32, 32, layout="banded")
    sht = TorchSHT(15, 32, 32)
    assert sht.table_bytes == 3 * 16 * 16 * 32 * 8  # dense [m, l, j] below SPARSE_FROM_LMAX
    assert TorchSHT(SPARSE_FROM_LMAX, 74, 160, vector=False).layout == "sparse"
    assert TorchSHT(PACKED_FROM_LMAX, 98, 200, vector=False, layout="packed").table_bytes < 98 * 65 ** 2 * 8 / 3
    with pytest.raises(ValueError, match="shape"):
        sht.synthesis(torch.zeros(15, 16, dtype=torch.complex128))


@pytest.mark.parametrize("layout", ["dense", "packed", "sparse"])
def test_the_scalar_transforms_alone_are_those_of_the_full_set(layout):
    """vector=False makes the scalar table by legendre_values alone (not legendre_tables' three): the same
    analysis and synthesis bit for bit, and no vector tables."""
    lmax, nlat, nlon = 24, 40, 80
    full, scalar = (TorchSHT(lmax, nlat, nlon, vector=vector, layout=layout) for vector in (True, False))
    f = torch.as_tensor(np.random.default_rng(3).standard_normal((2, nlat, nlon)))
    c = full.analysis(f)
    assert torch.equal(scalar.analysis(f), c) and torch.equal(scalar.synthesis(c), full.synthesis(c))
    assert scalar._dP is None and scalar._mP_sin is None and 3 * scalar.table_bytes == full.table_bytes


def prime_factors(n: int) -> set:
    return {p for p in range(2, n + 1) if n % p == 0 and all(p % q for q in range(2, p))}


@pytest.mark.parametrize("lmax", [1, 16, 31, 63, 64, 128, 200, 255, 256, 511])
def test_dealiased_grids_are_the_smallest_with_a_fast_fft(lmax):
    """nlat >= 3 (lmax + 1) / 2 (even); nlon >= 2 nlat, a multiple of 4, primes <= 5 only, and no smaller
    such number; circle points >= 3 lmax + 1, even, primes <= 5, the smallest."""
    nlat, nlon = dealiased_gauss_grid(lmax)
    assert nlat % 2 == 0 and 2 * nlat >= 3 * (lmax + 1) > 2 * (nlat - 2)
    assert nlon >= 2 * nlat and nlon % 4 == 0 and prime_factors(nlon) <= {2, 3, 5}
    assert not any(prime_factors(n) <= {2, 3, 5} for n in range(2 * nlat + (-2 * nlat) % 4, nlon, 4))
    n = dealiased_circle_points(lmax)
    assert n >= 3 * lmax + 1 and n % 2 == 0 and prime_factors(n) <= {2, 3, 5}
    assert not any(prime_factors(m) <= {2, 3, 5} for m in range(3 * lmax + 1 + (3 * lmax + 1) % 2, n, 2))


def test_shtns_guards():
    pytest.importorskip("shtns")
    from spherepde.discretisation.transforms.sht_shtns import ShtnsSHT

    with pytest.raises(ValueError, match="nlat >= 32"):
        ShtnsSHT(15, 24, 32)
    with pytest.raises(ValueError, match="nlon"):
        ShtnsSHT(15, 32, 30)
    sht = ShtnsSHT(15, 32, 32)
    with pytest.raises(ValueError, match="float64"):
        sht.analysis(torch.zeros(32, 32, dtype=torch.float32))
    with pytest.raises(ValueError, match="float64"):
        ShtnsSHT(15, 32, 32, dtype=torch.float32)


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_products_over_runs_skip_only_zeros(library):
    """base.arrays.matmul_runs_into: the batched product of triangular tables (order m zero below degree m, as the
    dense Legendre tables) over the runs of leading_zero_runs equals the full product to round-off, the rows it
    skips set to zero, for the zero columns (synthesis) and the zero rows (analysis) alike."""
    from spherepde.base.arrays import CPU_RUNS, leading_zero_runs, matmul_runs_into

    generator = torch.Generator().manual_seed(3)
    orders, rings, columns = 9, 7, 4
    table = torch.randn(orders, orders, rings, generator=generator, dtype=torch.float64)  # [m, l, j]
    for m in range(orders):
        table[m, :m] = 0
    runs = leading_zero_runs(table, 1)
    assert len(runs) == CPU_RUNS and [start for start, _, _ in runs][0] == 0 and runs[-1][1] == orders
    assert all(first == start for start, _, first in runs)  # the smallest order of a run sets its first degree
    synthesis = table.permute(0, 2, 1)  # [m, j, l], zero columns
    coefficients = torch.randn(orders, orders, columns, generator=generator, dtype=torch.float64)
    spectra = torch.randn(orders, rings, columns, generator=generator, dtype=torch.float64)
    convert = (lambda t: t.numpy()) if library == "numpy" else (lambda t: t)
    fields = convert(torch.full((orders, rings, columns), float("nan"), dtype=torch.float64))
    matmul_runs_into(fields, convert(synthesis), convert(coefficients), leading_zero_runs(synthesis, 2), 2)
    sums = convert(torch.full((orders, orders, columns), float("nan"), dtype=torch.float64))
    matmul_runs_into(sums, convert(table), convert(spectra), runs, 1)
    np.testing.assert_allclose(np.asarray(fields), (synthesis @ coefficients).numpy(), rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(np.asarray(sums), (table @ spectra).numpy(), rtol=1e-14, atol=1e-14)
