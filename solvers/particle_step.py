"""The particle step of solvers.particles.Integrator with the direct dense attention (ParticleField.is_direct), written
as one array program over all systems, and its exact transpose (the discrete adjoint of the step).

Layout.  The M members' tokens x (M, n, d), R replica systems each, are the rows X (S, d, p) of S = M R systems of
p = n / R tokens, the d components as rows; per system the coupling C = beta B, V, eps, and W of its member.

The program is written once for numpy arrays and for torch tensors (the operators, matmul, exp, cos, sin, where,
concatenate and ones_like that both name alike): numpy on the CPU, torch elsewhere and under autograd (the tests
differentiate this very program).  Why numpy on the CPU, measured on one core at S = 20, p = 64, d = 2: the
(S, c, p) x (S, p, p) products 13-31 us against torch's batched matmul 34-180, and an op on (S, d, p) arrays 1-5 us
against 2-12.  The kernel's exp is numpy's where numpy runs its AVX-512 loop (77 us against torch's 194, within 0.70
ulp, torch's 0.52), else torch's over the same memory (569 us against 241 on an AVX2 core: base.arrays.exp_).

One field evaluation v = P_x(W x + V m) at the stage points X, per system (k_ij = exp(<x_i, C x_j> - s_i),
Z_i = sum_j k_ij, the shift s_i = 0 or, for the softmax beyond the unshifted kernel's exponent range, the row's largest
logit: kernel_products):

    w = C^T X (w_i = C^T x_i),   y = C X,   k = exp(w^T X - s),
    m_i = sum_j k_ij x_j / Z_i (softmax)  or  (1/p) sum_j k_ij x_j (unnormalized),

the sums as the rows [1 (softmax); X] k^T.  Its transpose for a cotangent vbar (the projection and the drift as in
solvers/particle_adjoint.py): with ubar = P_x vbar, mbar = V^T ubar, a_i = mbar_i / Z_i or mbar_i / p,
c_i = <a_i, m_i> (softmax; else 0) and G_ij = k_ij (<a_i, x_j> - c_i),

    xbar_j += sum_i k_ij a_i + sum_i G_ij w_i + sum_i G_ji y_i  (the last from x_j in <x_j, C x_i>),

and the two G sums never form G: with the d^2 rows Q_(b,a) = x_b y_a and R_(b,a) = a_b w_a,

    sum_j G_ij y_aj = sum_b a_bi [Q k^T]_(b,a)i - c_i [y k^T]_ai,
    sum_i G_ij w_ai = sum_b x_bj [R k]_(b,a)j - [(c w) k]_aj,

so a stage's transpose reads k twice, in two products: [1; X; Q; y] k^T (taken with the forward sums when the stage
is formed again) and [a; R; c w] k; the (S, p, p) arrays are k alone.  Each term pairs k_ij, or a sum over row i of
it, with a_i = mbar_i / Z_i: the softmax's transpose reads k_ij / Z_i alone, in which a row's shift cancels.  The
exponentials are those of the forward step: 2 p^2 per system and Heun step, 4 p^2 with the backward pass's
recomputation (the kernels are not stored: at the seed's scale, 20 members, 8000 steps, they would take 10 GB).
"""

import numpy as np
import torch

from spherepde.base.arrays import einsum, exp_, program_namespace
from spherepde.discretisation.timesteppers import EXPLICIT_TABLEAUX
from spherepde.kernels.dense import exponent_floor


def noise_variance(eps, tau: float, dim: int):
    """sigma^2 = 2 eps tau (1 - (d - 2) eps tau / 3): the geodesic Gaussian step of weak order 2 (eps a number or
    an array of the members' eps)."""
    return 2 * eps * tau * (1 - (dim - 2) * eps * tau / 3)


def noise_time(h: float, k: int, steps: int) -> float:
    """tau of the noise step that ends step k of `steps`: the merged half steps h, a half step at the end."""
    return h if k < steps - 1 else h / 2


def rows_of(xp, points: torch.Tensor):
    """The systems' points (S, p, d) as rows (S, d, p); contiguous numpy for numpy (its products of strided rows
    take twice as long)."""
    rows = points.transpose(1, 2)
    return np.ascontiguousarray(rows.numpy()) if xp is np else rows


def tensor_of(xp, array) -> torch.Tensor:
    """An array of the program as a torch tensor (numpy's copied to contiguous memory)."""
    return torch.from_numpy(np.ascontiguousarray(array)) if xp is np else array


