"""Figures of the core verification (issue: Eulerian solver): results/core_verification.md.

    OMP_NUM_THREADS=1 python3 results/core_verification.py                  # measure what has no summary, report
    OMP_NUM_THREADS=1 python3 results/core_verification.py --report-only    # the report from the summaries alone

Each figure is measured here, on this machine, by the public API (under a minute of CPU on one core, all six).  A
section's raw numbers are one summary of the results harness (results/harness.py),
results/core_verification/runs/<key>-<digest>.json, the digest that of the section's plan (`parameters`: what
it runs, with which overrides), so a changed plan is a new summary and the report is written from the summaries
alone.
"""

import math
import time

import harness

STUDY = harness.Study("core_verification")
REPORT = harness.REPORTS / "core_verification.md"

# The plan of each section, what it runs: (case file, overrides) per run; a spec's parameters are this text.
SHT = {"lmax": 63, "nlat": 96, "nlon": 192, "seed": 0, "dtypes": ["float64", "float32"]}


def heat_run(dim: int, scheme: str, dt: float) -> tuple:
    V = "[[0,0],[0,0]]" if dim == 2 else "[[0,0,0],[0,0,0],[0,0,0]]"
    mean = "[0.6,0.8]" if dim == 2 else "[0.6,0,0.8]"
    return ("cases/kuramoto-s1.toml" if dim == 2 else "cases/heat-s2.toml",
            ["model.eps=0.05", f"model.V={V}", "initial.kind=vmf", f"initial.mean={mean}", "initial.kappa=8.0",
             "time.t_end=1.0", f"time.dt={dt}", "time.save_every=1.0", f"time.scheme={scheme}", "sphere.lmax=16"])


def decay_run(dim: int, K: float) -> tuple:
    V = f"[[{K},0],[0,{K}]]" if dim == 2 else f"[[{K},0,0],[0,{K},0],[0,0,{K}]]"
    return (f"cases/kuramoto-s{dim - 1}.toml", ["model.eps=0.5", f"model.V={V}", "time.t_end=120.0", "time.dt=0.1",
                                               f"time.save_every={DECAY_SAVE}", "sphere.lmax=16"])


HEAT = [(dim, scheme, dt) for dim in (2, 3) for scheme, dt in (("lawson-rk4", 0.1), ("imex-ark436", 0.01),
                                                                ("imex-ark436", 0.005))]
MASS = ("cases/convergence-s2.toml", ["sphere.lmax=8", "model.eps=0.2", "time.t_end=5.0", "time.dt=0.005",
                                      "time.save_every=5.0", "initial.kappas=[1.0, 1.0]"])
CONVERGENCE_SCHEMES = ["imex-ark436", "imex-ars443"]
CONVERGENCE_DTS = [0.00625, 0.1, 0.05, 0.025]  # the first is the reference
CONVERGENCE_LMAXES = [16, 24, 32, 48]  # the last is the reference
TEMPORAL = {scheme: [("cases/convergence-s2.toml", ["sphere.lmax=12", f"time.dt={dt}", "time.save_every=1.0",
                                                     f"time.scheme={scheme}"]) for dt in CONVERGENCE_DTS]
            for scheme in CONVERGENCE_SCHEMES}
SPATIAL = {lmax: ("cases/convergence-s2.toml", [f"sphere.lmax={lmax}", "time.t_end=1.0", "time.dt=0.05",
                                                "time.save_every=1.0"]) for lmax in CONVERGENCE_LMAXES}
STATIONARY = [(dim, eps, (f"cases/kuramoto-s{dim - 1}.toml", [f"model.eps={eps}", "time.t_end=150.0", "time.dt=0.1",
                                                              "time.save_every=50.0"]))
              for dim, eps in ((2, 0.25), (2, 0.4), (3, 0.2), (3, 0.3))]
DECAY_SAVE = 20.0
DECAY = [(dim, K, decay_run(dim, K)) for dim, K in ((2, 0.9), (3, 1.35))]
ZERO_TEMPERATURE = ("cases/baseline-inf.toml", ["time.t_end=1.0", "time.save_every=0.1"])
TAIL_TOL = 1e-6  # diagnostics.tail_tol of the case: "resolved"

