"""Spherical-harmonic transforms on a Gauss–Legendre grid in PyTorch (CPU or CUDA, float64 or float32).

Grid and coefficients (identical to the shtns backend, ``sht_shtns.ShtnsSHT``):

* theta_j = colatitude of the Gauss nodes, north to south (cos theta decreasing);
  phi_k = 2 pi k / nlon.  Spatial arrays have shape (..., nlat, nlon).
* Quadrature: integral over S^2 of f = sum_j sum_k w_j (2 pi / nlon) f[j, k], sum_j w_j = 2.
* Y_lm = Pbar_lm(cos theta) e^{i m phi}, orthonormal, Condon–Shortley phase (see ``legendre``).
  Real fields only; coefficients a[..., m, l] (complex, shape (lmax+1, lmax+1), zero for l < m):

      f = sum_l [a_l0 Y_l0 + 2 Re sum_{m>0} a_lm Y_lm],   a_lm = integral f conj(Y_lm),

  so integral f^2 = sum_l |a_l0|^2 + 2 sum_{m>0} |a_lm|^2.
* Vector fields v = v_theta e_theta + v_phi e_phi (two real arrays) in spheroidal/toroidal form
  (shtns's ``SHsphtor_to_spat`` / ``spat_to_SHsphtor`` convention, checked against shtns):

      v = grad S - e_r x grad T,
      v_theta = dS/dtheta + (1/sin theta) dT/dphi,   v_phi = (1/sin theta) dS/dphi - dT/dtheta,

  with S, T expanded like a scalar field and S_00 = T_00 = 0.  Hence div v = Lap S has
  coefficients -l(l+1) S_lm (its l = 0 coefficient is exactly 0) and curl v . e_r = -Lap T.

Implementation: per order m a Legendre transform is a matrix product with the tables of
``legendre.legendre_tables`` (Pbar, dPbar/dtheta, m Pbar/sin theta; computed once in float64 and
cast), done for all m in one product; complex numbers are carried as (real, imaginary) rows so the
tables stay real, and the phi direction is an rfft / irfft.  The tables have three layouts with one
interface (dense, packed, sparse: ``legendre_layouts``), chosen by ``default_layout`` from what
benchmarks/sht_backends.py measured.
"""

import math

import numpy as np
import torch

from spherepde.base.arrays import (
    as_namespace,
    as_tensor,
    clone,
    complex_pairs,
    contiguous_copy,
    copy_,
    empty,
    empty_complex,
    irfft_into,
    leading_zero_runs,
    matmul_into,
    matmul_runs_into,
    permute,
    program_namespace,
    real_pairs,
    rfft_into,
    zeros,
)
from spherepde.base.real_view import COMPLEX_DTYPE
from spherepde.discretisation.transforms.legendre import check_grid, gauss_legendre, legendre_tables, legendre_values
from spherepde.discretisation.transforms.legendre_layouts import LAYOUTS, default_layout, table_bytes


class MomentTables:
    """The tables of TorchSHT.moments, per order m, `own` [P_m; nlon K_m P_m; nlon K_m cos(theta) P_m] (lmax,
    3 nlat, lmax) and `before`, `after` nlon K_m sin(theta) P_{m-+1} / 2 (lmax + 1, nlat, lmax) (kind "moments"),
    and that of TorchSHT.frame_moments, `frame` [P_m; E_m; F_m; nlon K_m P_m; R_m] (lmax, 5 nlat, lmax) (kind
    "frame"; TorchSHT.moment_filter), each kind made at its first use by `build(kind)`: a run that takes only one of
    the two never makes the other's (up to 55 MB each at lmax 96).  `on(kind, xp)` a kind's tables, as numpy arrays
    sharing their memory where xp is numpy; `runs(kind)` the runs of zero columns (`leading_zero_runs`) of their
    products, own, before[1:] and after[:lmax - 1], or frame (P_m vanishes below degree m)."""

    def __init__(self, build):
        self._build = build
        self._kinds = {}  # kind -> [tensors, runs, numpy arrays or None]

    def _made(self, kind: str) -> list:
        if kind not in self._kinds:
            tensors = self._build(kind)
            products = (tensors[0], tensors[1][1:], tensors[2][:tensors[0].shape[0] - 1]) if kind == "moments" \
                else tensors
            self._kinds[kind] = [tensors, tuple(leading_zero_runs(table, 2) for table in products), None]
        return self._kinds[kind]

    def on(self, kind: str, xp) -> tuple:
        made = self._made(kind)
        if xp is torch:
            return made[0]
        if made[2] is None:
            made[2] = tuple(table.numpy() for table in made[0])
        return made[2]

    def runs(self, kind: str) -> tuple:
        return self._made(kind)[1]


def _order_columns(c):
    """Coefficients c (B, M, L) as the columns of their orders, (M, L, 2 B): each member's (Re, Im) side by side, the
    tables' right-hand sides (a copy, never a view of c)."""
    return real_pairs(contiguous_copy(permute(c, (1, 2, 0))))


