"""The sampling surface's row settings applied inside the CPU chain kernel, where it reads a
row (``specdec_np._layouts.row_adjustments``), against the same settings applied on copies
of the rows first (the path the CPU tree kernel and strict mode keep; the CUDA kernels'
side is ``tests/kernels/test_gpu.py``'s).

* the sparse adjustments give every row the bits of the copied rows, on random settings
  and shapes (words that are all ones, all zeros and mixed, a last word cut by V, NaN and
  -inf entries, a bias that overflows the rows' dtype);
* ``verify_ragged`` gives the same tokens, lengths, stops and logprobs either way, for
  every registry verifier, and refuses the same temperatures;
* ``verify_tree`` gives the same nodes, tokens, stops and logprobs either way, for every
  tree method of the registry;
* ``processed_probs`` and ``sample_tokens(return_probs=True)``, whose law the kernel
  computes on the adjusted rows, give the same rows and probabilities either way;
* negative controls: adjustments without their bitmask, or with their overrides dropped,
  change the results, and the comparison sees it;
* the kernel refuses malformed adjustments by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from random_trees import random_forest

import specdec_np
from specdec_np import _core, registry
from specdec_np._kernels import dispatch as _dispatch
from specdec_np._layouts import engine_call as _engine_call
from specdec_np._layouts import row_adjustments as _row_adjustments
from specdec_np._layouts import sampling as _sampling
from specdec_np._layouts import surface as _surface


def _random_settings(rng: np.random.Generator, batch: int, vocab: int, rows: int) -> dict:
    """Each row setting on with probability 1/2 (drafts use ids 0..3, so contexts repeat)."""
    words = (vocab + 31) // 32

    def bitmask() -> np.ndarray:
        # Whole words allowed or forbidden as often as mixed ones (the kernel's branches).
        mask = rng.integers(-(2**31), 2**31 - 1, (rows, words)).astype(np.int32)
        kind = rng.integers(0, 3, (rows, words))
        mask[kind == 0] = -1
        mask[kind == 1] = 0
        mask[:, 0] |= 0xF  # the drafts' ids stay possible somewhere
        return mask

    makers = {
        "output_token_ids": lambda: [list(rng.integers(0, 4, rng.integers(0, 5)))
                                     for _ in range(batch)],
        "prompt_token_ids": lambda: [list(rng.integers(0, vocab, 3)) for _ in range(batch)],
        "repetition_penalty": lambda: rng.uniform(0.5, 2, batch),
        "frequency_penalty": lambda: rng.uniform(-2, 2, batch),
        "presence_penalty": lambda: rng.uniform(-2, 2, batch),
        "logit_bias": lambda: [None if rng.random() < 0.3 else
                               {int(t): float(rng.normal(0, 2)) for t in
                                rng.integers(0, vocab, 3)} for _ in range(batch)],
        "allowed_token_ids": lambda: [None if rng.random() < 0.5 else
                                      list(rng.integers(0, vocab, 5)) + [0, 1, 2, 3]
                                      for _ in range(batch)],
        "bad_words_token_ids": lambda: [[[int(rng.integers(4))] * 2, [int(rng.integers(4))]]
                                        for _ in range(batch)],
        "min_tokens": lambda: rng.integers(0, 5, batch),
        "stop_token_ids": lambda: [list(rng.integers(0, vocab, 2)) for _ in range(batch)],
        "token_bitmask": bitmask,
    }
    return {name: make() for name, make in makers.items() if rng.random() < 0.5}


def _batch(rng: np.random.Generator, batch: int, vocab: int, dtype: Any) -> dict:
    counts = rng.integers(0, 4, batch)
    total = int(counts.sum())
    target = rng.normal(0, 2, (total + batch, vocab)).astype(dtype)
    # A few -inf (an engine's own masks) and NaN entries, away from the drafts' ids.
    target[rng.random(target.shape) < 0.05] = -np.inf
    target[:, 4:][rng.random((total + batch, vocab - 4)) < 0.02] = np.nan
    draft = rng.normal(0, 2, (total, vocab)).astype(dtype)
    return dict(num_draft_tokens=counts, draft_token_ids=rng.integers(0, 4, total),
                target_logits=target, draft_logits=draft,
                temperature=np.where(rng.random(batch) < 0.3, 0.0,
                                     rng.uniform(0.5, 1.5, batch)),
                uniforms=rng.random((batch, int(counts.max(initial=0)) + 2)))


def _call(keywords: dict, in_kernel: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``verify_ragged`` with the settings applied in the kernel or on copies."""
    chosen = _engine_call._adjusts_in_kernel
    with monkeypatch.context() as patch:
        patch.setattr(_engine_call, "_adjusts_in_kernel",
                      lambda *a: in_kernel and chosen(*a))
        try:
            return specdec_np.verify_ragged(**keywords)
        except ValueError as error:
            return str(error)


