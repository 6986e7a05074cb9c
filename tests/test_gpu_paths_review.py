"""The paths a CUDA run takes, checked on the CPU: benchmarks/gpu_checks.sh as a lent GPU machine would run it, the
particles' fused softmax attention inside a whole run, and the Eulerian step's torch program free of host
synchronisation (the numpy program, ducc0 and the kept spectral matrix switched off, as on CUDA)."""

import collections
import importlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_case
from torch.utils._python_dispatch import TorchDispatchMode

import solvers.forward_problem
from solvers.particles import ParticleSystem, run_members
from solvers.timegrid import Plan, TimeGrid

ROOT = Path(__file__).resolve().parents[1]
GENERAL_B = [[1.0, 0.2, 0.0], [0.0, 0.9, 0.1], [0.1, 0.0, 1.1]]


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_gpu_checks_outputs_are_headed_by_the_commands_that_import_gpu_files(tmp_path):
    """results/spectral_verification.py --import-gpu refuses an output whose first line is not its planned command:
    the CUDA tests' was `pytest -m cuda -n 0 ...` against the plan's `pytest -m cuda ...`, so the import of a lent
    machine's outputs stopped at the first.  Run here with the commands stubbed (a 16-core machine, as lent): every
    planned output is headed by its command, and the CUDA tests still run in one process (PYTEST_ADDOPTS)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    stub(bin_, "timeout", 'echo "PYTEST_ADDOPTS=${PYTEST_ADDOPTS:-}"')  # the part's command is not run
    stub(bin_, "nvidia-smi", "echo stub")
    stub(bin_, "python3", "echo stub")
    stub(bin_, "nproc", "echo 16")
    out = tmp_path / "out"
    parts = ["cuda_tests", "baseline_run", "step_rate", "step_rate_more"]
    subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_checks.sh"), str(out), *parts], check=True,
                   env=os.environ | {"PATH": f"{bin_}:{os.environ['PATH']}"}, capture_output=True, timeout=60)
    sys.path.insert(0, str(ROOT / "results"))
    try:
        plan = importlib.import_module("spectral_verification").GPU_MEASUREMENTS
    finally:
        sys.path.remove(str(ROOT / "results"))
    assert sorted(name for name, _, _ in plan) == sorted(parts)
    for name, _, command in plan:
        lines = (out / f"gpu_{name}.txt").read_text().splitlines()
        assert lines[0] == f"$ {command}"
        if name == "cuda_tests":
            assert lines[1] == "PYTEST_ADDOPTS=-n 0"
    for script in ("benchmarks/baseline_run.py", "benchmarks/step_rate.py", "results/particles_verification.py"):
        assert (ROOT / script).is_file()


def test_a_run_with_fused_attention_is_the_dense_run():
    """The fused softmax attention (ParticleField "fused", CUDA's choice) through whole runs of two members of
    different beta (3 and 30), two replica systems each, noisy Heun steps: the tokens are the dense run's (the
    direct sums) to round-off, measured 5e-16."""
    cases = [make_case(3, 8, model={"beta": beta, "eps": 0.05, "B": GENERAL_B},
                       time={"t_end": 0.1, "dt": 0.01, "save_every": 0.05}, solver={"method": "particles"},
                       diagnostics={"w2": False}).with_overrides(["particles.n=200", "particles.replicas=2"])
             for beta in (3.0, 30.0)]
    dense, fused = ParticleSystem(cases), ParticleSystem(cases)
    fused.field.attention = "fused"
    runs = [run_members(system, progress=False) for system in (dense, fused)]
    assert dense.field.direct and not fused.field.direct
    for by_dense, by_fused in zip(*runs):
        assert by_fused.attrs["attention"] == "fused"
        moved = np.abs(by_dense["particles"].values[-1] - by_dense["particles"].values[0]).max()
        assert moved > 1e-2
        assert np.abs(by_fused["particles"].values - by_dense["particles"].values).max() <= 1e-13


class HostSynchronisations(TorchDispatchMode):
    """Counts the operations that make a CUDA stream wait for the host: a value read (item, bool, float) and the
    shapes that depend on values (nonzero, masked_select, indexing by a boolean mask)."""

    WAITING = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "_unique2"}

    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        masked = name == "index" and any(getattr(index, "dtype", None) == torch.bool for index in args[1])
        if name in self.WAITING or masked:
            self.seen[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.slow  # entering the first dispatch mode of a process imports torch._dynamo: 2-3 s
def test_the_eulerian_step_on_cuda_waits_for_no_host(monkeypatch):
    """solvers.eulerian.run_members: a GPU run never waits on the host inside a save interval.  One RK4 step of the
    S^2 spectral field with a general B (Chebyshev in r, the torch NUFFT at scattered points) and noise, in the
    torch program as on CUDA: no operation reads a value back or sizes an array by one."""
    from spherepde.base import arrays
    from spherepde.discretisation import scattered
    from spherepde.discretisation.transforms import sht_torch
    from spherepde.kernels import spectral
    from spherepde.model import attention, transport

    for module in (arrays, sht_torch, attention, transport):
        monkeypatch.setattr(module, "program_namespace", lambda *tensors: torch, raising=False)
    monkeypatch.setattr(scattered, "_has_ducc0", lambda: False)
    monkeypatch.setattr(spectral, "SPECTRAL_MATRIX_BYTES", 0)
    case = make_case(3, 8, model={"beta": 2.0, "eps": 0.05, "B": GENERAL_B}, solver={"field": "spectral"})
    problem = solvers.forward_problem.ForwardProblem(case)
    assert isinstance(problem.exp_kernel.mode.evaluator, scattered.TorusNUFFT)
    dt = 1e-3
    factors = problem.factors(Plan(TimeGrid(dt, dt).intervals[0], np.array([1]), np.array([dt])))
    drive = problem.transport.feed_forward(problem.batch.W)
    state = problem.step(problem.initial(), drive, factors)  # the first step makes the buffers
    with HostSynchronisations() as waits:
        problem.step(state, drive, factors)
    assert dict(waits.seen) == {}


@pytest.mark.slow  # as above: the first dispatch mode of a process
def test_the_generic_particle_drift_waits_for_no_host():
    """CUDA takes the generic exponential-kernel sums (SystemKernel) for the unnormalized kernel beyond the direct
    sums' size: whether the kernel is constant (beta = 0 everywhere) is known once per run, not read back from beta
    at every drift, which made the stream wait for the host once a stage."""
    case = make_case(3, 8, model={"kernel": "unnormalized", "beta": 2.0, "B": GENERAL_B},
                     time={"t_end": 0.01, "dt": 0.01, "save_every": 0.01}, solver={"method": "particles"},
                     diagnostics={"w2": False}).with_overrides(["particles.n=50"])
    system = ParticleSystem([case])
    field = system.field
    field.direct = False  # the generic sums, as beyond DIRECT_BYTES on CUDA
    points = torch.randn(1, 50, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x = points / points.norm(dim=-1, keepdim=True)
    with HostSynchronisations() as waits:
        m = field.mean_field(x)
    assert dict(waits.seen) == {}
    kernel = torch.exp(2.0 * x[0] @ torch.tensor(GENERAL_B, dtype=torch.float64) @ x[0].T)
    assert torch.allclose(m[0], kernel @ x[0] / 50, rtol=1e-12, atol=0)
