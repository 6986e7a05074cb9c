"""Training: minimise J(W) = l(mu_T) + lambda_reg / 2 int |W_t|^2 dt over piecewise-constant W (DESIGN §2).

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
   (at most 4 iterations + 1 evaluations in all; a trial W whose run fails is rejected, see
   ``quasi_newton``).  It stops after control.iterations iterations, when
   the line search finds no decrease, or (tol > 0) when (J_{k-1} - J_k) <= tol max(|J_k|, |J_{k-1}|, 1)
   or max |dJ/dW| <= tol; the history holds the accepted iterates.
2. The trained forward run: the forward equation with the final W, each interval between
   consecutive save times and slice boundaries split into equal steps no longer than time.dt (so
   every save time is hit and W is constant over every step), recorded with the Eulerian solver's
   diagnostics.  Should it fail where the training's steps passed, its last good state (exit status 3)
   holds W and the training's history beside the saves before the failure.

Output: the Eulerian Dataset of the trained run plus `W` (layer, row, col), `loss` (iteration: J),
`terminal_loss` (iteration: l(mu_T)), `gradient_norm` (iteration: |dJ/dW|_F), `adjoint_norm` (time:
|grad phi_t|_{L2(mu_t)} of the final gradient, linearly interpolated from its step times to the save
times), with control.save_adjoint `phi` (adjoint_time, grid: the adjoint at the trained W, `adjoint_variables`),
`layer_time` (layer: start of each slice) and the seed-004 diagnostics of `turnpike_variables`
(the escape rate from the first gradient's adjoint, at its step times), and the attribute optimizer_stop:
why the optimizer stopped (iterations reached, which tolerance, or scipy's message with its count of
evaluations and of failed trial runs).  With a checkpoint (spherepde.checkpoint: the command line's
--checkpoint-minutes, --checkpoint-steps, --resume) the training keeps its evaluations of J and dJ/dW
there, and a resumed training replays them and goes on where it was interrupted, ending bit for bit
where an uninterrupted one ends (solvers/journal.py); the trained run after it is one forward run and
is made again.
"""

import math
import time as wallclock

import numpy as np
import torch
import xarray as xr

from spherepde import turnpike
from spherepde.errors import NumericalFailure
from spherepde.initial import initial_density
from spherepde.progress import Progress

from .adjoint import GRADIENTS, ControlledForward, Gradient
from .eulerian import Recorder, checked_state, save_times
from .journal import Journal


class TrainingResult:
    """The trained controls, the per-iteration history, the first (at the initial control) and final gradients,
    why the optimizer stopped (`stop`, one line: the output's optimizer_stop attribute) and, when a numerical
    failure stopped it, that failure's message (`failure`; the controls are then the last good ones)."""

    def __init__(self, controls, costs, losses, gradient_norms, first, final, stop, failure=None):
        self.controls, self.costs, self.losses, self.gradient_norms, self.first, self.final = (
            controls, costs, losses, gradient_norms, first, final)
        self.stop = stop
        self.failure = failure  # the numerical failure that ended the training early, or None
        self.notes = []  # lines for the output's `notes`


