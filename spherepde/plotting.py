"""Figures from result files (headless, matplotlib Agg): density maps and diagnostics."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .summary import open_result  # noqa: E402

PANELS = ["order_parameter", "alignment_E", "alignment_F", "w2_projection", "min_density", "spectral_tail"]


def plot_result(path: str, folder: str | None = None) -> list[str]:
    """Write <stem>.png (density over time and diagnostics); returns the paths written."""
    folder = folder or os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    stem = os.path.splitext(os.path.basename(path))[0]
    with open_result(path) as dataset:
        figure = plt.figure(figsize=(13, 6.2), constrained_layout=True)
        top, bottom = figure.subfigures(2, 1, height_ratios=[1.25, 1])
        if "theta" in dataset["density"].dims:
            _circle_heatmap(top, dataset)
        else:
            _sphere_maps(top, dataset)
        _diagnostics(bottom, dataset)
        figure.suptitle(dataset.attrs.get("title", stem))
        target = os.path.join(folder, f"{stem}.png")
        figure.savefig(target, dpi=110)
        plt.close(figure)
    return [target]


def _circle_heatmap(subfigure, dataset):
    axes = subfigure.subplots()
    density = dataset["density"]
    mesh = axes.pcolormesh(dataset["theta"], dataset["time"], density, shading="nearest", cmap="magma")
    axes.set_xlabel("theta [rad]")
    axes.set_ylabel("time (depth)")
    subfigure.colorbar(mesh, ax=axes, label="rho [1/rad]")


def _sphere_maps(subfigure, dataset, count: int = 4):
    times = dataset["time"].values
    picks = np.unique(np.linspace(0, len(times) - 1, count).round().astype(int))
    axes = np.atleast_1d(subfigure.subplots(1, len(picks)))
    lon, lat = dataset["lon"].values, dataset["lat"].values
    for axis, index in zip(axes, picks):
        mesh = axis.pcolormesh(lon, lat, dataset["density"].isel(time=index), shading="nearest", cmap="magma")
        axis.set_title(f"t = {times[index]:.3g}")
        axis.set_xlabel("lon [deg]")
        axis.set_aspect("equal")
        subfigure.colorbar(mesh, ax=axis, orientation="horizontal", label="rho [1/sr]")
    axes[0].set_ylabel("lat [deg]")


def _diagnostics(subfigure, dataset):
    names = [name for name in PANELS if name in dataset]
    axes = np.atleast_1d(subfigure.subplots(1, len(names)))
    for axis, name in zip(axes, names):
        values = dataset[name]
        if name in ("spectral_tail", "w2_projection") and np.all(np.asarray(values) > 0):
            axis.set_yscale("log")
        axis.plot(dataset["time"], values)
        axis.set_title(name)
        axis.set_xlabel("time")
