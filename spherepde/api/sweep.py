"""Parameter sweeps on Dask distributed (docs/design.md "Command line"): one NetCDF per member, one combined Dataset.

    spherepde sweep CASE.toml --param model.eps=0.1,0.2 --param model.beta=1,4 [--seeds N]
                              [--scheduler ADDRESS | --workers N] [-o DIR]

The members are all combinations of the --param values (each list parsed as TOML, so
matrices and strings work: ``--param 'model.V=[[1,0],[0,1]],[[2,0],[0,2]]'``), each
repeated N times with ``--seeds N``: replicate r of every combination gets
``particles.seed`` = the r-th seed spawned from the case's seed (numpy SeedSequence), so
the replicates are independent and every combination sees the same seeds. Every member
is resolved and validated before anything runs (bad input: exit 2, nothing written).

Members that share a grid and the shapes of their state run together, as one batch in one
tensor program (spherepde.api.ensemble: which keys may differ); a batch runs in a Dask task that
gets its members' resolved case texts, writes each member's DIR/member-NNN.nc atomically (the
file its serial run would write) and returns their paths and a few numbers, never arrays: Dask
distributes batches, not members.  Batches hold at most ceil(members / workers) members, so that
every worker has work.  The cluster is a LocalCluster (one single-threaded worker process per GPU
where there are GPUs, worker k on GPU k; else one per core; each batch runs with its case's solver.threads, "auto"
at most an even share of the cores, and glibc's thresholds of spherepde.base.memory) or, with ``--scheduler``, an
existing one; its workers must see DIR at the same path. When all
members are done, DIR/sweep.nc combines them along a `member` dimension
(xr.open_mfdataset), with the swept keys (and `seed`) as member coordinates and each
member's case text and status. Members whose grids differ (a swept sphere.lmax) keep
their densities in their own files only. Members whose results are the same numbers (a key their
runs do not read) are named in a note (`identical_results`).
"""

import contextlib
import hashlib
import itertools
import logging
import math
import numbers
import os
import re
import signal
import sys
import threading
import time
import tomllib
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from spherepde.api.limits import check_members, largest_batch
from spherepde.base import interrupts, memory
from spherepde.base.device import placement
from spherepde.base.errors import CaseError, NumericalFailure, damaged
from spherepde.base.progress import Progress
from spherepde.io.case import Case, format_override, parse_override
from spherepde.io.case_toml import case_differences
from spherepde.io.output import check_folder

GRID_DIMS = ("theta", "lat", "lon")
COMBINED = "sweep.nc"
MEMBER_FILE = re.compile(r"member-\d{3,}\.nc")  # Member.path's names
# Every worker gone for this long is told: a nanny starts a killed worker again within seconds (1.2 s measured on a
# LocalCluster of 2 workers both killed), and that is no loss to tell
WORKERLESS_SECONDS = 10.0
WORKERS_POLL_SECONDS = 1.0  # how often the sweep asks the scheduler for its workers while the members run


@dataclass(frozen=True)
class Member:
    """One run of a sweep: its swept values, its seed (None: the case's), its case and output file."""

    index: int
    values: dict
    seed: int | None
    case: Case
    path: str

    def label(self) -> str:
        """The member's swept values as --set would take them (TOML: true, not True), and its seed."""
        items = [format_override(key, value) for key, value in self.values.items()]
        return ", ".join(items + ([f"seed={self.seed}"] if self.seed is not None else []))


def parse_param(item: str) -> tuple[str, list]:
    """"section.key=v1,v2,..." -> (key, [v1, v2, ...]), the list parsed as TOML (bare words as strings)."""
    key, equals, text = item.partition("=")
    key = ".".join(part.strip() for part in key.split("."))  # as parse_override reads it: "model . eps" is model.eps
    if not equals or not text.strip() or len(key.split(".")) < 2 or not all(key.split(".")):
        raise CaseError(f"--param {item!r}: expected section.key=v1,v2,...")
    try:
        values = tomllib.loads(f"v = [{text}]")["v"]
    except tomllib.TOMLDecodeError:
        parts = text.split(",")
        if any(not part.strip() for part in parts):  # bare words read as strings: an empty one is no value
            raise CaseError(f"--param {item!r}: an empty value (a comma with no value before or after it)") from None
        values = [parse_override(f"{key}={part}")[1] for part in parts]
    if not values:
        raise CaseError(f"--param {item!r}: no values")
    if text.strip().endswith(","):  # TOML takes "[0.1,]" as one value; "0.1,,0.2" is refused as an empty one
        raise CaseError(f"--param {item!r}: an empty value after the last comma")
    written = [format_override(key, value) for value in values]
    repeated = sorted({entry.partition("=")[2] for entry in written if written.count(entry) > 1})
    if repeated:
        raise CaseError(f"--param {item!r}: {', '.join(repeated)} given twice (its members would be the same run)")
    return key, values


def derived_seeds(seed: int, count: int) -> list[int]:
    """`count` independent seeds spawned from `seed` (numpy SeedSequence), as ints >= 0."""
    return [int(child.generate_state(1)[0]) for child in np.random.SeedSequence(seed).spawn(count)]


