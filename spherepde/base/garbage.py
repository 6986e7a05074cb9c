"""Python's cyclic garbage collector during a run: the objects that exist when a run is set up are exempted from it.

A full collection scans every object the collector tracks: with torch, numpy and spherepde imported some 260,000,
116 ms on the project's machine.  A training's tape keeps thousands of small containers per evaluation (the steps'
tokens) that survive the young collections, and their count sets off a full collection about once an evaluation:
measured on seed 004's S^1 case at T = 80, one member, 326 us a step without one and 354 with (2-3% of a training),
and up to a third of a short evaluation's time at T = 8, which made the benchmarks' evaluations jump from run to run.

`freeze_setup` moves the objects that exist at its first call (the imported modules', the run's setup) to the
collector's permanent generation (gc.freeze), once per process; a full collection then scans only what came later.
Frozen objects are still freed by reference counting; only cycles among them that are garbage already stay.
"""

import functools
import gc


@functools.cache
def freeze_setup() -> None:
    """Exempt every object that exists now from full collections, at the first call in this process."""
    gc.freeze()
