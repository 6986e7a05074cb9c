"""Edited result files (a fuzzing round of the post-processing tools): `info`, `plot` and `compare` refuse each with
one line naming the file and what is wrong, exit 2, where they gave tracebacks, hung, or read a wrong measure."""

import numpy as np
import ot
import pytest
import xarray as xr
from conftest import make_case

import spherepde
from spherepde.cli import main
from spherepde.io.output import write_dataset


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A small Eulerian and a particle run of one case on S^1, and an Eulerian one on S^2, as Datasets."""
    times = {"t_end": 0.2, "dt": 0.05, "save_every": 0.1}
    circle = make_case(2, 16, model={"kernel": "unnormalized", "beta": 0.0, "eps": 0.25}, time=times)
    particles = circle.with_overrides(["solver.method='particles'", "particles.n=40", "particles.save=40"])
    sphere = make_case(3, 12, model={"eps": 0.1}, time=times)
    return {name: spherepde.run(case, progress=False) for name, case in
            (("circle", circle), ("particles", particles), ("sphere", sphere))}


def _edit_attrs(**attrs):
    def edit(dataset):
        dataset.attrs.update(attrs)
        for name, value in attrs.items():
            if value is None:
                del dataset.attrs[name]
        return dataset
    return edit


def _set(name, index, value):
    def edit(dataset):
        values = dataset[name].values.copy()
        values[index] = value
        return dataset.assign({name: (dataset[name].dims, values, dataset[name].attrs)})
    return edit


EDITS = {  # name: (run, edit, words of the one-line error)
    "no lmax": ("circle", _edit_attrs(lmax=None), "has a density but no lmax attribute"),
    "lmax abc": ("circle", _edit_attrs(lmax="abc"), "its attribute lmax = 'abc' is not an integer >= 0"),
    "lmax 1000": ("circle", _edit_attrs(lmax=1000), "angles theta cannot hold lmax 1000"),
    "lmax below the density's": ("circle", _edit_attrs(lmax=2), "holds Fourier modes above its lmax = 2"),
    "dtype int32": ("circle", _edit_attrs(dtype="int32"), "its attribute dtype = 'int32' is not a floating-point"),
    "dtype float16x": ("circle", _edit_attrs(dtype="float16x"), "dtype = 'float16x' is not a floating-point"),
    "bound abc": ("circle", _edit_attrs(w2_quantisation_bound="abc"), "w2_quantisation_bound = 'abc' is not a"),
    "n many": ("particles", _edit_attrs(n="many"), "its attribute n = 'many' is not an integer >= 1"),
    "n 0": ("particles", _edit_attrs(n=0), "its attribute n = 0 is not an integer >= 1"),
    "replicas x": ("particles", _edit_attrs(replicas="x"), "its attribute replicas = 'x' is not an integer >= 1"),
    "no particle": ("particles", lambda d: d.isel(particle=slice(0, 0)), "holds no saved particle"),
    "one mean component": ("circle", lambda d: d.assign(mean=d["mean"].isel(component=0)),
                           "its variable mean has no component dimension"),
    "theta renamed": ("circle", lambda d: d.rename(theta="phi"), "its density has dimensions ('time', 'phi')"),
    "no cell_area": ("sphere", lambda d: d.drop_vars("cell_area"), "has no cell_area (lat, lon)"),
    "no save": ("circle", lambda d: d.isel(time=slice(0, 0)), "its time axis is empty"),
    "NaN time": ("circle", _set("time", 1, np.nan), "its time coordinate is not finite and increasing"),
    "all-NaN density": ("circle", _set("density", slice(None), np.nan), "its density is not finite at any save"),
    "mass as text": ("circle", lambda d: d.assign(mass=d["mass"].astype(str)), "its variable mass holds <U"),
    # a second round: a traceback each, or (no time coordinate) save numbers read as times, compared silently
    "no time coordinate": ("circle", lambda d: d.drop_vars("time"), "its time axis has no coordinate"),
    "time renamed": ("circle", lambda d: d.rename(time="t"), "its variable mass has dimensions ('t',), not ('time',)"),
    "a diagnostic on the grid": ("circle", lambda d: d.assign(order_parameter=d["density"]),
                                 "its variable order_parameter has dimensions ('time', 'theta')"),
    "a diagnostic of one save": ("circle", lambda d: d.assign(order_parameter=d["order_parameter"].isel(time=0)),
                                 "its variable order_parameter has dimensions (), not ('time',)"),
    "a training without its loss": ("circle", lambda d: d.assign(gradient_norm=(("iteration",), [1.0, 0.5])),
                                    "it has an iteration axis but no loss"),
}


@pytest.mark.parametrize("name", EDITS)
def test_every_tool_refuses_an_edited_result_with_one_line(runs, tmp_path, capsys, name):
    run, edit, said = EDITS[name]
    path = tmp_path / "edited.nc"
    write_dataset(edit(runs[run].copy(deep=True)), path)
    good = tmp_path / "good.nc"
    write_dataset(runs[run], good)
    capsys.readouterr()
    for argv in (["info", str(path)], ["plot", str(path)], ["compare", str(good), str(path)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(path) in err and said in err, (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited.nc", "good.nc"]  # no figure, no report


MEASURES = {  # name: (run, edit, words of the error)
    "a NaN particle on S^1": ("particles", _set("particles", (1, 3, 0), np.nan),
                              "the saved particles of save 1 (t = 0.1) are not all finite"),
    "a NaN density value on S^2": ("sphere", _set("density", (1, 3, 5), np.nan),
                                   "the density of save 1 (t = 0.1) is not finite everywhere"),
    "a zero density": ("sphere", _set("density", 2, 0.0), "the density of save 2 (t = 0.2) is nowhere positive"),
    "a negative density": ("circle", _set("density", 0, -1.0), "the density of save 0 (t = 0) is nowhere positive"),
}


@pytest.mark.parametrize("name", MEASURES)
def test_compare_refuses_a_measure_that_is_not_finite_or_has_no_mass(runs, tmp_path, capsys, name):
    """A NaN particle on S^1 looped for ever in the rearrangement's certificate, on S^2 it gave W2 = 0; a NaN or a
    massless density was a traceback of POT.  Now: one line naming the file and the save, exit 2, no report."""
    run, edit, said = MEASURES[name]
    good, bad = tmp_path / "good.nc", tmp_path / "bad.nc"
    write_dataset(runs[run], good)
    write_dataset(edit(runs[run].copy(deep=True)), bad)
    capsys.readouterr()
    assert main(["compare", str(good), str(bad), "-o", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"compare: {bad}: {said}" in err, err
    assert not (tmp_path / "report.nc").exists() and not (tmp_path / "report.png").exists()


def test_a_report_is_written_whole_or_not_at_all_and_names_are_text(runs, tmp_path, capsys, monkeypatch):
    """A file named 'run$^$.nc' went unescaped into the figure's title: mathtext's traceback, exit 1, and REPORT.nc
    without its PNG.  Now the names are drawn as text (plot's too); a figure that fails leaves neither file; -o
    x.png wrote x.png.nc and x.png.png."""
    import spherepde.analysis.compare as compare_module

    odd = tmp_path / "run$^$.nc"
    write_dataset(runs["circle"], odd)
    capsys.readouterr()
    assert main(["compare", str(odd), str(odd), "-o", str(tmp_path / "dollar"), "--no-w2"]) == 0
    assert (tmp_path / "dollar.png").stat().st_size > 10_000 and (tmp_path / "dollar.nc").exists()
    assert main(["plot", str(odd)]) == 0 and (tmp_path / "run$^$.png").stat().st_size > 10_000

    def broken(report, target):
        raise RuntimeError("a figure that cannot be drawn")
    monkeypatch.setattr(compare_module, "plot_report", broken)
    with pytest.raises(RuntimeError):
        main(["compare", str(odd), str(odd), "-o", str(tmp_path / "broken"), "--no-w2"])
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("broken")]
    monkeypatch.undo()
    assert main(["compare", str(odd), str(odd), "-o", str(tmp_path / "x.png"), "--no-w2"]) == 0
    assert (tmp_path / "x.nc").exists() and (tmp_path / "x.png").exists() and not (tmp_path / "x.png.nc").exists()


def test_particle_runs_beyond_s2_open_in_every_tool(tmp_path, capsys):
    """The particle solver runs on S^(d-1) for any d: its files (d = 4, four components) open in info, plot and
    compare, whose structure check took two or three components for all files; compare's W2 between two systems of
    d = 4 is the POT value between their saved particles."""
    case = make_case(4, 8, model={"eps": 0.1}, time={"t_end": 0.2, "dt": 0.05, "save_every": 0.1},
                     solver={"method": "particles"}).with_overrides(["particles.n=30", "particles.save=30"])
    paths = []
    for seed in (1, 2):
        paths.append(str(tmp_path / f"seed{seed}.nc"))
        write_dataset(spherepde.run(case.with_overrides([f"particles.seed={seed}"]), progress=False), paths[-1])
    assert main(["info", paths[0]]) == 0
    assert main(["plot", paths[0], "-o", str(tmp_path)]) == 0
    assert main(["compare", *paths, "-o", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    with xr.open_dataset(tmp_path / "report.nc") as report, xr.open_dataset(paths[0]) as a, \
            xr.open_dataset(paths[1]) as b:
        x, y = a["particles"].values[-1], b["particles"].values[-1]
        exact = np.sqrt(ot.emd2([], [], ((x[:, None] - y[None]) ** 2).sum(-1)))
        assert float(report["w2"][-1]) == pytest.approx(exact, rel=1e-9)


def _damaged_copy(path, target, shows) -> None:
    """`path` copied to `target` with one stretch of 256 bytes scrambled (what a bad disk or a broken transfer does),
    the first from the file's start such that `shows(target)` holds: the damage found where it is wanted, whatever
    the layout the netCDF library chose.  Each try is a file of its own: xarray keeps the files it opened, by path."""
    data = path.read_bytes()
    for offset in range(0, len(data) - 256, 256):
        damaged = bytearray(data)
        damaged[offset:offset + 256] = bytes(byte ^ 0x5A for byte in damaged[offset:offset + 256])
        candidate = target.with_name(f"{target.stem}-{offset}.nc")
        candidate.write_bytes(bytes(damaged))
        if shows(candidate):
            candidate.rename(target)
            return
        candidate.unlink()
    pytest.fail(f"no stretch of {path} whose damage shows so")


def _fails_reading(name: str):
    """Whether a file opens (header and attributes whole) but its variable `name` cannot be read."""
    def shows(path) -> bool:
        try:
            with xr.open_dataset(path) as dataset:
                dataset[name].load()
        except RuntimeError as error:
            return str(error).startswith("NetCDF:")
        except Exception:  # damaged elsewhere: the header, the attributes
            return False
        return False
    return shows


def _fails_opening(path) -> bool:
    """Whether the file's attributes cannot be read where it is opened."""
    try:
        xr.open_dataset(path).close()
    except AttributeError as error:
        return str(error).startswith("NetCDF:")
    except Exception:
        return False
    return False


DAMAGES = {  # name: (run, how the damage shows, the commands that read what is damaged)
    # compressed (4096 values or more), its chunk's checksum fails: read where the file is opened (check_run)
    "a density chunk": ("sphere", _fails_reading("density"), ("info", "plot", "compare")),
    # read by the figure and by compare's load only (info does not read the particles)
    "a particles chunk": ("particles", _fails_reading("particles"), ("plot", "compare")),
    "the attributes": ("sphere", _fails_opening, ("info", "plot", "compare")),
}


@pytest.fixture(scope="module")
def compressed_runs(tmp_path_factory):
    """Result files whose density (S^2, 6 saves of 20 x 40) or particles (S^1, 3 saves of 2000) are compressed."""
    root = tmp_path_factory.mktemp("compressed")
    times = {"t_end": 0.5, "dt": 0.05, "save_every": 0.1}
    sphere = make_case(3, 12, model={"eps": 0.1}, time=times)
    particles = make_case(2, 16, model={"kernel": "unnormalized", "beta": 0.0, "eps": 0.25}, time=times).with_overrides(
        ["solver.method='particles'", "particles.n=2000", "particles.save=2000", "time.t_end=0.2"])
    paths = {}
    for name, case in (("sphere", sphere), ("particles", particles)):
        paths[name] = root / f"{name}.nc"
        write_dataset(spherepde.run(case, progress=False), paths[name])
    return paths


@pytest.mark.parametrize("name", DAMAGES)
def test_every_tool_refuses_a_damaged_file_with_one_line(compressed_runs, tmp_path, capsys, name):
    """A file damaged on disk (a compressed chunk whose checksum fails, an attribute table) was a traceback of
    netCDF4's RuntimeError or AttributeError, exit 1, raised where xarray first read the variable (plot's particles,
    compare's load, the density's check at the open).  Now: one line naming the file, exit 2, no figure, no report."""
    run, shows, commands = DAMAGES[name]
    path = tmp_path / "damaged.nc"
    _damaged_copy(compressed_runs[run], path, shows)
    capsys.readouterr()
    argvs = {"info": ["info", str(path)], "plot": ["plot", str(path), "-o", str(tmp_path / "figures")],
             "compare": ["compare", str(compressed_runs[run]), str(path), "-o", str(tmp_path / "report")]}
    for command in commands:
        assert main(argvs[command]) == 2, command
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"cannot read result {str(path)!r}: NetCDF:" in err, (command, err)
        assert err.endswith("the file is damaged"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.nc"]  # no figure, no report


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_a_run_refuses_a_damaged_initial_file_with_one_line(compressed_runs, tmp_path, capsys, method):
    """initial.kind = "file" naming a file whose density chunk is damaged: the case resolves (the header and the
    time axis read fine), and the density's read raised netCDF4's RuntimeError, a traceback and exit 1. Now: one
    line naming initial.path and the file, exit 2, no output file; for the particle sampler too."""
    path = tmp_path / "damaged.nc"
    _damaged_copy(compressed_runs["sphere"], path, _fails_reading("density"))
    case = tmp_path / "case.toml"
    case.write_text(f'[sphere]\ndim = 3\nlmax = 12\n[initial]\nkind = "file"\npath = "{path}"\n'
                    f'[time]\nt_end = 0.1\ndt = 0.05\n[solver]\nmethod = "{method}"\ndevice = "cpu"\n'
                    '[particles]\nn = 20\n')
    capsys.readouterr()
    assert main(["run", str(case), "-o", str(tmp_path / "out.nc"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"initial.path: cannot read a density from {str(path)!r}: NetCDF:" in err, err
    assert err.endswith("the file is damaged"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case.toml", "damaged.nc"]  # no output, no checkpoint


def test_compare_names_a_reader_that_exists():
    """compare() given something other than a Dataset named spherepde.open_result, which the package does not have
    (AttributeError for whoever followed it): it names the reader by its module."""
    import importlib

    with pytest.raises(spherepde.CaseError, match="open the files with load_pair or ") as error:
        from spherepde.analysis.compare import compare

        compare("a.nc", "b.nc")
    module, _, function = str(error.value).rsplit(" ", 1)[-1].rstrip(")").rpartition(".")
    assert callable(getattr(importlib.import_module(module), function))
