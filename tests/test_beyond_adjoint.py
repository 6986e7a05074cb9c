"""The continuous adjoint of the model beyond the seeds (spherepde/model/layered_adjoint.py, solvers/adjoint.py;
docs/model.md "Beyond the seeds"): the explicit formulas of the docs against autograd of the quadrature functional,
the hand-written operator of the seeds' model against the general one, and the continuous gradient against the
discrete one as dt halves."""

import math

import numpy as np
import pytest
import torch

from solvers.adjoint import AdjointOperator, continuous_gradient, discrete_gradient
from solvers.controlled_forward import ControlledForward, central_differences_of, evaluate_cost
from solvers.training import run_training
from spherepde.base.device import placement as make_placement
from spherepde.discretisation.bases import make_basis
from spherepde.io.case import case_from_dict
from spherepde.model.layered_adjoint import LayeredAdjoint
from spherepde.model.parameters import Head, Layout, layout_of, parameters_of

HEADS = {"softmax": (Head("softmax", 1.3), Head("softmax", 0.6)),
         "unnormalized": (Head("unnormalized", 0.9), Head("unnormalized", 0.4)),
         "softmax-inf": (Head("softmax", 1.1), Head("softmax", math.inf))}
ACTIVATION = {"tanh": (np.tanh, lambda z: 1 - np.tanh(z) ** 2),
              "softplus": (lambda z: np.log1p(np.exp(z)), lambda z: 1 / (1 + np.exp(-z)))}


def explicit_variation(layout: Layout, parts: dict, points, weights, rho, g):
    """(delta F / delta rho (P,), {group: dF/dgroup}) of one member by the formulas of docs/model.md "Beyond the
    seeds", in numpy: points (P, d), quadrature weights (P,), density rho (P,), grad phi g (P, d) tangent."""
    q = weights * rho  # the masses of the grid
    hidden = layout.hidden
    if hidden == 0:
        u = points @ parts["W"].T
        gradient = {"W": np.einsum("p,pi,pj->ij", q, g, points)}
    else:
        sigma, sigma_prime = ACTIVATION[layout.activation]
        z = points @ parts["W1"].T + parts["b"]
        a = sigma(z)
        u = a @ parts["W2"].T
        r = sigma_prime(z) * (g @ parts["W2"])  # sigma'(z) * W2^T g
        gradient = {"W2": np.einsum("p,pi,pj->ij", q, g, a), "b": q @ r, "W1": np.einsum("p,pk,pj->kj", q, r, points)}
    nonlocal_term = np.zeros_like(rho)
    gradient["B"], gradient["V"] = np.zeros_like(parts["B"]), np.zeros_like(parts["V"])
    for h, head in enumerate(layout.heads):
        B, V = parts["B"][h], parts["V"][h]
        w = g @ V  # rows V_h^T grad phi(x)
        if head.zero_temperature:
            n = points @ B  # rows B^T x
            length = np.linalg.norm(n, axis=1)
            m = n / length[:, None]
            projected = w - m * (w * m).sum(1)[:, None]  # (I - m m^T) V^T grad phi
            gradient["B"][h] = np.einsum("p,pi,pj->ij", q / length, points, projected)
        else:
            K = np.exp(head.beta * points @ B @ points.T)  # K[p, j] = exp(beta <x_p, B y_j>)
            second = np.einsum("pj,j,ja,jb->pab", K, q, points, points)  # int k y y^T rho dsigma(y)
            if head.kernel == "unnormalized":
                m = K @ (q[:, None] * points)
                nonlocal_term += (points * (K.T @ (q[:, None] * w))).sum(1)
                moment = second
            else:
                Z = K @ q
                m = (K @ (q[:, None] * points)) / Z[:, None]
                p = q / Z
                nonlocal_term += (points * (K.T @ (p[:, None] * w))).sum(1) - K.T @ (p * (w * m).sum(1))
                moment = second / Z[:, None, None] - np.einsum("pa,pb->pab", m, m)  # the softmax weights' covariance
            gradient["B"][h] = head.beta * np.einsum("p,pi,pab,pb->ia", q, points, moment, w)
        gradient["V"][h] = np.einsum("p,pi,pj->ij", q, g, m)
        u = u + m @ V.T
    v = u - points * (u * points).sum(1)[:, None]
    return (v * g).sum(1) + nonlocal_term, gradient


