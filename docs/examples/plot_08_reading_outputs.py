"""
Reading outputs with xarray
===========================

``spherepde run`` writes one NetCDF file; ``spherepde.run`` returns the same Dataset. Here a
short run is written with ``spherepde.io.output.write_dataset`` (what the command line uses:
atomic, compressed) and read back with xarray: its variables and their CF attributes, a selection
by time, an integral against the quadrature weights, and the resolved case stored in the file,
which reproduces the run.
"""

import os
import pathlib
import shutil
import tempfile

import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import spherepde
from spherepde.io.output import write_dataset

# the case files of the repository (a source checkout: the package lies beside cases/)
CASES = str(pathlib.Path(spherepde.__file__).resolve().parents[1] / "cases")

path = os.path.join(tempfile.mkdtemp(prefix="outputs-"), "quickstart-short.nc")
case = spherepde.load_case(CASES + "/quickstart.toml", overrides=["time.t_end=2.0", "sphere.lmax=16"])
write_dataset(spherepde.run(case), path)

ds = xr.open_dataset(path)
print(ds)

# %%
# Every data variable carries ``long_name`` and ``units``, and so does every coordinate but the index
# ``component`` (a ``long_name`` alone); ``mean`` shadows the method ``Dataset.mean``, so read it as
# ``ds["mean"]``. The density is per steradian: against ``cell_area`` (the quadrature weights, in sr) it
# integrates to the mass.

for name in ("density", "cell_area", "order_parameter", "spectral_tail"):
    print(f"{name}: {ds[name].attrs['long_name']} [{ds[name].attrs.get('units', '')}]")
mass = (ds["density"] * ds["cell_area"]).sum(("lat", "lon"))
print("max |int rho dsigma - mass| =", float(np.abs(mass - ds["mass"]).max()))
print("mean position (the mean of x over rho) at t = 2:", ds["mean"].sel(time=2.0).values)

# %%
# The attribute ``case`` is the full resolved case as TOML: ``load_case_text`` reads it back, and
# running it again gives the same numbers.

stored = spherepde.load_case_text(ds.attrs["case"])
print(ds.attrs["case"].splitlines()[:8])
again = spherepde.run(stored)
print("rerun, largest difference of the density:", float(np.abs(again["density"] - ds["density"]).max()))

# %%
# A zonal mean (the density averaged over longitude) at every save, and two snapshots.

figure, (zonal, snapshots) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
ds["density"].mean("lon").plot(ax=zonal, x="time", y="lat", cmap="magma")
zonal.set(title="zonal mean of the density")
for t in (0.0, 2.0):
    ds["density"].sel(time=t).sel(lon=0.0, method="nearest").plot(ax=snapshots, label=f"t = {t:g}")
snapshots.set(title="density along the meridian lon = 0")
snapshots.legend()
plt.show()
ds.close()
shutil.rmtree(os.path.dirname(path))
