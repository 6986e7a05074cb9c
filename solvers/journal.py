"""The evaluations of a training, kept in its checkpoint and replayed on resume (docs/design.md "Output": a long run
loses nothing already computed).

The optimizers of solvers/training.py (gd, adam, scipy's L-BFGS-B) are deterministic: given the same J and
dJ/dW at the same controls they ask for the same next controls.  So a training's checkpoint holds no
optimizer state, only the evaluations it has made, in order: for each, the controls (the optimizer's: W
(layers, d, d) of the seeds' model; beyond it the trained entries of theta, (layers, k) or (layers, 1, p)), J,
l(mu_T), dJ/dW and |grad phi_t|_{L2(mu_t)} at the adjoint's step times (all that the training and its output read
from a controlled_forward.Gradient), or the message of the NumericalFailure the evaluation ended in.
A resumed training runs its optimizer again from the start, and `Journal` answers each request from the
stored evaluations, in order, as long as the requested controls equal the stored ones bit for bit: the
optimizer passes through the same points to where it was interrupted at no cost, then goes on with new
evaluations, and ends bit for bit where the uninterrupted training ends.  Should a request differ (another
torch build or machine: round-off), the rest of the stored evaluations is dropped and made anew, with a
warning and a line in the output's `notes` (the checkpoint keeps the evaluations up to there and the new
ones); the result is then that of an uninterrupted training on this machine.

In the checkpoint (solvers.checkpoint) each segment is a Dataset of the evaluations made since the one
before, along the dimension `evaluation`; the state holds the case text, the number of evaluations (its
"steps": `--checkpoint-steps N` asks for a checkpoint every N evaluations) and the notes so far.  An
interrupt takes effect at the end of the evaluation in progress.

Every stored evaluation carries its number (`index`, from 1) and a digest chained to the one before it:
digest_k = SHA-256(digest_{k-1}, k, everything a replay answers from it), digest_0 = SHA-256 of the case text.
A resume replays only a journal whose chain holds from the case's start to its last entry (`stored_problem`):
an entry edited, dropped, repeated or moved, a segment swapped, or one of another training, breaks it.
"""

import hashlib
import math
import struct
import warnings

import numpy as np
import torch
import xarray as xr

from solvers.controlled_forward import Gradient
from spherepde.base.errors import NumericalFailure


class Evaluation:
    """One evaluation: the controls (float64 numpy) and the Gradient there, or the failure's message."""

    def __init__(self, controls: np.ndarray, gradient: Gradient | None, failure: str | None = None):
        self.controls, self.gradient, self.failure = controls, gradient, failure


class Journal:
    """gradient_of(controls) -> Gradient, with every evaluation kept in `checkpoint` and, on resume, answered
    from the evaluations stored there (module docstring).  Without a checkpoint it is gradient_of itself."""

    def __init__(self, case, gradient_of, checkpoint=None):
        self.gradient_of, self.checkpoint = gradient_of, checkpoint
        self.replay: list[Evaluation] = []  # stored evaluations not yet asked for again, in order
        self.replayed: list[Evaluation] = []  # stored evaluations asked for again, in order
        self.count = 0  # evaluations answered so far, replayed or made
        self.unsaved: list[Evaluation] = []
        self.notes: list[str] = []  # for the output's `notes` (kept across resumes): a replay that left its path
        self.state = {"case": case.text}
        self.start = _chain_start(case)
        self.stored, self.chain = 0, self.start  # evaluations in the checkpoint, the digest of its last one
        if checkpoint is not None and checkpoint.resume:
            state, segments = checkpoint.load(case)  # the journal's layout and chain verified (stored_problem)
            self.replay = [evaluation for segment in segments for evaluation in _evaluations(segment)]
            self.notes = list(state["notes"])
            self.stored, self.chain = len(self.replay), str(segments[-1]["digest"].values[-1])
        if checkpoint is not None:
            checkpoint.unit = "evaluation of J and dJ/dW"

    def __call__(self, controls: torch.Tensor) -> Gradient:
        point = controls.detach().cpu().double().numpy()
        if self.replay:
            evaluation = self.replay.pop(0)
            if np.array_equal(evaluation.controls, point):
                self.count += 1
                self.replayed.append(evaluation)
                if not self.replay:  # past the stored part: no request can leave it any more
                    self.replayed = []
                self.stop_if_interrupted()
                return _answer(evaluation, controls)
            note = (f"the resumed training left its stored path at evaluation {self.count + 1}: the "
                    f"{len(self.replay) + 1} stored evaluations from there on were made again")
            warnings.warn(note, RuntimeWarning, stacklevel=2)
            self.notes.append(note)
            # the checkpoint is written anew, from the evaluations still on the path, at its next write
            self.replay, self.unsaved = [], self.replayed
            self.stored, self.chain = 0, self.start
            self.checkpoint.forget_segments(kept=self.count)
        try:
            gradient = self.gradient_of(controls)
        except NumericalFailure as failure:
            self._keep(Evaluation(point, None, str(failure)))
            raise
        self._keep(Evaluation(point, gradient))
        return gradient

    def _keep(self, evaluation: Evaluation) -> None:
        self.count += 1
        if self.checkpoint is None:
            return
        self.unsaved.append(evaluation)
        if self.checkpoint.due(self.count):
            self.flush()
        self.stop_if_interrupted()

    def stop_if_interrupted(self) -> None:
        """An interrupt (Checkpoint.interrupt) asked for a stop: store what is not stored yet, then stop."""
        if self.checkpoint is not None and self.checkpoint.interrupted:
            self.flush()
            raise KeyboardInterrupt

    def flush(self) -> None:
        """Store the evaluations made since the last checkpoint (none: nothing is written)."""
        if self.checkpoint is None or not self.unsaved:
            return
        segment = _segment(self.unsaved, self.stored + 1, self.chain)
        try:
            self.checkpoint.write(dict(self.state, steps=self.count, notes=self.notes), segment, self.count)
        finally:
            if self.checkpoint.committed_steps == self.count:  # stored, even where an interrupt then stopped the write
                self.stored, self.chain = self.stored + len(self.unsaved), str(segment["digest"].values[-1])
                self.unsaved = []


