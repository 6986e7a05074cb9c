"""Initial densities rho_0 (w.r.t. the surface measure sigma) from the [initial] section.

von Mises-Fisher on S^{d-1}:  rho(x) = C_d(kappa) exp(kappa <mu, x>),
    C_2 = 1 / (2 pi I_0(kappa)),   C_3 = kappa / (4 pi sinh kappa),
evaluated as exp(kappa (<mu, x> - 1) + log C_d + kappa) so that large kappa does not overflow.

Projected Gaussian on S^{d-1}: the law of u = X / |X|, X ~ N(m, S) in R^d, whose density is
    rho(u) = int_0^inf r^{d-1} phi_S(r u - m) dr
           = (2 pi)^{-d/2} det(S)^{-1/2} exp(-c/2) int_0^inf r^{d-1} exp(-a r^2/2 + b r) dr,
    a = u^T S^-1 u,  b = u^T S^-1 m,  c = m^T S^-1 m.
With S = L L^T, w = L^-1 u, nu = L^-1 m and r = s / sqrt(a), tau = b / sqrt(a):
    rho(u) = (2 pi)^{-d/2} det(L)^{-1} a^{-d/2} exp(-(|nu_perp|^2 + min(tau, 0)^2) / 2) K~_{d-1}(tau),
where nu_perp = nu - (b / a) w (so c - tau^2 = |nu_perp|^2 >= 0 without cancellation) and
K~_n(tau) = exp(-max(tau, 0)^2 / 2) K_n(tau), K_n(tau) = int_0^inf s^n exp(-s^2/2 + tau s) ds.
The exponent is <= 0 and K~_n grows only like max(tau, 0)^n, so nothing overflows, and nothing
underflows where the density itself does not.
"""

import math

import numpy as np
import torch
import xarray as xr
from scipy.special import ive

from spherepde.base.digest import file_sha256
from spherepde.base.errors import CaseError, damaged, unreadable
from spherepde.discretisation.transforms.legendre import LMAX_LIMIT
from spherepde.kernels.funk_hecke import funk_hecke, kernel_degree


def vmf_log_normaliser(kappa: float, dim: int) -> float:
    """log C_d(kappa) + kappa (the exponentially scaled normaliser) for d = 2, 3.

    On S^2, C_3 e^kappa = kappa / (2 pi (1 - e^{-2 kappa})), with 1 - e^{-2 kappa} = -expm1(-2 kappa): written as
    log1p(-exp(-2 kappa)) it lost the digits of kappa below 1 (2e-5 of the mass at kappa = 1e-12) and failed for
    kappa < 6e-17, where exp(-2 kappa) rounds to 1."""
    if kappa == 0:
        return math.log(1 / (2 * math.pi) if dim == 2 else 1 / (4 * math.pi))
    if dim == 2:
        return -math.log(2 * math.pi * ive(0, kappa))
    return math.log(kappa / -math.expm1(-2 * kappa)) - math.log(2 * math.pi)


def vmf_density(points: torch.Tensor, mean, kappa: float) -> torch.Tensor:
    """vMF density at `points` (..., d) with unit mean direction `mean` and concentration kappa."""
    mu = torch.as_tensor(mean, dtype=points.dtype, device=points.device)
    return torch.exp(kappa * (points @ mu - 1) + vmf_log_normaliser(kappa, points.shape[-1]))


RECURSION_SWITCH = -3.0  # tau below which K_n comes from the continued fraction
FRACTION_DEPTH = 64  # levels of the continued fraction below the highest ratio needed


