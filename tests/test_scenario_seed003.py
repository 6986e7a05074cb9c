"""Seed 003 end to end, checked by independent computations: the drawn peak of a concentrating density against its
spherical-harmonic series summed by scipy, and the temperature coupling against characteristics integrated in
numpy."""

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import xarray as xr
from scipy.optimize import minimize
from scipy.special import i0, sph_harm_y

import spherepde
from spherepde.analysis import concentration as cc
from spherepde.analysis.sphere_view import SphereView
from spherepde.io.output import write_dataset

CASES = Path(__file__).resolve().parent.parent / "cases"


def band_limited_maximum(dataset, index: int, nodes: int = 60) -> float:
    """The largest value of the degree-lmax series of save `index`: the coefficients by the solver grid's quadrature
    (exact for a band-limited density), the series summed by scipy on a Gauss grid of `nodes` colatitudes, its
    largest node then polished by Nelder-Mead."""
    lat, lon = np.meshgrid(np.radians(dataset["lat"].values), np.radians(dataset["lon"].values), indexing="ij")
    mass = dataset["density"].values[index] * dataset["cell_area"].values
    lmax = int(dataset.attrs["lmax"])
    terms = [(degree, order) for degree in range(lmax + 1) for order in range(-degree, degree + 1)]
    coefficients = [np.sum(mass * np.conj(sph_harm_y(*term, np.pi / 2 - lat, lon))) for term in terms]

    def density(colatitude, longitude):
        return sum((c * sph_harm_y(*term, colatitude, longitude)).real for c, term in zip(coefficients, terms))

    grid = np.meshgrid(np.arccos(np.polynomial.legendre.leggauss(nodes)[0]),
                       np.linspace(0, 2 * np.pi, 2 * nodes, endpoint=False), indexing="ij")
    values = density(*grid)
    start = [g.flat[np.argmax(values)] for g in grid]
    return float(-minimize(lambda p: -density(*p), start, method="Nelder-Mead", options={"xatol": 1e-8}).fun)


@pytest.fixture(scope="module")
def beta30(tmp_path_factory):
    """(its file's path, the dataset read back) of seed003-baseline-beta30 at lmax 24 to t = 1, saved every 0.5."""
    case = spherepde.load_case(CASES / "seed003-baseline-beta30.toml", [
        "solver.device='cpu'", "solver.method='eulerian'", "sphere.lmax=24", "time.t_end=1.0",
        "time.save_every=0.5"])
    path = tmp_path_factory.mktemp("beta30") / "beta30.nc"
    write_dataset(spherepde.run(case, progress=False), path)
    return path, xr.load_dataset(path)


@pytest.fixture(scope="module")
def beta30_peaks(beta30):
    """band_limited_maximum of each save of `beta30` (4 s a save: computed once for the tests that read them)."""
    return [band_limited_maximum(beta30[1], index) for index in range(beta30[1].sizes["time"])]


def test_snapshot_colour_scale_reaches_the_peak_it_draws(beta30, beta30_peaks):
    # beta = 30 from the uniform law, eps = 0: two clusters at +-e1 sharpen between the nodes of the lmax 24 grid,
    # whose largest value (3.29 at t = 1) the snapshots' scale and title took for the density's (3.58): the drawn
    # peak was cut flat
    path, dataset = beta30
    peak = beta30_peaks[2]
    assert peak > 1.05 * float(dataset["density"].values[2].max())  # the grid misses the peak
    view = SphereView(dataset, str(path), "orthographic")
    view.own_scale = True
    figure, axes = plt.subplots(1, 2)
    view.draw(list(axes), 2)
    images = [axis.get_images()[0] for axis in axes]
    top = images[0].norm.vmax
    assert 0.99 * peak < top <= peak, (top, peak)  # the fine grid of 1 degree: 0.4% below the peak
    assert all(float(image.get_array().max()) <= top for image in images)
    assert view.maxima[2] == top  # the title's "max ρ"
    plt.close(figure)


