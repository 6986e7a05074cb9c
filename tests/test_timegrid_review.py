"""The time grid against a schedule written out independently: the save times as exact decimal products k save_every
and t_end, the layer boundaries l t_end / L, each interval between knots in ceil(length / dt) equal steps.  A W per
layer that rotates S^1 rigidly (W_l = w_l J, so d theta / dt = w_l) makes the schedule visible in the outputs: the
first Fourier mode of the density is multiplied by RK4's R(i w h) at each step of length h (a particle's position
by Heun's normalised 1 + i w h - (w h)^2 / 2), so a step across a layer boundary or a save shows at round-off."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import xarray as xr
from scipy.special import iv

from solvers.adjoint import discrete_gradient
from solvers.controlled_forward import ControlledForward, evaluate_cost
from solvers.timegrid import TimeGrid
from spherepde.cli import main
from spherepde.io.case import case_from_dict
from spherepde.model.initial import initial_density


def schedule(t_end: float, save_every: float, layers: int, dt: float = math.inf):
    """(save times, [(t0, t1, steps, step length, layer, is a save)]) from exact rationals of the numbers as
    written; knots within 1e-12 t_end of a save are that save (the grid's documented merging)."""
    end, every = Fraction(repr(t_end)), Fraction(repr(save_every))
    saves = [k * every for k in range(math.ceil(end / every)) if k * every < end * (1 - Fraction(1, 10**12))] + [end]
    knots = sorted(saves + [end * l / layers for l in range(layers + 1)
                            if min(abs(end * l / layers - s) for s in saves) > end / 10**12])
    intervals = []
    for t0, t1 in zip(knots[:-1], knots[1:]):
        steps = 1 if dt == math.inf else max(1, math.ceil((t1 - t0) / Fraction(repr(dt))))
        intervals.append((float(t0), float(t1), steps, float(t1 - t0) / steps,
                          min(int((t0 + t1) / 2 * layers / end), layers - 1), t1 in saves))
    return [float(s) for s in saves], intervals


def rk4(z):
    return 1 + z + z**2 / 2 + z**3 / 6 + z**4 / 24


def heun(z):
    factor = 1 + z + z**2 / 2
    return factor / abs(factor)


def rotation_factors(speeds, t_end, save_every, dt, one_step):
    """The first mode's factor at each save time: the product of one_step(i w_l h) over the schedule's steps."""
    factor, factors = 1 + 0j, [1 + 0j]
    for _, _, steps, h, layer, save in schedule(t_end, save_every, len(speeds), dt)[1]:
        factor *= one_step(1j * speeds[layer] * h) ** steps
        if save:
            factors.append(factor)
    return np.array(factors)


VALUES = [0.05, 0.1, 0.25, 0.3, 1 / 3, 0.35, 0.7, 0.9, 1.0, 2.5]


def test_the_knots_layers_and_saves_are_the_independent_schedules():
    """Over t_end x save_every x L of awkward values (0.25 / 0.1, 0.3 / 0.1, 0.9 / 0.3, 1 / 3, save_every >
    t_end, 7 layers), the grid's knots, layers and save marks are the exact schedule's to round-off."""
    for t_end, save_every, layers in itertools.product(VALUES, VALUES, [1, 2, 3, 5, 7]):
        saves, intervals = schedule(t_end, save_every, layers)
        grid = TimeGrid(t_end, save_every, layers)
        assert np.array_equal(grid.saves, saves), (t_end, save_every)
        got = [(i.t0, i.t1, i.layer, i.save) for i in grid.intervals]
        assert len(got) == len(intervals), (t_end, save_every, layers)
        for (t0, t1, layer, save), (u0, u1, _, _, v, s) in zip(got, intervals):
            assert abs(t0 - u0) <= 1e-15 * t_end and abs(t1 - u1) <= 1e-15 * t_end and (layer, save) == (v, s)
    assert list(TimeGrid(0.3, 0.1).saves) == [0.0, 0.1, 0.2, 0.3]  # 4 saves, not 3, and 0.2 not 0.1 + 0.1 + ...


ROTATION = """
[case]
name = "rotation"
[sphere]
dim = 2
lmax = 16
[model]
kernel = "unnormalized"
beta = 0.0
V = [[0.0, 0.0], [0.0, 0.0]]
W = [[[0.0, -1.0], [1.0, 0.0]], [[0.0, -3.0], [3.0, 0.0]], [[0.0, 2.0], [-2.0, 0.0]]]
eps = 0.0
[initial]
kind = "vmf"
mean = [1.0, 0.0]
kappa = 2.0
[time]
t_end = 1.0
dt = 0.3
save_every = 0.25
[particles]
n = 50
[solver]
device = "cpu"
"""
SPEEDS = [1.0, 3.0, -2.0]  # the layers' w_l above


@pytest.mark.parametrize("solver, one_step", [("eulerian", rk4), ("particles", heun)])
@pytest.mark.parametrize("t_end, save_every, dt", [(1.0, 0.25, 0.3), (0.3, 0.1, 0.04), (0.5, 0.5, 0.7)])
def test_a_W_per_layer_rotates_the_run_over_its_own_layer_in_the_documented_steps(tmp_path, capsys, solver,
                                                                                 one_step, t_end, save_every, dt):
    """Three layers on t_end 1 with dt 0.3 and saves every 0.25 (boundaries 1/3, 2/3 between steps and saves: 6
    intervals of one step), 0.3 / 0.1 (4 saves), dt above save_every and t_end."""
    case = tmp_path / "case.toml"
    case.write_text(ROTATION)
    output = tmp_path / "out.nc"
    status = main(["run", str(case), "-o", str(output), "--quiet", "--solver", solver,
                   "--set", f"time.t_end={t_end}", "--set", f"time.save_every={save_every}", "--set", f"time.dt={dt}"])
    assert status == 0, capsys.readouterr().err
    saves, intervals = schedule(t_end, save_every, 3, dt)
    expected = rotation_factors(SPEEDS, t_end, save_every, dt, one_step)
    with xr.open_dataset(output) as result:
        assert np.array_equal(result["time"].values, saves)
        assert int(result.attrs["steps"]) == sum(steps for _, _, steps, *_ in intervals)
        if solver == "eulerian":
            mean = result["mean"].values @ np.array([1, 1j])
            assert np.abs(mean / mean[0] - expected).max() <= 1e-13
        else:
            positions = result["particles"].values @ np.array([1, 1j])
            assert np.abs(positions / positions[0] - expected[:, None]).max() <= 1e-13


def test_a_trainings_forward_map_and_gradient_step_the_layers_that_fall_between_its_steps():
    """t_end 1, dt 0.3, saves every 0.25, 3 layers: the cost at rotation controls is 1 - Im(I1(2) / I0(2) prod R)
    (the align loss toward (0, 1), no regularisation), and at other controls the discrete gradient is a central
    difference of the cost (h = 1e-5) in every entry of W."""
    zero = [[0.0, 0.0], [0.0, 0.0]]
    table = {"sphere": {"dim": 2, "lmax": 16}, "model": {"kernel": "unnormalized", "beta": 0.0, "V": zero, "eps": 0.0},
             "initial": {"kind": "vmf", "mean": [1.0, 0.0], "kappa": 2.0},
             "time": {"t_end": 1.0, "dt": 0.3, "save_every": 0.25}, "solver": {"device": "cpu"},
             "control": {"loss": "align", "target": [0.0, 1.0], "layers": 3, "lambda_reg": 0.0}}
    forward = ControlledForward(case_from_dict(table))
    c0 = initial_density(forward.case["initial"], forward.problem.basis)
    rotations = torch.tensor([[[0.0, -w], [w, 0.0]] for w in SPEEDS], dtype=torch.float64)
    mean = iv(1, 2.0) / iv(0, 2.0) * rotation_factors(SPEEDS, 1.0, 0.25, 0.3, rk4)[-1]
    assert float(evaluate_cost(forward, c0, rotations)) == pytest.approx(1 - mean.imag, abs=1e-14)

    A = [[1.0, 0.0], [0.0, 0.65]]
    table["model"] = {"kernel": "unnormalized", "beta": 1.0, "B": A, "V": A, "eps": 0.05}
    table["initial"]["mean"], table["control"]["lambda_reg"] = [1.0, 0.2], 0.1
    forward = ControlledForward(case_from_dict(table))
    c0 = initial_density(forward.case["initial"], forward.problem.basis)
    controls = 0.3 * torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    differences = torch.zeros_like(controls)
    for index in np.ndindex(*controls.shape):
        shift = torch.zeros_like(controls)
        shift[index] = 1e-5
        differences[index] = (evaluate_cost(forward, c0, controls + shift)
                              - evaluate_cost(forward, c0, controls - shift)) / 2e-5
    gradient = discrete_gradient(forward, c0, controls).dW
    assert float((gradient - differences).norm() / differences.norm()) <= 1e-8
