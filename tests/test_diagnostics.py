"""V_p of a band-limited density (`diagnostics.lyapunov_of_density`, from its coefficients) against closed
forms and 1-D adaptive quadrature.

V_p = int (|(I - P_E) x|^2 / |P_E x|^2)^p rho dsigma has an integrand singular on {P_E x = 0}; the grid rule
(`diagnostics.lyapunov` with grid masses) misses it by O(h^(1 - 2p)), the adapted rule must not.
"""

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from scipy.integrate import IntegrationWarning, quad
from scipy.special import beta as beta_function
from scipy.special import i0e

from spherepde.base.device import placement
from spherepde.discretisation.bases import make_basis
from spherepde.measures import diagnostics as diag
from spherepde.measures import optimal_transport

CPU64 = placement("cpu", "float64")
FRAME = np.linalg.qr(np.random.default_rng(7).normal(size=(3, 3)))[0]  # a generic orthonormal frame of R^3


def uniform(area):
    """degree_sum of the uniform density 1/area: only its degree-0 part, 1/area, is nonzero."""
    return lambda moments, axis: moments[0] / area


def series(basis, c):
    """degree_sum of the band-limited density with coefficients c: its series at the axis, degree l times M[l]."""
    return lambda moments, axis: float(basis.evaluate(c * CPU64.tensor(moments)[basis.degree],
                                                      CPU64.tensor(axis[None]))[0])


@pytest.mark.parametrize("p", [0.1, 0.25, 0.4])
def test_uniform_density_closed_forms(p):
    # S^1: (1/2pi) int |tan th|^(2p) dth = 1/cos(pi p).
    e = np.array([[math.cos(0.3)], [math.sin(0.3)]])
    assert (diag.lyapunov_of_density(uniform(2 * math.pi), e, p, 4)
            == pytest.approx(1 / math.cos(math.pi * p), abs=1e-12))
    # S^2, t = <x, axis>, dsigma = dt dphi: dim E = 1: int_0^1 t^(-2p) (1 - t^2)^p dt = B(1/2 - p, p + 1)/2;
    # dim E = 2: int_0^1 t^(2p) (1 - t^2)^(-p) dt = B(p + 1/2, 1 - p)/2.
    assert diag.lyapunov_of_density(uniform(4 * math.pi), FRAME[:, :1], p, 4) == pytest.approx(
        beta_function(0.5 - p, p + 1) / 2, abs=1e-12)
    assert diag.lyapunov_of_density(uniform(4 * math.pi), FRAME[:, :2], p, 4) == pytest.approx(
        beta_function(p + 0.5, 1 - p) / 2, abs=1e-12)


def test_trivial_and_non_integrable_cases():
    assert diag.lyapunov_of_density(uniform(2 * math.pi), np.eye(2), 0.25, 4) == 0.0
    assert diag.lyapunov_of_density(uniform(4 * math.pi), np.eye(3), 0.25, 4) == 0.0
    assert diag.lyapunov_of_density(uniform(2 * math.pi), np.eye(2)[:, :1], 0.5, 4) == math.inf
    assert diag.lyapunov_of_density(uniform(4 * math.pi), FRAME[:, :1], 0.5, 4) == math.inf
    assert math.isfinite(diag.lyapunov_of_density(uniform(4 * math.pi), FRAME[:, :2], 0.75, 4))
    assert math.isnan(diag.lyapunov_of_density(uniform(4 * math.pi), None, 0.25, 4))


def vmf_reference_s1(alpha, mu, kappa, p):
    """int |tan(th - alpha)|^(2p) e^(kappa cos(th - mu)) / (2 pi I0(kappa)) dth, adaptive quadrature per quarter arc."""
    def f(th):
        return (abs(math.tan(th - alpha)) ** (2 * p) * math.exp(kappa * (math.cos(th - mu) - 1))
                / (2 * math.pi * i0e(kappa)))
    edges = alpha + np.pi / 2 * np.arange(-1, 4)
    # QUADPACK's extrapolation reports round-off near the |.|^(-2p) end points once it is at ~1e-12,
    # below the 1e-10 asserted; the warning says nothing beyond that.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IntegrationWarning)
        return sum(quad(f, a, b, epsabs=1e-13, epsrel=1e-12, limit=200)[0] for a, b in itertools.pairwise(edges))


