"""Parameter sweeps on Dask: the members, run in batches, equal serial runs to round-off, the combined
Dataset has a `member` dimension, seeds are derived, and an existing scheduler works too."""

import contextlib
import json
import os
import re
import shutil
import subprocess
import time

import numpy as np
import pytest
import xarray as xr

pytest.importorskip("distributed", reason="the sweep extra (Dask) is not installed: pip install 'spherepde[sweep]'")

from test_case import STAGE_FAULTS
from test_cli import SMALL_S1, write_case
from test_ensembles import same_values

import spherepde
from spherepde.api import sweep as sweep_module
from spherepde.api.sweep import combine, derived_seeds, parse_param, plan, run_batch, run_sweep
from spherepde.base.errors import CaseError
from spherepde.cli import main

EPS, BETA = [0.05, 0.1, 0.2, 0.4], [1.0, 3.0]
# A member's variables against its serial run's, relative to their scale (ensembles issue, criterion 1): a batch's
# matrix products of M rows round otherwise than a serial run's product of one row (1e-16 on this case's matrix path).
ROUND_OFF = 1e-13
PARAMS = ["model.eps=" + ",".join(map(str, EPS)), "model.beta=" + ",".join(map(str, BETA))]


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """8 members on a 2-worker LocalCluster, through the command line."""
    folder = tmp_path_factory.mktemp("sweep")
    case = folder / "case.toml"
    case.write_text(SMALL_S1)
    output = folder / "out"
    args = ["sweep", str(case), "--param", PARAMS[0], "--param", PARAMS[1], "--workers", "2", "-o", str(output)]
    assert main(args) == 0
    return case, output


def test_sweep_members_equal_serial_runs(local_sweep):
    case_path, output = local_sweep
    case = spherepde.load_case(case_path)
    with xr.open_dataset(output / "sweep.nc") as combined:
        assert combined.sizes["member"] == 8
        assert list(combined["model_eps"].values) == [e for e in EPS for _ in BETA]
        assert list(combined["model_beta"].values) == BETA * len(EPS)
        for index, (eps, beta) in enumerate((e, b) for e in EPS for b in BETA):
            serial = spherepde.run(case.with_overrides([f"model.eps={eps}", f"model.beta={beta}"]), progress=False)
            with xr.open_dataset(output / f"member-{index:03d}.nc") as member:
                for name in serial.data_vars:
                    assert same_values(member[name].values, serial[name].values, ROUND_OFF), (index, name)
                assert member.attrs["case"] == serial.attrs["case"] == combined["member_case"].values[index]
                assert member.attrs["batch_members"] == 4  # two batches of 4 (spherepde.api.ensemble), one per worker
            assert same_values(combined["density"].isel(member=index).values, serial["density"].values, ROUND_OFF)
            assert combined["member_status"].values[index] == "completed"
        assert combined["cell_area"].dims == ("theta",)
        assert "identical results" not in combined.attrs["notes"]
        grid = sweep_module.by_parameters(combined)
        for index, (eps, beta) in enumerate((e, b) for e in EPS for b in BETA):
            assert np.array_equal(grid["order_parameter"].sel(model_eps=eps, model_beta=beta).values,
                                  combined["order_parameter"].isel(member=index).values)


def test_by_parameters_of_a_sweep_of_one_key(tmp_path):
    """One swept key (the README's `--param model.eps=0.2,0.4`): its values become the dimension."""
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    output = tmp_path / "out"
    assert main(["sweep", str(case), "--param", "model.eps=0.2,0.4", "--workers", "1", "-o", str(output),
                 "--set", "time.t_end=0.4"]) == 0
    with xr.open_dataset(output / "sweep.nc") as combined:
        # CF history: the whole command, --set too (it left out all but the params); a member names its sweep
        assert re.fullmatch(rf"\S+: spherepde \S+ sweep {re.escape(str(case))} -o {re.escape(str(output))} --set "
                            r"time.t_end=0.4 --param model.eps=0.2,0.4 --workers 1",
                            combined.attrs["history"]), combined.attrs["history"]  # one command: no "run sweep"
        with xr.open_dataset(output / "member-000.nc") as member:
            assert member.attrs["history"].endswith(f"run (member 0 of the sweep in {output})")
        grid = sweep_module.by_parameters(combined)
        assert grid["order_parameter"].dims[0] == "model_eps"
        for index, eps in enumerate([0.2, 0.4]):
            assert np.array_equal(grid["order_parameter"].sel(model_eps=eps).values,
                                  combined["order_parameter"].isel(member=index).values)


