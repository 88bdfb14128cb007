"""The two counter domains of the counter-based uniforms: ``stream="verify"`` (the default)
and ``stream="draft"`` (docs/semantics.md §5.1, "Two streams")."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np import counter_uniforms
from specdec_np._runtime.philox import (
    DOMAIN_TAG,
    DRAFT_DOMAIN_TAG,
    STREAM_TAGS,
    check_stream,
    philox4x32_10,
)
from specdec_np._runtime.uniforms import RejectionUniforms

MASK32 = 0xFFFFFFFF
#: The verify stream's tag, written out: the default stream must never move.
VERIFY_TAG = 0x5D5EC0DE

u64 = st.integers(min_value=0, max_value=2**64 - 1)


def uniform_of(seed: int, position: int, d: int, tag: int) -> float:
    """Draw ``d`` of ``(seed, position)`` in the domain ``tag``, by the documented formula
    on one Philox block."""
    counter = np.asarray([[position & MASK32, position >> 32, d // 2, tag]], dtype=np.uint32)
    key = np.asarray([[seed & MASK32, seed >> 32]], dtype=np.uint32)
    w = [int(v) for v in philox4x32_10(counter, key)[0]]
    wa, wb = (w[0], w[1]) if d % 2 == 0 else (w[2], w[3])
    return ((wa << 21) | (wb >> 11)) * 2.0**-53


def test_the_two_tags() -> None:
    assert DOMAIN_TAG == VERIFY_TAG
    assert STREAM_TAGS == {"verify": VERIFY_TAG, "draft": DRAFT_DOMAIN_TAG}
    assert DRAFT_DOMAIN_TAG != VERIFY_TAG and 0 <= DRAFT_DOMAIN_TAG <= MASK32
    assert check_stream("verify") == VERIFY_TAG and check_stream("draft") == DRAFT_DOMAIN_TAG


def test_the_verify_stream_is_unchanged() -> None:
    """Values stored from the release before the draft stream existed."""
    stored = [
        [0.6064505210573625, 0.897046393102746, 0.7106602999526646],
        [0.5209031916110379, 0.06290028280086968, 0.12212716874044593],
    ]
    seeds, positions = [0x0123456789ABCDEF, 5], [2**40 + 17, 0]
    assert counter_uniforms(seeds, positions, 3).tolist() == stored
    assert counter_uniforms(seeds, positions, 3, stream="verify").tolist() == stored


@settings(max_examples=40, deadline=None)
@given(seed=u64, position=u64, num_draws=st.integers(1, 5))
def test_each_stream_is_the_formula_with_its_tag(seed: int, position: int, num_draws: int) -> None:
    for stream, tag in (("verify", VERIFY_TAG), ("draft", DRAFT_DOMAIN_TAG)):
        out = counter_uniforms([seed], [position], num_draws, stream=stream)
        assert out[0].tolist() == [uniform_of(seed, position, d, tag) for d in range(num_draws)]


@settings(max_examples=40, deadline=None)
@given(seed=u64, position=u64)
def test_the_streams_differ_for_the_same_seed_and_position(seed: int, position: int) -> None:
    verify = counter_uniforms([seed], [position], 4)
    draft = counter_uniforms([seed], [position], 4, stream="draft")
    assert (verify != draft).any()


def test_the_streams_share_no_philox_block() -> None:
    """For one key, every block of the draft stream over a range of positions and draw
    indices is distinct from every block of the verify stream (Philox is a bijection of
    the counter, and the counters differ in their fourth word)."""
    seed, positions, blocks = 2**63 + 11, np.arange(64, dtype=np.uint64), 4
    key = np.tile(np.asarray([[seed & MASK32, seed >> 32]], dtype=np.uint32), (64 * blocks, 1))
    words = {}
    for tag in (VERIFY_TAG, DRAFT_DOMAIN_TAG):
        counter = np.stack(
            [
                np.repeat(positions & MASK32, blocks),
                np.repeat(positions >> 32, blocks),
                np.tile(np.arange(blocks, dtype=np.uint64), positions.size),
                np.full(positions.size * blocks, tag, dtype=np.uint64),
            ],
            axis=1,
        ).astype(np.uint32)
        words[tag] = {tuple(row) for row in philox4x32_10(counter, key).tolist()}
        assert len(words[tag]) == positions.size * blocks
    assert not words[VERIFY_TAG] & words[DRAFT_DOMAIN_TAG]
    # And so, here, are the uniforms built from them.
    verify = counter_uniforms(np.full(64, seed, np.uint64), positions, 2 * blocks)
    draft = counter_uniforms(np.full(64, seed, np.uint64), positions, 2 * blocks, stream="draft")
    assert not set(verify.ravel().tolist()) & set(draft.ravel().tolist())


@pytest.mark.parametrize("stream", ["Draft", "", "drafts", None, 1, b"draft"])
def test_a_bad_stream_is_refused_naming_it(stream) -> None:
    with pytest.raises(ValueError, match="stream"):
        counter_uniforms([1], [2], 3, stream=stream)
    with pytest.raises(ValueError, match="stream"):
        RejectionUniforms(2, 1, np, counter_seeds={0: (1, 2)}, stream=stream)


def test_rejection_uniforms_draw_counter_rows_in_the_stream() -> None:
    """Square and flat layouts take the counter rows from the chosen stream; the other
    sources ignore it."""
    counter_seeds = {0: (9, 40), 2: (9, 41)}
    widths = np.array([3, 2, 1], dtype=np.int64)
    for stream in ("verify", "draft"):
        expected = counter_uniforms([9, 9], [40, 41], 3, stream=stream)
        generator = np.random.default_rng(5)
        square = RejectionUniforms(
            3, 2, np, generator=generator, counter_seeds=counter_seeds, stream=stream
        ).draw()
        np.testing.assert_array_equal(square[[0, 2]], expected)
        np.testing.assert_array_equal(square[1], np.random.default_rng(5).random((1, 3))[0])
        flat = RejectionUniforms(
            3, 2, np, generator=np.random.default_rng(5), counter_seeds=counter_seeds,
            stream=stream, row_widths=widths, row_offsets=np.array([0, 3, 5, 6]),
        ).draw()  # fmt: skip
        np.testing.assert_array_equal(flat[[0, 1, 2, 5]], [*expected[0], expected[1, 0]])
