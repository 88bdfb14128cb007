"""Row statistics across vocabulary shards: each rank holds columns ``start .. start +
width - 1`` of every row, and only per-row numbers, short candidate lists and fixed-size
histograms cross ranks.

Here: the order-preserving integer keys of float rows and their inverse, the radix select
(the filters' fallback, :mod:`.filters`), the greedy argmax, the rounds of per-row sums,
and the inverse-CDF draw in two levels (the shard, by the shards' masses in vocabulary
order, then the token inside it): the unsharded inverse CDF, whose running sum is split at
the shards' boundaries.  A draw's rows held whole are summed and scanned by the kernels'
``shard_positive_sums`` and ``shard_first_crossings`` (NumPy's pairwise order for the
mass, column order for the scan: the bits the NumPy expressions give).

Rows handed over as CuPy arrays stay on their device: :func:`passes` gives the CUDA
kernels' passes (``specdec_np/_kernels/src/cuda/shard_passes.cu`` through
``specdec_np._kernels.cuda_shard_passes.shard_like``, the same calling convention and
orders), and only per-row numbers come back (:func:`to_host` marks each copy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import _core
from .._runtime.arrays import is_cupy_array
from .exchange import Exchange, Shard

__all__ = [
    "Draws",
    "RowSet",
    "Sparse",
    "argmax_table",
    "draw",
    "filled",
    "global_argmax",
    "key_values",
    "library",
    "ordered_keys",
    "radix_select",
    "row_totals",
    "passes",
    "shard_masses",
    "top_k_chooser",
    "top_p_chooser",
    "to_host",
]

DIGIT_BITS = 8
BUCKETS = 1 << DIGIT_BITS


def filled(shape: Any, value: Any, dtype: Any = np.float64) -> np.ndarray:
    """``np.full(shape, value, dtype)`` without its Python wrapper (a sharded call makes
    dozens of these small arrays a step)."""
    out = np.empty(shape, dtype=dtype)
    out.fill(value)
    return out


def library(array: Any) -> Any:
    """The array library of ``array``: CuPy for device rows, else NumPy."""
    if type(array) is not np.ndarray and is_cupy_array(array):
        import cupy

        return cupy
    return np


def passes(array: Any) -> Any:
    """The compiled shard passes for rows like ``array``: ``_core``'s (the CPU kernels)
    for NumPy rows, the CUDA kernels' for CuPy rows
    (``specdec_np._kernels.cuda_shard_passes.shard_like``: the same calling convention,
    the per-row numbers on the host)."""
    if type(array) is not np.ndarray and is_cupy_array(array):
        from .._kernels import cuda_shard_passes as cuda

        return cuda.shard_like
    return _core


def to_host(array: Any) -> np.ndarray:
    """``array`` as a NumPy array (a copy from the device for CuPy arrays)."""
    return array if type(array) is np.ndarray or not is_cupy_array(array) else array.get()


def ordered_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the float32 or float64 ``values`` (no NaN), ``-0``
    and ``+0`` one key, so that a cutoff on keys is a cutoff on values (the float's bits,
    negative values flipped whole and positive ones lifted by the sign bit: ``_core``'s
    ``float_keys``)."""
    values = np.asarray(values)
    if not values.flags.c_contiguous:
        values = values.copy()
    keys = np.empty(values.shape, dtype=np.uint64)
    _core.float_keys(values.reshape(-1), keys.reshape(-1))
    return keys


