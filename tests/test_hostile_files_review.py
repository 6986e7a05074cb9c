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
    opens the pipe fails rather than hangs.  Yields the list of the times it released a reader."""
    done, released = threading.Event(), []

    def release():
        while not done.wait(0.02):
            try:
                os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO while no reader waits
                released.append(1)
            except OSError:
                pass

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield released
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


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_resume_refuses_a_checkpoint_segment_that_is_a_named_pipe(tmp_path, capsys):
    """A checkpoint's segment replaced by a named pipe: the resume waited in open() for a writer (its digest is read
    before the resume trusts it); it is refused in one line naming the segment, exit 2."""
    import glob

    from test_resume import interrupt, write_case

    case, output = write_case(tmp_path), tmp_path / "out.nc"
    interrupt(case, output, checkpoints=1)
    segment = sorted(glob.glob(str(tmp_path / "out.nc.checkpoint" / "segment-*.nc")))[0]
    os.remove(segment)
    os.mkfifo(segment)
    with writer_comes(segment) as released:
        status, err = run_cli(["run", case, "-o", output, "--quiet", "--resume"], capsys)
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and os.path.basename(segment) in lines[0], err
    assert "is not a regular file" in lines[0] and not released, err


@pytest.mark.parametrize("engine, signature", [("netcdf4", b"\x89HDF"), ("scipy", b"CDF\x02")])
def test_run_of_a_result_file_names_it_a_netcdf_file(tmp_path, capsys, engine, signature):
    """A result handed to `run` in place of its case: one line saying it is a NetCDF file and where its case is
    (before: "not UTF-8 text (invalid start byte at byte 0)" for NetCDF-4, a TOML error for the classic format),
    exit 2, no output."""
    import xarray as xr

    result = tmp_path / "run.nc"
    xr.Dataset({"mass": ("time", [1.0])}, attrs={"case": "[case]\nname = 'x'\n"}).to_netcdf(result, engine=engine)
    assert result.read_bytes().startswith(signature)
    status, err = run_cli(["run", result, "-o", tmp_path / "out"], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "a NetCDF file" in err and "attrs['case']" in err
    assert not (tmp_path / "out").exists()
