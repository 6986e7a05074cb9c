"""
The depth picture on S^1
========================

On the circle the whole history fits one picture: the density over angle (horizontal) and depth
(vertical). Two clusters of tokens, unnormalized attention at beta = 1 with small noise
(eps = 0.02): the clusters drift towards each other and merge into one. The case is written
here as TOML text (``spherepde.load_case_text``), as a case file would hold it.
"""

import matplotlib.pyplot as plt
import numpy as np

import spherepde

case = spherepde.load_case_text("""
[case]
name = "two-clusters-s1"

[sphere]
dim = 2
lmax = 96

[model]
kernel = "unnormalized"
beta = 1.0
eps = 0.02

[initial]
kind = "vmf_mixture"
means = [[1.0, 0.0], [-0.2, 1.0]]
kappas = [20.0, 20.0]
weights = [0.55, 0.45]

[time]
t_end = 4.0
dt = 0.01
save_every = 0.04
""")
ds = spherepde.run(case)

# %%
# ``theta`` is the angle in radians; the density is per radian, so it integrates to 1 against
# ``cell_area``.

# The angles are shown in [-180, 180) degrees, so that the clusters do not straddle the picture's edge.
order = np.argsort(np.degrees(ds["theta"].values + np.pi) % 360 - 180)
ds = ds.isel(theta=order)
theta = np.degrees(ds["theta"].values + np.pi) % 360 - 180
figure, (picture, profiles) = plt.subplots(1, 2, figsize=(12, 5), width_ratios=[3, 2], layout="constrained")
mesh = picture.pcolormesh(theta, ds["time"], ds["density"], cmap="magma", shading="nearest")
figure.colorbar(mesh, ax=picture, label="density (radian$^{-1}$)")
picture.set(xlabel="angle (degrees)", ylabel="time (depth)", title="density over angle and depth",
            xlim=(-90, 150))
for t in (0.0, 0.6, 1.2, 4.0):
    profiles.plot(theta, ds["density"].sel(time=t), label=f"t = {t:g}")
profiles.set(xlabel="angle (degrees)", ylabel="density (radian$^{-1}$)", title="profiles", xlim=(-90, 150))
profiles.legend()
plt.show()

print("mass at the end:", float((ds["density"][-1] * ds["cell_area"]).sum()))
