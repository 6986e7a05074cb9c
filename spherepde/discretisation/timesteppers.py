"""Runge-Kutta time steppers for  dc/dt = lam * c + N(c)  with lam diagonal (spectral space), and their adjoints.

The linear part is the diffusion eps * Lap (lam = -eps l(l+1) or -eps k^2), the nonlinear
part the transport -div(rho v).  Three families share one tableau format:

* IMEX additive Runge-Kutta: lam implicit (a diagonal solve), N explicit.
  ARK4(3)6L[2]SA (Kennedy & Carpenter 2003): fourth order, 6 stages, L-stable (the default);
  ARS(4,4,3) (Ascher, Ruuth & Spiteri 1997): third order, 4 stages, L-stable, stiffly accurate.
* Explicit: classical RK4 on lam c + N together (the IMEX code with an empty implicit
  tableau and lam c moved into N); the default without diffusion, where lam = 0.
* Lawson (integrating factor): the explicit tableau applied to exp(-lam t) c, exact for
  the heat equation; with lam = 0 it is the explicit scheme itself.

All three are one mechanism (`RungeKutta`): every stage input U_i and the update are linear combinations,
each term possibly multiplied by a diagonal propagator exp(f dt lam) (Lawson), of the step's start c and
of the stage terms E_j = dt N(U_j) and I_j = dt lam U_j, followed for implicit stages by the diagonal solve
U_i = R_i / (1 - dt ai_ii lam); a stiffly accurate IMEX scheme's update is its last stage plus such a combination
of the E_j (`_terms`).  Explicit RK on lam c + N(c) is the IMEX scheme whose implicit tableau is
its explicit one.  The terms are kept as the rows of one buffer, so that a stage costs one matrix-vector
product over the rows, not a Python loop over them, and the state may carry a leading member axis with a
member's own lam (eps) and dt.  `adjoint` is the exact transpose of one step (reverse-mode differentiation
done by hand: the stage terms' cotangents are accumulated in the same buffer layout), given the stage
inputs U_i that `step` keeps when asked and a vector-Jacobian product of N.  Both are one program over numpy
arrays and torch tensors (spherepde.base.arrays), by the kind of the state: numpy on the CPU where N has a numpy
program (model.fourier_path), torch elsewhere.
"""

import copy
import math
from dataclasses import dataclass
from fractions import Fraction as F

import numpy as np
import torch

from spherepde.base.arrays import (
    array_like,
    as_namespace,
    clone,
    copy_,
    kind,
    namespace,
    outer_update,
    zero_,
    zeros,
)
from spherepde.geometry.sphere import normalise


@dataclass(frozen=True)
class Tableau:
    """Butcher tableaux of an additive RK method (explicit part `a`, implicit part `a_implicit`)."""

    name: str
    order: int
    a: tuple
    b: tuple
    c: tuple
    a_implicit: tuple | None = None
    b_implicit: tuple | None = None

    @property
    def stages(self) -> int:
        return len(self.b)


ARS443 = Tableau(
    name="imex-ars443",
    order=3,
    a=((0, 0, 0, 0, 0),
       (F(1, 2), 0, 0, 0, 0),
       (F(11, 18), F(1, 18), 0, 0, 0),
       (F(5, 6), F(-5, 6), F(1, 2), 0, 0),
       (F(1, 4), F(7, 4), F(3, 4), F(-7, 4), 0)),
    b=(F(1, 4), F(7, 4), F(3, 4), F(-7, 4), 0),
    c=(0, F(1, 2), F(2, 3), F(1, 2), 1),
    a_implicit=((0, 0, 0, 0, 0),
                (0, F(1, 2), 0, 0, 0),
                (0, F(1, 6), F(1, 2), 0, 0),
                (0, F(-1, 2), F(1, 2), F(1, 2), 0),
                (0, F(3, 2), F(-3, 2), F(1, 2), F(1, 2))),
    b_implicit=(0, F(3, 2), F(-3, 2), F(1, 2), F(1, 2)),
)