@pytest.mark.parametrize("dim, lmax", [(2, 10), (3, 5)])
@pytest.mark.parametrize("kernel", sorted(HEADS))
@pytest.mark.parametrize("hidden, activation", [(0, "tanh"), (3, "tanh"), (4, "softplus")])
def test_the_explicit_formulas_are_the_derivatives_of_the_quadrature_functional(dim, lmax, kernel, hidden, activation):
    """Two members, two heads, random parameters: delta F / delta rho and every group of dF/dtheta as the docs
    write them, coded in numpy, agree with LayeredAdjoint's autograd to 1e-12 relative."""
    basis = make_basis(dim, lmax, make_placement("cpu", "float64"))
    layout = Layout(dim=dim, heads=HEADS[kernel], hidden=hidden, activation=activation, train=("W", "B", "V"))
    adjoint = LayeredAdjoint(basis, layout)
    points, weights = adjoint.points, adjoint.weights
    generator = torch.Generator().manual_seed(dim + hidden)
    members = 2
    theta = 0.5 * torch.randn(members, layout.size, generator=generator, dtype=torch.float64)
    tilt = torch.randn(members, dim, generator=generator, dtype=torch.float64)
    rho = (1 + 0.5 * torch.tanh(points @ tilt.T).T) / basis.area  # positive: no vanishing-density rule
    field = torch.randn(members, points.shape[0], dim, generator=generator, dtype=torch.float64)
    g = field - points * (field * points).sum(-1, keepdim=True)  # tangent, as grad phi is
    rho_bar, theta_bar = adjoint.variation(rho, theta, g)
    for m in range(members):
        parts = {name: value.numpy() for name, value in layout.unpack(theta[m]).items()}
        value, gradient = explicit_variation(layout, parts, points.numpy(), weights.numpy(), rho[m].numpy(),
                                             g[m].numpy())
        assert np.abs(rho_bar[m].numpy() - value).max() <= 1e-12 * np.abs(value).max()
        autograd = {name: group.numpy() for name, group in layout.unpack(theta_bar[m]).items()}
        for name, expected in gradient.items():
            assert np.abs(autograd[name] - expected).max() <= 1e-12 * np.abs(expected).max(), name


def training_case(dim=2, lmax=12, kernel="softmax", beta=1.0, t_end=0.5, dt=0.05, scheme="auto", model=None,
                  control=None, field="auto"):
    """Seed 004's A2 = diag(1, 0.65) as B = V, eps = 0.05, a tilted vMF start, two layers (test_adjoint's case)."""
    diagonal = [1.0, 0.65, 0.4][:dim]
    A = [[diagonal[i] * (i == j) for j in range(dim)] for i in range(dim)]
    table = {"sphere": {"dim": dim, "lmax": lmax},
             "model": {"kernel": kernel, "beta": beta, "B": A, "V": A, "eps": 0.05} | (model or {}),
             "initial": {"kind": "vmf", "mean": [1.0, 0.2, 0.1][:dim], "kappa": 2.0},
             "time": {"t_end": t_end, "dt": dt, "scheme": scheme},
             "solver": {"device": "cpu", "field": field},
             "control": {"loss": "align", "layers": 2, "lambda_reg": 0.1} | (control or {})}
    return case_from_dict(table)


@pytest.mark.parametrize("dim, kernel, beta", [(2, "unnormalized", 1.0), (2, "softmax", 2.0), (3, "softmax", 1.5),
                                               (3, "softmax", "inf")])
def test_on_the_seeds_model_the_general_operator_is_the_hand_written_one(dim, kernel, beta):
    """AdjointOperator's hand-written nonlocal term and int grad phi x^T rho (dense transforms) against
    LayeredAdjoint's autograd with the case's theta: the same operator, to 1e-12 relative."""
    case = training_case(dim, 12 if dim == 2 else 6, kernel, beta, field="dense")
    forward = ControlledForward(case)
    basis = forward.problem.basis
    layout = layout_of(case)
    generator = torch.Generator().manual_seed(3)
    W = 0.4 * torch.randn(1, dim, dim, generator=generator, dtype=torch.float64)
    parts = layout.unpack(parameters_of(case, layout, forward.problem.placement)[:1])
    theta = layout.pack(parts | {"W": W})
    rho = basis.synthesis(forward.problem.coefficients(forward.initial())).reshape(1, -1)
    phi = basis.analysis(torch.sin(2 * basis.points[..., 0] + basis.points[..., 1]))[None]
    value, integrand = AdjointOperator(forward).rate(rho, W, phi)
    general_value, theta_bar = LayeredAdjoint(basis, layout).rate(rho, theta, phi)
    assert float((general_value - value).abs().max()) <= 1e-12 * float(value.abs().max())
    general_integrand = layout.unpack(theta_bar)["W"]
    assert float((general_integrand - integrand).abs().max()) <= 1e-12 * float(integrand.abs().max())


# Two softmax or unnormalized heads, B of head 0 and V of head 1 varying over the two layers, the two-layer
# feed-forward (hidden 3, tanh), all three groups trained with their own L2 weights.
BEYOND = {"feed_forward": "mlp", "hidden": 3, "b": [0.1, -0.2, 0.05], "W2": [[0.3, -0.1, 0.2], [0.1, 0.4, -0.3]],
          "B": [[[1.0, 0.3], [0.0, 0.8]], [[0.8, -0.2], [0.1, 1.1]]],
          "extra_heads": [{"beta": 0.5, "B": [[0.5, 0.0], [0.2, 1.0]],
                           "V": [[[0.0, 1.0], [-1.0, 0.3]], [[0.2, 0.8], [-0.9, 0.0]]]}]}
TRAIN = {"train": ["W", "B", "V"], "lambda_reg": {"W": 0.01, "B": 0.02, "V": 0.03}}


