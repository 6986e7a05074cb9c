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
and the same two against the seeds' spread (each run's SE the standard deviation of the other
runs: Student t, honest whatever the runs' own SEs are worth; see `statistics`),
and the fitted slope of log(rms error) against log(n) (expected -1/2), and, with --w2, the
W2 distance between the Eulerian density and the particles at t_end (all particles saved)
with its fitted exponent.  With --replicas R a run of n tokens is R independent systems of
n / R tokens and its standard errors are batch means (honest where the interaction amplifies
fluctuations, see ParticleRecorder).  A figure goes to results/particles/cross_validation_<case>.png.
The s2 particles step with dt = 0.1 (Heun + weak-order-2 noise; the Eulerian run keeps 0.05):
an O(n^2) attention per drift evaluation is what limits n on a CPU.

    python benchmarks/particles_cross_validation.py s1 --n 1000 10000 100000 --seeds 16 --replicas 10 --w2
    python benchmarks/particles_cross_validation.py s2 --n 1000 10000 --seeds 8
"""

import argparse
import functools
import math
import multiprocessing
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import spherepde  # noqa: E402
from solvers.particles import run_particles  # noqa: E402
from spherepde.analysis.compare import compare  # noqa: E402
from spherepde.io.case import case_from_dict  # noqa: E402

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
        "particles": {"integrator": "heun", "dt": 0.1},
        "diagnostics": {"lyapunov_p": [0.1]},
    },
}
NAMES = ["mean", "order_parameter", "alignment_E", "alignment_F", "lyapunov", "w2_projection", "interaction_energy"]


def fitted_slope(n, values):
    """Least-squares slope of log(values) against log(n)."""
    return float(np.polyfit(np.log(n), np.log(values), 1)[0])


def particle_run(table: dict, eulerian, n: int, seed: int, systems: int, w2: bool, device: str):
    """One particle run of `table` compared with the Eulerian dataset: (report, seconds)."""
    torch.set_num_threads(1)
    overrides = [f"particles.n={n}", f"particles.seed={seed}", f"particles.save={n if w2 else 0}",
                 f"particles.replicas={systems}", f"solver.device='{device}'"]
    clock = time.process_time if device == "cpu" else time.perf_counter
    started = clock()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        particles = run_particles(case_from_dict(table, overrides), progress=False)
    seconds = clock() - started
    return compare(eulerian, particles, w2=w2, labels=("Eulerian", f"particles n = {n}, seed {seed}")), seconds


def cross_validate(name: str, sizes, seeds, replicas, w2: bool, log=print, device: str = "cpu",
                   workers: int = 1) -> dict:
    """One Eulerian run of case `name` and seeds[i] particle runs of replicas[i] systems at n = sizes[i].

    Returns {"eulerian", "eulerian_seconds", "runs": {n: [(report, seconds), ...]}} with the
    `spherepde compare` report of each particle run against the Eulerian one, in seed order.  The
    Eulerian run is on the CPU; the particles on `device` (seconds: CPU time on the CPU, wall time
    on a GPU), in `workers` processes of one thread each (the largest runs first).
    """
    table = CASES[name]
    started = time.process_time()
    eulerian = spherepde.run(case_from_dict(table), progress=False)
    result = {"eulerian": eulerian, "eulerian_seconds": time.process_time() - started, "runs": {}}
    log(f"{name}: Eulerian run, lmax {table['sphere']['lmax']}: {result['eulerian_seconds']:.1f} s CPU")
    jobs = sorted(((n, seed, systems) for n, runs, systems in zip(sizes, seeds, replicas) for seed in range(runs)),
                  key=lambda job: -job[0])
    run = functools.partial(particle_run, table, eulerian, w2=w2, device=device)
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {job: pool.submit(run, *job) for job in jobs}
            done = {job: future.result() for job, future in futures.items()}
    else:
        done = {job: run(*job) for job in jobs}
    for n, runs, systems in zip(sizes, seeds, replicas):
        result["runs"][n] = [done[n, seed, systems] for seed in range(runs)]
        log(f"  n = {n} ({systems} systems): {runs} runs, {np.mean([s for _, s in result['runs'][n]]):.1f} s "
            f"{'CPU' if device == 'cpu' else 'wall'} each", flush=True)
    return result


def statistics(runs: dict) -> dict:
    """Per diagnostic (components pooled) and n, over the seeds, from the comparison reports at t_end:

    rms_error = sqrt(mean (particles - Eulerian)^2), mean_error, mean_se (the runs' own standard
    error), rms_z and max_z of (particles - Eulerian) / SE over seeds and saves, agree (runs whose
    verdict is "agrees"; for w2_projection "floor" is the verdict's extra tolerance), and per
    diagnostic the least-squares slope of log(rms_error) against log(n); "w2": the RMS over seeds of
    W2(Eulerian, particles) at t_end and its slope, when the reports have it.

    With 3 or more seeds, also the same against the seeds' spread (``seed_spread_z``): the standard error
    of run i is the standard deviation of the other runs' values (leave-one-out, ddof = 1), at each save
    and component.  Independent of run i, it makes z_i Student-t with seeds - 2 degrees of freedom when
    the runs are unbiased (rms_z_spread = sqrt((R - 2) / (R - 4)) for R seeds), whatever the runs' own
    standard errors are worth; a bias of the particles shows as a mean z away from 0.
    """
    sizes = sorted(runs)
    table = {}
    for name in NAMES:
        rows = []
        for n in sizes:
            reports = [report for report, _ in runs[n]]
            if f"{name}_z" not in reports[0] or reports[0].attrs[f"verdict_{name}"].startswith("n/a"):
                break
            final = np.array([r[f"{name}_difference"].values[-1] for r in reports]).ravel()
            # (particles - Eulerian) / SE itself: the report's z is 0 wherever the difference is below
            # the verdict's tolerance, which for w2_projection includes the quantisation floor
            difference = np.concatenate([r[f"{name}_difference"].values.ravel() for r in reports])
            stderr = np.concatenate([r[f"{name}_stderr"].values.ravel() for r in reports])
            z = standardised(difference, stderr, reports[0].attrs["atol"])
            floors = [r.attrs["w2_projection_floor"] if name == "w2_projection" else 0.0 for r in reports]
            rows.append({"n": n, "rms_error": math.sqrt(np.mean(final ** 2)), "mean_error": float(final.mean()),
                         "mean_se": float(np.mean([r[f"{name}_stderr"].values[-1] for r in reports])),
                         "rms_z": math.sqrt(np.mean(z ** 2)), "max_z": float(np.abs(z).max()),
                         "agree": sum(r.attrs[f"verdict_{name}"] == "agrees" for r in reports),
                         "runs": len(reports)}
                        | ({"floor": float(np.mean(floors))} if name == "w2_projection" else {})
                        | (seed_spread_z([r[f"{name}_difference"].values for r in reports], reports[0].attrs["atol"],
                                         floors) if len(reports) >= 3 else {}))
        if not rows:
            continue
        entry = {"rows": rows, "verdict_sample": runs[sizes[0]][0][0].attrs[f"verdict_{name}"]}
        rms = [row["rms_error"] for row in rows]
        # exact diagnostics (e.g. the interaction energy at beta = 0) have no rate to fit
        if len(rows) == len(sizes) > 1 and max(rms) > 1e-12:
            entry["slope"] = fitted_slope(sizes, rms)
        table[name] = entry
    reports = [report for report, _ in runs[sizes[0]]]
    if "w2" in reports[0]:
        w2 = [math.sqrt(np.mean([float(report["w2"][-1]) ** 2 for report, _ in runs[n]])) for n in sizes]
        table["w2"] = {"sizes": sizes, "rms": w2, "slope": fitted_slope(sizes, w2) if len(sizes) > 1 else math.nan,
                       "method": reports[0].attrs["w2_method"]}
    return table


def standardised(difference: np.ndarray, stderr: np.ndarray, atol: float) -> np.ndarray:
    """z = difference / stderr, and 0 where |difference| <= atol (agreement to round-off: 0 / 0 there)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.abs(difference) <= atol, 0.0, difference / stderr)


