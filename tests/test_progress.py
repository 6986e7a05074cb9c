"""Progress: a bar with time remaining on a terminal, sparse log lines with the run's values otherwise."""

import io
import subprocess
import sys

import pytest
from test_cli import SMALL_S1

from spherepde.base.progress import Progress


def test_log_lines_carry_the_latest_values():
    stream = io.StringIO()
    progress = Progress(2.0, stream=stream, log_every_seconds=0)
    progress.update(0.0, dt=0.01, max_speed=0.75)
    progress.update(0.5, mass=1.0, min_density=0.0123, tail=3e-9)
    progress.update(1.0)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    last = lines[-1]
    assert last.startswith("spherepde: t=1/2 (50%) ")
    for field in ("dt=0.01", "max |v|=0.75", "mass=1", "min rho=0.0123", "tail=3e-09", "elapsed", "left"):
        assert field in last, field
    assert "time left unknown" in lines[0]  # no progress yet: no estimate


def test_bar_on_a_terminal_and_silence_when_asked():
    stream = io.StringIO()
    progress = Progress(4.0, enabled=True, stream=stream, start=1.0)
    progress.update(2.0, dt=0.5, mass=1.0)
    progress.close()
    text = stream.getvalue()
    assert "%|" in text and "dt=0.5" in text and "2/4" in text and "25%" in text  # starts at 1 of 4 on resume
    quiet = io.StringIO()
    silent = Progress(1.0, enabled=False, stream=quiet, log_every_seconds=0)
    silent.update(0.5, mass=1.0)
    silent.close()
    assert quiet.getvalue() == ""


