"""`spherepde compare`: two runs of the same case side by side (Eulerian vs particles, or any pair).

For every diagnostic of docs/design.md "Diagnostics" that both runs have, at the save times they share:

    difference(t) = B(t) - A(t),   stderr(t) = sqrt(se_A(t)^2 + se_B(t)^2),
    z(t) = sign(difference) max(|difference| - tolerance, 0) / stderr

with se the Monte Carlo standard errors a particle run stores (`<name>_stderr`; an Eulerian run counts as exact, se
= 0; the order parameter's is widened by the bias of |m_n| at the other run's value, which decides near |m| = 0:
`_stderr`). Verdict per diagnostic: "agrees" when |difference| <= k stderr + tolerance at every shared time and
component, that is |z| <= k (the tolerance, atol and a float32 run's round-off term, absorbs round-off where both
are exact), "disagrees" otherwise, "n/a" when either run lacks the diagnostic or a standard error does not exist. z
has nu degrees of freedom (`<name>_dof`): a particle run's standard errors by batch means over particles.replicas =
R > 1 systems make it Student t with R - 1 of them, the i.i.d. formulas of one system of n tokens n - 1, an exact
run infinitely many; two particle runs combine theirs by Welch-Satterthwaite, nu = (se_A^2 + se_B^2)^2 / (se_A^4 /
nu_A + se_B^4 / nu_B). For w2_projection the tolerance also holds both runs' quantisation bounds (attribute
`w2_projection_floor`), a bound on a bias, not an error of chance: z counts the standard errors beyond it. A
particle run's w2_projection is a W2 between empirical measures, biased upwards by the sampling error it transports
(at n = 300 on S^1, 0.06-0.1 against standard errors of 0.015-0.03), which its delta-method standard error leaves
out: the difference and z of that row are taken after subtracting the expected B - A from the runs' own estimates of
that bias (`w2_projection_bias`, from their `w2_projection_squared_bias`). Each row also gives P(max|z|) of M, the
probability that M independent errors of that law (standard normal where nu is infinite) reach its worst |z|
(`max_z_probability`; attributes max_z_probability_<name>): a verdict over many values fails by chance alone now and
then, and a "disagrees" with a large P is what chance gives. With few replicas that is often: |z| > 3 has
probability 0.0027 for a normal z, 0.058 for Student t with 3 degrees of freedom (R = 4), and the report says so.

W2(t) between the two measures, chordal cost |x - y|^2, masses: quadrature weights times
density (Eulerian) or 1/n for the saved particles, by spherepde.measures.optimal_transport.w2_between
(S^1: the circular monotone rearrangement where certified, else exact OT, quantised above `atoms` atoms where
that bound is the tighter) with
its error bound (`w2_bound`): that method's error plus, for each density, the distance from its grid measure to it
(at most the largest chord from a node to its cell, `measure`: |W2(A, B) - W2(QA, QB)| <= W2(A, QA) + W2(B, QB)).
On S^1 an Eulerian density is first re-synthesised on REFINED_CIRCLE points
(spectral interpolation, exact for the band-limited density), so that W2 measures the density itself
and not its grid (a uniform M-point grid is within W2 ~ pi / (M sqrt 3) of the density it samples).
Writes REPORT.nc (the side-by-side series, z-scores, W2(t), verdicts as attributes) and
REPORT.png (each diagnostic of both runs with the band +- k stderr, and W2(t)).
"""

import math
import numbers
import os
import textwrap
import uuid

import numpy as np
import xarray as xr
from scipy.special import erfc, stdtr

from spherepde.analysis.diagnostic_panels import spans_a_decade, stored_case
from spherepde.base.errors import CaseError, printable
from spherepde.base.version import VERSION
from spherepde.discretisation.bases import TAIL_ROUND_OFF_EPS, gauss_cell_radius
from spherepde.io.output import DIAGNOSTIC_ATTRS, grid_points, history, make_folders, split_both, write_dataset
from spherepde.io.summary import check_run, open_result, reading
from spherepde.measures.diagnostics import DENSITY_FLOOR
from spherepde.measures.optimal_transport import w2_between

REFINED_CIRCLE = 2 ** 13
STUDENT_NOTE_BELOW = 30  # degrees of freedom under which the report says that z is not close to normal
# How far one system's i.i.d. standard errors fall short, for the report's note: the spread over 40 seeds of the
# mean of cases/kuramoto-s1.toml's tokens (n = 200 and 1000, t = 10 and 40) against its mean i.i.d. error, the
# component along the cluster and across it (tests/test_compare.py measures it again).
IID_SPREAD = "1.5 to 9"


# ---------------------------------------------------------------------------------------
# Measures
# ---------------------------------------------------------------------------------------


