"""The command line as a user meets it, and sweeps: options a run does not use are refused, and a remote cluster's
batches are shared by its workers (docs/design.md "Command line", docs/guide/sweeps.md)."""

import contextlib

import xarray as xr
from test_cli import SMALL_S1, run_cli, write_case

import spherepde
from spherepde.api import sweep as sweep_module


def test_checkpoint_minutes_of_a_particle_run_is_refused_as_checkpoint_steps_is(tmp_path, capsys):
    """A particle run keeps no checkpoint: --checkpoint-steps was refused (exit 2) but --checkpoint-minutes, given
    a default by argparse, was taken without a word and did nothing (exit 0, the file written)."""
    case = write_case(tmp_path, SMALL_S1.replace('device = "cpu"', 'device = "cpu"\nmethod = "particles"')
                      + "[particles]\nn = 16\n")
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output, "--checkpoint-minutes", "0.5", "--quiet"], capsys)
    assert status == 2, err
    assert err.strip() == ("spherepde: error: --checkpoint-minutes: particle runs are not checkpointed (a rerun "
                           "reproduces them bit for bit)")
    assert not output.exists()


class _Client:
    """A Dask client of a remote cluster of WORKERS single-threaded workers, running each batch in this process."""

    WORKERS = 4
    loop = None

    def nthreads(self):
        return {f"tcp://127.0.0.1:{40000 + k}": 1 for k in range(self.WORKERS)}

    def submit(self, function, *args, pure=True):
        return _Done(function(*args), f"run_batch-{args[0]}")


class _Done:
    def __init__(self, value, key):
        self.value, self.key = value, key

    def result(self):
        return self.value


def test_a_remote_clusters_batches_are_shared_by_its_workers(tmp_path, monkeypatch):
    """Batches hold at most ceil(members / workers) members; with --scheduler and no --workers the workers counted
    were this machine's cores, not the cluster's: 4 members on a cluster of 4 workers, sent from a machine of 1 core,
    ran as one batch of 4 on one worker (2 of 2 on the review machine's 2 cores), the other workers idle."""
    import distributed

    monkeypatch.setattr(sweep_module, "default_workers", lambda members: 1)  # this machine: one core, no GPU
    monkeypatch.setattr(sweep_module, "_cluster", lambda scheduler, workers: contextlib.nullcontext(_Client()))
    monkeypatch.setattr(distributed, "as_completed", lambda futures, loop=None: iter(futures))
    case = spherepde.load_case_text(SMALL_S1)
    folder = tmp_path / "out"
    sweep_module.run_sweep(case, ["model.eps=0.1,0.2,0.3,0.4"], str(folder), scheduler="tcp://127.0.0.1:8786",
                           progress=False)
    sizes = []
    for index in range(4):
        with xr.open_dataset(folder / f"member-{index:03d}.nc") as member:
            sizes.append(int(member.attrs["batch_members"]))
    assert sizes == [1, 1, 1, 1]