def plan(case: Case, params: list[str], folder: str, seeds: int | None = None) -> list[Member]:
    """Every member, its case resolved and validated (a CaseError names the member)."""
    case = case.checked()  # the seeds below derive from a particles.seed edited in place too
    swept = [parse_param(item) for item in params]
    keys = [key for key, _ in swept]
    if len(set(keys)) != len(keys):
        raise CaseError(f"--param: a key is given twice: {', '.join(keys)}")
    if seeds and "particles.seed" in keys:
        raise CaseError("--seeds with --param particles.seed: --seeds replaces every member's particles.seed by seeds "
                        "spawned from the case's, so the swept seeds would be identical runs; give one or the other")
    check_members([len(values) for _, values in swept], seeds)  # before the seeds are derived
    replicates = derived_seeds(case["particles"]["seed"], seeds) if seeds else [None]
    combinations = list(itertools.product(*(values for _, values in swept), replicates))
    width = max(3, len(str(len(combinations) - 1)))
    members = []
    for index, combination in enumerate(combinations):
        values, seed = dict(zip(keys, combination[:-1])), combination[-1]
        overrides = [format_override(key, value) for key, value in values.items()]
        if seed is not None:
            overrides.append(format_override("particles.seed", seed))
        try:
            member_case = case.with_overrides(overrides)
        except CaseError as error:
            raise CaseError(f"sweep member {index} ({', '.join(overrides)}): {error}") from None
        if seed is not None and member_case["solver"]["method"] == "eulerian":
            raise CaseError(f"--seeds: sweep member {index} is an Eulerian run, which has no random draws: its "
                            "replicates would be identical (seeds vary particles.seed of particle runs)")
        path = os.path.abspath(os.path.join(folder, f"member-{index:0{width}d}.nc"))
        members.append(Member(index, values, seed, member_case, path))
    return members


def check_members_run(members: list[Member], local: bool) -> None:
    """What a serial run refuses before it starts, for every member before any runs (a CaseError naming the
    member): its memory (spherepde.api.limits.check_memory), the refusals from its case alone
    (spherepde.api.dispatch.check_case: its kernels, the solvers' choices, a particle run's steps), an initial file
    that holds no density for it (spherepde.model.initial.stored_coefficients), and (`local`: the local workers see
    this machine's devices, a remote cluster's may differ) its solver.device.  Members that would be one run are
    refused too: the same resolved case but for [case] (its name and description), or for an Eulerian run one that
    differs in [particles] only too (it draws nothing)."""
    from spherepde.api.dispatch import check_case
    from spherepde.api.limits import check_memory
    from spherepde.model.initial import stored_coefficients

    checked, files, runs = set(), set(), {}
    for member in members:
        # [case] names and describes a run; an Eulerian run draws nothing, so [particles] does not change it
        ignored = ("case", "particles") if member.case["solver"]["method"] == "eulerian" else ("case",)
        sections = {name: values for name, values in member.case.data.items() if name not in ignored}
        run = repr(sorted((name, sorted(_unsigned_zeros(values).items())) for name, values in sections.items()))
        if run in runs:
            other = runs[run].case.data
            why = {"particles": " (an Eulerian run draws nothing: [particles] keys do not change it)",
                   "case": " ([case] only names and describes a run)"}
            raise CaseError(f"sweep members {runs[run].index} ({runs[run].label()}) and {member.index} "
                            f"({member.label()}) are the same run"
                            + "".join(why[name] for name in ignored if other.get(name) != member.case.data.get(name)))
        runs[run] = member
        try:
            check_memory(member.case)
            solver, initial = member.case["solver"], member.case["initial"]
            device = placement(solver["device"], solver["dtype"]).device.type if local else (
                None if solver["device"] == "auto" else solver["device"])
            key = repr([sorted(member.case[name].items()) for name in ("sphere", "model", "solver", "particles")])
            if key not in checked:
                check_case(member.case, device)
                checked.add(key)
            source = (initial.get("path"), initial.get("time"), member.case.dim)
            if initial["kind"] == "file" and source not in files:
                stored_coefficients(*source, placement("cpu", "float64"))
                files.add(source)
        except CaseError as error:
            raise CaseError(f"sweep member {member.index} ({member.label()}): {error}") from None


def _unsigned_zeros(value):
    """`value` with each float -0.0 in it (in lists and tables too) as 0.0: no run reads the sign of a zero (eps, a
    matrix entry), but repr tells them apart, and model.eps=0,-0.0 ran the same run twice."""
    if isinstance(value, float):
        return value + 0.0  # -0.0 + 0.0 is 0.0
    if isinstance(value, list):
        return [_unsigned_zeros(item) for item in value]
    if isinstance(value, dict):
        return {key: _unsigned_zeros(item) for key, item in value.items()}
    return value


def run_batch(indices: list, case_texts: list, paths: list, threads: int | None = None) -> list:
    """Run one batch of members together (in a Dask task; spherepde.api.ensemble.run_batch) and write each member's
    file; returns their summaries.  `threads`: at most this many threads (an even share of the local cores)."""
    from spherepde import load_case_text
    from spherepde.api.ensemble import run_batch as run_members
    from spherepde.base.threads import threads_for
    from spherepde.io.output import write_dataset

    _use_worker_gpu()
    cases = [load_case_text(text, origin=f"sweep member {index}") for index, text in zip(indices, case_texts)]
    with warnings.catch_warnings(), threads_for(cases[0], at_most=threads):  # the batch shares sphere and solver
        warnings.simplefilter("ignore", RuntimeWarning)  # recorded in the notes of the outputs
        outcomes = run_members(cases, progress=False)
    summaries = []
    for index, path, outcome in zip(indices, paths, outcomes):
        if isinstance(outcome, CaseError):
            summaries.append({"member": index, "path": None, "status": f"bad input: {outcome}", "exit_status": 2})
            continue
        exit_status, dataset = 0, outcome
        if isinstance(outcome, NumericalFailure):
            if outcome.dataset is None:
                summaries.append({"member": index, "path": None, "status": NumericalFailure.status(outcome),
                                  "exit_status": 3})
                continue
            exit_status, dataset = 3, outcome.dataset
        dataset.attrs["history"] += f" (member {index} of the sweep in {os.path.dirname(path)})"
        write_dataset(dataset, path)
        summaries.append(summarise(index, path, dataset, exit_status))
        if exit_status:  # the failure's whole message, with what the serial run says to do ("take time.dt below")
            summaries[-1]["status"] = NumericalFailure.status(outcome)
    return summaries


