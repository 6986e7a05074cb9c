"""The particle solver: exact samplers, integrator orders, invariants, closed forms, and
agreement with the Eulerian solver within Monte Carlo standard errors."""

import math

import numpy as np
import ot
import pytest
import torch
from conftest import identity, make_case
from scipy import stats
from scipy.integrate import quad
from scipy.linalg import expm
from scipy.special import i0, iv, ive, softmax
from test_eulerian import hemisphere_mass

import spherepde
from solvers.checkpoint import Checkpoint
from solvers.particle_field import ParticleField, fused_softmax_mean, hardmax_mean
from solvers.particles import Integrator, contraction_number, contraction_within_step, noise_variance, run_particles
from spherepde.analysis.compare import compare
from spherepde.base.device import placement
from spherepde.base.errors import CaseError
from spherepde.discretisation.bases import make_basis
from spherepde.io.output import split_both
from spherepde.measures.optimal_transport import c_transform, circle_c_transform, exact_transport
from spherepde.model.attention import Model, ModelBatch
from spherepde.model.sampling import DensityFileSampler, initial_particles, uniform, vmf_mixture, von_mises_fisher

CPU64 = placement("cpu", "float64")
SEED_003 = {"kernel": "softmax", "beta": "inf", "B": [[-1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]],
            "V": [[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -2.0]]}


def generator(seed=0):
    return torch.Generator().manual_seed(seed)


def particle_case(dim, n, model=None, initial=None, time=None, particles=None, diagnostics=None, solver=None):
    case = make_case(dim, 16, model=model, initial=initial, time=time, diagnostics=diagnostics, solver=solver)
    return case.with_overrides([f"particles.{key}={value!r}" if isinstance(value, str) else f"particles.{key}={value}"
                                for key, value in ({"n": n} | (particles or {})).items()])


# --- samplers --------------------------------------------------------------------------------------


def vmf_component_cdf(dim, kappa):
    """CDF of w = <mu, x> for vMF on S^{dim-1}: density proportional to exp(kappa w) (1 - w^2)^((dim-3)/2)."""
    def density(w):
        return math.exp(kappa * (w - 1)) * (1 - w * w) ** ((dim - 3) / 2)
    total = quad(density, -1, 1)[0]
    return np.vectorize(lambda w: quad(density, -1, min(max(w, -1), 1))[0] / total)


@pytest.mark.parametrize("dim, kappa", [(2, 3.0), (3, 0.7), (5, 8.0), (12, 20.0)])
def test_vmf_sampler_law_of_the_component_along_the_mean(dim, kappa):
    mean = np.arange(1.0, dim + 1)
    mean /= np.linalg.norm(mean)
    x = von_mises_fisher(4000, mean, kappa, generator()).numpy()
    assert np.abs(np.linalg.norm(x, axis=1) - 1).max() <= 1e-14
    assert stats.kstest(x @ mean, vmf_component_cdf(dim, kappa)).pvalue > 1e-3
    # E <mu, x> = I_{d/2}(kappa) / I_{d/2 - 1}(kappa), and the component orthogonal to mu has mean zero
    w = x @ mean
    assert abs(w.mean() - iv(dim / 2, kappa) / iv(dim / 2 - 1, kappa)) <= 4 * w.std() / math.sqrt(len(w))
    orthogonal = x - w[:, None] * mean
    assert np.all(np.abs(orthogonal.mean(0)) <= 4 * orthogonal.std(0) / math.sqrt(len(w)) + 1e-15)


@pytest.mark.parametrize("dim", [2, 3, 5])
@pytest.mark.parametrize("kappa", [50.0, 1e16, 1e300, 1.7e308])
def test_vmf_sampler_keeps_its_law_at_any_finite_concentration(dim, kappa):
    """kappa E|x - <mu, x> mu|^2 = kappa (1 - E w^2) = (d - 1) A_d(kappa), A_d = I_{d/2} / I_{d/2 - 1}: exact at
    every kappa, and -> d - 1 as kappa -> inf.  Wood's test as printed takes log 0 from kappa ~ 1e16 and
    overflows from 1e154; at mu = e_1 the sample's orthogonal part holds all digits of 1 - w^2."""
    x = von_mises_fisher(20000, np.eye(dim)[0], kappa, generator(4)).numpy()
    scaled = kappa * (x[:, 1:] ** 2).sum(1)
    ratio = ive(dim / 2, kappa) / ive(dim / 2 - 1, kappa) if kappa < 1e10 else 1 - (dim - 1) / (2 * kappa)
    assert abs(scaled.mean() - (dim - 1) * ratio) <= 4 * scaled.std() / math.sqrt(len(scaled))


def test_vmf_sampler_is_rotation_symmetric_about_its_mean():
    """On S^2 the azimuth around mu is uniform, whatever mu (the Householder reflection)."""
    mean = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8])
    x = von_mises_fisher(5000, mean, 2.0, generator(1)).numpy()
    frame = np.linalg.svd(np.eye(3) - np.outer(mean, mean))[0][:, :2]
    azimuth = np.arctan2(x @ frame[:, 1], x @ frame[:, 0])
    assert stats.kstest(azimuth, stats.uniform(-np.pi, 2 * np.pi).cdf).pvalue > 1e-3


def test_uniform_and_mixture_samplers():
    x = uniform(20000, 4, generator(2)).numpy()
    assert np.all(np.abs(x.mean(0)) <= 4 / math.sqrt(4 * 20000))  # Var x_k = 1/d
    second = x.T @ x / len(x)
    assert np.abs(second - np.eye(4) / 4).max() <= 0.01
    means, kappas, weights = [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], [50.0, 50.0], [0.3, 0.7]
    y = vmf_mixture(10000, means, kappas, weights, generator(3)).numpy()
    first = y[:, 0] > y[:, 2]
    assert abs(first.mean() - 0.3) <= 4 * math.sqrt(0.3 * 0.7 / len(y))
    assert first[:20].any() and not first[:20].all()  # components interleaved: any prefix is a fair subsample


def test_a_mixture_of_more_components_than_points_draws_from_those_it_picks():
    """Fewer points than components leaves some component without a point, a vMF draw of none (it raised before:
    now an empty (0, d) tensor); at kappa = 1e8 each point lies within 1e-3 of the mean of the component its
    label names (the labels drawn first, from the same generator)."""
    means, weights = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], [0.2, 0.3, 0.5]
    for n, seed in [(1, 0), (2, 1), (2, 2)]:
        x = vmf_mixture(n, means, [1e8] * 3, weights, generator(seed)).numpy()
        labels = torch.multinomial(torch.tensor(weights, dtype=torch.float64), n, replacement=True,
                                   generator=generator(seed)).numpy()
        assert np.abs(x - np.asarray(means)[labels]).max() <= 1e-3
    assert von_mises_fisher(0, [0.0, 1.0], 3.0, generator()).shape == (0, 2)


def test_samples_are_reproducible_bit_for_bit():
    section = {"kind": "vmf_mixture", "means": [[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]], "kappas": [2.0, 9.0],
               "weights": [0.5, 0.5]}
    first, second = (initial_particles(section, 3, 3000, generator(7)) for _ in range(2))
    assert torch.equal(first, second)
    assert not torch.equal(first, initial_particles(section, 3, 3000, generator(8)))


