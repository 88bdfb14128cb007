"""The engine layout: ``verify_ragged`` on probabilities and ``EngineVerifier``.

Every matrix iterates over ``specdec_np.registry.VERIFIERS``.  A batch is a dict of the
arguments of ``verify_ragged`` plus per-request randomness (explicit uniform rows, seeds
of per-request generators, counter seeds); :func:`sub_batch` takes any requests of it,
in any order, with their own rows and their own randomness, which is what batch
invariance compares against.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np import registry
from specdec_np._reference import chains as _reference
from specdec_np._runtime.philox import counter_uniforms
from specdec_np.testing import _monte_carlo, _oracles, _statistics

VERIFIERS = registry.VERIFIERS
VERIFIER_IDS = [verifier.name for verifier in VERIFIERS]
# The engine's own verifier of temperature-0 requests.
GREEDY = registry.get("greedy")
LOSSLESS = [registry.get(name) for name in registry.names(lossless=True)]
# Verifiers that draw a lazy bonus from the bonus row (the greedy one takes its argmax).
SAMPLING = [verifier for verifier in VERIFIERS if not verifier.greedy]
SOURCES = ("uniforms", "seeded_seqs", "counter_seeds")


# --------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------


def _rows(rng: np.random.Generator, count: int, vocab_size: int, sparse: bool) -> np.ndarray:
    rows = rng.dirichlet(np.ones(vocab_size), size=count)
    if sparse and vocab_size > 1:
        # Zeros exercise p(x) = 0 and q(x) = 0; each row keeps its largest entry.
        keep = rng.random((count, vocab_size)) < 0.6
        keep[np.arange(count), rows.argmax(axis=1)] = True
        rows = np.where(keep, rows, 0.0)
        rows /= rows.sum(axis=1, keepdims=True)
    return rows


def make_batch(
    rng: np.random.Generator,
    counts: list[int],
    vocab_size: int,
    *,
    dtype: type = np.float64,
    point_mass: bool = False,
    sparse: bool = False,
    greedy_share: float = 0.0,
    lazy_bonus: bool = False,
) -> dict:
    """A ragged batch with its per-request randomness."""
    counts_array = np.asarray(counts, dtype=np.int64)
    batch_size, total = len(counts), int(counts_array.sum())
    target = _rows(rng, total + batch_size, vocab_size, sparse)
    draft = _rows(rng, total, vocab_size, sparse)
    ids = np.empty(total, dtype=np.int64)
    for t in range(total):
        # Drafts drawn from their draft rows, or anywhere for point masses.
        ids[t] = rng.integers(vocab_size) if point_mass else rng.choice(vocab_size, p=draft[t])
    width = int(counts_array.max(initial=0)) + 2
    return {
        "num_draft_tokens": counts_array,
        "draft_token_ids": ids,
        "target_probs": target.astype(dtype),
        "draft_probs": None if point_mass else draft.astype(dtype),
        "bonus_token_ids": None if lazy_bonus else rng.integers(vocab_size, size=batch_size),
        "temperature": np.where(rng.random(batch_size) < greedy_share, 0.0, 1.0),
        "uniforms": rng.random((batch_size, width)),
        "seeds": rng.integers(2**32, size=batch_size),
        "positions": rng.integers(2**40, size=batch_size),
    }


def offsets(batch: dict) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(batch["num_draft_tokens"])]).astype(np.int64)


def sub_batch(batch: dict, order: list[int]) -> dict:
    """Requests ``order`` of ``batch``, in that order, with their rows and randomness."""
    counts = batch["num_draft_tokens"]
    starts = offsets(batch)
    width = int(counts[order].max(initial=0)) + 2
    ids, target, draft = [], [], []
    uniforms = np.full((len(order), width), 0.5)
    for slot, b in enumerate(order):
        start, k_b = int(starts[b]), int(counts[b])
        ids.append(batch["draft_token_ids"][start : start + k_b])
        target.append(batch["target_probs"][start + b : start + b + k_b + 1])
        if batch["draft_probs"] is not None:
            draft.append(batch["draft_probs"][start : start + k_b])
        uniforms[slot, : k_b + 2] = batch["uniforms"][b, : k_b + 2]
    vocab_size = batch["target_probs"].shape[1]
    dtype = batch["target_probs"].dtype
    bonus = batch["bonus_token_ids"]
    return {
        "num_draft_tokens": counts[order],
        "draft_token_ids": np.concatenate([np.zeros(0, np.int64), *ids]),
        "target_probs": np.concatenate([np.zeros((0, vocab_size), dtype), *target]),
        "draft_probs": None
        if batch["draft_probs"] is None
        else np.concatenate([np.zeros((0, vocab_size), dtype), *draft]),
        "bonus_token_ids": None if bonus is None else bonus[order],
        "temperature": batch["temperature"][order],
        "uniforms": uniforms,
        "seeds": batch["seeds"][order],
        "positions": batch["positions"][order],
    }


def arguments(batch: dict, source: str) -> dict:
    """The keyword arguments of ``verify_ragged`` with the batch's randomness as ``source``."""
    keywords = {
        name: batch[name]
        for name in (
            "num_draft_tokens",
            "draft_token_ids",
            "target_probs",
            "draft_probs",
            "bonus_token_ids",
            "temperature",
        )
    }
    size = len(batch["num_draft_tokens"])
    if source == "uniforms":
        keywords["uniforms"] = batch["uniforms"]
    elif source == "seeded_seqs":
        keywords["seeded_seqs"] = {
            b: np.random.default_rng(int(batch["seeds"][b])) for b in range(size)
        }
    elif source == "counter_seeds":
        keywords["counter_seeds"] = {
            b: (int(batch["seeds"][b]), int(batch["positions"][b])) for b in range(size)
        }
    else:
        raise ValueError(source)
    return keywords


def request_rows(result: specdec_np.VerificationResult, counts: np.ndarray) -> list:
    """Per request: its ``k_b + 1`` output columns and its accepted length; the columns
    past them must be -1."""
    output = np.asarray(result.output_token_ids)
    rows = []
    for b, k_b in enumerate(counts):
        assert np.all(output[b, k_b + 1 :] == -1)
        rows.append((output[b, : k_b + 1].tolist(), int(result.accepted_lengths[b])))
    return rows


def check_format(result, batch: dict) -> None:
    """Accepted prefix of drafts, one token in ``[0, V)``, then -1; causal counts."""
    counts = batch["num_draft_tokens"]
    starts = offsets(batch)
    vocab_size = batch["target_probs"].shape[1]
    output = np.asarray(result.output_token_ids)
    lengths = np.asarray(result.accepted_lengths)
    assert output.dtype == np.int64
    assert output.shape == (len(counts), int(counts.max(initial=0)) + 1)
    np.testing.assert_array_equal(result.num_accepted, lengths)
    assert result.num_draft_tokens == int(counts.sum())
    for b, k_b in enumerate(counts):
        r = int(lengths[b])
        assert 0 <= r <= k_b
        drafts = batch["draft_token_ids"][starts[b] : starts[b] + r]
        np.testing.assert_array_equal(output[b, :r], drafts)
        assert 0 <= output[b, r] < vocab_size
        assert np.all(output[b, r + 1 :] == -1)


def stochastic_request(verifier: registry.Verifier, temperature: float) -> bool:
    """Whether the engine treats the request as sampled (it consumes ``k_b + 2`` draws)."""
    return not verifier.greedy and temperature != 0


def request_verifier(verifier: registry.Verifier, temperature: float) -> registry.Verifier:
    """The entry a request is verified by: the method's own when it is sampled or when the
    method decides every request by argmax itself, otherwise the engine's greedy one."""
    return verifier if verifier.greedy or stochastic_request(verifier, temperature) else GREEDY


