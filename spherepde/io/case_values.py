"""Values of a case file: parsers that check one value and return its normalised form.

A parser takes the value given and the :class:`Context` (the sections resolved so far) and returns the value as
the resolved case holds it, or raises :class:`Invalid`, whose message spherepde.io.case prefixes with the key. A
default that depends on other keys is a function of the Context alone.
"""

from __future__ import annotations

import datetime
import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Inputs:
    """What a case was resolved from, so that overrides can re-resolve it."""

    table: dict  # the user's table with overrides applied, before resolution
    base_dir: Path  # where relative file paths start from
    default_name: str  # case.name when the table has none
    overridden: frozenset = frozenset()  # the (section, key) that overrides and edits set in `table`


class Invalid(Exception):
    """A value is wrong; the resolver puts the key in front of the message."""


@dataclass
class Context:
    """What a parser or a default may look at: the sections resolved so far."""

    data: dict
    section: dict
    inputs: Inputs

    @property
    def dim(self) -> int:
        return self.data["sphere"]["dim"]


@dataclass(frozen=True)
class Interval:
    """low <= x (or low < x when ``strict``) and x < high."""

    low: float
    strict: bool = False
    high: float = math.inf

    def check(self, x):
        inside = (x > self.low if self.strict else x >= self.low) and x < self.high
        if not inside:
            raise Invalid(f"must be {self}, got {shown(x)}")
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


NONNEGATIVE = Interval(0)
POSITIVE = Interval(0, strict=True)
_INT64 = Interval(-2 ** 63, high=2 ** 63)  # TOML's integers; torch and NetCDF attributes take no more
SEED = Interval(0, high=2 ** 63)  # numpy's SeedSequence and torch's manual_seed take [0, 2**64); int64 to store
_UNIT_TOLERANCE = 1e-12  # a norm or a sum this close to 1 is already normalised
_TINY_NORM = 1e-150  # below it `direction` scales a vector by its largest entry before normalising


LINE_QUOTED = 80  # characters of a value, a key or a malformed line that a message quotes


def shortened(text: str) -> str:
    """Text from the case as a one-line message quotes it: its first LINE_QUOTED characters (a value or a key of
    100 000 characters made a message of as many)."""
    return text if len(text) <= LINE_QUOTED else text[:LINE_QUOTED] + "..."


def shown(value) -> str:
    """A value's repr, `shortened`; an int beyond Python's 4300 digits of repr as its size in bits."""
    try:
        return shortened(repr(value))
    except ValueError:
        return f"an integer of {value.bit_length()} bits"