def _batch_summaries(future, group: list[Member]) -> list:
    """The summaries of a batch's members (run_batch's), or where the batch ended without them, each member's failure:
    its worker process died on every try (Dask's KilledWorker: killed by the system, most often for want of memory)
    or its task raised MemoryError or OSError (a member file that could not be written: a full disk).  These are
    what a serial run reports as exit 2 (spherepde.cli: out of memory, a file it cannot write); raised here they
    ended the sweep at once with a traceback, every other batch's members left out of a sweep.nc never written."""
    from distributed import KilledWorker

    try:
        summaries = future.result()
    except (KilledWorker, MemoryError, OSError) as error:
        why = ("the worker process running its batch died on every try (killed by the system: out of memory?)"
               if isinstance(error, KilledWorker) else f"{type(error).__name__}: {error or 'out of memory'}")
        return [{"member": member.index, "path": None, "status": f"failed: {why}", "exit_status": 2}
                for member in group]
    # a worker of a cluster at --scheduler that does not see DIR at the same path (another machine, another mount)
    # wrote the member file on its own disk: counted "completed", the member's file was then missing as sweep.nc was
    # written, and the sweep ended "[Errno 2] No such file or directory", every member's results out of a sweep.nc
    # never written
    for index, summary in enumerate(summaries):
        if summary["path"] is not None and not os.path.isfile(summary["path"]):
            summaries[index] = {"member": summary["member"], "path": None, "exit_status": 2, "status": (
                f"failed: its worker wrote {summary['path']}, which this machine does not see: the workers must "
                "see DIR at the same path (a shared file system)")}
    return summaries


def summarise(index: int, path: str, dataset, exit_status: int) -> dict:
    """The few numbers a member reports: status, steps, wall time, final order parameter, from when its results
    are under-resolved (`resolved_until`: "end" where they are not, and for particles), and the digest of its results
    (`results_digest`, of a completed member's alone: `identical_results` compares no others)."""
    final = dataset["order_parameter"].values[-1] if "order_parameter" in dataset else float("nan")
    return {"member": index, "path": path, "status": dataset.attrs.get("status", "?"), "exit_status": exit_status,
            "steps": int(dataset.attrs.get("steps", 0)), "wall_seconds": float(dataset.attrs.get("wall_seconds", 0)),
            "t": float(dataset["time"].values[-1]), "order_parameter": float(final),
            "resolved_until": dataset.attrs.get("resolved_until", "end"),
            "digest": results_digest(dataset) if exit_status == 0 else None}


