"""Gauss–Legendre nodes and orthonormal associated Legendre tables (pure numpy, float64).

Conventions (shared by both transform backends, identical to shtns's ``sht_orthonormal``):

* theta is the colatitude, x = cos(theta); grid latitudes are ordered north to south
  (x decreasing), as in shtns's Gauss grid.
* Pbar_lm(x) is the orthonormal associated Legendre function with the Condon–Shortley phase,

      Pbar_lm(x) = (-1)^m sqrt((2l+1)/(4 pi) (l-m)!/(l+m)!) (1-x^2)^(m/2) d^m/dx^m P_l(x),

  so that Y_lm = Pbar_lm(cos theta) e^{i m phi} has integral of |Y_lm|^2 over S^2 equal to 1,
  i.e. 2 pi * integral_{-1}^{1} Pbar_lm(x)^2 dx = 1.  Example: Pbar_11 = -sqrt(3/(8 pi)) sin(theta).

Memory: each table is a dense padded array [m, l, j] of (lmax+1)^2 nlat float64 numbers,
O(L^2 nlat) = O(L^3) on a grid with nlat ~ 3(L+1)/2: 0.2 GB per table at lmax 255, nlat 384;
1.6 GB at lmax 511, nlat 768 (building them takes about twice that transiently).  Entries with
l < m are stored as zeros so that one batched matmul over m does a whole Legendre transform;
a triangular packing of the l >= m entries would halve the memory.
"""

import math

import numpy as np

# Every grid's degree is below this (sphere.lmax's range in spherepde.io.case_schema).
LMAX_LIMIT = 2 ** 15
# Mantissas of the scaled Legendre recurrence are renormalised once they exceed 2**_RESCALE_BITS.
_RESCALE_BITS = 600


def dealiased_gauss_latitudes(lmax: int, minimum: int = 0) -> int:
    """Smallest even nlat >= 3 (lmax + 1) / 2 (and >= `minimum`): the latitudes of the dealiased Gauss grid."""
    nlat = max(math.ceil(3 * (lmax + 1) / 2), minimum)
    return nlat + nlat % 2


def check_grid(lmax: int, nlat: int, nlon: int) -> None:
    """Raise ValueError unless a Gauss grid (nlat, nlon) resolves degree and order lmax exactly."""
    if lmax < 0:
        raise ValueError(f"lmax must be >= 0, got {lmax}")
    if nlat <= lmax:
        raise ValueError(
            f"nlat = {nlat} must exceed lmax = {lmax}: Gauss quadrature on nlat nodes is exact only to degree "
            "2 nlat - 1"
        )
    if nlon <= 2 * lmax:
        raise ValueError(f"nlon = {nlon} must exceed 2 lmax = {2 * lmax}: orders |m| <= lmax alias on fewer longitudes")


