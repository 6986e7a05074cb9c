"""Sweeps: members without results keep their place in sweep.nc, --resume with nothing to resume is refused as
`run --resume` is, and batches are split to fit the memory of the machine."""

import contextlib

import numpy as np
import pytest
import xarray as xr

pytest.importorskip("distributed", reason="the sweep extra (Dask) is not installed: pip install 'spherepde[sweep]'")

from test_cli import SMALL_S1, write_case

from spherepde.api import limits
from spherepde.api import sweep as sweep_module
from spherepde.cli import main
from spherepde.io.summary import describe


class _InProcess:
    """A Dask client whose tasks (run_batch) run in this process as their futures are read."""

    loop = None

    def submit(self, function, *args, pure=True):
        return _Future(function, args)


class _Future:
    def __init__(self, function, args):
        self.key, self.function, self.args = f"run_batch-{args[0]}", function, args

    def result(self):
        return self.function(*self.args)


@pytest.fixture
def in_process(monkeypatch):
    import distributed

    monkeypatch.setattr(sweep_module, "_cluster", lambda scheduler, workers: contextlib.nullcontext(_InProcess()))
    monkeypatch.setattr(distributed, "as_completed", lambda futures, loop=None: iter(futures))


def test_members_without_results_keep_their_place_in_the_combined_file(tmp_path, in_process, capsys):
    """A member whose grid does not resolve its initial law is bad input found as it starts: it has no file, and
    sweep.nc held the other members alone, its status saying "failed: 1 of 2" over a member_status of one
    "completed".  Every member now has its place, its status and case, NaN results."""
    case = write_case(tmp_path)
    output = tmp_path / "out"
    assert main(["sweep", str(case), "--param", "initial.kappa=2,1e5", "--workers", "1", "-o", str(output)]) == 2
    assert "member 1 (initial.kappa=100000.0) bad input" in capsys.readouterr().err
    with xr.open_dataset(output / "sweep.nc") as combined, xr.open_dataset(output / "member-000.nc") as first:
        assert list(combined["member"].values) == [0, 1]
        assert list(combined["initial_kappa"].values) == [2.0, 1e5]
        assert combined.attrs["status"] == "failed: 1 of 2 sweep members (member_status)"
        assert combined["member_status"].values[0] == "completed"
        assert combined["member_status"].values[1].startswith("bad input")
        assert "kappa = 100000.0" in str(combined["member_case"].values[1])
        np.testing.assert_array_equal(combined["order_parameter"].sel(member=0).values,
                                      first["order_parameter"].values)
        assert np.isnan(combined["order_parameter"].sel(member=1).values).all()
        assert np.isnan(combined["density"].sel(member=1).values).all()
        assert combined["member_resolved_until"].values[0] == np.inf
        assert np.isnan(combined["member_resolved_until"].values[1])
    assert "bad input" in describe(str(output / "sweep.nc"))  # a member without results is no unreadable file


def test_resume_with_nothing_to_resume_is_refused_as_a_runs(tmp_path, in_process, capsys):
    """`run --resume` without a checkpoint is refused (exit 2); `sweep --resume` in a folder without this sweep's
    files ran every member from scratch (a mistyped -o ran the whole sweep again).  Now refused, nothing written."""
    case = write_case(tmp_path)
    output = tmp_path / "out"
    assert main(["sweep", str(case), "--param", "model.eps=0.1,0.2", "--workers", "1", "-o", str(output),
                 "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--resume" in err and "without --resume" in err, err
    assert not output.exists()


def test_batches_are_split_to_fit_the_memory_available(tmp_path, in_process, monkeypatch, capsys):
    """A batch holds every member's particles and saves at once: 4 members of 1000 particles on S^1 each hold at
    least PARTICLE_COPIES x 1000 x 2 float64 = 128 000 bytes and SAVE_COPIES x 3 saves x 1000 x 2 float64 = 96 000,
    and with 500 000 bytes available one batch of 4 was started all the same (each member alone passes
    check_memory).  Now batches of 500 000 // 224 000 = 2."""
    text = SMALL_S1.replace('device = "cpu"', 'device = "cpu"\nmethod = "particles"') + "[particles]\nn = 1000\n" \
        "dt = 0.05\n"
    case = write_case(tmp_path, text)
    per_member = limits.PARTICLE_COPIES * 1000 * 2 * 8 + limits.SAVE_COPIES * 3 * 1000 * 2 * 8
    monkeypatch.setattr(limits, "available_memory", lambda: 500_000)
    output = tmp_path / "out"
    assert main(["sweep", str(case), "--param", "model.eps=0.05,0.1,0.2,0.4", "--workers", "1", "-o",
                 str(output)]) == 0
    assert "batches of at most 2 members" in capsys.readouterr().err
    assert 500_000 // per_member == 2
    for index in range(4):
        with xr.open_dataset(output / f"member-{index:03d}.nc") as member:
            assert member.attrs["batch_members"] == 2
