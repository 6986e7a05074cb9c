"""Case files: TOML text -> a validated, fully resolved :class:`Case` (docs/design.md "Case files").

A case is resolved once, here: every section and key is present in ``Case.data``, every
default filled in, every value normalised (ints to floats where a real is expected,
``beta = "inf"`` to ``math.inf``, unit mean directions, weights summing to 1, absolute
file paths). Everything downstream reads ``case["section"]["key"]`` and never re-checks: the
edits of a case's data in place (a notebook's ``case["model"]["eps"] = 0.2``) are applied as
overrides by ``Case.checked()`` before it runs, and by ``with_overrides``.
``Case.text`` serialises the resolved case back to TOML, and reloading it gives the same
data exactly (floats are written with ``repr``, so they round-trip bit for bit).

Every problem raises :class:`~spherepde.base.errors.CaseError` with one line naming the key,
prefixed by the case file (or the ``origin`` given for text).

The keys of a case file, their checks and their defaults are declared and documented in
:mod:`spherepde.io.case_schema` (with each section's cross-key rules in spherepde.io.case_rules); the value
parsers are in spherepde.io.case_values, the files a case names are checked in spherepde.io.case_files, and
spherepde.io.case_toml writes ``Case.text``.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import os
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spherepde.base.errors import CaseError, printable
from spherepde.io.case_files import regular_file_problem
from spherepde.io.case_schema import ABSENT, REQUIRED, SCHEMA, Section
from spherepde.io.case_toml import dumps, toml_value
from spherepde.io.case_values import LINE_QUOTED, Context, Inputs, Invalid, describe, shortened

__all__ = ["Case", "load_case", "load_case_text", "case_from_dict", "parse_override", "format_override"]


# ---------------------------------------------------------------------------------------
# The Case object and the loaders
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One run, validated and fully resolved. Build it with the loaders of this module."""

    data: dict
    source: str  # the user's TOML text before overrides ("" when built from a dict)
    origin: str  # the file (or label) the case came from; prefixes error messages
    inputs: Inputs = field(repr=False, compare=False)
    resolved: dict = field(default_factory=dict, repr=False, compare=False)  # `data` as resolved (a copy)

    @property
    def text(self) -> str:
        """The resolved case as TOML; ``load_case_text(case.text).data == case.checked().data``: an in-place edit of
        `data` is written as the run would take it (its value checked, a CaseError naming a bad one, and what depends
        on it derived anew), never the edited table as it stands."""
        return dumps(self.checked().data)

    @property
    def dim(self) -> int:
        return self.data["sphere"]["dim"]

    @property
    def name(self) -> str:
        return self.data["case"]["name"]

    def __getitem__(self, section: str) -> dict:
        return self.data[section]

    def named(self, error: CaseError) -> CaseError:
        """`error`, about this case, prefixed by its origin as the loaders prefix their own (unless it is)."""
        prefix = f"{self.origin}: "
        return error if str(error).startswith(prefix) else CaseError(prefix + str(error))

    @contextlib.contextmanager
    def naming_errors(self):
        """A CaseError raised in the block about this case (a check that needs the grid or the model built: the
        resolution, the memory) `named`."""
        try:
            yield
        except CaseError as error:
            raise self.named(error) from None

    def edited(self) -> bool:
        """Whether `data` was changed in place since it was resolved (a notebook's ``case["model"]["eps"] = 0.2``),
        types told apart (lmax 8.0 for 8, an array for the list it equals)."""
        return not _same(self.data, self.resolved)

    def edits(self) -> tuple[list[tuple[tuple[str, str], Any]], list[tuple[str, str]]]:
        """The in-place edits of `data` since it was resolved: the keys set, as ((section, key), value), and the keys
        deleted, as (section, key); a CaseError for a section that is no table or a key that is no string."""
        edits, deleted = [], []
        for section in [*self.data, *(name for name in self.resolved if name not in self.data)]:
            if section not in self.resolved:  # a resolved case holds every section of the schema
                raise CaseError(f"unknown section [{section}] (expected one of {', '.join(self.resolved)})")
            now, then = self.data.get(section, {}), self.resolved[section]
            if not isinstance(now, dict):
                raise CaseError(f"[{section}]: a section is a table of keys, got {type(now).__name__}")
            for key, value in now.items():
                if not isinstance(key, str):
                    raise CaseError(f"[{section}]: keys are strings, got {key!r}")
                value = _plain(value)
                if key not in then or not _same(value, then[key]):
                    edits.append(((section, key), value))
            deleted += [(section, key) for key in then if key not in now]
        return edits, deleted

    def checked(self) -> Case:
        """This case, or where `data` was edited in place, the case its loader gives with the edits set as `--set`
        sets them: the values checked (a CaseError naming a bad one) and what depends on them derived anew
        (time.dt replacing time.cfl, model.ffn_seed drawing W1 again).  Every run starts from it.  An edit inside
        a list of tables (model.extra_heads) sets the whole list as resolved: what its heads took from head 0
        (beta, kernel) is then fixed, where a --set of head 0's key would still reach them."""
        if not self.edited():
            return self
        try:
            edits, deleted = self.edits()
        except CaseError as error:
            raise self.named(error) from None
        table = copy.deepcopy(self.inputs.table)
        for section, key in deleted:  # a deleted key takes its default again
            if isinstance(table.get(section), dict):
                table[section].pop(key, None)
        return _build(table, (), self.source, self.origin, self.inputs.base_dir, self.inputs.default_name, edits)

    def with_overrides(self, overrides: Iterable[str]) -> Case:
        """A new validated case with "section.key=value" overrides applied on top of this one (on top of its
        edits in place, `checked`), on the table it was resolved from, so that defaults follow them."""
        case = self.checked()
        return _build(case.inputs.table, overrides, case.source, case.origin, case.inputs.base_dir,
                      case.inputs.default_name)


