"""The array-API oracle of every verifier: readable, slow, obviously correct.

Each function works on any namespace that implements the Python array API standard
(NumPy, CuPy, ``array_api_strict``) and computes everything for every position, with none
of the shortcuts of the fast kernels.  The tests compare the kernels against it.

The ``*_decisions`` functions (NumPy, for the tests' knife-edge rule) say how close each
decision of one request lies to its boundary.

Every verifier returns ``(output_token_ids, accepted_lengths, num_accepted)``:
``int64 [B, k+1]`` in the output format of docs/semantics.md §1, the accepted prefix length
``r_b`` ``int64 [B]``, and the number of positions whose acceptance test passed ``int64 [B]``
(all positions, also after the first rejection, as vLLM counts them; block verification,
whose positions are not tested independently, counts its accepted prefix ``tau``).
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple

import numpy as np

from .. import registry
from .._runtime.contract import ENTROPY_EPSILON

__all__ = [
    "block_verification_sample",
    "Decisions",
    "block_verification_decisions",
    "create_output",
    "decisions_for",
    "fast_expf",
    "fmaf",
    "greedy_decisions",
    "greedy_sample",
    "process_logits",
    "reference_for",
    "rejection_decisions",
    "rejection_sample",
    "residual_draw",
    "typical_acceptance_decisions",
    "typical_acceptance_sample",
]


def _namespace(x: Any) -> Any:
    return x.__array_namespace__()


def _gather_draft_probabilities(xp: Any, probs: Any, draft_token_ids: Any) -> Any:
    """``probs[b, i, draft_token_ids[b, i]]`` as float64 ``[B, k]``."""
    k = draft_token_ids.shape[1]
    indices = xp.astype(draft_token_ids, xp.int64)[:, :, None]
    picked = xp.take_along_axis(probs[:, :k, :], indices, axis=2)[:, :, 0]
    return xp.astype(picked, xp.float64)


def _first_index(xp: Any, mask: Any, missing: int) -> Any:
    """Index of the first true entry along the last axis, ``missing`` where none is."""
    first = xp.argmax(xp.astype(mask, xp.int8), axis=-1)
    return xp.where(xp.any(mask, axis=-1), first, xp.asarray(missing, dtype=first.dtype))


def _rows_at(xp: Any, probs: Any, positions: Any) -> Any:
    """``probs[b, positions[b], :]`` as float64 ``[B, V]``."""
    batch_size, _, vocab_size = probs.shape
    indices = xp.broadcast_to(positions[:, None, None], (batch_size, 1, vocab_size))
    return xp.astype(xp.take_along_axis(probs, indices, axis=1)[:, 0, :], xp.float64)


def create_output(
    accepted: Any, substitute_token_ids: Any, draft_token_ids: Any, bonus_token_ids: Any
) -> tuple[Any, Any, Any]:
    """vLLM's ``_create_output``: accepted prefix, then substitute or bonus, then -1.

    Parameters
    ----------
    accepted : bool [B, k]
        Acceptance test results; need not be causal (True after a False is allowed).
    substitute_token_ids, draft_token_ids : int [B, k]
    bonus_token_ids : int [B] or [B, 1]

    Returns
    -------
    output_token_ids : int64 [B, k+1]
    accepted_lengths : int64 [B]
    num_accepted : int64 [B]
    """
    xp = _namespace(draft_token_ids)
    batch_size, k = draft_token_ids.shape
    bonus = xp.reshape(xp.astype(bonus_token_ids, xp.int64), (batch_size,))
    draft = xp.astype(draft_token_ids, xp.int64)
    first_rejected = _first_index(xp, xp.logical_not(accepted), k)
    rejected_clipped = xp.where(first_rejected < k, first_rejected, 0)
    substitute = xp.take_along_axis(
        xp.astype(substitute_token_ids, xp.int64), rejected_clipped[:, None], axis=1
    )[:, 0]
    last_token = xp.where(first_rejected == k, bonus, substitute)
    positions = xp.arange(k + 1, dtype=xp.int64)[None, :]
    padded_draft = xp.concat([draft, xp.zeros((batch_size, 1), dtype=xp.int64)], axis=1)
    limit = first_rejected[:, None]
    minus_one = xp.asarray(-1, dtype=xp.int64)
    output = xp.where(
        positions < limit,
        padded_draft,
        xp.where(positions == limit, last_token[:, None], minus_one),
    )
    num_accepted = xp.sum(xp.astype(accepted, xp.int64), axis=1)
    return output, xp.astype(first_rejected, xp.int64), num_accepted


def residual_draw(weights: Any, v: Any) -> Any:
    """Inverse-CDF draw, one per row: the first index whose float64 running sum exceeds
    ``v * Z`` (``Z`` the row total), the last positive weight if rounding makes that miss,
    -1 for a row without positive weight.

    Parameters
    ----------
    weights : float64 [B, V]
        Non-negative weights (NaN is treated as zero).
    v : float64 [B]

    Returns
    -------
    int64 [B]
    """
    xp = _namespace(weights)
    vocab_size = weights.shape[1]
    positive = weights > 0
    clean = xp.where(positive, weights, 0.0)
    total = xp.sum(clean, axis=1)
    running = xp.cumulative_sum(clean, axis=1)
    crossing = xp.logical_and(running > (v * total)[:, None], positive)
    first = _first_index(xp, crossing, -1)
    last_positive = vocab_size - 1 - _first_index(xp, xp.flip(positive, axis=1), vocab_size)
    token = xp.where(first >= 0, first, last_positive)
    return xp.astype(xp.where(total > 0, token, -1), xp.int64)


def rejection_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    uniforms: Any,
) -> tuple[Any, Any, Any]:
    """Lossless rejection sampling (docs/semantics.md §2.2) with explicit uniforms.

    Parameters
    ----------
    target_with_bonus_probs : float [B, k+1, V]
    bonus_token_ids : int [B] or [B, 1]
    draft_probs : float [B, k, V] or None (point-mass drafts)
    draft_token_ids : int [B, k]
    uniforms : float64 [B, k+1]
        Acceptance uniforms in columns ``0 .. k-1``, residual uniform in column ``k``.

    Returns
    -------
    output_token_ids, accepted_lengths, num_accepted
        As in the module docstring.

    Raises
    ------
    ValueError
        If a draw is needed from a target row without positive probability.
    """
    xp = _namespace(target_with_bonus_probs)
    batch_size, k = draft_token_ids.shape
    vocab_size = target_with_bonus_probs.shape[2]
    p_x = _gather_draft_probabilities(xp, target_with_bonus_probs, draft_token_ids)
    if draft_probs is None:
        q_x = xp.ones_like(p_x)
    else:
        q_x = _gather_draft_probabilities(xp, draft_probs, draft_token_ids)
    accepted = uniforms[:, :k] * q_x < p_x
    first_rejected = _first_index(xp, xp.logical_not(accepted), k)
    position = xp.where(first_rejected < k, first_rejected, 0)
    p_row = _rows_at(xp, target_with_bonus_probs, position)
    if draft_probs is None:
        x_r = xp.take_along_axis(xp.astype(draft_token_ids, xp.int64), position[:, None], axis=1)
        vocabulary = xp.arange(vocab_size, dtype=xp.int64)[None, :]
        q_row = xp.astype(vocabulary == x_r, xp.float64)
    else:
        q_row = _rows_at(xp, draft_probs, position)
    v = uniforms[:, k]
    recovered = residual_draw(p_row - q_row, v)
    fallback = residual_draw(p_row, v)
    recovered = xp.where(recovered >= 0, recovered, fallback)
    needs_draw = first_rejected < k
    if bool(xp.any(xp.logical_and(needs_draw, recovered < 0))):
        raise ValueError("target_with_bonus_probs has a row with no positive probability")
    substitute = xp.broadcast_to(recovered[:, None], (batch_size, k))
    return create_output(accepted, substitute, draft_token_ids, bonus_token_ids)


def typical_acceptance_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_token_ids: Any,
    posterior_threshold: float,
    posterior_alpha: float,
) -> tuple[Any, Any, Any]:
    """Typical acceptance (docs/semantics.md §2.4): accept iff
    p(x) > min(threshold, alpha * exp(-H)).

    Parameters
    ----------
    target_with_bonus_probs : float [B, k+1, V]
        Need not be normalised.
    bonus_token_ids : int [B] or [B, 1]
    draft_token_ids : int [B, k]
    posterior_threshold, posterior_alpha : float

    Returns
    -------
    output_token_ids, accepted_lengths, num_accepted
    """
    xp = _namespace(target_with_bonus_probs)
    k = draft_token_ids.shape[1]
    probs = xp.astype(target_with_bonus_probs[:, :k, :], xp.float64)
    entropy = -xp.sum(probs * xp.log(probs + 1e-5), axis=-1)
    # alpha = 0 gives a zero threshold, also where exp(-H) overflows (0 * inf is NaN).
    scaled = posterior_alpha * xp.exp(-entropy) if posterior_alpha > 0 else xp.zeros_like(entropy)
    threshold = xp.minimum(xp.asarray(posterior_threshold, dtype=xp.float64), scaled)
    p_x = _gather_draft_probabilities(xp, target_with_bonus_probs, draft_token_ids)
    accepted = p_x > threshold
    recovered = xp.argmax(probs, axis=-1)
    return create_output(accepted, recovered, draft_token_ids, bonus_token_ids)


def greedy_sample(
    target_with_bonus_probs: Any, bonus_token_ids: Any, draft_token_ids: Any
) -> tuple[Any, Any, Any]:
    """Greedy verification (docs/semantics.md §2.5): accept while the draft is the target's argmax.

    Parameters
    ----------
    target_with_bonus_probs : float [B, k+1, V]
    bonus_token_ids : int [B] or [B, 1]
    draft_token_ids : int [B, k]

    Returns
    -------
    output_token_ids, accepted_lengths, num_accepted
    """
    xp = _namespace(target_with_bonus_probs)
    k = draft_token_ids.shape[1]
    argmax = xp.argmax(target_with_bonus_probs[:, :k, :], axis=-1)
    accepted = argmax == xp.astype(draft_token_ids, argmax.dtype)
    return create_output(accepted, argmax, draft_token_ids, bonus_token_ids)


def _clean_draft(xp: Any, values: Any) -> Any:
    """Draft probabilities as float64 with negative and NaN entries set to zero."""
    values = xp.astype(values, xp.float64)
    return xp.where(values > 0, values, 0.0)


def _path_weights(xp: Any, p_x: Any, q_x: Any) -> Any:
    """``rho_0 .. rho_k`` of block verification, float64 ``[B, k+1]``.

    ``rho_i = min(1, rho_{i-1} * p / q)`` at the draft token of position ``i - 1``,
    evaluated as 1 when ``rho_{i-1} * p >= q`` so that ``q = 0`` needs no division.  A
    path through a token the target gives probability zero keeps weight zero even where
    ``q`` is zero too: ``0 >= 0`` must not revive it, or a later check could emit that
    token (and for k = 1 the decision would differ from token-wise rejection, which never
    accepts ``p = 0``).  A negative or NaN target entry counts as probability zero.
    """
    batch_size, k = p_x.shape
    rho = [xp.ones((batch_size,), dtype=xp.float64)]
    for i in range(k):
        weighted = rho[i] * p_x[:, i]
        q = q_x[:, i]
        ratio = weighted / xp.where(q > weighted, q, 1.0)
        rho.append(xp.where(weighted > 0, xp.where(weighted >= q, 1.0, ratio), 0.0))
    return xp.stack(rho, axis=1)


def _block_thresholds(
    xp: Any, target_with_bonus_probs: Any, draft_probs: Any, draft_token_ids: Any
) -> tuple[Any, Any]:
    """The weighted residuals ``R_0 .. R_{k-1}`` float64 ``[B, k, V]`` and the thresholds
    ``h_1 .. h_k`` float64 ``[B, k]`` of block verification."""
    k = draft_token_ids.shape[1]
    vocab_size = target_with_bonus_probs.shape[2]
    ids = xp.astype(draft_token_ids, xp.int64)
    p = xp.astype(target_with_bonus_probs[:, :k, :], xp.float64)
    p_x = _gather_draft_probabilities(xp, target_with_bonus_probs, draft_token_ids)
    if draft_probs is None:
        vocabulary = xp.arange(vocab_size, dtype=xp.int64)[None, None, :]
        q = xp.astype(vocabulary == ids[:, :, None], xp.float64)
    else:
        q = _clean_draft(xp, draft_probs)
    q_x = xp.take_along_axis(q, ids[:, :, None], axis=2)[:, :, 0]
    rho = _path_weights(xp, p_x, q_x)
    residual = xp.maximum(rho[:, :k, None] * p - q, 0.0)
    total = xp.sum(residual, axis=2)
    slack = total[:, 1:] + (1.0 - rho[:, 1:k])
    safe = xp.where(slack > 0, slack, 1.0)
    h = xp.concat([xp.where(slack > 0, total[:, 1:] / safe, 1.0), rho[:, k:]], axis=1)
    return residual, h


def _block_emit(
    xp: Any,
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_token_ids: Any,
    residual: Any,
    tau: Any,
    v: Any,
) -> tuple[Any, Any, Any]:
    """Emit the first ``tau`` drafts, then a draw from ``R_tau`` (or ``p_tau``) at ``v``
    or the bonus token; ``tau`` int64 ``[B]``."""
    batch_size, k = draft_token_ids.shape
    vocab_size = target_with_bonus_probs.shape[2]
    position = xp.where(tau < k, tau, 0)
    indices = xp.broadcast_to(position[:, None, None], (batch_size, 1, vocab_size))
    residual_row = xp.take_along_axis(residual, indices, axis=1)[:, 0, :]
    recovered = residual_draw(residual_row, v)
    fallback = residual_draw(_rows_at(xp, target_with_bonus_probs, position), v)
    recovered = xp.where(recovered >= 0, recovered, fallback)
    if bool(xp.any(xp.logical_and(tau < k, recovered < 0))):
        raise ValueError("target_with_bonus_probs has a row with no positive probability")
    accepted = xp.arange(k, dtype=xp.int64)[None, :] < tau[:, None]
    substitute = xp.broadcast_to(recovered[:, None], (batch_size, k))
    return create_output(accepted, substitute, draft_token_ids, bonus_token_ids)


def block_verification_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    uniforms: Any,
) -> tuple[Any, Any, Any]:
    """Block verification (Sun et al., ICLR 2025) with explicit uniforms.

    Every quantity is computed at every position: the path weights ``rho_i``, the
    weighted residuals ``R_i(y) = max(rho_i * p_i(y) - q_i(y), 0)`` with their totals
    ``Z_i``, the thresholds ``h_i = Z_i / (Z_i + 1 - rho_i)`` (1 where the denominator is
    zero) for ``i < k`` and ``h_k = rho_k``.  ``tau`` is the largest ``i`` with
    ``uniforms[:, i - 1] < h_i`` (0 if none); the row emits ``x_0 .. x_{tau-1}``, then a
    draw from ``R_tau`` (from ``p_tau`` if ``Z_tau == 0``) with ``uniforms[:, k]``, or the
    bonus token when ``tau == k``.  See ``docs/semantics.md``.

    Parameters
    ----------
    target_with_bonus_probs : float [B, k+1, V]
    bonus_token_ids : int [B] or [B, 1]
    draft_probs : float [B, k, V] or None (point-mass drafts)
        Negative and NaN entries count as zero.
    draft_token_ids : int [B, k]
    uniforms : float64 [B, k+1]
        ``eta_1 .. eta_k`` in columns ``0 .. k-1``, the residual uniform in column ``k``.

    Returns
    -------
    output_token_ids : int64 [B, k+1]
    accepted_lengths : int64 [B]
        ``tau``.
    num_accepted : int64 [B]
        ``tau`` as well: the accepted positions form a prefix.

    Raises
    ------
    ValueError
        If a draw is needed from a target row without positive probability.
    """
    xp = _namespace(target_with_bonus_probs)
    k = draft_token_ids.shape[1]
    residual, h = _block_thresholds(xp, target_with_bonus_probs, draft_probs, draft_token_ids)
    passes = uniforms[:, :k] < h
    # The largest passing i: the first passing entry counted from the end.
    tau = k - _first_index(xp, xp.flip(passes, axis=1), k)
    return _block_emit(
        xp,
        target_with_bonus_probs,
        bonus_token_ids,
        draft_token_ids,
        residual,
        tau,
        uniforms[:, k],
    )


# ---- the processed law of logits rows ----------------------------------------------------

# The float32 exponential of the kernels, operation for operation (the C version is
# SPECDEC_DEFINE_FAST_EXP in elementwise.h).  Each constant is an exact float32 value,
# written in hexadecimal so that no decimal rounding can differ between the two.
_EXP_CONSTANTS = {
    name: float.fromhex(value)
    for name, value in (
        ("log2_e", "0x1.715476p+0"),
        ("round", "0x1.8p+23"),
        ("minus_ln2_high", "-0x1.63p-1"),
        ("minus_ln2_low", "0x1.bd0106p-13"),
        ("q4", "0x1.6a243ap-10"),
        ("q3", "0x1.1239ep-7"),
        ("q2", "0x1.5558f2p-5"),
        ("q1", "0x1.555492p-3"),
        ("q0", "0x1.fffffcp-2"),
    )
}
_EXP_LOWEST, _EXP_HIGHEST = -104.0, 88.0
# 2^n for the two halves of the exponent: exact powers of two, so the result rounds once.
_EXP_HALF_LOWEST, _EXP_HALF_HIGHEST = -76, 64


def fmaf(a: Any, b: Any, c: Any) -> Any:
    """``a * b + c`` on float32 arrays, rounded once (C's ``fmaf``), with float64 arithmetic.

    The product of two float32 values is exact in float64, and the float64 sum ``s`` and
    its rounding error ``e`` are exact by TwoSum.  Rounding ``s`` to float32 is then the
    correctly rounded result, except where ``s`` lies exactly halfway between two float32
    values while ``e`` is not 0 (the double rounding of a sum): there the exact value is on
    ``e``'s side of the midpoint, and the neighbour on that side is the answer.

    Parameters
    ----------
    a, b, c : float32 arrays (broadcastable)

    Returns
    -------
    float32 array
    """
    xp = _namespace(a)
    product = xp.astype(a, xp.float64) * xp.astype(b, xp.float64)
    addend = xp.astype(c, xp.float64)
    total = product + addend
    from_addend = total - product
    error = (product - (total - from_addend)) + (addend - from_addend)
    rounded = xp.astype(total, xp.float32)
    rounded_wide = xp.astype(rounded, xp.float64)
    # Halfway: the reflection of the rounded value through s is a float32 value too.
    other_wide = 2.0 * total - rounded_wide
    other = xp.astype(other_wide, xp.float32)
    halfway = (total != rounded_wide) & (xp.astype(other, xp.float64) == other_wide)
    toward_error = xp.where(error > 0.0, xp.maximum(rounded, other), xp.minimum(rounded, other))
    return xp.where(halfway & (error != 0.0), toward_error, rounded)


def fast_expf(x: Any) -> Any:
    """The specified float32 exponential that defines ``w`` for float32 rows.

    ``exp(x) = 2^n exp(r)`` with ``n = round(x / ln 2)``, ``r = x - n ln 2`` (ln 2 in two
    parts) and ``exp(r) = 1 + r + r^2 Q(r)``, seven of the operations fused multiply-adds
    (:func:`fmaf`); ``2^n`` is applied as two powers of two so that a subnormal result
    rounds once (docs/semantics.md, "The exponential").

    Parameters
    ----------
    x : float32 array, any shape

    Returns
    -------
    float32 array, same shape
        ``exp(x)``; 0 where ``x < -104``, ``x == -inf`` or ``x`` is NaN; ``x > 88`` is
        clamped to 88.
    """
    xp = _namespace(x)
    c = {name: xp.asarray(value, dtype=xp.float32) for name, value in _EXP_CONSTANTS.items()}
    keep = x >= _EXP_LOWEST
    lowest = xp.asarray(_EXP_LOWEST, dtype=xp.float32)
    highest = xp.asarray(_EXP_HIGHEST, dtype=xp.float32)
    clamped = xp.where(keep, xp.where(x > highest, highest, x), lowest)
    n_float = fmaf(clamped, c["log2_e"], c["round"]) - c["round"]
    r = fmaf(n_float, c["minus_ln2_high"], clamped)
    r = fmaf(n_float, c["minus_ln2_low"], r)
    q = fmaf(r, c["q4"], c["q3"])
    q = fmaf(q, r, c["q2"])
    q = fmaf(q, r, c["q1"])
    q = fmaf(q, r, c["q0"])
    mantissa = xp.asarray(1.0, dtype=xp.float32) + fmaf(r * r, q, r)
    n = xp.astype(n_float, xp.int32)
    n_low = xp.floor_divide(n, 2)
    n_high = n - n_low
    powers = xp.asarray(
        [2.0**e for e in range(_EXP_HALF_LOWEST, _EXP_HALF_HIGHEST + 1)], dtype=xp.float32
    )

    def power(e: Any) -> Any:
        flat = xp.reshape(xp.astype(e - _EXP_HALF_LOWEST, xp.int64), (-1,))
        return xp.reshape(xp.take(powers, flat), e.shape)

    result = (mantissa * power(n_low)) * power(n_high)
    return xp.where(keep, result, xp.zeros_like(result))


def _top_k_floor(xp: Any, values: Any, top_k: Any) -> Any:
    """[R, 1]: the ``top_k``-th largest of ``values`` per row (the smallest for 0 or >= V)."""
    num_rows, vocab_size = values.shape
    k = xp.astype(top_k, xp.int64)
    k = xp.where((k <= 0) | (k >= vocab_size), xp.asarray(vocab_size, dtype=xp.int64), k)
    descending = xp.flip(xp.sort(values, axis=1), axis=1)
    return xp.take_along_axis(descending, xp.reshape(k - 1, (num_rows, 1)), axis=1)


def _top_p_kept(xp: Any, values: Any, w: Any, kept: Any, top_p: Any) -> Any:
    """bool [R, V]: what top-p keeps of ``kept``, the smallest most probable prefix
    (``values`` descending, weights ``w``) whose mass reaches ``top_p`` of the kept mass,
    then the whole tie group of its last token; every entry where ``top_p`` is 1."""
    num_rows, vocab_size = values.shape
    top_p_column = xp.reshape(xp.astype(top_p, xp.float64), (num_rows, 1))
    kept_w = xp.where(kept, w, xp.zeros_like(w))
    target = top_p_column * xp.sum(kept_w, axis=1, keepdims=True)
    order = xp.flip(xp.argsort(values, axis=1, stable=True), axis=1)
    ordered_w = xp.take_along_axis(kept_w, order, axis=1)
    cumulative = xp.cumulative_sum(ordered_w, axis=1)
    reached = (cumulative >= target) & (ordered_w > 0.0)
    first = xp.argmax(xp.astype(reached, xp.int8), axis=1, keepdims=True)
    # Rounding can leave the full sum a hair short of top_p * total only for top_p within
    # an ulp of 1; the last token with mass is then the one that reaches it.
    last_with_mass = (vocab_size - 1) - xp.argmax(
        xp.astype(xp.flip(ordered_w > 0.0, axis=1), xp.int8), axis=1, keepdims=True
    )
    first = xp.where(xp.any(reached, axis=1, keepdims=True), first, last_with_mass)
    cutoff = xp.take_along_axis(xp.take_along_axis(values, order, axis=1), first, axis=1)
    return (values >= cutoff) | xp.logical_not(top_p_column < 1.0)


def _weights(xp: Any, values: Any, skip: Any) -> Any:
    """float64 ``w = exp(values - max values)`` per row (:func:`fast_expf` for float32
    rows, ``exp`` for float64 rows): 0 for -inf, and on the rows where ``skip`` [R, 1]
    holds (their +inf entries make them uniform)."""
    top = xp.max(values, axis=1, keepdims=True)
    finite_top = xp.where(xp.isfinite(top), top, xp.zeros_like(top))
    x = xp.where(skip, xp.asarray(-xp.inf, dtype=values.dtype), values - finite_top)
    if values.dtype == xp.float32:
        return xp.astype(fast_expf(x), xp.float64)
    return xp.exp(x)


def _min_p_kept(xp: Any, w: Any, min_p: Any) -> Any:
    """bool [R, V]: ``w >= min_p`` (``w = p / max p``, 1 at the maximum); all for 0."""
    min_p_column = xp.reshape(xp.astype(min_p, xp.float64), (w.shape[0], 1))
    return (w >= min_p_column) | (min_p_column <= 0.0)


def _llama_cpp_kept(
    xp: Any, logits: Any, t_column: Any, z: Any, present: Any, skip: Any, top_k: Any,
    top_p: Any, min_p: Any,
) -> Any:
    """llama.cpp's kept set: top-k, top-p over what top-k kept, then min-p, all on the
    logits at temperature 1; at the temperature, every token whose ``z`` reaches the ``z``
    of the lowest logit they kept (a token whose ``z`` ties with it is kept too)."""
    values = xp.where(present, logits, xp.asarray(-xp.inf, dtype=logits.dtype))
    w1 = _weights(xp, values, skip)
    kept = present & (values >= _top_k_floor(xp, values, top_k))
    kept = kept & _top_p_kept(xp, values, w1, kept, top_p)
    kept = kept & _min_p_kept(xp, w1, min_p)
    infinity = xp.asarray(xp.inf, dtype=values.dtype)
    lowest = xp.min(xp.where(kept, values, infinity), axis=1, keepdims=True)
    return present & (z >= lowest / t_column)


def _processed_law(
    logits: Any, temperature: Any, top_k: Any, top_p: Any, min_p: Any,
    filter_order: str = "vllm",
) -> tuple[Any, Any, Any]:
    """(probabilities float64 [R, V], kept bool [R, V], no_mass bool [R]) of the rows."""
    xp = _namespace(logits)
    dtype = logits.dtype
    num_rows, vocab_size = logits.shape
    minus_infinity = xp.asarray(-xp.inf, dtype=dtype)
    t_column = xp.reshape(xp.astype(temperature, dtype), (num_rows, 1))
    z = logits / t_column
    is_nan = xp.isnan(z)
    z = xp.where(is_nan, minus_infinity, z)
    z_max = xp.max(z, axis=1, keepdims=True)
    infinite = z == xp.inf
    num_infinite = xp.sum(xp.astype(infinite, xp.int64), axis=1, keepdims=True)
    no_mass = xp.logical_not(z_max > -xp.inf)[:, 0]
    has_infinite = num_infinite > 0
    # Rows with +inf entries follow the uniform rule below; keep exp away from them.
    w = _weights(xp, z, has_infinite)
    present = xp.logical_not(is_nan)
    if filter_order == "llama.cpp":
        kept = _llama_cpp_kept(
            xp, logits, t_column, z, present, has_infinite, top_k, top_p, min_p
        )
    else:
        kept = present & _min_p_kept(xp, w, min_p)
        # top-k: z at least the K-th largest z, ties kept; 0 or >= V keeps every z.
        kept = kept & (z >= _top_k_floor(xp, z, top_k))
        kept = kept & _top_p_kept(xp, z, w, kept, top_p)
    kept_w = xp.where(kept, w, xp.zeros_like(w))
    normaliser = xp.sum(kept_w, axis=1, keepdims=True)
    safe = xp.where(normaliser > 0.0, normaliser, xp.ones_like(normaliser))
    probabilities = kept_w / safe
    # A row with +inf entries is uniform over them, whatever the filters.
    uniform = xp.astype(infinite, xp.float64) / xp.astype(
        xp.where(has_infinite, num_infinite, xp.ones_like(num_infinite)), xp.float64
    )
    probabilities = xp.where(has_infinite, uniform, probabilities)
    kept = xp.where(has_infinite, infinite, kept)
    no_mass_column = xp.reshape(no_mass, (num_rows, 1))
    probabilities = xp.where(no_mass_column, xp.zeros_like(probabilities), probabilities)
    kept = kept & xp.logical_not(no_mass_column)
    return probabilities, kept, no_mass


def process_logits(
    logits: Any, temperature: Any, top_k: Any, top_p: Any, min_p: Any,
    filter_order: str = "vllm",
) -> Any:
    """The processed distribution of logits rows: temperature, min-p, top-k, top-p.

    The law (``docs/semantics.md`` §12), computed literally with a full sort: ``z = logits
    / temperature`` in the rows' dtype (NaN counts as -inf and is never kept); ``w = exp(z
    - max z)`` (:func:`fast_expf` for float32 rows, ``exp`` for float64 rows) in float64;
    in vLLM's order min-p keeps ``w >= min_p``, top-k keeps ``z >=`` the ``top_k``-th
    largest ``z`` (ties kept), top-p keeps the smallest set of most probable tokens whose
    ``w`` reaches ``top_p`` times the ``w`` that min-p and top-k kept, and every token tied
    with its last one.  In llama.cpp's order top-k, top-p (over top-k's set) and min-p
    select in the same way on the logits and ``exp(logits - max logits)`` (temperature 1),
    and the law keeps every token whose ``z`` reaches that of the lowest logit they kept.
    ``p = w / sum(w)`` over what is kept.  A row with ``+inf`` entries of ``z`` is uniform
    over them; a row without a finite maximum has no mass and comes back all zero.

    Parameters
    ----------
    logits : float32 or float64 [R, V]
    temperature : float [R]
        Positive.
    top_k : int [R]
        ``0`` or ``>= V`` is off.
    top_p : float [R]
        In ``(0, 1]``; ``1`` is off.
    min_p : float [R]
        In ``[0, 1]``; ``0`` is off.
    filter_order : {"vllm", "llama.cpp"}

    Returns
    -------
    float64 [R, V]
    """
    return _processed_law(logits, temperature, top_k, top_p, min_p, filter_order)[0]


# ---- the engine layout: ragged batches of logits or probabilities -------------------------


def _per_request(xp: Any, value: Any, batch_size: int, off: float) -> list[float]:
    """A scalar, a ``[B]`` array or None (``off``) as B Python floats."""
    if value is None:
        return [off] * batch_size
    values = xp.reshape(xp.astype(xp.asarray(value), xp.float64), (-1,))
    if values.shape[0] == 1:
        return [float(values[0])] * batch_size
    return [float(values[b]) for b in range(batch_size)]


def _process_request_rows(
    xp: Any, rows: Any, settings: tuple[float, ...], filter_order: str = "vllm"
) -> Any:
    """:func:`process_logits` of one request's rows, with its (temperature, top-k, top-p,
    min-p) on every row."""
    temperature, top_k, top_p, min_p = (
        xp.full((rows.shape[0],), value, dtype=xp.float64) for value in settings
    )
    return process_logits(
        rows, temperature, xp.astype(top_k, xp.int64), top_p, min_p, filter_order
    )


def reference_for(verifier: Any) -> Any:
    """A registry verifier's reference, called as ``reference(target_with_bonus_probs,
    bonus_token_ids, draft_probs, draft_token_ids, uniforms, **parameters)`` whatever the
    verifier reads, returning ``(output_token_ids, accepted_lengths, num_accepted)``.

    Parameters
    ----------
    verifier : specdec_np.registry.Verifier
    """
    function = getattr(sys.modules[__name__], verifier.reference_name)
    if verifier.stochastic:
        return function

    def deterministic(target, bonus, draft_probs, draft_ids, uniforms=None, **parameters):
        values = [parameters.get(p.name, p.default) for p in verifier.parameters]
        return function(target, bonus, draft_ids, *values)

    return deterministic


class Decisions(NamedTuple):
    """How close each decision of one request is to its boundary (the checks' knife-edge
    rule): where two correct implementations round differently they may decide differently
    only there.

    Attributes
    ----------
    margins : float64 [k]
        Position ``i``'s distance from its boundary, relative to the size of the rounding
        of the rows' values that could move it (a position is on a knife edge when its
        margin is at most the relative rounding ``delta`` of the comparison, plus its
        floor); ``inf`` for an exact decision.
    floors : float64 [k]
        The rounding of the verifier's own arithmetic at position ``i`` (typical
        acceptance's entropy), in the units of ``margins``.
    rho : float64 [k + 1]
        The residual's scale of the target row at each position: the draw after a
        rejection at ``r`` weighs ``max(rho_r p_r - q_r, 0)``.
    residual_rounding : float
        How much a relative rounding ``delta`` of the rows can move a residual weight,
        relative to the row's mass, in units of ``delta``.
    """

    margins: Any
    floors: Any
    rho: Any
    residual_rounding: float = 4.0

    def knife_edge(self, delta: float, upto: int | None = None) -> bool:
        """Whether a decision at a position below ``upto`` (all of them by default) lies
        within relative rounding ``delta`` of its boundary."""
        margins, floors = self.margins[:upto], self.floors[:upto]
        return bool(np.any(margins <= delta + floors))


def _relative_distance(a: Any, b: Any) -> Any:
    """``|a - b| / (|a| + |b|)``, 0 where both are 0 (a tie is always a knife edge)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = np.abs(a) + np.abs(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(scale > 0, np.abs(a - b) / np.where(scale > 0, scale, 1.0), 0.0)


def _request_rows(target_rows: Any, draft_rows: Any, draft_ids: Any) -> tuple[Any, Any, Any]:
    """float64 p ``[k + 1, V]``, clean q ``[k, V]`` (one-hot for point-mass drafts) and
    int64 ids ``[k]`` of one request."""
    p = np.asarray(target_rows, dtype=np.float64)
    ids = np.asarray(draft_ids, dtype=np.int64)
    if draft_rows is None:
        q = np.zeros((ids.shape[0], p.shape[1]))
        q[np.arange(ids.shape[0]), ids] = 1.0
    else:
        q = np.asarray(draft_rows, dtype=np.float64)
        q = np.where(q > 0, q, 0.0)
    return p, q, ids


def rejection_decisions(
    target_rows: Any, draft_rows: Any, draft_ids: Any, uniforms: Any, **parameters: float
) -> Decisions:
    """:class:`Decisions` of token-wise rejection: position ``i`` compares ``u_i q(x_i)``
    with ``p(x_i)``; the residual is unscaled.

    Parameters
    ----------
    target_rows : float [k + 1, V]
    draft_rows : float [k, V] or None
    draft_ids : int [k]
    uniforms : float64 [>= k]
    **parameters : float
        None for this verifier.
    """
    p, q, ids = _request_rows(target_rows, draft_rows, draft_ids)
    k = ids.shape[0]
    positions = np.arange(k)
    u = np.asarray(uniforms, dtype=np.float64)[:k]
    margins = _relative_distance(u * q[positions, ids], p[positions, ids])
    return Decisions(margins, np.zeros(k), np.ones(k + 1))


def block_verification_decisions(
    target_rows: Any, draft_rows: Any, draft_ids: Any, uniforms: Any, **parameters: float
) -> Decisions:
    """:class:`Decisions` of block verification: the path weights (``rho_j p(x_j)`` against
    ``q(x_j)``, which sets ``rho`` to 1) and the checks ``eta_i < h_i``, each with the
    growth of its rounding along the chain; ``rho`` is the path's weights.  Arguments as
    :func:`rejection_decisions`."""
    p, q, ids = _request_rows(target_rows, draft_rows, draft_ids)
    k = ids.shape[0]
    positions = np.arange(k)
    p_x, q_x = p[positions, ids], q[positions, ids]
    rho = _path_weights(np, p_x[None, :], q_x[None, :])[0]
    u = np.asarray(uniforms, dtype=np.float64)[:k]
    residual = np.maximum(rho[:k, None] * p[:k] - q, 0.0)
    total = residual.sum(axis=1)
    growth = 4.0 * (k + 1)
    path = np.where(rho[:k] > 0, _relative_distance(rho[:k] * p_x, q_x) / growth, np.inf)
    checks = np.empty(k)
    floors = np.zeros(k)
    for i in range(1, k + 1):
        if i == k:
            h, unit = rho[k], growth * rho[k]
        else:
            slack = total[i] + 1.0 - rho[i]
            h = total[i] / slack if slack > 0 else 1.0
            unit = 2.0 * growth * (1.0 + total[i]) / slack**2 if slack > 0 else 0.0
        distance = abs(u[i - 1] - h)
        checks[i - 1] = distance / unit if unit > 0 else (np.inf if distance > 0 else 0.0)
        floors[i - 1] = 1e-15 / unit if unit > 0 else 0.0
    # A rounding at position j moves every later rho, so a check sees the path before it.
    margins = np.minimum(checks, np.minimum.accumulate(path))
    return Decisions(margins, floors, rho, 2.0 * growth)


def typical_acceptance_decisions(
    target_rows: Any,
    draft_rows: Any,
    draft_ids: Any,
    uniforms: Any = None,
    *,
    posterior_threshold: float = registry.get("typical").parameter_defaults[0],
    posterior_alpha: float = registry.get("typical").parameter_defaults[1],
) -> Decisions:
    """:class:`Decisions` of typical acceptance: ``p(x_i)`` against
    ``min(threshold, alpha exp(-H_i))``; the floor is the rounding of the entropy (a float32
    logarithm per entry for float32 rows, as the kernels take it).  Arguments as
    :func:`rejection_decisions`, with the verifier's two parameters."""
    p, _, ids = _request_rows(target_rows, None, draft_ids)
    k = ids.shape[0]
    # The entropy's own rounding: float32 logarithms for float32 rows, else float64 sums.
    if np.asarray(target_rows).dtype == np.float32:
        per_unit = 1e-6
    else:
        per_unit = (p.shape[1] + 8) * 2.3e-16
    margins = np.empty(k)
    floors = np.empty(k)
    for i in range(k):
        row = p[i]
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = row * np.log(row + ENTROPY_EPSILON)
        entropy = -terms.sum()
        scaled = posterior_alpha * math.exp(-entropy) if posterior_alpha > 0 else 0.0
        limit = min(posterior_threshold, scaled)
        margins[i] = _relative_distance(row[ids[i]], limit) / 2.0
        floors[i] = per_unit * (row.sum() + np.abs(terms).sum()) / 2.0
    return Decisions(margins, floors, np.ones(k + 1))


def greedy_decisions(
    target_rows: Any, draft_rows: Any, draft_ids: Any, uniforms: Any = None, **parameters: float
) -> Decisions:
    """:class:`Decisions` of greedy verification: comparisons of raw values, exact
    everywhere."""
    k = np.asarray(draft_ids).shape[0]
    return Decisions(np.full(k, np.inf), np.zeros(k), np.ones(k + 1))


def decisions_for(verifier: Any) -> Any:
    """A registry verifier's :class:`Decisions` function, called as ``decisions(target_rows
    [k + 1, V], draft_rows [k, V] or None, draft_ids [k], uniforms [>= k],
    **parameters)``.

    Parameters
    ----------
    verifier : specdec_np.registry.Verifier
    """
    return getattr(sys.modules[__name__], verifier.decisions_name)

