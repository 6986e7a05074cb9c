"""Figures: what they draw is the stored run (values, orientation, views), and every kind of
result file (S^1, S^2, particles, a solver = "both" file, a sweep) gives a figure."""

import numpy as np
import pytest
import xarray as xr
from PIL import Image
from test_cli import SMALL_S1

import spherepde
from spherepde.analysis.diagnostic_panels import _controls, _curves, _diagnostics
from spherepde.analysis.plotting import _circle_centre, _circle_density, _circle_picture, _circle_window
from spherepde.analysis.sphere_view import PIXELS, SphereDensity, SphereView, _disk_points, _view_frame
from spherepde.api.sweep import combine, plan, run_batch
from spherepde.base.device import placement
from spherepde.cli import main
from spherepde.discretisation.bases import make_basis
from spherepde.io.output import write_dataset
from spherepde.model.initial import density_from_file

S2 = SMALL_S1.replace("dim = 2", "dim = 3").replace("lmax = 16", "lmax = 12").replace(
    "mean = [1.0, 0.0]", "mean = [0.0, 0.6, -0.8]").replace("kappa = 2.0", "kappa = 6.0")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """An S^2 run, an S^1 run with its cluster at angle pi, and the S^1 run with particles added."""
    folder = tmp_path_factory.mktemp("plots")
    paths = {"s2": folder / "s2.nc", "s1": folder / "s1.nc"}
    write_dataset(spherepde.run(spherepde.load_case_text(S2), progress=False), paths["s2"])
    s1 = spherepde.run(spherepde.load_case_text(SMALL_S1, ["initial.mean=[-1.0, 0.0]"]), progress=False)
    write_dataset(s1, paths["s1"])
    rng = np.random.default_rng(0)
    angles = np.pi + 0.4 * rng.standard_normal((s1.sizes["time"], 50))
    with_particles = s1.assign(
        particles=(("time", "particle", "component"), np.stack([np.cos(angles), np.sin(angles)], -1)),
        order_parameter_stderr=("time", np.full(s1.sizes["time"], 0.01)))
    paths["s1_particles"] = folder / "s1_particles.nc"
    write_dataset(with_particles, paths["s1_particles"])
    paths["particles_only"] = folder / "particles_only.nc"
    write_dataset(with_particles.drop_vars(["density", "cell_area"]), paths["particles_only"])
    paths["diagnostics_only"] = folder / "diagnostics_only.nc"  # a particle run with particles.save = 0
    write_dataset(with_particles.drop_vars(["density", "cell_area", "particles"]), paths["diagnostics_only"])
    return paths


def test_sphere_density_is_resampled_where_it_was_stored(results):
    with xr.open_dataset(results["s2"]) as dataset:
        density = SphereDensity(dataset, str(results["s2"]))
        lat, lon = np.meshgrid(dataset["lat"].values, dataset["lon"].values, indexing="ij")
        for index in (0, dataset.sizes["time"] - 1):
            stored = dataset["density"].values[index]
            resampled = density.sample(index, lat, lon)
            assert np.abs(resampled - stored).max() < 1e-3 * stored.max()


def test_sphere_density_is_synthesised_as_by_the_full_basis(results):
    """The fine grid (lmax 120) is synthesised by the scalar transforms alone: the values of the full basis (which
    made it before, at 4 times the set-up), bit for bit."""
    with xr.open_dataset(results["s2"]) as dataset:
        density = SphereDensity(dataset, str(results["s2"]))
        full = make_basis(3, density.basis.lmax, placement("cpu", "float64"))
        assert density.basis.lmax == 120 and density.basis.sht._dP is None and full.sht._dP is not None
        last = dataset.sizes["time"] - 1
        synthesised = full.synthesis(density_from_file(str(results["s2"]), last, full)).numpy()
        assert np.array_equal(density.grid(last)[1:-1, :-1], synthesised[density.order])


