"""Greedy verification (docs/semantics.md §2.5): the Cython kernel against the array-API
reference and a plain per-position oracle, the decision-only scan after the first
rejection, the counters and strict mode.

Greedy decisions involve no arithmetic (a comparison of stored values), so for finite
inputs kernel, reference and oracle must agree exactly.  The kernel accepts a draft with
``p(x) > 0.5 + 5e-4`` without reading its row, which is only valid for rows that sum to 1
within 1e-3 (the documented input contract, checked in strict mode): the generated rows
below are normalised, or unnormalised with every entry <= 0.5.
"""

from __future__ import annotations

import array_api_strict as xps
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np._reference import chains as _reference


def greedy_oracle(target, bonus, draft):
    """Per position: accept iff the draft is ``numpy.argmax`` of its row (first index)."""
    batch_size, k = draft.shape
    output = np.full((batch_size, k + 1), -1, dtype=np.int64)
    lengths = np.zeros(batch_size, dtype=np.int64)
    passed = np.zeros(batch_size, dtype=np.int64)
    for b in range(batch_size):
        argmax = [int(np.argmax(target[b, i])) for i in range(k)]
        accepted = [int(draft[b, i]) == argmax[i] for i in range(k)]
        r = accepted.index(False) if False in accepted else k
        output[b, :r] = draft[b, :r]
        output[b, r] = int(bonus[b, 0]) if r == k else argmax[r]
        lengths[b] = r
        passed[b] = sum(accepted)
    return output, lengths, passed


def assert_result_equal(result, expected) -> None:
    for got, want in zip(result, expected, strict=True):
        got = np.asarray(got)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)


def check_greedy(target, bonus, draft):
    expected = greedy_oracle(target, bonus, draft)
    assert_result_equal(_reference.greedy_sample(target, bonus, draft), expected)
    assert_result_equal(specdec_np.greedy_sample(target, bonus, draft), expected)
    return expected


# --------------------------------------------------------------------------------------
# Input generation: probability rows (or rows with every entry <= 0.5)
# --------------------------------------------------------------------------------------

ROW_KINDS = ("dirichlet", "counts", "tied_max", "peaked", "onehot", "halves", "small_noise")


def make_row(rng: np.random.Generator, vocab_size: int, kind: str) -> np.ndarray:
    if kind == "dirichlet":
        row = rng.dirichlet(np.full(vocab_size, rng.choice([0.05, 0.5, 5.0])))
        if np.isfinite(row).all() and row.sum() > 0:
            return row
        kind = "onehot"
    if kind == "counts":  # small integers, normalised: exact ties everywhere
        row = rng.integers(0, 4, vocab_size).astype(np.float64)
        row[rng.integers(vocab_size)] += 1
        return row / row.sum()
    if kind == "tied_max":  # the maximum copied to 1-3 random places, anywhere in the row
        row = rng.dirichlet(np.full(vocab_size, 0.5))
        if not np.isfinite(row).all():
            row = np.ones(vocab_size)
        row[rng.integers(0, vocab_size, size=rng.integers(1, 4))] = row.max()
        return row / row.sum()
    if kind == "peaked":  # one token above 1/2: the kernel's shortcut
        top = rng.choice([0.5006, 0.51, 0.6, 0.9, 0.999])
        row = rng.dirichlet(np.ones(vocab_size)) * (1 - top)
        row[rng.integers(vocab_size)] = top
        return row / row.sum()
    if kind == "halves":  # two tokens at exactly 1/2: a tie that the shortcut must not take
        row = np.zeros(vocab_size)
        row[rng.integers(0, vocab_size, size=2)] = 0.5
        return row if row.sum() == 1.0 else np.ones(vocab_size) / vocab_size
    if kind == "small_noise":  # unnormalised, but every entry <= 1/2
        return rng.random(vocab_size) * 0.5
    row = np.zeros(vocab_size)
    row[rng.integers(vocab_size)] = 1.0
    return row


