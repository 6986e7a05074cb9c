"""Seed 004 through the particle system (issue 4, criterion 5), printed as markdown.

    OMP_NUM_THREADS=1 python3 results/seed004_particles.py [--seeds 20] [--bow-seeds 10] [--converged-seeds 10] \
[--fresh-seeds 10] [--finite-n 64 256 1024 4096] [--report-only] > results/seed004_particles.md

The reduced-scale cases of results/seed004_reduced.py (its overrides: eps = 0.05, lmax 24 for the Gibbs
minimum, dt = 0.1, T = 16, 16 layers; 25 Adam iterations at lr 0.05, and, in the last section, L-BFGS
to convergence) trained through N = 64 particles
with torch autograd (solvers/particle_training.py: common random numbers, the exact gradient of the
sample-path cost), one run per particles.seed (the initial sample and the noise path); in the last
section on fresh noise instead (control.noise = "fresh": a new sample and path per iteration, a
stochastic gradient of the expected cost); and particle systems of growing N run at the Eulerian
optimum, to see whether its cost is reached as N grows.  The Eulerian
values are read from the runs of results/seed004_reduced.md ($SEED004_OUT, default /tmp/seed004_reduced;
that script's `member` makes a missing one).  NetCDF outputs go to $SEED004_OUT/particles-*.nc; a run whose
file is there is not trained again (unless --retrain).

Phases: the particle test runs on the interaction energy (the entropy of 64 atoms is not defined; see
solvers/particle_training.py).  For a like-for-like comparison the Eulerian run is tested twice: on its
free energy (as results/seed004_reduced.md reports it) and on its interaction energy alone.  The
terminal displacement is the angle of the mean at T minus at the save nearest the plateau's middle.
"""

import argparse
import math
import os
import sys
import warnings

import numpy as np
from seed004_reduced import TRAININGS, member, overrides_of, path_of

T_END = 16.0
N = 64


def particle_overrides(training="adam"):
    """The overrides of the training `training` (PARTICLE_TRAININGS) for N particles: those of the Eulerian
    training of that name (seed004_reduced.TRAININGS; "fresh": of "adam") less control.gradient, an Eulerian
    key (the particle training has no adjoint PDE), then FRESH for "fresh"."""
    eulerian = "adam" if training == "fresh" else training
    overrides = [o for o in TRAININGS[eulerian][0] if not o.startswith("control.gradient")] + [
        "solver.method='particles'", f"particles.n={N}", f"time.t_end={T_END}", f"control.layers={int(T_END)}"]
    return overrides + FRESH if training == "fresh" else overrides

CASES = {"seed004-align-l065": "align, lambda_2 = 0.65", "seed004-bow-k2": "bow, kappa_cand = 2"}
# Training on fresh noise: J then is a sample of E J, so its optimum is that of the cost averaged over paths
# rather than one path's; compared with the Eulerian training to convergence.
FRESH = ["control.iterations=200", "control.noise='fresh'"]
PARTICLE_TRAININGS = {name: title for name, (_, title) in TRAININGS.items()} | {
    "fresh": "200 Adam iterations (lr 0.05) on fresh noise per iteration"}


# Warm start: from the Eulerian W, with a smaller step (Adam at lr 0.05 climbs from there to J ~ 3.1).
WARM_OVERRIDES = ["control.learning_rate=0.01"]
# Learning rates of the continued Eulerian training (bow).
CONTINUE_RATES = [0.01, 0.05]
# Particle systems run (not trained) at the converged Eulerian W: their seeds start here, apart from the trainings'.
FINITE_N_SEED = 1000


def load(name, overrides):
    """cases/<name>.toml with `overrides`."""
    import spherepde

    return spherepde.load_case(os.path.join(os.path.dirname(__file__), "..", "cases", f"{name}.toml"), overrides)


