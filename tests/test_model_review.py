"""docs/model.md's equations against an independent numpy evaluation: the velocity

    v(x, t) = P_x( f_t(x) + sum_h V_{h,t} m_h[rho](x) ),   f_t = W_t x  or  W2_t sigma(W1_t x + b_t),
    m_h = N_h / Z_h (softmax),  N_h (unnormalized),  B_h^T x / |B_h^T x| (beta_h = inf),

recovered exactly from one projected Euler step of the particles (x' = (x + dt v) / |x + dt v|, so
v = (x' / <x', x> - x) / dt), the Eulerian rate -div(rho v) against a spectral derivative on S^1, the noise
eps Lap (a degree-l harmonic decays as exp(-eps l (l + d - 2) t)), and the zero-temperature invariant of seed 003.
"""

import math
import warnings

import numpy as np
import pytest
from scipy.special import erf, expit

import spherepde
from spherepde.io.case import case_from_dict

ACTIVATIONS = {"tanh": np.tanh, "relu": lambda z: np.maximum(z, 0.0), "gelu": lambda z: 0.5 * z * (1 + erf(z / 2**0.5)),
               "sigmoid": expit, "softplus": lambda z: np.logaddexp(0.0, z)}


def attention_mean(x, y, masses, kernel, beta, B):
    """m(x) (P, d) of the masses (Q,) at the points y (Q, d), by direct sums."""
    if math.isinf(beta):
        u = x @ B
        return u / np.linalg.norm(u, axis=1, keepdims=True)
    logits = beta * np.einsum("pi,ij,qj->pq", x, B, y)
    if kernel == "softmax":
        weights = np.exp(logits - logits.max(1, keepdims=True)) * masses
        return weights @ y / weights.sum(1, keepdims=True)
    return (np.exp(logits) * masses) @ y


def model_velocity(x, y, masses, heads, feed_forward):
    """v(x) of docs/model.md: heads [(kernel, beta, B, V)], feed_forward ("linear", W) or ("mlp", W1, b, W2,
    activation)."""
    if feed_forward[0] == "linear":
        u = x @ feed_forward[1].T
    else:
        _, W1, b, W2, activation = feed_forward
        u = ACTIVATIONS[activation](x @ W1.T + b) @ W2.T
    for kernel, beta, B, V in heads:
        u = u + attention_mean(x, y, masses, kernel, beta, B) @ V.T
    return u - np.sum(x * u, axis=1, keepdims=True) * x


def run(dim, model, time, particles=None, kappa=1.0):
    """The Dataset of a run of `model` (eps = 0 unless given) from a vMF law; particles when `particles` is given."""
    table = {"sphere": {"dim": dim, "lmax": 24}, "model": {"eps": 0.0} | model,
             "initial": {"kind": "vmf", "mean": [0.3, 0.5, 0.8][-dim:], "kappa": kappa}, "time": time,
             "solver": {"device": "cpu", "method": "particles" if particles else "eulerian"}}
    if particles:
        table["particles"] = particles
    with warnings.catch_warnings():  # the tiny runs' resolution and standard-error notes
        warnings.simplefilter("ignore")
        return spherepde.run(case_from_dict(table), progress=False)


def euler_velocities(positions, dt):
    """v at each saved step's start from the projected Euler steps x' = (x + dt v) / |x + dt v| (v tangent)."""
    x, x_next = positions[:-1], positions[1:]
    return (x_next / np.sum(x * x_next, axis=-1, keepdims=True) - x) / dt


def random_matrix(rng, *shape):
    return rng.normal(size=shape).round(3)


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("kernel, beta", [("softmax", 0.05), ("softmax", 1.0), ("softmax", 12.0), ("softmax", math.inf),
                                          ("unnormalized", 0.05), ("unnormalized", 1.0), ("unnormalized", 12.0)])
