"""Exact rotations and reflections of band-limited fields:  g -> g o Q^T  for Q orthogonal.

For C = s Q (s >= 0, Q orthogonal: every diagonal +-1 matrix, rotations, reflections) the map
x -> C^T x / |C^T x| is x -> Q^T x, applied exactly: a grid permutation when Q^T maps the grid onto itself
(sign flips of the coordinates on the Gauss grid, `grid_permutation`), otherwise a rotation of the
coefficients (Wigner D on S^2, `SphereRotation`; a phase on S^1, `CircleRotation`), a reflection being a
rotation after the parity Y_lm(-x) = (-1)^l Y_lm(x) (S^2) or a conjugation (S^1).  A rotation costs
O(lmax^3) per field.
"""

import math

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal

from spherepde.base.real_view import COMPLEX_DTYPE


def orthogonal_factor(C: np.ndarray, rtol: float = 1e-14) -> tuple[float, np.ndarray] | None:
    """(s, Q) with C = s Q, Q orthogonal, when C^T C = s^2 I to rtol; else None.  C = 0 gives (0, I)."""
    d = C.shape[0]
    s2 = float(np.trace(C.T @ C)) / d
    if s2 == 0:
        return 0.0, np.eye(d)
    if np.abs(C.T @ C - s2 * np.eye(d)).max() > rtol * s2:
        return None
    return math.sqrt(s2), C / math.sqrt(s2)


def zyz_euler_angles(R: np.ndarray) -> tuple[float, float, float]:
    """(alpha, beta, gamma) with R = Rz(alpha) Ry(beta) Rz(gamma) for a rotation R (det +1)."""
    beta = math.atan2(math.hypot(R[0, 2], R[1, 2]), R[2, 2])
    if math.sin(beta) > 1e-9:
        alpha, gamma = math.atan2(R[1, 2], R[0, 2]), math.atan2(R[2, 1], -R[2, 0])
    elif R[2, 2] > 0:  # R = Rz(alpha + gamma)
        alpha, gamma = math.atan2(R[1, 0], R[0, 0]), 0.0
    else:  # R = Rz(alpha) Ry(pi)
        alpha, gamma = math.atan2(-R[1, 0], -R[0, 0]), 0.0

    def rz(a):
        return np.array([[math.cos(a), -math.sin(a), 0], [math.sin(a), math.cos(a), 0], [0, 0, 1]])

    ry = np.array([[math.cos(beta), 0, math.sin(beta)], [0, 1, 0], [-math.sin(beta), 0, math.cos(beta)]])
    if np.abs(rz(alpha) @ ry @ rz(gamma) - R).max() > 1e-12:
        raise ValueError("zyz_euler_angles: not a rotation matrix")
    return alpha, beta, gamma


def wigner_d(l: int, beta: float) -> np.ndarray:
    """d^l_{m m'}(beta) = <l m| exp(-i beta J_y) |l m'>, m, m' = -l..l (Condon-Shortley phase).

    J_y = D T D^*, D = diag(i^m), with T real symmetric tridiagonal, T_{m+1,m} = -sqrt((l-m)(l+m+1))/2;
    T = W diag(lambda) W^T with eigenvalues lambda = -l..l exactly, so
    d = D W diag(exp(-i beta lambda)) W^T D^*, real.
    """
    m = np.arange(-l, l + 1)
    _, W = eigh_tridiagonal(np.zeros(2 * l + 1), -0.5 * np.sqrt((l - m[:-1]) * (l + m[:-1] + 1.0)))
    phase = 1j ** (m % 4)
    d = (phase[:, None] * W) @ (np.exp(-1j * beta * m)[:, None] * (W.T * phase.conj()[None, :]))
    return d.real


