"""Training (solvers/training.py): the loss decreases, the known first-order optimum, the output."""

import math
import re

import numpy as np
import pytest
import torch
import xarray as xr
from test_adjoint import training_case

import spherepde
from solvers.adjoint import discrete_gradient
from solvers.controlled_forward import ControlledForward
from solvers.eulerian import checked_state
from solvers.training import train
from spherepde.cli import main
from spherepde.model.initial import initial_density

CASE = """
[case]
name = "train-s1"
[sphere]
dim = 2
lmax = 12
[model]
kernel = "unnormalized"
B = [[1.0, 0.0], [0.0, 0.65]]
V = [[1.0, 0.0], [0.0, 0.65]]
eps = 0.05
[initial]
kind = "vmf"
mean = [1.0, 0.2]
kappa = 2.0
[time]
t_end = 1.0
dt = 0.1
save_every = 0.25
[control]
layers = 2
iterations = 4
learning_rate = 0.5
"""


def test_gradient_descent_decreases_the_cost_monotonically():
    case = training_case(control={"optimizer": "gd", "learning_rate": 1.0, "iterations": 4}, t_end=0.5, dt=0.1)
    forward = ControlledForward(case)
    result = train(forward, initial_density(case["initial"], forward.problem.basis), progress=False)
    costs = np.array(result.costs)
    assert len(costs) == 5 and np.all(np.diff(costs) < 0), costs
    assert costs[-1] < 0.85 * costs[0]


def test_gradient_descent_continued_from_its_controls_is_one_longer_descent():
    # gradient descent is memoryless: 2 steps, then 2 more from the result, are the same 4 steps
    case = training_case(control={"optimizer": "gd", "learning_rate": 1.0, "iterations": 4}, t_end=0.5, dt=0.1)
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    whole = train(forward, c0, progress=False)
    half = ControlledForward(case.with_overrides(["control.iterations=2"]))
    continued = train(half, c0, progress=False, start=train(half, c0, progress=False).controls)
    assert torch.allclose(continued.controls, whole.controls, rtol=1e-12, atol=1e-14)
    assert continued.costs == pytest.approx(whole.costs[2:], rel=1e-12)


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_a_per_layer_model_W_is_where_a_training_starts_on_the_seeds_paths(method):
    """model.W as one matrix per layer (a trained W, say) is where the training starts: gradient descent continued
    from its trained W through the case file is the longer descent (the particles' noise common to every
    evaluation); and the seeds' paths step it, writing what the constant-W training writes (the seed-004
    variables, no B or V, the transposed particle steps: the layered transport and autograd took it, 17 times
    slower, those missing)."""
    case = training_case(control={"optimizer": "gd", "learning_rate": 1.0, "iterations": 4, "layers": 3},
                         t_end=0.6, dt=0.1).with_overrides([f"solver.method='{method}'", "particles.n=64"])
    whole = spherepde.run(case, progress=False)
    half = case.with_overrides(["control.iterations=2"])
    trained = spherepde.run(half, progress=False)["W"].values.tolist()
    continued = spherepde.run(half.with_overrides([f"model.W={trained}"]), progress=False)
    assert np.allclose(continued["W"], whole["W"], rtol=1e-12, atol=1e-14)
    assert continued["loss"].values == pytest.approx(whole["loss"].values[2:], rel=1e-12)
    assert set(continued.variables) == set(whole.variables) and ({"energy_gap", "interaction_gap"} & set(continued))
    for name in ("escape_rate", "rayleigh_quotient", "plateau_width"):
        if name in whole.attrs:
            assert np.isfinite(continued.attrs[name]) == np.isfinite(whole.attrs[name]), name
    assert continued.attrs.get("gradient") == whole.attrs.get("gradient")


def test_adam_reduces_the_cost():
    case = training_case(control={"optimizer": "adam", "learning_rate": 0.4, "iterations": 4}, t_end=0.5, dt=0.1)
    forward = ControlledForward(case)
    result = train(forward, initial_density(case["initial"], forward.problem.basis), progress=False)
    assert result.costs[-1] < 0.7 * result.costs[0]