def describe(value) -> str:
    """A value as a message shows it after "got"."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {shortened(value)!r}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} entries"
    if isinstance(value, (datetime.date, datetime.time)):  # TOML's dates and times, not Python's reprs of them
        kind = {datetime.datetime: "date-time", datetime.time: "time"}.get(type(value), "date")
        return f"the {kind} {value.isoformat()}"
    return shown(value)


def is_list(value) -> bool:
    return isinstance(value, (list, tuple))


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _finite(value) -> float:
    """A finite real; ints become floats."""
    if not _is_number(value):
        raise Invalid(f"expected a number, got {describe(value)}")
    try:
        x = float(value)
    except OverflowError:
        raise Invalid("number too large for a float") from None
    if not math.isfinite(x):
        raise Invalid(f"must be finite, got {x!r}")
    return x


def _each(value, parse_entry) -> list:
    """Parse every entry of a list; errors name the entry as "entry [i]" (or "[i][j]")."""
    if not is_list(value):
        raise Invalid(f"expected a list, got {describe(value)}")
    parsed = []
    for i, entry in enumerate(value):
        try:
            parsed.append(parse_entry(entry))
        except Invalid as error:
            inner = str(error).removeprefix("entry ")
            separator = "" if inner != str(error) else ": "
            raise Invalid(f"entry [{i}]{separator}{inner}") from None
    return parsed


def real(interval: Interval):
    return lambda value, ctx: interval.check(_finite(value))


def reals(interval: Interval):
    return lambda value, ctx: _each(value, lambda entry: interval.check(_finite(entry)))


def distinct(parse, why: str = "the entries are coordinate values and must be distinct"):
    """A list parser whose entries must differ, for the reason `why` (by default: they become the values of a
    coordinate)."""
    def parsed(value, ctx) -> list:
        entries = parse(value, ctx)
        for i, entry in enumerate(entries):
            if entry in entries[:i]:
                raise Invalid(f"entry [{i}] = {entry!r} repeats entry [{entries.index(entry)}] "
                               f"({why})")
        return entries
    return parsed


def integer(interval: Interval | None = None):
    """An int in ``interval`` (checked first, so its message names the key's own range), and a
    64-bit one in any case: TOML's integers, what torch and a NetCDF attribute can take."""
    def parse(value, ctx) -> int:
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise Invalid(f"expected an integer, got {describe(value)}")
        if interval:
            interval.check(int(value))
        if not _INT64.low <= value < _INT64.high:
            raise Invalid(f"must be a 64-bit integer, {_INT64}, got {shown(int(value))}")
        return int(value)
    return parse


def choice(*options: str):
    def parse(value, ctx) -> str:
        if not isinstance(value, str) or value not in options:
            raise Invalid(f"expected one of {', '.join(map(repr, options))}, got {describe(value)}")
        return value
    return parse


def text(value, ctx) -> str:
    """A string of UTF-8 text: the resolved case is stored as a NetCDF attribute, which holds UTF-8 only, so bytes
    that are not UTF-8 (a --set value or a file name in Latin-1, which Python holds as lone surrogates) would fail
    the output's write after the whole run."""
    if not isinstance(value, str):
        raise Invalid(f"expected a string, got {describe(value)}")
    try:
        value.encode()
    except UnicodeEncodeError as error:
        raise Invalid(f"must be UTF-8 text, got {ascii(value[:LINE_QUOTED])} (not UTF-8 at character {error.start}: "
                       "bytes in another encoding, such as a Latin-1 file name; rename or re-encode it)") from None
    return value


# File systems take 255-byte names; the longest name derived from the case's is the temporary file of its figure,
# "<name>.png" + output.DERIVED_NAME_BYTES (41): 255 - 45 = 210.
_MAX_NAME_BYTES = 210
_NAME_FORBIDDEN = tuple(dict.fromkeys(("/", os.sep, os.altsep or "/", "\0")))  # what a file name cannot hold


def case_name(value, ctx) -> str:
    """The case's name: it names the default output files, so a plain file name, not hidden."""
    name = text(value, ctx)
    if not name.strip():
        raise Invalid("must not be empty or blank (it names the default output files)")
    if len(name.encode()) > _MAX_NAME_BYTES:
        raise Invalid(f"must be at most {_MAX_NAME_BYTES} bytes (it names the default output files and their "
                       f"temporary files, '<name>.png.<32 hex digits>.tmp.png' the longest), got {len(name.encode())}")
    if any(char in name for char in _NAME_FORBIDDEN):
        raise Invalid(f"must be a file name without {' or '.join(map(repr, _NAME_FORBIDDEN))} "
                       f"(it names the default output files), got {name!r}")
    if name.startswith("."):
        raise Invalid(f"must not start with '.' (it names the default output files), got {name!r}")
    if name != name.strip():
        raise Invalid(f"must not start or end with white space (it names the default output files: "
                      f"{shortened(name + '.nc')!r}), got {shortened(name)!r}")
    if not name.isprintable():
        raise Invalid(f"must not hold control characters such as newlines (it names the default output files and "
                       f"appears in one-line messages), got {name!r}")
    return name


def default_case_name(ctx) -> str:
    """The case file's stem made a valid case.name: separators and control characters to '_', leading dots
    dropped, cut to _MAX_NAME_BYTES, else "case"."""
    name = "".join(char if char.isprintable() and char not in _NAME_FORBIDDEN else "_"
                   for char in ctx.inputs.default_name)
    return name.lstrip(".").encode()[:_MAX_NAME_BYTES].decode(errors="ignore").strip() or "case"


def boolean(value, ctx) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"expected true or false, got {describe(value)}")
    return value


