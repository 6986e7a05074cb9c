"""Results as xarray Datasets and NetCDF files (docs/design.md "Output").

Every file carries the fully resolved case text (attribute `case`), so the file alone
reproduces the run, and is written atomically: a temporary file in the target folder,
then a rename, so that no reader ever sees half a file.
"""

import datetime
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from spherepde.base import interrupts
from spherepde.base.errors import CaseError
from spherepde.base.version import VERSION
from spherepde.io.locking import TEMPORARY_TAG, one_writer
from spherepde.model.energy import LABEL as FREE_ENERGY_LABEL

DIAGNOSTIC_ATTRS = {
    "mass": ("total mass: int rho dsigma", "1"),
    "mean": ("mean position: int x drho", "1"),
    "order_parameter": ("norm of the mean position (particles.replicas > 1: the mean of the systems' norms)", "1"),
    "alignment_E": ("int |P_E x|^2 drho, E = leading eigenspace of V B^T", "1"),
    "alignment_F": ("int |P_F x|^2 drho, F = leading eigenspace of V", "1"),
    "lyapunov": ("V_p = int (|(I - P_E) x|^2 / |P_E x|^2)^p drho", "1"),
    "w2_projection": ("W2(rho_t, Pi_# rho_0), Pi(x) = P_E x / |P_E x|, chordal cost", "1"),
    "entropy": ("int rho log rho dsigma (rho floored at 0)", "1"),
    "interaction_energy": ("-1/2 int int exp(beta <x, B y>) drho drho (the kernel's pair integral; not by itself "
                           "an energy of the flow unless beta = 1 and V = B)", "1"),
    "free_energy": (FREE_ENERGY_LABEL, "1"),
    "min_density": ("minimum of rho on the grid", None),
    "spectral_tail": ("fraction of the L2 norm in degrees l > 2 lmax / 3", "1"),
}


def grid_coordinates(basis) -> tuple[dict, tuple, str]:
    """Coordinates, grid dims and density units of a basis (CF attributes included)."""
    density_units = f"{basis.measure_units}-1"
    if basis.dim == 2:
        n = basis.grid_shape[0]
        theta = xr.Variable("theta", 2 * np.pi * np.arange(n) / n,
                            {"units": "radian", "long_name": "angle on the circle S^1", "axis": "X"})
        return {"theta": theta}, basis.grid_dims, density_units
    lat = xr.Variable("lat", basis.latitude.cpu().numpy(),
                      {"units": "degrees_north", "standard_name": "latitude", "long_name": "Gauss latitude",
                       "axis": "Y"})
    lon = xr.Variable("lon", basis.longitude.cpu().numpy(),
                      {"units": "degrees_east", "standard_name": "longitude", "long_name": "longitude", "axis": "X"})
    return {"lat": lat, "lon": lon}, basis.grid_dims, density_units


def grid_points(dataset) -> np.ndarray:
    """Ambient coordinates of a result's grid (`grid_coordinates` undone): (ntheta, 2) on S^1 (theta in radians), (nlat,
    nlon, 3) on S^2 (lat, lon in degrees)."""
    if "theta" in dataset.dims:
        theta = dataset["theta"].values
        return np.stack([np.cos(theta), np.sin(theta)], axis=-1)
    lat, lon = np.meshgrid(np.deg2rad(dataset["lat"].values), np.deg2rad(dataset["lon"].values), indexing="ij")
    return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=-1)


@dataclass
class Saves:
    """What a run recorded at its save times, as plain values: the record a solver hands to this module.

    `attrs` are the run's own output attributes (docs/design.md "Output"), `solver` and `status` first; `densities` (rho
    on the grid) belong to an Eulerian run, `positions` (particles.save particles) and `tokens` (their indices among
    the run's particles.n) to a particle run."""

    case: Any
    times: list
    rows: list
    lyapunov_p: list
    attrs: dict
    densities: list = field(default_factory=list)
    positions: list = field(default_factory=list)
    tokens: Any = None


