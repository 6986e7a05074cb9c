"""The particle solver's Brownian motion on S^1 and S^2 against closed forms computed here: the heat kernel's
Legendre (Fourier) moments, the isotropy of the displacement, a rotation commuting with the noise, the Bingham
stationary law of a gradient drift, and the independence and absence of the draws."""

import math

import numpy as np
import pytest
from conftest import identity, make_case
from scipy.integrate import dblquad, quad
from scipy.linalg import expm

import solvers.particles
from solvers.particles import run_particles


def noise_case(dim, n, eps, t_end, dt, integrator="heun", kappa=1e8, model=None, seed=0, save_every=None):
    """Tokens drawn near e_1 (vMF of `kappa`), V = 0, beta = 0: the drift is P_x(W x) alone; every token saved."""
    model = {"kernel": "unnormalized", "beta": 0.0, "V": identity(dim, 0.0), "eps": eps} | (model or {})
    case = make_case(dim, 8, model=model, initial={"kind": "vmf", "mean": [1.0] + [0.0] * (dim - 1), "kappa": kappa},
                     time={"t_end": t_end, "dt": dt, "save_every": save_every or t_end}, diagnostics={"w2": False})
    return case.with_overrides([f"particles.n={n}", f"particles.save={n}", f"particles.integrator='{integrator}'",
                                f"particles.seed={seed}"])


def legendre(l, c):
    return np.polynomial.legendre.legval(c, [0] * l + [1])


def geodesic_step_factor(sigma_squared, l):
    """E P_l(cos(sigma |g|)), g ~ N(0, I_2): the factor by which a geodesic Gaussian step on S^2 multiplies a degree-l
    zonal function about the starting point (the addition theorem)."""
    coefficients = [0] * l + [1]
    return quad(lambda r: np.polynomial.legendre.legval(math.cos(math.sqrt(sigma_squared) * r), coefficients)
                * r * math.exp(-r * r / 2), 0, np.inf, limit=200)[0]


def z_scores(values, expected):
    """(mean - expected) / stderr for each column of `values` (samples, k)."""
    return (values.mean(0) - expected) / (values.std(0) / math.sqrt(values.shape[0]))


def test_heat_kernel_moments_on_the_circle_are_exact_at_any_step():
    """S^1, V = W = 0: E cos(l (theta_t - theta_0)) = exp(-eps l^2 t) for l = 1..4; the geodesic step is exact in law,
    so one Heun step of t = 0.4 (two half noise steps) and the Euler step agree with it within 4 stderr (a diffusion
    constant off by 2 reads exp(-0.8) against exp(-0.4) at l = 1: hundreds of stderr)."""
    eps, t, n, l = 0.5, 0.4, 100000, np.arange(1, 5)
    for integrator in ("heun", "euler"):
        x = run_particles(noise_case(2, n, eps, t, t, integrator)).particles.values
        turn = np.arctan2(x[-1, :, 1], x[-1, :, 0]) - np.arctan2(x[0, :, 1], x[0, :, 0])
        z = z_scores(np.cos(turn[:, None] * l), np.exp(-eps * l ** 2 * t))
        assert np.all(np.abs(z) <= 4), (integrator, z)


@pytest.mark.parametrize("integrator, dt", [("heun", 0.25), ("euler", 0.125)])
def test_heat_kernel_moments_on_the_sphere_are_those_of_the_scheme(integrator, dt):
    """S^2, V = W = 0, eps t = 1: E P_l(<X_t, X_0>) for l = 1..4 within 4 stderr of the scheme's product of geodesic
    step factors (sigma^2 = 2 eps tau, with Heun's correction 1 - eps tau / 3 and half steps at the ends), and, for
    Heun, of the heat kernel exp(-eps l (l + 1) t) (its bias -1.9e-3 at l = 1, stderr 1e-3; Euler's -0.024 is first
    order)."""
    eps, t, n = 2.0, 0.5, 100000
    x = run_particles(noise_case(3, n, eps, t, dt, integrator)).particles.values
    cosine = np.clip((x[0] * x[-1]).sum(-1), -1, 1)
    steps, l = round(t / dt), np.arange(1, 5)
    if integrator == "euler":
        scheme = [geodesic_step_factor(2 * eps * dt, k) ** steps for k in l]
    else:
        scheme = [geodesic_step_factor(solvers.particles.noise_variance(eps, dt / 2, 3), k) ** 2
                  * geodesic_step_factor(solvers.particles.noise_variance(eps, dt, 3), k) ** (steps - 1) for k in l]
    values = np.stack([legendre(k, cosine) for k in l], axis=1)
    assert np.all(np.abs(z_scores(values, np.array(scheme))) <= 4)
    heat = np.exp(-eps * l * (l + 1) * t)
    if integrator == "heun":
        assert np.all(np.abs(values.mean(0) - heat) <= 0.005)
    else:
        assert heat[0] - values[:, 0].mean() >= 0.02


