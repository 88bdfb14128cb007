"""The dense laws a relaxed rule reads: one chunk of requests of a chain batch, padded.

A relaxed rule (:mod:`specdec_np._relaxed.rules`) decides a position from the target's
law there, the drafted token and its draft probability, and for some rules the whole
row (its most probable tokens, its entropy); the bias (:mod:`specdec_np._relaxed.bias`)
reads every row whole.  :func:`chunk_laws` writes those rows for a few requests at a
time, padded to ``[n, K + 1, V]``, by the kernels' own law functions
(:func:`specdec_np._layouts.surface.law_rows`), so that a sampled request's law is
bit for bit the one :func:`specdec_np.processed_probs` returns.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._layouts import surface as _surface

__all__ = ["ChunkLaws", "chunk_laws", "chunks"]

#: Float64 entries of one padded ``[n, K + 1, V]`` chunk: 8 M entries, 64 MB a block.
CHUNK_ENTRIES = 1 << 23

#: The sampling-table row of a greedy request's relaxed law: temperature 1, no filter.
_SOFTMAX_ROW = (1.0, 0.0, 1.0, 0.0)


class ChunkLaws(NamedTuple):
    """The rows of ``n`` requests, padded to ``K = max k_b`` draft positions.

    Attributes
    ----------
    requests : int64 numpy array [n]
        The requests' indices in the batch.
    counts : int64 array [n]
        ``k_b``.
    greedy : bool array [n]
    valid : bool array [n, K]
        Position ``i < k_b``.
    draft_ids : int64 array [n, K]
        The drafts (0 where not valid).
    target : float64 array [n, K + 1, V]
        The target's law at each position, then the bonus position: the processed law
        of a sampled request; for a greedy request the softmax of its (adjusted) row at
        temperature 1 without filters, or the row as given with probabilities (what the
        relaxed rules read a greedy request's ``p`` from).  Zero rows where not valid.
    top : int64 array [n, K + 1]
        The token a greedy verification emits: the argmax of the raw (adjusted) row for a
        greedy request (first index on ties, NaN never wins), the argmax of ``target``
        for a sampled one.
    reachable : bool array [n, K + 1, V]
        The tokens the target can emit there: a raw logit above ``-inf`` (a positive
        probability with probability rows) for a greedy request, a positive processed
        probability for a sampled one.
    draft : float64 array [n, K, V] or None
        The draft's law (processed like the target's for draft logits; a point mass at
        the argmax for a greedy request); None for point-mass drafts.
    p_x, q_x : float64 array [n, K]
        ``target`` and ``draft`` at the drafted token (``q_x`` is 1 for point-mass drafts).
    has_bonus_rows : bool
        ``target`` holds the bonus positions.
    """

    requests: np.ndarray
    counts: Any
    greedy: Any
    valid: Any
    draft_ids: Any
    target: Any
    top: Any
    reachable: Any
    draft: Any
    p_x: Any
    q_x: Any
    has_bonus_rows: bool


def chunks(batch_size: int, max_k: int, vocab_size: int) -> list[np.ndarray]:
    """The request indices of each chunk, so that a chunk's rows stay under
    :data:`CHUNK_ENTRIES` entries (at least one request a chunk)."""
    per_chunk = max(1, CHUNK_ENTRIES // max(1, (max_k + 1) * vocab_size))
    return [
        np.arange(start, min(start + per_chunk, batch_size), dtype=np.int64)
        for start in range(0, batch_size, per_chunk)
    ]


def _laws_of_rows(xp: Any, rows: Any, table: Any, from_logits: bool) -> Any:
    """float64 laws of rows ``[m, V]``: processed by ``table`` (one row per row) with
    logits, the rows as given with probabilities."""
    if not from_logits:
        return rows.astype(xp.float64)
    if table is None:
        raise ValueError("logits rows need a sampling table")
    return _surface.law_rows(xp.ascontiguousarray(rows), table).astype(xp.float64)


def chunk_laws(batch: Any, request: Any, form: Any, requests: np.ndarray) -> ChunkLaws:
    """The padded laws of ``requests`` (host indices) of a chain batch.

    Parameters
    ----------
    batch : specdec_np._layouts.padded.ChainBatch
        A ragged batch (``draft_counts`` set), its rows adjusted by the sampling surface.
    request : specdec_np._layouts.sampling.RequestSampling
    form : specdec_np._layouts.sampling.RowForm
    requests : int64 numpy array [n]

    Returns
    -------
    ChunkLaws
    """
    xp = batch.xp
    counts_host = np.asarray(batch.draft_counts, dtype=np.int64)
    greedy_host = np.asarray(request.greedy, dtype=bool)
    counts = counts_host[requests]
    n = int(requests.size)
    width = int(counts.max(initial=0))
    vocab_size = batch.vocab_size
    bonus_rows = bool(batch.bonus_rows)
    starts_draft = np.cumsum(counts_host) - counts_host
    starts_target = starts_draft + (np.arange(counts_host.size) if bonus_rows else 0)
    positions = np.arange(width + 1)
    row_width = counts + (1 if bonus_rows else 0)
    valid_target = positions[None, :] < row_width[:, None]
    target_index = np.where(valid_target, starts_target[requests][:, None] + positions, 0)
    flat_rows = target_index[valid_target]
    owner = np.repeat(np.arange(n), row_width)
    greedy = greedy_host[requests]
    greedy_rows = greedy[owner]

    raw = batch.target_rows[xp.asarray(flat_rows)]
    table = None
    if form.from_logits:
        host_table = np.asarray(
            request.table.get() if hasattr(request.table, "get") else request.table,
            dtype=np.float64,
        )[requests][owner]
        host_table[greedy_rows, : len(_SOFTMAX_ROW)] = _SOFTMAX_ROW
        table = xp.asarray(np.ascontiguousarray(host_table))
    laws = _laws_of_rows(xp, raw, table, form.from_logits)
    raw_clean = xp.where(xp.isnan(raw), xp.asarray(-np.inf, dtype=raw.dtype), raw)
    raw_top = xp.argmax(raw_clean, axis=1)
    law_top = xp.argmax(laws, axis=1)
    greedy_device = xp.asarray(greedy_rows)
    top_rows = xp.where(greedy_device, raw_top, law_top)
    if form.from_logits:
        raw_reachable = raw_clean > -np.inf
    else:
        raw_reachable = raw_clean > 0
    reachable_rows = xp.where(greedy_device[:, None], raw_reachable, laws > 0)

    target = xp.zeros((n, width + 1, vocab_size), dtype=xp.float64)
    top = xp.zeros((n, width + 1), dtype=xp.int64)
    reachable = xp.zeros((n, width + 1, vocab_size), dtype=bool)
    mask = xp.asarray(valid_target)
    target[mask] = laws
    top[mask] = top_rows
    reachable[mask] = reachable_rows

    valid_host = positions[None, :width] < counts[:, None]
    valid = xp.asarray(valid_host)
    draft_index = np.where(valid_host, starts_draft[requests][:, None] + positions[:width], 0)
    ids_all = batch.draft_token_ids
    draft_ids = xp.where(valid, ids_all[xp.asarray(draft_index)].astype(xp.int64), 0)
    draft = None
    if batch.draft_rows is not None:
        flat_drafts = draft_index[valid_host]
        draft_owner = np.repeat(np.arange(n), counts)
        draft_raw = batch.draft_rows[xp.asarray(flat_drafts)]
        if form.draft_from_logits:
            draft_table = np.asarray(
                request.table.get() if hasattr(request.table, "get") else request.table,
                dtype=np.float64,
            )[requests][draft_owner]
            draft_laws = _surface.law_rows(
                xp.ascontiguousarray(draft_raw), xp.asarray(np.ascontiguousarray(draft_table))
            ).astype(xp.float64)
            greedy_drafts = xp.asarray(greedy[draft_owner])
            if bool(greedy[draft_owner].any()):
                clean = xp.where(
                    xp.isnan(draft_raw), xp.asarray(-np.inf, dtype=draft_raw.dtype), draft_raw
                )
                point = xp.zeros_like(draft_laws)
                point[xp.arange(point.shape[0]), xp.argmax(clean, axis=1)] = 1.0
                draft_laws = xp.where(greedy_drafts[:, None], point, draft_laws)
        else:
            draft_laws = draft_raw.astype(xp.float64)
        draft = xp.zeros((n, width, vocab_size), dtype=xp.float64)
        draft[valid] = draft_laws

    gather = draft_ids[:, :, None]
    p_x = xp.take_along_axis(target[:, :width, :], gather, axis=2)[:, :, 0]
    if draft is None:
        q_x = xp.where(valid, 1.0, 0.0)
    else:
        q_x = xp.take_along_axis(draft, gather, axis=2)[:, :, 0]
    return ChunkLaws(
        requests=requests,
        counts=xp.asarray(counts),
        greedy=xp.asarray(greedy),
        valid=valid,
        draft_ids=draft_ids,
        target=target,
        top=top,
        reachable=reachable,
        draft=draft,
        p_x=p_x,
        q_x=q_x,
        has_bonus_rows=bonus_rows,
    )


