"""The physical yardsticks of benchmarks/ensembles.py: a plain numpy step of the S^1 case, one core's throughput
(matrix products, FFTs, exp) and the arithmetic of a particle step; `clock`, the thread-CPU timer they share, and
`use_threads`, which the benchmarks that read it set first."""

import math
import statistics
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from spherepde.base.arrays import irfft, rfft


def use_threads(count: int) -> None:
    """`count` threads for torch and for numpy's BLAS, for the rest of the process (as a run's
    spherepde.base.threads.threads_for).  torch.set_num_threads alone leaves numpy's OpenBLAS its own threads, whose
    share of a product `clock` (the calling thread's CPU time) does not see: on a 2-core machine without
    OMP_NUM_THREADS=1, particle_floor's 1024^2 numpy GEMM read 30-32 GFLOP/s of one thread's CPU time against
    16-18 on one thread."""
    torch.set_num_threads(count)
    threadpool_limits(limits=count, user_api="blas")


def clock(function, repeats: int) -> float:
    """Median thread CPU time of function() over `repeats` calls, seconds."""
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        function()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def numpy_step(case):
    """A plain numpy IMEX step of the S^1 case (same grid, stages and dense kernel as the solver's): returns
    (step(c) -> c, c0).  The grid is the solver's basis grid for the case's lmax (200 points at lmax 64)."""
    from spherepde.base.device import placement
    from spherepde.discretisation.bases import make_basis
    from spherepde.discretisation.timesteppers import SCHEMES

    _, tableau = SCHEMES["imex-ark436"]
    lmax, eps, dt = case["sphere"]["lmax"], case["model"]["eps"], case["time"]["dt"]
    n = make_basis(2, lmax, placement("cpu", "float64")).grid_size
    theta = 2 * np.pi * np.arange(n) / n
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    t = np.stack([-np.sin(theta), np.cos(theta)], 1)
    A, V = np.array(case["model"]["B"]), np.array(case["model"]["V"])
    w = 2 * np.pi / n
    G = np.exp(x @ A @ x.T) * w * ((t @ V) @ x.T)  # <t(x_i), V y_j> exp(<x_i, A y_j>) w: v = G rho
    k = np.arange(lmax + 1)
    lam = -eps * k ** 2
    scale = math.sqrt(2 * math.pi) / n
    derivative = -1j * k * scale  # the rate -d(rho v)/dtheta
    a = [[float(v) for v in row] for row in tableau.a]
    ai = [[float(v) for v in row] for row in tableau.a_implicit]
    b, bi = [float(v) for v in tableau.b], [float(v) for v in tableau.b_implicit]
    stages = tableau.stages

    def transport(c):
        rho = np.fft.irfft(c, n) / scale
        return np.fft.rfft(rho * (G @ rho))[: lmax + 1] * derivative

    def step(c):
        explicit, implicit = [], []
        for i in range(stages):
            rhs = c.copy()
            for j in range(i):
                rhs += (dt * a[i][j]) * explicit[j] + (dt * ai[i][j]) * implicit[j]
            stage = rhs / (1 - dt * ai[i][i] * lam) if ai[i][i] else rhs
            implicit.append(lam * stage)
            explicit.append(transport(stage))
        out = c.copy()
        for i in range(stages):
            out += (dt * b[i]) * explicit[i] + (dt * bi[i]) * implicit[i]
        return out

    rho0 = np.exp(np.cos(theta - 0.46))  # a vMF-like start; the cost does not depend on it
    return step, np.fft.rfft(rho0 / (rho0.sum() * w))[: lmax + 1] * scale


def lean_fourier_step(library: str, members: int, rank: int = 30, lmax: int = 64, points: int = 200):
    """The fourier path's six-stage IMEX step (spherepde/model/fourier_path.py) as the fewest operations of
    `library` ("torch" or "numpy"; the FFTs spherepde/base/arrays.py takes: ducc0's for numpy) on `members` rows, its
    buffers made once: per stage the combination of the rows (one product), the diagonal solve written into a
    zero-padded half spectrum, the synthesis (irfft), the rank-r velocity (two products and the drive), the flux,
    its rfft and derivative written into the rows, and the implicit row: ten operations.  Random data of the
    seed-004 shapes: a yardstick of the cost per operation, not a solver.  Returns the seconds of one step."""
    step = _lean_fourier(library, members, rank, lmax, points)[0]
    step()
    return clock(lambda: [step() for _ in range(200)], 3) / 200


