"""Initial laws against closed forms computed here, not by the package: the von Mises-Fisher density
C_d(kappa) exp(kappa <mu, x>), C_d = kappa^{d/2-1} / ((2 pi)^{d/2} I_{d/2-1}(kappa)), its mean resultant length
A_d(kappa) = I_{d/2}(kappa) / I_{d/2-1}(kappa) and the law of w = <mu, x> (von Mises on S^1; on S^2
P(1 - w <= s) = (1 - e^{-kappa s}) / (1 - e^{-2 kappa})); the samplers' draws against them by Kolmogorov-Smirnov
bounds and standard errors of the sample size; a stored density held to the same resolution bound as an
analytic law."""

import math

import numpy as np
import pytest
import torch
import xarray as xr
from conftest import make_case
from scipy import stats
from scipy.special import ive

from spherepde.base.device import placement
from spherepde.base.digest import file_sha256
from spherepde.base.errors import CaseError
from spherepde.discretisation.bases import make_basis
from spherepde.model.initial import initial_density
from spherepde.model.sampling import initial_particles

CPU64 = placement("cpu", "float64")
SAMPLES = 100_000
# the Kolmogorov-Smirnov statistic exceeds KS_BOUND / sqrt(n) with probability 1e-3 (asymptotic)
KS_BOUND = stats.kstwobign.isf(1e-3)


def vmf_closed_form(points: np.ndarray, mean, kappa: float) -> np.ndarray:
    """C_d(kappa) exp(kappa <mu, x>) with I_nu from the exponentially scaled ive (no overflow at large kappa)."""
    dim = points.shape[-1]
    mu = np.asarray(mean, dtype=float) / np.linalg.norm(mean)
    nu = dim / 2 - 1
    log_normaliser = nu * math.log(kappa) - dim / 2 * math.log(2 * math.pi) - math.log(ive(nu, kappa)) - kappa
    return np.exp(log_normaliser + kappa * (points @ mu))


def mean_resultant_length(kappa: float, dim: int) -> float:
    return ive(dim / 2, kappa) / ive(dim / 2 - 1, kappa)


def w_cdf(w: np.ndarray, kappa: float, dim: int) -> np.ndarray:
    """P(<mu, x> <= w) on S^2, or on S^1 the von Mises law of the angle from mu (w then that angle)."""
    if dim == 2:
        return stats.vonmises(kappa).cdf(w)
    return (np.exp(-kappa * (1 - w)) - np.exp(-2 * kappa)) / -np.expm1(-2 * kappa)


MEANS = {2: [3.0, -4.0], 3: [0.2, -1.0, 0.7]}  # not unit: the case makes them so


@pytest.mark.parametrize("dim, lmax", [(2, 64), (3, 40)])
@pytest.mark.parametrize("kappa", [1e-8, 0.5, 12.0])
def test_eulerian_vmf_density_is_the_closed_form_with_its_mean_resultant_length(dim, lmax, kappa):
    """rho_0 on the grid of a vmf case (mean given unnormalised) is C_d exp(kappa <mu, x>) to round-off, with mass 1
    and first moment A_d(kappa) mu."""
    case = make_case(dim=dim, lmax=lmax, initial={"kind": "vmf", "mean": MEANS[dim], "kappa": kappa})
    basis = make_basis(dim, lmax, CPU64)
    rho = basis.synthesis(initial_density(case["initial"], basis)).numpy()
    points = basis.points.numpy()
    expected = vmf_closed_form(points, MEANS[dim], kappa)
    assert np.abs(rho - expected).max() <= 1e-13 * expected.max()
    mass = np.broadcast_to(basis.weights.numpy(), rho.shape) * rho  # the grid's quadrature
    assert abs(mass.sum() - 1) <= 1e-13
    first_moment = (mass[..., None] * points).reshape(-1, dim).sum(0)
    mu = np.asarray(MEANS[dim]) / np.linalg.norm(MEANS[dim])
    assert np.abs(first_moment - mean_resultant_length(kappa, dim) * mu).max() <= 1e-13


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("kappa, seed", [(1e-8, 0), (4.0, 1), (1e4, 2)])
def test_sampled_vmf_tokens_follow_the_law_of_w_and_its_mean_resultant_length(dim, kappa, seed):
    """particles drawn for a vmf case: unit vectors; w = <mu, x> (the angle from mu on S^1) within the KS bound of
    its closed-form law, and the mean of w within 5 standard errors of A_d(kappa)."""
    case = make_case(dim=dim, initial={"kind": "vmf", "mean": MEANS[dim], "kappa": kappa})
    x = initial_particles(case["initial"], dim, SAMPLES, torch.Generator().manual_seed(seed)).numpy()
    assert np.abs(np.linalg.norm(x, axis=1) - 1).max() <= 1e-14
    mu = np.asarray(MEANS[dim]) / np.linalg.norm(MEANS[dim])
    w = x @ mu
    statistic = np.arctan2(x @ np.array([-mu[1], mu[0]]), w) if dim == 2 else w
    assert stats.kstest(statistic, lambda s: w_cdf(s, kappa, dim)).statistic <= KS_BOUND / math.sqrt(SAMPLES)
    assert abs(w.mean() - mean_resultant_length(kappa, dim)) <= 5 * w.std() / math.sqrt(SAMPLES)


