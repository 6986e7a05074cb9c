"""Seed 004, bow: Eulerian and particle trainings with the candidates where the case files put them and centred on
the cluster (issue 4, criteria 4 and 5), printed as markdown.

    OMP_NUM_THREADS=1 python3 results/seed004_readout.py [--seeds 6] [--workers 2] [--report-only] \
> results/seed004_readout.md

cases/seed004-bow-k*.toml draw the K = 16 candidates from vMF(control.target = e_2, kappa_cand), a quarter
turn from the cluster at e_1 that the initial law falls into.  The seed does not say where its vMF is
centred; it says the kappa_cand = 10 readout lies "close to the cluster centre" and that its escape is small
(displacement 0.169 +- 0.006 against 0.763 +- 0.343 at kappa_cand = 2).  So both bow cases run twice
(READOUTS): as written ("case": e_2) and with control.target = e_1 ("cluster": the candidates around the
cluster's own axis), otherwise as in the other reports:

  reduced scale (results/seed004_reduced.py's L-BFGS training: eps = 0.05, lmax 24, dt = 0.1, T = 16,
  tol 1e-7): the Eulerian training, and the particle training (N = 64, particles.seed = 0, 1, ...) of
  results/seed004_particles.py, each from W = 0; the Eulerian J at each particle-trained W says whether
  the two trainings reach the same minimum of the mean-field J;
  seed scale (results/seed004_escape.py: eps = 1e-2, T = 80, lmax 128): the first gradient step's escape
  rate against the Rayleigh quotient R_mu(g), the quantity of criterion 4.

NetCDF outputs go to $SEED004_OUT (default /tmp/seed004_reduced) as readout-<readout>-*.nc, the seed-scale
figures as readout-<readout>-*-escape.json; a run whose file is there is not made again.  The terminal
displacement is the angle of the mean at T minus at the save nearest the plateau's middle (solvers/training.py).
"""

import argparse
import json
import os
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from seed004_escape import measure
from seed004_particles import load, mean_field_cost, particle_overrides
from seed004_reduced import overrides_of

T_END = 16.0
# readout: (overrides, title)
READOUTS = {"case": ([], "candidates from vMF(e_2, kappa_cand), as the case files have them"),
            "cluster": (["control.target=[1.0, 0.0]"], "candidates from vMF(e_1, kappa_cand), centred on the cluster")}
# case: (label, seed's displacement, seed's fitted a / R)
CASES = {"seed004-bow-k2": ("bow, kappa_cand = 2", "0.763 +- 0.343", "2.10 / 2.15"),
         "seed004-bow-k10": ("bow, kappa_cand = 10", "0.169 +- 0.006", "0.35 / 0.38")}


def path_of(readout, name, seed=None):
    """The file of the Eulerian run (seed None) or of the particle run of particles.seed = seed."""
    folder = os.environ.get("SEED004_OUT", "/tmp/seed004_reduced")
    run = "eulerian" if seed is None else f"particles-{seed}"
    return os.path.join(folder, f"readout-{readout}-{name}-{run}.nc")


def overrides(readout, seed=None):
    if seed is None:
        return overrides_of("lbfgs", T_END) + READOUTS[readout][0]
    return particle_overrides("lbfgs") + READOUTS[readout][0] + [f"particles.seed={seed}"]