def test_orthographic_views_face_the_final_mean():
    frame = _view_frame(np.array([1.0, 0.0, 0.0]))
    assert np.allclose(frame, [[0, 1, 0], [0, 0, 1], [1, 0, 0]])  # east right, north up, centre towards us
    lat, lon, inside = _disk_points(_view_frame(np.array([0.0, 0.6, -0.8])))
    middle = PIXELS // 2
    assert inside[middle, middle] and not inside[0, 0]
    assert np.isclose(lat[middle, middle], np.degrees(np.arcsin(-0.8))) and np.isclose(lon[middle, middle], 90.0)
    assert lat[middle + 10, middle] > lat[middle, middle] > lat[middle - 10, middle]  # up is north
    assert np.mod(lon[middle, middle + 10] - 90, 360) < 180 and np.mod(lon[middle, middle - 10] - 90, 360) > 180


def test_front_disk_centre_holds_the_cluster(results):
    with xr.open_dataset(results["s2"]) as dataset:
        view = SphereView(dataset, str(results["s2"]), "orthographic")
        last = dataset.sizes["time"] - 1
        middle = PIXELS // 2
        (front_lat, front_lon, _), (back_lat, back_lon, _) = view.disks
        front = view.density.sample(last, front_lat[middle, middle], front_lon[middle, middle])
        back = view.density.sample(last, back_lat[middle, middle], back_lon[middle, middle])
        assert front > 0.9 * dataset["density"].values[last].max() and back < 0.1 * front


def test_circle_window_puts_the_cluster_in_the_middle(results):
    with xr.open_dataset(results["s1"]) as dataset:
        centre = _circle_centre(dataset)
        theta, density = _circle_window(dataset, centre)
        assert np.isclose(centre, np.pi) and np.isclose(theta[-1] - theta[0], 2 * np.pi)
        assert np.allclose(np.diff(theta), theta[1] - theta[0])
        assert np.isclose(theta[np.argmax(density[-1])], np.pi, atol=theta[1] - theta[0])
        # re-synthesised on a multiple of the stored grid's points: at those, its values
        stored = dataset["density"].values
        gaps = np.angle(np.exp(1j * (theta[:-1, None] - dataset["theta"].values[None])))
        at_nodes = (np.abs(gaps) < 1e-9).any(1)
        assert at_nodes.sum() == stored.shape[1]
        assert np.allclose(np.sort(density[:, :-1][:, at_nodes], axis=1), np.sort(stored, axis=1), atol=1e-14)


