"""Transport's "matrix" path: the rate as dense real matrices on small grids.

With the operator or zero-temperature attention (model.dense_operator), the synthesis and the divergence are dense
real matrices too (found by applying the basis's transforms to unit vectors, `basis_matrices`), and folded with
the attention: one product gives rho and u (or rho alone), a second one the rate.  A stage is then three tensor
operations, where the transforms' own cost is their per-operation overhead: on S^1 at lmax 64 about a quarter of
the "grid" path's time (benchmarks/ensembles.py; model.transport chooses the path).

The products have one or a few rows (the members) and read a matrix of up to MATRIX_BYTES: the BLAS's kernel, and so
the library and the orientation of the stored matrix, decide their cost (`MatrixPath.products`).
"""

import copy
import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from spherepde.base.arrays import addmm, as_namespace, as_tensor, concatenate, namespace, program_namespace
from spherepde.base.real_view import complex_state
from spherepde.model.attention import softmax_mean_adjoint

if TYPE_CHECKING:
    from spherepde.model.transport import Transport

# The rows (members) of the products, outside autograd on the CPU, from which torch's contiguous products give way to
# those with a transposed view, and from which numpy's are the faster (`MatrixPath.products`): torch's BLAS (MKL)
# slows down from 4 rows on in the contiguous orientation, not in the transposed one; numpy's (OpenBLAS 0.3.31)
# multiplies one row, and 8 or more, at torch's rate or faster, 2 to 4 rows at up to twice its time.  Measured on one
# core (AMD EPYC Zen 3), us for a state (M, 162) times a (162, 1344) matrix at M = 1, 2, 4, 8, 16: numpy 37, 148-181,
# 147-159, 141-165, 284-328; torch 43, 108, 127, 172, 412 contiguous and 50, 127, 124, 167, 344 transposed; and a
# step of convergence-s2.toml at lmax 10 (softmax) at M = 2, 3, 4: 3.7, 4.8, 11.1 ms contiguous in torch, 4.8, 6.2,
# 5.5 transposed, 5.9, 7.3, 5.8 in numpy (benchmarks/ensembles.py's problems).
TRANSPOSED_MEMBERS, NUMPY_MEMBERS = 4, 8


class Products(NamedTuple):
    """The right operands of a MatrixPath's products in one library and orientation: rows_t (., N, rows' K P) of the
    state, rows (., rows' K P, N) of the rows' cotangent, divergence_t (K P, N) of the flux, divergence (N, K P) of the
    rate's cotangent; `dot` the library's product of two matrices (numpy's matmul costs a microsecond more a call than
    np.dot)."""

    dot: object
    rows_t: object
    rows: object
    divergence_t: object
    divergence: object


