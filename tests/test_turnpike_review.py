"""Seed-004 instruments (spherepde/analysis/turnpike.py) recomputed by independent means: the Gibbs minimum by
Newton's method on a fine uniform S^1 grid, the Rayleigh quotient as the Hessian form of a Fourier Galerkin
discretisation, and the three-phase test on gaps whose plateau is known exactly."""

import math

import numpy as np
import pytest
import torch
from test_adjoint import training_case

from solvers.forward_problem import ForwardProblem
from spherepde.analysis.turnpike import gibbs_well, phases, rayleigh_quotient, terminal_displacement, verdict

EPS, LAMBDA_2 = 0.05, 0.65  # the seed's A = diag(1, lambda_2), beta = 1, V = A


def newton_gibbs(B, eps, points=512):
    """rho ∝ exp(U / eps), U = int exp(<x, B y>) rho dtheta, by Newton's method in U on the uniform grid, from a
    cluster tilted by 0.3 rad off e_1: (theta, rho, E)."""
    theta = 2 * np.pi * np.arange(points) / points
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    step = 2 * np.pi / points
    kernel = np.exp(x @ B @ x.T) * step

    def density(potential):
        weights = np.exp((potential - potential.max()) / eps)
        return weights / (weights.sum() * step)

    potential = kernel @ density(5 * np.cos(theta - 0.3))
    for _ in range(50):
        rho = density(potential)
        jacobian = np.eye(points) - kernel @ ((np.diag(rho) - np.outer(rho, rho) * step) / eps)
        # the Jacobian is singular along the rotation only for B = c I; here it is not
        update = np.linalg.solve(jacobian, kernel @ rho - potential)
        potential = potential + update
        if np.abs(update).max() <= 1e-14 * np.abs(potential).max():
            break
    rho = density(potential)
    energy = eps * np.sum(rho * np.log(rho)) * step - 0.5 * rho @ kernel @ rho * step
    return theta, rho, energy


@pytest.fixture(scope="module")
def seed_problem():
    A = [[1.0, 0.0], [0.0, LAMBDA_2]]
    return ForwardProblem(training_case(lmax=64).with_overrides(["control.layers=1", f"model.B={A}", f"model.V={A}"]))


def test_gibbs_minimum_is_newtons_in_both_wells(seed_problem):
    """min E at eps = 0.05, A = diag(1, 0.65): -1.30600654354024 by Newton on 512 points, both wells to 1e-10."""
    _, _, energy = newton_gibbs(np.diag([1.0, LAMBDA_2]), EPS)
    model, kernel, basis = seed_problem.model, seed_problem.exp_kernel, seed_problem.basis
    for cluster in (None, torch.tensor([-1.0, 0.0], dtype=torch.float64)):
        _, minimum = gibbs_well(model, kernel, basis, cluster)
        assert minimum == pytest.approx(energy, abs=1e-10)
    assert energy == pytest.approx(-1.30600654354024, abs=1e-12)


def test_rayleigh_quotient_is_the_galerkin_hessian_form_of_the_align_gradient(seed_problem):
    """R_mu(g), g = -<x, e_2>, at the Gibbs minimum: <s, H s> / int |g'|^2 rho with s = -(rho g')' and s / rho =
    -(w U' / eps) g' - g'' from U' by quadrature (0.91179); and the lowest eigenvalue of H K on 40 Fourier modes
    (0.90876), which it exceeds by the 5e-4 of g's weight outside the first eigenfunction."""
    theta, rho, _ = newton_gibbs(np.diag([1.0, LAMBDA_2]), EPS)
    step = theta[1] - theta[0]
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    tangent = np.stack([-np.sin(theta), np.cos(theta)], 1)
    B = np.diag([1.0, LAMBDA_2])
    kernel = np.exp(x @ B @ x.T)
    log_slope = ((tangent @ B @ x.T) * kernel) @ rho * step / EPS  # (log rho)' = U' / eps
    k = np.arange(1, 41)
    modes = np.outer(theta, k)
    slopes = np.concatenate([-k * np.sin(modes), k * np.cos(modes)], 1)
    curvatures = np.concatenate([-k ** 2 * np.cos(modes), -k ** 2 * np.sin(modes)], 1)
    ratio = -log_slope[:, None] * slopes - curvatures
    s = rho[:, None] * ratio
    hessian = EPS * (rho[:, None] * ratio).T @ ratio * step - s.T @ kernel @ s * step ** 2
    dirichlet = (rho[:, None] * slopes).T @ slopes * step
    g = np.zeros(80)
    g[40] = -1.0  # -sin theta
    quotient = g @ hessian @ g / (g @ dirichlet @ g)
    scales, vectors = np.linalg.eigh(dirichlet)
    kept = vectors[:, scales > 1e-11 * scales.max()] / np.sqrt(scales[scales > 1e-11 * scales.max()])
    lowest = np.linalg.eigvalsh(kept.T @ hessian @ kept)[0]

    model, exp_kernel, basis = seed_problem.model, seed_problem.exp_kernel, seed_problem.basis
    gibbs, _ = gibbs_well(model, exp_kernel, basis)
    computed = rayleigh_quotient(model, exp_kernel, basis, gibbs, -basis.points[..., 1])
    assert computed == pytest.approx(quotient, rel=1e-10)
    assert quotient == pytest.approx(0.911789, abs=1e-6) and lowest == pytest.approx(0.908757, abs=1e-6)