def padded_call(verifier: registry.Verifier, target, bonus, draft, ids, uniforms, **parameters):
    """The padded API of ``verifier`` on ``[B, k+1, V]`` inputs; its padded reference when
    it is reached through ``method=`` only (no ``function_name``)."""
    if verifier.function_name is None:
        output = _reference.reference_for(verifier)(
            target, bonus, draft, ids, uniforms, **parameters
        )
        return specdec_np.VerificationResult(*output)
    function = getattr(specdec_np, verifier.function_name)
    if verifier.stochastic:
        return function(target, bonus, draft, ids, uniforms=uniforms)
    return function(target, bonus, ids, **parameters)


counts_strategy = st.lists(st.integers(0, 3), min_size=1, max_size=7)


@st.composite
def batches(draw, *, lazy_bonus=None, greedy_share=None, counts=counts_strategy):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return make_batch(
        rng,
        draw(counts),
        draw(st.integers(1, 6)),
        dtype=draw(st.sampled_from([np.float32, np.float64])),
        point_mass=draw(st.booleans()),
        sparse=draw(st.booleans()),
        greedy_share=draw(st.sampled_from([0.0, 0.5, 1.0]))
        if greedy_share is None
        else greedy_share,
        lazy_bonus=draw(st.booleans()) if lazy_bonus is None else lazy_bonus,
    )


# --------------------------------------------------------------------------------------
# 1. Requests without drafts emit only their bonus
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_zero_draft_requests_emit_the_given_bonus(verifier, data):
    batch = data.draw(batches(lazy_bonus=False))
    counts = batch["num_draft_tokens"]
    result = specdec_np.verify_ragged(**arguments(batch, "uniforms"), method=verifier.name)
    check_format(result, batch)
    for b in np.flatnonzero(counts == 0):
        assert result.output_token_ids[b].tolist()[:1] == [batch["bonus_token_ids"][b]]
        assert result.accepted_lengths[b] == 0


def _midpoint_uniform(row: np.ndarray, token: int) -> float:
    """A uniform whose inverse-CDF draw from ``row`` is ``token`` far from any boundary."""
    cdf = np.cumsum(row, dtype=np.float64)
    low = cdf[token - 1] if token else 0.0
    return float((low + cdf[token]) / 2 / cdf[-1])


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(
    seed=st.integers(0, 2**32 - 1),
    batch_size=st.integers(1, 6),
    vocab_size=st.integers(1, 7),
    dtype=st.sampled_from([np.float32, np.float64]),
)
@settings(max_examples=60, deadline=None)
def test_zero_draft_requests_draw_the_lazy_bonus(verifier, seed, batch_size, vocab_size, dtype):
    """``bonus_token_ids=None``: a sampled request draws its bonus from its bonus row by
    inverse CDF with uniform column ``k_b + 1 = 1``; a greedy one takes the argmax (first
    index on ties)."""
    rng = np.random.default_rng(seed)
    # Multiples of 1/8 (exact in float32), so that ties and zeros occur.
    target = rng.integers(0, 3, size=(batch_size, vocab_size)).astype(np.float64)
    target[:, 0] += target.sum(axis=1) == 0
    target /= target.sum(axis=1, keepdims=True)
    temperature = np.where(rng.random(batch_size) < 0.5, 0.0, 0.7)
    uniforms = rng.random((batch_size, 2))
    expected = []
    for b in range(batch_size):
        if stochastic_request(verifier, temperature[b]):
            token = int(rng.choice(np.flatnonzero(target[b] > 0)))
            uniforms[b, 1] = _midpoint_uniform(target[b], token)
            expected.append(token)
        else:
            expected.append(int(np.argmax(target[b])))
    result = specdec_np.verify_ragged(
        num_draft_tokens=np.zeros(batch_size, dtype=np.int64),
        draft_token_ids=np.zeros(0, dtype=np.int64),
        target_probs=target.astype(dtype),
        method=verifier.name,
        temperature=temperature,
        uniforms=uniforms,
    )
    assert result.output_token_ids.shape == (batch_size, 1)
    assert result.output_token_ids[:, 0].tolist() == expected
    assert result.accepted_lengths.tolist() == [0] * batch_size


# --------------------------------------------------------------------------------------
# 2. Batch invariance
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data())
@settings(max_examples=50, deadline=None)
def test_batch_invariance(verifier, source, data):
    """A request's output is the same alone, in a sub-batch in any order, and in the
    whole batch, given its own randomness."""
    batch = data.draw(batches())
    size = len(batch["num_draft_tokens"])
    whole = specdec_np.verify_ragged(**arguments(batch, source), method=verifier.name)
    check_format(whole, batch)
    expected = request_rows(whole, batch["num_draft_tokens"])
    subset = data.draw(st.permutations(range(size)))
    subset = subset[: data.draw(st.integers(1, size))]
    for order in ([b] for b in range(size)), [subset], [list(range(size))[::-1]]:
        for requests in order:
            part = sub_batch(batch, requests)
            result = specdec_np.verify_ragged(**arguments(part, source), method=verifier.name)
            got = request_rows(result, part["num_draft_tokens"])
            assert got == [expected[b] for b in requests]


@pytest.mark.parametrize("lazy_bonus", [True, False], ids=["lazy-bonus", "given-bonus"])
@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
def test_threaded_batch_equals_its_requests_alone(verifier, lazy_bonus, threaded):
    """The OpenMP loop over requests (forced on) changes no request's output."""
    rng = np.random.default_rng(31)
    counts = rng.integers(0, 5, size=64).tolist()
    batch = make_batch(rng, counts, 9, sparse=True, greedy_share=0.3, lazy_bonus=lazy_bonus)
    for source in SOURCES:
        whole = specdec_np.verify_ragged(**arguments(batch, source), method=verifier.name)
        expected = request_rows(whole, batch["num_draft_tokens"])
        for b in range(len(counts)):
            part = sub_batch(batch, [b])
            alone = specdec_np.verify_ragged(**arguments(part, source), method=verifier.name)
            assert request_rows(alone, part["num_draft_tokens"]) == [expected[b]], (source, b)


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data())
@settings(max_examples=50, deadline=None)
def test_every_source_gives_the_explicit_uniforms_result(verifier, data):
    """A seeded request uses ``generator.random(k_b + 2)`` and a counter-seeded one
    ``counter_uniforms(seed, position, k_b + 2)`` as its uniform row."""
    batch = data.draw(batches())
    counts = batch["num_draft_tokens"]
    width = batch["uniforms"].shape[1]
    for source in ("seeded_seqs", "counter_seeds"):
        explicit = dict(batch, uniforms=np.full_like(batch["uniforms"], 0.5))
        for b, k_b in enumerate(counts):
            if source == "seeded_seqs":
                row = np.random.default_rng(int(batch["seeds"][b])).random(k_b + 2)
            else:
                row = counter_uniforms([batch["seeds"][b]], [batch["positions"][b]], width)[0]
                row = row[: k_b + 2]
            explicit["uniforms"][b, : k_b + 2] = row
        want = specdec_np.verify_ragged(**arguments(explicit, "uniforms"), method=verifier.name)
        got = specdec_np.verify_ragged(**arguments(batch, source), method=verifier.name)
        np.testing.assert_array_equal(got.output_token_ids, want.output_token_ids)
        np.testing.assert_array_equal(got.accepted_lengths, want.accepted_lengths)


