"""Progress of a run: a bar with time remaining on a terminal, sparse log lines otherwise."""

import contextlib
import os
import shutil
import sys
import threading
import time

from tqdm import tqdm

LOG_NAMES = {"dt": "dt", "mass": "mass", "min_density": "min rho", "max_speed": "max |v|", "tail": "tail"}


def terminal_shape(stream) -> tuple[int | None, int | None]:
    """The bar's (columns, lines): None, None (tqdm asks the terminal, and follows its resizing), but where the
    terminal reports 0 by 0 (a pseudo-terminal nobody sized: `script`, some containers) tqdm draws nothing at all;
    there COLUMNS and LINES or 80 by 24 (shutil's fallback)."""
    try:
        shape = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # not a terminal, or a stream without a descriptor
        return None, None
    return (None, None) if shape.columns > 0 and shape.lines > 0 else tuple(shutil.get_terminal_size())


class Progress:
    """Reports advancement in model time t in [start, total] (or in another `quantity` counted: a training's
    iterations, a sweep's members done) with the latest run values.

    enabled: None chooses by the stream (default: sys.stderr at the call; a bar on a terminal, a log
    line every `log_every_seconds` otherwise), False is silent, True forces the bar. The values passed
    to `update` (dt, mass, min_density, max_speed, tail: the resolution indicator) are kept
    and shown with every later refresh, so a log line always carries the latest of each.
    """

    def __init__(self, total: float, enabled: bool | None = None, stream=None, log_every_seconds: float = 30.0,
                 start: float = 0.0, quantity: str = "t"):
        # sys.stderr at the call, not at import: a test's or caller's redirection of stderr must be honoured
        stream = sys.stderr if stream is None else stream
        self.total, self.stream, self.silent, self.quantity, self.t = total, stream, enabled is False, quantity, start
        self.lock = threading.Lock()  # `running`'s thread and the caller's updates
        self.values: dict[str, float] = {}
        use_bar = stream.isatty() if enabled is None else enabled
        bar_format = "{l_bar}{bar}| {n:.3g}/{total:.3g} [{elapsed}<{remaining}{postfix}]"
        columns, lines = terminal_shape(stream)
        self.bar = tqdm(total=total, initial=start, file=stream, unit="t", bar_format=bar_format, ncols=columns,
                        nrows=lines) if use_bar else None
        self.log_every, self.started, self.start = log_every_seconds, time.monotonic(), start
        self.last_log = self.started

    def update(self, t: float, **values) -> None:
        """Advance to t (of the `quantity`); `values` replace the previous values of the same names."""
        with self.lock:
            self.values.update(values)
            self.t = t
            if self.bar is not None:
                self.bar.update(t - self.bar.n)
                if values:
                    self.bar.set_postfix({LOG_NAMES.get(k, k): f"{v:.3g}" for k, v in self.values.items()},
                                         refresh=False)
            elif not self.silent and time.monotonic() - self.last_log >= self.log_every:
                self.last_log = time.monotonic()
                print(self.log_line(t), file=self.stream, flush=True)

    def write(self, line: str) -> None:
        """A line of its own on the stream: above the bar on a terminal (`message`)."""
        with self.lock:
            message(line, self.stream)

    @contextlib.contextmanager
    def running(self):
        """Inside, a thread refreshes the bar's clock every second and prints the log lines as they fall due, where
        the work reports rarely (a sweep's members, a training's evaluations: one of them may take minutes); at the
        end, on an exception too, the bar is closed (left open, it was drawn again below the command's last line)."""
        stop, every = threading.Event(), min(1.0, self.log_every)

        def tick():
            while not stop.wait(every):
                if self.bar is not None:
                    with self.lock:
                        self.bar.refresh()
                else:
                    self.update(self.t)

        thread = threading.Thread(target=tick, daemon=True, name="spherepde-progress")
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.close()

    def log_line(self, t: float) -> str:
        """"spherepde: t=1.5/6 (25%) dt=0.01 mass=1 min rho=0.02 max |v|=0.9 tail=3e-9, 0:42 elapsed, ~2:06 left"."""
        elapsed = time.monotonic() - self.started
        fraction = t / self.total if self.total else 1.0
        done = t - self.start
        fields = "".join(f" {LOG_NAMES.get(k, k)}={v:.4g}" for k, v in self.values.items())
        remaining = f"~{_clock(elapsed * (self.total - t) / done)} left" if done > 0 else "time left unknown"
        return (f"spherepde: {self.quantity}={t:.4g}/{self.total:.4g} ({100 * fraction:.0f}%){fields}, "
                f"{_clock(elapsed)} elapsed, {remaining}")

    def close(self) -> None:
        with self.lock:
            if self.bar is not None:
                self.bar.close()


def message(line: str, stream=None) -> None:
    """A line for the user on `stream` (sys.stderr at the call): above the bars drawn there (tqdm.write clears and
    redraws them), so that it does not run on after one on its line, as a print did; plain where none is drawn."""
    tqdm.write(line, file=sys.stderr if stream is None else stream)


def _clock(seconds: float) -> str:
    """Seconds as h:mm:ss or m:ss."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
