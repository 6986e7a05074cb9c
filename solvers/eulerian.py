"""The forward Eulerian solver: rho_t from a case, in spectral space.

    d_t c = eps Lap c - div(rho v[rho, t])^        (c = spectral coefficients of rho)

The diffusion is diagonal in the basis (implicit or integrating factor), the transport
is evaluated on the dealiased grid and returned to spectral space through the weak
divergence, whose degree-0 coefficient is zero: mass is conserved to round-off by
construction.  Save times are hit exactly: each interval between saves is split into
equal steps no longer than dt (given, or from the CFL number and the current max |v|).
"""

import copy
import math
import time as wallclock
import warnings

import numpy as np
import torch

from spherepde import diagnostics as diag
from spherepde.ambient import norm
from spherepde.bases import make_basis
from spherepde.device import placement as make_placement
from spherepde.energy import FreeEnergy
from spherepde.errors import CaseError, NumericalFailure
from spherepde.exp_kernel import make_exp_kernel
from spherepde.initial import initial_density
from spherepde.model import (Model, attention_mean, check_resolution, interaction_energy, principal_subspace,
                             velocity)
from spherepde.output import DIAGNOSTIC_ATTRS, eulerian_dataset
from spherepde.progress import Progress

from .timesteppers import choose_scheme, make_stepper


MAX_STEPS_PER_SAVE = 1e12  # a CFL step asking for more means the velocity blew up
# A finite state is no density any more when |rho| exceeds this many times the densest one the grid holds
# (all the mass in the smallest cell; a truncated delta peaks at about that on S^1, below it on S^2).
BLOW_UP_FACTOR = 10.0


class ForwardProblem:
    """The discretised forward equation of one run: basis, model, attention transform."""

    def __init__(self, case):
        solver = case["solver"]
        self.placement = make_placement(solver["device"], solver["dtype"])
        if case.dim not in (2, 3):
            raise CaseError(f"sphere.dim: the Eulerian solver handles d = 2 or 3, got {case.dim}; "
                            "use solver.method = 'particles'")
        if solver["backend"] == "shtns" and (self.placement.device.type != "cpu" or self.placement.name != "float64"):
            raise CaseError("solver.backend: 'shtns' runs on the CPU in float64 only")
        self.basis = make_basis(case.dim, case["sphere"]["lmax"], self.placement, solver["backend"])
        self.model = Model.from_case(case, self.placement)
        check_resolution(self.model, self.basis, solver["kernel_tol"])
        self.exp_kernel = make_exp_kernel(self.basis, self.model.B, self.model.beta, solver["field"],
                                          solver["kernel_tol"], solver["chunk"])
        self.lam = self.model.eps * self.basis.laplacian
        self.filter = spectral_filter(self.basis, solver["filter_order"])

    def velocity(self, t: float, rho: torch.Tensor) -> torch.Tensor:
        """v[rho](x, t) on the grid, ambient components."""
        mean_field = attention_mean(self.model, self.exp_kernel, self.basis.points, rho)
        return velocity(self.model, self.basis.points, mean_field, t)

    def transport(self, t: float, c: torch.Tensor) -> torch.Tensor:
        """-div(rho v[rho, t]) in spectral space."""
        rho = self.basis.synthesis(c)
        return -self.basis.divergence(rho[..., None] * self.velocity(t, rho))

    def max_speed(self, t: float, c: torch.Tensor) -> float:
        return float(norm(self.velocity(t, self.basis.synthesis(c))).max())