def mean_field_cost(name, overrides):
    """W (layers, d, d) -> the Eulerian (mean-field) J of cases/<name>.toml with `overrides` (NaN where the
    forward run fails)."""
    import torch

    from solvers.controlled_forward import ControlledForward, evaluate_cost
    from spherepde.base.errors import NumericalFailure
    from spherepde.model.initial import initial_density

    forward = ControlledForward(load(name, overrides))
    c0 = initial_density(forward.case["initial"], forward.problem.basis)

    def cost(W):
        try:
            return evaluate_cost(forward, c0, torch.as_tensor(W))
        except NumericalFailure:
            return math.nan
    return cost


def particle_path(name, seed, warm_n=None, training="adam"):
    folder = os.environ.get("SEED004_OUT", "/tmp/seed004_reduced")
    suffix = (f"-warm-n{warm_n}" if warm_n else "") + ("" if training == "adam" else f"-{training}")
    return os.path.join(folder, f"particles-{name}-T{int(T_END)}-seed{seed}{suffix}.nc")


def train_particles(name, seed, warm_n=None, start=None, training="adam"):
    """Train one particle run (cold, from W = 0; or, with warm_n, N = warm_n particles from `start`) to its file."""
    from solvers.particle_training import run_particle_training
    from spherepde.io.output import write_dataset

    overrides = particle_overrides(training) + [f"particles.seed={seed}"]
    if warm_n:
        overrides += WARM_OVERRIDES + [f"particles.n={warm_n}"]
    case = load(name, overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dataset = run_particle_training(case, progress=False, start=start)
    write_dataset(dataset, particle_path(name, seed, warm_n, training))


def particle_row(name, seed, eulerian_W, training="adam"):
    """The figures of one particle run from its file, and the J of its particle system (same x_0 and noise)
    at the W the Eulerian training found."""
    import torch
    import xarray as xr

    from solvers.particle_training import ParticleControl
    from spherepde.io.case import load_case_text

    with xr.open_dataset(particle_path(name, seed, training=training)) as dataset:
        attrs = dataset.attrs
        return {"three_phase": attrs["three_phase"], "plateau": attrs["plateau_width"],
                "initial": attrs["initial_width"], "terminal": attrs["terminal_width"], "lift": attrs["terminal_lift"],
                "displacement": attrs["terminal_displacement"], "loss": dataset["loss"].values[[0, -1]],
                "seconds": attrs["training_seconds"], "iterations": dataset.sizes["iteration"] - 1,
                "W": dataset["W"].values,
                "at_eulerian_W": ParticleControl(load_case_text(attrs["case"])).cost_of(torch.as_tensor(eulerian_W))}


def eulerian_rows(name, training="adam"):
    """The phase test of the Eulerian run on its free energy and on its interaction energy alone
    (turnpike.phases is blind to the constant min E, so the energies themselves serve as gaps), and its W."""
    import xarray as xr

    from spherepde.analysis import turnpike

    if not os.path.exists(path_of(name, T_END, training)):
        member((name, T_END, training))
    rows = {}
    with xr.open_dataset(path_of(name, T_END, training)) as dataset:
        rows["W"] = dataset["W"].values
        times = dataset["time"].values
        angle = turnpike.mean_angle(dataset["mean"].values)
        for energy in ("free_energy", "interaction_energy"):
            test = turnpike.phases(times, dataset[energy].values)
            middle = int(np.argmin(np.abs(times - 0.5 * (test["plateau_start"] + test["plateau_end"]))))
            rows[energy] = {"three_phase": "true" if test["three_phase"] else "false", "plateau": test["plateau_width"],
                            "initial": test["initial_width"], "terminal": test["terminal_width"],
                            "lift": test["terminal_lift"], "displacement": float(angle[-1] - angle[middle]),
                            "loss": dataset["loss"].values[[0, -1]]}
    return rows


def report(name, seeds, training="adam", eulerian_training=None):
    """The particle runs of `training` beside the Eulerian run of `eulerian_training` (default: the same)."""
    eulerian_training = eulerian_training or training
    print(f"## {CASES[name]} (cases/{name}.toml), N = {N} particles, {len(seeds)} seeds, "
          f"{PARTICLE_TRAININGS[training]}\n")
    print("| run | three phases | plateau | initial / terminal layer | terminal lift | J first -> last | "
          "J at the Eulerian W | Eulerian J at this W | terminal displacement (rad) | training (s, iterations) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    eulerian = eulerian_rows(name, eulerian_training)
    eulerian_W = eulerian.pop("W")
    rows = [particle_row(name, seed, eulerian_W, training) for seed in seeds]
    cost_of = mean_field_cost(name, overrides_of(eulerian_training, T_END))
    mean_field = np.array([cost_of(row["W"]) for row in rows])
    for seed, row, cost in zip(seeds, rows, mean_field):
        print(f"| particles, seed {seed} | {row['three_phase']} | {row['plateau']:.1f} | {row['initial']:.1f} / "
              f"{row['terminal']:.1f} | {row['lift']:.3f} | {row['loss'][0]:.3f} -> {row['loss'][1]:.3f} | "
              f"{row['at_eulerian_W']:.3f} | {cost:.3f} | {row['displacement']:.3f} | {row['seconds']:.0f}, "
              f"{row['iterations']} |")
    displacement = np.array([row["displacement"] for row in rows])
    failed = int(np.isnan(mean_field).sum())
    unstable = f" (of {len(rows) - failed}; {failed} failed)" if failed else ""
    plateau = np.array([row["plateau"] for row in rows])
    final = np.array([row["loss"][1] for row in rows])
    at_eulerian = np.array([row["at_eulerian_W"] for row in rows])
    phased = sum(row["three_phase"] == "true" for row in rows)
    print(f"| **particles, mean ± std** | {phased} / {len(rows)} true | "
          f"{plateau.mean():.1f} ± {plateau.std(ddof=1):.1f} "
          f"| | | final J {final.mean():.3f} ± {final.std(ddof=1):.3f} | {at_eulerian.mean():.3f} ± "
          f"{at_eulerian.std(ddof=1):.3f} | {np.nanmean(mean_field):.3f} ± {np.nanstd(mean_field, ddof=1):.3f}"
          f"{unstable} | "
          f"**{displacement.mean():.3f} ± {displacement.std(ddof=1):.3f}** | |")
    for energy, row in eulerian.items():
        print(f"| Eulerian (lmax 24), phases on {energy} | {row['three_phase']} | {row['plateau']:.1f} | "
              f"{row['initial']:.1f} / {row['terminal']:.1f} | {row['lift']:.3f} | "
              f"{row['loss'][0]:.3f} -> {row['loss'][1]:.3f} | | {row['loss'][1]:.3f} | {row['displacement']:.3f} | |")
    reference = eulerian["free_energy"]["displacement"]
    spread = displacement.std(ddof=1)
    gap = abs(displacement.mean() - reference)
    print(f"\nEulerian terminal displacement {reference:.3f} rad (phases on the free energy, as in "
          f"results/seed004_reduced.md); particle mean {displacement.mean():.3f}, seed spread (std) {spread:.3f}: "
          f"|difference| = {gap:.3f} = {gap / spread:.2f} std, {'within' if gap <= spread else 'outside'} the seed "
          f"spread; standard error of the particle mean {spread / math.sqrt(len(rows)):.3f}. "
          f"{sum(abs(d - reference) <= spread for d in displacement)} of {len(rows)} seeds lie within one std "
          f"of the Eulerian value.  The particle J at the Eulerian W is {at_eulerian.mean():.3f} against "
          f"{final.mean():.3f} at the particles' own trained W ({sum(at_eulerian < final)} of {len(rows)} seeds "
          f"lower at the Eulerian W); the Eulerian (mean-field) J at the particle-trained W is "
          f"{np.nanmean(mean_field):.3f} against {eulerian['free_energy']['loss'][1]:.3f} at the Eulerian W"
          + (f" ({failed} of the particle-trained W make the Eulerian run fail: nan in the table)" if failed else "")
          + ".\n")
    return displacement.mean(), spread


def continued_path(name, learning_rate):
    return path_of(name, T_END).removesuffix(".nc") + f"-continued-lr{learning_rate:g}.nc"


def continue_eulerian(name, learning_rate, iterations):
    """The Eulerian training of results/seed004_reduced.py continued from its W for `iterations` more steps."""
    import torch

    from solvers.training import run_training
    from spherepde.io.output import write_dataset

    case = load(name, overrides_of("adam", T_END) + [f"control.learning_rate={learning_rate}",
                                                      f"control.iterations={iterations}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dataset = run_training(case, progress=False, start=torch.as_tensor(eulerian_rows(name)["W"]))
    write_dataset(dataset, continued_path(name, learning_rate))


def report_continued(name, learning_rates, particles=None):
    """Is the Eulerian W of 25 iterations an optimum?  The same training continued from it."""
    import xarray as xr

    print(f"### {CASES[name]}: the Eulerian training continued from its W\n")
    print("The reduced Eulerian training (25 Adam iterations at lr 0.05 from W = 0) continued from its trained W "
          "(`run_training(..., start=W)`), phases on the free energy:\n")
    print("| continued with | iterations | J first -> last | three phases | terminal displacement (rad) |")
    print("|---|---|---|---|---|")
    for learning_rate in learning_rates:
        with xr.open_dataset(continued_path(name, learning_rate)) as dataset:
            loss = dataset["loss"].values
            print(f"| Adam, lr {learning_rate:g} | {len(loss) - 1} | {loss[0]:.3f} -> {loss[-1]:.3f} | "
                  f"{dataset.attrs['three_phase']} | {dataset.attrs['terminal_displacement']:.3f} |")
    if particles is not None:
        print(f"\nThe particle trainings from W = 0 above: {particles[0]:.3f} ± {particles[1]:.3f}.  The displacement "
              "moves with every further descent step of J: at 25 iterations neither training has converged, and "
              "the comparison is between two points of unfinished descents.")
    print()


def report_warm(name, seeds, sizes):
    """Particle training started at the Eulerian W (lr 0.01), N particles: does the particle cost have an optimum
    with the Eulerian displacement near the Eulerian W, and does it approach it as N grows?"""
    import xarray as xr

    eulerian = eulerian_rows(name)
    reference = eulerian["free_energy"]["displacement"]
    cost_of = mean_field_cost(name, overrides_of("adam", T_END))
    print(f"### {CASES[name]}: particle training started at the Eulerian W\n")
    print(f"Overrides as above, then `{' '.join(WARM_OVERRIDES)} particles.n=N`, and the optimizer starts from the "
          "Eulerian training's W (`run_particle_training(..., start=W)`) instead of W = 0.  The first J is the "
          "particle cost at the Eulerian W; 'Eulerian J' is the Eulerian cost at the particle-trained W, against "
          f"{cost_of(eulerian['W']):.3f} at the Eulerian W.\n")
    print("| N | seeds | three phases | J first -> last (mean) | Eulerian J at the trained W (mean) | "
          "terminal displacement (mean ± std) | Eulerian displacement |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        rows = []
        for seed in seeds:
            with xr.open_dataset(particle_path(name, seed, n)) as dataset:
                rows.append((dataset.attrs["three_phase"] == "true", dataset["loss"].values[[0, -1]],
                             dataset.attrs["terminal_displacement"],
                             cost_of(dataset["W"].values)))
        displacement = np.array([row[2] for row in rows])
        first, last = np.mean([row[1] for row in rows], axis=0)
        print(f"| {n} | {len(rows)} | {sum(row[0] for row in rows)} / {len(rows)} | {first:.3f} -> {last:.3f} | "
              f"{np.mean([row[3] for row in rows]):.3f} | {displacement.mean():.3f} ± "
              f"{displacement.std(ddof=1):.3f} | {reference:.3f} |")
    print()


def finite_n_path(name, n):
    folder = os.environ.get("SEED004_OUT", "/tmp/seed004_reduced")
    return os.path.join(folder, f"particles-{name}-T{int(T_END)}-at-eulerian-W-n{n}.nc")


def run_at_eulerian_W(name, n, seeds):
    """N = n particles at the Eulerian W of the L-BFGS training (run_particles_at), to finite_n_path."""
    run_particles_at(name, eulerian_rows(name, "lbfgs")["W"], n, seeds, finite_n_path(name, n))


def run_particles_at(name, W, n, seeds, path, overrides=()):
    """N = n particles, one run per seed (particles.seed = FINITE_N_SEED + seed), at the controls W, with the
    overrides of the L-BFGS particle training and `overrides`: their J and order parameter |int x dmu^n_t| at
    the save times, to `path`."""
    import torch
    import xarray as xr

    from solvers.particle_training import ParticleControl
    from spherepde.io.output import write_dataset

    W = torch.as_tensor(W)
    costs, orders = [], []
    for seed in seeds:
        control = ParticleControl(load(name, particle_overrides("lbfgs") + list(overrides) + [
            f"particles.n={n}", f"particles.seed={FINITE_N_SEED + seed}"]))
        saves = {}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            x_end = control.run(control.x0, W, visit=lambda t, x: saves.__setitem__(t, float(x.mean(0).norm())))
            costs.append(float(control.cost(x_end, W)[0]))
        orders.append(list(saves.values()))
    write_dataset(xr.Dataset({"cost": ("seed", costs), "order_parameter": (("seed", "time"), orders)},
                             coords={"seed": seeds, "time": list(saves)}), path)


def report_finite_n(name, sizes):
    """Is the Eulerian optimum reachable by N particles?  The particle J at the Eulerian W as N grows, and
    how far the particles' order parameter strays from the mean field's along depth."""
    import xarray as xr

    with xr.open_dataset(path_of(name, T_END, "lbfgs")) as dataset:
        mean_field = float(dataset["loss"].values[-1])
        mean_field_order = dataset["order_parameter"]
        runs = {n: xr.load_dataset(finite_n_path(name, n)) for n in sizes}
        print(f"### {CASES[name]}: N particles at the converged Eulerian W\n")
        print("Particle systems (not trained) run at the W of the Eulerian L-BFGS training, one initial sample and "
              f"noise path per seed (particles.seed = {FINITE_N_SEED} + s), overrides as in the L-BFGS section with "
              "`particles.n=N`.  If the Eulerian optimum were a property of large particle systems, their J would "
              f"approach the mean-field J = {mean_field:.3f} as N grows, with a spread shrinking like N^-1/2.\n")
        print("| N | seeds | particle J at the Eulerian W (mean ± SE) | quartiles 25 / 50 / 75 % | "
              "seeds within 0.2 of the mean-field J |")
        print("|---|---|---|---|---|")
        for n, run in runs.items():
            cost = run["cost"].values
            quartiles = np.percentile(cost, [25, 50, 75])
            print(f"| {n} | {cost.size} | {cost.mean():.3f} ± {cost.std(ddof=1) / math.sqrt(cost.size):.3f} | "
                  + " / ".join(f"{q:.3f}" for q in quartiles)
                  + f" | {int((np.abs(cost - mean_field) <= 0.2).sum())} |")
        n = max(sizes)
        order = runs[n]["order_parameter"]
        reference = mean_field_order.sel(time=order["time"], method="nearest").values
        print(f"\nThe order parameter |int x dmu_t| along depth at N = {n} beside the Eulerian run's: the standard "
              "deviation over seeds times sqrt(N) would stay of order one if the particles only carried their "
              "initial sampling error; its growth is the amplification of that error by the dynamics.\n")
        print("| t | Eulerian | particles (mean ± SE) | std over seeds x sqrt(N) |")
        print("|---|---|---|---|")
        spread = order.std("seed", ddof=1).values
        for t, value, mean, deviation in zip(order["time"].values, reference, order.mean("seed").values, spread):
            if t % 2 == 0 or t == order["time"].values[-1]:
                print(f"| {t:g} | {value:.4f} | {mean:.4f} ± {deviation / math.sqrt(order.sizes['seed']):.4f} | "
                      f"{deviation * math.sqrt(n):.2f} |")
    costs = [float(runs[size]["cost"].mean()) for size in sizes]
    growth = spread[-1] / spread[0]
    print(f"\nReading: the particle J at the Eulerian W falls from {costs[0]:.3f} (N = {sizes[0]}) to {costs[-1]:.3f} "
          f"(N = {sizes[-1]}), still {costs[-1] - mean_field:.3f} above the mean-field J.  The particles follow the "
          f"mean field along depth, but the spread of their order parameter grows {growth:.1f}-fold from t = 0 to "
          f"T (an amplification rate of {math.log(growth) / T_END:.2f} per unit depth): under the Eulerian optimum "
          "the dynamics amplify finite-N fluctuations all along depth, and J at T depends on them (the quartiles "
          "show seeds near the mean-field J beside seeds far above it).  A training on N particles "
          "optimises the cost those fluctuations leave, which at small N has its optimum at another W.\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=20, help="particle seeds of the align case")
    parser.add_argument("--bow-seeds", type=int, default=10, help="particle seeds of the bow case (0: none)")
    parser.add_argument("--warm-seeds", type=int, default=4, help="seeds of the bow case's warm starts (0: none)")
    parser.add_argument("--warm-n", type=int, nargs="+", default=[64, 256, 1024], help="N of the warm starts")
    parser.add_argument("--continue-iterations", type=int, default=50,
                        help="iterations of the bow case's continued Eulerian training (0: none)")
    parser.add_argument("--converged-seeds", type=int, default=10,
                        help="particle seeds of each case trained to convergence by L-BFGS (0: none)")
    parser.add_argument("--fresh-seeds", type=int, default=10,
                        help="particle seeds of the bow case trained on fresh noise (0: none)")
    parser.add_argument("--finite-n", type=int, nargs="*", default=[64, 256, 1024, 4096],
                        help="N of the particle systems run at the converged Eulerian bow W (none: skip)")
    parser.add_argument("--finite-n-seeds", type=int, default=16, help="seeds of each of those N")
    parser.add_argument("--report-only", action="store_true", help="summarise the existing files, run nothing")
    parser.add_argument("--retrain", action="store_true", help="train again the runs whose files exist")
    args = parser.parse_args()
    jobs = {"seed004-align-l065": list(range(args.seeds)), "seed004-bow-k2": list(range(args.bow_seeds))}
    converged = {name: list(range(args.converged_seeds)) for name in jobs}
    fresh = {"seed004-bow-k2": list(range(args.fresh_seeds))}
    warm = ("seed004-bow-k2", list(range(args.warm_seeds)), args.warm_n)
    if not args.report_only:
        import torch

        torch.set_num_threads(1)
        for training, cases in (("adam", jobs), ("lbfgs", converged), ("fresh", fresh)):
            for name, seeds in cases.items():
                for seed in seeds:
                    if args.retrain or not os.path.exists(particle_path(name, seed, training=training)):
                        train_particles(name, seed, training=training)
        start = torch.as_tensor(eulerian_rows(warm[0])["W"])
        for n in warm[2] if warm[1] else []:
            for seed in warm[1]:
                if args.retrain or not os.path.exists(particle_path(warm[0], seed, n)):
                    train_particles(warm[0], seed, n, start)
        for n in args.finite_n:
            if args.retrain or not os.path.exists(finite_n_path(warm[0], n)):
                run_at_eulerian_W(warm[0], n, list(range(args.finite_n_seeds)))
        for learning_rate in CONTINUE_RATES if args.continue_iterations else []:
            if args.retrain or not os.path.exists(continued_path(warm[0], learning_rate)):
                continue_eulerian(warm[0], learning_rate, args.continue_iterations)
    print("# Seed 004 through the particle system (issue 4, criterion 5)\n")
    print("At the reduced scale; results/seed004.md has the seed-scale particle statistics. What this report "
          "still adds: trainings on fresh noise, warm starts from the Eulerian W, and particle systems up to N "
          "= 4096 at the Eulerian optimum.\n")
    print("Regenerate: `OMP_NUM_THREADS=1 python3 results/seed004_particles.py --seeds "
          f"{args.seeds} --bow-seeds {args.bow_seeds} --warm-seeds {args.warm_seeds} --warm-n "
          f"{' '.join(map(str, args.warm_n))} --continue-iterations {args.continue_iterations} --converged-seeds "
          f"{args.converged_seeds} --fresh-seeds {args.fresh_seeds} --finite-n {' '.join(map(str, args.finite_n))} "
          f"--finite-n-seeds {args.finite_n_seeds} > results/seed004_particles.md` (about 2 CPU hours)\n")
    print(__doc__.split("\n\n", 2)[2].replace("\n", " ") + "\n")
    print("Particle overrides: `" + " ".join(particle_overrides()) + " particles.seed=s`.\n")
    particles = {name: report(name, seeds) for name, seeds in jobs.items() if seeds}
    if warm[1]:
        report_warm(*warm)
    if args.continue_iterations:
        report_continued(warm[0], CONTINUE_RATES, particles.get(warm[0]))
    if args.converged_seeds:
        print("# Both trainings to convergence (L-BFGS)\n")
        print("The Eulerian runs and the particle runs trained by L-BFGS until the relative decrease of J per "
              "iteration or max |dJ/dW| falls below 1e-7 (results/seed004_reduced.py's second training), so that "
              "the displacements compared are those of optima, not of unfinished descents.  Particle overrides: `"
              + " ".join(particle_overrides("lbfgs")) + " particles.seed=s`.\n")
        for name, seeds in converged.items():
            report(name, seeds, "lbfgs")
        report_resolution("seed004-bow-k2", "lbfgs", converged["seed004-bow-k2"][:3])
    if args.finite_n:
        report_finite_n(warm[0], args.finite_n)
    if args.fresh_seeds:
        print("# Particle training on fresh noise\n")
        print("Each iteration draws a new initial sample and noise path (control.noise = 'fresh'), so Adam follows "
              "a stochastic gradient of the expected cost E J rather than the gradient of one path's cost, as "
              "the seed's spread suggests it did; the trained run itself is the path of particles.seed.  Beside "
              "the Eulerian run trained to convergence.  Particle overrides: `" + " ".join(particle_overrides("fresh"))
              + " particles.seed=s`.\n")
        for name, seeds in fresh.items():
            report(name, seeds, "fresh", "lbfgs")
    sys.stdout.flush()


def report_resolution(name, training, seeds):
    """The mean-field J at the Eulerian W and at particle-trained W's, on finer grids and steps than the
    training's: is the Eulerian optimum a property of the mean-field cost or of the lmax-24 grid?"""
    import xarray as xr

    with xr.open_dataset(path_of(name, T_END, training)) as dataset:
        controls = {"Eulerian W": dataset["W"].values}
    for seed in seeds:
        with xr.open_dataset(particle_path(name, seed, training=training)) as dataset:
            controls[f"particles' W, seed {seed}"] = dataset["W"].values
    print(f"### {CASES[name]}: the mean-field J of these W on finer grids\n")
    print("Each particle training minimises the cost of one sample path (common random numbers: one initial "
          "sample, one noise path).  Where the loss has several minima, as the bow loss with its candidates "
          "does, that path's optimum need not be the mean-field one; the mean-field J of each W, computed "
          "again at higher resolution:\n")
    print("| grid, step | " + " | ".join(controls) + " |")
    print("|---|" + "---|" * len(controls))
    for lmax, dt in ((24, 0.1), (48, 0.05), (96, 0.02)):
        cost_of = mean_field_cost(name, overrides_of(training, T_END) + [f"sphere.lmax={lmax}", f"time.dt={dt}"])
        costs = [cost_of(W) for W in controls.values()]
        print(f"| lmax {lmax}, dt {dt:g} | " + " | ".join(f"{cost:.4f}" for cost in costs) + " |")
    print()


if __name__ == "__main__":
    main()
