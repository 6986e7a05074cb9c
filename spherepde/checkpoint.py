"""Checkpoints of long runs, so that an interrupted run resumes and loses nothing (DESIGN §6).

A run writing OUT.nc keeps its checkpoint in the folder OUT.nc.checkpoint/:

    segment-00000.nc, ...   the saves recorded since the previous checkpoint, each an ordinary
                            result Dataset (``xr.open_mfdataset("OUT.nc.checkpoint/segment-*.nc")``
                            shows the run so far);
    state.pt                the solver's state (torch.save, weights-only types): the resolved case
                            text, t, the step count, dt, the solver's tensors, and the RNG states of
                            solvers that draw random numbers, plus the list of segments it covers.

A training's checkpoint holds its evaluations of J and dJ/dW instead (solvers/journal.py): its
segments list them, and its state counts them as its steps.

Every file is written atomically (temporary file, then rename), a segment before the state
that names it, so a kill at any instant leaves a consistent checkpoint. An interrupt (SIGINT,
`Checkpoint.interrupt`) asks for a checkpoint at the end of the current step and then stops the
run, so Ctrl-C loses nothing either. Once the output is written the checkpoint's own files are
removed, and the folder with them unless it holds files of someone else.
"""

import glob
import os
import pickle
import sys
import time
import tomllib
import uuid

import torch
import xarray as xr

from .errors import CaseError
from .output import write_dataset

