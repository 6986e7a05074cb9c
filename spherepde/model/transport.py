"""The transport term of the forward equation for M members on one basis grid, and its exact transpose.

    rate(c, a) = -div(rho v),   rho = synthesis(c),   v_k = a_k + u_k,   u_k = <e_k, V m[rho]>   (k < d - 1)

(docs/design.md "The model"), with the velocity in its components along the basis's orthonormal tangent frame e_k (one
number less per point than ambient components), a_k(x) = <e_k(x), W x> the feed-forward term of the layer
being stepped, and the divergence in the weak form, so that the degree-0 coefficient of the rate is zero:
mass is conserved to round-off.  States are real (M, N): the real view of each member's coefficients
(base.real_view); grid fields are flattened: rho (M, P), a, u, v (M, K, P), K = d - 1.

The attention term u is found one of three ways, and the rate on one of three paths (`attention_mode`, `path`),
chosen once by an estimate of their cost (multiply-adds, and a fixed cost per tensor operation):

* "operator" (model.dense_operator): the members' dense kernel folded with V, the frame and the quadrature
  weights into one matrix acting on the grid density, when the field is the dense quadrature on a grid whose
  N x N kernel is kept (S^1, small S^2 grids):
      unnormalized:  u = G rho,   G[k, i, j] = exp(beta <x_i, B y_j>) w_j <e_k(x_i), V y_j>;
      softmax:       (Z, N) = K rho,   K[c, i, j] = exp(beta <x_i, B y_j> - s_i) w_j (1, y_j)_c,
                     m = N / Z (model.softmax_mean; the row shift s_i cancels), u_k = <e_k, V m>
                     (Transport._softmax_components).
* "zero temperature": m = B^T x / |B^T x| does not depend on rho; u is a field computed once.
* "transform": the members' exponential-kernel transforms (kernels.choice.MemberKernels: dense blocks or the
  spectral field) applied to the channels (rho, rho y) at every call; on the grid path, where the spectral field
  allows it (S^2, C = s I or a permutation of the grid), rho and the channels' transforms come together from the
  coefficients, one product per order (MemberKernels.density_fields, TorchSHT.moments), and the transpose is
  that map's (TorchSHT.moments_adjoint: the synthesis and the transform at once); where moreover V_m = a_m I, the
  rate takes rho, N's components along the frame and Z alone (MemberKernels.density_frame_fields,
  TorchSHT.frame_moments): u_k = a_m <e_k, N> / Z (softmax), four fields of the grid where the channels are five,
  or a_m <e_k, N> (unnormalized), three, and the transpose is that map's (TorchSHT.frame_moments_adjoint).

and the paths:

* "matrix" (model.matrix_path): on small grids, with the operator or zero-temperature attention, the synthesis
  and the divergence are dense real matrices too (found by applying the basis's transforms to unit vectors), and
  folded with the attention: one product gives rho and u (or rho alone), a second one the rate.  A stage is
  then three tensor operations, where the transforms' own cost is their per-operation overhead: on S^1 at
  lmax 64 about a quarter of the "grid" path's time (benchmarks/ensembles.py).
* "fourier" (model.fourier_path): on S^1 with the operator attention of the unnormalized kernel, the synthesis
  and the divergence as FFTs and the attention folded with the synthesis into a rank-r product (the kernel is
  smooth: r = 29 of 200 points for seed 004 at lmax 64), about 2 FFTs and r (N + P) multiply-adds per member
  where the matrix path spends 3 P N; more operations, so in torch it pays from about 8 members on at lmax 64; on
  the CPU it runs in numpy (`namespace`), whose operations cost a fifth of torch's, and pays from one member on.
  Its factors come from the coarsest basis that resolves the kernel, so it runs on grids whose operator is not
  kept too (seed 004's eps = 1e-4 case, 4050 points: 0.5 ms a step against 370-380 ms on the grid path).
* "grid": the basis's transforms (FFT, spherical-harmonic transforms) with the attention in between.

`vjp` is the transpose of the derivative of the rate (the discrete adjoint of one evaluation), written out:
with rho_bar, v_bar the cotangents of rho and v,

    f_bar = -div^T b,   rho_bar = sum_k v_k f_bar_k + (attention)^T u_bar,   v_bar = u_bar = a_bar = rho f_bar,
    c_bar = synthesis^T rho_bar,

with the matrices' transposes, or the bases' exact transposes (bases.synthesis_adjoint,
divergence_adjoint) and, for the transform attention, torch autograd through the kernel transform alone
(a linear map, whose own arithmetic dominates there), or on the spectral field's one-pass route the moments'
written-out transpose, which takes (rho_bar, Z_bar, N_bar) to c_bar at once (N_bar's frame components on the frame
route, `_frame_velocity_adjoint`).
"""

import copy
import math

import numpy as np
import torch

