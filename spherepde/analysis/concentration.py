"""Seed-003 measurements beyond the per-save diagnostics of docs/design.md "Diagnostics" (all quantities
nondimensional).

* Projection masses.  For a one-dimensional E = span(e) the pushforward Pi_# rho,
  Pi(x) = P_E x / |P_E x|, is the pair of atoms +-e with the hemisphere masses
  rho({<x, e> > 0}) and rho({<x, e> < 0}).  For an Eulerian density of degree L the
  upper mass is computed exactly: only the degree-<= L part of the indicator
  1{<x, e> > 0} meets rho, and that part is the zonal polynomial
      h_L(s) = sum_{l <= L} c_l P_l(s),   c_l = (2l + 1)/2 int_0^1 P_l = (P_{l-1}(0) - P_{l+1}(0)) / 2
  (c_0 = 1/2), so rho({<x, e> > 0}) = sum_j w_j rho(x_j) h_L(<x_j, e>) with the grid's
  quadrature, which integrates the degree-2L product exactly.  On S^1 the zonal polynomials are
  Chebyshev's, cos(k phi) = T_k(cos phi): h_L(s) = 1/2 + sum_{1 <= k <= L} (2 sin(k pi / 2) / (k pi)) T_k(s),
  the Fourier series of the half circle's indicator cut at degree L.
* Rates.  Local rates -d log V / dt between saves and the least-squares asymptotic rate.
* Oscillation: half the peak-to-peak range of a series in a time window.
* Temperature coupling.  Without noise (eps = 0) rho_t^beta and rho_t^inf are pushforwards of rho_0 by
  the flows of their velocity fields; integrating both flows from the same quadrature of rho_0 gives
      W2(rho_t^beta, rho_t^inf)^2 <= int |Phi_t^beta(x) - Phi_t^inf(x)|^2 drho_0(x)   (upper bound)
  and, for any unit vector e, W2 >= W1 >= |<e, mean(rho_t^beta) - mean(rho_t^inf)>|   (lower bound).
  Phi^beta is driven by the Eulerian densities saved at equal intervals ds: a Runge-Kutta 4
  step of length 2 ds has its stages exactly on saves, so no density is interpolated.
"""

import math

import numpy as np
import torch
from scipy.special import eval_legendre

from spherepde.base.device import placement as make_placement
from spherepde.discretisation.bases import make_basis
from spherepde.discretisation.timesteppers import (  # the characteristics are integrated like particles
    RK4,
    explicit_flow,
)
from spherepde.geometry.ambient import tangent_projection
from spherepde.geometry.sphere import normalise
from spherepde.io.case import load_case_text
from spherepde.io.output import grid_points
from spherepde.kernels.dense import dense_exp_kernel
from spherepde.model.initial import initial_density

# ---------------------------------------------------------------------------------------
# Points and masses of saved results
# ---------------------------------------------------------------------------------------


def second_moments(dataset) -> np.ndarray:
    """int x x^T drho at every save, (time, d, d): the grid's quadrature for an Eulerian density (exact: the
    integrand has degree L + 2 <= 2 L), the empirical average of the saved particles (particles.save of them)."""
    if "density" not in dataset:
        x = dataset["particles"].values
        return np.einsum("tni,tnj->tij", x, x) / x.shape[1]
    x = grid_points(dataset)
    mass = dataset["density"].values * dataset["cell_area"].values
    grid = tuple(range(1, mass.ndim))
    return np.tensordot(mass, x[..., :, None] * x[..., None, :], axes=(grid, tuple(g - 1 for g in grid)))


def step_weights(lmax: int, dim: int = 3) -> np.ndarray:
    """Coefficients c_0..c_lmax of the degree-lmax projection h_L of 1{s > 0}, s = <x, e>, onto the zonal
    polynomials of S^{dim-1}: Legendre's P_l on S^2, Chebyshev's T_k on S^1 (module docstring)."""
    degrees = np.arange(1, lmax + 1)
    if dim == 2:
        higher = 2 * np.sin(degrees * np.pi / 2) / (degrees * np.pi)
    else:
        higher = 0.5 * (eval_legendre(degrees - 1, 0.0) - eval_legendre(degrees + 1, 0.0))
    return np.concatenate([[0.5], higher])