def eulerian_dataset(saves: Saves, basis) -> xr.Dataset:
    """The Dataset of an Eulerian run from its saves on the grid of `basis`."""
    coords, grid_dims, density_units = grid_coordinates(basis)
    area_units = basis.measure_units
    coords.update(common_coordinates(saves.times, basis.dim, saves.lyapunov_p))
    density_attrs = {"long_name": "probability density w.r.t. the surface measure", "units": density_units}
    if basis.dim == 3:  # CF cell_measures knows only area and volume: on S^1 cell_area is a plain variable
        density_attrs["cell_measures"] = "area: cell_area"
    data = {
        "density": (("time",) + grid_dims, np.stack(saves.densities), density_attrs),
        "cell_area": (grid_dims, basis.weights.cpu().double().numpy(),
                      {"long_name": "quadrature weight of the grid point", "units": area_units}),
    }
    data.update(diagnostic_variables(saves.rows))
    data["min_density"][2]["units"] = density_units  # a value of the density
    return finish(xr.Dataset(data, coords=coords), saves.case, saves.attrs)


def common_coordinates(times, dim: int, lyapunov_p) -> dict:
    """Coordinates shared by both solvers: time (nondimensional depth), component, lyapunov_p."""
    return {
        "time": xr.Variable("time", np.asarray(times, dtype=float),
                            {"units": "1", "long_name": "time (network depth), nondimensional"}),
        "component": xr.Variable("component", np.arange(dim), {"long_name": "ambient coordinate index"}),
        "lyapunov_p": xr.Variable("lyapunov_p", np.asarray(lyapunov_p, dtype=float),
                                  {"units": "1", "long_name": "exponent p of the Lyapunov functional"}),
    }


def diagnostic_dims(name: str) -> tuple:
    """The dimensions of the diagnostic `name` of DIAGNOSTIC_ATTRS in a run's file (a sweep's add `member` first)."""
    return ("time", "component") if name == "mean" else ("time", "lyapunov_p") if name == "lyapunov" else ("time",)


def diagnostic_variables(rows: list[dict]) -> dict:
    """Time series of docs/design.md "Diagnostics" from per-save dictionaries.

    Names missing from the rows are left out (grid-only diagnostics of a particle run); a
    row entry `<name>_stderr` (particle runs) becomes the variable `<name>_stderr`, and
    `<name>_squared_bias` (particle runs: w2_projection, for `spherepde compare`) the variable of that name.
    """
    variables = {}
    for name, (long_name, units) in DIAGNOSTIC_ATTRS.items():
        dims = diagnostic_dims(name)
        for key, description in ((name, long_name), (f"{name}_stderr", f"Monte Carlo standard error of {name}"),
                                 (f"{name}_squared_bias", f"estimated finite-n bias of the square of {name} "
                                  "(spherepde.measures.sample_statistics.half_sample_bias)")):
            if key in rows[0]:
                values = np.array([row[key] for row in rows], dtype=float)
                variables[key] = (dims, values, {"long_name": description} | ({"units": units} if units else {}))
    return variables


def particle_dataset(saves: Saves) -> xr.Dataset:
    """The Dataset of a particle run: diagnostics with standard errors and the saved particles."""
    coords = common_coordinates(saves.times, saves.case.dim, saves.lyapunov_p)
    data = diagnostic_variables(saves.rows)
    if saves.positions:
        coords["particle"] = xr.Variable("particle", np.asarray(saves.tokens),
                                         {"long_name": "index of a saved particle among the run's particles.n (the "
                                                       "first of each replica system)"})
        data["particles"] = (("time", "particle", "component"), np.stack(saves.positions),
                             {"long_name": "particle position on the unit sphere, ambient coordinates", "units": "1"})
    return finish(xr.Dataset(data, coords=coords), saves.case, saves.attrs)


