"""The command line and the output contract (docs/design.md "Case files"-7): exit codes, messages, files."""

import math
import os
import re
import resource
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest
import xarray as xr

import spherepde
from spherepde.base.errors import NumericalFailure
from spherepde.cli import main
from spherepde.io.case import case_from_dict
from spherepde.io.output import write_dataset

SMALL_S1 = """
[case]
name = "small"
[sphere]
dim = 2
lmax = 16
[model]
kernel = "softmax"
beta = 2.0
eps = 0.1
[initial]
kind = "vmf"
mean = [1.0, 0.0]
kappa = 2.0
[time]
t_end = 0.5
dt = 0.05
save_every = 0.25
[solver]
device = "cpu"
"""


def write_case(folder, text=SMALL_S1, name="case.toml"):
    path = folder / name
    path.write_text(text)
    return path


def run_cli(args, capsys):
    status = main([str(a) for a in args])
    return status, capsys.readouterr().err


BAD_CASES = {
    "unknown key": ("[model]\nkernel", "[model]\nbta = 1.0\nkernel", "model.bta"),
    "wrong matrix size": ("eps = 0.1", "eps = 0.1\nB = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]", "model.B"),
    "negative eps": ("eps = 0.1", "eps = -0.1", "model.eps"),
    "negative dt": ("dt = 0.05", "dt = -0.05", "time.dt"),
    "beta inf unnormalized": ('kernel = "softmax"\nbeta = 2.0', 'kernel = "unnormalized"\nbeta = "inf"', "model.beta"),
    "unknown initial kind": ('kind = "vmf"\nmean = [1.0, 0.0]\nkappa = 2.0', 'kind = "gauss"', "initial.kind"),
    "malformed toml": ("[time]", "[time", "malformed TOML"),
    "NaN entry": ("eps = 0.1", "eps = 0.1\nV = [[1.0, nan], [0.0, 1.0]]", "model.V"),
    "missing initial file": ('kind = "vmf"\nmean = [1.0, 0.0]\nkappa = 2.0', 'kind = "file"\npath = "nowhere.nc"',
                             "initial.path"),
    "grid too coarse for beta": ("beta = 2.0", "beta = 500.0", "sphere.lmax"),
    "eulerian in d = 4": ("dim = 2", "dim = 4", "sphere.dim"),
    "initial law between the nodes": ("kappa = 2.0", "kappa = 1e7", "sphere.lmax"),
    "exact W2 of too many atoms": ("lmax = 16", "lmax = 16\n[diagnostics]\nw2_atoms = 10000", "diagnostics.w2_atoms"),
    "attention overflowing float64": ('kernel = "softmax"\nbeta = 2.0', 'kernel = "unnormalized"\nbeta = 0.0\n'
                                      'V = [[1e308, 0.0], [0.0, 1e308]]', "overflows float64"),
    # the particle half's refusal came after the Eulerian half had run, and left its checkpoint folder
    "both: a field the particles lack": ('device = "cpu"', 'device = "cpu"\nmethod = "both"\nfield = "spectral"',
                                         "solver.field: 'spectral' is not available for particles"),
}


@pytest.mark.parametrize("problem", sorted(BAD_CASES))
def test_bad_input_exits_2_with_one_line_and_no_file(tmp_path, capsys, problem):
    old, new, named = BAD_CASES[problem]
    assert old in SMALL_S1
    case = write_case(tmp_path, SMALL_S1.replace(old, new, 1))
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output], capsys)
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert named in err
    assert f"error: {case}: " in err  # the case file named, also where the check needs the grid or the model
    assert "Traceback" not in err
    assert not output.exists() and os.listdir(tmp_path) == ["case.toml"]


@pytest.mark.parametrize("method", ["eulerian", "particles"])
@pytest.mark.parametrize("key", ["V", "W"])
def test_a_matrix_entry_beyond_float32_is_refused_in_float32(tmp_path, capsys, key, method):
    # 1e39 is inf in float32: V ended in a traceback (exit 1), W in a NaN at the first step (exit 3); float64 runs it
    case = write_case(tmp_path, SMALL_S1.replace("eps = 0.1", f"eps = 0.1\n{key} = [[1e39, 0.0], [0.0, 1e39]]"))
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output, "--solver", method, "--set", "particles.n=10",
                           "--set", 'solver.dtype="float32"'], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert f"error: {case}: model.{key}: an entry of 1e+39 is beyond float32's largest number 3.4e+38" in err
    assert os.listdir(tmp_path) == ["case.toml"]
    if key == "W" and method == "eulerian":  # radial: P_x(W x) = 0, a run as W = 0
        assert run_cli(["run", case, "-o", output, "--solver", method, "--set", "particles.n=10"], capsys)[0] == 0