def vmf_reference_s2(axis, mu, kappa, q):
    """int |t|^(2q) (1 - t^2)^(-q) F(t) dt, F the azimuthal integral of the vMF density about `axis`:
    2 pi kappa / (4 pi sinh kappa) e^(kappa t m_a) I0(kappa sqrt(1 - t^2) m_perp)."""
    m_a = float(mu @ axis)
    m_perp = math.sqrt(max(1 - m_a * m_a, 0.0))

    def f(t):
        s = math.sqrt(1 - t * t)
        log_f = kappa * (t * m_a + s * m_perp) + math.log(i0e(kappa * s * m_perp)) - kappa
        return (abs(t) ** (2 * q) * (1 - t * t) ** (-q) * 2 * math.pi * kappa
                / (2 * math.pi * (1 - math.exp(-2 * kappa))) * math.exp(log_f))
    return sum(quad(f, a, b, epsabs=1e-13, epsrel=1e-12, limit=200)[0] for a, b in ((-1, 0), (0, 1)))


@pytest.mark.parametrize("p", [0.1, 0.25])
def test_vmf_from_spectral_coefficients_on_the_circle(p):
    alpha, mu, kappa = 0.3, 1.1, 2.0
    basis = make_basis(2, 32, CPU64)
    points = basis.points.numpy()
    rho = np.exp(kappa * (np.cos(np.arctan2(points[:, 1], points[:, 0]) - mu) - 1)) / (2 * math.pi * i0e(kappa))
    c = basis.analysis(torch.as_tensor(rho))
    e = np.array([[math.cos(alpha)], [math.sin(alpha)]])
    exact = vmf_reference_s1(alpha, mu, kappa, p)
    adapted = diag.lyapunov_of_density(series(basis, c), e, p, basis.lmax)
    grid = diag.lyapunov(points, rho * basis.weights.numpy(), e, p)
    assert adapted == pytest.approx(exact, abs=1e-10)
    assert abs(grid - exact) > 1e-4  # the grid rule this replaces misses by 7e-4 (p = 0.1), 4e-2 (p = 0.25)


@pytest.mark.parametrize("k", [1, 2])
def test_vmf_from_spectral_coefficients_on_the_sphere(k):
    p, kappa = 0.25, 2.0
    mu = np.array([0.3, 0.5, 0.8]) / math.sqrt(0.98)
    basis = make_basis(3, 32, CPU64)
    points = basis.points.reshape(-1, 3).numpy()
    rho = kappa * np.exp(kappa * (points @ mu - 1)) / (2 * math.pi * (1 - math.exp(-2 * kappa)))
    c = basis.analysis(torch.as_tensor(rho.reshape(basis.grid_shape)))
    subspace = FRAME[:, :k]
    axis, q = (FRAME[:, 0], -p) if k == 1 else (FRAME[:, 2], p)
    exact = vmf_reference_s2(axis, mu, kappa, q)
    adapted = diag.lyapunov_of_density(series(basis, c), subspace, p, basis.lmax)
    grid = diag.lyapunov(points, rho * basis.weights.reshape(-1).numpy(), subspace, p)
    assert adapted == pytest.approx(exact, abs=1e-10)
    assert abs(grid - exact) > 1e-5  # the grid rule this replaces


def test_pushforward_splits_grid_nodes_on_the_singular_set():
    """rho ∝ 1 + 0.6 x_2 on an S^2 grid whose meridians phi = +-pi/2 hold nodes (nlon divisible by 4), E = span(e_1):
    Pi_# rho = (delta_{e_1} + delta_{-e_1}) / 2 exactly (rho is even in x_1), and w2_projection does not depend on
    the last bits of the node coordinates (float32 against float64 grids).  Left to round-off, Pi sends the
    node phi = pi/2 (mass ∝ 1.6) to +e_1 and phi = -pi/2 (mass ∝ 0.4) to -e_1 on one grid and not on the other."""
    e1 = np.array([[1.0], [0.0], [0.0]])
    results = []
    for dtype in ("float64", "float32"):
        basis = make_basis(3, 24, placement("cpu", dtype))
        assert basis.grid_shape[1] % 4 == 0
        points = basis.points.reshape(-1, 3).double().numpy()
        masses = basis.weights.reshape(-1).double().numpy() * (1 + 0.6 * points[:, 1]) / (4 * math.pi)
        atoms, pushed = optimal_transport.pushforward(points, masses, e1)
        assert pushed[atoms[:, 0] > 0].sum() == pytest.approx(0.5, abs=1e-7 if dtype == "float32" else 1e-14)
        tilted = masses * (1 + 0.5 * points[:, 0])
        results.append(optimal_transport.w2_projection(points, tilted / tilted.sum(), points, masses, e1)[0])
    assert results[0] == pytest.approx(results[1], rel=1e-6)