def test_the_angle_depth_picture_holds_the_density_at_its_nodes(results):
    """Saves equally spaced: a bilinear image whose pixel centres are the nodes (angle, time) of the re-synthesised
    density, the time axis cropped to the saves; saves that are not: the Gouraud mesh through the nodes."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import QuadMesh

    with xr.open_dataset(results["s1"]) as dataset:
        theta, density = _circle_window(dataset, _circle_centre(dataset))
        times = dataset["time"].values
        assert np.allclose(np.diff(times), 0.25)
        figure = plt.figure()
        _circle_picture(figure, dataset, 2)
        heat = figure.axes[0]
        (image,) = heat.get_images()
        assert np.array_equal(image.get_array(), density)
        left, right, bottom, top = image.get_extent()
        assert np.allclose(left + (np.arange(len(theta)) + 0.5) * (right - left) / len(theta), theta)
        assert np.allclose(bottom + (np.arange(len(times)) + 0.5) * (top - bottom) / len(times), times)
        assert heat.get_ylim() == (times[0], times[-1])
        plt.close(figure)
        uneven = dataset.assign_coords(time=[0.0, 0.25, 0.6])
        figure = plt.figure()
        _circle_picture(figure, uneven, 2)
        heat = figure.axes[0]
        (mesh,) = [artist for artist in heat.collections if isinstance(artist, QuadMesh)]
        assert not heat.get_images() and np.array_equal(mesh.get_array(), density)
        assert np.array_equal(mesh.get_coordinates()[:, 0, 1], [0.0, 0.25, 0.6])
        plt.close(figure)


def test_circle_densities_are_drawn_from_their_fourier_series():
    """A trigonometric polynomial of degree 7 on 20 (even) and 21 (odd) points is re-synthesised on 720 and 735
    points to round-off, where the polyline through its nodes misses by a tenth of its size."""
    for points in (20, 21):
        theta = 2 * np.pi * np.arange(points) / points

        def rho(angle):
            return 1 / (2 * np.pi) + 0.1 * np.cos(3 * angle) + 0.05 * np.sin(7 * angle - 0.3)
        dataset = xr.Dataset({"density": (("time", "theta"), rho(theta)[None])}, coords={"theta": theta})
        fine, values = _circle_density(dataset)
        assert len(fine) == {20: 720, 21: 735}[points] and np.abs(values[0] - rho(fine)).max() < 1e-15
        assert np.abs(np.interp(fine, np.append(theta, 2 * np.pi), np.append(rho(theta), rho(0.0)))
                      - rho(fine)).max() > 0.01


def test_error_bands_come_from_standard_errors(results):
    with xr.open_dataset(results["s1_particles"]) as dataset:
        [(label, values, stderr)] = _curves(dataset, "order_parameter")
        assert label == "Eulerian" and np.allclose(stderr, 0.01)
        [(_, drift, none)] = _curves(dataset, "mass")
        assert none is None and np.all(drift.values < 1e-14)


def test_training_panels_draw_the_controls_per_layer_and_name_each_alignment(results):
    """|W_l|_F stands on the l-th of L equal slices of [0, t_end] (t_end from the stored case, 0.5 in SMALL_S1),
    and the alignment panel's two curves are told apart by their variable."""
    import matplotlib.pyplot as plt

    with xr.open_dataset(results["s1"]) as dataset:
        W = np.array([[[3.0, 4.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]]])
        rising = np.linspace(0.5, 0.9, dataset.sizes["time"])  # SMALL_S1's E is the plane: make both informative
        trained = dataset.assign(W=(("layer", "row", "col"), W), alignment_E=("time", rising),
                                 interaction_gap=("time", rising), alignment_F=("time", rising ** 2),
                                 loss=(("iteration",), [2.0, 1.5, 1.2]),
                                 terminal_loss=(("iteration",), [2.0, 1.4, 1.1]))
        figure, axis = plt.subplots()
        _controls(axis, trained)
        heights, edges, baseline = axis.patches[0].get_data()
        assert np.allclose(heights, [5.0, 1.0, 2.0]) and np.allclose(edges, [0, 0.5 / 3, 1 / 3, 0.5])
        assert baseline is None  # no line down to 0 at the ends, which would read as W = 0 there
        plt.close(figure)
        # a feed-forward's groups (no W): one curve each, |W1_l|_F and |b_l|
        W1 = np.array([[[1.0, 2.0], [2.0, 4.0]], [[0.0, 0.0], [3.0, 4.0]], [[1.0, 0.0], [0.0, 0.0]]])
        mlp = trained.drop_vars("W").assign(W1=(("layer", "hidden", "col"), W1), b=(("layer", "hidden"), W1[:, 0]))
        figure, axis = plt.subplots()
        _controls(axis, mlp)
        assert [text.get_text() for text in axis.get_legend().get_texts()] == ["W1", "b"]
        assert np.allclose(axis.patches[0].get_data()[0], [5.0, 5.0, 1.0])
        assert np.allclose(axis.patches[1].get_data()[0], [np.sqrt(5.0), 0.0, 1.0])
        plt.close(figure)
        figure = plt.figure()
        _diagnostics(figure, trained)
        titles = {axis.get_title(): axis for axis in figure.axes}
        expected = {"controls per layer, |.|_F", "training cost", "energy gap: E, or its interaction part, - min"}
        assert expected <= set(titles)
        labels = [text.get_text() for text in titles["alignment"].get_legend().get_texts()]
        assert labels[:2] == ["alignment_E, Eulerian", "alignment_F, Eulerian"]
        plt.close(figure)


