"""Particles against the Eulerian solver: agreement within standard errors and the n^(-1/2) rate.

For one case (s1: noisy S^1, unnormalized attention at beta = 0, i.e. the anisotropic noisy
Kuramoto model, V = diag(1, 0.65); s2: noisy softmax S^2 at beta = 5 with general B, V, W)
this runs one converged Eulerian solution and particle runs with n tokens for several seeds,
and prints, per diagnostic and n:
  rms error    RMS over seeds of (particles - Eulerian) at t_end
  mean error   its mean over seeds (a bias shows here)
  mean SE      the standard error the particle runs report at t_end (averaged over seeds)
  rms z        RMS over seeds and saves of (particles - Eulerian) / SE: about 1 when the
               standard errors are honest
  agree        runs whose `spherepde compare` verdict is "agrees" (|B - A| <= 3 SE at every save)
and the fitted slope of log(rms error) against log(n) (expected -1/2), and, with --w2, the
W2 distance between the Eulerian density and the particles at t_end (all particles saved)
with its fitted exponent.  A figure goes to
results/particles/cross_validation_<case>_replicas<R>.png.

    python benchmarks/particles_cross_validation.py s1 --n 1000 10000 100000 --seeds 16 --w2
    python benchmarks/particles_cross_validation.py s2 --n 1000 10000 --seeds 8
"""

import argparse
import math
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import spherepde  # noqa: E402
from spherepde.case import case_from_dict  # noqa: E402
from spherepde.compare import compare  # noqa: E402
from solvers.particles import run_particles  # noqa: E402

CASES = {
    "s1": {
        "case": {"name": "noisy-s1"},
        "sphere": {"dim": 2, "lmax": 32},
        "model": {"kernel": "unnormalized", "beta": 0.0, "V": [[1.0, 0.0], [0.0, 0.65]], "eps": 0.25},
        "initial": {"kind": "vmf", "mean": [0.6, 0.8], "kappa": 1.0},
        "time": {"t_end": 5.0, "dt": 0.05, "save_every": 1.0},
        "solver": {"device": "cpu"},
        "particles": {"integrator": "heun"},
        "diagnostics": {"lyapunov_p": [0.1]},
    },
    "s2": {
        "case": {"name": "noisy-softmax-s2"},
        "sphere": {"dim": 3, "lmax": 24},
        "model": {"kernel": "softmax", "beta": 5.0, "eps": 0.1,
                  "B": [[1.0, 0.2, 0.0], [0.2, 0.9, 0.1], [0.0, 0.1, 1.1]],
                  "V": [[1.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 1.4]],
                  "W": [[0.0, 0.3, 0.0], [-0.3, 0.0, 0.0], [0.0, 0.0, 0.0]]},
        "initial": {"kind": "vmf_mixture", "means": [[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]], "kappas": [2.0, 3.0]},
        "time": {"t_end": 0.5, "dt": 0.05, "save_every": 0.25},
        "solver": {"device": "cpu"},
        "particles": {"integrator": "heun"},
        "diagnostics": {"lyapunov_p": [0.1]},
    },
}
NAMES = ["mean", "order_parameter", "alignment_E", "alignment_F", "lyapunov", "w2_projection", "interaction_energy"]