class GradientDescent:
    """W <- W - lr dJ/dW."""

    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate

    def step(self, parameter: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
        return parameter - self.learning_rate * gradient


class Adam:
    """Adam (Kingma & Ba 2015) with the usual moments beta_1 = 0.9, beta_2 = 0.999 and eps = 1e-8:
    m <- b1 m + (1 - b1) g,  v <- b2 v + (1 - b2) g^2,  W <- W - lr m_hat / (sqrt(v_hat) + eps),
    m_hat = m / (1 - b1^k), v_hat = v / (1 - b2^k) at step k.  (torch.optim's update, written out:
    importing torch.optim pulls in torch._dynamo, seconds of start-up for a few lines of arithmetic.)"""

    def __init__(self, learning_rate: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.learning_rate, self.betas, self.eps = learning_rate, betas, eps
        self.count, self.m, self.v = 0, 0.0, 0.0

    def step(self, parameter: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
        b1, b2 = self.betas
        self.count += 1
        self.m = b1 * self.m + (1 - b1) * gradient
        self.v = b2 * self.v + (1 - b2) * gradient * gradient
        m_hat = self.m / (1 - b1 ** self.count)
        v_hat = self.v / (1 - b2 ** self.count)
        return parameter - self.learning_rate * m_hat / (torch.sqrt(v_hat) + self.eps)


OPTIMIZERS = {"gd": GradientDescent, "adam": Adam}


def train(forward: ControlledForward, c0: torch.Tensor, progress: bool | None = None,
          start: torch.Tensor | None = None, checkpoint=None) -> TrainingResult:
    """Run the optimizer of the case's [control] section from W_l = model.W (module docstring, step 1),
    or from the controls `start` (layers, d, d); its evaluations are kept in `checkpoint` (and replayed from
    it when it is marked resume), see solvers/journal.py."""
    gradient_of = GRADIENTS[forward.case["control"]["gradient"]]
    return journaled_optimise(forward.case, starting_W(forward, start), forward.layers,
                              lambda controls: gradient_of(forward, c0, controls), progress, checkpoint)


def journaled_optimise(case, W: torch.Tensor, layers: int, gradient_of, progress: bool | None = None,
                       checkpoint=None) -> TrainingResult:
    """`optimise` of the case's [control] section, its evaluations kept in `checkpoint` (and replayed from it
    when it is marked resume; solvers/journal.py); an interrupt takes effect at the end of an evaluation."""
    journal = Journal(case, gradient_of, checkpoint)
    if checkpoint is not None:
        checkpoint.stepping = True
    try:
        result = optimise(case["control"], W, layers, journal, progress)
        journal.stop_if_interrupted()  # one that came after the last evaluation, or during a replay's last one
    finally:
        if checkpoint is not None:
            checkpoint.stepping = False
        journal.flush()
    result.notes += journal.notes
    return result


def starting_W(forward: ControlledForward, start: torch.Tensor | None) -> torch.Tensor:
    """The W the optimizer starts from on every layer: model.W, or the controls `start` (layers, d, d)."""
    return forward.problem.model.W if start is None else forward.problem.placement.tensor(start)


def _checked(gradient, iteration: int, loss: str | None):
    """The gradient, or NumericalFailure when J or dJ/dW is not finite; the message gives J and l(mu_T)
    (`loss`: control.loss, for its advice)."""
    finite_dW = bool(torch.isfinite(gradient.dW).all())
    if math.isfinite(gradient.cost) and finite_dW:
        return gradient
    advice = "reduce time.dt" + (" or control.learning_rate" if iteration else "")
    if loss == "bow" and (not math.isfinite(gradient.loss) or math.isfinite(gradient.cost)):  # the loss's doing
        advice += ("; a bow candidate with p_k(mu_T) <= 0, or scores softmax(tau <x, c_k>) saturated to 0 and 1, "
                   "make l(mu_T) or its gradient non-finite: lower control.tau")
    raise NumericalFailure(f"numerical failure at training iteration {iteration}: J = {gradient.cost:g}, l(mu_T) = "
                           f"{gradient.loss:g}{'' if finite_dW else ', dJ/dW not finite'} ({advice})")


def optimise(control: dict, W: torch.Tensor, layers: int, gradient_of, progress: bool | None = None) -> TrainingResult:
    """The optimizer loop of the module docstring, step 1, from W_l = W on every layer; gradient_of(controls)
    returns the adjoint.Gradient (J, l(mu_T), dJ/dW, ...) at controls (layers, d, d)."""
    parameter = W.detach().clone().expand(layers, -1, -1).contiguous()
    if control["optimizer"] == "lbfgs":
        return quasi_newton(control, parameter, gradient_of, progress)
    optimizer = OPTIMIZERS[control["optimizer"]](control["learning_rate"])
    costs, losses, norms, first, failure, good = [], [], [], None, None, None
    bar = Progress(float(max(control["iterations"], 1)), enabled=progress)
    for iteration in range(control["iterations"] + 1):
        try:
            gradient = _checked(gradient_of(parameter.detach()), iteration, control.get("loss"))
        except NumericalFailure as error:
            if good is None:
                raise
            parameter, gradient = good
            failure = str(error)
            stop = f"numerical failure at iteration {iteration}: the controls of iteration {iteration - 1} are kept"
            break
        good = (parameter, gradient)
        if first is None:
            first = gradient
        costs.append(gradient.cost)
        losses.append(gradient.loss)
        norms.append(float(gradient.dW.norm()))
        bar.update(float(iteration), J=gradient.cost, loss=gradient.loss, grad=norms[-1])
        stop = None
        if control["tol"] > 0 and norms[-1] <= control["tol"]:
            stop = "converged: |dJ/dW|_F <= tol"
        elif control["tol"] > 0 and len(costs) > 1 and abs(costs[-1] - costs[-2]) <= control["tol"] * abs(costs[-1]):
            stop = "converged: |J_k - J_(k-1)| <= tol |J_k|"
        elif iteration == control["iterations"]:
            stop = "control.iterations reached"
        if stop is not None:
            break
        parameter = optimizer.step(parameter, gradient.dW)
    bar.close()
    return TrainingResult(parameter.detach(), costs, losses, norms, first, gradient, stop, failure)


def quasi_newton(control: dict, parameter: torch.Tensor, gradient_of, progress: bool | None = None) -> TrainingResult:
    """L-BFGS from the controls `parameter` (module docstring, step 1): scipy's L-BFGS-B on the flattened
    controls in float64, each evaluation one gradient_of; the history holds the accepted iterates.

    A trial point of the line search where J or dJ/dW is not finite (the explicit transport fails for
    too large a W) gets J = 1e3 (1 + |J_0|) and a zero gradient, so that the search backs off; only a
    failure at the start raises NumericalFailure.  Evaluations are cached by their point: scipy asks
    for the current point again after a rejected trial."""
    from scipy.optimize import minimize

    shape, dtype, device = parameter.shape, parameter.dtype, parameter.device
    evaluations, history, failures = {}, [], 0
    bar = Progress(float(max(control["iterations"], 1)), enabled=progress)

    def evaluation(x):
        nonlocal failures
        key = x.tobytes()
        if key not in evaluations:
            controls = torch.tensor(x.reshape(shape), dtype=dtype, device=device)  # a copy: scipy reuses x
            try:
                gradient = _checked(gradient_of(controls), len(history), control.get("loss"))
            except NumericalFailure:
                if not history:
                    raise
                gradient, failures = None, failures + 1
            if len(evaluations) >= 8:
                evaluations.pop(next(iter(evaluations)))
            evaluations[key] = (controls, gradient)
        return evaluations[key]

    def objective(x):
        controls, gradient = evaluation(x)
        if not history:
            accept(x)
        if gradient is None:
            return 1e3 * (1 + abs(history[0][1].cost)), np.zeros(x.size)
        return gradient.cost, gradient.dW.detach().double().cpu().numpy().ravel()

    def accept(x):
        controls, gradient = evaluation(x)
        history.append((controls, gradient))
        bar.update(float(len(history) - 1), J=gradient.cost, loss=gradient.loss, grad=float(gradient.dW.norm()))

    tol, start = control["tol"], parameter.detach().double().cpu().numpy().ravel()
    if control["iterations"] == 0:  # scipy takes one step even at maxiter = 0
        objective(start)
        stop = "control.iterations reached"
    else:
        result = minimize(objective, start, jac=True, method="L-BFGS-B", callback=accept,
                          options={"maxiter": control["iterations"], "maxfun": 4 * control["iterations"] + 1,
                                   "gtol": tol, "ftol": tol})
        stop = f"L-BFGS-B: {result.message} ({result.nfev} evaluations, {failures} of them failed runs)"
    bar.close()
    controls, final = history[-1]
    return TrainingResult(controls.detach(), [g.cost for _, g in history], [g.loss for _, g in history],
                          [float(g.dW.norm()) for _, g in history], history[0][1], final, stop)


def step_knots(timing: dict, layers: int) -> tuple[np.ndarray, np.ndarray]:
    """(save times, knots): the knots are the save times and the slice boundaries l t_end / layers together,
    in order, coincident ones (to 1e-12 t_end) merged; a trained run steps from knot to knot."""
    t_end = timing["t_end"]
    saves = save_times(t_end, timing["save_every"])
    knots = np.unique(np.concatenate([saves, t_end * np.arange(layers + 1) / layers]))
    return saves, knots[np.concatenate([[True], np.diff(knots) > 1e-12 * max(1.0, t_end)])]


def trained_run(forward: ControlledForward, c0: torch.Tensor, controls: torch.Tensor) -> Recorder:
    """The forward run with W = controls, recorded at the case's save times (module docstring, step 2)."""
    problem, case = forward.problem, forward.case
    timing = case["time"]
    saves, knots = step_knots(timing, forward.layers)
    recorder = Recorder(problem, case, problem.basis.synthesis(c0).cpu().double().numpy(), forward.stepper.scheme)
    recorder.record(0.0, c0)
    c = c0
    recorder.start_clock()
    with torch.no_grad():
        for t0, t1 in zip(knots[:-1], knots[1:]):
            W = controls[forward.layer_at(0.5 * (t0 + t1))]
            substeps = max(1, math.ceil((t1 - t0) / timing["dt"] - 1e-9))
            dt = (t1 - t0) / substeps
            for _ in range(substeps):
                c = forward.stepper(problem.lam, lambda t, u: forward.transport(u, W), 0.0, c, dt)
                if problem.filter is not None:
                    c = c * problem.filter
            recorder.steps += substeps
            if np.any(np.abs(saves - t1) <= 1e-12 * max(1.0, forward.t_end)):
                recorder.keep(float(t1), *checked_state(recorder, c, t0, t1, dt))
    recorder.tick()
    return recorder


def run_training(case, progress: bool | None = None, start: torch.Tensor | None = None, checkpoint=None) -> xr.Dataset:
    """Train the case's control and return the Dataset of the trained forward run (module docstring).

    `start`: the controls W_l (layers, d, d) the optimizer starts from (None: model.W on every layer),
    e.g. to continue an earlier training from its `W`.  `checkpoint`: a spherepde.checkpoint.Checkpoint that
    keeps the training's evaluations (and, marked resume, holds those of an interrupted training).
    """
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    started = wallclock.perf_counter()
    try:
        result = train(forward, c0, progress, start, checkpoint)
    except NumericalFailure as failure:
        raise kept_at_start(failure, case, starting_W(forward, start).expand(forward.layers, -1, -1),
                            lambda controls: trained_run(forward, c0, controls).dataset("failed")) from None
    training_seconds = wallclock.perf_counter() - started
    try:
        recorder = trained_run(forward, c0, result.controls)
    except NumericalFailure as failure:  # its steps differ from the training's: keep W and the history
        raise NumericalFailure(f"{failure} (the trained run; W and the loss history are kept)",
                               control_variables(failure.dataset, case, result)) from None
    recorder.notes += result.notes
    dataset = recorder.dataset("completed")
    dataset = control_variables(dataset, case, result)
    norms = np.interp(dataset["time"].values, result.final.times, result.final.adjoint_norm)
    dataset["adjoint_norm"] = (("time",), norms,
                               {"long_name": "|grad phi_t|_{L2(mu_t)} of the adjoint at the trained W", "units": "1"})
    if case["control"]["save_adjoint"]:
        dataset = dataset.assign(adjoint_variables(forward, c0, result.controls, dataset))
    dataset = dataset.assign(turnpike_variables(forward, dataset, result.first))
    dataset.attrs.update({"training": "trained control (solvers/training.py)", "gradient": case["control"]["gradient"],
                          "optimizer": case["control"]["optimizer"], "iterations": len(result.costs) - 1,
                          "optimizer_stop": result.stop,
                          "training_steps_per_layer": forward.steps_per_layer,
                          "training_dt": forward.dt, "training_seconds": training_seconds,
                          "adjoint_checkpoint_every": forward.checkpoint_every})
    return finished(dataset, result)


def finished(dataset: xr.Dataset, result: TrainingResult) -> xr.Dataset:
    """The Dataset of a training that ran its course, or, when a numerical failure ended it early, that
    failure raised with `dataset` (the run at the last good controls) as the state the output keeps."""
    if result.failure is None:
        return dataset
    dataset.attrs["status"] = f"failed: {result.failure}"
    kept = len(result.costs) - 1
    raise NumericalFailure(f"{result.failure}; the training stopped at iteration {kept + 1}, and the output keeps "
                           f"the controls of iteration {kept} and their run", dataset)


def kept_at_start(failure: NumericalFailure, case, controls: torch.Tensor, run_at) -> NumericalFailure:
    """`failure`, of a training's first evaluation, made to carry the last good state there is: the forward run
    at the starting `controls` (run_at(controls), a Dataset; up to its own failure if it has one) with W =
    those controls and an empty history (no iteration finished)."""
    try:
        dataset = run_at(controls)
    except NumericalFailure as inner:
        dataset = inner.dataset
    result = TrainingResult(controls, [], [], [], None, None, "numerical failure at iteration 0", str(failure))
    dataset = control_variables(dataset, case, result)
    dataset.attrs.update({"status": f"failed: {failure}", "optimizer": case["control"]["optimizer"],
                          "optimizer_stop": result.stop, "iterations": 0})
    return NumericalFailure(f"{failure}; no training iteration finished: the output keeps the starting controls "
                            "and their forward run", dataset)


def adjoint_variables(forward: ControlledForward, c0: torch.Tensor, controls: torch.Tensor,
                      dataset: xr.Dataset) -> dict:
    """`phi` (adjoint_time, grid): the adjoint phi_t of one more gradient evaluation at the trained controls, on
    the density's grid, at the step of the training's grid nearest each save time (`adjoint_time`, within half
    a training step of it)."""
    steps = sorted({int(round(t / forward.dt)) for t in dataset["time"].values})
    gradient = GRADIENTS[forward.case["control"]["gradient"]](forward, c0, controls, keep=frozenset(steps))
    basis = forward.problem.basis
    grid = dataset["density"].dims[1:]
    values = np.stack([basis.synthesis(gradient.phi[n]).real.cpu().double().numpy() for n in steps])
    return {"phi": (("adjoint_time",) + grid, values,
                    {"long_name": "adjoint phi_t = dJ / dmu_t at the trained W (first variation)", "units": "1"}),
            "adjoint_time": ("adjoint_time", [forward.time(n) for n in steps],
                             {"long_name": "step time of phi nearest each save", "units": "1"})}


def control_variables(dataset: xr.Dataset, case, result: TrainingResult) -> xr.Dataset:
    """`dataset` with the training's coordinates (iteration, layer, row, col) and variables `W` (layer, row,
    col), `layer_time` (layer) and `loss` (J), `terminal_loss` (l(mu_T)), `gradient_norm` (|dJ/dW|_F) per
    iteration."""
    layers, d, t_end = result.controls.shape[0], case.dim, case["time"]["t_end"]
    dataset = dataset.assign_coords(
        iteration=xr.Variable("iteration", np.arange(len(result.costs)), {"long_name": "optimizer iteration"}),
        layer=xr.Variable("layer", np.arange(layers), {"long_name": "layer (slice of [0, t_end])"}),
        row=xr.Variable("row", np.arange(d), {"long_name": "row index of W"}),
        col=xr.Variable("col", np.arange(d), {"long_name": "column index of W"}))
    dataset["W"] = (("layer", "row", "col"), result.controls.cpu().double().numpy(),
                    {"long_name": "trained feed-forward matrix W_t on each layer", "units": "1"})
    dataset["layer_time"] = (("layer",), t_end * np.arange(layers) / layers,
                             {"long_name": "start time of the layer's slice", "units": "1"})
    dataset["loss"] = (("iteration",), np.array(result.costs),
                       {"long_name": "training cost J = l(mu_T) + lambda_reg/2 int |W_t|_F^2 dt", "units": "1"})
    dataset["terminal_loss"] = (("iteration",), np.array(result.losses),
                                {"long_name": f"terminal loss l(mu_T) ({case['control']['loss']})", "units": "1"})
    dataset["gradient_norm"] = (("iteration",), np.array(result.gradient_norms),
                                {"long_name": "Frobenius norm of dJ/dW over all layers", "units": "1"})
    return dataset


def turnpike_variables(forward: ControlledForward, dataset: xr.Dataset, first: Gradient) -> dict:
    """Seed-004 diagnostics of the trained run (spherepde.turnpike): `energy_gap` and `mean_angle` (time),
    and the global attributes plateau_width, initial_width, terminal_width, three_phase ("true"/"false"),
    plateau_relative_variance, terminal_lift, terminal_energy_rate, escape_rate (from `first`, the gradient
    at the initial control), adjoint_rate, rayleigh_quotient, h_minus_one_quotient, h_minus_one_norm,
    terminal_displacement, min_energy.

    The energy and its Gibbs minimum are those of the seed's model (unnormalized kernel, eps > 0); for
    other models the energy-based attributes are NaN and three_phase is "false"."""
    problem = forward.problem
    model, basis = problem.model, problem.basis
    times = dataset["time"].values
    angle = turnpike.mean_angle(dataset["mean"].values)
    variables = {"mean_angle": (("time",), angle, {"long_name": "angle of the mean position", "units": "radian"})}
    attrs = dict.fromkeys(("plateau_width", "initial_width", "terminal_width", "plateau_relative_variance",
                           "terminal_lift", "terminal_energy_rate", "escape_rate", "adjoint_rate", "rayleigh_quotient",
                           "h_minus_one_quotient", "h_minus_one_norm", "terminal_displacement", "min_energy"), math.nan)
    attrs["three_phase"] = "false"
    if model.kernel == "unnormalized" and model.eps > 0 and not model.zero_temperature:
        centre = int(np.argmin(np.abs(times - 0.5 * times[-1])))
        theory = turnpike.plateau_theory(model, problem.exp_kernel, basis, forward.loss,
                                         torch.as_tensor(dataset["mean"].values[centre]))
        gap = dataset["free_energy"].values - theory["min_energy"]
        variables["energy_gap"] = (("time",), gap, {"long_name": "energy gap E(mu_t) - min E", "units": "1"})
        test = turnpike.phases(times, gap)
        middle = int(np.argmin(np.abs(times - 0.5 * (test["plateau_start"] + test["plateau_end"]))))
        attrs.update({key: test[key] for key in ("plateau_width", "initial_width", "terminal_width",
                                                 "plateau_relative_variance", "terminal_lift")})
        attrs.update({key: theory[key] for key in ("rayleigh_quotient", "h_minus_one_quotient", "h_minus_one_norm",
                                                   "min_energy")})
        attrs.update({
            "three_phase": "true" if test["three_phase"] else "false",
            "terminal_energy_rate": turnpike.exponential_rate(times, gap - test["gap_reference"], test["plateau_end"]),
            "escape_rate": turnpike.escape_rate(np.array(first.times), np.array(first.adjoint_norm),
                                                theory["rayleigh_quotient"]),
            "adjoint_rate": turnpike.exponential_rate(times, dataset["adjoint_norm"].values, test["plateau_start"],
                                                      test["plateau_end"]),
            "terminal_displacement": float(angle[-1] - angle[middle])})
    dataset.attrs.update(attrs)
    return variables
