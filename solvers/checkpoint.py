"""Checkpoints of long runs, so that an interrupted run resumes and loses nothing (docs/design.md "Output"), and resumes
only what it wrote itself.

A run writing OUT.nc keeps its checkpoint in the folder OUT.nc.checkpoint/:

    segment-00000.nc, ...   the saves recorded since the previous checkpoint, each an ordinary
                            result Dataset (``xr.open_mfdataset("OUT.nc.checkpoint/segment-*.nc")``
                            shows the run so far);
    state-00001.pt, ...     the solver's state (torch.save, weights-only types): the resolved case
                            text, t, the step count, dt, the solver's tensors, and the RNG states of
                            solvers that draw random numbers, plus the list of segments it covers;
    manifest.json           what the checkpoint is: its state file and its segments, in order, each with
                            its size and SHA-256, the SHA-256 of the case text, and its own SHA-256.

A training's checkpoint holds its evaluations of J and dJ/dW instead (solvers/journal.py): its
segments list them, each entry chained to the one before by a digest, and its state counts them as its steps.

Writing: the new segment, then a new state file, then the manifest, each atomically (temporary file, then
rename); the manifest is the commit, and no file the committed manifest names is ever replaced (segments and
states take new names), so a kill at any instant leaves the previous checkpoint or the new one, both whole.
Files no manifest names any more are deleted once the new one is committed.  An interrupt (SIGINT,
`Checkpoint.interrupt`) asks for a checkpoint at the end of the current step and then stops the run, so
Ctrl-C loses nothing either. Once the output is written the checkpoint's own files are removed, and the folder
with them unless it holds files of someone else.

Resuming (`verify`, `load`) accepts only a checkpoint that this code wrote for this case: the manifest must be
whole (its own digest), every file it names must have its size and digest, the state must be the case's
(its text and the manifest's digest of it), and the contents must have the layout the solver writes: for an
Eulerian run the save times of the segments in order and continuous from t = 0 on the case's schedule, the
state's time inside the interval after the last save, and its coefficients of the shape and dtype of the
case's basis; for a training the journal's entries (solvers.journal.stored_problem).  Anything else is refused
with one line naming the file and saying how to start over (CaseError, exit status 2).  The digests detect
any change to the files; they do not authenticate them: someone who rewrites a segment and the manifest's
digests consistently is caught only by the layout checks.
"""

import glob
import io
import json
import os
import pickle
import re
import time
import tomllib

import torch
import xarray as xr

from solvers.checkpoint_files import (
    Refused,
    data_identity,
    file_identity,
    mismatch,
    read_regular,
    sha256,
    write_atomically,
)
from solvers.checkpoint_layout import eulerian_problem, is_int
from spherepde.base.errors import CaseError
from spherepde.base.progress import message
from spherepde.io.case_toml import case_differences, toml_value
from spherepde.io.output import make_folders, write_dataset

FORMAT = 2  # version of the checkpoint layout: 2 added the manifest
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20  # a manifest names at most a few thousand files: a larger one is not ours
START_OVER = "pass --overwrite to start again"
_SEGMENT = re.compile(r"segment-(\d{5,})\.nc")
_STATE = re.compile(r"state-(\d{5,})\.pt")
_LEGACY_STATE = "state.pt"  # FORMAT 1 kept its state here, without a manifest
# what writers killed in the folder leave: write_dataset's and write_atomically's temporary files, and the lock
# file of a segment written without a lock covering the checkpoint (spherepde.io.locking.one_writer)
_LEFT_BY_A_KILL = re.compile(r"segment-\d{5,}\.nc\.((spherepde-)?[a-z0-9_]{8}\.tmp|lock)"  # untagged: before 0.2.0
                             r"|(state-\d{5,}\.pt|manifest\.json|state\.pt)\.[0-9a-f]{32}\.tmp")


def checkpoint_folder(output: str | os.PathLike) -> str:
    """Where the checkpoint of the run writing `output` lives."""
    return os.fspath(output) + ".checkpoint"