@pytest.mark.parametrize("dim, lmax", [(2, 16), (3, 12)])
def test_density_file_sampler_reproduces_the_moments_of_the_density(tmp_path, dim, lmax):
    """Samples of a stored density: first and second moments within 4 standard errors of the
    quadrature moments of the density itself."""
    means = [[1.0, 0.0], [-0.6, 0.8]] if dim == 2 else [[1.0, 0.0, 0.0], [0.0, -0.6, 0.8]]
    case = make_case(dim, lmax, model={"eps": 0.1}, initial={"kind": "vmf_mixture", "means": means,
                                                             "kappas": [4.0, 2.0], "weights": [0.7, 0.3]},
                     time={"t_end": 0.2, "dt": 0.05, "save_every": 0.2})
    path = tmp_path / "run.nc"
    from spherepde.io.output import write_dataset

    dataset = spherepde.run(case, progress=False)
    write_dataset(dataset, path)
    basis = make_basis(dim, lmax, CPU64)
    points = basis.points.reshape(-1, dim).numpy()
    masses = (dataset["density"].values[-1] * dataset["cell_area"].values).reshape(-1)
    x = DensityFileSampler(str(path), -1, dim).sample(40000, generator(4)).numpy()
    features = np.concatenate([x, (x[:, :, None] * x[:, None, :]).reshape(len(x), -1)], axis=1)
    exact = np.concatenate([masses @ points, ((points[:, :, None] * points[:, None, :]).reshape(len(points), -1)
                                              * masses[:, None]).sum(0)])
    error = features.std(0) / math.sqrt(len(x))
    assert np.all(np.abs(features.mean(0) - exact) <= 4 * error + 1e-12), (features.mean(0) - exact) / error


def test_density_file_of_another_sphere_is_a_case_error(tmp_path):
    case = make_case(2, 8, time={"t_end": 0.1, "dt": 0.05, "save_every": 0.1})
    from spherepde.io.output import write_dataset

    write_dataset(spherepde.run(case, progress=False), tmp_path / "circle.nc")
    with pytest.raises(CaseError, match=r"initial.path: .* holds a density on S\^1, the case is on S\^2"):
        DensityFileSampler(str(tmp_path / "circle.nc"), -1, 3)


# --- the drift ---------------------------------------------------------------------------------------


def batch_of(case, place=CPU64):
    return ModelBatch.of([Model.from_case(case, place)])


def test_fused_and_dense_attention_agree_and_hardmax_is_the_zero_temperature_limit():
    case = make_case(3, 12, model={"beta": 3.0, "B": [[1.0, 0.2, 0.0], [0.0, 0.9, 0.1], [0.1, 0.0, 1.1]]})
    batch = batch_of(case)
    x = uniform(700, 3, generator(5))[None]
    assert ParticleField.from_case(case, batch).attention == "dense"  # fused attention is for CUDA only
    dense = ParticleField(batch, "dense", 128).mean_field(x)
    fused = fused_softmax_mean(batch.B, batch.beta, x, 100)
    assert torch.abs(dense - fused).max() <= 1e-13
    cold = batch_of(case.with_overrides(["model.beta=1e5"]))
    assert torch.equal(hardmax_mean(cold.B, x, 64), hardmax_mean(batch.B, x, 1000))
    # where the best score leads the runner-up by 1e-3, softmax weights off the argmax are below e^(-100)
    scores = torch.sort((x[0] @ batch.B[0]) @ x[0].T, dim=1, descending=True).values
    clear = scores[:, 0] - scores[:, 1] > 1e-3
    assert int(clear.sum()) > 400
    difference = fused_softmax_mean(cold.B, cold.beta, x, 100) - hardmax_mean(cold.B, x, 64)
    assert torch.abs(difference[0][clear]).max() <= 1e-12


@pytest.mark.parametrize("dtype, beta, tolerance", [("float64", 1000.0, 1e-13), ("float32", 100.0, 2e-6)])
def test_the_direct_softmax_mean_beyond_the_exponent_range_is_scipys_softmax(dtype, beta, tolerance):
    """beta |B|_2 beyond the unshifted kernel's range (354.9 in float64, 44.4 in float32): the direct sums take the
    softmax with each kernel row shifted by its largest logit, and m_i = sum_j softmax_j(beta <x_i, B x_j>) x_j is
    scipy's (float64; measured 1.2e-14 at beta = 1000, where the logits' round-off is beta times float64's, and
    3.6e-7 in float32), 700 tokens in blocks of query rows."""
    B = [[1.0, 0.2, 0.0], [0.0, 0.9, 0.1], [0.1, 0.0, 1.1]]
    case = make_case(3, 12, model={"beta": beta, "B": B}, solver={"method": "particles", "dtype": dtype})
    field = ParticleField(batch_of(case, placement("cpu", dtype)), "dense", 128)
    x = uniform(700, 3, generator(5))[None]
    mean = field.mean_field(x.to(getattr(torch, dtype)))
    assert field.direct and field.shifted
    points = x[0].numpy()
    exact = softmax(beta * points @ np.array(B) @ points.T, axis=1) @ points
    assert np.abs(mean[0].double().numpy() - exact).max() <= tolerance


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-12), ("float32", 2e-5)])
def test_the_device_attention_matches_the_cpu_dense_mean(dtype, tolerance, device):
    """Fused attention on CUDA, the dense sum on the CPU, against the CPU float64 dense sum."""
    case = make_case(3, 12, model={"beta": 3.0, "B": [[1.0, 0.2, 0.0], [0.0, 0.9, 0.1], [0.1, 0.0, 1.1]]},
                     solver={"device": device, "dtype": dtype})
    place = placement(device, dtype)
    field = ParticleField.from_case(case, batch_of(case, place))
    assert field.attention == ("fused" if device == "cuda" else "dense")
    x = uniform(5000, 3, generator(5))[None]
    dense = ParticleField(batch_of(case), "dense", 512).mean_field(x)
    mean = field.mean_field(x.to(place.device, place.real)).cpu().double()
    assert torch.abs(mean - dense).max() <= tolerance


@pytest.mark.parametrize("dim", [2, 3])
def test_a_float32_noisy_run_follows_the_float64_runs_brownian_path(dim):
    """The Gaussian increments are drawn in float64 and cast: a float32 particle run with noise stays within float32
    round-off of the float64 run of the same seed (its own float32 draws were another sequence: O(1) apart)."""
    runs = [run_particles(particle_case(dim, 300, model={"beta": 2.0, "eps": 0.1}, particles={"save": 300},
                                        time={"t_end": 0.5, "dt": 0.05, "save_every": 0.25},
                                        solver={"dtype": dtype}))
            for dtype in ("float64", "float32")]
    positions = [run["particles"].values[-1].astype(float) for run in runs]
    assert 0 < np.abs(positions[0] - positions[1]).max() < 1e-5


def test_replicas_are_independent_systems_with_batch_mean_errors():
    """replicas = R: the drift of a token sees its own block of n / R tokens only, and the standard
    error of a diagnostic is the spread of the R block estimates / sqrt(R)."""
    case = particle_case(3, 600, model={"beta": 2.0, "eps": 0.1}, particles={"replicas": 3, "save": 600},
                         time={"t_end": 0.2, "dt": 0.05, "save_every": 0.1})
    batch = batch_of(case)
    x = uniform(600, 3, generator(9))[None]
    field = ParticleField.from_case(case, batch)
    assert field.replicas == 3
    single = ParticleField(batch, field.attention, 4096)
    assert torch.equal(field(x, batch.W)[:, 200:400], single(x[:, 200:400], batch.W))
    dataset = run_particles(case)
    blocks = dataset["particles"].values[-1].reshape(3, 200, 3)
    block_means = blocks.mean(1)
    assert np.allclose(dataset["mean"].values[-1], block_means.mean(0), atol=1e-15)
    assert np.allclose(dataset["mean_stderr"].values[-1], block_means.std(0, ddof=1) / math.sqrt(3), atol=1e-15)
    # |m| of each system, averaged: the value its spread is the error of (not |m| of all 600 tokens)
    block_radii = np.linalg.norm(block_means, axis=1)
    assert np.allclose(dataset["order_parameter"].values[-1], block_radii.mean(), atol=1e-15)
    assert np.allclose(dataset["order_parameter_stderr"].values[-1], block_radii.std(ddof=1) / math.sqrt(3),
                       atol=1e-15)
    assert abs(dataset["order_parameter"].values[-1] - np.linalg.norm(block_means.mean(0))) > 1e-3
    assert "batch means over 3 independent systems" in dataset.attrs["stderr"]
    with pytest.raises(CaseError, match=r"particles.replicas: must divide particles.n = 600"):
        case.with_overrides(["particles.replicas=7"])


