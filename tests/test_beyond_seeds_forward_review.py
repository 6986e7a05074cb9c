"""The forward model beyond the seeds (docs/model.md "Beyond the seeds") against solvers written here, without
spherepde's code:

- S^1: a Fourier collocation solver of d_t rho = eps rho'' - (rho v)' (the kernel integrals by the trapezoid rule,
  spectrally accurate on the circle; Lawson RK4, the diffusion exact), through three heads (softmax, unnormalized,
  beta = inf) with nonsymmetric B and V per layer, a two-layer feed-forward and noise, over three layers whose
  boundaries are no multiple of the run's step;
- S^2: the exact solution of a beta = inf head with an orthogonal B (m = B^T x, so v = P_x(V_l B^T x) is linear):
  rho_t(x) = rho_0(y) / (|det M| |M^-1 x|^3), y = M^-1 x / |M^-1 x|, M the product of the layers' exp(V_l B^T dt);
- particles: the token ODE dx_i/dt = v[mu_n](x_i) integrated by scipy's DOP853 layer by layer;
- the diagnostics a one-head model beyond the seeds defines (interaction and free energy, alignments) by quadrature;
- the feed-forward's softplus log(1 + e^z) at large z.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp
from scipy.linalg import expm
from scipy.special import erf, expit, i0

import spherepde
from spherepde.io.case import case_from_dict
from spherepde.model.parameters import Head, Layout

ACTIVATIONS = {"tanh": np.tanh, "relu": lambda z: np.maximum(z, 0.0), "gelu": lambda z: 0.5 * z * (1 + erf(z / 2**0.5)),
               "sigmoid": expit, "softplus": lambda z: np.logaddexp(0.0, z)}

# Three layers of three heads on S^1 (nonsymmetric B and V; head 2 at beta = inf) and a two-layer feed-forward.
CIRCLE_MODEL = {
    "kernel": "softmax", "beta": 1.5,
    "B": [[[1.0, 0.4], [-0.3, 0.8]], [[0.2, -1.0], [0.7, 0.5]], [[-0.6, 0.3], [0.9, 1.1]]],
    "V": [[[0.9, -0.5], [0.3, 0.4]], [[-0.2, 0.8], [-0.6, 0.7]], [[1.2, 0.1], [-0.4, 0.3]]],
    "extra_heads": [{"kernel": "unnormalized", "beta": 0.7, "B": [[0.5, -0.2], [0.6, 1.0]],
                     "V": [[[0.3, 0.2], [-0.1, 0.4]], [[0.6, -0.2], [0.1, 0.2]], [[-0.3, 0.2], [0.4, 0.1]]]},
                    {"kernel": "softmax", "beta": "inf", "B": [[0.7, 0.5], [-0.4, 0.9]],
                     "V": [[0.2, -0.3], [0.25, 0.1]]}],
    "feed_forward": "mlp", "hidden": 3,
    "W1": [[0.8, -0.3], [0.2, 0.9], [-0.5, 0.4]], "b": [[0.3, -0.2, 0.1], [-0.4, 0.2, 0.5], [0.0, 0.1, -0.3]],
    "W2": [[0.5, -0.4, 0.2], [0.1, 0.3, -0.6]],
}


def run(table):
    with warnings.catch_warnings():  # the small runs' resolution notes
        warnings.simplefilter("ignore")
        return spherepde.run(case_from_dict(table), progress=False)


def layer_value(value, layer, rank=2):
    """Layer `layer`'s matrix (rank 2) or vector (rank 1) of a case key, a list of one per layer or one value."""
    value = np.asarray(value, dtype=float)
    return value[layer] if value.ndim == rank + 1 else value


def heads_of(model, dim):
    """[(kernel, beta, B key, V key)] of head 0 and model.extra_heads, the extra heads' keys defaulted as the docs
    say (head 0's kernel and beta, identity B and V)."""
    tables = [model] + list(model.get("extra_heads", ()))
    return [(table.get("kernel", model["kernel"]), float(table.get("beta", model["beta"])),
             table.get("B", np.eye(dim)), table.get("V", np.eye(dim))) for table in tables]


def kernel_matrices(model, layer, x, y):
    """[exp(beta_h <x_p, B_{h,l} y_q>) (P, Q), None at beta_h = inf] of every head on layer `layer`."""
    return [None if math.isinf(beta) else np.exp(beta * x @ layer_value(B, layer) @ y.T)
            for _, beta, B, _ in heads_of(model, x.shape[1])]