def _same(copied: Any, in_kernel: Any) -> None:
    if isinstance(copied, str) or isinstance(in_kernel, str):
        assert copied == in_kernel
        return
    for name in ("output_token_ids", "accepted_lengths", "num_accepted", "finished",
                 "top_token_ids"):
        np.testing.assert_array_equal(getattr(in_kernel, name), getattr(copied, name))
    for name in ("logprobs", "raw_logprobs", "top_logprobs"):
        np.testing.assert_array_equal(getattr(in_kernel, name), getattr(copied, name))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 3), vocab=st.integers(5, 80),
       double=st.booleans())
def test_sparse_adjustments_give_the_copied_rows(
    seed: int, batch: int, vocab: int, double: bool
) -> None:
    rng = np.random.default_rng(seed)
    rows = rng.normal(0, 2, (batch * 3, vocab)).astype(np.float64 if double else np.float32)
    rows[rng.random(rows.shape) < 0.1] = -np.inf
    rows[rng.random(rows.shape) < 0.05] = np.nan
    parameters = _random_settings(rng, batch * 3, vocab, batch * 3)
    if rng.random() < 0.3:
        # A bias beyond float32: +inf in the rows' dtype, NaN on a masked entry.
        parameters["logit_bias"] = [{0: 1e300, 5 % vocab: -1e300}] * (batch * 3)
    surface = _surface.checked_surface(_parameters(parameters), batch * 3, vocab, batch * 3, np)
    contexts = _surface.independent_contexts(batch * 3)
    # Each row its own request, with drafts before it (as chain positions have).
    contexts = contexts._replace(prefixes=[rng.integers(0, 4, rng.integers(0, 3))
                                           for _ in range(batch * 3)])
    chosen = np.flatnonzero(rng.random(batch * 3) < 0.7).astype(np.int64)
    if surface.bitmask is not None:
        chosen = np.arange(batch * 3, dtype=np.int64)
    copied = _surface.adjust_rows(rows, chosen, chosen, contexts, surface, np)
    sparse = _row_adjustments.sparse_adjustments(rows, chosen, chosen, contexts, surface)
    np.testing.assert_array_equal(sparse.apply(rows), copied)
    # Two arrays at once (the target and draft rows of a call) give each its own.
    other = rows[::-1].copy()
    pair = _row_adjustments.sparse_adjustments_of(
        [(rows, chosen, chosen), (other, chosen, chosen)], contexts, surface
    )
    np.testing.assert_array_equal(pair[0].apply(rows), copied)
    np.testing.assert_array_equal(
        pair[1].apply(other), _surface.adjust_rows(other, chosen, chosen, contexts, surface, np)
    )


def _parameters(values: dict) -> Any:
    fields = {name: None for name in _sampling.SamplingParameters._fields}
    fields.update(values)
    return _sampling.SamplingParameters(**fields)


