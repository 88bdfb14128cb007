"""Rejection sampler (docs/semantics.md §2.2): kernel versus reference, exact oracle, grids,
chi-square.

Every distributional check here is also run on deliberately broken samplers (negative
controls) and must reject them: a check that cannot fail proves nothing.
"""

from __future__ import annotations

import math

import array_api_strict as xps
import numpy as np
import pytest
from draw_checks import (
    LARGEST_BELOW_ONE,
    MC_P,
    MC_Q,
    ORACLE_CASES,
    apply_row_edges,
    assert_draw_consistent,
    random_rows,
    residual_weights,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import specdec_np
from specdec_np._reference import chains as _reference
from specdec_np.testing import _monte_carlo, _oracles

# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def assert_matches_reference(target, bonus, draft_probs, draft_ids, uniforms):
    """Kernel and reference agree: decisions exactly, residual draws up to boundaries."""
    try:
        expected = _reference.rejection_sample(target, bonus, draft_probs, draft_ids, uniforms)
    except ValueError:
        with pytest.raises(ValueError, match="no positive probability"):
            specdec_np.rejection_sample(target, bonus, draft_probs, draft_ids, uniforms=uniforms)
        return
    result = specdec_np.rejection_sample(target, bonus, draft_probs, draft_ids, uniforms=uniforms)
    ref_output, ref_lengths, ref_accepted = (np.asarray(a) for a in expected)
    batch_size, k = draft_ids.shape
    assert result.output_token_ids.dtype == np.int64
    assert result.output_token_ids.shape == (batch_size, k + 1)
    np.testing.assert_array_equal(result.accepted_lengths, ref_lengths)
    np.testing.assert_array_equal(result.num_accepted, ref_accepted)
    # Independent restatement of the acceptance rule: u * q(x) < p(x) in float64.
    p_x = np.take_along_axis(target[:, :k], draft_ids[:, :, None].astype(np.int64), 2)[..., 0]
    if draft_probs is None:
        q_x = np.ones_like(p_x, dtype=np.float64)
    else:
        q_x = np.take_along_axis(draft_probs, draft_ids[:, :, None].astype(np.int64), 2)[..., 0]
    passes = uniforms[:, :k] * q_x.astype(np.float64) < p_x.astype(np.float64)
    np.testing.assert_array_equal(result.num_accepted, passes.sum(axis=1))
    first_fail = np.where(passes.all(axis=1), k, np.argmin(passes, axis=1))
    np.testing.assert_array_equal(result.accepted_lengths, first_fail)
    output = result.output_token_ids
    for b in range(batch_size):
        r = int(ref_lengths[b])
        np.testing.assert_array_equal(output[b, :r], draft_ids[b, :r])
        np.testing.assert_array_equal(output[b, r + 1 :], -1)
        if r == k:
            assert output[b, k] == bonus[b, 0]
            continue
        p_row = target[b, r].astype(np.float64)
        if draft_probs is None:
            q_row = np.zeros_like(p_row)
            q_row[draft_ids[b, r]] = 1.0
        else:
            q_row = draft_probs[b, r].astype(np.float64)
        weights = residual_weights(p_row, q_row)
        assert_draw_consistent(output[b, r], ref_output[b, r], weights, uniforms[b, k])


EDGE_CASES = (
    "p_zero",
    "q_zero",
    "p_equals_q",
    "residual_zero",
    "one_hot_target",
    "extreme_uniforms",
    "drafts_from_q",
)


@st.composite
def rejection_cases(draw):
    batch_size = draw(st.integers(0, 6))
    k = draw(st.integers(1, 5))
    vocab_size = draw(st.one_of(st.just(1), st.integers(1, 40)))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    id_dtype = draw(st.sampled_from([np.int32, np.int64]))
    with_draft_probs = draw(st.booleans())
    edges = draw(st.sets(st.sampled_from(EDGE_CASES)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    target = random_rows(rng, (batch_size, k + 1, vocab_size))
    draft = random_rows(rng, (batch_size, k, vocab_size))
    draft_ids = rng.integers(0, vocab_size, (batch_size, k))
    uniforms = rng.random((batch_size, k + 1))
    picked = rng.random((batch_size, k)) < 0.5
    rows, cols = np.nonzero(picked)
    apply_row_edges(rng, target, draft, draft_ids, rows, cols, edges)
    if "extreme_uniforms" in edges:
        choice = rng.integers(0, 3, uniforms.shape)
        uniforms = np.where(choice == 0, 0.0, np.where(choice == 1, LARGEST_BELOW_ONE, uniforms))
    target = target.astype(dtype)
    draft = draft.astype(dtype)
    if "p_equals_q" in edges:
        draft[rows, cols] = target[rows, cols]
    return (
        target,
        rng.integers(0, vocab_size, (batch_size, 1)).astype(id_dtype),
        draft if with_draft_probs else None,
        draft_ids.astype(id_dtype),
        uniforms,
    )


# --------------------------------------------------------------------------------------
# Kernel == reference on explicit uniforms
# --------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(rejection_cases())
def test_kernel_matches_reference(case):
    assert_matches_reference(*case)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_matches_reference_at_every_cdf_boundary(dtype):
    """v placed exactly on (and one ulp around) each CDF boundary of the residual."""
    rng = np.random.default_rng(11)
    vocab_size, k = 37, 1
    for _ in range(10):
        target = random_rows(rng, (1, k + 1, vocab_size)).astype(dtype)
        draft = random_rows(rng, (1, k, vocab_size)).astype(dtype)
        weights = residual_weights(target[0, 0].astype(np.float64), draft[0, 0].astype(np.float64))
        total = math.fsum(weights.tolist())
        values = []
        for y in range(vocab_size):
            v = math.fsum(weights[: y + 1].tolist()) / total
            values += [v, float(np.nextafter(v, 0.0)), float(np.nextafter(v, 1.0))]
        values = np.clip(np.array(values), 0.0, LARGEST_BELOW_ONE)
        batch = values.size
        # p(x) = 0 at the draft token forces the rejection of position 0.
        draft_ids = np.full((batch, k), int(np.argmin(target[0, 0])), dtype=np.int64)
        uniforms = np.column_stack([np.full(batch, 0.5), values])
        assert_matches_reference(
            np.repeat(target, batch, 0),
            np.zeros((batch, 1), dtype=np.int64),
            np.repeat(draft, batch, 0),
            draft_ids,
            uniforms,
        )


@pytest.mark.parametrize(
    "vocab_size",
    [2047, 2048, 2049, 6000, pytest.param(2048 * 512 + 9, marks=pytest.mark.slow)],
)
def test_kernel_matches_reference_on_large_vocabularies(vocab_size):
    """The blocked two-pass inverse CDF (block sums, then one block scanned) against the
    reference's plain cumulative sum, with v on and next to block and token boundaries."""
    rng = np.random.default_rng(vocab_size)
    target = random_rows(rng, (1, 2, vocab_size), sparsity=0.5).astype(np.float32)
    draft = random_rows(rng, (1, 1, vocab_size), sparsity=0.5).astype(np.float32)
    weights = residual_weights(target[0, 0].astype(np.float64), draft[0, 0].astype(np.float64))
    cdf = np.cumsum(weights) / weights.sum()
    block_ends = np.arange(0, vocab_size, 2048)[1:] - 1
    if block_ends.size > 4:
        block_ends = rng.choice(block_ends, 4, replace=False)
    picks = np.r_[block_ends, rng.integers(0, vocab_size, 3)]
    values = [0.0, LARGEST_BELOW_ONE]
    for y in picks:
        values += [cdf[y], np.nextafter(cdf[y], 0.0), np.nextafter(cdf[y], 1.0)]
    values = np.clip(np.array(values, dtype=np.float64), 0.0, LARGEST_BELOW_ONE)
    # p(x) = 0 at the draft token: position 0 is always rejected and the residual drawn.
    draft_id = np.array([[int(np.flatnonzero(target[0, 0] == 0)[0])]])
    chunk = max(1, 2**17 // vocab_size)
    for start in range(0, values.size, chunk):
        v = values[start : start + chunk]
        batch = v.size
        assert_matches_reference(
            np.repeat(target, batch, 0),
            np.zeros((batch, 1), np.int64),
            np.repeat(draft, batch, 0),
            np.repeat(draft_id, batch, 0),
            np.column_stack([np.full(batch, 0.5), v]),
        )


@pytest.mark.parametrize("point_mass", [False, True])
def test_kernel_matches_reference_on_the_threaded_path(point_mass, threaded):
    """The OpenMP row loop (forced by the ``threaded`` fixture)."""
    rng = np.random.default_rng(17)
    batch_size, k, vocab_size = 400, 4, 64
    target = random_rows(rng, (batch_size, k + 1, vocab_size)).astype(np.float32)
    draft = random_rows(rng, (batch_size, k, vocab_size)).astype(np.float32)
    draft_ids = rng.integers(0, vocab_size, (batch_size, k))
    uniforms = rng.random((batch_size, k + 1))
    uniforms[:, :k] *= 0.3  # accept often, so that late positions are reached
    assert_matches_reference(
        target,
        rng.integers(0, vocab_size, (batch_size, 1)),
        None if point_mass else draft,
        draft_ids,
        uniforms,
    )


def test_boundary_helper_can_fail():
    weights = np.array([0.1, 0.2, 0.0, 0.7])
    assert_draw_consistent(0, 1, weights, 0.1 / 1.0)  # exactly on the boundary C_0
    assert_draw_consistent(1, 3, weights, 0.3)  # token 2 has no weight: one boundary
    with pytest.raises(AssertionError, match="not within"):
        assert_draw_consistent(0, 1, weights, 0.05)
    with pytest.raises(AssertionError, match="not within"):
        assert_draw_consistent(0, 3, weights, 0.1)  # token 1 lies between with mass 0.2
    with pytest.raises(AssertionError, match="weight 0"):
        assert_draw_consistent(2, 2, weights, 0.3)


def test_edge_cases_explicitly():
    """p(x) = 0 never accepted, q(x) = 0 < p(x) always, p == q all, residual 0 -> p."""
    target = np.array([[[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]])
    for u in (0.0, 0.5, LARGEST_BELOW_ONE):
        draft = np.array([[[0.5, 0.5, 0.0, 0.0]]])
        uniforms = np.array([[u, 0.3]])
        never = specdec_np.rejection_sample(
            target, np.array([[3]]), draft, np.array([[0]]), uniforms=uniforms
        )
        assert never.accepted_lengths[0] == 0 and never.num_accepted[0] == 0
        assert target[0, 0, never.output_token_ids[0, 0]] > 0
        always = specdec_np.rejection_sample(
            target, np.array([[3]]), draft, np.array([[2]]), uniforms=uniforms
        )
        np.testing.assert_array_equal(always.output_token_ids, [[2, 3]])
        same = specdec_np.rejection_sample(
            target, np.array([[3]]), target[:, :1].copy(), np.array([[1]]), uniforms=uniforms
        )
        np.testing.assert_array_equal(same.output_token_ids, [[1, 3]])
    # q = 2p >= p: rejected when u >= 1/2; the residual is empty, so the draw comes from p
    # and never from a token with p = 0.
    draft = 2.0 * target[:, :1]
    for v in np.linspace(0.0, LARGEST_BELOW_ONE, 33):
        result = specdec_np.rejection_sample(
            target, np.array([[3]]), draft, np.array([[1]]), uniforms=np.array([[0.75, v]])
        )
        assert result.accepted_lengths[0] == 0
        assert result.output_token_ids[0, 0] == (1 if v < 0.5 else 2)


def test_p_equals_q_accepts_everything_without_nan():
    rng = np.random.default_rng(3)
    batch_size, k, vocab_size = 50, 4, 16
    target = random_rows(rng, (batch_size, k + 1, vocab_size)).astype(np.float32)
    draft = target[:, :k].copy()
    draft_ids = np.stack(
        [
            [_monte_carlo.draw_from(draft[b, i], 1, rng)[0] for i in range(k)]
            for b in range(batch_size)
        ]
    )
    uniforms = rng.random((batch_size, k + 1))
    uniforms[::2, :k] = LARGEST_BELOW_ONE
    bonus = rng.integers(0, vocab_size, (batch_size, 1))
    result = specdec_np.rejection_sample(target, bonus, draft, draft_ids, uniforms=uniforms)
    np.testing.assert_array_equal(result.accepted_lengths, k)
    np.testing.assert_array_equal(result.output_token_ids, np.hstack([draft_ids, bonus]))


@settings(max_examples=100, deadline=None)
@given(rejection_cases())
def test_point_mass_equals_one_hot(case):
    target, bonus, _, draft_ids, uniforms = case
    batch_size, k = draft_ids.shape
    one_hot = np.zeros((batch_size, k, target.shape[2]), dtype=target.dtype)
    np.put_along_axis(one_hot, draft_ids[:, :, None].astype(np.int64), 1.0, axis=2)
    try:
        point = specdec_np.rejection_sample(target, bonus, None, draft_ids, uniforms=uniforms)
    except ValueError:
        with pytest.raises(ValueError):
            specdec_np.rejection_sample(target, bonus, one_hot, draft_ids, uniforms=uniforms)
        return
    dense = specdec_np.rejection_sample(target, bonus, one_hot, draft_ids, uniforms=uniforms)
    for got, expected in zip(point, dense):
        np.testing.assert_array_equal(got, expected)


@settings(max_examples=40, deadline=None)
@given(rejection_cases())
def test_reference_on_array_api_strict_equals_numpy(case):
    target, bonus, draft, draft_ids, uniforms = case
    try:
        expected = _reference.rejection_sample(target, bonus, draft, draft_ids, uniforms)
    except ValueError:
        with pytest.raises(ValueError):
            _reference.rejection_sample(
                xps.asarray(target),
                xps.asarray(bonus),
                None if draft is None else xps.asarray(draft),
                xps.asarray(draft_ids),
                xps.asarray(uniforms),
            )
        return
    strict = _reference.rejection_sample(
        xps.asarray(target),
        xps.asarray(bonus),
        None if draft is None else xps.asarray(draft),
        xps.asarray(draft_ids),
        xps.asarray(uniforms),
    )
    for got, want in zip(strict, expected):
        assert isinstance(got, type(xps.asarray(0)))
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# --------------------------------------------------------------------------------------
# Negative controls: broken samplers, NumPy, vectorised
# --------------------------------------------------------------------------------------


def _acceptance(target, draft_probs, draft_ids, uniforms):
    k = draft_ids.shape[1]
    ids = draft_ids[:, :, None].astype(np.int64)
    p_x = np.take_along_axis(target[:, :k], ids, 2)[..., 0].astype(np.float64)
    if draft_probs is None:
        q_x = np.ones_like(p_x)
    else:
        q_x = np.take_along_axis(draft_probs, ids, 2)[..., 0].astype(np.float64)
    return uniforms[:, :k] * q_x < p_x


def _inverse_cdf(weights, v):
    cdf = np.cumsum(weights, axis=1)
    tokens = (cdf <= (v * cdf[:, -1])[:, None]).sum(axis=1)
    return np.minimum(tokens, weights.shape[1] - 1)


def _finish(accepted, recovered, draft_ids, bonus):
    batch_size, k = draft_ids.shape
    r = np.where(accepted.all(axis=1), k, np.argmin(accepted, axis=1))
    positions = np.arange(k + 1)[None, :]
    padded = np.hstack([draft_ids.astype(np.int64), np.zeros((batch_size, 1), np.int64)])
    last = np.where(r == k, bonus[:, 0], recovered)
    return np.where(
        positions < r[:, None], padded, np.where(positions == r[:, None], last[:, None], -1)
    )


def _residual_sampler(row_offset=0, reuse_uniform=False):
    """A rejection sampler whose residual may read the wrong target row (``row_offset``)
    or reuse the acceptance uniform of the rejected position (``reuse_uniform``)."""

    def sampler(target, bonus, draft_probs, draft_ids, uniforms):
        batch_size, k = draft_ids.shape
        accepted = _acceptance(target, draft_probs, draft_ids, uniforms)
        r = np.where(accepted.all(axis=1), k, np.argmin(accepted, axis=1))
        at = np.minimum(r, k - 1)
        rows = np.arange(batch_size)
        p_row = target[rows, at + row_offset].astype(np.float64)
        if draft_probs is None:
            q_row = np.zeros_like(p_row)
            q_row[rows, draft_ids[rows, at]] = 1.0
        else:
            q_row = draft_probs[rows, at].astype(np.float64)
        weights = np.maximum(p_row - q_row, 0.0)
        empty = weights.sum(axis=1) == 0
        weights[empty] = p_row[empty]
        v = uniforms[rows, at] if reuse_uniform else uniforms[:, k]
        return _finish(accepted, _inverse_cdf(weights, v), draft_ids, bonus)

    return sampler


def always_accept(target, bonus, draft_probs, draft_ids, uniforms):
    return np.hstack([draft_ids.astype(np.int64), bonus.astype(np.int64)])


def reference_sampler(target, bonus, draft_probs, draft_ids, uniforms):
    return np.asarray(
        _reference.rejection_sample(target, bonus, draft_probs, draft_ids, uniforms)[0]
    )


BROKEN = {
    "always_accept": always_accept,
    "reused_uniform": _residual_sampler(reuse_uniform=True),
    "residual_from_next_row": _residual_sampler(row_offset=1),
}
CORRECT = {
    "numpy_correct_control": _residual_sampler(),
    "reference": reference_sampler,
    "kernel": _monte_carlo.kernel_sampler(),
}

MC_ROWS = 200_000


# --------------------------------------------------------------------------------------
# Exact oracle
# --------------------------------------------------------------------------------------


@st.composite
def small_distributions(draw, vocab_size):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    return random_rows(rng, (vocab_size,), sparsity=draw(st.sampled_from([0.0, 0.3, 0.6])))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_oracle_equals_target(data):
    vocab_size = data.draw(st.integers(3, 6))
    p = data.draw(small_distributions(vocab_size))
    q = data.draw(st.one_of(small_distributions(vocab_size), st.integers(0, vocab_size - 1)))
    np.testing.assert_allclose(_oracles.exact_first_token_distribution(p, q), p, rtol=0, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_joint_oracle_k2(data):
    vocab_size = data.draw(st.integers(3, 6))
    p0, p1 = (data.draw(small_distributions(vocab_size)) for _ in range(2))
    q = [
        data.draw(st.one_of(small_distributions(vocab_size), st.integers(0, vocab_size - 1)))
        for _ in range(2)
    ]
    joint = _oracles.exact_first_two_tokens_distribution(np.stack([p0, p1]), q)
    assert joint.shape == (vocab_size, vocab_size + 1)
    np.testing.assert_allclose(joint.sum(axis=1), p0, rtol=0, atol=1e-9)
    q0 = np.eye(vocab_size)[q[0]] if isinstance(q[0], int) else q[0]
    accepted = joint[:, :vocab_size].sum(axis=1)
    np.testing.assert_allclose(accepted.sum(), np.minimum(p0, q0).sum(), rtol=0, atol=1e-12)
    for a in np.flatnonzero(accepted > 0):
        np.testing.assert_allclose(joint[a, :vocab_size] / accepted[a], p1, rtol=0, atol=1e-9)


def test_oracle_fixed_edge_cases():
    for _, p, q in ORACLE_CASES:
        np.testing.assert_allclose(_oracles.exact_first_token_distribution(p, q), p, atol=1e-9)
    np.testing.assert_array_equal(
        _oracles.acceptance_probabilities([0, 0.5, 0.2, 0], [0.5, 0, 0.4, 0]), [0, 1, 0.5, 0]
    )
    np.testing.assert_array_equal(
        _oracles.residual_distribution([0.5, 0.5], [0.5, 0.5]), [0.5, 0.5]
    )


GRID_CASES = {
    "overlap": (np.array([[0.1, 0.2, 0.3, 0.4], [0.25] * 4]), np.array([[0.4, 0.3, 0.2, 0.1]])),
    "zeros": (
        np.array([[0.0, 0.5, 0.1, 0.4, 0.0], [0.2] * 5]),
        np.array([[0.3, 0.0, 0.3, 0.2, 0.2]]),
    ),
    "point_mass": (np.array([[0.15, 0.35, 0.5], [0.3, 0.3, 0.4]]), np.array([[0.0, 1.0, 0.0]])),
    "p_equals_q": (np.array([[0.3, 0.3, 0.4], [0.3, 0.3, 0.4]]), np.array([[0.3, 0.3, 0.4]])),
}
GRID_STRATA = 256


def grid_distribution(sampler, p, q, num_strata=GRID_STRATA):
    batch = _oracles.stratified_rejection_batch(p, q, num_strata)
    output = sampler(
        batch.target_with_bonus_probs,
        batch.bonus_token_ids,
        batch.draft_probs,
        batch.draft_token_ids,
        batch.uniforms,
    )
    return _oracles.grid_output_distribution(output, batch.weights, p.shape[1])


@pytest.mark.parametrize(
    ("case", "point_mass_call"), [(case, False) for case in GRID_CASES] + [("point_mass", True)]
)
def test_kernel_on_grid_reproduces_oracle(case, point_mass_call):
    p, q = GRID_CASES[case]
    oracle = _oracles.exact_first_token_distribution(p[0], q[0])
    np.testing.assert_allclose(oracle, p[0], atol=1e-9)
    grid = grid_distribution(_monte_carlo.kernel_sampler(point_mass=point_mass_call), p, q)
    assert np.max(np.abs(grid - oracle)) <= _oracles.grid_error_bound(GRID_STRATA, 1)


def test_kernel_on_grid_reproduces_joint_oracle_k2():
    p = np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [1 / 3] * 3])
    q = np.array([[0.5, 0.2, 0.3], [0.0, 0.5, 0.5]])
    num_strata = 48
    batch = _oracles.stratified_rejection_batch(p, q, num_strata)
    output = _monte_carlo.kernel_sampler()(
        batch.target_with_bonus_probs,
        batch.bonus_token_ids,
        batch.draft_probs,
        batch.draft_token_ids,
        batch.uniforms,
    )
    grid = _oracles.grid_output_distribution(output, batch.weights, 3, num_outputs=2)
    oracle = _oracles.exact_first_two_tokens_distribution(p, q)
    assert np.max(np.abs(grid - oracle)) <= _oracles.grid_error_bound(num_strata, 2)


@pytest.mark.parametrize("name", BROKEN)
def test_grid_check_rejects_broken_samplers(name):
    # Position 1 differs from position 0, so a residual read from the next row shows.
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]])
    q = np.array([[0.4, 0.3, 0.2, 0.1]])
    deviation = np.max(np.abs(grid_distribution(BROKEN[name], p, q) - p[0]))
    assert deviation > _oracles.grid_error_bound(GRID_STRATA, 1) + 1e-3, deviation
    correct = np.max(np.abs(grid_distribution(CORRECT["numpy_correct_control"], p, q) - p[0]))
    assert correct <= _oracles.grid_error_bound(GRID_STRATA, 1)


# --------------------------------------------------------------------------------------
# Monte-Carlo chi-square (fixed seeds, 2e5 rows)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CORRECT)
def test_monte_carlo_accepts_correct_samplers(name):
    report = _monte_carlo.monte_carlo_rejection(
        CORRECT[name], MC_P, MC_Q, MC_ROWS, np.random.default_rng(2024)
    )
    assert report.format_ok
    assert report.first_p_value > 1e-4, report
    assert report.second_p_value > 1e-4, report
    assert abs(report.acceptance_z) <= 5.0, report
    assert report.passed()


@pytest.mark.parametrize("name", BROKEN)
def test_monte_carlo_rejects_broken_samplers(name):
    report = _monte_carlo.monte_carlo_rejection(
        BROKEN[name], MC_P, MC_Q, MC_ROWS, np.random.default_rng(2024)
    )
    assert report.first_p_value < 1e-12, report
    assert not report.passed()


def test_monte_carlo_kernel_float32_and_generator_path():
    p32, q32 = MC_P.astype(np.float32), MC_Q.astype(np.float32)

    def generator_sampler(target, bonus, draft_probs, draft_ids, uniforms):
        return specdec_np.rejection_sample(
            target, bonus, draft_probs, draft_ids, generator=np.random.default_rng(99)
        ).output_token_ids

    report = _monte_carlo.monte_carlo_rejection(
        generator_sampler, p32, q32, MC_ROWS, np.random.default_rng(7), dtype=np.float32
    )
    assert report.passed(), report


def test_monte_carlo_point_mass_drafts():
    report = _monte_carlo.monte_carlo_rejection(
        _monte_carlo.kernel_sampler(point_mass=True),
        MC_P,
        [4, 0],
        MC_ROWS,
        np.random.default_rng(5),
    )
    assert report.expected_acceptance_rate == pytest.approx(0.25)
    assert report.passed(), report


def test_rejection_at_position_zero_leaves_second_output_empty():
    rng = np.random.default_rng(8)
    batch = _oracles.stratified_rejection_batch(MC_P, MC_Q, 8)
    result = specdec_np.rejection_sample(
        batch.target_with_bonus_probs,
        batch.bonus_token_ids,
        batch.draft_probs,
        batch.draft_token_ids,
        uniforms=rng.random(batch.uniforms.shape),
    )
    rejected = result.accepted_lengths == 0
    assert rejected.any() and (~rejected).any()
    np.testing.assert_array_equal(result.output_token_ids[rejected, 1:], -1)
    np.testing.assert_array_equal(
        result.output_token_ids[~rejected, 0], batch.draft_token_ids[~rejected, 0]
    )


# --------------------------------------------------------------------------------------
# Counters
# --------------------------------------------------------------------------------------


def test_counters_count_passes_after_first_rejection():
    target = np.array(
        [
            [[0.1, 0.9], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]],
            [[0.9, 0.1], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]],
        ],
        dtype=np.float32,
    )
    draft_ids = np.array([[0, 1, 1], [0, 1, 0]])
    bonus = np.array([[1], [0]])
    # Row 0: position 0 rejected (0.99 >= 0.1), positions 1 and 2 pass: r = 0, 2 passes.
    # Row 1: positions 0, 1 pass, position 2 rejected: r = 2, 2 passes.
    uniforms = np.array([[0.99, 0.0, 0.0, 0.5], [0.0, 0.1, 0.7, 0.5]])
    sampler = specdec_np.RejectionSampler()
    output = sampler(target, bonus, None, draft_ids, uniforms=uniforms)
    assert output.shape == (2, 4)
    np.testing.assert_array_equal(output[0, 1:], -1)
    np.testing.assert_array_equal(output[1, :2], [0, 1])
    assert (
        sampler.num_accepted_tokens.shape == () and sampler.num_accepted_tokens.dtype == np.int64
    )
    assert int(sampler.num_accepted_tokens) == 4
    assert int(sampler.num_emitted_tokens) == 1 + 3
    assert sampler.num_draft_tokens == 6
    sampler(target, bonus, None, draft_ids, uniforms=uniforms)
    assert (int(sampler.num_accepted_tokens), int(sampler.num_emitted_tokens)) == (8, 8)
    assert sampler.num_draft_tokens == 12


