"""The particle solver and the particle training on the model beyond the seeds (spherepde.model.parameters:
several heads, B and V per layer and trained, a two-layer feed-forward): solvers/particle_field.py's HeadsField,
solvers.particles.ParticleSystem.general and solvers/particle_training.py's dJ/dtheta, from the case keys
([model] extra_heads, per-layer B / V / W lists, feed_forward = "mlp" with hidden, activation, W1, b, W2;
[control] train and lambda_reg per group)."""

import math

import numpy as np
import pytest
import torch

from solvers.controlled_forward import central_differences_of
from solvers.particle_field import HeadsField
from solvers.particle_training import ParticleControl, run_particle_training
from solvers.particles import ParticleSystem, head_model, run_members
from spherepde.base.errors import CaseError
from spherepde.io.case import case_from_dict
from spherepde.model.attention import ModelBatch
from spherepde.model.parameters import ACTIVATIONS, Head, Layout

B = [[1.0, 0.2], [0.1, 0.65]]
V = [[0.8, -0.3], [0.4, 1.0]]
W = [[0.1, 0.3], [-0.2, 0.4]]
# a second head: its own kernel, temperature, B and V
B2 = [[0.7, -0.4], [0.3, 1.1]]
V2 = [[-0.5, 0.6], [0.2, 0.3]]
# a two-layer feed-forward of 3 hidden units (two layers of it)
W1 = [[[0.9, -0.3], [0.2, 0.7], [-0.6, 0.4]], [[0.5, 0.1], [-0.8, 0.3], [0.4, -0.2]]]
HIDDEN_BIAS = [[0.1, -0.2, 0.3], [0.0, 0.25, -0.15]]
W2 = [[[0.3, -0.5, 0.2], [0.4, 0.1, -0.3]], [[-0.2, 0.6, 0.1], [0.3, -0.1, 0.5]]]


def seeds_case(kernel="softmax", eps=0.1, integrator="heun", replicas=2, control=None, beta=1.3, mode=None,
               n=16, seed=3, **model):
    """S^1, a nonsymmetric B, V and W, `replicas` systems of n / replicas tokens; `model`: more [model] keys (or
    None to drop one)."""
    particles = {"n": n, "seed": seed, "integrator": integrator, "replicas": replicas, "save": n}
    section = {"kernel": kernel, "beta": beta, "B": B, "V": V, "W": W, "eps": eps} | model
    table = {"case": {"name": "beyond"}, "sphere": {"dim": 2, "lmax": 16},
             "model": {key: value for key, value in section.items() if value is not None},
             "initial": {"kind": "vmf", "mean": [1.0, 0.5], "kappa": 1.0},
             "time": {"t_end": 0.6, "dt": 0.05, "save_every": 0.2},
             "solver": {"method": "particles", "device": "cpu", "field": "dense"},
             "particles": particles | ({"beta_inf_mode": mode} if mode else {})}
    if control is not None:
        table["control"] = control
        table["time"]["dt"] = 0.1
    return case_from_dict(table)


def written_out(points, heads, feed_forward):
    """v = P_x(f(x) + sum_h V_h m_h) at one system's points (n, d), in numpy: `heads` (kernel, beta, B, V) with
    the sums over the system's tokens written out (masses 1/n), `feed_forward` f (n, d) -> (n, d)."""
    u = feed_forward(points)
    for kernel, beta, Bh, Vh in heads:
        Bh, Vh = np.asarray(Bh), np.asarray(Vh)
        for i, x in enumerate(points):
            if math.isinf(beta):
                m = Bh.T @ x / np.linalg.norm(Bh.T @ x)
            else:
                k = np.array([math.exp(beta * x @ Bh @ y) for y in points])
                m = (k @ points) / (k.sum() if kernel == "softmax" else len(points))
            u[i] += Vh @ m
    return u - (u * points).sum(1, keepdims=True) * points


