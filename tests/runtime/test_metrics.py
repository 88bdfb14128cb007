"""``VerificationMetrics``: sums over verified requests, merged across workers by ``+``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec_np import VerificationMetrics


@st.composite
def calls(draw):
    """One call's ``(num_draft_tokens, accepted_lengths)`` with ``0 <= r_b <= k_b``."""
    counts = draw(st.lists(st.integers(0, 6), min_size=0, max_size=6))
    lengths = [draw(st.integers(0, k_b)) for k_b in counts]
    return np.asarray(counts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)


def recorded(history) -> VerificationMetrics:
    metrics = VerificationMetrics()
    for counts, lengths in history:
        metrics.record(counts, lengths)
    return metrics


def fields(metrics: VerificationMetrics) -> tuple:
    return (
        metrics.requests,
        metrics.drafted,
        metrics.accepted,
        metrics.emitted,
        metrics.accepted_at.tolist(),
        metrics.drafted_at.tolist(),
    )


def test_empty_metrics_have_nan_figures():
    metrics = VerificationMetrics()
    assert fields(metrics) == (0, 0, 0, 0, [], [])
    assert math.isnan(metrics.acceptance_rate)
    assert math.isnan(metrics.mean_accepted_length)
    assert metrics.acceptance_by_position.shape == (0,)
    assert metrics.acceptance_by_position.dtype == np.float64


def test_requests_without_drafts_give_nan_acceptance_but_a_mean_length():
    metrics = VerificationMetrics()
    metrics.record(np.zeros(3, np.int64), np.zeros(3, np.int64))
    assert fields(metrics) == (3, 0, 0, 3, [], [])
    assert math.isnan(metrics.acceptance_rate)
    assert metrics.mean_accepted_length == 1.0


def test_one_call_by_hand():
    metrics = VerificationMetrics()
    metrics.record([3, 0, 2, 1], [2, 0, 2, 0])
    assert fields(metrics) == (4, 6, 4, 8, [2, 2, 0], [3, 2, 1])
    assert metrics.acceptance_rate == 4 / 6
    assert metrics.mean_accepted_length == 2.0
    np.testing.assert_array_equal(metrics.acceptance_by_position, [2 / 3, 1.0, 0.0])


def test_histogram_grows_with_longer_drafts():
    metrics = VerificationMetrics()
    metrics.record([2, 1], [1, 1])
    assert metrics.accepted_at.tolist() == [2, 0]
    assert metrics.drafted_at.tolist() == [2, 1]
    metrics.record([5], [4])
    assert metrics.accepted_at.tolist() == [3, 1, 1, 1, 0]
    assert metrics.drafted_at.tolist() == [3, 2, 1, 1, 1]
    # A shorter call afterwards keeps the length.
    metrics.record([1], [0])
    assert metrics.drafted_at.tolist() == [4, 2, 1, 1, 1]
    assert metrics.accepted_at.dtype == metrics.drafted_at.dtype == np.int64
    np.testing.assert_array_equal(metrics.acceptance_by_position, [3 / 4, 1 / 2, 1.0, 1.0, 0.0])


def test_record_takes_any_integer_array_like():
    by_list, by_int32 = VerificationMetrics(), VerificationMetrics()
    by_list.record([2, 3], [1, 3])
    by_int32.record(np.array([2, 3], np.int32), np.array([[1], [3]], np.int32))
    assert fields(by_list) == fields(by_int32)


