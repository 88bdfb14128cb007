"""The draft side: ``sample_tokens(..., return_probs=True)`` gives the ``q`` a drafter
sampled from, and ``stream="draft"`` draws the counter-based uniforms of ``sample_tokens``,
``verify_ragged`` and ``verify_tree`` from a domain apart from the verify stream's
(docs/semantics.md §5.1 and §12)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_processed import ORDERS, cases
from test_tree import rows as tree_rows
from test_tree import tree_batches

import specdec_np
from specdec_np._layouts import processed as _processed


def test_sample_tokens_keeps_its_return_by_default() -> None:
    logits = np.random.default_rng(0).normal(size=(4, 9))
    plain = specdec_np.sample_tokens(logits=logits, generator=np.random.default_rng(1))
    pair = specdec_np.sample_tokens(
        logits=logits, generator=np.random.default_rng(1), return_probs=True
    )
    assert isinstance(plain, np.ndarray) and plain.dtype == np.int64
    token_ids, probs = pair
    np.testing.assert_array_equal(token_ids, plain)
    assert probs.dtype == np.float64 and probs.shape == (4,)


@settings(max_examples=40, deadline=None)
@given(case=cases(), order=st.sampled_from(ORDERS))
def test_return_probs_is_processed_probs_at_the_drawn_token(case, order: str) -> None:
    """Bit for bit the entry of processed_probs (widened exactly), 1.0 for greedy rows."""
    logits, temperature, top_k, top_p, min_p, rng = case
    parameters = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, filter_order=order
    )
    law = specdec_np.processed_probs(logits, **parameters)
    token_ids, probs = specdec_np.sample_tokens(
        logits=logits, uniforms=rng.random(logits.shape[0]), return_probs=True, **parameters
    )
    expected = law[np.arange(logits.shape[0]), token_ids].astype(np.float64)
    np.testing.assert_array_equal(probs, expected)
    assert (probs[temperature == 0] == 1.0).all()
    assert (probs > 0).all()


@pytest.mark.parametrize("greedy_rows", [False, True], ids=["every-row", "some-rows"])
def test_return_probs_block_by_block(monkeypatch: pytest.MonkeyPatch, greedy_rows: bool) -> None:
    """A law made a few rows at a time gives the same bits as one made whole."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(7, 40)).astype(np.float32) * 3
    temperature = np.where(np.arange(7) % 3 == 0, 0.0, 0.8) if greedy_rows else 0.8
    parameters = dict(temperature=temperature, top_k=12, top_p=0.95, min_p=0.02)
    monkeypatch.setattr(_processed, "_LAW_BLOCK_ENTRIES", 80)  # two rows a block
    token_ids, probs = specdec_np.sample_tokens(
        logits=logits, generator=np.random.default_rng(4), return_probs=True, **parameters
    )
    law = specdec_np.processed_probs(logits, **parameters)
    np.testing.assert_array_equal(probs, law[np.arange(7), token_ids].astype(np.float64))


def test_return_probs_with_the_sampling_surface() -> None:
    rng = np.random.default_rng(5)
    logits = rng.normal(size=(3, 20))
    parameters = dict(
        temperature=np.array([0.9, 0.0, 1.2]),
        prompt_token_ids=[[1, 2], [3], [4, 4]],
        output_token_ids=[[5], [], [6, 7]],
        repetition_penalty=1.3,
        frequency_penalty=0.4,
        logit_bias=[{0: 2.0}, {}, {9: -1.5}],
    )
    token_ids, probs = specdec_np.sample_tokens(
        logits=logits, uniforms=rng.random(3), return_probs=True, **parameters
    )
    law = specdec_np.processed_probs(logits, **parameters)
    np.testing.assert_array_equal(probs, law[np.arange(3), token_ids])
    assert probs[1] == 1.0


def test_return_probs_of_probability_rows_is_the_entry_as_given() -> None:
    rng = np.random.default_rng(6)
    rows = rng.dirichlet(np.ones(11), 5).astype(np.float32)
    temperature = np.array([1.0, 0.0, 1.0, 1.0, 0.0])
    token_ids, probs = specdec_np.sample_tokens(
        probs=rows, temperature=temperature, uniforms=rng.random(5), return_probs=True
    )
    sampled = temperature > 0
    np.testing.assert_array_equal(
        probs[sampled], rows[np.arange(5), token_ids][sampled].astype(np.float64)
    )
    assert (probs[~sampled] == 1.0).all()