def fitted_slope(n, values):
    """Least-squares slope of log(values) against log(n)."""
    return float(np.polyfit(np.log(n), np.log(values), 1)[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--w2", action="store_true", help="W2(Eulerian, particles) at t_end, all particles saved")
    parser.add_argument("--replicas", type=int, default=1,
                        help="independent systems per run: standard errors by batch means (1: i.i.d. formulas)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)
    table = CASES[args.case]
    started = time.process_time()
    eulerian = spherepde.run(case_from_dict(table), progress=False)
    print(f"{args.case}: Eulerian run, lmax {table['sphere']['lmax']}: {time.process_time() - started:.1f} s CPU")
    results = {}
    for n in args.n:
        for seed in range(args.seeds):
            overrides = [f"particles.n={n}", f"particles.seed={seed}", f"particles.save={n if args.w2 else 0}",
                         f"particles.replicas={args.replicas}"]
            started = time.process_time()
            particles = run_particles(case_from_dict(table, overrides), progress=False)
            seconds = time.process_time() - started
            report = compare(eulerian, particles, w2=args.w2)
            results[n, seed] = (report, seconds)
        print(f"  n = {n}: {args.seeds} runs, {np.mean([results[n, s][1] for s in range(args.seeds)]):.1f} s CPU "
              "each", flush=True)
    summarise(args, table, eulerian, results)


def summarise(args, table, eulerian, results):
    seeds = range(args.seeds)
    print(f"\n{args.case}: t_end = {table['time']['t_end']}, {args.seeds} seeds per n, {args.replicas} replicas per "
          "run; verdict: |particles - Eulerian| <= 3 SE at every save")
    print(f"{'diagnostic':<20} {'n':>8} {'rms error':>11} {'mean error':>11} {'mean SE':>10} {'rms z':>7} "
          f"{'max|z|':>7} {'agree':>7}")
    slopes = {}
    rms_by_name = {}
    for name in NAMES:
        rms = []
        for n in args.n:
            reports = [results[n, s][0] for s in seeds]
            if f"{name}_z" not in reports[0] or reports[0].attrs[f"verdict_{name}"].startswith("n/a"):
                break
            final = np.array([r[f"{name}_difference"].values[-1] for r in reports]).ravel()
            errors = np.array([r[f"{name}_stderr"].values[-1] for r in reports]).ravel()
            z = np.concatenate([r[f"{name}_z"].values.ravel() for r in reports])
            agree = sum(r.attrs[f"verdict_{name}"] == "agrees" for r in reports)
            rms.append(math.sqrt(np.mean(final ** 2)))
            print(f"{name:<20} {n:>8} {rms[-1]:>11.3e} {final.mean():>11.2e} {errors.mean():>10.3e} "
                  f"{math.sqrt(np.mean(z ** 2)):>7.2f} "
                  f"{np.abs(z).max():>7.2f} {agree:>4}/{args.seeds}")
        if len(rms) == len(args.n) and max(rms) > 1e-12:  # (exact diagnostics, e.g. the energy at beta = 0, skipped)
            slopes[name] = fitted_slope(args.n, rms)
            rms_by_name[name] = rms
    print("\nfitted slope of log(rms error) against log(n) (expected -0.5):")
    for name, slope in slopes.items():
        print(f"  {name:<20} {slope:+.3f}")
    w2 = None
    if args.w2:
        w2 = [math.sqrt(np.mean([float(results[n, s][0]["w2"][-1]) ** 2 for s in seeds])) for n in args.n]
        print("\nW2(Eulerian, particles) at t_end, RMS over seeds [" + results[args.n[0], 0][0].attrs["w2_method"] + "]:")
        for n, value in zip(args.n, w2):
            print(f"  n = {n:>8}: {value:.4e}")
        print(f"  fitted exponent: {fitted_slope(args.n, w2):+.3f}")
    figure(args, rms_by_name, slopes, w2)


def figure(args, rms_by_name, slopes, w2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results", "particles")
    os.makedirs(folder, exist_ok=True)
    figure, axis = plt.subplots(figsize=(6.5, 4.5), constrained_layout=True)
    n = np.array(args.n, dtype=float)
    for name, rms in rms_by_name.items():
        axis.loglog(n, rms, "o-", label=f"{name} (slope {slopes[name]:+.2f})")
    if w2 is not None:
        axis.loglog(n, w2, "ks--", label=f"W2 (slope {fitted_slope(args.n, w2):+.2f})")
    axis.loglog(n, 0.5 * (n / n[0]) ** -0.5 * max(r[0] for r in rms_by_name.values()), "k:", label="n^-1/2")
    axis.set_xlabel("particles n")
    axis.set_ylabel("RMS error at t_end vs Eulerian")
    axis.set_title(f"case {args.case}: {args.seeds} seeds per n, {args.replicas} replicas per run")
    axis.legend(fontsize=7)
    target = os.path.join(folder, f"cross_validation_{args.case}_replicas{args.replicas}.png")
    figure.savefig(target, dpi=110)
    print(f"wrote {os.path.normpath(target)}")


if __name__ == "__main__":
    main()