# --------------------------------------------------------------------------------------
# 3. Exact consumption
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data(), outcome=st.sampled_from(["random", "accept", "reject"]))
@settings(max_examples=60, deadline=None)
def test_seeded_requests_consume_exactly_k_plus_two(verifier, data, outcome):
    batch = data.draw(batches())
    counts = batch["num_draft_tokens"]
    if outcome != "random":
        # Every draft at a probability-one (or probability-zero) token of its row.
        starts = offsets(batch)
        vocab_size = batch["target_probs"].shape[1]
        target = np.zeros_like(batch["target_probs"])
        target[:, 0] = 1.0
        if outcome == "reject" and vocab_size > 1:
            target[:, :] = 0.0
            target[:, 1] = 1.0
        target[starts[1:] + np.arange(len(counts))] = batch["target_probs"][
            starts[1:] + np.arange(len(counts))
        ]
        batch = dict(
            batch, target_probs=target, draft_token_ids=np.zeros_like(batch["draft_token_ids"])
        )
    keywords = arguments(batch, "seeded_seqs")
    generators = keywords["seeded_seqs"]
    copies = {b: copy.deepcopy(g) for b, g in generators.items()}
    result = specdec_np.verify_ragged(**keywords, method=verifier.name)
    check_format(result, batch)
    for b, k_b in enumerate(counts):
        if stochastic_request(verifier, batch["temperature"][b]):
            copies[b].random(k_b + 2)
        assert generators[b].bit_generator.state == copies[b].bit_generator.state, b


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data())
@settings(max_examples=50, deadline=None)
def test_own_generator_consumes_the_sum_of_the_sampled_requests(verifier, data):
    batch = data.draw(batches())
    keywords = arguments(batch, "uniforms")
    del keywords["uniforms"]
    generator = np.random.default_rng(int(batch["seeds"][0]))
    twin = copy.deepcopy(generator)
    specdec_np.verify_ragged(**keywords, method=verifier.name, generator=generator)
    draws = sum(
        int(k_b) + 2
        for k_b, temperature in zip(batch["num_draft_tokens"], batch["temperature"])
        if stochastic_request(verifier, temperature)
    )
    if draws:
        twin.random(draws)
    assert generator.bit_generator.state == twin.bit_generator.state


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_counter_seeded_requests_are_reproducible(verifier, data):
    batch = data.draw(batches())
    first = specdec_np.verify_ragged(**arguments(batch, "counter_seeds"), method=verifier.name)
    again = specdec_np.verify_ragged(**arguments(batch, "counter_seeds"), method=verifier.name)
    np.testing.assert_array_equal(first.output_token_ids, again.output_token_ids)
    np.testing.assert_array_equal(first.accepted_lengths, again.accepted_lengths)


def test_counter_seeds_move_with_the_position():
    """The control of the reproducibility test: another position gives other uniforms,
    hence (over many requests) other outputs."""
    rng = np.random.default_rng(5)
    batch = make_batch(rng, [2] * 200, 6, lazy_bonus=True)
    verifier = registry.get(registry.names(stochastic=True)[0])
    first = specdec_np.verify_ragged(**arguments(batch, "counter_seeds"), method=verifier.name)
    moved = dict(batch, positions=batch["positions"] + 1)
    other = specdec_np.verify_ragged(**arguments(moved, "counter_seeds"), method=verifier.name)
    assert not np.array_equal(first.output_token_ids, other.output_token_ids)


# --------------------------------------------------------------------------------------
# 4. Equal to the padded API
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(
    seed=st.integers(0, 2**32 - 1),
    batch_size=st.integers(1, 6),
    k=st.integers(1, 4),
    vocab_size=st.integers(1, 7),
    dtype=st.sampled_from([np.float32, np.float64]),
    point_mass=st.booleans(),
    sparse=st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_equal_to_the_padded_api(
    verifier, seed, batch_size, k, vocab_size, dtype, point_mass, sparse
):
    rng = np.random.default_rng(seed)
    batch = make_batch(
        rng, [k] * batch_size, vocab_size, dtype=dtype, point_mass=point_mass, sparse=sparse
    )
    parameters = {p.name: float(rng.uniform(0, 2 * p.default)) for p in verifier.parameters}
    ragged = specdec_np.verify_ragged(
        **arguments(batch, "uniforms"), method=verifier.name, **parameters
    )
    draft = batch["draft_probs"]
    padded = padded_call(
        verifier,
        batch["target_probs"].reshape(batch_size, k + 1, vocab_size),
        batch["bonus_token_ids"].reshape(batch_size, 1),
        None if draft is None else draft.reshape(batch_size, k, vocab_size),
        batch["draft_token_ids"].reshape(batch_size, k),
        batch["uniforms"][:, : k + 1],
        **parameters,
    )
    np.testing.assert_array_equal(ragged.output_token_ids, padded.output_token_ids)
    np.testing.assert_array_equal(ragged.accepted_lengths, padded.accepted_lengths)
    np.testing.assert_array_equal(ragged.num_accepted, ragged.accepted_lengths)
    assert ragged.num_draft_tokens == padded.num_draft_tokens == batch_size * k


# --------------------------------------------------------------------------------------
# 5. Mixed batches
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_mixed_batch_rows_equal_greedy_and_method(verifier, data):
    """In one call, temperature-0 requests give ``greedy_sample``'s output on their rows
    and the others the method's padded output on theirs."""
    batch = data.draw(batches(lazy_bonus=False, greedy_share=0.5))
    parameters = {p.name: p.default / 2 for p in verifier.parameters}
    result = specdec_np.verify_ragged(
        **arguments(batch, "uniforms"), method=verifier.name, **parameters
    )
    check_format(result, batch)
    starts = offsets(batch)
    vocab_size = batch["target_probs"].shape[1]
    for b, k_b in enumerate(batch["num_draft_tokens"]):
        start = int(starts[b])
        if k_b == 0:
            want = [int(batch["bonus_token_ids"][b])]
        else:
            chosen = request_verifier(verifier, batch["temperature"][b])
            draft = batch["draft_probs"]
            padded = padded_call(
                chosen,
                batch["target_probs"][start + b : start + b + k_b + 1][None],
                batch["bonus_token_ids"][b : b + 1, None],
                None if draft is None else draft[start : start + k_b][None],
                batch["draft_token_ids"][start : start + k_b][None],
                batch["uniforms"][b : b + 1, : k_b + 1],
                **(parameters if chosen is verifier else {}),
            )
            want = padded.output_token_ids[0].tolist()
            assert int(result.accepted_lengths[b]) == int(padded.accepted_lengths[0])
        assert result.output_token_ids[b, : k_b + 1].tolist() == want, (b, vocab_size)


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data())
@settings(max_examples=80, deadline=None)
def test_ragged_equals_the_reference_request_by_request(verifier, data):
    """Each request against the array-API reference of its verifier (the greedy one for
    temperature 0) on its own rows and uniforms; a lazy bonus against the reference's
    inverse-CDF draw from the bonus row (or its argmax for a greedy request)."""

    batch = data.draw(batches(greedy_share=0.5))
    batch["target_probs"] = batch["target_probs"].astype(np.float64)
    if batch["draft_probs"] is not None:
        batch["draft_probs"] = batch["draft_probs"].astype(np.float64)
    parameters = {p.name: p.default for p in verifier.parameters}
    result = specdec_np.verify_ragged(
        **arguments(batch, "uniforms"), method=verifier.name, **parameters
    )
    check_format(result, batch)
    starts = offsets(batch)
    lazy = batch["bonus_token_ids"] is None
    for b, k_b in enumerate(batch["num_draft_tokens"]):
        start = int(starts[b])
        rows = batch["target_probs"][start + b : start + b + k_b + 1]
        sampled = stochastic_request(verifier, batch["temperature"][b])
        uniforms = batch["uniforms"][b]
        bonus = 0 if lazy else int(batch["bonus_token_ids"][b])
        if k_b == 0:
            want, length = [bonus], 0
        else:
            chosen = request_verifier(verifier, batch["temperature"][b])
            draft = batch["draft_probs"]
            output, lengths, _ = _reference.reference_for(chosen)(
                rows[None],
                np.array([[bonus]]),
                None if draft is None else draft[start : start + k_b][None],
                batch["draft_token_ids"][start : start + k_b][None],
                uniforms[None, : k_b + 1],
                **(parameters if chosen is verifier else {}),
            )
            want, length = np.asarray(output)[0].tolist(), int(np.asarray(lengths)[0])
        if lazy and length == k_b:
            if sampled:
                drawn = _reference.residual_draw(rows[k_b][None], uniforms[None, k_b + 1])
                want[k_b] = int(np.asarray(drawn)[0])
            else:
                want[k_b] = int(np.argmax(rows[k_b]))
        assert result.output_token_ids[b, : k_b + 1].tolist() == want, b
        assert int(result.accepted_lengths[b]) == length, b


