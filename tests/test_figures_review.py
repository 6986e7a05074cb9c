"""Review of the published figures: what the artists hold, read back from the matplotlib Figure and checked against
closed forms and an independent projection, not against the package's own helpers."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
from scipy.ndimage import maximum_filter
from scipy.special import ive
from test_cli import SMALL_S1
from test_plotting import S2

import spherepde
from spherepde.analysis.plotting import _circle_picture, _overview
from spherepde.io.output import write_dataset


def unit(longitude: float, latitude: float) -> np.ndarray:
    """The point of S^2 at (longitude, latitude) in degrees."""
    lon, lat = np.radians(longitude), np.radians(latitude)
    return np.array([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)])


def screen(points: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Orthographic screen coordinates (x east, y north) of `points` seen from above `centre`: the components along
    the local east and north unit vectors at the centre, written from its longitude and latitude."""
    lat, lon = np.arcsin(centre[2]), np.arctan2(centre[1], centre[0])
    east = np.array([-np.sin(lon), np.cos(lon), 0.0])
    north = np.array([-np.sin(lat) * np.cos(lon), -np.sin(lat) * np.sin(lon), np.cos(lat)])
    return np.stack([points @ east, points @ north], -1)


# three vMF peaks, kappa 60: a cluster at longitude 90, latitude 30 and two beside it (east, and north)
PEAKS = [(90.0, 30.0), (150.0, 30.0), (100.0, 60.0)]
MIXTURE = S2.replace("lmax = 12", "lmax = 32").replace('kind = "vmf"\nmean = [0.0, 0.6, -0.8]\nkappa = 6.0', f"""\
kind = "vmf_mixture"
means = {[unit(*peak).tolist() for peak in PEAKS]}
kappas = [60.0, 60.0, 60.0]
weights = [0.5, 0.3, 0.2]""").replace("t_end = 0.5\ndt = 0.05\nsave_every = 0.25", "t_end = 0.02\ndt = 0.01\n"
                                      "save_every = 0.02")


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    path = tmp_path_factory.mktemp("figures") / "mixture.nc"
    dataset = spherepde.run(spherepde.load_case_text(MIXTURE), progress=False)
    write_dataset(dataset, path)
    return dataset, str(path)


def test_s2_peaks_are_drawn_where_they_are_east_right_north_up(mixture):
    dataset, path = mixture
    centre = dataset["mean"].values[-1] / np.linalg.norm(dataset["mean"].values[-1])
    expected = screen(np.array([unit(*peak) for peak in PEAKS]), centre)
    figure = _overview(dataset, path, "orthographic", 1)
    image = figure.axes[0].get_images()[0]
    values, (left, right, bottom, top) = image.get_array().filled(0.0), image.get_extent()
    rows, columns = np.nonzero((values == maximum_filter(values, size=15)) & (values > 0.5))
    drawn = np.stack([left + (columns + 0.5) * (right - left) / values.shape[1],
                      bottom + (rows + 0.5) * (top - bottom) / values.shape[0]], -1)
    assert len(drawn) == 3
    for peak in expected:  # within a pixel or two (2 / 320)
        assert np.min(np.linalg.norm(drawn - peak, axis=1)) < 0.015, (drawn, expected)
    # the first peak's height: 0.5 kappa / (4 pi sinh kappa) e^kappa = 0.5 * 60 / (2 pi), the others 60 degrees off
    assert values.max() == pytest.approx(0.5 * 60 / (2 * np.pi), rel=2e-3)
    plt.close(figure)
    figure = _overview(dataset, path, "mollweide", 1)
    (axis,) = [axis for axis in figure.axes if axis.name == "mollweide"]
    (mesh,) = [artist for artist in axis.collections if artist.get_array() is not None]
    lon, lat = np.degrees(np.moveaxis(mesh.get_coordinates(), -1, 0))
    peak = np.unravel_index(np.argmax(mesh.get_array()), lon.shape)
    assert (lon[peak], lat[peak]) == pytest.approx((90.0, 30.0), abs=1.01)
    plt.close(figure)


S1_AT_2 = SMALL_S1.replace("mean = [1.0, 0.0]", f"mean = {[float(np.cos(2.0)), float(np.sin(2.0))]}").replace(
    "kappa = 2.0", "kappa = 30.0").replace("lmax = 16", "lmax = 32").replace(
    "t_end = 0.5\ndt = 0.05\nsave_every = 0.25", "t_end = 1.5\ndt = 0.0625\nsave_every = 0.125")


def test_s1_profiles_are_the_vmf_series_and_their_labels_the_saved_times():
    dataset = spherepde.run(spherepde.load_case_text(S1_AT_2), progress=False)
    figure = plt.figure()
    _circle_picture(figure, dataset, 5)
    heat, profiles = (axis for axis in figure.axes if axis.get_xlabel() == "angle θ [rad]")
    lines = profiles.get_lines()
    # the saves 0, 3, 6, 9, 12 of 0.125 apart: "t = 1.12" was the label of the save at 1.125
    assert [line.get_label() for line in lines] == ["t = 0", "t = 0.375", "t = 0.75", "t = 1.125", "t = 1.5"]
    theta, density = np.asarray(lines[0].get_xdata()), np.asarray(lines[0].get_ydata())
    # the initial law is the vMF's Fourier series to degree lmax = 32: (1 + 2 sum I_k / I_0 cos k (theta - 2)) / 2 pi
    series = (1 + 2 * sum(ive(k, 30.0) / ive(0, 30.0) * np.cos(k * (theta - 2.0)) for k in range(1, 33))) / (2 * np.pi)
    assert np.abs(density - series).max() < 1e-12
    assert theta[np.argmax(density)] == pytest.approx(2.0, abs=np.pi / 720)
    # the window centred on pi/2 (the mean angle 2 rounded to a quarter turn), labelled so
    assert heat.get_xlim() == pytest.approx((-np.pi / 2, 3 * np.pi / 2))
    assert [label.get_text() for label in heat.get_xticklabels()] == ["−π/2", "0", "π/2", "π", "3π/2"]
    plt.close(figure)


def test_s2_snapshot_titles_are_the_saved_times(mixture, tmp_path):
    dataset, _ = mixture
    # saves 59.75 apart (a long run): at 3 digits the last, 119.5, was titled "t = 120" and the middle one "59.8"
    stretched = dataset.isel(time=[0, 0, 1]).assign_coords(time=[0.0, 59.75, 119.5])
    path = tmp_path / "stretched.nc"
    write_dataset(stretched, path)
    figure = _overview(stretched, str(path), "mollweide", 3)
    titles = [axis.get_title() for axis in figure.axes if axis.name == "mollweide"]
    assert [title.split(" (")[0] for title in titles] == ["t = 0", "t = 59.75", "t = 119.5"]
    plt.close(figure)


def test_a_failure_is_summarised_at_the_time_of_its_last_good_save():
    """info's and the figures' title line names the last good save's time as the labels do (6 digits): at 4 a
    failure after the save at t = 1.03125 (save_every 1/32) read "t = 1.031"."""
    from spherepde.io.output import failure_summary, time_text

    summary = failure_summary("eulerian", 1.03125)
    assert summary == "eulerian run FAILED (its saves end at t = 1.03125, its last good state)"
    assert time_text(1.03125) == "1.03125"