def test_missing_case_file_and_bad_override(tmp_path, capsys):
    status, err = run_cli(["run", tmp_path / "absent.toml"], capsys)
    assert status == 2 and "absent.toml" in err and len(err.strip().splitlines()) == 1
    case = write_case(tmp_path)
    status, err = run_cli(["run", case, "--set", "model.nonsense=3", "-o", tmp_path / "o.nc"], capsys)
    assert status == 2 and "model.nonsense" in err
    status, err = run_cli(["run"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1


def test_a_key_set_twice_is_refused(tmp_path, capsys):
    """`--set model.eps=0.1 --set model.eps=0.2` ran at 0.2 without a word (a typo in a script's second --set hid
    the first), and `--set solver.method=... --solver ...` took --solver's."""
    case = write_case(tmp_path)
    output = tmp_path / "o.nc"
    for words in (["--set", "model.eps=0.1", "--set", "model . eps=0.2"],
                  ["--set", "solver.method='eulerian'", "--solver", "particles"]):
        status, err = run_cli(["run", case, *words, "-o", output], capsys)
        assert status == 2 and "set more than once" in err and len(err.strip().splitlines()) == 1
        assert not output.exists()
    assert run_cli(["run", case, "--set", "model.eps=0.2", "--set", "model.beta=0.5", "-o", output], capsys)[0] == 0


def test_no_traceback_from_a_fresh_process(tmp_path):
    case = write_case(tmp_path, SMALL_S1.replace("eps = 0.1", "eps = -1.0"))
    result = subprocess.run([sys.executable, "-m", "spherepde", "run", str(case)], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "model.eps" in result.stderr


def test_a_run_with_stderr_closed_keeps_its_exit_status(tmp_path):
    """`spherepde run CASE 2>&-` (a daemon's job): Python leaves sys.stderr None, on which the progress bar failed
    after the case was read (exit status 1, no output file, the traceback shown nowhere)."""
    case = write_case(tmp_path)

    def closed_stderr(*args):
        return subprocess.run([sys.executable, "-m", "spherepde", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                              preexec_fn=lambda: os.close(2), timeout=300)
    assert closed_stderr("run", str(case), "-o", "out.nc").returncode == 0
    with xr.open_dataset(tmp_path / "out.nc") as dataset:
        assert dataset.attrs["status"] == "completed"
    assert closed_stderr("run", str(tmp_path / "absent.toml")).returncode == 2


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_after_the_command_ended_leaves_its_exit_status(tmp_path, signum):
    """A signal in the interpreter's shutdown after a complete run (0.4-1.4 s of torch's and xarray's teardown)
    killed the process: exit status -2 / -15 over a written output, where docs/design.md says the status stands."""
    case = write_case(tmp_path)
    script = (f"import os, sys\nfrom spherepde.cli import main\nsys.argv = ['spherepde', 'run', {str(case)!r}, '-o', "
              f"'out.nc', '--quiet']\nstatus = main()\nos.kill(os.getpid(), {int(signum)})\nraise SystemExit(status)")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, timeout=300)
    assert result.returncode == 0 and (tmp_path / "out.nc").exists()


def test_existing_output_is_refused_then_overwritten(tmp_path, capsys):
    case = write_case(tmp_path)
    output = tmp_path / "out.nc"
    output.write_text("precious")
    status, err = run_cli(["run", case, "-o", output], capsys)
    assert status == 2 and "--overwrite" in err and output.read_text() == "precious"
    status, _ = run_cli(["run", case, "-o", output, "--overwrite", "--quiet"], capsys)
    assert status == 0
    with xr.open_dataset(output) as dataset:
        assert dataset.attrs["status"] == "completed"


def test_more_threads_than_cpus_run_with_a_one_line_warning_and_the_same_numbers(tmp_path, capsys):
    """solver.threads above the CPUs this process may use is the case's choice (a serial run's reductions repeat
    only with its count) but oversubscribes them (4095 threads on 2 cores: over a minute for a run of a fraction of
    a second): the command line says so in one line, the Python API as a RuntimeWarning; the densities are those
    of the same case with as many threads as CPUs."""
    cpus = len(os.sched_getaffinity(0))
    case = write_case(tmp_path)
    densities, warned = [], []
    for threads in (cpus, cpus + 1):
        output = tmp_path / f"threads{threads}.nc"
        status, err = run_cli(["run", case, "-o", output, "--quiet", "--set", f"solver.threads={threads}", "--set",
                               "time.t_end=0.1", "--set", "time.save_every=0.05"], capsys)
        assert status == 0
        warned.append([line for line in err.splitlines() if "solver.threads" in line])
        with xr.open_dataset(output) as dataset:
            densities.append(dataset["density"].values)
    assert warned[0] == [] and warned[1] == [f"spherepde: warning: solver.threads = {cpus + 1} is more than the "
                                             f"{cpus} CPUs this process may use: the threads share them and the run "
                                             "is slower, with the same numbers"]
    assert np.max(np.abs(densities[1] - densities[0])) <= 1e-13
    with pytest.warns(RuntimeWarning, match=f"solver.threads = {cpus + 1} is more than the {cpus} CPUs"):
        spherepde.run(spherepde.load_case(str(case), [f"solver.threads={cpus + 1}", "time.t_end=0.05"]),
                      progress=False)


def test_saves_beyond_the_memory_are_refused_naming_save_every(tmp_path, capsys, monkeypatch):
    """A run holds its saves until the output is written: a time.save_every a millionth of t_end on an S^2 grid
    asked for hundreds of GiB after hours of steps; with too little memory for them it is refused before the run
    (one line, exit 2, no file).  The bound (spherepde.api.limits.saved_bytes) is at most the saved arrays of a
    real run twice over (the saves held, then stacked into the output)."""
    from spherepde.api import limits

    case = write_case(tmp_path)
    output = tmp_path / "out.nc"
    status, _ = run_cli(["run", case, "-o", output, "--quiet", "--set", "time.save_every=0.05"], capsys)
    with xr.open_dataset(output) as dataset:
        held = dataset["density"].values.nbytes
    assert status == 0 and 0 < limits.saved_bytes(spherepde.load_case(str(case), ["time.save_every=0.05"])) <= 2 * held
    monkeypatch.setattr(limits, "available_memory", lambda: 100 * 2 ** 20)
    refused = tmp_path / "refused.nc"
    status, err = run_cli(["run", case, "-o", refused, "--set", "time.save_every=1e-6"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and not refused.exists()
    assert "time.save_every: 500001 saves up to t_end = 0.5 need at least" in err


def test_output_contract_s1(tmp_path, capsys):
    case = write_case(tmp_path)
    output = tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", output, "--quiet"], capsys)[0] == 0
    with xr.open_dataset(output) as dataset:
        for name in ["density", "mass", "mean", "order_parameter", "alignment_E", "alignment_F", "lyapunov",
                     "w2_projection", "entropy", "interaction_energy", "free_energy", "min_density",
                     "spectral_tail", "cell_area"]:
            assert name in dataset, name
        assert dataset["density"].dims == ("time", "theta")
        assert dataset["theta"].attrs["units"] == "radian" and "standard_name" not in dataset["theta"].attrs
        assert dataset["time"].attrs["units"] == "1" and "axis" not in dataset["time"].attrs
        assert dataset["density"].attrs["units"] == "radian-1"
        assert np.allclose(dataset["time"], [0.0, 0.25, 0.5])
        for key in ["Conventions", "title", "history", "source", "case", "solver", "backend", "grid", "lmax",
                    "dtype", "device"]:
            assert key in dataset.attrs, key
        assert dataset.attrs["Conventions"] == "CF-1.10"
        # the quadrature weights integrate the density to the stored mass
        mass = (dataset["density"] * dataset["cell_area"]).sum("theta")
        assert np.allclose(mass, dataset["mass"], rtol=0, atol=1e-14)
        assert abs(float(dataset["cell_area"].sum()) - 2 * math.pi) < 1e-13


def test_output_contract_s2_coordinates(tmp_path):
    case = spherepde.load_case("cases/heat-s2.toml", ["time.t_end=0.1", "time.save_every=0.1", "solver.device='cpu'"])
    dataset = spherepde.run(case, progress=False)
    assert dataset["density"].dims == ("time", "lat", "lon")
    assert dataset["lat"].attrs["units"] == "degrees_north" and dataset["lat"].attrs["standard_name"] == "latitude"
    assert dataset["lon"].attrs["units"] == "degrees_east"
    assert dataset["cell_area"].attrs["units"] == "sr" and dataset["density"].attrs["units"] == "sr-1"
    assert abs(float(dataset["cell_area"].sum()) - 4 * math.pi) < 1e-12
    # Gauss latitudes stored exactly: sin(lat) are the roots of P_nlat
    nodes = np.polynomial.legendre.leggauss(dataset.sizes["lat"])[0][::-1]
    assert np.abs(np.sin(np.deg2rad(dataset["lat"].values)) - nodes).max() < 1e-14


def test_rerun_from_stored_case_is_identical(tmp_path, capsys):
    case = write_case(tmp_path)
    first = tmp_path / "first.nc"
    assert run_cli(["run", case, "-o", first, "--quiet", "--set", "model.beta=3.0"], capsys)[0] == 0
    with xr.open_dataset(first) as dataset:
        stored = dataset.attrs["case"]
        density = dataset["density"].values
        assert dataset.attrs["history"].endswith(f"run {case} -o {first} --set model.beta=3.0")  # the command
    replay = write_case(tmp_path, stored, "replay.toml")
    second = tmp_path / "second.nc"
    assert run_cli(["run", replay, "-o", second, "--quiet"], capsys)[0] == 0
    with xr.open_dataset(second) as dataset:
        assert np.array_equal(dataset["density"].values, density)
        assert dataset.attrs["case"] == stored
    assert spherepde.load_case_text(stored)["model"]["beta"] == 3.0


def test_initial_density_from_file_interpolates_spectrally(tmp_path, capsys):
    """A later run started from a saved slice continues the first run (and re-expands to a new lmax)."""
    case = write_case(tmp_path)
    first = tmp_path / "first.nc"
    assert run_cli(["run", case, "-o", first, "--quiet", "--set", "time.t_end=0.5"], capsys)[0] == 0
    restart = SMALL_S1.replace('kind = "vmf"\nmean = [1.0, 0.0]\nkappa = 2.0',
                               'kind = "file"\npath = "first.nc"\ntime = 0')
    second = tmp_path / "second.nc"
    case2 = write_case(tmp_path, restart.replace("lmax = 16", "lmax = 24"), "restart.toml")
    assert run_cli(["run", case2, "-o", second, "--quiet"], capsys)[0] == 0
    with xr.open_dataset(first) as a, xr.open_dataset(second) as b:
        # same initial law on a finer grid; the band-limited continuation agrees with the first run
        assert abs(float(a["mass"][0]) - float(b["mass"][0])) < 1e-14
        assert abs(float(a["order_parameter"][-1]) - float(b["order_parameter"][-1])) < 1e-9
        saves = a.sizes["time"]
    # an index beyond the file's time axis is refused when the case is read, naming initial.time
    status, err = run_cli(["run", case2, "-o", tmp_path / "third.nc", "--set", f"initial.time={saves}"], capsys)
    assert status == 2 and f"initial.time: {saves} is out of range" in err and len(err.strip().splitlines()) == 1
    assert run_cli(["run", case2, "-o", tmp_path / "third.nc", "--quiet", "--set", f"initial.time={-saves}"],
                   capsys)[0] == 0
    xr.Dataset({"mass": ("time", [1.0])}).to_netcdf(tmp_path / "no_density.nc")
    status, err = run_cli(["run", case2, "-o", tmp_path / "fourth.nc", "--set", "initial.path='no_density.nc'"],
                          capsys)
    assert status == 2 and "initial.path" in err and "holds no Eulerian density" in err
    # a sweep's combined file, and a file that is no NetCDF at all, each named as what it is
    with xr.open_dataset(first) as one:
        write_dataset(xr.concat([one.load(), one.load()], dim="member"), tmp_path / "sweep.nc")
    (tmp_path / "notes.txt").write_text("not a result")
    for path, said in (("sweep.nc", "is a sweep (2 members); give one of its member-*.nc files"),
                       ("notes.txt", "cannot read a density from")):
        status, err = run_cli(["run", case2, "-o", tmp_path / "fifth.nc", "--set", f"initial.path='{path}'"], capsys)
        assert status == 2 and said in err and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith("not a NetCDF file"), err


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_a_particle_run_as_the_initial_file_is_named_so(tmp_path, capsys, method):
    """A particle run's output holds no density to start from: one line saying so for both methods (the particle
    sampler said "cannot read a density from ...: 'lmax'", a KeyError's text)."""
    case = write_case(tmp_path)
    particles = tmp_path / "particles.nc"
    assert run_cli(["run", case, "-o", particles, "--quiet", "--solver", "particles", "--set", "time.t_end=0.25"],
                   capsys)[0] == 0
    restart = SMALL_S1.replace('kind = "vmf"\nmean = [1.0, 0.0]\nkappa = 2.0', 'kind = "file"\npath = "particles.nc"')
    status, err = run_cli(["run", write_case(tmp_path, restart, "restart.toml"), "-o", tmp_path / "second.nc",
                           "--solver", method], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "particles.nc' holds no Eulerian density (a particle run, or not a spherepde result)" in err, err


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_a_case_whose_initial_file_changed_after_it_was_resolved_is_refused(tmp_path, capsys, method):
    """A case resolved (its initial file's SHA-256 pinned), then the file rewritten: the run refuses it, one line
    naming initial.path and both digests, where it ran from the new file and stored the old digest (a notebook's
    case loaded earlier, a sweep's later member)."""
    case = write_case(tmp_path)
    first = tmp_path / "first.nc"
    assert run_cli(["run", case, "-o", first, "--quiet", "--set", "time.t_end=0.25"], capsys)[0] == 0
    restart = SMALL_S1.replace('kind = "vmf"\nmean = [1.0, 0.0]\nkappa = 2.0', 'kind = "file"\npath = "first.nc"')
    resolved = spherepde.load_case(write_case(tmp_path, restart, "restart.toml"),
                                   [f"solver.method='{method}'", "time.t_end=0.25"])
    pinned = resolved["initial"]["sha256"]
    assert spherepde.run(resolved)["mass"].values[0] == pytest.approx(1, abs=1e-12)  # the file as pinned runs
    assert run_cli(["run", case, "-o", first, "--quiet", "--overwrite", "--set", "time.t_end=0.5"], capsys)[0] == 0
    refusal = rf"restart.toml: initial.path: .*first.nc' has SHA-256 [0-9a-f]{{64}}, not the {pinned} of the case: the"
    with pytest.raises(spherepde.CaseError, match=refusal + " file changed") as refused:
        spherepde.run(resolved)
    assert len(str(refused.value).splitlines()) == 1


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_an_initial_file_whose_density_is_not_a_probability_density_is_refused(tmp_path, capsys, method):
    """NaN, a negated, zero or rescaled density, or a grid cut short (its quadrature mass 0.72): exit 2 naming
    initial.path and what is wrong, no output; before, the runs went on with mass 0 or 3 or ended in exit 3 or
    a traceback from the particle sampler."""
    case = write_case(tmp_path)
    first = tmp_path / "first.nc"
    assert run_cli(["run", case, "-o", first, "--quiet", "--set", "time.t_end=0.25"], capsys)[0] == 0
    with xr.open_dataset(first) as dataset:
        good = dataset.load()
    nan = good["density"].values.copy()
    nan[-1, 3] = np.nan
    doctored = {"nan": (good.assign(density=(good["density"].dims, nan)), "not finite"),
                "negated": (good.assign(density=-good["density"]), "mass -1"),
                "zero": (good.assign(density=0 * good["density"]), "mass 0"),
                "tripled": (good.assign(density=3 * good["density"]), "mass 3"),
                "cut": (good.isel(theta=slice(0, 4 * good.sizes["theta"] // 5)), "mass 0.7")}
    restart = SMALL_S1.replace('kind = "vmf"\nmean = [1.0, 0.0]\nkappa = 2.0', 'kind = "file"\npath = "bad.nc"')
    restarted = write_case(tmp_path, restart, "restart.toml")
    for name, (dataset, problem) in doctored.items():
        dataset.to_netcdf(tmp_path / "bad.nc")
        output = tmp_path / f"{name}.nc"
        status, err = run_cli(["run", restarted, "-o", output, "--quiet", "--set", f"solver.method='{method}'",
                               "--set", "particles.n=50"], capsys)
        assert status == 2 and "initial.path" in err and problem in err, (name, err)
        assert len(err.strip().splitlines()) == 1 and not output.exists()


def test_a_particle_cfl_step_that_would_never_end_is_a_numerical_failure(tmp_path, capsys):
    """time.cfl = 1e-300 on particles asked for ~1e300 steps per save and hung; now, as on the Eulerian solver,
    exit 3 at the first save interval, the t = 0 state kept."""
    case = write_case(tmp_path, SMALL_S1.replace("dt = 0.05", "cfl = 1e-300"))
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--set", "solver.method='particles'",
                           "--set", "particles.n=20"], capsys)
    assert status == 3 and "CFL rule asks for steps of" in err and len(err.strip().splitlines()) == 1, err
    with xr.open_dataset(output) as dataset:
        assert list(dataset["time"].values) == [0.0]


def test_a_write_that_fails_for_want_of_space_is_one_line_and_leaves_no_file(tmp_path):
    """A file-size limit of 10 kB (as a full disk): netCDF4 raises RuntimeError ("HDF error"), which ended
    in a traceback; now exit 2, one line naming the file, and neither it nor its temporary file left."""
    case = write_case(tmp_path, SMALL_S1.replace("lmax = 16", "lmax = 64"))

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))  # Python ignores SIGXFSZ: writes fail instead

    result = subprocess.run([sys.executable, "-m", "spherepde", "run", str(case), "-o", str(tmp_path / "out.nc"),
                             "--quiet"], capture_output=True, text=True, preexec_fn=limit_file_size, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "cannot write" in result.stderr and "out.nc" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["case.toml"]


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_a_run_shorter_than_1e_12_still_ends_at_t_end(tmp_path, capsys, method):
    # save_every 0.25 > t_end: the save times were [0] alone (an absolute round-off of 1e-12 took t_end for 0), and
    # the file said "completed" with no step taken and no state at t_end
    case = write_case(tmp_path, SMALL_S1.replace("t_end = 0.5", "t_end = 1e-12"))
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--solver", method, "--set", "particles.n=10"],
                          capsys)
    assert status == 0, err
    with xr.open_dataset(output) as dataset:
        assert dataset["time"].values.tolist() == [0.0, 1e-12]
        assert dataset.attrs["status"] == "completed" and dataset.attrs["steps"] == 1


def test_layer_boundaries_of_a_short_run_are_kept():
    """Knots closer than 1e-12 t_end merge, not closer than 1e-12: a run of t_end 1e-12 in 4 layers had one interval,
    in layer 1, and the other layers' controls went unused."""
    from solvers.timegrid import TimeGrid

    grid = TimeGrid(1e-12, 1e-12, layers=4)
    assert [interval.layer for interval in grid.intervals] == [0, 1, 2, 3]
    assert [interval.save for interval in grid.intervals] == [False, False, False, True]


def test_numerical_failure_exits_3_and_keeps_last_good_state(tmp_path, capsys):
    # Explicit transport far beyond its stability limit blows up; the saves before it are kept.
    unstable = SMALL_S1.replace("dt = 0.05", "dt = 0.5").replace("t_end = 0.5", "t_end = 200.0").replace(
        "save_every = 0.25", "save_every = 10.0").replace("lmax = 16", "lmax = 64").replace("beta = 2.0", "beta = 8.0")
    unstable = unstable.replace("eps = 0.1", "eps = 0.0")
    case = write_case(tmp_path, unstable)
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--plot"], capsys)
    assert status == 3, err
    assert "numerical failure" in err
    with xr.open_dataset(output) as dataset:
        assert dataset.attrs["status"].startswith("failed")
        assert np.isfinite(dataset["density"].values).all()
        assert dataset.sizes["time"] >= 1
    # --plot draws the last good state as `plot` would (it wrote no figure when the run failed)
    assert (tmp_path / "out.png").stat().st_size > 0 and f"wrote {tmp_path / 'out.png'}" in err
    # eps = 0 concentrates beyond lmax 16 (tail 8e-6 at t = 1, 0.29 at t = 4), then undershoots and fails: the
    # message says the run had lost its resolution, and what to change
    concentrating = SMALL_S1.replace("beta = 2.0", "beta = 8.0").replace("eps = 0.1", "eps = 0.0").replace(
        "t_end = 0.5\ndt = 0.05\nsave_every = 0.25", "t_end = 40.0\ncfl = 0.5\nsave_every = 1.0")
    status, err = run_cli(["run", write_case(tmp_path, concentrating), "-o", output, "--quiet", "--overwrite"], capsys)
    assert status == 3 and len(err.strip().splitlines()) == 1, err
    assert "it was under-resolved after t = 0 (spectral tail 0.29 at the last save" in err
    assert err.strip().endswith("increase sphere.lmax or eps")
    # the particle solver stops the same way (it raised AttributeError: its recorder had no clock), and says
    # nothing of a resolution it does not have
    status, err = run_cli(["run", write_case(tmp_path, concentrating), "-o", output, "--quiet", "--overwrite",
                           "--solver", "particles", "--set", "particles.n=100", "--set", "time.max_steps=3"], capsys)
    assert status == 3 and "time.max_steps = 3 would be exceeded before t = 1" in err and "resolved" not in err, err
    with xr.open_dataset(output) as dataset:
        assert dataset.attrs["status"].startswith("failed: time.max_steps") and dataset.attrs["wall_seconds"] > 0


def test_info_and_plot(tmp_path, capsys):
    case = write_case(tmp_path)
    output = tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", output, "--quiet", "--plot"], capsys)[0] == 0
    assert (tmp_path / "out.png").stat().st_size > 10_000
    status = main(["info", str(output)])
    text = capsys.readouterr().out
    assert status == 0 and "order_parameter" in text and "small" in text
    status, err = run_cli(["info", tmp_path / "missing.nc"], capsys)
    assert status == 2 and "missing.nc" in err
    # a save time such as 3 x 0.1 = 0.30000000000000004 prints as the number it stands for
    with xr.open_dataset(output) as dataset:
        lost = dataset.load().assign_attrs(resolved_until=3 * 0.1)
    write_dataset(lost, tmp_path / "lost.nc")
    assert main(["info", str(tmp_path / "lost.nc")]) == 0 and "resolved_until = 0.3\n" in capsys.readouterr().out
    # a reader that stops early (`| head`) ends info as SIGPIPE ends a command: no error message, status 141
    reader_gone = subprocess.Popen([sys.executable, "-m", "spherepde", "info", str(output)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reader_gone.stdout.close()
    assert reader_gone.wait(timeout=120) == 141 and reader_gone.stderr.read() == b""


@pytest.mark.parametrize("source, reason", [(None, "it has no 'source' attribute"),
                                            ("missing", "its 'source' attribute is 'missing'")])
def test_info_of_a_netcdf_file_not_written_by_spherepde_says_what_its_source_is(tmp_path, capsys, source, reason):
    """A NetCDF file without a `source` attribute was said to have the source 'missing', as one whose source is the
    word "missing" is."""
    foreign = tmp_path / "foreign.nc"
    attrs = {} if source is None else {"source": source}
    xr.Dataset({"density": ("theta", np.ones(4))}, attrs=attrs).to_netcdf(foreign)
    for command in ("info", "plot", "compare"):
        status, err = run_cli([command, foreign], capsys)
        assert status == 2 and err.count("\n") == 1 and f"is not a spherepde result ({reason})" in err, err


def test_a_missing_or_truncated_result_is_named_once(tmp_path, capsys):
    """`info` of a missing file said "cannot read result 'x.nc': [Errno 2] No such file or directory: 'x.nc'", and of
    a truncated one "[Errno -101] NetCDF: HDF error: 'x.nc'": the path twice, with the errno."""
    case = write_case(tmp_path)
    output = tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", output, "--quiet"], capsys)[0] == 0
    truncated = tmp_path / "truncated.nc"
    truncated.write_bytes(output.read_bytes()[:4000])
    for path, reason in ((tmp_path / "missing.nc", "No such file or directory"), (truncated, "NetCDF: HDF error")):
        for command in ("info", "plot", "compare"):
            status, err = run_cli([command, path], capsys)
            assert status == 2 and err == f"spherepde: error: cannot read result {str(path)!r}: {reason}\n", err


def test_info_shows_the_particle_runs_own_settings(tmp_path, capsys):
    """A particle run's n, replicas, seed and integrator, and a "both" file's on its particles' line; one save is
    "1 save"."""
    both, particles = tmp_path / "both.nc", tmp_path / "particles.nc"
    common = ["--set", "particles.n=40", "--set", "particles.replicas=2", "--set", "time.t_end=0.2", "--quiet"]
    assert main(["run", "cases/kuramoto-s1.toml", "--solver", "both", "-o", str(both)] + common) == 0
    assert main(["run", "cases/kuramoto-s1.toml", "--solver", "particles", "--set", "particles.seed=7",
                 "-o", str(particles)] + common) == 0
    capsys.readouterr()
    assert main(["info", str(both)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("  particles: status completed, n = 40, replicas = 2, seed = 0, integrator = heun, "
                               "attention = dense, dt = 0.05, steps = 4, wall_seconds = "), lines
    assert main(["info", str(particles)]) == 0
    assert "n = 40, replicas = 2, seed = 7, integrator = heun" in capsys.readouterr().out
    with xr.open_dataset(particles) as dataset:
        write_dataset(dataset.isel(time=[0]).load(), tmp_path / "one.nc")
    assert main(["info", str(tmp_path / "one.nc")]) == 0 and "(1 save)\n" in capsys.readouterr().out


ROTATION_S1 = """
[case]
name = "rotation"
[sphere]
dim = 2
lmax = 16
[model]
kernel = "unnormalized"
beta = 0.0
V = [[0.0, 0.0], [0.0, 0.0]]
W = [[0.0, -1.0], [1.0, 0.0]]
eps = 0.0
[initial]
kind = "vmf"
mean = [1.0, 0.0]
kappa = 1.0
[time]
t_end = 40.0
save_every = 10.0
[diagnostics]
w2 = false
"""


def run_timed(tmp_path, capsys, text: str, timing: str) -> tuple[int, str]:
    """`spherepde run` of the case `text` with the TOML lines `timing` added to its [time] section, writing
    out.nc: (exit status, stderr)."""
    case = write_case(tmp_path, text.replace("[time]", "[time]\n" + timing))
    return run_cli(["run", case, "-o", tmp_path / "out.nc", "--quiet", "--overwrite"], capsys)


def stable_then_failing(tmp_path, capsys, text: str, scheme: str, largest_dt: float) -> tuple[str, float]:
    """Run `text` with `scheme` at 0.95 and 1.2 of the largest stable step: exit 0, then exit 3.  Returns the
    failure's stderr and the step it took (equal steps of at most dt between saves 10 apart)."""
    for factor, expected in ((0.95, 0), (1.2, 3)):
        dt = factor * largest_dt
        status, err = run_timed(tmp_path, capsys, text, f'dt = {dt!r}\nscheme = "{scheme}"')
        assert status == expected, err
    return err, 10 / math.ceil(10 / dt)


@pytest.mark.parametrize("scheme", ["imex-ark436", "rk4"])
def test_steps_beyond_the_transport_bound_fail_saying_which_step_is_stable(scheme, tmp_path, capsys):
    # W = J turns the circle at speed |v| = 1 everywhere, so the step carries the mode k by i k dt: stable while
    # lmax dt is below the scheme's bound (spherepde.discretisation.timesteppers), growing from round-off past it.
    from spherepde.discretisation.timesteppers import stability_bound

    bound = stability_bound(scheme, 1j)
    err, step = stable_then_failing(tmp_path, capsys, ROTATION_S1, scheme, bound / 16)
    stated = f"lmax max|v| dt = 16 x 1 x {step:.3g} = {16 * step:.3g} at t = "
    assert stated in err and err.strip().endswith(f"take time.dt below {bound / 16:.3g}"), err
    with xr.open_dataset(tmp_path / "out.nc") as dataset:  # the last good state said in the message is the file's
        assert f"at t = {dataset['time'].values[-1]:g}, above {bound:.3g}" in err, err
    # steps by the CFL rule (|v| = 1 everywhere): the advice is about time.cfl, scaled by the bound over the step's
    # lmax max|v| dt (16 dt, dt = 10 / ceil(10 / (cfl / 16)) the step taken between saves 10 apart)
    cfl = 1.2 * bound
    status, err = run_timed(tmp_path, capsys, ROTATION_S1, f'cfl = {cfl!r}\nscheme = "{scheme}"')
    step = 10 / math.ceil(10 / (cfl / 16))
    assert status == 3 and err.strip().endswith(f"take time.cfl below {cfl * bound / (16 * step):.3g}"), err


def test_a_cfl_run_whose_speed_grew_within_a_save_interval_is_advised_a_smaller_cfl():
    """time.cfl = 2, within rk4's 2.83, sets dt from max|v| at each save; V = 8 I concentrates the density so that
    max|v| grows 1.5-fold within a save interval of 0.5 and a step's lmax max|v| dt reaches 2.99.  The advice was
    "take time.cfl below 2.83", above the run's own 2, which changes nothing; it is now 2 x 2.83 / 2.99 = 1.89,
    the cfl that would have kept that step within the bound: the numbers of the message agree to its digits."""
    from spherepde.discretisation.timesteppers import stability_bound

    case = case_from_dict({"sphere": {"dim": 2, "lmax": 16},
                           "model": {"kernel": "unnormalized", "beta": 1.0, "eps": 0.0, "V": [[8.0, 0.0], [0.0, 8.0]]},
                           "initial": {"kind": "vmf", "mean": [1.0, 0.0], "kappa": 2.0},
                           "time": {"t_end": 2.0, "save_every": 0.5, "cfl": 2.0, "scheme": "rk4"},
                           "solver": {"device": "cpu"}})
    with pytest.raises(NumericalFailure) as failure, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the resolution lost before the failure
        spherepde.run(case, progress=False)
    said = re.search(r"lmax max\|v\| dt = 16 x (\S+) x (\S+) = (\S+) at .*take time.cfl below (\S+)$",
                     str(failure.value))
    speed, step, product, advised = (float(said[k]) for k in range(1, 5))
    bound = stability_bound("rk4", 1j)
    assert product > bound and math.isclose(product, 16 * speed * step, rel_tol=5e-3)
    assert math.isclose(advised, 2.0 * bound / product, rel_tol=5e-3) and advised < 2.0


def test_in_float32_a_speed_whose_square_overflows_still_says_which_step_is_stable(tmp_path, capsys):
    # W = 1e30 J turns the circle at |v| = 1e30 everywhere: finite in float32, its square (1e60) is not, and the
    # failure said nothing of the step where max|v| was taken from the squares in the run's own dtype.
    from spherepde.discretisation.timesteppers import stability_bound

    text = ROTATION_S1.replace("W = [[0.0, -1.0], [1.0, 0.0]]", "W = [[0.0, -1e30], [1e30, 0.0]]")
    text = text.replace("[diagnostics]", '[solver]\ndtype = "float32"\n[diagnostics]')
    status, err = run_timed(tmp_path, capsys, text.replace("t_end = 40.0", "t_end = 0.1"),
                            'dt = 0.05\nscheme = "imex-ark436"')
    bound = stability_bound("imex-ark436", 1j)
    assert status == 3 and "lmax max|v| dt = 16 x 1e+30 x 0.05 = 8e+29 at t = 0, above" in err, err
    assert err.strip().endswith(f"take time.dt below {bound / 16e30:.3g}"), err


def test_a_step_that_passes_the_bound_between_saves_is_found_by_taking_the_steps_again(tmp_path, capsys):
    # finiteness is checked at saves only, and max|v| grows after one as the density concentrates: kuramoto-s1 at
    # beta = 4, eps = 0.05 starts at 0.99 of imex-ark436's bound with dt = 0.05 and is not finite by t = 1.  The
    # failure takes the steps again from the save and names the first one beyond the bound.
    import re

    from solvers.forward_problem import ForwardProblem
    from spherepde.discretisation.timesteppers import stability_bound

    overrides = ["model.beta=4", "model.eps=0.05", "time.t_end=1.0", "time.save_every=1.0", "time.dt=0.05"]
    problem = ForwardProblem(spherepde.load_case("cases/kuramoto-s1.toml", overrides))
    drive, bound = problem.layer_drives()[0], stability_bound("imex-ark436", 1j)
    assert problem.unstable_steps(problem.initial(), drive, 0.05, 0.0, "time.dt") == [None]  # the save says nothing
    status, err = run_cli(["run", "cases/kuramoto-s1.toml", "-o", tmp_path / "out.nc",
                           "--quiet"] + [word for value in overrides for word in ("--set", value)], capsys)
    found = re.search(r"lmax max\|v\| dt = 32 x ([0-9.]+) x 0.05 = ([0-9.]+) at t = ([0-9.]+), above 4, .*"
                      r"take time.dt below ([0-9.]+)$", err.strip())
    assert status == 3 and found, err
    speed, number, t, within = (float(group) for group in found.groups())
    assert 0 < t < 1 and number > bound and abs(within - bound / (32 * speed)) <= 1e-3 * within, err


def test_explicit_diffusion_beyond_its_bound_fails_saying_which_step_is_stable(tmp_path, capsys):
    # rk4 takes the diffusion explicitly: the heat equation (W = 0, eps = 0.1) on S^1 at lmax 16 has the modes
    # -eps k^2 down to -25.6, stable while 25.6 dt is below RK4's bound on the negative real axis, 2.785
    from spherepde.discretisation.timesteppers import stability_bound

    bound = stability_bound("rk4", -1)
    heat = ROTATION_S1.replace("W = [[0.0, -1.0], [1.0, 0.0]]", "W = [[0.0, 0.0], [0.0, 0.0]]").replace(
        "eps = 0.0", "eps = 0.1")
    err, step = stable_then_failing(tmp_path, capsys, heat, "rk4", bound / 25.6)
    assert f"dt max|eps lam| = {step:.3g} x 25.6 = {25.6 * step:.3g}, above {bound:.3g}" in err, err
    assert err.strip().endswith(f"take time.dt below {bound / 25.6:.3g} or an IMEX scheme"), err


def test_info_of_a_sweep_of_trainings_gives_each_members_course(tmp_path, capsys):
    # a sweep's loss is (member, iteration), a member that stopped early padded with NaN
    loss = np.array([[0.8, 0.7, 0.65], [0.9, 0.85, np.nan]])
    sweep = xr.Dataset({"loss": (("member", "iteration"), loss), "member_status": ("member", ["completed", "failed"]),
                        "order_parameter": (("member", "time"), [[0.5, 0.6], [0.5, 0.55]])},
                       coords={"member": [0, 1], "time": [0.0, 1.0], "iteration": [0, 1, 2],
                               "control_learning_rate": ("member", [0.05, 0.5])},
                       attrs={"source": "spherepde 0.2.0", "solver": "eulerian"})
    write_dataset(sweep, tmp_path / "sweep.nc")
    assert main(["info", str(tmp_path / "sweep.nc")]) == 0
    out = capsys.readouterr().out
    assert "member 0 training: J 0.8 -> 0.65 over 2 iterations" in out, out
    assert "member 1 training: J 0.9 -> 0.85 over 1 iterations" in out, out


def test_finite_blow_up_exits_3_and_keeps_only_densities(tmp_path, capsys):
    # Transport 50 times too strong for dt = 0.5: the first step overshoots to a finite state whose mass has
    # moved (the scheme conserves it to round-off) before anything overflows.
    unstable = SMALL_S1.replace('kernel = "softmax"\nbeta = 2.0', 'kernel = "unnormalized"\nbeta = 1.0\n'
                                'V = [[50.0, 0.0], [0.0, 50.0]]').replace("eps = 0.1", "eps = 0.0")
    case = write_case(tmp_path, unstable.replace("dt = 0.05", "dt = 0.5").replace("t_end = 0.5", "t_end = 1.0")
                      .replace("save_every = 0.25", "save_every = 0.5"))
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output, "--quiet"], capsys)
    assert status == 3 and "blew up" in err, err
    with xr.open_dataset(output) as dataset:
        assert dataset.attrs["status"].startswith("failed") and dataset.attrs["wall_seconds"] > 0
        np.testing.assert_allclose(dataset["mass"].values, 1.0, atol=1e-12)
        assert np.abs(dataset["density"].values).max() < 10.0
    # with --solver both the particle run is kept beside the Eulerian run's last good state; the particles'
    # Heun steps stay bounded (on the circle) and reach t_end
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--overwrite", "--solver", "both"], capsys)
    assert status == 3 and "blew up" in err, err
    with xr.open_dataset(output) as dataset:
        assert dataset.attrs["solver"] == "both" and dataset.attrs["particles_status"] == "completed"
        assert dataset.attrs["status"].startswith("failed")
        assert list(dataset["time"].values) == [0.0, 0.5, 1.0]
        assert np.isfinite(dataset["particles_order_parameter"].values).all()
        np.testing.assert_allclose(dataset["mass"].values[:1], 1.0, atol=1e-12)
        assert np.isnan(dataset["mass"].values[-1])
        last_good = float(dataset["order_parameter"].values[0])
    assert main(["info", str(output)]) == 0
    text = capsys.readouterr().out
    assert "particles: status completed" in text and "particles_order_parameter" in text
    assert f"{last_good:.8g}" in text.split("order_parameter", 1)[1].splitlines()[0]  # its last save, not NaN


@pytest.mark.parametrize("target", ["folder", "inside a file", "empty", "the case file", "/proc"])
def test_unusable_output_path_exits_2_before_the_run(tmp_path, capsys, target):
    if target == "/proc" and not os.path.isdir("/proc/self"):
        pytest.skip("no procfs here")
    case = write_case(tmp_path)
    (tmp_path / "folder").mkdir()
    output = {"folder": tmp_path / "folder", "inside a file": case / "out.nc", "empty": "", "the case file": case,
              "/proc": "/proc/spherepde-output.nc"}[target]  # os.access lets root write there; nothing can
    before = sorted(os.listdir(tmp_path))
    status, err = run_cli(["run", case, "-o", output, "--overwrite"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and err.startswith("spherepde: error: -o "), err
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(tmp_path / "folder") == []
    assert case.read_text() == SMALL_S1


def test_files_that_are_not_results_exit_2_with_one_line(tmp_path, capsys):
    case = write_case(tmp_path)
    foreign = tmp_path / "foreign.nc"
    xr.Dataset({"a": ("x", [1.0])}).to_netcdf(foreign)
    for args in (["info", case], ["info", foreign], ["info", tmp_path], ["plot", foreign, "-o", tmp_path / "figures"],
                 ["compare", case]):
        status, err = run_cli(args, capsys)
        assert status == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (args, err)
    assert not (tmp_path / "figures").exists()


def test_compare_refuses_non_finite_verdict_options_and_a_folder_stem(tmp_path, capsys):
    case = write_case(tmp_path)
    output = tmp_path / "both.nc"
    assert run_cli(["run", case, "-o", output, "--quiet", "--solver", "both", "--set", "particles.n=200"],
                   capsys)[0] == 0
    for option in (["--k", "nan"], ["--k", "inf"], ["--atol", "inf"], ["-o", f"{tmp_path}{os.sep}"]):
        status, err = run_cli(["compare", output, *option], capsys)
        assert status == 2 and len(err.strip().splitlines()) == 1, (option, err)
    assert sorted(os.listdir(tmp_path)) == ["both.nc", "case.toml"]


@pytest.mark.parametrize("failure", [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:117] "
                                                                  "DefaultCPUAllocator: can't allocate memory")])
def test_out_of_memory_is_one_line_and_exit_2_and_other_errors_are_not_hidden(tmp_path, capsys, monkeypatch,
                                                                              failure):
    raised = [failure]

    def run(*args, **kwargs):
        raise raised[0]

    monkeypatch.setattr(spherepde, "run", run)
    case = write_case(tmp_path)
    status, err = run_cli(["run", case, "-o", tmp_path / "out.nc"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "out of memory" in err
    assert not (tmp_path / "out.nc").exists()
    raised[0] = RuntimeError("a bug")
    with pytest.raises(RuntimeError, match="a bug"):
        main(["run", str(case), "-o", str(tmp_path / "out.nc")])


def test_bare_command_lists_the_commands_and_help_and_version_answer(capsys):
    assert main([]) == 2
    usage = capsys.readouterr().err
    assert all(command in usage for command in ("run", "compare", "info", "plot", "sweep")) and "examples:" in usage
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"spherepde {spherepde.__version__}"
    assert main(["run"]) == 2
    assert capsys.readouterr().err.strip() == "spherepde: error: run: the following arguments are required: case"
    assert main(["info", "out.nc", "--kind", "map"]) == 2  # argparse leaves these to the top parser
    assert capsys.readouterr().err.strip() == "spherepde: error: info: unrecognized arguments: --kind map"


def test_a_grid_that_does_not_carry_the_initial_law_is_refused(tmp_path, capsys):
    """The quick-start at lmax 4 has 24% of rho_0's L2 norm in its top degrees (it ran with a warning before)."""
    output = tmp_path / "coarse.nc"
    assert main(["run", "cases/quickstart.toml", "--set", "sphere.lmax=4", "-o", str(output), "--quiet"]) == 2
    message = capsys.readouterr().err.strip()
    assert "sphere.lmax = 4 does not resolve this vmf_mixture law (spectral tail 0.24 > 0.2 at t = 0)" in message
    assert not output.exists()


@pytest.mark.parametrize("module, command, expected", [
    ("shtns", ["run", "cases/convergence-s2.toml", "--set", "solver.backend='shtns'"],
     "pip install 'spherepde[shtns]'"),
    ("distributed", ["sweep", "cases/kuramoto-s1.toml", "--param", "model.eps=0.2,0.3"],
     "pip install 'spherepde[sweep]'"),
])
def test_a_missing_optional_extra_is_one_line_and_exit_2(tmp_path, module, command, expected):
    """Run in a fresh process in which the extra's module is absent (sys.modules[name] = None: import fails,
    importlib.util.find_spec answers None)."""
    code = (f"import sys; sys.modules[{module!r}] = None; from spherepde.cli import main; "
            f"sys.exit(main({command + ['-o', str(tmp_path / 'out')]!r}))")
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=os.environ | {"PYTHONPATH": os.getcwd()})
    assert process.returncode == 2
    assert len(process.stderr.strip().splitlines()) == 1 and expected in process.stderr


def test_a_command_but_sweep_runs_without_dask(tmp_path, capsys):
    """The command line's own process hides dask unless its command is sweep: xarray would import dask.array (and
    distributed, to write) whenever dask is installed, 0.4 s of CPU a command.  `info` says the same without it."""
    hides = ("import sys; from spherepde.cli import _hide_dask; _hide_dask(sys.argv[1:]); "
             "print(sys.modules.get('dask', 0) is None)")
    for words, hidden in ((["info", "sweep.nc"], "True"), (["run", "case.toml", "--plot"], "True"),
                          (["sweep", "case.toml", "--param", "model.eps=0.1,0.2"], "False")):
        assert subprocess.run([sys.executable, "-c", hides, *words], capture_output=True, text=True,
                              env=os.environ | {"PYTHONPATH": os.getcwd()}).stdout.strip() == hidden
    output = tmp_path / "run.nc"
    assert main(["run", str(write_case(tmp_path)), "-o", str(output), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["info", str(output)]) == 0
    summary = capsys.readouterr().out
    process = subprocess.run([sys.executable, "-X", "importtime", "-m", "spherepde", "info", str(output)],
                             capture_output=True, text=True, env=os.environ | {"PYTHONPATH": os.getcwd()})
    imported = [line.rsplit("|", 1)[-1].strip() for line in process.stderr.splitlines()]
    assert process.stdout == summary and imported and not {"dask", "distributed"} & set(imported)


def test_a_sigterm_landing_in_an_execd_string_still_exits_143(tmp_path):
    """SIGTERM stops a command with status 143 wherever it lands, also inside code that exec'd a string (scipy's
    imports do), after which CPython would otherwise end a `python -m` process by SIGINT (130) whatever its status."""
    (tmp_path / "stopped.py").write_text(
        "import sys\nimport spherepde.cli as cli\n"
        "def info(args):\n"
        "    exec('import os, signal\\nos.kill(os.getpid(), signal.SIGTERM)\\nfor i in range(1000): pass')\n"
        "cli.command_info = info\n"
        "sys.exit(cli.main(['info', 'any.nc']))\n")
    result = subprocess.run([sys.executable, "-m", "stopped"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert (result.returncode, result.stderr.strip()) == (143, "spherepde: terminated")


def test_a_both_run_prints_its_particle_half_s_notes(tmp_path, capsys):
    """The particle half's notes (particles_notes) were stored but never printed (the stiff step's here)."""
    status = main(["run", "cases/kuramoto-s1.toml", "--solver", "both", "-o", str(tmp_path / "both.nc"), "--quiet",
                   "--set", "model.V=[[1000.0,0.0],[0.0,1000.0]]", "--set", "model.eps=0.0", "--set", "time.t_end=0.04",
                   "--set", "time.save_every=0.02", "--set", "particles.dt=0.02", "--set", "time.dt=0.00001",
                   "--set", "particles.n=64"])
    err = capsys.readouterr().err
    assert status == 0
    assert "spherepde: warning: particles: particles.dt: steps of 0.02 are too long for the drift" in err, err
