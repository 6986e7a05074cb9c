"""The free energy (spherepde/model/energy.py): the functional the flow dissipates where one exists.

On the noisy Kuramoto model the stationary law is rho_* = exp(a <x, e>) / Z_a with a = K r / eps, so
F(rho_*) = eps (a r - log Z_a) - K r^2 / 2 = K r^2 / 2 - eps log Z_a, Z_a = 2 pi I_0(a) (S^1) or
4 pi sinh(a) / a (S^2), at the closed-form order parameter r of docs/design.md "Facts measured while planning".
"""

import math
import tomllib

import numpy as np
import pytest
from scipy.special import i0

import spherepde
from spherepde.io.case import case_from_dict
from spherepde.model.energy import FreeEnergy

KURAMOTO = {  # case file, stationary order parameter r (K = 1), eps, log Z_a
    "S1": ("cases/kuramoto-s1.toml", 0.8314620248, 0.25, lambda a: math.log(2 * math.pi * i0(a))),
    "S2": ("cases/kuramoto-s2.toml", 0.7258819872, 0.2, lambda a: math.log(4 * math.pi * math.sinh(a) / a)),
}


def old_free_energy(dataset, case):
    """The definition before spherepde.model.energy: eps * entropy + interaction_energy, whatever the model."""
    return case["model"]["eps"] * dataset["entropy"].values + dataset["interaction_energy"].values


@pytest.mark.parametrize("sphere", ["S1", "S2"])
def test_free_energy_decreases_to_its_stationary_value_on_noisy_kuramoto(sphere):
    path, r, eps, log_partition = KURAMOTO[sphere]
    case = spherepde.load_case(path, overrides=["time.t_end=20.0", "time.save_every=1.0"])
    dataset = spherepde.run(case, progress=False)
    F = dataset["free_energy"].values
    assert np.diff(F).max() <= 1e-12
    assert F[0] - F[-1] > 0.04
    a = r / eps
    assert abs(F[-1] - (r ** 2 / 2 - eps * log_partition(a))) < 1e-8
    # eps S - 1/2 (beta = 0: the pair integral is the constant -1/2) rises as the law concentrates
    assert np.diff(old_free_energy(dataset, case)).max() > 1e-2


def seed004_without_training(overrides):
    table = tomllib.load(open("cases/seed004-no-train.toml", "rb"))
    del table["control"]  # W = 0 throughout
    return case_from_dict(table, overrides=["sphere.lmax=48", "model.eps=0.05", "time.dt=0.02", "time.t_end=10.0",
                                            "time.save_every=0.5"] + overrides)


@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_free_energy_decreases_on_the_seed004_flow_with_W_zero(beta):
    """B = V = A = diag(1, 0.65): F = eps S - 1 / (2 beta) int int exp(beta <x, A y>); at beta = 1 the seed's
    E(mu) (the old definition too), at beta = 0.3 the old one, without the 1 / beta, rises."""
    case = seed004_without_training([f"model.beta={beta}"])
    dataset = spherepde.run(case, progress=False)
    F = dataset["free_energy"].values
    assert np.diff(F).max() < 0
    expected = case["model"]["eps"] * dataset["entropy"] + dataset["interaction_energy"] / beta
    assert np.allclose(F, expected, rtol=1e-14)
    old = np.diff(old_free_energy(dataset, case))
    assert old.max() < 0 if beta == 1 else old.max() > 1e-4


def test_a_W_per_layer_keeps_F_dissipated_only_where_every_layer_is_a_multiple_of_I():
    """seed 004's flow (B = V = A) with model.W a list of 3: with 0, 0.3 I, -0.2 I (no tangential part on any
    layer) the run is that of W = 0 to round-off, F decreases at every save, and the figure's panel says F is
    dissipated; with a rotation on the middle layer it says W may raise it (the free energy read a list of W as
    one matrix: no title at all)."""
    from spherepde.analysis.diagnostic_panels import _free_energy_title

    zero, I = [[0.0, 0.0], [0.0, 0.0]], np.eye(2)
    plain = spherepde.run(seed004_without_training(["time.t_end=3.0"]), progress=False)
    still = seed004_without_training(["time.t_end=3.0", f"model.W={[zero, (0.3 * I).tolist(), (-0.2 * I).tolist()]}"])
    dataset = spherepde.run(still, progress=False)
    F = dataset["free_energy"].values
    assert np.diff(F).max() < 0 and np.abs(F - plain["free_energy"].values).max() <= 1e-13
    assert _free_energy_title(dataset) == "free energy F (dissipated by this flow)"
    turned = seed004_without_training(["time.t_end=3.0", f"model.W={[zero, [[0.0, -0.2], [0.2, 0.0]], zero]}"])
    assert _free_energy_title(spherepde.run(turned, progress=False)) == "free energy F (W may raise it)"
    assert FreeEnergy.of("unnormalized", 1.0, I, I, [zero, (0.3 * I).tolist()], 0.1).dissipated


