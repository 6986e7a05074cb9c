"""Dense quadrature of the exponential-kernel transform  T_C f(x_i) = sum_j exp(beta <x_i, C y_j>) f_j.

The reference implementation of T_C f(x) = integral exp(beta <x, C y>) f(y) dsigma(y) (the quadrature weights
are part of f), O(N^2) work, and literally an attention product, softmax weights having log(w_j rho_j) as bias.
Values can be astronomically large (beta in the thousands), so it returns them scaled, T_C f(x_i) =
exp(log_scale_i) scaled_i, with log_scale_i the largest beta <x_i, C y_j> over the points y_j: the bound
beta |C^T x| that keeps every entry below 1 can, over a few scattered points (particles), exceed every logit
by hundreds and underflow all the weights.  `DenseExpKernel` applies it on a basis grid: a small grid keeps
its N x N kernel matrix (at most DENSE_MATRIX_BYTES, computed once); a larger one recomputes it one block of
rows at a time (memory O(N * chunk)).
"""

import math

import numpy as np
import torch

from spherepde.geometry.ambient import norm

# solver.chunk = "auto": a block of the dense kernel matrix of about this size stays in a CPU core's cache
# through the six passes over it (logits, row maximum, shift, floor, exponential, product with f).  Measured
# with benchmarks/dense_blocks.py for n = 1000 to 16000 points: 0.7-0.9 of the time of 4 MiB blocks, a third of
# that of 64 MiB ones (4096 rows at n = 2000 to 8000); at least CPU_BLOCK_MIN_ROWS rows, so
# that the per-block overhead stays small at large n.  A GPU wants large blocks instead: GPU_BLOCK_ROWS, fewer
# where a block would exceed GPU_BLOCK_BYTES (n = 10^6 particles: 134 rows, not 32 GB).
CPU_BLOCK_BYTES = 2 ** 20
CPU_BLOCK_MIN_ROWS = 8
GPU_BLOCK_ROWS = 4096
GPU_BLOCK_BYTES = 2 ** 30
# Largest kernel matrix (bytes) the dense transform of a grid keeps between calls: 64 MiB holds
# N = 2896 points in float64 (S^1 to lmax ~960, S^2 to lmax ~22), 4096 in float32.
DENSE_MATRIX_BYTES = 64 * 2 ** 20

def shifted_exp_kernel(x: torch.Tensor, y: torch.Tensor, C: torch.Tensor, beta) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel matrix exp(beta <x_i, C y_j> - log_scale_i) (..., Nx, Ny) and log_scale (..., Nx).

    log_scale_i = max_j beta <x_i, C y_j> (log-sum-exp shift: the largest entry of each row is exactly 1).
    Leading batch dimensions (members) broadcast as in torch.matmul; beta is a number or a tensor (...,).
    """
    return _shifted_block(*_logit_operands(x, y, C, beta))


def _logit_operands(x: torch.Tensor, y: torch.Tensor, C: torch.Tensor, beta):
    """(queries (..., Nx, d + 1), keys (..., Ny, d + 1), bound (..., Nx)) with queries @ keys^T = beta <C^T x_i, y_j>
    - bound_i <= 0, bound_i = beta |C^T x_i|: the shift rides along as an extra coordinate, so one matmul gives the
    logits.  The bound is detached, as `_shifted_block`'s shift is: T_C f does not depend on it, and the gradient of
    |C^T x_i| is 0 / 0 where C^T x_i = 0 (a trained B = 0 gave dJ/dB = NaN)."""
    u = x @ C  # rows are (C^T x_i)^T
    scale = beta if not torch.is_tensor(beta) else beta[..., None]
    bound = (scale * norm(u)).detach()
    queries = torch.cat([(scale if not torch.is_tensor(beta) else scale[..., None]) * u, -bound[..., None]], dim=-1)
    return queries, torch.cat([y, torch.ones_like(y[..., :1])], dim=-1), bound


def _shifted_block(queries: torch.Tensor, keys: torch.Tensor, bound: torch.Tensor):
    """shifted_exp_kernel for the rows of `queries`, from `_logit_operands`."""
    kernel = queries @ keys.transpose(-1, -2)
    # Detached: T_C f does not depend on the shift, so no gradient needs to flow through it.
    shift = kernel.amax(dim=-1, keepdim=True).detach()
    return kernel.sub_(shift).clamp_(min=exponent_floor(kernel.dtype)).exp_(), bound + shift[..., 0]


def exponent_floor(dtype: torch.dtype) -> float:
    """Lower bound of the shifted exponents: log of e^4 (55) times the smallest normal number of `dtype` (-704 in
    float64, -83 in float32).

    An exponential that underflows (most entries at beta = 1000) takes the CPU's slow path, 20 times the
    cost of the others; the floor keeps every entry a normal number.  It adds at most 1.2e-306 (float64;
    6.4e-37 in float32) of the row's largest entry, which is 1, per entry: 290 (float64) and 29 (float32) orders of
    magnitude below round-off.
    """
    return math.log(torch.finfo(dtype).tiny) + 4.0


def block_rows(chunk: int | str, columns: int, dtype: torch.dtype, device: torch.device, batch: int = 1) -> int:
    """Rows per block of a dense kernel matrix with `columns` columns: solver.chunk, or for "auto" the rows of
    CPU_BLOCK_BYTES on the CPU (at least CPU_BLOCK_MIN_ROWS) and on a GPU GPU_BLOCK_ROWS, at most those of
    GPU_BLOCK_BYTES (at least one), shared among the `batch` matrices whose blocks are taken together: the block's
    bytes, not its rows, are what the cache holds (400 systems of 1000 tokens: 1 MiB a block, not 400 MiB)."""
    if chunk != "auto":
        return chunk
    row_bytes = columns * (torch.finfo(dtype).bits // 8)
    if device.type != "cpu":
        rows = max(1, min(GPU_BLOCK_ROWS, GPU_BLOCK_BYTES // row_bytes))
    else:
        rows = max(CPU_BLOCK_MIN_ROWS, CPU_BLOCK_BYTES // row_bytes)
    return max(1, rows // max(batch, 1))


def dense_exp_kernel(x: torch.Tensor, y: torch.Tensor, f: torch.Tensor, C: torch.Tensor, beta,
                     chunk: int | str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Sum_j exp(beta <x_i, C y_j>) f_j for points x (..., Nx, d), y (..., Ny, d), channels f (..., Ny, c).

    Quadrature weights are part of f.  Returns (scaled (..., Nx, c), log_scale (..., Nx)) as `shifted_exp_kernel`,
    holding `block_rows(chunk, ...)` rows of the kernel matrix at a time (for "auto", of all batch members
    together).
    """
    rows = block_rows(chunk, y.shape[-2], y.dtype, y.device, math.prod(x.shape[:-2]))
    queries, keys, bound = _logit_operands(x, y, C, beta)
    # Each block's results go straight into arrays made beforehand: kept block by block, the small arrays took the
    # freed space of each block's kernel from the next, and glibc's heap (with spherepde.base.memory's thresholds)
    # grew by a block a block, to the whole N x N kernel (S^1 at lmax 4096: 1.2 GB for blocks of 1 MiB).
    batch = np.broadcast_shapes(queries.shape[:-2], keys.shape[:-2])  # torch's imports sympy at its first call: 0.7 s
    scaled = f.new_empty(np.broadcast_shapes(batch, f.shape[:-2]) + (x.shape[-2], f.shape[-1]))
    log_scale = bound.new_empty(batch + (x.shape[-2],))
    for start in range(0, x.shape[-2], rows):
        block = slice(start, start + rows)
        kernel, log_scale[..., block] = _shifted_block(queries[..., block, :], keys, bound[..., block])
        scaled[..., block, :] = kernel @ f
    return scaled, log_scale


