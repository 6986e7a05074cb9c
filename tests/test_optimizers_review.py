"""The optimizers of a training and their stopping rules (solvers/optimizers.py, solvers/training.py step 1),
checked against the documented algorithms written out here in numpy and scipy's L-BFGS-B called directly."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from test_ensembles import training_members

from solvers.controlled_forward import Gradient
from solvers.optimizers import optimise
from spherepde import run
from spherepde.api.ensemble import batches, run_batch
from spherepde.base.errors import NumericalFailure

LAYERS, D = 3, 2
CURVATURE = np.random.default_rng(0).uniform(0.5, 3.0, (LAYERS, D, D))
MINIMISER = np.random.default_rng(1).normal(size=(LAYERS, D, D))


def cost(W):
    """J(W) = 1/2 sum a (W - C)^2 + (W - C)^4 / 4 + 0.1: minimiser C, minimum 0.1."""
    return float(0.5 * np.sum(CURVATURE * (W - MINIMISER) ** 2) + 0.25 * np.sum((W - MINIMISER) ** 4) + 0.1)


def slope(W):
    return CURVATURE * (W - MINIMISER) + (W - MINIMISER) ** 3


def gradient_of_cost(radius=np.inf):
    """gradient_of for `optimise`: J and dJ/dW of `cost`, not finite (a failed run) where max |W| > radius."""
    def gradient_of(W):
        w = W.double().numpy()
        if np.abs(w).max() > radius:
            return Gradient(float("nan"), float("nan"), torch.full_like(W, float("nan")), [0.0], [0.0])
        return Gradient(cost(w), cost(w), torch.tensor(slope(w)), [0.0], [0.0])
    return gradient_of


def control(**keys):
    return {"optimizer": "gd", "learning_rate": 0.1, "iterations": 20, "tol": 0.0, "loss": "align"} | keys


def trained(radius=np.inf, **keys):
    return optimise(control(**keys), torch.zeros(D, D, dtype=torch.float64), LAYERS, gradient_of_cost(radius),
                    progress=False)


def test_gradient_descent_and_adam_take_the_documented_steps():
    """W <- W - lr g, and Adam's bias-corrected moments with beta = (0.9, 0.999), eps = 1e-8, written out."""
    W, costs = np.zeros((LAYERS, D, D)), []
    for _ in range(20):
        costs.append(cost(W))
        W = W - 0.1 * slope(W)
    result = trained()
    assert np.abs(result.controls.numpy() - W).max() <= 1e-12
    assert result.costs == pytest.approx(costs + [cost(W)], rel=1e-12)
    W, m, v = np.zeros((LAYERS, D, D)), 0.0, 0.0
    for k in range(1, 21):
        g = slope(W)
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
        W = W - 0.1 * (m / (1 - 0.9 ** k)) / (np.sqrt(v / (1 - 0.999 ** k)) + 1e-8)
    result = trained(optimizer="adam")
    assert np.abs(result.controls.numpy() - W).max() <= 1e-12
    assert len(result.costs) == 21 and result.stop == "control.iterations reached"


@pytest.mark.parametrize("tol, iterations", [(0.0, 7), (1e-6, 100), (1e-10, 100), (10.0, 5)])
def test_lbfgs_takes_scipys_iterates_and_stops_where_scipy_does(tol, iterations):
    """The accepted iterates and the stop of scipy's L-BFGS-B on the same J, with ftol = gtol = tol and maxfun
    4 iterations + 1."""
    iterates = [np.zeros(LAYERS * D * D)]
    direct = minimize(lambda x: (cost(x.reshape(LAYERS, D, D)), slope(x.reshape(LAYERS, D, D)).ravel()), iterates[0],
                      jac=True, method="L-BFGS-B", callback=lambda x: iterates.append(x.copy()),
                      options={"maxiter": iterations, "maxfun": 4 * iterations + 1, "gtol": tol, "ftol": tol})
    result = trained(optimizer="lbfgs", tol=tol, iterations=iterations)
    assert np.abs(result.controls.numpy().ravel() - direct.x).max() <= 1e-12
    assert result.costs == pytest.approx([cost(x.reshape(LAYERS, D, D)) for x in iterates], rel=1e-12)
    assert result.stop.startswith(f"L-BFGS-B: {direct.message} ({direct.nfev} evaluations")


@pytest.mark.parametrize("tol", [1e-3, 1e-5, 1e-9])
def test_gradient_descent_stops_at_the_first_iterate_a_tolerance_admits(tol):
    """|dJ/dW|_F <= tol or |J_k - J_(k-1)| <= tol |J_k|, tested at every evaluation, the W kept that evaluated."""
    W, costs, why = np.zeros((LAYERS, D, D)), [], "control.iterations reached"
    for k in range(201):
        costs.append(cost(W))
        if np.linalg.norm(slope(W)) <= tol:
            why = "converged: |dJ/dW|_F <= tol"
            break
        if k and abs(costs[-1] - costs[-2]) <= tol * abs(costs[-1]):
            why = "converged: |J_k - J_(k-1)| <= tol |J_k|"
            break
        if k < 200:
            W = W - 0.1 * slope(W)
    result = trained(tol=tol, iterations=200)
    assert (len(result.costs), result.stop) == (len(costs), why)
    assert np.abs(result.controls.numpy() - W).max() <= 1e-12


