"""Convergence orders of the time steppers on problems with known solutions."""

import math

import numpy as np
import pytest
import torch

from solvers.timesteppers import SCHEMES, make_stepper


def _solve(scheme, lam, nonlinear, c0, t_end, steps):
    step = make_stepper(scheme)
    c, dt = c0.clone(), t_end / steps
    for n in range(steps):
        c = step(lam, nonlinear, n * dt, c, dt)
    return c


def _observed_order(scheme, lam, nonlinear, c0, exact, t_end=1.0, steps=(10, 20, 40, 80)):
    errors = [float((_solve(scheme, lam, nonlinear, c0, t_end, n) - exact).abs().max()) for n in steps]
    return -np.polyfit(np.log(steps), np.log(errors), 1)[0], errors


# A stiff linear part with a forcing, in closed form:
# u' = lam u + (cos t - lam sin t)  has u = sin t + e^{lam t} u0.
def _forced(lam_value):
    lam = torch.tensor([lam_value], dtype=torch.float64)

    def nonlinear(t, u):
        return torch.full_like(u, math.cos(t) - lam_value * math.sin(t))

    c0 = torch.tensor([0.7], dtype=torch.float64)
    exact = math.sin(1.0) + math.exp(lam_value) * 0.7
    return lam, nonlinear, c0, exact


@pytest.mark.parametrize("scheme, order", [("imex-ark436", 4), ("imex-ars443", 3), ("rk4", 4), ("lawson-rk4", 4)])
def test_order_on_forced_linear_problem(scheme, order):
    lam, nonlinear, c0, exact = _forced(-2.0)
    observed, errors = _observed_order(scheme, lam, nonlinear, c0, exact)
    assert observed > order - 0.25, (observed, errors)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_tableaux_are_consistent(scheme):
    """Row sums equal the stage times and the weights sum to 1 (rational arithmetic; the published
    ARK4(3)6L explicit rows are 13-digit rational approximations, exact to ~1e-26)."""
    tableau = SCHEMES[scheme][1]
    for i in range(tableau.stages):
        assert abs(sum(tableau.a[i]) - tableau.c[i]) < 1e-20
        if tableau.a_implicit:
            assert abs(sum(tableau.a_implicit[i]) - tableau.c[i]) < 1e-20
    assert abs(sum(tableau.b) - 1) < 1e-20


@pytest.mark.parametrize("scheme, order", [("imex-ark436", 4), ("imex-ars443", 3)])
def test_imex_order_on_nonlinear_problem(scheme, order):
    # u' = -u + u^2 (logistic-type Bernoulli equation): u = 1 / (1 + (1/u0 - 1) e^t).
    lam = torch.tensor([-1.0], dtype=torch.float64)
    u0 = 0.3
    exact = 1 / (1 + (1 / u0 - 1) * math.exp(1.0))
    observed, errors = _observed_order(scheme, lam, lambda t, u: u * u,
                                       torch.tensor([u0], dtype=torch.float64), exact)
    assert observed > order - 0.25, (observed, errors)


def test_lawson_is_exact_for_pure_diffusion():
    lam = -torch.arange(6, dtype=torch.float64) ** 2 * 0.3
    c0 = torch.ones(6, dtype=torch.float64)
    c = _solve("lawson-rk4", lam, lambda t, u: torch.zeros_like(u), c0, 2.0, 7)
    assert torch.allclose(c, torch.exp(2.0 * lam), rtol=1e-14, atol=0)


def test_imex_is_unconditionally_stable_for_stiff_diffusion():
    lam = torch.tensor([-1e8], dtype=torch.float64)
    c = _solve("imex-ars443", lam, lambda t, u: torch.zeros_like(u), torch.ones(1, dtype=torch.float64), 1.0, 10)
    assert abs(float(c[0])) < 1e-6
