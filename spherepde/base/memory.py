"""The process's memory: what it can still get (`available_memory`), and glibc's heap during a run, where freed
memory is kept for the next step instead of going back to the kernel.

glibc serves a request above its mmap threshold with a fresh mapping, and returns the free top of its heap to the
kernel once it exceeds the trim threshold; both thresholds follow the largest chunk recently freed (128 KiB at the
start, the trim threshold twice the other).  Every page given back and taken again costs a page fault, in which the
kernel zeroes it.  A time step allocates and frees its temporaries at every stage (torch's CPU tensors come straight
from malloc), so a step whose temporaries vary in size over a few MB keeps giving its pages back: measured on the S^2
quick-start at lmax 32 with 16 members (a 2-core machine, one thread, a training on the other core), 9,000-11,700
minor faults a step and 3.2-4.1 ms per member, against no faults and 2.1-2.4 ms with the thresholds below.  One
member (5.2 ms) and S^1 (temporaries of tens of KB) are unchanged.  PyTorch's CPU performance guide recommends
jemalloc or tcmalloc for the same reason; fixed glibc thresholds need no preloaded library.

`keep_freed_memory` sets the mmap threshold to 32 MiB (glibc's largest) and the trim threshold to 256 MiB, under
glibc, unless the environment sets glibc's malloc itself (MALLOC_*_ variables, GLIBC_TUNABLES), which it leaves
alone.  The price: the process keeps up to 256 MiB of freed memory.  Dask's nanny starts its workers with
MALLOC_TRIM_THRESHOLD_ = 65536 (distributed.nanny.pre-spawn-environ, to give memory back eagerly), which would turn
every stage's temporaries into page faults; `environment` holds the same thresholds as variables, which
spherepde.api.sweep puts in its local workers' environment instead (a cluster of your own keeps its settings).
"""

import ctypes
import functools
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 * 2 ** 20
TRIM_THRESHOLD = 256 * 2 ** 20


def glibc() -> bool:
    """Whether this process runs on glibc."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, ValueError, OSError):
        return False


def environment() -> dict:
    """glibc's environment variables for the thresholds of `keep_freed_memory`, read by a process at its start."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


@functools.cache
def keep_freed_memory() -> bool:
    """Set glibc's thresholds (module docstring), once per process; whether they were set."""
    if not glibc():
        return False
    if any(name.startswith("MALLOC_") and name.endswith("_") for name in os.environ) or (
            "malloc" in os.environ.get("GLIBC_TUNABLES", "")):
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                                       TRIM_THRESHOLD))


def available_memory() -> int | None:
    """Bytes of memory this process can still get: the least of MemAvailable (/proc/meminfo), the cgroup's
    limit less its usage, and the address-space limit; None where none of them can be read."""
    bounds = []
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    bounds.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as limit, open("/sys/fs/cgroup/memory.current") as usage:
            text = limit.read().strip()
            if text != "max":
                bounds.append(int(text) - int(usage.read().strip()))
    except (OSError, ValueError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            bounds.append(soft)
    except (ImportError, OSError, ValueError):
        pass
    return min(bounds) if bounds else None
