"""Claims of docs/design.md checked against the solver by independent computation: the special cases of "The model"
(a rigid rotation on S^2, and the antisymmetric V at beta = 0 that is not one, against a Fourier solver written
here) and the particles' entropy of "Diagnostics"."""

import math
from pathlib import Path

import numpy as np
from conftest import make_case
from scipy.linalg import expm
from scipy.special import i0, i1

import spherepde

DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"
KAPPA, EPS = 2.0, 0.1


def test_antisymmetric_W_is_the_rigid_rotation_of_design_special_cases():
    """design.md "The model": W antisymmetric, V = 0 gives v = W x, so a vMF(mu, kappa) start on S^2 has
    mean(t) = (coth kappa - 1 / kappa) exp(-2 eps t) exp(t W) mu (the rotation commutes with the heat flow)."""
    W = np.array([[0.0, -1.0, 0.5], [1.0, 0.0, -0.3], [-0.5, 0.3, 0.0]])
    mu = np.array([0.0, 0.6, 0.8])
    case = make_case(3, 16, model={"kernel": "unnormalized", "beta": 0.0, "V": np.zeros((3, 3)).tolist(),
                                   "W": W.tolist(), "eps": EPS},
                     initial={"kind": "vmf", "mean": mu.tolist(), "kappa": KAPPA},
                     time={"t_end": 0.5, "dt": 0.01, "save_every": 0.25}, diagnostics={"w2": False})
    result = spherepde.run(case, progress=False)
    for t, mean in zip(result.time.values, result["mean"].values):
        expected = (1 / math.tanh(KAPPA) - 1 / KAPPA) * math.exp(-2 * EPS * t) * expm(t * W) @ mu
        np.testing.assert_allclose(mean, expected, atol=1e-9)
    assert "W antisymmetric with V = 0 is a rigid rotation" in " ".join(DESIGN.read_text().split())


def own_mean_field_solution(V: np.ndarray, t_end: float, n: int = 256, dt: float = 1e-3) -> np.ndarray:
    """The S^1 equation at beta = 0, eps = 0: d_t rho = -d_theta(rho <V M, tau(theta)>), M = int x rho dtheta,
    tau = (-sin, cos), by RK4 on a Fourier grid of n points (rho_0 = vMF((1, 0), kappa = 1)); returns M(t_end)."""
    theta = 2 * np.pi * np.arange(n) / n
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    tau = np.stack([-np.sin(theta), np.cos(theta)], 1)
    wavenumber = np.fft.fftfreq(n, 1 / n)

    def rate(rho):
        flux = rho * (tau @ (V @ (rho @ x * (2 * np.pi / n))))
        return -np.real(np.fft.ifft(1j * wavenumber * np.fft.fft(flux)))

    rho = classical_rk4(rate, np.exp(np.cos(theta)) / (2 * np.pi * i0(1.0)), dt, round(t_end / dt))
    return rho @ x * (2 * np.pi / n)


def classical_rk4(rate, y: np.ndarray, dt: float, steps: int) -> np.ndarray:
    """`steps` steps of the classical fourth-order Runge-Kutta method for dy/dt = rate(y)."""
    for _ in range(steps):
        k1 = rate(y)
        k2 = rate(y + dt / 2 * k1)
        k3 = rate(y + dt / 2 * k2)
        k4 = rate(y + dt * k3)
        y = y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


def test_antisymmetric_V_at_beta_zero_is_no_rotation():
    """design.md "The model": with beta = 0 and V antisymmetric the field P_x(V M) is no rotation; the order parameter
    of a vMF(kappa = 1) start falls from I1(1) / I0(1) = 0.4464 to 0.4210 at t = 2 (the Fourier solver above)."""
    V = [[0.0, -1.0], [1.0, 0.0]]
    case = make_case(2, 32, model={"kernel": "unnormalized", "beta": 0.0, "V": V, "eps": 0.0},
                     initial={"kind": "vmf", "mean": [1.0, 0.0], "kappa": 1.0},
                     time={"t_end": 2.0, "dt": 0.01, "save_every": 1.0}, diagnostics={"w2": False})
    result = spherepde.run(case, progress=False)
    expected = own_mean_field_solution(np.array(V), 2.0)
    np.testing.assert_allclose(result["mean"].values[-1], expected, atol=1e-7)
    assert abs(result.order_parameter.values[0] - i1(1.0) / i0(1.0)) < 1e-12
    assert abs(np.linalg.norm(expected) - 0.4210) < 5e-4
    assert "V antisymmetric with beta = 0 gives rotation" not in DESIGN.read_text()


PARTICLES = """
[case]
name = "pairs"
[sphere]
dim = 2
lmax = 16
[model]
kernel = "unnormalized"
beta = 2.0
B = [[1.0, 0.3], [0.3, 0.5]]
V = [[1.0, 0.3], [0.3, 0.5]]
eps = 0.1
[initial]
kind = "vmf"
mean = [1.0, 0.0]
kappa = 1.0
[time]
t_end = 0.1
dt = 0.05
save_every = 0.1
[solver]
method = "particles"
device = "cpu"
[particles]
n = 50
save = 50
[diagnostics]
w2 = false
"""


def test_particle_entropy_is_nan_as_design_diagnostics_says(tmp_path):
    """design.md "Diagnostics": particles have no density, so their entropy is NaN and, with noise, their free
    energy; their interaction energy is the U-statistic -1/2 mean_{i != j} exp(beta <x_i, B x_j>)."""
    path = tmp_path / "pairs.toml"
    path.write_text(PARTICLES)
    result = spherepde.run(spherepde.load_case(path), progress=False)
    x = result.particles.values[-1]
    pairs = np.exp(2.0 * x @ np.array([[1.0, 0.3], [0.3, 0.5]]) @ x.T)
    n = len(x)
    assert np.isnan(result.entropy.values).all() and np.isnan(result.free_energy.values).all()
    assert abs(result.interaction_energy.values[-1] + 0.5 * (pairs.sum() - np.trace(pairs)) / (n * (n - 1))) < 1e-12
    assert "their `entropy` is NaN" in DESIGN.read_text()