class SphereRotation:
    """Coefficients of g(Q^T x) from those of g, Q orthogonal (3 x 3), real fields [m >= 0, l].

    Q = sigma R with R = Rz(alpha) Ry(beta) Rz(gamma) a rotation and sigma = det Q.  For sigma = -1,
    g(Q^T x) = g(-R^T x) and Y_lm(-x) = (-1)^l Y_lm(x) first multiplies the coefficients by (-1)^l.
    The rotation itself, (D(R) g)_lm = sum_m' e^{-i m alpha} d^l_{m m'}(beta) e^{-i m' gamma} g_lm',
    with g_{l,-m'} = (-1)^m' conj(g_lm') for a real field, becomes with h_m' = e^{-i m' gamma} g_lm'

        Re b_lm = sum_{m'>=0} A+_{l m' m} Re h_m',   Im b_lm = sum_{m'>=0} A-_{l m' m} Im h_m',
        A+-_{l m' m} = d^l_{m m'} +- [m' > 0] (-1)^m' d^l_{m,-m'},

    then b_lm e^{-i m alpha}.  Tables: two real (lmax+1)^3 arrays (33 MiB at lmax 128 in float64),
    one batched matmul over l per application.
    """

    def __init__(self, Q: np.ndarray, lmax: int, device, dtype):
        sign = round(float(np.linalg.det(Q)))
        alpha, beta, gamma = zyz_euler_angles(sign * Q)
        nmode = lmax + 1
        order = np.arange(nmode)
        plus, minus = np.zeros((2, nmode, nmode, nmode))  # [l, m', m]
        for l in range(nmode):
            d = wigner_d(l, beta)[l:]  # rows m = 0..l, columns m' = -l..l
            mirrored = np.zeros_like(d)
            mirrored[:, l + 1:] = d[:, :l][:, ::-1] * (-1.0) ** order[1:l + 1]  # (-1)^m' d_{m,-m'}
            plus[l, : l + 1, : l + 1] = (d[:, l:] + mirrored[:, l:]).T
            minus[l, : l + 1, : l + 1] = (d[:, l:] - mirrored[:, l:]).T
        complex_dtype = COMPLEX_DTYPE[dtype]
        parity = (-1.0) ** np.arange(nmode) if sign < 0 else np.ones(nmode)
        self._plus = torch.as_tensor(plus, dtype=dtype, device=device)
        self._minus = torch.as_tensor(minus, dtype=dtype, device=device)
        self._before = torch.as_tensor(np.exp(-1j * order[:, None] * gamma) * parity[None, :], dtype=complex_dtype,
                                       device=device)  # [m', l]
        self._after = torch.as_tensor(np.exp(-1j * order * alpha)[:, None], dtype=complex_dtype, device=device)

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        """(..., M, L) -> (..., M, L)."""
        h = (c * self._before).transpose(-1, -2)  # (..., l, m')
        batch = h.shape[:-2]
        h = h.reshape(-1, *h.shape[-2:]).transpose(0, 1)  # (l, B, m')
        real = torch.matmul(h.real.contiguous(), self._plus)
        imaginary = torch.matmul(h.imag.contiguous(), self._minus)
        nmode = self._after.shape[0]
        b = torch.complex(real, imaginary).transpose(0, 1).reshape(*batch, nmode, nmode)  # (..., l, m)
        return b.transpose(-1, -2) * self._after


class CircleRotation:
    """Fourier coefficients of g(Q^T x) from those of g, Q orthogonal (2 x 2), x = (cos t, sin t).

    Rotation Q by angle a: g(t - a), c_k -> c_k e^{-i k a}.  Reflection Q = [[cos a, sin a], [sin a, -cos a]]
    (= Q^T): g(a - t), c_k -> conj(c_k) e^{-i k a}.
    """

    def __init__(self, Q: np.ndarray, kmax: int, device, dtype):
        self.reflect = np.linalg.det(Q) < 0
        angle = math.atan2(Q[1, 0], Q[0, 0])
        complex_dtype = COMPLEX_DTYPE[dtype]
        self._phase = torch.as_tensor(np.exp(-1j * np.arange(kmax + 1) * angle), dtype=complex_dtype, device=device)

    def __call__(self, c: torch.Tensor) -> torch.Tensor:
        return (c.conj() if self.reflect else c) * self._phase


def grid_permutation(basis, Q: np.ndarray) -> torch.Tensor | None:
    """Index p (N,) with x_{p(j)} = Q^T x_j for every point of a Gauss grid, or None if Q^T does not map
    the grid onto itself (it does for every sign flip of the coordinates: phi -> pi - phi, -phi, and
    theta -> pi - theta, the Gauss nodes being symmetric)."""
    if basis.dim != 3:
        return None
    points = basis.float64_points()
    target = points @ Q  # rows (Q^T x_j)^T
    nlat, nlon = basis.grid_shape
    cos_theta = points[::nlon, 2]
    lat = np.abs(target[:, 2:3] - cos_theta[None, :]).argmin(1)
    lon = np.round(np.arctan2(target[:, 1], target[:, 0]) * nlon / (2 * np.pi)).astype(np.int64) % nlon
    index = lat * nlon + lon
    if np.abs(points[index] - target).max() > 1e-12:
        return None
    return torch.as_tensor(index, device=basis.points.device)
