"""Spherical-harmonic transforms through shtns: the CPU float64 reference backend.

Same grid, coefficient layout and interface as ``sht_torch.TorchSHT`` (see its module docstring);
tensors in and out are torch float64 / complex128 on the CPU.  What shtns does, checked against it:

* ``shtns.sht(lmax, lmax, norm=sht_orthonormal)``: orthonormal Y_lm *with* the Condon–Shortley
  phase (shtns drops it only with the SHT_NO_CS_PHASE flag), e.g. Y_11 = -sqrt(3/(8 pi)) sin(theta) e^{i phi};
  a real field is f = sum_l [a_l0 Y_l0 + 2 Re sum_{m>0} a_lm Y_lm].  Coefficients are packed
  by shtns in m-major order, index ``sh.idx(l, m)`` (arrays ``sh.l``, ``sh.m``); we unpack to [m, l].
* Gauss grid, cos(theta) decreasing (north to south), spatial layout (nlat, nphi) with
  SHT_PHI_CONTIGUOUS.  The Python ``set_grid`` silently replaces ``sht_gauss`` by
  ``sht_quick_init`` (and there is no other Python entry point to the C set_grid).  In shtns
  3.7 quick_init still builds the exact Gauss–Legendre grid (the same nodes and weights as
  sht_gauss, bit for bit equal to ``legendre.gauss_legendre``); it only skips the timing of
  kernel variants (always the on-the-fly recurrences) and uses FFTW_ESTIMATE plans.  The
  accuracy-relevant knob is the polar optimisation threshold, which we set to 0 (no Legendre
  values neglected near the poles).
* ``SHsphtor_to_spat(S, T)``: v = grad S - e_r x grad T, i.e.
  v_theta = dS/dtheta + (1/sin theta) dT/dphi, v_phi = (1/sin theta) dS/dphi - dT/dtheta;
  ``spat_to_SHsphtor`` is its inverse on band-limited fields, returning S_00 = T_00 = 0.
  div v = Lap S, so the divergence coefficients are -l(l+1) S_lm.
* With SIMD builds shtns aborts the whole process (no Python exception) when nlat is below
  4 vector widths (32 with AVX-512), so nlat < 32 is refused here with a ValueError.
"""

import os
import sys

import numpy as np
import torch

from spherepde.base.errors import CaseError
from spherepde.discretisation.transforms.legendre import check_grid, gauss_legendre

# shtns prints its build banner on stdout when its library loads; it goes to stderr, so that stdout carries only
# what a command prints (`--quiet` runs, `spherepde info ... | ...`).
sys.stdout.flush()
_stdout = os.dup(1)
os.dup2(2, 1)
try:
    import shtns
except ImportError:
    raise CaseError("solver.backend = \"shtns\" needs the optional shtns package: pip install 'spherepde[shtns]' "
                    "(built from source: a C compiler and FFTW, e.g. apt-get install libfftw3-dev; or "
                    "bash scripts/setup.sh test), or use solver.backend = \"auto\"") from None
finally:
    os.dup2(_stdout, 1)
    os.close(_stdout)

_MIN_NLAT = 32


