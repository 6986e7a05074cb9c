"""`circle_w2` (W2 on S^1 by the circular rearrangement and its certificate: what `spherepde compare` computes at
every save) today and at --baseline, side by side in one run.

    OMP_NUM_THREADS=1 python3 benchmarks/circle_w2.py [--baseline ff59689] [--repeats 3]

The measures: a density's grid measure (8192 points, masses exp(2 cos(theta - 0.3)), as `compare` re-synthesises an
Eulerian density) against n = 1e4 and 1e5 particles drawn from a von Mises law (kappa 2.2, seed 0), masses 1/n.
The baseline is checked out with git archive into a temporary folder (benchmarks/ensembles.in_baseline) and timed
in a child process on the same inputs; both print one thread's CPU time (median of --repeats) and the three numbers
circle_w2 returns, which agree where the change keeps the coupling.  Default baseline: the commit before
circle_w2's cuts were merged as sorted runs.
"""

import argparse
import json
import os
import subprocess
import sys

from ensembles import ROOT, in_baseline

MEASURE = r'''
import json, statistics, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from spherepde.measures.optimal_transport import circle_w2
settings = json.loads(sys.argv[2])
grid = 2 * np.pi * np.arange(8192) / 8192
density = np.exp(2 * np.cos(grid - 0.3))
results = {}
for n in settings["sizes"]:
    angles = np.random.default_rng(0).vonmises(0.0, 2.2, n)
    arguments = (np.stack([np.cos(grid), np.sin(grid)], 1), density / density.sum(),
                 np.stack([np.cos(angles), np.sin(angles)], 1), np.full(n, 1 / n))
    times = []
    for _ in range(settings["repeats"]):
        start = time.thread_time()
        value = circle_w2(*arguments)
        times.append(time.thread_time() - start)
    results[n] = {"seconds": statistics.median(times), "value": list(value)}
print(json.dumps(results))
'''


def measure(settings: dict, commit: str | None = None) -> dict:
    """{n: {seconds, value}} of today's code, or of the code at `commit`."""
    if commit is None:
        output = subprocess.run([sys.executable, "-c", MEASURE, ROOT, json.dumps(settings)], check=True,
                                capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")).stdout
    else:
        output = in_baseline(commit, MEASURE, settings)
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="ff59689")
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    settings = {"sizes": [10_000, 100_000], "repeats": arguments.repeats}
    now, before = measure(settings), measure(settings, arguments.baseline)
    print(f"circle_w2, 8192 grid points against n particles: one thread, CPU seconds, median of {arguments.repeats}")
    for n in now:
        print(f"  n = {int(n):6d}: {arguments.baseline} {before[n]['seconds']:.3f} s, today {now[n]['seconds']:.3f} s,"
              f" ratio {before[n]['seconds'] / now[n]['seconds']:.2f}; (W2, largest move, bound) the same: "
              f"{before[n]['value'] == now[n]['value']} {now[n]['value']}")


if __name__ == "__main__":
    main()