def seed_spread_z(differences: list, atol: float, floors: list) -> dict:
    """z of each run's (particles - Eulerian) against the leave-one-out spread of the other runs (see
    ``statistics``): rms_z_spread, mean_z_spread, max_z_spread over runs, saves and components, and
    agree_spread, the runs with |difference| <= 3 spread + atol (+ the run's w2 floor) at every save."""
    values = np.stack(differences)  # (runs, time, components...)
    z, agree = [], 0
    for i in range(len(values)):
        spread = np.std(np.delete(values, i, axis=0), axis=0, ddof=1)
        tolerance = 3 * spread + atol + floors[i]
        z.append(standardised(values[i], spread, atol).ravel())
        agree += bool(np.all(np.abs(values[i]) <= tolerance))
    z = np.concatenate(z)
    return {"rms_z_spread": math.sqrt(np.mean(z ** 2)), "mean_z_spread": float(np.mean(z)),
            "max_z_spread": float(np.abs(z).max()), "agree_spread": agree}


def print_statistics(name: str, table: dict):
    print(f"\n{name}: t_end = {CASES[name]['time']['t_end']}; "
          "verdict: |particles - Eulerian| <= 3 SE at every save")
    print(f"{'diagnostic':<20} {'n':>8} {'rms error':>11} {'mean error':>11} {'mean SE':>10} {'rms z':>7} "
          f"{'max|z|':>7} {'agree':>7} | against the seeds' spread: {'rms z':>6} {'agree':>7}")
    for diagnostic, entry in table.items():
        for row in entry.get("rows", []):
            spread = (f"{row['rms_z_spread']:>6.2f} {row['agree_spread']:>4}/{row['runs']}"
                      if "rms_z_spread" in row else f"{'-':>6} {'-':>7}")
            print(f"{diagnostic:<20} {row['n']:>8} {row['rms_error']:>11.3e} {row['mean_error']:>11.2e} "
                  f"{row['mean_se']:>10.3e} {row['rms_z']:>7.2f} {row['max_z']:>7.2f} "
                  f"{row['agree']:>4}/{row['runs']} | {' ' * 27}{spread}")
    print("\nfitted slope of log(rms error) against log(n) (expected -0.5):")
    for diagnostic, entry in table.items():
        if "slope" in entry and diagnostic != "w2":
            print(f"  {diagnostic:<20} {entry['slope']:+.3f}")
    if "w2" in table:
        print(f"\nW2(Eulerian, particles) at t_end, RMS over seeds [{table['w2']['method']}]:")
        for n, value in zip(table["w2"]["sizes"], table["w2"]["rms"]):
            print(f"  n = {n:>8}: {value:.4e}")
        print(f"  fitted exponent: {table['w2']['slope']:+.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the particles run")
    parser.add_argument("--workers", type=int, default=1, help="particle runs in parallel (processes of one thread)")
    parser.add_argument("--w2", action="store_true", help="W2(Eulerian, particles) at t_end, all particles saved")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1],
                        help="independent systems per run, one value or one per n: standard errors by batch "
                             "means (1: i.i.d. formulas)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)
    replicas = args.replicas * len(args.n) if len(args.replicas) == 1 else args.replicas
    result = cross_validate(args.case, args.n, [args.seeds] * len(args.n), replicas, args.w2, device=args.device,
                            workers=args.workers)
    table = statistics(result["runs"])
    print_statistics(args.case, table)
    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results", "particles",
                          f"cross_validation_{args.case}.png")
    print(f"wrote {os.path.normpath(figure(table, f'case {args.case}: {args.seeds} seeds per n', target))}")


