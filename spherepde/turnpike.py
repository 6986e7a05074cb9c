"""Seed-004 diagnostics of a trained forward run: energy gap, turnpike plateau, terminal escape.

All quantities are nondimensional (t is depth).  With the seed's model (unnormalized kernel,
B = V = A symmetric, beta = 1) the energy is the run's `free_energy`,

    E(mu) = eps int rho log rho dsigma - 1/2 int int exp(beta <x, B y>) dmu(x) dmu(y),

and min E is attained at a Gibbs fixed point  rho ∝ exp(U / eps),  U(x) = int exp(beta <x, B y>) dmu(y),
found by damped fixed-point iteration on the grid from a cluster at the leading eigenvector of B
(`gibbs_minimum`; both wells +-e_1 have the same energy).  The energy gap is Delta(t) = E(mu_t) - min E.

Three-phase test (`three_phase`), with Delta_ref the median of Delta over the middle half of [0, T]
and the threshold h = Delta_ref + 0.05 (max Delta - Delta_ref):
  plateau        the largest interval of save times around T / 2 on which Delta <= h; its start is
                 the initial boundary-layer width tau, T minus its end the terminal width r;
  clustering     Delta(0) > h (the energy falls across the initial layer);
  flat plateau   var(Delta on the plateau) / (max Delta - min Delta)^2 <= 0.05 (relative variance);
  escape         Delta(T) - Delta_ref >= 0.1 (terminal energy lift).
Escape rate a: least-squares slope of log(Delta(t) - Delta_ref) over the terminal layer, i.e.
Delta - Delta_ref ~ C exp(-a (T - t)).  The adjoint's rate: slope of log |grad phi_t|_{L2(mu_t)}
from the plateau's start to T (the adjoint decays backward from the output layer).

Rayleigh quotient of the loss gradient g = dl/dmu at the plateau state mu (the save nearest the
plateau's middle):  R_mu(g) = |grad g|^2_{L2(mu)} / |g|^2_{H^-1(mu)},  |g|^2_{H^-1(mu)} = int |grad u|^2 dmu
with u the solution of the weighted Poisson problem  -div(rho grad u) = rho (g - int g dmu)
(exact quadrature on S^1; conjugate gradients in spectral space, preconditioned by the inverse of
-rho_mean Lap, on S^2).
"""

import math

import numpy as np
import torch

# Density floor of the weighted norms, relative to max rho: the H^-1(mu) norm weighs errors by 1 / rho, and a
# spectral density is known only to ~1e-16 of its maximum (it even dips below zero in its tails).
DENSITY_FLOOR = 1e-10


def gibbs_minimum(model, exp_kernel, basis, direction: torch.Tensor, damping: float = 0.5, tol: float = 1e-12,
                  iterations: int = 5000) -> tuple[torch.Tensor, float]:
    """(rho, E(rho)) at the Gibbs fixed point rho ∝ exp(U[rho] / eps) near the cluster at `direction`.

    Damped iteration in U: U <- (1 - damping) U + damping T[rho(U)], stopped when the update is below
    tol |U|.  Raises RuntimeError when it does not converge.
    """
    eps = model.eps
    points = basis.points
    potential = math.exp(model.beta) * (points @ direction)  # a cluster at `direction` as a start
    for _ in range(iterations):
        rho = _gibbs_density(potential, eps, basis)
        scaled, log_scale = exp_kernel(rho[..., None])
        update = scaled[..., 0] * torch.exp(log_scale)
        change = float((update - potential).abs().max())
        potential = (1 - damping) * potential + damping * update
        if change <= tol * float(update.abs().max()):
            break
    else:
        raise RuntimeError(f"the Gibbs fixed point did not converge in {iterations} iterations (last change {change:.2e})")
    rho = _gibbs_density(potential, eps, basis)
    return rho, free_energy(model, exp_kernel, basis, rho)


def _gibbs_density(potential: torch.Tensor, eps: float, basis) -> torch.Tensor:
    weights = torch.exp((potential - potential.max()) / eps)
    return weights / basis.integrate(weights)


def free_energy(model, exp_kernel, basis, rho: torch.Tensor) -> float:
    """E = eps int rho log rho - 1/2 int int exp(beta <x, B y>) rho rho (quadrature on the grid; rho log rho = 0 where rho <= 0)."""
    scaled, log_scale = exp_kernel(rho[..., None])
    interaction = -0.5 * float(basis.integrate(scaled[..., 0] * torch.exp(log_scale) * rho))
    positive = rho.clamp_min(0)
    entropy = float(basis.integrate(torch.where(positive > 0, positive * torch.log(positive.clamp_min(1e-300)), 0.0)))
    return model.eps * entropy + interaction


def mean_angle(mean: np.ndarray) -> np.ndarray:
    """S^1: signed angle atan2(m_2, m_1) of the mean (radians); S^2: angle between the mean and e_1."""
    if mean.shape[-1] == 2:
        return np.arctan2(mean[..., 1], mean[..., 0])
    return np.arccos(np.clip(mean[..., 0] / np.linalg.norm(mean, axis=-1), -1, 1))