def test_one_head_velocity(dim, kernel, beta):
    """The seeds' model v = P_x(W x + V m): both kernels, beta small to large, and the zero-temperature limit."""
    rng = np.random.default_rng(dim)
    B, V, W = (random_matrix(rng, dim, dim) for _ in range(3))
    B /= np.linalg.norm(B, 2)  # |v| up to exp(beta |B|): one step of 1e-3 must stay short to recover v from it
    dt, n = 1e-3, 9
    ds = run(dim, {"kernel": kernel, "beta": "inf" if math.isinf(beta) else beta, "B": B.tolist(), "V": V.tolist(),
                   "W": W.tolist()}, {"t_end": dt, "dt": dt, "save_every": dt},
             particles={"n": n, "integrator": "euler", "seed": 5})
    x = ds["particles"].values
    expected = model_velocity(x[0], x[0], np.full(n, 1 / n), [(kernel, beta, B, V)], ("linear", W))
    assert np.abs(euler_velocities(x, dt)[0] - expected).max() <= 1e-10 * np.abs(expected).max()


def test_hardmax_velocity():
    """particles.beta_inf_mode = "hardmax": m(x_i) is the token x_j of largest <x_i, B x_j>."""
    rng = np.random.default_rng(7)
    B, V, W = (random_matrix(rng, 3, 3) for _ in range(3))
    dt = 1e-3
    ds = run(3, {"beta": "inf", "B": B.tolist(), "V": V.tolist(), "W": W.tolist()},
             {"t_end": dt, "dt": dt, "save_every": dt},
             particles={"n": 12, "integrator": "euler", "beta_inf_mode": "hardmax"})
    x = ds["particles"].values
    u = x[0] @ W.T + x[0][np.argmax(x[0] @ B @ x[0].T, axis=1)] @ V.T
    expected = u - np.sum(x[0] * u, axis=1, keepdims=True) * x[0]
    assert np.abs(euler_velocities(x, dt)[0] - expected).max() <= 1e-10 * np.abs(expected).max()


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_beyond_the_seeds_velocity(dim, activation):
    """Three heads (softmax, unnormalized, beta = inf), each with its own B_l, V_l on two layers, and the
    two-layer feed-forward: the step from t = dt (the boundary of the two layers) is layer 1's."""
    rng = np.random.default_rng(11)
    layers, hidden, dt, n = 2, 4, 1e-3, 11
    heads = [(kernel, beta, [random_matrix(rng, dim, dim) for _ in range(layers)],
              [random_matrix(rng, dim, dim) for _ in range(layers)])
             for kernel, beta in (("softmax", 1.5), ("unnormalized", 0.7), ("softmax", math.inf))]
    W1, b, W2 = ([random_matrix(rng, *shape) for _ in range(layers)] for shape in ((hidden, dim), (hidden,),
                                                                                   (dim, hidden)))
    table = lambda kernel, beta, Bs, Vs: {"kernel": kernel, "beta": "inf" if math.isinf(beta) else beta,  # noqa: E731
                                          "B": [B.tolist() for B in Bs], "V": [V.tolist() for V in Vs]}
    model = table(*heads[0]) | {"extra_heads": [table(*head) for head in heads[1:]], "feed_forward": "mlp",
                                "hidden": hidden, "activation": activation, "W1": [w.tolist() for w in W1],
                                "b": [w.tolist() for w in b], "W2": [w.tolist() for w in W2]}
    ds = run(dim, model, {"t_end": layers * dt, "dt": dt, "save_every": dt},
             particles={"n": n, "integrator": "euler", "seed": 3})
    x = ds["particles"].values
    recovered = euler_velocities(x, dt)
    for layer in range(layers):
        expected = model_velocity(x[layer], x[layer], np.full(n, 1 / n),
                                  [(kernel, beta, Bs[layer], Vs[layer]) for kernel, beta, Bs, Vs in heads],
                                  ("mlp", W1[layer], b[layer], W2[layer], activation))
        assert np.abs(recovered[layer] - expected).max() <= 1e-10 * np.abs(expected).max()


