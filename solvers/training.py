"""Training: minimise J(W) = l(mu_T) + lambda_reg / 2 int |W_t|^2 dt over piecewise-constant W
(docs/design.md "The model"), for one member or M members in lockstep.

A case with a [control] section is a training run (`spherepde run CASE.toml`, `spherepde.run`):

1. W starts at model.W on every layer; each iteration computes J and dJ/dW with the gradient of
   control.gradient (solvers/adjoint.py) and takes one step of the optimizer: "gd" (W <- W - lr dJ/dW)
   or "adam" (Adam with the default moments), lr = control.learning_rate.
   It stops after control.iterations steps, or earlier when |J_k - J_{k-1}| <= tol |J_k| or
   |dJ/dW|_F <= tol (control.tol > 0).  The cost and the gradient at the final W are evaluated too,
   so the history holds iterations + 1 values of J.  A step to a W whose run fails (J or dJ/dW not
   finite, or the forward run blew up) ends the training at the last W whose run passed: its trained
   run is made and returned as the last good state of a NumericalFailure (exit status 3); when the
   first evaluation fails already, that state is the forward run at the starting W (up to its own
   failure, if it has one) with an empty history (`kept_at_start`).
   "lbfgs" (scipy's L-BFGS-B without bounds, learning_rate unused) chooses its steps by a Wolfe line
   search, so J decreases at every iteration; an iteration may evaluate J and dJ/dW several times
   (scipy's maxfun of 4 iterations + 1 evaluations, which it checks between iterations only: a line search
   through failed trial points may go past it, 108 against 81 measured with 33 failures; a trial W whose run
   fails is rejected, see ``quasi_newton``).  It stops after control.iterations iterations, when
   the line search finds no decrease, or (tol > 0) when (J_{k-1} - J_k) <= tol max(|J_k|, |J_{k-1}|, 1)
   or max |dJ/dW| <= tol; the history holds the accepted iterates.
2. The trained forward run: the training's own forward map (solvers.adjoint: the time grid of the saves and
   the layer boundaries, steps no longer than time.dt) at the final W, recorded at the save times with the
   Eulerian solver's diagnostics.

Beyond the seeds' model (spherepde.model.parameters: several heads, B or V per layer, feed_forward = "mlp",
control.train any subset of W, B, V) the controls are theta (layers, p), starting at the case's parameters on
every layer, and J's regulariser is sum_g lambda_g / 2 sum_l |theta_{l,g}|^2 T / L over the trained groups
(solvers/controlled_forward.py).  The optimizer sees the trained entries only (`TrainedEntries`: gd, adam and
L-BFGS alike, on the flat (layers, k) array of them), the others keep their case values; |dJ/dW|_F above is the
norm over the trained entries, and the output's `W` is `W` or `W1`, `b`, `W2`, with `B` and `V` (layer, head,
row, col) (training_output.parameter_variables).  Its checkpoints keep the trained entries (layers, k) of each
evaluation (solvers/journal.py), and it resumes as the seeds' training does.

Members in lockstep (`train_members`): every member has its own optimizer, run in its own thread, and its own
state (Adam's moments, L-BFGS's memory and line search); whenever every member still training has asked for
its next J and dJ/dW, the requests are evaluated together, in one batched forward and one backward pass
(`Lockstep`).  A member that stops (converged, iterations reached, L-BFGS's line search done, a failure)
drops out of the batch: the next evaluations run the others only (ControlledForward.select).  So each member
sees the evaluations its serial training would see, to round-off, and takes the same steps.

Output: the Eulerian Dataset of the trained run plus `W` (layer, row, col), `loss` (iteration: J),
`terminal_loss` (iteration: l(mu_T)), `gradient_norm` (iteration: |dJ/dW|_F), `adjoint_norm` (time:
|grad phi_t|_{L2(mu_t)} of the final gradient, linearly interpolated from its step times to the save
times), with control.save_adjoint `phi` (adjoint_time, grid: the adjoint at the trained W, `adjoint_variables`),
`layer_time` (layer: start of each slice) and the seed-004 diagnostics of `turnpike_variables`
(the escape rate from the first gradient's adjoint, at its step times), and the attribute optimizer_stop:
why the optimizer stopped (iterations reached, which tolerance, or scipy's message with its count of
evaluations and of failed trial runs).  With a checkpoint (solvers.checkpoint: the command line's
--checkpoint-minutes, --checkpoint-steps, --resume) the training keeps its evaluations of J and dJ/dW
there, and a resumed training replays them and goes on where it was interrupted, ending bit for bit
where an uninterrupted one ends (solvers/journal.py); the trained run after it is one forward run and
is made again.
"""

