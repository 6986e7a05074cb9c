"""The forward Eulerian solver: rho_t of M members at once, in spectral space.

    d_t c = eps Lap c - div(rho v[rho])^        (c = spectral coefficients of rho)

The diffusion is diagonal in the basis (implicit, or an integrating factor), the transport
(spherepde.model.transport) is evaluated on the dealiased grid and returned to spectral space through the weak
divergence, whose degree-0 coefficient is zero: mass is conserved to round-off by construction.

Members share the grid, the scheme and the save times, and may differ in the initial law and the model's
B, V, W, beta, eps (`ForwardProblem` of several cases; solvers.timegrid.integrate steps them together).  A
member's file is the file its serial run writes: its numbers are those of a run of its case alone to
round-off (tests/test_ensembles.py), `wall_seconds` is the batch's, and `batch_members` says how many ran
together.  Each interval between saves is split into equal steps no longer than dt (given, or from the CFL
number and the member's current max |v|).
"""

import copy
import math
import time as wallclock
import warnings

import numpy as np
import torch

from spherepde.measures import diagnostics as diag
from spherepde.discretisation.bases import make_basis
from spherepde.base.device import placement as make_placement
from spherepde.model.energy import FreeEnergy
from spherepde.base.errors import CaseError, NumericalFailure
from spherepde.kernels.exp_kernel import MemberKernels
from spherepde.model.initial import initial_density
from spherepde.model.attention import Model, ModelBatch, check_resolution, interaction_energy, principal_subspace
from spherepde.io.output import DIAGNOSTIC_ATTRS, eulerian_dataset
from spherepde.base.progress import Progress
from spherepde.base.real_view import complex_state, real_diagonal, real_state
from spherepde.model.transport import Transport

from solvers.timegrid import Hooks, Plan, TimeGrid, fixed_steps, integrate
from spherepde.discretisation.timesteppers import RungeKutta, choose_scheme

MAX_STEPS_PER_SAVE = 1e12  # a CFL step asking for more means the velocity blew up
# A finite state is no density any more when |rho| exceeds this many times the densest one the grid holds
# (all the mass in the smallest cell; a truncated delta peaks at about that on S^1, below it on S^2).
BLOW_UP_FACTOR = 10.0


