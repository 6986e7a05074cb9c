"""Figures of issue 3 (particle solver vs Eulerian solver): results/particles_verification.md.

    OMP_NUM_THREADS=1 python3 results/particles_verification.py --workers 2   # measure what has no summary, report
    OMP_NUM_THREADS=1 python3 results/particles_verification.py --report-only # the report from the summaries alone
    OMP_NUM_THREADS=1 python3 results/particles_verification.py --only s2 --device cuda   # s2's particles on a GPU

Each part below is one summary of the results harness (results/harness.py),
results/particles_verification/runs/<part>-<digest>.json, the digest that of what the part measures (`parameters`:
its case tables, sizes and seeds, or its command), so the report is written from the summaries alone; to measure a
part again, delete its summary.  Measuring everything takes about 80 CPU minutes (s2 40 of them; --workers N spreads
the s1 / s2 particle runs over N processes).  The s1 / s2 parts also draw their figures,
results/particles_verification/rate_<case>.png and compare_<case>_n10000.png (made from the runs themselves, so
only when measuring).  All runs on the CPU, float64, one thread per process (CPU seconds are time.process_time
of the process).
  s1, s2  criterion 1 and 2: particle runs against one Eulerian run of CASES s1 / s2 (`cross_validate`)
          (--device cuda: the particles on the GPU, plan PLAN_CUDA, their own summaries and figures; the Eulerian
          run stays on the CPU; the report of --device cuda reads those)
  w2_s2   criterion 2 on S^2: W2 of the s2 particles against exact draws from the Eulerian density
  dims    criterion 3: reproducibility bit for bit and the order-parameter invariant, d = 4..16
  inf     criterion 4: beta = inf, mean-field mode, cases/baseline-inf.toml
  cost    criterion 5: benchmarks/particles_vs_eulerian.py (run as a command), beta = 0 cases, sizes COST below
  cost_softmax  criterion 5 on the softmax beta = 5 cases, sizes COST_SOFTMAX (O(n^2) runs: smaller
          n0, and the time at n_needed extrapolated with a fitted cost exponent)
  lyapunov  the Eulerian V_p of case s1 by adaptive quadrature of its band-limited density, against which the
          s1 particles' V_p is compared again (see `singular_lyapunov`)
"""

import argparse
import functools
import json
import math
import multiprocessing
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import harness
import numpy as np

STUDY = harness.Study("particles_verification")
REPORT = "particles_verification.md"
# The figures are drawn from the runs themselves (not from the summaries), beside the summaries.
FIGURES = harness.RESULTS / "particles_verification"
REGENERATE = ("Regenerate: `OMP_NUM_THREADS=1 python3 results/particles_verification.py --workers 2` (measures what "
              "has no summary in results/particles_verification/runs/, about 80 CPU min in all, then writes this "
              "report; `--report-only` writes it from the summaries alone).")
# The torch of the summaries made before they recorded it (the report printed then named it).
TORCH_BEFORE = "2.13.0+cpu"

# The two cases of criteria 1 and 2.  s1: noisy S^1, unnormalized attention at beta = 0, i.e. the anisotropic noisy
# Kuramoto model, V = diag(1, 0.65); s2: noisy softmax S^2 at beta = 5 with general B, V, W.  The s2 particles
# step with dt = 0.1 (Heun + weak-order-2 noise; the Eulerian run keeps 0.05): an O(n^2) attention per drift
# evaluation is what limits n on a CPU.
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
# The diagnostics compared (components pooled), in the report's order.
NAMES = ["mean", "order_parameter", "alignment_E", "alignment_F", "lyapunov", "w2_projection", "interaction_energy"]
SIZES = [1000, 10000, 100000]
# (seeds at each n, systems per run at each n), s2 sized for about 40 CPU minutes, s1 for 11 (--workers
# spreads them over cores).  s2's attention is O(n^2) per drift evaluation: one system of 1e5 tokens
# would take about 40 CPU minutes, so its n = 1e5 runs are 10 independent systems of 1e4 tokens
# (4 CPU minutes each).  Their finite-size bias is that of a 1e4-token system, O(1e-4), below the
# 1e-3 standard error (100 systems of 1e3 tokens, the earlier plan, carried an O(1e-3) bias that
# showed in lyapunov).  On s1 (beta = 0: O(n) per drift) the interaction amplifies fluctuations beyond
# the i.i.d. standard error, so every run is R systems with batch-means SEs: 4 of 250 tokens at n = 1e3
# (more systems would add finite-size bias O(R / n) against an SE of O(n^-1/2)), 10 of 1e3 at 1e4 and
# 10 of 1e4 at 1e5 (bias ~1e-4, below the 3e-3 standard error).
PLAN = {"s1": ([40, 16, 8], [4, 10, 10]), "s2": ([48, 16, 8], [1, 1, 10])}
# With --device cuda every s2 run is one system of n tokens (an H200 took 0.2 s per run at n = 1e3
# and 1.4 s at 1e4, and over 17 s at 1e5, where w2_projection's c-transforms on the host CPU weigh:
# 14 s per call at 1e5 particles and 3000 atoms on our CPU, 2.2 s since); s1 keeps its CPU plan.
PLAN_CUDA = {"s1": PLAN["s1"], "s2": ([64, 32, 12], [1, 1, 1])}
# Criterion 2 on S^2: sizes and seeds of the two-sample W2 measurement (exact OT of n x n points).
W2_S2 = {"sizes": [250, 500, 1000, 2000, 4000], "seeds": 4}
# Criterion 3: the dimensions, and the two runs at each (label, overrides of `invariant_table`).
DIMS = [4, 6, 8, 12, 16]
DIMS_RUNS = [("invariant", []),
             ("softmax beta 2, eps 0.05", ["model.kernel='softmax'", "model.beta=2.0", "model.eps=0.05",
                                           "time.t_end=1.0"])]
