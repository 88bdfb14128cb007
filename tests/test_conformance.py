"""The conformance module: chi-square machinery, oracles, and ``run_checks``."""

from __future__ import annotations

import math

import numpy as np
import pytest

import specdec_np
from specdec_np import _conformance as conf
from specdec_np import _reference, registry, verify

BLOCK_KERNEL_CHECK = "block verification: chi-square of the kernel's chain"


def test_run_checks_all_pass_on_numpy():
    results = conf.run_checks()
    assert len(results) >= 8
    names = [r.name for r in results]
    assert len(set(names)) == len(names)
    assert BLOCK_KERNEL_CHECK in names
    for result in results:
        assert isinstance(result, conf.CheckResult)
        assert isinstance(result.passed, bool)
        assert result.passed, f"{result.name}: {result.detail}"
    # Every registered verifier has at least one row of its own.
    for name in registry.names():
        assert any(n.startswith(name) for n in names), name


def test_run_checks_rejects_unknown_backend():
    with pytest.raises(ValueError, match="backend"):
        conf.run_checks("tpu")


def test_run_checks_fails_for_a_lossy_rejection_sampler(monkeypatch):
    real = verify.rejection_sample

    def always_accept(target, bonus, draft_probs, draft_ids, **kwargs):
        result = real(target, bonus, draft_probs, draft_ids, **kwargs)
        k = draft_ids.shape[1]
        output = np.hstack([draft_ids.astype(np.int64), bonus.astype(np.int64)])
        batch = draft_ids.shape[0]
        return verify.VerificationResult(output, np.full(batch, k, np.int64), result.num_accepted)

    monkeypatch.setattr(verify, "rejection_sample", always_accept)
    failed = {r.name for r in conf.run_checks() if not r.passed}
    assert "rejection: chi-square of the first output" in failed
    assert "rejection: acceptance rate equals sum(min(p, q))" in failed
    assert "rejection: kernel on a stratified grid reproduces the oracle" in failed


def test_run_checks_fails_for_a_wrong_greedy_kernel(monkeypatch):
    real = verify.greedy_sample

    def off_by_one(*args, **kwargs):
        result = real(*args, **kwargs)
        return result._replace(num_accepted=result.num_accepted + 1)

    monkeypatch.setattr(verify, "greedy_sample", off_by_one)
    failed = {r.name for r in conf.run_checks() if not r.passed}
    assert failed == {"greedy: kernel equals reference"}


def _reference_block(first_failure=False):
    """The array-API reference as a kernel; ``first_failure`` stops at the first failed
    check instead of taking the largest passing position (the classic bug)."""

    def function(target, bonus, draft_probs, draft_ids, *, uniforms=None, generator=None):
        if uniforms is None:
            uniforms = generator.random((draft_ids.shape[0], draft_ids.shape[1] + 1))
        if not first_failure:
            outputs = _reference.block_verification_sample(
                target, bonus, draft_probs, draft_ids, uniforms
            )
            return verify.VerificationResult(*outputs)
        k = draft_ids.shape[1]
        residual, h = _reference._block_thresholds(np, target, draft_probs, draft_ids)
        failed = uniforms[:, :k] >= h
        tau = np.where(failed.any(axis=1), np.argmax(failed, axis=1), k)
        outputs = _reference._block_emit(
            np, target, bonus, draft_ids, residual, tau, uniforms[:, k]
        )
        return verify.VerificationResult(*outputs)

    return function


def test_run_checks_block_kernel_check_passes_and_fails(monkeypatch):
    monkeypatch.setattr(specdec_np, "block_verification_sample", _reference_block(), raising=False)
    results = {r.name: r for r in conf.run_checks()}
    assert results[BLOCK_KERNEL_CHECK].passed, results[BLOCK_KERNEL_CHECK].detail
    monkeypatch.setattr(specdec_np, "block_verification_sample", _reference_block(True))
    results = {r.name: r for r in conf.run_checks()}
    assert not results[BLOCK_KERNEL_CHECK].passed, results[BLOCK_KERNEL_CHECK].detail
    monkeypatch.delattr(specdec_np, "block_verification_sample")
    results = {r.name: r for r in conf.run_checks()}
    assert not results[BLOCK_KERNEL_CHECK].passed
    assert "missing" in results[BLOCK_KERNEL_CHECK].detail


def test_run_checks_reports_a_crash_as_a_failure(monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(verify, "typical_acceptance_sample", crash)
    results = conf.run_checks()
    crashed = [r for r in results if "boom" in r.detail]
    assert crashed and not any(r.passed for r in crashed)


# --------------------------------------------------------------------------------------
# Chi-square and the incomplete gamma function
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statistic", "dof", "expected"),
    [
        (3.841, 1, 0.05),
        (6.635, 1, 0.01),
        (5.991, 2, 0.05),
        (18.307, 10, 0.05),
        (23.209, 10, 0.01),
        (124.342, 100, 0.05),
        (9.342, 10, 0.5),
    ],
)
def test_chi_square_p_value_known_values(statistic, dof, expected):
    assert conf.chi_square_p_value(statistic, dof) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("x", [1e-8, 0.01, 0.5, 1.0, 2.0, 7.5, 30.0, 200.0, 700.0])
