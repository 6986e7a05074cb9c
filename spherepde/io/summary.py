"""`spherepde info`: a plain-text summary of a result file."""

import os

import numpy as np
import xarray as xr

from spherepde.base.errors import CaseError, printable, unreadable
from spherepde.io.output import BOTH_PREFIX, failed_parts, failure_summary

SCALARS = ["mass", "order_parameter", "alignment_E", "alignment_F", "w2_projection", "entropy",
           "interaction_energy", "free_energy", "min_density", "spectral_tail"]


def open_result(path: str) -> xr.Dataset:
    """Open a file that spherepde wrote (a run, a sweep, a comparison), or a one-line CaseError naming it."""
    if os.path.isdir(path):
        raise CaseError(f"cannot read result {path!r}: it is a folder")
    try:
        dataset = xr.open_dataset(path)
    except (OSError, ValueError) as error:
        raise CaseError(f"cannot read result {path!r}: {unreadable(error)}") from None
    source = str(dataset.attrs.get("source", ""))
    if not source.startswith("spherepde"):
        dataset.close()
        raise CaseError(f"{path!r} is not a spherepde result (its 'source' attribute is {source or 'missing'!r})")
    if "time" in dataset.coords and "time" not in dataset.dims:
        dataset.close()
        raise CaseError(f"{path!r} holds one save with time as a number, not an axis (a selection such as "
                        "ds.sel(time=2.0)); keep the axis: ds.sel(time=[2.0])")
    return dataset


def _attribute(value) -> str:
    """An attribute as text, a float to 10 significant digits (a save time 3 x 0.1 reads 0.3, not
    0.30000000000000004)."""
    return f"{value:.10g}" if isinstance(value, (float, np.floating)) else str(value)


def describe(path: str) -> str:
    with open_result(path) as dataset:
        attrs = dataset.attrs
        if "report" in attrs:  # a `spherepde compare` report: its table
            return "\n".join(map(printable, [f"{path}: {attrs.get('title', '(no title)')}",
                                             *("  " + line for line in str(attrs["report"]).splitlines())]))
        lines = [f"{path}: {attrs.get('title', '(no title)')}",
                 f"  solver {attrs.get('solver')}, status {attrs.get('status')}, source {attrs.get('source')}"]
        if BOTH_PREFIX + "status" in attrs:
            lines.append(f"  particles: status {attrs[BOTH_PREFIX + 'status']}")
        if "member" not in dataset.dims:
            lines += [f"  {failure_summary(which, last_good)}" for which, _, last_good in failed_parts(dataset)]
        lines.append("  " + ", ".join(f"{name} = {_attribute(attrs[name])}" for name in
                                      ("backend", "grid", "grid_shape", "lmax", "dtype", "device", "field", "scheme",
                                       "steps", "wall_seconds", "resolved_until") if name in attrs))
        lines.append("  dims: " + ", ".join(f"{k} = {v}" for k, v in dataset.sizes.items()))
        if "member" in dataset.dims:
            lines += _member_lines(dataset)
        elif "time" in dataset.coords and dataset.sizes["time"]:
            times = dataset["time"].values
            lines.append(f"  time: {times[0]:g} .. {times[-1]:g} ({len(times)} saves)")
            lines.append(f"  {'diagnostic':<28} {'first':>14} {'last':>14}  (last: the last save that has it)")
            for name in SCALARS + [BOTH_PREFIX + name for name in SCALARS]:  # a "both" file holds both runs'
                if name in dataset:
                    values = np.asarray(dataset[name].values)
                    present = values[~np.isnan(values)]  # a failed run of a "both" file stops early
                    last = present[-1] if len(present) else np.nan
                    lines.append(f"  {name:<28} {values[0]:>14.8g} {last:>14.8g}")
        if "loss" in dataset and "member" not in dataset.dims:
            lines += _training_lines(dataset)
        lines += [f"  note: {note}" for note in str(attrs.get("notes", "")).splitlines() if note.strip()]
        return "\n".join(map(printable, lines))  # every line quotes the file: shown, never obeyed by the terminal


def _course(loss: np.ndarray) -> str:
    """J first and last of a loss history (a sweep pads a shorter one with NaN)."""
    loss = loss[~np.isnan(loss)]
    return f"J {loss[0]:.8g} -> {loss[-1]:.8g} over {len(loss) - 1} iterations" if len(loss) else "no iteration"


def _training_lines(dataset) -> list[str]:
    """A training file: its optimizer's course (J first and last, why it stopped), |W| per layer and the
    seed-004 attributes."""
    attrs = dataset.attrs
    lines = [f"  training: {attrs.get('optimizer')}, {_course(dataset['loss'].values)}; "
             f"stop: {attrs.get('optimizer_stop')}"]
    if "W" in dataset:
        with np.errstate(over="ignore"):  # a W that blew a run up prints as inf
            norms = np.linalg.norm(dataset["W"].values, axis=(1, 2))
        lines.append("  |W_l|_F per layer: " + " ".join(f"{norm:.3g}" for norm in norms))
    names = ("three_phase", "plateau_width", "terminal_displacement", "escape_rate", "rayleigh_quotient")
    found = [f"{name} = {_attribute(attrs[name])}" for name in names if name in attrs]
    if found:
        lines.append("  " + ", ".join(found))
    return lines


def _member_lines(dataset) -> list[str]:
    """A sweep file: one line per member with its swept values, status and final order parameter."""
    swept = [name for name in dataset.coords if dataset[name].dims == ("member",) and name != "member"]
    lines = ["  " + " ".join(f"{name:>14}" for name in ["member", *swept, "order_parameter"]) + " status"]
    for i in range(dataset.sizes["member"]):
        final = dataset["order_parameter"].isel(member=i).dropna("time").values if "order_parameter" in dataset else []
        cells = [str(int(dataset["member"].values[i]))] + [f"{dataset[name].values[i]}" for name in swept]
        cells.append(f"{final[-1]:.8g}" if len(final) else "-")
        lines.append("  " + " ".join(f"{cell:>14}" for cell in cells) + f" {dataset['member_status'].values[i]}")
    if "loss" in dataset:  # a sweep of trainings: each member's course
        lines += [f"  member {int(dataset['member'].values[i])} training: {_course(loss)}"
                  for i, loss in enumerate(dataset["loss"].transpose("member", ...).values)]
    return lines