def two_layer(W1, b, W2, activation="tanh"):
    """f(x) = W2 sigma(W1 x + b) on rows x (n, d)."""
    sigma = lambda z: ACTIVATIONS[activation](torch.from_numpy(z)).numpy()  # noqa: E731
    return lambda points: sigma(points @ np.asarray(W1).T + np.asarray(b)) @ np.asarray(W2).T


def by_hand_velocity(layout, theta, points):
    """`written_out` for theta (p,) of `layout`, its groups split off by hand."""
    sizes = [math.prod(shape) for _, shape in layout.groups]
    pieces = dict(zip([name for name, _ in layout.groups], np.split(theta, np.cumsum(sizes)[:-1])))
    d = layout.dim
    if layout.hidden == 0:
        feed_forward = lambda x: x @ pieces["W"].reshape(d, d).T  # noqa: E731
    else:
        feed_forward = two_layer(pieces["W1"].reshape(-1, d), pieces["b"], pieces["W2"].reshape(d, -1),
                                 layout.activation)
    heads = [(head.kernel, head.beta, Bh, Vh) for head, Bh, Vh in
             zip(layout.heads, pieces["B"].reshape(-1, d, d), pieces["V"].reshape(-1, d, d))]
    return written_out(points, heads, feed_forward)


@pytest.mark.parametrize("kernel, eps, integrator", [
    ("softmax", 0.1, "heun"), ("softmax", 0.0, "rk4"), ("unnormalized", 0.1, "euler"),
    ("unnormalized", 0.0, "heun"), ("unnormalized", 0.1, "rk4")])
def test_the_general_path_runs_the_seeds_model_as_the_classic_one(kernel, eps, integrator):
    """The seeds' model forced through HeadsField (spherepde.model.heads's drift, theta_l as the drive) against the
    classic direct step (particle_step's array program): same draws, every saved position to 1e-12."""
    case = seeds_case(kernel, eps, integrator)
    classic, general = (run_members(ParticleSystem(case, general), False)[0] for general in (None, True))
    assert general.attrs["attention"] == "heads" and classic.attrs["attention"] == "dense"
    assert float(abs(classic["particles"] - general["particles"]).max()) <= 1e-12  # measured 4.4e-16


@pytest.mark.parametrize("kernel, eps, integrator", [("unnormalized", 0.1, "heun"), ("softmax", 0.0, "rk4"),
                                                     ("softmax", 0.1, "euler")])
def test_the_general_gradient_of_the_seeds_model_is_the_by_hand_transpose(kernel, eps, integrator):
    """dJ/dtheta of the forced general path (autograd through each step) against the by-hand transposes' dJ/dW:
    its W entries to 1e-10 relative, its B and V entries (not trained) zero, the same J."""
    case = seeds_case(kernel, eps, integrator, control={"loss": "align", "layers": 3, "lambda_reg": 0.1})
    classic, general = ParticleControl(case), ParticleControl(case, general=True)
    assert classic.by_hand and not general.by_hand
    controls = 0.5 * torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    layout = general.system.layouts[0]
    theta = general.system.drives[0].clone()
    theta[:, :4] = controls.reshape(3, 4)
    by_hand, autograd = classic.gradient(controls), general.gradient(theta)
    assert abs(by_hand.cost - autograd.cost) <= 1e-12 * abs(by_hand.cost)
    dW = layout.unpack(autograd.dW)["W"]
    assert float((dW - by_hand.dW).norm() / by_hand.dW.norm()) <= 1e-10  # measured 1.6e-16
    assert not bool(autograd.dW[:, 4:].any())


