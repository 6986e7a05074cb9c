"""Review of long trainings: a resumed training whose optimizer leaves the stored path (round-off on another
machine) keeps checkpointing every --checkpoint-steps evaluations and names the first evaluation it made again."""

import json
import warnings

import numpy as np
import torch
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
