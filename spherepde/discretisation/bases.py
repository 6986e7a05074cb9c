"""Spectral bases on S^1 and S^2: one interface for the grid, the transforms and the operators.

A basis holds the state space of the solver: a density is stored as its spectral
coefficients up to degree `lmax` and evaluated on a grid fine enough that quadratic
products (rho * v) are dealiased by the 3/2 rule.  Tangent vector fields live on the grid
either in ambient Cartesian components (..., *grid, d) (`gradient`, `divergence`) or in the
components along an orthonormal tangent frame e_k(x), k < d - 1 (..., d - 1, *grid)
(`gradient_frame`, `divergence_frame`: what the time stepper uses, one component less).

Shared interface (`CircleBasis`, `SphereBasis`):
    dim            ambient dimension d (2 or 3)
    points         (*grid, d) unit vectors x
    weights        (*grid,) quadrature weights, sum = |S^{d-1}| (2 pi or 4 pi)
    degree         (*coeff,) degree l (S^2) or |k| (S^1) of each coefficient
    laplacian      (*coeff,) eigenvalue of the Laplace-Beltrami operator: -l(l+1) or -k^2
    frame          (d - 1, *grid, d) orthonormal tangent frame: t (S^1); e_theta, e_phi (S^2)
    backend        the transforms' backend: "torch-fft" (S^1), "torch" or "shtns" (S^2)
    float64_points the grid's unit vectors (N, d) in numpy float64, whatever the run's dtype
    scalar_transform(lmax)  analysis and synthesis alone of degree lmax on the same grid, same backend
    analysis / synthesis, gradient (coeffs -> tangent field), divergence (tangent field -> coeffs)
    synthesis_adjoint, divergence_adjoint: their exact transposes (for hand-written adjoints)
    norm_squared   L2(sigma) norm^2 computed from coefficients (Parseval)

Transposes.  Coefficients are complex and a real function of them has the cotangent
b = dL/dRe c + i dL/dIm c (torch's convention), so dL = sum Re(conj(b) dc) over the stored
modes.  With the quadrature analysis a_lm = sum_j w_j f_j conj(Y_lm(x_j)) and the synthesis
f = sum multiplicity Re(c Y) (multiplicity 1 at order 0, 2 for the +-m pairs stored once),

    synthesis^T r = multiplicity * analysis(r / w),
    divergence_frame^T b = -w * gradient_frame(b / multiplicity)   (the weak divergence:
                           (div F)_lm = -sum_j w_j F(x_j) . conj(grad Y_lm(x_j))),

exact in exact arithmetic on both grids (modes outside the triangle, multiplicity 0, get 0).
"""

import functools
import math

import numpy as np
import torch

from spherepde.base.device import Placement
from spherepde.discretisation.transforms.fourier import FourierTransform
from spherepde.discretisation.transforms.legendre import dealiased_gauss_latitudes, gauss_legendre
from spherepde.geometry.ambient import inner

# A spectral tail is a ratio of norms whose top-degree coefficients are rounded at the norm's scale: float32 runs of
# densities whose float64 tails are 1e-15 to 1e-17 read 2e-9 to 8e-8 (0.7 of an epsilon, lmax 16-96, S^1 and S^2).
# Tails are resolved to round-off below this many epsilons of their dtype (9.5e-7 in float32, 1.8e-15 in float64).
TAIL_ROUND_OFF_EPS = 8