@pytest.mark.parametrize("method", registry.names())
def test_in_kernel_equals_copies_for_every_verifier(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(sum(map(ord, method)))
    for _ in range(6):
        batch = int(rng.integers(1, 4))
        vocab = int(rng.integers(5, 70))
        keywords = _batch(rng, batch, vocab, [np.float32, np.float64][int(rng.integers(2))])
        if rng.random() < 0.3:
            # vLLM v1's form: no bonus rows, the bonus ids given.
            counts = keywords["num_draft_tokens"]
            bonus_rows = np.cumsum(counts + 1) - 1
            keywords["target_logits"] = np.delete(keywords["target_logits"], bonus_rows, 0)
            keywords["bonus_token_ids"] = rng.integers(0, vocab, batch)
        rows = keywords["target_logits"].shape[0]
        keywords.update(_random_settings(rng, batch, vocab, rows), method=method,
                        logprobs=int(rng.integers(0, 3)))
        if rng.random() < 0.3:
            keywords["draft_logits"] = None
        _same(_call(keywords, False, monkeypatch), _call(keywords, True, monkeypatch))


def test_in_kernel_path_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chain call hands the kernel its adjustments (and no copied rows)."""
    seen: list[dict] = []
    direct = _core.verify_chains_direct

    def spy(*arguments: Any, **options: Any) -> Any:
        seen.append(options)
        return direct(*arguments, **options)

    monkeypatch.setattr(_core, "verify_chains_direct", spy)
    rng = np.random.default_rng(3)
    keywords = _batch(rng, 2, 40, np.float32)
    target = keywords["target_logits"]
    keywords.update(logit_bias=[{1: 2.0}, None],
                    token_bitmask=np.full((target.shape[0], 2), -1, dtype=np.int32))
    specdec_np.verify_ragged(**keywords)
    assert "target_adjustments" in seen[-1] and "draft_adjustments" in seen[-1]


@pytest.mark.parametrize("broken", ["no bitmask", "no overrides"])
def test_broken_adjustments_are_seen(
    broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: adjustments that lose a part change what the kernel draws."""
    sparse = _row_adjustments.sparse_adjustments_of

    def broken_adjustments(*arguments: Any) -> Any:
        if broken == "no bitmask":
            return [found._replace(bitmask=None) for found in sparse(*arguments)]
        return [found._replace(offsets=None) for found in sparse(*arguments)]

    rng = np.random.default_rng(11)
    differs = 0
    for _ in range(10):
        keywords = _batch(rng, 3, 40, np.float32)
        rows = keywords["target_logits"].shape[0]
        keywords.update(_random_settings(rng, 3, 40, rows), logprobs=2,
                        repetition_penalty=3.0, output_token_ids=[[0, 1, 2, 3]] * 3,
                        token_bitmask=np.tile(np.array([0x5, 0], np.int32), (rows, 1)))
        copied = _call(keywords, False, monkeypatch)
        with monkeypatch.context() as patch:
            patch.setattr(_row_adjustments, "sparse_adjustments_of", broken_adjustments)
            damaged = _call(keywords, True, monkeypatch)
        try:
            _same(copied, damaged)
        except AssertionError:
            differs += 1
    assert differs >= 5


def test_the_temperature_check_reads_adjusted_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A logit that overflows at t = 0.5 is refused alike when a bias makes it, and
    passes alike when a mask hides it."""
    big = np.float32(3e38)
    keywords = dict(num_draft_tokens=np.array([1]), draft_token_ids=np.array([0]),
                    target_logits=np.zeros((2, 40), np.float32), temperature=0.5,
                    uniforms=np.full((1, 3), 0.5))
    made = dict(keywords, logit_bias=[{7: float(big)}])
    copied, in_kernel = _call(made, False, monkeypatch), _call(made, True, monkeypatch)
    assert isinstance(copied, str) and "temperature" in copied
    _same(copied, in_kernel)
    hidden = dict(keywords, target_logits=keywords["target_logits"].copy(),
                  allowed_token_ids=[[0, 1, 2]])
    hidden["target_logits"][:, 9] = big
    _same(_call(hidden, False, monkeypatch), _call(hidden, True, monkeypatch))
    assert not isinstance(_call(hidden, True, monkeypatch), str)
    # Only hugely negative logits left allowed: their largest overflows to -inf.
    low = dict(hidden, target_logits=np.full((2, 40), -big, np.float32))
    low["target_logits"][:, 20] = 0.0
    copied = _call(low, False, monkeypatch)
    assert isinstance(copied, str) and "temperature" in copied
    _same(copied, _call(low, True, monkeypatch))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("method", [entry.name for entry in registry.TREE_METHODS])
def test_trees_in_kernel_equal_copies(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(sum(map(ord, method)))
    seen: list[dict] = []
    run = _dispatch.run

    def spy(*arguments: Any, options: Any = None, **keywords: Any) -> Any:
        seen.append(options or {})
        return run(*arguments, options=options, **keywords)

    monkeypatch.setattr(_dispatch, "run", spy)
    for _ in range(8):
        batch, sizes, parents, total = random_forest(rng, 5)
        vocab = int(rng.integers(5, 60))
        dtype = [np.float32, np.float64][int(rng.integers(2))]
        keywords = dict(
            num_nodes=sizes, tree_parents=parents, draft_token_ids=rng.integers(0, 4, total),
            target_logits=rng.normal(0, 2, (total + batch, vocab)).astype(dtype),
            draft_logits=rng.normal(0, 2, (total, vocab)).astype(dtype)
            if registry.get_tree_method(method).reads_draft_probs else None,
            temperature=np.where(rng.random(batch) < 0.3, 0.0, rng.uniform(0.5, 1.5, batch)),
            uniforms=rng.random((batch, int(sizes.max(initial=0)) + 1)), method=method,
            logprobs=int(rng.integers(0, 3)),
            **_random_settings(rng, batch, vocab, total + batch),
        )
        results = []
        chosen = _engine_call._adjusts_in_kernel
        for in_kernel in (False, True):
            with monkeypatch.context() as patch:
                patch.setattr(_engine_call, "_adjusts_in_kernel",
                              lambda *a, on=in_kernel, chosen=chosen: on and chosen(*a))
                try:
                    results.append(specdec_np.verify_tree(**keywords))
                except ValueError as error:
                    results.append(str(error))
        _same(*results)
        if not isinstance(results[0], str):
            np.testing.assert_array_equal(results[1].accepted_nodes, results[0].accepted_nodes)
    # The kernel was handed the adjustments of some call.
    assert any("target_adjustments" in options for options in seen)


def _law_calls(keywords: dict, in_kernel: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``processed_probs`` and ``sample_tokens(return_probs=True)`` of the same rows, the
    settings applied in the kernel or on copies."""
    chosen = _surface.adjusted_rows_of
    with monkeypatch.context() as patch:
        patch.setattr(_surface, "adjusted_rows_of",
                      lambda parameters, rows, xp, kernel=False:
                      chosen(parameters, rows, xp, in_kernel and kernel))
        try:
            law = specdec_np.processed_probs(**keywords)
            drawn = specdec_np.sample_tokens(**keywords, uniforms=np.linspace(0.05, 0.95, len(
                keywords["logits"])), return_probs=True)
        except ValueError as error:
            return str(error)
    return law, drawn.token_ids, drawn.probs


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_processed_law_in_kernel_equals_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    differs = 0
    for case in range(12):
        rows, vocab = int(rng.integers(1, 6)), int(rng.integers(5, 90))
        logits = rng.normal(0, 2, (rows, vocab)).astype([np.float32, np.float64][case % 2])
        logits[rng.random(logits.shape) < 0.05] = -np.inf
        settings_ = _random_settings(rng, rows, vocab, rows)
        keywords = dict(logits=logits, top_k=int(rng.integers(0, 6)),
                        temperature=np.where(rng.random(rows) < 0.3, 0.0,
                                             rng.uniform(0.5, 1.5, rows)), **settings_)
        copied = _law_calls(keywords, False, monkeypatch)
        in_kernel = _law_calls(keywords, True, monkeypatch)
        if isinstance(copied, str) or isinstance(in_kernel, str):
            assert copied == in_kernel
            continue
        for expected, found in zip(copied, in_kernel):
            np.testing.assert_array_equal(found, expected)
        # Negative control: the kernel's law of the raw rows is not the law of the
        # adjusted ones (whenever a setting touches a row).
        raw = specdec_np.processed_probs(logits, top_k=keywords["top_k"],
                                         temperature=keywords["temperature"])
        differs += not np.array_equal(raw, copied[0])
    assert differs >= 6
    # The kernel was handed the adjustments (and no copied rows).
    seen: list[Any] = []
    processed_rows = _core.processed_rows
    monkeypatch.setattr(_core, "processed_rows", lambda *arguments, **options: (
        seen.append(options.get("adjustments")), processed_rows(*arguments, **options))[1])
    specdec_np.processed_probs(np.zeros((2, 40), np.float32), logit_bias=[{1: 2.0}, None])
    assert seen and seen[-1] is not None


@pytest.mark.parametrize("damage, message", [
    (lambda a: (a[0][:1], *a[1:]), "bitmask must be"),
    (lambda a: (a[0], a[1][:-1], a[2], a[3]), "offsets must have"),
    (lambda a: (a[0], a[1], a[2] + 1000, a[3]), "ids must be in"),
    (lambda a: (a[0], a[1][::-1].copy(), a[2], a[3]), "offsets must"),
])
def test_the_kernel_refuses_malformed_adjustments(damage: Any, message: str) -> None:
    rows = np.zeros((2, 40), np.float32)
    adjustments = (np.full((2, 2), -1, np.int32), np.array([0, 1, 2]), np.array([3, 4]),
                   np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=message):
        _core.first_tempered_overflow(rows, np.array([0.5]), np.zeros(1, bool),
                                      np.array([2]), damage(adjustments))
