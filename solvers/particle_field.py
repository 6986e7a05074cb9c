"""The drift of a particle system: the model's velocity (spherepde.model.attention) with the empirical measure
mu_n = (1/n) sum_j delta_{x_j} in place of rho, for M members of R systems each.

The attention integral is the exponential-kernel sum over the particles with weights 1/n
(spherepde.kernels dense quadrature), or, for the softmax kernel on CUDA, fused scaled-dot-product attention
m_i = sum_j softmax_j(beta <B^T x_i, x_j>) x_j (the same sum; memory O(n) per row where a fused kernel serves the
dtype, while float64's math backend forms each block's logits, which the block's cap bounds).  On the CPU the dense
sum is used: torch's float64 CPU attention measured about 2x slower than it (n = 1e4, S^2, one core).
The seeds' model at 0 < beta < inf takes the direct sums (ParticleField.is_direct): a forward run on the CPU at any
n, its kernel formed in blocks of query rows, and a training, or torch's program (CUDA), while a system's (n, n)
kernel, formed whole, fits DIRECT_BYTES; without a shift where beta |B| allows (within_direct_range), else (the
softmax only) with each row shifted by its largest logit: solvers/particle_step.py (`direct_mean` here; the
particle step itself is that module's array program).  At beta = inf the case chooses between
  "mean_field": m(x) = B^T x / |B^T x|, the local field of the Eulerian equation, so the
                particles are its characteristics (they do not interact), and
  "hardmax":    m(x_i) = x_{j*}, j* = argmax_j <x_i, B x_j>, the beta -> inf limit of the
                softmax over the particles.

The model beyond the seeds (spherepde.model.parameters: several heads, B and V per layer, a two-layer
feed-forward) is `HeadsField`: spherepde.model.heads's drift with the particles of a system as the points and
the quadrature, masses 1 / n_s each and density ones, v(x_i) = P_x(f(x_i) + sum_h V_h m_h[mu_n](x_i)).  Its
beta = inf heads take the local field B^T x / |B^T x| (the "mean_field" choice).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from solvers import particle_step
from spherepde.base.arrays import program_namespace
from spherepde.geometry.ambient import tangent_projection
from spherepde.kernels.dense import block_rows, dense_exp_kernel
from spherepde.model.attention import ModelBatch, attention_mean, velocity, zero_temperature_mean
from spherepde.model.heads import drift


@dataclass(frozen=True)
class EmpiricalMeasure:
    """The particles seen as a quadrature: points x_j with weights 1/n (what DenseExpKernel integrates over)."""

    points: torch.Tensor

    @property
    def dim(self) -> int:
        return self.points.shape[1]

    @property
    def grid_shape(self) -> tuple[int]:
        return (self.points.shape[0],)

    @property
    def weights(self) -> torch.Tensor:
        return torch.full(self.grid_shape, 1 / self.points.shape[0], dtype=self.points.dtype,
                          device=self.points.device)


def hardmax_mean(B: torch.Tensor, points: torch.Tensor, chunk: int | str) -> torch.Tensor:
    """m(x_i) = x_{j*}, j* = argmax_j <x_i, B x_j> = argmax_j <B^T x_i, x_j>, per system: B (S, d, d), points
    (S, n, d) (blocks of `block_rows(chunk)` rows, "auto" shared among the S systems)."""
    rows = block_rows(chunk, points.shape[-2], points.dtype, points.device, points.shape[0])
    queries = torch.matmul(points, B)
    keys = points.transpose(-1, -2).contiguous()
    # Each block's indices go straight into one array made beforehand: kept block by block, the small arrays took
    # the freed space of each block's logits from the next, and glibc's heap grew by a block a block (400 systems
    # of 1000 tokens at 7 rows: 3.0 GB, the whole kernel, for 22 MB blocks).
    index = torch.empty(points.shape[:-1], dtype=torch.long, device=points.device)
    for start in range(0, points.shape[-2], rows):
        index[:, start:start + rows] = torch.matmul(queries[:, start:start + rows], keys).argmax(-1)
    return torch.gather(points, 1, index[..., None].expand(-1, -1, points.shape[-1]))


def fused_softmax_mean(B: torch.Tensor, beta: torch.Tensor, points: torch.Tensor, chunk: int | str) -> torch.Tensor:
    """m(x_i) = sum_j softmax_j(beta <B^T x_i, x_j>) x_j by fused attention per system (B (S, d, d), beta (S,),
    points (S, n, d)), `block_rows(chunk)` query rows per call, "auto" shared among the S systems."""
    rows = block_rows(chunk, points.shape[-2], points.dtype, points.device, points.shape[0])
    queries = beta[:, None, None] * torch.matmul(points, B)
    m = torch.empty_like(points)
    for start in range(0, points.shape[-2], rows):
        m[:, start:start + rows] = F.scaled_dot_product_attention(queries[:, start:start + rows], points, points,
                                                                  scale=1.0)
    return m


# Where a system's (n, n) kernel is formed whole (a training: its transposes keep each stage's kernel, autograd's
# too; torch's program, on CUDA), the direct sums serve while it takes at most this many bytes (2896 tokens in
# float64, 4096 in float32).  A forward run's numpy program forms it in blocks of query rows
# (particle_step.kernel_sums), memory O(n) a system: the direct sums serve it at any n.  Per system, not per batch:
# a member then takes the same path in any batch, as its serial run (bit for bit).
DIRECT_BYTES = 2 ** 26


def within_direct_range(reach: float, dtype: torch.dtype) -> bool:
    """Whether the kernel's largest exponent beta |B|_2 (`reach`) stays below half the exponent range of `dtype`
    (354.9 in float64, 44.4 in float32), where the direct sums take the kernel exp(beta <x_i, B x_j>) unshifted: no
    sum of n exponentials overflows.  Beyond it they serve the softmax alone, each kernel row shifted by its largest
    logit (particle_step.kernel_products; the shift's passes over the kernel would cost 1.7 times the unshifted
    step at n = 2000 where it is not needed); the unnormalized kernel, which has no such freedom, takes the
    generic sums there."""
    return reach <= 0.5 * math.log(torch.finfo(dtype).max)


class SystemKernel:
    """The exponential-kernel sum over each system's particles with weights 1/n_s, where the direct sums do
    not serve: channels (S, n_s, c) -> (scaled, log_scale) as the transforms of spherepde.kernels give them
    (model.attention's `exp_kernel`).  beta = 0: the plain sums; else the shifted blocks of
    kernels.dense.dense_exp_kernel.  `interacting`: whether any system's beta is nonzero, known once per run (read
    from beta at each call, it would make a CUDA stream wait for the host at every drift)."""

    def __init__(self, points: torch.Tensor, B: torch.Tensor, beta: torch.Tensor, chunk: int | str,
                 interacting: bool):
        self.points, self.B, self.beta, self.chunk, self.interacting = points, B, beta, chunk, interacting

    def __call__(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = f / self.points.shape[-2]
        zero = torch.zeros(f.shape[:-1], dtype=f.dtype, device=f.device)
        if not self.interacting:  # beta = 0: the constant kernel, every particle sees the plain sum
            return f.sum(-2, keepdim=True).expand_as(f), zero
        return dense_exp_kernel(self.points, self.points, f, self.B, self.beta, self.chunk)


class ParticleField:
    """v[mu_n](x_i) for the members' particles x (M, n, d), W (M, d, d); `attention` is "fused", "dense", "local"
    or "hardmax"; each member's tokens are `replicas` independent systems (module docstring).  `trained`: the
    field of a training, whose steps are transposed (DIRECT_BYTES)."""

    def __init__(self, batch: ModelBatch, attention: str, chunk: int | str, replicas: int = 1, trained: bool = False):
        self.batch, self.attention, self.chunk, self.replicas = batch, attention, chunk, replicas
        self.trained = trained
        self.systems = batch.select([m for m in range(batch.members) for _ in range(replicas)])
        self.coupling = self.systems.beta[:, None, None] * self.systems.B  # C = beta B per system
        self.interacting = bool(self.systems.beta.any())
        self.direct = self.shifted = None  # is_direct and the kernel's shift, found at the first call (it needs n)

    @classmethod
    def from_case(cls, case, batch: ModelBatch) -> "ParticleField":
        solver = case["solver"]
        if batch.zero_temperature:
            attention = "local" if case["particles"]["beta_inf_mode"] == "mean_field" else "hardmax"
        elif (batch.kernel == "softmax" and bool((batch.beta > 0).all()) and solver["field"] == "auto"
              and batch.B.device.type == "cuda"):
            attention = "fused"
        else:
            attention = "dense"
        # a case with a [control] section is a training's (spherepde.api.ensemble.run_batch): all its runs, the
        # forward ones too, take the path of its transposes
        return cls(batch, attention, solver["chunk"], case["particles"]["replicas"], bool(case["control"]))

    def _systems(self, x: torch.Tensor) -> torch.Tensor:
        """(M, n, d) -> (M R, n / R, d)."""
        return x.reshape(x.shape[0] * self.replicas, -1, x.shape[-1])

    def mean_field(self, x: torch.Tensor) -> torch.Tensor:
        """m at every particle (M, n, d)."""
        points, systems = self._systems(x), self.systems
        if self.attention == "local":
            m = zero_temperature_mean(systems.B, points)
        elif self.attention == "hardmax":
            m = hardmax_mean(systems.B, points, self.chunk)
        elif self.attention == "fused":
            m = fused_softmax_mean(systems.B, systems.beta, points, self.chunk)
        elif self.is_direct(points):
            xp = program_namespace(points, self.coupling)
            coupling = self.coupling.transpose(-1, -2)
            m = particle_step.direct_mean(xp, particle_step.rows_of(xp, points),
                                          coupling.numpy() if xp is np else coupling, systems.kernel == "softmax",
                                          self.shifted)
            m = particle_step.tensor_of(xp, m.swapaxes(1, 2))
        else:
            ones = torch.ones(points.shape[:2], dtype=points.dtype, device=points.device)
            kernel = SystemKernel(points, systems.B, systems.beta, self.chunk, self.interacting)
            m = attention_mean(systems, kernel, points, ones)
        return m.reshape(x.shape)

    def is_direct(self, points: torch.Tensor) -> bool:
        """Whether the dense attention of these systems' points (S, p, d) is the direct sums' (beta > 0; the kernel
        in blocks, a forward run's on the CPU, or within DIRECT_BYTES; the exponent range for the unnormalized
        kernel), and whether their kernel is `shifted` (the softmax's beyond that range: within_direct_range)."""
        if self.direct is None:
            systems, dtype, p = self.systems, self.systems.B.dtype, points.shape[1]
            reach = float((systems.beta * torch.linalg.matrix_norm(systems.B.double(), ord=2)).max())
            softmax, within = systems.kernel == "softmax", within_direct_range(reach, dtype)
            # the program is numpy's on the CPU (program_namespace), whose forward stages form the kernel in blocks
            blocked = points.device.type == "cpu" and not self.trained
            self.shifted = softmax and not within
            self.direct = (self.attention == "dense" and bool((systems.beta > 0).all())
                           and (blocked or p * p * torch.finfo(dtype).bits // 8 <= DIRECT_BYTES)
                           and (softmax or within))
        return self.direct

    def __call__(self, x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """v(x_i) = P_x(W x + V m(x)) (M, n, d)."""
        return velocity(self.batch, x, self.mean_field(x), W)


class HeadsField:
    """v[mu_n](x_i) = P_x(f(x_i) + sum_h V_h m_h[mu_n](x_i)) for the members' particles x (M, n, d) and their
    parameters theta_l (M, p) of one layer (the drive in place of ParticleField's W); each member's tokens are
    `replicas` independent systems, each its own quadrature (masses 1 / n_s).  Members whose drifts differ in
    form (a sweep over a head's beta, say: the heads, the hidden width or the activation) are evaluated group by
    group; `batch` is the head-0 models the recorder reads (solvers.particles.head_model)."""

    attention = "heads"

    def __init__(self, batch: ModelBatch, layouts: list, chunk: int | str, replicas: int = 1):
        if len({layout.size for layout in layouts}) > 1:
            raise ValueError("HeadsField: members must share the size of theta_l (heads, feed-forward)")
        self.batch, self.chunk, self.replicas = batch, chunk, replicas
        groups = {}
        for member, layout in enumerate(layouts):
            key = (layout.heads, layout.hidden, layout.activation)  # what spherepde.model.heads.drift reads
            groups.setdefault(key, (layout, []))[1].extend(range(member * replicas, (member + 1) * replicas))
        self.groups = list(groups.values())  # (a layout of the group, its systems)

    @classmethod
    def from_case(cls, case, batch: ModelBatch, layouts: list) -> "HeadsField":
        return cls(batch, layouts, case["solver"]["chunk"], case["particles"]["replicas"])

    def _systems(self, x: torch.Tensor) -> torch.Tensor:
        """(M, n, d) -> (M R, n / R, d)."""
        return x.reshape(x.shape[0] * self.replicas, -1, x.shape[-1])

    def is_direct(self, points: torch.Tensor) -> bool:
        """The array program of particle_step is the seeds' model's: never here."""
        return False

    def __call__(self, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """v(x_i) (M, n, d) for theta (M, p).  Every group's systems are gathered, even where there is one group:
        a member's graph is then the same in any batch, so that its gradient (autograd's sums) is its serial
        run's bit for bit."""
        points = self._systems(x)
        theta = theta.repeat_interleave(self.replicas, 0) if self.replicas > 1 else theta
        ones = torch.ones(points.shape[:2], dtype=points.dtype, device=points.device)
        masses = ones / points.shape[1]
        u = torch.empty_like(points)
        for layout, systems in self.groups:
            group = points[systems]
            u[systems] = drift(layout, layout.unpack(theta[systems]), group, group, masses[systems], ones[systems],
                               self.chunk)
        return tangent_projection(points, u).reshape(x.shape)