def make_case(seed, batch_size, k, vocab_size, float_dtype, id_dtype, kinds=ROW_KINDS):
    rng = np.random.default_rng(seed)
    target = np.empty((batch_size, k + 1, vocab_size))
    for b in range(batch_size):
        for i in range(k + 1):
            target[b, i] = make_row(rng, vocab_size, kinds[rng.integers(len(kinds))])
    target = target.astype(float_dtype)
    draft = np.empty((batch_size, k), dtype=np.int64)
    for b in range(batch_size):
        for i in range(k):
            row = target[b, i]
            maxima = np.flatnonzero(row == row.max())
            choice = rng.integers(5)
            if choice <= 1:  # the argmax (first index)
                draft[b, i] = maxima[0]
            elif choice == 2:  # another index of the maximum, if tied: must be rejected
                draft[b, i] = maxima[-1]
            elif choice == 3:  # the runner-up
                draft[b, i] = int(np.argsort(row, kind="stable")[-2]) if vocab_size > 1 else 0
            else:
                draft[b, i] = rng.integers(vocab_size)
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    return target, bonus.astype(id_dtype), draft.astype(id_dtype)


seeds = st.integers(0, 2**32 - 1)
float_dtypes = st.sampled_from([np.float32, np.float64])
id_dtypes = st.sampled_from([np.int32, np.int64])


# --------------------------------------------------------------------------------------
# Kernel == reference == oracle
# --------------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None)
@given(
    seed=seeds,
    batch_size=st.integers(0, 6),
    k=st.integers(1, 5),
    vocab_size=st.integers(1, 64),
    float_dtype=float_dtypes,
    id_dtype=id_dtypes,
)
@example(seed=0, batch_size=3, k=1, vocab_size=1, float_dtype=np.float32, id_dtype=np.int32)
@example(seed=1, batch_size=0, k=2, vocab_size=5, float_dtype=np.float64, id_dtype=np.int64)
def test_kernel_matches_reference_small_vocab(
    seed, batch_size, k, vocab_size, float_dtype, id_dtype
):
    check_greedy(*make_case(seed, batch_size, k, vocab_size, float_dtype, id_dtype))


@settings(max_examples=150, deadline=None)
@given(
    seed=seeds,
    batch_size=st.integers(0, 6),
    k=st.integers(1, 5),
    vocab_size=st.integers(1000, 5000),
    float_dtype=float_dtypes,
    id_dtype=id_dtypes,
)
@example(seed=2, batch_size=6, k=5, vocab_size=4103, float_dtype=np.float32, id_dtype=np.int64)
def test_kernel_matches_reference_large_vocab(
    seed, batch_size, k, vocab_size, float_dtype, id_dtype
):
    """Several 1024-entry scan blocks."""
    check_greedy(*make_case(seed, batch_size, k, vocab_size, float_dtype, id_dtype))


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_kernel_matches_reference_threaded_batch(float_dtype, threaded):
    check_greedy(*make_case(7, 24, 4, 3000, float_dtype, np.int64))


@settings(max_examples=100, deadline=None)
@given(
    seed=seeds,
    batch_size=st.integers(0, 4),
    k=st.integers(1, 4),
    vocab_size=st.integers(1, 40),
    float_dtype=float_dtypes,
    id_dtype=id_dtypes,
)
def test_reference_on_array_api_strict_equals_numpy(
    seed, batch_size, k, vocab_size, float_dtype, id_dtype
):
    target, bonus, draft = make_case(seed, batch_size, k, vocab_size, float_dtype, id_dtype)
    on_numpy = _reference.greedy_sample(target, bonus, draft)
    on_strict = _reference.greedy_sample(
        xps.asarray(target), xps.asarray(bonus), xps.asarray(draft)
    )
    for a, b in zip(on_numpy, on_strict, strict=True):
        assert b.dtype == xps.int64
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --------------------------------------------------------------------------------------
# Behaviours
# --------------------------------------------------------------------------------------


