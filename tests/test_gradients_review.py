"""Review of the training gradients (solvers/adjoint.py, solvers/controlled_forward.py): the continuous adjoint's
floating-point range on the seeds' softmax model."""

import math

import torch

from solvers.adjoint import continuous_gradient, discrete_gradient
from solvers.controlled_forward import ControlledForward
from spherepde.cli import main
from spherepde.io.case import case_from_dict

# S^1, softmax, B = V = I so that beta |B|_2 = beta; lmax 256 resolves the kernel up to beta = 100 (the case check)
SOFTMAX_CASE = """
[case]
name = "continuous-range"
[sphere]
dim = 2
lmax = 256
[model]
kernel = "softmax"
beta = {beta}
B = [[1.0, 0.0], [0.0, 1.0]]
V = [[1.0, 0.0], [0.0, 0.65]]
eps = 0.05
[initial]
kind = "vmf"
mean = [1.0, 0.2]
kappa = 2.0
[time]
t_end = 0.1
dt = 0.05
save_every = 0.1
[solver]
device = "cpu"
dtype = "{dtype}"
[control]
layers = 1
iterations = 1
gradient = "continuous"
"""


def softmax_case(beta: float, dtype: str):
    import tomllib

    return case_from_dict(tomllib.loads(SOFTMAX_CASE.format(beta=beta, dtype=dtype)))


def test_continuous_gradient_beyond_the_dtypes_exponent_range_is_refused(tmp_path, capsys):
    """beta |B|_2 = 90 > ln(float32's largest) = 88.72: the continuous adjoint's transposed transform is scaled by
    exp(90) = inf in float32 and dJ/dW was NaN while the forward run and the discrete gradient are finite; the
    training ended at its first evaluation with exit 3 advising a smaller time.dt.  Now bad input: exit 2, one line,
    no output."""
    path = tmp_path / "range.toml"
    path.write_text(SOFTMAX_CASE.format(beta=90.0, dtype="float32"))
    assert main(["run", str(path), "-o", str(tmp_path / "range.nc")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "control.gradient" in err
    assert f"exp({math.log(torch.finfo(torch.float32).max):.4g})" in err and "exp(90)" in err
    assert not (tmp_path / "range.nc").exists()


def test_continuous_gradient_within_the_dtypes_exponent_range_is_the_float64_one():
    """Just inside the bound (beta |B|_2 = 88 < 88.72) the float32 continuous gradient is finite and agrees with the
    float64 discrete one to the scheme's truncation error plus float32 round-off: the refusal takes nothing that ran."""
    forward32 = ControlledForward(softmax_case(88.0, "float32"))
    forward64 = ControlledForward(softmax_case(88.0, "float64"))
    W = torch.zeros(1, 2, 2, dtype=torch.float64)
    single = continuous_gradient(forward32, None, W).dW.double()
    double = discrete_gradient(forward64, None, W).dW
    assert float((single - double).norm() / double.norm()) < 1e-5


def test_a_sweep_refuses_a_member_beyond_the_continuous_gradients_range_before_any_runs(tmp_path):
    """The refusal sits in the case checks that a sweep makes of every member before the first runs: a sweep of
    beta = 1 and 90 (float32) named member 1 only as it started, after member 0's training."""
    import os

    import pytest

    from spherepde.api.sweep import run_sweep
    from spherepde.base.errors import CaseError

    folder = tmp_path / "out"
    with pytest.raises(CaseError, match=r"sweep member 1 \(model.beta=90.0\): control.gradient: .* exp\(90\)"):
        run_sweep(softmax_case(1.0, "float32"), ["model.beta=1.0,90.0"], str(folder))
    assert not folder.exists() or not os.listdir(folder)
