"""Post-processing a result as a researcher does (docs/guide/outputs.md): what `spherepde info` prints against the
numbers in the file."""

import re

import numpy as np
import xarray as xr
from test_cli import SMALL_S1

import spherepde
from spherepde.io.output import write_dataset
from spherepde.io.summary import describe


def test_info_prints_the_save_times_the_file_holds(tmp_path):
    """`info`'s time line printed the first and last save to 6 significant digits: a run to t_end = 1.234375 (79/64,
    exact in binary) read "0 .. 1.23438", a depth the file does not hold; it prints them as the attributes, to 10."""
    case = spherepde.load_case_text(SMALL_S1).with_overrides(
        ["time.t_end=1.234375", "time.dt=0.1234375", "time.save_every=0.6171875", "sphere.lmax=24"])
    path = tmp_path / "run.nc"
    write_dataset(spherepde.run(case), path)
    line = next(line for line in describe(str(path)).splitlines() if line.strip().startswith("time:"))
    first, last, saves = re.fullmatch(r"\s*time: (\S+) \.\. (\S+) \((\d+) saves\)", line).groups()
    with xr.open_dataset(path) as dataset:
        times = dataset["time"].values
    assert (float(first), float(last), int(saves)) == (times[0], times[-1], len(times)) == (0.0, 1.234375, 3), line


def test_info_prints_every_trained_parameters_norm_per_layer(tmp_path):
    """A training of the two-layer feed-forward and of B, V (two heads) stores W1, b, W2, B and V (layer, ...), no
    W: `info` printed no norm at all.  It prints each one's Frobenius norm per layer (over its heads for B and V),
    the figures the file's values give."""
    from test_beyond_eulerian import S1, case_text, training

    case = spherepde.load_case_text(case_text(S1, 2, 16, "softmax", "mlp", S1["V2"], control=training(S1)))
    path = tmp_path / "train.nc"
    write_dataset(spherepde.run(case.with_overrides(["control.iterations=1"])), path)
    summary = describe(str(path))
    with xr.open_dataset(path) as dataset:
        assert "W" not in dataset
        for name in ("W1", "b", "W2", "B", "V"):
            values = dataset[name].values
            norms = np.sqrt((values.reshape(values.shape[0], -1) ** 2).sum(1))
            assert f"|{name}_l|_F per layer: " + " ".join(f"{norm:.3g}" for norm in norms) in summary, summary