def test_three_phase_test_on_a_box_gap_with_saves_at_the_threshold():
    """Delta = 1 off [5, 35], 0 on it, saves every 0.5 to T = 40: Delta_ref = 0, h = 0.05 exactly; the saves at 4.5
    and 35.5 sit on h (on the plateau), the one at 4 just above it.  Plateau [4.5, 35.5]: tau = r = 4.5, width 31,
    relative variance that of 61 zeros and two 0.05 (7.685e-5)."""
    times = np.arange(0, 40.25, 0.5)
    gap = np.where((times >= 5) & (times <= 35), 0.0, 1.0)
    gap[(times == 4.5) | (times == 35.5)] = 0.05
    gap[times == 4.0] = 0.05 + 1e-10
    test = phases(times, gap)
    plateau = np.r_[np.zeros(61), 0.05, 0.05]
    assert (test["initial_width"], test["plateau_width"], test["terminal_width"]) == (4.5, 31.0, 4.5)
    assert test["plateau_relative_variance"] == pytest.approx(np.var(plateau), rel=1e-12)
    assert test["terminal_lift"] == 1.0 and verdict(test) == "true"


@pytest.mark.parametrize("times, gap", [
    (np.array([0.0, 1.0, 2.0, 10.0]), np.array([1.0, 0.1, 0.0, 0.5])),  # no save in [2.5, 7.5]
    (np.arange(0, 40.25, 0.5), np.r_[np.inf, np.zeros(79), 1.0]),  # an infinite Delta(0)
])
def test_an_untested_run_measures_no_plateau(times, gap):
    """Without a test there is no threshold, so no plateau: its width is NaN, as every other width.  It was 0 (read
    as a test that found no plateau) without a middle save, and 40 = T with an infinite Delta(0), whose
    infinite threshold put every save on the plateau."""
    test = phases(times, gap)
    assert verdict(test) == "untested" and not test["plateau"]
    assert all(math.isnan(test[name]) for name in ("plateau_width", "initial_width", "terminal_width"))


def test_terminal_displacement_on_s2_is_the_angle_between_the_means():
    """S^2: the mean at e_3 on the plateau turns 1.5 rad towards e_2 by T.  Measured as the difference of the angles
    from e_1 (mean_angle) it read 0; it is the angle between the two means.  S^1 keeps the signed, unwrapped turn
    (-3.5 rad: past the branch of atan2 at -e_1)."""
    times = np.linspace(0.0, 10.0, 11)
    plateau = {"plateau": True, "plateau_start": 2.0, "plateau_end": 8.0}
    turn = np.clip(times - 5.0, 0.0, None) * 0.3  # 0 up to the plateau's middle, 1.5 at T
    sphere = np.stack([np.zeros_like(turn), np.sin(turn), np.cos(turn)], axis=1) * 0.8
    assert terminal_displacement(times, sphere, plateau) == pytest.approx(1.5, abs=1e-14)
    tiny = np.stack([np.zeros_like(turn), np.sin(1e-9 * turn), np.cos(1e-9 * turn)], axis=1)
    assert terminal_displacement(times, tiny, plateau) == pytest.approx(1.5e-9, rel=1e-12)
    circle_turn = -np.clip(times - 5.0, 0.0, None) * 0.7  # from angle 0.2 down to -3.3, beyond -pi
    circle = np.stack([np.cos(0.2 + circle_turn), np.sin(0.2 + circle_turn)], axis=1)
    assert terminal_displacement(times, circle, plateau) == pytest.approx(-3.5, abs=1e-14)
