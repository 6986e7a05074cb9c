"""The choice of exponential-kernel transform  T_C f(x) = integral exp(beta <x, C y>) f(y) dsigma(y).

It is the attention integral of the model: with f = rho (partition function Z) and f = y_c rho (numerator N),
applied with C = B.  Values can be astronomically large (beta in the thousands), so every implementation
returns them scaled, T_C f(x) = exp(log_scale(x)) * scaled(x), with log_scale(x) <= beta |C^T x|, the bound
keeping every kernel entry below 1, since <x, C y> = <C^T x, y> <= |C^T x|.  Both implementations, the dense
quadrature (spherepde.kernels.dense) and the spectral Funk-Hecke transform (spherepde.kernels.spectral), share
one call signature, f (*grid, c) -> (scaled (*grid, c), log_scale (*grid)), and a `name`; `make_exp_kernel`
picks one (solver.field) and `MemberKernels` holds those of a batch of members.  The transform is linear and
never divides: whether N / Z is well defined is the model's business (`model.attention_mean`).
"""

import copy
import math

import torch

from spherepde.base.errors import CaseError
from spherepde.kernels.dense import DENSE_MATRIX_BYTES, DenseExpKernel
from spherepde.kernels.spectral import SpectralExpKernel


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
    C = B_m and beta_m; `field` one for all or a list, one per member): one transform per distinct (field, B,
    beta), members sharing it transformed in one call.

    Called like a transform, with a member axis and the grid flattened: f (M, P, c) -> (scaled (M, P, c),
    log_scale (M, P)).  `member(m)` is member m's own transform (grid-shaped calls, as `make_exp_kernel`'s).
    """

    def __init__(self, basis, B: torch.Tensor, beta, field: str | list, tol: float, chunk: int | str = "auto"):
        self.grid_shape, self.device = basis.grid_shape, B.device
        self.kernels, self._of_member, groups = [], [], {}
        fields = [field] * len(B) if isinstance(field, str) else field
        for C, b, member_field in zip(B, beta, fields):
            key = (member_field, float(b), C.detach().cpu().double().numpy().tobytes())
            if key not in groups:
                groups[key] = len(self.kernels)
                self.kernels.append(make_exp_kernel(basis, C, float(b), member_field, tol, chunk))
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
        return self._by_transform(f, lambda kernel, part: _members_through(kernel, part, self.grid_shape))

    def _by_transform(self, x: torch.Tensor, through) -> tuple:
        """through(transform, x's rows of its members) for every transform in use, its results' rows (members on
        axis 0) put back in the members' order."""
        if len(self._groups) == 1:
            return through(self._groups[0][0], x)
        parts = [through(kernel, x.index_select(0, members)) for kernel, members in self._groups]
        order = torch.cat([members for _, members in self._groups]).argsort()
        return tuple(torch.cat(pieces).index_select(0, order) for pieces in zip(*parts))

    @property
    def from_density(self) -> bool:
        """Whether every transform in use gives rho and the transforms of the channels (rho, rho y) from the
        density's coefficients (`density_fields`)."""
        return all(getattr(kernel, "from_density", False) for kernel, _ in self._groups)

    def density_fields(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rho (M, P), scaled (M, 1 + d, P), log_scale (M, P)): the members' densities and the transforms of
        their channels (rho, rho y) from their coefficients c (M, *coeff), where `from_density`; members sharing a
        transform go through it together."""
        points = math.prod(self.grid_shape)

        def through(kernel, part):
            rho, scaled, log_scale = kernel.density_fields(part)
            return rho, scaled, log_scale.reshape(1, points).expand(part.shape[0], points)

        return self._by_transform(c, through)

    def density_fields_adjoint(self, fields_bar: torch.Tensor) -> torch.Tensor:
        """The transpose of `density_fields`: c_bar (M, *coeff) from the cotangents (M, 2 + d, P) of rho and of the
        scaled channels, in that order."""
        return self._by_transform(fields_bar, lambda kernel, part: (kernel.density_fields_adjoint(part),))[0]

    @property
    def frame_from_density(self) -> bool:
        """Whether every transform in use gives `density_frame_fields`."""
        return all(getattr(kernel, "frame_from_density", False) for kernel, _ in self._groups)

    def density_frame_fields(self, c: torch.Tensor, normaliser: bool = True,
                             radial: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """((rho, <e_theta, N>, <e_phi, N>, Z) (M, 4, P), log_scale (M, P)): `density_fields`' rho and scaled
        channels with N on the grid's frame, from the coefficients c (M, *coeff), where `frame_from_density`; without
        Z (M, 3, P) unless `normaliser`; with `radial` the first is <x, N> alone (M, 1, P)."""
        points = math.prod(self.grid_shape)

        def through(kernel, part):
            fields, log_scale = kernel.density_frame_fields(part, normaliser, radial)
            return fields, log_scale.reshape(1, points).expand(part.shape[0], points)

        return self._by_transform(c, through)

    def density_frame_fields_adjoint(self, fields_bar: torch.Tensor) -> torch.Tensor:
        """The transpose of `density_frame_fields`: c_bar (M, *coeff) from the cotangents (M, 3 or 4, P) of its
        fields, or (M, 5, P) with that of <x, N> as the fifth (the sum of the transposes of a call with Z and one
        with `radial`)."""
        return self._by_transform(fields_bar, lambda kernel, part: (kernel.density_frame_fields_adjoint(part),))[0]


def _members_through(kernel, f: torch.Tensor, grid_shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """One transform applied to the fields of every member at once: (M, c, P), the member axis riding along with
    the channels."""
    members, channels, points = f.shape
    scaled, log_scale = kernel.fields(f.reshape((members * channels,) + tuple(grid_shape)))
    return scaled.reshape(members, channels, points), log_scale.reshape(1, points).expand(members, points)
