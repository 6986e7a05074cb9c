"""Multi-head attention with one layer's parameters per member (spherepde.model.parameters), by dense quadrature,
so that it is differentiable (torch autograd) in B, V, the feed-forward and the masses:

    N_h(x) = sum_j exp(beta_h <x, B_h y_j>) y_j q_j,     Z_h(x) = sum_j exp(beta_h <x, B_h y_j>) q_j,
    m_h = N_h / Z_h (softmax; model.softmax_mean's rule where the density vanishes),  m_h = N_h (unnormalized),
    m_h = B_h^T x / |B_h^T x| (beta_h = inf),
    u(x) = f(x) + sum_h V_h m_h(x)     (the drift, before the tangent projection P_x),

with q_j the masses of the points y_j: w_j rho(y_j) on a grid (quadrature weights w), 1/n for n particles.
"""

import torch

from spherepde.kernels.dense import dense_exp_kernel
from spherepde.model.attention import softmax_mean, zero_temperature_mean
from spherepde.model.parameters import Layout


def head_means(layout: Layout, parts: dict, x: torch.Tensor, y: torch.Tensor, masses: torch.Tensor,
               density: torch.Tensor, chunk="auto") -> list:
    """[m_h (M, P, d) for every head] at the points x (P, d) or (M, P, d), for masses (M, Q) at the points y
    (Q, d) or (M, Q, d); `density` (M, P) at x decides softmax_mean's vanishing-density rule (ones for particles)."""
    means = []
    for h, head in enumerate(layout.heads):
        B = parts["B"][:, h]
        if head.zero_temperature:
            means.append(zero_temperature_mean(B, x))
            continue
        moments = masses[..., None] * y
        if head.kernel == "unnormalized":
            N, log_scale = dense_exp_kernel(x, y, moments, B, head.beta, chunk)
            means.append(N * torch.exp(log_scale)[..., None])
            continue
        scaled, _ = dense_exp_kernel(x, y, torch.cat([masses[..., None], moments], dim=-1), B, head.beta, chunk)
        means.append(softmax_mean(scaled[..., 1:], scaled[..., 0], density))
    return means


def drift(layout: Layout, parts: dict, x: torch.Tensor, y: torch.Tensor, masses: torch.Tensor,
          density: torch.Tensor, chunk="auto") -> torch.Tensor:
    """u(x) = f(x) + sum_h V_h m_h(x) (M, P, d) (module docstring; arguments as `head_means`)."""
    u = layout.feed_forward(parts, x)
    for h, m in enumerate(head_means(layout, parts, x, y, masses, density, chunk)):
        u = u + torch.matmul(m, parts["V"][:, h].transpose(-1, -2))
    return u