import dataclasses
import threading
import time as wallclock
import warnings

import numpy as np
import torch
import xarray as xr

from solvers.adjoint import GRADIENTS
from solvers.controlled_forward import ControlledForward, Gradient
from solvers.eulerian import ForwardHooks, only
from solvers.eulerian_recorder import Recorder
from solvers.journal import Journal
from solvers.optimizers import TrainingResult, optimise
from solvers.timegrid import integrate
from solvers.training_output import (
    adjoint_variables,
    control_variables,
    finished,
    kept_at_start,
    turnpike_variables,
    unresolved_control,
)
from spherepde.base import interrupts
from spherepde.base.errors import NumericalFailure
from spherepde.base.progress import Progress
from spherepde.model.parameters import start_of_W


class Stopped(Exception):
    """Raised in a member's optimizer thread when the lockstep is abandoned (an interrupt, another member's
    error): the thread ends without a result."""


class Lockstep:
    """Evaluations of J and dJ/dW for M optimizers that run in their own threads, gathered into batched
    evaluations (module docstring).

    `evaluate(members, controls)` evaluates the members at the indices `members` (a list) at controls
    (len(members), L, d, d) and returns per member a Gradient or the NumericalFailure of its run.  `run(tasks)`
    runs task_m(gradient_of_m) for every member (gradient_of_m(controls) -> Gradient, or raising its
    NumericalFailure) and returns per member the task's result; with one member it runs in this thread.
    """

    def __init__(self, evaluate, progress: bool | None = None, total: float = 1.0):
        self.evaluate = evaluate
        self.progress, self.total = progress, total

    def run(self, tasks: list) -> list:
        if len(tasks) == 1:
            return [tasks[0](lambda controls: _raised(self.evaluate([0], controls[None])[0]))]
        condition = threading.Condition()
        pending, results, errors = {}, {}, {}
        answers = {}
        abandoned = threading.Event()

        def gradient_of(member):
            def ask(controls):
                with condition:
                    if abandoned.is_set():
                        raise Stopped
                    pending[member] = controls
                    condition.notify_all()
                    while member not in answers:
                        condition.wait()
                        if abandoned.is_set():
                            raise Stopped
                    answer = answers.pop(member)
                return _raised(answer)
            return ask

        def work(member):
            try:
                result = tasks[member](gradient_of(member))
            except Stopped:
                result = None
            except BaseException as error:  # noqa: B902 - handed to the coordinating thread
                with condition:
                    errors[member] = error
                    condition.notify_all()
                return
            with condition:
                results[member] = result
                condition.notify_all()

        threads = [threading.Thread(target=work, args=(m,), daemon=True) for m in range(len(tasks))]
        bar = Progress(self.total, enabled=self.progress, quantity="round")
        rounds = 0
        for thread in threads:
            thread.start()
        try:
            with bar.running():  # a log line every 30 s meanwhile: a round of evaluations can take longer
                while True:
                    with condition:
                        condition.wait_for(lambda: errors or len(pending) + len(results) == len(tasks))
                        if errors:
                            break
                        if not pending:
                            break
                        members = sorted(pending)
                        controls = torch.stack([pending.pop(m) for m in members])
                    for m, answer in zip(members, self.evaluate(members, controls)):
                        answers[m] = answer
                    rounds += 1
                    bar.update(min(float(rounds), self.total), members=len(members))
                    with condition:
                        condition.notify_all()
        finally:
            with condition:
                abandoned.set()
                condition.notify_all()
            for thread in threads:
                thread.join()
        if errors:
            interrupt = next((e for e in errors.values() if isinstance(e, KeyboardInterrupt)), None)
            raise interrupt or next(iter(errors.values()))
        return [results[m] for m in range(len(tasks))]


