"""The attention term as one dense matrix acting on the grid density: Transport's "operator" attention.

The members' dense kernel folded with V, the frame and the quadrature weights into one matrix acting on the grid
density, when the field is the dense quadrature on a grid whose N x N kernel is kept (S^1, small S^2 grids):

    unnormalized:  u = G rho,   G[k, i, j] = exp(beta <x_i, B y_j>) w_j <e_k(x_i), V y_j>;
    softmax:       (Z, N) = K rho,   K[c, i, j] = exp(beta <x_i, B y_j> - s_i) w_j (1, y_j)_c,
                   m = N / Z (model.softmax_mean; the row shift s_i cancels), u_k = <e_k, V m>

(model.transport's docstring), with the transpose of each product for the transport's vjp.
"""

import copy
from typing import TYPE_CHECKING

import torch

from spherepde.base.errors import CaseError
from spherepde.model.attention import ModelBatch, softmax_mean_adjoint

if TYPE_CHECKING:
    from spherepde.model.transport import Transport

# Largest grid whose N x N kernel the "operator" attention folds (as kernels.dense.DENSE_MATRIX_BYTES keeps it).
OPERATOR_BYTES = 64 * 2 ** 20
# The SVD of a folded operator is tried only up to this many entries (its cost grows as P^3: 0.2 s at 1e6).
LOW_RANK_ENTRIES = 2 ** 20

# Singular values below this fraction of the largest (in float64; scaled by the epsilon in other dtypes) are dropped
# from the attention operator's factors: their part of a product is below the product's own round-off.
RANK_TOLERANCE = 1e-16


