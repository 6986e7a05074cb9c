"""Transport's "fourier" path: S^1 with the operator attention of the unnormalized kernel, for batches.

With c the coefficients (the state's complex view), n grid points and r_j = irfft_forward(c)_j = sqrt(2 pi) rho(x_j)
(the synthesis without its scale, bases.CircleBasis), the rate is

    y = a + c R U,       rate_k = phi_k rfft(r y)_k,   phi_k = -i k / n     (k = 0..kmax),

where a is the feed-forward term and R U the rank-r factorisation of the folded attention u = G S c (S the
synthesis, G the operator of model.dense_operator: u = G rho): its truncated SVD, the singular values below
dense_operator.truncated_svd's tolerance dropped (their part is below the product's round-off).  The kernel
exp(beta <x, B y>) is smooth, so r is small (seed 004's A at lmax 64: 29 against 200 points), and R reads the
coefficients up to the degree of the basis the factors come from only (below: 66 of seed 004's 130).  Per member
and stage that is two FFTs and at most r (N + n) multiply-adds, where the matrix path spends 3 n N: in torch it pays
from a few members on, in numpy on the CPU from one (model.transport's cost rule, benchmarks/ensembles.py --paths).

The transpose, from the token (r, y) of an evaluation, with b the cotangent of the rate:

    f_bar = irfft_forward(psi b),  psi_k = conj(phi_k) / 2 (k > 0; irfft_forward doubles the k > 0 terms),
    (y_bar, r_bar) = (r f_bar, y f_bar),   c_bar = m rfft(r_bar)_k + y_bar U^T R^T      (m = 1, 2, 2, ...),

rfft being irfft_forward's transpose up to the multiplicity m (the imaginary part of the k = 0 term is not read by
irfft and returned zero by rfft).

Where the factors come from (`FourierPath.build`).  The kernel's Fourier series in both angles ends, to round-off,
at a degree K set by beta |B| (modified Bessel coefficients I_k(beta r) ~ (beta r / 2)^k / k!: K ~ 20 at seed 004's
beta |A| = 1), whatever the grid.  So the folded attention reads rho's degrees up to K only, and u is a
trigonometric polynomial of degree about K: its factors are those of the same operator on a coarser basis (the
dense quadrature there is exact for these degrees, as on the fine grid), R padded with zero rows for the degrees
above the coarse basis's and U's rows interpolated to the fine grid (zero-padded spectra).  The coarse basis is the
first of lmax = COARSEST_LEVEL, twice that, ... below the case's lmax whose folded operator is resolved: its
columns of the top quarter of its degrees and its spectrum (over the grid) in the top quarter of the frequencies
below the Nyquist frequency are at most LEVEL_TOLERANCE of its largest entry, so that the degrees the lifting drops
weigh less (the coefficients decay faster than geometrically).  Else the basis's own operator is factorized, where
its N x N kernel fits dense_operator.OPERATOR_BYTES.  The lifted factors agree with the fine operator's to about
LEVEL_TOLERANCE (tests/test_transport.py); a grid far beyond OPERATOR_BYTES (seed 004's eps = 1e-4 case: 4050
points at lmax 1344) thus runs on this path, at a small multiple of the cost of its FFTs, where the transform
attention recomputes the 4050^2 kernel at every stage (370-380 ms a step, benchmarks/ensembles.py --paths).
"""

import copy
import math

import numpy as np
import torch

from spherepde.base.arrays import (
    addmm,
    as_namespace,
    copy_,
    irfft,
    kind,
    namespace,
    real_pairs,
    rfft,
    zeros,
)
from spherepde.base.real_view import complex_state
from spherepde.discretisation.bases import make_basis
from spherepde.kernels.choice import MemberKernels
from spherepde.model.dense_operator import attention_operator, truncated_svd
from spherepde.model.matrix_path import basis_matrices

# The coarsest basis (its lmax) tried for the factors of the folded attention; then twice that, and so on below the
# case's lmax (module docstring).
COARSEST_LEVEL = 16
# A coarse basis resolves the folded attention where the top quarter of its degrees and of its grid frequencies carry
# at most this fraction of its largest entry (in float64; scaled by the epsilon in other dtypes).
LEVEL_TOLERANCE = 1e-14


