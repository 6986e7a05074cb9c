"""Exact samplers of the initial measures of docs/design.md "Case files" on S^{d-1}, any d >= 2.

Every sampler draws from a `torch.Generator`, so a seed fixes the sample bit for bit
(on the CPU).  Points are (n, d) tensors of unit vectors.

* uniform:      x = g / |g|, g ~ N(0, I_d).
* von Mises-Fisher, density C_d(kappa) exp(kappa <mu, x>): Wood's (1994) rejection
  algorithm for the component w = <mu, x>, whose density is proportional to
  exp(kappa w) (1 - w^2)^{(d-3)/2}; the proposal
      w = (1 - (1 + b) z) / (1 - (1 - b) z),   z ~ Beta((d-1)/2, (d-1)/2),
      b = (d - 1) / (2 kappa + sqrt(4 kappa^2 + (d-1)^2)),   x0 = (1 - b) / (1 + b),
  is accepted when kappa w + (d-1) log(1 - x0 w) - c >= log u, c = kappa x0 + (d-1) log(1 - x0^2),
  u ~ U(0, 1).  Beta((d-1)/2, (d-1)/2) is exactly X / (X + Y) with X, Y independent
  chi-square variables of d - 1 degrees of freedom (sums of squared normals), so only
  normal and uniform draws are used.  Then x = w mu + sqrt(1 - w^2) t with t uniform
  on the unit sphere of mu^perp (a Householder reflection takes e_1 to mu).
* mixtures: component labels from the weights (multinomial), each component exactly.
* projected Gaussian: x = X / |X|, X = m + L g ~ N(m, S), S = L L^T (Cholesky), g ~ N(0, I_d);
  the measure-zero draws X = 0 are redrawn.
* a density stored in an Eulerian output file (S^1, S^2): the band-limited density rho
  of the file (its spectral interpolant) is sampled exactly by rejection from a
  piecewise-constant envelope on the grid cells.  The cells are the quadrature cells:
  arcs of length 2 pi / N around the nodes (S^1); on S^2 longitude intervals times
  intervals in mu = cos(colatitude) whose lengths are the Gauss weights (so that the
  cell areas are the quadrature weights, and uniform (mu, phi) is uniform in area).
  A cell is chosen with probability proportional to q_j * area_j (inverse CDF), a
  point uniformly in it, and the point kept with probability max(rho(x), 0) / q_j,
  where q_j is 5/4 of the largest rho on a sub-grid of the cell (plus 1e-6 of the
  global maximum).  The result has density proportional to max(rho, 0) provided the
  envelope holds; it is checked at every proposal, and a violation is a CaseError.
"""

import math

import torch

from spherepde.base.errors import CaseError
from spherepde.model.initial import pinned_file

ENVELOPE_FACTOR = 1.25
ENVELOPE_FLOOR = 1e-6