# --- integrators ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("integrator, order", [("euler", 1), ("heun", 2), ("rk4", 4)])
def test_deterministic_orders(integrator, order):
    case = make_case(3, 12, model={"beta": 1.0, "B": [[1.0, 0.2, 0.0], [0.0, 0.9, 0.1], [0.1, 0.0, 1.1]],
                                   "V": [[1.0, 0.0, 0.3], [0.0, 0.8, 0.0], [0.2, 0.0, 1.2]],
                                   "W": [[0.0, 0.5, 0.0], [-0.5, 0.0, 0.2], [0.0, -0.2, 0.0]]})
    batch = batch_of(case)
    field = ParticleField.from_case(case, batch)
    x0 = uniform(64, 3, generator(6))[None]
    reference = Integrator("rk4", field, batch.eps).interval(x0, batch.W, 1 / 640, 640, None)
    errors = [float((Integrator(integrator, field, batch.eps).interval(x0, batch.W, 1 / steps, steps, None)
                     - reference).norm(dim=-1).max()) for steps in (10, 20, 40)]
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - order) <= 0.1), (errors, orders)


def expected_cosine(sigma_squared, k):
    """E cos(sigma |g|), g ~ N(0, I_k): the factor by which a geodesic Gaussian step multiplies <x, x0>."""
    chi = stats.chi(k)
    return quad(lambda r: math.cos(math.sqrt(sigma_squared) * r) * chi.pdf(r), 0, np.inf)[0]


@pytest.mark.parametrize("dim", [3, 6])
def test_noise_step_is_weak_second_order(dim):
    """Brownian motion: E <X_tau, x> = exp(-(d-1) eps tau).  The corrected geodesic step errs by O(tau^3)
    (local), the plain Euler-Maruyama variance 2 eps tau by O(tau^2)."""
    eps, k = 1.0, dim - 1
    corrected, plain = [], []
    for tau in (0.05, 0.025, 0.0125):
        exact = math.exp(-k * eps * tau)
        corrected.append(abs(expected_cosine(noise_variance(eps, tau, dim), k) - exact))
        plain.append(abs(expected_cosine(2 * eps * tau, k) - exact))
    assert np.all(np.abs(np.log2(np.array(corrected[:-1]) / np.array(corrected[1:])) - 3) <= 0.2), corrected
    assert np.all(np.abs(np.log2(np.array(plain[:-1]) / np.array(plain[1:])) - 2) <= 0.2), plain


@pytest.mark.parametrize("integrator", ["euler", "heun"])
def test_pure_noise_run_matches_the_kernel_of_its_scheme(integrator):
    """V = W = 0: every step multiplies E <X, e_1> by E cos(sigma |g|); after 8 steps the empirical mean
    of x_1 is within 4 standard errors of that product (and heun within 4 SE of exp(-2 eps t))."""
    eps, t_end, steps = 0.5, 0.8, 8
    case = particle_case(3, 100000, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(3, 0.0), "eps": eps},
                         initial={"kind": "vmf", "mean": [1.0, 0.0, 0.0], "kappa": 1e8},
                         time={"t_end": t_end, "dt": t_end / steps, "save_every": t_end},
                         particles={"integrator": integrator, "save": 0}, diagnostics={"w2": False})
    dataset = run_particles(case)
    mean, error = (float(dataset[name][-1, 0]) for name in ("mean", "mean_stderr"))
    h = t_end / steps
    start = float(dataset["mean"][0, 0])
    if integrator == "euler":
        predicted = start * expected_cosine(2 * eps * h, 2) ** steps
    else:
        predicted = start * expected_cosine(noise_variance(eps, h / 2, 3), 2) ** 2 * \
            expected_cosine(noise_variance(eps, h, 3), 2) ** (steps - 1)
        assert abs(mean - start * math.exp(-2 * eps * t_end)) <= 4 * error
    assert abs(mean - predicted) <= 4 * error, (mean, predicted, error)


@pytest.mark.parametrize("theta", [0.3, 1.0])
def test_contraction_number_is_the_drifts_rate_along_the_flow(theta):
    """S^1, beta = 0, unnormalized, V = K I: v = K P_x m.  Two groups at angles +-theta keep m = cos(theta) e_1, so
    theta' = -(K / 2) sin(2 theta), whose rate along the flow is K cos(2 theta): contracting below pi / 4, expanding
    above (z < 0)."""
    K, h = 30.0, 1e-5
    case = make_case(2, 8, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(2, K)})
    batch = batch_of(case)
    x = torch.tensor([[math.cos(theta), math.sin(theta)], [math.cos(theta), -math.sin(theta)]], dtype=torch.float64)
    z = contraction_number(ParticleField.from_case(case, batch), x.repeat(4, 1)[None], batch.W, np.array([h]))
    assert z[0] == pytest.approx(h * K * math.cos(2 * theta), rel=1e-3)


@pytest.mark.parametrize("delta", [0.0025, 0.003, 0.0021, 0.004])
def test_the_contraction_within_a_stalled_step_is_found(delta):
    """seed003-baseline-beta1000's model (B = diag(-1, -1, 1), V = diag(-1, 1, -2)) with two antipodal clusters +-p,
    p = cos(delta) a + sin(delta) e, a = -(1, 0, 1) / sqrt 2, e = (1, 0, -1) / sqrt 2: each attends to the two in
    the ratio exp(2 beta <p, B p>), so that along e v = -tanh(2 beta delta) / 2 to first order in delta, contracting
    at the rate beta sech^2(2 beta delta), beta at delta = 0.  A step of h = 0.01 (|v| = 1/2) takes delta to about
    delta - h / 2: across the turn, where v(y) = -v(x), so the rate over the step reads 2 / h (z = 2, the
    particles stall there), a fifth of beta; the probes, 1/32 of a step from the turn at most, find at least
    beta sech^2(2 beta h / 64)."""
    beta, h = 1000.0, 0.01
    case = make_case(3, 8, model={"kernel": "softmax", "beta": beta, "B": [[-1.0, 0.0, 0.0], [0.0, -1.0, 0.0],
                                                                          [0.0, 0.0, 1.0]],
                                  "V": [[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -2.0]]})
    batch = batch_of(case)
    field = ParticleField.from_case(case, batch)
    a, e = np.array([-1.0, 0.0, -1.0]) / math.sqrt(2), np.array([1.0, 0.0, -1.0]) / math.sqrt(2)
    p = math.cos(delta) * a + math.sin(delta) * e
    x = torch.tensor(np.array([p, p, -p, -p]))[None]
    assert contraction_number(field, x, batch.W, np.array([h]))[0] == pytest.approx(2.0, abs=0.04)
    within = contraction_within_step(field, x, batch.W, np.array([h]))[0]
    assert beta / math.cosh(2 * beta * h / 64) ** 2 * (1 - 1e-3) <= within <= beta * (1 + 1e-3)


@pytest.mark.parametrize("dt, noted", [(0.1, True), (0.01, False)])
def test_a_step_too_long_for_the_contraction_is_noted(dt, noted):
    """beta = 0, unnormalized, V = 30 I, eps = 0, from near consensus (|m| = 0.97): the tokens contract at about
    30 |m|, beyond Heun's stability at dt = 0.1 (z = 2.7 > 2): that run leaves consensus and says why; at dt = 0.01
    it reaches it (|m| -> 1), silently."""
    case = particle_case(2, 200, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(2, 30.0)},
                         initial={"kind": "vmf", "mean": [1.0, 0.0], "kappa": 20.0},
                         time={"t_end": 4.0, "dt": dt, "save_every": 0.5}, particles={"integrator": "heun"},
                         diagnostics={"w2": False})
    dataset = run_particles(case)
    assert ("time.dt: steps of 0.1 are too long for the drift" in dataset.attrs["notes"]) == noted
    assert (dataset["order_parameter"].values[-1] < 0.9) == noted


