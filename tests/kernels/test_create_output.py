"""``_create_output``: the Cython kernel against the array-API reference, and vLLM's format."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import specdec_np
from specdec_np._reference import chains as _reference


@st.composite
def output_inputs(draw):
    batch_size = draw(st.integers(0, 8))
    k = draw(st.integers(1, 6))
    id_dtype = draw(st.sampled_from([np.int32, np.int64]))
    ids = hnp.arrays(id_dtype, (batch_size, k), elements=st.integers(0, 50))
    accepted = draw(hnp.arrays(np.bool_, (batch_size, k)))
    bonus = draw(hnp.arrays(id_dtype, (batch_size, 1), elements=st.integers(0, 50)))
    return accepted, draw(ids), draw(ids), bonus


@given(output_inputs())
def test_kernel_matches_reference(inputs):
    accepted, substitute, draft, bonus = inputs
    result = specdec_np.create_output(accepted, substitute, draft, bonus)
    expected = _reference.create_output(accepted, substitute, draft, bonus)
    for got, want in zip(result, expected):
        np.testing.assert_array_equal(got, want)
        assert got.dtype == np.int64


def test_format_and_counters_follow_vllm():
    accepted = np.array(
        [[True, True, True], [False, True, True], [True, False, True], [True, True, False]]
    )
    draft = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]])
    substitute = draft + 100
    bonus = np.array([[20], [21], [22], [23]])
    sampler = specdec_np.RejectionSampler()
    output = sampler._create_output(accepted, substitute, draft, bonus)
    np.testing.assert_array_equal(
        output,
        [[1, 2, 3, 20], [104, -1, -1, -1], [7, 108, -1, -1], [10, 11, 112, -1]],
    )
    # Accepted positions after the first rejection still count (non-causal, as in vLLM).
    assert int(sampler.num_accepted_tokens) == 3 + 2 + 2 + 2
    assert int(sampler.num_emitted_tokens) == 4 + 1 + 2 + 3
    assert sampler.num_draft_tokens == 12
    assert (
        sampler.num_accepted_tokens.shape == () and sampler.num_accepted_tokens.dtype == np.int64
    )


def test_k_equal_one_and_bonus_as_vector():
    result = specdec_np.create_output(
        np.array([[True], [False]]), np.array([[5], [6]]), np.array([[1], [2]]), np.array([7, 8])
    )
    np.testing.assert_array_equal(result.output_token_ids, [[1, 7], [6, -1]])


def test_empty_batch_leaves_counters_alone():
    sampler = specdec_np.GreedySampler()
    empty = np.zeros((0, 3), dtype=np.int64)
    output = sampler._create_output(empty.astype(bool), empty, empty, np.zeros((0, 1), np.int64))
    assert output.shape == (0, 4)
    # An empty batch creates no counters, so init_tensors still works after it.
    assert sampler.num_accepted_tokens is None and sampler.num_emitted_tokens is None
    assert sampler.num_draft_tokens == 0


@pytest.mark.parametrize(
    ("argument", "row", "position"),
    [("draft_token_ids", 1, 2), ("bonus_token_ids", 0, 0), ("substitute_token_ids", 1, 0)],
)
def test_out_of_range_ids_name_row_and_position(argument, row, position):
    accepted = np.array([[True, True, True], [False, True, True]])
    ids = {
        "draft_token_ids": np.array([[1, 2, 3], [4, 5, 6]]),
        "substitute_token_ids": np.array([[1, 2, 3], [4, 5, 6]]),
        "bonus_token_ids": np.array([[7], [8]]),
    }
    target = ids[argument]
    target[row, position] = 10
    with pytest.raises(ValueError, match=rf"{argument}.*\({row}, {position}\)"):
        specdec_np.create_output(
            accepted,
            ids["substitute_token_ids"],
            ids["draft_token_ids"],
            ids["bonus_token_ids"],
            vocab_size=10,
        )


def test_negative_ids_are_rejected_without_vocab_size():
    with pytest.raises(ValueError, match="draft_token_ids"):
        specdec_np.create_output(
            np.array([[True]]), np.array([[1]]), np.array([[-1]]), np.array([[1]])
        )
