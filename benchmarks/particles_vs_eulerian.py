"""CPU time each method needs for an error of 1e-3 in the order parameter at t = 10, and their ratio.

Cases (B = I, vMF(kappa = 1) start, t = 10):
    beta0-s1:   unnormalized, beta = 0, V = diag(1, 0.65) (seed 004's A), eps = 0.05;
    beta0-s2:   unnormalized, beta = 0, V = diag(1, 0.65, 0.4), eps = 0.1;
    softmax-s1: softmax, beta = 5, V = diag(1, 0.65), eps = 0.1 (r(10) = 0.44);
    softmax-s2: softmax, beta = 5, V = diag(1, 0.65, 0.4), eps = 0.1 (r(10) = 0.39).
At beta = 0 the drift of a particle is P_x(V m), m the empirical mean: O(n) per step, the
particle solver's cheapest regime, and r(10) is near 1 (concentrated: few tokens suffice).
The softmax cases are the regime of criterion 1: the drift is an O(n^2) attention per step,
and eps = 0.1 keeps the state at t = 10 spread (r ~ 0.4).
All times are CPU seconds of one core (torch.set_num_threads(1), time.process_time).

1. Reference r(10): the Eulerian solver at high resolution, checked against a second one.
2. Eulerian: every (lmax, dt) of a ladder is run; the cheapest run within 1e-3 is reported,
   as a whole `spherepde.run` and as stepping alone: the whole run less a run of one step
   (setup, one step, diagnostics and dataset), which dominated the beta = 0 times.
3. Particles (Strang splitting with Heun and the weak-order-2 noise step, dt = 0.05): the
   error is a bias plus a fluctuation of standard deviation sigma / sqrt(n).  R independent
   runs of n0 tokens give sigma (their spread; the dynamics amplifies the fluctuation of the
   order parameter beyond the i.i.d. value std<x, m/|m|>, printed for comparison) and the
   bias (mean error, +- its standard error); the same for Euler-Maruyama at the same dt.
   n_needed = sigma^2 / (tol^2 - b^2), b = |bias| + its standard error (the bias's bound), makes the RMS
   error at most tol (sigma^2 / tol^2, a lower bound, when the bias is not resolved at n0: its standard
   error >= tol); one run of n_needed tokens
   is timed and its actual error printed.  Above --max-n, runs at max_n / 4, max_n / 2 and
   max_n are timed, the cost exponent a of seconds ~ n^a is fitted (least squares in logs) and
   the time at n_needed extrapolated with it: an extrapolation, printed as such.

    python benchmarks/particles_vs_eulerian.py            # all four cases, about 30 CPU minutes
    python benchmarks/particles_vs_eulerian.py --case softmax-s1 softmax-s2 --n0 1000 --max-n 2000

results/particles_verification.py (criterion 5 of issue 3) runs it as a command, with --json for the figures it
tabulates, and quotes its printout.
"""

import argparse
import json
import math
import time
import warnings

import numpy as np
import torch

import spherepde
from solvers.particles import run_particles
from spherepde.base.errors import NumericalFailure
from spherepde.io.case import case_from_dict

