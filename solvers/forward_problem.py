"""The discretised forward equation of M members sharing one grid and one scheme,

    d_t c = eps Lap c - div(rho v[rho])^        (c = spectral coefficients of rho):

the basis, the models, the attention transforms, the transport operator, the diffusion eigenvalues, the
spectral filter and the IMEX scheme (the rules that pick them from the case: solvers/eulerian.py).
"""

import copy

import torch

from solvers.timegrid import Plan
from spherepde.base.device import placement as make_placement
from spherepde.base.errors import CaseError
from spherepde.base.real_view import complex_state, real_diagonal, real_state
from spherepde.discretisation.bases import make_basis
from spherepde.discretisation.timesteppers import RungeKutta, choose_scheme
from spherepde.kernels.choice import MemberKernels
from spherepde.kernels.funk_hecke import check_resolution
from spherepde.model.attention import Model, ModelBatch
from spherepde.model.initial import initial_density
from spherepde.model.transport import Transport


class ForwardProblem:
    """The discretised forward equation of the members `cases` (one case or a list sharing sphere, solver, time
    and scheme): basis, models, attention transforms, transport, diffusion eigenvalues, filter, scheme."""

    def __init__(self, cases):
        cases = [cases] if not isinstance(cases, (list, tuple)) else list(cases)
        case = cases[0]
        self.cases = cases
        solver = case["solver"]
        self.placement = make_placement(solver["device"], solver["dtype"])
        if case.dim not in (2, 3):
            raise CaseError(f"sphere.dim: the Eulerian solver handles d = 2 or 3, got {case.dim}; "
                            "use solver.method = 'particles'")
        if solver["backend"] == "shtns" and (self.placement.device.type != "cpu" or self.placement.name != "float64"):
            raise CaseError("solver.backend: 'shtns' runs on the CPU in float64 only")
        self.basis = make_basis(case.dim, case["sphere"]["lmax"], self.placement, solver["backend"])
        models = [Model.from_case(member, self.placement) for member in cases]
        for model in models:
            check_resolution(model, self.basis, solver["kernel_tol"])
        self.batch = ModelBatch.of(models)
        self.kernels = MemberKernels(self.basis, self.batch.B, [m.beta for m in models], solver["field"],
                                     solver["kernel_tol"], solver["chunk"])
        self.transport = Transport(self.basis, self.batch, self.kernels)
        self.lam = self.batch.eps[:, None] * real_diagonal(self.basis.laplacian)  # (M, N)
        self.filter = spectral_filter(self.basis, solver["filter_order"])
        schemes = {choose_scheme(member["time"]["scheme"], model.eps) for member, model in zip(cases, models)}
        if len(schemes) > 1:
            raise ValueError(f"ForwardProblem: members with different time schemes {sorted(schemes)}")
        self.scheme = RungeKutta(schemes.pop())

    @property
    def members(self) -> int:
        return len(self.cases)

    def select(self, members: list) -> "ForwardProblem":
        """The problem of the members at the indices `members` (a list), sharing the basis and the matrices."""
        chosen = copy.copy(self)
        chosen.cases = [self.cases[m] for m in members]
        chosen.batch, chosen.kernels = self.batch.select(members), self.kernels.select(members)
        chosen.transport = self.transport.select(members)
        chosen.lam = self.lam[members]
        return chosen

    @property
    def model(self) -> Model:
        """The model of a one-member problem."""
        (model,) = self.batch.models
        return model

    @property
    def exp_kernel(self):
        """The attention transform of a one-member problem."""
        (_,) = self.cases
        return self.kernels.member(0)

    def initial(self) -> torch.Tensor:
        """The members' initial states (M, N): the real view of their coefficients (base.real_view.real_state)."""
        return real_state(torch.stack([initial_density(member["initial"], self.basis) for member in self.cases]))

    def coefficients(self, state: torch.Tensor) -> torch.Tensor:
        """The complex coefficients (M, *coeff) of a state (a view)."""
        return complex_state(state, self.transport.coefficient_shape)

    def step(self, state: torch.Tensor, drive: torch.Tensor, factors, keep: list | None = None) -> torch.Tensor:
        """One step of the scheme with the drive of the layer (Transport.feed_forward), then the filter; with `keep`
        (a list) the step's tokens for `step_adjoint` are appended to it (Transport.rate_token, one per stage)."""
        if keep is None:
            state = self.scheme.step(state, lambda stage, U: self.transport(U, drive), factors)
        else:
            tokens = [None] * self.scheme.stages_count

            def rate(stage, U):
                value, tokens[stage] = self.transport.rate_token(U, drive)
                return value

            state = self.scheme.step(state, rate, factors)
            keep.append(tokens)
        return state if self.filter is None else state * self.filter

    def step_adjoint(self, state_bar: torch.Tensor, tokens: list, drive: torch.Tensor,
                     factors) -> tuple[torch.Tensor, torch.Tensor]:
        """(the cotangent of the step's start, that of the drive over the step) from the cotangent of its end
        (`step`'s transpose: the filter is real and diagonal), given the tokens `step` kept."""
        if self.filter is not None:
            state_bar = state_bar * self.filter
        drive_bar = torch.zeros_like(drive)

        def rate_vjp(stage, token, e_bar):
            U_bar, stage_drive_bar = self.transport.vjp_token(token, drive, e_bar)
            drive_bar.add_(stage_drive_bar)
            return U_bar

        return self.scheme.adjoint(state_bar, tokens, rate_vjp, factors), drive_bar

    def factors(self, plan: Plan):
        """The step factors of an interval's plan: dt one float when the members share it, else per member."""
        dt = float(plan.dt[0]) if (plan.dt == plan.dt[0]).all() else self.placement.tensor(plan.dt)[:, None]
        return self.scheme.factors(self.lam, dt)


def spectral_filter(basis, order: int) -> torch.Tensor | None:
    """Exponential filter exp(-36 (l / lmax)^order) (None when order = 0) on the real view (N,) of the
    coefficients: damps only the top modes."""
    if order == 0:
        return None
    return real_diagonal(torch.exp(-36.0 * (basis.degree / basis.lmax).to(basis.placement.real) ** order))
