"""Figures of issue 5 (spectral attention field): results/spectral_verification.md.

    python3 results/spectral_verification.py                   # measure what has no summary, then the report
    python3 results/spectral_verification.py --report-only     # the report from the saved outputs alone
    python3 results/spectral_verification.py --rerun NAME ...  # measure NAME (or all) again first
    python3 results/spectral_verification.py --import-gpu OUT  # file the outputs of `bash benchmarks/gpu_checks.sh OUT`

Every figure is the output of one command, quoted with that command.  The outputs are the study's summaries, saved
as text by the results harness's naming (results/harness.py): results/spectral_verification/runs/<name>-<digest>.txt,
the digest that of the command (a changed command is a new summary).  The CPU outputs are measured here (criterion 1
~15 min, the benchmarks ~5-10 min each, the baseline run an hour or more on 2 shared cores); the GPU ones
(gpu_<name>, the machine in gpu_env) are what benchmarks/gpu_checks.sh wrote on a lent GPU, each headed by its
command, quoted only.  Criterion 1 is measured by this script (--criterion-1): the attention mean m = N / Z
(dimensionless, |m| <= 1) and the scaled transform T_C f exp(-beta |C^T x|) of the d + 1 channels (rho, y rho) of a
smooth positive density, spectral (Funk-Hecke) against dense quadrature on the same Gauss grid, float64.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import harness
import numpy as np
import torch

from spherepde.base.device import placement
from spherepde.discretisation.bases import SphereBasis
from spherepde.kernels.dense import dense_exp_kernel
from spherepde.kernels.funk_hecke import kernel_degree
from spherepde.kernels.spectral import SpectralExpKernel

STUDY = harness.Study("spectral_verification", suffix=".txt")
REPORT = harness.REPORTS / "spectral_verification.md"
# The machine the saved CPU outputs were measured on (the report quotes them; it measures nothing).
CPU_CORES = 2
CPU64 = placement("cpu", "float64")
GENERAL = np.array([[1.0, 0.3, -0.2], [0.1, 0.8, 0.4], [-0.3, 0.2, 1.2]])
ROTATION = np.linalg.qr(np.random.default_rng(1).standard_normal((3, 3)))[0]
MATRICES = {"sign flips (seed 003)": np.diag([-1.0, -1.0, 1.0]),
            "rotation": ROTATION * np.linalg.det(ROTATION),
            "general (sigma ratio 3)": GENERAL / np.linalg.svd(GENERAL, compute_uv=False)[0]}
# (name, title, script, options): each output is the summary of Spec(name, parameters=its command).
MEASUREMENTS = [
    ("field_agreement", "criterion 1: spectral vs dense field", "results/spectral_verification.py",
     ["--criterion-1"]),
    ("sht_backends", "criterion 3: torch SHT vs shtns (and the layout crossovers)", "benchmarks/sht_backends.py",
     ["--lmax", "16", "32", "48", "64", "96", "128", "256"]),
    ("field_scaling", "criterion 2: spectral vs dense field, fitted exponents", "benchmarks/field_scaling.py", []),
    ("step_rate", "full time steps per second (seed-003 baseline, RK4)", "benchmarks/step_rate.py",
     ["--dtypes", "float64"]),
    ("baseline_run", "criterion 4: seed-003 baseline, lmax 128, t in [0, 3]", "benchmarks/baseline_run.py",
     ["--threads", "2", "--filter-order", "16"]),
]

# Measured on a lent GPU by `bash benchmarks/gpu_checks.sh OUT` (no GPU here, so quoted, never rerun): (name, title,
# command); OUT/gpu_<name>.txt is the summary of Spec(f"gpu_{name}", parameters=command), the command as the first
# line of that output has it ("$ command": gpu_checks.sh writes it; --threads is the lent machine's nproc), and
# OUT/gpu_env.txt, the machine, that of GPU_ENVIRONMENT.
GPU_MEASUREMENTS = [
    ("cuda_tests", "CUDA tests: pytest -m cuda (each CUDA result against the CPU or shtns)",
     "python3 -m pytest -m cuda -q -p no:cacheprovider tests"),
    ("baseline_run", "criterion 4 on the GPU: seed-003 baseline, lmax 128, t in [0, 3], float64 and float32",
     "python3 benchmarks/baseline_run.py --devices cuda --filter-order 16 --out /tmp/baseline"),
    ("step_rate", "full time steps per second on the GPU and its CPU (1 thread), memory bandwidth achieved",
     "python3 benchmarks/step_rate.py --devices cpu cuda"),
    ("step_rate_more", "steps per second with a general B, and at lmax 256 against all CPU cores",
     "bash -c python3 benchmarks/step_rate.py --devices cpu cuda --B general --lmax 64 128     --dtypes float64 && "
     "python3 benchmarks/step_rate.py --devices cpu cuda --lmax 256 --dtypes float64 --threads 16"),
]
# What a CPU output quoted from an earlier version of its benchmark no longer shows (name -> note under its quote).
CPU_NOTES = {
    "baseline_run": "This output is historical (before 2026-11-30, not remeasured: about an hour here then), in an "
                    "earlier format of benchmarks/baseline_run.py, on the earlier grid and Legendre layout (see "
                    "\"On a GPU\" below). Its \"2 CPU threads\" is the --threads option as that version printed it; "
                    "--threads did not then reach the run (CHANGELOG 0.2.0), so it need not be the run's threads (its "
                    "CPU time is 1.9x its wall time). Today's version prints the threads the run had and adds a column "
                    "over the saves while both runs are resolved. Its times are not today's: a float64 step at lmax "
                    "128 takes 71 ms in the step rate above (remeasured 2026-12-06), 184 ms when it was last measured "
                    "(already on today's grid).",
}
GPU_ENVIRONMENT = harness.Spec("gpu_env", parameters="bash benchmarks/gpu_checks.sh OUT: nvidia-smi --query-gpu=name,"
                               "memory.total,driver_version,clocks.max.sm,clocks.max.mem; python, torch, numpy; nproc")

# What the saved GPU outputs show (2026-11-30, one H200 session); update with them.
GPU_READING = """Reading of the outputs below:
- A step costs 7-15 ms on the GPU whatever lmax (64 to 256) and dtype: it is bound by kernel launches
  and small transfers, not by memory (14% of the copy bandwidth at lmax 256 float64, 24% with a
  general B at lmax 128), so the GPU/CPU ratio grows with lmax: 2.4x at lmax 64, 18x at 128, 85x at
  256 against one CPU thread (200x with a general B at 128), 16x at 256 against all 16 cores.  CUDA
  graphs or fused kernels are the next step for small lmax.
