"""The engine layout's reference adapter: ragged batches on the padded references.

:func:`verify_ragged` runs each request of a flat engine batch through the padded
reference of its method (:mod:`specdec_np._reference.chains`), with the whole sampling
surface of :mod:`specdec_np._reference.surface` applied to its rows, one request at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import registry
from .chains import (
    _namespace,
    _per_request,
    _process_request_rows,
    reference_for,
    residual_draw,
)
from .surface import adjust_logits, cut_run, reference_logprobs, request_setting

__all__ = ["verify_ragged"]


def verify_ragged(
    num_draft_tokens: Any,
    draft_token_ids: Any,
    target_rows: Any,
    draft_rows: Any,
    *,
    method: str,
    from_logits: bool,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    filter_order: str = "vllm",
    bonus_token_ids: Any = None,
    uniforms: Any = None,
    draft_from_logits: bool | None = None,
    settings: Any = None,
    **parameters: float,
) -> Any:
    """The engine layout on the padded references, one request at a time.

    Request ``b`` owns drafts ``o_b .. o_b + k_b - 1`` (``o_b = k_0 + ... + k_{b-1}``),
    target rows ``o_b + b .. o_b + b + k_b`` (its draft positions, then its bonus
    position) and draft rows ``o_b .. o_b + k_b - 1``.  A request with ``temperature ==
    0`` (every request when ``method``'s entry is ``Verifier.greedy``) is verified on its
    raw rows (NaN never wins the argmax) by the greedy reference, or by ``method``'s own
    when its entry is greedy.  Any other request has its
    rows processed by :func:`process_logits` with its own parameters when
    ``from_logits``, and is then verified by ``method``'s registry reference on those
    rows with uniform columns ``0 .. k_b`` (acceptance, then residual); it stops at its
    first rejection.  The bonus token of a request that accepts all ``k_b`` drafts is
    ``bonus_token_ids[b]`` if given; otherwise the argmax of the raw bonus row for a greedy
    request and, for a sampled one, an inverse-CDF draw (:func:`residual_draw`) from the
    processed bonus row at uniform column ``k_b + 1``.  ``k_b = 0`` emits the bonus only.

    Parameters
    ----------
    num_draft_tokens : int [B]
    draft_token_ids : int [T], ``T = sum k_b``
    target_rows : float [T + B, V]
        Logits (``from_logits``) or probabilities taken as processed.
    draft_rows : float [T, V] or None
        In the target's form; None for point-mass drafts.
    method : str
        A registry name.
    from_logits : bool
        The target rows are logits.
    draft_from_logits : bool, optional
        The draft rows are logits (processed like the target's) rather than probabilities
        used as given; ``from_logits`` by default.
    temperature, top_k, top_p, min_p : scalar, [B] or None
        None is off (temperature 1, top-k 0, top-p 1, min-p 0).  With probabilities only
        ``temperature == 0`` matters: it marks greedy requests.
    filter_order : {"vllm", "llama.cpp"}
        The order of the filters (:func:`process_logits`).
    bonus_token_ids : int [B] or None
    uniforms : float64 [B, max_k + 2] or None
        Needed when a request is not greedy.
    settings : mapping, optional
        The whole sampling surface by its public keywords (``output_token_ids``,
        ``repetition_penalty``, ``token_bitmask``, ``stop_token_ids``, ``max_tokens``,
        ``logprobs``, ...): each row of a logits request goes through
        :func:`adjust_logits` with its context (the output, then the drafts before it)
        before the law; a greedy request takes the argmax of its adjusted rows; the
        emitted run is cut by :func:`cut_run`.
    **parameters : float
        The method's parameters.

    Returns
    -------
    output_token_ids : int64 [B, max_k + 1]
        Accepted drafts, then the recovered or bonus token, then -1.
    accepted_lengths : int64 [B]
    extras : dict, only with ``settings``
        ``finished`` bool [B], and with ``logprobs`` the float64 ``logprobs`` and
        ``raw_logprobs`` [B, max_k + 1] and ``top_token_ids`` and ``top_logprobs``
        [B, max_k + 1, N] (NaN and -1 padded).

    Raises
    ------
    ValueError
        If a token must be drawn from a target row without positive probability.
    """
    xp = _namespace(target_rows)
    verifier = registry.get(method)
    greedy_verifier = verifier if verifier.greedy else registry.get("greedy")
    batch_size = num_draft_tokens.shape[0]
    counts = [int(num_draft_tokens[b]) for b in range(batch_size)]
    max_k = max(counts, default=0)
    temperatures = _per_request(xp, temperature, batch_size, 1.0)
    top_ks = _per_request(xp, top_k, batch_size, 0.0)
    top_ps = _per_request(xp, top_p, batch_size, 1.0)
    min_ps = _per_request(xp, min_p, batch_size, 0.0)
    ids = xp.astype(draft_token_ids, xp.int64)
    draft_logits = from_logits if draft_from_logits is None else draft_from_logits
    rows_out: list[list[int]] = []
    accepted_lengths: list[int] = []
    offset = 0
    surface = dict(settings or {})
    bitmask = surface.get("token_bitmask")
    top_count = surface.get("logprobs")
    finished: list[bool] = []
    extras: dict[str, list[Any]] = {"logprobs": [], "raw_logprobs": [], "top_token_ids": [],
                                    "top_logprobs": []}
    for b in range(batch_size):
        k = counts[b]
        greedy = temperatures[b] == 0.0 or verifier is greedy_verifier
        target = target_rows[offset + b : offset + b + k + 1, :]
        raw_target = target
        draft = None if draft_rows is None else draft_rows[offset : offset + k, :]
        request_ids = ids[offset : offset + k]
        if surface and from_logits:
            before = list(request_setting(surface, "output_token_ids", b, []))
            drafted = [int(request_ids[i]) for i in range(k)]
            contexts = [before + drafted[:i] for i in range(k + 1)]
            masks = None if bitmask is None else bitmask[offset + b : offset + b + k + 1, :]
            target = adjust_logits(xp, target, contexts, surface, b, masks)
            if draft is not None and draft_logits:
                draft = adjust_logits(
                    xp, draft, contexts[:k], surface, b, None if masks is None else masks[:k]
                )
        offset += k
        adjusted_target = target
        if greedy:
            # NaN never wins the greedy argmax; -inf is its neutral value.
            target = xp.where(xp.isnan(target), xp.asarray(-xp.inf, dtype=target.dtype), target)
        else:
            settings = (temperatures[b], top_ks[b], top_ps[b], min_ps[b])
            if from_logits:
                target = _process_request_rows(xp, target, settings, filter_order)
            if draft is not None and draft_logits:
                draft = _process_request_rows(xp, draft, settings, filter_order)
        request_uniforms = None if greedy else uniforms[b, : k + 2]
        if k == 0:
            length, tokens = 0, []
        else:
            reference = reference_for(greedy_verifier if greedy else verifier)
            output, length_array, _ = reference(
                target[None, :, :],
                xp.zeros((1,), dtype=xp.int64),
                None if draft is None else draft[None, :, :],
                request_ids[None, :],
                None if greedy else request_uniforms[None, : k + 1],
                **({} if greedy else parameters),
            )
            length = int(length_array[0])
            tokens = [int(output[0, i]) for i in range(length + 1)]
        if length == k:
            if bonus_token_ids is not None:
                bonus = int(bonus_token_ids[b])
            elif greedy:
                bonus = int(xp.argmax(target[k, :]))
            else:
                weights = xp.astype(target[k : k + 1, :], xp.float64)
                bonus = int(residual_draw(weights, request_uniforms[k + 1 : k + 2])[0])
                if bonus < 0:
                    name = "target_logits" if from_logits else "target_probs"
                    raise ValueError(
                        f"{name} row {offset + b} (the bonus position of request {b}) has "
                        "no positive probability"
                    )
            tokens = tokens[:length] + [bonus]
        if surface:
            tokens, length, done = cut_run(
                tokens, length, request_setting(surface, "stop_token_ids", b),
                request_setting(surface, "max_tokens", b),
            )
            finished.append(done)
            if top_count is not None:
                settings_b = (1.0, 0.0, 1.0, 0.0) if greedy else (
                    temperatures[b], top_ks[b], top_ps[b], min_ps[b]
                )
                reference_logprobs(
                    xp, extras, adjusted_target, raw_target, tokens, max_k, int(top_count),
                    from_logits, settings_b, filter_order, _process_request_rows,
                )
        rows_out.append(tokens + [-1] * (max_k + 1 - len(tokens)))
        accepted_lengths.append(length)
    output_token_ids = xp.reshape(
        xp.asarray(rows_out, dtype=xp.int64) if rows_out else xp.zeros((0,), dtype=xp.int64),
        (batch_size, max_k + 1),
    )
    lengths_array = xp.asarray(accepted_lengths, dtype=xp.int64)
    if not surface:
        return output_token_ids, lengths_array
    found: dict[str, Any] = {"finished": np.asarray(finished, dtype=bool)}
    if top_count is not None:
        for name, values in extras.items():
            found[name] = np.asarray(values)
    return output_token_ids, lengths_array, found

