"""The generated references of the docs (docs/_ext/spherepde_reference.py) miss nothing and document everything:
every case key of the schema, every variable and attribute the code writes, every option of the command line."""

import pathlib
import re
import sys

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import spherepde_reference as reference  # noqa: E402


def _literals(page: str) -> set[str]:
    """The names a generated page shows in its tables (the ``...`` of each row's first cell)."""
    return set(re.findall(r"^   \* - ``(.+?)``$", page, re.M))


def test_every_case_key_is_in_the_reference_with_its_documentation():
    from spherepde.io.case_schema import SCHEMA

    keys = [f"{section.name}.{key.name}" for section in SCHEMA for key in section.keys]
    shown = _literals(reference.case_keys_page())
    assert [key for key in keys if key not in shown] == []
    undocumented = [key.name for key in reference.case_keys() if not key.documentation or not key.documented_default]
    assert undocumented == [], "keys without a row in the schema table of spherepde/io/case_schema.py's docstring"
    sections = {section.name for section in SCHEMA}
    stale = [row for row in reference.schema_table() if row not in keys and row not in sections]
    assert stale == [], "rows of the schema table that name no key of SCHEMA"


def test_the_schema_tables_defaults_are_the_codes():
    """A default changed in SCHEMA and not in the schema table (or the other way) fails here: the reference and
    `spherepde run --help` point users to that table."""
    from spherepde.io.case_schema import ABSENT, REQUIRED, SCHEMA

    table = reference.schema_table()
    stale = []
    for section in SCHEMA:
        for key in section.keys:
            documented = table.get(f"{section.name}.{key.name}", ("", ""))[1]
            if key.default is REQUIRED or key.default is ABSENT:
                code = "required" if key.default is REQUIRED else "absent"
                agrees = documented.startswith(code)
            elif callable(key.default):
                continue  # computed: the table says how, in words
            else:
                agrees = reference.documents_default(reference._toml_literal(key.default), documented)
            if not agrees:
                stale.append(f"{section.name}.{key.name}: code {key.default!r}, table {documented!r}")
    assert stale == []


def test_the_schema_table_names_every_choice_of_a_key():
    from spherepde.io.case_schema import SCHEMA

    table = reference.schema_table()
    missing = []
    for section in SCHEMA:
        for key in section.keys:
            if key.parse.__qualname__.startswith("choice."):
                options = key.parse.__closure__[0].cell_contents
                text = table.get(f"{section.name}.{key.name}", ("", ""))[0]
                missing += [f"{section.name}.{key.name}: {option}" for option in options if f'"{option}"' not in text]
    assert missing == []


def test_every_output_variable_is_in_the_reference_with_its_meaning():
    outputs = reference.sample_outputs()
    shown = _literals(reference.output_page())
    variables = reference.output_variables()
    for kind, dataset in outputs.items():
        for name in dataset.variables:
            row = reference.pattern(name, kind)
            assert row in shown, f"{kind}: variable {name} is not in the output reference"
            assert all(variables[row].meanings), f"{kind}: variable {name} has no long_name in some file"
    assert {"density", "particles", "W", "phi", "<diagnostic>_stderr", "<diagnostic>_z", "w2"} <= set(variables)


def test_every_output_attribute_is_in_the_reference_with_its_meaning():
    shown = _literals(reference.output_page())
    attributes = reference.output_attributes()
    assert [name for name in attributes if name not in shown] == []
    undocumented = [name for name, row in attributes.items() if not all(row.meanings)]
    assert undocumented == [], f"attributes without a meaning in {reference.ATTRIBUTES_FILE}"
    stale = [name for name in reference.attribute_meanings() if name not in attributes]
    assert stale == [], f"entries of {reference.ATTRIBUTES_FILE} that no output holds"



def test_the_member_attributes_of_any_sweep_share_one_row():
    """Which attributes the members of a sweep do not share depends on the sweep: a seeded particle sweep's
    member_seed and member_w2_quantisation_bound had no row (the sample sweep, Eulerian, differs in wall_seconds
    only), the sweep's own member_case, member_status and member_resolved_until keep theirs."""
    shown = _literals(reference.output_page())
    for name in ("member_seed", "member_w2_quantisation_bound", "member_wall_seconds", "member_iterations"):
        assert reference.pattern(name, reference.SWEEP) == "member_<name>"
    for name in ("member_case", "member_status", "member_resolved_until"):
        assert reference.pattern(name, reference.SWEEP) == name
    assert {"member_<name>", "member_case", "member_status", "member_resolved_until"} <= shown
    assert reference.output_variables()["member_<name>"].dims == "member"

@pytest.mark.parametrize("command", sorted(reference.cli_options()))
def test_every_command_line_option_is_in_the_reference_with_its_help(command):
    page = reference.cli_page()
    section = page.split(f"\n{command}\n", 1)[1] if command != "spherepde" else page
    section = re.split(r"\nspherepde \w+\n-+\n", section, maxsplit=1)[0]
    shown = _literals(section)
    for action in reference.cli_options()[command]:
        form = reference._argument_form(action)
        assert form in shown, f"{command}: {form} is not in the command-line reference"
        assert action.help, f"{command}: {form} has no help text"