# --- invariants in any dimension ---------------------------------------------------------------------


@pytest.mark.parametrize("dim", [4, 9, 16])
def test_rigid_rotation_in_high_dimension(dim):
    """V = 0, W antisymmetric: v = W x, so x(t) = expm(t W) x(0) exactly (RK4 to its order)."""
    rng = np.random.default_rng(dim)
    A = rng.standard_normal((dim, dim))
    W = (A - A.T) / 4
    case = particle_case(dim, 200, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(dim, 0.0),
                                          "W": W.tolist()},
                         initial={"kind": "uniform"}, time={"t_end": 1.0, "dt": 0.005, "save_every": 0.5},
                         particles={"integrator": "rk4"}, diagnostics={"w2": False})
    dataset = run_particles(case)
    x0, x1 = dataset["particles"].values[0], dataset["particles"].values[-1]
    assert np.abs(x1 - x0 @ expm(W).T).max() <= 1e-9
    assert np.abs(dataset["mean"].values[-1] - dataset["mean"].values[0] @ expm(W).T).max() <= 1e-9


@pytest.mark.parametrize("dim", [4, 8, 16])
def test_order_parameter_never_decreases_in_high_dimension(dim):
    """beta = 0, unnormalized, V = I, W = 0, eps = 0: v = P_x m, and d|m|^2/dt = 2 (|m|^2 - (1/n) sum <x_i, m>^2) >= 0.
    The flow is the gradient ascent of |m|^2 / 2: the tokens reach consensus (|m| -> 1)."""
    case = particle_case(dim, 500, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(dim)},
                         initial={"kind": "vmf", "mean": [1.0] + [0.0] * (dim - 1), "kappa": 0.5 * dim},
                         time={"t_end": 12.0, "dt": 0.05, "save_every": 0.25}, particles={"integrator": "heun"},
                         diagnostics={"w2": False})
    r = run_particles(case)["order_parameter"].values
    assert np.diff(r).min() >= -1e-12
    assert r[0] < 0.9 and r[-1] > 1 - 1e-6


def test_same_seed_same_run_bit_for_bit():
    case = particle_case(5, 300, model={"beta": 2.0, "eps": 0.1, "V": identity(5, 1.5)},
                         time={"t_end": 0.4, "dt": 0.05, "save_every": 0.2}, particles={"seed": 11})
    first, second = run_particles(case), run_particles(case)
    for name in ("particles", "mean", "order_parameter", "interaction_energy", "w2_projection"):
        assert np.array_equal(first[name].values, second[name].values, equal_nan=True), name
    other = run_particles(case.with_overrides(["particles.seed=12"]))
    assert not np.array_equal(first["particles"].values, other["particles"].values)


# --- closed forms ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3])
def test_the_delta_method_and_hoeffding_errors_of_a_few_tokens(n):
    """n = 3: the order parameter's error is std(<x_i, m / |m|>) / sqrt(n) and the interaction energy's
    std(g) / sqrt(n), g_i = (1 / (n - 1)) sum_{j != i} k(x_i, x_j), both computed here from the tokens.  n = 2:
    both read 0 whatever the pair (x_i - m is orthogonal to m, g_1 = g_2), which a comparison took for an exact
    value; they are NaN, the mean's error (which the pair does estimate) as at any n."""
    beta = 1.5
    case = particle_case(2, n, model={"kernel": "unnormalized", "beta": beta}, initial={"kind": "uniform"},
                         time={"t_end": 0.1, "dt": 0.1, "save_every": 0.1}, diagnostics={"w2": False},
                         particles={"save": n})
    dataset = run_particles(case)
    x = dataset["particles"].values[0]
    m = x.mean(0)
    assert np.allclose(dataset["mean_stderr"].values[0], x.std(0, ddof=1) / math.sqrt(n), rtol=1e-12)
    k = np.exp(beta * x @ x.T)
    g = (k.sum(1) - np.diag(k)) / (n - 1)
    assert float(dataset["interaction_energy"][0]) == pytest.approx(-0.5 * g.mean(), rel=1e-12)
    errors = [float(dataset[f"{name}_stderr"][0]) for name in ("order_parameter", "interaction_energy")]
    if n == 2:
        assert np.isnan(errors).all()
    else:
        expected = [(x @ (m / np.linalg.norm(m))).std(ddof=1) / math.sqrt(n), g.std(ddof=1) / math.sqrt(n)]
        assert errors == pytest.approx(expected, rel=1e-12) and min(expected) > 1e-3


@pytest.mark.parametrize("dim, beta", [(2, 1.5), (3, 2.0)])
def test_interaction_energy_of_uniform_tokens(dim, beta):
    """-1/2 int int exp(beta <x, y>) for uniform x, y: -I_0(beta)/2 (S^1), -sinh(beta)/(2 beta) (S^2)."""
    case = particle_case(dim, 3000, model={"kernel": "unnormalized", "beta": beta}, initial={"kind": "uniform"},
                         time={"t_end": 0.1, "dt": 0.1, "save_every": 0.1}, diagnostics={"w2": False})
    dataset = run_particles(case)
    exact = -0.5 * (i0(beta) if dim == 2 else math.sinh(beta) / beta)
    value, error = float(dataset["interaction_energy"][0]), float(dataset["interaction_energy_stderr"][0])
    assert 0 < error < 0.05 * abs(exact)
    assert abs(value - exact) <= 3 * error



def test_interaction_energy_error_of_replicas_beyond_the_squares_range():
    """particles.replicas = 2 at beta = 400 on S^1: each system's U-statistic is about -8.9e171, whose squared
    deviations overflow; the standard error by batch means was inf.  It is |U_1 - U_2| / 2 of the two systems'
    U-statistics computed here from the saved tokens (a log-sum-exp over the pairs i != j), to 1e-12."""
    beta = 400.0
    case = particle_case(2, 12, model={"beta": beta}, initial={"kind": "vmf", "mean": [1.0, 0.0], "kappa": 0.5},
                         time={"t_end": 0.02, "dt": 0.01, "save_every": 0.01}, diagnostics={"w2": False},
                         particles={"replicas": 2, "save": 12})
    dataset = run_particles(case)
    for tokens, value, error in zip(dataset["particles"].values, dataset["interaction_energy"].values,
                                    dataset["interaction_energy_stderr"].values):
        energies = []
        for system in np.split(tokens, 2):
            logits = beta * system @ system.T
            np.fill_diagonal(logits, -np.inf)
            largest = logits.max()
            energies.append(-0.5 * np.exp(largest) * np.exp(logits - largest).sum() / (len(system) * (len(system) - 1)))
        assert abs(value) > 1e170
        assert value == pytest.approx(np.mean(energies), rel=1e-12)
        assert error == pytest.approx(abs(energies[0] - energies[1]) / 2, rel=1e-12)

def test_c_transform_is_the_smallest_shifted_squared_distance():
    points, atoms = uniform(3000, 3, generator(1)).numpy(), uniform(200, 3, generator(2)).numpy()
    potential = np.random.default_rng(3).uniform(-0.5, 0.5, 200)
    direct = np.array([min(float(((x - a) ** 2).sum()) - v for a, v in zip(atoms, potential)) for x in points[:300]])
    assert np.abs(c_transform(points, atoms, potential, block=128)[:300] - direct).max() <= 1e-14


