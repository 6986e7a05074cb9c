"""
Eulerian against particles
==========================

The particle solver simulates the same model with n tokens, dX = v[mu_n](X) dt + sqrt(2 eps) dB;
the Eulerian density is its limit n -> infinity. ``solver.method = "both"`` runs the two on one
case and writes one file; ``spherepde.analysis.compare.compare`` (what ``spherepde compare``
runs) asks, diagnostic by diagnostic, whether the difference stays within k = 3 standard errors
at every shared save, and measures W2(t) between the two measures.

Here: the noisy Kuramoto case on S^1 with 4000 particles in 10 independent replicas, so that the
standard errors come from batch means and stay honest while the interaction correlates the tokens.
"""

import pathlib

import matplotlib.pyplot as plt

import spherepde
from spherepde.analysis.compare import compare
from spherepde.io.output import split_both

# the case files of the repository (a source checkout: the package lies beside cases/)
CASES = str(pathlib.Path(spherepde.__file__).resolve().parents[1] / "cases")

case = spherepde.load_case(CASES + "/kuramoto-s1.toml", overrides=[
    "solver.method='both'", "time.t_end=10.0", "time.save_every=1.0",
    "particles.n=4000", "particles.replicas=10", "particles.seed=1"])
eulerian, particles = split_both(spherepde.run(case))
report = compare(eulerian, particles, labels=("Eulerian", "particles"))
print(report.attrs["report"])

# %%
# The Eulerian order parameter (line) and the particles' (dots with bands of +-3 standard
# errors), their difference in standard errors, and W2 between the two measures, about the
# sampling error of the 1000 tokens saved (particles.save) of the 4000 run.

k = report.attrs["k"]
time = report["time"]
figure, axes = plt.subplots(1, 3, figsize=(13, 4), layout="constrained")
se = report["order_parameter_stderr"]
axes[0].plot(time, report["order_parameter_a"], "-", label="Eulerian")
axes[0].errorbar(time, report["order_parameter_b"], yerr=k * se, fmt="o", markersize=3, capsize=2,
                 label=f"particles, +-{k:g} s.e.")
axes[0].set(title=f"order parameter: {report.attrs['verdict_order_parameter']}", xlabel="time (depth)")
axes[0].legend()
axes[1].plot(time, report["order_parameter_z"], "o-", markersize=3, label="order_parameter")
for component in report["component"].values:
    axes[1].plot(time, report["mean_z"].sel(component=component), "o-", markersize=3, label=f"mean[{component}]")
axes[1].axhspan(-k, k, color="0.9", zorder=0)
axes[1].set(title="z = (particles - Eulerian) / s.e.", xlabel="time (depth)")
axes[1].legend()
axes[2].plot(time, report["w2"], "o-")
axes[2].set(title="W2(t) between the two measures", xlabel="time (depth)")
plt.show()

for name in ("mass", "mean", "order_parameter", "w2_projection"):
    print(f"{name}: {report.attrs['verdict_' + name]} "
          f"(chance of a worst |z| this large: {report.attrs['max_z_probability_' + name]:.2f})")