class _SpectralBasis:
    """What S^1 and S^2 share once their transforms and frames are defined."""

    dim: int
    lmax: int
    placement: Placement
    points: torch.Tensor
    weights: torch.Tensor
    degree: torch.Tensor
    multiplicity: torch.Tensor  # 1 for the zero order, 2 for the +-m pairs stored once

    @property
    def area(self) -> float:
        return 2 * math.pi if self.dim == 2 else 4 * math.pi

    @property
    def laplacian(self) -> torch.Tensor:
        l = self.degree.to(self.placement.real)
        return -(l * l) if self.dim == 2 else -l * (l + 1)

    @property
    def grid_size(self) -> int:
        return self.weights.numel()

    def norm_squared(self, c: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Parseval: ||f||^2_{L2(sigma)} = sum multiplicity |c|^2, over the modes in `mask`."""
        energy = self.multiplicity * c.abs() ** 2
        if mask is not None:
            energy = energy * mask
        return energy.flatten(-self.multiplicity.dim()).sum(-1)

    def spectral_tail(self, c: torch.Tensor) -> torch.Tensor:
        """Fraction of the L2 norm carried by the top third of the degrees, l > 2 lmax / 3."""
        tail = self.degree > (2 * self.lmax) // 3
        return torch.sqrt(self.norm_squared(c, tail) / self.norm_squared(c))

    def integrate(self, f: torch.Tensor) -> torch.Tensor:
        """Quadrature of a grid function over the sphere (dsigma)."""
        return (f * self.weights).flatten(-self.weights.dim()).sum(-1)

    def gradient(self, c: torch.Tensor) -> torch.Tensor:
        """grad f in ambient components (..., *grid, d) from the coefficients of f."""
        components = self.gradient_frame(c).unbind(-1 - len(self.grid_shape))
        return sum(component[..., None] * e for component, e in zip(components, self.frame))

    def divergence(self, field: torch.Tensor) -> torch.Tensor:
        """Coefficients of div F for a tangent field F in ambient components (..., *grid, d)."""
        return self.divergence_frame(torch.stack([inner(field, e) for e in self.frame], dim=-1 - len(self.grid_shape)))

    def synthesis_adjoint(self, r: torch.Tensor) -> torch.Tensor:
        """The transpose of `synthesis` (module docstring): multiplicity * analysis(r / w)."""
        return self.multiplicity * self.analysis(r / self.weights)

    def divergence_adjoint(self, b: torch.Tensor) -> torch.Tensor:
        """The transpose of `divergence_frame` (module docstring): -w * gradient_frame(b / multiplicity)."""
        return -self.weights * self.gradient_frame(b * self.inverse_multiplicity)

    @functools.cached_property
    def inverse_multiplicity(self) -> torch.Tensor:
        """1 / multiplicity, and 0 outside the triangle (multiplicity 0)."""
        m = self.multiplicity
        return torch.where(m > 0, 1 / torch.where(m > 0, m, 1.0), 0.0)

    def resize(self, c: torch.Tensor, lmax: int) -> torch.Tensor:
        """Coefficients truncated or zero-padded to degree `lmax` (spectral interpolation)."""
        shape = self.coefficient_shape(lmax)
        out = torch.zeros(c.shape[: c.dim() - len(shape)] + shape, dtype=c.dtype, device=c.device)
        common = tuple(slice(0, min(a, b)) for a, b in zip(shape, c.shape[-len(shape):]))
        out[(Ellipsis,) + common] = c[(Ellipsis,) + common]
        return out


def dealiased_circle_points(kmax: int) -> int:
    """Smallest even n >= 3 kmax + 1 (products of two degree-kmax fields alias outside |k| <= kmax)
    whose FFT is fast (``fft_length``)."""
    return fft_length(3 * kmax + 1, 2)


def dealiased_gauss_grid(lmax: int, minimum: int = 0) -> tuple[int, int]:
    """(nlat, nlon) of the dealiased Gauss grid: nlat from ``dealiased_gauss_latitudes``, nlon >= 2 nlat
    with a fast FFT (``fft_length``) and divisible by 4, so that the meridians phi = k pi / 2 are on the
    grid and every sign flip of the coordinates permutes it (discretisation.rotations.grid_permutation)."""
    nlat = dealiased_gauss_latitudes(lmax, minimum)
    return nlat, fft_length(2 * nlat, 4)


def fft_length(minimum: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= `minimum` and has no prime factor above 5.

    FFT libraries (pocketfft in torch, FFTW in shtns) are several times slower on lengths with a
    large prime factor: at lmax 128 the longitudes 2 nlat = 388 = 4 * 97 cost 4.9x the rfft + irfft
    time of 400 in torch on one CPU thread, and 386 = 2 * 193 circle points twice that of 400.
    """
    n = minimum + (-minimum) % multiple
    while not _five_smooth(n):
        n += multiple
    return n


def _five_smooth(n: int) -> bool:
    for prime in (2, 3, 5):
        while n % prime == 0:
            n //= prime
    return n == 1


class CircleBasis(_SpectralBasis):
    """Fourier basis on S^1 (d = 2), points x = (cos theta, sin theta)."""

    dim = 2
    backend = "torch-fft"
    grid_name, grid_dims, measure_units = "uniform", ("theta",), "radian"  # the output's names for this grid

    def __init__(self, lmax: int, placement: Placement, n: int | None = None):
        self.lmax, self.placement = lmax, placement
        n = n or dealiased_circle_points(lmax)
        self.fourier = FourierTransform(lmax, n, placement.device, placement.real)
        theta = self.fourier.theta
        self.theta = theta
        self.points = torch.stack([torch.cos(theta), torch.sin(theta)], dim=-1)
        self.frame = torch.stack([-torch.sin(theta), torch.cos(theta)], dim=-1)[None]  # t = (-sin, cos)
        self.weights = torch.full_like(theta, 2 * math.pi / n)
        self.degree = torch.arange(lmax + 1, device=placement.device)
        self.multiplicity = torch.where(self.degree == 0, 1.0, 2.0).to(placement.real)
        self.grid_shape = (n,)

    @property
    def cell_radius(self) -> float:
        """The largest chordal distance from a node to a point of its cell, the arc of length 2 pi / n centred
        on it (whose length is the node's quadrature weight)."""
        return 2 * math.sin(math.pi / (2 * self.grid_shape[0]))

    @staticmethod
    def coefficient_shape(lmax: int) -> tuple[int, ...]:
        return (lmax + 1,)

    @staticmethod
    def quadrature_degree(lmax: int) -> int:
        """Largest trigonometric degree the dealiased grid for `lmax` integrates exactly."""
        return dealiased_circle_points(lmax) - 1

    def analysis(self, f: torch.Tensor) -> torch.Tensor:
        return self.fourier.analysis(f)

    def synthesis(self, c: torch.Tensor) -> torch.Tensor:
        return self.fourier.synthesis(c)

    def gradient_frame(self, c: torch.Tensor) -> torch.Tensor:
        """grad f = (df/dtheta) t(theta) as its frame component (..., 1, n)."""
        return self.synthesis(self.fourier.derivative(c))[..., None, :]

    def divergence_frame(self, field: torch.Tensor) -> torch.Tensor:
        """Coefficients of div F = d/dtheta F_t for the frame component F_t (..., 1, n) of a tangent field."""
        return self.fourier.derivative(self.analysis(field[..., 0, :]))

    def coordinates(self) -> dict:
        return {"theta": self.theta}

    def float64_points(self) -> np.ndarray:
        """The grid's unit vectors (n, 2) in float64 whatever the run's dtype: theta_j = 2 pi j / n."""
        theta = 2 * np.pi * np.arange(self.grid_shape[0]) / self.grid_shape[0]
        return np.stack([np.cos(theta), np.sin(theta)], axis=1)

    def scalar_transform(self, lmax: int) -> FourierTransform:
        """The Fourier transform of degree `lmax` on this grid."""
        return FourierTransform(lmax, self.fourier.n, self.placement.device, self.placement.real)

    def evaluate(self, c: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        """f(x) at arbitrary points x (n, 2) of the circle from coefficients (kmax+1,): the exact series."""
        theta = torch.atan2(points[:, 1], points[:, 0])
        waves = torch.exp(1j * theta[:, None] * self.fourier.wavenumber)
        return (waves @ (c * self.multiplicity)).real / math.sqrt(2 * math.pi)


class SphereBasis(_SpectralBasis):
    """Spherical harmonics on S^2 (d = 3) on a Gauss-Legendre grid (colatitude theta, longitude phi).

    x = (sin theta cos phi, sin theta sin phi, cos theta); frame e_theta, e_phi.
    `backend` is "torch" (any device, float32/64) or "shtns" (CPU float64 reference).  With `vector` False the
    torch backend makes the scalar transforms alone (analysis, synthesis; gradient and divergence then fail): what
    reading and drawing a stored density needs, in a quarter of the set-up time (0.09 s against 0.36 s of CPU at
    lmax 120).
    """

    dim = 3
    grid_name, grid_dims, measure_units = "gauss-legendre", ("lat", "lon"), "sr"

    def __init__(self, lmax: int, placement: Placement, backend: str = "torch",
                 grid_shape: tuple[int, int] | None = None, vector: bool = True):
        self.lmax, self.placement, self.backend = lmax, placement, backend
        nlat, nlon = grid_shape or dealiased_gauss_grid(lmax, minimum=32 if backend == "shtns" else 0)
        if backend == "shtns":
            from spherepde.discretisation.transforms.sht_shtns import ShtnsSHT

            self.sht = ShtnsSHT(lmax, nlat, nlon)
        else:
            from spherepde.discretisation.transforms.sht_torch import TorchSHT

            self.sht = TorchSHT(lmax, nlat, nlon, placement.device, placement.real, vector=vector)
        theta = self.sht.theta.to(placement.device, placement.real)[:, None]
        phi = self.sht.phi.to(placement.device, placement.real)[None, :]
        st, ct, sp, cp = torch.sin(theta), torch.cos(theta), torch.sin(phi), torch.cos(phi)
        zero = torch.zeros_like(st * sp)
        self.points = torch.stack([st * cp, st * sp, ct.expand_as(st * sp)], dim=-1)
        e_theta = torch.stack([ct * cp, ct * sp, (-st).expand_as(zero)], dim=-1)
        e_phi = torch.stack([-sp.expand_as(zero), cp.expand_as(zero), zero], dim=-1)
        self.frame = torch.stack([e_theta, e_phi])
        weights = self.sht.weights.to(placement.device, placement.real)[:, None] * (2 * math.pi / nlon)
        self.weights = weights.expand(nlat, nlon).contiguous()
        m = torch.arange(lmax + 1, device=placement.device)[:, None]
        l = torch.arange(lmax + 1, device=placement.device)[None, :]
        self.degree = l.expand(lmax + 1, lmax + 1)
        self.multiplicity = (torch.where(m == 0, 1.0, 2.0) * (l >= m)).to(placement.real)
        self.grid_shape = (nlat, nlon)
        # Coordinates for output in float64 whatever the run's dtype: the Gauss latitudes exactly.
        self.latitude = torch.rad2deg(torch.asin(torch.as_tensor(gauss_legendre(nlat)[0])))
        self.longitude = 360.0 * torch.arange(nlon, dtype=torch.float64) / nlon

    @property
    def cell_radius(self) -> float:
        """The largest chordal distance from a node to a point of its cell (`gauss_cell_radius`)."""
        return gauss_cell_radius(*self.grid_shape)

    @staticmethod
    def coefficient_shape(lmax: int) -> tuple[int, ...]:
        return (lmax + 1, lmax + 1)

    @staticmethod
    def quadrature_degree(lmax: int) -> int:
        """Largest degree the dealiased Gauss grid for `lmax` integrates exactly (2 nlat - 1 < nlon)."""
        return 2 * dealiased_gauss_latitudes(lmax) - 1

    def analysis(self, f: torch.Tensor) -> torch.Tensor:
        return self.sht.analysis(f).to(self.placement.device)

    def synthesis(self, c: torch.Tensor) -> torch.Tensor:
        return self.sht.synthesis(c).to(self.placement.device)

    def gradient_frame(self, c: torch.Tensor) -> torch.Tensor:
        """grad f along (e_theta, e_phi): (..., 2, nlat, nlon)."""
        return self.sht.gradient_frame(c).to(self.placement.device)

    def divergence_frame(self, field: torch.Tensor) -> torch.Tensor:
        """Coefficients of div F for the frame components (F_theta, F_phi) = field[..., k, :, :]."""
        return self.sht.divergence(field[..., 0, :, :], field[..., 1, :, :]).to(self.placement.device)

    def coordinates(self) -> dict:
        return {"lat": self.latitude, "lon": self.longitude}

    def float64_points(self) -> np.ndarray:
        """The grid's unit vectors (nlat nlon, 3) in float64 whatever the run's dtype: Gauss nodes cos(theta_j)
        (north to south) and phi_k = 2 pi k / nlon."""
        nlat, nlon = self.grid_shape
        z = gauss_legendre(nlat)[0][:, None]
        phi = 2 * np.pi * np.arange(nlon)[None, :] / nlon
        s = np.sqrt((1 - z) * (1 + z))
        return np.stack(np.broadcast_arrays(s * np.cos(phi), s * np.sin(phi), z), axis=-1).reshape(-1, 3)

    def scalar_transform(self, lmax: int):
        """Scalar analysis and synthesis alone of degree `lmax` on this grid, with the basis's backend."""
        nlat, nlon = self.grid_shape
        if self.backend == "shtns":
            from spherepde.discretisation.transforms.sht_shtns import ShtnsSHT

            return ShtnsSHT(lmax, nlat, nlon, self.placement.device, self.placement.real)
        from spherepde.discretisation.transforms.sht_torch import TorchSHT

        return TorchSHT(lmax, nlat, nlon, self.placement.device, self.placement.real, vector=False)

    def evaluate(self, c: torch.Tensor, points: torch.Tensor, block: int = 2048) -> torch.Tensor:
        """f(x) at arbitrary points x (n, 3) from coefficients (lmax+1, lmax+1): the exact series,
        sum_lm multiplicity_m Re(c_lm Pbar_lm(cos theta) e^{i m phi}), in blocks of points."""
        from spherepde.discretisation.transforms.legendre import legendre_values

        order = torch.arange(self.lmax + 1, device=c.device, dtype=self.placement.real)
        values = []
        for start in range(0, points.shape[0], block):
            x = points[start:start + block].to(torch.float64).cpu()
            legendre = torch.as_tensor(legendre_values(self.lmax, x[:, 2].clamp(-1, 1).numpy()))
            legendre = legendre.to(c.device, self.placement.real)
            weighted = (c * self.multiplicity).to(self.placement.complex)
            series = torch.einsum("ml,mlp->mp", weighted, legendre.to(c.dtype))
            phi = torch.atan2(x[:, 1], x[:, 0]).to(c.device, self.placement.real)
            values.append((series * torch.exp(1j * order[:, None] * phi[None, :])).real.sum(0))
        return torch.cat(values)


def gauss_cell_radius(nlat: int, nlon: int) -> float:
    """The largest chordal distance from a node of the Gauss grid (nlat, nlon) to a point of its cell.  The cells are
    the sectors of width 2 pi / nlon centred on the nodes' longitudes, between the circles z = -1 + (partial sums of
    the Gauss weights): each cell's area is its quadrature weight, and each node lies inside its cell (the
    Markov-Stieltjes separation of Gauss nodes by those sums).  The farthest point of a cell is a corner:
    <x_j, y> is increasing in cos(longitude) and concave in z."""
    z, w = gauss_legendre(nlat)
    order = torch.as_tensor(z).argsort()
    z, w = torch.as_tensor(z)[order], torch.as_tensor(w)[order]
    edges = torch.cat([torch.tensor([-1.0], dtype=torch.float64), (-1 + torch.cumsum(w, 0)).clamp(-1, 1)])
    half_width = math.cos(math.pi / nlon)

    def chord_squared(edge):
        return 2 - 2 * (z * edge + torch.sqrt(1 - z * z) * torch.sqrt(1 - edge * edge) * half_width)
    return float(torch.sqrt(torch.maximum(chord_squared(edges[:-1]), chord_squared(edges[1:])).max()))


def make_basis(dim: int, lmax: int, placement: Placement, backend: str = "auto",
               grid_shape: tuple[int, ...] | None = None, vector: bool = True):
    """The basis of S^{dim-1}; backend "auto" means torch (same code on CPU and CUDA).

    `grid_shape` overrides the dealiased grid: (n,) circle points, or (nlat, nlon) on S^2 (e.g. an
    earlier output's grid); ValueError if it does not resolve degree lmax.  `vector` False: on S^2 the scalar
    transforms alone (`SphereBasis`); the circle's are all equally cheap.
    """
    if basis_class(dim) is CircleBasis:
        return CircleBasis(lmax, placement, grid_shape[0] if grid_shape else None)
    return SphereBasis(lmax, placement, "torch" if backend == "auto" else backend, grid_shape, vector)


def basis_class(dim: int) -> type:
    """The basis class of S^{dim-1}: its class attributes (grid_dims, coefficient_shape, ...) without a grid."""
    classes = {2: CircleBasis, 3: SphereBasis}
    if dim not in classes:
        raise ValueError(f"the Eulerian solver handles d = 2 or 3, not {dim}")
    return classes[dim]
