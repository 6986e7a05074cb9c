"""The forward solver against closed forms, conservation laws and convergence orders."""

import math

import numpy as np
import pytest
import torch
from conftest import identity, make_case
from scipy.optimize import brentq
from scipy.special import i0e, i1e

import spherepde
from spherepde.base.device import placement
from spherepde.discretisation.bases import make_basis

CPU64 = placement("cpu", "float64")


def coefficients(dataset, case, index=-1):
    """Spectral coefficients of a saved density (analysis on the run's own grid)."""
    basis = make_basis(case.dim, case["sphere"]["lmax"], CPU64)
    return basis, basis.analysis(torch.as_tensor(dataset["density"].isel(time=index).values))


def heat_case(dim, lmax, scheme, dt, eps=0.05, t_end=1.0):
    return make_case(dim, lmax, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(dim, 0.0), "eps": eps},
                     initial={"kind": "vmf", "mean": [0.6, 0.0, 0.8] if dim == 3 else [0.6, 0.8], "kappa": 8.0},
                     time={"t_end": t_end, "dt": dt, "save_every": t_end, "scheme": scheme})


def heat_decay_error(case):
    """Relative error of each coefficient against c_0 exp(eps Lap t), over the modes above round-off."""
    dataset = spherepde.run(case, progress=False)
    basis, c0 = coefficients(dataset, case, 0)
    _, c1 = coefficients(dataset, case, -1)
    expected = c0 * torch.exp(case["model"]["eps"] * basis.laplacian * case["time"]["t_end"])
    # Modes whose decayed amplitude stands well above the round-off of a stored float64 grid.
    significant = expected.abs() > 1e-5 * c0.abs().max()
    return (c1 - expected).abs()[significant] / expected.abs()[significant], basis.degree[significant]


@pytest.mark.parametrize("dim, lmax", [(2, 16), (3, 12)])
def test_heat_equation_decay_is_exact_with_integrating_factor(dim, lmax):
    relative, degrees = heat_decay_error(heat_case(dim, lmax, "lawson-rk4", 0.1))
    assert int(degrees.max()) >= 6
    assert float(relative.max()) <= 1e-10


@pytest.mark.parametrize("scheme, order", [("imex-ars443", 3), ("rk4", 4)])
@pytest.mark.parametrize("dim", [2, 3])
def test_heat_equation_decay_temporal_order(dim, scheme, order):
    # rk4 steps the diffusion explicitly with the transport (lmax 8, eps 0.05: dt max|lam| <= 0.36, stable).
    errors = []
    for dt in (0.1, 0.05, 0.025):
        relative, _ = heat_decay_error(heat_case(dim, 8, scheme, dt))
        errors.append(float(relative.max()))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert orders.min() >= order - 0.2, (errors, orders)


@pytest.mark.parametrize("dim, lmax", [(2, 16), (3, 12)])
def test_the_cfl_rule_keeps_an_explicit_diffusion_stable(dim, lmax):
    """With rk4 (the diffusion in the explicit stages) the CFL rule's steps are cfl / (lmax max|v| + max|eps lam|):
    the heat flow at eps = 1 (no transport, max|v| = 0) took one step per save and ended in garbage (a warning
    only: min rho -0.3 on S^1 at t = 0.1; relative errors of the modes 9e4 and 6e5 here); its modes now decay as
    exp(eps Lap t), to RK4's accuracy at dt |eps lam| = 0.5 for the top mode (1.5e-6 on S^1, 2.5e-5 on S^2)."""
    case = heat_case(dim, lmax, "rk4", 0.1, eps=1.0, t_end=0.2).with_overrides(["time.cfl=0.5"])
    relative, degrees = heat_decay_error(case)
    assert int(degrees.max()) >= 3
    assert float(relative.max()) <= 1e-4


@pytest.mark.parametrize("dim, lmax", [(2, 32), (3, 24)])
@pytest.mark.parametrize("scheme, bound", [("imex-ark436", 2e-3), ("imex-ars443", 5e-2)])
def test_the_cfl_rule_keeps_an_implicit_diffusion_accurate(dim, lmax, scheme, bound):
    """The IMEX schemes take the diffusion implicitly: stable at any step, accurate while eps l (l + d - 2) dt is
    small.  Without transport (max|v| = 0) the CFL rule took the whole save interval (t = 1, eps = 0.3) in one
    step: the modes to degree 5 (decayed to 1e-4 of their start) were off by 190-1000 times their exact decay
    exp(eps Lap t).  Steps of cfl / (lmax eps) (20 on S^1, 15 on S^2) bring them to 1.3e-4 and 1.0e-3 with
    imex-ark436 (4th order), 7e-3 and 3.3e-2 with imex-ars443 (3rd)."""
    case = heat_case(dim, lmax, scheme, 0.1, eps=0.3).with_overrides(["time.cfl=0.5"])
    relative, degrees = heat_decay_error(case)
    assert int(degrees.max()) >= 5
    assert float(relative.max()) <= bound