def test_animation_colour_bar_reaches_the_peak_its_frames_draw(beta30, beta30_peaks):
    # the same run: the animation's one scale for every frame came from the solver's grid too (3.29 at t = 1, the
    # frames drawing 3.58), so the colour bar stopped short of the peaks and cut them flat
    from spherepde.analysis.plotting import _sphere_animation

    path, dataset = beta30
    peak = max(beta30_peaks)
    figure, update = _sphere_animation(dataset, str(path), "orthographic")
    tops = set()
    for index in range(dataset.sizes["time"]):
        update(index)
        drawn = [image for axis in figure.axes for image in axis.get_images()]
        assert drawn and all(float(image.get_array().max()) <= image.norm.vmax for image in drawn)
        tops |= {image.norm.vmax for image in drawn}
    (top,) = tops  # one scale for every frame, the colour bar's
    assert 0.99 * peak < top <= peak, (top, peak)
    plt.close(figure)


def test_temperature_coupling_on_the_circle_follows_independent_characteristics():
    # eps = 0, softmax at beta = 1, B = V = I, vMF(kappa 1) at e1: the coupling failed on S^1 (reshaped its
    # nodes into triples); here both flows run in numpy from 400 equal-angle nodes of rho_0
    case = spherepde.load_case(CASES / "kuramoto-s1.toml", [
        "solver.device='cpu'", "solver.method='eulerian'", "sphere.lmax=16", "model.kernel='softmax'",
        "model.beta=1.0", "model.eps=0.0", "time.t_end=1.0", "time.save_every=0.25"])
    assert case["initial"] == {"kind": "vmf", "mean": [1.0, 0.0], "kappa": 1.0}
    dataset = spherepde.run(case, progress=False)
    coupling = cc.temperature_coupling(dataset)

    theta = dataset["theta"].values
    keys = np.stack([np.cos(theta), np.sin(theta)], -1)
    masses = np.clip(dataset["density"].values * dataset["cell_area"].values, 0, None)

    def tangent(x, v):  # at the stages' radial projections, as the characteristics of the sphere
        x = x / np.linalg.norm(x, axis=-1, keepdims=True)
        return v - np.sum(x * v, -1, keepdims=True) * x

    def finite(save, x):  # softmax attention of save `save`, B = V = I, beta = 1
        weights = np.exp(x @ keys.T / np.linalg.norm(x, axis=-1, keepdims=True)) * masses[save]
        return tangent(x, weights @ keys / weights.sum(1, keepdims=True))

    def infinite(save, x):  # V B^T x / |B^T x| is radial: the zero-temperature field vanishes
        return tangent(x, x)

    angles = 2 * np.pi * np.arange(400) / 400
    start = np.stack([np.cos(angles), np.sin(angles)], -1)
    weights = np.exp(np.cos(angles)) / (400 * i0(1.0))
    h = 2 * float(dataset["time"].values[1])
    flows = []
    for field in (finite, infinite):
        x = start.copy()
        for save in (0, 2):
            k1 = field(save, x)
            k2 = field(save + 1, x + h / 2 * k1)
            k3 = field(save + 1, x + h / 2 * k2)
            k4 = field(save + 2, x + h * k3)
            x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
            x /= np.linalg.norm(x, axis=-1, keepdims=True)
            flows.append(x)
    upper = [np.sqrt(weights @ np.sum((b - f) ** 2, -1)) for b, f in zip(flows[:2], flows[2:])]
    np.testing.assert_allclose(coupling["time"], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(coupling["upper"][1:], upper, rtol=1e-6)
    assert 0.1 < upper[0] < upper[1]  # the finite-beta flow gathers rho_0 while the zero-temperature one is still


def test_temperature_coupling_refuses_a_particle_run_in_one_line():
    case = spherepde.load_case(CASES / "seed003-baseline-beta30.toml", [
        "solver.device='cpu'", "solver.method='particles'", "particles.n=64", "time.t_end=0.5"])
    run = spherepde.run(case, progress=False)
    with pytest.raises(ValueError, match="Eulerian density"):
        cc.temperature_coupling(run)
