"""Checkpoints and resume: a run killed with SIGKILL and resumed ends bit for bit like an
uninterrupted one, so does an interrupted training, and an existing output or checkpoint is never
replaced silently."""

import glob
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr
from test_cli import SMALL_S1
from test_training import CASE as TRAINING_CASE

import spherepde
from solvers import journal
from solvers.adjoint import GRADIENTS
from solvers.checkpoint import Checkpoint, checkpoint_folder
from solvers.particle_training import ParticleControl
from spherepde import CaseError
from spherepde.cli import main

# 200 steps of 0.01, saves every 0.25: long enough to be killed midway, short enough for the fast tests.
CASE = SMALL_S1.replace("t_end = 0.5", "t_end = 2.0").replace("dt = 0.05", "dt = 0.01")
STEPS = 200
VOLATILE = {"history", "wall_seconds"}  # when and how long: the only attributes a resume may change


def write_case(folder, text=CASE):
    path = folder / "case.toml"
    path.write_text(text)
    return path


def run_cli(args, capsys):
    status = main([str(a) for a in args])
    return status, capsys.readouterr().err


def state_of(output) -> dict | None:
    """The stored checkpoint state, or None while there is none (or it is being replaced)."""
    try:
        return Checkpoint(output).read_state()
    except CaseError:
        return None


def assert_same_result(path_a, path_b, volatile=VOLATILE):
    with xr.open_dataset(path_a) as a, xr.open_dataset(path_b) as b:
        assert set(a.variables) == set(b.variables)
        for name in a.variables:
            assert np.array_equal(a[name].values, b[name].values, equal_nan=True), name
        assert comparable(a.attrs, volatile) == comparable(b.attrs, volatile)


def comparable(attrs: dict, volatile) -> dict:
    """The attributes but the volatile ones, NaN as a string (NaN != NaN, though both files say the same)."""
    return {k: "NaN" if isinstance(v, float) and np.isnan(v) else v for k, v in attrs.items() if k not in volatile}


