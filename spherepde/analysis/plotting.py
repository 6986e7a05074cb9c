"""Figures of result files, headless (matplotlib Agg, no other plotting package).

`plot_result` writes <stem>.png beside the result (or into a folder):

- S^2: density snapshots in orthographic views of both hemispheres (centred on the final
  mean direction and its antipode, graticule every 30 degrees) or in the Mollweide
  projection, each save on its own colour scale (0 to its largest value);
- S^1: the angle-depth picture (density over angle and time) and density profiles (as many as the S^2
  snapshots);
- the diagnostics of docs/design.md "Diagnostics" as time series, the under-resolved stretch (after
  `resolved_until`) shaded;
- a training (controls `W`, a cost per `iteration`): also the energy gap, the angle of the mean
  and the adjoint's norm over depth, |W_t|_F per layer, and J over the optimiser's iterations;
- a sweep (a `member` dimension): the diagnostics of every member, labelled by the swept keys.

Saved particles (`particles`: time, particle, component) are drawn over the density.
With `animate`, <stem>.gif shows the density at every save. Densities are drawn from
their spectral series, re-synthesised on a finer grid (band-limited interpolation: the
function the solver represents, not a faceted grid).  The S^2 views are those of spherepde.analysis.sphere_view,
the diagnostics panels those of spherepde.analysis.diagnostic_panels.
"""

import numbers
import os
import textwrap
import uuid

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.animation import FuncAnimation, PillowWriter  # noqa: E402
from matplotlib.colors import PowerNorm  # noqa: E402

from spherepde.analysis.diagnostic_panels import (  # noqa: E402
    _diagnostics,
    _filled_axes,
    _mark_failures,
    panel_rows,
    stored_case,
)
from spherepde.analysis.sphere_view import CMAP, SphereView, _final_mean, _has_density, drawn  # noqa: E402
from spherepde.base.errors import CaseError  # noqa: E402
from spherepde.io.output import check_folder, failed_parts, failure_summary, make_folders, time_text  # noqa: E402
from spherepde.io.summary import open_result, reading  # noqa: E402

PROJECTIONS = ("orthographic", "mollweide")  # the first the default
DEFAULT_SNAPSHOTS = 4
FINE_CIRCLE_POINTS = 720  # S^1 densities are drawn on at least this many points (half a degree)


def figure_paths(path: str, folder: str | None = None, animate: bool = False) -> list[str]:
    """The figures `plot_result` writes for the result `path`: <stem>.png (and <stem>.gif) in `folder`, by default
    beside the result; a CaseError where one of them is the result itself (a result named RUN.png)."""
    folder = os.path.dirname(os.path.abspath(path)) if folder is None else folder
    stem = os.path.splitext(os.path.basename(path))[0]
    targets = [os.path.join(folder, f"{stem}.{kind}") for kind in (("png", "gif") if animate else ("png",))]
    for target in targets:
        if os.path.isdir(target):
            raise CaseError(f"plot: {target!r} is a folder; the figure goes there: move it or give plot -o")
        if os.path.realpath(target) == os.path.realpath(path):
            raise CaseError(f"plot: the figure {target!r} would replace the result it draws; give the result "
                            "another suffix (.nc) or the figures another folder (plot -o)")
        if os.path.isfile(target) and not _is_image(target):
            raise CaseError(f"plot: {target!r} exists and is not a PNG or GIF image: the figure would replace it; "
                            "move it or give plot -o")
    return targets


# The first bytes of the files plot writes, PNG's signature and GIF's: an existing file at a figure's path that
# starts otherwise is someone's data (a result named RUN.png beside RUN.nc), not an earlier figure.
IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a")


def _is_image(path: str) -> bool:
    with open(path, "rb") as file:
        return file.read(8).startswith(IMAGE_SIGNATURES)


