"""Case files: resolution, defaults, overrides, the TOML round trip and one-line errors."""

import copy
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_case

import spherepde.io.case_schema as case_schema
from spherepde.base.errors import CaseError
from spherepde.base.memory import glibc
from spherepde.io.case import Case, case_from_dict, load_case, load_case_text, parse_override

SPHERE = "[sphere]\ndim = 2\n"
SPHERE3 = "[sphere]\ndim = 3\n"
TIME = "[time]\nt_end = 2.0\n"
MINIMAL = SPHERE + TIME
TRAIN = SPHERE + "[time]\nt_end = 1\ndt = 0.1\n[control]\n"  # a training run, [control] open
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # of b"" (FIPS 180-4 test value)


SHIPPED_CASES = sorted((Path(__file__).resolve().parent.parent / "cases").glob("*.toml"))


def reloaded(case: Case) -> Case:
    return load_case_text(case.text)


def assert_round_trip(case: Case) -> None:
    again = reloaded(case)
    assert again.data == case.data
    assert again.text == case.text  # stronger than ==: repr of every float (-0.0, 1e-300) agrees


# --- defaults -----------------------------------------------------------------------------


def test_minimal_case_fills_every_default():
    data = load_case_text(MINIMAL).data
    assert data["case"] == {"name": "case", "description": ""}
    assert data["sphere"] == {"dim": 2, "lmax": 32}
    assert data["model"] == {"kernel": "softmax", "beta": 1.0, "B": [[1.0, 0.0], [0.0, 1.0]],
                             "V": [[1.0, 0.0], [0.0, 1.0]], "W": [[0.0, 0.0], [0.0, 0.0]], "eps": 0.0}
    assert data["initial"] == {"kind": "uniform"}
    assert data["time"] == {"t_end": 2.0, "cfl": 0.5, "save_every": 0.1, "scheme": "auto"}
    assert data["solver"] == {"method": "eulerian", "field": "auto", "backend": "auto", "device": "auto",
                              "dtype": "float64", "chunk": "auto", "filter_order": 0, "kernel_tol": 1e-10}
    assert data["particles"] == {"n": 1000, "seed": 0, "integrator": "heun", "save": 1000,
                                 "beta_inf_mode": "mean_field", "replicas": 1}
    assert data["diagnostics"] == {"lyapunov_p": [0.25], "tail_tol": 1e-6, "w2": True, "w2_atoms": 1000}
    assert data["control"] == {}


def test_defaults_depend_on_other_keys():
    case = load_case_text(SPHERE3 + "[time]\nt_end = 10\ndt = 0.01\n[particles]\nn = 50\n")
    assert case["model"]["B"] == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    assert case["time"] == {"t_end": 10.0, "dt": 0.01, "save_every": 0.5, "scheme": "auto"}  # no cfl
    assert case["particles"]["save"] == 50


def test_case_name_defaults_to_file_stem(tmp_path):
    path = tmp_path / "kuramoto-s1.toml"
    path.write_text(MINIMAL)
    case = load_case(path)
    assert case.name == "kuramoto-s1" and case.dim == 2
    assert case.source == MINIMAL and case.origin == str(path)


def test_ints_become_floats_where_reals_are_expected():
    case = load_case_text(MINIMAL + "[model]\neps = 1\nB = [[2, 0], [0, 1]]\n")
    assert type(case["model"]["eps"]) is float
    assert all(type(x) is float for row in case["model"]["B"] for x in row)
    assert type(case["time"]["t_end"]) is float


@pytest.mark.parametrize("beta", ['"inf"', "inf", "+inf"])
def test_beta_inf_as_string_or_toml_float(beta):
    assert load_case_text(MINIMAL + f"[model]\nbeta = {beta}\n")["model"]["beta"] == math.inf


# --- normalisation --------------------------------------------------------------------------


def test_vmf_mean_normalised_to_unit_length():
    case = load_case_text(MINIMAL + "[initial]\nkind = 'vmf'\nmean = [3, 4]\nkappa = 2\n")
    assert case["initial"] == {"kind": "vmf", "mean": [0.6, 0.8], "kappa": 2.0}


def test_a_subnormal_mean_is_normalised_to_unit_length():
    """[1e-320, 1e-320] / its norm (a subnormal, few digits) was 1e-4 off unit length; [3e-320, 4e-320] too."""
    for mean, expected in (("[1e-320, 1e-320]", [math.sqrt(0.5)] * 2), ("[3e-320, 4e-320]", [0.6, 0.8])):
        normalised = load_case_text(MINIMAL + f"[initial]\nkind = 'vmf'\nmean = {mean}\nkappa = 2\n")["initial"]["mean"]
        assert all(abs(a - b) <= 1e-15 for a, b in zip(normalised, expected)), normalised


def test_mixture_weights_normalised_and_default_equal():
    text = MINIMAL + "[initial]\nkind = 'vmf_mixture'\nmeans = [[1, 0], [0, 2]]\nkappas = [1, 5]\n"
    assert load_case_text(text + "weights = [1, 3]\n")["initial"]["weights"] == [0.25, 0.75]
    initial = load_case_text(text)["initial"]
    assert initial["weights"] == [0.5, 0.5]
    assert initial["means"] == [[1.0, 0.0], [0.0, 1.0]]


def test_normalisation_is_a_fixed_point():
    """Renormalising a resolved case must not move a single bit (else the round trip drifts)."""
    rng = random.Random(7)
    for _ in range(200):
        k = rng.randint(1, 6)
        table = {"sphere": {"dim": 3}, "time": {"t_end": 1.0},
                 "initial": {"kind": "vmf_mixture",
                             "means": [[rng.uniform(-5, 5) for _ in range(3)] for _ in range(k)],
                             "kappas": [rng.uniform(0, 50) for _ in range(k)],
                             "weights": [rng.uniform(0, 1e-3) for _ in range(k)]}}
        assert_round_trip(case_from_dict(table))


# --- round trip ------------------------------------------------------------------------------


def test_round_trip_preserves_floats_bit_for_bit():
    text = SPHERE + """
[case]
description = "quotes \\" backslash \\\\ newline \\n tab \\t unicode é ∞ bell \\u0007"
[model]
beta = inf
eps = 1e-300
B = [[0.1, -0.0], [5e-324, 1.7976931348623157e308]]
V = [[0.30000000000000004, 2], [3, 1e22]]
[time]
t_end = 0.1
dt = 1e-7
max_steps = 12345678901
[diagnostics]
lyapunov_p = [0.1, 0.25, 0.4999999999999999]
w2 = false
[control]
loss = "bow"
target = [0.6, 0.8000000000000002]
learning_rate = 1e-3
tau = 0.30000000000000004
"""
    case = load_case_text(text)
    assert case["model"]["beta"] == math.inf and case["model"]["eps"] == 1e-300
    assert math.copysign(1, case["model"]["B"][0][1]) == -1
    assert case["control"]["learning_rate"] == 1e-3 and case["control"]["tau"] == 0.30000000000000004
    assert_round_trip(case)


