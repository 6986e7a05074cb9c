"""Plain runs' files do not depend on when their checkpoints fell: a run that fails numerically writes the file of
an uninterrupted run without checkpoints, whatever --checkpoint-steps (or the wall clock) said."""

import os

import pytest
import xarray as xr
from test_resume import CASE, assert_same_result, run_cli, write_case

from solvers.checkpoint import Checkpoint, checkpoint_folder

# rk4 with lmax max|v| dt = 64 x 0.233 x 0.5 = 7.46 > 2.83 at t = 0: the density is no longer finite after 9 steps of
# 0.5 (t = 4.5), detected at the first save t = 10 (step 20), whose last good state is t = 0
UNSTABLE = CASE.replace("dt = 0.01", "dt = 0.5").replace("t_end = 2.0", "t_end = 200.0").replace(
    "save_every = 0.25", "save_every = 10.0").replace("lmax = 16", "lmax = 64").replace(
    "beta = 2.0", "beta = 8.0").replace("eps = 0.1", "eps = 0.0")


@pytest.mark.parametrize("every", [1, 3, 7])
def test_a_failed_run_writes_the_same_file_wherever_its_checkpoints_fell(tmp_path, capsys, every):
    case = write_case(tmp_path, UNSTABLE)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 3
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--checkpoint-steps", every], capsys)
    assert status == 3 and "between t = 0 and 10 (dt = 0.5)" in err, err
    with xr.open_dataset(output) as result:
        # a checkpoint meeting the non-finite state at step 9 reported "between t = 0 and 4.5" and 0 steps
        assert result.attrs["status"] == "failed: the density became non-finite between t = 0 and 10 (dt = 0.5)"
        assert result.attrs["steps"] == 20 and list(result["time"].values) == [0.0]
    assert_same_result(output, reference)
    assert not os.path.exists(checkpoint_folder(output))


def test_an_interrupt_landing_on_a_state_that_is_not_finite_stops_on_the_last_checkpoint(tmp_path, capsys,
                                                                                         monkeypatch):
    """Ctrl-C at step 12 (t = 6, the state not finite since t = 4.5), checkpoints every 3 steps: the run stops on its
    checkpoint of step 6 (exit 130) and the resumed run fails as the uninterrupted one, file for file; it ended with
    exit 3 and a status of its own ("between t = 0 and 6") before."""
    case = write_case(tmp_path, UNSTABLE)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 3
    due = Checkpoint.due

    def ctrl_c_at_step_12(checkpoint, steps, last=False):
        checkpoint.interrupted = checkpoint.interrupted or (steps == 12 and not checkpoint.resume)
        return due(checkpoint, steps, last)

    with monkeypatch.context() as patch:
        patch.setattr(Checkpoint, "due", ctrl_c_at_step_12)
        status, err = run_cli(["run", case, "-o", output, "--quiet", "--checkpoint-steps", 3], capsys)
    assert status == 130 and not output.exists(), err
    assert Checkpoint(output).read_state()["steps"] == 6
    assert run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)[0] == 3
    assert_same_result(output, reference)
    assert not os.path.exists(checkpoint_folder(output))
