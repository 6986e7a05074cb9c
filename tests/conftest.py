import copy

import pytest
import torch

from spherepde.io.case import case_from_dict

# Every test problem is below spherepde.base.threads' one-thread sizes, where extra threads only spin; tests that call
# the solvers directly (not through spherepde.run, which applies solver.threads) get the same setting here.
torch.set_num_threads(1)


def identity(d, scale=1.0):
    return [[scale * float(i == j) for j in range(d)] for i in range(d)]


def make_case(dim=3, lmax=12, model=None, initial=None, time=None, solver=None, diagnostics=None, name="test"):
    """A case built in code: defaults of a small, cheap run overridden by the given sections."""
    table = {
        "case": {"name": name},
        "sphere": {"dim": dim, "lmax": lmax},
        "model": {"kernel": "softmax", "beta": 1.0, "eps": 0.0} | (model or {}),
        "initial": initial or {"kind": "vmf", "mean": [1.0] + [0.0] * (dim - 1), "kappa": 1.0},
        "time": {"t_end": 1.0, "dt": 0.1, "save_every": 0.5} | (time or {}),
        "solver": {"device": "cpu"} | (solver or {}),
        "diagnostics": diagnostics or {},
    }
    return case_from_dict(copy.deepcopy(table), origin=name)


@pytest.fixture
def case_factory():
    return make_case
