"""Figures of the training gradient (issue 4, criterion 1): results/adjoint_verification.md.

    OMP_NUM_THREADS=1 python3 results/adjoint_verification.py                 # measure what has no summary, report
    OMP_NUM_THREADS=1 python3 results/adjoint_verification.py --report-only   # the report from the summaries alone

Measured here by the public pieces (solvers/adjoint.py), float64 on the CPU, a few minutes on one core.
Table 1: both gradients against central finite differences of the discretised J.
Table 2: the continuous adjoint against the discrete (autograd) gradient as dt -> 0, with observed orders.
Each table's raw numbers (and section 3's) are one summary of the results harness (results/harness.py),
results/adjoint_verification/runs/<key>-<digest>.json, the digest that of what it measures (`parameters`), so the
report is written from the summaries alone; the seconds columns of Table 1 are wall seconds of that measurement.
"""

import math
import time

import harness

STUDY = harness.Study("adjoint_verification")
REPORT = harness.REPORTS / "adjoint_verification.md"
REGENERATE = ("Regenerate: `OMP_NUM_THREADS=1 python3 results/adjoint_verification.py` (measures what has no summary "
              "in results/adjoint_verification/runs/, then writes this report; `--report-only` writes it from the "
              "summaries alone)")

# Table 1: (label, make_case options).
FD_ROWS = [("S^1 unnormalized, align", {}),
           ("S^1 softmax, align", {"kernel": "softmax"}),
           ("S^1 softmax beta = inf, align", {"kernel": "softmax", "beta": "inf"}),
           ("S^1 unnormalized, bow (K 4, tau 2)", {"loss": "bow"}),
           ("S^1 softmax, align, dt = 0.0125", {"kernel": "softmax", "dt": 0.0125}),
           ("S^2 softmax lmax 6, align, T = 0.2, dt = 0.1", {"kernel": "softmax", "dim": 3, "lmax": 6,
                                                            "t_end": 0.2, "dt": 0.1, "layers": 1}),
           ("S^2 unnormalized lmax 6, align, T = 0.2, dt = 0.1", {"dim": 3, "lmax": 6, "t_end": 0.2, "dt": 0.1,
                                                                "layers": 1})]
# Table 2: (kernel, scheme, order) at each dt, S^1, lmax 16, T = 2.
CONVERGENCE = [("unnormalized", "imex-ark436", 4), ("softmax", "imex-ark436", 4), ("softmax", "imex-ars443", 3)]
CONVERGENCE_DTS = [0.2, 0.1, 0.05, 0.025]
CONVERGENCE_OPTIONS = {"lmax": 16, "t_end": 2.0}
# Section 3: the forward's checkpoints of one long case.
MEMORY_OPTIONS = {"lmax": 64, "t_end": 80.0, "dt": 0.05, "layers": 16}
# Every case saves at t_end only: a training steps on the union of save times and layer boundaries, so the
# default save_every = t_end / 20 would step finer than dt and every table would be at another step.
SAVES = "saves at t_end only"

SPECS = [
    harness.Spec("finite_differences", parameters="relative distance of the discrete and continuous gradients to "
                                                  "central differences (h = 1e-5), seconds of each gradient, "
                                                  f"{SAVES}: {FD_ROWS!r}"),
    harness.Spec("convergence", parameters="relative distance of the continuous to the discrete gradient: "
                                           f"{CONVERGENCE!r} at dt {CONVERGENCE_DTS}, "
                                           f"{CONVERGENCE_OPTIONS!r}, {SAVES}"),
    harness.Spec("memory", parameters=f"what the tape of a discrete gradient keeps: {MEMORY_OPTIONS!r}, {SAVES}"),
]


def make_case(kernel="unnormalized", dim=2, lmax=12, t_end=0.5, dt=0.05, scheme="auto", beta=1.0, loss="align",
              layers=2):
    from spherepde.io.case import case_from_dict

    diagonal = [1.0, 0.65, 0.4][:dim]
    A = [[diagonal[i] * (i == j) for j in range(dim)] for i in range(dim)]
    control = {"loss": loss, "layers": layers, "lambda_reg": 0.1}
    if loss == "bow":
        control |= {"K": 4, "kappa_cand": 2.0, "tau": 2.0}
    return case_from_dict({"sphere": {"dim": dim, "lmax": lmax},
                           "model": {"kernel": kernel, "beta": beta, "B": A, "V": A, "eps": 0.05},
                           "initial": {"kind": "vmf", "mean": [1.0, 0.2, 0.1][:dim], "kappa": 2.0},
                           "time": {"t_end": t_end, "dt": dt, "scheme": scheme, "save_every": t_end},
                           "solver": {"device": "cpu"}, "control": control})


def setup(case):
    import torch

    from solvers.controlled_forward import ControlledForward
    from spherepde.model.initial import initial_density

    forward = ControlledForward(case)
    c0 = initial_density(case["initial"], forward.problem.basis)
    generator = torch.Generator().manual_seed(1)
    controls = 0.3 * torch.randn(case["control"]["layers"], case.dim, case.dim, generator=generator,
                                 dtype=torch.float64)
    return forward, c0, controls


def relative(a, b):
    return float((a - b).norm() / b.norm())


def finite_differences() -> dict:
    from solvers.adjoint import continuous_gradient, discrete_gradient
    from solvers.controlled_forward import central_differences

    rows = []
    for label, options in FD_ROWS:
        forward, c0, controls = setup(make_case(**options))
        fd = central_differences(forward, c0, controls)
        started = time.perf_counter()
        discrete = discrete_gradient(forward, c0, controls).dW
        middle = time.perf_counter()
        continuous = continuous_gradient(forward, c0, controls).dW
        ended = time.perf_counter()
        rows.append({"case": label, "steps": forward.steps, "discrete_vs_fd": relative(discrete, fd),
                     "continuous_vs_fd": relative(continuous, fd), "discrete_seconds": middle - started,
                     "continuous_seconds": ended - middle})
    return {"rows": rows}


