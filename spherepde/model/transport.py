"""The transport term of the forward equation for M members on one basis grid, and its exact transpose.

    rate(c, a) = -div(rho v),   rho = synthesis(c),   v_k = a_k + u_k,   u_k = <e_k, V m[rho]>   (k < d - 1)

(docs/design.md "The model"), with the velocity in its components along the basis's orthonormal tangent frame e_k (one
number less per point than ambient components), a_k(x) = <e_k(x), W x> the feed-forward term of the layer
being stepped, and the divergence in the weak form, so that the degree-0 coefficient of the rate is zero:
mass is conserved to round-off.  States are real (M, N): the real view of each member's coefficients
(`real_state`, `complex_state`); grid fields are flattened: rho (M, P), a, u, v (M, K, P), K = d - 1.

The attention term u is found one of three ways, and the rate on one of two paths (`attention_mode`, `path`),
chosen once by an estimate of their cost (multiply-adds, and a fixed cost per tensor operation):

* "operator": the members' dense kernel folded with V, the frame and the quadrature weights into one
  matrix acting on the grid density, when the field is the dense quadrature on a grid whose N x N kernel
  is kept (S^1, small S^2 grids):
      unnormalized:  u = G rho,   G[k, i, j] = exp(beta <x_i, B y_j>) w_j <e_k(x_i), V y_j>;
      softmax:       (Z, N) = K rho,   K[c, i, j] = exp(beta <x_i, B y_j> - s_i) w_j (1, y_j)_c,
                     m = N / Z (model.softmax_mean; the row shift s_i cancels), u_k = <e_k, V m>.
* "zero temperature": m = B^T x / |B^T x| does not depend on rho; u is a field computed once.
* "transform": the members' exponential-kernel transforms (exp_kernel.MemberKernels: dense blocks or the
  spectral field) applied to the channels (rho, rho y) at every call.

and the paths:

* "matrix": on small grids, with the operator or zero-temperature attention, the synthesis and the
  divergence are dense real matrices too (found by applying the basis's transforms to unit vectors), and
  folded with the attention: one product gives rho and u (or rho alone), a second one the rate.  A stage is
  then three tensor operations, where the transforms' own cost is their per-operation overhead: on S^1 at
  lmax 64 about a quarter of the "grid" path's time (benchmarks/ensembles.py).
* "grid": the basis's transforms (FFT, spherical-harmonic transforms) with the attention in between.

`vjp` is the transpose of the derivative of the rate (the discrete adjoint of one evaluation), written out:
with rho_bar, v_bar the cotangents of rho and v,

    f_bar = -div^T b,   rho_bar = sum_k v_k f_bar_k + (attention)^T u_bar,   v_bar = u_bar = a_bar = rho f_bar,
    c_bar = synthesis^T rho_bar,

with the matrices' transposes, or the bases' exact transposes (bases.synthesis_adjoint,
divergence_adjoint) and, for the transform attention, torch autograd through the kernel transform alone
(a linear map, whose own arithmetic dominates there).
"""

import copy
import math

import torch

from spherepde.geometry.ambient import inner
from spherepde.model.attention import NEGLIGIBLE_DENSITY, ModelBatch, softmax_mean, zero_temperature_mean

# Largest memory (bytes) of the matrices of Transport's "matrix" path (and of the folded attention operators).
MATRIX_BYTES = 64 * 2 ** 20
# Largest grid whose N x N kernel the "operator" attention folds (as exp_kernel.DENSE_MATRIX_BYTES keeps it).
OPERATOR_BYTES = 64 * 2 ** 20
# The fixed cost of one tensor operation on the CPU in multiply-adds (about 6 us at 1e10 per second with the
# Python and dispatch around it), for the choice between the matrix and the grid path (Transport._grid_cost,
# _matrix_cost; benchmarks/ensembles.py measures both paths).
OPERATION_COST = 60_000
# The SVD of a folded operator is tried only up to this many entries (its cost grows as P^3: 0.2 s at 1e6).
LOW_RANK_ENTRIES = 2 ** 20


def real_state(c: torch.Tensor) -> torch.Tensor:
    """Complex coefficients (M, *coeff) -> their real view (M, N)."""
    return torch.view_as_real(c).reshape(c.shape[0], -1)


def real_diagonal(factor: torch.Tensor) -> torch.Tensor:
    """A real factor per coefficient (*coeff) as the factor of both parts of its real view (N,)."""
    return factor[..., None].expand(factor.shape + (2,)).reshape(-1)