from spherepde.base.arrays import amax, as_namespace, as_tensor, clamp_min, over_first, program_namespace, quiet
from spherepde.base.real_view import complex_state, real_state
from spherepde.geometry.ambient import inner
from spherepde.kernels.choice import MemberKernels
from spherepde.model.attention import (
    NEGLIGIBLE_DENSITY,
    Model,
    ModelBatch,
    softmax_mean_adjoint,
    zero_temperature_mean,
)
from spherepde.model.dense_operator import attention_operator, operator_fits
from spherepde.model.fourier_path import FourierPath
from spherepde.model.matrix_path import MatrixPath

# Largest memory (bytes) of the matrices of Transport's "matrix" path (and of the folded attention operators).
MATRIX_BYTES = 64 * 2 ** 20
# The costs below are in multiply-adds at 1e10 a second (0.1 ns each; the unit of the transforms' own estimates,
# kernels.*.cost), measured on one core of the development machine (thread CPU time, benchmarks/ensembles.py
# --fields prints them and checks the ranking they give against the clock).
# The fixed cost of one torch operation on the CPU with the Python around it: 2.9 us an operation in the fourier
# step written as the fewest torch operations (benchmarks/floors.py lean_fourier_step; a bare add takes 1.0 us).
OPERATION_COST = 30_000
# The same for an operation of the fourier path's numpy program on the CPU (model.fourier_path, base.arrays): about
# 1.1 us (the same yardstick in numpy; a bare add takes 0.34 us).
NUMPY_OPERATION_COST = 12_000
# A matrix-vector product is bound by reading its matrix, not by its multiply-adds: a product of a vector with a
# 4-32 MiB float64 matrix ran at 25 GB/s (3.2e9 multiply-adds a second, a third of the reference rate): 0.4
# multiply-adds per byte read.  Matrices that stay in the core's cache (the L2's 4 MiB here; 1 MiB read at
# 100-125 GB/s, 2 MiB at 60) cost a quarter of that; the matrix path reads its two matrices at every evaluation, so
# together up to CACHED_MATRIX_BYTES they count as cached.
MATRIX_BYTE_COST = 0.4
CACHED_MATRIX_BYTE_COST = 0.1
CACHED_MATRIX_BYTES = 2 * 2 ** 20
# Each multiply-add of a product at the BLAS's GEMM rate, on top of its matrix's reading: a 512^2 GEMM ran at 4.4e10
# a second (benchmarks/floors.py arithmetic_floor).  A product with M columns is then read + M x arithmetic: at 4
# MiB it took 165, 205 and 375 us for 1, 4 and 16 columns against 180, 215 and 360 us so modelled.
GEMM_COST = 0.23


def auto_fields(basis, models: list, tol: float, chunk) -> list:
    """solver.field = "auto" member by member, as each member's serial run picks it: the field that
    kernels.choice.make_exp_kernel picks for the transform alone ("auto", left to it, where the grid is too large
    for the operator), unless it is the spectral one and the dense field lets the transport fold the attention
    into its operator (the matrix or the fourier path: small S^2 grids, S^1) at a lower estimated cost for that
    one member (Transport.cost).  The transform's own estimate cannot see that: on convergence-s2 with the
    unnormalized kernel at lmax 8 the spectral field's transform is the cheaper, but its grid path took 1.7-1.8 ms a
    step against the dense field's matrix path's 1.15-1.25 (estimates 2.1e6 and 1.7e6); from lmax 10 on (9 with
    B = I; 8 with the softmax kernel) the matrix path's reading of its matrices makes the spectral field the faster,
    and the pick.  Those figures are a Zen 1 EPYC's; on a Zen 3 one the matrix path stays the faster 2-4 degrees
    further (convergence-s2 at lmax 8, softmax: 1.57 ms a step against the grid path's 4.14; lmax 10,
    unnormalized: 1.27 against 4.05), which the cost constants, Zen 1's, do not follow."""
    picks, fields = {}, []
    for model in models:
        key = (float(model.beta), model.B.cpu().double().numpy().tobytes(), model.V.cpu().double().numpy().tobytes(),
               model.kernel)
        if key not in picks:
            picks[key] = _auto_field(basis, model, tol, chunk)
        fields.append(picks[key])
    return fields


def _auto_field(basis, model: Model, tol: float, chunk) -> str:
    """`auto_fields` for one member's model (its transforms built here only where the operator could fold them)."""
    foldable = operator_fits(basis, model.kernel) or (basis.dim == 2 and model.kernel == "unnormalized")
    if not foldable:
        return "auto"
    batch = ModelBatch.of([model])
    kernels = MemberKernels(basis, batch.B, [model.beta], "auto", tol, chunk)
    if kernels.name == "dense":
        return "dense"
    dense = Transport(basis, batch, MemberKernels(basis, batch.B, [model.beta], "dense", tol, chunk))
    return "dense" if dense.attention_mode == "operator" and dense.cost < Transport(basis, batch, kernels).cost \
        else kernels.name


