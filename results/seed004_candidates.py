"""Seed 004, bow kappa_cand = 2: redrawn candidates and the conditioning of the terminal displacement (issue 4,
criterion 5), printed as markdown.

    OMP_NUM_THREADS=1 python3 results/seed004_candidates.py [--draws 7] [--seeds 3] [--starts 1e-12 1e-9 1e-6] \
[--no-cross] [--finite-n 64 256 1024 4096 8192] [--workers 2] [--report-only] > results/seed004_candidates.md

The seed's bow displacement 0.763 +- 0.343 has a spread seven times that of our particle seeds at one draw of
the K candidates (results/seed004_particles.md, +- 0.047 over 10 seeds).  This script asks whether the
seed's spread is that of redrawing the candidates, and whether redrawing them closes the gap between the
particle and the Eulerian displacement.  Each draw `control.seed = c` of the K = 16 candidates of
cases/seed004-bow-k2.toml is trained to convergence at the reduced scale of results/seed004_reduced.py
(L-BFGS, tol 1e-7, the exact gradient of the discretised J): once on the Eulerian solver and once per
particle seed (N = 64, particles.seed = 0, 1, ...).  Then the Eulerian training at draw 0 is repeated
from starting controls W_l = delta Z_l (Z_l standard normal, numpy seed 0) instead of W = 0, for each
delta of --starts: a change of the start far below any figure printed shows how well the optimiser's
end point, and its displacement, are determined by J.  NetCDF outputs go to $SEED004_OUT (default
/tmp/seed004_reduced) as candidates-*.nc; a run whose file is there is not trained again.  The
displacement is the angle of the mean at T minus at the save nearest the plateau's middle
(solvers/training.py); the largest spectral tail over the Eulerian run (the fraction of the L2 norm of
rho in degrees above 2 lmax / 3) says how far lmax 24 resolves it: the summary leaves out a draw whose
tail exceeds UNRESOLVED = 0.1, where the grid no longer holds the density at all.  results/seed004_reduced.md and
results/seed004_particles.md, made at an earlier commit, print 0.773 for the displacement of draw 0's
Eulerian run; the starts show why a change in round-off can move that figure.  Then each particle optimum
is handed to the Eulerian solver: its training at the same draw is started from the particle-trained W
(start = that W), which shows whether the two trainings disagree about the mean field or only land in
different minima of the same J, and the Eulerian J is printed along the straight segment between draw 0's
two Eulerian optima (a barrier between them makes them separate minima).  Last, particle systems of
growing N (not trained; --finite-n, particles.seed = 1000 + s) run at draw 0's two optima, the Eulerian W and
the W of the particle training of seed 0: their J beside the mean-field J of the same W, and how much the
dynamics amplify the sampling error of the order parameter along depth under each.
"""

import argparse
import os
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from seed004_particles import T_END, N, load, mean_field_cost, particle_overrides, run_particles_at
from seed004_reduced import overrides_of

NAME = "seed004-bow-k2"
UNRESOLVED = 0.1
SEED_DISPLACEMENT = (0.763, 0.343)


def path_of(kind, draw, seed=None):
    """The file of one run: kind "eulerian" (seed: None), "particles" (seed: particles.seed), "start"
    (seed: the index of delta in the starts) or "cross" (the Eulerian training started at the W of the
    particle run of that draw and seed)."""
    folder = os.environ.get("SEED004_OUT", "/tmp/seed004_reduced")
    return os.path.join(folder, f"candidates-{NAME}-{kind}-c{draw}" + ("" if seed is None else f"-{seed}") + ".nc")


def finite_n_path(optimum, n):
    """The file of the particle systems of size n at draw 0's optimum `optimum` (OPTIMA)."""
    folder = os.environ.get("SEED004_OUT", "/tmp/seed004_reduced")
    return os.path.join(folder, f"candidates-{NAME}-c0-at-{optimum}-W-n{n}.nc")


# Draw 0's two optima: their title, and the path_of arguments of the run whose W the particle systems run at.
OPTIMA = {"eulerian": ("Eulerian W", ("eulerian", 0)), "particles": ("particle W (seed 0)", ("particles", 0, 0))}


