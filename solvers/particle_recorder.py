"""What a particle run records at its save times: the diagnostics of docs/design.md "Diagnostics" as empirical averages
over the tokens with their Monte Carlo standard errors (the formulas: `ParticleRecorder`), and particles.save positions
(`saved_tokens`); handed to spherepde.io.output as a plain `Saves` record.
"""

import math

import numpy as np
import torch

from solvers.particle_field import ParticleField
from solvers.records import RunRecord
from spherepde.io.output import particle_dataset
from spherepde.kernels.dense import block_rows
from spherepde.measures import diagnostics as diag
from spherepde.measures.optimal_transport import merge_atoms
from spherepde.measures.sample_statistics import half_sample_bias, mean_and_error, paired_w2
from spherepde.model.attention import Model, principal_subspace
from spherepde.model.energy import FreeEnergy

# Above S^2 measures cannot be quantised: w2_projection is exact OT up to this many particles (at any n where
# Pi_# of the initial particles is two atoms).
EXACT_W2_ABOVE_S2 = 3000


def saved_tokens(n: int, replicas: int, save: int) -> np.ndarray:
    """The indices of the `save` tokens a run writes of its n: the first of each of its `replicas` systems of n / R
    consecutive tokens, as evenly as they go (the first save mod R systems one more), system by system (all n in
    their order).  Within a system, and among the systems, the tokens are exchangeable, so these are a uniform
    subsample; the first `save` of all n were the first system's alone, whose common drift (a rotation-invariant
    model's) every other system's cancels."""
    per_system, extra = divmod(save, replicas)
    size = n // replicas
    return np.concatenate([system * size + np.arange(per_system + (system < extra)) for system in range(replicas)])


def batch_means_error(values) -> np.ndarray:
    """The standard error of the mean of R systems' estimates, std(values, ddof=1) / sqrt(R) along the first axis,
    formed on the values divided by the power of two above their largest magnitude (exact, so bit for bit the plain
    formula wherever that is finite): the squares of an interaction energy beyond 1e154 overflow (beta = 400 on
    S^1: -8.9e171, its error inf)."""
    values = np.asarray(values, dtype=float)
    largest = float(np.nanmax(np.abs(values), initial=0.0))
    scale = 2.0 ** math.frexp(largest)[1] if 0 < largest < math.inf else 1.0
    with np.errstate(invalid="ignore"):
        return np.std(values / scale, axis=0, ddof=1) / math.sqrt(values.shape[0]) * scale


