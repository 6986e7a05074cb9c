"""Post-processing a result as a researcher does (docs/guide/outputs.md): what `spherepde info` prints against the
numbers in the file."""

import re

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