# Criterion 4: cases/baseline-inf.toml with these overrides.
INF_CASE = "cases/baseline-inf.toml"
INF_OVERRIDES = ["solver.device='cpu'", "particles.beta_inf_mode='mean_field'", "particles.n=100000",
                 "particles.save=100000", "particles.seed=3", "particles.integrator='rk4'", "particles.dt=0.01"]
# Criterion 5: the options of benchmarks/particles_vs_eulerian.py.
COST = {"n0": 10000, "replicas": 6, "max_n": 100000, "cases": ["beta0-s1", "beta0-s2"]}
COST_SOFTMAX = {"n0": 1000, "replicas": 6, "max_n": 2000, "cases": ["softmax-s1", "softmax-s2"]}
COST_BENCHMARK = "benchmarks/particles_vs_eulerian.py"


def invariant_table(dim: int) -> dict:
    """beta = 0, unnormalized, V = I, W = 0, eps = 0: v = P_x m, d|m|^2/dt = 2 (|m|^2 - (1/n) sum <x_i, m>^2) >= 0."""
    return {"case": {"name": f"invariant-d{dim}"}, "sphere": {"dim": dim, "lmax": 16},
            "model": {"kernel": "unnormalized", "beta": 0.0, "V": np.eye(dim).tolist(), "eps": 0.0},
            "initial": {"kind": "vmf", "mean": [1.0] + [0.0] * (dim - 1), "kappa": 0.5 * dim},
            "time": {"t_end": 8.0, "dt": 0.05, "save_every": 0.25},
            "particles": {"n": 4000, "seed": 3, "integrator": "heun", "save": 4000},
            "diagnostics": {"w2": False}, "solver": {"device": "cpu"}}


def cost_options(sizes: dict) -> list:
    return ["--case", *sizes["cases"], "--n0", str(sizes["n0"]), "--replicas", str(sizes["replicas"]),
            "--max-n", str(sizes["max_n"])]


def plan(device: str = "cpu") -> list:
    """The parts, in the order they are measured; s1 and s2 are those of `device`."""
    def cross_validation(name):
        seeds, replicas = (PLAN if device == "cpu" else PLAN_CUDA)[name]
        return harness.Spec(name, parameters=f"particle runs of case {name} against its Eulerian run: {CASES[name]!r} "
                                             f"at n {SIZES}, seeds {seeds}, systems per run {replicas}, "
                                             f"W2 {name == 's1'}, particles on {device}")

    return [cross_validation("s1"), cross_validation("s2"),
            harness.Spec("w2_s2", parameters=f"W2 of particles and of exact draws, case s2 {CASES['s2']!r}: {W2_S2!r}"),
            harness.Spec("dims", parameters="each run twice, order parameter: "
                                            f"{[invariant_table(dim) for dim in DIMS]!r} with {DIMS_RUNS!r}"),
            harness.Spec("inf", parameters=f"{INF_CASE} with {INF_OVERRIDES!r}:\n"
                                           + (harness.ROOT / INF_CASE).read_text()),
            harness.Spec("cost", parameters=" ".join(["python3", COST_BENCHMARK, *cost_options(COST)])),
            harness.Spec("cost_softmax", parameters=" ".join(["python3", COST_BENCHMARK,
                                                              *cost_options(COST_SOFTMAX)])),
            harness.Spec("lyapunov", parameters=f"V_p by adaptive quadrature, Eulerian run of case s1 {CASES['s1']!r}")]


def figure_tag(device: str) -> str:
    """What tells the figures of the --device cuda parts from the CPU ones."""
    return "" if device == "cpu" else f"_{device}"


# ---------------------------------------------------------------------------------------
# Criteria 1 and 2: particle runs against one Eulerian run
# ---------------------------------------------------------------------------------------


def fitted_slope(n, values):
    """Least-squares slope of log(values) against log(n)."""
    return float(np.polyfit(np.log(n), np.log(values), 1)[0])


