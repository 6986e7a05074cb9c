"""The explicit part of the continuous adjoint equation of the model beyond the seeds (spherepde.model.parameters;
docs/model.md "Beyond the seeds") for M members on one basis grid, through one functional:

    F(rho, theta) = int rho(x) grad phi(x) . u_theta[rho](x) dsigma(x),    u = f + sum_h V_h m_h[rho]

(grad phi is tangent, so the projection P_x of v = P_x u drops out).  Its first variation in rho is the adjoint's
transport and nonlocal terms,

    delta F / delta rho (x) = v(x) . grad phi(x) + NL(x),
    NL(x) = int (d u(y) / d rho(x)) . grad phi(y) rho(y) dsigma(y),

so that -d_t phi = eps Lap phi + delta F / delta rho, and dF/dtheta_l is the density in time of the gradient,
dJ/dtheta_l = Lambda theta_l |slice_l| + int_{slice_l} dF/dtheta dt.  On the grid F = sum_p w_p rho_p
grad phi_p . u_p with u of spherepde.model.heads.drift (the same quadrature as LayeredTransport's velocity), and
torch autograd of that one sum in (rho_p, theta) gives w_p (delta F / delta rho)(x_p) and dF/dtheta exactly for
the quadrature: the continuous adjoint operator discretised in space, not the transpose of the time scheme
(which the discrete gradient is).  The explicit formulas (docs/model.md) are checked against it in
tests/test_beyond_adjoint.py.
"""

import torch

from spherepde.model.heads import drift
from spherepde.model.parameters import Layout


class LayeredAdjoint:
    """delta F / delta rho and dF/dtheta (module docstring) for members whose parameters are theta (M, p) of
    `layout`; the interface of solvers.adjoint.AdjointOperator.rate with theta in place of W."""

    def __init__(self, basis, layout: Layout, chunk="auto"):
        self.basis, self.layout, self.chunk = basis, layout, chunk
        self.points = basis.points.reshape(basis.grid_size, basis.dim)
        self.weights = basis.weights.reshape(basis.grid_size)

    def variation(self, rho: torch.Tensor, theta: torch.Tensor,
                  grad_phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """((delta F / delta rho)(x_p) (M, P), dF/dtheta (M, p)) for grid densities rho (M, P), theta (M, p) and
        grad phi (M, P, d) in ambient components at the grid points."""
        with torch.enable_grad():
            rho, theta = rho.detach().requires_grad_(True), theta.detach().requires_grad_(True)
            u = drift(self.layout, self.layout.unpack(theta), self.points, self.points, rho * self.weights, rho,
                      self.chunk)
            functional = (self.weights * rho * (grad_phi * u).sum(-1)).sum()
            rho_bar, theta_bar = torch.autograd.grad(functional, (rho, theta))
        return rho_bar / self.weights, theta_bar

    def rate(self, rho: torch.Tensor, theta: torch.Tensor, phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(coefficients of v . grad phi + NL (M, *coeff), dF/dtheta (M, p)) for grid densities rho (M, P), theta
        (M, p) and adjoint coefficients phi (M, *coeff)."""
        basis = self.basis
        grad_phi = basis.gradient(phi).reshape(rho.shape + (basis.dim,))
        value, theta_bar = self.variation(rho, theta, grad_phi)
        return basis.analysis(value.reshape((-1,) + basis.grid_shape)), theta_bar