def run_finite_n(job):
    """N particles at one optimum of draw 0 (run_particles_at), `job` = (optimum, n, seeds)."""
    optimum, n, seeds = job
    run_particles_at(NAME, trained_W(path_of(*OPTIMA[optimum][1])), n, seeds, finite_n_path(optimum, n),
                     ["control.seed=0"])


def job_overrides(kind, draw, seed):
    if kind == "particles":
        return particle_overrides("lbfgs") + [f"particles.seed={seed}", f"control.seed={draw}"]
    return overrides_of("lbfgs", T_END) + [f"control.seed={draw}"]


def train(job):
    """Train one run of `job` = (kind, draw, seed, delta) to its file (the module docstring)."""
    from solvers.particle_training import run_particle_training
    from solvers.training import run_training
    from spherepde.io.output import write_dataset

    kind, draw, seed, delta = job
    case = load(NAME, job_overrides(kind, draw, seed))
    start = None
    if kind == "start":
        d, layers = case.dim, case["control"]["layers"]
        start = delta * np.random.default_rng(0).standard_normal((layers, d, d))
    if kind == "cross":
        start = trained_W(path_of("particles", draw, seed))
    training = run_particle_training if kind == "particles" else run_training
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dataset = training(case, progress=False, start=start)
    write_dataset(dataset, path_of(kind, draw, seed))


def trained_W(path):
    import xarray as xr

    with xr.open_dataset(path) as dataset:
        return dataset["W"].values


def figures(path):
    """J at the end, the displacement, the optimiser's stop and, for an Eulerian run, its largest spectral tail."""
    import xarray as xr

    from spherepde.io.case import load_case_text

    with xr.open_dataset(path) as dataset:
        tail = float(dataset["spectral_tail"].max()) if "spectral_tail" in dataset else np.nan
        iterations = dataset.sizes["iteration"] - 1
        capped = iterations == load_case_text(dataset.attrs["case"])["control"]["iterations"]
        return {"J": float(dataset["loss"].values[-1]), "displacement": float(dataset.attrs["terminal_displacement"]),
                "iterations": f"{iterations} (the cap)" if capped else f"{iterations}",
                "stop": dataset.attrs["optimizer_stop"], "tail": tail}


def mean_std(values):
    values = np.asarray(values)
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if values.size > 1 else f"{values.mean():.3f}"


