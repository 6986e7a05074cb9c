"""Symmetries and invariants of the model, checked independently of the solver's own helpers.

The equation is O(d)-equivariant: the run from rho_0(Q^T x) with B, V, W -> Q B Q^T, Q V Q^T, Q W Q^T gives
rho_t(Q^T x), the same scalar diagnostics and the mean Q m.  Grid-preserving Q (turns by the longitude step, the
reflections z -> -z, y -> -y) map the Gauss grid onto itself, so there the discrete runs agree to round-off; a generic
rotation is compared through the degree-lmax spherical-harmonic series of the first run, summed here with scipy.
With V = 0 and eps = 0 the flow is x -> A x / |A x|, A = exp(t W), and the Liouville law gives the density in closed
form; on S^1 the full model is compared with a plain Fourier collocation solver written here.
"""

import numpy as np
import pytest
from conftest import make_case
from scipy.linalg import expm
from scipy.special import i0, roots_legendre, sph_harm_y
from test_design_review import classical_rk4

import spherepde

RNG = np.random.default_rng(0)
B3, V3, W3 = 0.8 * RNG.normal(size=(3, 3)), 0.5 * RNG.normal(size=(3, 3)), 0.3 * RNG.normal(size=(3, 3))
MEANS3 = np.array([[1.0, 0.0, 0.2], [-0.5, 0.8, 0.0], [-0.3, -0.7, -0.6]])
INVARIANTS = ("mass", "order_parameter", "alignment_E", "alignment_F", "lyapunov", "entropy", "interaction_energy")


def rotated_run(Q, lmax, model=None, solver=None):
    """The S^2 run of general B, V, W and a three-cloud mixture, all turned by Q (orthogonal)."""
    model = {"B": (Q @ B3 @ Q.T).tolist(), "V": (Q @ V3 @ Q.T).tolist(), "W": (Q @ W3 @ Q.T).tolist(),
             "eps": 0.1} | (model or {})
    initial = {"kind": "vmf_mixture", "means": (MEANS3 @ Q.T).tolist(), "kappas": [2.0, 1.0, 2.0],
               "weights": [0.4, 0.35, 0.25]}
    return spherepde.run(make_case(3, lmax, model=model, initial=initial, solver=solver,
                                   time={"t_end": 1.0, "dt": 0.05, "save_every": 0.5}))


def grid_points(ds):
    lat, lon = np.meshgrid(np.deg2rad(ds.lat.values), np.deg2rad(ds.lon.values), indexing="ij")
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], -1).reshape(-1, 3)


def rotation_z(angle):
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def assert_invariants(ds, turned, Q, atol):
    for name in INVARIANTS:
        np.testing.assert_allclose(turned[name].values, ds[name].values, rtol=0, atol=atol, err_msg=name)
    np.testing.assert_allclose(turned["mean"].values, ds["mean"].values @ Q.T, rtol=0, atol=atol)


@pytest.mark.parametrize("kernel, beta, field", [("softmax", 1.0, "spectral"), ("unnormalized", 1.0, "dense"),
                                                 ("softmax", "inf", "auto")])
def test_grid_preserving_orthogonal_map_commutes_with_the_run(kernel, beta, field):
    """Q = Rz(2 longitude steps) diag(1, 1, -1) (det -1) maps the Gauss grid onto itself: the turned run is the
    first run's density permuted to round-off (measured 8e-16), invariants equal, the mean turned."""
    ds = rotated_run(np.eye(3), 8, {"kernel": kernel, "beta": beta}, {"field": field})
    Q = rotation_z(4 * np.pi / ds.lon.size) @ np.diag([1.0, 1.0, -1.0])
    turned = rotated_run(Q, 8, {"kernel": kernel, "beta": beta}, {"field": field})
    points = grid_points(ds)
    distance = ((points @ Q)[:, None, :] - points[None, :, :]) ** 2
    source = distance.sum(-1).argmin(1)  # x_source(j) = Q^T x_j
    rho = ds.density.values.reshape(ds.time.size, -1)
    assert np.abs(rho[:, source] - turned.density.values.reshape(ds.time.size, -1)).max() < 1e-13
    assert_invariants(ds, turned, Q, 1e-13)


