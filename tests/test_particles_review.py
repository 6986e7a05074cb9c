"""The particle field's blocks at scale, against brute force over all pairs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.special import softmax

from solvers.particle_field import fused_softmax_mean, hardmax_mean
from spherepde.kernels.dense import CPU_BLOCK_BYTES


def systems_on_the_sphere(S, p, d, seed=0):
    generator = torch.Generator().manual_seed(seed)
    points = torch.nn.functional.normalize(torch.randn(S, p, d, generator=generator, dtype=torch.float64), dim=-1)
    return points, torch.eye(d, dtype=torch.float64) + 0.3 * torch.randn(S, d, d, generator=generator,
                                                                          dtype=torch.float64)


def test_hardmax_blocks_of_many_systems_hold_one_mebibyte(monkeypatch):
    """solver.chunk = "auto" takes blocks of 1 MiB: of all the systems together, as the dense kernel's.  Each
    system's rows were 1 MiB, so 64 replicas of 1000 tokens took 64 x 131 x 1000 logits, 67 MB, a block (400
    replicas: 419 MB).  The argmax is brute force's over all pairs."""
    points, B = systems_on_the_sphere(64, 1000, 3)
    blocks = []
    matmul = torch.matmul

    def recorded(a, b):
        product = matmul(a, b)
        if product.shape[-1] == points.shape[1]:  # logits (S, rows, p), not the queries (S, p, d)
            blocks.append(product.numel() * product.element_size())
        return product

    monkeypatch.setattr(torch, "matmul", recorded)
    m = hardmax_mean(B, points, "auto")
    monkeypatch.undo()
    assert max(blocks) <= CPU_BLOCK_BYTES
    x, Bn = points.numpy(), B.numpy()
    scores = np.einsum("sid,sde,sje->sij", x, Bn, x)  # <x_i, B x_j>
    assert np.array_equal(m.numpy(), np.take_along_axis(x, scores.argmax(-1)[..., None], axis=1))


@pytest.mark.parametrize("chunk", [1, 7, 299, 300, "auto"])
def test_fused_softmax_blocks_of_many_systems_hold_one_mebibyte(monkeypatch, chunk):
    """The fused attention's query blocks follow the same rule; m_i = sum_j softmax_j(beta <x_i, B x_j>) x_j is
    scipy's whatever the block (S = 40 systems of 300 tokens)."""
    points, B = systems_on_the_sphere(40, 300, 3, seed=1)
    beta = torch.linspace(0.5, 30.0, 40, dtype=torch.float64)
    logits = []
    attention = F.scaled_dot_product_attention

    def recorded(query, key, value, **options):
        logits.append(query.shape[0] * query.shape[1] * key.shape[1] * query.element_size())
        return attention(query, key, value, **options)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recorded)
    m = fused_softmax_mean(B, beta, points, chunk)
    monkeypatch.undo()
    if chunk == "auto":
        assert max(logits) <= CPU_BLOCK_BYTES
    x, Bn = points.numpy(), B.numpy()
    scores = beta.numpy()[:, None, None] * np.einsum("sid,sde,sje->sij", x, Bn, x)
    assert np.abs(m.numpy() - softmax(scores, axis=-1) @ x).max() <= 1e-13
