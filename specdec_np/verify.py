"""Stateless verifiers: the functions the sampler classes wrap.

Each takes the vLLM arguments, validates them (SPEC 6), runs the fused kernel of the
inputs' backend and returns a :class:`VerificationResult`.  They keep no counters, so an
engine with its own metrics can call them directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from . import _backend, _random, _validate

__all__ = [
    "VerificationResult",
    "create_output",
    "greedy_sample",
    "rejection_sample",
    "typical_acceptance_sample",
]


class VerificationResult(NamedTuple):
    """What a verifier returns.

    Attributes
    ----------
    output_token_ids : int64 [B, k+1]
        Accepted draft prefix, then the recovered or bonus token, then -1 (SPEC 3).
    accepted_lengths : int64 [B]
        Length ``r_b`` of the accepted prefix; row ``b`` emits ``r_b + 1`` tokens.
    num_accepted : int64 [B]
        Positions whose acceptance test passed, counting those after the first rejection
        (vLLM's counter semantics).
    """

    output_token_ids: Any
    accepted_lengths: Any
    num_accepted: Any


def _buffers(batch: _backend.PreparedBatch) -> tuple[Any, Any, Any, Any]:
    xp = batch.xp
    return (
        xp.empty((batch.batch_size, batch.k + 1), dtype=xp.int64),
        xp.empty(batch.batch_size, dtype=xp.int64),
        xp.empty(batch.batch_size, dtype=xp.int64),
        xp.zeros(batch.batch_size, dtype=xp.int64),
    )


def _finish(
    batch: _backend.PreparedBatch, buffers: tuple[Any, Any, Any, Any], reported: int | None
) -> VerificationResult:
    output, accepted_lengths, num_accepted, row_status = buffers
    _validate.raise_for_row_status(
        _backend.first_failed_row(reported, row_status),
        row_status,
        batch.draft_token_ids,
        batch.bonus_token_ids,
        batch.vocab_size,
    )
    return VerificationResult(output, accepted_lengths, num_accepted)


@_backend.on_inputs_device
def rejection_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_probs: Any,
    draft_token_ids: Any,
    *,
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    strict_mode: bool = False,
) -> VerificationResult:
    """Lossless speculative-decoding verification by rejection sampling (SPEC 4.1).

    Position ``i`` is accepted iff ``u_i * q_i(x_i) < p_i(x_i)`` (float64).  At the first
    rejected position ``r`` a token is drawn from ``max(p_r - q_r, 0)`` by inverse CDF (from
    ``p_r`` if that has no mass); if none is rejected the bonus token follows the drafts.
    Every emitted token is distributed exactly as the target.

    Parameters
    ----------
    target_with_bonus_probs : float32 or float64 [B, k+1, V]
        Target probabilities; position ``k`` (the bonus position) is only shape-checked.
    bonus_token_ids : int64 or int32 [B, 1]
    draft_probs : same float dtype [B, k, V] or None
        None means point-mass drafts (n-gram, prompt lookup, argmax drafters).
    draft_token_ids : int64 or int32 [B, k]
    uniforms : float64 [B, k+1], optional
        Explicit uniforms in ``[0, 1)``: columns ``0 .. k-1`` for the acceptance tests,
        column ``k`` for the residual draw.  Excludes the three options below.
    generator : numpy.random.Generator, optional
        Source of the uniforms of rows without a seed; a fresh unseeded generator if None.
    seeded_seqs : dict[int, numpy.random.Generator], optional
        Per-row generators (row index → generator), each consumed by one ``random(k + 1)``.
    counter_seeds : dict[int, tuple[int, int]], optional
        Row index → ``(seed, position)``: counter-based Philox4x32-10 uniforms, a pure
        function of seed, position and draw index (see ``specdec_np.counter_uniforms``).
    strict_mode : bool
        Also check exact dtypes and that every probability is finite and non-negative.

    Returns
    -------
    VerificationResult

    Raises
    ------
    TypeError, ValueError
        On bad input (SPEC 6).  A failed call leaves every generator as it was.
    """
    batch = _backend.prepare_batch(
        target_with_bonus_probs,
        bonus_token_ids,
        draft_probs,
        draft_token_ids,
        strict=strict_mode,
        needs_draft_probs=True,
    )
    sources = _random.RejectionUniforms(
        batch.batch_size,
        batch.k,
        batch.xp,
        uniforms=uniforms,
        generator=generator,
        seeded_seqs=seeded_seqs,
        counter_seeds=counter_seeds,
    )
    snapshot = sources.snapshot()
    buffers = _buffers(batch)
    point_mass = batch.draft_probs is None
    try:
        draws = sources.draw()
        first_bad_row = _backend.kernels_for(batch.device).rejection_sample(
            batch.target_with_bonus_probs,
            batch.target_with_bonus_probs if point_mass else batch.draft_probs,
            point_mass,
            batch.draft_token_ids,
            batch.bonus_token_ids,
            draws,
            *buffers,
            _backend.thread_count(batch.batch_size, 2 * batch.vocab_size),
        )
        return _finish(batch, buffers, first_bad_row)
    except BaseException:
        snapshot.restore()
        raise


@_backend.on_inputs_device
def typical_acceptance_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_token_ids: Any,
    *,
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
    strict_mode: bool = False,
) -> VerificationResult:
    """Typical acceptance (Medusa; lossy by design, SPEC 4.3).

    Position ``i`` is accepted iff ``p_i(x_i) > min(posterior_threshold,
    posterior_alpha * exp(-H_i))`` with ``H_i = -sum_y p_i(y) ln(p_i(y) + 1e-5)``.  At the
    first rejection the target's argmax (first index on ties) is emitted; the bonus token
    if every draft is accepted.  No randomness; inputs need not be normalised.

    Parameters
    ----------
    target_with_bonus_probs : float32 or float64 [B, k+1, V]
    bonus_token_ids : int64 or int32 [B, 1]
    draft_token_ids : int64 or int32 [B, k]
    posterior_threshold, posterior_alpha : float
        Finite and non-negative.
    strict_mode : bool

    Returns
    -------
    VerificationResult
    """
    threshold = _validate.check_posterior("posterior_threshold", posterior_threshold)
    alpha = _validate.check_posterior("posterior_alpha", posterior_alpha)
    batch = _backend.prepare_batch(
        target_with_bonus_probs,
        bonus_token_ids,
        None,
        draft_token_ids,
        strict=strict_mode,
        needs_draft_probs=False,
    )
    buffers = _buffers(batch)
    first_bad_row = _backend.kernels_for(batch.device).typical_acceptance_sample(
        batch.target_with_bonus_probs,
        batch.draft_token_ids,
        batch.bonus_token_ids,
        threshold,
        alpha,
        *buffers,
        _backend.thread_count(batch.batch_size, batch.k * batch.vocab_size),
    )
    return _finish(batch, buffers, first_bad_row)


@_backend.on_inputs_device
def greedy_sample(
    target_with_bonus_probs: Any,
    bonus_token_ids: Any,
    draft_token_ids: Any,
    *,
    strict_mode: bool = False,
) -> VerificationResult:
    """Greedy (temperature 0) verification (SPEC 4.2).

    Position ``i`` is accepted iff ``x_i`` is the first index of the maximum of ``p_i``; at
    the first mismatch the argmax is emitted, the bonus token if all drafts match.  The
    rows must be probability distributions (sum 1 within 1e-3, checked in strict mode):
    a draft with ``p(x) > 0.5005`` is accepted without reading its row.

    Parameters
    ----------
    target_with_bonus_probs : float32 or float64 [B, k+1, V]
    bonus_token_ids : int64 or int32 [B, 1]
    draft_token_ids : int64 or int32 [B, k]
    strict_mode : bool

    Returns
    -------
    VerificationResult
    """
    batch = _backend.prepare_batch(
        target_with_bonus_probs,
        bonus_token_ids,
        None,
        draft_token_ids,
        strict=strict_mode,
        needs_draft_probs=False,
    )
    if strict_mode:
        _validate.check_row_sums(
            "target_with_bonus_probs", batch.target_with_bonus_probs[:, : batch.k], batch.xp
        )
    buffers = _buffers(batch)
    first_bad_row = _backend.kernels_for(batch.device).greedy_sample(
        batch.target_with_bonus_probs,
        batch.draft_token_ids,
        batch.bonus_token_ids,
        *buffers,
        _backend.thread_count(batch.batch_size, batch.k * batch.vocab_size),
    )
    return _finish(batch, buffers, first_bad_row)


@_backend.on_inputs_device
def create_output(
    accepted: Any,
    substitute_token_ids: Any,
    draft_token_ids: Any,
    bonus_token_ids: Any,
    *,
    vocab_size: int | None = None,
) -> VerificationResult:
    """Format verified rows as vLLM's ``_create_output`` does (SPEC 3).

    Row ``b`` gets the drafts before the first False of ``accepted[b]`` (position ``r``),
    then ``substitute_token_ids[b, r]`` (or the bonus id if all are True), then -1.

    Parameters
    ----------
    accepted : bool [B, k]
        Acceptance results; True after a False is allowed and counted in ``num_accepted``.
    substitute_token_ids, draft_token_ids : int64 or int32 [B, k]
    bonus_token_ids : int64 or int32 [B, 1] or [B]
    vocab_size : int, optional
        Ids must lie in ``[0, vocab_size)``; without it they must be non-negative.

    Returns
    -------
    VerificationResult
    """
    accepted = _backend.intake(accepted, "accepted")
    substitute = _backend.intake(substitute_token_ids, "substitute_token_ids")
    draft = _backend.intake(draft_token_ids, "draft_token_ids")
    bonus = _backend.intake(bonus_token_ids, "bonus_token_ids")
    device = _backend.check_one_device(
        {
            "accepted": accepted,
            "substitute_token_ids": substitute,
            "draft_token_ids": draft,
            "bonus_token_ids": bonus,
        }
    )
    xp = _backend.array_namespace(draft)
    batch_size, k = _validate.check_output_shapes(accepted, substitute, draft, bonus)
    if accepted.dtype != xp.bool_:
        raise TypeError(f"accepted must have dtype bool; found {accepted.dtype}")
    for name, ids in (
        ("substitute_token_ids", substitute),
        ("draft_token_ids", draft),
        ("bonus_token_ids", bonus),
    ):
        _validate.check_token_id_dtype(name, ids.dtype, strict=False)
    if not substitute.dtype == draft.dtype == bonus.dtype:
        substitute, draft, bonus = (ids.astype(xp.int64) for ids in (substitute, draft, bonus))
    limit = _validate.check_vocab_size(vocab_size)
    batch = _backend.PreparedBatch(
        xp=xp,
        device=device,
        target_with_bonus_probs=None,
        draft_probs=None,
        draft_token_ids=xp.ascontiguousarray(draft),
        bonus_token_ids=xp.ascontiguousarray(bonus.reshape(batch_size)),
        batch_size=batch_size,
        k=k,
        vocab_size=limit,
    )
    buffers = _buffers(batch)
    first_bad_row = _backend.kernels_for(device).create_output(
        xp.ascontiguousarray(accepted).view(xp.uint8),
        xp.ascontiguousarray(substitute),
        batch.draft_token_ids,
        batch.bonus_token_ids,
        limit,
        *buffers,
    )
    output, accepted_lengths, num_accepted, row_status = buffers
    _validate.raise_for_row_status(
        _backend.first_failed_row(first_bad_row, row_status),
        row_status,
        batch.draft_token_ids,
        batch.bonus_token_ids,
        limit,
        substitute,
    )
    return VerificationResult(output, accepted_lengths, num_accepted)
