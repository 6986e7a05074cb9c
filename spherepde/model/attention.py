"""The mean-field attention model (docs/design.md "The model"): its parameters and its velocity field.

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

from spherepde.base.arrays import amax, as_namespace, as_tensor, program_namespace, quiet
from spherepde.base.device import Placement
from spherepde.geometry.ambient import norm, tangent_projection
from spherepde.model.parameters import layer_values


@dataclass(frozen=True)
class Model:
    """Parameters of the forward equation of one run; matrices are (d, d) tensors on the run's device."""

    kernel: str
    beta: float
    B: torch.Tensor
    V: torch.Tensor
    W: torch.Tensor
    eps: float

    @classmethod
    def from_case(cls, case, placement: Placement) -> "Model":
        section = case["model"]
        return cls(
            kernel=section["kernel"],
            beta=float(section["beta"]),
            B=placement.tensor(section["B"]),
            V=placement.tensor(section["V"]),
            # a list of W, one per layer, is read whole where it is used (ForwardProblem.layer_drives, a training's
            # start_of_W): here the first
            W=placement.tensor(layer_values(section["W"], 1)[0]),
            eps=float(section["eps"]),
        )

    @property
    def dim(self) -> int:
        return self.B.shape[0]

    @property
    def zero_temperature(self) -> bool:
        return math.isinf(self.beta)


@dataclass(frozen=True)
class ModelBatch:
    """The models of M members advanced together, their parameters stacked on a leading member axis.

    Members share the kernel ("softmax" or "unnormalized") and whether beta is infinite; B, V, W (M, d, d),
    beta and eps (M,) may differ.  `models` keeps each member's own Model for the work done member by member
    (diagnostics, resolution checks, the seed-004 theory).
    """

    models: tuple
    B: torch.Tensor
    V: torch.Tensor
    W: torch.Tensor
    beta: torch.Tensor
    eps: torch.Tensor

    @classmethod
    def of(cls, models) -> "ModelBatch":
        models = tuple(models)
        first = models[0]
        for model in models[1:]:
            if model.kernel != first.kernel or model.zero_temperature != first.zero_temperature:
                raise ValueError("ModelBatch: members must share model.kernel and whether beta is infinite")
        real = first.B
        return cls(models, torch.stack([m.B for m in models]), torch.stack([m.V for m in models]),
                   torch.stack([m.W for m in models]), real.new_tensor([m.beta for m in models]),
                   real.new_tensor([m.eps for m in models]))

    @property
    def kernel(self) -> str:
        return self.models[0].kernel

    @property
    def zero_temperature(self) -> bool:
        return self.models[0].zero_temperature

    @property
    def members(self) -> int:
        return len(self.models)

    @property
    def dim(self) -> int:
        return self.B.shape[-1]

    def select(self, members) -> "ModelBatch":
        """The batch of the members at the indices `members` (a list), in that order."""
        return ModelBatch.of([self.models[m] for m in members])


