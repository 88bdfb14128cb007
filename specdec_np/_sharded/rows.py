"""Row statistics across vocabulary shards: each rank holds columns ``start .. start +
width - 1`` of every row, and only per-row numbers and fixed-size histograms cross ranks.

The processed law of a logits row (``docs/semantics.md``, the engine layout) needs, beyond
what a rank sees, the row's maximum and count of ``+inf`` entries (one round), top-k's
floor and top-p's cutoff (exact radix selects over order-preserving integer keys of ``z``,
8 bits a round: 4 rounds for float32 rows, 8 for float64) and the kept mass (summed with
the drafted tokens' weights in one round).  min-p needs nothing more: ``w >= min_p`` is
local once the maximum is known.  A draw from weights spread over the shards is an
inverse CDF in two levels: the shard, by the shards' masses in vocabulary order, then the
token inside it; that is the unsharded inverse CDF, whose running sum is split at the
shards' boundaries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .._reference.chains import fast_expf
from .exchange import Exchange, Shard

__all__ = [
    "Draws",
    "argmax_table",
    "draw",
    "global_argmax",
    "kept_weights",
    "maxima_table",
    "ordered_keys",
    "radix_select",
    "row_totals",
    "shard_masses",
]

DIGIT_BITS = 8
BUCKETS = 1 << DIGIT_BITS


def ordered_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the float32 or float64 ``values`` (no NaN), ``-0``
    and ``+0`` one key, so that a cutoff on keys is a cutoff on values."""
    values = values + values.dtype.type(0)  # -0 + 0 is +0
    if values.dtype == np.float32:
        bits = values.view(np.uint32).astype(np.uint64)
        sign, full = np.uint64(1 << 31), np.uint64(0xFFFFFFFF)
    else:
        bits = values.view(np.uint64)
        sign, full = np.uint64(1 << 63), np.uint64(0xFFFFFFFFFFFFFFFF)
    # Negative floats order backwards by their bits: flip them all; lift the positive ones.
    return np.where((bits & sign) != 0, full ^ bits, bits | sign)


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


