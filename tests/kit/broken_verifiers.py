"""Rejection verifiers with one deliberate bug each: the conformance kit's negative controls.

``numpy_rejection(..., bug=...)`` is a small vectorised rejection sampler written for these
tests; each module-level function below is it with one bug, importable as
``broken_verifiers:<name>`` by the ``specdec-np check --verifier`` tests.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

import numpy as np

import specdec_np

BUGS = (
    "always_accept",
    "reused_uniform",
    "less_equal",
    "token0_fallback",
    "wrong_row",
    "point_mass_on_sampled",
)


def numpy_rejection(
    target_with_bonus_probs: np.ndarray,
    bonus_token_ids: np.ndarray,
    draft_probs: np.ndarray | None,
    draft_token_ids: np.ndarray,
    *,
    uniforms: np.ndarray,
    bug: str | None = None,
) -> np.ndarray:
    """Token-wise rejection sampling with explicit uniforms, optionally with one bug."""
    target = np.asarray(target_with_bonus_probs, dtype=np.float64)
    ids = np.asarray(draft_token_ids, dtype=np.int64)
    batch_size, k = ids.shape
    vocab_size = target.shape[2]
    rows = np.arange(batch_size)
    if draft_probs is None:
        q = np.zeros((batch_size, k, vocab_size))
        q[rows[:, None], np.arange(k)[None, :], ids] = 1.0
    else:
        q = np.asarray(draft_probs, dtype=np.float64)
    positions = np.arange(k)[None, :]
    p_x = target[rows[:, None], positions, ids]
    q_x = q[rows[:, None], positions, ids]
    u = uniforms[:, :k]
    if bug == "always_accept":
        accepted = np.ones_like(u, dtype=bool)
    elif bug == "less_equal":
        accepted = u * q_x <= p_x
    elif bug == "point_mass_on_sampled":
        accepted = u < p_x
    else:
        accepted = u * q_x < p_x
    rejected = ~accepted
    first = np.where(rejected.any(axis=1), rejected.argmax(axis=1), k)
    at = np.minimum(first, k - 1)
    row_of_residual = (at + 1) % k if bug == "wrong_row" else at
    p_r = target[rows, row_of_residual]
    if bug == "point_mass_on_sampled":
        residual = p_r.copy()
        residual[rows, ids[rows, at]] = 0.0
    else:
        residual = np.maximum(p_r - q[rows, row_of_residual], 0.0)
    total = residual.sum(axis=1)
    empty = total == 0
    if bug != "token0_fallback":
        residual[empty] = p_r[empty]
        total = residual.sum(axis=1)
    v = u[rows, at] if bug == "reused_uniform" else uniforms[:, k]
    cdf = np.cumsum(residual, axis=1)
    if bug == "less_equal":
        above = cdf >= (v * total)[:, None]
    else:
        above = cdf > (v * total)[:, None]
    last_positive = vocab_size - 1 - np.argmax(residual[:, ::-1] > 0, axis=1)
    recovered = np.where(above.any(axis=1), above.argmax(axis=1), last_positive)
    if bug == "token0_fallback":
        recovered = np.where(empty, 0, recovered)
    output = np.full((batch_size, k + 1), -1, dtype=np.int64)
    keep = positions < first[:, None]
    output[:, :k] = np.where(keep, ids, -1)
    last = np.where(first == k, np.asarray(bonus_token_ids).reshape(batch_size), recovered)
    output[rows, first] = last
    return output


def correct(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *, uniforms: Any) -> Any:
    """The same sampler without a bug (the kit must pass it)."""
    return numpy_rejection(target, bonus, draft_probs, draft_ids, uniforms=uniforms)


def _with_bug(bug: str) -> Any:
    def verifier(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                 uniforms: Any) -> Any:
        return numpy_rejection(target, bonus, draft_probs, draft_ids, uniforms=uniforms,
                               bug=bug)

    verifier.__name__ = verifier.__qualname__ = bug
    return verifier


always_accept = _with_bug("always_accept")
reused_uniform = _with_bug("reused_uniform")
less_equal = _with_bug("less_equal")
token0_fallback = _with_bug("token0_fallback")
wrong_row = _with_bug("wrong_row")
point_mass_on_sampled = _with_bug("point_mass_on_sampled")


def always_accept_own_randomness(target: Any, bonus: Any, draft_probs: Any,
                                 draft_ids: Any) -> Any:
    """Always accepts and draws nothing: no ``uniforms=`` keyword, so Monte Carlo only."""
    return numpy_rejection(target, bonus, draft_probs, draft_ids,
                           uniforms=np.zeros((len(draft_ids), draft_ids.shape[1] + 1)),
                           bug="always_accept")


def correct_own_randomness(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any) -> Any:
    """Correct, drawing its own uniforms from a fixed seed (Monte Carlo only)."""
    rng = np.random.default_rng(7)
    return correct(target, bonus, draft_probs, draft_ids,
                   uniforms=rng.random((len(draft_ids), draft_ids.shape[1] + 1)))


def numpy_block(
    target_with_bonus_probs: np.ndarray,
    bonus_token_ids: np.ndarray,
    draft_probs: np.ndarray | None,
    draft_token_ids: np.ndarray,
    *,
    uniforms: np.ndarray,
    stop_at_first_failure: bool = False,
    prefix_ratio: bool = False,
) -> np.ndarray:
    """Block verification (Sun et al. 2025) with explicit uniforms; optionally the classic
    wrong version that stops at the first failed check, or the wrong path weights of
    hierarchical speculative decoding's code (``prefix_ratio``)."""
    target = np.asarray(target_with_bonus_probs, dtype=np.float64)
    ids = np.asarray(draft_token_ids, dtype=np.int64)
    batch_size, k = ids.shape
    vocab_size = target.shape[2]
    rows = np.arange(batch_size)
    if draft_probs is None:
        q = np.zeros((batch_size, k, vocab_size))
        q[rows[:, None], np.arange(k)[None, :], ids] = 1.0
    else:
        q = np.asarray(draft_probs, dtype=np.float64)
    p_x = target[rows[:, None], np.arange(k)[None, :], ids]
    q_x = q[rows[:, None], np.arange(k)[None, :], ids]
    rho = np.ones((batch_size, k + 1))
    for i in range(k):
        scaled = rho[:, i] * p_x[:, i]
        ratio = np.divide(scaled, q_x[:, i], out=np.ones(batch_size), where=q_x[:, i] > 0)
        rho[:, i + 1] = np.where(scaled >= q_x[:, i], 1.0, ratio)
    if prefix_ratio:
        # The bug: the ratio of the whole prefix, capped once (a later p > q makes up for an
        # earlier p < q), as hierarchical speculative decoding's code weights its paths.
        # q = 0 < p is ratio infinity (weight 1), p = 0 ratio 0, as block's weights are.
        ratios = np.divide(p_x, q_x, out=np.where(p_x > 0, np.inf, 0.0), where=q_x > 0)
        with np.errstate(invalid="ignore"):  # inf * 0: a zero-probability step, weight 0
            prefix = np.nan_to_num(np.cumprod(ratios, axis=1), nan=0.0, posinf=np.inf)
        rho[:, 1:] = np.minimum(prefix, 1.0)
    residual = np.maximum(rho[:, :k, None] * target[:, :k] - q, 0.0)
    total = residual.sum(axis=2)
    h = np.empty((batch_size, k))
    denominator = total[:, 1:] + 1.0 - rho[:, 1:k]
    h[:, : k - 1] = np.divide(total[:, 1:], denominator, out=np.ones_like(denominator),
                              where=denominator != 0)
    h[:, k - 1] = rho[:, k]
    passed = uniforms[:, :k] < h
    if stop_at_first_failure:
        tau = np.where(passed.all(axis=1), k, np.argmin(passed, axis=1))
    else:
        tau = np.where(passed.any(axis=1), k - np.argmax(passed[:, ::-1], axis=1), 0)
    at = np.minimum(tau, k - 1)
    weights = residual[rows, at].copy()
    empty = total[rows, at] == 0
    weights[empty] = target[rows, at][empty]
    cdf = np.cumsum(weights, axis=1)
    above = cdf > (uniforms[:, k] * cdf[:, -1])[:, None]
    last_positive = vocab_size - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
    recovered = np.where(above.any(axis=1), above.argmax(axis=1), last_positive)
    output = np.full((batch_size, k + 1), -1, dtype=np.int64)
    output[:, :k] = np.where(np.arange(k)[None, :] < tau[:, None], ids, -1)
    output[rows, tau] = np.where(tau == k, np.asarray(bonus_token_ids).reshape(batch_size),
                                 recovered)
    return output


