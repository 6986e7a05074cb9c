"""The mean-field attention model (DESIGN §2): its parameters and its velocity field.

    d_t rho = eps Lap rho - div(rho v[rho, t])
    v(x, t) = P_x(W_t x + V m[rho](x)),      P_x(y) = y - <x, y> x
    softmax:        m = N / Z
    unnormalized:   m = N
    beta = inf:     m = B^T x / |B^T x|  (softmax only)
with N(x) = int exp(beta <x, B y>) y rho(y) dsigma(y) and Z(x) = int exp(beta <x, B y>) rho(y) dsigma(y).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from .ambient import norm, tangent_projection
from .device import Placement
from .errors import CaseError
from .exp_kernel import kernel_degree


@dataclass(frozen=True)
class Model:
    """Parameters of the forward equation; matrices are (d, d) tensors on the run's device."""

    kernel: str
    beta: float
    B: torch.Tensor
    V: torch.Tensor
    W: torch.Tensor
    eps: float
    # Trained control: W_t = controls[l] on the l-th of controls.shape[0] equal slices of [0, horizon].
    controls: torch.Tensor | None = None
    horizon: float = math.inf

    @classmethod
    def from_case(cls, case, placement: Placement) -> "Model":
        section = case["model"]
        return cls(
            kernel=section["kernel"],
            beta=float(section["beta"]),
            B=placement.tensor(section["B"]),
            V=placement.tensor(section["V"]),
            W=placement.tensor(section["W"]),
            eps=float(section["eps"]),
        )

    @property
    def dim(self) -> int:
        return self.B.shape[0]

    @property
    def zero_temperature(self) -> bool:
        return math.isinf(self.beta)

    def layer(self, t: float) -> int:
        """Index l of the slice [l T / L, (l + 1) T / L) holding t (T = horizon, L layers; t = T in the last)."""
        layers = self.controls.shape[0]
        return min(max(int(math.floor(t * layers / self.horizon)), 0), layers - 1)

    def feed_forward(self, t: float) -> torch.Tensor:
        """W_t: model.W, or the piecewise-constant control of slice `layer(t)` when `controls` is set.

        Right-continuous at slice boundaries: a Runge-Kutta stage at the end of a step that ends on a
        boundary gets the next slice's W, so solvers that need W constant over a step (training) pass
        the step's W explicitly instead of calling this with stage times.
        """
        return self.W if self.controls is None else self.controls[self.layer(t)]


def zero_temperature_mean(model: Model, points: torch.Tensor) -> torch.Tensor:
    """m(x) = B^T x / |B^T x| (0 where B^T x = 0)."""
    u = points @ model.B
    length = norm(u)[..., None]
    return torch.where(length > 0, u / torch.where(length > 0, length, 1.0), 0.0)


# Below this fraction of max |rho| the density is round-off of its transform or of a spectral undershoot: the
# attention mean there does not enter the flux rho v to any digit the run keeps.
NEGLIGIBLE_DENSITY = 1e-10