@pytest.mark.parametrize("hidden", [0, 5])
def test_heads_field_is_the_drift_written_out(hidden):
    """HeadsField at the particles of two members (their heads' beta differ: two groups), two replicas each, on
    S^2: a softmax head, an unnormalized head and a beta = inf head, each with its own B and V, the linear or the
    two-layer feed-forward, against `by_hand_velocity` to 1e-13."""
    generator = torch.Generator().manual_seed(5)
    layouts = [Layout(3, (Head("softmax", beta), Head("unnormalized", 0.7), Head("softmax", math.inf)),
                      hidden=hidden, activation="tanh") for beta in (1.3, 2.0)]
    theta = 0.6 * torch.randn(2, layouts[0].size, generator=generator, dtype=torch.float64)
    x = torch.randn(2, 12, 3, generator=generator, dtype=torch.float64)
    x = x / x.norm(dim=-1, keepdim=True)
    batch = ModelBatch.of([head_model(seeds_case(), layout, t[None]) for layout, t in zip(layouts, theta)])
    field = HeadsField(batch, layouts, "auto", replicas=2)
    assert len(field.groups) == 2
    v = field(x, theta)
    for m, layout in enumerate(layouts):
        for system in (slice(0, 6), slice(6, 12)):
            expected = by_hand_velocity(layout, theta[m].numpy(), x[m, system].numpy())
            assert np.abs(v[m, system].numpy() - expected).max() <= 1e-13  # measured 4.4e-16


@pytest.mark.parametrize("feed_forward", ["linear", "mlp"])
def test_a_two_head_step_is_the_drift_written_out(feed_forward):
    """One projected Euler step x_1 = normalise(x_0 + h v(x_0)) of a case with model.extra_heads (a softmax head 0
    and an unnormalized head with its own beta, B, V), two replicas of 4 tokens, on each of its two layers (B, V
    and the feed-forward per layer: lists), against `written_out` of the case's own matrices to 1e-13."""
    mlp = {"feed_forward": "mlp", "hidden": 3, "W": None, "W1": W1, "b": HIDDEN_BIAS, "W2": W2}
    case = seeds_case("softmax", 0.0, "euler", n=8, B=[B, B2], V=[V, V2],
                      extra_heads=[{"kernel": "unnormalized", "beta": 0.7, "B": B2, "V": [V2, V]}],
                      **(mlp if feed_forward == "mlp" else {"W": [W, V2]}))
    system = ParticleSystem(case)
    assert system.general and system.drives.shape[1] == 2
    h, x0 = 0.05, system.x0
    for layer in (0, 1):
        x1 = system.integrator.step(x0, system.drives[:, layer], h, 0, 1, iter(()))
        heads = [("softmax", 1.3, [B, B2][layer], [V, V2][layer]), ("unnormalized", 0.7, B2, [V2, V][layer])]
        f = (two_layer(W1[layer], HIDDEN_BIAS[layer], W2[layer]) if feed_forward == "mlp"
             else lambda points, layer=layer: points @ np.asarray([W, V2][layer]).T)
        for system_tokens in (slice(0, 4), slice(4, 8)):
            points = x0[0, system_tokens].numpy()
            y = points + h * written_out(points, heads, f)
            expected = y / np.linalg.norm(y, axis=1, keepdims=True)
            assert np.abs(x1[0, system_tokens].numpy() - expected).max() <= 1e-13  # measured 1.1e-16


@pytest.mark.parametrize("kernel, integrator", [("softmax", "heun"), ("unnormalized", "rk4")])
def test_a_second_head_of_zero_value_is_the_one_head_run(kernel, integrator):
    """A second head with V_2 = 0 (B_2, beta_2 its own): the general path's run (HeadsField) equals the one-head
    case's (the seeds' direct step) at every save, positions and order parameter, to 1e-14."""
    one = run_members(ParticleSystem(seeds_case(kernel, 0.1, integrator)), False)[0]
    two = run_members(ParticleSystem(seeds_case(kernel, 0.1, integrator, extra_heads=[
        {"kernel": "unnormalized", "beta": 2.0, "B": B2, "V": [[0.0, 0.0], [0.0, 0.0]]}])), False)[0]
    assert two.attrs["attention"] == "heads" and one.attrs["attention"] == "dense"
    assert float(abs(one["particles"] - two["particles"]).max()) <= 1e-14  # measured 4.4e-16
    assert float(abs(one["order_parameter"] - two["order_parameter"]).max()) <= 1e-14


