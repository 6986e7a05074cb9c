"""The seed-003 baseline as a full Eulerian run, timed per device and dtype (done-criterion 4).

Model: softmax attention, beta = 30, B = diag(-1, -1, 1), V = diag(-1, 1, -2), eps = 0, vMF(kappa = 2)
start (cases/baseline-inf.toml with model.beta = 30), lmax 128, t in [0, 3], CFL 0.5, classical RK4,
solver.field = "auto" (the spectral field; B is a grid permutation).  Without noise the density
contracts onto two points (rates 2 and 3); lmax 128 resolves it until t ~ 0.75 and without a filter
its undershoots make Z <= 0 near t = 2 (a numerical failure), so --filter-order 16 is the setting
that reaches t = 3.  Each (device, dtype) run
writes OUT/baseline-<device>-<dtype>.nc and prints its wall time and steps; then every
diagnostic of the float32 run is compared with the float64 run on the same device
(max |float32 - float64| over the save times, and that difference relative to the largest
|float64| value), and each device's wall time with the CPU's.

    python benchmarks/baseline_run.py                                # CPU, float64 and float32
    python benchmarks/baseline_run.py --devices cpu cuda             # and the GPU (speedup printed)
    python benchmarks/baseline_run.py --reuse                        # compare files already written
"""

import argparse
import os
import tempfile
import time
import warnings

import numpy as np
import xarray as xr

import spherepde
from spherepde.base.errors import NumericalFailure
from spherepde.base.threads import run_threads
from spherepde.io.output import DIAGNOSTIC_ATTRS

CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases", "baseline-inf.toml")


def run(device: str, dtype: str, lmax: int, t_end: float, filter_order: int, threads: int, path: str) -> xr.Dataset:
    """The run's dataset (up to its last good save if it failed), with its wall and CPU time and its CPU threads
    (solver.threads = `threads`; 0: the case's "auto") as attributes."""
    overrides = ["model.beta = 30.0", f"sphere.lmax = {lmax}", f"time.t_end = {t_end}", f"solver.device = '{device}'",
                 f"solver.dtype = '{dtype}'", f"solver.filter_order = {filter_order}"]
    if threads:
        overrides.append(f"solver.threads = {threads}")
    case = spherepde.load_case(CASE, overrides=overrides)
    start, cpu_start = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the resolution warning is kept in the file's notes
        try:
            dataset = spherepde.run(case, progress=False)
        except NumericalFailure as failure:
            dataset = failure.dataset
    dataset.attrs["benchmark_wall_seconds"] = time.perf_counter() - start
    dataset.attrs["benchmark_cpu_seconds"] = time.process_time() - cpu_start
    dataset.attrs["benchmark_threads"] = run_threads(case)  # what spherepde.run ran on (base.threads.threads_for)
    dataset.to_netcdf(path)
    return dataset


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", nargs="+", default=["cpu"])
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--lmax", type=int, default=128)
    parser.add_argument("--t-end", type=float, default=3.0)
    parser.add_argument("--filter-order", type=int, default=0, help="solver.filter_order (0: no filter)")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads, solver.threads (0: the case's 'auto': one up to lmax 128, else torch's "
                             "default)")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "spherepde-benchmarks"))
    parser.add_argument("--reuse", action="store_true", help="read OUT/baseline-*.nc instead of running")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for device in args.devices:
        for dtype in args.dtypes:
            path = os.path.join(args.out, f"baseline-{device}-{dtype}.nc")
            dataset = (xr.load_dataset(path) if args.reuse
                       else run(device, dtype, args.lmax, args.t_end, args.filter_order, args.threads, path))
            results[device, dtype] = dataset
            print(f"{device:>4} {dtype}: {dataset.attrs['status']} at t = {float(dataset['time'][-1]):g}, "
                  f"{dataset.attrs['benchmark_wall_seconds']:8.1f} s wall "
                  f"({dataset.attrs.get('benchmark_cpu_seconds', float('nan')):.1f} s CPU), "
                  f"{dataset.attrs['steps']} steps, "
                  f"field {dataset.attrs['field']}, {dataset.attrs.get('benchmark_threads', '?')} CPU threads, "
                  f"resolved until t = {dataset.attrs['resolved_until']}, "
                  f"min density {float(dataset['min_density'].min()):.2e}")
    for device in args.devices:
        if (device, "float64") in results and (device, "float32") in results:
            pair = [results[device, dtype] for dtype in ("float32", "float64")]
            # a failed run keeps its saves up to the failure: compare the saves both reached
            saves = min(dataset.sizes["time"] for dataset in pair)
            times = pair[1]["time"].values[:saves]
            # resolved while both runs are: the earlier loss of resolution ("end": none)
            lost = [float(dataset.attrs["resolved_until"]) for dataset in pair
                    if dataset.attrs["resolved_until"] != "end"]
            resolved = min(lost) if lost else times[-1]
            print(f"\n{device}: float32 vs float64, max |diff| relative to max |float64 value|, over the {saves} saves "
                  f"t <= {times[-1]:g} both runs reached, and over those while resolved (t <= {resolved:g})")
            for name in DIAGNOSTIC_ATTRS:
                single, double = (dataset[name].values[:saves].astype(np.float64) for dataset in pair)
                finite = np.isfinite(double) & np.isfinite(single)
                if not finite.any():
                    continue
                columns = []
                for window in (np.ones(saves, dtype=bool), times <= resolved):
                    mask = finite & window.reshape((saves,) + (1,) * (finite.ndim - 1))
                    columns.append(np.abs(single - double)[mask].max() / np.abs(double[mask]).max())
                print(f"  {name:>20}: {columns[0]:.2e}   resolved {columns[1]:.2e}")
    for dtype in args.dtypes:
        if ("cpu", dtype) in results:
            for device in args.devices:
                if device != "cpu" and (device, dtype) in results:
                    speedup = (results["cpu", dtype].attrs["benchmark_wall_seconds"]
                               / results[device, dtype].attrs["benchmark_wall_seconds"])
                    print(f"{device} / cpu speedup, {dtype}: {speedup:.1f}x")


if __name__ == "__main__":
    main()