def pointwise_product(points: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """x^T A_m at every point x, member by member: points (P, d) shared or (M, P, d), A (M, d, d) -> (M, P, d)."""
    return torch.matmul(points, A)


def zero_temperature_mean(B: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """m(x) = B^T x / |B^T x| (0 where B^T x = 0): B (M, d, d), points (P, d) or (M, P, d) -> (M, P, d).  m does
    not change with B's scale, so B is first divided by its largest |entry| (held constant under autograd: the
    derivative of m is homogeneous of degree -1, and d m(B / s) / dB at s fixed is that at B): |B^T x|^2 of a B
    of 1e-200 underflowed, and m was 0 everywhere."""
    scale = B.detach().abs().amax((-2, -1), keepdim=True)
    u = pointwise_product(points, B / torch.where(scale > 0, scale, 1.0))
    length = norm(u)[..., None]
    return torch.where(length > 0, u / torch.where(length > 0, length, 1.0), 0.0)


# Below this fraction of max |rho| the density is round-off of its transform or of a spectral undershoot: the
# attention mean there does not enter the flux rho v to any digit the run keeps.
NEGLIGIBLE_DENSITY = 1e-10


def softmax_mean(N: torch.Tensor, Z: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """m = N / Z (M, P, d) from N (M, P, d), Z (M, P); where |rho(x)| <= NEGLIGIBLE_DENSITY max |rho| (the
    member's maximum), bounded by |m| <= 1 (as the mean of a probability measure on the sphere is) and 0 where
    Z <= 0.

    A spectral density may dip below zero; both transforms compute Z of the band-limited rho without dividing
    (the spectral one to about kernel_tol / 100 of its scale), so Z stays positive while the undershoot is small
    against the mass within a kernel width.  Where it does not, m is undefined: NaN (not clipped), and the run's
    finiteness check turns that into a numerical failure at the next save, without a host round trip per
    evaluation.  At large beta Z(x) at a point far from all the mass is exp(-beta gap) of its scale, below the
    transform's accuracy: N / Z there is round-off, and Z may reach 0 or below.  Such points carry no mass either
    (between clusters, say), so bounding m there changes rho v only at the level of rho's own round-off, where an
    unbounded or undefined m would end a resolved run (beta = 1000, eps = 1e-2: |m| up to 2 on a quarter of the
    grid, then NaN).
    """
    mean = torch.where(Z[..., None] > 0, N / torch.where(Z > 0, Z, 1.0)[..., None], torch.nan)
    magnitude = rho.abs()
    void = (magnitude <= NEGLIGIBLE_DENSITY * magnitude.amax(-1, keepdim=True))[..., None]
    bounded = mean / norm(mean)[..., None].clamp(min=1)
    return torch.where(void, torch.nan_to_num(bounded, nan=0.0), mean)


def softmax_mean_adjoint(N: torch.Tensor, Z: torch.Tensor, rho: torch.Tensor,
                         m_bar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N_bar (M, P, d), Z_bar (M, P)): the transpose of the derivative of model.softmax_mean(N, Z, rho) applied
    to m_bar (the void mask, a function of rho, is piecewise constant: no cotangent flows through it).

    m = N / Z:  N_bar = mean_bar / Z,  Z_bar = -<mean_bar, m> / Z,  with mean_bar = m_bar except in the void,
    where |m| > 1 is bounded to m / |m| (mean_bar = (m_bar - m_hat <m_hat, m_bar>) / |m|) and Z <= 0 gives
    m = 0 (mean_bar = 0).  In numpy on the CPU outside autograd (base.arrays), where the void's terms are skipped
    when no point is void; N and m_bar may be strided views (the components' axis last)."""
    xp = program_namespace(N, Z, rho, m_bar)
    N, Z, rho, m_bar = (as_namespace(a, xp) for a in (N, Z, rho, m_bar))
    with quiet(xp):
        positive = Z > 0
        safe = xp.where(positive, Z, 1.0)[..., None]
        mean = xp.where(positive[..., None], N / safe, 0.0)
        magnitude = abs(rho)
        void = (magnitude <= NEGLIGIBLE_DENSITY * amax(magnitude, -1))[..., None]
        if xp is np and not void.any():
            N_bar = m_bar / safe
        else:
            length = ((mean * mean).sum(-1) ** 0.5)[..., None]
            direction = mean / xp.where(length > 0, length, 1.0)
            bounded_bar = xp.where(length > 1, (m_bar - direction * (direction * m_bar).sum(-1)[..., None]) / length,
                                   m_bar)
            mean_bar = xp.where(void, xp.where(positive[..., None], bounded_bar, 0.0), m_bar)
            N_bar = xp.where(void & ~positive[..., None], 0.0, mean_bar / safe)
        Z_bar = -(N_bar * mean).sum(-1)
    return as_tensor(N_bar), as_tensor(Z_bar)


def attention(batch: ModelBatch, exp_kernel, points: torch.Tensor, rho: torch.Tensor):
    """(m[rho], rho / Z) at the points: the attention mean (M, P, d), N / Z (softmax) or N (unnormalized),
    and for the softmax at finite beta the density of the softmax weights rho(y) / Z(x) (M, P) (what the
    continuous adjoint's nonlocal term integrates; None for the unnormalized kernel and at beta = inf).

    points (P, d) shared or (M, P, d); rho (M, P): densities on a grid, or ones for particles (the
    quadrature weights are the transform's); exp_kernel maps channels (M, P, c) to (scaled, log_scale) as
    `spherepde.kernels.choice` transforms do, member by member."""
    if batch.zero_temperature:
        return zero_temperature_mean(batch.B, points), None
    if batch.kernel == "unnormalized":  # N alone: no Z channel to transform
        N, log_scale = exp_kernel(rho[..., None] * points)
        return N * torch.exp(log_scale)[..., None], None
    scaled, log_scale = exp_kernel(torch.cat([rho[..., None], rho[..., None] * points], dim=-1))
    Z, N = scaled[..., 0], scaled[..., 1:]
    return softmax_mean(N, Z, rho), rho * torch.exp(-log_scale) / Z


def attention_mean(batch: ModelBatch, exp_kernel, points: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
    """m[rho] (M, P, d) of `attention`."""
    return attention(batch, exp_kernel, points, rho)[0]


def drift(batch: ModelBatch, points: torch.Tensor, mean_field: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """u(x) = W x + V m(x) (M, P, d), before the tangent projection; W (M, d, d) the members' feed-forward matrices."""
    return pointwise_product(points, W.transpose(-1, -2)) + pointwise_product(mean_field, batch.V.transpose(-1, -2))


def velocity(batch: ModelBatch, points: torch.Tensor, mean_field: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """v(x) = P_x(W x + V m(x)) as ambient vectors (M, P, d)."""
    return tangent_projection(points, drift(batch, points, mean_field, W))


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

    None when that eigenvalue is complex (no real invariant subspace to align with).  Ties and imaginary parts are
    judged relative to the largest |eigenvalue|, so that the space does not change with the matrix's scale (an
    absolute floor made every eigenvalue of a V B^T below 1e-9 "largest": E the whole space).
    """
    eigenvalues, eigenvectors = np.linalg.eig(np.asarray(matrix, dtype=float))
    top = eigenvalues.real.max()
    scale = np.abs(eigenvalues).max()
    chosen = np.abs(eigenvalues.real - top) <= rtol * scale
    if np.abs(eigenvalues[chosen].imag).max() > rtol * scale:
        return None
    q, r = np.linalg.qr(eigenvectors[:, chosen].real)
    rank = int((np.abs(np.diag(r)) > rtol).sum())
    return q[:, :rank]