def test_sigkill_midway_then_resume_is_bit_identical(tmp_path, capsys):
    case = write_case(tmp_path)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0

    process = subprocess.Popen([sys.executable, "-m", "spherepde", "run", str(case), "-o", str(output), "--quiet",
                                "--checkpoint-steps", "1"], stderr=subprocess.PIPE, text=True)
    seen = 0
    deadline = time.monotonic() + 120
    while process.poll() is None and seen < STEPS // 5 and time.monotonic() < deadline:
        state = state_of(output)
        seen = state["steps"] if state else 0
        time.sleep(0.001)
    assert process.poll() is None, f"the run ended before it could be killed: {process.stderr.read()}"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not output.exists()

    # Nothing computed before the kill is lost: the checkpoint holds every step up to the kill
    # and every save up to its time, readable as ordinary result files.
    state = state_of(output)
    assert seen <= state["steps"] < STEPS
    segments = sorted(glob.glob(os.path.join(checkpoint_folder(output), "segment-*.nc")))
    with xr.open_mfdataset(segments, combine="nested", concat_dim="time", data_vars="minimal",
                                                 coords="minimal", compat="override") as partial, \
            xr.open_dataset(reference) as full:
        kept = partial.sizes["time"]
        assert kept == int(state["t"] // 0.25 + 1e-9) + 1 == state["saves"]
        assert np.array_equal(partial["density"].values, full["density"].values[:kept])

    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 0, err
    assert f"step {state['steps']}" in err
    assert_same_result(output, reference)
    assert not os.path.exists(checkpoint_folder(output))


def interrupt(case, output, checkpoints: int, every_steps: int = 2) -> None:
    """Run `case`, checkpointing every `every_steps` steps (a training: evaluations), and stop it at its
    `checkpoints`-th checkpoint, as a kill would."""
    checkpoint = Checkpoint(output, every_steps=every_steps)
    written = []

    def stop(state, segment, steps):
        Checkpoint.write(checkpoint, state, segment, steps)
        written.append(steps)
        if len(written) == checkpoints:
            raise KeyboardInterrupt

    checkpoint.write = stop
    with pytest.raises(KeyboardInterrupt):
        spherepde.run(spherepde.load_case(case), progress=False, checkpoint=checkpoint)


def test_the_tools_name_an_unfinished_run_by_its_checkpoint(tmp_path, capsys):
    """`info OUT.nc` of a run stopped with its checkpoint said "No such file", `info OUT.nc.checkpoint` "a folder":
    both name the unfinished run and how to continue it (one line, exit 2)."""
    case = write_case(tmp_path, SMALL_S1)
    output = tmp_path / "out.nc"
    interrupt(case, output, checkpoints=2)
    for path in (output, checkpoint_folder(output)):
        status, err = run_cli(["info", path], capsys)
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert f"the run writing {str(output)!r} is unfinished" in err and f"-o {output} --resume" in err, err


@pytest.mark.slow  # 18 s of one core: the default run's time limit
def test_a_signal_ignored_at_the_start_stays_ignored(tmp_path):
    """A run started with SIGINT ignored (`cmd &` in a script) ignored it during its start-up, then stopped on it
    once running; it now stays ignored: the run ends completed (exit 0) after a SIGINT in its steps."""
    case = write_case(tmp_path, SMALL_S1.replace("t_end = 0.5", "t_end = 40.0"))
    output = tmp_path / "out.nc"
    run = subprocess.Popen([sys.executable, "-m", "spherepde", "run", str(case), "-o", str(output), "--quiet",
                            "--checkpoint-steps", "1"], stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 120
    while run.poll() is None and not Checkpoint(output).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    run.send_signal(signal.SIGINT)
    err = run.communicate(timeout=300)[1]
    assert run.returncode == 0 and "interrupted" not in err, err
    assert xr.open_dataset(output).attrs["status"] == "completed"


def test_existing_checkpoint_is_named_and_never_replaced_silently(tmp_path, capsys):
    case = write_case(tmp_path, SMALL_S1)  # 10 steps of 0.05
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 2 and "no checkpoint" in err and "run without --resume" in err
    assert len(err.strip().splitlines()) == 1

    interrupt(case, output, checkpoints=3)
    status, err = run_cli(["run", case, "-o", output, "--quiet"], capsys)
    assert status == 2 and "--resume" in err and "--overwrite" in err and "step 6" in err
    assert len(err.strip().splitlines()) == 1
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume", "--set", "model.eps=0.2"], capsys)
    assert status == 2 and "model.eps" in err and len(err.strip().splitlines()) == 1
    assert os.path.exists(checkpoint_folder(output)) and not output.exists()
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume", "--overwrite"], capsys)
    assert status == 2 and "not allowed with" in err

    reference = tmp_path / "reference.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    assert run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)[0] == 0
    assert_same_result(output, reference)
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 2 and "no checkpoint" in err and "--overwrite" in err


def test_overwrite_discards_the_checkpoint_and_a_damaged_one_is_one_line(tmp_path, capsys):
    case = write_case(tmp_path, SMALL_S1)
    output = tmp_path / "out.nc"
    folder = checkpoint_folder(output)
    os.makedirs(folder)
    with open(os.path.join(folder, "state.pt"), "wb") as handle:  # the layout before manifests
        handle.write(b"not a checkpoint")
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 2 and "earlier spherepde version" in err and len(err.strip().splitlines()) == 1, err
    os.remove(os.path.join(folder, "state.pt"))
    # a state whose manifest matches it but which holds objects a weights-only load refuses
    checkpoint = Checkpoint(output)
    checkpoint.write({"case": spherepde.load_case(case).text, "steps": 1, "t": 0.1, "t_end": 0.5,
                      "solver": Checkpoint}, None, 1)
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 2 and "holds objects that no checkpoint stores" in err and "weights_only" not in err, err
    status, err = run_cli(["run", case, "-o", output, "--quiet"], capsys)
    assert status == 2 and "unreadable" in err and "--overwrite" in err
    assert run_cli(["run", case, "-o", output, "--quiet", "--overwrite", "--checkpoint-steps", "3"], capsys)[0] == 0
    assert output.exists() and not os.path.exists(folder)


def test_a_damaged_checkpoint_segment_is_one_line(tmp_path, capsys):
    case = write_case(tmp_path, SMALL_S1)
    output = tmp_path / "out.nc"
    interrupt(case, output, checkpoints=2)
    segment = os.path.join(checkpoint_folder(output), "segment-00000.nc")
    with open(segment, "wb") as handle:
        handle.write(b"not a netCDF file")
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 2 and "segment-00000.nc" in err and "--overwrite" in err
    assert len(err.strip().splitlines()) == 1 and not output.exists()


def test_blow_up_with_checkpoints_exits_3_keeps_the_last_good_state_and_no_checkpoint(tmp_path, capsys):
    unstable = CASE.replace("dt = 0.01", "dt = 0.5").replace("t_end = 2.0", "t_end = 200.0").replace(
        "save_every = 0.25", "save_every = 10.0").replace("lmax = 16", "lmax = 64").replace(
        "beta = 2.0", "beta = 8.0").replace("eps = 0.1", "eps = 0.0")
    case = write_case(tmp_path, unstable)
    output = tmp_path / "out.nc"
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--checkpoint-steps", "3"], capsys)
    assert status == 3 and "numerical failure" in err and len(err.strip().splitlines()) == 1
    with xr.open_dataset(output) as dataset:
        assert dataset.attrs["status"].startswith("failed")
        assert np.isfinite(dataset["density"].values).all() and dataset.sizes["time"] >= 1
    assert not os.path.exists(checkpoint_folder(output))


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_as_a_failed_training_writes_its_output_leaves_exit_3_and_no_checkpoint(tmp_path, capsys,
                                                                                          monkeypatch, number):
    """A signal as a training that failed (Adam's first step, lr 100, leaves the transport's stability region)
    writes its last good state: the command exited 130 or 143 "interrupted", its output written and its checkpoint
    left (a run with nothing left to do, and --resume failed the same way).  It is held over the write, as a
    finished run's: exit 3, the output of iteration 0, no checkpoint, a line saying the signal came."""
    import spherepde.io.output as output_module

    case = write_case(tmp_path, TRAINING_CASE.replace("learning_rate = 0.5", "learning_rate = 100.0")
                      + 'optimizer = "adam"\n')
    output = tmp_path / "out.nc"
    write = output_module.write_dataset

    def interrupted_write(dataset, path, *args, **kwargs):
        if os.path.basename(path) == "out.nc":
            os.kill(os.getpid(), number)
        return write(dataset, path, *args, **kwargs)

    monkeypatch.setattr(output_module, "write_dataset", interrupted_write)
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--checkpoint-steps", "1"], capsys)
    name = signal.Signals(number).name
    assert status == 3 and f"{name} came as the output was written; it is complete" in err, err
    assert "numerical failure" in err.strip().splitlines()[-1]
    with xr.open_dataset(output) as dataset:
        assert re.match(r"failed: (?!numerical failure)\S", dataset.attrs["status"])
        assert dataset.sizes["iteration"] == 1 and float(np.abs(dataset["W"].values).max()) == 0
    assert not os.path.exists(checkpoint_folder(output))
    assert not glob.glob(str(tmp_path / "out.nc.*.tmp"))


@pytest.mark.parametrize("number, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_checkpoints_the_step_it_lands_in_and_the_resumed_run_is_bit_identical(tmp_path, capsys,
                                                                                           number, status):
    """Ctrl-C (and SIGTERM, a batch scheduler's end of time) loses nothing: the interrupt writes a checkpoint at
    the end of the step it lands in, later than the last periodic one, the lock file goes, and the run resumed
    from it ends as an uninterrupted one."""
    case = write_case(tmp_path)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    process = subprocess.Popen([sys.executable, "-m", "spherepde", "run", str(case), "-o", str(output), "--quiet",
                                "--checkpoint-steps", "50"], stderr=subprocess.PIPE, text=True)
    state, deadline = None, time.monotonic() + 120
    while process.poll() is None and state is None and time.monotonic() < deadline:
        state = state_of(output)  # the first periodic checkpoint: the run and its handler have started
        time.sleep(0.001)
    assert process.poll() is None, f"the run ended before it could be interrupted: {process.stderr.read()}"
    process.send_signal(number)
    err = process.communicate(timeout=120)[1]
    assert process.returncode == status, err
    assert "checkpointing at the end of this step" in err and "continue it with --resume" in err
    interrupted = state_of(output)
    assert state["steps"] < interrupted["steps"] < STEPS and not output.exists()
    assert not os.path.exists(f"{output}.lock")
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 0, err
    assert f"step {interrupted['steps']}" in err
    assert_same_result(output, reference)


def test_an_interrupt_in_the_particle_half_of_a_both_run_keeps_its_eulerian_half_whole(tmp_path, capsys):
    """A "both" run checkpoints its Eulerian half at its last step, so that an interrupt in the particle half
    (which stops at once) loses none of it: the resumed run goes straight to the particles and ends as an
    uninterrupted one (the particles reproduced by their seed)."""
    case = write_case(tmp_path, CASE.replace("[solver]", '[particles]\nn = 1000\n[solver]\nmethod = "both"'))
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    process = subprocess.Popen([sys.executable, "-m", "spherepde", "run", str(case), "-o", str(output), "--quiet"],
                               stderr=subprocess.PIPE, text=True)
    state, deadline = None, time.monotonic() + 120
    while process.poll() is None and (state is None or state["steps"] < STEPS) and time.monotonic() < deadline:
        state = state_of(output)
        time.sleep(0.001)
    assert process.poll() is None, f"no checkpoint of the whole Eulerian half: {process.stderr.read()}"
    process.send_signal(signal.SIGINT)
    err = process.communicate(timeout=120)[1]
    assert process.returncode == 130 and f"step {STEPS})" in err, err
    assert not output.exists()
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 0 and f"step {STEPS})" in err, err
    assert_same_result(output, reference, VOLATILE | {"particles_wall_seconds"})


def test_a_second_interrupt_or_one_outside_the_steps_stops_at_once(tmp_path, capsys):
    checkpoint = Checkpoint(tmp_path / "out.nc")
    with pytest.raises(KeyboardInterrupt):  # setting up, writing, or the particle half of a "both" run
        checkpoint.interrupt(signal.SIGINT, None)
    checkpoint.stepping = True
    assert not checkpoint.due(1)
    checkpoint.interrupt(signal.SIGINT, None)
    assert checkpoint.due(1) and "checkpointing" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        checkpoint.interrupt(signal.SIGINT, None)


def test_a_checkpoint_path_holding_other_files_is_not_deleted(tmp_path, capsys):
    case = write_case(tmp_path, SMALL_S1)
    output = tmp_path / "out.nc"
    folder = checkpoint_folder(output)
    os.makedirs(folder)
    notes = os.path.join(folder, "notes.txt")
    with open(notes, "w") as handle:
        handle.write("mine")
    assert run_cli(["run", case, "-o", output, "--quiet", "--checkpoint-steps", "3"], capsys)[0] == 0
    assert output.exists() and os.listdir(folder) == ["notes.txt"]
    output.unlink()
    os.remove(notes)
    os.rmdir(folder)
    with open(folder, "w") as handle:
        handle.write("a file where the checkpoint folder goes")
    status, err = run_cli(["run", case, "-o", output, "--quiet"], capsys)
    assert status == 2 and "is not a folder" in err and len(err.strip().splitlines()) == 1
    assert not output.exists()


@pytest.mark.parametrize("flag", [["--resume"], ["--checkpoint-steps", "5"]])
def test_checkpoint_flags_of_runs_that_are_not_checkpointed_are_refused(tmp_path, capsys, flag):
    case = write_case(tmp_path, SMALL_S1)
    particles = ["--set", "solver.method='particles'", "--set", "particles.n=20"]
    fresh = particles + ["--set", "control.loss='align'", "--set", "control.target=[0.0, 1.0]",
                         "--set", "control.iterations=1", "--set", "control.noise='fresh'"]
    for extra, what in ((particles, "particle runs"), (fresh, "fresh noise")):
        status, err = run_cli(["run", case, "-o", tmp_path / "out.nc", "--quiet", *extra, *flag], capsys)
        assert status == 2 and what in err and flag[0] in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture
def counted_gradients(monkeypatch):
    """The controls of every evaluation of J and dJ/dW a training asks for (either adjoint gradient, or
    autograd through particles), and a SIGINT sent to this process during evaluation number `interrupt_at[0]`
    (1-based; 0: none)."""
    calls, interrupt_at = [], [0]

    def counting(gradient_of):
        def counted(*args, **options):
            calls.append(args[-1].clone())  # the controls
            if len(calls) == interrupt_at[0]:
                os.kill(os.getpid(), signal.SIGINT)
            return gradient_of(*args, **options)
        return counted

    for name, gradient_of in list(GRADIENTS.items()):
        monkeypatch.setitem(GRADIENTS, name, counting(gradient_of))
    monkeypatch.setattr(ParticleControl, "gradients", counting(ParticleControl.gradients))
    return calls, interrupt_at


PARTICLES = '[solver]\nmethod = "particles"\n[particles]\nn = 16\n'


def interrupted_training(tmp_path, capsys, counted_gradients, text, *options):
    """A training run uninterrupted (reference.nc), then again to out.nc with `options`, Ctrl-C landing in its 3rd
    evaluation: (case, reference, output, the reference's count of evaluations, the interrupted run's stderr)."""
    calls, interrupt_at = counted_gradients
    case = write_case(tmp_path, text)
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    total = len(calls)
    interrupt_at[0] = total + 3
    status, err = run_cli(["run", case, "-o", output, "--quiet", *options], capsys)
    assert status == 130 and len(calls) == total + 3 and not output.exists(), err
    calls.clear()
    interrupt_at[0] = 0
    return case, reference, output, total, err


# A model beyond the seeds': two heads, the two-layer feed-forward, B and V trained with W (at a tenth of the
# learning rate: the seeds' rate makes B and V blow the forward run up).
BEYOND = ('eps = 0.05\nfeed_forward = "mlp"\nhidden = 3\nextra_heads = [{beta = 2.0, V = [[0.5, 0.0], [0.0, 0.0]]}]\n',
          'train = ["W", "B", "V"]\n')


@pytest.mark.parametrize("optimizer, solver, beyond", [("adam", "", False), ("lbfgs", "", False),
                                                       ("lbfgs", PARTICLES, False), ("adam", "", True),
                                                       ("lbfgs", PARTICLES, True)])
def test_interrupted_training_resumes_from_its_evaluations_bit_for_bit(tmp_path, capsys, counted_gradients,
                                                                       optimizer, solver, beyond):
    """Ctrl-C during the 3rd evaluation keeps 3 evaluations; the resumed training replays them without
    computing them again and ends bit for bit where the uninterrupted training ends (W, J per iteration,
    the trained run, the adjoint, L-BFGS's count of evaluations in optimizer_stop); through particles too, and
    beyond the seeds' model (theta's trained entries in the journal; W1, b, W2, B, V in the output)."""
    calls, _ = counted_gradients
    text = (TRAINING_CASE.replace("eps = 0.05\n", BEYOND[0]).replace("learning_rate = 0.5", "learning_rate = 0.05")
            + BEYOND[1]) if beyond else TRAINING_CASE
    case, reference, output, total, err = interrupted_training(
        tmp_path, capsys, counted_gradients, text + f'optimizer = "{optimizer}"\n' + solver)
    assert total >= 5
    assert ("at the end of this evaluation of J and dJ/dW" in err
            and "checkpointed (3 evaluations of J and dJ/dW)" in err)

    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 0 and "resuming" in err and "(3 evaluations of J and dJ/dW)" in err, err
    assert len(calls) == total - 3
    assert_same_result(output, reference, VOLATILE | {"training_seconds"})
    assert not os.path.exists(checkpoint_folder(output))
    if beyond:
        with xr.open_dataset(output) as dataset:
            assert {"W1", "b", "W2", "B", "V"} <= set(dataset.variables) and dataset["B"].sizes["head"] == 2


def test_a_resumed_training_whose_path_differs_makes_the_rest_again(tmp_path, capsys, counted_gradients):
    """A stored evaluation whose controls differ from the optimizer's request (round-off on another machine,
    here a journal written again with the second evaluation's controls perturbed by 1e-12, its digests and
    manifest consistent, as that machine would write it) is not replayed: it and all after it are made
    again, with a warning; the checkpoint then holds the evaluations on the new path, so that a second
    interruption resumes without leaving it, and the training ends as an uninterrupted one."""
    calls, interrupt_at = counted_gradients
    case, reference, output, total, _ = interrupted_training(
        tmp_path, capsys, counted_gradients, TRAINING_CASE + 'optimizer = "adam"\n', "--checkpoint-steps", "1")
    resolved = spherepde.load_case(case)
    checkpoint = Checkpoint(output, resume=True)
    state, segments = checkpoint.load(resolved)
    evaluations = [evaluation for segment in segments for evaluation in journal._evaluations(segment)]
    evaluations[1].controls = evaluations[1].controls + 1e-12  # the second evaluation
    checkpoint.forget_segments()
    checkpoint.write({key: state[key] for key in ("case", "steps", "notes")},
                     journal._segment(evaluations, 1, journal._chain_start(resolved)), state["steps"])

    interrupt_at[0] = 2  # evaluations 1 and 2 made again, then Ctrl-C
    status = run_cli(["run", case, "-o", output, "--quiet", "--resume", "--checkpoint-steps", "1"], capsys)[0]
    assert status == 130 and len(calls) == 2

    calls.clear()
    interrupt_at[0] = 0
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 0 and "(3 evaluations of J and dJ/dW)" in err, err
    assert len(calls) == total - 3  # the 3 stored evaluations replayed: the stored path is the optimizer's now
    note = "left its stored path at evaluation 2: the 2 stored evaluations from there on were made again"
    assert f"warning: the resumed training {note}" in err
    with xr.open_dataset(output) as dataset:
        assert f"the resumed training {note}" in dataset.attrs["notes"].splitlines()
    assert_same_result(output, reference, VOLATILE | {"training_seconds", "notes"})


def test_an_interrupt_during_the_replay_stops_the_resumed_training(tmp_path, capsys, counted_gradients, monkeypatch):
    """Ctrl-C while the resumed training replays its stored evaluations stops it (exit 130) with its
    checkpoint, having computed nothing; resumed again, it ends as the uninterrupted one."""
    calls, _ = counted_gradients
    case, reference, output, _, _ = interrupted_training(tmp_path, capsys, counted_gradients,
                                                         TRAINING_CASE + 'optimizer = "adam"\n')
    replayed = []

    def interrupting(evaluation, controls, _answer=journal._answer):
        replayed.append(controls)
        if len(replayed) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return _answer(evaluation, controls)

    monkeypatch.setattr(journal, "_answer", interrupting)
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 130 and "checkpointed (3 evaluations of J and dJ/dW)" in err and calls == [], err
    monkeypatch.undo()  # also the counting: from here on the evaluations are the real ones
    assert run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)[0] == 0
    assert_same_result(output, reference, VOLATILE | {"training_seconds"})


def test_an_interrupt_during_a_trainings_last_checkpoint_acts_once_it_is_stored(tmp_path, capsys, counted_gradients,
                                                                               monkeypatch):
    """Ctrl-C landing while a training stores its evaluations after the optimizer returned (where an interrupt
    stops at once) acts once they are stored: the resumed training replays them all, computes none, and ends as
    the uninterrupted one.  It cut the write, leaving no checkpoint: every evaluation was lost."""
    calls, _ = counted_gradients
    case = write_case(tmp_path, TRAINING_CASE + 'optimizer = "adam"\n')
    reference, output = tmp_path / "reference.nc", tmp_path / "out.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    total, write = len(calls), Checkpoint.write

    def interrupted(self, *args):
        if not self.stepping:  # the evaluations stored after the optimizer returned
            os.kill(os.getpid(), signal.SIGINT)
        return write(self, *args)
    monkeypatch.setattr(Checkpoint, "write", interrupted)
    status, err = run_cli(["run", case, "-o", output, "--quiet"], capsys)
    assert status == 130 and f"checkpointed ({total} evaluations of J and dJ/dW)" in err, err
    monkeypatch.setattr(Checkpoint, "write", write)
    calls.clear()
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    assert status == 0 and calls == [], err
    assert_same_result(output, reference, VOLATILE | {"training_seconds"})


def test_a_checkpoint_that_holds_no_training_is_one_line(tmp_path, capsys, counted_gradients):
    """A segment of another run in a training's checkpoint (an Eulerian run's saves): exit 2, one line."""
    case, _, output, _, _ = interrupted_training(
        tmp_path, capsys, counted_gradients, TRAINING_CASE + 'optimizer = "adam"\n', "--checkpoint-steps", "1")
    (tmp_path / "other").mkdir()
    other = tmp_path / "other" / "other.nc"
    assert run_cli(["run", write_case(tmp_path / "other", SMALL_S1), "-o", other, "--quiet"], capsys)[0] == 0
    os.replace(other, os.path.join(checkpoint_folder(output), "segment-00000.nc"))
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    # refused before the resumption is announced, naming the file (tests/test_integrity.py: every other way)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "resuming" not in err, err
    assert "segment-00000.nc' does not match the checkpoint's manifest" in err and "--overwrite" in err
    assert not output.exists()


def test_a_journal_segment_writes_its_strings_as_text_and_reads_them_back(tmp_path):
    """A checkpoint segment's failure messages and digests are numpy str arrays (xarray before 2025.8 cannot write
    strings held as Python objects under pandas 3: every checkpoint failed there), and they come back from the file
    as written, with the numbers bit for bit."""
    import torch

    from solvers.controlled_forward import Gradient
    from spherepde.io.output import write_dataset

    controls = np.arange(8.0).reshape(2, 2, 2)
    gradient = Gradient(1.5, 1.25, torch.full((2, 2, 2), 0.1, dtype=torch.float64), [0.0, 0.5], [2.0, 3.0])
    evaluations = [journal.Evaluation(controls, gradient), journal.Evaluation(controls + 1, None, "blew up at t = 1")]
    segment = journal._segment(evaluations, 4, "0" * 64)
    assert all(segment[name].dtype.kind == "U" for name in ("failure", "digest"))
    write_dataset(segment, tmp_path / "segment.nc")
    with xr.open_dataset(tmp_path / "segment.nc") as stored:
        assert stored["failure"].values.tolist() == ["", "blew up at t = 1"]
        assert stored["digest"].values.tolist() == segment["digest"].values.tolist()
        assert len(set(stored["digest"].values.tolist())) == 2 and len(stored["digest"].values[0]) == 64
        np.testing.assert_array_equal(stored["dW"].values[0], np.full((2, 2, 2), 0.1))
        assert stored["cost"].values[0] == 1.5 and np.isnan(stored["cost"].values[1])


def test_a_refused_resume_names_the_key_and_both_values_as_a_case_file_writes_them():
    from solvers.checkpoint import _difference

    stored = "[solver]\nchunk = 8\n[diagnostics]\nw2 = true\n"
    assert _difference(stored, "[solver]\nchunk = 8\nthreads = 2\n[diagnostics]\nw2 = true\n") == (
        "solver.threads = absent there, 2 now")
    assert _difference(stored, "[solver]\nchunk = 8\n[diagnostics]\nw2 = false\n") == (
        "diagnostics.w2 = true there, false now")


def test_a_run_with_a_W_per_layer_resumes_from_a_checkpoint_after_a_layer_boundary(tmp_path, capsys):
    """Three layers' W over t_end = 1.5, saves every 0.4: the run's intervals end at the layer boundaries 0.5 and
    1.0 too, and a checkpoint in an interval that one bounds was refused (at t = 0.45: "takes steps of dt = 0.05,
    which do not divide its save interval [0.4, 0.8] in 2"; after 0.5: "is in save interval 2, not in the one after
    the segments' last save (1)").  Interrupted at each of its checkpoints in turn (every 3 steps of 0.05), the
    resumed run is the uninterrupted one bit for bit."""
    layers = "W = [[[0.0, -1.0], [1.0, 0.0]], [[0.0, 0.5], [-0.5, 0.0]], [[0.2, 0.0], [0.0, -0.2]]]\n"
    text = SMALL_S1.replace("eps = 0.1\n", "eps = 0.1\n" + layers).replace("t_end = 0.5", "t_end = 1.5").replace(
        "save_every = 0.25", "save_every = 0.4")
    case = write_case(tmp_path, text)
    reference = tmp_path / "reference.nc"
    assert run_cli(["run", case, "-o", reference, "--quiet"], capsys)[0] == 0
    for checkpoints in range(1, 11):
        output = tmp_path / f"out-{checkpoints}.nc"
        interrupt(case, output, checkpoints=checkpoints, every_steps=3)
        state = state_of(output)
        status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
        assert status == 0, (checkpoints, state["t"], err)
        assert_same_result(output, reference)


def test_a_signal_as_the_command_ends_leaves_its_status_and_removes_the_lock_file(tmp_path, capsys, monkeypatch):
    from spherepde.io import locking

    case = write_case(tmp_path, SMALL_S1)
    output = tmp_path / "out.nc"
    release = locking.release_all

    def release_signalled():  # a SIGTERM (a scheduler's end of time) as the finished command releases its lock
        os.kill(os.getpid(), signal.SIGTERM)
        release()

    monkeypatch.setattr(locking, "release_all", release_signalled)
    acted_on = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: acted_on.append(signum))
    try:
        status, err = run_cli(["run", case, "-o", output, "--quiet"], capsys)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert status == 0 and acted_on == [], err
    assert not os.path.exists(f"{output}.lock") and "SIGTERM came as the command ended" in err
    with xr.open_dataset(output) as result:
        assert float(result["time"][-1]) == 0.5