def test_mass_after_1000_nonlinear_steps():
    for dim, lmax, eps in [(2, 32, 0.05), (3, 8, 0.2)]:
        mean = [0.0, 0.6, 0.8] if dim == 3 else [0.6, 0.8]
        case = make_case(dim, lmax, model={"beta": 4.0, "V": identity(dim), "eps": eps},
                         initial={"kind": "vmf", "mean": mean, "kappa": 1.0},
                         time={"t_end": 5.0, "dt": 0.005, "save_every": 5.0})
        dataset = spherepde.run(case, progress=False)
        assert dataset.attrs["steps"] == 1000
        assert abs(float(dataset["mass"][-1]) - 1) <= 1e-12


def test_departures_names_each_member_that_is_no_longer_a_density():
    """The rules of a run's densities, checked for a batch at once: the uniform density on S^1's grid (mass 1) passes;
    its mass moved by 1e-7 (above sqrt(eps) = 1.5e-8), a spike of 11 x all the mass in one cell, or a NaN fail,
    each with its own reason; a drift of 1e-9 and a spike of 9 x pass."""
    from solvers.eulerian import BLOW_UP_FACTOR, departures

    basis = make_basis(2, 16, placement("cpu", "float64"))
    weights = basis.weights.reshape(-1).numpy()
    uniform = np.full(weights.shape, 1 / weights.sum())
    densities = np.stack([uniform] * 6)
    densities[1] *= 1 + 1e-7
    densities[2] *= 1 + 1e-9
    spike = 11 / weights.min()
    densities[3, 0], densities[4, 0] = spike, spike * 9 / 11
    densities[3:5, 1:] = ((1 - densities[3:5, 0] * weights[0]) / weights[1:].sum())[:, None]  # the mass stays 1
    densities[5, 3] = np.nan
    reasons = departures(densities, weights, np.ones(6), torch.float64)
    assert [reason is None for reason in reasons] == [True, False, True, False, True, False]
    assert reasons[1].startswith("the mass drifted from 1 by 1e-07")
    bound = BLOW_UP_FACTOR / weights.min()
    assert reasons[3] == f"|rho| reached {spike:.3g}, above {bound:.3g} (10 x all the mass in one cell)"
    assert reasons[5].startswith("the mass drifted from 1 by nan")


def kuramoto_root(K, eps, dim):
    """Positive root r of r = I1(Kr/eps)/I0(Kr/eps) (S^1) or r = coth(Kr/eps) - eps/(Kr) (S^2)."""
    if dim == 2:
        def gap(r):
            return i1e(K * r / eps) / i0e(K * r / eps) - r
    else:
        def gap(r):
            a = K * r / eps
            return 1 / math.tanh(a) - 1 / a - r
    return brentq(gap, 1e-6, 1 - 1e-12, xtol=1e-15)


@pytest.mark.parametrize("dim, lmax, K, eps", [(2, 32, 1.0, 0.25), (2, 32, 1.0, 0.4), (3, 16, 1.0, 0.2),
                                               (3, 16, 1.0, 0.3)])
def test_noisy_kuramoto_order_parameter(dim, lmax, K, eps):
    mean = [0.0, 0.0, 1.0] if dim == 3 else [1.0, 0.0]
    case = make_case(dim, lmax, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(dim, K), "eps": eps},
                     initial={"kind": "vmf", "mean": mean, "kappa": 1.0},
                     time={"t_end": 150.0, "dt": 0.1, "save_every": 50.0})
    dataset = spherepde.run(case, progress=False)
    assert abs(float(dataset["order_parameter"][-1]) - kuramoto_root(K, eps, dim)) <= 1e-8


@pytest.mark.parametrize("dim, K_over_eps", [(2, 1.8), (3, 2.7)])
def test_noisy_kuramoto_below_threshold_decays_at_linear_rate(dim, K_over_eps):
    """Below K = 2 eps (S^1) / 3 eps (S^2) the mean decays like exp(-gamma t), linearising at the
    uniform law: gamma = eps - K/2 (S^1), 2 eps - 2K/3 (S^2)."""
    eps = 0.5
    K = K_over_eps * eps
    mean = [0.0, 0.0, 1.0] if dim == 3 else [1.0, 0.0]
    case = make_case(dim, 16, model={"kernel": "unnormalized", "beta": 0.0, "V": identity(dim, K), "eps": eps},
                     initial={"kind": "vmf", "mean": mean, "kappa": 1.0},
                     time={"t_end": 120.0, "dt": 0.1, "save_every": 20.0})
    r = spherepde.run(case, progress=False)["order_parameter"].values
    gamma = eps - K / 2 if dim == 2 else 2 * eps - 2 * K / 3
    measured = -math.log(r[-1] / r[-2]) / 20.0
    assert abs(measured - gamma) <= 1e-3 * gamma, (measured, gamma)


