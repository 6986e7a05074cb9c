"""The variables a training adds to the Dataset of its trained run (solvers/training.py, "Output"): the controls
and the optimizer's history, the adjoint, and the seed-004 diagnostics of the trained run
(spherepde.analysis.turnpike); and the Dataset kept when a training fails.
"""

import math

import numpy as np
import torch
import xarray as xr

from solvers.adjoint import GRADIENTS
from solvers.controlled_forward import ControlledForward, Gradient
from solvers.optimizers import TrainingResult
from spherepde.analysis import turnpike
from spherepde.base.errors import NumericalFailure
from spherepde.model.energy import FreeEnergy
from spherepde.model.initial import INITIAL_TAIL_TOLERANCE
from spherepde.model.parameters import Layout, layout_of


def finished(dataset: xr.Dataset, result: TrainingResult) -> xr.Dataset:
    """The Dataset of a training that ran its course, or, when a numerical failure ended it early, that
    failure raised with `dataset` (the run at the last good controls) as the state the output keeps."""
    if result.failure is None:
        return dataset
    dataset.attrs["status"] = NumericalFailure.status(result.failure)
    kept = len(result.costs) - 1
    raise NumericalFailure(f"{result.failure}; the training stopped at iteration {kept + 1}, and the output keeps "
                           f"the controls of iteration {kept} and their run", dataset)


def unresolved_control(times: list, rows: list, driven: bool = True) -> str | None:
    """A note where the trained run's density leaves what its grid resolves (`driven`: by nonzero controls; else
    the dynamics without them does, the controls being W = 0): from the first save whose spectral tail
    exceeds INITIAL_TAIL_TOLERANCE, what an initial law is refused for (the rows of a
    solvers.eulerian_recorder.Recorder).  From there J and every diagnostic of the density measure the
    discretisation's error, not the model's, and an optimizer can descend into it (an align loss below its infimum 0
    on a density that goes negative); the run only notes the first save beyond diagnostics.tail_tol, which is often
    harmless."""
    tails = np.array([row["spectral_tail"] for row in rows], dtype=float)
    beyond = np.flatnonzero(tails > INITIAL_TAIL_TOLERANCE)
    if not beyond.size:
        return None
    first = int(beyond[0])
    worst = first + int(np.nanargmax(tails[first:]))  # a NaN tail (a failed save) is no worst
    lowest = min(row["min_density"] for row in rows[first:])
    who = "the controls drive the density" if driven else "with W = 0 on every layer the density moves"
    return (f"{who} beyond what the grid resolves from t = {times[first]:.4g} on: spectral "
            f"tail {tails[first]:.2g} there (an initial law is refused above {INITIAL_TAIL_TOLERANCE:g}), "
            f"{tails[worst]:.2g} at t = {times[worst]:.4g}, min density {lowest:.3g}; J and the diagnostics from there "
            "are the discretisation's error, not the model's: a larger sphere.lmax, a smaller time.dt or, training, a "
            "larger control.lambda_reg")


def kept_at_start(failure: NumericalFailure, case, controls: torch.Tensor, run_at,
                  attributes: dict) -> NumericalFailure:
    """`failure`, of a training's first evaluation, made to carry the last good state there is: the forward run
    at the starting `controls` (run_at(controls), a Dataset; up to its own failure if it has one) with W =
    those controls, an empty history (no iteration finished) and the training's `attributes` (those a completed
    training's output has but its iterations and optimizer_stop)."""
    try:
        dataset = run_at(controls)
    except NumericalFailure as inner:
        dataset = inner.dataset
    result = TrainingResult(controls, [], [], [], None, None, "numerical failure at iteration 0", str(failure))
    dataset = control_variables(dataset, case, result)
    dataset.attrs.update(attributes)
    dataset.attrs.update({"status": NumericalFailure.status(failure), "optimizer_stop": result.stop, "iterations": 0})
    return NumericalFailure(f"{failure}; no training iteration finished: the output keeps the starting controls "
                            "and their forward run", dataset)


