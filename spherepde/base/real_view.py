"""Complex numbers carried as real ones: the complex dtype of each real dtype, and the real view of complex states.

A member's complex coefficients c (*coeff) are one real vector (N,), N = 2 prod(coeff), each coefficient's
(Re, Im) pair in turn (torch.view_as_real): the solvers' states are real (M, N), one row per member.  `real_state` and
`complex_state` view numpy arrays alike (the numpy program of spherepde.base.arrays).
"""

import numpy as np
import torch

# The complex dtype whose parts are of each real dtype.
COMPLEX_DTYPE = {torch.float64: torch.complex128, torch.float32: torch.complex64}
# The same for numpy, both ways (a lookup: np.finfo and np.result_type cost a microsecond a call, a few percent of a
# small step that views its state a few times a stage).
NUMPY_COMPLEX = {np.dtype(np.float64): np.dtype(np.complex128), np.dtype(np.float32): np.dtype(np.complex64)}
NUMPY_REAL = {complex_dtype: real_dtype for real_dtype, complex_dtype in NUMPY_COMPLEX.items()}


def real_state(c):
    """Complex coefficients (M, *coeff) -> their real view (M, N)."""
    if isinstance(c, np.ndarray):
        return np.ascontiguousarray(c).view(NUMPY_REAL[c.dtype]).reshape(c.shape[0], -1)
    return torch.view_as_real(c).reshape(c.shape[0], -1)


def real_diagonal(factor: torch.Tensor) -> torch.Tensor:
    """A real factor per coefficient (*coeff) as the factor of both parts of its real view (N,)."""
    return factor[..., None].expand(factor.shape + (2,)).reshape(-1)


def complex_state(state, shape: tuple):
    """The inverse of `real_state`: (M, N) -> complex (M, *shape) (a view of a contiguous `state`, else of a copy)."""
    if isinstance(state, np.ndarray):
        return np.ascontiguousarray(state).view(NUMPY_COMPLEX[state.dtype]).reshape((state.shape[0],) + tuple(shape))
    # A column slice of a wider array (the continuous adjoint's phi beside its integrals) has a row stride that
    # view_as_complex refuses when odd (M > 1 members, an odd number of control entries): made contiguous first.
    return torch.view_as_complex(state.contiguous().reshape((state.shape[0],) + tuple(shape) + (2,)))
