"""The statistics of the conformance checks: chi-square machinery and sigma rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specdec_np.testing import _statistics


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
    assert _statistics.chi_square_p_value(statistic, dof) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize("x", [1e-8, 0.01, 0.5, 1.0, 2.0, 7.5, 30.0, 200.0, 700.0])
def test_regularized_upper_gamma_closed_forms(x):
    # Q(1, x) = exp(-x); Q(1/2, x) = erfc(sqrt(x)); Q(2, x) = (1 + x) exp(-x).
    assert _statistics.regularized_upper_gamma(1.0, x) == pytest.approx(math.exp(-x), rel=1e-12)
    assert _statistics.regularized_upper_gamma(0.5, x) == pytest.approx(
        math.erfc(math.sqrt(x)), rel=1e-10, abs=1e-300
    )
    assert _statistics.regularized_upper_gamma(2.0, x) == pytest.approx(
        (1 + x) * math.exp(-x), rel=1e-12
    )


def test_chi_square_p_value_edges():
    assert _statistics.chi_square_p_value(0.0, 5) == 1.0
    assert _statistics.chi_square_p_value(math.inf, 5) == 0.0
    assert _statistics.chi_square_p_value(3.0, 0) == 1.0
    assert (
        _statistics.chi_square_p_value(1e4, 7) < 1e-300
        or _statistics.chi_square_p_value(1e4, 7) == 0.0
    )
    with pytest.raises(ValueError):
        _statistics.chi_square_p_value(1.0, -1)
    with pytest.raises(ValueError):
        _statistics.regularized_upper_gamma(0.0, 1.0)
    # Monotone in the statistic.
    values = [_statistics.chi_square_p_value(s, 6) for s in np.linspace(0.1, 60, 200)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_chi_square_statistic_pearson_and_merging():
    statistic, dof = _statistics.chi_square_statistic([30, 20, 50], [0.25, 0.25, 0.5])
    assert dof == 2
    assert statistic == pytest.approx(25 / 25 + 25 / 25 + 0.0)
    # Expected counts 1, 1, 2 and 96: the three small bins merge into one of 4 < 5, which
    # then takes the big bin too: a single bin leaves nothing to test.
    assert _statistics.chi_square_statistic([1, 1, 2, 96], [0.01, 0.01, 0.02, 0.96]) == (0.0, 0)
    # Expected 2, 3, 45, 50: the two small bins merge into one bin of exactly 5.
    statistic, dof = _statistics.chi_square_statistic([4, 6, 40, 50], [0.02, 0.03, 0.45, 0.5])
    assert dof == 2
    assert statistic == pytest.approx((10 - 5) ** 2 / 5 + (40 - 45) ** 2 / 45)
    # Zero-probability bins are dropped when empty and make the statistic infinite if not.
    assert _statistics.chi_square_statistic([50, 0, 50], [0.5, 0.0, 0.5])[1] == 1
    statistic, _ = _statistics.chi_square_statistic([50, 1, 49], [0.5, 0.0, 0.5])
    assert statistic == math.inf
    with pytest.raises(ValueError):
        _statistics.chi_square_statistic([1, 2], [0.5, 0.25, 0.25])


def test_chi_square_detects_and_accepts():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.2, 0.3, 0.4])
    good = np.bincount(rng.choice(4, 100_000, p=p), minlength=4)
    bad = np.bincount(rng.choice(4, 100_000, p=[0.11, 0.2, 0.29, 0.4]), minlength=4)
    assert _statistics.chi_square_p_value(*_statistics.chi_square_statistic(good, p)) > 1e-3
    assert _statistics.chi_square_p_value(*_statistics.chi_square_statistic(bad, p)) < 1e-10


def test_chi_square_p_values_are_uniform_under_the_null():
    """Calibration: under the null hypothesis, P(p-value <= 0.05) is about 0.05."""
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(12))
    p_values = [
        _statistics.chi_square_p_value(
            *_statistics.chi_square_statistic(rng.multinomial(2000, p), p)
        )
        for _ in range(2000)
    ]
    assert abs(np.mean(np.array(p_values) <= 0.05) - 0.05) < 0.02
    assert abs(np.mean(p_values) - 0.5) < 0.03


def test_chi_square_test_is_the_p_value_of_the_statistic():
    counts, probs = [30, 20, 50], [0.25, 0.25, 0.5]
    assert _statistics.chi_square_test(counts, probs) == _statistics.chi_square_p_value(
        *_statistics.chi_square_statistic(counts, probs)
    )
    assert _statistics.chi_square_test([50, 1, 49], [0.5, 0.0, 0.5]) == 0.0


def test_binomial_z():
    # 0.55 observed against 0.5 over 400 trials: sigma = 0.025, two sigmas.
    assert _statistics.binomial_z(0.55, 0.5, 400) == pytest.approx(2.0)
    assert _statistics.binomial_z(0.45, 0.5, 400) == pytest.approx(-2.0)
    # No spread: exact is 0, anything else an infinity of the difference's sign.
    assert _statistics.binomial_z(1.0, 1.0, 10) == 0.0
    assert _statistics.binomial_z(0.9, 1.0, 10) == -math.inf
    assert _statistics.binomial_z(0.1, 0.0, 10) == math.inf


def test_mean_z():
    values = np.array([0.0, 2.0] * 50)  # mean 1, variance 1, standard error 0.1
    assert _statistics.mean_z(values, 0.8) == pytest.approx(2.0)
    assert _statistics.mean_z(values, 1.3) == pytest.approx(-3.0)
    assert _statistics.mean_z(np.full(10, 2.0), 2.0) == 0.0
    assert _statistics.mean_z(np.full(10, 2.0), 2.5) == -math.inf
    assert _statistics.mean_z(np.full(10, 2.0), 1.5) == math.inf


def test_sigma_rules_are_calibrated():
    """Under the null hypothesis |z| > 3 is rare (about 0.3 %) for both rules."""
    rng = np.random.default_rng(3)
    binomial = [
        _statistics.binomial_z(rng.binomial(500, 0.3) / 500, 0.3, 500) for _ in range(2000)
    ]
    means = [_statistics.mean_z(rng.exponential(size=500), 1.0) for _ in range(2000)]
    for zs in (binomial, means):
        assert abs(np.mean(zs)) < 0.1 and 0.9 < np.std(zs) < 1.1
        assert np.mean(np.abs(zs) > 3) < 0.01
