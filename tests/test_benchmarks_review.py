"""The benchmarks' arithmetic counted by brute force, and the threads their thread-CPU clock assumes."""

import torch
from test_benchmarks import ensembles, floors, s1_case
from threadpoolctl import threadpool_info, threadpool_limits
from torch.utils.flop_counter import FlopCounterMode

from solvers.forward_problem import ForwardProblem
from solvers.particle_training import ParticleControl
from spherepde.model.transport import Transport


def counted_flops(function) -> int:
    """FLOPs of the matrix products of function(), as torch's FlopCounterMode counts them (2 per multiply-add)."""
    with FlopCounterMode(display=False) as counter:
        function()
    return counter.get_total_flops()


def test_s1_products_are_the_paths_own_products():
    """s1_products, the floor's multiply-adds of one rate evaluation, against the products the solver's fourier path
    (M = 1 and 20) and matrix path take on seed 004 at lmax 64, counted: 2 x 29 x (66 + 200) and 2 x 3 x 200 x 130
    FLOPs a member."""
    for members in (1, 20):
        folded = ForwardProblem([s1_case(64)] * members).transport._folded
        state, drive = torch.randn(members, 130, dtype=torch.float64), torch.randn(members, 200, dtype=torch.float64)
        multiply_adds, _ = ensembles.s1_products("fourier", 200, 130, folded.rank, folded.low)
        assert counted_flops(lambda: folded.rate(state, drive)) == 2 * members * multiply_adds == members * 15_428
    problem = ForwardProblem([s1_case(64)])
    matrix = Transport(problem.basis, problem.batch, problem.kernels, 2 ** 40, path="matrix")._folded
    drive = matrix.drive(torch.zeros(1, 1, 200, dtype=torch.float64))
    assert counted_flops(lambda: matrix.rate_token(torch.randn(1, 130, dtype=torch.float64), drive)) == (
        2 * ensembles.s1_products("matrix", 200, 130)[0])


def test_particle_floor_flops_are_the_evaluations_products():
    """particle_floor's FLOPs (72 n^2 at d = 2: the products with the (n, n) kernel) against a noisy Heun step of the
    seed-scale bow training (N = 64) and its transpose run as torch tensors and counted: 312,064, of which the
    products with the kernel are 294,912 and the rest the O(d^2 n) products the floor leaves out (17,152)."""
    n, dim = 64, 2
    case = ensembles.load(ensembles.BOW, ["solver.method='particles'", f"particles.n={n}", "time.t_end=0.1"])
    control = ParticleControl([case])
    x0, _ = control.samples()
    program = control.system.integrator.direct_step(x0)
    generator = torch.Generator().manual_seed(0)
    X = program.rows(torch, x0)
    layer = program.per_system(torch, 0.1 * torch.randn(1, dim, dim, generator=generator, dtype=torch.float64))
    G, outbar = (torch.randn(X.shape, generator=generator, dtype=torch.float64) for _ in range(2))
    counted = counted_flops(lambda: (program.advance(torch, X, layer, 0.01, 1, 10, iter([G])),
                                     program.retreat(torch, X, layer, 0.01, 1, 10, iter([G]), outbar)))
    flops = floors.particle_flops(n, dim)
    assert flops == 72 * n * n
    assert 0 <= counted - flops <= 70 * dim * dim * n


def test_use_threads_bounds_numpys_blas_too():
    """clock reads the calling thread's CPU time: numpy's OpenBLAS threads (2 here, torch.set_num_threads does not
    reach them) took half of a 1024^2 GEMM off it (30-32 GFLOP/s against 16-18 on 2 cores).  use_threads(1) leaves
    one thread in every BLAS pool and in torch."""
    before = torch.get_num_threads()
    try:
        with threadpool_limits(limits=2, user_api="blas"):
            floors.use_threads(1)
            assert {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"} == {1}
            assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