def measure(dataset: xr.Dataset, index: int, label: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(points, masses, bound) of save `index` of the run `label`: its saved particles (1/n each, bound 0), or its
    density times the cell areas, with a bound on W2 between the density and that grid measure, each cell's mass
    moved to its node: the largest chord from a node to its cell (on S^2 the grid's cell radius; on S^1, where the
    density is re-synthesised on REFINED_CIRCLE points (`refined_circle_measure`), 2 sin(pi / 2 REFINED_CIRCLE),
    3.8e-4).  A CaseError where the measure is not finite or has no positive mass: optimal transport has no answer
    for it."""
    time = f"save {index} (t = {dataset['time'].values[index]:g})"
    if "particles" in dataset and "density" not in dataset:
        points = dataset["particles"].isel(time=index).values.astype(float)
        if not np.isfinite(points).all():
            raise CaseError(f"compare: {label}: the saved particles of {time} are not all finite")
        return points, np.full(points.shape[0], 1 / points.shape[0]), 0.0
    if "density" not in dataset:
        raise CaseError("compare: a result holds neither a density nor saved particles (particles.save = 0?)")
    density = dataset["density"].isel(time=index).values.astype(float)
    if not np.isfinite(density).all():
        raise CaseError(f"compare: {label}: the density of {time} is not finite everywhere")
    if not np.any(density > DENSITY_FLOOR):
        raise CaseError(f"compare: {label}: the density of {time} is nowhere positive: no measure to transport")
    if "theta" in dataset["density"].dims:
        points, masses = refined_circle_measure(density, int(dataset.attrs["lmax"]))
        return points, masses, 2 * math.sin(math.pi / (2 * REFINED_CIRCLE))
    return (grid_points(dataset).reshape(-1, 3), (dataset["cell_area"].values * density).reshape(-1),
            gauss_cell_radius(*density.shape))


def refined_circle_measure(density: np.ndarray, lmax: int, points: int = REFINED_CIRCLE):
    """The band-limited density of a circle grid, re-synthesised on `points` equispaced points (masses 2 pi rho / M)."""
    import torch

    from spherepde.base.device import placement
    from spherepde.discretisation.bases import CircleBasis

    cpu = placement("cpu", "float64")
    coefficients = CircleBasis(lmax, cpu, density.shape[0]).analysis(torch.as_tensor(density))
    fine = CircleBasis(lmax, cpu, points)
    values = fine.synthesis(coefficients).numpy()
    return fine.points.numpy(), values * (2 * math.pi / points)


# ---------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------


def load_pair(path_a: str, path_b: str | None = None):
    """(A, B, label A, label B): two result files, or the two halves of one "both" file."""
    with reading(path_a):
        first = open_result(path_a).load()
    second = None
    if path_b is not None:
        with reading(path_b):
            second = open_result(path_b).load()
    for path, run in ((path_a, first), (path_b, second)):
        if run is not None and "report" in run.attrs:
            raise CaseError(f"compare: {path!r} is a comparison report, not a run; compare the runs it names")
        if run is not None and "member" in run.dims:
            raise CaseError(f"compare: {path!r} is a sweep ({run.sizes['member']} members); compare two of its "
                            "member-*.nc files, or one member with another run")
    if path_b is None:
        if first.attrs.get("solver") != "both":
            raise CaseError(f"compare: {path_a!r} is a single {first.attrs.get('solver')!r} run; give two files "
                            "or one written with --solver both")
        eulerian, particles = split_both(first)
        return eulerian, particles, f"{path_a} (eulerian)", f"{path_a} (particles)"
    # beside another file a "both" file is its Eulerian run, and its label says so (its particle run is compared
    # by giving the file alone)
    runs = [(split_both(run)[0], f"{path} (eulerian)") if run.attrs.get("solver") == "both" else (run, path)
            for path, run in ((path_a, first), (path_b, second))]
    return runs[0][0], runs[1][0], runs[0][1], runs[1][1]


def common_times(a: xr.Dataset, b: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """Indices into A and B of the save times both runs have."""
    ta, tb = a["time"].values, b["time"].values
    matches = np.isclose(ta[:, None], tb[None, :], rtol=1e-9, atol=1e-12)
    ia, ib = np.nonzero(matches)
    if len(ia) == 0:
        raise CaseError("compare: the two runs share no save time")
    return ia, ib


def _w2_floor(a: xr.Dataset, b: xr.Dataset) -> float:
    """What W2 values of the two runs cannot resolve: each run's quantisation bound, and sqrt(eps)
    of float64 (W2 is the square root of a transport cost computed to round-off, so a W2 of a
    measure against itself comes out near 1e-8, not 0)."""
    bounds = sum(float(run.attrs.get("w2_quantisation_bound", 0.0)) for run in (a, b))
    return bounds + math.sqrt(np.finfo(np.float64).eps)


def _stderr(run: xr.Dataset, name: str, other: np.ndarray) -> np.ndarray:
    """The standard error of `run`'s diagnostic `name` (0 for an exact run), at the shared times.

    For the order parameter it is widened by the bias of a particle estimate at the other run's value `other`:
    |m_n| = |m + xi| (xi ~ N(0, S / n), S = Cov(x)) exceeds |m| on average by (tr S - u^T S u) / (2 n |m|), which
    the stored delta-method error sqrt(u^T S u / n) misses and which dominates as |m| -> 0: there |m_n| is about
    sqrt(tr S / n), and a disordered phase would fail at the rate P(chi_d > k) per save (3% on S^2 at k = 3).
    For unit vectors tr S = 1 - |m|^2, taken at `other` (a run that does not state its n: the sum of its squared
    mean_stderr components).  The widened error sqrt(delta^2 + bias^2) is capped at sqrt(tr S / n), the RMS of
    |m_n - m|, which bounds that of |m_n| - |m| at every |m|.  With particles.replicas = R the value is the mean of
    R systems' |m| of n / R tokens each: the bias and the cap are those of n / R tokens (u^T S u / (n / R) is R
    delta^2), the mean over the systems removing none of the bias; their mean_stderr would count the drift of the
    systems' directions, to which |m| is blind.
    """
    values = run[name].values
    if f"{name}_stderr" not in run:
        return np.zeros(values.shape)
    delta = run[f"{name}_stderr"].values
    if name != "order_parameter" or "mean_stderr" not in run:
        return delta
    replicas = int(run.attrs.get("replicas", 1))
    if "n" in run.attrs:
        total = (1.0 - np.minimum(np.abs(other), 1.0) ** 2) * replicas / float(run.attrs["n"])
    else:
        total = (run["mean_stderr"].values ** 2).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        bias = np.where(other != 0, np.maximum(total - replicas * delta ** 2, 0.0) / (2 * np.abs(other)), np.inf)
    return np.minimum(np.sqrt(total), np.sqrt(delta ** 2 + bias ** 2))


def degrees_of_freedom(run: xr.Dataset) -> float:
    """The degrees of freedom of `run`'s standard errors: R - 1 for batch means over particles.replicas = R > 1
    independent systems, n - 1 for the i.i.d. formulas of one system of n tokens, infinite for a run that states
    neither (an exact run has no standard errors: its se = 0 takes no part in `welch_dof`)."""
    replicas = int(run.attrs.get("replicas", 1))
    if replicas > 1:
        return float(replicas - 1)
    return float(run.attrs["n"]) - 1 if "n" in run.attrs else math.inf


def welch_dof(se_a: np.ndarray, se_b: np.ndarray, dof_a: float, dof_b: float) -> np.ndarray:
    """Welch-Satterthwaite: nu = (se_A^2 + se_B^2)^2 / (se_A^4 / nu_A + se_B^4 / nu_B), the degrees of freedom of
    (B - A) / sqrt(se_A^2 + se_B^2); infinite where neither run has a standard error (or it is not known)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        denominator = se_a ** 4 / dof_a + se_b ** 4 / dof_b
        dof = (se_a ** 2 + se_b ** 2) ** 2 / denominator
    return np.where(np.isfinite(denominator) & (denominator > 0), dof, math.inf)


