"""``verify_ragged`` with one deliberate mistake in the sampling settings each: the negative
controls of the conformance kit's sampling-settings properties.

Each wraps :func:`specdec_np.verify_ragged` (importable as ``broken_surface:<name>`` by
``specdec-np check --verifier``) and gets one setting wrong the way engines have:

* ``settings_without_draft_prefix``: every row's context is the output before the step,
  the drafts before the row left out (penalties fed one token per step; bad words and
  ``min_tokens`` counted without the drafts);
* ``bonus_without_bitmask``: the bonus row's grammar mask dropped;
* ``bias_after_temperature``: the logit bias added to ``logits / temperature``;
* ``stops_not_cut``: the emitted run not cut at a stop token (only at the budget);
* ``logprobs_from_raw_law``: the processed logprobs taken from the raw softmax;
* ``greedy_on_raw_rows``: greedy requests verified on their raw rows, the settings
  ignored.

``FAST`` holds the checks a verifier that takes explicit uniforms alone and logits alone
needs (the probability and seeded-source properties are then skipped), so that each
control runs in well under a second; ``WITHOUT_UNIFORMS`` turns a wrapper into one that
takes a ``generator=`` and no ``uniforms=`` (the Monte Carlo path).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

import specdec_np
from specdec_np._reference import surface as surface_reference

#: The settings that change a row (the others cut the run or report logprobs).
ROW_SETTINGS = ("prompt_token_ids", "output_token_ids", "repetition_penalty",
                "frequency_penalty", "presence_penalty", "logit_bias", "allowed_token_ids",
                "bad_words_token_ids", "min_tokens", "token_bitmask")
#: What a fast control declares it takes: logits and explicit uniforms only.
FAST = {"takes_target_probs": False, "takes_generator": False, "takes_seeded_seqs": False,
        "takes_counter_seeds": False}
#: A control through its own generator only (``uniforms=`` not taken).
WITHOUT_UNIFORMS = {**FAST, "takes_uniforms": False, "takes_generator": True}


class Outcome:
    """A result whose attributes are ``result``'s with ``changes`` on top."""

    def __init__(self, result: Any, **changes: Any) -> None:
        for name in ("output_token_ids", "accepted_lengths", "num_accepted", "finished",
                     "logprobs", "raw_logprobs", "top_token_ids", "top_logprobs"):
            setattr(self, name, getattr(result, name, None))
        for name, value in changes.items():
            setattr(self, name, value)


def wrapping(function: Any, name: str, takes: dict[str, bool] | None = None) -> Any:
    """``function`` (keywords in, result out) as a ``verify_ragged`` lookalike named
    ``name``, declaring the keywords ``takes`` says."""

    @functools.wraps(specdec_np.verify_ragged)
    def verifier(**keywords: Any) -> Any:
        return function(keywords)

    verifier.__name__ = verifier.__qualname__ = name
    for keyword, value in (takes if takes is not None else FAST).items():
        setattr(verifier, keyword, value)
    return verifier


def _requests(keywords: dict) -> list[tuple[int, int, int]]:
    """``(b, k_b, offset of its drafts)`` per request."""
    counts = np.asarray(keywords["num_draft_tokens"]).tolist()
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
    return [(b, int(k), offsets[b]) for b, k in enumerate(counts)]


def _temperatures(keywords: dict) -> np.ndarray:
    value = keywords.get("temperature")
    size = len(keywords["num_draft_tokens"])
    return np.ones(size) if value is None else np.broadcast_to(
        np.asarray(value, dtype=np.float64), (size,)).copy()


def _settings_without_draft_prefix(keywords: dict) -> Any:
    """The row settings applied by the wrapper with each row's context the output before
    the step, then ``verify_ragged`` without them."""
    settings = {name: keywords[name] for name in ROW_SETTINGS if keywords.get(name) is not None}
    if not settings or keywords.get("target_logits") is None:
        return specdec_np.verify_ragged(**keywords)
    target = np.array(keywords["target_logits"], copy=True)
    draft = keywords.get("draft_logits")
    draft = None if draft is None else np.array(draft, copy=True)
    bitmask = settings.get("token_bitmask")
    # Without the drafts the rows depend on the request's rows, masks and settings only:
    # requests that share them (a Monte Carlo batch) are adjusted once.
    done: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}
    for b, k, offset in _requests(keywords):
        rows = slice(offset + b, offset + b + k + 1)
        masks = None if bitmask is None else bitmask[rows]
        key = (target[rows].tobytes(), None if masks is None else masks.tobytes(),
               None if draft is None else draft[offset : offset + k].tobytes(),
               repr([surface_reference.request_setting(settings, name, b)
                     for name in ROW_SETTINGS if name != "token_bitmask"]))
        if key not in done:
            output = list(surface_reference.request_setting(settings, "output_token_ids", b,
                                                            []))
            adjusted = surface_reference.adjust_logits(np, target[rows], [output] * (k + 1),
                                                       settings, b, masks)
            adjusted_draft = None
            if draft is not None and k:
                adjusted_draft = surface_reference.adjust_logits(
                    np, draft[offset : offset + k], [output] * k, settings, b,
                    None if masks is None else masks[:k])
            done[key] = (adjusted, adjusted_draft)
        target[rows], adjusted_draft = done[key]
        if adjusted_draft is not None and draft is not None:
            draft[offset : offset + k] = adjusted_draft
    kept = {name: value for name, value in keywords.items() if name not in ROW_SETTINGS}
    return specdec_np.verify_ragged(**{**kept, "target_logits": target, "draft_logits": draft})