def plot_result(path: str, folder: str | None = None, projection: str | None = None, animate: bool = False,
                snapshots: int | None = None) -> list[str]:
    """Write <stem>.png (and <stem>.gif when `animate`, a frame a save) with `snapshots` saves drawn (S^2 views,
    S^1 profiles; by default DEFAULT_SNAPSHOTS) in `projection` (S^2 only; by default orthographic); returns the
    paths written.  Either option given for a file whose figure does not use it is refused (`_check_applies`)."""
    if projection is not None and projection not in PROJECTIONS:
        raise CaseError(f"plot: projection must be one of {', '.join(PROJECTIONS)}, got {projection!r}")
    if snapshots is not None and (isinstance(snapshots, bool) or not isinstance(snapshots, numbers.Integral)
                                  or snapshots < 1):
        raise CaseError(f"plot: snapshots must be an integer >= 1, got {snapshots!r}")
    targets = figure_paths(path, folder, animate)
    folder = os.path.dirname(targets[0])
    check_folder(folder, "plot -o")
    with reading(path), open_result(path) as dataset:  # the figures read the particles and densities lazily
        if "report" in dataset.attrs:
            raise CaseError(f"plot: {path!r} is a comparison report; its figure is the .png that compare wrote "
                            "beside it")
        if not ({"density", "particles"} & set(dataset.data_vars) or "member" in dataset.dims
                or "time" in dataset.dims):
            raise CaseError(f"plot: {path!r} holds no density, no particles, no diagnostics over time and no sweep "
                            "members")
        _check_applies(dataset, path, projection, snapshots)
        if animate and "member" in dataset.dims:
            raise CaseError(f"plot: --animate draws a single run, not a sweep ({path!r}); animate a member's file")
        if animate and not ("density" in dataset or (_on_sphere(dataset) and "particles" in dataset)):
            raise CaseError(f"plot: --animate draws a single run's density, or its particles on S^2; {path!r} "
                            "has neither")
        make_folders(folder)
        projection = projection or PROJECTIONS[0]
        written = [_save(_overview(dataset, path, projection, snapshots or DEFAULT_SNAPSHOTS), targets[0])]
        if animate:
            written.append(_animate(dataset, path, projection, targets[1]))
    return written


def _check_applies(dataset, path: str, projection: str | None, snapshots: int | None) -> None:
    """A one-line CaseError for an option given that the figure of `dataset` does not use, as for --animate of a
    sweep: --projection outside S^2 pictures, --snapshots without density or particle pictures (silently accepted,
    `plot s1.nc --projection mollweide` read as if a Mollweide map had been drawn)."""
    if "member" in dataset.dims:
        what, pictures = "a sweep, drawn as its members' diagnostics", False
    elif not {"density", "particles"} & set(dataset.data_vars):
        what, pictures = "a run without density or saved particles, drawn as its diagnostics", False
    else:
        what, pictures = "a run on S^1, drawn over the angle", True
    if projection is not None and not (pictures and _on_sphere(dataset)):
        raise CaseError(f"plot: --projection applies to maps of S^2; {path!r} is {what}")
    if snapshots is not None and not pictures:
        raise CaseError(f"plot: --snapshots applies to pictures of a density or of particles; {path!r} is {what}")


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


ROW_INCHES = 2.5  # the height of a row of diagnostic panels (two rows: 5 inches, the figure's least)


def _overview(dataset, path: str, projection: str, snapshots: int):
    """Density pictures on top, diagnostics below (a sweep, or a particle run that saved no particles: diagnostics
    only)."""
    panels_height = max(2, panel_rows(dataset)) * ROW_INCHES
    if "member" in dataset.dims or not {"density", "particles"} & set(dataset.data_vars):
        figure = plt.figure(figsize=(13, panels_height + 0.6), layout="constrained")
        _diagnostics(figure, dataset)
        figure.suptitle(_sweep_title(dataset, path) if "member" in dataset.dims else _title(dataset, path),
                        parse_math=False)  # file names and titles are text: a "$" in one started mathtext
        return figure
    sphere = _on_sphere(dataset)
    top_height = 6.0 if sphere else 4.2
    figure = plt.figure(figsize=(13, top_height + panels_height), layout="constrained")
    top, bottom = figure.subfigures(2, 1, height_ratios=[top_height, panels_height])
    if sphere:
        _sphere_snapshots(top, dataset, path, projection, snapshots)
    else:
        _circle_picture(top, dataset, snapshots)
    _diagnostics(bottom, dataset)
    figure.suptitle(_title(dataset, path), parse_math=False)
    return figure


