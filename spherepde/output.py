"""Results as xarray Datasets and NetCDF files (DESIGN §6).

Every file carries the fully resolved case text (attribute `case`), so the file alone
reproduces the run, and is written atomically: a temporary file in the target folder,
then a rename, so that no reader ever sees half a file.
"""

import datetime
import os
import tempfile
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import xarray as xr

DIAGNOSTIC_ATTRS = {
    "mass": ("total mass: int rho dsigma", "1"),
    "mean": ("mean position: int x drho", "1"),
    "order_parameter": ("norm of the mean position", "1"),
    "alignment_E": ("int |P_E x|^2 drho, E = leading eigenspace of V B^T", "1"),
    "alignment_F": ("int |P_F x|^2 drho, F = leading eigenspace of V", "1"),
    "lyapunov": ("V_p = int (|(I - P_E) x|^2 / |P_E x|^2)^p drho", "1"),
    "w2_projection": ("W2(rho_t, Pi_# rho_0), Pi(x) = P_E x / |P_E x|, chordal cost", "1"),
    "entropy": ("int rho log rho dsigma (rho floored at 0)", "1"),
    "interaction_energy": ("-1/2 int int exp(beta <x, B y>) drho drho", "1"),
    "free_energy": ("eps * entropy + interaction_energy", "1"),
    "min_density": ("minimum of rho on the grid", None),
    "spectral_tail": ("fraction of the L2 norm in degrees l > 2 lmax / 3", "1"),
}


def package_version() -> str:
    try:
        return version("spherepde")
    except PackageNotFoundError:
        return "unknown"


def grid_coordinates(basis) -> tuple[dict, tuple, str]:
    """Coordinates, grid dims and density units of a basis (CF attributes included)."""
    if basis.dim == 2:
        n = basis.grid_shape[0]
        theta = xr.Variable("theta", 2 * np.pi * np.arange(n) / n,
                            {"units": "radian", "long_name": "angle on the circle S^1"})
        return {"theta": theta}, ("theta",), "radian-1"
    lat = xr.Variable("lat", basis.latitude.cpu().numpy(),
                      {"units": "degrees_north", "standard_name": "latitude", "long_name": "Gauss latitude",
                       "axis": "Y"})
    lon = xr.Variable("lon", basis.longitude.cpu().numpy(),
                      {"units": "degrees_east", "standard_name": "longitude", "long_name": "longitude", "axis": "X"})
    return {"lat": lat, "lon": lon}, ("lat", "lon"), "sr-1"


def eulerian_dataset(recorder, status: str) -> xr.Dataset:
    """The Dataset of an Eulerian run from its recorded saves."""
    problem, case = recorder.problem, recorder.case
    basis = problem.basis
    coords, grid_dims, density_units = grid_coordinates(basis)
    area_units = "radian" if basis.dim == 2 else "sr"
    coords.update(common_coordinates(recorder.times, basis.dim, recorder.lyapunov_p))
    data = {
        "density": (("time",) + grid_dims, np.stack(recorder.densities),
                    {"long_name": "probability density w.r.t. the surface measure", "units": density_units,
                     "cell_measures": "area: cell_area" if basis.dim == 3 else "length: cell_area"}),
        "cell_area": (grid_dims, basis.weights.cpu().double().numpy(),
                      {"long_name": "quadrature weight of the grid point", "units": area_units}),
    }
    data.update(diagnostic_variables(recorder.rows))
    attrs = {
        "solver": "eulerian",
        "status": status,
        "backend": getattr(basis, "backend", "torch-fft"),
        "grid": "uniform" if basis.dim == 2 else "gauss-legendre",
        "grid_shape": list(basis.grid_shape),
        "lmax": basis.lmax,
        "dtype": problem.placement.name,
        "device": str(problem.placement.device),
        "field": problem.exp_kernel.name,
        "scheme": recorder.scheme,
        "steps": int(recorder.steps),
        "wall_seconds": float(recorder.wall_seconds),
        "w2_quantisation_bound": float(recorder.w2_error_bound),
        "resolved_until": "end" if recorder.resolved_until is None else float(recorder.resolved_until),
        "notes": "\n".join(recorder.notes),
    }
    return finish(xr.Dataset(data, coords=coords), case, attrs)


def common_coordinates(times, dim: int, lyapunov_p) -> dict:
    """Coordinates shared by both solvers: time (nondimensional depth), component, lyapunov_p."""
    return {
        "time": xr.Variable("time", np.asarray(times, dtype=float),
                            {"units": "1", "long_name": "time (network depth), nondimensional"}),
        "component": xr.Variable("component", np.arange(dim), {"long_name": "ambient coordinate index"}),
        "lyapunov_p": xr.Variable("lyapunov_p", np.asarray(lyapunov_p, dtype=float),
                                  {"units": "1", "long_name": "exponent p of the Lyapunov functional"}),
    }


def diagnostic_variables(rows: list[dict]) -> dict:
    """Time series of DESIGN §4 from per-save dictionaries."""
    variables = {}
    for name, (long_name, units) in DIAGNOSTIC_ATTRS.items():
        values = np.array([row[name] for row in rows], dtype=float)
        dims = ("time", "component") if name == "mean" else ("time", "lyapunov_p") if name == "lyapunov" else ("time",)
        attrs = {"long_name": long_name} | ({"units": units} if units else {})
        variables[name] = (dims, values, attrs)
    return variables


def finish(dataset: xr.Dataset, case, attrs: dict) -> xr.Dataset:
    """Global attributes of DESIGN §6."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    dataset.attrs.update({
        "Conventions": "CF-1.10",
        "title": f"spherepde {attrs['solver']} run of case '{case.name}'",
        "history": f"{now}: spherepde {package_version()} run",
        "source": f"spherepde {package_version()}",
        "case": case.text,
    })
    dataset.attrs.update({key: (str(value) if isinstance(value, list) else value) for key, value in attrs.items()})
    return dataset


def write_dataset(dataset: xr.Dataset, path: str | os.PathLike) -> None:
    """Write NetCDF atomically: temporary file beside the target, then rename."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(handle)
    try:
        dataset.to_netcdf(temporary, engine="netcdf4")
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