@pytest.mark.parametrize("dim", [2, 3])
def test_unnormalised_mixture_weights_give_the_same_law_to_density_and_particles(dim):
    """weights [3, 1] are the mixture 3/4 vMF_1 + 1/4 vMF_2 on the grid (to round-off) and in the draws (the first
    moment within 5 standard errors of 3/4 A(8) mu_1 + 1/4 A(2) mu_2); the same seed gives the same tokens bit for
    bit."""
    means = [MEANS[dim], [-1.0] + [0.5] * (dim - 1)]
    section = {"kind": "vmf_mixture", "means": means, "kappas": [8.0, 2.0], "weights": [3.0, 1.0]}
    case = make_case(dim=dim, lmax=40, initial=section)
    units = [np.asarray(m) / np.linalg.norm(m) for m in means]
    basis = make_basis(dim, 40, CPU64)
    rho = basis.synthesis(initial_density(case["initial"], basis)).numpy()
    points = basis.points.numpy()
    expected = 0.75 * vmf_closed_form(points, means[0], 8.0) + 0.25 * vmf_closed_form(points, means[1], 2.0)
    assert np.abs(rho - expected).max() <= 1e-13 * expected.max()
    first_moment = 0.75 * mean_resultant_length(8.0, dim) * units[0] + 0.25 * mean_resultant_length(2.0, dim) * units[1]
    x = initial_particles(case["initial"], dim, SAMPLES, torch.Generator().manual_seed(3))
    assert torch.equal(x, initial_particles(case["initial"], dim, SAMPLES, torch.Generator().manual_seed(3)))
    x = x.numpy()
    assert np.abs(x.mean(0) - first_moment).max() <= 5 * x.std(0).max() / math.sqrt(SAMPLES)


def test_a_stored_density_truncated_beyond_the_initial_tail_bound_is_refused(tmp_path):
    """A vMF density of kappa 15 on S^1 stored at lmax 48 and read onto lmax 6 keeps the degrees up to 6 of
    I_k(15) / I_0(15), whose top third holds sqrt(sum_{k=5,6} 2 c_k^2 / sum_{k<=6} N_k c_k^2) = 0.28 of the norm:
    beyond the 0.2 that refuses the same law given as kind = "vmf".  It ran, warned only, from a density that dips
    to -0.04; at lmax 12 (tail 0.04) it runs."""
    kappa, source = 15.0, make_basis(2, 48, CPU64)
    density = vmf_closed_form(source.points.numpy(), [1.0, 0.0], kappa)
    path = tmp_path / "stored.nc"
    xr.Dataset({"density": (("time", "theta"), density[None])}, attrs={"lmax": 48}).to_netcdf(path)
    section = {"kind": "file", "path": str(path), "time": 0, "sha256": file_sha256(str(path))}

    degrees = np.arange(7)
    norm = (ive(degrees, kappa) / ive(0, kappa)) ** 2 * np.where(degrees > 0, 2, 1)
    tail = math.sqrt(norm[5:].sum() / norm.sum())
    assert 0.2 < tail < 0.3
    with pytest.raises(CaseError, match=f"spectral tail {tail:.2g} > 0.2 at t = 0\\): raise sphere.lmax$"):
        initial_density(section, make_basis(2, 6, CPU64))
    with pytest.raises(CaseError, match=f"spectral tail {tail:.2g} > 0.2"):
        initial_density({"kind": "vmf", "mean": [1.0, 0.0], "kappa": kappa}, make_basis(2, 6, CPU64))
    fine = make_basis(2, 12, CPU64)
    rho = fine.synthesis(initial_density(section, fine)).numpy()
    k = np.arange(1, 13)
    truncated = (1 + 2 * (ive(k, kappa) / ive(0, kappa)) @ np.cos(np.outer(k, fine.theta.numpy()))) / (2 * math.pi)
    assert np.abs(rho - truncated).max() <= 1e-13 * truncated.max()