def report(draws, seeds, starts):
    print("# Seed 004, bow kappa_cand = 2: redrawn candidates, and how well J fixes the displacement\n")
    print("At the reduced scale; results/seed004.md has the seed-scale bow rows. What this report still adds: "
          "the spread of the bow displacement over redrawn candidates and how weakly J fixes the displacement "
          "at the optimum.\n")
    print("Regenerate: `OMP_NUM_THREADS=1 python3 results/seed004_candidates.py --workers 2 > "
          "results/seed004_candidates.md` (about 2.5 CPU hours)\n")
    print(__doc__.split("\n\n", 2)[2].replace("\n", " ") + "\n")
    print("Overrides (Eulerian): `" + " ".join(job_overrides("eulerian", "c", None)) + "`; particles: `"
          + " ".join(job_overrides("particles", "c", "s")) + "`.\n")
    print("## The candidates redrawn\n")
    print("| control.seed | Eulerian J | Eulerian displacement (rad) | largest tail | L-BFGS iterations | "
          "particle J, seeds " + ", ".join(map(str, seeds)) + " | particle displacement (rad) | particles − Eulerian |")
    print("|---|---|---|---|---|---|---|---|")
    eulerian, particle_means, spreads, left_out = [], [], [], []
    for draw in draws:
        row = figures(path_of("eulerian", draw))
        particles = [figures(path_of("particles", draw, seed)) for seed in seeds]
        displacements = [p["displacement"] for p in particles]
        gap = np.mean(displacements) - row["displacement"]
        print(f"| {draw} | {row['J']:.4f} | {row['displacement']:.3f} | {row['tail']:.2g} | {row['iterations']} | "
              + " / ".join(f"{p['J']:.3f}" for p in particles) + " | "
              + " / ".join(f"{d:.3f}" for d in displacements) + f" | {gap:+.3f} |")
        if not row["tail"] <= UNRESOLVED:
            left_out.append(draw)
            continue
        eulerian.append(row["displacement"])
        particle_means.append(np.mean(displacements))
        spreads.append(np.std(displacements, ddof=1) if len(displacements) > 1 else np.nan)
    seed_mean, seed_spread = SEED_DISPLACEMENT
    unresolved = (f" (left out: draw {', '.join(map(str, left_out))}, largest tail above {UNRESOLVED:g})"
                  if left_out else "")
    if eulerian:
        gaps = np.array(particle_means) - np.array(eulerian)
        print(f"\nOver the {len(eulerian)} resolved draws{unresolved}: Eulerian displacement {mean_std(eulerian)}, "
              f"particle (mean of the seeds of a draw) {mean_std(particle_means)}, particles − Eulerian "
              f"{mean_std(gaps)} (smallest {min(gaps, key=abs):+.3f}); the seed reports {seed_mean} ± {seed_spread}.  "
              f"Over the particle seeds of one draw the std is {np.nanmin(spreads):.2g} to {np.nanmax(spreads):.2g}.\n")
    if starts:
        print("## Eulerian training at draw 0 from W_l = delta Z_l\n")
        print("| delta | J | displacement (rad) | L-BFGS iterations | stop |")
        print("|---|---|---|---|---|")
        rows = [("0 (W = 0)", figures(path_of("eulerian", 0)))] + [
            (f"{delta:g}", figures(path_of("start", 0, index))) for index, delta in enumerate(starts)]
        for label, row in rows:
            print(f"| {label} | {row['J']:.6f} | {row['displacement']:.3f} | {row['iterations']} | {row['stop']} |")
        costs = [row["J"] for _, row in rows]
        displacements = [row["displacement"] for _, row in rows]
        span = max(displacements) - min(displacements)
        print(f"\nJ spans {max(costs) - min(costs):.2g} and the displacement {span:.3f} rad over these starts.\n")
        if eulerian:
            print(f"Reading: at the {len(gaps)} resolved draws the particles' displacement minus the Eulerian one is "
                  f"{gaps.min():+.3f} to {gaps.max():+.3f} rad.  The spreads beside it: over the particle seeds of one "
                  f"draw (std) up to {np.nanmax(spreads):.3f}; over the Eulerian starts {span:.3f} (span); over the "
                  f"draws {np.std(eulerian, ddof=1) if len(eulerian) > 1 else np.nan:.3f} (std of the Eulerian "
                  f"displacement); the seed's {seed_spread}.\n")
    sys.stdout.flush()


