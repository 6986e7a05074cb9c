"""Figures of issue 3 (particle solver vs Eulerian solver), measured part by part, then printed as a report.

    python results/particles_verification.py s1 s2 w2_s2 dims inf cost cost_softmax lyapunov --workers 2
    python results/particles_verification.py --report > results/particles_verification.md

Measuring takes about 80 CPU minutes (s2 40 of them; --workers N spreads the s1 / s2 particle runs
over N processes).  Each part stores its raw figures in results/particles/<part>.json (so the
report can be re-rendered without re-measuring) and its figures in results/particles/*.png.  All
runs on the CPU, float64, one thread per process (CPU seconds are time.process_time of the process).
  s1, s2  criterion 1 and 2: benchmarks/particles_cross_validation.py on its cases s1 / s2
          (--device cuda: the particles on the GPU, plan PLAN_CUDA; the Eulerian run stays on the CPU)
  w2_s2   criterion 2 on S^2: W2 of the s2 particles against exact draws from the Eulerian density
  dims    criterion 3: reproducibility bit for bit and the order-parameter invariant, d = 4..16
  inf     criterion 4: beta = inf, mean-field mode, cases/baseline-inf.toml
  cost    criterion 5: benchmarks/particles_vs_eulerian.py, beta = 0 cases, sizes COST below
  cost_softmax  criterion 5 on the softmax beta = 5 cases, sizes COST_SOFTMAX (O(n^2) runs: smaller
          n0, and the time at n_needed extrapolated with a fitted cost exponent)
  lyapunov  (after s1) the Eulerian V_p of case s1 by adaptive quadrature of its band-limited
          density, against which the particles' V_p is compared again (see `singular_lyapunov`)
"""

import argparse
import contextlib
import io
import json
import math
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
from scipy.integrate import quad
from scipy.special import i0e

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import spherepde  # noqa: E402
from benchmarks import particles_cross_validation as cross  # noqa: E402
from benchmarks import particles_vs_eulerian as cost_benchmark  # noqa: E402
from solvers.particles import run_particles  # noqa: E402
from spherepde.analysis.compare import write_report  # noqa: E402
from spherepde.analysis.concentration import hemisphere_mass  # noqa: E402
from spherepde.io.case import case_from_dict  # noqa: E402
from spherepde.io.output import write_dataset  # noqa: E402
from spherepde.measures.optimal_transport import wasserstein2  # noqa: E402
from spherepde.model.attention import principal_subspace  # noqa: E402
from spherepde.model.sampling import DensityFileSampler  # noqa: E402

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "particles")
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
COST = {"n0": 10000, "replicas": 6, "max_n": 100000, "cases": ["beta0-s1", "beta0-s2"]}
COST_SOFTMAX = {"n0": 1000, "replicas": 6, "max_n": 2000, "cases": ["softmax-s1", "softmax-s2"]}


def store(part: str, data: dict):
    os.makedirs(FOLDER, exist_ok=True)
    with open(os.path.join(FOLDER, f"{part}.json"), "w") as handle:
        json.dump(data, handle, indent=1)