@pytest.mark.parametrize("name, options, files", [
    ("s2", ["--animate"], ["s2.png", "s2.gif"]),
    ("s2", ["--projection", "mollweide", "--snapshots", "3"], ["s2.png"]),
    ("s1", ["--animate"], ["s1.png", "s1.gif"]),
    ("s1_particles", [], ["s1_particles.png"]),
    ("particles_only", [], ["particles_only.png"]),
    ("diagnostics_only", [], ["diagnostics_only.png"]),
])
def test_plot_command_writes_every_figure(results, tmp_path, capsys, name, options, files):
    assert main(["plot", str(results[name]), "-o", str(tmp_path)] + options) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    for file in files:
        with Image.open(tmp_path / file) as image:
            assert image.size[0] > 600
            if file.endswith(".gif"):
                with xr.open_dataset(results[name]) as dataset:
                    assert image.n_frames == dataset.sizes["time"]
            else:  # a real picture: many distinct colours, not a blank canvas
                assert len(image.convert("RGB").getcolors(maxcolors=1 << 20)) > 500


def test_sweep_figure_and_one_line_refusals(tmp_path, capsys):
    members = plan(spherepde.load_case_text(SMALL_S1), ["model.eps=0.1,0.3"], str(tmp_path / "sweep"))
    summaries = {s["member"]: s for s in run_batch([m.index for m in members], [m.case.text for m in members],
                                                     [m.path for m in members])}
    combine(members[0].case, members, summaries, str(tmp_path / "sweep.nc"), ["model.eps=0.1,0.3"], None)
    assert main(["plot", str(tmp_path / "sweep.nc")]) == 0
    assert (tmp_path / "sweep.png").stat().st_size > 50_000
    # a member has one colour in every panel, the legend's; a panel's curves differ in line style
    import matplotlib.pyplot as plt

    with xr.open_dataset(tmp_path / "sweep.nc") as sweep:
        rising = np.linspace(0.5, 0.9, sweep.sizes["time"])
        sweep = sweep.assign(alignment_E=(("member", "time"), [rising, rising ** 2]),
                             alignment_F=(("member", "time"), [rising ** 3, rising ** 4]))
        figure = plt.figure()
        _diagnostics(figure, sweep)
        panel = next(axis for axis in figure.axes if axis.get_title() == "alignment")
        drawn = [(line.get_color(), line.get_linestyle()) for line in panel.get_lines() if len(line.get_xdata())]
        assert drawn == [("C0", "-"), ("C1", "-"), ("C0", "--"), ("C1", "--")]
        assert [text.get_text() for text in panel.get_legend().get_texts()] == ["alignment_E, Eulerian",
                                                                                 "alignment_F, Eulerian"]
        assert [text.get_text() for text in figure.legends[0].get_texts()] == ["model.eps = 0.1", "model.eps = 0.3"]
        plt.close(figure)
    assert main(["info", str(tmp_path / "sweep.nc")]) == 0
    table = capsys.readouterr().out.splitlines()[-3:]
    assert table[0].split() == ["member", "model_eps", "order_parameter", "status"]
    assert [row.split()[:2] for row in table[1:]] == [["0", "0.1"], ["1", "0.3"]] and "completed" in table[2]
    for args, named in ((["--animate"], "--animate"), (["--projection", "gnomonic"], "projection")):
        assert main(["plot", str(tmp_path / "sweep.nc")] + args) == 2
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1