def hierarchical_prefix_ratio(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                              uniforms: Any) -> Any:
    """Block verification with the path weights of hierarchical speculative decoding's
    public code (arXiv 2601.05724): the uncapped prefix ratio
    ``rho_i = min(1, prod_{j < i} p_j(x_j) / q_j(x_j))`` where block verification caps at
    every step (``rho_i = min(1, rho_{i-1} * p / q)``).  A deliberate bug: not lossless
    for k >= 2 (the two-token law is off by up to about 20 %); for k = 1 it is block
    verification."""
    return numpy_block(target, bonus, draft_probs, draft_ids, uniforms=uniforms,
                       prefix_ratio=True)


def block(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *, uniforms: Any) -> Any:
    """Correct block verification."""
    return numpy_block(target, bonus, draft_probs, draft_ids, uniforms=uniforms)


def block_first_failure(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                        uniforms: Any) -> Any:
    """Block verification that stops at the first failed check (not lossless)."""
    return numpy_block(target, bonus, draft_probs, draft_ids, uniforms=uniforms,
                       stop_at_first_failure=True)


# -- every layout: one bug each in a wrapper of the library's own verifier -------------------
#
# Each wrapper keeps the wrapped function's signature (functools.wraps sets __wrapped__,
# which inspect.signature follows), so the kit sees and feeds every keyword it takes.


