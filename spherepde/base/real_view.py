"""Complex numbers carried as real ones: the complex dtype of each real dtype, and the real view of complex states.

A member's complex coefficients c (*coeff) are one real vector (N,), N = 2 prod(coeff), each coefficient's
(Re, Im) pair in turn (torch.view_as_real): the solvers' states are real (M, N), one row per member.
"""

import torch

# The complex dtype whose parts are of each real dtype.
COMPLEX_DTYPE = {torch.float64: torch.complex128, torch.float32: torch.complex64}


def real_state(c: torch.Tensor) -> torch.Tensor:
    """Complex coefficients (M, *coeff) -> their real view (M, N)."""
    return torch.view_as_real(c).reshape(c.shape[0], -1)


def real_diagonal(factor: torch.Tensor) -> torch.Tensor:
    """A real factor per coefficient (*coeff) as the factor of both parts of its real view (N,)."""
    return factor[..., None].expand(factor.shape + (2,)).reshape(-1)


def complex_state(state: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The inverse of `real_state`: (M, N) -> complex (M, *shape)."""
    return torch.view_as_complex(state.reshape((state.shape[0],) + tuple(shape) + (2,)))