def two_sided_tail(z: np.ndarray, dof: np.ndarray) -> np.ndarray:
    """P(|T| >= |z|) for T Student t with `dof` degrees of freedom (standard normal where dof is infinite)."""
    z, dof = np.broadcast_arrays(np.abs(np.asarray(z, dtype=float)), np.asarray(dof, dtype=float))
    infinite = np.isinf(dof)
    student = 2 * stdtr(np.where(infinite, 1.0, dof), -z)
    return np.where(infinite, erfc(z / math.sqrt(2)), student)


def _w2_projection_bias(a: xr.Dataset, b: xr.Dataset) -> np.ndarray:
    """The expected B - A of w2_projection, at the shared times, from the finite-n bias of particle runs.

    A particle run's W2_n^2 exceeds W2^2 by about its stored estimate s = w2_projection_squared_bias
    (spherepde.measures.sample_statistics.half_sample_bias; s = 0 for an exact run or one written without it), so
    its W2_n is about sqrt(W2^2 + s).  W2^2 is taken from the run with the smaller |s|, as max(W2_n^2 - s, 0) (the
    exact run's own value when one is exact: the bias is evaluated at the other run's value, as for the order
    parameter), and

        bias = sqrt(W2^2 + s_B) - sqrt(W2^2 + s_A),

    which is s / (2 W2) for W2 >> sqrt(s) and sqrt(s) at W2 = 0, where it exceeds the standard error (what it
    changes in the verdicts: docs/design.md "Facts measured while planning").
    """
    squared = [np.nan_to_num(run["w2_projection_squared_bias"].values, nan=0.0) if "w2_projection_squared_bias" in run
               else np.zeros(run.sizes["time"]) for run in (a, b)]  # NaN: no estimate (n < 4)
    values = [run["w2_projection"].values.astype(float) for run in (a, b)]
    w2_squared = np.maximum(np.where(np.abs(squared[0]) <= np.abs(squared[1]), values[0] ** 2 - squared[0],
                                     values[1] ** 2 - squared[1]), 0.0)
    return np.sqrt(np.maximum(w2_squared + squared[1], 0.0)) - np.sqrt(np.maximum(w2_squared + squared[0], 0.0))


def _verdict(a, b, stderr, k: float, atol: float) -> str:
    """"agrees" / "disagrees" / "n/a (...)" for arrays of the shared times (and components)."""
    if np.isnan(a).all() or np.isnan(b).all():
        return "n/a (not computed by both runs)"
    both_infinite = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    finite = ~both_infinite
    if np.isnan(a[finite]).any() or np.isnan(b[finite]).any():
        return "n/a (missing values)"
    if np.isnan(stderr[finite]).any():
        return "n/a (no standard error)"
    inside = np.abs(b[finite] - a[finite]) <= k * stderr[finite] + atol
    return "agrees" if inside.all() else "disagrees"


