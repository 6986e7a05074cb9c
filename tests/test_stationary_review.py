"""Review of stationary states and of the linear stability of the uniform state beyond the Kuramoto closed forms,
against independent numpy computations (no package helper computes a reference here).

Gradient flows (unnormalized kernel, B = V = A symmetric, beta = 1, W = 0): a stationary density solves
rho = exp(U[rho] / eps) / Z, U(x) = int exp(<x, A y>) rho(y) dsigma(y), found by a damped fixed point on a fine
quadrature grid; the run's free_energy, eps int rho log rho - 1/2 int int exp(<x, A y>) drho drho, must fall at every
save to that state's.

Linear stability of rho_0 = 1 / |S^{d-1}| for B = b I, V = v I, W = 0 (kappa = beta b).  By Funk-Hecke the kernel
acts on a degree-l harmonic by k_l(kappa) = 2 pi I_l(kappa) (S^1), 4 pi i_l(kappa) (S^2).  m[rho_0] is parallel
to x, so v[rho_0] = 0, and for a perturbation s, P_x int exp(kappa <x, y>) y s(y) dsigma = grad (K s) / kappa, so
    unnormalized:  v[s] = (v / kappa) grad K s,
    softmax:       v[s] = (v / kappa) grad K s / Z_0,   Z_0 = rho_0 k_0(kappa)   (the Z perturbation is along x),
and d_t s = eps Lap s - rho_0 div v[s] grows on degree l (Lap = -l (l + d - 2)) at
    sigma_l = l (l + d - 2) (v rho_0 k_l / kappa - eps)           (unnormalized)
    sigma_l = l (l + d - 2) (v k_l / (kappa k_0) - eps)           (softmax),
degree 1 turning unstable at eps_c = v I_1(kappa) / kappa (S^1), v i_1(kappa) / kappa (S^2: 1 / e at kappa = v = 1),
and for the softmax v I_1 / (kappa I_0), v (coth kappa - 1 / kappa) / kappa.
"""

import math

import numpy as np
import pytest
import xarray as xr
from numpy.polynomial.legendre import leggauss
from scipy.special import eval_legendre, iv, spherical_in

import spherepde

AMPLITUDE = 1e-6
AXIS = np.array([0.3, -0.5, 0.8]) / math.sqrt(0.98)  # a generic axis: the zonal harmonic P_l(<x, AXIS>)
PHASE = 0.7  # and cos(l (theta - PHASE)) on S^1


def matrix(M) -> str:
    return "[" + ", ".join("[" + ", ".join(repr(float(e)) for e in row) + "]" for row in np.asarray(M)) + "]"


def case_text(dim, lmax, kernel, beta, B, V, eps, initial, t_end, dt, save_every) -> str:
    return f"""[case]
name = "stationary-review"
description = "review"
[sphere]
dim = {dim}
lmax = {lmax}
[model]
kernel = "{kernel}"
beta = {beta!r}
B = {matrix(B)}
V = {matrix(V)}
eps = {eps!r}
[initial]
{initial}
[time]
t_end = {t_end!r}
dt = {dt!r}
save_every = {save_every!r}
"""


def run(text, tmp_path):
    return spherepde.run(spherepde.load_case_text(text, base_dir=tmp_path), progress=False)


def grid_points(dataset) -> np.ndarray:
    if "theta" in dataset.coords:
        theta = dataset["theta"].values
        return np.stack([np.cos(theta), np.sin(theta)], -1)
    lat, lon = np.meshgrid(np.deg2rad(dataset["lat"].values), np.deg2rad(dataset["lon"].values), indexing="ij")
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], -1)


def harmonic(points: np.ndarray, degree: int) -> np.ndarray:
    if points.shape[-1] == 2:
        return np.cos(degree * (np.arctan2(points[..., 1], points[..., 0]) - PHASE))
    return eval_legendre(degree, points @ AXIS)


def predicted_rate(dim, kernel, kappa, v, eps, degree) -> float:
    """sigma_l of the module docstring."""
    k = (lambda j: 2 * math.pi * iv(j, kappa)) if dim == 2 else (lambda j: 4 * math.pi * spherical_in(j, kappa))
    gain = v * k(degree) / kappa * (1 / (2 * math.pi if dim == 2 else 4 * math.pi) if kernel == "unnormalized"
                                    else 1 / k(0))
    return degree * (degree + dim - 2) * (gain - eps)


def measured_rates(tmp_path, dim, lmax, kernel, beta, b, v, eps, degree, t_end=0.5, dt=0.01, save_every=0.25):
    """Growth rates of the degree-l amplitude between saves of a run from rho_0 + AMPLITUDE Y_l, the start given as
    an initial file on the run's own grid."""
    model = (kernel, beta, b * np.eye(dim), v * np.eye(dim), eps)
    grid = run(case_text(dim, lmax, *model, 'kind = "uniform"', dt, dt, dt), tmp_path)
    Y = harmonic(grid_points(grid), degree)
    density = 1 / (2 * math.pi if dim == 2 else 4 * math.pi) + AMPLITUDE * Y
    xr.Dataset({"density": (("time",) + grid["density"].dims[1:], density[None])},
               attrs={"lmax": lmax}).to_netcdf(tmp_path / "start.nc")
    result = run(case_text(dim, lmax, *model, 'kind = "file"\npath = "start.nc"\ntime = 0', t_end, dt, save_every),
                 tmp_path)
    amplitude = (result["density"].values * Y * result["cell_area"].values).reshape(result.sizes["time"], -1).sum(1)
    return np.diff(np.log(np.abs(amplitude))) / np.diff(result["time"].values)