def phases(times: np.ndarray, gap: np.ndarray) -> dict:
    """The three-phase test of the module docstring on the energy gap Delta(t) at the save times."""
    T = times[-1]
    middle = (times >= 0.25 * T) & (times <= 0.75 * T)
    reference = float(np.median(gap[middle]))
    threshold = reference + 0.05 * (gap.max() - reference)
    centre = int(np.argmin(np.abs(times - 0.5 * T)))
    below = gap <= threshold
    start = end = centre
    if below[centre]:
        while start > 0 and below[start - 1]:
            start -= 1
        while end < len(times) - 1 and below[end + 1]:
            end += 1
    plateau = slice(start, end + 1)
    spread = max(gap.max() - gap.min(), 1e-300)
    relative_variance = float(np.var(gap[plateau]) / spread ** 2)
    lift = float(gap[-1] - reference)
    result = {
        "gap_reference": reference,
        "plateau_start": float(times[start]), "plateau_end": float(times[end]),
        "plateau_width": float(times[end] - times[start]) if below[centre] else 0.0,
        "initial_width": float(times[start]), "terminal_width": float(T - times[end]),
        "clustering": bool(gap[0] > threshold), "plateau_relative_variance": relative_variance,
        "terminal_lift": lift,
    }
    result["three_phase"] = bool(below[centre] and result["clustering"] and relative_variance <= 0.05 and lift >= 0.1)
    return result


def terminal_rate(times: np.ndarray, values: np.ndarray, start: float) -> float:
    """Least-squares slope of log(values) against t over t >= start (positive values only); NaN if < 2 points."""
    chosen = (times >= start) & (values > 0)
    if chosen.sum() < 2:
        return math.nan
    return float(np.polyfit(times[chosen], np.log(values[chosen]), 1)[0])


def weighted_poisson(basis, rho: torch.Tensor, f: torch.Tensor, tol: float = 1e-12, iterations: int = 2000):
    """Coefficients of u solving -div(rho grad u) = f (f of zero integral, rho > 0), mean-zero u; preconditioned CG."""
    multiplicity = basis.multiplicity

    def apply(c):
        return -basis.divergence(rho[..., None] * basis.gradient(c))

    def inner(a, b):
        return float((multiplicity * (a.conj() * b).real).sum())

    laplacian = -basis.laplacian
    scale = float(basis.integrate(rho)) / basis.area
    preconditioner = torch.where(laplacian > 0, 1 / (scale * torch.where(laplacian > 0, laplacian, 1.0)), 0.0)
    b = basis.analysis(f) * (laplacian > 0)
    u = torch.zeros_like(b)
    r = b.clone()
    z = preconditioner * r
    p = z.clone()
    rz = inner(r, z)
    norm_b = math.sqrt(inner(b, b))
    for _ in range(iterations):
        Ap = apply(p) * (laplacian > 0)
        alpha = rz / inner(p, Ap)
        u = u + alpha * p
        r = r - alpha * Ap
        if math.sqrt(inner(r, r)) <= tol * norm_b:
            break
        z = preconditioner * r
        rz, rz_old = inner(r, z), rz
        p = z + (rz / rz_old) * p
    return u


def rayleigh_quotient(basis, rho: torch.Tensor, g: torch.Tensor) -> tuple[float, float]:
    """(R_mu(g), |g|_{H^-1(mu)}) for a grid function g and density rho (module docstring).

    rho is floored at max(DENSITY_FLOOR max rho, -min rho) throughout (the undershoot of an under-resolved
    spectral density measures its error, which 1 / rho would amplify) and renormalised to mass 1.  On S^1 the Poisson
    problem is solved exactly: -(rho u')' = f gives rho u' = C - F with F' = f (spectral antiderivative)
    and C = int F / rho / int 1 / rho (u periodic), so |g|^2_{H^-1} = int (C - F)^2 / rho dtheta; on S^2 by
    `weighted_poisson`."""
    rho = rho.clamp_min(max(DENSITY_FLOOR * float(rho.max()), -float(rho.min())))
    rho = rho / basis.integrate(rho)
    mean = float(basis.integrate(g * rho))
    f = rho * (g - mean)
    if basis.dim == 2:
        coefficients = basis.analysis(f)
        k = basis.fourier.wavenumber
        F = basis.synthesis(torch.where(k > 0, coefficients / (1j * torch.where(k > 0, k, 1.0)), 0.0))
        C = basis.integrate(F / rho) / basis.integrate(1 / rho)
        h_minus_one = float(basis.integrate((C - F) ** 2 / rho))
    else:
        grad_u = basis.gradient(weighted_poisson(basis, rho, f))
        h_minus_one = float(basis.integrate((grad_u * grad_u).sum(-1) * rho))
    grad_g = basis.gradient(basis.analysis(g))
    dirichlet = float(basis.integrate((grad_g * grad_g).sum(-1) * rho))
    return dirichlet / h_minus_one, math.sqrt(h_minus_one)