# --------------------------------------------------------------------------------------
# 6. Lazy bonus
# --------------------------------------------------------------------------------------


def _always_accepted_batch(rng, size, vocab_size, bonus_row, point_mass):
    """Requests with 1 or 2 drafts at tokens of target probability one."""
    counts = np.where(np.arange(size) % 2 == 0, 1, 2)
    total = int(counts.sum())
    ids = rng.integers(vocab_size, size=total)
    target = np.zeros((total + size, vocab_size))
    starts = np.concatenate([[0], np.cumsum(counts)])
    for b in range(size):
        for i in range(counts[b]):
            target[starts[b] + b + i, ids[starts[b] + i]] = 1.0
        target[starts[b + 1] + b] = bonus_row
    draft = None if point_mass else rng.dirichlet(np.ones(vocab_size), size=total)
    return counts, ids, target, draft


@pytest.mark.parametrize("point_mass", [True, False], ids=["point-mass", "draft-probs"])
@pytest.mark.parametrize("verifier", SAMPLING, ids=[v.name for v in SAMPLING])
def test_lazy_bonus_follows_the_bonus_row(verifier, point_mass):
    rng = np.random.default_rng(17)
    bonus_row = np.array([0.05, 0.3, 0.0, 0.15, 0.4, 0.1])
    size = 6000
    counts, ids, target, draft = _always_accepted_batch(rng, size, 6, bonus_row, point_mass)
    result = specdec_np.verify_ragged(
        num_draft_tokens=counts,
        draft_token_ids=ids,
        target_probs=target,
        draft_probs=draft,
        method=verifier.name,
        generator=np.random.default_rng(3),
    )
    np.testing.assert_array_equal(result.accepted_lengths, counts)
    bonus = result.output_token_ids[np.arange(size), counts]
    histogram = np.bincount(bonus, minlength=6)
    assert (
        _statistics.chi_square_p_value(*_statistics.chi_square_statistic(histogram, bonus_row))
        > 1e-4
    )
    # The control: the same counts against another row fail.
    assert (
        _statistics.chi_square_p_value(
            *_statistics.chi_square_statistic(histogram, bonus_row[::-1])
        )
        < 1e-9
    )


def test_lazy_bonus_of_greedy_requests_is_the_argmax():
    rng = np.random.default_rng(4)
    bonus_row = np.array([0.05, 0.35, 0.0, 0.15, 0.35, 0.1])
    counts, ids, target, draft = _always_accepted_batch(rng, 40, 6, bonus_row, False)
    for verifier in VERIFIERS:
        result = specdec_np.verify_ragged(
            num_draft_tokens=counts,
            draft_token_ids=ids,
            target_probs=target,
            draft_probs=draft,
            method=verifier.name,
            temperature=0.0,
            generator=np.random.default_rng(3),
        )
        reached = result.accepted_lengths == counts
        # A verifier may stop before the bonus of a two-draft request (one that accepts at
        # most one draft); every one reaches it with one draft of probability one.
        assert reached[counts == 1].all()
        assert set(result.output_token_ids[reached, counts[reached]].tolist()) == {1}


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(
    seed=st.integers(0, 2**32 - 1),
    counts=st.lists(st.integers(1, 3), min_size=1, max_size=6),
    vocab_size=st.integers(2, 7),
    greedy_share=st.sampled_from([0.0, 0.5, 1.0]),
)
@settings(max_examples=60, deadline=None)
def test_rejected_requests_never_read_their_later_rows(
    verifier, seed, counts, vocab_size, greedy_share
):
    """A request whose first draft has target probability zero is rejected there; its
    later rows (NaN, target and draft) are never read: the output is valid and comes
    from the rejected row."""
    rng = np.random.default_rng(seed)
    batch = make_batch(rng, counts, vocab_size, greedy_share=greedy_share, lazy_bonus=True)
    starts = offsets(batch)
    target = batch["target_probs"].copy()
    for b, k_b in enumerate(batch["num_draft_tokens"]):
        first_row = target[starts[b] + b]
        first_row[batch["draft_token_ids"][starts[b]]] = 0.0
        if first_row.sum() == 0:
            first_row[(batch["draft_token_ids"][starts[b]] + 1) % vocab_size] = 1.0
        first_row /= first_row.sum()
        # Every later row of the request: its other draft positions and its bonus row.
        target[starts[b] + b + 1 : starts[b] + b + k_b + 1] = np.nan
        if batch["draft_probs"] is not None:
            batch["draft_probs"][starts[b] + 1 : starts[b] + k_b] = np.nan
    batch["target_probs"] = target
    result = specdec_np.verify_ragged(**arguments(batch, "uniforms"), method=verifier.name)
    check_format(result, batch)
    assert result.accepted_lengths.tolist() == [0] * len(counts)
    for b in range(len(counts)):
        assert target[starts[b] + b, result.output_token_ids[b, 0]] > 0


# --------------------------------------------------------------------------------------
# 7. Distribution on the real kernel
# --------------------------------------------------------------------------------------

MC_ROWS = {
    0: (np.array([[0.1, 0.4, 0.2, 0.3]]), np.zeros((0, 4))),
    1: (
        np.array([[0.3, 0.1, 0.4, 0.2], [0.6, 0.1, 0.05, 0.25]]),
        np.array([[0.1, 0.5, 0.2, 0.2]]),
    ),
    2: (
        np.array([[0.25, 0.25, 0.4, 0.1], [0.1, 0.2, 0.3, 0.4], [0.5, 0.2, 0.2, 0.1]]),
        np.array([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]),
    ),
}
MC_COPIES = 12000