def results_digest(dataset) -> str:
    """The SHA-256 of a result's variables (names, dimensions and values; numbers as float64, as a NetCDF file gives
    them back) but those on the grid or over the particles (densities, positions, the adjoint: the diagnostics are
    functions of them, and reading them back from every member's file on --resume would cost a sweep's size again),
    not of its attributes (the case, the wall time): two runs that computed the same numbers share it."""
    digest = hashlib.sha256()
    for name in sorted(dataset.variables):
        variable = dataset.variables[name]
        if set(variable.dims) & {*GRID_DIMS, "particle"}:
            continue
        values = np.asarray(variable.values)
        digest.update(repr((name, variable.dims, values.shape)).encode())
        if values.dtype.kind in "biuf":
            digest.update(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        else:
            digest.update(repr(values.tolist()).encode())
    return digest.hexdigest()


def identical_results(members: list[Member], summaries: dict) -> list[str]:
    """A note for each set of completed members whose files hold the same numbers: the keys they differ in do not
    change the run (sphere.lmax of a particle run with a fixed time.dt, say), so the sweep measured nothing along
    them."""
    alike = {}
    for member in members:  # completed members only: failed ones may share no more than their start
        summary = summaries[member.index]
        if summary["exit_status"] == 0 and summary.get("digest") is not None:
            alike.setdefault(summary["digest"], []).append(member)
    return [f"members {', '.join(f'{m.index} ({m.label()})' for m in group)} gave identical results: what they "
            "differ in does not change this run" for group in alike.values() if len(group) > 1]


def _resolved_until(summary: dict) -> float:
    """The member's resolved_until: its last resolved save, after which its results are under-resolved; inf where
    they are not (or it has no file)."""
    value = summary.get("resolved_until", "end")
    return math.inf if isinstance(value, str) else float(value)


def _progress_line(member: "Member", summary: dict) -> str:
    """What the sweep prints as a member ends: its status, and where its resolution was lost (a serial run warns)
    unless its status says so (a failure of an under-resolved run: RunRecord.failure)."""
    lost, status = _resolved_until(summary), _own_status(summary)
    said = math.isfinite(lost) and "under-resolved after t = " not in status
    note = f"; under-resolved after t = {lost:g} (see its notes)" if said else ""
    return f"member {summary['member']} ({member.label()}) {status}{note}"


def _own_status(summary: dict) -> str:
    """A member's status without the "sweep member N: " that its case's errors begin with (it is named already)."""
    return summary["status"].replace(f"sweep member {summary['member']}: ", "")


def _use_worker_gpu() -> None:
    """On a LocalCluster with GPUs, worker k (named k) uses GPU k modulo the GPU count."""
    import torch

    if not torch.cuda.is_available():
        return
    from distributed import get_worker

    try:
        index = int(get_worker().name)
    except (ValueError, TypeError):  # not in a worker, or a worker named by its address
        return
    torch.cuda.set_device(index % torch.cuda.device_count())


def _completed(member: Member) -> dict | None:
    """The summary of an earlier run of `member` that completed with the same case and today's save times (those of
    an earlier version could be an ulp apart: sweep.nc's time axis would hold both); else None."""
    import xarray as xr

    from solvers.timegrid import save_times

    timing = member.case["time"]
    if not os.path.isfile(member.path):  # none, or no regular file: opening a named pipe waits for a writer
        return None
    try:
        with xr.open_dataset(member.path) as dataset:
            if (dataset.attrs.get("status") == "completed" and dataset.attrs.get("case") == member.case.text
                    and np.array_equal(dataset["time"].values, save_times(timing["t_end"], timing["save_every"]))):
                # read whole here: a damaged chunk was met as sweep.nc was written, "cannot write sweep.nc ... (is
                # the disk full?)"; such a member is run again
                dataset.load()
                return summarise(member.index, member.path, dataset, 0)
    except (OSError, ValueError, KeyError):
        pass
    except (RuntimeError, AttributeError) as error:
        if not damaged(error):
            raise
    return None


def _stored_case(path: str) -> str | None:
    """The resolved case text a member file stores (its `case` attribute), or None where there is no file or it is no
    result that --resume could keep (unreadable, no case): that member is simply run again."""
    import xarray as xr

    if not os.path.isfile(path):
        return None
    try:
        with xr.open_dataset(path) as dataset:
            case = dataset.attrs["case"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return case if isinstance(case, str) else None


def _refuse_other_runs(members: list[Member], folder: str) -> None:
    """--resume keeps an earlier sweep's files of other members (docs/guide/sweeps.md): a CaseError where a file under
    a member's name holds another run (an earlier sweep of other --param values), which running the member would
    replace, destroying that result.  Another run is a key that both cases hold with different values: a key only
    one holds is a version's addition to the resolved case, and a file of the member's own case (failed, or of an
    earlier version) is run again as before."""
    for member in members:
        stored = _stored_case(member.path)
        if stored is None:
            continue
        try:
            differing = next(((key, there) for key, there, own in case_differences(stored, member.case.text)
                              if there is not None and own is not None), None)
        except (tomllib.TOMLDecodeError, RecursionError):  # no case --resume could compare: the member runs again
            continue
        if differing is not None:
            raise CaseError(f"--resume: {os.path.basename(member.path)} in {folder!r} holds another run than member "
                            f"{member.index} ({member.label()}): {format_override(*differing)}; "
                            "resuming would replace it: pass --overwrite to run every member again, or -o another "
                            "folder")


@contextlib.contextmanager
def _cluster(scheduler: str | None, workers: int):
    """A Dask client: on the scheduler at `scheduler`, or on a LocalCluster of `workers` processes."""
    from distributed import Client, LocalCluster

    if scheduler:
        with _connected(scheduler) as client:
            yield client
        return
    import dask

    # glibc's thresholds of a run (spherepde.base.memory) in place of Dask's eager trimming, set before the workers
    # start: glibc reads them once, at a process's start
    environ = {**dask.config.get("distributed.nanny.pre-spawn-environ"), **memory.environment()}
    # With no dashboard the scheduler still serves its health routes over HTTP, on port 8787 unless told otherwise:
    # where that port was taken (another sweep, a notebook's cluster) it printed a UserWarning of three lines.  Any
    # free port of the loopback serves (the dashboard itself stays off: dashboard_address=None).
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}), LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
            silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        yield client


def _connected(scheduler: str):
    """A Client on the Dask scheduler at `scheduler`, or a CaseError.  Where nothing listens, Client gives up after
    distributed.comm.timeouts.connect (dask config, 30 s); but a server that accepts the connection and never
    answers Dask's handshake (any other TCP service) held it for ever, and one that answers otherwise (an HTTP
    server) was read as Dask frames ("MemoryError: Unable to allocate 3.07 EiB").  So the address is first asked who
    it is, connecting and answering within one deadline of that timeout and as long again (2 s at least: 60 s by
    default), in an event loop of this thread, cancelled whole at the deadline (a Client left waiting in a thread of
    its own was collected later and hung the process), unless this thread runs a loop already (a notebook's), where
    it cannot be asked so.  Any exception of Client's (a tls:// address without its security settings raises
    TypeError) is the address's fault."""
    import asyncio

    import dask
    from dask.utils import parse_timedelta
    from distributed import Client
    from distributed.comm import connect

    connecting = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"), "s")
    seconds = connecting + max(connecting, 2.0)

    async def identity() -> dict:
        try:
            comm = await connect(scheduler, timeout=connecting)
        except MemoryError:  # the first 8 bytes of a text reply ("HTTP/1.1") read as a Dask message's frame count
            raise ValueError("its answer is no Dask message (an HTTP server? a dashboard's port?)") from None
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    try:
        if not _running_loop():
            answer = asyncio.run(asyncio.wait_for(identity(), seconds))
            if not (isinstance(answer, dict) and answer.get("type") == "Scheduler"):
                raise ValueError(f"it answers as {answer.get('type') if isinstance(answer, dict) else answer!r}")
        return Client(scheduler)
    except TimeoutError:
        raise CaseError(f"--scheduler: no Dask scheduler answered at {scheduler!r} within {seconds:g} s (is it a Dask "
                        "scheduler's address?)") from None
    except Exception as error:  # noqa: BLE001 - whatever connecting raises, the address is the cause
        raise CaseError(f"--scheduler: cannot reach a Dask scheduler at {scheduler!r}: {type(error).__name__}: "
                        f"{error}") from None


