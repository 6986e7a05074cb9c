"""Maps of the unit sphere S^{d-1} in R^d: the radial projection and the exponential map (points on the last axis)."""

import torch


def normalise(y: torch.Tensor) -> torch.Tensor:
    """y / |y|: the radial projection of nonzero vectors onto the sphere."""
    return y / torch.linalg.vector_norm(y, dim=-1, keepdim=True)


def exponential_map(points: torch.Tensor, tangent: torch.Tensor) -> torch.Tensor:
    """exp_x(u) = cos|u| x + sin|u| u / |u| (x where u = 0), renormalised against round-off."""
    length = torch.linalg.vector_norm(tangent, dim=-1, keepdim=True)
    direction = tangent / torch.where(length > 0, length, 1.0)
    return normalise(torch.cos(length) * points + torch.sin(length) * direction)
