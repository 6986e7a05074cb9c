"""The layout of an Eulerian run's checkpoint (solvers.eulerian_recorder.Recorder.checkpoint_state): what its state and
segments must hold for `solvers.checkpoint.Checkpoint.verify` to resume from them (the rules: that module's
docstring, "Resuming").
"""

import math

import torch
import xarray as xr

from solvers.timegrid import TimeGrid
from spherepde.base.device import placement
from spherepde.io.output import DIAGNOSTIC_ATTRS


def eulerian_problem(state: dict, state_path: str, segments: list[tuple[str, xr.Dataset]],
                     case) -> tuple[str, str] | None:
    """(file, why) when the state or the segments are not what an Eulerian run of `case` writes, else None: the
    segments' save times in order and continuous on the case's save schedule from t = 0, each segment of this
    case and grid with every diagnostic, the state inside an interval of the run's time grid (solvers.timegrid: saves
    and layer boundaries) after the last save and before the next, its coefficients of the case's shape and dtype and
    finite."""
    from spherepde.discretisation.bases import basis_class

    timing = case["time"]
    t_end, save_every = timing["t_end"], timing["save_every"]
    time_grid = TimeGrid.from_case(case)  # its saves, and the intervals that saves and layer boundaries bound
    saves = time_grid.saves
    tolerance = 1e-9 * max(1.0, t_end)
    grid = basis_class(case.dim).grid_dims
    times, shapes = [], set()
    for path, segment in segments:
        if segment.attrs.get("case") != case.text:
            return path, "holds the saves of another case"
        missing = [name for name in ("density", *DIAGNOSTIC_ATTRS) if name not in segment]
        if missing or "time" not in segment.coords or segment.sizes["time"] == 0:
            return path, f"is not a segment of an Eulerian run (it lacks {', '.join(missing) or 'saves'})"
        if segment["density"].dims != ("time", *grid):
            return path, f"holds densities on {segment['density'].dims[1:]}, not on the case's grid {grid}"
        shapes.add(segment["density"].shape[1:])
        for t in segment["time"].values.astype(float):
            k = len(times)
            if not (k < len(saves) and abs(t - saves[k]) <= tolerance):
                previous = f"after t = {times[-1]:.6g}" if times else "as the first save"
                return path, (f"holds the save t = {t:.6g} {previous}: the segments' saves are not in order and "
                              f"continuous from t = 0 every {save_every:g} (time.save_every)")
            times.append(float(t))
    if len(shapes) > 1:
        return segments[-1][0], "holds densities on another grid than the segments before it"
    interval, substep, substeps, dt, t, c = (state.get(key) for key in ("interval", "substep", "substeps", "dt", "t",
                                                                      "c"))
    # the run's intervals end at saves and at layer boundaries (a model.W per layer): the state's lies after the
    # segments' last save and before the next
    intervals = time_grid.intervals
    known = is_int(interval) and 0 <= interval < len(intervals)
    t0, t1 = (intervals[interval].t0, intervals[interval].t1) if known else (times[-1], min(times[-1] + save_every,
                                                                                            t_end))
    expected = (placement("cpu", case["solver"]["dtype"]).complex,
                basis_class(case.dim).coefficient_shape(case["sphere"]["lmax"]))
    # in order: each check may take the ones before it as passed
    checks = [
        (lambda: state.get("t_end") == t_end, f"holds t_end = {state.get('t_end')!r}, not the case's {t_end:g}"),
        (lambda: known and times[-1] - tolerance <= t0 and (len(times) == len(saves) or t0 < saves[len(times)]),
         f"is in interval {interval!r} of the run, not in one after the segments' last save t = {times[-1]:.6g} "
         "and before the next"),
        (lambda: is_int(substeps) and substeps >= 1 and is_int(substep) and 0 <= substep <= substeps,
         f"is at step {substep!r} of {substeps!r}, which is no step of an interval"),
        (lambda: _is_real(dt) and dt > 0 and abs(substeps * dt - (t1 - t0)) <= tolerance,
         f"takes steps of dt = {dt!r}, which do not divide its interval [{t0:.6g}, {t1:.6g}] in {substeps!r}"),
        (lambda: _is_real(t) and abs(t - (t0 + substep * dt)) <= tolerance,
         f"is at t = {t!r}, not at step {substep!r} of dt after its interval's start t = {t0:.6g}"),
        (lambda: isinstance(c, torch.Tensor) and (c.dtype, tuple(c.shape)) == expected,
         f"holds coefficients of {_describe_tensor(c)}, not {expected[0]} of shape {expected[1]} "
         "(sphere.lmax, solver.dtype)"),
        (lambda: bool(torch.isfinite(torch.view_as_real(c)).all()), "holds coefficients that are not all finite"),
        (lambda: _recorder_layout(state.get("recorder"), t),
         "holds recorder scalars (steps, steps_at_save, wall_seconds, w2_error_bound, resolved_until, notes) unlike a "
         "run's"),
        (lambda: is_int(state.get("steps")) and state["steps"] == state["recorder"]["steps"] + substep,
         "holds a step count other than its recorder's plus its steps into the interval"),
    ]
    for passed, reason in checks:
        if not passed():
            return state_path, reason
    return None


def _recorder_layout(recorder, t) -> bool:
    """Whether `recorder` is the scalars Recorder.checkpoint_state stores."""
    if not isinstance(recorder, dict) or set(recorder) != {"steps", "steps_at_save", "wall_seconds", "w2_error_bound",
                                                           "resolved_until", "notes"}:
        return False
    until = recorder["resolved_until"]
    return (is_int(recorder["steps"]) and recorder["steps"] >= 0
            and is_int(recorder["steps_at_save"]) and 0 <= recorder["steps_at_save"] <= recorder["steps"]
            and _is_real(recorder["wall_seconds"]) and recorder["wall_seconds"] >= 0
            and _is_real(recorder["w2_error_bound"]) and recorder["w2_error_bound"] >= 0
            and (until is None or (_is_real(until) and _is_real(t) and 0 <= until <= t))
            and isinstance(recorder["notes"], list) and all(isinstance(note, str) for note in recorder["notes"]))


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _describe_tensor(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