# A run in a precision coarser than float64 is compared within this many of its machine epsilons times max |A|
# (the scale of its round-off: `_round_off_scale`):
# float32 runs of a case lay within 2.7e-7 (mass) to 2e-6 (entropy) of the float64 run, up to 17 eps, and with
# standard errors of 0 (Eulerian runs) every such difference read as |z| = inf, "disagrees".
ROUND_OFF_EPS = 64
# spectral_tail's tolerance is then TAIL_ROUND_OFF_EPS = 8 eps (9.5e-7 in float32): above the float32 tails measured
# (6e-9 to 6e-8 on grids resolved in float64), below diagnostics.tail_tol's default 1e-6, so a run past the
# resolution threshold still disagrees with a resolved one.
TAIL_SCALE = TAIL_ROUND_OFF_EPS / ROUND_OFF_EPS


def _round_off_scale(run: xr.Dataset, name: str, values: np.ndarray) -> float:
    """The size whose round-off the diagnostic `name` of `run` carries: the diagnostic's largest value, not each
    component's (a mean's component near 0); for spectral_tail, a fraction of the density's L2 norm whose top-mode
    coefficients are rounded at the norm's scale, at least TAIL_SCALE (a float64 tail of 6e-17 against float32's
    2e-8 read |z| = inf); for min_density, a value of the density, its largest (the minimum is rounded at the
    maximum's scale).  Read only where a run is float32 (float64 runs are compared without it)."""
    scale = float(np.abs(values[np.isfinite(values)]).max(initial=0.0))
    if name == "spectral_tail":
        return max(scale, TAIL_SCALE)
    if name == "min_density" and "density" in run:
        return max(scale, float(abs(run["density"]).max(skipna=True)))
    return scale


# The sections of a case that state the problem (the model, its start, its training); the others say how it is
# solved (grid, steps, solver, particles), for how long, or what is recorded.
PROBLEM_SECTIONS = ("model", "initial", "control")


def problem_differences(a: xr.Dataset, b: xr.Dataset) -> list[str]:
    """The keys of PROBLEM_SECTIONS whose values differ between the two runs' stored cases, as "key (A vs B)": where
    there are some, the runs are two problems, not one solved two ways."""
    case_a, case_b = stored_case(a), stored_case(b)
    if not (case_a and case_b):  # a file without its case (not written by spherepde run): nothing to tell
        return []
    keys = sorted({(section, key) for case in (case_a, case_b) for section in PROBLEM_SECTIONS
                   for key in case.get(section, {})})

    def value(case, section, key) -> str:
        text = str(case.get(section, {}).get(key, "absent"))
        return text if len(text) <= 40 else text[:37] + "..."

    return [f"{section}.{key} ({value(case_a, section, key)} vs {value(case_b, section, key)})"
            for section, key in keys if case_a.get(section, {}).get(key) != case_b.get(section, {}).get(key)]


def check_options(k: float, atol: float, atoms: int) -> None:
    """A one-line CaseError naming the first of compare's options out of its range."""
    from spherepde.io.case_schema import ATOMS_BELOW

    for option, value, kind in (("k", k, numbers.Real), ("atol", atol, numbers.Real),
                                ("atoms", atoms, numbers.Integral)):
        if isinstance(value, bool) or not isinstance(value, kind):
            raise CaseError(f"compare: --{option} must be {'an integer' if kind is numbers.Integral else 'a number'}, "
                            f"got {value!r}")
    for option, value, valid, rule in (("k", k, 0 < k < math.inf, "finite and > 0"),
                                       ("atol", atol, 0 <= atol < math.inf, "finite and >= 0"),
                                       ("atoms", atoms, 1 <= atoms < ATOMS_BELOW,
                                        f"in [1, {ATOMS_BELOW}) (the exact solver's cost matrix: atoms^2 float64)")):
        if not valid:
            raise CaseError(f"compare: --{option} must be {rule}, got {value:g}")


