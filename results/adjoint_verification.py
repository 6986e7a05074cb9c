"""Figures of the training gradient (issue 4, criterion 1), printed as a markdown report.

    OMP_NUM_THREADS=1 python3 results/adjoint_verification.py > results/adjoint_verification.md

Measured here by the public pieces (solvers/adjoint.py), float64 on the CPU, a few minutes on one core.
Table 1: both gradients against central finite differences of the discretised J.
Table 2: the continuous adjoint against the discrete (autograd) gradient as dt -> 0, with observed orders.
"""

import math
import time

import torch

from solvers.adjoint import continuous_gradient, discrete_gradient
from solvers.controlled_forward import ControlledForward, central_differences
from spherepde.io.case import case_from_dict
from spherepde.model.initial import initial_density


def make_case(kernel="unnormalized", dim=2, lmax=12, t_end=0.5, dt=0.05, scheme="auto", beta=1.0, loss="align",
              layers=2):
    diagonal = [1.0, 0.65, 0.4][:dim]
    A = [[diagonal[i] * (i == j) for j in range(dim)] for i in range(dim)]
    control = {"loss": loss, "layers": layers, "lambda_reg": 0.1}
    if loss == "bow":
        control |= {"K": 4, "kappa_cand": 2.0, "tau": 2.0}
    return case_from_dict({"sphere": {"dim": dim, "lmax": lmax},
                           "model": {"kernel": kernel, "beta": beta, "B": A, "V": A, "eps": 0.05},
                           "initial": {"kind": "vmf", "mean": [1.0, 0.2, 0.1][:dim], "kappa": 2.0},
                           "time": {"t_end": t_end, "dt": dt, "scheme": scheme},
                           "solver": {"device": "cpu"}, "control": control})


def setup(case):
    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    generator = torch.Generator().manual_seed(1)
    controls = 0.3 * torch.randn(case["control"]["layers"], case.dim, case.dim, generator=generator,
                                 dtype=torch.float64)
    return forward, c0, controls


def relative(a, b):
    return float((a - b).norm() / b.norm())


def finite_difference_table():
    print("## 1. Gradient vs central finite differences of the discrete J (h = 1e-5, float64)\n")
    print("Small cases: A = diag(1, 0.65[, 0.4]) as B = V, beta = 1, eps = 0.05, vMF(kappa 2) start, T = 0.5, "
          "2 layers, lambda_reg = 0.1, W random (seed 1, scale 0.3); scheme imex-ark436.\n")
    print("| case | steps | discrete vs FD | continuous vs FD | discrete s | continuous s |")
    print("|---|---|---|---|---|---|")
    rows = [("S^1 unnormalized, align", {}),
            ("S^1 softmax, align", {"kernel": "softmax"}),
            ("S^1 softmax beta = inf, align", {"kernel": "softmax", "beta": "inf"}),
            ("S^1 unnormalized, bow (K 4, tau 2)", {"loss": "bow"}),
            ("S^1 softmax, align, dt = 0.0125", {"kernel": "softmax", "dt": 0.0125}),
            ("S^2 softmax lmax 6, align, T = 0.2, dt = 0.1", {"kernel": "softmax", "dim": 3, "lmax": 6,
                                                             "t_end": 0.2, "dt": 0.1, "layers": 1}),
            ("S^2 unnormalized lmax 6, align, T = 0.2, dt = 0.1", {"dim": 3, "lmax": 6, "t_end": 0.2, "dt": 0.1,
                                                                 "layers": 1})]
    for label, options in rows:
        forward, c0, controls = setup(make_case(**options))
        fd = central_differences(forward, c0, controls)
        started = time.perf_counter()
        discrete = discrete_gradient(forward, c0, controls).dW
        middle = time.perf_counter()
        continuous = continuous_gradient(forward, c0, controls).dW
        ended = time.perf_counter()
        print(f"| {label} | {forward.steps} | {relative(discrete, fd):.1e} | {relative(continuous, fd):.1e} | "
              f"{middle - started:.2f} | {ended - middle:.2f} |", flush=True)
    print("\nThe discrete gradient is the exact derivative of the discretised J: its distance to the finite "
          "differences is their own O(h^2) + round-off / h error. The continuous adjoint carries the "
          "scheme's truncation error, which Table 2 resolves.\n")


def convergence_table():
    print("## 2. Continuous adjoint vs the discrete (autograd) gradient as dt -> 0\n")
    print("S^1, lmax 16, T = 2, 2 layers, otherwise as Table 1; relative difference |g_cont - g_disc| / |g_disc| "
          "and the observed order log2(e(2 dt) / e(dt)).\n")
    for kernel, scheme, order in (("unnormalized", "imex-ark436", 4), ("softmax", "imex-ark436", 4),
                                  ("softmax", "imex-ars443", 3)):
        print(f"**{kernel}, {scheme} (order {order})**\n")
        print("| dt | steps | relative difference | observed order |")
        print("|---|---|---|---|")
        previous = None
        for dt in (0.2, 0.1, 0.05, 0.025):
            forward, c0, controls = setup(make_case(kernel, lmax=16, t_end=2.0, dt=dt, scheme=scheme))
            error = relative(continuous_gradient(forward, c0, controls).dW, discrete_gradient(forward, c0, controls).dW)
            rate = "" if previous is None else f"{math.log2(previous / error):.2f}"
            print(f"| {dt} | {forward.steps} | {error:.2e} | {rate} |", flush=True)
            previous = error
        print()


def memory_note():
    forward, _, _ = setup(make_case(lmax=64, t_end=80.0, dt=0.05, layers=16))
    coefficient_bytes = 16 * (forward.problem.basis.lmax + 1)
    stored = forward.steps // forward.checkpoint_every + forward.checkpoint_every + 1
    print("## 3. Forward states for the adjoint\n")
    print(f"Recomputation from checkpoints every K = ceil(sqrt(steps)) steps. Example: S^1, lmax 64, T = 80, "
          f"dt = 0.05: {forward.steps} steps, K = {forward.checkpoint_every}, at most {stored} coefficient arrays "
          f"of {coefficient_bytes} B = {stored * coefficient_bytes / 1024:.1f} KiB (storing every step: "
          f"{forward.steps * coefficient_bytes / 1024:.1f} KiB); cost: one extra forward run per gradient. "
          "On S^2 an array is 16 (lmax + 1)^2 B (lmax 64: 68 KiB).\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("# Adjoint and training gradient: verification (issue 4)\n")
    print("Regenerate: `OMP_NUM_THREADS=1 python3 results/adjoint_verification.py > results/adjoint_verification.md`\n")
    finite_difference_table()
    convergence_table()
    memory_note()
