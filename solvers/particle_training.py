"""Training through the particle system by torch autograd: the particle counterpart of solvers/training.py.

The particles of solvers/particles.py (same Model, drift and integrator), with W_t = W_l on slice
l = [l T / L, (l + 1) T / L) of L = control.layers equal slices:

    dX_i = P_{X_i}(W_t X_i + V m[mu_t^n](X_i)) dt + sqrt(2 eps) dB_i,    mu_t^n = (1/n) sum_i delta_{X_i(t)},

and the cost

    J(W) = l(mu_T^n) + lambda_reg / 2 sum_l |W_l|_F^2 T / L,

with the loss l of control.loss (spherepde.losses, atoms X_i(T) with masses 1/n).

Forward map.  x_0: particles.n draws from [initial] by a generator seeded with particles.seed
(solvers.particles.initial_state, as the particle solver draws them).  The particles.integrator
steps from knot to knot (the save times and the slice boundaries together, training.step_knots),
each interval split into equal steps no longer than particles.dt, else time.dt, so that W is
constant over every step.

Noise (control.noise).  "common", common random numbers: the noise generator is seeded with the same
seed (drawn from particles.seed after x_0) at the start of every forward run, so every evaluation of J
sees the same x_0 and Brownian increments, as if drawn once and stored.  J is then a deterministic,
smooth function of W, and reverse-mode autograd through the whole trajectory (every step, attention
sum and exponential map) gives its exact gradient dJ/dW: the gradient of the cost of this one noise
path, not of E J (tests/test_particle_training.py checks it against central differences).  The
optimum is then that path's: with few particles it can lie far from the mean-field one
(results/seed004_particles.md, bow loss).  "fresh": evaluation k draws its own x_0 and noise, as
particles.seed = the k-th child of numpy's SeedSequence(particles.seed) would, so dJ/dW is an unbiased
estimate of dE[J]/dW, a stochastic gradient for Adam or gradient descent (tests: its mean is the
mean-field gradient when the tokens do not interact).  Memory: autograd keeps every step's graph,
O(steps n^2) numbers (the attention kernels).

Optimizer: solvers.training.optimise (the same Adam / gradient descent, stopping rule and progress
output as the Eulerian training), with the same checkpoints of its evaluations (solvers/journal.py) when
the noise is common.  The trained forward run is the same forward map (same noise) at
the final W, recorded at the save times with the particle solver's diagnostics (ParticleRecorder);
with fresh noise, the path of particles.seed itself.

Phases.  The entropy of an empirical measure is not defined, so the three-phase test
(spherepde.turnpike.phases) runs on the interaction part of the seed's energy:

    interaction_gap(t) = I_n(mu_t^n) - I(rho_*),
    I_n = -1 / (2 n (n - 1)) sum_{i != j} exp(beta <X_i, B X_j>)   (the recorder's interaction_energy,
                                                                   unbiased for the mean-field I),
    I(rho) = -1/2 int int exp(beta <x, B y>) rho(x) rho(y) dsigma dsigma,

rho_* the Gibbs minimiser of E (turnpike.gibbs_minimum on the Eulerian grid of the case: sphere.lmax,
solver.field).  phases() sees the gap only through differences (threshold above the plateau median,
lift, relative variance), so the constant I(rho_*) changes none of its results; it only puts the gap
near 0 when the particles sit at the Gibbs state.  Dropping eps Ent changes the test where the width
of the cluster changes (the initial clustering, which it makes look larger), not its moving along the
circle (the terminal escape).  Only for the seed's model (unnormalized kernel, eps > 0, finite beta,
d = 2 or 3); otherwise the phase attributes are NaN and three_phase "false".

Output: the particle solver's Dataset of the trained run (diagnostics, `particles`) plus `W`, `layer_time`,
`loss`, `terminal_loss`, `gradient_norm` (training.control_variables), `mean_angle` and `interaction_gap`
(time), and the attributes three_phase, plateau_width, initial_width, terminal_width,
plateau_relative_variance, terminal_lift, terminal_displacement (angle of the
mean at T minus at the save nearest the plateau's middle) and gibbs_interaction_energy (I(rho_*)).
"""

import math
import time as wallclock
from dataclasses import replace

import numpy as np
import torch
import xarray as xr

from spherepde import turnpike
from spherepde.device import placement as make_placement
from spherepde.errors import CaseError, NumericalFailure
from spherepde.losses import make_loss
from spherepde.model import Model, interaction_energy

