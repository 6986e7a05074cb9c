"""Progress: a bar with time remaining on a terminal, sparse log lines with the run's values otherwise."""

import io
import subprocess
import sys

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