class ForwardProblem:
    """The discretised forward equation of the members `cases` (one case or a list sharing sphere, solver, time
    and scheme): basis, models, attention transforms, transport, diffusion eigenvalues, filter, scheme."""

    def __init__(self, cases):
        cases = [cases] if not isinstance(cases, (list, tuple)) else list(cases)
        case = cases[0]
        self.cases = cases
        solver = case["solver"]
        self.placement = make_placement(solver["device"], solver["dtype"])
        if case.dim not in (2, 3):
            raise CaseError(f"sphere.dim: the Eulerian solver handles d = 2 or 3, got {case.dim}; "
                            "use solver.method = 'particles'")
        if solver["backend"] == "shtns" and (self.placement.device.type != "cpu" or self.placement.name != "float64"):
            raise CaseError("solver.backend: 'shtns' runs on the CPU in float64 only")
        self.basis = make_basis(case.dim, case["sphere"]["lmax"], self.placement, solver["backend"])
        models = [Model.from_case(member, self.placement) for member in cases]
        for model in models:
            check_resolution(model, self.basis, solver["kernel_tol"])
        self.batch = ModelBatch.of(models)
        self.kernels = MemberKernels(self.basis, self.batch.B, [m.beta for m in models], solver["field"],
                                     solver["kernel_tol"], solver["chunk"])
        self.transport = Transport(self.basis, self.batch, self.kernels)
        self.lam = self.batch.eps[:, None] * real_diagonal(self.basis.laplacian)  # (M, N)
        self.filter = spectral_filter(self.basis, solver["filter_order"])
        schemes = {choose_scheme(member["time"]["scheme"], model.eps) for member, model in zip(cases, models)}
        if len(schemes) > 1:
            raise ValueError(f"ForwardProblem: members with different time schemes {sorted(schemes)}")
        self.scheme = RungeKutta(schemes.pop())

    @property
    def members(self) -> int:
        return len(self.cases)

    def select(self, members: list) -> "ForwardProblem":
        """The problem of the members at the indices `members` (a list), sharing the basis and the matrices."""
        chosen = copy.copy(self)
        chosen.cases = [self.cases[m] for m in members]
        chosen.batch, chosen.kernels = self.batch.select(members), self.kernels.select(members)
        chosen.transport = self.transport.select(members)
        chosen.lam = self.lam[members]
        return chosen

    @property
    def model(self) -> Model:
        """The model of a one-member problem."""
        (model,) = self.batch.models
        return model

    @property
    def exp_kernel(self):
        """The attention transform of a one-member problem."""
        (_,) = self.cases
        return self.kernels.member(0)

    def initial(self) -> torch.Tensor:
        """The members' initial states (M, N): the real view of their coefficients (transport.real_state)."""
        return real_state(torch.stack([initial_density(member["initial"], self.basis) for member in self.cases]))

    def coefficients(self, state: torch.Tensor) -> torch.Tensor:
        """The complex coefficients (M, *coeff) of a state (a view)."""
        return complex_state(state, self.transport.coefficient_shape)

    def step(self, state: torch.Tensor, drive: torch.Tensor, factors, keep: list | None = None) -> torch.Tensor:
        """One step of the scheme with the drive of the layer (Transport.feed_forward), then the filter; with `keep`
        (a list) the step's tokens for `step_adjoint` are appended to it (Transport.rate_token, one per stage)."""
        if keep is None:
            state = self.scheme.step(state, lambda stage, U: self.transport(U, drive), factors)
        else:
            tokens = [None] * self.scheme.stages_count

            def rate(stage, U):
                value, tokens[stage] = self.transport.rate_token(U, drive)
                return value

            state = self.scheme.step(state, rate, factors)
            keep.append(tokens)
        return state if self.filter is None else state * self.filter

    def step_adjoint(self, state_bar: torch.Tensor, tokens: list, drive: torch.Tensor,
                     factors) -> tuple[torch.Tensor, torch.Tensor]:
        """(the cotangent of the step's start, that of the drive over the step) from the cotangent of its end
        (`step`'s transpose: the filter is real and diagonal), given the tokens `step` kept."""
        if self.filter is not None:
            state_bar = state_bar * self.filter
        drive_bar = torch.zeros_like(drive)

        def rate_vjp(stage, token, e_bar):
            U_bar, stage_drive_bar = self.transport.vjp_token(token, drive, e_bar)
            drive_bar.add_(stage_drive_bar)
            return U_bar

        return self.scheme.adjoint(state_bar, tokens, rate_vjp, factors), drive_bar

    def factors(self, plan: Plan):
        """The step factors of an interval's plan: dt one float when the members share it, else per member."""
        dt = float(plan.dt[0]) if (plan.dt == plan.dt[0]).all() else self.placement.tensor(plan.dt)[:, None]
        return self.scheme.factors(self.lam, dt)


def spectral_filter(basis, order: int) -> torch.Tensor | None:
    """Exponential filter exp(-36 (l / lmax)^order) (None when order = 0) on the real view (N,) of the
    coefficients: damps only the top modes."""
    if order == 0:
        return None
    return real_diagonal(torch.exp(-36.0 * (basis.degree / basis.lmax).to(basis.placement.real) ** order))


class WallClock:
    """wall_seconds of a run (an output attribute), a failed one included: counted from `start_clock`, added up
    at each `tick` (checkpoints, the end, a failure)."""

    def __init__(self):
        self.wall_seconds = 0.0
        self._clock = wallclock.perf_counter()

    def start_clock(self) -> None:
        """Time stepping starts (or resumes) now: wall_seconds counts from here."""
        self._clock = wallclock.perf_counter()

    def tick(self) -> None:
        """Add the wall time since the clock started, or since the last tick, to wall_seconds."""
        now = wallclock.perf_counter()
        self.wall_seconds += now - self._clock
        self._clock = now


