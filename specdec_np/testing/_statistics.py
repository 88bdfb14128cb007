"""The statistics of the conformance checks: chi-square tests and sigma rules, pure NumPy.

* :func:`chi_square_statistic` is Pearson's statistic with small bins merged, and
  :func:`chi_square_p_value` its upper tail, from the regularised upper incomplete gamma
  function :func:`regularized_upper_gamma` implemented here (the package needs no scipy);
  :func:`chi_square_test` is the two in one call.
* :func:`binomial_z` and :func:`mean_z` say how many standard errors an observed rate or
  mean lies from its exact expectation; the checks allow a few (5 in the kit and in
  ``specdec-np check``).

Used by the Monte-Carlo runs (:mod:`specdec_np.testing._monte_carlo`), the conformance kit
(:mod:`specdec_np.testing`) and the tests.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "binomial_z",
    "chi_square_p_value",
    "chi_square_statistic",
    "chi_square_test",
    "mean_z",
    "regularized_upper_gamma",
]

# Lentz's method replaces a zero denominator by this instead of dividing by zero.
_TINY = 1e-300
_EPS = 2.0**-52


def regularized_upper_gamma(a: float, x: float) -> float:
    """``Q(a, x) = Gamma(a, x) / Gamma(a)``, the regularised upper incomplete gamma function.

    Uses the power series of the lower function ``P = 1 - Q`` for ``x < a + 1`` and a
    continued fraction (evaluated by the modified Lentz method) for ``Q`` otherwise; both
    converge quickly in their regions and are accurate to a few ulps times the number of
    terms.

    Parameters
    ----------
    a : float
        Shape, ``a > 0``.
    x : float
        ``x >= 0``; ``+inf`` gives 0.

    Returns
    -------
    float
    """
    if not a > 0:
        raise ValueError(f"a must be positive; found {a}")
    if math.isnan(x) or x < 0:
        raise ValueError(f"x must be non-negative; found {x}")
    if x == 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    log_prefactor = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        # P(a, x) = x^a e^-x / Gamma(a) * sum_n x^n / (a (a+1) ... (a+n)).
        term = 1.0 / a
        total = term
        denominator = a
        for _ in range(10_000):
            denominator += 1.0
            term *= x / denominator
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefactor))
    # Q(a, x) = x^a e^-x / Gamma(a) * 1 / (x + 1 - a - 1 (1 - a) / (x + 3 - a - ...)).
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    fraction = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = d if abs(d) >= _TINY else _TINY
        c = b + an / c
        c = c if abs(c) >= _TINY else _TINY
        d = 1.0 / d
        delta = d * c
        fraction *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return min(1.0, math.exp(log_prefactor) * fraction)


def chi_square_p_value(statistic: float, dof: int) -> float:
    """Upper-tail probability of the chi-square distribution: ``Q(dof / 2, statistic / 2)``.

    Parameters
    ----------
    statistic : float
        Non-negative (``inf`` gives 0).
    dof : int
        Degrees of freedom; 0 (nothing was tested) gives 1.

    Returns
    -------
    float
    """
    if dof < 0:
        raise ValueError(f"dof must be non-negative; found {dof}")
    if math.isinf(statistic):
        return 0.0
    if dof == 0 or statistic <= 0:
        return 1.0
    return regularized_upper_gamma(dof / 2.0, statistic / 2.0)


def chi_square_statistic(counts: Any, probabilities: Any) -> tuple[float, int]:
    """Pearson's chi-square statistic of observed counts against probabilities.

    Bins whose expected count is below 5 are merged (smallest first) into one bin until
    it reaches 5; bins of probability zero must be empty: a count there makes the
    statistic infinite (the sampler emitted an impossible token).

    Parameters
    ----------
    counts : array_like, int [n]
    probabilities : array_like, float [n]
        Non-negative; normalised here.

    Returns
    -------
    statistic : float
    dof : int
        Number of bins after merging, minus one.
    """
    counts = np.asarray(counts, dtype=np.float64).reshape(-1)
    probs = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    if counts.shape != probs.shape:
        raise ValueError(f"counts {counts.shape} and probabilities {probs.shape} differ")
    if np.any(probs < 0) or not np.all(np.isfinite(probs)):
        raise ValueError("probabilities must be finite and non-negative")
    total_probability = math.fsum(probs.tolist())
    if not total_probability > 0:
        raise ValueError("probabilities have no positive mass")
    if np.any(counts[probs == 0] > 0):
        return math.inf, max(int(np.count_nonzero(probs)) - 1, 0)
    keep = probs > 0
    counts, expected = counts[keep], probs[keep] / total_probability * counts.sum()
    order = np.argsort(expected, kind="stable")
    expected, counts = expected[order], counts[order]
    merged = 0
    pooled = 0.0
    while merged < expected.size and (pooled < 5.0 or expected[merged] < 5.0):
        pooled += expected[merged]
        merged += 1
    if merged <= 1:
        bins_expected, bins_counts = expected, counts
    else:
        bins_expected = np.concatenate([[pooled], expected[merged:]])
        bins_counts = np.concatenate([[counts[:merged].sum()], counts[merged:]])
    if bins_expected.size < 2:
        return 0.0, 0
    statistic = math.fsum(((bins_counts - bins_expected) ** 2 / bins_expected).tolist())
    return statistic, int(bins_expected.size - 1)


def chi_square_test(counts: Any, probabilities: Any) -> float:
    """The p-value of Pearson's test of ``counts`` against ``probabilities``.

    Parameters
    ----------
    counts : array_like, int [n]
    probabilities : array_like, float [n]
        As for :func:`chi_square_statistic`.

    Returns
    -------
    float
        ``chi_square_p_value(*chi_square_statistic(counts, probabilities))``.
    """
    return chi_square_p_value(*chi_square_statistic(counts, probabilities))


def binomial_z(rate: float, expected: float, trials: int) -> float:
    """How many binomial standard errors an observed rate lies from its expectation.

    Parameters
    ----------
    rate : float
        Observed fraction of successes in ``trials`` trials.
    expected : float
        The exact success probability, in [0, 1].
    trials : int
        Positive.

    Returns
    -------
    float
        ``(rate - expected) / sqrt(expected * (1 - expected) / trials)``; where that
        standard error is 0 (``expected`` 0 or 1), 0 if the rate is exact and an infinity
        of the sign of the difference otherwise.
    """
    sigma = math.sqrt(expected * (1.0 - expected) / trials)
    if sigma > 0:
        return (rate - expected) / sigma
    return 0.0 if rate == expected else math.copysign(math.inf, rate - expected)


def mean_z(values: Any, expected: float) -> float:
    """How many standard errors the mean of ``values`` lies from its exact expectation.

    Parameters
    ----------
    values : array_like, float [n]
        Independent samples (for example accepted lengths, one per row); ``n >= 1``.
    expected : float
        The exact expectation of one sample.

    Returns
    -------
    float
        ``(mean - expected) / sqrt(variance / n)`` with the sample variance; where the
        samples do not vary, 0 if the mean is within 1e-9 of ``expected`` and an infinity
        of the sign of the difference otherwise.
    """
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    difference = float(values.mean()) - expected
    error = math.sqrt(float(values.var()) / values.size)
    if error > 0:
        return difference / error
    return 0.0 if abs(difference) <= 1e-9 else math.copysign(math.inf, difference)
