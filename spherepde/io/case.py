"""Case files: TOML text -> a validated, fully resolved :class:`Case` (docs/design.md "Case files").

A case is resolved once, here: every section and key is present in ``Case.data``, every
default filled in, every value normalised (ints to floats where a real is expected,
``beta = "inf"`` to ``math.inf``, unit mean directions, weights summing to 1, absolute
file paths). Everything downstream reads ``case["section"]["key"]`` and never re-checks.
``Case.text`` serialises the resolved case back to TOML, and reloading it gives the same
data exactly (floats are written with ``repr``, so they round-trip bit for bit).

Every problem raises :class:`~spherepde.base.errors.CaseError` with one line naming the key,
prefixed by the case file (or the ``origin`` given for text).

Schema (d = ``sphere.dim``; "required" keys have no default; "absent" means the key is
left out of the resolved data when not given):

=========================  ==========================================  =========================
key                        type and check                              default
=========================  ==========================================  =========================
case.name                  non-blank string of at most 210 bytes       file stem (leading dots
                           without "/", the OS's path separators or    dropped, separators made
                           NUL, not starting with ".": it names the    "_", cut to 210 bytes),
                           default output files                        else "case"
case.description           string                                      ""
sphere.dim                 int in [2, 2048) (the Eulerian solver       required
                           takes 2, 3; the d x d matrices of the
                           resolved case go into every output file)
sphere.lmax                int in [2, 32768)                           32
model.kernel               "softmax" | "unnormalized"                  "softmax"
model.beta                 real >= 0, or "inf"/inf (softmax only)      1.0
model.B, model.V           d x d real matrix; B nonzero at beta = inf  identity
                           (m = B^T x / |B^T x|; a singular B is
                           allowed: 0/0 only on the null set where
                           B^T x = 0, where m is taken as 0)
model.W                    d x d real matrix                           zeros
model.eps                  real >= 0, with eps lmax (lmax + 1) h <=    0.0
                           1e15 for the longest step h = min(t_end,
                           save_every, time.dt): stiffer diffusion
                           steps lose every digit (imex-ark436 grows
                           rounding errors from ~1e17 in float32)
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
time.dt                    real > 0 (not together with time.cfl), at   absent
                           most 1e12 steps per save interval
time.cfl                   real > 0 (not together with time.dt)        0.5 when dt is absent
time.save_every            real > 0, at most 1e6 saves up to t_end     t_end / 20
time.scheme                "auto" | "imex-ark436" | "imex-ars443"  "auto": imex-ark436 when
                           | "rk4" | "lawson-rk4" (rk4 is explicit     eps > 0, else rk4
                           in the diffusion too: stable for
                           dt eps lmax (lmax + 1) <= 2.78)
time.max_steps             int >= 1 (safety limit on the step count)   absent (no limit)
solver.method              "eulerian" | "particles" | "both"           "eulerian"
solver.field               "auto" | "dense" | "spectral"               "auto"
solver.backend             "auto" | "torch" | "shtns" (S^2 only:       "auto"
                           sphere.dim = 3)
solver.device              "auto" | "cpu" | "cuda"                     "auto"
solver.dtype               "float64" | "float32"                       "float64"
solver.chunk               "auto" | int >= 1: rows per block of dense  "auto": a 1 MiB block on
                           attention                                   the CPU; on CUDA 4096 rows,
                                                                       at most 1 GiB
solver.threads             "auto" | int >= 1: CPU threads of torch     absent = "auto": 1 up to
                           during the run (spherepde/base/threads.py)       lmax 128 and 2e4 particles,
                                                                       else torch's default
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
                           O(n log n) + n^2 distances (n = 1e4: 0.5 s
                           a save, 1.7x the run without it); where not
                           certified (mass moved by ~1 rad) and on
                           S^2, POT's exact OT of <= w2_atoms atoms
                           (1000: seconds a save; false skips it)
diagnostics.w2_atoms       int >= 1: atoms above which a measure is    1000
                           quantised before exact W2 (error bound
                           stored as w2_quantisation_bound, with
                           the grid's: twice its cells' radius)
control                    optional: absent means no training, {}      {} (empty)
control.loss               "align" | "bow" (spherepde.model.losses.LOSSES)   "align"
control.target             nonzero length-d vector, made unit: align   e_2 = [0, 1, 0...]
                           target / bow vMF mean direction
control.lambda_reg         real >= 0: L2 weight of int |W_t|_F^2 dt    0.01
control.layers             int in [1, 2**20): W_t piecewise constant   8
                           on equal slices of [0, time.t_end] (the
                           slice ends are step knots, like the saves)
control.optimizer          "adam" | "gd" | "lbfgs" (solvers/training)  "adam"
control.iterations         int >= 0 (0: the forward run of model.W)    100
control.learning_rate      real > 0                                    0.05
control.tol                real >= 0: stop when |J_k - J_{k-1}| <=     0 (never)
                           tol |J_k| or |dJ/dW| <= tol (lbfgs:
                           scipy's ftol and gtol)
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
control.tau                bow: real > 0, softmax temperature          1.0
control.K                  bow: int in [2, 2**20), number of           16
                           candidates (scores: atoms x K; one
                           candidate has probability 1 whatever mu)
control.seed               bow: int in [0, 2**63), seed of the         0
                           candidates
=========================  ==========================================  =========================

A ``[control]`` section with at least one key makes the run a training run (``spherepde run``
trains W and writes the trained forward run; an empty ``[control]``, as every plain run's stored
case has, trains nothing: give e.g. ``loss = "align"`` to train with the defaults); it needs
``time.dt`` (one fixed step grid shared by the forward and adjoint runs).  ``solver.method = "eulerian"`` trains the density (solvers.training),
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

import copy
import datetime
import difflib
import hashlib
import math
import numbers
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import xarray as xr

from spherepde.base.errors import CaseError

__all__ = ["Case", "load_case", "load_case_text", "case_from_dict", "parse_override", "format_override"]


# ---------------------------------------------------------------------------------------
# The Case object and the loaders
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Inputs:
    """What a case was resolved from, so that overrides can re-resolve it."""

    table: dict  # the user's table with overrides applied, before resolution
    base_dir: Path  # where relative file paths start from
    default_name: str  # case.name when the table has none


@dataclass(frozen=True)
class Case:
    """One run, validated and fully resolved. Build it with the loaders of this module."""

    data: dict
    source: str  # the user's TOML text before overrides ("" when built from a dict)
    origin: str  # the file (or label) the case came from; prefixes error messages
    inputs: _Inputs = field(repr=False, compare=False)

    @property
    def text(self) -> str:
        """The resolved case as TOML; ``load_case_text(case.text).data == case.data``."""
        return _dumps(self.data)

    @property
    def dim(self) -> int:
        return self.data["sphere"]["dim"]

    @property
    def name(self) -> str:
        return self.data["case"]["name"]

    def __getitem__(self, section: str) -> dict:
        return self.data[section]

    def with_overrides(self, overrides: Iterable[str]) -> Case:
        """A new validated case with "section.key=value" overrides applied on top of this one."""
        return _build(self.inputs.table, overrides, self.source, self.origin,
                      self.inputs.base_dir, self.inputs.default_name)


def load_case(path: str | os.PathLike, overrides: Iterable[str] = ()) -> Case:
    """Read a case file; relative ``initial.path`` values start from the file's directory."""
    path = Path(path)
    try:
        text = _read_case_file(path).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CaseError(f"cannot read case file {str(path)!r}: not UTF-8 text "
                        f"({error.reason} at byte {error.start})") from None
    return _load_text(text, overrides, str(path), path.parent, path.stem)