def test_displacement_on_the_sphere_is_isotropic():
    """From a point mass at a generic point of S^2, the direction of the displacement in the tangent plane is uniform:
    E cos(k phi) = E sin(k phi) = 0 for k = 1..4, within 4 stderr."""
    n, mu = 100000, np.array([0.0, 0.6, 0.8])
    case = make_case(3, 8, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(3, 0.0), "eps": 0.5},
                     initial={"kind": "vmf", "mean": mu.tolist(), "kappa": 1e10},
                     time={"t_end": 0.3, "dt": 0.1, "save_every": 0.3}, diagnostics={"w2": False})
    x = run_particles(case.with_overrides([f"particles.n={n}", f"particles.save={n}"])).particles.values[-1]
    across = np.cross(mu, [1.0, 0.0, 0.0])
    phi = np.arctan2(x @ across, x[:, 0])[:, None] * np.arange(1, 5)
    assert np.all(np.abs(z_scores(np.concatenate([np.cos(phi), np.sin(phi)], axis=1), 0.0)) <= 4)


@pytest.mark.parametrize("dim", [3, 4])
def test_rotation_commutes_with_the_noise(dim):
    """W antisymmetric, V = 0: E[X_t | X_0] = exp(-eps (d - 1) t) exp(t W) X_0 (docs/design.md); rk4 at dt = 0.25 within
    4 stderr of it token by token (its own error 1e-4 against a stderr of 2e-3)."""
    eps, t, n = 0.3, 1.0, 100000
    W = np.zeros((dim, dim))
    W[0, 1], W[1, 2] = 1.5, 0.7
    W -= W.T
    x = run_particles(noise_case(dim, n, eps, t, 0.25, "rk4", kappa=2.0, model={"W": W.tolist()})).particles.values
    residual = x[-1] - x[0] @ (math.exp(-eps * (dim - 1) * t) * expm(t * W)).T
    assert np.all(np.abs(z_scores(residual, 0.0)) <= 4)


def test_different_seeds_draw_independent_noises_and_zero_eps_draws_none(monkeypatch):
    """The increments of two seeds, less their conditional mean exp(-2 eps t) X_0, are uncorrelated (|z| <= 4 per
    component); eps = 1e-12 moves the tokens by about sqrt(2 eps t) from the noiseless run; eps = 0 draws nothing."""
    eps, t, n = 0.5, 0.2, 50000
    runs = [run_particles(noise_case(3, n, eps, t, 0.1, kappa=3.0, seed=seed)).particles.values for seed in (7, 8)]
    increments = [x[-1] - math.exp(-2 * eps * t) * x[0] for x in runs]
    for j in range(3):
        rho = np.corrcoef(increments[0][:, j], increments[1][:, j])[0, 1]
        assert abs(rho) * math.sqrt(n) <= 4
    tiny = run_particles(noise_case(3, 2000, 1e-12, t, 0.1, kappa=3.0)).particles.values

    def refuse(self, count):
        raise AssertionError(f"eps = 0 drew {count} Gaussians")

    monkeypatch.setattr(solvers.particles.Noise, "blocks", refuse)
    still = run_particles(noise_case(3, 2000, 0.0, t, 0.1, kappa=3.0)).particles.values
    moved = np.linalg.norm(tiny - still, axis=-1).max()
    assert 1e-7 <= moved <= 6 * math.sqrt(2 * 1e-12 * t)


@pytest.mark.slow
@pytest.mark.parametrize("integrator, order", [("heun", 2), ("euler", 1)])
def test_stationary_bingham_law_and_the_weak_order(integrator, order):
    """dX = P_x(A X) dt + sqrt(2 eps) dB on S^2 is the gradient flow of <x, A x> / 2 with noise: its stationary law is
    exp(<x, A x> / (2 eps)) (Bingham).  E x_1^2 at t = 3 and 4 (400000 independent tokens) against that law's,
    by quadrature: the bias falls by 2^order from dt = 0.2 to 0.1 (measured: heun 0.0109, 0.0027; euler 0.055, 0.028;
    stderr 3.5e-4) and is 0.003 (heun) at dt = 0.1."""
    eps, A = 0.5, np.diag([1.5, 0.0, -1.5])

    def density_moment(f):
        def integrand(theta, phi):
            x = np.array([math.sin(theta) * math.cos(phi), math.sin(theta) * math.sin(phi), math.cos(theta)])
            return f(x) * math.exp(x @ A @ x / (2 * eps)) * math.sin(theta)
        return dblquad(integrand, 0, 2 * math.pi, 0, math.pi, epsabs=1e-11, epsrel=1e-11)[0]

    exact = density_moment(lambda x: x[0] ** 2) / density_moment(lambda x: 1.0)
    biases = []
    for dt in (0.2, 0.1):
        case = noise_case(3, 400000, eps, 4.0, dt, integrator, kappa=1e-9, model={"W": A.tolist()}, save_every=1.0)
        biases.append(float((run_particles(case).particles.values[-2:, :, 0] ** 2).mean()) - exact)
    ratio = biases[0] / biases[1]
    assert 2 ** order / 1.6 <= ratio <= 2 ** order * 1.6, biases
    if integrator == "heun":
        assert abs(biases[1]) <= 0.005, biases
