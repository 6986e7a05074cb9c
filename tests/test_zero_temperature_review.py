"""Review of the zero-temperature limit beta = inf (docs/design.md "The model"), each against an independent
computation: the Eulerian density of seed 003's baseline against its closed form, the hardmax tokens against a
brute-force step written here, and a sweep over beta that includes "inf"."""

import math

import numpy as np
import pytest
import torch
import xarray as xr
from scipy.special import i0, i1

import spherepde
from spherepde.io.case import case_from_dict

# seed 003's baseline (cases/baseline-inf.toml): B = diag(-1, -1, 1), V = diag(-1, 1, -2), so that B^T x / |B^T x| = B x
# on the sphere and v = P_x(A x) with A = V B^T = diag(1, -1, -2)
B = np.diag([-1.0, -1.0, 1.0])
V = np.diag([-1.0, 1.0, -2.0])
A = np.diag(V @ B.T)
MEAN, KAPPA = np.array([0.3, 0.5, 0.8]) / np.linalg.norm([0.3, 0.5, 0.8]), 2.0


def baseline(overrides=()):
    return spherepde.load_case("cases/baseline-inf.toml", list(overrides))


def exact_baseline_density(points: np.ndarray, t: float) -> np.ndarray:
    """rho_t(y) of the baseline from its vMF start: the flow is x -> e^{tA} x / |e^{tA} x| (Oja's flow), whose
    inverse is y -> e^{-tA} y / |e^{-tA} y| with Jacobian det(e^{-tA}) / |e^{-tA} y|^3 on S^2."""
    back = points * np.exp(-A * t)
    length = np.linalg.norm(back, axis=-1)
    start = back / length[..., None]
    vmf = KAPPA / (4 * np.pi * np.sinh(KAPPA)) * np.exp(KAPPA * start @ MEAN)
    return vmf * np.exp(-A.sum() * t) / length ** 3


def test_the_eulerian_density_at_beta_inf_is_the_closed_form_push_forward():
    """lmax 24, t <= 0.1 (where the run reports itself resolved): the density on the grid within 2e-7 of the exact
    push-forward, relative in L2 (measured 9.8e-8 at t = 0.1; 6.2e-8 at lmax 32, t = 0.15), mass 1 to round-off."""
    run = spherepde.run(baseline(["sphere.lmax=24", "time.t_end=0.1", "time.save_every=0.05"]), progress=False)
    lat, lon = np.radians(run["lat"].values)[:, None], np.radians(run["lon"].values)[None, :]
    points = np.stack(np.broadcast_arrays(np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)), -1)
    area = run["cell_area"].values
    for t, density in zip(run["time"].values, run["density"].values):
        exact = exact_baseline_density(points, t)
        assert math.sqrt(np.sum(area * (density - exact) ** 2) / np.sum(area * exact ** 2)) < 2e-7, t
        assert abs(np.sum(area * density) - 1) < 1e-13


def brute_force_hardmax_step(x: np.ndarray, h: float) -> np.ndarray:
    """One Heun step of dx_i/dt = P_{x_i}(V x_{j*}), j* = argmax_j <x_i, B x_j> (self included), at the stage
    points as they are (the explicit trapezoidal rule in R^3), then normalised."""
    def velocity(y):
        target = y[np.argmax(y @ B @ y.T, axis=1)] @ V.T
        return target - np.sum(y * target, -1)[:, None] * y

    k1 = velocity(x)
    k2 = velocity(x + h * k1)
    y = x + h / 2 * (k1 + k2)
    return y / np.linalg.norm(y, axis=-1, keepdims=True)


def test_hardmax_tokens_follow_the_brute_force_argmax_dynamics():
    """21 tokens in 3 systems of 7 (each its own argmax), blocks of 2 rows: every saved step is the brute-force
    step of the previous save to round-off (measured 2.2e-16)."""
    case = baseline(["solver.method='particles'", "particles.beta_inf_mode='hardmax'", "particles.n=21",
                     "particles.replicas=3", "solver.chunk=2", "particles.integrator='heun'", "particles.dt=0.01",
                     "time.t_end=0.3", "time.save_every=0.01", "diagnostics.w2=false"])
    tokens = spherepde.run(case, progress=False)["particles"].values
    for before, after in zip(tokens[:-1], tokens[1:]):
        stepped = np.concatenate([brute_force_hardmax_step(system, 0.01) for system in np.split(before, 3)])
        assert np.abs(stepped - after).max() < 1e-14


def test_a_sweep_over_beta_with_inf_has_a_numeric_beta_coordinate(tmp_path):
    """A sweep over model.beta = 2, "inf" stored the coordinate as text ('2.0', '"inf"'): by_parameters'
    .sel(model_beta=...) could not take a number.  Now floats, inf for "inf".  At beta = inf with B = V = I the
    field is B^T x / |B^T x| = x and v = P_x(x) = 0: the heat flow, whose mean on S^1 is
    exp(-eps t) I1(kappa) / I0(kappa)."""
    pytest.importorskip("distributed", reason="the sweep extra (Dask) is not installed")
    from spherepde.api.sweep import by_parameters, combine, plan, run_batch

    case = case_from_dict({"case": {"name": "sweep-inf"}, "sphere": {"dim": 2, "lmax": 16},
                           "model": {"kernel": "softmax", "beta": 2.0, "eps": 0.1},
                           "initial": {"kind": "vmf", "mean": [1.0, 0.0], "kappa": 2.0},
                           "time": {"t_end": 0.5, "dt": 0.05, "save_every": 0.25}, "solver": {"device": "cpu"}})
    params = ['model.beta=2.0,"inf"']
    members = plan(case, params, str(tmp_path))
    # one batch a member, as the sweep has them: beta = inf and finite beta are never batched together
    summaries = {s["member"]: s for m in members for s in run_batch([m.index], [m.case.text], [m.path])}
    combine(case, members, summaries, str(tmp_path / "sweep.nc"), params, None)
    with xr.open_dataset(tmp_path / "sweep.nc") as combined:
        assert combined["model_beta"].dtype.kind == "f" and list(combined["model_beta"].values) == [2.0, math.inf]
        heat = by_parameters(combined).sel(model_beta=math.inf)["mean"].sel(time=0.5).values
    assert heat == pytest.approx([math.exp(-0.05) * i1(KAPPA) / i0(KAPPA), 0.0], abs=1e-9)


def test_zero_temperature_mean_is_the_normalised_field_at_scattered_points():
    """spherepde.model.attention.zero_temperature_mean against B^T x / |B^T x| written out, for a general B."""
    from spherepde.model.attention import zero_temperature_mean

    rng = np.random.default_rng(5)
    general = rng.standard_normal((3, 3))
    x = rng.standard_normal((50, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    expected = x @ general / np.linalg.norm(x @ general, axis=1, keepdims=True)
    m = zero_temperature_mean(torch.as_tensor(general)[None], torch.as_tensor(x))[0].numpy()
    assert np.abs(m - expected).max() < 1e-15
