"""Figures of result files, headless (matplotlib Agg, no other plotting package).

`plot_result` writes <stem>.png beside the result (or into a folder):

- S^2: density snapshots in orthographic views of both hemispheres (centred on the final
  mean direction and its antipode, graticule every 30 degrees) or in the Mollweide
  projection, on one colour scale;
- S^1: the angle-depth picture (density over angle and time) and density profiles;
- the diagnostics of DESIGN §4 as time series, the under-resolved stretch (after
  `resolved_until`) shaded;
- a training (controls `W`, a cost per `iteration`): also the energy gap, the angle of the mean
  and the adjoint's norm over depth, |W_t|_F per layer, and J over the optimiser's iterations;
- a sweep (a `member` dimension): the diagnostics of every member, labelled by the swept keys.

Saved particles (`particles`: time, particle, component) are drawn over the density.
With `animate`, <stem>.gif shows the density at every save. Densities are drawn from
their spectral series, re-synthesised on a finer grid (band-limited interpolation: the
function the solver represents, not a faceted grid).
"""

import math
import os
import textwrap
import tomllib
import uuid

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.animation import FuncAnimation, PillowWriter  # noqa: E402
from matplotlib.colors import PowerNorm  # noqa: E402
from scipy.interpolate import RegularGridInterpolator  # noqa: E402

from spherepde.discretisation.bases import make_basis  # noqa: E402
from spherepde.base.device import placement  # noqa: E402
from spherepde.base.errors import CaseError  # noqa: E402
from spherepde.model.initial import density_from_file  # noqa: E402
from spherepde.io.output import BOTH_PREFIX, check_folder, failed_parts, failure_summary, make_folders  # noqa: E402
from spherepde.io.summary import open_result  # noqa: E402

PROJECTIONS = ("orthographic", "mollweide")
CMAP = "magma"
PIXELS = 321  # orthographic disk resolution
FINE_NLAT = 180  # the re-synthesised grid has at least this many latitudes (1 degree)
MAX_PARTICLES_DRAWN = 2000

# (title, variables, y scale): one panel each; "mass drift" is |mass - mass(0)|.  The physics first; the checks of
# the numerics (NUMERICS) in a lower row of their own, so that they never take a physics panel's place.
PANELS = [
    ("order parameter |∫x dρ|", ["order_parameter"], "linear"),
    ("alignment", ["alignment_E", "alignment_F"], "linear"),
    ("Lyapunov V_p", ["lyapunov"], "log"),
    ("W2(ρ_t, Π#ρ_0)", ["w2_projection"], "linear"),
    ("free energy F", ["free_energy"], "linear"),
    ("energy gap: E, or its interaction part, - min", ["energy_gap", "interaction_gap"], "log"),
    ("angle of the mean [rad]", ["mean_angle"], "linear"),
    ("adjoint |∇φ_t| in L²(μ_t)", ["adjoint_norm"], "log"),
    ("min ρ", ["min_density"], "linear"),
    ("spectral tail", ["spectral_tail"], "log"),
    ("mass drift |m - m(0)|", ["mass"], "linear"),
]
NUMERICS = ("min_density", "spectral_tail", "mass")


def plot_result(path: str, folder: str | None = None, projection: str = "orthographic", animate: bool = False,
                snapshots: int = 4) -> list[str]:
    """Write <stem>.png (and <stem>.gif when `animate`); returns the paths written."""
    if projection not in PROJECTIONS:
        raise CaseError(f"plot: projection must be one of {', '.join(PROJECTIONS)}, got {projection!r}")
    folder = os.path.dirname(os.path.abspath(path)) if folder is None else folder
    check_folder(folder, "plot -o")
    stem = os.path.splitext(os.path.basename(path))[0]
    with open_result(path) as dataset:
        if not ({"density", "particles"} & set(dataset.data_vars) or "member" in dataset.dims):
            raise CaseError(f"plot: {path!r} holds no density, no particles and no sweep members")
        if animate and ("member" in dataset.dims or not ("density" in dataset or _on_sphere(dataset))):
            raise CaseError(f"plot: --animate draws a single run's density, or its particles on S^2; {path!r} "
                            "has neither")
        make_folders(folder)
        written = [_save(_overview(dataset, path, projection, snapshots), os.path.join(folder, f"{stem}.png"))]
        if animate:
            written.append(_animate(dataset, path, projection, os.path.join(folder, f"{stem}.gif")))
    return written


