"""Training through the particle system by reverse-mode differentiation: the particle counterpart of
solvers/training.py.

The particles of solvers/particles.py (same Model, drift and integrator), with W_t = W_l on slice
l = [l T / L, (l + 1) T / L) of L = control.layers equal slices:

    dX_i = P_{X_i}(W_t X_i + V m[mu_t^n](X_i)) dt + sqrt(2 eps) dB_i,    mu_t^n = (1/n) sum_i delta_{X_i(t)},

and the cost

    J(W) = l(mu_T^n) + lambda_reg / 2 sum_l |W_l|_F^2 T / L,

with the loss l of control.loss (spherepde.model.losses, atoms X_i(T) with masses 1/n).

Forward map.  x_0: particles.n draws from [initial] by a generator seeded with particles.seed
(solvers.particles.initial_state, as the particle solver draws them).  The particles.integrator
steps from knot to knot (solvers.timegrid.TimeGrid: the save times and the slice boundaries together),
each interval split into equal steps no longer than particles.dt, else time.dt, so that W is
constant over every step.  M members (seeds of one case, say) run as one batch of systems
(solvers.particles.ParticleSystem), each with its own draws.

Noise (control.noise).  "common", common random numbers: the noise generator is seeded with the same
seed (drawn from particles.seed after x_0) at the start of every forward run, so every evaluation of J
sees the same x_0 and Brownian increments, as if drawn once and stored.  J is then a deterministic,
smooth function of W, and reverse-mode differentiation through the whole trajectory (every step,
attention sum and exponential map) gives its exact gradient dJ/dW: the gradient of the cost of this one
noise path, not of E J (tests/test_particle_training.py checks it against central differences).  The
forward pass keeps every step's state and Gaussian draws (the tape, O(steps n d) numbers per member);
the backward pass then transposes one step at a time, from the last (solvers/particle_adjoint.py: by hand
where the attention is formed whole, else torch autograd through the step taken again).  The
optimum is then that path's: with few particles it can lie far from the mean-field one
(results/seed004_particles.md, bow loss).  "fresh": evaluation k draws its own x_0 and noise, as
particles.seed = (the first uint64 of the k-th child of numpy's SeedSequence(particles.seed)) >> 1 would (a seed
in [0, 2^63)), so dJ/dW is an unbiased estimate of dE[J]/dW, a stochastic gradient for Adam or gradient descent
(tests: its mean is the mean-field gradient when the tokens do not interact).

Beyond the seeds (spherepde.model.parameters: several heads, B and V per layer and trained, a two-layer
feed-forward; solvers.particles.ParticleSystem.general) the controls are every layer's parameters theta_l (p,)
and

    J(theta) = l(mu_T^n) + 1/2 sum_l sum_e lambda_e theta_{l,e}^2 T / L      (lambda_e: Layout.entry_weights),

its gradient by torch autograd through each step taken again (the tape as above; the by-hand transposes are
the seeds' model's), zero on the entries control.train leaves fixed (Layout.trained).  A member whose layers repeat
one seeds' model (solvers.particles.on_seeds_paths: per-layer lists of one B, V) is trained on the seeds' paths.
Measured at N = 64 x 20 replicas, T = 80, dt = 0.1 (cases/beyond-bow-joint.toml, one thread): one evaluation of J
and dJ/dtheta (W, B, V) takes 5.6 s of CPU, of J and dJ/dW (W only, by hand) 0.82 s.

Optimizer: solvers.training's (the same Adam / gradient descent / L-BFGS, stopping rule, lockstep of
members and progress output as the Eulerian training), with the same checkpoints of its evaluations
(solvers/journal.py) when the noise is common.  The trained forward run is the same forward map (same noise) at
the final W, recorded at the save times with the particle solver's diagnostics (ParticleRecorder);
with fresh noise, the path of particles.seed itself.

Phases.  The entropy of an empirical measure is not defined, so the three-phase test
(spherepde.analysis.turnpike.phases) runs on the interaction part of the seed's energy:

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
d = 2 or 3); otherwise the phase attributes are NaN and three_phase "untested" (not "false": the test did
not run).

Output: the particle solver's Dataset of the trained run (diagnostics, `particles`) plus `W`, `layer_time`,
`loss`, `terminal_loss`, `gradient_norm` (training_output.control_variables; beyond the seeds theta's variables of
training_output.parameter_variables in place of `W`: W or W1, b, W2, and B, V (layer, head, row, col)), `mean_angle`
and `interaction_gap` (time; beyond the seeds no gap, the phase attributes NaN), and the attributes three_phase,
plateau_width, initial_width, terminal_width, plateau_relative_variance, terminal_lift, terminal_displacement (the
angle the mean turns from the save nearest the plateau's middle to T: turnpike.terminal_displacement) and
gibbs_interaction_energy (I(rho_*)).
"""

