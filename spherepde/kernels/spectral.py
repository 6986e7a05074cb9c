"""The spectral exponential-kernel transform, exact for band-limited channels (rho of degree lmax, y rho of lmax + 1).

With u = C^T x = r u_hat (r = |C^T x|), the kernel exp(beta r <u_hat, y>) is zonal about u_hat and acts on each
degree l by the Funk-Hecke weight (spherepde.kernels.funk_hecke), so that scaled(x) = sum_lm mu_l(beta r) f_lm
Y_lm(u_hat) with log_scale = beta r.  One mode per kind of C (`SpectralMode`): C = s I or beta = 0
(`ScaledMode`, the weights alone); C = s Q with Q orthogonal, r = s and u_hat = Q^T x everywhere, so scaled =
(mu(beta s) f) o Q^T, a grid permutation when Q^T maps the grid onto itself (`PermutedMode`), otherwise a
rotation of the coefficients (`RotatedMode`), at the cost of two transforms and, for a rotation, O(lmax^3);
general C: r = |C^T x| varies over the grid.  On S^2, while it fits SPECTRAL_MATRIX_BYTES (lmax <= 35),
`MatrixMode` keeps the map f_lm -> sum_lm mu_l(beta r_i) f_lm Y_lm(u_hat_i) as one dense matrix, each point
with its own weights: exact, and one product a call.  Otherwise (`InterpolatedMode`) r ranges over
[sigma_min(C), sigma_max(C)] and mu_l(beta r) is interpolated in r on n Chebyshev nodes r_k,
mu_l(beta r) ~ sum_k ell_k(r) mu_l(beta r_k), so that scaled(x) ~ sum_k ell_k(r(x)) F_k(u_hat(x)),
F_k = sum_lm mu_l(beta r_k) f_lm Y_lm, each F_k band-limited and evaluated at the scattered points u_hat(x)
(spherepde.discretisation.scattered), n the smallest count whose interpolation error is below
tol * mu_0(beta r) for every degree.
"""

from typing import Protocol

import numpy as np
import torch

from spherepde.base.errors import CaseError
from spherepde.base.memory import available_memory
from spherepde.discretisation.rotations import CircleRotation, SphereRotation, grid_permutation, orthogonal_factor
from spherepde.discretisation.scattered import (
    CircleEvaluator,
    DegreeRaisedTransform,
    barycentric_weights,
    harmonics_at,
    make_evaluator,
    stored_coefficients,
)
from spherepde.kernels.funk_hecke import MAX_CHEBYSHEV_NODES, chebyshev_nodes, funk_hecke


class SpectralMode(Protocol):
    """How the spectral transform turns the coefficients of the fields into the scaled values at the grid."""

    nodes: np.ndarray  # the radii r at which the Funk-Hecke weights mu_l(beta r) are taken
    log_scale: torch.Tensor  # (*grid)

    def __call__(self, coefficients: torch.Tensor) -> torch.Tensor:
        """Coefficients (F, *coeff) of degree lmax + 1 -> scaled values (F, N) at the grid points."""

    def cost(self, channels: int) -> float:
        """Floating-point operations of one call for `channels` fields (estimate): transforms, rotation,
        scattered evaluation."""