def uniform(n: int, dim: int, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """n points uniform on S^{dim-1}."""
    g = torch.randn(n, dim, generator=generator, dtype=dtype)
    return g / torch.linalg.vector_norm(g, dim=1, keepdim=True)


def _beta_symmetric(n: int, dof: int, generator: torch.Generator, dtype) -> torch.Tensor:
    """Beta(dof/2, dof/2) as X / (X + Y), X, Y ~ chi-square(dof)."""
    squares = torch.randn(n, 2, dof, generator=generator, dtype=dtype).square().sum(-1)
    return squares[:, 0] / squares.sum(1)


def _wood_b(kappa: float, m1: int) -> tuple[float, float]:
    """Wood's b = m1 / (2 kappa + sqrt(4 kappa^2 + m1^2)) and kappa b, finite for every finite kappa >= 0."""
    if kappa <= 1:
        b = m1 / (2 * kappa + math.hypot(2 * kappa, m1))
        return b, kappa * b
    kappa_b = m1 / (2 + math.hypot(2, m1 / kappa))
    return kappa_b / kappa, kappa_b


def _wood_components(n: int, dim: int, kappa: float, generator: torch.Generator, dtype):
    """n draws of (w, 1 - w^2) for w = <mu, x>, x ~ vMF(mu, kappa) on S^{dim-1} (Wood 1994).

    Wood's acceptance test, kappa w + m log(1 - x0 w) - c >= log u with x0 = (1 - b) / (1 + b), is written
    in differences from x0 that carry a factor b and cancel it: as printed it takes log(1 - x0^2) = -inf
    once x0 rounds to 1 (kappa ~ 1e16), and kappa w - kappa x0 loses digits as kappa grows before that.
    """
    m1 = dim - 1
    b, kappa_b = _wood_b(kappa, m1)
    accepted_w, accepted_s = [torch.empty(0, dtype=dtype)], [torch.empty(0, dtype=dtype)]  # n = 0: none
    count = 0
    while count < n:
        batch = int(1.3 * (n - count)) + 16
        z = _beta_symmetric(batch, m1, generator, dtype)
        u = torch.rand(batch, generator=generator, dtype=dtype)
        denominator = 1 - (1 - b) * z
        w = (1 - (1 + b) * z) / denominator
        one_minus_w_squared = 4 * b * z * (1 - z) / denominator ** 2  # (1 - w)(1 + w) without cancellation
        # w - x0 = 2 b (1 / (1 + b) - z / denominator),
        # (1 - x0 w) / (1 - x0^2) = (1 + b)^2 / 2 (z / denominator + w / (1 + b))
        excess = 2 * kappa_b * (1 / (1 + b) - z / denominator)
        ratio = (1 + b) ** 2 / 2 * (z / denominator + w / (1 + b))
        keep = excess + m1 * torch.log(ratio) >= torch.log(u)
        accepted_w.append(w[keep])
        accepted_s.append(one_minus_w_squared[keep])
        count += int(keep.sum())
    return torch.cat(accepted_w)[:n], torch.cat(accepted_s)[:n]


def householder_to(mean: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Apply the reflection H = I - 2 u u^T / |u|^2, u = e_1 - mean, which maps e_1 to `mean`."""
    u = -mean.clone()
    u[0] += 1
    norm_squared = float(u @ u)
    if norm_squared < 1e-30:
        return points
    return points - (2 / norm_squared) * (points @ u)[:, None] * u


def von_mises_fisher(n: int, mean, kappa: float, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """n exact draws from vMF(mean, kappa) on S^{d-1}, d = len(mean) (mean a unit vector)."""
    mu = torch.as_tensor(mean, dtype=dtype)
    dim = mu.numel()
    w, one_minus_w_squared = _wood_components(n, dim, float(kappa), generator, dtype)
    tangent = uniform(n, dim - 1, generator, dtype)
    local = torch.cat([w[:, None], torch.sqrt(one_minus_w_squared)[:, None] * tangent], dim=1)
    return householder_to(mu, local)


def vmf_mixture(n: int, means, kappas, weights, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """n exact draws from sum_k weights_k vMF(means_k, kappas_k); particles in random order."""
    labels = torch.multinomial(torch.as_tensor(weights, dtype=torch.float64), n, replacement=True,
                               generator=generator)
    points = torch.empty(n, len(means[0]), dtype=dtype)
    for k, (mean, kappa) in enumerate(zip(means, kappas)):
        members = torch.nonzero(labels == k).flatten()
        points[members] = von_mises_fisher(members.numel(), mean, kappa, generator, dtype)
    return points


def projected_gaussian(n: int, mean, covariance, generator: torch.Generator, dtype=torch.float64) -> torch.Tensor:
    """n exact draws of X / |X|, X ~ N(mean, covariance) in R^d, d = len(mean)."""
    m = torch.as_tensor(mean, dtype=dtype)
    factor = torch.linalg.cholesky(torch.as_tensor(covariance, dtype=dtype))
    x = torch.zeros(n, m.numel(), dtype=dtype)
    redraw = torch.arange(n)
    while redraw.numel():
        x[redraw] = m + torch.randn(redraw.numel(), m.numel(), generator=generator, dtype=dtype) @ factor.T
        redraw = redraw[(x[redraw] == 0).all(1)]
    return x / torch.linalg.vector_norm(x, dim=1, keepdim=True)


def initial_particles(section: dict, dim: int, n: int, generator: torch.Generator, dtype=torch.float64):
    """n exact draws from the [initial] measure of a case (float64 draws cast to `dtype`)."""
    kind = section["kind"]
    if kind == "uniform":
        points = uniform(n, dim, generator)
    elif kind == "vmf":
        points = von_mises_fisher(n, section["mean"], section["kappa"], generator)
    elif kind == "vmf_mixture":
        points = vmf_mixture(n, section["means"], section["kappas"], section["weights"], generator)
    elif kind == "projected_gaussian":
        points = projected_gaussian(n, section["mean"], section["covariance"], generator)
    else:
        points = DensityFileSampler(pinned_file(section), section["time"], dim).sample(n, generator)
    return points.to(dtype)


class DensityFileSampler:
    """Exact sampling of max(rho, 0) for the density rho stored in an Eulerian output file (see module doc)."""

    def __init__(self, path: str, time_index: int, dim: int):
        from spherepde.base.device import placement
        from spherepde.model.initial import stored_coefficients

        self.path, self.dim = path, dim
        self.coefficients, self.basis = stored_coefficients(path, time_index, dim, placement("cpu", "float64"))
        self.lower, self.width = self._cells()
        self.envelope = self._envelope()

    def _cells(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Lower corner and size of every cell in (theta) or (mu, phi) coordinates, flattened like the grid."""
        basis = self.basis
        if self.dim == 2:
            h = 2 * math.pi / basis.grid_shape[0]
            return (basis.theta - h / 2)[:, None], torch.full((basis.grid_shape[0], 1), h, dtype=torch.float64)
        nlat, nlon = basis.grid_shape
        gauss_weights = basis.weights[:, 0] * nlon / (2 * math.pi)  # the Gauss weights, summing to 2
        upper = 1 - torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(gauss_weights, 0)[:-1]])
        dphi = 2 * math.pi / nlon
        mu_lower = (upper - gauss_weights)[:, None].expand(nlat, nlon)
        phi_lower = (torch.arange(nlon, dtype=torch.float64) * dphi - dphi / 2)[None, :].expand(nlat, nlon)
        lower = torch.stack([mu_lower, phi_lower], dim=-1).reshape(-1, 2)
        width = torch.stack([gauss_weights[:, None].expand(nlat, nlon),
                             torch.full((nlat, nlon), dphi, dtype=torch.float64)], dim=-1).reshape(-1, 2)
        return lower, width

    def _points(self, coordinates: torch.Tensor) -> torch.Tensor:
        """Unit vectors from theta (S^1) or (mu, phi) (S^2)."""
        if self.dim == 2:
            return torch.stack([torch.cos(coordinates[:, 0]), torch.sin(coordinates[:, 0])], dim=1)
        mu, phi = coordinates[:, 0].clamp(-1, 1), coordinates[:, 1]
        s = torch.sqrt((1 - mu) * (1 + mu))
        return torch.stack([s * torch.cos(phi), s * torch.sin(phi), mu], dim=1)

    def density(self, points: torch.Tensor) -> torch.Tensor:
        """max(rho, 0) at arbitrary points: the exact spectral series of the stored density."""
        return self.basis.evaluate(self.coefficients, points).clamp(min=0)

    def _envelope(self, subdivisions: int = 2) -> torch.Tensor:
        """q_j: 5/4 of the largest rho on a (subdivisions + 1)^(d-1) sub-grid of each cell, plus a floor."""
        offsets = torch.linspace(0, 1, subdivisions + 1, dtype=torch.float64)
        grids = torch.meshgrid(*([offsets] * (self.dim - 1)), indexing="ij")
        fractions = torch.stack([g.reshape(-1) for g in grids], dim=1)  # (s, d-1)
        coordinates = self.lower[:, None, :] + fractions[None, :, :] * self.width[:, None, :]
        values = self.density(self._points(coordinates.reshape(-1, self.dim - 1)))
        largest = values.reshape(self.lower.shape[0], -1).max(1).values
        return ENVELOPE_FACTOR * largest + ENVELOPE_FLOOR * float(largest.max())

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n exact draws from max(rho, 0) / its integral."""
        cell_mass = self.envelope * self.width.prod(1)
        kept, count = [], 0
        while count < n:
            batch = int(1.5 * (n - count)) + 16
            cells = torch.multinomial(cell_mass, batch, replacement=True, generator=generator)
            fraction = torch.rand(batch, self.dim - 1, generator=generator, dtype=torch.float64)
            points = self._points(self.lower[cells] + fraction * self.width[cells])
            values = self.density(points)
            bound = self.envelope[cells]
            if bool((values > bound).any()):
                excess = float((values / bound).max())
                raise CaseError(f"initial.path: the density of {self.path!r} exceeds its sampling envelope by a "
                                f"factor {excess:.3g} inside a grid cell (under-resolved); cannot sample it exactly")
            keep = torch.rand(batch, generator=generator, dtype=torch.float64) * bound < values
            kept.append(points[keep])
            count += int(keep.sum())
        return torch.cat(kept)[:n]

