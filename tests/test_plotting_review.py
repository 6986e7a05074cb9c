"""What a figure draws, read back from its artists and checked against the file by independent computations:
curves that coincide stay visible, animation limits, the orthographic pixels' positions, the Mollweide graticule's
labels and a training's title."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from test_cli import SMALL_S1
from test_plotting import S2

import spherepde
from spherepde.analysis.diagnostic_panels import _diagnostics
from spherepde.analysis.plotting import _circle_animation, _title
from spherepde.analysis.sphere_view import PIXELS, SphereView
from spherepde.io.output import write_dataset


@pytest.fixture(scope="module")
def s1():
    return spherepde.run(spherepde.load_case_text(SMALL_S1), progress=False)


def trigonometric_interpolant(values: np.ndarray, theta0: float, angles: np.ndarray) -> np.ndarray:
    """The trigonometric polynomial through `values` at theta0 + 2 pi k / n, evaluated term by term at `angles`
    (the Nyquist term as a cosine)."""
    n = values.size
    coefficients = np.fft.fft(values) / n
    total = np.zeros(angles.shape, complex)
    for k, c in zip(np.fft.fftfreq(n, 1 / n), coefficients):
        total += c * (np.cos(k * (angles - theta0)) if abs(k) == n / 2 else np.exp(1j * k * (angles - theta0)))
    return total.real


def test_alignment_f_equal_to_alignment_e_does_not_hide_it(s1):
    # B = V: alignment_E equals alignment_F; F, drawn solid over E, hid it
    series = np.linspace(0.3, 0.9, s1.sizes["time"])
    dataset = s1.assign(alignment_E=("time", series), alignment_F=("time", series.copy()))
    figure = plt.figure()
    _diagnostics(figure, dataset)
    (axis,) = [axis for axis in figure.get_axes() if axis.get_title() == "alignment"]
    lines = {line.get_label(): line for line in axis.get_lines()}
    e, f = lines["alignment_E, Eulerian"], lines["alignment_F, Eulerian"]
    np.testing.assert_array_equal(e.get_xydata()[:, 1], series)
    np.testing.assert_array_equal(f.get_xydata()[:, 1], series)
    assert e.get_linestyle() == "-" and f.get_linestyle() == "--"
    plt.close(figure)


def test_circle_animation_shows_a_density_below_zero(s1):
    # an under-resolved density dips below 0: the frames' axis started at 0 and cut the dip off
    dipped = s1.assign(density=s1["density"] - 0.8 * float(s1["density"].min()) - 0.3)
    figure, _ = _circle_animation(dipped)
    theta = dipped["theta"].values
    fine = np.linspace(0, 2 * np.pi, 4001)
    least = min(trigonometric_interpolant(row, theta[0], fine).min() for row in dipped["density"].values)
    assert least < -0.2
    low, high = figure.get_axes()[0].get_ylim()
    assert low <= least and high >= float(dipped["density"].max())
    plt.close(figure)


@pytest.fixture(scope="module")
def sphere(tmp_path_factory):
    path = tmp_path_factory.mktemp("review") / "s2.nc"
    write_dataset(spherepde.run(spherepde.load_case_text(S2), progress=False), path)
    return str(path)


def test_orthographic_pixels_sit_at_their_samples(sphere):
    # the disk is sampled at np.linspace(-1, 1, PIXELS): the pixels' centres must be there, where the graticule, the
    # limb and the particles are drawn; the image spanned [-1, 1] and put pixel k at -1 + (2 k + 1) / PIXELS
    import xarray as xr

    with xr.open_dataset(sphere) as dataset:
        view = SphereView(dataset, sphere, "orthographic")
        figure, axes = plt.subplots(1, 2)
        view.draw(list(axes), 0)
    left, right, bottom, top = axes[0].images[0].get_extent()
    centres = left + (right - left) * (np.arange(PIXELS) + 0.5) / PIXELS
    np.testing.assert_allclose(centres, np.linspace(-1, 1, PIXELS), atol=1e-12)
    np.testing.assert_allclose([bottom, top], [left, right])
    plt.close(figure)


def test_mollweide_graticule_is_labelled_in_the_files_longitudes(sphere):
    # the map had no tick labels: nothing said where longitude 0 is or which way is east.  The cluster's mean
    # (0, 0.6, -0.8) is at longitude 90, latitude -53.13 degrees
    import xarray as xr

    with xr.open_dataset(sphere) as dataset:
        view = SphereView(dataset, sphere, "mollweide")
        figure = plt.figure()
        axis = figure.add_subplot(projection="mollweide")
        view.draw([axis], 0)
    labels = {round(np.degrees(tick)): text.get_text() for tick, text in
              zip(axis.get_xticks(), axis.get_xticklabels())}
    assert labels[-120] == "240°" and labels[0] == "0°" and labels[60] == "60°" and labels[90] == ""
    latitudes = {round(np.degrees(tick)): text.get_text() for tick, text in
                 zip(axis.get_yticks(), axis.get_yticklabels())}
    assert latitudes[-60] == "-60°" and latitudes[30] == "30°"
    mesh = axis.collections[0]
    lon, lat = np.moveaxis(mesh.get_coordinates(), -1, 0)
    peak = np.unravel_index(np.argmax(mesh.get_array()), lon.shape)
    assert abs(np.degrees(lon[peak]) - 90) <= 1 and abs(np.degrees(lat[peak]) + 53.13) <= 1
    plt.close(figure)


def test_a_trainings_title_gives_its_cost_at_the_first_and_last_iterations(s1):
    # the title said "run" alone, as of an uncontrolled flow
    trained = s1.assign(loss=(("iteration",), [2.0, 1.5, np.nan, 0.75])).assign_coords(iteration=[0, 1, 2, 3])
    assert "\n[control]\n" in s1.attrs["case"]
    control = '\n[control]\nloss = "align"\nlambda_reg = 0.01\n'
    trained.attrs.update(case=s1.attrs["case"].replace("\n[control]\n", control), optimizer_stop="control.tol reached")
    title = _title(trained, "run.nc")
    assert ("trained control (loss = align, lambda_reg = 0.01): J = 2 at iteration 0, 0.75 at iteration 3 "
            "(control.tol reached)") in title
    assert "trained" not in _title(s1, "run.nc")


def test_a_title_names_every_head_and_an_mlp(s1):
    # the title named head 0's kernel and beta alone, as of a one-head linear model
    case = spherepde.load_case_text(s1.attrs["case"], ["model.feed_forward='mlp'", "model.hidden=8",
                                                        "model.activation='relu'",
                                                        "model.extra_heads=[{kernel = 'softmax', beta = 4.0}]"])
    title = _title(s1.assign_attrs(case=case.text), "run.nc")
    assert "; extra heads: softmax beta = 4.0; MLP feed-forward (8 relu units)" in title
    assert "extra heads" not in _title(s1, "run.nc") and "MLP" not in _title(s1, "run.nc")


def test_a_both_files_under_resolved_span_names_the_eulerian_run():
    """The span after resolved_until covers both runs' curves of a "both" file, but only the Eulerian run has a
    spectral tail to lose: its legend said "under-resolved" over the particles' curves too."""
    case = spherepde.load_case_text(SMALL_S1).with_overrides(["solver.method='both'", "particles.n=200"])
    dataset = spherepde.run(case, progress=False).assign_attrs(resolved_until=0.25)
    figure = plt.figure()
    _diagnostics(figure, dataset)
    spans = {text.get_text() for axis in figure.get_axes() if axis.get_legend()
             for text in axis.get_legend().get_texts() if "resolved" in text.get_text()}
    assert spans == {"Eulerian under-resolved"}
    plt.close(figure)