@pytest.mark.parametrize("blocks", [1024, 3])
def test_circle_c_transform_is_the_c_transform_whatever_it_leaves_out(blocks, monkeypatch):
    """The arc search returns the minimum over all atoms (`c_transform`, every pair) to round-off: for a smooth
    potential, for random potentials (where the least term can be anywhere), for none, with coincident points
    (two of them 500 times over), angles on both sides of +-pi, sizes no block divides, and (blocks = 3) blocks
    larger than CIRCLE_BLOCK."""
    from spherepde.measures import optimal_transport
    monkeypatch.setattr(optimal_transport, "CIRCLE_BLOCKS", blocks)
    rng = np.random.default_rng(4)
    theta = np.concatenate([rng.vonmises(math.pi, 2.0, 3001), [math.pi, -math.pi, 0.5, 0.5]])
    phi = rng.vonmises(math.pi - 0.2, 3.0, 777)
    points, atoms = (np.stack([np.cos(t), np.sin(t)], 1) for t in (theta, phi))
    smooth = 2 - 2 * np.cos(phi - math.pi) - 1.5 * np.sin(phi) ** 2
    for potential in (smooth, rng.uniform(-2.0, 2.0, 777), np.zeros(777)):
        assert np.abs(circle_c_transform(points, atoms, potential)
                      - c_transform(points, atoms, potential)).max() <= 1e-14
    assert np.abs(circle_c_transform(points, points, np.zeros(3005))).max() <= 1e-15  # each point is an atom
    copies = np.concatenate([np.repeat(points[:2], 500, axis=0), points[2:]])  # as Pi sends particles to +-e_1
    assert np.abs(circle_c_transform(copies, atoms, smooth) - c_transform(copies, atoms, smooth)).max() <= 1e-14


@pytest.mark.parametrize("tolerance", [1e-3, 0.05, 1.0])
def test_circle_c_transform_with_a_tolerance_stays_below_the_c_transform(tolerance):
    """With a tolerance t the arc search leaves out the blocks whose bound lies within t of the minimum found, and
    its values u' satisfy u - t <= u' <= u (u the c-transform of all pairs): a lower bound, so still a potential
    whose dual value bounds the optimal cost from below, within t of u's.  At t = 1e-3 no block is left out here;
    at 0.05 and 1 some are (u' < u at 438 and 4356 of the 5000 points, by up to 0.049 and 0.79)."""
    rng = np.random.default_rng(8)
    theta, phi = rng.vonmises(0.0, 1.0, 5000), rng.vonmises(1.0, 2.0, 4000)
    points, atoms = (np.stack([np.cos(t), np.sin(t)], 1) for t in (theta, phi))
    potential = 2 - 2 * np.cos(phi - 1.0) - 1.5 * np.sin(phi) ** 2 + 0.1 * rng.uniform(size=4000)
    exact = c_transform(points, atoms, potential)
    relaxed = circle_c_transform(points, atoms, potential, tolerance)
    assert (relaxed <= exact + 1e-14).all() and (relaxed >= exact - tolerance - 1e-14).all()
    assert (relaxed < exact - 1e-12).any() == (tolerance > 1e-3)


def test_paired_cost_is_paired_transports_cost():
    """half_sample_bias's paired_cost, certified with circle_transport's slack, returns paired_transport's W2^2
    bit for bit: where the rearrangement is certified; for far-apart samples whose excess e lies below the sum of
    the quantisation bounds at `atoms` (the rearrangement kept) and above it at more atoms (exact OT of the
    quantised measures, another value); with no quantisation (exact OT of all pairs); and on S^2."""
    from spherepde.measures.optimal_transport import circle_transport, paired_cost, paired_transport, quantise
    rng = np.random.default_rng(5)
    x, y = (np.stack([np.cos(a), np.sin(a)], 1) for a in (rng.vonmises(0.0, 1.0, 1000), rng.vonmises(0.1, 1.0, 1000)))
    assert paired_cost(x, y, 250) == paired_transport(x, y, 250)[0]
    x, y = (np.stack([np.cos(a), np.sin(a)], 1) for a in (rng.vonmises(0.0, 1.0, 1000), rng.vonmises(1.0, 4.0, 1000)))
    cost, lower, _ = circle_transport(x, y)
    excess = math.sqrt(cost) - math.sqrt(lower)
    uniform = np.full(1000, 1e-3)
    bounds = {atoms: quantise(x, uniform, atoms)[2] + quantise(y, uniform, atoms)[2] for atoms in range(10, 60)}
    below = max(atoms for atoms, bound in bounds.items() if bound > excess)
    above = min(atoms for atoms, bound in bounds.items() if bound < excess)
    for atoms, kept in [(below, True), (above, False), (1000, False)]:
        value = paired_transport(x, y, atoms)[0]
        assert paired_cost(x, y, atoms) == value and (value == cost) == kept
    x, y = (v / np.linalg.norm(v, axis=1, keepdims=True) for v in rng.normal(size=(2, 300, 3)))
    assert paired_cost(x, y, 100) == paired_transport(x, y, 100)[0]


def test_quantisation_bound_is_the_transport_to_the_cells_atoms():
    """quantise's bound is the cost of moving each atom to its cell's, so it bounds W2(mu, quantised mu) from
    above (exact OT of all pairs, POT emd; to its round-off, 1e-12), and that coupling is nearly optimal: within 1%
    of W2 (on S^1, where it is monotone, it is the optimal one).  The largest cell diameter it replaced is at least
    3 times as wide, on S^1 and S^2, for uniform and concentrated measures with unequal masses."""
    from spherepde.measures.optimal_transport import quantise
    rng = np.random.default_rng(11)
    cells = [(2, 200, 2 * math.sin(math.pi / 200)), (3, 800, 2 * math.sin(math.sqrt(2) * math.pi / 40))]  # 20 rows
    for dim, atoms, diameter in cells:
        for concentration in (0.0, 3.0):
            x = rng.normal(size=(3000, dim))
            x[:, 0] += concentration
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            masses = rng.uniform(0.5, 1.5, 3000)
            centres, cell_masses, bound = quantise(x, masses, atoms)
            assert len(cell_masses) <= atoms and cell_masses.sum() == pytest.approx(masses.sum(), rel=1e-12)
            w2 = math.sqrt(ot.emd2(masses / masses.sum(), cell_masses / cell_masses.sum(), ot.dist(x, centres),
                                   numItermax=10 ** 8))
            assert w2 - 1e-12 <= bound <= 1.01 * w2 and 3 * bound < diameter, (dim, concentration, w2, bound)


def test_w2_projection_at_time_zero_on_the_circle():
    """E = span(e_1): Pi sends x to the nearer of +-e_1, which is the optimal map, so
    W2(rho_0, Pi_# rho_0)^2 = int (2 - 2 |x_1|) drho_0; the estimate is within 3 standard errors."""
    mean, kappa = np.array([0.6, 0.8]), 1.0
    case = particle_case(2, 1000, model={"kernel": "unnormalized", "beta": 0.0, "V": [[1.0, 0.0], [0.0, 0.5]]},
                         initial={"kind": "vmf", "mean": mean.tolist(), "kappa": kappa},
                         time={"t_end": 0.1, "dt": 0.1, "save_every": 0.1})
    dataset = run_particles(case)
    density = lambda t: math.exp(kappa * math.cos(t - math.atan2(0.8, 0.6))) / (2 * math.pi * i0(kappa))  # noqa: E731
    squared = quad(lambda t: (2 - 2 * abs(math.cos(t))) * density(t), -math.pi, math.pi, points=[-math.pi / 2,
                                                                                               math.pi / 2])[0]
    value, error = float(dataset["w2_projection"][0]), float(dataset["w2_projection_stderr"][0])
    assert dataset.attrs["w2_quantisation_bound"] <= 1e-15  # no quantisation on S^1: the rearrangement's certificate
    assert 0 < error < 0.02
    assert abs(value - math.sqrt(squared)) <= 3 * error


# --- zero temperature ----------------------------------------------------------------------------------