def compare(a: xr.Dataset, b: xr.Dataset, k: float = 3.0, atol: float = 1e-9, atoms: int = 4000,
            labels: tuple[str, str] = ("A", "B"), w2: bool = True) -> xr.Dataset:
    """The comparison Dataset of two runs (not sweeps: compare their members): both series, difference, stderr, z,
    W2(t) (unless `w2` is false), verdicts; `k`, `atol`, `atoms` as compare's --k, --atol, --atoms."""
    check_options(k, atol, atoms)
    for label, run in zip(labels, (a, b)):
        if not isinstance(run, xr.Dataset):
            raise CaseError(f"compare: {label} is a {type(run).__name__}, not a result Dataset (open the files with "
                            "load_pair or spherepde.io.summary.open_result)")
        try:
            check_run(run)
        except CaseError as error:
            raise CaseError(f"compare: {label} is not a run as spherepde writes one: {error}") from None
        if "member" in run.dims:
            raise CaseError(f"compare: {label} is a sweep ({run.sizes['member']} members); compare its members")
    if a.sizes.get("component") != b.sizes.get("component"):
        raise CaseError("compare: the two runs are on spheres of different dimensions")
    ia, ib = common_times(a, b)
    a, b = a.isel(time=ia), b.isel(time=ib)
    coords = {"time": a["time"]}
    for name in ("component", "lyapunov_p"):
        if name in a.coords:
            coords[name] = a[name]
    if ("lyapunov_p" in a.coords) != ("lyapunov_p" in b.coords) or (
            "lyapunov_p" in a.coords and not np.array_equal(a["lyapunov_p"].values, b["lyapunov_p"].values)):
        raise CaseError("compare: the two runs use different diagnostics.lyapunov_p")
    eps = max(float(np.finfo(np.dtype(run.attrs.get("dtype", "float64"))).eps) for run in (a, b))
    rtol = ROUND_OFF_EPS * eps if eps > np.finfo(np.float64).eps else 0.0
    data, verdicts, probabilities, tolerances, lines, fewest = {}, {}, {}, {}, [], math.inf
    for name in DIAGNOSTIC_ATTRS:
        if name not in a or name not in b or a[name].size == 0:  # diagnostics.lyapunov_p = []: no values
            continue
        va, vb = a[name].values.astype(float), b[name].values.astype(float)
        se_a, se_b = _stderr(a, name, vb), _stderr(b, name, va)
        stderr = np.sqrt(se_a ** 2 + se_b ** 2)
        dof = welch_dof(se_a, se_b, degrees_of_freedom(a), degrees_of_freedom(b))
        scale = _round_off_scale(a, name, va) if rtol else 0.0
        tolerance = atol + rtol * scale + (_w2_floor(a, b) if name == "w2_projection" else 0.0)
        expected = _w2_projection_bias(a, b) if name == "w2_projection" else np.zeros(va.shape)
        with np.errstate(invalid="ignore", divide="ignore"):
            difference = np.where(np.isinf(va) & (va == vb), 0.0, vb - va)
            # the part of the difference beyond what the tolerance allows, in standard errors: |z| <= k exactly where
            # the verdict's |B - A| <= k stderr + tolerance holds, so that z and P(max|z|) speak of what it tests
            excess = np.abs(difference - expected) - tolerance
            z = np.where(excess <= 0, 0.0, np.sign(difference - expected) * excess / stderr)
        dims = a[name].dims
        long_name = DIAGNOSTIC_ATTRS[name][0]
        units = {"units": a[name].attrs["units"]} if "units" in a[name].attrs else {}  # min_density's: the sphere's
        data[f"{name}_a"] = (dims, va, {"long_name": f"{long_name} ({labels[0]})"} | units)
        data[f"{name}_b"] = (dims, vb, {"long_name": f"{long_name} ({labels[1]})"} | units)
        data[f"{name}_difference"] = (dims, difference, {"long_name": f"B - A of {name}"} | units)
        data[f"{name}_stderr"] = (dims, stderr, {"long_name": f"combined standard error of {name}"} | units)
        data[f"{name}_dof"] = (dims, dof, {"long_name": f"degrees of freedom of {name}'s z (Student t; inf: normal)",
                                           "units": "1"})
        if name == "w2_projection":
            data["w2_projection_bias"] = (dims, expected, {
                "long_name": "expected B - A of w2_projection from the particle runs' finite-n bias", "units": "1"})
        data[f"{name}_z"] = (dims, z, {"long_name": f"(B - A{' - bias' if name == 'w2_projection' else ''}) beyond "
                                                    f"the tolerance, over the stderr, of {name}", "units": "1"})
        verdicts[name] = _verdict(va, vb - expected, stderr, k, tolerance)
        tolerances[name] = float(tolerance)
        probabilities[name] = max_z_probability(z, dof)
        fewest = min(fewest, float(np.min(dof[~np.isnan(z) & (stderr > 0)], initial=math.inf)))
        lines.extend(_table_rows(name, a, va, vb, difference, stderr, z, dof,
                                 lambda pick: _verdict(va[pick], (vb - expected)[pick], stderr[pick], k, tolerance)))
    for label, run in zip(labels, (a, b)):
        if w2 and "particles" not in run and "density" not in run:
            saved = ("no saved particles (particles.save = 0)" if run.attrs.get("solver") == "particles"
                     else "no density variable")
            raise CaseError(f"compare: {label} holds {saved}, which W2(A, B) needs; pass --no-w2 to compare the "
                            "diagnostics alone")
    distances, bounds, methods = [], [], set()
    for i in range(a.sizes["time"] if w2 else 0):
        (points_a, masses_a, grid_a), (points_b, masses_b, grid_b) = measure(a, i, labels[0]), measure(b, i, labels[1])
        value, bound, method = w2_between(points_a, masses_a, points_b, masses_b, atoms)
        distances.append(value)
        # |W2(A, B) - W2(QA, QB)| <= W2(A, QA) + W2(B, QB): the grid measures' own distances to the densities
        bounds.append(bound + grid_a + grid_b)
        methods.add(method)
    if w2:
        data["w2"] = (("time",), np.array(distances), {"long_name": "W2 between the two measures, chordal cost",
                                                       "units": "1"})
        data["w2_bound"] = (("time",), np.array(bounds),
                            {"long_name": "bound on the W2 error (the solver's: quantisation or the rearrangement's "
                                          "excess; and each density grid's largest node-to-cell chord)",
                             "units": "1"})
    attrs = {
        "Conventions": "CF-1.10",
        "title": f"spherepde comparison of {labels[0]} and {labels[1]}",
        "history": history("compare"),
        "source": f"spherepde {VERSION}",
        # each run's full case, so that the report alone says what was compared (as a run's file does)
        "case_a": a.attrs.get("case", ""), "case_b": b.attrs.get("case", ""),
        "a": labels[0], "b": labels[1], "k": k, "atol": atol, "rtol": rtol,
        "w2_method": "; ".join(sorted(methods)) if w2 else "not computed",
        # what the w2_projection verdict allows besides k stderr: W2 differences below it are not resolved
        "w2_projection_floor": _w2_floor(a, b),
    }
    attrs.update({f"verdict_{name}": verdict for name, verdict in verdicts.items()})
    attrs.update({f"max_z_probability_{name}": value for name, value in probabilities.items()})
    attrs.update({f"tolerance_{name}": value for name, value in tolerances.items()})
    last = f"t={a['time'].values[-1]:g}"
    header = (f"{'diagnostic':<20} {'A(' + last + ')':>13} {'B(' + last + ')':>13} {'B-A':>11} {'max|B-A|':>10} "
              f"{'stderr':>10} "
              f"{'max|z|':>8} {'at t':>7} {'P(max|z|) of M':>14}  verdict (|B-A| <= {k:g} stderr + {atol:g}"
              + (f" + {rtol:.2g} max|A|: float32 round-off)" if rtol else ")"))
    # a failed run keeps the saves before its failure: say so, or its verdicts read as agreement to t_end
    unfinished = [f"{label}: {printable(run.attrs['status'])}; compared over the saves it has "
                  f"(t <= {run['time'].values[-1]:g})"
                  for label, run in (("A", a), ("B", b)) if run.attrs.get("status", "completed") != "completed"]
    attrs["failed"] = "\n".join(unfinished)  # shown in the report's figure too
    differences = problem_differences(a, b)
    if differences:
        lines.append(f"cases: A and B differ in {', '.join(differences)}: the verdicts say whether two problems give "
                     "the same values, not whether one problem is solved alike")
    for label, run in zip("AB", (a, b)):
        if int(run.attrs.get("replicas", 0)) == 1 and int(run.attrs.get("n", 0)) > 1:
            lines.append(f"{label}: its standard errors are the i.i.d. formulas of one system of n = "
                         f"{int(run.attrs['n'])} tokens, which leave out the correlations the interaction builds "
                         f"(the spread of the mean over seeds: {IID_SPREAD} times them), so a \"disagrees\" may be "
                         "theirs; particles.replicas = R (10 or more) gives batch-means errors, which hold them")
    if fewest < STUDENT_NOTE_BELOW:
        lines.append(f"z: Student t with as few as {fewest:.3g} degrees of freedom (standard errors from few systems): "
                     f"|z| > {k:g} by chance {float(two_sided_tail(k, fewest)):.2g} per value, against "
                     f"{math.erfc(k / math.sqrt(2)):.2g} for a normal z; P(max|z|) counts it")
    if w2:
        times = a["time"].values
        ends = [f"t = {times[i]:g}: {distances[i]:.4g}" for i in sorted({0, len(times) - 1})]  # one save: said once
        lines.append(f"W2(A, B): {', '.join(ends)}, max {max(distances):.4g}, bound {np.max(bounds):.2g} "
                     f"[{attrs['w2_method']}]")
        for label, run in zip("AB", (a, b)):
            if "density" not in run and run.sizes["particle"] < int(run.attrs.get("n", 0)):
                lines.append(f"W2(A, B): {label}'s measure is its {run.sizes['particle']} saved particles of n = "
                             f"{int(run.attrs['n'])} (particles.save), and W2 carries their sampling error")
    if not verdicts.get("w2_projection", "n/a").startswith("n/a"):
        lines.append(f"w2_projection: its verdict is |B - A - bias| <= {k:g} stderr + {atol:g} + "
                     f"{attrs['w2_projection_floor']:.2g}, the last the runs' quantisation bounds + round-off, which "
                     "W2 values do not resolve")
        bias = np.abs(data["w2_projection_bias"][1])
        if np.nanmax(bias, initial=0.0) > 0:
            lines.append(f"w2_projection: z and the verdict are of B - A - bias, bias = the expected excess of the "
                         f"particles' empirical W2 at their n (w2_projection_bias, up to {np.nanmax(bias):.2g})")
        stale = [label for label, run in zip("AB", (a, b)) if "w2_projection_stderr" in run and (
            "w2_projection_squared_bias" not in run or np.isnan(run["w2_projection_squared_bias"].values).any())]
        if stale:
            lines.append(f"w2_projection: {' and '.join(stale)} stores no w2_projection_squared_bias (a file written "
                         "before it, or n < 4): its finite-n bias, of order 1/sqrt(n) where W2 is small, is not "
                         "subtracted")
    attrs["report"] = "\n".join([f"A: {labels[0]}", f"B: {labels[1]}"] + unfinished + [header] + lines)
    return xr.Dataset(data, coords=coords, attrs=attrs)


