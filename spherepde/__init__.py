"""spherepde: Eulerian solver for the mean-field dynamics of Transformer tokens on the sphere.

Python API (mirrors the command line):
    case = spherepde.load_case("cases/quickstart.toml", overrides=["model.beta=10"])
    dataset = spherepde.run(case)          # xarray.Dataset (DESIGN §6)
"""

from .case import Case, load_case, load_case_text
from .errors import CaseError, NumericalFailure

__all__ = ["Case", "CaseError", "NumericalFailure", "load_case", "load_case_text", "run"]


def run(case: Case, progress: bool | None = None):
    """Run a case with the solver its [solver] method names; returns an xarray.Dataset."""
    method = case["solver"]["method"]
    if method != "eulerian":
        raise CaseError(f"solver.method: {method!r} is not available yet; use 'eulerian'")
    from solvers.eulerian import run_eulerian

    return run_eulerian(case, progress=progress)
