"""The reference particle solver: n tokens on S^{d-1} (any d >= 2) for the model of docs/design.md "The model", for M
members at once.

    dX_i = v[mu_n](X_i, t) dt + sqrt(2 eps) dB_i,    mu_n = (1/n) sum_j delta_{X_j},

with B_i independent Brownian motions on the sphere (generator eps Lap).  The drift is the same
model as the Eulerian solver's, with the empirical measure in place of rho (solvers/particle_field.py).

Systems.  The state is x (M, n, d): M members (a batch: seeds, initial laws, models of one sweep), each of
n tokens in `particles.replicas` = R independent systems of n / R consecutive tokens: the drift sees
M R systems of n / R tokens, one batched tensor program (a token attends to its own system only).  Where the
field is the direct dense attention (ParticleField.is_direct: finite beta; in a training, or on CUDA, small
systems), a step is the array program of solvers/particle_step.py (numpy on the CPU, torch elsewhere), whose
transpose the training's backward pass takes (solvers/particle_adjoint.py); else the steps below are taken with
ParticleField's torch sums.

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

The model beyond the seeds (spherepde.model.parameters.layout_of(case) not Layout.seeds_model: several heads,
B and V per layer, a two-layer feed-forward): the drift is solvers/particle_field.py's HeadsField, driven on
layer l by the members' parameters theta_l (M, p) (parameters_of) where the seeds' model takes W_l; the
integrators, their noise and the draws are the same.

Randomness: per member one CPU torch.Generator seeded with its particles.seed draws the initial sample and
then the seed of the member's noise generator (on the run's device).  The Gaussian draws of an interval
between knots are made together, in chunks of at most NOISE_BYTES (`Noise`), so a member's draws do not
depend on the batch it runs in: a batched member is its serial run bit for bit on the CPU.
"""

import math

import numpy as np
import torch

from solvers.eulerian import MAX_STEPS_PER_SAVE, only, outcomes
from solvers.forward_problem import check_kernel_range
from solvers.particle_field import HeadsField, ParticleField
from solvers.particle_recorder import ParticleRecorder
from solvers.particle_step import DirectStep, noise_time, noise_variance
from solvers.timegrid import Hooks, Plan, TimeGrid, check_max_steps, fixed_steps, integrate, show_step
from spherepde.base.device import placement as make_placement
from spherepde.base.errors import CaseError
from spherepde.base.garbage import freeze_setup
from spherepde.base.progress import Progress
from spherepde.discretisation.timesteppers import EXPLICIT_TABLEAUX, explicit_flow
from spherepde.geometry.ambient import tangent_projection
from spherepde.geometry.sphere import exponential_map, normalise
from spherepde.model.attention import Model, ModelBatch
from spherepde.model.parameters import Layout, layout_of, parameters_of
from spherepde.model.sampling import initial_particles

# Largest block of Gaussian draws made at once per member (bytes).
NOISE_BYTES = 2 ** 26

# ---------------------------------------------------------------------------------------
# Steps on the sphere
# ---------------------------------------------------------------------------------------