def _answer(evaluation: Evaluation, controls: torch.Tensor) -> Gradient:
    """A stored evaluation as gradient_of returned it: its Gradient (dW in the dtype and on the device of
    `controls`), or its NumericalFailure raised again."""
    if evaluation.failure is not None:
        raise NumericalFailure(evaluation.failure)
    gradient = evaluation.gradient
    return Gradient(gradient.cost, gradient.loss, gradient.dW.to(controls), gradient.times,
                    gradient.adjoint_norm)


def _segment(evaluations: list[Evaluation], first: int, previous: str) -> xr.Dataset:
    """Evaluations number `first`, first + 1, ... as a checkpoint segment: `controls`, `dW` (evaluation, layer,
    row, col) (or (evaluation, layer, entry) for controls of two axes), `cost`, `loss` (evaluation), `times`,
    `adjoint_norm` (evaluation, step; NaN past an evaluation's own steps), `failure` (evaluation: the message, ""
    for none), `index` (evaluation: its number) and `digest`
    (evaluation: the chain of the module docstring, continued from the digest `previous`)."""
    shape = evaluations[0].controls.shape
    steps = max(len(e.gradient.times) if e.gradient else 0 for e in evaluations)

    def padded(values):
        return np.concatenate([np.asarray(values, float), np.full(steps - len(values), np.nan)])

    def field(get, default):
        return np.stack([get(e.gradient) if e.gradient else default for e in evaluations])

    matrices, series = _CONTROL_DIMS[len(shape)], ("evaluation", "step")
    return xr.Dataset({
        "controls": (matrices, np.stack([e.controls for e in evaluations])),
        "dW": (matrices, field(lambda g: g.dW.detach().cpu().double().numpy(), np.full(shape, np.nan))),
        "cost": ("evaluation", field(lambda g: g.cost, math.nan)),
        "loss": ("evaluation", field(lambda g: g.loss, math.nan)),
        "times": (series, field(lambda g: padded(g.times), np.full(steps, np.nan))),
        "adjoint_norm": (series, field(lambda g: padded(g.adjoint_norm), np.full(steps, np.nan))),
        "failure": ("evaluation", np.array([e.failure or "" for e in evaluations], dtype=str)),
        "index": ("evaluation", np.arange(first, first + len(evaluations), dtype=np.int64)),
        "digest": ("evaluation", np.array(_chained(evaluations, first, previous), dtype=str)),
    }, attrs={"title": "spherepde training checkpoint: evaluations of J and dJ/dW"})