def spectral_filter(basis, order: int) -> torch.Tensor | None:
    """Exponential filter exp(-36 (l / lmax)^order) (None when order = 0): damps only the top modes."""
    if order == 0:
        return None
    return torch.exp(-36.0 * (basis.degree / basis.lmax).to(basis.placement.real) ** order)


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
    """Density snapshots and diagnostics at save times, on the host."""

    def __init__(self, problem: ForwardProblem, case, rho0: np.ndarray, scheme: str):
        super().__init__()
        basis, model = problem.basis, problem.model
        self.problem, self.case, self.scheme = problem, case, scheme
        self.points = basis.points.reshape(-1, basis.dim).cpu().double().numpy()
        self.weights = basis.weights.reshape(-1).cpu().double().numpy()
        VBt = (model.V @ model.B.T).cpu().double().numpy()
        self.subspace_E = principal_subspace(VBt)
        self.subspace_F = principal_subspace(model.V.cpu().double().numpy())
        self.masses_0 = rho0.reshape(-1) * self.weights
        self.lyapunov_p = list(case["diagnostics"]["lyapunov_p"])
        self.want_w2 = case["diagnostics"]["w2"]
        self.w2_atoms, self.w2_error_bound = case["diagnostics"]["w2_atoms"], 0.0
        self.w2_grid_bound = diag.grid_w2_bound(self.subspace_E, basis.cell_radius)
        self.tail_tol = case["diagnostics"]["tail_tol"]
        self.times, self.densities, self.rows = [], [], []
        self.resolved_until = None
        self.notes = []
        self.steps = 0
        self.free_energy = FreeEnergy.of_model(model)

    def record(self, t: float, c: torch.Tensor) -> dict:
        """Save the state c at time t: its density on the grid and its diagnostics row (returned)."""
        density, row = self.measure(c)
        self.keep(t, density, row)
        return row

    def measure(self, c: torch.Tensor) -> tuple[np.ndarray, dict]:
        """(density on the grid, diagnostics row) of the coefficients c."""
        basis, problem = self.problem.basis, self.problem
        rho = basis.synthesis(c)
        density = rho.cpu().double().numpy()
        masses = density.reshape(-1) * self.weights
        m = diag.mean(self.points, masses)
        entropy = diag.entropy(density.reshape(-1), self.weights)
        energy = interaction_energy(problem.model, problem.exp_kernel, basis, rho)
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
        basis = self.problem.basis

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
        view = copy.copy(self)
        view.times, view.densities, view.rows = self.times[stored:], self.densities[stored:], self.rows[stored:]
        return eulerian_dataset(view, "checkpoint segment")

    def checkpoint_state(self, c: torch.Tensor, t: float, interval: int, substep: int, dt: float,
                         substeps: int) -> dict:
        """What a checkpoint stores: the coefficients c at time t, `substep` of `substeps` steps of
        length dt into save interval `interval`, and the recorder's scalars."""
        timing = self.case["time"]
        resolved_until = None if self.resolved_until is None else float(self.resolved_until)
        return {"case": self.case.text, "t": float(t), "t_end": timing["t_end"], "steps": self.steps + substep,
                "c": c.cpu().clone(), "interval": interval, "substep": substep, "dt": float(dt), "substeps": substeps,
                "recorder": {"steps": self.steps, "wall_seconds": float(self.wall_seconds),
                             "w2_error_bound": float(self.w2_error_bound), "resolved_until": resolved_until,
                             "notes": list(self.notes)}}

    @classmethod
    def restored(cls, problem: ForwardProblem, case, scheme: str, segments: list, scalars: dict) -> "Recorder":
        """A recorder holding the saves of checkpoint `segments` and the `scalars` of checkpoint_state."""
        times = [float(t) for segment in segments for t in segment["time"].values]
        densities = [density for segment in segments for density in segment["density"].values]
        rows = [{name: (values[i] if values.ndim > 1 else float(values[i]))
                 for name, values in ((name, segment[name].values) for name in DIAGNOSTIC_ATTRS)}
                for segment in segments for i in range(segment.sizes["time"])]
        recorder = cls(problem, case, densities[0], scheme)
        recorder.times, recorder.densities, recorder.rows = times, densities, rows
        for key, value in scalars.items():
            setattr(recorder, key, value)
        return recorder


def save_times(t_end: float, save_every: float) -> np.ndarray:
    """0, save_every, 2 save_every, ..., t_end (the last interval may be shorter)."""
    count = int(math.floor(t_end / save_every + 1e-9))
    times = [k * save_every for k in range(count + 1)]
    if t_end - times[-1] > 1e-12 * max(1.0, t_end):
        times.append(t_end)
    return np.array(times)


