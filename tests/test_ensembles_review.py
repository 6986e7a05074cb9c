"""A review of the member dimension (spherepde/api/ensemble.py): combinations tests/test_ensembles.py leaves out."""

import numpy as np
import torch
from test_ensembles import assert_same_file

from solvers.eulerian import BLOW_UP_FACTOR, departures
from spherepde import run
from spherepde.api.ensemble import batches, run_batch
from spherepde.base.device import placement
from spherepde.base.errors import NumericalFailure
from spherepde.discretisation.bases import make_basis
from spherepde.io.case import case_from_dict


def test_a_member_that_blows_up_leaves_the_others_of_its_batch_their_serial_runs():
    """S^1, time.dt = 0.05: a member of V = 6 I whose density blows up between t = 0.4 and 0.5 (|rho| 1.13e3, above
    10 x all the mass in one cell) beside members of other initial laws (uniform, a vMF mixture, a projected
    Gaussian), eps, beta, W and [diagnostics] sections, which step on after it stops.  The failing member keeps its
    serial run's last good state (t = 0.4, 5 saves) and message; every other member's file is its serial run's to
    1e-13.  Its own steps, beyond the explicit stages' stability (lmax max|v| dt = 7.01 > 4), amplify the batch's
    round-off: 2.1e-13 of its density's scale at t = 0.4 (1e-11 of 49), hence 1e-12 there."""
    def member(model, initial, diagnostics=None):
        return case_from_dict({"sphere": {"dim": 2, "lmax": 16},
                               "model": {"kernel": "unnormalized", "beta": 1.0, "eps": 0.05} | model,
                               "initial": initial, "time": {"t_end": 0.8, "save_every": 0.1, "dt": 0.05},
                               "solver": {"device": "cpu"}, "diagnostics": diagnostics or {}})

    cases = [member({"V": [[6.0, 0.0], [0.0, 6.0]]}, {"kind": "vmf", "mean": [1.0, 0.0], "kappa": 8.0}),
             member({"eps": 0.2, "beta": 2.0, "W": [[0.0, 0.3], [-0.3, 0.0]]}, {"kind": "uniform"},
                    {"w2": False, "lyapunov_p": [0.5, 1.0]}),
             member({"eps": 0.1}, {"kind": "vmf_mixture", "means": [[1.0, 0.0], [0.0, 1.0]], "kappas": [3.0, 1.0]}),
             member({}, {"kind": "projected_gaussian", "mean": [0.0, 1.0], "covariance": [[0.5, 0.0], [0.0, 0.5]]},
                    {"tail_tol": 1e-3})]
    assert batches(cases) == [[0, 1, 2, 3]]
    failed, *others = run_batch(cases, progress=False)
    assert isinstance(failed, NumericalFailure)
    try:
        run(cases[0], progress=False)
    except NumericalFailure as serial:
        assert str(failed) == str(serial)
        assert np.allclose(failed.dataset["time"].values, [0.0, 0.1, 0.2, 0.3, 0.4], rtol=0, atol=1e-15)
        assert_same_file(failed.dataset, serial.dataset, 1e-12)
    for case, dataset in zip(cases[1:], others):
        assert dataset.attrs["status"] == "completed" and dataset.sizes["time"] == 9
        assert_same_file(dataset, run(case, progress=False), 1e-13)


def test_a_blown_up_density_is_named_by_its_peak_the_same_in_a_batch_as_alone():
    """A density of values near 1e216 that cancel (+-1e216 in two cells of one ring besides a uniform law): its
    mass is a sum whose round-off alone is of order 1e200, so that the mass drift it reported depended on the
    product's blocking, a batch's against a run alone (-6.2e199 against -1 in a review).  The peak 1e216, a
    maximum, is the same in any order: the reason names it, for the member alone and in a batch of three, while a
    member whose mass drifted without a peak is still told so."""
    basis = make_basis(3, 8, placement("cpu", "float64"))
    weights = basis.weights.double().numpy().reshape(-1)
    uniform = np.full(weights.size, 1 / weights.sum())
    blown = uniform.copy()
    blown[:2] = [1e216, -1e216]
    batch = np.stack([uniform, blown, uniform * (1 + 1e-3)])
    alone = departures(blown[None], weights, np.ones(1), torch.float64)
    together = departures(batch, weights, np.ones(3), torch.float64)
    bound = BLOW_UP_FACTOR / weights.min()
    assert alone == [together[1]] and together[0] is None
    assert alone[0] == f"|rho| reached {1e216:.3g}, above {bound:.3g} (10 x all the mass in one cell)"
    assert together[2].startswith("the mass drifted from 1 by 0.001")