def _save(figure, target: str, write=None) -> str:
    """Write `figure` to `target` atomically (temporary file, then rename) and close it; `write`
    (temporary path -> None) does the writing, by default a PNG."""
    temporary = f"{target}.{uuid.uuid4().hex}.tmp{os.path.splitext(target)[1]}"
    try:
        (write or (lambda path: figure.savefig(path, format="png", dpi=150)))(temporary)
        os.replace(temporary, target)
    finally:
        plt.close(figure)
        if os.path.exists(temporary):
            os.remove(temporary)
    return target


def _overview(dataset, path: str, projection: str, snapshots: int):
    """Density pictures on top, diagnostics below (a sweep: diagnostics only)."""
    if "member" in dataset.dims:
        figure = plt.figure(figsize=(13, 5.6), layout="constrained")
        _diagnostics(figure, dataset)
        figure.suptitle(dataset.attrs.get("title", os.path.basename(path)))
        return figure
    sphere = _on_sphere(dataset)
    top_height = 6.0 if sphere else 4.2
    figure = plt.figure(figsize=(13, top_height + 5.0), layout="constrained")
    top, bottom = figure.subfigures(2, 1, height_ratios=[top_height, 5.0])
    if sphere:
        _sphere_snapshots(top, dataset, path, projection, snapshots)
    else:
        _circle_picture(top, dataset)
    _diagnostics(bottom, dataset)
    figure.suptitle(_title(dataset, path))
    return figure


def _on_sphere(dataset) -> bool:
    """Whether the run lives on S^2 (three ambient components)."""
    return dataset.sizes.get("component") == 3


def _title(dataset, path: str) -> str:
    """The run's title with its model in one line."""
    case = _case(dataset)
    model = case.get("model", {})
    details = ", ".join(f"{name} = {model[name]}" for name in ("kernel", "beta", "eps") if name in model)
    title = dataset.attrs.get("title", os.path.basename(path))
    if "lmax" in dataset.attrs:
        details += f", lmax = {dataset.attrs['lmax']}"
    if "particles" in case and dataset.attrs.get("solver") in ("particles", "both"):
        details += f", n = {case['particles'].get('n')} particles"
    title = f"{title}\n{details.strip(', ')}" if details else title
    return "\n".join([title] + [textwrap.fill(line, 150) for line in _failure_lines(dataset)])


def _failure_lines(dataset) -> list[str]:
    """One line per run of the file that failed: which, after which save, and why (its status)."""
    return [f"{failure_summary(which, last_good)}: {status.removeprefix('failed: ')}"
            for which, status, last_good in failed_parts(dataset)]


def _mark_failures(axis, dataset, vertical: bool = True) -> None:
    """A dashed red line at the last good save of each run of the file that failed (vertical: on a time axis
    along x; else along y), labelled for the legend."""
    for which, _, last_good in failed_parts(dataset):
        if last_good is not None:
            (axis.axvline if vertical else axis.axhline)(last_good, color="firebrick", ls="--", lw=1.0,
                                                         label=f"{which} failed after t = {last_good:.3g}")


def _final_mean(dataset, dim: int) -> np.ndarray:
    """The mean position at the last save that has one (a failed run of a "both" file is NaN after its failure:
    the other run's then), or 0."""
    for name in ("mean", BOTH_PREFIX + "mean"):
        if name in dataset:
            values = dataset[name].values
            finite = np.flatnonzero(np.isfinite(values).all(axis=1))
            if finite.size:
                return values[finite[-1]]
    return np.zeros(dim)


def _has_density(dataset, index: int) -> bool:
    """Whether save `index` has a density (not the NaN padding after a failed Eulerian run of a "both" file)."""
    return "density" in dataset and bool(np.isfinite(dataset["density"].isel(time=index).values).all())


def _case(dataset) -> dict:
    """The run's resolved case (attribute `case`) as a table; {} if absent or unreadable."""
    try:
        return tomllib.loads(dataset.attrs.get("case", ""))
    except tomllib.TOMLDecodeError:
        return {}


# --- density on S^2 -------------------------------------------------------------------------