def test_zero_temperature_mean_field_particles_keep_their_hemisphere():
    """beta = inf, mean-field mode, seed-003 matrices: dx_1/dt = x_1 (1 - <x, V B^T x>) / |B^T x| keeps the
    sign of x_1 for every particle, and the mass of {x_1 > 0} agrees with the Eulerian one within 3 SE."""
    initial = {"kind": "vmf", "mean": [0.3, 0.5, 0.8], "kappa": 2.0}
    case = particle_case(3, 4000, model=SEED_003, initial=initial, time={"t_end": 1.0, "dt": 0.05, "save_every": 0.25},
                         particles={"save": 4000, "integrator": "rk4"}, diagnostics={"lyapunov_p": [0.1, 0.25]})
    dataset = run_particles(case)
    assert dataset.attrs["attention"] == "local"
    signs = np.sign(dataset["particles"].values[..., 0])
    assert np.all(signs == signs[0])
    fraction = float((signs[-1] > 0).mean())
    eulerian = spherepde.run(make_case(3, 32, model=SEED_003, initial=initial,
                                       time={"t_end": 0.05, "dt": 0.05, "save_every": 0.05}), progress=False)
    basis = make_basis(3, 32, CPU64)
    exact = hemisphere_mass(basis, basis.analysis(torch.as_tensor(eulerian["density"].values[0])))
    assert abs(fraction - exact) <= 3 * math.sqrt(exact * (1 - exact) / 4000)
    # Lyapunov bound of seed 003, particle by particle: V_p(t) <= V_p(0) exp(-2 p gamma t / sigma_max(B)), 2 gamma = 4
    decay = dataset["lyapunov"].values / dataset["lyapunov"].values[0]
    bound = np.exp(-4 * np.outer(dataset["time"].values, [0.1, 0.25]))
    assert np.all(decay <= bound * (1 + 1e-9)) and decay[-1, 1] < 0.45


def test_hardmax_mode_is_named_and_differs_from_the_local_field():
    case = particle_case(3, 300, model=SEED_003, time={"t_end": 0.5, "dt": 0.05, "save_every": 0.5},
                         particles={"beta_inf_mode": "hardmax"})
    hard = run_particles(case)
    local = run_particles(case.with_overrides(["particles.beta_inf_mode='mean_field'"]))
    assert hard.attrs["attention"] == "hardmax" and local.attrs["attention"] == "local"
    assert np.array_equal(hard["particles"].values[0], local["particles"].values[0])
    assert np.abs(hard["particles"].values[-1] - local["particles"].values[-1]).max() > 1e-3


# --- against the Eulerian solver ------------------------------------------------------------------------


NOISY_S1 = dict(model={"kernel": "unnormalized", "beta": 0.0, "V": [[1.0, 0.0], [0.0, 0.65]], "eps": 0.25},
                initial={"kind": "vmf", "mean": [0.6, 0.8], "kappa": 1.0},
                time={"t_end": 1.0, "dt": 0.05, "save_every": 0.5}, diagnostics={"lyapunov_p": [0.1]})
SOFTMAX_S2 = dict(model={"kernel": "softmax", "beta": 2.0, "eps": 0.1,
                         "B": [[1.0, 0.2, 0.0], [0.0, 0.9, 0.1], [0.1, 0.0, 1.1]],
                         "V": [[1.0, 0.0, 0.0], [0.0, 0.5, 0.0], [0.0, 0.0, 1.4]]},
                  initial={"kind": "vmf_mixture", "means": [[1.0, 0.0, 0.0], [0.0, 0.6, 0.8]], "kappas": [2.0, 3.0]},
                  time={"t_end": 0.4, "dt": 0.05, "save_every": 0.2},
                  diagnostics={"lyapunov_p": [0.1], "w2": False})


@pytest.mark.parametrize("dim, lmax, n, replicas, sections", [(2, 24, 10000, 10, NOISY_S1),
                                                               (3, 16, 1500, 1, SOFTMAX_S2)])
def test_particles_agree_with_the_eulerian_run_within_3_standard_errors(dim, lmax, n, replicas, sections):
    """solver.method = "both": every diagnostic both runs compute agrees within 3 standard errors
    (lyapunov excepted: the Eulerian grid quadrature of its singular integrand is biased, see the report)."""
    case = make_case(dim, lmax, solver={"method": "both"}, **sections).with_overrides(
        [f"particles.n={n}", f"particles.replicas={replicas}"])
    eulerian, particles = split_both(spherepde.run(case, progress=False))
    report = compare(eulerian, particles, k=3.0)
    checked = [name for name in ("mass", "mean", "order_parameter", "alignment_E", "alignment_F", "w2_projection",
                                 "interaction_energy") if f"verdict_{name}" in report.attrs
               and not report.attrs[f"verdict_{name}"].startswith("n/a")]
    assert {"mean", "order_parameter", "alignment_E", "interaction_energy"} <= set(checked)
    assert {name: report.attrs[f"verdict_{name}"] for name in checked} == {name: "agrees" for name in checked}


def test_the_saved_tokens_come_from_every_system():
    """With R systems the saved particles are the first of each system, system by system, their indices the
    `particle` coordinate; they were the first `save` of all, one system alone, whose common drift every other
    system's cancels (a fuzzing round found compare's W2 reading one system).  A figure draws an evenly strided part
    of them, from every system (it drew the first 2000)."""
    from spherepde.analysis.sphere_view import drawn

    case = particle_case(3, 40, model={"eps": 0.1}, time={"t_end": 0.2, "dt": 0.05, "save_every": 0.1},
                         particles={"replicas": 4})
    every = run_particles(case.with_overrides(["particles.save=40"]))
    some = run_particles(case.with_overrides(["particles.save=9"]))
    tokens = [0, 1, 2, 10, 11, 20, 21, 30, 31]
    assert list(some["particle"].values) == tokens and list(every["particle"].values) == list(range(40))
    assert np.array_equal(some["particles"].values, every["particles"].values[:, tokens])
    assert np.arange(10000)[drawn(10000)].tolist() == list(range(0, 10000, 5))
    assert np.arange(4001)[drawn(4001)].size <= 2000 and np.arange(1500)[drawn(1500)].size == 1500


# --- bad input -----------------------------------------------------------------------------------------


