"""The relaxed rules, each written once: what it accepts, and with what probability.

Each rule of :data:`specdec_np.registry.RELAXED_METHODS` is a function here, named by
its entry's ``rule_name``, vectorised over a chunk of requests
(:class:`specdec_np._relaxed.laws.ChunkLaws`), on the rows' array library.  It returns a
:class:`Decisions`:

* ``accepted`` (bool ``[n, K]``): whether each drafted token passes, with this call's
  uniforms (a request stops at its first failure; positions after it are not used);
* ``acceptance`` (float64 ``[n, K, V]``, only when the bias is asked for): for every
  token ``x`` the draft could have proposed there, the probability over that position's
  own uniform that ``x`` would pass, everything else (the window of FLy, the thinking
  phase) as in this call;
* ``rejection``: what a failure emits for a sampled request: ``"residual"`` (a draw from
  ``max(p - q, 0)``, from ``p`` if that has no mass) or ``"removed"`` (a draw from ``p``
  with the rejected draft removed).  A greedy request emits its argmax.

Every rule's own test is a greedy request's argmax match, and a sampled request's
token-wise rejection test ``u * q(x) < p(x)`` (``u < p(x)`` for point-mass drafts); each
rule adds its relaxation on top.  ``docs/semantics.md`` ("Relaxed methods") states them.
The typical-acceptance verifier's rule is here too (:func:`typical_accepts`), for its
bias only: its decisions are the kernels'.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._runtime import contract as _contract
from .laws import ChunkLaws

__all__ = [
    "Decisions",
    "fly_accepts",
    "inverse_cdf",
    "own_test",
    "relaxed_accepts",
    "rule_for",
    "synthetic_accepts",
    "threshold_accepts",
    "typical_accepts",
]

#: SGLang floors ``threshold_acc`` here before dividing by it.
THRESHOLD_ACC_FLOOR = 1e-9


class Decisions(NamedTuple):
    """What a rule decided for a chunk (the module docstring)."""

    accepted: Any
    acceptance: Any
    rejection: str


def _namespace(array: Any) -> Any:
    """``numpy`` or ``cupy``, whichever holds ``array``."""
    if isinstance(array, np.ndarray):
        return np
    import cupy  # noqa: PLC0415  (only reached with CuPy arrays)

    return cupy


def own_test(laws: ChunkLaws, uniforms: Any) -> Any:
    """bool ``[n, K]``: each draft's own test, the argmax match of a greedy request and
    ``u * q(x) < p(x)`` of a sampled one (float64; invalid positions fail)."""
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    greedy_pass = laws.draft_ids == laws.top[:, :width]
    sampled_pass = uniforms[:, :width] * laws.q_x < laws.p_x
    return xp.where(laws.greedy[:, None], greedy_pass, sampled_pass) & laws.valid


def _own_acceptance(laws: ChunkLaws) -> Any:
    """float64 ``[n, K, V]``: each token's probability of passing its own test there (1
    for the argmax of a greedy request; ``min(1, p / q)`` for a sampled one)."""
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    target = laws.target[:, :width, :]
    vocab = xp.arange(target.shape[2])
    is_top = (vocab[None, None, :] == laws.top[:, :width, None]).astype(xp.float64)
    if laws.draft is None:
        sampled = xp.minimum(target, 1.0)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = xp.where(laws.draft > 0, target / xp.where(laws.draft > 0, laws.draft, 1.0),
                             0.0)
        sampled = xp.minimum(ratio, 1.0)
    return xp.where(laws.greedy[:, None, None], is_top, sampled)


def _draft_positive(laws: ChunkLaws) -> Any:
    """bool ``[n, K, V]`` (or ``[n, K, 1]``): where the draft law is positive."""
    xp = _namespace(laws.target)
    if laws.draft is None:
        return xp.ones(laws.valid.shape + (1,), dtype=bool)
    return laws.draft > 0


def _top_entropy(laws: ChunkLaws, top_k: int) -> Any:
    """float64 ``[n, K]``: ``-sum p log p`` over the ``top_k`` most probable tokens of
    each draft position's target law."""
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    target = laws.target[:, :width, :]
    vocab_size = target.shape[2]
    if top_k < vocab_size:
        largest = xp.partition(target, vocab_size - top_k, axis=2)[:, :, vocab_size - top_k:]
    else:
        largest = target
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = xp.where(largest > 0, -largest * xp.log(xp.where(largest > 0, largest, 1.0)),
                         0.0)
    return terms.sum(axis=2)


