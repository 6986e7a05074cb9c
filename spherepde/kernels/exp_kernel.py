"""The exponential-kernel transform  T_C f(x) = integral exp(beta <x, C y>) f(y) dsigma(y).

It is the attention integral of the model: with f = rho (partition function Z) and
f = y_c rho (numerator N), applied with C = B.  Values can be astronomically large
(beta in the thousands), so every implementation returns them scaled:

    T_C f(x) = exp(log_scale(x)) * scaled(x),   log_scale(x) <= beta |C^T x|,

the bound keeping every kernel entry below 1, since <x, C y> = <C^T x, y> <= |C^T x|.  The
spectral field uses the bound itself; the dense one the largest beta <x, C y_j> over its points
y_j, because over a few scattered points (particles) the bound can exceed every logit by hundreds
and underflow all the weights.  Both
implementations share one call signature, f (*grid, c) -> (scaled (*grid, c), log_scale (*grid)),
and a `name`; `make_exp_kernel` picks one (solver.field).

`DenseExpKernel` is the reference: quadrature over the grid, O(N^2) work.  A small grid keeps
its N x N kernel matrix (at most DENSE_MATRIX_BYTES, computed once); a larger one recomputes it one
block of rows at a time (memory O(N * chunk)).  It is literally an attention
product, softmax weights having log(w_j rho_j) as bias.

`SpectralExpKernel` is exact for band-limited channels (rho of degree lmax, y rho of degree
lmax + 1).  With u = C^T x = r u_hat (r = |C^T x|), the kernel exp(beta r <u_hat, y>) is zonal
about u_hat and by the Funk-Hecke theorem acts on each degree l by a number,

    T_C f(x) = sum_lm lambda_l(beta r) f_lm Y_lm(u_hat),
    lambda_l(kappa) = 4 pi i_l(kappa) = 4 pi sqrt(pi / 2 kappa) I_{l+1/2}(kappa)   (S^2),
    lambda_k(kappa) = 2 pi I_k(kappa)                                             (S^1),

and scaled(x) = sum_lm mu_l(beta r) f_lm Y_lm(u_hat) with mu_l(kappa) = exp(-kappa) lambda_l(kappa),
evaluated with exponentially scaled Bessel functions (scipy's ive): no overflow and no lost
digits at kappa in the thousands; 0 <= mu_l <= mu_0 <= |S^{d-1}|.  Then:

* C = s Q with Q orthogonal (s >= 0; every diagonal +-1 matrix, rotations, reflections):
  r = s and u_hat = Q^T x everywhere, so scaled = (mu(beta s) f) o Q^T, applied exactly: a grid
  permutation when Q^T maps the grid onto itself (sign flips of the coordinates on the Gauss
  grid), otherwise a rotation of the coefficients (Wigner D on S^2, a phase on S^1), a
  reflection being a rotation after the parity Y_lm(-x) = (-1)^l Y_lm(x) (S^2) or a
  conjugation (S^1).  Cost: two transforms and, for a rotation, O(lmax^3).
* general C: r ranges over [sigma_min(C), sigma_max(C)]; mu_l(beta r) is interpolated in r on
  n Chebyshev nodes r_k,  mu_l(beta r) ~ sum_k ell_k(r) mu_l(beta r_k), so that

      scaled(x) ~ sum_k ell_k(r(x)) F_k(u_hat(x)),   F_k = sum_lm mu_l(beta r_k) f_lm Y_lm,

  with n the smallest count whose interpolation error is below tol * mu_0(beta r) for every
  degree (`chebyshev_nodes`).  Each F_k is band-limited and is evaluated at the scattered points
  u_hat(x): ducc0's synthesis_general on the CPU (an SHT onto an auxiliary grid, then a
  non-uniform FFT, O(L^2 log L + N) per field), a type-2 non-uniform FFT in PyTorch elsewhere
  (`TorusNUFFT`), direct sums on S^1.

The transform is linear and never divides: whether N / Z is well defined is the model's
business (`model.attention_mean`).
"""

import copy
import math
import warnings

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal
from scipy.special import ive

from spherepde.geometry.ambient import norm
from spherepde.base.errors import CaseError
from spherepde.discretisation.transforms.fourier import FourierTransform
from spherepde.discretisation.transforms.legendre import gauss_legendre, legendre_tables
from spherepde.discretisation.transforms.legendre_layouts import PackedLegendre
from spherepde.discretisation.transforms.sht_torch import TorchSHT

# solver.chunk = "auto": a block of the dense kernel matrix of about this size stays in a CPU core's cache
# through the six passes over it (logits, row maximum, shift, floor, exponential, product with f).  Measured
# with benchmarks/dense_blocks.py for n = 1000 to 16000 points: 0.7-0.9 of the time of 4 MiB blocks, a third of
# that of 64 MiB ones (4096 rows at n = 2000 to 8000, the former default); at least CPU_BLOCK_MIN_ROWS rows, so
# that the per-block overhead stays small at large n.  A GPU wants large blocks instead: GPU_BLOCK_ROWS, fewer
# where a block would exceed GPU_BLOCK_BYTES (n = 10^6 particles: 134 rows, not 32 GB).
CPU_BLOCK_BYTES = 2 ** 20
CPU_BLOCK_MIN_ROWS = 8
GPU_BLOCK_ROWS = 4096
GPU_BLOCK_BYTES = 2 ** 30
# Largest Chebyshev node count tried before a general C is declared out of reach of the spectral field.
MAX_CHEBYSHEV_NODES = 64
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
    logits."""
    u = x @ C  # rows are (C^T x_i)^T
    scale = beta if not torch.is_tensor(beta) else beta[..., None]
    bound = scale * norm(u)
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
    cost of the others; the floor keeps every entry a normal number.  It adds at most 1e-306 (float64;
    3e-37 in float32) of the row's largest entry, which is 1, per entry: hundreds of orders below round-off.
    """
    return math.log(torch.finfo(dtype).tiny) + 4.0


