"""The whole sampling surface in the reference: each setting applied whole-vocabulary.

:func:`adjust_logits` applies the row settings of one request (masks and bias, then
penalties), :func:`cut_run` cuts an emitted run at its stop or budget and
:func:`reference_logprobs` computes the logprobs of an emitted run; the reference adapter
:func:`specdec_np._reference.ragged.verify_ragged` calls them (docs/semantics.md, "The whole
sampling surface").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["adjust_logits", "cut_run", "reference_logprobs", "request_setting"]


def request_setting(settings: Any, name: str, b: int, off: Any = None) -> Any:
    """Request ``b``'s entry of a setting given as None, a scalar or one entry per request."""
    value = settings.get(name)
    if value is None:
        return off
    if isinstance(value, (int, float, np.number)):
        return value
    entry = value[b]
    return off if entry is None else entry


def adjust_logits(
    xp: Any, rows: Any, contexts: list[list[int]], settings: Any, b: int,
    bitmask_rows: Any = None,
) -> Any:
    """One request's logits rows with the row settings applied, whole-vocabulary.

    The order (``docs/semantics.md``, "The whole sampling surface"): the logit bias
    (``x + bias`` in the rows' dtype); the masks (allowed ids, bad words, the packed
    bitmask, then the stop tokens while the context is shorter than ``min_tokens`` unless
    nothing else is possible) to ``-inf``; then the repetition penalty over prompt and
    context (``x / r`` where ``x > 0``, ``x * r`` elsewhere, in the dtype), then
    ``x - dtype(frequency * count + presence)`` where the context holds the token
    ``count > 0`` times.

    Parameters
    ----------
    xp : namespace
    rows : float32 or float64 [R, V]
    contexts : list of R lists of int
        Each row's context: the output before this step and the drafts before the row.
    settings : mapping
        The public keywords (``repetition_penalty``, ``logit_bias``, ...), each None, a
        scalar or one entry per request.
    b : int
        The request.
    bitmask_rows : int32 [R, ceil(V / 32)] or None

    Returns
    -------
    array [R, V]
    """
    dtype = rows.dtype
    num_rows, vocab_size = rows.shape
    tokens = xp.arange(vocab_size)
    minus_infinity = xp.asarray(-xp.inf, dtype=dtype)
    prompt = list(request_setting(settings, "prompt_token_ids", b, []))
    bias = request_setting(settings, "logit_bias", b, {})
    allowed = request_setting(settings, "allowed_token_ids", b)
    bad_words = request_setting(settings, "bad_words_token_ids", b, [])
    stops = list(request_setting(settings, "stop_token_ids", b, []))
    min_tokens = int(request_setting(settings, "min_tokens", b, 0))
    repetition = float(request_setting(settings, "repetition_penalty", b, 1.0))
    frequency = float(request_setting(settings, "frequency_penalty", b, 0.0))
    presence = float(request_setting(settings, "presence_penalty", b, 0.0))
    adjusted = []
    for i in range(num_rows):
        x = rows[i, :]
        context = list(contexts[i])
        bias_vector = np.zeros(vocab_size)
        has_bias = np.zeros(vocab_size, dtype=bool)
        for token, value in dict(bias).items():
            bias_vector[int(token)] = float(value)
            has_bias[int(token)] = True
        x = xp.where(xp.asarray(has_bias), x + xp.asarray(bias_vector, dtype=dtype), x)
        masked = xp.zeros(vocab_size, dtype=xp.bool)
        if allowed is not None:
            listed = xp.asarray(np.isin(np.arange(vocab_size), allowed))
            masked = masked | xp.logical_not(listed)
        for word in bad_words:
            word = list(word)
            head = word[:-1]
            if len(head) <= len(context) and context[len(context) - len(head):] == head:
                masked = masked | (tokens == word[-1])
        if bitmask_rows is not None:
            words = xp.take(bitmask_rows[i, :], tokens // 32)
            bits = (words >> xp.astype(tokens % 32, words.dtype)) & 1
            masked = masked | (bits == 0)
        x = xp.where(masked, minus_infinity, x)
        if stops and len(context) < min_tokens:
            is_stop = xp.asarray(np.isin(np.arange(vocab_size), stops))
            if bool(xp.any(xp.logical_not(is_stop) & (x > minus_infinity))):
                x = xp.where(is_stop, minus_infinity, x)
        seen = xp.asarray(np.isin(np.arange(vocab_size), prompt + context))
        r = xp.asarray(repetition, dtype=dtype)
        x = xp.where(seen, xp.where(x > 0, x / r, x * r), x)
        counts = np.bincount(np.asarray(context, dtype=np.int64), minlength=vocab_size)
        host_dtype = np.float32 if dtype == xp.float32 else np.float64
        term = xp.asarray((frequency * counts + presence).astype(host_dtype))
        x = xp.where(xp.asarray(counts > 0), x - term, x)
        adjusted.append(x)
    return xp.stack(adjusted) if adjusted else rows


def cut_run(
    tokens: list[int], length: int, stops: Any, budget: Any
) -> tuple[list[int], int, bool]:
    """An emitted run ``tokens`` (``length`` accepted drafts, then one more) cut at its first
    stop token (kept) or after ``budget`` tokens: (tokens, accepted drafts emitted,
    finished)."""
    emitted = len(tokens)
    finished = False
    for position, token in enumerate(tokens):
        if stops is not None and token in list(stops):
            emitted, finished = position + 1, True
            break
    if budget is not None and emitted >= int(budget):
        emitted, finished = int(budget), True
    return tokens[:emitted], min(length, emitted), finished


def reference_logprobs(
    xp: Any, extras: dict[str, list[Any]], target: Any, raw_target: Any, tokens: list[int],
    max_k: int, count: int, from_logits: bool, settings: tuple[float, ...], filter_order: str,
    process_request_rows: Callable[..., Any],
) -> None:
    """One request's logprobs rows: the processed law of each emitted position's adjusted
    row (the softmax of it for a greedy request, ``settings`` then being off), the raw
    softmax of its row as given, and the ``count`` most likely tokens (ties to the lower
    id)."""
    width = max_k + 1
    processed = np.full(width, np.nan)
    raw = np.full(width, np.nan)
    top_ids = np.full((width, count), -1, dtype=np.int64)
    top_values = np.full((width, count), np.nan)
    if tokens:
        rows = len(tokens)
        if from_logits:
            law = np.asarray(process_request_rows(xp, target[:rows, :], settings, filter_order))
            given = np.asarray(raw_target[:rows, :], dtype=np.float64)
            given = np.where(np.isnan(given), -np.inf, given)
            top = np.max(given, axis=1, keepdims=True)
            top = np.where(np.isfinite(top), top, 0.0)
            with np.errstate(divide="ignore"):
                raw_law = given - top - np.log(np.sum(np.exp(given - top), axis=1, keepdims=True))
        else:
            law = np.asarray(target[:rows, :], dtype=np.float64)
            with np.errstate(divide="ignore"):
                raw_law = np.log(law)
        with np.errstate(divide="ignore"):
            log_law = np.log(law)
        for position, token in enumerate(tokens):
            processed[position] = log_law[position, token]
            raw[position] = raw_law[position, token]
            order = sorted(range(law.shape[1]), key=lambda y: (-law[position, y], y))[:count]
            top_ids[position, : len(order)] = order
            top_values[position, : len(order)] = log_law[position, order]
    extras["logprobs"].append(processed)
    extras["raw_logprobs"].append(raw)
    extras["top_token_ids"].append(top_ids)
    extras["top_logprobs"].append(top_values)