def _bonus_without_bitmask(keywords: dict) -> Any:
    bitmask = keywords.get("token_bitmask")
    if bitmask is None:
        return specdec_np.verify_ragged(**keywords)
    bitmask = np.array(bitmask, copy=True)
    for b, k, offset in _requests(keywords):
        if offset + b + k < bitmask.shape[0]:
            bitmask[offset + b + k] = -1
    return specdec_np.verify_ragged(**{**keywords, "token_bitmask": bitmask})


def _bias_after_temperature(keywords: dict) -> Any:
    """``(x + t b) / t = x / t + b`` for each sampled request; greedy ones keep the bias."""
    bias = keywords.get("logit_bias")
    if bias is None or keywords.get("target_logits") is None:
        return specdec_np.verify_ragged(**keywords)
    temperatures = _temperatures(keywords)
    target = np.array(keywords["target_logits"], copy=True)
    draft = keywords.get("draft_logits")
    draft = None if draft is None else np.array(draft, copy=True)
    kept = list(bias)
    for b, k, offset in _requests(keywords):
        if not bias[b] or temperatures[b] == 0:
            continue
        for token, value in bias[b].items():
            shift = target.dtype.type(temperatures[b] * value)
            target[offset + b : offset + b + k + 1, token] += shift
            if draft is not None:
                draft[offset : offset + k, token] += shift
        kept[b] = None
    return specdec_np.verify_ragged(**{**keywords, "target_logits": target,
                                       "draft_logits": draft, "logit_bias": kept})


def _stops_not_cut(keywords: dict) -> Any:
    """Stop tokens dropped (they are kept only where ``min_tokens`` needs them)."""
    if keywords.get("min_tokens") is not None:
        return specdec_np.verify_ragged(**keywords)
    return specdec_np.verify_ragged(**{**keywords, "stop_token_ids": None})


def _logprobs_from_raw_law(keywords: dict) -> Any:
    result = specdec_np.verify_ragged(**keywords)
    if getattr(result, "raw_logprobs", None) is None:
        return result
    return Outcome(result, logprobs=result.raw_logprobs)


def _greedy_on_raw_rows(keywords: dict) -> Any:
    """The temperature-0 requests' outputs from a call without the row settings."""
    result = specdec_np.verify_ragged(**keywords)
    if not any(keywords.get(name) is not None for name in ROW_SETTINGS):
        return result
    plain = specdec_np.verify_ragged(**{name: value for name, value in keywords.items()
                                        if name not in ROW_SETTINGS})
    greedy = _temperatures(keywords) == 0
    output = np.array(result.output_token_ids, copy=True)
    output[greedy] = plain.output_token_ids[greedy]
    return Outcome(result, output_token_ids=output)


settings_without_draft_prefix = wrapping(_settings_without_draft_prefix,
                                         "settings_without_draft_prefix")
bonus_without_bitmask = wrapping(_bonus_without_bitmask, "bonus_without_bitmask")
bias_after_temperature = wrapping(_bias_after_temperature, "bias_after_temperature")
stops_not_cut = wrapping(_stops_not_cut, "stops_not_cut")
logprobs_from_raw_law = wrapping(_logprobs_from_raw_law, "logprobs_from_raw_law")
greedy_on_raw_rows = wrapping(_greedy_on_raw_rows, "greedy_on_raw_rows")
#: ``settings_without_draft_prefix`` through its generator: the Monte Carlo path.
monte_carlo_without_draft_prefix = wrapping(
    _settings_without_draft_prefix, "monte_carlo_without_draft_prefix", WITHOUT_UNIFORMS)
#: ``verify_ragged`` itself through its generator: the Monte Carlo path's positive control.
monte_carlo_correct = wrapping(lambda keywords: specdec_np.verify_ragged(**keywords),
                               "monte_carlo_correct", WITHOUT_UNIFORMS)
#: ``verify_ragged`` itself, declaring what the fast controls declare.
fast_correct = wrapping(lambda keywords: specdec_np.verify_ragged(**keywords), "fast_correct")
