"""
A sweep on Dask
===============

``spherepde sweep`` runs every combination of the values given to ``--param`` on Dask
distributed; members that share a grid run together as one batch, one tensor program. From
Python the same is ``spherepde.api.sweep.run_sweep``; its combined file ``sweep.nc`` holds every
member along a ``member`` dimension, with the swept keys as coordinates, and
``by_parameters`` turns ``member`` into one dimension per swept key.

Here: the noisy Kuramoto case swept over the noise eps and the coupling V = K I, on a Dask
cluster started in this process (one worker thread), passed as the scheduler's address, as
``--scheduler`` does for a cluster started elsewhere (without one, ``run_sweep`` starts a
``LocalCluster`` of worker processes: then run the script under ``if __name__ == "__main__":``).
The stationary order parameter depends on K / eps only (r = I1(K r / eps) / I0(K r / eps)),
which the sweep shows: the members with the same ratio end at the same r.
"""

import pathlib
import shutil
import tempfile

import matplotlib.pyplot as plt
import xarray as xr
from dask.distributed import LocalCluster

import spherepde
from spherepde.api.sweep import by_parameters, run_sweep

# the case files of the repository (a source checkout: the package lies beside cases/)
CASES = str(pathlib.Path(spherepde.__file__).resolve().parents[1] / "cases")

case = spherepde.load_case(CASES + "/kuramoto-s1.toml", overrides=["time.t_end=20.0", "time.save_every=1.0"])
folder = tempfile.mkdtemp(prefix="sweep-")
with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
    path = run_sweep(case, ["model.eps=0.2,0.3,0.4", "model.V=[[1.0,0.0],[0.0,1.0]],[[1.5,0.0],[0.0,1.5]]"],
                     folder, scheduler=cluster.scheduler_address)
with xr.open_dataset(path) as sweep:
    sweep = sweep.load()
shutil.rmtree(folder)  # the members' files and sweep.nc: what follows reads the loaded copy
print(sweep["model_eps"].values, sweep.attrs["swept"])
grid = by_parameters(sweep)
print(grid["order_parameter"].sizes)

# %%
# The order parameter of every member over depth, and its final value against K / eps.

figure, (history, ratio) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
for member in sweep["member"].values:
    one = sweep.sel(member=member)
    coupling = float(sweep["model_V"].values[member].split(",")[0].strip("[ "))
    label = f"eps = {float(one['model_eps']):g}, K = {coupling:g}"
    history.plot(one["time"], one["order_parameter"], label=label)
    marker = dict(marker="o", markersize=12, fillstyle="none") if coupling == 1 else dict(marker="o", markersize=5)
    ratio.plot(coupling / float(one["model_eps"]), float(one["order_parameter"][-1]), linestyle="", label=label,
               color=history.lines[-1].get_color(), **marker)
history.set(xlabel="time (depth)", ylabel="order parameter", title=f"{sweep.sizes['member']} members")
history.legend(fontsize=8)
ratio.set(xlabel="K / eps", ylabel="order parameter at t = 20",
          title="r depends on K / eps only (two members at K / eps = 5)")
plt.show()
