"""
Kuramoto against its closed form
================================

At beta = 0 with the unnormalized kernel and V = K I the model is the noisy Kuramoto model, whose
stationary order parameter r solves r = I1(K r / eps) / I0(K r / eps): a nonzero solution exists
for eps < K / 2 (here K = 1). ``cases/kuramoto-s1.toml`` (eps = 0.25) states r = 0.8314620248.
We run the Eulerian solver to t = 40 for several eps and compare its final order parameter with
the closed form.
"""

import pathlib

import matplotlib.pyplot as plt
import numpy as np
from scipy.optimize import brentq
from scipy.special import ive

import spherepde

# the case files of the repository (a source checkout: the package lies beside cases/)
CASES = str(pathlib.Path(spherepde.__file__).resolve().parents[1] / "cases")


def stationary_r(eps: float, coupling: float = 1.0) -> float:
    """The nonzero root of r = I1(K r / eps) / I0(K r / eps), or 0 when there is none (eps >= K / 2)."""
    if eps >= coupling / 2:
        return 0.0
    return brentq(lambda r: ive(1, coupling * r / eps) / ive(0, coupling * r / eps) - r, 1e-9, 1.0)


noises = [0.15, 0.25, 0.35, 0.8]
runs = {eps: spherepde.run(spherepde.load_case(CASES + "/kuramoto-s1.toml", overrides=[
    f"model.eps={eps}", "time.t_end=40.0", "time.save_every=1.0"])) for eps in noises}

# %%
# Each run's order parameter over depth tends to the closed form (dashed); on the right, the
# final values against the bifurcation curve r(eps).

figure, (history, curve) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
for eps, ds in runs.items():
    line, = history.plot(ds["time"], ds["order_parameter"], label=f"eps = {eps:g}")
    history.axhline(stationary_r(eps), color=line.get_color(), linestyle="--", linewidth=1)
history.set(xlabel="time (depth)", ylabel="order parameter r", title="Eulerian runs, closed form dashed")
history.legend()
grid = np.linspace(0.05, 0.9, 200)
curve.plot(grid, [stationary_r(eps) for eps in grid], "k-", label="r = I1(r/eps) / I0(r/eps)")
curve.plot(noises, [float(ds["order_parameter"][-1]) for ds in runs.values()], "o", label="Eulerian, t = 40")
curve.set(xlabel="eps", ylabel="stationary r", title="the bifurcation at eps = K / 2")
curve.legend()
plt.show()

for eps, ds in runs.items():
    print(f"eps = {eps:.2f}: Eulerian r(40) = {float(ds['order_parameter'][-1]):.10f}, "
          f"closed form {stationary_r(eps):.10f}")