def scaled_radial_moment(n: int, tau: torch.Tensor) -> torch.Tensor:
    """K~_n(tau) = exp(-max(tau, 0)^2 / 2) int_0^inf s^n exp(-s^2/2 + tau s) ds, elementwise.

    K_0 = sqrt(pi/2) exp(tau^2/2) erfc(x), x = -tau/sqrt 2, K_1 = 1 + tau K_0, K_j = (j-1) K_{j-2} + tau K_{j-1}
    (n >= 1). The scaled K~_0 is sqrt(pi/2) erfc(x) for tau > 0 and sqrt(pi/2) erfcx(x) for tau <= 0,
    and K~_j obeys the same recursion with 1 replaced by exp(-max(tau, 0)^2/2). For tau >= 0 all its
    terms are positive. For tau < 0, K_n is the recursion's minimal solution and the forward
    recursion cancels (about 2n log10|tau| digits), so for tau < RECURSION_SWITCH the ratios
    K_j / K_{j-1} come from the backward continued fraction
        K_j / K_{j-1} = j / (K_{j+1} / K_j - tau),
    started FRACTION_DEPTH levels deeper at its fixed point (tau + sqrt(tau^2 + 4j)) / 2.
    Against 60-digit values the relative error is below 7e-15 (n = 1), 4e-14 (n = 2) and 8e-12 (n <= 6) on
    tau in [-40, 30], the largest just above RECURSION_SWITCH, where the forward recursion cancels most.
    """
    x = -tau / math.sqrt(2)
    k0 = math.sqrt(math.pi / 2) * torch.where(x < 0, torch.special.erfc(x), torch.special.erfcx(x))
    forward = [k0, torch.exp(-tau.clamp(min=0) ** 2 / 2) + tau * k0]  # K~_0, K~_1, then upwards
    for j in range(2, n + 1):
        forward.append((j - 1) * forward[-2] + tau * forward[-1])
    far = tau.clamp(max=RECURSION_SWITCH)
    top = n + FRACTION_DEPTH
    ratio = (far + torch.sqrt(far * far + 4 * (top + 1))) / 2
    backward = k0
    for j in range(top, 0, -1):
        ratio = j / (ratio - far)
        if j <= n:
            backward = backward * ratio
    return torch.where(tau < RECURSION_SWITCH, backward, forward[n])


def projected_gaussian_density(points: torch.Tensor, mean, covariance) -> torch.Tensor:
    """Density on S^{d-1} (w.r.t. the surface measure) of X / |X|, X ~ N(mean, covariance); see the module doc."""
    dim = points.shape[-1]
    factor = torch.linalg.cholesky(torch.as_tensor(covariance, dtype=torch.float64))  # L, S = L L^T
    log_constant = -dim / 2 * math.log(2 * math.pi) - float(torch.log(torch.diagonal(factor)).sum())
    inverse_factor = torch.linalg.solve_triangular(factor, torch.eye(dim, dtype=torch.float64), upper=False)
    inverse_factor = inverse_factor.to(dtype=points.dtype, device=points.device)
    w = points @ inverse_factor.T
    nu = inverse_factor @ torch.as_tensor(mean, dtype=points.dtype, device=points.device)
    a = (w * w).sum(-1)
    b = w @ nu
    tau = b / torch.sqrt(a)
    nu_perp = nu - (b / a)[..., None] * w
    exponent = -((nu_perp * nu_perp).sum(-1) + tau.clamp(max=0) ** 2) / 2 - dim / 2 * torch.log(a)
    return torch.exp(exponent + log_constant) * scaled_radial_moment(dim - 1, tau)


# Largest |quadrature mass - 1| of an analytic rho_0 on the grid: beyond it the grid does not represent rho_0
# (a law narrower than the node spacing, falling between the nodes), and the run would start from another density.
INITIAL_MASS_TOLERANCE = 1e-2
# A grid on which a fifth of rho_0's L2 norm lies in the top third of the degrees does not carry the law, and the
# run is refused; above diagnostics.tail_tol (1e-6 by default) and below this it runs, with its warning and
# resolved_until = 0: a truncated law is still evolved exactly by a linear flow (the heat-equation order tests
# start vMF laws of kappa 8 on lmax 8 at 0.07-0.10 on purpose).  Every shipped case starts below 1e-9; the
# quick-start at lmax 4 would start at 0.24.
INITIAL_TAIL_TOLERANCE = 0.2


def initial_density(section: dict, basis, tail_tol: float = 1e-6) -> torch.Tensor:
    """Spectral coefficients of rho_0 on `basis`; a CaseError when the grid cannot represent rho_0, naming the lmax
    at which a vMF law or a mixture of them has spectral tail <= tail_tol (diagnostics.tail_tol: `vmf_lmax`)."""
    kind = section["kind"]
    if kind == "file":
        # held to the same bound as an analytic law: read onto a coarser grid than its own (truncated), a file's
        # density would otherwise start, warned only, from the law that a vmf case of the same density is refused
        coefficients = density_from_file(pinned_file(section), section["time"], basis)
    else:
        coefficients = basis.analysis(analytic_density(section, basis, tail_tol))
    tail = float(basis.spectral_tail(coefficients))
    if tail > INITIAL_TAIL_TOLERANCE:
        raise CaseError(f"initial: the grid of sphere.lmax = {basis.lmax} does not resolve this {kind} law (spectral "
                        f"tail {tail:.2g} > {INITIAL_TAIL_TOLERANCE:g} at t = 0): {_remedy(section, basis, tail_tol)}")
    return coefficients


