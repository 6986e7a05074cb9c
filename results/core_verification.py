r"""Figures of the core verification (issue: Eulerian solver), printed as a markdown report.

    python3 results/core_verification.py | grep -v "^\[SHTns" > results/core_verification.md

Each figure is measured here, on this machine, by the public API (a few minutes on 2 cores).
"""

import math
import time

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.special import i0e, i1e

import spherepde
from spherepde.analysis.concentration import hemisphere_mass
from spherepde.base.device import placement
from spherepde.discretisation.bases import make_basis
from spherepde.discretisation.transforms.sht_shtns import ShtnsSHT
from spherepde.discretisation.transforms.sht_torch import TorchSHT

CPU64 = placement("cpu", "float64")


def run(path, *overrides):
    return spherepde.run(spherepde.load_case(path, list(overrides)), progress=False)


def coefficients(dataset, index=-1):
    case = spherepde.load_case_text(dataset.attrs["case"])
    basis = make_basis(case.dim, case["sphere"]["lmax"], CPU64)
    return basis, basis.analysis(torch.as_tensor(dataset["density"].isel(time=index).values))


def sht_agreement():
    lmax, nlat, nlon = 63, 96, 192
    reference = ShtnsSHT(lmax, nlat, nlon)
    generator = torch.Generator().manual_seed(0)
    c = torch.complex(torch.randn(lmax + 1, lmax + 1, generator=generator, dtype=torch.float64),
                      torch.randn(lmax + 1, lmax + 1, generator=generator, dtype=torch.float64))
    c = c * (torch.arange(lmax + 1)[None, :] >= torch.arange(lmax + 1)[:, None])
    c[0] = c[0].real.to(c.dtype)
    rows = []
    for dtype in (torch.float64, torch.float32):
        sht = TorchSHT(lmax, nlat, nlon, dtype=dtype)
        f_ref = reference.synthesis(c)
        vt_ref, vp_ref = reference.vector_synthesis(c, c)

        def rel(a, b):
            return float((a.to(torch.complex128 if b.is_complex() else torch.float64) - b).abs().max() / b.abs().max())

        cc = c.to(sht.complex_dtype)
        vt, vp = sht.vector_synthesis(cc, cc)
        S, T = sht.vector_analysis(vt_ref.to(dtype), vp_ref.to(dtype))
        S_ref, T_ref = reference.vector_analysis(vt_ref, vp_ref)
        rows.append((str(dtype).removeprefix("torch."), rel(sht.synthesis(cc), f_ref),
                     rel(sht.analysis(f_ref.to(dtype)), reference.analysis(f_ref)),
                     max(rel(vt, vt_ref), rel(vp, vp_ref)), max(rel(S, S_ref), rel(T, T_ref))))
    print("## 1. torch SHT vs shtns (lmax 63, grid 96 x 192, random band-limited data)\n")
    print("| dtype | scalar synthesis | scalar analysis | vector synthesis | vector analysis |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row[0]} | " + " | ".join(f"{v:.1e}" for v in row[1:]) + " |")


def heat():
    print("\n## 2. Heat equation: max relative error of exp(-eps l(l+1) t) decay over modes above round-off\n")
    print("| sphere | scheme | dt | max rel. error | highest degree checked |\n|---|---|---|---|---|")
    for dim, path in ((2, "cases/kuramoto-s1.toml"), (3, "cases/heat-s2.toml")):
        for scheme, dt in (("lawson-rk4", 0.1), ("imex-ark436", 0.01), ("imex-ark436", 0.005)):
            V = "[[0,0],[0,0]]" if dim == 2 else "[[0,0,0],[0,0,0],[0,0,0]]"
            mean = "[0.6,0.8]" if dim == 2 else "[0.6,0,0.8]"
            dataset = run(path, "model.eps=0.05", f"model.V={V}", "initial.kind=vmf", f"initial.mean={mean}",
                          "initial.kappa=8.0", "time.t_end=1.0", f"time.dt={dt}", "time.save_every=1.0",
                          f"time.scheme={scheme}", "sphere.lmax=16")
            basis, c0 = coefficients(dataset, 0)
            _, c1 = coefficients(dataset, -1)
            expected = c0 * torch.exp(0.05 * basis.laplacian)
            keep = expected.abs() > 1e-5 * c0.abs().max()
            error = float(((c1 - expected).abs()[keep] / expected.abs()[keep]).max())
            print(f"| S^{dim - 1} | {scheme} | {dt} | {error:.1e} | {int(basis.degree[keep].max())} |")


def mass():
    dataset = run("cases/convergence-s2.toml", "sphere.lmax=8", "model.eps=0.2", "time.t_end=5.0", "time.dt=0.005",
                  "time.save_every=5.0", "initial.kappas=[1.0, 1.0]")
    print(f"\n## 3. Mass after {dataset.attrs['steps']} steps (softmax, beta 5, S^2, lmax 8): "
          f"|mass - 1| = {abs(float(dataset['mass'][-1]) - 1):.1e}\n")