def block_rows(chunk: int | str, columns: int, dtype: torch.dtype, device: torch.device) -> int:
    """Rows per block of a dense kernel matrix with `columns` columns: solver.chunk, or for "auto" the rows of
    CPU_BLOCK_BYTES on the CPU (at least CPU_BLOCK_MIN_ROWS) and on a GPU GPU_BLOCK_ROWS, at most those of
    GPU_BLOCK_BYTES (at least one)."""
    if chunk != "auto":
        return chunk
    row_bytes = columns * (torch.finfo(dtype).bits // 8)
    if device.type != "cpu":
        return max(1, min(GPU_BLOCK_ROWS, GPU_BLOCK_BYTES // row_bytes))
    return max(CPU_BLOCK_MIN_ROWS, CPU_BLOCK_BYTES // row_bytes)


def dense_exp_kernel(x: torch.Tensor, y: torch.Tensor, f: torch.Tensor, C: torch.Tensor, beta,
                     chunk: int | str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Sum_j exp(beta <x_i, C y_j>) f_j for points x (..., Nx, d), y (..., Ny, d), channels f (..., Ny, c).

    Quadrature weights are part of f.  Returns (scaled (..., Nx, c), log_scale (..., Nx)) as `shifted_exp_kernel`,
    holding `block_rows(chunk, ...)` rows of the kernel matrix at a time (for "auto", of all batch members
    together).
    """
    rows = block_rows(chunk, y.shape[-2], y.dtype, y.device)
    if chunk == "auto":  # the block's bytes, not its rows, are what the cache holds: share them among the members
        rows = max(1, rows // max(math.prod(x.shape[:-2]), 1))
    queries, keys, bound = _logit_operands(x, y, C, beta)
    blocks, log_scales = [], []
    for start in range(0, x.shape[-2], rows):
        kernel, log_scale = _shifted_block(queries[..., start:start + rows, :], keys, bound[..., start:start + rows])
        blocks.append(kernel @ f)
        log_scales.append(log_scale)
    return torch.cat(blocks, dim=-2), torch.cat(log_scales, dim=-1)


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


# --- Funk-Hecke -----------------------------------------------------------------------------------


def funk_hecke(dim: int, kappa, degree) -> np.ndarray:
    """mu_l(kappa) = exp(-kappa) lambda_l(kappa): how exp(kappa <u, y>) - scaled - acts on degree l.

    S^1 (dim 2): 2 pi I_l(kappa) exp(-kappa);  S^2 (dim 3): 4 pi sqrt(pi / 2 kappa) I_{l+1/2}(kappa) exp(-kappa),
    with the kappa -> 0 limit |S^{d-1}| [l = 0].  Broadcasts kappa against degree (float64).
    """
    kappa, degree = np.broadcast_arrays(np.asarray(kappa, dtype=np.float64), np.asarray(degree, dtype=np.float64))
    if dim == 2:
        return 2 * np.pi * ive(degree, kappa)
    safe = np.where(kappa > 0, kappa, 1.0)
    return np.where(kappa > 0, 4 * np.pi * np.sqrt(np.pi / (2 * safe)) * ive(degree + 0.5, safe),
                    np.where(degree == 0, 4 * np.pi, 0.0))


def kernel_degree(kappa: float, dim: int, tol: float, limit: int = 2 ** 16) -> int:
    """Smallest degree l at which exp(kappa <u, y>) on S^{dim-1} has relative Funk-Hecke weight < tol.

    The ratio mu_l(kappa) / mu_0(kappa) = lambda_l / lambda_0 of `funk_hecke`: computed with
    exponentially scaled Bessel functions, so large kappa neither overflows nor loses digits.  The weights
    fall like exp(-l^2 / (2 kappa)), so the search doubles its range from 64 degrees; ValueError when no
    degree up to `limit` qualifies (kappa above ~ 1e8 at tol 1e-14, far beyond any grid).
    """
    if kappa == 0:
        return 1
    if not math.isfinite(kappa):
        raise ValueError(f"kernel_degree: kappa = {kappa} is not finite")
    size = 64
    while size <= 2 * limit:
        degrees = np.arange(0, min(size, limit + 1))
        weights = funk_hecke(dim, kappa, degrees)
        small = weights / weights[0] < tol
        if small.any():
            return int(degrees[np.argmax(small)])
        size *= 2
    raise ValueError(f"kernel_degree: the kernel exp({kappa:g} <u, y>) needs a degree beyond {limit}")


# --- the map x -> C^T x / |C^T x| -------------------------------------------------------------------


def orthogonal_factor(C: np.ndarray, rtol: float = 1e-14) -> tuple[float, np.ndarray] | None:
    """(s, Q) with C = s Q, Q orthogonal, when C^T C = s^2 I to rtol; else None.  C = 0 gives (0, I)."""
    d = C.shape[0]
    s2 = float(np.trace(C.T @ C)) / d
    if s2 == 0:
        return 0.0, np.eye(d)
    if np.abs(C.T @ C - s2 * np.eye(d)).max() > rtol * s2:
        return None
    return math.sqrt(s2), C / math.sqrt(s2)


def zyz_euler_angles(R: np.ndarray) -> tuple[float, float, float]:
    """(alpha, beta, gamma) with R = Rz(alpha) Ry(beta) Rz(gamma) for a rotation R (det +1)."""
    beta = math.atan2(math.hypot(R[0, 2], R[1, 2]), R[2, 2])
    if math.sin(beta) > 1e-9:
        alpha, gamma = math.atan2(R[1, 2], R[0, 2]), math.atan2(R[2, 1], -R[2, 0])
    elif R[2, 2] > 0:  # R = Rz(alpha + gamma)
        alpha, gamma = math.atan2(R[1, 0], R[0, 0]), 0.0
    else:  # R = Rz(alpha) Ry(pi)
        alpha, gamma = math.atan2(-R[1, 0], -R[0, 0]), 0.0

    def rz(a):
        return np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])

    ry = np.array([[math.cos(beta), 0, math.sin(beta)], [0, 1, 0], [-math.sin(beta), 0, math.cos(beta)]])
    if np.abs(rz(alpha) @ ry @ rz(gamma) - R).max() > 1e-12:
        raise ValueError("zyz_euler_angles: not a rotation matrix")
    return alpha, beta, gamma


def wigner_d(l: int, beta: float) -> np.ndarray:
    """d^l_{m m'}(beta) = <l m| exp(-i beta J_y) |l m'>, m, m' = -l..l (Condon-Shortley phase).

    J_y = D T D^*, D = diag(i^m), with T real symmetric tridiagonal, T_{m+1,m} = -sqrt((l-m)(l+m+1))/2;
    T = W diag(lambda) W^T with eigenvalues lambda = -l..l exactly, so
    d = D W diag(exp(-i beta lambda)) W^T D^*, real.
    """
    m = np.arange(-l, l + 1)
    _, W = eigh_tridiagonal(np.zeros(2 * l + 1), -0.5 * np.sqrt((l - m[:-1]) * (l + m[:-1] + 1.0)))
    phase = 1j ** (m % 4)
    d = (phase[:, None] * W) @ (np.exp(-1j * beta * m)[:, None] * (W.T * phase.conj()[None, :]))
    return d.real


class SphereRotation:
    """Coefficients of g(Q^T x) from those of g, Q orthogonal (3 x 3), real fields [m >= 0, l].

    Q = sigma R with R = Rz(alpha) Ry(beta) Rz(gamma) a rotation and sigma = det Q.  For sigma = -1,
    g(Q^T x) = g(-R^T x) and Y_lm(-x) = (-1)^l Y_lm(x) first multiplies the coefficients by (-1)^l.
    The rotation itself, (D(R) g)_lm = sum_m' e^{-i m alpha} d^l_{m m'}(beta) e^{-i m' gamma} g_lm',
    with g_{l,-m'} = (-1)^m' conj(g_lm') for a real field, becomes with h_m' = e^{-i m' gamma} g_lm'

        Re b_lm = sum_{m'>=0} A+_{l m' m} Re h_m',   Im b_lm = sum_{m'>=0} A-_{l m' m} Im h_m',
        A+-_{l m' m} = d^l_{m m'} +- [m' > 0] (-1)^m' d^l_{m,-m'},

    then b_lm e^{-i m alpha}.  Tables: two real (lmax+1)^3 arrays (34 MiB at lmax 128 in float64),
    one batched matmul over l per application.
    """

    def __init__(self, Q: np.ndarray, lmax: int, device, dtype):
        sign = round(float(np.linalg.det(Q)))
        alpha, beta, gamma = zyz_euler_angles(sign * Q)
        nmode = lmax + 1
        order = np.arange(nmode)
        plus, minus = np.zeros((2, nmode, nmode, nmode))  # [l, m', m]
        for l in range(nmode):
            d = wigner_d(l, beta)[l:]  # rows m = 0..l, columns m' = -l..l
            mirrored = np.zeros_like(d)
            mirrored[:, l + 1:] = d[:, :l][:, ::-1] * (-1.0) ** order[1:l + 1]  # (-1)^m' d_{m,-m'}
            plus[l, : l + 1, : l + 1] = (d[:, l:] + mirrored[:, l:]).T
            minus[l, : l + 1, : l + 1] = (d[:, l:] - mirrored[:, l:]).T
        complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        parity = (-1.0) ** np.arange(nmode) if sign < 0 else np.ones(nmode)
        self._plus = torch.as_tensor(plus, dtype=dtype, device=device)
        self._minus = torch.as_tensor(minus, dtype=dtype, device=device)
        self._before = torch.as_tensor(np.exp(-1j * order[:, None] * gamma) * parity[None, :], dtype=complex_dtype,
                                       device=device)  # [m', l]
        self._after = torch.as_tensor(np.exp(-1j * order * alpha)[:, None], dtype=complex_dtype, device=device)

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        """(..., M, L) -> (..., M, L)."""
        h = (c * self._before).transpose(-1, -2)  # (..., l, m')
        batch = h.shape[:-2]
        h = h.reshape(-1, *h.shape[-2:]).transpose(0, 1)  # (l, B, m')
        real = torch.matmul(h.real.contiguous(), self._plus)
        imaginary = torch.matmul(h.imag.contiguous(), self._minus)
        nmode = self._after.shape[0]
        b = torch.complex(real, imaginary).transpose(0, 1).reshape(*batch, nmode, nmode)  # (..., l, m)
        return b.transpose(-1, -2) * self._after


class CircleRotation:
    """Fourier coefficients of g(Q^T x) from those of g, Q orthogonal (2 x 2), x = (cos t, sin t).

    Rotation Q by angle a: g(t - a), c_k -> c_k e^{-i k a}.  Reflection Q = [[cos a, sin a], [sin a, -cos a]]
    (= Q^T): g(a - t), c_k -> conj(c_k) e^{-i k a}.
    """

    def __init__(self, Q: np.ndarray, kmax: int, device, dtype):
        self.reflect = np.linalg.det(Q) < 0
        angle = math.atan2(Q[1, 0], Q[0, 0])
        complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        self._phase = torch.as_tensor(np.exp(-1j * np.arange(kmax + 1) * angle), dtype=complex_dtype, device=device)

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        return (c.conj() if self.reflect else c) * self._phase


def grid_points(basis) -> np.ndarray:
    """The grid's unit vectors (N, d) in float64 whatever the run's dtype: theta_j = 2 pi j / n on S^1;
    Gauss nodes cos(theta_j) (north to south) and phi_k = 2 pi k / nlon on S^2."""
    if basis.dim == 2:
        theta = 2 * np.pi * np.arange(basis.grid_shape[0]) / basis.grid_shape[0]
        return np.stack([np.cos(theta), np.sin(theta)], axis=1)
    nlat, nlon = basis.grid_shape
    z = gauss_legendre(nlat)[0][:, None]
    phi = 2 * np.pi * np.arange(nlon)[None, :] / nlon
    s = np.sqrt((1 - z) * (1 + z))
    return np.stack(np.broadcast_arrays(s * np.cos(phi), s * np.sin(phi), z), axis=-1).reshape(-1, 3)


def grid_permutation(basis, Q: np.ndarray) -> torch.Tensor | None:
    """Index p (N,) with x_{p(j)} = Q^T x_j for every point of a Gauss grid, or None if Q^T does not map
    the grid onto itself (it does for every sign flip of the coordinates: phi -> pi - phi, -phi, and
    theta -> pi - theta, the Gauss nodes being symmetric)."""
    if basis.dim != 3:
        return None
    points = grid_points(basis)
    target = points @ Q  # rows (Q^T x_j)^T
    nlat, nlon = basis.grid_shape
    cos_theta = points[::nlon, 2]
    lat = np.abs(target[:, 2:3] - cos_theta[None, :]).argmin(1)
    lon = np.round(np.arctan2(target[:, 1], target[:, 0]) * nlon / (2 * np.pi)).astype(np.int64) % nlon
    index = lat * nlon + lon
    if np.abs(points[index] - target).max() > 1e-12:
        return None
    return torch.as_tensor(index, device=basis.points.device)


# --- Chebyshev interpolation in r = |C^T x| ---------------------------------------------------------


def barycentric_weights(nodes: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Lagrange basis ell_k(r) (len(r), n) on Chebyshev points of the first kind, barycentric form
    ell_k(r) = (w_k / (r - r_k)) / sum_i w_i / (r - r_i), w_k = (-1)^k sin((2k+1) pi / 2n)."""
    n = len(nodes)
    w = (-1.0) ** np.arange(n) * np.sin((2 * np.arange(n) + 1) * np.pi / (2 * n))
    difference = r[:, None] - nodes[None, :]
    exact = difference == 0
    terms = w / np.where(exact, 1.0, difference)
    ell = terms / terms.sum(1, keepdims=True)
    hit = exact.any(1)
    ell[hit] = exact[hit].astype(np.float64)
    return ell


def chebyshev_points(n: int, low: float, high: float) -> np.ndarray:
    """r_k = (low + high)/2 + (high - low)/2 cos((2k+1) pi / 2n), k = 0..n-1."""
    return 0.5 * (low + high) + 0.5 * (high - low) * np.cos((2 * np.arange(n) + 1) * np.pi / (2 * n))


def chebyshev_nodes(dim: int, beta: float, low: float, high: float, lmax: int, tol: float,
                    max_nodes: int = MAX_CHEBYSHEV_NODES) -> np.ndarray | None:
    """Fewest Chebyshev nodes on [low, high] interpolating every mu_l(beta r), l <= lmax, to tol mu_0(beta r).

    Checked on 400 points of [low, high]; None when max_nodes do not suffice.
    """
    degree = np.arange(lmax + 1)
    r = np.linspace(low, high, 400)
    exact = funk_hecke(dim, beta * r[:, None], degree)
    for n in range(1, max_nodes + 1):
        nodes = chebyshev_points(n, low, high)
        interpolated = barycentric_weights(nodes, r) @ funk_hecke(dim, beta * nodes[:, None], degree)
        if np.all(np.abs(interpolated - exact) <= tol * exact[:, :1]):
            return nodes
    return None


# --- scattered evaluation of band-limited fields ---------------------------------------------------


def _polar_angles(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Colatitude in [0, pi] and longitude in [0, 2 pi) of unit vectors (n, 3)."""
    theta = np.arctan2(np.hypot(points[:, 0], points[:, 1]), points[:, 2])
    return theta, np.mod(np.arctan2(points[:, 1], points[:, 0]), 2 * np.pi)


class CircleEvaluator:
    """f(t_i) = (1/sqrt(2 pi)) [c_0 + 2 Re sum_{k>0} c_k e^{i k t_i}] at scattered angles: one matmul with the
    precomputed (N, kmax+1) matrix of multiplicity_k e^{i k t_i} / sqrt(2 pi)."""

    def __init__(self, kmax: int, points: np.ndarray, device, dtype):
        angle = np.arctan2(points[:, 1], points[:, 0])
        k = np.arange(kmax + 1)
        waves = np.exp(1j * angle[:, None] * k) * np.where(k == 0, 1.0, 2.0) / math.sqrt(2 * math.pi)
        complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
        self._waves = torch.as_tensor(waves, dtype=complex_dtype, device=device)

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        """(F, kmax+1) coefficients -> (N, F) values."""
        return (self._waves @ c.T).real

    def cost(self, count: int) -> float:
        return 8.0 * self._waves.numel() * count


class DuccEvaluator:
    """Spherical-harmonic series at scattered points by ducc0.sht.synthesis_general (CPU): per field an
    SHT onto an auxiliary equiangular grid and a type-2 non-uniform FFT, O(L^2 log L + N), to accuracy
    `eps` relative to the field's coefficients.  ducc0 stores a_lm (m >= 0, l >= m) m-major, the order of
    our [m, l] array with l < m dropped, with the same orthonormal, Condon-Shortley Y_lm.  Differentiable:
    the transpose is ducc0's adjoint_synthesis_general times the multiplicity (1 at m = 0, 2 above; see
    bases.py on transposes)."""

    def __init__(self, lmax: int, points: np.ndarray, eps: float, dtype):
        import ducc0

        self._synthesis, self._adjoint_synthesis = ducc0.sht.synthesis_general, ducc0.sht.adjoint_synthesis_general
        self.lmax = lmax
        theta, phi = _polar_angles(points)
        self._location = np.ascontiguousarray(np.stack([theta, phi], axis=1))
        self._eps = max(eps, 3e-13 if dtype == torch.float64 else 2e-6)
        order = np.arange(lmax + 1)
        self._mask = torch.as_tensor(order[None, :] >= order[:, None])
        self._points = len(points)

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        """(F, M, L) coefficients (CPU) -> (N, F) values."""
        return _DuccSynthesis.apply(c, self)

    def values(self, c: torch.Tensor) -> torch.Tensor:
        packed = c.detach()[:, self._mask].numpy()
        threads = torch.get_num_threads()
        values = [self._synthesis(alm=row[None, :], spin=0, lmax=self.lmax, loc=self._location, epsilon=self._eps,
                                  nthreads=threads)[0] for row in packed]
        return torch.from_numpy(np.stack(values, axis=1))

    def transpose(self, g: torch.Tensor) -> torch.Tensor:
        """The transpose of `values`: (N, F) real -> (F, M, L) complex cotangents."""
        threads = torch.get_num_threads()
        out = torch.zeros((g.shape[1],) + tuple(self._mask.shape), dtype=torch.complex128 if g.dtype == torch.float64
                          else torch.complex64)
        multiplicity = torch.where(torch.arange(self.lmax + 1) == 0, 1.0, 2.0)[:, None].expand_as(self._mask)
        for f, column in enumerate(g.detach().T.contiguous().numpy()):
            alm = self._adjoint_synthesis(map=column[None, :], spin=0, lmax=self.lmax, loc=self._location,
                                          epsilon=self._eps, nthreads=threads)[0]
            out[f][self._mask] = torch.from_numpy(alm).to(out.dtype) * multiplicity[self._mask]
        return out

    def cost(self, count: int) -> float:
        """Flops of `count` fields, including ~5e5 flops-worth of fixed overhead per ducc0 call."""
        L = self.lmax + 1
        return count * (5e5 + 8.0 * L ** 3 + 40.0 * L * L * math.log2(4 * L) + 2.0 * 14 ** 2 * self._points)


def es_kernel(t: np.ndarray, half_width: float, shape: float) -> np.ndarray:
    """'Exponential of semicircle' psi(t) = exp(shape (sqrt(1 - (t / half_width)^2) - 1)), 0 for |t| >= half_width."""
    z = np.clip(1.0 - (t / half_width) ** 2, 0.0, None)
    return np.where(np.abs(t) < half_width, np.exp(shape * (np.sqrt(z) - 1.0)), 0.0)


class TorusNUFFT:
    """Spherical-harmonic series at scattered points, on any device: a type-2 non-uniform FFT on the torus.

    Double Fourier sphere: G(theta, phi) = sum_lm a_lm Y_lm(x(theta, phi)) with
    x = (sin theta cos phi, sin theta sin phi, cos theta) for theta in [0, 2 pi) is a trigonometric
    polynomial of degree lmax in theta and in phi (Y_lm is a polynomial in x), and
    G(2 pi - theta, phi) = G(theta, phi + pi).  Per order m, g_m(theta) = sum_l a_lm Pbar_lm(cos theta)
    is synthesised (packed Legendre tables) on the n = 2 (lmax + 1) colatitudes 2 pi j / n in [0, pi]
    and continued by g_m(2 pi - theta) = (-1)^m g_m(theta); an FFT gives its coefficients g_km.
    With the kernel psi (`es_kernel`, half-width w h / 2 on the grid h = 2 pi / (2 n) oversampled
    twice) and its Fourier transform psi^(k),

        G(theta, phi) = h^2 sum_ab U_ab psi(theta - a h) psi(phi - b h) + O(eps),
        U_ab = sum_km g_km / (psi^(k) psi^(m)) e^{i (k a h + m b h)}   (an inverse FFT),

    and the w x w stencil weights of every target are a sparse matrix built once, so each call is
    Legendre sums, FFTs of size (2n)^2 and one sparse-times-dense product.  Width w = 2 + ceil(log10(1/eps)),
    shape 2.30 w (error ~ 10^-(w-1) at oversampling 2).  Only the rows a h in [0 - w h, pi + w h]
    that targets (theta in [0, pi]) touch are formed.
    """

    def __init__(self, lmax: int, points: np.ndarray, eps: float, device, dtype):
        self.lmax = lmax
        self.n = 2 * (lmax + 1)
        self.fine = 2 * self.n
        width = int(min(16, max(4, 2 + math.ceil(-math.log10(eps)))))
        self.width = width
        h = 2 * math.pi / self.fine
        half_width, shape = width * h / 2, 2.30 * width
        colatitude = 2 * np.pi * np.arange(self.n // 2 + 1) / self.n
        nodes = np.cos(colatitude)
        nodes = 0.5 * (nodes - nodes[::-1])  # exactly antisymmetric about the equator
        self._legendre = PackedLegendre(lmax, len(nodes), device)
        self._P = self._legendre.pack(legendre_tables(lmax, nodes)[0], dtype, device)
        # psi^(k) = 2 int_0^{half_width} psi(t) cos(k t) dt by Gauss-Legendre.
        x, w = np.polynomial.legendre.leggauss(200)
        t = half_width * (x + 1) / 2
        k = np.arange(-lmax, lmax + 1)
        transform = half_width * (w * es_kernel(t, half_width, shape)) @ np.cos(np.outer(t, k))
        wavenumber = np.fft.fftfreq(self.n, 1.0 / self.n).astype(np.int64)  # FFT order of k in theta
        inside = np.abs(wavenumber) <= lmax
        deconvolve_theta = np.where(inside, 1.0 / transform[np.clip(wavenumber + lmax, 0, 2 * lmax)], 0.0)
        deconvolve_m = 1.0 / transform[lmax:]  # m = 0..lmax
        self._deconvolve = torch.as_tensor(deconvolve_m[:, None] * deconvolve_theta[None, :], dtype=dtype,
                                           device=device)  # [m, k]
        self._parity = torch.as_tensor((-1.0) ** np.arange(lmax + 1), dtype=dtype, device=device)[:, None]
        self._inside = torch.as_tensor(np.nonzero(inside)[0], device=device)
        self._spread = torch.as_tensor(np.mod(wavenumber[inside], self.fine), device=device)
        # Stencils: rows a in [first, last] of the oversampled grid; column b wraps around in phi.
        theta, phi = _polar_angles(points)
        first = math.ceil(-width / 2)
        a0 = np.ceil(theta / h - width / 2).astype(np.int64)
        b0 = np.ceil(phi / h - width / 2).astype(np.int64)
        offsets = np.arange(width)
        rows_theta, rows_phi = a0[:, None] + offsets, b0[:, None] + offsets  # (N, w)
        weight_theta = h * es_kernel(theta[:, None] - h * rows_theta, half_width, shape)
        weight_phi = h * es_kernel(phi[:, None] - h * rows_phi, half_width, shape)
        self.rows = int(rows_theta.max()) - first + 1
        self._row_index = torch.as_tensor(np.mod(np.arange(first, first + self.rows), self.fine), device=device)
        columns = ((rows_theta - first)[:, :, None] * self.fine + np.mod(rows_phi, self.fine)[:, None, :])
        values = weight_theta[:, :, None] * weight_phi[:, None, :]
        count = len(points)
        index = torch.int32 if columns.size < 2 ** 31 else torch.int64
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
            self._stencil = torch.sparse_csr_tensor(
                torch.arange(0, count * width * width + 1, width * width, device=device, dtype=index),
                torch.as_tensor(columns.reshape(-1), device=device, dtype=index),
                torch.as_tensor(values.reshape(-1), dtype=dtype, device=device),
                size=(count, self.rows * self.fine), check_invariants=False)
        self._points = count

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        """(F, M, L) complex coefficients -> (N, F) real values at the targets."""
        count, nmode = c.shape[0], self.lmax + 1
        rows = torch.view_as_real(c).permute(3, 0, 1, 2).reshape(2 * count, nmode, nmode)  # real parts, then imaginary
        half = self._legendre.synthesis(rows, self._P, odd=False)  # (2F, M, n/2 + 1): theta in [0, pi]
        g = torch.complex(half[:count], half[count:])
        g = torch.cat((g, self._parity * g[..., 1:-1].flip(-1)), dim=-1)  # theta in [0, 2 pi): (F, M, n)
        spectrum = torch.fft.fft(g, dim=-1, norm="forward") * self._deconvolve  # [f, m, k]
        padded = g.new_zeros(count, nmode, self.fine)
        padded[..., self._spread] = spectrum[..., self._inside]
        rings = torch.fft.ifft(padded, dim=-1, norm="forward")[..., self._row_index]  # (F, M, rows)
        grid = torch.fft.irfft(rings.transpose(-1, -2), n=self.fine, dim=-1, norm="forward")  # (F, rows, fine)
        return self._stencil @ grid.reshape(count, -1).T.contiguous()

    def cost(self, count: int) -> float:
        L = self.lmax + 1
        fft = 5.0 * self.fine * self.rows * math.log2(self.fine) * 2
        return count * (L * L * self.n + fft + 2.0 * self.width ** 2 * self._points)


# --- the spectral transform ------------------------------------------------------------------------


class SpectralExpKernel:
    """T_C on a basis grid by Funk-Hecke (module docstring): exact for channels of degree <= lmax + 1.

    Both the Chebyshev interpolation (general C) and the scattered evaluation are made accurate to
    tol / 100 relative to mu_0 (not below ten units of round-off of the dtype): the attention mean
    N / Z divides by Z, which is smaller than the sum of the magnitudes of its terms by up to the
    density contrast, and this margin keeps N / Z within about tol of the dense quadrature for
    smooth densities.  `evaluator` is "auto" (ducc0 on the CPU when installed, else the torch
    NUFFT), "ducc" or "torch".  Raises CaseError when no node count up to MAX_CHEBYSHEV_NODES
    reaches tol.  Setup: Chebyshev node search, Wigner tables or NUFFT stencils, O(lmax^3) to
    O(lmax^4) once; each call is free of host synchronisation and of Python loops over modes
    (the ducc0 evaluator, CPU only, loops over the n (d + 1) fields).
    """

    name = "spectral"

    def __init__(self, basis, C: torch.Tensor, beta: float, tol: float, evaluator: str = "auto"):
        placement = basis.placement
        device, dtype = placement.device, placement.real
        self.grid_shape = basis.grid_shape
        self.transform = DegreeRaisedTransform(basis)
        degree = self.transform.degree
        matrix = C.detach().cpu().double().numpy()
        factor = orthogonal_factor(matrix)
        if beta == 0:
            factor = (0.0, np.eye(basis.dim))
        points = grid_points(basis)
        self.rotation = self.permutation = self.evaluator = None
        if factor is not None:
            s, Q = factor
            weights = funk_hecke(basis.dim, beta * s, degree)
            self._weights = torch.as_tensor(weights, dtype=dtype, device=device)
            self._log_scale = torch.full(self.grid_shape, beta * s, dtype=dtype, device=device)
            self.nodes = np.array([s])
            if not np.array_equal(Q, np.eye(basis.dim)):
                self.permutation = grid_permutation(basis, Q)
                if self.permutation is None:
                    rotation = CircleRotation if basis.dim == 2 else SphereRotation
                    self.rotation = rotation(Q, self.transform.lmax, device, dtype)
            return
        u = points @ matrix
        r = np.linalg.norm(u, axis=1)
        low, high = float(r.min()), float(r.max())
        accuracy = max(tol / 100, 10 * torch.finfo(dtype).eps)
        self.nodes = chebyshev_nodes(basis.dim, beta, low, high, self.transform.lmax, accuracy)
        if self.nodes is None:
            raise CaseError(f"solver.field: the spectral field needs more than {MAX_CHEBYSHEV_NODES} Chebyshev nodes "
                            f"for model.beta = {beta:g} at solver.kernel_tol = {tol:g}; use solver.field = 'dense'")
        kappa = beta * self.nodes.reshape(-1, *[1] * degree.ndim)
        self._weights = torch.as_tensor(funk_hecke(basis.dim, kappa, degree), dtype=dtype, device=device)  # (n, *coeff)
        self._ell = torch.as_tensor(barycentric_weights(self.nodes, r), dtype=dtype, device=device)  # (N, n)
        self._log_scale = torch.as_tensor(beta * r, dtype=dtype, device=device).reshape(self.grid_shape)
        direction = np.where(r[:, None] > 0, u / np.where(r > 0, r, 1.0)[:, None], np.eye(basis.dim)[-1])
        if basis.dim == 2:
            self.evaluator = CircleEvaluator(self.transform.lmax, direction, device, dtype)
        elif evaluator == "ducc" or (evaluator == "auto" and device.type == "cpu" and _has_ducc0()):
            self.evaluator = DuccEvaluator(self.transform.lmax, direction, accuracy, dtype)
        else:
            self.evaluator = TorusNUFFT(self.transform.lmax, direction, accuracy, device, dtype)

    def __call__(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """f: (*grid, c) grid values -> (scaled (*grid, c), log_scale (*grid))."""
        scaled, log_scale = self.fields(torch.movedim(f, -1, 0))
        return torch.movedim(scaled, 0, -1), log_scale

    def fields(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The transform of fields given first: f (F, *grid) -> (scaled (F, *grid), log_scale (*grid))."""
        count = f.shape[0]
        coefficients = self.transform.analysis(f)  # (F, *coeff)
        if self.evaluator is None:
            coefficients = coefficients * self._weights
            if self.rotation is not None:
                coefficients = self.rotation(coefficients)
            values = self.transform.synthesis(coefficients).reshape(count, -1)
            if self.permutation is not None:
                values = values[:, self.permutation]
            return values.reshape(f.shape), self._log_scale
        nodes = len(self.nodes)
        per_node = (self._weights[:, None] * coefficients[None]).reshape(nodes * count, *coefficients.shape[1:])
        values = self.evaluator(per_node).reshape(-1, nodes, count)  # (N, n, F)
        scaled = torch.einsum("pk,pkc->cp", self._ell, values.to(self._ell.device))
        return scaled.reshape(f.shape), self._log_scale

    def cost(self, channels: int) -> float:
        """Floating-point operations of one call (estimate): transforms, rotation, scattered evaluation."""
        cost = channels * self.transform.cost()
        if self.rotation is not None:
            cost += 4.0 * channels * (self.transform.lmax + 1) ** 3
        if self.evaluator is not None:
            cost += self.evaluator.cost(len(self.nodes) * channels)
        return cost


class _DuccSynthesis(torch.autograd.Function):
    """DuccEvaluator's series at the points, with its transpose as the backward pass."""

    @staticmethod
    def forward(ctx, c, evaluator):
        ctx.evaluator = evaluator
        return evaluator.values(c)

    @staticmethod
    def backward(ctx, g):
        return ctx.evaluator.transpose(g), None


def _has_ducc0() -> bool:
    try:
        import ducc0  # noqa: F401
    except ImportError:
        return False
    return True


class DegreeRaisedTransform:
    """Analysis and synthesis of degree lmax + 1 on the basis grid (the degree of y rho), same backend."""

    def __init__(self, basis):
        placement = basis.placement
        if basis.dim == 2:
            self.lmax = min(basis.lmax + 1, (basis.fourier.n - 1) // 2)
            self._transform = FourierTransform(self.lmax, basis.fourier.n, placement.device, placement.real)
            self.degree = np.arange(self.lmax + 1)
            self._points = basis.fourier.n
        else:
            nlat, nlon = basis.grid_shape
            self.lmax = min(basis.lmax + 1, nlat - 1, (nlon - 1) // 2)
            scalar_only = {"vector": False} if isinstance(basis.sht, TorchSHT) else {}
            self._transform = type(basis.sht)(self.lmax, nlat, nlon, placement.device, placement.real, **scalar_only)
            self.degree = np.broadcast_to(np.arange(self.lmax + 1), (self.lmax + 1, self.lmax + 1))
            self._points = nlat * nlon
        self._dim = basis.dim

    @property
    def table_bytes(self) -> int:
        """Memory of the stored Legendre tables (0 for shtns and on S^1)."""
        return getattr(self._transform, "table_bytes", 0)

    def analysis(self, f: torch.Tensor) -> torch.Tensor:
        return self._transform.analysis(f)

    def synthesis(self, c: torch.Tensor) -> torch.Tensor:
        return self._transform.synthesis(c)

    def cost(self) -> float:
        """Flops of one analysis plus one synthesis of a field."""
        L = self.lmax + 1
        fft = 10.0 * self._points * math.log2(self._points)
        return fft if self._dim == 2 else fft + 2.0 * L * L * math.sqrt(self._points / 2)


# --- selection -------------------------------------------------------------------------------------


def make_exp_kernel(basis, C: torch.Tensor, beta: float, field: str, tol: float, chunk: int | str = "auto"):
    """The exponential-kernel transform for solver.field = "dense" | "spectral" | "auto".

    "auto" takes the spectral transform when it reaches tol (a general C may need too many
    Chebyshev nodes) and its estimated cost per call (`cost`, flops for the d + 1 channels
    rho, y rho) is below the dense quadrature's; else the dense one.  At beta = inf the model
    never calls the transform (m = B^T x / |B^T x|) and the dense one stands in.
    """
    if math.isinf(beta):
        return DenseExpKernel(basis, C, beta, chunk)
    if field == "dense":
        return DenseExpKernel(basis, C, beta, chunk, DENSE_MATRIX_BYTES)
    if field == "spectral":
        return SpectralExpKernel(basis, C, beta, tol)
    dense = DenseExpKernel(basis, C, beta, chunk, DENSE_MATRIX_BYTES)
    try:
        spectral = SpectralExpKernel(basis, C, beta, tol)
    except CaseError:
        return dense
    channels = basis.dim + 1
    return spectral if spectral.cost(channels) < dense.cost(channels) else dense


class MemberKernels:
    """The exponential-kernel transforms of a batch of members on one basis grid (solver.field for each member's
    C = B_m and beta_m): one transform per distinct (B, beta), members sharing it transformed in one call.

    Called like a transform, with a member axis and the grid flattened: f (M, P, c) -> (scaled (M, P, c),
    log_scale (M, P)).  `member(m)` is member m's own transform (grid-shaped calls, as `make_exp_kernel`'s).
    """

    def __init__(self, basis, B: torch.Tensor, beta, field: str, tol: float, chunk: int | str = "auto"):
        self.grid_shape, self.device = basis.grid_shape, B.device
        self.kernels, self._of_member, groups = [], [], {}
        for m, (C, b) in enumerate(zip(B, beta)):
            key = (float(b), C.detach().cpu().double().numpy().tobytes())
            if key not in groups:
                groups[key] = len(self.kernels)
                self.kernels.append(make_exp_kernel(basis, C, float(b), field, tol, chunk))
            self._of_member.append(groups[key])
        self._group()

    def _group(self) -> None:
        """(kernel, member indices) of every transform some member uses."""
        self._groups = [(kernel, torch.as_tensor([m for m, k in enumerate(self._of_member) if k == g],
                                                 device=self.device))
                        for g, kernel in enumerate(self.kernels) if g in self._of_member]

    def select(self, members: list) -> "MemberKernels":
        """The transforms of the members at the indices `members` (a list), in that order."""
        chosen = copy.copy(self)
        chosen._of_member = [self._of_member[m] for m in members]
        chosen._group()
        return chosen

    @property
    def name(self) -> str:
        """The transforms' `name` ("dense" or "spectral"), or "mixed"."""
        names = {kernel.name for kernel in self.kernels}
        return names.pop() if len(names) == 1 else "mixed"

    def member(self, m: int):
        return self.kernels[self._of_member[m]]

    def __call__(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Channels last: f (M, P, c) -> (scaled (M, P, c), log_scale (M, P))."""
        scaled, log_scale = self.fields(f.transpose(1, 2))
        return scaled.transpose(1, 2), log_scale

    def fields(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Channels first: f (M, c, P) -> (scaled (M, c, P), log_scale (M, P)); the members' fields go through
        their transform together, as one batch of M c fields."""
        if len(self._groups) == 1:
            return _members_through(self._groups[0][0], f, self.grid_shape)
        scaled, log_scale = torch.empty_like(f), f.new_empty((f.shape[0], f.shape[2]))
        for kernel, members in self._groups:
            part, part_scale = _members_through(kernel, f.index_select(0, members), self.grid_shape)
            scaled.index_copy_(0, members, part)
            log_scale.index_copy_(0, members, part_scale)
        return scaled, log_scale


def _members_through(kernel, f: torch.Tensor, grid_shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """One transform applied to the fields of every member at once: (M, c, P), the member axis riding along with
    the channels."""
    members, channels, points = f.shape
    scaled, log_scale = kernel.fields(f.reshape((members * channels,) + tuple(grid_shape)))
    return scaled.reshape(members, channels, points), log_scale.reshape(1, points).expand(members, points)