def test_a_sweep_figure_tells_every_member_apart_and_fades_each_after_its_own_loss_of_resolution(tmp_path):
    """Twelve members: twelve colours (member i took C{i % 10}, so members 0 and 10 were one line), and each curve
    faded from its own member_resolved_until on, where every member's panel was shaded from the first loss."""
    import matplotlib.pyplot as plt

    members = plan(spherepde.load_case_text(SMALL_S1), ["model.eps=0.1,0.3"], str(tmp_path / "sweep"))
    summaries = {s["member"]: s for s in run_batch([m.index for m in members], [m.case.text for m in members],
                                                     [m.path for m in members])}
    combine(members[0].case, members, summaries, str(tmp_path / "sweep.nc"), ["model.eps=0.1,0.3"], None)
    with xr.open_dataset(tmp_path / "sweep.nc") as sweep:
        twelve = xr.concat([sweep.isel(member=[0])] * 12, "member").assign_coords(
            member=np.arange(12), model_eps=("member", 0.1 * np.arange(1, 13)))
    time = twelve["time"].values
    lost = time[1]
    twelve["member_resolved_until"] = ("member", np.r_[lost, np.full(11, np.inf)])
    twelve.attrs["resolved_until"] = float(lost)
    figure = plt.figure()
    _diagnostics(figure, twelve)
    panel = next(axis for axis in figure.axes if axis.get_title().startswith("order parameter"))
    lines = [line for line in panel.get_lines() if len(line.get_xdata())]
    solid = [line for line in lines if line.get_alpha() is None]
    assert len({line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color())
                for line in solid}) == 12
    faded = [line for line in lines if line.get_alpha() is not None]
    assert len(faded) == 1 and list(faded[0].get_xdata()) == list(time[1:])
    assert list(solid[0].get_xdata()) == list(time[:2])
    assert not panel.patches  # no span shaded for every member
    assert figure.legends[0].get_texts()[-1].get_text() == "faded: under-resolved"
    plt.close(figure)


def test_a_figure_never_replaces_its_result_and_odd_files_are_one_line_refusals(results, tmp_path, capsys):
    """A result named RUN.png is refused by plot (its figure would be RUN.png) and by run --plot before the run;
    a save cut with time as a number, a file without lmax, a figure's path taken by a folder and --animate of an
    S^2 run with neither density nor particles are one-line refusals (they were tracebacks, an error naming a
    temporary file, or a GIF of empty spheres)."""
    import shutil

    disguised = tmp_path / "run.png"
    shutil.copy(results["s1"], disguised)
    before = disguised.read_bytes()
    assert main(["plot", str(disguised)]) == 2 and disguised.read_bytes() == before
    assert "would replace the result" in capsys.readouterr().err
    # RUN.png beside RUN.nc that is no image (another result) is refused; an earlier figure is replaced
    shutil.copy(results["s1"], tmp_path / "run.nc")
    assert main(["plot", str(tmp_path / "run.nc")]) == 2 and disguised.read_bytes() == before
    assert "exists and is not a PNG or GIF image" in capsys.readouterr().err
    disguised.unlink()
    assert main(["plot", str(tmp_path / "run.nc")]) == 0 and main(["plot", str(tmp_path / "run.nc")]) == 0
    (tmp_path / "run.nc").unlink()
    disguised.unlink()
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    assert main(["run", str(case), "-o", str(tmp_path / "out.png"), "--plot", "--quiet"]) == 2
    assert not (tmp_path / "out.png").exists() and "would replace the result" in capsys.readouterr().err
    with xr.open_dataset(results["s2"]) as dataset:
        dataset.isel(time=-1).to_netcdf(tmp_path / "one_save.nc")
        no_lmax = dataset.copy()  # its own attrs: Dataset.drop_attrs is xarray >= 2024.10's
        del no_lmax.attrs["lmax"]
        no_lmax.to_netcdf(tmp_path / "no_lmax.nc")
        dataset.drop_vars(["density", "cell_area"]).to_netcdf(tmp_path / "diagnostics_only_s2.nc")
    (tmp_path / "folder.png").mkdir()
    shutil.copy(results["s1"], tmp_path / "folder.nc")
    for args, named in ((["info", "one_save.nc"], "time as a number"), (["plot", "one_save.nc"], "time as a number"),
                        (["plot", "folder.nc"], "is a folder"),
                        (["plot", "no_lmax.nc"], "no lmax attribute"),
                        (["plot", "diagnostics_only_s2.nc", "--animate"], "has neither")):
        assert main([args[0], str(tmp_path / args[1])] + args[2:]) == 2
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, err