TOLERANCE = 1e-3
T_END = 10.0
S1_V, S2_V = [[1.0, 0.0], [0.0, 0.65]], [[1.0, 0.0, 0.0], [0.0, 0.65, 0.0], [0.0, 0.0, 0.4]]
CASES = {
    "beta0-s1": {"sphere": {"dim": 2, "lmax": 16},
                 "model": {"kernel": "unnormalized", "beta": 0.0, "V": S1_V, "eps": 0.05},
                 "initial": {"kind": "vmf", "mean": [0.6, 0.8], "kappa": 1.0},
                 "ladder": [(lmax, dt) for lmax in (8, 12, 16, 24, 32, 48) for dt in (0.2, 0.1, 0.05)],
                 "reference": [(64, 0.02), (48, 0.05)], "integrators": ("euler", "heun")},
    "beta0-s2": {"sphere": {"dim": 3, "lmax": 16},
                 "model": {"kernel": "unnormalized", "beta": 0.0, "V": S2_V, "eps": 0.1},
                 "initial": {"kind": "vmf", "mean": [0.6, 0.0, 0.8], "kappa": 1.0},
                 "ladder": [(lmax, dt) for lmax in (8, 12, 16, 24) for dt in (0.2, 0.1)],
                 "reference": [(32, 0.05), (24, 0.1)], "integrators": ("euler", "heun")},
    # Heun only: its bias at dt = 0.05 was 5-10x below Euler-Maruyama's on the beta = 0 cases,
    # and each O(n^2) particle run is expensive.
    "softmax-s1": {"sphere": {"dim": 2, "lmax": 32},
                   "model": {"kernel": "softmax", "beta": 5.0, "V": S1_V, "eps": 0.1},
                   "initial": {"kind": "vmf", "mean": [0.6, 0.8], "kappa": 1.0},
                   "ladder": [(lmax, dt) for lmax in (16, 24, 32, 48) for dt in (0.1, 0.05)],
                   "reference": [(96, 0.01), (64, 0.02)], "integrators": ("heun",)},
    "softmax-s2": {"sphere": {"dim": 3, "lmax": 24},
                   "model": {"kernel": "softmax", "beta": 5.0, "V": S2_V, "eps": 0.1},
                   "initial": {"kind": "vmf", "mean": [0.6, 0.0, 0.8], "kappa": 1.0},
                   "ladder": [(lmax, dt) for lmax in (16, 24, 32) for dt in (0.1, 0.05)],
                   "reference": [(40, 0.025), (32, 0.05)], "integrators": ("heun",)},
}


def case(name: str, overrides=()):
    spec = CASES[name]
    table = {"case": {"name": f"noisy-{name}"}, "sphere": dict(spec["sphere"]), "model": spec["model"],
             "initial": spec["initial"], "time": {"t_end": T_END, "dt": 0.05, "save_every": T_END},
             "solver": {"device": "cpu"}, "particles": {"save": 0},
             "diagnostics": {"w2": False, "lyapunov_p": [0.1]}}
    return case_from_dict(table, overrides)


def timed(function, *args):
    started = time.process_time()
    result = function(*args)
    return result, time.process_time() - started


def eulerian_order_parameter(name: str, lmax: int, dt: float) -> tuple[float, float, float]:
    """r(t_end), CPU seconds of the whole run, and of its stepping alone (the run less a one-step run);
    r is NaN when the run fails (explicit transport unstable at this dt)."""
    def run(t_end):
        overrides = [f"sphere.lmax={lmax}", f"time.dt={dt}", f"time.t_end={t_end}", f"time.save_every={t_end}"]
        return spherepde.run(case(name, overrides), progress=False)
    try:
        dataset, seconds = timed(run, T_END)
    except NumericalFailure:
        return math.nan, math.nan, math.nan
    _, one_step = timed(run, dt)
    return float(dataset["order_parameter"][-1]), seconds, max(seconds - one_step, 0.0)


def particle_run(name: str, n: int, seed: int, integrator: str = "heun"):
    overrides = [f"particles.n={n}", f"particles.seed={seed}", f"particles.integrator='{integrator}'"]
    dataset, seconds = timed(lambda: run_particles(case(name, overrides), progress=False))
    return float(dataset["order_parameter"][-1]), float(dataset["order_parameter_stderr"][-1]), seconds


