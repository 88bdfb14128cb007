"""The whole sampling surface per draft position: context, penalties, bias, masks, stops and
logprobs (docs/semantics.md, "The whole sampling surface").

* the kernels equal the reference adapter token for token on random batches with every
  setting on or off, in every row form;
* the exact law of every position, with rows that depend on the drafts before them
  (penalties where the drafts repeat a token, a bad word whose prefix is a draft, a minimum
  length reached inside the chain, a grammar bitmask that forbids a draft token), equals
  the sequential target law, and broken verifiers (penalties without the draft prefix, the
  bonus row without its bitmask, the bias after the temperature) do not;
* stops cut the emitted run, logprobs follow the processed law, bad settings are refused
  by name, and a call without settings is bit-identical to one before them.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from random_trees import random_forest

import specdec_np
from specdec_np import registry
from specdec_np._layouts import surface as _surface
from specdec_np._reference import chains as _reference
from specdec_np._reference import ragged as ragged_reference
from specdec_np._reference import surface as _reference_surface
from specdec_np._reference import trees as _tree_reference
from specdec_np.testing import _monte_carlo, _statistics

# --------------------------------------------------------------------------------------
# Random batches: the kernels against the reference adapter
# --------------------------------------------------------------------------------------


def _random_settings(rng: np.random.Generator, batch: int, vocab: int, rows: int) -> dict:
    """Each setting on with probability 1/2 (the drafts use ids 0..3, so contexts repeat)."""
    makers = {
        "output_token_ids": lambda: [list(rng.integers(0, 4, rng.integers(0, 4)))
                                     for _ in range(batch)],
        "prompt_token_ids": lambda: [list(rng.integers(0, vocab, 3)) for _ in range(batch)],
        "repetition_penalty": lambda: rng.uniform(0.5, 2, batch),
        "frequency_penalty": lambda: rng.uniform(-2, 2, batch),
        "presence_penalty": lambda: rng.uniform(-2, 2, batch),
        "logit_bias": lambda: [{int(rng.integers(vocab)): float(rng.normal(0, 2))}
                               for _ in range(batch)],
        "allowed_token_ids": lambda: [None if rng.random() < 0.5 else
                                      list(rng.integers(0, vocab, 3)) for _ in range(batch)],
        "bad_words_token_ids": lambda: [[[int(rng.integers(min(vocab, 4)))] * 2,
                                         [int(rng.integers(min(vocab, 4)))]]
                                        for _ in range(batch)],
        "min_tokens": lambda: rng.integers(0, 5, batch),
        "stop_token_ids": lambda: [list(rng.integers(0, vocab, 2)) for _ in range(batch)],
        "max_tokens": lambda: rng.integers(1, 5, batch),
        "token_bitmask": lambda: rng.integers(
            -(2**31), 2**31 - 1, (rows, (vocab + 31) // 32)
        ).astype(np.int32),
    }
    settings = {name: make() for name, make in makers.items() if rng.random() < 0.5}
    settings["logprobs"] = int(rng.integers(0, 4))
    return settings


def _compare(fast: Any, expected: tuple) -> None:
    output, lengths, extras = expected
    np.testing.assert_array_equal(fast.output_token_ids, output)
    np.testing.assert_array_equal(fast.accepted_lengths, lengths)
    np.testing.assert_array_equal(fast.finished, extras["finished"])
    np.testing.assert_array_equal(fast.top_token_ids, extras["top_token_ids"])
    for name in ("logprobs", "raw_logprobs", "top_logprobs"):
        np.testing.assert_allclose(getattr(fast, name), extras[name], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("method", registry.names())
@pytest.mark.parametrize("seed", range(3))
def test_kernels_equal_the_reference_with_every_setting(method: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(25):
        batch = int(rng.integers(1, 4))
        counts = rng.integers(0, 4, batch)
        total = int(counts.sum())
        vocab = int(rng.integers(4, 40))
        dtype = [np.float32, np.float64][int(rng.integers(2))]
        target = rng.normal(0, 2, (total + batch, vocab)).astype(dtype)
        draft = rng.normal(0, 2, (total, vocab)).astype(dtype)
        ids = rng.integers(0, 4, total)
        temperature = np.where(rng.random(batch) < 0.3, 0.0, rng.uniform(0.5, 1.5, batch))
        settings = _random_settings(rng, batch, vocab, total + batch)
        uniforms = rng.random((batch, int(counts.max(initial=0)) + 2))
        form = int(rng.integers(3))
        draft_logits = draft if form == 0 else None
        draft_probs = None
        if form == 1:
            draft_probs = specdec_np.processed_probs(draft)
        keywords = dict(num_draft_tokens=counts, draft_token_ids=ids, target_logits=target,
                        draft_logits=draft_logits, draft_probs=draft_probs,
                        temperature=temperature, uniforms=uniforms, method=method)
        try:
            expected = ragged_reference.verify_ragged(
                counts, ids, target, draft if form == 0 else draft_probs, method=method,
                from_logits=True, draft_from_logits=form == 0, temperature=temperature,
                uniforms=uniforms, settings=settings,
            )
        except ValueError:
            # The masks left a row that must be drawn from without mass: refused alike.
            with pytest.raises(ValueError, match="no positive probability"):
                specdec_np.verify_ragged(**keywords, **settings)
            continue
        _compare(specdec_np.verify_ragged(**keywords, **settings), expected)
        checked += 1
    assert checked >= 15


def test_settings_that_are_off_change_no_bit() -> None:
    rng = np.random.default_rng(5)
    counts = np.array([3, 0, 2])
    target = rng.normal(0, 2, (8, 50)).astype(np.float32)
    ids = rng.integers(0, 50, 5)
    common = dict(num_draft_tokens=counts, draft_token_ids=ids, target_logits=target,
                  temperature=[0.7, 0.0, 1.2], top_p=0.9)
    plain = specdec_np.verify_ragged(**common, generator=np.random.default_rng(1))
    off = specdec_np.verify_ragged(
        **common, generator=np.random.default_rng(1), repetition_penalty=1.0,
        frequency_penalty=0.0, presence_penalty=0.0, logit_bias=[None, {}, None],
        output_token_ids=[[1, 2], None, [3]], min_tokens=0,
    )
    np.testing.assert_array_equal(plain.output_token_ids, off.output_token_ids)
    np.testing.assert_array_equal(plain.accepted_lengths, off.accepted_lengths)


def test_a_call_without_settings_never_enters_the_surface(monkeypatch: Any) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the surface ran without a setting")

    monkeypatch.setattr(_surface, "plan_for", refuse)
    monkeypatch.setattr(_surface, "adjusted_rows_of", refuse)
    target = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    specdec_np.verify_ragged(num_draft_tokens=[2], draft_token_ids=[1, 2],
                             target_logits=target, generator=np.random.default_rng(0))
    specdec_np.processed_probs(target, temperature=0.5)
    specdec_np.sample_tokens(logits=target, generator=np.random.default_rng(0))


# --------------------------------------------------------------------------------------
# Exact law with context-dependent rows
# --------------------------------------------------------------------------------------

VOCAB = 4
K = 2


def _cdf_cuts(weights: np.ndarray) -> list[float]:
    total = weights.sum()
    return [] if not total > 0 else list(np.cumsum(weights)[:-1] / total)


def _axis(points: list[float], refine: int) -> tuple[np.ndarray, np.ndarray]:
    cuts = np.unique(np.clip(
        np.concatenate([[0.0, 1.0], np.arange(1, refine) / refine, points]), 0.0, 1.0
    ))
    cuts = cuts[np.concatenate([[True], np.diff(cuts) > 1e-12])]
    cuts[-1] = 1.0
    return (cuts[:-1] + cuts[1:]) / 2, np.diff(cuts)


class Case:
    """One request's rows and settings, and their law through the reference: ``p(i, ctx)``
    and ``q(i, ctx)`` are the processed target and draft rows of position ``i`` after the
    tokens ``ctx`` of this step."""

    def __init__(self, settings: dict, temperature: float = 0.9, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.target = rng.normal(0, 1.0, (K + 1, VOCAB)).astype(np.float32)
        self.draft = rng.normal(0, 1.0, (K, VOCAB)).astype(np.float32)
        self.settings = settings
        self.temperature = temperature
        self._rows: dict[tuple, np.ndarray] = {}

    def with_settings(self, settings: dict) -> Case:
        """The same rows under other settings (a control's law)."""
        other = Case(settings, self.temperature)
        other.target, other.draft = self.target, self.draft
        return other

    def _row(self, rows: np.ndarray, i: int, context: tuple[int, ...], mask: Any) -> np.ndarray:
        before = list(self.settings.get("output_token_ids", [[]])[0] or [])
        masks = None if mask is None else mask[i : i + 1]
        adjusted = _reference_surface.adjust_logits(
            np, rows[i : i + 1], [before + list(context)], self.settings, 0, masks
        )
        return _reference.process_logits(
            adjusted, np.array([self.temperature]), np.array([0]), np.array([1.0]),
            np.array([0.0]),
        )[0]

    def p(self, i: int, context: tuple[int, ...]) -> np.ndarray:
        return self._cached(self.target, "p", i, context)

    def q(self, i: int, context: tuple[int, ...]) -> np.ndarray:
        return self._cached(self.draft, "q", i, context)

    def _cached(self, rows: np.ndarray, which: str, i: int, context: tuple) -> np.ndarray:
        key = (which, i, tuple(int(token) for token in context))
        if key not in self._rows:
            self._rows[key] = self._row(rows, i, key[2], self.settings.get("token_bitmask"))
        return self._rows[key]

    def target_law(self) -> np.ndarray:
        law = np.zeros((VOCAB,) * (K + 1))
        for tokens in itertools.product(range(VOCAB), repeat=K + 1):
            law[tokens] = np.prod([self.p(i, tokens[:i])[tokens[i]] for i in range(K + 1)])
        return law


def _batch(case: Case, cut_laws: list[Case], refine: int) -> tuple[np.ndarray, ...]:
    """Draft tuples with their probabilities and uniforms cut at every threshold of the
    laws ``cut_laws`` (the right one and a control's), so that the midpoint rule is exact
    for a verifier that uses any of them."""
    ids, uniforms, weights = [], [], []
    for drafts in itertools.product(range(VOCAB), repeat=K):
        weight = np.prod([case.q(i, drafts[:i])[drafts[i]] for i in range(K)])
        if weight == 0:
            continue
        accept: list[list[float]] = [[] for _ in range(K)]
        residual: list[float] = []
        bonus: list[float] = []
        for law in cut_laws:
            for i in range(K):
                p_i, q_i = law.p(i, drafts[:i]), law.q(i, drafts[:i])
                accept[i].append(min(1.0, p_i[drafts[i]] / q_i[drafts[i]]))
                residual += _cdf_cuts(np.maximum(p_i - q_i, 0.0)) + _cdf_cuts(p_i)
            bonus += _cdf_cuts(law.p(K, drafts))
        axes = [_axis(points, refine) for points in accept + [residual, bonus]]
        mids = np.stack([m.ravel() for m in np.meshgrid(*(a[0] for a in axes), indexing="ij")], 1)
        widths = np.prod([w.ravel() for w in np.meshgrid(*(a[1] for a in axes), indexing="ij")], 0)
        ids.append(np.tile(drafts, (mids.shape[0], 1)))
        uniforms.append(mids)
        weights.append(widths * weight)
    return np.concatenate(ids), np.concatenate(uniforms), np.concatenate(weights)


def _output_law(case: Case, output: np.ndarray, lengths: np.ndarray, weights: np.ndarray):
    """The law of the first K + 1 tokens: each emitted run continued by the target (a run
    cut at a stop token included: ``lengths`` then counts the accepted drafts it kept)."""
    law = np.zeros((VOCAB,) * (K + 1))
    for row, length, weight in zip(np.asarray(output), np.asarray(lengths), weights):
        emitted = tuple(int(t) for t in row[row >= 0])
        assert len(emitted) in (int(length), int(length) + 1)

        def extend(prefix: tuple[int, ...], mass: float) -> None:
            if len(prefix) == K + 1:
                law[prefix] += mass
                return
            for token, p in enumerate(case.p(len(prefix), prefix)):
                if p > 0:
                    extend(prefix + (token,), mass * p)

        extend(emitted, weight)
    return law


def _tiled(case: Case, ids: np.ndarray, target: np.ndarray, draft: np.ndarray) -> dict:
    n = ids.shape[0]
    return dict(
        num_draft_tokens=np.full(n, K), draft_token_ids=ids.reshape(-1),
        target_logits=np.tile(target, (n, 1)), draft_logits=np.tile(draft, (n, 1)),
    )


def _per_request(settings: dict, n: int) -> dict:
    tiled = {}
    for name, value in settings.items():
        if name == "token_bitmask":
            tiled[name] = np.tile(value, (n, 1))
        elif isinstance(value, list):
            tiled[name] = value * n
        else:
            tiled[name] = value
    return tiled


def _kernel_law(case: Case, cut_laws: list[Case], refine: int = 2) -> np.ndarray:
    ids, uniforms, weights = _batch(case, cut_laws, refine)
    result = specdec_np.verify_ragged(
        **_tiled(case, ids, case.target, case.draft), temperature=case.temperature,
        uniforms=uniforms, **_per_request(case.settings, ids.shape[0]),
    )
    return _output_law(case, result.output_token_ids, result.accepted_lengths, weights)


def _mask(allowed_rows: list[list[int]]) -> np.ndarray:
    mask = np.zeros((len(allowed_rows), 1), dtype=np.int32)
    for row, allowed in enumerate(allowed_rows):
        for token in allowed:
            mask[row, 0] |= np.int32(1 << token)
    return mask


CASES = {
    # The drafts use tokens the penalties see: each position's row depends on them.
    "penalties": dict(output_token_ids=[[1]], prompt_token_ids=[[2]], repetition_penalty=1.8,
                      frequency_penalty=0.9, presence_penalty=0.6),
    "bias and bad word after a draft": dict(logit_bias=[{3: 1.5}],
                                            bad_words_token_ids=[[[0, 2], [1, 1]]]),
    "min length reached inside the chain": dict(output_token_ids=[[1]], min_tokens=2,
                                                stop_token_ids=[[3]]),
    "grammar bitmask forbidding drafts": dict(token_bitmask=_mask([[0, 1, 2], [1, 2, 3],
                                                                   [0, 3]])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_exact_law_with_context_dependent_rows(name: str) -> None:
    case = Case(CASES[name], seed=len(name))
    expected = case.target_law()
    np.testing.assert_allclose(_kernel_law(case, [case]), expected, rtol=0, atol=1e-6)
    # The rows do depend on the drafts before them (a row read without them is another
    # law), or the bitmask on the position: the setting per position is being proven.
    assert "token_bitmask" in case.settings or any(
        not np.allclose(case.p(i, drafts), case.p(i, ()))
        for i in range(1, K + 1)
        for drafts in itertools.product(range(VOCAB), repeat=i)
    )


def _control_law(case: Case, control: str) -> np.ndarray:
    """The exact law of a broken verifier: the kernels fed rows adjusted the wrong way."""
    settings = case.settings
    if control == "penalties without the draft prefix":
        before = list(settings["output_token_ids"][0])
        target = _reference_surface.adjust_logits(np, case.target, [before] * (K + 1), settings, 0)
        draft = _reference_surface.adjust_logits(np, case.draft, [before] * K, settings, 0)
        ids, uniforms, weights = _batch(case, [case], 2)
        result = specdec_np.verify_ragged(**_tiled(case, ids, target, draft),
                                          temperature=case.temperature, uniforms=uniforms)
    elif control == "bonus row without its bitmask":
        mask = settings["token_bitmask"].copy()
        mask[K] = -1
        broken = dict(settings, token_bitmask=mask)
        ids, uniforms, weights = _batch(case, [case, case.with_settings(broken)], 2)
        result = specdec_np.verify_ragged(
            **_tiled(case, ids, case.target, case.draft), temperature=case.temperature,
            uniforms=uniforms, **_per_request(broken, ids.shape[0]),
        )
    else:  # the bias after the temperature
        bias = np.zeros(VOCAB, dtype=np.float32)
        for token, value in settings["logit_bias"][0].items():
            bias[token] = value
        ids, uniforms, weights = _batch(case, [case], 2)
        unbiased = {key: value for key, value in settings.items() if key != "logit_bias"}
        result = specdec_np.verify_ragged(
            **_tiled(case, ids, case.target / case.temperature + bias,
                     case.draft / case.temperature + bias),
            uniforms=uniforms, **_per_request(unbiased, ids.shape[0]),
        )
    return _output_law(case, result.output_token_ids, result.accepted_lengths, weights)


@pytest.mark.parametrize(("control", "name"), [
    ("penalties without the draft prefix", "penalties"),
    ("bonus row without its bitmask", "grammar bitmask forbidding drafts"),
    ("bias after the temperature", "bias and bad word after a draft"),
])
def test_negative_controls_miss_the_law(control: str, name: str) -> None:
    case = Case(CASES[name], seed=len(name))
    difference = np.abs(_control_law(case, control) - case.target_law()).sum()
    assert difference > 1e-2, difference


def test_a_draft_the_grammar_forbids_is_rejected() -> None:
    mask = _mask([[0, 1, 2], [1, 2, 3], [0, 3]])
    rng = np.random.default_rng(3)
    target = rng.normal(size=(3, VOCAB)).astype(np.float32)
    for temperature in (0.0, 1.0):
        result = specdec_np.verify_ragged(
            num_draft_tokens=[2], draft_token_ids=[3, 0], target_logits=target,
            temperature=temperature, token_bitmask=mask, generator=rng,
        )
        assert int(result.accepted_lengths[0]) == 0
        assert int(result.output_token_ids[0, 0]) in (0, 1, 2)


@pytest.mark.slow
def test_kernel_law_chi_square_with_penalties_and_bitmask() -> None:
    settings = dict(CASES["penalties"], token_bitmask=_mask([[0, 1, 2, 3], [1, 2, 3],
                                                             [0, 1, 3]]))
    case = Case(settings, seed=11)
    n = 20_000
    rng = np.random.default_rng(2026)
    drafts = np.zeros((n, K), dtype=np.int64)
    for row in range(n):
        for i in range(K):
            drafts[row, i] = _monte_carlo.draw_from(case.q(i, tuple(drafts[row, :i])), 1, rng)[0]
    result = specdec_np.verify_ragged(
        **_tiled(case, drafts, case.target, case.draft), temperature=case.temperature,
        generator=rng, **_per_request(settings, n),
    )
    tuples = np.asarray(result.output_token_ids).copy()
    for row in range(n):
        for j in range(int(result.accepted_lengths[row]) + 1, K + 1):
            tuples[row, j] = _monte_carlo.draw_from(case.p(j, tuple(tuples[row, :j])), 1, rng)[0]
    cells = np.ravel_multi_index(tuples.T, (VOCAB,) * (K + 1))
    counts = np.bincount(cells, minlength=VOCAB ** (K + 1))
    statistic, dof = _statistics.chi_square_statistic(counts, case.target_law().reshape(-1))
    assert _statistics.chi_square_p_value(statistic, dof) > 1e-3


# --------------------------------------------------------------------------------------
# Stops, budgets and logprobs
# --------------------------------------------------------------------------------------


def _greedy_chain(stop: list[int] | None, budget: Any) -> Any:
    target = np.full((4, 6), -5.0, dtype=np.float32)
    for position, token in enumerate([1, 2, 3, 4]):
        target[position, token] = 5.0  # greedy accepts drafts 1, 2, 3 and emits bonus 4
    return specdec_np.verify_ragged(
        num_draft_tokens=[3], draft_token_ids=[1, 2, 3], target_logits=target, temperature=0,
        stop_token_ids=None if stop is None else [stop], max_tokens=budget,
    )


def test_the_run_ends_at_the_first_stop_token_which_is_kept() -> None:
    result = _greedy_chain([2, 3], None)
    np.testing.assert_array_equal(result.output_token_ids[0], [1, 2, -1, -1])
    assert int(result.accepted_lengths[0]) == 2 and bool(result.finished[0])
    # A run that is not cut (the control) emits tokens after the stop.
    uncut = _greedy_chain(None, None)
    assert not np.array_equal(uncut.output_token_ids, result.output_token_ids)


@pytest.mark.parametrize(("budget", "emitted", "finished"), [(1, 1, True), (3, 3, True),
                                                             (4, 4, True), (9, 4, False)])
def test_the_budget_ends_the_run(budget: int, emitted: int, finished: bool) -> None:
    result = _greedy_chain(None, budget)
    assert int((result.output_token_ids[0] >= 0).sum()) == emitted
    assert int(result.accepted_lengths[0]) == min(3, emitted)
    assert bool(result.finished[0]) is finished


def test_stops_do_not_change_the_draws() -> None:
    rng = np.random.default_rng(4)
    target = rng.normal(size=(8, 6)).astype(np.float32)
    common = dict(num_draft_tokens=[3, 3], draft_token_ids=[1, 2, 3, 1, 2, 3],
                  target_logits=target)
    plain = specdec_np.verify_ragged(**common, generator=np.random.default_rng(9))
    cut = specdec_np.verify_ragged(**common, generator=np.random.default_rng(9),
                                   stop_token_ids=[[2], [5]], max_tokens=[4, 1])
    later = specdec_np.verify_ragged(**common, generator=np.random.default_rng(9))
    for row in range(2):
        emitted = int((cut.output_token_ids[row] >= 0).sum())
        np.testing.assert_array_equal(cut.output_token_ids[row, :emitted],
                                      plain.output_token_ids[row, :emitted])
    np.testing.assert_array_equal(plain.output_token_ids, later.output_token_ids)


def test_engine_counters_count_what_was_emitted() -> None:
    verifier = specdec_np.EngineVerifier()
    target = np.full((4, 6), -5.0, dtype=np.float32)
    for position, token in enumerate([1, 2, 3, 4]):
        target[position, token] = 5.0
    verifier(num_draft_tokens=[3], draft_token_ids=[1, 2, 3], target_logits=target,
             temperature=0, stop_token_ids=[[2]])
    assert verifier.metrics.accepted == 2
    assert verifier.metrics.emitted == 2  # the stop token, an accepted draft, ends the run


def test_logprobs_follow_the_processed_law_not_the_raw_one() -> None:
    rng = np.random.default_rng(8)
    target = rng.normal(0, 2, (3, 12)).astype(np.float32)
    result = specdec_np.verify_ragged(
        num_draft_tokens=[2], draft_token_ids=[4, 5], target_logits=target, temperature=0.6,
        top_k=4, repetition_penalty=1.5, output_token_ids=[[4]], logprobs=3,
        generator=np.random.default_rng(0),
    )
    emitted = int(result.accepted_lengths[0]) + 1
    law = specdec_np.processed_probs(target[0], temperature=0.6, top_k=4,
                                     repetition_penalty=1.5, output_token_ids=[[4]])
    token = int(result.output_token_ids[0, 0])
    np.testing.assert_allclose(result.logprobs[0, 0], np.log(law[token]), rtol=1e-6)
    order = np.argsort(-law, kind="stable")[:3]
    np.testing.assert_array_equal(result.top_token_ids[0, 0], order)
    raw = target[0].astype(np.float64) - np.log(np.exp(target[0].astype(np.float64)).sum())
    np.testing.assert_allclose(result.raw_logprobs[0, 0], raw[token], rtol=1e-5)
    # The control: the raw law is another law.
    assert abs(result.raw_logprobs[0, 0] - result.logprobs[0, 0]) > 1e-3
    assert np.isnan(result.logprobs[0, emitted:]).all()


# --------------------------------------------------------------------------------------
# Other fronts and bad settings
# --------------------------------------------------------------------------------------


def test_greedy_tree_with_a_penalty_is_greedy_decoding() -> None:
    """A chain-shaped tree whose nodes follow greedy decoding under a repetition penalty is
    accepted whole: each node's row sees its ancestors."""
    rng = np.random.default_rng(1)
    vocab, depth = 10, 4
    logits = rng.normal(0, 1, (depth + 1, vocab)).astype(np.float32)
    context: list[int] = [3]
    tokens = []
    for row in logits:
        probs = specdec_np.processed_probs(row, temperature=0, repetition_penalty=3.0,
                                           output_token_ids=[context])
        tokens.append(int(np.argmax(probs)))
        context = context + [tokens[-1]]
    result = specdec_np.verify_tree(
        num_nodes=[depth], tree_parents=[-1, 0, 1, 2], draft_token_ids=tokens[:depth],
        target_logits=logits, temperature=0, repetition_penalty=3.0, output_token_ids=[[3]],
    )
    assert int(result.accepted_lengths[0]) == depth
    np.testing.assert_array_equal(result.output_token_ids[0], tokens)


def test_sample_tokens_takes_the_row_settings() -> None:
    logits = np.zeros((3, 40), dtype=np.float32)
    tokens = specdec_np.sample_tokens(logits=logits, allowed_token_ids=[[5], [6, 7], None],
                                      logit_bias=[None, None, {9: 50.0}],
                                      generator=np.random.default_rng(0))
    assert int(tokens[0]) == 5 and int(tokens[1]) in (6, 7) and int(tokens[2]) == 9


@pytest.mark.parametrize(("settings", "named"), [
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(frequency_penalty=2.5), "frequency_penalty"),
    (dict(presence_penalty=float("nan")), "presence_penalty"),
    (dict(logit_bias=[{1: float("inf")}]), "logit_bias"),
    (dict(logit_bias=[{99: 1.0}]), "logit_bias"),
    (dict(token_bitmask=np.zeros((3, 2), dtype=np.int32)), "token_bitmask"),
    (dict(token_bitmask=np.zeros((3, 1), dtype=np.int64)), "token_bitmask"),
    (dict(bad_words_token_ids=[[[]]]), "bad_words_token_ids"),
    (dict(allowed_token_ids=[[8]]), "allowed_token_ids"),
    (dict(stop_token_ids=[[1], [2]]), "stop_token_ids"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(logprobs=-1), "logprobs"),
    (dict(output_token_ids=[[1.5]]), "output_token_ids"),
])
def test_bad_settings_are_refused_by_name(settings: dict, named: str) -> None:
    target = np.zeros((3, 8), dtype=np.float32)
    with pytest.raises((TypeError, ValueError), match=named):
        specdec_np.verify_ragged(num_draft_tokens=[2], draft_token_ids=[1, 2],
                                 target_logits=target, **settings)


@pytest.mark.parametrize("name", ["repetition_penalty", "logit_bias", "token_bitmask"])
def test_row_settings_need_logits(name: str) -> None:
    value = {"repetition_penalty": 1.2, "logit_bias": [{1: 1.0}],
             "token_bitmask": np.full((3, 1), -1, dtype=np.int32)}[name]
    probs = np.full((3, 8), 1 / 8, dtype=np.float32)
    with pytest.raises(ValueError, match=name):
        specdec_np.verify_ragged(num_draft_tokens=[2], draft_token_ids=[1, 2],
                                 target_probs=probs, **{name: value})


@pytest.mark.parametrize("method", [entry.name for entry in registry.TREE_METHODS])
@pytest.mark.parametrize("seed", range(2))
def test_tree_kernels_equal_the_tree_reference_with_every_setting(method: str, seed: int):
    rng = np.random.default_rng(100 + seed)
    checked = 0
    for _ in range(20):
        batch, sizes, parents, total = random_forest(rng, 5)
        vocab = int(rng.integers(4, 40))
        target = rng.normal(0, 2, (total + batch, vocab)).astype(np.float32)
        draft = rng.normal(0, 2, (total, vocab)).astype(np.float32)
        ids = rng.integers(0, 4, total)
        temperature = np.where(rng.random(batch) < 0.3, 0.0, rng.uniform(0.5, 1.5, batch))
        settings = _random_settings(rng, batch, vocab, total + batch)
        settings.pop("logprobs")
        uniforms = rng.random((batch, int(sizes.max(initial=0)) + 1))
        draft_logits = draft if registry.get_tree_method(method).reads_draft_probs else None
        keywords = dict(num_nodes=sizes, tree_parents=parents, draft_token_ids=ids,
                        target_logits=target, draft_logits=draft_logits,
                        temperature=temperature, uniforms=uniforms, method=method)
        try:
            expected = _tree_reference.verify_tree_requests(
                sizes, parents, ids, target, draft_logits, uniforms, method=method,
                from_logits=True, temperature=temperature, settings=settings,
            )
        except ValueError:
            with pytest.raises(ValueError, match="no positive probability"):
                specdec_np.verify_tree(**keywords, **settings)
            continue
        fast = specdec_np.verify_tree(**keywords, **settings)
        np.testing.assert_array_equal(fast.output_token_ids, expected[1])
        np.testing.assert_array_equal(fast.accepted_lengths, expected[2])
        np.testing.assert_array_equal(fast.accepted_nodes, expected[0])
        np.testing.assert_array_equal(fast.finished, expected[3])
        checked += 1
    assert checked >= 10


def _tree_logprob_cases(method: str, seed: int) -> Any:
    """Random trees on a small vocabulary whose drafts repeat tokens 0..3, with penalties
    over the output and the ancestors, a bitmask per node row and the other settings at
    random: (the library's result, the tree reference's logprobs) per batch."""
    rng = np.random.default_rng(200 + seed)
    entry = registry.get_tree_method(method)
    for _ in range(10):
        batch, sizes, parents, total = random_forest(rng, 7)
        vocab = int(rng.integers(5, 9))
        # Tokens 0..3 (the drafts') likely and mostly allowed, so that runs go deep.
        target = rng.normal(0, 1, (total + batch, vocab)).astype(np.float32)
        target[:, :4] += 3
        draft = rng.normal(0, 1, (total, vocab)).astype(np.float32)
        ids = rng.integers(0, 4, total)
        temperature = np.where(rng.random(batch) < 0.3, 0.0, rng.uniform(0.5, 1.5, batch))
        bits = rng.random((total + batch, vocab)) < np.where(np.arange(vocab) < 4, 0.85, 0.5)
        settings = _random_settings(rng, batch, vocab, total + batch)
        settings.update(
            output_token_ids=[list(rng.integers(0, 4, 2)) for _ in range(batch)],
            repetition_penalty=rng.uniform(1.2, 2, batch),
            frequency_penalty=rng.uniform(0.2, 1, batch),
            token_bitmask=(bits << np.arange(vocab)).sum(axis=1, keepdims=True).astype(np.int32),
            logprobs=int(rng.integers(1, 4)),
        )
        draft_logits = draft if entry.reads_draft_probs else None
        uniforms = rng.random((batch, int(sizes.max(initial=0)) + 1))
        try:
            expected = _tree_reference.verify_tree_requests(
                sizes, parents, ids, target, draft_logits, uniforms, method=method,
                from_logits=True, temperature=temperature, top_k=3, settings=settings,
            )
        except ValueError:
            continue  # a row masked whole: the tree kernels' test covers the refusal
        fast = specdec_np.verify_tree(
            num_nodes=sizes, tree_parents=parents, draft_token_ids=ids, target_logits=target,
            draft_logits=draft_logits, temperature=temperature, top_k=3, uniforms=uniforms,
            method=method, **settings,
        )
        np.testing.assert_array_equal(fast.output_token_ids, expected[1])
        yield fast, expected[4]


def _compare_logprobs(logprobs: np.ndarray, top_logprobs: np.ndarray, fast: Any,
                      extras: dict) -> None:
    np.testing.assert_array_equal(fast.top_token_ids, extras["top_token_ids"])
    np.testing.assert_allclose(fast.raw_logprobs, extras["raw_logprobs"], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(logprobs, extras["logprobs"], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(top_logprobs, extras["top_logprobs"], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("method", [entry.name for entry in registry.TREE_METHODS])
def test_tree_logprobs_equal_the_tree_reference(method: str) -> None:
    """Every emitted position's logprobs are those of the row it was drawn from (the root,
    then each accepted node's), adjusted with its ancestors as context; the control (the
    raw law reported as the processed one) fails on the same batches."""
    checked = deep = control_caught = 0
    for seed in range(2):
        for fast, extras in _tree_logprob_cases(method, seed):
            _compare_logprobs(fast.logprobs, fast.top_logprobs, fast, extras)
            checked += 1
            # Positions past the root's: rows adjusted with ancestors as context.
            deep += int(np.sum(~np.isnan(np.asarray(fast.logprobs)[:, 1:])))
            try:
                _compare_logprobs(fast.raw_logprobs, fast.top_logprobs, fast, extras)
            except AssertionError:
                control_caught += 1
    assert checked >= 8 and deep >= 8
    assert control_caught >= checked - 2


# --------------------------------------------------------------------------------------
# The padded layout: no sampling settings; the same batch through the ragged call
# --------------------------------------------------------------------------------------


def _padded_fronts() -> list[tuple[str, Any]]:
    """Every padded front of the registry's verifiers (function, sampler, run_padded): the
    name its errors give, and a call taking extra keywords on a small batch."""
    from specdec_np import verify

    target = np.full((1, 3, 4), 0.25)
    arrays = (target, np.array([[0]]), np.full((1, 2, 4), 0.25), np.array([[1, 2]]))
    fronts = []
    for verifier in registry.VERIFIERS:
        reads = arrays if verifier.stochastic else arrays[:2] + arrays[3:]
        if verifier.function_name is not None:
            function = getattr(specdec_np, verifier.function_name)
            fronts.append((verifier.function_name,
                           lambda extra, f=function, a=reads: f(*a, **extra)))
        if verifier.sampler_name is not None:
            sampler = getattr(specdec_np, verifier.sampler_name)()
            fronts.append((f"{verifier.sampler_name}.forward",
                           lambda extra, s=sampler: s(*arrays, **extra)))
        fronts.append(("run_padded", lambda extra, v=verifier: (
            verify.run_padded(v, *arrays, **extra))))
    return fronts


def test_the_padded_fronts_refuse_every_sampling_keyword_by_name() -> None:
    from specdec_np._layouts.padded import SAMPLING_KEYWORDS

    assert {"temperature", "stop_token_ids", "logprobs", "token_bitmask"} <= SAMPLING_KEYWORDS
    for label, call in _padded_fronts():
        call({})  # the batch itself is good
        for name in sorted(SAMPLING_KEYWORDS):
            with pytest.raises(TypeError, match=f"^{label}\\(\\) takes no sampling "
                               f"settings \\({name}\\).*verify_ragged"):
                call({name: None})
        with pytest.raises(TypeError, match="unexpected keyword"):  # the control
            call({"not_a_setting": None})


@pytest.mark.parametrize("verifier", registry.VERIFIERS, ids=lambda v: v.name)
def test_a_padded_batch_takes_the_surface_through_the_ragged_call(verifier: Any) -> None:
    """The refusal's advice holds: the padded rows flattened, ``k`` drafts per request,
    give the padded outputs through verify_ragged, and with stops and logprobs that run
    cut at its stop (the reference's cut) and the logprobs of the rows as given."""
    from specdec_np import verify

    rng = np.random.default_rng(7)
    batch, k, vocab = 6, 3, 5
    logits = rng.normal(0, 1, (batch * (k + 1), vocab)) + np.array([2.0, 2.0, 0, 0, 0])
    target = specdec_np.processed_probs(logits).reshape(batch, k + 1, vocab)
    draft = specdec_np.processed_probs(rng.normal(0, 1, (batch * k, vocab)))
    draft = draft.reshape(batch, k, vocab)
    ids = rng.integers(0, 3, (batch, k))
    ids[::2] = np.argmax(target[::2, :k], axis=2)  # long runs, for every verifier
    bonus = rng.integers(0, vocab, (batch, 1))
    uniforms = rng.random((batch, k + 1))
    padded = verify.run_padded(verifier, target, bonus, draft, ids,
                               **({"uniforms": uniforms} if verifier.stochastic else {}))
    common = dict(
        num_draft_tokens=np.full(batch, k), draft_token_ids=ids.reshape(-1),
        target_probs=target.reshape(-1, vocab),
        draft_probs=draft.reshape(-1, vocab) if verifier.reads_draft_probs else None,
        bonus_token_ids=bonus[:, 0], method=verifier.name,
        uniforms=np.concatenate([uniforms, np.zeros((batch, 1))], axis=1),
    )
    plain = specdec_np.verify_ragged(**common)
    np.testing.assert_array_equal(plain.output_token_ids, padded.output_token_ids)
    # A stop at the second emitted token where there is one.
    stops = [[int(row[min(1, int(length))])] for row, length in
             zip(padded.output_token_ids, padded.accepted_lengths)]
    surface = specdec_np.verify_ragged(**common, stop_token_ids=stops, logprobs=2)
    for b in range(batch):
        run = [int(t) for t in padded.output_token_ids[b] if t >= 0]
        tokens, length, finished = _reference_surface.cut_run(
            run, int(padded.accepted_lengths[b]), stops[b], None
        )
        np.testing.assert_array_equal(surface.output_token_ids[b, : len(tokens)], tokens)
        assert (surface.output_token_ids[b, len(tokens) :] == -1).all()
        assert surface.accepted_lengths[b] == length and surface.finished[b] == finished
        expected = np.log(target[b, np.arange(len(tokens)), tokens])
        np.testing.assert_allclose(surface.logprobs[b, : len(tokens)], expected, rtol=1e-6)
        np.testing.assert_allclose(surface.raw_logprobs[b, : len(tokens)], expected, rtol=1e-6)
    assert not np.array_equal(surface.output_token_ids, padded.output_token_ids)


def _vllm_metadata(vocab: int, seed: int, greedy: bool) -> tuple[Any, dict]:
    """A ``SamplingMetadata``-like object (vLLM's attribute names) and the keywords of
    :func:`specdec_np.verify_ragged` it maps to."""
    import types

    mask = np.zeros((2, vocab), dtype=bool)
    mask[1, vocab // 2 :] = True  # request 1 may only use the lower half
    metadata = types.SimpleNamespace(
        all_greedy=greedy, all_random=not greedy,
        temperature=None if greedy else np.array([0.8, 1.1]), top_k=None, top_p=None,
        generators={} if greedy else {b: np.random.default_rng(seed + b) for b in range(2)},
        no_penalties=False, frequency_penalties=np.array([0.5, 0.0]),
        presence_penalties=np.array([0.2, -0.3]), repetition_penalties=np.array([1.5, 1.0]),
        prompt_token_ids=np.array([[1, 2, vocab], [3, vocab, vocab]]),
        output_token_ids=[[1], [2, 3]], allowed_token_ids_mask=mask,
        bad_words_token_ids={1: [[3, 3]]},
        logitsprocs=types.SimpleNamespace(all=[
            types.SimpleNamespace(min_toks={0: (5, [1], {7})}),
            types.SimpleNamespace(biases={1: {6: 3.0}}),
        ]),
    )
    keywords = dict(
        frequency_penalty=[0.5, 0.0], presence_penalty=[0.2, -0.3],
        repetition_penalty=[1.5, 1.0], prompt_token_ids=[[1, 2], [3]],
        output_token_ids=[[1], [2, 3]], allowed_token_ids=[None, list(range(vocab // 2))],
        bad_words_token_ids=[None, [[3, 3]]], min_tokens=[5, 0], stop_token_ids=[[7], None],
        logit_bias=[None, {6: 3.0}], temperature=0.0 if greedy else [0.8, 1.1],
    )
    if not greedy:
        keywords["seeded_seqs"] = {b: np.random.default_rng(seed + b) for b in range(2)}
    return metadata, keywords


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_the_vllm_adapter_reads_the_surface_from_sampling_metadata(greedy: bool, seed: int):
    from specdec_np.adapters import vllm

    vocab = 16
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (5, vocab)).astype(np.float32)
    ids = np.array([1, 1, 7, 3, 3])
    bonus = np.array([[4], [5]])
    metadata, keywords = _vllm_metadata(vocab, seed, greedy)
    probs = None if greedy else specdec_np.processed_probs(
        rng.normal(size=(5, vocab)).astype(np.float32)
    )
    output = vllm.rejection_sample(ids, [3, 2], 3, np.array([3, 5]), probs, logits, bonus,
                                   metadata)
    expected = specdec_np.verify_ragged(
        num_draft_tokens=[3, 2], draft_token_ids=ids, target_logits=logits, draft_probs=probs,
        bonus_token_ids=bonus[:, 0], **keywords,
    )
    np.testing.assert_array_equal(output, expected.output_token_ids)


def test_the_vllm_adapter_without_the_surface_differs() -> None:
    """The control: the same batch with the surface's attributes left out emits other
    tokens for some seed (the mapping above is being tested)."""
    import types

    from specdec_np.adapters import vllm

    differs = False
    for seed in range(4):
        logits = np.random.default_rng(seed).normal(0, 2, (5, 16)).astype(np.float32)
        metadata, _ = _vllm_metadata(16, seed, True)
        bare = types.SimpleNamespace(**{name: getattr(metadata, name)
                                        for name in vllm.METADATA_ATTRIBUTES})
        arguments = (np.array([1, 1, 7, 3, 3]), [3, 2], 3, np.array([3, 5]), None, logits,
                     np.array([[4], [5]]))
        differs |= not np.array_equal(vllm.rejection_sample(*arguments, metadata),
                                      vllm.rejection_sample(*arguments, bare))
    assert differs


def test_processed_probs_with_row_settings_is_the_reference_law() -> None:
    rng = np.random.default_rng(12)
    logits = rng.normal(0, 2, (4, 40)).astype(np.float32)
    settings = _random_settings(rng, 4, 40, 4)
    for name in ("max_tokens", "logprobs"):
        settings.pop(name, None)
    settings.update(repetition_penalty=[1.3, 1.0, 0.7, 2.0],
                    output_token_ids=[[1, 1], [2], [], [5]])
    law = specdec_np.processed_probs(logits, temperature=0.8, top_p=0.9, **settings)
    for row in range(4):
        before = list(settings["output_token_ids"][row])
        masks = settings.get("token_bitmask")
        adjusted = _reference_surface.adjust_logits(
            np, logits[row : row + 1], [before], settings, row,
            None if masks is None else masks[row : row + 1],
        )
        expected = _reference.process_logits(adjusted, np.array([0.8]), np.array([0]),
                                             np.array([0.9]), np.array([0.0]))
        np.testing.assert_allclose(law[row], expected[0], atol=1e-6)


def test_a_cut_run_is_written_into_the_out_buffers() -> None:
    target = np.full((4, 6), -5.0, dtype=np.float32)
    for position, token in enumerate([1, 2, 3, 4]):
        target[position, token] = 5.0
    out = specdec_np.output_buffers(1, 3)
    result = specdec_np.verify_ragged(num_draft_tokens=[3], draft_token_ids=[1, 2, 3],
                                      target_logits=target, temperature=0,
                                      stop_token_ids=[[2]], out=out)
    np.testing.assert_array_equal(out.output_token_ids[0], [1, 2, -1, -1])
    assert result.output_token_ids is out.output_token_ids
