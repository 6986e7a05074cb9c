"""Pointwise vector algebra (spherepde/geometry/ambient.py) in both memory layouts the solvers hand it: components
innermost (grid points, particles) and outermost (the exponential-kernel transforms' channel-major output)."""

import torch

from spherepde.geometry.ambient import inner, norm, tangent_projection


def layouts(shape, d, seed):
    generator = torch.Generator().manual_seed(seed)
    innermost = torch.randn(*shape, d, generator=generator, dtype=torch.float64)
    outermost = torch.movedim(torch.randn(d, *shape, generator=generator, dtype=torch.float64), 0, -1)
    return innermost, outermost


def test_inner_and_norm_agree_with_torch_reductions_in_both_layouts():
    for d in (2, 3, 5):
        a, b = layouts((17, 23), d, seed=d)
        for x, y in ((a, b), (b, a), (b, b)):
            assert torch.allclose(inner(x, y), torch.einsum("...i,...i->...", x, y), rtol=0, atol=1e-14)
            assert torch.allclose(norm(x), torch.linalg.vector_norm(x, dim=-1), rtol=1e-15, atol=0)


def test_tangent_projection_is_orthogonal_to_the_point_and_idempotent():
    a, b = layouts((9, 31), 3, seed=7)
    points = a / torch.linalg.vector_norm(a, dim=-1, keepdim=True)
    tangent = tangent_projection(points, b)
    assert float(inner(tangent, points).abs().max()) <= 1e-15
    assert float((tangent_projection(points, tangent) - tangent).abs().max()) <= 1e-15
    # P_x y = y - <x, y> x: the removed part is the normal component
    assert torch.allclose(b - tangent, inner(b, points)[..., None] * points, rtol=0, atol=1e-15)
