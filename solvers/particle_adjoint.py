"""The transpose of a particle step: the backward pass of solvers/particle_training.py.

For one step x' = S(x, W) of solvers.particles.Integrator and a cotangent xbar' = dJ/dx', a transpose returns
(xbar, Wbar) = ((dS/dx)^T xbar', (dS/dW)^T xbar').  Where the field is the direct dense attention
(ParticleField.is_direct), the step is solvers/particle_step.py's array program and `transpose_step` is its transpose
written out by hand: the step taken again from x with the same Gaussian draws, keeping what each stage's transpose
reads, then the stages run backwards (the formulas are in that module).  Elsewhere (the shifted blocks at large beta
or large n, beta = 0, the beta = inf fields, the fused attention) `autograd_transpose` takes the step again under
torch autograd.

Why by hand: autograd's graph of one Heun step has about 120 nodes, and recording and walking it cost 2.3 ms a step
whatever the batch (about 8 members' arithmetic at N = 64), so a batch whose members had mostly stopped paid that for
each of them.  The transpose takes a fixed few array operations per stage, of which two products read the kernel.
"""

import torch

from solvers.particles import Integrator


def supports(integrator: Integrator, x: torch.Tensor) -> bool:
    """Whether `transpose_step` serves this integrator's field at particles like x (M, n, d)."""
    return integrator.direct_step(x) is not None


def transpose_step(integrator: Integrator, x: torch.Tensor, W: torch.Tensor, h: float, k: int, steps: int, draws,
                   xbar: torch.Tensor):
    """(xbar, Wbar) of Integrator.step(x, W, h, k, steps, draws) for the cotangent xbar of its result; `draws`
    yields the step's Gaussian draws in the order the step took them."""
    return integrator.direct_step(x).transpose_step(x, W, h, k, steps, draws, xbar)


def autograd_transpose(integrator: Integrator, x: torch.Tensor, W: torch.Tensor, h: float, k: int, steps: int,
                       draws, xbar: torch.Tensor):
    """The same as `transpose_step`, by torch autograd through the step taken again (every field)."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        W = W.detach().requires_grad_(True)
        return torch.autograd.grad(integrator.step(x, W, h, k, steps, draws), (x, W), xbar)