def figure(table: dict, title: str, target: str) -> str:
    """log-log RMS error at t_end against n, one line per diagnostic (and W2), with the n^(-1/2) guide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(target), exist_ok=True)
    figure, axis = plt.subplots(figsize=(6.5, 4.5), constrained_layout=True)
    fitted = {name: entry for name, entry in table.items() if name != "w2" and "slope" in entry}
    for name, entry in fitted.items():
        n = [row["n"] for row in entry["rows"]]
        axis.loglog(n, [row["rms_error"] for row in entry["rows"]], "o-", label=f"{name} (slope {entry['slope']:+.2f})")
    if "w2" in table:
        axis.loglog(table["w2"]["sizes"], table["w2"]["rms"], "ks--", label=f"W2 (slope {table['w2']['slope']:+.2f})")
    sizes = np.array([row["n"] for row in next(iter(fitted.values()))["rows"]], dtype=float)
    top = max(entry["rows"][0]["rms_error"] for entry in fitted.values())
    axis.loglog(sizes, top * (sizes / sizes[0]) ** -0.5, "k:", label="n^-1/2")
    axis.set_xlabel("particles n")
    axis.set_ylabel("RMS error at t_end vs Eulerian")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=7)
    figure.savefig(target, dpi=110)
    plt.close(figure)
    return target


if __name__ == "__main__":
    main()
