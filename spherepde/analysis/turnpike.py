"""Seed-004 diagnostics of a trained forward run: energy gap, turnpike plateau, terminal escape.

All quantities are nondimensional (t is depth).  For the unnormalized kernel with B symmetric and V = c B (the
seed's model: B = V = A, beta = 1, c = 1) the energy is the run's `free_energy` (spherepde/model/energy.py), the
pair integral weighted by w = c / beta (`energy_weight`; 1 in the seed),

    E(mu) = eps int rho log rho dsigma - w/2 int int exp(beta <x, B y>) dmu(x) dmu(y),

and min E is attained at a Gibbs fixed point  rho ∝ exp(w U / eps),  U(x) = int exp(beta <x, B y>) dmu(y),
found by damped fixed-point iteration on the grid from a cluster at the leading eigenvector of B
(`gibbs_minimum`; both wells +-e_1 have the same energy).  The energy gap is Delta(t) = E(mu_t) - min E.

Three-phase test (`phases`, its "three_phase"; "untested" without a save in the middle half of [0, T] or with a
gap that is not finite), with Delta_ref the median of Delta over the middle half of [0, T]
and the threshold h = Delta_ref + 0.05 (max Delta - Delta_ref):
  plateau        the largest interval of save times around T / 2 on which Delta <= h; its start is
                 the initial boundary-layer width tau, T minus its end the terminal width r (none when
                 Delta(T / 2) > h: width 0, tau, r and the relative variance below NaN, and so the terminal
                 rates and `terminal_displacement`; no test, "untested", without a save in the middle half or
                 with a gap that is not finite: then the width is NaN as well);
  clustering     Delta(0) > h (the energy falls across the initial layer);
  flat plateau   var(Delta on the plateau) / (max Delta - min Delta)^2 <= 0.05 (relative variance);
  escape         Delta(T) - Delta_ref >= 0.1 (terminal energy lift).
Terminal energy rate: least-squares slope a of log(Delta(t) - Delta_ref) over the terminal layer of the
trained run, Delta - Delta_ref ~ C exp(-a (T - t)) (`exponential_rate`: a training's terminal_energy_rate;
nonlinear there: the mean turns by ~1.5 rad).

Rayleigh quotient (escape rate of linear theory).  Near a critical point mu of E (the Gibbs
minimum: eps grad log rho = grad U) the forward equation linearises to d_t s = -K H s, with
K f = -div(rho grad f) and H the flat second variation of E,

    H s = eps s / rho - w T[s],   <s, H s> = eps int s^2 / rho - w int int exp(beta <x, B y>) s(x) s(y),

and the adjoint to d_t phi = H K phi, i.e. phi_t = exp(-(T - t) H K) g backward from phi_T = g = dl/dmu.
H K is self-adjoint for <f, h>_K = int grad f . grad h dmu, with the Rayleigh quotient

    R_mu(g) = <K g, H K g> / <g, K g> = Hess_W E(mu)[grad g, grad g] / |grad g|^2_{L2(mu)}

(the Wasserstein Hessian of E along the velocity grad g: `rayleigh_quotient`; `wasserstein_hessian` takes
any velocity field).  Expanding g in eigenfunctions of H K, log |grad phi_t|_{L2(mu)} is convex in T - t
with slope exactly R_mu(g) at t = T: the adjoint, and with it the control W_t ∝ int grad phi_t x^T dmu
of a gradient step and the displacement it causes, grows towards the output layer at rate R_mu(g)
near T (|grad phi_t| >= |grad g| exp(-(T - t) R_mu(g)), the seed's one-step bound), and deep in the
plateau at the smallest eigenvalue present in g (equal to R_mu(g) when g is an eigenfunction, as the
align gradient -<x, e_2> is to 1e-3: the rotation of the cluster).

The seed prints R = |grad g|^2_{L2(mu)} / |g|^2_{H^-1(mu)} instead; for a cluster of width s that is
~ 1/s^4 ~ eps^-2, not a rate (2.6e3 for the align gradient at eps = 0.05, A = diag(1, 0.65), where the
adjoint grows at 0.91), so we report it apart as `h_minus_one_quotient`, with |g|^2_{H^-1(mu)} = int |grad u|^2 dmu,
u the solution of the weighted Poisson problem -div(rho grad u) = rho (g - int g dmu) (exact quadrature on S^1;
conjugate gradients in spectral space, preconditioned by the inverse of -rho_mean Lap, on S^2).

Escape rate (`escape_rate`): the slope of log |grad phi_t|_{L2(mu_t)} of the adjoint at the initial
control (the first gradient step, the seed's 1-GD) over the last 1 / R_mu(g) of depth, to be compared
with R_mu(g) at the Gibbs minimum; the adjoint's plateau rate (`adjoint_rate`, same fit from the
plateau's start to its end, at the trained control) gives the slowest mode.
"""