def hemisphere_mass(basis, c, axis=0, nodes=48):
    """int_{x_axis > 0} rho dsigma, exact for band-limited rho: Gauss in x_axis on (0, 1), uniform in angle."""
    t, w = np.polynomial.legendre.leggauss(nodes)
    t, w = (t + 1) / 2, w / 2
    psi = 2 * np.pi * np.arange(2 * nodes) / (2 * nodes)
    T, P = np.meshgrid(t, psi, indexing="ij")
    s = np.sqrt(1 - T ** 2)
    others = [i for i in range(3) if i != axis]
    points = np.zeros(T.shape + (3,))
    points[..., axis], points[..., others[0]], points[..., others[1]] = T, s * np.cos(P), s * np.sin(P)
    values = basis.evaluate(c, torch.as_tensor(points.reshape(-1, 3))).reshape(T.shape).numpy()
    return float((w[:, None] * values).sum() * 2 * np.pi / len(psi))


def test_zero_temperature_hemisphere_masses_and_resolution_report():
    case = spherepde.load_case("cases/baseline-inf.toml", ["time.t_end=0.8", "time.save_every=0.1"])
    dataset = spherepde.run(case, progress=False)
    basis = make_basis(3, 64, CPU64)
    masses = [hemisphere_mass(basis, basis.analysis(torch.as_tensor(d))) for d in dataset["density"].values]
    resolved = dataset["spectral_tail"].values <= case["diagnostics"]["tail_tol"]
    assert resolved[:3].all()  # the run starts resolved ...
    assert not resolved[-1]  # ... and says when it no longer is
    drift = np.abs(np.array(masses) - masses[0])[resolved]
    assert drift.max() <= 1e-6
    assert 0.55 < masses[0] < 0.75  # the initial law charges both hemispheres unequally
    last_resolved = dataset["time"].values[np.flatnonzero(~resolved)[0] - 1]
    assert float(dataset.attrs["resolved_until"]) == last_resolved
    assert f"results after t = {last_resolved:.4g} are under-resolved" in dataset.attrs["notes"]


def test_a_run_under_resolved_from_its_start_says_so():
    """A tail above the tolerance at t = 0 already: the note says the results from the start are under-resolved
    (it said "after t = 0", as if the first save were resolved)."""
    from test_cli import SMALL_S1

    with pytest.warns(RuntimeWarning, match="from the start"):
        dataset = spherepde.run(spherepde.load_case_text(SMALL_S1, ["sphere.lmax=6", "initial.kappa=8.0"]),
                                progress=False)
    assert dataset["spectral_tail"].values[0] > 1e-6  # diagnostics.tail_tol's default
    assert "results from the start are under-resolved" in dataset.attrs["notes"]


@pytest.mark.parametrize("scheme, order", [("imex-ark436", 4), ("imex-ars443", 3)])
def test_temporal_order_of_imex_on_nonlinear_case(scheme, order):
    errors, dts = [], [0.1, 0.05, 0.025]
    reference = None
    for dt in [0.00625] + dts:
        case = spherepde.load_case("cases/convergence-s2.toml", ["sphere.lmax=12", f"time.dt={dt}",
                                                                 "time.save_every=1.0", f"time.scheme={scheme}"])
        density = spherepde.run(case, progress=False)["density"].values[-1]
        if reference is None:
            reference = density
        else:
            errors.append(np.abs(density - reference).max())
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert orders.min() >= order - 0.15, (errors, orders)


def test_spectral_convergence_in_lmax(monkeypatch):
    """lmax 16 -> 32 gains at least 4 digits against a degree-40 reference (same dt: spatial error only).  The
    case's general B takes the spectral field's kept matrix at every lmax (exact: the default limit would leave
    lmax 40 to the Chebyshev interpolation, whose 1e-13 would then be the reference's error)."""
    from spherepde.kernels import spectral

    monkeypatch.setattr(spectral, "SPECTRAL_MATRIX_BYTES", 2 ** 30)
    common = ["time.t_end=0.2", "time.dt=0.05", "time.save_every=0.2"]
    runs = {}
    for lmax in (16, 32, 40):
        case = spherepde.load_case("cases/convergence-s2.toml", [f"sphere.lmax={lmax}"] + common)
        basis, c = coefficients(spherepde.run(case, progress=False), case)
        runs[lmax] = (basis, c)
    reference_basis, reference = runs[40]
    error = {lmax: math.sqrt(float(reference_basis.norm_squared(reference_basis.resize(c, 40) - reference)))
             for lmax, (basis, c) in runs.items() if lmax != 40}
    assert error[32] <= 1e-4 * error[16], error