- The baseline run (lmax 128, 1068 RK4 steps to t = 3) takes 23-27 s in float64 on the GPU, against
  198 s on this project's 2-core CPU (7-8x).  In float32 the GPU run stops at t = 2.75 with a
  non-finite velocity, 2 time units after the grid stopped resolving the density (t = 0.75, min
  density -20); the CPU float32 run reached t = 3.  Over the 56 saves both reached, every
  diagnostic agrees to <= 9.3e-6 relative (<= 2.6e-5 for min_density alone while resolved; the
  spectral tail there is round-off, 1e-15 against 1e-8).
- These GPU figures (and the CPU baseline run above them) were measured on the earlier grid nlon = 2 nlat
  (194 x 388 at lmax 128, 386 x 772 at 256) and, on the CPU, with the packed Legendre tables.  The grid
  now has a fast FFT length, nlon = 400 and 800 there (bases.dealiased_gauss_grid), and the CPU uses
  the sparse layout from lmax 48 (legendre_layouts.default_layout): together 1.5x the CPU step rate at lmax
  128 (measured then).  The step rate above was remeasured on 2026-12-06: 71 ms a step at lmax 128, against
  the 184 ms it showed when this was written (already on the new grid and layout).  The GPU keeps its
  layouts; neither the GPU nor the baseline figures are remeasured.
