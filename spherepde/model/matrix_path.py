"""Transport's "matrix" path: the rate as dense real matrices on small grids.

With the operator or zero-temperature attention (model.dense_operator), the synthesis and the divergence are dense
real matrices too (found by applying the basis's transforms to unit vectors, `basis_matrices`), and folded with
the attention: one product gives rho and u (or rho alone), a second one the rate.  A stage is then three tensor
operations, where the transforms' own cost is their per-operation overhead: on S^1 at lmax 64 about a quarter of
the "grid" path's time (benchmarks/ensembles.py; model.transport chooses the path).
"""

import copy
import math
from typing import TYPE_CHECKING

import torch

from spherepde.base.real_view import complex_state
from spherepde.model.attention import softmax_mean_adjoint

if TYPE_CHECKING:
    from spherepde.model.transport import Transport


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

    def _rows(self, state: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.rows_t.shape[0] == 1:
            return state @ self.rows_t[0] if bias is None else torch.addmm(bias, state, self.rows_t[0])
        rows = torch.matmul(state[:, None, :], self.rows_t)[:, 0]
        return rows if bias is None else rows + bias

    def _rows_adjoint(self, rows_bar: torch.Tensor) -> torch.Tensor:
        if self.rows.shape[0] == 1:
            return rows_bar @ self.rows[0]
        return torch.matmul(rows_bar[:, None, :], self.rows)[:, 0]

    def velocity(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rho (M, P), v (M, K, P))."""
        members, points = state.shape[0], self.points
        if self.kind == "unnormalized":
            y = self._rows(state, drive)
            return y[:, :points], y[:, points:].reshape(members, -1, points)
        if self.kind == "fixed":
            return self._rows(state), drive.reshape(members, -1, points)
        y = self._rows(state).reshape(members, -1, points)
        rho = y[:, 0]
        u = self.transport._softmax_components(y[:, 2:], y[:, 1], rho)
        return rho, drive.reshape(u.shape) + u

    def rate_token(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """S^1 with one operator: (the rate, the rows y = (rho, v)), in three operations."""
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
        rho, v = self.velocity(state, drive)
        flux = rho[:, None] * v
        return flux.reshape(flux.shape[0], -1) @ self.divergence_t

    def vjp(self, state: torch.Tensor, drive: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        members, points = state.shape[0], self.points
        if self.single_frame:
            return self.vjp_rows(torch.addmm(drive, state, self.first), b)
        rho, v = self.velocity(state, drive)
        f_bar = (b @ self.divergence).reshape(v.shape)
        v_bar = rho[:, None] * f_bar
        rho_bar = (v * f_bar).sum(1)
        if self.kind == "unnormalized":
            y_bar = torch.cat([rho_bar, v_bar.reshape(members, -1)], dim=1)
            return self._rows_adjoint(y_bar), y_bar
        if self.kind == "fixed":
            return self._rows_adjoint(rho_bar), v_bar.reshape(members, -1)
        y = self._rows(state).reshape(members, -1, points)
        Z, N = y[:, 1], y[:, 2:].transpose(1, 2)
        N_bar, Z_bar = softmax_mean_adjoint(N, Z, rho, self.transport._frame_adjoint(v_bar))
        y_bar = torch.cat([rho_bar[:, None], Z_bar[:, None], N_bar.transpose(1, 2)], dim=1)
        return self._rows_adjoint(y_bar.reshape(members, -1)), v_bar.reshape(members, -1)


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