def _ragged_monte_carlo(
    verify, method: str, rng: np.random.Generator, *, lazy_bonus: bool, drawn_from=None
) -> tuple[list[float], dict]:
    """Verify ``MC_COPIES`` requests of each ``k_b`` in ``MC_ROWS``, interleaved in one
    shuffled batch; returns the chi-square p-values of the first two emitted-or-continued
    tokens of each class against the product of its target rows, and the mean accepted
    length of each class.  ``drawn_from`` replaces the draft rows the drafts are drawn
    from (a negative control)."""
    classes = rng.permutation(np.repeat(list(MC_ROWS), MC_COPIES))
    counts = classes.astype(np.int64)
    target, draft, ids, bonus = [], [], [], []
    for k_b in classes:
        p, q = MC_ROWS[k_b]
        sample_q = q if drawn_from is None else drawn_from[k_b]
        target.append(p)
        draft.append(q)
        ids.extend(int(_monte_carlo.draw_from(row, 1, rng)[0]) for row in sample_q)
        bonus.append(int(_monte_carlo.draw_from(p[-1], 1, rng)[0]))
    result = verify(
        num_draft_tokens=counts,
        draft_token_ids=np.asarray(ids, dtype=np.int64),
        target_probs=np.concatenate(target),
        draft_probs=np.concatenate(draft),
        bonus_token_ids=None if lazy_bonus else np.asarray(bonus),
        method=method,
        generator=np.random.default_rng(int(rng.integers(2**32))),
    )
    output = np.asarray(result.output_token_ids)
    lengths = np.asarray(result.accepted_lengths)
    p_values, means = [], {}
    for k_b, (p, _) in MC_ROWS.items():
        rows = np.flatnonzero(classes == k_b)
        tokens = output[rows, : min(k_b, 1) + 1].copy()
        if k_b >= 1:
            # A request that emitted one token is continued by the target's next row.
            short = lengths[rows] == 0
            tokens[short, 1] = _monte_carlo.draw_from(p[1], int(short.sum()), rng)
        vocab_size = p.shape[1]
        flat = tokens[:, 0] if k_b == 0 else tokens[:, 0] * vocab_size + tokens[:, 1]
        expected = p[0] if k_b == 0 else np.outer(p[0], p[1]).reshape(-1)
        histogram = np.bincount(flat, minlength=expected.size)
        p_values.append(
            _statistics.chi_square_p_value(*_statistics.chi_square_statistic(histogram, expected))
        )
        means[k_b] = (lengths[rows].mean(), lengths[rows].std() / math.sqrt(rows.size))
    return p_values, means


@pytest.mark.slow
@pytest.mark.parametrize("lazy_bonus", [True, False], ids=["lazy-bonus", "given-bonus"])
@pytest.mark.parametrize("verifier", LOSSLESS, ids=[v.name for v in LOSSLESS])
def test_ragged_output_law_is_the_target(verifier, lazy_bonus):
    rng = np.random.default_rng(2024)
    p_values, means = _ragged_monte_carlo(
        specdec_np.verify_ragged, verifier.name, rng, lazy_bonus=lazy_bonus
    )
    assert min(p_values) > 1e-4, p_values
    for k_b, (p, q) in MC_ROWS.items():
        mean, error = means[k_b]
        if k_b == 0:
            assert mean == 0
            continue
        expected = _oracles.oracle_for(verifier)(p, q).expected_accepted_length
        assert abs(mean - expected) < 5 * error + 1e-9, (k_b, mean, expected)


@pytest.mark.slow
@pytest.mark.parametrize("verifier", LOSSLESS, ids=[v.name for v in LOSSLESS])
def test_ragged_law_control_drafts_from_another_q(verifier):
    """Drafts drawn from a q other than the draft_probs passed: the same test fails."""
    rng = np.random.default_rng(2024)
    other = {k_b: q[:, ::-1] for k_b, (_, q) in MC_ROWS.items()}
    p_values, _ = _ragged_monte_carlo(
        specdec_np.verify_ragged, verifier.name, rng, lazy_bonus=True, drawn_from=other
    )
    assert min(p_values) < 1e-8, p_values


@pytest.mark.slow
@pytest.mark.parametrize("verifier", LOSSLESS, ids=[v.name for v in LOSSLESS])
def test_ragged_law_control_wrong_bonus_row(verifier):
    """A verifier that draws the lazy bonus from each request's first row: fails."""

    def wrong_bonus_row(**keywords):
        counts = keywords["num_draft_tokens"]
        target = keywords["target_probs"].copy()
        starts = np.concatenate([[0], np.cumsum(counts)]) + np.arange(len(counts) + 1)
        target[starts[1:] - 1] = target[starts[:-1]]
        return specdec_np.verify_ragged(**dict(keywords, target_probs=target))

    rng = np.random.default_rng(2024)
    p_values, _ = _ragged_monte_carlo(wrong_bonus_row, verifier.name, rng, lazy_bonus=True)
    assert min(p_values) < 1e-8, p_values


# --------------------------------------------------------------------------------------
# 8. Bad input
# --------------------------------------------------------------------------------------


def _small(**changes) -> dict:
    keywords = {
        "num_draft_tokens": np.array([1, 0, 2]),
        "draft_token_ids": np.array([0, 1, 2]),
        "target_probs": np.full((6, 4), 0.25),
        "draft_probs": np.full((3, 4), 0.25),
        "bonus_token_ids": np.array([0, 1, 2]),
    }
    keywords.update(changes)
    return keywords


@pytest.mark.parametrize(
    ("changes", "error", "words"),
    [
        ({"draft_token_ids": np.array([0, 1])}, ValueError, ["draft_token_ids", "[3]"]),
        (
            {"num_draft_tokens": np.array([1, -1, 2])},
            ValueError,
            ["num_draft_tokens", "request 1"],
        ),
        ({"num_draft_tokens": np.array([1.0, 0.0, 2.0])}, TypeError, ["num_draft_tokens", "int"]),
        ({"num_draft_tokens": np.array([[1, 0, 2]])}, ValueError, ["num_draft_tokens", "[B]"]),
        ({"target_probs": np.full((5, 4), 0.25)}, ValueError, ["target_probs", "[6, V]"]),
        ({"draft_probs": np.full((3, 5), 0.2)}, ValueError, ["draft_probs", "[3, 4]"]),
        ({"draft_probs": np.full((3, 4), 0.25, np.float32)}, TypeError, ["draft_probs", "dtype"]),
        ({"bonus_token_ids": np.array([0, 1])}, ValueError, ["bonus_token_ids", "[3]"]),
        ({"temperature": [1.0, 1.0, -0.5]}, ValueError, ["temperature", "request 2"]),
        ({"temperature": [1.0, np.nan, 1.0]}, ValueError, ["temperature", "request 1"]),
        ({"temperature": [1.0, np.inf, 1.0]}, ValueError, ["temperature", "request 1"]),
        ({"temperature": [1.0, 1.0]}, ValueError, ["temperature", "[3]"]),
        ({"top_k": 2}, ValueError, ["top_k", "logits"]),
        ({"top_p": 0.9}, ValueError, ["top_p", "logits"]),
        ({"min_p": 0.1}, ValueError, ["min_p", "logits"]),
        ({"top_k": np.array([1, 0, 0])}, ValueError, ["top_k", "logits"]),
        ({"method": "no-such-method"}, ValueError, ["method", *registry.names()]),
        ({"strict_mode": 1}, TypeError, ["strict_mode"]),
        ({"target_logits": np.zeros((6, 4))}, ValueError, ["target_logits", "target_probs"]),
        ({"uniforms": np.full((3, 3), 0.5)}, ValueError, ["uniforms", "[3, 4]"]),
        ({"uniforms": np.full((3, 4), 1.0)}, ValueError, ["uniforms", "[0, 1)"]),
        ({"seeded_seqs": {3: np.random.default_rng()}}, ValueError, ["seeded_seqs", "3"]),
        ({"counter_seeds": {0: (1, -1)}}, ValueError, ["counter_seeds[0]", "position"]),
        (
            {"uniforms": np.full((3, 4), 0.5), "seeded_seqs": {0: np.random.default_rng()}},
            ValueError,
            ["uniforms", "seeded_seqs"],
        ),
    ],
)
def test_bad_input_names_the_argument(changes, error, words):
    with pytest.raises(error) as raised:
        specdec_np.verify_ragged(**_small(**changes))
    for word in words:
        assert word in str(raised.value), (word, str(raised.value))


