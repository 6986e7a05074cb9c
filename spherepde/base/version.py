"""The package version: one value, read by setuptools (pyproject.toml), `spherepde --version` and every output file."""

VERSION = "0.2.0"
