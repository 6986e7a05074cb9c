"""The Python interface as a researcher scripts it: spherepde.run, the ensembles of spherepde.api.ensemble."""

import numpy as np
import pytest

import spherepde
from spherepde.api.ensemble import batches, run_batch

KURAMOTO = "cases/kuramoto-s1.toml"
SHORT = ["time.t_end=0.4", "time.save_every=0.2", "time.dt=0.05", "sphere.lmax=16"]


def test_run_batch_refuses_cases_that_are_not_one_batch():
    """run_batch takes its shared keys from the first member: given a second case of another time.t_end it ran it
    with the first's (S^1 Kuramoto, t_end 0.4 beside 0.2: its Dataset ended at t = 0.2 after 4 steps, its serial
    run's at t = 0.4 after 8, a density 0.013 away) under its own case attribute.  Cases that `batches` keeps apart
    are refused, naming the key."""
    short, long = (spherepde.load_case(KURAMOTO, [*SHORT, f"time.t_end={t}"]) for t in (0.2, 0.4))
    assert batches([short, long]) == [[0], [1]]
    with pytest.raises(ValueError, match=r"cases 0 and 1 cannot run as one batch: they differ in time\.t_end"):
        run_batch([short, long], progress=False)


def test_a_batch_gives_each_member_its_serial_run():
    """The members of one batch (eps 0.25 and 0.4) each give their serial run to 1e-13 of each variable's scale, and
    an order parameter that is |int x drho| from the density and the cell areas."""
    members = [spherepde.load_case(KURAMOTO, [*SHORT, f"model.eps={eps}"]) for eps in (0.25, 0.4)]
    assert batches(members) == [[0, 1]]
    for case, batched in zip(members, run_batch(members, progress=False)):
        serial = spherepde.run(case, progress=False)
        assert batched["time"].values[-1] == 0.4 and serial.attrs["steps"] == batched.attrs["steps"] == 8
        for name in ("density", "mean", "order_parameter"):
            scale = np.abs(serial[name].values).max()
            np.testing.assert_allclose(batched[name].values, serial[name].values, rtol=0, atol=1e-13 * scale)
        theta, mass = batched["theta"].values, batched["density"].values * batched["cell_area"].values
        mean = np.stack([mass @ np.cos(theta), mass @ np.sin(theta)], axis=-1)
        np.testing.assert_allclose(batched["order_parameter"].values, np.linalg.norm(mean, axis=-1), atol=1e-14)


@pytest.mark.parametrize("keyword, value, named", [("checkpoint", "run.ckpt", "checkpoint is a"),
                                                   ("progress", "yes", "progress is True, False or None")])
def test_run_refuses_arguments_of_another_kind_before_any_work(keyword, value, named):
    """A path for `checkpoint` ran the case and then failed with "'str' object has no attribute 'resume'"; a
    string for `progress` was taken as true."""
    with pytest.raises(TypeError, match=named):
        spherepde.run(spherepde.load_case(KURAMOTO, SHORT), **{keyword: value})