def max_z_probability(z: np.ndarray, dof=math.inf) -> float:
    """P(max |T_i| >= max |z|) for independent T_i, one per value of z that is not NaN, each Student t with that
    value's `dof` degrees of freedom (standard normal where infinite): how often errors of the stated size alone
    would reach the worst z of the comparison (NaN if there is none).

    The verdict asks |z| <= k at every time and component, so over M values a run that agrees fails it by
    chance with probability 1 - (1 - P(|T| > k))^M (at k = 3 and normal errors: 10% for M = 41, 20% for M = 81
    independent values; saves of one particle run are correlated, which makes it less).  This says how
    surprising the worst value is, not whether the two agree."""
    values = np.abs(np.asarray(z, dtype=float))
    present = ~np.isnan(values)
    if not present.any():
        return math.nan
    one = two_sided_tail(values[present].max(), np.broadcast_to(dof, values.shape)[present])  # P(|T_i| >= max|z|)
    return 0.0 - math.expm1(float(np.log1p(-one).sum())) if (one < 1).all() else 1.0


def _table_rows(name, run, va, vb, difference, stderr, z, dof, verdict_of) -> list[str]:
    """The text table's lines of the diagnostic `name`: one, or one per component of a diagnostic with a second
    dimension (mean's components "mean[0]", ..., lyapunov's exponents "lyapunov[p=2]"), each with its own values and
    verdict (`verdict_of(index)`); a single row showed the first component's values under the diagnostic's name."""
    times = run["time"].values
    if va.ndim == 1:
        return [_table_row(name, times, va, vb, difference, stderr, z, dof, verdict_of(slice(None)))]
    extra = run[name].dims[1]
    coordinates = run[extra].values if extra in run.coords else np.arange(va.shape[1])
    rows = []
    for j, value in enumerate(coordinates):
        label = f"{name}[{value:g}]" if extra == "component" else f"{name}[{extra.rsplit('_', 1)[-1]}={value:g}]"
        pick = (slice(None), j)
        rows.append(_table_row(label, times, va[pick], vb[pick], difference[pick], stderr[pick], z[pick], dof[pick],
                               verdict_of(pick)))
    return rows


