"""
Zero temperature: the invariant hemisphere masses
=================================================

The low-temperature paper's baseline at beta = inf (``cases/baseline-inf.toml``): without noise the
masses of two hemispheres are invariant while the density contracts, until the grid loses it.

The attention mean is the local field ``m(x) = B^T x / |B^T x|``, with V = diag(-1, 1, -2) and
B = diag(-1, -1, 1), so V B^T = diag(1, -1, -2) and its leading eigenspace is E = span(e1). The masses
of the hemispheres {x1 > 0} and {x1 < 0} are invariant (the projection Pi_# rho_t = Pi_# rho_0)
while the density contracts across E at rates 2 and 3: the Lyapunov functional
``V_p = int (|(I - P_E) x|^2 / |P_E x|^2)^p drho`` decays.

The contraction is exponential, so every grid eventually loses it: this run says from which
depth on it is under-resolved (``resolved_until``, when the spectral tail passes
``diagnostics.tail_tol``), and the invariants hold to round-off up to there and drift after.
"""

import pathlib
import warnings

import matplotlib.pyplot as plt
import numpy as np

import spherepde
from spherepde.analysis.concentration import hemisphere_mass

# the case files of the repository (a source checkout: the package lies beside cases/)
CASES = str(pathlib.Path(spherepde.__file__).resolve().parents[1] / "cases")

case = spherepde.load_case(CASES + "/baseline-inf.toml", overrides=["time.t_end=1.5"])
with warnings.catch_warnings(record=True) as caught:  # the run warns when it loses its resolution
    warnings.simplefilter("always")
    ds = spherepde.run(case)
print(*{str(warning.message) for warning in caught}, sep="\n")
resolved_until = float(ds.attrs["resolved_until"])
print(f"resolved until t = {resolved_until:g}")

# %%
# The hemisphere mass rho_t({x1 > 0}) stays at its initial value to round-off while the run is
# resolved; the Lyapunov functional falls; the spectral tail tells when to
# stop trusting the run (shaded).

time = ds["time"].values
upper = hemisphere_mass(ds, [1.0, 0.0, 0.0])
drift = np.abs(upper - upper[0])
figure, axes = plt.subplots(1, 3, figsize=(13, 4), layout="constrained")
axes[0].semilogy(time, np.maximum(drift, 1e-17), "o-")
axes[0].set(title="|rho_t(x1 > 0) - rho_0(x1 > 0)|", xlabel="time (depth)")
for p in ds["lyapunov_p"].values:
    axes[1].semilogy(time, ds["lyapunov"].sel(lyapunov_p=p), "o-", label=f"p = {p:g}")
axes[1].set(title="Lyapunov functional V_p", xlabel="time (depth)")
axes[1].legend()
axes[2].semilogy(time, ds["spectral_tail"], "o-")
axes[2].axhline(case["diagnostics"]["tail_tol"], color="k", linestyle="--", label="diagnostics.tail_tol")
axes[2].set(title="spectral tail (resolution indicator)", xlabel="time (depth)")
axes[2].legend()
for axis in axes:
    axis.axvspan(resolved_until, time[-1], color="0.85", zorder=0)
plt.show()

resolved = time <= resolved_until
print(f"initial mass of {{x1 > 0}}: {upper[0]:.12f}; largest drift while resolved: {drift[resolved].max():.1e}, "
      f"at the end: {drift[-1]:.1e}")
