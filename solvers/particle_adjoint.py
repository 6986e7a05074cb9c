"""The transpose of a particle step, written out by hand: the backward pass of solvers/particle_training.py.

For one step x' = S(x, W) of solvers.particles.Integrator and a cotangent xbar' = dJ/dx', `transpose_step`
returns (xbar, Wbar) = ((dS/dx)^T xbar', (dS/dW)^T xbar').  It takes the step again from x with the same
Gaussian draws, keeping what each stage's transpose reads (the stage point, the attention mean, the kernel
matrix, the drift), then runs the stages backwards.  The transposes of the pieces, for cotangents zbar, vbar:

    normalise z = y / |y|:            ybar = (zbar - <zbar, z> z) / |y|
    exp_x(t) = normalise(w),  w = cos|t| x + sin|t| e,  e = t / |t|:
                                      xbar = cos|t| wbar,  tbar = sin|t| (wbar - <wbar, e> e) / |t| + lbar e,
                                      lbar = cos|t| <wbar, e> - sin|t| <wbar, x>
    P_x(y) = y - <y, x> x:            ybar = P_x(vbar),  xbar = -<y, x> vbar - <vbar, x> y
    u = W x + V m:                    xbar = W^T ubar,  Wbar = sum_i ubar_i x_i^T,  mbar = V^T ubar
    direct attention (particle_field.direct_attention), per system of p particles, coupling C = beta B:
        a_i = mbar_i / Z_i (softmax) or mbar_i / p (unnormalized),  c_i = <a_i, m_i> (softmax) or 0,
        G_ij = k_ij (<a_i, x_j> - c_i),
        xbar = k^T a + G (x C^T) + G^T (x C)
    an explicit Runge-Kutta step y = x + h sum_i b_i k_i, k_i = v(x + h sum_j a_ij k_j):
        kbar_i = h b_i ybar + h sum_{l > i} a_li Xbar_l,  Xbar_i = (dv/dx)^T kbar_i at stage i,
        xbar = ybar + sum_i Xbar_i.

Why by hand: autograd's graph of one Heun step has about 120 nodes, and recording and walking it cost 2.3 ms a
step whatever the batch (about 8 members' arithmetic at N = 64), so a batch whose members had mostly stopped
paid that for each of them.  The transposes above take a fixed few tensor operations per stage; the large ones
are the four (p, p) products and the kernel's exp, the same as a forward stage.

Only the dense attention formed whole (ParticleField.is_direct) is transposed here; the shifted blocks at
large beta or large n, beta = 0 and the beta = inf fields are transposed by autograd (`autograd_transpose`).
"""

import torch

from solvers.particle_field import direct_attention
from solvers.particles import Integrator, noise_variance
from spherepde.discretisation.timesteppers import EXPLICIT_TABLEAUX, explicit_increment
from spherepde.geometry.ambient import inner, tangent_projection
from spherepde.geometry.sphere import normalise
from spherepde.model.attention import drift


def supports(integrator: Integrator, x: torch.Tensor) -> bool:
    """Whether `transpose_step` serves this integrator's field at particles like x (M, n, d)."""
    field = integrator.field
    return field.attention == "dense" and field.is_direct(field._systems(x))


def normalise_transpose(y: torch.Tensor, zbar: torch.Tensor) -> torch.Tensor:
    length = torch.linalg.vector_norm(y, dim=-1, keepdim=True)
    z = y / length
    return (zbar - inner(zbar, z)[..., None] * z) / length


def projection_transpose(points: torch.Tensor, y: torch.Tensor, vbar: torch.Tensor):
    """(xbar, ybar) of v = P_x(y) = y - <y, x> x."""
    along = inner(vbar, points)[..., None]
    return -inner(y, points)[..., None] * vbar - along * y, vbar - along * points


def exponential_map_transpose(points: torch.Tensor, tangent: torch.Tensor, outbar: torch.Tensor):
    """(xbar, tbar) of geometry.sphere.exponential_map(x, t)."""
    length = torch.linalg.vector_norm(tangent, dim=-1, keepdim=True)
    safe = torch.where(length > 0, length, 1.0)
    direction = tangent / safe
    cos, sin = torch.cos(length), torch.sin(length)
    wbar = normalise_transpose(cos * points + sin * direction, outbar)
    along = inner(wbar, direction)[..., None]
    lbar = cos * along - sin * inner(wbar, points)[..., None]
    return cos * wbar, sin * (wbar - along * direction) / safe + lbar * direction


def brownian_transpose(integrator: Integrator, points: torch.Tensor, tau: float, g: torch.Tensor,
                       outbar: torch.Tensor) -> torch.Tensor:
    """xbar of the noise step exp_x(sigma P_x g) (Integrator.brownian), g fixed."""
    sigma = torch.sqrt(noise_variance(integrator.eps, tau, points.shape[-1]))
    xbar, tbar = exponential_map_transpose(points, sigma * tangent_projection(points, g), outbar)
    return xbar + projection_transpose(points, g, sigma * tbar)[0]