def inner(a, b):
    """<a, b> over the component rows, kept as a row: (S, 1, p)."""
    return einsum("sdp,sdp->sp", a, b)[:, None]


def outer(a, b):
    """The d^2 rows a_b b_a, (b, a) flattened: (S, d^2, p)."""
    S, d, p = a.shape
    return (a[:, :, None, :] * b[:, None, :, :]).reshape(S, d * d, p)


def contract(rows, a):
    """sum_b a_b rows_(b, a) for d^2 rows (b, a): (S, d, p)."""
    S, d, p = a.shape
    return einsum("sbap,sbp->sap", rows.reshape(S, d, d, p), a)


def normalise(Y):
    return Y / (inner(Y, Y) ** 0.5)


def normalise_transpose(Y, zbar, z=None, length=None):
    """ybar of z = Y / |Y|: (zbar - <zbar, z> z) / |Y| (z and |Y| where the caller kept them)."""
    if length is None:
        length = inner(Y, Y) ** 0.5
        z = Y / length
    return (zbar - inner(zbar, z) * z) / length


def projection(X, Y):
    """P_x(y) = y - <y, x> x."""
    return Y - inner(Y, X) * X


def projection_point_transpose(X, Y, vbar):
    """xbar of v = P_x(y) = y - <y, x> x, y fixed: -<y, x> vbar - <vbar, x> y."""
    return -inner(Y, X) * vbar - inner(vbar, X) * Y


def exponential_map(xp, X, T):
    """exp_x(t) = normalise(cos|t| x + sin|t| t / |t|) (x where t = 0)."""
    length = inner(T, T) ** 0.5
    return normalise(xp.cos(length) * X + xp.sin(length) * (T / xp.where(length > 0, length, 1.0)))


def exponential_map_transpose(xp, X, T, outbar):
    """(xbar, tbar) of exp_x(t), w = cos|t| x + sin|t| e, e = t / |t|: xbar = cos|t| wbar,
    tbar = sin|t| (wbar - <wbar, e> e) / |t| + (cos|t| <wbar, e> - sin|t| <wbar, x>) e."""
    length = inner(T, T) ** 0.5
    safe = xp.where(length > 0, length, 1.0)
    direction = T / safe
    cos, sin = xp.cos(length), xp.sin(length)
    wbar = normalise_transpose(cos * X + sin * direction, outbar)
    along = inner(wbar, direction)
    lbar = cos * along - sin * inner(wbar, X)
    return cos * wbar, sin * (wbar - along * direction) / safe + lbar * direction


# A stage that does not keep its kernel forms it in blocks of query rows of at most this many bytes a system, which
# stay in the core's cache: the whole (p, p) kernel of a large system does not (one core, float64, a Heun step of
# 2000 tokens on S^2: 17 ms whole, 9.8 ms in blocks, 1.5x the arithmetic floor; benchmarks/particle_step.py).
KERNEL_BLOCK_BYTES = 2 ** 18


def kernel_products(xp, X, w, rows, shifted: bool):
    """(k, rows k^T) per system for w = C^T X: the kernel k_ij = exp(<x_i, C x_j> - s_i) = exp(<w_i, x_j> - s_i)
    (S, p, p) formed whole, and the sums of the (S, c, p) `rows` against it.  s_i = 0, or where `shifted` the
    row's largest logit max_j <w_i, x_j> (the softmax's, beyond the exponent range of the unshifted kernel:
    particle_field.within_direct_range): no entry then exceeds 1 and Z_i >= 1 at any beta, and the softmax's
    ratios k_ij / Z_i, all that the step and its transpose read, are the unshifted kernel's."""
    L = w.swapaxes(1, 2) @ X
    if shifted:
        # The exponents are floored (kernels.dense.exponent_floor) so that every entry is a normal number: numpy's
        # exp of an exponent below -708 (most of a kernel at beta = 1000) takes a slow path, 15 times the cost of
        # the others.  The floor adds at most 1e-306 (float32: 1e-36) per entry to Z_i >= 1.
        floor = exponent_floor(torch.float32 if X.itemsize == 4 else torch.float64)
        if xp is np:
            L -= L.max(axis=2, keepdims=True)
            np.maximum(L, floor, out=L)
        else:  # the shift detached: the ratios do not depend on it
            L = (L - L.detach().amax(2, keepdim=True)).clamp(min=floor)
    k = exp_(L) if xp is np else torch.exp(L)
    return k, rows @ k.swapaxes(1, 2)


