"""Members run together (spherepde/api/ensemble.py and the solvers' member axis): a batched member is its serial run,
to round-off for densities, diagnostics and trained controls, bit for bit for particles."""

import numpy as np
import pytest
import xarray as xr

import spherepde.model.transport as transport
from solvers.forward_problem import ForwardProblem
from solvers.particles import ParticleSystem
from spherepde import run
from spherepde.api.ensemble import batches, run_batch
from spherepde.io.case import case_from_dict

# Attributes that say how a run was made, not what it computed.
RUN_ATTRIBUTES = {"wall_seconds", "batch_members", "history", "training_seconds"}


def eulerian_members(dim, kernel, beta, field, lmax, extra=None, members=None):
    """Three members of one grid with different initial laws, W, V, B, beta, eps (`members` overrides each)."""
    diagonal = [1.0, 0.65, 0.4][:dim]
    A = [[diagonal[i] * (i == j) for j in range(dim)] for i in range(dim)]
    other = [[0.6 * (i == j) + 0.1 * (i < j) for j in range(dim)] for i in range(dim)]
    strain = [[0.2 * (i == j) * (-1) ** i for j in range(dim)] for i in range(dim)]
    zero = [[0.0] * dim for _ in range(dim)]
    variants = members or [
        {"model": {"B": A, "V": A, "W": zero, "eps": 0.05}, "initial": {"mean": [1.0, 0.2, 0.1][:dim], "kappa": 2.0}},
        {"model": {"B": other, "V": A, "W": strain, "eps": 0.08},
         "initial": {"mean": [0.0, 1.0, 0.3][:dim], "kappa": 3.0}},
        {"model": {"B": A, "V": other, "W": zero, "eps": 0.05, "beta": 0.5 if beta != "inf" else "inf"},
         "initial": {"mean": [-1.0, 0.3, 0.0][:dim], "kappa": 1.0}},
    ]
    cases = []
    for variant in variants:
        table = {"sphere": {"dim": dim, "lmax": lmax},
                 "model": {"kernel": kernel, "beta": beta} | variant["model"],
                 "initial": {"kind": "vmf"} | variant["initial"],
                 "time": {"t_end": 0.4, "save_every": 0.2} | (extra or {"dt": 0.05}),
                 "solver": {"device": "cpu", "field": field}}
        cases.append(case_from_dict(table))
    return cases


def same_values(a: np.ndarray, b: np.ndarray, tolerance: float) -> bool:
    """a within `tolerance` of b relative to b's scale (at least 1); identical where tolerance is 0 or the values
    are not numbers."""
    if tolerance == 0 or a.dtype.kind not in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    scale = max(1.0, float(np.nanmax(np.abs(b))) if np.isfinite(b).any() else 1.0)
    return bool(np.allclose(a, b, rtol=0, atol=tolerance * scale, equal_nan=True))


def assert_same_file(batched: xr.Dataset, serial: xr.Dataset, tolerance: float):
    """Every variable within `tolerance` relative to its scale (0: identical), every attribute equal but those of
    RUN_ATTRIBUTES."""
    assert set(batched.data_vars) == set(serial.data_vars)
    for name in serial.data_vars:
        a, b = batched[name].values, serial[name].values
        assert same_values(a, b, tolerance), (name, np.nanmax(np.abs(a - b)) if a.dtype.kind in "fc" else None)
    for key, value in serial.attrs.items():
        if key in RUN_ATTRIBUTES:
            continue
        if isinstance(value, float) and tolerance:
            assert np.isclose(batched.attrs[key], value, rtol=tolerance, atol=0, equal_nan=True), key
        else:
            assert batched.attrs[key] == value, key


