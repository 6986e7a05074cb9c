"""Band-limited fields at scattered points, and Chebyshev interpolation in a radius r.

A series F = sum_lm F_lm Y_lm of degree lmax is evaluated at scattered unit vectors u_hat: ducc0's
synthesis_general on the CPU (an SHT onto an auxiliary grid, then a non-uniform FFT, O(L^2 log L + N) per
field, `DuccEvaluator`), a type-2 non-uniform FFT in PyTorch elsewhere (`TorusNUFFT`), direct sums on S^1
(`CircleEvaluator`); `make_evaluator` picks one.  A function of r on [low, high] is interpolated on n
Chebyshev points r_k of the first kind, g(r) ~ sum_k ell_k(r) g(r_k) (`barycentric_weights`).  The
coefficients come from `DegreeRaisedTransform`, the analysis and synthesis of degree lmax + 1 on a basis grid.
"""

import math
import warnings

import numpy as np
import torch

from spherepde.base.real_view import COMPLEX_DTYPE
from spherepde.discretisation.transforms.legendre import legendre_values
from spherepde.discretisation.transforms.legendre_layouts import PackedLegendre


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


def _polar_angles(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Colatitude in [0, pi] and longitude in [0, 2 pi) of unit vectors (n, 3)."""
    theta = np.arctan2(np.hypot(points[:, 0], points[:, 1]), points[:, 2])
    return theta, np.mod(np.arctan2(points[:, 1], points[:, 0]), 2 * np.pi)


def stored_coefficients(dim: int, lmax: int) -> np.ndarray:
    """Which entries of a coefficient array of degree lmax hold coefficients: all (lmax + 1,) on S^1, l >= m of
    the [m, l] array on S^2."""
    if dim == 2:
        return np.ones(lmax + 1, dtype=bool)
    order = np.arange(lmax + 1)
    return order[None, :] >= order[:, None]


def harmonics_at(dim: int, lmax: int, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(H (N, K) complex, degree (K,)): the basis functions of the stored coefficients (`stored_coefficients`, in
    their row-major order) at the unit vectors `points` (N, dim), times their multiplicity (1 at order 0, 2
    above), so that a real series of coefficients c is Re(H c) at the points: e^{i k t} / sqrt(2 pi) on S^1, the
    orthonormal Condon-Shortley Pbar_lm(cos theta) e^{i m phi} on S^2 (legendre_values, (lmax + 1)^2 N numbers:
    the caller takes the points in chunks)."""
    if dim == 2:
        k = np.arange(lmax + 1)
        angle = np.arctan2(points[:, 1], points[:, 0])
        return np.exp(1j * angle[:, None] * k) * np.where(k == 0, 1.0, 2.0) / math.sqrt(2 * math.pi), k
    order, degree = np.nonzero(stored_coefficients(dim, lmax))
    theta, phi = _polar_angles(points)
    legendre = legendre_values(lmax, np.cos(theta))[order, degree].T  # (N, K)
    return legendre * np.exp(1j * phi[:, None] * order) * np.where(order == 0, 1.0, 2.0), degree


# Bytes an entry of CircleEvaluator's table takes while it is built: two complex128 arrays of its size at once
# (the exponentials and their product with the multiplicities; the complex64 table of a float32 run is made from the
# second after the first is freed).  At lmax 4096 (12500 points, 4098 waves) 1.6 GB, the table itself 820 MB.
CIRCLE_TABLE_ENTRY_BYTES = 32


class CircleEvaluator:
    """f(t_i) = (1/sqrt(2 pi)) [c_0 + 2 Re sum_{k>0} c_k e^{i k t_i}] at scattered angles: one matmul with the
    (N, kmax+1) matrix of multiplicity_k e^{i k t_i} / sqrt(2 pi), computed at the first call: at fine grids it takes
    GBs (`build_bytes`), and solver.field = "auto" compares `cost` without it."""

    def __init__(self, kmax: int, points: np.ndarray, device, dtype):
        self._kmax, self._points = kmax, points
        self._device, self._complex_dtype = device, COMPLEX_DTYPE[dtype]
        self._waves = None

    @staticmethod
    def build_bytes(kmax: int, count: int) -> int:
        """The memory that building the table for `count` points takes (CIRCLE_TABLE_ENTRY_BYTES an entry)."""
        return CIRCLE_TABLE_ENTRY_BYTES * count * (kmax + 1)

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        """(F, kmax+1) coefficients -> (N, F) values."""
        if self._waves is None:
            waves = harmonics_at(2, self._kmax, self._points)[0]
            self._waves = torch.as_tensor(waves, dtype=self._complex_dtype, device=self._device)
        return (self._waves @ c.T).real

    def cost(self, count: int) -> float:
        return 8.0 * len(self._points) * (self._kmax + 1) * count


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
        self._mask = torch.as_tensor(stored_coefficients(3, lmax))
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
        out = torch.zeros((g.shape[1],) + tuple(self._mask.shape), dtype=COMPLEX_DTYPE[g.dtype])
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
        self._P = self._legendre.pack(legendre_values(lmax, nodes), dtype, device)
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


def make_evaluator(dim: int, lmax: int, points: np.ndarray, eps: float, device, dtype, choice: str = "auto"):
    """The evaluator of series of degree lmax at the unit vectors `points` (N, dim), accurate to `eps`: direct sums
    on S^1; on S^2 `choice` "ducc" (DuccEvaluator), "torch" (TorusNUFFT) or "auto" (ducc0 on the CPU when
    installed, else the torch NUFFT)."""
    if dim == 2:
        return CircleEvaluator(lmax, points, device, dtype)
    if choice == "ducc" or (choice == "auto" and device.type == "cpu" and _has_ducc0()):
        return DuccEvaluator(lmax, points, eps, dtype)
    return TorusNUFFT(lmax, points, eps, device, dtype)

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


# Largest operator of DegreeRaisedTransform.degree_filter (one nlat x nlat matrix per order: 0.7 MiB at lmax 32).
DEGREE_FILTER_BYTES = 16 * 2 ** 20


class DegreeRaisedTransform:
    """Analysis and synthesis of degree lmax + 1 on the basis grid (the degree of y rho), same backend."""

    def __init__(self, basis):
        if basis.dim == 2:
            self.lmax = min(basis.lmax + 1, (basis.fourier.n - 1) // 2)
            self._transform = basis.scalar_transform(self.lmax)
            self.degree = np.arange(self.lmax + 1)
            self._points = basis.fourier.n
        else:
            nlat, nlon = basis.grid_shape
            self.lmax = min(basis.lmax + 1, nlat - 1, (nlon - 1) // 2)
            self._transform = basis.scalar_transform(self.lmax)
            self.degree = np.broadcast_to(np.arange(self.lmax + 1), (self.lmax + 1, self.lmax + 1))
            self._points = nlat * nlon
        self._dim, self._density_lmax = basis.dim, basis.lmax

    @property
    def table_bytes(self) -> int:
        """Memory of the stored Legendre tables (0 for shtns and on S^1)."""
        return self._transform.table_bytes

    def analysis(self, f: torch.Tensor) -> torch.Tensor:
        return self._transform.analysis(f)

    def synthesis(self, c: torch.Tensor) -> torch.Tensor:
        return self._transform.synthesis(c)

    def degree_filter(self, multiplier: np.ndarray):
        """f -> synthesis(mu_l analysis(f)) (grid (F, *grid) -> (F, *grid)) as one product per order over the
        rings (TorchSHT.degree_filter) where the transform is the torch backend on S^2 and the operator takes at
        most DEGREE_FILTER_BYTES; else None."""
        if not self._filters():
            return None
        transform = self._transform
        operator = transform.degree_filter(multiplier)
        return lambda f: transform.filtered(f, operator)

    def _filters(self) -> bool:
        """Whether `degree_filter` applies: the torch backend on S^2, the operator within DEGREE_FILTER_BYTES."""
        transform = self._transform
        if self._dim != 3 or not hasattr(transform, "degree_filter"):
            return False
        return (self.lmax + 1) * transform.nlat ** 2 * torch.finfo(transform.dtype).bits // 8 <= DEGREE_FILTER_BYTES

    def moment_filter(self, multiplier: np.ndarray, signs: tuple = (1, 1, 1)):
        """(c -> (rho, synthesis(mu_l analysis(rho y)) for y = 1, x_1, x_2, x_3), its transpose, c -> the same
        with N = the last three projected on the frame, its transpose): coefficients (F, *coeff) of the basis's degree
        -> grid (F, 5, *grid) as products per order from the coefficients (TorchSHT.moments, moments_adjoint,
        frame_moments: (F, 4 or 3, *grid), with `radial` <x, N> alone, frame_moments_adjoint; the filtered fields at
        diag(signs) x), where `degree_filter` applies and this transform's degree is the basis's plus one (rho x_k
        exact); else None."""
        if not self._filters() or self.lmax != self._density_lmax + 1:
            return None
        transform = self._transform
        tables = transform.moment_filter(multiplier, signs)
        return (lambda c: transform.moments(c, tables), lambda f: transform.moments_adjoint(f, tables),
                lambda c, normaliser=True, radial=False: transform.frame_moments(c, tables, normaliser, radial),
                lambda f: transform.frame_moments_adjoint(f, tables))

    def cost(self) -> float:
        """Flops of one analysis plus one synthesis of a field."""
        L = self.lmax + 1
        fft = 10.0 * self._points * math.log2(self._points)
        return fft if self._dim == 2 else fft + 2.0 * L * L * math.sqrt(self._points / 2)