class Noise:
    """The members' Gaussian draws g ~ N(0, I_d) (M, n, d), one per noise step, from each member's own generator,
    drawn `count` at a time per interval in chunks of at most NOISE_BYTES per member (the chunks depend on n, d
    and the interval only, not on the batch).  They are drawn in float64 and cast, so that a float32 run follows
    the float64 run's Brownian path (torch's float32 draws are another sequence: positions differed by O(1))."""

    def __init__(self, generators: list, shape: tuple, dtype, device):
        self.generators, self.shape, self.dtype, self.device = generators, shape, dtype, device
        self.chunk = max(1, NOISE_BYTES // (math.prod(shape) * 8))

    def blocks(self, count: int):
        """The next `count` draws of every member, as an iterator of (size, M, n, d) tensors: the chunks."""
        done = 0
        while done < count:
            size = min(self.chunk, count - done)
            yield torch.stack([torch.randn((size,) + self.shape, generator=g, dtype=torch.float64,
                                           device=self.device).to(self.dtype) for g in self.generators], dim=1)
            done += size

    def draws(self, count: int):
        """The next `count` draws of every member, as an iterator of (M, n, d) tensors."""
        for block in self.blocks(count):
            yield from block.unbind(0)


class Integrator:
    """Advances the members' particles over one interval of `steps` equal steps h (see module doc); eps (M,) the
    members' diffusion coefficients (all zero or all positive)."""

    def __init__(self, name: str, field: ParticleField, eps: torch.Tensor):
        self.name, self.field = name, field
        self.eps = eps.reshape(-1, 1, 1)
        self.noisy = bool((eps > 0).any())
        self.program = None  # the DirectStep where the field is the direct dense attention, found at the first step

    def direct_step(self, x: torch.Tensor) -> DirectStep | None:
        """The array program of the step (solvers/particle_step.py) where the field is the direct dense attention
        (ParticleField.is_direct at particles like x), else None."""
        if self.program is None and self.field.is_direct(self.field._systems(x)):
            self.program = DirectStep(self.name, self.noisy, self.field, x.shape[1] // self.field.replicas)
        return self.program

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
        program = self.direct_step(x)
        if program is not None:
            return program.step(x, W, h, k, steps, draws)
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
        return self.brownian(x, noise_time(h, k, steps), next(draws))

    def interval(self, x: torch.Tensor, W: torch.Tensor, h: float, steps: int, noise: Noise | None) -> torch.Tensor:
        draws = noise.draws(self.draw_count(steps)) if noise is not None else iter(())
        for k in range(steps):
            x = self.step(x, W, h, k, steps, draws)
        return x


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def fixed_step(case) -> float | None:
    """particles.dt, else time.dt, else None (the CFL rule at every interval's start)."""
    return case["particles"].get("dt", case["time"].get("dt"))


def step_key(case) -> str:
    """The case key that sets a particle run's steps (`fixed_step`), for its messages."""
    if "dt" in case["particles"]:
        return "particles.dt"
    return "time.dt" if "dt" in case["time"] else "time.cfl"


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
        # the rule reads the drift only: a step the noise step cannot take (its drift spent, a whole save interval)
        # is halved below that step's bound
        bound = min(interval.length, noise_step_limit(case, field.batch.models[m].eps) / 2)
        if speed > 0:
            bound = min(bound, case["time"]["cfl"] / (case["sphere"]["lmax"] * speed))
        if not interval.length / bound <= MAX_STEPS_PER_SAVE:
            stopped[m] = (f"the CFL rule asks for steps of {bound:.3g} at t = {interval.t0:.6g}: too many (more than "
                          f"{MAX_STEPS_PER_SAVE:.0e}) before the next save")
        else:
            steps[m] = max(1, math.ceil(interval.length / bound - 1e-9))
    return Plan(interval, steps, interval.length / steps, stopped)


# The drift contracting along a step at a rate lambda with h lambda >= 2 is beyond the stability of the integrators
# on the negative real axis (Euler's 1 - z and Heun's 1 - z + z^2 / 2 reach 1 in modulus at z = 2, RK4's R(-z) at
# 2.79): such a mode grows where it should decay.
STIFF_STEP = 2.0
# Steps taken between two measures of `contraction_number` at least (at the start of an interval between knots): its
# two drift evaluations then cost at most a twentieth of the steps' (Heun), where a check at every save cost 60%
# more in a run saving at every step.
CONTRACTION_EVERY = 10


def contraction_rate(a: torch.Tensor, b: torch.Tensor, v_a: torch.Tensor, v_b: torch.Tensor) -> np.ndarray:
    """Per member, -<v_b - v_a, b - a> / |b - a|^2, the sums over all its tokens: the rate at which the drift v
    contracts from the tokens a to the tokens b (M, n, d), the mean of its Jacobian's Rayleigh quotient along the
    chord; 0 where a = b."""
    along = ((v_b - v_a) * (b - a)).flatten(1).sum(1)
    moved = (b - a).square().flatten(1).sum(1)
    return torch.where(moved > 0, -along / torch.where(moved > 0, moved, 1), 0).cpu().double().numpy()


def step_chord(field: ParticleField, x: torch.Tensor, W: torch.Tensor, h: np.ndarray) -> tuple:
    """(y, v(x)) with y = normalise(x + h v(x)), one explicit step's end; h (M,) the members' steps."""
    v = field(x, W)
    return normalise(x + torch.as_tensor(h, dtype=x.dtype, device=x.device).reshape(-1, *[1] * (x.dim() - 1)) * v), v


def contraction_number(field: ParticleField, x: torch.Tensor, W: torch.Tensor, h: np.ndarray) -> np.ndarray:
    """Per member, z = h `contraction_rate` from x to y = `step_chord`: h times the rate at which the drift contracts
    along one step, the Rayleigh quotient of its Jacobian J in the flow's direction to O(h).  That lies in J's
    numerical range, so for a normal J some mode contracts at least as fast; modes across the flow are not seen.
    z >= STIFF_STEP shows the step too long, a smaller z proves nothing.  0 where nothing moves; h (M,) the members'
    steps."""
    y, v = step_chord(field, x, W, h)
    return h * contraction_rate(x, y, v, field(y, W))


# Points along a step at which `contraction_within_step` measures the drift's rate, each over a chord of
# 1 / PROBE_POINTS ** 2 of the step: at seed003-baseline-beta1000's two clusters (dt = 0.01, t = 10-18) the rate over
# the step reads 200-340, at 4 points 527-991, and the drift's rate at the clusters' equilibrium is beta = 1000.
PROBE_POINTS = 16


def contraction_within_step(field: ParticleField, x: torch.Tensor, W: torch.Tensor, h: np.ndarray) -> np.ndarray:
    """Per member, the largest `contraction_rate` over short chords about PROBE_POINTS points of the step from x to
    y = `step_chord`: a lower bound of the contraction within the step, which the rate over the whole step
    (`contraction_number` / h, a mean) can miss many times over.  Where an explicit step is too long for a
    contraction that turns the drift round within a short distance (the softmax's weights at a large beta), the
    tokens stall on either side of the turn with v(y) = -v(x), and the rate over the step reads 2 / h whatever h."""
    y, _ = step_chord(field, x, W, h)
    half_chord = (y - x) / (2 * PROBE_POINTS ** 2)
    rates = []
    for k in range(PROBE_POINTS):
        middle = x + (k + 0.5) / PROBE_POINTS * (y - x)
        a, b = normalise(middle - half_chord), normalise(middle + half_chord)
        rates.append(contraction_rate(a, b, field(a, W), field(b, W)))
    return np.max(rates, axis=0)


def initial_state(case, placement, seed: int | None = None) -> tuple[torch.Tensor, int]:
    """(x_0, noise seed): particles.n draws from the [initial] measure by a CPU generator seeded with
    `seed` (None: particles.seed), then the seed of the noise generator drawn from the same generator."""
    section = case["particles"]
    sampler = torch.Generator().manual_seed(section["seed"] if seed is None else seed)
    x = initial_particles(case["initial"], case.dim, section["n"], sampler, placement.real).to(placement.device)
    return x, int(torch.randint(2 ** 62, (1,), generator=sampler))


def noise_step_limit(case, eps: float) -> float:
    """The steps the weak-order-2 noise step takes are shorter than this: (d - 2) eps dt / 3 < 1/2 (inf without
    noise, on S^1, or with the Euler-Maruyama step)."""
    if eps > 0 and case["particles"]["integrator"] != "euler" and case.dim > 2:
        return 1.5 / ((case.dim - 2) * eps)
    return math.inf


def check_noise_step(case, eps: float, dt: float) -> None:
    """Refuse a step beyond the expansion of the weak-order-2 noise step (`noise_step_limit`)."""
    limit = noise_step_limit(case, eps)
    if dt >= limit:
        raise CaseError(f"{step_key(case)}: a step of {dt:.3g} is too long for the weak-order-2 noise step "
                        f"(needs (d - 2) eps dt / 3 < 1/2, i.e. dt < {limit:.3g})")


def check_fixed_noise_step(case) -> None:
    """`check_noise_step` of a member stepped by a fixed step, from its case alone (a sweep checks every member so
    before any runs): the longest step its intervals take."""
    dt = fixed_step(case)
    if dt is not None:
        longest = max(interval.length / fixed_steps(interval, dt) for interval in TimeGrid.from_case(case).intervals)
        check_noise_step(case, float(case["model"]["eps"]), longest)


def check_drift_choices(case, general: bool | None = None) -> None:
    """ParticleSystem's refusals of a member's drift, from its case alone (a sweep checks every member so before any
    runs): the spectral field, and the hardmax at beta = inf beyond the seeds' model (`general`: the member is
    stepped the general way; None: where it is not on the seeds' paths, `on_seeds_paths`)."""
    if case["solver"]["field"] == "spectral":
        raise CaseError("solver.field: 'spectral' is not available for particles; use 'dense' or 'auto'")
    if case["particles"]["beta_inf_mode"] != "hardmax":
        return
    layout = layout_of(case)
    if general is None:  # in the run's dtype, as ParticleSystem tells it
        host = make_placement("cpu", case["solver"]["dtype"])
        general = not on_seeds_paths(layout, parameters_of(case, layout, host))
    if general and any(head.zero_temperature for head in layout.heads):
        raise CaseError("particles.beta_inf_mode: 'hardmax' is available for the seeds' model only (one head, "
                        "linear feed-forward, B and V constant); use 'mean_field'")


def head_model(case, layout: Layout, theta: torch.Tensor) -> Model:
    """The Model of head 0 on the first layer of theta (L, p) (W there, zero for the two-layer feed-forward):
    the seeds' model of a member whose layers repeat one theta_l, else what the recorder's diagnostics read
    (the alignment subspaces of V B^T and V, the interaction energy's kernel) and the member's eps."""
    parts = layout.unpack(theta[0])
    W = parts["W"] if layout.hidden == 0 else torch.zeros_like(parts["B"][0])
    head = layout.heads[0]
    return Model(head.kernel, head.beta, parts["B"][0], parts["V"][0], W, float(case["model"]["eps"]))


def on_seeds_paths(layout: Layout, theta: torch.Tensor) -> bool:
    """Whether a member is the seeds' model (one head, a linear feed-forward, B and V not trained) with the same
    parameters on every layer (theta (L, p)) but a training's W, its control (which may start per layer):
    Layout.seeds_model, or a case whose per-layer lists repeat one matrix.  Such a member takes the seeds' paths
    (ParticleField, the direct step and its by-hand transpose) with one layer, so that its run is the plain case's
    bit for bit."""
    if layout.hidden or not set(layout.train) <= {"W"} or not layout.one_fixed_head(theta):
        return False
    W = layout.unpack(theta)["W"]
    return "W" in layout.train or bool((W == W[:1]).all())


class ParticleSystem:
    """The particle systems of the members `cases` (one case or a list sharing sphere.dim, particles.n,
    particles.replicas, the integrator, the solver's device, dtype and attention, and a fixed step or one member
    only): model, drift, integrator, initial draws and noise generators.

    `general`: step the model beyond the seeds' way (HeadsField driven by theta_l); None: where a member is not on
    the seeds' paths (`on_seeds_paths`).  `drives` (M, L, ...) is every layer's drive: W (M, 1, d, d) on the
    seeds' paths, theta (M, L, p) (parameters_of, L = model_layers) on the general one."""

    def __init__(self, cases, general: bool | None = None):
        cases = [cases] if not isinstance(cases, (list, tuple)) else list(cases)
        self.cases, self.case = cases, cases[0]
        freeze_setup()  # full garbage collections skip what exists now (spherepde/base/garbage.py)
        if len(cases) > 1 and fixed_step(self.case) is None:
            raise ValueError("ParticleSystem: members stepped by the CFL rule take their own steps; run them alone")
        if len({(member.dim, member["particles"]["n"], member["particles"]["replicas"]) for member in cases}) > 1:
            raise ValueError("ParticleSystem: members must share sphere.dim, particles.n and particles.replicas")
        solver = self.case["solver"]
        for member in cases:
            check_kernel_range(member)
        self.placement = make_placement(solver["device"], solver["dtype"])
        self.layouts = [layout_of(member) for member in cases]
        thetas = [parameters_of(member, layout, self.placement) for member, layout in zip(cases, self.layouts)]
        if general is None:
            general = not all(on_seeds_paths(layout, theta) for layout, theta in zip(self.layouts, thetas))
        self.general = general
        for member in cases:
            check_drift_choices(member, general)
        if self.general:
            if len({layout.layers for layout in self.layouts}) > 1:
                raise ValueError("ParticleSystem: members must share the number of layers")
            self.drives = torch.stack(thetas)
            self.batch = ModelBatch.of([head_model(member, layout, theta)
                                        for member, layout, theta in zip(cases, self.layouts, thetas)])
            self.field = HeadsField.from_case(self.case, self.batch, self.layouts)
        else:
            self.batch = ModelBatch.of([Model.from_case(member, self.placement) if layout.seeds_model
                                        else head_model(member, layout, theta)
                                        for member, layout, theta in zip(cases, self.layouts, thetas)])
            self.drives = self.batch.W[:, None]
            self.field = ParticleField.from_case(self.case, self.batch)
        self.integrator = Integrator(self.case["particles"]["integrator"], self.field, self.batch.eps)
        draws = [initial_state(member, self.placement) for member in cases]
        self.x0 = torch.stack([x for x, _ in draws])
        self.noise_seeds = [seed for _, seed in draws]

    def fixed_attention(self, member: int, trained: bool = False) -> bool:
        """Whether member `member`'s attention is one head whose B and V are the same on every layer (and, for a
        training's run, not trained): Layout.one_fixed_head, as ForwardProblem.fixed_attention."""
        return not self.general or self.layouts[member].one_fixed_head(self.drives[member], trained)

    @property
    def members(self) -> int:
        return len(self.cases)

    def select(self, members: list) -> "ParticleSystem":
        """The systems of the members at the indices `members`, with their draws (nothing drawn again)."""
        chosen = ParticleSystem.__new__(ParticleSystem)
        chosen.__dict__.update(self.__dict__)
        chosen.cases = [self.cases[m] for m in members]
        chosen.layouts = [self.layouts[m] for m in members]
        chosen.batch = self.batch.select(members)
        field = self.field
        if self.general:
            chosen.drives = self.drives[members]
            chosen.field = HeadsField(chosen.batch, chosen.layouts, field.chunk, field.replicas)
        else:
            chosen.drives = chosen.batch.W[:, None]
            chosen.field = ParticleField(chosen.batch, field.attention, field.chunk, field.replicas, field.trained)
        chosen.integrator = Integrator(self.integrator.name, chosen.field, chosen.batch.eps)
        chosen.x0 = self.x0[members]
        chosen.noise_seeds = [self.noise_seeds[m] for m in members]
        return chosen

    def noise(self, seeds: list | None = None) -> Noise:
        """Fresh noise generators seeded with the members' noise seeds (or `seeds`)."""
        generators = [torch.Generator(self.placement.device).manual_seed(seed) for seed in seeds or self.noise_seeds]
        return Noise(generators, tuple(self.x0.shape[1:]), self.placement.real, self.placement.device)

    def check_steps(self, plan: Plan) -> None:
        for member, model in zip(self.cases, self.batch.models):
            check_noise_step(member, model.eps, float(plan.dt.max()))


class ParticleHooks(Hooks):
    """The particle run's saves (one ParticleRecorder per member), failures and progress; `stiff` the note of each
    member whose steps were found too long for its drift (`check_contraction`), said again as the cause of its
    failure."""

    def __init__(self, recorders: list, bar: Progress):
        self.recorders, self.bar = recorders, bar
        self.failures, self.stiff, self.unmeasured = {}, {}, 0

    def stop(self, member: int, reason: str, plan: Plan) -> None:
        self.failures[member] = self.recorders[member].failure(reason)

    def after_step(self, plan: Plan, done: int, x: torch.Tensor) -> None:
        # every step moves the bar and the log lines on, not only the saves: a save interval of a large run takes
        # minutes, and a log line is due every 30 s (docs/design.md)
        show_step(self.bar, plan, done)

    def check_contraction(self, plan: Plan, field: ParticleField, x: torch.Tensor, W: torch.Tensor, key: str) -> None:
        """Note, once a member, a step too long for the drift's contraction (`contraction_number` >= STIFF_STEP) at
        the start of `plan`'s interval: the first, then those after CONTRACTION_EVERY steps or more since the last
        measure; nothing is computed once every member has its note."""
        since, self.unmeasured = self.unmeasured, self.unmeasured + int(plan.steps.max())
        if len(self.stiff) == len(self.recorders) or (0 < since < CONTRACTION_EVERY):
            return
        self.unmeasured = int(plan.steps.max())
        numbers = contraction_number(field, x, W, plan.dt)
        stiff = [m for m, z in enumerate(numbers) if z >= STIFF_STEP and m not in self.stiff]
        if stiff:
            within = contraction_within_step(field, x, W, plan.dt)
        for m in stiff:
            dt = float(plan.dt[m])
            rate = max(numbers[m] / dt, float(within[m]))
            self.stiff[m] = (
                f"{key}: steps of {dt:.3g} are too long for the drift (measured at t = {plan.interval.t0:.6g}): it "
                f"contracts along the flow at a rate of at least {rate:.3g}, {dt * rate:.3g} a step, where the "
                f"integrators are stable below {STIFF_STEP:g}; the particles' law may be wrong (steps of "
                f"{1 / rate:.2g} or less take 1 at that rate, a lower bound)")
            self.recorders[m].notes.append(self.stiff[m])

    def at_knot(self, plan: Plan, x: torch.Tensor) -> list:
        interval, stopped, row = plan.interval, [], None
        finite = torch.isfinite(x).flatten(1).all(1).tolist()
        for m, recorder in enumerate(self.recorders):
            if m in self.failures:
                continue
            recorder.steps += int(plan.steps[m])
            recorder.dt = float(np.fmax(recorder.dt, plan.dt[m]))  # the largest: the steps differ between intervals
            if not finite[m]:
                # an explicit stage beyond the drift's stability leaves the sphere far enough for the kernel at its
                # points to overflow: the note on the steps is the cause, where one was measured
                reason = f"a particle position became non-finite between t = {interval.t0:.6g} and {interval.t1:.6g}"
                self.failures[m] = recorder.failure(reason, self.stiff.get(m))
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
    W_t of every layer (a trained run; theta (M, L, p) beyond the seeds); else the members' `drives` (each
    model.W throughout, or the layers of parameters_of)."""
    case, timing = system.case, system.case["time"]
    layered = controls if controls is not None else system.drives
    grid = grid or TimeGrid(timing["t_end"], timing["save_every"], layered.shape[1])
    check_max_steps(grid, fixed_step(case), timing, step_key(case))
    x = system.x0
    # beyond the seeds the recorder's free energy of head 0 is not the flow's: flagged as a controlled run's
    recorders = [ParticleRecorder(member, model, system.field, x[m], controls is not None or system.general,
                                  system.fixed_attention(m, controls is not None))
                 for m, (member, model) in enumerate(zip(system.cases, system.batch.models))]
    for m, recorder in enumerate(recorders):
        recorder.record(0.0, x[m])
    bar = Progress(timing["t_end"], enabled=progress)
    hooks = ParticleHooks(recorders, bar)
    noise, current = system.noise(), {}

    def plan_of(interval, state):
        plan = step_plan(case, system.field, interval, state, layered[:, interval.layer])
        system.check_steps(plan)
        hooks.check_contraction(plan, system.field, state, layered[:, interval.layer], step_key(case))
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
    try:
        with torch.no_grad():
            integrate(grid, x, plan_of, begin, step, hooks, timing.get("max_steps"))
    finally:
        bar.close()  # on an interrupt too (solvers.eulerian.run_members)
    return outcomes(recorders, hooks.failures)


def run_particles(case, progress: bool | None = None):
    """Integrate the particle system of `case`; returns the output xarray.Dataset (docs/design.md "Output").

    Raises NumericalFailure (with `.dataset`, the run up to its last good save) when a
    particle position stops being finite.
    """
    return only(run_members(ParticleSystem(case), progress))