def test_shtns_and_torch_backends_give_the_same_run():
    pytest.importorskip("shtns", reason="the shtns extra is not installed (pip install 'spherepde[shtns]')")
    overrides = ["sphere.lmax=24", "time.t_end=0.3", "time.save_every=0.3", "solver.device='cpu'"]
    runs = [spherepde.run(spherepde.load_case("cases/convergence-s2.toml", overrides + [f"solver.backend={name}"]),
                          progress=False) for name in ("torch", "shtns")]
    torch_run, shtns_run = (run["density"].values[-1] for run in runs)
    assert runs[1].attrs["backend"] == "shtns"
    assert np.abs(torch_run - shtns_run).max() <= 1e-12 * np.abs(shtns_run).max()


def test_float32_run_tracks_float64():
    overrides = ["sphere.lmax=16", "time.t_end=0.5", "time.save_every=0.5", "solver.device='cpu'"]
    runs = {dtype: spherepde.run(spherepde.load_case("cases/convergence-s2.toml",
                                                     overrides + [f"solver.dtype={dtype}"]),
                                 progress=False) for dtype in ("float32", "float64")}
    assert runs["float32"].attrs["dtype"] == "float32"
    for name in ("order_parameter", "entropy", "interaction_energy", "min_density"):
        single, double = (float(runs[d][name][-1]) for d in ("float32", "float64"))
        assert abs(single - double) <= 1e-5 * max(1.0, abs(double)), name
    assert abs(float(runs["float32"]["mass"][-1]) - 1) <= 1e-6


@pytest.mark.slow
def test_spectral_convergence_over_the_whole_window():
    """As above to t = 1 with a degree-48 reference (about 2 minutes on 2 cores)."""
    common = ["time.t_end=1.0", "time.dt=0.05", "time.save_every=1.0"]
    runs = {}
    for lmax in (16, 32, 48):
        case = spherepde.load_case("cases/convergence-s2.toml", [f"sphere.lmax={lmax}"] + common)
        runs[lmax] = coefficients(spherepde.run(case, progress=False), case)
    reference_basis, reference = runs[48]
    error = {lmax: math.sqrt(float(reference_basis.norm_squared(reference_basis.resize(c, 48) - reference)))
             for lmax, (_, c) in runs.items() if lmax != 48}
    assert error[32] <= 1e-4 * error[16], error


def test_the_run_matches_the_cpu_run(accelerator):
    overrides = ["sphere.lmax=24", "time.t_end=0.3", "time.save_every=0.3"]

    def density(where):
        case = spherepde.load_case("cases/convergence-s2.toml", overrides + [f"solver.device={where}"])
        return spherepde.run(case, progress=False)["density"].values[-1]

    reference = density("cpu")
    assert np.abs(reference - density(accelerator)).max() <= 1e-12 * np.abs(reference).max()


@pytest.mark.parametrize("method", ["eulerian", "particles"])
def test_max_steps_counts_the_steps_that_saves_and_layers_cut(method):
    """time.dt = 0.1 over t_end = 1 with saves every 0.15 takes 13 whole steps (two in each save interval, one in the
    last), not t_end / dt = 10: max_steps = 12 passed the case's check, and the run stopped at the limit midway as a
    numerical failure (exit 3); it is refused before any step now, and 13 runs.  Layer boundaries (a model.W per
    layer) cut steps as saves do: 3 layers over saves every 0.25 at dt = 0.01, 102 steps."""
    text = ("[sphere]\ndim = 2\nlmax = 16\n[model]\nkernel = 'softmax'\nbeta = 1.0\neps = 0.1\n"
            "[initial]\nkind = 'vmf'\nmean = [1.0, 0.0]\nkappa = 1.0\n"
            "[time]\nt_end = 1.0\ndt = 0.1\nsave_every = 0.15\n"
            f"[solver]\nmethod = '{method}'\n[particles]\nn = 50\n")
    case = spherepde.load_case_text(text)
    with pytest.raises(spherepde.CaseError, match=r"time.max_steps: 12 steps .* take 13$"):
        spherepde.run(case.with_overrides(["time.max_steps=12"]), progress=False)
    assert spherepde.run(case.with_overrides(["time.max_steps=13"]), progress=False).attrs["status"] == "completed"
    layered = case.with_overrides(["time.dt=0.01", "time.save_every=0.25", "model.W=[[[0.0, 1.0], [-1.0, 0.0]], "
                                   "[[0.5, 0.0], [0.0, -0.5]], [[0.0, 0.3], [0.1, 0.0]]]", "time.max_steps=101"])
    with pytest.raises(spherepde.CaseError, match=r"take 102$"):
        spherepde.run(layered, progress=False)
