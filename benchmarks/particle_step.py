"""A particle run's Heun step on S^2 for one system of n tokens (the seed-003 baseline at beta = 30, eps = 0), three
ways side by side, and the arithmetic floor:

    whole    solvers/particle_step.py's program with each stage's (n, n) kernel formed at once (as before 0.2.0's
             blocks: KERNEL_BLOCK_BYTES set beyond the kernel; as a training's kept stages), where that kernel
             fits particle_field.DIRECT_BYTES (2896 tokens), "-" beyond;
    blocks   the same program, the kernel formed KERNEL_BLOCK_BYTES of query rows at a time (a forward run's, at
             any n);
    torch    the generic path: particle_field.SystemKernel's shifted sums in torch's 1 MiB blocks (a forward run's
             beyond 2896 tokens before 0.2.0; a training's there);
    floor    2 n^2 exps at the core's rate on a cache-sized block (floors.exp_rate: the faster of numpy's and
             torch's exp), plus the stages' products (the logits 2 d n^2 and the sums 2 (d + 1) n^2 flops each) at
             the core's dgemm peak.

One thread, thread CPU time, the median of --repeats steps after one warm-up.

    OMP_NUM_THREADS=1 python benchmarks/particle_step.py [--n 250 1000 2000 2800 5000 10000] [--repeats 5]
"""

import argparse
import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from floors import clock, exp_rate, use_threads  # noqa: E402

import spherepde  # noqa: E402
from solvers import particle_step  # noqa: E402
from solvers.particle_field import DIRECT_BYTES  # noqa: E402
from solvers.particles import ParticleSystem  # noqa: E402
from spherepde.discretisation.timesteppers import EXPLICIT_TABLEAUX, explicit_flow  # noqa: E402

CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases", "seed003-baseline-beta30.toml")


def step_times(n: int, repeats: int) -> dict:
    """Seconds of one Heun step of n tokens: the program whole (within DIRECT_BYTES) and in blocks, and the generic
    torch path."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = spherepde.load_case(CASE, [f"particles.n={n}", "particles.save=0"])
    system = ParticleSystem(case)
    x, W, integrator = system.x0, system.drives[:, 0], system.integrator
    blocks = particle_step.KERNEL_BLOCK_BYTES
    times = {"whole": None}
    for name, block_bytes in (("whole", 8 * n * n), ("blocks", blocks)):
        if block_bytes > DIRECT_BYTES:
            continue
        particle_step.KERNEL_BLOCK_BYTES = block_bytes
        integrator.step(x, W, 0.01, 0, 2, iter(()))
        times[name] = clock(lambda: integrator.step(x, W, 0.01, 0, 2, iter(())), repeats)
    particle_step.KERNEL_BLOCK_BYTES = blocks
    assert integrator.program is not None, f"n = {n}: not the direct sums"
    system.field.direct = False
    flow = lambda: explicit_flow(lambda y, offset: system.field(y, W), x, 0.01, EXPLICIT_TABLEAUX["heun"])  # noqa: E731
    flow()
    times["torch"] = clock(flow, repeats)
    return times


def floor(n: int, dim: int = 3) -> float:
    """Seconds of the arithmetic of a Heun step (module docstring)."""
    exp_seconds = exp_rate(np.random.default_rng(0).uniform(-1, 1, (128, 256)), 100)
    square = np.random.default_rng(1).standard_normal((1024, 1024))
    peak = 2 * 1024 ** 3 / clock(lambda: square @ square, 3)
    flops = 2 * (2 * dim * n * n + 2 * (dim + 1) * n * n)
    return 2 * n * n * exp_seconds + flops / peak


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[250, 1000, 2000, 2800, 5000, 10000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    use_threads(1)
    print(f"a Heun step of one system on S^2 (seed 003, beta = 30), 1 CPU thread, thread CPU time, median of "
          f"{args.repeats}; blocks of {particle_step.KERNEL_BLOCK_BYTES // 1024} KiB of query rows")
    print(f"{'n':>6} {'whole ms':>9} {'blocks ms':>10} {'torch ms':>9} {'floor ms':>9}   whole/blocks  torch/blocks"
          "  blocks/floor")
    for n in args.n:
        times, bound = step_times(n, args.repeats), floor(n)
        ms = {name: "-" if seconds is None else f"{1e3 * seconds:.2f}" for name, seconds in times.items()}
        whole = "-" if times["whole"] is None else f"{times['whole'] / times['blocks']:.2f}"
        print(f"{n:>6} {ms['whole']:>9} {ms['blocks']:>10} {ms['torch']:>9} {1e3 * bound:>9.2f}   {whole:>12}  "
              f"{times['torch'] / times['blocks']:>12.2f}  {times['blocks'] / bound:>12.2f}")


if __name__ == "__main__":
    main()
