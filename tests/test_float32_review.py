"""float32 runs against float64 runs of the same case, within bounds of float32's unit round-off u = 2^-24 (6e-8):
a state rounded at every step drifts by at most about (steps) u of its scale from the float64 one where the
dynamics does not amplify it (these cases contract or move slowly), and the diagnostics follow; mass is conserved
by the flux form to a few u; particles are renormalised onto the sphere each step, to u."""

import numpy as np
import pytest

import spherepde

UNIT_ROUND_OFF = 2.0 ** -24


def both_precisions(path: str, overrides: list) -> dict:
    """{dtype: Dataset} of the case at `path` run in float64 and in float32 on the CPU."""
    return {dtype: spherepde.run(spherepde.load_case(path, overrides + [f"solver.dtype='{dtype}'",
                                                                         "solver.device='cpu'"]), progress=False)
            for dtype in ("float64", "float32")}


def test_a_float32_run_resolved_to_round_off_is_not_called_under_resolved():
    """The float64 run's tail is 1e-16: resolved.  Its float32 run's tail is float32's round-off (5e-8 measured, 0.4
    of an epsilon); with diagnostics.tail_tol = 1e-8 it was reported under-resolved from t = 0."""
    runs = both_precisions("cases/kuramoto-s1.toml", ["time.t_end=1.0", "time.save_every=0.5",
                                                      "diagnostics.tail_tol=1e-8"])
    assert float(runs["float64"].spectral_tail.max()) < 1e-14
    assert float(runs["float32"].spectral_tail.max()) <= 8 * np.finfo(np.float32).eps
    assert runs["float32"].attrs["resolved_until"] == "end", runs["float32"].attrs["notes"]


def test_a_float32_run_still_reports_a_tail_above_its_round_off():
    """The floor is float32's round-off only: a tail of 3e-5 (lmax 12 for the quick-start's law) is reported at
    t = 0, in both precisions alike."""
    runs = both_precisions("cases/quickstart.toml", ["sphere.lmax=12", "time.t_end=0.5", "time.save_every=0.5",
                                                     "diagnostics.tail_tol=1e-6"])
    for run in runs.values():
        assert float(run.spectral_tail[0]) > 1e-5
        assert run.attrs["resolved_until"] == 0.0


@pytest.mark.parametrize("kernel, beta", [("unnormalized", 0.0), ("softmax", 4.0)])
def test_float32_on_s1_tracks_float64_within_its_round_off(kernel, beta):
    """S^1's FFT path (unnormalized) and dense matrix path (softmax): 80 rk4 steps.  Density within steps x u x
    max rho (1.6e-6; measured 3e-7), the order parameter within that of its scale, mass within 16 u of 1."""
    runs = both_precisions("cases/kuramoto-s1.toml", ["time.t_end=4.0", f"model.kernel='{kernel}'",
                                                      f"model.beta={beta}"])
    single, double = runs["float32"], runs["float64"]
    steps = single.attrs["steps"]
    assert steps == double.attrs["steps"] == 80
    scale = float(double.density.max())
    assert float(abs(single.density - double.density).max()) <= steps * UNIT_ROUND_OFF * scale
    assert float(abs(single.order_parameter - double.order_parameter).max()) <= steps * UNIT_ROUND_OFF
    assert float(abs(single.mass - 1).max()) <= 16 * UNIT_ROUND_OFF


def test_float32_on_s2_tracks_float64_within_its_round_off():
    """S^2's spectral field (quick-start, lmax 16, 8 steps): density within steps x u x max rho (measured 6.6e-8 of
    0.195: 0.35 of the bound), entropy and interaction energy within steps x u of their scale, mass within 16 u."""
    runs = both_precisions("cases/quickstart.toml", ["sphere.lmax=16", "time.t_end=1.0"])
    single, double = runs["float32"], runs["float64"]
    steps = single.attrs["steps"]
    assert float(abs(single.density - double.density).max()) <= steps * UNIT_ROUND_OFF * float(double.density.max())
    for name in ("entropy", "interaction_energy", "order_parameter"):
        scale = float(abs(double[name]).max())
        assert float(abs(single[name] - double[name]).max()) <= steps * UNIT_ROUND_OFF * scale, name
    assert float(abs(single.mass - 1).max()) <= 16 * UNIT_ROUND_OFF


@pytest.mark.parametrize("mode", ["hardmax", "mean_field"])
def test_float32_tokens_stay_on_the_sphere_and_near_the_float64_tokens(mode):
    """beta = inf with a B that moves them, 100 Heun steps of 300 tokens: |x| - 1 within 4 u (a unit vector rounded
    componentwise); the local field's positions within steps x u of the float64 run's (measured 5e-7 of 6e-6).  The
    hardmax's are not: a near tie of <x_i, B x_j> (within float32's resolution) picks another token, and that token's
    position moved by 2.7e-4 from the float64 one's by t = 1."""
    runs = both_precisions("cases/quickstart.toml", [
        "solver.method='particles'", "particles.n=300", "model.eps=0.0", "time.t_end=1.0", "time.dt=0.01",
        "model.beta='inf'", f"particles.beta_inf_mode='{mode}'", "model.B=[[1, 0.3, 0], [0, 0.5, 0], [0.1, 0, 0.2]]"])
    single, double = runs["float32"].particles.values, runs["float64"].particles.values
    assert np.abs(np.linalg.norm(single, axis=-1) - 1).max() <= 4 * UNIT_ROUND_OFF
    if mode == "mean_field":
        assert np.abs(single - double).max() <= 100 * UNIT_ROUND_OFF
    assert np.abs(single[-1] - single[0]).max() > 1e-2  # the tokens moved


# the continuous gradient (8 s) runs with -m slow
@pytest.mark.parametrize("gradient", ["discrete", pytest.param("continuous", marks=pytest.mark.slow)])
def test_a_float32_gradient_is_the_float64_one_to_its_round_off(gradient):
    """One gradient step from W = 0 at learning rate 1 stores W = -dJ/dW: 200 forward and 200 adjoint steps, so
    within 400 u relative (2.4e-5; measured 6e-6) of the float64 gradient."""
    runs = both_precisions("cases/seed004-align-T40.toml", [
        "sphere.lmax=32", "time.t_end=4", "time.dt=0.02", "time.save_every=1", "control.layers=4",
        "control.optimizer='gd'", "control.iterations=1", "control.learning_rate=1.0", "control.tol=0.0",
        f"control.gradient='{gradient}'"])
    single, double = runs["float32"].W.values, runs["float64"].W.values
    assert np.abs(double).max() > 0.1
    assert np.abs(single - double).max() <= 400 * UNIT_ROUND_OFF * np.abs(double).max()
