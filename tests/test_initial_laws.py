"""Initial laws.  The lmax a vMF law or a mixture needs (Funk-Hecke) against the grid's own spectral tail.  The
projected Gaussian: the closed-form density against quadrature of its radial
integral, normalisation on the solver grids, the exact sampler's moments, and the case keys.  A density
read from an earlier output: re-expanded exactly from the file's own grid."""

import itertools
import math

import numpy as np
import pytest
import torch
import xarray as xr
from conftest import make_case
from scipy.integrate import quad

from spherepde.base.device import placement
from spherepde.base.errors import CaseError
from spherepde.discretisation.bases import make_basis
from spherepde.io.case import load_case_text
from spherepde.model.initial import (
    RECURSION_SWITCH,
    density_from_file,
    initial_density,
    projected_gaussian_density,
    scaled_radial_moment,
    vmf_density,
    vmf_lmax,
)
from spherepde.model.sampling import DensityFileSampler, initial_particles, projected_gaussian

CPU64 = placement("cpu", "float64")


def spd(dim, seed, scale):
    """A fixed random symmetric positive definite matrix."""
    a = np.random.default_rng(seed).normal(size=(dim, dim))
    return scale * (a @ a.T / dim + 0.3 * np.eye(dim))


def radial_quadrature(u, mean, covariance):
    """rho(u) = int_0^inf r^{d-1} phi_S(r u - m) dr by adaptive quadrature around the peak of the integrand."""
    dim = len(u)
    precision = np.linalg.inv(covariance)
    a, b, c = u @ precision @ u, u @ precision @ mean, mean @ precision @ mean
    log_constant = -dim / 2 * math.log(2 * math.pi) - np.linalg.slogdet(covariance)[1] / 2
    peak = (b + math.sqrt(b * b + 4 * a * (dim - 1))) / (2 * a)  # maximiser of r^{d-1} exp(-a r^2/2 + b r)
    width = 1 / math.sqrt(a)
    log_peak = (dim - 1) * math.log(peak) - a * peak ** 2 / 2 + b * peak - c / 2

    def integrand(r):
        return r ** (dim - 1) * math.exp(log_constant - a * r * r / 2 + b * r - c / 2 - log_peak)

    pieces = [0.0, max(peak - 10 * width, 0.0), peak, peak + 10 * width, peak + 60 * width]
    total = sum(quad(integrand, lo, hi, epsabs=0, epsrel=1e-13, limit=200)[0]
                for lo, hi in itertools.pairwise(pieces) if hi > lo)
    return total * math.exp(log_peak), b / math.sqrt(a)


LAWS = {
    "circle": ([0.3, -0.2], [[0.5, 0.1], [0.1, 0.3]]),
    "sphere": ([2.0, 1.0, -0.5], spd(3, 1, 0.5).tolist()),
    "concentrated": ([5.0, 0.0, 0.0], (0.05 * np.eye(3)).tolist()),
    "S^4": ((3 * np.random.default_rng(2).normal(size=5)).tolist(), spd(5, 3, 1.0).tolist()),
    "S^4 concentrated": ([0.0, 0.0, 4.0, 0.0, 3.0], (0.1 * np.eye(5)).tolist()),
}