def test_a_short_run_stays_quiet_in_logs(tmp_path):
    case = tmp_path / "case.toml"
    case.write_text(SMALL_S1)
    result = subprocess.run([sys.executable, "-m", "spherepde", "run", str(case), "-o", str(tmp_path / "out.nc")],
                            capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stderr.splitlines() == [f"spherepde: wrote {tmp_path / 'out.nc'}"]


def test_a_particle_run_reports_its_steps_between_saves(monkeypatch, capsys):
    """A particle run's progress moved at its saves only: one save interval of 10 steps gave one log line, at its
    end, so a run saving every few minutes was silent in a log for minutes (and its bar stood still on a
    terminal).  Now every step advances it, as the Eulerian run's steps do."""
    import functools

    import solvers.particles
    import spherepde

    monkeypatch.setattr(solvers.particles, "Progress", functools.partial(Progress, log_every_seconds=0))
    case = spherepde.load_case_text(SMALL_S1, ["solver.method='particles'", "particles.n=20", "time.save_every=0.5"])
    spherepde.run(case)  # stderr is captured, no terminal: log lines
    times = [line.split()[1] for line in capsys.readouterr().err.splitlines()]
    # t after each of the 10 steps of dt = 0.05, then the save at t_end
    assert times[:3] == ["t=0.05/0.5", "t=0.1/0.5", "t=0.15/0.5"] and len(times) == 11, times


@pytest.mark.parametrize("method, hooks", [("eulerian", "solvers.eulerian.ForwardHooks"),
                                           ("particles", "solvers.particles.ParticleHooks")])
def test_an_interrupted_run_ends_its_bar_line(monkeypatch, capsys, method, hooks):
    """Ctrl-C in the steps left the bar open: the command's "interrupted" line ran on after the bar, on its line,
    and the bar was drawn again below it as the process ended.  The run closes its bar (a newline) as it stops."""
    import importlib

    import spherepde

    module, name = hooks.rsplit(".", 1)
    hooks_class = getattr(importlib.import_module(module), name)
    step, bars = hooks_class.after_step, []

    def interrupted_at_the_third_step(self, plan, done, state):
        step(self, plan, done, state)
        bars.append(self.bar.bar)
        if len(bars) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(hooks_class, "after_step", interrupted_at_the_third_step)
    case = spherepde.load_case_text(SMALL_S1, [f"solver.method='{method}'", "particles.n=20"])
    with pytest.raises(KeyboardInterrupt):
        spherepde.run(case, progress=True)
    assert bars[-1].disable  # tqdm's closed bar (held here: one left open is closed only when collected)
    err = capsys.readouterr().err
    assert "0.15/0.5" in err.rsplit("\r", 1)[-1] and err.endswith("]\n"), repr(err[-200:])


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_a_training_stopped_by_an_exception_closes_its_bar(monkeypatch, optimizer):
    """A training's optimizer loop stopped by an exception (a first evaluation's failure, Ctrl-C) left its bar open,
    drawn again below the command's last line; it closes it as it stops."""
    import torch

    from solvers import optimizers

    bars = []
    opened = optimizers.Progress

    def kept(*args, **kwargs):
        bars.append(opened(*args, **kwargs))
        return bars[-1]

    def interrupted(controls):
        raise KeyboardInterrupt

    monkeypatch.setattr(optimizers, "Progress", kept)
    control = {"optimizer": optimizer, "iterations": 3, "learning_rate": 0.1, "tol": 0.0}
    with pytest.raises(KeyboardInterrupt):
        optimizers.optimise(control, torch.zeros(2, 2, dtype=torch.float64), 1, interrupted, progress=True)
    assert len(bars) == 1 and bars[0].bar.disable  # tqdm's closed bar


def test_a_line_written_beside_the_bar_stands_whole_above_it_while_a_thread_ticks():
    """A sweep's member lines, written while its bar is drawn and a thread refreshes the bar's clock: each is a
    line of its own, the bar drawn again below it (not a line run on after the bar)."""
    stream = io.StringIO()
    bar = Progress(2.0, enabled=True, stream=stream, quantity="members")
    with bar.running():
        bar.write("spherepde: member 0 (model.eps=0.2) completed [1/2]")
        bar.update(1.0)
    out = stream.getvalue()
    line = "spherepde: member 0 (model.eps=0.2) completed [1/2]\n"
    assert line in out and out.index(line) < out.rindex("1/2") and not out.split(line)[0].endswith("]"), repr(out)


def test_a_training_logs_during_an_evaluation_longer_than_the_log_interval(monkeypatch, capsys):
    """A training's log line came at each iteration's end only, and one evaluation of J and dJ/dW can take minutes
    at the seeds' scale, where a log gets a line every 30 s (docs/design.md; here every 0.1 s, an evaluation 0.5 s)."""
    import functools
    import re
    import time

    import torch

    from solvers import optimizers
    from solvers.controlled_forward import Gradient

    monkeypatch.setattr(optimizers, "Progress", functools.partial(Progress, log_every_seconds=0.1))

    def slow(controls):
        time.sleep(0.5)
        return Gradient(1.0, 1.0, torch.zeros_like(controls), [], [])

    control = {"optimizer": "gd", "iterations": 1, "learning_rate": 0.1, "tol": 0.0}
    optimizers.optimise(control, torch.zeros(2, 2, dtype=torch.float64), 1, slow, progress=None)
    lines = capsys.readouterr().err.splitlines()
    waiting = [line for line in lines if re.fullmatch(r"spherepde: iteration=0/1 \(0%\), \d+:\d\d elapsed, .*", line)]
    assert len(waiting) >= 2, lines


def test_the_interrupts_line_stands_on_its_own_line_while_a_bar_is_drawn():
    """The checkpointing run's "interrupted: checkpointing ..." was printed while the bar was drawn, and ran on
    after the bar on its line; progress.message writes it above the bar, which is drawn again below it."""
    from spherepde.base.progress import message

    stream = io.StringIO()
    bar = Progress(2.0, enabled=True, stream=stream)
    bar.update(1.0)
    message("spherepde: interrupted: checkpointing at the end of this step", stream)
    bar.close()
    segments = stream.getvalue().split("\r")
    said = next(k for k, segment in enumerate(segments) if "interrupted" in segment)
    assert segments[said].startswith("spherepde: interrupted") and segments[said].endswith("\n"), segments
    assert "1/2" in "".join(segments[said + 1:]), segments  # the bar drawn again below it


def test_a_terminal_that_reports_no_width_still_gets_a_bar(monkeypatch):
    """A fresh pseudo-terminal reports 0 columns (as under `script`): tqdm, asking it for the width of a bar on
    sys.stderr, then drew empty lines."""
    import os
    import pty
    import select

    monkeypatch.delenv("COLUMNS", raising=False)
    leader, follower = pty.openpty()
    assert os.get_terminal_size(follower).columns == 0
    with os.fdopen(follower, "w") as stream:
        monkeypatch.setattr(sys, "stderr", stream)
        progress = Progress(4.0)
        progress.update(2.0, dt=0.5)
        progress.close()
    text = b""
    while select.select([leader], [], [], 0.5)[0]:  # a pty hands its output over in pieces
        try:
            text += os.read(leader, 65536)
        except OSError:  # EIO: all read, the follower closed
            break
    os.close(leader)
    text = text.decode()
    assert "50%|" in text and "2/4" in text and "dt=0.5" in text
    assert max(len(line) for line in text.replace("\r", "\n").splitlines()) <= 80
