"""The signals a command stops on as on Ctrl-C, and a block they wait for.

SIGINT (Ctrl-C) and SIGTERM (`kill`, a batch scheduler's end of time) stop a command with its clean-up run
(spherepde/cli.py).  An interrupt that lands inside a NetCDF write is raised while xarray holds its file lock, and
the write's own clean-up then waits on that lock forever; `held` keeps such a signal until the block ends.
"""

import contextlib
import os
import signal
import threading

INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held(absorbed: bool = False):
    """Run the block with SIGINT and SIGTERM held, then act on the first one that came as its handler before the
    block would have: call it (a Python handler, KeyboardInterrupt by default for SIGINT), or end the process
    (SIG_DFL).  `absorbed`: act on none, the block having done what the command was for; the block gets the list
    of the signals that came (empty outside the main thread, where no handler can be set and the block runs as it
    is)."""
    received = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    # a signal ignored stays ignored: it neither comes to the block nor is acted on after it
    previous = {number: signal.signal(number, lambda signum, frame: received.append(signum)) for number in INTERRUPTS
                if signal.getsignal(number) is not signal.SIG_IGN}
    try:
        yield received
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if received and not absorbed:
            handler = previous[received[0]]
            if callable(handler):
                handler(received[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), received[0])
