"""Terminal losses l(mu) of the training problem (docs/design.md "The model", seed 004) and their first variations.

A loss sees a measure as atoms: points x_i (n, d) on S^{d-1} with masses m_i (n,).  On a
grid the masses are rho(x_i) w_i (quadrature weights w_i), for particles 1/N each, so one
formula serves the Eulerian and the particle solver.  Every loss gives

    value(points, masses)            l(mu) as a 0-d tensor (differentiable by torch autograd),
    first_variation(points, masses)  dl/dmu(x_i), the function g with
                                     l(mu + s nu) = l(mu) + s int g dnu + O(s^2),

and, because l depends on mu only through integrals of fixed functions, dl/dmu(x_i) is the
partial derivative of value with respect to m_i (the tests check it against autograd).

    align:  l(mu) = 1 - <int x dmu, e>,                    dl/dmu(x) = -<x, e>
    bow:    p_k(mu) = int s_k(x) dmu(x),  s(x) = softmax_j(tau <x, c_j>),
            l(mu) = -(1/K) sum_k log p_k(mu),              dl/dmu(x) = -(1/K) sum_k s_k(x) / p_k(mu)

with e = control.target (unit vector) and, for bow, K candidates c_k drawn once from
vMF(control.target, control.kappa_cand) with a torch generator seeded by control.seed.
New losses: a class with `name`, `__init__(control, dim)`, `value`, `first_variation`,
registered in LOSSES (the case schema takes its choices from there).
"""

import torch

from spherepde.model.sampling import von_mises_fisher


class AlignLoss:
    """l_align(mu) = 1 - <int x dmu, e>: the mean pulled towards the unit vector e = control.target."""

    name = "align"

    def __init__(self, control: dict, dim: int):
        self.target = torch.as_tensor(control["target"], dtype=torch.float64)

    def value(self, points: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
        e = self.target.to(points)
        return 1 - masses @ (points @ e)

    def first_variation(self, points: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
        return -(points @ self.target.to(points))


class BagOfWordsLoss:
    """l_bow(mu) = -(1/K) sum_k log p_k(mu), p_k = int softmax_j(tau <x, c_j>)_k dmu(x)."""

    name = "bow"

    def __init__(self, control: dict, dim: int):
        generator = torch.Generator().manual_seed(control["seed"])
        self.candidates = von_mises_fisher(control["K"], control["target"], control["kappa_cand"], generator)
        self.tau = control["tau"]

    def _scores(self, points: torch.Tensor) -> torch.Tensor:
        """s_k(x_i) = softmax_j(tau <x_i, c_j>)_k, (n, K)."""
        return torch.softmax(self.tau * (points @ self.candidates.to(points).T), dim=-1)

    def probabilities(self, points: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
        """p_k(mu), (K,)."""
        return masses @ self._scores(points)

    def value(self, points: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
        return -torch.log(self.probabilities(points, masses)).mean()

    def first_variation(self, points: torch.Tensor, masses: torch.Tensor) -> torch.Tensor:
        scores = self._scores(points)
        return -(scores / (masses @ scores)).mean(-1)


LOSSES = {loss.name: loss for loss in (AlignLoss, BagOfWordsLoss)}


def make_loss(control: dict, dim: int):
    """The loss named by control["loss"], built from the resolved [control] section."""
    return LOSSES[control["loss"]](control, dim)
