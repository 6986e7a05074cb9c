"""The reference pages generated from the code at every docs build, never kept by hand.

* case keys: spherepde.io.case_schema.SCHEMA (the keys, their parsers and defaults) joined with the schema table of
  that module's docstring (each key's type, check and meaning);
* output variables and attributes: the Datasets that small runs of every kind actually write (Eulerian on S^1 and
  S^2, particles, ``--solver both``, both trainings, a ``compare`` report): each variable with its dimensions,
  ``units`` and ``long_name`` (declared where the code builds it: spherepde/io/output.py and the solvers), each
  global attribute with its meaning from ``output_attributes.toml`` beside this file;
* the command line: the argparse parser of spherepde/cli.py (every option with its help).

``tests/test_docs_reference.py`` checks that nothing is missing or undocumented; ``conf.py`` calls
``write_pages`` when the build starts.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import math
import pathlib
import re
import tomllib
import warnings
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
REPOSITORY = HERE.parent.parent
ATTRIBUTES_FILE = HERE / "output_attributes.toml"


def rst_escape(text: str) -> str:
    """Plain text as reStructuredText reads it literally (formulas such as |P_E x|^2 or B^T x / |B^T x|)."""
    return re.sub(r"([\\*`|_\[\]])", r"\\\1", " ".join(str(text).split()))


def _list_table(header: list[str], rows: list[list[str]], widths: list[int]) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", "   :class: generated-reference",
             f"   :widths: {' '.join(map(str, widths))}", ""]
    for row in [header] + rows:
        lines.append(f"   * - {row[0] or ' '}")
        lines.extend(f"     - {cell or ' '}" for cell in row[1:])
    return lines + [""]


def _title(text: str, underline: str = "=") -> list[str]:
    return [text, underline * len(text), ""]


# ---------------------------------------------------------------------------------------------------- case keys


@dataclass(frozen=True)
class CaseKey:
    """One key of a case file as the reference shows it."""

    name: str          # section.key
    parsed_as: str     # derived from its parser in the code
    default: str       # the code's default (a TOML literal), or what the schema table says it is computed as
    documentation: str  # "type and check" from the schema table of spherepde/io/case_schema.py ("" if missing)
    documented_default: str


def schema_table() -> dict[str, tuple[str, str]]:
    """The table of case_schema's docstring as {key: (type and check, default)}; a row naming several keys
    ("model.B, model.V") documents each of them."""
    from spherepde.io import case_schema

    lines = case_schema.__doc__.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+( +=+)+", line.strip())]
    starts = [match.start() for match in re.finditer(r"=+", lines[rules[0]])]
    rows: list[list[str]] = []
    for line in lines[rules[1] + 1:rules[2]]:
        cells = _row_cells(line, starts)
        if cells[0]:
            rows.append(cells)
        elif rows:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells)]
    table = {}
    for key_cell, check, default in rows:
        for key in key_cell.split(","):
            table[key.strip()] = (check, default)
    return table


def _row_cells(line: str, starts: list[int]) -> list[str]:
    """The three cells of a line of the schema table: split at the columns' starts, except that a cell that runs
    past its column ends where two spaces precede the next one, nearest the column's start."""
    key, rest = line[:starts[1]].strip(), line[starts[1]:]
    column = starts[2] - starts[1]
    if len(rest) <= column or rest[column - 1] == " ":
        split = min(column, len(rest))
    else:
        candidates = [match.end() for match in re.finditer(r"  +(?=\S)", rest) if abs(match.end() - column) <= 8]
        split = min(candidates, key=lambda end: abs(end - column)) if candidates else len(rest)
    return [key, rest[:split].strip(), rest[split:].strip()]


def _parsed_as(parse) -> str:
    """What a key's parser accepts, read from the parser itself (the factories of spherepde/io/case_values.py
    keep their arguments in the closure)."""
    factory = parse.__qualname__.split(".<locals>")[0]
    cells = [cell.cell_contents for cell in (parse.__closure__ or ())]
    if factory == "choice":
        return " | ".join(f'"{option}"' for option in cells[0])
    if factory in ("integer", "real", "reals"):
        kind = {"integer": "int", "real": "real", "reals": "list of reals"}[factory]
        interval = cells[0] if cells else None
        return f"{kind} {interval}" if interval else kind
    if factory == "distinct":
        return "distinct " + _parsed_as(cells[0])
    return parse.__name__.strip("_").replace("_", " ")