def test_lbfgs_finds_the_minimiser_of_a_quadratic():
    """J(W) = 1/2 <W - W*, A (W - W*)> + 1 with A symmetric positive definite (condition number 100):
    L-BFGS reaches W* to 1e-6 (J in float64 fixes W* only to ~sqrt(1e-16 / lambda_min(A)) = 1e-8),
    J decreasing at every iteration."""
    from solvers.controlled_forward import Gradient
    from solvers.optimizers import optimise

    rng = np.random.default_rng(3)
    basis = np.linalg.qr(rng.normal(size=(12, 12)))[0]
    A = torch.as_tensor(basis @ np.diag(np.geomspace(1, 100, 12)) @ basis.T)
    optimum = torch.as_tensor(rng.normal(size=(3, 2, 2)))

    def gradient_of(controls):
        residual = (controls - optimum).reshape(-1)
        slope = A @ residual
        return Gradient(float(residual @ slope) / 2 + 1, 1.0, slope.reshape(3, 2, 2), [], [])

    control = {"optimizer": "lbfgs", "iterations": 100, "tol": 1e-15, "learning_rate": 1.0}
    result = optimise(control, torch.zeros(2, 2, dtype=torch.float64), 3, gradient_of, progress=False)
    assert float((result.controls - optimum).abs().max()) <= 1e-6
    assert np.all(np.diff(result.costs) <= 0) and result.costs[-1] == pytest.approx(1.0, abs=1e-14)
    assert len(result.costs) < 101 and result.gradient_norms[-1] <= 1e-6
    for iterations in (0, 3):  # the cap holds, also at 0: the start's J and gradient, W unchanged
        capped = optimise(control | {"iterations": iterations}, torch.zeros(2, 2, dtype=torch.float64), 3, gradient_of,
                          progress=False)
        assert len(capped.costs) == iterations + 1
        assert (float(capped.controls.abs().max()) > 0) == (iterations > 0)


def test_lbfgs_ignores_the_learning_rate_and_notes_a_chosen_one():
    """L-BFGS's steps come from its line search: the trained controls are the same bit for bit at any
    control.learning_rate, and a value other than the schema's default is named in the output's notes."""
    from solvers.controlled_forward import Gradient
    from solvers.optimizers import optimise

    def gradient_of(controls):
        residual = controls - 0.5
        return Gradient(float((residual * residual).sum()) / 2, 0.0, residual, [], [])

    results = {rate: optimise({"optimizer": "lbfgs", "iterations": 20, "tol": 0.0, "learning_rate": rate},
                              torch.zeros(2, 2, dtype=torch.float64), 2, gradient_of, progress=False)
               for rate in (0.05, 0.5)}
    assert torch.equal(results[0.05].controls, results[0.5].controls)
    assert float((results[0.5].controls - 0.5).abs().max()) <= 1e-12
    assert results[0.05].notes == []
    assert results[0.5].notes == ["control.learning_rate = 0.5 is not used: L-BFGS's line search sets the step "
                                  "lengths"]


def test_lbfgs_backs_off_from_trial_points_where_the_run_fails():
    """The same kind of quadratic, but J is not finite wherever max |W| > 1.01 max |W*| (as the explicit
    transport fails for too large a W): the line search rejects those trial points and still reaches W*;
    a failure at the starting point raises NumericalFailure."""
    from solvers.controlled_forward import Gradient
    from solvers.optimizers import optimise
    from spherepde.base.errors import NumericalFailure

    rng = np.random.default_rng(5)
    scales = torch.as_tensor(np.geomspace(1, 1000, 8)).reshape(2, 2, 2)
    optimum = torch.as_tensor(rng.normal(size=(2, 2, 2)))
    failures = []

    def gradient_of(controls):
        if float(controls.abs().max()) > 1.01 * float(optimum.abs().max()):
            failures.append(controls)
            return Gradient(math.nan, math.nan, torch.full_like(controls, math.nan), [], [])
        residual = controls - optimum
        return Gradient(float((scales * residual ** 2).sum()) / 2, 0.0, scales * residual, [], [])

    control = {"optimizer": "lbfgs", "iterations": 200, "tol": 1e-15, "learning_rate": 1.0}
    result = optimise(control, torch.zeros(2, 2, dtype=torch.float64), 2, gradient_of, progress=False)
    assert failures and float((result.controls - optimum).abs().max()) <= 1e-6
    assert np.all(np.diff(result.costs) <= 0)
    assert result.stop.endswith(f"{len(failures)} of them failed runs)")  # the output's optimizer_stop
    with pytest.raises(NumericalFailure, match="iteration 0"):
        optimise(control, torch.full((2, 2), 10.0, dtype=torch.float64), 2, gradient_of, progress=False)


