"""The yardsticks of benchmarks/ensembles.py and benchmarks/floors.py: what they count and compute (no timings)."""

import math
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

import ensembles  # noqa: E402
import floors  # noqa: E402

from solvers.forward_problem import ForwardProblem  # noqa: E402
from solvers.timegrid import Plan, TimeGrid  # noqa: E402


def s1_case(lmax: int):
    return ensembles.load(ensembles.S1_CASE, [o for o in ensembles.S1 if "lmax" not in o] + [f"sphere.lmax={lmax}"])


def test_s1_floor_counts_the_rows_the_fourier_path_reads():
    """Seed 004 at lmax 64 (200 points, 130 real coefficients): the fourier path's R reads 66 of the 130, so a stage
    is r (66 + 200) multiply-adds and two FFTs (counting all 130 overstated the products by a quarter); the matrix
    path 3 x 200 x 130, the grid path's operator 200^2."""
    problem = ForwardProblem([s1_case(64)])
    transport = problem.transport
    assert transport.path == "fourier" and transport._folded.low == 66
    rank = transport._folded.rank
    assert ensembles.s1_products("fourier", 200, 130, rank, 66) == (rank * 266, 2)
    assert ensembles.s1_products("matrix", 200, 130) == (78_000, 0)
    assert ensembles.s1_products("grid", 200, 130) == (40_000, 2)
    # GEMMs at 2 flops a second, FFTs free: the floor is the six stages' multiply-adds
    assert ensembles.s1_floor({"gemm": 2.0, "fft": math.inf}, "fourier", 1) == 6 * rank * 266


def coefficients(state) -> np.ndarray:
    """Member 0's complex coefficients of a real state (a tensor or a numpy array), a copy."""
    return np.array(state[0].numpy() if isinstance(state, torch.Tensor) else state[0]).view(complex)


@pytest.mark.parametrize("lmax", [64, 128])
def test_numpy_step_is_the_solvers_step(lmax):
    """floors.numpy_step, the plain yardstick, is the solver's step (W = 0) to round-off on the solver's own grid
    (at lmax 128, 392 points: with the 200 points of lmax 64 it could not even add the spectra)."""
    case = s1_case(lmax)
    problem = ForwardProblem([case])
    dt = case["time"]["dt"]
    factors = problem.factors(Plan(TimeGrid(dt, dt).intervals[0], np.full(1, 1), np.full(1, dt)))
    state = problem.initial()
    start = coefficients(state)
    with torch.no_grad():
        after = coefficients(problem.step(state, problem.transport.feed_forward(problem.batch.W), factors))
    step, _ = floors.numpy_step(case)
    assert np.abs(step(start.copy()) - after).max() < 1e-13 * np.abs(start).max()
    assert np.abs(after - start).max() > 1e-4  # the step moves the state