def peaked_target(rng, batch_size, k, vocab_size, dtype=np.float32):
    """Rows whose argmax holds 0.4 (below the shortcut) and the rest spread evenly."""
    top = rng.integers(0, vocab_size, (batch_size, k + 1))
    target = np.full((batch_size, k + 1, vocab_size), 0.6 / (vocab_size - 1))
    np.put_along_axis(target, top[:, :, None], 0.4, axis=2)
    return target.astype(dtype), top


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
def test_perfect_match_emits_drafts_and_bonus(float_dtype):
    rng = np.random.default_rng(0)
    batch_size, k, vocab_size = 5, 4, 100
    target, top = peaked_target(rng, batch_size, k, vocab_size, float_dtype)
    draft = top[:, :k]
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    sampler = specdec_np.GreedySampler()
    output = sampler(target, bonus, None, draft)
    np.testing.assert_array_equal(output, np.concatenate([draft, bonus], axis=1))
    assert int(sampler.num_accepted_tokens) == batch_size * k
    assert int(sampler.num_emitted_tokens) == batch_size * (k + 1)
    assert sampler.num_draft_tokens == batch_size * k


@pytest.mark.parametrize("mismatch", [0, 1, 3])
def test_early_mismatch_emits_prefix_then_argmax(mismatch):
    rng = np.random.default_rng(1)
    batch_size, k, vocab_size = 4, 4, 50
    target, top = peaked_target(rng, batch_size, k, vocab_size)
    draft = top[:, :k].copy()
    draft[:, mismatch] = (top[:, mismatch] + 1) % vocab_size
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    output = specdec_np.GreedySampler()(target, bonus, None, draft)
    expected = np.full((batch_size, k + 1), -1)
    expected[:, :mismatch] = top[:, :mismatch]
    expected[:, mismatch] = top[:, mismatch]
    np.testing.assert_array_equal(output, expected)
    result = specdec_np.greedy_sample(target, bonus, draft)
    np.testing.assert_array_equal(result.accepted_lengths, [mismatch] * batch_size)
    np.testing.assert_array_equal(result.num_accepted, [k - 1] * batch_size)


def test_rows_with_different_outcomes_in_one_batch():
    rng = np.random.default_rng(2)
    k, vocab_size = 3, 20
    target, top = peaked_target(rng, 4, k, vocab_size)
    draft = top[:, :k].copy()
    wrong = (top + 1) % vocab_size
    draft[1, 0] = wrong[1, 0]  # rejected at 0
    draft[2, 2] = wrong[2, 2]  # rejected at 2
    draft[3, 1] = wrong[3, 1]  # rejected at 1 ...
    draft[3, 2] = wrong[3, 2]  # ... and at 2 (not counted)
    bonus = np.array([[7], [8], [9], [10]])
    sampler = specdec_np.GreedySampler()
    output = sampler(target, bonus, None, draft)
    expected = [
        [top[0, 0], top[0, 1], top[0, 2], 7],
        [top[1, 0], -1, -1, -1],
        [top[2, 0], top[2, 1], top[2, 2], -1],
        [top[3, 0], top[3, 1], -1, -1],
    ]
    np.testing.assert_array_equal(output, expected)
    assert int(sampler.num_accepted_tokens) == 3 + 2 + 2 + 1
    assert int(sampler.num_emitted_tokens) == 4 + 1 + 3 + 2
    check_greedy(target, bonus, draft)


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "vocab_size,maxima",
    [
        (4000, [3000, 1500]),
        (4000, [3999, 1023, 2048]),
        (2048, [2047, 1024]),
        (1029, [1028, 1025]),
        (1029, [1028]),
        (16, [13, 5, 3]),
        (5, [4, 2]),
        (2, [1, 0]),
    ],
)
def test_recovered_token_breaks_ties_to_first_index(float_dtype, vocab_size, maxima):
    """At the first rejection the emitted argmax is the first index of the maximum: across
    1024-blocks, at block boundaries, in the 8-lane tail and inside one lane group."""
    row = np.full(vocab_size, 0.001 / vocab_size)
    row[maxima] = 0.3
    if 1023 % vocab_size not in maxima:  # a near-maximum at the end of the first block
        row[1023 % vocab_size] = 0.29
    target = np.stack([row, row])[None].astype(float_dtype)
    # A tied maximum that is not the first (or any other token if there is no tie): rejected.
    draft = np.array([[max(maxima) if len(maxima) > 1 else 0]])
    output = specdec_np.GreedySampler()(target, np.array([[0]]), None, draft)
    np.testing.assert_array_equal(output, [[min(maxima), -1]])
    check_greedy(target, np.array([[0]]), draft)