def velocity(model, layer, x, y, masses, kernels=None):
    """v(x) = P_x(f_l(x) + sum_h V_{h,l} m_h(x)) (P, d) of the masses (Q,) at the points y (Q, d), direct sums
    (`kernels`: kernel_matrices(model, layer, x, y), computed here when not given)."""
    kernels = kernel_matrices(model, layer, x, y) if kernels is None else kernels
    if model.get("feed_forward") == "mlp":
        z = x @ layer_value(model["W1"], layer).T + layer_value(model["b"], layer, 1)
        u = ACTIVATIONS[model.get("activation", "tanh")](z) @ layer_value(model["W2"], layer).T
    else:
        u = x @ layer_value(model.get("W", np.zeros((x.shape[1],) * 2)), layer).T
    for (kernel, beta, B, V), matrix in zip(heads_of(model, x.shape[1]), kernels):
        B, V = layer_value(B, layer), layer_value(V, layer)
        if math.isinf(beta):
            m = x @ B / np.linalg.norm(x @ B, axis=1, keepdims=True)
        else:
            weights = matrix * masses
            m = weights @ y / (weights.sum(1, keepdims=True) if kernel == "softmax" else 1.0)
        u = u + m @ V.T
    return u - np.sum(x * u, axis=1, keepdims=True) * x


def circle_solution(model, eps, rho0, t_end, layers, saves, n=64, steps_per_layer=100):
    """rho at the times `saves` (on n points) of d_t rho = eps rho'' - (rho v)' on S^1, layer l on [l, l + 1) t_end / L:
    Fourier collocation, Lawson RK4 (the diffusion exp(-eps k^2 t) exact), `steps_per_layer` steps a layer."""
    theta = 2 * np.pi * np.arange(n) / n
    x, tangent = np.stack([np.cos(theta), np.sin(theta)], 1), np.stack([-np.sin(theta), np.cos(theta)], 1)
    k = np.fft.rfftfreq(n, 1 / n)
    h = t_end / layers / steps_per_layer
    half = np.exp(-eps * k**2 * h / 2)

    def rate(c, layer):
        rho = np.fft.irfft(c, n)
        v = np.sum(tangent * velocity(model, layer, x, x, rho * 2 * np.pi / n, kernels[layer]), axis=1)
        return -1j * k * np.fft.rfft(rho * v)

    kernels = [kernel_matrices(model, layer, x, x) for layer in range(layers)]

    c, found = np.fft.rfft(rho0(theta)), {}
    for step in range(layers * steps_per_layer + 1):
        for t in saves:
            if abs(step * h - t) < h / 2:
                found[t] = np.fft.irfft(c, n)
        if step == layers * steps_per_layer:
            break
        layer = step // steps_per_layer
        k1 = rate(c, layer)
        k2 = rate(half * (c + h / 2 * k1), layer)
        k3 = rate(half * c + h / 2 * k2, layer)
        k4 = rate(half**2 * c + h * half * k3, layer)
        c = half**2 * c + h / 6 * (half**2 * k1 + 2 * half * (k2 + k3) + k4)
    return theta, [found[t] for t in saves]


def on_points(rho, theta):
    """The trigonometric interpolant of rho (n equispaced values) at the angles theta."""
    c = np.fft.rfft(rho) / rho.size
    k = np.arange(c.size)
    return np.real(np.exp(1j * np.outer(theta, k)) @ (c * np.where(k == 0, 1, 2)))


def vmf_circle(mean, kappa):
    return lambda theta: np.exp(kappa * (mean[0] * np.cos(theta) + mean[1] * np.sin(theta))) / (2 * np.pi * i0(kappa))


@pytest.mark.slow  # 2.7 s on a loaded machine
def test_three_heads_mlp_layers_and_noise_on_the_circle_are_the_independent_solution():
    """The density at both saves (after layer switches at t = 1/6 and 1/3, no multiple of dt = 0.01) within 2e-9 of
    the collocation solver's, the order parameter within 1e-10.  Measured (gelu): 1.4e-10 and 2e-12 at t = 0.5 with
    lmax 24, dt = 0.01, against 96 points and 100 steps a layer (2.8e-10 against 48 points; 400 steps a layer move
    the reference by less than 1e-12); at lmax 48, dt = 0.005 the run is 7e-12 from the reference at 128 points: the
    difference is the run's time error.  A switch of layer one step late would move the density by about 1e-3."""
    mean, kappa, eps, t_end, layers = (0.6, 0.8), 2.0, 0.05, 0.5, 3
    model = CIRCLE_MODEL | {"activation": "gelu", "eps": eps}
    ds = run({"sphere": {"dim": 2, "lmax": 24}, "model": model,
              "initial": {"kind": "vmf", "mean": list(mean), "kappa": kappa},
              "time": {"t_end": t_end, "dt": 0.01, "save_every": 0.25}, "solver": {"device": "cpu"}})
    saves = [float(t) for t in ds["time"].values]
    theta, solution = circle_solution(model, eps, vmf_circle(mean, kappa), t_end, layers, saves, n=96)
    for index, rho in enumerate(solution):
        density = ds["density"].values[index]
        assert np.abs(on_points(rho, ds["theta"].values) - density).max() <= 2e-9
        weights = rho * 2 * np.pi / rho.size
        mean_t = np.array([weights @ np.cos(theta), weights @ np.sin(theta)])
        assert float(ds["order_parameter"].values[index]) == pytest.approx(np.linalg.norm(mean_t), abs=1e-10)
        assert float(ds["mass"].values[index]) == pytest.approx(1.0, abs=1e-14)