class SphereDensity:
    """The density of a result on S^2, re-synthesised on a fine grid and sampled at any point."""

    def __init__(self, dataset, path: str):
        self.path = path
        fine_lmax = max(int(dataset.attrs["lmax"]), math.ceil(2 * FINE_NLAT / 3))
        self.basis = make_basis(3, fine_lmax, placement("cpu", "float64"))
        lat = self.basis.latitude.numpy()
        self.order = np.argsort(lat)  # Gauss latitudes run north to south; the interpolator wants them ascending
        self.lat = np.concatenate([[-90.0], lat[self.order], [90.0]])
        self.lon = np.append(self.basis.longitude.numpy(), 360.0)
        self.poles = self.basis.placement.tensor([[0.0, 0.0, -1.0], [0.0, 0.0, 1.0]])
        self.cached = (None, None)  # (save index, interpolator of its fine grid)

    def grid(self, index: int) -> np.ndarray:
        """(lat, lon) values on the fine grid, poles and the 360-degree column added."""
        c = density_from_file(self.path, int(index), self.basis)
        values = self.basis.synthesis(c).numpy()[self.order]
        poles = self.basis.evaluate(c, self.poles).numpy()
        values = np.concatenate([np.full((1, values.shape[1]), poles[0]), values,
                                 np.full((1, values.shape[1]), poles[1])])
        return np.concatenate([values, values[:, :1]], axis=1)

    def sample(self, index: int, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        """Bilinear samples of the fine grid of save `index` at (lat, lon) in degrees."""
        if self.cached[0] != index:
            self.cached = (index, RegularGridInterpolator((self.lat, self.lon), self.grid(index)))
        return self.cached[1](np.stack([lat, np.mod(lon, 360.0)], axis=-1))


def _view_frame(centre: np.ndarray) -> np.ndarray:
    """Rows e1 (screen right, eastward), e2 (screen up, northward), e3 = centre (towards the viewer)."""
    e3 = centre / np.linalg.norm(centre)
    north = np.array([0.0, 0.0, 1.0]) if abs(e3[2]) < 0.99 else np.array([1.0, 0.0, 0.0])
    e2 = north - (north @ e3) * e3
    e2 /= np.linalg.norm(e2)
    return np.stack([np.cross(e2, e3), e2, e3])


def _disk_points(frame: np.ndarray, pixels: int = PIXELS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Latitude, longitude (degrees) of the visible hemisphere at each pixel, and the disk mask."""
    u = np.linspace(-1, 1, pixels)
    x, y = np.meshgrid(u, u)
    inside = x ** 2 + y ** 2 <= 1
    z = np.sqrt(np.clip(1 - x ** 2 - y ** 2, 0, None))
    points = x[..., None] * frame[0] + y[..., None] * frame[1] + z[..., None] * frame[2]
    lat = np.degrees(np.arcsin(np.clip(points[..., 2], -1, 1)))
    lon = np.degrees(np.arctan2(points[..., 1], points[..., 0]))
    return lat, lon, inside


def _graticule(axis, frame: np.ndarray, colour: str, step: int = 30) -> None:
    """Parallels and meridians every `step` degrees on the visible side, and the limb."""
    s = np.radians(np.linspace(-180, 180, 361))
    lines = [np.stack([np.cos(np.radians(lat)) * np.cos(s), np.cos(np.radians(lat)) * np.sin(s),
                       np.full_like(s, np.sin(np.radians(lat)))], -1) for lat in range(-90 + step, 90, step)]
    t = np.radians(np.linspace(-90, 90, 181))
    lines += [np.stack([np.cos(t) * np.cos(np.radians(lon)), np.cos(t) * np.sin(np.radians(lon)), np.sin(t)], -1)
              for lon in range(0, 360, step)]
    for line in lines:
        projected = line @ frame.T
        x, y = projected[:, 0].copy(), projected[:, 1].copy()
        x[projected[:, 2] < 0], y[projected[:, 2] < 0] = np.nan, np.nan
        axis.plot(x, y, color=colour, lw=0.4, alpha=0.35)
    limb = np.linspace(0, 2 * np.pi, 361)
    axis.plot(np.cos(limb), np.sin(limb), color="0.25", lw=0.8)


def _lat_lon_label(vector: np.ndarray) -> str:
    """A unit vector as "(latitude°, longitude°)"."""
    lat = math.degrees(math.asin(max(-1.0, min(1.0, vector[2]))))
    lon = math.degrees(math.atan2(vector[1], vector[0])) % 360
    return f"({lat:.0f}°, {lon:.0f}°)"


class SphereView:
    """One way of drawing a run on S^2 (its density, its particles or both): orthographic front
    and back disks, or Mollweide."""

    def __init__(self, dataset, path: str, projection: str):
        self.density = SphereDensity(dataset, path) if "density" in dataset else None
        self.saved = [_has_density(dataset, index) for index in range(dataset.sizes["time"])]
        self.projection = projection
        self.particles = dataset["particles"].values if "particles" in dataset else None
        mean = _final_mean(dataset, 3)
        centre = mean if np.linalg.norm(mean) > 1e-6 else np.array([0.0, 0.0, 1.0])
        self.centre = centre / np.linalg.norm(centre)
        self.frames = [_view_frame(self.centre), _view_frame(-self.centre)]
        # one square-root scale for the whole run (animations), or each save's own (snapshots: a broad initial law
        # is invisible on the scale of the cluster it becomes)
        if self.density:  # a failed run's saves after its failure are NaN: their maxima -inf, never drawn
            values = dataset["density"].values.reshape(dataset.sizes["time"], -1)
            self.maxima = np.where(np.isfinite(values), values, -np.inf).max(axis=1)
        self.norm = PowerNorm(0.5, 0.0, float(self.maxima.max())) if self.density else None
        self.own_scale = False
        self.dots = "cyan" if self.density else "C0"
        if projection == "orthographic":
            self.disks = [_disk_points(frame) for frame in self.frames]
        else:
            lon = np.linspace(-180, 180, 2 * FINE_NLAT + 1)
            lat = np.linspace(-90, 90, FINE_NLAT + 1)
            self.mollweide = np.meshgrid(np.radians(lon), np.radians(lat))
            self.lat_lon = np.meshgrid(lon, lat)[::-1]

    @property
    def panels(self) -> int:
        """Axes per snapshot: 2 disks or 1 map."""
        return 2 if self.projection == "orthographic" else 1

    def axes_kwargs(self) -> dict:
        """Keyword arguments of the axes the view draws into."""
        return {"projection": "mollweide"} if self.projection == "mollweide" else {}

    def scale(self, index: int) -> PowerNorm:
        """The colour scale of save `index`: its own (0 to its max) with `own_scale`, else the run's."""
        return PowerNorm(0.5, 0.0, float(self.maxima[index])) if self.own_scale else self.norm

    def draw(self, axes: list, index: int) -> None:
        """Draw save `index` into `axes` (`panels` of them)."""
        lines = "white" if self.density else "0.5"
        if self.projection == "orthographic":
            for axis, (lat, lon, inside), frame in zip(axes, self.disks, self.frames):
                if self.density and self.saved[index]:
                    image = np.ma.masked_where(~inside, self.density.sample(index, lat, lon))
                    axis.imshow(image, origin="lower", extent=(-1, 1, -1, 1), cmap=CMAP, norm=self.scale(index),
                                interpolation="bilinear")
                else:
                    axis.add_patch(plt.Circle((0, 0), 1, color="0.95"))
                _graticule(axis, frame, lines)
                axis.set_xlim(-1.02, 1.02)
                axis.set_ylim(-1.02, 1.02)
                axis.set_aspect("equal")
                axis.axis("off")
                if self.particles is not None:
                    projected = self.particles[index, :MAX_PARTICLES_DRAWN] @ frame.T
                    front = projected[:, 2] >= 0
                    axis.scatter(projected[front, 0], projected[front, 1], s=3, c=self.dots, lw=0, alpha=0.8)
            return
        axis = axes[0]
        if self.density and self.saved[index]:
            axis.pcolormesh(*self.mollweide, self.density.sample(index, *self.lat_lon), cmap=CMAP,
                            norm=self.scale(index), shading="gouraud", rasterized=True)
        else:
            axis.set_facecolor("0.95")
        axis.grid(True, color=lines, lw=0.4, alpha=0.35)
        axis.set_xticklabels([])
        axis.set_yticklabels([])
        if self.particles is not None:
            x = self.particles[index, :MAX_PARTICLES_DRAWN]
            axis.scatter(np.arctan2(x[:, 1], x[:, 0]), np.arcsin(np.clip(x[:, 2], -1, 1)), s=3, c=self.dots, lw=0,
                         alpha=0.8)

    def labels(self) -> list[str]:
        """What each of the `panels` axes shows."""
        if self.projection == "orthographic":
            return [f"centred on the final mean {_lat_lon_label(self.centre)}",
                    f"opposite side {_lat_lon_label(-self.centre)}"]
        return ["Mollweide"]


def _sphere_snapshots(subfigure, dataset, path: str, projection: str, count: int) -> None:
    """`count` saves, evenly spread from first to last, in one view, each on its own colour scale."""
    times = dataset["time"].values
    picks = np.unique(np.linspace(0, len(times) - 1, min(count, len(times))).round().astype(int))
    view = SphereView(dataset, path, projection)
    view.own_scale = True
    if view.norm is not None:  # the colour bar in a column of its own: the maps' rows may be separate subfigures
        subfigure, bar = subfigure.subfigures(1, 2, width_ratios=[24, 1])
    if view.panels == 2:
        axes = subfigure.subplots(2, len(picks), squeeze=False)
    else:
        axes = np.array(_filled_axes(subfigure, len(picks), per_row=2, **view.axes_kwargs()))

    def title(index):
        """"t = 0.5 (max ρ 0.64)", and where the Eulerian run of a "both" file had failed by then, that its density
        is missing."""
        if view.density and not view.saved[index]:
            return f"t = {times[index]:.3g} (Eulerian run failed: particles only)"
        return f"t = {times[index]:.3g}" + (f" (max ρ {view.maxima[index]:.2g})" if view.density else "")

    if view.panels == 2:
        for column, index in enumerate(picks):
            view.draw(list(axes[:, column]), index)
            axes[0, column].set_title(title(index), fontsize=11)
        for row, label in enumerate(view.labels()):
            axes[row, 0].text(-0.06, 0.5, label, transform=axes[row, 0].transAxes, rotation=90, ha="right",
                              va="center", fontsize=8, color="0.3")
    else:
        for axis, index in zip(axes, picks):
            view.draw([axis], index)
            axis.set_title(title(index), fontsize=11)
    if view.norm is not None:
        bar.colorbar(plt.cm.ScalarMappable(PowerNorm(0.5, 0.0, 1.0), CMAP), cax=bar.add_axes((0.05, 0.15, 0.25, 0.7)),
                     label="ρ / max ρ of its depth (square-root scale)")


# --- density on S^1 -------------------------------------------------------------------------


def _circle_centre(dataset) -> float:
    """The middle of the angle window: the final mean angle rounded to a multiple of pi/2, so
    that a cluster is drawn whole and the ticks stay round."""
    mean = _final_mean(dataset, 2)
    if np.linalg.norm(mean) <= 1e-6:
        return 0.0
    return float(np.pi / 2 * np.round(np.arctan2(mean[1], mean[0]) / (np.pi / 2)))


def _circle_window(dataset, centre: float) -> tuple[np.ndarray, np.ndarray]:
    """Angles and densities over one closed period [centre - pi, centre + pi]."""
    theta, density = dataset["theta"].values, dataset["density"].values
    shift = np.searchsorted(theta, np.mod(centre - np.pi, 2 * np.pi))
    angles = np.mod(np.roll(theta, -shift) - (centre - np.pi), 2 * np.pi) + centre - np.pi
    rolled = np.roll(density, -shift, axis=-1)
    return np.append(angles, angles[0] + 2 * np.pi), np.concatenate([rolled, rolled[..., :1]], axis=-1)


def _particle_angles(dataset, centre: float) -> np.ndarray:
    """(time, particle) angles of the saved particles in the window [centre - pi, centre + pi)."""
    x = dataset["particles"].values
    return np.mod(np.arctan2(x[..., 1], x[..., 0]) - (centre - np.pi), 2 * np.pi) + centre - np.pi


def _circle_picture(subfigure, dataset) -> None:
    """The angle-depth picture (density over angle and time, particles as dots) and a few
    profiles (particle histograms beside the density where both exist)."""
    heat, profiles = subfigure.subplots(1, 2, width_ratios=[1.6, 1])
    centre, times = _circle_centre(dataset), dataset["time"].values
    has_density, has_particles = "density" in dataset, "particles" in dataset
    saved = np.array([_has_density(dataset, index) for index in range(len(times))])
    if has_density:
        theta, density = _circle_window(dataset, centre)
        mesh = heat.pcolormesh(theta, times[saved], density[saved], shading="gouraud", cmap=CMAP, rasterized=True)
        subfigure.colorbar(mesh, ax=heat, label="density ρ [rad⁻¹]", pad=0.01)
    if has_particles:
        angles = _particle_angles(dataset, centre)
        drawn = angles[:, :MAX_PARTICLES_DRAWN]
        heat.scatter(drawn.ravel(), np.repeat(times, drawn.shape[1]), s=1, c="cyan" if has_density else "C0",
                     lw=0, alpha=0.6)
    _mark_failures(heat, dataset, vertical=False)
    if failed_parts(dataset):
        heat.legend(fontsize=8, loc="upper right")
    _angle_axis(heat, centre)
    heat.set_ylabel("time (depth)")
    if times[-1] > times[0]:  # a single save (a run failed at its first interval) keeps matplotlib's range
        heat.set_ylim(times[0], times[-1])
    picks = np.unique(np.linspace(0, len(times) - 1, min(5, len(times))).round().astype(int))
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(picks)))
    for colour, index in zip(colours, picks):
        label = f"t = {times[index]:.3g}"
        if has_density and saved[index]:
            profiles.plot(theta, density[index], color=colour, label=label)
        if has_particles:
            profiles.hist(angles[index], bins=48, range=(centre - np.pi, centre + np.pi),
                          density=True, histtype="step", color=colour, ls="--" if has_density else "-",
                          label=None if has_density and saved[index] else label)
    _angle_axis(profiles, centre)
    profiles.set_ylabel("ρ [rad⁻¹]")
    profiles.legend(fontsize=8, frameon=False)
    profiles.set_title("profiles" + (" (dashed: particle histograms)" if has_density and has_particles else ""),
                       fontsize=10)