def _sweep_title(dataset, path: str) -> str:
    """A sweep's title, and how many of its members failed (member_status)."""
    title = dataset.attrs.get("title", os.path.basename(path))
    status = dataset["member_status"].values if "member_status" in dataset else []
    failed = sum(value != "completed" for value in status)
    return f"{title}: {failed} of {len(status)} members failed" if failed else title


def _on_sphere(dataset) -> bool:
    """Whether the run lives on S^2 (three ambient components)."""
    return dataset.sizes.get("component") == 3


def _title(dataset, path: str) -> str:
    """The run's title with its model in one line."""
    case = stored_case(dataset)
    model = case.get("model", {})
    details = ", ".join(f"{name} = {model[name]}" for name in ("kernel", "beta", "eps") if name in model)
    # the other heads and an MLP feed-forward named too: the line read as a one-head model's
    heads = model.get("extra_heads") or []
    if isinstance(heads, list) and heads:
        details += "; extra heads: " + ", ".join(f"{head.get('kernel')} beta = {head.get('beta')}" for head in heads
                                                 if isinstance(head, dict))
    if model.get("feed_forward") == "mlp":
        details += f"; MLP feed-forward ({model.get('hidden')} {model.get('activation')} units)"
    title = dataset.attrs.get("title", os.path.basename(path))
    if "lmax" in dataset.attrs:
        details += f", lmax = {dataset.attrs['lmax']}"
    if "particles" in case and dataset.attrs.get("solver") in ("particles", "both"):
        details += f", n = {case['particles'].get('n')} particles"
    title = f"{title}\n{details.strip(', ')}" if details else title
    return "\n".join([title] + _training_lines(dataset, case) + [textwrap.fill(line, 150)
                                                                  for line in _failure_lines(dataset)])


def _training_lines(dataset, case: dict) -> list[str]:
    """A training's line (a cost per `iteration`): its loss, and J = l(mu_T) + lambda_reg / 2 int |W_t|^2 dt at the
    first and last iterations; the title said "run" alone, as of an uncontrolled flow."""
    if "iteration" not in dataset.dims or "loss" not in dataset:
        return []
    control, cost, iterations = case.get("control", {}), dataset["loss"].values, dataset["iteration"].values
    kept = np.flatnonzero(np.isfinite(cost))
    line = f"trained control (loss = {control.get('loss')}, lambda_reg = {control.get('lambda_reg')})"
    if kept.size:
        line += (f": J = {cost[kept[0]]:.4g} at iteration {iterations[kept[0]]}, {cost[kept[-1]]:.4g} at iteration "
                 f"{iterations[kept[-1]]}")
    stop = dataset.attrs.get("optimizer_stop")
    return [line + (f" ({stop})" if stop else "")]


def _failure_lines(dataset) -> list[str]:
    """One line per run of the file that failed: which, after which save, and why (its status)."""
    return [f"{failure_summary(which, last_good)}: {status.removeprefix('failed: ')}"
            for which, status, last_good in failed_parts(dataset)]


# --- density on S^2 -------------------------------------------------------------------------


