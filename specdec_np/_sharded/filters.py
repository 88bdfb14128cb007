"""Top-k, top-p and min-p across vocabulary shards: each filter keeps an upper set of the
row's values, so the kept set is ``{y : key(y) >= c}`` for one key ``c`` per row, found
here from per-row numbers and short candidate lists.

* min-p needs no round: its floor is the smallest key whose weight reaches ``min_p``, a
  function of the row's maximum alone (found in a window around ``max + log(min_p)``).
* Top-k's lists (:func:`early_rows`, sent with the maxima, since they need none): each
  rank sends per row its ``C`` largest keys (``C`` the call's largest ``top_k``, at most
  :data:`MOST_CANDIDATES`) and how many of its entries reach the last one (its ties
  there).  Every rank merges the lists the same way: a rank that sent fewer than ``C``
  keys sent all it had; one that sent ``C`` is known down to its last key, so the merged
  list is the whole row's above the largest such key.  Top-k's floor, the ``top_k``-th
  largest key, always lies in that known part, and so does all of what top-p weighs after
  top-k: both come from the lists, with no round of their own.
* Top-p without top-k (one round): lists of :data:`TOP_P_CANDIDATES` keys at or above
  min-p's floor, with each rank's mass there; the cutoff is settled where the mass from
  the top reaches ``top_p`` of the whole within the known part.
* The radix select of :mod:`.rows` (8 bits a round) finds what the lists leave open:
  top-k beyond :data:`MOST_CANDIDATES`, a top-p cutoff below the known part.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _core
from . import rows as _rows
from .exchange import Exchange
from .laws import Entries, LogitRows, law_weights

__all__ = [
    "MOST_CANDIDATES",
    "TOP_P_CANDIDATES",
    "Floors",
    "Listing",
    "candidate_count",
    "early_rows",
    "list_candidates",
    "min_p_floors",
    "select_floors",
    "weights_of",
]

#: Candidates a rank sends per row for top-p without top-k.
TOP_P_CANDIDATES = 64
#: The most candidates a rank sends per row (a larger top_k takes the radix select).
MOST_CANDIDATES = 128
#: The key of -inf in each dtype (the lowest key min-p's bisection starts from; min-p's
#: window of 8 keys on either side of its estimate is ``_core``'s ``min_p_keys``).
_LOWEST_KEYS = {
    np.dtype(dtype): _rows.ordered_keys(np.array([-np.inf], dtype=dtype))[0]
    for dtype in (np.float32, np.float64)
}


def candidate_count(top_k: np.ndarray, top_p: np.ndarray, vocab_size: int) -> int:
    """How many candidates a rank sends per row for these settings (0: no list)."""
    k_on = (top_k > 0) & (top_k < vocab_size)
    size = int(top_k[k_on & (top_k <= MOST_CANDIDATES)].max(initial=0))
    if np.count_nonzero((top_p < 1.0) & ~k_on):
        size = max(size, TOP_P_CANDIDATES)
    return min(size, MOST_CANDIDATES)


def weights_of(values: np.ndarray, top: np.ndarray) -> np.ndarray:
    """float64 ``w = exp(values - top)`` by the law's rule (the float32 exponential for
    float32 values, ``exp`` for float64; NaN weighs 0), ``top`` broadcast against
    ``values``, both of one dtype."""
    return law_weights(values, top).astype(np.float64)


def min_p_floors(top: np.ndarray, min_p: np.ndarray) -> np.ndarray:
    """uint64 keys ``[R]``: per row the smallest key whose value ``y`` has ``w(y) = exp(y -
    top) >= min_p`` (0 < min_p <= 1, ``top`` finite, of the rows' dtype).

    The kernels find it by bisection over all keys from ``-inf`` to ``top``; ``w`` is
    monotone in the key, so the floor is the first key of a short window around the
    estimate ``top + log(min_p)`` whose weight reaches ``min_p``, where the window holds
    the crossing (``_core``'s ``min_p_keys``; else the same bisection, on those rows).
    """
    top = np.ascontiguousarray(top)
    min_p = np.ascontiguousarray(min_p, dtype=np.float64)
    floors = np.empty(top.shape[0], dtype=np.uint64)
    lost = np.empty(top.shape[0], dtype=np.uint8)
    _core.min_p_keys(top, min_p, np.log(min_p), floors, lost)
    lost = lost.view(bool)
    if np.count_nonzero(lost):
        low = _rows.filled(int(np.count_nonzero(lost)), _lowest_key(top.dtype),
                           dtype=np.uint64)
        floors[lost] = _bisect(top[lost], min_p[lost], low, _rows.ordered_keys(top[lost]))
    return floors


def _lowest_key(dtype: np.dtype) -> np.uint64:
    """The key of ``-inf`` in ``dtype`` (float32 or float64)."""
    return _LOWEST_KEYS[np.dtype(dtype)]


def _bisect(top: np.ndarray, min_p: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The kernels' bisection: ``w(low) < min_p <= w(high)`` until they are adjacent."""
    low, high = low.copy(), high.copy()
    while True:
        open_rows = (high - low > np.uint64(1)).nonzero()[0]
        if not open_rows.size:
            return high
        middle = low[open_rows] + (high[open_rows] - low[open_rows]) // np.uint64(2)
        values = _rows.key_values(middle, top.dtype)
        up = weights_of(values, top[open_rows]) >= min_p[open_rows]
        high[open_rows[up]] = middle[up]
        low[open_rows[~up]] = middle[~up]


class Floors(NamedTuple):
    """Per row: the key at and above which the filters keep entries (0: every entry),
    and whether a filter is on for the row; and this rank's candidates (the entries at or
    above ``thresholds``, NaN where a row has none), which hold every kept entry of a row
    whose floor reaches its threshold."""

    keys: np.ndarray
    filtered: np.ndarray
    candidates: Entries | None
    thresholds: np.ndarray


class Listing(NamedTuple):
    """This rank's candidate lists of some rows: what it sends (``record``: per row the
    ``size`` largest keys at or above the row's threshold, descending, 0 where there are
    fewer, then the count of entries at or above the last key sent, then the row's mass
    where asked), and its candidates themselves (every entry at or above
    ``thresholds``)."""

    rows: np.ndarray
    size: int
    record: np.ndarray
    found: Entries
    thresholds: np.ndarray


class _Merged(NamedTuple):
    """The ranks' candidate lists of some rows, merged: keys descending ``[n, L]`` (0 for
    no entry) with multiplicities, and the key at and above which they are the whole
    row's (0: everything above the candidates' floor)."""

    keys: np.ndarray
    counts: np.ndarray
    known: np.ndarray


def early_rows(top_k: np.ndarray, vocab_size: int) -> np.ndarray:
    """The rows whose top-k lists ride in the maxima round (top-k on, at most
    :data:`MOST_CANDIDATES`): they need no maximum."""
    return ((top_k > 0) & (top_k < vocab_size) & (top_k <= MOST_CANDIDATES)).nonzero()[0]


def list_candidates(
    values: LogitRows,
    rows: np.ndarray,
    size: int,
    floors: np.ndarray | None,
    group_maxima: np.ndarray | None,
    masses: np.ndarray | None = None,
) -> Listing:
    """This rank's lists for ``rows``.

    Parameters
    ----------
    values : LogitRows
    rows : int array [n]
    size : int
        Keys per list.
    floors : uint64 keys [n] or None
        Below these nothing can be kept (None or 0: the lowest finite value).
    group_maxima : same dtype as ``values`` [n, G] or None
        The largest logit of each of ``G`` sets of columns of every row: their
        ``size``-th largest (an entry of the row) bounds the row's ``size``-th largest.
    masses : float64 [n] or None
        Each row's mass at or above its floor, sent along.
    """
    dtype = values.dtype
    count = rows.size
    key_bits = 32 if dtype == np.float32 else 64
    lowest_finite = _rows.filled(count, np.finfo(dtype).min, dtype=dtype)
    # Key 0 (no floor) reads as a NaN: the floor is then the lowest finite value (-inf
    # entries weigh nothing and are never a cutoff).
    threshold = lowest_finite if floors is None else np.fmax(
        _rows.key_values(floors, dtype), lowest_finite
    )
    if group_maxima is not None and 0 < size <= group_maxima.shape[1]:
        column = group_maxima.shape[1] - size
        bound = group_maxima.copy()
        bound.partition(column, axis=1)
        bound = bound[:, column]
        if not values.unit:
            # fl(l / t) is monotone in l: the bound's value bounds the row's values.
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                bound = bound / values.divisor[rows]
        threshold = np.maximum(threshold, bound)
    found = values.at_least(rows, threshold)
    where = _rows.filled(values.count, -1, dtype=np.int64)
    where[rows] = np.arange(count)
    word = np.uint32 if key_bits == 32 else np.uint64
    mass_words = 0 if masses is None else (2 if key_bits == 32 else 1)
    record = np.zeros((count, size + 1 + mass_words), dtype=word)
    # Per row the size largest keys, descending, and the count at or above the last one
    # (_core's list_record).
    _core.list_record(where[found.rows], np.ascontiguousarray(found.values), size, record)
    if masses is not None:
        record[:, size + 1 :] = masses.astype(np.float64).view(word).reshape(count, mass_words)
    return Listing(rows, size, record, found, threshold)


def _unpack(listing: Listing, gathered: np.ndarray) -> tuple[_Merged, np.ndarray]:
    """The merged lists and the summed masses of a gathered :class:`Listing` record."""
    size = listing.size
    masses = np.zeros(listing.rows.size)
    if gathered.shape[2] > size + 1:
        words = np.ascontiguousarray(gathered[:, :, size + 1 :])
        masses = words.view(np.float64)[:, :, 0].sum(axis=0)
    return _merge(gathered[:, :, : size + 1].astype(np.uint64), size), masses


def select_floors(
    exchange: Exchange,
    values: LogitRows,
    top: np.ndarray,
    on: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    min_p: np.ndarray,
    vocab_size: int,
    llama_cpp: bool,
    group_maxima: np.ndarray | None = None,
    early: tuple[Listing, np.ndarray] | None = None,
) -> Floors:
    """The filters' kept set of every row, as one key per row (the rounds above).

    Parameters
    ----------
    exchange : Exchange
    values : LogitRows
        What the filters select on (``z`` in vLLM's order, the logits in llama.cpp's);
        NaN is never kept.
    top : same dtype [R]
        The rows' global maxima of ``values`` (finite where ``on``).
    on : bool [R]
        Rows the filters apply to (others keep everything: rows with ``+inf`` entries or
        without mass).
    top_k : int64 [R]
    top_p, min_p : float64 [R]
    vocab_size : int
    llama_cpp : bool
        llama.cpp's order: top-p weighs top-k's set (min-p applies after it); vLLM's
        weighs what min-p and top-k keep.
    group_maxima : same dtype [R, G] or None
        This rank's largest logit of each of ``G`` sets of columns of every row
        (:meth:`~.laws.LogitRows.maxima`).
    early : (Listing, gathered record) or None
        The lists of :func:`early_rows`, already exchanged with the maxima.

    Returns
    -------
    Floors
    """
    rows_total = values.count
    dtype = values.dtype
    key_bits = 32 if dtype == np.float32 else 64
    k_on = on & (top_k > 0) & (top_k < vocab_size)
    p_on = on & (top_p < 1.0)
    m_on = on & (min_p > 0.0)
    min_p_keys = np.zeros(rows_total, dtype=np.uint64)
    if np.count_nonzero(m_on):
        min_p_keys[m_on] = min_p_floors(top[m_on], min_p[m_on])
    # What top-p weighs from: min-p's floor in vLLM's order, nothing in llama.cpp's.
    p_floor = np.zeros(rows_total, dtype=np.uint64) if llama_cpp else min_p_keys.copy()
    cutoff = np.zeros(rows_total, dtype=np.uint64)  # top-p's; 0 where off or unknown
    few_k = k_on & (top_k <= MOST_CANDIDATES)
    top_k_open = (k_on & ~few_k).nonzero()[0]
    top_p_open = (p_on & k_on & ~few_k).nonzero()[0]
    cache = _Weights(values, top)
    found: list[Entries] = []
    thresholds = _rows.filled(rows_total, np.nan, dtype=dtype)
    # Top-k's lists (with the maxima): top-k's floor, then top-p over what it keeps.
    if early is not None and early[0].rows.size:
        listing, gathered = early
        listed = listing.rows
        merged, masses = _unpack(listing, gathered)
        floors = _top_k_floors(merged, top_k[listed], few_k[listed])
        if not llama_cpp:
            floors = np.maximum(floors, min_p_keys[listed])
        p_floor[listed] = np.where(few_k[listed], floors, p_floor[listed])
        settled, open_p = _top_p_cutoffs(
            merged, floors, masses, top_p[listed], p_on[listed] & few_k[listed],
            top[listed], dtype,
        )
        cutoff[listed] = np.where(few_k[listed], settled, cutoff[listed])
        if np.count_nonzero(open_p):
            top_p_open = np.union1d(top_p_open, listed[open_p])
        found.append(listing.found)
        thresholds[listed] = listing.thresholds
    # Top-p without top-k: lists at or above min-p's floor, with the rows' masses there.
    alone = (p_on & ~k_on).nonzero()[0]
    if alone.size:
        floor_values = np.fmax(_rows.key_values(p_floor[alone], dtype), np.finfo(dtype).min)
        w = cache.of(alone)
        masses = np.where(values.values(alone) >= floor_values[:, None], w, 0.0).sum(axis=1)
        listing = list_candidates(
            values, alone, TOP_P_CANDIDATES, p_floor[alone],
            None if group_maxima is None else group_maxima[alone], masses,
        )
        merged, masses = _unpack(listing, exchange.gather(listing.record))
        settled, open_p = _top_p_cutoffs(
            merged, p_floor[alone], masses, top_p[alone], np.ones(alone.size, dtype=bool),
            top[alone], dtype,
        )
        cutoff[alone] = settled
        if np.count_nonzero(open_p):
            top_p_open = np.union1d(top_p_open, alone[open_p])
        found.append(listing.found)
        thresholds[alone] = listing.thresholds
    if top_k_open.size:
        keys = _clean_keys(values.values(top_k_open))
        floor = _rows.radix_select(
            exchange, keys, key_bits, None, _rows.top_k_chooser(top_k[top_k_open])
        )
        if not llama_cpp:
            floor = np.maximum(floor, min_p_keys[top_k_open])
        p_floor[top_k_open] = floor
    if top_p_open.size:
        keys = _clean_keys(values.values(top_p_open))
        masses = np.where(
            keys >= p_floor[top_p_open][:, None],
            cache.of(top_p_open),
            0.0,
        )
        cutoff[top_p_open] = _rows.radix_select(
            exchange, keys, key_bits, masses, _rows.top_p_chooser(top_p[top_p_open])
        )
    keys = np.maximum(np.maximum(p_floor, cutoff), min_p_keys)
    filtered = k_on | p_on | m_on
    candidates = found[0] if len(found) == 1 else None
    if len(found) > 1:
        candidates = Entries(*(np.concatenate([getattr(part, name) for part in found])
                               for name in Entries._fields))
        order = np.lexsort((candidates.columns, candidates.rows))
        candidates = Entries(*(getattr(candidates, name)[order] for name in Entries._fields))
    return Floors(np.where(filtered, keys, np.uint64(0)), filtered, candidates, thresholds)


def _clean_keys(values: np.ndarray) -> np.ndarray:
    """:func:`~.rows.ordered_keys` with NaN as ``-inf`` (the radix select counts them)."""
    return _rows.ordered_keys(np.where(np.isnan(values), values.dtype.type(-np.inf), values))


class _Weights:
    """``w`` of the filters' rows (float64 ``[len(rows), width]``), each row computed once
    a call, the rows asked for together (no per-row Python)."""

    def __init__(self, values: LogitRows, top: np.ndarray) -> None:
        self.values, self.top = values, top
        self.at = _rows.filled(values.count, -1, dtype=np.int64)
        self.computed = np.zeros((0, values.width))

    def of(self, rows: np.ndarray) -> np.ndarray:
        """The weights of ``rows`` (row ``i`` of the result is ``rows[i]``)."""
        missing = np.unique(rows[self.at[rows] < 0])
        if missing.size:
            fresh = weights_of(self.values.values(missing), self.top[missing][:, None])
            self.at[missing] = self.computed.shape[0] + np.arange(missing.size)
            self.computed = np.concatenate([self.computed, fresh])
        return self.computed[self.at[rows]]


def _merge(gathered: np.ndarray, size: int) -> _Merged:
    """Merge the ranks' lists ``[S, n, size + 1]`` (keys, then the count at or above the
    last key) into one descending list per row with multiplicities: a full list holds one
    copy of each entry above its last key, and its ties at the last key beyond the one
    sent come as one more entry with their count (``_core``'s ``merge_shard_lists``)."""
    ranks, count = gathered.shape[0], gathered.shape[1]
    length = ranks * size + ranks
    keys = np.empty((count, length), dtype=np.uint64)
    counts = np.empty((count, length), dtype=np.int64)
    known = np.empty(count, dtype=np.uint64)
    _core.merge_shard_lists(np.ascontiguousarray(gathered, dtype=np.uint64), size, keys,
                            counts, known)
    return _Merged(keys, counts, known)


def _top_k_floors(merged: _Merged, top_k: np.ndarray, on: np.ndarray) -> np.ndarray:
    """Top-k's floor (the ``top_k``-th largest key) where ``on``; 0 where fewer than
    ``top_k`` entries reach the candidates' floor (top-k then keeps them all) or off
    (``_core``'s ``top_k_keys``)."""
    floors = np.empty(top_k.shape[0], dtype=np.uint64)
    _core.top_k_keys(merged.keys, merged.counts, np.ascontiguousarray(top_k, dtype=np.int64),
                     np.ascontiguousarray(on, dtype=bool).view(np.uint8), floors)
    return floors


def _top_p_cutoffs(
    merged: _Merged,
    floors: np.ndarray,
    masses: np.ndarray,
    top_p: np.ndarray,
    on: np.ndarray,
    top: np.ndarray,
    dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-p's cutoff key where the merged lists settle it, and where they do not.

    Over the entries at or above ``floors``: the first key from the top at which the
    running mass reaches ``top_p`` of the whole mass, with mass there (the lowest key with
    mass where rounding leaves the whole short).  The mass is the merged entries' when
    they hold every entry at or above the floor, else the gathered ``masses``; the cutoff
    is settled when it lies in the known part.
    """
    count = floors.shape[0]
    cutoffs = np.zeros(count, dtype=np.uint64)
    open_rows = np.zeros(count, dtype=bool)
    rows = on.nonzero()[0]
    if not rows.size:
        return cutoffs, open_rows
    found = np.empty(rows.size, dtype=np.uint64)
    unsettled = np.empty(rows.size, dtype=np.uint8)
    _core.top_p_keys(
        merged.keys[rows], merged.counts[rows], merged.known[rows],
        np.ascontiguousarray(floors[rows], dtype=np.uint64),
        np.ascontiguousarray(top[rows], dtype=dtype),
        np.ascontiguousarray(top_p[rows], dtype=np.float64),
        np.ascontiguousarray(masses[rows], dtype=np.float64), found, unsettled,
    )
    cutoffs[rows] = found
    open_rows[rows] = unsettled.view(bool)
    return cutoffs, open_rows