def test_s1_profiles_follow_snapshots_and_views_face_the_density_where_the_mean_vanishes(results):
    """--snapshots sets the S^1 profiles drawn too (they were always 5); an S^2 run whose mean vanishes (antipodal
    clusters) is viewed from its density's maximum, and says so (it said "the final mean" of the north pole)."""
    import matplotlib.pyplot as plt

    with xr.open_dataset(results["s1"]) as dataset:
        for count in (2, 3):
            figure = plt.figure()
            _circle_picture(figure, dataset, count)
            profiles = figure.axes[1]
            assert len(profiles.get_lines()) == count
            plt.close(figure)
    with xr.open_dataset(results["s2"]) as dataset:
        still = dataset.assign(mean=dataset["mean"] * 0)
        view = SphereView(still, str(results["s2"]), "orthographic")
        last = dataset["density"].isel(time=-1)
        j, k = np.unravel_index(int(np.argmax(last.values)), last.shape)
        lat, lon = np.radians(float(last["lat"][j])), np.radians(float(last["lon"][k]))
        assert np.allclose(view.centre, [np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)])
        assert view.labels()[0].startswith("centred on the density's maximum")
        assert SphereView(dataset, str(results["s2"]), "orthographic").labels()[0].startswith(
            "centred on the final mean")


def test_options_the_figure_does_not_use_are_one_line_refusals(results, tmp_path, capsys):
    """--projection on S^1 (no map) and --snapshots of a file drawn as diagnostics alone were silently accepted,
    as if drawn; they are refused as --animate of a sweep is, and the defaults still draw every file."""
    for name, args, named in (("s1", ["--projection", "mollweide"], "--projection"),
                              ("s1_particles", ["--projection", "orthographic"], "--projection"),
                              ("diagnostics_only", ["--snapshots", "3"], "--snapshots")):
        assert main(["plot", str(results[name]), "-o", str(tmp_path)] + args) == 2
        err = capsys.readouterr().err
        assert named in err and repr(str(results[name])) in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.iterdir())
    assert main(["plot", str(results["s1"]), "-o", str(tmp_path), "--snapshots", "2"]) == 0


def _w2_panel(dataset):
    """The W2 panel of `dataset`'s diagnostics figure (closed), and its legend's labels."""
    import matplotlib.pyplot as plt

    figure = plt.figure()
    _diagnostics(figure, dataset)
    panel = next(axis for axis in figure.axes if axis.get_title().startswith("W2"))
    labels = [text.get_text() for text in panel.get_legend().get_texts()] if panel.get_legend() else []
    plt.close(figure)
    return panel, labels


def test_the_quantisation_band_is_drawn_only_where_it_can_be_seen(results):
    """A particle run's bound on S^1 is the rearrangement's certified excess, 2.2e-16: its band was drawn (no pixel
    wide) with a legend entry; a bound of 0.01 against W2 of 0.3 is drawn."""
    with xr.open_dataset(results["s1_particles"]) as dataset:
        rising = dataset.assign(w2_projection=("time", np.linspace(0.0, 0.3, dataset.sizes["time"])))
        for bound, drawn in ((2.220446049250313e-16, False), (0.01, True)):
            _, labels = _w2_panel(rising.assign_attrs(w2_quantisation_bound=bound))
            assert any("w2_quantisation_bound" in label for label in labels) == drawn, (bound, labels)