class ParticleRecorder(RunRecord):
    """Diagnostics of docs/design.md "Diagnostics" as empirical averages with standard errors, and saved particles.

    Standard errors (`<name>_stderr` in the output), particles.replicas = 1: the i.i.d. formulas
      mean, alignment_E/F, lyapunov: std of the per-particle integrand / sqrt(n) (for
        lyapunov from its second moment, V_{2p} - V_p^2);
      order_parameter |m|: delta method, sqrt(u^T Cov(x) u / n), u = m / |m|;
      w2_projection: linearisation at the Kantorovich potentials (see `paired_w2`), which leaves out the
        upward bias of an empirical W2 (of order 1 / sqrt(n) where W2 is small); its estimate for W2^2,
        `half_sample_bias`, is stored as `w2_projection_squared_bias` for `spherepde compare`;
      interaction_energy: the U-statistic -1/(2 n (n-1)) sum_{i != j} k(x_i, x_j) (unbiased
        for independent particles), SE by Hoeffding's projection: std(g) / sqrt(n) with
        g_i = (1/(n-1)) sum_{j != i} (k(x_i, x_j) + k(x_j, x_i)) / 2;
      at n = 2 the last two read 0 whatever the pair (g_1 = g_2; x_i - m orthogonal to m): NaN there;
      mass: exactly 1, SE 0.
    They hold for independent particles (t = 0: measured on vMF draws on S^1 and S^2, n = 100, 4000 draws, the
    spread over the RMS error 0.97-1.01 +- 0.011), except that the Hoeffding projection (as the delta method of the
    beta B = 0 free energy) keeps the first-order term only: where it vanishes (a rotation-invariant kernel under
    the uniform law; M = 0) U is degenerate, its spread O(1 / n), and the error reads sqrt(2) times it on average
    (ratio 0.71-0.73), with chi-square noise; the unbiased second-order estimate is negative there half the time.
    They ignore the correlations the interaction builds: where the dynamics amplifies fluctuations they are too
    small (S^2, n = 200, eps = 0.1, t = 3: 2.7 to 2.9 times, for interaction_energy, alignment_E and lyapunov).
    particles.replicas = R > 1 (R independent systems of n / R tokens): batch means, SE =
    std over the R systems of their estimates / sqrt(R), honest at every time (Student t
    with R - 1 degrees of freedom), the value the mean of the R estimates (for the averages
    over tokens the value of all n tokens; the order parameter the mean of the systems' |m|,
    the interaction energy of their U-statistics); w2_projection is that of all n tokens, its error
    the batch means over the systems of the linearisation h_i at all n tokens' potentials (`paired_w2`;
    the spread of the systems' own W2s, whose finite-size bias is R times as large, understated it
    by up to 1.45 times at R = 8, n = 800).
    entropy needs a density: NaN for particles; free_energy (spherepde.model.energy) is its interaction part U
    when eps = 0, NaN otherwise.  The diagnostics of the attention (alignment_E/F, lyapunov, w2_projection,
    interaction and free energy) are those of one head with fixed B and V (`fixed_attention`:
    ParticleSystem.fixed_attention), `model`; beyond it they are NaN, as the Eulerian run's (they were head 0's).
    """

    def __init__(self, case, model: Model, field: ParticleField, x0: torch.Tensor, controlled: bool = False,
                 fixed_attention: bool = True):
        super().__init__(case)
        self.model, self.field, self.fixed_attention = model, field, fixed_attention
        self.free_energy = FreeEnergy.of_model(model, controlled)  # the model's, the same at every save
        host = lambda matrix: matrix.cpu().double().numpy()  # noqa: E731
        self.subspace_E = principal_subspace(host(model.V @ model.B.T)) if fixed_attention else None
        self.subspace_F = principal_subspace(host(model.V)) if fixed_attention else None
        self.want_w2, self.w2_atoms = case["diagnostics"]["w2"], case["diagnostics"]["w2_atoms"]
        self.replicas = case["particles"]["replicas"]
        self.projected_0 = None
        if self.subspace_E is not None:
            self.projected_0 = diag.projection(x0.cpu().double().numpy(), self.subspace_E)
        self.saved = saved_tokens(case["particles"]["n"], self.replicas, case["particles"]["save"])
        self.positions = []
        self.steps, self.dt, self.w2_error_bound = 0, math.nan, 0.0
        self.batch_members = field.batch.members

    def record(self, t: float, x: torch.Tensor) -> dict:
        points = x.cpu().double().numpy()
        replicas = self.replicas
        row, errors = self.estimates(points, x, self.projected_0, energy=replicas == 1, systems=replicas)
        if replicas > 1:
            # no w2_projection of a system (projected_0 None): its error is the batch means of all n tokens' (paired_w2)
            systems = [self.estimates(*block, None, energy=True)[0]
                       for block in zip(np.split(points, replicas), x.split(len(x) // replicas))]
            # the batch means: the mean of the systems' estimates, the value their spread is the error of (for the
            # averages over tokens, the value of all n tokens); for |m| they differ where the systems' directions
            # spread (a rotation-invariant model lets each drift): |m| of all n tokens then falls below every
            # system's (0.70 against 0.82 on kuramoto-s1, n = 1000, R = 10, t = 80; Eulerian 0.83)
            for name in ("order_parameter", "interaction_energy", "free_energy"):
                row[name] = np.mean([system[name] for system in systems])
            spread = {name: batch_means_error([system[name] for system in systems]) for name in row}
            # no standard error where the integrand has infinite variance (see _lyapunov)
            spread["lyapunov"] = np.where(np.isnan(errors["lyapunov"]), np.nan, spread["lyapunov"])
            spread["w2_projection"] = errors["w2_projection"]
            errors = spread
        row.update({f"{name}_stderr": value for name, value in errors.items()})
        row["w2_projection_squared_bias"] = self._w2_projection_squared_bias(points, row["w2_projection"])
        self.times.append(t)
        self.rows.append(row)
        if len(self.saved):
            self.positions.append(points[self.saved])
        return row

    def estimates(self, points: np.ndarray, x: torch.Tensor, projected_0: np.ndarray | None,
                  energy: bool, systems: int = 1) -> tuple[dict, dict]:
        """Every diagnostic of the particles `points` (the rows of x) and its i.i.d. standard error; w2_projection's
        by batch means over `systems` independent systems of consecutive rows where there are several."""
        n = points.shape[0]
        masses = np.full(n, 1 / n)
        row, errors = {"mass": float(masses.sum())}, {"mass": 0.0}
        m = diag.mean(points, masses)
        row["mean"], errors["mean"] = m, points.std(0, ddof=1) / math.sqrt(n)
        r = float(np.linalg.norm(m))
        row["order_parameter"] = r
        direction = m / r if r > 0 else np.zeros_like(m)
        # Two tokens: x_1 - m and x_2 - m are orthogonal to m (|x_1| = |x_2|), so the delta method reads 0 whatever
        # their spread; it estimates nothing there
        errors["order_parameter"] = mean_and_error(points @ direction)[1] if n > 2 else math.nan
        for name, subspace in (("alignment_E", self.subspace_E), ("alignment_F", self.subspace_F)):
            if subspace is None:
                row[name], errors[name] = math.nan, math.nan
            else:
                row[name], errors[name] = mean_and_error(diag.projected_norm_squared(points, subspace))
        row["lyapunov"], errors["lyapunov"] = self._lyapunov(points, masses)
        row["w2_projection"], errors["w2_projection"] = self._w2_projection(points, projected_0, systems)
        row["interaction_energy"], errors["interaction_energy"] = (self._interaction_energy(x) if energy and
                                                                   self.fixed_attention else (math.nan, math.nan))
        row["entropy"], errors["entropy"] = math.nan, math.nan
        if self.model.eps == 0 and self.fixed_attention:  # F = U
            row["free_energy"] = self.free_energy.sample_interaction(row["interaction_energy"], points)
            errors["free_energy"] = self.free_energy.interaction_stderr(errors["interaction_energy"], points)
        else:
            row["free_energy"], errors["free_energy"] = math.nan, math.nan
        return row, errors

    def _lyapunov(self, points: np.ndarray, masses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """V_p and its standard error sqrt((V_{2p} - V_p^2) / (n - 1)).

        Near {P_E x = 0}, of codimension k = dim E, the integrand grows like dist^{-2p}: its
        variance is infinite for p >= k / 4 whenever rho charges that set, and no standard
        error exists there (NaN, with a note).
        """
        values = np.array([diag.lyapunov(points, masses, self.subspace_E, p) for p in self.lyapunov_p])
        second = np.array([diag.lyapunov(points, masses, self.subspace_E, 2 * p) for p in self.lyapunov_p])
        with np.errstate(invalid="ignore"):
            errors = np.sqrt(np.maximum(second - values ** 2, 0) / (points.shape[0] - 1))
        if self.subspace_E is not None and self.subspace_E.shape[1] < points.shape[1]:
            k = self.subspace_E.shape[1]
            infinite = np.array(self.lyapunov_p) >= k / 4
            errors[infinite] = np.nan
            note = f"lyapunov_stderr is NaN for p >= dim(E) / 4 = {k / 4:g}: the integrand has infinite variance there"
            if infinite.any() and note not in self.notes:
                self.notes.append(note)
        return values, errors

    def _w2_atoms(self, points: np.ndarray) -> int:
        """diagnostics.w2_atoms, or all the particles above S^2 (no quantisation there: exact OT)."""
        return points.shape[0] if points.shape[1] > 3 and points.shape[0] > self.w2_atoms else self.w2_atoms

    def _w2_projection(self, points: np.ndarray, projected_0: np.ndarray | None, systems: int) -> tuple[float, float]:
        if not self.want_w2 or projected_0 is None:
            return math.nan, math.nan
        # onto at most two atoms (dim E = 1) the transport is exact at any n (optimal_transport.two_atom_transport):
        # their count is looked at only where the size would refuse it, not at every save of every run
        beyond = points.shape[1] > 3 and points.shape[0] > max(self.w2_atoms, EXACT_W2_ABOVE_S2)
        if beyond and len(merge_atoms(projected_0, np.ones(len(projected_0)))[0]) > 2:
            note = (f"w2_projection not computed: {points.shape[0]} particles on S^{points.shape[1] - 1} exceed "
                    f"both diagnostics.w2_atoms and {EXACT_W2_ABOVE_S2} (exact OT; no quantisation above S^2)")
            if note not in self.notes:
                self.notes.append(note)
            return math.nan, math.nan
        value, error, bound = paired_w2(points, projected_0, self._w2_atoms(points), systems)
        self.w2_error_bound = max(self.w2_error_bound, bound)
        return value, error

    def _w2_projection_squared_bias(self, points: np.ndarray, value: float) -> float:
        """`half_sample_bias` of the w2_projection `value` of all the particles (NaN where it is NaN); with
        replicas too, the bias of the value from all n tokens (the systems are independent of each other)."""
        if math.isnan(value):
            return math.nan
        return half_sample_bias(points, self.projected_0, self._w2_atoms(points), value ** 2)

    def _interaction_energy(self, x: torch.Tensor) -> tuple[float, float]:
        """-1/2 times the U-statistic of k(x, y) = exp(beta <x, B y>), and its standard error.

        Hoeffding: Var(U) ~ 4 Var(h(X)) / n with h(x) = E (k(x, Y) + k(Y, x)) / 2, estimated by
        g_i = (1/(n-1)) sum_{j != i} (k(x_i, x_j) + k(x_j, x_i)) / 2 (row and column sums of the kernel).
        The g_i are log-sum-exps over the pairs j != i alone: the row sums less their diagonal k(x_i, x_i) =
        exp(beta <x_i, B x_i>) cancel catastrophically where that term dwarfs the pairs (three tokens on S^1 at
        beta = 300 gave U = +5e105 for -2.1e77), and a U beyond float64 overflowed with either sign.
        """
        model, n = self.model, x.shape[0]
        if model.zero_temperature:
            return -math.inf, math.nan
        if n < 2:
            return math.nan, math.nan
        if model.beta == 0 or not bool(model.B.any()):  # k = 1: every pair's, in O(n) where the pairs cost n^2
            return -0.5, 0.0
        symmetric = bool((model.B == model.B.T).all())
        queries = [model.beta * (x @ C) for C in ([model.B] if symmetric else [model.B, model.B.T])]
        rows = block_rows(self.field.chunk, n, x.dtype, x.device)
        sums = []  # log sum_{j != i} k(x_i, x_j), and with B^T log sum_{j != i} k(x_j, x_i)
        for start in range(0, n, rows):
            block = []
            for query in queries:
                logits = query[start:start + rows] @ x.T
                diagonal = torch.arange(logits.shape[0], device=x.device)
                logits[diagonal, start + diagonal] = -math.inf
                block.append(torch.logsumexp(logits, dim=1))
            sums.append(block[0] if symmetric else torch.logaddexp(*block) - math.log(2))
        log_g = (torch.cat(sums) - math.log(n - 1)).cpu().double().numpy()
        shift = log_g.max()
        value, error = mean_and_error(np.exp(log_g - shift))
        if n == 2:  # g_1 = g_2 = k(x_1, x_2): the projection reads 0 whatever the pair's spread
            error = math.nan
        with np.errstate(over="ignore"):
            return float(-0.5 * value * np.exp(shift)), float(error * np.exp(shift))

    def dataset(self, status: str):
        section = self.case["particles"]
        attrs = {
            "solver": "particles",
            "n": section["n"],
            "seed": section["seed"],
            "integrator": section["integrator"],
            "attention": self.field.attention,
            "dt": float(self.dt),
            "steps": int(self.steps),
            "dtype": str(self.model.B.dtype).removeprefix("torch."),
            "device": str(self.model.B.device),
            "wall_seconds": float(self.wall_seconds),
            "batch_members": int(self.batch_members),
            "w2_quantisation_bound": float(self.w2_error_bound),
            "replicas": section["replicas"],
            "stderr": ("Monte Carlo standard errors: i.i.d. formulas (std / sqrt(n) of per-particle integrands; "
                       "delta method for order_parameter and w2_projection; Hoeffding projection for the "
                       "interaction_energy U-statistic), blind to the correlations the interaction builds"
                       if section["replicas"] == 1 else
                       f"Monte Carlo standard errors by batch means over {section['replicas']} independent systems"),
            "notes": "\n".join(self.notes),
        }
        return particle_dataset(self.saves(status, attrs, positions=self.positions, tokens=self.saved))
