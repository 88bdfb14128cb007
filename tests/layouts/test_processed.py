"""The processed law as a function (``specdec_np.processed_probs``) and the draws of steps
without drafts (``specdec_np.sample_tokens``): docs/semantics.md §12."""

from __future__ import annotations

import numpy as np
import pytest
from draw_checks import assert_draw_consistent
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np._reference.chains import process_logits
from specdec_np._runtime.contract import FILTER_ORDER_CODES
from specdec_np.testing import _statistics

DTYPES = (np.float32, np.float64)
ORDERS = sorted(FILTER_ORDER_CODES)


@st.composite
def cases(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from(DTYPES))
    n, vocab = draw(st.integers(1, 6)), draw(st.integers(1, 300))
    levels = rng.normal(size=draw(st.integers(1, 6))) * 3
    logits = rng.choice(levels, size=(n, vocab))
    if draw(st.booleans()):
        logits = logits + rng.normal(size=(n, vocab))
    temperature = rng.choice([0.0, 0.5, 1.0, 2.0], size=n)
    top_k = rng.choice([0, 1, 3, vocab], size=n)
    top_p = rng.choice([1.0, 0.9, 0.5], size=n)
    min_p = rng.choice([0.0, 0.1], size=n)
    return logits.astype(dtype), temperature, top_k, top_p, min_p, rng


@settings(max_examples=120, deadline=None)
@given(case=cases(), order=st.sampled_from(ORDERS))
def test_processed_probs_is_the_reference_law(case, order: str) -> None:
    logits, temperature, top_k, top_p, min_p, _ = case
    rows = specdec_np.processed_probs(
        logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
        filter_order=order,
    )  # fmt: skip
    assert rows.dtype == logits.dtype and rows.shape == logits.shape
    sampled = temperature > 0
    reference = process_logits(
        logits[sampled], temperature[sampled], top_k[sampled], top_p[sampled], min_p[sampled],
        order,
    )  # fmt: skip
    tolerance = 1e-5 if logits.dtype == np.float32 else 1e-12
    # The kept sets agree except where a filter's boundary lies within rounding.
    agree = ((rows[sampled] > 0) == (reference > 0)).all(axis=1)
    np.testing.assert_allclose(rows[sampled][agree], reference[agree], rtol=tolerance, atol=1e-30)
    argmax = np.where(np.isnan(logits), -np.inf, logits).argmax(axis=1)
    np.testing.assert_array_equal(rows[~sampled], np.eye(logits.shape[1])[argmax[~sampled]])


@settings(max_examples=80, deadline=None)
@given(case=cases(), order=st.sampled_from(ORDERS))
def test_sample_tokens_draws_from_processed_probs(case, order: str) -> None:
    """The token of uniform u is the inverse-CDF draw at u over processed_probs' rows (the
    same rows the kernel reads), up to a CDF boundary within rounding."""
    logits, temperature, top_k, top_p, min_p, rng = case
    parameters = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, filter_order=order
    )
    rows = specdec_np.processed_probs(logits, **parameters).astype(np.float64)
    uniforms = rng.random(logits.shape[0])
    tokens = specdec_np.sample_tokens(logits=logits, uniforms=uniforms, **parameters)
    for i, token in enumerate(tokens):
        if temperature[i] == 0:
            assert rows[i, token] == 1.0
            continue
        cdf = np.cumsum(rows[i])
        expected = min(int(np.searchsorted(cdf, uniforms[i] * cdf[-1], side="right")),
                       int(np.flatnonzero(rows[i] > 0)[-1]))
        assert_draw_consistent(token, expected, rows[i], uniforms[i])


# A row where the orders keep different sets: at temperature 2 llama.cpp's top-p 0.8 (mass
# at temperature 1: 0.54, 0.87) keeps the two largest logits and vLLM's (at 2: 0.37, 0.66,
# 0.80) the three largest; min-p 0.1 drops nothing more in either order.
_ORDER_ROW = np.array([[3.0, 2.5, 1.0, 0.0, -0.5, -1.0]], dtype=np.float32)
_ORDER_SETTING = dict(temperature=2.0, top_p=0.8, min_p=0.1)