def _raised(answer):
    """A Gradient, or its NumericalFailure raised."""
    if isinstance(answer, BaseException):
        raise answer
    return answer


def train_members(forward: ControlledForward, progress: bool | None = None, starts: list | None = None,
                  checkpoints: list | None = None, states: torch.Tensor | None = None) -> list:
    """Run every member's optimizer (module docstring, step 1) from W_l = model.W, or from its controls `starts[m]`
    (layers, d, d); returns per member its TrainingResult, or the NumericalFailure of its first evaluation.  Each
    member's evaluations are kept in `checkpoints[m]` (and replayed from it when it is marked resume)."""
    states = forward.initial() if states is None else states
    kind = forward.case["control"]["gradient"]
    cache = {}

    def evaluate(members, controls):
        key = tuple(members)
        if key not in cache:
            cache.clear()  # a member dropped out: the batch of the rest
            cache[key] = forward if len(members) == forward.members else forward.select(members)
        return GRADIENTS[kind](cache[key], states[members], controls)

    def task(member):
        case = forward.cases[member]
        start = starts[member] if starts is not None and starts[member] is not None else None
        checkpoint = checkpoints[member] if checkpoints is not None else None

        def run(gradient_of):
            try:
                if not forward.layered:
                    return journaled_optimise(case, starting_W(forward, member, start), forward.layers, gradient_of,
                                              progress if forward.members == 1 else False, checkpoint)
                entries = TrainedEntries(starting_controls(forward, member, start), forward.trained)
                result = journaled_optimise(case, entries.of(entries.controls), forward.layers,
                                            entries.gradient_of(gradient_of), progress if forward.members == 1
                                            else False, checkpoint, per_layer=True)
                result.controls = entries.placed(result.controls)
                return result
            except NumericalFailure as failure:
                return failure
        return run

    total = max(member["control"]["iterations"] for member in forward.cases) + 1
    return Lockstep(evaluate, progress if forward.members > 1 else False, float(total)).run(
        [task(m) for m in range(forward.members)])


def train(forward: ControlledForward, c0=None, progress: bool | None = None, start: torch.Tensor | None = None,
          checkpoint=None) -> TrainingResult:
    """The training of a one-member forward map (`train_members`); raises its NumericalFailure."""
    return only(train_members(forward, progress, [start], [checkpoint], None if c0 is None else _states(forward, c0)))


def _states(forward: ControlledForward, c0) -> torch.Tensor:
    from spherepde.base.real_view import real_state

    return real_state(c0[None]) if c0.is_complex() else c0


def journaled_optimise(case, W: torch.Tensor, layers: int, gradient_of, progress: bool | None = None,
                       checkpoint=None, per_layer: bool = False) -> TrainingResult:
    """`optimise` of the case's [control] section, its evaluations kept in `checkpoint` (and replayed from it
    when it is marked resume; solvers/journal.py); an interrupt takes effect at the end of an evaluation.
    `per_layer`: W holds every layer's controls already (optimise)."""
    journal = Journal(case, gradient_of, checkpoint)
    if checkpoint is not None:
        checkpoint.stepping = True
    try:
        result = optimise(case["control"], W, layers, journal, progress, per_layer)
        journal.stop_if_interrupted()  # one that came after the last evaluation, or during a replay's last one
    finally:
        if checkpoint is not None:
            checkpoint.stepping = False
        with interrupts.held():  # an interrupt now stops the command once the evaluations are stored, not amid them
            journal.flush()
    result.notes += journal.notes
    return result