def _same(a, b) -> bool:
    """Equality that tells types apart (8 from 8.0, True from 1, an array from a list), through tables and lists."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def load_case(path: str | os.PathLike, overrides: Iterable[str] = ()) -> Case:
    """Read a case file; relative ``initial.path`` values start from the file's directory."""
    path = Path(path)
    content = _read_case_file(path)
    if content.startswith(NETCDF_SIGNATURES):
        raise CaseError(f"cannot read case file {str(path)!r}: a NetCDF file (a result?), not a case; a result's "
                        f"case is its attribute `case`: spherepde.load_case_text(ds.attrs['case'])")
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CaseError(f"cannot read case file {str(path)!r}: not UTF-8 text "
                        f"({error.reason} at byte {error.start})") from None
    return _load_text(text, overrides, str(path), path.parent, path.stem)


NETCDF_SIGNATURES = (b"\x89HDF\r\n\x1a\n", b"CDF\x01", b"CDF\x02", b"CDF\x05")  # NetCDF-4 (HDF5), classic, 64-bit
MAX_CASE_BYTES = 16 << 20  # three d x d matrices at full precision up to d ~ 500; a larger file is no case file


def _read_case_file(path: Path) -> bytes:
    """The bytes of a case file: a regular file (a device such as /dev/zero, a pipe or a folder would be read
    without end or not at all) of at most MAX_CASE_BYTES; a one-line CaseError otherwise."""
    try:
        problem = regular_file_problem(path, MAX_CASE_BYTES)
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
        raise CaseError(f"override {shortened(item)!r}: expected section.key=value")
    value = value.strip()
    try:
        return path, tomllib.loads("v = " + value)["v"]
    except tomllib.TOMLDecodeError:
        return path, value
    except RecursionError:
        raise CaseError(f"override {item[:60]!r}...: {_TOO_DEEP}") from None
    except ValueError:  # tomllib's int() of a literal beyond Python's digit limit, not a TOMLDecodeError
        raise CaseError(f"override {shortened(item)!r}: malformed TOML: {_TOO_LONG}") from None


def format_override(key: str, value) -> str:
    """"section.key=value" with the value written as TOML: parse_override gives back (key, value)."""
    return f"{key}={toml_value(value)}"


def _load_text(text, overrides, origin, base_dir, default_name) -> Case:
    if not isinstance(text, str):
        raise CaseError(f"{origin}: a case's text is a string of TOML, got {type(text).__name__}")
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CaseError(f"{origin}: {_describe_toml_error(error, text)}") from None
    except RecursionError:
        raise CaseError(f"{origin}: {_TOO_DEEP}") from None
    except ValueError:  # tomllib's int() of a literal beyond Python's digit limit, not a TOMLDecodeError
        raise CaseError(f"{origin}: malformed TOML{_long_integer(text)}: {_TOO_LONG}") from None
    return _build(table, overrides, text, origin, base_dir, default_name)