def test_return_probs_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="return_probs"):
        specdec_np.sample_tokens(logits=np.zeros((1, 3)), temperature=0.0, return_probs=1)


# ---- streams ------------------------------------------------------------------------------

SEEDS = {b: (2**40 + 3 * b, 17 + b) for b in range(12)}


def seeds_and_positions(count: int) -> tuple[list[int], list[int]]:
    return [SEEDS[b][0] for b in range(count)], [SEEDS[b][1] for b in range(count)]


def test_sample_tokens_streams() -> None:
    """stream="verify" is the default bit for bit; stream="draft" is the same law at the
    draft stream's uniforms (draw 1 of each row, after the reserved residual draw)."""
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(12, 30))
    parameters = dict(temperature=0.9, top_p=0.9)
    default = specdec_np.sample_tokens(logits=logits, counter_seeds=SEEDS, **parameters)
    verify = specdec_np.sample_tokens(
        logits=logits, counter_seeds=SEEDS, stream="verify", **parameters
    )
    draft = specdec_np.sample_tokens(
        logits=logits, counter_seeds=SEEDS, stream="draft", **parameters
    )
    np.testing.assert_array_equal(verify, default)
    for stream, tokens in (("verify", default), ("draft", draft)):
        uniforms = specdec_np.counter_uniforms(*seeds_and_positions(12), 2, stream=stream)
        explicit = specdec_np.sample_tokens(logits=logits, uniforms=uniforms[:, 1], **parameters)
        np.testing.assert_array_equal(tokens, explicit)
    assert (draft != default).any()


@pytest.mark.parametrize("front", ["sample_tokens", "verify_ragged", "verify_tree"])
@pytest.mark.parametrize("stream", ["Draft", "", None])
def test_a_bad_stream_is_a_value_error(front: str, stream) -> None:
    logits = np.zeros((2, 3))
    calls = {
        "sample_tokens": dict(logits=logits),
        "verify_ragged": dict(
            num_draft_tokens=[1], draft_token_ids=[0], target_logits=logits
        ),
        "verify_tree": dict(
            num_nodes=[1], tree_parents=[-1], draft_token_ids=[0], target_logits=logits
        ),
    }
    with pytest.raises(ValueError, match="stream"):
        getattr(specdec_np, front)(**calls[front], counter_seeds={0: (1, 2)}, stream=stream)


def test_verify_ragged_streams() -> None:
    """The default is stream="verify" bit for bit; stream="draft" verifies with the draft
    stream's uniforms (the same law, other draws)."""
    rng = np.random.default_rng(8)
    counts = np.array([2, 0, 3, 1] * 3)
    vocab = 6
    arguments = dict(
        num_draft_tokens=counts,
        draft_token_ids=rng.integers(0, vocab, counts.sum()),
        target_logits=rng.normal(size=(counts.sum() + counts.size, vocab)),
        draft_logits=rng.normal(size=(counts.sum(), vocab)),
        temperature=0.8,
    )
    results = {
        stream: specdec_np.verify_ragged(**arguments, counter_seeds=SEEDS, stream=stream)
        for stream in ("verify", "draft")
    }
    default = specdec_np.verify_ragged(**arguments, counter_seeds=SEEDS)
    np.testing.assert_array_equal(results["verify"].output_token_ids, default.output_token_ids)
    width = int(counts.max()) + 2
    for stream, result in results.items():
        uniforms = specdec_np.counter_uniforms(*seeds_and_positions(12), width, stream=stream)
        explicit = specdec_np.verify_ragged(**arguments, uniforms=uniforms)
        np.testing.assert_array_equal(result.output_token_ids, explicit.output_token_ids)
        np.testing.assert_array_equal(result.accepted_lengths, explicit.accepted_lengths)
    assert (results["draft"].output_token_ids != default.output_token_ids).any()