BOTH_PREFIX = "particles_"
_SHARED_ATTRS = ("Conventions", "title", "history", "source", "case")


def both_dataset(eulerian: xr.Dataset, particles: xr.Dataset) -> xr.Dataset:
    """One Dataset for solver.method = "both": the Eulerian variables and attributes unchanged,
    the particle diagnostics and attributes prefixed with BOTH_PREFIX, positions as `particles`."""
    renamed = particles.rename({name: BOTH_PREFIX + name for name in particles.data_vars if name != "particles"})
    # outer join: a failed run's saves stop early, and the other run's later saves are kept (NaN-padded)
    combined = xr.merge([eulerian, renamed], join="outer", combine_attrs="override")
    combined.attrs.update({BOTH_PREFIX + key: value for key, value in particles.attrs.items()
                           if key not in _SHARED_ATTRS})
    combined.attrs["solver"] = "both"
    combined.attrs["title"] = combined.attrs["title"].replace("eulerian run", "eulerian and particles runs")
    return combined


def split_both(dataset: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """The (Eulerian, particles) Datasets of a "both" Dataset, each as its solver alone writes it."""
    if dataset.attrs.get("solver") != "both":
        raise CaseError(f"split_both: the Dataset is a {dataset.attrs.get('solver')!r} run, not one of "
                        "--solver both")
    particle_names = [name for name in dataset.data_vars if name.startswith(BOTH_PREFIX) or name == "particles"]
    particles = dataset[particle_names].rename({name: name.removeprefix(BOTH_PREFIX) for name in particle_names})
    particles = particles.drop_dims([dim for dim in ("theta", "lat", "lon") if dim in particles.dims])
    particles.attrs = {key: value for key, value in dataset.attrs.items() if key in _SHARED_ATTRS}
    particles.attrs.update({key.removeprefix(BOTH_PREFIX): value for key, value in dataset.attrs.items()
                            if key.startswith(BOTH_PREFIX)})
    eulerian = dataset.drop_vars(particle_names + [name for name in ("particle",) if name in dataset.coords])
    eulerian.attrs = {key: value for key, value in dataset.attrs.items() if not key.startswith(BOTH_PREFIX)}
    eulerian.attrs["solver"] = "eulerian"
    for run in (eulerian, particles):
        run.attrs["title"] = run.attrs["title"].replace("eulerian and particles runs", f"{run.attrs['solver']} run")
    return own_saves(eulerian), own_saves(particles)


def own_saves(run: xr.Dataset) -> xr.Dataset:
    """`run` without the saves that are not its own: in a "both" file the run that failed is NaN-padded after its
    failure (both_dataset's outer join), and those saves, where none of its time series has a value, are dropped."""
    series = [run[name].values.reshape(run.sizes["time"], -1) for name in run.data_vars
              if run[name].dims[:1] == ("time",) and run[name].dtype.kind == "f"]
    if not series:
        return run
    present = np.zeros(run.sizes["time"], dtype=bool)
    for values in series:
        present |= np.isfinite(values).any(axis=1)
    return run if present.all() else run.isel(time=np.flatnonzero(present))


def failed_parts(dataset: xr.Dataset) -> list[tuple[str, str, float | None]]:
    """The runs of a result file that failed, as (which: "eulerian" or "particles", its status "failed: ...",
    the time of its last good save or None when it has none); [] for a file whose runs all completed."""
    if dataset.attrs.get("solver") == "both":
        runs = zip(("eulerian", "particles"), split_both(dataset))
    else:
        runs = [(str(dataset.attrs.get("solver", "run")), dataset)]
    failed = []
    for which, run in runs:
        status = str(run.attrs.get("status", ""))
        if status.startswith("failed"):
            times = run["time"].values if "time" in run.coords else []
            failed.append((which, status, float(times[-1]) if len(times) else None))
    return failed


def time_text(t: float) -> str:
    """A saved time as `info` and the figures write it: to 6 significant digits, the save's own time (at 3, the
    profile of the save at t = 1.125 was labelled "t = 1.12" and one at 119.5 "t = 120"), without the round-off of
    k save_every (0.30000000000000004 reads "0.3")."""
    return f"{t:.6g}"


def failure_summary(which: str, last_good: float | None) -> str:
    """One of `failed_parts` in words, as `info` and the figures show it."""
    kept = "no save kept" if last_good is None else f"its saves end at t = {time_text(last_good)}, its last good state"
    return f"{which} run FAILED ({kept})"


def history(command: str) -> str:
    """A CF `history` entry: the time (UTC) and the spherepde `command` that made the file."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{now}: spherepde {VERSION} {command}"


def finish(dataset: xr.Dataset, case, attrs: dict) -> xr.Dataset:
    """Global attributes of docs/design.md "Output"."""
    dataset.attrs.update({
        "Conventions": "CF-1.10",
        "title": f"spherepde {attrs['solver']} run of case '{case.name}'",
        "history": history("run"),
        "source": f"spherepde {VERSION}",
        "case": case.text,
    })
    dataset.attrs.update({key: (str(value) if isinstance(value, list) else value) for key, value in attrs.items()})
    return dataset


def _folder_problem(folder: str) -> str | None:
    """Why files cannot be written in `folder` (made if missing), or None: the nearest part of it that
    exists must be a folder with write access."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing!r} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"no write access to {existing!r}"
    # os.access answers yes to root everywhere, /proc and read-only mounts included: make and remove an entry.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".spherepde-probe-", dir=existing))
    except OSError as error:
        return f"cannot create files in {existing!r} ({error.strerror or error})"
    return None


# The longest suffix the tool appends to the name of a file it writes: a figure's temporary file
# "<name>.<32 hex digits>.tmp.png" (plotting._save); write_dataset's "<name>.spherepde-XXXXXXXX.tmp" adds 23, a
# run's "<name>.checkpoint" folder 11 and its "<name>.lock" 5.
DERIVED_NAME_BYTES = 41
# The longest path the tool makes below an output: a checkpoint state's temporary file
# "<name>.checkpoint/state-00001.pt.<32 hex digits>.tmp" (solvers.checkpoint_files.write_atomically); a checkpoint
# segment, "<name>.checkpoint/segment-00000.nc" (28), with write_dataset's temporary file adds 51.
DERIVED_PATH_BYTES = 63
# what write_dataset itself adds to the path it writes: its temporary file, "<path>.spherepde-XXXXXXXX.tmp"
TEMPORARY_PATH_BYTES = len(TEMPORARY_TAG) + len("XXXXXXXX.tmp")


def _name_problem(path: str, derived_path: int = DERIVED_PATH_BYTES) -> str | None:
    """Why the files the tool derives from `path` (module constants above; paths `derived_path` bytes longer at
    most) would have names or paths longer than the file system takes, or None."""
    folder, name = os.path.split(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    size = len(os.fsencode(name))
    if size + DERIVED_NAME_BYTES > name_max:
        return (f"the name is too long: {size} bytes, and the files derived from it (temporary files, the checkpoint "
                f"folder) add up to {DERIVED_NAME_BYTES}; file names here take at most {name_max} bytes")
    length = len(os.fsencode(os.path.abspath(path)))
    if length + derived_path >= path_max:
        return (f"the path is too long: {length} bytes, and the files derived from it add up to "
                f"{derived_path}; paths here take fewer than {path_max} bytes")
    return None


_made_folders: list[str] = []  # folders make_folders created in this process, parents first


def make_folders(folder: str) -> None:
    """os.makedirs(folder, exist_ok=True), remembering the folders it creates, so that a command that fails can
    remove those it left empty (`settle_made_folders`)."""
    missing = []
    path = os.path.abspath(folder)
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    _made_folders.extend(reversed(missing))


def settle_made_folders(failed: bool) -> None:
    """At the end of a command: when it `failed`, remove the folders make_folders created that are empty now, the
    deepest first (a failed command leaves no empty folder behind; folders holding anything are kept); then
    forget them all."""
    while _made_folders:
        folder = _made_folders.pop()
        if failed:
            try:
                os.rmdir(folder)
            except OSError:  # not empty, or gone
                pass


def check_folder(folder: str, what: str) -> None:
    """A CaseError naming `what` unless `folder` is, or can be made, a folder we may write in."""
    problem = "empty path" if not folder else _folder_problem(folder)
    if problem:
        raise CaseError(f"{what} {folder!r}: {problem}")


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_file(path: str, what: str, derived_path: int = DERIVED_PATH_BYTES) -> None:
    """A CaseError naming `what` unless `path` can be written (made or replaced) as a regular file, and the files
    derived from it (paths `derived_path` bytes longer at most) beside or below it."""
    if not path or path.endswith(os.sep) or (os.altsep and path.endswith(os.altsep)):
        problem = "not a file name"
    elif os.path.lexists(path) and not os.path.isfile(path):
        problem = "exists and is not a regular file (a folder, device or broken link)"
    elif not _utf8(os.path.abspath(path)):
        # netCDF4 opens UTF-8 paths only: a Latin-1 name (lone surrogates in Python) failed the write after the run
        problem = "the path is not UTF-8 text (bytes in another encoding), which NetCDF cannot open; rename it"
    else:
        problem = _name_problem(path, derived_path) or _folder_problem(os.path.dirname(os.path.abspath(path)))
    if problem:
        raise CaseError(f"{what} {path!r}: {problem}")


# zlib with the byte shuffle on the large arrays (densities, particles, the adjoint): the quick-start at lmax 64
# went from 2.23 MB to 1.62 MB (float64 densities: their low mantissa bits do not compress) for 0.05 s, the same
# at level 1 and 4.  Short series grow under compression (a chunk index each): below COMPRESS_FROM values, none.
COMPRESSION = {"zlib": True, "complevel": 4, "shuffle": True}
COMPRESS_FROM = 4096


def netcdf_encoding(dataset: xr.Dataset) -> dict:
    """Coordinates without _FillValue; numeric variables of COMPRESS_FROM values or more compressed (COMPRESSION)."""
    encoding = {name: {"_FillValue": None} for name in dataset.coords}
    for name, variable in dataset.data_vars.items():
        if variable.dtype.kind in "biuf" and variable.size >= COMPRESS_FROM:
            encoding[name] = dict(COMPRESSION)
    return encoding


@one_writer
def write_dataset(dataset: xr.Dataset, path: str | os.PathLike) -> None:
    """Write NetCDF atomically: temporary file beside the target, then rename.

    Coordinates get no _FillValue (CF §2.5.1: coordinate variables have no missing values).
    A target that exists and is not a regular file (a folder, a device) is refused, not replaced. Only one
    process writes `path` at a time (locking.one_writer).
    """
    path = os.fspath(path)
    # only the temporary file is derived here: a run's checkpoint segments lie below its output, whose own check
    # (DERIVED_PATH_BYTES) has made room for them and for this
    check_file(path, "output", TEMPORARY_PATH_BYTES)
    folder = os.path.dirname(os.path.abspath(path))
    make_folders(folder)
    handle, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + TEMPORARY_TAG, suffix=".tmp", dir=folder)
    os.close(handle)
    try:
        # an interrupt inside xarray's write would hang it on its own lock: it acts once the file is in place
        with interrupts.held():
            dataset.to_netcdf(temporary, engine="netcdf4", encoding=netcdf_encoding(dataset))
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)  # mkstemp made it private; give it a normal file's mode
            os.replace(temporary, path)
    except BaseException as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        if isinstance(error, RuntimeError):  # how netCDF4 reports a failed write: a full disk, a quota
            raise OSError(f"cannot write {path!r}: {error} (is the disk full?)") from None
        raise