def scan_row(vocab_size, values):
    """A normalised row with the given ``{index: value}`` entries and the rest spread evenly
    (well below them).  Equal values given here stay exactly equal."""
    row = np.full(vocab_size, (1.0 - sum(values.values())) / (vocab_size - len(values)))
    for index, value in values.items():
        row[index] = value
    return row


@pytest.mark.parametrize("float_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("vocab_size", [16, 3000])
def test_counter_after_first_rejection_uses_decision_scan(float_dtype, vocab_size):
    """After the first rejection the kernel only decides "is x the first argmax?" (it stops
    at the first entry that beats p(x), or ties it at a lower index).  Those decisions are
    counted in num_accepted but not emitted."""
    far = vocab_size - 1  # the last entry (for 3000: in the 8-lane tail of the third block)
    mid = 9 if vocab_size == 16 else 2500  # another 1024-block than index 3
    rows = [
        (scan_row(vocab_size, {4: 0.3}), 5, False),  # first rejection
        (scan_row(vocab_size, {6: 0.3}), 6, True),  # unique argmax, no shortcut
        (scan_row(vocab_size, {2: 0.3, 5: 0.3}), 5, False),  # tie at a lower index
        (scan_row(vocab_size, {2: 0.3, 5: 0.3}), 2, True),  # tie at a higher index
        (scan_row(vocab_size, {1: 0.2, far: 0.21}), 1, False),  # beaten in the last block
        (scan_row(vocab_size, {3: 0.3, mid: 0.3}), mid, False),  # tie lower, other block
        (scan_row(vocab_size, {3: 0.3, mid: 0.3}), 3, True),  # tie higher, other block
        (scan_row(vocab_size, {7: 0.6}), 7, True),  # above 1/2: the shortcut
        (scan_row(vocab_size, {0: 0.3, 8: 0.25}), 8, False),  # beaten at index 0
        (scan_row(vocab_size, {far: 0.4}), far, True),  # argmax is the last entry
        (scan_row(vocab_size, {0: 0.45}), 0, True),  # argmax is the first entry
    ]
    k = len(rows)
    target = np.stack([row for row, _, _ in rows] + [rows[0][0]])[None].astype(float_dtype)
    draft = np.array([[x for _, x, _ in rows]])
    bonus = np.array([[1]])
    output, lengths, passed = check_greedy(target, bonus, draft)
    np.testing.assert_array_equal(output, [[4] + [-1] * k])
    assert lengths.tolist() == [0]
    assert passed.tolist() == [sum(ok for _, _, ok in rows)]
    # Each decision on its own, as position 1 after a rejection at position 0.
    for index, (row, x, ok) in enumerate(rows[1:], start=1):
        pair = np.stack([rows[0][0], row, row])[None].astype(float_dtype)
        result = specdec_np.greedy_sample(pair, bonus, np.array([[5, x]]))
        assert result.num_accepted.tolist() == [int(ok)], f"case {index}"
        assert result.output_token_ids.tolist() == [[4, -1, -1]]


def test_counters_accumulate_and_empty_batch_leaves_them_alone():
    rng = np.random.default_rng(3)
    target, top = peaked_target(rng, 3, 2, 10)
    draft = top[:, :2].copy()
    draft[0, 0] = (top[0, 0] + 1) % 10  # row 0: rejected at 0, position 1 still passes
    bonus = np.zeros((3, 1), dtype=np.int64)
    sampler = specdec_np.GreedySampler()
    sampler.init_tensors("cpu")
    sampler(target, bonus, None, draft)
    sampler(target, bonus, None, draft)
    for counter in (sampler.num_accepted_tokens, sampler.num_emitted_tokens):
        assert isinstance(counter, np.ndarray)
        assert counter.shape == () and counter.dtype == np.int64
    assert int(sampler.num_accepted_tokens) == 2 * (1 + 2 + 2)
    assert int(sampler.num_emitted_tokens) == 2 * (1 + 3 + 3)
    assert sampler.num_draft_tokens == 2 * 6 and isinstance(sampler.num_draft_tokens, int)
    output = sampler(
        np.zeros((0, 3, 10), np.float32),
        np.zeros((0, 1), np.int64),
        None,
        np.zeros((0, 2), np.int64),
    )
    assert output.shape == (0, 3) and output.dtype == np.int64
    assert int(sampler.num_accepted_tokens) == 10
    assert int(sampler.num_emitted_tokens) == 14
    assert sampler.num_draft_tokens == 12


def test_draft_probs_are_ignored():
    target, bonus, draft = make_case(4, 5, 3, 40, np.float32, np.int64)
    draft_probs = np.random.default_rng(5).dirichlet(np.ones(40), size=(5, 3))
    without = specdec_np.GreedySampler()(target, bonus, None, draft)
    with_probs = specdec_np.GreedySampler()(target, bonus, draft_probs.astype(np.float32), draft)
    np.testing.assert_array_equal(without, with_probs)


# --------------------------------------------------------------------------------------
# Strict mode: the row-sum contract
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("row_sum", [0.9, 1.002, 1.5, 0.0])
def test_strict_mode_rejects_rows_that_do_not_sum_to_one(row_sum):
    target, bonus, draft = make_case(6, 3, 2, 30, np.float64, np.int64, ("dirichlet",))
    target[1, 1] *= row_sum
    target = target.astype(np.float32)
    with pytest.raises(ValueError, match="target_with_bonus_probs"):
        specdec_np.GreedySampler(strict_mode=True)(target, bonus, None, draft)
    with pytest.raises(ValueError, match="target_with_bonus_probs"):
        specdec_np.greedy_sample(target, bonus, draft, strict_mode=True)
    # Outside strict mode the contract is the caller's; with every entry below 1/2 the
    # kernel reads the rows and still agrees with the reference.
    if target.max() <= 0.5:
        check_greedy(target, bonus, draft)


def test_strict_mode_catches_the_case_the_shortcut_would_get_wrong():
    """[0.6, 0.9] breaks the contract: 0.6 > 0.5005 is not the argmax here."""
    target = np.array([[[0.6, 0.9], [0.5, 0.5]]], dtype=np.float32)
    with pytest.raises(ValueError, match="target_with_bonus_probs"):
        specdec_np.GreedySampler(strict_mode=True)(target, np.array([[0]]), None, np.array([[0]]))


@pytest.mark.parametrize("row_sum", [1.0, 1.0009, 0.9991])
def test_strict_mode_accepts_normalised_rows(row_sum):
    target, bonus, draft = make_case(7, 4, 3, 200, np.float64, np.int64)
    target[:, :3] /= target[:, :3].sum(axis=-1, keepdims=True)
    target[:, :3] *= row_sum
    target[:, 3] = 0.0  # the bonus row is only shape-checked
    target = target.astype(np.float32)
    expected = greedy_oracle(target, bonus, draft)
    sampler = specdec_np.GreedySampler(strict_mode=True)
    np.testing.assert_array_equal(sampler(target, bonus, None, draft), expected[0])
    assert_result_equal(specdec_np.greedy_sample(target, bonus, draft, strict_mode=True), expected)


def test_minus_infinity_rows_follow_the_argmax_rule_after_a_rejection():
    """A row with nothing above -inf has argmax 0, at the first rejection and after it."""
    target = np.full((1, 3, 4), -np.inf, np.float32)
    target[0, 0] = [0.1, 0.7, 0.1, 0.1]  # position 0: draft 0 is rejected
    target[0, 1, 0] = np.nan  # position 1: NaN never wins, so the argmax is 0
    for draft, counted in ((1, 0), (0, 1)):
        result = specdec_np.greedy_sample(target, np.array([[0]]), np.array([[0, draft]]))
        assert result.output_token_ids.tolist() == [[1, -1, -1]]
        assert result.num_accepted.tolist() == [counted]