class Recorder(WallClock):
    """Density snapshots and diagnostics of member `member` of `problem` at save times, on the host; `controlled`:
    the run's W_t is a trained control (the free energy then names it as what may raise F)."""

    def __init__(self, problem: ForwardProblem, member: int, rho0: np.ndarray, controlled: bool = False):
        super().__init__()
        basis, model = problem.basis, problem.batch.models[member]
        self.problem, self.member, self.case = problem, member, problem.cases[member]
        self.basis, self.model, self.exp_kernel = basis, model, problem.kernels.member(member)
        self.scheme = problem.scheme.scheme
        self.points = basis.points.reshape(-1, basis.dim).cpu().double().numpy()
        self.weights = basis.weights.reshape(-1).cpu().double().numpy()
        VBt = (model.V @ model.B.T).cpu().double().numpy()
        self.subspace_E = principal_subspace(VBt)
        self.subspace_F = principal_subspace(model.V.cpu().double().numpy())
        self.masses_0 = rho0.reshape(-1) * self.weights
        diagnostics = self.case["diagnostics"]
        self.lyapunov_p = list(diagnostics["lyapunov_p"])
        self.want_w2 = diagnostics["w2"]
        self.w2_atoms, self.w2_error_bound = diagnostics["w2_atoms"], 0.0
        self.w2_grid_bound = diag.grid_w2_bound(self.subspace_E, basis.cell_radius)
        self.tail_tol = diagnostics["tail_tol"]
        self.times, self.densities, self.rows = [], [], []
        self.resolved_until = None
        self.notes = []
        self.steps = 0
        self.free_energy = FreeEnergy.of_model(model, controlled)
        self.batch_members = problem.members

    def record(self, t: float, c: torch.Tensor) -> dict:
        """Save the member's state c (*coeff) at time t: its density on the grid and its diagnostics row."""
        density, row = self.measure(c)
        self.keep(t, density, row)
        return row

    def measure(self, c: torch.Tensor) -> tuple[np.ndarray, dict]:
        """(density on the grid, diagnostics row) of the member's coefficients c (*coeff)."""
        basis = self.basis
        rho = basis.synthesis(c)
        density = rho.cpu().double().numpy()
        masses = density.reshape(-1) * self.weights
        m = diag.mean(self.points, masses)
        entropy = diag.entropy(density.reshape(-1), self.weights)
        energy = interaction_energy(self.model, self.exp_kernel, basis, rho)
        row = {
            "mass": float(masses.sum()),
            "mean": m,
            "order_parameter": float(np.linalg.norm(m)),
            "alignment_E": diag.alignment(self.points, masses, self.subspace_E),
            "alignment_F": diag.alignment(self.points, masses, self.subspace_F),
            # From the coefficients, not the grid: the integrand is singular on {P_E x = 0}.
            "lyapunov": np.array([diag.lyapunov_of_density(self._degree_sum(c), self.subspace_E, p, basis.lmax)
                                  for p in self.lyapunov_p]),
            "w2_projection": self._w2_projection(masses),
            "entropy": entropy,
            "interaction_energy": energy,
            "free_energy": self.free_energy(entropy, energy, m),
            "min_density": float(density.min()),
            "spectral_tail": float(basis.spectral_tail(c)),
        }
        return density, row

    def keep(self, t: float, density: np.ndarray, row: dict) -> None:
        """Append a measured state to the saves, noting when the resolution is first lost."""
        if row["spectral_tail"] > self.tail_tol and self.resolved_until is None:
            self.resolved_until = self.times[-1] if self.times else 0.0
            message = (f"resolution lost at t = {t:.4g}: spectral tail {row['spectral_tail']:.2e} > "
                       f"diagnostics.tail_tol = {self.tail_tol:.0e}; results after t = {self.resolved_until:.4g} "
                       f"are under-resolved (increase sphere.lmax or add eps)")
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            self.notes.append(message)
        self.times.append(t)
        self.densities.append(density)
        self.rows.append(row)

    def _degree_sum(self, c: torch.Tensor):
        """(M, a) -> sum_l M[l] rho_l(a): the series of c at the point a, degree l weighted by M[l]."""
        basis = self.basis

        def degree_sum(multipliers: np.ndarray, point: np.ndarray) -> float:
            weighted = c * basis.placement.tensor(multipliers)[basis.degree]
            return float(basis.evaluate(weighted, basis.placement.tensor(point[None]))[0])
        return degree_sum

    def _w2_projection(self, masses: np.ndarray) -> float:
        if not self.want_w2:
            return float("nan")
        value, bound = diag.w2_projection(self.points, masses, self.points, self.masses_0, self.subspace_E,
                                          self.w2_atoms)
        self.w2_error_bound = max(self.w2_error_bound, self.w2_grid_bound + bound)
        return value

    def dataset(self, status: str):
        return eulerian_dataset(self, status)

    def unsaved(self, stored: int):
        """The saves after the first `stored` ones, as a Dataset (a checkpoint segment); None if none."""
        if stored == len(self.times):
            return None
        saved = self.times, self.densities, self.rows
        self.times, self.densities, self.rows = (values[stored:] for values in saved)
        try:
            return eulerian_dataset(self, "checkpoint segment")
        finally:
            self.times, self.densities, self.rows = saved

    def checkpoint_state(self, c: torch.Tensor, plan: Plan, substep: int) -> dict:
        """What a checkpoint stores: the coefficients c, `substep` of the plan's steps into its interval, and the
        recorder's scalars."""
        timing = self.case["time"]
        resolved_until = None if self.resolved_until is None else float(self.resolved_until)
        dt = float(plan.dt[0])
        return {"case": self.case.text, "t": plan.interval.t0 + substep * dt, "t_end": timing["t_end"],
                "steps": self.steps + substep, "c": c.cpu().clone(), "interval": plan.interval.index,
                "substep": substep, "dt": dt, "substeps": int(plan.steps[0]),
                "recorder": {"steps": self.steps, "wall_seconds": float(self.wall_seconds),
                             "w2_error_bound": float(self.w2_error_bound), "resolved_until": resolved_until,
                             "notes": list(self.notes)}}

    @classmethod
    def restored(cls, problem: ForwardProblem, segments: list, scalars: dict) -> "Recorder":
        """A recorder of member 0 holding the saves of checkpoint `segments` and the `scalars` of checkpoint_state."""
        times = [float(t) for segment in segments for t in segment["time"].values]
        densities = [density for segment in segments for density in segment["density"].values]
        rows = [{name: (values[i] if values.ndim > 1 else float(values[i]))
                 for name, values in ((name, segment[name].values) for name in DIAGNOSTIC_ATTRS)}
                for segment in segments for i in range(segment.sizes["time"])]
        recorder = cls(problem, 0, densities[0])
        recorder.times, recorder.densities, recorder.rows = times, densities, rows
        for key, value in scalars.items():
            setattr(recorder, key, value)
        return recorder