def _table_row(name, times, va, vb, difference, stderr, z, dof, verdict) -> str:
    """One line of the text table, of a series over the shared `times`: the last shared time, the largest |B - A|
    and the largest |z| over times and when it came ("-" where no |z| exceeds 0: every difference within the
    tolerance, or none computed; it read t = 0), and how probable so large a |z| is among that many values
    (max_z_probability)."""
    with np.errstate(invalid="ignore"):
        magnitude = np.where(np.isnan(z), -1.0, np.abs(z))
    worst = int(np.argmax(magnitude))
    worst_z = f"{magnitude[worst]:8.2f}" if magnitude[worst] >= 0 else f"{'-':>8}"
    when = f"{times[worst]:>7.3g}" if magnitude[worst] > 0 else f"{'-':>7}"
    probability = max_z_probability(z, dof)
    chance = f"{'-':>14}" if math.isnan(probability) else f"{probability:7.2g} of {np.count_nonzero(~np.isnan(z)):<4d}"
    finite = np.abs(difference[np.isfinite(difference)])
    largest = float(finite.max()) if finite.size else math.nan
    return (f"{name:<20} {va[-1]:>13.6g} {vb[-1]:>13.6g} {difference[-1]:>11.3g} {largest:>10.3g} "
            f"{stderr[-1]:>10.3g} {worst_z} {when} {chance}  {verdict}")


# ---------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------


