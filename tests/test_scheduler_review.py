"""Sweeps on a Dask scheduler started by hand (--scheduler, docs/guide/sweeps.md "Where the members run"): a worker
that does not see DIR, a scheduler without workers or whose workers all left, and addresses that are no Dask
scheduler's."""

import contextlib
import importlib.util
import io
import os
import socket
import sys
import threading

import numpy as np
import pytest
import xarray as xr

pytest.importorskip("distributed", reason="the sweep extra (Dask) is not installed: pip install 'spherepde[sweep]'")

from test_cli import write_case

import spherepde
from spherepde.api import sweep as sweep_module
from spherepde.api.sweep import run_batch
from spherepde.cli import main


class _Future:
    def __init__(self, key, result):
        self.key, self.result = key, result


class _Cluster:
    """A Dask client at --scheduler whose tasks (run_batch) run in this process as their futures are read, on
    `workers` workers; the batches of the members in `blind` run on a worker that does not see DIR: the member files
    it writes are on its own disk (moved to `elsewhere`), not this machine's."""

    loop = None

    def __init__(self, workers):
        self.workers, self.blind, self.elsewhere = workers, (), None

    def nthreads(self):
        return {f"tcp://127.0.0.1:{40000 + k}": 1 for k in range(self.workers)}

    def submit(self, function, *args, pure=True):
        def result():
            summaries = function(*args)
            for path in args[2] if set(args[0]) & set(self.blind) else ():
                os.replace(path, self.elsewhere / os.path.basename(path))
            return summaries

        return _Future(f"run_batch-{args[0]}", result)


@pytest.fixture
def cluster(monkeypatch):
    """Patches the sweep's cluster with the _Cluster it returns."""
    import distributed

    chosen = _Cluster(1)
    monkeypatch.setattr(sweep_module, "_cluster", lambda scheduler, workers: contextlib.nullcontext(chosen))
    monkeypatch.setattr(distributed, "as_completed", lambda futures, loop=None: iter(futures))
    return chosen


def test_a_worker_that_does_not_see_the_sweep_folder_fails_its_members_by_name(tmp_path, cluster, capsys):
    """A worker on another machine (or mount) wrote its members' files under DIR on its own disk: the sweep said
    "member 0 ... completed", then ended "error: [Errno 2] No such file or directory: '.../member-000.nc'" (exit 2),
    the other members' results in no sweep.nc.  Now such a member fails saying why, and the others are combined."""
    cluster.workers, cluster.blind, cluster.elsewhere = 2, [1], tmp_path / "worker-disk"
    cluster.elsewhere.mkdir()
    output = tmp_path / "out"
    status = main(["sweep", str(write_case(tmp_path)), "--param", "model.eps=0.1,0.2", "--scheduler",
                   "tcp://127.0.0.1:8786", "-o", str(output)])
    err = capsys.readouterr().err
    assert status == 2 and "Errno" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"spherepde: error: 1 of 2 sweep members failed; member 1 (model.eps=0.2): failed: its worker wrote "
        f"{output / 'member-001.nc'}, which this machine does not see: the workers must see DIR at the same path "
        "(a shared file system)")
    with xr.open_dataset(output / "sweep.nc") as combined:
        assert list(combined["member_status"].values[:1]) == ["completed"]
        assert combined["member_status"].values[1].startswith("failed: its worker wrote")
        assert float(combined["order_parameter"].sel(member=1).isnull().sum()) == combined.sizes["time"]


