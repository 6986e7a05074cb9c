"""Diagnostics of DESIGN §4 for a measure given as weighted points.

The same functions serve both solvers: an Eulerian density enters as grid points with
masses w_j rho(x_j) (quadrature weights times density), particles as their positions
with masses 1/n.  Arrays are numpy float64; points (n, d), masses (n,).
"""

import functools

import numpy as np
import ot
from scipy.special import eval_legendre, roots_jacobi

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
    # |x - P_E x|^2 from the components, not 1 - |P_E x|^2: near E that difference cancels to
    # round-off (relative error 1e-16 / |(I - P_E) x|^2), which stalls the measured decay of V_p.
    outside = ((points - (points @ subspace) @ subspace.T) ** 2).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(inside > 0, outside / inside, np.inf)
    charged = masses != 0
    return float(masses[charged] @ ratio[charged] ** p)


def lyapunov_of_density(degree_sum, subspace: np.ndarray | None, p: float, degree: int) -> float:
    """V_p = int rho(x) w_p(x) dsigma, w_p = (|(I - P_E) x|^2 / |P_E x|^2)^p, for a density of degree
    `degree` on S^1 or S^2, exactly (no grid rule: w_p is singular on {P_E x = 0}, where a grid
    loses accuracy, error O(h^(1 - 2p))).

    w_p is zonal about an axis a: w_p = W(<x, a>).  On S^2, a = e when E = span(e)
    (W(t) = |t|^(-2p) (1 - t^2)^p), a = the normal of E when dim E = 2 (W(t) = |t|^(2p) (1 - t^2)^(-p));
    on S^1, a = e and W(cos th) = |tan th|^(2p).  By the addition theorem the degree-l part rho_l of
    rho averages to rho_l(a) P_l(t) on the circle <x, a> = t (rho_k(a) cos(k th) on S^1), so

        V_p = sum_l M_l rho_l(a),   M_l = 2 pi int_{-1}^{1} P_l(t) W(t) dt   (S^2),
                                    M_k = int_0^{2 pi} cos(k th) |tan th|^(2p) dth   (S^1),

    and `degree_sum(M, a)` must return sum_l M[l] rho_l(a) (the series at a with each degree-l
    coefficient multiplied by M[l]).  The moments are Gauss-Jacobi sums, the singular factor being
    the Jacobi weight: on t in (0, 1), t = (1 + y)/2 (S^2), or on th in (0, pi/2) (S^1), mirrored by
    parity.  V_p = 0 when E = R^d, nan without E, inf when w_p is not integrable (2p >= the
    codimension of {P_E x = 0}), since a band-limited density does not vanish there.
    """
    if subspace is None:
        return float("nan")
    d, k = subspace.shape
    if k == d:
        return 0.0
    if d not in (2, 3):
        raise ValueError(f"lyapunov_of_density: S^1 or S^2 only, got d = {d}")
    q = p if k == 2 else -p  # W(t) = |t|^(2q) (1 - t^2)^(-q) on S^2
    if (d == 2 and 2 * p >= 1) or (d == 3 and not -0.5 < q < 1):
        return float("inf")
    frame = np.linalg.qr(np.hstack([subspace, np.eye(d)]))[0]  # first k columns span E
    axis = frame[:, 2] if k == 2 else frame[:, 0]
    return float(degree_sum(_zonal_moments(d, q, degree), axis))


