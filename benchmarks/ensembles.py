"""Ensembles and the lean time step: every ratio of the ensembles issue, measured side by side in one run.

    OMP_NUM_THREADS=1 python3 benchmarks/ensembles.py [--baseline COMMIT] [--quick] [--training OLD.npz]

On one CPU thread, each time is the thread's CPU time (a shared machine's waits for a core do not count), the
median of --repeats repetitions.  Measured, for the S^1 case of seed 004 (A = diag(1, 0.65) as B = V,
eps = 1e-2, unnormalized, lmax 64 on 200 points, dt 0.02, imex-ark436, the dense field):

1. a forward step at M = 1 against a plain numpy step on the same grid with the same six stages and the same
   dense kernel, precomputed (`floors.numpy_step`: FFTs, one matrix-vector product for the attention, the IMEX
   combinations written as loops over the stages), and an evaluation of J and dJ/dW per step against the
   forward run's step (the discrete gradient of an align training over 40 layers, T = 80 / 10);
2. the same per member at M = 20, against M = 1;
3. the particle training at the seed's scale (N = 64 tokens, T = 80, particles.dt = time.dt = 0.01): one
   evaluation of 20 trainings batched, per member, against one serial evaluation of the code at --baseline (both
   the median of --repeats), and the floor of its arithmetic on this core (particle_floor);
4. S^2, softmax, lmax 32, the spectral field (the quick-start's model): a step per member at M = 16 against M = 1,
   and an evaluation of J and dJ/dW of the model trained (no criterion) against its forward step;
5. the code at --baseline (default: the commit the ensembles issue started from), checked out into a temporary
   folder (git archive) and measured in a child process on the same cases: its forward step and its evaluation
   per step, against today's;
6. with --training OLD.npz (results of the baseline's seed-scale bow kappa_cand = 2 training, L-BFGS to
   tol 1e-7 from W = 0 as results/seed004.py's Eulerian rows train it, which --record-baseline-training OLD.npz makes:
   hours to the tolerance, about a minute an evaluation; --training-iterations K stops both after K L-BFGS
   iterations, so that the same path is compared at a fraction of the cost): the same training with today's code
   in a fresh process, as the baseline's: its CPU time and trained W against the stored ones.

--paths adds the measurement behind Transport's choice between its matrix, fourier and grid paths: a step on
each, forced, at a few grids and batch sizes, beside the path the cost estimate picks.  Beside 2. the benchmark
prints the costs read as fixed + M x marginal (`print_fixed_and_marginal`: the criterion's ratio weighs the two),
one core's throughput (a large GEMM, a batch of 200-point FFTs) and the arithmetic floor of an S^1 step per
member it implies on the paths taken at M = 1 and M = 20, and the cost of the fourier path's step written as the
fewest torch (and numpy) operations (floors.lean_fourier_step), and its evaluation (the step keeping its rows,
then its transpose) likewise in numpy (floors.lean_fourier_evaluation): what the per-operation overhead leaves
reachable.

--fields adds the measurement behind solver.field = "auto" and Transport's path (model.transport's cost model):
a step with each field (dense, spectral) on each of its paths, forced, on S^2 (softmax and unnormalized, B = I and
the general B of convergence-s2) at lmax 6-24 and S^1 at lmax 16-256, at 1, 4 and 16 members, beside the
estimates and the pick, flagging a pick more than 15% slower than the fastest (the field is per member: M = 1's
fastest; at more members the path within the picked field).  About 15 minutes on one core.

--quick shortens the horizons (the ratios stay per step) for a run of a few minutes.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch
from floors import (
    arithmetic_floor,
    clock,
    lean_fourier_evaluation,
    lean_fourier_step,
    numpy_step,
    particle_floor,
    use_threads,
)

import spherepde

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

BASELINE = "77c4626"  # the commit the ensembles issue started from
S1_CASE = os.path.join(ROOT, "cases", "seed004-align-l065.toml")
S1 = ["sphere.lmax=64", "time.dt=0.02", "solver.field='dense'", "control.gradient='discrete'"]
BOW = os.path.join(ROOT, "cases", "seed004-bow-k2.toml")
BOW_TRAINING = ["sphere.lmax=64", "time.dt=0.02", "solver.field='dense'", "control.gradient='discrete'",
                "control.optimizer='lbfgs'", "control.tol=1e-7"]


def bow_overrides(iterations: int) -> list:
    """The seed-scale bow training's overrides, stopped after `iterations` L-BFGS iterations."""
    return BOW_TRAINING + [f"control.iterations={iterations}"]
