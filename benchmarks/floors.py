"""The physical yardsticks of benchmarks/ensembles.py: a plain numpy step of the S^1 case, one core's throughput
(matrix products, FFTs, exp) and the arithmetic of a particle step; `clock`, the thread-CPU timer they share."""

import math
import statistics
import time

import numpy as np
import torch


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
    (step(c) -> c, c0)."""
    from spherepde.discretisation.timesteppers import SCHEMES

    _, tableau = SCHEMES["imex-ark436"]
    lmax, eps, dt = case["sphere"]["lmax"], case["model"]["eps"], case["time"]["dt"]
    n = 200
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


def particle_floor(members: int = 20, n: int = 64, dim: int = 2) -> dict:
    """The arithmetic of one noisy Heun step of the particle evaluation per member (solvers/particle_step.py: two
    stages forward, the two formed again and transposed), and one core's throughput for it: exps 4 n^2; FLOPs of
    the products (the logits 2 d n^2 per stage, the sums 2 d n^2, the kept stage's d^2 more rows and the transpose's
    d + d^2 rows, 2 n^2 a row), the O(d^2 n) rest left out.  Throughput: numpy's exp on the (20, 64, 64) kernel and
    a 1024 x 1024 matmul (the core's dgemm peak, which the small batched products do not reach)."""
    rows = dim + dim * dim
    flops = 2 * (2 * dim + 2 * dim) * n * n + 2 * (2 * dim + 2 * rows) * n * n + 2 * (2 * rows) * n * n
    kernel = np.random.default_rng(0).uniform(-1, 1, (members, n, n))
    out = np.empty_like(kernel)
    exp_seconds = clock(lambda: [np.exp(kernel, out=out) for _ in range(20)], 3) / (20 * kernel.size)
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
