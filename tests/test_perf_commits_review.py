"""The performance commits of 0.2.0 under conditions their measurements left out: the S^1 fourier path's
`Workspace` (spherepde/model/fourier_path.py) in the torch program, under autograd and with a cotangent that is a
column slice of a wider tensor."""

import torch
from test_transport import member_cases, relative

from solvers.forward_problem import ForwardProblem
from spherepde.model.transport import Transport


def fourier_transport(members: int = 1):
    """Members of the seed's S^1 model (test_transport.member_cases) on the fourier path, their state, a drive and
    a cotangent of the rate."""
    problem = ForwardProblem(member_cases(2, "unnormalized", 1.0, 32, "dense")[:members])
    transport = Transport(problem.basis, problem.batch, problem.kernels, path="fourier")
    state = problem.initial()
    drive = transport.feed_forward(problem.placement.tensor([[[0.3, -0.2], [0.1, 0.4]]] * members))
    b = torch.randn(state.shape, generator=torch.Generator().manual_seed(2), dtype=state.dtype)
    return transport, state, drive, b


def test_an_autograd_evaluation_of_the_fourier_path_leaves_later_ones_out_of_its_graph():
    """torch autograd of the rate (the torch program: a state that requires grad) and then plain evaluations of the
    same transport: the rate does not require grad (a kept spectrum buffer had joined the first graph, so every
    later rate required grad and could not be read as numpy), and the hand-written transpose, which raised in its
    out= product, is autograd's gradient and the numpy program's to round-off."""
    transport, state, drive, b = fourier_transport()
    leaf = state.clone().requires_grad_(True)
    (by_autograd,) = torch.autograd.grad((transport(leaf, drive) * b).sum(), leaf)
    rate = transport(state, drive)
    assert not rate.requires_grad
    assert relative(rate, torch.from_numpy(transport._folded.rate(state.numpy(), drive.numpy()))) < 1e-14
    state_bar, _ = transport.vjp(state, drive, b)
    by_numpy, _ = transport._folded.vjp(state.numpy(), drive.numpy(), b.numpy())
    assert relative(state_bar, by_autograd) < 1e-13
    assert relative(state_bar, torch.from_numpy(by_numpy)) < 1e-14


def test_the_fourier_paths_transpose_takes_a_column_slice_of_a_wider_tensor():
    """The cotangent b of two members as the first N columns of a (2, N + 1) tensor (the row stride odd, as the
    continuous adjoint's phi beside its integrals: base.real_view): the torch program's transpose is the one of a
    contiguous b, where it raised in torch.view_as_complex."""
    transport, state, drive, b = fourier_transport(2)
    wide = torch.cat([b, torch.ones(b.shape[0], 1, dtype=b.dtype)], dim=1)[:, :b.shape[1]]
    assert wide.stride(0) % 2 == 1
    for ours, contiguous in zip(transport.vjp(state, drive, wide), transport.vjp(state, drive, b)):
        assert torch.equal(ours, contiguous)
        assert float(contiguous.abs().max()) > 1.0
