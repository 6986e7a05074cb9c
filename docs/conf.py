"""Sphinx configuration of the spherepde documentation (build: `sphinx-build -W --keep-going docs docs/_build/html`).

The reference pages (case keys, output names, command line) are written from the code when the build starts
(_ext/spherepde_reference.py); the gallery's scripts (examples/) run during the build and their figures go into
the pages (sphinx-gallery). Everything works offline."""

import os
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")

DOCS = pathlib.Path(__file__).resolve().parent
REPOSITORY = DOCS.parent
sys.path.insert(0, str(REPOSITORY))
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("OMP_NUM_THREADS", "1")  # the examples are small: one thread each (docs/design.md)

import spherepde_reference  # noqa: E402

import spherepde  # noqa: E402

project = "spherepde"
author = "the spherepde authors"
copyright = "the spherepde authors (MIT licence)"
release = version = spherepde.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "_ext", "examples", "**/sg_execution_times.rst"]
myst_enable_extensions = ["colon_fence"]  # formulas are plain text, as in docs/design.md: no MathJax from a CDN
myst_heading_anchors = 3
nitpicky = True
smartquotes = False  # "softmax" stays as a case file writes it: readers copy values from these pages
nitpick_ignore_regex = [
    (r"py:class", r"(xarray|xr|np|numpy|torch|pathlib|os)\..*"),
    (r"py:class", r"(optional|callable|PathLike|sequence of str)"),
    (r"py:class", r"collections\.abc\..*"),  # the standard library's own docs are not built here (offline)
    (r"py:class", r"(spherepde\.io\.case_values\.Inputs|solvers\.checkpoint\.Checkpoint)"),  # internal types
]
suppress_warnings = ["config.cache"]  # sphinx-gallery's callables in the config are not picklable

html_theme = "furo"
html_title = f"spherepde {release}"
html_static_path = ["_static"]
html_css_files = ["spherepde.css"]
html_theme_options = {"sidebar_hide_name": False, "navigation_with_keys": True}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = True

sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "matplotlib_animations": False,
    "reset_modules": ("matplotlib",),
    "min_reported_time": 0,
    "show_memory": False,
    "abort_on_example_error": True,
    "show_signature": False,
}


def _write_reference(app) -> None:
    spherepde_reference.write_pages(DOCS / "reference" / "generated")


def setup(app):
    app.connect("builder-inited", _write_reference, priority=100)
highlight_language = "text"  # indented blocks are shell commands and formulas, not Python
