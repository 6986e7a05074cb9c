"""PyTorch SHT vs shtns on the CPU, side by side in one process, one thread each (done-criterion 3).

For lmax 64, 128, 256 on the solver's dealiased Gauss grid (bases.dealiased_gauss_grid: nlat >= 3 (lmax + 1) / 2,
nlon >= 2 nlat with a fast FFT), float64, times the best of --repeats of

    scalar:  synthesis + analysis of one field
    batch 4: synthesis + analysis of four fields in one call (the attention field's channels rho, y rho;
             shtns loops over them, torch does one product)
    vector:  gradient (vector synthesis) + divergence (vector analysis) of one field

with both backends, alternating them so that load from other processes hits both alike, and
prints the torch / shtns time ratios.  Times are CPU seconds of the calling thread (both backends
compute on it with one thread): on a shared machine the wall time also counts the spells the
thread waits for a core (up to 10x the CPU time at a load of 15 on 2 cores, seen while writing this).
"torch" is TorchSHT as the solver builds it, in the Legendre-table layout of
`legendre_layouts.default_layout` (dense, packed or sparse; see legendre_layouts' module docstring).  Up to lmax
--other-up-to the other two layouts are timed too, each printed as its time over the chosen one's
(> 1: the chosen layout is the faster): the measurement behind the layout crossovers.

    OMP_NUM_THREADS=1 python benchmarks/sht_backends.py [--lmax 64 128 256] [--repeats 30]
    OMP_NUM_THREADS=1 python benchmarks/sht_backends.py --lmax 16 32 48 64 96 128 256 --other-up-to 256
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from spherepde.discretisation.bases import dealiased_gauss_grid
from spherepde.discretisation.transforms.legendre_layouts import LAYOUTS, default_layout
from spherepde.discretisation.transforms.sht_shtns import ShtnsSHT
from spherepde.discretisation.transforms.sht_torch import TorchSHT


def best_times(functions: dict, repeats: int) -> dict:
    """Best thread CPU time of each function over `repeats` rounds, the functions interleaved in every round."""
    best = {name: float("inf") for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.thread_time()
            function()
            best[name] = min(best[name], time.thread_time() - start)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lmax", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--other-up-to", type=int, default=256,
                        help="largest lmax at which the other layouts are timed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread; float64; "
          f"best thread CPU time of {args.repeats}")
    kinds = ("scalar", "batch 4", "vector")
    print(f"{'lmax':>5} {'grid':>10} {'tables':>16} | " + " | ".join(
        f"{kind + ' torch':>13} {'shtns':>8} {'ratio':>6} {'others over torch':>24}" for kind in kinds))
    for lmax in args.lmax:
        nlat, nlon = dealiased_gauss_grid(lmax, minimum=32)
        chosen = default_layout(lmax, torch.device("cpu"))
        others = [layout for layout in LAYOUTS if layout != chosen] if lmax <= args.other_up_to else []
        backends = {"torch": TorchSHT(lmax, nlat, nlon), "shtns": ShtnsSHT(lmax, nlat, nlon)}
        backends |= {layout: TorchSHT(lmax, nlat, nlon, layout=layout) for layout in others}
        field = torch.randn(nlat, nlon, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        coefficients = backends["shtns"].analysis(field)
        batch = coefficients.expand(4, *coefficients.shape).clone()
        functions = {}
        for name, sht in backends.items():
            functions[("scalar", name)] = lambda sht=sht: sht.analysis(sht.synthesis(coefficients))
            functions[("batch 4", name)] = lambda sht=sht: sht.analysis(sht.synthesis(batch))
            functions[("vector", name)] = lambda sht=sht: sht.divergence(*sht.gradient(coefficients))
        best = best_times(functions, args.repeats)
        row = [f"{lmax:>5} {nlat:>4}x{nlon:<5} {chosen:>6} {backends['torch'].table_bytes / 2**20:>6.1f}MiB |"]
        for kind in kinds:
            torch_time, shtns_time = best[(kind, "torch")], best[(kind, "shtns")]
            other = " ".join(f"{layout} {best[(kind, layout)] / torch_time:.2f}" for layout in others) or "-"
            row.append(f"{1e3 * torch_time:>11.2f}ms {1e3 * shtns_time:>6.2f}ms {torch_time / shtns_time:>6.2f} "
                       f"{other:>24} |")
        print(" ".join(row))


if __name__ == "__main__":
    main()