import math

import numpy as np
import torch

from spherepde.model.attention import principal_subspace
from spherepde.model.energy import FreeEnergy

# Density floor of the weighted norms, relative to max rho: the H^-1(mu) norm weighs errors by 1 / rho, and a
# spectral density is known only to ~1e-16 of its maximum (it even dips below zero in its tails).
DENSITY_FLOOR = 1e-10


def energy_weight(model) -> float:
    """w = c / beta of the pair integral in E (module docstring): the energy the flow dissipates for the unnormalized
    kernel with B symmetric, V = c B (spherepde/model/energy.py, the run's `free_energy`); 1, the seed's E, for a
    model without such an energy (its Gibbs state is then no stationary state of the flow)."""
    energy = FreeEnergy.of_model(model)
    return 1.0 if energy.weight is None or energy.mean_field else energy.weight


def gibbs_minimum(model, exp_kernel, basis, direction: torch.Tensor, damping: float = 0.5, tol: float = 1e-12,
                  iterations: int = 5000) -> tuple[torch.Tensor, float]:
    """(rho, E(rho)) at the Gibbs fixed point rho ∝ exp(w U[rho] / eps) near the cluster at `direction`.

    Damped iteration in U: U <- (1 - damping) U + damping T[rho(U)], stopped when the update is below
    tol |U|, or below 64 units of the grid's roundoff where that is larger (a float32 grid's update stalls at a
    few of its ulps, 2.4e-7).  Raises RuntimeError when it does not converge.
    """
    eps = model.eps / energy_weight(model)  # rho ∝ exp(U / (eps / w))
    points = basis.points
    tol = max(tol, 64 * torch.finfo(points.dtype).eps)
    potential = math.exp(model.beta) * (points @ direction)  # a cluster at `direction` as a start
    for _ in range(iterations):
        rho = _gibbs_density(potential, eps, basis)
        update = _interaction_potential(exp_kernel, rho)
        change = float((update - potential).abs().max())
        potential = (1 - damping) * potential + damping * update
        if change <= tol * float(update.abs().max()):
            break
    else:
        raise RuntimeError(f"the Gibbs fixed point did not converge in {iterations} iterations "
                           f"(last change {change:.2e})")
    rho = _gibbs_density(potential, eps, basis)
    return rho, free_energy(model, exp_kernel, basis, rho)


def _gibbs_density(potential: torch.Tensor, eps: float, basis) -> torch.Tensor:
    weights = torch.exp((potential - potential.max()) / eps)
    return weights / basis.integrate(weights)


def free_energy(model, exp_kernel, basis, rho: torch.Tensor) -> float:
    """E = eps int rho log rho - w/2 int int exp(beta <x, B y>) rho rho, w = `energy_weight` (quadrature on the grid;
    rho log rho = 0 where rho <= 0)."""
    interaction = -0.5 * energy_weight(model) * float(basis.integrate(_interaction_potential(exp_kernel, rho) * rho))
    positive = rho.clamp_min(0)
    entropy = float(basis.integrate(torch.where(positive > 0, positive * torch.log(positive.clamp_min(1e-300)), 0.0)))
    return model.eps * entropy + interaction