def _passing_window(passed: Any, counts: Any, window_size: int) -> Any:
    """bool ``[n, K]``: the ``window_size`` drafts after each position exist and all
    pass their own tests."""
    xp = _namespace(passed)
    n, width = passed.shape
    failures = xp.concatenate(
        [xp.zeros((n, 1), dtype=xp.int64), xp.cumsum((~passed).astype(xp.int64), axis=1)],
        axis=1,
    )
    positions = xp.arange(width)
    last = positions + window_size
    inside = last[None, :] < counts[:, None]
    end = xp.minimum(last + 1, width)
    begin = xp.minimum(positions + 1, width)
    failed_after = failures[:, end] - failures[:, begin]
    return inside & (failed_after == 0)


def fly_accepts(
    laws: ChunkLaws, uniforms: Any, parameters: dict[str, Any], with_acceptance: bool
) -> Decisions:
    """FLy: a failed draft deferred when the top-k entropy is high, the draft possible
    and the window after it passes."""
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    own = own_test(laws, uniforms)
    window = _passing_window(own, laws.counts, int(parameters["window_size"]))
    uncertain = _top_entropy(laws, int(parameters["entropy_top_k"])) >= float(
        parameters["entropy_threshold"]
    )
    reachable = laws.reachable[:, :width, :]
    possible_x = xp.take_along_axis(reachable, laws.draft_ids[:, :, None], axis=2)[:, :, 0]
    possible = possible_x & xp.where(laws.greedy[:, None], True, laws.q_x > 0)
    deferred = uncertain & window & possible & laws.valid
    acceptance = None
    if with_acceptance:
        eligible = (uncertain & window)[:, :, None] & reachable & (
            laws.greedy[:, None, None] | _draft_positive(laws)
        )
        acceptance = xp.where(eligible, 1.0, _own_acceptance(laws))
    return Decisions(own | deferred, acceptance, "residual")


def conditional_rates(rates: Any, width: int) -> np.ndarray:
    """float64 ``[width]``: ``a_i / a_(i-1)`` from unconditional rates ``a_1 >= a_2 ...``
    (``a_0 = 1``; 0 after a zero rate)."""
    values = np.asarray(rates, dtype=np.float64)[:width]
    before = np.concatenate([[1.0], values[:-1]]) if width else values
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(before > 0, values / np.where(before > 0, before, 1.0), 0.0)


def synthetic_accepts(
    laws: ChunkLaws, uniforms: Any, parameters: dict[str, Any], with_acceptance: bool
) -> Decisions:
    """Synthetic acceptance: position ``i`` kept when ``u_i`` is below its conditional
    rate, whatever the token."""
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    rates = xp.asarray(conditional_rates(parameters["acceptance_rates"], width))
    accepted = (uniforms[:, :width] < rates[None, :]) & laws.valid
    acceptance = None
    if with_acceptance:
        acceptance = xp.broadcast_to(
            rates[None, :, None], laws.target[:, :width, :].shape
        ).astype(xp.float64)
    return Decisions(accepted, acceptance, "residual")


def _thinking(laws: ChunkLaws, parameters: dict[str, Any], contexts: list[Any]) -> np.ndarray:
    """bool ``[n, K]`` (host): whether each position lies in the relaxed phase: always
    without a ``begin_token_id``; otherwise where the context (prompt, output, drafts
    before the position) holds a ``begin_token_id`` with no later ``end_token_id``."""
    ids = laws.draft_ids
    ids = np.asarray(ids.get() if hasattr(ids, "get") else ids)
    n, width = ids.shape
    begin = parameters["begin_token_id"]
    if begin is None:
        return np.ones((n, width), dtype=bool)
    end = parameters["end_token_id"]
    phase = np.zeros((n, width), dtype=bool)
    for row in range(n):
        inside = False
        for token in contexts[row]:
            if token == begin:
                inside = True
            elif end is not None and token == end:
                inside = False
        for position in range(width):
            phase[row, position] = inside
            token = int(ids[row, position])
            if token == begin:
                inside = True
            elif end is not None and token == end:
                inside = False
    return phase


def _ranks(xp: Any, target: Any) -> Any:
    """int64 like ``target``: each token's rank in its row, most probable first, ties
    to the lower id."""
    order = xp.argsort(-target, axis=-1, kind="stable")
    ranks = xp.empty_like(order)
    xp.put_along_axis(ranks, order, xp.broadcast_to(
        xp.arange(target.shape[-1]), target.shape).astype(order.dtype), axis=-1)
    return ranks