def test_engine_verifier_takes_the_stream() -> None:
    rng = np.random.default_rng(11)
    counts = np.array([1, 2, 0, 3])
    arguments = dict(
        num_draft_tokens=counts,
        draft_token_ids=rng.integers(0, 5, counts.sum()),
        target_logits=rng.normal(size=(counts.sum() + counts.size, 5)),
        counter_seeds={b: SEEDS[b] for b in range(4)},
    )
    engine = specdec_np.EngineVerifier()
    for stream in ("verify", "draft"):
        found = engine(**arguments, stream=stream)
        expected = specdec_np.verify_ragged(**arguments, stream=stream)
        np.testing.assert_array_equal(found.output_token_ids, expected.output_token_ids)
    with pytest.raises(ValueError, match="stream"):
        engine(**arguments, stream="drafts")


@settings(max_examples=15, deadline=None)
@given(case=tree_batches(max_batch=4))
def test_verify_tree_streams(case) -> None:
    """As for the chains: the draft stream is the same walk at the draft stream's
    uniforms, and the default stream is "verify"."""
    batch_size = case["num_nodes"].size
    arguments = dict(
        num_nodes=case["num_nodes"],
        tree_parents=case["tree_parents"],
        draft_token_ids=case["draft_token_ids"],
        **tree_rows(case),
        **case["parameters"],
    )
    seeds = {b: SEEDS[b] for b in range(batch_size)}
    default = specdec_np.verify_tree(**arguments, counter_seeds=seeds)
    width = int(case["num_nodes"].max(initial=0)) + 1
    for stream in ("verify", "draft"):
        result = specdec_np.verify_tree(**arguments, counter_seeds=seeds, stream=stream)
        uniforms = specdec_np.counter_uniforms(
            *seeds_and_positions(batch_size), width, stream=stream
        )
        explicit = specdec_np.verify_tree(**arguments, uniforms=uniforms)
        np.testing.assert_array_equal(result.output_token_ids, explicit.output_token_ids)
        np.testing.assert_array_equal(result.accepted_nodes, explicit.accepted_nodes)
        if stream == "verify":
            np.testing.assert_array_equal(result.output_token_ids, default.output_token_ids)


def test_negative_control_a_drafter_on_the_verify_stream_shares_its_noise() -> None:
    """What the draft stream prevents: drafting with the verify stream under the same
    (seed, position) hands the drafter the very uniform that then draws the bonus token, so
    a request without drafts draws the drafter's token again; the draft stream does not."""
    rng = np.random.default_rng(9)
    logits = rng.normal(size=(12, 50)) * 0.3
    bonus = specdec_np.verify_ragged(
        num_draft_tokens=np.zeros(12, dtype=np.int64), draft_token_ids=np.zeros(0, np.int64),
        target_logits=logits, counter_seeds=SEEDS,
    ).output_token_ids[:, 0]  # fmt: skip
    shared = specdec_np.sample_tokens(logits=logits, counter_seeds=SEEDS)
    apart = specdec_np.sample_tokens(logits=logits, counter_seeds=SEEDS, stream="draft")
    np.testing.assert_array_equal(shared, bonus)
    assert (apart != bonus).any()


@pytest.mark.gpu
def test_cupy_streams_and_probs_are_numpy_s() -> None:
    import cupy

    rng = np.random.default_rng(10)
    logits = rng.normal(size=(12, 64)).astype(np.float32)
    parameters = dict(temperature=np.where(np.arange(12) % 4 == 0, 0.0, 0.7), top_k=20)
    for stream in ("verify", "draft"):
        host = specdec_np.sample_tokens(
            logits=logits, counter_seeds=SEEDS, stream=stream, return_probs=True, **parameters
        )
        device = specdec_np.sample_tokens(
            logits=cupy.asarray(logits), counter_seeds=SEEDS, stream=stream,
            return_probs=True, **parameters,
        )  # fmt: skip
        np.testing.assert_array_equal(cupy.asnumpy(device.token_ids), host.token_ids)
        law = cupy.asnumpy(specdec_np.processed_probs(cupy.asarray(logits), **parameters))
        expected = law[np.arange(12), host.token_ids].astype(np.float64)
        np.testing.assert_array_equal(cupy.asnumpy(device.probs), expected)
