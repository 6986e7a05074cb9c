"""The transpose of the particle steps: the backward pass of solvers/particle_training.py.

For one step x' = S(x, W) of solvers.particles.Integrator and a cotangent xbar' = dJ/dx', a transpose returns
(xbar, Wbar) = ((dS/dx)^T xbar', (dS/dW)^T xbar').  Where the field is the direct dense attention
(ParticleField.is_direct), the step is solvers/particle_step.py's array program, and `taped_run` / `transposed_run`
run it and its transpose written out by hand (DirectStep.advance / retreat: the step taken again from its start with
the same Gaussian draws, keeping what each stage's transpose reads, then the stages run backwards; the formulas are
in that module) on the systems' rows throughout.  Elsewhere (the shifted blocks at large beta or large n, beta = 0,
the beta = inf fields, the fused attention) `autograd_transpose` takes each step again under torch autograd.

Why by hand: autograd's graph of one Heun step has about 120 nodes, and recording and walking it cost 2.3 ms a step
whatever the batch (about 8 members' arithmetic at N = 64).  The transpose takes a fixed few array operations per
stage, of which two products read the kernel.
"""

import numpy as np
import torch

from solvers.particle_step import DirectStep
from solvers.particles import Integrator


def supports(integrator: Integrator, x: torch.Tensor) -> bool:
    """Whether the steps of this integrator at particles like x (M, n, d) are the array program (taped_run)."""
    return integrator.direct_step(x) is not None


def autograd_transpose(integrator: Integrator, x: torch.Tensor, W: torch.Tensor, h: float, k: int, steps: int,
                       draws, xbar: torch.Tensor):
    """(xbar, Wbar) of Integrator.step(x, W, h, k, steps, draws) for the cotangent xbar of its result, by torch
    autograd through the step taken again (every field); `draws` yields the step's Gaussian draws in order."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        W = W.detach().requires_grad_(True)
        return torch.autograd.grad(integrator.step(x, W, h, k, steps, draws), (x, W), xbar)


class Replay:
    """An iterator over Gaussian draws that keeps what it gave (`taken`), so that a step can be taken again with
    the same draws (`replay(start)` from draw number `start`)."""

    def __init__(self, draws):
        self.draws, self.taken = iter(draws), []

    def __iter__(self):
        return self

    def __next__(self):
        value = next(self.draws)
        self.taken.append(value)
        return value

    def replay(self, start: int):
        return iter(self.taken[start:])


def taped_run(program: DirectStep, plans: list, x: torch.Tensor, controls: torch.Tensor, noise, draw_count):
    """(X(T) (M, n, d), tape): the forward run of solvers/particle_training.py (the plans' steps from x with
    W_t = controls[:, layer], the Gaussian draws of `noise`, draw_count(steps) an interval) on the systems' rows
    throughout, the same steps bit for bit as Integrator.step takes them; the tape keeps every step's rows, W,
    step and draws."""
    xp = np if np in program.arrays else torch
    X, tape = program.rows(xp, x), []
    for plan in plans:
        steps, h, layer = int(plan.steps[0]), float(plan.dt[0]), plan.interval.layer
        matrices = program.per_system(xp, controls[:, layer])
        draws = Replay(program.draw_rows(xp, noise.blocks(draw_count(steps))))
        for k in range(steps):
            tape.append((X, matrices, h, k, steps, layer, draws, len(draws.taken)))
            X = program.advance(xp, X, matrices, h, k, steps, draws)
    return program.points(xp, X, x), tape


def transposed_run(program: DirectStep, tape: list, x_bar: torch.Tensor, W_bar: torch.Tensor) -> None:
    """The transpose of `taped_run` for the cotangent x_bar of X(T): every step's retreat from the last, each
    layer's dJ/dW added into W_bar (M, L, d, d)."""
    xp = np if np in program.arrays else torch
    Xbar, layer_bars = program.rows(xp, x_bar), {}
    for X, matrices, h, k, steps, layer, draws, taken in reversed(tape):
        Xbar, Wbar = program.retreat(xp, X, matrices, h, k, steps, draws.replay(taken), Xbar)
        layer_bars[layer] = Wbar if layer not in layer_bars else layer_bars[layer] + Wbar
    for layer, Wbar in layer_bars.items():
        W_bar[:, layer] += program.member_sum(xp, Wbar)