def plot_report(report: xr.Dataset, target: str) -> str:
    """REPORT.png: `report_figure`'s figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = report_figure(report)
    figure.savefig(target, dpi=100)
    plt.close(figure)
    return target


def report_figure(report: xr.Dataset):
    """One panel per diagnostic and one for W2(t): A's line, B's dots and, per component, the band where A agrees
    with B by the verdict's rule, B - bias +- (k stderr + tolerance_<diagnostic>) (bias: w2_projection_bias, 0 for
    the others).  A band of B +- k stderr alone hid what the verdict allows: a w2_projection of particles lies above
    the Eulerian one by its finite-n bias, and an A outside that band was yet within the verdict."""
    import matplotlib.pyplot as plt

    names = [name for name in DIAGNOSTIC_ATTRS if f"{name}_a" in report
             and np.isfinite(report[f"{name}_a"].values).any() and np.isfinite(report[f"{name}_b"].values).any()]
    # a diagnostic constant in both runs (mass 1, alignment 1 where E is everything) is a line: named, not drawn
    constant = [name for name in names if _constant(report[f"{name}_a"].values, report[f"{name}_b"].values)]
    names = [name for name in names if name not in constant]
    columns = min(4, len(names) + 1)
    rows = math.ceil((len(names) + 1) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3 * rows), constrained_layout=True,
                                squeeze=False)
    time, k = report["time"].values, report.attrs["k"]
    for axis, name in zip(axes.flat, names):
        a, b, se = (report[f"{name}_{part}"].values for part in ("a", "b", "stderr"))
        bias = report[f"{name}_bias"].values if f"{name}_bias" in report else np.zeros(b.shape)
        # a report written before tolerance_<diagnostic> was stored: atol, which every verdict allows
        tolerance = report.attrs.get(f"tolerance_{name}", report.attrs["atol"])
        extra = report[f"{name}_a"].dims[1:]
        for j in range(int(np.prod(a.shape[1:]))):
            column = (slice(None), j) if a.ndim > 1 else slice(None)
            label = f"{extra[0]} = {report[extra[0]].values[j]:g}" if extra else None
            line, = axis.plot(time, a[column], lw=1.5, label=label)
            axis.plot(time, b[column], "o", ms=3, color=line.get_color())
            half_width = k * se[column] + tolerance
            axis.fill_between(time, b[column] - bias[column] - half_width, b[column] - bias[column] + half_width,
                              alpha=0.25, color=line.get_color(), lw=0)
        if extra:
            axis.legend(fontsize=7, frameon=False)
        axis.set_title(f"{name}: {report.attrs[f'verdict_{name}']}", fontsize=9)
        axis.set_xlabel("time")
    if "w2" in report:
        w2_panel(axes.flat[len(names)], time, report["w2"].values)
    for axis in axes.flat[len(names) + ("w2" in report):]:
        axis.set_visible(False)
    title = (f"lines: A = {report.attrs['a']};  dots: B = {report.attrs['b']};  bands: where A agrees with B, "
             f"B - bias +- ({k:g} stderr + tolerance)")
    title += f"\nconstant in both runs: {', '.join(constant)}" if constant else ""
    failed = report.attrs.get("failed", "")
    # parse_math off: file names are text, and a "$" in one started mathtext (a traceback, no figure)
    figure.suptitle(title + (f"\n{_wrapped(failed)}" if failed else ""), fontsize=9,
                    color="firebrick" if failed else "black", parse_math=False)
    return figure


def w2_panel(axis, time: np.ndarray, w2: np.ndarray) -> None:
    """W2(A, B) over time: on a log axis where its values are positive and span a decade, else linear (a W2 of 0,
    two runs of one seed at t = 0, drawn at a floor of 1e-300 took the log axis down to it and flattened the rest)."""
    finite = w2[np.isfinite(w2)]
    logarithmic = finite.size and finite.min() > 0 and spans_a_decade(finite)
    (axis.semilogy if logarithmic else axis.plot)(time, w2, "k.-")
    axis.set_title("W2(A, B)", fontsize=9)
    axis.set_xlabel("time")


def _wrapped(text: str, width: int = 160) -> str:
    """Lines of `text` wrapped to `width` characters (a failure's reason can be long for a figure title)."""
    return "\n".join(textwrap.fill(line, width) for line in text.splitlines())


def _constant(a: np.ndarray, b: np.ndarray) -> bool:
    """Both series take one value (to 1e-12 of their scale), the same in A and B."""
    values = np.concatenate([a.ravel(), b.ravel()])
    values = values[np.isfinite(values)]
    return bool(values.size) and float(np.ptp(values)) <= 1e-12 * max(1.0, float(np.abs(values).max()))


def default_stem(path_a: str, path_b: str | None) -> str:
    stem = os.path.splitext(os.path.basename(path_a))[0]
    if path_b is None:
        return f"{stem}_compare"
    return f"{stem}_vs_{os.path.splitext(os.path.basename(path_b))[0]}"


def report_stem(output: str) -> str:
    """REPORT of `compare -o REPORT`, a .nc or .png suffix taken off (-o x.png wrote x.png.nc and x.png.png)."""
    stem, suffix = os.path.splitext(output)
    return stem if suffix in (".nc", ".png") else output


def write_report(report: xr.Dataset, stem: str) -> list[str]:
    """REPORT.nc and REPORT.png, both or neither: the figure is drawn into a temporary file before anything is
    written (a title matplotlib cannot draw left REPORT.nc alone), then REPORT.nc is written atomically and the
    figure renamed beside it; returns the paths."""
    stem = report_stem(stem)
    paths = [f"{stem}.nc", f"{stem}.png"]
    temporary = f"{paths[1]}.{uuid.uuid4().hex}.tmp.png"
    # the figure's temporary file comes first, before write_dataset would make a missing folder of -o (as `run -o`
    # and `plot -o` do): it failed there with a bare "No such file or directory", the comparison done for nothing
    make_folders(os.path.dirname(os.path.abspath(stem)))
    written = False
    try:
        plot_report(report, temporary)
        write_dataset(report, paths[0])
        written = True
        os.replace(temporary, paths[1])
    except BaseException:
        if written:
            os.remove(paths[0])
        raise
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    return paths
