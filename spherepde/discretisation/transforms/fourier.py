"""Fourier transforms on the circle S^1 with orthonormal modes e^{i k theta} / sqrt(2 pi).

Grid: theta_j = 2 pi j / n.  Coefficients c_k, k = 0..kmax (real fields: c_{-k} = conj c_k),
    f(theta) = (1/sqrt(2 pi)) [c_0 + 2 Re sum_{k>0} c_k e^{i k theta}],
    c_k = integral f(theta) e^{-i k theta} / sqrt(2 pi) dtheta = (sqrt(2 pi) / n) rfft(f)_k.
"""

import math

import torch


class FourierTransform:
    """Real-field Fourier analysis / synthesis on n uniform points, modes |k| <= kmax (no stored tables:
    ``table_bytes`` is 0)."""

    table_bytes = 0

    def __init__(self, kmax: int, n: int, device=torch.device("cpu"), dtype=torch.float64):
        if n <= 2 * kmax:
            raise ValueError(f"Fourier grid of {n} points cannot hold modes up to {kmax} (need n > 2 kmax)")
        self.kmax, self.n = kmax, n
        self.theta = 2 * math.pi * torch.arange(n, device=device, dtype=dtype) / n
        self.wavenumber = torch.arange(kmax + 1, device=device, dtype=dtype)
        self._scale = math.sqrt(2 * math.pi) / n
        self._i_wavenumber = 1j * self.wavenumber

    def analysis(self, f: torch.Tensor) -> torch.Tensor:
        """(..., n) real -> (..., kmax+1) complex coefficients c_k."""
        return torch.fft.rfft(f, dim=-1)[..., : self.kmax + 1] * self._scale

    def synthesis(self, c: torch.Tensor) -> torch.Tensor:
        """(..., kmax+1) complex -> (..., n) real grid values."""
        return torch.fft.irfft(c, n=self.n, dim=-1) / self._scale

    def derivative(self, c: torch.Tensor) -> torch.Tensor:
        """Coefficients of d/dtheta: i k c_k."""
        return c * self._i_wavenumber
