"""Seed 004 reproduced at a reduced scale as docs/guide/training.md describes it: the shipped align case trained
through the Eulerian adjoint and through the particle system, its stored numbers recomputed here with numpy alone
(J and its parts, the energy gap and min E, the three-phase test), and its figure read back."""

import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import spherepde  # noqa: E402
from spherepde.analysis.diagnostic_panels import _diagnostics  # noqa: E402

CASE = str(pathlib.Path(__file__).resolve().parents[1] / "cases" / "seed004-align-l065.toml")
REDUCED = ["time.t_end=4.0", "control.layers=4", "control.iterations=2", "time.save_every=0.25"]


def gibbs_energy(B, eps: float, points: int = 512) -> float:
    """min E of the seed's energy on S^1 by damped fixed-point iteration rho ∝ exp(U[rho] / eps) on a uniform grid
    (trapezoid rule), started from a cluster at e_1."""
    theta = 2 * np.pi * np.arange(points) / points
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    weight = 2 * np.pi / points
    kernel = np.exp(x @ np.asarray(B) @ x.T)
    rho = np.exp((np.exp(np.cos(theta)) - np.e) / eps)
    rho /= rho.sum() * weight
    for _ in range(20000):
        potential = kernel @ rho * weight
        new = np.exp((potential - potential.max()) / eps)
        new /= new.sum() * weight
        if np.abs(new - rho).max() <= 1e-13 * new.max():
            break
        rho = 0.5 * (rho + new)
    return eps * float(np.sum(rho * np.log(rho)) * weight) - 0.5 * float(rho @ kernel @ rho) * weight ** 2


def test_reduced_eulerian_training_stores_the_cost_the_gap_and_the_phases_it_computed():
    ds = spherepde.run(spherepde.load_case(CASE, overrides=REDUCED))
    eps, B, T = 0.01, np.diag([1.0, 0.65]), 4.0
    theta, rho = ds["theta"].values, ds["density"].values
    weight = 2 * np.pi / len(theta)
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    mean_T = rho[-1] @ x * weight
    W = ds["W"].values
    # J = l(mu_T) + lambda_reg / 2 int |W_t|^2 dt, W constant on 4 layers of depth 1
    assert ds["terminal_loss"].values[-1] == pytest.approx(1 - mean_T[1], abs=1e-12)
    assert ds["loss"].values[-1] == pytest.approx(1 - mean_T[1] + 0.005 * np.sum(W ** 2) * T / 4, abs=1e-12)
    entropy = np.sum(rho * np.log(np.maximum(rho, 1e-300)), axis=1) * weight
    energy = eps * entropy - 0.5 * np.einsum("ti,ij,tj->t", rho, np.exp(x @ B @ x.T), rho) * weight ** 2
    assert ds.attrs["min_energy"] == pytest.approx(gibbs_energy(B, eps), abs=1e-9)
    assert np.allclose(ds["energy_gap"].values, energy - gibbs_energy(B, eps), atol=1e-9, rtol=0)
    # the three-phase test of spherepde/analysis/turnpike.py, written out
    times, gap = ds["time"].values, ds["energy_gap"].values
    reference = np.median(gap[(times >= T / 4) & (times <= 3 * T / 4)])
    below = gap <= reference + 0.05 * (gap.max() - reference)
    centre = int(np.argmin(np.abs(times - T / 2)))
    assert below[centre]
    start, end = centre, centre
    while start > 0 and below[start - 1]:
        start -= 1
    while end < len(times) - 1 and below[end + 1]:
        end += 1
    assert ds.attrs["initial_width"] == times[start] and ds.attrs["terminal_width"] == T - times[end]
    assert ds.attrs["terminal_lift"] == pytest.approx(gap[-1] - reference, abs=1e-15)


def test_gap_panel_of_a_particle_training_names_the_interaction_gap_it_draws():
    """A particle training stores interaction_gap (I_n - I(rho_*), without eps Ent), not energy_gap: its panel drew it
    dashed with no legend, under the title of both, so that it read as the Eulerian E - min E."""
    ds = spherepde.run(spherepde.load_case(CASE, overrides=REDUCED + ["solver.method='particles'", "particles.n=32"]))
    figure = plt.figure(figsize=(13, 8))
    _diagnostics(figure, ds)
    (axis,) = [axis for axis in figure.axes if axis.get_title().startswith("energy gap")]
    (line,) = axis.get_lines()
    assert np.allclose(line.get_ydata(), ds["interaction_gap"].values, rtol=0, atol=0)
    assert line.get_linestyle() == "-"
    assert [text.get_text() for text in axis.get_legend().get_texts()] == ["interaction_gap, particles"]
    plt.close(figure)