def test_sweep_panels_take_no_margin_from_the_bands_they_do_not_draw(results):
    """A sweep draws a curve per member, no standard-error bands: a standard error of 10 set y limits 20 beyond a
    curve between 0.4 and 0.7."""
    import matplotlib.pyplot as plt

    with xr.open_dataset(results["s1_particles"]) as dataset:
        run = dataset.drop_vars(["density", "particles"])
        values = np.linspace(0.4, 0.7, run.sizes["time"])
        sweep = xr.concat([run.assign(order_parameter=("time", values)),
                           run.assign(order_parameter=("time", values[::-1]))], "member")
        sweep["order_parameter_stderr"] = (("member", "time"), np.full((2, run.sizes["time"]), 10.0))
    figure = plt.figure()
    _diagnostics(figure, sweep)
    panel = next(axis for axis in figure.axes if axis.get_title().startswith("order parameter"))
    assert not panel.collections  # no bands
    low, high = panel.get_ylim()
    assert 0.3 < low < 0.4 and 0.7 < high < 0.8, (low, high)
    plt.close(figure)


def test_a_single_save_is_drawn_as_its_profile_and_its_values_as_dots(results):
    """One save has no depth: its angle-depth picture was an empty frame (an image of no height) beside a colour
    bar, and the diagnostics' one-point lines drew nothing.  Now the profile alone, and dots."""
    import matplotlib.pyplot as plt

    with xr.open_dataset(results["s1_particles"]) as dataset:
        single = dataset.isel(time=[0])
        theta, density = _circle_window(single, _circle_centre(single))
        figure = plt.figure()
        _circle_picture(figure, single, 4)
        (profiles,) = figure.axes  # no angle-depth picture, no colour bar
        (line,) = profiles.get_lines()
        assert np.array_equal(line.get_ydata(), density[0]) and "one save" in profiles.get_title()
        assert len(profiles.patches) == 1  # the particles' histogram
        plt.close(figure)
        figure = plt.figure()
        _diagnostics(figure, single)
        (panel,) = figure.axes  # a single save: mass drift alone is informative
        assert [(line.get_marker(), list(line.get_ydata())) for line in panel.get_lines()] == [("o", [0.0])]
        plt.close(figure)
        # a "both" file whose Eulerian run failed after its first save: the particles' dots, no density image
        failed = dataset.assign(density=dataset["density"].where(dataset["time"] == 0))
        figure = plt.figure()
        _circle_picture(figure, failed, 2)
        heat = figure.axes[0]
        assert not heat.get_images() and not [c for c in heat.collections if c.get_array() is not None]
        assert heat.get_ylim() == (dataset["time"].values[0], dataset["time"].values[-1])
        plt.close(figure)


def test_the_first_and_last_saves_particles_are_drawn_above_the_frame(results):
    """The dots at the first and last saves lie on the time limits, where the axes' frame covered them: they are
    not clipped and drawn above the spines."""
    import matplotlib.pyplot as plt

    with xr.open_dataset(results["s1_particles"]) as dataset:
        times = dataset["time"].values
        figure = plt.figure()
        _circle_picture(figure, dataset, 2)
        heat = figure.axes[0]
        (dots,) = [artist for artist in heat.collections if artist.get_offsets().shape[0] > 1]
        assert {times[0], times[-1]} <= set(dots.get_offsets()[:, 1]) and heat.get_ylim() == (times[0], times[-1])
        assert not dots.get_clip_on()
        assert dots.get_zorder() > max(spine.get_zorder() for spine in heat.spines.values())
        plt.close(figure)


def _panel(dataset, start: str):
    """The diagnostics panel of `dataset` whose title starts with `start` (its figure closed), and its legend's
    labels."""
    import matplotlib.pyplot as plt

    figure = plt.figure()
    _diagnostics(figure, dataset)
    panel = next(axis for axis in figure.axes if axis.get_title().startswith(start))
    labels = [text.get_text() for text in panel.get_legend().get_texts()] if panel.get_legend() else []
    plt.close(figure)
    return panel, labels