from .adjoint import Gradient
from .eulerian import ForwardProblem
from .particles import Integrator, ParticleField, ParticleRecorder, check_noise_step, initial_state
from .training import control_variables, finished, journaled_optimise, kept_at_start, step_knots


class ParticleControl:
    """The forward map W -> (X_i(t)) of a particle training case, its cost J and dJ/dW (module docstring)."""

    def __init__(self, case):
        self.case = case
        solver, control, timing = case["solver"], case["control"], case["time"]
        self.placement = make_placement(solver["device"], solver["dtype"])
        self.model = Model.from_case(case, self.placement)
        self.x0, self.noise_seed = initial_state(case, self.placement)
        self.fresh_seeds = (np.random.SeedSequence(case["particles"]["seed"]) if control["noise"] == "fresh"
                            else None)
        self.layers, self.t_end = control["layers"], timing["t_end"]
        self.saves, knots = step_knots(timing, self.layers)
        step = case["particles"].get("dt", timing["dt"])
        self.intervals = []  # (t0, t1, layer, steps, save time at t1 or None): W = controls[layer] on [t0, t1]
        for t0, t1 in zip(knots[:-1], knots[1:]):
            layer = min(int(0.5 * (t0 + t1) * self.layers / self.t_end), self.layers - 1)
            hits = self.saves[np.abs(self.saves - t1) <= 1e-12 * max(1.0, self.t_end)]
            save = float(hits[0]) if hits.size else None
            self.intervals.append((float(t0), float(t1), layer, max(1, math.ceil((t1 - t0) / step - 1e-9)), save))
        self.steps = sum(interval[3] for interval in self.intervals)
        self.dt = max((t1 - t0) / steps for t0, t1, _, steps, _ in self.intervals)
        check_noise_step(case, self.model.eps, self.dt)
        if "max_steps" in timing and self.steps > timing["max_steps"]:
            raise CaseError(f"time.max_steps: a forward run of the training needs {self.steps} steps, "
                            f"more than {timing['max_steps']}")
        self.loss = make_loss(control, case.dim)
        self.lambda_reg = control["lambda_reg"]
        self.masses = torch.full((self.x0.shape[0],), 1 / self.x0.shape[0], dtype=self.x0.dtype, device=self.x0.device)

    def run(self, x: torch.Tensor, controls: torch.Tensor, visit=None, noise_seed: int | None = None) -> torch.Tensor:
        """X(T) from X(0) = x with W_t = controls[l] on slice l, the Brownian path of noise_seed (None: the
        case's); visit(t, X(t)) at every save time, t = 0 too."""
        noise = torch.Generator(self.placement.device).manual_seed(
            self.noise_seed if noise_seed is None else noise_seed)
        name = self.case["particles"]["integrator"]
        if visit is not None:
            visit(0.0, x)
        for t0, t1, layer, steps, save in self.intervals:
            field = ParticleField.from_case(self.case, replace(self.model, W=controls[layer]))
            x = Integrator(name, field, self.model.eps, noise).interval(t0, x, (t1 - t0) / steps, steps)
            if save is not None and visit is not None:
                visit(save, x)
        return x

    def cost(self, x_end: torch.Tensor, controls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(J, l(mu_T^n)) for the particles X(T) = x_end."""
        loss = self.loss.value(x_end, self.masses)
        return loss + 0.5 * self.lambda_reg * (controls ** 2).sum() * (self.t_end / self.layers), loss

    def sample(self) -> tuple[torch.Tensor, int | None]:
        """(x_0, noise seed) of the next evaluation: the case's (common noise), or fresh draws."""
        if self.fresh_seeds is None:
            return self.x0, None
        (seed,) = self.fresh_seeds.spawn(1)
        return initial_state(self.case, self.placement, int(seed.generate_state(1, np.uint64)[0] >> 1))

    def gradient(self, controls: torch.Tensor) -> Gradient:
        """J and dJ/dW by autograd through the whole trajectory (no adjoint norms: Gradient.times is empty)."""
        controls = controls.detach().clone().requires_grad_(True)
        x0, noise_seed = self.sample()
        with torch.enable_grad():
            cost, loss = self.cost(self.run(x0, controls, noise_seed=noise_seed), controls)
            (dW,) = torch.autograd.grad(cost, controls)
        return Gradient(float(cost.detach()), float(loss.detach()), dW, [], [])

    def cost_of(self, controls: torch.Tensor) -> float:
        """J(W) without the gradient (finite differences)."""
        with torch.no_grad():
            return float(self.cost(self.run(self.x0, controls), controls)[0])


def run_particle_training(case, progress: bool | None = None, start: torch.Tensor | None = None,
                          checkpoint=None) -> xr.Dataset:
    """Train the case's control through the particle system and return the Dataset of the trained run.

    `start`: the controls W_l (layers, d, d) the optimizer starts from (None: model.W on every layer),
    e.g. an Eulerian training's W, to ask whether the particle cost has an optimum near it.  `checkpoint`:
    keeps the training's evaluations, as for the Eulerian training (solvers/journal.py); common noise only,
    since with fresh noise an evaluation's draws depend on how many came before it.
    """
    if checkpoint is not None and case["control"]["noise"] != "common":
        raise CaseError("checkpoints: a particle training on fresh noise is not checkpointed (its evaluations "
                        "are draws of a sequence that a resumed run would not continue); use control.noise = 'common'")
    forward = ParticleControl(case)

    def run_at(controls: torch.Tensor, status: str, notes=()) -> xr.Dataset:
        recorder = ParticleRecorder(case, forward.model, ParticleField.from_case(case, forward.model), forward.x0)
        recorder.notes += notes
        started = wallclock.perf_counter()
        with torch.no_grad():
            forward.run(forward.x0, controls, recorder.record)
        recorder.steps, recorder.dt = forward.steps, forward.dt
        recorder.wall_seconds = wallclock.perf_counter() - started
        return recorder.dataset(status)

    started = wallclock.perf_counter()
    initial = forward.model.W if start is None else forward.placement.tensor(start)
    try:
        result = journaled_optimise(case, initial, forward.layers, forward.gradient, progress, checkpoint)
    except NumericalFailure as failure:
        raise kept_at_start(failure, case, initial.expand(forward.layers, -1, -1),
                            lambda controls: run_at(controls, "failed")) from None
    training_seconds = wallclock.perf_counter() - started
    dataset = control_variables(run_at(result.controls, "completed", result.notes), case, result)
    dataset = dataset.assign(phase_variables(case, dataset))
    dataset.attrs.update({"training": "trained control through the particle system (solvers/particle_training.py)",
                          "gradient": f"autograd ({case['control']['noise']} noise)",
                          "optimizer": case["control"]["optimizer"],
                          "iterations": len(result.costs) - 1, "optimizer_stop": result.stop,
                          "training_seconds": training_seconds})
    return finished(dataset, result)


def phase_variables(case, dataset: xr.Dataset) -> dict:
    """`mean_angle` and `interaction_gap` (time) and the phase attributes, set on dataset.attrs (module docstring)."""
    times = dataset["time"].values
    angle = turnpike.mean_angle(dataset["mean"].values)
    variables = {"mean_angle": (("time",), angle, {"long_name": "angle of the mean position", "units": "radian"})}
    attrs = dict.fromkeys(("plateau_width", "initial_width", "terminal_width", "plateau_relative_variance",
                           "terminal_lift", "terminal_displacement",
                           "gibbs_interaction_energy"), math.nan)
    attrs["three_phase"] = "false"
    model = case["model"]
    if model["kernel"] == "unnormalized" and model["eps"] > 0 and math.isfinite(model["beta"]) and case.dim in (2, 3):
        problem = ForwardProblem(case)
        basis = problem.basis
        rho, _ = turnpike.gibbs_well(problem.model, problem.exp_kernel, basis)
        reference = interaction_energy(problem.model, problem.exp_kernel, basis, rho)
        gap = dataset["interaction_energy"].values - reference
        variables["interaction_gap"] = (("time",), gap, {
            "long_name": "interaction energy of the particles (U-statistic) minus that of the Gibbs minimiser",
            "units": "1"})
        test = turnpike.phases(times, gap)
        middle = int(np.argmin(np.abs(times - 0.5 * (test["plateau_start"] + test["plateau_end"]))))
        attrs.update({key: test[key] for key in ("plateau_width", "initial_width", "terminal_width",
                                                 "plateau_relative_variance", "terminal_lift")})
        attrs.update({
            "three_phase": "true" if test["three_phase"] else "false",
            "terminal_displacement": float(angle[-1] - angle[middle]), "gibbs_interaction_energy": reference})
    dataset.attrs.update(attrs)
    return variables
