"""`spherepde info`: a plain-text summary of a result file."""

import contextlib
import numbers
import os
from pathlib import Path

import numpy as np
import xarray as xr

from spherepde.base.errors import CaseError, damaged, printable, unreadable
from spherepde.discretisation.transforms.legendre import check_grid
from spherepde.io.case_files import regular_file_problem
from spherepde.io.output import BOTH_PREFIX, DIAGNOSTIC_ATTRS, diagnostic_dims, failed_parts, failure_summary

# what a run's line of attributes shows: the grid's and the solver's, then a particle run's (a "both" file's particle
# run's on the particles' line)
RUN_ATTRIBUTES = ("backend", "grid", "grid_shape", "lmax", "dtype", "device", "field", "scheme", "steps",
                  "wall_seconds", "resolved_until")
PARTICLE_ATTRIBUTES = ("n", "replicas", "seed", "integrator", "attention", "dt")
SCALARS = ["mass", "order_parameter", "alignment_E", "alignment_F", "w2_projection", "entropy",
           "interaction_energy", "free_energy", "min_density", "spectral_tail"]


@contextlib.contextmanager
def reading(path: str):
    """Read the result `path` inside: netCDF4's error of a damaged file (base.errors.damaged) becomes a one-line
    CaseError naming it, wherever xarray's lazy reads meet it: at the open, in check_run, or where a reader first
    touches the damaged variable (plot's particles, compare's load), each a traceback and exit 1 before."""
    try:
        yield
    except (RuntimeError, AttributeError) as error:
        if not damaged(error):
            raise
        raise CaseError(f"cannot read result {os.fspath(path)!r}: {error}: the file is damaged") from None


def open_result(path: str) -> xr.Dataset:
    """Open a file that spherepde wrote (a run, a sweep, a comparison), or a one-line CaseError naming it (and,
    where the file is missing but a run's checkpoint folder is there, saying that the run is unfinished; where the
    netCDF library cannot read it, that it is damaged: `reading`)."""
    with reading(path):
        return _open_result(os.fspath(path))


def _open_result(path: str) -> xr.Dataset:
    """open_result, its netCDF errors left to `reading`."""
    output = path.removesuffix(".checkpoint")
    if os.path.isdir(output + ".checkpoint") and (path != output or not os.path.exists(path)):
        raise CaseError(f"cannot read result {path!r}: the run writing {output!r} is unfinished (its checkpoint "
                        f"{output + '.checkpoint'!r} is there); continue it with: spherepde run CASE -o {output} "
                        "--resume")
    try:
        problem = regular_file_problem(Path(path))
    except OSError:  # missing or out of reach: xarray's error below names it
        problem = None
    if problem:  # a named pipe without a writer hung the reader here, a folder met HDF's own words
        raise CaseError(f"cannot read result {path!r}: it {problem}")
    try:
        dataset = xr.open_dataset(path)
    except (OSError, ValueError) as error:
        raise CaseError(f"cannot read result {path!r}: {unreadable(error)}") from None
    source = str(dataset.attrs.get("source", ""))
    if not source.startswith("spherepde"):
        dataset.close()
        found = f"its 'source' attribute is {source!r}" if source else "it has no 'source' attribute"
        raise CaseError(f"{path!r} is not a spherepde result ({found})")
    if "time" in dataset.coords and "time" not in dataset.dims:
        dataset.close()
        raise CaseError(f"{path!r} holds one save with time as a number, not an axis (a selection such as "
                        "ds.sel(time=2.0)); keep the axis: ds.sel(time=[2.0])")
    if "report" not in dataset.attrs:  # a comparison report has a structure of its own
        try:
            check_run(dataset)
        except CaseError as error:
            dataset.close()
            raise CaseError(f"{path!r} is not a readable spherepde result: {error}") from None
    return dataset


def _count(value, least: int) -> bool:
    """Whether an attribute is an integer (not a bool) >= least."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least


def _float_dtype(value) -> bool:
    """Whether an attribute names a floating-point numpy dtype."""
    try:
        return isinstance(value, str) and np.dtype(value).kind == "f"
    except TypeError:
        return False


def _bound(value) -> bool:
    """Whether an attribute is a finite real number >= 0."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 <= value < np.inf