class Checkpoint:
    """The checkpoint of one run: when to write it, writing it, reading it back.

    A checkpoint is due after `every_steps` steps or `every_minutes` minutes of wall time since
    the previous one, whichever comes first (None: never by that rule). With `resume` set the
    solver starts from the stored state instead of the initial condition.
    """

    def __init__(self, output: str | os.PathLike, every_steps: int | None = None,
                 every_minutes: float | None = None, resume: bool = False):
        self.folder = checkpoint_folder(output)
        self.every_steps, self.every_minutes, self.resume = every_steps, every_minutes, resume
        self.segments: list[str] = []  # the segment files written so far, in order
        self.saves = 0  # how many saves those segments hold
        self.files: dict[str, dict] = {}  # name -> {"bytes", "sha256"} of every segment the next manifest names
        self.generation = 0  # how many states were written: the next one is state-<generation + 1>.pt
        self.next_segment = 0  # the number of the next segment file (never one a manifest named)
        self.committed_steps: int | None = None  # the steps of the last checkpoint committed (or loaded)
        self.last_steps, self.last_clock = 0, time.monotonic()
        self.interrupted = False  # an interrupt asked for a checkpoint and then a stop
        self.stepping = False  # the solver is inside its step loop, where it checks `due` after every step
        self.unit = "step"  # what the solver checks `due` after: a time step, or a training's evaluation
        # also due at the run's last step: a "both" run's Eulerian half, which an interrupt in the particle half
        # then keeps whole (the resumed run goes straight to the particles)
        self.at_end = False

    def interrupt(self, signum=None, frame=None) -> None:
        """A SIGINT handler: while the solver steps, the first interrupt asks it to checkpoint at the end of its
        current step and stop (KeyboardInterrupt); a second one, or one outside the step loop (setting up,
        writing, the particle half of a "both" run), stops it at once."""
        if self.interrupted or not self.stepping:
            raise KeyboardInterrupt
        self.interrupted = True
        message(f"spherepde: interrupted: checkpointing at the end of this {self.unit} (interrupt again to stop at "
                "once)")

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.folder, MANIFEST)

    def exists(self) -> bool:
        """Whether the folder holds a checkpoint: a manifest, or a state without one (a manifest deleted, a run
        stopped before its first checkpoint was committed, or the format before manifests), which a new run must
        not delete unasked either."""
        try:
            names = os.listdir(self.folder)
        except OSError:
            return False
        return any(name in (MANIFEST, _LEGACY_STATE) or _STATE.fullmatch(name) for name in names)

    def due(self, steps: int, last: bool = False) -> bool:
        """Whether a checkpoint should be written now, `steps` steps into the run (`last`: its last step)."""
        if self.interrupted or (last and self.at_end):
            return True
        if self.every_steps is not None and steps - self.last_steps >= self.every_steps:
            return True
        return self.every_minutes is not None and time.monotonic() - self.last_clock >= 60 * self.every_minutes

    def write(self, state: dict, segment: xr.Dataset | None, steps: int) -> None:
        """Store `state`, first writing `segment` (the saves not yet stored), `steps` steps into the run; the
        manifest naming both is written last and commits them (module docstring).

        `state` holds weights-only types (tensors, numbers, strings, lists, dicts) and at least
        "case" (the resolved case text) and "steps", and "t" and "t_end" but for a training; the rest is
        the solver's.
        """
        make_folders(self.folder)
        # the new lists take effect once the manifest commits them: a write stopped before (a full disk, a second
        # Ctrl-C) leaves this object as the committed checkpoint, and the next write's files replace its orphans
        segments, files, saves, next_segment = list(self.segments), dict(self.files), self.saves, self.next_segment
        if segment is not None:
            name = f"segment-{next_segment:05d}.nc"
            path = os.path.join(self.folder, name)
            write_dataset(segment, path)
            files[name] = file_identity(path)
            segments.append(name)
            next_segment += 1
            saves += segment.sizes.get("time", 0)  # a training's segments hold evaluations, not saves
        payload = dict(state, format=FORMAT, segments=segments, saves=saves)
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        state_name = f"state-{self.generation + 1:05d}.pt"
        write_atomically(os.path.join(self.folder, state_name), buffer.getvalue())
        manifest = {"format": FORMAT, "case_sha256": sha256(state["case"].encode()),
                    "state": {"name": state_name, **data_identity(buffer.getvalue())},
                    "segments": [{"name": name, **files[name]} for name in segments],
                    "saves": saves, "steps": int(steps)}
        manifest["sha256"] = _manifest_digest(manifest)
        write_atomically(self.manifest_path, json.dumps(manifest, indent=1).encode())
        self.segments, self.files, self.saves, self.next_segment = segments, files, saves, next_segment
        self.generation, self.committed_steps = self.generation + 1, steps
        self.last_steps, self.last_clock = steps, time.monotonic()
        self._remove_unnamed(manifest)

    def forget_segments(self, kept: int = 0) -> None:
        """Start the list of segments again: the next `write` stores its segment as the first and its state
        names only the segments written from then on (the files before are deleted once it is committed).  `kept`:
        the steps of the run that the segments to come hold again from its start (a resumed training that left its
        stored path: the evaluations still on it), after which the next checkpoint is due by `every_steps`; the
        committed checkpoint is no longer the one the run goes on from."""
        self.segments, self.saves, self.files = [], 0, {}
        # counted from the committed checkpoint's steps, a training that left its path after evaluation k of S stored
        # wrote no checkpoint until evaluation S + every_steps: a kill lost evaluations k + 1 to S + every_steps - 1
        self.last_steps, self.committed_steps = kept, None

    def read_state(self) -> dict:
        """The stored state, its file checked against the manifest (its size and digest), or a one-line
        CaseError naming the file."""
        return self._refusing(lambda: self._state(self._manifest())[0])

    def verify(self, case) -> dict:
        """The stored state, after checking everything that `load` will use (module docstring): the manifest,
        every file's digest, the case, the segments' times and the state's layout; a one-line CaseError naming
        the file that fails."""
        return self._refusing(lambda: self._verified(case)[0])

    def load(self, case) -> tuple[dict, list[xr.Dataset]]:
        """The state and the saved segments (in memory), after `verify`; the checkpoint goes on from them."""
        state, segments, manifest = self._refusing(lambda: self._verified(case, load=True))
        self.segments, self.saves = list(state["segments"]), state["saves"]
        self.files = {entry["name"]: {"bytes": entry["bytes"], "sha256": entry["sha256"]}
                      for entry in manifest["segments"]}
        self.generation = int(_STATE.fullmatch(manifest["state"]["name"])[1])
        self.next_segment = 1 + max(int(_SEGMENT.fullmatch(name)[1]) for name in self.segments)
        self.committed_steps = self.last_steps = state["steps"]
        self.last_clock = time.monotonic()
        self._remove_unnamed(manifest, left_by_a_kill=True)
        return state, segments

    def describe(self) -> str:
        """Where the stored run stands, e.g. "t = 3.2 of 6, step 320" or "12 evaluations of J and dJ/dW"."""
        try:
            state = self.read_state()
            if "t" not in state:
                return f"{state['steps']} evaluation{'s' if state['steps'] != 1 else ''} of J and dJ/dW"
            return f"t = {state['t']:.6g} of {state['t_end']:.6g}, step {state['steps']}"
        except (CaseError, KeyError, TypeError, ValueError):
            return "its state is unreadable or does not match its manifest"

    def remove(self) -> None:
        """Delete the files a checkpoint writes, and the folder if nothing else is left in it."""
        ours = [path for pattern in ("segment-*.nc", "segment-*.nc.*.tmp", "segment-*.nc.lock", "state-*.pt",
                                     "state-*.pt.*.tmp", MANIFEST, f"{MANIFEST}.*.tmp", _LEGACY_STATE,
                                     f"{_LEGACY_STATE}.*.tmp")
                for path in glob.glob(os.path.join(glob.escape(self.folder), pattern))]
        for path in ours:
            try:
                os.remove(path)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                pass
        try:
            os.rmdir(self.folder)
        except OSError:  # absent, or holding files that are not ours
            pass

    # --- reading back -------------------------------------------------------------------------------

    def _refusing(self, read):
        """read(), with a refused file turned into the one-line CaseError of a resume."""
        try:
            return read()
        except Refused as refusal:
            path, reason = refusal.args
            raise CaseError(f"--resume: the checkpoint file {path!r} {reason}; {START_OVER}") from None

    def _verified(self, case, load: bool = False) -> tuple[dict, list[xr.Dataset], dict]:
        manifest = self._manifest()
        state, state_path = self._state(manifest)
        if manifest["case_sha256"] != sha256(case.text.encode()) or state.get("case") != case.text:
            stored = state.get("case") if isinstance(state.get("case"), str) else ""
            raise CaseError(f"--resume: the checkpoint {self.folder!r} was written for another case "
                            f"({_difference(stored, case.text)}); resume with the same case file "
                            f"and --set options, or {START_OVER}")
        names = [entry["name"] for entry in manifest["segments"]]
        if state.get("segments") != names or state.get("saves") != manifest["saves"] or \
                state.get("steps") != manifest["steps"]:
            raise Refused(state_path, "does not list the segments, saves and steps of its manifest")
        if not names:
            raise Refused(self.manifest_path, "lists no segment (every checkpoint holds at least one)")
        segments = [(os.path.join(self.folder, entry["name"]), self._segment(entry, load or bool(case["control"])))
                    for entry in manifest["segments"]]
        if case["control"]:
            from solvers.journal import stored_problem  # the journal's layout is the journal's

            problem = stored_problem(state, state_path, segments, case)
        else:
            problem = eulerian_problem(state, state_path, segments, case)
        if problem is not None:
            raise Refused(*problem)
        return state, [segment for _, segment in segments], manifest

    def _manifest(self) -> dict:
        """The committed manifest, whole and of this format."""
        path = self.manifest_path
        if not os.path.exists(path):
            if os.path.exists(os.path.join(self.folder, _LEGACY_STATE)):
                raise Refused(os.path.join(self.folder, _LEGACY_STATE),
                              "was written by an earlier spherepde version, without the manifest that lets a resume "
                              "verify it (resume it with that version)")
            if self.exists():
                raise Refused(path, "is missing: deleted, or the run stopped before its first checkpoint was "
                                    "complete (nothing in the folder can be verified)")
            raise CaseError(f"--resume: no checkpoint {self.folder!r} to resume from; run without --resume")
        data = read_regular(path, MAX_MANIFEST_BYTES)
        if len(data) > MAX_MANIFEST_BYTES:
            raise Refused(path, f"is larger than any manifest ({MAX_MANIFEST_BYTES >> 20} MiB)")
        try:
            manifest = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise Refused(path, "is not a manifest (damaged or truncated)") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise Refused(path, "is not the manifest of a checkpoint of this spherepde version")
        if manifest.get("sha256") != _manifest_digest(manifest):
            raise Refused(path, "was changed after it was written (its digest does not match its contents)")
        if not _manifest_layout(manifest):
            raise Refused(path, "does not have the layout of a checkpoint manifest")
        return manifest

    def _state(self, manifest: dict) -> tuple[dict, str]:
        """(the state the manifest names, its path), its bytes checked against the manifest."""
        entry = manifest["state"]
        path = os.path.join(self.folder, entry["name"])
        data = read_regular(path, entry["bytes"])
        if data_identity(data) != {"bytes": entry["bytes"], "sha256": entry["sha256"]}:
            raise Refused(path, mismatch(len(data), entry["bytes"]))
        try:
            state = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as error:  # pickle, zip and torch errors alike
            # torch's own text for the weights-only refusal advises loading the file unsafely: not ours to pass on
            reason = ("it holds objects that no checkpoint stores" if isinstance(error, pickle.UnpicklingError)
                      else _first_line(error))
            raise Refused(path, f"cannot be read: {reason}") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise Refused(path, "is not a checkpoint state of this spherepde version")
        return state, path

    def _segment(self, entry: dict, load: bool) -> xr.Dataset:
        """The segment the manifest `entry` names, checked against it (its size and digest): in memory with
        `load`, else opened lazily (its header and coordinates read)."""
        path = os.path.join(self.folder, entry["name"])
        identity = file_identity(path)
        if identity != {"bytes": entry["bytes"], "sha256": entry["sha256"]}:
            raise Refused(path, mismatch(identity["bytes"], entry["bytes"]))
        try:
            with xr.open_dataset(path) as segment:
                return segment.load() if load else segment
        except Exception as error:  # netCDF, HDF5 and xarray errors alike
            raise Refused(path, f"cannot be read: {_first_line(error)}") from None

    def _remove_unnamed(self, manifest: dict, left_by_a_kill: bool = False) -> None:
        """Delete the segments and states of this checkpoint that `manifest` does not name (superseded), and with
        `left_by_a_kill` the temporary files of writers that died (a resume: no writer of this checkpoint is
        alive but this one)."""
        named = {manifest["state"]["name"]} | {entry["name"] for entry in manifest["segments"]}
        for name in os.listdir(self.folder):
            ours = _SEGMENT.fullmatch(name) or _STATE.fullmatch(name) or name == _LEGACY_STATE
            if (name not in named and ours) or (left_by_a_kill and _LEFT_BY_A_KILL.fullmatch(name)):
                try:
                    os.remove(os.path.join(self.folder, name))
                except FileNotFoundError:
                    pass


