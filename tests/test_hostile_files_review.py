"""Files that are no result handed to the commands that read results (info, plot, compare)."""

import contextlib
import os
import threading

import pytest
from test_cli import run_cli


@contextlib.contextmanager
def writer_comes(pipe):
    """While inside, open and close the write end of the named pipe `pipe` whenever a reader waits on it: a reader
    blocked in open() (no writer) gets end-of-file instead of waiting for ever, so that a test of a command that
    opens the pipe fails rather than hangs."""
    done = threading.Event()

    def release():
        while not done.wait(0.02):
            try:
                os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO while no reader waits
            except OSError:
                pass

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.parametrize("command", ["info", "plot", "compare"])
def test_reader_refuses_named_pipe(tmp_path, capsys, command):
    """A named pipe given as a result: one line naming it, exit 2, nothing written; before, info, plot and compare
    waited in open() for a writer that never came (killed after 20 s by `timeout`, exit 124)."""
    pipe = tmp_path / "run.nc"
    os.mkfifo(pipe)
    arguments = {"info": [pipe], "plot": [pipe, "-o", tmp_path / "figures"],
                 "compare": [pipe, tmp_path / "other.nc", "-o", tmp_path / "report"]}[command]
    with writer_comes(pipe):
        status, err = run_cli([command, *arguments], capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(pipe) in lines[0] and "a pipe" in lines[0], err
    assert sorted(os.listdir(tmp_path)) == ["run.nc"]