def _check_address(scheduler: str) -> None:
    """A CaseError for a tcp:// or tls:// address without a host or a port, or with a port that no TCP server can have
    (connecting would retry it for the whole connect timeout), and for a protocol that reaches no scheduler from here:
    one Dask does not have, ucx:// without distributed-ucxx (Client raised "TypeError: Can't instantiate abstract class
    UCXConnector"), inproc:// of another process (Client said "ValueError: not enough values to unpack", or that the
    address "does not match host or pid")."""
    from importlib.util import find_spec

    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:
        protocol, location = parse_address(scheduler)
        host, port = parse_host_port(location) if protocol in ("tcp", "tls") else ("", 1)
        if protocol in ("tcp", "tls") and not host:  # connecting to no host retried for the whole connect timeout
            raise ValueError("no host")
    except ValueError as error:
        raise CaseError(f"--scheduler {scheduler!r} is not an address of the form tcp://HOST:PORT ({error})") from None
    if not 0 < port < 2 ** 16:
        raise CaseError(f"--scheduler {scheduler!r}: port {port} is not a TCP port (1 to 65535)")
    why = None
    if protocol == "inproc" and location.split("/")[1:2] != [str(os.getpid())]:
        # a Python session's LocalCluster(processes=False) has such an address, which its own run_sweep may use
        why = "an inproc:// address reaches a scheduler in its own process only"
    elif protocol == "ucx" and find_spec("distributed_ucxx") is None:  # Dask's own ucx:// was removed for it
        why = "ucx:// needs the distributed-ucxx package, which is not installed"
    else:
        try:
            get_backend(protocol)
        except ValueError:
            why = f"Dask has no {protocol}:// protocol"
    if why:
        raise CaseError(f"--scheduler {scheduler!r}: {why}; give the scheduler's address as tcp://HOST:PORT or "
                        "HOST:PORT")