def frame_sum(frame, values, over: str):
    """A sum of the frame's products with fields, for a frame (M or 1, K, d, P) and fields (M, d, P) or (M, K, P):
    over "c", u_k = sum_c frame_kc values_c (M, K, P); over "k", sum_k frame_k values_k (M, d, P).  numpy's einsum
    (one pass; the loop's sums, in its order: the same values bit for bit) on numpy arrays, a loop of broadcast
    products on torch tensors (torch.einsum forms a batched matrix product over the points, 50 times slower at
    lmax 32).  At lmax 32 with 16 members the loop took 400 us, the einsum 195."""
    if isinstance(values, np.ndarray):
        return np.einsum("mkcp,mcp->mkp" if over == "c" else "mkcp,mkp->mcp", frame, values)
    axis = 2 if over == "c" else 1
    total = None
    for index in range(frame.shape[axis]):
        term = frame.select(axis, index) * values[:, None, index] if over == "c" else (
            frame.select(axis, index) * values[:, index:index + 1])
        total = term if total is None else total + term
    return total


def softmax_rules(xp, u, Z, rho, squared_length, scale=None):
    """scale u / Z for the frame components u = <V^T e_k, N> (M, K, P) of the softmax's numerator (or, with the
    members' `scale` a_m (M,), those of N where V_m = a_m I) and Z (M, P), written over u, with model.softmax_mean's
    rules: where |rho| <= NEGLIGIBLE_DENSITY max |rho| (the member's), divided by max(|m|, 1), |m| = |N| / Z (|N|^2
    = squared_length(), called only where the rules apply), and 0 where Z <= 0; NaN where Z <= 0 elsewhere.  In numpy
    the rules are skipped when the smallest Z and rho say that no point needs them (a NaN fails these tests too)."""
    inverse = 1 / (Z if xp is np and Z.min() > 0 else xp.where(Z > 0, Z, xp.nan))
    # rho above the threshold everywhere is positive, |rho| = rho: no temporary |rho| in the common case
    rules = xp is not np or not (rho.min(-1) > NEGLIGIBLE_DENSITY * rho.max(-1)).all()
    if rules:
        magnitude = abs(rho)
        void = magnitude <= NEGLIGIBLE_DENSITY * amax(magnitude, -1)
        length = squared_length() ** 0.5 * inverse  # before u is written over: it may be N's
    u *= (inverse if scale is None else scale[:, None] * inverse)[:, None]
    if not rules:
        return u
    bounded = xp.nan_to_num(u / clamp_min(length, 1.0)[:, None], nan=0.0)
    return xp.where(void[:, None], bounded, u)


def largest_speed(v: torch.Tensor) -> torch.Tensor:
    """max over the grid of |v| (M,) for a velocity's frame components v (M, k, *grid), in float64: the frame is
    orthonormal, so |v|^2 = sum_k v_k^2, which in float32 overflows from |v| ~ 1.8e19 on, where |v| does not (a
    step's failure then said nothing of the time step)."""
    return torch.sqrt((v.double() ** 2).sum(1).flatten(1).amax(-1))


