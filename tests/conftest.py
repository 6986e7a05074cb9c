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


CUDA = pytest.param("cuda", marks=pytest.mark.cuda)


def _placed(request, monkeypatch) -> str:
    """The parametrised device, CUDA with float32 matrix products in full precision (no TF32), as the tolerances
    against the CPU float64 reference assume."""
    if request.param == "cuda":
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    return request.param


@pytest.fixture(params=["cpu", CUDA])
def device(request, monkeypatch):
    """The device a test runs on: "cpu" by default, and "cuda", marked cuda (run with -m cuda; skipped without a
    CUDA device by pytest_collection_modifyitems)."""
    return _placed(request, monkeypatch)


@pytest.fixture(params=[CUDA])
def accelerator(request, monkeypatch):
    """The devices other than the CPU, for tests whose reference is the CPU run itself (on the CPU they would
    compare a run with itself)."""
    return _placed(request, monkeypatch)


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked cuda where no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
