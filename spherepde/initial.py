"""Initial densities rho_0 (w.r.t. the surface measure sigma) from the [initial] section.

von Mises-Fisher on S^{d-1}:  rho(x) = C_d(kappa) exp(kappa <mu, x>),
    C_2 = 1 / (2 pi I_0(kappa)),   C_3 = kappa / (4 pi sinh kappa),
evaluated as exp(kappa (<mu, x> - 1) + log C_d + kappa) so that large kappa does not overflow.
"""

import math

import numpy as np
import torch
import xarray as xr
from scipy.special import ive

from .errors import CaseError


def vmf_log_normaliser(kappa: float, dim: int) -> float:
    """log C_d(kappa) + kappa (the exponentially scaled normaliser) for d = 2, 3."""
    if kappa == 0:
        return math.log(1 / (2 * math.pi) if dim == 2 else 1 / (4 * math.pi))
    if dim == 2:
        return -math.log(2 * math.pi * ive(0, kappa))
    return math.log(kappa / (2 * math.pi)) - math.log1p(-math.exp(-2 * kappa))


def vmf_density(points: torch.Tensor, mean, kappa: float) -> torch.Tensor:
    """vMF density at `points` (..., d) with unit mean direction `mean` and concentration kappa."""
    mu = torch.as_tensor(mean, dtype=points.dtype, device=points.device)
    return torch.exp(kappa * (points @ mu - 1) + vmf_log_normaliser(kappa, points.shape[-1]))


def initial_density(section: dict, basis) -> torch.Tensor:
    """Spectral coefficients of rho_0 on `basis`."""
    kind = section["kind"]
    if kind == "file":
        return density_from_file(section["path"], section["time"], basis)
    points = basis.points
    if kind == "uniform":
        rho = torch.full(basis.grid_shape, 1 / basis.area, dtype=points.dtype, device=points.device)
    elif kind == "vmf":
        rho = vmf_density(points, section["mean"], section["kappa"])
    else:
        rho = sum(w * vmf_density(points, m, k)
                  for m, k, w in zip(section["means"], section["kappas"], section["weights"]))
    return basis.analysis(rho)


def density_from_file(path: str, time_index: int, basis) -> torch.Tensor:
    """Coefficients of the density stored in an earlier output, re-expanded to `basis`.

    The file's grid is rebuilt from its own lmax, the slice analysed there, and its
    coefficients truncated or zero-padded to our lmax: spectral interpolation, exact
    when the stored density is band-limited.
    """
    from .bases import make_basis

    try:
        with xr.open_dataset(path) as dataset:
            density = dataset["density"].isel(time=time_index).values
            lmax = int(dataset.attrs["lmax"])
            dim = 2 if "theta" in dataset["density"].dims else 3
    except (OSError, KeyError, IndexError, ValueError) as error:
        raise CaseError(f"initial.path: cannot read a density from {path!r}: {error}") from None
    if dim != basis.dim:
        raise CaseError(f"initial.path: {path!r} holds a density on S^{dim - 1}, the case is on S^{basis.dim - 1}")
    source = make_basis(dim, lmax, basis.placement, points=density.shape[0])
    if tuple(density.shape) != source.grid_shape:
        raise CaseError(f"initial.path: {path!r} has a grid {density.shape} that no basis of lmax {lmax} uses")
    coefficients = source.analysis(basis.placement.tensor(np.ascontiguousarray(density)))
    return source.resize(coefficients, basis.lmax)