def kernel_sums(xp, X, w, rows, shifted: bool):
    """rows k^T of `kernel_products` without keeping k: on the CPU formed KERNEL_BLOCK_BYTES of query rows at a
    time per system (the blocks depend on p alone: a member's sums are the same in any batch; a row's shift is its
    own, whatever block holds it)."""
    p = X.shape[2]
    block = KERNEL_BLOCK_BYTES // (p * X.itemsize) if xp is np else p
    if block >= p:
        return kernel_products(xp, X, w, rows, shifted)[1]
    block = max(1, block)
    return xp.concatenate([kernel_products(xp, X, w[:, :, start:start + block], rows, shifted)[1]
                           for start in range(0, p, block)], axis=2)


def direct_mean(xp, X, Ct, softmax: bool, shifted: bool):
    """The attention mean m (S, d, p) at the rows X: sum_j k_ij x_j / Z_i (softmax; the kernel `shifted` or not,
    kernel_products) or (1/p) sum_j k_ij x_j."""
    w = Ct @ X
    if softmax:
        sums = kernel_sums(xp, X, w, xp.concatenate([xp.ones_like(X[:, :1]), X], axis=1), shifted)
        return sums[:, 1:] / sums[:, :1]
    return kernel_sums(xp, X, w, X, False) / X.shape[2]


class Layer:
    """The systems' matrices of one layer (W (S, d, d) per system), stacked so that a stage takes one product with
    its rows where it needs two or three: `forward` [C^T; W] (w = C^T X and W X), `kept` [C^T; W; C] (y = C X too,
    for the transpose), `backward` [W^T; V'^T] (W^T ubar and V'^T ubar; V' = V for the softmax, V / p else)."""

    def __init__(self, program, xp, W):
        arrays = program.arrays[xp]
        self.W = W
        self.forward = xp.concatenate([arrays["Ct"], W], axis=1)
        self.kept = xp.concatenate([arrays["Ct"], W, arrays["C"]], axis=1)
        self.backward = xp.concatenate([W.swapaxes(1, 2), arrays["Vt" if program.softmax else "Vpt"]], axis=1)


class Stage:
    """One field evaluation v = P_x(W x + V m(x)) at rows X (S, d, p) with the matrices of `layer` (a Layer); with
    `keep`, also what its transpose reads.  For the unnormalized kernel V m = (V / p) [X k^T] (arrays "Vp")."""

    def __init__(self, program, xp, X, layer, keep: bool):
        arrays, softmax, d = program.arrays[xp], program.softmax, X.shape[1]
        self.xp, self.X, self.layer, self.softmax = xp, X, layer, softmax
        left = (layer.kept if keep else layer.forward) @ X
        self.w = left[:, :d]
        rows = ([xp.ones_like(X[:, :1])] if softmax else []) + [X]
        if keep:
            y = left[:, 2 * d:]
            rows += [outer(X, y), y] if softmax else [outer(X, y)]
        rows = xp.concatenate(rows, axis=1) if len(rows) > 1 else X
        if keep:
            self.k, products = kernel_products(xp, X, self.w, rows, program.shifted)
        else:
            products = kernel_sums(xp, X, self.w, rows, program.shifted)
        if softmax:
            self.Z = products[:, :1]
            self.m = products[:, 1:1 + d] / self.Z
            self.u = left[:, d:2 * d] + arrays["V"] @ self.m
            self.products = products[:, 1 + d:]
        else:
            self.u = left[:, d:2 * d] + arrays["Vp"] @ products[:, :d]
            self.products = products[:, d:]
        self.along = inner(self.u, X)
        self.v = self.u - self.along * X

    def transpose(self, vbar):
        """(xbar (S, d, p), Wbar (S, d, d)) of this evaluation for the cotangent vbar (S, d, p)."""
        X, d = self.X, self.X.shape[1]
        along = inner(vbar, X)
        ubar = vbar - along * X
        right = self.layer.backward @ ubar
        xbar = right[:, :d] - self.along * vbar - along * self.u
        Wbar = ubar @ X.swapaxes(1, 2)
        if self.softmax:
            a = right[:, d:] / self.Z
            c = inner(a, self.m)
            rows = [a, outer(a, self.w), c * self.w]
        else:
            a = right[:, d:]
            rows = [a, outer(a, self.w)]
        T = self.xp.concatenate(rows, axis=1) @ self.k
        xbar = xbar + T[:, :d] + contract(T[:, d:d + d * d], X) + contract(self.products[:, :d * d], a)
        if self.softmax:
            xbar = xbar - T[:, d + d * d:] - c * self.products[:, d * d:]
        return xbar, Wbar