FORMAT = 1  # version of the state layout


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
        self.last_steps, self.last_clock = 0, time.monotonic()
        self.interrupted = False  # an interrupt asked for a checkpoint and then a stop
        self.stepping = False  # the solver is inside its step loop, where it checks `due` after every step
        self.unit = "step"  # what the solver checks `due` after: a time step, or a training's evaluation

    def interrupt(self, signum=None, frame=None) -> None:
        """A SIGINT handler: while the solver steps, the first interrupt asks it to checkpoint at the end of its
        current step and stop (KeyboardInterrupt); a second one, or one outside the step loop (setting up,
        writing, the particle half of a "both" run), stops it at once."""
        if self.interrupted or not self.stepping:
            raise KeyboardInterrupt
        self.interrupted = True
        print(f"spherepde: interrupted: checkpointing at the end of this {self.unit} (interrupt again to stop at once)",
              file=sys.stderr)

    @property
    def state_path(self) -> str:
        return os.path.join(self.folder, "state.pt")

    def exists(self) -> bool:
        return os.path.exists(self.state_path)

    def due(self, steps: int) -> bool:
        """Whether a checkpoint should be written now, `steps` steps into the run."""
        if self.interrupted:
            return True
        if self.every_steps is not None and steps - self.last_steps >= self.every_steps:
            return True
        return self.every_minutes is not None and time.monotonic() - self.last_clock >= 60 * self.every_minutes

    def write(self, state: dict, segment: xr.Dataset | None, steps: int) -> None:
        """Store `state`, first writing `segment` (the saves not yet stored), `steps` steps into the run.

        `state` holds weights-only types (tensors, numbers, strings, lists, dicts) and at least
        "case" (the resolved case text) and "steps", and "t" and "t_end" but for a training; the rest is
        the solver's.
        """
        os.makedirs(self.folder, exist_ok=True)
        if segment is not None:
            name = f"segment-{len(self.segments):05d}.nc"
            write_dataset(segment, os.path.join(self.folder, name))
            self.segments.append(name)
            self.saves += segment.sizes.get("time", 0)  # a training's segments hold evaluations, not saves
        payload = dict(state, format=FORMAT, segments=list(self.segments), saves=self.saves)
        temporary = f"{self.state_path}.{uuid.uuid4().hex}.tmp"
        try:
            torch.save(payload, temporary)
            os.replace(temporary, self.state_path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        self.last_steps, self.last_clock = steps, time.monotonic()

    def forget_segments(self) -> None:
        """Start the list of segments again: the next `write` stores its segment as the first, replacing
        that file, and its state names only the segments written from then on (files left from before
        are never read again, and `remove` deletes them with the rest)."""
        self.segments, self.saves = [], 0

    def read_state(self) -> dict:
        """The stored state, or a one-line CaseError."""
        try:
            state = torch.load(self.state_path, weights_only=True)
        except FileNotFoundError:
            raise CaseError(f"--resume: no checkpoint {self.folder!r} to resume from; run without --resume") from None
        except Exception as error:  # a damaged file: pickle, zip and torch errors alike
            # torch's own text for the weights-only refusal advises loading the file unsafely: not ours to pass on
            reason = ("it holds objects that no checkpoint stores" if isinstance(error, pickle.UnpicklingError)
                      else _first_line(error))
            raise CaseError(f"--resume: cannot read the checkpoint {self.state_path!r}: {reason}; "
                            "pass --overwrite to start again") from None
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise CaseError(f"--resume: {self.state_path!r} is not a checkpoint of this spherepde version; "
                            "pass --overwrite to start again")
        return state

    def verify(self, case) -> dict:
        """The stored state, after checking that it was written for `case` (else a one-line CaseError)."""
        state = self.read_state()
        if state["case"] != case.text:
            raise CaseError(f"--resume: the checkpoint {self.folder!r} was written for another case "
                            f"({_difference(state['case'], case.text)}); resume with the same case file "
                            "and --set options, or pass --overwrite to start again")
        self.read_segments(state, load=False)  # before the run announces its resumption: headers only
        return state

    def read_segments(self, state: dict, load: bool = True) -> list[xr.Dataset]:
        """The segments `state` lists, in memory (`load`; else each is only opened, which reads its header);
        a one-line CaseError if one is missing or damaged."""
        segments = []
        for name in state["segments"]:
            path = os.path.join(self.folder, name)
            try:
                with xr.open_dataset(path) as segment:
                    if load:
                        segments.append(segment.load())
            except Exception as error:  # missing or damaged: netCDF, HDF5 and xarray errors alike
                raise CaseError(f"--resume: cannot read the checkpoint segment {path!r}: {_first_line(error)}; "
                                "pass --overwrite to start again") from None
        return segments

    def load(self, case) -> tuple[dict, list[xr.Dataset]]:
        """The state and the saved segments (in memory), after checking they belong to `case`."""
        state = self.verify(case)
        segments = self.read_segments(state)
        self.segments, self.saves = list(state["segments"]), state["saves"]
        self.last_steps, self.last_clock = state["steps"], time.monotonic()
        return state, segments

    def describe(self) -> str:
        """Where the stored run stands, e.g. "t = 3.2 of 6, step 320" or "12 evaluations of J and dJ/dW"."""
        try:
            state = self.read_state()
        except CaseError:
            return "its state is unreadable"
        if "t" not in state:
            return f"{state['steps']} evaluation{'s' if state['steps'] != 1 else ''} of J and dJ/dW"
        return f"t = {state['t']:.6g} of {state['t_end']:.6g}, step {state['steps']}"

    def remove(self) -> None:
        """Delete the files a checkpoint writes, and the folder if nothing else is left in it."""
        ours = [self.state_path] + [path for pattern in ("segment-*.nc", "segment-*.nc.*.tmp", "state.pt.*.tmp")
                                    for path in glob.glob(os.path.join(glob.escape(self.folder), pattern))]
        for path in ours:
            try:
                os.remove(path)
            except (FileNotFoundError, NotADirectoryError):
                pass
        try:
            os.rmdir(self.folder)
        except OSError:  # absent, or holding files that are not ours
            pass


def _first_line(error: Exception) -> str:
    """The first line of an exception's message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _difference(stored: str, current: str) -> str:
    """The first key whose value differs between two resolved case texts."""
    a, b = tomllib.loads(stored), tomllib.loads(current)
    for section in dict.fromkeys(list(a) + list(b)):
        left, right = a.get(section, {}), b.get(section, {})
        for key in dict.fromkeys(list(left) + list(right)):
            if left.get(key) != right.get(key):
                return f"{section}.{key} = {left.get(key)!r} there, {right.get(key)!r} now"
    return "the case texts differ"
