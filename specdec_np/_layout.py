"""Batch layouts: where each request's rows, ids and uniforms live.

A layout turns the caller's arrays into a :class:`ChainBatch`, the one description the
chain drivers of both backends read: flat target rows ``[T + B, V]``, flat draft rows
``[T, V]`` (or None for point-mass drafts), flat draft ids ``[T]``, bonus ids ``[B]`` and
``draft_offsets [B + 1]`` (request ``b`` owns drafts ``draft_offsets[b] ..
draft_offsets[b + 1]`` and the ``k_b + 1`` target rows from ``draft_offsets[b] + b``).
The verifiers never see the caller's layout; the layout never sees the verifier.

:func:`padded_chain` is the vLLM layout ``[B, k+1, V]``; :func:`ragged_chain` is the flat
layout engines use (``num_draft_tokens [B]``, ``k_b >= 0``, rows ``[T + B, V]``).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np

from . import _backend, _contract, _core, _validate

__all__ = ["ChainBatch", "padded_chain", "ragged_chain"]


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
        ``k`` of a padded batch, else None.
    target_name : str
        The target argument's name, for messages.
    index_label : str
        How messages name an id's index: ``(row, position)`` or ``(request, position)``.
    draft_counts : int64 numpy array [B] or None
        Host copy of ``k_b`` for a ragged batch (what ``draft_offsets`` was made from), so
        that callers need not read the offsets back; None for a padded batch.
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
    target_name: str = "target_with_bonus_probs"
    index_label: str = "(row, position)"
    draft_counts: Any = None

    def raise_for_row_status(self, first_bad_row: int, row_status: Any) -> None:
        """The kernel's first failed request as a ``ValueError`` in this layout's terms."""
        _contract.raise_for_row_status(
            first_bad_row,
            row_status,
            self.id_of,
            self.vocab_size,
            target_name=self.target_name,
            index_label=self.index_label,
            row_of=None if self.padded_k is not None else self.flat_row,
        )

    def flat_row(self, request: int, position: int) -> int:
        """The index in ``target_rows`` of a request's row at a draft or bonus position."""
        return int(self.draft_offsets[request]) + request + position

    def raise_for_invalid_id(self, request: int, column: int) -> None:
        """``ValueError`` for the out-of-vocabulary id at ``(request, column)``."""
        _contract.raise_for_invalid_id(
            self.id_of,
            request,
            column,
            self.vocab_size,
            target_name=self.target_name,
            index_label=self.index_label,
        )

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


def kernel_rows(
    target: Any, drafts: Any, target_name: str, draft_name: str, xp: Any, strict: bool
) -> tuple[Any, Any]:
    """Target and draft rows (None: point-mass drafts) as the kernels read them: C-contiguous
    float32 or float64 of one dtype (``_backend.probabilities``)."""
    target = _backend.probabilities(target, target_name, xp, strict)
    if drafts is not None:
        drafts = _backend.probabilities(drafts, draft_name, xp, strict)
        if drafts.dtype != target.dtype:
            raise TypeError(
                f"{draft_name} must have the same dtype as {target_name} ({target.dtype}); "
                f"found {drafts.dtype}"
            )
    return target, drafts


def _draft_counts(num_draft_tokens: Any, xp: Any) -> tuple[np.ndarray, Any, int, int]:
    """``num_draft_tokens`` checked: host int64 counts, the offsets on the device, the
    largest count and ``T``."""
    counts = _backend.intake(num_draft_tokens, "num_draft_tokens")
    if counts.ndim != 1:
        raise ValueError(
            "num_draft_tokens must have shape [B] (1 dimension); found shape "
            f"{_validate.shape_text(counts.shape)}"
        )
    if getattr(counts.dtype, "kind", None) not in ("i", "u"):
        raise TypeError(f"num_draft_tokens must have an integer dtype; found {counts.dtype}")
    host = np.asarray(counts.get() if hasattr(counts, "get") else counts).astype(np.int64)
    offsets = np.empty(host.shape[0] + 1, dtype=np.int64)
    max_k, negative = _core.ragged_offsets(host, offsets)
    if negative >= 0:
        raise ValueError(
            f"num_draft_tokens must be >= 0 for every request; found {int(host[negative])} "
            f"for request {negative}"
        )
    if max_k > np.iinfo(np.int64).max // max(host.shape[0], 1):
        # The offsets may have wrapped around int64: no array is that long anyway.
        raise ValueError(
            "num_draft_tokens must sum to T, the length of draft_token_ids; found sum "
            f"{sum(int(count) for count in host)}"
        )
    return host, offsets if xp is np else xp.asarray(offsets), max_k, int(offsets[-1])


