"""Integrity (issue 26): a checkpoint resumes only what it wrote (the corruption harness), one writer per output,
failed runs are first-class files, limits are checked before any work, and text from files is shown escaped."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import xarray as xr
from test_cli import SMALL_S1
from test_resume import CASE, assert_same_result, interrupt
from test_training import CASE as TRAINING_CASE

import spherepde
from solvers.checkpoint import Checkpoint, checkpoint_folder
from spherepde.analysis import plotting
from spherepde.cli import main
from spherepde.io.locking import OutputLock
from spherepde.io.output import write_dataset

TRAINING = TRAINING_CASE + 'optimizer = "adam"\n'


def run_cli(args, capsys):
    status = main([str(a) for a in args])
    captured = capsys.readouterr()
    return status, captured.err, captured.out


# --- the corruption harness (criterion 1) ----------------------------------------------------------------------


def stopped_run(folder, text, every_steps, checkpoints):
    """`text` as folder/case.toml, run to folder/out.nc with a checkpoint every `every_steps` steps (a training:
    evaluations) and stopped at its `checkpoints`-th checkpoint: (case path, output path)."""
    folder.mkdir(parents=True, exist_ok=True)
    case = folder / "case.toml"
    case.write_text(text)
    output = folder / "out.nc"
    interrupt(case, output, checkpoints, every_steps)
    return case, output


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """Checkpoints as runs leave them: an Eulerian run stopped with 4 segments (saves t = 0 .. 1), another case's,
    and a training stopped after 3 evaluations (one segment each)."""
    root = tmp_path_factory.mktemp("pristine")
    runs = {"eulerian": stopped_run(root / "eulerian", CASE, 30, 4),
            "other": stopped_run(root / "other", CASE.replace("eps = 0.1", "eps = 0.2"), 30, 4),
            "training": stopped_run(root / "training", TRAINING, 1, 3),
            "other training": stopped_run(root / "other training", TRAINING.replace("layers = 2", "layers = 2\n"
                                                                                     "lambda_reg = 0.02"), 1, 3)}
    for _, output in runs.values():
        assert len(Checkpoint(output).read_state()["segments"]) >= 3
    return runs


def copy_of(pristine, kind, folder):
    """A copy of a pristine checkpoint and its case in `folder`: (case, output, checkpoint folder, resolved case,
    its state and segments as `Checkpoint.load` returns them)."""
    case, output = pristine[kind]
    shutil.copy(case, folder / "case.toml")
    shutil.copytree(checkpoint_folder(output), checkpoint_folder(folder / "out.nc"))
    resolved = spherepde.load_case(folder / "case.toml")
    state, segments = Checkpoint(folder / "out.nc", resume=True).load(resolved)
    return folder / "case.toml", folder / "out.nc", checkpoint_folder(folder / "out.nc"), resolved, state, segments


def forge(output, state: dict, segments: list) -> None:
    """Write `state` and `segments` as the checkpoint of `output` through Checkpoint.write: a checkpoint whose
    manifest and digests are all consistent, as a forger, a bug or another program would leave it."""
    checkpoint = Checkpoint(output)
    checkpoint.remove()
    state = {key: value for key, value in state.items() if key not in ("format", "segments", "saves")}
    if not segments:
        checkpoint.write(state, None, state["steps"])
    for segment in segments:
        checkpoint.write(state, segment, state["steps"])


def segment_file(folder, index: int) -> str:
    return sorted(name for name in os.listdir(folder) if name.startswith("segment-"))[index]


def state_file(folder) -> str:
    return next(name for name in os.listdir(folder) if name.startswith("state-"))


def flip_byte(path, where: float = 0.5) -> None:
    data = bytearray(open(path, "rb").read())
    data[int(len(data) * where)] ^= 0x01
    open(path, "wb").write(bytes(data))


def truncate(path, keep: float = 0.5) -> None:
    data = open(path, "rb").read()
    open(path, "wb").write(data[:int(len(data) * keep)])


def rewritten(path, change) -> None:
    """The NetCDF file at `path` read, changed by change(dataset) and written back (as an editor would)."""
    with xr.open_dataset(path) as stored:
        dataset = stored.load()
    change(dataset)
    dataset.to_netcdf(path)


def edited_state(path, change) -> None:
    """The state file at `path` loaded, changed by change(state) and saved back."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


def scaled(dataset, name, factor):
    dataset[name] = dataset[name] * factor


def shifted_time(segment, dt):
    return segment.assign_coords(time=segment["time"] + dt)


# Each corruption: (kind of checkpoint, what it does to a copy in the test's folder: returns the file the refusal
# must name).  Files edited, swapped, truncated, deleted or replaced are caught by the manifest's digests; the
# "forged" ones are written consistently through Checkpoint.write and caught by the layout checks.
def _segment_flip(c):
    flip_byte(os.path.join(c.folder, segment_file(c.folder, 1)))
    return segment_file(c.folder, 1)


def _segment_density_edited(c):
    rewritten(os.path.join(c.folder, segment_file(c.folder, 1)), lambda d: scaled(d, "density", 1 + 1e-9))
    return segment_file(c.folder, 1)