def test_a_failed_step_keeps_the_last_good_controls():
    """gd at lr 0.9 overshoots: the first iterate beyond max |W| = 5 fails, the one before is kept."""
    W, kept = np.zeros((LAYERS, D, D)), []
    while np.abs(W).max() <= 5:
        kept.append(W)
        W = W - 0.9 * slope(W)
    result = trained(radius=5.0, learning_rate=0.9, iterations=50)
    failed = len(kept)
    assert result.stop == f"numerical failure at iteration {failed}: the controls of iteration {failed - 1} are kept"
    assert np.abs(result.controls.numpy() - kept[-1]).max() <= 1e-12 and len(result.costs) == failed
    assert result.final.cost == pytest.approx(cost(kept[-1]), rel=1e-12) and "learning_rate" in result.failure


def test_a_failed_line_search_says_why():
    """Every trial beyond max |W| = 0.3 fails (the minimiser lies beyond it): L-BFGS backs off from them until its
    line search finds no step; scipy 1.15 on words that "ABNORMAL: " alone, which optimizer_stop now completes.  The
    kept controls are those of scipy's run of the same function (failed trials J = 1e3 (1 + |J_0|), zero slope)."""
    penalty = 1e3 * (1 + cost(np.zeros((LAYERS, D, D))))

    def penalised(x):
        W = x.reshape(LAYERS, D, D)
        return (cost(W), slope(W).ravel()) if np.abs(W).max() <= 0.3 else (penalty, np.zeros(x.size))
    iterates = [np.zeros(LAYERS * D * D)]
    direct = minimize(penalised, iterates[0], jac=True, method="L-BFGS-B", callback=lambda x: iterates.append(x.copy()),
                      options={"maxiter": 50, "maxfun": 201, "gtol": 1e-9, "ftol": 1e-9})
    result = trained(radius=0.3, optimizer="lbfgs", iterations=50, tol=1e-9)
    assert np.abs(result.controls.numpy().ravel() - direct.x).max() <= 1e-12
    # scipy's own `fun` is a rejected trial's there (2.2934), not J at its x (2.2974): the history's is
    assert result.costs == pytest.approx([cost(x.reshape(LAYERS, D, D)) for x in iterates], rel=1e-12)
    assert np.abs(result.controls.numpy()).max() <= 0.3
    # scipy before 1.15 says it in its own words, ABNORMAL_TERMINATION_IN_LNSRCH
    says_why = "line search found no step" in result.stop or "IN_LNSRCH" in result.stop
    assert direct.status == 2 and says_why, result.stop


def test_lbfgs_counts_the_evaluations_it_made():
    """optimizer_stop's "(n evaluations, k of them failed runs)": n is the evaluations of J and dJ/dW made, each at its
    own point.  In the failed line search above scipy asks 65 times for 64 points (the current point again after a
    rejected trial), the cache serving the 65th; n was scipy's nfev, 65."""
    penalty = 1e3 * (1 + cost(np.zeros((LAYERS, D, D))))
    asked = []

    def penalised(x):
        asked.append(x.tobytes())
        W = x.reshape(LAYERS, D, D)
        return (cost(W), slope(W).ravel()) if np.abs(W).max() <= 0.3 else (penalty, np.zeros(x.size))
    direct = minimize(penalised, np.zeros(LAYERS * D * D), jac=True, method="L-BFGS-B",
                      options={"maxiter": 50, "maxfun": 201, "gtol": 1e-9, "ftol": 1e-9})
    made, failed = [], []
    evaluate = gradient_of_cost(radius=0.3)

    def gradient_of(W):
        made.append(W.numpy().tobytes())
        if np.abs(W.numpy()).max() > 0.3:
            failed.append(W)
        return evaluate(W)
    result = optimise(control(optimizer="lbfgs", iterations=50, tol=1e-9), torch.zeros(D, D, dtype=torch.float64),
                      LAYERS, gradient_of, progress=False)
    assert direct.nfev == len(asked) > len(set(asked)) == len(made) == len(set(made))  # a point asked for twice
    assert result.stop.endswith(f" ({len(made)} evaluations, {len(failed)} of them failed runs)"), result.stop


@pytest.mark.slow
def test_lockstep_members_that_stop_fail_and_run_on_are_their_serial_trainings():
    """Three S^1 trainings in one batch: gd stopping by its relative-cost tolerance at iteration 1, Adam at lr 8
    failing at iteration 1 (its start kept), Adam running its 12 iterations; each member's W (to 1e-10), J history
    and optimizer_stop are its serial training's."""
    base = training_members(["gd"])[0]
    cases = [base.with_overrides(["control.learning_rate=0.5", "control.tol=3e-2", "control.iterations=12"]),
             base.with_overrides(["control.optimizer='adam'", "control.learning_rate=8.0", "control.iterations=12",
                                  "initial.mean=[1.0, 0.9]"]),
             base.with_overrides(["control.optimizer='adam'", "control.learning_rate=0.2", "control.iterations=12",
                                  "control.target=[0.5, 1.0]"])]
    assert batches(cases) == [[0, 1, 2]]
    with pytest.warns(RuntimeWarning):
        batched = run_batch(cases, progress=False)
    stops = []
    for case, outcome in zip(cases, batched):
        try:
            serial = run(case, progress=False)
        except NumericalFailure as failure:
            serial = failure
        assert isinstance(outcome, NumericalFailure) == isinstance(serial, NumericalFailure)
        one, other = (getattr(x, "dataset", x) for x in (outcome, serial))
        assert np.abs(one["W"].values - other["W"].values).max() <= 1e-10
        assert one["loss"].values == pytest.approx(other["loss"].values, rel=1e-12, abs=0)
        assert one.attrs["optimizer_stop"] == other.attrs["optimizer_stop"]
        stops.append((one.sizes["iteration"], one.attrs["optimizer_stop"]))
    assert stops == [(2, "converged: |J_k - J_(k-1)| <= tol |J_k|"),
                     (1, "numerical failure at iteration 1: the controls of iteration 0 are kept"),
                     (13, "control.iterations reached")]
