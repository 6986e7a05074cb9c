"""Extreme but valid parameters: the recorded numbers against closed forms and brute force."""

import math

import numpy as np
from conftest import make_case

import spherepde


def log_pair_sum(x: np.ndarray, beta: float, B: np.ndarray) -> float:
    """log sum_{i != j} exp(beta <x_i, B x_j>), by brute force in log space."""
    logits = beta * x @ B @ x.T
    np.fill_diagonal(logits, -np.inf)
    top = logits.max()
    return top + math.log(np.exp(logits - top).sum())


def static_particles(n, kernel, beta, B):
    """A particle run whose tokens do not move (V = W = 0, eps = 0): only the diagnostics see beta and B."""
    model = {"kernel": kernel, "beta": beta, "B": B, "V": [[0.0, 0.0], [0.0, 0.0]]}
    case = make_case(2, 16, model=model, initial={"kind": "uniform"}, time={"t_end": 0.1, "dt": 0.1, "save_every": 0.1})
    return spherepde.run(case.with_overrides(["solver.method='particles'", f"particles.n={n}"]), progress=False)


def test_particle_interaction_energy_of_well_separated_tokens_at_large_beta():
    # exp(beta <x_i, B x_i>) on the diagonal dwarfs every pair term; the U-statistic keeps the pairs only
    B = [[1.0, 0.2], [-0.1, 0.8]]
    out = static_particles(3, "unnormalized", 300.0, B)
    x = out["particles"].values[0]
    expected = -0.5 * math.exp(log_pair_sum(x, 300.0, np.array(B)) - math.log(3 * 2))
    assert expected < -1e30
    assert abs(out["interaction_energy"].values[0] / expected - 1) <= 1e-12


def test_particle_interaction_energy_overflows_to_minus_infinity():
    # |U| ~ 1e341 is beyond float64: U = -1/2 (a positive sum) overflows to -inf, never +inf
    out = static_particles(3, "softmax", 2000.0, [[1.0, 0.0], [0.0, 1.0]])
    x = out["particles"].values[0]
    assert log_pair_sum(x, 2000.0, np.eye(2)) - math.log(6) > math.log(np.finfo(float).max)
    assert out["interaction_energy"].values[0] == -np.inf
