"""The Monte-Carlo runs and the pieces they share with the conformance kit.

The runs on the kernels are tested with their verifiers (``tests/verifiers/test_rejection.py``,
``tests/verifiers/test_block_verification.py``); here, the shared pieces and the failure paths.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdec_np.testing import _monte_carlo


def test_draw_from_never_draws_zero_weight_tokens():
    rng = np.random.default_rng(4)
    q = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    tokens = _monte_carlo.draw_from(q, 50_000, rng)
    assert set(np.unique(tokens)) == {1, 3}
    assert abs(np.mean(tokens == 3) - 0.7) < 0.01


def test_draw_drafts_draws_position_by_position():
    q = np.array([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    ids = _monte_carlo.draw_drafts(q, 1000, np.random.default_rng(0))
    assert ids.shape == (1000, 2) and ids.dtype == np.int64
    assert set(ids[:, 0]) == {1} and set(ids[:, 1]) == {0, 2}
    # The same stream as drawing each position in turn.
    rng = np.random.default_rng(0)
    expected = np.stack([_monte_carlo.draw_from(row, 1000, rng) for row in q], axis=1)
    np.testing.assert_array_equal(ids, expected)


def test_complete_with_target_fills_only_the_missing_tokens():
    p = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    output = np.array([[1, -1, -1], [0, 0, -1], [1, 1, 0]])
    completed = _monte_carlo.complete_with_target(output, p, np.random.default_rng(1))
    np.testing.assert_array_equal(completed, [[1, 1, 0], [0, 0, 0], [1, 1, 0]])
    assert np.all(output[0] == [1, -1, -1])  # the input is not changed


def test_format_problem_names_the_row():
    ids = np.array([[1, 2], [1, 2], [1, 2], [1, 2]])
    good = np.array([[1, 2, 3], [1, 0, -1], [0, -1, -1], [1, 2, 0]])
    assert _monte_carlo.format_problem(good, ids, 4) == ""
    assert "outside [-1, V)" in _monte_carlo.format_problem(
        good.clip(max=3) + [[0, 0, 1]] * 4, ids, 4
    )
    assert "not tokens then -1" in _monte_carlo.format_problem(
        np.array([[1, -1, 3], *good[1:]]), ids, 4
    )
    problem = _monte_carlo.format_problem(np.array([[2, 2, 3], *good[1:]]), ids, 4)
    assert problem.startswith("row 0") and "not a prefix of the drafts" in problem


def test_array_module_and_to_numpy():
    assert _monte_carlo.array_module("numpy") is np
    with pytest.raises(ValueError, match="backend"):
        _monte_carlo.array_module("tpu")
    array = np.arange(3)
    assert _monte_carlo.to_numpy(array) is array
    np.testing.assert_array_equal(_monte_carlo.to_numpy([1, 2]), [1, 2])

    class Device:
        def get(self):
            return np.array([7])

    np.testing.assert_array_equal(_monte_carlo.to_numpy(Device()), [7])


def test_chain_monte_carlo_reports_a_malformed_output():
    def no_padding(target, bonus, draft_probs, draft_ids, uniforms):
        return np.hstack([draft_ids, bonus]) * 0

    report = _monte_carlo.monte_carlo_chain(
        no_padding,
        [[0.5, 0.5], [0.25, 0.75], [0.5, 0.5]],
        [[0.5, 0.5], [0.5, 0.5]],
        1000,
        np.random.default_rng(0),
        expected_accepted_length=1.0,
    )
    assert not report.format_ok and not report.passed()
    assert report.p_value == 0.0 and math.isinf(report.accepted_length_z)
