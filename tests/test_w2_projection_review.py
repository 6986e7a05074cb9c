"""w2_projection where Pi_# rho_0 is two atoms (dim E = 1: +-e), seed 003's decay diagnostic: exact OT on every
sphere, against POT's network simplex on all pairs, the closed form sum m (2 - 2 |<x, e>|) where the pairing by side
is optimal, and a particle run's saved tokens; before, both measures were quantised to diagnostics.w2_atoms atoms."""

import math

import numpy as np
import ot
import pytest
from test_particles import SEED_003, particle_case

from spherepde.measures import optimal_transport
from spherepde.measures.diagnostics import projection
from spherepde.measures.sample_statistics import half_sample_bias, paired_w2


def _sphere(rng, n, dim=3):
    x = rng.normal(size=(n, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _emd_w2_squared(x, y):
    """W2^2 between the empirical measures of x and y by POT's exact solver on all pairs."""
    return ot.emd2(np.full(len(x), 1 / len(x)), np.full(len(y), 1 / len(y)), ot.dist(x, y), numItermax=10**7)


def test_particle_w2_projection_onto_two_atoms_is_exact_ot_with_its_bias_and_error():
    """400 tokens on S^2 (a vMF tilted off e, so that the pairing with their initial side is far from optimal) against
    Pi of 400 initial uniform tokens, e a generic axis, w2_atoms 100: W2, the half-sample bias and the linearisation
    agree with POT on all 400 x 400 pairs (and on each half sample) to round-off, with bound 0.  Before, both
    measures were quantised to 100 atoms: W2 1.1932 for an exact 1.1891, bound 0.16."""
    rng = np.random.default_rng(3)
    e = np.array([[1.0], [2.0], [-0.5]]) / math.sqrt(5.25)
    x0 = _sphere(rng, 400)
    x = _sphere(rng, 400) + np.array([0.2, 1.0, 0.4])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    targets = projection(x0, e)
    reference = _emd_w2_squared(x, targets)
    w2, error, bound = paired_w2(x, targets, 100)
    assert w2 == pytest.approx(math.sqrt(reference), abs=1e-12) and bound == 0.0
    cost, h, _ = optimal_transport.paired_transport(x, targets, 100)
    assert h.mean() == pytest.approx(reference, abs=1e-12)  # the dual value at the potentials equals the cost
    assert error == pytest.approx(h.std(ddof=1) / math.sqrt(400) / (2 * w2), rel=1e-12)
    halves = []
    for halving in range(4):
        order = np.random.default_rng(halving).permutation(400)
        halves += [_emd_w2_squared(x[half], targets[half]) for half in np.array_split(order, 2)]
    assert half_sample_bias(x, targets, 100, w2 ** 2) == pytest.approx(np.mean(halves) - reference, abs=1e-12)


def test_eulerian_w2_projection_onto_two_atoms_is_exact_on_a_grid_of_8192_nodes():
    """Grid measures on S^2 (Gauss-Legendre in z on each half, 2 x 32 rows x 128 longitudes), E = span(e_3), rho_0
    uniform: for rho ∝ exp(100 z^2) (even, so the pairing by side is optimal) W2^2 = sum m (2 - 2 |z|) exactly,
    0.10051; for rho uniform against rho_0 ∝ 1 + z / 2 (Pi_# rho_0 = 0.625 delta_e + 0.375 delta_-e) POT on the
    8192 x 2 costs, 1.03091 (the continuum sqrt(1 + 1/16) = 1.03078).  Bound 0.  Before, the grid measure was
    quantised to 1000 atoms: 0.09510 (bound 0.033) and 1.03104."""
    g, w = np.polynomial.legendre.leggauss(32)
    z, wz = np.concatenate([(g - 1) / 2, (g + 1) / 2]), np.concatenate([w, w]) / 2
    phi = 2 * np.pi * (np.arange(128) + 0.5) / 128
    zz, pp = np.meshgrid(z, phi, indexing="ij")
    points = np.stack([np.sqrt(1 - zz ** 2) * np.cos(pp), np.sqrt(1 - zz ** 2) * np.sin(pp), zz], -1).reshape(-1, 3)
    weights = np.repeat(wz, 128)
    e3 = np.array([[0.0], [0.0], [1.0]])
    concentrated = weights * np.exp(100 * (points[:, 2] ** 2 - 1))
    concentrated /= concentrated.sum()
    value, bound = optimal_transport.w2_projection(points, concentrated, points, weights, e3)
    assert value == pytest.approx(math.sqrt(concentrated @ (2 - 2 * np.abs(points[:, 2]))), rel=1e-12)
    assert value == pytest.approx(0.10051, abs=1e-5) and bound == 0.0
    tilted = weights * (1 + points[:, 2] / 2)
    sides = np.array([tilted[points[:, 2] > 0].sum(), tilted[points[:, 2] < 0].sum()]) / tilted.sum()
    assert sides[0] == pytest.approx(0.625, abs=1e-14)
    reference = ot.emd2(weights / weights.sum(), sides, ot.dist(points, np.array([[0, 0, 1.0], [0, 0, -1.0]])))
    value, bound = optimal_transport.w2_projection(points, weights, points, tilted, e3)
    assert value == pytest.approx(math.sqrt(reference), abs=1e-12) and bound == 0.0
    assert value == pytest.approx(math.sqrt(1 + 1 / 16), abs=2e-4)


def sorted_two_atom_w2(tokens: np.ndarray) -> list:
    """W2(mu_t, Pi_# mu_0) at each save of `tokens` (saves, n, d) with E = span(e_1), by the sort formula:
    W2^2 = (1/n) (sum over the n_+ largest <x, e_1> of 2 - 2 <x, e_1> + over the rest of 2 + 2 <x, e_1>), n_+ the
    tokens with <x_0, e_1> > 0."""
    count = int((tokens[0, :, 0] > 0).sum())
    sorted_first = [np.sort(values[:, 0])[::-1] for values in tokens]
    return [math.sqrt((np.sum(2 - 2 * s[:count]) + np.sum(2 + 2 * s[count:])) / len(s)) for s in sorted_first]


def test_particle_run_at_beta_inf_stores_the_exact_w2_projection():
    """Seed 003's baseline at beta = inf (E = span(e_1)), 300 tokens from the uniform law with w2_atoms 50, every
    token saved: the stored w2_projection is the sort formula on the saved tokens, W2^2 = (1/n) (sum over the n_+
    largest <x, e_1> of 2 - 2 <x, e_1> + over the rest of 2 + 2 <x, e_1>), n_+ the tokens with <x_0, e_1> > 0, and
    w2_quantisation_bound is 0.  Before, both measures were quantised to 50 atoms: 0.00950 at t = 3 for an exact
    0.03493 (bound 0.20), and 1.0332 at t = 0 for 1.0292."""
    import spherepde

    case = particle_case(3, 300, model=SEED_003, initial={"kind": "uniform"}, particles={"save": 300, "seed": 3},
                         time={"t_end": 3.0, "dt": 0.01, "save_every": 1.5}, diagnostics={"w2_atoms": 50},
                         solver={"method": "particles"})
    dataset = spherepde.run(case, progress=False)
    for exact, stored in zip(sorted_two_atom_w2(dataset["particles"].values), dataset["w2_projection"].values):
        assert stored == pytest.approx(exact, rel=1e-10, abs=1e-14)
    assert dataset.attrs["w2_quantisation_bound"] == 0.0
    assert dataset["w2_projection"].values[0] == pytest.approx(1.0, abs=0.05)  # sqrt(int (2 - 2 |x_1|)) of uniform


def test_particle_w2_projection_above_s2_onto_two_atoms_at_any_n():
    """S^3, the linear model (beta = 0) with V = diag(2, 1, 1, 1) (E = span(e_1)), 4000 tokens: more than
    EXACT_W2_ABOVE_S2, where exact OT on the n x n pairs was refused (NaN and a note); onto the two atoms of Pi_# it
    is the sort formula at any n."""
    import spherepde

    V = np.diag([2.0, 1.0, 1.0, 1.0]).tolist()
    case = particle_case(4, 4000, model={"kernel": "unnormalized", "beta": 0.0, "V": V, "eps": 0.0},
                         initial={"kind": "uniform"}, particles={"save": 4000},
                         time={"t_end": 0.5, "dt": 0.1, "save_every": 0.5},
                         solver={"method": "particles"})
    dataset = spherepde.run(case, progress=False)
    for exact, stored in zip(sorted_two_atom_w2(dataset["particles"].values), dataset["w2_projection"].values):
        assert stored == pytest.approx(exact, rel=1e-10)
    assert "w2_projection not computed" not in dataset.attrs.get("notes", "")
