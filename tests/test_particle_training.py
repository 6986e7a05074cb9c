"""Training through the particle system (solvers/particle_training.py): autograd gradient, regulariser,
common random numbers, agreement with the particle solver, the training run and its output."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

import spherepde
from solvers.controlled_forward import central_differences_of
from solvers.particle_training import ParticleControl, phase_variables
from spherepde.base.errors import CaseError
from spherepde.cli import main
from spherepde.io.case import case_from_dict

A = [[1.0, 0.0], [0.0, 0.65]]  # the seed's attention matrix, B = V = A


def particle_case(control=None, integrator="heun", n=8, t_end=0.6, dt=0.1, save_every=0.2, layers=3, seed=0):
    """S^1, unnormalized kernel, eps = 0.1 (the noise is on, so common random numbers matter), a tilted vMF start."""
    table = {"case": {"name": "particle-train"},
             "sphere": {"dim": 2, "lmax": 16},
             "model": {"kernel": "unnormalized", "beta": 1.0, "B": A, "V": A, "eps": 0.1},
             "initial": {"kind": "vmf", "mean": [1.0, 0.5], "kappa": 1.0},
             "time": {"t_end": t_end, "dt": dt, "save_every": save_every},
             "solver": {"method": "particles", "device": "cpu", "field": "dense"},
             "particles": {"n": n, "seed": seed, "integrator": integrator},
             "control": {"loss": "align", "layers": layers, "lambda_reg": 0.1} | (control or {})}
    return case_from_dict(table)


def random_controls(case, scale=0.5):
    generator = torch.Generator().manual_seed(3)
    return scale * torch.randn(case["control"]["layers"], 2, 2, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("loss, integrator", [("align", "heun"), ("bow", "heun"), ("align", "euler")])
def test_autograd_gradient_matches_central_differences(loss, integrator):
    control = {"loss": loss} | ({"tau": 4.0, "K": 5, "kappa_cand": 2.0} if loss == "bow" else {})
    forward = ParticleControl(particle_case(control, integrator))
    controls = random_controls(forward.case)
    gradient = forward.gradient(controls)
    assert gradient.cost == forward.cost_of(controls)  # common random numbers: J is a function of W
    numerical = central_differences_of(forward.cost_of, controls)
    assert float((gradient.dW - numerical).norm() / numerical.norm()) <= 1e-6


@pytest.mark.parametrize("integrator, kernel, eps, dim", [
    ("heun", "unnormalized", 0.1, 2), ("heun", "softmax", 0.0, 2), ("rk4", "softmax", 0.1, 2),
    ("rk4", "unnormalized", 0.0, 2), ("euler", "unnormalized", 0.1, 2), ("euler", "softmax", 0.0, 2),
    ("heun", "softmax", 0.1, 3)])
def test_hand_written_transposes_are_autograds(integrator, kernel, eps, dim):
    """solvers/particle_adjoint.py against autograd through the same steps: a nonsymmetric B, V, two replicas,
    every integrator, both kernels, with and without noise, S^1 and S^2 (dJ/dW to 1e-13 relative)."""
    B = [[1.0, 0.2], [0.1, 0.65]] if dim == 2 else [[1.0, 0.2, 0.0], [0.1, 0.65, 0.3], [-0.2, 0.0, 0.8]]
    V = [[0.8, -0.3], [0.4, 1.0]] if dim == 2 else [[0.8, -0.3, 0.1], [0.4, 1.0, 0.0], [0.0, 0.2, 0.9]]
    forward = ParticleControl(case_from_dict({
        "case": {"name": "transposes"}, "sphere": {"dim": dim, "lmax": 16},
        "model": {"kernel": kernel, "beta": 1.3, "B": B, "V": V, "eps": eps},
        "initial": {"kind": "vmf", "mean": [1.0] + [0.5] * (dim - 1), "kappa": 1.0},
        "time": {"t_end": 0.6, "dt": 0.1, "save_every": 0.2},
        "solver": {"method": "particles", "device": "cpu", "field": "dense"},
        "particles": {"n": 8, "seed": 0, "integrator": integrator, "replicas": 2},
        "control": {"loss": "align", "layers": 3, "lambda_reg": 0.1}}))
    generator = torch.Generator().manual_seed(3)
    controls = 0.5 * torch.randn(3, dim, dim, generator=generator, dtype=torch.float64)
    by_hand, by_autograd = by_hand_and_by_autograd(forward, controls)
    assert by_hand.cost == by_autograd.cost
    assert float((by_hand.dW - by_autograd.dW).norm() / by_autograd.dW.norm()) <= 1e-13


def by_hand_and_by_autograd(forward: ParticleControl, controls: torch.Tensor) -> tuple:
    """The Gradient of `controls` by the hand-written transposes, and by autograd through the same steps."""
    assert forward.by_hand
    by_hand = forward.gradient(controls)
    forward.by_hand = False
    return by_hand, forward.gradient(controls)


def test_the_noise_is_on_and_fixed_by_the_seed():
    """The same case gives the same J; another particles.seed another path (the noise and x_0 matter)."""
    controls = random_controls(particle_case())
    costs = [ParticleControl(particle_case(seed=seed)).cost_of(controls) for seed in (0, 0, 1)]
    assert costs[0] == costs[1] and abs(costs[0] - costs[2]) > 1e-3


def test_gradient_of_the_regulariser_alone():
    """With l independent of the particles, dJ/dW_l = lambda_reg W_l T / L exactly (T / L = 0.2 here)."""

    class ConstantLoss:
        def value(self, points, masses):
            return 0.0 * (masses @ points).sum() + 0.7

    forward = ParticleControl(particle_case({"lambda_reg": 0.3}))
    forward.losses = [ConstantLoss()]
    controls = random_controls(forward.case)
    gradient = forward.gradient(controls)
    assert torch.allclose(gradient.dW, 0.3 * 0.2 * controls, rtol=1e-14, atol=0)
    assert gradient.cost == pytest.approx(0.7 + 0.5 * 0.3 * 0.2 * float((controls ** 2).sum()), rel=1e-14)


def test_untrained_run_is_the_particle_solver_run():
    """control.iterations = 0: the recorded run is the particle solver's run of the same case (the same x_0, noise,
    integrator and steps when the slice boundaries are save times)."""
    import spherepde

    case = particle_case({"iterations": 0}, n=16)
    trained = spherepde.run(case, progress=False)
    plain = spherepde.run(case_from_dict({key: value for key, value in case.data.items() if key != "control"}),
                          progress=False)
    assert np.array_equal(trained["time"].values, plain["time"].values)
    assert np.allclose(trained["particles"].values, plain["particles"].values, rtol=0, atol=1e-14)


def test_a_training_keeps_its_systems_within_direct_bytes():
    """A training's transposes keep each stage's (p, p) kernel whole: with systems of 3000 tokens (72 MB a kernel,
    beyond DIRECT_BYTES) its runs, a selected member's too, take the generic sums, where the forward run of the same
    case without [control] takes the direct sums (the kernel in blocks of query rows); the recorded run of an
    untrained control and that forward run (the layers' boundaries save times) agree to round-off."""
    import spherepde
    from solvers.particle_field import DIRECT_BYTES
    from solvers.particles import ParticleSystem

    case = particle_case({"iterations": 0}, n=3000, t_end=0.2, save_every=0.1, layers=2)
    table = {key: value for key, value in case.data.items() if key != "control"}
    assert 3000 * 3000 * 8 > DIRECT_BYTES
    forward = ParticleControl(case)
    assert not forward.by_hand and forward.select([0]).system.integrator.direct_step(forward.x0) is None
    plain = ParticleSystem(case_from_dict(table))
    assert plain.integrator.direct_step(plain.x0) is not None
    trained = spherepde.run(case, progress=False)["particles"].values
    assert np.abs(trained - spherepde.run(case_from_dict(table), progress=False)["particles"].values).max() <= 1e-14


def test_training_run_reduces_the_loss_and_writes_the_output(tmp_path):
    path = tmp_path / "train.toml"
    case = particle_case({"iterations": 5, "learning_rate": 0.3}, n=16, t_end=2.0, dt=0.1, save_every=0.25, layers=4)
    path.write_text(case.text)
    output = tmp_path / "train.nc"
    assert main(["run", str(path), "-o", str(output), "--quiet"]) == 0
    with xr.open_dataset(output) as dataset:
        loss = dataset["loss"].values
        assert dataset.sizes["iteration"] == 6 and loss[-1] < 0.9 * loss[0]
        assert dataset["W"].dims == ("layer", "row", "col") and dataset["W"].shape == (4, 2, 2)
        assert dataset["particles"].shape == (9, 16, 2) and dataset["mean_angle"].dims == ("time",)
        assert dataset["interaction_gap"].dims == ("time",) and dataset.attrs["three_phase"] in ("true", "false")
        assert dataset.attrs["solver"] == "particles" and "[control]" in dataset.attrs["case"]
        # the recorded run is the training's forward map at the final W: the same terminal loss
        from spherepde.model.losses import make_loss

        x_end = torch.as_tensor(dataset["particles"].values[-1])
        recorded = make_loss(case["control"], 2).value(x_end, torch.full((16,), 1 / 16, dtype=torch.float64))
        assert float(recorded) == pytest.approx(float(dataset["terminal_loss"].values[-1]), abs=1e-13)


def test_both_is_refused_and_eulerian_keys_with_particles_are_errors():
    with pytest.raises(CaseError, match="not 'both'"):
        particle_case().with_overrides(["solver.method='both'"])
    with pytest.raises(CaseError, match="control.gradient"):
        particle_case({"gradient": "continuous"})


def test_fresh_noise_is_refused_where_it_cannot_work():
    with pytest.raises(CaseError, match="control.noise: 'fresh' noise makes J random"):
        particle_case({"noise": "fresh", "optimizer": "lbfgs"})
    with pytest.raises(CaseError, match="control.tol"):
        particle_case({"noise": "fresh", "tol": 1e-6})
    # An override of the method drops the particle training's key (docs/guide/case-files.md "Overrides"); set with
    # it, or in a table of the Eulerian method, it is refused.
    assert "noise" not in particle_case({"noise": "fresh"}).with_overrides(["solver.method='eulerian'"])["control"]
    with pytest.raises(CaseError, match="control.noise: not used when solver.method"):
        particle_case({"noise": "fresh"}).with_overrides(["solver.method='eulerian'", "control.noise='fresh'"])


def test_fresh_noise_gradient_is_an_unbiased_estimate_of_the_mean_field_gradient():
    """V = 0: the tokens move independently and l_align is linear in mu_T, so over x_0 and the noise
    E[dJ/dW] is the mean-field dJ/dW (the Eulerian discrete gradient; the particles' weak order-2 time
    error is far below the sampling error here).  Each entry of the mean of 40 fresh-noise gradients of
    256 tokens is within 4 of its standard errors of it (Student t, 39 dof: exceeded with probability
    3e-4 per entry); common noise, one path's gradient each time, has no spread at all."""
    import copy

    from solvers.adjoint import discrete_gradient
    from solvers.controlled_forward import ControlledForward
    from spherepde.model.initial import initial_density

    table = copy.deepcopy(particle_case({"noise": "fresh"}, n=256).data)
    table["model"]["V"] = [[0.0, 0.0], [0.0, 0.0]]
    forward = ParticleControl(case_from_dict(table))
    controls = random_controls(forward.case)
    samples = torch.stack([forward.gradient(controls).dW for _ in range(40)])
    mean, standard_error = samples.mean(0), samples.std(0) / 40 ** 0.5
    table["solver"]["method"] = "eulerian"
    del table["control"]["noise"], table["particles"]
    eulerian = ControlledForward(case_from_dict(table))
    mean_field = discrete_gradient(eulerian, initial_density(eulerian.case["initial"], eulerian.problem.basis),
                                   controls).dW
    assert bool((standard_error > 0).all())
    assert float(((mean - mean_field) / standard_error).abs().max()) <= 4.0


def test_the_three_phase_test_says_untested_where_it_does_not_run():
    """Beyond the seed's model (here the softmax kernel; also eps = 0) the energy the test reads is not the seed's:
    three_phase read "false", as if the test had run and failed (the seed counts its eps = 0 trainings
    three-phase), where it was never run."""
    case = spherepde.load_case(Path(__file__).resolve().parent.parent / "cases" / "quickstart.toml")
    times = np.linspace(0.0, 1.0, 5)
    dataset = xr.Dataset({"mean": (("time", "dim"), np.tile([0.5, 0.0, 0.0], (5, 1)))}, coords={"time": times})
    phase_variables(case, dataset)
    assert dataset.attrs["three_phase"] == "untested" and math.isnan(dataset.attrs["plateau_width"])
