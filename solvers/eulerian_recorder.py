"""What an Eulerian run records at its save times (docs/design.md "Diagnostics"): per member the density on the grid and
its diagnostics row (mass, mean, alignments, Lyapunov functionals from the coefficients, W2 to the projection,
entropy, interaction and free energy, min density, spectral tail), the first loss of resolution, and the
scalars a checkpoint stores; handed to spherepde.io.output as a plain `Saves` record.
"""

import math
import warnings

import numpy as np
import torch

from solvers.forward_problem import ForwardProblem
from solvers.records import RunRecord
from solvers.timegrid import Plan
from spherepde.discretisation.bases import TAIL_ROUND_OFF_EPS
from spherepde.io.output import DIAGNOSTIC_ATTRS, eulerian_dataset
from spherepde.measures import diagnostics as diag
from spherepde.measures.optimal_transport import grid_w2_bound, w2_projection
from spherepde.model.attention import interaction_energy, principal_subspace
from spherepde.model.energy import FreeEnergy
from spherepde.model.parameters import layer_values


class Recorder(RunRecord):
    """Density snapshots and diagnostics of member `member` of `problem` at save times, on the host; `controlled`:
    the run's W_t is a trained control (the free energy then names it as what may raise F).

    The diagnostics of the attention (alignment_E, alignment_F, lyapunov, w2_projection: the subspaces of V B^T
    and V; interaction_energy, free_energy) are those of one head with fixed B and V
    (ForwardProblem.fixed_attention); beyond it (several heads, B or V varying over the layers or trained) they
    are NaN.  Beyond the seeds' model the free energy is never called dissipated: the feed-forward (layered or
    two-layer) may raise it."""

    def __init__(self, problem: ForwardProblem, member: int, rho0: np.ndarray, controlled: bool = False):
        super().__init__(problem.cases[member])
        basis, model = problem.basis, problem.batch.models[member]
        self.problem, self.member = problem, member
        self.basis, self.model, self.exp_kernel = basis, model, problem.kernels.member(member)
        self.scheme = problem.scheme.scheme
        self.points = basis.points.reshape(-1, basis.dim).cpu().double().numpy()
        self.weights = basis.weights.reshape(-1).cpu().double().numpy()
        self.fixed_attention = problem.fixed_attention(member, controlled)
        if self.fixed_attention:
            VBt = (model.V @ model.B.T).cpu().double().numpy()
            self.subspace_E = principal_subspace(VBt)
            self.subspace_F = principal_subspace(model.V.cpu().double().numpy())
        else:
            self.subspace_E = self.subspace_F = None
        self.masses_0 = rho0.reshape(-1) * self.weights
        diagnostics = self.case["diagnostics"]
        self.want_w2 = diagnostics["w2"]
        self.w2_atoms, self.w2_error_bound = diagnostics["w2_atoms"], 0.0
        self.w2_grid_bound = grid_w2_bound(self.subspace_E, basis.cell_radius)
        # a tail_tol below the dtype's round-off (TAIL_ROUND_OFF_EPS) is raised to it: under it a float32 run warned
        # "under-resolved from the start" of a density resolved to round-off
        self.tail_tol = max(diagnostics["tail_tol"], TAIL_ROUND_OFF_EPS * torch.finfo(basis.placement.real).eps)
        self.densities = []
        self.resolved_until = None
        self.steps = self.steps_at_save = 0
        # the filter's factor F_l of each coefficient (*coeff), None without one (solver.filter_order = 0)
        self.filter = None if problem.filter is None else problem.filter.reshape(basis.degree.shape + (2,))[..., 0]
        if self.fixed_attention:
            seeds = problem.layouts[member].seeds_model
            self.free_energy = FreeEnergy.of_model(model, controlled or not seeds,
                                                   layer_values(self.case["model"]["W"], 1) if seeds else None)
        else:
            self.free_energy = FreeEnergy(model.eps, None, None, False, False, "several heads, or B and V vary")
        self.field = "dense" if problem.layered else self.exp_kernel.name
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
        energy = interaction_energy(self.model, self.exp_kernel, basis, rho) if self.fixed_attention else math.nan
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
            "filter_loss": self._filter_loss(c),
        }
        return density, row

    def _filter_loss(self, c: torch.Tensor) -> float:
        """||(1 - F) c|| / ||c||: the fraction of the L2 norm one step's filter F takes from the state c, 0 without a
        filter.  spectral_tail is measured after the filter, which empties the top third at every step: this is
        what the filter removes instead."""
        if self.filter is None:
            return 0.0
        return float(torch.sqrt(self.basis.norm_squared(c - self.filter * c) / self.basis.norm_squared(c)))

    def keep(self, t: float, density: np.ndarray, row: dict) -> None:
        """Append a measured state to the saves, noting when the resolution is first lost: its spectral tail, or what
        the filter took from it over the save interval (its steps times `filter_loss`), exceeds the tolerance."""
        filtered = row["filter_loss"] * (self.steps - self.steps_at_save)
        self.steps_at_save = self.steps
        if max(row["spectral_tail"], filtered) > self.tail_tol and self.resolved_until is None:
            self.resolved_until = self.times[-1] if self.times else 0.0
            which = f"after t = {self.resolved_until:.4g}" if self.times else "from the start"
            tolerance, tail = self._tolerance_name(), row["spectral_tail"]
            cause = (f"spectral tail {tail:.2e} > {tolerance}" if tail > self.tail_tol else
                     f"the spectral filter (solver.filter_order = {self.case['solver']['filter_order']}) took "
                     f"{filtered:.2e} of the L2 norm since the last save > {tolerance} (the spectral tail, "
                     f"measured after the filter, is {tail:.2e})")
            message = (f"resolution lost at t = {t:.4g}: {cause}; results {which} are under-resolved (increase "
                       "sphere.lmax or add eps)")
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
        value, bound = w2_projection(self.points, masses, self.points, self.masses_0, self.subspace_E,
                                     self.w2_atoms)
        self.w2_error_bound = max(self.w2_error_bound, self.w2_grid_bound + bound)
        return value

    def dataset(self, status: str):
        basis = self.basis
        attrs = {
            "solver": "eulerian",
            "backend": basis.backend,
            "grid": basis.grid_name,
            "grid_shape": list(basis.grid_shape),
            "lmax": basis.lmax,
            "dtype": basis.placement.name,
            "device": str(basis.placement.device),
            "field": self.field,
            "scheme": self.scheme,
            "steps": int(self.steps),
            "wall_seconds": float(self.wall_seconds),
            "batch_members": int(self.batch_members),
            "w2_quantisation_bound": float(self.w2_error_bound),
            "resolved_until": "end" if self.resolved_until is None else float(self.resolved_until),
            "notes": "\n".join(self.notes),
        }
        return eulerian_dataset(self.saves(status, attrs, densities=self.densities), basis)

    def failure_cause(self) -> str:
        """An under-resolved density undershoots, and that is the usual cause of a failure: say so when the run
        had lost its resolution before."""
        if self.resolved_until is None:
            return ""
        last = f"spectral tail {self.rows[-1]['spectral_tail']:.2g} at the last save, " if self.rows else ""
        return (f"; it was under-resolved after t = {self.resolved_until:.4g} ({last}{self._tolerance_name()}): "
                "increase sphere.lmax or eps")

    def _tolerance_name(self) -> str:
        """The tolerance the tail was held to: diagnostics.tail_tol, or the round-off floor that replaced it."""
        if self.tail_tol > self.case["diagnostics"]["tail_tol"]:
            return f"tolerance {self.tail_tol:.2g}: {TAIL_ROUND_OFF_EPS} epsilons of {self.basis.placement.name}"
        return f"diagnostics.tail_tol = {self.tail_tol:.0e}"

    def unsaved(self, stored: int):
        """The saves after the first `stored` ones, as a Dataset (a checkpoint segment); None if none."""
        if stored == len(self.times):
            return None
        saved = self.times, self.densities, self.rows
        self.times, self.densities, self.rows = (values[stored:] for values in saved)
        try:
            return self.dataset("checkpoint segment")
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
                "recorder": {"steps": self.steps, "steps_at_save": self.steps_at_save,
                             "wall_seconds": float(self.wall_seconds),
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
        # steps_at_save is stored, not taken as `steps`: the steps to the last knot, which the layers may put after the
        # last save, and the filter's loss since that save (`keep`) then counted only the steps after the knot
        for key, value in scalars.items():
            setattr(recorder, key, value)
        return recorder