def _angle_axis(axis, centre: float) -> None:
    """Angle ticks every pi/2 over [centre - pi, centre + pi]."""
    ticks = centre + np.pi / 2 * np.arange(-2, 3)
    names = {0: "0", 1: "π/2", 2: "π", 3: "3π/2", 4: "2π"}
    labels = []
    for tick in ticks:
        quarter = int(round(tick / (np.pi / 2)))
        labels.append(("−" if quarter < 0 else "") + names.get(abs(quarter), f"{abs(quarter)}π/2"))
    axis.set_xticks(ticks, labels)
    axis.set_xlim(ticks[0], ticks[-1])
    axis.set_xlabel("angle θ [rad]")


# --- diagnostics -----------------------------------------------------------------------------


def _curves(dataset, name: str) -> list[tuple[str, object, object]]:
    """A diagnostic's curves as (label, values, standard error or None): the run's own and, in a
    solver = "both" file, the particle run's (prefix "particles_"); mass becomes its drift from t = 0."""
    own = "particles" if dataset.attrs.get("solver") == "particles" else "Eulerian"
    curves = []
    for key, label in ((name, own), (BOTH_PREFIX + name, "particles")):
        if key not in dataset:
            continue
        values, stderr = dataset[key], dataset.get(key + "_stderr")
        if not np.isfinite(values).any():
            continue
        if stderr is not None and not (np.nan_to_num(stderr.values) > 0).any():
            stderr = None
        if name == "mass":
            values = np.abs(values - values.isel(time=0))
        extra = [dim for dim in values.dims if dim not in ("time", "member")]
        if not extra:
            curves.append((label, values, stderr))
            continue
        for coordinate in values[extra[0]].values:
            pick = {extra[0]: coordinate}
            curves.append((f"{label}, {extra[0]} = {float(coordinate):g}", values.sel(pick),
                           None if stderr is None else stderr.sel(pick)))
    return curves


