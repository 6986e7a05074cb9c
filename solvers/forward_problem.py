"""The discretised forward equation of M members sharing one grid and one scheme,

    d_t c = eps Lap c - div(rho v[rho])^        (c = spectral coefficients of rho):

the basis, the models, the attention transforms, the transport operator, the diffusion eigenvalues, the
spectral filter and the IMEX scheme (the rules that pick them from the case: solvers/eulerian.py).

The seeds' model (spherepde.model.parameters.Layout.seeds_model: one head, a linear feed-forward, B and V
constant) runs on spherepde.model.transport's fast paths, its drive built from W (each layer's, where model.W
is a list of one per layer).  Any other model runs on
spherepde.model.layered_transport, whose drive of layer l is the members' parameters theta_l (M, p)
(`parameters`, (M, L, p), from spherepde.model.parameters.parameters_of), L = model_layers(case) layers of
[0, t_end] even without a [control] section.  Head 0 on layer 0 stands in `batch` for what is read member by
member (eps, the resolution check, the diagnostics of solvers/eulerian_recorder.py, which are those of one
fixed head or NaN: `fixed_attention`).
"""

import copy
import math
from types import SimpleNamespace

import numpy as np
import torch

from solvers.timegrid import Plan
from spherepde.base.arrays import as_namespace, as_tensor, quiet
from spherepde.base.device import placement as make_placement
from spherepde.base.errors import CaseError
from spherepde.base.garbage import freeze_setup
from spherepde.base.memory import keep_freed_memory
from spherepde.base.real_view import complex_state, real_diagonal, real_state
from spherepde.discretisation.bases import basis_class, make_basis
from spherepde.discretisation.timesteppers import SCHEMES, RungeKutta, choose_scheme, stability_bound
from spherepde.kernels.choice import MemberKernels
from spherepde.kernels.funk_hecke import check_resolution, check_resolutions
from spherepde.model.attention import Model, ModelBatch
from spherepde.model.initial import initial_density
from spherepde.model.layered_transport import LayeredTransport
from spherepde.model.parameters import Layout, layer_values, layout_of, model_layers, parameters_of
from spherepde.model.transport import Transport, auto_fields