def load(part: str) -> dict | None:
    path = os.path.join(FOLDER, f"{part}.json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


# ---------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------


def measure_cross_validation(name: str, device: str = "cpu", workers: int = 1):
    """Criteria 1 and 2: diagnostics and W2 (exact on S^1) against the Eulerian run, n = 1e3..1e5."""
    seeds, replicas = (PLAN if device == "cpu" else PLAN_CUDA)[name]
    w2 = name == "s1"  # on S^2 exact OT of 1e5 particles against the grid is beyond this machine
    result = cross.cross_validate(name, SIZES, seeds, replicas, w2, log=lambda *a, **k: print(*a, file=sys.stderr),
                                  device=device, workers=workers)
    table = cross.statistics(result["runs"])
    report, _ = result["runs"][10000][0]
    write_report(report, os.path.join(FOLDER, f"compare_{name}_n10000"))
    cross.figure(table, f"{name}: RMS over {seeds} seeds (n = {SIZES}) of (particles - Eulerian) at t = "
                        f"{cross.CASES[name]['time']['t_end']:g}", os.path.join(FOLDER, f"rate_{name}.png"))
    seconds = {n: float(np.mean([s for _, s in result["runs"][n]])) for n in SIZES}
    # the raw lyapunov series of every run, for the singular-quadrature check of the Eulerian value
    lyapunov = {n: [[report["lyapunov_b"].values.tolist(), report["lyapunov_stderr"].values.tolist()]
                    for report, _ in result["runs"][n]] for n in SIZES}
    where = "CPU" if device == "cpu" else f"{torch.cuda.get_device_name()} wall, torch {torch.__version__}"
    store(name, {"table": table, "seeds": seeds, "replicas": replicas, "seconds": seconds, "device": where,
                 "eulerian_seconds": result["eulerian_seconds"], "case": cross.CASES[name],
                 "compare_report": report.attrs["report"], "lyapunov": lyapunov,
                 "eulerian_lyapunov": result["eulerian"]["lyapunov"].values.tolist()})


def measure_w2_s2():
    """Criterion 2 on S^2: W2(rho_t, particles) at t_end by exact OT of the n particles against n exact
    draws from the Eulerian density (DensityFileSampler), next to the same between two independent sets
    of n draws (the pure sampling error of that estimator).

    Against the quadrature grid itself (lmax 24) W2 would floor at the cell size (~0.05 rad); n exact
    draws instead add an independent O(n^-1/2) term: if the particles are distributed as rho_t, both
    columns have the same law, W2 of two n-samples ~ sqrt(2) W2(rho, one n-sample) ~ (log n / n)^(1/2)
    on a 2-dimensional manifold (exponent about -0.43 over n = 250..4000).
    """
    table = cross.CASES["s2"]
    eulerian = spherepde.run(case_from_dict(table), progress=False)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "eulerian.nc")
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
            print(f"  w2_s2: n = {n} done", file=sys.stderr, flush=True)
    store("w2_s2", {"rows": rows, "t_end": table["time"]["t_end"], **W2_S2})


def singular_lyapunov(density: np.ndarray, theta: np.ndarray, lmax: int, axis: np.ndarray, p: float) -> float:
    """V_p = int |tan(theta - alpha)|^(2p) rho(theta) dtheta on S^1, E = span((cos alpha, sin alpha)).

    The integrand grows like |theta - alpha -+ pi/2|^(-2p) at the two points where P_E x = 0:
    a uniform grid integrates it with an error of order h^(1 - 2p) (about 1e-2 at lmax 32, p = 0.1),
    while adaptive quadrature (QUADPACK's extrapolation handles algebraic end-point singularities)
    of the band-limited density rho(theta) = sum_{|k| <= lmax} c_k exp(i k theta) is exact to ~1e-12.
    """
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


def measure_lyapunov():
    """Case s1 again (its Eulerian run, a few seconds): the grid V_p and V_p by `singular_lyapunov`, per save."""
    table = cross.CASES["s1"]
    case = case_from_dict(table)
    eulerian = spherepde.run(case, progress=False)
    axis = principal_subspace(np.array(table["model"]["V"]) @ np.eye(2))[:, 0]
    p = table["diagnostics"]["lyapunov_p"][0]
    accurate = [singular_lyapunov(d, eulerian["theta"].values, table["sphere"]["lmax"], axis, p)
                for d in eulerian["density"].values]
    store("lyapunov", {"p": p, "grid": eulerian["lyapunov"].values[:, 0].tolist(), "accurate": accurate,
                       "times": eulerian["time"].values.tolist()})


def invariant_case(dim: int, overrides=()):
    """beta = 0, unnormalized, V = I, W = 0, eps = 0: v = P_x m, d|m|^2/dt = 2 (|m|^2 - (1/n) sum <x_i, m>^2) >= 0."""
    table = {"case": {"name": f"invariant-d{dim}"}, "sphere": {"dim": dim, "lmax": 16},
             "model": {"kernel": "unnormalized", "beta": 0.0, "V": np.eye(dim).tolist(), "eps": 0.0},
             "initial": {"kind": "vmf", "mean": [1.0] + [0.0] * (dim - 1), "kappa": 0.5 * dim},
             "time": {"t_end": 8.0, "dt": 0.05, "save_every": 0.25},
             "particles": {"n": 4000, "seed": 3, "integrator": "heun", "save": 4000},
             "diagnostics": {"w2": False}, "solver": {"device": "cpu"}}
    return case_from_dict(table, overrides)


def measure_dims():
    """Criterion 3: each run twice (bit for bit), the order parameter nondecreasing; with noise and softmax too."""
    rows = []
    for dim in (4, 6, 8, 12, 16):
        for label, overrides in (("invariant", []),
                                 ("softmax beta 2, eps 0.05", ["model.kernel='softmax'", "model.beta=2.0",
                                                               "model.eps=0.05", "time.t_end=1.0"])):
            case = invariant_case(dim, overrides)
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
    store("dims", {"rows": rows, "n": 4000})