MAX_CASE_BYTES = 16 << 20  # three d x d matrices at full precision up to d ~ 500; a larger file is no case file


def _read_case_file(path: Path) -> bytes:
    """The bytes of a case file: a regular file (a device such as /dev/zero, a pipe or a folder would be read
    without end or not at all) of at most MAX_CASE_BYTES; a one-line CaseError otherwise."""
    try:
        problem = _regular_file_problem(path, MAX_CASE_BYTES)
        if problem is None:
            with open(path, "rb") as stream:
                data = stream.read(MAX_CASE_BYTES + 1)
            if len(data) > MAX_CASE_BYTES:  # it grew since
                problem = f"is larger than {MAX_CASE_BYTES >> 20} MiB"
    except OSError as error:
        raise CaseError(f"cannot read case file {str(path)!r}: {error.strerror}") from None
    if problem:
        raise CaseError(f"case file {str(path)!r} {problem}: not a case file")
    return data


def _regular_file_problem(path: Path, limit: int | None = None) -> str | None:
    """Why `path` is no file to read (not a regular file, or larger than `limit` bytes), or None; OSError when it
    cannot be looked at (missing, no access)."""
    status = os.stat(path)
    if not stat.S_ISREG(status.st_mode):
        kind = "a folder" if stat.S_ISDIR(status.st_mode) else "a device, a pipe or a socket"
        return f"is {kind}, not a regular file"
    if limit is not None and status.st_size > limit:
        return f"is larger than {limit >> 20} MiB ({status.st_size} bytes)"
    return None


def load_case_text(text: str, overrides: Iterable[str] = (), origin: str = "<string>",
                   base_dir: str | os.PathLike | None = None) -> Case:
    """Resolve TOML text; relative file paths start from ``base_dir`` (default: the cwd)."""
    return _load_text(text, overrides, origin, Path(base_dir or Path.cwd()), "case")


def case_from_dict(table: dict, overrides: Iterable[str] = (), origin: str = "<dict>",
                   base_dir: str | os.PathLike | None = None) -> Case:
    """Resolve a table shaped like a parsed case file (``Case.source`` is then "")."""
    return _build(table, overrides, "", origin, Path(base_dir or Path.cwd()), "case")


def parse_override(item: str) -> tuple[tuple[str, ...], Any]:
    """Split "section.key=value"; the value is parsed as TOML, else kept as the bare string."""
    key, equals, value = item.partition("=")
    path = tuple(part.strip() for part in key.split("."))
    if not equals or len(path) < 2 or not all(path):
        raise CaseError(f"override {item!r}: expected section.key=value")
    value = value.strip()
    try:
        return path, tomllib.loads("v = " + value)["v"]
    except tomllib.TOMLDecodeError:
        return path, value
    except RecursionError:
        raise CaseError(f"override {item[:60]!r}...: {_TOO_DEEP}") from None


def format_override(key: str, value) -> str:
    """"section.key=value" with the value written as TOML: parse_override gives back (key, value)."""
    return f"{key}={_toml_value(value)}"


def _load_text(text, overrides, origin, base_dir, default_name) -> Case:
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CaseError(f"{origin}: {_describe_toml_error(error)}") from None
    except RecursionError:
        raise CaseError(f"{origin}: {_TOO_DEEP}") from None
    return _build(table, overrides, text, origin, base_dir, default_name)


MAX_NESTING = 8  # tables and lists inside one another: a case needs 3 (a section, a matrix, its rows)
_TOO_DEEP = (f"malformed TOML: arrays or tables nested inside one another more deeply than a case needs "
             f"(at most {MAX_NESTING} levels)")