def key_values(keys: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The values (of ``dtype``, float32 or float64) whose :func:`ordered_keys` are
    ``keys`` (uint64; the key of ``-0`` gives ``+0``; ``_core``'s ``key_floats``)."""
    keys = np.asarray(keys, dtype=np.uint64)
    if not keys.flags.c_contiguous:
        keys = keys.copy()
    values = np.empty(keys.shape, dtype=np.float32 if np.dtype(dtype) == np.float32
                      else np.float64)
    _core.key_floats(keys.reshape(-1), values.reshape(-1))
    return values


def radix_select(
    exchange: Exchange,
    keys: np.ndarray,
    key_bits: int,
    amounts: np.ndarray | None,
    choose: Callable[[np.ndarray, int], np.ndarray],
) -> np.ndarray:
    """One key per row found digit by digit, most significant first: a round gathers each
    rank's histogram ``[rows, 256]`` of the entries that share the prefix found so far.

    Parameters
    ----------
    exchange : Exchange
    keys : uint64 [R, width]
    key_bits : int
        32 or 64.
    amounts : float64 [R, width] or None
        What a histogram bucket sums (None: it counts entries, as int32).
    choose : callable
        ``choose(histogram [R, 256], round) -> bucket [R]``, given the ranks' summed
        histogram (the same array on every rank).

    Returns
    -------
    uint64 [R]
        The selected keys.
    """
    rows = keys.shape[0]
    prefix = np.zeros(rows, dtype=np.uint64)
    row_base = (np.arange(rows, dtype=np.int64) * BUCKETS)[:, None]
    for round_index, shift in enumerate(range(key_bits - DIGIT_BITS, -1, -DIGIT_BITS)):
        digit = ((keys >> np.uint64(shift)) & np.uint64(BUCKETS - 1)).astype(np.int64)
        if round_index == 0:
            inside = np.ones(keys.shape, dtype=bool)
        else:
            inside = (keys >> np.uint64(shift + DIGIT_BITS)) == prefix[:, None]
        index = np.broadcast_to(row_base, keys.shape)[inside] + digit[inside]
        if amounts is None:
            local = np.bincount(index, minlength=rows * BUCKETS).astype(np.int32)
        else:
            local = np.bincount(
                index, weights=amounts[inside], minlength=rows * BUCKETS
            ).astype(np.float64)  # bincount of no entries is int64
        histogram = exchange.gather(local.reshape(rows, BUCKETS)).sum(axis=0)
        bucket = choose(histogram, round_index).astype(np.uint64)
        prefix = (prefix << np.uint64(DIGIT_BITS)) | bucket
    return prefix


def top_k_chooser(k: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
    """The bucket of the ``k``-th largest key: counts from the top bucket down."""
    remaining = k.astype(np.int64).copy()

    def choose(histogram: np.ndarray, round_index: int) -> np.ndarray:
        descending = histogram[:, ::-1].astype(np.int64)
        cumulative = descending.cumsum(axis=1)
        j = (cumulative >= remaining[:, None]).argmax(axis=1)
        rows = np.arange(histogram.shape[0])
        remaining[:] -= cumulative[rows, j] - descending[rows, j]
        return BUCKETS - 1 - j

    return choose


def top_p_chooser(top_p: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
    """The bucket of top-p's cutoff: the first key, from the top, at which the kept mass
    from the top reaches ``top_p`` of the row's kept mass, with positive mass there; the
    lowest key with mass where rounding leaves the whole row short."""
    above = np.zeros(top_p.shape[0], dtype=np.float64)
    target = np.zeros(top_p.shape[0], dtype=np.float64)

    def choose(histogram: np.ndarray, round_index: int) -> np.ndarray:
        if round_index == 0:
            target[:] = top_p * histogram.sum(axis=1)
        descending = histogram[:, ::-1]
        running = descending.cumsum(axis=1)
        reached = (above[:, None] + running >= target[:, None]) & (descending > 0.0)
        positive = descending > 0.0
        lowest_with_mass = BUCKETS - 1 - positive[:, ::-1].argmax(axis=1)
        j = np.where(reached.any(axis=1), reached.argmax(axis=1), lowest_with_mass)
        rows = np.arange(histogram.shape[0])
        above[:] += running[rows, j] - descending[rows, j]
        return BUCKETS - 1 - j

    return choose


def argmax_table(rows: np.ndarray, start: int) -> np.ndarray:
    """This rank's ``[G, 2]`` float64 (largest value, global id of its first occurrence)
    per raw row, NaN never the largest; an empty shard offers ``(-inf, inf)``."""
    table = np.empty((rows.shape[0], 2), dtype=np.float64)
    if rows.shape[1] == 0:
        table[:, 0], table[:, 1] = -np.inf, np.inf
        return table
    if rows.dtype in (np.float32, np.float64):
        # The kernels' greedy argmax, one read of each row (NaN never wins).
        passes(rows).shard_argmax(library(rows).ascontiguousarray(rows), int(start), table)
        return table
    first = rows.argmax(axis=1)  # a NaN wins here: those rows are redone without it
    largest = rows[np.arange(rows.shape[0]), first]
    with_nan = np.isnan(largest).nonzero()[0]
    if with_nan.size:
        clean = rows[with_nan]
        clean = np.where(np.isnan(clean), -np.inf, clean)
        first[with_nan] = clean.argmax(axis=1)
        largest[with_nan] = clean[np.arange(with_nan.size), first[with_nan]]
    table[:, 0] = largest
    table[:, 1] = first + start
    return table


def global_argmax(gathered: np.ndarray) -> np.ndarray:
    """int64 [G]: the argmax over the ranks' :func:`argmax_table` s ``[S, G, 2]``: the
    largest value, ties to the lowest id (the unsharded argmax's first index)."""
    top = gathered[:, :, 0].max(axis=0)
    ids = np.where(gathered[:, :, 0] == top[None, :], gathered[:, :, 1], np.inf)
    return ids.min(axis=0).astype(np.int64)


def row_totals(exchange: Exchange, local: np.ndarray) -> np.ndarray:
    """The ranks' ``local`` ``[R, c]`` summed (a kept mass, and a drafted token's weight
    that only its owner holds): one round, the same sums on every rank."""
    return exchange.gather(local).sum(axis=0)


def shard_masses(masses: np.ndarray, shard: Shard) -> np.ndarray:
    """The masses ``[S, D]`` (vocabulary order) by which a draw picks its shard: the
    shards' own masses (the seam where a draw that picked shards otherwise would break
    the law)."""
    del shard
    return masses


class Draws(NamedTuple):
    """The tokens of a two-level draw, and the rows that had no mass to draw from."""

    tokens: np.ndarray
    empty: np.ndarray


class Sparse(NamedTuple):
    """Entries of some rows on this rank's columns: entry ``i`` is row ``rows[i]``, column
    ``columns[i]`` (rows ascending, columns ascending in a row), value ``weights[i]``."""

    rows: np.ndarray
    columns: np.ndarray
    weights: np.ndarray


class RowSet(NamedTuple):
    """``D`` rows of weights on this rank's columns: the rows ``dense_rows`` held whole
    (``dense``, ``[n, width]``), the others where they may be positive (``sparse``, its
    rows numbered among the ``D``)."""

    num_rows: int
    dense_rows: np.ndarray
    dense: np.ndarray
    sparse: Sparse

    def masses(self) -> np.ndarray:
        """float64 ``[num_rows]``: each row's sum of its positive weights."""
        sums = np.zeros(self.num_rows)
        if self.dense_rows.size:
            dense_sums = np.zeros(self.dense_rows.size)
            dense = library(self.dense).ascontiguousarray(self.dense, dtype=np.float64)
            passes(dense).shard_positive_sums(dense, dense_sums)
            sums[self.dense_rows] = dense_sums
        if self.sparse.rows.size:
            positive = np.where(self.sparse.weights > 0.0, self.sparse.weights, 0.0)
            sums += np.bincount(self.sparse.rows, weights=positive,
                                minlength=self.num_rows)[: self.num_rows]
        return sums

    def crossings(self, rows: np.ndarray, inside: np.ndarray) -> np.ndarray:
        """Per row of ``rows``: the column of its first positive weight whose running sum
        (in column order) exceeds ``inside`` (its last positive weight where rounding
        runs past it); every row has one."""
        found = np.zeros(rows.size, dtype=np.int64)
        where = filled(self.num_rows, -1, dtype=np.int64)
        where[self.dense_rows] = np.arange(self.dense_rows.size)
        whole = (where[rows] >= 0).nonzero()[0]
        if whole.size and self.dense.shape[1]:
            crossing = np.zeros(whole.size, dtype=np.int64)
            dense = library(self.dense).ascontiguousarray(self.dense, dtype=np.float64)
            passes(dense).shard_first_crossings(
                dense,
                where[rows[whole]].astype(np.int64),
                np.ascontiguousarray(inside[whole], dtype=np.float64), crossing,
            )
            found[whole] = crossing
        apart = (where[rows] < 0).nonzero()[0]
        if apart.size:
            place_of = filled(self.num_rows, -1, dtype=np.int64)
            place_of[rows[apart]] = np.arange(apart.size)
            take = place_of[self.sparse.rows] >= 0
            row_of = place_of[self.sparse.rows[take]]
            columns = self.sparse.columns[take]
            values = self.sparse.weights[take]
            first = np.searchsorted(row_of, np.arange(apart.size))
            place = np.arange(row_of.size) - first[row_of]
            length = int(np.bincount(row_of, minlength=apart.size).max(initial=0))
            padded = np.zeros((apart.size, length))
            padded[row_of, place] = values
            column_of = np.zeros((apart.size, length), dtype=np.int64)
            column_of[row_of, place] = columns
            index = _first_crossing(padded, inside[apart])
            found[apart] = column_of[np.arange(apart.size), index]
        return found


def _first_crossing(block: np.ndarray, inside: np.ndarray) -> np.ndarray:
    """Per row of ``block``: the first positive entry whose running sum of the positive
    entries exceeds ``inside``, else the last positive entry."""
    block = np.where(block > 0.0, block, 0.0)
    positive = block > 0.0
    hits = (block.cumsum(axis=1) > inside[:, None]) & positive
    last_positive = block.shape[1] - 1 - positive[:, ::-1].argmax(axis=1)
    return np.where(hits.any(axis=1), hits.argmax(axis=1), last_positive)


def draw(
    exchange: Exchange,
    shard: Shard,
    start: int,
    weights: RowSet,
    fallback: RowSet,
    v: np.ndarray,
    masses: np.ndarray | None = None,
) -> Draws:
    """Inverse-CDF draws, one per row, from weights spread over the shards (two rounds).

    Round one gathers each rank's masses; every rank then finds, in vocabulary order, the
    shard whose running mass first exceeds ``v * M`` and the part of ``v * M`` left inside
    it.  Round two gathers the token that shard's rank finds by its own running sum.  A row
    whose weights are all zero draws from ``fallback`` in the same way.

    Parameters
    ----------
    exchange : Exchange
    shard : Shard
    start : int
        This rank's first column.
    weights, fallback : RowSet
        ``D`` rows of weights (anything not > 0 weighs nothing).
    v : float64 [D]
        The draws' uniforms.
    masses : float64 [D, 2] or None
        The rows' masses (``weights``', ``fallback``'s) where already summed.

    Returns
    -------
    Draws
        ``tokens`` int64 [D] (-1 where ``empty``), ``empty`` bool [D].
    """
    if masses is None:
        local = np.empty((v.shape[0], 2))
        local[:, 0] = weights.masses()
        local[:, 1] = fallback.masses()
    else:
        local = masses
    order = shard.order()
    masses = exchange.gather(local)[order]  # [S, D, 2], vocabulary order
    use_fallback = masses[:, :, 0].sum(axis=0) == 0.0
    chosen = shard_masses(
        np.where(use_fallback[None, :], masses[:, :, 1], masses[:, :, 0]), shard
    )  # [S, D]
    # Each draw's shard and what is left inside it, by one compiled pass over the shards'
    # masses (_core's draw_shards: the cumulative sum's bits, the same on every rank).
    count = v.shape[0]
    position = np.empty(count, dtype=np.int64)
    inside = np.empty(count)
    flags = np.empty((2, count), dtype=np.uint8)
    _core.draw_shards(
        np.ascontiguousarray(chosen, dtype=np.float64), np.ascontiguousarray(order, np.int64),
        np.ascontiguousarray(v, dtype=np.float64), exchange.rank, position, inside,
        flags[0], flags[1],
    )
    empty, mine = flags.view(bool)
    tokens = filled(v.shape[0], -1, dtype=np.int64)
    if np.count_nonzero(mine):
        for source, use in ((weights, mine & ~use_fallback), (fallback, mine & use_fallback)):
            at = use.nonzero()[0]
            if at.size:
                tokens[at] = start + source.crossings(at, inside[at])
    tokens = exchange.gather(tokens).max(axis=0)
    return Draws(np.where(empty, -1, tokens) if np.count_nonzero(empty) else tokens, empty)
