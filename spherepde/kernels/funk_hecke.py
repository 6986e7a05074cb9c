"""Funk-Hecke weights of the kernel exp(kappa <u, y>) and the degree, nodes and grid they need.

The kernel exp(kappa <u_hat, y>) is zonal about u_hat and by the Funk-Hecke theorem acts on each degree l by
a number, lambda_l(kappa) = 4 pi i_l(kappa) = 4 pi sqrt(pi / 2 kappa) I_{l+1/2}(kappa) on S^2 and
lambda_k(kappa) = 2 pi I_k(kappa) on S^1; `funk_hecke` gives mu_l(kappa) = exp(-kappa) lambda_l(kappa) from
exponentially scaled Bessel functions (scipy's ive): no overflow and no lost digits at kappa in the thousands,
0 <= mu_l <= mu_0 <= |S^{d-1}|.  From them: the degree above which the weights fall below tol
(`kernel_degree`), the grid resolution that degree requires (`check_resolution`), and the fewest Chebyshev
nodes r_k on which mu_l(beta r) is interpolated in r to tol (`chebyshev_nodes`).
"""

import math

import numpy as np
import torch
from scipy.special import ive

from spherepde.base.errors import CaseError
from spherepde.discretisation.scattered import barycentric_weights, chebyshev_points

# Largest Chebyshev node count tried before a general C is declared out of reach of the spectral field.
MAX_CHEBYSHEV_NODES = 64


def funk_hecke(dim: int, kappa, degree) -> np.ndarray:
    """mu_l(kappa) = exp(-kappa) lambda_l(kappa): how exp(kappa <u, y>) - scaled - acts on degree l.

    S^1 (dim 2): 2 pi I_l(kappa) exp(-kappa);  S^2 (dim 3): 4 pi sqrt(pi / 2 kappa) I_{l+1/2}(kappa) exp(-kappa),
    with the kappa -> 0 limit |S^{d-1}| [l = 0].  Broadcasts kappa against degree (float64).
    """
    kappa, degree = np.broadcast_arrays(np.asarray(kappa, dtype=np.float64), np.asarray(degree, dtype=np.float64))
    if dim == 2:
        return 2 * np.pi * ive(degree, kappa)
    safe = np.where(kappa > 0, kappa, 1.0)
    return np.where(kappa > 0, 4 * np.pi * np.sqrt(np.pi / (2 * safe)) * ive(degree + 0.5, safe),
                    np.where(degree == 0, 4 * np.pi, 0.0))


def kernel_degree(kappa: float, dim: int, tol: float, limit: int = 2 ** 16) -> int:
    """Smallest degree l at which exp(kappa <u, y>) on S^{dim-1} has relative Funk-Hecke weight < tol.

    The ratio mu_l(kappa) / mu_0(kappa) = lambda_l / lambda_0 of `funk_hecke`: computed with
    exponentially scaled Bessel functions, so large kappa neither overflows nor loses digits.  The weights
    fall like exp(-l^2 / (2 kappa)), so the search doubles its range from 64 degrees; ValueError when no
    degree up to `limit` qualifies (kappa above ~ 6e7 at tol 1e-14, far beyond any grid).
    """
    if kappa == 0:
        return 1
    if not math.isfinite(kappa):
        raise ValueError(f"kernel_degree: kappa = {kappa} is not finite")
    size = 64
    while size <= 2 * limit:
        degrees = np.arange(0, min(size, limit + 1))
        weights = funk_hecke(dim, kappa, degrees)
        small = weights / weights[0] < tol
        if small.any():
            return int(degrees[np.argmax(small)])
        size *= 2
    raise ValueError(f"kernel_degree: the kernel exp({kappa:g} <u, y>) needs a degree beyond {limit}")


def chebyshev_nodes(dim: int, beta: float, low: float, high: float, lmax: int, tol: float,
                    max_nodes: int = MAX_CHEBYSHEV_NODES) -> np.ndarray | None:
    """Fewest Chebyshev nodes on [low, high] interpolating every mu_l(beta r), l <= lmax, to tol mu_0(beta r).

    Checked on 400 points of [low, high]; None when max_nodes do not suffice.
    """
    degree = np.arange(lmax + 1)
    r = np.linspace(low, high, 400)
    exact = funk_hecke(dim, beta * r[:, None], degree)
    for n in range(1, max_nodes + 1):
        nodes = chebyshev_points(n, low, high)
        interpolated = barycentric_weights(nodes, r) @ funk_hecke(dim, beta * nodes[:, None], degree)
        if np.all(np.abs(interpolated - exact) <= tol * exact[:, :1]):
            return nodes
    return None


def check_resolution(model, basis, tol: float) -> None:
    """Refuse a grid too coarse for the kernel width of a model (CaseError naming the lmax needed).

    The kernel exp(beta <C^T x, y>) has Funk-Hecke weights above tol up to degree
    kernel_degree(beta sigma_max(B)) (its width ~ 1/sqrt(beta sigma_max)); with rho of degree
    lmax the grid must integrate polynomials of degree kernel_degree + lmax exactly.  The same
    rule holds for both fields: the dense quadrature is accurate to tol only then, and the
    spectral transform, exact at any lmax for band-limited rho, yields an attention field that
    varies on the kernel width, which a coarser grid cannot carry through the product rho v.
    """
    check_resolutions([(model, "model.beta", "")], basis, tol)


def check_resolutions(models: list, basis, tol: float) -> None:
    """`check_resolution` of every (model, key of its beta, where it sits: "" or a phrase) of `models` (the heads
    of every layer) at once: the message names the model that needs the finest grid and the lmax that carries
    them all (head by head it named the first failing one's, and the next run asked for more)."""
    worst, label_of_worst, needed_by_worst = None, None, 0
    for model, name, where in models:
        if model.zero_temperature or model.beta == 0:
            continue
        sigma_max = float(torch.linalg.matrix_norm(model.B.double(), ord=2))
        try:
            needed = kernel_degree(model.beta * sigma_max, basis.dim, tol)
        except ValueError:
            head = name.rsplit(".", 1)[0]  # the table of the head's beta and B
            raise CaseError(f"{name}: beta |B| = {model.beta * sigma_max:g} makes the kernel narrower than any grid "
                            f"can carry; lower {head}.beta or {head}.B, or use beta = \"inf\"") from None
        if needed > needed_by_worst:
            worst, label_of_worst, needed_by_worst = model, f"{name} = {model.beta:g}{where}", needed
    if worst is None or needed_by_worst + basis.lmax <= basis.quadrature_degree(basis.lmax):
        return
    lmax = basis.lmax
    while needed_by_worst + lmax > basis.quadrature_degree(lmax):
        lmax += 1
    raise CaseError(
        f"sphere.lmax: {basis.lmax} is too coarse for {label_of_worst} (kernel needs degree {needed_by_worst} at "
        f"solver.kernel_tol = {tol:g}, and the grid's quadrature must be exact to the kernel's degree plus lmax); "
        f"use lmax >= {lmax}")