def test_the_attentions_diagnostics_are_nan_beyond_one_fixed_head():
    """Several heads, or V varying over the layers: the subspaces of V B^T and V and the interaction energy are not
    defined (docs/design.md "Output"), NaN as in the Eulerian run (they were head 0's numbers); one fixed head on the
    general path (a two-layer feed-forward) keeps them."""
    attention = ("alignment_E", "alignment_F", "lyapunov", "w2_projection", "interaction_energy", "free_energy")
    cases = {"two heads": seeds_case(eps=0.0, extra_heads=[{"kernel": "unnormalized", "beta": 2.0, "B": B2, "V": V2}]),
             "V over the layers": seeds_case(eps=0.0, V=[V, V2]),
             # B and V with real leading eigenvalues (the module's have complex ones: no subspace to align with)
             "one head, mlp": seeds_case(eps=0.0, feed_forward="mlp", hidden=3, W=None, W1=W1, b=HIDDEN_BIAS, W2=W2,
                                         B=[[1.0, 0.0], [0.0, 0.65]], V=[[1.0, 0.0], [0.0, 0.65]])}
    for name, case in cases.items():
        system = ParticleSystem(case)
        run = run_members(system, False)[0]
        assert system.general, name
        fixed = name == "one head, mlp"
        for variable in attention:  # the softmax head has no free energy (spherepde.model.energy) in any case
            assert np.isnan(run[variable].values).all() != (fixed and variable != "free_energy"), (name, variable)
        assert np.isfinite(run["order_parameter"].values).all(), name


def test_per_layer_lists_of_one_matrix_are_the_plain_case():
    """B and V as lists of three identical matrices (H = 1, linear): the seeds' paths, and the run equals the plain
    case's bit for bit (every variable); in a training, J and dJ/dW equal the plain training's bit for bit."""
    plain, listed = seeds_case(), seeds_case(B=[B] * 3, V=[V] * 3)
    system = ParticleSystem(listed)
    assert not system.general and system.drives.shape[1] == 1
    ours, theirs = run_members(system, False)[0], run_members(ParticleSystem(plain), False)[0]
    for name, variable in theirs.data_vars.items():
        assert np.array_equal(ours[name].values, variable.values, equal_nan=True), name
    control = {"loss": "align", "layers": 3, "lambda_reg": {"W": 0.1}}
    controls = 0.5 * torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    forwards = [ParticleControl(seeds_case(control=control, **keys)) for keys in ({}, {"B": [B] * 3, "V": [V] * 3})]
    assert all(forward.by_hand for forward in forwards)
    first, second = (forward.gradient(controls) for forward in forwards)
    assert first.cost == second.cost and torch.equal(first.dW, second.dW)


def relative_errors(layout, gradient, numerical):
    """|dJ/d group - FD| / |FD| per group of theta (L, p)."""
    ours, theirs = layout.unpack(gradient), layout.unpack(numerical)
    return {name: float((ours[name] - theirs[name]).norm() / theirs[name].norm()) for name in ours}


@pytest.mark.parametrize("head_kernel, feed_forward, integrator", [
    ("softmax", "linear", "heun"), ("unnormalized", "mlp", "rk4"), ("unnormalized", "linear", "euler")])
def test_the_general_gradient_is_central_differences(head_kernel, feed_forward, integrator):
    """dJ/dB, dJ/dV and the feed-forward's (W, or W1, b, W2) of a two-layer training with two heads (both kernels:
    head 0 `head_kernel`, the extra head the other; finite beta; B, V and the feed-forward per layer), W, B, V all
    trained with their own lambda_reg, common noise: against central differences of J (h = 1e-5) group by group,
    relative error <= 1e-6, and J = l + 1/2 sum_l sum_e lambda_e theta_{l,e}^2 T / L."""
    other = "unnormalized" if head_kernel == "softmax" else "softmax"
    weights = {"W": 0.1, "B": 0.2, "V": 0.3}
    control = {"loss": "align", "layers": 2, "train": ["W", "B", "V"], "lambda_reg": weights}
    mlp = {"feed_forward": "mlp", "hidden": 3, "W": None, "W1": W1, "b": HIDDEN_BIAS, "W2": W2}
    case = seeds_case(head_kernel, 0.1, integrator, replicas=1, n=8, control=control, B=[B, B2], V=[V, V2],
                      extra_heads=[{"kernel": other, "beta": 0.7, "B": [B2, B], "V": V2}],
                      **(mlp if feed_forward == "mlp" else {"W": [W, V2]}))
    forward = ParticleControl(case)
    layout = forward.system.layouts[0]
    assert forward.system.general and not forward.by_hand and layout.hidden == (3 if feed_forward == "mlp" else 0)
    theta = forward.system.drives[0]
    gradient = forward.gradient(theta)
    numerical = central_differences_of(forward.cost_of, theta)
    errors = relative_errors(layout, gradient.dW, numerical)
    assert max(errors.values()) <= 1e-6, errors  # measured: report in the commit message
    reg = 0.5 * float((layout.entry_weights(theta) * theta ** 2).sum()) * 0.6 / 2
    assert abs(forward.cost_of(theta) - gradient.loss - reg) <= 1e-14


