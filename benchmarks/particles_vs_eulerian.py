"""CPU time each method needs for an error of 1e-3 in the order parameter at t = 10, and their ratio.

Cases: noisy attention dynamics with the unnormalized kernel at beta = 0 (the drift of a
particle is then P_x(V m), m the empirical mean: O(n) per step, the particle solver's
cheapest regime), one on each sphere:
    S^1: V = diag(1, 0.65) (seed 004's A), eps = 0.05, vMF(kappa = 1) start;
    S^2: V = diag(1, 0.65, 0.4), eps = 0.1, vMF(kappa = 1) start.
All times are CPU seconds of one core (torch.set_num_threads(1), time.process_time).

1. Reference r(10): the Eulerian solver at high resolution, checked against a second one.
2. Eulerian: every (lmax, dt) of a ladder is run; the cheapest run within 1e-3 is reported.
3. Particles (Strang splitting with Heun and the weak-order-2 noise step, dt = 0.05): the
   error is a bias plus a fluctuation of standard deviation sigma / sqrt(n).  R independent
   runs of n0 tokens give sigma (their spread; the dynamics amplifies the fluctuation of the
   order parameter beyond the i.i.d. value std<x, m/|m|>, printed for comparison) and the
   bias (mean error, +- its standard error); the same for Euler-Maruyama at the same dt.
   n_needed = sigma^2 / (tol^2 - bias^2) makes the RMS error tol; one run of n_needed tokens
   is timed and its actual error printed (capped at --max-n, then timed at the cap and
   extrapolated linearly in n: the cost per step is O(n)).

    python benchmarks/particles_vs_eulerian.py            # both spheres, about 15-30 CPU minutes
    python benchmarks/particles_vs_eulerian.py --sphere 1
"""

import argparse
import math
import os
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import spherepde  # noqa: E402
from spherepde.case import case_from_dict  # noqa: E402
from spherepde.errors import NumericalFailure  # noqa: E402
from solvers.particles import run_particles  # noqa: E402

TOLERANCE = 1e-3
T_END = 10.0
CASES = {
    1: {"sphere": {"dim": 2, "lmax": 16},
        "model": {"kernel": "unnormalized", "beta": 0.0, "V": [[1.0, 0.0], [0.0, 0.65]], "eps": 0.05},
        "initial": {"kind": "vmf", "mean": [0.6, 0.8], "kappa": 1.0},
        "ladder": [(lmax, dt) for lmax in (8, 12, 16, 24, 32, 48) for dt in (0.2, 0.1, 0.05)],
        "reference": [(64, 0.02), (48, 0.05)]},
    2: {"sphere": {"dim": 3, "lmax": 16},
        "model": {"kernel": "unnormalized", "beta": 0.0, "V": [[1.0, 0.0, 0.0], [0.0, 0.65, 0.0], [0.0, 0.0, 0.4]],
                  "eps": 0.1},
        "initial": {"kind": "vmf", "mean": [0.6, 0.0, 0.8], "kappa": 1.0},
        "ladder": [(lmax, dt) for lmax in (8, 12, 16, 24) for dt in (0.2, 0.1)],
        "reference": [(32, 0.05), (24, 0.1)]},
}


def case(sphere: int, overrides=()):
    spec = CASES[sphere]
    table = {"case": {"name": f"noisy-s{sphere}"}, "sphere": dict(spec["sphere"]), "model": spec["model"],
             "initial": spec["initial"], "time": {"t_end": T_END, "dt": 0.05, "save_every": T_END},
             "solver": {"device": "cpu"}, "particles": {"save": 0},
             "diagnostics": {"w2": False, "lyapunov_p": [0.1]}}
    return case_from_dict(table, overrides)


def timed(function, *args):
    started = time.process_time()
    result = function(*args)
    return result, time.process_time() - started


def eulerian_order_parameter(sphere: int, lmax: int, dt: float) -> tuple[float, float]:
    """r(t_end) and CPU seconds; r is NaN when the run fails (explicit transport unstable at this dt)."""
    run = lambda: spherepde.run(case(sphere, [f"sphere.lmax={lmax}", f"time.dt={dt}"]), progress=False)  # noqa: E731
    try:
        dataset, seconds = timed(run)
    except NumericalFailure:
        return math.nan, math.nan
    return float(dataset["order_parameter"][-1]), seconds