def test_particle_specific_case_errors():
    with pytest.raises(CaseError, match=r"solver.field: 'spectral' is not available for particles"):
        run_particles(particle_case(3, 10, solver={"field": "spectral"}))
    with pytest.raises(CaseError, match=r"particles.integrator: expected one of"):
        particle_case(3, 10, particles={"integrator": "leapfrog"})
    with pytest.raises(CaseError, match=r"particles.dt: must be > 0"):
        particle_case(3, 10, particles={"dt": -0.1})
    # a coupling beta B beyond the dtype's range is refused, naming model.beta (it ended in exit 3: inf 0 = NaN)
    with pytest.raises(CaseError, match=r"^model.beta: beta = 1e\+39 times \|B\| = 2 overflows float32 \(largest"):
        run_particles(particle_case(3, 10, model={"beta": 1e39, "B": identity(3, 2.0)}, solver={"dtype": "float32"}))
    # |B|_2, not its largest entry: the scores beta <B^T x, y> of [[1, 1], [1, 1]] reach 2 beta (it ended in exit 3)
    with pytest.raises(CaseError, match=r"^model.beta: beta = 1e\+308 times \|B\| = 2 overflows float64"):
        run_particles(particle_case(2, 10, model={"beta": 1e308, "B": [[1.0, 1.0], [1.0, 1.0]]}))
    # the unnormalized kernel, which no shift bounds, beyond exp's range: refused (a fuzzing round: exit 3, "a particle
    # position became non-finite", even with V = 0); at beta |B|_2 = 700 it runs
    for dtype, beta, largest in (("float64", 800.0, "709.8"), ("float32", 100.0, "88.72")):
        with pytest.raises(CaseError, match=rf"^model.beta: the unnormalized kernel .* reaches exp\({beta:g}\) .* "
                                            rf"{dtype}'s largest number exp\({largest}\)"):
            run_particles(particle_case(2, 10, model={"kernel": "unnormalized", "beta": beta, "V": identity(2, 0.0)},
                                        solver={"dtype": dtype}))
        # the densities' kernel overflows alike: a "both" run is refused before its Eulerian half runs (a review
        # found it refused after, its Eulerian half's state thrown away), an Eulerian run too (it ended in exit 3)
        for method in ("both", "eulerian"):
            with pytest.raises(CaseError, match=r"^test: model.beta: the unnormalized kernel"):
                spherepde.run(particle_case(2, 10, model={"kernel": "unnormalized", "beta": beta},
                                            solver={"dtype": dtype, "method": method}), progress=False)
    calm = particle_case(2, 10, model={"kernel": "unnormalized", "beta": 700.0, "V": identity(2, 0.0),
                                       "W": [[0.0, 1.0], [-1.0, 0.0]]})
    assert np.isfinite(run_particles(calm)["particles"].values).all()
    # time.max_steps counts a particle run's own steps: particles.dt = 0.5 takes 2 (refused for time.dt's 20)
    stepped = ["solver.method='particles'", "particles.n=20", "time.max_steps=5", "time.t_end=1.0", "time.dt=0.05"]
    assert spherepde.run(spherepde.load_case("cases/kuramoto-s1.toml", stepped + ["particles.dt=0.5"]),
                         progress=False).attrs["steps"] == 2
    with pytest.raises(CaseError, match=r"time.max_steps: 5 steps cannot reach t_end = 1 with time.dt = 0.05"):
        spherepde.load_case("cases/kuramoto-s1.toml", stepped)
    # the refusal names the key that set the step (it said particles.dt of a time.dt)
    with pytest.raises(CaseError, match=r"^time.dt: a step of 0.5 is too long for the weak-order-2 noise step"):
        run_particles(particle_case(12, 10, model={"eps": 1.0}, time={"t_end": 1.0, "dt": 0.5, "save_every": 1.0}))
    with pytest.raises(CaseError, match=r"^particles.dt: a step of 0.25 is too long for the weak-order-2 noise"):
        run_particles(particle_case(12, 10, model={"eps": 1.0}, time={"t_end": 1.0, "dt": 0.01, "save_every": 1.0},
                                    particles={"dt": 0.25}))
    with pytest.raises(CaseError, match=r"checkpoints are available for the Eulerian solver and trainings only"):
        spherepde.run(particle_case(3, 10, solver={"method": "particles"}), checkpoint=Checkpoint("never-written.nc"))
    with pytest.raises(CaseError, match=r"sphere.dim: the Eulerian solver handles d = 2 or 3"):
        spherepde.run(particle_case(4, 10, solver={"method": "both"}))


def test_particle_output_contract():
    case = particle_case(3, 50, model={"eps": 0.0, "kernel": "unnormalized"},
                         time={"t_end": 0.2, "dt": 0.1, "save_every": 0.1}, particles={"save": 20, "dt": 0.05})
    dataset = run_particles(case)
    assert dataset["particles"].dims == ("time", "particle", "component")
    assert dataset["particles"].shape == (3, 20, 3)
    assert dataset.attrs["solver"] == "particles" and dataset.attrs["steps"] == 4 and dataset.attrs["dt"] == 0.05
    assert "density" not in dataset and "min_density" not in dataset and "spectral_tail" not in dataset
    assert np.isnan(dataset["entropy"].values).all()
    # eps = 0, beta = 1, V = B: the free energy is the interaction energy (spherepde/model/energy.py);
    # the softmax has none
    assert np.array_equal(dataset["free_energy"].values, dataset["interaction_energy"].values)
    assert np.isnan(run_particles(case.with_overrides(['model.kernel="softmax"']))["free_energy"].values).all()
    for name in ("mean", "order_parameter", "alignment_E", "lyapunov", "interaction_energy"):
        assert dataset[f"{name}_stderr"].dims == dataset[name].dims
    assert np.all(dataset["mass"].values == 1) and np.all(dataset["mass_stderr"].values == 0)
    assert spherepde.load_case_text(dataset.attrs["case"]).data == case.data


# --- slow: the Monte Carlo rate against the Eulerian solver -----------------------------------------


@pytest.mark.slow
def test_errors_and_w2_decay_like_n_to_the_minus_half_on_the_circle():
    """Noisy S^1 case, n = 1e3, 1e4, 1e5 tokens as 10 replicas, 24 seeds each (about 5 CPU minutes):
    the RMS error of the diagnostics and W2(Eulerian, particles) at t_end fall like n^(-1/2) +- 0.15, and
    the batch-means standard errors are honest (RMS of the z-scores below 1.5).
    Why 24 seeds: the log of an RMS over k seeds has standard error 1 / sqrt(2 k), so the fitted slope has
    1 / (sqrt(2 k) ln(10) sqrt(2)) = 0.044 at k = 24 and 0.15 is 3.4 of those; with 8 seeds it was 2.0, and
    seeds 0-7 failed by chance (order parameter RMS at n = 1e5: 1.4e-3 over seeds 0-7, 2.6e-3 over 8-23)."""
    sizes, seeds = [1000, 10000, 100000], range(24)
    sections = dict(NOISY_S1, time={"t_end": 2.0, "dt": 0.05, "save_every": 1.0})
    eulerian = spherepde.run(make_case(2, 32, **sections), progress=False)
    names = ["order_parameter", "alignment_E", "w2_projection"]
    rms, z, w2 = {name: [] for name in names}, [], []
    for n in sizes:
        reports = [compare(eulerian, run_particles(make_case(2, 32, **sections).with_overrides(
            [f"particles.n={n}", f"particles.seed={seed}", "particles.replicas=10", f"particles.save={n}"]),
            progress=False)) for seed in seeds]
        for name in names:
            rms[name].append(math.sqrt(np.mean([float(r[f"{name}_difference"][-1]) ** 2 for r in reports])))
            z.extend(np.concatenate([r[f"{name}_z"].values for r in reports]))
        w2.append(math.sqrt(np.mean([float(r["w2"][-1]) ** 2 for r in reports])))
    for values in list(rms.values()) + [w2]:
        slope = np.polyfit(np.log(sizes), np.log(values), 1)[0]
        assert abs(slope + 0.5) <= 0.15, (values, slope)
    assert math.sqrt(np.mean(np.square(z))) <= 1.5


def test_paired_w2_on_the_circle_takes_the_method_with_the_tighter_certified_bound():
    """Far-apart samples leave the rearrangement uncertified.  paired_w2 keeps it where its certified excess is
    below the quantisation bounds that exact OT of <= 250 atoms would carry (0.013 together), and
    exact OT of all n pairs then lies within that excess below it; where the excess is wider it quantises; with
    as many atoms as particles it solves exactly."""
    from spherepde.measures.optimal_transport import CERTIFIED_W2, circle_transport, quantise
    from spherepde.measures.sample_statistics import paired_w2
    rng, n = np.random.default_rng(5), 1000
    for kappa, offset, kept in [(2.5, 0.5, True), (4.0, 1.0, False)]:
        angles = rng.vonmises(0.0, 1.0, n), rng.vonmises(offset, kappa, n)
        x, y = (np.stack([np.cos(a), np.sin(a)], 1) for a in angles)
        quantised = sum(quantise(points, np.full(n, 1 / n), 250)[2] for points in (x, y))
        cost, lower, _ = circle_transport(x, y)
        excess = math.sqrt(cost) - math.sqrt(lower)
        exact = math.sqrt(ot.emd2(np.full(n, 1 / n), np.full(n, 1 / n), ot.dist(x, y), numItermax=10 ** 8))
        w2, _, bound = paired_w2(x, y, 250)
        assert CERTIFIED_W2 < excess and (excess < quantised) == kept
        if kept:
            assert (w2, bound) == (math.sqrt(cost), excess) and w2 - bound <= exact <= w2
        else:
            assert bound == pytest.approx(quantised, rel=1e-12) and abs(w2 - exact) <= bound
        w2, _, bound = paired_w2(x, y, n)
        assert bound == 0 and abs(w2 - exact) <= 1e-12