def test_lbfgs_training_ends_at_a_stationary_point_below_gradient_descent():
    """On the small S^1 case L-BFGS (tol 1e-10) stops where |dJ/dW| <= 1e-7, J nonincreasing over its
    iterates, at a J no larger than 30 steps of tuned gradient descent reach."""
    costs = {}
    for optimizer in ("gd", "lbfgs"):
        case = training_case(control={"optimizer": optimizer, "learning_rate": 1.0, "iterations": 30, "tol": 1e-10},
                             t_end=0.5, dt=0.1)
        forward = ControlledForward(case)
        result = train(forward, initial_density(case["initial"], forward.problem.basis), progress=False)
        costs[optimizer] = result.costs
    assert np.all(np.diff(costs["lbfgs"]) <= 0)
    assert result.gradient_norms[-1] <= 1e-7 < 1e-2 * result.gradient_norms[0]
    assert costs["lbfgs"][-1] <= costs["gd"][-1] and len(costs["lbfgs"]) < len(costs["gd"])


def test_tolerance_stops_early():
    case = training_case(control={"optimizer": "gd", "learning_rate": 1.0, "iterations": 30, "tol": 0.05},
                         t_end=0.5, dt=0.1)
    forward = ControlledForward(case)
    result = train(forward, initial_density(case["initial"], forward.problem.basis), progress=False)
    assert len(result.costs) < 31 and result.stop.startswith("converged")
    last = abs(result.costs[-1] - result.costs[-2]) / abs(result.costs[-1])
    assert last <= 0.05 or result.gradient_norms[-1] <= 0.05


@pytest.mark.parametrize("lambda_reg", [1e2, 1e3])
def test_strong_regularisation_optimum_is_one_newton_step(lambda_reg):
    """J(W) = l(W) + lambda h |W|^2 / 2 with h = |slice|: W* = -g_0 / (lambda h) + O(lambda^-2), g_0 = dl/dW(0).

    One gradient step of length 1 / (lambda h) from W = 0 lands there, so the gradient left at that W is
    O(1 / lambda) of g_0: ten times smaller for ten times larger lambda (checked across the parameters
    by the bound below, which is ~ 2 / lambda with the constant measured at lambda = 1e2)."""
    case = training_case(control={"lambda_reg": lambda_reg, "optimizer": "gd", "iterations": 1,
                                  "learning_rate": 1 / (lambda_reg * 0.5)}, t_end=1.0, dt=0.1)
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    result = train(forward, c0, progress=False)
    g0 = result.gradient_norms[0]
    residual = float(discrete_gradient(forward, c0, result.controls).dW.norm())
    assert residual / g0 < 20 / lambda_reg
    assert residual / g0 > 0.2 / lambda_reg  # the O(1/lambda) term is really there: the test would see a wrong slope


def test_training_run_writes_the_control_variables(tmp_path):
    path = tmp_path / "train.toml"
    path.write_text(CASE)
    output = tmp_path / "train.nc"
    assert main(["run", str(path), "-o", str(output), "--quiet"]) == 0
    with xr.open_dataset(output) as dataset:
        assert dataset["W"].dims == ("layer", "row", "col") and dataset["W"].shape == (2, 2, 2)
        assert dataset["loss"].dims == ("iteration",) and dataset.sizes["iteration"] == 5
        assert dataset["adjoint_norm"].dims == ("time",)
        assert np.allclose(dataset["time"].values, [0, 0.25, 0.5, 0.75, 1.0])
        assert dataset["loss"].values[-1] < dataset["loss"].values[0]
        assert np.allclose(dataset["mass"].values, dataset["mass"].values[0], rtol=1e-12)
        assert "control" in dataset.attrs["case"]


@pytest.mark.parametrize("gradient", ["discrete", "continuous"])
def test_saved_adjoint_ends_at_the_first_variation_of_the_loss(tmp_path, gradient):
    """control.save_adjoint writes phi_t at the save times (they are knots of the training's grid).  At T it is
    dl/dmu of the align loss l = 1 - <int x dmu, e2>, i.e. -sin(theta), and |grad phi_T|^2_{L2(mu_T)} =
    int cos^2 theta dmu_T is the adjoint_norm at T squared."""
    path = tmp_path / "train.toml"
    path.write_text(CASE)
    output = tmp_path / "train.nc"
    options = ["--quiet", "--set", "control.save_adjoint=true", "--set", f"control.gradient='{gradient}'"]
    assert main(["run", str(path), "-o", str(output), *options]) == 0
    with xr.open_dataset(output) as dataset:
        assert dataset["phi"].dims == ("adjoint_time", "theta")
        assert np.allclose(dataset["adjoint_time"].values, [0.0, 0.25, 0.5, 0.75, 1.0])
    assert main(["run", str(path), "-o", str(output), "--overwrite", "--set", "time.save_every=0.5", *options]) == 0
    with xr.open_dataset(output) as dataset:
        assert np.allclose(dataset["adjoint_time"].values, dataset["time"].values)
        theta = dataset["theta"].values
        assert np.abs(dataset["phi"].values[-1] + np.sin(theta)).max() < 1e-13
        weights, density = dataset["cell_area"].values, dataset["density"].values[-1]
        norm_squared = float(np.sum(weights * density * np.cos(theta) ** 2))
        assert abs(norm_squared - float(dataset["adjoint_norm"][-1]) ** 2) < 1e-13
        assert np.abs(dataset["phi"].values[0]).max() > 0.1  # the adjoint went back to t = 0


