"""A researcher's own S^2 case written from docs/guide/case-files.md: non-symmetric B, V, a rotation-free W, a vMF
mixture, against a brute-force numpy evaluation of the model and across the options that must agree."""

import numpy as np
import pytest

import spherepde
from spherepde.base.errors import CaseError

B = [[1.0, 0.4, 0.0], [-0.2, 0.7, 0.3], [0.1, 0.0, 0.9]]
V = [[0.8, 0.3, -0.1], [0.0, 1.1, 0.2], [0.4, 0.0, 0.6]]
W = [[0.0, 0.2, 0.1], [-0.3, 0.0, 0.0], [0.0, 0.1, 0.0]]
MEANS = [[1.0, 0.0, 0.0], [0.0, 0.6, 0.8], [-0.5, -0.5, 0.2]]
KAPPAS, WEIGHTS = [2.0, 3.0, 1.0], [0.5, 0.3, 0.2]
CASE = f"""
[sphere]
dim = 3
lmax = 16
[model]
beta = 2.0
B = {B}
V = {V}
W = {W}
eps = 0.1
[initial]
kind = "vmf_mixture"
means = {MEANS}
kappas = {KAPPAS}
weights = {WEIGHTS}
[time]
t_end = 0.004
dt = 0.0005
save_every = 0.002
[diagnostics]
w2 = false
"""


def mean_drift(beta: float, eps: float, nodes: int = 60) -> np.ndarray:
    """d/dt int x rho at t = 0 = int v rho dsigma - 2 eps int x rho dsigma (Lap x = -2 x on S^2), with
    v = P_x(W x + V N / Z), by brute-force Gauss-Legendre quadrature of the analytic mixture."""
    z, gauss = np.polynomial.legendre.leggauss(nodes)
    phi = np.arange(2 * nodes) * np.pi / nodes
    zz, pp = np.meshgrid(z, phi, indexing="ij")
    s = np.sqrt(1 - zz ** 2)
    x = np.stack([s * np.cos(pp), s * np.sin(pp), zz], -1).reshape(-1, 3)
    area = np.repeat(gauss * np.pi / nodes, 2 * nodes)
    means = np.array(MEANS) / np.linalg.norm(MEANS, axis=1)[:, None]
    rho = sum(w * k / (4 * np.pi * np.sinh(k)) * np.exp(k * x @ mu) for w, k, mu in zip(WEIGHTS, KAPPAS, means))
    kernel = np.exp(beta * (x @ np.array(B)) @ x.T)
    attention = (kernel @ ((rho * area)[:, None] * x)) / (kernel @ (rho * area))[:, None]
    f = x @ np.array(W).T + attention @ np.array(V).T
    v = f - (f * x).sum(1)[:, None] * x
    return (rho * area) @ v - 2 * eps * ((rho * area) @ x)


@pytest.mark.parametrize("field", ["dense", "spectral"])
def test_own_case_mean_drift_matches_brute_force(field):
    case = spherepde.load_case_text(CASE, overrides=[f'solver.field="{field}"'])
    mean = spherepde.run(case, progress=False)["mean"].values
    h = 0.002
    drift = (-3 * mean[0] + 4 * mean[1] - mean[2]) / (2 * h)  # O(h^2) one-sided difference
    assert np.abs(drift - mean_drift(2.0, 0.1)).max() < 1e-6


def test_own_case_backends_and_schemes_agree():
    # lmax 24: the grid shtns builds is the torch backend's (below it shtns takes at least 32 latitudes)
    runs = {name: spherepde.run(spherepde.load_case_text(CASE, overrides=["sphere.lmax=24"] + extra),
                                progress=False)["density"].values
            for name, extra in [("ark436", []), ("shtns", ['solver.backend="shtns"']),
                                ("lawson", ['time.scheme="lawson-rk4"']), ("float32", ['solver.dtype="float32"'])]}
    scale = np.abs(runs["ark436"]).max()
    assert np.abs(runs["shtns"] - runs["ark436"]).max() < 1e-13 * scale
    assert np.abs(runs["lawson"] - runs["ark436"]).max() < 1e-9 * scale
    assert np.abs(runs["float32"] - runs["ark436"]).max() < 1e-5 * scale


def test_own_mixture_refusal_names_the_exact_lmax():
    # exact tail of the mixture (cross terms included) first falls below 1e-6 at lmax 209 (numpy, Legendre sums)
    with pytest.raises(CaseError, match=r"sphere\.lmax >= 209"):
        spherepde.run(spherepde.load_case_text(CASE, overrides=["initial.kappas=[700.0, 3.0, 1.0]"]), progress=False)