@pytest.mark.parametrize("law", LAWS)
def test_closed_form_agrees_with_quadrature_of_the_radial_integral(law):
    mean, covariance = LAWS[law]
    dim = len(mean)
    direction = np.asarray(mean) / np.linalg.norm(mean)
    others = np.random.default_rng(4).normal(size=(6, dim))
    u = np.concatenate([direction[None], -direction[None], others / np.linalg.norm(others, axis=1, keepdims=True)])
    closed = projected_gaussian_density(torch.from_numpy(u), mean, covariance).numpy()
    reference, tau = np.array([radial_quadrature(x, np.asarray(mean), np.asarray(covariance)) for x in u]).T
    assert np.all(np.abs(closed / reference - 1) <= 1e-10), closed / reference - 1
    assert tau.max() > 0
    if law.endswith("concentrated"):  # the far side needs the continued fraction
        assert tau.min() < RECURSION_SWITCH and reference.min() > 1e-200


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_scaled_radial_moment_against_quadrature(n):
    """K~_n(tau) = exp(-max(tau, 0)^2 / 2) int_0^inf s^n exp(-s^2/2 + tau s) ds on both sides of RECURSION_SWITCH, n = 0
    included (it returned K~_1 there: 1 against sqrt(pi / 2) at tau = 0)."""
    taus = np.array([-12.0, RECURSION_SWITCH - 0.5, -1.0, 0.0, 0.8, 6.0])
    got = scaled_radial_moment(n, torch.as_tensor(taus)).numpy()
    for tau, value in zip(taus, got):
        peak = max(tau, 0.0)  # the integrand, scaled by exp(-peak^2 / 2), peaks near s = peak
        exact = sum(quad(lambda s: s ** n * math.exp(-s * s / 2 + tau * s - peak * peak / 2), lo, hi, epsabs=0,
                         epsrel=1e-13, limit=200)[0] for lo, hi in ((0.0, peak), (peak, peak + 40.0)) if hi > lo)
        assert value == pytest.approx(exact, rel=1e-11, abs=0), (n, tau)
    if n == 0:
        assert got[3] == pytest.approx(math.sqrt(math.pi / 2), rel=1e-15)


@pytest.mark.parametrize("dim", [2, 3, 4, 5, 8])
def test_standard_gaussian_projects_to_the_uniform_density(dim):
    u = torch.randn(20, dim, generator=torch.Generator().manual_seed(dim), dtype=torch.float64)
    u /= torch.linalg.vector_norm(u, dim=1, keepdim=True)
    rho = projected_gaussian_density(u, [0.0] * dim, np.eye(dim))
    area = 2 * math.pi ** (dim / 2) / math.gamma(dim / 2)
    assert torch.allclose(rho * area, torch.ones(20, dtype=torch.float64), rtol=2e-15, atol=0)


GRID_LAWS = [([0.6, -0.3], [[0.4, 0.1], [0.1, 0.2]]),
             ([0.3, 0.2, 0.5], (0.5 * np.eye(3)).tolist()),
             ([1.0, -0.5, 0.8], [[0.4, 0.1, 0.0], [0.1, 0.3, 0.05], [0.0, 0.05, 0.2]]),
             ([0.0, 0.0, 0.0], [[1.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 0.25]])]


@pytest.mark.parametrize("mean, covariance", GRID_LAWS)
def test_density_integrates_to_one_on_the_solver_grids(mean, covariance):
    """Grid quadrature of the density, and the mass of the Eulerian initial coefficients."""
    dim = len(mean)
    basis = make_basis(dim, 64, CPU64)
    rho = projected_gaussian_density(basis.points, mean, covariance)
    assert abs(float(basis.integrate(rho)) - 1) <= 1e-12
    case = make_case(dim, 64, initial={"kind": "projected_gaussian", "mean": mean, "covariance": covariance})
    coefficients = initial_density(case["initial"], basis)
    assert abs(float(basis.integrate(basis.synthesis(coefficients))) - 1) <= 1e-12
    assert float(basis.spectral_tail(coefficients)) <= 1e-10  # resolved: diagnostics.tail_tol is 1e-6


def quadrature_moments(dim, mean, covariance):
    """int (u, u u^T) rho(u) dsigma(u) on a fine grid."""
    basis = make_basis(dim, 96, CPU64)
    points = basis.points.reshape(-1, dim).numpy()
    masses = (projected_gaussian_density(basis.points, mean, covariance) * basis.weights).reshape(-1).numpy()
    return masses @ np.concatenate([points, (points[:, :, None] * points[:, None, :]).reshape(len(points), -1)], 1)


