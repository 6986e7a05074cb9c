"""
A small training and its three phases
=====================================

The training paper's align case (``cases/seed004-align-l065.toml``: unnormalized attention with
B = V = diag(1, 0.65), beta = 1, on S^1) at a reduced scale: eps = 0.05, lmax 24, depth T = 16 in
16 layers, 20 Adam iterations.

The feed-forward matrix W_t is trained to minimise
``J = l(mu_T) + lambda_reg / 2 int |W_t|^2 dt`` (``control.lambda_reg``) with l
the align loss towards e_2; each gradient comes from the adjoint equation stepped backward.

The trained dynamics shows the paper's three phases in the energy gap
Delta(t) = E(mu_t) - min E: the tokens cluster (Delta falls across an initial layer), sit on a
turnpike plateau near the Gibbs minimiser, and escape towards the target in a terminal layer.
"""

import pathlib
import warnings

import matplotlib.pyplot as plt
import numpy as np

import spherepde

# the case files of the repository (a source checkout: the package lies beside cases/)
CASES = str(pathlib.Path(spherepde.__file__).resolve().parents[1] / "cases")

case = spherepde.load_case(CASES + "/seed004-align-l065.toml", overrides=[
    "model.eps=0.05", "sphere.lmax=24", "time.dt=0.1", "time.t_end=16.0", "control.layers=16",
    "solver.field='dense'", "control.iterations=20", "control.learning_rate=0.05",
    "control.gradient='continuous'", "control.tol=0.0"])
with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # the initial cluster's tail passes tail_tol at lmax 24
    ds = spherepde.run(case)
for key in ("three_phase", "initial_width", "plateau_width", "terminal_width", "terminal_lift",
            "escape_rate", "rayleigh_quotient", "optimizer_stop"):
    print(f"{key} = {ds.attrs[key]}")

# %%
# The energy gap with the plateau (between the initial and the terminal layer) shaded, the angle
# of the mean (the cluster turns to the target pi / 2 only at the end), the cost over the
# iterations, and the trained ``|W_t|_F`` per layer, which grows towards the output layer.

time = ds["time"].values
T = time[-1]
figure, axes = plt.subplots(2, 2, figsize=(12, 7), layout="constrained")
axes[0, 0].semilogy(time, ds["energy_gap"], "o-", markersize=3)
axes[0, 0].axvspan(ds.attrs["initial_width"], T - ds.attrs["terminal_width"], color="0.88", zorder=0,
                   label="plateau")
axes[0, 0].set(title=f"energy gap (three_phase = {ds.attrs['three_phase']})", xlabel="time (depth)")
axes[0, 0].legend()
axes[0, 1].plot(time, ds["mean_angle"], "o-", markersize=3)
axes[0, 1].axhline(np.pi / 2, color="k", linestyle="--", label="target e_2")
axes[0, 1].set(title="angle of the mean (radian)", xlabel="time (depth)")
axes[0, 1].legend()
axes[1, 0].semilogy(ds["iteration"], ds["loss"], "o-", label="J")
axes[1, 0].semilogy(ds["iteration"], ds["terminal_loss"], "s-", markersize=3, label="l(mu_T)")
axes[1, 0].set(title="training", xlabel="Adam iteration")
axes[1, 0].legend()
norms = np.sqrt((ds["W"] ** 2).sum(("row", "col")))
axes[1, 1].stairs(norms, np.append(ds["layer_time"].values, T))
axes[1, 1].set(title="|W_t|_F per layer", xlabel="time (depth)")
plt.show()