def spherical_harmonic_series(ds, lmax, points):
    """The degree-lmax series of ds.density (Gauss quadrature on its grid) at points (P, 3): (time, P)."""
    nlat, nlon = ds.lat.size, ds.lon.size
    nodes, weights = roots_legendre(nlat)
    weight = (weights[np.argsort(nodes)[::-1]][:, None] * np.full(nlon, 2 * np.pi / nlon)).ravel()
    polar, azimuth = np.meshgrid(np.pi / 2 - np.deg2rad(ds.lat.values), np.deg2rad(ds.lon.values), indexing="ij")
    at_polar, at_azimuth = np.arccos(np.clip(points[:, 2], -1, 1)), np.arctan2(points[:, 1], points[:, 0])
    rho = ds.density.values.reshape(ds.time.size, -1)
    series = np.zeros((ds.time.size, len(points)))
    for l in range(lmax + 1):
        for m in range(-l, l + 1):
            coefficient = rho @ (np.conj(sph_harm_y(l, m, polar, azimuth)).ravel() * weight)
            series += (coefficient[:, None] * sph_harm_y(l, m, at_polar, at_azimuth)[None, :]).real
    return series


def test_generic_rotation_commutes_with_the_run():
    """A rotation that maps no grid point onto another: the turned softmax run (general B, V, W, eps 0.1, lmax 12)
    against the first run's spherical-harmonic series at Q^T x: 1.2e-14 of max rho (1.5e-10 at lmax 8)."""
    Q = expm(np.cross(np.eye(3), [0.4, 0.9, -0.5]))
    ds, turned = rotated_run(np.eye(3), 12), rotated_run(Q, 12)
    expected = spherical_harmonic_series(ds, 12, grid_points(turned) @ Q)
    assert np.abs(expected - turned.density.values.reshape(ds.time.size, -1)).max() < 1e-11 * ds.density.max()
    assert_invariants(ds, turned, Q, 1e-12)


def vmf_density(mean, kappa, x):
    """The von Mises-Fisher density per unit of arc (S^1) or of area (S^2)."""
    mean = np.asarray(mean) / np.linalg.norm(mean)
    normaliser = 2 * np.pi * i0(kappa) if x.shape[-1] == 2 else 4 * np.pi * np.sinh(kappa) / kappa
    return np.exp(kappa * x @ mean) / normaliser


def test_liouville_law_of_the_linear_flow_on_s2():
    """V = 0, eps = 0: X_t = A x / |A x|, A = exp(t W), so rho_t(y) = rho_0(A^-1 y / |A^-1 y|) |det A^-1| /
    |A^-1 y|^3 (density times Jacobian along the characteristics).  Measured at t = 1: 5.4e-5 at lmax 32, 7.2e-3 at
    lmax 16 (max rho 0.9)."""
    mean, W = [1.0, 0.3, -0.2], np.array([[0.3, 0.6, -0.2], [-0.2, -0.4, 0.3], [0.1, 0.5, 0.2]])
    ds = spherepde.run(make_case(3, 24, model={"V": np.zeros((3, 3)).tolist(), "W": W.tolist()},
                                 initial={"kind": "vmf", "mean": mean, "kappa": 2.0},
                                 time={"t_end": 1.0, "dt": 0.02, "save_every": 1.0}))
    inverse = expm(-W)
    y = grid_points(ds) @ inverse.T
    r = np.linalg.norm(y, axis=1)
    expected = vmf_density(mean, 2.0, y / r[:, None]) * abs(np.linalg.det(inverse)) / r**3
    assert np.abs(ds.density.values[-1].ravel() - expected).max() < 2e-3
    assert abs(float(ds.mass[-1]) - 1) < 1e-13


def collocation_s1(mean, kappa, B, V, W, beta, eps, kernel, t_end, n=64, dt=1e-3):
    """d_t rho = -d_theta(rho f) + eps d_theta^2 rho on n points, f = <e_theta, W x + V m(x)>, m from the trapezoid
    rule (N / Z, N, or B^T x / |B^T x| at beta = inf), Fourier derivatives, classical RK4."""
    theta = 2 * np.pi * np.arange(n) / n
    x = np.stack([np.cos(theta), np.sin(theta)], -1)
    tangent = np.stack([-np.sin(theta), np.cos(theta)], -1)
    k = np.fft.fftfreq(n, 1 / n)

    def rate(rho):
        if beta == "inf":
            m = x @ B / np.linalg.norm(x @ B, axis=1, keepdims=True)
        else:
            weighted = np.exp(beta * x @ B @ x.T) * rho[None, :] * (2 * np.pi / n)
            m = weighted @ x / (weighted.sum(1, keepdims=True) if kernel == "softmax" else 1.0)
        flux = rho * (tangent * (x @ W.T + m @ V.T)).sum(1)
        return np.fft.ifft(-1j * k * np.fft.fft(flux) - eps * k**2 * np.fft.fft(rho)).real

    return classical_rk4(rate, vmf_density(mean, kappa, x), dt, round(t_end / dt))


