"""Drafters for :func:`specdec_np.testing.check_drafting`: one correct, and one deliberate
bug each (the kit's negative controls for the draft side).

Each takes the kit's drafter keywords (``docs/testing.md``, "Checking a drafter") and
returns ``(draft_token_ids [T], draft_probs [T, V])``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import specdec_np


def _positions(num_draft_tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    """The request of each draft row ``[T]``, and the row's position within its request."""
    counts = np.asarray(num_draft_tokens, dtype=np.int64)
    request = np.repeat(np.arange(counts.size), counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return request, np.arange(request.size) - starts[request]


def _processed(draft_logits: Any, request: np.ndarray, temperature: Any, top_k: Any,
               top_p: Any, min_p: Any) -> np.ndarray:
    """Each draft row's law under its request's settings (what the drafter samples)."""
    return np.asarray(specdec_np.processed_probs(
        draft_logits, temperature=np.asarray(temperature)[request],
        top_k=np.asarray(top_k)[request], top_p=np.asarray(top_p)[request],
        min_p=np.asarray(min_p)[request]))


def _own_noise(num_draft_tokens: Any, counter_seeds: dict) -> np.ndarray:
    """One uniform per draft row from the request's ``(seed, counter)`` in the draft
    stream (``stream="draft"``): a Philox domain the verifier never reads."""
    counts = np.asarray(num_draft_tokens, dtype=np.int64)
    if not counts.size:
        return np.zeros(0)
    seeds = [counter_seeds[b][0] for b in range(counts.size)]
    counters = [counter_seeds[b][1] for b in range(counts.size)]
    noise = np.asarray(specdec_np.counter_uniforms(
        seeds, counters, int(counts.max(initial=0)), stream="draft"))
    request, position = _positions(num_draft_tokens)
    return noise[request, position]


def correct(*, num_draft_tokens: Any, draft_logits: Any, temperature: Any, top_k: Any,
            top_p: Any, min_p: Any, counter_seeds: dict) -> tuple[np.ndarray, np.ndarray]:
    """Samples each row's processed law with noise of its own and reports that law."""
    request, _ = _positions(num_draft_tokens)
    rows = _processed(draft_logits, request, temperature, top_k, top_p, min_p)
    ids = specdec_np.sample_tokens(probs=rows, uniforms=_own_noise(num_draft_tokens,
                                                                   counter_seeds))
    return np.asarray(ids), rows


def shared_noise(*, num_draft_tokens: Any, draft_logits: Any, temperature: Any, top_k: Any,
                 top_p: Any, min_p: Any, counter_seeds: dict) -> tuple[np.ndarray, np.ndarray]:
    """The bug: draft position ``i`` drawn by inverse CDF at the verifier's own acceptance
    uniform of position ``i`` (same seed, same counter, same domain: draw ``i`` of
    ``counter_uniforms(seed, counter, k_b + 2)``), the correlation vLLM fixed in #54282."""
    request, position = _positions(num_draft_tokens)
    rows = _processed(draft_logits, request, temperature, top_k, top_p, min_p)
    counts = np.asarray(num_draft_tokens, dtype=np.int64)
    seeds = [counter_seeds[b][0] for b in range(counts.size)]
    counters = [counter_seeds[b][1] for b in range(counts.size)]
    verifier_uniforms = np.asarray(specdec_np.counter_uniforms(
        seeds, counters, int(counts.max(initial=0)) + 2))
    ids = specdec_np.sample_tokens(probs=rows, uniforms=verifier_uniforms[request, position])
    return np.asarray(ids), rows


def raw_softmax_reported(*, num_draft_tokens: Any, draft_logits: Any, temperature: Any,
                         top_k: Any, top_p: Any, min_p: Any,
                         counter_seeds: dict) -> tuple[np.ndarray, np.ndarray]:
    """The bug: samples the processed law (temperature, filters) as :func:`correct` does,
    but reports the raw softmax of the draft logits as the rows it sampled."""
    ids, _ = correct(num_draft_tokens=num_draft_tokens, draft_logits=draft_logits,
                     temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                     counter_seeds=counter_seeds)
    logits = np.asarray(draft_logits, dtype=np.float64)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return ids, weights / weights.sum(axis=1, keepdims=True)