def _segment_order_parameter_edited(c):
    rewritten(os.path.join(c.folder, segment_file(c.folder, 2)), lambda d: scaled(d, "order_parameter", 0.5))
    return segment_file(c.folder, 2)


def _segment_truncated(c):
    truncate(os.path.join(c.folder, segment_file(c.folder, 0)))
    return segment_file(c.folder, 0)


def _segment_deleted(c):
    name = segment_file(c.folder, 3)
    os.remove(os.path.join(c.folder, name))
    return name


def _segments_swapped(c):
    first, second = (os.path.join(c.folder, segment_file(c.folder, i)) for i in (1, 2))
    os.replace(first, first + ".swap")
    os.replace(second, first)
    os.replace(first + ".swap", second)
    return segment_file(c.folder, 1)


def _segment_of_another_case(c):
    other = checkpoint_folder(c.pristine["other"][1])
    shutil.copy(os.path.join(other, segment_file(other, 1)), os.path.join(c.folder, segment_file(c.folder, 1)))
    return segment_file(c.folder, 1)


def _segment_replaced_by_a_folder(c):
    path = os.path.join(c.folder, segment_file(c.folder, 1))
    os.remove(path)
    os.mkdir(path)
    return os.path.basename(path)


def _state_flip(c):
    flip_byte(os.path.join(c.folder, state_file(c.folder)), 0.7)
    return state_file(c.folder)


def _state_truncated(c):
    truncate(os.path.join(c.folder, state_file(c.folder)), 0.3)
    return state_file(c.folder)


def _state_interval_edited(c):
    edited_state(os.path.join(c.folder, state_file(c.folder)), lambda s: s.update(interval=s["interval"] - 1))
    return state_file(c.folder)


def _state_dt_edited(c):
    edited_state(os.path.join(c.folder, state_file(c.folder)), lambda s: s.update(dt=s["dt"] * 2))
    return state_file(c.folder)


def _state_coefficient_edited(c):
    def change(state):
        state["c"][3] += 1e-6
    edited_state(os.path.join(c.folder, state_file(c.folder)), change)
    return state_file(c.folder)


def _state_of_another_case(c):
    other = checkpoint_folder(c.pristine["other"][1])
    shutil.copy(os.path.join(other, state_file(other)), os.path.join(c.folder, state_file(c.folder)))
    return state_file(c.folder)


def _manifest_truncated(c):
    truncate(os.path.join(c.folder, "manifest.json"), 0.6)
    return "manifest.json"


def _manifest_digest_edited(c):
    path = os.path.join(c.folder, "manifest.json")
    text = open(path).read()
    digest = re.findall(r'"sha256": "([0-9a-f]{64})"', text)[1]  # the first segment's
    open(path, "w").write(text.replace(digest, digest[::-1]))
    return "manifest.json"


def _manifest_deleted(c):
    os.remove(os.path.join(c.folder, "manifest.json"))
    return "manifest.json"


def _manifest_of_another_case(c):
    other = checkpoint_folder(c.pristine["other"][1])
    shutil.copy(os.path.join(other, "manifest.json"), os.path.join(c.folder, "manifest.json"))
    return state_file(c.folder)  # it names files this folder does not have, or has with other bytes


def _forged_no_segment(c):
    forge(c.output, c.state, [])
    return "manifest.json"


def _forged_state_of_wrong_shape(c):
    forge(c.output, dict(c.state, c=c.state["c"][:-1]), c.segments)
    return state_file(c.folder)


def _forged_state_time_off_its_step(c):
    forge(c.output, dict(c.state, t=c.state["t"] + 0.003), c.segments)
    return state_file(c.folder)


def _forged_segments_out_of_order(c):
    forge(c.output, c.state, [c.segments[0], c.segments[2], c.segments[1], c.segments[3]])
    return segment_file(c.folder, 1)


def _forged_segment_dropped(c):
    forge(c.output, c.state, c.segments[:2] + c.segments[3:])
    return segment_file(c.folder, 2)


def _forged_times_shifted(c):
    forge(c.output, c.state, c.segments[:2] + [shifted_time(c.segments[2], 0.01), c.segments[3]])
    return segment_file(c.folder, 2)


def _forged_segment_of_another_case(c):
    other = Checkpoint(c.pristine["other"][1], resume=True).load(spherepde.load_case(c.pristine["other"][0]))[1]
    forge(c.output, c.state, c.segments[:1] + other[1:2] + c.segments[2:])
    return segment_file(c.folder, 1)


def _legacy_state(c):
    Checkpoint(c.output).remove()
    os.makedirs(c.folder, exist_ok=True)
    torch.save(dict(c.state, format=1), os.path.join(c.folder, "state.pt"))
    return "state.pt"


def _journal_entry_edited(c):
    rewritten(os.path.join(c.folder, segment_file(c.folder, 1)), lambda d: scaled(d, "cost", 1 + 1e-12))
    return segment_file(c.folder, 1)


def _journal_segments_swapped(c):
    return _segments_swapped(c)