def gauss_legendre(nlat: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss–Legendre nodes x_j = cos(theta_j), ordered north to south, and weights w_j.

    The quadrature sum_j w_j g(x_j) equals integral_{-1}^{1} g(x) dx for every polynomial g
    of degree <= 2 nlat - 1; the weights sum to 2.  The nodes are the roots of P_nlat, found
    by Newton's method in the colatitude theta (accurate sin(theta) near the poles), and

        w_j = 2 / (dP_nlat/dtheta)^2,   sin(theta) dP_n/dtheta = -n (P_{n-1}(x) - x P_n(x)).
    """
    if nlat < 1:
        raise ValueError(f"gauss_legendre: nlat must be >= 1, got {nlat}")
    n = nlat
    k = np.arange(1, n + 1)
    # Extended precision (80-bit on x86): near the poles P_{n-1}(x_j) is small and the double
    # recurrence loses ~n eps of it, which would cost ~1e-11 relative accuracy in w_j.
    theta = np.pi * (k - np.longdouble(0.25)) / (n + np.longdouble(0.5))  # Tricomi's guess, increasing theta

    def legendre_pair(x):
        """P_n(x) and P_{n-1}(x) by the three-term recurrence."""
        p_prev, p = np.zeros_like(x), np.ones_like(x)
        for ell in range(1, n + 1):
            p_prev, p = p, ((2 * ell - 1) * x * p - (ell - 1) * p_prev) / ell
        return p, p_prev

    # Newton converges quadratically: once a step is below 1e-10, one more step leaves an error
    # ~ n * 1e-20, below the extended-precision round-off; stepping further only adds noise.
    last_step = np.inf
    while last_step >= 1e-10:
        x, s = np.cos(theta), np.sin(theta)
        p_n, p_nm1 = legendre_pair(x)
        dp_dtheta = -n * (p_nm1 - x * p_n) / s  # sin(theta) dP_n/dx = n (P_{n-1} - x P_n)/sin(theta)
        step = p_n / dp_dtheta
        theta = theta - step
        last_step, previous_step = np.max(np.abs(step)), last_step
        if last_step >= previous_step:
            raise RuntimeError(f"gauss_legendre: Newton iteration for nlat = {n} does not converge")
    x, s = np.cos(theta), np.sin(theta)
    p_n, p_nm1 = legendre_pair(x)
    # Keeping the x P_n term makes w insensitive to the last bits of theta (P_{n-1} alone is
    # near one of its own zeros at the polar nodes).
    weights = 2 / (n * (p_nm1 - x * p_n) / s) ** 2
    # Exact symmetry about the equator (x_j = -x_{n-1-j}, an exact 0 at the centre when n is odd).
    x = (0.5 * (x - x[::-1])).astype(np.float64)
    weights = (0.5 * (weights + weights[::-1])).astype(np.float64)
    return x, weights


def legendre_values(lmax: int, cos_theta) -> np.ndarray:
    """P[m, l, j] = Pbar_lm(x_j) (lmax+1, lmax+1, nlat), zero where l < m: `legendre_tables`' first table alone
    (its recurrences and range handling are documented there)."""
    x = np.asarray(cos_theta, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError("legendre_values: cos_theta must be a 1-d array")
    if lmax < 0:
        raise ValueError(f"legendre_values: lmax must be >= 0, got {lmax}")
    nmode = lmax + 1
    nlat = x.size
    sin_theta = np.sqrt((1.0 - x) * (1.0 + x))

    # Sectoral values Pbar_mm = mant_mm * 2**exp_mm, renormalised exactly with frexp at every m.
    mant_mm = np.empty((nmode, nlat))
    exp_mm = np.zeros((nmode, nlat), dtype=np.int64)
    mant_mm[0] = 1.0 / np.sqrt(4.0 * np.pi)
    for m in range(1, nmode):
        value = -np.sqrt((2 * m + 1) / (2 * m)) * sin_theta * mant_mm[m - 1]
        mant_mm[m], shift = np.frexp(value)
        exp_mm[m] = exp_mm[m - 1] + shift

    P = np.zeros((nmode, nmode, nlat))
    m_all = np.arange(nmode)
    P[m_all, m_all] = np.ldexp(mant_mm, exp_mm)
    # Diagonal recurrence: at step k, arrays over m = 0..lmax-k hold the mantissas of
    # Pbar_{m+k-1,m} (current) and Pbar_{m+k-2,m} (previous) sharing the exponent `exponent`.
    previous = np.zeros((nmode, nlat))
    current = mant_mm.copy()
    exponent = exp_mm.copy()
    a_previous = None  # a_{l-1,m} of the previous step
    for k in range(1, nmode):
        m = m_all[: nmode - k]
        ell = m + k
        a = np.sqrt((4.0 * ell**2 - 1.0) / (ell**2 - m**2))
        b = a / a_previous[: nmode - k] if k > 1 else np.zeros_like(a)  # Pbar_{m-1,m} = 0
        new = a[:, None] * x * current[: nmode - k] - b[:, None] * previous[: nmode - k]
        previous, current, exponent = current[: nmode - k], new, exponent[: nmode - k]
        big = np.abs(current) > 2.0**_RESCALE_BITS
        if big.any():
            current = np.where(big, np.ldexp(current, -_RESCALE_BITS), current)
            previous = np.where(big, np.ldexp(previous, -_RESCALE_BITS), previous)
            exponent = exponent + _RESCALE_BITS * big
        P[m, ell] = np.ldexp(current, exponent)
        a_previous = a
    return P


def legendre_tables(lmax: int, cos_theta) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Orthonormal Legendre tables at the nodes x_j = cos(theta_j), each of shape (lmax+1, lmax+1, nlat).

    Returns ``(P, dP, mP_sin)`` indexed [m, l, j], zero where l < m:

    * P[m, l, j]      = Pbar_lm(x_j)
    * dP[m, l, j]     = d Pbar_lm / d theta at theta_j
    * mP_sin[m, l, j] = m Pbar_lm(x_j) / sin(theta_j)

    P follows the stable recurrences for orthonormal functions,

        Pbar_00 = 1/sqrt(4 pi),   Pbar_mm = -sqrt((2m+1)/(2m)) sin(theta) Pbar_{m-1,m-1},
        Pbar_lm = a_lm (x Pbar_{l-1,m} - Pbar_{l-2,m} / a_{l-1,m}),   a_lm = sqrt((4l^2-1)/(l^2-m^2)),

    run in the diagonal index k = l - m for all m at once.  The values are carried as
    mantissa * 2**exponent (exponent per m and node), so sin^m(theta), which underflows for
    large m near the poles, never does: every entry is exact to round-off or, when its true
    magnitude is below the smallest double, a graceful (subnormal or zero) underflow.

    The derivative tables use the ladder identities (Condon–Shortley phase), which involve no
    division by sin(theta):

        dPbar_lm/dtheta = 1/2 [sqrt((l-m)(l+m+1)) Pbar_{l,m+1} - sqrt((l+m)(l-m+1)) Pbar_{l,m-1}],
        (dPbar_l0/dtheta = sqrt(l(l+1)) Pbar_l1),
        m Pbar_lm / sin(theta) = -1/2 sqrt((2l+1)/(2l-1))
                                 [sqrt((l+m)(l+m-1)) Pbar_{l-1,m-1} + sqrt((l-m)(l-m-1)) Pbar_{l-1,m+1}].
    """
    P = legendre_values(lmax, cos_theta)
    nmode, nlat = lmax + 1, P.shape[-1]
    m_all = np.arange(nmode)

    # Ladder identities; P padded with a zero row m = lmax+1 and a zero column l = -1.
    P_pad = np.zeros((nmode + 1, nmode + 1, nlat))
    P_pad[:nmode, 1:] = P
    m_grid = m_all[:, None].astype(np.float64)
    l_grid = m_all[None, :].astype(np.float64)
    valid = (l_grid >= m_grid)[:, :, None]
    P_up = P_pad[1:, 1:]  # Pbar_{l,m+1}
    P_down = np.concatenate([-P_pad[1:2, 1:], P_pad[: nmode - 1, 1:]])  # Pbar_{l,m-1}, Pbar_{l,-1} = -Pbar_{l,1}
    c_up = np.sqrt(np.maximum((l_grid - m_grid) * (l_grid + m_grid + 1), 0.0))[:, :, None]
    c_down = np.sqrt(np.maximum((l_grid + m_grid) * (l_grid - m_grid + 1), 0.0))[:, :, None]
    dP = np.where(valid, 0.5 * (c_up * P_up - c_down * P_down), 0.0)

    P_up_prev = P_pad[1:, :nmode]  # Pbar_{l-1,m+1}
    P_down_prev = np.concatenate([np.zeros((1, nmode, nlat)), P_pad[: nmode - 1, :nmode]])  # Pbar_{l-1,m-1}
    c_ratio = np.sqrt((2 * l_grid + 1) / np.maximum(2 * l_grid - 1, 1.0))[:, :, None]
    c_up = np.sqrt(np.maximum((l_grid - m_grid) * (l_grid - m_grid - 1), 0.0))[:, :, None]
    c_down = np.sqrt(np.maximum((l_grid + m_grid) * (l_grid + m_grid - 1), 0.0))[:, :, None]
    mP_sin = np.where(valid & (m_grid > 0)[:, :, None], -0.5 * c_ratio * (c_down * P_down_prev + c_up * P_up_prev), 0.0)
    return P, dP, mP_sin