def verdict(test: dict) -> str:
    """A run's three_phase attribute from `phases`' result: "true", "false", or "untested" where no save lies in the
    middle half of [0, T] or the gap is not finite (no reference Delta_ref, so no test: "false" read as a test run
    and failed)."""
    if not test["tested"]:
        return "untested"
    return "true" if test["three_phase"] else "false"


def terminal_displacement(times: np.ndarray, mean: np.ndarray, test: dict) -> float:
    """The angle the mean (time, d) turns across the terminal layer, from the save nearest the plateau's middle to T
    (radians): on S^1 the difference of the unwrapped mean_angle (signed, and past pi where it turns further); on
    S^2 the angle between the two means (unsigned: mean_angle's difference, the angles from e_1, read 0 for a mean
    at e_3 turning 1.5 rad towards e_2).  NaN without a plateau, where there is no terminal layer to measure (the
    centre save stood in for the plateau, and the angle from T / 2 was reported as the layer's)."""
    if not test["plateau"]:
        return math.nan
    middle = int(np.argmin(np.abs(times - 0.5 * (test["plateau_start"] + test["plateau_end"]))))
    if mean.shape[-1] == 2:
        angle = mean_angle(mean)
        return float(angle[-1] - angle[middle])
    end, start = mean[-1], mean[middle]
    # atan2 of |a x b| and a . b: accurate at small angles, where arccos of the cosine loses half the digits
    return float(np.arctan2(np.linalg.norm(np.cross(start, end)), start @ end))


def mean_angle(mean: np.ndarray) -> np.ndarray:
    """S^1: signed angle atan2(m_2, m_1) of the mean (radians), unwrapped along the first (time) axis of a series;
    S^2: angle between the mean and e_1.

    Unwrapped so that a difference of two saves is the angle the mean has turned: atan2 jumps by 2 pi where the
    mean crosses -e_1, and a cluster in the well at -e_1 turned by -1.60 rad towards e_2 read as 4.68 rad."""
    if mean.shape[-1] == 2:
        angle = np.arctan2(mean[..., 1], mean[..., 0])
        return np.unwrap(angle, axis=0) if angle.ndim else angle
    return np.arccos(np.clip(mean[..., 0] / np.linalg.norm(mean, axis=-1), -1, 1))


def phases(times: np.ndarray, gap: np.ndarray) -> dict:
    """The three-phase test of the module docstring on the energy gap Delta(t) at the save times."""
    T = times[-1]
    middle = (times >= 0.25 * T) & (times <= 0.75 * T)
    reference = float(np.median(gap[middle])) if middle.any() else math.nan
    threshold = reference + 0.05 * (gap.max() - reference)
    centre = int(np.argmin(np.abs(times - 0.5 * T)))
    below = gap <= threshold
    tested = bool(middle.any() and np.isfinite(gap).all())
    found = tested and bool(below[centre])
    start = end = centre
    if found:
        while start > 0 and below[start - 1]:
            start -= 1
        while end < len(times) - 1 and below[end + 1]:
            end += 1
    plateau = slice(start, end + 1)
    spread = max(gap.max() - gap.min(), 1e-300)
    relative_variance = float(np.var(gap[plateau]) / spread ** 2)
    lift = float(gap[-1] - reference)
    # Without a plateau (Delta(T / 2) > h) the boundary layers and the plateau's flatness are undefined: NaN, not
    # the widths T / 2 and the zero variance of the single save at T / 2.  Without a save in the middle half there
    # is no reference either, and no test; nor with a gap that is not finite (a model whose run has no free_energy,
    # or an infinite Delta(0), which made the threshold infinite and every save "on the plateau").  An untested run
    # measures no plateau, so its width is NaN too: 0 read as a test that found none.
    result = {
        "tested": tested, "plateau": found,
        "gap_reference": reference,
        "plateau_start": float(times[start]), "plateau_end": float(times[end]),
        "plateau_width": float(times[end] - times[start]) if found else (0.0 if tested else math.nan),
        "initial_width": float(times[start]) if found else math.nan,
        "terminal_width": float(T - times[end]) if found else math.nan,
        "clustering": bool(gap[0] > threshold), "plateau_relative_variance": relative_variance if found else math.nan,
        "terminal_lift": lift,
    }
    result["three_phase"] = bool(found and result["clustering"] and relative_variance <= 0.05 and lift >= 0.1)
    return result


