"""The free energy a run's flow dissipates, where one exists (docs/design.md "The model", "Diagnostics").

The forward equation d_t rho = eps Lap rho - div(rho v), v = P_x(W x + V m[rho](x)), is the
Wasserstein gradient flow

    d_t rho = div(rho grad(eps log rho + dU/drho)),    F[rho] = eps int rho log rho dsigma + U[rho],

when the attention drift V m[rho] is the gradient of the first variation of an interaction energy U
and W x has no tangential part.  Along it dF/dt = -int |grad(eps log rho + dU/drho)|^2 drho <= 0.
That happens in two families (m = N with the unnormalized kernel, N / Z with the softmax; at
beta B = 0 both are the mean M = int y drho of a probability measure):

  beta B = 0, V symmetric (noisy Kuramoto: V = K I):
      U = -1/2 <M, V M>,                                    dU/drho (x) = -<x, V M>;
  unnormalized kernel, beta > 0, B symmetric, V = c B (the training paper, arXiv:2605.07772: B = V = A,
  beta = 1, c = 1):
      U = -c / (2 beta) int int exp(beta <x, B y>) drho drho,    grad_x of dU/drho = -c P_x(B N(x)) = -P_x(V m);

and the flow dissipates F when, in addition, W is a multiple of the identity (P_x(w x) = 0; W = 0 in
practice) and constant.  U is then (c / beta) times the run's `interaction_energy`, the pair integral
-1/2 int int exp(beta <x, B y>) drho drho that docs/design.md "Diagnostics" fixes; at beta = 1, c = 1 the two are
one, and F is that paper's energy E(mu) (its turnpike reference).  With a trained or non-trivial W the
same F is still the attention part's energy (the turnpike's energy gap is measured in it), but W may
raise it.

With V = 0 there is no attention drift, whatever the kernel: U = 0 and F = eps S (the heat flow's entropy).
Nowhere else is there such an F: the softmax at beta > 0 (its drift N / Z is no W2 gradient), beta = inf,
and the unnormalized kernel with V not a multiple of a symmetric B.  There `free_energy` is NaN.

Units: dimensionless (densities per unit surface measure sigma, as everywhere in the output).
"""

import math
from dataclasses import dataclass

import numpy as np

# Matrices read from a case are exact decimals: a relative tolerance at round-off decides symmetry and
# proportionality without accepting a matrix that merely resembles one.
RTOL = 1e-12


