"""Case files as users write them, wrong (a seeded fuzzer's failures, kept as examples): every bad input is one line
naming the key, exit status 2 and no file left behind; and a few odd but valid values, checked to run as documented
against an independent equivalent."""

import os
import sys

import numpy as np
import pytest
import xarray as xr
from test_cli import SMALL_S1

import spherepde
from spherepde.cli import main


def _run(argv, capsys):
    """(exit status, stderr's lines) of `spherepde` with `argv`."""
    status = main(argv)
    return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _refused(argv, capsys, folder, key):
    """The contract for bad input: exit status 2, one line naming `key`, nothing left in `folder`."""
    status, lines = _run(argv, capsys)
    assert status == 2, lines
    assert len(lines) == 1 and key in lines[0] and len(lines[0]) < 400, lines
    assert sorted(os.listdir(folder)) == ["case.toml"]
    return lines[0]


def _case(folder, text=SMALL_S1, name="case.toml"):
    path = folder / name
    path.write_text(text)
    return str(path)


def test_non_utf8_bytes_of_a_set_value_are_refused_naming_the_key(tmp_path, capsys):
    # argv's bytes that are not UTF-8 (a Latin-1 terminal) reach Python as lone surrogates: they failed the lock
    # file's write (a traceback, exit status 1, OUT.nc.lock left behind), else the output's write after the run
    case = _case(tmp_path)
    value = os.fsdecode(b'case.description="caf\xe9"')
    line = _refused(["run", case, "-o", str(tmp_path / "out.nc"), "--quiet", "--set", value], capsys, tmp_path,
                    "case.description")
    assert "UTF-8" in line


def test_non_utf8_output_path_is_refused_before_the_run(tmp_path, capsys):
    # netCDF4 opens UTF-8 paths only: the write failed with a traceback after the whole run
    case = _case(tmp_path)
    output = os.fsdecode(str(tmp_path).encode() + b"/r\xe9sultat.nc")
    _refused(["run", case, "-o", output, "--quiet"], capsys, tmp_path, "-o")


def test_non_utf8_case_file_name_runs_and_its_history_escapes_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = os.fsdecode(b"\xe9t\xe9.toml")
    _case(tmp_path, SMALL_S1.replace("t_end = 0.5", "t_end = 0.25"), name)
    status, lines = _run(["run", name, "-o", "out.nc", "--quiet", "--set", "diagnostics.w2=false"], capsys)
    assert status == 0, lines
    with xr.open_dataset(tmp_path / "out.nc") as result:
        assert result.attrs["history"].endswith("run '\\xe9t\\xe9.toml' -o out.nc --set diagnostics.w2=false")
    assert sorted(os.listdir(tmp_path)) == sorted([name, "out.nc"])


def test_integer_beyond_pythons_digits_is_one_line_naming_it(tmp_path, capsys):
    # tomllib's int() of such a literal raises a ValueError that is no TOMLDecodeError: a traceback, exit status 1
    digits = "1" + "0" * sys.get_int_max_str_digits()
    case = _case(tmp_path, SMALL_S1.replace("lmax = 16", f"lmax = {digits}"))
    line = _refused(["run", case, "-o", str(tmp_path / "out.nc")], capsys, tmp_path, "lmax = 1000")
    assert f"more than {sys.get_int_max_str_digits()} digits" in line
    case = _case(tmp_path)
    _refused(["run", case, "-o", str(tmp_path / "out.nc"), "--set", f"model.eps={digits}"], capsys, tmp_path,
             "model.eps")


def test_a_long_value_is_quoted_shortened(tmp_path, capsys):
    # a value of 1e5 characters was quoted whole: an error "line" of 100 120 characters
    case = _case(tmp_path)
    for override, key in ((f'initial.kind="{"x" * 100_000}"', "initial.kind"),
                          (f'solver.chunk="{"x" * 100_000}"', "solver.chunk"),
                          (f"{'x' * 100_000}=1", "override 'xxxx")):
        _refused(["run", case, "-o", str(tmp_path / "out.nc"), "--set", override], capsys, tmp_path, key)
    # a notebook's edit to an int beyond repr's 4300 digits: its repr in the message raised a ValueError
    case = spherepde.load_case_text(SMALL_S1)
    case["particles"]["n"] = 10 ** 5000
    expected = r"particles\.n: must be in \[2, 2\*\*32\), got an integer of 16610 bits"
    with pytest.raises(spherepde.CaseError, match=expected):
        case.checked()


def test_a_second_head_equal_to_the_first_is_the_single_head_with_twice_V():
    # sum over heads of V_h m_h with two identical heads (extra_heads = [{}]: head 0's kernel and beta, B = V = I)
    # is the one head with V = 2 I, exactly: the two runs agree to round-off
    two = spherepde.run(spherepde.load_case_text(SMALL_S1, ["model.extra_heads=[{}]"]), progress=False)
    one = spherepde.run(spherepde.load_case_text(SMALL_S1, ["model.V=[[2.0, 0.0], [0.0, 2.0]]"]), progress=False)
    assert np.abs(two["density"].values - one["density"].values).max() < 1e-13
    assert np.abs(two["density"].values[-1] - two["density"].values[0]).max() > 0.05  # the heads do move it


def test_a_step_longer_than_the_run_steps_to_the_saves():
    # time.dt = 10 > t_end: the saves are knots of the step grid, so the steps are the save intervals, the same run
    # as time.dt = save_every bit for bit; t_end no multiple of save_every saves at t_end last
    long = spherepde.run(spherepde.load_case_text(SMALL_S1, ["time.dt=10.0"]), progress=False)
    even = spherepde.run(spherepde.load_case_text(SMALL_S1, ["time.dt=0.25"]), progress=False)
    assert np.array_equal(long["density"].values, even["density"].values)
    odd = spherepde.load_case_text(SMALL_S1, ["time.t_end=0.6"])
    assert spherepde.run(odd, progress=False)["time"].values.tolist() == [0.0, 0.25, 0.5, 0.6]


@pytest.mark.parametrize("name", ["  x  ", "x ", "\tx"])
def test_a_name_with_surrounding_white_space_is_refused(name):
    """case.name = "  x  " was accepted and wrote "  x  .nc" (a file a shell lists as " x .nc" and a user cannot
    find by its name); refused naming the key, as a name starting with "." is."""
    with pytest.raises(spherepde.CaseError, match=r"case\.name: must not start or end with white space"):
        spherepde.load_case_text(SMALL_S1.replace('name = "small"', f'name = "{name}"'))
    assert spherepde.load_case_text(SMALL_S1.replace('name = "small"', 'name = "a b"')).name == "a b"