def beta(value, ctx) -> float:
    """Inverse temperature: a real >= 0, or "inf" / inf for the zero-temperature limit."""
    if (isinstance(value, str) and value == "inf") or (_is_number(value) and value == math.inf):
        return math.inf
    try:
        beta = _finite(value)
    except Invalid:
        raise Invalid(f'expected a number >= 0 or "inf", got {describe(value)}') from None
    return NONNEGATIVE.check(beta)


def auto_or_count(value, ctx, high: float = math.inf) -> str | int:
    """"auto" or an int >= 1 (below `high`): rows per block of the dense kernel matrix (kernels.dense.block_rows)."""
    if value == "auto":
        return value
    if isinstance(value, str):
        raise Invalid(f'expected "auto" or an integer >= 1, got {describe(value)}')
    return integer(Interval(1, high=high))(value, ctx)


# More CPU threads than any machine has cores: 1e5 exhausted the OpenMP runtime's memory, 2**31 overflowed torch.
MAX_THREADS = 4096


def auto_or_threads(value, ctx) -> str | int:
    """"auto" or a count of CPU threads in [1, MAX_THREADS) (spherepde.base.threads)."""
    return auto_or_count(value, ctx, MAX_THREADS)


def backend(value, ctx) -> str:
    """The transform backend; shtns is the spherical-harmonic transform, for S^2 only."""
    backend = choice("auto", "torch", "shtns")(value, ctx)
    if backend == "shtns" and ctx.dim != 3:
        raise Invalid(f"'shtns' is the S^2 transform and needs sphere.dim = 3, got sphere.dim = {ctx.dim} "
                       "(take 'auto' or 'torch')")
    return backend


def _shape(value) -> str:
    """How a would-be matrix looks: "2 x 3", "rows of lengths 2, 3", or its description."""
    if is_list(value) and value and all(is_list(row) for row in value):
        lengths = [len(row) for row in value]
        if len(set(lengths)) == 1:
            return f"{len(value)} x {lengths[0]}"
        return f"rows of lengths {', '.join(map(str, lengths))}"
    return describe(value)


def matrix(value, ctx) -> list[list[float]]:
    d = ctx.dim
    if _shape(value) != f"{d} x {d}":
        raise Invalid(f"expected a {d} x {d} matrix (sphere.dim = {d}), got {_shape(value)}")
    return _each(value, lambda row: _each(row, _finite))


def identity(ctx) -> list[list[float]]:
    return [[float(i == j) for j in range(ctx.dim)] for i in range(ctx.dim)]


def zeros(ctx) -> list[list[float]]:
    return [[0.0] * ctx.dim for _ in range(ctx.dim)]


def _vector(value, ctx) -> list[float]:
    """A length-d real vector."""
    d = ctx.dim
    if not (is_list(value) and len(value) == d):
        raise Invalid(f"expected a vector of length {d} (sphere.dim = {d}), got {describe(value)}")
    return _each(value, _finite)


def direction(value, ctx) -> list[float]:
    """A nonzero length-d vector, scaled to unit length (kept as given if already unit)."""
    vector = _vector(value, ctx)
    norm = math.hypot(*vector)
    if norm == 0:
        raise Invalid("must be nonzero (it is a direction)")
    if norm == math.inf:  # x / inf would make it the zero vector
        raise Invalid(f"its norm overflows a float (largest entry {max(map(abs, vector)):.3g}); a direction "
                       "needs only its ratios: divide it by its largest entry")
    if abs(norm - 1) <= _UNIT_TOLERANCE:
        return vector
    if norm < _TINY_NORM:  # subnormal entries carry few digits: [1e-320, 1e-320] / its norm was 1e-4 off unit length
        largest = max(map(abs, vector))
        vector = [x / largest for x in vector]
        norm = math.hypot(*vector)
    return [x / norm for x in vector]


def directions(value, ctx) -> list[list[float]]:
    directions = _each(value, lambda entry: direction(entry, ctx))
    if not directions:
        raise Invalid("expected at least one direction")
    return directions