def adjoint_variables(forward: ControlledForward, controls: torch.Tensor, states: torch.Tensor) -> dict:
    """Per member (by position) `phi` (adjoint_time, grid): the adjoint phi_t of one more gradient evaluation at
    the trained controls, on the density's grid, at the step of the training's grid nearest each save time
    (`adjoint_time`, within half a training step of it)."""
    step_times = forward.step_times
    saves = forward.grid.saves
    steps = sorted({int(np.argmin(np.abs(step_times - t))) for t in saves})
    gradients = GRADIENTS[forward.case["control"]["gradient"]](forward, states, controls, keep=frozenset(steps))
    basis = forward.problem.basis
    grid = basis.grid_dims
    variables = {}
    for m, gradient in enumerate(gradients):
        if isinstance(gradient, NumericalFailure):
            continue
        values = np.stack([basis.synthesis(gradient.phi[n]).real.cpu().double().numpy() for n in steps])
        variables[m] = {"phi": (("adjoint_time",) + grid, values,
                                {"long_name": "adjoint phi_t = dJ / dmu_t at the trained W (first variation)",
                                 "units": "1"}),
                        "adjoint_time": ("adjoint_time", [float(step_times[n]) for n in steps],
                                         {"long_name": "step time of phi nearest each save", "units": "1"})}
    return variables


def control_variables(dataset: xr.Dataset, case, result: TrainingResult) -> xr.Dataset:
    """`dataset` with the training's coordinates (iteration, layer, row, col) and variables `W` (layer, row,
    col), `layer_time` (layer) and `loss` (J), `terminal_loss` (l(mu_T)), `gradient_norm` (|dJ/dW|_F) per
    iteration.  Controls theta (layers, p) (beyond the seeds' model) are written by `parameter_variables`, with
    the coordinates `hidden` and `head` of their groups."""
    layers, d, t_end = result.controls.shape[0], case.dim, case["time"]["t_end"]
    # the d x d axes: W2's rows are d, its columns hidden; W1's the other way round
    rows, cols = ("W, W2, B, V", "W, W1, B, V") if result.controls.dim() == 2 else ("W", "W")
    dataset = dataset.assign_coords(
        iteration=xr.Variable("iteration", np.arange(len(result.costs)), {"long_name": "optimizer iteration"}),
        layer=xr.Variable("layer", np.arange(layers), {"long_name": "layer (slice of [0, t_end])"}),
        row=xr.Variable("row", np.arange(d), {"long_name": f"row index of {rows}"}),
        col=xr.Variable("col", np.arange(d), {"long_name": f"column index of {cols}"}))
    if result.controls.dim() == 2:
        layout = layout_of(case)
        variables = parameter_variables(layout, result.controls)
        extents = {"hidden": (layout.hidden, "hidden unit of the two-layer feed-forward"),
                   "head": (len(layout.heads), "attention head")}
        used = {dim for dims, _, _ in variables.values() for dim in dims}
        dataset = dataset.assign_coords({name: xr.Variable(name, np.arange(size), {"long_name": meaning})
                                         for name, (size, meaning) in extents.items() if name in used})
        dataset = dataset.assign(variables)
    else:
        dataset["W"] = (("layer", "row", "col"), result.controls.cpu().double().numpy(),
                        {"long_name": "trained feed-forward matrix W_t on each layer", "units": "1"})
    dataset["layer_time"] = (("layer",), t_end * np.arange(layers) / layers,
                             {"long_name": "start time of the layer's slice", "units": "1"})
    regulariser = ("sum_g lambda_g/2 int |theta_g,t|^2 dt over the trained groups" if result.controls.dim() == 2
                   else "lambda_reg/2 int |W_t|_F^2 dt")
    dataset["loss"] = (("iteration",), np.array(result.costs),
                       {"long_name": f"training cost J = l(mu_T) + {regulariser}", "units": "1"})
    dataset["terminal_loss"] = (("iteration",), np.array(result.losses),
                                {"long_name": f"terminal loss l(mu_T) ({case['control']['loss']})", "units": "1"})
    gradient = "dJ/dtheta over the trained entries" if result.controls.dim() == 2 else "dJ/dW"
    dataset["gradient_norm"] = (("iteration",), np.array(result.gradient_norms),
                                {"long_name": f"Frobenius norm of {gradient} over all layers", "units": "1"})
    return dataset