@pytest.mark.parametrize(
    ("name", "values", "bad_request"),
    [
        ("top_k", [0, -1, 3], 1),
        ("top_k", [0, 2, 1.5], 2),
        ("top_p", [0.0, 0.5, 1.0], 0),
        ("top_p", [1.0, 1.01, 1.0], 1),
        ("top_p", [1.0, 1.0, np.nan], 2),
        ("min_p", [0.0, -0.1, 0.0], 1),
        ("min_p", [0.0, 0.0, 1.5], 2),
        ("temperature", [0.0, 0.5, -1e-9], 2),
    ],
)
def test_sampling_parameter_ranges_name_the_request(name, values, bad_request):
    """The ranges of the filters, checked as they will be for logits (with probabilities
    any filter is already refused, see above)."""
    from specdec_np._runtime import checks as _validate

    keywords = {"temperature": None, "top_k": None, "top_p": None, "min_p": None}
    keywords[name] = np.asarray(values)
    with pytest.raises(ValueError) as raised:
        _validate.check_sampling_parameters(3, 5, from_logits=True, **keywords)
    assert name in str(raised.value)
    assert f"request {bad_request}" in str(raised.value)


def test_sampling_parameters_in_range_pass():
    from specdec_np._runtime import checks as _validate

    checked = _validate.check_sampling_parameters(
        3,
        5,
        temperature=[0, 0.5, 2],
        top_k=[0, 5, 9],
        top_p=[1, 0.5, 1e-9],
        min_p=[0, 1, 0.5],
        from_logits=True,
    )
    # top_k 0 or >= V is off (0).
    assert checked["top_k"].tolist() == [0, 0, 0]


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
def test_foreign_method_parameter_is_a_type_error(verifier):
    foreign = {p.name for other in VERIFIERS for p in other.parameters}.difference(
        verifier.parameter_names
    )
    if not foreign:
        pytest.skip("every registered parameter is this verifier's")
    for name in sorted(foreign):
        with pytest.raises(TypeError, match=name):
            specdec_np.verify_ragged(**_small(), method=verifier.name, **{name: 0.1})


def test_registered_method_parameters_are_range_checked():
    for verifier in VERIFIERS:
        for parameter in verifier.parameters:
            with pytest.raises(ValueError, match=parameter.name):
                specdec_np.verify_ragged(
                    **_small(), method=verifier.name, **{parameter.name: -1.0}
                )


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@pytest.mark.parametrize(
    ("argument", "bad_request", "position"),
    [("draft_token_ids", 0, 0), ("draft_token_ids", 2, 1), ("bonus_token_ids", 1, 0)],
)
@pytest.mark.parametrize("value", [4, -1])
def test_out_of_vocabulary_id_moves_no_generator(verifier, argument, bad_request, position, value):
    keywords = _small(temperature=np.array([1.0, 1.0, 1.0]))
    starts = [0, 1, 1]
    ids = keywords[argument].copy()
    ids[starts[bad_request] + position if argument == "draft_token_ids" else bad_request] = value
    keywords[argument] = ids
    generators = {b: np.random.default_rng(b) for b in (0, 2)}
    generator = np.random.default_rng(9)
    before = [g.bit_generator.state for g in (*generators.values(), generator)]
    with pytest.raises(ValueError) as raised:
        specdec_np.verify_ragged(
            **keywords, method=verifier.name, seeded_seqs=generators, generator=generator
        )
    message = str(raised.value)
    assert argument in message and str(value) in message
    assert f"({bad_request}, {position})" in message
    assert [g.bit_generator.state for g in (*generators.values(), generator)] == before


def test_out_of_vocabulary_message_names_the_engine_arguments():
    with pytest.raises(ValueError) as raised:
        specdec_np.verify_ragged(**_small(draft_token_ids=np.array([0, 1, 9])))
    message = str(raised.value)
    assert "target_with_bonus_probs" not in message and "request" in message


def test_row_without_mass_message_names_target_probs():
    target = np.full((6, 4), 0.25)
    target[0] = 0.0  # request 0's only draft row: its draft is rejected, nothing to draw
    with pytest.raises(ValueError) as raised:
        specdec_np.verify_ragged(**_small(target_probs=target, draft_probs=None))
    assert "target_probs" in str(raised.value)
    assert "target_with_bonus_probs" not in str(raised.value)


def test_row_without_mass_restores_the_generators():
    target = np.full((6, 4), 0.25)
    target[0] = 0.0
    generators = {b: np.random.default_rng(b) for b in range(3)}
    generator = np.random.default_rng(9)
    before = [g.bit_generator.state for g in (*generators.values(), generator)]
    with pytest.raises(ValueError, match="no positive probability"):
        specdec_np.verify_ragged(
            **_small(target_probs=target, draft_probs=None),
            seeded_seqs={0: generators[0], 2: generators[2]},
            generator=generator,
        )
    assert [g.bit_generator.state for g in (*generators.values(), generator)] == before


def test_out_buffers_are_written_in_place():
    keywords = _small(uniforms=np.full((3, 4), 0.5))
    buffers = specdec_np.output_buffers(3, 2)
    result = specdec_np.verify_ragged(**keywords, out=buffers)
    fresh = specdec_np.verify_ragged(**keywords)
    assert np.shares_memory(result.output_token_ids, buffers.output_token_ids)
    assert np.shares_memory(result.accepted_lengths, buffers.accepted_lengths)
    np.testing.assert_array_equal(result.output_token_ids, fresh.output_token_ids)
    np.testing.assert_array_equal(buffers.output_token_ids, fresh.output_token_ids)
    np.testing.assert_array_equal(buffers.accepted_lengths, fresh.accepted_lengths)
    # A second call reuses them.
    again = specdec_np.verify_ragged(**keywords, out=buffers)
    assert np.shares_memory(again.output_token_ids, buffers.output_token_ids)


def test_out_buffers_wider_than_the_batch():
    keywords = _small(uniforms=np.full((3, 4), 0.5))
    buffers = specdec_np.output_buffers(3, 5)
    result = specdec_np.verify_ragged(**keywords, out=buffers)
    fresh = specdec_np.verify_ragged(**keywords)
    np.testing.assert_array_equal(result.output_token_ids, fresh.output_token_ids)
    assert np.shares_memory(result.output_token_ids, buffers.output_token_ids)


def _bad_buffers():
    good = specdec_np.output_buffers(3, 2)
    return [
        (np.zeros((3, 3), np.int64), TypeError),
        (tuple(good), TypeError),
        (specdec_np.output_buffers(2, 2), ValueError),
        (specdec_np.output_buffers(3, 1), ValueError),
        (good._replace(output_token_ids=np.zeros((3, 3), np.int32)), TypeError),
        (good._replace(accepted_lengths=np.zeros(3, np.float64)), TypeError),
        (good._replace(num_accepted=np.zeros(4, np.int64)), ValueError),
        (good._replace(row_status=np.zeros(6, np.int64)[::2]), ValueError),
        (good._replace(output_token_ids=np.zeros((3, 3), np.int64, order="F")), ValueError),
    ]


@pytest.mark.parametrize("index", range(len(_bad_buffers())))
def test_bad_out_buffers(index):
    buffers, error = _bad_buffers()[index]
    generator = np.random.default_rng(1)
    before = generator.bit_generator.state
    with pytest.raises(error, match="out"):
        specdec_np.verify_ragged(**_small(), out=buffers, generator=generator)
    assert generator.bit_generator.state == before