def benchmark(name: str, n0: int, replicas: int, max_n: int) -> dict:
    spec = CASES[name]
    print(f"\n=== {name}: order parameter r at t = {T_END:g}, target error {TOLERANCE:g} ===")
    (fine, _, _), (check, _, _) = (eulerian_order_parameter(name, *ladder) for ladder in spec["reference"])
    print(f"reference r = {fine:.12f} (lmax {spec['reference'][0][0]}); a coarser reference differs by "
          f"{abs(check - fine):.1e}")
    eulerian = []
    for lmax, dt in spec["ladder"]:
        r, seconds, stepping = eulerian_order_parameter(name, lmax, dt)
        eulerian.append((seconds, lmax, dt, abs(r - fine), stepping))
    passing = sorted(entry for entry in eulerian if entry[3] <= TOLERANCE)
    for seconds, lmax, dt, error, stepping in sorted(eulerian, key=lambda e: (e[1], -e[2])):
        outcome = ("unstable" if math.isnan(error)
                   else f"error {error:.2e}, {seconds:7.3f} s (stepping {stepping:.3f} s)")
        print(f"  eulerian lmax {lmax:>3} dt {dt:<5g}: {outcome}")
    if not passing:
        print(f"no Eulerian run of the ladder is within {TOLERANCE:g} of the reference: extend the ladder")
        return {}
    eulerian_seconds, lmax, dt, eulerian_error, stepping_seconds = passing[0]
    print(f"cheapest Eulerian run within {TOLERANCE:g}: lmax {lmax}, dt {dt:g}: error {eulerian_error:.2e} in "
          f"{eulerian_seconds:.3f} s, stepping alone {stepping_seconds:.3f} s")

    summary = {}
    for integrator in spec["integrators"]:
        runs = [particle_run(name, n0, seed, integrator) for seed in range(replicas)]
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
    if bias_error >= TOLERANCE:
        # n0 tokens cannot resolve a bias of the size of the tolerance: n_needed = sigma^2 / tol^2 is then
        # a lower bound (the bias only adds to it).
        print(f"the bias is unresolved at n0 = {n0} (its standard error {bias_error:.1e} >= {TOLERANCE:g}): "
              f"n_needed = sigma^2 / tol^2, a lower bound")
        effective_bias = 0.0
    elif effective_bias >= TOLERANCE:
        print("the Heun bias alone exceeds the tolerance at dt = 0.05: reduce dt")
        return {}
    n_needed = int(math.ceil(sigma ** 2 / (TOLERANCE ** 2 - effective_bias ** 2)))
    rule = "sigma^2 / (tol^2 - (|bias| + its stderr)^2)" if effective_bias else "sigma^2 / tol^2"
    result = {"eulerian": eulerian_seconds, "eulerian_stepping": stepping_seconds, "n": n_needed,
              "r": fine, "sigma": sigma}
    if n_needed <= max_n:
        r, _, particle_seconds = particle_run(name, n_needed, replicas)
        print(f"particles: n_needed = {rule} = {n_needed:.3g} (sigma = {sigma:.3f}); one run: "
              f"error {abs(r - fine):.2e}, {particle_seconds:.1f} s")
    else:
        sizes = [max_n // 4, max_n // 2, max_n]
        seconds = [particle_run(name, n, replicas)[2] for n in sizes]
        exponent, log_scale = np.polyfit(np.log(sizes), np.log(seconds), 1)
        particle_seconds = float(math.exp(log_scale) * n_needed ** exponent)
        result["exponent"] = float(exponent)
        print(f"particles: n_needed = {rule} = {n_needed:.3g} (sigma = {sigma:.3f}) > max-n; "
              f"timed at n = {sizes}: {', '.join(f'{s:.2f}' for s in seconds)} s, fitted seconds ~ n^{exponent:.2f}; "
              f"EXTRAPOLATED to n_needed: {particle_seconds:.3g} s")
    ratio, stepping_ratio = particle_seconds / eulerian_seconds, particle_seconds / max(stepping_seconds, 1e-9)
    print(f"{name}: particles {particle_seconds:.3g} s / Eulerian {eulerian_seconds:.3f} s = {ratio:.3g} "
          f"(/ Eulerian stepping {stepping_seconds:.3f} s = {stepping_ratio:.3g})")
    return {**result, "particles": particle_seconds, "ratio": ratio, "stepping_ratio": stepping_ratio}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=list(CASES), nargs="+", default=list(CASES))
    parser.add_argument("--n0", type=int, default=100_000, help="tokens per run for sigma and the bias")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--max-n", type=int, default=20_000_000, help="largest run actually timed")
    parser.add_argument("--json", metavar="FILE", help="also write each case's figures (what `benchmark` returns) "
                                                       "to FILE (results/particles_verification.py tabulates them)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", RuntimeWarning)
    results = {name: benchmark(name, args.n0, args.replicas, args.max_n) for name in args.case}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    print("\nCPU seconds (one core) to an error of 1e-3 in r(10):")
    for name, result in results.items():
        if result:
            how = f"extrapolated with n^{result['exponent']:.2f}" if "exponent" in result else "timed"
            print(f"  {name}: Eulerian {result['eulerian']:.3f} s (stepping {result['eulerian_stepping']:.3f} s), "
                  f"particles {result['particles']:.3g} s (n = {result['n']:.2g}, {how}), ratio particles / "
                  f"Eulerian = {result['ratio']:.3g} (/ stepping {result['stepping_ratio']:.3g})")


if __name__ == "__main__":
    main()