def checked_state(recorder: Recorder, candidate: torch.Tensor, t0: float, t1: float,
                  dt: float) -> tuple[np.ndarray, dict]:
    """(density, diagnostics row) of the member's coefficients stepped from t0 to t1, or NumericalFailure (the
    recorder's dataset so far) when they are not finite or no longer a density of the run (`departure`)."""
    if not bool(torch.isfinite(torch.view_as_real(candidate)).all()):
        raise failure(recorder, f"the density became non-finite between t = {t0:.6g} and {t1:.6g} (dt = {dt:.3g})")
    density, row = recorder.measure(candidate)
    reason = departure(density, recorder.weights, float(recorder.masses_0.sum()), recorder.basis.placement.real)
    if reason is not None:
        raise failure(recorder, f"{reason} between t = {t0:.6g} and {t1:.6g} (dt = {dt:.3g}): the solution blew up")
    return density, row


def departure(density: np.ndarray, weights: np.ndarray, mass_0: float, real: torch.dtype) -> str | None:
    """Why a finite grid density is no longer one of the run, or None: its mass int rho dsigma moved from
    mass_0 by more than sqrt(machine epsilon of `real`) relative (the scheme conserves it to round-off:
    module doc), or |rho| exceeds BLOW_UP_FACTOR times mass_0 over the smallest quadrature cell."""
    mass = float(density.reshape(-1) @ weights.reshape(-1))
    tolerance = math.sqrt(torch.finfo(real).eps)
    if not abs(mass - mass_0) <= tolerance * abs(mass_0):
        return f"the mass drifted from {mass_0:.6g} by {mass - mass_0:.3g} (relative tolerance {tolerance:.2g})"
    bound = BLOW_UP_FACTOR * abs(mass_0) / weights.min()
    if not np.abs(density).max() <= bound:
        return (f"|rho| reached {np.abs(density).max():.3g}, above {bound:.3g} ({BLOW_UP_FACTOR:g} x all the "
                "mass in one cell)")
    return None


