"""Pointwise algebra of ambient vectors: tensors whose last axis holds the d components of a vector of R^d
at each grid point or particle (positions x on S^{d-1}, velocities, attention means, gradients).

The sums over components are written out as d fused multiply-adds.  On the CPU, torch's reduction over a
last axis of length 2 or 3 is about three times slower than that, and twenty times slower (vector_norm) when
the components are the outermost axis in memory, as in the exponential-kernel transforms' channel-major output:
10 ms of an S^2 step's 46 ms at lmax 160 went to one such norm.
"""

import torch


def inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """<a, b> = sum_i a_i b_i over the last axis (broadcasting the others); shape (*batch,)."""
    total = a[..., 0] * b[..., 0]
    for i in range(1, a.shape[-1]):
        total = torch.addcmul(total, a[..., i], b[..., i])
    return total


def norm(a: torch.Tensor) -> torch.Tensor:
    """|a| = <a, a>^(1/2) over the last axis; shape (*batch,)."""
    return torch.sqrt(inner(a, a))


def tangent_projection(points: torch.Tensor, field: torch.Tensor) -> torch.Tensor:
    """P_x(y) = y - <x, y> x at each point x of the sphere: the component of y tangent at x."""
    return field - inner(field, points)[..., None] * points