def _toml_literal(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float) and math.isinf(value):
        return '"inf"'
    return repr(value)


def case_keys() -> list[CaseKey]:
    """Every key of spherepde.io.case_schema.SCHEMA, in resolution order."""
    from spherepde.io import case_schema

    table = schema_table()
    keys = []
    for section in case_schema.SCHEMA:
        for key in section.keys:
            name = f"{section.name}.{key.name}"
            check, documented_default = table.get(name, ("", ""))
            if key.default is case_schema.REQUIRED:
                default = "required"
            elif key.default is case_schema.ABSENT:
                default = documented_default if documented_default.startswith("absent") else "absent"
            elif callable(key.default):
                default = f"computed: {documented_default}"
            else:
                literal = _toml_literal(key.default)
                default = documented_default if documents_default(literal, documented_default) else literal
            keys.append(CaseKey(name, _parsed_as(key.parse), default, check, documented_default))
    return keys


def documents_default(literal: str, documented: str) -> bool:
    """Whether the schema table's default `documented` states the code's `literal` (and may explain it: '"auto":
    imex-ark436 when eps > 0, else rk4', '0 (never)'): its first word is that literal, or that number."""
    first = re.split(r"[\s:(]", documented.strip(), maxsplit=1)[0]
    if first == literal:
        return True
    try:
        return float(first) == float(literal)
    except ValueError:
        return False


def case_keys_page() -> str:
    from spherepde.io import case_schema

    table = schema_table()
    lines = _title("Case keys") + [
        "Generated at every build from ``spherepde/io/case_schema.py``: the keys, their parsers and defaults from",
        "``SCHEMA``, the type, check and meaning of each from the schema table of that module's docstring. A key",
        "not given takes its default; *required* keys have none; *absent* keys are left out of the resolved case.",
        "Any key can be overridden with ``--set section.key=value`` (the value parsed as TOML) or",
        "``spherepde.load_case(path, overrides=[...])``; see :doc:`/guide/case-files`.", ""]
    by_section: dict[str, list[CaseKey]] = {}
    for key in case_keys():
        by_section.setdefault(key.name.split(".")[0], []).append(key)
    for section in case_schema.SCHEMA:
        lines += _title(f"[{section.name}]", "-")
        if section.optional:
            lines += [rst_escape(table.get(section.name, ("", ""))[0]), ""]
        rows = [[f"``{key.name}``", rst_escape(key.documentation), rst_escape(key.default),
                 f"``{key.parsed_as}``"] for key in by_section.get(section.name, [])]
        lines += _list_table(["key", "type, check and meaning", "default", "parsed as (from the code)"], rows,
                             [22, 48, 18, 16])
        if section.rules is not None and section.rules.__doc__:
            lines += [f"Rules across keys: {rst_escape(section.rules.__doc__)}", ""]
    lines += _title("Rules of the whole case", "-")
    lines += [rst_escape(paragraph) + "\n" for paragraph in _after_table(case_schema.__doc__).split("\n\n")
              if paragraph.strip()]
    return "\n".join(lines)


def _after_table(doc: str) -> str:
    """The prose after the schema table (the rules of the whole case)."""
    rule = [line for line in doc.splitlines() if re.fullmatch(r"=+( +=+)+", line.strip())][-1]
    return doc.rsplit(rule, 1)[-1]


# ---------------------------------------------------------------------------------------------------- outputs

