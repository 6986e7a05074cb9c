"""One array program over numpy and torch: the operations whose spelling differs, dispatched on the operands' kind.

A program written with these (and the operators, `@`, slicing and the functions both libraries name alike:
xp.multiply(.., out=), xp.exp) runs on numpy arrays on the CPU and on torch tensors elsewhere
(solvers/particle_step.py is the precedent).  Why numpy on the CPU: a small step is bound by the fixed cost of an
operation, not by its arithmetic; measured on one core at the seed-004 S^1 shapes, 0.4 us for an elementwise product
in numpy, 1.3 us for a small matrix product, against about 5 us for any torch operation (benchmarks/floors.py
lean_fourier_step).  Torch tensors on the CPU and numpy arrays share memory both ways (`as_namespace`, `as_tensor`:
no copies), and the torch branch of each helper is the single torch operation the torch program used.

The real FFTs of numpy rows (`rfft`, `irfft`) are ducc0's (pocketfft's successor, already the package's spherical
transforms' dependency): measured at 200 points, 2.3-4 us for one row and 5.5-7 us for 20, against numpy.fft's
4.4-5.5 and 11-14 us, most of which is numpy's Python wrapper (the same values to round-off).
"""

import contextlib
import functools

import ducc0
import numpy as np
import torch
from scipy.linalg.blas import get_blas_funcs

from spherepde.base.real_view import COMPLEX_DTYPE, NUMPY_COMPLEX, NUMPY_REAL


def namespace(a):
    """numpy for a numpy array, else torch."""
    return np if isinstance(a, np.ndarray) else torch


def program_namespace(*tensors):
    """The library a program on these torch tensors runs in: numpy for CPU tensors outside autograd (their
    operations' fixed cost is a fraction of torch's), else torch.  (Tensor.is_cpu: half the cost of comparing
    device.type, 0.4 against 0.8 us a tensor, of a check made at every evaluation of a small step.)"""
    if all(t.is_cpu for t in tensors) and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return np
    return torch


def kind(a) -> tuple:
    """(library, dtype, device) of an array: what caches of arrays made alike are keyed by."""
    return (np, a.dtype, None) if isinstance(a, np.ndarray) else (torch, a.dtype, a.device)


def as_namespace(value, xp):
    """A CPU tensor as a numpy array sharing its memory when xp is numpy; anything else (a float, a tensor for
    torch) as it is."""
    return value.numpy() if xp is np and isinstance(value, torch.Tensor) else value


def quiet(xp):
    """A context in which numpy's program warns of no overflow or invalid value, as torch's does not: a run that
    leaves the densities is the solvers' to report (solvers.eulerian.departures)."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore") if xp is np else contextlib.nullcontext()


def as_tensor(a):
    """A numpy array as a torch tensor sharing its memory; a tensor as it is."""
    return torch.from_numpy(a) if isinstance(a, np.ndarray) else a


def array_like(values: list, like):
    """A (nested) list of numbers as an array of the kind, dtype and device of `like`."""
    if isinstance(like, np.ndarray):
        return np.array(values, dtype=like.dtype)
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def zeros(like, shape: tuple):
    """Zeros of `shape` of the kind, dtype and device of `like`."""
    return np.zeros(shape, like.dtype) if isinstance(like, np.ndarray) else like.new_zeros(shape)


def empty(like, shape: tuple):
    """An uninitialised array of `shape` of the kind, dtype and device of `like`."""
    return np.empty(shape, like.dtype) if isinstance(like, np.ndarray) else like.new_empty(shape)


def empty_complex(like, shape: tuple):
    """An uninitialised complex array of `shape` of the precision and kind of `like` (real or complex)."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, NUMPY_COMPLEX.get(like.dtype, like.dtype))
    return like.new_empty(shape, dtype=like.dtype if like.is_complex() else COMPLEX_DTYPE[like.dtype])


def zero_(a):
    """a = 0 in place."""
    if isinstance(a, np.ndarray):
        a.fill(0)
    else:
        a.zero_()


def copy_(target, source):
    """target = source in place."""
    if isinstance(target, np.ndarray):
        np.copyto(target, source)
    else:
        target.copy_(source)


def clone(a):
    """A copy of a."""
    return a.copy() if isinstance(a, np.ndarray) else a.clone()