def test_untrained_groups_have_no_gradient_and_do_not_move():
    """control.train = ["B"]: dJ/dtheta vanishes outside B; one Adam step moves every entry of B by the learning
    rate (Adam's first step is lr g / (|g| + 1e-8) entrywise) and leaves W and V as the case gives them, in the
    output's B, V (layer, head, row, col) and W."""
    control = {"loss": "align", "layers": 2, "train": ["B"], "lambda_reg": {"B": 0.2}, "optimizer": "adam",
               "learning_rate": 0.01, "iterations": 1, "tol": 0.0}
    case = seeds_case("softmax", 0.1, "heun", control=control, V=[V, V2],
                      extra_heads=[{"kernel": "softmax", "beta": 0.4, "B": B2, "V": V}])
    forward = ParticleControl(case)
    layout = forward.system.layouts[0]
    gradient = forward.gradient(forward.system.drives[0])
    assert not bool(gradient.dW[:, ~layout.trained(gradient.dW)].any())
    dataset = run_particle_training(case, progress=False)
    assert dataset["B"].dims == ("layer", "head", "row", "col") and dataset["V"].shape == (2, 2, 2, 2)
    start = np.array([[B, B2], [B, B2]])
    step = dataset["B"].values - start
    assert np.abs(np.abs(step) - 0.01).max() <= 1e-7
    assert np.array_equal(np.sign(step), -np.sign(layout.unpack(gradient.dW)["B"].numpy()))
    assert np.array_equal(dataset["V"].values, np.array([[V, V], [V2, V]]))
    assert np.array_equal(dataset["W"].values, np.array([W, W]))


def test_hardmax_is_the_seeds_models_only():
    """A beta = inf head beyond the seeds' model takes the local field; particles.beta_inf_mode = 'hardmax' there
    is a CaseError naming the key."""
    extra = [{"kernel": "unnormalized", "beta": 0.7, "B": B2, "V": V2}]
    with pytest.raises(CaseError, match="particles.beta_inf_mode"):
        ParticleSystem(seeds_case(beta=math.inf, mode="hardmax", extra_heads=extra))
    assert ParticleSystem(seeds_case(beta=math.inf, mode="mean_field", extra_heads=extra)).general


def test_a_batched_member_is_its_serial_run():
    """Two members beyond the seeds whose extra heads' beta differ (two groups of HeadsField) and whose
    particles.seed differ, batched: each member's saved positions, J and dJ/dtheta equal its serial run's bit for
    bit (the drift gathers every group's systems, so a member's graph does not depend on its batch)."""
    control = {"loss": "align", "layers": 2, "train": ["W", "B", "V"], "lambda_reg": {"W": 0.1, "B": 0.2, "V": 0.3}}
    cases = []
    for beta, seed in ((0.7, 3), (1.5, 4)):
        cases.append(seeds_case("softmax", 0.1, "heun", n=8, seed=seed, control=control, B=[B, B2], V=[V, V2],
                                extra_heads=[{"kernel": "unnormalized", "beta": beta, "B": B2, "V": V2}]))
    batched = ParticleControl(cases)
    assert len(batched.system.field.groups) == 2
    runs = run_members(batched.system, False)
    gradients = batched.gradients(batched.system.drives)
    for m, case in enumerate(cases):
        serial = ParticleControl(case)
        assert np.array_equal(run_members(serial.system, False)[0]["particles"].values, runs[m]["particles"].values)
        alone = serial.gradients(serial.system.drives)[0]
        assert alone.cost == gradients[m].cost and torch.equal(alone.dW, gradients[m].dW)


