"""Writing a resolved case back as TOML text (``Case.text``): sections as [headers], their keys as
``key = value`` with inline values, floats written with ``repr`` so that reloading gives the same data exactly;
and the keys in which two such texts differ (`case_differences`).
"""

from __future__ import annotations

import datetime
import numbers
import re
import tomllib

from spherepde.io.case_values import Invalid, is_list

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def dumps(data: dict) -> str:
    """Sections as [headers], their keys as `key = value` with inline values."""
    blocks = []
    for name, table in data.items():
        lines = [f"[{_toml_key(name)}]"]
        lines += [f"{_toml_key(key)} = {toml_value(value)}" for key, value in table.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def case_differences(stored: str, current: str):
    """(dotted key, its value in `stored`, its value in `current`) for each key whose values differ between two
    resolved case texts, nested tables followed to their keys, None where a text lacks the key (TOML has no null), in
    the texts' order: what a resumed run or sweep names when a stored case is not the one run now.
    tomllib.TOMLDecodeError where a text is no TOML."""
    a, b = (_dotted(tomllib.loads(text)) for text in (stored, current))
    for key in dict.fromkeys([*a, *b]):
        if a.get(key) != b.get(key):
            yield key, a.get(key), b.get(key)


def _dotted(table: dict, prefix: str = "") -> dict:
    """A case's tables flattened to {"model.eps": value, ...}."""
    flat = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _toml_key(key) -> str:
    if not isinstance(key, str):
        raise Invalid(f"table keys must be strings, got {key!r}")
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_string(text: str) -> str:
    def escaped(char: str) -> str:
        if char in _ESCAPES:
            return _ESCAPES[char]
        return f"\\u{ord(char):04x}" if char < " " or char == "\x7f" else char
    return '"' + "".join(map(escaped, text)) + '"'


def toml_value(value) -> str:
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
    if is_list(value):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise Invalid(f"cannot be written as TOML: {value!r}")