@pytest.mark.parametrize("initial", [
    "kind = 'uniform'",
    "kind = 'vmf'\nmean = [1, 1, 1]\nkappa = 0.1",
    "kind = 'vmf_mixture'\nmeans = [[1, 2, 3], [0, 0, -1]]\nkappas = [0, 1e3]\nweights = [1, 2]",
])
def test_round_trip_of_each_initial_kind(initial):
    assert_round_trip(load_case_text(SPHERE3 + TIME + "[initial]\n" + initial + "\n"))


def test_round_trip_of_file_initial(tmp_path):
    (tmp_path / "run.nc").write_bytes(b"")
    (tmp_path / "c.toml").write_text(SPHERE + TIME + "[initial]\nkind = 'file'\npath = 'run.nc'\n")
    assert_round_trip(load_case(tmp_path / "c.toml"))


# --- initial file paths ----------------------------------------------------------------------


def test_initial_file_resolved_relative_to_case_file(tmp_path, monkeypatch):
    (tmp_path / "cases" / "data").mkdir(parents=True)
    (tmp_path / "cases" / "data" / "run.nc").write_bytes(b"")
    (tmp_path / "cases" / "data" / "other.nc").write_bytes(b"")
    (tmp_path / "cases" / "c.toml").write_text(
        MINIMAL + "[initial]\nkind = 'file'\npath = 'data/run.nc'\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    case = load_case("../cases/c.toml")
    assert case["initial"] == {"kind": "file", "path": str(tmp_path / "cases" / "data" / "run.nc"), "time": -1,
                               "sha256": EMPTY_SHA256}
    moved = case.with_overrides(["initial.path=data/other.nc", "initial.time=3"])
    assert moved["initial"] == {"kind": "file", "path": str(tmp_path / "cases" / "data" / "other.nc"), "time": 3,
                                "sha256": EMPTY_SHA256}


def test_stored_case_pins_its_initial_file_by_sha256(tmp_path):
    (tmp_path / "run.nc").write_bytes(b"abc")
    case = load_case_text(MINIMAL + "[initial]\nkind = 'file'\npath = 'run.nc'\n", base_dir=tmp_path)
    # SHA-256("abc"), the test vector of FIPS 180-4
    assert case["initial"]["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert load_case_text(case.text)["initial"] == case["initial"]
    (tmp_path / "run.nc").write_bytes(b"abd")
    with pytest.raises(CaseError, match=r"initial.sha256: .*run.nc' has SHA-256 a52d159f.*, not ba7816bf.*changed"):
        load_case_text(case.text)
    (tmp_path / "run.nc").write_bytes(b"abc")
    assert load_case_text(case.text)["initial"] == case["initial"]
    with pytest.raises(CaseError, match=r"initial.sha256: expected 64 hexadecimal digits, got 'abc'$"):
        case.with_overrides(["initial.sha256=abc"])
    with pytest.raises(CaseError, match=r"initial.sha256: not used when initial.kind = 'uniform'"):
        load_case_text(MINIMAL + "[initial]\nsha256 = '" + "0" * 64 + "'\n")


def test_initial_file_relative_to_base_dir_for_text(tmp_path):
    (tmp_path / "run.nc").write_bytes(b"")
    case = load_case_text(MINIMAL + "[initial]\nkind = 'file'\npath = 'run.nc'\n", base_dir=tmp_path)
    assert case["initial"]["path"] == str(tmp_path / "run.nc")


# --- overrides -------------------------------------------------------------------------------


def test_parse_override_parses_toml_or_keeps_bare_string():
    assert parse_override("model.beta=inf") == (("model", "beta"), math.inf)
    assert parse_override("model.B=[[1,0],[0,2]]") == (("model", "B"), [[1, 0], [0, 2]])
    assert parse_override("model.kernel=softmax") == (("model", "kernel"), "softmax")
    assert parse_override("model.kernel='softmax'") == (("model", "kernel"), "softmax")
    assert parse_override("time.dt = 0.5") == (("time", "dt"), 0.5)
    assert parse_override("sphere.lmax=64") == (("sphere", "lmax"), 64)
    assert parse_override("control.optimizer.lr=1e-3") == (("control", "optimizer", "lr"), 1e-3)


@pytest.mark.parametrize("override, path, value", [
    ("model.beta=inf", ("model", "beta"), math.inf),
    ("model.B=[[1,0],[0,2]]", ("model", "B"), [[1.0, 0.0], [0.0, 2.0]]),
    ("model.kernel=unnormalized", ("model", "kernel"), "unnormalized"),
    ("model.eps=0.25", ("model", "eps"), 0.25),
    ("sphere.lmax=64", ("sphere", "lmax"), 64),
    ("case.name=sweep-3", ("case", "name"), "sweep-3"),
])
def test_override_changes_exactly_the_named_key(override, path, value):
    base = load_case_text(MINIMAL + "[model]\nbeta = 2.0\n")
    expected = copy.deepcopy(base.data)
    expected[path[0]][path[1]] = value
    changed = base.with_overrides([override])
    assert changed.data == expected
    assert changed.source == base.source  # the user's text, before overrides
    assert base["model"]["beta"] == 2.0  # the original case is untouched


def test_overrides_re_resolve_from_the_user_table():
    """Defaults are recomputed, not frozen: dt replaces the default cfl, dim resizes defaults."""
    base = load_case_text(MINIMAL)
    assert base.with_overrides(["time.dt=0.01"])["time"] == {
        "t_end": 2.0, "dt": 0.01, "save_every": 0.1, "scheme": "auto"}
    assert base.with_overrides(["sphere.dim=3"])["model"]["W"] == [[0.0] * 3] * 3
    assert base.with_overrides(["time.t_end=4"])["time"]["save_every"] == 0.2


def test_an_override_of_dt_or_cfl_replaces_the_other_that_the_file_gives():
    """A case gives time.dt or time.cfl; `--set` of one replaces the file's other, and both set at once are
    refused as in a file."""
    with_cfl = load_case_text(MINIMAL + "cfl = 0.3\n")
    assert with_cfl.with_overrides(["time.dt=0.02"])["time"] == {
        "t_end": 2.0, "dt": 0.02, "save_every": 0.1, "scheme": "auto"}
    with_dt = load_case_text(MINIMAL + "dt = 0.01\n")
    assert with_dt.with_overrides(["time.cfl=0.25"])["time"] == {
        "t_end": 2.0, "cfl": 0.25, "save_every": 0.1, "scheme": "auto"}
    with pytest.raises(CaseError, match="time.dt: give either time.dt or time.cfl, not both"):
        with_dt.with_overrides(["time.cfl=0.25", "time.dt=0.02"])
    with pytest.raises(CaseError, match="time.dt: give either time.dt or time.cfl, not both"):
        load_case_text(MINIMAL + "dt = 0.01\ncfl = 0.3\n")


def test_an_override_of_a_kind_drops_the_keys_the_new_kind_does_not_use():
    """`--set initial.kind=...` on a case file of another kind: the file's keys that the new kind does not read are
    dropped (as time.cfl for time.dt), those it reads are kept, and a later override starts without them; a key the
    override itself sets, or one the file gives for a kind it did not replace, is still refused.  Likewise
    model.feed_forward and solver.method, the other keys that decide which keys are used."""
    vmf = load_case_text(MINIMAL + '[initial]\nkind = "vmf"\nmean = [0.0, 1.0]\nkappa = 4.0\n')
    assert vmf.with_overrides(['initial.kind="uniform"'])["initial"] == {"kind": "uniform"}
    gaussian = vmf.with_overrides(['initial.kind="projected_gaussian"', "initial.covariance=[[2.0, 0.0], [0.0, 2.0]]"])
    assert gaussian["initial"] == {"kind": "projected_gaussian", "mean": [0.0, 1.0],
                                   "covariance": [[2.0, 0.0], [0.0, 2.0]]}
    assert gaussian.with_overrides(["model.eps=0.3"])["initial"] == gaussian["initial"]
    assert reloaded(gaussian).data == gaussian.data
    with pytest.raises(CaseError, match=r"initial.kappa: not used when initial.kind = 'uniform'"):
        vmf.with_overrides(['initial.kind="uniform"', "initial.kappa=2.0"])
    with pytest.raises(CaseError, match=r"initial.kappa: not used when initial.kind = 'uniform'"):
        load_case_text(MINIMAL + '[initial]\nkind = "uniform"\nkappa = 4.0\n', ["model.eps=0.3"])
    linear = load_case_text(MINIMAL + "[model]\nW = [[0.0, 1.0], [-1.0, 0.0]]\n")
    mlp = linear.with_overrides(['model.feed_forward="mlp"', "model.hidden=3"])
    assert "W" not in mlp["model"] and len(mlp["model"]["W1"]) == 3  # W1 (hidden, d)
    with pytest.raises(CaseError, match=r"model.W: not used when model.feed_forward = 'mlp'"):
        load_case_text(MINIMAL + '[model]\nfeed_forward = "mlp"\nW = [[0.0, 1.0], [-1.0, 0.0]]\n')


def test_overrides_accumulate_and_load_case_applies_them(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(MINIMAL)
    case = load_case(path, ["model.beta=inf"]).with_overrides(["model.eps=0.5"])
    assert (case["model"]["beta"], case["model"]["eps"]) == (math.inf, 0.5)
    assert load_case_text(MINIMAL, ["particles.n=10"])["particles"]["save"] == 10


def test_override_may_create_a_missing_section():
    case = load_case_text(SPHERE, ["time.t_end=3"])
    assert case["time"]["t_end"] == 3.0


# --- errors ----------------------------------------------------------------------------------

BAD_CASES = [
    ("unknown key", MINIMAL + "[model]\nbta = 1\n", "model.bta", "did you mean 'beta'"),
    ("unknown section", MINIMAL + "[modle]\nbeta = 1\n", "modle", "did you mean 'model'"),
    ("unknown key of 100 000 characters", MINIMAL + "[model]\n" + "x" * 100_000 + " = 1\n",
     "unknown key 'model." + "x" * 74 + "...' (expected one of kernel,", ""),
    ("key of 100 000 characters above every section", "y" * 100_000 + " = 1\n" + MINIMAL,
     "key '" + "y" * 80 + "...' is outside any section", ""),
    ("key above every section", "beta = 1\n" + MINIMAL, "'beta' is outside any section", "under [model]"),
    ("unknown key above every section", "bta = 1\n" + MINIMAL, "'bta' is outside any section", "[section]"),
    ("key of two sections above every section", "seed = 1\n" + MINIMAL, "'seed' is outside any section",
     "under [particles] or [control]"),
    ("matrix of the wrong size", SPHERE3 + TIME + "[model]\nB = [[1, 0], [0, 1]]\n", "model.B", "3 x 3"),
    ("non-square matrix", SPHERE3 + TIME + "[model]\nB = [[1, 0, 0], [0, 1, 0]]\n", "model.B", "got 2 x 3"),
    ("ragged matrix", MINIMAL + "[model]\nV = [[1, 0], [0]]\n", "model.V", "rows of lengths 2, 1"),
    ("NaN entry", MINIMAL + "[model]\nV = [[1, 0], [nan, 1]]\n", "model.V", "entry [1][0]"),
    ("infinite entry", MINIMAL + "[model]\nW = [[1, inf], [0, 1]]\n", "model.W", "entry [0][1]"),
    ("negative eps", MINIMAL + "[model]\neps = -0.1\n", "model.eps", ">= 0, got -0.1"),
    ("negative beta", MINIMAL + "[model]\nbeta = -1\n", "model.beta", ">= 0"),
    ("negative dt", SPHERE + "[time]\nt_end = 1\ndt = -0.01\n", "time.dt", "> 0"),
    ("dt and cfl", SPHERE + "[time]\nt_end = 1\ndt = 0.01\ncfl = 0.5\n", "time.dt", "time.cfl"),
    ("threads beyond any machine", MINIMAL + "[solver]\nthreads = 2147483648\n", "solver.threads", "[1, 4096)"),
    ("missing t_end", SPHERE + "[time]\ndt = 0.01\n", "time.t_end", "missing"),
    ("infinite t_end", SPHERE + "[time]\nt_end = inf\n", "time.t_end", "finite"),
    ("beta inf with unnormalized kernel", MINIMAL + "[model]\nkernel = 'unnormalized'\nbeta = 'inf'\n",
     "model.beta", "softmax"),
    ("unknown kernel", MINIMAL + "[model]\nkernel = 'sofmax'\n", "model.kernel", "'softmax'"),
    ("unknown initial kind", MINIMAL + "[initial]\nkind = 'gaussian'\n", "initial.kind", "vmf_mixture"),
    ("key of another initial kind", MINIMAL + "[initial]\nkind = 'uniform'\nkappa = 1\n",
     "initial.kappa", "'vmf'"),
    ("malformed TOML", MINIMAL + "[model]\nbeta = = 1\n", "line 6", "malformed TOML"),
    ("vmf mean of the wrong length", SPHERE3 + TIME + "[initial]\nkind = 'vmf'\nmean = [1, 0]\nkappa = 1\n",
     "initial.mean", "length 3"),
    ("zero vmf mean", MINIMAL + "[initial]\nkind = 'vmf'\nmean = [0, 0]\nkappa = 1\n", "initial.mean", "nonzero"),
    ("vmf without kappa", MINIMAL + "[initial]\nkind = 'vmf'\nmean = [1, 0]\n", "initial.kappa", "missing"),
    ("mixture length mismatch",
     MINIMAL + "[initial]\nkind = 'vmf_mixture'\nmeans = [[1, 0], [0, 1]]\nkappas = [1, 2, 3]\n",
     "initial.kappas", "got 3"),
    ("negative mixture weight",
     MINIMAL + "[initial]\nkind = 'vmf_mixture'\nmeans = [[1, 0], [0, 1]]\nkappas = [1, 2]\nweights = [1, -1]\n",
     "initial.weights", "entry [1]"),
    ("zero mixture weights",
     MINIMAL + "[initial]\nkind = 'vmf_mixture'\nmeans = [[1, 0]]\nkappas = [1]\nweights = [0]\n",
     "initial.weights", "positive sum"),
    ("string for an integer", SPHERE + TIME.replace("[time]", "lmax = \"64\"\n[time]"), "sphere.lmax", "string"),
    ("real for an integer", SPHERE + TIME.replace("[time]", "lmax = 64.0\n[time]"), "sphere.lmax", "integer"),
    ("bool for a number", MINIMAL + "[model]\neps = true\n", "model.eps", "boolean"),
    ("date for a number", MINIMAL + "[model]\neps = 1979-05-27\n", "model.eps", "got the date 1979-05-27"),
    ("date-time for an integer", SPHERE + TIME.replace("[time]", "lmax = 1979-05-27T07:32:00\n[time]"),
     "sphere.lmax", "got the date-time 1979-05-27T07:32:00"),
    ("dimension 1", "[sphere]\ndim = 1\n" + TIME, "sphere.dim", "in [2, 2048), got 1"),
    ("missing initial file", MINIMAL + "[initial]\nkind = 'file'\npath = 'no/such/run.nc'\n",
     "initial.path", "No such file"),
    ("kernel_tol out of (0, 1)", MINIMAL + "[solver]\nkernel_tol = 1\n", "solver.kernel_tol", "(0, 1)"),
    ("unknown device", MINIMAL + "[solver]\ndevice = 'gpu'\n", "solver.device", "'cuda'"),
    ("more particles saved than run", MINIMAL + "[particles]\nn = 10\nsave = 20\n", "particles.save", "10"),
    ("non-positive Lyapunov exponent", MINIMAL + "[diagnostics]\nlyapunov_p = [0.25, 0]\n",
     "diagnostics.lyapunov_p", "entry [1]"),
    ("control not a table", "control = 3\n" + MINIMAL, "control", "table"),
    # integers that torch, numpy or NetCDF cannot take, or sizes that cannot be allocated
    ("seed beyond 64 bits", MINIMAL + "[particles]\nseed = 99999999999999999999\n", "particles.seed",
     "must be in [0, 2**63), got 99999999999999999999"),
    ("seed of 2**63", MINIMAL + "[particles]\nseed = 9223372036854775808\n", "particles.seed", "[0, 2**63)"),
    ("bow seed beyond torch's", TRAIN + "loss = 'bow'\nseed = 18446744073709551616\n",
     "control.seed", "[0, 2**63)"),
    ("absurd particle count", MINIMAL + "[particles]\nn = 1000000000000000000000000000000\n", "particles.n",
     "[2, 2**32)"),
    ("too few steps", SPHERE + "[time]\nt_end = 1\ndt = 0.1\nmax_steps = 9\n", "time.max_steps",
     "9 steps cannot reach t_end = 1 with time.dt = 0.1 (at least 10 steps)"),
    ("too few particle steps", SPHERE + "[time]\nt_end = 1\ndt = 0.1\nmax_steps = 10\n[solver]\nmethod = 'particles'"
     "\n[particles]\ndt = 0.05\n", "time.max_steps", "10 steps cannot reach t_end = 1 with particles.dt = 0.05"),
    ("endless particle step", SPHERE + "[time]\nt_end = 1\ndt = 0.1\n[solver]\nmethod = 'both'\n[particles]\n"
     "dt = 1e-300\n", "particles.dt", "more than 1e+12 steps per save"),
    ("t_end below its default saves", SPHERE + "[time]\nt_end = 5e-324\n", "time.t_end", "rounds to 0"),
    ("a single token", MINIMAL + "[particles]\nn = 1\n", "particles.n", "must be in [2, 2**32), got 1"),
    ("absurd dimension", "[sphere]\ndim = 100000\n" + TIME, "sphere.dim", "[2, 2048)"),
    ("absurd filter order", MINIMAL + "[solver]\nfilter_order = 1000000000000000000000000000000\n",
     "solver.filter_order", "64-bit integer, in [-2**63, 2**63)"),
    ("absurd candidate count", TRAIN + "loss = 'bow'\nK = 1000000000000000000000000000000\n",
     "control.K", "[2, 2**20)"),
    ("one candidate", TRAIN + "loss = 'bow'\nK = 1\n", "control.K", "must be in [2, 2**20), got 1"),
    ("absurd layer count", TRAIN + "layers = 1000000000000000000000000000000\n", "control.layers", "[1, 2**20)"),
    ("absurd checkpoint interval", TRAIN + "checkpoint_every = 1000000000000000000000000000000\n",
     "control.checkpoint_every", "64-bit integer"),
    # values that ran to a wrong or meaningless result
    ("repeated Lyapunov exponent", MINIMAL + "[diagnostics]\nlyapunov_p = [0.25, 0.1, 0.25]\n",
     "diagnostics.lyapunov_p", "entry [2] = 0.25 repeats entry [0]"),
    ("B = 0 at beta inf", MINIMAL + "[model]\nbeta = 'inf'\nB = [[0, 0], [0, -0.0]]\n", "model.B", "nonzero"),
    ("shtns on the circle", MINIMAL + "[solver]\nbackend = 'shtns'\n", "solver.backend", "sphere.dim = 3"),
    ("empty case name", "[case]\nname = ''\n" + MINIMAL, "case.name", "must not be empty"),
    ("blank case name", "[case]\nname = '   '\n" + MINIMAL, "case.name", "must not be empty or blank"),
    ("case name too long", "[case]\nname = '" + "x" * 211 + "'\n" + MINIMAL, "case.name", "at most 210 bytes"),
    ("case name with a path", "[case]\nname = 'sub/dir/x'\n" + MINIMAL, "case.name", "without '/'"),
    ("hidden case name", "[case]\nname = '.nc'\n" + MINIMAL, "case.name", "must not start with '.'"),
    ("case name with NUL", '[case]\nname = "a\\u0000b"\n' + MINIMAL, "case.name", "'\\x00'"),
    ("case name with a newline", '[case]\nname = "a\\nb"\n' + MINIMAL, "case.name", "control characters"),
    ("eps too stiff for a step", MINIMAL + "[model]\neps = 1e300\n", "model.eps", "at most 1e+15"),
    ("chunk neither auto nor a count", MINIMAL + "[solver]\nchunk = 'big'\n", "solver.chunk",
     "expected \"auto\" or an integer >= 1, got"),
    ("chunk of no rows", MINIMAL + "[solver]\nchunk = 0\n", "solver.chunk", "got 0"),
    # the model beyond the seeds (heads, per-layer matrices, a two-layer feed-forward, trained groups)
    ("W beside an mlp", MINIMAL + "[model]\nfeed_forward = 'mlp'\nW = [[0, 0], [0, 0]]\n", "model.W",
     "not used when model.feed_forward = 'mlp'"),
    ("hidden width of a linear map", MINIMAL + "[model]\nhidden = 4\n", "model.hidden", "mlp"),
    ("unknown activation", MINIMAL + "[model]\nfeed_forward = 'mlp'\nactivation = 'swish'\n",
     "model.activation", "'softplus', got the string 'swish'"),
    ("bias of the wrong width", MINIMAL + "[model]\nfeed_forward = 'mlp'\nhidden = 3\nb = [0, 0]\n", "model.b",
     "length 3 (model.hidden)"),
    ("W1 of the wrong shape", MINIMAL + "[model]\nfeed_forward = 'mlp'\nhidden = 3\nW1 = [[1, 0], [0, 1]]\n",
     "model.W1", "3 x 2"),
    ("per-layer lists of two lengths", MINIMAL + "[model]\nB = [[[1, 0], [0, 1]], [[1, 0], [0, 1]]]\n"
     "V = [[[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]]]\n", "model", "model.B: 2, model.V: 3"),
    ("per-layer list against control.layers", TRAIN + "layers = 4\n[model]\n"
     "V = [[[1, 0], [0, 1]], [[1, 0], [0, 1]]]\n", "model.V", "control.layers = 4"),
    ("unknown key of a head", MINIMAL + "[model]\nextra_heads = [{Q = 1}]\n", "model.extra_heads",
     "entry [0]: unknown key 'Q'"),
    ("second head at beta inf, unnormalized", MINIMAL + "[model]\n"
     "extra_heads = [{kernel = 'unnormalized', beta = 'inf'}]\n", "model.extra_heads[0].beta", "softmax"),
    ("zero B on one layer at beta inf", MINIMAL + "[model]\nbeta = 'inf'\n"
     "B = [[[1, 0], [0, 1]], [[0, 0], [0, 0]]]\n", "model.B", "nonzero (on every layer)"),
    ("unknown trained group", TRAIN + "train = ['W', 'A']\n", "control.train", "entry [1]"),
    ("repeated trained group", TRAIN + "train = ['B', 'B']\n", "control.train", "repeats"),
    ("regularisation of an untrained group", TRAIN + "lambda_reg = {V = 1}\n", "control.lambda_reg",
     "'V' is not a trained group"),
]


@pytest.mark.parametrize("text, key, detail", [case[1:] for case in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_input_is_one_line_naming_the_key(text, key, detail):
    with pytest.raises(CaseError) as raised:
        load_case_text(text)
    message = str(raised.value)
    assert "\n" not in message and len(message) < 1000
    assert key in message and detail in message
    assert raised.value.exit_status == 2


@pytest.mark.parametrize("overrides, key", [
    (["model.bta=1"], "model.bta"),
    (["modle.beta=1"], "modle"),
    (["model.B=[[1,0,0],[0,1,0],[0,0,1]]"], "model.B"),
    (["model.kernel=unnormalized", "model.beta=inf"], "model.beta"),
    (["time.dt=0.1", "time.cfl=0.2"], "time.dt"),
    (["model.beta"], "model.beta"),
    (["beta=1"], "beta=1"),
    (["model.B.x=1"], "model.B"),
])
def test_bad_override_is_one_line_naming_the_key(overrides, key):
    with pytest.raises(CaseError) as raised:
        load_case_text(MINIMAL + "[model]\nB = [[1, 0], [0, 1]]\n", overrides)
    assert "\n" not in str(raised.value) and key in str(raised.value)


def test_the_model_beyond_the_seeds_resolves_to_a_fixed_point_and_seeds_its_first_weights():
    text = MINIMAL + ("[model]\nfeed_forward = 'mlp'\nhidden = 3\nffn_seed = 5\n"
                      "B = [[[1, 0], [0, 0.5]], [[0.5, 0], [0, 1]]]\n"
                      "extra_heads = [{kernel = 'unnormalized', beta = 2, V = [[0, 1], [-1, 0]]}]\n")
    case = load_case_text(text)
    assert load_case_text(case.text).data == case.data
    head = case["model"]["extra_heads"][0]
    assert head["B"] == [[1.0, 0.0], [0.0, 1.0]] and head["kernel"] == "unnormalized" and head["beta"] == 2.0
    assert case["model"]["b"] == [0.0] * 3 and case["model"]["W2"] == [[0.0] * 3] * 2
    again = load_case_text(text.replace("ffn_seed = 5", "ffn_seed = 6"))
    assert len(case["model"]["W1"]) == 3 and case["model"]["W1"] != again["model"]["W1"]
    assert load_case_text(text)["model"]["W1"] == case["model"]["W1"]


def test_errors_from_a_file_are_prefixed_by_its_path(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(MINIMAL + "[model]\neps = -0.1\n")
    with pytest.raises(CaseError, match=r"^.*bad\.toml: model\.eps: must be >= 0, got -0\.1$"):
        load_case(path)


def test_malformed_toml_names_file_and_line(tmp_path):
    path = tmp_path / "case.toml"
    path.write_text("[sphere]\ndim = 2\n\nbeta = \n")
    with pytest.raises(CaseError, match=r"case\.toml: malformed TOML at line 4"):
        load_case(path)


def test_malformed_toml_quotes_its_line_where_tomllib_names_no_key(tmp_path):
    """A key given twice: tomllib says "Cannot overwrite a value" and the column, not which key; the message quotes
    the line (its newlines counted as tomllib counts them: a line separator U+2028 in a comment is no line end)."""
    path = tmp_path / "case.toml"
    path.write_text("[sphere]\ndim = 2 # \u2028\n[model]\neps = 0.1\n  eps = 0.2\r\n", encoding="utf-8")
    with pytest.raises(CaseError, match=r"case\.toml: malformed TOML at line 5, column 12 \(`eps = 0\.2`\): Cannot "
                                        r"overwrite a value$"):
        load_case(path)


def test_missing_case_file(tmp_path):
    with pytest.raises(CaseError, match=r"^cannot read case file '.*x\.toml': No such file or directory$"):
        load_case(tmp_path / "x.toml")


def test_integer_limits_admit_the_values_below_them():
    text = (SPHERE + "[time]\nt_end = 1\ndt = 0.1\n[particles]\nseed = 9223372036854775807\nn = 4294967295\n"
            "[control]\nloss = 'bow'\nseed = 9223372036854775807\nlayers = 1048575\nK = 1048575\n")
    case = load_case_text(text)
    assert case["particles"]["seed"] == case["control"]["seed"] == 2 ** 63 - 1
    assert (case["particles"]["n"], case["control"]["layers"], case["control"]["K"]) == (2 ** 32 - 1, 2 ** 20 - 1,
                                                                                          2 ** 20 - 1)
    assert_round_trip(case)
    assert load_case_text(MINIMAL + "[solver]\nfilter_order = 9223372036854775807\n")["solver"]["filter_order"] \
        == 2 ** 63 - 1


def test_singular_B_at_beta_inf_and_shtns_on_the_sphere_are_allowed():
    """B^T x = 0 on a null set only (here the line x_1 = 0) leaves m defined almost everywhere."""
    case = load_case_text(MINIMAL + "[model]\nbeta = 'inf'\nB = [[1, 0], [0, 0]]\n")
    assert case["model"]["B"] == [[1.0, 0.0], [0.0, 0.0]]
    assert load_case_text(SPHERE3 + TIME + "[solver]\nbackend = 'shtns'\n")["solver"]["backend"] == "shtns"
    assert load_case_text(MINIMAL + "[model]\nbeta = 2\nB = [[0, 0], [0, 0]]\n")["model"]["beta"] == 2.0


def test_distinct_lyapunov_exponents_keep_their_order():
    case = load_case_text(MINIMAL + "[diagnostics]\nlyapunov_p = [0.4, 0.1, 0.25]\n")
    assert case["diagnostics"]["lyapunov_p"] == [0.4, 0.1, 0.25]


@pytest.mark.parametrize("file, name", [
    ("kuramoto-s1.toml", "kuramoto-s1"), ("a.b.toml", "a.b"), (".hidden.toml", "hidden"), (".toml", "toml"),
    ("..toml", "case"), ("...toml", "case"), ("-.toml", "-"), ("é" * 125 + ".toml", "é" * 105),
    ("a\nb.toml", "a_b"),
])
def test_default_case_name_is_a_valid_file_name(tmp_path, file, name):
    """The file stem is made valid (leading dots dropped, else "case"), not refused."""
    (tmp_path / file).write_text(MINIMAL)
    case = load_case(tmp_path / file)
    assert case.name == name
    assert_round_trip(case)


def test_eps_bound_is_on_the_stiffness_of_the_longest_step():
    """dt eps lmax (lmax + 1) <= 1e15 with dt <= min(t_end, save_every, time.dt): lmax 32, save_every 0.1."""
    assert load_case_text(MINIMAL + "[model]\neps = 9e12\n")["model"]["eps"] == 9e12
    with pytest.raises(CaseError, match=r"model\.eps: 1e\+13 .* up to 1\.06e\+15"):
        load_case_text(MINIMAL + "[model]\neps = 1e13\n")
    assert load_case_text(MINIMAL + "[model]\neps = 1e13\n", ["time.dt=0.01"])["model"]["eps"] == 1e13
    with pytest.raises(CaseError, match=r"model\.eps"):
        load_case_text(MINIMAL + "[model]\neps = 1e300\n", ["time.dt=1e-12"])


# --- documentation ---------------------------------------------------------------------------


def test_every_resolved_key_is_documented(tmp_path):
    (tmp_path / "run.nc").write_bytes(b"")
    initials = ["kind = 'vmf'\nmean = [1, 0]\nkappa = 1", "kind = 'file'\npath = 'run.nc'",
                "kind = 'vmf_mixture'\nmeans = [[1, 0]]\nkappas = [1]"]
    texts = [MINIMAL, SPHERE + "[time]\nt_end = 1\ndt = 0.1\nmax_steps = 10\n[particles]\ndt = 0.05\n"]
    texts += [MINIMAL + "[initial]\n" + initial + "\n" for initial in initials]
    keys = {f"{section}.{key}" for text in texts
            for section, table in load_case_text(text, base_dir=tmp_path).data.items() for key in table}
    assert len(keys) == 44  # every key of every section, each initial kind included
    assert [key for key in keys if key not in case_schema.__doc__] == []


@pytest.mark.parametrize("path", SHIPPED_CASES, ids=lambda path: path.stem)
def test_shipped_cases_are_valid_and_named_after_their_files(path):
    """Each file of cases/ passes validation, round-trips, and writes <stem>.nc by default (case.name)."""
    case = load_case(path)
    assert case["case"]["name"] == path.stem
    assert case["case"]["description"].strip()
    assert_round_trip(case)



def test_solver_threads_follow_the_problem_size_and_are_restored_after_a_run():
    import torch

    import spherepde
    from spherepde.base.threads import ONE_THREAD_LMAX, ONE_THREAD_PARTICLES, run_threads

    default = torch.get_num_threads()
    small = make_case(dim=2, lmax=16, time={"t_end": 0.1, "dt": 0.1, "save_every": 0.1})
    assert run_threads(small) == 1
    assert run_threads(small.with_overrides([f"sphere.lmax={ONE_THREAD_LMAX + 1}"])) == default
    assert run_threads(small.with_overrides(['solver.method="particles"', "sphere.lmax=512"])) == 1
    assert run_threads(small.with_overrides(['solver.method="both"',
                                             f"particles.n={ONE_THREAD_PARTICLES + 10}"])) == default
    assert run_threads(small.with_overrides(["solver.threads=3"])) == 3
    torch.set_num_threads(2)
    try:
        spherepde.run(small, progress=False)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(default)
    with pytest.raises(CaseError, match=r"solver.threads"):
        small.with_overrides(["solver.threads=0"])


def test_solver_threads_also_bound_numpys_blas_and_are_restored():
    """The particle step's products run in numpy's BLAS on the CPU: a run's thread count holds there too."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from spherepde.base.threads import threads_for

    def blas_threads():
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    case = make_case(dim=2, lmax=16, solver={"method": "particles", "threads": 1})
    with threadpool_limits(limits=2, user_api="blas"):
        outside = blas_threads()
        with threads_for(case):
            assert blas_threads() == {1}
        assert blas_threads() == outside


def test_a_sweep_workers_share_of_the_cores_bounds_the_case_threads():
    """threads_for(case, at_most=k) (a sweep worker with k cores of its own): "auto" takes the case's threads where
    fewer, else k (a small problem keeps its one thread however many cores the worker has); a number is taken as it
    is, as the serial run takes it (a member whose threads differed from its serial run's differed in round-off:
    particles by 5.6e-16 at n = 2000 with solver.threads = 2 on a worker of one core)."""
    import torch

    from spherepde.base.threads import ONE_THREAD_LMAX, threads_for

    small = make_case(dim=2, lmax=16)
    large = small.with_overrides([f"sphere.lmax={ONE_THREAD_LMAX + 1}"])
    for case, at_most, expected in ((small, 4, 1), (large, 1, 1), (small.with_overrides(["solver.threads=3"]), 2, 3),
                                    (small.with_overrides(["solver.threads=3"]), 4, 3)):
        with threads_for(case, at_most=at_most):
            assert torch.get_num_threads() == expected


# A step's temporaries: 12 arrays of 2, 4 and 6 MB (48 MB, 12,288 pages, a round) made and freed together, as a
# step's stages make and free theirs; faults() counts the minor page faults of ten rounds after eight in which the
# heap settles (its first rounds fault their pages in).  Source text, so that a subprocess or a Dask worker runs it.
STAGE_FAULTS = """
def faults():
    import resource

    import torch

    def stage():
        kept = [torch.ones(2 ** 18 * (1 + k % 3), dtype=torch.float64) for k in range(12)]
        del kept
    for _ in range(8):
        stage()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        stage()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""
FAULTS_SCRIPT = ("from spherepde.base.memory import keep_freed_memory\nprint(keep_freed_memory())\n" + STAGE_FAULTS
                 + "print(faults())\n")


GARBAGE_SCRIPT = """
import gc
import warnings

import spherepde
from solvers.forward_problem import ForwardProblem

warnings.simplefilter("ignore")
case = spherepde.load_case("cases/quickstart.toml")
before = len(gc.get_objects())
ForwardProblem(case)
print(before, len(gc.get_objects()), gc.get_freeze_count())
"""


def test_a_run_exempts_its_setup_from_full_garbage_collections():
    """spherepde.base.garbage: once a problem is set up, a full collection has a small fraction of the objects to
    scan (the modules' objects and the setup's are frozen: 116 ms a full collection with them)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    before, after, frozen = map(int, subprocess.run([sys.executable, "-c", GARBAGE_SCRIPT], cwd=root, check=True,
                                                    capture_output=True, text=True).stdout.split())
    assert before > 100_000 and frozen >= before and after < 0.01 * frozen


def test_dir_of_the_package_lists_its_lazy_names_without_importing_them():
    """dir(spherepde), what a notebook completes `spherepde.` from, left out Case, load_case and load_case_text (the
    names its __getattr__ imports when first asked for); it lists them now, still without importing numpy."""
    listed = subprocess.run([sys.executable, "-c", "import sys, spherepde; names = dir(spherepde); "
                             "print(sorted(set(spherepde.__all__) - set(names)), 'numpy' in sys.modules)"],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), check=True,
                            capture_output=True, text=True).stdout.split()
    assert listed == ["[]", "False"]


THAWED_SCRIPT = """
import gc
import weakref

import spherepde

class Figure:  # a notebook's object in a reference cycle (a matplotlib figure is full of them)
    pass

figure = Figure()
figure.self = figure
alive = weakref.ref(figure)
spherepde.run(spherepde.load_case("cases/kuramoto-s1.toml", ["time.t_end=0.1", "time.save_every=0.1"]), progress=False)
del figure
gc.collect()
print(alive() is None, gc.get_freeze_count())
"""


def test_the_objects_a_run_froze_are_collected_again_after_it():
    """spherepde.base.garbage.thawed_after: a notebook's objects that exist when spherepde.run starts were frozen by
    its setup, and a cycle among them was never collected after it (the figure below stayed alive, the freeze count
    was 228,000); the run gives them back to the collector when it ends."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    freed, frozen = subprocess.run([sys.executable, "-W", "ignore", "-c", THAWED_SCRIPT], cwd=root, check=True,
                                   capture_output=True, text=True).stdout.split()
    assert freed == "True" and frozen == "0"


@pytest.mark.skipif(not glibc(), reason="glibc's malloc only")
def test_freed_temporaries_are_kept_for_the_next_stage_not_faulted_back():
    """spherepde.base.memory: with glibc's thresholds set, ten rounds of 48 MB of temporaries (12,288 pages each)
    fault in at most 1% of their pages (glibc's defaults give them back to the kernel and fault nearly all of them
    in again); a MALLOC_*_ variable of the environment is left in charge."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    environment.pop("GLIBC_TUNABLES", None)
    kept = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], env=environment, capture_output=True, text=True,
                          check=True).stdout.split()
    assert kept[0] == "True" and int(kept[1]) <= 0.01 * 10 * 12288
    left = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT], env=environment | {"MALLOC_TOP_PAD_": "0"},
                          capture_output=True, text=True, check=True).stdout.split()
    assert left[0] == "False"


def test_a_stored_training_case_reruns_with_the_other_solver_and_a_key_set_where_it_does_not_apply_is_refused():
    """A resolved case writes every key, the Eulerian adjoint's and the particle noise's among them: switched to
    the other solver.method they hold their defaults and stay out of the way (the round trip gives the case back),
    while one set to another value still names itself."""
    case = load_case_text(TRAIN + "loss = 'align'\ntarget = [0.0, 1.0]\n")
    assert case["control"]["gradient"] == "discrete" and "noise" not in case["control"]
    particles = load_case_text(case.text, ["solver.method='particles'"])
    assert "gradient" not in particles["control"] and particles["control"]["noise"] == "common"
    assert load_case_text(particles.text, ["solver.method='eulerian'"]).data == case.data
    for key, value in (("control.gradient", "'continuous'"), ("control.checkpoint_every", "5"),
                       ("control.save_adjoint", "true")):
        with pytest.raises(CaseError, match=rf"{key}: not used when solver.method = 'particles'"):
            load_case_text(case.text, [f"{key}={value}", "solver.method='particles'"])
    with pytest.raises(CaseError, match="control.noise: not used when solver.method is not 'particles'"):
        load_case_text(particles.text, ["control.noise='fresh'", "solver.method='eulerian'"])


@pytest.mark.parametrize("key, value", [("control.save_adjoint", "0"), ("control.checkpoint_every", "false"),
                                        ("control.checkpoint_every", "0.0")])
def test_a_key_of_the_other_solver_is_let_through_only_as_its_default_of_the_same_type(key, value):
    """Types are strict where a key of the other solver.method is let through as its default: 0 == False in Python,
    so control.save_adjoint = 0 passed a particle training silently, where the Eulerian one refuses it."""
    with pytest.raises(CaseError, match=rf"{key}: not used when solver.method = 'particles'"):
        load_case_text(TRAIN + "loss = 'align'\n", [f"{key}={value}", "solver.method='particles'"])


def test_a_trained_group_named_twice_is_refused_for_its_own_reason():
    """control.train's entries are no coordinate values (lyapunov_p's are): the message gave lyapunov_p's reason."""
    with pytest.raises(CaseError, match=r"control.train: entry \[1\] = 'W' repeats entry \[0\] \(a group is "
                                        r"trained once: name it once\)$"):
        load_case_text(TRAIN + "train = ['W', 'W']\n")


@pytest.mark.parametrize("path", SHIPPED_CASES, ids=lambda path: path.stem)
def test_a_case_unedited_is_its_own_checked_case(path):
    """Case.checked() gives back the very case (no second resolution) until its data is edited in place; then
    it is the loader's case with that edit as an override."""
    case = load_case(path)
    assert not case.edited() and case.checked() is case
    case["model"]["beta"] = 0.75
    assert case.edited() and case.checked().data == load_case(path, ["model.beta=0.75"]).data


def test_the_text_of_a_case_edited_in_place_is_the_case_it_runs():
    """Case.text wrote an in-place edit as the table stood: model.ffn_seed = 5 beside the W1 drawn from the old
    seed (a text that reloads as a case with another W1 than the run's) and a bad value unchecked; it is now the
    checked case's text."""
    case = load_case_text(MINIMAL + '[model]\nfeed_forward = "mlp"\nhidden = 4\n')
    case["model"]["ffn_seed"] = 5
    assert load_case_text(case.text).data == case.checked().data
    assert load_case_text(case.text)["model"]["W1"] == load_case_text(MINIMAL + '[model]\nfeed_forward = "mlp"\n'
                                                                       'hidden = 4\nffn_seed = 5\n')["model"]["W1"]
    case["model"]["beta"] = -2.0
    with pytest.raises(CaseError, match=r"^<string>: model.beta: "):
        assert not case.text


def test_data_edited_in_place_runs_as_resolved_or_is_refused():
    """A notebook's edit of case.data: a bad value is refused by spherepde.run and by a sweep's members, one line
    naming the key (it ran, and stored a case no loader accepts); a good one is honoured by the run and carried
    by with_overrides (a sweep dropped it)."""
    import spherepde
    from spherepde.api.ensemble import run_batch

    case = make_case(dim=2, lmax=32, time={"t_end": 0.2, "dt": 0.1, "save_every": 0.1})
    for section, key, value, said in (("model", "kernel", "foo", "model.kernel: expected one of"),
                                      ("model", "beta", -2.0, "model.beta: "), ("time", "dt", -0.1, "time.dt: "),
                                      ("time", "t_end", -1.0, "time.t_end: "),
                                      ("model", "V", [[1.0, 0.0], [0.0]], "model.V: ")):
        edited = copy.deepcopy(case)
        edited[section][key] = value
        with pytest.raises(CaseError, match=f"^test: {said}") as refused:
            spherepde.run(edited)
        assert len(str(refused.value).splitlines()) == 1
        assert isinstance(run_batch([case, edited])[1], CaseError)
    edited = copy.deepcopy(case)
    edited["model"]["V"] = [[3.0, 0.0], [0.0, 3.0]]
    edited["time"]["t_end"] = 0.3
    stored = load_case_text(spherepde.run(edited).attrs["case"])
    assert stored["model"]["V"] == [[3.0, 0.0], [0.0, 3.0]] and stored["time"]["t_end"] == 0.3
    member = edited.with_overrides(["model.eps=0.2"])
    assert (member["model"]["V"], member["time"]["t_end"], member["model"]["eps"]) == ([[3.0, 0.0], [0.0, 3.0]], 0.3,
                                                                                       0.2)


def test_edits_in_place_are_overrides_whose_defaults_follow():
    """An edit of case.data acts as the --set of that key on the case's table (a review found edits resolved from
    the resolved data, whose derived defaults went stale): time.dt replaces the default cfl, particles.n sets the
    save count's default, model.ffn_seed draws W1 again; an unrelated edit leaves with_overrides' defaults as they
    were (t_end 4 saves every 0.2, as unedited); a deleted key takes its default again."""
    text = MINIMAL.replace("t_end = 2.0", "t_end = 1.0") + '[model]\nfeed_forward = "mlp"\nhidden = 4\n'
    case = load_case_text(text)

    def edited(section, key, value):
        copied = copy.deepcopy(case)
        copied[section][key] = value
        return copied

    for (section, key, value), override in ((("time", "dt", 0.01), "time.dt=0.01"),
                                            (("particles", "n", 100), "particles.n=100"),
                                            (("model", "ffn_seed", 5), "model.ffn_seed=5"),
                                            (("model", "hidden", 8), "model.hidden=8")):
        assert edited(section, key, value).checked().data == load_case_text(text, [override]).data
    assert edited("model", "ffn_seed", 5).checked()["model"]["W1"] != case["model"]["W1"]
    described = edited("case", "description", "x")
    assert described.with_overrides(["time.t_end=4.0"]).data == load_case_text(
        text, ["case.description='x'", "time.t_end=4.0"]).data
    assert described.with_overrides(["time.t_end=4.0"])["time"]["save_every"] == 0.2
    # an override after an edit replaces it as a second --set would (time.cfl after an edited time.dt was refused)
    assert edited("time", "dt", 0.01).with_overrides(["time.cfl=0.3"]).data == load_case_text(
        text, ["time.dt=0.01"]).with_overrides(["time.cfl=0.3"]).data == load_case_text(text, ["time.cfl=0.3"]).data
    pinned = load_case_text(text, ["time.save_every=0.5"])
    del pinned["time"]["save_every"]
    assert pinned.checked()["time"]["save_every"] == case["time"]["save_every"] == 0.05


def test_an_edit_is_told_by_its_type_and_its_key_as_written():
    """A property round (a helper: every key of every shipped case, edited in place, against --set) found edits that
    changed only a value's type taken for no edit (lmax = 8.0 ran into a torch TypeError; np.eye(2) equal to B failed
    writing the case), a key with a space taken for the key without it, and a sweep's seeds derived from an edited
    particles.seed unchecked: each is now what --set of it gives."""
    import numpy as np
    import xarray as xr

    from spherepde.api.sweep import plan

    case = load_case_text(MINIMAL, ["sphere.lmax=8"], origin="edits")
    for section, key, value, said in (("sphere", "lmax", 8.0, "sphere.lmax: expected an integer, got 8.0"),
                                      ("particles", "n", np.float64(100), "particles.n: expected an integer"),
                                      ("diagnostics", "w2", 1, "diagnostics.w2: expected true or false, got 1"),
                                      ("model", " eps", 0.3, "unknown key 'model. eps' (did you mean 'eps'?)")):
        edited = copy.deepcopy(case)
        edited[section][key] = value
        with pytest.raises(CaseError, match=re.escape(f"edits: {said}")):
            edited.checked()
    same = copy.deepcopy(case)
    same["model"]["B"] = np.eye(2)
    same["model"]["V"] = xr.DataArray(2 * np.eye(2))
    assert same.edited()
    assert same.checked().data == load_case_text(MINIMAL, ["sphere.lmax=8", "model.V=[[2, 0], [0, 2]]"]).data
    seeded = copy.deepcopy(case)
    seeded["particles"]["seed"] = -1
    with pytest.raises(CaseError, match=re.escape("particles.seed: must be in [0, 2**63), got -1")):
        plan(seeded, ["model.eps=0.1,0.2"], "unused", seeds=2)


def test_numpy_values_and_bad_python_arguments_of_the_loaders():
    """numpy arrays and scalars in a table read as the lists and numbers TOML gives (np.eye(2) was refused as
    "expected a 2 x 2 matrix"); arguments of the wrong kind are one-line CaseErrors (they were TypeErrors and
    AttributeErrors from deep inside)."""
    import numpy as np

    table = {"sphere": {"dim": np.int64(2)}, "time": {"t_end": np.float32(2.0)}, "model": {"V": 2 * np.eye(2)}}
    assert case_from_dict(table).data == load_case_text(MINIMAL + "[model]\nV = [[2, 0], [0, 2]]\n").data
    for call, said in ((lambda: load_case_text(None), "a case's text is a string of TOML, got NoneType"),
                       (lambda: case_from_dict([1, 2]), "a case is a table of [sections], got list"),
                       (lambda: case_from_dict({"sphere": {"dim": 2, 3: 4}}), "table keys are strings, got 3"),
                       (lambda: load_case_text(MINIMAL, [("model.eps", 0.4)]), "override ('model.eps', 0.4): expected "
                                                                                 "a string"),
                       (lambda: load_case_text(MINIMAL, 3), "overrides: expected a list of strings")):
        with pytest.raises(CaseError, match=re.escape(said)) as refused:
            call()
        assert len(str(refused.value).splitlines()) == 1
    assert load_case_text(MINIMAL, None).data == load_case_text(MINIMAL).data