@given(history=st.lists(calls(), max_size=6))
@settings(max_examples=100, deadline=None)
def test_sums_and_figures(history):
    metrics = recorded(history)
    counts = np.concatenate([np.zeros(0, np.int64), *(c for c, _ in history)])
    lengths = np.concatenate([np.zeros(0, np.int64), *(r for _, r in history)])
    assert metrics.requests == counts.size
    assert metrics.drafted == counts.sum()
    assert metrics.accepted == lengths.sum()
    assert metrics.emitted == lengths.sum() + counts.size
    width = metrics.drafted_at.size
    assert width == int(counts.max(initial=0))
    for j in range(width):
        assert metrics.drafted_at[j] == (counts > j).sum()
        assert metrics.accepted_at[j] == (lengths > j).sum()
    # The per-position counts are non-increasing and sum to the totals.
    assert np.all(np.diff(metrics.accepted_at) <= 0)
    assert metrics.accepted_at.sum() == metrics.accepted
    assert metrics.drafted_at.sum() == metrics.drafted
    if counts.sum():
        assert metrics.acceptance_rate == lengths.sum() / counts.sum()
    else:
        assert math.isnan(metrics.acceptance_rate)
    if counts.size:
        assert metrics.mean_accepted_length == (lengths.sum() + counts.size) / counts.size
    else:
        assert math.isnan(metrics.mean_accepted_length)
    shares = metrics.acceptance_by_position
    assert np.all((shares >= 0) & (shares <= 1))


@given(first=st.lists(calls(), max_size=4), second=st.lists(calls(), max_size=4))
@settings(max_examples=100, deadline=None)
def test_merge_equals_recording_everything_in_one(first, second):
    merged = recorded(first) + recorded(second)
    assert fields(merged) == fields(recorded(first + second))


@given(
    first=st.lists(calls(), max_size=3),
    second=st.lists(calls(), max_size=3),
    third=st.lists(calls(), max_size=3),
)
@settings(max_examples=100, deadline=None)
def test_merge_is_commutative_and_associative(first, second, third):
    a, b, c = recorded(first), recorded(second), recorded(third)
    assert fields(a + b) == fields(b + a)
    assert fields((a + b) + c) == fields(a + (b + c))
    assert fields(a.merge(b)) == fields(a + b)
    assert fields(a + VerificationMetrics()) == fields(a)


def test_merge_leaves_its_operands_alone():
    short, long = VerificationMetrics(), VerificationMetrics()
    short.record([1], [1])
    long.record([4], [2])
    before = fields(short), fields(long)
    merged = short + long
    assert fields(merged) == (2, 5, 3, 5, [2, 1, 0, 0], [2, 1, 1, 1])
    assert (fields(short), fields(long)) == before
    # The merged arrays are its own.
    merged.record([4], [4])
    assert (fields(short), fields(long)) == before


def test_merge_of_a_non_metrics_object_fails():
    with pytest.raises((TypeError, AttributeError)):
        VerificationMetrics() + 1


def test_equal_metrics_compare_equal():
    first, second = VerificationMetrics(), VerificationMetrics()
    assert first == second
    first.record([2, 1], [1, 0])
    second.record([2, 1], [1, 0])
    assert first == second
    second.record([1], [1])
    assert first != second


# --------------------------------------------------------------------------------------
# The compiled record (specdec_np._core.record_metrics) against the Python one
# --------------------------------------------------------------------------------------


@st.composite
def any_calls(draw):
    """One call's arguments of every kind ``record`` takes: int64 arrays (either C name of
    the type, strided or not), int32, lists; negative lengths, batches on both sides of the
    Python sums' limit, lengths near int64's ends, and ``emitted``."""
    size = draw(st.integers(0, 20))
    low, high = draw(st.sampled_from([(-3, 8), (0, 6), (-(2**62), -(2**61))]))
    counts = np.asarray([draw(st.integers(low, high)) for _ in range(size)], dtype=np.int64)
    lengths = np.asarray([draw(st.integers(min(low, 0), 6)) for _ in range(size)], np.int64)
    kind = draw(st.sampled_from(["int64", "longlong", "strided", "int32", "list"]))
    if kind == "longlong":
        counts, lengths = counts.astype(np.longlong), lengths.astype(np.longlong)
    elif kind == "strided":
        counts, lengths = np.repeat(counts, 2)[::2], np.repeat(lengths, 2)[::2]
    elif kind == "int32" and low > -(2**31):
        counts, lengths = counts.astype(np.int32), lengths.astype(np.int32)
    elif kind == "list":
        counts, lengths = counts.tolist(), lengths.tolist()
    emitted = np.asarray(lengths) + 1 if draw(st.booleans()) else None
    return counts, lengths, emitted