def test_the_orders_keep_different_sets() -> None:
    kept = {
        order: np.flatnonzero(
            specdec_np.processed_probs(_ORDER_ROW, **_ORDER_SETTING, filter_order=order)[0]
        ).tolist()
        for order in ORDERS
    }
    assert kept == {"llama.cpp": [0, 1], "vllm": [0, 1, 2]}


@pytest.mark.slow
def test_sample_tokens_chi_square_in_llama_cpp_order() -> None:
    """20,000 draws of sample_tokens in llama.cpp's order fit processed_probs' row (and the
    reference law); the same draws fail vLLM's order's law (negative control)."""
    draws = 20_000
    logits = np.repeat(_ORDER_ROW, draws, axis=0)
    tokens = specdec_np.sample_tokens(
        logits=logits, **_ORDER_SETTING, filter_order="llama.cpp",
        generator=np.random.default_rng(11),
    )  # fmt: skip
    counts = np.bincount(tokens, minlength=_ORDER_ROW.shape[1])
    law = specdec_np.processed_probs(_ORDER_ROW, **_ORDER_SETTING, filter_order="llama.cpp")
    reference = process_logits(
        _ORDER_ROW, np.array([2.0]), np.array([0]), np.array([0.8]), np.array([0.1]),
        "llama.cpp",
    )  # fmt: skip
    np.testing.assert_allclose(law[0], reference[0], rtol=1e-6)
    assert _statistics.chi_square_test(counts, law[0].astype(np.float64)) > 1e-4
    vllm_law = specdec_np.processed_probs(_ORDER_ROW, **_ORDER_SETTING)
    assert _statistics.chi_square_test(counts, vllm_law[0].astype(np.float64)) < 1e-6


def test_every_sampling_front_takes_the_order() -> None:
    """verify_ragged, EngineVerifier and verify_tree draw from llama.cpp's law when asked:
    at a uniform near 1 the token is the last one the order keeps."""
    logits = np.repeat(_ORDER_ROW, 2, axis=0)
    seen = {}
    for order in ORDERS:
        common = dict(target_logits=logits, **_ORDER_SETTING, filter_order=order)
        ragged = specdec_np.verify_ragged(
            num_draft_tokens=[0, 0], draft_token_ids=[], uniforms=np.full((2, 2), 0.999),
            **common,
        )  # fmt: skip
        engine = specdec_np.EngineVerifier(seed=0)(
            num_draft_tokens=[0, 0], draft_token_ids=[], uniforms=np.full((2, 2), 0.999),
            **common,
        )  # fmt: skip
        tree = specdec_np.verify_tree(
            num_nodes=[0, 0], tree_parents=[], draft_token_ids=[], method="point_mass",
            uniforms=np.full((2, 1), 0.999), **common,
        )  # fmt: skip
        seen[order] = [
            int(result.output_token_ids[0, 0]) for result in (ragged, engine, tree)
        ]
    assert seen == {"llama.cpp": [1, 1, 1], "vllm": [2, 2, 2]}


def test_sample_tokens_is_a_step_of_verify_ragged_without_drafts() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(5, 40)).astype(np.float32)

    def arguments(source: str, seed: int) -> dict:
        if source == "generator":
            return {"generator": np.random.default_rng(seed)}
        if source == "seeded_seqs":
            return {"seeded_seqs": {b: np.random.default_rng([seed, b]) for b in range(5)}}
        return {"counter_seeds": {b: (seed, b) for b in range(5)}}

    for source in ("generator", "seeded_seqs", "counter_seeds"):
        tokens = specdec_np.sample_tokens(logits=logits, temperature=0.8, **arguments(source, 7))
        ragged = specdec_np.verify_ragged(
            num_draft_tokens=[0] * 5, draft_token_ids=[], target_logits=logits,
            temperature=0.8, **arguments(source, 7),
        )
        np.testing.assert_array_equal(tokens, ragged.output_token_ids[:, 0])


def test_sample_tokens_from_probabilities_and_greedy_rows() -> None:
    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.ones(30), size=4)
    tokens = specdec_np.sample_tokens(
        probs=probs, temperature=[0.0, 1.0, 0.0, 1.0], uniforms=np.full(4, 0.999)
    )
    assert tokens[0] == probs[0].argmax() and tokens[2] == probs[2].argmax()
    assert tokens.dtype == np.int64 and tokens.shape == (4,)