def test_read_only_out_buffer_is_refused():
    buffers = specdec_np.output_buffers(3, 2)
    buffers.output_token_ids.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        specdec_np.verify_ragged(**_small(), out=buffers)


def test_empty_batch():
    result = specdec_np.verify_ragged(
        num_draft_tokens=np.zeros(0, np.int64),
        draft_token_ids=np.zeros(0, np.int64),
        target_probs=np.zeros((0, 3)),
    )
    assert result.output_token_ids.shape == (0, 1)
    assert result.accepted_lengths.shape == (0,)


# --------------------------------------------------------------------------------------
# 9. EngineVerifier
# --------------------------------------------------------------------------------------


def _engine_arguments(batch: dict) -> dict:
    keywords = arguments(batch, "uniforms")
    return keywords


def _expected_metrics(calls: list) -> dict:
    """The metric sums computed from the outputs of verified calls."""
    counts = np.concatenate([c for c, _ in calls])
    outputs = [r for _, r in calls]
    lengths = np.concatenate([np.asarray(r.accepted_lengths) for r in outputs])
    width = int(counts.max(initial=0))
    return {
        "requests": counts.size,
        "drafted": int(counts.sum()),
        "accepted": int(lengths.sum()),
        "emitted": int(sum((np.asarray(r.output_token_ids) >= 0).sum() for r in outputs)),
        "accepted_at": [int((lengths > j).sum()) for j in range(width)],
        "drafted_at": [int((counts > j).sum()) for j in range(width)],
    }


def _metrics_dict(metrics: specdec_np.VerificationMetrics) -> dict:
    return {
        "requests": metrics.requests,
        "drafted": metrics.drafted,
        "accepted": metrics.accepted,
        "emitted": metrics.emitted,
        "accepted_at": metrics.accepted_at.tolist(),
        "drafted_at": metrics.drafted_at.tolist(),
    }


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_engine_verifier_metrics_are_the_sums_of_the_outputs(verifier, data):
    engine_verifier = specdec_np.EngineVerifier(verifier.name, seed=0)
    calls = []
    for _ in range(data.draw(st.integers(1, 4))):
        batch = data.draw(batches())
        result = engine_verifier(**_engine_arguments(batch))
        check_format(result, batch)
        # The engine verifier is verify_ragged with its method.
        alone = specdec_np.verify_ragged(**_engine_arguments(batch), method=verifier.name)
        np.testing.assert_array_equal(result.output_token_ids, alone.output_token_ids)
        calls.append((batch["num_draft_tokens"], copy.deepcopy(result)))
    metrics = engine_verifier.metrics
    expected = _expected_metrics(calls)
    assert _metrics_dict(metrics) == expected
    drafted_at = np.asarray(expected["drafted_at"])
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.asarray(expected["accepted_at"]) / drafted_at
    np.testing.assert_array_equal(metrics.acceptance_by_position, share)
    if expected["drafted"]:
        assert metrics.acceptance_rate == expected["accepted"] / expected["drafted"]
    else:
        assert math.isnan(metrics.acceptance_rate)
    assert metrics.mean_accepted_length == expected["emitted"] / expected["requests"]


@given(data=st.data())
@settings(max_examples=40, deadline=None)
def test_engine_verifier_metrics_merge_across_workers(data):
    verifier = data.draw(st.sampled_from(VERIFIERS))
    calls = [data.draw(batches()) for _ in range(data.draw(st.integers(2, 5)))]
    split = data.draw(st.integers(0, len(calls)))
    workers = [specdec_np.EngineVerifier(verifier.name) for _ in range(2)]
    single = specdec_np.EngineVerifier(verifier.name)
    for index, batch in enumerate(calls):
        workers[index >= split](**_engine_arguments(batch))
        single(**_engine_arguments(batch))
    merged = workers[0].metrics + workers[1].metrics
    assert _metrics_dict(merged) == _metrics_dict(single.metrics)
    assert _metrics_dict(workers[1].metrics.merge(workers[0].metrics)) == _metrics_dict(
        single.metrics
    )


def test_engine_verifier_records_into_the_metrics_it_holds():
    """The common record goes straight to the compiled step for VerificationMetrics
    itself; metrics replaced by a subclass keep their own record (the control), and fresh
    metrics start from zero."""
    recorded = []

    class Counted(specdec_np.VerificationMetrics):
        def record(self, *arguments, **keywords):
            recorded.append(1)
            super().record(*arguments, **keywords)

    logits = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    keywords = {
        "num_draft_tokens": np.array([2, 1]), "draft_token_ids": np.array([1, 2, 0]),
        "target_logits": logits, "temperature": 0.8,
    }  # fmt: skip
    engine_verifier = specdec_np.EngineVerifier(seed=0)
    for metrics in (engine_verifier.metrics, Counted(), specdec_np.VerificationMetrics()):
        engine_verifier.metrics = metrics
        by_hand = specdec_np.VerificationMetrics()
        for _ in range(3):
            result = engine_verifier(**keywords)
            by_hand.record(keywords["num_draft_tokens"], result.accepted_lengths)
        assert metrics == by_hand and metrics.requests == 6
    assert len(recorded) == 3


def test_engine_verifier_seed_is_reproducible():
    rng = np.random.default_rng(8)
    batch = make_batch(rng, [0, 1, 2, 3] * 10, 5, greedy_share=0.3)
    keywords = _engine_arguments(batch)
    del keywords["uniforms"]
    for verifier in VERIFIERS:
        first = specdec_np.EngineVerifier(verifier.name, seed=11)
        second = specdec_np.EngineVerifier(verifier.name, seed=11)
        for _ in range(3):
            np.testing.assert_array_equal(
                first(**keywords).output_token_ids, second(**keywords).output_token_ids
            )


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
def test_failed_call_leaves_the_metrics_and_the_generator(verifier):
    rng = np.random.default_rng(8)
    batch = make_batch(rng, [0, 1, 2, 3], 5, lazy_bonus=True)
    keywords = _engine_arguments(batch)
    del keywords["uniforms"]
    engine_verifier = specdec_np.EngineVerifier(verifier.name, seed=3)
    twin = specdec_np.EngineVerifier(verifier.name, seed=3)
    engine_verifier(**keywords)
    twin(**keywords)
    before = _metrics_dict(engine_verifier.metrics)
    bad_ids = keywords["draft_token_ids"].copy()
    bad_ids[-1] = 5
    empty_row = keywords["target_probs"].copy()
    empty_row[1] = 0.0  # request 1's draft row: no mass, so nothing can be drawn there
    failures = [
        {"draft_token_ids": bad_ids},
        {"temperature": -np.ones(4)},
        {"num_draft_tokens": np.array([0, 1, 2, 2])},
    ]
    if verifier.stochastic:
        # Found by the kernel only, after the uniforms were drawn.
        failures.append({"target_probs": empty_row, "draft_probs": None})
    for bad in failures:
        with pytest.raises(ValueError):
            engine_verifier(**dict(keywords, **bad))
        assert _metrics_dict(engine_verifier.metrics) == before, bad
    # The verifier's own generator was not moved either: it goes on as its twin.
    np.testing.assert_array_equal(
        engine_verifier(**keywords).output_token_ids, twin(**keywords).output_token_ids
    )
    assert _metrics_dict(engine_verifier.metrics) == _metrics_dict(twin.metrics)


def test_engine_verifier_refuses_unknown_keywords():
    engine_verifier = specdec_np.EngineVerifier()
    for name in ("method", "strict_mode", "generator", "no_such_argument"):
        with pytest.raises(TypeError, match=name):
            engine_verifier(**_small(), **{name: None})
    assert engine_verifier.metrics.requests == 0