def _wrapping(function: Any, name: str, change: Any) -> Any:
    @functools.wraps(function)
    def verifier(*args: Any, **keywords: Any) -> Any:
        return function(*args, **change(keywords))

    verifier.__name__ = verifier.__qualname__ = name
    return verifier


def _reused_generator_uniform(keywords: dict, columns: int) -> dict:
    """With ``generator=``: one uniform per request broadcast to every column (a wrong
    generator path); explicit uniforms and seeds are left alone."""
    generator = keywords.get("generator")
    if generator is None:
        return keywords
    batch_size = len(np.asarray(keywords["num_draft_tokens" if "num_draft_tokens" in keywords
                                         else "num_nodes"]))
    one = generator.random((batch_size, 1))
    return {**keywords, "generator": None,
            "uniforms": np.ascontiguousarray(np.broadcast_to(one, (batch_size, columns)))}


def _hang(*args: Any, **keywords: Any) -> Any:
    threading.Event().wait()  # never set: the call never returns


def padded_wrong_generator(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                            uniforms: Any = None, generator: Any = None) -> Any:
    """Right with explicit uniforms; with ``generator=`` one uniform per row everywhere."""
    if generator is not None:
        uniforms = np.broadcast_to(generator.random((len(draft_ids), 1)),
                                   (len(draft_ids), draft_ids.shape[1] + 1))
    return correct(target, bonus, draft_probs, draft_ids, uniforms=uniforms)



def padded_hangs(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *,
                 uniforms: Any) -> Any:
    """Never returns."""
    return _hang()


def exits(target: Any, bonus: Any, draft_probs: Any, draft_ids: Any, *, uniforms: Any) -> Any:
    """Calls ``sys.exit(0)``, as a verifier that reaches a stray exit does."""
    sys.exit(0)


def padded_seeded_draws_of_the_widest(target: Any, bonus: Any, draft_probs: Any,
                                      draft_ids: Any, *, uniforms: Any = None,
                                      seeded_seqs: Any = None) -> Any:
    """Right law, but with ``seeded_seqs`` every row draws ``max(k + 1, B)`` values from
    its generator (a batch-dependent number) and uses the first ``k + 1``."""
    if seeded_seqs is not None:
        batch_size, columns = len(draft_ids), draft_ids.shape[1] + 1
        uniforms = np.stack([seeded_seqs[b].random(max(columns, batch_size))[:columns]
                             for b in range(batch_size)])
    return correct(target, bonus, draft_probs, draft_ids, uniforms=uniforms)


#: ``verify_ragged`` that ignores one sampling filter (None: off), by filter name.
RAGGED_IGNORED = {
    name: _wrapping(specdec_np.verify_ragged, f"ragged_ignores_{name}",
                    lambda keywords, name=name: {**keywords, name: None})
    for name in ("temperature", "top_k", "top_p", "min_p")
}
ragged_ignores_top_k = RAGGED_IGNORED["top_k"]


def _ragged_columns(keywords: dict) -> dict:
    counts = np.asarray(keywords["num_draft_tokens"])
    return _reused_generator_uniform(keywords, int(counts.max(initial=0)) + 2)


ragged_wrong_generator = _wrapping(specdec_np.verify_ragged, "ragged_wrong_generator",
                                   _ragged_columns)
ragged_hangs = _wrapping(_hang, "ragged_hangs", lambda keywords: keywords)
ragged_hangs.__wrapped__ = specdec_np.verify_ragged  # the signature the kit reads


def _greedy_walk(keywords: dict) -> dict:
    return {**keywords, "method": "greedy"}