def _informative(dataset, names: list[str]) -> bool:
    """False for panels that say nothing: missing, all NaN, constant, or Lyapunov when E is everything."""
    present = [key for name in names for key in (name, BOTH_PREFIX + name) if key in dataset]
    if not present or (names == ["mass"] and "density" not in dataset):  # particles carry mass 1 exactly
        return False
    if "lyapunov" in names and "alignment_E" in dataset and np.allclose(dataset["alignment_E"], 1, atol=1e-12):
        return False
    for name in present:
        values = np.asarray(dataset[name].values, dtype=float)
        finite = values[np.isfinite(values)]
        if finite.size and (name == "mass" or np.ptp(finite) > 1e-12 * max(1.0, np.abs(finite).max())):
            return True
    return False


def _limits(axis, curves: list, scale: str) -> None:
    """Log scale where asked and every value is positive; y limits from the curves, with a margin
    of the typical band width, so that a band that blows up (a standard error at W2 = 0) is clipped."""
    values = np.concatenate([np.asarray(values, float).ravel() for _, values, _ in curves])
    values = values[np.isfinite(values)]
    if scale == "log" and values.size and values.min() > 0:
        axis.set_yscale("log")
        return
    bands = [2 * np.asarray(stderr, float).ravel() for _, _, stderr in curves if stderr is not None]
    if not bands or not values.size:
        return
    low, high = values.min(), values.max()
    margin = max(0.05 * (high - low), float(np.nanmedian(np.concatenate(bands))))
    if margin > 0:
        axis.set_ylim(low - margin, high + margin)