@pytest.mark.parametrize("dim, kernel, beta, field, lmax, extra, fourier_costs", [
    (2, "unnormalized", 1.0, "dense", 24, None, None),         # fourier path (numpy), a folded operator per member
    (2, "unnormalized", 1.0, "dense", 24, None, "excluded"),   # matrix path, a folded operator per member
    (2, "unnormalized", 1.0, "dense", 24, None, "torch"),      # fourier path batched, the matrix path serially
    (2, "softmax", 2.0, "spectral", 24, None, None),           # grid path, spectral transforms
    (3, "softmax", 2.0, "spectral", 8, None, None),
    (3, "softmax", "inf", "auto", 8, None, None),              # zero temperature
    (2, "softmax", 2.0, "dense", 24, {"cfl": 0.5}, None),      # CFL: members take different numbers of steps
])
def test_batched_eulerian_members_are_their_serial_runs(dim, kernel, beta, field, lmax, extra, fourier_costs,
                                                         monkeypatch):
    """Transport chooses its path by the CPU's cost rule, where the fourier path's numpy program pays from one
    member on; with `fourier_costs` "torch" by torch's (the GPU's choice: three members' own operators read in one
    evaluation cost more than the fourier path's fixed cost, one member's less), with "excluded" with the fourier
    path priced out (the matrix path's batch of members' own operators)."""
    if fourier_costs is not None:
        factor = 1 if fourier_costs == "torch" else 100
        monkeypatch.setattr(transport, "NUMPY_OPERATION_COST", factor * transport.OPERATION_COST)
    cases = eulerian_members(dim, kernel, beta, field, lmax, extra)
    expected = {None: None, "excluded": ("matrix", "matrix"), "torch": ("matrix", "fourier")}[fourier_costs]
    if expected is not None:
        assert (ForwardProblem(cases[:1]).transport.path, ForwardProblem(cases).transport.path) == expected
    assert batches(cases) == [[0, 1, 2]]
    assert_batch_is_serial(cases)


def assert_batch_is_serial(cases):
    """The members batched in one program, each its serial run's file to 1e-13 (CFL: their own steps)."""
    batched = run_batch(cases, progress=False)
    if "cfl" in cases[0]["time"]:  # the CFL rule gave the members their own steps
        assert len({dataset.attrs["steps"] for dataset in batched}) > 1
    for case, dataset in zip(cases, batched):
        assert dataset.attrs["batch_members"] == len(cases)
        assert_same_file(dataset, run(case, progress=False), 1e-13)


@pytest.mark.parametrize("dim, kernel, field", [(2, "unnormalized", "dense"), (3, "softmax", "spectral")])
def test_members_with_a_W_per_layer_batch_by_their_number_of_layers(dim, kernel, field):
    """model.W as lists of one per layer (a trained W run again) on the seeds' transport: members with 2 layers
    batch together and are their serial runs, apart from those with 3 layers and with one W (whose time grids
    differ), which also are."""
    rng = np.random.default_rng(7)
    members = eulerian_members(dim, kernel, 1.0, field, 24 if dim == 2 else 8)
    layered = [[(0.3 * rng.standard_normal((dim, dim))).tolist() for _ in range(layers)] for layers in (2, 3, 2)]
    cases = [case.with_overrides([f"model.W={W}"]) for case, W in zip(members, layered)] + [members[0]]
    assert batches(cases) == [[0, 2], [1], [3]]
    assert_batch_is_serial([cases[0], cases[2]])