@pytest.mark.slow  # 20 s a case; the default run checks the continuous gradient in test_beyond_gradients_review.py
@pytest.mark.parametrize("kernel, scheme, order", [("unnormalized", "imex-ark436", 4), ("softmax", "imex-ars443", 3)])
def test_continuous_gradient_converges_to_the_discrete_one_at_the_scheme_order(kernel, scheme, order):
    """dJ/dB, dJ/dV and the FFN's gradient: continuous against discrete as dt halves (0.05, 0.025, 0.0125; S^1,
    t_end = 2).  Both are consistent with the same dJ/dtheta, the discrete one exact for the scheme, so their
    difference is the scheme's truncation error C dt^p (plus the dt-independent, spectrally small difference of
    the two space discretisations); each halving then divides it by 2^p, and the measured rate is asked to be
    within 0.35 of p, as for the seeds' model (tests/test_adjoint.py)."""
    groups = {"FFN": ("W1", "b", "W2"), "B": ("B",), "V": ("V",)}
    errors = {name: [] for name in groups}
    for dt in (0.05, 0.025, 0.0125):
        case = training_case(2, 16, kernel, t_end=2.0, dt=dt, scheme=scheme, model=BEYOND, control=TRAIN)
        forward = ControlledForward(case)
        layout = forward.problem.layout
        theta = forward.problem.parameters[0]
        continuous = layout.unpack(continuous_gradient(forward, None, theta).dW)
        discrete = layout.unpack(discrete_gradient(forward, None, theta).dW)
        for name, members in groups.items():
            a, b = (torch.cat([parts[k].flatten() for k in members]) for parts in (continuous, discrete))
            errors[name].append(float((a - b).norm() / b.norm()))
    rates = {name: [math.log2(e[i] / e[i + 1]) for i in range(2)] for name, e in errors.items()}
    assert all(abs(rate - order) < 0.35 for each in rates.values() for rate in each), (errors, rates)


@pytest.mark.parametrize("kernel", ["unnormalized", "softmax"])
def test_the_gradient_at_B_zero_matches_central_differences(kernel):
    """At a trained B = 0 the kernel is constant, and J is smooth in B there; the log-sum-exp bound beta |B^T x|
    is not, and its derivative 0 / 0 made dJ/dB NaN (a training from B = 0 stopped at iteration 0)."""
    case = training_case(2, 12, kernel, t_end=0.2, dt=0.05, model={"B": [[0.0, 0.0], [0.0, 0.0]]},
                         control={"train": ["B"], "layers": 1})
    forward = ControlledForward(case)
    theta = forward.problem.parameters[0]
    layout = forward.problem.layout
    gradient = layout.unpack(discrete_gradient(forward, None, theta).dW)["B"]
    differences = layout.unpack(central_differences_of(lambda t: evaluate_cost(forward, None, t), theta))["B"]
    assert bool(torch.isfinite(gradient).all()) and float(gradient.abs().max()) > 0
    assert float((gradient - differences).norm() / differences.norm()) <= 1e-6


@pytest.mark.slow  # 24 s
def test_a_training_with_the_continuous_gradient_follows_the_discrete_one():
    """control.gradient = "continuous" trains the general model: 3 gradient-descent steps (rate lr) from the
    case's theta_0 with either gradient.  Their iterates differ by delta_K <= lr sum_k |e_k| (1 + lr Lip)^(K - k),
    e_k the two gradients' difference, about eps_0 |g| (eps_0 their relative difference at theta_0, measured
    here): so |delta_3| <= 2 K lr eps_0 max_k |g_k|, the factor 2 for the change of e_k and the growth over the
    steps; the losses agree to the same order."""
    steps, rate = 3, 0.05
    control = TRAIN | {"optimizer": "gd", "iterations": steps, "learning_rate": rate}

    def case(gradient):
        return training_case(2, 32, "softmax", t_end=1.0, dt=0.025, model=BEYOND,
                             control=control | {"gradient": gradient})

    forward = ControlledForward(case("discrete"))
    theta = forward.problem.parameters[0]
    discrete = discrete_gradient(forward, None, theta).dW
    eps_0 = float((continuous_gradient(forward, None, theta).dW - discrete).norm() / discrete.norm())
    assert 0 < eps_0 < 1e-6
    continuous_run, discrete_run = run_training(case("continuous")), run_training(case("discrete"))
    names = ("W1", "b", "W2", "B", "V")
    delta = math.sqrt(sum(float(((continuous_run[name] - discrete_run[name]) ** 2).sum()) for name in names))
    start = forward.problem.layout.unpack(theta)
    moved = math.sqrt(sum(float(((discrete_run[name].values - start[name].numpy()) ** 2).sum()) for name in names))
    gradient_norm = float(discrete_run["gradient_norm"].max())
    assert moved > 0.5 * steps * rate * gradient_norm  # the steps were taken
    assert delta <= 2 * steps * rate * eps_0 * gradient_norm
    loss = discrete_run["loss"].values
    assert np.abs(continuous_run["loss"].values - loss).max() <= 2 * steps * rate * eps_0 * gradient_norm ** 2
