"""The exact oracles: first-token and chain laws, stratified and threshold grids.

The checks that ``specdec-np check`` ran on the oracles themselves before it became the kit
over the registry live here: the oracles equal the target on fixed and random cases, block
verification's law is lossless and never accepts fewer drafts than token-wise rejection,
and a first-failure stop is caught.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from draw_checks import BLOCK_CASES, ORACLE_CASES

import specdec_np
from specdec_np import registry
from specdec_np.testing import _monte_carlo, _oracles


def test_oracle_is_computed_from_the_algorithm_not_the_target():
    # With an (unnormalised) target the algorithm's output is not p: the oracle must say so.
    p = np.array([0.2, 0.2, 0.2])
    q = np.array([0.5, 0.25, 0.25])
    result = _oracles.exact_first_token_distribution(p, q)
    assert result.sum() == pytest.approx(1.0)
    assert not np.allclose(result, p)
    # Point mass given as an int equals the one-hot row.
    p = np.array([0.3, 0.3, 0.4])
    np.testing.assert_array_equal(
        _oracles.exact_first_token_distribution(p, 1),
        _oracles.exact_first_token_distribution(p, [0.0, 1.0, 0.0]),
    )
    with pytest.raises(ValueError):
        _oracles.exact_first_token_distribution(p, 3)
    with pytest.raises(ValueError):
        _oracles.exact_first_token_distribution(p, [0.0, 0.0, 0.0])


def test_stratified_grid_shape_and_weights():
    grid = _oracles.stratified_uniform_grid(4, 2)
    assert grid.shape == (16, 2)
    np.testing.assert_array_equal(np.unique(grid[:, 0]), [0.125, 0.375, 0.625, 0.875])
    batch = _oracles.stratified_rejection_batch(
        np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]), np.array([[0.0, 0.25, 0.75]]), 8
    )
    assert batch.uniforms.shape == (2 * 64, 2)
    assert set(batch.draft_token_ids[:, 0]) == {1, 2}
    assert math.fsum(batch.weights) == pytest.approx(1.0, abs=1e-15)
    assert _oracles.grid_error_bound(8, 1) == pytest.approx(2 / 8)
    with pytest.raises(ValueError):
        _oracles.grid_error_bound(8, 3)


def test_exact_oracle_equals_the_target():
    """Fixed and random cases, k = 1 and the k = 2 marginal (the first check of the old
    ``run_checks``)."""
    worst = 0.0
    for _, p, q in ORACLE_CASES:
        worst = max(
            worst, float(np.max(np.abs(_oracles.exact_first_token_distribution(p, q) - p)))
        )
    rng = np.random.default_rng(20240501)
    for _ in range(20):
        vocab_size = int(rng.integers(2, 7))
        p = rng.dirichlet(np.ones(vocab_size)) * (rng.random(vocab_size) < 0.8)
        p = p / p.sum() if p.sum() > 0 else np.full(vocab_size, 1.0 / vocab_size)
        q = rng.dirichlet(np.ones(vocab_size))
        worst = max(
            worst, float(np.max(np.abs(_oracles.exact_first_token_distribution(p, q) - p)))
        )
        joint = _oracles.exact_first_two_tokens_distribution(
            np.stack([p, rng.dirichlet(np.ones(vocab_size))]), [q, int(rng.integers(vocab_size))]
        )
        worst = max(worst, float(np.max(np.abs(joint.sum(axis=1) - p))))
    assert worst <= 1e-9


def test_exact_joint_of_the_first_two_outputs():
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.1, 0.4], [0.25] * 4])
    q = np.array([[0.3, 0.3, 0.2, 0.2], [0.1, 0.6, 0.2, 0.1]])
    joint = _oracles.exact_first_two_tokens_distribution(p, q)
    worst = float(np.max(np.abs(joint.sum(axis=1) - p[0])))
    accepted = joint[:, :-1].sum(axis=1)
    for a in np.flatnonzero(accepted > 0):
        worst = max(worst, float(np.max(np.abs(joint[a, :-1] / accepted[a] - p[1]))))
    assert worst <= 1e-9
    assert abs(accepted.sum() - np.minimum(p[0], q[0]).sum()) <= 1e-12
    assert accepted.sum() == pytest.approx(_oracles.acceptance_rate(p[0], q[0]), abs=1e-15)


def test_block_law_equals_the_target_and_beats_token_wise_rejection():
    worst = 0.0
    smallest_gain = math.inf
    largest_gain = -math.inf
    control = 0.0
    for _, p, q in BLOCK_CASES:
        block = _oracles.block_verification_law(p, q)
        target = _oracles.target_chain_law(p)
        worst = max(worst, float(np.max(np.abs(block.law - target))))
        gain = (
            block.expected_accepted_length - _oracles.rejection_law(p, q).expected_accepted_length
        )
        smallest_gain, largest_gain = min(smallest_gain, gain), max(largest_gain, gain)
        first_failure = _oracles.block_first_failure_law(p, q).law
        control = max(control, float(np.max(np.abs(first_failure - target))))
    assert worst <= 1e-9
    # Never fewer accepted drafts in expectation than token-wise rejection, more somewhere.
    assert smallest_gain >= -1e-12 and largest_gain > 1e-3
    # The same exact check catches the classic first-failure stop.
    assert control > 1e-3


def test_acceptance_rate():
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.25, 0.5])
    assert _oracles.acceptance_rate(p, q) == 0.5
    assert _oracles.acceptance_rate(p, [0.0, 1.0, 0.0]) == 0.5  # a point mass: p(x)
    assert _oracles.acceptance_rate(p, p) == 1.0


def test_oracle_for_follows_the_registry():
    for verifier in registry.VERIFIERS:
        oracle = _oracles.oracle_for(verifier)
        if verifier.oracle_name is None:
            assert oracle is None and not verifier.lossless
        else:
            assert oracle is getattr(_oracles, verifier.oracle_name)
    p, q = BLOCK_CASES[0][1], BLOCK_CASES[0][2]
    law = _oracles.oracle_for(registry.get("block"))(p, q)
    assert isinstance(law, _oracles.ChainLaw)
    np.testing.assert_allclose(law.law, _oracles.target_chain_law(p), atol=1e-12)


def test_emitted_prefix_rows():
    output = np.array([[3, -1, -1], [1, 2, 0], [-1, 2, -1], [1, -1, 2], [4, -1, -1], [0, -2, -1]])
    np.testing.assert_array_equal(
        _oracles.emitted_prefix_rows(output, 4), [True, True, False, False, False, False]
    )
    p = np.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="emitted tokens"):
        _oracles.grid_chain_law(output, np.ones(6), p)


@pytest.mark.parametrize("verifier", registry.names(lossless=True))
def test_threshold_batch_is_exact_for_the_reference(verifier):
    """The midpoint rule on the threshold cells gives the oracle's law to rounding, for
    either lossless algorithm, and the weights are a probability."""
    p = np.array([[0.25, 0.5, 0.25], [0.125, 0.375, 0.5], [0.25, 0.375, 0.375]])
    q = np.array([[0.5, 0.25, 0.25], [0.0, 0.5, 0.5]])
    batch = _oracles.threshold_batch(p, q, refine=8)
    n = batch.draft_token_ids.shape[0]
    assert batch.uniforms.shape == (n, 3) and batch.weights.shape == (n,)
    assert math.fsum(batch.weights) == pytest.approx(1.0, abs=1e-12)
    assert np.all((batch.uniforms > 0) & (batch.uniforms < 1))
    assert set(batch.draft_token_ids[:, 1]) == {1, 2}  # the support of q_1 only
    function = _monte_carlo.kernel_sampler(
        verifier=getattr(specdec_np, registry.get(verifier).function_name)
    )
    output = function(
        np.broadcast_to(p, (n, 3, 3)),
        np.zeros((n, 1), dtype=np.int64),
        np.broadcast_to(q, (n, 2, 3)),
        batch.draft_token_ids,
        batch.uniforms,
    )
    law = _oracles.grid_chain_law(output, batch.weights, p)
    exact = _oracles.oracle_for(registry.get(verifier))(p, q).law
    np.testing.assert_allclose(law, exact, rtol=0, atol=1e-12)