def starting_W(forward: ControlledForward, member: int, start: torch.Tensor | None) -> torch.Tensor:
    """The W member `member` starts from: its model.W (d, d) on every layer or its list of one per layer
    (layers, d, d), or the controls `start` (layers, d, d)."""
    problem = forward.problem
    if start is not None:
        return problem.placement.tensor(start)
    return start_of_W(forward.cases[member], problem.batch.models[member].W, problem.placement)


def starting_controls(forward: ControlledForward, member: int, start: torch.Tensor | None) -> torch.Tensor:
    """Member `member`'s starting controls on every layer: W (layers, d, d) (`starting_W`), or beyond the seeds'
    model theta (layers, p), the case's parameters (ForwardProblem.parameters) or `start`."""
    if not forward.layered:
        return starting_W(forward, member, start).expand(forward.layers, -1, -1)
    problem = forward.problem
    return problem.parameters[member] if start is None else problem.placement.tensor(start)


class TrainedEntries:
    """What the optimizer of a model beyond the seeds' sees: the trained entries theta[:, trained] (L, k) of the
    controls theta (L, p); the others keep the values of `controls`."""

    def __init__(self, controls: torch.Tensor, trained: torch.Tensor):
        self.controls, self.trained = controls, trained

    def of(self, theta: torch.Tensor) -> torch.Tensor:
        return theta[:, self.trained]

    def placed(self, entries: torch.Tensor) -> torch.Tensor:
        """theta (L, p): `controls` with the trained entries set to `entries` (L, k)."""
        theta = self.controls.clone()
        theta[:, self.trained] = entries.to(theta)
        return theta

    def gradient_of(self, gradient_of):
        """The optimizer's gradient_of: J and dJ/dtheta restricted to the trained entries."""
        def restricted(entries: torch.Tensor) -> Gradient:
            gradient = gradient_of(self.placed(entries))
            return dataclasses.replace(gradient, dW=self.of(gradient.dW))
        return restricted


def trained_runs(forward: ControlledForward, controls: torch.Tensor, states: torch.Tensor | None = None) -> list:
    """The forward runs with W = controls (M, L, d, d), recorded at the case's save times (module docstring, step
    2): per member its Recorder, or the NumericalFailure that stopped it (with its saves so far)."""
    problem = forward.problem
    states = forward.initial() if states is None else states
    coefficients = problem.coefficients(states)
    densities = problem.basis.synthesis(coefficients).cpu().double().numpy()
    recorders = [Recorder(problem, m, densities[m], controlled=True) for m in range(forward.members)]
    for m, recorder in enumerate(recorders):
        recorder.record(0.0, coefficients[m])
    drives = forward.drives(controls)
    hooks = ForwardHooks(problem, recorders, Progress(1.0, enabled=False), (states, 0.0, 0, False), drives,
                         {"dt": forward.dt})
    current = {}

    def begin(plan):
        current["drive"], current["factors"] = drives[plan.interval.layer], forward.factors(plan)

    plans = iter(forward.plans)
    for recorder in recorders:
        recorder.start_clock()
    with torch.no_grad():
        integrate(forward.grid, states, lambda interval, state: next(plans), begin,
                  lambda state: problem.step(state, current["drive"], current["factors"]), hooks)
    for recorder in recorders:
        recorder.tick()
    return [hooks.failures.get(m, recorder) for m, recorder in enumerate(recorders)]