def _tree_columns(keywords: dict) -> dict:
    counts = np.asarray(keywords["num_nodes"])
    return _reused_generator_uniform(keywords, int(counts.max(initial=0)) + 1)


tree_walks_greedily = _wrapping(specdec_np.verify_tree, "tree_walks_greedily", _greedy_walk)
tree_wrong_generator = _wrapping(specdec_np.verify_tree, "tree_wrong_generator", _tree_columns)
tree_hangs = _wrapping(_hang, "tree_hangs", lambda keywords: keywords)
tree_hangs.__wrapped__ = specdec_np.verify_tree


# -- false passes of an earlier kit: one wrong handling of the sampling parameters or of
# a seeded request's generator each, in a wrapper of verify_ragged and of verify_tree ------


def _drafts_per_request(keywords: dict) -> np.ndarray:
    """``num_draft_tokens`` (ragged) or ``num_nodes`` (tree)."""
    return np.asarray(keywords.get("num_draft_tokens", keywords.get("num_nodes")))


def _sampled_temperatures(keywords: dict) -> np.ndarray | None:
    """The ``[B]`` temperatures as float64 (None when none were given)."""
    temperature = keywords.get("temperature")
    if temperature is None:
        return None
    return np.broadcast_to(np.asarray(temperature, dtype=np.float64),
                           _drafts_per_request(keywords).shape).copy()


def _min_p_ignored_with_top_p(keywords: dict) -> dict:
    """min-p dropped for every request whose top-p is on."""
    if keywords.get("min_p") is None or keywords.get("top_p") is None:
        return keywords
    top_p = np.broadcast_to(np.asarray(keywords["top_p"], dtype=np.float64),
                            _drafts_per_request(keywords).shape)
    return {**keywords, "min_p": np.where(top_p < 1.0, 0.0, keywords["min_p"])}


def _temperature_clamped(keywords: dict) -> dict:
    """Temperatures above 1 treated as 1."""
    temperature = _sampled_temperatures(keywords)
    if temperature is None:
        return keywords
    return {**keywords, "temperature": np.minimum(temperature, 1.0)}


def _draftless_temperature_ignored(keywords: dict) -> dict:
    """A sampled request without drafts verified at temperature 1."""
    temperature = _sampled_temperatures(keywords)
    if temperature is None:
        return keywords
    without = (_drafts_per_request(keywords) == 0) & (temperature > 0)
    return {**keywords, "temperature": np.where(without, 1.0, temperature)}


def _draft_logits_at_temperature_one(keywords: dict) -> dict:
    """With target probabilities, draft logits turned into probabilities at temperature 1."""
    if keywords.get("target_probs") is None or keywords.get("draft_logits") is None:
        return keywords
    logits = np.asarray(keywords["draft_logits"])
    weights = np.exp(logits.astype(np.float64) - logits.max(axis=1, keepdims=True))
    probs = (weights / weights.sum(axis=1, keepdims=True)).astype(logits.dtype)
    return {**keywords, "draft_logits": None, "draft_probs": probs}


def _seeded_draws_of_the_widest(keywords: dict) -> dict:
    """Every seeded request draws as many uniforms as the batch's largest request needs
    (``max k_b + 2`` on the ragged layout, ``max N_b + 1`` on the tree's): the right law,
    a batch-dependent number of draws."""
    seeded = keywords.get("seeded_seqs")
    if not seeded:
        return keywords
    counts = _drafts_per_request(keywords)
    columns = int(counts.max(initial=0)) + (2 if "num_draft_tokens" in keywords else 1)
    fallback = keywords.get("generator") or np.random.default_rng()
    uniforms = np.stack([(seeded[b] if b in seeded else fallback).random(columns)
                         for b in range(counts.size)]) if counts.size else np.zeros((0, columns))
    return {**keywords, "seeded_seqs": None, "generator": None, "uniforms": uniforms}


#: The false passes above, by name, each as a ragged and a tree verifier.
LAW_BUGS = {
    "min_p_ignored_with_top_p": _min_p_ignored_with_top_p,
    "temperature_clamped": _temperature_clamped,
    "draftless_temperature_ignored": _draftless_temperature_ignored,
    "draft_logits_at_temperature_one": _draft_logits_at_temperature_one,
    "seeded_draws_of_the_widest": _seeded_draws_of_the_widest,
}
RAGGED_LAW_BUGS = {name: _wrapping(specdec_np.verify_ragged, f"ragged_{name}", change)
                   for name, change in LAW_BUGS.items()}
TREE_LAW_BUGS = {name: _wrapping(specdec_np.verify_tree, f"tree_{name}", change)
                 for name, change in LAW_BUGS.items()}
