"""The transport term -div(rho v) of the model beyond the seeds (spherepde.model.parameters: several heads, B and
V varying over the layers or trained, a two-layer feed-forward) for M members on one basis grid, and its
transpose.

The drive of a layer is its parameter vector theta_l (M, p) itself, so the solvers that carry
Transport.feed_forward's drive per layer (the time loop, the tape, the discrete adjoint's sum of the drive's
cotangents over a layer) carry theta_l unchanged, and the drive's cotangent is dJ/dtheta_l's share of a stage.
The velocity is spherepde.model.heads's drift at the grid points, in the tangent frame's components
v_k = <e_k, u> (the frame is tangent, so P_x drops out), with the masses q_j = w_j rho(y_j) of the grid; the
divergence is the basis's weak form, so that mass is conserved to round-off as on the seeds' paths.  The
transpose of an evaluation is torch autograd of that one evaluation (the dense attention is differentiable in
every parameter, and its graph lives for one stage; on the shtns backend, whose transforms autograd does not see,
the basis's transposes of the transforms around autograd of the flux): exact to round-off, as the hand-written
transposes of spherepde.model.transport are.
"""

import math

import torch

from spherepde.base.real_view import complex_state, real_state
from spherepde.model.heads import drift
from spherepde.model.parameters import Layout
from spherepde.model.transport import largest_speed


class LayeredTransport:
    """rate(state, theta_l) = -div(rho v) and its transpose for members whose parameters are theta_l (M, p) of
    `layout` (module docstring); the interface of spherepde.model.transport.Transport."""

    attention_mode, path = "heads", "grid"
    namespace = torch  # the array library of a step (Transport.namespace)

    def __init__(self, basis, layout: Layout, chunk="auto"):
        self.basis, self.layout, self.chunk = basis, layout, chunk
        d, points = basis.dim, basis.grid_size
        self.grid_shape, self.coefficient_shape = basis.grid_shape, tuple(basis.degree.shape)
        self.points = basis.points.reshape(points, d)
        self.frame = basis.frame.reshape(d - 1, points, d)  # e_k(x_p): (K, P, d)
        self.weights = basis.weights.reshape(points)

    def select(self, members: list) -> "LayeredTransport":
        """The members' parameters ride in the drive: the same transport serves any subset."""
        return self

    def feed_forward(self, theta: torch.Tensor) -> torch.Tensor:
        """The drive of a layer: its parameters theta_l (M, p)."""
        return theta

    def feed_forward_adjoint(self, drive_bar: torch.Tensor) -> torch.Tensor:
        """dJ/dtheta_l (M, p) from the drive's cotangent."""
        return drive_bar

    def velocity(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rho (M, P), v (M, K, P)) of the state."""
        rho = self.basis.synthesis(complex_state(state, self.coefficient_shape)).reshape(state.shape[0], -1)
        return rho, self.grid_velocity(rho, drive)

    def grid_velocity(self, rho: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        """v (M, K, P) of the grid densities rho (M, P)."""
        u = drift(self.layout, self.layout.unpack(drive), self.points, self.points, rho * self.weights, rho,
                  self.chunk)
        return torch.einsum("kpi,mpi->mkp", self.frame, u)

    def __call__(self, state: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        """-div(rho v) (M, N)."""
        rho, v = self.velocity(state, drive)
        flux = (rho[:, None] * v).reshape(v.shape[:2] + self.grid_shape)
        return real_state(-self.basis.divergence_frame(flux))

    def vjp(self, state: torch.Tensor, drive: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(state_bar, drive_bar): the cotangents of the state and of theta_l for the cotangent b (M, N) of the rate:
        torch autograd of the evaluation, or, where the basis's transforms are not torch's (the shtns backend's are
        numpy's: autograd's graph would end at them), `transposed_flux`."""
        if self.basis.backend == "shtns":
            return self.transposed_flux(state, drive, b)
        with torch.enable_grad():
            state, drive = state.detach().requires_grad_(True), drive.detach().requires_grad_(True)
            state_bar, drive_bar = torch.autograd.grad(self(state, drive), (state, drive), b)
        return state_bar, drive_bar

    def transposed_flux(self, state: torch.Tensor, drive: torch.Tensor,
                        b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`vjp` with the transforms transposed by the basis (divergence_adjoint, synthesis_adjoint, as
        Transport.vjp does) and autograd of the flux rho v on the grid alone between them."""
        members = state.shape[0]
        rho = self.basis.synthesis(complex_state(state, self.coefficient_shape)).reshape(members, -1)
        flux_bar = -self.basis.divergence_adjoint(complex_state(b, self.coefficient_shape)).reshape(
            (members, -1, rho.shape[1]))
        with torch.enable_grad():
            rho, drive = rho.detach().requires_grad_(True), drive.detach().requires_grad_(True)
            flux = rho[:, None] * self.grid_velocity(rho, drive)
            rho_bar, drive_bar = torch.autograd.grad(flux, (rho, drive), flux_bar)
        state_bar = self.basis.synthesis_adjoint(rho_bar.reshape((members,) + self.grid_shape))
        return real_state(state_bar), drive_bar

    def rate_token(self, state: torch.Tensor, drive: torch.Tensor, rows: bool = True) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
        """(the rate, the state): the transpose recomputes the evaluation from the stage's state (Transport's
        interface; there are no rows to keep)."""
        return self(state, drive), state

    def vjp_token(self, token: torch.Tensor, drive: torch.Tensor, b: torch.Tensor,
                  rows: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        return self.vjp(token, drive, b)

    def token_rows(self, rows: bool) -> bool:
        return False

    def token_size(self, rows: bool = True) -> int:
        """Numbers per member of a token of `rate_token`: a state."""
        return 2 * math.prod(self.coefficient_shape)

    def max_speed(self, state: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        """max over the grid of |v| (M,), in float64 (transport.largest_speed)."""
        return largest_speed(self.velocity(state, drive)[1])