def _journal_segment_truncated(c):
    truncate(os.path.join(c.folder, segment_file(c.folder, 2)), 0.9)
    return segment_file(c.folder, 2)


def _journal_of_another_training(c):
    other = checkpoint_folder(c.pristine["other training"][1])
    for i in range(3):
        shutil.copy(os.path.join(other, segment_file(other, i)), os.path.join(c.folder, segment_file(c.folder, i)))
    return segment_file(c.folder, 0)


def _forged_journal_entry_edited(c):
    segment = c.segments[1].copy(deep=True)
    segment["loss"] = segment["loss"] * 0.5
    forge(c.output, c.state, [c.segments[0], segment, c.segments[2]])
    return segment_file(c.folder, 1)


def _forged_journal_reordered(c):
    forge(c.output, c.state, [c.segments[1], c.segments[0], c.segments[2]])
    return segment_file(c.folder, 0)


def _forged_journal_entry_dropped(c):
    forge(c.output, dict(c.state, steps=2), [c.segments[0], c.segments[2]])
    return segment_file(c.folder, 1)


def _forged_journal_entry_repeated(c):
    forge(c.output, dict(c.state, steps=4), [c.segments[0], c.segments[1], c.segments[1], c.segments[2]])
    return segment_file(c.folder, 2)


def _forged_journal_renumbered(c):
    segments = [segment.assign(index=segment["index"] + 1) for segment in c.segments]
    forge(c.output, c.state, segments)
    return segment_file(c.folder, 0)


def _forged_journal_controls_of_wrong_shape(c):
    segment = c.segments[0].isel(layer=[0])
    forge(c.output, c.state, [segment] + c.segments[1:])
    return segment_file(c.folder, 0)


def _forged_journal_of_another_training(c):
    other = Checkpoint(c.pristine["other training"][1], resume=True).load(
        spherepde.load_case(c.pristine["other training"][0]))[1]
    forge(c.output, c.state, other)  # the state (and its case) this training's, the entries the other's
    return segment_file(c.folder, 0)


def _forged_journal_holding_saves(c):
    eulerian = Checkpoint(c.pristine["eulerian"][1], resume=True).load(spherepde.load_case(c.pristine["eulerian"][0]))
    forge(c.output, c.state, eulerian[1][:1] + c.segments[1:])
    return segment_file(c.folder, 0)


def _forged_journal_count_wrong(c):
    forge(c.output, dict(c.state, steps=5), c.segments)
    return state_file(c.folder)


CORRUPTIONS = {name.removeprefix("_"): (kind, function) for name, kind, function in [
    *[(f.__name__, "eulerian", f) for f in (
        _segment_flip, _segment_density_edited, _segment_order_parameter_edited, _segment_truncated,
        _segment_deleted, _segments_swapped, _segment_of_another_case, _segment_replaced_by_a_folder,
        _state_flip, _state_truncated, _state_interval_edited, _state_dt_edited, _state_coefficient_edited,
        _state_of_another_case, _manifest_truncated, _manifest_digest_edited, _manifest_deleted,
        _manifest_of_another_case, _forged_no_segment, _forged_state_of_wrong_shape,
        _forged_state_time_off_its_step, _forged_segments_out_of_order, _forged_segment_dropped,
        _forged_times_shifted, _forged_segment_of_another_case, _legacy_state)],
    *[(f.__name__, "training", f) for f in (
        _journal_entry_edited, _journal_segments_swapped, _journal_segment_truncated, _journal_of_another_training,
        _forged_journal_entry_edited, _forged_journal_reordered, _forged_journal_entry_dropped,
        _forged_journal_entry_repeated, _forged_journal_renumbered, _forged_journal_controls_of_wrong_shape,
        _forged_journal_of_another_training, _forged_journal_holding_saves, _forged_journal_count_wrong)],
]}


class _Copy:
    def __init__(self, pristine, kind, folder):
        self.pristine = pristine
        self.case, self.output, self.folder, self.resolved, self.state, self.segments = copy_of(pristine, kind, folder)


def test_the_harness_has_at_least_20_distinct_corruptions():
    assert len(CORRUPTIONS) >= 20
    assert len({function for _, function in CORRUPTIONS.values()}) == len(CORRUPTIONS)


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupted_checkpoint_is_refused_with_one_line_naming_the_file(pristine, tmp_path, capsys, corruption):
    """Every corruption: --resume exits 2 before the run starts, with one line naming the corrupted file and how
    to start over, and writes no output; a plain run refuses to replace the checkpoint silently."""
    kind, corrupt = CORRUPTIONS[corruption]
    copy = _Copy(pristine, kind, tmp_path)
    named = corrupt(copy)
    status, err, _ = run_cli(["run", copy.case, "-o", copy.output, "--quiet", "--resume"], capsys)
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert named in err and "--overwrite" in err, err
    assert not copy.output.exists()
    status, err, _ = run_cli(["run", copy.case, "-o", copy.output, "--quiet"], capsys)
    assert status == 2 and "--overwrite" in err and not copy.output.exists(), err


