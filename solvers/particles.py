"""The reference particle solver: n tokens on S^{d-1} (any d >= 2) for the model of DESIGN §2, for M members at once.

    dX_i = v[mu_n](X_i, t) dt + sqrt(2 eps) dB_i,    mu_n = (1/n) sum_j delta_{X_j},

with B_i independent Brownian motions on the sphere (generator eps Lap).  The drift is the same
model (spherepde.model.attention: attention, velocity) as the Eulerian solver's, with the empirical measure in place of
rho: the attention integral is the exponential-kernel sum over the particles with weights 1/n
(exp_kernel.dense_exp_kernel), or, for the softmax kernel on CUDA, fused scaled-dot-product attention
m_i = sum_j softmax_j(beta <B^T x_i, x_j>) x_j (the same sum, memory O(n) per block of rows).  On the CPU the
dense sum is used: torch's float64 CPU attention measured about 2x slower than it (n = 1e4, S^2, one core).
At beta = inf the case chooses between
  "mean_field": m(x) = B^T x / |B^T x|, the local field of the Eulerian equation, so the
                particles are its characteristics (they do not interact), and
  "hardmax":    m(x_i) = x_{j*}, j* = argmax_j <x_i, B x_j>, the beta -> inf limit of the
                softmax over the particles.

Systems.  The state is x (M, n, d): M members (a batch: seeds, initial laws, models of one sweep), each of
n tokens in `particles.replicas` = R independent systems of n / R consecutive tokens: the drift sees
M R systems of n / R tokens, one batched tensor program (a token attends to its own system only).

Integrators (x_{k+1} from x_k, step h; normalise(y) = y / |y|):
  "euler"  eps = 0: the seed's projected Euler  x <- normalise(x + h v(x));
           eps > 0: geodesic Euler-Maruyama     x <- exp_x(h v(x) + sqrt(2 eps h) P_x g),
           g ~ N(0, I_d), exp_x(u) = cos|u| x + sin|u| u / |u|.  Weak order 1.
  "heun"   explicit trapezoidal rule in R^d, then normalise (order 2);
  "rk4"    classical Runge-Kutta in R^d, then normalise (order 4).  The drift formula is
           smooth off the sphere and the sphere is invariant for it, so normalising once
           per step keeps the order.
  With eps > 0, "heun" and "rk4" are Strang splittings N(h/2) D(h) N(h/2) of the drift
  flow D and the noise N, consecutive half steps of noise merged into one: weak order 2.
  The noise step is a geodesic Gaussian step exp_x(sigma P_x g) with
      sigma^2 = 2 eps tau (1 - (d - 2) eps tau / 3),
  which matches the second and fourth moments of the geodesic displacement of the
  Brownian motion over a time tau to O(tau^3), so that it acts on every smooth function
  like exp(tau eps Lap) up to O(tau^3) (on S^1 the correction vanishes: the step is exact).
  A step with (d - 2) eps dt / 3 >= 1/2, beyond that expansion, is refused (CaseError).

Randomness: per member one CPU torch.Generator seeded with its particles.seed draws the initial sample and
then the seed of the member's noise generator (on the run's device).  The Gaussian draws of an interval
between knots are made together, in chunks of at most NOISE_BYTES (`Noise`), so a member's draws do not
depend on the batch it runs in: a batched member is its serial run bit for bit on the CPU.
"""

import math
from dataclasses import dataclass

import numpy as np
import ot
import torch
import torch.nn.functional as F

from spherepde.measures import diagnostics as diag
from spherepde.geometry.ambient import tangent_projection
from spherepde.base.device import placement as make_placement
from spherepde.model.energy import FreeEnergy
from spherepde.base.errors import CaseError
from spherepde.kernels.dense import DenseExpKernel, block_rows, dense_exp_kernel
from spherepde.model.attention import Model, ModelBatch, attention_mean, principal_subspace, velocity, zero_temperature_mean
from spherepde.io.output import particle_dataset
from spherepde.base.progress import Progress
from spherepde.model.sampling import initial_particles

from solvers.eulerian import MAX_STEPS_PER_SAVE, WallClock, failure, only, outcomes
from solvers.timegrid import Hooks, Plan, TimeGrid, fixed_steps, integrate
from spherepde.discretisation.timesteppers import EXPLICIT_TABLEAUX, explicit_flow
from spherepde.geometry.sphere import exponential_map, normalise

# Largest block of Gaussian draws made at once per member (bytes).
NOISE_BYTES = 2 ** 26

# ---------------------------------------------------------------------------------------
# The drift: the model's velocity with the empirical measure
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmpiricalMeasure:
    """The particles seen as a quadrature: points x_j with weights 1/n (what DenseExpKernel integrates over)."""

    points: torch.Tensor

    @property
    def dim(self) -> int:
        return self.points.shape[1]

    @property
    def grid_shape(self) -> tuple[int]:
        return (self.points.shape[0],)

    @property
    def weights(self) -> torch.Tensor:
        return torch.full(self.grid_shape, 1 / self.points.shape[0], dtype=self.points.dtype,
                          device=self.points.device)


def hardmax_mean(B: torch.Tensor, points: torch.Tensor, chunk: int | str) -> torch.Tensor:
    """m(x_i) = x_{j*}, j* = argmax_j <x_i, B x_j> = argmax_j <B^T x_i, x_j>, per system: B (S, d, d), points
    (S, n, d) (blocks of `block_rows(chunk)` rows)."""
    rows = block_rows(chunk, points.shape[-2], points.dtype, points.device)
    queries = torch.matmul(points, B)
    index = torch.cat([torch.matmul(queries[:, start:start + rows], points.transpose(-1, -2)).argmax(-1)
                       for start in range(0, points.shape[-2], rows)], dim=-1)
    return torch.gather(points, 1, index[..., None].expand(-1, -1, points.shape[-1]))


