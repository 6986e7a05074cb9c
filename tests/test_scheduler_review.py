"""Sweeps on a Dask scheduler started by hand (--scheduler, docs/guide/sweeps.md "Where the members run"): a worker
that does not see DIR, a scheduler without workers, and addresses that are no Dask scheduler's."""

import contextlib
import os
import socket
import threading

import pytest
import xarray as xr

pytest.importorskip("distributed", reason="the sweep extra (Dask) is not installed: pip install 'spherepde[sweep]'")

from test_cli import write_case

from spherepde.api import sweep as sweep_module
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