"""


def smooth_density(basis) -> torch.Tensor:
    """Band-limited positive two-cluster density (vMF-like bumps of concentration 3 and 2)."""
    x = basis.points
    rho = torch.exp(3 * x @ torch.tensor([0.3, 0.5, 0.8], dtype=torch.float64) / np.sqrt(0.98)) \
        + 0.5 * torch.exp(2 * x @ torch.tensor([-0.6, 0.2, -0.3], dtype=torch.float64) / np.sqrt(0.49))
    return basis.synthesis(basis.analysis(rho))


def field_agreement(lmax: int, C: np.ndarray, beta: float, stride: int) -> tuple[float, float, int, int, float]:
    """(max |m_spectral - m_dense|, max |T_spectral - T_dense| / max |T_dense|, points compared,
    Chebyshev nodes (1 for an orthogonal C), seconds).

    The dense quadrature is evaluated at every `stride`-th grid point only (its cost is linear in them);
    the spectral field is computed on the whole grid, as in a run, and sampled there.
    """
    basis = SphereBasis(lmax, CPU64)
    rho = smooth_density(basis)
    channels = torch.cat([rho[..., None], rho[..., None] * basis.points], dim=-1)
    matrix = torch.as_tensor(C)
    start = time.perf_counter()
    kernel = SpectralExpKernel(basis, matrix, beta, 1e-10)
    spectral, log_scale = kernel(channels)
    points = basis.points.reshape(-1, 3)
    rows = torch.arange(0, points.shape[0], stride)
    flat = channels.reshape(-1, 4) * basis.weights.reshape(-1, 1)
    dense, dense_log_scale = dense_exp_kernel(points[rows], points, flat, matrix, beta)
    spectral, log_scale = spectral.reshape(-1, 4)[rows], log_scale.reshape(-1)[rows]
    # Each method scales by its own shift (dense: the largest exponent over the grid, spectral:
    # beta |C^T x|); put the dense values on the spectral one's, T_C f exp(-beta |C^T x|).
    dense = dense * torch.exp(dense_log_scale - log_scale)[:, None]
    mean = float((spectral[:, 1:] / spectral[:, :1] - dense[:, 1:] / dense[:, :1]).abs().max())
    transform = float((spectral - dense).abs().max() / dense.abs().max())
    return mean, transform, len(rows), len(kernel.nodes), time.perf_counter() - start


def criterion_1(full: bool) -> None:
    print("float64, solver.kernel_tol = 1e-10, one thread.  ", end="")
    rho = smooth_density(SphereBasis(64, CPU64))
    print(f"Density: two vMF-like bumps (max / min = {float(rho.max() / rho.min()):.0f}), band-limited to lmax.  "
          "`m` is max |N/Z spectral - N/Z dense| (|m| <= 1, so absolute = relative to its scale); "
          "`T` is max |T spectral - T dense| / "
          "max |T dense| over the four channels.  beta = 1000 uses lmax 106, what the resolution rule asks "
          f"(kernel degree {kernel_degree(1000.0, 3, 1e-10)} at tol 1e-10, sigma_max(B) = 1).\n")
    print("| beta | lmax | B | Chebyshev nodes | points compared | max abs diff of m | max rel diff of T | bar | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    cases = [(beta, 64, 1e-10) for beta in (1.0, 10.0, 30.0)] + [(1000.0, 106, 1e-8)]
    for beta, lmax, bar in cases:
        for name, C in MATRICES.items():
            stride = 1 if full or lmax <= 64 else 7
            mean, transform, count, nodes, seconds = field_agreement(lmax, C, beta, stride)
            verdict = "ok" if mean <= bar and transform <= bar else "FAILS"
            print(f"| {beta:g} | {lmax} | {name} | {nodes} | {count}{'' if stride == 1 else f' (every {stride}th)'} | "
                  f"{mean:.1e} | {transform:.1e} | {bar:.0e} {verdict} | {seconds:.0f} |", flush=True)
    print()


def command(script: str, options: list) -> str:
    return " ".join(["python", script, *options])


def cpu_specs() -> dict:
    """name -> the Spec of a CPU measurement, its parameters the command that writes it."""
    return {name: harness.Spec(name, parameters=command(script, options)) for name, _, script, options in MEASUREMENTS}


def gpu_specs() -> dict:
    return {name: harness.Spec(f"gpu_{name}", parameters=line) for name, _, line in GPU_MEASUREMENTS}


def saved(spec: harness.Spec) -> str:
    """The summary's path as the report names it."""
    return STUDY.path(spec).relative_to(harness.ROOT).as_posix()


def measure(name: str) -> None:
    """Run the command of CPU measurement `name` (one thread) and save its output without shtns's banner lines."""
    _, _, script, options = next(measurement for measurement in MEASUREMENTS if measurement[0] == name)
    print(f"spectral_verification: {command(script, options)}", file=sys.stderr, flush=True)
    output = subprocess.run([sys.executable, str(harness.ROOT / script), *options], check=True, capture_output=True,
                            text=True, env=os.environ | {"OMP_NUM_THREADS": "1"}).stdout
    STUDY.write(cpu_specs()[name], "".join(line for line in output.splitlines(keepends=True)
                                    if not line.startswith("[SHTns")))


