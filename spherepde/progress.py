"""Progress of a run: a bar with time remaining on a terminal, sparse log lines otherwise."""

import sys
import time

from tqdm import tqdm


class Progress:
    """Reports advancement in model time t in [0, total].

    enabled: None chooses by the stream (a bar on a terminal, a log line every
    `log_every_seconds` otherwise), False is silent, True forces the bar.
    """

    def __init__(self, total: float, enabled: bool | None = None, stream=sys.stderr, log_every_seconds: float = 30.0):
        self.total, self.stream, self.silent = total, stream, enabled is False
        use_bar = stream.isatty() if enabled is None else enabled
        self.bar = tqdm(total=total, file=stream, unit="t", bar_format="{l_bar}{bar}| {n:.3g}/{total:.3g} "
                        "[{elapsed}<{remaining}{postfix}]") if use_bar else None
        self.log_every, self.last_log = log_every_seconds, time.monotonic()

    def update(self, t: float, **values) -> None:
        if self.bar is not None:
            self.bar.update(t - self.bar.n)
            self.bar.set_postfix({k: f"{v:.3g}" for k, v in values.items()}, refresh=False)
        elif not self.silent and time.monotonic() - self.last_log >= self.log_every:
            self.last_log = time.monotonic()
            fields = " ".join(f"{k}={v:.4g}" for k, v in values.items())
            print(f"spherepde: t={t:.4g}/{self.total:.4g} {fields}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
