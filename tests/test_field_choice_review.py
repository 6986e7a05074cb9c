"""solver.field = "auto" on S^1 with a general B decides from the sizes, without the spectral field's table, and a
forced "spectral" whose table does not fit the machine is refused (docs/guide/attention-field.md)."""

import math

import numpy as np
import pytest
import torch

import spherepde.discretisation.scattered as scattered
import spherepde.kernels.spectral as spectral
from spherepde.base.device import placement
from spherepde.base.errors import CaseError
from spherepde.discretisation.bases import CircleBasis
from spherepde.kernels.choice import make_exp_kernel
from spherepde.kernels.dense import DenseExpKernel

CPU64 = placement("cpu", "float64")
GENERAL = torch.tensor([[1.0, 0.3], [0.2, 0.7]], dtype=torch.float64)
NEAR_ORTHOGONAL = torch.tensor([[1.0, 0.02], [-0.01, 1.0]], dtype=torch.float64)


def no_table(*args):
    raise AssertionError("the table of the spectral field on S^1 was built")


def test_auto_compares_the_fields_from_their_sizes(monkeypatch):
    """lmax 2048 (6250 points, 2050 waves), softmax-like channels (rho, rho y), beta = 5: the spectral estimate is
    3 transforms (10 N log2 N each) plus n nodes x 3 channels x 8 N (kmax + 1), the dense one N^2 (2 (d + 1) + 2 c
    + 20); the dense field is the pick, and the table (205 MB) is never built."""
    monkeypatch.setattr(scattered, "harmonics_at", no_table)
    basis = CircleBasis(2048, CPU64)
    points, kmax = 6250, 2049
    assert basis.grid_shape == (points,)
    kernel = spectral.SpectralExpKernel(basis, GENERAL, 5.0, 1e-10)
    nodes = len(kernel.nodes)
    expected = 3 * 10.0 * points * math.log2(points) + nodes * 3 * 8.0 * points * (kmax + 1)
    assert kernel.cost(3) == pytest.approx(expected, rel=1e-12)
    assert DenseExpKernel(basis, GENERAL, 5.0).cost(3) == 32.0 * points ** 2 < expected
    assert make_exp_kernel(basis, GENERAL, 5.0, "auto", 1e-10).name == "dense"


def test_auto_picks_the_spectral_field_and_builds_its_table_at_the_first_call(monkeypatch):
    """A nearly orthogonal B at beta = 0.1 (two Chebyshev nodes) at lmax 1024: the spectral field is the pick, as
    before; its table comes at the first call, and the transform agrees with the dense quadrature."""
    basis = CircleBasis(1024, CPU64)
    with monkeypatch.context() as patch:
        patch.setattr(scattered, "harmonics_at", no_table)
        kernel = make_exp_kernel(basis, NEAR_ORTHOGONAL, 0.1, "auto", 1e-10)
    assert kernel.name == "spectral"
    x = basis.points
    rho = torch.exp(2 * x[:, 0]) + 0.5 * torch.exp(-x[:, 1])
    channels = torch.cat([rho[:, None], rho[:, None] * x], dim=1)
    scaled, log_scale = kernel(channels)
    dense, log_dense = DenseExpKernel(basis, NEAR_ORTHOGONAL, 0.1)(channels)
    values, dense_values = scaled * torch.exp(log_scale)[:, None], dense * torch.exp(log_dense)[:, None]
    assert float((values - dense_values).abs().max()) <= 1e-10 * float(dense_values.abs().max())


def test_a_forced_spectral_field_whose_table_does_not_fit_is_refused(monkeypatch):
    """lmax 1024: 3200 points x 1026 waves, 32 bytes an entry while built = 0.0978 GiB, against 64 MiB left."""
    monkeypatch.setattr(spectral, "available_memory", lambda: 64 * 2 ** 20)
    basis = CircleBasis(1024, CPU64)
    needed = 32 * 3200 * 1026 / 2 ** 30
    with pytest.raises(CaseError, match=rf"^solver\.field: .* {needed:.3g} GiB .* 0\.0625 GiB available"):
        make_exp_kernel(basis, GENERAL, 5.0, "spectral", 1e-10)
    assert make_exp_kernel(basis, NEAR_ORTHOGONAL, 0.1, "auto", 1e-10).name == "dense"  # spectral where it fits
    monkeypatch.setattr(spectral, "available_memory", lambda: None)  # unknown: not refused
    assert np.isfinite(make_exp_kernel(basis, GENERAL, 5.0, "spectral", 1e-10).cost(3))
