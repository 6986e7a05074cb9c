"""The attention field at a study's scale: memory of the dense field's blocks, the sizes the field rules keep."""

import os

import numpy as np
import pytest
import torch

from spherepde.base.memory import keep_freed_memory
from spherepde.kernels.dense import dense_exp_kernel


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set from /proc")
def test_dense_field_on_a_fine_circle_holds_blocks_not_the_kernel():
    """solver.field = "dense" on S^1 at lmax ~700-1500 (2000-4500 points): memory O(N x chunk), as documented.  Under a
    run's glibc thresholds (spherepde.base.memory) each block's small results took the freed space of the block
    before, and the heap grew by a block a block, to the whole N x N kernel (1.2 GB at lmax 4096), wherever the heap's
    history left no other small free chunks (here 45-116 MB of the 517 MB of the six kernels in 11 runs of 14; now
    3-11 MB).  The values are brute force's over all pairs."""
    if not keep_freed_memory():
        pytest.skip("the environment sets glibc's malloc itself")
    generator = torch.Generator().manual_seed(3)
    C, beta = torch.tensor([[1.0, 0.3], [0.1, 0.8]], dtype=torch.float64), 5.0
    grown = kernels = 0
    with torch.no_grad():
        dense_exp_kernel(*[torch.eye(2, dtype=torch.float64)] * 3, C, beta)  # the first call's own setup
        for n in (2000, 2500, 3000, 3500, 4000, 4500):
            angles = torch.rand(n, generator=generator, dtype=torch.float64) * 2 * np.pi
            x = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1)
            f = torch.rand(n, 3, generator=generator, dtype=torch.float64)
            before = resident_bytes()
            scaled, log_scale = dense_exp_kernel(x, x, f, C, beta)
            grown, kernels = grown + resident_bytes() - before, kernels + n * n * 8
    assert grown <= kernels / 20
    rows = np.random.default_rng(0).choice(n, 50, replace=False)
    logits = beta * (x[rows] @ C @ x.T).numpy()
    expected = np.exp(logits - log_scale[rows].numpy()[:, None]) @ f.numpy()
    assert np.abs(scaled[rows].numpy() - expected).max() <= 1e-13 * np.abs(expected).max()
