"""Figures quoted by the user guide, recomputed independently of the code that produces them."""

from pathlib import Path

import numpy as np
import pytest
from scipy.special import eval_legendre, spherical_in

import spherepde
from spherepde.discretisation.timesteppers import SCHEMES, stability_bound

QUICKSTART = Path(__file__).resolve().parent.parent / "cases" / "quickstart.toml"


@pytest.mark.parametrize("scheme, bound", [("imex-ark436", 4.00), ("rk4", 2.83), ("lawson-rk4", 2.83),
                                           ("imex-ars443", 1.57)])
def test_transport_stability_bounds_of_case_files_guide(scheme, bound):
    """docs/guide/case-files.md "Bad input": lmax max|v| dt is stable up to the first y with |R(iy)| > 1, R(z) =
    1 + z b^T (I - z A)^-1 1 of the explicit tableau, found here by scanning the resolvent."""
    tableau = SCHEMES[scheme][1]
    a = np.array([[float(x) for x in row] for row in tableau.a])
    b = np.array([float(x) for x in tableau.b])
    ones = np.ones(len(b))
    ys = np.arange(1, 60001) * 1e-4
    stages = np.linalg.solve(np.eye(len(b)) - 1j * ys[:, None, None] * a, np.broadcast_to(ones[:, None],
                                                                                       (len(ys), len(b), 1)))
    gain = np.abs(1 + 1j * ys * (stages[..., 0] @ b))
    first = ys[np.argmax(gain > 1 + 1e-12)]
    assert first == pytest.approx(bound, abs=5e-3)
    assert stability_bound(scheme, 1j) == pytest.approx(first, abs=2e-4)


def test_quickstart_initial_tail_of_case_files_guide():
    """docs/guide/case-files.md "Bad input": the quick-start's vMF mixture leaves 0.24 of its L2 norm in the degrees
    l > 2 lmax / 3 at lmax 4, and 15 is the first lmax whose tail is within 1e-6.  By Funk-Hecke the degree-l part of
    sum_j w_j C_j exp(kappa_j <mu_j, x>) has squared norm 4 pi (2 l + 1) sum_jk a_j a_k P_l(<mu_j, mu_k>), a_j =
    w_j C_j i_l(kappa_j), C_j = kappa_j / (4 pi sinh kappa_j)."""
    means = np.array([[1.0, 0.0, 0.2], [-0.5, 0.8, 0.0], [-0.3, -0.7, -0.6]])
    means /= np.linalg.norm(means, axis=1)[:, None]
    kappas, weights = np.full(3, 3.0), np.array([0.4, 0.35, 0.25])
    scale = weights * kappas / (4 * np.pi * np.sinh(kappas))
    cosines = means @ means.T
    energy = np.array([4 * np.pi * (2 * l + 1) * (scale * spherical_in(l, kappas)) @ eval_legendre(l, cosines)
                       @ (scale * spherical_in(l, kappas)) for l in range(40)])

    def tail(lmax):
        kept = energy[: lmax + 1]
        return np.sqrt(kept[np.arange(lmax + 1) > 2 * lmax // 3].sum() / kept.sum())

    assert tail(4) == pytest.approx(0.24, abs=5e-3)
    assert next(lmax for lmax in range(2, 39) if tail(lmax) <= 1e-6) == 15

    case = spherepde.load_case(QUICKSTART, overrides=["sphere.lmax=4"])
    with pytest.raises(spherepde.CaseError, match=r"spectral tail 0\.24 > 0\.2 .*sphere\.lmax >= 15 "):
        spherepde.run(case, progress=False)