@pytest.mark.parametrize("kernel, beta, b, v, eps", [("unnormalized", 3.0, 1.0, 1.0, 0.3),
                                                     ("softmax", 3.0, 1.0, 1.0, 0.1),
                                                     pytest.param("unnormalized", 1.0, -2.0, 1.0, 0.1,
                                                                  marks=pytest.mark.slow),
                                                     pytest.param("softmax", 2.0, 1.5, -1.0, 0.1,
                                                                  marks=pytest.mark.slow)])
def test_uniform_state_modes_grow_at_the_funk_hecke_rates_on_s1(tmp_path, kernel, beta, b, v, eps):
    """S^1, uniform + 1e-6 cos(l (theta - 0.7)), l = 1..4: rates of both signs (unnormalized kappa = 3, eps = 0.3:
    1.0178, 1.7936, 0.1793, -3.0629) within 1e-8 of sigma_l (measured: 5e-11 to 3e-9)."""
    for degree in range(1, 5):
        rates = measured_rates(tmp_path, 2, 32, kernel, beta, b, v, eps, degree)
        assert rates == pytest.approx(predicted_rate(2, kernel, beta * b, v, eps, degree), abs=1e-8)


@pytest.mark.parametrize("kernel, eps", [("unnormalized", math.exp(-1)),
                                         pytest.param("softmax", 1 / math.tanh(1) - 1, marks=pytest.mark.slow)])
