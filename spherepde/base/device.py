"""Where tensors live: the one place that turns the case's device and dtype into torch objects."""

from dataclasses import dataclass

import torch

from spherepde.base.errors import CaseError
from spherepde.base.real_view import COMPLEX_DTYPE

_REAL = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True)
class Placement:
    """Device and real/complex dtypes shared by every tensor of a run."""

    device: torch.device
    real: torch.dtype

    @property
    def complex(self) -> torch.dtype:
        return COMPLEX_DTYPE[self.real]

    @property
    def name(self) -> str:
        return str(self.real).removeprefix("torch.")

    def tensor(self, values, complex_: bool = False) -> torch.Tensor:
        return torch.as_tensor(values, dtype=self.complex if complex_ else self.real, device=self.device)


def placement(device: str = "auto", dtype: str = "float64") -> Placement:
    """Resolve "auto" | "cpu" | "cuda" and "float64" | "float32"."""
    if dtype not in _REAL:
        raise CaseError(f"solver.dtype: expected 'float64' or 'float32', got {dtype!r}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise CaseError("solver.device: 'cuda' requested but no CUDA device is available")
    elif device not in ("cpu", "cuda"):
        raise CaseError(f"solver.device: expected 'auto', 'cpu' or 'cuda', got {device!r}")
    return Placement(torch.device(device), _REAL[dtype])