@dataclass(frozen=True)
class FreeEnergy:
    """F = eps S + U for a model (see the module docstring); `weight` is None where no U exists.

    weight: c / beta of U = (c / beta) * interaction_energy (beta B != 0), or 0 with `mean_field`
    (beta B = 0: U = -1/2 <M, V M>).  `dissipated`: the flow decreases F.  `reason`: why not, or "".
    """

    eps: float
    V: np.ndarray
    weight: float | None
    mean_field: bool
    dissipated: bool
    reason: str

    @classmethod
    def of(cls, kernel: str, beta: float, B, V, W, eps: float, controlled: bool = False) -> "FreeEnergy":
        """The free energy of the model with these parameters, W (d, d) or every layer's (L, d, d) (W x has no
        tangential part, whatever the layer, where each is a multiple of the identity); `controlled`: W_t is a
        trained control."""
        B, V, W = (np.asarray(matrix, dtype=float) for matrix in (B, V, W))
        weight, mean_field, reason = _interaction_weight(kernel, beta, B, V)
        d = W.shape[-1]
        still = not controlled and all(_close(layer, np.trace(layer) / d * np.eye(d)) for layer in W.reshape(-1, d, d))
        if weight is not None and not still:
            reason = ("W_t is a trained control: F is the attention part's energy, which W_t may raise" if controlled
                      else "W is not a multiple of the identity: F is the attention part's energy, which W may raise")
        return cls(eps, V, weight, mean_field, weight is not None and still, reason)

    @classmethod
    def of_model(cls, model, controlled: bool = False, W=None) -> "FreeEnergy":
        """FreeEnergy.of for a spherepde.model.attention.Model (its tensors brought to the host); `controlled`: the
        run's W_t is a trained control, not model.W; W: every layer's W (L, d, d) where model.W is the first's."""
        host = lambda matrix: matrix.cpu().double().numpy()  # noqa: E731
        return cls.of(model.kernel, model.beta, host(model.B), host(model.V), host(model.W) if W is None else W,
                      model.eps, controlled=controlled)

    def interaction(self, interaction_energy: float, mean: np.ndarray) -> float:
        """U from the run's interaction_energy and mean M = int x drho (NaN where no U exists)."""
        if self.weight is None:
            return math.nan
        if self.mean_field:
            return float(-0.5 * mean @ self.V @ mean)
        return self.weight * interaction_energy

    def sample_interaction(self, interaction_energy: float, points: np.ndarray) -> float:
        """U of the independent tokens `points` (n, d), unbiased: the interaction_energy's share (a U-statistic), or
        at beta B = 0 -1/2 the mean of <x_i, V x_j> over the pairs i != j.  The plug-in -1/2 <M_n, V M_n> falls
        below U by tr(V S) / (2 n), which the batch means of particles.replicas (systems of n / R tokens) do not
        average out: at t = 0, 100 systems of 100 tokens read -0.0535 for U = -0.0490, z = -3."""
        if self.weight is None or not self.mean_field:
            return self.interaction(interaction_energy, points.mean(0))
        n = points.shape[0]
        if n < 2:
            return math.nan
        total = points.sum(0)
        pairs = total @ self.V @ total - np.einsum("id,de,ie->", points, self.V, points)
        return float(-0.5 * pairs / (n * (n - 1)))

    def interaction_stderr(self, interaction_stderr: float, points: np.ndarray) -> float:
        """Standard error of U from n independent tokens `points` (n, d): |c / beta| times that of the
        interaction energy, or at beta B = 0 the delta method std(<x_i, V M>) / sqrt(n) (grad_M U = -V M): the
        first-order term, sqrt(2) times U's spread on average where M = 0 (there U is degenerate, spread O(1 / n))."""
        if self.weight is None:
            return math.nan
        if self.mean_field:
            return float((points @ (self.V @ points.mean(0))).std(ddof=1) / math.sqrt(points.shape[0]))
        return abs(self.weight) * interaction_stderr

    def __call__(self, entropy: float, interaction_energy: float, mean: np.ndarray) -> float:
        """F = eps S + U; the entropy S = int rho log rho does not enter when eps = 0 (particles have none)."""
        return (self.eps * entropy if self.eps else 0.0) + self.interaction(interaction_energy, mean)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.abs(a - b).max() <= RTOL * max(1.0, np.abs(a).max(), np.abs(b).max()))


def _interaction_weight(kernel: str, beta: float, B: np.ndarray, V: np.ndarray) -> tuple[float | None, bool, str]:
    """(c / beta or 0, mean_field, reason): how U is built from the interaction energy, or (None, False, why not)."""
    if not V.any():  # no attention drift, whatever the kernel: the heat flow, F = eps S (U = -1/2 <M, 0 M> = 0)
        return 0.0, True, ""
    if math.isinf(beta):
        return None, False, "beta = inf: the field B^T x / |B^T x| is no gradient of an interaction energy"
    if beta == 0 or not B.any():
        if _close(V, V.T):
            return 0.0, True, ""
        return None, False, "V is not symmetric: V M is no gradient of an interaction energy"
    if kernel == "softmax":
        return None, False, "softmax attention N / Z at beta > 0 is no Wasserstein gradient"
    if not _close(B, B.T):
        return None, False, "B is not symmetric: exp(beta <x, B y>) is no symmetric interaction"
    c = float((V * B).sum() / (B * B).sum())
    if not _close(V, c * B):
        return None, False, "V is not a multiple of B: V m is no gradient of an interaction energy"
    return c / beta, False, ""


LABEL = ("eps * entropy + U, the free energy the flow dissipates where one exists (spherepde/model/energy.py): "
         "U = -1/2 <M, V M> at beta B = 0 (V symmetric), (c / beta) * interaction_energy for the unnormalized "
         "kernel with V = c B, B symmetric, 0 at V = 0 (any kernel); NaN where no U exists (softmax at beta > 0, "
         "beta = inf, other V)")