class MatrixPath:
    """Transport's "matrix" path (module docstring): with R the stacked rows (rho; u) or (rho; Z; N) of the grid
    fields a state determines linearly and D the weak divergence (K P -> N), both dense,

        unnormalized:      y = state R^T + (0, a),  rate = (y_rho * y_u) D^T
        zero temperature:  y_rho = state S^T,        rate = (y_rho * drive) D^T   (drive = a + u, fixed)
        softmax:           y = state R^T,  v = a + <e, V softmax_mean(N, Z, rho)>,  rate = (rho v) D^T.
    """

    def __init__(self, transport: "Transport", rows_t: torch.Tensor, divergence_t: torch.Tensor, kind: str):
        self.transport, self.rows_t, self.divergence_t, self.kind = transport, rows_t, divergence_t, kind
        self.points = transport.points.shape[0]
        # the transposes, contiguous: a product with a transposed view runs slower on the CPU
        self.rows, self.divergence = rows_t.transpose(-1, -2).contiguous(), divergence_t.T.contiguous()
        self.single_frame = kind == "unnormalized" and rows_t.shape[0] == 1 and transport.frame.shape[0] == 1
        if self.single_frame:
            # the transpose's cotangent of the rows (rho, v) is (v f_bar, rho f_bar) = swap(y * f_bar): kept in
            # the swapped order, (rho_bar, v_bar) -> (v_bar, rho_bar), with the rows' blocks swapped to match
            self.first, points = rows_t[0], self.points
            self.swapped_rows = torch.cat([self.rows[0, points:], self.rows[0, :points]]).contiguous()
        self.operands = {torch: Products(torch.mm, rows_t, self.rows, divergence_t, self.divergence)}
        if rows_t.device.type == "cpu":
            # Of each product's two stored orientations (the matrix or its transpose, contiguous) measured on one core
            # (AMD EPYC Zen 3), us at 1, 4, 16 members: numpy's fastest reads the one whose rows are the longer (the
            # tall product with a transposed view), (., 3240) @ (3240, 242) 130, 672, 1059 against 181, 702, 1143
            # contiguous; (., 1296) @ (1296, 242) 44, 202, 346 against 52, 205, 365; a wide one contiguous,
            # (., 242) @ (242, 3240) 154, 575, 1094 against 159, 731, 1354.  Torch's at a few members reads the one
            # whose rows run along the sums (each product with a transposed view): 4 members 564 and 605 us against
            # 920 and 974 contiguous for those two; torch's contiguous products, 198 and 156 us at one member, 1575
            # and 1685 at 16.  The rows of an operator per member are products of one row each: contiguous.
            rows_np, divergence_np = rows_t.detach().numpy(), self.divergence.detach().numpy()
            self.operands[np] = Products(np.dot, rows_np, rows_np.swapaxes(-1, -2), divergence_np.T, divergence_np)
            shared = rows_t.shape[0] == 1
            self.operands["transposed"] = Products(
                torch.mm, self.rows.transpose(-1, -2) if shared else rows_t, rows_t.transpose(-1, -2) if shared else
                self.rows, self.divergence.T, divergence_t.T)

    @classmethod
    def build(cls, transport: "Transport", matrix_bytes: int) -> "MatrixPath | None":
        """The path's matrices, or None when they would exceed `matrix_bytes` (or the attention is a transform)."""
        basis, batch = transport.basis, transport.batch
        points, frame_count = basis.grid_size, basis.dim - 1
        size = 2 * math.prod(transport.coefficient_shape)
        if transport.attention_mode == "zero temperature":
            kind, rows = "fixed", 1
        else:
            kind = batch.kernel
            rows = 1 + (frame_count if kind == "unnormalized" else 1 + basis.dim)
        distinct = 1 if transport._operator is None else transport._operator.matrix.shape[0]
        element = basis.points.element_size()
        if (distinct * rows * points + frame_count * points) * size * element > matrix_bytes:
            return None
        synthesis, divergence = basis_matrices(basis)  # (P, N), (N, K P) with the rate's minus sign
        if kind == "fixed":
            rows_t = synthesis.T.contiguous()[None]
        else:
            # operator matrix (members or 1, P_j, rows' P_i)^T: its rows act on rho, i.e. on synthesis @ state
            folded = transport._operator.matrix.transpose(-1, -2) @ synthesis  # (., rows' P, N)
            rows_t = torch.cat([synthesis.expand(folded.shape[0], -1, -1), folded], dim=1).transpose(-1, -2)
            rows_t = rows_t.contiguous()
        return cls(transport, rows_t, divergence.T.contiguous(), kind)

    def select(self, transport: "Transport", index: torch.Tensor) -> "MatrixPath":
        if self.rows_t.shape[0] == 1:
            chosen = copy.copy(self)
            chosen.transport = transport
            return chosen
        return MatrixPath(transport, self.rows_t.index_select(0, index), self.divergence_t, self.kind)

    def drive(self, a: torch.Tensor) -> torch.Tensor:
        """unnormalized: the bias (0, a) (M, (1 + K) P) of the first product; else a (+ the fixed u) (M, K P)."""
        members = a.shape[0]
        flat = a.reshape(members, -1)
        if self.kind == "unnormalized":
            return torch.cat([torch.zeros_like(flat[:, :self.points]), flat], dim=1)
        if self.kind == "fixed":
            return flat + self.transport._fixed.reshape(members, -1)
        return flat

    def drive_part(self, drive_bar: torch.Tensor) -> torch.Tensor:
        """The cotangent of a from that of the drive (`vjp`'s; in the swapped order on the single-frame path)."""
        if self.single_frame:
            return drive_bar[:, :self.points]
        return drive_bar[:, self.points:] if self.kind == "unnormalized" else drive_bar

    def products(self, *arrays) -> tuple:
        """(the library, its `Products`) of an evaluation on these tensors (the matrices' device): outside autograd
        on the CPU (base.arrays.program_namespace; the matrices too may be recorded) by the members, numpy for one
        and from NUMPY_MEMBERS on, torch with transposed views from TRANSPOSED_MEMBERS on; else torch."""
        if program_namespace(*arrays, self.rows_t) is torch:
            return torch, self.operands[torch]
        members = arrays[0].shape[0]
        if members == 1 or members >= NUMPY_MEMBERS:
            return np, self.operands[np]
        return torch, self.operands["transposed" if members >= TRANSPOSED_MEMBERS else torch]

    @staticmethod
    def _rows(state, products: Products, bias=None):
        if products.rows_t.shape[0] == 1:
            return products.dot(state, products.rows_t[0]) if bias is None else addmm(bias, state, products.rows_t[0])
        rows = (state[:, None, :] @ products.rows_t)[:, 0]
        return rows if bias is None else rows + bias

    @staticmethod
    def _rows_adjoint(rows_bar, products: Products):
        if products.rows.shape[0] == 1:
            return products.dot(rows_bar, products.rows[0])
        return (rows_bar[:, None, :] @ products.rows)[:, 0]

    def velocity(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rho (M, P), v (M, K, P))."""
        xp, products = self.products(state, drive)
        return tuple(as_tensor(a) for a in self._velocity(as_namespace(state, xp), as_namespace(drive, xp), products))

    def _velocity(self, state, drive, products: Products, y=None) -> tuple:
        """`velocity` in the library of its arrays; `y` the state's rows (M, rows', P) where they are at hand."""
        members, points = state.shape[0], self.points
        if self.kind == "unnormalized":
            y = self._rows(state, products, drive)
            return y[:, :points], y[:, points:].reshape(members, -1, points)
        if self.kind == "fixed":
            return self._rows(state, products), drive.reshape(members, -1, points)
        y = self._rows(state, products).reshape(members, -1, points) if y is None else y
        rho = y[:, 0]
        u = self.transport._softmax_components(*(as_tensor(a) for a in (y[:, 2:], y[:, 1], rho)))
        return rho, drive.reshape(u.shape) + as_namespace(u, namespace(state))

    def rate_token(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """S^1 with one operator: (the rate, the rows y = (rho, v)), in three operations.  In torch at any members
        (not `products`): on its matrices of at most a few hundred kB numpy's faster products do not pay for the
        conversions (a step of kuramoto-s1.toml at lmax 64, one member: 0.46 ms in numpy against 0.33)."""
        y = torch.addmm(drive, state, self.first)
        return y.view(-1, 2, self.points).prod(1) @ self.divergence_t, y

    def vjp_rows(self, y: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """S^1 with one operator: the transpose from the rows y = (rho, v), with f_bar = D^T b their cotangent
        y_bar = (v f_bar, rho f_bar), formed swapped (y * f_bar, no slicing) and returned so as the drive's."""
        f_bar = b @ self.divergence
        swapped = (y.view(-1, 2, self.points) * f_bar[:, None]).view(y.shape)
        return swapped @ self.swapped_rows, swapped

    def rate(self, state: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        if self.single_frame:
            return self.rate_token(state, drive)[0]
        xp, products = self.products(state, drive)
        rho, v = self._velocity(as_namespace(state, xp), as_namespace(drive, xp), products)
        flux = rho[:, None] * v
        return as_tensor(products.dot(flux.reshape(flux.shape[0], -1), products.divergence_t))

    def vjp(self, state: torch.Tensor, drive: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.single_frame:
            return self.vjp_rows(torch.addmm(drive, state, self.first), b)
        xp, products = self.products(state, drive, b)
        state, drive, b = (as_namespace(a, xp) for a in (state, drive, b))
        members, points = state.shape[0], self.points
        y = self._rows(state, products).reshape(members, -1, points) if self.kind == "softmax" else None
        rho, v = self._velocity(state, drive, products, y)
        f_bar = products.dot(b, products.divergence).reshape(v.shape)
        v_bar = rho[:, None] * f_bar
        rho_bar = (v * f_bar).sum(1)
        if self.kind == "unnormalized":
            y_bar = concatenate([rho_bar, v_bar.reshape(members, -1)], 1)
            return as_tensor(self._rows_adjoint(y_bar, products)), as_tensor(y_bar)
        if self.kind == "fixed":
            return as_tensor(self._rows_adjoint(rho_bar, products)), as_tensor(v_bar.reshape(members, -1))
        Z, N = y[:, 1], y[:, 2:].swapaxes(1, 2)
        N_bar, Z_bar = (as_namespace(a, xp) for a in softmax_mean_adjoint(
            *(as_tensor(a) for a in (N, Z, rho)), self.transport._frame_adjoint(as_tensor(v_bar))))
        y_bar = concatenate([rho_bar[:, None], Z_bar[:, None], N_bar.swapaxes(1, 2)], 1)
        rows_bar = self._rows_adjoint(y_bar.reshape(members, -1), products)
        return as_tensor(rows_bar), as_tensor(v_bar.reshape(members, -1))


def basis_matrices(basis) -> tuple[torch.Tensor, torch.Tensor]:
    """The basis's synthesis (P, N) and minus its frame divergence (N, K P) as dense real matrices on the real
    view of the coefficients, found by applying the transforms to the N unit vectors: the synthesis's columns
    directly, the divergence's rows from its transpose, -div^T b = w grad(b / multiplicity) (bases.py), so
    both are the transforms to round-off, on S^1 and S^2 alike (structurally unused entries such as Im c_0
    give zero columns and rows)."""
    shape, points = tuple(basis.degree.shape), basis.grid_size
    size = 2 * math.prod(shape)
    units = complex_state(torch.eye(size, dtype=basis.placement.real, device=basis.placement.device), shape)
    synthesis = basis.synthesis(units).reshape(size, points).T
    divergence = (basis.weights * basis.gradient_frame(units * basis.inverse_multiplicity)).reshape(size, -1)
    return synthesis.contiguous(), divergence.contiguous()