S2_CASE = os.path.join(ROOT, "cases", "quickstart.toml")
S2 = ["sphere.lmax=32", "solver.field='spectral'"]


# --- today's code ------------------------------------------------------------------------------------------


def load(path, overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spherepde.load_case(path, overrides)


def eulerian_costs(members: int, t_end: float, layers: int, repeats: int) -> dict:
    """(forward step, evaluation per step) seconds of `members` copies of the S^1 align training."""
    return training_costs(load(S1_CASE, S1 + [f"time.t_end={t_end}", f"control.layers={layers}"]), members, repeats)


def training_costs(case, members: int, repeats: int) -> dict:
    """Seconds of a forward step and of an evaluation of J and dJ/dW per step, of `members` copies of the training
    `case` (W = 0.1 standard normals)."""
    from solvers.adjoint import discrete_gradients
    from solvers.controlled_forward import ControlledForward

    forward = ControlledForward([case] * members)
    states = forward.initial()
    d = case.dim
    controls = 0.1 * torch.randn((members, case["control"]["layers"], d, d),
                                 generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        forward.run(states, controls)  # warm-up: matrices, buffers
        run = clock(lambda: forward.run(states, controls), repeats)
    # warm-up: the first evaluation's tape is fresh memory (its page faults: 27% more at M = 20, T = 80), every
    # later one of a training reuses it
    discrete_gradients(forward, states, controls)
    evaluation = clock(lambda: discrete_gradients(forward, states, controls), repeats)
    return {"step": run / forward.steps, "evaluation": evaluation / forward.steps, "steps": forward.steps,
            "path": forward.problem.transport.path, "attention": forward.problem.transport.attention_mode}


def particle_costs(members: int, t_end: float, repeats: int) -> dict:
    """Seconds of one batched evaluation of `members` particle trainings (N = 64, seeds 0..), per member."""
    from solvers.particle_training import ParticleControl

    overrides = ["solver.method='particles'", "particles.n=64", f"time.t_end={t_end}"]
    cases = [load(BOW, overrides + [f"particles.seed={seed}"]) for seed in range(members)]
    control = ParticleControl(cases)
    controls = torch.zeros((members, control.layers, 2, 2), dtype=torch.float64)
    seconds = clock(lambda: control.gradients(controls), repeats)
    return {"evaluation": seconds / members, "steps": control.steps}


def print_particle_floor(particles: dict) -> None:
    """The particle evaluation's time per member and step against its arithmetic's floor (particle_floor)."""
    floor = particle_floor()
    per_step = particles["evaluation"] / particles["steps"]
    print(f"   per member and step {1e6 * per_step:.1f} us; its arithmetic {floor['exps']} exps and "
          f"{floor['flops'] / 1e3:.0f} kFLOP; one core: exp {1e9 * floor['exp_seconds']:.2f} ns, dgemm peak "
          f"{floor['peak'] / 1e9:.1f} GFLOP/s (the (20, 6, 64) x (20, 64, 64) products "
          f"{floor['batched'] / 1e9:.1f}): floor {1e6 * floor['floor']:.1f} us, {per_step / floor['floor']:.1f}x "
          "above it")


def print_fixed_and_marginal(single: dict, batch: dict, members: int) -> None:
    """A cost of M members read as fixed + M x marginal (a + M b) from M = 1 and M = `members`.  The cost per member at
    M is at most 1/10 of M = 1's exactly when b <= a (M - 10) / (9 M) (a / 18 at M = 20): the criterion weighs the
    marginal cost against the fixed one (the per-operation overhead that batching shares), not against a floor."""
    bound = (members - 10) / (9 * members)
    for name in ("step", "evaluation"):
        marginal = (batch[name] - single[name]) / (members - 1)
        fixed = single[name] - marginal
        print(f"   {name}: fixed {1e3 * fixed:.4f} ms + {1e3 * marginal:.4f} ms per member; the ratio <= 0.1 needs "
              f"the marginal <= {1e3 * bound * fixed:.4f} ms")


def sphere_costs(members: int, repeats: int) -> dict:
    """Seconds of a forward step of `members` copies of the S^2 spectral case, per member."""
    return sphere_ratio((members,), repeats)[members]


def sphere_ratio(batches: tuple, rounds: int) -> dict:
    """`sphere_costs` of each number of members in `batches`, measured in turn over `rounds` rounds (the median of
    each): a drift of the machine's speed over the measurement (the M = 1 step measured 4.0-5.9 ms in single runs)
    then reaches every batch alike, not one."""
    from solvers.forward_problem import ForwardProblem

    problems = {members: ForwardProblem([load(S2_CASE, S2)] * members) for members in batches}
    times = {members: [] for members in batches}
    for _ in range(rounds):
        for members, problem in problems.items():
            times[members].append(step_seconds(problem, 1) / members)
    return {members: {"step": statistics.median(times[members]), "path": problem.transport.path,
                      "field": problem.kernels.name} for members, problem in problems.items()}


def sphere_evaluation_costs(members: int, repeats: int) -> dict:
    """`training_costs` of the S^2 case trained (align loss, 4 layers, dt 0.01, T = 0.4), per member: the
    quick-start's model has no [control] section, so the case is its table with one."""
    import tomllib

    from spherepde.io.case import case_from_dict

    with open(S2_CASE, "rb") as file:
        table = tomllib.load(file)
    table["time"] = {"t_end": 0.4, "dt": 0.01}
    table["control"] = {"loss": "align", "target": [0.0, 0.0, 1.0], "lambda_reg": 0.01, "layers": 4,
                        "gradient": "discrete"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        costs = training_costs(case_from_dict(table, S2), members, repeats)
    return {"step": costs["step"] / members, "evaluation": costs["evaluation"] / members}


def step_seconds(problem, repeats: int, dt: float = 0.01, steps: int = 4) -> float:
    """Seconds of one forward step of all of `problem`'s members: the median over `repeats` of `steps` steps, after
    as many steps of warm-up (the heap settles over the first few: spherepde/base/memory.py)."""
    from solvers.timegrid import Plan, TimeGrid

    members = problem.batch.members
    state = problem.initial()
    factors = problem.factors(Plan(TimeGrid(dt, dt).intervals[0], np.full(members, 1), np.full(members, dt)))
    drive = problem.transport.feed_forward(problem.batch.W)

    def some_steps():
        for _ in range(steps):
            problem.step(state, drive, factors)
    with torch.no_grad():
        some_steps()
        return clock(some_steps, repeats) / steps


def forced_paths(problem, repeats: int, matrix_bytes: int) -> dict:
    """{path: (seconds of a forward step of `problem`'s members with Transport's path forced, Transport's estimate
    of it)} for each path the case has; the matrix path's memory limit `matrix_bytes` (the others' MATRIX_BYTES).
    Leaves the last path forced in `problem`."""
    from spherepde.model.transport import MATRIX_BYTES, Transport

    out = {}
    for forced in ("matrix", "fourier", "grid"):
        try:
            transport = Transport(problem.basis, problem.batch, problem.kernels,
                                  matrix_bytes if forced == "matrix" else MATRIX_BYTES, path=forced)
        except ValueError:  # the case has no such path
            continue
        if transport.path == forced:
            problem.transport = transport
            out[forced] = (step_seconds(problem, repeats, problem.cases[0]["time"].get("dt", 0.01)), transport.cost)
    return out


def path_costs(path: str, overrides: list, members: int, repeats: int) -> dict:
    """Seconds of a forward step per path (forced, where the case has it, the matrix path beyond its memory limit)
    and the path Transport's estimate picks."""
    from solvers.forward_problem import ForwardProblem

    problem = ForwardProblem([load(path, overrides)] * members)
    chosen = problem.transport.path
    return {"chosen": chosen} | {forced: seconds for forced, (seconds, _) in
                                 forced_paths(problem, repeats, 2 ** 40).items()}


FIELD_CASES = [("convergence-s2.toml", [], range(8, 25, 2)), ("quickstart.toml", ["time.dt=0.01"], range(6, 25, 2)),
               ("convergence-s2.toml", ["model.kernel='unnormalized'"], range(8, 25, 2)),
               ("quickstart.toml", ["time.dt=0.01", "model.kernel='unnormalized'"], range(6, 25, 2)),
               ("kuramoto-s1.toml", [], (16, 32, 64, 128, 256)),
               ("seed004-align-l065.toml", ["time.dt=0.02"], (16, 32, 64, 128, 256)),
               ("seed004-align-l065.toml", ["time.dt=0.02", "model.kernel='softmax'"], (16, 32, 64, 128, 256))]


def field_costs(path: str, overrides: list, members: int, repeats: int) -> dict:
    """Seconds of a forward step of `members` copies of the case with each field on each of its paths, forced
    ({"dense/matrix": s, ...}), Transport's estimate of each ("dense/matrix:estimate"), and the pick of
    solver.field = "auto" ("picked": field/path)."""
    from solvers.forward_problem import ForwardProblem
    from spherepde.model.transport import MATRIX_BYTES

    picked = ForwardProblem([load(path, overrides + ["solver.field='auto'"])] * members)
    out = {"picked": f"{picked.kernels.name}/{picked.transport.path}"}
    for field in ("dense", "spectral"):
        problem = ForwardProblem([load(path, overrides + [f"solver.field='{field}'"])] * members)
        for forced, (seconds, estimate) in forced_paths(problem, repeats, MATRIX_BYTES).items():
            out[f"{field}/{forced}"], out[f"{field}/{forced}:estimate"] = seconds, estimate
    return out


def print_field_costs(repeats: int) -> None:
    """`field_costs` over FIELD_CASES at 1, 4 and 16 members: the measured step (ms) and the estimate (in 1e6
    multiply-adds) of each field and path, the pick, and the fastest; a pick more than 15% slower is flagged."""
    from spherepde.base.errors import CaseError

    print("8. solver.field = 'auto' and Transport's path: a step (ms; the estimate in 1e6 multiply-adds), forced; the "
          "pick; the fastest (M = 1: of all; more members: of the picked field's paths)")
    flagged = 0
    for members in (1, 4, 16):
        for name, overrides, lmaxes in FIELD_CASES:
            for lmax in lmaxes:
                try:
                    costs = field_costs(os.path.join(ROOT, "cases", name), overrides + [f"sphere.lmax={lmax}"],
                                        members, repeats)
                except CaseError:  # too coarse for the kernel
                    continue
                times = {key: value for key, value in costs.items() if ":" not in key and key != "picked"}
                field = costs["picked"].split("/")[0]
                fastest = min((key for key in times if members == 1 or key.startswith(field)), key=times.get)
                ratio = times[costs["picked"]] / times[fastest]
                flagged += ratio > 1.15
                print(f"   {name} {' '.join(o for o in overrides if 'dt' not in o)} lmax {lmax:3d} M = {members:2d}: "
                      + "  ".join(f"{key} {1e3 * value:7.3f} ({costs[key + ':estimate'] / 1e6:6.2f})"
                                  for key, value in times.items())
                      + f"  picked {costs['picked']}, fastest {fastest}" + (f"  <-- {ratio:.2f}x" if ratio > 1.15
                                                                             else ""))
    print(f"   picks more than 15% slower than the fastest: {flagged}")


def s1_products(path: str, points: int, size: int, rank: int = 0, rows: int = 0) -> tuple[int, int]:
    """(multiply-adds in products, FFTs) of one S^1 rate evaluation of one member on the path `path`, with `points`
    grid points and `size` real coefficients: the matrix path's (rho, u) from the state and the divergence,
    3 points size; the fourier path's rank-r velocity from the `rows` coefficients its R reads (FourierPath.low:
    66 of seed 004's 130 at lmax 64) and onto the grid, r (rows + points), and two FFTs; the grid path's operator
    u = G rho (one frame component a point on S^1), points^2, and two FFTs."""
    if path == "matrix":
        return 3 * points * size, 0
    if path == "fourier":
        return rank * (rows + points), 2
    if path == "grid":
        return points * points, 2
    raise ValueError(f"no S^1 floor for the {path!r} path")


def s1_floor(throughput: dict, path: str, members: int) -> float:
    """Seconds per member of an S^1 forward step at one core's throughput (arithmetic_floor): the six stages'
    products (`s1_products`) at the GEMM rate and their FFTs at the FFT rate, on the path `path` (with the operator
    attention), elementwise work left out."""
    from solvers.forward_problem import ForwardProblem

    problem = ForwardProblem([load(S1_CASE, S1)] * members)
    transport = problem.transport
    assert (transport.path, transport.attention_mode) == (path, "operator"), (transport.path, path)
    stages, points, size = problem.scheme.stages_count, problem.basis.grid_size, problem.lam.shape[1]
    rank, rows = (transport._folded.rank, transport._folded.low) if path == "fourier" else (0, 0)
    products, ffts = s1_products(path, points, size, rank, rows)
    return stages * (2 * products / throughput["gemm"] + ffts * 2.5 * points * math.log2(points) / throughput["fft"])


# --- the baseline's code, in a child process --------------------------------------------------------------

BASELINE_CHILD = r'''
import json, os, statistics, sys, time, warnings
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
import spherepde
from solvers.eulerian import ForwardProblem
from solvers.timesteppers import choose_scheme, make_stepper  # the baseline's own layout, not today's
from solvers.adjoint import ControlledForward, discrete_gradient
from spherepde.initial import initial_density
settings = json.loads(sys.argv[2])
def clock(function, repeats):
    times = []
    for _ in range(repeats):
        start = time.thread_time(); function(); times.append(time.thread_time() - start)
    return statistics.median(times)
def load(path, overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return spherepde.load_case(path, overrides)
out = {}
case = load(os.path.join(sys.argv[1], "cases", settings["s1_case"]),
            settings["s1"] + [f"time.t_end={settings['t_end']}", f"control.layers={settings['layers']}"])
problem = ForwardProblem(case)
step = make_stepper(choose_scheme(case["time"]["scheme"], problem.model.eps))
c = initial_density(case["initial"], problem.basis)
dt = case["time"]["dt"]
def steps(count=200):
    global c
    for _ in range(count):
        c = step(problem.lam, problem.transport, 0.0, c, dt)
steps(10)
out["step"] = clock(steps, settings["repeats"]) / 200
forward = ControlledForward(case)
c0 = initial_density(case["initial"], forward.problem.basis)
controls = 0.1 * torch.randn((settings["layers"], 2, 2), generator=torch.Generator().manual_seed(0),
                             dtype=torch.float64)
discrete_gradient(forward, c0, controls)  # warm-up, as today's (training_costs): the first tape's page faults
out["evaluation"] = clock(lambda: discrete_gradient(forward, c0, controls), settings["repeats"]) / forward.steps
from solvers.particle_training import ParticleControl
particles = load(os.path.join(sys.argv[1], "cases", settings["bow"]),
                 ["solver.method='particles'", "particles.n=64", f"time.t_end={settings['particle_t_end']}",
                  "particles.seed=0"])
control = ParticleControl(particles)
zero = torch.zeros((control.layers, 2, 2), dtype=torch.float64)
out["particle_evaluation"] = clock(lambda: control.gradient(zero), settings["repeats"])
foreign = [name for name, module in sys.modules.items() if name.split(".")[0] in ("spherepde", "solvers")
           and getattr(module, "__file__", None) and not module.__file__.startswith(sys.argv[1])]
assert not foreign, f"modules not from the baseline: {foreign}"
print(json.dumps(out))
'''


# The seed-scale bow training in a fresh process on the code in argv[1] (the baseline's or today's): the same start
# for both, where today's run in the benchmark's own process, after its other measurements, took 30.7 CPU s against
# 22.1-22.3 in a fresh one (the same 8 L-BFGS iterations).
TRAINING_CHILD = r'''
import json, os, sys, time, warnings
import numpy as np, torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
import spherepde
settings = json.loads(sys.argv[2])
case = spherepde.load_case(os.path.join(sys.argv[1], "cases", settings["bow"]), settings["overrides"])
start = time.process_time()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    dataset = spherepde.run(case, progress=False)
np.savez(settings["out"], W=dataset["W"].values, loss=dataset["loss"].values, cpu=time.process_time() - start,
         stop=dataset.attrs["optimizer_stop"], iterations=settings["iterations"])
'''


def in_baseline(commit: str, child: str, settings: dict) -> str:
    """Run the script `child` (argv: the baseline's folder, settings as JSON) on the code at `commit`, checked out
    with git archive into a temporary folder; its standard output."""
    with tempfile.TemporaryDirectory(prefix="spherepde-baseline-") as folder:
        archive = subprocess.run(["git", "-C", ROOT, "archive", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        return run_child(child, folder, settings)


def run_child(child: str, folder: str, settings: dict) -> str:
    """The standard output of the script `child` run in a fresh process on one thread (argv: the code's `folder`,
    settings as JSON)."""
    return subprocess.run([sys.executable, "-c", child, folder, json.dumps(settings)], check=True,
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")).stdout


def training_settings(iterations: int, out: str) -> dict:
    """TRAINING_CHILD's settings: the bow training stopped after `iterations` L-BFGS iterations, its results to
    `out`."""
    return {"bow": os.path.basename(BOW), "overrides": bow_overrides(iterations), "iterations": iterations,
            "out": os.path.abspath(out)}


def baseline_costs(commit: str, settings: dict) -> dict:
    """The child's measurements of the code at `commit`."""
    return json.loads(in_baseline(commit, BASELINE_CHILD, settings).strip().splitlines()[-1])


# --- the seed-scale training -----------------------------------------------------------------------------


def bow_training(iterations: int):
    """Today's seed-scale bow kappa_cand = 2 training (L-BFGS, tol 1e-7, at most `iterations` iterations) in a fresh
    process (TRAINING_CHILD): (W, J history, CPU seconds, the optimizer's stop)."""
    with tempfile.TemporaryDirectory(prefix="spherepde-training-") as folder:
        out = os.path.join(folder, "training.npz")
        run_child(TRAINING_CHILD, os.path.abspath(ROOT), training_settings(iterations, out))
        today = np.load(out)
        return today["W"], today["loss"], float(today["cpu"]), str(today["stop"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=BASELINE, help=f"commit to compare with (default {BASELINE})")
    parser.add_argument("--quick", action="store_true", help="shorter horizons (the ratios are per step)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--training", metavar="OLD.npz", help="compare today's bow training with the stored one")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline's measurements")
    parser.add_argument("--paths", action="store_true", help="also time the matrix and the grid path")
    parser.add_argument("--fields", action="store_true",
                        help="only time each field on each path over a range of grids, beside the auto pick")
    parser.add_argument("--record-baseline-training", metavar="OUT.npz",
                        help="run the baseline's bow training (hours) and store W, J and its CPU time")
    parser.add_argument("--training-iterations", type=int, default=300, metavar="K",
                        help="with --record-baseline-training: stop after K L-BFGS iterations (default 300, i.e. at "
                             "tol); --training then trains today's code as far")
    args = parser.parse_args(argv)
    use_threads(1)
    if args.fields:
        print_field_costs(args.repeats)
        return
    if args.record_baseline_training:
        in_baseline(args.baseline, TRAINING_CHILD,
                    training_settings(args.training_iterations, args.record_baseline_training))
        return
    t_end, particle_t_end = (8.0, 8.0) if args.quick else (80.0, 80.0)
    layers = 40
    print(f"spherepde ensembles benchmark: 1 CPU thread, thread CPU time, median of {args.repeats}; "
          f"S^1 align T = {t_end:g}, particles T = {particle_t_end:g}\n")

    step, c0 = numpy_step(load(S1_CASE, S1))
    state = {"c": c0}

    def numpy_steps(count=200):
        for _ in range(count):
            state["c"] = step(state["c"])
    numpy_steps(10)
    numpy_seconds = clock(numpy_steps, args.repeats) / 200

    single = eulerian_costs(1, t_end, layers, args.repeats)
    batch = eulerian_costs(20, t_end, layers, max(1, args.repeats - 1))
    print("1. S^1 seed 004 (lmax 64, 200 points, dt 0.02, imex-ark436, dense field), M = 1:")
    print(f"   numpy step (6 stages, dense kernel)   {1e3 * numpy_seconds:8.3f} ms")
    print(f"   spherepde forward step ({single['path']} path, {single['attention']} attention) "
          f"{1e3 * single['step']:8.3f} ms   ratio to numpy {single['step'] / numpy_seconds:5.2f}   (criterion <= 2)")
    print(f"   evaluation of J and dJ/dW per step     {1e3 * single['evaluation']:8.3f} ms   ratio to the forward step "
          f"{single['evaluation'] / single['step']:5.2f}   (criterion <= 3)")
    print("2. M = 20, per member:")
    print(f"   forward step    {1e3 * batch['step'] / 20:8.4f} ms   ratio to M = 1 "
          f"{batch['step'] / 20 / single['step']:6.3f}   (criterion <= 0.1)")
    print(f"   evaluation      {1e3 * batch['evaluation'] / 20:8.4f} ms   ratio to M = 1 "
          f"{batch['evaluation'] / 20 / single['evaluation']:6.3f}   (criterion <= 0.1)")
    print_fixed_and_marginal(single, batch, 20)

    throughput = arithmetic_floor(args.repeats)
    print(f"   one core: {throughput['gemm'] / 1e9:.1f} Gflop/s in a 512^2 GEMM, {throughput['fft'] / 1e9:.1f} Gflop/s "
          "in 200-point rffts; the arithmetic floor of a step per member (products and FFTs only):")
    for path, members in ((single["path"], 1), (batch["path"], 20)):
        print(f"   {path} path (M = {members}) {1e3 * s1_floor(throughput, path, members):8.4f} ms")
    print("   the fourier path's step as the fewest operations (floors.lean_fourier_step), per member:")
    for library in ("torch", "numpy"):
        one, twenty = lean_fourier_step(library, 1), lean_fourier_step(library, 20) / 20
        print(f"   {library:5s} M = 1 {1e3 * one:8.4f} ms, M = 20 {1e3 * twenty:8.4f} ms: ratio {twenty / one:6.3f}; "
              f"M = 20 against spherepde's M = 1 {twenty / single['step']:6.3f}")
    one, twenty = lean_fourier_evaluation(1), lean_fourier_evaluation(20) / 20
    print("   its evaluation (the step keeping its rows, then its transpose) as the fewest operations "
          "(floors.lean_fourier_evaluation), per member:")
    print(f"   numpy M = 1 {1e3 * one:8.4f} ms, M = 20 {1e3 * twenty:8.4f} ms: ratio {twenty / one:6.3f}; M = 20 "
          f"against spherepde's M = 1 {twenty / single['evaluation']:6.3f}")

    particles = particle_costs(20, particle_t_end, args.repeats)
    old = None
    if not args.no_baseline:
        settings = {"s1_case": os.path.basename(S1_CASE), "s1": S1, "t_end": t_end, "layers": layers,
                    "repeats": args.repeats, "bow": os.path.basename(BOW), "particle_t_end": particle_t_end}
        old = baseline_costs(args.baseline, settings)
    print(f"3. particle trainings, N = 64, T = {particle_t_end:g} ({particles['steps']} steps): one evaluation "
          f"per member at M = 20 {particles['evaluation']:.3f} s" + ("" if old is None else
          f", the baseline's serial evaluation {old['particle_evaluation']:.2f} s: "
          f"{old['particle_evaluation'] / particles['evaluation']:.1f}x cheaper   (criterion >= 50)"))
    print_particle_floor(particles)

    sphere = sphere_ratio((1, 16), 2 * args.repeats + 1)
    s2_single, s2_batch = sphere[1], sphere[16]
    print(f"4. S^2 softmax, lmax 32, {s2_single['field']} field ({s2_single['path']} path): step per member "
          f"{1e3 * s2_single['step']:.2f} ms at M = 1, {1e3 * s2_batch['step']:.2f} ms at M = 16 (medians of "
          f"{2 * args.repeats + 1} rounds in turn): ratio {s2_batch['step'] / s2_single['step']:.3f}   "
          "(criterion <= 0.25)")
    for members in (1, 16):
        costs = sphere_evaluation_costs(members, args.repeats)
        print(f"   trained (align, 4 layers, T = 0.4), M = {members:2d}: an evaluation of J and dJ/dW "
              f"{1e3 * costs['evaluation']:.2f} ms per member and step, {costs['evaluation'] / costs['step']:.2f} "
              "forward steps")
    if old is not None:
        print(f"5. the baseline ({args.baseline}): forward step {1e3 * old['step']:.3f} ms "
              f"({old['step'] / single['step']:.1f}x today's), evaluation per step {1e3 * old['evaluation']:.3f} ms "
              f"({old['evaluation'] / single['evaluation']:.1f}x today's)")
    if args.paths:
        print("7. Transport's paths, a step (ms), forced; the path the estimate picks:")
        for path, overrides in ((S1_CASE, ["sphere.lmax=64", "solver.field='dense'"]),
                                (S1_CASE, ["sphere.lmax=128", "solver.field='dense'"]),
                                (os.path.join(ROOT, "cases", "seed004-eps-1e-4.toml"), []),
                                (os.path.join(ROOT, "cases", "convergence-s2.toml"), ["sphere.lmax=12"])):
            for members in (1, 4, 20):
                costs = path_costs(path, overrides, members, args.repeats)
                print(f"   {os.path.basename(path)} {' '.join(overrides)} M = {members:2d}: matrix "
                      f"{1e3 * costs.get('matrix', math.nan):8.3f}  fourier {1e3 * costs.get('fourier', math.nan):8.3f}"
                      f"  grid {1e3 * costs['grid']:8.3f}  chosen {costs['chosen']}")
    if args.training:
        stored = np.load(args.training)
        iterations = int(stored["iterations"]) if "iterations" in stored else 300
        W, loss, seconds, stop = bow_training(iterations)
        baseline_seconds = float(stored["cpu"])
        print(f"6. seed-scale bow kappa_cand = 2 training, at most {iterations} L-BFGS iterations: {len(loss)} "
              f"evaluations today, {len(stored['loss'])} at the baseline; "
              f"{seconds:.1f} CPU s today, {baseline_seconds:.1f} s at the "
              f"baseline: {baseline_seconds / seconds:.1f}x cheaper   (criterion >= 20); max |W - W_baseline| = "
              f"{np.abs(W - stored['W']).max():.2e}   (criterion <= 1e-8); J {loss[-1]:.10f} against "
              f"{float(stored['loss'][-1]):.10f}; {stop}")


if __name__ == "__main__":
    main()