class FourierPath:
    """Transport's "fourier" path (module docstring); its drive is a (M, n).  One program over numpy and torch
    (base.arrays), by the kind of the state: numpy arrays on the CPU (Transport.namespace), torch tensors elsewhere
    and for the callers that hold tensors."""

    single_frame = True

    def __init__(self, transport, R: torch.Tensor, U: torch.Tensor, level: int):
        basis = transport.basis
        self.level = level  # the lmax of the basis whose operator gave the factors
        # R's rows of the degrees above `level` are zero (`lifted`): the products read the state's first `low` only
        self.low = 2 * (level + 1)
        R = R[..., :self.low, :]
        self.transport, self.R, self.U = transport, R, U  # (members or 1, low, r), (members or 1, r, n)
        self.R_t, self.U_t = R.transpose(-1, -2).contiguous(), U.transpose(-1, -2).contiguous()
        self.points, self.modes = basis.grid_size, basis.lmax + 1
        wavenumber = basis.degree.to(basis.placement.real)
        self.derivative = -1j * wavenumber / self.points  # phi_k
        self.derivative_adjoint = (1j * wavenumber / self.points) / basis.multiplicity  # psi_k
        self.multiplicity = basis.multiplicity.to(self.derivative.dtype)
        self._workspaces = {}

    def _workspace(self, like) -> "Workspace":
        """The path's operands in the kind of `like` (the tensors, or numpy arrays sharing their memory) with the
        spectrum buffer of its members: numpy's made once per dtype and batch size, not once per stage; a tensor's
        at each call, as TorchSHT._spectrum_buffer's: autograd's graph of one evaluation holds the buffer it
        wrote, and every later evaluation writing a kept one would join that graph (its values requiring grad, the
        transpose's out= refused)."""
        if not isinstance(like, np.ndarray):
            return Workspace(self, like)
        key = kind(like) + (like.shape[0],)
        if key not in self._workspaces:
            self._workspaces[key] = Workspace(self, like)
        return self._workspaces[key]

    @classmethod
    def build(cls, transport) -> "FourierPath | None":
        """The path of `transport` (S^1, the unnormalized kernel, the dense field), its factors R, U (one per
        distinct member model, or shared) from the first coarse basis that resolves the folded attention, else from
        the basis's own operator (module docstring); None where neither applies."""
        basis, batch = transport.basis, transport.batch
        if transport.kernels.name != "dense":
            return None
        level = COARSEST_LEVEL
        while level < basis.lmax:
            coarse = make_basis(2, level, basis.placement)
            if coarse.grid_size > basis.grid_size:  # a grid of the case's own, coarser than the level's
                break
            kernels = MemberKernels(coarse, batch.B, [model.beta for model in batch.models], "dense", 0.0)
            folded = folded_attention(coarse, attention_operator(coarse, batch, kernels))
            if folded is None:  # beyond the operator's memory, or the kernel overflows: so on every finer basis
                break
            if resolved(folded, level):
                left, right = truncated_svd(folded)
                return cls(transport, *lifted(left, right, basis), level)
            level *= 2
        folded = folded_attention(basis, transport._operator)
        if folded is None:
            return None
        left, right = truncated_svd(folded)
        return cls(transport, right.transpose(-1, -2).contiguous(), left.transpose(-1, -2).contiguous(), basis.lmax)

    @property
    def rank(self) -> int:
        return self.R.shape[-1]

    def select(self, transport, index: torch.Tensor) -> "FourierPath":
        chosen = copy.copy(self)
        chosen.transport = transport
        if self.R.shape[0] > 1:
            chosen.R, chosen.U = self.R.index_select(0, index), self.U.index_select(0, index)
            chosen.R_t, chosen.U_t = self.R_t.index_select(0, index), self.U_t.index_select(0, index)
        chosen._workspaces = {}
        return chosen

    def drive(self, a: torch.Tensor) -> torch.Tensor:
        return a.reshape(a.shape[0], -1)

    def drive_part(self, drive_bar: torch.Tensor) -> torch.Tensor:
        return drive_bar

    def _velocity(self, state, drive, work):
        """y = a + state R U (M, n)."""
        low = state[:, :self.low]
        if work.shared:
            return addmm(drive, work.dot(low, work.R), work.U)
        return addmm(drive[:, None], low[:, None] @ work.R, work.U)[:, 0]

    def _synthesis(self, state, work):
        """r = sqrt(2 pi) rho (M, n): the inverse FFT of the state's spectrum, zero-padded in the workspace."""
        copy_(work.head, state)  # the rest of the spectrum stays zero
        return irfft(work.spectrum, self.points)

    def velocity(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rho (M, n), v (M, 1, n))."""
        r, y = self.token(state, drive)
        return r / math.sqrt(2 * math.pi), y[:, None]

    def token(self, state, drive) -> tuple:
        """The rows (r, y), each (M, n), of the state: what the transpose reads."""
        work = self._workspace(state)
        return self._synthesis(state, work), self._velocity(state, drive, work)

    def rate_token(self, state, drive) -> tuple:
        """(the rate (M, N), the token (r, y) of `token`)."""
        work = self._workspace(state)
        r, y = self._synthesis(state, work), self._velocity(state, drive, work)
        return real_pairs(rfft(r * y)[:, :self.modes] * work.derivative), (r, y)

    def rate(self, state, drive):
        return self.rate_token(state, drive)[0]

    def vjp_rows(self, token: tuple, b) -> tuple:
        """(state_bar (M, N), drive_bar (M, n)) from the token of `rate_token` and the rate's cotangent b."""
        work = self._workspace(b)
        # complex_state, not a view alone: a column slice of a wider tensor may have a row stride that
        # view_as_complex refuses (base.real_view)
        work.xp.multiply(complex_state(b, (self.modes,)), work.derivative_adjoint, out=work.head_complex)
        f_bar = irfft(work.spectrum, self.points)
        r, y = token
        y_bar, r_bar = r * f_bar, y * f_bar
        state_bar = real_pairs(rfft(r_bar)[:, :self.modes] * work.multiplicity)
        if work.shared:
            state_bar[:, :self.low] += work.dot(work.dot(y_bar, work.U_t), work.R_t)
        else:
            state_bar[:, :self.low] += ((y_bar[:, None] @ work.U_t) @ work.R_t)[:, 0]
        return state_bar, y_bar

    def vjp(self, state, drive, b) -> tuple:
        return self.vjp_rows(self.token(state, drive), b)


