"""Diagnostics of docs/design.md "Diagnostics" for a measure given as weighted points.

The same functions serve both solvers: an Eulerian density enters as grid points with
masses w_j rho(x_j) (quadrature weights times density), particles as their positions
with masses 1/n.  Arrays are numpy float64; points (n, d), masses (n,).
"""

import functools

import numpy as np
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
    weights = 2.0 ** (-q - 1) * w * (1 + t) ** (-q)
    return 2 * np.pi * parity * (eval_legendre(np.arange(degree + 1)[:, None], t) @ weights)


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