def training_members(optimizers, method="eulerian"):
    """S^1 trainings of one grid with their own target, lambda_reg, start and optimizer."""
    cases = []
    for k, optimizer in enumerate(optimizers):
        table = {"sphere": {"dim": 2, "lmax": 12},
                 "model": {"kernel": "unnormalized", "beta": 1.0, "B": [[1.0, 0.0], [0.0, 0.65]],
                           "V": [[1.0, 0.0], [0.0, 0.65]], "eps": 0.05},
                 "initial": {"kind": "vmf", "mean": [1.0, 0.2 + 0.3 * k], "kappa": 2.0},
                 "time": {"t_end": 0.5, "dt": 0.1, "save_every": 0.25},
                 "solver": {"device": "cpu", "method": method, "field": "dense"},
                 "control": {"loss": "align", "target": [0.3 * k, 1.0], "layers": 2, "lambda_reg": 0.1 * (k + 1),
                             "optimizer": optimizer, "iterations": 3 + 2 * k, "learning_rate": 0.5,
                             "tol": 1e-9 if optimizer == "lbfgs" else 0.0}}
        if method == "particles":
            table["particles"] = {"n": 12, "seed": k}
            table["model"]["eps"] = 0.1
        cases.append(case_from_dict(table))
    return cases


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_batched_trainings_are_their_serial_trainings(method):
    """Adam, gradient descent and L-BFGS members in lockstep: each takes the steps of its serial training (the
    L-BFGS members stop after different numbers of evaluations and drop out of the batch), so its trained W and
    J history agree with the serial ones to round-off."""
    cases = training_members(["adam", "lbfgs", "gd", "lbfgs"], method)
    assert batches(cases) == [[0, 1, 2, 3]]
    batched = run_batch(cases, progress=False)
    evaluations = set()
    for case, dataset in zip(cases, batched):
        serial = run(case, progress=False)
        assert np.allclose(dataset["W"].values, serial["W"].values, rtol=0, atol=1e-10)
        assert np.allclose(dataset["loss"].values, serial["loss"].values, rtol=1e-12, atol=0)
        assert dataset.attrs["optimizer_stop"] == serial.attrs["optimizer_stop"]
        evaluations.add(dataset.sizes["iteration"])
        assert_same_file(dataset, serial, 1e-10)
    assert len(evaluations) > 1  # the members did stop at different points


def beyond_seeds_members(dim, method, kind, training=False):
    """Three members beyond the seeds' model on one grid (S^1: lmax 12, S^2: lmax 6), each with its own initial law
    and seed: `kind` "mlp", a two-layer feed-forward of 3 hidden units whose W1 is drawn from ffn_seed 1 and 2 and
    given, with their own b and W2; "heads", a second softmax head (beta 2) whose B and V are each member's own.
    With `training` their own targets, lambda_reg and optimizers, the heads' B and V trained with W."""
    rng = np.random.default_rng(11)
    cases = []
    for k in range(3):
        model = {"kernel": "unnormalized", "beta": 1.0, "eps": 0.1}
        if kind == "mlp":
            model |= {"feed_forward": "mlp", "hidden": 3, "ffn_seed": k + 1,
                      "b": (0.3 * rng.standard_normal(3)).tolist(),
                      "W2": (0.5 * rng.standard_normal((dim, 3))).tolist()}
            if k == 2:
                model["W1"] = rng.standard_normal((3, dim)).tolist()
        else:
            V = [[(0.5 + 0.3 * k) * (i == j == dim - 1) for j in range(dim)] for i in range(dim)]
            B = [[(i == j) + 0.2 * k * (i < j) for j in range(dim)] for i in range(dim)]
            model["extra_heads"] = [{"kernel": "softmax", "beta": 2.0, "B": B, "V": V}]
        table = {"sphere": {"dim": dim, "lmax": 12 if dim == 2 else 6}, "model": model,
                 "initial": {"kind": "vmf", "mean": [1.0, 0.2 + 0.3 * k, 0.1][:dim], "kappa": 2.0},
                 "time": {"t_end": 0.4, "dt": 0.1, "save_every": 0.2},
                 "solver": {"device": "cpu", "method": method, "field": "dense"},
                 "particles": {"n": 16 if training else 40, "seed": k, "save": 16 if training else 40}}
        if training:
            table["control"] = {"loss": "align", "target": [0.3 * k, 1.0, 0.0][:dim], "layers": 2,
                                "lambda_reg": 0.1 * (k + 1), "optimizer": ("adam", "lbfgs", "gd")[k],
                                "iterations": 3 + k, "learning_rate": 0.05}
            if kind == "heads":
                table["control"]["train"] = ["W", "B", "V"]
        cases.append(case_from_dict(table))
    return cases


BEYOND = [(dim, method, kind) for dim in (2, 3) for method in ("eulerian", "particles") for kind in ("mlp", "heads")]


