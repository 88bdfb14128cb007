"""The array-API oracle of every verifier: readable, slow, obviously correct.

Each function works on any namespace that implements the Python array API standard
(NumPy, CuPy, ``array_api_strict``) and computes everything for every position, with none
of the shortcuts of the fast kernels.  The tests compare the kernels against it.

Every verifier returns ``(output_token_ids, accepted_lengths, num_accepted)``:
``int64 [B, k+1]`` in the output format of SPEC 3, the accepted prefix length ``r_b``
``int64 [B]``, and the number of positions whose acceptance test passed ``int64 [B]``
(all positions, also after the first rejection, as vLLM counts them; block verification,
whose positions are not tested independently, counts its accepted prefix ``tau``).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "block_verification_sample",
    "create_output",
    "greedy_sample",
    "rejection_sample",
    "residual_draw",
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
    """Lossless rejection sampling (SPEC 4.1) with explicit uniforms.

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
    """Typical acceptance (SPEC 4.3): accept iff p(x) > min(threshold, alpha * exp(-H)).

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
    """Greedy verification (SPEC 4.2): accept while the draft is the target's argmax.

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