@pytest.mark.parametrize("save_every", [0.5, 0.3])
def test_trained_run_is_the_training_forward_map(save_every):
    """The output run steps the training's own grid (knots at the saves and the slice boundaries), so it ends
    where the training's forward map does, bit for bit, whether the saves fall on the slice boundaries or not."""
    from solvers.training import trained_runs

    case = training_case(t_end=1.0, dt=0.1).with_overrides([f"time.save_every={save_every}"])
    forward = ControlledForward(case)
    controls = 0.3 * torch.ones(1, 2, 2, 2, dtype=torch.float64)
    (recorder,) = trained_runs(forward, controls)
    assert np.allclose(recorder.times, forward.grid.saves, rtol=0, atol=1e-15)
    end, _ = forward.run(forward.initial(), controls)
    density = forward.problem.basis.synthesis(forward.problem.coefficients(end))[0]
    assert np.array_equal(recorder.densities[-1], density.numpy())


@pytest.mark.parametrize("override, key", [
    ("control.loss='cross_entropy'", "control.loss"),
    ("control.layers=0", "control.layers"),
    ("control.kappa_cand=2.0", "control.kappa_cand"),
    ("control.optimizer='newton'", "control.optimizer"),
    ("control.learning_rate=0", "control.learning_rate"),
    ("control.target=[0, 0]", "control.target"),
])
def test_bad_control_is_a_one_line_error(tmp_path, capsys, override, key):
    path = tmp_path / "bad.toml"
    path.write_text(CASE)
    assert main(["run", str(path), "-o", str(tmp_path / "bad.nc"), "--set", override]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err
    assert not (tmp_path / "bad.nc").exists()


def test_training_needs_a_fixed_step(tmp_path, capsys):
    path = tmp_path / "cfl.toml"
    path.write_text(CASE.replace("dt = 0.1", "cfl = 0.5"))
    assert main(["run", str(path), "-o", str(tmp_path / "cfl.nc")]) == 2
    assert "time.dt" in capsys.readouterr().err


# --- seed-004 diagnostics (spherepde/analysis/turnpike.py) ------------------------------------------------------


def test_seed004_cases_load():
    from pathlib import Path

    from spherepde.io.case import load_case

    paths = sorted(Path(__file__).parent.parent.joinpath("cases").glob("seed004-*.toml"))
    assert len(paths) == 11
    for path in paths:
        case = load_case(path)
        assert case["control"]["loss"] in ("align", "bow") and case["model"]["kernel"] == "unnormalized"


def test_piecewise_constant_feed_forward():
    """W_t = W_l on the slice [l T / L, (l + 1) T / L): right-continuous at the boundaries, t = T in the last; the
    knots merge the saves with the slice boundaries and every interval lies in one slice."""
    from solvers.timegrid import TimeGrid

    grid = TimeGrid(3.0, 0.4, layers=3)
    assert [grid.layer_at(t) for t in (0.0, 0.99, 1.0, 2.5, 3.0)] == [0, 0, 1, 2, 2]
    knots = [interval.t1 for interval in grid.intervals]
    assert np.allclose(knots, [0.4, 0.8, 1.0, 1.2, 1.6, 2.0, 2.4, 2.8, 3.0])
    assert [interval.layer for interval in grid.intervals] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [interval.save for interval in grid.intervals] == [True, True, False, True, True, True, True, True, True]


@pytest.mark.parametrize("optimizer", ["gd", "adam"])
def test_a_divergent_step_ends_the_training_at_the_last_good_controls(tmp_path, capsys, optimizer):
    # lr 1e4 (gd) or 100 (adam) at dt = 0.1: the first step leaves the explicit transport's stability region.
    # The training stops there with the controls, J and gradient of iteration 0, whose run passed; the command
    # line exits 3 and its output holds that W, that J and the run with that W to t_end (docs/design.md "Command line").
    from solvers.controlled_forward import evaluate_cost

    rate = {"gd": 1e4, "adam": 100.0}[optimizer]
    case = training_case(control={"optimizer": optimizer, "learning_rate": rate, "iterations": 3}, t_end=0.2, dt=0.1)
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    result = train(forward, c0, progress=False)
    assert result.stop == "numerical failure at iteration 1: the controls of iteration 0 are kept", result.stop
    assert "iteration 1" in result.failure or "blew up" in result.failure, result.failure
    assert result.failure.endswith("; a smaller control.learning_rate takes shorter steps"), result.failure
    zero = torch.zeros(forward.layers, 2, 2, dtype=torch.float64)
    assert len(result.costs) == 1 and torch.equal(result.controls, zero)
    assert abs(result.costs[0] - evaluate_cost(forward, c0, zero)) <= 1e-14
    path = tmp_path / "train.toml"
    path.write_text(CASE)
    output = tmp_path / "train.nc"
    options = ["--set", f"control.optimizer='{optimizer}'", "--set", f"control.learning_rate={rate}"]
    assert main(["run", str(path), "-o", str(output), "--quiet", *options]) == 3
    err = capsys.readouterr().err.strip()
    kept = "the training stopped at iteration 1, and the output keeps the controls of iteration 0 and their run"
    assert len(err.splitlines()) == 1 and err.endswith(kept), err
    untrained = ControlledForward(spherepde.load_case(path, ["control.iterations=0"]))
    c0 = initial_density(untrained.case["initial"], untrained.problem.basis)
    zero = torch.zeros(untrained.layers, 2, 2, dtype=torch.float64)
    with xr.open_dataset(output) as dataset:
        assert re.match(r"failed: (?!numerical failure)\S", dataset.attrs["status"])
        assert dataset.attrs["optimizer_stop"].startswith("numerical failure at iteration 1")
        assert float(np.abs(dataset["W"].values).max()) == 0 and dataset.sizes["iteration"] == 1
        assert abs(float(dataset["loss"][0]) - evaluate_cost(untrained, c0, zero)) <= 1e-14
        assert float(dataset["time"][-1]) == 1.0 and np.allclose(dataset["mass"].values, 1.0, rtol=1e-12)
    # the particle training shares the optimiser and stops the same way, at the iteration that failed (their
    # positions stay on the circle, so the first step may still pass), keeping the iterations before it
    particles = ["--set", "solver.method='particles'", "--set", "particles.n=32", "--overwrite"]
    assert main(["run", str(path), "-o", str(output), "--quiet", *options, *particles]) == 3
    with xr.open_dataset(output) as dataset:
        failed = int(re.search(r"iteration (\d+)", dataset.attrs["optimizer_stop"]).group(1))
        assert re.match(r"failed: (?!numerical failure)\S", dataset.attrs["status"]) and failed >= 1
        assert dataset.sizes["iteration"] == failed and np.isfinite(dataset["loss"].values).all()
        assert np.isfinite(dataset["W"].values).all() and float(dataset["time"][-1]) == 1.0


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_a_loss_that_is_not_finite_at_the_start_names_its_key(tmp_path, capsys, method):
    # tau = 1e6: the bow scores are indicators of each candidate's cell, and cells that no grid point's mass
    # (Eulerian: five p_k <= 0 from the density's undershoots) or no particle (p_k = 0) reaches give a
    # non-finite l(mu_T) at the initial controls: exit 3, and the output keeps the last good state there is,
    # the forward run at the starting controls (W = 0, finite) with an empty loss history
    path = tmp_path / "train.toml"
    path.write_text(CASE)
    output = tmp_path / "train.nc"
    options = ["--set", "control.loss='bow'", "--set", "control.tau=1e6", "--set", f"solver.method='{method}'"]
    assert main(["run", str(path), "-o", str(output), "--quiet", *options]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training iteration 0" in err and "lower control.tau" in err, err
    assert "learning_rate" not in err and "keeps the starting controls" in err
    with xr.open_dataset(output) as dataset:
        assert dataset.attrs["status"].startswith("failed") and dataset.sizes["iteration"] == 0
        assert np.array_equal(dataset["W"].values, np.zeros_like(dataset["W"].values))
        t_end = spherepde.load_case_text(dataset.attrs["case"])["time"]["t_end"]
        assert dataset["time"].values[-1] == pytest.approx(t_end)  # the run at W = 0 itself does not fail
        assert np.abs(dataset["mass"].values - 1).max() <= 1e-12
        # it is named a training, as a completed training's output is (the attributes of docs/_ext)
        assert dataset.attrs["training"].startswith("trained control") and dataset.attrs["training_seconds"] > 0
        assert dataset.attrs["optimizer"] == "adam" and dataset.attrs["iterations"] == 0
        if method == "eulerian":
            assert dataset.attrs["gradient"] == "discrete"
            assert dataset.attrs["training_steps"] * dataset.attrs["training_dt"] == pytest.approx(t_end)
        else:
            assert dataset.attrs["gradient"].startswith(("autograd", "transposed steps by hand"))


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_a_training_whose_starting_run_blows_up_keeps_its_first_save(tmp_path, capsys, optimizer):
    # model.W = 1e300 J (J the rotation generator: the tangential drift 1e300; W = c I drives nothing tangent to the
    # circle): the forward run at the starting controls blows up within its first save interval, so the last good
    # state is its t = 0 save, kept with W = those controls and no iteration (exit 3)
    path = tmp_path / "train.toml"
    path.write_text(CASE)
    output = tmp_path / "train.nc"
    options = ["--set", "model.W=[[0.0, -1e300], [1e300, 0.0]]", "--set", f"control.optimizer='{optimizer}'"]
    assert main(["run", str(path), "-o", str(output), "--quiet", *options]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "keeps the starting controls" in err, err
    with xr.open_dataset(output) as dataset:
        assert dataset.sizes["iteration"] == 0 and list(dataset["time"].values) == [0.0]
        assert np.all(dataset["W"].values[:, [1, 0], [0, 1]] == [1e300, -1e300])
        assert abs(float(dataset["mass"][0]) - 1) <= 1e-12
    from spherepde.io.summary import describe

    summary = describe(str(output))
    assert f"training: {optimizer}, no iteration" in summary and "|W_l|_F per layer: inf" in summary, summary


def test_info_summarises_a_training(tmp_path, capsys):
    from spherepde.io.summary import describe

    path = tmp_path / "train.toml"
    path.write_text(CASE)
    output = tmp_path / "train.nc"
    assert main(["run", str(path), "-o", str(output), "--quiet", "--set", "control.iterations=2"]) == 0
    with xr.open_dataset(output) as dataset:
        loss, W = dataset["loss"].values, dataset["W"].values
    summary = describe(str(output))
    assert f"J {loss[0]:.8g} -> {loss[-1]:.8g} over 2 iterations" in summary, summary
    assert "|W_l|_F per layer: " + " ".join(f"{n:.3g}" for n in np.linalg.norm(W, axis=(1, 2))) in summary


def test_a_trained_run_that_fails_keeps_the_training(tmp_path, capsys, monkeypatch):
    # The trained run checks every save (the training's forward map only its densities), so it can fail where the
    # training passed (injected here at its third save): the output keeps W and the loss history beside the saves
    # before the failure.
    import solvers.eulerian

    saves = []

    def failing_at_the_third_save(recorder, candidate, t0, t1, dt, cause):
        saves.append(t1)
        if len(saves) == 3:
            raise recorder.failure(f"injected at t = {t1:g}", cause())
        return checked_state(recorder, candidate, t0, t1, dt, cause)

    path = tmp_path / "train.toml"
    path.write_text(CASE)
    output = tmp_path / "train.nc"
    assert main(["run", str(path), "-o", str(output), "--quiet"]) == 0
    with xr.open_dataset(output) as trained:
        W, loss = trained["W"].values, trained["loss"].values
    monkeypatch.setattr(solvers.eulerian, "checked_state", failing_at_the_third_save)
    assert main(["run", str(path), "-o", str(output), "--quiet", "--overwrite"]) == 3
    assert capsys.readouterr().err.strip().endswith("(the trained run; W and the loss history are kept)")
    with xr.open_dataset(output) as dataset:
        assert dataset.attrs["status"] == "failed: injected at t = 0.75"
        assert np.allclose(dataset["time"].values, [0, 0.25, 0.5])
        assert np.array_equal(dataset["W"].values, W) and np.array_equal(dataset["loss"].values, loss)


def test_a_blown_up_forward_run_is_a_failure_not_a_cost():
    # The strain W = s diag(1, -1) at dt = 0.25 is beyond the explicit transport's stability limit for s >= 10.
    # Its terminal state is still finite at s = 10 and 30, and its J (3e52, -3e182) would be a line search's
    # best trial point; the forward map refuses such a state (mass no longer conserved, |rho| unbounded).
    from solvers.controlled_forward import evaluate_cost
    from spherepde.base.errors import NumericalFailure

    case = training_case(t_end=0.5, dt=0.25).with_overrides(["time.save_every=0.25"])  # steps of 0.25
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    strain = torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=torch.float64).expand(2, 2, 2)
    assert 0 < evaluate_cost(forward, c0, strain) < 2
    for scale in (10.0, 30.0):
        for evaluate in (evaluate_cost, discrete_gradient):
            with pytest.raises(NumericalFailure, match="blew up"):
                evaluate(forward, c0, scale * strain)


def test_a_blown_up_training_run_says_the_step_its_controls_need():
    # Controls W = s J with V = 0 turn the circle at |v| = s (eps = 0: no diffusion damps the modes): the steps
    # of dt are beyond the transport bound of imex-ark436 when lmax s dt exceeds it, and the failure says so,
    # with the dt that would be stable.
    from solvers.controlled_forward import evaluate_cost
    from spherepde.base.errors import NumericalFailure
    from spherepde.discretisation.timesteppers import stability_bound

    case = training_case(t_end=8.0, dt=0.25, scheme="imex-ark436").with_overrides(
        ["model.V=[[0.0, 0.0], [0.0, 0.0]]", "model.eps=0.0", "time.save_every=2.0"])
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    bound = stability_bound("imex-ark436", 1j)
    turn = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=torch.float64).expand(2, 2, 2)
    stable = 0.95 * bound / (12 * 0.25)
    assert math.isfinite(evaluate_cost(forward, c0, stable * turn))
    speed = 1.5 * bound / (12 * 0.25)
    for evaluate in (evaluate_cost, discrete_gradient):
        with pytest.raises(NumericalFailure) as failure:
            evaluate(forward, c0, speed * turn)
        message = str(failure.value)
        assert f"lmax max|v| dt = 12 x {speed:.3g} x 0.25 = {12 * speed * 0.25:.3g} at t = " in message, message
        assert f"take time.dt below {bound / (12 * speed):.3g} (or keep the controls smaller" in message, message
    with pytest.raises(NumericalFailure) as failure:  # an infinite speed asks for no step: no advice
        evaluate_cost(forward, c0, 1e300 * turn)
    assert "blew up" in str(failure.value) and "time.dt below" not in str(failure.value), str(failure.value)


def test_a_training_run_names_the_step_that_passed_the_bound_inside_its_interval():
    # The density concentrates and max|v| grows inside the interval: at its start the step is at 0.99 of the bound
    # (kuramoto-s1 at beta = 4, eps = 0.05, dt = 0.05, one layer over [0, 1]), and the forward map's failure takes
    # the steps again to name the first beyond it, as a plain run of the case does (tests/test_cli.py)
    from solvers.controlled_forward import evaluate_cost
    from spherepde.base.errors import NumericalFailure

    case = spherepde.load_case("cases/kuramoto-s1.toml", [
        "model.beta=4", "model.eps=0.05", "time.t_end=1.0", "time.save_every=1.0", "time.dt=0.05",
        "control.loss='align'", "control.layers=1"])
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    problem = forward.problem
    assert problem.unstable_steps(problem.initial(), problem.layer_drives()[0], 0.05, 0.0, "time.dt") == [None]
    with pytest.raises(NumericalFailure) as failure:
        evaluate_cost(forward, c0, torch.zeros(1, 2, 2, dtype=torch.float64))
    assert "lmax max|v| dt = 32 x 3.41 x 0.05 = 5.46 at t = 0.05, above 4" in str(failure.value), str(failure.value)


def test_a_blow_up_that_passes_is_still_a_failure():
    # A state that is no density at one step and looks like one again at T (injected here: one step scales it
    # by 1e6, the next back) must fail the forward map too: a line search accepted such a W (bow loss, reduced
    # scale, control.seed = 6), and its trained run, which checks every save, then failed with exit 3.
    from solvers.controlled_forward import evaluate_cost
    from spherepde.base.errors import NumericalFailure

    case = training_case(t_end=0.5, dt=0.1).with_overrides(["time.save_every=0.25"])
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    controls = torch.zeros(2, 2, 2, dtype=torch.float64)
    for evaluate in (evaluate_cost, discrete_gradient):
        calls = iter(range(10 * forward.steps))
        forward.problem.step = lambda c, *_, **__: c * {1: 1e6, 2: 1e-6}.get(next(calls), 1.0)
        with pytest.raises(NumericalFailure, match="the forward run blew up between t = 0 and 0.25"):
            evaluate(forward, c0, controls)
    forward.problem.step = lambda c, *_, **__: c  # the same states without the excursion pass
    assert math.isfinite(evaluate_cost(forward, c0, controls))


def test_a_non_finite_J_says_which_term_of_it_overflowed():
    # J = l(mu_T) + the regulariser: with l finite the regulariser overflowed (a huge W), which no time.dt mends
    from solvers.controlled_forward import Gradient
    from solvers.optimizers import _checked
    from spherepde.base.errors import NumericalFailure

    finite = torch.zeros(1, 2, 2, dtype=torch.float64)
    with pytest.raises(NumericalFailure, match=r"J = inf, l\(mu_T\) = 0.5 \(the regulariser .* overflows"):
        _checked(Gradient(math.inf, 0.5, finite, [], []), 0, "align")
    with pytest.raises(NumericalFailure, match=r"J = nan, l\(mu_T\) = nan \(reduce time.dt\)$"):
        _checked(Gradient(math.nan, math.nan, finite, [], []), 3, "align")
    with pytest.raises(NumericalFailure, match="its gradient not finite"):
        _checked(Gradient(0.5, 0.5, finite + math.nan, [], []), 0, "align")


def test_adam_first_step_is_the_learning_rate_times_the_sign():
    from solvers.optimizers import Adam

    gradient = torch.tensor([[3.0, -1e-3], [0.5, -20.0]], dtype=torch.float64)
    step = Adam(0.1).step(torch.zeros(2, 2, dtype=torch.float64), gradient)
    assert torch.allclose(step, -0.1 * torch.sign(gradient), rtol=1e-4)


@pytest.mark.parametrize("k", [0.1, 1.0])
def test_a_trained_run_beyond_what_its_grid_resolves_says_so(k):
    """Controls W = diag(k, -k) squeeze the density onto two points; at k = 1 the lmax-16 grid loses it (spectral tail
    0.56, min density -0.83 by t = 2), and the training, which completes, says that its J and diagnostics are the
    discretisation's error (a fuzzing round: an optimizer descended to J < 0 for the align loss, whose infimum is 0,
    with only the first save past tail_tol noted).  At k = 0.1 the density stays resolved and nothing is said."""
    from conftest import make_case

    case = make_case(2, 16, model={"kernel": "unnormalized", "beta": 0.0, "eps": 0.01, "W": [[k, 0.0], [0.0, -k]]},
                     time={"t_end": 2.0, "dt": 0.05, "save_every": 0.5})
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = spherepde.run(case.with_overrides(["control.iterations=0", "control.layers=1"]), progress=False)
    said = [str(w.message) for w in caught if "beyond what the grid resolves" in str(w.message)]
    tail, lowest = float(dataset["spectral_tail"].max()), float(dataset["min_density"].min())
    assert dataset.attrs["status"] == "completed"
    if k < 1:
        assert tail < 0.2 and not said and "beyond what the grid resolves" not in dataset.attrs["notes"]
    else:
        assert tail > 0.2 and len(said) == 1 and said[0] in dataset.attrs["notes"]
        first = float(dataset["time"].values[np.argmax(dataset["spectral_tail"].values > 0.2)])
        assert f"from t = {first:.4g} on" in said[0] and f"{tail:.2g} at t = 2, min density {lowest:.3g}" in said[0]


def test_a_run_beyond_its_grid_at_zero_controls_does_not_blame_the_controls():
    """W = 0 on every layer (control.iterations = 0 from the default start) with V = 4 I, eps = 1e-3 on the lmax-16
    grid: the uncontrolled attention concentrates the density past the grid (spectral tail 0.60 at t = 0.5), and
    the note said "the controls drive the density beyond what the grid resolves"."""
    import warnings

    from conftest import make_case

    case = make_case(2, 16, model={"kernel": "unnormalized", "beta": 1.0, "eps": 0.001, "V": [[4.0, 0.0], [0.0, 4.0]]},
                     time={"t_end": 2.0, "dt": 0.05, "save_every": 0.5})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = spherepde.run(case.with_overrides(["control.iterations=0", "control.layers=1"]), progress=False)
    said = [str(w.message) for w in caught if "beyond what the grid resolves" in str(w.message)]
    assert float(np.abs(dataset["W"].values).max()) == 0 and float(dataset["spectral_tail"][1]) > 0.5
    assert len(said) == 1 and said[0].startswith("with W = 0 on every layer the density moves beyond what the grid "
                                                 "resolves from t = 0.5 on"), said
