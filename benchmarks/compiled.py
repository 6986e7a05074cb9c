"""Whether torch.compile pays on the CPU for the small steps of benchmarks/ensembles.py.

    OMP_NUM_THREADS=1 python3 benchmarks/compiled.py [--repeats 3]

Two programs, each as eager torch, compiled by torch.compile (Inductor's C++ on the CPU, static shapes, compiled
once before the clock) and as the numpy program the solver runs on the CPU:

1. the fourier path's six-stage IMEX step of seed 004's S^1 case (lmax 64, 200 points, rank 30; the operations of
   floors.lean_fourier_step, written functionally so that Inductor may fuse them), at M = 1 and M = 20 members;
2. one particle field evaluation v = P_x(W x + V m(x)) with the unnormalized kernel (solvers/particle_step.py's
   direct_mean, the program the solver runs): S = 20 systems of p = 64 tokens, d = 2.

Thread CPU time of one call, the median of --repeats batches of calls.  The two programs are random data of the
seeds' shapes: yardsticks, not the solver.  Inductor generates no code for complex operations (it warns): the
derivative's product in 1. runs as in eager torch, the FFTs and the matrix products are library calls either way.
Measured (torch 2.13, one core of a shared 2-core machine): 1. 0.41 ms compiled against 0.32 eager and 0.085 numpy
at M = 1, 0.69 against 0.60 and 0.25 at M = 20; 2. 313 us against 397 eager and 113 numpy.  So the CPU programs stay
numpy's; on a GPU, where launches are the cost, the same question has another answer (not measured here).
"""

import argparse
import time

import numpy as np
import torch
from floors import clock, lean_fourier_step, use_threads


def per_call(function, repeats: int, calls: int) -> float:
    """Seconds of one call: floors.clock's median over `repeats` of `calls` calls, after a warm-up."""
    for _ in range(max(1, calls // 10)):
        function()
    return clock(lambda: [function() for _ in range(calls)], repeats) / calls


def fourier_step(c, R, U, drive, solve, dt_lam, coefficients, derivative):
    """floors.lean_fourier_step's step as functions of tensors: six stages of combination, solve, irfft, rank-r
    velocity, flux, rfft and derivative, implicit row; then the update."""
    members, size = c.shape
    modes, points = size // 2, U.shape[1]
    rows = [c]
    for i in range(6):
        head = c if i == 0 else (coefficients[i] @ torch.stack(rows).reshape(len(rows), -1)).reshape(c.shape) * solve
        r = torch.fft.irfft(torch.view_as_complex(head.reshape(members, modes, 2)), n=points, norm="forward")
        y = (head @ R) @ U + drive
        flux = torch.fft.rfft(r * y)[:, :modes] * derivative
        rows += [torch.view_as_real(flux).reshape(c.shape), head * dt_lam]
    return (coefficients[6] @ torch.stack(rows).reshape(len(rows), -1)).reshape(c.shape)


def fourier_operands(members: int, rank: int = 30, lmax: int = 64, points: int = 200) -> tuple:
    generator = torch.Generator().manual_seed(0)

    def tensor(*shape):
        return 0.01 * torch.randn(*shape, generator=generator, dtype=torch.float64)

    size = 2 * (lmax + 1)
    return (tensor(members, size), tensor(size, rank), tensor(rank, points), tensor(members, points),
            tensor(members, size), tensor(members, size), [tensor(1, 2 * i + 1) for i in range(7)],
            -1j * torch.arange(lmax + 1, dtype=torch.float64) / points)


def particle_field(X, Ct, W, V):
    """v = P_x(W x + V m) for rows X (S, d, p), m the unnormalized mean of solvers/particle_step.direct_mean (numpy
    or torch)."""
    from solvers.particle_step import direct_mean, inner

    u = W @ X + V @ direct_mean(np if isinstance(X, np.ndarray) else torch, X, Ct, softmax=False, shifted=False)
    return u - inner(u, X) * X


def particle_operands(systems: int = 20, dim: int = 2, tokens: int = 64) -> tuple:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((systems, dim, tokens))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    Ct = np.broadcast_to(np.diag([1.0, 0.65]), (systems, dim, dim)).copy()
    return X, Ct, 0.1 * rng.standard_normal((systems, dim, dim)), Ct.copy()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    use_threads(1)
    print("torch.compile on the CPU (Inductor), one thread, thread CPU time of one call\n")
    compiled = torch.compile(fourier_step, dynamic=False)
    for members in (1, 20):
        operands = fourier_operands(members)
        start = time.time()
        difference = float((compiled(*operands) - fourier_step(*operands)).abs().max())
        compile_seconds = time.time() - start
        eager = per_call(lambda operands=operands: fourier_step(*operands), args.repeats, 200)
        fused = per_call(lambda operands=operands: compiled(*operands), args.repeats, 200)
        numpy_seconds = lean_fourier_step("numpy", members)
        print(f"1. S^1 fourier step, M = {members:2d}: eager torch {1e3 * eager:.3f} ms, compiled {1e3 * fused:.3f} ms "
              f"(compiled in {compile_seconds:.0f} s, equal to {difference:.0e}), numpy {1e3 * numpy_seconds:.3f} ms")
    arrays = particle_operands()
    tensors = tuple(torch.from_numpy(a) for a in arrays)
    compiled = torch.compile(particle_field, dynamic=False)
    difference = float(np.abs(compiled(*tensors).numpy() - particle_field(*arrays)).max())
    eager = per_call(lambda: particle_field(*tensors), args.repeats, 1000)
    fused = per_call(lambda: compiled(*tensors), args.repeats, 1000)
    numpy_seconds = per_call(lambda: particle_field(*arrays), args.repeats, 1000)
    print(f"2. particle field, 20 systems of 64 tokens: eager torch {1e6 * eager:.1f} us, compiled "
          f"{1e6 * fused:.1f} us (equal to {difference:.0e}), numpy {1e6 * numpy_seconds:.1f} us")


if __name__ == "__main__":
    main()