def _member_labels(dataset) -> list[str]:
    """One label per sweep member from its swept coordinates."""
    names = [name for name in dataset.coords if dataset[name].dims == ("member",) and name != "member"]
    return [", ".join(f"{dataset[name].attrs.get('long_name', name).split()[-1]} = {dataset[name].values[i]}"
                      for name in names) or f"member {i}" for i in range(dataset.sizes["member"])]


def _filled_axes(subfigure, count: int, per_row: int = 4, **subplot_kw) -> list:
    """`count` axes in rows of at most `per_row`, as even as they go, every row filled (no empty slots); none for
    count 0 (a failed run whose few saves make no diagnostic informative)."""
    if count == 0:
        return []
    rows = max(1, math.ceil(count / per_row))
    sizes = [count // rows + (row < count % rows) for row in range(rows)]
    parts = [subfigure] if rows == 1 else subfigure.subfigures(rows, 1)
    return [axis for part, size in zip(parts, sizes) for axis in part.subplots(1, size, squeeze=False,
                                                                                 subplot_kw=subplot_kw)[0]]


def _free_energy_title(dataset) -> str:
    """The free-energy panel's title: whether this flow dissipates F (spherepde.model.energy)."""
    from spherepde.model.energy import FreeEnergy

    model = _case(dataset).get("model", {})
    try:
        energy = FreeEnergy.of(model["kernel"], float(model["beta"]), model["B"], model["V"], model["W"],
                               float(model["eps"]), controlled=bool(_case(dataset).get("control")))
    except (KeyError, TypeError, ValueError):
        return "free energy F"
    return "free energy F (dissipated by this flow)" if energy.dissipated else "free energy F (W may raise it)"


def _w2_bound(axis, dataset, time) -> None:
    """The band W2 +- w2_quantisation_bound (the largest over the run) around an Eulerian w2_projection."""
    bound = dataset.attrs.get("w2_quantisation_bound")
    single = "member" not in dataset.dims
    if "w2_projection" in dataset and isinstance(bound, float) and 0 < bound < math.inf and single:
        values = dataset["w2_projection"].values
        axis.fill_between(time, np.maximum(values - bound, 0), values + bound, color="0.6", alpha=0.18, lw=0,
                          label=f"± {bound:.2g}: w2_quantisation_bound, on the error of W2")


def _diagnostics(subfigure, dataset) -> None:
    """One panel per informative diagnostic (the checks of the numerics in a row below the physics); bands of
    +-2 standard errors where the run has them."""
    panels = [panel for panel in PANELS if _informative(dataset, panel[1])]
    training = [panel for panel in TRAINING_PANELS if panel[1] in dataset.dims and "member" not in dataset.dims]
    checks = [panel for panel in panels if panel[1][0] in NUMERICS]
    panels = [panel for panel in panels if panel not in checks] + checks
    physics = len(panels) - len(checks) + len(training)
    if checks and physics:
        top, bottom = subfigure.subfigures(2, 1, height_ratios=[2.2 if physics > 4 else 1.3, 1])
        upper = _filled_axes(top, physics)
        split = len(panels) - len(checks)  # physics panels, then the checks, then the training panels
        axes = upper[:split] + _filled_axes(bottom, len(checks)) + upper[split:]
    else:
        axes = _filled_axes(subfigure, len(panels) + len(training))
    time = dataset["time"].values
    resolved_until = dataset.attrs.get("resolved_until", "end")
    members = _member_labels(dataset) if "member" in dataset.dims else None
    for axis, (title, names, scale) in zip(axes, panels):
        # a panel of several variables names each curve by its variable (alignment_E beside alignment_F)
        curves = [(f"{name}, {label}" if len(names) > 1 else label, values, stderr)
                  for name in names for label, values, stderr in _curves(dataset, name)]
        for label, values, stderr in curves:
            if members is not None:
                for i, member in enumerate(members):
                    axis.plot(time, values.isel(member=i), lw=1.2, label=member)
                continue
            (line,) = axis.plot(time, values, lw=1.4, label=label)
            if stderr is not None:
                axis.fill_between(time, values - 2 * stderr, values + 2 * stderr, color=line.get_color(), alpha=0.25,
                                  lw=0, label=f"{label} ± 2 s.e.")
        if names == ["w2_projection"]:
            _w2_bound(axis, dataset, time)
        _limits(axis, curves, scale)
        if not isinstance(resolved_until, str):
            axis.axvspan(float(resolved_until), time[-1], color="0.88", zorder=0, label="under-resolved")
        if members is None:
            _mark_failures(axis, dataset)
        axis.set_title(_free_energy_title(dataset) if names == ["free_energy"] else title, fontsize=10)
        axis.set_xlabel("time (depth)")
        axis.grid(True, alpha=0.3)
        if members is None and len(axis.get_legend_handles_labels()[0]) > 1:
            axis.legend(fontsize=7, frameon=False)
    for axis, (title, _, draw) in zip(axes[len(panels):], training):
        draw(axis, dataset)
        axis.set_title(title, fontsize=10)
        axis.grid(True, alpha=0.3)
    if members is not None and panels:
        subfigure.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize=8, frameon=False)