@pytest.mark.parametrize("dim, method, kind", BEYOND)
def test_members_beyond_the_seeds_batch_and_are_their_serial_runs(dim, method, kind):
    """Members that differ in the feed-forward's W1 (ffn_seed), b, W2 or in an extra head's B and V run as one
    batch (each ran alone: MEMBER_KEYS left those keys out), and each is its serial run: densities and diagnostics
    to 1e-13 of their scale, particles bit for bit."""
    cases = beyond_seeds_members(dim, method, kind)
    assert batches(cases) == [[0, 1, 2]]
    batched = run_batch(cases, progress=False)
    finals = set()
    for case, dataset in zip(cases, batched):
        assert dataset.attrs["batch_members"] == 3
        assert_same_file(dataset, run(case, progress=False), 1e-13 if method == "eulerian" else 0)
        finals.add(float(dataset["order_parameter"].values[-1]))
    assert len(finals) == 3  # the members did differ


@pytest.mark.parametrize("dim, method, kind", BEYOND)
def test_trainings_beyond_the_seeds_batch_and_are_their_serial_trainings(dim, method, kind):
    """Adam, L-BFGS and gradient descent trainings of an MLP's W1, b, W2 (W1 from their own ffn_seed) or of W and
    the heads' B and V (an extra head of each member's own B and V) in one lockstep: each member's trained
    parameters within 1e-10 of its serial training's, its file within 1e-10 of its scale, a particle training's
    particles bit for bit."""
    cases = beyond_seeds_members(dim, method, kind, training=True)
    assert batches(cases) == [[0, 1, 2]]
    trained = ("W1", "b", "W2") if kind == "mlp" else ("W", "B", "V")
    for case, dataset in zip(cases, run_batch(cases, progress=False)):
        serial = run(case, progress=False)
        for name in trained:
            assert np.allclose(dataset[name].values, serial[name].values, rtol=0, atol=1e-10), name
        assert not np.array_equal(dataset[trained[0]].values[0], dataset[trained[0]].values[-1])  # it did train
        assert dataset.attrs["optimizer_stop"] == serial.attrs["optimizer_stop"]
        assert_same_file(dataset, serial, 1e-10)
        if method == "particles":
            assert np.array_equal(dataset["particles"].values, serial["particles"].values)


def test_members_beyond_the_seeds_share_their_layout():
    """What the layered transport and the heads' drift read of the layout (the heads' kernels and betas, their
    number, the hidden width, the activation, the layers) is shared: members differing in it batch apart, those
    differing in W1, b, W2, ffn_seed or a head's B and V together."""
    mlp, heads = beyond_seeds_members(2, "eulerian", "mlp"), beyond_seeds_members(2, "eulerian", "heads")
    head = heads[0]["model"]["extra_heads"][0]
    variants = [mlp[0], mlp[1], mlp[0].with_overrides(["model.hidden=4", "model.b=[0.0, 0.0, 0.0, 0.0]",
                                                    "model.W2=[[0.1, 0.0, 0.0, 0.0], [0.0, 0.1, 0.0, 0.0]]"]),
                mlp[0].with_overrides(["model.activation='relu'"]), heads[0], heads[1],
                heads[0].with_overrides([f"model.extra_heads=[{{kernel='unnormalized', beta=2.0, V={head['V']}}}]"]),
                heads[0].with_overrides([f"model.extra_heads=[{{beta=3.0, V={head['V']}}}]"]),
                heads[0].with_overrides([f"model.extra_heads=[{{V={head['V']}}}, {{V={head['V']}}}]"]),
                heads[0].with_overrides(["model.beta=1.5"]),
                mlp[0].with_overrides([f"model.W2={[mlp[0]['model']['W2']] * 2}"])]
    assert batches(variants) == [[0, 1], [2], [3], [4, 5], [6], [7], [8], [9], [10]]