def test_a_sweep_with_a_failed_member_says_so_in_its_status(local_sweep, tmp_path, capsys):
    # the members' statuses differ, and the combined file dropped the attribute (info showed "status None")
    with xr.open_dataset(local_sweep[1] / "sweep.nc") as combined:
        assert combined.attrs["status"] == "completed"
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1.replace('kernel = "softmax"\nbeta = 2.0', 'kernel = "unnormalized"\nbeta = 1.0\n'
                                     'V = [[5.0, 0.0], [0.0, 5.0]]').replace("eps = 0.1", "eps = 0.0"))
    output = tmp_path / "out"
    assert main(["sweep", str(case), "--param", "time.dt=0.01,0.2", "--workers", "1", "-o", str(output)]) == 3
    with xr.open_dataset(output / "sweep.nc") as combined:
        assert combined.attrs["status"] == "failed: 1 of 2 sweep members (member_status)"
        assert combined["member_status"].values[0] == "completed"
        assert combined["member_status"].values[1].startswith("failed")
        assert "take time.dt below" in combined["member_status"].values[1]  # the serial run's advice, kept
        failed = combined["order_parameter"].isel(member=1).dropna("time")
        last, end = float(failed["time"][-1]), float(combined["time"][-1])
    # info's column of final order parameters gives the failed member's last good one at its own time (it stood
    # beside the others' values at t_end unmarked)
    capsys.readouterr()
    assert main(["info", str(output / "sweep.nc")]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert last < end and f"{float(failed[-1]):.8g} at t = {last:.6g}" in " ".join(rows[1])
    assert "at t =" not in " ".join(rows[0])


def test_swept_integers_stay_integers_and_mixed_numbers_are_floats():
    """sphere.lmax = 16, 32 is a coordinate of integers (it was stored as 16.0, 32.0); eps = 0, 0.5 of floats."""
    _, integers, _ = sweep_module._member_coordinate("sphere.lmax", [16, 32], [16, 32])
    _, mixed, _ = sweep_module._member_coordinate("model.eps", [0, 0.5], [0.0, 0.5])
    assert np.asarray(integers).dtype.kind == "i" and integers == [16, 32]
    assert np.asarray(mixed).dtype.kind == "f" and mixed == [0.0, 0.5]


def test_sweep_refuses_existing_results_and_resumes_without_a_cluster(local_sweep, monkeypatch, capsys):
    case_path, output = local_sweep
    args = ["sweep", str(case_path), "--param", PARAMS[0], "--param", PARAMS[1], "-o", str(output)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1

    def no_cluster(*args, **kwargs):
        raise AssertionError("a completed sweep needs no cluster")

    monkeypatch.setattr(sweep_module, "_cluster", no_cluster)
    before = os.path.getmtime(output / "member-000.nc")
    assert main(args + ["--resume"]) == 0
    assert "keeping 8 completed members of 8" in capsys.readouterr().err
    assert os.path.getmtime(output / "member-000.nc") == before


def test_members_that_compute_the_same_numbers_are_named(tmp_path, monkeypatch, capsys):
    """A particle run with a fixed step never reads sphere.lmax: a sweep over it measured nothing, and says so, on
    the terminal and in sweep.nc's notes, from the members' results (the digests of the files an earlier sweep left
    too: `--resume` runs nothing).  A swept key that changes the run gets no such note (test above)."""
    case = write_case(tmp_path, SMALL_S1.replace('device = "cpu"', 'device = "cpu"\nmethod = "particles"')
                      + "[particles]\nn = 32\n")
    args = ["sweep", str(case), "--param", "sphere.lmax=8,12", "--param", "model.eps=0.1,0.2", "--workers", "1",
            "-o", str(tmp_path / "out")]
    assert main(args) == 0
    expected = [f"members {a} (sphere.lmax=8, model.eps={eps}), {b} (sphere.lmax=12, model.eps={eps}) gave identical "
                "results" for a, b, eps in ((0, 2, 0.1), (1, 3, 0.2))]
    err = capsys.readouterr().err
    assert all(f"spherepde: note: {line}" in err for line in expected), err
    with xr.open_dataset(tmp_path / "out" / "sweep.nc") as combined:
        assert [line.partition(":")[0] for line in combined.attrs["notes"].splitlines()[:2]] == \
            [line.partition(":")[0] for line in expected]
        assert np.array_equal(combined["order_parameter"].isel(member=0), combined["order_parameter"].isel(member=2))
        assert not np.array_equal(combined["order_parameter"].isel(member=0),
                                  combined["order_parameter"].isel(member=1))
        # particle runs have no grid to resolve: the file claimed "resolved_until = end" for them
        assert "resolved_until" not in combined.attrs and "member_resolved_until" not in combined
    monkeypatch.setattr(sweep_module, "_cluster", None)  # nothing left to run
    assert main(args + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert all(line in err for line in expected), err
    # fewer members on resuming: the earlier sweep's others are named, not read as this one's
    assert main(args[:2] + ["--param", "sphere.lmax=8"] + args[4:] + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "note: member-002.nc, member-003.nc in " in err and "are of an earlier sweep" in err, err
    with xr.open_dataset(tmp_path / "out" / "sweep.nc") as combined:
        assert combined.sizes["member"] == 2


def test_failed_members_are_not_named_identical(tmp_path):
    """Members that failed before their first save keep only t = 0, which they share: their key does change the run
    (a review found time.dt = 0.5, 1 named "identical results")."""
    members = plan(spherepde.load_case_text(SMALL_S1), ["model.eps=0.1,0.2,0.3"], str(tmp_path))
    summaries = {0: {"exit_status": 3, "digest": "d"}, 1: {"exit_status": 3, "digest": "d"},
                 2: {"exit_status": 0, "digest": "d"}}
    assert sweep_module.identical_results(members, summaries) == []
    summaries[1]["exit_status"] = 0
    assert sweep_module.identical_results(members, summaries) == [
        "members 1 (model.eps=0.2), 2 (model.eps=0.3) gave identical results: what they differ in does not change "
        "this run"]


def test_member_attributes_keep_integers_exact():
    """member_<name> made every number a float: a seed of a seeded sweep, or of one swept over particles.seed,
    above 2**53 came back as another seed (2**62 + 1 read 2**62), so the member could not be rerun from sweep.nc.
    Integers every member has stay 64-bit integers; a number some member lacks is a float, NaN there."""
    seeds = [2**62 + 1, 7]
    attrs_of = [{"seed": seed, "n": 100, "steps": steps, "dt": 0.1 * steps} for seed, steps in zip(seeds, (3, 4))]
    attrs_of[1].pop("dt")
    variables = sweep_module.member_attributes(attrs_of, {"n": 100})
    assert sorted(variables) == ["member_dt", "member_seed", "member_steps"]
    column = np.asarray(variables["member_seed"][1])
    assert column.dtype == np.int64 and [int(seed) for seed in column] == seeds
    assert np.asarray(variables["member_steps"][1]).tolist() == [3, 4]
    dt = np.asarray(variables["member_dt"][1], dtype=float)
    assert dt[0] == pytest.approx(0.3) and np.isnan(dt[1])

def test_a_sweep_of_trainings_keeps_each_members_results_of_its_attributes(tmp_path):
    """A training's results are attributes (iterations, optimizer_stop, three_phase, ...), which sweep.nc dropped
    where the members differ (so a table over a sweep reopened every member file): now member_<name> variables, each
    member's value, numbers as floats."""
    training = SMALL_S1 + '[control]\nloss = "align"\ntarget = [0.0, 1.0]\nlayers = 2\noptimizer = "gd"\n'
    members = plan(spherepde.load_case_text(training), ["control.iterations=1,3"], str(tmp_path))
    summaries = {s["member"]: s for s in run_batch([m.index for m in members], [m.case.text for m in members],
                                                     [m.path for m in members])}
    combine(members[0].case, members, summaries, str(tmp_path / "sweep.nc"), ["control.iterations=1,3"], None)
    with xr.open_dataset(tmp_path / "sweep.nc") as combined:
        assert list(combined["member_iterations"].values) == [1.0, 3.0]
        assert "iterations" not in combined.attrs and combined["member_wall_seconds"].attrs["units"] == "s"
        for member in members:  # every attribute of a member's file: the sweep's, where all share it, else its own
            with xr.open_dataset(member.path) as own:
                for name, value in own.attrs.items():
                    if name in ("case", "status", "resolved_until", "notes", "history", "title"):
                        continue  # member_case, member_status, member_resolved_until; the sweep's notes, its own
                    kept = combined.attrs[name] if name in combined.attrs else \
                        combined[f"member_{name}"].values[member.index]
                    assert sweep_module._equal(kept, value), name  # NaN as NaN
        assert "member_case" in combined and "member_history" not in combined and "member_notes" not in combined


def test_members_that_differ_in_a_dimension_combine_with_every_members_values(tmp_path):
    """Two trainings that save their adjoint, then two that do not: sweep.nc holds each member's own phi, NaN where it
    has none (xarray's coords="different" refused the `adjoint_time` that the last two lack: no sweep.nc, exit 1)."""
    training = SMALL_S1 + '[control]\nloss = "align"\ntarget = [0.0, 1.0]\nlayers = 2\niterations = 1\n'
    params = ["control.save_adjoint=true,false", "control.lambda_reg=0.01,0.1"]
    members = plan(spherepde.load_case_text(training), params, str(tmp_path))
    summaries = {s["member"]: s for s in run_batch([m.index for m in members], [m.case.text for m in members],
                                                     [m.path for m in members])}
    combine(members[0].case, members, summaries, str(tmp_path / "sweep.nc"), params, None)
    with xr.open_dataset(tmp_path / "sweep.nc") as combined:
        for member in members:
            phi = combined["phi"].isel(member=member.index).values
            with xr.open_dataset(member.path) as own:
                assert ("phi" in own) == member.case["control"]["save_adjoint"]
                assert np.array_equal(phi, own["phi"].values) if "phi" in own else np.isnan(phi).all()


MLP = 'eps = 0.1\nfeed_forward = "mlp"\nhidden = 3\nW2 = [[0.4, -0.3, 0.2], [0.1, 0.5, -0.2]]\n'
PARTICLES = 'device = "cpu"\nmethod = "particles"'
TRAINING = '[control]\nloss = "align"\ntarget = [0.0, 1.0]\nlayers = 2\noptimizer = "adam"\niterations = 2\n'
HEADS_S2 = SMALL_S1.replace("dim = 2\nlmax = 16", "dim = 3\nlmax = 8").replace("mean = [1.0, 0.0]",
                                                                              "mean = [1.0, 0.3, 0.2]")


@pytest.mark.parametrize("text, param, tolerance", [
    (SMALL_S1.replace("eps = 0.1\n", MLP), "model.ffn_seed=1,2", ROUND_OFF),
    (SMALL_S1.replace("eps = 0.1\n", MLP).replace('device = "cpu"', PARTICLES) + "[particles]\nn = 32\n",
     "model.b=[0.1,0.0,0.0],[0.0,-0.2,0.3]", 0),
    (SMALL_S1.replace("eps = 0.1\n", MLP) + TRAINING, "model.ffn_seed=1,2", 1e-10),
    (SMALL_S1.replace("eps = 0.1\n", MLP).replace('device = "cpu"', PARTICLES) + "[particles]\nn = 16\n"
     + TRAINING, "model.W1=[[1.0,0.0],[0.0,1.0],[0.5,0.5]],[[0.0,1.0],[1.0,0.0],[-0.5,0.5]]", 0),
    (HEADS_S2, "model.extra_heads=[{beta=4.0,V=[[0,0,0],[0,0,0],[0,0,1]]}],[{beta=4.0,V=[[0,0,0],[0,0,0],[0,0,2]]}]",
     ROUND_OFF),
    (HEADS_S2.replace('device = "cpu"', PARTICLES) + "[particles]\nn = 32\n",
     "model.extra_heads=[{beta=4.0,B=[[1,0,0],[0,2,0],[0,0,1]]}],[{beta=4.0,B=[[2,0,0],[0,1,0],[0,0,1]]}]", 0),
], ids=["eulerian-ffn_seed", "particles-b", "training-ffn_seed", "particle-training-W1", "eulerian-s2-heads-V",
        "particles-s2-heads-B"])
def test_a_sweep_beyond_the_seeds_batches_its_members(tmp_path, text, param, tolerance):
    """`spherepde sweep --param` over the feed-forward's ffn_seed (W1 drawn from it), W1, b, or an extra head's B
    and V, Eulerian and particle runs and trainings of both: one batch of both members (each ran alone), each
    member's file its serial run's, to round-off (a training's to 1e-10: its trained parameters), particles bit for
    bit."""
    case = write_case(tmp_path, text)
    output = tmp_path / "out"
    assert main(["sweep", str(case), "--param", param, "--workers", "1", "-o", str(output)]) == 0
    for member in plan(spherepde.load_case(case), [param], str(output)):
        serial = spherepde.run(member.case, progress=False)
        with xr.open_dataset(member.path) as batched:
            assert batched.attrs["batch_members"] == 2
            for name in serial.data_vars:
                assert same_values(batched[name].values, serial[name].values, tolerance), (member.index, name)


def test_seeds_alone_sweep_replicates_of_the_case(tmp_path, capsys):
    """`sweep CASE --seeds N` without --param (the seeds' statistics of one row): N members whose particle.seed are
    the seeds spawned from the case's, each its serial run bit for bit; --param was required, and a sweep of
    neither is refused in one line."""
    case = write_case(tmp_path)
    particles = ["--set", "solver.method='particles'", "--set", "particles.n=200"]
    assert main(["sweep", str(case), "-o", str(tmp_path / "none")] + particles) == 2
    assert "nothing to sweep" in capsys.readouterr().err
    assert main(["sweep", str(case), "--seeds", "3", "-o", str(tmp_path / "seeds")] + particles) == 0
    seeds = derived_seeds(spherepde.load_case(str(case))["particles"]["seed"], 3)
    with xr.open_dataset(tmp_path / "seeds" / "sweep.nc") as combined:
        assert [int(seed) for seed in combined["seed"].values] == seeds
        for member, seed in enumerate(seeds):
            serial = spherepde.run(spherepde.load_case(str(case), [
                "solver.method='particles'", "particles.n=200", f"particles.seed={seed}"]), progress=False)
            np.testing.assert_array_equal(combined["particles"].isel(member=member).values, serial["particles"].values)


def test_parameters_seeds_and_bad_members():
    assert parse_param("model.V=[[1,0],[0,1]],[[2,0],[0,2]]") == ("model.V", [[[1, 0], [0, 1]], [[2, 0], [0, 2]]])
    assert parse_param("model.kernel=softmax,unnormalized") == ("model.kernel", ["softmax", "unnormalized"])
    assert parse_param('model.kernel="softmax"') == ("model.kernel", ["softmax"])
    for bad in ("model.eps", "eps=0.1,0.2", "model.eps="):
        with pytest.raises(CaseError, match="--param"):
            parse_param(bad)
    # a trailing comma was one value less, silently (while "0.1,,0.2" was refused); a repeated value a repeated run
    with pytest.raises(CaseError, match="an empty value after the last comma"):
        parse_param("model.eps=0.1,")
    for bad in ("model.eps=0.1,,0.2", "model.eps=,0.1", "model.kernel=softmax,,unnormalized"):  # not a member's
        with pytest.raises(CaseError, match=r"an empty value \(a comma with no value before or after it\)"):
            parse_param(bad)
    with pytest.raises(CaseError, match=r"0\.1 given twice"):
        parse_param("model.eps=0.1,0.2,0.10")

    eulerian = spherepde.load_case_text(SMALL_S1 + "[particles]\nseed = 7\n")
    with pytest.raises(CaseError, match="--seeds: sweep member 0 is an Eulerian run"):
        plan(eulerian, ["model.eps=0.1,0.2"], "folder", seeds=3)
    case = eulerian.with_overrides(["solver.method='particles'"])
    # --seeds replaces particles.seed: swept seeds would have been the same runs, labelled as different
    with pytest.raises(CaseError, match="--seeds with --param particles.seed"):
        plan(case, ["particles.seed=1,2"], "folder", seeds=2)
    seeds = derived_seeds(7, 3)
    assert seeds == derived_seeds(7, 3) and len(set(seeds)) == 3 and seeds != derived_seeds(8, 3)
    members = plan(case, ["model.eps=0.1,0.2"], "folder", seeds=3)
    assert [m.seed for m in members] == seeds * 2
    assert [m.case["particles"]["seed"] for m in members] == seeds * 2
    assert [m.case["model"]["eps"] for m in members] == [0.1] * 3 + [0.2] * 3
    assert os.path.basename(members[5].path) == "member-005.nc"

    with pytest.raises(CaseError, match=r"sweep member 1 \(model.eps=-0.1\).*model.eps"):
        plan(case, ["model.eps=0.1,-0.1"], "folder")
    with pytest.raises(CaseError, match="given twice"):
        plan(case, ["model.eps=0.1", "model.eps=0.2"], "folder")
    with pytest.raises(CaseError, match="given twice: model.eps, model.eps"):  # keys read as a case's overrides
        plan(case, ["model.eps=0.1", " model . eps =0.2"], "folder")
    assert [m.values for m in plan(case, ["model . eps=0.1,0.2"], "folder")] == [{"model.eps": 0.1}, {"model.eps": 0.2}]
    with pytest.raises(CaseError, match="model.bta"):
        plan(case, ["model.bta=1"], "folder")


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs workers without CUDA")
def test_sweep_on_a_separately_started_scheduler(tmp_path):
    """`dask scheduler` + `dask worker` on loopback; a member with bad input that only a worker can see (a device it
    lacks: a remote cluster's devices are its own) is reported (exit 2) after the others are written and
    combined."""
    dask = shutil.which("dask") or pytest.skip("the dask command is not installed")
    scheduler_file = tmp_path / "scheduler.json"
    processes = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                   "--scheduler-file", str(scheduler_file)], stderr=subprocess.DEVNULL)]
    try:
        address, deadline = None, time.monotonic() + 60
        while address is None and time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                address = json.loads(scheduler_file.read_text())["address"]
            except (OSError, ValueError, KeyError):  # not written yet, or half written
                pass
        assert address is not None and address.startswith("tcp://127.0.0.1:"), address
        processes.append(subprocess.Popen([dask, "worker", "--scheduler-file", str(scheduler_file), "--nworkers", "2",
                                           "--nthreads", "1", "--no-dashboard"], stderr=subprocess.DEVNULL))
        case = spherepde.load_case_text(SMALL_S1)
        with pytest.raises(CaseError, match=r"2 of 4 sweep members failed; member 1 .*solver.device"):
            run_sweep(case, ["model.beta=1.0,2.0", "solver.device='cpu','cuda'"], str(tmp_path / "out"),
                      scheduler=address)
        with xr.open_dataset(tmp_path / "out" / "sweep.nc") as combined:
            assert list(combined["member"].values) == [0, 2]
            for index, beta in ((0, 1.0), (2, 2.0)):
                serial = spherepde.run(case.with_overrides([f"model.beta={beta}"]), progress=False)
                assert np.array_equal(combined["density"].sel(member=index).values, serial["density"].values)
        assert not (tmp_path / "out" / "member-001.nc").exists()
    finally:
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=30)