def test_exact_transport_is_the_linear_programs_optimum_with_its_potentials_on_the_given_atoms():
    """exact_transport (POT's network simplex on the atoms in a shuffled order) against the transport linear
    program solved by HiGHS (scipy.optimize.linprog): the same optimal cost on S^1 and S^2, and its potentials,
    mapped back to the caller's atoms, are dual feasible (u_i + v_j <= |x_i - y_j|^2) with dual value a u + b v
    equal to that cost; unequal sizes and masses, so that potentials on the wrong atoms break one or the other."""
    from scipy.optimize import linprog

    rng = np.random.default_rng(11)
    for dim, (m, n) in [(2, (23, 31)), (3, (30, 19))]:
        x, y = (rng.normal(size=(k, dim)) for k in (m, n))
        x, y = x / np.linalg.norm(x, axis=1, keepdims=True), y / np.linalg.norm(y, axis=1, keepdims=True)
        a, b = rng.uniform(0.1, 1.0, m), rng.uniform(0.1, 1.0, n)
        a, b = a / a.sum(), b / b.sum()
        cost_matrix = ((x[:, None] - y[None]) ** 2).sum(-1)
        constraints = np.vstack([np.kron(np.eye(m), np.ones(n)), np.kron(np.ones(m), np.eye(n))])
        reference = linprog(cost_matrix.ravel(), A_eq=constraints, b_eq=np.concatenate([a, b]), method="highs").fun
        cost, u, v = optimal_transport.exact_transport(x, a, y, b, potentials=True)
        assert cost == pytest.approx(reference, abs=1e-12)
        assert optimal_transport.exact_transport(x, a, y, b)[0] == pytest.approx(reference, abs=1e-12)
        assert (u[:, None] + v[None] <= cost_matrix + 1e-12).all()
        assert a @ u + b @ v == pytest.approx(reference, abs=1e-12)


def test_w2_of_a_measure_without_positive_mass_is_nan():
    # A density the grid does not see (all nodes 0, or negative) has nothing to normalise into a probability.
    points = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    masses = np.array([0.2, 0.5, 0.3])
    assert np.isclose(optimal_transport.wasserstein2(points, masses, points, masses)[0], 0.0, atol=1e-7)
    for empty in (np.zeros(3), -masses):
        value, bound = optimal_transport.wasserstein2(points, empty, points, masses)
        assert math.isnan(value) and bound == 0.0


def test_w2_projection_lies_within_its_stored_bound_of_the_densities_w2():
    """A rigid rotation on S^1 (W antisymmetric, V = 0, eps = 0: rho_t is the vMF rho_0 turned by t, E the
    whole plane, Pi the identity): the run's w2_projection, between grid measures, lies within the stored
    w2_quantisation_bound of W2(rho_t, rho_0) between the densities, computed independently by exact OT
    between 400-point samples of the exact densities (within their own cell bound), at lmax 12 and 48.
    Before, the bound left the grid out (0 on S^1) while the grid value was twice W2 at t = 0.1, lmax 16."""
    from conftest import make_case

    import spherepde

    fine = 400
    angles = 2 * np.pi * np.arange(fine) / fine
    circle = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    times = np.arange(5) * 0.15
    references = [optimal_transport.wasserstein2(circle, np.exp(2 * np.cos(angles)), circle,
                                                 np.exp(2 * np.cos(angles - t)), max_atoms=fine)[0] for t in times]
    for lmax in (12, 48):
        case = make_case(2, lmax, model={"kernel": "unnormalized", "beta": 0.0, "V": [[0.0, 0.0], [0.0, 0.0]],
                                         "W": [[0.0, -1.0], [1.0, 0.0]], "eps": 0.0},
                         initial={"kind": "vmf", "mean": [1.0, 0.0], "kappa": 2.0},
                         time={"t_end": float(times[-1]), "dt": 0.01, "save_every": 0.15})
        dataset = spherepde.run(case, progress=False)
        assert np.allclose(dataset["time"].values, times)
        bound, cells = dataset.attrs["w2_quantisation_bound"], dataset.sizes["theta"]
        assert bound == pytest.approx(4 * math.sin(math.pi / (2 * cells)))  # the two grids' cell radii
        errors = np.abs(dataset["w2_projection"].values - references)
        assert errors.max() <= bound + 4 * math.sin(math.pi / (2 * fine)), (lmax, errors, bound)