def train(job):
    """Train one run, `job` = (readout, name, seed), to its file (the module docstring)."""
    import torch

    torch.set_num_threads(1)
    import spherepde
    from solvers.particle_training import run_particle_training
    from spherepde.io.output import write_dataset

    readout, name, seed = job
    if os.path.exists(path_of(readout, name, seed)):
        return
    case = load(name, overrides(readout, seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dataset = spherepde.run(case, progress=False) if seed is None else run_particle_training(case, progress=False)
    write_dataset(dataset, path_of(readout, name, seed))


def escape(job):
    """results/seed004_escape.py's figures for `job` = (readout, name), kept in a JSON file beside the runs."""
    readout, name = job
    path = path_of(readout, name).replace("-eulerian.nc", "-escape.json")
    if not os.path.exists(path):
        import torch

        torch.set_num_threads(1)
        with open(path, "w") as file:
            json.dump(measure(name, tuple(READOUTS[readout][0])), file)
    with open(path) as file:
        return json.load(file)


def row(readout, name, seed, cost):
    """The figures of one run from its file; `cost` is the Eulerian J as a function of W."""
    import xarray as xr

    with xr.open_dataset(path_of(readout, name, seed)) as dataset:
        attrs = dataset.attrs
        order = dataset["order_parameter"].values
        times = dataset["time"].values
        middle = int(np.argmin(np.abs(times - 0.5 * times[-1])))
        return {"three_phase": attrs["three_phase"], "plateau": attrs["plateau_width"], "lift": attrs["terminal_lift"],
                "loss": dataset["loss"].values[[0, -1]], "eulerian_J": cost(dataset["W"].values),
                "order": (order[middle], order[-1]), "displacement": attrs["terminal_displacement"]}


def report(readout, name, seeds, escape_row):
    label, seed_displacement, seed_rates = CASES[name]
    cost = mean_field_cost(name, overrides(readout))
    eulerian = row(readout, name, None, cost)
    particles = [row(readout, name, seed, cost) for seed in seeds]
    print(f"## {label}, {READOUTS[readout][1]}\n")
    print("| run | three phases | plateau | terminal lift | order parameter at T/2, T | J first -> last | "
          "Eulerian J at this W | terminal displacement (rad) |")
    print("|---|---|---|---|---|---|---|---|")
    for title, figures in ([("Eulerian (lmax 24)", eulerian)]
                           + [(f"particles, seed {s}", p) for s, p in zip(seeds, particles)]):
        print(f"| {title} | {figures['three_phase']} | {figures['plateau']:.1f} | {figures['lift']:.3f} | "
              f"{figures['order'][0]:.3f}, {figures['order'][1]:.3f} | "
              f"{figures['loss'][0]:.4f} -> {figures['loss'][1]:.4f} | "
              f"{figures['eulerian_J']:.4f} | {figures['displacement']:.3f} |")
    displacement = np.array([p["displacement"] for p in particles])
    phases = sum(p["three_phase"] == "true" for p in particles)
    print(f"\nParticles: {phases} / {len(particles)} with three phases, displacement {displacement.mean():.3f} ± "
          f"{displacement.std(ddof=1):.3f} (seed: {seed_displacement}); Eulerian {eulerian['displacement']:.3f}, "
          f"three phases {eulerian['three_phase']}; particle mean minus Eulerian "
          f"{displacement.mean() - eulerian['displacement']:+.4f} (standard error of the mean "
          f"{displacement.std(ddof=1) / np.sqrt(len(particles)):.4f}).  Seed scale, first gradient step: R_mu(g) = "
          f"{escape_row['rayleigh_quotient']:.4f}, slope at T {escape_row['slope_at_T']:.4f}, escape rate "
          f"{escape_row['escape_rate']:.4f}, "
          f"escape / R = {escape_row['escape_rate'] / escape_row['rayleigh_quotient']:.3f}, "
          f"deep rate {escape_row['deep_rate']:.4f} (seed's a / R: {seed_rates}).\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=6, help="particle seeds per case")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--report-only", action="store_true", help="skip the runs (their files must exist)")
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    jobs = [(readout, name) for readout in READOUTS for name in CASES]
    with ProcessPoolExecutor(args.workers) as pool:
        if not args.report_only:
            list(pool.map(train, [(readout, name, seed) for readout, name in jobs for seed in [None] + seeds]))
        escapes = dict(zip(jobs, pool.map(escape, jobs)))
    print("# Seed 004, bow: Eulerian and particle trainings, the candidates as written and centred on the cluster "
          "(issue 4, criteria 4 and 5)\n")
    print("At the reduced scale; results/seed004.md has the seed-scale bow rows. What this report still adds: "
          "bow with the candidates centred on the cluster (control.target = e_1).\n")
    print(f"Regenerate: `OMP_NUM_THREADS=1 python3 results/seed004_readout.py --seeds {args.seeds} --workers 2 > "
          "results/seed004_readout.md`.  The script's docstring says what is run; in short, cases/seed004-bow-k*.toml "
          f"as written and with `{' '.join(READOUTS['cluster'][0])}`: "
          "trained by L-BFGS at the reduced scale (Eulerian, "
          "and N = 64 particles per seed), and the first gradient step at the seed's scale.\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for readout, name in jobs:
            report(readout, name, seeds, escapes[readout, name])


if __name__ == "__main__":
    main()