def test_a_band_of_nan_standard_errors_has_no_legend_entry(results):
    """A particle run's lyapunov_stderr is NaN at p >= dim(E) / 4 and finite below: the legend listed a
    "± 2 s.e." band for p = 0.25 that was not drawn (fill_between of NaN draws nothing)."""
    with xr.open_dataset(results["s1_particles"]) as dataset:
        run = dataset.drop_vars(["lyapunov", "density", "cell_area"])
        time = run.sizes["time"]
        run = run.assign_coords(lyapunov_p=[0.1, 0.25]).assign(
            alignment_E=("time", np.linspace(0.5, 0.8, time)),  # E not everything: the panel is drawn
            lyapunov=(("time", "lyapunov_p"), np.stack([np.linspace(1.0, 0.5, time), np.linspace(2.0, 1.0, time)], 1)),
            lyapunov_stderr=(("time", "lyapunov_p"), np.stack([np.full(time, 0.01), np.full(time, np.nan)], 1)))
        panel, labels = _panel(run, "Lyapunov")
    assert "Eulerian, lyapunov_p = 0.1 ± 2 s.e." in labels and "Eulerian, lyapunov_p = 0.25" in labels, labels
    assert not any("0.25 ± 2 s.e." in label for label in labels), labels
    assert len(panel.collections) == 1  # the one band drawn, p = 0.1's


def test_the_min_density_panel_gives_the_density_units(results):
    """min ρ is a value of the density, per radian on S^1 and per steradian on S^2 (the files' units); the panel
    gave none."""
    for name, units in (("s1", "rad⁻¹"), ("s2", "sr⁻¹")):
        with xr.open_dataset(results[name]) as dataset:
            lowered = dataset["min_density"].values - 0.01 * dataset["time"].values  # not constant: the panel is drawn
            dataset = dataset.assign(min_density=dataset["min_density"].copy(data=lowered))
            assert dataset["min_density"].attrs["units"] == {"s1": "radian-1", "s2": "sr-1"}[name]
            panel, _ = _panel(dataset, "min ρ")
        assert panel.get_title() == f"min ρ [{units}]", panel.get_title()


def test_the_circle_animation_has_a_density_colour_bar(results):
    """The S^1 animation's angle-depth picture had no colour bar: its colours had no scale. The bar spans the
    densities drawn and names their units."""
    import matplotlib.pyplot as plt

    from spherepde.analysis.plotting import _circle_animation

    with xr.open_dataset(results["s1"]) as dataset:
        figure, _ = _circle_animation(dataset)
        _, density = _circle_density(dataset)
    (image,) = [image for axis in figure.axes for image in axis.get_images()]
    assert image.colorbar is not None and image.colorbar.ax.get_ylabel() == "density ρ [rad⁻¹]"
    low, high = image.get_clim()
    assert np.isclose(low, density.min()) and np.isclose(high, density.max())
    plt.close(figure)


def test_circle_window_of_antipodal_clusters_cuts_between_them(tmp_path):
    """Two equal clusters at 0 and pi (mean 0): the window [c - pi, c + pi] is centred opposite the density's
    minimum, so that both clusters are drawn whole; centred on 0 as it was, its edges fell on the cluster at pi."""
    overrides = ['initial.kind="vmf_mixture"', "initial.means=[[1.0, 0.0], [-1.0, 0.0]]", "initial.kappas=[8.0, 8.0]",
                 "model.eps=0.0"]
    path = tmp_path / "antipodal.nc"
    write_dataset(spherepde.run(spherepde.load_case_text(SMALL_S1, overrides), progress=False), path)
    with xr.open_dataset(path) as dataset:
        assert np.abs(dataset["mean"].values[-1]).max() < 1e-12
        centre = _circle_centre(dataset)
        theta, density = _circle_window(dataset, centre)
        assert np.isclose(abs(np.cos(centre)), 0, atol=1e-12)  # pi/2 or 3pi/2: the two minima's opposites
        final = density[-1]
        assert max(final[0], final[-1]) < 1e-3 * final.max()
        peaks = theta[[np.argmax(np.where(sign * np.cos(theta) > 0, final, 0)) for sign in (1, -1)]]
        assert np.allclose(np.cos(peaks), [1, -1], atol=1e-3)