def truncated_svd(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(left (., P, r), right (., r, C)) with left @ right = matrix (., P, C) to round-off: its SVD taken in float64,
    the singular values below RANK_TOLERANCE times the largest dropped (r the largest count over the leading axes),
    the tolerance scaled by the matrix dtype's epsilon against float64's; the factors in the matrix's dtype.  (A
    float32 SVD's small singular values are its own round-off: they would keep nearly the full rank.)  A matrix
    that is not finite is a model whose attention overflows the dtype: a CaseError naming the keys."""
    if not bool(torch.isfinite(matrix).all()):
        raise CaseError(f"model.V: the attention operator (V times the kernel exp(beta <x, B y>) and the quadrature "
                        f"weights) overflows {str(matrix.dtype).removeprefix('torch.')}: reduce model.V, model.B or "
                        "model.beta")
    U, sigma, Vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    tolerance = RANK_TOLERANCE * torch.finfo(matrix.dtype).eps / torch.finfo(torch.float64).eps
    rank = int((sigma > tolerance * sigma[..., :1]).sum(-1).max())
    left, right = U[..., :rank], sigma[..., :rank, None] * Vh[..., :rank, :]
    return left.to(matrix.dtype).contiguous(), right.to(matrix.dtype).contiguous()


class DenseOperator:
    """The attention term as one kept matrix per distinct member model (Transport's "operator" attention).

    `matrix` is (members or 1, P, rows P): transposed for a product from the left, G (unnormalized, rows = K)
    or the channels (Z, N) of the shifted kernel (softmax, rows = 1 + d).  The kernel is smooth, so its matrix
    has a numerical rank r far below P at moderate beta (S^1, seed 004's A at lmax 64: 34 of 200 singular values
    above RANK_TOLERANCE in float64); where r (P + rows P) < P rows P / 2 a product goes through the truncated SVD
    factors (`left` (., P, r), `right` (., r, rows P), truncated_svd) instead, at half the arithmetic or less."""

    def __init__(self, matrix: torch.Tensor, kernel: str):
        self.matrix, self.kernel = matrix, kernel
        self.left = self.right = None
        points, columns = matrix.shape[-2:]
        if points * columns > LOW_RANK_ENTRIES:
            return
        left, right = truncated_svd(matrix)
        if left.shape[-1] * (points + columns) < points * columns / 2:
            self.left, self.right = left, right

    def multiply_adds(self) -> int:
        """Of one product, per member."""
        if self.left is not None:
            return self.left.shape[-2] * self.left.shape[-1] + self.right.shape[-2] * self.right.shape[-1]
        return self.matrix.shape[-2] * self.matrix.shape[-1]

    def rank(self) -> int:
        """The rank of the factors (the number of points where the matrix is kept whole)."""
        return self.matrix.shape[-2] if self.left is None else self.left.shape[-1]

    def select(self, index: torch.Tensor) -> "DenseOperator":
        if self.matrix.shape[0] == 1:
            return self
        chosen = copy.copy(self)
        chosen.matrix = self.matrix.index_select(0, index)
        if self.left is not None:
            chosen.left, chosen.right = self.left.index_select(0, index), self.right.index_select(0, index)
        return chosen

    def _product(self, rho: torch.Tensor) -> torch.Tensor:
        if self.left is not None:
            return _member_product(_member_product(rho, self.left), self.right)
        return _member_product(rho, self.matrix)

    def _transpose_product(self, values: torch.Tensor) -> torch.Tensor:
        if self.left is not None:
            return _member_product(_member_product(values, self.right.transpose(-1, -2)), self.left.transpose(-1, -2))
        return _member_product(values, self.matrix.transpose(-1, -2))

    def _moments(self, rho: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N (M, P, d), Z (M, P)) of the softmax."""
        moments = self._product(rho).reshape(rho.shape[0], -1, rho.shape[1])
        return moments[:, 1:].transpose(1, 2), moments[:, 0]

    def attention(self, rho: torch.Tensor, transport: "Transport") -> torch.Tensor:
        if self.kernel == "unnormalized":
            return self._product(rho).reshape(rho.shape[0], -1, rho.shape[1])
        moments = self._product(rho).reshape(rho.shape[0], -1, rho.shape[1])
        return transport._softmax_components(moments[:, 1:], moments[:, 0], rho)

    def adjoint(self, rho: torch.Tensor, u_bar: torch.Tensor, transport: "Transport") -> torch.Tensor:
        if self.kernel == "unnormalized":
            return self._transpose_product(u_bar.reshape(rho.shape[0], -1))
        N, Z = self._moments(rho)
        N_bar, Z_bar = softmax_mean_adjoint(N, Z, rho, transport._frame_adjoint(u_bar))
        moments_bar = torch.cat([Z_bar[:, None], N_bar.transpose(1, 2)], dim=1)
        return self._transpose_product(moments_bar.reshape(rho.shape[0], -1))


def _member_product(values: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """values (M, a) times a matrix (1, a, b) shared by the members, or one (M, a, b) per member."""
    if matrix.shape[0] == 1:
        return values @ matrix[0]
    return torch.matmul(values[:, None, :], matrix)[:, 0]


def operator_rows(dim: int, kernel: str) -> int:
    """Rows per grid point of a folded attention matrix: the d - 1 frame components of V m (unnormalized), or Z and
    the d components of N (softmax)."""
    return dim - 1 if kernel == "unnormalized" else dim + 1


def operator_fits(basis, kernel: str, members: int = 1, operator_bytes: int = OPERATOR_BYTES) -> bool:
    """Whether the folded attention matrices of `members` distinct models with `kernel` on `basis` (operator_rows
    x N by N each, N the grid's points) fit `operator_bytes`."""
    return (members * operator_rows(basis.dim, kernel) * basis.grid_size ** 2 * basis.points.element_size()
            <= operator_bytes)


def attention_operator(basis, batch: ModelBatch, kernels, operator_bytes: int = OPERATOR_BYTES) -> DenseOperator | None:
    """The folded attention matrices of Transport's "operator" attention, or None where it does not apply: the
    field is not the dense quadrature, the grid's N x N kernel or the matrices would exceed
    `operator_bytes`, or the unnormalized kernel overflows (beta |B| beyond the float range)."""
    d, points = basis.dim, basis.grid_size
    if kernels.name != "dense" or not operator_fits(basis, batch.kernel, 1, operator_bytes):
        return None
    rows = operator_rows(d, batch.kernel)
    keys = [(model.beta, model.B.cpu().double().numpy().tobytes(), model.V.cpu().double().numpy().tobytes())
            for model in batch.models]
    distinct = {key: keys.index(key) for key in dict.fromkeys(keys)}  # the first member of each attention
    if not operator_fits(basis, batch.kernel, len(distinct), operator_bytes):
        return None
    weights = basis.weights.reshape(points)
    grid_points = basis.points.reshape(points, d)
    frame = basis.frame.reshape(d - 1, points, d)
    matrices = {}
    for key, m in distinct.items():
        kernel = kernels.member(m)
        shifted, log_scale = kernel.matrix() if kernel.keeps_matrix else _shifted_matrix(kernel)
        if batch.kernel == "unnormalized":
            scaled = shifted * torch.exp(log_scale)[:, None] * weights
            coupling = torch.einsum("kid,de,je->kij", frame, batch.V[m], grid_points)  # <e_k(x_i), V y_j>
            matrix = (coupling * scaled).reshape(rows * points, points)
        else:
            channels = torch.cat([torch.ones_like(grid_points[:, :1]), grid_points], dim=1).T  # (1 + d, P_j)
            matrix = (channels[:, None, :] * (shifted * weights)[None]).reshape(rows * points, points)
        if not bool(torch.isfinite(matrix).all()):
            return None
        matrices[key] = matrix.T.contiguous()
    stacked = matrices[keys[0]][None] if len(distinct) == 1 else torch.stack([matrices[key] for key in keys])
    return DenseOperator(stacked, batch.kernel)


def _shifted_matrix(kernel) -> tuple[torch.Tensor, torch.Tensor]:
    """The shifted kernel matrix of a dense transform that does not keep it (beta = 0: all ones)."""
    from spherepde.kernels.dense import shifted_exp_kernel

    return shifted_exp_kernel(kernel.points, kernel.points, kernel.C, kernel.beta)