def test_batched_particles_are_their_serial_runs_bit_for_bit():
    """Members of other seeds and V, each of 2 replica systems, with noise (heun's split): identical files."""
    cases = []
    for seed, scale in ((0, 1.0), (7, 1.0), (3, 0.6)):
        cases.append(case_from_dict({
            "sphere": {"dim": 3, "lmax": 8},
            "model": {"kernel": "softmax", "beta": 2.0, "V": [[scale, 0, 0], [0, 1.0, 0], [0, 0, 1.2]], "eps": 0.1},
            "initial": {"kind": "vmf", "mean": [1.0, 0.0, 0.0], "kappa": 1.0},
            "time": {"t_end": 0.3, "dt": 0.05, "save_every": 0.1},
            "solver": {"method": "particles", "device": "cpu"},
            "particles": {"n": 60, "seed": seed, "replicas": 2, "save": 60}}))
    batched = run_batch(cases, progress=False)
    for case, dataset in zip(cases, batched):
        assert_same_file(dataset, run(case, progress=False), 0)


def test_particles_on_and_off_the_seeds_paths_batch_apart_and_each_is_its_serial_run():
    """Two plain particle runs with a W per layer (two layers): repeating one matrix (the seeds' paths, one layer,
    the direct sums) and differing (the general drift of theta_l).  Batched together, the first took the general
    drift where its serial run took the direct sums: its positions 6e-16 apart (a review's finding).  They batch
    apart, and every batch's members have their serial runs' positions bit for bit."""
    rotation = [[0.0, 0.5], [-0.5, 0.0]]
    lists = ([rotation, rotation], [rotation, [[0.0, -0.5], [0.5, 0.0]]])
    cases = [case_from_dict({
        "sphere": {"dim": 2, "lmax": 12}, "model": {"kernel": "softmax", "beta": 2.0, "W": W},
        "initial": {"kind": "vmf", "mean": [1.0, 0.5], "kappa": 1.0}, "time": {"t_end": 1.0, "dt": 0.05},
        "solver": {"method": "particles", "device": "cpu"}, "diagnostics": {"w2": False},
        "particles": {"n": 64, "save": 64}}) for W in lists]
    assert [ParticleSystem(case).general for case in cases] == [False, True]
    assert batches(cases) == [[0], [1]]
    for batch in batches(cases):
        for m, dataset in zip(batch, run_batch([cases[m] for m in batch], progress=False)):
            assert np.array_equal(dataset["particles"].values, run(cases[m], progress=False)["particles"].values)


@pytest.mark.parametrize("n, dtype, beta", [(1700, "float64", 2.0), (600, "float32", 2.0), (1700, "float64", 1000.0),
                                           (600, "float32", 100.0), (3000, "float64", 2.0), (3000, "float64", 1000.0)])
def test_batched_large_systems_are_their_serial_runs_bit_for_bit(n, dtype, beta):
    """Systems whose kernels the forward stages form in blocks of query rows (above 181 tokens in float64, 256 in
    float32), three of 1700 tokens whose kernels together exceed DIRECT_BYTES (a review found such a batch
    taking the generic sums where each serial run took the direct ones, 2e-16 apart), and three of 3000 tokens,
    each kernel beyond DIRECT_BYTES (a forward run's direct sums serve any n), with the kernel unshifted and,
    beyond its exponent range, each row shifted by its largest logit: the direct sums, identical particles."""
    cases = [case_from_dict({
        "sphere": {"dim": 3, "lmax": 8},
        "model": {"kernel": "softmax", "beta": beta, "V": [[scale, 0, 0], [0, 1.0, 0], [0, 0, 1.2]]},
        "initial": {"kind": "vmf", "mean": [1.0, 0.0, 0.0], "kappa": 1.0},
        "time": {"t_end": 0.1, "dt": 0.05, "save_every": 0.1},
        "solver": {"method": "particles", "device": "cpu", "dtype": dtype}, "diagnostics": {"w2": False},
        "particles": {"n": n, "seed": seed, "save": n}}) for seed, scale in ((0, 1.0), (5, 0.6), (9, 1.3))]
    system = ParticleSystem(cases)
    assert system.integrator.direct_step(system.x0) is not None
    for case, dataset in zip(cases, run_batch(cases, progress=False)):
        assert np.array_equal(dataset["particles"].values, run(case, progress=False)["particles"].values)


