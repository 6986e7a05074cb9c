"""Fuzzed case files (hypothesis): `spherepde run` never ends in a traceback.

Every example starts from a small valid case on S^1 or S^2, changes up to four keys (known
keys or invented ones) to values of any TOML type, or deletes them, and may splice random
text into the file. Whatever comes out, the command line exits 0, 2 or 3: 2 with one line
naming the problem and no output file, 3 with the run up to its last good save. Sizes stay
small (lmax <= 24, at most 20 steps) so that every example runs in well under a second
(SPHEREPDE_FUZZ_EXAMPLES=2000 for a longer search);
limits on sizes themselves are checked by the schema (see test_case.py and the lmax, save
and step bounds below).
"""

import contextlib
import io
import json
import math
import os

import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spherepde.cli import main

SECTIONS = {
    "case": ["name", "description"],
    "sphere": ["dim", "lmax"],
    "model": ["kernel", "beta", "B", "V", "W", "eps"],
    "initial": ["kind", "mean", "kappa", "covariance", "means", "kappas", "weights", "path", "time"],
    "time": ["t_end", "dt", "cfl", "save_every", "scheme", "max_steps"],
    "solver": ["method", "field", "backend", "device", "dtype", "chunk", "filter_order", "kernel_tol"],
    "particles": ["n", "seed", "integrator", "save", "beta_inf_mode", "dt"],
    "diagnostics": ["lyapunov_p", "tail_tol", "w2", "w2_atoms"],
    "control": ["loss"],
}
WORDS = ["softmax", "unnormalized", "inf", "uniform", "vmf", "vmf_mixture", "projected_gaussian", "file", "eulerian",
         "particles", "both", "auto", "dense", "spectral", "torch", "shtns", "cpu", "cuda", "float64", "float32", "rk4",
         "lawson-rk4", "imex-ark436", "imex-ars443", "euler", "heun", "mean_field", "hardmax", "run.nc",
         "case.toml", ""]
S1 = {
    "case": {"name": "fuzz"}, "sphere": {"dim": 2, "lmax": 12},
    "model": {"kernel": "softmax", "beta": 2.0, "eps": 0.1},
    "initial": {"kind": "vmf", "mean": [1.0, 0.0], "kappa": 2.0},
    "time": {"t_end": 0.2, "dt": 0.05, "save_every": 0.1}, "solver": {"device": "cpu"},
    "particles": {"n": 16, "save": 8},
}
S2 = {
    "case": {"name": "fuzz"}, "sphere": {"dim": 3, "lmax": 8},
    "model": {"kernel": "softmax", "beta": 1.0, "eps": 0.1},
    "initial": {"kind": "vmf_mixture", "means": [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], "kappas": [2.0, 3.0]},
    "time": {"t_end": 0.2, "cfl": 0.5, "save_every": 0.1}, "solver": {"device": "cpu", "dtype": "float32"},
    "particles": {"n": 16, "save": 8},
}

numbers = st.one_of(
    st.integers(-3, 24),
    st.sampled_from([2 ** 63 - 1, -(2 ** 63)]),
    st.floats(-50, 50),
    st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e300, 1.7976931348623157e308, math.inf, -math.inf, math.nan]),
)
scalars = st.one_of(st.booleans(), numbers, st.sampled_from(WORDS), st.text(max_size=6))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.sampled_from(["kind", "a", "x"]), inner, max_size=2), max_leaves=12)
# Values that pass the type checks often, so that the examples reach the solvers.
matrices = st.integers(2, 3).flatmap(lambda d: st.lists(st.lists(st.floats(-3, 3), min_size=d, max_size=d),
                                                         min_size=d, max_size=d))
plausible = st.one_of(st.floats(0, 4), st.integers(0, 24), st.sampled_from(WORDS),
                      st.lists(st.floats(-2, 2), min_size=1, max_size=3), matrices,
                      st.lists(st.lists(st.floats(-1, 1), min_size=2, max_size=3), min_size=1, max_size=3))
values = st.one_of(plausible, plausible, anything)
sections = st.one_of(st.sampled_from(sorted(SECTIONS)), st.sampled_from(sorted(SECTIONS)),
                     st.text(min_size=1, max_size=5))


@st.composite
def edits(draw):
    """(section, key, value or None for a deletion)."""
    section = draw(sections)
    known = st.sampled_from(SECTIONS.get(section, ["x"]))
    key = draw(st.one_of(known, known, known, st.text(min_size=1, max_size=5)))
    return section, key, draw(st.one_of(st.none(), values, values))


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_text(table: dict) -> str:
    blocks = []
    for name, section in table.items():
        if isinstance(section, dict):
            lines = [f"[{json.dumps(name)}]"] + [f"{json.dumps(k)} = {toml_value(v)}" for k, v in section.items()]
            blocks.append("\n".join(lines))
        else:
            blocks.insert(0, f"{json.dumps(name)} = {toml_value(section)}")
    return "\n\n".join(blocks) + "\n"


@settings(max_examples=int(os.environ.get("SPHEREPDE_FUZZ_EXAMPLES", 60)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([S1, S2]), changes=st.lists(edits(), max_size=4),
       splice=st.one_of(st.none(), st.none(), st.none(), st.tuples(st.floats(0, 1), st.text(max_size=12))))
def test_fuzzed_case_files_never_end_in_a_traceback(tmp_path_factory, base, changes, splice):
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "run.nc").write_bytes(b"not a netcdf file")
    table = json.loads(json.dumps(base))
    for section, key, value in changes:
        target = table.setdefault(section, {})
        if not isinstance(target, dict):
            table[section] = target = {}
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    text = toml_text(table)
    if splice is not None:
        at = int(splice[0] * len(text))
        text = text[:at] + splice[1] + text[at:]
    case, output = folder / "case.toml", folder / "out.nc"
    case.write_text(text, encoding="utf-8", errors="surrogatepass")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        status = main(["run", str(case), "-o", str(output), "--quiet", "--set", "time.max_steps=20"])
    err = stderr.getvalue()
    assert status in (0, 2, 3), err
    assert "Traceback" not in err
    if status == 2:
        assert err.startswith("spherepde: error: ") and len(err.strip().splitlines()) == 1, err
        assert not output.exists()
    else:
        with xr.open_dataset(output) as dataset:
            expected = "completed" if status == 0 else "failed"
            assert dataset.attrs["status"].startswith(expected)


@pytest.mark.parametrize("override, key", [("sphere.lmax=9223372036854775807", "sphere.lmax"),
                                           ("time.save_every=1e-300", "time.save_every"),
                                           ("time.dt=5e-324", "time.dt")])
def test_sizes_beyond_any_machine_are_refused_by_the_schema(tmp_path, override, key):
    case = tmp_path / "case.toml"
    case.write_text(toml_text(S1))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        assert main(["run", str(case), "-o", str(tmp_path / "out.nc"), "--set", override]) == 2
    assert key in stderr.getvalue() and os.listdir(tmp_path) == ["case.toml"]
