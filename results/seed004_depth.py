"""Seed 004 at the seed's scale: the depth sweep T = 40, 80, 120 (issue 4, criteria 2-3), printed as markdown.

    OMP_NUM_THREADS=1 python3 results/seed004_depth.py [--workers 2] [--iterations 300] [--continue T ...] [--report-only] > results/seed004_depth.md

The align cases of cases/ at their own scale: S^1, A = diag(1, 0.65), eps = 1e-2, W constant on slices of
width 2 (seed004-align-T40, seed004-align-l065 at T = 80, seed004-align-T120), trained towards convergence by
L-BFGS with the exact gradient of the discretised J (tol 1e-7; the last table says where each stopped) on
lmax 64 where the case files ask for lmax 128 (the Gibbs cluster is resolved there: at T = 40 and a
trained W, J agrees with lmax 128 to 2e-9; lmax 48 to 1e-6, lmax 32 to 1e-3).  Two stages: COARSE,
dt = 0.04, from W = 0 at T = 80; then FINE,
dt = 0.02, at T = 80 from its coarse W, at T = 40 and 120 from the same W with its middle 20 layers
removed or 20 zero layers inserted in its middle (the turnpike: the boundary layers keep their width
and the plateau, where W ~ 0, changes length).  Why: the explicit transport at dt = 0.04 is stable only
up to max |W| ~ 1.4 at the trained terminal layers, so L-BFGS stalls when its trial steps cross that
limit (from W = 0 it stopped after 3, 4 and 14 iterations at T = 120, 40 and 80, far from converged);
dt = 0.02 doubles the margin, as the case files' lmax 128, dt = 0.01 has it.  The report checks the
resolution at each trained W: J on the case files' own grid and step beside J on the training's.  About
2.5 CPU hours with --iterations 25 (the fine stages stop at that cap, not at tol); more with the default.
--continue T restarts the fine training of depth T from its file's W (L-BFGS loses its curvature memory
there) for --iterations more, and appends the optimizer histories.
NetCDF outputs go to $SEED004_OUT (default /tmp/seed004_reduced) as <case>-seed-scale-coarse.nc (stage 1)
and <case>-seed-scale.nc.
"""

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from seed004_particles import load, mean_field_cost
from seed004_reduced import figures

# T: (case, the seed's plateau width, terminal layer width); the seed's initial layer is 2.67 at every T and
# its terminal displacement at T = 80 is 1.554 +- 0.010 rad over 20 seeds (1.55 in its main table).
CASES = {40.0: ("seed004-align-T40", "32.0", "5.33"), 80.0: ("seed004-align-l065", "71.2", "6.15"),
         120.0: ("seed004-align-T120", "109.7", "7.62")}
COARSE = ["sphere.lmax=64", "time.dt=0.04", "solver.field='dense'", "control.optimizer='lbfgs'",
          "control.gradient='discrete'", "control.tol=1e-7", "control.iterations=300"]
# The fine stage's iteration cap is --iterations.
FINE = [o if o != "time.dt=0.04" else "time.dt=0.02" for o in COARSE if not o.startswith("control.iterations")]
CASE_RESOLUTION = ["control.iterations=0"]  # the case file's lmax 128 and dt = 0.01
# The depth trained from W = 0 at dt = 0.04 first; every FINE training starts from its coarse W, resized.
COARSE_DEPTH = 80.0


def path_of(t_end, stage=""):
    """The file of the FINE training of depth t_end, or with stage = "coarse" of the COARSE one."""
    suffix = f"-{stage}" if stage else ""
    return os.path.join(os.environ.get("SEED004_OUT", "/tmp/seed004_reduced"),
                        f"{CASES[t_end][0]}-seed-scale{suffix}.nc")


def trained_W(path):
    import xarray as xr

    with xr.open_dataset(path) as dataset:
        return dataset["W"].values