def test_batches_group_what_can_run_together():
    """Seeds, eps, matrices and initial laws may differ within a batch; the grid, the step, the kernel and what
    eps implies (the scheme "auto" picks) may not; particles stepped by the CFL rule run alone, and those whose
    beta |B| is beyond the direct sums' unshifted exponent range (354.9 in float64) apart."""
    base = {"sphere": {"dim": 2, "lmax": 12}, "model": {"kernel": "softmax", "beta": 1.0, "eps": 0.1},
            "time": {"t_end": 0.2, "dt": 0.1}}

    def case(**sections):
        table = {key: dict(base.get(key, {})) | sections.get(key, {}) for key in set(base) | set(sections)}
        return case_from_dict(table)

    cases = [case(), case(model={"eps": 0.3, "V": [[2.0, 0.0], [0.0, 1.0]]}), case(sphere={"lmax": 16}),
             case(model={"eps": 0.0}), case(time={"dt": 0.05}),
             case(initial={"kind": "vmf", "mean": [0, 1], "kappa": 2.0}),
             case(model={"kernel": "unnormalized"})]
    assert batches(cases) == [[0, 1, 5], [2], [3], [4], [6]]
    assert batches(cases, largest=2) == [[0, 1], [2], [3], [4], [5], [6]]
    cfl = [case_from_dict({"sphere": base["sphere"], "time": {"t_end": 0.2, "cfl": 0.5},
                           "solver": {"method": "particles"}, "particles": {"seed": seed}}) for seed in range(3)]
    assert batches(cfl) == [[0], [1], [2]]
    # Particles take no time scheme: eps = 1e-4 and 0.1 (two schemes under "auto") run together, eps = 0 not.
    particles = [case(solver={"method": "particles"}, model={"eps": eps}) for eps in (1e-4, 0.1, 0.0)]
    assert batches(particles) == [[0, 1], [2]]
    # beyond the unshifted range the softmax's kernel rows are shifted (the unnormalized kernel's sums generic): apart
    direct = [case(solver={"method": "particles"}, model={"beta": beta}) for beta in (1.0, 300.0, 500.0, 1000.0)]
    assert batches(direct) == [[0, 1], [2, 3]]
    # beta = 0 takes the generic sums, beta > 0 the direct ones (a helper's reading: a sweep over beta = 0, 2 batched
    # both, the beta = 2 member apart from its serial run at round-off)
    constant = [case(solver={"method": "particles"}, model={"beta": beta}) for beta in (0.0, 2.0, 0.0)]
    assert batches(constant) == [[0, 2], [1]]
    # B given per layer: the largest layer's |B|_2 decides (the key took the norm of the whole array: ValueError)
    layers = [[[[1.0, 0.0], [0.0, 1.0]], [[scale, 0.0], [0.0, 1.0]]] for scale in (0.5, 2.0, 5.0)]
    layered = [case(solver={"method": "particles"}, model={"beta": 100.0, "B": B}) for B in layers]
    assert batches(layered) == [[0, 1], [2]]


def test_a_bad_member_fails_alone_naming_its_case_file():
    """A batch whose setup one member fails (beta = 50 needs more than lmax 8) runs its members alone: the good
    member gives its serial run's file, the bad one its own error, prefixed by its case file (every member was
    reported bad with the other's message)."""
    base = {"sphere": {"dim": 2, "lmax": 8}, "model": {"kernel": "softmax", "eps": 0.1},
            "time": {"t_end": 0.2, "dt": 0.1}, "solver": {"device": "cpu"}}
    cases = [case_from_dict(base | {"model": base["model"] | {"beta": beta}}, origin="sweep.toml")
             for beta in (0.0, 50.0)]
    assert batches(cases) == [[0, 1]]
    good, bad = run_batch(cases, progress=False)
    assert_same_file(good, run(cases[0], progress=False), 0)
    assert str(bad).startswith("sweep.toml: sphere.lmax: 8 is too coarse for model.beta = 50")