@settings(max_examples=40, deadline=None)
@given(rejection_cases())
def test_counters_match_reference(case):
    target, bonus, draft, draft_ids, uniforms = case
    try:
        _, lengths, passes = _reference.rejection_sample(target, bonus, draft, draft_ids, uniforms)
    except ValueError:
        return
    sampler = specdec_np.RejectionSampler()
    sampler.init_tensors("cpu")
    sampler(target, bonus, draft, draft_ids, uniforms=uniforms)
    assert int(sampler.num_accepted_tokens) == int(np.sum(passes))
    assert int(sampler.num_emitted_tokens) == int(np.sum(lengths + 1))
    assert sampler.num_draft_tokens == draft_ids.size


def test_empty_batch_leaves_counters_alone():
    rng = np.random.default_rng(1)
    k, vocab_size = 3, 5
    sampler = specdec_np.RejectionSampler(seed=0)
    target = random_rows(rng, (2, k + 1, vocab_size))
    sampler(target, np.zeros((2, 1), np.int64), None, np.zeros((2, k), np.int64))
    before = (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    )
    empty = sampler(
        np.zeros((0, k + 1, vocab_size), np.float32),
        np.zeros((0, 1), np.int64),
        np.zeros((0, k, vocab_size), np.float32),
        np.zeros((0, k), np.int64),
    )
    assert empty.shape == (0, k + 1) and empty.dtype == np.int64
    after = (
        int(sampler.num_accepted_tokens),
        int(sampler.num_emitted_tokens),
        sampler.num_draft_tokens,
    )
    assert after == before
    result = specdec_np.rejection_sample(
        np.zeros((0, k + 1, vocab_size)),
        np.zeros((0, 1), np.int64),
        None,
        np.zeros((0, k), np.int64),
    )
    assert result.output_token_ids.shape == (0, k + 1)
    assert result.accepted_lengths.shape == result.num_accepted.shape == (0,)