def _evaluations(segment: xr.Dataset) -> list[Evaluation]:
    """The evaluations of a segment written by `_segment`."""
    evaluations = []
    for i in range(segment.sizes["evaluation"]):
        row = segment.isel(evaluation=i)
        failure = str(row["failure"].values)
        if failure:
            evaluations.append(Evaluation(row["controls"].values, None, failure))
            continue
        times = row["times"].values
        steps = ~np.isnan(times)
        gradient = Gradient(float(row["cost"]), float(row["loss"]), torch.as_tensor(row["dW"].values),
                            times[steps].tolist(), row["adjoint_norm"].values[steps].tolist())
        evaluations.append(Evaluation(row["controls"].values, gradient))
    return evaluations


def _chain_start(case) -> str:
    """digest_0 of the journal of `case`: SHA-256 of its resolved text."""
    return hashlib.sha256(case.text.encode()).hexdigest()


def _chained(evaluations: list[Evaluation], first: int, previous: str) -> list[str]:
    """The digests of evaluations number first, first + 1, ..., the chain continued from `previous`."""
    digests = []
    for index, evaluation in enumerate(evaluations, start=first):
        previous = _entry_digest(previous, index, evaluation)
        digests.append(previous)
    return digests


def _entry_digest(previous: str, index: int, evaluation: Evaluation) -> str:
    """SHA-256 of the previous digest, the evaluation's number and everything `_answer` returns from it, as
    float64 bytes (the values round-trip through NetCDF bit for bit)."""
    digest = hashlib.sha256(previous.encode() + struct.pack("<q", index))

    def add(values) -> None:
        data = np.ascontiguousarray(values, dtype="<f8")
        digest.update(struct.pack("<q", data.size) + data.tobytes())

    add(evaluation.controls)
    if evaluation.failure is not None:
        digest.update(b"failure:" + evaluation.failure.encode())
    else:
        gradient = evaluation.gradient
        add([float(gradient.cost), float(gradient.loss)])
        add(gradient.dW.detach().cpu().double().numpy())
        add(gradient.times)
        add(gradient.adjoint_norm)
    return digest.hexdigest()


# The controls' dimensions by their number of axes (layer first): matrices W_l, or a vector of entries per layer.
_CONTROL_DIMS = {3: ("evaluation", "layer", "row", "col"), 2: ("evaluation", "layer", "entry")}
_VARIABLES = {"cost": ("evaluation",), "loss": ("evaluation",), "times": ("evaluation", "step"),
              "adjoint_norm": ("evaluation", "step"), "failure": ("evaluation",), "index": ("evaluation",),
              "digest": ("evaluation",)}


def stored_problem(state: dict, state_path: str, segments: list, case) -> tuple[str, str] | None:
    """(file, why) when a training checkpoint of `case` is not a journal this module wrote for it, else None:
    every segment (path, Dataset in memory) holds the variables of `_segment`, controls of one shape on
    control.layers layers (the chain, which starts from the case's text, ties them to this training), entries
    numbered on from the segment before and chained from the case's digest_0 (module docstring); the
    state counts them all and holds the notes."""
    layers = case["control"]["layers"]
    previous, count, shape = _chain_start(case), 0, None
    for path, segment in segments:
        dims = {name: segment[name].dims for name in _VARIABLES if name in segment}
        controls = segment["controls"].dims if "controls" in segment and "dW" in segment else None
        if (dims != _VARIABLES or controls not in _CONTROL_DIMS.values() or segment["dW"].dims != controls
                or segment.sizes["evaluation"] == 0):
            return path, "does not hold a training's evaluations of J and dJ/dW (another kind of segment, or damaged)"
        shape = shape or segment["controls"].shape[1:]
        if (segment["controls"].shape[1:] != shape or segment["dW"].shape[1:] != shape
                or shape[0] != layers):
            return path, (f"holds controls of shape {segment['controls'].shape[1:]}, not of one shape on the case's "
                          f"control.layers = {layers} layers")
        try:
            evaluations = _evaluations(segment)
        except (TypeError, ValueError) as error:
            return path, f"holds an evaluation that cannot be read ({error})"
        for number, digest, evaluation in zip(segment["index"].values, segment["digest"].values, evaluations):
            count += 1
            if int(number) != count:
                return path, (f"holds evaluation {int(number)} where evaluation {count} follows: the journal's entries "
                              "are not in order and continuous")
            previous = _entry_digest(previous, count, evaluation)
            if str(digest) != previous:
                which = "first" if count == 1 else f"one after evaluation {count - 1}"
                return path, (f"holds an evaluation {count} that is not the {which} that this case's journal recorded "
                              "(its digest breaks the chain: edited, moved or of another training)")
    notes = state.get("notes")
    if state.get("steps") != count or not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
        return state_path, f"does not count the journal's {count} evaluations or lacks its notes"
    return None