def exponential_rate(times: np.ndarray, values: np.ndarray, start: float, end: float = math.inf) -> float:
    """Least-squares slope a of log(values) = a t + b over start <= t <= end (positive values only);
    NaN if < 2 points."""
    chosen = (times >= start) & (times <= end) & (values > 0)
    if chosen.sum() < 2:
        return math.nan
    return float(np.polyfit(times[chosen], np.log(values[chosen]), 1)[0])


def turnpike_bound(times: np.ndarray, gap: np.ndarray) -> tuple[float, float]:
    """(C, a) of the seed's turnpike bound Delta(t) <= C (exp(-a t) + exp(-a (T - t))) on a run's energy gap:
    C = max(Delta(0), Delta(T)) (the bound at the ends is C (1 + exp(-a T))), and a the largest rate for which the
    bound holds at every save time (0 when Delta exceeds 2 C somewhere: no exponential bound with this C).  Each
    time t in (0, T) bounds a by the root of Delta(t) = C (exp(-a t) + exp(-a (T - t))) (the right side falls in
    a), found by bisection; times with Delta(t) <= 0 bound nothing (on the plateau the run's energy can lie
    below the reference min E by the discretisation's error, which exceeds round-off)."""
    T = times[-1]
    C = float(max(gap[0], gap[-1]))
    inner = (times > 0) & (times < T) & (gap > 0)
    t, target = times[inner], gap[inner] / C
    if np.any(target >= 2):
        return C, 0.0
    low, high = np.zeros_like(t), np.full_like(t, 1.0)
    while np.any(np.exp(-high * t) + np.exp(-high * (T - t)) > target):  # a bracket for every time
        high = np.where(np.exp(-high * t) + np.exp(-high * (T - t)) > target, 2 * high, high)
    for _ in range(100):
        middle = 0.5 * (low + high)
        holds = np.exp(-middle * t) + np.exp(-middle * (T - t)) >= target
        low, high = np.where(holds, middle, low), np.where(holds, high, middle)
    return C, float(low.min()) if t.size else math.inf


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