def _times_i(rows: torch.Tensor) -> torch.Tensor:
    """Multiply by i the complex numbers stored as real rows (re_1, im_1, re_2, im_2, ...): (x, y) -> (-y, x)."""
    real, imaginary = rows.unflatten(0, (-1, 2)).unbind(1)
    return torch.stack((-imaginary, real), dim=1).flatten(0, 1)


class TorchSHT:
    """Scalar and vector spherical-harmonic transforms, degree <= lmax, on an nlat x nlon Gauss grid.

    Memory: three real tables (``table_bytes``), built once here on ``device`` in the layout ``layout``
    ("dense", "packed" or "sparse"; None: ``default_layout``): dense, (lmax+1)^2 nlat numbers (9 MiB in
    all at lmax 63, nlat 96 in float64); packed, about a quarter of that (0.15 GiB at lmax 255, nlat
    384); sparse, 3x packed.  With ``vector=False`` only the first (scalar analysis and synthesis).  The dense
    layout's transforms keep, as they are first used, the tables times the quadrature weights (as much again) and
    zeroed ring-spectrum buffers per member count (a few MB at lmax 32 and 16 members).
    """

    def __init__(self, lmax: int, nlat: int, nlon: int, device=torch.device("cpu"), dtype=torch.float64,
                 vector: bool = True, layout: str | None = None):
        check_grid(lmax, nlat, nlon)
        if dtype not in COMPLEX_DTYPE:
            raise ValueError(f"TorchSHT: dtype must be torch.float64 or torch.float32, got {dtype}")
        self.lmax, self.nlat, self.nlon = lmax, nlat, nlon
        self.device, self.dtype, self.complex_dtype = torch.device(device), dtype, COMPLEX_DTYPE[dtype]

        x, w = gauss_legendre(nlat)

        def real(values):
            return torch.as_tensor(values, dtype=dtype, device=self.device)

        self.cos_theta = real(x)
        self.theta = real(np.arctan2(np.sqrt((1.0 - x) * (1.0 + x)), x))
        self.phi = real(2 * np.pi * np.arange(nlon) / nlon)
        self.weights = real(w)
        self.layout = layout or default_layout(lmax, self.device)
        if self.layout not in LAYOUTS:
            raise ValueError(f"TorchSHT: layout must be one of {sorted(LAYOUTS)}, got {layout!r}")
        self._legendre = LAYOUTS[self.layout](lmax, nlat, self.device)
        # vector = False makes the scalar table only (analysis and synthesis; vector transforms then fail): by the
        # recurrence of legendre_tables' first table alone, the other two (ladder identities) and their packing being
        # three quarters of the set-up
        tables = legendre_tables(lmax, x) if vector else (legendre_values(lmax, x), None, None)
        self._P, self._dP, self._mP_sin = (None if table is None else self._legendre.pack(table, dtype, self.device)
                                           for table in tables)
        self.table_bytes = sum(table_bytes(t) for t in (self._P, self._dP, self._mP_sin) if t is not None)
        # Quadrature factor w_j (2 pi / nlon) applied to the rfft of each latitude ring.
        self._quadrature = real(w * (2 * np.pi / nlon))
        degree = np.arange(lmax + 1)
        inverse_eigenvalue = np.zeros(lmax + 1)
        inverse_eigenvalue[1:] = 1.0 / (degree[1:] * (degree[1:] + 1.0))
        self._inverse_eigenvalue = real(inverse_eigenvalue)  # 1/(l(l+1)), 0 at l = 0
        self._spectra = {}  # the numpy buffers of `_spectrum_buffer`, by shape and orders written
        # the dense tables' runs of orders zero below a degree (Pbar_lm = 0 for l < m), for their products
        self._runs = {name: leading_zero_runs(getattr(self, "_" + name), 1) for name in ("P", "dP", "mP_sin")
                      if self.layout == "dense" and getattr(self, "_" + name) is not None}
        self._weighted = {}  # `_weighted_table`'s, by name

    # --- layouts: real rows (2B, M, .), the real and the imaginary part of each of the B fields in turn ---

    def _pair(self, first, second, dtype: torch.dtype) -> torch.Tensor:
        """Stack two fields (tensors or scalars such as 0, broadcast) into one batch of leading size 2."""
        first, second = (torch.as_tensor(x, device=self.device) for x in (first, second))
        if not dtype.is_complex and (first.is_complex() or second.is_complex()):
            raise ValueError("spatial arrays must be real")
        first, second = first.to(dtype), second.to(dtype)
        return torch.stack(torch.broadcast_tensors(first, second))

    def _spectral_rows(self, coeffs: torch.Tensor) -> tuple[torch.Tensor, torch.Size]:
        """(..., M, L) complex -> real rows (2B, M, L): the (re, im) rows of each batch member."""
        nmode = self.lmax + 1
        if coeffs.shape[-2:] != (nmode, nmode):
            raise ValueError(f"coefficients must have shape (..., {nmode}, {nmode}), got {tuple(coeffs.shape)}")
        coeffs = coeffs.to(device=self.device, dtype=self.complex_dtype)
        batch = coeffs.shape[:-2]
        pairs = torch.view_as_real(coeffs.reshape(-1, nmode, nmode))  # (B, M, L, 2)
        return pairs.permute(0, 3, 1, 2).reshape(-1, nmode, nmode), batch

    def _coefficients(self, rows: torch.Tensor, batch: torch.Size) -> torch.Tensor:
        """Inverse of ``_spectral_rows``: real (2B, M, L) -> complex (..., M, L)."""
        nmode = self.lmax + 1
        pairs = rows.reshape(-1, 2, nmode, nmode).permute(0, 2, 3, 1).contiguous()
        return torch.view_as_complex(pairs).reshape(*batch, nmode, nmode)

    def _fourier_rows(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Size]:
        """Weighted ring Fourier coefficients w_j integral_0^{2pi} f(theta_j, phi) e^{-i m phi} dphi.

        (..., nlat, nlon) real -> real rows (2B, M, nlat), m = 0..lmax.
        """
        if f.shape[-2:] != (self.nlat, self.nlon):
            raise ValueError(f"spatial arrays must have shape (..., {self.nlat}, {self.nlon}), got {tuple(f.shape)}")
        if f.is_complex():
            raise ValueError("spatial arrays must be real")
        f = f.to(device=self.device, dtype=self.dtype)
        batch = f.shape[:-2]
        rings = torch.fft.rfft(f.reshape(-1, self.nlat, self.nlon), dim=-1)[..., : self.lmax + 1]  # (B, J, M)
        pairs = torch.view_as_real(rings).permute(0, 3, 2, 1).reshape(-1, self.lmax + 1, self.nlat)
        return pairs * self._quadrature, batch

    def _grid(self, rows: torch.Tensor, batch: torch.Size) -> torch.Tensor:
        """Ring sums g_m(theta_j) as real rows (2B, M, nlat) -> f = g_0 + 2 Re sum_{m>0} g_m e^{i m phi},
        (..., nlat, nlon)."""
        pairs = rows.reshape(-1, 2, self.lmax + 1, self.nlat).permute(0, 3, 2, 1).contiguous()
        rings = torch.view_as_complex(pairs)  # (B, J, M)
        f = torch.fft.irfft(rings, n=self.nlon, dim=-1, norm="forward")
        return f.reshape(*batch, self.nlat, self.nlon)

    # --- scalar transforms ---------------------------------------------------------------------

    def analysis(self, f: torch.Tensor) -> torch.Tensor:
        """a_lm = sum_j w_j Pbar_lm(x_j) (2 pi / nlon) sum_k f[j, k] e^{-i m phi_k}:
        (..., nlat, nlon) -> (..., M, L)."""
        if self.layout == "dense":
            (sums,), batch = self._dense_sums((f,), ("P",))
            return self._dense_coefficients(sums, batch)
        rings, batch = self._fourier_rows(f)
        return self._coefficients(self._legendre.analysis(rings, self._P, odd=False), batch)

    def synthesis(self, coeffs: torch.Tensor) -> torch.Tensor:
        """f[j, k] = sum_l [a_l0 Pbar_l0 + 2 Re sum_{m>0} a_lm Pbar_lm(x_j) e^{i m phi_k}]:
        (..., M, L) -> (..., nlat, nlon)."""
        if self.layout == "dense":
            return self._dense_fields(coeffs, ("P",), (False,))[..., 0, :, :]
        rows, batch = self._spectral_rows(coeffs)
        return self._grid(self._legendre.synthesis(rows, self._P, odd=False), batch)

    # --- the dense tables' transforms: one program over numpy and torch --------------------------

    def _dense_fields(self, coeffs: torch.Tensor, tables: tuple, turned: tuple) -> torch.Tensor:
        """Fields from coefficients with the dense tables T_k [m, l, j] named in `tables` ("P", "dP", "mP_sin"):
        per order m the ring spectrum of field k is
        T_k,m c_m (times i where turned[k]); (..., M, L) -> (..., K, nlat, nlon).  The tables on the left of the
        coefficients write the members' spectra straight into the layout (order, field, ring, member) that the
        inverse FFT along the orders reads, which writes the grid in its own: no change of layout but the
        coefficients' (numpy's BLAS and ducc0's FFT on the CPU outside autograd, torch elsewhere: base.arrays)."""
        nmode = self.lmax + 1
        if coeffs.shape[-2:] != (nmode, nmode):
            raise ValueError(f"coefficients must have shape (..., {nmode}, {nmode}), got {tuple(coeffs.shape)}")
        coeffs = coeffs.to(device=self.device, dtype=self.complex_dtype)
        xp = program_namespace(coeffs)
        batch = coeffs.shape[:-2]
        columns = _order_columns(as_namespace(coeffs, xp).reshape(-1, nmode, nmode))
        spectrum = self._spectrum_buffer(xp, len(tables), columns.shape[2] // 2, nmode)
        rows = real_pairs(spectrum)
        for k, (name, turn) in enumerate(zip(tables, turned)):
            table = permute(as_namespace(getattr(self, "_" + name), xp), (0, 2, 1))
            matmul_runs_into(rows[:nmode, k], table, columns, self._runs[name], 2)
            if turn:
                spectrum[:nmode, k] *= 1j
        return self._ring_fields(spectrum, columns, batch)

    def _dense_sums(self, fields: tuple, tables: tuple) -> tuple[list, torch.Size]:
        """(the Legendre sums, the fields' batch shape) of real fields (..., nlat, nlon) with the dense tables named
        in `tables` ("P", "dP", "mP_sin"), the ring quadrature folded in: per order m, (T_k w)_m F[f_k]_m as complex
        (M, L, B).  The FFT writes the members' ring spectra in the layout (order, ring, member) that the tables on
        their left read: one program over numpy and torch, as `_dense_fields`."""
        for f in fields:
            if f.shape[-2:] != (self.nlat, self.nlon) or f.is_complex():
                raise ValueError(f"spatial arrays must be real of shape (..., {self.nlat}, {self.nlon}), "
                                 f"got {tuple(f.shape)}")
        xp = program_namespace(*fields)
        batch, nmode = fields[0].shape[:-2], self.lmax + 1
        count = math.prod(batch)
        sums = []
        for f, name in zip(fields, tables):
            values = as_namespace(f.to(device=self.device, dtype=self.dtype), xp).reshape(count, self.nlat, self.nlon)
            spectrum = empty_complex(values, (self.nlon // 2 + 1, self.nlat, count))
            rfft_into(permute(spectrum, (2, 1, 0)), values, 2)
            rows = empty(values, (nmode, nmode, 2 * count))
            matmul_runs_into(rows, self._weighted_table(name, xp), real_pairs(spectrum[:nmode]), self._runs[name], 1)
            sums.append(complex_pairs(rows))
        return sums, batch

    def _dense_coefficients(self, sums, batch: torch.Size) -> torch.Tensor:
        """Coefficients (..., M, L) from sums (M, L, B) as `_dense_sums` and `moments_adjoint` give them."""
        orders, degrees, count = sums.shape
        c = empty_complex(sums, (count, orders, degrees))
        copy_(permute(c, (1, 2, 0)), sums)
        return as_tensor(c).reshape(*batch, orders, degrees)

    def _ring_fields(self, spectrum, like, batch: torch.Size) -> torch.Tensor:
        """The fields (..., F, nlat, nlon) of ring spectra (order, F, ring, B): the inverse FFT along the orders,
        written in the fields' layout (an array of the kind of `like`)."""
        fields, count = spectrum.shape[1], spectrum.shape[3]
        grid = empty(like, (count, fields, self.nlat, self.nlon))
        irfft_into(permute(grid, (3, 1, 2, 0)), spectrum, self.nlon, 0)
        return as_tensor(grid).reshape(*batch, fields, self.nlat, self.nlon)

    def _weighted_table(self, name: str, xp):
        """The dense table `name` ("P", "dP", "mP_sin") [m, l, j] times the ring quadrature weights (made once)."""
        if name not in self._weighted:
            self._weighted[name] = getattr(self, "_" + name) * self._quadrature
        table = self._weighted[name]
        return table if xp is torch else table.numpy()

    def degree_filter(self, multiplier: np.ndarray) -> torch.Tensor:
        """The operator of f -> synthesis(mu_l analysis(f)) for a multiplier mu_l of the degree alone (lmax + 1,)
        on the ring Fourier coefficients, one (nlat x nlat) matrix per order m with the quadrature folded in,

            K_m[j, k] = sum_l Pbar_lm(x_j) mu_l Pbar_lm(x_k) w_k (2 pi / nlon),

        for `filtered`: one product over the rings instead of the analysis, the multiplication and the
        synthesis with their changes of layout.  Memory (lmax + 1) nlat^2 numbers."""
        P = legendre_values(self.lmax, self.cos_theta.cpu().double().numpy())  # [m, l, j]
        K = np.einsum("mlj,l,mlk->mjk", P, np.asarray(multiplier, dtype=np.float64), P)
        return torch.as_tensor(K * self._quadrature.cpu().double().numpy(), dtype=self.dtype, device=self.device)

    def filtered(self, f: torch.Tensor, operator: torch.Tensor) -> torch.Tensor:
        """synthesis(mu_l analysis(f)) for the operator `degree_filter(mu)`: (..., nlat, nlon) -> same.  The rings
        (B, nlat, m) are laid out as (m, nlat, 2 B) for one batched product over the orders, and back."""
        batch, count = f.shape[:-2], int(np.prod(f.shape[:-2], dtype=np.int64))
        rings = torch.fft.rfft(f.reshape(count, self.nlat, self.nlon), dim=-1)[..., : self.lmax + 1]
        columns = torch.view_as_real(rings).permute(2, 1, 0, 3).reshape(self.lmax + 1, self.nlat, 2 * count)
        filtered = torch.matmul(operator, columns).view(self.lmax + 1, self.nlat, count, 2).permute(2, 1, 0, 3)
        grid = torch.fft.irfft(torch.view_as_complex(filtered.contiguous()), n=self.nlon, dim=-1, norm="forward")
        return grid.reshape(*batch, self.nlat, self.nlon)

    def moment_filter(self, multiplier: np.ndarray, signs: tuple = (1, 1, 1)) -> "MomentTables":
        """The tables of `moments`: rho of degree lmax - 1 and the filtered moments of rho from rho's coefficients,
        these evaluated at diag(signs) x (signs (a, a, b) of +-1: a = -1 turns the longitudes by pi, which
        multiplies order m by (-1)^m, and b = -1 reflects the rings in the equator, the Gauss nodes being symmetric;
        both in the rows of K_m below, so that the moments of C = s diag(signs) need no permutation of the grid).

        With R_m(theta_j) = sum_l Pbar_lm(x_j) c_lm the ring coefficients of rho (R_{-m} = conj R_m) and K_m the
        operator of `degree_filter(mu)` on the ring Fourier coefficients (nlon R_m for a band-limited field), the
        fields rho x_k have ring coefficients cos(theta) R_m (x_3) and sin(theta) (R_{m-1} +- R_{m+1}) / 2 (x_1 and
        i x_2: x_1 +- i x_2 = sin(theta) e^{+-i phi}), so that, per order m,

            rho:        P_m c_m,              F[rho] = nlon K_m P_m c_m,     F[rho x_3] = nlon K_m cos(theta) P_m c_m,
            F[rho x_1] = p_m + q_m,   F[rho x_2] = -i (p_m - q_m),
            p_m = nlon K_m sin(theta) P_{m-1} c_{m-1} / 2,   q_m = nlon K_m sin(theta) P_{m+1} c_{m+1} / 2,

        with P_m[j, l] = Pbar_lm(x_j) of degree < lmax, c_{-1} = conj c_1 and c_m = 0 beyond lmax - 1: the
        analysis, the weights and the synthesis of rho x_k (degree lmax: exact on this grid) as products per
        order from the coefficients.

        The components of N = (F[rho x_1], F[rho x_2], F[rho x_3]) (`frame_moments`) along e_theta = (cos(theta)
        cos(phi), cos(theta) sin(phi), -sin(theta)), e_phi = (-sin(phi), cos(phi), 0) and x keep the order: with
        N_1 + i N_2 of ring coefficients 2 p_m and N_1 - i N_2 of 2 q_m (m >= 0), cos(phi) N_1 + sin(phi) N_2 has
        p_{m+1} + q_{m-1}, and

            F[<e_theta, N>]_m = cos(theta) (p_{m+1} + q_{m-1}) - sin(theta) F[rho x_3]_m = E_m c_m,
            F[<e_phi, N>]_m = i (q_{m-1} - p_{m+1}) = i F_m c_m,
            F[<x, N>]_m = sin(theta) (p_{m+1} + q_{m-1}) + cos(theta) F[rho x_3]_m = R_m c_m,
            E_m = nlon [cos(theta) (K_{m+1} + K_{m-1}) sin(theta) / 2 - sin(theta) K_m cos(theta)] P_m,
            F_m = nlon (K_{m-1} - K_{m+1}) sin(theta) P_m / 2,
            R_m = nlon [sin(theta) (K_{m+1} + K_{m-1}) sin(theta) / 2 + cos(theta) K_m cos(theta)] P_m,

        p_{m+1} and q_{m-1} both of c_m, and at m = 0 (q_{-1} = conj p_1, c_0 real) K_{-1} = K_1, so that
        E_0 c_0 = 2 Re p_1 and F_0 = 0.  Memory (5 lmax + 2) lmax nlat numbers for `moments`, 5 lmax^2 nlat for
        `frame_moments` (each made at its first use: `MomentTables`)."""
        turn, reflect = signs[0], signs[2]
        if signs[1] != turn:
            raise ValueError(f"moment_filter: signs (a, a, b), got {signs}")

        def build(kind: str) -> tuple:
            K = self.nlon * self.degree_filter(multiplier).cpu().double().numpy()  # [m, j, k]
            K = K * (turn ** np.arange(K.shape[0]))[:, None, None]
            if reflect < 0:
                K = K[:, ::-1]
            x = self.cos_theta.cpu().double().numpy()
            P = legendre_values(self.lmax - 1, x).transpose(0, 2, 1)  # [m, j, l], orders and degrees < lmax
            order = self.lmax
            sine = np.sqrt((1.0 - x) * (1.0 + x))[:, None]
            if kind == "moments":
                own = np.concatenate([P, K[:order] @ P, K[:order] @ (x[:, None] * P)], axis=1)
                # Orders -1 .. lmax + 1 of P (P_{-1} = P_1 acting on conj c_1; zero beyond the density's orders).
                shifted = np.concatenate([P[1:2], P, np.zeros((2,) + P.shape[1:])])
                tables = (own, *(0.5 * K @ (sine * shifted[first:first + order + 1]) for first in (0, 2)))
            else:
                # K_{m-1} and K_{m+1} of the orders m < lmax, K_{-1} = K_1; cos(theta) and sin(theta) on the left
                # are the frame's at the output ring, those within the product the channel's (x_3, |x_1 + i x_2|)
                # at the input ring
                lower, upper = np.concatenate([K[1:2], K[:order - 1]]), K[1:order + 1]
                horizontal, vertical = 0.5 * (upper + lower) @ (sine * P), K[:order] @ (x[:, None] * P)
                along_theta, along_phi = x[:, None] * horizontal - sine * vertical, 0.5 * (lower - upper) @ (sine * P)
                # the fields in the order of frame_moments' outputs, those the unnormalized kernel takes first
                tables = (np.concatenate([P, along_theta, along_phi, K[:order] @ P,
                                          sine * horizontal + x[:, None] * vertical], axis=1),)
            return tuple(torch.as_tensor(t, dtype=self.dtype, device=self.device) for t in tables)

        return MomentTables(build)

    def moments(self, coeffs: torch.Tensor, tables: "MomentTables") -> torch.Tensor:
        """rho and synthesis(mu_l analysis(rho y)) for y = 1, x_1, x_2, x_3 from the coefficients of rho (degree
        lmax - 1), with the tables of `moment_filter(mu)`: (..., lmax, lmax) -> (..., 5, nlat, nlon).

        The products write the ring spectra of all members straight into one buffer (order, field, ring, member)
        whose inverse FFT along the orders writes the fields in their own layout: no change of layout but the
        coefficients' (numpy's BLAS and ducc0's FFT on the CPU outside autograd, torch elsewhere: base.arrays)."""
        xp = program_namespace(coeffs)
        own, before, after = tables.on("moments", xp)
        own_runs, before_runs, after_runs = tables.runs("moments")
        order, nlat = self.lmax, self.nlat
        batch = coeffs.shape[:-2]
        columns = _order_columns(as_namespace(coeffs, xp).reshape(-1, order, order))
        count = columns.shape[2] // 2
        columns[0, :, 1::2] = 0  # a real field's c_l0 are real: their imaginary parts read as zero, as by synthesis
        spectrum = self._spectrum_buffer(xp, 5, count, order + 1)  # (nlon // 2 + 1, 5, nlat, B) complex
        rows = real_pairs(spectrum)
        # rho, F[rho], F[rho x_3] in fields 0..2 (x_3 then moves to field 4), p in field 3, q in `right`.
        matmul_runs_into(rows[:order, :3].reshape(order, 3 * nlat, 2 * count), own, columns, own_runs, 2)
        copy_(spectrum[:order, 4], spectrum[:order, 2])
        conjugate = clone(columns[1])
        conjugate.reshape(order, count, 2)[:, :, 1] *= -1  # c_{-1} = conj c_1
        matmul_into(rows[0, 3], before[0], conjugate)
        matmul_runs_into(rows[1:order + 1, 3], before[1:], columns, before_runs, 2)
        right = zeros(columns, (order + 1, nlat, 2 * count))  # q_m, zero for m >= lmax - 1
        matmul_runs_into(right[:order - 1], after[:order - 1], columns[1:], after_runs, 2)
        left = rows[:order + 1, 3]
        copy_(rows[:order + 1, 2], left + right)
        left -= right
        spectrum[:order + 1, 3] *= -1j
        return self._ring_fields(spectrum, columns, batch)

    def frame_moments(self, coeffs: torch.Tensor, tables: "MomentTables", normaliser: bool = True,
                      radial: bool = False) -> torch.Tensor:
        """rho, the frame components <e_theta, N>, <e_phi, N> of N = synthesis(mu_l analysis(rho y)) and Z =
        synthesis(mu_l analysis(rho)) (the channels of `moments`) from the coefficients of rho (degree lmax - 1),
        with the tables of `moment_filter(mu)`: (..., lmax, lmax) -> (..., 4, nlat, nlon), without Z (..., 3, nlat,
        nlon) unless `normaliser`; with `radial` the radial component <x, N> alone, (..., 1, nlat, nlon).

        The same fields as `moments` followed by the projection on the frame (to round-off), as one product per
        order (`moment_filter`'s E_m, F_m, R_m): four inverse FFTs (three without Z) where `moments` takes five, and
        no products for x_1 and x_2 of their own; the spectra's layout as in `moments`."""
        xp = program_namespace(coeffs)
        (frame,), (runs,) = tables.on("frame", xp), tables.runs("frame")
        order, nlat = self.lmax, self.nlat
        batch = coeffs.shape[:-2]
        columns = _order_columns(as_namespace(coeffs, xp).reshape(-1, order, order))
        columns[0, :, 1::2] = 0  # a real field's c_l0 are real, as in `moments`
        fields = 1 if radial else 4 if normaliser else 3
        spectrum = self._spectrum_buffer(xp, fields, columns.shape[2] // 2, order)
        rows = frame[:, 4 * nlat:] if radial else frame[:, :fields * nlat]
        matmul_runs_into(real_pairs(spectrum)[:order].reshape(order, fields * nlat, -1), rows, columns, runs, 2)
        if not radial:
            spectrum[:order, 2] *= 1j
        return self._ring_fields(spectrum, columns, batch)

    def frame_moments_adjoint(self, fields_bar: torch.Tensor, tables: "MomentTables") -> torch.Tensor:
        """The transpose of `frame_moments` (as `moments_adjoint` is of `moments`) applied to the cotangents of its
        three or four fields, (..., 3 or 4, nlat, nlon) -> (..., lmax, lmax); with a fifth, the cotangent of the
        radial component <x, N>, the sum of the transposes of `frame_moments(c)` and `frame_moments(c, radial=True)`,
        one product per order.

        Backwards through `frame_moments`: the ring spectra's cotangents are the fields' DFTs times the
        multiplicity of the order (as in `moments_adjoint`), <e_phi, N>'s times -i (the transpose of the i), and
        the table's transposes on the left (zero in the degrees below the order: its runs' rows)."""
        xp = program_namespace(fields_bar)
        (frame,), (runs,) = tables.on("frame", xp), tables.runs("frame")
        order, nlat = self.lmax, self.nlat
        batch, fields = fields_bar.shape[:-3], fields_bar.shape[-3]
        fields_bar = as_namespace(fields_bar, xp)
        spectrum = self._spectra_bar(fields_bar, order)
        count = spectrum.shape[3]
        spectrum[:, 2] *= -1j
        columns = empty(fields_bar, (order, order, 2 * count))
        matmul_runs_into(columns, permute(frame[:, :fields * nlat], (0, 2, 1)),
                         real_pairs(spectrum).reshape(order, fields * nlat, 2 * count), runs, 1)
        columns[0, :, 1::2] = 0
        return self._dense_coefficients(complex_pairs(columns), batch)

    def moments_adjoint(self, fields_bar: torch.Tensor, tables: "MomentTables") -> torch.Tensor:
        """The transpose of `moments` (its gradient with respect to the real and imaginary parts of the
        coefficients) applied to the cotangents of its five fields: (..., 5, nlat, nlon) -> (..., lmax, lmax).

        Backwards through `moments`: the ring spectra's cotangents are the fields' DFTs times the multiplicity of
        the order (irfft counts an order m > 0 twice, the imaginary part of m = 0 not at all), p_bar = x1_bar +
        i x2_bar and q_bar = x1_bar - i x2_bar (x_2 = -i (p - q)), and the tables' transposes on the left."""
        xp = program_namespace(fields_bar)
        own, before, after = tables.on("moments", xp)
        order, nlat = self.lmax, self.nlat
        batch = fields_bar.shape[:-3]
        spectrum = self._spectra_bar(as_namespace(fields_bar, xp), order + 1)
        count = spectrum.shape[3]
        rows = real_pairs(spectrum)  # (order + 1, 5, nlat, 2 B)
        turned = 1j * spectrum[:, 3]
        p_bar, q_bar = (real_pairs(spectrum[:, 2] + sign * turned) for sign in (1, -1))
        transpose = (0, 2, 1)
        columns = permute(own[:, :2 * nlat], transpose) @ rows[:order, :2].reshape(order, 2 * nlat, 2 * count)
        columns += permute(own[:, 2 * nlat:], transpose) @ rows[:order, 4]
        columns += permute(before[1:], transpose) @ p_bar[1:]
        columns[1:] += permute(after[:order - 1], transpose) @ q_bar[:order - 1]
        conjugate = permute(before[0], (1, 0)) @ p_bar[0]
        conjugate.reshape(order, count, 2)[:, :, 1] *= -1  # c_{-1} = conj c_1
        columns[1] += conjugate
        columns[0, :, 1::2] = 0
        return self._dense_coefficients(complex_pairs(columns), batch)

    def _spectra_bar(self, fields_bar, orders: int):
        """The ring spectra's cotangents (orders, fields, nlat, B) of the fields (..., fields, nlat, nlon) that
        `moments` and `frame_moments` synthesise from their first `orders` orders: the fields' DFTs times the
        multiplicity of the order (irfft counts an order m > 0 twice, the imaginary part of m = 0 not at all)."""
        grid = fields_bar.reshape((-1,) + tuple(fields_bar.shape[-3:]))
        spectrum = empty_complex(grid, (self.nlon // 2 + 1, grid.shape[1], self.nlat, grid.shape[0]))
        rfft_into(permute(spectrum, (3, 1, 2, 0)), grid, 3)
        spectrum = spectrum[:orders]
        spectrum[1:] *= 2
        return spectrum

    def _spectrum_buffer(self, xp, fields: int, count: int, orders: int):
        """A buffer of ring spectra (order, field, ring, member) for `moments`, `frame_moments` and `_dense_fields`,
        zero beyond the first `orders` orders, which they write: numpy's kept, one per shape and `orders` (what
        they never write stays zero), torch's new (autograd may hold it)."""
        shape = (self.nlon // 2 + 1, fields, self.nlat, count)
        if xp is torch:
            return torch.zeros(shape, dtype=self.complex_dtype, device=self.device)
        if (shape, orders) not in self._spectra:
            self._spectra[shape, orders] = torch.zeros(shape, dtype=self.complex_dtype).numpy()
        return self._spectra[shape, orders]

    # --- vector transforms ---------------------------------------------------------------------

    def vector_analysis(self, v_theta: torch.Tensor, v_phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Spheroidal and toroidal coefficients of v = grad S - e_r x grad T (S_00 = T_00 = 0):

        S_lm = 1/(l(l+1)) integral v . conj(grad Y_lm),   T_lm = 1/(l(l+1)) integral v . conj(-e_r x grad Y_lm),

        i.e. per order m, with V^m(theta_j) the weighted ring Fourier coefficients,
        S_lm = [sum_j dPbar_lm V_theta^m - i m Pbar_lm / sin(theta) V_phi^m] / (l(l+1)),
        T_lm = -[sum_j i m Pbar_lm / sin(theta) V_theta^m + dPbar_lm V_phi^m] / (l(l+1)).
        """
        rings, batch = self._fourier_rows(self._pair(v_theta, v_phi, self.dtype))
        half = rings.shape[0] // 2
        d_part = self._legendre.analysis(rings, self._dP, odd=True)  # (dP V_theta, dP V_phi)
        m_part = self._legendre.analysis(_times_i(rings), self._mP_sin, odd=False)  # (mP/s i V_theta, mP/s i V_phi)
        S = (d_part[:half] - m_part[half:]) * self._inverse_eigenvalue
        T = -(m_part[:half] + d_part[half:]) * self._inverse_eigenvalue
        return self._coefficients(S, batch[1:]), self._coefficients(T, batch[1:])

    def vector_synthesis(self, S: torch.Tensor, T: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """v_theta = dS/dtheta + (1/sin theta) dT/dphi, v_phi = (1/sin theta) dS/dphi - dT/dtheta, i.e. per order m

        v_theta^m = sum_l dPbar_lm S_lm + i m Pbar_lm / sin(theta) T_lm,
        v_phi^m   = sum_l i m Pbar_lm / sin(theta) S_lm - dPbar_lm T_lm   (real fields as in ``synthesis``).
        """
        rows, batch = self._spectral_rows(self._pair(S, T, self.complex_dtype))
        half = rows.shape[0] // 2
        d_part = self._legendre.synthesis(rows, self._dP, odd=True)  # (dP S, dP T)
        m_part = self._legendre.synthesis(_times_i(rows), self._mP_sin, odd=False)  # (mP/s iS, mP/s iT)
        v_theta = d_part[:half] + m_part[half:]
        v_phi = m_part[:half] - d_part[half:]
        v = self._grid(torch.cat((v_theta, v_phi)), batch)
        return v[0], v[1]

    def gradient(self, coeffs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """grad f = (df/dtheta, (1/sin theta) df/dphi) from the coefficients of f (= vector_synthesis(coeffs, 0))."""
        if self.layout == "dense":
            frame = self.gradient_frame(coeffs)
            return frame[..., 0, :, :], frame[..., 1, :, :]
        rows, batch = self._spectral_rows(coeffs)
        v_theta = self._legendre.synthesis(rows, self._dP, odd=True)
        v_phi = self._legendre.synthesis(_times_i(rows), self._mP_sin, odd=False)
        v = self._grid(torch.cat((v_theta, v_phi)), (2, *batch))
        return v[0], v[1]

    def gradient_frame(self, coeffs: torch.Tensor) -> torch.Tensor:
        """`gradient`'s two components stacked: (..., M, L) -> (..., 2, nlat, nlon); with the dense tables per order
        m (v_theta)_m = dPbar_m c_m and (v_phi)_m = i m Pbar_m / sin(theta) c_m (`_dense_fields`)."""
        if self.layout != "dense":
            return torch.stack(self.gradient(coeffs), dim=-3)
        return self._dense_fields(coeffs, ("dP", "mP_sin"), (False, True))

    def divergence(self, v_theta: torch.Tensor, v_phi: torch.Tensor) -> torch.Tensor:
        """Coefficients of div v = Lap S, i.e. -l(l+1) S_lm:

        (div v)_lm = -integral v . conj(grad Y_lm) = sum_j i m Pbar_lm / sin(theta) V_phi^m - dPbar_lm V_theta^m.

        The l = 0 coefficient is exactly 0 (dPbar_00 = 0, m = 0): mass is conserved by construction.
        """
        if self.layout == "dense" and torch.is_tensor(v_theta) and torch.is_tensor(v_phi) \
                and v_theta.shape == v_phi.shape:
            (derivative, order_sine), batch = self._dense_sums((v_theta, v_phi), ("dP", "mP_sin"))
            return self._dense_coefficients(1j * order_sine - derivative, batch)
        rings, batch = self._fourier_rows(self._pair(v_theta, v_phi, self.dtype))
        half = rings.shape[0] // 2
        div = (self._legendre.analysis(_times_i(rings[half:]), self._mP_sin, odd=False)
               - self._legendre.analysis(rings[:half], self._dP, odd=True))
        return self._coefficients(div, batch[1:])

