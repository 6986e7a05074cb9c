"""Dense attention (kernels.dense.dense_exp_kernel) by block size: time relative to solver.chunk = "auto".

One call is T_C f = sum_j exp(beta <x_i, C y_j>) f_j over n points (x = y, particles on S^2, C = seed 003's
B = diag(-1, -1, 1), the d + 1 = 4 channels of the softmax), cut into blocks of rows whose kernel matrix takes
a given number of MiB.  Every size is timed in each round, the rounds repeated, so that the ratios of medians
are measured side by side on a shared machine; time is the calling thread's CPU time (one thread).  With
--beta 1000 most entries sit at the exponent floor (kernels.dense.exponent_floor).

    OMP_NUM_THREADS=1 python benchmarks/dense_blocks.py [--n 1000 2000 4000 8000 16000] [--beta 30]
"""

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from spherepde.kernels.dense import block_rows, dense_exp_kernel

MEBIBYTES = [0.25, 1.0, 4.0, 16.0, 64.0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 2000, 4000, 8000, 16000])
    parser.add_argument("--beta", type=float, default=30.0)
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--seconds", type=float, default=20.0, help="time budget per n (sets the rounds)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dtype, device = getattr(torch, args.dtype), torch.device("cpu")
    size = torch.finfo(dtype).bits // 8
    C = torch.diag(torch.tensor([-1.0, -1.0, 1.0], dtype=dtype))
    generator = torch.Generator().manual_seed(0)
    print(f"beta = {args.beta:g}, {args.dtype}; time per call relative to 'auto' (median of interleaved rounds)")
    print("n | auto rows | " + " | ".join(f"{mib:g} MiB" for mib in MEBIBYTES) + " | auto: ms per call")
    for n in args.n:
        points = torch.nn.functional.normalize(torch.randn(n, 3, generator=generator, dtype=dtype), dim=1)
        channels = torch.cat([torch.ones(n, 1, dtype=dtype), points], dim=1) / n
        rows = {"auto": block_rows("auto", n, dtype, device)}
        rows.update({mib: max(1, int(mib * 2 ** 20) // (n * size)) for mib in MEBIBYTES})
        times = {key: [] for key in rows}
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds or len(times["auto"]) < 3:
            for key, count in rows.items():
                begin = time.thread_time()
                dense_exp_kernel(points, points, channels, C, args.beta, count)
                times[key].append(time.thread_time() - begin)
        median = {key: sorted(values)[len(values) // 2] for key, values in times.items()}
        print(f"{n} | {rows['auto']} | " + " | ".join(f"{median[mib] / median['auto']:.2f}" for mib in MEBIBYTES)
              + f" | {1e3 * median['auto']:.2f}", flush=True)


if __name__ == "__main__":
    main()