def test_regularized_upper_gamma_closed_forms(x):
    # Q(1, x) = exp(-x); Q(1/2, x) = erfc(sqrt(x)); Q(2, x) = (1 + x) exp(-x).
    assert conf.regularized_upper_gamma(1.0, x) == pytest.approx(math.exp(-x), rel=1e-12)
    assert conf.regularized_upper_gamma(0.5, x) == pytest.approx(
        math.erfc(math.sqrt(x)), rel=1e-10, abs=1e-300
    )
    assert conf.regularized_upper_gamma(2.0, x) == pytest.approx((1 + x) * math.exp(-x), rel=1e-12)


def test_chi_square_p_value_edges():
    assert conf.chi_square_p_value(0.0, 5) == 1.0
    assert conf.chi_square_p_value(math.inf, 5) == 0.0
    assert conf.chi_square_p_value(3.0, 0) == 1.0
    assert conf.chi_square_p_value(1e4, 7) < 1e-300 or conf.chi_square_p_value(1e4, 7) == 0.0
    with pytest.raises(ValueError):
        conf.chi_square_p_value(1.0, -1)
    with pytest.raises(ValueError):
        conf.regularized_upper_gamma(0.0, 1.0)
    # Monotone in the statistic.
    values = [conf.chi_square_p_value(s, 6) for s in np.linspace(0.1, 60, 200)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_chi_square_statistic_pearson_and_merging():
    statistic, dof = conf.chi_square_statistic([30, 20, 50], [0.25, 0.25, 0.5])
    assert dof == 2
    assert statistic == pytest.approx(25 / 25 + 25 / 25 + 0.0)
    # Expected counts 1, 1, 2 and 96: the three small bins merge into one of 4 < 5, which
    # then takes the big bin too: a single bin leaves nothing to test.
    assert conf.chi_square_statistic([1, 1, 2, 96], [0.01, 0.01, 0.02, 0.96]) == (0.0, 0)
    # Expected 2, 3, 45, 50: the two small bins merge into one bin of exactly 5.
    statistic, dof = conf.chi_square_statistic([4, 6, 40, 50], [0.02, 0.03, 0.45, 0.5])
    assert dof == 2
    assert statistic == pytest.approx((10 - 5) ** 2 / 5 + (40 - 45) ** 2 / 45)
    # Zero-probability bins are dropped when empty and make the statistic infinite if not.
    assert conf.chi_square_statistic([50, 0, 50], [0.5, 0.0, 0.5])[1] == 1
    statistic, _ = conf.chi_square_statistic([50, 1, 49], [0.5, 0.0, 0.5])
    assert statistic == math.inf
    with pytest.raises(ValueError):
        conf.chi_square_statistic([1, 2], [0.5, 0.25, 0.25])


def test_chi_square_detects_and_accepts():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    good = np.bincount(rng.choice(4, 100_000, p=p), minlength=4)
    bad = np.bincount(rng.choice(4, 100_000, p=[0.11, 0.2, 0.29, 0.4]), minlength=4)
    assert conf.chi_square_p_value(*conf.chi_square_statistic(good, p)) > 1e-3
    assert conf.chi_square_p_value(*conf.chi_square_statistic(bad, p)) < 1e-10


def test_chi_square_p_values_are_uniform_under_the_null():
    """Calibration: under the null hypothesis, P(p-value <= 0.05) is about 0.05."""
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(12))
    p_values = [
        conf.chi_square_p_value(*conf.chi_square_statistic(rng.multinomial(2000, p), p))
        for _ in range(2000)
    ]
    assert abs(np.mean(np.array(p_values) <= 0.05) - 0.05) < 0.02
    assert abs(np.mean(p_values) - 0.5) < 0.03


# --------------------------------------------------------------------------------------
# Oracles, grids, Monte Carlo helpers
# --------------------------------------------------------------------------------------


def test_oracle_is_computed_from_the_algorithm_not_the_target():
    # With an (unnormalised) target the algorithm's output is not p: the oracle must say so.
    p = np.array([0.2, 0.2, 0.2])
    q = np.array([0.5, 0.25, 0.25])
    result = conf.exact_first_token_distribution(p, q)
    assert result.sum() == pytest.approx(1.0)
    assert not np.allclose(result, p)
    # Point mass given as an int equals the one-hot row.
    p = np.array([0.3, 0.3, 0.4])
    np.testing.assert_array_equal(
        conf.exact_first_token_distribution(p, 1),
        conf.exact_first_token_distribution(p, [0.0, 1.0, 0.0]),
    )
    with pytest.raises(ValueError):
        conf.exact_first_token_distribution(p, 3)
    with pytest.raises(ValueError):
        conf.exact_first_token_distribution(p, [0.0, 0.0, 0.0])


def test_stratified_grid_shape_and_weights():
    grid = conf.stratified_uniform_grid(4, 2)
    assert grid.shape == (16, 2)
    np.testing.assert_array_equal(np.unique(grid[:, 0]), [0.125, 0.375, 0.625, 0.875])
    batch = conf.stratified_rejection_batch(
        np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]), np.array([[0.0, 0.25, 0.75]]), 8
    )
    assert batch.uniforms.shape == (2 * 64, 2)
    assert set(batch.draft_token_ids[:, 0]) == {1, 2}
    assert math.fsum(batch.weights) == pytest.approx(1.0, abs=1e-15)
    assert conf.grid_error_bound(8, 1) == pytest.approx(2 / 8)
    with pytest.raises(ValueError):
        conf.grid_error_bound(8, 3)


def test_draw_from_never_draws_zero_weight_tokens():
    rng = np.random.default_rng(4)
    q = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    tokens = conf.draw_from(q, 50_000, rng)
    assert set(np.unique(tokens)) == {1, 3}
    assert abs(np.mean(tokens == 3) - 0.7) < 0.01