def attention_mean(model: Model, exp_kernel, points: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """m[rho](x) on the grid: N / Z (softmax) or N (unnormalized); (*grid, d).

    For rho >= 0, Z > 0 and |N| <= Z.  A spectral density may dip below zero; both transforms
    compute Z of the band-limited rho without dividing (the spectral one to about kernel_tol / 100
    of its scale), so Z stays positive while the undershoot is small against the mass within a
    kernel width.  Where it does not, m is undefined: it is NaN there (not clipped), and the run's
    finiteness check turns that into a numerical failure at the next save, without a host round
    trip per evaluation (which would stall a GPU at every Runge-Kutta stage).  The exception is
    where rho itself is negligible (softmax_mean).
    """
    return attention(model, exp_kernel, points, rho)[0]


def softmax_mean(N: torch.Tensor, Z: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """m = N / Z; where |rho(x)| <= NEGLIGIBLE_DENSITY max |rho|, bounded by |m| <= 1 (as the mean of a
    probability measure on the sphere is) and 0 where Z <= 0.

    At large beta Z(x) at a point far from all the mass is exp(-beta gap) of its scale, below the transform's
    accuracy: N / Z there is round-off, and Z may reach 0 or below.  Such points carry no mass either (between
    clusters, say), so bounding m there changes rho v only at the level of rho's own round-off, where an
    unbounded or undefined m would end a resolved run (beta = 1000, eps = 1e-2: |m| up to 2 on a quarter of
    the grid, then NaN).  Elsewhere Z <= 0 still gives NaN and the run fails: the density is under-resolved.
    """
    mean = torch.where(Z > 0, N / torch.where(Z > 0, Z, 1.0), torch.nan)
    void = rho.abs()[..., None] <= NEGLIGIBLE_DENSITY * rho.abs().max()
    bounded = mean / norm(mean)[..., None].clamp(min=1)
    return torch.where(void, torch.nan_to_num(bounded, nan=0.0), mean)


def attention(model: Model, exp_kernel, points: torch.Tensor, rho: torch.Tensor):
    """(m[rho], rho / Z) on the grid: the attention mean of `attention_mean` and, for the softmax at
    finite beta, the density of the softmax weights rho(y) / Z(x) (what the adjoint's nonlocal term
    integrates; None for the unnormalized kernel and at beta = inf)."""
    if model.zero_temperature:
        return zero_temperature_mean(model, points), None
    channels = torch.cat([rho[..., None], rho[..., None] * points], dim=-1)
    scaled, log_scale = exp_kernel(channels)
    Z, N = scaled[..., :1], scaled[..., 1:]
    if model.kernel == "unnormalized":
        return N * torch.exp(log_scale)[..., None], None
    return softmax_mean(N, Z, rho), rho * torch.exp(-log_scale) / Z[..., 0]


def velocity(model: Model, points: torch.Tensor, mean_field: torch.Tensor, t: float) -> torch.Tensor:
    """v(x, t) = P_x(W_t x + V m(x)) as ambient vectors (*grid, d)."""
    drift = points @ model.feed_forward(t).T + mean_field @ model.V.T
    return tangent_projection(points, drift)


def interaction_energy(model: Model, exp_kernel, basis, rho: torch.Tensor) -> float:
    """-1/2 int int exp(beta <x, B y>) rho(x) rho(y) dsigma dsigma; -inf at beta = inf, and beyond float range."""
    if model.zero_temperature:
        return -math.inf
    scaled, log_scale = exp_kernel(rho[..., None])
    shift = float(log_scale.max())
    integral = float(basis.integrate(scaled[..., 0] * torch.exp(log_scale - shift) * rho))
    with np.errstate(over="ignore"):
        return float(-0.5 * integral * np.exp(shift))


def principal_subspace(matrix: np.ndarray, rtol: float = 1e-9) -> np.ndarray | None:
    """Orthonormal basis (d, k) of the eigenspace of the eigenvalue with largest real part.

    None when that eigenvalue is complex (no real invariant subspace to align with).
    """
    eigenvalues, eigenvectors = np.linalg.eig(np.asarray(matrix, dtype=float))
    top = eigenvalues.real.max()
    scale = max(1.0, np.abs(eigenvalues).max())
    chosen = np.abs(eigenvalues.real - top) <= rtol * scale
    if np.abs(eigenvalues[chosen].imag).max() > rtol * scale:
        return None
    q, r = np.linalg.qr(eigenvectors[:, chosen].real)
    rank = int((np.abs(np.diag(r)) > rtol).sum())
    return q[:, :rank]


def check_resolution(model: Model, basis, tol: float) -> None:
    """Refuse a grid too coarse for the kernel width (CaseError naming the lmax needed).

    The kernel exp(beta <C^T x, y>) has Funk-Hecke weights above tol up to degree
    kernel_degree(beta sigma_max(B)) (its width ~ 1/sqrt(beta sigma_max)); with rho of degree
    lmax the grid must integrate polynomials of degree kernel_degree + lmax exactly.  The same
    rule holds for both fields: the dense quadrature is accurate to tol only then, and the
    spectral transform, exact at any lmax for band-limited rho, yields an attention field that
    varies on the kernel width, which a coarser grid cannot carry through the product rho v.
    """
    if model.zero_temperature or model.beta == 0:
        return
    sigma_max = float(torch.linalg.matrix_norm(model.B.double(), ord=2))
    try:
        needed = kernel_degree(model.beta * sigma_max, basis.dim, tol)
    except ValueError:
        raise CaseError(f"model.beta: beta |B| = {model.beta * sigma_max:g} makes the kernel narrower than any "
                        f"grid can carry; lower model.beta or model.B, or use beta = \"inf\"") from None
    if needed + basis.lmax <= basis.quadrature_degree(basis.lmax):
        return
    lmax = basis.lmax
    while needed + lmax > basis.quadrature_degree(lmax):
        lmax += 1
    raise CaseError(
        f"sphere.lmax: {basis.lmax} is too coarse for model.beta = {model.beta:g} "
        f"(kernel needs degree {needed} at solver.kernel_tol = {tol:g}); use lmax >= {lmax}")