class ShtnsSHT:
    """shtns-backed transforms with the interface of ``TorchSHT`` (float64, CPU; batch dims looped).

    shtns computes the Legendre functions on the fly from O(lmax^2) recurrence coefficients, so
    ``table_bytes`` (memory of stored Legendre tables) is 0.
    """

    table_bytes = 0
    device, dtype, complex_dtype = torch.device("cpu"), torch.float64, torch.complex128

    def __init__(self, lmax: int, nlat: int, nlon: int, device=torch.device("cpu"), dtype=torch.float64):
        check_grid(lmax, nlat, nlon)
        if torch.device(device).type != "cpu" or dtype != torch.float64:
            raise ValueError(f"ShtnsSHT runs on the CPU in float64 only, got device={device}, dtype={dtype}")
        if nlat < _MIN_NLAT:
            raise ValueError(f"ShtnsSHT needs nlat >= {_MIN_NLAT} (shtns's vectorised transforms abort below), "
                             f"got {nlat}")
        if lmax < 2:
            raise ValueError(f"ShtnsSHT needs lmax >= 2 (shtns refuses smaller), got {lmax}")
        self.lmax, self.nlat, self.nlon = lmax, nlat, nlon
        self._sh = shtns.sht(lmax, lmax, norm=shtns.sht_orthonormal)
        self._sh.set_grid(nlat, nlon, flags=shtns.sht_gauss | shtns.SHT_PHI_CONTIGUOUS, polar_opt=0.0)
        x = np.array(self._sh.cos_theta)
        # shtns returns the northern weights; for odd nlat the last one is half the equator's weight.
        half = np.array(self._sh.gauss_wts())
        w = np.concatenate([half[: nlat // 2], 2 * half[nlat // 2 :], half[: nlat // 2][::-1]])
        reference_x, _ = gauss_legendre(nlat)
        if np.max(np.abs(x - reference_x)) > 1e-14:
            raise RuntimeError("shtns did not set up the Gauss-Legendre grid")

        def real(values):
            return torch.as_tensor(values, dtype=torch.float64)

        self.cos_theta = real(x)
        self.theta = real(np.arctan2(np.sqrt((1.0 - x) * (1.0 + x)), x))
        self.phi = real(2 * np.pi * np.arange(nlon) / nlon)
        self.weights = real(w)
        self._m, self._l = np.array(self._sh.m), np.array(self._sh.l)
        self._degree = np.arange(lmax + 1)

    # --- conversions ---------------------------------------------------------------------------

    def _check(self, tensor, dtype: torch.dtype, tail: tuple[int, int], what: str) -> np.ndarray:
        """A torch tensor (..., *tail) of ``dtype`` on the CPU, as a (B, *tail) numpy array."""
        if not isinstance(tensor, torch.Tensor) or tensor.dtype != dtype or tensor.device.type != "cpu":
            raise ValueError(f"ShtnsSHT: {what} must be a {dtype} CPU tensor")
        if tuple(tensor.shape[-2:]) != tail:
            raise ValueError(f"ShtnsSHT: {what} must have shape (..., {tail[0]}, {tail[1]}), got {tuple(tensor.shape)}")
        return tensor.detach().reshape(-1, *tail).numpy()

    def _spatial(self, f) -> np.ndarray:
        return self._check(f, torch.float64, (self.nlat, self.nlon), "spatial arrays")

    def _spectral(self, coeffs) -> np.ndarray:
        """(..., M, L) complex -> (B, nlm) in shtns's packed order."""
        nmode = self.lmax + 1
        packed = self._check(coeffs, torch.complex128, (nmode, nmode), "coefficients")[:, self._m, self._l]
        return np.ascontiguousarray(packed)

    def _unpack(self, packed: np.ndarray) -> np.ndarray:
        """shtns packed (nlm,) -> [m, l] array, zero where l < m."""
        out = np.zeros((self.lmax + 1, self.lmax + 1), dtype=np.complex128)
        out[self._m, self._l] = packed
        return out

    @staticmethod
    def _tensor(arrays: list[np.ndarray], batch: torch.Size) -> torch.Tensor:
        stacked = np.stack(arrays)
        return torch.from_numpy(stacked).reshape(*batch, *stacked.shape[1:])

    # --- transforms ----------------------------------------------------------------------------

    def analysis(self, f: torch.Tensor) -> torch.Tensor:
        """a_lm = integral f conj(Y_lm) (Gauss quadrature): (..., nlat, nlon) -> (..., M, L)."""
        rings = self._spatial(f)
        coeffs = [self._unpack(self._sh.analys(np.ascontiguousarray(ring))) for ring in rings]
        return self._tensor(coeffs, f.shape[:-2])

    def synthesis(self, coeffs: torch.Tensor) -> torch.Tensor:
        """f = sum_l [a_l0 Y_l0 + 2 Re sum_{m>0} a_lm Y_lm] on the grid: (..., M, L) -> (..., nlat, nlon)."""
        fields = [self._sh.synth(q) for q in self._spectral(coeffs)]
        return self._tensor(fields, coeffs.shape[:-2])

    def vector_analysis(self, v_theta: torch.Tensor, v_phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(S, T) with v = grad S - e_r x grad T, S_00 = T_00 = 0 (shtns ``spat_to_SHsphtor``)."""
        vt, vp = self._spatial(v_theta), self._spatial(v_phi)
        if vt.shape != vp.shape:
            raise ValueError("ShtnsSHT: v_theta and v_phi must have the same shape")
        S, T = [], []
        for a, b in zip(vt, vp):
            s, t = self._sh.analys(np.ascontiguousarray(a), np.ascontiguousarray(b))
            S.append(self._unpack(s))
            T.append(self._unpack(t))
        batch = v_theta.shape[:-2]
        return self._tensor(S, batch), self._tensor(T, batch)

    def vector_synthesis(self, S: torch.Tensor, T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """v_theta = dS/dtheta + (1/sin theta) dT/dphi, v_phi = (1/sin theta) dS/dphi - dT/dtheta (shtns
        ``SHsphtor_to_spat``)."""
        if not isinstance(T, torch.Tensor):
            T = torch.full_like(S, T)
        if not isinstance(S, torch.Tensor):
            S = torch.full_like(T, S)
        s_packed, t_packed = self._spectral(S), self._spectral(T)
        if s_packed.shape != t_packed.shape:
            raise ValueError("ShtnsSHT: S and T must have the same shape")
        fields = [self._sh.synth(s, t) for s, t in zip(s_packed, t_packed)]
        batch = S.shape[:-2]
        return self._tensor([v[0] for v in fields], batch), self._tensor([v[1] for v in fields], batch)

    def gradient(self, coeffs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """grad f = (df/dtheta, (1/sin theta) df/dphi) from the coefficients of f (shtns ``SHsph_to_spat``)."""
        fields = [self._sh.synth_grad(q) for q in self._spectral(coeffs)]
        batch = coeffs.shape[:-2]
        return self._tensor([v[0] for v in fields], batch), self._tensor([v[1] for v in fields], batch)

    def gradient_frame(self, coeffs: torch.Tensor) -> torch.Tensor:
        """`gradient`'s two components stacked: (..., 2, nlat, nlon)."""
        return torch.stack(self.gradient(coeffs), dim=-3)

    def divergence(self, v_theta: torch.Tensor, v_phi: torch.Tensor) -> torch.Tensor:
        """Coefficients of div v: -l(l+1) S_lm, exactly 0 at l = 0."""
        S, _ = self.vector_analysis(v_theta, v_phi)
        eigenvalue = torch.from_numpy((-self._degree * (self._degree + 1)).astype(np.float64))
        return S * eigenvalue