class Flow:
    """The explicit tableau's step in R^d from X, then normalised (`out`), keeping its stages with `keep`."""

    def __init__(self, program, xp, X, layer, h: float, keep: bool):
        self.a, self.b, self.h, self.stages = program.a, program.b, h, []
        slopes = []
        for row in self.a:
            point = X
            for weight, slope in zip(row, slopes):
                if weight:
                    point = point + (h * weight) * slope
            stage = Stage(program, xp, point, layer, keep)
            if keep:
                self.stages.append(stage)
            slopes.append(stage.v)
        self.y = X
        for weight, slope in zip(self.b, slopes):
            self.y = self.y + (h * weight) * slope
        self.length = inner(self.y, self.y) ** 0.5
        self.out = self.y / self.length

    def transpose(self, outbar):
        """(xbar, Wbar) for the cotangent outbar of `out`: kbar_i = h b_i ybar + h sum_{l > i} a_li Xbar_l."""
        h = self.h
        ybar = normalise_transpose(self.y, outbar, self.out, self.length)
        slope_bars = [(h * weight) * ybar for weight in self.b]
        xbar, Wbar = ybar, 0
        for i in reversed(range(len(self.stages))):
            stage_bar, stage_Wbar = self.stages[i].transpose(slope_bars[i])
            xbar, Wbar = xbar + stage_bar, Wbar + stage_Wbar
            for j, weight in enumerate(self.a[i]):
                if weight:
                    slope_bars[j] = slope_bars[j] + (h * weight) * stage_bar
        return xbar, Wbar