MAX_NESTING = 8  # tables and lists inside one another: a case needs 3 (a section, a matrix, its rows)
_TOO_DEEP = (f"malformed TOML: arrays or tables nested inside one another more deeply than a case needs "
             f"(at most {MAX_NESTING} levels)")
_TOO_LONG = f"an integer of more than {sys.get_int_max_str_digits()} digits, which Python cannot read"


def _long_integer(text: str) -> str:
    """" at line 4 (`the line`)" for the first line of `text` holding a run of digits longer than Python reads (tomllib
    names no place), or ""."""
    too_long = re.compile(rf"[0-9_]{{{sys.get_int_max_str_digits() + 1},}}")
    for number, line in enumerate(text.split("\n"), 1):
        if too_long.search(line):
            return f" at line {number} (`{printable(line.strip()[:LINE_QUOTED])}`)"
    return ""


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


def _build(table, overrides, source, origin, base_dir, default_name, edits=()) -> Case:
    """Apply the edits and the overrides (`_with_overrides`), resolve, and prefix any error with the origin."""
    try:
        if not isinstance(table, dict):
            raise CaseError(f"a case is a table of [sections], got {type(table).__name__}")
        _check_nesting(table)
        overridden, given = _with_overrides(table, overrides, edits)
        _check_nesting(overridden)  # dotted keys of --set nest tables too
        inputs = Inputs(overridden, base_dir, default_name, frozenset(given))
        data = _resolve(inputs)
        return Case(data, source, origin, inputs, copy.deepcopy(data))
    except CaseError as error:
        raise CaseError(f"{origin}: {error}") from None


def _plain(value):
    """A table's numpy arrays and scalars (a notebook's np.eye(2) for model.V) as the lists and numbers TOML gives."""
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise CaseError(f"table keys are strings, got {key!r}")
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    if hasattr(value, "__array__") and not isinstance(value, (str, bytes)):  # an xarray DataArray, a torch tensor
        try:
            return np.asarray(value).tolist()
        except (TypeError, ValueError, RuntimeError) as error:  # a tensor that requires grad, one on a GPU
            raise CaseError(f"cannot read a {type(value).__name__} as a value: {error}") from None
    return value


def _describe_toml_error(error: tomllib.TOMLDecodeError, text: str) -> str:
    """tomllib's "What (at line 4, column 9)" as "malformed TOML at line 4, column 9 (`the line`): What": the line
    quoted, since tomllib names no key ("Cannot overwrite a value" for a key given twice)."""
    match = re.fullmatch(r"(.*) \((at line (\d+), column \d+|at end of document)\)", str(error))
    if match is None:
        return f"malformed TOML: {error}"
    lines = text.split("\n")  # tomllib counts newlines alone (splitlines also cuts at \r, \f, ...)
    number = int(match[3]) if match[3] else 0
    line = lines[number - 1].strip() if 1 <= number <= len(lines) else ""
    quoted = f" (`{printable(line[:LINE_QUOTED])}`)" if line else ""
    return f"malformed TOML {match[2]}{quoted}: {match[1]}"


# Keys of which a case gives one (case_rules): an override of one replaces the other where the table gave it, so
# that `--set time.dt=0.01` runs a case file written with time.cfl.
ALTERNATIVE_KEYS = {("time", "dt"): "cfl", ("time", "cfl"): "dt"}


