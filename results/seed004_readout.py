"""Seed 004, bow: the candidates centred on the cluster instead of at e_2 (issue 4, criteria 4 and 5), printed as markdown.

    OMP_NUM_THREADS=1 python3 results/seed004_readout.py [--seeds 4] [--workers 2] [--report-only] > results/seed004_readout.md

cases/seed004-bow-k*.toml draw the K = 16 candidates from vMF(control.target = e_2, kappa_cand), a quarter
turn from the cluster at e_1 that the initial law falls into.  The seed does not say where its vMF is
centred; it says the kappa_cand = 10 readout lies "close to the cluster centre" and that its escape is small
(displacement 0.169 +- 0.006 against 0.763 +- 0.343 at kappa_cand = 2).  This script tests that reading:
both bow cases with control.target = e_1 (the candidates around the cluster's own axis), otherwise as in
the other reports:

  reduced scale (results/seed004_reduced.py's L-BFGS training: eps = 0.05, lmax 24, dt = 0.1, T = 16,
  tol 1e-7): the Eulerian training, and the particle training (N = 64, particles.seed = 0, 1, ...) of
  results/seed004_particles.py, each from W = 0; the Eulerian J at each particle-trained W says whether
  the two trainings reach the same minimum of the mean-field J;
  seed scale (results/seed004_escape.py: eps = 1e-2, T = 80, lmax 128): the first gradient step's escape
  rate against the Rayleigh quotient R_mu(g), the quantity of criterion 4.

NetCDF outputs go to $SEED004_OUT (default /tmp/seed004_reduced) as readout-*.nc, the seed-scale figures as
readout-*-escape.json; a run whose file is there is not made again.  The terminal displacement is the angle of the mean at T minus at the save
nearest the plateau's middle (solvers/training.py).
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
CENTRED = ["control.target=[1.0, 0.0]"]
# case: (label, seed's displacement, seed's fitted a / R)
CASES = {"seed004-bow-k2": ("bow, kappa_cand = 2", "0.763 +- 0.343", "2.10 / 2.15"),
         "seed004-bow-k10": ("bow, kappa_cand = 10", "0.169 +- 0.006", "0.35 / 0.38")}


def path_of(name, seed=None):
    """The file of the Eulerian run (seed None) or of the particle run of particles.seed = seed."""
    folder = os.environ.get("SEED004_OUT", "/tmp/seed004_reduced")
    return os.path.join(folder, f"readout-{name}-" + ("eulerian" if seed is None else f"particles-{seed}") + ".nc")


def overrides(name, seed=None):
    if seed is None:
        return overrides_of("lbfgs", T_END) + CENTRED
    return particle_overrides("lbfgs") + CENTRED + [f"particles.seed={seed}"]


def train(job):
    """Train one run, `job` = (name, seed), to its file (the module docstring)."""
    import torch

    torch.set_num_threads(1)
    import spherepde
    from solvers.particle_training import run_particle_training
    from spherepde.output import write_dataset

    name, seed = job
    if os.path.exists(path_of(name, seed)):
        return
    case = load(name, overrides(name, seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dataset = spherepde.run(case, progress=False) if seed is None else run_particle_training(case, progress=False)
    write_dataset(dataset, path_of(name, seed))


def escape(name):
    """results/seed004_escape.py's figures for the case with CENTRED, kept in a JSON file beside the runs."""
    path = path_of(name).replace("-eulerian.nc", "-escape.json")
    if not os.path.exists(path):
        import torch

        torch.set_num_threads(1)
        with open(path, "w") as file:
            json.dump(measure(name, tuple(CENTRED)), file)
    with open(path) as file:
        return json.load(file)


def row(name, seed, cost):
    """The figures of one run from its file; `cost` is the Eulerian J as a function of W."""
    import xarray as xr

    with xr.open_dataset(path_of(name, seed)) as dataset:
        attrs = dataset.attrs
        order = dataset["order_parameter"].values
        times = dataset["time"].values
        middle = int(np.argmin(np.abs(times - 0.5 * times[-1])))
        return {"three_phase": attrs["three_phase"], "plateau": attrs["plateau_width"], "lift": attrs["terminal_lift"],
                "loss": dataset["loss"].values[[0, -1]], "eulerian_J": cost(dataset["W"].values),
                "order": (order[middle], order[-1]), "displacement": attrs["terminal_displacement"]}


def report(name, seeds, escape_row):
    label, seed_displacement, seed_rates = CASES[name]
    cost = mean_field_cost(name, overrides(name))
    eulerian = row(name, None, cost)
    particles = [row(name, seed, cost) for seed in seeds]
    print(f"## {label}, candidates from vMF(e_1, kappa_cand)\n")
    print("| run | three phases | plateau | terminal lift | order parameter at T/2, T | J first -> last | "
          "Eulerian J at this W | terminal displacement (rad) |")
    print("|---|---|---|---|---|---|---|---|")
    for title, figures in [("Eulerian (lmax 24)", eulerian)] + [(f"particles, seed {s}", p) for s, p in zip(seeds, particles)]:
        print(f"| {title} | {figures['three_phase']} | {figures['plateau']:.1f} | {figures['lift']:.3f} | "
              f"{figures['order'][0]:.3f}, {figures['order'][1]:.3f} | {figures['loss'][0]:.4f} -> {figures['loss'][1]:.4f} | "
              f"{figures['eulerian_J']:.4f} | {figures['displacement']:.3f} |")
    displacement = np.array([p["displacement"] for p in particles])
    phases = sum(p["three_phase"] == "true" for p in particles)
    print(f"\nParticles: {phases} / {len(particles)} with three phases, displacement {displacement.mean():.3f} ± "
          f"{displacement.std(ddof=1):.3f} (seed: {seed_displacement}); Eulerian {eulerian['displacement']:.3f}, "
          f"three phases {eulerian['three_phase']}.  Seed scale, first gradient step: R_mu(g) = "
          f"{escape_row['rayleigh_quotient']:.4f}, slope at T {escape_row['slope_at_T']:.4f}, escape rate "
          f"{escape_row['escape_rate']:.4f}, escape / R = {escape_row['escape_rate'] / escape_row['rayleigh_quotient']:.3f}, "
          f"deep rate {escape_row['deep_rate']:.4f} (seed's a / R: {seed_rates}).\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=4, help="particle seeds per case")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--report-only", action="store_true", help="skip the runs (their files must exist)")
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    with ProcessPoolExecutor(args.workers) as pool:
        if not args.report_only:
            list(pool.map(train, [(name, seed) for name in CASES for seed in [None] + seeds]))
        escapes = dict(zip(CASES, pool.map(escape, CASES)))
    print("# Seed 004, bow: the candidates centred on the cluster (issue 4, criteria 4 and 5)\n")
    print(f"Regenerate: `OMP_NUM_THREADS=1 python3 results/seed004_readout.py --seeds {args.seeds} --workers 2 > "
          "results/seed004_readout.md`.  The script's docstring says what is run; in short, cases/seed004-bow-k*.toml "
          f"with `{' '.join(CENTRED)}`: trained by L-BFGS at the reduced scale (Eulerian, and N = 64 particles per seed), "
          "and the first gradient step at the seed's scale.\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name in CASES:
            report(name, seeds, escapes[name])


if __name__ == "__main__":
    main()
