"""Review of how a run knows it is resolved: the stored spectral tail against an FFT of the stored density,
resolved_until against the tails, the kernel's resolution rule against mpmath's Bessel functions and the rate at
the lmax it names against an independent quadrature, and the spectral filter's effect on that verdict."""

import warnings

import mpmath
import numpy as np
import pytest
import torch
from conftest import identity, make_case

import spherepde
from solvers.forward_problem import ForwardProblem
from spherepde.kernels.funk_hecke import kernel_degree

# S^1, B = V = I, beta = 1, eps = 0: a vMF law of kappa 1 concentrating; lmax 16 holds it to t = 0.5 (tail 6e-8) and
# loses it by t = 1 (1.5e-5).
CONCENTRATING = {"dim": 2, "lmax": 16, "model": {"B": identity(2), "V": identity(2)},
                 "time": {"t_end": 1.0, "dt": 0.01, "save_every": 0.5}}


def run_quietly(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return spherepde.run(case, progress=False)


def fourier_coefficients(density: np.ndarray, lmax: int) -> np.ndarray:
    """c_k, k = 0..lmax, of a density on equispaced circle points (rho = sum_k c_k e^{ik theta}, c_{-k} = conj c_k)."""
    return np.fft.rfft(density)[:lmax + 1] / density.size


def l2_norm(c: np.ndarray) -> float:
    """||rho|| / sqrt(2 pi) of the real series with coefficients c_k, k >= 0 (Parseval: c_{-k} counted too)."""
    return float(np.sqrt(np.abs(c[0]) ** 2 + 2 * (np.abs(c[1:]) ** 2).sum()))


def test_spectral_tail_and_resolved_until_are_the_stored_densitys():
    """The stored spectral_tail is ||rho_{l > 2 lmax / 3}|| / ||rho|| of the stored density (own FFT, to 1e-9
    relative: 1.2e-11, 6.1e-8, 1.5e-5), and resolved_until the last save whose tail is within tail_tol (0.5)."""
    dataset = run_quietly(make_case(**CONCENTRATING))
    lmax = dataset.attrs["lmax"]
    tails = []
    for density in dataset["density"].values:
        c = fourier_coefficients(density, lmax)
        tails.append(l2_norm(np.where(np.arange(lmax + 1) > 2 * lmax / 3, c, 0)) / l2_norm(c))
    assert np.allclose(dataset["spectral_tail"].values, tails, rtol=1e-9, atol=1e-16)
    assert tails[1] < 1e-6 < tails[2]
    assert dataset.attrs["resolved_until"] == 0.5
    assert np.allclose(dataset["min_density"].values, dataset["density"].values.min(axis=1), rtol=0, atol=0)


def test_a_spectral_filter_does_not_hide_the_loss_of_resolution():
    """filter_order = 8 at lmax 16 damps degree 9 by 0.70 a step, 100 steps a unit time: the filtered density at
    t = 0.5 is 3.3e-4 (relative L2) from the unfiltered one, itself 9e-12 from lmax 128's, while its tail, taken after
    the filter, reads 2e-12.  The run said resolved to t = 2.5 (at t = 2 its density 6% off); now the filter's take
    over the interval (7.4e-4) ends the resolution after t = 0."""
    plain = run_quietly(make_case(**CONCENTRATING))
    filtered = run_quietly(make_case(**CONCENTRATING, solver={"filter_order": 8}))
    lmax = plain.attrs["lmax"]
    c_plain, c_filtered = (fourier_coefficients(run["density"].values[1], lmax) for run in (plain, filtered))
    departure = l2_norm(c_filtered - c_plain) / l2_norm(c_plain)
    assert 1e-4 < departure < 1e-3
    assert filtered["spectral_tail"].values[1] < 1e-10
    assert filtered.attrs["resolved_until"] == 0.0
    assert "solver.filter_order = 8" in filtered.attrs["notes"]


def test_a_harmless_filter_keeps_the_run_resolved():
    """Noisy Kuramoto (eps 0.25) at lmax 32: filter_order 16 changes the density by < 1e-10 of the unfiltered run's
    and the run stays resolved to the end."""
    section = {"dim": 2, "lmax": 32, "model": {"kernel": "unnormalized", "beta": 0.0, "V": identity(2), "eps": 0.25},
               "time": {"t_end": 1.0, "dt": 0.05, "save_every": 0.5}}
    plain = run_quietly(make_case(**section))
    filtered = run_quietly(make_case(**section, solver={"filter_order": 16}))
    assert np.abs(filtered["density"].values - plain["density"].values).max() < 1e-10
    assert filtered.attrs["resolved_until"] == "end"


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("kappa", [0.1, 5.0, 30.0, 200.0])
@pytest.mark.parametrize("tol", [1e-6, 1e-10, 1e-14])
def test_kernel_degree_is_where_the_bessel_ratio_falls_below_tol(dim, kappa, tol):
    """The smallest l with lambda_l / lambda_0 < tol, lambda_l = 2 pi I_l(kappa) (S^1) or 4 pi i_l(kappa) (S^2),
    from mpmath's Bessel functions."""
    shift = 0 if dim == 2 else mpmath.mpf(1) / 2
    first = mpmath.besseli(shift, kappa)
    degree = 0
    while mpmath.besseli(degree + shift, kappa) / first >= tol:
        degree += 1
    assert kernel_degree(kappa, dim, tol) == degree


def own_softmax_rate(theta: np.ndarray, beta: float, B: np.ndarray, V: np.ndarray, lmax: int, n: int = 4096):
    """-d/dtheta (rho v_theta) projected on |k| <= lmax at the angles theta, for rho the vMF law of kappa 1 about e1
    and the softmax velocity v = P_x V (int exp(beta <x, B y>) y rho dy / int exp(beta <x, B y>) rho dy), by the
    trapezoid rule on n points."""
    angles = 2 * np.pi * np.arange(n) / n
    x = np.stack([np.cos(angles), np.sin(angles)], 1)
    rho = np.exp(x[:, 0])
    rho /= rho.sum() * 2 * np.pi / n
    logits = beta * x @ B @ x.T
    weights = np.exp(logits - logits.max(1, keepdims=True)) * rho
    mean = weights @ x / weights.sum(1, keepdims=True)
    v_theta = np.einsum("ij,ij->i", np.stack([-x[:, 1], x[:, 0]], 1), mean @ V.T)
    k = np.fft.fftfreq(n, 1 / n)
    rate = np.where(np.abs(k) <= lmax, -1j * k * np.fft.fft(rho * v_theta) / n, 0)
    return np.real(np.exp(1j * np.outer(theta, k)) @ rate)


def test_the_lmax_a_kernel_refusal_names_carries_the_kernel_to_kernel_tol():
    """beta = 10, B general (sigma_max 1.08): lmax 11 is refused for lmax 12, and at 12 the rate d rho / dt of a vMF
    law matches an independent trapezoid quadrature to 1.1e-13 (max |rate| 0.18; kernel_tol 1e-10)."""
    B, V = np.array([[1.0, 0.3], [-0.2, 0.8]]), np.array([[1.0, 0.5], [0.0, 1.2]])
    model = {"B": B.tolist(), "V": V.tolist(), "beta": 10.0}
    with pytest.raises(spherepde.CaseError, match="use lmax >= 12"):
        ForwardProblem(make_case(dim=2, lmax=11, model=model))
    problem = ForwardProblem(make_case(dim=2, lmax=12, model=model))
    state = problem.initial()
    rate = torch.as_tensor(np.asarray(problem.transport(state, problem.layer_drives()[0])))
    on_grid = problem.basis.synthesis(problem.coefficients(rate))[0].double().numpy()
    points = problem.basis.points.reshape(-1, 2).double().numpy()
    own = own_softmax_rate(np.arctan2(points[:, 1], points[:, 0]), 10.0, B, V, 12)
    assert np.abs(on_grid - own).max() < 1e-11 * np.abs(own).max()
