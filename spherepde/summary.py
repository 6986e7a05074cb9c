"""`spherepde info`: a plain-text summary of a result file."""

import numpy as np
import xarray as xr

from .errors import CaseError

SCALARS = ["mass", "order_parameter", "alignment_E", "alignment_F", "w2_projection", "entropy",
           "interaction_energy", "free_energy", "min_density", "spectral_tail"]


def open_result(path: str) -> xr.Dataset:
    """Open a result file, or a one-line CaseError naming it."""
    try:
        return xr.open_dataset(path)
    except (OSError, ValueError) as error:
        raise CaseError(f"cannot read result {path!r}: {error}") from None


def describe(path: str) -> str:
    with open_result(path) as dataset:
        attrs = dataset.attrs
        lines = [f"{path}: {attrs.get('title', '(no title)')}",
                 f"  solver {attrs.get('solver')}, status {attrs.get('status')}, source {attrs.get('source')}"]
        lines.append("  " + ", ".join(f"{name} = {attrs[name]}" for name in
                                      ("backend", "grid", "grid_shape", "lmax", "dtype", "device", "field", "scheme",
                                       "steps", "wall_seconds", "resolved_until") if name in attrs))
        lines.append("  dims: " + ", ".join(f"{k} = {v}" for k, v in dataset.sizes.items()))
        if "time" in dataset.coords and dataset.sizes["time"]:
            times = dataset["time"].values
            lines.append(f"  time: {times[0]:g} .. {times[-1]:g} ({len(times)} saves)")
            lines.append(f"  {'diagnostic':<20} {'first':>14} {'last':>14}")
            for name in SCALARS:
                if name in dataset:
                    values = np.asarray(dataset[name].values)
                    lines.append(f"  {name:<20} {values[0]:>14.8g} {values[-1]:>14.8g}")
        if attrs.get("notes"):
            lines.append(f"  notes: {attrs['notes']}")
        return "\n".join(lines)