def particle_run(table: dict, eulerian, n: int, seed: int, systems: int, w2: bool, device: str):
    """One particle run of `table` compared with the Eulerian dataset: (report, seconds)."""
    import torch

    from solvers.particles import run_particles
    from spherepde.analysis.compare import compare
    from spherepde.io.case import case_from_dict

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


def cross_validate(name: str, sizes, seeds, replicas, w2: bool, device: str = "cpu", workers: int = 1) -> dict:
    """One Eulerian run of case `name` and seeds[i] particle runs of replicas[i] systems at n = sizes[i].

    Returns {"eulerian", "eulerian_seconds", "runs": {n: [(report, seconds), ...]}} with the
    `spherepde compare` report of each particle run against the Eulerian one, in seed order.  With R > 1 systems a
    run of n tokens is R independent systems of n / R tokens and its standard errors are batch means (honest where
    the interaction amplifies fluctuations, see ParticleRecorder).  The Eulerian run is on the CPU; the particles on
    `device` (seconds: CPU time on the CPU, wall time on a GPU), in `workers` processes of one thread each (the
    largest runs first).
    """
    import spherepde
    from spherepde.io.case import case_from_dict

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
            f"{'CPU' if device == 'cpu' else 'wall'} each")
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


def rate_figure(table: dict, title: str, target: Path) -> None:
    """log-log RMS error at t_end against n, one line per diagnostic (and W2), with the n^(-1/2) guide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target.parent.mkdir(parents=True, exist_ok=True)
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


def measure_cross_validation(name: str, device: str = "cpu", workers: int = 1) -> dict:
    """Criteria 1 and 2: diagnostics and W2 (exact on S^1) against the Eulerian run, n = 1e3..1e5."""
    import torch

    from spherepde.analysis.compare import write_report

    seeds, replicas = (PLAN if device == "cpu" else PLAN_CUDA)[name]
    w2 = name == "s1"  # on S^2 exact OT of 1e5 particles against the grid is beyond this machine
    result = cross_validate(name, SIZES, seeds, replicas, w2, device=device, workers=workers)
    table = statistics(result["runs"])
    report, _ = result["runs"][10000][0]
    FIGURES.mkdir(parents=True, exist_ok=True)
    write_report(report, str(FIGURES / f"compare_{name}_n10000{figure_tag(device)}"))
    rate_figure(table, f"{name}: RMS over {seeds} seeds (n = {SIZES}) of (particles - Eulerian) at t = "
                       f"{CASES[name]['time']['t_end']:g}", FIGURES / f"rate_{name}{figure_tag(device)}.png")
    seconds = {n: float(np.mean([s for _, s in result["runs"][n]])) for n in SIZES}
    # the raw lyapunov series of every run, for the singular-quadrature check of the Eulerian value
    lyapunov = {n: [[report["lyapunov_b"].values.tolist(), report["lyapunov_stderr"].values.tolist()]
                    for report, _ in result["runs"][n]] for n in SIZES}
    where = "CPU" if device == "cpu" else f"{torch.cuda.get_device_name()} wall, torch {torch.__version__}"
    return {"table": table, "seeds": seeds, "replicas": replicas, "seconds": seconds, "device": where,
            "eulerian_seconds": result["eulerian_seconds"], "case": CASES[name],
            "compare_report": report.attrs["report"], "lyapunov": lyapunov,
            "eulerian_lyapunov": result["eulerian"]["lyapunov"].values.tolist()}


# ---------------------------------------------------------------------------------------
# The other parts
# ---------------------------------------------------------------------------------------


def measure_w2_s2() -> dict:
    """Criterion 2 on S^2: W2(rho_t, particles) at t_end by exact OT of the n particles against n exact
    draws from the Eulerian density (DensityFileSampler), next to the same between two independent sets
    of n draws (the pure sampling error of that estimator).

    Against the quadrature grid itself (lmax 24) W2 would floor at the cell size (~0.05 rad); n exact
    draws instead add an independent O(n^-1/2) term: if the particles are distributed as rho_t, both
    columns have the same law, W2 of two n-samples ~ sqrt(2) W2(rho, one n-sample) ~ (log n / n)^(1/2)
    on a 2-dimensional manifold (exponent about -0.43 over n = 250..4000).
    """
    import torch

    import spherepde
    from solvers.particles import run_particles
    from spherepde.io.case import case_from_dict
    from spherepde.io.output import write_dataset
    from spherepde.measures.optimal_transport import wasserstein2
    from spherepde.model.sampling import DensityFileSampler

    table = CASES["s2"]
    eulerian = spherepde.run(case_from_dict(table), progress=False)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "eulerian.nc")
        write_dataset(eulerian, path)
        sampler = DensityFileSampler(path, -1, 3)
        for n in W2_S2["sizes"]:
            for seed in range(W2_S2["seeds"]):
                overrides = [f"particles.n={n}", f"particles.seed={seed}", f"particles.save={n}"]
                particles = run_particles(case_from_dict(table, overrides), progress=False)
                x = particles["particles"].values[-1]
                generator = torch.Generator().manual_seed(10_000 + seed)
                y, z = (sampler.sample(n, generator).numpy() for _ in range(2))
                weights = np.full(n, 1 / n)
                # max_atoms = n: exact OT of the n x n points, nothing quantised
                rows.append({"n": n, "seed": seed, "particles": wasserstein2(x, weights, y, weights, n)[0],
                             "samples": wasserstein2(y, weights, z, weights, n)[0]})
            log(f"  w2_s2: n = {n} done")
    return {"rows": rows, "t_end": table["time"]["t_end"], **W2_S2}


def singular_lyapunov(density: np.ndarray, theta: np.ndarray, lmax: int, axis: np.ndarray, p: float) -> float:
    """V_p = int |tan(theta - alpha)|^(2p) rho(theta) dtheta on S^1, E = span((cos alpha, sin alpha)).

    The integrand grows like |theta - alpha -+ pi/2|^(-2p) at the two points where P_E x = 0:
    a uniform grid integrates it with an error of order h^(1 - 2p) (about 1e-2 at lmax 32, p = 0.1),
    while adaptive quadrature (QUADPACK's extrapolation handles algebraic end-point singularities)
    of the band-limited density rho(theta) = sum_{|k| <= lmax} c_k exp(i k theta) is exact to ~1e-12.
    """
    from scipy.integrate import quad

    coefficients = np.fft.rfft(density)[:lmax + 1] / len(density)
    k = np.arange(lmax + 1)

    def rho(angle):
        terms = coefficients * np.exp(1j * k * (angle - theta[0]))
        return terms[0].real + 2 * terms[1:].real.sum()

    alpha = math.atan2(axis[1], axis[0])
    total = 0.0
    for start in (alpha - math.pi / 2, alpha + math.pi / 2):
        total += quad(lambda a: abs(math.tan(a - alpha)) ** (2 * p) * rho(a), start, start + math.pi,
                      limit=400, epsabs=1e-13, epsrel=1e-12)[0]
    return total


def measure_lyapunov() -> dict:
    """Case s1 again (its Eulerian run, a few seconds): the grid V_p and V_p by `singular_lyapunov`, per save."""
    import spherepde
    from spherepde.io.case import case_from_dict
    from spherepde.model.attention import principal_subspace

    table = CASES["s1"]
    eulerian = spherepde.run(case_from_dict(table), progress=False)
    axis = principal_subspace(np.array(table["model"]["V"]) @ np.eye(2))[:, 0]
    p = table["diagnostics"]["lyapunov_p"][0]
    accurate = [singular_lyapunov(d, eulerian["theta"].values, table["sphere"]["lmax"], axis, p)
                for d in eulerian["density"].values]
    return {"p": p, "grid": eulerian["lyapunov"].values[:, 0].tolist(), "accurate": accurate,
            "times": eulerian["time"].values.tolist()}


def measure_dims() -> dict:
    """Criterion 3: each run twice (bit for bit), the order parameter nondecreasing; with noise and softmax too."""
    from solvers.particles import run_particles
    from spherepde.io.case import case_from_dict

    rows = []
    for dim in DIMS:
        for label, overrides in DIMS_RUNS:
            case = case_from_dict(invariant_table(dim), overrides)
            started = time.process_time()
            first = run_particles(case, progress=False)
            seconds = time.process_time() - started
            second = run_particles(case, progress=False)
            identical = all(np.array_equal(first[name].values, second[name].values, equal_nan=True)
                            for name in ("particles", "mean", "order_parameter", "alignment_E", "interaction_energy"))
            r = first["order_parameter"].values
            m = first["mean"].values
            turn = float(np.degrees(np.arccos(np.clip(m[-1] @ m[0] / (np.linalg.norm(m[-1]) * r[0]), -1, 1))))
            rows.append({"dim": dim, "run": label, "identical": identical, "r0": float(r[0]), "r_end": float(r[-1]),
                         "min_increment": float(np.diff(r).min()), "turn_degrees": turn, "seconds": seconds})
    return {"rows": rows, "n": invariant_table(DIMS[0])["particles"]["n"]}


def hemisphere_mass_of_vmf(mean, kappa: float) -> float:
    """P(x_1 > 0) for vMF(mean, kappa) on S^2: in coordinates x = (t, s cos psi, s sin psi) the angle
    integral is 2 pi I_0(kappa |mean_perp| s), so P = int_0^1 f / int_-1^1 f, f(t) = exp(kappa mean_1 t) I_0(...)."""
    from scipy.integrate import quad
    from scipy.special import i0e

    mean = np.asarray(mean) / np.linalg.norm(mean)
    perp = math.hypot(mean[1], mean[2])

    def f(t):
        argument = kappa * perp * math.sqrt(1 - t * t)
        return math.exp(kappa * mean[0] * t + argument - kappa) * i0e(argument)

    return quad(f, 0, 1, epsabs=0, epsrel=1e-13)[0] / quad(f, -1, 1, epsabs=0, epsrel=1e-13, points=[0])[0]


def measure_inf() -> dict:
    """Criterion 4: cases/baseline-inf.toml, particles.beta_inf_mode = mean_field, n = 1e5, RK4."""
    import spherepde
    from solvers.particles import run_particles
    from spherepde.analysis.concentration import hemisphere_mass

    case = spherepde.load_case(harness.ROOT / INF_CASE, list(INF_OVERRIDES))
    eulerian = spherepde.run(case, progress=False)
    particles = run_particles(case, progress=False)
    signs = np.sign(particles["particles"].values[..., 0])
    switched = int((signs != signs[0]).any(axis=0).sum())
    fraction = (signs > 0).mean(axis=1)
    masses = list(hemisphere_mass(eulerian, [1.0, 0.0, 0.0]))
    tail = eulerian["spectral_tail"].values
    exact = hemisphere_mass_of_vmf(case["initial"]["mean"], case["initial"]["kappa"])
    resolved = eulerian.attrs["resolved_until"]  # a time, or "end"
    return {"n": case["particles"]["n"], "times": particles["time"].values.tolist(), "switched": switched,
            "zero_x1": int((signs == 0).sum()), "fraction": fraction.tolist(), "eulerian": masses,
            "tail": tail.tolist(), "tail_tol": case["diagnostics"]["tail_tol"], "exact": exact,
            "resolved_until": resolved if isinstance(resolved, str) else f"{resolved:.4g}"}


def measure_cost(sizes: dict) -> dict:
    """Criterion 5: benchmarks/particles_vs_eulerian.py run as a command: its printout, quoted by the report, and
    its per-case figures (its --json), tabulated; with the command's CPU seconds (the harness's stamp counts this
    process only)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as folder:
        figures = Path(folder) / "cost.json"
        done = subprocess.run([sys.executable, COST_BENCHMARK, *cost_options(sizes), "--json", str(figures)],
                              cwd=harness.ROOT, capture_output=True, text=True, check=True)
        results = json.loads(figures.read_text())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"results": results, "printout": done.stdout, "command_cpu_seconds": seconds, **sizes}


