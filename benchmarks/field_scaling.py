"""Spectral vs dense attention field on S^2: time per call and fitted cost exponents (done-criterion 2).

One call transforms the d + 1 = 4 channels (rho, y rho) of a smooth positive density, beta = 30.
Matrices: "sign flips" B = diag(-1, -1, 1) (seed 003's baseline: a grid permutation), "rotation" (a
generic rotation: Wigner-D rotation of the coefficients) and "general" (sigma_max / sigma_min = 3:
Chebyshev interpolation in r and scattered evaluation, ducc0 on the CPU; the torch NUFFT, the
GPU path, is timed too; and the kept matrix of kernels.spectral.MatrixMode, which the field takes where it
fits SPECTRAL_MATRIX_BYTES, "-" beyond).  Everything runs in this process on one thread (torch.set_num_threads(1),
OMP_NUM_THREADS=1), spectral and dense interleaved, best of --repeats; on the CPU the time is the
calling thread's CPU time (every method computes on it), which the load of other processes on a
shared machine does not inflate as it does the wall time; on CUDA the synchronised wall time.  The dense quadrature is
built as solver.field = "dense" builds it: where its kernel matrix fits DENSE_MATRIX_BYTES (S^2 to lmax ~22)
it is kept and a whole call is timed (one matmul); otherwise it is
timed on a block of --rows query rows and scaled by N / rows when N is larger (its cost is
exactly linear in the rows; --full-dense times whole calls).  Exponents are least-squares
slopes of log(time) against log(lmax) over lmax >= --fit-from.  The last column says which field
`solver.field = "auto"` picks (from its cost model) for each matrix, upper case where that is not the
one measured faster.

    OMP_NUM_THREADS=1 python benchmarks/field_scaling.py [--lmax 16 24 32 48 64 96 128] [--device cpu]
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from spherepde.base.device import placement
from spherepde.discretisation.bases import SphereBasis
from spherepde.discretisation.scattered import DegreeRaisedTransform
from spherepde.kernels.choice import make_exp_kernel
from spherepde.kernels.dense import DENSE_MATRIX_BYTES, DenseExpKernel, dense_exp_kernel
from spherepde.kernels.spectral import SPECTRAL_MATRIX_BYTES, MatrixMode, SpectralExpKernel

GENERAL = np.array([[1.0, 0.3, -0.2], [0.1, 0.8, 0.4], [-0.3, 0.2, 1.2]])
ROTATION = np.linalg.qr(np.random.default_rng(1).standard_normal((3, 3)))[0]
MATRICES = {"sign flips": np.diag([-1.0, -1.0, 1.0]), "rotation": ROTATION * np.linalg.det(ROTATION),
            "general": GENERAL / np.linalg.svd(GENERAL, compute_uv=False)[0]}


def timed(function, repeats: int, device) -> float:
    clock = time.perf_counter if device.type == "cuda" else time.thread_time
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = clock()
        function()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, clock() - start)
    return best


def dense_time(kernel: DenseExpKernel, channels: torch.Tensor, rows: int, full: bool, repeats: int, device) -> float:
    """Time of one dense call, from a block of `rows` query rows scaled by N / rows unless `full` or the kernel
    keeps its matrix."""
    points = kernel.points
    flat = channels.reshape(-1, channels.shape[-1]) * kernel.weights[:, None]
    n = points.shape[0]
    if kernel.keeps_matrix:
        return timed(lambda: kernel(channels), repeats, device)
    if full or rows >= n:
        return timed(lambda: kernel(channels), max(1, repeats // 3), device)
    block = points[:rows]
    return timed(lambda: dense_exp_kernel(block, points, flat, kernel.C, kernel.beta, kernel.chunk), repeats,
                 device) * n / rows


def slope(lmax, times) -> float:
    return float(np.polyfit(np.log(lmax), np.log(times), 1)[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lmax", type=int, nargs="+", default=[16, 24, 32, 48, 64, 96, 128])
    parser.add_argument("--beta", type=float, default=30.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--full-dense", action="store_true")
    parser.add_argument("--fit-from", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    where = placement(args.device, "float64")
    columns = ["dense", "sign flips", "rotation", "general", "general (torch NUFFT)", "general (kept matrix)"]
    times = {name: [] for name in columns}
    print(f"beta = {args.beta:g}, float64, {args.device}, {torch.get_num_threads()} thread; "
          "seconds per call (thread CPU time on the CPU) "
          "(ratio dense / spectral)")
    print(f"{'lmax':>5} {'N':>7} " + " ".join(f"{name:>24}" for name in columns) + "  auto (flips/rot/gen)")
    for lmax in args.lmax:
        basis = SphereBasis(lmax, where)
        x = basis.points
        rho = torch.exp(2 * x[..., 0] + x[..., 2]) + 0.5 * torch.exp(-2 * x[..., 1])
        channels = torch.cat([rho[..., None], rho[..., None] * x], dim=-1)
        dense = DenseExpKernel(basis, where.tensor(MATRICES["general"]), args.beta, matrix_bytes=DENSE_MATRIX_BYTES)
        times["dense"].append(dense_time(dense, channels, args.rows, args.full_dense, args.repeats, where.device))
        kept = MatrixMode.matrix_bytes(basis, DegreeRaisedTransform(basis)) <= SPECTRAL_MATRIX_BYTES
        for name in columns[1:]:
            matrix = MATRICES["general" if name.startswith("general") else name]
            evaluator = "torch" if "torch" in name else "auto"
            if name == "general (kept matrix)" and not kept:
                times[name].append(float("nan"))
                continue
            kernel = SpectralExpKernel(basis, where.tensor(matrix), args.beta, 1e-10, evaluator=evaluator,
                                       matrix_bytes=None if name == "general (kept matrix)" else 0)
            times[name].append(timed(lambda: kernel(channels), args.repeats, where.device))
        cells = [f"{times['dense'][-1]:>24.3e}"]
        cells += [f"{'-':>24}" if np.isnan(times[name][-1]) else
                  f"{times[name][-1]:>14.3e} ({times['dense'][-1] / times[name][-1]:>6.1f}x)" for name in columns[1:]]
        picks = []
        for name in columns[1:4]:
            pick = make_exp_kernel(basis, where.tensor(MATRICES[name]), args.beta, "auto", 1e-10).name
            spectral = times["general (kept matrix)" if name == "general" and kept else name][-1]
            faster = "spectral" if spectral < times["dense"][-1] else "dense"
            picks.append(pick if pick == faster else pick.upper())
        print(f"{lmax:>5} {basis.grid_size:>7} " + " ".join(cells) + "  " + "/".join(picks), flush=True)
    fitted = [lmax >= args.fit_from for lmax in args.lmax]
    if sum(fitted) >= 2:
        lmax = np.array(args.lmax)[fitted]
        print(f"fitted exponent of lmax (lmax >= {args.fit_from}): " + ", ".join(
            f"{name} {slope(lmax, np.array(times[name])[fitted]):.2f}" for name in columns
            if not np.isnan(np.array(times[name])[fitted]).any()))


if __name__ == "__main__":
    main()
