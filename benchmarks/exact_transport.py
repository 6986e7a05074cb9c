"""POT's exact solver on the atoms as our callers build them (sorted) against the order exact_transport hands it
(shuffled), side by side in one run, on the measures the W2 diagnostics solve.

    OMP_NUM_THREADS=1 python3 benchmarks/exact_transport.py [--repeats 3]

merge_atoms returns the atoms of a measure sorted lexicographically, quantise by angle cell, and a quadrature grid
comes in latitude-longitude order; the network simplex's pivot search is slow on such orders.  Each line times
ot.emd (with the potentials, as paired_transport asks) on one pair of measures, in the sorted order and through
spherepde.measures.optimal_transport.exact_transport, one thread's CPU time, the median of --repeats, and prints the
ratio and the difference of the two optimal costs (one linear program: round-off only).  The pairs:

* the particle run of cases/kuramoto-s1.toml (n = 1000, seed 0) at t = 10 against its initial particles (the
  default run's w2_projection solves such pairs at every save, with 8 half samples of 500);
* quantised measures (1e4 points to <= 1000 cells, `quantise`): uniform against uniform on S^1, von Mises against
  von Mises 1 rad apart, von Mises against uniform, and two vMF on S^2;
* an S^2 grid (lmax 20): a vMF density's grid measure against another's (`w2_between`'s exact branch).
"""

import argparse
import os
import warnings

import numpy as np
import ot
from floors import clock

import spherepde
from spherepde.base.device import placement
from spherepde.discretisation.bases import make_basis
from spherepde.measures.optimal_transport import exact_transport, merge_atoms, quantise

CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cases", "kuramoto-s1.toml")


def sorted_order(a_points, a, b_points, b) -> float:
    """The optimal cost by ot.emd on the atoms in the order given (the code before exact_transport)."""
    cost = ot.dist(a_points, b_points, metric="sqeuclidean")
    return float(ot.emd(a, b, cost, numItermax=10_000_000, log=True)[1]["cost"])


def kuramoto_particles():
    """(initial, t = 10) particles of the kuramoto-s1 case, n = 1000, as merged atoms with masses."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = spherepde.load_case(CASE, ["solver.method='particles'", "time.t_end=10", "time.save_every=10",
                                          "diagnostics.w2=false"])
        positions = spherepde.run(case, progress=False)["particles"].values
    uniform = np.full(positions.shape[1], 1 / positions.shape[1])
    return merge_atoms(positions[0], uniform), merge_atoms(positions[-1], uniform)


def circle(rng, n, kappa, mean):
    angles = rng.vonmises(mean, kappa, n) if kappa else rng.uniform(-np.pi, np.pi, n)
    return np.stack([np.cos(angles), np.sin(angles)], 1)


def sphere(rng, n, kappa, mean):
    points = rng.normal(size=(n, 3)) + kappa * np.asarray(mean, dtype=float)
    return points / np.linalg.norm(points, axis=1, keepdims=True)


def quantised(points):
    return quantise(points, np.full(len(points), 1 / len(points)), 1000)[:2]


def grid_vmf(kappa, mean):
    basis = make_basis(3, 20, placement("cpu", "float64"))
    points = basis.points.reshape(-1, 3).numpy()
    masses = basis.weights.reshape(-1).numpy() * np.exp(kappa * points @ np.asarray(mean, dtype=float))
    return points, masses / masses.sum()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    repeats = parser.parse_args().repeats
    rng = np.random.default_rng(1)
    pairs = {
        "kuramoto-s1 particles, t = 10 against t = 0": kuramoto_particles(),
        "S^1 quantised, uniform / uniform": (quantised(circle(rng, 10_000, 0, 0)),
                                              quantised(circle(rng, 10_000, 0, 0))),
        "S^1 quantised, von Mises / von Mises 1 rad on": (quantised(circle(rng, 10_000, 4, 0)),
                                                           quantised(circle(rng, 10_000, 10, 1))),
        "S^1 quantised, von Mises / uniform": (quantised(circle(rng, 10_000, 25, 0)),
                                                quantised(circle(rng, 10_000, 0, 0))),
        "S^2 quantised, vMF / vMF": (quantised(sphere(rng, 10_000, 2, [1, 0, 0])),
                                     quantised(sphere(rng, 10_000, 1, [0, 0, 1]))),
        "S^2 grid lmax 20, vMF / vMF": (grid_vmf(2.0, [1, 0, 0]), grid_vmf(4.0, [0, 0.6, 0.8])),
    }
    print(f"POT's exact solver, one thread, CPU seconds, median of {repeats}: atoms sorted / shuffled")
    for name, ((a_points, a), (b_points, b)) in pairs.items():
        before = clock(lambda: sorted_order(a_points, a, b_points, b), repeats)
        after = clock(lambda: exact_transport(a_points, a, b_points, b, potentials=True), repeats)
        difference = sorted_order(a_points, a, b_points, b) - exact_transport(a_points, a, b_points, b)[0]
        print(f"  {name:48s} {len(a):5d} x {len(b):5d}  {before:7.3f} / {after:7.3f} s  ratio {before / after:5.2f}"
              f"  cost difference {difference:+.1e}")


if __name__ == "__main__":
    main()