def test_unreachable_scheduler_is_one_line(tmp_path, capsys):
    import dask

    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        status = main(["sweep", str(case), "--param", "model.eps=0.1", "--scheduler", "tcp://127.0.0.1:9",
                       "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2 and "cannot reach a Dask scheduler" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("address, said", [("tcp://127.0.0.1:99999", "port 99999 is not a TCP port"),
                                           ("127.0.0.1:0", "port 0 is not a TCP port"),
                                           ("tcp://host", "missing port number"),
                                           ("tls://host:port", "not an address of the form tcp://HOST:PORT")])
def test_a_scheduler_address_no_server_can_have_is_refused_at_once(tmp_path, capsys, monkeypatch, address, said):
    """Without its check, a port beyond 65535 was retried for the whole connect timeout (30 s) before exit 2."""
    def no_connection(*args, **kwargs):
        raise AssertionError("an address no server can have is not connected to")

    monkeypatch.setattr("distributed.comm.connect", no_connection)
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    status = main(["sweep", str(case), "--param", "model.eps=0.1", "--scheduler", address, "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_a_scheduler_address_that_is_no_dask_scheduler_is_one_line(tmp_path, capsys):
    """A tls:// address without its security settings (Client raised TypeError: a traceback, exit 1) and a port
    that accepts the connection but never answers Dask's handshake (the sweep waited for ever): one line, exit 2,
    within distributed.comm.timeouts.connect and as long again (2 s at least)."""
    import socket

    import dask

    case = write_case(tmp_path)
    with socket.socket() as listener, dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        for address, said in ((f"tcp://127.0.0.1:{listener.getsockname()[1]}", "no Dask scheduler answered"),
                              ("tls://127.0.0.1:9", "cannot reach a Dask scheduler")):
            status = main(["sweep", str(case), "--param", "model.eps=0.1", "--scheduler", address,
                           "-o", str(tmp_path / "out")])
            err = capsys.readouterr().err
            assert status == 2 and said in err and len(err.strip().splitlines()) == 1, err
            assert not (tmp_path / "out").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_member_asking_for_an_absent_device_fails_before_anything_runs(tmp_path, capsys):
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    status = main(["sweep", str(case), "--param", "solver.device='cpu','cuda'", "--workers", "1",
                   "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2 and "sweep member 1" in err and "solver.device" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_local_workers_keep_freed_memory_where_dask_would_trim_it():
    """Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_ = 65536 (glibc gives freed memory back at once); the
    sweep's LocalCluster starts them with spherepde.base.memory's thresholds: in a worker, once its heap has settled,
    ten rounds of a step's 48 MB of temporaries fault in less than a quarter of one round's 12,288 pages (with
    Dask's setting nearly all of the ten rounds', 122,880).  Measured in the worker's main thread: a task thread's
    own arena settles too, but not always within eight rounds; and the worker's own threads allocate beside the
    task, so that one 6 MB chunk may be faulted in once more (1,536 pages, in one CI run and in one of a session's
    full test runs; the subprocess test of test_case.py, with no other threads, keeps its 1% of all ten rounds)."""
    from spherepde.base.memory import glibc

    if not glibc():
        pytest.skip("glibc's malloc only")

    def faults(source=STAGE_FAULTS):
        namespace = {}
        exec(source, namespace)
        return namespace["faults"]()

    with sweep_module._cluster(None, 1) as client:
        (count,) = client.run(faults).values()
    assert count < 12288 / 4


def test_every_member_is_checked_before_any_runs(tmp_path):
    """What a serial run refuses before it starts, a sweep refuses of every member before any runs (nothing
    written): a grid too coarse for one member's kernel, one member's particles beyond the memory, an Eulerian
    member on S^3, the solvers' choices (a field, beta = inf's hardmax), an initial file holding no density; and
    members that are one run: the same resolved case (eps 1 and 1.0), members that differ in [case] only, or
    Eulerian members that differ in [particles] only."""
    from spherepde.api.limits import available_memory

    case, folder = spherepde.load_case_text(SMALL_S1), tmp_path / "out"
    with pytest.raises(CaseError, match=r"sweep member 1 \(model.beta=500.0\): sphere.lmax: 16 is too coarse"):
        run_sweep(case, ["model.beta=1.0,500.0"], str(folder))
    assert not folder.exists() or not os.listdir(folder)
    if available_memory() is not None:
        particles = case.with_overrides(["solver.method='particles'"])
        with pytest.raises(CaseError, match=r"sweep member 1 \(particles.n=4000000000\): particles.n: .* memory"):
            run_sweep(particles, ["particles.n=100,4000000000"], str(folder))
    with pytest.raises(CaseError, match=r"sweep member 1 \(model.beta=1e\+308\): model.beta: beta = 1e\+308 times "
                                        r"\|B\| = 2 overflows float64"):  # the particles' kernel (a review's find)
        run_sweep(case.with_overrides(["solver.method='particles'", "model.B=[[1.0, 1.0], [1.0, 1.0]]"]),
                  ["model.beta=1.0,1e308"], str(folder))
    with pytest.raises(CaseError, match=r"sweep member 0 \(model.eps=0.1\): sphere.dim: the Eulerian solver handles"):
        run_sweep(case.with_overrides(["sphere.dim=4", "initial.mean=[1.0, 0.0, 0.0, 0.0]"]), ["model.eps=0.1,0.2"],
                  str(folder))  # a ValueError's traceback, exit 1
    # what the solvers refuse at their setup (a helper's round: member 0 ran and wrote its file first)
    with pytest.raises(CaseError, match=r"sweep member 1 \(solver.field=\"spectral\"\): solver.field: 'spectral' is "
                                        r"not available for particles"):
        run_sweep(case.with_overrides(["solver.method='particles'"]), ["solver.field='dense','spectral'"], str(folder))
    with pytest.raises(CaseError, match=r"sweep member 1 \(solver.field=\"spectral\"\): solver.field: 'spectral' is "
                                        r"available for the seeds' model only"):
        run_sweep(case.with_overrides(["model.extra_heads=[{beta = 1.0}]"]), ["solver.field='auto','spectral'"],
                  str(folder))
    with pytest.raises(CaseError, match=r"sweep member 1 \(particles.beta_inf_mode=\"hardmax\"\): "
                                        r"particles.beta_inf_mode: 'hardmax' is available for the seeds' model only"):
        run_sweep(case.with_overrides(["solver.method='particles'", "model.beta='inf'",
                                       "model.extra_heads=[{beta = 1.0}]"]),
                  ["particles.beta_inf_mode='mean_field','hardmax'"], str(folder))
    with pytest.raises(CaseError, match=r"sweep member 1 \(model.eps=100.0\): time.dt: a step of 0.05 is too long "
                                        r"for the weak-order-2 noise step"):
        run_sweep(case.with_overrides(["solver.method='particles'", "sphere.dim=3", "initial.mean=[1.0, 0.0, 0.0]"]),
                  ["model.eps=0.1,100.0"], str(folder))
    eulerian, particles = (str(tmp_path / name) for name in ("eulerian.nc", "particles.nc"))
    assert main(["run", str(write_case(tmp_path)), "-o", eulerian]) == 0
    assert main(["run", str(write_case(tmp_path)), "--solver", "particles", "-o", particles]) == 0
    with pytest.raises(CaseError, match=r"sweep member 1 \(initial.path=.*particles.nc\"\): initial.path: .* holds no "
                                        r"Eulerian density"):
        run_sweep(spherepde.load_case_text(SMALL_S1.replace('kind = "vmf"\nmean = [1.0, 0.0]\nkappa = 2.0',
                                                            f"kind = 'file'\npath = {eulerian!r}")),
                  [f"initial.path={eulerian!r},{particles!r}"], str(folder))
    with pytest.raises(CaseError, match=r"members 0 \(model.eps=1\) and 1 \(model.eps=1.0\) are the same run$"):
        run_sweep(case, ["model.eps=1,1.0"], str(folder))
    with pytest.raises(CaseError, match=r"members 0 \(particles.seed=1\) and 1 \(particles.seed=2\) are the same run "
                                        r"\(an Eulerian run draws nothing"):
        run_sweep(case, ["particles.seed=1,2"], str(folder))
    with pytest.raises(CaseError, match=r"members 0 \(case.name=\"a\"\) and 1 \(case.name=\"b\"\) are the same run "
                                        r"\(\[case\] only names and describes a run\)$"):
        run_sweep(case, ["case.name='a','b'"], str(folder))
    assert not folder.exists() or not os.listdir(folder)


def test_a_sweep_tells_lost_resolution_and_other_save_times(tmp_path, capsys):
    """Members that lose their resolution (eps 0.001 at lmax 16) say so as they end and in sweep.nc (where the
    members' differing resolved_until was dropped: member_resolved_until, the sweep's first loss, their notes);
    members saving every 0.1 and every 0.3 share the save times 0.3, 0.6, 0.9 = t_end exactly (3 x 0.3 was
    0.8999999999999999, 9 x 0.1 0.9000000000000001: a time axis with near-duplicates), and the figure draws each
    member through its own saves.  --overwrite with fewer members removes the earlier sweep's other files."""
    from spherepde.analysis.diagnostic_panels import _member_curve

    case = tmp_path / "case.toml"  # noisy Kuramoto, lmax 16
    case.write_text(SMALL_S1.replace('kernel = "softmax"\nbeta = 2.0\neps = 0.1',
                                     'kernel = "unnormalized"\nbeta = 0.0\nV = [[1.0, 0.0], [0.0, 1.0]]\neps = 0.25')
                    .replace("kappa = 2.0", "kappa = 1.0"))
    assert main(["sweep", str(case), "--set", "time.t_end=0.9", "--param", "model.eps=0.25,0.001", "--param",
                 "time.save_every=0.1,0.3", "--workers", "1", "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    lost = [line for line in err.splitlines() if "under-resolved after t = " in line]
    assert len(lost) == 2 and all("model.eps=0.001" in line for line in lost), err
    with xr.open_dataset(tmp_path / "out" / "sweep.nc") as combined:
        times = combined["time"].values
        assert np.array_equal(times, np.round(np.arange(10) * 0.1, 12)) and times[-1] == 0.9
        until = combined["member_resolved_until"].values
        assert np.isinf(until[:2]).all() and np.isfinite(until[2:]).all()
        assert combined.attrs["resolved_until"] == until.min()
        for member in (2, 3):
            with xr.open_dataset(tmp_path / "out" / f"member-{member:03d}.nc") as own:
                assert own.attrs["resolved_until"] == until[member] and own["time"].values[-1] == 0.9
                assert f"member {member}: {own.attrs['notes']}" in combined.attrs["notes"]
        import matplotlib.pyplot as plt
        axis = plt.figure().subplots()
        line = _member_curve(axis, times, combined["order_parameter"].isel(member=3).values, "C0", "-", "m")
        assert np.array_equal(line.get_xdata(), [0.0, 0.3, 0.6, 0.9])
        plt.close("all")
    assert main(["sweep", str(case), "--set", "time.t_end=0.9", "--param", "model.eps=0.25", "--param",
                 "time.save_every=0.1,0.3", "--workers", "1", "-o", str(tmp_path / "out"), "--overwrite"]) == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["member-000.nc", "member-001.nc", "sweep.nc"]


def test_the_failure_a_sweep_names_is_of_the_status_it_exits_with():
    """A numerical failure (exit 3) and bad input (exit 2) among the members: the sweep exits 2, naming the member
    with bad input (it named the first failure, whatever its kind)."""
    members = plan(spherepde.load_case_text(SMALL_S1), ["model.eps=0.1,0.2,0.3"], "folder")
    summaries = {0: {"member": 0, "exit_status": 0, "status": "completed"},
                 1: {"member": 1, "exit_status": 3, "status": "failed: the density became non-finite"},
                 2: {"member": 2, "exit_status": 2, "status": "bad input: sphere.lmax: too coarse"}}
    with pytest.raises(CaseError, match=r"^2 of 3 sweep members failed; member 2 \(model.eps=0.3\): bad input"):
        sweep_module._raise_failures(members, summaries)


@pytest.mark.slow  # 21 s of one core: the default run's time limit
def test_resume_reruns_members_saved_at_other_times_and_overwrite_leaves_no_earlier_file(tmp_path, capsys):
    """--resume keeps a completed member only where its save times are today's (an earlier version's could lie an
    ulp apart, and sweep.nc's time axis held both); --overwrite removes every earlier member file, also of a member
    that now fails before writing one (its old file stayed, of another case, under its name)."""
    from spherepde.io.output import write_dataset

    case, output = tmp_path / "case.toml", tmp_path / "out"
    case.write_text(SMALL_S1)
    args = ["sweep", str(case), "--param", "model.eps=0.1,0.2", "--workers", "1", "-o", str(output)]
    assert main(args) == 0
    with xr.open_dataset(output / "member-001.nc") as member:
        moved = member.load().assign_coords(time=member["time"].values + np.array([0.0, 5.6e-17, 0.0]))
    write_dataset(moved, str(output / "member-001.nc"))
    capsys.readouterr()
    assert main(args + ["--resume"]) == 0
    assert "keeping 1 completed members of 2" in capsys.readouterr().err
    with xr.open_dataset(output / "sweep.nc") as combined:
        assert np.array_equal(combined["time"].values, [0.0, 0.25, 0.5])
    narrow = ["sweep", str(case), "--param", "initial.kappa=2.0,5000.0", "--workers", "1", "-o", str(output)]
    assert main(narrow + ["--overwrite"]) == 2
    assert sorted(os.listdir(output)) == ["member-000.nc", "sweep.nc"]
    with xr.open_dataset(output / "sweep.nc") as combined:  # member 1 without results: not the old file's
        assert list(combined["member"].values) == [0, 1]
        status = combined["member_status"].values[1]  # the member named by its place, not again in its text
        assert status.startswith("bad input: initial: the grid") and "sweep member" not in status
        assert np.isnan(combined["order_parameter"].sel(member=1).values).all()


def test_resume_refuses_to_replace_a_member_file_of_another_run(tmp_path, capsys):
    """--resume keeps an earlier sweep's files of other members (docs/guide/sweeps.md): a file under a member's name
    that holds another case (an earlier sweep of other --param values) was run again and replaced, its result lost.
    It is now refused, one line naming the file and --overwrite, exit 2, the file as it was."""
    case, output = tmp_path / "case.toml", tmp_path / "out"
    case.write_text(SMALL_S1)
    base = ["sweep", str(case), "--workers", "1", "-o", str(output)]
    assert main(base + ["--param", "model.eps=0.1,0.2"]) == 0
    earlier = (output / "member-001.nc").read_bytes()
    capsys.readouterr()
    assert main(base + ["--param", "model.eps=0.1,0.4", "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "member-001.nc" in err and "model.eps=0.4" in err and "--overwrite" in err
    assert (output / "member-001.nc").read_bytes() == earlier
    with xr.open_dataset(output / "sweep.nc") as combined:
        assert list(combined["model_eps"].values) == [0.1, 0.2]
    assert "model.eps=0.2;" in err  # the stored value that differs


def test_resume_runs_again_a_member_file_of_its_own_case_from_an_earlier_version(tmp_path):
    """A member file whose case lacks a key that today's resolved case has (an earlier version's), the keys both hold
    alike, is the member's own run: --resume runs it again, as for a failed one, and does not refuse it."""
    import netCDF4

    case, output = tmp_path / "case.toml", tmp_path / "out"
    case.write_text(SMALL_S1)
    base = ["sweep", str(case), "--workers", "1", "-o", str(output), "--param", "model.eps=0.1,0.2"]
    assert main(base) == 0
    with netCDF4.Dataset(output / "member-001.nc", "a") as dataset:
        today = dataset.getncattr("case")
        dataset.setncattr("case", "\n".join(line for line in today.splitlines() if not line.startswith("w2_atoms")))
    assert main(base + ["--resume"]) == 0
    with xr.open_dataset(output / "member-001.nc") as rerun:
        assert rerun.attrs["case"] == today and rerun.attrs["status"] == "completed"


def test_a_sweep_reports_its_members_done_between_their_ends(tmp_path, monkeypatch, capsys):
    """A sweep printed a line as each member ended, nothing between: a member of minutes was minutes of silence in
    a log, where a long run prints a line every 30 s (docs/design.md).  A thread now prints the members done as they
    fall due (here every 0.25 s; a member takes about a second), each member's line its own."""
    import functools

    monkeypatch.setattr(sweep_module, "Progress", functools.partial(sweep_module.Progress, log_every_seconds=0.25))
    case = spherepde.load_case("cases/kuramoto-s1.toml", ["time.t_end=40.0", "sphere.lmax=64"])
    run_sweep(case, ["model.eps=0.2,0.3"], str(tmp_path / "sweep"), workers=1)
    lines = capsys.readouterr().err.splitlines()
    first = lines.index("spherepde: member 0 (model.eps=0.2) completed [1/2]")
    waiting = [line for line in lines[:first] if line.startswith("spherepde: members=")]
    assert waiting and all(re.fullmatch(r"spherepde: members=0/2 \(0%\), \d+:\d\d elapsed, time left unknown", line)
                           for line in waiting), lines
    assert "spherepde: member 1 (model.eps=0.3) completed [2/2]" in lines and not any("\r" in line for line in lines)


class _Batch:
    """A Dask future of run_batch run in this process, as its task ends on a worker: member 1's worker dies on every
    try (Dask's KilledWorker: the system killed it for want of memory, say), member 2's file cannot be written."""

    def __init__(self, args):
        self.key, self.args = f"run_batch-{args[0]}", args

    def result(self):
        from types import SimpleNamespace

        from distributed import KilledWorker

        if 1 in self.args[0]:
            raise KilledWorker(self.key, SimpleNamespace(address="tcp://127.0.0.1:1"), 3)
        if 2 in self.args[0]:
            raise OSError(f"cannot write {self.args[2][0]!r}: NetCDF: HDF error (is the disk full?)")
        return run_batch(*self.args)


def test_a_batch_whose_worker_dies_fails_its_members_and_the_others_are_combined(tmp_path, monkeypatch, capsys):
    """A batch whose worker process died on every try (KilledWorker), or whose task raised OSError (a member file on a
    full disk), ended the sweep with a traceback (exit 1, or exit 2 naming the file), and the members of the other
    batches, written, were in no sweep.nc.  Its members now fail as a serial run out of memory does (exit 2, one line
    naming a member), after the others are combined."""
    import distributed

    class Client:
        loop = None

        def submit(self, function, *args, pure=True):
            return _Batch(args)

    monkeypatch.setattr(sweep_module, "_cluster", lambda scheduler, workers: contextlib.nullcontext(Client()))
    monkeypatch.setattr(distributed, "as_completed", lambda futures, loop=None: iter(futures))
    case = write_case(tmp_path)
    output = tmp_path / "out"
    status = main(["sweep", str(case), "--param", "time.dt=0.05,0.025,0.02", "--workers", "1", "-o", str(output)])
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert lines[-1] == ("spherepde: error: 2 of 3 sweep members failed; member 1 (time.dt=0.025): failed: the "
                         "worker process running its batch died on every try (killed by the system: out of memory?)")
    assert "member 2 (time.dt=0.02) failed: OSError: cannot write" in err and "Traceback" not in err, err
    with xr.open_dataset(output / "sweep.nc") as combined:  # the failed members' places kept, their results NaN
        assert list(combined["member"].values) == [0, 1, 2]
        assert combined["member_status"].values[1].startswith("failed: the worker process")
        assert np.isnan(combined["order_parameter"].sel(member=[1, 2]).values).all()
        assert combined.attrs["status"] == "failed: 2 of 3 sweep members (member_status)"
    assert sorted(os.listdir(output)) == ["member-000.nc", "sweep.nc"]


def test_a_local_cluster_needs_no_particular_port(recwarn):
    """The LocalCluster's scheduler served its HTTP routes (no dashboard) on port 8787: where another process held it
    (a second sweep, a notebook's cluster) the sweep printed Dask's three-line UserWarning "Port 8787 is already in
    use"; now any free port of the loopback."""
    import socket
    import warnings

    warnings.simplefilter("always")
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # taken already: by another process, which serves this test as well
            holder.bind(("", 8787))
            holder.listen()
        with sweep_module._cluster(None, 1) as client:
            port = client.scheduler_info()["services"].get("dashboard")
    assert not [w for w in recwarn if "already in use" in str(w.message)], [str(w.message) for w in recwarn]
    assert port != 8787


def test_too_many_members_of_one_key_are_counted_once():
    """One swept key of 10001 values was refused as "10001 = 10001 members"; a product is shown where there is one."""
    from spherepde.api.limits import check_members

    with pytest.raises(CaseError, match=r"^--param: 10001 members; at most 10000 \(each is a run and a file\)$"):
        check_members([10001], None)
    with pytest.raises(CaseError, match=r"^--param: 5001 x 2 seeds = 10002 members; at most 10000"):
        check_members([5001], 2)
    check_members([100, 100], None)  # 10000: allowed


def test_a_key_set_twice_or_both_swept_and_set_is_refused(tmp_path, capsys):
    """`--set time.t_end=0.1 --set time.t_end=0.2` ran at 0.2, and `--param model.eps=0.2,0.3 --set model.eps=0.5`
    at 0.2 and 0.3 without a word: both refused, exit 2, before any member runs."""
    case = write_case(tmp_path)
    for words, said in ((["--param", "model.eps=0.2,0.3", "--set", "time.t_end=0.1", "--set", "time.t_end=0.2"],
                         "time.t_end set more than once"),
                        (["--param", "model . eps=0.2,0.3", "--set", "model.eps=0.5"], "model.eps both swept")):
        output = tmp_path / "sweep"
        assert main(["sweep", str(case), *words, "--workers", "1", "-o", str(output)]) == 2
        err = capsys.readouterr().err
        assert said in err and len(err.strip().splitlines()) == 1
        assert not output.exists()


def test_an_interrupted_sweep_says_how_to_continue(local_sweep, monkeypatch, capsys, tmp_path):
    """Ctrl-C during a sweep (here as its cluster starts) ends with 130 and says what to do next (it said
    "interrupted" only, where `run` names --resume): here, no member having completed, to run it again without
    --resume (tests/test_batch_failures_review.py: with a member completed, --resume)."""
    case_path, _ = local_sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "_cluster", interrupted)
    output = tmp_path / "interrupted"
    assert main(["sweep", str(case_path), "--param", PARAMS[0], "-o", str(output)]) == 130
    err = capsys.readouterr().err
    assert f"no member completed, and {output} holds nothing to resume: run the same command again without " \
        "--resume" in err, err
    assert err.strip().endswith("spherepde: interrupted")


@pytest.mark.slow  # two sweeps and the search for a stretch whose damage shows in the density: about 15 s
def test_resume_runs_again_a_member_file_whose_data_is_damaged(tmp_path, capsys):
    """A completed member file with a damaged density chunk (its header whole) was kept by --resume, and the sweep
    ended "cannot write 'sweep.nc': NetCDF: HDF error (is the disk full?)", naming neither the member nor the
    damage.  The member is run again, alone: its file and sweep.nc hold the undamaged sweep's densities (run in a
    batch of two there: to round-off)."""
    from test_result_files import _damaged_copy, _fails_reading

    case, output = tmp_path / "case.toml", tmp_path / "out"
    case.write_text(SMALL_S1.replace("lmax = 16", "lmax = 1400"))  # 4206 values a save: a compressed chunk
    args = ["sweep", str(case), "--param", "model.eps=0.1,0.2", "--workers", "1", "-o", str(output)]
    assert main(args) == 0
    with xr.open_dataset(output / "member-001.nc") as member:
        density = member["density"].values
    _damaged_copy(output / "member-001.nc", tmp_path / "damaged.nc", _fails_reading("density"))
    os.replace(tmp_path / "damaged.nc", output / "member-001.nc")
    capsys.readouterr()
    assert main(args + ["--resume"]) == 0
    assert "keeping 1 completed members of 2" in capsys.readouterr().err
    with xr.open_dataset(output / "member-001.nc") as member, xr.open_dataset(output / "sweep.nc") as combined:
        assert np.allclose(member["density"].values, density, rtol=0, atol=1e-13)
        assert np.array_equal(combined["density"].sel(member=1).values, member["density"].values)
