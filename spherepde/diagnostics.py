"""Diagnostics of DESIGN §4 for a measure given as weighted points.

The same functions serve both solvers: an Eulerian density enters as grid points with
masses w_j rho(x_j) (quadrature weights times density), particles as their positions
with masses 1/n.  Arrays are numpy float64; points (n, d), masses (n,).
"""

import numpy as np
import ot

# Densities from a spectral solution can undershoot zero near steep gradients; transport
# and logarithms use max(rho, 0): the negative part is reported (min_density), not hidden.
DENSITY_FLOOR = 0.0


def mean(points: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """int x drho (d,)."""
    return masses @ points


def projected_norm_squared(points: np.ndarray, subspace: np.ndarray) -> np.ndarray:
    """|P_E x|^2 for an orthonormal basis (d, k) of E."""
    return ((points @ subspace) ** 2).sum(-1)


def alignment(points: np.ndarray, masses: np.ndarray, subspace: np.ndarray | None) -> float:
    """int |P_E x|^2 drho; NaN when E is undefined (complex leading eigenvalue)."""
    if subspace is None:
        return float("nan")
    return float(masses @ projected_norm_squared(points, subspace))


def lyapunov(points: np.ndarray, masses: np.ndarray, subspace: np.ndarray | None, p: float) -> float:
    """V_p = int (|(I - P_E) x|^2 / |P_E x|^2)^p drho (inf where rho charges P_E x = 0)."""
    if subspace is None:
        return float("nan")
    inside = projected_norm_squared(points, subspace)
    outside = np.clip(1.0 - inside, 0.0, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(inside > 0, outside / inside, np.inf)
    charged = masses != 0
    return float(masses[charged] @ ratio[charged] ** p)


def entropy(density: np.ndarray, weights: np.ndarray) -> float:
    """int rho log rho dsigma, with rho floored at DENSITY_FLOOR (x log x -> 0)."""
    rho = np.maximum(density, DENSITY_FLOOR)
    with np.errstate(divide="ignore", invalid="ignore"):
        integrand = np.where(rho > 0, rho * np.log(rho), 0.0)
    return float((weights * integrand).sum())


def projection(points: np.ndarray, subspace: np.ndarray) -> np.ndarray:
    """Pi(x) = P_E x / |P_E x| in ambient coordinates (undefined where P_E x = 0: left at 0)."""
    inside = points @ subspace
    norm = np.linalg.norm(inside, axis=-1, keepdims=True)
    return np.where(norm > 0, inside / np.where(norm > 0, norm, 1.0), 0.0) @ subspace.T


def merge_atoms(points: np.ndarray, masses: np.ndarray, decimals: int = 12):
    """A discrete measure with coincident atoms merged and massless atoms dropped."""
    keep = masses > 0
    points, masses = points[keep], masses[keep]
    unique, inverse = np.unique(np.round(points, decimals), axis=0, return_inverse=True)
    return unique, np.bincount(inverse.ravel(), weights=masses, minlength=len(unique))


def quantise(points: np.ndarray, masses: np.ndarray, max_atoms: int):
    """Aggregate a measure on S^1 / S^2 into at most ~max_atoms cells of an angle grid.

    Each cell's mass sits at the normalised mass-weighted mean of its points.  Returns
    (points, masses, bound) where bound >= W2(mu, quantised mu): the largest chordal cell
    diameter (0 when nothing was aggregated).  By the triangle inequality a W2 between two
    quantised measures is within the sum of their bounds of the W2 between the originals.
    """
    points, masses = merge_atoms(points, masses)
    if len(masses) <= max_atoms:
        return points, masses, 0.0
    dim = points.shape[1]
    if dim == 2:
        bins = max_atoms
        cell = np.floor((np.arctan2(points[:, 1], points[:, 0]) + np.pi) / (2 * np.pi) * bins).astype(int) % bins
        angle = 2 * np.pi / bins
    elif dim == 3:
        rows = max(1, int(np.sqrt(max_atoms / 2)))
        colatitude = np.arccos(np.clip(points[:, 2], -1, 1))
        row = np.minimum((colatitude / np.pi * rows).astype(int), rows - 1)
        column = np.floor((np.arctan2(points[:, 1], points[:, 0]) + np.pi) / (2 * np.pi) * 2 * rows).astype(int)
        cell = row * 2 * rows + column % (2 * rows)
        angle = np.sqrt(2) * np.pi / rows
    else:
        raise ValueError(f"cannot quantise a measure on S^{dim - 1} for exact transport")
    label, cell = np.unique(cell, return_inverse=True)
    cell_mass = np.bincount(cell, weights=masses)
    centre = np.stack([np.bincount(cell, weights=masses * points[:, k]) for k in range(dim)], axis=1)
    centre /= np.linalg.norm(centre, axis=1, keepdims=True)
    return centre, cell_mass, float(2 * np.sin(min(angle, np.pi) / 2))


def wasserstein2(points_a, masses_a, points_b, masses_b, max_atoms: int = 1000) -> tuple[float, float]:
    """W2 between two discrete measures on the sphere, chordal cost |x - y|^2, by exact OT (POT emd).

    Negative masses are floored to 0 and both measures normalised to probability.  A
    measure with more than `max_atoms` atoms is first quantised (see `quantise`).
    Returns (W2, error bound from the quantisation; 0 when none was needed).
    """
    a_points, a, a_bound = quantise(points_a, np.maximum(masses_a, DENSITY_FLOOR), max_atoms)
    b_points, b, b_bound = quantise(points_b, np.maximum(masses_b, DENSITY_FLOOR), max_atoms)
    cost = ot.dist(a_points, b_points, metric="sqeuclidean")
    value = ot.emd2(a / a.sum(), b / b.sum(), cost, numItermax=10_000_000)
    return float(np.sqrt(max(value, 0.0))), a_bound + b_bound


def w2_projection(points, masses, points_0, masses_0, subspace: np.ndarray | None,
                  max_atoms: int = 1000) -> tuple[float, float]:
    """W2(rho_t, Pi_# rho_0), Pi(x) = P_E x / |P_E x|, and its quantisation bound (NaN when E is undefined)."""
    if subspace is None:
        return float("nan"), 0.0
    return wasserstein2(points, masses, projection(points_0, subspace), masses_0, max_atoms)