def hemisphere_mass_of_vmf(mean, kappa: float) -> float:
    """P(x_1 > 0) for vMF(mean, kappa) on S^2: in coordinates x = (t, s cos psi, s sin psi) the angle
    integral is 2 pi I_0(kappa |mean_perp| s), so P = int_0^1 f / int_-1^1 f, f(t) = exp(kappa mean_1 t) I_0(...)."""
    mean = np.asarray(mean) / np.linalg.norm(mean)
    perp = math.hypot(mean[1], mean[2])

    def f(t):
        argument = kappa * perp * math.sqrt(1 - t * t)
        return math.exp(kappa * mean[0] * t + argument - kappa) * i0e(argument)

    return quad(f, 0, 1, epsabs=0, epsrel=1e-13)[0] / quad(f, -1, 1, epsabs=0, epsrel=1e-13, points=[0])[0]


def measure_inf():
    """Criterion 4: cases/baseline-inf.toml, particles.beta_inf_mode = mean_field, n = 1e5, RK4."""
    n = 100000
    overrides = ["solver.device='cpu'", "particles.beta_inf_mode='mean_field'", f"particles.n={n}",
                 f"particles.save={n}", "particles.seed=3", "particles.integrator='rk4'", "particles.dt=0.01"]
    case = spherepde.load_case("cases/baseline-inf.toml", overrides)
    eulerian = spherepde.run(case, progress=False)
    particles = run_particles(case, progress=False)
    signs = np.sign(particles["particles"].values[..., 0])
    switched = int((signs != signs[0]).any(axis=0).sum())
    fraction = (signs > 0).mean(axis=1)
    masses = list(hemisphere_mass(eulerian, [1.0, 0.0, 0.0]))
    tail = eulerian["spectral_tail"].values
    exact = hemisphere_mass_of_vmf(case["initial"]["mean"], case["initial"]["kappa"])
    resolved = eulerian.attrs["resolved_until"]  # a time, or "end"
    store("inf", {"n": n, "times": particles["time"].values.tolist(), "switched": switched,
                  "zero_x1": int((signs == 0).sum()), "fraction": fraction.tolist(), "eulerian": masses,
                  "tail": tail.tolist(), "tail_tol": case["diagnostics"]["tail_tol"], "exact": exact,
                  "resolved_until": resolved if isinstance(resolved, str) else f"{resolved:.4g}"})


def measure_cost(part: str = "cost", sizes: dict = COST):
    """Criterion 5: the benchmark's own printout, captured."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        results = {name: cost_benchmark.benchmark(name, sizes["n0"], sizes["replicas"], sizes["max_n"])
                   for name in sizes["cases"]}
    store(part, {"results": results, "printout": text.getvalue(), **sizes})


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------


def section(part: str, title: str) -> dict | None:
    """Print the heading of a report section; the part's stored figures, or None (and a line saying so)."""
    print(f"\n## {title}\n")
    data = load(part)
    if data is None:
        print(f"(not measured: run `python results/particles_verification.py {part}`)")
    return data