def _check_nesting(table: dict) -> None:
    """A CaseError when `table` nests lists and tables more than MAX_NESTING deep (what resolution and
    copy.deepcopy would follow recursively), found without recursing."""
    pending = [(table, 0)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_NESTING:
            raise CaseError(_TOO_DEEP)
        if isinstance(value, dict):
            pending.extend((entry, depth + 1) for entry in value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend((entry, depth + 1) for entry in value)


def _build(table, overrides, source, origin, base_dir, default_name) -> Case:
    """Apply the overrides, resolve, and prefix any error with the origin."""
    try:
        _check_nesting(table)
        overridden = _with_overrides(table, overrides)
        _check_nesting(overridden)  # dotted keys of --set nest tables too
        inputs = _Inputs(overridden, base_dir, default_name)
        return Case(_resolve(inputs), source, origin, inputs)
    except CaseError as error:
        raise CaseError(f"{origin}: {error}") from None


def _describe_toml_error(error: tomllib.TOMLDecodeError) -> str:
    """tomllib's "What (at line 4, column 9)" as "malformed TOML at line 4, column 9: What"."""
    match = re.fullmatch(r"(.*) \((at line \d+, column \d+|at end of document)\)", str(error))
    if match is None:
        return f"malformed TOML: {error}"
    return f"malformed TOML {match[2]}: {match[1]}"


def _with_overrides(table: dict, overrides: Iterable[str]) -> dict:
    """A deep copy of the table with each override set; unknown keys are caught by resolution."""
    if isinstance(overrides, str):
        overrides = (overrides,)
    table = copy.deepcopy(table)
    for item in overrides:
        path, value = parse_override(item)
        parent = table
        for depth, part in enumerate(path[:-1]):
            parent = parent.setdefault(part, {})
            if not isinstance(parent, dict):
                raise CaseError(f"override {item!r}: {'.'.join(path[:depth + 1])!r} is not a table")
        parent[path[-1]] = value
    return table


# ---------------------------------------------------------------------------------------
# Values: parsers that check one value and return its normalised form
# ---------------------------------------------------------------------------------------


class _Invalid(Exception):
    """A value is wrong; the resolver puts the key in front of the message."""


@dataclass
class _Context:
    """What a parser or a default may look at: the sections resolved so far."""

    data: dict
    section: dict
    inputs: _Inputs

    @property
    def dim(self) -> int:
        return self.data["sphere"]["dim"]


@dataclass(frozen=True)
class _Interval:
    """low <= x (or low < x when ``strict``) and x < high."""

    low: float
    strict: bool = False
    high: float = math.inf

    def check(self, x):
        inside = (x > self.low if self.strict else x >= self.low) and x < self.high
        if not inside:
            raise _Invalid(f"must be {self}, got {x!r}")
        return x

    def __str__(self) -> str:
        if self.high < math.inf:
            return f"in {'(' if self.strict else '['}{_bound(self.low)}, {_bound(self.high)})"
        return f"{'>' if self.strict else '>='} {_bound(self.low)}"


def _bound(x) -> str:
    """An interval's end as a message shows it: large powers of two as 2**k, other ints exactly."""
    if isinstance(x, int):
        power = abs(x).bit_length() - 1
        if abs(x) >= 2 ** 20 and abs(x) == 2 ** power:
            return f"{'-' if x < 0 else ''}2**{power}"
        return str(x)
    return f"{x:g}"


_NONNEGATIVE = _Interval(0)
_POSITIVE = _Interval(0, strict=True)
_INT64 = _Interval(-2 ** 63, high=2 ** 63)  # TOML's integers; torch and NetCDF attributes take no more
_SEED = _Interval(0, high=2 ** 63)  # numpy's SeedSequence and torch's manual_seed take [0, 2**64); int64 to store
_UNIT_TOLERANCE = 1e-12  # a norm or a sum this close to 1 is already normalised


def _describe(value) -> str:
    """A value as a message shows it after "got"."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} entries"
    return repr(value)


def _is_list(value) -> bool:
    return isinstance(value, (list, tuple))


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _finite(value) -> float:
    """A finite real; ints become floats."""
    if not _is_number(value):
        raise _Invalid(f"expected a number, got {_describe(value)}")
    try:
        x = float(value)
    except OverflowError:
        raise _Invalid("number too large for a float") from None
    if not math.isfinite(x):
        raise _Invalid(f"must be finite, got {x!r}")
    return x


def _each(value, parse_entry) -> list:
    """Parse every entry of a list; errors name the entry as "entry [i]" (or "[i][j]")."""
    if not _is_list(value):
        raise _Invalid(f"expected a list, got {_describe(value)}")
    parsed = []
    for i, entry in enumerate(value):
        try:
            parsed.append(parse_entry(entry))
        except _Invalid as error:
            inner = str(error).removeprefix("entry ")
            separator = "" if inner != str(error) else ": "
            raise _Invalid(f"entry [{i}]{separator}{inner}") from None
    return parsed


def _real(interval: _Interval):
    return lambda value, ctx: interval.check(_finite(value))


def _reals(interval: _Interval):
    return lambda value, ctx: _each(value, lambda entry: interval.check(_finite(entry)))


def _distinct(parse):
    """A list parser whose entries must differ (they become the values of a coordinate)."""
    def parsed(value, ctx) -> list:
        entries = parse(value, ctx)
        for i, entry in enumerate(entries):
            if entry in entries[:i]:
                raise _Invalid(f"entry [{i}] = {entry!r} repeats entry [{entries.index(entry)}] "
                               "(the entries are coordinate values and must be distinct)")
        return entries
    return parsed


def _integer(interval: _Interval | None = None):
    """An int in ``interval`` (checked first, so its message names the key's own range), and a
    64-bit one in any case: TOML's integers, what torch and a NetCDF attribute can take."""
    def parse(value, ctx) -> int:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise _Invalid(f"expected an integer, got {_describe(value)}")
        if interval:
            interval.check(int(value))
        if not _INT64.low <= value < _INT64.high:
            raise _Invalid(f"must be a 64-bit integer, {_INT64}, got {int(value)}")
        return int(value)
    return parse


def _choice(*options: str):
    def parse(value, ctx) -> str:
        if not isinstance(value, str) or value not in options:
            raise _Invalid(f"expected one of {', '.join(map(repr, options))}, got {_describe(value)}")
        return value
    return parse


def _text(value, ctx) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, got {_describe(value)}")
    return value


# File systems take 255-byte names; the longest name derived from the case's is the temporary file of its figure,
# "<name>.png" + output.DERIVED_NAME_BYTES (41): 255 - 45 = 210.
_MAX_NAME_BYTES = 210
_NAME_FORBIDDEN = tuple(dict.fromkeys(("/", os.sep, os.altsep or "/", "\0")))  # what a file name cannot hold


def _case_name(value, ctx) -> str:
    """The case's name: it names the default output files, so a plain file name, not hidden."""
    name = _text(value, ctx)
    if not name.strip():
        raise _Invalid("must not be empty or blank (it names the default output files)")
    if len(name.encode()) > _MAX_NAME_BYTES:
        raise _Invalid(f"must be at most {_MAX_NAME_BYTES} bytes (it names the default output files and their "
                       f"temporary files, '<name>.png.<32 hex digits>.tmp.png' the longest), got {len(name.encode())}")
    if any(char in name for char in _NAME_FORBIDDEN):
        raise _Invalid(f"must be a file name without {' or '.join(map(repr, _NAME_FORBIDDEN))} "
                       f"(it names the default output files), got {name!r}")
    if name.startswith("."):
        raise _Invalid(f"must not start with '.' (it names the default output files), got {name!r}")
    if not name.isprintable():
        raise _Invalid(f"must not hold control characters such as newlines (it names the default output files and "
                       f"appears in one-line messages), got {name!r}")
    return name


def _default_case_name(ctx) -> str:
    """The case file's stem made a valid case.name: separators and control characters to '_', leading dots
    dropped, cut to _MAX_NAME_BYTES, else "case"."""
    name = "".join(char if char.isprintable() and char not in _NAME_FORBIDDEN else "_"
                   for char in ctx.inputs.default_name)
    return name.lstrip(".").encode()[:_MAX_NAME_BYTES].decode(errors="ignore").strip() or "case"


def _boolean(value, ctx) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, got {_describe(value)}")
    return value


def _beta(value, ctx) -> float:
    """Inverse temperature: a real >= 0, or "inf" / inf for the zero-temperature limit."""
    if (isinstance(value, str) and value == "inf") or (_is_number(value) and value == math.inf):
        return math.inf
    try:
        beta = _finite(value)
    except _Invalid:
        raise _Invalid(f'expected a number >= 0 or "inf", got {_describe(value)}') from None
    return _NONNEGATIVE.check(beta)


def _auto_or_count(value, ctx) -> str | int:
    """"auto" or an int >= 1: rows per block of the dense kernel matrix (exp_kernel.block_rows), CPU threads
    (spherepde.base.threads)."""
    if value == "auto":
        return value
    if isinstance(value, str):
        raise _Invalid(f'expected "auto" or an integer >= 1, got {_describe(value)}')
    return _integer(_Interval(1))(value, ctx)


def _backend(value, ctx) -> str:
    """The transform backend; shtns is the spherical-harmonic transform, for S^2 only."""
    backend = _choice("auto", "torch", "shtns")(value, ctx)
    if backend == "shtns" and ctx.dim != 3:
        raise _Invalid(f"'shtns' is the S^2 transform and needs sphere.dim = 3, got sphere.dim = {ctx.dim} "
                       "(take 'auto' or 'torch')")
    return backend


def _shape(value) -> str:
    """How a would-be matrix looks: "2 x 3", "rows of lengths 2, 3", or its description."""
    if _is_list(value) and value and all(_is_list(row) for row in value):
        lengths = [len(row) for row in value]
        if len(set(lengths)) == 1:
            return f"{len(value)} x {lengths[0]}"
        return f"rows of lengths {', '.join(map(str, lengths))}"
    return _describe(value)


def _matrix(value, ctx) -> list[list[float]]:
    d = ctx.dim
    if _shape(value) != f"{d} x {d}":
        raise _Invalid(f"expected a {d} x {d} matrix (sphere.dim = {d}), got {_shape(value)}")
    return _each(value, lambda row: _each(row, _finite))


def _identity(ctx) -> list[list[float]]:
    return [[float(i == j) for j in range(ctx.dim)] for i in range(ctx.dim)]


def _zeros(ctx) -> list[list[float]]:
    return [[0.0] * ctx.dim for _ in range(ctx.dim)]


def _vector(value, ctx) -> list[float]:
    """A length-d real vector."""
    d = ctx.dim
    if not (_is_list(value) and len(value) == d):
        raise _Invalid(f"expected a vector of length {d} (sphere.dim = {d}), got {_describe(value)}")
    return _each(value, _finite)


def _direction(value, ctx) -> list[float]:
    """A nonzero length-d vector, scaled to unit length (kept as given if already unit)."""
    vector = _vector(value, ctx)
    norm = math.hypot(*vector)
    if norm == 0:
        raise _Invalid("must be nonzero (it is a direction)")
    if norm == math.inf:  # x / inf would make it the zero vector
        raise _Invalid(f"its norm overflows a float (largest entry {max(map(abs, vector)):.3g}); a direction "
                       "needs only its ratios: divide it by its largest entry")
    return vector if abs(norm - 1) <= _UNIT_TOLERANCE else [x / norm for x in vector]


def _directions(value, ctx) -> list[list[float]]:
    directions = _each(value, lambda entry: _direction(entry, ctx))
    if not directions:
        raise _Invalid("expected at least one direction")
    return directions


def _weights(value, ctx) -> list[float]:
    """Reals >= 0 with a positive sum, normalised to sum 1 (kept as given if they do)."""
    weights = _reals(_NONNEGATIVE)(value, ctx)
    try:
        total = math.fsum(weights)
    except OverflowError:
        total = math.inf
    if total == math.inf:
        raise _Invalid(f"their sum overflows a float (largest {max(weights):.3g}); only their ratios matter: "
                       "divide them by the largest")
    if not total > 0:
        raise _Invalid(f"must have a positive sum, got {weights!r}")
    return weights if abs(total - 1) <= _UNIT_TOLERANCE else [w / total for w in weights]


def _initial_mean(value, ctx) -> list[float]:
    """vmf: a direction, made unit; projected_gaussian: the Gaussian's mean, any length-d vector."""
    return _direction(value, ctx) if ctx.section["kind"] == "vmf" else _vector(value, ctx)


def _covariance(value, ctx) -> list[list[float]]:
    """A d x d symmetric positive definite matrix, or a real s > 0 standing for s I."""
    if _is_number(value):
        variance = _real(_POSITIVE)(value, ctx)
        return [[variance * x for x in row] for row in _identity(ctx)]
    if not _is_list(value):
        raise _Invalid(f"expected a {ctx.dim} x {ctx.dim} matrix or a real s > 0 (for s I), got {_describe(value)}")
    matrix = _matrix(value, ctx)
    for i, j in zip(*np.triu_indices(ctx.dim, 1)):
        if matrix[i][j] != matrix[j][i]:
            raise _Invalid(f"must be symmetric, got entry [{i}][{j}] = {matrix[i][j]!r} "
                           f"but [{j}][{i}] = {matrix[j][i]!r}")
    try:
        np.linalg.cholesky(matrix)
    except np.linalg.LinAlgError:
        raise _Invalid(f"must be positive definite, got smallest eigenvalue "
                       f"{np.linalg.eigvalsh(matrix)[0]:.3g}") from None
    return matrix


def _equal_weights(ctx) -> list[float]:
    return [1 / len(ctx.section["means"])] * len(ctx.section["means"])


def _readable_file(value, ctx) -> str:
    """A path, made absolute from the case's directory; the file must be readable."""
    path = Path(os.path.abspath(ctx.inputs.base_dir / Path(_text(value, ctx)).expanduser()))
    try:
        problem = _regular_file_problem(path)
        if problem:
            raise _Invalid(f"{str(path)!r} {problem} (an earlier output is one)")
        with open(path, "rb"):
            pass
    except OSError as error:
        raise _Invalid(f"cannot read {str(path)!r}: {error.strerror}") from None
    except ValueError as error:  # a NUL character in the path
        raise _Invalid(f"cannot read {str(path)!r}: {error}") from None
    return str(path)


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _initial_file_digest(ctx) -> str:
    try:
        return file_sha256(ctx.section["path"])
    except OSError as error:
        raise CaseError(f"initial.path: cannot read {ctx.section['path']!r}: {error.strerror}") from None


def _time_index(value, ctx) -> int:
    """An index into the initial file's time axis (negative from its end), checked against that axis's length
    when the file is a readable NetCDF file (otherwise initial.path's own check names the problem)."""
    index = _integer()(value, ctx)
    try:
        with xr.open_dataset(ctx.section["path"]) as stored:
            saves = stored.sizes.get("time")
    except Exception:  # not NetCDF: reported when the density is read
        return index
    if saves is not None and not -saves <= index < saves:
        raise _Invalid(f"{index} is out of range for the {saves} saves of {ctx.section['path']!r} "
                       f"(use {-saves} .. {saves - 1})")
    return index


def _pinned_digest(value, ctx) -> str:
    """A given initial.sha256 must be the file's: the file changed since the case was written otherwise."""
    given = _text(value, ctx).strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", given):
        raise _Invalid(f"expected 64 hexadecimal digits, got {value!r}")
    actual = _initial_file_digest(ctx)
    if given != actual:
        raise _Invalid(f"{ctx.section['path']!r} has SHA-256 {actual}, not {given}: the file changed since this "
                       "case was written (restore it, or drop initial.sha256 to accept the new file)")
    return given


# ---------------------------------------------------------------------------------------
# The schema: one declaration per key
# ---------------------------------------------------------------------------------------

_REQUIRED = object()  # no default: the key must be given
_ABSENT = object()  # a default meaning "leave the key out of the resolved data"


def _always_used(ctx) -> None:
    return None


def _only_for_kinds(*kinds: str):
    """Keys of [initial] that belong to some kinds only: a reason when they do not apply."""
    def unused(ctx) -> str | None:
        kind = ctx.section["kind"]
        if kind not in kinds:
            return f"not used when initial.kind = {kind!r} (it belongs to kind {' / '.join(map(repr, kinds))})"
        return None
    return unused


@dataclass(frozen=True)
class _Key:
    """One key: how to parse it, its default (an immutable value, a function of the context,
    _REQUIRED or _ABSENT), and when it does not apply."""

    name: str
    parse: Callable[[Any, _Context], Any]
    default: Any = _REQUIRED
    unused: Callable[[_Context], str | None] = _always_used


@dataclass(frozen=True)
class _Section:
    """One [section]: its keys in resolution order and cross-key rules.

    An ``optional`` section resolves to {} when the case does not give it or gives it empty (no defaults filled
    in): the resolved text of every plain run holds an empty [control], which must stay a plain run.
    """

    name: str
    keys: tuple[_Key, ...] = ()
    rules: Callable[[dict, _Context], None] | None = None
    optional: bool = False


def _model_rules(model: dict, ctx) -> None:
    if model["beta"] == math.inf and model["kernel"] != "softmax":
        raise CaseError(f'model.beta: "inf" needs model.kernel = "softmax", got {model["kernel"]!r}')
    if model["beta"] == math.inf and not any(map(any, model["B"])):
        raise CaseError('model.B: must be nonzero at model.beta = "inf" (the attention goes to '
                        "B^T x / |B^T x|, which B = 0 leaves 0/0 at every x)")


# Largest fraction of an initial file's mass that its density may hold in negative values: a density resolved by
# its grid undershoots by far less (round-off, tails below diagnostics.tail_tol); more makes no probability
# density, and the run from it would end in a numerical failure (Z <= 0, a blow-up) instead of naming the file.
NEGATIVE_MASS_TOLERANCE = 1e-3


def _negative_part(initial: dict) -> str | None:
    """Why the density an initial.kind = "file" case starts from has large negative parts, or None (also when it
    cannot be read here: initial.density_from_file names that problem)."""
    try:
        with xr.open_dataset(initial["path"]) as stored:
            density = stored["density"].isel(time=initial["time"]).values.astype(float)
            area = np.broadcast_to(stored["cell_area"].values.astype(float), density.shape)
    except Exception:  # not a result with a density: reported when the density is read
        return None
    if not np.isfinite(density).all():
        return None
    negative, total = float(area.ravel() @ np.maximum(-density, 0).ravel()), float(area.ravel() @ density.ravel())
    if not negative <= NEGATIVE_MASS_TOLERANCE * abs(total):
        return (f"the density at initial.time = {initial['time']} of {initial['path']!r} is negative where it holds "
                f"{negative:.3g} of its mass {total:.6g} (min {density.min():.3g}; at most {NEGATIVE_MASS_TOLERANCE:g} "
                "relative): not a probability density")
    return None


def _initial_rules(initial: dict, ctx) -> None:
    if initial["kind"] == "file":
        problem = _negative_part(initial)
        if problem:
            raise CaseError(f"initial.path: {problem}")
    if initial["kind"] != "vmf_mixture":
        return
    count = len(initial["means"])
    for key in ("kappas", "weights"):
        if len(initial[key]) != count:
            raise CaseError(f"initial.{key}: expected one entry per entry of initial.means "
                            f"({count}), got {len(initial[key])}")


_MAX_SAVES = 10 ** 6  # the save times are a list in memory
_MAX_STEPS_PER_SAVE = 10 ** 12  # beyond this a run would never end
# The stiffest diffusion mode over one step, dt eps lmax (lmax + 1): an IMEX step weighs terms
# dt lam U_i of that size against O(1) coefficients, and imex-ark436 amplifies their rounding
# error beyond ~1e17 in float32 (~1e35 in float64); float32's eps lmax^2 overflows near 3e38.
_MAX_DIFFUSION_STIFFNESS = 1e15


def _time_rules(time: dict, ctx) -> None:
    if not time["save_every"] > 0:
        raise CaseError(f"time.t_end: {time['t_end']!r} is too small: its default save_every, t_end / 20, rounds to 0")
    if "dt" in time and "cfl" in time:
        raise CaseError("time.dt: give either time.dt or time.cfl, not both")
    if time["t_end"] / time["save_every"] > _MAX_SAVES:
        raise CaseError(f"time.save_every: t_end / save_every = {time['t_end'] / time['save_every']:.3g} saves; "
                        f"at most {_MAX_SAVES:.0e}")
    if "dt" in time:
        _fixed_step_rules(time, time["dt"], "time.dt")
    eps, lmax = ctx.data["model"]["eps"], ctx.data["sphere"]["lmax"]
    longest_step = min(time["save_every"], time["t_end"], time.get("dt", math.inf))
    if eps * lmax * (lmax + 1) * longest_step > _MAX_DIFFUSION_STIFFNESS:
        raise CaseError(f"model.eps: {eps:.3g} makes the stiffness dt eps lmax (lmax + 1) of a step up to "
                        f"{eps * lmax * (lmax + 1) * longest_step:.3g} (dt <= min(t_end, save_every, time.dt)); "
                        f"at most {_MAX_DIFFUSION_STIFFNESS:.0e}, beyond which a diffusion step loses every digit")


def _fixed_step_rules(time: dict, dt: float, key: str) -> None:
    """A fixed step dt (given as `key`) must end: at most _MAX_STEPS_PER_SAVE steps per save, and within
    time.max_steps when there is one."""
    if min(time["save_every"], time["t_end"]) / dt > _MAX_STEPS_PER_SAVE:
        raise CaseError(f"{key}: {dt!r} makes more than {_MAX_STEPS_PER_SAVE:.0e} steps per save")
    if "max_steps" in time and math.ceil(time["t_end"] / dt - 1e-9) > time["max_steps"]:
        # at least t_end / dt steps with a fixed dt (each save interval is cut into whole steps): known now
        raise CaseError(f"time.max_steps: {time['max_steps']} steps cannot reach t_end = {time['t_end']:g} with "
                        f"{key} = {dt:g} (at least {math.ceil(time['t_end'] / dt - 1e-9)} steps)")


def _particles_rules(particles: dict, ctx) -> None:
    if "dt" in particles and ctx.data["solver"]["method"] in ("particles", "both"):
        _fixed_step_rules(ctx.data["time"], particles["dt"], "particles.dt")
    if particles["save"] > particles["n"]:
        raise CaseError(f"particles.save: must be <= particles.n = {particles['n']}, got {particles['save']}")
    n, replicas = particles["n"], particles["replicas"]
    if n % replicas or n // replicas < 2:
        raise CaseError(f"particles.replicas: must divide particles.n = {n} into systems of at least 2 tokens, "
                        f"got {replicas}")


def _only_for_losses(*losses: str):
    """Keys of [control] that belong to some losses only: a reason when they do not apply."""
    def unused(ctx) -> str | None:
        loss = ctx.section["loss"]
        if loss not in losses:
            return f"not used when control.loss = {loss!r} (it belongs to loss {' / '.join(map(repr, losses))})"
        return None
    return unused


def _loss_names(value, ctx) -> str:
    from spherepde.model.losses import LOSSES  # the registry is the list of choices

    return _choice(*LOSSES)(value, ctx)


def _second_axis(ctx) -> list[float]:
    return [float(i == 1) for i in range(ctx.dim)]


def _eulerian_training_only(ctx) -> str | None:
    """Keys of [control] that only the Eulerian training reads: a reason when training particles."""
    if ctx.data["solver"]["method"] == "particles":
        return "not used when solver.method = 'particles' (it belongs to the Eulerian adjoint)"
    return None


def _particle_training_only(ctx) -> str | None:
    """Keys of [control] that only the particle training reads: a reason when training the Eulerian solver."""
    if ctx.data["solver"]["method"] != "particles":
        return "not used when solver.method is not 'particles' (it sets the particles' noise)"
    return None


def _control_rules(control: dict, ctx) -> None:
    if "dt" not in ctx.data["time"]:
        raise CaseError("control: a training run needs time.dt (one fixed step grid for the forward and "
                        "adjoint runs), not time.cfl")
    if ctx.data["solver"]["method"] == "both":
        raise CaseError("control: training runs use solver.method = 'eulerian' or 'particles', not 'both' "
                        "(train each separately)")
    if control.get("noise") == "fresh" and control["optimizer"] == "lbfgs":
        raise CaseError("control.noise: 'fresh' noise makes J random, which the line search of 'lbfgs' cannot "
                        "use (take 'adam' or 'gd')")
    if control.get("noise") == "fresh" and control["tol"] > 0:
        raise CaseError("control.tol: with 'fresh' noise J changes between iterations by chance, so the stopping "
                        "rule would stop at random (set control.tol = 0 and a number of iterations)")


_SCHEMA = (
    _Section("case", (
        _Key("name", _case_name, _default_case_name),
        _Key("description", _text, ""),
    )),
    _Section("sphere", (
        _Key("dim", _integer(_Interval(2, high=2 ** 11))),
        _Key("lmax", _integer(_Interval(2, high=2 ** 15)), 32),
    )),
    _Section("model", (
        _Key("kernel", _choice("softmax", "unnormalized"), "softmax"),
        _Key("beta", _beta, 1.0),
        _Key("B", _matrix, _identity),
        _Key("V", _matrix, _identity),
        _Key("W", _matrix, _zeros),
        _Key("eps", _real(_NONNEGATIVE), 0.0),
    ), _model_rules),
    _Section("initial", (
        _Key("kind", _choice("uniform", "vmf", "vmf_mixture", "projected_gaussian", "file"), "uniform"),
        _Key("mean", _initial_mean, unused=_only_for_kinds("vmf", "projected_gaussian")),
        _Key("covariance", _covariance, unused=_only_for_kinds("projected_gaussian")),
        _Key("kappa", _real(_NONNEGATIVE), unused=_only_for_kinds("vmf")),
        _Key("means", _directions, unused=_only_for_kinds("vmf_mixture")),
        _Key("kappas", _reals(_NONNEGATIVE), unused=_only_for_kinds("vmf_mixture")),
        _Key("weights", _weights, _equal_weights, unused=_only_for_kinds("vmf_mixture")),
        _Key("path", _readable_file, unused=_only_for_kinds("file")),
        _Key("time", _time_index, -1, unused=_only_for_kinds("file")),
        _Key("sha256", _pinned_digest, _initial_file_digest, unused=_only_for_kinds("file")),
    ), _initial_rules),
    _Section("time", (
        _Key("t_end", _real(_POSITIVE)),
        _Key("dt", _real(_POSITIVE), _ABSENT),
        _Key("cfl", _real(_POSITIVE), lambda ctx: _ABSENT if "dt" in ctx.section else 0.5),
        _Key("save_every", _real(_POSITIVE), lambda ctx: ctx.section["t_end"] / 20),
        _Key("scheme", _choice("auto", "imex-ark436", "imex-ars443", "rk4", "lawson-rk4"), "auto"),
        _Key("max_steps", _integer(_Interval(1)), _ABSENT),
    ), _time_rules),
    _Section("solver", (
        _Key("method", _choice("eulerian", "particles", "both"), "eulerian"),
        _Key("field", _choice("auto", "dense", "spectral"), "auto"),
        _Key("backend", _backend, "auto"),
        _Key("device", _choice("auto", "cpu", "cuda"), "auto"),
        _Key("dtype", _choice("float64", "float32"), "float64"),
        _Key("chunk", _auto_or_count, "auto"),
        _Key("threads", _auto_or_count, _ABSENT),  # absent: "auto" (so the resolved text of earlier cases stays)
        _Key("filter_order", _integer(_NONNEGATIVE), 0),
        _Key("kernel_tol", _real(_Interval(0, strict=True, high=1)), 1e-10),
    )),
    _Section("particles", (
        _Key("n", _integer(_Interval(2, high=2 ** 32)), 1000),
        _Key("seed", _integer(_SEED), 0),
        _Key("integrator", _choice("euler", "rk4", "heun"), "heun"),
        _Key("save", _integer(_NONNEGATIVE), lambda ctx: min(ctx.section["n"], 1000)),
        _Key("beta_inf_mode", _choice("mean_field", "hardmax"), "mean_field"),
        _Key("dt", _real(_POSITIVE), _ABSENT),
        _Key("replicas", _integer(_Interval(1)), 1),
    ), _particles_rules),
    _Section("diagnostics", (
        _Key("lyapunov_p", _distinct(_reals(_POSITIVE)), lambda ctx: [0.25]),
        _Key("tail_tol", _real(_POSITIVE), 1e-6),
        _Key("w2", _boolean, True),
        _Key("w2_atoms", _integer(_POSITIVE), 1000),
    )),
    _Section("control", (
        _Key("loss", _loss_names, "align"),
        _Key("target", _direction, _second_axis),
        _Key("lambda_reg", _real(_NONNEGATIVE), 0.01),
        _Key("layers", _integer(_Interval(1, high=2 ** 20)), 8),
        _Key("optimizer", _choice("adam", "gd", "lbfgs"), "adam"),
        _Key("iterations", _integer(_NONNEGATIVE), 100),
        _Key("learning_rate", _real(_POSITIVE), 0.05),
        _Key("tol", _real(_NONNEGATIVE), 0.0),
        _Key("gradient", _choice("discrete", "continuous"), "discrete", unused=_eulerian_training_only),
        _Key("checkpoint_every", _integer(_NONNEGATIVE), 0, unused=_eulerian_training_only),
        _Key("save_adjoint", _boolean, False, unused=_eulerian_training_only),
        _Key("noise", _choice("common", "fresh"), "common", unused=_particle_training_only),
        _Key("kappa_cand", _real(_NONNEGATIVE), 2.0, unused=_only_for_losses("bow")),
        _Key("tau", _real(_POSITIVE), 1.0, unused=_only_for_losses("bow")),
        _Key("K", _integer(_Interval(2, high=2 ** 20)), 16, unused=_only_for_losses("bow")),
        _Key("seed", _integer(_SEED), 0, unused=_only_for_losses("bow")),
    ), _control_rules, optional=True),
)


# ---------------------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------------------


def _unknown(what: str, shown: str, name: str, known: list[str]) -> CaseError:
    """"unknown key 'model.bta' (did you mean 'beta'?)", or the list of known names."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(known)}"
    return CaseError(f"unknown {what} {shown!r} ({hint})")


def _resolve(inputs: _Inputs) -> dict:
    """Every section of the schema, in order, resolved from the user's table."""
    table = inputs.table
    names = [section.name for section in _SCHEMA]
    for name in table:
        if name not in names:
            raise _unknown("section", name, name, names)
    ctx = _Context(data={}, section={}, inputs=inputs)
    for section in _SCHEMA:
        given = table.get(section.name, {})
        if not isinstance(given, dict):
            raise CaseError(f"{section.name}: expected a table [{section.name}], got {_describe(given)}")
        if section.optional and not given:
            ctx.data[section.name] = {}
        else:
            ctx.data[section.name] = _resolve_section(section, given, ctx)
    return ctx.data


def _resolve_section(section: _Section, given: dict, ctx: _Context) -> dict:
    known = [key.name for key in section.keys]
    for name in given:
        if name not in known:
            raise _unknown("key", f"{section.name}.{name}", name, known)
    ctx.section = resolved = {}
    for key in section.keys:
        path = f"{section.name}.{key.name}"
        reason = key.unused(ctx)
        if reason is not None:
            if key.name in given:
                raise CaseError(f"{path}: {reason}")
            continue
        if key.name in given:
            value = _parsed(path, key.parse, given[key.name], ctx)
        elif key.default is _REQUIRED:
            raise CaseError(f"{path}: required key is missing")
        else:
            value = key.default(ctx) if callable(key.default) else key.default
        if value is not _ABSENT:
            resolved[key.name] = value
    if section.rules is not None:
        section.rules(resolved, ctx)
    return resolved


def _parsed(path: str, parse, value, ctx: _Context):
    try:
        return parse(value, ctx)
    except _Invalid as error:
        raise CaseError(f"{path}: {error}") from None


# ---------------------------------------------------------------------------------------
# Writing TOML (the value types of the schema)
# ---------------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _dumps(data: dict) -> str:
    """Sections as [headers], their keys as `key = value` with inline values."""
    blocks = []
    for name, table in data.items():
        lines = [f"[{_toml_key(name)}]"]
        lines += [f"{_toml_key(key)} = {_toml_value(value)}" for key, value in table.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _toml_key(key) -> str:
    if not isinstance(key, str):
        raise _Invalid(f"table keys must be strings, got {key!r}")
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_string(text: str) -> str:
    def escaped(char: str) -> str:
        if char in _ESCAPES:
            return _ESCAPES[char]
        return f"\\u{ord(char):04x}" if char < " " or char == "\x7f" else char
    return '"' + "".join(map(escaped, text)) + '"'


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return float.__repr__(float(value))  # shortest round-trip form; inf, -inf, nan as TOML spells them
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if _is_list(value):
        return "[" + ", ".join(map(_toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise _Invalid(f"cannot be written as TOML: {value!r}")