SPECS = [
    harness.Spec("sht", parameters=f"torch SHT vs shtns on random band-limited data: {SHT}"),
    harness.Spec("heat", parameters="heat equation, max relative error of the decay of the modes above 1e-5 max: "
                                    + repr([heat_run(*run) for run in HEAT])),
    harness.Spec("mass", parameters=f"|mass - 1| at the end: {MASS!r}"),
    harness.Spec("convergence", parameters=f"max error of the density vs the first dt: {TEMPORAL!r}; L2 error vs "
                                           f"the last lmax: {SPATIAL!r}"),
    harness.Spec("kuramoto", parameters="order parameter at the end, and the closed form: "
                                        + repr([run for *_, run in STATIONARY]) + "; order parameter at each save: "
                                        + repr([run for *_, run in DECAY])),
    harness.Spec("zero_temperature", parameters=f"mass of {{x1 > 0}} and spectral tail at each save, resolved_until, "
                                                f"notes: {ZERO_TEMPERATURE!r}"),
]


def run(path, overrides):
    import spherepde

    return spherepde.run(spherepde.load_case(path, list(overrides)), progress=False)


def coefficients(dataset, index=-1):
    import torch

    import spherepde
    from spherepde.base.device import placement
    from spherepde.discretisation.bases import make_basis

    case = spherepde.load_case_text(dataset.attrs["case"])
    basis = make_basis(case.dim, case["sphere"]["lmax"], placement("cpu", "float64"))
    return basis, basis.analysis(torch.as_tensor(dataset["density"].isel(time=index).values))


def sht_agreement() -> dict:
    import torch

    from spherepde.discretisation.transforms.sht_shtns import ShtnsSHT
    from spherepde.discretisation.transforms.sht_torch import TorchSHT

    lmax, nlat, nlon = SHT["lmax"], SHT["nlat"], SHT["nlon"]
    reference = ShtnsSHT(lmax, nlat, nlon)
    generator = torch.Generator().manual_seed(SHT["seed"])
    c = torch.complex(torch.randn(lmax + 1, lmax + 1, generator=generator, dtype=torch.float64),
                      torch.randn(lmax + 1, lmax + 1, generator=generator, dtype=torch.float64))
    c = c * (torch.arange(lmax + 1)[None, :] >= torch.arange(lmax + 1)[:, None])
    c[0] = c[0].real.to(c.dtype)
    rows = []
    for dtype in (getattr(torch, name) for name in SHT["dtypes"]):
        sht = TorchSHT(lmax, nlat, nlon, dtype=dtype)
        f_ref = reference.synthesis(c)
        vt_ref, vp_ref = reference.vector_synthesis(c, c)

        def rel(a, b):
            return float((a.to(torch.complex128 if b.is_complex() else torch.float64) - b).abs().max() / b.abs().max())

        cc = c.to(sht.complex_dtype)
        vt, vp = sht.vector_synthesis(cc, cc)
        S, T = sht.vector_analysis(vt_ref.to(dtype), vp_ref.to(dtype))
        S_ref, T_ref = reference.vector_analysis(vt_ref, vp_ref)
        rows.append({"dtype": str(dtype).removeprefix("torch."),
                     "scalar_synthesis": rel(sht.synthesis(cc), f_ref),
                     "scalar_analysis": rel(sht.analysis(f_ref.to(dtype)), reference.analysis(f_ref)),
                     "vector_synthesis": max(rel(vt, vt_ref), rel(vp, vp_ref)),
                     "vector_analysis": max(rel(S, S_ref), rel(T, T_ref))})
    return {"rows": rows}


def heat() -> dict:
    import torch

    rows = []
    for dim, scheme, dt in HEAT:
        dataset = run(*heat_run(dim, scheme, dt))
        basis, c0 = coefficients(dataset, 0)
        _, c1 = coefficients(dataset, -1)
        expected = c0 * torch.exp(0.05 * basis.laplacian)
        keep = expected.abs() > 1e-5 * c0.abs().max()
        error = float(((c1 - expected).abs()[keep] / expected.abs()[keep]).max())
        rows.append({"dim": dim, "scheme": scheme, "dt": dt, "max_relative_error": error,
                     "highest_degree": int(basis.degree[keep].max())})
    return {"rows": rows}