def test_a_sweeps_free_energy_title_holds_for_every_member(tmp_path):
    """A sweep of W = 0 and a rotation: the panel's title came from the base case alone, "dissipated by this flow"
    over a member whose F rises (by 1.3e-2 between two saves); it now names the members' disagreement."""
    import xarray as xr

    from spherepde.analysis.diagnostic_panels import _free_energy_title
    from spherepde.api.sweep import run_sweep

    case = seed004_without_training(["time.t_end=3.0"])
    run_sweep(case, ["model.W=[[0.0, 0.0], [0.0, 0.0]], [[0.0, -0.5], [0.5, 0.0]]"], str(tmp_path))
    with xr.open_dataset(tmp_path / "sweep.nc") as sweep:
        rises = sweep["free_energy"].diff("time").max("time").values
        assert rises[0] < 0 < rises[1]
        assert _free_energy_title(sweep) == "free energy F (dissipated in some members only)"


def test_which_models_have_a_free_energy():
    """F exists for V symmetric at beta B = 0 and for the unnormalized kernel with V = c B, B symmetric; it is
    dissipated only without a drift from W; elsewhere it is NaN."""
    I, A, zero = np.eye(2), np.diag([1.0, 0.65]), np.zeros((2, 2))
    rotation = np.array([[0.0, -1.0], [1.0, 0.0]])
    mean = np.array([0.3, 0.4])
    kuramoto = FreeEnergy.of("unnormalized", 0.0, I, 2 * I, zero, 0.25)
    assert kuramoto.dissipated and kuramoto(1.5, -0.5, mean) == pytest.approx(0.25 * 1.5 - 0.25)
    assert FreeEnergy.of("softmax", 0.0, A, A, zero, 0.1).dissipated  # beta = 0: the softmax mean is M too
    seed = FreeEnergy.of("unnormalized", 2.0, A, 3 * A, 0.5 * I, 0.1)  # w I has no tangential part
    assert seed.dissipated and seed(1.0, -0.7, mean) == pytest.approx(0.1 - 1.5 * 0.7)
    assert not FreeEnergy.of("unnormalized", 1.0, A, A, 0.1 * rotation, 0.1).dissipated
    assert not FreeEnergy.of("unnormalized", 1.0, A, A, zero, 0.1, controlled=True).dissipated
    for kernel, beta, B, V in (("softmax", 1.0, A, A), ("softmax", math.inf, I, I), ("unnormalized", 1.0, A, I),
                               ("unnormalized", 1.0, rotation, rotation), ("unnormalized", 0.0, I, rotation)):
        energy = FreeEnergy.of(kernel, beta, B, V, zero, 0.1)
        assert energy.reason and math.isnan(energy(1.0, -0.5, mean))


def test_the_particles_mean_field_interaction_is_unbiased_in_small_systems():
    """At beta B = 0, U = -1/2 <M, V M>: 400 systems of 20 independent vMF tokens on S^2 (|M| = coth 2 - 1/2),
    V = diag(1, 2, 1.5).  The systems' mean of the pair estimate -1/2 mean_{i != j} <x_i, V x_j> is within 4 of
    its standard errors of U; the plug-in -1/2 <M_n, V M_n> is below it by tr(V S) / (2 n), about 7 of them."""
    import torch

    from spherepde.model.sampling import von_mises_fisher

    V = np.diag([1.0, 2.0, 1.5])
    energy = FreeEnergy.of("softmax", 0.0, np.eye(3), V, np.zeros((3, 3)), 0.0)
    assert energy.mean_field
    kappa, systems, tokens = 2.0, 400, 20
    x = von_mises_fisher(systems * tokens, [0.0, 0.0, 1.0], kappa, torch.Generator().manual_seed(5)).numpy()
    x = x.reshape(systems, tokens, 3)
    radius = 1 / np.tanh(kappa) - 1 / kappa
    exact = -0.5 * 1.5 * radius ** 2
    pairs = np.array([energy.sample_interaction(np.nan, points) for points in x])
    plug_in = np.array([energy.interaction(np.nan, points.mean(0)) for points in x])
    error = pairs.std(ddof=1) / np.sqrt(systems)
    assert abs(pairs.mean() - exact) <= 4 * error
    assert plug_in.mean() - exact < -4 * error
