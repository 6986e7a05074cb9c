"""Limits checked before any work: inputs whose size alone would exhaust this machine's memory or time are
refused up front with one line (CaseError, exit status 2), not after minutes of allocation.

This module imports neither torch nor the solvers (importing torch alone takes about 220 MB), so that a refusal
costs what reading the case costs.  The case file's own limits (its size, its nesting, the ranges of its keys)
are in spherepde.io.case and spherepde.io.case_schema.
"""

import math
import os

from spherepde.base.errors import CaseError
from spherepde.base.memory import available_memory
from spherepde.discretisation.transforms.legendre import dealiased_gauss_latitudes

MAX_SEEDS = 10_000  # replicates of a sweep (`--seeds`): each is one run and one file
MAX_MEMBERS = 10_000  # runs of a sweep: every member is resolved and planned before the first runs
# Peak host memory of building the S^2 transform's Legendre tables over the tables themselves (measured for
# the torch backend: 3.1x at lmax 128, 3.8x at lmax 256 of 3 (lmax + 1)^2 nlat float64 numbers).
TABLE_PEAK_FACTOR = 3.0


def check_seeds(seeds: int | None) -> None:
    """A CaseError when a sweep asks for more than MAX_SEEDS replicates (before any seed is derived)."""
    if seeds is not None and seeds > MAX_SEEDS:
        raise CaseError(f"--seeds: {seeds} replicates; at most {MAX_SEEDS} (each is a run and a file)")


def check_members(counts: list[int], seeds: int | None) -> None:
    """A CaseError when a sweep of `counts` values per swept key, times `seeds` replicates, has more than
    MAX_MEMBERS members (before they are enumerated)."""
    members = math.prod(counts) * (seeds or 1)
    if members > MAX_MEMBERS:
        factors = [str(count) for count in counts] + ([f"{seeds} seeds"] if seeds else [])
        # one swept key alone read "10001 = 10001 members": the product only where there is one
        product = f"{' x '.join(factors)} = " if len(factors) > 1 else ""
        raise CaseError(f"--param: {product}{members} members; at most {MAX_MEMBERS} (each is a run and a file)")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the system has one, else all)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def oversubscription(case) -> str | None:
    """A warning's text where solver.threads of `case` is a number above `usable_cpus()`, else None."""
    setting, cpus = case["solver"].get("threads", "auto"), usable_cpus()
    if setting == "auto" or setting <= cpus:
        return None
    return (f"solver.threads = {setting} is more than the {cpus} CPUs this process may use: the threads share them "
            "and the run is slower, with the same numbers")


def table_bytes(lmax: int) -> int:
    """The host memory that building the S^2 grid of degree `lmax` needs: its three Legendre tables, (lmax + 1)^2
    values at each of the dealiased grid's latitudes, in float64, times TABLE_PEAK_FACTOR."""
    return int(TABLE_PEAK_FACTOR * 3 * (lmax + 1) ** 2 * dealiased_gauss_latitudes(lmax) * 8)


# An Eulerian S^2 run holds at least this many arrays of its grid's size at once (the density, the components of
# its velocity and flux, the nodes' coordinates and weights), on every backend.
GRID_COPIES = 8


def grid_bytes(lmax: int, itemsize: int, least_nlat: int = 0) -> int:
    """A lower bound of the memory that the S^2 grid of degree `lmax` takes in a run: GRID_COPIES arrays of its
    nlat x nlon >= nlat x 2 nlat nodes (nlat at least `least_nlat`: shtns's 32), of `itemsize` bytes each."""
    nlat = max(dealiased_gauss_latitudes(lmax), least_nlat)
    return GRID_COPIES * nlat * 2 * nlat * itemsize


# A particle run holds its positions (n, d) several times at once (the state, its stages' slopes, the noise draws,
# the field's temporaries): at least this many copies (about 14 measured at n = 1e6 on S^2).
PARTICLE_COPIES = 8