def mass() -> dict:
    dataset = run(*MASS)
    return {"steps": int(dataset.attrs["steps"]), "mass": float(dataset["mass"][-1])}


def convergence() -> dict:
    import numpy as np

    temporal = []
    for scheme in CONVERGENCE_SCHEMES:
        reference, errors = None, []
        for path, overrides in TEMPORAL[scheme]:
            density = run(path, overrides)["density"].values[-1]
            if reference is None:
                reference = density
            else:
                errors.append(float(np.abs(density - reference).max()))
        temporal.append({"scheme": scheme, "dt": CONVERGENCE_DTS[1:], "max_error": errors})
    runs = {lmax: coefficients(run(*SPATIAL[lmax])) for lmax in CONVERGENCE_LMAXES}
    top = CONVERGENCE_LMAXES[-1]
    basis, reference = runs[top]
    spatial = [{"lmax": lmax, "l2_error": math.sqrt(float(basis.norm_squared(basis.resize(runs[lmax][1], top)
                                                                             - reference)))}
               for lmax in CONVERGENCE_LMAXES[:-1]]
    return {"temporal": temporal, "spatial": spatial, "reference_lmax": top}


def kuramoto() -> dict:
    from scipy.optimize import brentq
    from scipy.special import i0e, i1e

    stationary = []
    for dim, eps, (path, overrides) in STATIONARY:
        r = float(run(path, overrides)["order_parameter"][-1])
        if dim == 2:
            exact = brentq(lambda x: i1e(x / eps) / i0e(x / eps) - x, 1e-6, 1 - 1e-12, xtol=1e-15)
        else:
            exact = brentq(lambda x: 1 / math.tanh(x / eps) - eps / x - x, 1e-6, 1 - 1e-12, xtol=1e-15)
        stationary.append({"dim": dim, "K": 1, "eps": eps, "r": r, "r_closed_form": float(exact)})
    decay = []
    for dim, K, (path, overrides) in DECAY:
        r = run(path, overrides)["order_parameter"].values
        decay.append({"dim": dim, "K": K, "r": [float(value) for value in r]})
    return {"stationary": stationary, "decay": decay}


def zero_temperature() -> dict:
    from spherepde.analysis.concentration import hemisphere_mass

    dataset = run(*ZERO_TEMPERATURE)
    masses = hemisphere_mass(dataset, [1.0, 0.0, 0.0])  # exact for the band-limited density
    return {"time": [float(t) for t in dataset["time"].values], "mass_x1_positive": [float(m) for m in masses],
            "spectral_tail": [float(tail) for tail in dataset["spectral_tail"].values],
            "resolved_until": float(dataset.attrs["resolved_until"]), "notes": str(dataset.attrs["notes"])}


MEASURE = {"sht": sht_agreement, "heat": heat, "mass": mass, "convergence": convergence, "kuramoto": kuramoto,
           "zero_temperature": zero_temperature}


def measure(spec: harness.Spec) -> dict:
    """The raw numbers of one section, with the torch version that measured them and its CPU seconds."""
    import torch

    torch.set_num_threads(1)
    start = time.process_time()
    numbers = MEASURE[spec.key]()
    return {"parameters": spec.parameters, "torch": torch.__version__, "seconds": time.process_time() - start} | numbers