def test_zero_temperature_head_with_an_orthogonal_B_is_the_exact_linear_flow_on_the_sphere():
    """S^2, beta = inf with B orthogonal: m = B^T x and v = P_x(V_l B^T x), a linear flow whose density is known
    in closed form (module docstring), V changing at the layer boundary t = 0.1; the two-layer feed-forward's
    default W2 = 0 adds nothing.  Measured, relative to max rho: 3.5e-10 at t = 0.1 and 1.7e-9 at t = 0.2 (lmax 24,
    dt = 0.01; 2.8e-10 at t = 0.1 with dt = 0.005, 1.2e-6 at t = 0.2 with lmax 12: the grid's truncation)."""
    R = expm(np.array([[0.0, -0.8, -0.5], [0.8, 0.0, -0.3], [0.5, 0.3, 0.0]]))
    Vs = [np.array([[0.9, -0.5, 0.2], [0.3, 0.4, -0.1], [-0.2, 0.6, 0.7]]),
          np.array([[0.2, -0.6, 0.3], [0.7, 0.5, 0.0], [0.4, 0.1, -0.5]])]
    mean, kappa, t_end = np.array([0.3, 0.5, 0.8]) / np.linalg.norm([0.3, 0.5, 0.8]), 1.0, 0.2
    ds = run({"sphere": {"dim": 3, "lmax": 24},
              "model": {"kernel": "softmax", "beta": "inf", "B": R.tolist(), "V": [V.tolist() for V in Vs],
                        "feed_forward": "mlp", "hidden": 2, "eps": 0.0},
              "initial": {"kind": "vmf", "mean": mean.tolist(), "kappa": kappa},
              "time": {"t_end": t_end, "dt": 0.01, "save_every": 0.1}, "solver": {"device": "cpu"}})
    lat, lon = np.meshgrid(np.radians(ds["lat"].values), np.radians(ds["lon"].values), indexing="ij")
    x = np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], -1)
    for index, t in enumerate(ds["time"].values):
        M = np.eye(3)
        for layer, V in enumerate(Vs):
            M = expm(V @ R.T * np.clip(t - layer * t_end / 2, 0.0, t_end / 2)) @ M
        z = x @ np.linalg.inv(M).T
        length = np.linalg.norm(z, axis=-1)
        y = z / length[..., None]
        exact = kappa / (4 * np.pi * np.sinh(kappa)) * np.exp(kappa * y @ mean) / (abs(np.linalg.det(M)) * length**3)
        assert np.abs(ds["density"].values[index] - exact).max() <= 1e-8 * exact.max()


def token_solution(model, x0, t_end, layers, saves):
    """The tokens (n, d) at the times `saves` of dx_i/dt = v[mu_n](x_i), mu_n = (1/n) sum_j delta_{x_j} (each token
    among its own keys), layer l on [l, l + 1) t_end / L: DOP853 at rtol 1e-13, restarted at each boundary."""
    n, d = x0.shape
    found, state = {0.0: x0}, x0.ravel()
    for layer in range(layers):
        start, stop = layer * t_end / layers, (layer + 1) * t_end / layers
        solution = solve_ivp(lambda t, y: velocity(model, layer, y.reshape(n, d), y.reshape(n, d),
                                                   np.full(n, 1 / n)).ravel(),
                             (start, stop), state, method="DOP853", rtol=1e-13, atol=1e-14, dense_output=True)
        found |= {t: solution.sol(t).reshape(n, d) for t in saves if start < t <= stop}
        state = solution.y[:, -1]
    return [found[t] for t in saves]


