"""The Eulerian forward run and training of the model beyond the seeds (issue 29; spherepde.model.parameters):
the seeds' model on the layered transport against its own fast paths, one head with per-layer copies of B and V
against the plain case, the discrete gradients in every parameter group against central differences, a two-head
run's mass and its reduction to one head, and a joint W, B, V training's output."""

import numpy as np
import pytest
import torch
import xarray as xr

from solvers.adjoint import discrete_gradient
from solvers.controlled_forward import ControlledForward, central_differences_of, evaluate_cost
from solvers.eulerian import only, run_members
from solvers.forward_problem import ForwardProblem
from solvers.training import run_training
from spherepde.base.errors import CaseError
from spherepde.io.case import load_case_text
from spherepde.io.output import write_dataset

S1 = {"B": "[[1.0, 0.3], [0.0, 0.8]]", "V": "[[0.9, -0.2], [0.1, 0.7]]", "B2": "[[0.5, 0.0], [0.2, 1.0]]",
      "V2": "[[0.0, 1.0], [-1.0, 0.3]]", "W": "[[0.0, 0.5], [-0.5, 0.1]]",
      "mlp": "feed_forward = 'mlp'\nhidden = 3\nb = [0.1, -0.2, 0.05]\nW2 = [[0.3, -0.1, 0.2], [0.1, 0.4, -0.3]]\n",
      "initial": "[initial]\nkind = 'vmf'\nmean = [1.0, 0.5]\nkappa = 1.0\n", "target": "[0.0, 1.0]"}
S2 = {"B": "[[1.0, 0.3, 0.0], [0.0, 0.8, 0.1], [0.0, 0.0, 0.6]]",
      "V": "[[0.9, -0.2, 0.0], [0.1, 0.7, 0.0], [0.0, 0.2, 0.5]]",
      "B2": "[[0.5, 0.0, 0.0], [0.2, 1.0, 0.0], [0.0, 0.0, 0.7]]",
      "V2": "[[0.0, 1.0, 0.0], [-1.0, 0.3, 0.0], [0.0, 0.0, 0.2]]",
      "W": "[[0.0, 0.5, 0.0], [-0.5, 0.1, 0.0], [0.0, 0.0, 0.2]]",
      "mlp": "feed_forward = 'mlp'\nhidden = 2\nb = [0.1, -0.2]\nW2 = [[0.3, -0.1], [0.1, 0.4], [0.2, 0.0]]\n",
      "initial": "[initial]\nkind = 'vmf'\nmean = [1.0, 0.5, 0.2]\nkappa = 1.0\n", "target": "[0.0, 1.0, 0.0]"}


def case_text(values: dict, dim: int, lmax: int, kernel: str = "softmax", feed_forward: str = "linear",
              second_head: str | None = None, time: str = "t_end = 0.2\ndt = 0.1\n", control: str = "") -> str:
    """A small case: head 0 (beta 1.5, B, V of `values`), an optional second head (beta 0.7, B2 and the value
    matrix `second_head`), a linear W or the two-layer feed-forward with non-zero b and W2."""
    model = (f"[model]\nkernel = '{kernel}'\nbeta = 1.5\nB = {values['B']}\nV = {values['V']}\neps = 0.05\n"
             + (values["mlp"] if feed_forward == "mlp" else f"W = {values['W']}\n"))
    if second_head is not None:
        model += f"extra_heads = [{{beta = 0.7, B = {values['B2']}, V = {second_head}}}]\n"
    return f"[sphere]\ndim = {dim}\nlmax = {lmax}\n" + model + values["initial"] + "[time]\n" + time + control


def training(values: dict, train: tuple = ("W", "B", "V"), extra: str = "") -> str:
    """A [control] of 2 layers training the groups `train`, lambda_W, lambda_B, lambda_V = 0.01, 0.02, 0.03."""
    weights = ", ".join(f"{group} = {weight}" for group, weight in zip("WBV", (0.01, 0.02, 0.03)) if group in train)
    return (f"[control]\nloss = 'align'\ntarget = {values['target']}\nlayers = 2\n"
            f"train = {list(train)}\nlambda_reg = {{{weights}}}\n" + extra)


