"""Batch layouts: where each request's rows, ids and uniforms live.

A layout turns the caller's arrays into a :class:`ChainBatch`, the one description the
chain drivers of both backends read: flat target rows ``[T + B, V]``, flat draft rows
``[T, V]`` (or None for point-mass drafts), flat draft ids ``[T]``, bonus ids ``[B]`` and
``draft_offsets [B + 1]`` (request ``b`` owns drafts ``draft_offsets[b] ..
draft_offsets[b + 1]`` and the ``k_b + 1`` target rows from ``draft_offsets[b] + b``).
The verifiers never see the caller's layout; the layout never sees the verifier.

:func:`padded_chain` is the vLLM layout ``[B, k+1, V]``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from . import _backend, _validate

__all__ = ["ChainBatch", "padded_chain"]


class ChainBatch(NamedTuple):
    """Validated, kernel-ready inputs of one verification call over draft chains.

    Attributes
    ----------
    xp : module
        ``numpy`` or ``cupy``.
    device : int or None
        CUDA device id, None on the CPU.
    target_rows : float32 or float64 [T + B, V], C-contiguous
    draft_rows : same dtype [T, V] or None
        None for point-mass drafts.
    draft_token_ids : int32 or int64 [T]
        A private copy: the kernels read it while the caller may write its own.
    bonus_token_ids : same dtype [B]
    draft_offsets : int64 [B + 1]
    batch_size, max_k, vocab_size : int
    num_draft_tokens : int
        ``T``, the drafts this call verifies (the samplers' ``num_draft_tokens``).
    padded_k : int or None
        ``k`` of a padded batch (its ids are reported as ``(row, position)``), else None.
    """

    xp: Any
    device: Any
    target_rows: Any
    draft_rows: Any
    draft_token_ids: Any
    bonus_token_ids: Any
    draft_offsets: Any
    batch_size: int
    max_k: int
    vocab_size: int
    num_draft_tokens: int
    padded_k: int | None

    def id_of(self, request: int, column: int) -> tuple[str, tuple[int, int], int]:
        """``(argument, index, value)`` of column ``column`` of a request's id row (its draft
        ids, then its bonus id), for error messages."""
        start = int(self.draft_offsets[request])
        k_b = int(self.draft_offsets[request + 1]) - start
        if column < k_b:
            return "draft_token_ids", (request, column), int(self.draft_token_ids[start + column])
        return "bonus_token_ids", (request, 0), int(self.bonus_token_ids[request])

    def draft_position_rows(self) -> Any:
        """The target rows of draft positions (every row but each request's bonus row)."""
        xp = self.xp
        if self.padded_k is not None:
            vocab = self.vocab_size
            rows = self.target_rows.reshape(self.batch_size, self.padded_k + 1, vocab)
            return rows[:, : self.padded_k]
        keep = xp.ones(self.target_rows.shape[0], dtype=bool)
        keep[self.draft_offsets[1:] + xp.arange(self.batch_size)] = False
        return self.target_rows[keep]


@functools.lru_cache(maxsize=64)
def _padded_offsets(batch_size: int, k: int) -> np.ndarray:
    offsets = np.arange(0, (batch_size + 1) * k, k, dtype=np.int64)[: batch_size + 1]
    offsets.flags.writeable = False
    return offsets


def padded_chain(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    *,
    strict: bool,
    reads_draft_probs: bool,
) -> ChainBatch:
    """Take the four arguments of the vLLM layout in, check them, make them kernel-ready.

    Always: array types, one backend and device, shapes, dtype families.  In strict mode
    also: exact dtypes (float32, int64) and finite, non-negative probabilities.  Token ids
    are range-checked by the caller before any uniform is drawn, and by the kernels.

    Parameters
    ----------
    target_with_bonus_probs : array [B, k+1, V]
    bonus_token_ids : array [B, 1] or [B]
    draft_probs : array [B, k, V] or None
    draft_token_ids : array [B, k]
    strict : bool
    reads_draft_probs : bool
        False for the verifiers that ignore ``draft_probs`` entirely.

    Returns
    -------
    ChainBatch
    """
    target = _backend.intake(target_with_bonus_probs, "target_with_bonus_probs")
    bonus = _backend.intake(bonus_token_ids, "bonus_token_ids")
    draft_ids = _backend.intake(draft_token_ids, "draft_token_ids")
    probs = (
        _backend.intake(draft_probs, "draft_probs")
        if reads_draft_probs and draft_probs is not None
        else None
    )
    device = _backend.check_one_device(
        {
            "target_with_bonus_probs": target,
            "bonus_token_ids": bonus,
            "draft_token_ids": draft_ids,
            "draft_probs": probs,
        }
    )
    batch_size, k, vocab_size = _validate.check_shapes(target, bonus, probs, draft_ids)
    xp = _backend.array_namespace(target)
    draft_ids, bonus = _backend.token_ids(
        {"draft_token_ids": draft_ids, "bonus_token_ids": bonus}, xp, strict
    )
    target = _backend.probabilities(target, "target_with_bonus_probs", xp, strict)
    if probs is not None:
        probs = _backend.probabilities(probs, "draft_probs", xp, strict)
        _validate.check_same_float_dtype(target.dtype, probs.dtype)
    if strict:
        _validate.check_probability_values("target_with_bonus_probs", target, xp)
        _validate.check_probability_values("draft_probs", probs, xp)
    if xp is np:
        offsets = _padded_offsets(batch_size, k)
    else:
        offsets = xp.arange(0, (batch_size + 1) * k, k, dtype=xp.int64)[: batch_size + 1]
    return ChainBatch(
        xp=xp,
        device=device,
        target_rows=target.reshape(batch_size * (k + 1), vocab_size),
        draft_rows=None if probs is None else probs.reshape(batch_size * k, vocab_size),
        draft_token_ids=draft_ids.reshape(batch_size * k),
        bonus_token_ids=bonus.reshape(batch_size),
        draft_offsets=offsets,
        batch_size=batch_size,
        max_k=k,
        vocab_size=vocab_size,
        num_draft_tokens=batch_size * k,
        padded_k=k,
    )