# The attributes the readers (compare, plot, info) compute with, each with its test and the rule it states; in a
# "both" file the particle run's carry BOTH_PREFIX.
ATTRIBUTE_RULES = {
    "lmax": (lambda value: _count(value, 0), "an integer >= 0"),
    "n": (lambda value: _count(value, 1), "an integer >= 1"),
    "replicas": (lambda value: _count(value, 1), "an integer >= 1"),
    "dtype": (_float_dtype, "a floating-point dtype such as 'float64'"),
    "w2_quantisation_bound": (_bound, "a finite number >= 0"),
}
# Below this fraction of its L2 norm a circle density's Fourier modes above lmax are round-off (float32: ~4e-8);
# above it the file's lmax is not the density's, and a reader re-synthesising from lmax modes would cut it.
BAND_LIMIT_TOLERANCE = 1e-5


def check_run(dataset: xr.Dataset) -> None:
    """A CaseError naming the first way in which `dataset` is not a run (or sweep) as spherepde writes one: the
    attributes of ATTRIBUTE_RULES of their types and ranges, a non-empty, finite, increasing time coordinate, numeric
    diagnostics with their dimensions (diagnostic_dims), a training's loss beside its iteration axis, a density on
    the grid coordinates its dimensions name (with `cell_area` on S^2) that lmax fits (docs/design.md "Numerics"), at
    least one saved particle.  Called where a file is opened, so that every reader computes with these and none
    fails half-way through a file."""
    for name, (valid, rule) in ATTRIBUTE_RULES.items():
        for key in (name, BOTH_PREFIX + name):
            if key in dataset.attrs and not valid(dataset.attrs[key]):
                value = dataset.attrs[key]
                shown = repr(value) if isinstance(value, str) else value
                raise CaseError(f"its attribute {key} = {shown} is not {rule}")
    if "time" in dataset.dims:
        if "time" not in dataset.coords:
            raise CaseError("its time axis has no coordinate: the save times are not in the file")
        times = dataset["time"].values
        if times.size == 0:
            raise CaseError("its time axis is empty (no save)")
        if times.dtype.kind not in "iuf" or not np.isfinite(times).all() or (np.diff(times) <= 0).any():
            raise CaseError("its time coordinate is not finite and increasing")
    components = dataset.sizes.get("component")
    for name in dataset.data_vars:
        base = name.removeprefix(BOTH_PREFIX).removesuffix("_stderr").removesuffix("_squared_bias")
        if base in DIAGNOSTIC_ATTRS or base in ("density", "particles", "cell_area"):
            if dataset[name].dtype.kind not in "iuf":
                raise CaseError(f"its variable {name} holds {dataset[name].dtype} values, not numbers")
        if base in ("mean", "particles") and ((components or 0) < 2 or "component" not in dataset[name].dims):
            raise CaseError(f"its variable {name} has no component dimension of 2 or more (dims {dataset[name].dims}; "
                            "particles on S^(d-1) have d)")
        if base in DIAGNOSTIC_ATTRS and dataset[name].dims not in (diagnostic_dims(base),
                                                                    ("member",) + diagnostic_dims(base)):
            raise CaseError(f"its variable {name} has dimensions {dataset[name].dims}, not {diagnostic_dims(base)} "
                            "(a sweep's with member first)")
    if "iteration" in dataset.dims and "loss" not in dataset.data_vars:
        raise CaseError("it has an iteration axis but no loss (a training's J at each iteration)")
    if "particles" in dataset.data_vars and dataset.sizes.get("particle", 0) == 0:
        raise CaseError("it holds no saved particle (the particle axis is empty)")
    if "density" in dataset.data_vars:
        _check_grid(dataset)