def test_a_wrong_draw_is_caught_by_the_check() -> None:
    """Negative control: a draw from the unfiltered softmax fails the draw check."""
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rows = specdec_np.processed_probs(logits, top_k=2).astype(np.float64)
    unfiltered = np.exp(logits[0]) / np.exp(logits[0]).sum()
    wrong = int(np.searchsorted(np.cumsum(unfiltered), 0.99 * unfiltered.sum()))
    with pytest.raises(AssertionError):
        assert_draw_consistent(wrong, 1, rows[0], 0.99)


def test_out_and_single_rows() -> None:
    logits = np.random.default_rng(5).normal(size=(3, 16))
    out = np.empty((3, 16))
    assert specdec_np.processed_probs(logits, out=out, top_p=0.8) is not None
    np.testing.assert_array_equal(out, specdec_np.processed_probs(logits, top_p=0.8))
    np.testing.assert_array_equal(
        specdec_np.processed_probs(logits[1], top_p=0.8), out[1]
    )
    with pytest.raises(ValueError, match="out shares memory with logits"):
        specdec_np.processed_probs(logits, out=logits)
    with pytest.raises(TypeError, match="out must be a float64 array"):
        specdec_np.processed_probs(logits, out=np.empty((3, 16), np.float32))


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: specdec_np.processed_probs([[1.0, 2.0]], filter_order="sglang"), ValueError,
         "filter_order"),
        (lambda: specdec_np.processed_probs(np.zeros((2, 2, 2))), ValueError, "logits"),
        (lambda: specdec_np.processed_probs("abc"), TypeError, "logits"),
        (lambda: specdec_np.processed_probs([[1.0, 2.0]], top_p=0.0), ValueError, "top_p"),
        (lambda: specdec_np.sample_tokens(logits=[[1.0]], probs=[[1.0]]), ValueError,
         "exactly one"),
        (lambda: specdec_np.sample_tokens(logits=[[1.0]], uniforms=[0.5, 0.5]), ValueError,
         "uniforms"),
        (lambda: specdec_np.sample_tokens(logits=[[-np.inf, -np.inf]], uniforms=[0.5]),
         ValueError, "no positive probability"),
    ],
)
def test_bad_input_names_the_argument(call, error, message) -> None:
    with pytest.raises(error, match=message):
        call()


def test_an_out_of_one_row_for_several_rows_is_refused_naming_it() -> None:
    logits = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"^out must .*shape \[3, 4\]; found \[4\]"):
        specdec_np.processed_probs(logits, out=np.empty(4, np.float32))
    with pytest.raises(ValueError, match=r"^out must .*shape \[3, 4\]; found \[1, 4\]"):
        specdec_np.processed_probs(logits, out=np.empty((1, 4), np.float32))
    with pytest.raises(TypeError, match="^out must be a plain NumPy array, not a masked"):
        specdec_np.processed_probs(logits, out=np.ma.masked_array(np.empty((3, 4), np.float32)))
    # One row may be written through its [V] view, whichever form the row was given in.
    for rows in (logits[0], logits[:1]):
        out = np.empty(4, np.float32)
        specdec_np.processed_probs(rows, out=out)
        np.testing.assert_array_equal(out, np.full(4, 0.25, np.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_empty_batch_is_a_valid_call(dtype) -> None:
    rows = np.zeros((0, 5), dtype)
    for parameters in ({}, {"temperature": [], "top_k": [], "top_p": [], "min_p": []},
                       {"temperature": 0.5, "top_k": 2}):
        law = specdec_np.processed_probs(rows, **parameters)
        assert law.shape == (0, 5) and law.dtype == dtype
        tokens = specdec_np.sample_tokens(logits=rows, **parameters)
        assert tokens.shape == (0,) and tokens.dtype == np.int64
    tokens = specdec_np.sample_tokens(probs=rows, uniforms=np.zeros(0))
    assert tokens.shape == (0,) and tokens.dtype == np.int64
    out = np.empty((0, 5), dtype)
    assert specdec_np.processed_probs(rows, out=out) is not None