class ScaledMode:
    """C = s I (and beta = 0): scaled = synthesis(mu_l(beta s) f_lm), log_scale = beta s."""

    def __init__(self, basis, transform: DegreeRaisedTransform, s: float, beta: float, on_grid: bool = True,
                 signs: tuple = (1, 1, 1)):
        placement = basis.placement
        device, dtype = placement.device, placement.real
        self.transform = transform
        weights = funk_hecke(basis.dim, beta * s, transform.degree)
        self._weights = torch.as_tensor(weights, dtype=dtype, device=device)
        self.log_scale = torch.full(basis.grid_shape, beta * s, dtype=dtype, device=device)
        self.nodes = np.array([s])
        # with `on_grid`, the analysis, the weights and the synthesis as one product per order where it applies
        self._filter = transform.degree_filter(weights[0]) if on_grid else None  # weights[m, l] = mu_l
        moments = transform.moment_filter(weights[0], signs) if on_grid else None
        self.from_density = self.frame_from_density = moments is not None
        self._moments, self._moments_adjoint, self._frame_moments, self._frame_moments_adjoint = (
            moments if self.from_density else (None,) * 4)

    def __call__(self, coefficients: torch.Tensor) -> torch.Tensor:
        return self.transform.synthesis(coefficients * self._weights).reshape(coefficients.shape[0], -1)

    def of_grid(self, f: torch.Tensor) -> torch.Tensor | None:
        """The scaled values (F, N) straight from grid fields f (F, *grid), where the transform has the degree
        filter (DegreeRaisedTransform.degree_filter); else None."""
        return None if self._filter is None else self._filter(f).reshape(f.shape[0], -1)

    def of_density(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rho (F, N), the scaled values (F, 4, N) of the channels rho (1, x_1, x_2, x_3)) straight from rho's
        coefficients c (F, *coeff), where `from_density` (DegreeRaisedTransform.moment_filter)."""
        fields = self._moments(c).flatten(-2)
        return fields[:, 0], fields[:, 1:]

    def of_density_adjoint(self, fields_bar: torch.Tensor) -> torch.Tensor:
        """The transpose of `of_density`: c_bar (F, *coeff) from the cotangents (F, 5, N) of rho and of the four
        scaled values."""
        return self._moments_adjoint(fields_bar.reshape(fields_bar.shape[:2] + self.log_scale.shape))

    def of_density_frame(self, c: torch.Tensor, normaliser: bool = True, radial: bool = False) -> torch.Tensor:
        """(rho, <e_theta, N>, <e_phi, N>, Z) (F, 4, N) of `of_density`'s rho and scaled values (Z, N) from rho's
        coefficients c (F, *coeff), where `frame_from_density`; without Z (F, 3, N) unless `normaliser`; with
        `radial` <x, N> alone (F, 1, N)."""
        return self._frame_moments(c, normaliser, radial).flatten(-2)

    def of_density_frame_adjoint(self, fields_bar: torch.Tensor) -> torch.Tensor:
        """The transpose of `of_density_frame`: c_bar (F, *coeff) from the cotangents (F, 3 or 4, N) of its fields,
        or (F, 5, N) with that of <x, N> (the sum of the transposes of a call with Z and one with `radial`)."""
        return self._frame_moments_adjoint(fields_bar.reshape(fields_bar.shape[:2] + self.log_scale.shape))

    def cost(self, channels: int) -> float:
        return channels * self.transform.cost()


class PermutedMode(ScaledMode):
    """C = s Q with Q^T mapping the grid onto itself: `ScaledMode`'s values at the permuted points.  Where Q = diag(a,
    a, b) (seed 003's B = diag(-1, -1, 1)) the density's moments come permuted from their tables
    (TorchSHT.moment_filter's signs) and `of_density` gathers nothing."""

    def __init__(self, basis, transform: DegreeRaisedTransform, s: float, beta: float, permutation: torch.Tensor,
                 Q: np.ndarray):
        signs = np.sign(np.diag(Q))
        self.in_tables = bool(np.allclose(Q, np.diag(signs), rtol=0, atol=1e-12) and signs[0] == signs[1])
        super().__init__(basis, transform, s, beta, signs=tuple(signs) if self.in_tables else (1, 1, 1))
        # the frame at a point is not the frame at the point it is permuted to: the projection needs the tables'
        self.frame_from_density = self.from_density and self.in_tables
        self.permutation = permutation

    def __call__(self, coefficients: torch.Tensor) -> torch.Tensor:
        return super().__call__(coefficients)[:, self.permutation]

    def of_grid(self, f: torch.Tensor) -> torch.Tensor | None:
        values = super().of_grid(f)
        return None if values is None else values[:, self.permutation]

    def of_density(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rho, values = super().of_density(c)
        return (rho, values) if self.in_tables else (rho, values[..., self.permutation])

    def of_density_adjoint(self, fields_bar: torch.Tensor) -> torch.Tensor:
        if self.in_tables:
            return super().of_density_adjoint(fields_bar)
        values_bar = fields_bar[:, 1:, self.permutation.argsort()]
        return super().of_density_adjoint(torch.cat([fields_bar[:, :1], values_bar], dim=1))


class RotatedMode(ScaledMode):
    """C = s Q, Q orthogonal: the weighted coefficients rotated by Q (Wigner D on S^2, a phase on S^1)."""

    def __init__(self, basis, transform: DegreeRaisedTransform, s: float, beta: float, Q: np.ndarray):
        super().__init__(basis, transform, s, beta, on_grid=False)  # the rotation acts on the coefficients
        rotation = CircleRotation if basis.dim == 2 else SphereRotation
        self.rotation = rotation(Q, transform.lmax, basis.placement.device, basis.placement.real)

    def __call__(self, coefficients: torch.Tensor) -> torch.Tensor:
        rotated = self.rotation(coefficients * self._weights)
        return self.transform.synthesis(rotated).reshape(coefficients.shape[0], -1)

    def cost(self, channels: int) -> float:
        return super().cost(channels) + 4.0 * channels * (self.transform.lmax + 1) ** 3


def orthogonal_mode(basis, transform: DegreeRaisedTransform, s: float, Q: np.ndarray, beta: float) -> ScaledMode:
    """The mode of C = s Q, Q orthogonal: scaling, a grid permutation, or a rotation of the coefficients."""
    if np.array_equal(Q, np.eye(basis.dim)):
        return ScaledMode(basis, transform, s, beta)
    permutation = grid_permutation(basis, Q)
    if permutation is not None:
        return PermutedMode(basis, transform, s, beta, permutation, Q)
    return RotatedMode(basis, transform, s, beta, Q)


class InterpolatedMode:
    """General C: Chebyshev interpolation in r = |C^T x| of the fields F_k evaluated at u_hat(x) (module
    docstring), both accurate to tol / 100 relative to mu_0 (`SpectralExpKernel`); CaseError when no node count
    up to MAX_CHEBYSHEV_NODES reaches it."""

    def __init__(self, basis, transform: DegreeRaisedTransform, matrix: np.ndarray, beta: float, tol: float,
                 evaluator: str):
        placement = basis.placement
        device, dtype = placement.device, placement.real
        self.transform = transform
        degree = transform.degree
        r, direction = scattered_geometry(basis, matrix)
        low, high = float(r.min()), float(r.max())
        accuracy = max(tol / 100, 10 * torch.finfo(dtype).eps)
        self.nodes = chebyshev_nodes(basis.dim, beta, low, high, transform.lmax, accuracy)
        if self.nodes is None:
            raise CaseError(f"solver.field: the spectral field needs more than {MAX_CHEBYSHEV_NODES} Chebyshev nodes "
                            f"for model.beta = {beta:g} at solver.kernel_tol = {tol:g}; use solver.field = 'dense'")
        kappa = beta * self.nodes.reshape(-1, *[1] * degree.ndim)
        self._weights = torch.as_tensor(funk_hecke(basis.dim, kappa, degree), dtype=dtype, device=device)  # (n, *coeff)
        self._ell = torch.as_tensor(barycentric_weights(self.nodes, r), dtype=dtype, device=device)  # (N, n)
        self.log_scale = torch.as_tensor(beta * r, dtype=dtype, device=device).reshape(basis.grid_shape)
        if basis.dim == 2:
            check_circle_table(transform.lmax, len(r))
        self.evaluator = make_evaluator(basis.dim, transform.lmax, direction, accuracy, device, dtype, evaluator)

    def __call__(self, coefficients: torch.Tensor) -> torch.Tensor:
        count, nodes = coefficients.shape[0], len(self.nodes)
        per_node = (self._weights[:, None] * coefficients[None]).reshape(nodes * count, *coefficients.shape[1:])
        values = self.evaluator(per_node).reshape(-1, nodes, count)  # (N, n, F)
        return torch.einsum("pk,pkc->cp", self._ell, values.to(self._ell.device))

    def cost(self, channels: int) -> float:
        return channels * self.transform.cost() + self.evaluator.cost(len(self.nodes) * channels)


def check_circle_table(kmax: int, count: int) -> None:
    """A CaseError naming solver.field where the table of InterpolatedMode's evaluator on S^1 (CircleEvaluator, the
    waves of degree <= kmax at `count` points; built on the host at its first call) cannot be built in the memory
    this machine has left (base.memory.available_memory): 1.6 GB at lmax 4096, 26 GB at lmax 16384, where the run
    would end out of memory."""
    needed = CircleEvaluator.build_bytes(kmax, count)
    available = available_memory()
    if available is not None and needed > available:
        raise CaseError(f"solver.field: the spectral field on S^1 with a general model.B needs about "
                        f"{needed / 2 ** 30:.3g} GiB of memory for its table ({count} points x {kmax + 1} waves); "
                        f"this machine has {available / 2 ** 30:.3g} GiB available; use solver.field = 'dense'")


# Largest matrix MatrixMode keeps (general C): on S^2 up to lmax 35 (45 MiB at lmax 32; 661 MiB at lmax 64).
SPECTRAL_MATRIX_BYTES = 64 * 2 ** 20
# Points per block while MatrixMode builds its matrix (the Legendre values of a block: (L + 1)^2 of them).
HARMONICS_BLOCK = 512


def scattered_geometry(basis, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(r (N,), u_hat (N, d)): r = |C^T x| and u_hat = C^T x / r at the grid points (the last axis where r = 0)."""
    u = basis.float64_points() @ matrix
    r = np.linalg.norm(u, axis=1)
    return r, np.where(r[:, None] > 0, u / np.where(r > 0, r, 1.0)[:, None], np.eye(basis.dim)[-1])


class MatrixMode:
    """General C with the map from coefficients to scaled values kept as one real matrix A (N, 2K):

        scaled(x_i) = sum_lm mu_l(beta r_i) f_lm Y_lm(u_hat_i) = [A (Re f; Im f)]_i,

    the Funk-Hecke weights taken at each point's own r_i = |C^T x_i| (no interpolation: exact for channels of
    degree lmax + 1, to round-off), K the stored coefficients.  A call is one product for all channels, where
    InterpolatedMode takes n nodes times the channels' scattered syntheses; used on S^2 while A fits
    SPECTRAL_MATRIX_BYTES (`SpectralExpKernel`)."""

    def __init__(self, basis, transform: DegreeRaisedTransform, matrix: np.ndarray, beta: float):
        placement = basis.placement
        self.transform = transform
        r, direction = scattered_geometry(basis, matrix)
        self.nodes = r  # every point's own
        self.log_scale = torch.as_tensor(beta * r, dtype=placement.real, device=placement.device).reshape(
            basis.grid_shape)
        # integer indices, not a boolean mask: indexing by a mask waits for the device to count it
        self._stored = torch.as_tensor(np.flatnonzero(stored_coefficients(basis.dim, transform.lmax)),
                                       device=placement.device)
        blocks, degrees = [], np.arange(transform.lmax + 1)
        for start in range(0, len(r), HARMONICS_BLOCK):
            block = slice(start, start + HARMONICS_BLOCK)
            harmonics, degree = harmonics_at(basis.dim, transform.lmax, direction[block])
            weighted = harmonics * funk_hecke(basis.dim, beta * r[block, None], degrees[None, :])[:, degree]
            blocks.append(np.stack([weighted.real, -weighted.imag], axis=-1).reshape(len(weighted), -1))
        # (2K, N): a channel's (Re f, Im f), interleaved as torch.view_as_real lays them out, times it
        self._matrix_t = torch.as_tensor(np.concatenate(blocks).T, dtype=placement.real,
                                         device=placement.device).contiguous()

    @staticmethod
    def matrix_bytes(basis, transform: DegreeRaisedTransform) -> int:
        """The memory A would take on `basis`."""
        stored = int(stored_coefficients(basis.dim, transform.lmax).sum())
        return 2 * stored * basis.grid_size * basis.points.element_size()

    def __call__(self, coefficients: torch.Tensor) -> torch.Tensor:
        count = coefficients.shape[0]
        stored = coefficients.reshape(count, -1).index_select(1, self._stored)
        return torch.view_as_real(stored).reshape(count, -1) @ self._matrix_t

    def cost(self, channels: int) -> float:
        return channels * (self.transform.cost() + 2.0 * self._matrix_t.numel())


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
    mode: SpectralMode

    def __init__(self, basis, C: torch.Tensor, beta: float, tol: float, evaluator: str = "auto",
                 matrix_bytes: int | None = None):
        """`matrix_bytes`: the largest MatrixMode kept (None: SPECTRAL_MATRIX_BYTES)."""
        matrix_bytes = SPECTRAL_MATRIX_BYTES if matrix_bytes is None else matrix_bytes
        self.grid_shape = basis.grid_shape
        self.transform = DegreeRaisedTransform(basis)
        matrix = C.detach().cpu().double().numpy()
        factor = (0.0, np.eye(basis.dim)) if beta == 0 else orthogonal_factor(matrix)
        # S^1 keeps the interpolation: there the dense field, which the transport folds into its operator (the
        # matrix and fourier paths), is the cheaper one, and "auto" must go on picking it
        if factor is None and basis.dim == 3 and MatrixMode.matrix_bytes(basis, self.transform) <= matrix_bytes:
            self.mode = MatrixMode(basis, self.transform, matrix, beta)
        elif factor is None:
            self.mode = InterpolatedMode(basis, self.transform, matrix, beta, tol, evaluator)
        else:
            self.mode = orthogonal_mode(basis, self.transform, *factor, beta)
        self.nodes = self.mode.nodes
        self.from_density = getattr(self.mode, "from_density", False)
        self.frame_from_density = getattr(self.mode, "frame_from_density", False)

    def __call__(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """f: (*grid, c) grid values -> (scaled (*grid, c), log_scale (*grid))."""
        scaled, log_scale = self.fields(torch.movedim(f, -1, 0))
        return torch.movedim(scaled, 0, -1), log_scale

    def fields(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The transform of fields given first: f (F, *grid) -> (scaled (F, *grid), log_scale (*grid))."""
        scaled = self.mode.of_grid(f) if hasattr(self.mode, "of_grid") else None
        if scaled is None:
            scaled = self.mode(self.transform.analysis(f))
        return scaled.reshape(f.shape), self.mode.log_scale

    def density_fields(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rho (F, N), scaled (F, 1 + d, N), log_scale (*grid)): rho and the transform of the channels (rho, rho y)
        from rho's coefficients c (F, *coeff), where `from_density` (S^2, C = s I or a grid permutation)."""
        rho, scaled = self.mode.of_density(c)
        return rho, scaled, self.mode.log_scale

    def density_fields_adjoint(self, fields_bar: torch.Tensor) -> torch.Tensor:
        """The transpose of `density_fields` (log_scale is fixed): c_bar (F, *coeff) from the cotangents (F, 2 + d,
        N) of rho and of the scaled channels, in that order."""
        return self.mode.of_density_adjoint(fields_bar)

    def density_frame_fields(self, c: torch.Tensor, normaliser: bool = True,
                             radial: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """((rho, <e_theta, N>, <e_phi, N>, Z) (F, 4, N), log_scale (*grid)): `density_fields`' rho and scaled
        channels (N, Z) with N projected on the grid's frame, where `frame_from_density` (S^2, C = s I or
        diag(a, a, b)); without Z (F, 3, N) unless `normaliser`; with `radial` the first is <x, N> alone (F, 1,
        N)."""
        return self.mode.of_density_frame(c, normaliser, radial), self.mode.log_scale

    def density_frame_fields_adjoint(self, fields_bar: torch.Tensor) -> torch.Tensor:
        """The transpose of `density_frame_fields` (log_scale is fixed): c_bar (F, *coeff) from the cotangents (F, 3
        or 4, N) of its fields, or (F, 5, N) with that of <x, N> as the fifth (the sum of the transposes of a call
        with Z and one with `radial`)."""
        return self.mode.of_density_frame_adjoint(fields_bar)

    def cost(self, channels: int) -> float:
        """Floating-point operations of one call (estimate): transforms, rotation, scattered evaluation."""
        return self.mode.cost(channels)