SAMPLE_RUNS = {  # small runs of every kind of output: (label, case file, overrides)
    "eulerian S^1": ("cases/kuramoto-s1.toml", ["sphere.lmax=16", "time.t_end=1.0", "time.save_every=0.5"]),
    "eulerian S^2": ("cases/quickstart.toml", ["sphere.lmax=12", "time.t_end=0.5", "time.save_every=0.25"]),
    "particles": ("cases/kuramoto-s1.toml", ["time.t_end=1.0", "time.save_every=0.5", "solver.method='particles'",
                                             "particles.n=200", "particles.replicas=2"]),
    "both": ("cases/kuramoto-s1.toml", ["sphere.lmax=16", "time.t_end=1.0", "time.save_every=0.5",
                                        "solver.method='both'", "particles.n=200"]),
    "training": ("cases/seed004-align-l065.toml", ["sphere.lmax=16", "time.t_end=1.0", "time.dt=0.1",
                                                   "time.save_every=0.5", "control.layers=2", "control.iterations=2",
                                                   "control.save_adjoint=true"]),
    "particle training": ("cases/seed004-align-l065.toml", ["time.t_end=1.0", "time.dt=0.1", "time.save_every=0.5",
                                                            "control.layers=2", "control.iterations=2",
                                                            "solver.method='particles'", "particles.n=100"]),
    "training beyond the seeds": ("cases/beyond-align-mlp.toml", [
        "sphere.lmax=16", "time.t_end=1.0", "time.dt=0.1", "time.save_every=0.5", "control.layers=2",
        "control.iterations=2", "control.train=['W', 'B', 'V']", "model.hidden=3",
        "model.extra_heads=[{kernel = 'softmax', beta = 2.0}]"]),
}
COMPARE_REPORT = "compare report"
SWEEP = "sweep"  # a combined sweep file: SWEEP_RUN's case swept over SWEEP_PARAMS
SWEEP_RUN = ("cases/kuramoto-s1.toml", ["sphere.lmax=16", "time.t_end=0.5", "time.save_every=0.25"])
SWEEP_PARAMS = ["model.eps=0.2,0.4", "model.beta=0.0,1.0"]


@functools.cache
def sample_outputs() -> dict:
    """{kind: Dataset} of the small runs of SAMPLE_RUNS, the compare report of the "both" run and a combined sweep
    file (one Dask worker)."""
    import tempfile

    import xarray as xr

    import spherepde
    from spherepde.analysis.compare import compare
    from spherepde.api.sweep import run_sweep
    from spherepde.io.output import split_both

    outputs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the tiny grids lose resolution: irrelevant to names
        for kind, (path, overrides) in SAMPLE_RUNS.items():
            case = spherepde.load_case(str(REPOSITORY / path), overrides=overrides)
            outputs[kind] = spherepde.run(case)
        outputs[COMPARE_REPORT] = compare(*split_both(outputs["both"]))
        path, overrides = SWEEP_RUN
        with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stderr(io.StringIO()):  # its progress
            case = spherepde.load_case(str(REPOSITORY / path), overrides=overrides)
            outputs[SWEEP] = xr.load_dataset(run_sweep(case, SWEEP_PARAMS, folder, workers=1))
    return outputs


def _diagnostic_names() -> list[str]:
    from spherepde.io.output import DIAGNOSTIC_ATTRS

    return sorted(DIAGNOSTIC_ATTRS, key=len, reverse=True)


# the variables derived from each diagnostic: a particle run's standard errors and W2 bias, a compare report's
DERIVED_SUFFIXES = ("_stderr", "_squared_bias", "_a", "_b", "_difference", "_z", "_dof", "_bias")


def pattern(name: str, kind: str) -> str:
    """The row of the reference that documents `name`: a diagnostic's derived variables (`<name>_stderr`,
    `particles_<name>`, `verdict_<name>`, ...) share one row, the diagnostic itself standing for <diagnostic>."""
    from spherepde.api.sweep import COMBINED_ELSEWHERE, MEMBER_PREFIX
    from spherepde.io.output import BOTH_PREFIX

    if kind == SWEEP and name in sample_outputs()[SWEEP].attrs["swept"].split():
        return "<section>_<key>"
    if kind == SWEEP and name.startswith(MEMBER_PREFIX) and name.removeprefix(MEMBER_PREFIX) not in COMBINED_ELSEWHERE:
        # the attributes the members do not share (sweep.member_attributes): which ones depends on the sweep (a
        # seeded particle sweep's seed and w2_quantisation_bound, a training's iterations), one row for all
        return MEMBER_PREFIX + "<name>"
    if kind == "both" and name.startswith(BOTH_PREFIX) and name != "particles":
        return BOTH_PREFIX + "<name>"
    for diagnostic in _diagnostic_names():
        for prefix in ("verdict_", "max_z_probability_", "tolerance_"):
            if name == prefix + diagnostic:
                return f"{prefix}<diagnostic>"
        for suffix in DERIVED_SUFFIXES:
            if name == diagnostic + suffix:
                return f"<diagnostic>{suffix}"
    return name


