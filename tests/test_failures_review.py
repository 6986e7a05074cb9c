"""Review of numerical failures across run kinds (docs/design.md "Command line": exit 3, the last good state kept;
docs/guide/numerics.md "The eps = 0 concentration")."""

import re
import warnings

import numpy as np
import pytest

import spherepde
from spherepde.base.errors import NumericalFailure
from spherepde.io.case import case_from_dict


def concentrating_s1(dt: float):
    """Softmax on S^1, B = V = I, beta = 4, eps = 0, lmax 16, rk4 at time.dt = dt: the density concentrates past the
    grid (its spectral tail 0.12 already at t = 2) and the run ends in a numerical failure."""
    return case_from_dict({"sphere": {"dim": 2, "lmax": 16},
                           "model": {"kernel": "softmax", "beta": 4.0, "eps": 0.0},
                           "initial": {"kind": "vmf", "mean": [1.0, 0.0], "kappa": 1.0},
                           "time": {"t_end": 20.0, "save_every": 2.0, "dt": dt, "scheme": "rk4"},
                           "solver": {"device": "cpu"}, "diagnostics": {"w2": False}})


def failure_message(case) -> str:
    with pytest.raises(NumericalFailure) as failure, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the resolution lost before the failure
        spherepde.run(case, progress=False)
    return str(failure.value)


def test_a_failure_past_the_step_bound_of_an_under_resolved_run_says_it_was_under_resolved():
    # The failure named only the step beyond the transport's bound and its dt; following that advice failed again at
    # the same save (dt 0.2 -> 0.191 -> 0.127 -> ...), the speed growing past |V| = 1, which the softmax mean (a point
    # of the unit disc) cannot give a density: the state was no longer resolved, and the message now says so too.
    first = failure_message(concentrating_s1(0.2))
    said = r"it was under-resolved after t = 0 \(spectral tail (\S+) at the last save.*take time.dt below (\S+)$"
    found = re.search(said, first)
    assert found and float(found[1]) > 1e-6, first
    again = failure_message(concentrating_s1(float(found[2])))
    speed = re.search(r"lmax max\|v\| dt = 16 x (\S+) x", again)
    assert "the last good state (t = 4)" in first and "the last good state (t = 4)" in again, again
    assert "it was under-resolved after t = 0" in again and speed and float(speed[1]) > 1.0, again


def test_a_particle_failure_after_steps_too_long_for_the_drift_names_them():
    """The unnormalized kernel at beta = 10 on S^1 (n = 100, Heun, dt = 0.1): the predictor leaves the sphere by
    h |v| ~ 10^3, where exp(beta <x, y>) overflows, and the run failed saying only "a particle position became
    non-finite".  The contraction measured at t = 0 is now its cause: at least the rate along one Euler chord,
    computed here from the tokens (v = P_x(m), m_i = (1/n) sum_j exp(beta <x_i, x_j>) x_j), and far beyond the
    integrators' stability (2 a step)."""
    case = case_from_dict({"sphere": {"dim": 2, "lmax": 16},
                           "model": {"kernel": "unnormalized", "beta": 10.0, "eps": 0.0},
                           "initial": {"kind": "uniform"}, "time": {"t_end": 0.5, "save_every": 0.5, "dt": 0.1},
                           "solver": {"method": "particles"},
                           "particles": {"n": 100, "integrator": "heun", "save": 100}})
    with pytest.raises(NumericalFailure) as failure:
        spherepde.run(case, progress=False)
    said = re.search(r"non-finite between t = 0 and 0.5; the last good state \(t = 0\) is kept; time.dt: steps of 0.1 "
                     r"are too long for the drift \(measured at t = 0\): it contracts along the flow at a rate of at "
                     r"least (\S+), (\S+) a step", str(failure.value))
    assert said, str(failure.value)
    x = failure.value.dataset["particles"].values[0]

    def velocity(points):
        m = np.exp(10.0 * points @ points.T) @ points / len(points)
        return m - (m * points).sum(1, keepdims=True) * points

    h, v = 0.1, velocity(x)
    y = x + h * v
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    chord_rate = -((velocity(y) - v) * (y - x)).sum() / np.square(y - x).sum()
    rate = float(said[1])
    assert rate >= chord_rate * (1 - 1e-3) and h * rate > 2 and float(said[2]) == pytest.approx(h * rate, rel=1e-2)


def test_a_sweep_says_once_where_a_failed_member_lost_its_resolution(tmp_path):
    """A failed member's status now says that it was under-resolved after t (RunRecord.failure): the sweep's line for
    it added the same "under-resolved after t = 0" again; a member that completed under-resolved keeps the note."""
    from spherepde.api.sweep import _progress_line, plan

    (member,) = plan(concentrating_s1(0.2), ["model.beta=4"], str(tmp_path))
    status = failure_message(concentrating_s1(0.2))
    failed = _progress_line(member, {"member": 0, "status": f"failed: {status}", "resolved_until": 0.0})
    completed = _progress_line(member, {"member": 0, "status": "completed", "resolved_until": 2.0})
    assert failed.count("under-resolved after t = 0") == 1, failed
    assert completed.endswith("completed; under-resolved after t = 2 (see its notes)"), completed
