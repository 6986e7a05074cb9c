"""Review of the public API's and `spherepde info`'s claims (docs/reference/api.md): each checked against what the
result file holds, read with xarray."""

import warnings

import pytest
import xarray as xr

import spherepde
from spherepde.io.output import write_dataset
from spherepde.io.summary import describe

KURAMOTO = "cases/kuramoto-s1.toml"
SHORT = ["time.t_end=0.2", "time.save_every=0.2", "time.dt=0.05", "sphere.lmax=16", "particles.n=100"]


def test_info_shows_the_notes_of_a_both_files_particle_run(tmp_path):
    """V = diag(1, 1/2) on S^1: E is one of two dimensions, so the particles' lyapunov_stderr at p = 1/4 is NaN and
    their run says why in `particles_notes`; `info` printed the Eulerian run's notes alone (none here), and a
    particle half's "steps too long for the drift: the particles' law may be wrong" went unseen the same way."""
    case = spherepde.load_case(KURAMOTO, [*SHORT, "solver.method='both'", "model.V=[[1.0, 0.0], [0.0, 0.5]]"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        write_dataset(spherepde.run(case, progress=False), tmp_path / "both.nc")
    with xr.open_dataset(tmp_path / "both.nc") as dataset:
        eulerian, particles = dataset.attrs["notes"], dataset.attrs["particles_notes"]
    assert eulerian == "" and "lyapunov_stderr is NaN for p >= dim(E) / 4 = 0.25" in particles
    notes = [line.strip() for line in describe(str(tmp_path / "both.nc")).splitlines() if "note:" in line]
    assert notes == [f"note: particles: {note}" for note in particles.splitlines()]


def test_run_sweep_takes_one_string_as_one_swept_key(tmp_path):
    """As load_case takes one override string: run_sweep read "model.eps=-1,0.2" as the keys "m", "o", ... and refused
    "--param 'm'"; it is now the one key, its member eps = -1 refused by name before any work."""
    from spherepde.api.sweep import run_sweep

    with pytest.raises(spherepde.CaseError, match=r"sweep member 0 \(model\.eps=-1\): .*model\.eps: must be >= 0"):
        run_sweep(spherepde.load_case(KURAMOTO, SHORT), "model.eps=-1,0.2", str(tmp_path / "sweep"))


@pytest.mark.slow
def test_a_sweeps_history_names_the_params_given_as_a_generator(tmp_path):
    """run_sweep read a generator of params once to plan its members and again for the files' CF history, which then
    read "sweep  --seeds 2": the two values of model.eps swept, the history naming no key."""
    from spherepde.api.sweep import run_sweep

    case = spherepde.load_case(KURAMOTO, [*SHORT, "solver.method='particles'", "particles.n=50"])
    path = run_sweep(case, (param for param in ["model.eps=0.2,0.4"]), str(tmp_path / "sweep"), seeds=2, workers=1,
                     progress=False)
    with xr.open_dataset(path) as sweep:
        assert sorted(set(sweep["model_eps"].values)) == [0.2, 0.4]
        assert sweep.attrs["history"].endswith(f"spherepde {spherepde.__version__} sweep model.eps=0.2,0.4 --seeds 2")


@pytest.mark.parametrize("cases, error, said", [([], ValueError, "no cases"),
                                                ([KURAMOTO], TypeError, "takes a list of Case .*got str")])
def test_run_batch_refuses_no_members_and_members_that_are_no_case(cases, error, said):
    """run_batch([]) ended in an IndexError from its batch check (batches([]) is no batch, which the docstring says
    is a ValueError), and a case file's path in an AttributeError ('str' object has no attribute 'checked')."""
    from spherepde.api.ensemble import run_batch

    with pytest.raises(error, match=said):
        run_batch(cases, progress=False)