@pytest.mark.parametrize("mean, covariance", GRID_LAWS[::2] + [([0.0, 1.5], [[0.1, 0.0], [0.0, 2.0]])])
def test_sampler_moments_agree_with_the_density(mean, covariance):
    """Mean of u and of u u^T over 1e5 exact draws within 4 Monte Carlo standard errors of quadrature."""
    dim = len(mean)
    section = {"kind": "projected_gaussian", "mean": mean, "covariance": covariance}
    x = initial_particles(section, dim, 100_000, torch.Generator().manual_seed(11)).numpy()
    assert np.abs(np.linalg.norm(x, axis=1) - 1).max() <= 1e-15
    features = np.concatenate([x, (x[:, :, None] * x[:, None, :]).reshape(len(x), -1)], axis=1)
    error = features.std(0) / math.sqrt(len(x))
    exact = quadrature_moments(dim, mean, covariance)
    assert np.all(np.abs(features.mean(0) - exact) <= 4 * error + 1e-12), (features.mean(0) - exact) / error


def test_sampler_is_reproducible_and_redraws_the_origin(monkeypatch):
    first, second = (projected_gaussian(500, [0.2, 0.1, 0.0], spd(3, 5, 0.3), torch.Generator().manual_seed(2))
                     for _ in range(2))
    assert torch.equal(first, second)
    real, draws = torch.randn, []

    def randn(*shape, **kwargs):  # the first draw puts row 1 exactly on -mean = 0
        g = real(*shape, **kwargs)
        if not draws:
            g[1] = 0
        draws.append(g.shape[0])
        return g

    monkeypatch.setattr(torch, "randn", randn)
    x = projected_gaussian(3, [0.0, 0.0], [[1.0, 0.0], [0.0, 1.0]], torch.Generator().manual_seed(0))
    assert draws == [3, 1]
    assert torch.allclose(torch.linalg.vector_norm(x, dim=1), torch.ones(3, dtype=torch.float64))


CASE = "[sphere]\ndim = 3\n[time]\nt_end = 1.0\n[initial]\nkind = 'projected_gaussian'\n"


def test_case_keys_resolve_and_round_trip():
    case = load_case_text(CASE + "mean = [0, 0, 0]\ncovariance = 2\n")
    assert case["initial"] == {"kind": "projected_gaussian", "mean": [0.0, 0.0, 0.0],
                               "covariance": [[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0]]}
    case = load_case_text(CASE + "mean = [3, 0, 4]\ncovariance = [[1, 0.5, 0], [0.5, 1, 0], [0, 0, 0.1]]\n")
    assert case["initial"]["mean"] == [3.0, 0.0, 4.0]  # a mean, not a direction: kept as given
    assert load_case_text(case.text).data == case.data


@pytest.mark.parametrize("keys, key, fragment", [
    ("mean = [0, 0, 1]\ncovariance = [[1, 0.1, 0], [0, 1, 0], [0, 0, 1]]", "initial.covariance", "symmetric"),
    ("mean = [0, 0, 1]\ncovariance = [[1, 2, 0], [2, 1, 0], [0, 0, 1]]", "initial.covariance", "positive definite"),
    ("mean = [0, 0, 1]\ncovariance = [[1, 0], [0, 1]]", "initial.covariance", "3 x 3"),
    ("mean = [0, 0, 1]\ncovariance = 0", "initial.covariance", "> 0"),
    ("mean = [0, 0, 1]\ncovariance = 'I'", "initial.covariance", "real s > 0"),
    ("mean = [0, 0, 1]", "initial.covariance", "missing"),
    ("mean = [0, 1]\ncovariance = 1", "initial.mean", "length 3"),
    ("mean = [0, 0, 1]\ncovariance = 1\nkappa = 2", "initial.kappa", "'vmf'"),
])
def test_bad_keys_are_one_line_errors_naming_the_key(keys, key, fragment):
    with pytest.raises(CaseError) as error:
        load_case_text(CASE + keys + "\n")
    message = str(error.value)
    assert "\n" not in message and f"{key}:" in message and fragment in message, message


def test_covariance_belongs_to_the_projected_gaussian_only():
    with pytest.raises(CaseError, match=r"initial\.covariance: not used when initial.kind = 'vmf'"):
        load_case_text(CASE.replace("projected_gaussian", "vmf") + "mean = [0, 0, 1]\nkappa = 1\ncovariance = 1\n")


