"""The Eulerian velocity of the model beyond the seeds against the model's integrals evaluated independently: the
analytic vMF density, a fine quadrature of its own (not the basis grid), docs/model.md "Beyond the seeds"'s
v = P_x(W2_l sigma(W1_l x + b_l) + sum_h V_{h,l} m_h[rho](x)) written out in numpy, on every layer."""

import numpy as np
from scipy.special import ive

from solvers.forward_problem import ForwardProblem
from spherepde.io.case import load_case_text

V_LAYERS = [[[0.9, -0.2], [0.1, 0.7]], [[0.2, 0.5], [-0.3, 0.1]], [[1.0, 0.0], [0.0, 1.0]]]
CASE = f"""[sphere]
dim = 2
lmax = 32
[model]
kernel = 'unnormalized'
beta = 1.5
B = [[1.0, 0.3], [0.0, 0.8]]
V = {V_LAYERS}
eps = 0.05
feed_forward = 'mlp'
hidden = 3
activation = 'softplus'
b = [0.1, -0.2, 0.05]
W2 = [[0.3, -0.1, 0.2], [0.1, 0.4, -0.3]]
extra_heads = [{{kernel = 'softmax', beta = 3.0, B = [[0.5, 0.0], [0.2, 1.0]], V = [[0.0, 1.0], [-1.0, 0.3]]}}]
[initial]
kind = 'vmf'
mean = [1.0, 0.5]
kappa = 1.0
[time]
t_end = 0.3
dt = 0.05
"""


def attention_mean(x, B, beta, kernel, y, masses):
    """m(x) = N / Z (softmax) or N (unnormalized), N = sum_j exp(beta <x, B y_j>) y_j q_j."""
    k = np.exp(beta * x @ np.asarray(B) @ y.T) * masses
    return k @ y / (k.sum(1)[:, None] if kernel == "softmax" else 1.0)


def test_two_heads_an_mlp_and_per_layer_values_are_the_velocity_of_the_model():
    """The layered transport's tangent components at the grid points on each of 3 layers (V of head 0 per layer)
    against a 20000-point trapezoid rule on the analytic vMF(kappa = 1) density: measured 1.8e-15 of max|v| = 1.8
    (lmax 32 holds the vMF to round-off); the layers differ by 0.25 to 1.25, so a value matrix from the wrong layer
    fails it."""
    case = load_case_text(CASE)
    model, head = case["model"], case["model"]["extra_heads"][0]
    problem = ForwardProblem(case)
    state, drives = problem.initial(), problem.layer_drives()
    points, frame = problem.transport.points.numpy(), problem.transport.frame.numpy()
    angles = 2 * np.pi * np.arange(20000) / 20000
    y = np.stack([np.cos(angles), np.sin(angles)], -1)
    mean = np.array([2.0, 1.0]) / np.sqrt(5.0)
    masses = np.exp(y @ mean - 1) / (2 * np.pi * ive(0, 1.0)) * (2 * np.pi / len(angles))
    hidden = np.log1p(np.exp(points @ np.asarray(model["W1"]).T + np.asarray(model["b"])))
    feed_forward = hidden @ np.asarray(model["W2"]).T
    second_head = attention_mean(points, head["B"], 3.0, "softmax", y, masses) @ np.asarray(head["V"]).T
    first = attention_mean(points, model["B"], 1.5, "unnormalized", y, masses)
    for layer, V in enumerate(V_LAYERS):
        u = feed_forward + first @ np.asarray(V).T + second_head
        expected = np.einsum("kpi,pi->kp", frame, u)
        v = problem.transport.velocity(state, drives[layer])[1][0].numpy()
        assert np.abs(v - expected).max() <= 1e-13 * np.abs(expected).max(), layer
