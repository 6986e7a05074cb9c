"""Review of the theory instruments (spherepde/analysis/turnpike.py): the Gibbs minimum, the free energy and the
Rayleigh quotient of the energy the flow dissipates beyond the seed's beta = 1, c = 1, and the three-phase verdict of
a run without that energy, checked against independent numpy computations."""

import math

import numpy as np
import pytest
import torch
from test_adjoint import training_case

from solvers.forward_problem import ForwardProblem
from spherepde.analysis.turnpike import free_energy, gibbs_minimum, phases, rayleigh_quotient, verdict
from spherepde.base.real_view import real_state


@pytest.mark.parametrize("overrides, beta, c", [(["model.beta=2.0"], 2.0, 1.0),
                                                (["model.V=[[2.0, 0.0], [0.0, 1.3]]"], 1.0, 2.0)])
def test_gibbs_minimum_and_rayleigh_quotient_of_the_energy_with_weight_c_over_beta(overrides, beta, c):
    """Unnormalized kernel, B = A = diag(1, 0.65), V = c B, eps = 0.05 on S^1: the flow dissipates
    F = eps int rho log rho - c / (2 beta) int int exp(beta <x, B y>) drho drho (the run's free_energy).  Its minimum
    rho ∝ exp(c U / (beta eps)) is a stationary state, and F, rho and the Hessian's Rayleigh quotient along
    grad g, g = -sin theta, agree with a numpy fixed point and a Lagrangian second difference of F along
    theta -> theta + a g'(theta) (the W2 geodesic on S^1).  The pair integral was weighted by 1 whatever beta and c:
    min E -3.5985 for -1.7688 and R 5.108 for 2.522 at beta = 2; min E -1.3060 for -2.6474 and R 0.912 for 1.862 at
    c = 2, at states that moved (relative rate 5.3 and 1.9)."""
    eps = 0.05
    problem = ForwardProblem(training_case(lmax=128).with_overrides(["control.layers=1"] + overrides))
    basis = problem.basis
    rho, energy = gibbs_minimum(problem.model, problem.exp_kernel, basis, torch.tensor([1.0, 0.0], dtype=torch.float64))
    state = real_state(basis.analysis(rho)[None])
    rate = problem.lam * state + problem.transport(state, problem.transport.feed_forward(problem.batch.W))
    assert float(rate.abs().max()) < 1e-9 * float(state.abs().max())

    theta = basis.theta.numpy()
    n, h = len(theta), 2 * math.pi / len(theta)
    A = np.diag([1.0, 0.65])
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    kernel = np.exp(beta * x @ A @ x.T)
    weight = c / beta
    own = np.exp(np.cos(theta) / eps)
    own /= own.sum() * h
    for _ in range(20000):
        potential = weight * kernel @ own * h
        new = np.exp((potential - potential.max()) / eps)
        new /= new.sum() * h
        if np.abs(new - own).max() < 1e-15 * new.max():
            break
        own = 0.5 * (own + new)
    own_energy = eps * np.sum(own * np.log(own)) * h - 0.5 * weight * own @ kernel @ own * h * h
    assert float((rho - torch.as_tensor(own)).abs().max()) < 1e-10 * own.max()
    assert energy == pytest.approx(own_energy, rel=1e-12)
    assert free_energy(problem.model, problem.exp_kernel, basis, rho) == pytest.approx(own_energy, rel=1e-12)

    wavenumber = np.fft.fftfreq(n, 1 / n)
    g = -np.sin(theta)
    slope = np.real(np.fft.ifft(1j * wavenumber * np.fft.fft(g)))
    curvature = np.real(np.fft.ifft(1j * wavenumber * np.fft.fft(slope)))

    def transported(a):
        moved = theta + a * slope
        y = np.stack([np.cos(moved), np.sin(moved)], 1)
        return (eps * np.sum(own * np.log(own / (1 + a * curvature))) * h
                - 0.5 * weight * own @ np.exp(beta * y @ A @ y.T) @ own * h * h)

    def second_difference(a):
        return (transported(a) + transported(-a) - 2 * transported(0.0)) / a ** 2

    hessian = (4 * second_difference(1e-3) - second_difference(2e-3)) / 3
    quotient = hessian / (np.sum(slope ** 2 * own) * h)
    assert rayleigh_quotient(problem.model, problem.exp_kernel, basis, rho, torch.tensor(g)) == pytest.approx(
        quotient, rel=1e-7)


def test_a_gap_that_is_not_finite_is_untested():
    """A training whose model has no free energy (V not a multiple of B) records free_energy NaN, so its gap is NaN:
    every comparison with the threshold fails and the verdict read "false" (seed004-align-l065 shrunk, V = diag(1,
    0.5)), a test that did not run.  A finite gap keeps its verdict."""
    times = np.linspace(0, 40, 401)
    gap = 0.5 * np.exp(-2 * times) + 1e-4 + 0.3 * np.exp(-0.5 * (40 - times))
    assert verdict(phases(times, gap)) == "true"
    assert verdict(phases(times, np.full_like(times, math.nan))) == "untested"
    assert verdict(phases(times, np.where(times == 0, math.nan, gap))) == "untested"


def test_a_training_whose_model_has_no_free_energy_reports_no_energy_theory():
    """V = diag(1, 0.5) is no multiple of B = diag(1, 0.65): the flow dissipates no free energy (the run's
    free_energy is NaN), so the Gibbs minimum, its energy and the Hessian's Rayleigh quotient describe nothing of it.
    The training reported them anyway (here rayleigh_quotient 0.91, min_energy -1.31); they are NaN and three_phase
    "untested" now, while V = 2 B, whose energy the flow dissipates with weight c / beta = 2, keeps them finite."""
    import spherepde

    base = training_case(lmax=24, t_end=2.0, dt=0.04, control={"iterations": 1, "layers": 4})
    for V, has_energy in (("[[1.0, 0.0], [0.0, 0.5]]", False), ("[[2.0, 0.0], [0.0, 1.3]]", True)):
        dataset = spherepde.run(base.with_overrides([f"model.V={V}"]))
        theory = [dataset.attrs[name] for name in ("min_energy", "rayleigh_quotient", "h_minus_one_quotient")]
        assert np.isfinite(dataset["free_energy"].values).all() == has_energy
        assert np.isfinite(theory).all() if has_energy else np.isnan(theory).all(), (V, theory)
        assert ("energy_gap" in dataset) == has_energy
        if not has_energy:
            assert dataset.attrs["three_phase"] == "untested"