def particle_run(sphere: int, n: int, seed: int, integrator: str = "heun"):
    overrides = [f"particles.n={n}", f"particles.seed={seed}", f"particles.integrator='{integrator}'"]
    dataset, seconds = timed(lambda: run_particles(case(sphere, overrides), progress=False))
    return float(dataset["order_parameter"][-1]), float(dataset["order_parameter_stderr"][-1]), seconds


def benchmark(sphere: int, n0: int, replicas: int, max_n: int) -> dict:
    print(f"\n=== noisy S^{sphere}: order parameter r at t = {T_END:g}, target error {TOLERANCE:g} ===")
    (fine, fine_seconds), (check, _) = (eulerian_order_parameter(sphere, *spec) for spec in CASES[sphere]["reference"])
    print(f"reference r = {fine:.12f} (lmax {CASES[sphere]['reference'][0][0]}); a coarser reference differs by "
          f"{abs(check - fine):.1e}")
    eulerian = []
    for lmax, dt in CASES[sphere]["ladder"]:
        r, seconds = eulerian_order_parameter(sphere, lmax, dt)
        eulerian.append((seconds, lmax, dt, abs(r - fine)))
    passing = sorted(entry for entry in eulerian if entry[3] <= TOLERANCE)
    for seconds, lmax, dt, error in sorted(eulerian, key=lambda e: (e[1], -e[2])):
        outcome = "unstable" if math.isnan(error) else f"error {error:.2e}, {seconds:7.3f} s"
        print(f"  eulerian lmax {lmax:>3} dt {dt:<5g}: {outcome}")
    eulerian_seconds, lmax, dt, eulerian_error = passing[0]
    print(f"cheapest Eulerian run within {TOLERANCE:g}: lmax {lmax}, dt {dt:g}: error {eulerian_error:.2e} in "
          f"{eulerian_seconds:.3f} s")

    summary = {}
    for integrator in ("euler", "heun"):
        runs = [particle_run(sphere, n0, seed, integrator) for seed in range(replicas)]
        values = np.array([r for r, _, _ in runs])
        spread = values.std(ddof=1)
        bias, bias_error = values.mean() - fine, spread / math.sqrt(replicas)
        iid = np.mean([se for _, se, _ in runs])
        summary[integrator] = (spread * math.sqrt(n0), bias, bias_error)
        print(f"  particles {integrator:<5} n0 = {n0}, {replicas} seeds: bias {bias:+.2e} +- {bias_error:.1e}; "
              f"spread of r {spread:.2e} (the runs' own i.i.d. standard error {iid:.2e}: amplification "
              f"{spread / iid:.2f}); {np.mean([s for _, _, s in runs]):.2f} s per run")
    sigma, bias, bias_error = summary["heun"]
    effective_bias = abs(bias) + bias_error
    if effective_bias >= TOLERANCE:
        print("the Heun bias alone exceeds the tolerance at dt = 0.05: reduce dt")
        return {}
    n_needed = int(math.ceil(sigma ** 2 / (TOLERANCE ** 2 - effective_bias ** 2)))
    n_run = min(n_needed, max_n)
    r, _, seconds = particle_run(sphere, n_run, replicas)
    particle_seconds = seconds * n_needed / n_run
    note = "" if n_run == n_needed else f" (timed at n = {n_run}, extrapolated linearly)"
    print(f"particles: n_needed = sigma^2 / (tol^2 - bias^2) = {n_needed:.3g} (sigma = {sigma:.3f}); one run: "
          f"error {abs(r - fine):.2e}, {particle_seconds:.1f} s{note}")
    ratio = particle_seconds / eulerian_seconds
    print(f"S^{sphere}: particles {particle_seconds:.1f} s / Eulerian {eulerian_seconds:.3f} s = {ratio:.3g}")
    return {"eulerian": eulerian_seconds, "particles": particle_seconds, "ratio": ratio, "n": n_needed}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sphere", type=int, choices=(1, 2), nargs="+", default=[1, 2])
    parser.add_argument("--n0", type=int, default=100_000, help="tokens per run for sigma and the bias")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--max-n", type=int, default=20_000_000, help="largest run actually timed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", RuntimeWarning)
    results = {sphere: benchmark(sphere, args.n0, args.replicas, args.max_n) for sphere in args.sphere}
    print("\nCPU seconds (one core) to an error of 1e-3 in r(10):")
    for sphere, result in results.items():
        if result:
            print(f"  S^{sphere}: Eulerian {result['eulerian']:.3f} s, particles {result['particles']:.1f} s "
                  f"(n = {result['n']:.2g}), ratio particles / Eulerian = {result['ratio']:.3g}")


if __name__ == "__main__":
    main()