def assert_same_run(classic, layered, names=None, tol=1e-13):
    """Every floating variable of two runs' Datasets (or those `names`) agrees to `tol` relative to its scale
    (absolute for the spectral tail, a round-off-sized fraction), NaN where the other is NaN."""
    for name in names or [name for name in classic.data_vars if classic[name].dtype.kind == "f"]:
        a, b = classic[name].values, layered[name].values
        assert np.array_equal(np.isnan(a), np.isnan(b)), name
        finite = np.isfinite(a)
        if not finite.any():
            continue
        scale = 1.0 if name == "spectral_tail" else max(np.abs(a[finite]).max(), 1e-300)
        assert np.abs(a[finite] - b[finite]).max() <= tol * scale, (name, np.abs(a[finite] - b[finite]).max())


# --- criterion 1: the seeds' model, bit for bit on its paths, and to round-off on the layered transport -------

@pytest.mark.parametrize("text", [
    case_text(S1, 2, 32, "unnormalized", time="t_end = 1.0\ndt = 0.05\nsave_every = 0.25\n"),
    case_text(S2, 3, 8, "softmax", time="t_end = 0.5\ndt = 0.05\nsave_every = 0.25\n"),
], ids=["s1-unnormalized", "s2-softmax"])
def test_the_seeds_model_on_the_layered_transport_is_its_classic_run(text):
    case = load_case_text(text)
    classic = ForwardProblem(case)
    assert not classic.layered
    layered = ForwardProblem(case, layered=True)
    assert type(layered.transport).__name__ == "LayeredTransport"
    assert_same_run(only(run_members(classic)), only(run_members(layered)))


def test_one_head_with_per_layer_copies_of_B_and_V_is_the_plain_case():
    """B, V as lists of 2 identical matrices: the layered transport, 2 layers whose boundary t = 0.5 is a save
    time (the same steps), every diagnostic (the head is fixed) equal to the plain run's."""
    timing = "t_end = 1.0\ndt = 0.05\nsave_every = 0.25\n"
    plain = load_case_text(case_text(S1, 2, 32, "softmax", time=timing))
    lists = {**S1, "B": f"[{S1['B']}, {S1['B']}]", "V": f"[{S1['V']}, {S1['V']}]"}
    layered = ForwardProblem(load_case_text(case_text(lists, 2, 32, "softmax", time=timing)))
    assert layered.layered and layered.parameters.shape[1] == 2
    assert_same_run(only(run_members(ForwardProblem(plain))), only(run_members(layered)))


@pytest.mark.parametrize("values, dim, lmax, kernel, field", [(S1, 2, 32, "unnormalized", "dense"),
                                                              (S2, 3, 8, "softmax", "spectral")])
def test_a_linear_W_per_layer_runs_on_the_seeds_transport_as_on_the_layered_one(values, dim, lmax, kernel, field):
    """model.W as a list of 3 different matrices (a trained W run again, say) with one head and fixed B, V: the
    seeds' transport with each layer's W as its drive (11 to 32 times faster than the layered transport on seed
    004's case, which took it before), the field the case asks for, and every diagnostic equal to the layered
    transport's run to round-off."""
    timing = "t_end = 0.6\ndt = 0.05\nsave_every = 0.1\n"
    rng = np.random.default_rng(4)
    layers = [(0.5 * rng.standard_normal((dim, dim))).round(3).tolist() for _ in range(3)]
    text = case_text({**values, "W": str(layers)}, dim, lmax, kernel, time=timing) + f"[solver]\nfield = '{field}'\n"
    case = load_case_text(text)
    seeds = ForwardProblem(case)
    assert not seeds.layered and len(seeds.layer_drives()) == 3 and seeds.kernels.name == field
    layered = ForwardProblem(case.with_overrides(["solver.field='dense'"]), layered=True)
    assert_same_run(only(run_members(seeds)), only(run_members(layered)), tol=1e-12)


# --- criterion 2: the discrete gradient in every group against central differences ------------------------------

@pytest.mark.slow
def test_discrete_gradients_of_two_heads_match_central_differences_in_every_entry():
    """S^1, softmax, two heads, the two-layer feed-forward: dJ/dtheta of every entry (two layers; B, V of both
    heads, W1, b, W2) against central differences, relative error per group (measured 5e-10 to 1.5e-9; 124
    forward runs, about 10 s)."""
    case = load_case_text(case_text(S1, 2, 16, "softmax", "mlp", S1["V2"], control=training(S1)))
    forward = ControlledForward(case)
    theta = forward.problem.parameters[0]
    gradient = discrete_gradient(forward, None, theta).dW
    differences = central_differences_of(lambda controls: evaluate_cost(forward, None, controls), theta, 1e-5)
    layout = forward.problem.layout
    for name, value in layout.unpack(differences).items():
        error = float((layout.unpack(gradient)[name] - value).norm() / value.norm())
        assert error <= 1e-6, (name, error)