@pytest.mark.parametrize("kernel, beta, field", [("softmax", 2.0, "dense"), ("softmax", 2.0, "spectral"),
                                                 ("unnormalized", 1.0, "dense"), ("softmax", "inf", "auto")])
def test_s1_run_matches_an_independent_collocation_solver(kernel, beta, field):
    """General B, V, W on S^1 (the matrix, fourier and grid paths as "auto" picks them), t = 0.5: the run's
    density against the collocation solver's Fourier interpolant (lmax 40, 128 points); measured 6e-11 (softmax)
    and 1.1e-8 (unnormalized: at t = 1 3.6e-8 at lmax 40 and 3.4e-10 at 64, its modes' own decay)."""
    B, V, W = (np.array([[1.2, 0.5], [-0.3, 0.8]]), np.array([[0.7, -0.4], [0.9, 0.2]]),
               np.array([[0.2, 0.5], [-0.1, -0.3]]))
    model = {"kernel": kernel, "beta": beta, "B": B.tolist(), "V": V.tolist(), "W": W.tolist(), "eps": 0.05}
    ds = spherepde.run(make_case(2, 40, model=model, initial={"kind": "vmf", "mean": [1.0, 0.3], "kappa": 1.5},
                                 solver={"field": field}, time={"t_end": 0.5, "dt": 0.005, "save_every": 0.5}))
    own = collocation_s1([1.0, 0.3], 1.5, B, V, W, beta, 0.05, kernel, 0.5, n=128)
    coefficients = np.fft.fft(own) / own.size
    k = np.fft.fftfreq(own.size, 1 / own.size)
    interpolant = (np.exp(1j * np.outer(ds.theta.values, k)) @ coefficients).real
    assert np.abs(ds.density.values[-1] - interpolant).max() < 1e-7


def test_axisymmetric_model_keeps_zonal_densities_zonal():
    """B, V diagonal with equal x, y entries and W a turn about z plus a diagonal commute with every Rz: a zonal
    rho_0 stays zonal, to round-off at every longitude (not only the grid's turns); measured 1.1e-15."""
    model = {"B": np.diag([2.0, 2.0, -1.0]).tolist(), "V": np.diag([1.5, 1.5, 0.7]).tolist(),
             "W": [[0.3, -0.8, 0.0], [0.8, 0.3, 0.0], [0.0, 0.0, -0.5]], "beta": 2.0, "eps": 0.05}
    initial = {"kind": "vmf_mixture", "means": [[0, 0, 1.0], [0, 0, -1.0]], "kappas": [3.0, 1.0], "weights": [0.6, 0.4]}
    ds = spherepde.run(make_case(3, 12, model=model, initial=initial))
    rho = ds.density.values
    assert np.abs(rho - rho.mean(-1, keepdims=True)).max() < 1e-13 * rho.max()
    assert np.abs(ds["mean"].values[:, :2]).max() < 1e-14


@pytest.mark.parametrize("dim", [2, 3])
def test_softmax_at_beta_zero_is_the_unnormalized_linear_model(dim):
    """At beta = 0 both kernels give m = ∫ y rho = M (mass 1): the two runs agree to round-off (measured 4e-16)."""
    V = (0.7 * np.eye(dim) + 0.3 * np.ones((dim, dim))).tolist()
    initial = {"kind": "vmf", "mean": [1.0, 0.4, 0.1][:dim], "kappa": 1.0}
    runs = [spherepde.run(make_case(dim, 10, model={"kernel": kernel, "beta": 0.0, "V": V, "eps": 0.05},
                                    initial=initial)) for kernel in ("softmax", "unnormalized")]
    assert np.abs(runs[0].density.values - runs[1].density.values).max() < 1e-13
