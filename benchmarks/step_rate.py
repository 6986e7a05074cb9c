"""Full time steps per second of the forward solver on S^2, CPU and (when present) CUDA.

The step is the solver's own: ForwardProblem of the seed-003 baseline (softmax, beta = 30,
B = diag(-1, -1, 1), V = diag(-1, 1, -2), eps = 0: classical RK4, four transport evaluations per
step, each a synthesis, the spectral attention field and a weak divergence), field "auto", at
lmax 64, 128, 256; --B general uses a general query-key matrix instead (the spectral field's kept
matrix up to lmax 35, kernels.spectral.MatrixMode; beyond, Chebyshev in r and scattered evaluation).
Per (device, dtype): one warm-up step, then the median over --steps steps (torch.cuda.synchronize
around each on the GPU), and the GPU / CPU ratio of steps per second.  CPU runs use --threads
threads (default 1); with one thread a step is timed by the thread's CPU time (on a shared machine
the wall time also counts waits for a core), otherwise, and on the GPU, by the wall clock.

On the GPU the memory traffic of a step is estimated from below as
    2 x (bytes of the tensors the step allocates: each is written once and read at least once)
    + the Legendre tables it reads (per evaluation: the basis's P, dP, m P / sin, and the field's P twice),
and divided by the step time; the fraction is taken of the bandwidth of a large device-to-device
copy measured here (and of the nominal bandwidth given by --peak-gbs, if any).

    python benchmarks/step_rate.py [--lmax 64 128 256] [--devices cpu cuda] [--dtypes float64 float32]
"""

import argparse
import os
import statistics
import time
import warnings

import numpy as np
import torch
from floors import use_threads

import spherepde
from solvers.forward_problem import ForwardProblem
from solvers.timegrid import Plan, TimeGrid

CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases", "baseline-inf.toml")
GENERAL_B = "[[0.7, 0.21, -0.14], [0.07, 0.56, 0.28], [-0.21, 0.14, 0.84]]"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write), best of 5."""
    source = torch.empty(2**28, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * source.numel() * source.element_size() / best


def measure(lmax: int, device: str, dtype: str, B: str, steps: int) -> dict:
    overrides = ["model.beta = 30.0", f"sphere.lmax = {lmax}", f"solver.device = '{device}'",
                 f"solver.dtype = '{dtype}'"]
    if B == "general":
        overrides.append(f"model.B = {GENERAL_B}")
    case = spherepde.load_case(CASE, overrides=overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        problem = ForwardProblem(case)
    place = problem.placement.device
    c = problem.initial()
    dt = 1e-3
    factors = problem.factors(Plan(TimeGrid(dt, dt).intervals[0], np.array([1]), np.array([dt])))
    drive = problem.transport.feed_forward(problem.batch.W)

    def step(c):
        return problem.step(c, drive, factors)

    c = step(c)  # warm-up (allocator, lazy initialisation)
    allocated = None
    if place.type == "cuda":
        synchronize(place)
        before = torch.cuda.memory_stats(place)["allocated_bytes.all.allocated"]
        c = step(c)
        synchronize(place)
        allocated = torch.cuda.memory_stats(place)["allocated_bytes.all.allocated"] - before
    clock = time.thread_time if place.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter
    durations = []
    for _ in range(steps):
        synchronize(place)
        start = clock()
        c = step(c)
        synchronize(place)
        durations.append(clock() - start)
    seconds = statistics.median(durations)
    evaluations = problem.scheme.stages_count
    tables = problem.basis.sht.table_bytes
    if problem.exp_kernel.name == "spectral":
        tables += 2 * problem.exp_kernel.transform.table_bytes
    return {"seconds": seconds, "field": problem.exp_kernel.name, "grid": problem.basis.grid_shape,
            "traffic": None if allocated is None else 2 * allocated + evaluations * tables}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lmax", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--B", choices=["baseline", "general"], default="baseline")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peak-gbs", type=float, default=None, help="nominal memory bandwidth of the GPU, GB/s")
    args = parser.parse_args(argv)
    use_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    bandwidth = {device: copy_bandwidth(torch.device(device)) for device in args.devices if device == "cuda"}
    for device, value in bandwidth.items():
        print(f"{device}: {torch.cuda.get_device_name()}, measured copy bandwidth {value / 1e9:.0f} GB/s")
    clock = "thread CPU time" if args.threads == 1 else "wall time"
    print(f"B = {args.B}, {args.threads} CPU thread(s) ({clock} on the CPU), median of {args.steps} RK4 steps")
    print(f"{'lmax':>5} {'grid':>9} {'dtype':>8} {'device':>6} {'field':>8} {'ms/step':>10} {'steps/s':>9} "
          f"{'GPU/CPU':>8} {'GB/s':>7} {'of copy':>8}")
    for lmax in args.lmax:
        for dtype in args.dtypes:
            rates = {}
            for device in args.devices:
                result = measure(lmax, device, dtype, args.B, args.steps)
                rates[device] = 1 / result["seconds"]
                line = (f"{lmax:>5} {result['grid'][0]:>4}x{result['grid'][1]:<4} {dtype:>8} {device:>6} "
                        f"{result['field']:>8} {1e3 * result['seconds']:>10.2f} {rates[device]:>9.2f}")
                if device != "cpu" and "cpu" in rates:
                    line += f" {rates[device] / rates['cpu']:>8.1f}"
                if result["traffic"] is not None:
                    achieved = result["traffic"] / result["seconds"]
                    line += f" {achieved / 1e9:>7.0f} {achieved / bandwidth[device]:>8.1%}"
                    if args.peak_gbs:
                        line += f" ({achieved / (args.peak_gbs * 1e9):.1%} of nominal)"
                print(line, flush=True)


if __name__ == "__main__":
    main()