class Workspace:
    """A FourierPath's operands in one array library, R and U as matrices where the members share them, and the
    zero-padded spectrum (M, n // 2 + 1) its inverse FFTs read (`head`, `head_complex`: its first `modes`
    frequencies, as real pairs and as complex numbers; the rest stays zero)."""

    def __init__(self, path: FourierPath, like):
        xp = self.xp = namespace(like)
        self.dot = np.dot if xp is np else torch.mm  # of two matrices: numpy's matmul costs a microsecond more a call
        self.shared = path.R.shape[0] == 1
        R, U, R_t, U_t = (matrix[0] if self.shared else matrix for matrix in (path.R, path.U, path.R_t, path.U_t))
        self.R, self.U, self.R_t, self.U_t, self.derivative, self.derivative_adjoint, self.multiplicity = (
            as_namespace(operand, xp) for operand in (R, U, R_t, U_t, path.derivative, path.derivative_adjoint,
                                                      path.multiplicity))
        self.spectrum = zeros(as_namespace(path.derivative, xp), (like.shape[0], path.points // 2 + 1))
        self.head_complex = self.spectrum[:, :path.modes]
        self.head = real_pairs(self.spectrum)[:, :2 * path.modes]


def folded_attention(basis, operator) -> torch.Tensor | None:
    """u = state folded^T: the operator (model.dense_operator) times the synthesis, (members or 1, n, N); None
    without an operator."""
    if operator is None:
        return None
    synthesis, _ = basis_matrices(basis)  # (n, N)
    return operator.matrix.transpose(-1, -2) @ synthesis


def resolved(folded: torch.Tensor, level: int) -> bool:
    """Whether the folded attention (., n, N) of the basis of degree `level` is resolved there, each member's
    operator on its own scale: its columns of the top quarter of the degrees, and its discrete Fourier coefficients
    over the grid in the top quarter of the frequencies below the Nyquist frequency, at most LEVEL_TOLERANCE
    (scaled to the dtype) of its largest."""
    tolerance = LEVEL_TOLERANCE * torch.finfo(folded.dtype).eps / torch.finfo(torch.float64).eps
    degrees = folded.unflatten(-1, (level + 1, 2))[..., 3 * (level + 1) // 4:, :].flatten(-3)
    spectrum = torch.fft.rfft(folded, dim=-2).abs()
    below_nyquist = (folded.shape[-2] + 1) // 2
    frequencies = spectrum[..., 3 * below_nyquist // 4:below_nyquist, :]
    return bool((degrees.abs().amax(-1) <= tolerance * folded.abs().amax((-2, -1))).all()) and bool(
        (frequencies.amax((-2, -1)) <= tolerance * spectrum.amax((-2, -1))).all())


def lifted(left: torch.Tensor, right: torch.Tensor, basis) -> tuple[torch.Tensor, torch.Tensor]:
    """(R (., N, r), U (., r, n)) on `basis` from the factors left (., n_c, r), right (., r, N_c) of a resolved coarse
    basis's folded attention: R is right^T with zero rows for the degrees above the coarse basis's, U^T is left
    interpolated to the n points (the trigonometric interpolant of its columns from their frequencies below the
    coarse Nyquist frequency: exact for the band-limited columns of `resolved`)."""
    coarse_points, rank = left.shape[-2:]
    points, size = basis.grid_size, 2 * (basis.lmax + 1)
    spectrum = torch.fft.rfft(torch.eye(coarse_points, dtype=left.dtype, device=left.device), dim=0)
    padded = spectrum.new_zeros((points // 2 + 1, coarse_points))
    padded[:(coarse_points + 1) // 2] = spectrum[:(coarse_points + 1) // 2]
    interpolation = torch.fft.irfft(padded, n=points, dim=0) * (points / coarse_points)  # (n, n_c)
    R = right.new_zeros(right.shape[:-2] + (size, rank))
    R[..., :right.shape[-1], :] = right.transpose(-1, -2)
    return R.contiguous(), (interpolation @ left).transpose(-1, -2).contiguous()
