"""Convergence orders of the time steppers on problems with known solutions, their stability bounds, and
their adjoints."""

import math
import re

import numpy as np
import pytest
import torch

from spherepde.discretisation.timesteppers import SCHEMES, RungeKutta, stability_bound
from spherepde.io import case_schema


def _solve(scheme, lam, nonlinear, c0, t_end, steps):
    """c' = lam c + N(t, c) from c0 over [0, t_end]; lam, c0 of shape (N,) (one member)."""
    rk = RungeKutta(scheme)
    c, dt = c0.clone()[None], t_end / steps
    factors = rk.factors(lam[None], dt)
    for n in range(steps):
        c = rk.step(c, lambda i, u, t=n * dt: nonlinear(t + rk.fractions[i] * dt, u), factors)
    return c[0]


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


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("direction", [1j, -1])
def test_stability_bound_is_where_a_mode_starts_to_grow(scheme, direction):
    """A mode u' = y direction u taken by the explicit stages alone (lam = 0; a Fourier mode carried at a constant
    speed for direction = i, as u' = y J u with J the rotation by pi / 2; a decaying one for -1) is multiplied by
    |R(y direction)| in a unit step: at most 1 up to the bound, above 1 just past it.  RK4's bounds are 2 sqrt 2
    (|R(iy)|^2 = 1 - y^6 / 72 + y^8 / 576) and 2.785293563 on the negative real axis."""
    bound = stability_bound(scheme, direction)
    rk = RungeKutta(scheme)
    start = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    factors = rk.factors(torch.zeros_like(start), 1.0)

    def amplification(y):
        turn = torch.tensor([[direction.real, direction.imag], [-direction.imag, direction.real]], dtype=torch.float64)
        return float(rk.step(start, lambda i, u: y * u @ turn, factors).norm())

    assert all(amplification(y) <= 1 + 1e-13 for y in np.linspace(0, bound, 201)[1:])
    assert amplification(1.001 * bound) > 1 + 1e-4
    if scheme in ("rk4", "lawson-rk4"):
        assert abs(bound - (2 * math.sqrt(2) if direction == 1j else 2.785293563405)) <= 1e-12
    if direction == 1j:
        schema = " ".join(case_schema.__doc__.split())  # the bounds the case reference states at time.dt
        assert re.search(rf"{bound:.2f} \([^)]*\b{scheme}\b", schema), f"{bound:.2f} ({scheme})"


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


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_adjoint_is_the_transpose_of_the_step(scheme):
    """<b, dS(c)[e]> = <S(c)^T b, e> for the step S of u' = lam u + u^2 / 2 + 0.3 u_0 (two members, their own dt),
    the directional derivative by central differences (h = 1e-6: error ~1e-11)."""
    rk = RungeKutta(scheme)
    generator = torch.Generator().manual_seed(4)
    lam = -torch.rand(2, 5, generator=generator, dtype=torch.float64) * 3
    dt = torch.tensor([[0.1], [0.07]], dtype=torch.float64)
    factors = rk.factors(lam, dt)
    coupling = torch.zeros(5, dtype=torch.float64)
    coupling[0] = 0.3

    def rate(i, u):
        return 0.5 * u * u + u[:, :1] * coupling

    def rate_vjp(i, u, e):
        return e * u + (e * coupling).sum(1, keepdim=True) * (torch.arange(5) == 0)

    c = torch.rand(2, 5, generator=generator, dtype=torch.float64)
    b, e = (torch.randn(2, 5, generator=generator, dtype=torch.float64) for _ in range(2))
    stages = []
    rk.step(c, rate, factors, stages)
    transposed = rk.adjoint(b, stages, rate_vjp, factors)
    h = 1e-6
    derivative = (rk.step(c + h * e, rate, factors) - rk.step(c - h * e, rate, factors)) / (2 * h)
    assert float((b * derivative).sum()) == pytest.approx(float((transposed * e).sum()), rel=1e-9)


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("name", ["imex-ark436", "imex-ars443"])
def test_stiff_diffusion_step_in_float32_is_its_stability_function_to_round_off(library, name):
    """dc/dt = lam c, dt lam = -z: one step is R(-z) c, with |R| <= 1e-5 for these L-stable schemes at z >= 1e6.
    The update summed c + sum_j (b_j E_j + bi_j I_j) with I_j = -z U_j of the size z |c|: in numpy float32 that
    cancellation left 0.2 |c| at z = 1e8 and 27 |c| at 1e10 (the S^1 heat equation at eps = 1e8, lmax 32, dt 0.05
    ended 13% off the uniform density).  A stiffly accurate scheme now updates from its last stage: float32 round-off
    of |c| (float64's R to 1e-15 relative, computed in float64 here as the reference)."""
    rng = np.random.default_rng(0)
    start = rng.standard_normal((2, 64))
    scheme = RungeKutta(name)
    for z in (1e6, 1e8, 1e10, 1e12):
        exact = scheme.step(torch.tensor(start), lambda i, U: 0 * U,
                            scheme.factors(torch.full((2, 64), -z, dtype=torch.float64), 1.0))
        factors = scheme.factors(torch.full((2, 64), -z, dtype=torch.float32), 1.0)
        c = torch.tensor(start, dtype=torch.float32)
        if library == "numpy":
            factors, c = factors.on(np), c.numpy()
        stepped = np.asarray(scheme.step(c, lambda i, U: 0 * U, factors), dtype=np.float64)
        assert np.abs(stepped - exact.numpy()).max() <= 1e-6 * np.abs(start).max(), z
        assert np.abs(exact.numpy()).max() <= 1e-5 * np.abs(start).max()