MEASURE = {"w2_s2": measure_w2_s2, "dims": measure_dims, "inf": measure_inf,
           "cost": functools.partial(measure_cost, COST), "cost_softmax": functools.partial(measure_cost, COST_SOFTMAX),
           "lyapunov": measure_lyapunov}


def measure(spec: harness.Spec, device: str = "cpu", workers: int = 1) -> dict:
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore", RuntimeWarning)
    if spec.key in CASES:
        summary = measure_cross_validation(spec.key, device, workers)
    else:
        summary = MEASURE[spec.key]()
    return {"parameters": spec.parameters, "torch": torch.__version__} | summary


def log(*words) -> None:
    print(*words, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------


def section(title: str, part: str, data: dict | None) -> list:
    """The heading of a report section, and a line saying so when the part has no summary."""
    lines = ["", f"## {title}", ""]
    if data is None:
        lines.append(f"(not measured: run `python3 results/particles_verification.py --only {part}`)")
    return lines


def report_cross_validation(name: str, title: str, data: dict | None, reference: dict | None, device: str) -> list:
    lines = section(title, name, data)
    if data is None:
        return lines
    lines += [f"Case `{name}` of results/particles_verification.py: model {json.dumps(data['case']['model'])}, "
              f"initial {json.dumps(data['case']['initial'])}, t_end = {data['case']['time']['t_end']}, "
              f"particles {json.dumps(data['case']['particles'])}.  "
              f"Seeds per n {dict(zip(SIZES, data['seeds']))}; "
              f"systems per run {dict(zip(SIZES, data['replicas']))} (standard errors by batch means where > 1, "
              f"i.i.d. formulas where 1).  Eulerian run {data['eulerian_seconds']:.1f} s; particle runs "
              + ", ".join(f"n = {n}: {s:.1f} s" for n, s in data["seconds"].items())
              + f" ({data.get('device', 'CPU')}, mean per run).", "",
              "error = particles - Eulerian at t_end (RMS / mean over seeds, components pooled); mean SE: the runs' "
              "own standard error at t_end; rms z, max |z|: of error / SE over seeds, saves and components; agree: "
              "runs whose `compare` verdict is |error| <= 3 SE at every save (for w2_projection: <= 3 SE + the runs' "
              "quantisation floor, shown; a floor above the SE makes that verdict weak, and rms z is the test).", "",
              "What honest standard errors give: with i.i.d. errors (R = 1 system per run) z is normal, rms z = 1, "
              "and a run fails the verdict by chance with probability 1 - 0.9973^k for k values checked (saves x "
              "components: 1-3% here).  A batch-means SE of R systems is itself an estimate with R - 1 degrees of "
              "freedom, so z follows Student's t: rms z = sqrt((R - 1) / (R - 3)) (1.73 for R = 4, 1.13 for R = 10), "
              "and |z| > 3 has probability 5.8% (R = 4) or 1.5% (R = 10) per value: with R = 4, up to about half of "
              "the runs fail by chance (k = 6 to 12 here).  'rms z if honest' below.", "",
              "The last three columns test the same agreement without trusting the runs' own SE: each run's SE is "
              "the standard deviation of the other seeds' values at that save (leave-one-out), so z is Student t "
              "with seeds - 2 degrees of freedom when the particles are unbiased (rms z sqrt((S - 2) / (S - 4)) for "
              "S seeds: 1.03 for 40, 1.08 for 16, 1.22 for 8), and a run agrees when |error| <= 3 spread at every "
              "save (+ the w2 floor).  A finite-size bias shows as excess rms z here.", ""]
    systems = dict(zip(SIZES, data["replicas"]))
    rows = []
    for diagnostic, entry in data["table"].items():
        if diagnostic == "w2":
            continue
        for i, row in enumerate(entry["rows"]):
            slope = f"{entry['slope']:+.3f}" if i == 0 and "slope" in entry else ""
            floor = f" (floor {row['floor']:.2g})" if "floor" in row else ""
            count = systems[row["n"]]
            honest = 1.0 if count == 1 else math.sqrt((count - 1) / (count - 3)) if count > 3 else math.inf
            runs = row["runs"]
            spread_honest = math.sqrt((runs - 2) / (runs - 4)) if runs > 4 else math.inf
            spread = ([f"{row['rms_z_spread']:.2f}", f"{spread_honest:.2f}", f"{row['agree_spread']}/{runs}"]
                      if "rms_z_spread" in row else ["-", "-", "-"])
            rows.append([diagnostic, row["n"], f"{row['rms_error']:.3e}", f"{row['mean_error']:+.2e}",
                         f"{row['mean_se']:.2e}", f"{row['rms_z']:.2f}", f"{honest:.2f}", f"{row['max_z']:.2f}",
                         f"{row['agree']}/{runs}{floor}", slope, *spread])
    lines += harness.table(["diagnostic", "n", "RMS error", "mean error", "mean SE", "rms z", "rms z if honest",
                            "max abs z", "agree", "fitted slope", "rms z, seeds' spread", "if honest",
                            "agree, seeds' spread"], rows)
    if "w2" in data["table"]:
        w2 = data["table"]["w2"]
        lines += ["", f"W2(Eulerian, particles) at t_end, RMS over seeds [{w2['method']}]: "
                  + ", ".join(f"n = {n}: {v:.3e}" for n, v in zip(w2["sizes"], w2["rms"]))
                  + f"; fitted exponent {w2['slope']:+.3f}."]
    if name == "s1" and reference is not None:
        lines += report_lyapunov(data, reference)
    folder = FIGURES.relative_to(harness.ROOT)
    lines += ["", f"Figure: {folder}/rate_{name}{figure_tag(device)}.png; one comparison (n = 10000, seed 0): "
              f"{folder}/compare_{name}_n10000{figure_tag(device)}.png, its table:", "",
              "```", data["compare_report"], "```"]
    return lines


def report_lyapunov(data: dict, reference: dict) -> list:
    """The particles' lyapunov against the Eulerian V_p by singular quadrature instead of the grid's."""
    accurate = np.array(reference["accurate"])
    bias = np.array(reference["grid"]) - accurate
    lines = ["", f"lyapunov (p = {reference['p']}): the Eulerian run's grid quadrature of the singular integrand is "
             f"off by {bias.min():+.1e} .. {bias.max():+.1e} (against adaptive quadrature of the same band-limited "
             "density, `singular_lyapunov`; at t = 0 that agrees with quadrature of the exact vMF law).  The "
             "particles against the accurate value:", ""]
    rows, rms = [], []
    for n, runs in data["lyapunov"].items():
        values = np.array([v for v, _ in runs])[..., 0]
        errors = np.array([e for _, e in runs])[..., 0]
        difference = values - accurate
        z = difference / errors
        rms.append(math.sqrt(np.mean(difference[:, -1] ** 2)))
        agree = int((np.abs(difference) <= 3 * errors).all(axis=1).sum())
        rows.append([n, f"{rms[-1]:.3e}", f"{difference[:, -1].mean():+.2e}", f"{math.sqrt(np.mean(z ** 2)):.2f}",
                     f"{np.abs(z).max():.2f}", f"{agree}/{len(runs)}"])
    lines += harness.table(["n", "RMS error", "mean error", "rms z", "max abs z", "agree"], rows)
    sizes = [int(n) for n in data["lyapunov"]]
    return lines + ["", f"fitted slope of log(RMS error) against log(n): {fitted_slope(sizes, rms):+.3f}"]


def report_w2_s2(data: dict | None) -> list:
    lines = section("2. Noisy softmax S^2 case: W2(Eulerian, particles) against n (criterion 2)", "w2_s2", data)
    if data is None:
        return lines
    lines += [f"Case `s2` at t_end = {data['t_end']}: exact OT (chordal cost) of the n particles of a run against n "
              "exact draws from the Eulerian density (rejection sampling of its band-limited series, "
              "`DensityFileSampler`), and, as the yardstick, of two independent sets of n draws against each other.  "
              "Against the lmax-24 quadrature grid itself W2 would floor at the cell size (~0.05); a fresh "
              "sample instead adds an independent term of the same order as the particles' own.  If the particles "
              "are distributed as rho_t both columns have the same law, and both decay like (log n / n)^(1/2) "
              f"on the 2-sphere (exponent about -0.43 over these n).  RMS over {data['seeds']} seeds:", ""]
    sizes = data["sizes"]
    columns = {key: [math.sqrt(np.mean([r[key] ** 2 for r in data["rows"] if r["n"] == n])) for n in sizes]
               for key in ("particles", "samples")}
    lines += harness.table(["n", "W2(particles, Eulerian draws)", "W2(draws, draws)", "ratio"],
                           [[n, f"{a:.4e}", f"{b:.4e}", f"{a / b:.3f}"]
                            for n, a, b in zip(sizes, columns["particles"], columns["samples"])])
    slopes = {key: fitted_slope(sizes, values) for key, values in columns.items()}
    expected = fitted_slope(sizes, [math.sqrt(math.log(n) / n) for n in sizes])
    return lines + ["", f"fitted exponent: particles {slopes['particles']:+.3f}, two samples {slopes['samples']:+.3f} "
                    f"(sqrt(log n / n) over these n: {expected:+.3f})."]


def report_dims(data: dict | None) -> list:
    lines = section("3. Reproducibility and an invariant in d = 4..16 (criterion 3)", "dims", data)
    if data is None:
        return lines
    lines += [f"n = {data['n']}, seed 3, each run twice.  'invariant': beta = 0, unnormalized, V = I, W = 0, eps = 0, "
              "vMF(e1, d/2) start, Heun dt 0.05 to t = 8: d|m|^2/dt = 2(|m|^2 - (1/n) sum <x_i, m>^2) >= 0, so the "
              "order parameter is nondecreasing (min increment between saves >= 0 up to round-off); the mean "
              "direction is fixed only in the mean-field limit (its turn is O(n^-1/2)).  The second run adds softmax "
              "(beta 2) and noise eps = 0.05 (to t = 1), so the noise stream is checked too.", ""]
    return lines + harness.table(
        ["d", "run", "identical bit for bit", "r(0)", "r(end)", "min increment of r", "turn of m (deg)", "CPU s"],
        [[row["dim"], row["run"], row["identical"], f"{row['r0']:.4f}", f"{row['r_end']:.6f}",
          f"{row['min_increment']:+.1e}", f"{row['turn_degrees']:.2f}", f"{row['seconds']:.1f}"]
         for row in data["rows"]])


def report_inf(data: dict | None) -> list:
    lines = section("4. beta = inf, mean-field mode, seed-003 matrices (criterion 4)", "inf", data)
    if data is None:
        return lines
    n = data["n"]
    lines += [f"cases/baseline-inf.toml with particles.beta_inf_mode = 'mean_field', n = {n} (all saved), RK4 dt "
              f"0.01, to t = {data['times'][-1]:g}.  Particles that changed the sign of x1 between any two saves: "
              f"**{data['switched']}** (and {data['zero_x1']} positions with x1 = 0 exactly).  Hemisphere mass "
              f"{{x1 > 0}}: particles (standard error sqrt(p(1 - p)/n)), the Eulerian run (exact quadrature of its "
              f"band-limited density; lmax 64 resolves the flow until t = {data['resolved_until']}), and the exact "
              f"initial value {data['exact']:.10f} (quadrature of the vMF law; invariant of the flow).", ""]
    rows = []
    for t, p, e, tail in zip(data["times"], data["fraction"], data["eulerian"], data["tail"]):
        se = math.sqrt(p * (1 - p) / n)
        rows.append([f"{t:.2f}", f"{p:.5f}", f"{se:.1e}", f"{e:.10f}", f"{(p - e) / se:+.2f}",
                     f"{e - data['exact']:+.1e}", f"{tail:.1e}{'' if tail <= data['tail_tol'] else ' (unresolved)'}"])
    return lines + harness.table(["t", "particles", "SE", "Eulerian", "(particles - Eulerian) / SE",
                                  "Eulerian - exact", "spectral tail"], rows)


def report_cost(parts: dict) -> list:
    """Criterion 5 from the parts cost and cost_softmax (part -> summary or None)."""
    lines = ["", "## 5. CPU time to an error of 1e-3 in r(10) (criterion 5)", ""]
    if all(data is None for data in parts.values()):
        return lines + ["(not measured)"]
    unsplit = any(row and "eulerian_stepping" not in row for data in parts.values()
                  for row in (data or {}).get("results", {}).values())
    lines += ["One CPU core (process_time). Eulerian: the cheapest (lmax, dt) of the ladder within 1e-3, as a whole "
              "`spherepde.run` and its stepping alone (the run less a one-step run"
              + ("; not measured for the rows measured before this split" if unsplit else "")
              + "). Particles: the time of one run of n_needed = sigma^2 / (tol^2 - b^2) tokens, b = |bias| + its "
              "standard error (sigma^2 / tol^2, a lower bound, where n0 does not resolve the bias: its standard error "
              ">= 1e-3), timed, or extrapolated with the fitted cost exponent where n_needed > max-n.", ""]
    rows = []
    for data in parts.values():
        for name, row in (data or {}).get("results", {}).items():
            if not row:
                continue
            name = {"1": "beta0-s1", "2": "beta0-s2"}.get(name, name)  # the beta = 0 run keyed cases by sphere
            how = f"extrapolated, n^{row['exponent']:.2f}" if "exponent" in row else "timed"
            r = f"{row['r']:.4f}" if "r" in row else "—"
            stepping, stepping_ratio = (f"{row['eulerian_stepping']:.3f}", f"{row['stepping_ratio']:.3g}") \
                if "eulerian_stepping" in row else ("—", "—")
            rows.append([name, r, f"{row['eulerian']:.3f}", stepping, f"{row['n']:.3g}", f"{row['particles']:.3g}",
                         how, f"{row['ratio']:.3g}", stepping_ratio])
    lines += harness.table(["case", "r(10)", "Eulerian run s", "Eulerian stepping s", "n_needed", "particles s", "how",
                            "ratio", "ratio to stepping"], rows)
    for part, data in parts.items():
        if data is not None:
            lines += ["", f"`{COST_BENCHMARK} --case {' '.join(data.get('cases', ['beta0-s1', 'beta0-s2']))} "
                      f"--n0 {data['n0']} --replicas {data['replicas']} --max-n {data['max_n']}` (part `{part}`), its "
                      "output:", "", "```", data["printout"].strip(), "```"]
    return lines


def report(summaries: dict, device: str = "cpu") -> str:
    """The report from the summaries alone (part -> summary, None for a part not measured)."""
    versions = sorted({data.get("torch", TORCH_BEFORE) for data in summaries.values() if data is not None})
    lines = ["# Particle solver: verification against the Eulerian solver (issue 3)", "",
             f"{REGENERATE}  Measured with torch {', '.join(versions)} (CPU, float64, one thread per process)."]
    lines += report_cross_validation("s1", "1-2. Noisy S^1 case: agreement within 3 SE, n^(-1/2) rate, W2 (criteria 1, "
                                     "2)", summaries["s1"], summaries["lyapunov"], device)
    lines += report_cross_validation("s2", "1. Noisy softmax S^2 case, beta = 5: agreement within 3 SE, rate "
                                     "(criterion 1)", summaries["s2"], None, device)
    lines += report_w2_s2(summaries["w2_s2"])
    lines += report_dims(summaries["dims"])
    lines += report_inf(summaries["inf"])
    lines += report_cost({part: summaries[part] for part in ("cost", "cost_softmax")})
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report-only", action="store_true", help="measure nothing: the report from the summaries")
    parser.add_argument("--only", nargs="+", choices=[spec.key for spec in plan()], default=None,
                        help="measure these parts only (if they have no summary), then the report")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the s1 / s2 particles run (their summaries, and the report, are the device's)")
    parser.add_argument("--workers", type=int, default=1, help="s1 / s2 particle runs in parallel processes")
    args = parser.parse_args(argv)
    specs = plan(args.device)
    if not args.report_only:
        STUDY.ensure([spec for spec in specs if args.only is None or spec.key in args.only], summarise=None,
                     measure=functools.partial(measure, device=args.device, workers=args.workers))
    missing = [spec.key for spec in specs if not STUDY.has(spec)]
    if missing:
        log(f"particles_verification: no summary of {', '.join(missing)}: the report says 'not measured'")
    stale = STUDY.stale(specs)
    if stale:
        log("particles_verification: summaries the plan no longer names: " + ", ".join(path.name for path in stale))
    summaries = {spec.key: STUDY.read(spec) if STUDY.has(spec) else None for spec in specs}
    (harness.REPORTS / REPORT).write_text(report(summaries, args.device))


if __name__ == "__main__":
    main()