def fused_softmax_mean(B: torch.Tensor, beta: torch.Tensor, points: torch.Tensor, chunk: int | str) -> torch.Tensor:
    """m(x_i) = sum_j softmax_j(beta <B^T x_i, x_j>) x_j by fused attention per system (B (S, d, d), beta (S,),
    points (S, n, d)), `block_rows(chunk)` query rows per call."""
    rows = block_rows(chunk, points.shape[-2], points.dtype, points.device)
    queries = beta[:, None, None] * torch.matmul(points, B)
    return torch.cat([F.scaled_dot_product_attention(queries[:, start:start + rows], points, points, scale=1.0)
                      for start in range(0, points.shape[-2], rows)], dim=-2)


# The whole (systems, n, n) kernel of a step is formed at once, without the log-sum-exp shift, while it takes at
# most this many bytes and beta |B^T x| stays below half the exponent range (no sum of n exponentials overflows).
DIRECT_BYTES = 2 ** 26


def can_be_direct(B: torch.Tensor, beta: torch.Tensor, systems: int, n: int) -> bool:
    """Whether `direct_attention` serves these systems (DIRECT_BYTES and the exponent range)."""
    dtype = B.dtype
    reach = float((beta * torch.linalg.matrix_norm(B.double(), ord=2)).max())
    return (systems * n * n * torch.finfo(dtype).bits // 8 <= DIRECT_BYTES
            and reach <= 0.5 * math.log(torch.finfo(dtype).max))


def direct_attention(points: torch.Tensor, coupling: torch.Tensor, softmax: bool):
    """(m, k, Z) of each system's particles x_j (points (S, p, d)) with coupling C = beta B (S, d, d):

        k_ij = exp(<x_i, C x_j>),   Z_i = sum_j k_ij,
        m_i = sum_j k_ij x_j / Z_i  (softmax),   m_i = (1/p) sum_j k_ij x_j  (unnormalized; Z is None),

    the exponential-kernel sums formed whole, without a shift (where can_be_direct says they may be).  The
    kernel k (S, p, p) is returned for the transpose (solvers/particle_adjoint.py).  The sums are formed as
    (x^T k^T)^T: with the d components as rows, MKL's batched product is about twice as fast (d = 2, p = 64)."""
    columns = points.transpose(-1, -2).contiguous()
    kernel = torch.exp(torch.matmul(torch.matmul(points, coupling), columns))
    sums = torch.matmul(columns, kernel.transpose(-1, -2)).transpose(-1, -2)
    if softmax:
        Z = kernel.sum(-1)
        return sums / Z[..., None], kernel, Z
    return sums / points.shape[-2], kernel, None