class DirectStep:
    """Integrator.step (solvers/particles.py) for the direct dense attention on the rows of all systems (`advance`),
    and its transpose (`retreat`)."""

    def __init__(self, name: str, noisy: bool, field, tokens: int):
        """`tokens`: p, the tokens of a system."""
        self.name, self.noisy, self.replicas = name, noisy, field.replicas
        tableau = EXPLICIT_TABLEAUX.get(name)
        if tableau is not None:
            self.a = [[float(weight) for weight in row] for row in tableau.a]
            self.b = [float(weight) for weight in tableau.b]
        systems = field.systems
        self.softmax, self.shifted = systems.kernel == "softmax", field.shifted
        coupling, V = field.coupling, systems.V
        tensors = {"C": coupling, "Ct": coupling.transpose(-1, -2).contiguous(), "V": V,
                   "Vt": V.transpose(-1, -2).contiguous(), "Vp": V / tokens,
                   "Vpt": (V / tokens).transpose(-1, -2).contiguous(), "eps": systems.eps.reshape(-1, 1, 1)}
        self.arrays = {torch: tensors}
        if coupling.device.type == "cpu":
            self.arrays[np] = {key: value.numpy() for key, value in tensors.items()}
        self.sigmas = {}

    def rows(self, xp, x: torch.Tensor):
        """(M, n, d) -> (S, d, p) (rows_of)."""
        return rows_of(xp, x.reshape(x.shape[0] * self.replicas, -1, x.shape[-1]))

    def draw_rows(self, xp, blocks):
        """The Gaussian draws of Noise.blocks as rows (S, d, p), one by one: each chunk (size, M, n, d) made rows
        at once (one copy a chunk, not one a draw)."""
        for block in blocks:
            rows = block.reshape((block.shape[0], block.shape[1] * self.replicas, -1, block.shape[-1])).transpose(2, 3)
            yield from (np.ascontiguousarray(rows.numpy()) if xp is np else rows)

    def points(self, xp, X, like: torch.Tensor) -> torch.Tensor:
        """(S, d, p) -> (M, n, d) as a torch tensor."""
        return tensor_of(xp, X.swapaxes(1, 2).reshape(like.shape))

    def per_system(self, xp, W: torch.Tensor) -> Layer:
        """The Layer of the members' (M, d, d) matrices W, per system (S, d, d)."""
        W = W.repeat_interleave(self.replicas, 0) if self.replicas > 1 else W
        return Layer(self, xp, W.numpy() if xp is np else W)

    def sigma(self, xp, tau: float, dim: int, like):
        """sigma of a noise step of time tau for rows like `like`: (S, 1, 1) for torch, spread over the rows' shape
        for numpy (whose product with it then takes half the broadcast one's time); kept: a run takes a few tau
        only."""
        key = (xp, tau, dim, tuple(like.shape))
        if key not in self.sigmas:
            sigma = noise_variance(self.arrays[xp]["eps"], tau, dim) ** 0.5
            self.sigmas[key] = np.ascontiguousarray(np.broadcast_to(sigma, like.shape)) if xp is np else sigma
        return self.sigmas[key]

    def brownian(self, xp, X, tau: float, G):
        """The noise step exp_x(sigma P_x g)."""
        return exponential_map(xp, X, self.sigma(xp, tau, X.shape[1], X) * projection(X, G))

    def brownian_transpose(self, xp, X, tau: float, G, outbar):
        """xbar of the noise step, g fixed: the exponential map's, plus that of t = sigma P_x g through x,
        -(<g, x> sigma tbar + <sigma tbar, x> g) (projection_point_transpose, <g, x> kept from t)."""
        sigma = self.sigma(xp, tau, X.shape[1], X)
        along = inner(G, X)
        xbar, tbar = exponential_map_transpose(xp, X, sigma * (G - along * X), outbar)
        tbar = sigma * tbar
        return xbar - (along * tbar + inner(tbar, X) * G)

    def step(self, x: torch.Tensor, W: torch.Tensor, h: float, k: int, steps: int, draws) -> torch.Tensor:
        """Integrator.step(x, W, h, k, steps, draws) (solvers/particles.py): `advance` on the rows."""
        xp = program_namespace(x, W)
        rows = (self.rows(xp, g) for g in draws)
        return self.points(xp, self.advance(xp, self.rows(xp, x), self.per_system(xp, W), h, k, steps, rows), x)

    def advance(self, xp, X, layer: Layer, h: float, k: int, steps: int, draws):
        """Step k of `steps` (step h) from the rows X with the systems' W (`layer`: per_system); `draws` yields the
        step's Gaussian draws as rows."""
        if self.name == "euler":
            drift = h * Stage(self, xp, X, layer, False).v
            if not self.noisy:
                return normalise(X + drift)
            scale = self.sigma(xp, h, 2, X)  # noise_variance at d = 2 is 2 eps h: the Euler-Maruyama step
            return exponential_map(xp, X, drift + scale * projection(X, next(draws)))
        if self.noisy and k == 0:
            X = self.brownian(xp, X, h / 2, next(draws))
        X = Flow(self, xp, X, layer, h, False).out
        if self.noisy:
            X = self.brownian(xp, X, noise_time(h, k, steps), next(draws))
        return X

    def retreat(self, xp, X, layer: Layer, h: float, k: int, steps: int, draws, outbar):
        """(Xbar, Wbar per system) of advance(xp, X, layer, h, k, steps, draws) for the cotangent outbar of its result:
        the step taken again from X with the same draws, keeping its stages, then its pieces transposed from the
        last."""
        if self.name == "euler":
            stage = Stage(self, xp, X, layer, True)
            if not self.noisy:
                ybar = normalise_transpose(X + h * stage.v, outbar)
                stage_bar, Wbar = stage.transpose(h * ybar)
                return ybar + stage_bar, Wbar
            G, scale = next(draws), self.sigma(xp, h, 2, X)
            previous, tbar = exponential_map_transpose(xp, X, h * stage.v + scale * projection(X, G), outbar)
            previous = previous + projection_point_transpose(X, G, scale * tbar)
            stage_bar, Wbar = stage.transpose(h * tbar)
            return previous + stage_bar, Wbar
        if not self.noisy:
            return Flow(self, xp, X, layer, h, True).transpose(outbar)
        first = next(draws) if k == 0 else None
        start = self.brownian(xp, X, h / 2, first) if k == 0 else X
        flow = Flow(self, xp, start, layer, h, True)
        flowed_bar = self.brownian_transpose(xp, flow.out, noise_time(h, k, steps), next(draws), outbar)
        start_bar, Wbar = flow.transpose(flowed_bar)
        return (self.brownian_transpose(xp, X, h / 2, first, start_bar) if k == 0 else start_bar), Wbar

    def member_sum(self, xp, Wbar) -> torch.Tensor:
        """The members' Wbar (M, d, d) from the systems' (S, d, d): the replicas' summed."""
        Wbar = Wbar.reshape((-1, self.replicas) + tuple(Wbar.shape[1:])).sum(1)
        return tensor_of(xp, Wbar)