def test_a_checkpoint_folder_without_write_access_is_refused_before_the_steps(tmp_path, capsys, monkeypatch):
    from spherepde.io import output as output_module

    case = write_case(tmp_path)
    output = tmp_path / "out.nc"
    with monkeypatch.context() as patch:  # interrupted at step 40: a checkpoint to resume
        calls = []
        real_due = Checkpoint.due

        def due_then_interrupted(self, steps, last=False):
            if steps == 40 and not calls:
                calls.append(steps)
                self.interrupted = True
            return real_due(self, steps, last)

        patch.setattr(Checkpoint, "due", due_then_interrupted)
        assert run_cli(["run", case, "-o", output, "--quiet"], capsys)[0] == 130
    assert state_of(output)["steps"] == 40
    folder = checkpoint_folder(output)
    real_problem = output_module._folder_problem
    # root writes in a folder of mode 555: the folder's answer is what a user without write access gets
    monkeypatch.setattr(output_module, "_folder_problem", lambda path: f"no write access to {path!r}"
                        if os.path.abspath(path) == os.path.abspath(folder) else real_problem(path))
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume", "--checkpoint-steps", "20"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and "the checkpoint folder" in err, err
    assert state_of(output)["steps"] == 40 and not output.exists()


def test_a_checkpoint_that_cannot_be_removed_after_the_output_is_written_is_a_warning(tmp_path, capsys, monkeypatch):
    case = write_case(tmp_path)
    output = tmp_path / "out.nc"

    real_remove = Checkpoint.remove

    def read_only_once_written(self):  # the folder made read-only as the run went on
        if not output.exists():
            return real_remove(self)
        raise PermissionError(13, "Permission denied", os.path.join(self.folder, "state-00001.pt"))

    monkeypatch.setattr(Checkpoint, "remove", read_only_once_written)
    status, err = run_cli(["run", case, "-o", output, "--quiet", "--checkpoint-steps", "50"], capsys)
    assert status == 0 and "could not be removed (Permission denied)" in err, err
    with xr.open_dataset(output) as result:
        assert result.attrs["status"] == "completed" and float(result["time"][-1]) == 2.0


