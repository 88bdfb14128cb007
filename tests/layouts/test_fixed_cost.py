"""The fast paths of a call's fixed cost refuse and compute exactly what the general paths
do: the cache of sampling parameters given as Python numbers, the compiled temperature
overflow test, and the metrics of small batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from specdec_np import _core
from specdec_np._layouts import sampling as _sampling
from specdec_np._layouts.sampling import SamplingParameters
from specdec_np.metrics import VerificationMetrics


def _checked(parameters: SamplingParameters, vocab: int = 16, dtype: type = np.float32) -> Any:
    return _sampling.checked_parameters(
        2, vocab, parameters, from_logits=True, divides_logits=True, row_dtype=dtype,
        every_request_greedy=False, table=True,
    )  # fmt: skip


def test_numbers_are_checked_once_per_value_and_shape() -> None:
    parameters = SamplingParameters(0.8, 8, 0.9, 0.05)
    first = _checked(parameters)
    assert _checked(SamplingParameters(0.8, 8, 0.9, 0.05)) is first
    assert not first.table.flags.writeable and not first.greedy.flags.writeable
    # The vocabulary is part of the key: top-k 8 is off at V = 5.
    assert first.table[0, 1] == 8 and _checked(parameters, vocab=5).table[0, 1] == 0
    # So is the rows' dtype: 1e-40 is a normal float64 but not a normal float32.
    assert _checked(SamplingParameters(1e-40), dtype=np.float64).table[0, 0] == 1e-40
    with pytest.raises(ValueError, match="normal float32"):
        _checked(SamplingParameters(1e-40))
    # A refused value is never cached: it is refused again.
    for _ in range(2):
        with pytest.raises(ValueError, match="top_p must be in"):
            _checked(SamplingParameters(top_p=0.0))


def test_negative_zero_and_arrays_are_not_cached() -> None:
    assert _sampling._numbers_key(SamplingParameters(min_p=-0.0)) is None
    assert _sampling._numbers_key(SamplingParameters(min_p=0.0)) is not None
    assert _sampling._numbers_key(SamplingParameters(np.float64(0.8))) is None
    assert _sampling._numbers_key(SamplingParameters(True)) is None
    # A filter order that is not a string (unhashable, even) is refused with its message.
    assert _sampling._numbers_key(SamplingParameters(filter_order=["vllm"])) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="filter_order must be one of"):
        _checked(SamplingParameters(0.8, filter_order=["vllm"]))  # type: ignore[arg-type]
    table = _checked(SamplingParameters(0.8, min_p=-0.0)).table
    assert np.signbit(table[0, 3])  # the sign the general path keeps
    array = np.array([0.8, 0.7])
    checked = _checked(SamplingParameters(array))
    assert checked.table.flags.writeable and checked.table[1, 0] == 0.7


def _overflow_reference(rows: np.ndarray, temperature: np.ndarray, greedy: np.ndarray,
                        counts: np.ndarray) -> int:
    divisor = temperature.astype(rows.dtype)
    request = np.repeat(np.arange(counts.shape[0]), counts)
    for row in range(int(counts.sum())):
        b = request[row]
        if greedy[b] or not divisor[b] < 1:
            continue
        finite = rows[row][np.isfinite(rows[row])]
        if finite.size:
            with np.errstate(over="ignore"):
                if np.isinf(finite.max() / divisor[b]):
                    return row
    return -1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_compiled_overflow_test_is_the_numpy_one(dtype: type) -> None:
    rng = np.random.default_rng(0)
    big = np.finfo(dtype).max / 4
    found = set()
    for _ in range(300):
        counts = rng.integers(0, 3, 4)
        rows = rng.standard_normal((int(counts.sum()), 6)).astype(dtype)
        mask = rng.random(rows.shape)
        rows[mask < 0.1] = np.nan
        rows[(mask >= 0.1) & (mask < 0.2)] = np.inf
        rows[(mask >= 0.2) & (mask < 0.3)] = -np.inf
        rows[(mask >= 0.3) & (mask < 0.35)] = big
        temperature = rng.choice([0.1, 0.3, 1.0, 2.0, 0.0], 4)
        greedy = temperature == 0
        expected = _overflow_reference(rows, temperature, greedy, counts)
        assert _core.first_tempered_overflow(rows, temperature, greedy.view(np.uint8), counts) \
            == expected
        found.add(expected >= 0)
    assert found == {True, False}  # both outcomes were exercised


def test_the_overflow_message_names_the_row() -> None:
    rows = np.zeros((3, 4), dtype=np.float32)
    rows[2, 1] = np.finfo(np.float32).max / 2
    with pytest.raises(ValueError, match="request 1, which divides the largest finite logit"):
        _sampling.check_tempered_rows(
            np.array([0.1, 0.1]), np.zeros(2, bool), "target_logits", rows,
            np.array([1, 2]), np,
        )  # fmt: skip
    # Greedy requests never divide their rows.
    _sampling.check_tempered_rows(
        np.array([0.1, 0.1]), np.array([False, True]), "target_logits", rows,
        np.array([1, 2]), np,
    )  # fmt: skip


@pytest.mark.parametrize("batch", [1, 16, 17, 40])
def test_small_and_large_batches_record_the_same_metrics(batch: int) -> None:
    rng = np.random.default_rng(batch)
    metrics = VerificationMetrics()
    drafted_at = np.zeros(9, np.int64)
    accepted_at = np.zeros(9, np.int64)
    for _ in range(3):
        drafted = rng.integers(0, 9, batch)
        accepted = np.minimum(rng.integers(0, 9, batch), drafted)
        metrics.record(drafted, accepted)
        for j in range(9):
            drafted_at[j] += int((drafted > j).sum())
            accepted_at[j] += int((accepted > j).sum())
    width = metrics.drafted_at.shape[0]
    assert np.array_equal(metrics.drafted_at, drafted_at[:width])
    assert np.array_equal(metrics.accepted_at, accepted_at[:width])
    assert not drafted_at[width:].any()