def test_a_plain_run_switches_layers_at_their_times():
    """No [control], W and an extra head's V as lists of two (L = model_layers = 2): the run's positions at the saves
    (0.2, 0.4, 0.6) are those of projected Euler steps of 0.05 taken by hand with layer 0's parameters before
    t = 0.3 = t_end / 2 and layer 1's after (the knot at 0.3 is not a save), to 1e-14 (the run's intervals 0.2 to
    0.3 to 0.4 take steps of 0.1 / 2 in floating point, a few ulp from 0.05; a switch one step off: 3e-2)."""
    case = seeds_case("unnormalized", 0.0, "euler", W=[W, V2],
                      extra_heads=[{"kernel": "softmax", "beta": 0.4, "B": B2, "V": [V2, V]}])
    system = ParticleSystem(case)
    saved = run_members(system, False)[0]["particles"].values
    x, h = system.x0, 0.05
    for k in range(12):
        x = system.integrator.step(x, system.drives[:, 0 if k < 6 else 1], h, 0, 1, iter(()))
        if k % 4 == 3:
            assert np.abs(saved[(k + 1) // 4] - x[0].numpy()).max() <= 1e-14, k  # measured 2.2e-16


@pytest.mark.slow  # 36 s of one core: the default run's time limit
def test_two_heads_an_mlp_and_per_layer_values_agree_with_the_eulerian_run_within_3_standard_errors():
    """solver.method = "both" on the model beyond the seeds (a softmax head and an unnormalized one with its own
    beta, B and V, V of head 0 per layer over two layers, the two-layer feed-forward): the Eulerian solution and
    n = 1e4 tokens in 10 replicas (standard errors by batch means) agree within 3 standard errors in mass, mean
    and order parameter at every save; the one-head diagnostics are NaN in both (not defined beyond one head).
    Half as much mass again in the unnormalized head of the Eulerian run alone fails it (shown)."""
    import spherepde
    from spherepde.analysis.compare import compare
    from spherepde.io.output import split_both

    case = case_from_dict({
        "case": {"name": "beyond-both"}, "sphere": {"dim": 2, "lmax": 64},
        "model": {"kernel": "softmax", "beta": 1.3, "B": B, "V": [V, V2], "eps": 0.1, "feed_forward": "mlp",
                  "hidden": 3, "W1": W1, "b": HIDDEN_BIAS, "W2": W2,
                  "extra_heads": [{"kernel": "unnormalized", "beta": 0.7, "B": B2, "V": V2}]},
        "initial": {"kind": "vmf", "mean": [1.0, 0.5], "kappa": 1.0},
        "time": {"t_end": 2.0, "dt": 0.05, "save_every": 0.25},
        "solver": {"method": "both", "device": "cpu", "field": "dense"},
        "particles": {"n": 10000, "replicas": 10, "seed": 5, "integrator": "heun", "dt": 0.025}})
    eulerian, particles = split_both(spherepde.run(case, progress=False))
    report = compare(eulerian, particles, k=3.0, w2=False)
    verdicts = {name: report.attrs[f"verdict_{name}"] for name in ("mass", "mean", "order_parameter")}
    assert verdicts == {name: "agrees" for name in verdicts}
    assert np.isnan(eulerian["alignment_E"].values).all() and np.isnan(particles["alignment_E"].values).all()
    # the runs move: the mean turns by more than 10 standard errors, so agreement is not that of a still state
    mean, error = particles["mean"].values, particles["mean_stderr"].values
    assert np.abs(mean[-1] - mean[0]).max() > 10 * error[-1].max()
