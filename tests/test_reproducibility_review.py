"""What a rerun reproduces, measured against the claims of docs/guide/particles.md ("Initial tokens") and
docs/guide/sweeps.md: which settings leave a seeded run bit for bit alone, and which draw another realisation."""

import numpy as np
from conftest import make_case
from test_particles import particle_case

import spherepde
from solvers.particles import run_particles

NOISY_S1 = {"kernel": "softmax", "beta": 1.0, "eps": 0.2, "V": [[1.0, 0.0], [0.0, 1.0]]}


def particles_at(result, times):
    return result["particles"].sel(time=times).values


def test_saving_more_often_keeps_a_deterministic_particle_run_and_redraws_a_noisy_one():
    """Each save time is a knot of the step grid: its interval's Gaussian draws are made together and the Strang
    splitting's half noise steps meet there, so a noisy run saved every 0.25 follows another Brownian path than the
    same seed saved every 0.5 (same steps, same initial tokens); without noise the two are the same bit for bit (save
    times that are binary fractions: other knots round the steps otherwise, by an ulp)."""
    def run(eps, save_every):
        return run_particles(particle_case(2, 200, model=NOISY_S1 | {"eps": eps},
                                           time={"t_end": 1.0, "dt": 0.125, "save_every": save_every},
                                           particles={"integrator": "heun"}))
    common = [0.0, 0.5, 1.0]
    assert np.array_equal(particles_at(run(0.0, 0.25), common), particles_at(run(0.0, 0.5), common))
    fine, coarse = particles_at(run(0.2, 0.25), common), particles_at(run(0.2, 0.5), common)
    assert np.array_equal(fine[0], coarse[0])
    # another path of the same law: the tokens part by O(sqrt(eps t)), not by round-off
    assert np.abs(fine[2] - coarse[2]).max() > 0.05


def test_saving_more_often_leaves_the_eulerian_run_bit_for_bit():
    def run(save_every):
        case = make_case(2, 16, model=NOISY_S1, time={"t_end": 1.0, "dt": 0.125, "save_every": save_every})
        return spherepde.run(case)
    fine, coarse = run(0.25), run(0.5)
    assert np.array_equal(fine["density"].sel(time=[0.5, 1.0]).values, coarse["density"].values[1:])


def test_the_seed_fixes_the_initial_tokens_across_saves_and_replicas_but_not_across_n():
    def run(n, particles=None):
        return run_particles(particle_case(2, n, model=NOISY_S1, time={"t_end": 0.1, "dt": 0.05, "save_every": 0.1},
                                           particles=particles))
    whole = run(200)
    # particles.save keeps the first tokens of the same run
    assert np.array_equal(run(200, {"save": 50})["particles"].values, whole["particles"].values[:, :50])
    # R replicas split the same n draws into R systems
    assert np.array_equal(run(200, {"replicas": 2})["particles"].values[0], whole["particles"].values[0])
    # another n is another sample, not an extension of this one
    assert not np.array_equal(run(400)["particles"].values[0, :200], whole["particles"].values[0])


def test_a_stored_case_reruns_bit_for_bit():
    first = run_particles(particle_case(3, 100, model={"eps": 0.1}, time={"t_end": 0.2, "dt": 0.05},
                                         solver={"method": "particles"}))
    again = spherepde.run(spherepde.load_case_text(first.attrs["case"]))
    assert np.array_equal(again["particles"].values, first["particles"].values)
    assert np.array_equal(again["order_parameter"].values, first["order_parameter"].values)