def exact_fields(metrics: VerificationMetrics) -> tuple:
    """Every field with its type (and the arrays' dtypes)."""
    return tuple(
        (type(value).__name__, value.dtype.str, value.tolist())
        if isinstance(value, np.ndarray) else (type(value).__name__, value)
        for value in vars(metrics).values()
    )


@given(history=st.lists(any_calls(), max_size=5))
@settings(max_examples=60, deadline=None)
def test_the_compiled_record_is_the_python_record(history):
    from specdec_np import _core

    compiled, python = VerificationMetrics(), VerificationMetrics()
    taken = []
    record_metrics = _core.record_metrics

    def counted(*arguments):
        taken.append(record_metrics(*arguments))
        return taken[-1]

    try:
        for counts, lengths, emitted in history:
            _core.record_metrics = counted
            compiled.record(counts, lengths, emitted=emitted)
            _core.record_metrics = lambda *arguments: False
            python.record(counts, lengths, emitted=emitted)
            assert exact_fields(compiled) == exact_fields(python)
    finally:
        _core.record_metrics = record_metrics
    assert exact_fields(compiled) == exact_fields(python)


def test_the_compiled_record_takes_the_common_call_and_leaves_the_others():
    from specdec_np import _core

    metrics = VerificationMetrics()
    common = np.array([2, 1]), np.array([1, 0])
    # Counts that must grow: the Python record.
    assert not _core.record_metrics(vars(metrics), *common, None)
    metrics.record(*common)
    before = exact_fields(metrics)
    assert _core.record_metrics(vars(metrics), *common, None)
    assert exact_fields(metrics) != before
    assert fields(metrics) == (4, 6, 2, 6, [2, 0], [4, 2])
    for other in (
        (np.array([2, 1], np.int32), common[1]),  # another dtype
        (np.array([2, 1, 1])[::2], common[1][:2]),  # strided
        ([2, 1], common[1]),  # a list
        (np.array([-(2**63), -1]), common[1]),  # a sum that leaves int64
        (np.array([3]), np.array([0])),  # longer than any before
    ):
        before = exact_fields(metrics)
        assert not _core.record_metrics(vars(metrics), *other, None)
        assert exact_fields(metrics) == before


def test_a_record_whose_commit_fails_changes_nothing():
    class Refusing:
        def __setattr__(self, name, value):
            raise KeyboardInterrupt

    for grows in (False, True):
        metrics = VerificationMetrics()
        metrics.record(np.array([2]), np.array([1]))
        before = exact_fields(metrics)
        with pytest.raises(KeyboardInterrupt):
            metrics.record(np.array([2 + grows]), np.array([2]), Refusing())
        assert exact_fields(metrics) == before


def test_the_compiled_record_gives_its_lock_back():
    """The lock taken around a record is free again after it, recorded, left to the Python
    record or failed."""
    import threading

    from specdec_np import _core

    class Refusing:
        def __setattr__(self, name, value):
            raise KeyboardInterrupt

    lock = threading.Lock()
    metrics = VerificationMetrics()
    metrics.record(np.array([2]), np.array([1]))
    arguments = (
        (np.array([2]), np.array([1]), None, True),
        (np.array([3]), np.array([1]), None, False),
        (np.array([1]), np.array([1]), Refusing(), KeyboardInterrupt),
    )
    for counts, lengths, commit, outcome in arguments:
        if outcome is KeyboardInterrupt:
            with pytest.raises(KeyboardInterrupt):
                _core.record_metrics(vars(metrics), counts, lengths, commit, lock)
        else:
            assert _core.record_metrics(vars(metrics), counts, lengths, commit, lock) is outcome
        assert lock.acquire(blocking=False)
        lock.release()
    assert fields(metrics) == (2, 4, 2, 4, [2, 0], [2, 2])
