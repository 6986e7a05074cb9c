"""The exponential-kernel transform  T_C f(x) = integral exp(beta <x, C y>) f(y) dsigma(y).

It is the attention integral of the model: with f = rho (partition function Z) and
f = y_c rho (numerator N), applied with C = B.  Values can be astronomically large
(beta in the thousands), so every implementation returns them scaled:

    T_C f(x) = exp(log_scale(x)) * scaled(x),   log_scale(x) = beta |C^T x|,

which bounds every kernel entry by 1, since <x, C y> = <C^T x, y> <= |C^T x|.

`DenseExpKernel` is the reference: quadrature over the grid, one block of rows at a
time (memory O(N * chunk), never the N x N matrix).  It is literally an attention
product, softmax weights having log(w_j rho_j) as bias.  A faster spectral
(Funk-Hecke) transform plugs in behind the same call signature.
"""

import math

import numpy as np
import torch
from scipy.special import ive


def dense_exp_kernel(x: torch.Tensor, y: torch.Tensor, f: torch.Tensor, C: torch.Tensor, beta: float,
                     chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum_j exp(beta <x_i, C y_j>) f_j for points x (Nx, d), y (Ny, d), channels f (Ny, c).

    Quadrature weights are part of f.  Returns (scaled (Nx, c), log_scale (Nx,)).
    """
    u = x @ C  # rows are (C^T x_i)^T
    log_scale = beta * torch.linalg.vector_norm(u, dim=-1)
    # One matmul gives beta <C^T x_i, y_j> - log_scale_i: append the shift as an extra coordinate.
    queries = torch.cat([beta * u, -log_scale[:, None]], dim=1)
    keys = torch.cat([y, torch.ones_like(y[:, :1])], dim=1)
    blocks = []
    for start in range(0, x.shape[0], chunk):
        kernel = queries[start:start + chunk] @ keys.T
        blocks.append(kernel.exp_() @ f)
    return torch.cat(blocks), log_scale


class DenseExpKernel:
    """T_C on a basis grid by dense quadrature: the grid is both the x and the y points."""

    name = "dense"

    def __init__(self, basis, C: torch.Tensor, beta: float, chunk: int = 4096):
        self.points = basis.points.reshape(-1, basis.dim)
        self.weights = basis.weights.reshape(-1)
        self.grid_shape = basis.grid_shape
        self.C, self.beta, self.chunk = C, beta, chunk

    def __call__(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """f: (*grid, c) grid values -> (scaled (*grid, c), log_scale (*grid))."""
        channels = f.shape[-1]
        flat = f.reshape(-1, channels) * self.weights[:, None]
        if self.beta == 0:  # constant kernel: every point sees the plain integral
            integral = flat.sum(0).expand(*self.grid_shape, channels)
            return integral, torch.zeros(self.grid_shape, dtype=f.dtype, device=f.device)
        scaled, log_scale = dense_exp_kernel(self.points, self.points, flat, self.C, self.beta, self.chunk)
        return scaled.reshape(*self.grid_shape, channels), log_scale.reshape(self.grid_shape)


def kernel_degree(kappa: float, dim: int, tol: float) -> int:
    """Smallest degree l at which exp(kappa <u, y>) on S^{dim-1} has relative Funk-Hecke weight < tol.

    Funk-Hecke: the kernel acts on degree l by 2 pi I_l(kappa) (S^1) or 4 pi i_l(kappa)
    (S^2, i_l(k) = sqrt(pi / 2k) I_{l+1/2}(k)); the ratio to degree 0 is computed with
    exponentially scaled Bessel functions, so large kappa neither overflows nor loses digits.
    """
    if kappa == 0:
        return 1
    order_shift = 0.0 if dim == 2 else 0.5
    degrees = np.arange(0, 20 * int(math.sqrt(kappa) + 10) + int(2 * kappa) + 50)
    ratio = ive(degrees + order_shift, kappa) / ive(order_shift, kappa)
    return int(degrees[np.argmax(ratio < tol)])