def convergence() -> dict:
    from solvers.adjoint import continuous_gradient, discrete_gradient

    groups = []
    for kernel, scheme, order in CONVERGENCE:
        rows = []
        for dt in CONVERGENCE_DTS:
            forward, c0, controls = setup(make_case(kernel, dt=dt, scheme=scheme, **CONVERGENCE_OPTIONS))
            error = relative(continuous_gradient(forward, c0, controls).dW, discrete_gradient(forward, c0, controls).dW)
            rows.append({"dt": dt, "steps": forward.steps, "relative_difference": error})
        groups.append({"kernel": kernel, "scheme": scheme, "order": order, "rows": rows})
    return {"groups": groups}


def memory() -> dict:
    """What the tape of one member's discrete gradient keeps by default (control.checkpoint_every = 0), in
    bytes, and the checkpoint interval it falls back on when that exceeds controlled_forward.TAPE_BYTES."""
    from solvers.controlled_forward import TAPE_BYTES, Tape, _batched

    forward, c0, controls = setup(make_case(**MEMORY_OPTIONS))
    states, _, _ = _batched(forward, c0, controls)
    tape = Tape(forward, states, 0)
    return {"lmax": forward.problem.basis.lmax, "steps": forward.steps, "every": tape.every,
            "token_steps": tape.token_steps, "state_bytes": states.numel() * states.element_size(),
            "tape_bytes": TAPE_BYTES, "checkpoint_every": math.ceil(math.sqrt(forward.steps))}


MEASURE = {"finite_differences": finite_differences, "convergence": convergence, "memory": memory}


def measure(spec: harness.Spec) -> dict:
    import torch

    torch.set_num_threads(1)
    return {"parameters": spec.parameters} | MEASURE[spec.key]()


def report(summaries: dict) -> str:
    """The report from the summaries alone (key -> summary)."""
    lines = ["# Adjoint and training gradient: verification (issue 4)", "", REGENERATE, "",
             "## 1. Gradient vs central finite differences of the discrete J (h = 1e-5, float64)", "",
             "Small cases: A = diag(1, 0.65[, 0.4]) as B = V, beta = 1, eps = 0.05, vMF(kappa 2) start, T = 0.5, "
             "2 layers (the S^2 rows: 1 layer, T and dt of their label), S^1 at lmax 12, lambda_reg = 0.1, W random "
             "(seed 1, scale 0.3); scheme imex-ark436. Each entry is |g - g_FD| / |g_FD| (Frobenius norms over all "
             "layers' W).", ""]
    lines += harness.table(["case", "steps", "discrete vs FD", "continuous vs FD", "discrete s", "continuous s"],
                           [[row["case"], row["steps"], f"{row['discrete_vs_fd']:.1e}",
                             f"{row['continuous_vs_fd']:.1e}", f"{row['discrete_seconds']:.2f}",
                             f"{row['continuous_seconds']:.2f}"]
                            for row in summaries["finite_differences"]["rows"]])
    lines += ["", "The discrete gradient is the exact derivative of the discretised J: its distance to the finite "
              "differences is their own O(h^2) + round-off / h error. The continuous adjoint carries the "
              "scheme's truncation error, which Table 2 resolves.", "",
              "## 2. Continuous adjoint vs the discrete (autograd) gradient as dt -> 0", "",
              "S^1, lmax 16, T = 2, 2 layers, otherwise as Table 1; relative difference |g_cont - g_disc| / |g_disc| "
              "and the observed order log2(e(2 dt) / e(dt)).", ""]
    for group in summaries["convergence"]["groups"]:
        rows, previous = [], None
        for row in group["rows"]:
            error = row["relative_difference"]
            rows.append([row["dt"], row["steps"], f"{error:.2e}",
                         "" if previous is None else f"{math.log2(previous / error):.2f}"])
            previous = error
        lines += [f"**{group['kernel']}, {group['scheme']} (order {group['order']})**", ""]
        lines += harness.table(["dt", "steps", "relative difference", "observed order"], rows) + [""]
    s = summaries["memory"]
    stored = s["steps"] // s["checkpoint_every"] + s["checkpoint_every"] + 1
    kept = "every step's state" if s["every"] == 1 else f"the state every {s['every']} steps"
    lines += ["## 3. Forward states for the adjoint", "",
              f"The tape keeps every step's state (and the stages' tokens of as many steps as fit) within "
              f"{s['tape_bytes'] / 2 ** 20:.0f} MiB, else the state every K = ceil(sqrt(steps)) steps (segments "
              "recomputed: one extra forward run per gradient). Example: S^1, lmax 64, T = 80, dt = 0.05: "
              f"{s['steps']} steps of {s['state_bytes']} B; it keeps {kept} ({s['steps'] * s['state_bytes'] / 1024:.1f}"
              f" KiB) and the tokens of {s['token_steps']} steps. Checkpointed, K = {s['checkpoint_every']}: at most "
              f"{stored} states = {stored * s['state_bytes'] / 1024:.1f} KiB. "
              f"On S^2 a state is 16 (lmax + 1)^2 B (lmax 64: {16 * 65 ** 2 / 1024:.1f} KiB).", ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    summaries = harness.measurement_main(argv, __doc__.splitlines()[0], STUDY, SPECS, measure,
                                         "python3 results/adjoint_verification.py")
    REPORT.write_text(report(summaries))


if __name__ == "__main__":
    main()