def weights(value, ctx) -> list[float]:
    """Reals >= 0 with a positive sum, normalised to sum 1 (kept as given if they do)."""
    weights = reals(NONNEGATIVE)(value, ctx)
    try:
        total = math.fsum(weights)
    except OverflowError:
        total = math.inf
    if total == math.inf:
        raise Invalid(f"their sum overflows a float (largest {max(weights):.3g}); only their ratios matter: "
                       "divide them by the largest")
    if not total > 0:
        raise Invalid(f"must have a positive sum, got {weights!r}")
    return weights if abs(total - 1) <= _UNIT_TOLERANCE else [w / total for w in weights]


def initial_mean(value, ctx) -> list[float]:
    """vmf: a direction, made unit; projected_gaussian: the Gaussian's mean, any length-d vector."""
    return direction(value, ctx) if ctx.section["kind"] == "vmf" else _vector(value, ctx)


def covariance(value, ctx) -> list[list[float]]:
    """A d x d symmetric positive definite matrix, or a real s > 0 standing for s I."""
    if _is_number(value):
        variance = real(POSITIVE)(value, ctx)
        return [[variance * x for x in row] for row in identity(ctx)]
    if not is_list(value):
        raise Invalid(f"expected a {ctx.dim} x {ctx.dim} matrix or a real s > 0 (for s I), got {describe(value)}")
    rows = matrix(value, ctx)
    for i, j in zip(*np.triu_indices(ctx.dim, 1)):
        if rows[i][j] != rows[j][i]:
            raise Invalid(f"must be symmetric, got entry [{i}][{j}] = {rows[i][j]!r} "
                           f"but [{j}][{i}] = {rows[j][i]!r}")
    try:
        np.linalg.cholesky(rows)
    except np.linalg.LinAlgError:
        raise Invalid(f"must be positive definite, got smallest eigenvalue "
                       f"{np.linalg.eigvalsh(rows)[0]:.3g}") from None
    return rows


def equal_weights(ctx) -> list[float]:
    return [1 / len(ctx.section["means"])] * len(ctx.section["means"])


def _rectangular(value, rows: int, cols: int, what: str) -> list[list[float]]:
    if _shape(value) != f"{rows} x {cols}":
        raise Invalid(f"expected a {rows} x {cols} matrix ({what}), got {_shape(value)}")
    return _each(value, lambda row: _each(row, _finite))


def list_depth(value) -> int:
    """How many list levels a value opens with (a matrix: 2, a list of matrices: 3)."""
    depth = 0
    while is_list(value) and value:
        value, depth = value[0], depth + 1
    return depth


def per_layer(parse, rank: int):
    """A value of rank `rank` (1: vector, 2: matrix) or a nonempty list of them, one per layer of depth (the model
    beyond the seeds: piecewise constant over the layers like W_t); errors name the layer as "entry [l]"."""
    def parse_layers(value, ctx):
        if list_depth(value) == rank + 1:
            return _each(value, lambda entry: parse(entry, ctx))
        return parse(value, ctx)
    return parse_layers


def layered_matrix(value, ctx):
    """A d x d matrix, or a list of L of them (one per layer)."""
    return per_layer(matrix, 2)(value, ctx)


def _hidden(ctx) -> int:
    return ctx.section["hidden"]


def first_weights(value, ctx):
    """model.W1: the hidden layer's n x d matrix (n = model.hidden), or a list of L of them."""
    return per_layer(lambda entry, ctx: _rectangular(entry, _hidden(ctx), ctx.dim,
                                                     f"model.hidden x sphere.dim = {_hidden(ctx)} x {ctx.dim}"),
                     2)(value, ctx)


def second_weights(value, ctx):
    """model.W2: the output layer's d x n matrix, or a list of L of them."""
    return per_layer(lambda entry, ctx: _rectangular(entry, ctx.dim, _hidden(ctx),
                                                     f"sphere.dim x model.hidden = {ctx.dim} x {_hidden(ctx)}"),
                     2)(value, ctx)


def hidden_bias(value, ctx):
    """model.b: the hidden layer's bias, a length-n vector, or a list of L of them."""
    def vector(entry, ctx):
        n = _hidden(ctx)
        if not (is_list(entry) and len(entry) == n and list_depth(entry) == 1):
            raise Invalid(f"expected a vector of length {n} (model.hidden), got {describe(entry)}")
        return _each(entry, _finite)
    return per_layer(vector, 1)(value, ctx)


