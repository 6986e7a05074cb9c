"""The keys of a case file: one declaration per key, with its check and its default (docs/design.md "Case files").

Schema (d = ``sphere.dim``; "required" keys have no default; "absent" means the key is
left out of the resolved data when not given):

=========================  ==========================================  =========================
key                        type and check                              default
=========================  ==========================================  =========================
case.name                  non-blank string of at most 210 bytes       file stem (leading dots
                           without "/", the OS's path separators or    dropped, separators made
                           NUL, not starting with "." nor starting or  "_", cut to 210 bytes),
                           ending with white space: it names the       else "case"
                           default output files
case.description           string                                      ""
sphere.dim                 int in [2, 2048) (the Eulerian solver       required
                           takes 2, 3; the d x d matrices of the
                           resolved case go into every output file)
sphere.lmax                int in [2, 32768)                           32
model.kernel               "softmax" | "unnormalized"                  "softmax"
model.beta                 real >= 0, or "inf"/inf (softmax only)      1.0
model.B, model.V           d x d real matrix, or a list of L of them   identity
                           (one per layer: piecewise constant over
                           depth like W_t); B nonzero at beta = inf
                           (m = B^T x / |B^T x|; a singular B is
                           allowed: 0/0 only on the null set where
                           B^T x = 0, where m is taken as 0)
model.feed_forward         "linear" (W x) | "mlp" (W2 sigma(W1 x +     absent = "linear"
                           b), docs/model.md "Beyond the seeds")
model.W                    d x d real matrix, or a list of L of them;  zeros
                           linear feed-forward only
model.hidden               mlp: int in [1, 65536), the hidden width n  16
model.activation           mlp: sigma, "tanh" | "relu" | "gelu" |      "tanh"
                           "sigmoid" | "softplus"
model.ffn_seed             mlp: int in [0, 2**63), seed of W1's        0
                           default
model.W1                   mlp: n x d real matrix, or a list of L      N(0, 1/d) entries drawn
                                                                       from ffn_seed (numpy's
                                                                       default_rng), stored
model.b                    mlp: length-n real vector, or a list of L   zeros
model.W2                   mlp: d x n real matrix, or a list of L      zeros
model.extra_heads          nonempty list of tables {kernel, beta, B,   absent (one head)
                           V}: heads 1, 2, ... beside head 0 (kernel,
                           beta, B, V above), v = P_x(f(x) + sum_h
                           V_h m_h); each key defaults to head 0's
                           kernel and beta, identity B and V
model.eps                  real >= 0, with eps lmax (lmax + 1) h <=    0.0
                           1e15 for the longest step h = min(t_end,
                           save_every, time.dt) (a cap far beyond
                           resolved runs; up to it a step's rounding
                           stays at the dtype's, float32's included)
initial.kind               "uniform" | "vmf" | "vmf_mixture" |         "uniform"
                           "projected_gaussian" | "file"
initial.mean               vmf: nonzero length-d vector, made unit;    required
                           projected_gaussian: length-d vector m (any,
                           kept as given), X ~ N(m, S), x = X / |X|
initial.covariance         projected_gaussian: S, a d x d symmetric    required
                           positive definite matrix, or a real s > 0
                           for S = s I (resolved to the matrix)
initial.kappa              vmf: real >= 0                              required
initial.means              vmf_mixture: list of nonzero length-d       required
                           vectors, each made unit
initial.kappas             vmf_mixture: list of reals >= 0             required
initial.weights            vmf_mixture: reals >= 0, positive sum,      equal weights
                           normalised to sum 1
initial.path               file: readable file, made absolute          required
                           (relative to the case file's directory)
initial.time               file: int index into its time axis          -1
initial.sha256             file: the SHA-256 of the file's bytes (64   the file's
                           hex digits); a run refuses a file that no   digest
                           longer matches, so an output's stored case
                           pins the density it started from
time.t_end                 real > 0                                    required
time.dt                    real > 0 (not together with time.cfl; a     absent
                           --set of one replaces the other), at most
                           1e12 steps per save interval; the explicit
                           transport is stable while lmax max|v| dt
                           <= 4.00 (imex-ark436), 2.83 (rk4,
                           lawson-rk4), 1.57 (imex-ars443)
time.cfl                   real > 0 (not together with time.dt):       0.5 when dt is absent
                           dt = cfl / (lmax max|v|) at the start of
                           each interval between knots (saves, layers);
                           rk4: cfl / (lmax max|v| + max|eps lam|);
                           IMEX: cfl / (lmax max(max|v|, eps)) (the
                           implicit diffusion is accurate to degrees
                           l <~ sqrt(lmax / cfl))
time.save_every            real > 0, at most 1e6 saves up to t_end     t_end / 20
time.scheme                "auto" | "imex-ark436" | "imex-ars443"  "auto": imex-ark436 when
                           | "rk4" | "lawson-rk4" (rk4 is explicit     eps > 0, else rk4
                           in the diffusion too: stable for
                           dt eps lmax (lmax + 1) <= 2.78)
time.max_steps             int >= 1 (safety limit on the step count)   absent (no limit)
solver.method              "eulerian" | "particles" | "both"           "eulerian"
solver.field               "auto" | "dense" | "spectral"               "auto"
solver.backend             "auto" | "torch" | "shtns" (S^2 only:       "auto"
                           sphere.dim = 3; on the CPU in float64)
solver.device              "auto" | "cpu" | "cuda"                     "auto"
solver.dtype               "float64" | "float32"                       "float64"
solver.chunk               "auto" | int >= 1: rows per block of dense  "auto": a 1 MiB block on
                           attention                                   the CPU; on CUDA 4096 rows,
                                                                       at most 1 GiB
solver.threads             "auto" | int in [1, 4096): CPU threads of   absent = "auto": 1 up to
                           torch during the run                        lmax 128 and 2e4 particles,
                           (spherepde/base/threads.py)                 else torch's default
solver.filter_order        int >= 0: exponential spectral filter       0 (no filter)
                           order
solver.kernel_tol          real in (0, 1): truncation tolerance of     1e-10
                           the kernel resolution rule
particles.n                int in [2, 2**32) (more do not fit one      1000
                           device: 2**32 x d states of 32 GiB+ each)
particles.seed             int in [0, 2**63) (torch and numpy take     0
                           < 2**64; stored as a 64-bit attribute)
particles.integrator       "euler" | "rk4" | "heun"                    "heun"
particles.save             int in [0, particles.n]: particles saved    min(n, 1000)
particles.beta_inf_mode    "mean_field" | "hardmax"                    "mean_field"
particles.dt               real > 0: particle time step                absent: time.dt, else the
                                                                       CFL rule of time.cfl
particles.replicas         int >= 1 dividing particles.n, n / replicas 1
                           >= 2: independent systems of n / replicas
                           tokens (standard errors by batch means)
diagnostics.lyapunov_p     list of distinct reals > 0 (a coordinate)   [0.25]
diagnostics.tail_tol       real > 0                                    1e-06
diagnostics.w2             bool: w2_projection at every save. Cost,    true
                           particles on S^1: the circular
                           rearrangement with its dual certificate,
                           about n log n (3e4 tokens, 10 replicas: 1 s
                           a save); where not certified (mass moved by
                           ~1 rad) beyond the quantisation bound, and
                           on S^2, POT's exact OT of <= w2_atoms atoms
                           (1000: 0.3 s a save; false skips it)
diagnostics.w2_atoms       int in [1, 10000): atoms above which a      1000
                           measure is quantised before exact W2
                           (its cost matrix atoms^2 float64; error bound
                           stored as w2_quantisation_bound, with
                           the grid's: twice its cells' radius)
control                    optional: absent means no training, {}      {} (empty)
control.loss               "align" | "bow" (spherepde.model.losses.LOSSES)   "align"
control.target             nonzero length-d vector, made unit: align   e_2 = [0, 1, 0...]
                           target / bow vMF mean direction
control.train              list of distinct groups among "W" (the      absent = ["W"]
                           feed-forward: W, or W1, b, W2), "B", "V"
                           (every head's)
control.lambda_reg         real >= 0: L2 weight of int |theta_t|^2 dt  0.01
                           for every trained group; or a table {W =
                           .., B = .., V = ..} naming each group of
                           control.train
control.layers             int in [1, 2**20): the controls piecewise   the common length of the
                           constant on equal slices of [0, t_end]      model's per-layer lists,
                           (the slice ends are step knots, like the    else 8
                           saves, so each slice takes at least one
                           step: layers > t_end / dt makes the steps
                           t_end / layers, layers of them a run); every
                           per-layer list of [model] has this length
control.optimizer          "adam" | "gd" | "lbfgs" (solvers/training)  "adam"
control.iterations         int >= 0 (0: the forward run of model.W)    100
control.learning_rate      real > 0 (adam, gd; lbfgs notes another     0.05
                           value unused)
control.tol                real >= 0: stop when |J_k - J_{k-1}| <=     0 (never)
                           tol |J_k| or |dJ/dW| <= tol (lbfgs:
                           scipy's ftol and gtol: relative to
                           max(|J|, 1), the largest entry of dJ/dW)
control.gradient           "discrete" (exact gradient of the           "discrete"
                           discretised J) | "continuous" (the adjoint
                           PDE discretised on its own); Eulerian only
control.checkpoint_every   int >= 0: forward steps between stored      0: ceil(sqrt(steps))
                           states of the adjoint's recomputation;
                           Eulerian only
control.save_adjoint       bool: also write phi_t, the adjoint at the    false
                           trained W, at the steps nearest the saves
                           (variable `phi`, coordinate adjoint_time;
                           one more gradient evaluation); Eulerian only
control.noise              "common" (every evaluation of J sees the    "common"
                           same x_0 and Brownian path) | "fresh" (new
                           ones per evaluation: stochastic gradients;
                           not with lbfgs or tol > 0); particles only
control.kappa_cand         bow: real >= 0, vMF concentration of the    2.0
                           candidates
control.tau                bow: real > 0, the softmax's inverse        1.0
                           temperature: scores tau <x, c_k>
control.K                  bow: int in [2, 2**20), number of           16
                           candidates (scores: atoms x K; one
                           candidate has probability 1 whatever mu)
control.seed               bow: int in [0, 2**63), seed of the         0
                           candidates
=========================  ==========================================  =========================

A ``[control]`` section with at least one key makes the run a training run (``spherepde run``
trains W and writes the trained forward run; an empty ``[control]``, as every plain run's stored
case has, trains nothing: give e.g. ``loss = "align"`` to train with the defaults); it needs
``time.dt`` (one fixed step grid shared by the forward and adjoint runs).  ``solver.method = "eulerian"``
trains the density (solvers.training),
``"particles"`` the particle system by autograd (solvers.particle_training; the keys marked
"Eulerian only" are then errors); ``"both"`` is refused (train each separately).

Types are strict: a bool is never a number, a real (even 64.0) is never an integer,
a string is never a number (except ``beta = "inf"``), every real is finite (except
``beta``), and every integer fits in 64 bits, [-2**63, 2**63) (TOML's integers; torch
sizes and NetCDF attributes take no more). Keys of ``[initial]`` that do not belong to
``initial.kind`` are errors.
A unit vector or a weight list already normalised to within 1e-12 is kept as given,
so the resolved case is a fixed point of resolution (the round trip is exact).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spherepde.discretisation.transforms.legendre import LMAX_LIMIT
from spherepde.io.case_files import initial_file_digest, pinned_digest, readable_file, time_index
from spherepde.io.case_rules import control_rules, initial_rules, model_rules, particles_rules, time_rules
from spherepde.io.case_values import (
    NONNEGATIVE,
    POSITIVE,
    SEED,
    Context,
    Interval,
    auto_or_count,
    auto_or_threads,
    backend,
    beta,
    boolean,
    case_name,
    choice,
    covariance,
    default_case_name,
    direction,
    directions,
    distinct,
    equal_weights,
    first_weights,
    head_tables,
    hidden_bias,
    identity,
    initial_mean,
    integer,
    layered_lengths,
    layered_matrix,
    real,
    reals,
    regularisation,
    second_weights,
    seeded_first_weights,
    text,
    trained_groups,
    weights,
    zero_bias,
    zero_second_weights,
    zeros,
)

# Atoms of a measure handed whole to POT's exact solver are fewer than this (diagnostics.w2_atoms, compare --atoms):
# its cost matrix holds atoms^2 float64, 800 MB at 1e4, and a larger one would end in an allocation failure.
ATOMS_BELOW = 10_000
REQUIRED = object()  # no default: the key must be given
ABSENT = object()  # a default meaning "leave the key out of the resolved data"


def _always_used(ctx) -> None:
    return None


def _selected_by(section: str, key: str):
    """Marks an `unused` rule as decided by the value of section.key, its selector: an override of the selector drops
    the keys of the case that its new value does not use (spherepde.io.case._replaced_by_override)."""
    def mark(unused):
        unused.selector = (section, key)
        return unused
    return mark


def _only_for(section: str, key: str, *values: str):
    """Keys that belong to some values of another key of their section only (initial.kind, control.loss): a
    reason when they do not apply."""
    @_selected_by(section, key)
    def unused(ctx) -> str | None:
        value = ctx.section[key]
        if value not in values:
            return f"not used when {section}.{key} = {value!r} (it belongs to {key} {' / '.join(map(repr, values))})"
        return None
    return unused


@dataclass(frozen=True)
class _Key:
    """One key: how to parse it, its default (an immutable value, a function of the context,
    REQUIRED or ABSENT), and when it does not apply; `default_passes`: where it does not apply, its default
    value is let through instead of refused (the keys of one solver.method, which a stored case writes: it then
    reruns with the other)."""

    name: str
    parse: Callable[[Any, Context], Any]
    default: Any = REQUIRED
    unused: Callable[[Context], str | None] = _always_used
    default_passes: bool = False


@dataclass(frozen=True)
class Section:
    """One [section]: its keys in resolution order and cross-key rules.

    An ``optional`` section resolves to {} when the case does not give it or gives it empty (no defaults filled
    in): the resolved text of every plain run holds an empty [control], which must stay a plain run.
    """

    name: str
    keys: tuple[_Key, ...] = ()
    rules: Callable[[dict, Context], None] | None = None
    optional: bool = False


def _loss_names(value, ctx) -> str:
    from spherepde.model.losses import LOSSES  # the registry is the list of choices

    return choice(*LOSSES)(value, ctx)


def _activation_names(value, ctx) -> str:
    from spherepde.model.parameters import ACTIVATIONS  # the registry is the list of choices

    return choice(*ACTIVATIONS)(value, ctx)


@_selected_by("model", "feed_forward")
def _mlp_only(ctx) -> str | None:
    """Keys of the two-layer feed-forward: a reason when model.feed_forward is linear."""
    if ctx.section.get("feed_forward", "linear") != "mlp":
        return "not used when model.feed_forward = 'linear' (it belongs to feed_forward = 'mlp')"
    return None


@_selected_by("model", "feed_forward")
def _linear_only(ctx) -> str | None:
    if ctx.section.get("feed_forward", "linear") == "mlp":
        return "not used when model.feed_forward = 'mlp' (W2 sigma(W1 x + b) replaces W x)"
    return None


def _model_layers(ctx) -> int:
    """control.layers' default: the common length of the model's per-layer lists, else 8."""
    lengths = layered_lengths(ctx.data["model"])
    return next(iter(lengths.values())) if lengths else 8


def _second_axis(ctx) -> list[float]:
    return [float(i == 1) for i in range(ctx.dim)]


@_selected_by("solver", "method")
def _eulerian_training_only(ctx) -> str | None:
    """Keys of [control] that only the Eulerian training reads: a reason when training particles."""
    if ctx.data["solver"]["method"] == "particles":
        return "not used when solver.method = 'particles' (it belongs to the Eulerian adjoint)"
    return None


@_selected_by("solver", "method")
def _particle_training_only(ctx) -> str | None:
    """Keys of [control] that only the particle training reads: a reason when training the Eulerian solver."""
    if ctx.data["solver"]["method"] != "particles":
        return "not used when solver.method is not 'particles' (it sets the particles' noise)"
    return None


SCHEMA = (
    Section("case", (
        _Key("name", case_name, default_case_name),
        _Key("description", text, ""),
    )),
    Section("sphere", (
        _Key("dim", integer(Interval(2, high=2 ** 11))),
        _Key("lmax", integer(Interval(2, high=LMAX_LIMIT)), 32),
    )),
    Section("model", (
        _Key("kernel", choice("softmax", "unnormalized"), "softmax"),
        _Key("beta", beta, 1.0),
        _Key("B", layered_matrix, identity),
        _Key("V", layered_matrix, identity),
        _Key("feed_forward", choice("linear", "mlp"), ABSENT),
        _Key("W", layered_matrix, zeros, unused=_linear_only),
        _Key("hidden", integer(Interval(1, high=2 ** 16)), 16, unused=_mlp_only),
        _Key("activation", _activation_names, "tanh", unused=_mlp_only),
        _Key("ffn_seed", integer(SEED), 0, unused=_mlp_only),
        _Key("W1", first_weights, seeded_first_weights, unused=_mlp_only),
        _Key("b", hidden_bias, zero_bias, unused=_mlp_only),
        _Key("W2", second_weights, zero_second_weights, unused=_mlp_only),
        _Key("extra_heads", head_tables, ABSENT),
        _Key("eps", real(NONNEGATIVE), 0.0),
    ), model_rules),
    Section("initial", (
        _Key("kind", choice("uniform", "vmf", "vmf_mixture", "projected_gaussian", "file"), "uniform"),
        _Key("mean", initial_mean, unused=_only_for("initial", "kind", "vmf", "projected_gaussian")),
        _Key("covariance", covariance, unused=_only_for("initial", "kind", "projected_gaussian")),
        _Key("kappa", real(NONNEGATIVE), unused=_only_for("initial", "kind", "vmf")),
        _Key("means", directions, unused=_only_for("initial", "kind", "vmf_mixture")),
        _Key("kappas", reals(NONNEGATIVE), unused=_only_for("initial", "kind", "vmf_mixture")),
        _Key("weights", weights, equal_weights, unused=_only_for("initial", "kind", "vmf_mixture")),
        _Key("path", readable_file, unused=_only_for("initial", "kind", "file")),
        _Key("time", time_index, -1, unused=_only_for("initial", "kind", "file")),
        _Key("sha256", pinned_digest, initial_file_digest, unused=_only_for("initial", "kind", "file")),
    ), initial_rules),
    Section("time", (
        _Key("t_end", real(POSITIVE)),
        _Key("dt", real(POSITIVE), ABSENT),
        _Key("cfl", real(POSITIVE), lambda ctx: ABSENT if "dt" in ctx.section else 0.5),
        _Key("save_every", real(POSITIVE), lambda ctx: ctx.section["t_end"] / 20),
        _Key("scheme", choice("auto", "imex-ark436", "imex-ars443", "rk4", "lawson-rk4"), "auto"),
        _Key("max_steps", integer(Interval(1)), ABSENT),
    ), time_rules),
    Section("solver", (
        _Key("method", choice("eulerian", "particles", "both"), "eulerian"),
        _Key("field", choice("auto", "dense", "spectral"), "auto"),
        _Key("backend", backend, "auto"),
        _Key("device", choice("auto", "cpu", "cuda"), "auto"),
        _Key("dtype", choice("float64", "float32"), "float64"),
        _Key("chunk", auto_or_count, "auto"),
        _Key("threads", auto_or_threads, ABSENT),  # absent: "auto" (so the resolved text of earlier cases stays)
        _Key("filter_order", integer(NONNEGATIVE), 0),
        _Key("kernel_tol", real(Interval(0, strict=True, high=1)), 1e-10),
    )),
    Section("particles", (
        _Key("n", integer(Interval(2, high=2 ** 32)), 1000),
        _Key("seed", integer(SEED), 0),
        _Key("integrator", choice("euler", "rk4", "heun"), "heun"),
        _Key("save", integer(NONNEGATIVE), lambda ctx: min(ctx.section["n"], 1000)),
        _Key("beta_inf_mode", choice("mean_field", "hardmax"), "mean_field"),
        _Key("dt", real(POSITIVE), ABSENT),
        _Key("replicas", integer(Interval(1)), 1),
    ), particles_rules),
    Section("diagnostics", (
        _Key("lyapunov_p", distinct(reals(POSITIVE)), lambda ctx: [0.25]),
        _Key("tail_tol", real(POSITIVE), 1e-6),
        _Key("w2", boolean, True),
        _Key("w2_atoms", integer(Interval(1, high=ATOMS_BELOW)), 1000),
    )),
    Section("control", (
        _Key("loss", _loss_names, "align"),
        _Key("target", direction, _second_axis),
        _Key("train", trained_groups, ABSENT),
        _Key("lambda_reg", regularisation, 0.01),
        _Key("layers", integer(Interval(1, high=2 ** 20)), _model_layers),
        _Key("optimizer", choice("adam", "gd", "lbfgs"), "adam"),
        _Key("iterations", integer(NONNEGATIVE), 100),
        _Key("learning_rate", real(POSITIVE), 0.05),
        _Key("tol", real(NONNEGATIVE), 0.0),
        _Key("gradient", choice("discrete", "continuous"), "discrete", unused=_eulerian_training_only,
             default_passes=True),
        _Key("checkpoint_every", integer(NONNEGATIVE), 0, unused=_eulerian_training_only, default_passes=True),
        _Key("save_adjoint", boolean, False, unused=_eulerian_training_only, default_passes=True),
        _Key("noise", choice("common", "fresh"), "common", unused=_particle_training_only, default_passes=True),
        _Key("kappa_cand", real(NONNEGATIVE), 2.0, unused=_only_for("control", "loss", "bow")),
        _Key("tau", real(POSITIVE), 1.0, unused=_only_for("control", "loss", "bow")),
        _Key("K", integer(Interval(2, high=2 ** 20)), 16, unused=_only_for("control", "loss", "bow")),
        _Key("seed", integer(SEED), 0, unused=_only_for("control", "loss", "bow")),
    ), control_rules, optional=True),
)


def default_of(section: str, key: str):
    """The default of section.key where it is a value (not a function of the case, REQUIRED or ABSENT)."""
    default = next(entry.default for part in SCHEMA if part.name == section for entry in part.keys if entry.name == key)
    if callable(default) or default is REQUIRED or default is ABSENT:
        raise ValueError(f"{section}.{key} has no plain default")
    return default
