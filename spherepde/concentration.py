"""Seed-003 measurements beyond the per-save diagnostics of DESIGN §4 (all quantities nondimensional).

* Projection masses.  For a one-dimensional E = span(e) the pushforward Pi_# rho,
  Pi(x) = P_E x / |P_E x|, is the pair of atoms +-e with the hemisphere masses
  rho({<x, e> > 0}) and rho({<x, e> < 0}).  For an Eulerian density of degree L the
  upper mass is computed exactly: only the degree-<= L part of the indicator
  1{<x, e> > 0} meets rho, and that part is the zonal polynomial
      h_L(s) = sum_{l <= L} c_l P_l(s),   c_l = (2l + 1)/2 int_0^1 P_l = (P_{l-1}(0) - P_{l+1}(0)) / 2
  (c_0 = 1/2), so rho({<x, e> > 0}) = sum_j w_j rho(x_j) h_L(<x_j, e>) with the grid's
  quadrature, which integrates the degree-2L product exactly.
* Rates.  Local rates -d log V / dt between saves and the least-squares asymptotic rate.
* Oscillation: half the peak-to-peak range of a series in a time window.
* Temperature coupling.  rho_t^beta and rho_t^inf are pushforwards of rho_0 by the flows
  of their velocity fields; integrating both flows from the same quadrature of rho_0 gives
      W2(rho_t^beta, rho_t^inf)^2 <= int |Phi_t^beta(x) - Phi_t^inf(x)|^2 drho_0(x)   (upper bound)
  and, for any unit vector e, W2 >= W1 >= |<e, mean(rho_t^beta) - mean(rho_t^inf)>|   (lower bound).
  Phi^beta is driven by the Eulerian densities saved at equal intervals ds: a Runge-Kutta 4
  step of length 2 ds has its stages exactly on saves, so no density is interpolated.
"""

import math

import numpy as np
import torch
from scipy.special import eval_legendre

from .bases import make_basis
from .case import load_case_text
from .device import placement as make_placement
from .initial import initial_density

# ---------------------------------------------------------------------------------------
# Points and masses of saved results
# ---------------------------------------------------------------------------------------


def grid_points(dataset) -> np.ndarray:
    """Ambient coordinates (nlat, nlon, 3) of an S^2 result's grid (lat, lon in degrees)."""
    lat, lon = np.meshgrid(np.deg2rad(dataset["lat"].values), np.deg2rad(dataset["lon"].values), indexing="ij")
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=-1)


def step_weights(lmax: int) -> np.ndarray:
    """Legendre coefficients c_0..c_lmax of the degree-lmax projection h_L of 1{s > 0} on [-1, 1]."""
    c = np.zeros(lmax + 1)
    c[0] = 0.5
    for degree in range(1, lmax + 1):
        c[degree] = 0.5 * (eval_legendre(degree - 1, 0.0) - eval_legendre(degree + 1, 0.0))
    return c


def hemisphere_mass(dataset, axis) -> np.ndarray:
    """rho_t({<x, axis> > 0}) at every save: exact for an Eulerian S^2 density, the fraction for particles.

    A "both" dataset answers for its density; pass `split_both` halves to get each solver's.
    """
    axis = np.asarray(axis, dtype=float) / np.linalg.norm(axis)
    if "density" not in dataset:
        return (dataset["particles"].values @ axis > 0).mean(-1)
    s = grid_points(dataset) @ axis
    h = np.polynomial.legendre.legval(s, step_weights(int(dataset.attrs["lmax"])))
    return np.einsum("tij,ij->t", dataset["density"].values, dataset["cell_area"].values * h)


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


def softmax_mean(queries: torch.Tensor, keys: torch.Tensor, masses: torch.Tensor, beta: float, B: torch.Tensor,
                 chunk: int = 2048) -> torch.Tensor:
    """m(x) = sum_j softmax_j(beta <x, B y_j> + log mass_j) y_j: the softmax attention mean of a weighted grid."""
    log_masses = torch.log(torch.clamp(masses, min=0.0))
    rows = [torch.softmax(beta * (queries[start:start + chunk] @ B) @ keys.T + log_masses, dim=-1) @ keys
            for start in range(0, queries.shape[0], chunk)]
    return torch.cat(rows)


def zero_temperature_velocity(x: torch.Tensor, V: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """v(x) = P_x(V B^T x / |B^T x|) (the beta = inf field; x need not be unit)."""
    m = x @ B
    m = m / torch.linalg.vector_norm(m, dim=-1, keepdim=True)
    return _tangent(x, m @ V.T)


def _tangent(x: torch.Tensor, field: torch.Tensor) -> torch.Tensor:
    unit = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return field - (field * unit).sum(-1, keepdim=True) * unit


def _rk4(field, x: torch.Tensor, k: int, h: float) -> torch.Tensor:
    """One RK4 step from save k to save k + 2 in R^3 (stages at saves k, k + 1, k + 2), then normalise."""
    k1 = field(k, x)
    k2 = field(k + 1, x + 0.5 * h * k1)
    k3 = field(k + 1, x + 0.5 * h * k2)
    k4 = field(k + 2, x + h * k3)
    y = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True)


def initial_quadrature(case, lmax: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes x_q and masses w_q rho_0(x_q) of rho_0 on a Gauss grid of degree `lmax` (float64, CPU)."""
    basis = make_basis(case.dim, lmax, make_placement("cpu", "float64"))
    rho0 = basis.synthesis(initial_density(case["initial"], basis))
    return basis.points.reshape(-1, case.dim), (basis.weights * rho0).reshape(-1)


def temperature_coupling(dataset, quadrature_lmax: int = 16) -> dict:
    """Upper and lower bounds on W2(rho_t^beta, rho_t^inf) from a finite-beta Eulerian S^2 result.

    Returns {"time", "upper", "lower"} at every other save: `upper` is the L2(rho_0) distance of
    the two flows, `lower` the largest component of the difference of the pushed means.
    The saves must be equally spaced (checked).
    """
    case = load_case_text(dataset.attrs["case"])
    beta = float(case["model"]["beta"])
    V, B = (torch.tensor(case["model"][name], dtype=torch.float64) for name in ("V", "B"))
    times = dataset["time"].values
    ds = float(times[1] - times[0])
    if not np.allclose(np.diff(times), ds, rtol=1e-9, atol=1e-12):
        raise ValueError("temperature_coupling needs equally spaced saves")
    keys = torch.tensor(grid_points(dataset).reshape(-1, 3))
    area = torch.tensor(dataset["cell_area"].values.reshape(-1))
    densities = torch.tensor(dataset["density"].values.reshape(len(times), -1))

    def finite(k, x):
        return _tangent(x, softmax_mean(x / torch.linalg.vector_norm(x, dim=-1, keepdim=True), keys,
                                        area * densities[k], beta, B) @ V.T)

    def infinite(k, x):
        return zero_temperature_velocity(x, V, B)

    x0, masses = initial_quadrature(case, quadrature_lmax)
    x_beta, x_inf = x0.clone(), x0.clone()
    rows = {"time": [0.0], "upper": [0.0], "lower": [0.0]}
    for k in range(0, len(times) - 2, 2):
        x_beta, x_inf = _rk4(finite, x_beta, k, 2 * ds), _rk4(infinite, x_inf, k, 2 * ds)
        difference = x_beta - x_inf
        rows["time"].append(float(times[k + 2]))
        rows["upper"].append(float(torch.sqrt(masses @ (difference ** 2).sum(-1))))
        rows["lower"].append(float((masses @ difference).abs().max()))
    return {name: np.array(values) for name, values in rows.items()}