def hemisphere_mass(dataset, axis) -> np.ndarray:
    """rho_t({<x, axis> > 0}) at every save: exact for an Eulerian density (S^1 or S^2), the fraction for particles.

    A "both" dataset answers for its density; pass `split_both` halves to get each solver's.
    """
    points = grid_points(dataset) if "density" in dataset else dataset["particles"].values
    axis = np.asarray(axis, dtype=float)
    if axis.shape != points.shape[-1:] or not np.linalg.norm(axis) > 0:
        raise ValueError(f"hemisphere_mass: the axis is a nonzero vector of {points.shape[-1]} components (the "
                         f"result's sphere), got {axis.tolist()}")
    s = points @ (axis / np.linalg.norm(axis))
    if "density" not in dataset:
        return (s > 0).mean(-1)
    zonal = np.polynomial.chebyshev.chebval if points.shape[-1] == 2 else np.polynomial.legendre.legval
    h = zonal(s, step_weights(int(dataset.attrs["lmax"]), points.shape[-1]))
    weights = dataset["cell_area"].values * h
    return np.tensordot(dataset["density"].values, weights, axes=weights.ndim)


# ---------------------------------------------------------------------------------------
# Rates and oscillations of time series
# ---------------------------------------------------------------------------------------


def local_rates(times, values) -> tuple[np.ndarray, np.ndarray]:
    """(midpoint times, -d log(values)/dt) between consecutive saves."""
    times, log_values = np.asarray(times, float), np.log(np.asarray(values, float))
    return 0.5 * (times[1:] + times[:-1]), -np.diff(log_values) / np.diff(times)


def asymptotic_rate(times, values, start: float) -> float:
    """-slope of the least-squares line through log(values) over times >= start."""
    times, values = np.asarray(times, float), np.asarray(values, float)
    keep = times >= start
    return float(-np.polyfit(times[keep], np.log(values[keep]), 1)[0])


def oscillation(times, values, start: float, stop: float) -> float:
    """Half the peak-to-peak range of `values` over start <= t <= stop (NaN for an empty window)."""
    times, values = np.asarray(times, float), np.asarray(values, float)
    window = values[(times >= start) & (times <= stop)]
    return float(0.5 * (window.max() - window.min())) if len(window) else math.nan


def first_time(times, condition) -> float:
    """The first save time where `condition` holds (NaN if never)."""
    hits = np.flatnonzero(np.asarray(condition))
    return float(np.asarray(times)[hits[0]]) if len(hits) else math.nan


def power_law(x, y) -> tuple[float, float]:
    """(exponent a, prefactor C) of the least-squares fit y = C x^a in log-log coordinates."""
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(np.exp(intercept))


def two_cluster_widths(V, B, beta: float, eps: float, axis: int = 0) -> tuple[list, np.ndarray, np.ndarray]:
    """(the other axes i, restoring rates lambda_i, variances s_i) of the stationary pair of clusters at +-e_k under
    small noise: first order in eps, every order in beta eps.

    For diagonal V, B with B_kk < 0 a token x near e_k attends to the opposite cluster (weight e^{beta |B_kk|}
    against e^{-beta |B_kk|} for its own).  Let that cluster's tangent coordinates y_i be Gaussian with variances
    s_i.  On the sphere y_k = -(1 - |y_perp|^2 / 2) + ..., so the attention weight exp(beta <x, B y>) is, up to
    a constant, exp(-beta |B_kk| |y_perp|^2 / 2 + beta sum_i B_ii x_i y_i): a Gaussian tilt that narrows each
    y_i to variance s_i / (1 + beta |B_kk| s_i) and shifts its mean to beta B_ii x_i s_i / (1 + beta |B_kk| s_i).
    The velocity P_x(V m) = V m - <x, V m> x then restores x_i at the rate
        lambda_i = -V_kk - beta V_ii B_ii s_i / (1 + beta |B_kk| s_i),
    and an Ornstein-Uhlenbeck coordinate with that rate and the noise eps Lap has s_i = eps / lambda_i, so
        lambda_i^2 + (beta eps |B_kk| + V_kk) lambda_i + beta eps (V_kk |B_kk| + V_ii B_ii) = 0,
    up to relative O(eps) (the sphere's curvature in the noise and in <x, V m>) and O(e^{-2 beta |B_kk|})."""
    V, B = np.asarray(V, float), np.asarray(B, float)
    if np.abs(V - np.diag(np.diag(V))).max() > 0 or np.abs(B - np.diag(np.diag(B))).max() > 0:
        raise ValueError("two_cluster_widths: V and B must be diagonal")
    if not B[axis, axis] < 0 < -V[axis, axis]:
        raise ValueError("two_cluster_widths: needs B_kk < 0 (attention to the opposite cluster) and V_kk < 0")
    others = [i for i in range(len(V)) if i != axis]
    linear = beta * eps * -B[axis, axis] + V[axis, axis]
    constant = beta * eps * (V[axis, axis] * -B[axis, axis] + V[others, others] * B[others, others])
    discriminant = linear ** 2 - 4 * constant
    rates = (-linear + np.sqrt(np.maximum(discriminant, 0))) / 2
    if discriminant.min() < 0 or rates.min() <= 0:
        raise ValueError("two_cluster_widths: no stationary cluster pair at this beta eps")
    return others, rates, eps / rates