def test_circle_rearrangement_is_bracketed_by_its_dual_and_exact_where_certified():
    """circle_transport's cost is an upper bound on the exact OT cost (POT emd, all n x n pairs) and its dual a
    lower one; where they meet (paired_w2 then takes it) the value is the exact W2 and the linearised standard error
    that of emd's own potentials.  Samples far apart (mass moved by a radian or more) may be left uncertified."""
    from spherepde.measures.optimal_transport import CERTIFIED_W2, circle_transport
    from spherepde.measures.sample_statistics import paired_w2
    rng, certified = np.random.default_rng(3), 0
    for kappa, offset in [(0.2, 0.0), (1.0, 0.5), (4.0, 1.0), (16.0, 2.5), (1.0, 3.0), (4.0, 0.1)]:
        theta = rng.vonmises(0.0, kappa, 200)
        phi = rng.vonmises(offset, kappa, 200)
        x, y = (np.stack([np.cos(a), np.sin(a)], 1) for a in (theta, phi))
        cost, lower, _ = circle_transport(x, y)
        exact = ot.emd2(np.full(200, 1 / 200), np.full(200, 1 / 200), ot.dist(x, y))
        assert lower - 1e-14 <= exact <= cost + 1e-14
        if math.sqrt(cost) - math.sqrt(max(lower, 0)) <= CERTIFIED_W2:
            certified += 1
            assert abs(cost - exact) <= 1e-13
    assert certified == 3  # the three with offsets <= 0.5 (measured; the others move mass by ~1 rad and more)
    theta = rng.vonmises(0.0, 1.0, 2000)
    x = np.stack([np.cos(theta), np.sin(theta)], 1)
    y = x + 0.3 * rng.normal(size=x.shape)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    w2, error, bound = paired_w2(x, y, 1000)
    cost, u, v = exact_transport(x, np.full(2000, 1 / 2000), y, np.full(2000, 1 / 2000), potentials=True)
    h = c_transform(x, y, v) + c_transform(y, x, u)
    assert bound <= CERTIFIED_W2 and abs(w2 - math.sqrt(cost)) <= 1e-12
    assert error == pytest.approx(h.std(ddof=1) / math.sqrt(2000) / (2 * w2), rel=0.1)


def test_circle_rearrangement_of_distant_broad_laws_is_percents_above_exact_and_within_its_bound():
    """The figures of docs/guide/particles.md "W2 between the two measures": two von Mises densities on 2000 points,
    kappa 1 at 0 and kappa 3 at 2.5 rad.  The chordal cost is concave beyond pi/2, so the circular monotone
    rearrangement (circle_w2) is 3.0% above exact OT, 1.4162 against 1.3756, not ~1e-4 relative; its certified
    excess bound (0.062) still covers it, and w2_between, with 4e6 cost entries, takes the exact solver."""
    from spherepde.measures.optimal_transport import circle_w2, w2_between
    theta = 2 * np.pi * np.arange(2000) / 2000
    points = np.stack([np.cos(theta), np.sin(theta)], 1)
    a, b = np.exp(np.cos(theta)), np.exp(3 * np.cos(theta - 2.5))
    a, b = a / a.sum(), b / b.sum()
    value, _, bound = circle_w2(points, a, points, b)
    exact = math.sqrt(exact_transport(points, a, points, b)[0])
    assert value == pytest.approx(1.4162, abs=5e-4) and exact == pytest.approx(1.3756, abs=5e-4)
    assert value / exact - 1 == pytest.approx(0.030, abs=1e-3)
    assert bound == pytest.approx(0.062, abs=1e-3) and value - bound <= exact
    assert w2_between(points, a, points, b, 1000)[:2] == (pytest.approx(exact, abs=1e-12), 0.0)


def test_w2_standard_error_stays_bounded_where_w2_is_round_off():
    """At t = 0 a particle run's W2 to its projected start is round-off (1e-8); quantised (n above w2_atoms) the
    potentials' error std(h) / sqrt(n) is not (6e-5), and SE(W2^2) / (2 W2) read 4e3 (W2 is at most 2).  The error
    is capped at sqrt(SE(W2^2)), a bound on |W2_n - W2| since |a - b| <= sqrt(|a^2 - b^2|)."""
    from spherepde.measures.optimal_transport import paired_transport
    from spherepde.measures.sample_statistics import mean_and_error, paired_w2

    rng = np.random.default_rng(3)
    x = rng.normal(size=(3000, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = x + 1e-12 * rng.normal(size=x.shape)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    cost, h, _ = paired_transport(x, y, 1000)
    squared_error = mean_and_error(h)[1]
    assert cost < 1e-14 and squared_error / (2 * np.sqrt(cost)) > 1e3
    w2, error, _ = paired_w2(x, y, 1000)
    assert w2 < 1e-7 and error == pytest.approx(np.sqrt(squared_error), rel=1e-12)


def test_the_dt_attribute_is_the_largest_step_taken():
    """particles.dt = 0.07 with saves every 0.3 to t = 1: equal steps within each interval, 5 of 0.06 in the three
    whole ones and 2 of 0.05 in the last (0.1).  The attribute gave the last interval's 0.05; it is the largest."""
    case = particle_case(2, 20, model={"eps": 0.1}, time={"t_end": 1.0, "dt": 0.1, "save_every": 0.3},
                         particles={"dt": 0.07})
    dataset = run_particles(case)
    assert dataset.attrs["steps"] == 3 * 5 + 2
    assert dataset.attrs["dt"] == pytest.approx(0.06, rel=1e-12)


def test_cfl_steps_stay_within_the_noise_steps_bound():
    """The CFL rule reads the drift: where it vanishes (V = 0, W = 0) it asked for a step of the whole save
    interval, which the weak-order-2 noise step cannot take at eps = 1 on S^2 ((d - 2) eps dt / 3 < 1/2), and the
    run was refused midway naming particles.dt, which it does not set.  Halved below that bound, the steps give the
    heat flow: |m(t)| = |m(0)| exp(-2 eps t) within 4 standard errors."""
    from spherepde.io.case import case_from_dict

    case = case_from_dict({"sphere": {"dim": 3, "lmax": 16}, "model": {"kernel": "softmax", "beta": 0.0, "eps": 1.0,
                                                                      "V": [[0.0] * 3] * 3},
                           "initial": {"kind": "vmf", "mean": [0, 0, 1], "kappa": 4.0},
                           "time": {"t_end": 2.0, "save_every": 2.0, "cfl": 0.5},
                           "solver": {"method": "particles", "device": "cpu"},
                           "particles": {"n": 4000, "replicas": 10}})
    dataset = run_particles(case)
    assert dataset.attrs["dt"] <= 0.75
    start, end = dataset["mean"].values[0, 2], dataset["mean"].values[-1, 2]
    assert abs(end - start * math.exp(-4.0)) <= 4 * dataset["mean_stderr"].values[-1, 2]


def test_a_large_finite_beta_tends_to_the_hardmax():
    """beta = 1e300 (within float64, refused only where beta B overflows) moves the particles as beta = inf does:
    the shifted kernel sums put all the weight on the largest <Bx, y>."""
    case = particle_case(3, 12, model={"beta": 1e300}, time={"t_end": 0.5, "dt": 0.05, "save_every": 0.25})
    large = run_particles(case)["particles"].values
    limit = run_particles(case.with_overrides(["model.beta='inf'"]))["particles"].values
    assert np.abs(large - limit).max() <= 1e-12