def _controls(axis, dataset) -> None:
    """|W_t|_F over depth: the piecewise-constant control, layer l on [l t_end / L, (l + 1) t_end / L]."""
    norms = np.sqrt((dataset["W"].values ** 2).sum(axis=(1, 2)))
    t_end = float(_case(dataset).get("time", {}).get("t_end", dataset["time"].values[-1]))
    axis.stairs(norms, t_end * np.arange(len(norms) + 1) / len(norms), lw=1.4, baseline=None)  # no drop to 0 at the ends
    if (norms > 0).all():
        axis.set_yscale("log")
    axis.set_xlabel("time (depth)")


def _training_cost(axis, dataset) -> None:
    """The optimiser's course: J = l(mu_T) + lambda_reg / 2 int |W_t|^2 dt at each iteration."""
    axis.plot(dataset["iteration"].values, dataset["loss"].values, lw=1.4, marker=".", label="J")
    if "terminal_loss" in dataset:
        axis.plot(dataset["iteration"].values, dataset["terminal_loss"].values, lw=1.0, ls="--", marker="x",
                  label="l(μ_T)")
        axis.legend(fontsize=7, frameon=False)
    axis.set_xlabel("iteration")


# Training files (controls W per layer, a cost per iteration): (title, the dimension that marks them, drawing).
TRAINING_PANELS = [("controls |W_t|_F", "layer", _controls), ("training cost", "iteration", _training_cost)]