class ForwardProblem:
    """The discretised forward equation of the members `cases` (one case or a list sharing sphere, solver, time
    and scheme): basis, models, attention transforms, transport, diffusion eigenvalues, filter, scheme.

    `layered` steps a seeds' model on the layered transport too (the check that both agree); members beyond the
    seeds' model share their Layout's heads, feed-forward and layers (spherepde.api.ensemble batches them so)."""

    def __init__(self, cases, layered: bool = False):
        cases = [cases] if not isinstance(cases, (list, tuple)) else list(cases)
        case = cases[0]
        self.cases = cases
        keep_freed_memory()  # the steps' temporaries, freed at every stage, stay with the process
        freeze_setup()  # full garbage collections skip what exists now (spherepde/base/garbage.py)
        solver = case["solver"]
        self.placement = make_placement(solver["device"], solver["dtype"])
        check_dimension(case)
        for member in cases:
            check_solver_choices(member, self.placement.device.type)
            check_kernel_range(member)
        self.basis = make_basis(case.dim, case["sphere"]["lmax"], self.placement, solver["backend"])
        self.layouts = [layout_of(member) for member in cases]
        self.layered = layered or not all(layout.seeds_model for layout in self.layouts)
        if self.layered:
            self.layout = shared_layout(self.layouts)
            self.parameters = torch.stack([parameters_of(member, self.layout, self.placement) for member in cases])
            layer_models = [head_models(self.layout, theta, float(member["model"]["eps"]))
                            for member, theta in zip(cases, self.parameters)]
            models = [each[0] for each in layer_models]
            for each in layer_models:
                check_resolutions(resolution_entries(self.layout, each), self.basis, solver["kernel_tol"])
        else:
            models = [Model.from_case(member, self.placement) for member in cases]
            for model in models:
                check_resolution(model, self.basis, solver["kernel_tol"])
        self.batch = ModelBatch.of(models)
        field = solver["field"]
        if field == "auto" and not self.layered:
            field = auto_fields(self.basis, models, solver["kernel_tol"], solver["chunk"])
        self.kernels = MemberKernels(self.basis, self.batch.B, [m.beta for m in models], field, solver["kernel_tol"],
                                     solver["chunk"])
        if self.layered:
            self.transport = LayeredTransport(self.basis, self.layout, solver["chunk"])
        else:
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
        chosen.layouts = [self.layouts[m] for m in members]
        if self.layered:
            chosen.parameters = self.parameters[members]
        return chosen

    def layer_drives(self) -> list:
        """The drive of every layer of the members' own models (a plain run): the seeds' Transport.feed_forward(W_l)
        of each layer's W (model.W, or its list of one per layer: the members share their number, as
        spherepde.api.ensemble batches them), else the parameters theta_l (M, p) of each of the L layers."""
        if self.layered:
            return [self.parameters[:, layer] for layer in range(self.parameters.shape[1])]
        layers = model_layers(self.cases[0])
        W = torch.stack([self.placement.tensor(layer_values(case["model"]["W"], layers)) for case in self.cases])
        return [self.transport.feed_forward(W[:, layer]) for layer in range(layers)]

    def explicit_stiffness(self) -> np.ndarray:
        """Per member max |eps lam| where the scheme's stages take the diffusion explicitly ("rk4"), else 0 (it is
        implicit in the IMEX schemes, exact in Lawson's)."""
        if SCHEMES[self.scheme.scheme][0] != "explicit":
            return np.zeros(self.lam.shape[0])
        return (-self.lam).amax(1).cpu().double().numpy()

    def implicit_diffusion_speed(self) -> np.ndarray:
        """Per member eps (1 / time on the unit sphere) where the scheme's stages take the diffusion implicitly (the
        IMEX schemes), else 0: the CFL rule's floor under max|v|.  The implicit stages are stable at any step but
        accurate only while eps l (l + d - 2) dt is small; a step of cfl / (lmax eps) keeps the degrees
        l <~ sqrt(lmax / cfl) within one e-fold a step.  Without it a run of little or no transport took one step
        a save: pure noise (S^2, lmax 24, eps 0.3, a vMF of kappa 10) one step of imex-ark436 for t = 1, 37% off in
        max |rho| against the exact heat flow (6e-7 at the 15 steps of cfl 0.5)."""
        if SCHEMES[self.scheme.scheme][0] != "imex":
            return np.zeros(self.lam.shape[0])
        return self.batch.eps.cpu().double().numpy()

    def unstable_steps(self, state: torch.Tensor, drive: torch.Tensor, dt, t: float, key: str,
                       cfl: float | None = None) -> list:
        """Per member, where its steps were too long for the scheme's explicit stages: the sentence that says so,
        else None.  The transport's modes at `state` (M, N) with the layer's `drive` are about i m |v| (orders m <=
        lmax), so a step dt (per member, (M,)) is beyond its stability when lmax max|v| dt exceeds
        timesteppers.stability_bound on the imaginary axis; where the stages take the diffusion too ("rk4"), when
        dt max|eps lam| exceeds it on the negative real axis.  `t` is the state's time, `key` the case key that
        sets the step ("time.dt" or "time.cfl", then `cfl` its value: the rule sets dt from max|v| at the save
        interval's start, and max|v| may grow before the step, so that the advice is time.cfl times the ratio of
        the bound to the step's lmax max|v| dt, not the bound itself)."""
        lmax, scheme = self.basis.lmax, self.scheme.scheme
        transport, diffusion = stability_bound(scheme, 1j), stability_bound(scheme, -1)
        speeds = self.transport.max_speed(state, drive).cpu().double().numpy()
        stiffness = self.explicit_stiffness()
        sentences = []
        for speed, rate, step in zip(speeds, stiffness, np.broadcast_to(dt, speeds.shape)):
            parts = []
            if math.isfinite(speed) and lmax * speed * step > transport:
                parts.append(f"lmax max|v| dt = {lmax} x {speed:.3g} x {step:.3g} = {lmax * speed * step:.3g} at "
                             f"t = {t:.6g}, above {transport:.3g}, beyond which {scheme}'s explicit stages amplify "
                             f"a transport's modes: {_shorter(key, step, transport / (lmax * speed), cfl)}")
            if math.isfinite(rate) and rate * step > diffusion:
                parts.append(f"dt max|eps lam| = {step:.3g} x {rate:.3g} = {rate * step:.3g}, above {diffusion:.3g}, "
                             f"beyond which {scheme}'s explicit stages amplify the diffusion's modes: take time.dt "
                             f"below {diffusion / rate:.3g} or an IMEX scheme")
            both = (lmax * speed + rate) * step
            if not parts and rate > 0 and math.isfinite(both) and both > diffusion:
                # |Re z| + |Im z| <= the real axis's bound lies within RK4's region; beyond it, modes of the
                # transport and the diffusion together may grow where each alone would not
                parts.append(f"(lmax max|v| + max|eps lam|) dt = ({lmax} x {speed:.3g} + {rate:.3g}) x {step:.3g} = "
                             f"{both:.3g} at t = {t:.6g}, above {diffusion:.3g}, beyond which {scheme}'s explicit "
                             f"stages may amplify modes of the transport and the diffusion together: "
                             f"{_shorter(key, step, diffusion / (lmax * speed + rate), cfl)} or an IMEX scheme")
            sentences.append("; ".join(parts) or None)
        return sentences

    def first_unstable_step(self, state: torch.Tensor, t: float, plans: list, drives: list, key: str,
                            member: int, cfl: float | None = None, done: int = 0) -> str | None:
        """The sentence of `unstable_steps` for `member` at the first state whose step was beyond the bound, the
        steps of `plans` (consecutive intervals from `state` at t, the first's `done` steps already taken there (a
        run resumed in mid-interval), each with its layer's drive of `drives`) taken again; None where every step
        from a finite state was within it.  Finiteness is checked at knots only, and
        max|v| grows between them as the density concentrates, so the state at the last knot alone can lie well
        within the bound (kuramoto-s1 at beta = 4, eps = 0.05, dt = 0.05: 0.99 of it at t = 0, not finite by t = 1).
        All members are stepped (they are independent); on a failure only."""
        for index, plan in enumerate(plans):
            drive, factors, dt = drives[plan.interval.layer], self.factors(plan), float(plan.dt[member])
            for k in range(done if index == 0 else 0, int(plan.steps[member])):
                said = self.unstable_steps(state, drive, plan.dt, t, key, cfl)[member]
                if said is not None or not bool(torch.isfinite(state[member]).all()):
                    return said
                state, t = self.step(state, drive, factors), plan.interval.t0 + (k + 1) * dt
        return None

    def fixed_attention(self, member: int, trained: bool = False) -> bool:
        """Whether member `member`'s attention is one head whose B and V are the same on every layer (and, for a
        training's run (`trained`), not trained): the model the one-head diagnostics (subspaces, interaction
        and free energy) are defined for, its head being `batch.models[member]`'s."""
        return not self.layered or self.layouts[member].one_fixed_head(self.parameters[member], trained)

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
        return real_state(torch.stack([initial_density(member["initial"], self.basis,
                                                           member["diagnostics"]["tail_tol"])
                                           for member in self.cases]))

    def coefficients(self, state: torch.Tensor) -> torch.Tensor:
        """The complex coefficients (M, *coeff) of a state (a view)."""
        return complex_state(state, self.transport.coefficient_shape)

    def step(self, state: torch.Tensor, drive: torch.Tensor, factors, keep: list | None = None,
             rows: bool = True) -> torch.Tensor:
        """One step of the scheme with the drive of the layer (Transport.feed_forward), then the filter; with `keep`
        (a list) the step's tokens for `step_adjoint` are appended to it, (rows, [one per stage]) (Transport.rate_token
        with `rows`).
        The step runs in the transport's array library (Transport.namespace: numpy on the CPU's fourier path),
        the state, drive and factors viewed in it and the end state viewed back as a tensor (no copies)."""
        xp = self.transport.namespace
        state, drive, factors = as_namespace(state, xp), as_namespace(drive, xp), factors.on(xp)
        with quiet(xp):
            if keep is None:
                state = self.scheme.step(state, lambda stage, U: self.transport(U, drive), factors)
            else:
                tokens = [None] * self.scheme.stages_count

                def rate(stage, U):
                    value, tokens[stage] = self.transport.rate_token(U, drive, rows)
                    return value

                state = self.scheme.step(state, rate, factors)
                keep.append((rows, tokens))
            return as_tensor(state if self.filter is None else state * as_namespace(self.filter, xp))

    def step_adjoint(self, state_bar: torch.Tensor, kept: tuple, drive: torch.Tensor, factors,
                     drive_bar: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the cotangent of the step's start, that of the drive over the step) from the cotangent of its end
        (`step`'s transpose: the filter is real and diagonal), given what `step` kept, (rows, tokens); in the array
        library of `step`.  With `drive_bar` (a tensor like the drive) the drive's cotangent is added to it, and it
        is the one returned: a layer's sum over its steps without a sum of tensors a step."""
        xp = self.transport.namespace
        state_bar, drive, factors = as_namespace(state_bar, xp), as_namespace(drive, xp), factors.on(xp)
        drive_bar = xp.zeros_like(drive) if drive_bar is None else as_namespace(drive_bar, xp)
        rows, tokens = kept

        def rate_vjp(stage, token, e_bar):
            U_bar, stage_drive_bar = self.transport.vjp_token(token, drive, e_bar, rows)
            xp.add(drive_bar, stage_drive_bar, out=drive_bar)
            return U_bar

        with quiet(xp):
            if self.filter is not None:
                state_bar = state_bar * as_namespace(self.filter, xp)
            return as_tensor(self.scheme.adjoint(state_bar, tokens, rate_vjp, factors)), as_tensor(drive_bar)

    def factors(self, plan: Plan):
        """The step factors of an interval's plan: dt one float when the members share it, else per member."""
        dt = float(plan.dt[0]) if (plan.dt == plan.dt[0]).all() else self.placement.tensor(plan.dt)[:, None]
        return self.scheme.factors(self.lam, dt)


def _shorter(key: str, step: float, within: float, cfl: float | None) -> str:
    """The advice for a step `step` that should have been below `within`: time.dt below it; under time.cfl (its
    value `cfl`), which set the step from max|v| at the save interval's start while max|v| may have grown since,
    time.cfl smaller by their ratio."""
    if key == "time.dt":
        return f"take time.dt below {within:.3g}"
    return f"time.cfl sets dt from max|v| at each save: take time.cfl below {cfl * within / step:.3g}"


def shared_layout(layouts: list) -> Layout:
    """The layout of members run on one layered transport: their heads, feed-forward and layers must agree (the
    trained groups and their weights are each member's own)."""
    first = layouts[0]
    for layout in layouts[1:]:
        if (layout.dim, layout.heads, layout.hidden, layout.activation, layout.layers) != (
                first.dim, first.heads, first.hidden, first.activation, first.layers):
            raise ValueError("ForwardProblem: members beyond the seeds' model must share their heads, feed-forward "
                             "and layers")
    return first


def head_models(layout: Layout, theta: torch.Tensor, eps: float) -> list:
    """The Model of every head on every layer of theta (L, p) (head 0 on layer 0 first), its W the layer's linear
    feed-forward (zero for a two-layer one): what the resolution check and the one-head diagnostics read."""
    parts = layout.unpack(theta)
    models = []
    for layer in range(theta.shape[0]):
        W = parts["W"][layer] if layout.hidden == 0 else torch.zeros_like(parts["B"][layer, 0])
        models += [Model(head.kernel, head.beta, parts["B"][layer, h], parts["V"][layer, h], W, eps)
                   for h, head in enumerate(layout.heads)]
    return models


def resolution_entries(layout: Layout, models: list) -> list:
    """(model, the case key of its beta, where it sits) of head_models' list, for check_resolutions: head h of
    layer l at l H + h, head 0 the [model] table's, the others extra_heads."""
    heads = len(layout.heads)
    # head h's own keys: its B, not head 0's, is the one whose layer the phrase names
    tables = ["model."] + [f"model.extra_heads[{h - 1}]." for h in range(1, heads)]
    return [(model, f"{tables[k % heads]}beta", f" with layer {k // heads + 1}'s {tables[k % heads]}B" if layout.layered
             else "") for k, model in enumerate(models)]


def check_dimension(case) -> None:
    """The Eulerian solver's spheres: S^1 and S^2 (a CaseError naming sphere.dim else)."""
    if case.dim not in (2, 3):
        raise CaseError(f"sphere.dim: the Eulerian solver handles d = 2 or 3, got {case.dim}; "
                        "use solver.method = 'particles'")


def check_kernel_resolution(case) -> None:
    """ForwardProblem's refusal of a grid too coarse for the kernels of a member (every head on every layer), from
    its case alone, no grid built: a sweep checks every member so before any runs (its sphere first).  Particle
    runs have no grid."""
    if case["solver"]["method"] == "particles":
        return
    check_dimension(case)
    lmax = case["sphere"]["lmax"]
    # what check_resolutions reads of a basis: its sphere, lmax and the degree its grid integrates exactly
    grid = SimpleNamespace(dim=case.dim, lmax=lmax, quadrature_degree=basis_class(case.dim).quadrature_degree)
    check_resolutions(kernel_entries(case), grid, case["solver"]["kernel_tol"])


def _entries(value, key: str):
    """(key, largest |entry|) of every matrix or vector of a [model] value: numbers in nested lists, head tables."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _entries(item, f"{key}.{name}")
    elif isinstance(value, (list, tuple)) and value and all(isinstance(item, dict) for item in value):
        for index, item in enumerate(value):
            yield from _entries(item, f"{key}[{index}]")
    elif isinstance(value, (list, tuple)):
        numbers = np.abs(np.asarray(value, dtype=np.float64)).ravel()
        if numbers.size:
            yield key, float(numbers.max())


def check_parameter_range(case) -> None:
    """A CaseError naming the [model] key (B, V, W, the feed-forward's W1, b, W2, a head's B or V) with an entry
    beyond the largest number of the run's dtype: stored in float32, 1e39 became inf, and the run ended in a
    traceback (V: the eigenvalues of V B^T) or a NaN at the first step (W, exit 3) where float64 ran it."""
    dtype = case["solver"]["dtype"]
    largest = torch.finfo(getattr(torch, dtype)).max
    for name, value in case["model"].items():
        if isinstance(value, bool) or not isinstance(value, (list, tuple, dict)):
            continue
        for key, biggest in _entries(value, f"model.{name}"):
            if biggest > largest:
                raise CaseError(f"{key}: an entry of {biggest:.3g} is beyond {dtype}'s largest number {largest:.3g}; "
                                "scale it down or take solver.dtype = \"float64\"")


def check_kernel_range(case) -> None:
    """A CaseError where a head's kernel cannot be formed in the run's dtype (inf 0 = NaN at the first step, for the
    densities and the particles alike: a "both" run is refused before either half runs): the
    softmax's where its coupling beta B overflows, where any smaller beta is taken as it is (the shifted sums tend to
    the hardmax of beta = inf: 4e-16 from it at beta = 1e300 in float64); the unnormalized kernel's, which no shift
    bounds, where exp(beta <B^T x, y>) reaches exp(beta |B|_2) beyond the dtype's largest number (beta |B|_2 >
    709.8 in float64, 88.7 in float32).  The model's entries are checked against that number first
    (`check_parameter_range`).  An Eulerian training of the seeds' model with control.gradient = "continuous" is
    held to the unnormalized kernel's bound with the softmax kernel too: its adjoint (solvers.adjoint.AdjointOperator)
    applies the softmax's scalings exp(-beta |B^T y|) and exp(beta |B x|) apart, so beyond it dJ/dW is NaN where the
    forward run and the discrete gradient are finite (bad input: a smaller time.dt cannot mend it)."""
    dtype = case["solver"]["dtype"]
    largest = torch.finfo(getattr(torch, dtype)).max
    check_parameter_range(case)
    continuous = (case["solver"]["method"] == "eulerian" and case["control"].get("gradient") == "continuous"
                  and layout_of(case).seeds_model)
    for model, name, where in kernel_entries(case):
        head = name.rsplit(".", 1)[0]  # "model" or "model.extra_heads[h]": the table of the head's beta and B
        norm = float(torch.linalg.matrix_norm(model.B, ord=2))  # beta <B^T x, y> reaches beta |B|_2
        if not math.isfinite(model.beta):
            continue
        if model.beta * max(1.0, norm) > largest:
            raise CaseError(f"{name}: beta = {model.beta:.3g} times |B| = {norm:.3g}{where} overflows {dtype} (largest "
                            f"{largest:.3g}); lower {head}.beta or {head}.B, or use beta = \"inf\", the limit of large "
                            "beta")
        if model.kernel == "unnormalized" and model.beta * norm > math.log(largest):
            raise CaseError(f"{name}: the unnormalized kernel exp(beta <B^T x, y>) reaches "
                            f"exp({model.beta * norm:.4g}) (beta = {model.beta:.3g} times |B| = {norm:.3g}{where}), "
                            f"beyond {dtype}'s largest number exp({math.log(largest):.4g}); lower {head}.beta or "
                            f"{head}.B, or take the softmax kernel")
        if continuous and model.kernel == "softmax" and model.beta * norm > math.log(largest):
            in_float64 = model.beta * norm <= math.log(torch.finfo(torch.float64).max)
            wider = " or solver.dtype = 'float64'" if in_float64 else ""
            raise CaseError(f"control.gradient: the continuous adjoint of the softmax kernel scales its transform by "
                            f"exp(beta |B|_2) = exp({model.beta * norm:.4g}), beyond {dtype}'s largest number "
                            f"exp({math.log(largest):.4g}); take control.gradient = 'discrete' (the exact gradient of "
                            f"the discretised J, no such limit){wider}")


def check_solver_choices(case, device_type: str | None) -> None:
    """ForwardProblem's refusals of a member's solver choices, from its case alone (a sweep checks every member so
    before any runs): shtns off the CPU or in float32, the spectral field beyond the seeds' model.  device_type:
    the run's device ("cpu", "cuda"), None where not known here (a remote cluster's "auto")."""
    solver = case["solver"]
    if solver["backend"] == "shtns" and (solver["dtype"] != "float64" or device_type not in ("cpu", None)):
        raise CaseError("solver.backend: 'shtns' runs on the CPU in float64 only")
    if solver["field"] == "spectral" and not layout_of(case).seeds_model:
        raise CaseError("solver.field: 'spectral' is available for the seeds' model only (one head, a linear W, B "
                        "and V constant and not trained); beyond it the attention is computed dense: use 'dense' "
                        "or 'auto'")


def kernel_entries(case) -> list:
    """(model, the case key of its beta, where it sits) of every head on every layer of a case, in float64 on the
    CPU (`resolution_entries`): what the checks of its kernels read."""
    host, layout = make_placement("cpu", "float64"), layout_of(case)
    if layout.seeds_model:
        return [(Model.from_case(case, host), "model.beta", "")]
    return resolution_entries(layout, head_models(layout, parameters_of(case, layout, host),
                                                  float(case["model"]["eps"])))


def spectral_filter(basis, order: int) -> torch.Tensor | None:
    """Exponential filter exp(-36 (l / lmax)^order) (None when order = 0) on the real view (N,) of the
    coefficients: damps only the top modes."""
    if order == 0:
        return None
    return real_diagonal(torch.exp(-36.0 * (basis.degree / basis.lmax).to(basis.placement.real) ** order))