def two_cluster_alignment(V, B, beta: float, eps: float, axis: int = 0) -> float:
    """Alignment int x_k^2 drho = 1 - eps sum_{i != k} 1 / lambda_i of the stationary pair of clusters at +-e_k
    (two_cluster_widths: first order in eps, every order in beta eps).  Nondimensional."""
    _, rates, _ = two_cluster_widths(V, B, beta, eps, axis)
    return float(1 - eps * np.sum(1 / rates))


def two_cluster_stability(V, B, beta: float, eps: float, axis: int = 0) -> dict:
    """Growth rates (per unit time; < 0: decay) of the two ways the pair of clusters at +-e_k can move towards
    each other axis e_i: {"rotation": {i: sigma}, "shift": {i: sigma}}.  First order in eps, like
    two_cluster_widths; the reflection symmetry x_i -> -x_i of a symmetric initial law excites neither.

    Move the cluster near +e_k to y_i = a and the one near -e_k to y_i = -a ("rotation": the pair stays
    antipodal and turns rigidly) or to y_i = +a ("shift": both move alike, the pair bends).  A token of the
    first cluster attends to the second through the Gaussian tilt of two_cluster_widths: its attention mean is
    m_i = (-+a + beta B_ii x_i s_i) / (1 + beta |B_kk| s_i), and its velocity v_i = V_ii m_i + V_kk x_i averages
    over the cluster (mean x_i = a) to sigma a with
        sigma = -lambda_i -+ V_ii / (1 + beta |B_kk| s_i)        (upper sign: rotation; lower: shift).
    The second cluster moves alike by symmetry.  Without noise (s_i = 0) the rotation grows at V_kk - V_ii
    wherever V_ii < V_kk and the shift towards an axis with V_ii = -V_kk is neutral; the noise's width, through
    the tilt, moves both.  The moments that follow them: int x_k x_i drho = a_rotation + (w_+ - w_-) a_shift
    and int x_i drho = a_shift + (w_+ - w_-) a_rotation for clusters of masses w_+-."""
    others, rates, variances = two_cluster_widths(V, B, beta, eps, axis)
    V, B = np.asarray(V, float), np.asarray(B, float)
    feedback = V[others, others] / (1 + beta * -B[axis, axis] * variances)
    return {"rotation": {i: float(sigma) for i, sigma in zip(others, -rates - feedback)},
            "shift": {i: float(sigma) for i, sigma in zip(others, -rates + feedback)}}


def shape_residuals(beta, values) -> dict:
    """RMS log-residual of the best one-constant fits values = C g(beta) for the two candidate shapes.

    "laplace_bound": g = sqrt(log(beta + 1) / beta) (the theorem); "first_order": g = 1 / beta
    (first-order Laplace expansion).  The smaller residual is the shape the data follow.
    """
    beta, log_values = np.asarray(beta, float), np.log(np.asarray(values, float))
    shapes = {"laplace_bound": np.sqrt(np.log(beta + 1) / beta), "first_order": 1 / beta}
    residuals = {}
    for name, g in shapes.items():
        misfit = log_values - np.log(g)
        residuals[name] = float(np.sqrt(np.mean((misfit - misfit.mean()) ** 2)))
    return residuals


# ---------------------------------------------------------------------------------------
# Coupling rho^beta and rho^inf through their characteristics
# ---------------------------------------------------------------------------------------