@dataclass
class OutputName:
    """One row of the output reference: a name (or a pattern of names) and the kinds of file that hold it, with
    its meanings (one per kind of file that means something else by it)."""

    name: str
    kinds: list
    dims: str = ""
    units: str = ""
    meanings: dict | None = None  # {meaning: [kinds]}
    example: str = ""

    def add(self, kind: str, meaning: str) -> None:
        self.kinds.append(kind)
        self.meanings.setdefault(meaning, []).append(kind)

    @property
    def meaning(self) -> str:
        if len(self.meanings) == 1:
            return next(iter(self.meanings))
        return "; ".join(f"{meaning} ({_written_by(kinds)})" for meaning, kinds in self.meanings.items())


def _generic(text: str, name: str) -> str:
    """The long_name of a diagnostic's derived variable with the diagnostic named <diagnostic>."""
    from spherepde.io.output import DIAGNOSTIC_ATTRS

    for diagnostic in _diagnostic_names():
        if name.startswith(diagnostic + "_"):
            text = text.replace(DIAGNOSTIC_ATTRS[diagnostic][0], "the long_name of <diagnostic>")
            return re.sub(rf"\b{re.escape(diagnostic)}\b", "<diagnostic>", text)
    return text


def output_variables() -> dict[str, OutputName]:
    """Every variable (coordinates included) the sample outputs hold, by reference row."""
    rows: dict[str, OutputName] = {}
    for kind, dataset in sample_outputs().items():
        for name, variable in dataset.variables.items():
            row = pattern(name, kind)
            if row.startswith("particles_<"):
                meaning = "the particle run's variable <name>, beside the Eulerian run's <name>"
            elif row == "<section>_<key>":
                meaning = "the swept case key <section>.<key>: each member's value"
            elif row == "member_<name>":
                meaning = ("the global attribute <name> of each member's file, where the members' values differ "
                           "(integers exact; other numbers as floats, NaN where a member lacks it; texts, \"\" there)")
            else:
                meaning = variable.attrs.get("long_name", "")
                meaning = _generic(meaning, name) if row != name else meaning
            dims = ", ".join(variable.dims) if "<" not in row or row in ("<section>_<key>", "member_<name>") else \
                "those of <name>" if row.startswith("particles_<") else "those of <diagnostic>"
            units = variable.attrs.get("units", "")
            if row not in rows:
                rows[row] = OutputName(row, [], dims, units, {})
            for field, value in (("dims", dims), ("units", units)):  # S^1 and S^2 differ: "time, theta or ..."
                known = getattr(rows[row], field)
                if value and value not in known.split(" or "):
                    setattr(rows[row], field, f"{known} or {value}" if known else value)
            if kind not in rows[row].kinds:
                rows[row].add(kind, meaning)
    return rows


def attribute_meanings() -> dict[str, str]:
    with open(ATTRIBUTES_FILE, "rb") as file:
        return tomllib.load(file)


def output_attributes() -> dict[str, OutputName]:
    """Every global attribute the sample outputs hold, by reference row, with its meaning (output_attributes.toml)."""
    meanings = attribute_meanings()
    rows: dict[str, OutputName] = {}
    for kind, dataset in sample_outputs().items():
        for name, value in dataset.attrs.items():
            row = pattern(name, kind)
            if row not in rows:
                example = value if not isinstance(value, str) or len(value) <= 40 else value[:37] + "..."
                shown = "" if name in LONG_ATTRIBUTES or row.startswith("particles_<") else repr(example)
                rows[row] = OutputName(row, [], meanings={}, example=shown)
            if kind not in rows[row].kinds:
                rows[row].add(kind, meanings.get(row, ""))
    return rows


LONG_ATTRIBUTES = ("case", "case_a", "case_b", "report", "notes", "history")  # texts of many lines: no example


KIND_LABELS = {"eulerian S^1": "S1", "eulerian S^2": "S2", "particles": "P", "both": "B", "training": "T",
               "particle training": "PT", COMPARE_REPORT: "C", SWEEP: "SW"}