@pytest.mark.parametrize("dim, lmax, grid_shape", [(3, 16, (26, 52)), (3, 16, (30, 45)), (2, 16, (51,))])
def test_density_saved_on_another_grid_is_read_back_exactly(tmp_path, dim, lmax, grid_shape):
    """A band-limited density saved on a grid other than today's default (e.g. nlon = 2 nlat, the layout
    before fast-FFT longitudes, or an odd circle) is analysed on its own grid: the coefficients come back
    to round-off, also re-expanded to a larger lmax; a grid too coarse for the file's lmax is a CaseError."""
    saved = make_basis(dim, lmax, CPU64, grid_shape=grid_shape)
    assert saved.grid_shape != make_basis(dim, lmax, CPU64).grid_shape
    x = saved.points
    unnormalised = torch.exp(2 * x[..., 0] - x[..., 1])
    rho = saved.analysis(unnormalised / saved.integrate(unnormalised))  # a file's density must have mass 1
    values = saved.synthesis(rho).numpy()
    dims = ("time", "theta") if dim == 2 else ("time", "lat", "lon")
    path = tmp_path / "saved.nc"
    xr.Dataset({"density": (dims, values[None])}, attrs={"lmax": lmax}).to_netcdf(path)
    for target in (lmax, lmax + 8):
        read = density_from_file(str(path), 0, make_basis(dim, target, CPU64))
        assert float((read - saved.resize(rho, target)).abs().max()) <= 1e-13 * float(rho.abs().max())
    coarse = tmp_path / "coarse.nc"
    xr.Dataset({"density": (dims, values[None])}, attrs={"lmax": 2 * lmax}).to_netcdf(coarse)
    with pytest.raises(CaseError, match=f"cannot hold lmax {2 * lmax}"):
        density_from_file(str(coarse), 0, make_basis(dim, lmax, CPU64))
    with pytest.raises(CaseError, match=f"cannot hold lmax {2 * lmax}"):
        DensityFileSampler(str(coarse), 0, dim)


@pytest.mark.parametrize("dim, section, tail_tol", [
    (2, {"kind": "vmf", "mean": [0.6, 0.8], "kappa": 50.0}, 1e-6),
    (2, {"kind": "vmf", "mean": [1.0, 0.0], "kappa": 3000.0}, 1e-6),
    (3, {"kind": "vmf", "mean": [0.0, 0.6, 0.8], "kappa": 40.0}, 1e-6),
    (3, {"kind": "vmf", "mean": [0.0, 0.0, 1.0], "kappa": 10.0}, 1e-10),
    (2, {"kind": "vmf_mixture", "means": [[1.0, 0.0], [0.0, 1.0]], "kappas": [20.0, 60.0], "weights": [0.5, 0.5]},
     1e-6),
    (3, {"kind": "vmf_mixture", "means": [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.6, 0.8]],
         "kappas": [20.0, 60.0, 60.0], "weights": [0.2, 0.4, 0.4]}, 1e-6),
])
def test_the_lmax_named_for_a_vmf_law_is_the_first_whose_grid_tail_is_within_the_tolerance(dim, section, tail_tol):
    """vmf_lmax from the Funk-Hecke weights alone: on the grid of the lmax it names, the analysed rho_0's spectral
    tail is <= tail_tol; one degree less, it is above (exact for one law; the mixture's bound is as tight here)."""
    lmax = vmf_lmax(section, dim, tail_tol)
    tails = [float(basis.spectral_tail(initial_density(section, basis)))
             for basis in (make_basis(dim, lmax - 1, CPU64), make_basis(dim, lmax, CPU64))]
    assert tails[1] <= tail_tol < tails[0]


