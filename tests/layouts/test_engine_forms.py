"""Mixed row forms of the engine layouts (docs/semantics.md §12): any target form with any
draft form.  vLLM v1 hands its sampler target logits with the drafter's probabilities;
draft probabilities are used as given, draft logits get the target's processing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np import registry
from specdec_np._reference import ragged as ragged_reference
from specdec_np._reference import trees as _tree_reference
from specdec_np.testing import _statistics

FORMS = [("logits", "probs"), ("probs", "logits")]


def _rows(rng, n, vocab, form, dtype):
    if form == "logits":
        return (rng.normal(size=(n, vocab)) * 2).astype(dtype)
    return rng.dirichlet(np.ones(vocab) * 0.5, size=n).astype(dtype)


@st.composite
def ragged_cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    vocab = draw(st.integers(2, 60))
    counts = np.asarray(draw(st.lists(st.integers(0, 4), min_size=1, max_size=5)))
    batch, total = counts.size, int(counts.sum())
    target_form, draft_form = draw(st.sampled_from(FORMS))
    target = _rows(rng, total + batch, vocab, target_form, dtype)
    draft = _rows(rng, total, vocab, draft_form, dtype)
    parameters = {"temperature": rng.choice([0.0, 0.7, 1.0, 1.5], size=batch)}
    if target_form == "logits":
        parameters["top_k"] = rng.choice([0, 3, vocab], size=batch)
        parameters["top_p"] = rng.choice([1.0, 0.85], size=batch)
    return {
        "num_draft_tokens": counts,
        "draft_token_ids": rng.integers(0, vocab, total),
        f"target_{target_form}": target,
        f"draft_{draft_form}": draft,
        "uniforms": rng.random((batch, int(counts.max()) + 2)),
        **parameters,
    }


@settings(max_examples=150, deadline=None)
@given(case=ragged_cases(), method=st.sampled_from(registry.names(lossless=True)))
def test_mixed_forms_equal_the_reference(case, method) -> None:
    """Kernel and reference on the same uniforms: equal.  The rows are continuous random
    values, so no decision or draw falls within rounding of a boundary (measured: none in
    9,848 requests of 400 seeds)."""
    result = specdec_np.verify_ragged(**case, method=method)
    target_logits = "target_logits" in case
    reference, lengths = ragged_reference.verify_ragged(
        case["num_draft_tokens"], case["draft_token_ids"],
        case["target_logits"] if target_logits else case["target_probs"],
        case.get("draft_probs", case.get("draft_logits")),
        method=method, from_logits=target_logits, draft_from_logits=not target_logits,
        temperature=case["temperature"], top_k=case.get("top_k"), top_p=case.get("top_p"),
        uniforms=case["uniforms"],
    )
    np.testing.assert_array_equal(result.output_token_ids, reference)


def test_target_logits_with_draft_probabilities_is_lossless() -> None:
    """Chi-square of the emitted first token against the processed target law, drafts
    drawn from the given draft probabilities; the negative control (the draft rows
    processed again as logits, which is what a logits-only API forces) fails."""
    rng = np.random.default_rng(6)
    vocab, n = 6, 60_000
    target_logits = np.array([[1.0, 0.2, -0.5, 0.7, -1.0, 0.0]] * 2)
    q = np.array([0.05, 0.4, 0.25, 0.1, 0.1, 0.1])
    p = specdec_np.processed_probs(target_logits[:1], top_k=4, temperature=0.9)[0]
    drafts = rng.choice(vocab, size=n, p=q)

    def first_tokens(**draft) -> np.ndarray:
        result = specdec_np.verify_ragged(
            num_draft_tokens=np.ones(n, dtype=np.int64), draft_token_ids=drafts,
            target_logits=np.tile(target_logits, (n, 1)), top_k=4, temperature=0.9,
            generator=np.random.default_rng(7), **draft,
        )
        return result.output_token_ids[:, 0]

    def p_value(tokens: np.ndarray) -> float:
        counts = np.bincount(tokens, minlength=vocab)
        return _statistics.chi_square_p_value(*_statistics.chi_square_statistic(counts, p))

    assert p_value(first_tokens(draft_probs=np.tile(q, (n, 1)))) > 1e-4
    wrong = first_tokens(draft_logits=np.tile(np.log(q), (n, 1)))
    assert p_value(wrong) < 1e-9, "processing the draft probabilities again went unnoticed"


@pytest.mark.parametrize(("target_form", "draft_form"), FORMS)
@pytest.mark.parametrize("method", registry.tree_method_names(stochastic=True))
def test_trees_take_mixed_forms(target_form, draft_form, method) -> None:
    rng = np.random.default_rng(8)
    vocab = 12
    parents = np.array([-1, 0, -1, 2, -1])
    counts = np.array([5])
    target = _rows(rng, 6, vocab, target_form, np.float64)
    draft = _rows(rng, 5, vocab, draft_form, np.float64)
    uniforms = rng.random((1, 6))
    arguments = {
        "num_nodes": counts, "tree_parents": parents,
        "draft_token_ids": rng.integers(0, vocab, 5),
        f"target_{target_form}": target, f"draft_{draft_form}": draft,
        "method": method, "temperature": 0.8, "uniforms": uniforms,
    }
    result = specdec_np.verify_tree(**arguments)
    nodes, tokens, lengths = _tree_reference.verify_tree_requests(
        counts, parents, arguments["draft_token_ids"], target, draft, uniforms,
        method=method, from_logits=target_form == "logits",
        draft_from_logits=draft_form == "logits", temperature=0.8,
    )
    np.testing.assert_array_equal(result.output_token_ids, tokens)
    np.testing.assert_array_equal(result.accepted_nodes, nodes)


@settings(max_examples=60, deadline=None)
@given(case=ragged_cases(), method=st.sampled_from(registry.names()))
def test_target_rows_without_bonus_rows_when_the_bonus_is_given(case, method) -> None:
    """vLLM v1 holds its target logits for the draft positions only ([T, V]): with the bonus
    ids given, that layout gives the results of [T + B, V], whose bonus rows are unread."""
    counts = case["num_draft_tokens"]
    rng = np.random.default_rng(int(counts.sum()))
    target_name = "target_logits" if "target_logits" in case else "target_probs"
    vocab = case[target_name].shape[1]
    case["bonus_token_ids"] = rng.integers(0, vocab, counts.size)
    keep = np.ones(case[target_name].shape[0], dtype=bool)
    keep[np.cumsum(counts + 1) - 1] = False
    full = specdec_np.verify_ragged(**case, method=method)
    short = specdec_np.verify_ragged(**{**case, target_name: case[target_name][keep]},
                                     method=method)
    np.testing.assert_array_equal(short.output_token_ids, full.output_token_ids)
    np.testing.assert_array_equal(short.accepted_lengths, full.accepted_lengths)
    without_bonus = {k: v for k, v in case.items() if k != "bonus_token_ids"}
    if counts.size:
        with pytest.raises(ValueError, match=r"\[T \+ B, V\]"):
            specdec_np.verify_ragged(**{**without_bonus, target_name: case[target_name][keep]},
                                     method=method)