def run_trainings(cases, progress: bool | None = None, starts: list | None = None, checkpoints: list | None = None):
    """Train the members `cases` in lockstep and return per member the Dataset of its trained forward run
    (module docstring), or the NumericalFailure that ended it (carrying its last good state)."""
    forward = ControlledForward(cases)
    states = forward.initial()
    started = wallclock.perf_counter()
    results = train_members(forward, progress, starts, checkpoints, states)
    training_seconds = wallclock.perf_counter() - started
    outcomes = [None] * forward.members
    trained = [m for m, result in enumerate(results) if isinstance(result, TrainingResult)]
    for m, result in enumerate(results):
        if isinstance(result, NumericalFailure):  # the first evaluation failed
            start = starting_controls(forward, m, starts[m] if starts else None)
            single = forward.select([m])
            outcomes[m] = kept_at_start(result, forward.cases[m], start,
                                        lambda controls: _run_dataset(single, controls, states[[m]], "failed"),
                                        _training_attributes(forward, forward.cases[m], training_seconds))
    if trained:
        batch = forward if len(trained) == forward.members else forward.select(trained)
        controls = torch.stack([results[m].controls for m in trained])
        recorders = trained_runs(batch, controls, states[trained])
        want_phi = [m for m in trained if forward.cases[m]["control"]["save_adjoint"]]
        phi = adjoint_variables(forward.select(want_phi), controls[[trained.index(m) for m in want_phi]],
                                states[want_phi]) if want_phi else {}
        for i, m in enumerate(trained):
            outcomes[m] = _trained_dataset(batch, i, forward.cases[m], results[m], recorders[i], training_seconds,
                                           phi.get(want_phi.index(m)) if m in want_phi else None)
    return outcomes


def _run_dataset(forward: ControlledForward, controls: torch.Tensor, states: torch.Tensor, status: str) -> xr.Dataset:
    """The Dataset of one member's trained run at `controls` (layers, d, d), or its failure's dataset raised."""
    (recorder,) = trained_runs(forward, controls[None], states)
    if isinstance(recorder, NumericalFailure):
        raise recorder
    return recorder.dataset(status)


def _trained_dataset(forward: ControlledForward, member: int, case, result: TrainingResult, recorder,
                     training_seconds: float, phi: dict | None):
    """The output of a member's training: its trained run with the control variables, or the failure."""
    if isinstance(recorder, NumericalFailure):  # the trained run failed where the training passed
        return NumericalFailure(f"{recorder} (the trained run; W and the loss history are kept)",
                                control_variables(recorder.dataset, case, result))
    recorder.notes += result.notes
    unresolved = unresolved_control(recorder.times, recorder.rows, bool(result.controls.abs().max() > 0))
    if unresolved is not None:
        warnings.warn(unresolved, RuntimeWarning, stacklevel=2)
        recorder.notes.append(unresolved)
    dataset = recorder.dataset("completed")
    dataset = control_variables(dataset, case, result)
    norms = np.interp(dataset["time"].values, result.final.times, result.final.adjoint_norm)
    dataset["adjoint_norm"] = (("time",), norms,
                               {"long_name": "|grad phi_t|_{L2(mu_t)} of the adjoint at the trained W", "units": "1"})
    if phi is not None:
        dataset = dataset.assign(phi)
    dataset = dataset.assign(turnpike_variables(forward, member, dataset, result.first))
    dataset.attrs.update(_training_attributes(forward, case, training_seconds))
    dataset.attrs.update({"iterations": len(result.costs) - 1, "optimizer_stop": result.stop})
    try:
        return finished(dataset, result)
    except NumericalFailure as failure:
        return failure


def _training_attributes(forward: ControlledForward, case, training_seconds: float) -> dict:
    """The attributes that say how a member was trained, whether or not an iteration finished."""
    return {"training": "trained control (solvers/training.py)", "gradient": case["control"]["gradient"],
            "optimizer": case["control"]["optimizer"], "training_steps": forward.steps, "training_dt": forward.dt,
            "training_seconds": training_seconds}


def run_training(case, progress: bool | None = None, start: torch.Tensor | None = None, checkpoint=None) -> xr.Dataset:
    """Train the case's control and return the Dataset of the trained forward run (module docstring).

    `start`: the controls W_l (layers, d, d) the optimizer starts from (None: model.W on every layer),
    e.g. to continue an earlier training from its `W`.  `checkpoint`: a solvers.checkpoint.Checkpoint that
    keeps the training's evaluations (and, marked resume, holds those of an interrupted training).
    """
    return only(run_trainings([case], progress, [start], [checkpoint]))