@functools.lru_cache(maxsize=16)  # the same few (d, p, lmax) at every save of a run
def _zonal_moments(d: int, q: float, degree: int) -> np.ndarray:
    """M_0..M_degree of `lyapunov_of_density` (q = -p on S^1)."""
    nodes = degree + 24  # the factor beside the Jacobi weight is analytic: a margin of 24 nodes suffices
    parity = 1.0 + (-1.0) ** np.arange(degree + 1)
    if d == 2:
        y, w = roots_jacobi(nodes, 2 * q, -2 * q)  # |tan th|^(2p) = th^(2p) (pi/2 - th)^(-2p) g(th)
        th = np.pi / 4 * (1 + y)
        g = (np.sinc(th / np.pi) / np.sinc((np.pi / 2 - th) / np.pi)) ** (-2 * q)
        return 2 * parity * (np.cos(np.outer(np.arange(degree + 1), th)) @ (np.pi / 4 * w * g))
    y, w = roots_jacobi(nodes, -q, 2 * q)
    t = (1 + y) / 2
    return 2 * np.pi * parity * (eval_legendre(np.arange(degree + 1)[:, None], t) @ (2.0 ** (-q - 1) * w * (1 + t) ** (-q)))


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
    Returns (W2, error bound from the quantisation; 0 when none was needed); NaN when a
    measure has no positive mass (a density the grid does not see: nothing to normalise).
    """
    a_points, a, a_bound = quantise(points_a, np.maximum(masses_a, DENSITY_FLOOR), max_atoms)
    b_points, b, b_bound = quantise(points_b, np.maximum(masses_b, DENSITY_FLOOR), max_atoms)
    if not (a.sum() > 0 and b.sum() > 0):
        return float("nan"), 0.0
    cost = ot.dist(a_points, b_points, metric="sqeuclidean")
    value = ot.emd2(a / a.sum(), b / b.sum(), cost, numItermax=10_000_000)
    return float(np.sqrt(max(value, 0.0))), a_bound + b_bound


def w2_projection(points, masses, points_0, masses_0, subspace: np.ndarray | None,
                  max_atoms: int = 1000) -> tuple[float, float]:
    """W2(rho_t, Pi_# rho_0), Pi(x) = P_E x / |P_E x|, and its quantisation bound (NaN when E is undefined)."""
    if subspace is None:
        return float("nan"), 0.0
    return wasserstein2(points, masses, *pushforward(points_0, masses_0, subspace), max_atoms)


def grid_w2_bound(subspace: np.ndarray | None, radius: float) -> float:
    """How far W2(rho_t, Pi_# rho_0) between densities can lie from the W2 between their grid measures (the
    atoms x_i with their quadrature masses, each standing for its cell of chordal radius `radius`): 2 r, a
    bound when Pi is the identity (E the whole space: each cell's mass moves at most r, on either side).
    For a proper subspace E, Pi is discontinuous on {P_E x = 0}: the cells it cuts can send mass across, and
    a bound of the same coupling grows as sqrt(r) (0.37 at lmax 32 on S^1) while the error measured there
    is 3e-4 (grid nodes on the set split their mass, and the two sides balance); 2 r is then an estimate,
    not a bound.  A bound for cell masses; the quadrature masses differ from them at second order."""
    return 0.0 if subspace is None else 2 * radius


# |P_E x| below which a point counts as lying on {P_E x = 0}, where Pi is undefined: grid coordinates
# carry round-off of ~1e-16 (float64) to ~1e-7 (float32), the nearest other nodes sit >= ~1e-3 away.
_SINGULAR_TOL = 1e-6


def pushforward(points: np.ndarray, masses: np.ndarray, subspace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pi_# of the weighted points (x_i, m_i): atoms Pi(x_i) with masses m_i.

    {P_E x = 0} has measure zero, but a quadrature grid can have nodes on it (with nlon divisible by 4 the
    meridians phi = +-pi/2 when E = span(e_1)); such a node stands for a cell that the set cuts in two
    halves, so its mass is split equally over the 2 dim(E) atoms +-e_k of E.  Left to round-off, Pi would
    send the whole meridian to one side: float32 and float64 runs of one case then differed by 2.5e-2 in
    w2_projection."""
    singular = np.linalg.norm(points @ subspace, axis=-1) <= _SINGULAR_TOL
    if not singular.any():
        return projection(points, subspace), masses
    axes = np.concatenate([subspace.T, -subspace.T])
    spread = np.repeat(masses[singular] / len(axes), len(axes))
    return (np.concatenate([projection(points[~singular], subspace), np.tile(axes, (int(singular.sum()), 1))]),
            np.concatenate([masses[~singular], spread]))