def _running_loop() -> bool:
    """Whether this thread runs an asyncio event loop."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def default_workers(members: int) -> int:
    """One worker per GPU where there are GPUs, else one per core; never more than members."""
    import torch

    slots = torch.cuda.device_count() if torch.cuda.is_available() else (os.cpu_count() or 1)
    return max(1, min(members, slots))


def run_sweep(case: Case, params: Iterable[str], folder: str, seeds: int | None = None, scheduler: str | None = None,
              workers: int | None = None, overwrite: bool = False, resume: bool = False,
              command: str | None = None, progress: bool | None = None) -> str:
    """Run every member (see the module docstring), write DIR/sweep.nc; returns its path.  `params`: the
    "section.key=v1,v2,..." of each swept key, as `--param` takes them (one string: one key).  `command`: the words
    that made the sweep, for the files' CF history (default: the params and seeds; the command line gives all of its
    own).
    `progress`: the members done as a bar or log lines (spherepde.base.progress.Progress; None chooses by the
    stream, False keeps only a line per member).

    Members that fail are reported at the end, after sweep.nc is written from the others:
    CaseError (exit 2) if one had bad input, else NumericalFailure (exit 3).
    """
    # read twice, by plan and by the history: a generator gave its members and left the history without them, and a
    # string was read as one key per character
    params = [params] if isinstance(params, str) else list(params)
    check_folder(folder, "sweep -o")
    if scheduler is not None and not scheduler.strip():
        raise CaseError("--scheduler: an empty address (leave it out for a local cluster)")
    if scheduler is not None:
        _check_address(scheduler)
    case = case.checked()  # sweep.nc stores it: with its edits in place applied, as every member's
    members = plan(case, params, folder, seeds)
    check_members_run(members, local=scheduler is None)
    combined = os.path.join(folder, COMBINED)
    existing = [path for path in [m.path for m in members] + [combined] if os.path.exists(path)]
    if existing and not (overwrite or resume):
        raise CaseError(f"sweep folder {folder!r} holds an earlier sweep ({os.path.basename(existing[0])}); pass "
                        "--resume to keep its completed members or --overwrite to run them all again")
    if resume and not existing:  # as `run --resume` without a checkpoint: a mistyped -o would run every member
        raise CaseError(f"--resume: {folder!r} holds no member file of this sweep nor its {COMBINED} to resume from; "
                        "run the sweep without --resume")
    if overwrite:  # an earlier sweep's files would stay beside this one's, read as its own (a member that now fails)
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            path = os.path.join(folder, name)
            if (MEMBER_FILE.fullmatch(name) or name == COMBINED) and os.path.isfile(path):
                os.remove(path)
    summaries = {}
    if resume:
        _refuse_other_runs(members, folder)
        summaries = {m.index: s for m in members if (s := _completed(m)) is not None}
        if summaries:
            print(f"spherepde: keeping {len(summaries)} completed members of {len(members)}", file=sys.stderr)
        ours = {os.path.basename(m.path) for m in members}
        others = sorted(name for name in (os.listdir(folder) if os.path.isdir(folder) else ())
                        if MEMBER_FILE.fullmatch(name) and name not in ours)
        if others:  # an earlier sweep of more members (other --param lists): not this sweep's, left as they are
            print(f"spherepde: note: {', '.join(others)} in {folder!r} are of an earlier sweep, not members of this "
                  "one (sweep.nc leaves them out; --overwrite removes them)", file=sys.stderr)
    pending = [m for m in members if m.index not in summaries]
    try:
        if pending:
            # a remote cluster's batches are shared by its own workers, counted once connected, not by this machine's
            count = workers or (None if scheduler else default_workers(len(pending)))
            threads = None if scheduler else max(1, (os.cpu_count() or 1) // count)
            from distributed import as_completed

            # a bar of the members done on a terminal, else a line every 30 s: a member can run for minutes
            bar = Progress(float(len(pending)), enabled=progress, quantity="members")
            with _cluster(scheduler, count) as client:
                connected = len(client.nthreads()) if scheduler else count  # a LocalCluster's started with it
                if scheduler and not connected:  # else its progress lines alone said "0/N, time left unknown"
                    print(f"spherepde: note: no worker is connected to the scheduler at {scheduler}: the members "
                          f"wait for one (dask worker {scheduler}; --workers N sizes the batches for N workers)",
                          file=sys.stderr)
                groups = _groups(pending, count or max(1, connected), local=scheduler is None)
                with bar.running(), _telling_workers_lost(client, bar, scheduler, told=not connected):
                    futures = [client.submit(run_batch, [m.index for m in group], [m.case.text for m in group],
                                             [m.path for m in group], threads, pure=False) for group in groups]
                    group_of = {future.key: group for future, group in zip(futures, groups)}
                    done = 0
                    for future in as_completed(futures, loop=client.loop):  # this client's loop, not dask's default's
                        for summary in _batch_summaries(future, group_of[future.key]):
                            done += 1
                            summaries[summary["member"]] = summary
                            bar.write(f"spherepde: {_progress_line(members[summary['member']], summary)} "
                                      f"[{done}/{len(pending)}]")
                            bar.update(float(done))
    except KeyboardInterrupt:
        # --resume refuses a folder that holds nothing of this sweep (run_sweep above): name it only where it has
        # something to keep
        if any(os.path.isfile(path) for path in [m.path for m in members] + [combined]):
            print(f"spherepde: the members completed are kept in {folder}; the same command with --resume runs the "
                  "others", file=sys.stderr)
        else:
            print(f"spherepde: no member completed, and {folder} holds nothing to resume: run the same command again "
                  "without --resume", file=sys.stderr)
        raise
    alike = identical_results(members, summaries)
    for note in alike:
        print(f"spherepde: note: {note}", file=sys.stderr)
    # as `run`'s output (docs/guide/long-runs.md): an interrupt that comes as sweep.nc is written waits for it, and the
    # sweep then ends as it would have (exit 3 where a member failed), its file complete; raised after the write, it
    # ended the command "interrupted", asking for a --resume that had nothing left to run
    with interrupts.held(absorbed=True) as late:
        combine(case, members, summaries, combined, params, seeds, command, alike)
    if late:
        print(f"spherepde: {signal.Signals(late[0]).name} came as {COMBINED} was written; it is complete",
              file=sys.stderr)
    _raise_failures(members, summaries)
    return combined


@contextlib.contextmanager
def _telling_workers_lost(client, bar: Progress, scheduler: str | None, told: bool):
    """Inside, a thread asks the scheduler for its workers every WORKERS_POLL_SECONDS and where none has been left
    for WORKERLESS_SECONDS (all killed: the scheduler keeps their batches until a worker connects), says so once,
    again only after a worker came back and left; `told`: the sweep said already that none was connected.  Without
    it, a sweep whose workers were all killed waited for ever saying only "members=0/2 (0%), ..., time left
    unknown" every 30 s."""
    where = f"the scheduler at {scheduler}: the members wait for one (dask worker {scheduler})" if scheduler else (
        "the local cluster: the members wait for one")
    note = (f"spherepde: note: no worker is left on {where}; or interrupt the sweep, and the same command with "
            "--resume keeps the members done")
    stop = threading.Event()

    def watch(told: bool) -> None:
        since = None  # when the scheduler was first seen without a worker
        while not stop.wait(WORKERS_POLL_SECONDS):
            try:
                workers = client.nthreads()
            except Exception:  # noqa: BLE001 - a scheduler that is gone: the sweep's futures report it
                continue
            if workers:
                told, since = False, None
                continue
            since = time.monotonic() if since is None else since
            if not told and time.monotonic() - since >= WORKERLESS_SECONDS and not stop.is_set():
                bar.write(note)
                told = True

    thread = threading.Thread(target=watch, args=(told,), daemon=True, name="spherepde-workers")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        # no longer than a poll: one asked of a scheduler that is gone waits for Dask's connect timeout (30 s)
        thread.join(timeout=WORKERS_POLL_SECONDS)