def failure(recorder: WallClock, reason: str) -> NumericalFailure:
    """The failure of a run: it carries the dataset up to the last good save.  When the run had lost its
    resolution before, the message says so: an under-resolved density undershoots, and that is the usual cause."""
    recorder.notes.append(reason)
    recorder.tick()
    resolution = ""
    if getattr(recorder, "resolved_until", None) is not None:  # particles have no resolution
        last = f"spectral tail {recorder.rows[-1]['spectral_tail']:.2g} at the last save, " if recorder.rows else ""
        resolution = (f"; it was under-resolved after t = {recorder.resolved_until:.4g} ({last}diagnostics.tail_tol = "
                      f"{recorder.tail_tol:.0e}): increase sphere.lmax or eps")
    return NumericalFailure(f"numerical failure: {reason}; the last good state (t = {recorder.times[-1]:.6g}) "
                            f"is kept{resolution}", recorder.dataset(f"failed: {reason}"))


def step_plan(problem: ForwardProblem, interval, c: torch.Tensor, a: torch.Tensor, timing: dict) -> tuple[Plan, list]:
    """(the plan of an interval, the members' max |v| at its start or None): time.dt, or the CFL rule
    dt = cfl / (lmax max|v|) of each member's own velocity; members whose velocity is not finite or asks for more
    than MAX_STEPS_PER_SAVE steps are stopped."""
    members = c.shape[0]
    if "dt" in timing:
        steps = np.full(members, fixed_steps(interval, timing["dt"]))
        return Plan(interval, steps, interval.length / steps), None
    speeds = problem.transport.max_speed(c, a).cpu().double().numpy()
    steps, stopped = np.ones(members, dtype=np.int64), {}
    for m, speed in enumerate(speeds):
        dt_max = interval.length if speed == 0 else min(interval.length, timing["cfl"] / (problem.basis.lmax * speed))
        if not math.isfinite(speed):
            stopped[m] = f"the velocity became non-finite (max |v| = {speed}) at t = {interval.t0:.6g}"
        elif not interval.length / dt_max <= MAX_STEPS_PER_SAVE:
            stopped[m] = (f"max |v| = {speed:.3g} at t = {interval.t0:.6g} asks for steps of {dt_max:.3g}: too many "
                          f"(more than {MAX_STEPS_PER_SAVE:.0e}) before the next save")
        else:
            steps[m] = max(1, math.ceil(interval.length / dt_max - 1e-9))
    return Plan(interval, steps, interval.length / steps, stopped), list(speeds)


class ForwardHooks(Hooks):
    """The Eulerian run's saves (one Recorder per member), failures, progress and (one member) checkpoints."""

    def __init__(self, problem: ForwardProblem, recorders: list, bar: Progress, checkpoint=None):
        self.problem, self.recorders, self.bar, self.checkpoint = problem, recorders, bar, checkpoint
        self.failures = {}

    def stop(self, member: int, reason: str, plan: Plan) -> None:
        self.failures[member] = failure(self.recorders[member], reason)

    def after_step(self, plan: Plan, done: int, state: torch.Tensor) -> None:
        t = plan.interval.t0 + done * float(plan.dt.max())
        self.bar.update(min(t, plan.interval.t1), dt=float(plan.dt.min()))
        checkpoint, recorder = self.checkpoint, self.recorders[0]
        if checkpoint is not None and checkpoint.due(recorder.steps + done):
            if not bool(torch.isfinite(state).all()):
                raise failure(recorder, f"the density became non-finite between t = {plan.interval.t0:.6g} and "
                                        f"{t:.6g} (dt = {float(plan.dt[0]):.3g})")
            recorder.tick()
            checkpoint.write(recorder.checkpoint_state(self.problem.coefficients(state)[0], plan, done),
                             recorder.unsaved(checkpoint.saves), recorder.steps + done)
            if checkpoint.interrupted:
                raise KeyboardInterrupt

    def at_knot(self, plan: Plan, state: torch.Tensor) -> list:
        stopped = []
        interval = plan.interval
        c = self.problem.coefficients(state)
        for m, recorder in enumerate(self.recorders):
            if m in self.failures:
                continue
            recorder.steps += int(plan.steps[m])
            if not interval.save:
                continue
            try:
                density, row = checked_state(recorder, c[m], interval.t0, interval.t1, float(plan.dt[m]))
            except NumericalFailure as error:
                self.failures[m] = error
                stopped.append(m)
                continue
            recorder.keep(interval.t1, density, row)
        if len(self.recorders) == 1 and not stopped and interval.save:
            row = self.recorders[0].rows[-1]
            self.bar.update(interval.t1, mass=row["mass"], min_density=row["min_density"], tail=row["spectral_tail"])
        return stopped


