"""The reference particle solver: n tokens on S^{d-1} (any d >= 2) for the model of DESIGN §2, for M members at once.

    dX_i = v[mu_n](X_i, t) dt + sqrt(2 eps) dB_i,    mu_n = (1/n) sum_j delta_{X_j},

with B_i independent Brownian motions on the sphere (generator eps Lap).  The drift is the same
model as the Eulerian solver's, with the empirical measure in place of rho (solvers/particle_field.py).

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

import numpy as np
import torch

from spherepde.measures import diagnostics as diag
from spherepde.measures.sample_statistics import half_sample_bias, mean_and_error, paired_w2
from spherepde.geometry.ambient import tangent_projection
from spherepde.base.device import placement as make_placement
from spherepde.model.energy import FreeEnergy
from spherepde.base.errors import CaseError
from spherepde.kernels.exp_kernel import DenseExpKernel
from spherepde.model.attention import Model, ModelBatch, principal_subspace
from spherepde.io.output import particle_dataset
from spherepde.base.progress import Progress
from spherepde.model.sampling import initial_particles

from solvers.eulerian import MAX_STEPS_PER_SAVE, only, outcomes
from solvers.particle_field import EmpiricalMeasure, ParticleField
from solvers.records import RunRecord
from solvers.timegrid import Hooks, Plan, TimeGrid, fixed_steps, integrate
from spherepde.discretisation.timesteppers import EXPLICIT_TABLEAUX, explicit_flow
from spherepde.geometry.sphere import exponential_map, normalise

# Largest block of Gaussian draws made at once per member (bytes).
NOISE_BYTES = 2 ** 26

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


class ParticleRecorder(RunRecord):
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
        super().__init__(case)
        self.model, self.field, self.controlled = model, field, controlled
        host = lambda matrix: matrix.cpu().double().numpy()  # noqa: E731
        self.subspace_E = principal_subspace(host(model.V @ model.B.T))
        self.subspace_F = principal_subspace(host(model.V))
        self.want_w2, self.w2_atoms = case["diagnostics"]["w2"], case["diagnostics"]["w2_atoms"]
        self.replicas = case["particles"]["replicas"]
        self.projected_0 = None
        if self.subspace_E is not None:
            self.projected_0 = diag.projection(x0.cpu().double().numpy(), self.subspace_E)
        self.saved = case["particles"]["save"]
        self.positions = []
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
        section = self.case["particles"]
        attrs = {
            "solver": "particles",
            "n": section["n"],
            "seed": section["seed"],
            "integrator": section["integrator"],
            "attention": self.field.attention,
            "dt": float(self.dt),
            "steps": int(self.steps),
            "dtype": str(self.model.B.dtype).removeprefix("torch."),
            "device": str(self.model.B.device),
            "wall_seconds": float(self.wall_seconds),
            "batch_members": int(self.batch_members),
            "w2_quantisation_bound": float(self.w2_error_bound),
            "replicas": section["replicas"],
            "stderr": ("Monte Carlo standard errors: i.i.d. formulas (std / sqrt(n) of per-particle integrands; "
                       "delta method for order_parameter and w2_projection; Hoeffding projection for the "
                       "interaction_energy U-statistic), blind to the correlations the interaction builds"
                       if section["replicas"] == 1 else
                       f"Monte Carlo standard errors by batch means over {section['replicas']} independent systems"),
            "notes": "\n".join(self.notes),
        }
        return particle_dataset(self.saves(status, attrs, positions=self.positions))


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
        self.failures[member] = self.recorders[member].failure(reason)

    def at_knot(self, plan: Plan, x: torch.Tensor) -> list:
        interval, stopped, row = plan.interval, [], None
        finite = torch.isfinite(x).flatten(1).all(1).tolist()
        for m, recorder in enumerate(self.recorders):
            if m in self.failures:
                continue
            recorder.steps += int(plan.steps[m])
            recorder.dt = float(plan.dt[m])
            if not finite[m]:
                self.failures[m] = recorder.failure(f"a particle position became non-finite between "
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