import math
import time as wallclock

import numpy as np
import torch
import xarray as xr

from solvers import particle_adjoint
from solvers.controlled_forward import Gradient
from solvers.eulerian import only
from solvers.forward_problem import ForwardProblem
from solvers.particle_adjoint import Replay
from solvers.particles import ParticleSystem, initial_state, run_members
from solvers.timegrid import Plan, TimeGrid, fixed_steps
from solvers.training import Lockstep, journaled_optimise
from solvers.training_output import control_variables, finished, kept_at_start, parameter_variables
from spherepde.analysis import turnpike
from spherepde.base.errors import CaseError, NumericalFailure
from spherepde.model.attention import interaction_energy
from spherepde.model.losses import make_loss
from spherepde.model.parameters import start_of_W


class ParticleControl:
    """The forward map W -> (X_i(t)) of the particle training members `cases` (one case or a list: see
    ParticleSystem), their costs J and dJ/dW (module docstring); beyond the seeds (ParticleSystem.general) the
    controls are theta (M, L, p) and the gradient dJ/dtheta, zero on the entries control.train leaves fixed."""

    def __init__(self, cases, general: bool | None = None):
        self.system = ParticleSystem(cases, general)
        self.cases, self.case = self.system.cases, self.system.case
        control, timing = self.case["control"], self.case["time"]
        self.placement = self.system.placement
        self.x0, self.noise_seeds = self.system.x0, self.system.noise_seeds
        self.fresh_seeds = ([np.random.SeedSequence(member["particles"]["seed"]) for member in self.cases]
                            if control["noise"] == "fresh" else None)
        self.layers, self.t_end = control["layers"], timing["t_end"]
        self.grid = TimeGrid.from_case(self.case)
        step = self.case["particles"].get("dt", timing["dt"])
        members = len(self.cases)
        self.plans = []
        for interval in self.grid.intervals:
            steps = fixed_steps(interval, step)
            self.plans.append(Plan(interval, np.full(members, steps), np.full(members, interval.length / steps)))
        self.steps = sum(int(plan.steps[0]) for plan in self.plans)
        self.dt = max(float(plan.dt[0]) for plan in self.plans)
        self.system.check_steps(Plan(self.grid.intervals[0], np.ones(1), np.array([self.dt])))
        if "max_steps" in timing and self.steps > timing["max_steps"]:
            raise CaseError(f"time.max_steps: a forward run of the training needs {self.steps} steps, "
                            f"more than {timing['max_steps']}")
        self.losses = [make_loss(member["control"], member.dim) for member in self.cases]
        like = self.system.drives
        if self.system.general:  # lambda_e (M, 1, p) of every entry, and the trained ones
            self.entry_weights = torch.stack([layout.entry_weights(like) for layout in self.system.layouts])[:, None]
            self.trained = torch.stack([layout.trained(like) for layout in self.system.layouts])[:, None]
        else:
            self.lambda_reg = self.placement.tensor([dict(layout.lambda_reg).get("W", 0.0)
                                                     for layout in self.system.layouts])
        n = self.x0.shape[1]
        self.masses = torch.full((n,), 1 / n, dtype=self.x0.dtype, device=self.x0.device)
        self.by_hand = particle_adjoint.supports(self.system.integrator, self.x0)  # else autograd's transposes

    @property
    def members(self) -> int:
        return len(self.cases)

    def select(self, members: list) -> "ParticleControl":
        """The forward map of the members at the indices `members` (solvers/training.py: members that stop drop
        out of the batch)."""
        chosen = ParticleControl.__new__(ParticleControl)
        chosen.__dict__.update(self.__dict__)
        system = self.system.select(members)
        chosen.system, chosen.cases = system, system.cases
        chosen.x0, chosen.noise_seeds = system.x0, system.noise_seeds
        chosen.fresh_seeds = None if self.fresh_seeds is None else [self.fresh_seeds[m] for m in members]
        chosen.plans = [Plan(plan.interval, plan.steps[members], plan.dt[members]) for plan in self.plans]
        chosen.losses = [self.losses[m] for m in members]
        if system.general:
            chosen.entry_weights, chosen.trained = self.entry_weights[members], self.trained[members]
        else:
            chosen.lambda_reg = self.lambda_reg[members]
        return chosen

    def run(self, x: torch.Tensor, controls: torch.Tensor, noise_seeds: list | None = None, tape: list | None = None):
        """X(T) (M, n, d) from X(0) = x with W_t = controls[:, l] on slice l, the Brownian paths of noise_seeds
        (None: the members'); with `tape` (a list), every step's (state, W, h, k, steps, draws) is appended."""
        integrator, noise = self.system.integrator, self.system.noise(noise_seeds)
        for plan in self.plans:
            steps, h = int(plan.steps[0]), float(plan.dt[0])
            W = controls[:, plan.interval.layer]
            draws = Replay(noise.draws(integrator.draw_count(steps)))
            for k in range(steps):
                taken = len(draws.taken)
                if tape is not None:
                    tape.append((x, W, h, k, steps, draws, taken))
                x = integrator.step(x, W, h, k, steps, draws)
        return x

    def costs(self, x_end: torch.Tensor, controls: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(J (M,), l(mu_T^n) (M,)) for the particles X(T) = x_end: J = l + lambda / 2 sum_l |W_l|^2 T / L, beyond the
        seeds l + 1/2 sum_l sum_e lambda_e theta_{l,e}^2 T / L (Layout.entry_weights)."""
        losses = torch.stack([loss.value(x_end[m], self.masses) for m, loss in enumerate(self.losses)])
        if self.system.general:
            regulariser = 0.5 * (self.entry_weights * controls ** 2).flatten(1).sum(1) * (self.t_end / self.layers)
        else:
            regulariser = 0.5 * self.lambda_reg * (controls ** 2).flatten(1).sum(1) * (self.t_end / self.layers)
        return losses + regulariser, losses

    def samples(self) -> tuple[torch.Tensor, list | None]:
        """(x_0 (M, n, d), noise seeds) of the next evaluation: the members' own (common noise), or fresh draws."""
        if self.fresh_seeds is None:
            return self.x0, None
        # the shift on a Python int: numpy < 2 promotes uint64 >> int64 to float64, which has no shift
        draws = [initial_state(member, self.placement, int(sequence.spawn(1)[0].generate_state(1, np.uint64)[0]) >> 1)
                 for member, sequence in zip(self.cases, self.fresh_seeds)]
        return torch.stack([x for x, _ in draws]), [seed for _, seed in draws]

    def gradients(self, controls: torch.Tensor) -> list:
        """Per member J and dJ/dW (a Gradient; no adjoint norms: Gradient.times is empty), or the NumericalFailure
        of a run whose particles left the finite numbers: one forward pass keeping its tape, then the transpose of
        every step from the last (solvers/particle_adjoint.py: by hand for the direct dense attention, else by
        autograd through that step alone)."""
        controls = controls.detach()
        x0, seeds = self.samples()
        integrator, tape = self.system.integrator, []
        with torch.no_grad():
            if self.by_hand:
                program = integrator.direct_step(x0)
                x_end, tape = particle_adjoint.taped_run(program, self.plans, x0, controls, self.system.noise(seeds),
                                                         integrator.draw_count)
            else:
                x_end = self.run(x0, controls, seeds, tape)
        with torch.enable_grad():
            x = x_end.clone().requires_grad_(True)
            W_all = controls.clone().requires_grad_(True)
            costs, losses = self.costs(x, W_all)
            x_bar, W_bar = torch.autograd.grad(costs.sum(), (x, W_all))
        W_bar = W_bar.clone()
        with torch.no_grad():
            if self.by_hand:
                particle_adjoint.transposed_run(program, tape, x_bar, W_bar)
            else:
                for (state, W, h, k, steps, draws, taken), layer in zip(reversed(tape), reversed(self._layers())):
                    x_bar, layer_bar = particle_adjoint.autograd_transpose(integrator, state, W, h, k, steps,
                                                                           draws.replay(taken), x_bar)
                    W_bar[:, layer] += layer_bar
        if self.system.general:  # the entries control.train leaves fixed
            W_bar = torch.where(self.trained, W_bar, 0.0)
        finite = torch.isfinite(x_end).flatten(1).all(1).tolist()
        costs, losses = costs.detach(), losses.detach()
        return [Gradient(float(costs[m]), float(losses[m]), W_bar[m], [], []) if finite[m] else
                NumericalFailure("numerical failure: a particle position became non-finite in the forward run")
                for m in range(self.members)]

    def _layers(self) -> list:
        return [plan.interval.layer for plan in self.plans for _ in range(int(plan.steps[0]))]

    def cost_of(self, controls: torch.Tensor) -> float:
        """J(W) of the first member without the gradient (finite differences); controls (L, d, d), or theta (L, p)
        beyond the seeds."""
        controls = controls.expand((self.members,) + tuple(controls.shape))
        with torch.no_grad():
            return float(self.costs(self.run(self.x0, controls), controls)[0][0])

    def gradient(self, controls: torch.Tensor) -> Gradient:
        """The first member's J and dJ/dW at controls (L, d, d) (dJ/dtheta at theta (L, p) beyond the seeds; one
        member's training; tests)."""
        return only(self.select([0]).gradients(controls[None]))


def run_particle_trainings(cases, progress: bool | None = None, starts: list | None = None,
                           checkpoints: list | None = None) -> list:
    """Train the members' controls through their particle systems in lockstep (solvers.training.Lockstep) and
    return per member the Dataset of its trained run, or the NumericalFailure that ended it.

    Beyond the seeds the optimizer's controls are theta (L, p) seen as (L, 1, p) (`optimizer_view`:
    solvers.optimizers.optimise expands a (d, d) start to every layer and keeps a start with a layer axis), and
    the output's parameters are solvers.training_output.parameter_variables' (`with_parameters`)."""
    forward = ParticleControl(cases)
    general = forward.system.general
    for checkpoint in checkpoints or []:
        if checkpoint is not None and forward.case["control"]["noise"] != "common":
            raise CaseError("checkpoints: a particle training on fresh noise is not checkpointed (its evaluations "
                            "are draws of a sequence that a resumed run would not continue); use control.noise = "
                            "'common'")
    cache = {}

    def evaluate(members, controls):
        key = tuple(members)
        if key not in cache:
            cache.clear()
            cache[key] = forward if len(members) == forward.members else forward.select(members)
        if not general:
            return cache[key].gradients(controls)
        return [optimizer_view(gradient) for gradient in cache[key].gradients(controls[..., 0, :])]

    def task(member):
        start = starts[member] if starts is not None else None
        initial = starting_point(forward, member, start)
        initial = initial[:, None] if general else initial
        checkpoint = checkpoints[member] if checkpoints is not None else None

        def run(gradient_of):
            try:
                return journaled_optimise(forward.cases[member], initial, forward.layers, gradient_of,
                                          progress if forward.members == 1 else False, checkpoint)
            except NumericalFailure as failure:
                return failure
        return run

    started = wallclock.perf_counter()
    total = max(member["control"]["iterations"] for member in forward.cases) + 1
    results = Lockstep(evaluate, progress if forward.members > 1 else False, float(total)).run(
        [task(m) for m in range(forward.members)])
    training_seconds = wallclock.perf_counter() - started
    for result in results:
        if general and not isinstance(result, NumericalFailure):
            result.controls = result.controls[:, 0]

    def run_at(members, controls, status, notes):
        chosen = forward.select(members)
        outcomes = run_members(chosen.system, False, controls, forward.grid)
        datasets = []
        for outcome, note in zip(outcomes, notes):
            dataset = outcome.dataset if isinstance(outcome, NumericalFailure) else outcome
            dataset.attrs["status"] = status if not isinstance(outcome, NumericalFailure) else dataset.attrs["status"]
            dataset.attrs["notes"] = "\n".join(filter(None, [dataset.attrs.get("notes", "")] + list(note)))
            datasets.append((dataset, outcome))
        return datasets

    def attributes(m):
        """The attributes that say how member m was trained, whether or not an iteration finished."""
        return {"training": "trained control through the particle system (solvers/particle_training.py)",
                "gradient": (f"{'transposed steps by hand' if forward.by_hand else 'autograd'} "
                             f"({forward.case['control']['noise']} noise)"),
                "optimizer": forward.cases[m]["control"]["optimizer"], "training_seconds": training_seconds}

    outcomes = [None] * forward.members
    for m, result in enumerate(results):
        if isinstance(result, NumericalFailure):
            initial = starting_point(forward, m, None if starts is None else starts[m])

            def run_start(controls, m=m):
                return _dataset_or_raise(run_at([m], controls[None], "failed", [[]])[0])
            if not general:
                outcomes[m] = kept_at_start(result, forward.cases[m], initial.expand(forward.layers, -1, -1),
                                            run_start, attributes(m))
                continue
            layout = forward.system.layouts[m]
            failure = kept_at_start(result, forward.cases[m], feed_forward_placeholder(layout, initial),
                                    lambda _, initial=initial, run_start=run_start: run_start(initial), attributes(m))
            outcomes[m] = NumericalFailure(str(failure), with_parameters(failure.dataset, layout, initial))
    trained = [m for m, result in enumerate(results) if not isinstance(result, NumericalFailure)]
    if trained:
        controls = torch.stack([results[m].controls for m in trained])
        runs = run_at(trained, controls, "completed", [results[m].notes for m in trained])
        for (dataset, outcome), m in zip(runs, trained):
            result = results[m]
            if general:
                theta, layout = result.controls, forward.system.layouts[m]
                result.controls = feed_forward_placeholder(layout, theta)
                dataset = with_parameters(control_variables(dataset, forward.cases[m], result), layout, theta)
                result.controls = theta
            else:
                dataset = control_variables(dataset, forward.cases[m], result)
            dataset = dataset.assign(phase_variables(forward.cases[m], dataset, general))
            dataset.attrs.update(attributes(m))
            dataset.attrs.update({"iterations": len(result.costs) - 1, "optimizer_stop": result.stop})
            if isinstance(outcome, NumericalFailure):
                outcomes[m] = NumericalFailure(f"{outcome} (the trained run; W and the loss history are kept)", dataset)
                continue
            try:
                outcomes[m] = finished(dataset, result)
            except NumericalFailure as failure:
                outcomes[m] = failure
    return outcomes


def starting_point(forward: ParticleControl, member: int, start) -> torch.Tensor:
    """Where member `member`'s optimizer starts: `start` (controls), else on the seeds' paths its model.W (d, d) or
    its list of one per layer (layers, d, d), beyond them its theta (L, p) of parameters_of."""
    if start is not None:
        return forward.placement.tensor(start)
    if forward.system.general:
        return forward.system.drives[member]
    return start_of_W(forward.cases[member], forward.system.batch.models[member].W, forward.placement)


def optimizer_view(gradient):
    """A Gradient of theta (L, p) as the optimizer sees it, dJ/dtheta (L, 1, p) (run_particle_trainings), or the
    NumericalFailure it is."""
    if isinstance(gradient, NumericalFailure):
        return gradient
    return Gradient(gradient.cost, gradient.loss, gradient.dW[:, None], gradient.times, gradient.adjoint_norm)


def feed_forward_placeholder(layout, theta: torch.Tensor) -> torch.Tensor:
    """(L, d, d) for solvers.training_output's control_variables, which writes the controls as `W` (layer, row,
    col) with the history: theta's W for the linear feed-forward, zeros for the two-layer one; `with_parameters`
    then writes theta's own variables in its place."""
    if layout.hidden == 0:
        return layout.unpack(theta)["W"]
    return theta.new_zeros((theta.shape[0], layout.dim, layout.dim))


def with_parameters(dataset: xr.Dataset, layout, theta: torch.Tensor) -> xr.Dataset:
    """`dataset` with theta (L, p)'s variables (training_output.parameter_variables) in place of `W`."""
    return dataset.drop_vars("W").assign(parameter_variables(layout, theta))


def _dataset_or_raise(pair):
    dataset, outcome = pair
    if isinstance(outcome, NumericalFailure):
        raise NumericalFailure(str(outcome), dataset)
    return dataset


def run_particle_training(case, progress: bool | None = None, start: torch.Tensor | None = None,
                          checkpoint=None) -> xr.Dataset:
    """Train the case's control through the particle system and return the Dataset of the trained run.

    `start`: the controls W_l (layers, d, d) the optimizer starts from (None: model.W on every layer),
    e.g. an Eulerian training's W, to ask whether the particle cost has an optimum near it.  `checkpoint`:
    keeps the training's evaluations, as for the Eulerian training (solvers/journal.py); common noise only,
    since with fresh noise an evaluation's draws depend on how many came before it.
    """
    return only(run_particle_trainings([case], progress, [start], [checkpoint]))


def phase_variables(case, dataset: xr.Dataset, general: bool = False) -> dict:
    """`mean_angle` and `interaction_gap` (time) and the phase attributes, set on dataset.attrs (module docstring);
    `general` (beyond the seeds' model, whose energy is not the seed's): the attributes NaN."""
    times = dataset["time"].values
    angle = turnpike.mean_angle(dataset["mean"].values)
    variables = {"mean_angle": (("time",), angle, {"long_name": "angle of the mean position", "units": "radian"})}
    attrs = dict.fromkeys(("plateau_width", "initial_width", "terminal_width", "plateau_relative_variance",
                           "terminal_lift", "terminal_displacement",
                           "gibbs_interaction_energy"), math.nan)
    attrs["three_phase"] = "untested"
    model = case["model"]
    if (not general and model["kernel"] == "unnormalized" and model["eps"] > 0 and math.isfinite(model["beta"])
            and case.dim in (2, 3)):
        problem = ForwardProblem(case)
        basis = problem.basis
        model, exp_kernel = problem.model, problem.kernels.member(0)
        rho, _ = turnpike.gibbs_well(model, exp_kernel, basis)
        reference = interaction_energy(model, exp_kernel, basis, rho)
        gap = dataset["interaction_energy"].values - reference
        variables["interaction_gap"] = (("time",), gap, {
            "long_name": "interaction energy of the particles (U-statistic) minus that of the Gibbs minimiser",
            "units": "1"})
        test = turnpike.phases(times, gap)
        attrs.update({key: test[key] for key in ("plateau_width", "initial_width", "terminal_width",
                                                 "plateau_relative_variance", "terminal_lift")})
        attrs.update({"three_phase": turnpike.verdict(test),
                      "terminal_displacement": turnpike.terminal_displacement(times, dataset["mean"].values, test),
                      "gibbs_interaction_energy": reference})
    dataset.attrs.update(attrs)
    return variables
