"""The seeds' cells as results/ reads them, recomputed from the committed summaries with plain numpy."""

import sys
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent.parent / "results"
sys.path.insert(0, str(RESULTS))

import seed004  # noqa: E402


def test_seed004_bow_cell_is_also_read_as_the_tokens_angular_spread():
    """Seed 004 calls its bow cell a terminal 'angular divergence' (0.763 +- 0.343 at kappa_cand = 2): the report
    gives the tokens' circular standard deviation sqrt(-2 ln |m(T)|) at T, mean +- sd over the 20 trainings."""
    summaries = seed004.read_summaries(seed004.plan(["bow-k2"]))
    members = summaries[("bow-k2", "particles")]["members"]
    lengths = np.array([np.hypot(*member["mean"][-1]) for member in members])
    spread = np.sqrt(-2 * np.log(lengths))
    assert abs(spread.mean() - 0.770) < 5e-4 and abs(spread.std(ddof=1) - 0.011) < 5e-4

    measures = {"bow-k2": seed004.particle_measures(summaries[("bow-k2", "particles")])}
    eulerian = seed004.eulerian_measures(summaries[("bow-k2", "eulerian")])
    ours = [run["spread"] for run in measures["bow-k2"]]
    np.testing.assert_allclose(ours, spread, rtol=1e-12)
    mean_field = np.hypot(*summaries[("bow-k2", "eulerian")]["mean"][-1])
    assert abs(eulerian["spread"] - np.sqrt(-2 * np.log(mean_field))) < 1e-12
    cell = [line for line in seed004.cells(seed004.BY_KEY["bow-k2"], measures, eulerian) if "spread" in line[0]]
    # |0.770 - 0.763| = 0.007 against twice the standard error of the difference, 0.154
    assert cell and cell[0][1] == "0.763 +- 0.343" and cell[0][-1] == "agrees"


def test_paper003_quotes_the_n8000_departure_from_E_at_beta_1000():
    """'Leaves E' is the first save after the peak of alignment_E below 0.75 (paper003.md): n = 8000 at beta = 1000
    reads 0.752 at t = 10 and leaves at t = 10.25, 0.75 after the n = 2000 sample's 9.5 (the log 2 / sigma = 0.69
    the report predicts)."""
    import xarray as xr

    def leaves(name):
        (path,) = (RESULTS / "paper003" / "runs").glob(f"{name}-??????????.nc")
        with xr.open_dataset(path) as dataset:
            t, align = dataset["time"].values, dataset["alignment_E"].values
        after = (t >= t[np.argmax(align)]) & (align < 0.75)
        return float(t[after][0])

    assert leaves("main-p-beta1000") == 9.5 and leaves("main-p8000-beta1000") == 10.25
    report = (RESULTS / "paper003.md").read_text()
    assert "leave E at t = 10.25" in report and "10.25 against 9.5" in report