# Kennedy & Carpenter (2003), ARK4(3)6L[2]SA: fourth order, L-stable, stiffly accurate ESDIRK part.
_ARK436_B = (F(82889, 524892), 0, F(15625, 83664), F(69875, 102672), F(-2260, 8211), F(1, 4))
ARK436 = Tableau(
    name="imex-ark436",
    order=4,
    a=((0, 0, 0, 0, 0, 0),
       (F(1, 2), 0, 0, 0, 0, 0),
       (F(13861, 62500), F(6889, 62500), 0, 0, 0, 0),
       (F(-116923316275, 2393684061468), F(-2731218467317, 15368042101831), F(9408046702089, 11113171139209),
        0, 0, 0),
       (F(-451086348788, 2902428689909), F(-2682348792572, 7519795681897), F(12662868775082, 11960479115383),
        F(3355817975965, 11060851509271), 0, 0),
       (F(647845179188, 3216320057751), F(73281519250, 8382639484533), F(552539513391, 3454668386233),
        F(3354512671639, 8306763924573), F(4040, 17871), 0)),
    b=_ARK436_B,
    c=(0, F(1, 2), F(83, 250), F(31, 50), F(17, 20), 1),
    a_implicit=((0, 0, 0, 0, 0, 0),
                (F(1, 4), F(1, 4), 0, 0, 0, 0),
                (F(8611, 62500), F(-1743, 31250), F(1, 4), 0, 0, 0),
                (F(5012029, 34652500), F(-654441, 2922500), F(174375, 388108), F(1, 4), 0, 0),
                (F(15267082809, 155376265600), F(-71443401, 120774400), F(730878875, 902184768),
                 F(2285395, 8070912), F(1, 4), 0),
                _ARK436_B),
    b_implicit=_ARK436_B,
)

HEUN = Tableau(name="heun", order=2, a=((0, 0), (1, 0)), b=(F(1, 2), F(1, 2)), c=(0, 1))  # the particles' step

RK4 = Tableau(
    name="rk4",
    order=4,
    a=((0, 0, 0, 0), (F(1, 2), 0, 0, 0), (0, F(1, 2), 0, 0), (0, 0, 1, 0)),
    b=(F(1, 6), F(1, 3), F(1, 3), F(1, 6)),
    c=(0, F(1, 2), F(1, 2), 1),
)

SCHEMES = {"imex-ark436": ("imex", ARK436), "imex-ars443": ("imex", ARS443), "rk4": ("explicit", RK4),
           "lawson-rk4": ("lawson", RK4)}


def stability_bound(name: str, direction: complex) -> float:
    """The largest y such that the scheme's explicit stages are stable on the segment [0, y direction] of the complex
    plane (|direction| = 1): the first positive root of |R(y direction)|^2 = 1 where it crosses, R(z) = 1 + sum_k
    b^T A^(k-1) 1 z^k the stability function of the explicit tableau (A strictly lower triangular).
    direction = 1j: a transport by a speed |v| has the modes i m |v| (orders m <= lmax), so steps with lmax max|v| dt
    above the bound grow: 2 sqrt 2 for RK4 (and for Lawson-RK4, RK4 itself where eps = 0), 4.0007 for ARK4(3)6L,
    1.5699 for ARS(4,4,3).  direction = -1: the diffusion's modes eps lam, where the stages take it explicitly
    (the explicit family, "rk4"): 2.7853 for RK4."""
    tableau = SCHEMES[name][1]
    s = tableau.stages
    powers, g = [F(1)] * s, [F(1)]  # A^(k-1) 1, then the coefficients g_k
    for _ in range(s):
        g.append(sum(weight * power for weight, power in zip(tableau.b, powers)))
        powers = [sum(tableau.a[i][j] * powers[j] for j in range(s)) for i in range(s)]
    # |R(y w)|^2 = sum_jk g_j g_k Re(w^j conj(w)^k) y^(j+k) (the imaginary parts cancel between jk and kj), and
    # Re(w^j conj(w)^k) is -1, 0 or 1 for w = 1j or -1
    square = [F(0)] * (2 * s + 1)
    for j, gj in enumerate(g):
        for k, gk in enumerate(g):
            square[j + k] += gj * gk * round((direction ** j * direction.conjugate() ** k).real)
    square[0] -= 1
    # |R|^2 - 1 = y^lowest q(y); the published tableaux's rationals meet the order conditions to about 1e-26
    largest = max(abs(value) for value in square)
    lowest = next(power for power, value in enumerate(square) if abs(value) > 1e-12 * largest)
    if square[lowest] > 0:  # growing from y = 0 on (forward Euler and Heun on the imaginary axis)
        return 0.0
    q = np.polynomial.Polynomial([float(value) for value in square[lowest:]])
    roots = sorted(root.real for root in q.roots() if abs(root.imag) <= 1e-9 * abs(root) and root.real > 0)
    return float(next((root for root in roots if q(root * (1 + 1e-6)) > 0), math.inf))