def _groups(pending: list[Member], count: int, local: bool) -> list[list[Member]]:
    """The batches of the `pending` members for `count` workers: members that share a grid and the shapes of their
    state (spherepde.api.ensemble.batches), at most ceil(members / count) in each so that every worker has work, and
    (`local`: a remote cluster's workers have their own memory) few enough that `count` batches running at once fit
    this machine's memory: a batch holds every member's state at once."""
    from spherepde.api.ensemble import batches

    largest = -(-len(pending) // count)
    fitting = largest_batch([m.case for m in pending], count) if local else None
    if fitting is not None and fitting < largest:
        largest = fitting
        print(f"spherepde: note: batches of at most {fitting} members, so that {count} running at once fit the "
              f"memory available", file=sys.stderr)
    return [[pending[i] for i in group] for group in batches([m.case for m in pending], largest=largest)]


def combine(case: Case, members: list[Member], summaries: dict, target: str, params: list[str],
            seeds: int | None, command: str | None = None, notes: tuple = ()) -> None:
    """Write the members' files of a sweep of `case` as one Dataset along `member` (xr.open_mfdataset), atomically,
    with the sweep's own `notes` before the members'.  Every member has its place on `member`, those without a file
    (bad input found as it started, a worker that died) too: their swept values, case and status, NaN results."""
    import dask
    import xarray as xr

    from spherepde.io.output import finish, history, write_dataset

    present = [m for m in members if summaries[m.index]["path"] is not None]
    if not present:
        return
    shared, attrs_of, same_grid = _read_members([m.path for m in present])
    notes_of = [str(attrs.get("notes", "")) for attrs in attrs_of]

    def preprocess(dataset):
        dataset = dataset.drop_vars("cell_area", errors="ignore")
        return dataset if same_grid else dataset.drop_dims([dim for dim in GRID_DIMS if dim in dataset.dims])

    # coords="minimal": a member file's coordinates are all dimension coordinates, aligned by the outer join; with
    # "different", xarray refused one that some members lack (`particle` where particles.save = 0, `adjoint_time`
    # without control.save_adjoint) once two members before hold it alike
    with xr.open_mfdataset([m.path for m in present], combine="nested", concat_dim="member", preprocess=preprocess,
                           data_vars="all", coords="minimal", compat="no_conflicts", join="outer",
                           combine_attrs="drop_conflicts") as data:
        data.attrs = shared  # an attribute of some members only (a mixed-solver sweep's scheme) is not the sweep's
        data = data.assign_coords(member=("member", [m.index for m in present], {"long_name": "sweep member index"}))
        # a member without a file stays in the sweep, its results NaN: left out, its bad input or lost worker was
        # told by the exit status alone, and a selection by its parameters met a combination that was never asked
        data = data.reindex(member=[m.index for m in members])
        data["member"].attrs["long_name"] = "sweep member index"
        swept = []
        for key in members[0].values:
            swept.append(key.replace(".", "_"))
            data = data.assign_coords({swept[-1]: _member_coordinate(
                key, [m.values[key] for m in members], [_resolved(m.case, key) for m in members])})
        if seeds:
            data = data.assign_coords(seed=("member", [m.seed for m in members], {"long_name": "particles.seed"}))
            swept.append("seed")
        # the member coordinates that by_parameters unstacks into one dimension each
        data.attrs["swept"] = " ".join(swept)
        data["member_status"] = ("member", [_own_status(summaries[m.index]) for m in members],
                                 {"long_name": "status of the member's run"})
        data["member_case"] = ("member", [m.case.text for m in members],
                               {"long_name": "resolved case of the member (TOML)"})
        attrs_of_member = dict(zip([m.index for m in present], attrs_of))
        data = data.assign(member_attributes([attrs_of_member.get(m.index, {}) for m in members], shared))
        if any("resolved_until" in attrs for attrs in attrs_of):  # a grid's resolution: not a particle run's
            lost = [_resolved_until(summaries[m.index]) for m in present]
            lost_of = dict(zip([m.index for m in present], lost))
            data["member_resolved_until"] = ("member", np.array([lost_of.get(m.index, math.nan) for m in members]), {
                "long_name": "the member's last resolved save, after which its results are under-resolved (inf: "
                             "resolved to the end; NaN: no results)",
                "units": "1"})
            # the sweep is resolved until its earliest member's loss (a member's own is in member_resolved_until)
            data.attrs["resolved_until"] = "end" if all(map(math.isinf, lost)) else float(min(lost))
        notes = list(notes) + ([] if same_grid else ["the members' grids differ: densities are in the member files "
                                                     "only"])
        for member, text in zip(present, notes_of):
            notes += [f"member {member.index}: {line}" for line in text.splitlines() if line]
        data.attrs["notes"] = "\n".join(notes)
        if same_grid:
            with xr.open_dataset(present[0].path) as first:
                if "cell_area" in first:
                    data["cell_area"] = first["cell_area"].load()
        finish(data, case, {"solver": data.attrs.get("solver", "mixed")})
        data.attrs["title"] = f"spherepde sweep of case '{case.name}' ({len(members)} members)"
        failed = [m for m in members if summaries[m.index]["status"] != "completed"]  # the members' attrs differ
        data.attrs["status"] = (f"failed: {len(failed)} of {len(members)} sweep members (member_status)" if failed
                                else "completed")
        data.attrs["history"] = history(command or f"sweep {' '.join(params)}" + (f" --seeds {seeds}" if seeds else ""))
        # One thread reads the members and writes the file: netCDF-C is not thread-safe, and with xarray 2024.1 and
        # netCDF4 1.7.3 (which releases the GIL) dask's threaded scheduler deadlocked here in 3 of 10 test runs
        # (xarray's lock serialises the reads and the writes anyway)
        with dask.config.set(scheduler="synchronous"):
            write_dataset(data, target)


def by_parameters(dataset):
    """A combined sweep with one dimension per swept key (and `seed`) instead of `member`, so that it is
    selected by its parameters: ``by_parameters(xr.open_dataset("DIR/sweep.nc")).sel(model_eps=0.1)``.

    The file keeps the flat `member` dimension (NetCDF stores no multi-index, and a sweep whose members
    failed or differ in their grids is no full grid); combinations without a member are NaN here.
    """
    names = dataset.attrs.get("swept", "").split()
    if "member" not in dataset.dims or not names:
        raise CaseError("by_parameters: not a combined sweep file (no 'member' dimension and 'swept' attribute)")
    if len(names) == 1:  # one index, not a multi-index: the member axis becomes the key's own
        return dataset.swap_dims(member=names[0]).drop_vars("member", errors="ignore")
    return dataset.set_index(member=names).unstack("member")


def _equal(a, b) -> bool:
    """Attribute values equal (NaN equal to NaN, as xarray's drop_conflicts has them)."""
    a, b = np.asarray(a), np.asarray(b)
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == b.dtype.kind == "f"))