def zero_temperature_velocity(x: torch.Tensor, V: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """v(x) = P_x(V B^T x / |B^T x|) (the beta = inf field) at the unit vectors x."""
    return tangent_projection(x, normalise(x @ B) @ V.T)


def initial_quadrature(case, lmax: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes x_q and masses w_q rho_0(x_q) of rho_0 on a Gauss grid of degree `lmax` (float64, CPU)."""
    basis = make_basis(case.dim, lmax, make_placement("cpu", "float64"))
    rho0 = basis.synthesis(initial_density(case["initial"], basis))
    return basis.points.reshape(-1, case.dim), (basis.weights * rho0).reshape(-1)


def temperature_coupling(dataset, quadrature_lmax: int = 16) -> dict:
    """Upper and lower bounds on W2(rho_t^beta, rho_t^inf) from a finite-beta Eulerian result (S^1 or S^2).

    Returns {"time", "upper", "lower"} at every other save: `upper` is the L2(rho_0) distance of
    the two flows, `lower` the largest component of the difference of the pushed means.
    The saves must be equally spaced (checked).  Both are bounds only where rho_t^beta and rho_t^inf are the
    pushforwards of rho_0 by the flows integrated here: eps = 0 (no diffusion), one softmax head with constant B and
    V, no feed-forward term (W = 0); a ValueError otherwise (at eps > 0 the density spreads while the
    characteristics do not: `upper` would bound nothing).
    """
    case = load_case_text(dataset.attrs["case"])
    model = case["model"]
    unsupported = [reason for reason, present in (
        (f"eps = {model['eps']:g} > 0", model["eps"] != 0),
        (f"kernel = {model['kernel']!r}", model["kernel"] != "softmax"),
        ("beta = inf", model["beta"] == math.inf), ("extra heads", "extra_heads" in model),
        ("layered B or V", any(np.ndim(model[name]) != 2 for name in ("B", "V"))),
        ("a feed-forward term", model.get("feed_forward", "linear") != "linear"
         or np.any(np.asarray(model.get("W", 0.0), dtype=float) != 0)))
        if present]
    if unsupported:
        raise ValueError("temperature_coupling: the characteristics carry rho_0 to rho_t only for eps = 0, one "
                         f"softmax head at finite beta and W = 0; this run has {', '.join(unsupported)}")
    beta = float(case["model"]["beta"])
    V, B = (torch.tensor(case["model"][name], dtype=torch.float64) for name in ("V", "B"))
    times = dataset["time"].values
    ds = float(times[1] - times[0])
    if not np.allclose(np.diff(times), ds, rtol=1e-9, atol=1e-12):
        raise ValueError("temperature_coupling needs equally spaced saves")
    if "density" not in dataset:
        raise ValueError("temperature_coupling: the characteristics are driven by an Eulerian density; this result "
                         "has none (a particle run)")
    keys = torch.tensor(grid_points(dataset).reshape(-1, case.dim))
    area = torch.tensor(dataset["cell_area"].values.reshape(-1))
    densities = torch.tensor(dataset["density"].values.reshape(len(times), -1))

    def finite(t, x):
        # Softmax attention of the save at time t; undershoots of the density count as zero mass.
        masses = torch.clamp(area * densities[round(t / ds)], min=0.0)
        channels = masses[:, None] * torch.cat([torch.ones_like(keys[:, :1]), keys], 1)
        scaled, _ = dense_exp_kernel(normalise(x), keys, channels, B, beta, 2048)
        return tangent_projection(normalise(x), scaled[:, 1:] / scaled[:, :1] @ V.T)

    def infinite(t, x):
        return zero_temperature_velocity(normalise(x), V, B)

    x0, masses = initial_quadrature(case, quadrature_lmax)
    x_beta, x_inf = x0.clone(), x0.clone()
    rows = {"time": [0.0], "upper": [0.0], "lower": [0.0]}
    for k in range(0, len(times) - 2, 2):
        # A step of 2 ds from save k has its Runge-Kutta stages exactly on saves k, k + 1, k + 2.
        x_beta = explicit_flow(lambda x, offset: finite(k * ds + offset * 2 * ds, x), x_beta, 2 * ds, RK4)
        x_inf = explicit_flow(lambda x, offset: infinite(k * ds + offset * 2 * ds, x), x_inf, 2 * ds, RK4)
        difference = x_beta - x_inf
        rows["time"].append(float(times[k + 2]))
        rows["upper"].append(float(torch.sqrt(masses @ (difference ** 2).sum(-1))))
        rows["lower"].append(float((masses @ difference).abs().max()))
    return {name: np.array(values) for name, values in rows.items()}