def _sphere_snapshots(subfigure, dataset, path: str, projection: str, count: int) -> None:
    """`count` saves, evenly spread from first to last, in one view, each on its own colour scale."""
    times = dataset["time"].values
    picks = np.unique(np.linspace(0, len(times) - 1, min(count, len(times))).round().astype(int))
    view = SphereView(dataset, path, projection)
    view.own_scale = True
    if view.norm is not None:  # the colour bar in a column of its own: the maps' rows may be separate subfigures
        subfigure, bar = subfigure.subfigures(1, 2, width_ratios=[12, 1])
    if view.panels == 2:
        axes = subfigure.subplots(2, len(picks), squeeze=False)
    else:
        axes = np.array(_filled_axes(subfigure, len(picks), per_row=2, **view.axes_kwargs()))

    def title(index):
        """"t = 0.5 (max ρ 0.64)", and where the Eulerian run of a "both" file had failed by then, that its density
        is missing."""
        if view.density and not view.saved[index]:
            return f"t = {time_text(times[index])} (Eulerian run failed: particles only)"
        return f"t = {time_text(times[index])}" + (f" (max ρ {view.maxima[index]:.2g})" if view.density else "")

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
        # the bar, its ticks and its label all inside the column (a label beside a wider bar fell off the canvas)
        bar.colorbar(plt.cm.ScalarMappable(PowerNorm(0.5, 0.0, 1.0), CMAP), cax=bar.add_axes((0.1, 0.15, 0.14, 0.7)),
                     label="ρ / max ρ of its depth (square-root scale)")


# --- density on S^1 -------------------------------------------------------------------------


def _circle_centre(dataset) -> float:
    """The middle of the angle window, rounded to a multiple of pi/2 so that the ticks stay round: the final mean
    angle, so that a cluster is drawn whole; where the mean vanishes (a symmetric law, antipodal clusters) opposite
    the last saved density's minimum, so that the window's edges cut where there is least mass (centred on 0,
    clusters at 0 and pi had the one at pi split across both edges); without a density 0."""
    mean = _final_mean(dataset, 2)
    if np.linalg.norm(mean) > 1e-6:
        angle = np.arctan2(mean[1], mean[0])
    else:
        saved = [index for index in range(dataset.sizes["time"]) if _has_density(dataset, index)]
        if not saved:
            return 0.0
        angle = dataset["theta"].values[int(np.argmin(dataset["density"].isel(time=saved[-1]).values))] + np.pi
    return float(np.pi / 2 * np.round(angle / (np.pi / 2)))