@pytest.mark.parametrize("values, dim, lmax, kernel, feed_forward", [
    (S1, 2, 16, "unnormalized", "linear"), (S1, 2, 16, "unnormalized", "mlp"), (S1, 2, 16, "softmax", "linear"),
    (S1, 2, 16, "softmax", "mlp"), (S2, 3, 8, "softmax", "mlp"), (S2, 3, 8, "unnormalized", "mlp")],
    ids=["s1-unnormalized-linear", "s1-unnormalized-mlp", "s1-softmax-linear", "s1-softmax-mlp", "s2-softmax-mlp",
         "s2-unnormalized-mlp"])
def test_discrete_gradients_of_two_heads_match_central_differences_along_each_group(values, dim, lmax, kernel,
                                                                                     feed_forward):
    """The derivative along one random direction D_g of every group (both layers, both heads):
    <dJ/dtheta, D_g> against (J(theta + h D_g) - J(theta - h D_g)) / 2h (measured 1e-11 to 3e-9)."""
    case = load_case_text(case_text(values, dim, lmax, kernel, feed_forward, values["V2"], control=training(values)))
    forward = ControlledForward(case)
    layout, theta = forward.problem.layout, forward.problem.parameters[0]
    gradient = layout.unpack(discrete_gradient(forward, None, theta).dW)
    generator = torch.Generator().manual_seed(3)
    for name, shape in layout.groups:
        direction = {group: torch.zeros((2,) + size, dtype=theta.dtype) for group, size in layout.groups}
        direction[name] = torch.randn((2,) + shape, generator=generator, dtype=theta.dtype)
        along = layout.pack(direction)
        derivative = central_differences_of(lambda s: evaluate_cost(forward, None, theta + s * along),
                                            torch.zeros(1, dtype=theta.dtype), 1e-5)
        adjoint = (gradient[name] * direction[name]).sum()
        assert abs(float(adjoint - derivative[0])) <= 1e-6 * abs(float(derivative[0])), name


def test_a_seeds_training_on_the_layered_transport_has_the_classic_gradient():
    """The W entries of dJ/dtheta on the layered transport are the classic dJ/dW (to 1e-12), the others zero
    (not trained)."""
    case = load_case_text(case_text(S1, 2, 16, "unnormalized", control=training(S1, ("W",))))
    classic = ControlledForward(case)
    W = classic.problem.batch.models[0].W.expand(2, -1, -1)
    reference = discrete_gradient(classic, None, W)
    layered = ControlledForward(case, ForwardProblem(case, layered=True))
    theta = layered.problem.parameters[0]
    gradient = discrete_gradient(layered, None, theta)
    parts = layered.problem.layout.unpack(gradient.dW)
    assert abs(gradient.cost - reference.cost) <= 1e-13 * abs(reference.cost)
    assert float((parts["W"] - reference.dW).abs().max()) <= 1e-12 * float(reference.dW.abs().max())
    assert not parts["B"].any() and not parts["V"].any()


# --- a two-head forward run ------------------------------------------------------------------------------------

def test_two_heads_conserve_mass_and_a_second_head_without_values_is_one_head():
    timing = "t_end = 1.0\ndt = 0.05\nsave_every = 0.25\n"
    one = only(run_members(ForwardProblem(load_case_text(case_text(S1, 2, 32, "softmax", time=timing)))))
    zero = "[[0.0, 0.0], [0.0, 0.0]]"
    silent = only(run_members(ForwardProblem(load_case_text(case_text(S1, 2, 32, "softmax", second_head=zero,
                                                                      time=timing)))))
    assert_same_run(one, silent, ["density", "mass", "mean", "entropy", "min_density"])
    assert np.isnan(silent["free_energy"].values).all() and np.isnan(silent["alignment_E"].values).all()
    two = ForwardProblem(load_case_text(case_text(S1, 2, 32, "softmax", second_head=S1["V2"], time=timing)))
    run = only(run_members(two))
    assert np.abs(run["mass"].values - run["mass"].values[0]).max() <= 1e-12
    assert np.abs(run["density"].values[-1] - one["density"].values[-1]).max() > 1e-3  # the second head acts
    # the layered transport computes the attention dense: a spectral field asked for is refused (it was ignored)
    spectral = load_case_text(case_text(S1, 2, 32, "softmax", second_head=S1["V2"], time=timing)).with_overrides(
        ["solver.field='spectral'"])
    with pytest.raises(CaseError, match="solver.field: 'spectral' is available for the seeds' model only"):
        ForwardProblem(spectral)