def lean_fourier_evaluation(members: int, rank: int = 30, lmax: int = 64, points: int = 200):
    """`lean_fourier_step`'s numpy step keeping its stages' rows (r, y), then its transpose as the fewest
    operations (the transpose of fourier_path.py's module docstring): per stage, from the rows' cotangents, the
    rate's inverse FFT, the two products with the kept rows, the rfft, the rank-r transpose (two products), the
    implicit row's term, and the combination's transpose (one rank-one update): thirteen operations.  The seconds
    of one step and its transpose, what an evaluation of J and dJ/dW costs a step beyond the loss."""
    step, transpose = _lean_fourier("numpy", members, rank, lmax, points)

    def evaluation():
        transpose(step(keep=True))

    evaluation()
    return clock(lambda: [evaluation() for _ in range(200)], 3) / 200


def _lean_fourier(library: str, members: int, rank: int, lmax: int, points: int):
    """(step(keep=False) -> the kept rows, transpose(kept)) of `lean_fourier_step` and `lean_fourier_evaluation`;
    transpose for numpy only."""
    modes, size, half = lmax + 1, 2 * (lmax + 1), points // 2 + 1
    rng = np.random.default_rng(0)

    def array(shape):
        return 0.01 * rng.standard_normal(shape)

    R, U, drive, solve, dt_lam, c = (array(shape) for shape in ((size, rank), (rank, points), (members, points),
                                                                 (members, size), (members, size), (members, size)))
    coefficients = [array((1, 2 * i + 1)) for i in range(7)]
    derivative = -1j * np.arange(modes) / points
    adjoint_derivative, multiplicity = np.conj(derivative) / np.where(np.arange(modes) > 0, 2, 1), np.full(modes, 2.0)
    multiplicity[0] = 1
    rows, spectrum = np.zeros((13, members, size)), np.zeros((members, half), complex)
    rows_bar = np.zeros_like(rows)
    R_t, U_t = R.T.copy(), U.T.copy()
    if library == "torch":
        R, U, drive, solve, dt_lam, c, rows, spectrum, derivative = (
            torch.from_numpy(a) for a in (R, U, drive, solve, dt_lam, c, rows, spectrum, derivative))
        coefficients = [torch.from_numpy(a) for a in coefficients]
        matmul, multiply = torch.mm, torch.mul
        complex_view, real_view = (lambda a: torch.view_as_complex(a.view(members, -1, 2))), torch.view_as_real(
            spectrum).view(members, 2 * half)
    else:
        matmul, multiply = np.dot, np.multiply
        complex_view, real_view = (lambda a: a.view(complex)), spectrum.view(float)
    flat, head, flat_bar = rows.reshape(13, -1), real_view[:, :size], rows_bar.reshape(13, -1)

    def step(keep=False):
        kept = []
        rows[0] = c
        head[...] = c
        for i in range(6):
            if i:
                multiply(matmul(coefficients[i], flat[:2 * i + 1]).reshape(members, size), solve, out=head)
            r = irfft(spectrum, points)
            y = matmul(matmul(head, R), U) + drive
            multiply(rfft(r * y)[:, :modes], derivative, out=complex_view(rows[2 * i + 1]))
            multiply(head, dt_lam, out=rows[2 * i + 2])
            if keep:
                kept.append((r, y))
        out = matmul(coefficients[6], flat)
        return kept if keep else out

    def transpose(kept):
        np.dot(coefficients[6].T, c.reshape(1, -1), out=flat_bar)  # the cotangent of the step's result: c
        drive_bar = np.zeros_like(drive)
        for i in reversed(range(6)):
            r, y = kept[i]
            spectrum[:, :modes] = complex_view(rows_bar[2 * i + 1]) * adjoint_derivative
            f_bar = irfft(spectrum, points)
            y_bar, r_bar = r * f_bar, y * f_bar
            drive_bar += y_bar
            head_bar = (rfft(r_bar)[:, :modes] * multiplicity).view(float)
            head_bar += np.dot(np.dot(y_bar, U_t), R_t)
            head_bar += rows_bar[2 * i + 2] * dt_lam
            if i:
                flat_bar[:2 * i + 1] += np.dot(coefficients[i].T, (head_bar * solve).reshape(1, -1))
            else:
                rows_bar[0] += head_bar
        return rows_bar[0], drive_bar

    return step, transpose