def report(summaries: dict) -> str:
    """The report from the summaries alone (key -> summary)."""
    versions = sorted({summary["torch"] for summary in summaries.values()})
    lines = ["# Core verification figures", "",
             f"Generated by `python3 results/core_verification.py` (torch {', '.join(versions)}, CPU, float64).", ""]
    s = summaries["sht"]
    lines += [f"## 1. torch SHT vs shtns (lmax {SHT['lmax']}, grid {SHT['nlat']} x {SHT['nlon']}, random band-limited "
              "data)", ""]
    lines += harness.table(["dtype", "scalar synthesis", "scalar analysis", "vector synthesis", "vector analysis"],
                           [[row["dtype"]] + [f"{row[name]:.1e}" for name in ("scalar_synthesis", "scalar_analysis",
                                                                             "vector_synthesis", "vector_analysis")]
                            for row in s["rows"]])
    lines += ["", "## 2. Heat equation: max relative error of the exp(-eps lambda_l t) decay over modes above "
              "round-off (lambda_l = l^2 on S^1, l(l+1) on S^2: the Laplacian's eigenvalues)", ""]
    lines += harness.table(["sphere", "scheme", "dt", "max rel. error", "highest degree checked"],
                           [[f"S^{row['dim'] - 1}", row["scheme"], row["dt"], f"{row['max_relative_error']:.1e}",
                             row["highest_degree"]] for row in summaries["heat"]["rows"]])
    s = summaries["mass"]
    lines += ["", f"## 3. Mass after {s['steps']} steps (softmax, beta 5, S^2, lmax 8): |mass - 1| = "
              f"{abs(s['mass'] - 1):.1e}", ""]
    s = summaries["convergence"]
    lines += ["## 4. Convergence on cases/convergence-s2.toml (softmax, beta 5, eps 0.05, general B, V, W)", "",
              f"Temporal (lmax 12, t = 1, max error of the density vs dt = {CONVERGENCE_DTS[0]}):", ""]
    dts = s["temporal"][0]["dt"]
    rows = []
    for row in s["temporal"]:
        errors = row["max_error"]
        orders = [math.log2(a / b) for a, b in zip(errors[:-1], errors[1:])]
        rows.append([row["scheme"], *(f"{e:.2e}" for e in errors), ", ".join(f"{o:.2f}" for o in orders)])
    lines += harness.table(["scheme", f"dt = {dts[0]}", *dts[1:], "observed orders"], rows)
    lines += ["", f"Spatial (t = 1, same dt, L2 error vs lmax {s['reference_lmax']}):", ""]
    lines += harness.table(["lmax", "L2 error"], [[row["lmax"], f"{row['l2_error']:.2e}"] for row in s["spatial"]])
    s = summaries["kuramoto"]
    lines += ["", "## 5. Noisy Kuramoto: stationary order parameter vs the closed form", ""]
    lines += harness.table(["sphere", "K", "eps", "r (solver)", "r (closed form)", "difference"],
                           [[f"S^{row['dim'] - 1}", row["K"], row["eps"], f"{row['r']:.10f}",
                             f"{row['r_closed_form']:.10f}", f"{abs(row['r'] - row['r_closed_form']):.1e}"]
                            for row in s["stationary"]])
    lines += ["", "Below threshold (eps = 0.5): measured decay rate of r vs the linearisation", ""]
    rows = []
    for row in s["decay"]:
        K, r = row["K"], row["r"]
        theory = 0.5 - K / 2 if row["dim"] == 2 else 1.0 - 2 * K / 3
        rows.append([f"S^{row['dim'] - 1}", K, f"{-math.log(r[-1] / r[-2]) / DECAY_SAVE:.6f}", f"{theory:.6f}"])
    lines += harness.table(["sphere", "K", "rate (solver)", "rate (theory)"], rows)
    s = summaries["zero_temperature"]
    masses = s["mass_x1_positive"]
    lines += ["", "## 6. beta = inf, seed-003 matrices (cases/baseline-inf.toml, lmax 64)", ""]
    lines += harness.table(["t", "mass {x1 > 0}", "drift", "spectral tail", "resolved"],
                           [[f"{t:.1f}", f"{m:.10f}", f"{abs(m - masses[0]):.1e}", f"{tail:.1e}", tail <= TAIL_TOL]
                            for t, m, tail in zip(s["time"], masses, s["spectral_tail"])])
    lines += ["", f"resolved_until = {s['resolved_until']}; notes: {s['notes']}", "",
              f"(total {sum(summary['seconds'] for summary in summaries.values()):.0f} s)"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    summaries = harness.measurement_main(argv, __doc__.splitlines()[0], STUDY, SPECS, measure,
                                         "python3 results/core_verification.py")
    REPORT.write_text(report(summaries))


if __name__ == "__main__":
    main()