def report_cross(draws, seeds, profile_points=11):
    """The Eulerian trainings started at the particle optima beside both, and the Eulerian J along the segment
    between draw 0's Eulerian optimum from W = 0 and the one from the particle W of seed 0."""
    print("## Eulerian training from the particle optima\n")
    print("The Eulerian training of each draw started at the W of each particle training of that draw (L-BFGS as "
          "above).  'Eulerian, W = 0' is the training of the first table; 'particles' the particle training the "
          "start came from.\n")
    print("| control.seed | particle seed | Eulerian from the particle W: J | its displacement (rad) | largest tail | "
          "L-BFGS iterations | particle displacement (rad) | difference | Eulerian, W = 0: J | its displacement |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    differences, excess, basin_gaps, left_out, unresolved_rows = [], [], [], set(), []
    for draw in draws:
        from_zero = figures(path_of("eulerian", draw))
        for seed in seeds:
            cross, particles = figures(path_of("cross", draw, seed)), figures(path_of("particles", draw, seed))
            if not from_zero["tail"] <= UNRESOLVED:
                unresolved_rows.append((draw, cross, from_zero))
            difference = cross["displacement"] - particles["displacement"]
            print(f"| {draw} | {seed} | {cross['J']:.4f} | {cross['displacement']:.3f} | {cross['tail']:.2g} | "
                  f"{cross['iterations']} | {particles['displacement']:.3f} | {difference:+.3f} | "
                  f"{from_zero['J']:.4f} | {from_zero['displacement']:.3f} |")
            if not (from_zero["tail"] <= UNRESOLVED and cross["tail"] <= UNRESOLVED):
                left_out.add(draw)
                continue
            differences.append(difference)
            excess.append(cross["J"] - from_zero["J"])
            basin_gaps.append(cross["displacement"] - from_zero["displacement"])
    if differences:
        differences, excess = np.array(differences), np.array(excess)
        unresolved = (f" (left out: draw {', '.join(map(str, sorted(left_out)))}, largest tail above {UNRESOLVED:g})"
                      if left_out else "")
        print(f"\nOver the {len(differences)} runs at resolved draws{unresolved}: Eulerian displacement from the "
              f"particle W minus the particle displacement {mean_std(differences)} (largest |difference| "
              f"{np.abs(differences).max():.3f}; the seed's spread {SEED_DISPLACEMENT[1]}); its J lies "
              f"{excess.min():.4f} to {excess.max():.4f} above that of the Eulerian training from W = 0.\n")
    for draw in sorted({row[0] for row in unresolved_rows}):
        rows = [(cross, zero) for d, cross, zero in unresolved_rows if d == draw]
        print(f"At draw {draw}, left out because the training from W = 0 leaves lmax 24 (tail "
              f"{rows[0][1]['tail']:.2g}, J {rows[0][1]['J']:.4f}), the trainings from the particle W reach J "
              f"{min(c['J'] for c, _ in rows):.4f} to {max(c['J'] for c, _ in rows):.4f} with tails up to "
              f"{max(c['tail'] for c, _ in rows):.2g}: W = 0 is a poor start there.\n")
    from seed004_particles import mean_field_cost

    from_zero, from_particles = trained_W(path_of("eulerian", 0)), trained_W(path_of("cross", 0, seeds[0]))
    cost = mean_field_cost(NAME, job_overrides("eulerian", 0, None))
    steps = np.linspace(0.0, 1.0, profile_points)
    print(f"Draw 0: the Eulerian J at (1 - s) W_0 + s W_p, W_0 the optimum from W = 0 and W_p the one from the "
          f"particle W of seed {seeds[0]} (|W_p - W_0| = {np.linalg.norm(from_particles - from_zero):.3f}, "
          f"|W_0| = {np.linalg.norm(from_zero):.3f}, Frobenius norms over the layers):\n")
    print("| s | " + " | ".join(f"{step:.1f}" for step in steps) + " |")
    print("|---|" + "---|" * len(steps))
    profile = [cost((1 - step) * from_zero + step * from_particles) for step in steps]
    print("| J | " + " | ".join(f"{value:.4f}" for value in profile) + " |\n")
    print(f"J rises to {np.nanmax(profile):.3f} between the two ends ({profile[0]:.4f} and {profile[-1]:.4f}): "
          + ("they are separate minima of the mean-field J." if np.nanmax(profile) > max(profile[0], profile[-1])
             else "no barrier on this segment.") + "\n")
    if len(differences):
        print(f"Reading: the two solvers agree on the optimum the particle trainings find.  Started there, the "
              f"Eulerian training stays in its basin and ends at the particles' displacement to "
              f"{np.abs(differences).max():.3f} rad ({np.abs(differences).max() / SEED_DISPLACEMENT[1]:.2f} of the "
              f"seed's spread); started at W = 0 it ends in another minimum of the same mean-field J, lower by "
              f"{excess.min():.4f} to {excess.max():.4f}, with a displacement {min(basin_gaps):.3f} to "
              f"{max(basin_gaps):.3f} rad smaller.  The gap of the first table is which minimum each optimiser "
              "reaches from W = 0, not a disagreement of the Eulerian and particle dynamics.\n")
    sys.stdout.flush()


def report_finite_n(sizes):
    """N particles at draw 0's two optima: J beside the mean-field J, and the amplification of sampling error."""
    import torch
    import xarray as xr

    from solvers.particle_training import ParticleControl

    print("## N particles at draw 0's two optima\n")
    print("Sampling error amplification: the std over seeds of the order parameter |int x dmu^N_t| at T over that "
          "at t = 0 (at the largest N; an error carried along without amplification keeps the ratio near 1).\n")
    print("| W | mean-field J | J on the training path of particle seed 0 (N = 64) | "
          + " | ".join(f"particle J, N = {n} (mean ± SE)" for n in sizes)
          + f" | amplification to T, N = {max(sizes)} |")
    print("|---|---|---|" + "---|" * len(sizes) + "---|")
    mean_field = mean_field_cost(NAME, job_overrides("eulerian", 0, None))
    training_path = ParticleControl(load(NAME, job_overrides("particles", 0, 0)))
    reading = {}
    for optimum, (title, run) in OPTIMA.items():
        W = trained_W(path_of(*run))
        runs = {n: xr.load_dataset(finite_n_path(optimum, n)) for n in sizes}
        costs = [run["cost"].values for run in runs.values()]
        spread = runs[max(sizes)]["order_parameter"].std("seed", ddof=1).values
        on_path = training_path.cost_of(torch.as_tensor(W))
        reading[optimum] = (costs[-1].mean(), spread[-1] / spread[0], on_path,
                            runs[N]["cost"].values.mean() if N in runs else np.nan)
        print(f"| {title} | {mean_field(W):.4f} | {on_path:.3f} | " + " | ".join(
            f"{c.mean():.3f} ± {c.std(ddof=1) / np.sqrt(c.size):.3f}" for c in costs)
            + f" | {spread[-1] / spread[0]:.1f} |")
    (eulerian, amplified, _, _), (particle, damped, trained, fresh) = reading["eulerian"], reading["particles"]
    print(f"\nAt N = {max(sizes)} the particle J is {eulerian:.3f} at the Eulerian W and {particle:.3f} "
          "at the particle "
          f"W; the sampling error is amplified {amplified:.1f}-fold under the first and {damped:.1f}-fold under the "
          "second." + (f"  The particle W gives J = {trained:.3f} on the path it was trained on and {fresh:.3f} on "
                        f"fresh paths of the same N = {N}." if N in runs else "") + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=7, help="candidate draws control.seed = 0 .. draws - 1")
    parser.add_argument("--seeds", type=int, default=3, help="particle seeds per draw")
    parser.add_argument("--starts", type=float, nargs="*", default=[1e-12, 1e-9, 1e-6],
                        help="scales delta of the perturbed starts of draw 0 (none: skip)")
    parser.add_argument("--no-cross", action="store_true",
                        help="skip the Eulerian trainings started at the particle optima")
    parser.add_argument("--finite-n", type=int, nargs="*", default=[64, 256, 1024, 4096, 8192],
                        help="N of the particle systems at draw 0's optima (none: skip)")
    parser.add_argument("--finite-n-seeds", type=int, default=16, help="seeds of each of those N")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--report-only", action="store_true", help="summarise the existing files, run nothing")
    args = parser.parse_args()
    if args.draws < 1 or args.seeds < 1 or args.finite_n_seeds < 2 or any(n < 2 for n in args.finite_n):
        parser.error("--draws and --seeds must be >= 1, --finite-n-seeds and each --finite-n >= 2")
    draws, seeds = list(range(args.draws)), list(range(args.seeds))
    if not args.report_only:
        jobs = ([("eulerian", draw, None, None) for draw in draws]
                + [("start", 0, index, delta) for index, delta in enumerate(args.starts)]
                + [("particles", draw, seed, None) for draw in draws for seed in seeds])
        jobs = [job for job in jobs if not os.path.exists(path_of(*job[:3]))]
        cross = [] if args.no_cross else [("cross", draw, seed, None) for draw in draws for seed in seeds]
        with ProcessPoolExecutor(args.workers) as pool:
            list(pool.map(train, jobs))
            list(pool.map(train, [job for job in cross if not os.path.exists(path_of(*job[:3]))]))
            finite = [(optimum, n, list(range(args.finite_n_seeds))) for n in sorted(args.finite_n, reverse=True)
                      for optimum in OPTIMA if not os.path.exists(finite_n_path(optimum, n))]
            list(pool.map(run_finite_n, finite))
    report(draws, seeds, args.starts)
    if not args.no_cross:
        report_cross(draws, seeds)
    if args.finite_n:
        report_finite_n(args.finite_n)


if __name__ == "__main__":
    main()