class DenseExpKernel:
    """T_C on a basis grid by dense quadrature: the grid is both the x and the y points.

    A grid whose N x N kernel matrix takes at most `matrix_bytes` keeps it (`keeps_matrix`; computed at
    the first call, since the points, C and beta are fixed), so a call is one matmul instead of N^2
    exponentials; otherwise each call recomputes it in blocks of `block_rows(chunk, N)` rows.
    """

    name = "dense"

    def __init__(self, basis, C: torch.Tensor, beta: float, chunk: int | str = "auto", matrix_bytes: int = 0):
        self.points = basis.points.reshape(-1, basis.dim)
        self.weights = basis.weights.reshape(-1)
        self.grid_shape = basis.grid_shape
        self.C, self.beta, self.chunk = C, beta, chunk
        n = self.points.shape[0]
        self.keeps_matrix = beta != 0 and n * n * self.points.element_size() <= matrix_bytes
        self._matrix = None

    def __call__(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """f: (*grid, c) grid values -> (scaled (*grid, c), log_scale (*grid))."""
        scaled, log_scale = self.fields(torch.movedim(f, -1, 0))
        return torch.movedim(scaled, 0, -1), log_scale

    def fields(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The transform of fields given first: f (F, *grid) -> (scaled (F, *grid), log_scale (*grid))."""
        count = f.shape[0]
        flat = f.reshape(count, -1) * self.weights
        if self.beta == 0:  # constant kernel: every point sees the plain integral
            integral = flat.sum(1, keepdim=True).expand_as(flat)
            return integral.reshape(f.shape), torch.zeros(self.grid_shape, dtype=f.dtype, device=f.device)
        if self.keeps_matrix:
            matrix, log_scale = self.matrix()
            scaled = flat @ matrix.T
        else:
            scaled, log_scale = dense_exp_kernel(self.points, self.points, flat.T, self.C, self.beta, self.chunk)
            scaled = scaled.T
        return scaled.reshape(f.shape), log_scale.reshape(self.grid_shape)

    def matrix(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept kernel matrix of `shifted_exp_kernel` over the grid (N, N) and its log_scale (N,), computed at
        the first call."""
        if self._matrix is None:
            self._matrix = shifted_exp_kernel(self.points, self.points, self.C, self.beta)
        return self._matrix

    def cost(self, channels: int) -> float:
        """Floating-point operations of one call: N^2 kernel entries (one exponential ~ 20 flops) unless
        the matrix is kept, then the N^2 c product alone; the N c sum of the constant kernel at beta = 0."""
        n = self.points.shape[0]
        if self.beta == 0:
            return 2.0 * n * channels
        if self.keeps_matrix:
            return 2.0 * n * n * channels
        return n * n * (2 * (self.points.shape[1] + 1) + 2 * channels + 20.0)