# --- files, digests, the manifest --------------------------------------------------------------------------


def _manifest_digest(manifest: dict) -> str:
    """SHA-256 of the manifest's canonical JSON without its own digest."""
    body = {key: value for key, value in manifest.items() if key != "sha256"}
    return sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def _manifest_layout(manifest: dict) -> bool:
    """Whether a manifest whose digest matches has the fields `write` gives it."""
    def entry(value, pattern) -> bool:
        return (isinstance(value, dict) and set(value) == {"name", "bytes", "sha256"}
                and isinstance(value["name"], str) and pattern.fullmatch(value["name"]) is not None
                and is_int(value["bytes"]) and value["bytes"] >= 0
                and isinstance(value["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", value["sha256"]) is not None)
    segments = manifest.get("segments")
    return (entry(manifest.get("state"), _STATE) and isinstance(segments, list)
            and all(entry(segment, _SEGMENT) for segment in segments)
            and len({segment["name"] for segment in segments}) == len(segments)
            and is_int(manifest.get("saves")) and is_int(manifest.get("steps"))
            and isinstance(manifest.get("case_sha256"), str))


def _first_line(error: Exception) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _shown(value) -> str:
    """A case value as the case file writes it (TOML), "absent" for a key the case does not have."""
    return "absent" if value is None else toml_value(value)


def _difference(stored: str, current: str) -> str:
    """The first key whose value differs between two resolved case texts."""
    try:
        key, there, now = next(case_differences(stored, current))
    except (tomllib.TOMLDecodeError, RecursionError, StopIteration):
        return "the case texts differ"
    return f"{key} = {_shown(there)} there, {_shown(now)} now"
