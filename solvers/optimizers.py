"""The optimizers of a training over piecewise-constant controls W (layers, d, d) (or, beyond the seeds' model, the
trained entries of theta (layers, k)): gradient descent, Adam and L-BFGS (scipy), each a loop that asks
gradient_of(controls) for J and dJ/dW and returns a `TrainingResult` (the stopping rules: solvers/training.py,
step 1 of its docstring).
"""

import math

import numpy as np
import torch

from spherepde.base.errors import NumericalFailure
from spherepde.base.progress import Progress
from spherepde.io.case_schema import default_of


class TrainingResult:
    """The trained controls, the per-iteration history, the first (at the initial control) and final gradients,
    why the optimizer stopped (`stop`, one line: the output's optimizer_stop attribute) and, when a numerical
    failure stopped it, that failure's message (`failure`; the controls are then the last good ones)."""

    def __init__(self, controls, costs, losses, gradient_norms, first, final, stop, failure=None):
        self.controls, self.costs, self.losses, self.gradient_norms, self.first, self.final = (
            controls, costs, losses, gradient_norms, first, final)
        self.stop = stop
        self.failure = failure  # the numerical failure that ended the training early, or None
        self.notes = []  # lines for the output's `notes`


class GradientDescent:
    """W <- W - lr dJ/dW."""

    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate

    def step(self, parameter: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
        return parameter - self.learning_rate * gradient


class Adam:
    """Adam (Kingma & Ba 2015) with the usual moments beta_1 = 0.9, beta_2 = 0.999 and eps = 1e-8:
    m <- b1 m + (1 - b1) g,  v <- b2 v + (1 - b2) g^2,  W <- W - lr m_hat / (sqrt(v_hat) + eps),
    m_hat = m / (1 - b1^k), v_hat = v / (1 - b2^k) at step k.  (torch.optim's update, written out:
    importing torch.optim pulls in torch._dynamo, seconds of start-up for a few lines of arithmetic.)"""

    def __init__(self, learning_rate: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.learning_rate, self.betas, self.eps = learning_rate, betas, eps
        self.count, self.m, self.v = 0, 0.0, 0.0

    def step(self, parameter: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
        b1, b2 = self.betas
        self.count += 1
        self.m = b1 * self.m + (1 - b1) * gradient
        self.v = b2 * self.v + (1 - b2) * gradient * gradient
        m_hat = self.m / (1 - b1 ** self.count)
        v_hat = self.v / (1 - b2 ** self.count)
        return parameter - self.learning_rate * m_hat / (torch.sqrt(v_hat) + self.eps)


OPTIMIZERS = {"gd": GradientDescent, "adam": Adam}


def _checked(gradient, iteration: int, loss: str | None):
    """The gradient, or NumericalFailure when J or dJ/dW is not finite; the message gives J and l(mu_T)
    (`loss`: control.loss, for its advice; the learning rate's is `optimise`'s, where a step of it failed)."""
    finite_dW = bool(torch.isfinite(gradient.dW).all())
    if math.isfinite(gradient.cost) and finite_dW:
        return gradient
    advice = "reduce time.dt"
    if math.isfinite(gradient.loss) and not math.isfinite(gradient.cost):  # J = l(mu_T) + the regulariser
        advice = "the regulariser lambda_reg / 2 int |W_t|^2 dt overflows: smaller controls" + (
            "" if iteration else " (model.W)")
    elif loss == "bow" and (not math.isfinite(gradient.loss) or math.isfinite(gradient.cost)):  # the loss's doing
        advice += ("; a bow candidate with p_k(mu_T) <= 0, or scores softmax(tau <x, c_k>) saturated to 0 and 1, "
                   "make l(mu_T) or its gradient non-finite: lower control.tau")
    raise NumericalFailure(f"numerical failure at training iteration {iteration}: J = {gradient.cost:g}, l(mu_T) = "
                           f"{gradient.loss:g}{'' if finite_dW else ', its gradient not finite'} ({advice})")


def optimise(control: dict, W: torch.Tensor, layers: int, gradient_of, progress: bool | None = None,
             per_layer: bool = False) -> TrainingResult:
    """The optimizer loop of the module docstring, step 1, from W_l = W on every layer (with `per_layer`, W holds
    the controls of every layer, (layers, ...): a model's trained entries beyond the seeds', solvers/training.py);
    gradient_of(controls) returns the controlled_forward.Gradient (J, l(mu_T), dJ/dW, ...) at controls."""
    parameter = W.detach().clone() if per_layer else W.detach().clone().expand(layers, -1, -1).contiguous()
    if control["optimizer"] == "lbfgs":
        return quasi_newton(control, parameter, gradient_of, progress)
    optimizer = OPTIMIZERS[control["optimizer"]](control["learning_rate"])
    costs, losses, norms, first, failure, good = [], [], [], None, None, None
    bar = Progress(float(max(control["iterations"], 1)), enabled=progress, quantity="iteration")
    with bar.running():  # a log line every 30 s meanwhile: one evaluation of J and dJ/dW can take longer
        for iteration in range(control["iterations"] + 1):
            try:
                gradient = _checked(gradient_of(parameter.detach()), iteration, control.get("loss"))
            except NumericalFailure as error:
                if good is None:
                    raise
                parameter, gradient = good
                # the controls that failed are a step of the learning rate's from the kept ones: the one optimizer whose
                # failures the learning rate can mend (L-BFGS's line search backs off from them; the start is model.W)
                failure = f"{error}; a smaller control.learning_rate takes shorter steps"
                stop = f"numerical failure at iteration {iteration}: the controls of iteration {iteration - 1} are kept"
                break
            good = (parameter, gradient)
            if first is None:
                first = gradient
            costs.append(gradient.cost)
            losses.append(gradient.loss)
            norms.append(float(gradient.dW.norm()))
            bar.update(float(iteration), J=gradient.cost, loss=gradient.loss, grad=norms[-1])
            stop = None
            if control["tol"] > 0 and norms[-1] <= control["tol"]:
                stop = "converged: |dJ/dW|_F <= tol"
            elif (control["tol"] > 0 and len(costs) > 1
                  and abs(costs[-1] - costs[-2]) <= control["tol"] * abs(costs[-1])):
                stop = "converged: |J_k - J_(k-1)| <= tol |J_k|"
            elif iteration == control["iterations"]:
                stop = "control.iterations reached"
            if stop is not None:
                break
            parameter = optimizer.step(parameter, gradient.dW)
    return TrainingResult(parameter.detach(), costs, losses, norms, first, gradient, stop, failure)


def quasi_newton(control: dict, parameter: torch.Tensor, gradient_of, progress: bool | None = None) -> TrainingResult:
    """L-BFGS from the controls `parameter` (module docstring, step 1): scipy's L-BFGS-B on the flattened
    controls in float64, each evaluation one gradient_of; the history holds the accepted iterates.

    A trial point of the line search where J or dJ/dW is not finite (the explicit transport fails for
    too large a W) gets J = 1e3 (1 + |J_0|) and a zero gradient, so that the search backs off; only a
    failure at the start raises NumericalFailure.  Evaluations are cached by their point: scipy asks
    for the current point again after a rejected trial.  The stop message counts the evaluations of J and
    dJ/dW made (`made`), not scipy's nfev, which counts those served from the cache again."""
    from scipy.optimize import minimize

    shape, dtype, device = parameter.shape, parameter.dtype, parameter.device
    evaluations, history, failures, made = {}, [], 0, 0
    bar = Progress(float(max(control["iterations"], 1)), enabled=progress, quantity="iteration")

    def evaluation(x):
        nonlocal failures, made
        key = x.tobytes()
        if key not in evaluations:
            made += 1
            controls = torch.tensor(x.reshape(shape), dtype=dtype, device=device)  # a copy: scipy reuses x
            try:
                gradient = _checked(gradient_of(controls), len(history), control.get("loss"))
            except NumericalFailure:
                if not history:
                    raise
                gradient, failures = None, failures + 1
            if len(evaluations) >= 8:
                evaluations.pop(next(iter(evaluations)))
            evaluations[key] = (controls, gradient)
        return evaluations[key]

    def objective(x):
        controls, gradient = evaluation(x)
        if not history:
            accept(x)
        if gradient is None:
            return 1e3 * (1 + abs(history[0][1].cost)), np.zeros(x.size)
        return gradient.cost, gradient.dW.detach().double().cpu().numpy().ravel()

    def accept(x):
        controls, gradient = evaluation(x)
        history.append((controls, gradient))
        bar.update(float(len(history) - 1), J=gradient.cost, loss=gradient.loss, grad=float(gradient.dW.norm()))

    tol, start = control["tol"], parameter.detach().double().cpu().numpy().ravel()
    with bar.running():  # as optimise's
        if control["iterations"] == 0:  # scipy takes one step even at maxiter = 0
            objective(start)
            stop = "control.iterations reached"
        else:
            result = minimize(objective, start, jac=True, method="L-BFGS-B", callback=accept,
                              options={"maxiter": control["iterations"], "maxfun": 4 * control["iterations"] + 1,
                                       "gtol": tol, "ftol": tol})
            # scipy 1.15 on words a failed line search "ABNORMAL: " with the reason left out
            message = result.message + ("the line search found no step meeting the Wolfe conditions"
                                        if result.message.endswith(": ") else "")
            stop = f"L-BFGS-B: {message} ({made} evaluations, {failures} of them failed runs)"
    controls, final = history[-1]
    result = TrainingResult(controls.detach(), [g.cost for _, g in history], [g.loss for _, g in history],
                            [float(g.dW.norm()) for _, g in history], history[0][1], final, stop)
    if control["learning_rate"] != default_of("control", "learning_rate"):  # a choice the user made, and lost
        result.notes.append(f"control.learning_rate = {control['learning_rate']:g} is not used: L-BFGS's line search "
                            "sets the step lengths")
    return result