def exp_rate(values: np.ndarray, calls: int) -> float:
    """Seconds per element of one core's float64 exp over `values` (written into a buffer made once; `calls` calls
    a sample, the median of 3 samples, on the calling thread: torch's threads set to 1 by the caller): the faster of
    numpy's and torch's.  Which is faster depends on the core (numpy's exp is vectorised with AVX-512 only, a scalar
    loop without it, 1.6-2.4x torch's there), and a floor takes the faster."""
    out = np.empty_like(values)
    tensor, tensor_out = torch.from_numpy(values), torch.from_numpy(out)
    numpy_seconds = clock(lambda: [np.exp(values, out=out) for _ in range(calls)], 3)
    torch_seconds = clock(lambda: [torch.exp(tensor, out=tensor_out) for _ in range(calls)], 3)
    return min(numpy_seconds, torch_seconds) / (calls * values.size)


def particle_flops(n: int = 64, dim: int = 2) -> int:
    """FLOPs of the products with the (n, n) kernel in one noisy Heun step of the particle evaluation per member
    (solvers/particle_step.py: two stages forward, the two formed again and transposed): the logits 2 d n^2 per
    stage, the sums 2 d n^2, the kept stage's d^2 more rows and the transpose's d + d^2 rows, 2 n^2 a row; the
    O(d^2 n) rest left out."""
    rows = dim + dim * dim
    return 2 * (2 * dim + 2 * dim) * n * n + 2 * (2 * dim + 2 * rows) * n * n + 2 * (2 * rows) * n * n


def particle_floor(members: int = 20, n: int = 64, dim: int = 2) -> dict:
    """The arithmetic of one noisy Heun step of the particle evaluation per member, and one core's throughput for
    it: exps 4 n^2 (the two stages' kernels, formed again by the transpose), FLOPs `particle_flops`.  Throughput:
    the core's exp on the (20, 64, 64) kernel (`exp_rate`: the faster of numpy's and torch's) and a 1024 x 1024
    matmul (the core's dgemm peak, which the small batched products do not reach)."""
    rows = dim + dim * dim
    flops = particle_flops(n, dim)
    kernel = np.random.default_rng(0).uniform(-1, 1, (members, n, n))
    exp_seconds = exp_rate(kernel, 20)
    square = np.random.default_rng(1).standard_normal((1024, 1024))
    peak = 2 * 1024 ** 3 / clock(lambda: square @ square, 3)
    products = np.random.default_rng(2).standard_normal((members, rows, n))
    batched = 2 * members * rows * n * n / clock(lambda: [products @ kernel for _ in range(20)], 3) * 20
    return {"exps": 4 * n * n, "flops": flops, "exp_seconds": exp_seconds, "peak": peak, "batched": batched,
            "floor": 4 * n * n * exp_seconds + flops / peak}


def arithmetic_floor(repeats: int) -> dict:
    """One core's throughput: flops per second of a large float64 matrix product (the BLAS's best) and of a
    batch of real FFTs of the S^1 grid's 200 points (counted as 2.5 n log2 n flops each)."""
    a = torch.randn(512, 512, dtype=torch.float64)
    gemm = 2 * 512 ** 3 / clock(lambda: a @ a, repeats + 2)
    rows = torch.randn(2000, 200, dtype=torch.float64)
    fft = 2000 * 2.5 * 200 * math.log2(200) / clock(lambda: torch.fft.rfft(rows), repeats + 2)
    return {"gemm": gemm, "fft": fft}