@pytest.mark.parametrize("overrides, named", [
    (["model.extra_heads=[{beta=300.0}]"], "model.extra_heads[0].beta = 300"),
    (["model.kernel='softmax'", "model.beta=2.0", "model.B=[[[1,0],[0,1]],[[100,0],[0,100]]]"],
     "model.beta = 2 with layer 2's model.B")])
def test_a_grid_too_coarse_for_a_later_head_or_layer_names_it_and_the_lmax_for_all(overrides, named):
    # head by head the check named head 0's beta, or the first layer's lmax, and the next run asked for more
    import re

    import spherepde

    case = spherepde.load_case("cases/kuramoto-s1.toml", ["sphere.lmax=4"] + overrides)
    with pytest.raises(CaseError, match=f"sphere.lmax: 4 is too coarse for {re.escape(named)}") as refused:
        ForwardProblem(case)
    lmax = int(re.search(r"use lmax >= (\d+)", str(refused.value)).group(1))
    ForwardProblem(case.with_overrides([f"sphere.lmax={lmax}"]))  # carries every head and layer
    with pytest.raises(CaseError, match=f"use lmax >= {lmax}"):
        ForwardProblem(case.with_overrides([f"sphere.lmax={lmax - 1}"]))


@pytest.mark.parametrize("overrides, named", [
    (["model.kernel='unnormalized'", "model.extra_heads=[{B=[[[1,0],[0,1]],[[800,0],[0,1]]]}]"],
     "model.extra_heads[0].beta: the unnormalized kernel exp(beta <B^T x, y>) reaches exp(800) (beta = 1 times "
     "|B| = 800 with layer 2's model.extra_heads[0].B)"),
    (["sphere.lmax=4", "model.extra_heads=[{B=[[[1,0],[0,1]],[[100,0],[0,100]]]}]"],
     "too coarse for model.extra_heads[0].beta = 1 with layer 2's model.extra_heads[0].B")])
def test_a_refused_kernel_of_an_extra_head_names_that_heads_keys(overrides, named):
    """An extra head's per-layer B beyond the kernel's range or the grid: the message named head 0's model.B (the
    identity here) as the layer's matrix and told to lower model.beta or model.B."""
    import spherepde

    case = spherepde.load_case("cases/kuramoto-s1.toml", ["model.beta=1.0"] + overrides)
    with pytest.raises(CaseError) as refused:
        ForwardProblem(case)
    assert named in str(refused.value)
    assert "model.B" not in str(refused.value).replace("extra_heads[0].B", "")
    if "kernel" in overrides[0]:
        assert "lower model.extra_heads[0].beta or model.extra_heads[0].B" in str(refused.value)


def test_members_beyond_the_seeds_run_together_as_alone():
    """Two members differing in head 0's V, in one batch: each the run of its case alone (to 1e-13)."""
    timing = "t_end = 0.5\ndt = 0.05\nsave_every = 0.25\n"
    cases = [load_case_text(case_text({**S1, "V": V}, 2, 16, "unnormalized", "mlp", S1["V2"], time=timing))
             for V in (S1["V"], "[[0.2, 0.0], [0.0, -0.4]]")]
    together = run_members(ForwardProblem(cases))
    for case, member in zip(cases, together):
        assert_same_run(only(run_members(ForwardProblem(case))), member)