def permute(a, axes: tuple):
    """a with its axes in the order `axes` (a view)."""
    return a.transpose(axes) if isinstance(a, np.ndarray) else a.permute(axes)


def contiguous_copy(a):
    """A copy of a in C order (never a view of it)."""
    return np.array(a, order="C") if isinstance(a, np.ndarray) else a.clone(memory_format=torch.contiguous_format)


def real_pairs(c):
    """A contiguous complex array (..., n) as the real one (..., 2 n) of its (Re, Im) pairs (a view)."""
    if isinstance(c, np.ndarray):
        return c.view(NUMPY_REAL[c.dtype])
    return torch.view_as_real(c).flatten(-2)


def complex_pairs(a):
    """The inverse of `real_pairs`: a real array (..., 2 n) whose last axis is contiguous as the complex (..., n)."""
    if isinstance(a, np.ndarray):
        return a.view(NUMPY_COMPLEX[a.dtype])
    return torch.view_as_complex(a.unflatten(-1, (-1, 2)))


def matmul_into(out, a, b) -> None:
    """out = a @ b (batched over the leading axes), out a view with any strides: numpy's BLAS writes it in place
    where its rows are contiguous; torch copies its product in."""
    if isinstance(out, np.ndarray):
        np.matmul(a, b, out=out)
    else:
        out.copy_(torch.matmul(a, b))


def over_first(operation: str, a, b):
    """operation(a, b) for "add", "subtract" or "multiply" (a name both libraries give the elementwise operation),
    written over a, a new array nothing else holds: no temporary, where autograd records neither operand (else a
    new tensor).  The same values as `a + b` and the like."""
    if isinstance(a, np.ndarray):
        return getattr(np, operation)(a, b, out=a)
    if torch.is_grad_enabled() and (a.requires_grad or getattr(b, "requires_grad", False)):
        return getattr(torch, operation)(a, b)
    return getattr(torch, operation)(a, b, out=a)


# The runs of `leading_zero_runs` on the CPU: the products of the dense Legendre tables at lmax 32 with 1, 2, 4 and 8
# runs over the orders took 206, 147, 130, 141 us (the synthesis-like (33, 150, 33) one, one member) and 63, 50,
# 41, 39 us per member at 16 members, the (33, 50, 33) and (33, 33, 50) ones alike (one core, interleaved).
# Elsewhere (CUDA) a product is bound by its launches, not its arithmetic: one run.
CPU_RUNS = 4


def leading_zero_runs(table, axis: int) -> tuple:
    """Runs (start, stop, first) of consecutive matrices of a batch `table` (B, R, K), CPU_RUNS of them on the CPU
    (one elsewhere), with every matrix of a run zero before index `first` along `axis` (1: its rows, 2: its
    columns): the Legendre tables of order m vanish below degree m, so that the products over a run
    (`matmul_runs_into`) skip about a third of the dense tables' multiply-adds."""
    runs = CPU_RUNS if table.device.type == "cpu" else 1
    nonzero = (table != 0).any(3 - axis).cpu().numpy()  # (B, size along axis)
    first = np.where(nonzero.any(1), nonzero.argmax(1), nonzero.shape[1])
    bounds = np.linspace(0, len(first), runs + 1).round().astype(int)
    return tuple((int(a), int(b), int(first[a:b].min())) for a, b in zip(bounds[:-1], bounds[1:]) if b > a)


def matmul_runs_into(out, a, b, runs: tuple, axis: int) -> None:
    """out = a @ b (batched over the leading axis) for a batch of matrices a with the runs of
    `leading_zero_runs(a, axis)`: each run's product leaves out a's leading zero columns (axis 2) and the rows of b
    they meet, or a's leading zero rows (axis 1), out's rows there set to zero.  The same sums but for their
    zero terms (0 x finite adds nothing); out a view as `matmul_into`'s."""
    for start, stop, first in runs:
        if axis == 2:
            matmul_into(out[start:stop], a[start:stop, :, first:], b[start:stop, first:])
        else:
            matmul_into(out[start:stop, first:], a[start:stop, first:], b[start:stop])
            zero_(out[start:stop, :first])