def import_gpu(folder: Path) -> None:
    """File the outputs of `bash benchmarks/gpu_checks.sh FOLDER` as the GPU summaries.  An output whose first line
    is not the planned command is refused: a changed command is a new measurement, so GPU_MEASUREMENTS is updated
    first (a new digest; the summary of the old command is then stale)."""
    copies = []
    for name, _, line in GPU_MEASUREMENTS:
        source = folder / f"gpu_{name}.txt"
        if not source.exists():
            print(f"spectral_verification: no {source}, gpu_{name} kept", file=sys.stderr)
            continue
        first = source.read_text().split("\n", 1)[0]
        if first != f"$ {line}":
            raise SystemExit(f"{source} ran `{first[2:]}`, the plan has `{line}`: update GPU_MEASUREMENTS")
        copies.append((source, STUDY.path(gpu_specs()[name])))
    if (folder / "gpu_env.txt").exists():
        copies.append((folder / "gpu_env.txt", STUDY.path(GPU_ENVIRONMENT)))
    STUDY.folder.mkdir(parents=True, exist_ok=True)
    for source, target in copies:
        shutil.copyfile(source, target)


def report() -> str:
    """The report, from the saved outputs alone."""
    lines = ["# Spectral attention field: verification (issue 5)\n",
             f"Machine: {CPU_CORES} CPU cores shared with other jobs; timings are ratios measured side by side "
             "in one process, single-threaded timings in thread CPU time.\n"]
    specs = cpu_specs()
    for name, title, *_ in MEASUREMENTS:
        spec = specs[name]
        lines.append(f"## {title}\n\n`OMP_NUM_THREADS=1 {spec.parameters}` (saved in {saved(spec)}):\n")
        if STUDY.has(spec):
            text = STUDY.read(spec).rstrip()
            # Criterion 1 is a markdown table already; the benchmarks print fixed-width text.
            lines.append(text + "\n" if name == "field_agreement" else "```\n" + text + "\n```\n")
            if name in CPU_NOTES:
                lines.append(CPU_NOTES[name] + "\n")
        else:
            lines.append(f"(not run yet: --rerun {name})\n")
    if not STUDY.has(GPU_ENVIRONMENT):
        return "\n".join(lines) + "\n"
    machine = STUDY.read(GPU_ENVIRONMENT).strip()
    lines.append("# On a GPU\n\nMeasured by `bash benchmarks/gpu_checks.sh OUT` on a lent machine (each part's command "
                 f"is the first line of its output):\n\n```\n{machine}\n```\n")
    lines.append(GPU_READING)
    specs = gpu_specs()
    for name, title, _ in GPU_MEASUREMENTS:
        if STUDY.has(specs[name]):
            lines.append(f"## {title}\n\n(saved in {saved(specs[name])})\n\n"
                         f"```\n{STUDY.read(specs[name]).rstrip()}\n```\n")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rerun", nargs="+", default=[], metavar="NAME",
                        help="field_agreement, sht_backends, field_scaling, step_rate, baseline_run or all")
    parser.add_argument("--report-only", action="store_true", help="measure nothing: the report from the saved outputs")
    parser.add_argument("--import-gpu", metavar="OUT", type=Path,
                        help="file OUT/gpu_*.txt (written by benchmarks/gpu_checks.sh OUT) as the GPU summaries")
    parser.add_argument("--criterion-1", action="store_true", help="measure criterion 1 only (markdown table)")
    parser.add_argument("--full", action="store_true", help="dense quadrature on every point at beta = 1000 too")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.criterion_1:
        criterion_1(args.full)
        return
    if args.import_gpu:
        import_gpu(args.import_gpu)
    if not args.report_only:
        specs = cpu_specs()
        for name, *_ in MEASUREMENTS:
            if name in args.rerun or "all" in args.rerun or not STUDY.has(specs[name]):
                measure(name)
    stale = STUDY.stale(list(cpu_specs().values()) + list(gpu_specs().values()) + [GPU_ENVIRONMENT])
    if stale:
        print("spectral_verification: summaries no command of the plan names: "
              + ", ".join(path.name for path in stale), file=sys.stderr)
    REPORT.write_text(report())


if __name__ == "__main__":
    main()