def test_particles_of_three_heads_and_an_mlp_over_three_layers_are_the_token_ode():
    """Six tokens on S^1 by the particles' rk4 at dt = 0.005 against DOP853: within 1e-10 at t = 0.25 and 0.5 (after
    the layer boundaries 1/6 and 1/3, no multiple of the step).  Measured: 1.2e-12 here, 1.8e-11 at dt = 0.01 and
    3e-14 at dt = 0.002 (fourth order: the layers switch at their times, not at a step).  The order parameter is that
    of the tokens."""
    model = CIRCLE_MODEL | {"activation": "sigmoid", "eps": 0.0}
    ds = run({"sphere": {"dim": 2, "lmax": 16}, "model": model,
              "initial": {"kind": "vmf", "mean": [0.6, 0.8], "kappa": 2.0},
              "time": {"t_end": 0.5, "dt": 0.005, "save_every": 0.25},
              "solver": {"device": "cpu", "method": "particles"},
              "particles": {"n": 6, "seed": 2, "integrator": "rk4", "save": 6}, "diagnostics": {"w2": False}})
    tokens = ds["particles"].values
    saves = [float(t) for t in ds["time"].values]
    for index, expected in enumerate(token_solution(model, tokens[0], 0.5, 3, saves)):
        assert np.abs(tokens[index] - expected).max() <= 1e-10
        assert float(ds["order_parameter"].values[index]) == pytest.approx(np.linalg.norm(expected.mean(0)),
                                                                           abs=1e-10)


def test_one_head_with_an_mlp_has_the_energies_and_alignments_of_its_density():
    """One unnormalized head (B symmetric, V = 1.5 B) beside a softplus feed-forward on S^1 keeps the one-head
    diagnostics, each that of the run's own density by the trapezoid rule: interaction_energy
    -1/2 sum_pq w_p w_q exp(beta <x_p, B x_q>) rho_p rho_q, free_energy eps S + (1.5 / beta) interaction_energy,
    alignment_E and alignment_F of V B^T's and V's leading eigenvector (both B's).  Measured: 1e-15."""
    B = np.array([[1.0, 0.3], [0.3, 0.5]])
    beta, eps = 0.8, 0.1
    ds = run({"sphere": {"dim": 2, "lmax": 24},
              "model": {"kernel": "unnormalized", "beta": beta, "B": B.tolist(), "V": (1.5 * B).tolist(), "eps": eps,
                        "feed_forward": "mlp", "hidden": 2, "activation": "softplus", "W1": [[0.8, -0.3], [0.2, 0.9]],
                        "b": [0.3, -0.2], "W2": [[0.5, -0.4], [0.1, 0.3]]},
              "initial": {"kind": "vmf", "mean": [0.6, 0.8], "kappa": 2.0},
              "time": {"t_end": 0.2, "dt": 0.01, "save_every": 0.2}, "solver": {"device": "cpu"}})
    theta = ds["theta"].values
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    e = np.linalg.eigh(B)[1][:, -1]
    for index in range(ds["time"].size):
        rho = ds["density"].values[index]
        masses = rho * 2 * np.pi / theta.size
        energy = -0.5 * masses @ np.exp(beta * x @ B @ x.T) @ masses
        assert float(ds["interaction_energy"].values[index]) == pytest.approx(energy, rel=1e-13)
        free = eps * masses @ np.log(rho) + 1.5 / beta * energy
        assert float(ds["free_energy"].values[index]) == pytest.approx(free, rel=1e-13)
        for name in ("alignment_E", "alignment_F"):
            assert float(ds[name].values[index]) == pytest.approx(masses @ (x @ e) ** 2, rel=1e-13)


def test_softplus_is_log_one_plus_exp_at_large_preactivations():
    """f = W2 softplus(W1 x + b) with pre-activations up to 40 on the circle: log(1 + e^z) to round-off, and its
    derivative 1 / (1 + e^-z) (the trainings' gradient).  Before 0.2.0's fix torch's softplus returned z above
    z = 20: f off by e^-20 = 2.1e-9, its derivative by as much."""
    layout = Layout(dim=2, heads=(Head("softmax", 1.0),), hidden=1, activation="softplus")
    theta = torch.linspace(0.0, 2 * math.pi, 721, dtype=torch.float64)
    x = torch.stack([torch.cos(theta), torch.sin(theta)], 1)
    W1 = torch.tensor([[30.0, 0.0]], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([10.0], dtype=torch.float64)
    W2 = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    f = layout.feed_forward({"W1": W1, "b": b, "W2": W2}, x)
    z = 30.0 * np.cos(theta.numpy()) + 10.0
    assert np.abs(f[:, 0].detach().numpy() - np.logaddexp(0.0, z)).max() <= 1e-14 * 40
    (gradient,) = torch.autograd.grad(f[:, 0].sum(), W1)
    assert gradient[0, 0].item() == pytest.approx(expit(z) @ np.cos(theta.numpy()), abs=1e-12)