def run_members(problem: ForwardProblem, progress: bool | None = None, checkpoint=None) -> list:
    """Integrate the forward equation of every member; per member its Dataset, or the NumericalFailure that
    stopped it (carrying its dataset up to its last good save).

    Finiteness is checked at save times and checkpoints only, so that a GPU run never waits on the host inside a
    save interval.  With a `checkpoint` (solvers.checkpoint.Checkpoint; one member only) the state is stored
    whenever one is due, and a checkpoint marked `resume` continues from its state: the result is bit for bit that
    of an uninterrupted run."""
    case, timing = problem.cases[0], problem.cases[0]["time"]
    grid = TimeGrid(timing["t_end"], timing["save_every"])
    a = problem.transport.feed_forward(problem.batch.W)
    start = (0, 0, None, 0)
    if checkpoint is not None and checkpoint.resume:
        state, segments = checkpoint.load(case)
        recorders = [Recorder.restored(problem, segments, state["recorder"])]
        c = real_state(state["c"].to(problem.placement.device)[None])
        interval = grid.intervals[state["interval"]]
        plan = Plan(interval, np.array([state["substeps"]]), np.array([state["dt"]]))
        start = (state["interval"], state["substep"], plan, recorders[0].steps)
        t_start = state["t"]
    else:
        c = problem.initial()
        coefficients = problem.coefficients(c)
        densities = problem.basis.synthesis(coefficients).cpu().double().numpy()
        recorders = [Recorder(problem, m, densities[m]) for m in range(problem.members)]
        for m, recorder in enumerate(recorders):
            recorder.record(0.0, coefficients[m])
        t_start = 0.0
    bar = Progress(timing["t_end"], enabled=progress, start=t_start)
    hooks = ForwardHooks(problem, recorders, bar, checkpoint)

    def plan_of(interval, state):
        plan, speeds = step_plan(problem, interval, state, a, timing)
        if speeds is not None and len(speeds) == 1:
            bar.update(interval.t0, max_speed=speeds[0], dt=float(plan.dt[0]))
        return plan

    factors = {}

    def begin(plan):
        factors["step"] = problem.factors(plan)

    for recorder in recorders:
        recorder.start_clock()
    if checkpoint is not None:
        checkpoint.stepping = True
    try:
        with torch.no_grad():
            integrate(grid, c, plan_of, begin, lambda state: problem.step(state, a, factors["step"]), hooks,
                      timing.get("max_steps"), start)
    finally:
        if checkpoint is not None:
            checkpoint.stepping = False
    bar.close()
    return outcomes(recorders, hooks.failures)


def outcomes(recorders: list, failures: dict) -> list:
    """Per member of a finished run its Dataset, or the NumericalFailure that stopped it (`failures` by member)."""
    results = []
    for m, recorder in enumerate(recorders):
        recorder.tick()
        results.append(failures.get(m) or recorder.dataset("completed"))
    return results


def only(results: list):
    """The one member's result of a run of one case, its NumericalFailure raised."""
    (result,) = results
    if isinstance(result, NumericalFailure):
        raise result
    return result


def run_eulerian(case, progress: bool | None = None, checkpoint=None):
    """Integrate the forward equation of `case`; returns the output xarray.Dataset.

    Raises NumericalFailure (with `.dataset`, the run up to its last good save) on NaN, and when a finite state
    stops being a density (`departure`: mass drift or |rho| beyond what the grid can hold).  See `run_members`.
    """
    return only(run_members(ForwardProblem(case), progress, checkpoint))