def check_memory(case) -> None:
    """A CaseError naming particles.n when the particles of `case` cannot be held PARTICLE_COPIES times,
    sphere.lmax when an Eulerian S^2 run cannot hold its grid's arrays (`grid_bytes`) and, on the torch transform,
    build its spherical-harmonic tables, or else time.save_every when its saves cannot be held (`saved_bytes`), in
    the memory this machine has left (the shtns backend keeps its own, smaller tables, and ends the process from C
    where it cannot allocate them: the grid's bound comes first; a grid beyond the memory is named as such, not by
    its saves)."""
    solver = case["solver"]
    available = available_memory()
    if available is None:
        return
    needed = particle_bytes(case)
    if needed > available:
        raise CaseError(f"particles.n: {case['particles']['n']} particles need at least {_size(needed)} of memory; "
                        f"this machine has {_size(available)} available (fewer particles)")
    if case.dim == 3 and solver["method"] != "particles":
        needed = grid_state_bytes(case) + shared_table_bytes(case)
        tables = "" if solver["backend"] == "shtns" else " and spherical-harmonic tables"
        if needed > available:
            raise CaseError(f"sphere.lmax: the S^2 grid of lmax {case['sphere']['lmax']} needs about {_size(needed)} "
                            f"of memory for its arrays{tables}; this machine has {_size(available)} available (lower "
                            "sphere.lmax)")
    needed = saved_bytes(case)
    if needed > available:
        raise CaseError(f"time.save_every: {save_count(case)} saves up to t_end = {case['time']['t_end']:g} need at "
                        f"least {_size(needed)} of memory (a run holds them until its output is written); this "
                        f"machine has {_size(available)} available (a larger time.save_every)")


def particle_bytes(case) -> int:
    """A lower bound of the memory a run's particles take: PARTICLE_COPIES copies of their (n, d) positions (0 for
    an Eulerian run)."""
    solver = case["solver"]
    if solver["method"] not in ("particles", "both"):
        return 0
    return PARTICLE_COPIES * case["particles"]["n"] * case.dim * (8 if solver["dtype"] == "float64" else 4)


# A run holds every save until its output is written, then stacks them into the output's arrays: twice at once.
SAVE_COPIES = 2


def save_count(case) -> int:
    """A lower bound of a run's save times: floor(t_end / save_every) + 1."""
    return math.floor(case["time"]["t_end"] / case["time"]["save_every"]) + 1


def saved_bytes(case) -> int:
    """A lower bound of the memory a run's saves take: SAVE_COPIES copies of the float64 density on its grid (S^2:
    nlat x 2 nlat nodes; S^1: at least 2 lmax + 1 points) and of the saved particles' positions (particles.save,
    d), at each of its `save_count` save times."""
    method, lmax = case["solver"]["method"], case["sphere"]["lmax"]
    values = 0
    if method != "particles":
        values += 2 * dealiased_gauss_latitudes(lmax) ** 2 if case.dim == 3 else 2 * lmax + 1
    if method != "eulerian":
        values += case["particles"]["save"] * case.dim
    return SAVE_COPIES * save_count(case) * values * 8


def grid_state_bytes(case) -> int:
    """A lower bound of the memory an Eulerian S^2 run's grid arrays take (`grid_bytes`; the shtns backend's grid
    works in float64 whatever the run's dtype); 0 for a particle run and on S^1."""
    solver = case["solver"]
    if case.dim != 3 or solver["method"] == "particles":
        return 0
    if solver["backend"] == "shtns":
        return grid_bytes(case["sphere"]["lmax"], 8, least_nlat=32)
    return grid_bytes(case["sphere"]["lmax"], 8 if solver["dtype"] == "float64" else 4)


def shared_table_bytes(case) -> int:
    """The memory of building the torch transform's spherical-harmonic tables of an Eulerian S^2 run
    (`table_bytes`), which the members of a batch share; 0 for the shtns backend, a particle run and S^1."""
    solver = case["solver"]
    if case.dim != 3 or solver["method"] == "particles" or solver["backend"] == "shtns":
        return 0
    return table_bytes(case["sphere"]["lmax"])


def largest_batch(cases: list, workers: int) -> int | None:
    """The most members of `cases` that one batch may hold so that `workers` batches running at once on this
    machine fit the memory it has left: a batch holds each member's particles, grid arrays and saves
    (`particle_bytes`, `grid_state_bytes`, `saved_bytes`) and one set of tables (`shared_table_bytes`).  At least 1
    (a member alone was checked by `check_memory`); None where the memory cannot be read or the members hold nothing
    that grows with them."""
    available = available_memory()
    per_member = max(particle_bytes(case) + grid_state_bytes(case) + saved_bytes(case) for case in cases)
    if available is None or per_member == 0:
        return None
    tables = max(shared_table_bytes(case) for case in cases)
    return max(1, (available // workers - tables) // per_member)


def _size(count: int) -> str:
    """A byte count in binary units, e.g. "2.6 TiB"."""
    value, unit = float(count), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.3g} {unit}"
