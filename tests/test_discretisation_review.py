"""Independent checks of the discretisation: the Legendre tables against scipy's spherical harmonics, the Gauss
quadrature's degree of exactness, the Funk-Hecke weights against a direct quadrature of their defining integral,
and the attention mean of a von Mises-Fisher law against its closed form, by both fields."""

import numpy as np
import pytest
import scipy.special as sp
import torch

from spherepde.base.device import placement
from spherepde.discretisation.bases import make_basis
from spherepde.discretisation.transforms.legendre import gauss_legendre, legendre_values
from spherepde.kernels.choice import make_exp_kernel
from spherepde.kernels.funk_hecke import funk_hecke

CPU64 = placement("cpu", "float64")


@pytest.mark.parametrize("lmax", [2, 7, 31])
def test_legendre_tables_are_scipys_orthonormal_harmonics_with_the_condon_shortley_phase(lmax):
    """Pbar_lm(cos theta) = Y_lm(theta, 0) of scipy.special.sph_harm_y (orthonormal, (-1)^m phase), zero for l < m."""
    theta = np.linspace(1e-3, np.pi - 1e-3, 29)
    table = legendre_values(lmax, np.cos(theta))
    order, degree = np.meshgrid(np.arange(lmax + 1), np.arange(lmax + 1), indexing="ij")
    reference = np.where((degree >= order)[..., None],
                         sp.sph_harm_y(degree[..., None], order[..., None], theta, 0.0).real, 0.0)
    # 1e-12: near the poles Pbar_l0 has slope l (l + 1) / 2 in cos(theta), so rounding cos(theta) costs ~ l^2 eps
    assert np.abs(table - reference).max() < 1e-12


@pytest.mark.parametrize("nlat", [3, 8, 194, 768])
def test_gauss_quadrature_is_exact_to_degree_2_nlat_minus_1_and_not_beyond(nlat):
    x, w = gauss_legendre(nlat)
    moments = np.array([w @ sp.eval_legendre(k, x) for k in range(2 * nlat + 1)])
    assert abs(moments[0] - 2) < 2e-15 and np.abs(moments[1:2 * nlat]).max() < 2e-15
    assert abs(moments[2 * nlat]) > 1e-2  # P_{2 nlat} is not integrated exactly


@pytest.mark.parametrize("kappa", [1e-6, 0.3, 10.0, 300.0, 2000.0])
def test_funk_hecke_weights_are_the_scaled_integrals_of_the_kernel(kappa):
    """exp(-kappa) 2 pi int_{-1}^{1} exp(kappa t) P_l(t) dt (S^2) and exp(-kappa) int_0^{2 pi} exp(kappa cos t)
    cos(l t) dt (S^1) by quadrature: Gauss-Legendre on [-1, 1] split where exp(kappa (t - 1)) lives, the trapezoid
    rule (spectrally accurate for the periodic integrand) on the circle."""
    degree = np.arange(0, 41)
    nodes, weights = np.polynomial.legendre.leggauss(200)
    low = max(-1.0, 1 - 60 / kappa)
    pieces = [(-1.0, low), (low, 1.0)] if low > -1 else [(-1.0, 1.0)]
    sphere = sum(np.pi * (b - a) * (weights * np.exp(kappa * (t - 1))) @ sp.eval_legendre(degree[None, :], t[:, None])
                 for a, b in pieces for t in [(b - a) / 2 * nodes + (a + b) / 2])
    angle = 2 * np.pi * np.arange(4096) / 4096
    circle = (2 * np.pi / 4096) * np.exp(kappa * (np.cos(angle) - 1)) @ np.cos(np.outer(angle, degree))
    for dim, reference in ((3, sphere), (2, circle)):
        mu = funk_hecke(dim, kappa, degree)
        significant = reference > 1e-250
        assert np.abs(mu - reference)[significant].max() <= 1e-12 * reference[0]


def von_mises_fisher_mean(dim: int, u: np.ndarray) -> np.ndarray:
    """m = int exp(<u, y>) y dsigma / int exp(<u, y>) dsigma: (coth s - 1/s) u/s on S^2, I_1(s) / I_0(s) u/s on S^1."""
    s = np.linalg.norm(u, axis=-1)
    ratio = 1 / np.tanh(s) - 1 / s if dim == 3 else sp.ive(1, s) / sp.ive(0, s)
    return (ratio / s)[:, None] * u


@pytest.mark.parametrize("field", ["dense", "spectral"])
@pytest.mark.parametrize("dim, lmax, B", [
    (3, 16, np.eye(3)), (3, 16, np.diag([-1.0, -1.0, 1.0])),
    (3, 16, np.array([[0.9, -0.4, 0.3], [0.2, 1.1, -0.5], [-0.6, 0.1, 0.7]])),
    (3, 16, np.eye(3) - 2 * np.outer([0.2, 0.5, -0.7], [0.2, 0.5, -0.7]) / 0.78),
    (2, 32, np.eye(2)), (2, 32, np.array([[0.9, -0.4], [0.3, 0.6]]))])
def test_the_attention_mean_of_a_von_mises_fisher_law_is_its_closed_form(field, dim, lmax, B):
    """For rho ~ exp(kappa <mu, y>) the softmax mean N / Z at x is the mean of the vMF law of parameter
    u = beta B^T x + kappa mu (exp(beta <x, B y>) rho(y) ~ exp(<u, y>)), for any B: its tangent part to 1e-12."""
    beta, kappa = 3.0, 2.0
    mu = np.array([0.3, -0.4, np.sqrt(0.75)])[:dim] if dim == 3 else np.array([0.6, 0.8])
    basis = make_basis(dim, lmax, CPU64)
    x = basis.points.reshape(-1, dim).numpy()
    rho = np.exp(kappa * (x @ mu - 1))
    channels = np.concatenate([rho[:, None], rho[:, None] * x], axis=1).reshape(*basis.grid_shape, dim + 1)
    kernel = make_exp_kernel(basis, torch.tensor(B), beta, field, 1e-10)
    scaled = kernel(torch.tensor(channels))[0].reshape(-1, dim + 1).numpy()
    error = scaled[:, 1:] / scaled[:, :1] - von_mises_fisher_mean(dim, beta * x @ B + kappa * mu)
    tangent = error - np.sum(error * x, axis=1, keepdims=True) * x
    assert np.abs(tangent).max() < 1e-12
