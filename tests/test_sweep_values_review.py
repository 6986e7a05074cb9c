"""The member coordinates of a sweep for every kind of swept value: each selects its member by the value as the case
file writes it (a real key's number as a float, a string without TOML's quotes, a boolean as one)."""

import math

import numpy as np
import pytest
import xarray as xr

pytest.importorskip("distributed", reason="the sweep extra (Dask) is not installed: pip install 'spherepde[sweep]'")

from test_cli import SMALL_S1, write_case

import spherepde
from spherepde.api.sweep import _member_coordinate, _resolved, by_parameters, plan
from spherepde.cli import main

# --param, the coordinate's values as a NetCDF file gives them back, and their dtype kind
CASES = [
    ("model.beta=1,2", [1.0, 2.0], "f"),  # a real key swept as integers: a float coordinate, as for 1.5, 2
    ('model.beta=2,"inf"', [2.0, math.inf], "f"),
    ("sphere.lmax=8,12", [8, 12], "i"),
    ("initial.kind=vmf,uniform", ["vmf", "uniform"], "U"),
    ('solver.method="particles","eulerian"', ["particles", "eulerian"], "U"),
    ("diagnostics.w2=true,false", [True, False], "b"),
    ("model.B=[[1,0],[0,1]],[[2,0],[0,1]]", ["[[1, 0], [0, 1]]", "[[2, 0], [0, 1]]"], "U"),
]


@pytest.mark.parametrize("param, expected, kind", CASES)
def test_a_swept_value_selects_its_member_after_netcdf(tmp_path, param, expected, kind):
    case = spherepde.load_case(write_case(tmp_path, SMALL_S1))
    members = plan(case, [param], str(tmp_path))
    key = param.partition("=")[0]
    name = key.replace(".", "_")
    column = _member_coordinate(key, [m.values[key] for m in members], [_resolved(m.case, key) for m in members])
    dataset = xr.Dataset({"index": ("member", [m.index for m in members])}, coords={name: column})
    dataset.attrs["swept"] = name
    dataset.to_netcdf(tmp_path / "sweep.nc")
    with xr.open_dataset(tmp_path / "sweep.nc") as stored:
        assert stored[name].dtype.kind == kind, stored[name].dtype
        assert stored[name].values.tolist() == expected
        grid = by_parameters(stored)
        for index, value in enumerate(expected):
            assert int(grid["index"].sel({name: value})) == index


@pytest.mark.slow
def test_a_sweep_over_a_string_and_a_real_key_selects_members_by_value(tmp_path):
    """End to end: .sel(initial_kind="uniform", model_beta=2.0) of sweep.nc is member 3, equal to its own file."""
    case = write_case(tmp_path, SMALL_S1)
    output = tmp_path / "out"
    assert main(["sweep", str(case), "--param", "initial.kind=vmf,uniform", "--param", "model.beta=1,2",
                 "--set", "time.t_end=0.2", "--workers", "1", "-o", str(output)]) == 0
    with xr.open_dataset(output / "sweep.nc") as combined, xr.open_dataset(output / "member-003.nc") as member:
        assert combined["model_beta"].dtype.kind == "f"
        picked = by_parameters(combined).sel(initial_kind="uniform", model_beta=2.0)
        assert np.array_equal(picked["order_parameter"].values, member["order_parameter"].values)
        assert 'kind = "uniform"' in str(picked["member_case"].values) and "beta = 2.0" in str(
            picked["member_case"].values)


@pytest.mark.parametrize("param, labels", [
    ("model.eps=0,-0.0", ("model.eps=0", "model.eps=-0.0")),
    ("model.W=[[-0.0,0],[0,0]],[[0,0],[0,0]]", ("model.W=[[-0.0, 0], [0, 0]]", "model.W=[[0, 0], [0, 0]]"))])
def test_a_swept_zero_and_its_negative_are_the_same_run(tmp_path, capsys, param, labels):
    """0 and -0.0 are one number to a run (their runs' files are equal bit for bit) but were two members, as 0.1, 0.1
    (refused: "given twice") and 1, 1.0 (refused: "the same run") are not: refused as the latter."""
    status = main(["sweep", str(write_case(tmp_path)), "--param", param, "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2 and err.strip() == (f"spherepde: error: sweep members 0 ({labels[0]}) and 1 ({labels[1]}) are "
                                           "the same run"), err
    assert not (tmp_path / "out").exists()