class SystemKernel:
    """The exponential-kernel sum over each system's particles with weights 1/n_s, where `direct_attention` does
    not serve: channels (S, n_s, c) -> (scaled, log_scale) as the transforms of spherepde.kernels give them
    (model.attention's `exp_kernel`).  beta = 0: the plain sums; else the shifted blocks of
    exp_kernel.dense_exp_kernel."""

    def __init__(self, points: torch.Tensor, B: torch.Tensor, beta: torch.Tensor, chunk: int | str):
        self.points, self.B, self.beta, self.chunk = points, B, beta, chunk

    def __call__(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        f = f / self.points.shape[-2]
        zero = torch.zeros(f.shape[:-1], dtype=f.dtype, device=f.device)
        if not bool(self.beta.any()):  # beta = 0: the constant kernel, every particle sees the plain sum
            return f.sum(-2, keepdim=True).expand_as(f), zero
        return dense_exp_kernel(self.points, self.points, f, self.B, self.beta, self.chunk)


class ParticleField:
    """v[mu_n](x_i) for the members' particles x (M, n, d), W (M, d, d); `attention` is "fused", "dense", "local"
    or "hardmax"; each member's tokens are `replicas` independent systems (module docstring)."""

    def __init__(self, batch: ModelBatch, attention: str, chunk: int | str, replicas: int = 1):
        self.batch, self.attention, self.chunk, self.replicas = batch, attention, chunk, replicas
        self.systems = batch.select([m for m in range(batch.members) for _ in range(replicas)])
        self.coupling = self.systems.beta[:, None, None] * self.systems.B  # C = beta B per system
        self.direct = None  # can_be_direct, found at the first call (it needs n)

    @classmethod
    def from_case(cls, case, batch: ModelBatch) -> "ParticleField":
        solver = case["solver"]
        if solver["field"] == "spectral":
            raise CaseError("solver.field: 'spectral' is not available for particles; use 'dense' or 'auto'")
        if batch.zero_temperature:
            attention = "local" if case["particles"]["beta_inf_mode"] == "mean_field" else "hardmax"
        elif (batch.kernel == "softmax" and bool((batch.beta > 0).all()) and solver["field"] == "auto"
              and batch.B.device.type == "cuda"):
            attention = "fused"
        else:
            attention = "dense"
        return cls(batch, attention, solver["chunk"], case["particles"]["replicas"])

    def _systems(self, x: torch.Tensor) -> torch.Tensor:
        """(M, n, d) -> (M R, n / R, d)."""
        return x.reshape(x.shape[0] * self.replicas, -1, x.shape[-1])

    def mean_field(self, x: torch.Tensor) -> torch.Tensor:
        """m at every particle (M, n, d)."""
        points, systems = self._systems(x), self.systems
        if self.attention == "local":
            m = zero_temperature_mean(systems.B, points)
        elif self.attention == "hardmax":
            m = hardmax_mean(systems.B, points, self.chunk)
        elif self.attention == "fused":
            m = fused_softmax_mean(systems.B, systems.beta, points, self.chunk)
        elif self.is_direct(points):
            m = direct_attention(points, self.coupling, systems.kernel == "softmax")[0]
        else:
            ones = torch.ones(points.shape[:2], dtype=points.dtype, device=points.device)
            m = attention_mean(systems, SystemKernel(points, systems.B, systems.beta, self.chunk), points, ones)
        return m.reshape(x.shape)

    def is_direct(self, points: torch.Tensor) -> bool:
        """Whether the dense attention of these systems' points (S, p, d) is `direct_attention`'s."""
        if self.direct is None:
            self.direct = (self.attention == "dense" and bool((self.systems.beta > 0).all())
                           and can_be_direct(self.systems.B, self.systems.beta, *points.shape[:2]))
        return self.direct

    def __call__(self, x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """v(x_i) = P_x(W x + V m(x)) (M, n, d)."""
        return velocity(self.batch, x, self.mean_field(x), W)


# ---------------------------------------------------------------------------------------
# Steps on the sphere
# ---------------------------------------------------------------------------------------


def noise_variance(eps, tau: float, dim: int):
    """sigma^2 = 2 eps tau (1 - (d - 2) eps tau / 3): the geodesic Gaussian step of weak order 2 (eps a number or
    a tensor of the members' eps)."""
    return 2 * eps * tau * (1 - (dim - 2) * eps * tau / 3)


class Noise:
    """The members' Gaussian draws g ~ N(0, I_d) (M, n, d), one per noise step, from each member's own generator,
    drawn `count` at a time per interval in chunks of at most NOISE_BYTES per member (the chunks depend on n, d
    and the interval only, not on the batch)."""

    def __init__(self, generators: list, shape: tuple, dtype, device):
        self.generators, self.shape, self.dtype, self.device = generators, shape, dtype, device
        self.chunk = max(1, NOISE_BYTES // (math.prod(shape) * torch.finfo(dtype).bits // 8))

    def draws(self, count: int):
        """The next `count` draws of every member, as an iterator of (M, n, d) tensors."""
        done = 0
        while done < count:
            size = min(self.chunk, count - done)
            block = torch.stack([torch.randn((size,) + self.shape, generator=g, dtype=self.dtype, device=self.device)
                                 for g in self.generators], dim=1)
            yield from block.unbind(0)
            done += size


class Integrator:
    """Advances the members' particles over one interval of `steps` equal steps h (see module doc); eps (M,) the
    members' diffusion coefficients (all zero or all positive)."""

    def __init__(self, name: str, field: ParticleField, eps: torch.Tensor):
        self.name, self.field = name, field
        self.eps = eps.reshape(-1, 1, 1)
        self.noisy = bool((eps > 0).any())

    def draw_count(self, steps: int) -> int:
        """Gaussian draws the interval takes: one per step (euler), one more for the split's half steps."""
        if not self.noisy:
            return 0
        return steps if self.name == "euler" else steps + 1

    def gaussian(self, points: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """P_x g: a standard Gaussian in the tangent space at each particle."""
        return tangent_projection(points, g)

    def brownian(self, points: torch.Tensor, tau: float, g: torch.Tensor) -> torch.Tensor:
        """The noise step N(tau): exp_x(sigma P_x g)."""
        sigma = torch.sqrt(noise_variance(self.eps, tau, points.shape[-1]))
        return exponential_map(points, sigma * self.gaussian(points, g))

    def step(self, x: torch.Tensor, W: torch.Tensor, h: float, k: int, steps: int, draws) -> torch.Tensor:
        """Step k of `steps` of an interval; `draws` yields the interval's Gaussian draws in order."""
        if self.name == "euler":
            drift = h * self.field(x, W)
            if not self.noisy:
                return normalise(x + drift)
            return exponential_map(x, drift + torch.sqrt(2 * self.eps * h) * self.gaussian(x, next(draws)))
        flow = EXPLICIT_TABLEAUX[self.name]
        if not self.noisy:
            return explicit_flow(lambda y, offset: self.field(y, W), x, h, flow)
        if k == 0:
            x = self.brownian(x, h / 2, next(draws))
        x = explicit_flow(lambda y, offset: self.field(y, W), x, h, flow)
        return self.brownian(x, self.noise_time(h, k, steps), next(draws))

    @staticmethod
    def noise_time(h: float, k: int, steps: int) -> float:
        """tau of the noise step that ends step k of `steps`: the merged half steps h, a half step at the end."""
        return h if k < steps - 1 else h / 2

    def interval(self, x: torch.Tensor, W: torch.Tensor, h: float, steps: int, noise: Noise | None) -> torch.Tensor:
        draws = noise.draws(self.draw_count(steps)) if noise is not None else iter(())
        for k in range(steps):
            x = self.step(x, W, h, k, steps, draws)
        return x


# ---------------------------------------------------------------------------------------
# Diagnostics: empirical averages with Monte Carlo standard errors
# ---------------------------------------------------------------------------------------

# Above S^2 measures cannot be quantised: w2_projection is exact OT up to this many particles.
EXACT_W2_ABOVE_S2 = 3000


def mean_and_error(values: np.ndarray) -> tuple[float, float]:
    """Empirical mean of a per-particle integrand and its standard error std / sqrt(n)."""
    n = values.shape[0]
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan


def c_transform(points: np.ndarray, atoms: np.ndarray, potential: np.ndarray, block: int = 8192) -> np.ndarray:
    """u(x) = min_j (|x - a_j|^2 - potential_j): a Kantorovich potential extended to any point x.

    |x - a|^2 = |x|^2 + |a|^2 - 2 <x, a> by one matrix product per block (6x faster than forming
    x - a; the cancellation costs ~1e-15 absolute, far below the standard errors this feeds).
    """
    shift = (atoms ** 2).sum(1) - potential
    return np.concatenate([(block_points ** 2).sum(1) + (shift - 2 * block_points @ atoms.T).min(1)
                           for block_points in (points[s:s + block] for s in range(0, points.shape[0], block))])


def empirical_transport(points: np.ndarray, targets: np.ndarray, max_atoms: int):
    """Exact OT (POT emd, chordal cost) between the empirical measures (1/n each) of `points` and `targets`,
    each quantised like diagnostics.quantise above `max_atoms`: (atoms of both, POT's log with the cost and the
    potentials u, v, quantisation bound)."""
    masses = np.full(points.shape[0], 1 / points.shape[0])
    a_points, a, a_bound = diag.quantise(points, masses, max_atoms)
    b_points, b, b_bound = diag.quantise(targets, masses, max_atoms)
    cost = ot.dist(a_points, b_points, metric="sqeuclidean")
    _, log = ot.emd(a / a.sum(), b / b.sum(), cost, numItermax=10_000_000, log=True)
    return a_points, b_points, log, a_bound + b_bound


# A circular rearrangement whose W2 is within this of its dual lower bound is taken as W2 (round-off of the sums
# is ~1e-15 in W2^2, ~sqrt of that in W2); above it the exact solver decides.
CERTIFIED_W2 = 1e-7


def circle_transport(points: np.ndarray, targets: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The circular monotone rearrangement between the empirical measures (1/n each) of n points and n targets
    on S^1, chordal cost: (its cost, a lower bound on the optimal cost, h) with h_i = u(x_i) + v(y_i) at
    dual-feasible Kantorovich potentials (u, v) of that coupling.

    With the angles sorted, theta_(i) and phi_(j), the couplings theta_(i) -> phi_(i + k mod n) cost
        C(k) = (1/n) sum_i (2 - 2 cos(theta_(i) - phi_(i+k))) = 2 - (2/n) Re sum_i conj(z_(i)) w_(i+k),
    z = e^{i theta}, w = e^{i phi},
    a circular cross-correlation: all n shifts by one FFT, O(n log n), where exact OT of the quantised measures
    took 97% of a particle run's time.  For a cost convex in the displacement the best shift is optimal (Delon,
    Salomon & Sobolevski 2010); the chordal cost is concave beyond pi/2, where a plan moving some mass the other
    way round can be cheaper (up to 7% on far-apart vMF samples of 200 points; round-off where no pair moved
    beyond pi/3).  Hence the certificate: potentials u along the coupling's cyclic order (Rockafellar's
    construction for c(x, y) = |x - y|^2, u_(0) = 0, each step between the bounds its two neighbouring pairs
    set, so that the steps close the cycle), then v = u^c, v(y) = min_i c(x_i, y) - u_i, so that u_i + v_j <= c_ij
    for every pair: the dual value mean(u) + mean(v) is a lower bound on the optimal cost, equal to C(k) (to
    ~1e-17) when the coupling is optimal.  The c-transform costs n^2 distance terms in blocks (0.4 s at n = 1e4).
    """
    angle = lambda x: np.arctan2(x[:, 1], x[:, 0])  # noqa: E731
    order_a, order_b = np.argsort(angle(points), kind="stable"), np.argsort(angle(targets), kind="stable")
    sorted_points = points[order_a]
    correlation = np.fft.ifft(np.fft.fft(sorted_points @ np.array([1.0, 1j])).conj()
                              * np.fft.fft(targets[order_b] @ np.array([1.0, 1j])))
    partner = np.roll(order_b, -int(np.argmax(correlation.real)))  # the target paired with the i-th point in order
    chordal = lambda x, y: ((x - y) ** 2).sum(1)  # noqa: E731
    paired = chordal(sorted_points, targets[partner])
    following = np.roll(sorted_points, -1, axis=0)
    # u_(i+1) - u_(i) lies in [lower_i, upper_i] for u_i + v_j <= c_ij on the neighbouring pairs (i+1, partner(i))
    # and (i, partner(i+1)), which for a cost convex in the displacement imply it for all pairs
    upper = chordal(following, targets[partner]) - paired
    lower = np.roll(paired, -1) - chordal(sorted_points, np.roll(targets[partner], -1, axis=0))
    # round the circle the steps must sum to 0: sum(lower) = n (C(k) - C(k + 1)) <= 0 <= n (C(k - 1) - C(k)) =
    # sum(upper) at the best shift k, so one fraction of each interval closes the cycle
    width = (upper - lower).sum()
    fraction = float(np.clip(-lower.sum() / width, 0.0, 1.0)) if width > 0 else 0.0
    u = np.concatenate([[0.0], np.cumsum(lower + fraction * (upper - lower))[:-1]])
    v = c_transform(targets, sorted_points, u, block=1024)
    u_of = np.empty(points.shape[0])
    u_of[order_a] = u
    return float(paired.mean()), float(u.mean() + v.mean()), u_of + v


def paired_transport(points: np.ndarray, targets: np.ndarray, max_atoms: int) -> tuple[float, np.ndarray, float]:
    """(W2^2, h, error bound on W2) of `paired_w2`: on S^1 the certified circular rearrangement, else (or
    where it is not certified) exact OT of the measures quantised above `max_atoms`."""
    if points.shape[1] == 2:
        cost, lower, h = circle_transport(points, targets)
        bound = math.sqrt(max(cost, 0.0)) - math.sqrt(min(max(lower, 0.0), max(cost, 0.0)))
        if bound <= CERTIFIED_W2:
            return cost, h, bound
    a_points, b_points, log, bound = empirical_transport(points, targets, max_atoms)
    h = c_transform(points, b_points, log["v"]) + c_transform(targets, a_points, log["u"])
    return float(log["cost"]), h, bound


def paired_w2(points: np.ndarray, targets: np.ndarray, max_atoms: int) -> tuple[float, float, float]:
    """W2 between the empirical measures of `points` and of `targets` (paired: row i of both is particle i).

    On S^1 the circular monotone rearrangement of all n pairs (`circle_transport`, no quantisation) where its
    dual certifies it to CERTIFIED_W2; elsewhere exact OT (POT emd, chordal cost), each measure quantised like
    diagnostics.quantise above `max_atoms`.
    Standard error by linearisation at the Kantorovich potentials (u, v): W2^2 ~ (1/n) sum_i h_i with
    h_i = u(x_i) + v(y_i) (u, v extended off the atoms by c-transforms), so SE(W2^2) = std(h) / sqrt(n) and
    SE(W2) = SE(W2^2) / (2 W2).  Returns (W2, SE, error bound: quantisation, or the rearrangement's certified
    excess).
    """
    cost, h, bound = paired_transport(points, targets, max_atoms)
    w2 = math.sqrt(max(cost, 0.0))
    _, error = mean_and_error(h)
    return w2, (error / (2 * w2) if w2 > 0 else math.nan), bound


# Halvings averaged by `half_sample_bias` (8 half samples, about the cost of paired_w2 once more): across 40 runs of
# n = 300 at W2 = 0 the estimate's standard deviation was 20-30% of its mean, a third to a half of the standard
# error of W2^2; the verdicts measured in compare._w2_projection_bias include that noise.
HALVINGS = 4


def half_sample_bias(points: np.ndarray, targets: np.ndarray, max_atoms: int, squared: float,
                     halvings: int = HALVINGS) -> float:
    """An estimate of the finite-n bias of the squared paired W2 of `paired_w2`, E W2^2(mu_n, nu_n) - W2^2(mu, nu),
    from the sample itself (Richardson extrapolation over the sample size, a half-sample jackknife); `squared` is
    W2^2(mu_n, nu_n) of all n pairs.

    The empirical measures of n pairs (x_i, y_i) overestimate W2^2 by about c / n (the sampling error of both
    measures has to be transported too: on S^1 E W2^2(mu_n, mu) ~ c / n for a density bounded below), so a half
    sample of m = n / 2 pairs overestimates it by 2 c / n and

        b_n = mean over halves H of W2^2(mu_H, nu_H) - W2^2(mu_n, nu_n)

    has mean c / n.  The halves are `halvings` fixed random partitions of the rows (the same for every run:
    the particles are exchangeable, so any fixed partition is as good as a fresh one), both halves of each.
    Paired rows close to each other (t near 0) make both terms small: the estimate follows the pairing.
    Measured on noisy Kuramoto runs on S^1 (n = 300, 40 seeds): within the seeds' noise of the true bias when
    W2 ~ 0.04-0.26, and 25-35% below it at W2 = 0 (a stationary law, where the bias decays more slowly than
    1 / n at this n); where the rate is slower than 1 / n (S^2: log n / n) the estimate is low by that much.
    """
    if points.shape[0] < 4:
        return math.nan
    halves = []
    for halving in range(halvings):
        order = np.random.default_rng(halving).permutation(points.shape[0])
        halves += [paired_transport(points[half], targets[half], max_atoms)[0] for half in np.array_split(order, 2)]
    return float(np.mean(halves)) - squared


class ParticleRecorder(WallClock):
    """Diagnostics of DESIGN §4 as empirical averages with standard errors, and saved particles.

    Standard errors (`<name>_stderr` in the output), particles.replicas = 1: the i.i.d. formulas
      mean, alignment_E/F, lyapunov: std of the per-particle integrand / sqrt(n) (for
        lyapunov from its second moment, V_{2p} - V_p^2);
      order_parameter |m|: delta method, sqrt(u^T Cov(x) u / n), u = m / |m|;
      w2_projection: linearisation at the Kantorovich potentials (see `paired_w2`), which leaves out the
        upward bias of an empirical W2 (of order 1 / sqrt(n) where W2 is small); its estimate for W2^2,
        `half_sample_bias`, is stored as `w2_projection_squared_bias` for `spherepde compare`;
      interaction_energy: the U-statistic -1/(2 n (n-1)) sum_{i != j} k(x_i, x_j) (unbiased
        for independent particles), SE by Hoeffding's projection: std(g) / sqrt(n) with
        g_i = (1/(n-1)) sum_{j != i} (k(x_i, x_j) + k(x_j, x_i)) / 2;
      mass: exactly 1, SE 0.
    They are exact for independent particles (t = 0) but ignore the correlations the
    interaction builds: where the dynamics amplifies fluctuations they are too small.
    particles.replicas = R > 1 (R independent systems of n / R tokens): batch means, SE =
    std over the R systems of their estimates / sqrt(R), honest at every time (Student t
    with R - 1 degrees of freedom); values from all n tokens, the interaction energy as the
    mean of the R within-system U-statistics.
    entropy needs a density: NaN for particles; free_energy (spherepde.model.energy) is its interaction part U
    when eps = 0, NaN otherwise.
    """

    def __init__(self, case, model: Model, field: ParticleField, x0: torch.Tensor, controlled: bool = False):
        self.case, self.model, self.field, self.controlled = case, model, field, controlled
        host = lambda matrix: matrix.cpu().double().numpy()  # noqa: E731
        self.subspace_E = principal_subspace(host(model.V @ model.B.T))
        self.subspace_F = principal_subspace(host(model.V))
        self.lyapunov_p = list(case["diagnostics"]["lyapunov_p"])
        self.want_w2, self.w2_atoms = case["diagnostics"]["w2"], case["diagnostics"]["w2_atoms"]
        self.replicas = case["particles"]["replicas"]
        self.projected_0 = None
        if self.subspace_E is not None:
            self.projected_0 = diag.projection(x0.cpu().double().numpy(), self.subspace_E)
        self.saved = case["particles"]["save"]
        self.times, self.rows, self.positions, self.notes = [], [], [], []
        super().__init__()
        self.steps, self.dt, self.w2_error_bound = 0, math.nan, 0.0
        self.batch_members = field.batch.members

    def record(self, t: float, x: torch.Tensor) -> dict:
        points = x.cpu().double().numpy()
        replicas = self.replicas
        row, errors = self.estimates(points, x, self.projected_0, energy=replicas == 1)
        if replicas > 1:
            projected = [None] * replicas if self.projected_0 is None else np.split(self.projected_0, replicas)
            systems = [self.estimates(*block, energy=True)[0]
                       for block in zip(np.split(points, replicas), x.split(len(x) // replicas), projected)]
            for name in ("interaction_energy", "free_energy"):
                row[name] = np.mean([system[name] for system in systems])
            with np.errstate(invalid="ignore"):
                spread = {name: np.std([system[name] for system in systems], axis=0, ddof=1) / math.sqrt(replicas)
                          for name in row}
            # no standard error where the integrand has infinite variance (see _lyapunov)
            spread["lyapunov"] = np.where(np.isnan(errors["lyapunov"]), np.nan, spread["lyapunov"])
            errors = spread
        row.update({f"{name}_stderr": value for name, value in errors.items()})
        row["w2_projection_squared_bias"] = self._w2_projection_squared_bias(points, row["w2_projection"])
        self.times.append(t)
        self.rows.append(row)
        if self.saved:
            self.positions.append(points[:self.saved])
        return row

    def estimates(self, points: np.ndarray, x: torch.Tensor, projected_0: np.ndarray | None,
                  energy: bool) -> tuple[dict, dict]:
        """Every diagnostic of the particles `points` (the rows of x) and its i.i.d. standard error."""
        n = points.shape[0]
        masses = np.full(n, 1 / n)
        row, errors = {"mass": float(masses.sum())}, {"mass": 0.0}
        m = diag.mean(points, masses)
        row["mean"], errors["mean"] = m, points.std(0, ddof=1) / math.sqrt(n)
        r = float(np.linalg.norm(m))
        row["order_parameter"] = r
        direction = m / r if r > 0 else np.zeros_like(m)
        errors["order_parameter"] = mean_and_error(points @ direction)[1]
        for name, subspace in (("alignment_E", self.subspace_E), ("alignment_F", self.subspace_F)):
            if subspace is None:
                row[name], errors[name] = math.nan, math.nan
            else:
                row[name], errors[name] = mean_and_error(diag.projected_norm_squared(points, subspace))
        row["lyapunov"], errors["lyapunov"] = self._lyapunov(points, masses)
        row["w2_projection"], errors["w2_projection"] = self._w2_projection(points, projected_0)
        row["interaction_energy"], errors["interaction_energy"] = (self._interaction_energy(x) if energy
                                                                   else (math.nan, math.nan))
        row["entropy"], errors["entropy"] = math.nan, math.nan
        free_energy = FreeEnergy.of_model(self.model, self.controlled)
        if self.model.eps == 0:
            row["free_energy"] = free_energy(math.nan, row["interaction_energy"], m)
            errors["free_energy"] = free_energy.interaction_stderr(errors["interaction_energy"], points)
        else:
            row["free_energy"], errors["free_energy"] = math.nan, math.nan
        return row, errors

    def _lyapunov(self, points: np.ndarray, masses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """V_p and its standard error sqrt((V_{2p} - V_p^2) / (n - 1)).

        Near {P_E x = 0}, of codimension k = dim E, the integrand grows like dist^{-2p}: its
        variance is infinite for p >= k / 4 whenever rho charges that set, and no standard
        error exists there (NaN, with a note).
        """
        values = np.array([diag.lyapunov(points, masses, self.subspace_E, p) for p in self.lyapunov_p])
        second = np.array([diag.lyapunov(points, masses, self.subspace_E, 2 * p) for p in self.lyapunov_p])
        with np.errstate(invalid="ignore"):
            errors = np.sqrt(np.maximum(second - values ** 2, 0) / (points.shape[0] - 1))
        if self.subspace_E is not None and self.subspace_E.shape[1] < points.shape[1]:
            k = self.subspace_E.shape[1]
            infinite = np.array(self.lyapunov_p) >= k / 4
            errors[infinite] = np.nan
            note = f"lyapunov_stderr is NaN for p >= dim(E) / 4 = {k / 4:g}: the integrand has infinite variance there"
            if infinite.any() and note not in self.notes:
                self.notes.append(note)
        return values, errors

    def _w2_atoms(self, points: np.ndarray) -> int:
        """diagnostics.w2_atoms, or all the particles above S^2 (no quantisation there: exact OT)."""
        return points.shape[0] if points.shape[1] > 3 and points.shape[0] > self.w2_atoms else self.w2_atoms

    def _w2_projection(self, points: np.ndarray, projected_0: np.ndarray | None) -> tuple[float, float]:
        if not self.want_w2 or projected_0 is None:
            return math.nan, math.nan
        if points.shape[1] > 3 and points.shape[0] > max(self.w2_atoms, EXACT_W2_ABOVE_S2):
            note = (f"w2_projection not computed: {points.shape[0]} particles on S^{points.shape[1] - 1} exceed "
                    f"both diagnostics.w2_atoms and {EXACT_W2_ABOVE_S2} (exact OT; no quantisation above S^2)")
            if note not in self.notes:
                self.notes.append(note)
            return math.nan, math.nan
        value, error, bound = paired_w2(points, projected_0, self._w2_atoms(points))
        self.w2_error_bound = max(self.w2_error_bound, bound)
        return value, error

    def _w2_projection_squared_bias(self, points: np.ndarray, value: float) -> float:
        """`half_sample_bias` of the w2_projection `value` of all the particles (NaN where it is NaN); with
        replicas too, the bias of the value from all n tokens (the systems are independent of each other)."""
        if math.isnan(value):
            return math.nan
        return half_sample_bias(points, self.projected_0, self._w2_atoms(points), value ** 2)

    def _interaction_energy(self, x: torch.Tensor) -> tuple[float, float]:
        """-1/2 times the U-statistic of k(x, y) = exp(beta <x, B y>), and its standard error.

        Hoeffding: Var(U) ~ 4 Var(h(X)) / n with h(x) = E (k(x, Y) + k(Y, x)) / 2, estimated by
        g_i = (1/(n-1)) sum_{j != i} (k(x_i, x_j) + k(x_j, x_i)) / 2 (row and column sums of the kernel).
        """
        model, n = self.model, x.shape[0]
        if model.zero_temperature:
            return -math.inf, math.nan
        if n < 2:
            return math.nan, math.nan
        ones = torch.ones(n, 1, dtype=x.dtype, device=x.device)
        measure = EmpiricalMeasure(x)
        transposes = [model.B] if bool((model.B == model.B.T).all()) else [model.B, model.B.T]
        sums = [DenseExpKernel(measure, C, model.beta, self.field.chunk)(ones) for C in transposes]
        shift = max(float(log_scale.max()) for _, log_scale in sums)
        # (1/n) sum_j k(x_i, x_j) = exp(log_scale_i) scaled_i; the same with B^T gives the column sums.
        off_diagonal = sum(n * scaled[:, 0] * torch.exp(log_scale - shift) for scaled, log_scale in sums) / len(sums)
        off_diagonal = off_diagonal - torch.exp(model.beta * ((x @ model.B) * x).sum(1) - shift)
        value, error = mean_and_error((off_diagonal / (n - 1)).cpu().double().numpy())
        with np.errstate(over="ignore"):
            return float(-0.5 * value * np.exp(shift)), float(error * np.exp(shift))

    def dataset(self, status: str):
        return particle_dataset(self, status)


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def fixed_step(case) -> float | None:
    """particles.dt, else time.dt, else None (the CFL rule at every interval's start)."""
    return case["particles"].get("dt", case["time"].get("dt"))


def step_plan(case, field: ParticleField, interval, x: torch.Tensor, W: torch.Tensor) -> Plan:
    """Equal steps no longer than `fixed_step`, else than the Eulerian CFL rule dt = cfl / (lmax max|v|) with each
    member's largest particle speed at the interval's start; a member asking for more than MAX_STEPS_PER_SAVE
    steps is stopped."""
    members = x.shape[0]
    dt = fixed_step(case)
    if dt is not None:
        steps = np.full(members, fixed_steps(interval, dt))
        return Plan(interval, steps, interval.length / steps)
    speeds = torch.linalg.vector_norm(field(x, W), dim=-1).flatten(1).amax(1).cpu().double().numpy()
    steps, stopped = np.ones(members, dtype=np.int64), {}
    for m, speed in enumerate(speeds):
        bound = interval.length if speed == 0 else min(interval.length, case["time"]["cfl"] / (case["sphere"]["lmax"]
                                                                                              * speed))
        if not interval.length / bound <= MAX_STEPS_PER_SAVE:
            stopped[m] = (f"the CFL rule asks for steps of {bound:.3g} at t = {interval.t0:.6g}: too many (more than "
                          f"{MAX_STEPS_PER_SAVE:.0e}) before the next save")
        else:
            steps[m] = max(1, math.ceil(interval.length / bound - 1e-9))
    return Plan(interval, steps, interval.length / steps, stopped)


def initial_state(case, placement, seed: int | None = None) -> tuple[torch.Tensor, int]:
    """(x_0, noise seed): particles.n draws from the [initial] measure by a CPU generator seeded with
    `seed` (None: particles.seed), then the seed of the noise generator drawn from the same generator."""
    section = case["particles"]
    sampler = torch.Generator().manual_seed(section["seed"] if seed is None else seed)
    x = initial_particles(case["initial"], case.dim, section["n"], sampler, placement.real).to(placement.device)
    return x, int(torch.randint(2 ** 62, (1,), generator=sampler))


def check_noise_step(case, eps: float, dt: float) -> None:
    """Refuse a step beyond the expansion of the weak-order-2 noise step: (d - 2) eps dt / 3 >= 1/2."""
    if eps > 0 and case["particles"]["integrator"] != "euler" and (case.dim - 2) * eps * dt / 3 >= 0.5:
        raise CaseError(f"particles.dt: a step of {dt:.3g} is too long for the weak-order-2 noise step "
                        f"(needs (d - 2) eps dt / 3 < 1/2, i.e. dt < {1.5 / ((case.dim - 2) * eps):.3g})")


class ParticleSystem:
    """The particle systems of the members `cases` (one case or a list sharing sphere.dim, particles.n,
    particles.replicas, the integrator, the solver's device, dtype and attention, and a fixed step or one member
    only): model, drift, integrator, initial draws and noise generators."""

    def __init__(self, cases):
        cases = [cases] if not isinstance(cases, (list, tuple)) else list(cases)
        self.cases, self.case = cases, cases[0]
        if len(cases) > 1 and fixed_step(self.case) is None:
            raise ValueError("ParticleSystem: members stepped by the CFL rule take their own steps; run them alone")
        solver = self.case["solver"]
        self.placement = make_placement(solver["device"], solver["dtype"])
        self.batch = ModelBatch.of([Model.from_case(member, self.placement) for member in cases])
        self.field = ParticleField.from_case(self.case, self.batch)
        self.integrator = Integrator(self.case["particles"]["integrator"], self.field, self.batch.eps)
        draws = [initial_state(member, self.placement) for member in cases]
        self.x0 = torch.stack([x for x, _ in draws])
        self.noise_seeds = [seed for _, seed in draws]

    @property
    def members(self) -> int:
        return len(self.cases)

    def noise(self, seeds: list | None = None) -> Noise:
        """Fresh noise generators seeded with the members' noise seeds (or `seeds`)."""
        generators = [torch.Generator(self.placement.device).manual_seed(seed) for seed in seeds or self.noise_seeds]
        return Noise(generators, tuple(self.x0.shape[1:]), self.placement.real, self.placement.device)

    def check_steps(self, plan: Plan) -> None:
        for member, model in zip(self.cases, self.batch.models):
            check_noise_step(member, model.eps, float(plan.dt.max()))


class ParticleHooks(Hooks):
    """The particle run's saves (one ParticleRecorder per member), failures and progress."""

    def __init__(self, recorders: list, bar: Progress):
        self.recorders, self.bar = recorders, bar
        self.failures = {}

    def stop(self, member: int, reason: str, plan: Plan) -> None:
        self.failures[member] = failure(self.recorders[member], reason)

    def at_knot(self, plan: Plan, x: torch.Tensor) -> list:
        interval, stopped, row = plan.interval, [], None
        finite = torch.isfinite(x).flatten(1).all(1).tolist()
        for m, recorder in enumerate(self.recorders):
            if m in self.failures:
                continue
            recorder.steps += int(plan.steps[m])
            recorder.dt = float(plan.dt[m])
            if not finite[m]:
                self.failures[m] = failure(recorder, f"a particle position became non-finite between "
                                                     f"t = {interval.t0:.6g} and {interval.t1:.6g}")
                stopped.append(m)
            elif interval.save:
                row = recorder.record(interval.t1, x[m])
        if row is not None and len(self.recorders) == 1:
            self.bar.update(interval.t1, dt=float(plan.dt[0]), order_parameter=row["order_parameter"])
        return stopped


def run_members(system: ParticleSystem, progress: bool | None = None, controls: torch.Tensor | None = None,
                grid: TimeGrid | None = None) -> list:
    """Integrate the members' particle systems; per member its Dataset, or the NumericalFailure that stopped it
    (carrying its dataset up to its last good save).  `controls` (M, L, d, d) with `grid` (a TimeGrid of L layers):
    W_t of every layer (a trained run); else each member's model.W throughout."""
    case, timing = system.case, system.case["time"]
    grid = grid or TimeGrid(timing["t_end"], timing["save_every"])
    layered = controls if controls is not None else system.batch.W[:, None]
    x = system.x0
    recorders = [ParticleRecorder(member, model, system.field, x[m], controls is not None)
                 for m, (member, model) in enumerate(zip(system.cases, system.batch.models))]
    for m, recorder in enumerate(recorders):
        recorder.record(0.0, x[m])
    bar = Progress(timing["t_end"], enabled=progress)
    hooks = ParticleHooks(recorders, bar)
    noise, current = system.noise(), {}

    def plan_of(interval, state):
        plan = step_plan(case, system.field, interval, state, layered[:, interval.layer])
        system.check_steps(plan)
        return plan

    def begin(plan):
        steps = int(plan.steps.max())
        current.update(W=layered[:, plan.interval.layer], h=float(plan.dt[0]), steps=steps, k=0,
                       draws=noise.draws(system.integrator.draw_count(steps)))

    def step(state):
        k, current["k"] = current["k"], current["k"] + 1
        return system.integrator.step(state, current["W"], current["h"], k, current["steps"], current["draws"])

    for recorder in recorders:
        recorder.start_clock()
    with torch.no_grad():
        integrate(grid, x, plan_of, begin, step, hooks, timing.get("max_steps"))
    bar.close()
    return outcomes(recorders, hooks.failures)


def run_particles(case, progress: bool | None = None):
    """Integrate the particle system of `case`; returns the output xarray.Dataset (DESIGN §6).

    Raises NumericalFailure (with `.dataset`, the run up to its last good save) when a
    particle position stops being finite.
    """
    return only(run_members(ParticleSystem(case), progress))