def test_an_output_path_with_room_for_its_checkpoint_files_runs_and_one_without_is_refused_at_once(tmp_path, capsys):
    from spherepde.io.output import DERIVED_PATH_BYTES

    case = write_case(tmp_path)
    limit = os.pathconf(tmp_path, "PC_PATH_MAX")

    def output_of(length):  # an absolute output path of `length` bytes, in folders of 200-byte names
        folder = str(tmp_path)
        while len(folder) + 201 + 20 < length:
            folder = os.path.join(folder, "f" * 200)
        os.makedirs(folder, exist_ok=True)
        return os.path.join(folder, "o" * (length - len(folder) - 4) + ".nc")

    # the longest path taken: its checkpoint segments' temporary files lie 51 bytes below it, states' 63
    longest = output_of(limit - 1 - DERIVED_PATH_BYTES)
    status, err = run_cli(["run", case, "-o", longest, "--quiet", "--checkpoint-steps", "50"], capsys)
    assert status == 0, err
    with xr.open_dataset(longest) as result:
        assert float(result["time"][-1]) == 2.0
    status, err = run_cli(["run", case, "-o", output_of(limit - DERIVED_PATH_BYTES), "--quiet"], capsys)
    assert status == 2 and "the path is too long" in err and len(err.strip().splitlines()) == 1