def test_eulerian_rate_two_heads_on_the_circle():
    """d_t rho = -div(rho v) at t = 0 of two heads (softmax and unnormalized) and W on S^1: the run's forward
    difference over h against -d_theta(rho v_theta) by FFT of the independent v, to O(h) (2.3e-4 measured)."""
    B0, V0 = np.array([[1.0, 0.3], [-0.2, 0.8]]), np.array([[0.5, 0.1], [0.3, -0.4]])
    B1, V1 = np.array([[0.2, 1.0], [0.0, 0.5]]), np.array([[0.0, 1.0], [-1.0, 0.3]])
    W = np.array([[0.0, 0.4], [-0.1, 0.2]])
    h = 1e-4
    ds = run(2, {"kernel": "softmax", "beta": 2.0, "B": B0.tolist(), "V": V0.tolist(), "W": W.tolist(),
                 "extra_heads": [{"kernel": "unnormalized", "beta": 0.7, "B": B1.tolist(), "V": V1.tolist()}]},
             {"t_end": h, "dt": h / 10, "save_every": h}, kappa=1.5)
    theta, (rho, rho_h) = ds["theta"].values, ds["density"].values
    x, tangent = np.stack([np.cos(theta), np.sin(theta)], 1), np.stack([-np.sin(theta), np.cos(theta)], 1)
    v = model_velocity(x, x, rho * 2 * np.pi / theta.size,
                       [("softmax", 2.0, B0, V0), ("unnormalized", 0.7, B1, V1)], ("linear", W))
    k = np.fft.fftfreq(theta.size, 1 / theta.size)
    flux = np.fft.fft(rho * np.sum(tangent * v, 1)) * (np.abs(k) <= 24)  # the run's band, lmax 24
    rate = np.fft.ifft(-1j * k * flux).real
    assert np.abs((rho_h - rho) / h - rate).max() <= 5e-4 * np.abs(rate).max()


@pytest.mark.parametrize("dim, degree", [(2, 2), (3, 3)])
def test_noise_is_eps_laplacian(dim, degree):
    """eps Lap: with V = W = 0 a degree-l harmonic's moment decays as exp(-eps l (l + d - 2) t) (cos 2 theta on S^1,
    x1 x2 x3 on S^2)."""
    eps, t_end = 0.3, 1.0
    ds = run(dim, {"V": np.zeros((dim, dim)).tolist(), "eps": eps}, {"t_end": t_end, "dt": 0.01, "save_every": t_end},
             kappa=3.0)
    if dim == 2:
        harmonic = np.cos(2 * ds["theta"].values)
    else:
        lat, lon = np.meshgrid(np.radians(ds["lat"].values), np.radians(ds["lon"].values), indexing="ij")
        harmonic = np.cos(lat) ** 2 * np.cos(lon) * np.sin(lon) * np.sin(lat)
    moments = (ds["density"].values * ds["cell_area"].values * harmonic).sum(axis=tuple(range(1, dim)))
    assert moments[1] / moments[0] == pytest.approx(math.exp(-eps * degree * (degree + dim - 2) * t_end), rel=1e-6)


def test_zero_temperature_invariant_needs_symmetric_VBt():
    """Seed 003 at beta = inf: for V B^T symmetric the masses of the hemispheres {+-<x, e> > 0} of its leading
    eigenvector e are invariant; for seed 003's nonsymmetric ablation (V B^T = [[1, 1, 0], [2, 1, 0], [0, 0, -2]])
    tokens cross e's plane, and the invariant plane is that of the left eigenvector (1, 1 / sqrt 2, 0)."""
    V = np.diag([-1.0, 1.0, -2.0])
    symmetric = run(3, {"beta": "inf", "B": np.diag([-1.0, -1.0, 1.0]).tolist(), "V": V.tolist()},
                    {"t_end": 3.0, "dt": 0.01, "save_every": 3.0}, particles={"n": 1000, "seed": 1}, kappa=2.0)
    x = symmetric["particles"].values
    assert (x[0, :, 0] > 0).sum() == (x[1, :, 0] > 0).sum()
    B = np.array([[-1.0, 2.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    nonsymmetric = run(3, {"beta": "inf", "B": B.tolist(), "V": V.tolist()},
                       {"t_end": 3.0, "dt": 0.01, "save_every": 3.0}, particles={"n": 1000, "seed": 1}, kappa=2.0)
    x = nonsymmetric["particles"].values
    right, left = np.array([1.0, 2**0.5, 0.0]), np.array([2**0.5, 1.0, 0.0])
    assert (x[0] @ left > 0).sum() == (x[1] @ left > 0).sum()
    assert (x[0] @ right > 0).sum() - (x[1] @ right > 0).sum() >= 10