# --- animation -------------------------------------------------------------------------------


def _animate(dataset, path: str, projection: str, target: str, fps: int = 6) -> str:
    """A GIF with one frame per save, written atomically."""
    times = dataset["time"].values
    if not _on_sphere(dataset):
        figure, update = _circle_animation(dataset)
    else:
        figure, update = _sphere_animation(dataset, path, projection)
    animation = FuncAnimation(figure, update, frames=len(times), blit=False)
    return _save(figure, target, lambda path: animation.save(path, writer=PillowWriter(fps=fps), dpi=100))


def _sphere_animation(dataset, path: str, projection: str):
    """The figure and frame function of an S^2 animation: the view of each save."""
    view = SphereView(dataset, path, projection)
    width = 8.4 if view.panels == 2 else 7.6
    figure = plt.figure(figsize=(width, 4.6), layout="constrained")
    axes = list(figure.subplots(1, view.panels, squeeze=False, subplot_kw=view.axes_kwargs())[0])
    if view.norm is not None:
        figure.colorbar(plt.cm.ScalarMappable(view.norm, CMAP), ax=axes, shrink=0.8,
                        label="density ρ [sr⁻¹] (square-root scale)")
    times = dataset["time"].values
    title = figure.suptitle("")

    def update(index):
        for axis in axes:
            axis.clear()
        view.draw(axes, index)
        for axis, label in zip(axes, view.labels()):
            axis.set_title(label, fontsize=8, color="0.3")
        title.set_text(f"{dataset.attrs.get('title', '')}: t = {times[index]:.3g}")
        return []

    return figure, update


def _circle_animation(dataset):
    """The figure and frame function of an S^1 animation: the profile of each save beside the
    angle-depth picture, its depth marked."""
    centre, times = _circle_centre(dataset), dataset["time"].values
    theta, density = _circle_window(dataset, centre)
    figure, (curve_axis, heat) = plt.subplots(1, 2, figsize=(9.5, 4), layout="constrained", width_ratios=[1, 1.2])
    (curve,) = curve_axis.plot(theta, density[0], color="C3")
    curve_axis.set_ylim(0, 1.05 * float(np.nanmax(density)))
    _angle_axis(curve_axis, centre)
    curve_axis.set_ylabel("ρ [rad⁻¹]")
    saved = np.array([_has_density(dataset, index) for index in range(len(times))])
    heat.pcolormesh(theta, times[saved], density[saved], shading="gouraud", cmap=CMAP, rasterized=True)
    _mark_failures(heat, dataset, vertical=False)
    marker = heat.axhline(times[0], color="cyan", lw=1.2)
    _angle_axis(heat, centre)
    heat.set_ylabel("time (depth)")
    title = figure.suptitle("")

    def update(index):
        curve.set_ydata(density[index])
        marker.set_ydata([times[index], times[index]])
        title.set_text(f"{dataset.attrs.get('title', '')}: t = {times[index]:.3g}")
        return [curve, marker, title]

    return figure, update
