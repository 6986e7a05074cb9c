"""
Clustering on S^2
=================

The quick-start case (``cases/quickstart.toml``): softmax self-attention on the 2-sphere with
B = V = I, beta = 1 and a little noise (eps = 0.12). Three token clouds, a mixture of von
Mises-Fisher laws, merge into one cluster within a few units of depth.

The order parameter ``|int x drho|`` rises from 0.128 to 0.739 at t = 6 (one cluster by t = 2.5, still
tightening) while the mass stays 1 to round-off (2.2e-16; the transport is in flux form).
"""

import pathlib

import matplotlib.pyplot as plt
import numpy as np

import spherepde

# the case files of the repository (a source checkout: the package lies beside cases/)
CASES = str(pathlib.Path(spherepde.__file__).resolve().parents[1] / "cases")

case = spherepde.load_case(CASES + "/quickstart.toml")
ds = spherepde.run(case)
print(ds.attrs["grid"], ds.attrs["grid_shape"], "steps:", ds.attrs["steps"])

# %%
# The density on the Gauss grid (latitude, longitude in degrees) at four depths, and the order
# parameter and the mass error over depth.

depths = [0.0, 1.0, 2.5, 6.0]
figure, axes = plt.subplots(2, 3, figsize=(12, 6), layout="constrained")
for axis, t in zip(axes.flat[[0, 1, 3, 4]], depths):
    snapshot = ds["density"].sel(time=t)
    mesh = axis.pcolormesh(ds["lon"], ds["lat"], snapshot, cmap="magma", shading="nearest")
    axis.set(title=f"t = {t:g}, max {float(snapshot.max()):.2f} sr$^{{-1}}$", xlabel="longitude",
             ylabel="latitude", aspect="equal")
    figure.colorbar(mesh, ax=axis, shrink=0.8)
ds["order_parameter"].plot(ax=axes[0, 2], marker="o")
axes[0, 2].set(title="order parameter |m|", ylim=(0, 1.05))
mass_error = np.abs(ds["mass"] - 1)
axes[1, 2].semilogy(ds["time"], np.maximum(mass_error, 1e-17), "o-")
axes[1, 2].set(title="|mass - 1|", xlabel="time (depth)")
plt.show()

print(f"order parameter: {float(ds.order_parameter[0]):.3f} -> {float(ds.order_parameter[-1]):.3f}; "
      f"max |mass - 1| = {float(mass_error.max()):.1e}")