def _check_grid(dataset: xr.Dataset) -> None:
    """The density's grid: its coordinates, lmax and the quadrature weights of S^2 (check_run)."""
    dims = dataset["density"].dims
    if "lmax" not in dataset.attrs:
        raise CaseError("it has a density but no lmax attribute: its spectral series is unknown")
    lmax = int(dataset.attrs["lmax"])
    if dims[-1:] == ("theta",) and "theta" in dataset.coords and dataset.sizes.get("component") == 2:
        points = dataset.sizes["theta"]
        if points <= 2 * lmax:
            raise CaseError(f"its {points} angles theta cannot hold lmax {lmax} (a circle grid needs more than "
                            "2 lmax points)")
        spectrum = np.square(np.abs(np.fft.rfft(_first_finite_save(dataset["density"]), axis=-1)))
        with np.errstate(invalid="ignore", divide="ignore"):
            above = np.sqrt(spectrum[..., lmax + 1:].sum(-1) / spectrum.sum(-1))
        if (above > BAND_LIMIT_TOLERANCE).any():
            raise CaseError(f"its density holds Fourier modes above its lmax = {lmax} (up to {np.nanmax(above):.2g} "
                            "of its L2 norm): lmax is not the density's")
    elif dims[-2:] == ("lat", "lon") and {"lat", "lon"} <= set(dataset.coords) and dataset.sizes.get("component") == 3:
        if "cell_area" not in dataset.data_vars or dataset["cell_area"].dims != ("lat", "lon"):
            raise CaseError("its density on S^2 has no cell_area (lat, lon), the quadrature weights")
        try:
            check_grid(lmax, dataset.sizes["lat"], dataset.sizes["lon"])
        except ValueError as error:
            raise CaseError(f"its grid ({dataset.sizes['lat']}, {dataset.sizes['lon']}) cannot hold lmax {lmax}: "
                            f"{error}") from None
        _first_finite_save(dataset["density"])
    else:
        raise CaseError(f"its density has dimensions {dims}, not (time, theta) on S^1 with 2 components or "
                        "(time, lat, lon) on S^2 with 3, with those coordinates")


def _first_finite_save(density: xr.DataArray) -> np.ndarray:
    """The first save of `density` (time, ...) finite everywhere (a failed run's later saves are NaN padding), read
    alone (a run's first save is finite, and a file of many saves is not read whole where it is opened); a
    CaseError where none is.  In a sweep, everywhere but on the members without results (NaN at every save)."""
    for index in range(density.sizes["time"]):
        save = density.isel(time=index)
        values = save.values
        finite = np.isfinite(values)
        if "member" in save.dims:  # a member is finite or, without results, NaN at every point of a save
            finite = np.moveaxis(finite, save.dims.index("member"), 0).reshape(save.sizes["member"], -1)
            if finite.any() and (finite.all(axis=1) | ~finite.any(axis=1)).all():
                return values
        elif finite.all():
            return values
    raise CaseError("its density is not finite at any save")


def _attribute(value) -> str:
    """An attribute or a save time as text, a float to 10 significant digits (a save time 3 x 0.1 reads 0.3, not
    0.30000000000000004; t_end = 1.234375 reads so, not 1.23438)."""
    return f"{value:.10g}" if isinstance(value, (float, np.floating)) else str(value)


def describe(path: str) -> str:
    with reading(path), open_result(path) as dataset:
        attrs = dataset.attrs
        if "report" in attrs:  # a `spherepde compare` report: its table
            return "\n".join(map(printable, [f"{path}: {attrs.get('title', '(no title)')}",
                                             *("  " + line for line in str(attrs["report"]).splitlines())]))
        lines = [f"{path}: {attrs.get('title', '(no title)')}",
                 f"  solver {attrs.get('solver')}, status {attrs.get('status')}, source {attrs.get('source')}"]
        if BOTH_PREFIX + "status" in attrs:
            lines.append(f"  particles: status {attrs[BOTH_PREFIX + 'status']}, "
                         + _attribute_list(attrs, PARTICLE_ATTRIBUTES + ("steps", "wall_seconds"), BOTH_PREFIX))
        if "member" not in dataset.dims:
            lines += [f"  {failure_summary(which, last_good)}" for which, _, last_good in failed_parts(dataset)]
        lines.append("  " + _attribute_list(attrs, RUN_ATTRIBUTES + PARTICLE_ATTRIBUTES))
        lines.append("  dims: " + ", ".join(f"{k} = {v}" for k, v in dataset.sizes.items()))
        if "member" in dataset.dims:
            lines += _member_lines(dataset)
        elif "time" in dataset.coords and dataset.sizes["time"]:
            times = dataset["time"].values
            lines.append(f"  time: {_attribute(times[0])} .. {_attribute(times[-1])} "
                         f"({len(times)} save{'s' if len(times) > 1 else ''})")
            lines.append(f"  {'diagnostic':<28} {'first':>14} {'last':>14}  (last: the last save that has it)")
            for name in SCALARS + [BOTH_PREFIX + name for name in SCALARS]:  # a "both" file holds both runs'
                if name in dataset:
                    values = np.asarray(dataset[name].values)
                    present = values[~np.isnan(values)]  # a failed run of a "both" file stops early
                    last = present[-1] if len(present) else np.nan
                    lines.append(f"  {name:<28} {values[0]:>14.8g} {last:>14.8g}")
        if "loss" in dataset and "member" not in dataset.dims:
            lines += _training_lines(dataset)
        # a "both" file's particle run keeps its own notes (a step too long for the drift: its law may be wrong)
        lines += [f"  note: {which}{note}" for prefix, which in (("", ""), (BOTH_PREFIX, "particles: "))
                  for note in str(attrs.get(prefix + "notes", "")).splitlines() if note.strip()]
        return "\n".join(map(printable, lines))  # every line quotes the file: shown, never obeyed by the terminal


