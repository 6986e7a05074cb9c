"""A review of the member dimension (spherepde/api/ensemble.py): combinations tests/test_ensembles.py leaves out."""

import numpy as np
from test_ensembles import assert_same_file

from spherepde import run
from spherepde.api.ensemble import batches, run_batch
from spherepde.base.errors import NumericalFailure
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