@pytest.mark.parametrize("kind", ["eulerian", "training"])
def test_an_intact_copy_of_the_pristine_checkpoint_resumes(pristine, tmp_path, capsys, kind):
    """The control of the harness: the same copy, uncorrupted, resumes to exit 0 from where it stopped."""
    copy = _Copy(pristine, kind, tmp_path)
    status, err, _ = run_cli(["run", copy.case, "-o", copy.output, "--quiet", "--resume"], capsys)
    assert status == 0 and "resuming" in err, err
    assert copy.output.exists() and not os.path.exists(copy.folder)


def test_a_checkpoint_killed_between_its_files_resumes_from_the_previous_commit(tmp_path, capsys):
    """A kill after the new segment and state are written but before the manifest that commits them leaves the
    previous checkpoint whole: the resume uses it and ends as an uninterrupted run."""
    case = tmp_path / "case.toml"
    case.write_text(CASE)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    interrupt(case, output, checkpoints=2)
    committed = Checkpoint(output).read_state()["steps"]
    checkpoint = Checkpoint(output, resume=True)
    state, _ = checkpoint.load(spherepde.load_case(case))
    original = os.replace

    def killed_before_the_manifest(source, target):
        if target.endswith("manifest.json"):
            raise KeyboardInterrupt  # as SIGKILL would, after the state file's rename
        original(source, target)

    os.replace = killed_before_the_manifest
    try:
        with pytest.raises(KeyboardInterrupt):
            checkpoint.write(dict(state, steps=state["steps"] + 1), None, state["steps"] + 1)
    finally:
        os.replace = original
    assert Checkpoint(output).read_state()["steps"] == committed
    status, err, _ = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 0 and f"step {committed}" in err, err
    assert_same_result(output, reference)


def test_a_resume_removes_what_killed_writers_left_in_the_checkpoint_and_nothing_else(tmp_path):
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    output = tmp_path / "out.nc"
    interrupt(case, output, checkpoints=3)
    folder = checkpoint_folder(output)
    left = ["segment-00007.nc.ab_12xyz.tmp", "segment-00007.nc.lock", f"state-00009.pt.{'a' * 32}.tmp",
            f"manifest.json.{'0' * 32}.tmp", "state-00009.pt", "segment-00007.nc"]
    for name in left + ["notes.txt", "segment-00007.nc.backup"]:
        (tmp_path / "out.nc.checkpoint" / name).write_bytes(b"")
    before = set(os.listdir(folder))
    Checkpoint(output, resume=True).load(spherepde.load_case(case))
    assert set(os.listdir(folder)) == before - set(left)
    assert {"notes.txt", "segment-00007.nc.backup", "manifest.json"} <= before - set(left)


# --- one writer per output (criterion 2) -------------------------------------------------------------------------


def spherepde_process(*args):
    return subprocess.Popen([sys.executable, "-m", "spherepde", *map(str, args)], stderr=subprocess.PIPE, text=True)


def test_a_second_run_on_one_output_exits_2_within_a_second_and_a_killed_one_resumes(tmp_path, capsys):
    """While one run writes out.nc, a second on the same -o exits 2 within a second naming the first's pid; after
    SIGKILL of the first (its lock released by the kernel, its lock file and a temporary file of a final write
    left behind) --resume takes the lock, ends as an uninterrupted run and leaves no temporary or lock file."""
    case = tmp_path / "case.toml"
    case.write_text(CASE)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    first = spherepde_process("run", case, "-o", output, "--quiet", "--checkpoint-steps", "1")
    deadline = time.monotonic() + 120
    while first.poll() is None and not Checkpoint(output).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.poll() is None, first.stderr.read()

    start = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "spherepde", "run", str(case), "-o", str(output), "--quiet",
                             "--overwrite"], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert second.returncode == 2 and len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert f"pid {first.pid}" in second.stderr and "out.nc" in second.stderr, second.stderr
    assert elapsed < 1.0, elapsed

    first.send_signal(signal.SIGKILL)
    first.wait()
    assert (tmp_path / "out.nc.lock").exists() and not output.exists()
    stale = tmp_path / "out.nc.spherepde-k3j_x9a2.tmp"  # what a kill during the final write leaves
    stale.write_bytes(b"half a file")
    someone_elses = tmp_path / "out.nc.x.nc.spherepde-k3j_x9a2.tmp"  # the temporary file of another output, out.nc.x.nc
    someone_elses.write_bytes(b"not ours")
    users = tmp_path / "out.nc.original.tmp"  # a user's file that only looks like mkstemp's name (a helper deleted it)
    users.write_bytes(b"notes")
    status, err, _ = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 0 and "resuming" in err, err
    assert_same_result(output, reference)
    assert sorted(os.listdir(tmp_path)) == sorted(["case.toml", "reference.nc", "out.nc", someone_elses.name,
                                                   users.name])