def test_engine_verifier_construction_checks():
    with pytest.raises(ValueError, match="method"):
        specdec_np.EngineVerifier("no-such-method")
    with pytest.raises(TypeError, match="seed"):
        specdec_np.EngineVerifier(seed=1.5)
    with pytest.raises(TypeError, match="strict_mode"):
        specdec_np.EngineVerifier(strict_mode="yes")
    for verifier in VERIFIERS:
        assert specdec_np.EngineVerifier(verifier.name).method == verifier.name
        foreign = {p.name for v in VERIFIERS for p in v.parameters}.difference(
            verifier.parameter_names
        )
        for name in foreign:
            with pytest.raises(TypeError, match=name):
                specdec_np.EngineVerifier(verifier.name, **{name: 0.1})


def test_engine_verifier_passes_its_method_parameters():
    """Parameters set at construction reach the kernel: a threshold of zero accepts every
    draft of positive probability."""
    for verifier in VERIFIERS:
        if not verifier.parameters:
            continue
        rng = np.random.default_rng(1)
        batch = make_batch(rng, [3] * 20, 6)
        zero = {p.name: 0.0 for p in verifier.parameters}
        result = specdec_np.EngineVerifier(verifier.name, **zero)(**_engine_arguments(batch))
        want = specdec_np.verify_ragged(**_engine_arguments(batch), method=verifier.name, **zero)
        default = specdec_np.verify_ragged(**_engine_arguments(batch), method=verifier.name)
        np.testing.assert_array_equal(result.output_token_ids, want.output_token_ids)
        assert not np.array_equal(want.accepted_lengths, default.accepted_lengths)


# --------------------------------------------------------------------------------------
# Strict mode and the checks that must not depend on the batch's temperatures
# --------------------------------------------------------------------------------------

UNNORMALISED = np.full((6, 4), 0.3, dtype=np.float32)  # every row sums to 1.2


def test_strict_mode_refuses_unnormalised_rows_in_the_padded_greedy_api():
    """The contract the engine layout must keep (docs/semantics.md, greedy)."""
    with pytest.raises(ValueError, match="sum to 1"):
        getattr(specdec_np, GREEDY.function_name)(
            UNNORMALISED[:4].reshape(2, 2, 4),
            np.zeros((2, 1), np.int64),
            np.zeros((2, 1), np.int64),
            strict_mode=True,
        )


@pytest.mark.parametrize("how", ["method", "temperature"])
def test_strict_mode_checks_the_row_sums_of_greedy_requests(how):
    keywords = _small(target_probs=UNNORMALISED, draft_probs=None)
    if how == "method":
        keywords["method"] = GREEDY.name
    else:
        keywords["temperature"] = np.array([0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="sum"):
        specdec_np.verify_ragged(**keywords, strict_mode=True)


BAD_SOURCES = [
    {"seeded_seqs": {7: np.random.default_rng()}},
    {"seeded_seqs": {0: "not a generator"}},
    {"counter_seeds": {0: (1, -1)}},
    {"generator": "not a generator"},
]


@pytest.mark.parametrize("bad", BAD_SOURCES, ids=["row", "generator-row", "counter", "generator"])
def test_bad_sources_are_refused_in_a_sampled_batch(bad):
    with pytest.raises((TypeError, ValueError)):
        specdec_np.verify_ragged(**_small(temperature=np.array([0.0, 1.0, 0.0])), **bad)


@pytest.mark.parametrize("bad", BAD_SOURCES, ids=["row", "generator-row", "counter", "generator"])
@pytest.mark.parametrize("how", ["method", "temperature"])
def test_bad_sources_are_refused_when_every_request_is_greedy(bad, how):
    keywords = _small(temperature=np.zeros(3)) if how == "temperature" else _small()
    if how == "method":
        keywords["method"] = GREEDY.name
    with pytest.raises((TypeError, ValueError)):
        specdec_np.verify_ragged(**keywords, **bad)


def test_lazy_bonus_from_an_empty_bonus_row():
    """A fully accepted sampled request whose bonus row has no mass cannot draw: a
    ValueError, and no generator moves; a greedy one takes the argmax (index 0)."""
    target = np.full((6, 4), 0.25)
    target[0] = [1.0, 0.0, 0.0, 0.0]  # request 0's draft (token 0) is always accepted
    target[1] = 0.0  # request 0's bonus row
    keywords = _small(target_probs=target, bonus_token_ids=None, draft_probs=None)
    generators = {0: np.random.default_rng(0)}
    before = generators[0].bit_generator.state
    with pytest.raises(ValueError, match="no positive probability"):
        specdec_np.verify_ragged(**keywords, seeded_seqs=generators)
    assert generators[0].bit_generator.state == before
    greedy = specdec_np.verify_ragged(**keywords, temperature=np.array([0.0, 1.0, 1.0]))
    assert greedy.output_token_ids[0].tolist() == [0, 0, -1]


@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
def test_draft_probs_of_verifiers_that_do_not_read_them(verifier):
    """Verifiers without ``reads_draft_probs`` ignore the argument entirely; the others
    check its shape."""
    keywords = _small(uniforms=np.full((3, 4), 0.5))
    wrong = np.full((2, 7), 0.5, dtype=np.float32)
    if verifier.reads_draft_probs:
        with pytest.raises(ValueError, match="draft_probs"):
            specdec_np.verify_ragged(**dict(keywords, draft_probs=wrong), method=verifier.name)
        return
    want = specdec_np.verify_ragged(**dict(keywords, draft_probs=None), method=verifier.name)
    got = specdec_np.verify_ragged(**dict(keywords, draft_probs=wrong), method=verifier.name)
    np.testing.assert_array_equal(got.output_token_ids, want.output_token_ids)


def test_counts_whose_sum_wraps_are_refused():
    # Found by the fuzz: the int64 sum of these counts wraps around to T = 1.
    with pytest.raises(ValueError, match="num_draft_tokens must sum to T"):
        specdec_np.verify_ragged(
            num_draft_tokens=np.array([1] + [2**62] * 4),
            draft_token_ids=np.array([0]),
            target_probs=np.full((6, 2), 0.5),
        )



@pytest.mark.parametrize("verifier", VERIFIERS, ids=VERIFIER_IDS)
@pytest.mark.parametrize("counts", [[0], [0, 2, 1]])
def test_strict_greedy_requests_on_draft_rows_only(verifier, counts):
    """Strict mode checks the row sums of greedy requests; with ``[T, V]`` target rows (no
    bonus rows) the checked rows are the draft positions (this once raised IndexError)."""
    counts_array = np.asarray(counts, dtype=np.int64)
    total = int(counts_array.sum())
    rows = np.full((total, 3), 0.2, dtype=np.float32)
    rows[:, 1] = 0.6

    def call(target_probs):
        return specdec_np.verify_ragged(
            num_draft_tokens=counts_array,
            draft_token_ids=np.ones(total, dtype=np.int64),
            target_probs=target_probs,
            bonus_token_ids=np.full(len(counts), 2, dtype=np.int64),
            method=verifier.name,
            temperature=0.0,
            strict_mode=True,
        )

    result = call(rows)
    assert result.output_token_ids[0, 0] == 2  # request 0 has no draft: its bonus
    assert np.all((result.accepted_lengths >= 0) & (result.accepted_lengths <= counts_array))
    if total:
        with pytest.raises(ValueError, match="target_probs"):
            call(np.where(rows > 0.5, np.float32(0.9), rows))  # rows summing to 1.3