class Transport:
    """rate(state, drive) = -div(rho v[rho]) and its transpose for the members of `batch` (module docstring);
    `path` forces a path ("matrix", "fourier" or "grid"; ValueError where the case has no such path; a forced matrix
    path whose matrices exceed `matrix_bytes` falls back to the cheapest other path, as the chosen one does).

    `drive = feed_forward(W)` carries the feed-forward term of the layer (and, on the matrix path, whatever
    else is fixed over an interval) in the layout the path wants; `feed_forward_adjoint` maps its cotangent
    back to W_bar (M, d, d).  `namespace` is the array library a step runs in (numpy on the CPU's fourier path,
    torch elsewhere; solvers.forward_problem.ForwardProblem.step); the tests set it to run either program.
    """

    def __init__(self, basis, batch: ModelBatch, kernels, matrix_bytes: int = MATRIX_BYTES, path: str | None = None):
        self.basis, self.batch, self.kernels = basis, batch, kernels
        d, points = basis.dim, basis.grid_size
        self.grid_shape, self.coefficient_shape = basis.grid_shape, tuple(basis.degree.shape)
        self.points = basis.points.reshape(points, d)
        self.frame = basis.frame.reshape(d - 1, points, d)  # e_k(x_p): (K, P, d)
        # a_k(x) = sum_ij W_ij e_k,i(x) x_j: the feed-forward term is linear in W, one product with this (K P, d d).
        self._feed_forward = (self.frame[..., :, None] * self.points[:, None, :]).reshape((d - 1) * points, d * d)
        self._frame_V = torch.einsum("kpi,mij->mkpj", self.frame, batch.V)  # (e_k^T V)_j: (M, K, P, d)
        # (M, K, d, P) for `_softmax_components`, one member's where all share V (read once, not M times)
        shared_V = bool((batch.V == batch.V[:1]).all())
        self._frame_V_first = (self._frame_V[:1] if shared_V else self._frame_V).permute(0, 1, 3, 2).contiguous()
        self._operator = self._fixed = self._folded = fourier = None
        # The fourier path's array library (base.arrays): numpy on the CPU, its per-operation cost about 0.4 of
        # torch's (benchmarks/floors.py lean_fourier_step); torch elsewhere.
        fourier_namespace = np if basis.placement.device.type == "cpu" else torch
        if batch.zero_temperature:
            self._fixed = self._frame_components(zero_temperature_mean(batch.B, self.points))
            options = {("zero temperature", "grid"): self._grid_cost(0), ("zero temperature", "matrix"): None}
        else:
            self._operator = attention_operator(basis, batch, kernels)
            transform = sum(kernel.cost(basis.dim + 1) for kernel in kernels.kernels) / 2 / len(kernels.kernels)
            options = {("transform", "grid"): self._grid_cost(transform)}
            if self._operator is not None:
                options[("operator", "grid")] = self._grid_cost(self._operator.multiply_adds())
                options[("operator", "matrix")] = None
            if d == 2 and batch.kernel == "unnormalized":
                fourier = FourierPath.build(self)  # also beyond the operator's memory, from a coarser basis
                if fourier is not None:
                    options[("operator", "fourier")] = self._fourier_cost(
                        fourier.rank, NUMPY_OPERATION_COST if fourier_namespace is np else OPERATION_COST)
        for attention_mode, option in list(options):
            if option == "matrix":
                rows = 0 if attention_mode == "zero temperature" else (
                    d - 1 if batch.kernel == "unnormalized" else 1 + d)
                options[(attention_mode, option)] = self._matrix_cost(rows)
        allowed = [key for key in options if path is None or key[1] == path]
        if not allowed:
            raise ValueError(f"Transport: no {path!r} path here (the options are {sorted({k[1] for k in options})})")
        self.attention_mode, self.path = min(allowed, key=options.get)
        if self.path == "matrix":
            self._folded = MatrixPath.build(self, matrix_bytes)
            if self._folded is None:  # beyond matrix_bytes
                fallback = [key for key in allowed if key[1] != "matrix"] or [key for key in options
                                                                              if key[1] == "grid"]
                self.attention_mode, self.path = min(fallback, key=options.get)
        # the estimated multiply-adds of one evaluation on the path taken (`auto_fields` compares fields by it)
        self.cost = options[(self.attention_mode, self.path)]
        if self.path == "fourier":
            self._folded = fourier
        # The array library a step runs in (solvers.forward_problem.ForwardProblem.step).
        self.namespace = fourier_namespace if self.path == "fourier" else torch
        if self.attention_mode == "transform":
            self._operator = None
        # On the grid path the spectral field can give rho and its channels' transforms in one pass from the
        # coefficients (MemberKernels.density_fields), without the channels' analysis.
        self._from_density = self.path == "grid" and self.attention_mode == "transform" and kernels.from_density
        # a_m (M,) where every V_m = a_m I and the rate can take N on the frame (`_frame_velocity`), else None: the
        # frame keeps the density's orders only where V commutes with the rotations about the axis
        self._frame_scale = None
        if self._from_density and kernels.frame_from_density:
            scale = batch.V[:, 0, 0]
            if bool((batch.V == scale[:, None, None] * torch.eye(d, dtype=batch.V.dtype, device=batch.V.device)).all()):
                self._frame_scale = scale

    def _grid_cost(self, attention: float) -> float:
        """Estimated multiply-adds of one evaluation on the grid path: per member the transforms (an FFT 4 n log2 n,
        a Legendre sum 2 (lmax + 1)^2 nlat per field, five fields: the synthesis and the vector divergence's four;
        twice their arithmetic, for the copies and layout changes around them) and the attention's, plus
        OPERATION_COST for each of its operations (`_operations`): an evaluation's 20 on S^1 (23 torch dispatches
        with the unnormalized operator; 46 us at lmax 16) and 55 on S^2, where the transforms' numpy and ducc0 calls
        escape a count of dispatches: an evaluation at lmax 6, its arithmetic negligible, took 200 us with either
        kernel."""
        basis = self.basis
        fourier = 4 * basis.grid_size * math.log2(basis.grid_shape[-1])
        transforms = 3 * fourier if basis.dim == 2 else 10 * (basis.lmax + 1) ** 2 * basis.grid_shape[0] + 3 * fourier
        operations = self._operations(20 if basis.dim == 2 else 55)
        return self.batch.members * (transforms + attention) + operations * OPERATION_COST

    def _matrix_cost(self, rows: int) -> float:
        """Estimated multiply-adds of one evaluation on the matrix path (`rows` grid fields besides rho): its two
        matrices (the rows, one per distinct operator, and the divergence) read once at MATRIX_BYTE_COST a byte
        (CACHED_MATRIX_BYTE_COST where they fit the cache), their multiply-adds for every member at GEMM_COST, and
        OPERATION_COST for each of its operations (`_operations`), counted as torch dispatches of one evaluation:
        4 on S^1 with one unnormalized operator (MatrixPath.rate_token), 9 with the unnormalized kernel or the fixed
        attention elsewhere.  The reading dominates on S^2: at one member the product runs at a third of the
        reference rate (softmax at lmax 12: 14 MiB, 0.6 ms of the 0.9 ms of an evaluation), so that the spectral
        field's grid path, though more arithmetic, is the cheaper from lmax 8 on (softmax), 10 (unnormalized) on a
        Zen 1 EPYC, 2-4 degrees later on a Zen 3 (`auto_fields`)."""
        points, frame_count = self.basis.grid_size, self.basis.dim - 1
        size = 2 * math.prod(self.coefficient_shape)
        distinct = 1 if self._operator is None else self._operator.matrix.shape[0]
        matrix_bytes = (distinct * (1 + rows) * points + frame_count * points) * size * self.points.element_size()
        reading = matrix_bytes * (CACHED_MATRIX_BYTE_COST if matrix_bytes <= CACHED_MATRIX_BYTES else MATRIX_BYTE_COST)
        arithmetic = self.batch.members * ((1 + rows) * points * size + size * frame_count * points) * GEMM_COST
        single_frame = self.basis.dim == 2 and distinct == 1 and self.batch.kernel == "unnormalized" and rows
        return reading + arithmetic + self._operations(4 if single_frame else 9) * OPERATION_COST

    def _operations(self, evaluation: int) -> int:
        """The tensor operations a stage of a step costs on a torch path (grid, matrix) whose evaluation takes
        `evaluation` of them for the unnormalized kernel: plus 10 for the softmax mean's components
        (`_softmax_components`, in numpy on the CPU: 17 dispatches on the matrix path against 4-9; an S^1
        evaluation 42 us against 7) where the kernel is softmax, and the 5 of the step's own combination of the
        stages (solvers.forward_problem: 30 dispatches in a six-stage step besides its evaluations).  The fourier
        path's numpy step counts its own (`_fourier_cost`)."""
        softmax = 10 if self.batch.kernel == "softmax" and not self.batch.zero_temperature else 0
        return evaluation + softmax + 5

    def _fourier_cost(self, rank: int, operation: float) -> float:
        """Estimated multiply-adds of one evaluation on the fourier path: per member two FFTs (4 n log2 n each) and
        the rank-r attention r (N + P) (a member's marginal cost at lmax 64 in numpy measured 2.3 us a stage, against
        2.2 so estimated), plus `operation` for each of about 12 operations (the step's combination of the stages
        included, the FFTs' own fixed cost counted as more than one).  In torch (OPERATION_COST) the path's step
        costs more than the matrix path's at one member on small grids; in numpy on the CPU (NUMPY_OPERATION_COST)
        it wins from one member on, by 1.2-2x at lmax 64-256 (benchmarks/ensembles.py --fields)."""
        points = self.basis.grid_size
        fourier = 4 * points * math.log2(points)
        return self.batch.members * (2 * fourier + rank * (2 * math.prod(self.coefficient_shape) + points)) \
            + 12 * operation

    def select(self, members: list) -> "Transport":
        """The transport of the members at the indices `members` (a list), sharing the rest."""
        chosen = copy.copy(self)
        index = torch.as_tensor(members, device=self.points.device)
        chosen.batch, chosen.kernels = self.batch.select(members), self.kernels.select(members)
        chosen._frame_V = self._frame_V.index_select(0, index)
        if self._frame_V_first.shape[0] > 1:
            chosen._frame_V_first = self._frame_V_first.index_select(0, index)
        chosen._fixed = None if self._fixed is None else self._fixed.index_select(0, index)
        chosen._frame_scale = None if self._frame_scale is None else self._frame_scale.index_select(0, index)
        chosen._operator = None if self._operator is None else self._operator.select(index)
        chosen._folded = None if self._folded is None else self._folded.select(chosen, index)
        return chosen

    # --- the feed-forward term ---------------------------------------------------------------------

    def feed_forward(self, W: torch.Tensor) -> torch.Tensor:
        """The drive of the rate for the members' matrices W (M, d, d): a_k(x) = <e_k(x), W_m x> (M, K, P) plus the
        fixed zero-temperature attention on the grid path; the matrix path's layout (MatrixPath.drive)."""
        members = W.shape[0]
        a = (W.reshape(members, -1) @ self._feed_forward.T).reshape(members, -1, self.points.shape[0])
        if self._folded is not None:
            return self._folded.drive(a)
        return a if self._fixed is None else a + self._fixed

    def feed_forward_adjoint(self, drive_bar: torch.Tensor) -> torch.Tensor:
        """W_bar (M, d, d) from the cotangent of `feed_forward`'s drive."""
        members, d = drive_bar.shape[0], self.points.shape[1]
        if self._folded is not None:
            drive_bar = self._folded.drive_part(drive_bar)
        return (drive_bar.reshape(members, -1) @ self._feed_forward).reshape(members, d, d)

    # --- the attention term ------------------------------------------------------------------------

    def _frame_components(self, m: torch.Tensor) -> torch.Tensor:
        """u_k = <e_k, V m> (M, K, P) from ambient m (M, P, d): d multiply-adds (torch.einsum took a batched
        product over the points, 50 times slower at lmax 32)."""
        return inner(self._frame_V, m[:, None])

    def _frame_adjoint(self, u_bar: torch.Tensor) -> torch.Tensor:
        """m_bar (M, P, d): the transpose of `_frame_components`, sum_k (V^T e_k) u_bar_k, formed with the points
        last (a view of (M, d, P)); in numpy on the CPU outside autograd."""
        xp = program_namespace(u_bar)
        m_bar = frame_sum(as_namespace(self._frame_V_first, xp), as_namespace(u_bar, xp), "k")
        return as_tensor(m_bar).transpose(1, 2)

    def attention(self, rho: torch.Tensor) -> torch.Tensor:
        """u_k = <e_k, V m[rho]> (M, K, P) for grid densities rho (M, P), the zero-temperature term aside (it
        rides in the drive)."""
        if self.attention_mode == "zero temperature":
            return torch.zeros_like(self._fixed).expand(rho.shape[0], -1, -1)
        if self.attention_mode == "operator":
            return self._operator.attention(rho, self)
        scaled, log_scale = self.kernels.fields(self._channels(rho))
        return self._transform_components(scaled, log_scale, rho)

    def _transform_components(self, scaled: torch.Tensor, log_scale: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        """u_k (M, K, P) from the transformed channels `scaled` (M, c, P) of `_channels` and their log_scale."""
        if self.batch.kernel == "unnormalized":
            return self._frame_components(scaled.transpose(1, 2) * torch.exp(log_scale)[..., None])
        return self._softmax_components(scaled[:, 1:], scaled[:, 0], rho)

    def _softmax_components(self, N: torch.Tensor, Z: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        """u_k = <e_k, V m> (M, K, P) of m = model.softmax_mean(N, Z, rho) for the channels N (M, d, P), Z (M, P)
        without forming m: u_k = <V^T e_k, N> / Z and |m| = |N| / Z, so that all but the first products are on
        fields of one or K components, not d per point (the same values to round-off, with softmax_mean's rules:
        `softmax_rules`).  In numpy on the CPU outside autograd (base.arrays: a fraction of torch's cost per
        operation)."""
        xp = program_namespace(N, Z, rho)
        N, Z, rho = (as_namespace(a, xp) for a in (N, Z, rho))
        frame_V = as_namespace(self._frame_V_first, xp)
        with quiet(xp):
            return as_tensor(softmax_rules(xp, frame_sum(frame_V, N, "c"), Z, rho, lambda: (N * N).sum(1)))

    def _frame_velocity(self, state: torch.Tensor, drive: torch.Tensor, kept: bool = False) -> tuple:
        """(rho, v) of `velocity` where `_frame_scale` is a_m (V_m = a_m I), and what `_frame_velocity_adjoint` needs,
        from rho, Z and the frame components of N (MemberKernels.density_frame_fields): unnormalized, u_k = a_m <e_k,
        N> = a_m exp(log_scale) <e_k, N's scaled values> (no Z: three fields); softmax, u_k = a_m <e_k, N> / Z =
        <V^T e_k, N> / Z with the rules of `_softmax_components`, |N|^2 = <e_theta, N>^2 + <e_phi, N>^2 + <x, N>^2
        (the radial component transformed only where the rules apply: some rho negative or below their threshold).
        What the transpose needs, numpy arrays: the weights a_m exp(log_scale) (M, P) for the unnormalized kernel;
        for the softmax Z, N's frame components (M, K, P), intact only where `kept` (else u is written over them), and
        <x, N> (M, P) or None where the rules did not apply.  In numpy (the CPU outside autograd)."""
        c = complex_state(state, self.coefficient_shape)
        normalised = self.batch.kernel == "softmax"
        fields, log_scale = self.kernels.density_frame_fields(c, normaliser=normalised)
        fields = as_namespace(fields, np)
        rho, along = fields[:, 0], fields[:, 1:3]
        if not normalised:
            weight = np.exp(as_namespace(log_scale, np)) * as_namespace(self._frame_scale, np)[:, None]
            u = np.multiply(along, weight[:, None], out=along)
            return as_tensor(rho), over_first("add", as_tensor(u), drive), (weight,)
        Z = fields[:, 3]
        radial = []

        def squared_length():
            radial.append(as_namespace(self.kernels.density_frame_fields(c, radial=True)[0], np)[:, 0])
            return (along * along).sum(1) + radial[0] * radial[0]

        with quiet(np):
            u = softmax_rules(np, along.copy() if kept else along, Z, rho, squared_length,
                              as_namespace(self._frame_scale, np))
        return as_tensor(rho), over_first("add", as_tensor(u), drive), (Z, along, radial[0] if radial else None)

    def _frame_velocity_adjoint(self, rho: torch.Tensor, kept: tuple, rho_bar: torch.Tensor,
                                u_bar: torch.Tensor) -> torch.Tensor:
        """c_bar (M, *coeff): the transpose of the derivative of `_frame_velocity`'s (rho, u) at rho and what it
        `kept`, applied to rho_bar (M, P) and u_bar (M, K, P), through the frame moments' transpose
        (MemberKernels.density_frame_fields_adjoint).  Unnormalized: N's frame components' cotangent is the weight
        times u_bar (no Z).  Softmax: u_k = a_m <e_k, m> with m = model.softmax_mean(N, Z, rho), whose transpose
        (softmax_mean_adjoint: products, norms and dot products per point) holds in any orthonormal basis of each
        point's R^3, so in (e_theta, e_phi, x): m_bar = a_m sum_k u_bar_k e_k has no radial component, and neither
        has N_bar unless a void point's |m| > 1 is bounded (the radial component then enters |m|): where the rules
        did not apply, the two components along the frame alone."""
        u_bar = as_namespace(u_bar, np)
        if self.batch.kernel == "unnormalized":
            (weight,) = kept
            fields_bar = np.empty((u_bar.shape[0], 1 + u_bar.shape[1], u_bar.shape[2]), u_bar.dtype)
            fields_bar[:, 0] = as_namespace(rho_bar, np)
            np.multiply(u_bar, weight[:, None], out=fields_bar[:, 1:])
            return self.kernels.density_frame_fields_adjoint(as_tensor(fields_bar))
        Z, along, radial = kept
        m_bar = u_bar * as_namespace(self._frame_scale, np)[:, None, None]
        N = along
        if radial is not None:
            N = np.concatenate([along, radial[:, None]], axis=1)
            m_bar = np.concatenate([m_bar, np.zeros_like(radial)[:, None]], axis=1)
        N_bar, Z_bar = softmax_mean_adjoint(*(as_tensor(a) for a in (N.transpose(0, 2, 1), Z, rho.numpy(),
                                                                       m_bar.transpose(0, 2, 1))))
        N_bar = N_bar.transpose(1, 2)
        fields_bar = torch.cat([rho_bar[:, None], N_bar[:, :2], Z_bar[:, None], N_bar[:, 2:]], dim=1)
        return self.kernels.density_frame_fields_adjoint(fields_bar)

    def _channels(self, rho: torch.Tensor) -> torch.Tensor:
        """The fields of the transform attention: rho y (M, d, P) for the unnormalized kernel (N alone), (rho, rho y)
        (M, 1 + d, P) for the softmax (Z and N)."""
        moments = rho[:, None] * self.points.T
        return moments if self.batch.kernel == "unnormalized" else torch.cat([rho[:, None], moments], dim=1)

    def attention_adjoint(self, rho: torch.Tensor, u_bar: torch.Tensor) -> torch.Tensor:
        """rho_bar (M, P): the transpose of the derivative of `attention` at rho, applied to u_bar (M, K, P)."""
        if self.attention_mode == "zero temperature":
            return torch.zeros_like(rho)
        if self.attention_mode == "operator":
            return self._operator.adjoint(rho, u_bar, self)
        with torch.enable_grad():
            channels = self._channels(rho).requires_grad_(True)
            scaled, log_scale = self.kernels.fields(channels)
            scaled_bar = self._scaled_adjoint(scaled.detach(), log_scale, rho, self._frame_adjoint(u_bar))
            (channels_bar,) = torch.autograd.grad(scaled, channels, scaled_bar)
        moments_bar = (channels_bar[:, -self.points.shape[1]:] * self.points.T).sum(1)
        return moments_bar if self.batch.kernel == "unnormalized" else channels_bar[:, 0] + moments_bar

    def _scaled_adjoint(self, scaled: torch.Tensor, log_scale: torch.Tensor, rho: torch.Tensor,
                        m_bar: torch.Tensor) -> torch.Tensor:
        """The cotangent of the transformed channels `scaled` (M, c, P) of `_channels` from that of the attention
        mean, m_bar (M, P, d)."""
        if self.batch.kernel == "unnormalized":
            return (m_bar * torch.exp(log_scale)[..., None]).transpose(1, 2)
        N_bar, Z_bar = softmax_mean_adjoint(scaled[:, 1:].transpose(1, 2), scaled[:, 0], rho, m_bar)
        return torch.cat([Z_bar[:, None], N_bar.transpose(1, 2)], dim=1)

    # --- the rate and its transpose ----------------------------------------------------------------

    def velocity(self, state: torch.Tensor, drive: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rho (M, P), v (M, K, P)) of the state."""
        if self._folded is not None:
            return self._folded.velocity(state, drive)
        if self._frame_scale is not None and program_namespace(state, drive) is np:
            return self._frame_velocity(state, drive)[:2]
        if self._from_density:
            return self._density_velocity(state, drive)[:2]
        rho = self.basis.synthesis(complex_state(state, self.coefficient_shape)).reshape(state.shape[0], -1)
        return rho, drive if self.attention_mode == "zero temperature" else drive + self.attention(rho)

    def _density_velocity(self, state: torch.Tensor, drive: torch.Tensor) -> tuple:
        """(rho, v, the transformed channels of `_channels`, their log_scale) on the one-pass route
        (MemberKernels.density_fields), where `_from_density`."""
        rho, scaled, log_scale = self.kernels.density_fields(complex_state(state, self.coefficient_shape))
        channels = scaled if self.batch.kernel == "softmax" else scaled[:, 1:]  # unnormalized: rho y alone
        u = self._transform_components(channels, log_scale, rho)
        return rho, over_first("add", u, drive), channels, log_scale

    def __call__(self, state: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        """-div(rho v) (M, N)."""
        if self._folded is not None:
            return self._folded.rate(state, drive)
        rho, v = self.velocity(state, drive)
        # v is a new array (rho v written over it) but where it is the drive itself (the zero-temperature attention)
        flux = rho[:, None] * v if v is drive else over_first("multiply", v, rho[:, None])
        flux = flux.reshape(v.shape[:2] + self.grid_shape)
        return real_state(-self.basis.divergence_frame(flux))

    def vjp(self, state: torch.Tensor, drive: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(state_bar, drive_bar): the cotangents of the state and of the drive for the cotangent b (M, N) of the
        rate."""
        if self._folded is not None:
            return self._folded.vjp(state, drive, b)
        on_frame = self._frame_scale is not None and program_namespace(state, drive, b) is np
        if on_frame:
            rho, v, kept = self._frame_velocity(state, drive, kept=True)
        elif self._from_density:
            rho, v, channels, log_scale = self._density_velocity(state, drive)
        else:
            rho, v = self.velocity(state, drive)
        members = state.shape[0]
        f_bar = -self.basis.divergence_adjoint(complex_state(b, self.coefficient_shape)).reshape(v.shape)
        v_bar = rho[:, None] * f_bar
        rho_bar = (v * f_bar).sum(1)
        if on_frame:  # through the frame moments' transpose: four fields (three, unnormalized) of the channels' five
            c_bar = self._frame_velocity_adjoint(rho, kept, rho_bar, v_bar)
        elif self._from_density:  # through the moments' transpose: the transform and the synthesis at once
            channels_bar = self._scaled_adjoint(channels, log_scale, rho, self._frame_adjoint(v_bar))
            Z_bar = [] if self.batch.kernel == "softmax" else [torch.zeros_like(rho_bar)[:, None]]
            c_bar = self.kernels.density_fields_adjoint(torch.cat([rho_bar[:, None]] + Z_bar + [channels_bar], dim=1))
        else:
            c_bar = self.basis.synthesis_adjoint((rho_bar + self.attention_adjoint(rho, v_bar)).reshape(
                (members,) + self.grid_shape))
        return real_state(c_bar), v_bar

    def rate_token(self, state: torch.Tensor, drive: torch.Tensor, rows: bool = True) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
        """(the rate, a token for `vjp_token`): what the transpose needs of this evaluation, with `rows` the rows of
        the path's first product where it has them (the matrix path's (rho, v), the fourier path's (r, y): the
        transpose then skips that product), else the state."""
        if self.token_rows(rows):
            return self._folded.rate_token(state, drive)
        return self(state, drive), state

    def vjp_token(self, token: torch.Tensor, drive: torch.Tensor, b: torch.Tensor,
                  rows: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """`vjp` from the token of `rate_token` (made with the same `rows`)."""
        if self.token_rows(rows):
            return self._folded.vjp_rows(token, b)
        return self.vjp(token, drive, b)

    def token_rows(self, rows: bool) -> bool:
        """Whether `rate_token(..., rows)`'s token is rows of a product (else it is the state itself)."""
        return rows and self._folded is not None and self._folded.single_frame

    def token_size(self, rows: bool = True) -> int:
        """Numbers per member of a token of `rate_token`."""
        return 2 * self.points.shape[0] if self.token_rows(rows) else 2 * math.prod(self.coefficient_shape)

    def max_speed(self, state: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        """max over the grid of |v| (M,), in float64 (`largest_speed`)."""
        return largest_speed(self.velocity(state, drive)[1])