def analytic_density(section: dict, basis, tail_tol: float) -> torch.Tensor:
    """rho_0 of an analytic [initial] law on the grid of `basis`; a CaseError where its quadrature mass is not 1."""
    kind, points = section["kind"], basis.points
    if kind == "uniform":
        rho = torch.full(basis.grid_shape, 1 / basis.area, dtype=points.dtype, device=points.device)
    elif kind == "vmf":
        rho = vmf_density(points, section["mean"], section["kappa"])
    elif kind == "projected_gaussian":
        rho = projected_gaussian_density(points, section["mean"], section["covariance"])
    else:
        rho = sum(w * vmf_density(points, m, k)
                  for m, k, w in zip(section["means"], section["kappas"], section["weights"]))
    mass = float(basis.integrate(rho))
    if not abs(mass - 1) <= INITIAL_MASS_TOLERANCE:
        raise CaseError(f"initial: the grid of sphere.lmax = {basis.lmax} does not resolve this {kind} law (its "
                        f"quadrature mass there is {mass:.3g}, not 1): {_remedy(section, basis, tail_tol)}")
    return rho


def _remedy(section: dict, basis, tail_tol: float) -> str:
    """What to do about an initial law the grid does not carry: the lmax `vmf_lmax` names where it applies, for
    tail_tol or the refusal's own bound if that is smaller."""
    tolerance = min(tail_tol, INITIAL_TAIL_TOLERANCE)
    try:
        lmax = vmf_lmax(section, basis.dim, tolerance)
    except ValueError:  # kernel_degree: a kappa beyond any degree up to 2**16
        lmax = LMAX_LIMIT
    if lmax is not None and lmax >= LMAX_LIMIT:  # kappa above ~3e7: 41424 on S^1 was named
        key = "initial.kappa" if section["kind"] == "vmf" else "initial.kappas"
        return f"no sphere.lmax (at most {LMAX_LIMIT - 1}) resolves it: lower {key}"
    if lmax is None:
        return "raise sphere.lmax" if section["kind"] == "file" else "raise sphere.lmax or widen the law"
    return (f"use sphere.lmax >= {max(lmax, basis.lmax + 1)} (its spectral tail is <= {tolerance:g} there) or widen "
            "the law")


