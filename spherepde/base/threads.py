"""How many CPU threads torch uses during a run (solver.threads).

Extra threads pay only when each operation has enough work to share; on small grids they spin and wait, and
on a machine shared with other work they also take cores from it.  Measured on a 2-core machine shared with
two other users (cases/quickstart.toml to t = 1, CPU seconds, user + sys, one thread against two):
lmax 20: 1.8 against 6.7; lmax 64: 2.8 against 6.4; lmax 128: 8.6 against 42.3 (wall 13 s against 53 s).
Re-measured on 2026-12-06 beside other jobs (docs/getting-started.md): lmax 20 2.7 against 2.9, lmax 64 3.0
against 6.1 to 11.3, lmax 128 8.3 against 11.0 (wall 8.4 s against 6.6 s: a second thread saves wall time there
at a third more CPU).  So "auto" keeps one thread up to lmax 128 (the largest measured) and 2e4 particles (dense
attention blocks of 1 MiB, the same order of work per operation), and above those leaves torch's default, which follows
OMP_NUM_THREADS.  A number asks for exactly that many threads.  The same limit holds for the BLAS that numpy calls
(threadpoolctl): the particle step runs its products in numpy on the CPU (solvers/particle_step.py), and its
OpenBLAS would otherwise start threads of its own on large systems.  A number above the CPUs this process may use
is still taken (a run repeats its serial run's reductions only with the same count), with a warning
(spherepde.api.limits.oversubscription): 4095 threads on 2 cores made a run of a fraction of a second take over a
minute.
"""

from contextlib import contextmanager

import torch
from threadpoolctl import threadpool_limits

ONE_THREAD_LMAX = 128
ONE_THREAD_PARTICLES = 20_000


def run_threads(case) -> int:
    """solver.threads of `case`, "auto" resolved from the problem size (see the module docstring)."""
    setting = case["solver"].get("threads", "auto")
    if setting != "auto":
        return setting
    method = case["solver"]["method"]
    small_grid = method == "particles" or case["sphere"]["lmax"] <= ONE_THREAD_LMAX
    few_particles = method == "eulerian" or case["particles"]["n"] <= ONE_THREAD_PARTICLES
    return 1 if small_grid and few_particles else torch.get_num_threads()


@contextmanager
def threads_for(case, at_most: int | None = None):
    """Run the enclosed code with run_threads(case) torch threads and numpy BLAS threads, or `at_most` where fewer
    and solver.threads is "auto" (a sweep worker's share of the cores; a number is the case's own, as in its serial
    run, whose reductions it then repeats to the bit), then restore the caller's settings."""
    before, threads = torch.get_num_threads(), run_threads(case)
    if at_most is not None and case["solver"].get("threads", "auto") == "auto":
        threads = min(threads, at_most)
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(before)
