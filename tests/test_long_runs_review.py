"""Review of long runs: a resumed training whose optimizer leaves the stored path (round-off on another machine) keeps
checkpointing every --checkpoint-steps evaluations and names the first evaluation it made again; a filtered run with a
W per layer resumed after a layer boundary reports the resolution loss of the uninterrupted run."""

import json
import warnings

import numpy as np
import pytest
import torch
import xarray as xr
from test_cli import SMALL_S1
from test_resume import assert_same_result, interrupt, run_cli, state_of, write_case
from test_training import CASE as TRAINING_CASE

import spherepde
from solvers.checkpoint import Checkpoint, checkpoint_folder
from solvers.controlled_forward import Gradient
from solvers.journal import Journal


def quadratic(controls: torch.Tensor) -> Gradient:
    """J = |W|^2 / 2 and its gradient W, on a time grid of two steps: a stand-in for the adjoint's evaluation."""
    cost = 0.5 * float((controls ** 2).sum())
    return Gradient(cost, cost, controls.clone(), [0.0, 0.5], [1.0, cost])


def controls(k: float) -> torch.Tensor:
    return torch.full((2, 2, 2), k, dtype=torch.float64)


def committed_steps(output) -> int:
    with open(f"{checkpoint_folder(output)}/manifest.json") as stream:
        return json.load(stream)["steps"]


def stored_journal(output, case, count: int) -> None:
    """A training's checkpoint of `count` evaluations, at controls 1, 2, ..., count."""
    journal = Journal(case, quadratic, Checkpoint(output, every_steps=1))
    for k in range(1, count + 1):
        journal(controls(k))
    assert committed_steps(output) == count


def test_a_training_that_leaves_its_stored_path_checkpoints_every_n_evaluations_from_there(tmp_path):
    """5 evaluations stored; the resumed optimizer asks for the first again and then for other controls from the
    second on.  With --checkpoint-steps 1 each new evaluation is committed as it ends (the steps counted from the
    evaluations still on the path): 2, 3, 4.  Counted from the 5 stored, none was committed before the 6th, so a kill
    lost them all; and a second resume from the checkpoint now replays the new path, J bit for bit."""
    case, output = spherepde.load_case_text(TRAINING_CASE), tmp_path / "out.nc"
    stored_journal(output, case, 5)
    journal = Journal(case, quadratic, Checkpoint(output, every_steps=1, resume=True))
    journal(controls(1))
    committed = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the note's (the test below)
        for k in (20.0, 30.0, 40.0):
            journal(controls(k))
            committed.append(committed_steps(output))
    assert committed == [2, 3, 4]

    resumed = Journal(case, made_again, Checkpoint(output, every_steps=1, resume=True))
    costs = [resumed(controls(k)).cost for k in (1.0, 20.0, 30.0, 40.0)]
    assert np.array_equal(costs, [0.5 * 8 * k * k for k in (1.0, 20.0, 30.0, 40.0)])


def made_again(controls):
    raise AssertionError("a stored evaluation on the path was made again")


def test_the_note_of_a_training_that_leaves_its_stored_path_names_the_first_evaluation_made_again(tmp_path):
    """Evaluations 1 and 2 replayed, the optimizer's 3rd request differs from the 3rd stored: the note (a warning
    and a line of `notes`) names evaluation 3 and the 3 stored from there on; it named evaluation 2."""
    case, output = spherepde.load_case_text(TRAINING_CASE), tmp_path / "out.nc"
    stored_journal(output, case, 5)
    journal = Journal(case, quadratic, Checkpoint(output, every_steps=1, resume=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in (1.0, 2.0, 30.0):
            journal(controls(k))
    note = ("the resumed training left its stored path at evaluation 3: the 3 stored evaluations from there on were "
            "made again")
    assert [str(w.message) for w in caught] == [note] and journal.notes == [note]


@pytest.mark.slow  # three runs: about 4 s
def test_a_filtered_run_with_a_W_per_layer_resumed_after_a_layer_boundary_loses_its_resolution_where_it_did(
        tmp_path, capsys):
    """Three layers' W over t_end = 1.5 (boundaries 0.5, 1.0), saves every 0.4, steps of 0.05, filter_order = 8 and
    tail_tol = 5e-4: the filter takes 7.18e-5 of the L2 norm a step at t = 0.8, 5.74e-4 over the 8 steps since the save
    at 0.4, so the run is under-resolved after t = 0.4.  Resumed from its checkpoint at t = 0.6 the steps since that
    save were counted from the layer boundary 0.5 (6 steps, 4.31e-4) and the file said resolved_until = 0.8."""
    layers = "W = [[[0.0, -1.0], [1.0, 0.0]], [[0.0, 0.5], [-0.5, 0.0]], [[0.2, 0.0], [0.0, -0.2]]]\n"
    text = SMALL_S1.replace("eps = 0.1\n", "eps = 0.1\n" + layers).replace("t_end = 0.5", "t_end = 1.5").replace(
        "save_every = 0.25", "save_every = 0.4") + "filter_order = 8\n[diagnostics]\ntail_tol = 5e-4\n"
    case = write_case(tmp_path, text)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the resolution loss's
        assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
        interrupt(case, output, checkpoints=4, every_steps=3)
        assert state_of(output)["t"] == 0.6
        assert run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)[0] == 0
    with xr.open_dataset(reference) as uninterrupted, xr.open_dataset(output) as resumed:
        assert uninterrupted.attrs["resolved_until"] == resumed.attrs["resolved_until"] == 0.4
    assert_same_result(output, reference)


def test_a_resumed_run_that_fails_names_the_first_step_beyond_the_bound_after_its_checkpoint(tmp_path, capsys):
    """kuramoto-s1 at beta = 4, eps = 0.05, lmax 32, dt 0.02: max|v| grows past the transport's bound at t = 0.12
    (6.55, lmax max|v| dt = 4.19 > 4), and the density is not finite by the save at t = 1.  Resumed from its
    checkpoint at t = 0.04 the steps were taken again over the whole interval from that state, labelled from the
    interval's start (t = 0.08 for the step at 0.12); they are the steps after the checkpoint, at their own times, and
    the sentence says that the steps before it were not taken again."""
    case = write_case(tmp_path, spherepde.load_case("cases/kuramoto-s1.toml", [
        "model.beta=4", "model.eps=0.05", "sphere.lmax=32", "time.save_every=1", "time.dt=0.02",
        "time.t_end=2"]).text)
    status, uninterrupted = run_cli(["run", case, "-o", tmp_path / "reference.nc", "--quiet"], capsys)
    sentence = "lmax max|v| dt = 32 x 6.55 x 0.02 = 4.19 at t = 0.12, above 4"
    assert status == 3 and sentence in uninterrupted
    output = tmp_path / "out.nc"
    interrupt(case, output, checkpoints=1, every_steps=2)
    assert state_of(output)["t"] == 0.04
    status, resumed = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 3 and sentence in resumed
    assert "(the steps taken again from the checkpoint at t = 0.04 that the run resumed from" in resumed
