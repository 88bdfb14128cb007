"""The law's float32 exponential on whole shards, bit for bit the kernels' (and
:func:`specdec_np._reference.chains.fast_expf`'s), at a fraction of the reference's cost.

The reference emulates each of the exponential's seven fused multiply-adds exactly, with
about fifteen float64 array operations apiece.  Here each runs as one float64 product and
sum (the product of two float32 values is exact in float64) rounded to float32: the
correctly rounded ``fmaf``, except where the float64 sum rounds onto a float32 midpoint
(double rounding).  Two of the seven sums are exact in float64 whatever the input (the
Cody-Waite reduction ``r = x - n ln 2``: see :func:`_block`), and the reduction's ``n =
round(x log2 e)`` is a float64 ``rint`` of an exact product.  For the other five, every
float32 ``x`` from ``-104`` to ``88`` (outside, the result is 0 or ``x`` is clamped to 88)
was computed with each sum checked for a midpoint and the flagged entries recomputed by
the reference, and without: the two agree bit for bit, so no double rounding changes a
result (``benchmarks/results/2026-12-07-sharded/exponential_sweep.py`` repeats the sweep;
the entries it flags are sums that lie exactly on a midpoint and round to even
correctly).  Work runs in blocks that stay in cache.
"""

from __future__ import annotations

import threading

import numpy as np

from specdec_np._reference import chains as _reference

__all__ = ["expf"]

_C = {name: np.float64(value) for name, value in _reference._EXP_CONSTANTS.items()}
_LOWEST = np.float32(_reference._EXP_LOWEST)
_HIGHEST = np.float32(_reference._EXP_HIGHEST)
#: Entries per block (fewer blocks cost more calls; larger ones leave the cache).
BLOCK = 1 << 16


class _Work:
    """Working arrays for one block (reused from block to block)."""

    def __init__(self, size: int) -> None:
        self.n = np.empty(size)
        self.t = np.empty(size)
        self.r = np.empty(size)
        self.q = np.empty(size)
        self.single = np.empty(size, dtype=np.float32)
        self.flags = np.empty(size, dtype=bool)
        self.exponent = np.empty(size, dtype=np.int32)
        self.half = np.empty(size, dtype=np.int32)


_KEPT = threading.local()


def _work(size: int) -> _Work:
    """This thread's working arrays, at least ``size`` long (kept from call to call: the
    ranks of :func:`~specdec_np.sharded.run_local` are threads of one process)."""
    work = getattr(_KEPT, "work", None)
    if work is None or work.n.size < size:
        work = _KEPT.work = _Work(size)
    return work


def expf(x: np.ndarray) -> np.ndarray:
    """``exp(x)`` by the law's float32 exponential, bit for bit the reference's.

    Parameters
    ----------
    x : float32 array, any shape

    Returns
    -------
    float32 array, ``x``'s shape
        0 where ``x < -104``, ``x == -inf`` or ``x`` is NaN; ``x > 88`` is clamped to 88.

    Examples
    --------
    >>> import numpy as np
    >>> from vectorised_expf import expf
    >>> expf(np.array([0.0, -1.0, -np.inf], dtype=np.float32))
    array([1.        , 0.36787945, 0.        ], dtype=float32)
    """
    values = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(values.shape, dtype=np.float32)
    if values.size:
        work = _work(min(BLOCK, values.size))
        for start in range(0, values.size, BLOCK):
            stop = min(start + BLOCK, values.size)
            _block(values[start:stop], out[start:stop], work)
    return out.reshape(np.shape(x))


def _round(work: _Work, size: int, t: np.ndarray, result: np.ndarray) -> None:
    """``result = float32(t)``, held in float64."""
    single = work.single[:size]
    np.copyto(single, t, casting="same_kind")
    np.copyto(result, single)


def _fma(work: _Work, size: int, a: np.ndarray, b: np.ndarray | np.float64,
         c: np.ndarray | np.float64, result: np.ndarray) -> None:
    """``result = fmaf(a, b, c)`` (float32 values held in float64)."""
    t = work.t[:size]
    np.multiply(a, b, out=t)
    np.add(t, c, out=t)
    _round(work, size, t, result)


def _block(x: np.ndarray, out: np.ndarray, work: _Work) -> None:
    size = x.size
    n, t, r, q = work.n[:size], work.t[:size], work.r[:size], work.q[:size]
    keep = work.flags[:size]
    np.greater_equal(x, _LOWEST, out=keep)  # False for NaN and -inf
    dropped = not keep.all()
    if dropped:
        dropped_at = np.flatnonzero(~keep)
    np.minimum(x, _HIGHEST, out=out)
    if dropped:
        out[dropped_at] = _LOWEST
    np.copyto(q, out)  # x, clamped, in float64
    # n = fmaf(x, log2 e, 1.5 2^23) - 1.5 2^23: the nearest integer to the exact product
    # x log2 e, ties to even (1.5 2^23 is even and the sum lies where float32 steps by 1).
    np.multiply(q, _C["log2_e"], out=n)
    np.rint(n, out=n)
    # r = fmaf(n, -ln2_high, x): exact in float64.  n = 0 gives x itself; otherwise
    # |x| > 0.34, so x is a multiple of 2^-25, n ln2_high one of 2^-9, and the sum, below
    # 2^8, spans at most 33 bits.
    np.multiply(n, _C["minus_ln2_high"], out=t)
    np.add(t, q, out=t)
    _round(work, size, t, r)
    # r = fmaf(n, -ln2_low, r): exact in float64 too.  The first r is 0 (the sum is the
    # 32-bit product n ln2_low) or at least 2^-25 in size, a multiple of 2^-48, with
    # n ln2_low a multiple of 2^-36 and the sum below 2^-1: at most 47 bits.
    np.multiply(n, _C["minus_ln2_low"], out=t)
    np.add(t, r, out=t)
    _round(work, size, t, r)
    _fma(work, size, r, _C["q4"], _C["q3"], q)
    _fma(work, size, q, r, _C["q2"], q)
    _fma(work, size, q, r, _C["q1"], q)
    _fma(work, size, q, r, _C["q0"], q)
    # fmaf(r * r, q, r), r * r rounded to float32 (the exact float64 product, rounded once).
    square = t
    np.multiply(r, r, out=square)
    _round(work, size, square, square)
    np.multiply(square, q, out=q)  # exact: two float32 values
    np.add(q, r, out=t)
    single = work.single[:size]
    np.copyto(single, t, casting="same_kind")
    single += np.float32(1.0)
    # 2^n as two exact powers of two (floor(n / 2) and the rest), so that a subnormal
    # result rounds once.
    exponent, half = work.exponent[:size], work.half[:size]
    np.copyto(exponent, n, casting="unsafe")
    np.right_shift(exponent, 1, out=half)
    np.subtract(exponent, half, out=exponent)
    half += 127
    half <<= 23
    np.multiply(single, half.view(np.float32), out=out)
    exponent += 127
    exponent <<= 23
    np.multiply(out, exponent.view(np.float32), out=out)
    if dropped:
        out[dropped_at] = 0.0