@pytest.mark.parametrize("lmax, kappa, tail_tol", [(8, 300.0, 1e-6), (16, 3000.0, 1e-6), (8, 300.0, 1e-9)])
def test_a_refused_vmf_law_names_the_lmax_that_carries_it(tmp_path, capsys, lmax, kappa, tail_tol):
    """The refusal, whether for the quadrature mass (kappa 3000 at lmax 16) or the tail, names vmf_lmax at the
    case's diagnostics.tail_tol, and the run there starts within it."""
    from spherepde.cli import main

    needed = vmf_lmax({"kind": "vmf", "kappa": kappa}, 2, tail_tol)
    args = ["run", "cases/kuramoto-s1.toml", "--quiet"] + [
        item for override in ("time.t_end=0.1", f"initial.kappa={kappa}", f"diagnostics.tail_tol={tail_tol}")
        for item in ("--set", override)]
    assert main(args + ["--set", f"sphere.lmax={lmax}", "-o", str(tmp_path / "refused.nc")]) == 2
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and f"use sphere.lmax >= {needed} " in message
    output = tmp_path / "named.nc"
    assert main(args + ["--set", f"sphere.lmax={needed}", "-o", str(output)]) == 0
    with xr.open_dataset(output) as result:
        assert float(result.spectral_tail[0]) <= tail_tol


@pytest.mark.parametrize("dim, kappa", [(2, 1e308), (2, 2.0 ** 63), (2, 3e7), (3, 1e308), (3, 1e-308),
                                        (3, 5e-324)])
def test_a_vmf_law_of_extreme_kappa_is_a_one_line_error_or_runs(tmp_path, capsys, dim, kappa):
    """A kappa beyond any grid (1e308: no degree up to 2**16 carries it) was a ValueError traceback from the lmax
    the refusal names, and 3e7 named sphere.lmax >= 41424, beyond the key's range; a subnormal kappa on S^2 was
    log(0) in the normaliser (`math domain error`): a nearly uniform law, which runs."""
    from spherepde.cli import main

    case, mean = ("cases/kuramoto-s1.toml", "[1.0, 0.0]") if dim == 2 else ("cases/kuramoto-s2.toml", "[1.0, 0.0, 0.0]")
    args = ["run", case, "--quiet", "-o", str(tmp_path / "out.nc")] + [
        item for override in ("sphere.lmax=8", "time.t_end=0.1", "time.save_every=0.1", 'initial.kind="vmf"',
                              f"initial.mean={mean}", f"initial.kappa={kappa!r}")
        for item in ("--set", override)]
    status = main(args)
    message = capsys.readouterr().err.strip()
    if kappa > 1:
        assert status == 2 and "\n" not in message
        assert "no sphere.lmax (at most 32767) resolves it: lower initial.kappa" in message
        assert not (tmp_path / "out.nc").exists()
    else:
        assert status == 0, message
        with xr.open_dataset(tmp_path / "out.nc") as result:
            assert abs(float(result.mass[0]) - 1) < 1e-12


@pytest.mark.parametrize("kappa", [1e-300, 1e-17, 1e-12, 1e-8, 1e-4])
def test_a_nearly_uniform_vmf_law_on_the_sphere_has_mass_one(kappa):
    """On S^2, C_3(kappa) e^kappa = kappa / (4 pi sinh kappa) e^kappa = (1 + kappa + kappa^2 / 3 + O(kappa^3)) / (4 pi)
    as kappa -> 0: the density at the mean direction, and the grid mass, to round-off.  The normaliser taken from
    log1p(-exp(-2 kappa)) was 2.2e-5 off at kappa = 1e-12 and a ValueError below 6e-17."""
    basis = make_basis(3, 16, CPU64)
    section = {"kind": "vmf", "mean": [0.0, 0.6, 0.8], "kappa": kappa}
    expected = (1 + kappa + kappa * kappa / 3) / (4 * math.pi)
    assert abs(float(vmf_density(torch.tensor([0.0, 0.6, 0.8], dtype=torch.float64), section["mean"], kappa))
               / expected - 1) <= 1e-14
    coefficients = initial_density(section, basis)
    assert abs(float(basis.integrate(basis.synthesis(coefficients))) - 1) <= 1e-13