def test_a_scheduler_without_workers_says_the_members_wait(tmp_path, cluster, capsys):
    """With no worker connected the sweep waited for ever, saying only "members=0/2 (0%), ..., time left unknown"
    every 30 s.  Now one line says why it waits, once, before the members run."""
    cluster.workers = 0
    status = main(["sweep", str(write_case(tmp_path)), "--param", "model.eps=0.1,0.2", "--scheduler",
                   "tcp://127.0.0.1:8786", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 0, err
    assert err.count("no worker is connected") == 1
    assert err.splitlines()[0] == ("spherepde: note: no worker is connected to the scheduler at tcp://127.0.0.1:8786: "
                                   "the members wait for one (dask worker tcp://127.0.0.1:8786; --workers N sizes "
                                   "the batches for N workers)")


def test_a_scheduler_with_workers_says_nothing_of_them(tmp_path, cluster, capsys):
    cluster.workers = 2
    assert main(["sweep", str(write_case(tmp_path)), "--param", "model.eps=0.1,0.2", "--scheduler",
                 "tcp://127.0.0.1:8786", "-o", str(tmp_path / "out")]) == 0
    assert "no worker" not in capsys.readouterr().err


# The first batch's task waits in its worker until `release`; pickled by reference (a module's function), so that the
# in-process workers of the test's cluster share these events
_FIRST_BATCH = {"started": threading.Event(), "release": threading.Event()}


def _first_batch_held(indices, case_texts, paths, threads=None):
    """sweep.run_batch, but the first call waits for `release` and returns nothing (its worker is gone by then)."""
    if not _FIRST_BATCH["started"].is_set():
        _FIRST_BATCH["started"].set()
        _FIRST_BATCH["release"].wait(60)
        return []
    return run_batch(indices, case_texts, paths, threads)


class _Stderr(io.StringIO):
    """sys.stderr that sets `noted` when the note of the workers lost is written."""

    def __init__(self):
        super().__init__()
        self.noted = threading.Event()

    def write(self, text):
        if "no worker is left" in text:
            self.noted.set()
        return super().write(text)


@pytest.mark.parametrize("remote", [True, False], ids=["scheduler", "local cluster"])
def test_a_sweep_whose_every_worker_left_says_the_members_wait(tmp_path, monkeypatch, remote):
    """The only worker of the scheduler at --scheduler (`remote`, else of the sweep's own cluster) leaves while it
    runs a batch (closed here; killed, the same): the sweep waited for ever saying only "members=0/1 (0%), ..., time
    left unknown" every 30 s.  Now one line says that no worker is left and the members wait; a worker that connects
    then runs them, and the sweep completes."""
    from distributed import Client, LocalCluster

    monkeypatch.setattr(sweep_module, "WORKERLESS_SECONDS", 0.3)
    monkeypatch.setattr(sweep_module, "WORKERS_POLL_SECONDS", 0.05)
    monkeypatch.setattr(sweep_module, "run_batch", _first_batch_held)
    for event in _FIRST_BATCH.values():
        event.clear()
    stderr = _Stderr()
    monkeypatch.setattr(sys, "stderr", stderr)
    case, output = write_case(tmp_path), tmp_path / "out"
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster:
        def lose_and_restore():
            if _FIRST_BATCH["started"].wait(60):
                (worker,) = cluster.workers.values()
                cluster.sync(worker.close, executor_wait=False)
                stderr.noted.wait(10)  # without the note too: the sweep would wait for ever
                cluster.scale(2)  # a new worker beside the closed one

        helper = threading.Thread(target=lose_and_restore, daemon=True)
        helper.start()
        address = cluster.scheduler_address
        if not remote:  # the LocalCluster the sweep would start, in this process so that its worker can be closed
            monkeypatch.setattr(sweep_module, "_cluster", lambda scheduler, workers: Client(cluster))
        try:
            status = main(["sweep", str(case), "--param", "model.eps=0.1", "-o", str(output)]
                          + (["--scheduler", address] if remote else ["--workers", "1"]))
        finally:
            _FIRST_BATCH["release"].set()
            helper.join(timeout=60)
    err = stderr.getvalue()
    assert status == 0, err
    assert err.count("no worker") == 1, err
    where = (f"the scheduler at {address}: the members wait for one (dask worker {address})" if remote
             else "the local cluster: the members wait for one")
    assert (f"spherepde: note: no worker is left on {where}; or interrupt the sweep, and the same command with "
            "--resume keeps the members done\n") in err
    serial = spherepde.run(spherepde.load_case(str(case), ["model.eps=0.1"]), progress=False)
    with xr.open_dataset(output / "sweep.nc") as combined:
        assert list(combined["member_status"].values) == ["completed"]
        assert np.array_equal(combined["density"].sel(member=0).values, serial["density"].values)


def test_an_http_server_is_no_scheduler_in_one_line(tmp_path, capsys):
    """An HTTP server (a dashboard's port, a proxy) answers Dask's handshake with text, whose first 8 bytes Dask read
    as a frame count: "cannot reach a Dask scheduler ...: MemoryError: Unable to allocate 3.07 EiB"."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def answer():
            connection, _ = listener.accept()
            with connection:
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n")

        server = threading.Thread(target=answer, daemon=True)
        server.start()
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        status = main(["sweep", str(write_case(tmp_path)), "--param", "model.eps=0.1", "--scheduler", address,
                       "-o", str(tmp_path / "out")])
        server.join(timeout=10)
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.strip() == (f"spherepde: error: --scheduler: cannot reach a Dask scheduler at {address!r}: ValueError: "
                           "its answer is no Dask message (an HTTP server? a dashboard's port?)")
    assert not (tmp_path / "out").exists()


def test_an_address_without_a_host_is_refused_at_once(tmp_path, capsys, monkeypatch):
    """tcp://:8786 was connected to for the whole connect timeout (30 s, then "Timed out trying to connect")."""
    def no_connection(*args, **kwargs):
        raise AssertionError("an address without a host is not connected to")

    monkeypatch.setattr("distributed.comm.connect", no_connection)
    status = main(["sweep", str(write_case(tmp_path)), "--param", "model.eps=0.1", "--scheduler", "tcp://:8786",
                   "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2 and err.strip() == ("spherepde: error: --scheduler 'tcp://:8786' is not an address of the form "
                                           "tcp://HOST:PORT (no host)"), err


@pytest.mark.parametrize("address, why", [
    ("inproc://foo", "an inproc:// address reaches a scheduler in its own process only"),
    ("inproc://127.0.0.1/1/1", "an inproc:// address reaches a scheduler in its own process only"),
    ("ucx://127.0.0.1:8786", "ucx:// needs the distributed-ucxx package, which is not installed"),
    ("foo://127.0.0.1:8786", "Dask has no foo:// protocol")])
def test_an_address_of_a_protocol_that_reaches_no_scheduler_says_which_forms_do(tmp_path, capsys, monkeypatch,
                                                                                 address, why):
    """inproc:// and ucx:// addresses ended in one line that did not say what was wrong ("cannot reach a Dask scheduler
    at 'inproc://foo': ValueError: not enough values to unpack (expected 3, got 1)", "... TypeError: Can't instantiate
    abstract class UCXConnector with abstract method connect"); now it names the forms that are supported."""
    if address.startswith("ucx") and importlib.util.find_spec("distributed_ucxx") is not None:
        pytest.skip("distributed-ucxx is installed: ucx:// addresses are Dask's")

    def no_connection(*args, **kwargs):
        raise AssertionError("an address of such a protocol is not connected to")

    monkeypatch.setattr("distributed.comm.connect", no_connection)
    status = main(["sweep", str(write_case(tmp_path)), "--param", "model.eps=0.1", "--scheduler", address,
                   "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2 and err.strip() == (f"spherepde: error: --scheduler {address!r}: {why}; give the scheduler's "
                                           "address as tcp://HOST:PORT or HOST:PORT"), err
    assert not (tmp_path / "out").exists()


def test_an_inproc_address_of_this_process_runs_the_sweep(tmp_path):
    """The Python API on a LocalCluster(processes=False) of its own process, whose address is inproc://: not
    refused, the member is its serial run."""
    from distributed import LocalCluster

    case = spherepde.load_case(str(write_case(tmp_path)))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        assert cluster.scheduler_address.startswith("inproc://")
        combined_path = sweep_module.run_sweep(case, ["model.eps=0.1"], str(tmp_path / "out"),
                                               scheduler=cluster.scheduler_address, progress=False)
    serial = spherepde.run(case.with_overrides(["model.eps=0.1"]), progress=False)
    with xr.open_dataset(combined_path) as combined:
        assert np.array_equal(combined["density"].sel(member=0).values, serial["density"].values)