def choose_scheme(name: str, eps: float) -> str:
    """'auto': the fourth-order IMEX ARK4(3)6L with diffusion, classical RK4 without."""
    if name != "auto":
        return name
    return "imex-ark436" if eps > 0 else "rk4"


@dataclass(frozen=True)
class StageTerms:
    """One linear combination of the step's vectors (row 0: c; row 2j + 1: E_j = dt N(U_j); row 2j + 2:
    I_j = dt lam U_j): per propagator fraction f (None: the identity, else exp(f dt lam)), the coefficients
    of the rows (a float tuple over all 2 s + 1 rows)."""

    groups: tuple


def _terms(tableau: Tableau, family: str) -> tuple[list[StageTerms], StageTerms, list[float], bool]:
    """(stage combinations, update combination, implicit diagonal ai_ii per stage, whether the update starts from
    the last stage) of a scheme family.

    A stiffly accurate IMEX scheme (bi = the last row of ai) updates from its last stage, c' = U_s + sum_j (b_j -
    a_sj) E_j, the same algebra without the terms I_j = dt lam U_j: those are dt |lam| times the state, and the
    sum c + sum_j (b_j E_j + bi_j I_j) cancels them to the O(1 / (dt |lam|)) that L-stability leaves, with a
    rounding error of eps dt |lam| |c| (numpy float32, dt |lam| = 1e8: 0.2 |c| where |R| = 9e-8), which the
    implicit solve of U_s divides away."""
    s = tableau.stages
    rows = 2 * s + 1
    implicit = tableau.a if family == "explicit" else tableau.a_implicit
    b_implicit = tableau.b if family == "explicit" else tableau.b_implicit

    def combination(start, explicit_row, implicit_row, upto):
        if family == "lawson":
            groups = {}
            groups.setdefault(start, [0.0] * rows)[0] = 1.0
            for j in range(upto):
                if explicit_row[j]:
                    groups.setdefault(start - tableau.c[j], [0.0] * rows)[2 * j + 1] = float(explicit_row[j])
            return StageTerms(tuple((None if f == 0 else float(f), tuple(row)) for f, row in groups.items()))
        row = [0.0] * rows
        row[0] = 1.0
        for j in range(upto):
            row[2 * j + 1] = float(explicit_row[j])
            if implicit_row is not None:
                row[2 * j + 2] = float(implicit_row[j])
        return StageTerms(((None, tuple(row)),))

    stages = [combination(tableau.c[i], tableau.a[i], implicit[i] if implicit else None, i) for i in range(s)]
    diagonal = [float(implicit[i][i]) if implicit and family == "imex" else 0.0 for i in range(s)]
    from_last_stage = family == "imex" and tuple(b_implicit) == tuple(implicit[-1])
    if not from_last_stage:
        return stages, combination(1, tableau.b, b_implicit, s), diagonal, False
    row = [0.0] * rows
    for j, (b, a) in enumerate(zip(tableau.b, tableau.a[-1])):
        row[2 * j + 1] = float(b - a)
    update = StageTerms(((None, tuple(row)),) if any(row) else ())  # none: c' = U_s (ARS443)
    return stages, update, diagonal, True


class StepFactors:
    """What a step needs that depends on dt and lam only, computed once per interval of equal steps: dt (a float,
    or a tensor (M, 1) for members' own steps), dt lam, the implicit solves' 1 / (1 - dt ai_ii lam) and the
    propagators exp(f dt lam), as real tensors (M, N) over the real view of the coefficients; `on(numpy)` the same
    as numpy arrays sharing their memory (made once)."""

    def __init__(self, scheme: "RungeKutta", lam: torch.Tensor, dt):
        self.dt = dt
        self.dt_lam = dt * lam
        self.solve = {a: 1 / (1 - a * self.dt_lam) for a in set(scheme.diagonal) if a}
        fractions = {f for terms in scheme.stages + [scheme.update] for f, _ in terms.groups if f is not None}
        self.propagator = {f: torch.exp(f * self.dt_lam) for f in fractions}
        self._numpy = None

    def on(self, xp) -> "StepFactors":
        """These factors for the array program of the library xp (numpy or torch; base.arrays)."""
        if xp is torch:
            return self
        if self._numpy is None:
            self._numpy = copy.copy(self)
            self._numpy.dt, self._numpy.dt_lam = as_namespace(self.dt, xp), as_namespace(self.dt_lam, xp)
            self._numpy.solve = {a: as_namespace(value, xp) for a, value in self.solve.items()}
            self._numpy.propagator = {f: as_namespace(value, xp) for f, value in self.propagator.items()}
        return self._numpy