# --- a joint training ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("feed_forward, names", [("linear", ("W", "B", "V")), ("mlp", ("W1", "b", "W2", "B", "V"))])
def test_a_joint_training_lowers_the_cost_and_writes_its_groups(tmp_path, feed_forward, names):
    extra = "optimizer = 'adam'\niterations = 3\nlearning_rate = 0.05\n"
    case = load_case_text(case_text(S1, 2, 16, "softmax", feed_forward, S1["V2"], control=training(S1, extra=extra)))
    dataset = run_training(case)
    loss = dataset["loss"].values
    assert len(loss) == 4 and loss[-1] < loss[0]
    path = tmp_path / "trained.nc"
    write_dataset(dataset, path)
    with xr.open_dataset(path) as written:
        shapes = {"W": (("layer", "row", "col"), (2, 2, 2)), "W1": (("layer", "hidden", "col"), (2, 3, 2)),
                  "b": (("layer", "hidden"), (2, 3)), "W2": (("layer", "row", "hidden"), (2, 2, 3)),
                  "B": (("layer", "head", "row", "col"), (2, 2, 2, 2)), "V": (("layer", "head", "row", "col"),
                                                                                (2, 2, 2, 2))}
        for name in names:
            assert (written[name].dims, written[name].shape) == shapes[name], name
        assert np.array_equal(written["gradient_norm"].values, dataset["gradient_norm"].values)


def test_untrained_groups_keep_their_case_values():
    extra = "optimizer = 'lbfgs'\niterations = 1\n"
    case = load_case_text(case_text(S1, 2, 16, "unnormalized", "linear", S1["V2"],
                                    control=training(S1, ("B",), extra)))
    dataset = run_training(case)
    assert np.array_equal(dataset["W"].values, np.broadcast_to(np.array(eval(S1["W"])), (2, 2, 2)))
    assert np.array_equal(dataset["V"].values[:, 1], np.broadcast_to(np.array(eval(S1["V2"])), (2, 2, 2)))
    assert not np.array_equal(dataset["B"].values[:, 0], np.broadcast_to(np.array(eval(S1["B"])), (2, 2, 2)))
    assert dataset["loss"].values[-1] < dataset["loss"].values[0]


def test_a_layered_two_head_run_resumed_from_its_checkpoint_is_bit_identical(tmp_path):
    """W per layer (2 layers) and two heads: stopped at its 3rd checkpoint (step 6 of 20, before the layer
    boundary), the resumed run ends as the uninterrupted one, bit for bit."""
    import spherepde
    from solvers.checkpoint import Checkpoint

    W = f"[{S1['W']}, [[0.0, -0.5], [0.5, 0.2]]]"
    case = load_case_text(case_text({**S1, "W": W}, 2, 16, "softmax", second_head=S1["V2"],
                                    time="t_end = 1.0\ndt = 0.05\nsave_every = 0.25\n"))
    reference = spherepde.run(case, progress=False)
    output = tmp_path / "out.nc"
    checkpoint, written = Checkpoint(output, every_steps=2), []

    def stop(state, segment, steps):
        Checkpoint.write(checkpoint, state, segment, steps)
        written.append(steps)
        if len(written) == 3:
            raise KeyboardInterrupt

    checkpoint.write = stop
    with pytest.raises(KeyboardInterrupt):
        spherepde.run(case, progress=False, checkpoint=checkpoint)
    resumed = spherepde.run(case, progress=False, checkpoint=Checkpoint(output, resume=True))
    for name in ("density", "mass", "mean", "entropy"):
        assert np.array_equal(resumed[name].values, reference[name].values), name


def test_members_of_a_joint_training_train_together_as_alone():
    """Two members differing in the groups' weights lambda_g, trained in lockstep: each member's history and
    controls those of its serial training (to 1e-12)."""
    from solvers.training import run_trainings

    extra = "optimizer = 'adam'\niterations = 2\nlearning_rate = 0.05\n"
    texts = [case_text(S1, 2, 16, "unnormalized", "mlp", S1["V2"], control=training(S1, extra=extra))]
    texts.append(texts[0].replace("V = 0.03", "V = 0.3"))
    cases = [load_case_text(text) for text in texts]
    together = run_trainings(cases)
    for case, member in zip(cases, together):
        alone = run_training(case)
        for name in ("loss", "gradient_norm", "W1", "b", "W2", "B", "V"):
            assert np.abs(member[name].values - alone[name].values).max() <= 1e-12 * np.abs(alone[name].values).max()
    assert abs(together[0]["loss"].values[0] - together[1]["loss"].values[0]) > 1e-6  # the weights differ