def _attribute_list(attrs, names: tuple, prefix: str = "") -> str:
    """"name = value, ..." of the attributes prefix + name that `attrs` has, named without the prefix."""
    return ", ".join(f"{name} = {_attribute(attrs[prefix + name])}" for name in names if prefix + name in attrs)


def _course(loss: np.ndarray) -> str:
    """J first and last of a loss history (a sweep pads a shorter one with NaN)."""
    loss = loss[~np.isnan(loss)]
    return f"J {loss[0]:.8g} -> {loss[-1]:.8g} over {len(loss) - 1} iterations" if len(loss) else "no iteration"


# The parameter variables of a training's file (solvers.training_output.parameter_variables), each (layer, ...).
PARAMETERS = ("W", "W1", "b", "W2", "B", "V")


def _training_lines(dataset) -> list[str]:
    """A training file: its optimizer's course (J first and last, why it stopped), the Frobenius norm per layer of
    each parameter it stores (W, or an MLP's W1, b, W2; B and V beyond the seeds' model, over their heads) and the
    seed-004 attributes."""
    attrs = dataset.attrs
    lines = [f"  training: {attrs.get('optimizer')}, {_course(dataset['loss'].values)}; "
             f"stop: {attrs.get('optimizer_stop')}"]
    for name in PARAMETERS:
        if name in dataset and dataset[name].dims[0] == "layer":
            values = dataset[name].values
            with np.errstate(over="ignore"):  # a W that blew a run up prints as inf
                norms = np.linalg.norm(values.reshape(len(values), -1), axis=1)
            lines.append(f"  |{name}_l|_F per layer: " + " ".join(f"{norm:.3g}" for norm in norms))
    names = ("three_phase", "plateau_width", "terminal_displacement", "escape_rate", "rayleigh_quotient")
    found = [f"{name} = {_attribute(attrs[name])}" for name in names if name in attrs]
    if found:
        lines.append("  " + ", ".join(found))
    return lines


def _member_lines(dataset) -> list[str]:
    """A sweep file: one line per member with its swept values, status and final order parameter (a member whose
    saves end earlier, failed: with the time of its last)."""
    swept = [name for name in dataset.coords if dataset[name].dims == ("member",) and name != "member"]
    lines = ["  " + " ".join(f"{name:>14}" for name in ["member", *swept, "order_parameter"]) + " status"]
    end = dataset["time"].values[-1]
    for i in range(dataset.sizes["member"]):
        final = dataset["order_parameter"].isel(member=i).dropna("time") if "order_parameter" in dataset else []
        cells = [str(int(dataset["member"].values[i]))] + [f"{dataset[name].values[i]}" for name in swept]
        if len(final):
            last = final["time"].values[-1]
            cells.append(f"{final.values[-1]:.8g}" + (f" at t = {last:.6g}" if last < end else ""))
        else:
            cells.append("-")
        status = dataset["member_status"].values[i] if "member_status" in dataset else "-"
        lines.append("  " + " ".join(f"{cell:>14}" for cell in cells) + f" {status}")
    if "loss" in dataset:  # a sweep of trainings: each member's course
        lines += [f"  member {int(dataset['member'].values[i])} training: {_course(loss)}"
                  for i, loss in enumerate(dataset["loss"].transpose("member", ...).values)]
    return lines