def _written_by(kinds: list[str]) -> str:
    runs = [kind for kind in KIND_LABELS if kind != COMPARE_REPORT]
    if set(runs) <= set(kinds):
        return "every file" if COMPARE_REPORT in kinds else "every run"
    return " ".join(KIND_LABELS[kind] for kind in KIND_LABELS if kind in kinds)


def output_page() -> str:
    legend = "; ".join(f"{label} = {kind}" for kind, label in KIND_LABELS.items())
    lines = _title("Output variables and attributes") + [
        "Generated at every build from the files the code writes: small runs of every kind are made during the",
        "build, and every variable and global attribute they hold is listed with the kinds of file that hold it",
        f"(*written by*: {rst_escape(legend)}). A variable's dimensions, ``units`` and meaning (its ``long_name``)",
        "are those the code declares where it builds the Dataset (``spherepde/io/output.py``,",
        "``solvers/training_output.py``, ``spherepde/analysis/compare.py``); ``<diagnostic>`` stands for each of",
        "the diagnostics of :doc:`docs/design.md </design>` \"Diagnostics\" that the file holds. Reading them:",
        ":doc:`/guide/outputs`.", ""]
    lines += _title("Variables and coordinates", "-")
    rows = [[f"``{row.name}``", rst_escape(row.dims), rst_escape(row.units), rst_escape(row.meaning),
             _written_by(row.kinds)] for row in output_variables().values()]
    lines += _list_table(["name", "dimensions", "units", "meaning (long_name)", "written by"], rows,
                         [22, 14, 8, 44, 12])
    lines += _title("Global attributes", "-")
    rows = [[f"``{row.name}``", rst_escape(row.meaning), f"``{row.example}``" if row.example else "",
             _written_by(row.kinds)] for row in output_attributes().values()]
    lines += _list_table(["name", "meaning", "example", "written by"], rows, [22, 50, 16, 12])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- command line


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_options() -> dict[str, list[argparse.Action]]:
    """{command: its arguments}; "spherepde" is the program itself (its --version)."""
    from spherepde.cli import build_parser

    parser = build_parser()
    commands = {"spherepde": parser} | {f"spherepde {name}": sub for name, sub in _subcommands(parser).items()}
    return {name: [action for action in command._actions if not isinstance(action, argparse._SubParsersAction)
                   and not isinstance(action, argparse._HelpAction)] for name, command in commands.items()}


def _argument_form(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    form = ", ".join(action.option_strings)
    if action.nargs != 0:
        form += " " + (action.metavar or (("{" + ",".join(action.choices) + "}") if action.choices
                                           else action.dest.upper()))
    return form


def cli_page() -> str:
    from spherepde.cli import build_parser

    parser = build_parser()
    commands = {"spherepde": parser} | {f"spherepde {name}": sub for name, sub in _subcommands(parser).items()}
    lines = _title("Command line") + [
        "Generated at every build from the argument parser of ``spherepde/cli.py`` (``build_parser``). The same text",
        "is what ``spherepde COMMAND --help`` prints. ``python3 -m spherepde`` is the same program.", ""]
    for name, command in commands.items():
        lines += _title(name if name != "spherepde" else "spherepde (the program)", "-")
        lines += [rst_escape(command.description or ""), "", ".. code-block:: text", ""]
        lines += ["   " + line for line in command.format_usage().strip().splitlines()] + [""]
        rows = []
        for action in cli_options()[name]:
            default = "" if action.default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0 else \
                f"``{action.default}``"
            choices = " | ".join(map(str, action.choices)) if action.choices else ""
            rows.append([f"``{_argument_form(action)}``", rst_escape(action.help or ""), rst_escape(choices),
                         default, "yes" if action.required or not action.option_strings and action.nargs != "?"
                         else ""])
        lines += _list_table(["argument", "meaning", "choices", "default", "required"], rows, [24, 42, 12, 10, 12])
        if command.epilog:
            lines += [".. code-block:: text", ""] + ["   " + line for line in command.epilog.splitlines()] + [""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- the build

PAGES = {"case_keys.rst": case_keys_page, "output.rst": output_page, "cli.rst": cli_page}


def write_pages(folder: pathlib.Path) -> None:
    """Write the generated pages into `folder` (rewriting only those whose text changed, so that Sphinx does not
    rebuild them needlessly)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, page in PAGES.items():
        text = page() + "\n"
        path = folder / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