def resized(W, layers):
    """W (L, d, d) made `layers` long in its middle: its first layers // 2 and last layers - layers // 2
    layers, with zero layers between them when layers > L (a longer or shorter plateau)."""
    import numpy as np

    head, tail = min(layers // 2, W.shape[0] // 2), min(layers - layers // 2, W.shape[0] - W.shape[0] // 2)
    return np.concatenate([W[:head], np.zeros((layers - head - tail, *W.shape[1:])), W[W.shape[0] - tail:]])


def member(job):
    """Train one stage of the align case of depth t_end, job = (t_end, "coarse" | "fine" | "continue", iteration
    cap of the fine stage), to its file.  "continue": the fine training restarted from its own W for that many
    more iterations, its histories appended to the earlier ones (attribute continued_after: the iteration
    counts, space-separated, at which it was restarted)."""
    import warnings

    import torch

    from solvers.training import run_training
    from spherepde.output import write_dataset

    t_end, stage, iterations = job
    case = load(CASES[t_end][0], COARSE if stage == "coarse" else FINE + [f"control.iterations={iterations}"])
    if stage == "coarse":
        start = None
    elif stage == "fine":
        start = torch.as_tensor(resized(trained_W(path_of(COARSE_DEPTH, "coarse")), case["control"]["layers"]))
    else:
        start = torch.as_tensor(trained_W(path_of(t_end)))
    started = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dataset = run_training(case, progress=False, start=start)
    if stage == "continue":
        dataset = appended(path_of(t_end), dataset)
    write_dataset(dataset, path_of(t_end, "coarse" if stage == "coarse" else ""))
    print(f"T = {t_end:g}, {stage}: {dataset.sizes['iteration'] - 1} iterations, {dataset.attrs['optimizer_stop']}, "
          f"{time.process_time() - started:.0f} CPU s", file=sys.stderr, flush=True)


def appended(path, continued):
    """The Dataset `continued` of a training restarted from the W of the one in `path`, with the optimizer
    histories of both in sequence (the restart's iteration 0 is the earlier last one), the iteration counts and
    training times summed."""
    import numpy as np
    import xarray as xr

    with xr.load_dataset(path) as earlier:
        history = [name for name in continued.data_vars if continued[name].dims == ("iteration",)]
        merged = xr.concat([earlier[history], continued[history].isel(iteration=slice(1, None))], "iteration")
        merged["iteration"] = np.arange(merged.sizes["iteration"])
        dataset = continued.drop_dims("iteration").merge(merged)
        dataset.attrs = continued.attrs | {
            "iterations": earlier.attrs["iterations"] + continued.attrs["iterations"],
            "training_seconds": earlier.attrs["training_seconds"] + continued.attrs["training_seconds"],
            "continued_after": f"{earlier.attrs.get('continued_after', '')} {earlier.attrs['iterations']}".strip(),
            "iteration_caps": f"{iteration_caps(earlier.attrs)} {iteration_caps(continued.attrs)}"}
    return dataset


def iteration_caps(attrs):
    """The iteration caps of a training's stages, space-separated: its control.iterations, or those recorded by
    `appended`."""
    from spherepde.case import load_case_text

    return attrs.get("iteration_caps") or str(load_case_text(attrs["case"])["control"]["iterations"])


def commands(depths):
    """The commands that made the files of `depths`: the training of every depth, then each continuation."""
    import xarray as xr

    caps = {}
    for t_end in depths:
        with xr.open_dataset(path_of(t_end)) as dataset:
            caps[t_end] = iteration_caps(dataset.attrs).split()
    script = "OMP_NUM_THREADS=1 python3 results/seed004_depth.py --workers 2"
    lines = [f"`{script} --iterations {caps[depths[0]][0]}`"]
    for stage in range(1, max(len(stages) for stages in caps.values())):
        for cap in sorted({stages[stage] for stages in caps.values() if len(stages) > stage}):
            continued = [f"{t_end:g}" for t_end in depths if len(caps[t_end]) > stage and caps[t_end][stage] == cap]
            lines.append(f"`{script} --continue {' '.join(continued)} --iterations {cap}`")
    return ", then ".join(lines) + " (each prints the report: the last one to results/seed004_depth.md)"


def iteration_text(t_end, total):
    """'25 + 50' for a training continued after 25 of its 75 iterations, else the total."""
    import xarray as xr

    with xr.open_dataset(path_of(t_end)) as dataset:
        restarts = [int(n) for n in str(dataset.attrs.get("continued_after", "")).split()]
    bounds = [0, *restarts, total]
    return " + ".join(str(end - start) for start, end in zip(bounds[:-1], bounds[1:]))


def resolution_check(t_end):
    """(J at the trained W on the training's grid and step, J there on the case file's grid and step)."""
    import xarray as xr

    with xr.open_dataset(path_of(t_end)) as dataset:
        W, trained = dataset["W"].values, float(dataset["loss"].values[-1])
    return trained, mean_field_cost(CASES[t_end][0], CASE_RESOLUTION)(W)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=300, help="L-BFGS iteration cap of the fine stage")
    parser.add_argument("--continue", dest="continued", type=float, nargs="+", default=[], metavar="T",
                        help="continue the fine trainings of these depths from their files for --iterations more "
                             "iterations, instead of training every depth")
    parser.add_argument("--report-only", action="store_true", help="summarise the existing files, run nothing")
    args = parser.parse_args()
    depths = sorted(CASES, reverse=True)  # longest first
    with ProcessPoolExecutor(args.workers) as pool:
        if not args.report_only:
            if args.continued:
                list(pool.map(member, [(t_end, "continue", args.iterations) for t_end in args.continued]))
            else:
                if not os.path.exists(path_of(COARSE_DEPTH, "coarse")):
                    member((COARSE_DEPTH, "coarse", None))
                list(pool.map(member, [(t_end, "fine", args.iterations) for t_end in depths]))
        trained = [t_end for t_end in depths if os.path.exists(path_of(t_end))]
        checks = dict(zip(trained, pool.map(resolution_check, trained)))
    rows = {t_end: figures(path_of(t_end)) for t_end in trained}
    print("# Seed 004 at the seed's scale: depth sweep (issue 4, criteria 2-3)\n")
    print(__doc__.split("\n\n", 2)[2].replace("\n", " ") + "\n")
    print(f"Regenerate: {commands(trained)}.  Trained by: `" + " ".join(FINE) + " control.iterations=CAP` on each "
          "case file, from the W of `" + " ".join(COARSE) + "`.  A depth whose iterations read '25 + 22' was "
          "trained 25 iterations, then continued from its W for 22 more (L-BFGS restarts its curvature memory "
          "there).\n")
    missing = sorted(set(depths) - set(trained))
    if missing:
        print("**Not trained yet** (no file): T = " + ", ".join(f"{t_end:g}" for t_end in missing) + ".\n")
    print("## Three phases along depth, beside the seed (N = 64 particles, 20 seeds)\n")
    print("Widths in units of depth (spherepde/turnpike.py defines them); terminal displacement: angle of the "
          "mean at T from the plateau's (rad).\n")
    print("| T | three phases | plateau width (seed) | initial layer (seed) | terminal layer (seed) | "
          "plateau relative variance | terminal lift | terminal displacement (seed) |")
    print("|---|---|---|---|---|---|---|---|")
    for t_end in sorted(rows):
        row, (_, seed_plateau, seed_terminal) = rows[t_end], CASES[t_end]
        print(f"| {t_end:g} | {row['three_phase']} | {row['plateau_width']:.1f} ({seed_plateau}) | "
              f"{row['initial_width']:.1f} (2.67) | {row['terminal_width']:.1f} ({seed_terminal}) | "
              f"{row['plateau_relative_variance']:.2e} | {row['terminal_lift']:.3f} | "
              f"{row['terminal_displacement']:.3f} ({'1.554 +- 0.010' if t_end == 80 else '-'}) |")
    print("\n## Adjoint growth towards the output layer (criterion 2) and the training\n")
    print("Adjoint: |grad phi_t|_{L2(mu_t)} of the gradient at the trained W, at T over at t = 0, and the fitted "
          "growth rate of its log from the plateau's start to its end (turnpike.py; the escape rate against "
          "R_mu(g), criterion 4, is that of the first gradient at W = 0: results/seed004_escape.md).  J at the "
          "trained W on the training's grid (lmax 64, dt = 0.02) and on the case file's (lmax 128, dt = 0.01).\n")
    print("| T | adjoint at T over t = 0 | fitted growth rate | J first -> last | "
          "J on the case's grid, relative difference | iterations, final abs dJ/dW (Frobenius) | training wall min | "
          "optimizer stop |")
    print("|---|---|---|---|---|---|---|---|")
    for t_end in sorted(rows):
        row, (trained, reference) = rows[t_end], checks[t_end]
        print(f"| {t_end:g} | {row['adjoint_growth']:.3g} | {row['adjoint_rate']:.3f} | "
              f"{row['loss'][0]:.4f} -> {row['loss'][1]:.6f} | "
              f"{abs(reference - trained) / abs(reference):.1e} | {iteration_text(t_end, row['iterations'])}, "
              f"{row['gradient_norm']:.1e} | "
              f"{row['training_seconds'] / 60:.0f} | {row['optimizer_stop']} |")
    print()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