def report_cross_validation(name: str, title: str):
    data = section(name, title)
    if data is None:
        return
    print(f"Case `{name}` of benchmarks/particles_cross_validation.py: model {json.dumps(data['case']['model'])}, "
          f"initial {json.dumps(data['case']['initial'])}, t_end = {data['case']['time']['t_end']}, "
          f"particles {json.dumps(data['case']['particles'])}.  "
          f"Seeds per n {dict(zip(SIZES, data['seeds']))}; "
          f"systems per run {dict(zip(SIZES, data['replicas']))} (standard errors by batch means where > 1, "
          f"i.i.d. formulas where 1).  Eulerian run {data['eulerian_seconds']:.1f} s; particle runs "
          + ", ".join(f"n = {n}: {s:.1f} s" for n, s in data["seconds"].items())
          + f" ({data.get('device', 'CPU')}, mean per run).\n")
    print("error = particles - Eulerian at t_end (RMS / mean over seeds, components pooled); mean SE: the runs' "
          "own standard error at t_end; rms z, max |z|: of error / SE over seeds, saves and components; agree: runs "
          "whose `compare` verdict is |error| <= 3 SE at every save (for w2_projection: <= 3 SE + the runs' "
          "quantisation floor, shown; a floor above the SE makes that verdict weak, and rms z is the test).\n")
    systems = dict(zip(SIZES, data["replicas"]))
    print("What honest standard errors give: with i.i.d. errors (R = 1 system per run) z is normal, rms z = 1, "
          "and a run fails the verdict by chance with probability 1 - 0.9973^k for k values checked (saves x "
          "components: 1-3% here).  A batch-means SE of R systems is itself an estimate with R - 1 degrees of "
          "freedom, so z follows Student's t: rms z = sqrt((R - 1) / (R - 3)) (1.73 for R = 4, 1.13 for R = 10), "
          "and |z| > 3 has probability 5.8% (R = 4) or 1.5% (R = 10) per value: with R = 4, up to about half of "
          "the runs fail by chance (k = 6 to 12 here).  'rms z if honest' below.\n")
    print("The last three columns test the same agreement without trusting the runs' own SE: each run's SE is "
          "the standard deviation of the other seeds' values at that save (leave-one-out), so z is Student t "
          "with seeds - 2 degrees of freedom when the particles are unbiased (rms z sqrt((S - 2) / (S - 4)) for S "
          "seeds: 1.03 for 40, 1.08 for 16, 1.22 for 8), and a run agrees when |error| <= 3 spread at every "
          "save (+ the w2 floor).  A finite-size bias shows as excess rms z here.\n")
    print("| diagnostic | n | RMS error | mean error | mean SE | rms z | rms z if honest | max abs z | agree | "
          "fitted slope | rms z, seeds' spread | if honest | agree, seeds' spread |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for diagnostic, entry in data["table"].items():
        if diagnostic == "w2":
            continue
        for i, row in enumerate(entry["rows"]):
            slope = f"{entry['slope']:+.3f}" if i == 0 and "slope" in entry else ""
            floor = f" (floor {row['floor']:.2g})" if "floor" in row else ""
            count = systems[row["n"]]
            honest = 1.0 if count == 1 else math.sqrt((count - 1) / (count - 3)) if count > 3 else math.inf
            runs = row["runs"]
            spread = (f"{row['rms_z_spread']:.2f} | {math.sqrt((runs - 2) / (runs - 4)) if runs > 4 else math.inf:.2f}"
                      f" | {row['agree_spread']}/{runs}" if "rms_z_spread" in row else "- | - | -")
            print(f"| {diagnostic} | {row['n']} | {row['rms_error']:.3e} | {row['mean_error']:+.2e} | "
                  f"{row['mean_se']:.2e} | {row['rms_z']:.2f} | {honest:.2f} | {row['max_z']:.2f} | "
                  f"{row['agree']}/{runs}{floor} | {slope} | {spread} |")
    if "w2" in data["table"]:
        w2 = data["table"]["w2"]
        print(f"\nW2(Eulerian, particles) at t_end, RMS over seeds [{w2['method']}]: "
              + ", ".join(f"n = {n}: {v:.3e}" for n, v in zip(w2["sizes"], w2["rms"]))
              + f"; fitted exponent {w2['slope']:+.3f}.")
    if name == "s1":
        report_lyapunov(data)
    print(f"\nFigure: results/particles/rate_{name}.png; one comparison (n = 10000, seed 0): "
          f"results/particles/compare_{name}_n10000.png, its table:\n\n```\n{data['compare_report']}\n```")


def report_w2_s2():
    data = section("w2_s2", "2. Noisy softmax S^2 case: W2(Eulerian, particles) against n (criterion 2)")
    if data is None:
        return
    print(f"Case `s2` at t_end = {data['t_end']}: exact OT (chordal cost) of the n particles of a run against n "
          "exact draws from the Eulerian density (rejection sampling of its band-limited series, "
          "`DensityFileSampler`), and, as the yardstick, of two independent sets of n draws against each other.  "
          "Against the lmax-24 quadrature grid itself W2 would floor at the cell size (~0.05); a fresh "
          "sample instead adds an independent term of the same order as the particles' own.  If the particles "
          "are distributed as rho_t both columns have the same law, and both decay like (log n / n)^(1/2) "
          f"on the 2-sphere (exponent about -0.43 over these n).  RMS over {data['seeds']} seeds:\n")
    print("| n | W2(particles, Eulerian draws) | W2(draws, draws) | ratio |")
    print("|---|---|---|---|")
    sizes = data["sizes"]
    columns = {key: [math.sqrt(np.mean([r[key] ** 2 for r in data["rows"] if r["n"] == n])) for n in sizes]
               for key in ("particles", "samples")}
    for n, a, b in zip(sizes, columns["particles"], columns["samples"]):
        print(f"| {n} | {a:.4e} | {b:.4e} | {a / b:.3f} |")
    slopes = {key: cross.fitted_slope(sizes, values) for key, values in columns.items()}
    expected = cross.fitted_slope(sizes, [math.sqrt(math.log(n) / n) for n in sizes])
    print(f"\nfitted exponent: particles {slopes['particles']:+.3f}, two samples {slopes['samples']:+.3f} "
          f"(sqrt(log n / n) over these n: {expected:+.3f}).")


def report_lyapunov(data: dict):
    """The particles' lyapunov against the Eulerian V_p by singular quadrature instead of the grid's."""
    reference = load("lyapunov")
    if reference is None:
        return
    accurate = np.array(reference["accurate"])
    bias = np.array(reference["grid"]) - accurate
    print(f"\nlyapunov (p = {reference['p']}): the Eulerian run's grid quadrature of the singular integrand is "
          f"off by {bias.min():+.4f} .. {bias.max():+.4f} (against adaptive quadrature of the same band-limited "
          "density, `singular_lyapunov`; at t = 0 that agrees with quadrature of the exact vMF law).  The "
          "particles against the accurate value:\n")
    print("| n | RMS error | mean error | rms z | max abs z | agree |\n|---|---|---|---|---|---|")
    rms = []
    for n, runs in data["lyapunov"].items():
        values = np.array([v for v, _ in runs])[..., 0]
        errors = np.array([e for _, e in runs])[..., 0]
        difference = values - accurate
        z = difference / errors
        rms.append(math.sqrt(np.mean(difference[:, -1] ** 2)))
        agree = int((np.abs(difference) <= 3 * errors).all(axis=1).sum())
        print(f"| {n} | {rms[-1]:.3e} | {difference[:, -1].mean():+.2e} | {math.sqrt(np.mean(z ** 2)):.2f} | "
              f"{np.abs(z).max():.2f} | {agree}/{len(runs)} |")
    sizes = [int(n) for n in data["lyapunov"]]
    print(f"\nfitted slope of log(RMS error) against log(n): {cross.fitted_slope(sizes, rms):+.3f}")


def report_dims():
    data = section("dims", "3. Reproducibility and an invariant in d = 4..16 (criterion 3)")
    if data is None:
        return
    print(f"n = {data['n']}, seed 3, each run twice.  'invariant': beta = 0, unnormalized, V = I, W = 0, eps = 0, "
          "vMF(e1, d/2) start, Heun dt 0.05 to t = 8: d|m|^2/dt = 2(|m|^2 - (1/n) sum <x_i, m>^2) >= 0, so the order "
          "parameter is nondecreasing (min increment between saves >= 0 up to round-off); the mean direction is "
          "fixed only in the mean-field limit (its turn is O(n^-1/2)).  The second run adds softmax (beta 2) and "
          "noise eps = 0.05 (to t = 1), so the noise stream is checked too.\n")
    print("| d | run | identical bit for bit | r(0) | r(end) | min increment of r | turn of m (deg) | CPU s |")
    print("|---|---|---|---|---|---|---|---|")
    for row in data["rows"]:
        print(f"| {row['dim']} | {row['run']} | {row['identical']} | {row['r0']:.4f} | {row['r_end']:.6f} | "
              f"{row['min_increment']:+.1e} | {row['turn_degrees']:.2f} | {row['seconds']:.1f} |")


def report_inf():
    data = section("inf", "4. beta = inf, mean-field mode, seed-003 matrices (criterion 4)")
    if data is None:
        return
    n = data["n"]
    print(f"cases/baseline-inf.toml with particles.beta_inf_mode = 'mean_field', n = {n} (all saved), RK4 dt 0.01, "
          f"to t = {data['times'][-1]:g}.  Particles that changed the sign of x1 between any two saves: "
          f"**{data['switched']}** (and {data['zero_x1']} positions with x1 = 0 exactly).  Hemisphere mass "
          f"{{x1 > 0}}: particles (standard error sqrt(p(1 - p)/n)), the Eulerian run (exact quadrature of its "
          f"band-limited density; lmax 64 resolves the flow until t = {data['resolved_until']}), and the exact "
          f"initial value {data['exact']:.10f} (quadrature of the vMF law; invariant of the flow).\n")
    print("| t | particles | SE | Eulerian | (particles - Eulerian) / SE | Eulerian - exact | spectral tail |")
    print("|---|---|---|---|---|---|---|")
    for t, p, e, tail in zip(data["times"], data["fraction"], data["eulerian"], data["tail"]):
        se = math.sqrt(p * (1 - p) / n)
        print(f"| {t:.2f} | {p:.5f} | {se:.1e} | {e:.10f} | {(p - e) / se:+.2f} | {e - data['exact']:+.1e} | "
              f"{tail:.1e}{'' if tail <= data['tail_tol'] else ' (unresolved)'} |")


def report_cost():
    parts = [(part, load(part)) for part in ("cost", "cost_softmax")]
    print("\n## 5. CPU time to an error of 1e-3 in r(10) (criterion 5)\n")
    if all(data is None for _, data in parts):
        print("(not measured)")
        return
    print("One CPU core (process_time). Eulerian: the cheapest (lmax, dt) of the ladder within 1e-3, as a whole "
          "`spherepde.run` and its stepping alone (the run less a one-step run; not measured for the beta = 0 rows, "
          "measured before this split). Particles: the time of one run of n_needed = sigma^2 / (tol^2 - bias^2) "
          "tokens, timed, or extrapolated with the fitted cost exponent where n_needed > max-n.\n")
    print("| case | r(10) | Eulerian run s | Eulerian stepping s | n_needed | particles s | how | ratio | "
          "ratio to stepping |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _part, data in parts:
        for name, row in (data or {}).get("results", {}).items():
            if not row:
                continue
            name = {"1": "beta0-s1", "2": "beta0-s2"}.get(name, name)  # the beta = 0 run keyed cases by sphere
            how = f"extrapolated, n^{row['exponent']:.2f}" if "exponent" in row else "timed"
            r = f"{row['r']:.4f}" if "r" in row else "—"
            stepping, stepping_ratio = (f"{row['eulerian_stepping']:.3f}", f"{row['stepping_ratio']:.3g}") \
                if "eulerian_stepping" in row else ("—", "—")
            print(f"| {name} | {r} | {row['eulerian']:.3f} | {stepping} | {row['n']:.3g} | {row['particles']:.3g} | "
                  f"{how} | {row['ratio']:.3g} | {stepping_ratio} |")
    for part, data in parts:
        if data is not None:
            print(f"\n`benchmarks/particles_vs_eulerian.py "
                  f"--case {' '.join(data.get('cases', ['beta0-s1', 'beta0-s2']))} "
                  f"--n0 {data['n0']} --replicas {data['replicas']} --max-n {data['max_n']}` (part `{part}`), its "
                  f"output:\n\n```\n{data['printout'].strip()}\n```")


def report():
    print("# Particle solver: verification against the Eulerian solver (issue 3)\n")
    print(f"Generated by `python results/particles_verification.py --report` from the figures measured by "
          "`python results/particles_verification.py s1 s2 w2_s2 dims inf cost cost_softmax lyapunov --workers 2` "
          f"(torch {torch.__version__}, CPU, float64, one thread per process).")
    report_cross_validation("s1", "1-2. Noisy S^1 case: agreement within 3 SE, n^(-1/2) rate, W2 (criteria 1, 2)")
    report_cross_validation("s2", "1. Noisy softmax S^2 case, beta = 5: agreement within 3 SE, rate (criterion 1)")
    report_w2_s2()
    report_dims()
    report_inf()
    report_cost()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    measure = {"s1": lambda: measure_cross_validation("s1", args.device, args.workers),
               "s2": lambda: measure_cross_validation("s2", args.device, args.workers),
               "w2_s2": measure_w2_s2, "dims": measure_dims, "inf": measure_inf, "cost": measure_cost,
               "cost_softmax": lambda: measure_cost("cost_softmax", COST_SOFTMAX), "lyapunov": measure_lyapunov}
    # (no `choices`: argparse rejects an empty list against them for nargs="*")
    parser.add_argument("parts", nargs="*", help=f"parts to measure, of {', '.join(measure)}")
    parser.add_argument("--report", action="store_true", help="print the markdown report from the stored figures")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the s1 / s2 particles run")
    parser.add_argument("--workers", type=int, default=1, help="s1 / s2 particle runs in parallel processes")
    args = parser.parse_args()
    unknown = set(args.parts) - set(measure)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", RuntimeWarning)
    for part in args.parts:
        started = time.process_time()
        measure[part]()
        print(f"{part}: {time.process_time() - started:.0f} CPU s", file=sys.stderr)
    if args.report:
        report()


if __name__ == "__main__":
    main()