class RungeKutta:
    """One step c -> c' of the scheme `name` of SCHEMES for a batch (module docstring), and its adjoint.

    States are real (M, N): the real view of each member's complex coefficients (or any real vector);
    lam is real (M, N).  `rate(i, U)` is N at stage i (the stage's time is t + fractions[i] dt).
    """

    def __init__(self, name: str):
        family, tableau = SCHEMES[name]
        self.scheme, self.order, self.stages_count = name, tableau.order, tableau.stages
        self.fractions = [float(c) for c in tableau.c]
        self.stages, self.update, self.diagonal, self.from_last_stage = _terms(tableau, family)
        rows = 2 * tableau.stages + 1
        later = self.stages[1:] + [self.update]
        used = [any(row[k] for terms in later for _, row in terms.groups) for k in range(rows)]
        # Every tableau here has an explicit first stage whose input is the step's start itself: `step` keeps that
        # same array (no copy), and its transpose adds the stage's cotangent to the start's.
        self.starts_at_start = self.diagonal[0] == 0
        self.explicit_needed = [used[2 * i + 1] for i in range(tableau.stages)]
        self.implicit_needed = [used[2 * i + 2] for i in range(tableau.stages)]
        self._coefficients, self._buffers, self._transposes = {}, {}, {}

    def factors(self, lam: torch.Tensor, dt) -> StepFactors:
        return StepFactors(self, lam, dt)

    def _rows(self, terms: StageTerms, like):
        """The groups of `terms` as (fraction, coefficients (1, k), k) of the kind, device and dtype of `like`, k the
        rows up to the last nonzero coefficient (the product reads no more of the buffer)."""
        key = (id(terms),) + kind(like)
        if key not in self._coefficients:
            groups = []
            for f, row in terms.groups:
                count = max(k for k, value in enumerate(row) if value) + 1
                groups.append((f, array_like([row[:count]], like), count))
            self._coefficients[key] = groups
        return self._coefficients[key]

    def _buffer(self, like, role: str) -> tuple:
        """A (2 s + 1, M, N) buffer of the step's rows, kept between steps, with the views (k, M N) of its first k
        flattened rows (k = 0..2 s + 1: `_combine`'s operands, made once) and its rows.  `step` writes every row
        it reads before reading it, but for the rows of terms no later combination needs, which it never writes:
        they stay the zeros they start as (a zero coefficient times a non-finite row would still be NaN)."""
        key = (role, tuple(like.shape)) + kind(like)
        if key not in self._buffers:
            buffer = zeros(like, (2 * self.stages_count + 1,) + tuple(like.shape))
            flat = buffer.reshape(buffer.shape[0], -1)
            self._buffers[key] = buffer, [flat[:k] for k in range(flat.shape[0] + 1)], list(buffer)
        return self._buffers[key]

    def _combine(self, terms: StageTerms, prefixes: list, factors: StepFactors, shape):
        """sum over groups of P_f (coefficients . rows): one product over the rows per group."""
        total = None
        for f, coefficients, count in self._rows(terms, prefixes[-1]):
            part = (coefficients @ prefixes[count]).reshape(shape)
            if f is not None:
                part = part * factors.propagator[f]
            total = part if total is None else total + part
        return total

    def step(self, c, rate, factors: StepFactors, keep: list | None = None):
        """c at t + dt; with `keep` (a list) the stage inputs U_i are appended to it (for `adjoint`).  One program
        over numpy and torch (base.arrays): c, rate's values and `factors` (StepFactors.on) of one library."""
        xp = namespace(c)
        _, prefixes, rows = self._buffer(c, "step")
        copy_(rows[0], c)
        for i, terms in enumerate(self.stages):
            stage = c if i == 0 and self.starts_at_start else self._combine(terms, prefixes, factors, c.shape)
            if self.diagonal[i]:
                stage = stage * factors.solve[self.diagonal[i]]
            if keep is not None:
                keep.append(stage)
            if self.explicit_needed[i]:
                xp.multiply(rate(i, stage), factors.dt, out=rows[2 * i + 1])
            if self.implicit_needed[i]:
                xp.multiply(stage, factors.dt_lam, out=rows[2 * i + 2])
        update = self._combine(self.update, prefixes, factors, c.shape)
        if not self.from_last_stage:
            return update
        return clone(stage) if update is None else stage + update  # a new array: `keep` holds the stage itself

    def adjoint(self, c_bar, stages: list, rate_vjp, factors: StepFactors):
        """The cotangent of the step's start from that of its end, c_bar: the transpose of `step`'s linear
        algebra, with rate_vjp(i, U_i, e_bar) the cotangent of U_i (a new array, which the transpose updates in
        place) from the cotangent e_bar of N(U_i) (it may accumulate other cotangents itself; e_bar is a row of the
        transpose's buffer, to be read before rate_vjp returns).  Over numpy or torch, as `step`."""
        xp = namespace(c_bar)
        bar, prefixes, rows = self._buffer(c_bar, "adjoint")
        zero_(bar)
        self._scatter(self.update, prefixes, c_bar, factors)
        for i in reversed(range(self.stages_count)):
            # the rows of stage i are read here only: scaled in place, no temporaries
            stage_bar = None
            if self.explicit_needed[i]:
                stage_bar = rate_vjp(i, stages[i], xp.multiply(rows[2 * i + 1], factors.dt, out=rows[2 * i + 1]))
            if self.implicit_needed[i]:
                implicit_bar = xp.multiply(rows[2 * i + 2], factors.dt_lam, out=rows[2 * i + 2])
                stage_bar = implicit_bar if stage_bar is None else xp.add(stage_bar, implicit_bar, out=stage_bar)
            if self.from_last_stage and i == self.stages_count - 1:  # c' = U_s + ...
                stage_bar = clone(c_bar) if stage_bar is None else xp.add(stage_bar, c_bar, out=stage_bar)
            if stage_bar is None:
                continue
            if self.diagonal[i]:
                stage_bar *= factors.solve[self.diagonal[i]]
            if i == 0 and self.starts_at_start:
                rows[0] += stage_bar
            else:
                self._scatter(self.stages[i], prefixes, stage_bar, factors)
        return clone(rows[0])

    def _scatter(self, terms: StageTerms, prefixes: list, value, factors: StepFactors) -> None:
        """The transpose of `_combine`: rows += coefficients (outer) P_f value, for each group (arrays.outer_update of
        the buffer's rows, made once per buffer)."""
        key = (id(terms), id(prefixes))
        if key not in self._transposes:
            self._transposes[key] = [(f, outer_update(prefixes[count], coefficients.T))
                                     for f, coefficients, count in self._rows(terms, prefixes[-1])]
        for f, update in self._transposes[key]:
            update((value if f is None else value * factors.propagator[f]).reshape(-1))


EXPLICIT_TABLEAUX = {"heun": HEUN, "rk4": RK4}  # the particles' steps, by particles.integrator


def explicit_increment(velocity, x: torch.Tensor, h: float, tableau: Tableau) -> torch.Tensor:
    """y = x + h sum_i b_i k_i with k_i = velocity(x + h sum_{j<i} a_ij k_j, c_i): one step in R^d of an
    explicit tableau of this module."""
    slopes = []
    for row, offset in zip(tableau.a, tableau.c):
        stage = x
        for weight, slope in zip(row, slopes):
            if weight:
                stage = torch.add(stage, slope, alpha=h * weight)
        slopes.append(velocity(stage, offset))
    for weight, slope in zip(tableau.b, slopes):
        x = torch.add(x, slope, alpha=h * weight)
    return x


def explicit_flow(velocity, x: torch.Tensor, h: float, tableau: Tableau) -> torch.Tensor:
    """The step of `tableau` in R^d, then normalised: the sphere is invariant for the drift, so normalising once
    per step keeps the method's order."""
    return normalise(explicit_increment(velocity, x, h, tableau))