# The most bytes (input and output together) one ducc0 FFT call of `irfft_into` / `rfft_into` reads and writes:
# this machine's L2 cache per core (512 KiB; blocks of 64 KiB to 1 MiB: 231, 160, 139, 127, 129 us per member at
# M = 16 below, 512 KiB the best).  The spherical transforms hand them a spectrum with the members
# innermost and a grid with the members outermost; past the cache each value then costs a cache line of its own.
# Measured on one core, the inverse FFT of the (51 orders, 5 fields, 50 rings, M members) spectrum of `moments` at
# lmax 32, per member: 28, 32, 100, 110, 123 us at M = 1, 4, 16, 32, 64 in one call; 28, 34, 49, 41, 37 us in
# blocks of at most this size.
FFT_BLOCK_BYTES = 2 ** 19


def fft_blocks(out, data, axis: int):
    """Pairs of matching views (out piece, data piece) of two numpy arrays with equal shapes off `axis`, the axes
    other than `axis` cut so that a piece holds at most FFT_BLOCK_BYTES of both (a slice of the axis being cut
    that is larger still is cut along the next).  The axis cut first is the one whose smaller stride of the two is
    the largest: a piece then reads and writes whole cache lines on both sides."""
    size = out.nbytes + data.nbytes
    axes = [k for k in range(out.ndim) if k != axis % out.ndim and out.shape[k] > 1]
    if size <= FFT_BLOCK_BYTES or not axes:
        yield out, data
        return
    cut = max(axes, key=lambda k: min(abs(out.strides[k]), abs(data.strides[k])))
    step = max(1, FFT_BLOCK_BYTES * out.shape[cut] // size)
    for start in range(0, out.shape[cut], step):
        piece = (slice(None),) * cut + (slice(start, start + step),)
        yield from fft_blocks(out[piece], data[piece], axis)


def irfft_into(out, spectrum, points: int, axis: int) -> None:
    """out = the real unnormalized inverse DFT of the half spectra along `axis` of `spectrum` (points values; the
    imaginary parts of the zero and the Nyquist frequency are not read), out a view with any strides (ducc0 writes
    it in place, in pieces of at most FFT_BLOCK_BYTES; torch copies its result in)."""
    if isinstance(out, np.ndarray):
        for out_piece, piece in fft_blocks(out, spectrum, axis):
            ducc0.fft.c2r(piece, axes=(axis,), lastsize=points, forward=False, inorm=0, out=out_piece,
                          nthreads=torch.get_num_threads())
    else:
        out.copy_(torch.fft.irfft(spectrum, n=points, dim=axis, norm="forward"))


def rfft_into(out, values, axis: int) -> None:
    """out = the unnormalized real DFT along `axis` of `values` (the half spectrum), out a view with any strides
    (ducc0 writes it in pieces of at most FFT_BLOCK_BYTES, as `irfft_into`)."""
    if isinstance(out, np.ndarray):
        for out_piece, piece in fft_blocks(out, values, axis):
            ducc0.fft.r2c(piece, axes=(axis,), forward=True, out=out_piece, nthreads=torch.get_num_threads())
    else:
        out.copy_(torch.fft.rfft(values, dim=axis))


@functools.cache
def _numpy_exp_vectorised(dtype) -> bool:
    """Whether numpy's exp of `dtype` runs its AVX-512 loop on this machine, as numpy's dispatch says
    (numpy.lib.introspect.opt_func_info; where a numpy cannot say, or runs on another architecture, numpy's exp).
    Only there is it the faster: measured on one core over the particle step's (20, 64, 64) kernel, 77 us against
    torch's 194 on an AVX-512 core, 569 us against torch's 241 on an AVX2 one (AMD EPYC, numpy 2.4, torch 2.13).
    A choice by the machine, not by a timing, so that a run is reproducible bit for bit on it."""
    try:
        from numpy.lib.introspect import opt_func_info

        targets = opt_func_info(func_name="^exp$", signature=f"^{np.dtype(dtype).name}$")
        current = next(iter(next(iter(targets.values())).values()))["current"]
    except (ImportError, StopIteration, KeyError, TypeError, ValueError):
        return True
    return not current.startswith(("X86_V3", "X86_V2", "AVX2", "FMA3", "SSE", "baseline"))


def exp_(a: np.ndarray) -> np.ndarray:
    """exp(a) in place for a numpy array (a torch program takes torch.exp, out of place under autograd): numpy's exp
    only where it runs its AVX-512 loop, else torch's over the same memory (`_numpy_exp_vectorised`)."""
    if _numpy_exp_vectorised(a.dtype):
        return np.exp(a, out=a)
    torch.from_numpy(a).exp_()
    return a


def amax(a, axis: int):
    """The largest value along `axis`, the axis kept (size 1)."""
    return a.max(axis, keepdims=True) if isinstance(a, np.ndarray) else a.amax(axis, keepdim=True)


def clamp_min(a, lower: float):
    """max(a, lower) elementwise."""
    return np.maximum(a, lower) if isinstance(a, np.ndarray) else a.clamp(min=lower)


def einsum(equation: str, *operands):
    """numpy's or torch's einsum, by the operands' kind."""
    return (np.einsum if isinstance(operands[0], np.ndarray) else torch.einsum)(equation, *operands)


def concatenate(arrays: list, axis: int):
    """The arrays joined along `axis` (numpy.concatenate or torch.cat, by the first one's kind)."""
    if isinstance(arrays[0], np.ndarray):
        return np.concatenate(arrays, axis)
    return torch.cat(arrays, dim=axis)


def addmm(c, a, b):
    """c + a @ b, batched over the leading axis where a is three-dimensional (torch.addmm or torch.baddbmm)."""
    if isinstance(c, np.ndarray):
        product = np.dot(a, b) if a.ndim == 2 else a @ b  # of two matrices np.dot: a microsecond less than matmul
        product += c
        return product
    return (torch.addmm if a.dim() == 2 else torch.baddbmm)(c, a, b)


def outer_update(target, column):
    """The function row -> (target += column @ row in place), column (k, 1), row (n,), its operands prepared once (a
    step's transpose makes the same updates of the same buffer at every step): for a C-ordered numpy target BLAS's
    rank-one update (ger) on its transpose, which numpy's `target += column * row` makes through a (k, n) temporary
    (at k = 13, n = 2600: 6.4 against 25 us)."""
    if not isinstance(target, np.ndarray):
        return lambda row: target.addmm_(column, row.reshape(1, -1))
    if target.flags.c_contiguous:
        ger, y, a = _ger(target.dtype), column.reshape(-1), target.T
        # positional (alpha, x, y, incx, incy, a, overwrite_x, overwrite_y, overwrite_a): f2py matches keywords at
        # about a microsecond a call, the half of this update
        return lambda row: ger(1.0, row, y, 1, 1, a, 1, 1, 1)

    def update(row):
        target[...] += column * row
    return update


@functools.cache
def _ger(dtype):
    """BLAS's rank-one update for numpy arrays of `dtype` (looked up once: the lookup costs about a microsecond)."""
    return get_blas_funcs("ger", dtype=dtype)


def rfft(x):
    """The unnormalized real DFT of the rows of x (M, n) -> (M, n // 2 + 1): torch.fft.rfft, or ducc0's for a numpy
    array (its arguments positional, the others ducc0's defaults (forward, no normalisation, one thread): pybind11
    matches keywords at about 1.5 us a call, a quarter of a 200-point transform)."""
    if not isinstance(x, np.ndarray):
        return torch.fft.rfft(x)
    return ducc0.fft.r2c(x, (1,))


def irfft(c, points: int):
    """The real rows (M, points) of the unnormalized inverse DFT of the half spectra c (M, K), K <= points // 2 + 1,
    zero beyond K (torch.fft.irfft(c, n=points, norm="forward"), or ducc0's for a numpy array, its arguments
    positional as `rfft`'s; the imaginary part of the zero frequency is not read).  A caller that keeps a zero-padded
    spectrum (K = points // 2 + 1) spares numpy's the padded copy."""
    if not isinstance(c, np.ndarray):
        return torch.fft.irfft(c, n=points, norm="forward")
    if c.shape[1] < points // 2 + 1:
        spectrum = np.zeros((c.shape[0], points // 2 + 1), c.dtype)
        spectrum[:, :c.shape[1]] = c
        c = spectrum
    return ducc0.fft.c2r(c, (1,), points, False)