def ragged_chain(
    num_draft_tokens: Any,
    draft_token_ids: Any,
    target_rows: Any,
    draft_rows: Any,
    bonus_token_ids: Any,
    *,
    strict: bool,
    reads_draft_probs: bool,
    target_name: str = "target_probs",
    draft_name: str = "draft_probs",
) -> ChainBatch:
    """Take a flat engine batch in, check it and make it kernel-ready.

    Parameters
    ----------
    num_draft_tokens : int array [B]
        ``k_b >= 0`` drafts per request.
    draft_token_ids : int64 or int32 [T], ``T = sum k_b``
        Request by request.
    target_rows : float32 or float64 [T + B, V]
        Request ``b`` owns ``k_b + 1`` consecutive rows: its draft positions, then its
        bonus position.
    draft_rows : same dtype [T, V] or None
        None for point-mass drafts.
    bonus_token_ids : int [B] or None
        None: each fully accepted request draws its bonus from its bonus row.
    strict : bool
        Also exact dtypes (float32 rows, int64 ids) and finite, non-negative values.
    reads_draft_probs : bool
    target_name, draft_name : str
        The arguments' names in messages (``target_probs`` or ``target_logits``).

    Returns
    -------
    ChainBatch
        With ``padded_k`` None and, when ``bonus_token_ids`` is None, zeros as bonus ids.
    """
    target = _backend.intake(target_rows, target_name)
    draft_ids = _backend.intake(draft_token_ids, "draft_token_ids")
    drafts = (
        _backend.intake(draft_rows, draft_name)
        if reads_draft_probs and draft_rows is not None
        else None
    )
    bonus = None
    if bonus_token_ids is not None:
        bonus = _backend.intake(bonus_token_ids, "bonus_token_ids")
    device = _backend.check_one_device(
        {target_name: target, "draft_token_ids": draft_ids, draft_name: drafts,
         "bonus_token_ids": bonus}
    )
    xp = _backend.array_namespace(target)
    counts, offsets, max_k, total = _draft_counts(num_draft_tokens, xp)
    batch_size = int(counts.shape[0])
    if tuple(draft_ids.shape) != (total,):
        raise ValueError(
            f"draft_token_ids must have shape [T] = [{total}] (T = sum of num_draft_tokens); "
            f"found shape {_validate.shape_text(draft_ids.shape)}"
        )
    if target.ndim != 2 or target.shape[0] != total + batch_size or target.shape[1] < 1:
        raise ValueError(
            f"{target_name} must have shape [T + B, V] = [{total + batch_size}, V] with V >= 1; "
            f"found shape {_validate.shape_text(target.shape)}"
        )
    vocab_size = int(target.shape[1])
    if drafts is not None and tuple(drafts.shape) != (total, vocab_size):
        raise ValueError(
            f"{draft_name} must have shape [T, V] = [{total}, {vocab_size}]; found shape "
            f"{_validate.shape_text(drafts.shape)}"
        )
    if bonus is not None and tuple(bonus.shape) not in ((batch_size,), (batch_size, 1)):
        raise ValueError(
            f"bonus_token_ids must have shape [B] = [{batch_size}]; found shape "
            f"{_validate.shape_text(bonus.shape)}"
        )
    named = {"draft_token_ids": draft_ids}
    if bonus is not None:
        named["bonus_token_ids"] = bonus
    ids = _backend.token_ids(named, xp, strict)
    draft_ids = ids[0]
    if bonus is not None:
        bonus = ids[1].reshape(batch_size)
    else:
        bonus = xp.zeros(batch_size, dtype=draft_ids.dtype)
    target, drafts = kernel_rows(target, drafts, target_name, draft_name, xp, strict)
    return ChainBatch(
        xp=xp,
        device=device,
        target_rows=target,
        draft_rows=drafts,
        draft_token_ids=draft_ids,
        bonus_token_ids=bonus,
        draft_offsets=offsets,
        batch_size=batch_size,
        max_k=max_k,
        vocab_size=vocab_size,
        num_draft_tokens=total,
        padded_k=None,
        target_name=target_name,
        index_label="(request, position)",
        draft_counts=counts,
    )