def h_minus_one_quotient(basis, rho: torch.Tensor, g: torch.Tensor) -> tuple[float, float]:
    """(|grad g|^2_{L2(mu)} / |g|^2_{H^-1(mu)}, |g|_{H^-1(mu)}): the seed's printed quotient (module docstring).

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


def wasserstein_hessian(model, exp_kernel, basis, rho: torch.Tensor, velocity: torch.Tensor) -> float:
    """Hess_W E(mu)[X, X] = eps int s^2 / rho - w int s T[s], s = -div(rho X), at a critical point mu of E.

    E is the energy of the module docstring (unnormalized kernel, V = c B, B symmetric: the forward equation is then
    the Wasserstein gradient flow of E; w = c / beta, `energy_weight`).  X: tangent field (*grid, d) in ambient
    coordinates.  At a critical point eps grad log rho = w grad U, U = T[rho], so s / rho = -(div X + w X . grad U
    / eps) is computed from smooth fields: a spectral s = -div(rho X) divided by rho would blow up its truncation
    error in the tails, where rho ~ 1e-30."""
    weight = energy_weight(model)
    potential = _interaction_potential(exp_kernel, rho)
    grad_potential = basis.gradient(basis.analysis(potential))
    ratio = -(basis.synthesis(basis.divergence(velocity)) + weight * (velocity * grad_potential).sum(-1) / model.eps)
    s = rho * ratio
    interaction = weight * float(basis.integrate(s * _interaction_potential(exp_kernel, s)))
    return model.eps * float(basis.integrate(rho * ratio * ratio)) - interaction


def _interaction_potential(exp_kernel, f: torch.Tensor) -> torch.Tensor:
    """T[f](x) = int exp(beta <x, B y>) f(y) dsigma(y) on the grid."""
    scaled, log_scale = exp_kernel(f[..., None])
    return scaled[..., 0] * torch.exp(log_scale)


def rayleigh_quotient(model, exp_kernel, basis, rho: torch.Tensor, g: torch.Tensor) -> float:
    """R_mu(g) = Hess_W E(mu)[grad g, grad g] / |grad g|^2_{L2(mu)} (module docstring): the rate, per unit
    depth, at which the adjoint phi_T = g grows towards the output layer when g is an eigenfunction of H K."""
    grad_g = basis.gradient(basis.analysis(g))
    dirichlet = float(basis.integrate((grad_g * grad_g).sum(-1) * rho))
    return wasserstein_hessian(model, exp_kernel, basis, rho, grad_g) / dirichlet


def gibbs_well(model, exp_kernel, basis, cluster_mean: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """`gibbs_minimum` in the well of the leading eigenvector e_1 of B, the one of +-e_1 nearest `cluster_mean`
    (+e_1 without it; both wells have the same energy)."""
    direction = torch.as_tensor(principal_subspace(model.B.cpu().double().numpy())[:, 0]).to(basis.points)
    if cluster_mean is not None and float(direction @ cluster_mean.to(direction)) < 0:
        direction = -direction
    return gibbs_minimum(model, exp_kernel, basis, direction)


def plateau_theory(model, exp_kernel, basis, loss, cluster_mean: torch.Tensor) -> dict:
    """The Gibbs minimum in the well of the leading eigenvector of B nearest `cluster_mean` (the two wells
    +-e_1 have the same energy), and at it the loss gradient g = dl/dmu with its quotients:
    {"gibbs": rho, "min_energy", "rayleigh_quotient" R_mu(g), "h_minus_one_quotient", "h_minus_one_norm"}."""
    rho, min_energy = gibbs_well(model, exp_kernel, basis, cluster_mean)
    points = basis.points.reshape(-1, basis.dim)
    g = loss.first_variation(points, (rho * basis.weights).reshape(-1)).reshape(basis.grid_shape)
    quotient, norm = h_minus_one_quotient(basis, rho, g)
    return {"gibbs": rho, "min_energy": min_energy,
            "rayleigh_quotient": rayleigh_quotient(model, exp_kernel, basis, rho, g),
            "h_minus_one_quotient": quotient, "h_minus_one_norm": norm}


def escape_rate(times: np.ndarray, adjoint_norm: np.ndarray, quotient: float) -> float:
    """Fitted a in |grad phi_t|_{L2(mu_t)} ~ exp(-a (T - t)) over the last 1 / R_mu(g) of depth (one e-fold of the
    predicted amplification; module docstring): NaN unless R_mu(g) > 0."""
    if not quotient > 0:
        return math.nan
    return exponential_rate(times, adjoint_norm, times[-1] - 1 / quotient)


def _circle_kernel(B, points: int) -> np.ndarray:
    """exp(<x_i, B x_j>) times the trapezoid weight 2 pi / points on the uniform S^1 grid theta_j = 2 pi j / points."""
    theta = 2 * np.pi * np.arange(points) / points
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    return np.exp(x @ np.asarray(B, dtype=float) @ x.T) * (2 * np.pi / points)


def circle_gibbs_state(B, eps: float, even: bool, points: int = 256, tol: float = 1e-13,
                       iterations: int = 100000) -> np.ndarray:
    """S^1, the seed's energy (unnormalized kernel, B = V symmetric, beta = 1): a fixed point rho ∝ exp(U[rho] / eps),
    U(x) = int exp(<x, B y>) drho(y), on the uniform grid theta_j = 2 pi j / points (the trapezoid rule is spectrally
    accurate for these smooth periodic integrands).  even: the high-noise branch, iterated from the uniform density
    and kept even under x -> -x by symmetrising each iterate (for B != c I the uniform density is not stationary:
    its U is I_0(|B x|)); else the polar branch, iterated from a cluster at e_1 (it decays onto the even branch
    above the polarisation threshold, slowly near it).  Damped iteration in rho."""
    kernel, weight = _circle_kernel(B, points), 2 * np.pi / points
    theta = 2 * np.pi * np.arange(points) / points
    rho = np.full(points, 1 / (2 * np.pi)) if even else np.exp((np.exp(np.cos(theta)) - np.exp(1.0)) / eps)
    rho /= rho.sum() * weight
    for _ in range(iterations):
        potential = kernel @ rho
        new = np.exp((potential - potential.max()) / eps)
        new /= new.sum() * weight
        if even:
            new = 0.5 * (new + np.roll(new, points // 2))
        if np.abs(new - rho).max() <= tol * new.max():
            return new
        rho = 0.5 * (rho + new)
    raise RuntimeError(f"the S^1 Gibbs iteration did not converge in {iterations} iterations at eps = {eps}")


def circle_order_parameter(rho: np.ndarray) -> float:
    """|int x drho| of a density on the uniform S^1 grid of `circle_gibbs_state`."""
    theta = 2 * np.pi * np.arange(len(rho)) / len(rho)
    return float(abs((rho * np.exp(1j * theta)).sum() * 2 * np.pi / len(rho)))


def polarisation_threshold(B, points: int = 256) -> float:
    """The noise eps_c below which the seed's energy on S^1 (B symmetric, beta = 1) has a clustered (polar) minimiser:
    the even high-noise state rho_e is stable against odd perturbations s (s(-x) = -s(x), mass-neutral) while
    <s, H s> = eps int s^2 / rho_e - int int exp(<x, B y>) s s >= 0, i.e. while eps >= the largest odd eigenvalue of
    sqrt(rho_e) T sqrt(rho_e) (T the kernel's integral operator); eps_c solves eps = that eigenvalue (rho_e depends on
    eps).  For B = c I (rho_e uniform, odd eigenfunction cos theta) eps_c = I_1(c): 0.5652 at c = 1.  0.0 where the
    even state is stable at every eps from 5 max|B_ij| down to max|B_ij| / 100 (below, the grid does not resolve
    rho_e): for B negative semidefinite at every eps, the odd part sinh(<x, B y>) of the kernel being negative
    semidefinite (a sum of odd powers of the kernel <x, -B y>)."""
    from scipy.optimize import brentq

    kernel = _circle_kernel(B, points)
    odd = 0.5 * (np.eye(points) - np.roll(np.eye(points), points // 2, axis=1))

    def excess(eps):
        root = np.sqrt(circle_gibbs_state(B, eps, even=True, points=points))
        return eps - float(np.linalg.eigvalsh(odd @ (root[:, None] * kernel * root[None, :]) @ odd).max())

    scale = float(np.abs(np.asarray(B, dtype=float)).max())
    if scale == 0:
        return 0.0
    # The odd eigenvalue tends to the uniform state's as eps grows (I_1(c) for B = c I, beyond any fixed bracket at
    # c >= 6), so the bracket's top end is raised until the even state is stable there.
    high = 5.0 * scale
    while excess(high) <= 0:
        high *= 4
    low = 0.05 * scale
    while excess(low) >= 0:
        if low <= scale / 100:
            return 0.0
        low /= 4
    return brentq(excess, low, high, xtol=1e-10)
