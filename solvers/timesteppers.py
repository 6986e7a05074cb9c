"""Runge-Kutta time steppers for  dc/dt = lam * c + N(t, c)  with lam diagonal (spectral space).

The linear part is the diffusion eps * Lap (lam = -eps l(l+1) or -eps k^2), the nonlinear
part the transport -div(rho v).  Three families share one tableau format:

* IMEX additive Runge-Kutta: lam implicit (a diagonal solve), N explicit.
  ARK4(3)6L[2]SA (Kennedy & Carpenter 2003): fourth order, 6 stages, L-stable (the default);
  ARS(4,4,3) (Ascher, Ruuth & Spiteri 1997): third order, 4 stages, L-stable, stiffly accurate.
* Explicit: classical RK4 on lam c + N together (the IMEX code with an empty implicit
  tableau and lam c moved into N); the default without diffusion, where lam = 0.
* Lawson (integrating factor): the explicit tableau applied to exp(-lam t) c, exact for
  the heat equation; with lam = 0 it is the explicit scheme itself.
"""

from dataclasses import dataclass
from fractions import Fraction as F

import torch


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

RK4 = Tableau(
    name="rk4",
    order=4,
    a=((0, 0, 0, 0), (F(1, 2), 0, 0, 0), (0, F(1, 2), 0, 0), (0, 0, 1, 0)),
    b=(F(1, 6), F(1, 3), F(1, 3), F(1, 6)),
    c=(0, F(1, 2), F(1, 2), 1),
)

SCHEMES = {"imex-ark436": ("imex", ARK436), "imex-ars443": ("imex", ARS443), "rk4": ("explicit", RK4),
           "lawson-rk4": ("lawson", RK4)}


def choose_scheme(name: str, eps: float) -> str:
    """'auto': the fourth-order IMEX ARK4(3)6L with diffusion, classical RK4 without."""
    if name != "auto":
        return name
    return "imex-ark436" if eps > 0 else "rk4"


def _needed(tableau: Tableau, weights: tuple, stage: int) -> bool:
    """Whether stage `stage`'s explicit evaluation enters a later stage or the update."""
    return weights[stage] != 0 or any(row[stage] != 0 for row in tableau.a[stage + 1:])


def imex_step(tableau: Tableau, lam: torch.Tensor, nonlinear, t: float, c: torch.Tensor, dt: float) -> torch.Tensor:
    """One IMEX step: U_i = c + dt sum_j (a_ij N_j + ai_ij lam U_j), ai_ii implicit."""
    implicit = tableau.a_implicit or tuple((0,) * tableau.stages for _ in range(tableau.stages))
    b_implicit = tableau.b_implicit or (0,) * tableau.stages
    explicit_terms, implicit_terms = [], []
    for i in range(tableau.stages):
        rhs = c
        for j in range(i):
            if tableau.a[i][j]:
                rhs = rhs + (dt * float(tableau.a[i][j])) * explicit_terms[j]
            if implicit[i][j]:
                rhs = rhs + (dt * float(implicit[i][j])) * implicit_terms[j]
        stage = rhs / (1 - dt * float(implicit[i][i]) * lam) if implicit[i][i] else rhs
        implicit_terms.append(lam * stage)
        explicit_terms.append(nonlinear(t + float(tableau.c[i]) * dt, stage)
                              if _needed(tableau, tableau.b, i) else None)
    update = c
    for i in range(tableau.stages):
        if tableau.b[i]:
            update = update + (dt * float(tableau.b[i])) * explicit_terms[i]
        if b_implicit[i]:
            update = update + (dt * float(b_implicit[i])) * implicit_terms[i]
    return update


def explicit_step(tableau: Tableau, lam: torch.Tensor, nonlinear, t: float, c: torch.Tensor,
                  dt: float) -> torch.Tensor:
    """One explicit Runge-Kutta step of c' = lam c + N(t, c), the diffusion stepped with the transport:
    stable only while dt max|lam| stays in the scheme's stability region (2.78 for RK4 on the negative axis)."""
    return imex_step(tableau, lam, lambda s, u: lam * u + nonlinear(s, u), t, c, dt)


def lawson_step(tableau: Tableau, lam: torch.Tensor, nonlinear, t: float, c: torch.Tensor, dt: float) -> torch.Tensor:
    """One integrating-factor step: U_i = E(c_i) c + dt sum_j a_ij E(c_i - c_j) N_j, E(s) = exp(s dt lam)."""
    def propagate(fraction, value):
        return value if fraction == 0 else torch.exp((float(fraction) * dt) * lam) * value

    terms = []
    for i in range(tableau.stages):
        stage = propagate(tableau.c[i], c)
        for j in range(i):
            if tableau.a[i][j]:
                stage = stage + (dt * float(tableau.a[i][j])) * propagate(tableau.c[i] - tableau.c[j], terms[j])
        terms.append(nonlinear(t + float(tableau.c[i]) * dt, stage))
    update = propagate(1, c)
    for i in range(tableau.stages):
        if tableau.b[i]:
            update = update + (dt * float(tableau.b[i])) * propagate(1 - tableau.c[i], terms[i])
    return update


def make_stepper(scheme: str):
    """step(lam, nonlinear, t, c, dt) -> c at t + dt, for a scheme name of SCHEMES."""
    family, tableau = SCHEMES[scheme]
    step = {"imex": imex_step, "explicit": explicit_step, "lawson": lawson_step}[family]

    def stepper(lam, nonlinear, t, c, dt):
        return step(tableau, lam, nonlinear, t, c, dt)

    stepper.order = tableau.order
    stepper.scheme = scheme
    return stepper
