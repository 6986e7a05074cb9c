"""spherepde: Eulerian solver for the mean-field dynamics of Transformer tokens on the sphere.

Python API (mirrors the command line):
    case = spherepde.load_case("cases/quickstart.toml", overrides=["model.beta=10"])
    dataset = spherepde.run(case)          # xarray.Dataset (docs/design.md "Output")
"""

from spherepde.api.dispatch import run
from spherepde.base.errors import CaseError, NumericalFailure
from spherepde.base.version import VERSION

__version__ = VERSION
__all__ = ["Case", "CaseError", "NumericalFailure", "__version__", "load_case", "load_case_text", "run"]


def __getattr__(name: str):
    """Case, load_case and load_case_text, imported from spherepde.io.case when first asked for: that module brings in
    numpy and xarray (about a second), which neither `spherepde --help` nor the command line's refusal of a second
    writer of an output (spherepde.io.locking) should wait for."""
    if name in ("Case", "load_case", "load_case_text"):
        from spherepde.io import case

        return getattr(case, name)
    raise AttributeError(f"module 'spherepde' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the lazy ones of __getattr__: dir() (a notebook's completion of `spherepde.`) lists
    only what is already imported otherwise, which left out Case, load_case and load_case_text."""
    return sorted(set(globals()) | set(__all__))