class Stage:
    """One evaluation v = P_x(W x + V m(x)) of the field, keeping what its transpose reads."""

    def __init__(self, field, x: torch.Tensor, W: torch.Tensor):
        self.field, self.x, self.W = field, x, W
        self.points = field._systems(x)
        self.softmax = field.systems.kernel == "softmax"
        m, self.kernel, self.Z = direct_attention(self.points, field.coupling, self.softmax)
        self.m = m.reshape(x.shape)
        self.u = drift(field.batch, x, self.m, W)
        self.v = tangent_projection(x, self.u)

    def transpose(self, vbar: torch.Tensor):
        """(xbar, Wbar) of this evaluation for the cotangent vbar (M, n, d)."""
        xbar, ubar = projection_transpose(self.x, self.u, vbar)
        xbar = xbar + torch.matmul(ubar, self.W)
        Wbar = torch.matmul(ubar.transpose(-1, -2), self.x)
        mbar = torch.matmul(ubar, self.field.batch.V).reshape(self.points.shape)
        points, kernel, coupling = self.points, self.kernel, self.field.coupling
        columns = points.transpose(-1, -2).contiguous()
        if self.softmax:
            a = mbar / self.Z[..., None]
            weights = torch.matmul(a, columns) - inner(a, self.m.reshape(points.shape))[..., None]
        else:
            a = mbar / points.shape[-2]
            weights = torch.matmul(a, columns)
        G = kernel * weights
        # The three sums as (d, p) rows, as particle_field.direct_attention forms its sums (twice as fast there).
        pbar = (torch.matmul(a.transpose(-1, -2), kernel)
                + torch.matmul(torch.matmul(coupling, columns), G.transpose(-1, -2))
                + torch.matmul(torch.matmul(coupling.transpose(-1, -2), columns), G)).transpose(-1, -2)
        return xbar + pbar.reshape(xbar.shape), Wbar


class Flow:
    """timesteppers.explicit_flow with the integrator's tableau from x (`out`), keeping its stages for `transpose`."""

    def __init__(self, integrator: Integrator, x: torch.Tensor, W: torch.Tensor, h: float):
        self.tableau, self.h, self.W, self.stages = EXPLICIT_TABLEAUX[integrator.name], h, W, []

        def velocity(point, offset):
            self.stages.append(Stage(integrator.field, point, W))
            return self.stages[-1].v

        self.y = explicit_increment(velocity, x, h, self.tableau)
        self.out = normalise(self.y)

    def transpose(self, outbar: torch.Tensor):
        """(xbar, Wbar) for the cotangent outbar of `out`."""
        h, tableau = self.h, self.tableau
        ybar = normalise_transpose(self.y, outbar)
        slope_bars = [(h * weight) * ybar for weight in tableau.b]
        xbar, Wbar = ybar, torch.zeros_like(self.W)
        for i in reversed(range(len(self.stages))):
            stage_bar, stage_Wbar = self.stages[i].transpose(slope_bars[i])
            xbar, Wbar = xbar + stage_bar, Wbar + stage_Wbar
            for j, weight in enumerate(tableau.a[i]):
                if weight:
                    slope_bars[j] = torch.add(slope_bars[j], stage_bar, alpha=h * weight)
        return xbar, Wbar


def transpose_step(integrator: Integrator, x: torch.Tensor, W: torch.Tensor, h: float, k: int, steps: int, draws,
                   xbar: torch.Tensor):
    """(xbar, Wbar) of Integrator.step(x, W, h, k, steps, draws) for the cotangent xbar of its result; `draws`
    yields the step's Gaussian draws in the order the step took them."""
    if integrator.name == "euler":
        stage = Stage(integrator.field, x, W)
        if not integrator.noisy:
            ybar = normalise_transpose(x + h * stage.v, xbar)
            stage_bar, Wbar = stage.transpose(h * ybar)
            return ybar + stage_bar, Wbar
        g, scale = next(draws), torch.sqrt(2 * integrator.eps * h)
        previous, tbar = exponential_map_transpose(x, h * stage.v + scale * tangent_projection(x, g), xbar)
        previous = previous + projection_transpose(x, g, scale * tbar)[0]
        stage_bar, Wbar = stage.transpose(h * tbar)
        return previous + stage_bar, Wbar
    if not integrator.noisy:
        return Flow(integrator, x, W, h).transpose(xbar)
    first = next(draws) if k == 0 else None
    start = integrator.brownian(x, h / 2, first) if k == 0 else x
    flow = Flow(integrator, start, W, h)
    flowed_bar = brownian_transpose(integrator, flow.out, integrator.noise_time(h, k, steps), next(draws), xbar)
    start_bar, Wbar = flow.transpose(flowed_bar)
    return (brownian_transpose(integrator, x, h / 2, first, start_bar) if k == 0 else start_bar), Wbar


def autograd_transpose(integrator: Integrator, x: torch.Tensor, W: torch.Tensor, h: float, k: int, steps: int,
                       draws, xbar: torch.Tensor):
    """The same as `transpose_step`, by torch autograd through the step taken again (every field)."""
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)
        W = W.detach().requires_grad_(True)
        return torch.autograd.grad(integrator.step(x, W, h, k, steps, draws), (x, W), xbar)