def _read_members(paths: list[str]) -> tuple[dict, list[dict], bool]:
    """One pass over the member files: the global attributes every one has with the same value, each one's
    attributes, and whether all have the same grid coordinates (theta, or lat and lon)."""
    import xarray as xr

    shared, attrs_of, grids = None, [], []
    for path in paths:
        with xr.open_dataset(path) as dataset:
            attrs = dict(dataset.attrs)
            grids.append({dim: dataset[dim].values for dim in GRID_DIMS if dim in dataset.coords})
        attrs_of.append(attrs)
        shared = attrs if shared is None else {key: value for key, value in shared.items()
                                               if key in attrs and _equal(attrs[key], value)}
    same_grid = all(grid.keys() == grids[0].keys() and all(np.array_equal(grid[k], grids[0][k]) for k in grid)
                    for grid in grids)
    return shared or {}, attrs_of, same_grid


# Member attributes that sweep.nc holds otherwise: member_case, member_status, member_resolved_until, its notes and
# its own history.
COMBINED_ELSEWHERE = ("case", "status", "resolved_until", "notes", "history")
MEMBER_PREFIX = "member_"  # of the variables of member_attributes (and of member_case, ...)


def member_attributes(attrs_of: list[dict], shared: dict) -> dict:
    """`member_<name>` (member) for each scalar attribute that the member files do not share (a training's iterations,
    optimizer_stop, escape_rate, three_phase; wall_seconds; a seeded sweep's seed): integers that every member has
    as 64-bit integers (a seed of up to 2**63 is no float), other numbers as floats (NaN where a member lacks it),
    else text ("" where it does)."""
    names = sorted({name for attrs in attrs_of for name in attrs} - set(shared) - set(COMBINED_ELSEWHERE))
    variables = {}
    for name in names:
        values = [attrs.get(name) for attrs in attrs_of]
        present = [value for value in values if value is not None]
        if not all(np.ndim(value) == 0 for value in present):
            continue  # an attribute array (grid_shape) that differs: the members' grids, told by their own files
        numeric = all(isinstance(value, numbers.Real) and not isinstance(value, bool) for value in present)
        attrs = {"long_name": f"the {name} attribute of each member's file"}
        if numeric:  # every number of a run is nondimensional but its times in seconds (wall_seconds, ...)
            integral = len(present) == len(values) and all(isinstance(value, numbers.Integral) for value in present)
            column = (np.array(values, dtype=np.int64) if integral
                      else [math.nan if value is None else float(value) for value in values])
            attrs["units"] = "s" if name.endswith("seconds") else "1"
        else:
            column = ["" if value is None else str(value) for value in values]
        variables[MEMBER_PREFIX + name] = ("member", column, attrs)
    return variables


def _member_coordinate(key: str, values: list, resolved: list) -> tuple:
    """A member coordinate of swept `values`, each member's `resolved` value of the key giving its type: integers as
    integers where the key's are (sphere.lmax, control.iterations), other numbers as floats (model.beta = 1, 2 of a
    real key, and "inf", the zero-temperature limit, as the float inf), booleans as booleans, strings as themselves,
    anything else (a matrix, a list, a table) as its TOML text."""
    # as its text, "inf" beside finite betas made the coordinate text ('50', '"inf"'), which .sel(model_beta=50)
    # and a plot against beta could not read; so did a string's quotes (.sel(initial_kind="vmf") met '"vmf"'), and
    # a real key swept as 1, 2 was an integer coordinate beside another sweep's 1.5, 2
    values = [math.inf if key == "model.beta" and v == "inf" else v for v in values]
    attrs = {"long_name": f"swept case key {key}"}
    if all(isinstance(v, bool) for v in values) or all(isinstance(v, str) for v in values):
        return ("member", values, attrs)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        integral = all(isinstance(v, int) and isinstance(r, int) and not isinstance(r, bool)
                       for v, r in zip(values, resolved))
        # every number of a case is nondimensional
        return ("member", [(int if integral else float)(v) for v in values], {**attrs, "units": "1"})
    return ("member", [v if isinstance(v, str) else format_override(key, v).partition("=")[2] for v in values], attrs)


def _resolved(case: Case, key: str):
    """The value of "section.key" in a resolved case (None where it holds none)."""
    value = case.data
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _raise_failures(members: list[Member], summaries: dict) -> None:
    failed = [summaries[m.index] for m in members if summaries[m.index]["exit_status"]]
    if not failed:
        return
    bad_input = [s for s in failed if s["exit_status"] == 2]  # exit 2 wins: the message names such a member
    first = (bad_input or failed)[0]
    message = (f"{len(failed)} of {len(members)} sweep members failed; member {first['member']} "
               f"({members[first['member']].label()}): {_own_status(first)}")
    raise CaseError(message) if bad_input else NumericalFailure(message)