def vmf_lmax(section: dict, dim: int, tail_tol: float) -> int | None:
    """The smallest lmax whose spectral tail (bases: the fraction of the L2 norm in the degrees l > 2 lmax / 3 of
    those up to lmax) of the vMF law, or the mixture of them, of `section` is at most tail_tol; None for other laws.

    By Funk-Hecke, rho_i = exp(kappa_i <mu_i, x>) / lambda_0 has a degree-l part of squared norm
    e_il = (lambda_l / lambda_0)^2 N_l / |S| (lambda_l = funk_hecke(dim, kappa_i, l), N_l = 1, 2, 2, ... on S^1
    and 2 l + 1 on S^2), so a single law's tail is sqrt(sum_top e_l / sum e_l) exactly.  A mixture sum_i w_i rho_i
    of nonnegative laws has |rho|^2 >= sum_i w_i^2 |rho_i|^2 (the cross terms are >= 0) and a tail part of norm
    <= sum_i w_i |rho_i's|: the lmax named bounds its tail by tail_tol (its components far apart, it is the most
    concentrated one's need; close together, a little more than the mixture's own)."""
    if section["kind"] == "vmf":
        components = [(1.0, section["kappa"])]
    elif section["kind"] == "vmf_mixture":
        components = [(w, kappa) for w, kappa in zip(section["weights"], section["kappas"]) if w > 0]
    else:
        return None
    # past 3/2 of the degree where every component's weights fall below tail_tol^2 / 1000 of its first, any lmax's
    # top third carries less than tail_tol
    widest = max(kappa for _, kappa in components)
    degrees = np.arange(3 * kernel_degree(widest, dim, 1e-3 * tail_tol ** 2) // 2 + 2)
    multiplicity = 2 * degrees + 1.0 if dim == 3 else np.where(degrees > 0, 2.0, 1.0)
    # the sums of |S| e_il from degree l on (0 past the last): a tail's is the difference of two small ones
    suffixes = [np.append(np.cumsum(((funk_hecke(dim, kappa, degrees) / funk_hecke(dim, kappa, 0)) ** 2
                                     * multiplicity)[::-1])[::-1], 0.0) for _, kappa in components]
    lmax = degrees[1:]
    top, end = (2 * lmax) // 3 + 1, lmax + 1
    tail_norm = sum(w * np.sqrt(suffix[top] - suffix[end]) for (w, _), suffix in zip(components, suffixes))
    norm = np.sqrt(sum(w * w * (suffix[0] - suffix[end]) for (w, _), suffix in zip(components, suffixes)))
    return int(lmax[np.argmax(tail_norm <= tail_tol * norm)])


def pinned_file(section: dict) -> str:
    """initial.path of a resolved [initial] section, a CaseError where its bytes are no longer the ones its sha256
    pins: the case was resolved before the file changed (a notebook's case loaded earlier, a sweep's later
    members), and the run's stored case would name a density it did not start from."""
    path = section["path"]
    try:
        actual = file_sha256(path)
    except OSError as error:
        raise CaseError(f"initial.path: cannot read {path!r}: {error.strerror}") from None
    if actual != section["sha256"]:
        raise CaseError(f"initial.path: {path!r} has SHA-256 {actual}, not the {section['sha256']} of the case: the "
                        "file changed since the case was resolved (restore it, or resolve the case again)")
    return path


def stored_density(path: str, time_index: int, dim: int) -> tuple[np.ndarray, int]:
    """(the density of save `time_index` on its grid, the file's lmax) of an earlier Eulerian output on S^{dim-1};
    a CaseError naming initial.path where the file holds none (a particle run, a sweep, no spherepde result), one
    on another sphere, or a save that is not finite."""
    try:
        with xr.open_dataset(path) as dataset:
            members = dataset.sizes.get("member")
            if "density" not in dataset or "lmax" not in dataset.attrs or members:
                file_dim = None
            else:
                density = dataset["density"].isel(time=time_index).values
                lmax = int(dataset.attrs["lmax"])
                file_dim = 2 if "theta" in dataset["density"].dims else 3
    except (OSError, KeyError, IndexError, ValueError) as error:
        raise CaseError(f"initial.path: cannot read a density from {path!r}: {unreadable(error)}") from None
    except (RuntimeError, AttributeError) as error:
        # a damaged compressed chunk is met only when the density itself is read, the header opening fine
        if not damaged(error):
            raise
        raise CaseError(f"initial.path: cannot read a density from {path!r}: {error}: the file is damaged") from None
    if members:
        raise CaseError(f"initial.path: {path!r} is a sweep ({members} members); give one of its member-*.nc files")
    if file_dim is None:
        raise CaseError(f"initial.path: {path!r} holds no Eulerian density (a particle run, or not a spherepde "
                        "result)")
    if file_dim != dim:
        raise CaseError(f"initial.path: {path!r} holds a density on S^{file_dim - 1}, the case is on S^{dim - 1}")
    if not np.isfinite(density).all():
        raise CaseError(f"initial.path: the density at initial.time = {time_index} of {path!r} is not finite "
                        "everywhere (a save after a failure?)")
    return density, lmax


def density_from_file(path: str, time_index: int, basis) -> torch.Tensor:
    """Coefficients of the density stored in an earlier output, re-expanded to `basis`: those of
    `stored_coefficients` truncated or zero-padded to our lmax (spectral interpolation, exact when the stored
    density is band-limited)."""
    coefficients, source = stored_coefficients(path, time_index, basis.dim, basis.placement)
    return source.resize(coefficients, basis.lmax)


def stored_coefficients(path: str, time_index: int, dim: int, placement) -> tuple:
    """(coefficients, basis) of the density stored in an earlier output on its own basis, rebuilt from the file's
    lmax and grid shape (``file_basis``); a CaseError where its quadrature mass is not 1."""
    density, lmax = stored_density(path, time_index, dim)
    source = file_basis(path, dim, lmax, density.shape, placement)
    rho = placement.tensor(np.ascontiguousarray(density))
    mass = float(source.integrate(rho))
    if not abs(mass - 1) <= INITIAL_MASS_TOLERANCE:
        raise CaseError(f"initial.path: the density at initial.time = {time_index} of {path!r} has mass {mass:.6g} "
                        "on its grid, not 1: not a probability density of a spherepde run")
    return source.analysis(rho), source


def file_basis(path: str, dim: int, lmax: int, grid_shape: tuple, placement):
    """The basis of degree `lmax` on an earlier output's own grid, or a CaseError naming the file: its scalar
    transforms alone (a stored density is analysed, integrated and evaluated, never differentiated)."""
    from spherepde.discretisation.bases import make_basis

    try:
        return make_basis(dim, lmax, placement, grid_shape=tuple(grid_shape), vector=False)
    except ValueError as error:
        raise CaseError(f"initial.path: {path!r} has a grid {tuple(grid_shape)} that cannot hold lmax {lmax}: "
                        f"{error}") from None