def _with_overrides(table: dict, overrides: Iterable[str], edits=()) -> tuple[dict, set]:
    """A copy of the table, its numpy values as TOML's (`_plain`), with each edit ((section, key), value)
    (Case.edits), then each override "section.key=value", set; a key set replaces its alternative
    (ALTERNATIVE_KEYS) unless that is set too.  Unknown keys are caught by resolution.  Also the paths set."""
    if isinstance(overrides, str):
        overrides = (overrides,)
    table = _plain(table)  # new tables and lists throughout: the caller's stay as they are
    given = set()
    if not isinstance(overrides or (), Iterable):
        raise CaseError(f"overrides: expected a list of strings section.key=value, got {overrides!r}")
    settings = [(path, value, ".".join(path)) for path, value in edits]
    for item in overrides or ():
        if not isinstance(item, str):
            raise CaseError(f"override {item!r}: expected a string section.key=value")
        settings.append((*parse_override(item), f"override {item!r}"))
    for path, value, named in settings:
        parent = table
        for depth, part in enumerate(path[:-1]):
            parent = parent.setdefault(part, {})
            if not isinstance(parent, dict):
                raise CaseError(f"{named}: {'.'.join(path[:depth + 1])!r} is not a table")
        parent[path[-1]] = value
        given.add(path)
        alternative = ALTERNATIVE_KEYS.get(path)
        if alternative is not None and path[:-1] + (alternative,) not in given:
            parent.pop(alternative, None)
    return table, given


# ---------------------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------------------


def _unknown(what: str, shown: str, name: str, known: list[str]) -> CaseError:
    """"unknown key 'model.bta' (did you mean 'beta'?)", or the list of known names."""
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"expected one of {', '.join(known)}"
    return CaseError(f"unknown {what} {shortened(shown)!r} ({hint})")


def _outside_sections(name: str) -> CaseError:
    """A key written above the first [section] header: TOML puts it in no table, so it is named as a key, with the
    sections holding a key of that name, if any do."""
    owners = [section.name for section in SCHEMA if any(key.name == name for key in section.keys)]
    where = f"write it under {' or '.join(f'[{owner}]' for owner in owners)}" if owners else (
        "keys belong under a [section] header")
    return CaseError(f"key {shortened(name)!r} is outside any section ({where})")


def _resolve(inputs: Inputs) -> dict:
    """Every section of the schema, in order, resolved from the user's table."""
    table = inputs.table
    names = [section.name for section in SCHEMA]
    for name, value in table.items():
        if name not in names:
            raise _unknown("section", name, name, names) if isinstance(value, dict) else _outside_sections(name)
    ctx = Context(data={}, section={}, inputs=inputs)
    for section in SCHEMA:
        given = table.get(section.name, {})
        if not isinstance(given, dict):
            raise CaseError(f"{section.name}: expected a table [{section.name}], got {describe(given)}")
        if section.optional and not given:
            ctx.data[section.name] = {}
        else:
            ctx.data[section.name] = _resolve_section(section, given, ctx)
    return ctx.data


def _resolve_section(section: Section, given: dict, ctx: Context) -> dict:
    known = [key.name for key in section.keys]
    for name in given:
        if name not in known:
            raise _unknown("key", f"{section.name}.{name}", name, known)
    ctx.section = resolved = {}
    for key in section.keys:
        path = f"{section.name}.{key.name}"
        reason = key.unused(ctx)
        if reason is not None:
            # the default let through as the very value (type too: 0 for control.save_adjoint's false is no bool)
            if key.name in given and not (key.default_passes and _same(given[key.name], key.default)):
                if _replaced_by_override(key, section.name, ctx.inputs.overridden):
                    del given[key.name]  # from the inputs' table too: a later with_overrides starts without it
                    continue
                raise CaseError(f"{path}: {reason}")
            continue
        if key.name in given:
            value = _parsed(path, key.parse, given[key.name], ctx)
        elif key.default is REQUIRED:
            raise CaseError(f"{path}: required key is missing")
        else:
            value = key.default(ctx) if callable(key.default) else key.default
        if value is not ABSENT:
            resolved[key.name] = value
    if section.rules is not None:
        section.rules(resolved, ctx)
    return resolved


def _replaced_by_override(key, section: str, overridden: frozenset) -> bool:
    """Whether a key the case gives but does not use belongs to what an override replaced: its selector (the key
    whose value decides whether it is used: initial.kind, control.loss, model.feed_forward, solver.method) was
    overridden and the key itself was not.  Then `--set initial.kind="uniform"` on a vMF case file drops the file's
    mean and kappa, as `--set time.dt=...` drops its time.cfl, and a sweep may run initial laws of several kinds."""
    selector = getattr(key.unused, "selector", None)
    return selector in overridden and (section, key.name) not in overridden


def _parsed(path: str, parse, value, ctx: Context):
    try:
        return parse(value, ctx)
    except Invalid as error:
        raise CaseError(f"{path}: {error}") from None