def relaxed_accepts(
    laws: ChunkLaws,
    uniforms: Any,
    parameters: dict[str, Any],
    with_acceptance: bool,
    contexts: list[Any] | None = None,
) -> Decisions:
    """Relaxed acceptance: the own test, or (in the relaxed phase of a relaxed request)
    a top-k token within the margin of the most probable one."""
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    target = laws.target[:, :width, :]
    requests = parameters["relaxed_requests"]
    chosen = np.ones(laws.requests.size, dtype=bool) if requests is None else np.asarray(
        requests, dtype=bool
    )[laws.requests]
    phase = _thinking(laws, parameters, contexts or [[] for _ in range(laws.requests.size)])
    active = xp.asarray(phase & chosen[:, None]) & laws.valid
    top_probability = xp.take_along_axis(target, laws.top[:, :width, None], axis=2)
    if parameters["relaxed_rule"] == "ratio":
        margin = float(parameters["ratio"]) * top_probability
    else:
        margin = top_probability - float(parameters["delta"])
    top_k = int(parameters["relaxed_top_k"])
    ids = laws.draft_ids[:, :, None]
    p_x = laws.p_x[:, :, None]
    rank_x = (target > p_x).sum(axis=2) + (
        (target == p_x) & (xp.arange(target.shape[2])[None, None, :] < ids)
    ).sum(axis=2)
    close = (rank_x < top_k) & (laws.p_x >= margin[:, :, 0]) & (laws.p_x > 0)
    accepted = own_test(laws, uniforms) | (active & close)
    acceptance = None
    if with_acceptance:
        relaxes = (_ranks(xp, target) < top_k) & (target >= margin) & (target > 0)
        acceptance = xp.where(active[:, :, None] & relaxes, 1.0, _own_acceptance(laws))
    return Decisions(accepted, acceptance, "residual")


def threshold_accepts(
    laws: ChunkLaws, uniforms: Any, parameters: dict[str, Any], with_acceptance: bool
) -> Decisions:
    """SGLang's thresholds on a chain: ``u <= p(x) / threshold_acc`` or ``p(x) >=
    threshold_single``, draft rows ignored; a greedy request's argmax match."""
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    single = float(parameters["threshold_single"])
    acc = max(float(parameters["threshold_acc"]), THRESHOLD_ACC_FLOOR)
    sampled = (uniforms[:, :width] <= laws.p_x / acc) | (laws.p_x >= single)
    greedy = laws.draft_ids == laws.top[:, :width]
    accepted = xp.where(laws.greedy[:, None], greedy, sampled) & laws.valid
    acceptance = None
    if with_acceptance:
        target = laws.target[:, :width, :]
        vocab = xp.arange(target.shape[2])
        is_top = (vocab[None, None, :] == laws.top[:, :width, None]).astype(xp.float64)
        chance = xp.where(target >= single, 1.0, xp.minimum(target / acc, 1.0))
        acceptance = xp.where(laws.greedy[:, None, None], is_top, chance)
    return Decisions(accepted, acceptance, "removed")


def typical_accepts(
    laws: ChunkLaws, uniforms: Any, parameters: dict[str, Any], with_acceptance: bool
) -> Decisions:
    """Typical acceptance (Medusa), for its bias: ``p(x) > min(posterior_threshold,
    posterior_alpha * exp(-H))``, ``H = -sum p ln(p + 1e-5)``; a failure emits the
    argmax (``rejection`` ``"argmax"``)."""
    xp = _namespace(laws.target)
    width = laws.valid.shape[1]
    target = laws.target[:, :width, :]
    entropy = -(target * xp.log(target + _contract.ENTROPY_EPSILON)).sum(axis=2)
    threshold = xp.minimum(
        float(parameters["posterior_threshold"]),
        float(parameters["posterior_alpha"]) * xp.exp(-entropy),
    )
    accepted = (laws.p_x > threshold) & laws.valid
    acceptance = None
    if with_acceptance:
        acceptance = (target > threshold[:, :, None]).astype(xp.float64)
    return Decisions(accepted, acceptance, "argmax")


def inverse_cdf(weights: Any, v: Any) -> Any:
    """int64 ``[m]``: per row the first index whose float64 running sum exceeds ``v *
    Z`` (``Z`` the row total) among positive weights, the last positive one if rounding
    misses, -1 for a row without positive weight (the kernels' rule)."""
    xp = _namespace(weights)
    positive = weights > 0
    clean = xp.where(positive, weights, 0.0)
    running = xp.cumsum(clean, axis=1)
    total = running[:, -1]
    crossing = (running > (v * total)[:, None]) & positive
    vocab_size = weights.shape[1]
    first = xp.where(crossing.any(axis=1), xp.argmax(crossing, axis=1), -1)
    last = vocab_size - 1 - xp.argmax(positive[:, ::-1], axis=1)
    token = xp.where(first >= 0, first, last)
    return xp.where(total > 0, token, -1).astype(xp.int64)


_RULES = {
    rule.__name__: rule
    for rule in (fly_accepts, synthetic_accepts, relaxed_accepts, threshold_accepts,
                 typical_accepts)
}


def rule_for(name: str) -> Any:
    """The rule function called ``name`` (a registry entry's ``rule_name``)."""
    return _RULES[name]