def _circle_density(dataset) -> tuple[np.ndarray, np.ndarray]:
    """The angles and densities (time, angle) of an S^1 run re-synthesised from their Fourier series on a multiple
    of its n equispaced points, at least FINE_CIRCLE_POINTS: the zero-padded DFT of the values, exact for the
    trigonometric polynomial of degree below n / 2 that they hold (the solver's n > 2 lmax)."""
    theta, values = dataset["theta"].values, dataset["density"].values
    points = len(theta)
    fine = points * -(-FINE_CIRCLE_POINTS // points)
    spectrum = np.fft.rfft(values, axis=-1)
    if points % 2 == 0 and fine > points:  # the Nyquist term, shared by two frequencies on the finer grid
        spectrum[..., -1] /= 2
    padded = np.zeros(values.shape[:-1] + (fine // 2 + 1,), complex)
    padded[..., :spectrum.shape[-1]] = spectrum
    return theta[0] + 2 * np.pi * np.arange(fine) / fine, np.fft.irfft(padded, fine, axis=-1) * (fine / points)


def _circle_window(dataset, centre: float) -> tuple[np.ndarray, np.ndarray]:
    """Angles and densities (re-synthesised: `_circle_density`) over one closed period [centre - pi, centre + pi]."""
    theta, density = _circle_density(dataset)
    shift = np.searchsorted(theta, np.mod(centre - np.pi, 2 * np.pi))
    angles = np.mod(np.roll(theta, -shift) - (centre - np.pi), 2 * np.pi) + centre - np.pi
    rolled = np.roll(density, -shift, axis=-1)
    return np.append(angles, angles[0] + 2 * np.pi), np.concatenate([rolled, rolled[..., :1]], axis=-1)


def _particle_angles(dataset, centre: float) -> np.ndarray:
    """(time, particle) angles of the saved particles in the window [centre - pi, centre + pi)."""
    x = dataset["particles"].values
    return np.mod(np.arctan2(x[..., 1], x[..., 0]) - (centre - np.pi), 2 * np.pi) + centre - np.pi


# Above the axes' spines (zorder 2.5): the first and last saves' dots lie on the frame's edges, which hid them.
DOTS_ZORDER = 3


def _circle_picture(subfigure, dataset, count: int) -> None:
    """The angle-depth picture (density over angle and time, particles as dots) and `count`
    profiles, evenly spread from first to last save (particle histograms beside the density where both exist).
    A single save (a run failed at its first interval) has no depth to draw: its profile alone."""
    centre, times = _circle_centre(dataset), dataset["time"].values
    has_density, has_particles = "density" in dataset, "particles" in dataset
    saved = np.array([_has_density(dataset, index) for index in range(len(times))])
    theta, density = _circle_window(dataset, centre) if has_density else (None, None)
    angles = _particle_angles(dataset, centre) if has_particles else None
    if len(times) > 1:
        heat, profiles = subfigure.subplots(1, 2, width_ratios=[1.6, 1])
        _depth_picture(subfigure, heat, dataset, centre, theta, None if density is None else density[saved], angles)
    else:
        profiles = subfigure.subplots(1, 1)
    picks = np.unique(np.linspace(0, len(times) - 1, min(count, len(times))).round().astype(int))
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(picks)))
    for colour, index in zip(colours, picks):
        label = f"t = {time_text(times[index])}"
        if has_density and saved[index]:
            profiles.plot(theta, density[index], color=colour, label=label)
        if has_particles:
            profiles.hist(angles[index], bins=48, range=(centre - np.pi, centre + np.pi),
                          density=True, histtype="step", color=colour, ls="--" if has_density else "-",
                          label=None if has_density and saved[index] else label)
    _angle_axis(profiles, centre)
    profiles.set_ylabel("ρ [rad⁻¹]")
    profiles.legend(fontsize=8, frameon=False)
    title = "profiles" if len(times) > 1 else "profile of the one save (no angle-depth picture)"
    profiles.set_title(title + (" (dashed: particle histograms)" if has_density and has_particles else ""),
                       fontsize=10)


def _depth_picture(subfigure, heat, dataset, centre: float, theta, density, angles) -> None:
    """The angle-depth picture into `heat`: the saved densities (`density` over `theta`, None without) where two or
    more saves have one (one save's image has no height: it drew nothing, beside a colour bar), and the particles'
    `angles` (None without) as dots at every save."""
    times = dataset["time"].values
    saved = np.array([_has_density(dataset, index) for index in range(len(times))])
    imaged = density is not None and saved.sum() > 1
    if imaged:
        mesh = _angle_depth_image(heat, theta, times[saved], density)
        subfigure.colorbar(mesh, ax=heat, label="density ρ [rad⁻¹]", pad=0.01)
    if angles is not None:
        shown = angles[:, drawn(angles.shape[1])]
        # not clipped, and above the frame: the first and last saves' dots sit on the time limits
        heat.scatter(shown.ravel(), np.repeat(times, shown.shape[1]), s=1, c="cyan" if imaged else "C0",
                     lw=0, alpha=0.6, clip_on=False, zorder=DOTS_ZORDER)
    _mark_failures(heat, dataset, vertical=False)
    if failed_parts(dataset):
        heat.legend(fontsize=8, loc="upper right")
    _angle_axis(heat, centre)
    heat.set_ylabel("time (depth)")
    heat.set_ylim(times[0], times[-1])


def _angle_depth_image(axis, theta: np.ndarray, times: np.ndarray, density: np.ndarray):
    """Draw `density` (time, angle) over the equally spaced angles `theta` and the saves' `times`, interpolated
    linearly between the nodes: a bilinear image where the saves are equally spaced too (the usual case), else a mesh
    of Gouraud-shaded triangles, whose drawing costs 0.5 s of CPU more at 161 saves (0.1 s at 21).  Returns the
    artist."""
    steps = np.diff(times)
    if len(times) < 2 or not (steps[0] > 0 and np.allclose(steps, steps[0], rtol=1e-6, atol=0)):
        return axis.pcolormesh(theta, times, density, shading="gouraud", cmap=CMAP, rasterized=True)
    # the nodes are the pixels' centres: the image reaches half a pixel beyond them, and the time axis is cropped
    # to the nodes' span, the mesh's (the angle axis is set by _angle_axis)
    half_angle, half_step = (theta[1] - theta[0]) / 2, steps[0] / 2
    image = axis.imshow(density, cmap=CMAP, origin="lower", aspect="auto", interpolation="bilinear",
                        extent=(theta[0] - half_angle, theta[-1] + half_angle, times[0] - half_step,
                                times[-1] + half_step))
    axis.set_ylim(times[0], times[-1])
    return image


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
    view.scale_to_drawn_peaks()
    width = 8.4 if view.panels == 2 else 7.6
    figure = plt.figure(figsize=(width, 4.6), layout="constrained")
    axes = list(figure.subplots(1, view.panels, squeeze=False, subplot_kw=view.axes_kwargs())[0])
    if view.norm is not None:
        figure.colorbar(plt.cm.ScalarMappable(view.norm, CMAP), ax=axes, shrink=0.8,
                        label="density ρ [sr⁻¹] (square-root scale)")
    times = dataset["time"].values
    title = figure.suptitle("", parse_math=False)

    def update(index):
        for axis in axes:
            axis.clear()
        view.draw(axes, index)
        for axis, label in zip(axes, view.labels()):
            axis.set_title(label, fontsize=8, color="0.3")
        title.set_text(f"{dataset.attrs.get('title', '')}: t = {time_text(times[index])}")
        return []

    return figure, update


def _circle_animation(dataset):
    """The figure and frame function of an S^1 animation: the profile of each save beside the
    angle-depth picture, its depth marked."""
    centre, times = _circle_centre(dataset), dataset["time"].values
    theta, density = _circle_window(dataset, centre)
    figure, (curve_axis, heat) = plt.subplots(1, 2, figsize=(9.5, 4), layout="constrained", width_ratios=[1, 1.2])
    (curve,) = curve_axis.plot(theta, density[0], color="C3")
    # down to the least value, not to 0: an under-resolved density dips below 0, which the still figure's profiles
    # show and the frames cut off
    curve_axis.set_ylim(1.05 * min(0.0, float(np.nanmin(density))), 1.05 * float(np.nanmax(density)))
    _angle_axis(curve_axis, centre)
    curve_axis.set_ylabel("ρ [rad⁻¹]")
    saved = np.array([_has_density(dataset, index) for index in range(len(times))])
    if saved.sum() > 1:  # one save's image has no height (as in `_depth_picture`)
        image = _angle_depth_image(heat, theta, times[saved], density[saved])
        # its colours are densities: without the bar (the still figure has one) they had no scale
        figure.colorbar(image, ax=heat, label="density ρ [rad⁻¹]", pad=0.01)
    _mark_failures(heat, dataset, vertical=False)
    marker = heat.axhline(times[0], color="cyan", lw=1.2)
    _angle_axis(heat, centre)
    heat.set_ylabel("time (depth)")
    if len(times) > 1:
        heat.set_ylim(times[0], times[-1])
    title = figure.suptitle("", parse_math=False)

    def update(index):
        curve.set_ydata(density[index])
        marker.set_ydata([times[index], times[index]])
        title.set_text(f"{dataset.attrs.get('title', '')}: t = {time_text(times[index])}")
        return [curve, marker, title]

    return figure, update
