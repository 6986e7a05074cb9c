"""Python's cyclic garbage collector during a run: the objects that exist when a run is set up are exempted from it.

A full collection scans every object the collector tracks: with torch, numpy and spherepde imported some 260,000,
116 ms on the project's machine.  A training's tape keeps thousands of small containers per evaluation (the steps'
tokens) that survive the young collections, and their count sets off a full collection about once an evaluation:
measured on seed 004's S^1 case at T = 80, one member, 326 us a step without one and 354 with (2-3% of a training),
and up to a third of a short evaluation's time at T = 8, which made the benchmarks' evaluations jump from run to run.

`freeze_setup` moves the objects that exist when it is called with none frozen (the imported modules', the run's
setup) to the collector's permanent generation (gc.freeze); a full collection then scans only what came later.
Frozen objects are still freed by reference counting, but a cycle among them is never collected, also one that
becomes garbage later: in a notebook, whose objects all exist when a run starts (figures, earlier Datasets), every
cycle of them would stay for the life of the kernel.  So `spherepde.run` ends its run inside `thawed_after`, which
gives the frozen objects back to the collector (gc.unfreeze) when the run froze them; the command line's one run per
process ends with its process, and a problem set up outside a run (a benchmark, a test) stays frozen.
"""

import contextlib
import gc


def freeze_setup() -> None:
    """Exempt every object that exists now from full collections, unless some are exempt already (an earlier
    problem's setup in this run or process, or the caller's own gc.freeze, which `thawed_after` must not undo)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()


@contextlib.contextmanager
def thawed_after():
    """Run the block, then unfreeze what `freeze_setup` froze in it (nothing when objects were frozen before)."""
    frozen_before = gc.get_freeze_count()
    try:
        yield
    finally:
        if frozen_before == 0 and gc.get_freeze_count():
            gc.unfreeze()