def test_a_lock_is_held_by_a_live_process_only(tmp_path, capsys):
    """The lock of a live process refuses; its lock file left by a dead one (any pid in it) does not."""
    output = tmp_path / "out.nc"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from spherepde.io.locking import hold_output; "
                               f"hold_output({str(output)!r}, 'a test holder'); print('held', flush=True); "
                               "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(spherepde.CaseError, match=rf"being written by another spherepde process \(pid {holder.pid} "):
        OutputLock(output).acquire("second")
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    status, err, _ = run_cli(["run", case, "-o", output], capsys)
    assert status == 2 and "being written by another" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(spherepde.CaseError, match="being written by another"):  # every writer of a result file
        write_dataset(xr.Dataset({"x": ("x", [1.0])}), output)
    holder.kill()
    holder.wait()
    assert (tmp_path / "out.nc.lock").read_text().startswith(f"pid {holder.pid} ")
    lock = OutputLock(output)
    lock.acquire("after the holder died")
    lock.release()
    assert not (tmp_path / "out.nc.lock").exists()


def test_an_interrupt_during_the_final_write_ends_with_the_output_complete(tmp_path, capsys, monkeypatch):
    """SIGINT as the finished run's output is written: the output was complete and its checkpoint removed, yet the
    command exited 130 "interrupted" (a batch script would have run it all again, and --resume found nothing to
    resume).  It is held over the write, then absorbed: exit 0, the output equal to an uninterrupted run's, a note
    saying so, no --plot."""
    import spherepde.io.output as output_module

    case = tmp_path / "case.toml"
    case.write_text(CASE)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    write = output_module.write_dataset

    def interrupted_write(dataset, path, *args, **kwargs):
        if os.path.basename(path) == "out.nc":
            os.kill(os.getpid(), signal.SIGINT)
        return write(dataset, path, *args, **kwargs)

    monkeypatch.setattr(output_module, "write_dataset", interrupted_write)
    status, err, _ = run_cli(["run", case, "-o", output, "--quiet", "--checkpoint-steps", "1", "--plot"], capsys)
    assert status == 0 and "SIGINT came as the output was written; it is complete" in err, err
    assert_same_result(output, reference)
    assert not Checkpoint(output).exists() and not list(tmp_path.glob("*.png"))


@pytest.mark.parametrize("planted", ["symbolic link", "hard link", "folder"])
def test_a_lock_file_that_is_not_a_file_of_its_own_is_refused(tmp_path, capsys, planted):
    """OUT.nc.lock planted as a link to another file: its target was truncated and rewritten with the holder's
    line (a helper's find); as a folder the refusal was errno's words.  One line, exit 2, the other file intact."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    lock = tmp_path / "out.nc.lock"
    {"symbolic link": lambda: lock.symlink_to(victim), "hard link": lambda: os.link(victim, lock),
     "folder": lambda: lock.mkdir()}[planted]()
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    status, err, _ = run_cli(["run", case, "-o", tmp_path / "out.nc"], capsys)
    assert status == 2 and "the output's lock file, is not a regular file of its own" in err, err
    assert len(err.strip().splitlines()) == 1 and victim.read_text() == "precious"
    assert not (tmp_path / "out.nc").exists()


def test_a_file_system_without_flock_warns_and_still_runs(tmp_path, capsys, monkeypatch):
    from spherepde.io import locking

    def unsupported(descriptor, operation):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(locking.fcntl, "flock", unsupported)
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    status, err, _ = run_cli(["run", case, "-o", tmp_path / "out.nc", "--quiet"], capsys)
    assert status == 0 and err.count("cannot be locked here (Operation not supported)") == 1, err
    assert sorted(os.listdir(tmp_path)) == ["case.toml", "out.nc"]


# --- failed runs are first-class files (criterion 3) -----------------------------------------------------------

BLOWS_UP = SMALL_S1.replace('kernel = "softmax"\nbeta = 2.0', 'kernel = "unnormalized"\nbeta = 1.0\n'
                            'V = [[50.0, 0.0], [0.0, 50.0]]').replace("eps = 0.1", "eps = 0.0").replace(
    "dt = 0.05", "dt = 0.5").replace("t_end = 0.5", "t_end = 1.0").replace("save_every = 0.25", "save_every = 0.5")
BLOWS_UP_S2 = BLOWS_UP.replace("dim = 2", "dim = 3").replace("lmax = 16", "lmax = 12").replace(
    "mean = [1.0, 0.0]", "mean = [1.0, 0.0, 0.0]").replace(
    "V = [[50.0, 0.0], [0.0, 50.0]]", "V = [[50.0, 0.0, 0.0], [0.0, 50.0, 0.0], [0.0, 0.0, 50.0]]")
FAILED_RUNS = {  # name: (case text, extra options); every one exits 3
    "S^1": (BLOWS_UP, []),
    "S^2": (BLOWS_UP_S2, []),
    "particles": (BLOWS_UP.replace("dt = 0.5", "cfl = 0.5"), ["--solver", "particles", "--set", "time.max_steps=3"]),
    "particles S^2": (BLOWS_UP_S2.replace("dt = 0.5", "cfl = 0.5"),
                      ["--solver", "particles", "--set", "time.max_steps=3"]),
    "both": (BLOWS_UP, ["--solver", "both"]),
    "both S^2": (BLOWS_UP_S2, ["--solver", "both"]),
}


@pytest.fixture(scope="module")
def failed_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("failed")
    files = {}
    for name, (text, options) in FAILED_RUNS.items():
        case = root / f"{name.replace(' ', '_').replace('^', '')}.toml"
        case.write_text(text)
        files[name] = case.with_suffix(".nc")
        assert main(["run", str(case), "-o", str(files[name]), "--quiet", "--set", "particles.n=200", *options]) == 3
    return files


def figure_text(monkeypatch) -> list:
    """What plotting writes into its figures (titles, legend labels), figure by figure, as it saves them."""
    texts, save = [], plotting._save

    def recording(figure, target, write=None):
        labels = [line.get_label() for axis in figure.get_axes() for line in axis.get_lines()]
        texts.append((figure.get_suptitle(), labels))
        return save(figure, target, write)

    monkeypatch.setattr(plotting, "_save", recording)
    return texts


@pytest.mark.parametrize("name", sorted(FAILED_RUNS))
def test_plot_compare_and_info_take_a_failed_run_and_show_its_failure(failed_files, tmp_path, capsys, monkeypatch,
                                                                      name):
    path = failed_files[name]
    with xr.open_dataset(path) as dataset:
        solver, failed_part = dataset.attrs["solver"], "particles" if "particles" in name else "eulerian"
    texts = figure_text(monkeypatch)
    animate = name != "particles"  # an animation draws a density, or particles on S^2
    status, err, _ = run_cli(["plot", path, "-o", tmp_path / "figures", *(["--animate"] if animate else [])], capsys)
    assert status == 0 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path / "figures")) == [f"{path.stem}.gif"] * animate + [f"{path.stem}.png"]
    title, labels = texts[0]
    assert f"{failed_part} run FAILED (its saves end at t = 0, its last good state)" in title, title
    if failed_part == "eulerian":  # its mass panel and density picture mark the failure (a particle file of one
        assert f"{failed_part} failed after t = 0" in labels  # save has no panel that changes: its title says it)

    status, _, out = run_cli(["info", path], capsys)
    assert status == 0 and f"  {failed_part} run FAILED (its saves end at t = 0, its last good state)" in out, out

    pair = [path] if solver == "both" else [path, path]
    status, err, out = run_cli(["compare", *pair, "-o", tmp_path / "report"], capsys)
    assert status == 0 and "Traceback" not in err, err
    assert "failed:" in out and "compared over the saves it has (t <= 0)" in out, out
    with xr.open_dataset(tmp_path / "report.nc") as report:
        assert "compared over the saves it has" in report.attrs["failed"]
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_a_both_file_whose_particle_run_failed_is_drawn_with_the_eulerian_density(failed_files, tmp_path, capsys,
                                                                                   monkeypatch):
    """The other way round (particles NaN-padded after their failure): split_both gives each run its own saves."""
    with xr.open_dataset(failed_files["particles"]) as stored:
        particles = stored.load()
    eulerian = spherepde.run(spherepde.load_case_text(SMALL_S1.replace("t_end = 0.5", "t_end = 1.0").replace(
        "save_every = 0.25", "save_every = 0.5")), progress=False)
    from spherepde.io.output import both_dataset, split_both

    combined = both_dataset(eulerian, particles)
    write_dataset(combined, tmp_path / "particles-failed.nc")
    halves = split_both(combined)
    assert list(halves[0]["time"].values) == [0.0, 0.5, 1.0] and list(halves[1]["time"].values) == [0.0]
    texts = figure_text(monkeypatch)
    status, err, _ = run_cli(["plot", tmp_path / "particles-failed.nc"], capsys)
    assert status == 0 and "particles run FAILED" in texts[0][0], err
    assert "particles failed after t = 0" in texts[0][1]


@pytest.mark.parametrize("command", [
    ["plot", "{case}", "-o", "{new}/figures"],
    ["run", "{bad}", "-o", "{new}/deeper/out.nc"],
    ["compare", "{case}", "-o", "{new}/deeper/report"],
    ["run", "{case}", "-o", "{new}/deeper/out.nc", "--set", "model.eps=-1"],
])
def test_a_failed_command_leaves_no_empty_folder(tmp_path, capsys, command):
    case, bad = tmp_path / "case.toml", tmp_path / "bad.toml"
    case.write_text(SMALL_S1)
    bad.write_text(SMALL_S1.replace("dim = 2", "dim = [2]"))
    args = [word.format(case=case, bad=bad, new=tmp_path / "new") for word in command]
    status, err, _ = run_cli(args, capsys)
    assert status == 2, err
    assert sorted(os.listdir(tmp_path)) == ["bad.toml", "case.toml"]


# --- limits before work (criterion 4) ---------------------------------------------------------------------------


def limited(args, cwd) -> tuple[int, str, float, float]:
    """`spherepde ARGS` run from a helper process that waits for it with os.wait4, which returns the resource use of
    that one child: (exit status, stderr, wall seconds, peak resident memory in MB)."""
    helper = ("import json, os, subprocess, sys, time\n"
              "args = json.load(sys.stdin)\n"
              "start = time.monotonic()\n"
              "child = subprocess.Popen([sys.executable, '-m', 'spherepde', *args], stdout=subprocess.DEVNULL, "
              "stderr=subprocess.PIPE)\n"
              "err = child.stderr.read()\n"
              "_, status, usage = os.wait4(child.pid, 0)\n"
              "sys.stderr.buffer.write(err)\n"
              "print(os.waitstatus_to_exitcode(status), time.monotonic() - start, usage.ru_maxrss / 1024)\n")
    result = subprocess.run([sys.executable, "-c", helper], cwd=cwd, capture_output=True, text=True, timeout=120,
                            input=json.dumps(list(map(str, args))), env=dict(os.environ, OMP_NUM_THREADS="1"))
    status, seconds, megabytes = result.stdout.split()
    return int(status), result.stderr, float(seconds), float(megabytes)


def negative_initial_file(path) -> None:
    """A result file whose density (1 + 3 cos theta) / (2 pi) has mass 1 and a negative part of 0.23 of it."""
    dataset = spherepde.run(spherepde.load_case_text(SMALL_S1), progress=False)
    theta = dataset["theta"].values
    dataset["density"] = dataset["density"].copy(data=np.broadcast_to((1 + 3 * np.cos(theta)) / (2 * np.pi),
                                                                       dataset["density"].shape).copy())
    write_dataset(dataset, path)


VMF = 'kind = "vmf"\nmean = [1.0, 0.0]\nkappa = 2.0'
FROM_FILE = SMALL_S1.replace(VMF, 'kind = "file"\npath = "{path}"')
MIXTURE = SMALL_S1.replace(VMF, 'kind = "vmf_mixture"\nmeans = {means}\nkappas = [1.0, 2.0]\nweights = {weights}')
LIMITS = {  # name: (case file: its text, or a path; the command after `spherepde`; what the one line names)
    "case file /dev/zero": ("/dev/zero", ["run", "/dev/zero", "-o", "out.nc"], "not a regular file"),
    "case file larger than the bound": ("{huge}", ["run", "{huge}", "-o", "out.nc"], "larger than 16 MiB"),
    "initial.path /dev/zero": (FROM_FILE.format(path="/dev/zero"), ["run"], "initial.path"),
    "seeds beyond the bound": (SMALL_S1, ["sweep", "case.toml", "-o", "sweep", "--param", "model.eps=0.1,0.2",
                                          "--seeds", str(10 ** 12)], "--seeds"),
    "S^2 grid beyond memory": (SMALL_S1, ["run", "--set", "sphere.dim=3", "--set", "sphere.lmax=30000",
                                          "--set", "initial.mean=[1.0, 0.0, 0.0]"], "sphere.lmax"),
    "S^2 grid beyond memory, shtns": (SMALL_S1, ["run", "--set", "sphere.dim=3", "--set", "sphere.lmax=32767",
                                                 "--set", "solver.backend='shtns'", "--set",
                                                 "initial.mean=[1.0, 0.0, 0.0]"], "sphere.lmax"),
    "particles beyond memory": (SMALL_S1, ["run", "--solver", "particles", "--set", "particles.n=4294967295"],
                                "particles.n"),
    "nesting in the file": ("x = " + "[" * 100_000 + "]" * 100_000 + "\n", ["run"], "nested"),
    "nesting from --set": (SMALL_S1, ["run", "--set", "model.B=" + "[" * 20_000 + "]" * 20_000], "nested"),
    "dotted keys from --set": (SMALL_S1, ["run", "--set", ".".join(["model"] * 5000) + "=1"], "nested"),
    "initial.mean overflows": (SMALL_S1, ["run", "--set", "initial.mean=[1.7e308, 1.7e308]"], "initial.mean"),
    "initial.means overflow": (MIXTURE.format(means="[[1.7e308, -1.7e308], [0.0, 1.0]]", weights="[0.5, 0.5]"),
                               ["run"], "initial.means"),
    "control.target overflows": (SMALL_S1, ["run", "--set", "control.target=[1.7e308, 1.7e308]"], "control.target"),
    "initial.weights overflow": (MIXTURE.format(means="[[1.0, 0.0], [0.0, 1.0]]", weights="[1.7e308, 1.7e308]"),
                                 ["run"], "initial.weights"),
    "case name too long": (SMALL_S1, ["run", "--set", "case.name='" + "n" * 211 + "'"], "case.name"),
    "long -o name": (SMALL_S1, ["run", "-o", "o" * 240 + ".nc"], "the name is too long"),
    "long -o path": (SMALL_S1, ["run", "-o", "/".join(["p" * 200] * 25) + "/out.nc"], "the path is too long"),
    "initial density with negative parts": (FROM_FILE.format(path="{negative}"), ["run"], "initial.path"),
}


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_inputs_beyond_the_limits_are_refused_in_under_5_s_and_200_mb(tmp_path, name):
    """Each input is refused with one line naming it, exit 2, within 5 s and 200 MB of peak resident memory
    (measured by os.wait4 on the command's own process), and leaves no file."""
    case, command, named = LIMITS[name]
    paths = {"huge": str(tmp_path / "huge.toml"), "negative": str(tmp_path / "negative.nc")}
    if case == "{huge}":
        with open(paths["huge"], "wb") as stream:
            stream.truncate(17 << 20)  # sparse: no disk needed
    elif "{negative}" in case:
        negative_initial_file(paths["negative"])
    if not case.startswith(("/", "{")):
        (tmp_path / "case.toml").write_text(case.replace("{negative}", paths["negative"]))
    args = [word.format(**paths) if word == "{huge}" else word for word in command]
    if args[0] == "run" and (len(args) == 1 or args[1].startswith("-")):  # the case file written above
        args = ["run", "case.toml", *(["-o", "out.nc"] if "-o" not in args else []), *args[1:]]
    before = set(os.listdir(tmp_path))
    status, err, seconds, megabytes = limited(args, tmp_path)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert named in err, err
    assert seconds < 5 and megabytes < 200, (seconds, megabytes)
    assert set(os.listdir(tmp_path)) == before


def test_a_sweep_of_too_many_members_is_refused_before_they_are_planned(tmp_path, capsys):
    (tmp_path / "case.toml").write_text(SMALL_S1)
    values = ",".join(str(0.1 * k) for k in range(1, 200))
    start = time.monotonic()
    status, err, _ = run_cli(["sweep", tmp_path / "case.toml", "-o", tmp_path / "sweep", "--param",
                              f"model.eps={values}", "--param", f"model.beta={values}"], capsys)
    assert status == 2 and "199 x 199 = 39601 members; at most 10000" in err and len(err.strip().splitlines()) == 1
    assert time.monotonic() - start < 5 and os.listdir(tmp_path) == ["case.toml"]


def test_the_longest_case_name_runs_and_a_vector_of_large_entries_is_normalised(tmp_path, capsys):
    """The bounds refuse only what cannot work: a 210-byte case name writes its default output and figure, and a
    direction of entries 1e300 (whose norm does not overflow) becomes its unit vector."""
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1.replace('name = "small"', 'name = "' + "n" * 210 + '"'))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        status, err, _ = run_cli(["run", case, "--quiet", "--plot", "--set", "initial.mean=[1e300, 1e300]"], capsys)
    finally:
        os.chdir(cwd)
    assert status == 0, err
    assert sorted(os.listdir(tmp_path)) == sorted(["case.toml", "n" * 210 + ".nc", "n" * 210 + ".png"])
    with xr.open_dataset(tmp_path / ("n" * 210 + ".nc")) as dataset:
        mean = spherepde.load_case_text(dataset.attrs["case"])["initial"]["mean"]
    np.testing.assert_allclose(mean, [2 ** -0.5, 2 ** -0.5], rtol=1e-15)


# --- text from files is data (group 5) -------------------------------------------------------------------------


def test_info_and_compare_print_the_text_of_foreign_files_escaped(tmp_path, capsys):
    """Attributes holding terminal escape sequences, carriage returns and newlines print as escapes: no byte of a
    control character reaches the terminal, and a note cannot fake a line of the summary."""
    dataset = spherepde.run(spherepde.load_case_text(SMALL_S1), progress=False)
    dataset.attrs.update(title="run \x1b[2J\x1b]0;owned\x07 title\rfake", status="failed: \x1b[31mred\nsecond line",
                         notes="a note\nanother \x1b[5mnote\u202e")
    write_dataset(dataset, tmp_path / "foreign.nc")
    status, _, out = run_cli(["info", tmp_path / "foreign.nc"], capsys)
    assert status == 0
    assert not any(char in out.replace("\n", "") for char in "\x1b\x07\r\u202e"), repr(out)
    assert "run \\x1b[2J\\x1b]0;owned\\x07 title\\rfake" in out and "status failed: \\x1b[31mred\\nsecond line" in out
    assert "  note: another \\x1b[5mnote\\u202e" in out
    status, _, out = run_cli(["compare", tmp_path / "foreign.nc", tmp_path / "foreign.nc", "-o", tmp_path / "r",
                              "--no-w2"], capsys)
    assert status == 0 and "\x1b" not in out and "\\x1b[31mred\\nsecond line" in out


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_inside_a_write_acts_once_the_file_is_in_place(tmp_path, monkeypatch, number):
    # An interrupt raised inside xarray's to_netcdf, which holds its file lock then, left the write's clean-up
    # waiting on that lock forever (a run stopped in its final write hung, its .tmp file beside it).
    from spherepde.cli import _stop

    dataset = xr.Dataset({"x": ("t", np.arange(3.0))}, attrs={"source": "spherepde"})
    real = xr.Dataset.to_netcdf

    def interrupted(self, *args, **kwargs):
        os.kill(os.getpid(), number)  # lands inside the write
        return real(self, *args, **kwargs)

    monkeypatch.setattr(xr.Dataset, "to_netcdf", interrupted)
    previous = signal.signal(signal.SIGTERM, _stop)  # the command's handler (spherepde.cli.main)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_dataset(dataset, tmp_path / "out.nc")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert os.listdir(tmp_path) == ["out.nc"]
    with xr.open_dataset(tmp_path / "out.nc") as written:
        assert written["x"].values.tolist() == [0.0, 1.0, 2.0]
