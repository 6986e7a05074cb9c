"""The mean-field limit of the particle training (solvers/particle_training.py): for a fixed control W, the
particle cost J_n(W) and its gradient dJ_n/dW, averaged over particle seeds, against the Eulerian J(W) and discrete
dJ/dW (solvers/adjoint.py), with interaction, noise, the nonlinear bow loss and the softmax kernel; and the
particle gradient against central differences of the particle cost on the same Brownian path."""

import copy

import numpy as np
import pytest
import torch

from solvers.adjoint import discrete_gradient
from solvers.controlled_forward import ControlledForward
from solvers.particle_training import ParticleControl
from spherepde.io.case import case_from_dict
from spherepde.model.initial import initial_density


def limit_table(dim=2, loss="bow", kernel="softmax", t_end=0.4, lmax=32, dt=0.05, lambda_reg=0.5):
    """A nonsymmetric B, V, eps = 0.1, a tilted vMF start, two layers; Eulerian (the particle tables add to it)."""
    B = [[1.0, 0.2], [0.1, 0.65]] if dim == 2 else [[1.0, 0.2, 0.0], [0.1, 0.65, 0.3], [-0.2, 0.0, 0.8]]
    V = [[0.8, -0.3], [0.4, 1.0]] if dim == 2 else [[0.8, -0.3, 0.1], [0.4, 1.0, 0.0], [0.0, 0.2, 0.9]]
    control = {"loss": loss, "layers": 2, "lambda_reg": lambda_reg}
    control |= {"tau": 4.0, "K": 5, "kappa_cand": 2.0} if loss == "bow" else {}
    return {"case": {"name": "training-limit"}, "sphere": {"dim": dim, "lmax": lmax},
            "model": {"kernel": kernel, "beta": 1.3, "B": B, "V": V, "eps": 0.1},
            "initial": {"kind": "vmf", "mean": [1.0] + [0.5] * (dim - 1), "kappa": 1.0},
            "time": {"t_end": t_end, "dt": dt, "save_every": t_end / 2},
            "solver": {"method": "eulerian", "device": "cpu"}, "control": control}


def limit_controls(dim):
    generator = torch.Generator().manual_seed(3)
    return 0.5 * torch.randn(2, dim, dim, generator=generator, dtype=torch.float64)


def particle_members(table, n, seeds, dt):
    cases = []
    for seed in seeds:
        member = copy.deepcopy(table)
        member["solver"] = {"method": "particles", "device": "cpu", "field": "dense"}
        member["particles"] = {"n": n, "seed": seed, "integrator": "heun", "dt": dt}
        cases.append(case_from_dict(member))
    return ParticleControl(cases)


def eulerian_gradient(table, controls):
    forward = ControlledForward(case_from_dict(table))
    return discrete_gradient(forward, initial_density(forward.case["initial"], forward.problem.basis), controls)


@pytest.mark.parametrize("dim, loss, kernel", [(2, "bow", "softmax"), (3, "align", "unnormalized")])
def test_particle_gradient_mean_is_the_eulerian_gradient(dim, loss, kernel):
    """48 seeds of 128 interacting noisy tokens: every entry of the mean of dJ_n/dW is within 4 standard errors of
    the Eulerian dJ/dW (measured up to 2.5 at n = 250 to 4000 over S^1 and S^2, both losses, both kernels, with and
    without noise; a factor, sign or missing term in either gradient is tens of them), and the regulariser part of J,
    J - l(mu_T) = lambda_reg / 2 sum_l |W_l|^2 T / L, is the same number on both sides."""
    table = limit_table(dim, loss, kernel, lmax=32 if dim == 2 else 12)
    controls = limit_controls(dim)
    eulerian = eulerian_gradient(table, controls)
    forward = particle_members(table, 128, range(48), 0.05)
    gradients = forward.gradients(controls.expand((forward.members,) + controls.shape).clone())
    samples = torch.stack([gradient.dW for gradient in gradients]).numpy()
    mean, standard_error = samples.mean(0), samples.std(0, ddof=1) / forward.members ** 0.5
    assert float(np.abs((mean - eulerian.dW.numpy()) / standard_error).max()) <= 4.0
    regulariser = 0.5 * 0.5 * float((controls ** 2).sum()) * 0.4 / 2
    assert eulerian.cost - eulerian.loss == pytest.approx(regulariser, rel=1e-12)
    for gradient in gradients:
        assert gradient.cost - gradient.loss == pytest.approx(regulariser, rel=1e-12)


def test_particle_gradient_is_the_derivative_of_the_noisy_particle_cost():
    """Common random numbers on S^2 with noise, the bow loss, three replicas and slices that are not save times: the
    by-hand transposed gradient matches central differences of J_n along the same Brownian path to 1e-8 (measured
    9e-11 to 3e-10 over every integrator)."""
    table = limit_table(3, "bow", "softmax", t_end=1.0, lambda_reg=0.3)
    table["control"]["layers"] = 3
    table["time"]["save_every"] = 0.3
    table["solver"] = {"method": "particles", "device": "cpu", "field": "dense"}
    table["particles"] = {"n": 24, "seed": 5, "integrator": "rk4", "replicas": 3, "dt": 0.07}
    forward = ParticleControl(case_from_dict(table))
    controls = 0.5 * torch.randn(3, 3, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    gradient = forward.gradient(controls)
    step, differences = 1e-5, torch.zeros_like(controls)
    for index in np.ndindex(*controls.shape):
        shift = torch.zeros_like(controls)
        shift[index] = step
        differences[index] = (forward.cost_of(controls + shift) - forward.cost_of(controls - shift)) / (2 * step)
    assert forward.by_hand
    assert float((gradient.dW - differences).norm() / differences.norm()) <= 1e-8


def test_members_of_other_sizes_are_refused_naming_what_they_must_share():
    """ParticleControl / ParticleSystem over members of another particles.n (the API: the command line batches
    only members that share it) said "stack expects each tensor to be equal size" from inside torch."""
    table = limit_table()
    members = [particle_members(table, n, [0], 0.1).cases[0] for n in (16, 32)]
    with pytest.raises(ValueError, match="members must share sphere.dim, particles.n and particles.replicas"):
        ParticleControl(members)