def run_eulerian(case, progress: bool | None = None, checkpoint=None):
    """Integrate the forward equation of `case`; returns the output xarray.Dataset.

    Raises NumericalFailure (with `.dataset`, the run up to its last good save) on NaN, and
    when a finite state stops being a density (`departure`: mass drift or |rho| beyond
    what the grid can hold).  Finiteness is checked at save times and checkpoints only, so
    that a GPU run never waits on the host inside a save interval. With a `checkpoint`
    (:class:`spherepde.checkpoint.Checkpoint`) the state is stored whenever one is due,
    and a checkpoint marked `resume` continues from its state: the result is bit for bit
    that of an uninterrupted run.
    """
    problem = ForwardProblem(case)
    basis, timing = problem.basis, case["time"]
    scheme = choose_scheme(timing["scheme"], problem.model.eps)
    step = make_stepper(scheme)
    times = save_times(timing["t_end"], timing["save_every"])
    if checkpoint is not None and checkpoint.resume:
        state, segments = checkpoint.load(case)
        recorder = Recorder.restored(problem, case, scheme, segments, state["recorder"])
        c = state["c"].to(basis.placement.device)
        first, done, dt, substeps, t_start = (state[key] for key in ("interval", "substep", "dt", "substeps", "t"))
    else:
        c = initial_density(case["initial"], basis)
        recorder = Recorder(problem, case, basis.synthesis(c).cpu().double().numpy(), scheme)
        recorder.record(0.0, c)
        first, done, t_start = 0, 0, 0.0
    bar = Progress(timing["t_end"], enabled=progress, start=t_start)
    recorder.start_clock()
    if checkpoint is not None:
        checkpoint.stepping = True
    try:
        for interval in range(first, len(times) - 1):
            t0, t1 = times[interval], times[interval + 1]
            if interval != first or done == 0:
                speed = problem.max_speed(t0, c)
                dt_max = timing["dt"] if "dt" in timing else _cfl_step(problem, speed, timing["cfl"], t1 - t0)
                if not math.isfinite(speed):
                    _fail(recorder, f"the velocity became non-finite (max |v| = {speed}) at t = {t0:.6g}")
                if not (t1 - t0) / dt_max <= MAX_STEPS_PER_SAVE:
                    _fail(recorder, f"max |v| = {speed:.3g} at t = {t0:.6g} asks for steps of {dt_max:.3g}: too many "
                                    f"(more than {MAX_STEPS_PER_SAVE:.0e}) before the next save")
                substeps = max(1, math.ceil((t1 - t0) / dt_max - 1e-9))
                dt = (t1 - t0) / substeps
                done = 0
                bar.update(float(t0), max_speed=speed, dt=dt)
                if "max_steps" in timing and recorder.steps + substeps > timing["max_steps"]:
                    _fail(recorder, f"time.max_steps = {timing['max_steps']} would be exceeded before t = {t1:.6g}")
            candidate = c
            for k in range(done, substeps):
                try:
                    candidate = step(problem.lam, problem.transport, t0 + k * dt, candidate, dt)
                except NumericalFailure as failure:
                    _fail(recorder, f"{failure} at t = {t0 + k * dt:.6g}")
                if problem.filter is not None:
                    candidate = candidate * problem.filter
                bar.update(t0 + (k + 1) * dt, dt=dt)
                if checkpoint is not None and checkpoint.due(recorder.steps + k + 1):
                    _check_finite(recorder, candidate, t0, t0 + (k + 1) * dt, dt)
                    recorder.tick()
                    checkpoint.write(recorder.checkpoint_state(candidate, t0 + (k + 1) * dt, interval, k + 1, dt,
                                                               substeps),
                                     recorder.unsaved(checkpoint.saves), recorder.steps + k + 1)
                    if checkpoint.interrupted:
                        raise KeyboardInterrupt
            density, row = checked_state(recorder, candidate, t0, t1, dt)
            c = candidate
            recorder.steps += substeps
            recorder.keep(float(t1), density, row)
            bar.update(float(t1), mass=row["mass"], min_density=row["min_density"], tail=row["spectral_tail"])
    finally:
        if checkpoint is not None:
            checkpoint.stepping = False
    bar.close()
    recorder.tick()
    return recorder.dataset("completed")


def _check_finite(recorder: Recorder, candidate: torch.Tensor, t0: float, t1: float, dt: float) -> None:
    """Stop the run (NumericalFailure) when the coefficients stepped from t0 to t1 are not all finite."""
    if not bool(torch.isfinite(torch.view_as_real(candidate)).all()):
        _fail(recorder, f"the density became non-finite between t = {t0:.6g} and {t1:.6g} (dt = {dt:.3g})")


def checked_state(recorder: Recorder, candidate: torch.Tensor, t0: float, t1: float,
                  dt: float) -> tuple[np.ndarray, dict]:
    """(density, diagnostics row) of the coefficients stepped from t0 to t1, or NumericalFailure when they
    are not finite or no longer a density of the run (`departure`)."""
    _check_finite(recorder, candidate, t0, t1, dt)
    density, row = recorder.measure(candidate)
    real = recorder.problem.basis.placement.real
    reason = departure(density, recorder.weights, float(recorder.masses_0.sum()), real)
    if reason is not None:
        _fail(recorder, f"{reason} between t = {t0:.6g} and {t1:.6g} (dt = {dt:.3g}): the solution blew up")
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


def _fail(recorder: WallClock, reason: str):
    """Stop the run: the failure carries the dataset up to the last good save.  When the run had lost its
    resolution before, the message says so: an under-resolved density undershoots, and that is the usual cause."""
    recorder.notes.append(reason)
    recorder.tick()
    resolution = ""
    if isinstance(recorder, Recorder) and recorder.resolved_until is not None:  # particles have no resolution
        last = f"spectral tail {recorder.rows[-1]['spectral_tail']:.2g} at the last save, " if recorder.rows else ""
        resolution = (f"; it was under-resolved after t = {recorder.resolved_until:.4g} ({last}diagnostics.tail_tol = "
                      f"{recorder.tail_tol:.0e}): increase sphere.lmax or eps")
    raise NumericalFailure(f"numerical failure: {reason}; the last good state (t = {recorder.times[-1]:.6g}) "
                           f"is kept{resolution}", recorder.dataset(f"failed: {reason}"))


def _cfl_step(problem: ForwardProblem, speed: float, cfl: float, interval: float) -> float:
    """dt = cfl / (lmax max|v|): the spectral CFL condition for explicit transport."""
    return interval if speed == 0 else min(interval, cfl / (problem.basis.lmax * speed))