def _top_k_chooser(k: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
    """The bucket of the ``k``-th largest key: counts from the top bucket down."""
    remaining = k.astype(np.int64).copy()

    def choose(histogram: np.ndarray, round_index: int) -> np.ndarray:
        descending = histogram[:, ::-1].astype(np.int64)
        cumulative = np.cumsum(descending, axis=1)
        j = np.argmax(cumulative >= remaining[:, None], axis=1)
        rows = np.arange(histogram.shape[0])
        remaining[:] -= cumulative[rows, j] - descending[rows, j]
        return BUCKETS - 1 - j

    return choose


def _top_p_chooser(top_p: np.ndarray) -> Callable[[np.ndarray, int], np.ndarray]:
    """The bucket of top-p's cutoff: the first key, from the top, at which the kept mass
    from the top reaches ``top_p`` of the row's kept mass, with positive mass there; the
    lowest key with mass where rounding leaves the whole row short."""
    above = np.zeros(top_p.shape[0], dtype=np.float64)
    target = np.zeros(top_p.shape[0], dtype=np.float64)

    def choose(histogram: np.ndarray, round_index: int) -> np.ndarray:
        if round_index == 0:
            target[:] = top_p * histogram.sum(axis=1)
        descending = histogram[:, ::-1]
        running = np.cumsum(descending, axis=1)
        reached = (above[:, None] + running >= target[:, None]) & (descending > 0.0)
        positive = descending > 0.0
        lowest_with_mass = BUCKETS - 1 - np.argmax(positive[:, ::-1], axis=1)
        j = np.where(reached.any(axis=1), np.argmax(reached, axis=1), lowest_with_mass)
        rows = np.arange(histogram.shape[0])
        above[:] += running[rows, j] - descending[rows, j]
        return BUCKETS - 1 - j

    return choose


def maxima_table(z: np.ndarray) -> np.ndarray:
    """This rank's ``[R, 2]`` float64 (largest ``z``, count of ``+inf``) per row (NaN
    already ``-inf``)."""
    table = np.empty((z.shape[0], 2), dtype=np.float64)
    table[:, 0] = np.max(z, axis=1, initial=-np.inf)
    table[:, 1] = np.count_nonzero(z == np.inf, axis=1)
    return table


def argmax_table(rows: np.ndarray, start: int) -> np.ndarray:
    """This rank's ``[G, 2]`` float64 (largest value, global id of its first occurrence)
    per raw row, NaN never the largest; an empty shard offers ``(-inf, inf)``."""
    table = np.empty((rows.shape[0], 2), dtype=np.float64)
    if rows.shape[1] == 0:
        table[:, 0], table[:, 1] = -np.inf, np.inf
        return table
    clean = np.where(np.isnan(rows), -np.inf, rows)
    first = np.argmax(clean, axis=1)
    table[:, 0] = clean[np.arange(rows.shape[0]), first]
    table[:, 1] = first + start
    return table


def global_argmax(gathered: np.ndarray) -> np.ndarray:
    """int64 [G]: the argmax over the ranks' :func:`argmax_table` s ``[S, G, 2]``: the
    largest value, ties to the lowest id (the unsharded argmax's first index)."""
    top = gathered[:, :, 0].max(axis=0)
    ids = np.where(gathered[:, :, 0] == top[None, :], gathered[:, :, 1], np.inf)
    return ids.min(axis=0).astype(np.int64)


def _exponential(shifted: np.ndarray) -> np.ndarray:
    """float64 ``exp`` of ``shifted`` by the law's rule: the specified float32 exponential
    for float32 rows, ``exp`` for float64 rows."""
    if shifted.dtype == np.float32:
        return fast_expf(shifted).astype(np.float64)
    return np.exp(shifted)


def _shifted_weights(values: np.ndarray, top: np.ndarray, skip: np.ndarray) -> np.ndarray:
    """``exp(values - top)`` per row (``top`` the rows' global maxima, float64), 0 on the
    rows where ``skip`` holds."""
    dtype = values.dtype
    top = top.astype(dtype)
    finite_top = np.where(np.isfinite(top), top, dtype.type(0))
    shifted = values - finite_top[:, None]
    shifted[skip] = -np.inf
    return _exponential(shifted)


def _top_k_and_top_p(
    exchange: Exchange,
    values: np.ndarray,
    w: np.ndarray,
    kept: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    vocab_size: int,
    on: np.ndarray,
) -> None:
    """Top-k on ``values`` (ties kept), then top-p over the mass ``w`` that ``kept`` holds
    by then, narrowing ``kept`` in place on the rows where ``on`` holds."""
    key_bits = 32 if values.dtype == np.float32 else 64
    keys = ordered_keys(values)
    rows = np.flatnonzero((top_k > 0) & (top_k < vocab_size) & on)
    if rows.size:
        floor = radix_select(exchange, keys[rows], key_bits, None, _top_k_chooser(top_k[rows]))
        kept[rows] &= keys[rows] >= floor[:, None]
    rows = np.flatnonzero((top_p < 1.0) & on)
    if rows.size:
        masses = np.where(kept[rows], w[rows], 0.0)
        cutoff = radix_select(exchange, keys[rows], key_bits, masses, _top_p_chooser(top_p[rows]))
        kept[rows] &= keys[rows] >= cutoff[:, None]


def _min_p_kept(w: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    return (w >= min_p[:, None]) | (min_p[:, None] <= 0.0)


def kept_weights(
    exchange: Exchange,
    z: np.ndarray,
    present: np.ndarray,
    maxima: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    min_p: np.ndarray,
    vocab_size: int,
    llama_cpp: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """float64 ``[R, width]``: the unnormalised processed law on this rank's columns,
    ``w = exp(z - max z)`` where the filters keep it and 0 elsewhere; a row with ``+inf``
    entries weighs 1 on each of them, a row without a finite maximum 0 everywhere.

    Parameters
    ----------
    exchange : Exchange
    z : float32 or float64 [R, width]
        ``logits / temperature``, NaN as ``-inf``.
    present : bool [R, width]
        Not NaN.
    maxima : float64 [R, 2]
        The rows' global (largest ``z``, count of ``+inf``).
    top_k : int64 [R]
    top_p, min_p : float64 [R]
    vocab_size : int
    llama_cpp : (logits [R, width], temperature [R]) or None
        llama.cpp's order: the filters select on the logits at temperature 1, and the law
        keeps every ``z`` that reaches the lowest logit they keep, over the temperature
        (two more rounds: the logits' maxima, the lowest kept logit).  None: vLLM's order.

    Returns
    -------
    float64 [R, width]
    """
    infinite_rows = maxima[:, 1] > 0
    no_mass = ~(maxima[:, 0] > -np.inf)
    w = _shifted_weights(z, maxima[:, 0], infinite_rows)
    on = ~infinite_rows & ~no_mass
    if llama_cpp is None:
        kept = present & _min_p_kept(w, min_p)
        _top_k_and_top_p(exchange, z, w, kept, top_k, top_p, vocab_size, on)
    else:
        logits, temperature = llama_cpp
        values = np.where(present, logits, logits.dtype.type(-np.inf))
        top = exchange.gather(np.max(values, axis=1, initial=-np.inf)).max(axis=0)
        w1 = _shifted_weights(values, top, infinite_rows)
        selected = present.copy()
        _top_k_and_top_p(exchange, values, w1, selected, top_k, top_p, vocab_size, on)
        selected &= _min_p_kept(w1, min_p)
        lowest_local = np.min(np.where(selected, values, np.inf), axis=1, initial=np.inf)
        lowest = exchange.gather(lowest_local.astype(np.float64)).min(axis=0)
        threshold = lowest.astype(z.dtype) / temperature.astype(z.dtype)
        kept = present & (z >= threshold[:, None])
    weights = np.where(kept, w, 0.0)
    weights[infinite_rows] = (z[infinite_rows] == np.inf).astype(np.float64)
    weights[no_mass] = 0.0
    return weights


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


def draw(
    exchange: Exchange,
    shard: Shard,
    start: int,
    weights: np.ndarray,
    fallback: np.ndarray,
    v: np.ndarray,
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
    weights, fallback : float64 [D, width]
        Non-negative weights (anything not > 0 weighs nothing).
    v : float64 [D]
        The draws' uniforms.

    Returns
    -------
    Draws
        ``tokens`` int64 [D] (-1 where ``empty``), ``empty`` bool [D].
    """
    weights = np.where(weights > 0.0, weights, 0.0)
    fallback = np.where(fallback > 0.0, fallback, 0.0)
    local = np.stack([weights.sum(axis=1), fallback.sum(axis=1)], axis=1)
    masses = exchange.gather(local)[shard.order()]  # [S, D, 2], vocabulary order
    use_fallback = masses[:, :, 0].sum(axis=0) == 0.0
    chosen = shard_masses(
        np.where(use_fallback[None, :], masses[:, :, 1], masses[:, :, 0]), shard
    )  # [S, D]
    running = np.cumsum(chosen, axis=0)
    total = running[-1] if running.shape[0] else np.zeros(v.shape)
    empty = ~(total > 0.0)
    threshold = v * total
    crossing = (running > threshold[None, :]) & (chosen > 0.0)
    last_with_mass = chosen.shape[0] - 1 - np.argmax((chosen > 0.0)[::-1], axis=0)
    position = np.where(crossing.any(axis=0), np.argmax(crossing, axis=0), last_with_mass)
    # The running mass before each shard, exactly the sum the crossing test added to.
    before = np.concatenate([np.zeros((1, v.shape[0])), running[:-1]], axis=0)
    rows = np.arange(v.shape[0])
    inside = threshold - before[position, rows]
    mine = (shard.order()[position] == exchange.rank) & ~empty
    tokens = np.full(v.shape[0], -1, dtype=np.int64)
    for row in np.flatnonzero(mine):
        row_weights = fallback[row] if use_fallback[row] else weights[row]
        positive = row_weights > 0.0
        cumulative = np.cumsum(row_weights)
        hits = np.flatnonzero((cumulative > inside[row]) & positive)
        index = hits[0] if hits.size else np.flatnonzero(positive)[-1]
        tokens[row] = start + int(index)
    tokens = exchange.gather(tokens).max(axis=0)
    return Draws(np.where(empty, -1, tokens), empty)