def parameter_variables(layout: Layout, theta: torch.Tensor) -> dict:
    """The variables of one run's parameters theta (L, p) (spherepde.model.parameters): the feed-forward as `W`
    (layer, row, col) when it is linear, else `W1` (layer, hidden, col), `b` (layer, hidden), `W2` (layer, row,
    hidden); and, beyond the seeds' model, every head's `B` and `V` (layer, head, row, col)."""
    parts = {name: value.cpu().double().numpy() for name, value in layout.unpack(theta).items()}
    meaning = {"W": ("trained feed-forward matrix W_t on each layer", ("layer", "row", "col")),
               "W1": ("first weights W1_t of f_t(x) = W2_t sigma(W1_t x + b_t)", ("layer", "hidden", "col")),
               "b": ("hidden bias b_t of f_t(x) = W2_t sigma(W1_t x + b_t)", ("layer", "hidden")),
               "W2": ("second weights W2_t of f_t(x) = W2_t sigma(W1_t x + b_t)", ("layer", "row", "hidden")),
               "B": ("attention matrix B_{h,t} of each head on each layer", ("layer", "head", "row", "col")),
               "V": ("value matrix V_{h,t} of each head on each layer", ("layer", "head", "row", "col"))}
    names = [name for name, _ in layout.feed_forward_groups] + ([] if layout.seeds_model else ["B", "V"])
    return {name: (meaning[name][1], parts[name], {"long_name": meaning[name][0], "units": "1"}) for name in names}


def turnpike_variables(forward: ControlledForward, member: int, dataset: xr.Dataset, first: Gradient) -> dict:
    """Seed-004 diagnostics of member `member`'s trained run (spherepde.analysis.turnpike): `energy_gap` and
    `mean_angle` (time), and the global attributes plateau_width, initial_width, terminal_width, three_phase
    ("true"/"false"), plateau_relative_variance, terminal_lift, terminal_energy_rate, escape_rate (from `first`, the
    gradient at the initial control), adjoint_rate, rayleigh_quotient, h_minus_one_quotient, h_minus_one_norm,
    terminal_displacement, min_energy.

    The energy and its Gibbs minimum are those of the seed's model (unnormalized kernel, eps > 0, B symmetric and V =
    c B, beta B != 0: spherepde.model.energy); for other models (and beyond the seeds' model) the energy-based
    attributes are NaN and three_phase is "untested" (not "false": the seed counts its eps = 0 trainings
    three-phase, which this energy cannot test)."""
    problem = forward.problem
    model, basis, exp_kernel = problem.batch.models[member], problem.basis, problem.kernels.member(member)
    times = dataset["time"].values
    angle = turnpike.mean_angle(dataset["mean"].values)
    variables = {"mean_angle": (("time",), angle, {"long_name": "angle of the mean position", "units": "radian"})}
    attrs = dict.fromkeys(("plateau_width", "initial_width", "terminal_width", "plateau_relative_variance",
                           "terminal_lift", "terminal_energy_rate", "escape_rate", "adjoint_rate", "rayleigh_quotient",
                           "h_minus_one_quotient", "h_minus_one_norm", "terminal_displacement", "min_energy"), math.nan)
    attrs["three_phase"] = "untested"
    energy = FreeEnergy.of_model(model)
    if (problem.layouts[member].seeds_model and model.kernel == "unnormalized" and model.eps > 0
            and not model.zero_temperature and energy.weight is not None and not energy.mean_field):
        centre = int(np.argmin(np.abs(times - 0.5 * times[-1])))
        theory = turnpike.plateau_theory(model, exp_kernel, basis, forward.losses[member],
                                         torch.as_tensor(dataset["mean"].values[centre]))
        gap = dataset["free_energy"].values - theory["min_energy"]
        variables["energy_gap"] = (("time",), gap, {"long_name": "energy gap E(mu_t) - min E", "units": "1"})
        test = turnpike.phases(times, gap)
        attrs.update({key: test[key] for key in ("plateau_width", "initial_width", "terminal_width",
                                                 "plateau_relative_variance", "terminal_lift")})
        attrs.update({key: theory[key] for key in ("rayleigh_quotient", "h_minus_one_quotient", "h_minus_one_norm",
                                                   "min_energy")})
        # the terminal and plateau rates are fits over the layers the test finds: none without a plateau
        attrs.update({
            "three_phase": turnpike.verdict(test),
            "terminal_energy_rate": (turnpike.exponential_rate(times, gap - test["gap_reference"], test["plateau_end"])
                                     if test["plateau"] else math.nan),
            "escape_rate": turnpike.escape_rate(np.array(first.times), np.array(first.adjoint_norm),
                                                theory["rayleigh_quotient"]),
            "adjoint_rate": (turnpike.exponential_rate(times, dataset["adjoint_norm"].values, test["plateau_start"],
                                                       test["plateau_end"]) if test["plateau"] else math.nan),
            "terminal_displacement": turnpike.terminal_displacement(times, dataset["mean"].values, test)})
    dataset.attrs.update(attrs)
    return variables