def complex_state(state: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The inverse of `real_state`: (M, N) -> complex (M, *shape)."""
    return torch.view_as_complex(state.reshape((state.shape[0],) + tuple(shape) + (2,)))


class Transport:
    """rate(state, drive) = -div(rho v[rho]) and its transpose for the members of `batch` (module docstring).

    `drive = feed_forward(W)` carries the feed-forward term of the layer (and, on the matrix path, whatever
    else is fixed over an interval) in the layout the path wants; `feed_forward_adjoint` maps its cotangent
    back to W_bar (M, d, d).
    """

    def __init__(self, basis, batch: ModelBatch, kernels, matrix_bytes: int = MATRIX_BYTES):
        self.basis, self.batch, self.kernels = basis, batch, kernels
        d, points = basis.dim, basis.grid_size
        self.grid_shape, self.coefficient_shape = basis.grid_shape, tuple(basis.degree.shape)
        self.points = basis.points.reshape(points, d)
        self.frame = basis.frame.reshape(d - 1, points, d)  # e_k(x_p): (K, P, d)
        # a_k(x) = sum_ij W_ij e_k,i(x) x_j: the feed-forward term is linear in W, one product with this (K P, d d).
        self._feed_forward = (self.frame[..., :, None] * self.points[:, None, :]).reshape((d - 1) * points, d * d)
        self._frame_V = torch.einsum("kpi,mij->mkpj", self.frame, batch.V)  # (e_k^T V)_j: (M, K, P, d)
        self._operator = self._fixed = self._matrices = None
        if batch.zero_temperature:
            self._fixed = self._frame_components(zero_temperature_mean(batch.B, self.points))
            options = {("zero temperature", "grid"): self._grid_cost(0), ("zero temperature", "matrix"): None}
        else:
            self._operator = attention_operator(basis, batch, kernels)
            transform = sum(kernel.cost(basis.dim + 1) for kernel in kernels.kernels) / 2 / len(kernels.kernels)
            options = {("transform", "grid"): self._grid_cost(transform)}
            if self._operator is not None:
                options[("operator", "grid")] = self._grid_cost(self._operator.multiply_adds())
                options[("operator", "matrix")] = None
        for attention_mode, path in list(options):
            if path == "matrix":
                rows = 0 if attention_mode == "zero temperature" else (
                    d - 1 if batch.kernel == "unnormalized" else 1 + d)
                options[(attention_mode, path)] = self._matrix_cost(rows)
        self.attention_mode, self.path = min(options, key=options.get)
        if self.path == "matrix":
            self._matrices = MatrixPath.build(self, matrix_bytes)
            if self._matrices is None:  # beyond matrix_bytes
                self.attention_mode, self.path = min((key for key in options if key[1] == "grid"), key=options.get)
        if self.attention_mode == "transform":
            self._operator = None

    def _grid_cost(self, attention: float) -> float:
        """Estimated multiply-adds of one evaluation on the grid path: per member the transforms (an FFT 4 n log2 n,
        a Legendre sum 2 (lmax + 1)^2 nlat per field, five fields: the synthesis and the vector divergence's four;
        twice their arithmetic, for the copies and layout changes around them) and the attention's, plus
        OPERATION_COST for each of about 25 tensor operations."""
        basis = self.basis
        fourier = 4 * basis.grid_size * math.log2(basis.grid_shape[-1])
        transforms = 3 * fourier if basis.dim == 2 else 10 * (basis.lmax + 1) ** 2 * basis.grid_shape[0] + 3 * fourier
        return self.batch.members * (transforms + attention) + 25 * OPERATION_COST

    def _matrix_cost(self, rows: int) -> float:
        """Estimated multiply-adds of one evaluation on the matrix path (`rows` grid fields besides rho), plus
        OPERATION_COST for each of about 6 tensor operations."""
        points, frame_count = self.basis.grid_size, self.basis.dim - 1
        size = 2 * math.prod(self.coefficient_shape)
        return self.batch.members * ((1 + rows) * points * size + size * frame_count * points) + 6 * OPERATION_COST

    def select(self, members: list) -> "Transport":
        """The transport of the members at the indices `members` (a list), sharing the rest."""
        chosen = copy.copy(self)
        index = torch.as_tensor(members, device=self.points.device)
        chosen.batch, chosen.kernels = self.batch.select(members), self.kernels.select(members)
        chosen._frame_V = self._frame_V.index_select(0, index)
        chosen._fixed = None if self._fixed is None else self._fixed.index_select(0, index)
        chosen._operator = None if self._operator is None else self._operator.select(index)
        chosen._matrices = None if self._matrices is None else self._matrices.select(chosen, index)
        return chosen

    # --- the feed-forward term ---------------------------------------------------------------------

    def feed_forward(self, W: torch.Tensor) -> torch.Tensor:
        """The drive of the rate for the members' matrices W (M, d, d): a_k(x) = <e_k(x), W_m x> (M, K, P) plus the
        fixed zero-temperature attention on the grid path; the matrix path's layout (MatrixPath.drive)."""
        members = W.shape[0]
        a = (W.reshape(members, -1) @ self._feed_forward.T).reshape(members, -1, self.points.shape[0])
        if self._matrices is not None:
            return self._matrices.drive(a)
        return a if self._fixed is None else a + self._fixed

    def feed_forward_adjoint(self, drive_bar: torch.Tensor) -> torch.Tensor:
        """W_bar (M, d, d) from the cotangent of `feed_forward`'s drive."""
        members, d = drive_bar.shape[0], self.points.shape[1]
        if self._matrices is not None:
            drive_bar = self._matrices.drive_part(drive_bar)
        return (drive_bar.reshape(members, -1) @ self._feed_forward).reshape(members, d, d)

    # --- the attention term ------------------------------------------------------------------------

    def _frame_components(self, m: torch.Tensor) -> torch.Tensor:
        """u_k = <e_k, V m> (M, K, P) from ambient m (M, P, d): d multiply-adds (torch.einsum took a batched
        product over the points, 50 times slower at lmax 32)."""
        return inner(self._frame_V, m[:, None])

    def _frame_adjoint(self, u_bar: torch.Tensor) -> torch.Tensor:
        """m_bar (M, P, d): the transpose of `_frame_components`."""
        return (self._frame_V * u_bar[..., None]).sum(1)

    def attention(self, rho: torch.Tensor) -> torch.Tensor:
        """u_k = <e_k, V m[rho]> (M, K, P) for grid densities rho (M, P), the zero-temperature term aside (it
        rides in the drive)."""
        if self.attention_mode == "zero temperature":
            return torch.zeros_like(self._fixed).expand(rho.shape[0], -1, -1)
        if self.attention_mode == "operator":
            return self._operator.attention(rho, self)
        scaled, log_scale = self.kernels.fields(self._channels(rho))
        if self.batch.kernel == "unnormalized":
            return self._frame_components(scaled.transpose(1, 2) * torch.exp(log_scale)[..., None])
        return self._frame_components(softmax_mean(scaled[:, 1:].transpose(1, 2), scaled[:, 0], rho))

    def _channels(self, rho: torch.Tensor) -> torch.Tensor:
        """The fields of the transform attention: rho y (M, d, P) for the unnormalized kernel (N alone), (rho, rho y)
        (M, 1 + d, P) for the softmax (Z and N)."""
        moments = rho[:, None] * self.points.T
        return moments if self.batch.kernel == "unnormalized" else torch.cat([rho[:, None], moments], dim=1)

    def attention_adjoint(self, rho: torch.Tensor, u_bar: torch.Tensor) -> torch.Tensor:
        """rho_bar (M, P): the transpose of the derivative of `attention` at rho, applied to u_bar (M, K, P)."""
        if self.attention_mode == "zero temperature":
            return torch.zeros_like(rho)
        if self.attention_mode == "operator":
            return self._operator.adjoint(rho, u_bar, self)
        m_bar = self._frame_adjoint(u_bar)
        with torch.enable_grad():
            channels = self._channels(rho).requires_grad_(True)
            scaled, log_scale = self.kernels.fields(channels)
            if self.batch.kernel == "unnormalized":
                scaled_bar = (m_bar * torch.exp(log_scale)[..., None]).transpose(1, 2)
            else:
                N_bar, Z_bar = softmax_mean_adjoint(scaled[:, 1:].transpose(1, 2).detach(), scaled[:, 0].detach(), rho,
                                                    m_bar)
                scaled_bar = torch.cat([Z_bar[:, None], N_bar.transpose(1, 2)], dim=1)
            (channels_bar,) = torch.autograd.grad(scaled, channels, scaled_bar)
        moments_bar = (channels_bar[:, -self.points.shape[1]:] * self.points.T).sum(1)
        return moments_bar if self.batch.kernel == "unnormalized" else channels_bar[:, 0] + moments_bar

    # --- the rate and its transpose ----------------------------------------------------------------

    def velocity(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rho (M, P), v (M, K, P)) of the state."""
        if self._matrices is not None:
            return self._matrices.velocity(state, drive)
        c = complex_state(state, self.coefficient_shape)
        rho = self.basis.synthesis(c).reshape(state.shape[0], -1)
        return rho, drive if self.attention_mode == "zero temperature" else drive + self.attention(rho)

    def __call__(self, state: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        """-div(rho v) (M, N)."""
        if self._matrices is not None:
            return self._matrices.rate(state, drive)
        rho, v = self.velocity(state, drive)
        flux = (rho[:, None] * v).reshape(v.shape[:2] + self.grid_shape)
        return real_state(-self.basis.divergence_frame(flux))

    def vjp(self, state: torch.Tensor, drive: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(state_bar, drive_bar): the cotangents of the state and of the drive for the cotangent b (M, N) of the
        rate."""
        if self._matrices is not None:
            return self._matrices.vjp(state, drive, b)
        rho, v = self.velocity(state, drive)
        members = state.shape[0]
        f_bar = -self.basis.divergence_adjoint(complex_state(b, self.coefficient_shape)).reshape(v.shape)
        v_bar = rho[:, None] * f_bar
        rho_bar = (v * f_bar).sum(1) + self.attention_adjoint(rho, v_bar)
        c_bar = self.basis.synthesis_adjoint(rho_bar.reshape((members,) + self.grid_shape))
        return real_state(c_bar), v_bar

    def rate_token(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the rate, a token for `vjp_token`): what the transpose needs of this evaluation, the rows (rho, v) of
        the matrix path's first product where it has them (the transpose then skips that product), else the
        state."""
        if self._matrices is not None and self._matrices.single_frame:
            return self._matrices.rate_token(state, drive)
        return self(state, drive), state

    def vjp_token(self, token: torch.Tensor, drive: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor,
                                                                                           torch.Tensor]:
        """`vjp` from the token of `rate_token`."""
        if self._matrices is not None and self._matrices.single_frame:
            return self._matrices.vjp_rows(token, b)
        return self.vjp(token, drive, b)

    def token_size(self) -> int:
        """Numbers per member of a token of `rate_token`."""
        if self._matrices is not None and self._matrices.single_frame:
            return 2 * self.points.shape[0]
        return 2 * math.prod(self.coefficient_shape)

    def max_speed(self, state: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        """max over the grid of |v| (M,): the frame is orthonormal, so |v|^2 = sum_k v_k^2."""
        return torch.sqrt((self.velocity(state, drive)[1] ** 2).sum(1).amax(-1))


class MatrixPath:
    """Transport's "matrix" path (module docstring): with R the stacked rows (rho; u) or (rho; Z; N) of the grid
    fields a state determines linearly and D the weak divergence (K P -> N), both dense,

        unnormalized:      y = state R^T + (0, a),  rate = (y_rho * y_u) D^T
        zero temperature:  y_rho = state S^T,        rate = (y_rho * drive) D^T   (drive = a + u, fixed)
        softmax:           y = state R^T,  v = a + <e, V softmax_mean(N, Z, rho)>,  rate = (rho v) D^T.
    """

    def __init__(self, transport: Transport, rows_t: torch.Tensor, divergence_t: torch.Tensor, kind: str):
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
    def build(cls, transport: Transport, matrix_bytes: int) -> "MatrixPath | None":
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

    def select(self, transport: Transport, index: torch.Tensor) -> "MatrixPath":
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
        rho, Z, N = y[:, 0], y[:, 1], y[:, 2:].transpose(1, 2)
        u = self.transport._frame_components(softmax_mean(N, Z, rho))
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


def softmax_mean_adjoint(N: torch.Tensor, Z: torch.Tensor, rho: torch.Tensor,
                         m_bar: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N_bar (M, P, d), Z_bar (M, P)): the transpose of the derivative of model.softmax_mean(N, Z, rho) applied
    to m_bar (the void mask, a function of rho, is piecewise constant: no cotangent flows through it).

    m = N / Z:  N_bar = mean_bar / Z,  Z_bar = -<mean_bar, m> / Z,  with mean_bar = m_bar except in the void,
    where |m| > 1 is bounded to m / |m| (mean_bar = (m_bar - m_hat <m_hat, m_bar>) / |m|) and Z <= 0 gives
    m = 0 (mean_bar = 0)."""
    mean = torch.where(Z[..., None] > 0, N / torch.where(Z > 0, Z, 1.0)[..., None], torch.nan)
    magnitude = rho.abs()
    void = (magnitude <= NEGLIGIBLE_DENSITY * magnitude.amax(-1, keepdim=True))[..., None]
    length = torch.sqrt(inner(mean, mean))[..., None]
    direction = mean / torch.where(length > 0, length, 1.0)
    bounded_bar = torch.where(length > 1, (m_bar - direction * inner(direction, m_bar)[..., None]) / length, m_bar)
    mean_bar = torch.where(void, torch.where(torch.isnan(mean), 0.0, bounded_bar), m_bar)
    safe = torch.where(Z > 0, Z, 1.0)[..., None]
    N_bar = torch.where(void & ~(Z[..., None] > 0), 0.0, mean_bar / safe)
    Z_bar = -inner(N_bar, torch.nan_to_num(mean, nan=0.0))
    return N_bar, Z_bar


# Singular values below this fraction of the largest are dropped from the attention operator's factors: their
# part of a product is below the product's own round-off.
RANK_TOLERANCE = 1e-16


class DenseOperator:
    """The attention term as one kept matrix per distinct member model (Transport's "operator" attention).

    `matrix` is (members or 1, P, rows P): transposed for a product from the left, G (unnormalized, rows = K)
    or the channels (Z, N) of the shifted kernel (softmax, rows = 1 + d).  The kernel is smooth, so its matrix
    has a numerical rank r far below P at moderate beta (S^1, seed 004's A: 37 of 200 singular values above
    RANK_TOLERANCE); where r (P + rows P) < P rows P / 2 a product goes through the truncated SVD factors
    (`left` (., P, r), `right` (., r, rows P)) instead, at half the arithmetic or less."""

    def __init__(self, matrix: torch.Tensor, kernel: str):
        self.matrix, self.kernel = matrix, kernel
        self.left = self.right = None
        points, columns = matrix.shape[-2:]
        if points * columns > LOW_RANK_ENTRIES:
            return
        U, sigma, Vh = torch.linalg.svd(matrix, full_matrices=False)
        rank = int((sigma > RANK_TOLERANCE * sigma[..., :1]).sum(-1).max())
        if rank * (points + columns) < points * columns / 2:
            self.left = U[..., :rank].contiguous()
            self.right = (sigma[..., :rank, None] * Vh[..., :rank, :]).contiguous()

    def multiply_adds(self) -> int:
        """Of one product, per member."""
        if self.left is not None:
            return self.left.shape[-2] * self.left.shape[-1] + self.right.shape[-2] * self.right.shape[-1]
        return self.matrix.shape[-2] * self.matrix.shape[-1]

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

    def attention(self, rho: torch.Tensor, transport: Transport) -> torch.Tensor:
        if self.kernel == "unnormalized":
            return self._product(rho).reshape(rho.shape[0], -1, rho.shape[1])
        N, Z = self._moments(rho)
        return transport._frame_components(softmax_mean(N, Z, rho))

    def adjoint(self, rho: torch.Tensor, u_bar: torch.Tensor, transport: Transport) -> torch.Tensor:
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


def attention_operator(basis, batch: ModelBatch, kernels, operator_bytes: int = OPERATOR_BYTES) -> DenseOperator | None:
    """The folded attention matrices of Transport's "operator" attention, or None where it does not apply: the
    field is not the dense quadrature, the grid's N x N kernel or the matrices would exceed
    `operator_bytes`, or the unnormalized kernel overflows (beta |B| beyond the float range)."""
    d, points = basis.dim, basis.grid_size
    element = basis.points.element_size()
    if kernels.name != "dense" or points * points * element > operator_bytes:
        return None
    rows = d - 1 if batch.kernel == "unnormalized" else d + 1
    keys = [(model.beta, model.B.cpu().double().numpy().tobytes(), model.V.cpu().double().numpy().tobytes())
            for model in batch.models]
    distinct = {key: keys.index(key) for key in dict.fromkeys(keys)}  # the first member of each attention
    if len(distinct) * rows * points * points * element > operator_bytes:
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