def seeded_first_weights(ctx) -> list[list[float]]:
    """W1's default: independent N(0, 1/d) entries drawn from model.ffn_seed (numpy's default_rng), so that the
    resolved case stores the very matrix the run starts from."""
    draws = np.random.default_rng(ctx.section["ffn_seed"]).standard_normal((_hidden(ctx), ctx.dim))
    return (draws / math.sqrt(ctx.dim)).tolist()


def zero_second_weights(ctx) -> list[list[float]]:
    return [[0.0] * _hidden(ctx) for _ in range(ctx.dim)]


def zero_bias(ctx) -> list[float]:
    return [0.0] * _hidden(ctx)


_HEAD_KEYS = ("kernel", "beta", "B", "V")


def head_tables(value, ctx) -> list[dict]:
    """model.extra_heads: a nonempty list of tables {kernel, beta, B, V}, each key defaulting to head 0's kernel
    and beta and to identity B and V (B and V may be lists of per-layer matrices); resolved to full tables."""
    if not is_list(value) or not value:
        raise Invalid(f"expected a nonempty list of head tables {{kernel, beta, B, V}} (leave the key out for one "
                      f"head), got {describe(value)}")

    def head(entry) -> dict:
        if not isinstance(entry, dict):
            raise Invalid(f"expected a table {{kernel, beta, B, V}}, got {describe(entry)}")
        for name in entry:
            if name not in _HEAD_KEYS:
                raise Invalid(f"unknown key {name!r} (expected one of {', '.join(_HEAD_KEYS)})")
        parsers = {"kernel": choice("softmax", "unnormalized"), "beta": beta, "B": layered_matrix,
                   "V": layered_matrix}
        defaults = {"kernel": ctx.section["kernel"], "beta": ctx.section["beta"], "B": identity(ctx),
                    "V": identity(ctx)}
        resolved = {}
        for name in _HEAD_KEYS:
            if name not in entry:
                resolved[name] = defaults[name]
                continue
            try:
                resolved[name] = parsers[name](entry[name], ctx)
            except Invalid as error:
                raise Invalid(f"{name}: {error}") from None
        return resolved
    return _each(value, head)


def trained_groups(value, ctx) -> list[str]:
    """control.train: a nonempty list of distinct parameter groups among "W" (the feed-forward), "B", "V"."""
    groups = distinct(_each_choice("W", "B", "V"), "a group is trained once: name it once")(value, ctx)
    if not groups:
        raise Invalid('expected at least one of "W", "B", "V"')
    return groups


def _each_choice(*options: str):
    parse = choice(*options)
    return lambda value, ctx: _each(value, lambda entry: parse(entry, ctx))


def regularisation(value, ctx):
    """control.lambda_reg: a real >= 0 for every trained group, or a table {group: real >= 0} naming each group
    of control.train (the L2 weight of int |theta_t|^2 dt per group)."""
    if not isinstance(value, dict):
        return real(NONNEGATIVE)(value, ctx)
    train = ctx.section.get("train", ["W"])
    for group in value:
        if group not in train:
            raise Invalid(f"{group!r} is not a trained group (control.train = {train})")
    missing = [group for group in train if group not in value]
    if missing:
        raise Invalid(f"the table names no weight for the trained group(s) {', '.join(map(repr, missing))}")
    resolved = {}
    for group in train:
        try:
            resolved[group] = real(NONNEGATIVE)(value[group], ctx)
        except Invalid as error:
            raise Invalid(f"{group}: {error}") from None
    return resolved


def layered_lengths(model: dict) -> dict[str, int]:
    """{key: L} of every key of a resolved [model] given as a list of per-layer values ("model.B",
    "model.extra_heads[h].V", ...): the keys that make the model vary over depth."""
    ranks = {"B": 2, "V": 2, "W": 2, "W1": 2, "b": 1, "W2": 2}
    values = [(f"model.{key}", model[key], rank) for key, rank in ranks.items() if key in model]
    for h, head in enumerate(model.get("extra_heads", ())):
        values += [(f"model.extra_heads[{h}].{key}", head[key], 2) for key in ("B", "V")]
    return {name: len(value) for name, value, rank in values if list_depth(value) == rank + 1}
