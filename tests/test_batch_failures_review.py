"""A review of failures and interruptions inside batched runs (docs/guide/sweeps.md, docs/guide/long-runs.md): what an
interrupted sweep says and leaves, and how a signal that comes as sweep.nc is written ends it."""

import os
import signal

import numpy as np
import pytest
import xarray as xr

pytest.importorskip("distributed", reason="the sweep extra (Dask) is not installed: pip install 'spherepde[sweep]'")

from test_cli import SMALL_S1, write_case
from test_sweep_review import in_process  # noqa: F401 - the fixture: a sweep's batches run in this process

import spherepde.io.output
from spherepde.api import sweep as sweep_module
from spherepde.cli import main

# Two members of different steps: two batches, run one after the other in this process
STEPS = ["--param", "time.dt=0.05,0.025", "--set", "time.t_end=0.1", "--set", "time.save_every=0.05", "--workers", "1"]


def interrupted_at(member):
    """sweep.run_batch, but a KeyboardInterrupt (Ctrl-C) as the batch of `member` starts."""
    run_batch = sweep_module.run_batch

    def batch(indices, *args):
        if member in indices:
            raise KeyboardInterrupt
        return run_batch(indices, *args)
    return batch


def test_an_interrupt_before_any_member_completed_does_not_name_resume(tmp_path, in_process, monkeypatch,  # noqa: F811
                                                                       capsys):
    """Interrupted before any member completed, a sweep said "the members completed are kept in DIR; the same command
    with --resume runs the others", and that command was refused (exit 2: DIR holds nothing to resume).  It now says
    to run it again without --resume."""
    case, output = write_case(tmp_path), tmp_path / "out"
    monkeypatch.setattr(sweep_module, "run_batch", interrupted_at(0))
    assert main(["sweep", str(case), *STEPS, "-o", str(output)]) == 130
    err = capsys.readouterr().err
    assert f"no member completed, and {output} holds nothing to resume: run the same command again without --resume" \
        in err and "--resume runs" not in err, err
    assert not output.exists()
    assert main(["sweep", str(case), *STEPS, "-o", str(output), "--resume"]) == 2  # what the old line asked for


@pytest.mark.slow  # three sweeps: 4-6 s
def test_a_sweep_interrupted_after_a_member_resumes_to_the_uninterrupted_files(tmp_path, in_process,  # noqa: F811
                                                                              monkeypatch, capsys):
    """Interrupted after member 0 completed, the sweep names --resume and leaves member 0's file alone (no lock, no
    temporary file, no sweep.nc); --resume keeps that file byte for byte and ends with the uninterrupted sweep's
    files, every variable equal (but the wall times)."""
    case, straight, output = write_case(tmp_path), tmp_path / "straight", tmp_path / "out"
    assert main(["sweep", str(case), *STEPS, "-o", str(straight)]) == 0
    with monkeypatch.context() as patch:
        patch.setattr(sweep_module, "run_batch", interrupted_at(1))
        capsys.readouterr()
        assert main(["sweep", str(case), *STEPS, "-o", str(output)]) == 130
    err = capsys.readouterr().err
    assert f"the members completed are kept in {output}; the same command with --resume runs the others" in err, err
    assert sorted(os.listdir(output)) == ["member-000.nc"]
    kept = (output / "member-000.nc").read_bytes()
    assert main(["sweep", str(case), *STEPS, "-o", str(output), "--resume"]) == 0
    assert (output / "member-000.nc").read_bytes() == kept
    for name in ("member-000.nc", "member-001.nc", "sweep.nc"):
        with xr.open_dataset(output / name) as resumed, xr.open_dataset(straight / name) as reference:
            assert set(resumed.data_vars) == set(reference.data_vars)
            for variable in reference.data_vars:
                if variable != "member_wall_seconds":
                    np.testing.assert_array_equal(resumed[variable].values, reference[variable].values, variable)


@pytest.mark.parametrize("signum, name", [(signal.SIGINT, "SIGINT"), (signal.SIGTERM, "SIGTERM")])
def test_a_signal_as_the_combined_file_is_written_leaves_the_sweeps_exit_status(tmp_path, in_process,  # noqa: F811
                                                                               monkeypatch, capsys, signum, name):
    """Members of time.dt = 0.01 and 0.2 of a case whose longer step blows up (as tests/test_sweep.py's): the sweep
    ends with exit 3 naming member 1.  A SIGINT or SIGTERM that came as sweep.nc was written waited for the write
    (write_dataset holds it) and then ended the command "interrupted" (130, 143) with a complete sweep.nc, asking for
    a --resume that had nothing to run, the failure never told.  As for `run`'s output it now waits for the file and
    the sweep ends as it would have: exit 3, the failure named, a line saying the file is complete."""
    blowing_up = SMALL_S1.replace('kernel = "softmax"\nbeta = 2.0', 'kernel = "unnormalized"\nbeta = 1.0\n'
                                  'V = [[5.0, 0.0], [0.0, 5.0]]').replace("eps = 0.1", "eps = 0.0")
    case = write_case(tmp_path, blowing_up)
    write_dataset = spherepde.io.output.write_dataset

    def signalled(dataset, path):
        write_dataset(dataset, path)
        if os.path.basename(path) == "sweep.nc":
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(spherepde.io.output, "write_dataset", signalled)
    output = tmp_path / "out"
    assert main(["sweep", str(case), "--param", "time.dt=0.01,0.2", "--workers", "1", "-o", str(output)]) == 3
    err = capsys.readouterr().err
    assert f"spherepde: {name} came as sweep.nc was written; it is complete" in err, err
    assert "error: 1 of 2 sweep members failed; member 1 (time.dt=0.2): failed:" in err and "--resume" not in err, err
    assert sorted(os.listdir(output)) == ["member-000.nc", "member-001.nc", "sweep.nc"]
    with xr.open_dataset(output / "sweep.nc") as combined, xr.open_dataset(output / "member-001.nc") as failed:
        assert combined.attrs["status"] == "failed: 1 of 2 sweep members (member_status)"
        np.testing.assert_array_equal(combined["order_parameter"].sel(member=1).dropna("time").values,
                                      failed["order_parameter"].values)