def test_degree_one_is_neutral_at_the_noise_threshold_on_s2(tmp_path, kernel, eps):
    """S^2, B = V = I, beta = 1: degree 1 neither grows nor decays at eps_c = i_1(1) = 1 / e (unnormalized),
    coth 1 - 1 (softmax), while degree 2 decays at 6 (v i_2(1) / kappa (/ i_0(1)) - eps)."""
    assert predicted_rate(3, kernel, 1.0, 1.0, eps, 1) == pytest.approx(0, abs=1e-15)
    assert measured_rates(tmp_path, 3, 8, kernel, 1.0, 1.0, 1.0, eps, 1, t_end=0.5, dt=0.05) == pytest.approx(
        0, abs=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("kernel, eps", [("unnormalized", 0.2), ("softmax", 0.05)])
def test_uniform_state_modes_grow_at_the_funk_hecke_rates_on_s2(tmp_path, kernel, eps):
    """S^2, kappa = 3, uniform + 1e-6 P_l(<x, n>): l = 1, 3 within 1e-8 of sigma_l; the even degrees carry the
    quadratic term (P_l^2 has a degree-l part), a relative shift 6.7 times the amplitude at l = 2, hence 2e-5."""
    for degree in range(1, 5):
        rates = measured_rates(tmp_path, 3, 16, kernel, 3.0, 1.0, 1.0, eps, degree)
        expected = predicted_rate(3, kernel, 3.0, 1.0, eps, degree)
        assert rates == pytest.approx(expected, abs=1e-8 if degree % 2 else 2e-5 * abs(expected))


def circle_gibbs(A, eps, points=1024):
    """The polar fixed point rho = exp(U[rho] / eps) / Z on the uniform S^1 grid (trapezoid: spectral)."""
    theta = 2 * math.pi * np.arange(points) / points
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    return x, gibbs_fixed_point(np.exp(x @ A @ x.T), np.full(points, 2 * math.pi / points), x, eps)


def sphere_gibbs(A, eps, nlat=32):
    """The same on S^2, a Gauss-Legendre (nodes in z) x uniform (longitude) product grid."""
    z, wz = leggauss(nlat)
    lon = 2 * math.pi * np.arange(2 * nlat) / (2 * nlat)
    Z, L = np.meshgrid(z, lon, indexing="ij")
    x = np.stack([np.sqrt(1 - Z ** 2) * np.cos(L), np.sqrt(1 - Z ** 2) * np.sin(L), Z], -1).reshape(-1, 3)
    weights = np.repeat(wz, 2 * nlat) * math.pi / nlat
    return x, gibbs_fixed_point(np.exp(x @ A @ x.T), weights, x, eps)


def gibbs_fixed_point(kernel, weights, x, eps):
    """(rho, F) with rho ∝ exp(U / eps) from a cluster at e_1, damped; F = eps int rho log rho - 1/2 <rho, K rho>."""
    rho = np.exp(3 * x[:, 0])
    rho /= rho @ weights
    while True:
        potential = kernel @ (rho * weights)
        new = np.exp((potential - potential.max()) / eps)
        new /= new @ weights
        if np.abs(new - rho).max() <= 1e-14 * new.max():
            break
        rho = 0.5 * (rho + new)
    return new, eps * (new * np.log(new)) @ weights - 0.5 * (new * weights) @ kernel @ (new * weights)


def nystrom(x_grid, rho, weights, A, eps, points):
    """The fixed point's density at other points: exp(U / eps) / Z with U by the same quadrature."""
    potential = np.exp(points @ A @ x_grid.T) @ (rho * weights)
    own = np.exp(np.exp(x_grid @ A @ x_grid.T) @ (rho * weights) / eps) @ weights
    return np.exp(potential / eps) / own


def test_seed004_flow_on_s1_settles_at_the_gibbs_state_with_falling_free_energy(tmp_path):
    """A = diag(1, 0.65), eps = 0.1, from a vMF off the axis: F falls at every save to F* = -1.28926735 of the
    fixed point (order parameter 0.97906404), within 1e-12 of it and the density within 4e-10 at t = 40 (lmax 64;
    the fixed point's 1024 and 512 point grids agree to 1e-15)."""
    A, eps = np.diag([1.0, 0.65]), 0.1
    x, (rho, energy) = circle_gibbs(A, eps)
    weights = np.full(len(rho), 2 * math.pi / len(rho))
    initial = 'kind = "vmf"\nmean = [1.0, 0.3]\nkappa = 3.0'
    result = run(case_text(2, 64, "unnormalized", 1.0, A, A, eps, initial, 40.0, 0.02, 1.0), tmp_path)
    free_energy = result["free_energy"].values
    assert (np.diff(free_energy) < 0).all()
    assert free_energy[-1] == pytest.approx(energy, abs=1e-11)
    assert result["mean"].values[-1] == pytest.approx((x * (rho * weights)[:, None]).sum(0), abs=1e-8)
    expected = nystrom(x, rho, weights, A, eps, grid_points(result))
    assert np.abs(result["density"].values[-1] - expected).max() <= 1e-8 * expected.max()


@pytest.mark.slow
def test_seed004_flow_on_s2_settles_at_the_gibbs_state_with_falling_free_energy(tmp_path):
    """S^2, A = diag(1, 0.8, 0.5), eps = 0.25, lmax 24, 30 units from a vMF at (1, 0.3, 0.2): F falls at every save to
    F* = -1.29136415 (nlat 32 and 40 grids agree to 1e-14), mean (0.8154073, 0, 0); the density is 2.0e-5 off, the
    slowest mode (the turn towards e_1, M_2 = 1.1e-5) decaying at 0.34: 2.1e-4, 5.5e-5, 2.8e-5 at t = 23, 27, 29."""
    A, eps = np.diag([1.0, 0.8, 0.5]), 0.25
    x, (rho, energy) = sphere_gibbs(A, eps)
    weights = np.repeat(leggauss(32)[1], 64) * math.pi / 32
    initial = 'kind = "vmf"\nmean = [1.0, 0.3, 0.2]\nkappa = 2.0'
    result = run(case_text(3, 24, "unnormalized", 1.0, A, A, eps, initial, 30.0, 0.02, 1.0), tmp_path)
    free_energy = result["free_energy"].values
    assert (np.diff(free_energy) < 0).all()
    assert free_energy[-1] == pytest.approx(energy, abs=1e-9)
    assert result["mean"].values[-1] == pytest.approx((x * (rho * weights)[:, None]).sum(0), abs=2e-5)
    expected = nystrom(x, rho, weights, A, eps, grid_points(result))
    assert np.abs(result["density"].values[-1] - expected).max() <= 3e-5 * expected.max()


@pytest.mark.slow
def test_softmax_with_noise_settles_where_the_drift_balances_the_noise_on_s1(tmp_path):
    """Softmax, beta = 2, B = diag(1, 0.65), V = I, eps = 0.1 (no gradient flow): at t = 250 the flux
    rho P_x(V N / Z) - eps rho' (N, Z by brute-force quadrature of the final density) is 1e-8 of rho v's 0.197
    (it was 2e-3 at t = 40, still relaxing along a slow mode)."""
    B = np.diag([1.0, 0.65])
    initial = 'kind = "vmf"\nmean = [1.0, 0.3]\nkappa = 3.0'
    result = run(case_text(2, 64, "softmax", 2.0, B, np.eye(2), 0.1, initial, 250.0, 0.02, 50.0), tmp_path)
    rho = result["density"].values[-1]
    x = grid_points(result)
    kernel = np.exp(2.0 * x @ B @ x.T)
    mean = kernel @ (rho[:, None] * x) / (kernel @ rho)[:, None]
    drift = rho * (mean[:, 1] * x[:, 0] - mean[:, 0] * x[:, 1])
    wavenumber = np.fft.fftfreq(len(rho), 1 / len(rho))
    slope = np.real(np.fft.ifft(1j * wavenumber * np.fft.fft(rho)))
    assert np.abs(drift).max() > 0.1
    assert np.abs(drift - 0.1 * slope).max() <= 1e-7