def convergence():
    print("## 4. Convergence on cases/convergence-s2.toml (softmax, beta 5, eps 0.05, general B, V, W)\n")
    print("Temporal (lmax 12, t = 1, max error of the density vs dt = 0.00625):\n")
    print("| scheme | dt = 0.1 | 0.05 | 0.025 | observed orders |\n|---|---|---|---|---|")
    for scheme in ("imex-ark436", "imex-ars443"):
        reference, errors = None, []
        for dt in (0.00625, 0.1, 0.05, 0.025):
            density = run("cases/convergence-s2.toml", "sphere.lmax=12", f"time.dt={dt}", "time.save_every=1.0",
                          f"time.scheme={scheme}")["density"].values[-1]
            if reference is None:
                reference = density
            else:
                errors.append(np.abs(density - reference).max())
        orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
        print(f"| {scheme} | " + " | ".join(f"{e:.2e}" for e in errors) + " | "
              + ", ".join(f"{o:.2f}" for o in orders) + " |")
    runs = {lmax: coefficients(run("cases/convergence-s2.toml", f"sphere.lmax={lmax}", "time.t_end=1.0",
                                   "time.dt=0.05", "time.save_every=1.0")) for lmax in (16, 24, 32, 48)}
    basis, reference = runs[48]
    print("\nSpatial (t = 1, same dt, L2 error vs lmax 48):\n")
    print("| lmax | L2 error |\n|---|---|")
    for lmax in (16, 24, 32):
        error = math.sqrt(float(basis.norm_squared(basis.resize(runs[lmax][1], 48) - reference)))
        print(f"| {lmax} | {error:.2e} |")


def kuramoto():
    print("\n## 5. Noisy Kuramoto: stationary order parameter vs the closed form\n")
    print("| sphere | K | eps | r (solver) | r (closed form) | difference |\n|---|---|---|---|---|---|")
    for dim, path, eps in ((2, "cases/kuramoto-s1.toml", 0.25), (2, "cases/kuramoto-s1.toml", 0.4),
                           (3, "cases/kuramoto-s2.toml", 0.2), (3, "cases/kuramoto-s2.toml", 0.3)):
        r = float(run(path, f"model.eps={eps}", "time.t_end=150.0", "time.dt=0.1", "time.save_every=50.0")
                  ["order_parameter"][-1])
        if dim == 2:
            exact = brentq(lambda x: i1e(x / eps) / i0e(x / eps) - x, 1e-6, 1 - 1e-12, xtol=1e-15)
        else:
            exact = brentq(lambda x: 1 / math.tanh(x / eps) - eps / x - x, 1e-6, 1 - 1e-12, xtol=1e-15)
        print(f"| S^{dim - 1} | 1 | {eps} | {r:.10f} | {exact:.10f} | {abs(r - exact):.1e} |")
    print("\nBelow threshold (eps = 0.5): measured decay rate of r vs the linearisation\n")
    print("| sphere | K | rate (solver) | rate (theory) |\n|---|---|---|---|")
    for dim, path, K in ((2, "cases/kuramoto-s1.toml", 0.9), (3, "cases/kuramoto-s2.toml", 1.35)):
        V = f"[[{K},0],[0,{K}]]" if dim == 2 else f"[[{K},0,0],[0,{K},0],[0,0,{K}]]"
        r = run(path, "model.eps=0.5", f"model.V={V}", "time.t_end=120.0", "time.dt=0.1",
                "time.save_every=20.0", "sphere.lmax=16")["order_parameter"].values
        theory = 0.5 - K / 2 if dim == 2 else 1.0 - 2 * K / 3
        print(f"| S^{dim - 1} | {K} | {-math.log(r[-1] / r[-2]) / 20:.6f} | {theory:.6f} |")


def zero_temperature():
    dataset = run("cases/baseline-inf.toml", "time.t_end=1.0", "time.save_every=0.1")
    masses = hemisphere_mass(dataset, [1.0, 0.0, 0.0])  # exact for the band-limited density
    tail = dataset["spectral_tail"].values
    print("\n## 6. beta = inf, seed-003 matrices (cases/baseline-inf.toml, lmax 64)\n")
    print("| t | mass {x1 > 0} | drift | spectral tail | resolved |\n|---|---|---|---|---|")
    for time_, m, tl in zip(dataset["time"].values, masses, tail):
        print(f"| {time_:.1f} | {m:.10f} | {abs(m - masses[0]):.1e} | {tl:.1e} | {tl <= 1e-6} |")
    print(f"\nresolved_until = {dataset.attrs['resolved_until']}; notes: {dataset.attrs['notes']}")


if __name__ == "__main__":
    started = time.perf_counter()
    print("# Core verification figures\n")
    print(f"Generated by `python3 results/core_verification.py` (torch {torch.__version__}, CPU, float64).\n")
    for section in (sht_agreement, heat, mass, convergence, kuramoto, zero_temperature):
        section()
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
