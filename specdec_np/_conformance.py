"""Conformance checks of the verifiers: exact oracles, stratified grids and chi-square tests.

This module proves the distributional claims of ``docs/semantics.md`` from the outside, treating
each verifier as a black box that maps inputs and uniforms to output token ids:

* **Exact oracle.**  For one or two positions the output distribution of the rejection
  sampler is computed analytically from its algorithm (docs/semantics.md §2.2): enumerate
  the draft token ``x ~ q``, integrate the acceptance uniform exactly
  (``P(u * q(x) < p(x)) = min(1, p(x) / q(x))``), and weight the normalised residual
  ``max(p - q, 0) / Z`` (``p`` itself when ``Z == 0``) by the rejection mass.  The
  oracle uses ``p`` only through these steps, so comparing it with ``p`` proves that the
  *algorithm* is lossless.
* **Exact chain laws.**  For any k and a small vocabulary, :func:`block_verification_law`
  and :func:`rejection_law` enumerate every tuple of drafts and integrate the uniforms
  exactly, giving the law of the first ``k + 1`` tokens when the verifier's output is
  continued by the target; a lossless verifier gives the product of the target rows.
  :func:`block_first_failure_law` is the classic wrong block verifier, a negative control.
* **Stratified grids.**  Midpoint grids of uniforms (one stratum per cell of a regular
  grid in every uniform, every draft token in the support of ``q`` enumerated with its
  weight) fed to a real sampler reproduce the oracle up to an explicit quadrature bound.
* **Monte-Carlo chi-square.**  Many rows with draft tokens drawn from ``q`` and random
  uniforms; the emitted tokens are compared with the target by Pearson's chi-square test
  (p-value from the regularised upper incomplete gamma function implemented here, so the
  package needs no scipy), and the acceptance rate with ``sum(min(p, q))``;
  :func:`monte_carlo_chain` tests a whole chain continued by the target.

:func:`run_checks` bundles these checks (and kernel-versus-reference checks of the
deterministic verifiers) for the ``specdec-np check`` command.  Pure NumPy.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "ChainLaw",
    "ChainMonteCarloReport",
    "CheckResult",
    "MonteCarloReport",
    "StratifiedBatch",
    "acceptance_probabilities",
    "block_first_failure_law",
    "block_verification_law",
    "chain_grid_error_bound",
    "chi_square_p_value",
    "chi_square_statistic",
    "draw_from",
    "exact_first_token_distribution",
    "exact_first_two_tokens_distribution",
    "grid_chain_law",
    "grid_error_bound",
    "grid_output_distribution",
    "kernel_sampler",
    "oracle_for",
    "monte_carlo_chain",
    "monte_carlo_rejection",
    "prefix_laws",
    "regularized_upper_gamma",
    "rejection_law",
    "residual_distribution",
    "run_checks",
    "stratified_rejection_batch",
    "stratified_uniform_grid",
    "target_chain_law",
]

#: A rejection sampler seen as a black box: ``sampler(target_with_bonus_probs,
#: bonus_token_ids, draft_probs, draft_token_ids, uniforms) -> output_token_ids``, all NumPy.
Sampler = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]

_TINY = 1e-300
_EPS = 2.0**-52


# --------------------------------------------------------------------------------------
# Exact oracle
# --------------------------------------------------------------------------------------


def _as_distribution(values: Any, vocab_size: int | None, name: str) -> np.ndarray:
    """A draft distribution as float64 ``[V]``; an int ``x`` is the point mass at ``x``."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool):
        if vocab_size is None:
            raise ValueError(f"{name}: a point-mass draft needs the vocabulary size")
        if not 0 <= int(values) < vocab_size:
            raise ValueError(f"{name}: point mass at {int(values)} outside [0, {vocab_size})")
        one_hot = np.zeros(vocab_size, dtype=np.float64)
        one_hot[int(values)] = 1.0
        return one_hot
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or (vocab_size is not None and array.shape[0] != vocab_size):
        raise ValueError(f"{name} must have shape [{vocab_size}]; found {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError(f"{name} must be finite and non-negative")
    return array


def _draft_support(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens with positive draft probability and their normalised weights."""
    total = math.fsum(q.tolist())
    if not total > 0:
        raise ValueError("the draft distribution has no positive probability")
    support = np.flatnonzero(q > 0)
    return support, q[support] / total


def acceptance_probabilities(p: Any, q: Any) -> np.ndarray:
    """``P(u * q(x) < p(x))`` for ``u ~ U[0, 1)``, token by token (docs/semantics.md §2.2).

    Parameters
    ----------
    p, q : array_like, float [V]
        Target and draft probabilities.

    Returns
    -------
    numpy.ndarray, float64 [V]
        ``min(1, p / q)`` where ``q > 0``; where ``q == 0`` it is 1 if ``p > 0`` (always
        accepted) and 0 otherwise (``p == 0`` is never accepted).
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    ratio = np.divide(p, q, out=np.zeros_like(p), where=q > 0)
    return np.where(q > 0, np.minimum(1.0, ratio), np.where(p > 0, 1.0, 0.0))


def residual_distribution(p: Any, q: Any) -> np.ndarray:
    """The recovery distribution at a rejected position: ``max(p - q, 0) / Z``.

    Parameters
    ----------
    p, q : array_like, float [V]

    Returns
    -------
    numpy.ndarray, float64 [V]
        The normalised residual; ``p / sum(p)`` when the residual has no mass (``Z == 0``).

    Raises
    ------
    ValueError
        If neither the residual nor ``p`` has positive mass.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    weights = np.maximum(p - q, 0.0)
    total = math.fsum(weights.tolist())
    if total == 0:
        weights = np.maximum(p, 0.0)
        total = math.fsum(weights.tolist())
    if not total > 0:
        raise ValueError("neither the residual nor the target has positive mass")
    return weights / total


def _position_terms(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """For one position: ``P(draft = x and accepted)`` [V], the rejection mass, the residual."""
    support, weights = _draft_support(q)
    accept = acceptance_probabilities(p, q)[support]
    accepted = np.zeros_like(p)
    accepted[support] = weights * accept
    rejected = math.fsum((weights * (1.0 - accept)).tolist())
    residual = residual_distribution(p, q) if rejected > 0 else np.zeros_like(p)
    return accepted, rejected, residual


def exact_first_token_distribution(p: Any, q: Any) -> np.ndarray:
    """Exact distribution of the first emitted token of the rejection sampler.

    Computed from the algorithm, not from the target: the draft ``x`` is enumerated over
    the support of ``q``, it is emitted with probability ``q(x) * min(1, p(x) / q(x))``,
    and the remaining mass goes to the normalised residual ``max(p - q, 0)`` (to ``p`` if
    the residual is zero).  A lossless sampler gives back ``p`` (normalised).

    Parameters
    ----------
    p : array_like, float [V]
        Target probabilities at position 0.
    q : array_like, float [V], or int
        Draft distribution at position 0 (normalised here), or the token of a point-mass
        draft (``draft_probs=None``).

    Returns
    -------
    numpy.ndarray, float64 [V]
    """
    p = _as_distribution(p, None, "p")
    q = _as_distribution(q, p.shape[0], "q")
    accepted, rejected, residual = _position_terms(p, q)
    return accepted + rejected * residual


def exact_first_two_tokens_distribution(p: Any, q: Sequence[Any]) -> np.ndarray:
    """Exact joint distribution of the first two outputs of the rejection sampler, k = 2.

    The drafts ``x_0 ~ q_0`` and ``x_1 ~ q_1`` are independent (fixed draft rows, as in a
    test batch).  Output 1 is ``-1`` when position 0 is rejected (the recovered token is
    output 0); otherwise it is ``x_1`` if position 1 is accepted, else a residual draw at
    position 1.

    Parameters
    ----------
    p : array_like, float [2, V] or [3, V]
        Target rows of positions 0 and 1 (a bonus row, if given, is ignored: with k = 2 the
        bonus token is output 2).
    q : sequence of two draft rows (array_like [V] or int point masses), or array [2, V]

    Returns
    -------
    numpy.ndarray, float64 [V, V + 1]
        ``joint[a, b]`` = P(output 0 = a, output 1 = b); column ``V`` holds output 1 = -1.
        For a lossless sampler the row sums are ``p_0`` and every row ``a`` restricted to
        the first ``V`` columns is proportional to ``p_1``.
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] not in (2, 3):
        raise ValueError(f"p must have shape [2, V] or [3, V]; found {p.shape}")
    if len(q) != 2:
        raise ValueError(f"q must hold two draft rows; found {len(q)}")
    vocab_size = p.shape[1]
    q0 = _as_distribution(q[0], vocab_size, "q[0]")
    q1 = _as_distribution(q[1], vocab_size, "q[1]")
    accepted0, rejected0, residual0 = _position_terms(p[0], q0)
    accepted1, rejected1, residual1 = _position_terms(p[1], q1)
    second_given_accepted = accepted1 + rejected1 * residual1
    joint = np.zeros((vocab_size, vocab_size + 1), dtype=np.float64)
    joint[:, :vocab_size] = np.outer(accepted0, second_given_accepted)
    joint[:, vocab_size] = rejected0 * residual0
    return joint


# --------------------------------------------------------------------------------------
# Stratified grids
# --------------------------------------------------------------------------------------


def stratified_uniform_grid(num_strata: int, num_dims: int) -> np.ndarray:
    """Midpoints of a regular grid on ``[0, 1)^num_dims``.

    Parameters
    ----------
    num_strata : int
        Strata per dimension ``n``; powers of two make the midpoints exact binary numbers.
    num_dims : int
        Number of uniforms per point.

    Returns
    -------
    numpy.ndarray, float64 [n ** num_dims, num_dims]
        Every point ``((i_1 + 0.5) / n, ..., (i_d + 0.5) / n)``, the last dimension varying
        fastest.  Each point stands for a cell of volume ``n ** -num_dims``.
    """
    if num_strata < 1 or num_dims < 1:
        raise ValueError("num_strata and num_dims must be positive")
    axis = (np.arange(num_strata, dtype=np.float64) + 0.5) / num_strata
    mesh = np.meshgrid(*([axis] * num_dims), indexing="ij")
    return np.stack([m.reshape(-1) for m in mesh], axis=1)


def grid_error_bound(num_strata: int, k: int) -> float:
    """Largest error of a stratified-grid probability for the outputs of
    :func:`grid_output_distribution` (first token for k = 1, first two for k = 2).

    Each output event is, for fixed drafts, a union of at most two disjoint boxes in the
    uniforms.  A midpoint grid with ``n`` strata counts an interval ``[0, a)`` or ``[a, 1)``
    with error at most ``1 / (2n)`` and an interval ``[c, d)`` with error at most ``1 / n``;
    for a box the errors of the sides add (all factors lie in [0, 1]).  The worst event is
    bounded by ``2 / n`` for k = 1 (accept, or reject and residual interval) and ``3 / n``
    for k = 2 (two acceptance sides counted in both boxes plus a residual interval):
    ``(k + 1) / n`` in both cases, plus a little for float rounding.

    Parameters
    ----------
    num_strata : int
    k : int
        1 or 2.

    Returns
    -------
    float
    """
    if k not in (1, 2):
        raise ValueError(f"the grid bound is derived for k = 1 and k = 2; found {k}")
    return (k + 1) / num_strata + 1e-12


class StratifiedBatch(NamedTuple):
    """Inputs that enumerate draft tokens and a stratified grid of uniforms.

    Attributes
    ----------
    target_with_bonus_probs : float64 [N, k+1, V]
    bonus_token_ids : int64 [N, 1]
    draft_probs : float64 [N, k, V]
    draft_token_ids : int64 [N, k]
    uniforms : float64 [N, k+1]
    weights : float64 [N]
        Probability of each row: product of the draft weights times the cell volume.
    """

    target_with_bonus_probs: np.ndarray
    bonus_token_ids: np.ndarray
    draft_probs: np.ndarray
    draft_token_ids: np.ndarray
    uniforms: np.ndarray
    weights: np.ndarray


def stratified_rejection_batch(p: Any, q: Any, num_strata: int) -> StratifiedBatch:
    """Build a batch whose weighted outputs integrate the sampler over drafts and uniforms.

    Parameters
    ----------
    p : array_like, float [k+1, V]
        Target rows (the last one is the bonus position).
    q : array_like, float [k, V]
        Draft rows; every tuple of draft tokens in their supports is enumerated.  For
        point-mass drafts pass one-hot rows (or call the sampler with ``draft_probs=None``).
    num_strata : int
        Grid strata per uniform; the batch has ``prod(|supp q_i|) * n ** (k + 1)`` rows.

    Returns
    -------
    StratifiedBatch
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if p.ndim != 2 or q.ndim != 2 or q.shape != (p.shape[0] - 1, p.shape[1]):
        raise ValueError(f"p must be [k+1, V] and q [k, V]; found {p.shape} and {q.shape}")
    k, vocab_size = q.shape
    grid = stratified_uniform_grid(num_strata, k + 1)
    supports = [_draft_support(row) for row in q]
    drafts = np.array(list(itertools.product(*(s for s, _ in supports))), dtype=np.int64)
    draft_weights = np.array(
        [math.prod(w) for w in itertools.product(*(w for _, w in supports))], dtype=np.float64
    )
    num_combos, num_points = drafts.shape[0], grid.shape[0]
    rows = num_combos * num_points
    return StratifiedBatch(
        target_with_bonus_probs=np.ascontiguousarray(
            np.broadcast_to(p, (rows, k + 1, vocab_size))
        ),
        bonus_token_ids=np.full((rows, 1), vocab_size - 1, dtype=np.int64),
        draft_probs=np.ascontiguousarray(np.broadcast_to(q, (rows, k, vocab_size))),
        draft_token_ids=np.repeat(drafts, num_points, axis=0),
        uniforms=np.tile(grid, (num_combos, 1)),
        weights=np.repeat(draft_weights / num_points, num_points),
    )


def grid_output_distribution(
    output_token_ids: Any, weights: Any, vocab_size: int, num_outputs: int = 1
) -> np.ndarray:
    """Weighted histogram of the first one or two outputs of a batch.

    Parameters
    ----------
    output_token_ids : int [N, k+1]
    weights : float [N]
    vocab_size : int
    num_outputs : int
        1: distribution of output 0, ``[V]``.  2: joint of outputs 0 and 1, ``[V, V+1]``
        with column ``V`` for output 1 = -1.

    Returns
    -------
    numpy.ndarray, float64

    Raises
    ------
    ValueError
        If output 0 is not a token id (a malformed output row).
    """
    output = np.asarray(output_token_ids)
    weights = np.asarray(weights, dtype=np.float64)
    first = output[:, 0]
    if np.any((first < 0) | (first >= vocab_size)):
        raise ValueError("output 0 must always be a token id in [0, V)")
    if num_outputs == 1:
        return np.bincount(first, weights=weights, minlength=vocab_size).astype(np.float64)
    if num_outputs != 2:
        raise ValueError(f"num_outputs must be 1 or 2; found {num_outputs}")
    second = output[:, 1]
    if np.any((second < -1) | (second >= vocab_size)):
        raise ValueError("output 1 must be -1 or a token id in [0, V)")
    column = np.where(second < 0, vocab_size, second)
    flat = np.bincount(
        first * (vocab_size + 1) + column,
        weights=weights,
        minlength=vocab_size * (vocab_size + 1),
    )
    return flat.reshape(vocab_size, vocab_size + 1)


# --------------------------------------------------------------------------------------
# Exact laws of whole chains (block verification and token-wise rejection, any k)
# --------------------------------------------------------------------------------------


class ChainLaw(NamedTuple):
    """Exact law of a verifier's output continued by the target.

    Attributes
    ----------
    law : numpy.ndarray, float64 [V] * (k + 1)
        ``law[a_0, ..., a_k]``: probability that the first ``k + 1`` tokens are
        ``a_0 .. a_k`` when the tokens after the emitted ones are drawn from the target
        rows of their positions (the bonus token from ``p_k``).  A lossless verifier gives
        the product of the target rows.
    expected_accepted_length : float
        Expected number of accepted draft tokens.
    """

    law: np.ndarray
    expected_accepted_length: float


def _chain_inputs(p: Any, q: Any) -> tuple[np.ndarray, np.ndarray]:
    """Target rows float64 ``[k+1, V]`` and draft rows float64 ``[k, V]`` (one-hot rows
    for the point-mass tokens of an int ``q``)."""
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] < 2:
        raise ValueError(f"p must have shape [k+1, V] with k >= 1; found {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("p must be finite and non-negative")
    k, vocab_size = p.shape[0] - 1, p.shape[1]
    q_array = np.asarray(q)
    if q_array.dtype.kind in "iu":
        if q_array.shape != (k,):
            raise ValueError(f"point-mass q must have shape [{k}]; found {q_array.shape}")
        if np.any(q_array < 0) or np.any(q_array >= vocab_size):
            raise ValueError(f"point-mass q must hold tokens in [0, {vocab_size})")
        one_hot = np.zeros((k, vocab_size), dtype=np.float64)
        one_hot[np.arange(k), q_array.astype(np.int64)] = 1.0
        return p, one_hot
    q_array = np.asarray(q, dtype=np.float64)
    if q_array.shape != (k, vocab_size):
        raise ValueError(f"q must have shape [{k}, {vocab_size}]; found {q_array.shape}")
    for i in range(k):
        _as_distribution(q_array[i], vocab_size, f"q[{i}]")
    return p, q_array


def _normalised_residual(weights: np.ndarray, p_row: np.ndarray) -> np.ndarray:
    """``weights / Z``, or ``p_row`` normalised when ``Z == 0``."""
    total = math.fsum(weights.tolist())
    if total > 0:
        return weights / total
    total = math.fsum(p_row.tolist())
    if not total > 0:
        raise ValueError("neither the residual nor the target row has positive mass")
    return p_row / total


# For one tuple of drafts: P(tau = t) for t = 0..k and the recovery law at each t < k (None
# where that t has probability zero).
_ChainRule = Callable[[np.ndarray, np.ndarray, tuple[int, ...]], tuple[list[float], list[Any]]]


def _block_terms(
    p: np.ndarray, q: np.ndarray, drafts: tuple[int, ...]
) -> tuple[list[float], list[np.ndarray]]:
    """``h_1 .. h_k`` and the weighted residuals ``R_0 .. R_{k-1}`` of block verification."""
    k = q.shape[0]
    rho = [1.0]
    for i, x in enumerate(drafts):
        weighted = rho[i] * float(p[i, x])
        q_x = float(q[i, x])
        rho.append(0.0 if weighted == 0 else 1.0 if weighted >= q_x else weighted / q_x)
    residuals = [np.maximum(rho[i] * p[i] - q[i], 0.0) for i in range(k)]
    h = []
    for i in range(1, k):
        total = math.fsum(residuals[i].tolist())
        denominator = total + (1.0 - rho[i])
        h.append(total / denominator if denominator > 0 else 1.0)
    h.append(rho[k])
    return h, residuals


def _block_rule(first_failure: bool) -> _ChainRule:
    def rule(
        p: np.ndarray, q: np.ndarray, drafts: tuple[int, ...]
    ) -> tuple[list[float], list[Any]]:
        k = q.shape[0]
        h, residuals = _block_terms(p, q, drafts)
        if first_failure:
            # Accept 1, 2, ... while eta_i < h_i; tau is the last success before a failure.
            tau = [math.prod(h[:t]) * (1.0 - h[t]) for t in range(k)] + [math.prod(h)]
        else:
            # tau = t: eta_t < h_t (t >= 1) and eta_i >= h_i for every i > t.
            above = [math.prod(1.0 - h_i for h_i in h[t:]) for t in range(k + 1)]
            tau = [above[0]] + [h[t - 1] * above[t] for t in range(1, k + 1)]
        recovery = [
            _normalised_residual(residuals[t], p[t]) if tau[t] > 0 else None for t in range(k)
        ]
        return tau, recovery

    return rule


def _rejection_rule(
    p: np.ndarray, q: np.ndarray, drafts: tuple[int, ...]
) -> tuple[list[float], list[Any]]:
    k = q.shape[0]
    accept = [float(acceptance_probabilities(p[i], q[i])[x]) for i, x in enumerate(drafts)]
    tau = [math.prod(accept[:t]) * (1.0 - accept[t]) for t in range(k)] + [math.prod(accept)]
    recovery = [residual_distribution(p[t], q[t]) if tau[t] > 0 else None for t in range(k)]
    return tau, recovery


def _chain_law(p: Any, q: Any, rule: _ChainRule) -> ChainLaw:
    p, q = _chain_inputs(p, q)
    k, vocab_size = q.shape
    supports = [_draft_support(row) for row in q]
    law = np.zeros((vocab_size,) * (k + 1), dtype=np.float64)
    # continuation[t]: law of tokens t .. k drawn from the target, shape [V] * (k + 1 - t).
    continuation: list[Any] = [None] * (k + 2)
    continuation[k + 1] = np.ones(())
    for t in range(k, -1, -1):
        continuation[t] = np.multiply.outer(p[t], continuation[t + 1])
    expected_length = 0.0
    for choice in itertools.product(*(range(s.size) for s, _ in supports)):
        drafts = tuple(int(supports[i][0][c]) for i, c in enumerate(choice))
        weight = math.prod(float(supports[i][1][c]) for i, c in enumerate(choice))
        tau, recovery = rule(p, q, drafts)
        for t in range(k + 1):
            mass = weight * tau[t]
            if mass == 0:
                continue
            expected_length += mass * t
            if t == k:
                law[drafts] += mass * continuation[k]
            else:
                law[drafts[:t]] += mass * np.multiply.outer(recovery[t], continuation[t + 1])
    return ChainLaw(law, expected_length)


def block_verification_law(p: Any, q: Any) -> ChainLaw:
    """Exact output law of block verification, from the algorithm.

    Every tuple of drafts ``x_i ~ q_i`` is enumerated with its weight; the uniforms enter
    only through thresholds, so ``P(tau = t | x) = h_t * prod_{i > t} (1 - h_i)`` for
    ``t >= 1`` and ``prod_{i = 1..k} (1 - h_i)`` for ``t = 0``; the token after the
    accepted prefix is drawn from ``R_t / Z_t`` (``p_t`` when ``Z_t == 0``) or is the bonus
    token.  The target rows enter only through these steps, so comparing the result with
    the product of the rows proves the algorithm lossless.

    Parameters
    ----------
    p : array_like, float [k+1, V]
        Target rows, the same at every context (the target's law of a sequence is the
        product of its rows); row ``k`` is the bonus position.
    q : array_like, float [k, V], or int [k]
        Draft rows (each normalised for the enumeration weights; the verifier sees them as
        given), or the tokens of point-mass drafts (``draft_probs=None``).

    Returns
    -------
    ChainLaw
        The law of the first ``k + 1`` tokens and the expected accepted length.
    """
    return _chain_law(p, q, _block_rule(first_failure=False))


def block_first_failure_law(p: Any, q: Any) -> ChainLaw:
    """Exact output law of the classic wrong block verifier (a negative control).

    It accepts positions 1, 2, ... while ``eta_i < h_i`` and stops at the first failed
    check, with the same thresholds and residuals as :func:`block_verification_law`.  For
    k = 1 it equals block verification; for larger k it is not lossless.

    Parameters
    ----------
    p : array_like, float [k+1, V]
        Target rows, the same at every context (the target's law of a sequence is the
        product of its rows); row ``k`` is the bonus position.
    q : array_like, float [k, V], or int [k]
        Draft rows (each normalised for the enumeration weights; the verifier sees them as
        given), or the tokens of point-mass drafts (``draft_probs=None``).

    Returns
    -------
    ChainLaw
        The law of the first ``k + 1`` tokens and the expected accepted length.
    """
    return _chain_law(p, q, _block_rule(first_failure=True))


def rejection_law(p: Any, q: Any) -> ChainLaw:
    """Exact output law of token-wise rejection sampling, for any k.

    Position ``i`` is accepted with probability ``min(1, p_i(x_i) / q_i(x_i))`` (see
    :func:`acceptance_probabilities`), the first rejected position ``r`` emits a draw from
    :func:`residual_distribution`, and all positions accepted emit the bonus token.

    Parameters
    ----------
    p : array_like, float [k+1, V]
        Target rows, the same at every context (the target's law of a sequence is the
        product of its rows); row ``k`` is the bonus position.
    q : array_like, float [k, V], or int [k]
        Draft rows (each normalised for the enumeration weights; the verifier sees them as
        given), or the tokens of point-mass drafts (``draft_probs=None``).

    Returns
    -------
    ChainLaw
        The law of the first ``k + 1`` tokens and the expected accepted length.
    """
    return _chain_law(p, q, _rejection_rule)


def target_chain_law(p: Any) -> np.ndarray:
    """The target's law of the first ``k + 1`` tokens: the outer product of its rows.

    Parameters
    ----------
    p : array_like, float [k+1, V]

    Returns
    -------
    numpy.ndarray, float64 [V] * (k + 1)
    """
    p = np.asarray(p, dtype=np.float64)
    law = np.ones(())
    for row in p[::-1]:
        law = np.multiply.outer(row, law)
    return law


def prefix_laws(law: Any) -> list[np.ndarray]:
    """The marginal laws of the first 1, 2, ..., k + 1 tokens of a chain law.

    Parameters
    ----------
    law : array_like, float [V] * (k + 1)

    Returns
    -------
    list of numpy.ndarray
        Entry ``j`` has shape ``[V] * (j + 1)``.
    """
    law = np.asarray(law, dtype=np.float64)
    return [law.sum(axis=tuple(range(j + 1, law.ndim))) for j in range(law.ndim)]


def grid_chain_law(output_token_ids: Any, weights: Any, p: Any) -> np.ndarray:
    """Weighted law of a batch's outputs continued by the target (see :class:`ChainLaw`).

    A row that accepted ``tau < k`` drafts keeps its ``tau + 1`` emitted tokens and is
    continued by ``p_{tau+1} .. p_k``; a row that accepted all ``k`` keeps its drafts and
    its bonus token is replaced by ``p_k`` (the batch's bonus ids are placeholders).

    Parameters
    ----------
    output_token_ids : int [N, k+1]
    weights : float [N]
    p : array_like, float [k+1, V]

    Returns
    -------
    numpy.ndarray, float64 [V] * (k + 1)

    Raises
    ------
    ValueError
        If a row is not an emitted prefix followed by -1.
    """
    output = np.asarray(output_token_ids, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    k, vocab_size = p.shape[0] - 1, p.shape[1]
    if output.ndim != 2 or output.shape[1] != k + 1:
        raise ValueError(f"output_token_ids must have shape [N, {k + 1}]; found {output.shape}")
    emitted = output >= 0
    lengths = emitted.sum(axis=1)
    positions = np.arange(k + 1)[None, :]
    if (
        np.any(lengths < 1)
        or np.any(output >= vocab_size)
        or np.any(output < -1)
        or not np.array_equal(emitted, positions < lengths[:, None])
    ):
        raise ValueError("every output row must be emitted tokens in [0, V), then -1")
    tau = lengths - 1
    law = np.zeros((vocab_size,) * (k + 1), dtype=np.float64)
    for t in range(k + 1):
        rows = tau == t
        kept = t + 1 if t < k else k
        flat = np.zeros(rows.sum(), dtype=np.int64)
        for j in range(kept):
            flat = flat * vocab_size + output[rows, j]
        prefix = np.bincount(flat, weights=weights[rows], minlength=vocab_size**kept)
        law += np.multiply.outer(prefix.reshape((vocab_size,) * kept), target_chain_law(p[kept:]))
    return law


def chain_grid_error_bound(p: Any, q: Any, num_strata: int) -> np.ndarray:
    """Cell-wise bound on ``|grid_chain_law - exact law|`` for a stratified grid.

    For fixed drafts, each outcome of token-wise rejection or block verification
    (accepted length ``t`` and, for ``t < k``, the recovered token) is a box in the
    uniforms: at most ``k`` sides of the form ``[0, a)`` or ``[a, 1)``, counted by the
    midpoints with error at most ``1 / (2n)`` each, and for ``t < k`` one interval
    ``[c, d)`` of the residual uniform, error at most ``1 / n``; the errors of the sides of
    a box add.  Summed over the drafts that share the emitted prefix ``a_0 .. a_{t-1}``
    the error is at most that box bound times the draft probability ``Q_t`` of the
    prefix.  A cell of the continued law is ``sum_t P(outcome t) * prod_{j > t} p_j(a_j)``
    (the bonus counted as ``p_k``), so its error is at most ``sum_{t < k} (k / (2n) +
    1 / n) * Q_t * prod_{j > t} p_j(a_j) + k / (2n) * Q_k * p_k(a_k)``, plus a little for
    float rounding.

    Parameters
    ----------
    p : array_like, float [k+1, V]
    q : array_like, float [k, V], or int [k]
        Draft rows or point-mass draft tokens, as for :func:`block_verification_law`.
    num_strata : int

    Returns
    -------
    numpy.ndarray, float64 [V] * (k + 1)
    """
    p, q = _chain_inputs(p, q)
    k, vocab_size = q.shape
    if num_strata < 1:
        raise ValueError(f"num_strata must be positive; found {num_strata}")
    q = q / q.sum(axis=1, keepdims=True)
    inner = k / (2.0 * num_strata) + 1.0 / num_strata
    bound = np.zeros((vocab_size,) * (k + 1), dtype=np.float64)
    for t in range(k + 1):
        kept = t if t < k else k
        factor = inner if t < k else k / (2.0 * num_strata)
        prefix = target_chain_law(q[:kept])
        tail = target_chain_law(p[kept + 1 :] if t < k else p[k:])
        if t < k:
            tail = np.ones(vocab_size)[(slice(None),) + (None,) * tail.ndim] * tail
        bound += factor * np.multiply.outer(prefix, tail)
    return bound + 1e-12


# --------------------------------------------------------------------------------------
# Chi-square test
# --------------------------------------------------------------------------------------


def oracle_for(verifier: Any) -> Callable[[Any, Any], ChainLaw] | None:
    """A registry verifier's exact law, ``oracle(p, q) -> ChainLaw`` (None for a lossy
    verifier): the law of the emitted tokens continued by the target, and the expected
    accepted length.

    Parameters
    ----------
    verifier : specdec_np.registry.Verifier
    """
    return None if verifier.oracle_name is None else globals()[verifier.oracle_name]


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


def _chi_square_p(counts: Any, probabilities: Any) -> float:
    return chi_square_p_value(*chi_square_statistic(counts, probabilities))


# --------------------------------------------------------------------------------------
# Monte Carlo
# --------------------------------------------------------------------------------------


def draw_from(q: Any, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` tokens drawn from the distribution ``q`` by inverse CDF.

    Parameters
    ----------
    q : array_like, float [V]
        Non-negative weights (normalised here); a token of weight zero is never drawn.
    size : int
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray, int64 [size]
    """
    q = np.asarray(q, dtype=np.float64)
    cdf = np.cumsum(q)
    if not cdf[-1] > 0:
        raise ValueError("q has no positive weight")
    cdf /= cdf[-1]
    tokens = np.searchsorted(cdf, rng.random(size), side="right")
    return np.minimum(tokens, int(np.flatnonzero(q > 0)[-1])).astype(np.int64)


@dataclass(frozen=True)
class MonteCarloReport:
    """What :func:`monte_carlo_rejection` measured.

    Attributes
    ----------
    num_rows : int
    first_p_value : float
        Chi-square p-value of output 0 against ``p_0``.
    acceptance_rate : float
        Fraction of rows whose position 0 was accepted (output 1 is not -1).
    expected_acceptance_rate : float
        ``sum(min(p_0, q_0))`` (``p_0(x_0)`` for point masses).
    acceptance_z : float
        ``(acceptance_rate - expected) / sigma`` with the binomial sigma.
    second_p_value : float or None
        Chi-square p-value of output 1 against ``p_1`` on the rows that accepted
        position 0; None when k = 1.
    format_ok : bool
        Every row holds an accepted draft prefix, one token, then -1; in particular
        output 1 is -1 exactly on the rows that rejected position 0.
    """

    num_rows: int
    first_p_value: float
    acceptance_rate: float
    expected_acceptance_rate: float
    acceptance_z: float
    second_p_value: float | None
    format_ok: bool

    def passed(self, alpha: float = 1e-4, max_sigma: float = 5.0) -> bool:
        """All sub-checks pass at significance ``alpha`` and ``max_sigma`` sigmas."""
        return (
            self.format_ok
            and self.first_p_value > alpha
            and (self.second_p_value is None or self.second_p_value > alpha)
            and abs(self.acceptance_z) <= max_sigma
        )


def _format_ok(output: np.ndarray, draft_token_ids: np.ndarray, vocab_size: int) -> bool:
    k = draft_token_ids.shape[1]
    emitted = output >= 0
    lengths = emitted.sum(axis=1) - 1
    if np.any(lengths < 0) or np.any(output >= vocab_size) or np.any(output < -1):
        return False
    positions = np.arange(k + 1)[None, :]
    if not np.array_equal(emitted, positions <= lengths[:, None]):
        return False
    prefix = positions[:, :k] < lengths[:, None]
    return bool(np.all(np.where(prefix, output[:, :k] == draft_token_ids, True)))


def monte_carlo_rejection(
    sampler: Sampler,
    p: Any,
    q: Any,
    num_rows: int,
    rng: np.random.Generator,
    *,
    dtype: Any = np.float64,
) -> MonteCarloReport:
    """Run a rejection sampler on ``num_rows`` identical rows with random drafts.

    Parameters
    ----------
    sampler : callable
        ``sampler(target, bonus, draft_probs, draft_ids, uniforms) -> output`` (NumPy).
    p : array_like, float [k+1, V]
        Target rows (k = 1 or 2 are checked; larger k works for position 0).
    q : array_like, float [k, V], or sequence of int
        Draft rows, or point-mass draft tokens (``draft_probs=None``; then every row
        drafts the same tokens).
    num_rows : int
    rng : numpy.random.Generator
        Source of the drafts and of the uniforms.
    dtype : numpy dtype
        Probability dtype fed to the sampler; the tests use the rounded values.

    Returns
    -------
    MonteCarloReport
    """
    p = np.asarray(p, dtype=dtype)
    k_plus_1, vocab_size = p.shape
    k = k_plus_1 - 1
    point_mass = isinstance(q, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in q)
    if point_mass:
        draft_ids = np.tile(np.asarray(q, dtype=np.int64), (num_rows, 1))
        q64 = np.zeros((k, vocab_size))
        q64[np.arange(k), np.asarray(q)] = 1.0
        draft_probs = None
    else:
        q = np.asarray(q, dtype=dtype)
        q64 = q.astype(np.float64)
        draft_ids = np.stack([draw_from(q64[i], num_rows, rng) for i in range(k)], axis=1)
        draft_probs = np.ascontiguousarray(np.broadcast_to(q, (num_rows, k, vocab_size)))
    p64 = p.astype(np.float64)
    target = np.ascontiguousarray(np.broadcast_to(p, (num_rows, k + 1, vocab_size)))
    bonus = np.full((num_rows, 1), vocab_size - 1, dtype=np.int64)
    uniforms = rng.random((num_rows, k + 1))
    output = np.asarray(sampler(target, bonus, draft_probs, draft_ids, uniforms))
    first = output[:, 0]
    if np.any((first < 0) | (first >= vocab_size)):
        return MonteCarloReport(num_rows, 0.0, math.nan, math.nan, math.inf, None, False)
    first_p = _chi_square_p(np.bincount(first, minlength=vocab_size), p64[0])
    # Output 1 is -1 exactly when position 0 was rejected (r = 0), for every k >= 1.
    accepted = output[:, 1] >= 0
    rate = float(accepted.mean())
    expected = math.fsum((q64[0] * acceptance_probabilities(p64[0], q64[0])).tolist())
    sigma = math.sqrt(expected * (1.0 - expected) / num_rows)
    if sigma > 0:
        z = (rate - expected) / sigma
    else:
        z = 0.0 if rate == expected else math.inf
    second_p = None
    if k >= 2:
        second = output[accepted, 1]
        if second.size and np.all((second >= 0) & (second < vocab_size)):
            second_p = _chi_square_p(np.bincount(second, minlength=vocab_size), p64[1])
        else:
            second_p = 1.0 if second.size == 0 else 0.0
    return MonteCarloReport(
        num_rows=num_rows,
        first_p_value=first_p,
        acceptance_rate=rate,
        expected_acceptance_rate=expected,
        acceptance_z=z,
        second_p_value=second_p,
        format_ok=_format_ok(output, draft_ids, vocab_size),
    )


@dataclass(frozen=True)
class ChainMonteCarloReport:
    """What :func:`monte_carlo_chain` measured.

    Attributes
    ----------
    num_rows : int
    p_value : float
        Chi-square p-value of the first ``k + 1`` tokens (the output continued by the
        target) against the product of the target rows, over all ``V ** (k + 1)`` cells.
    mean_accepted_length : float
        Mean number of accepted drafts (emitted tokens minus one).
    expected_accepted_length : float or None
        The exact expectation, when one was given.
    accepted_length_z : float
        ``(mean - expected) / standard error`` with the sample standard deviation; 0 when
        no expectation was given.
    format_ok : bool
        Every row holds an accepted draft prefix, one token, then -1.
    """

    num_rows: int
    p_value: float
    mean_accepted_length: float
    expected_accepted_length: float | None
    accepted_length_z: float
    format_ok: bool

    def passed(self, alpha: float = 1e-4, max_sigma: float = 5.0) -> bool:
        """All sub-checks pass at significance ``alpha`` and ``max_sigma`` sigmas."""
        return self.format_ok and self.p_value > alpha and abs(self.accepted_length_z) <= max_sigma


def monte_carlo_chain(
    sampler: Sampler,
    p: Any,
    q: Any,
    num_rows: int,
    rng: np.random.Generator,
    *,
    expected_accepted_length: float | None = None,
    dtype: Any = np.float64,
) -> ChainMonteCarloReport:
    """Run a lossless verifier on ``num_rows`` identical rows and test the whole chain.

    The drafts are drawn from ``q`` and the bonus tokens from ``p_k``; the positions after
    each row's emitted tokens are filled with draws from the target rows, so the first
    ``k + 1`` tokens of a lossless verifier follow the product of the target rows.

    Parameters
    ----------
    sampler : callable
        ``sampler(target, bonus, draft_probs, draft_ids, uniforms) -> output`` (NumPy).
    p : array_like, float [k+1, V]
        Target rows; ``V ** (k + 1)`` should stay small next to ``num_rows``.
    q : array_like, float [k, V], or sequence of int
        Draft rows, or point-mass draft tokens (``draft_probs=None``).
    num_rows : int
    rng : numpy.random.Generator
        Source of the drafts, bonus tokens, uniforms and continuations.
    expected_accepted_length : float, optional
        For example ``block_verification_law(p, q).expected_accepted_length``.
    dtype : numpy dtype
        Probability dtype fed to the sampler; the tests use the rounded values.

    Returns
    -------
    ChainMonteCarloReport
    """
    p = np.asarray(p, dtype=dtype)
    k_plus_1, vocab_size = p.shape
    k = k_plus_1 - 1
    p64 = p.astype(np.float64)
    point_mass = isinstance(q, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in q)
    if point_mass:
        draft_ids = np.tile(np.asarray(q, dtype=np.int64), (num_rows, 1))
        draft_probs = None
    else:
        q = np.asarray(q, dtype=dtype)
        q64 = q.astype(np.float64)
        draft_ids = np.stack([draw_from(q64[i], num_rows, rng) for i in range(k)], axis=1)
        draft_probs = np.ascontiguousarray(np.broadcast_to(q, (num_rows, k, vocab_size)))
    target = np.ascontiguousarray(np.broadcast_to(p, (num_rows, k + 1, vocab_size)))
    bonus = draw_from(p64[k], num_rows, rng)[:, None]
    uniforms = rng.random((num_rows, k + 1))
    output = np.asarray(sampler(target, bonus, draft_probs, draft_ids, uniforms))
    format_ok = _format_ok(output, draft_ids, vocab_size)
    if not format_ok:
        return ChainMonteCarloReport(
            num_rows, 0.0, math.nan, expected_accepted_length, math.inf, False
        )
    completed = output.astype(np.int64)
    flat = np.zeros(num_rows, dtype=np.int64)
    for j in range(k + 1):
        missing = completed[:, j] < 0
        completed[missing, j] = draw_from(p64[j], int(missing.sum()), rng)
        flat = flat * vocab_size + completed[:, j]
    counts = np.bincount(flat, minlength=vocab_size ** (k + 1))
    p_value = _chi_square_p(counts, target_chain_law(p64).reshape(-1))
    lengths = (output >= 0).sum(axis=1) - 1
    mean = float(lengths.mean())
    z = 0.0
    if expected_accepted_length is not None:
        error = math.sqrt(float(lengths.var()) / num_rows)
        difference = mean - expected_accepted_length
        if error > 0:
            z = difference / error
        elif abs(difference) > 1e-9:
            z = math.inf
    return ChainMonteCarloReport(
        num_rows=num_rows,
        p_value=p_value,
        mean_accepted_length=mean,
        expected_accepted_length=expected_accepted_length,
        accepted_length_z=z,
        format_ok=True,
    )


# --------------------------------------------------------------------------------------
# The real kernels as black boxes
# --------------------------------------------------------------------------------------


def _backend_module(backend: str) -> Any:
    if backend == "numpy":
        return np
    if backend == "cupy":
        import cupy

        return cupy
    raise ValueError(f"backend must be 'numpy' or 'cupy'; found {backend!r}")


def _to_host(x: Any) -> np.ndarray:
    return np.asarray(x.get() if hasattr(x, "get") else x)


def kernel_sampler(
    backend: str = "numpy", *, point_mass: bool = False, verifier: Callable[..., Any] | None = None
) -> Sampler:
    """A verifier as a NumPy-in, NumPy-out black box.

    Parameters
    ----------
    backend : {"numpy", "cupy"}
        Where the kernel runs (inputs are copied to the device and the output back).
    point_mass : bool
        Call with ``draft_probs=None`` (the draft rows are then ignored).
    verifier : callable, optional
        A function with the signature of :func:`specdec_np.rejection_sample` returning a
        ``VerificationResult``; by default :func:`specdec_np.verify.rejection_sample`,
        looked up at each call.

    Returns
    -------
    callable
        ``sampler(target, bonus, draft_probs, draft_ids, uniforms) -> output``.
    """
    from . import verify

    xp = _backend_module(backend)

    def sampler(
        target: np.ndarray,
        bonus: np.ndarray,
        draft_probs: Any,
        draft_ids: np.ndarray,
        uniforms: np.ndarray,
    ) -> np.ndarray:
        probs = None if point_mass or draft_probs is None else xp.asarray(draft_probs)
        function = verify.rejection_sample if verifier is None else verifier
        result = function(
            xp.asarray(target),
            xp.asarray(bonus),
            probs,
            xp.asarray(draft_ids),
            uniforms=xp.asarray(uniforms),
        )
        return _to_host(result.output_token_ids)

    return sampler


@dataclass(frozen=True)
class CheckResult:
    """Outcome of one conformance check.

    Attributes
    ----------
    name : str
    passed : bool
    detail : str
        The measured numbers (or the exception), for a human.
    """

    name: str
    passed: bool
    detail: str


# Fixed (p, q) cases of the oracle check: rows sum to one; q may be a point-mass token.
_ORACLE_CASES: tuple[tuple[str, tuple[float, ...], Any], ...] = (
    ("overlapping", (0.1, 0.2, 0.3, 0.4), (0.4, 0.3, 0.2, 0.1)),
    ("point mass", (0.1, 0.2, 0.3, 0.4), 2),
    ("point mass on p = 0", (0.0, 0.5, 0.5), 0),
    ("point mass on p = 1", (0.0, 1.0, 0.0), 1),
    ("q = 0 < p", (0.25, 0.25, 0.5), (0.0, 0.5, 0.5)),
    ("p = 0 < q", (0.0, 0.6, 0.4), (0.5, 0.25, 0.25)),
    ("p == q", (0.2, 0.3, 0.5), (0.2, 0.3, 0.5)),
    ("disjoint supports", (0.0, 0.0, 0.7, 0.3), (0.5, 0.5, 0.0, 0.0)),
    ("V = 1", (1.0,), (1.0,)),
)


def _check_oracle() -> CheckResult:
    worst = 0.0
    for _, p, q in _ORACLE_CASES:
        worst = max(worst, float(np.max(np.abs(exact_first_token_distribution(p, q) - p))))
    rng = np.random.default_rng(20240501)
    for _ in range(20):
        vocab_size = int(rng.integers(2, 7))
        p = rng.dirichlet(np.ones(vocab_size)) * (rng.random(vocab_size) < 0.8)
        p = p / p.sum() if p.sum() > 0 else np.full(vocab_size, 1.0 / vocab_size)
        q = rng.dirichlet(np.ones(vocab_size))
        worst = max(worst, float(np.max(np.abs(exact_first_token_distribution(p, q) - p))))
        joint = exact_first_two_tokens_distribution(
            np.stack([p, rng.dirichlet(np.ones(vocab_size))]), [q, int(rng.integers(vocab_size))]
        )
        worst = max(worst, float(np.max(np.abs(joint.sum(axis=1) - p))))
    passed = worst <= 1e-9
    return CheckResult(
        "rejection: exact oracle equals the target",
        passed,
        f"{len(_ORACLE_CASES)} fixed and 20 random cases (k = 1 and k = 2 marginal); "
        f"max |oracle - p| = {worst:.3g} (limit 1e-9)",
    )


def _check_joint_oracle() -> CheckResult:
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.1, 0.4], [0.25] * 4])
    q = np.array([[0.3, 0.3, 0.2, 0.2], [0.1, 0.6, 0.2, 0.1]])
    joint = exact_first_two_tokens_distribution(p, q)
    worst = float(np.max(np.abs(joint.sum(axis=1) - p[0])))
    accepted = joint[:, :-1].sum(axis=1)
    for a in np.flatnonzero(accepted > 0):
        worst = max(worst, float(np.max(np.abs(joint[a, :-1] / accepted[a] - p[1]))))
    rate_error = abs(accepted.sum() - np.minimum(p[0], q[0]).sum())
    passed = bool(worst <= 1e-9 and rate_error <= 1e-12)
    return CheckResult(
        "rejection: exact joint of the first two outputs (k = 2)",
        passed,
        f"max error of the marginal and of the conditionals = {worst:.3g}; "
        f"P(accept 0) error = {rate_error:.3g}",
    )


def _check_grid(backend: str) -> CheckResult:
    p = np.array([[0.1, 0.2, 0.3, 0.4], [0.25] * 4])
    q = np.array([[0.4, 0.3, 0.2, 0.1]])
    num_strata = 128
    batch = stratified_rejection_batch(p, q, num_strata)
    output = kernel_sampler(backend)(
        batch.target_with_bonus_probs,
        batch.bonus_token_ids,
        batch.draft_probs,
        batch.draft_token_ids,
        batch.uniforms,
    )
    grid = grid_output_distribution(output, batch.weights, p.shape[1])
    error = float(np.max(np.abs(grid - exact_first_token_distribution(p[0], q[0]))))
    bound = grid_error_bound(num_strata, 1)
    return CheckResult(
        "rejection: kernel on a stratified grid reproduces the oracle",
        error <= bound,
        f"{batch.weights.size} grid rows; max |grid - oracle| = {error:.3g} (bound {bound:.3g})",
    )


def _check_monte_carlo(backend: str) -> list[CheckResult]:
    p = np.array(
        [
            [0.05, 0.10, 0.20, 0.05, 0.25, 0.05, 0.20, 0.10],
            [0.30, 0.05, 0.05, 0.10, 0.10, 0.20, 0.15, 0.05],
            [0.125] * 8,
        ]
    )
    q = np.array(
        [
            [0.20, 0.05, 0.10, 0.15, 0.10, 0.20, 0.10, 0.10],
            [0.10, 0.20, 0.10, 0.10, 0.20, 0.10, 0.10, 0.10],
        ]
    )
    num_rows = 200_000
    report = monte_carlo_rejection(
        kernel_sampler(backend), p, q, num_rows, np.random.default_rng(12345)
    )
    alpha = 1e-4
    return [
        CheckResult(
            "rejection: chi-square of the first output",
            report.first_p_value > alpha and report.format_ok,
            f"{num_rows} rows, V = 8, k = 2; p-value = {report.first_p_value:.3g} "
            f"(must exceed {alpha:g}); output format ok: {report.format_ok}",
        ),
        CheckResult(
            "rejection: chi-square of the second output given acceptance",
            report.second_p_value is not None and report.second_p_value > alpha,
            f"p-value = {report.second_p_value:.3g} (must exceed {alpha:g})",
        ),
        CheckResult(
            "rejection: acceptance rate equals sum(min(p, q))",
            abs(report.acceptance_z) <= 5.0,
            f"observed {report.acceptance_rate:.5f}, expected "
            f"{report.expected_acceptance_rate:.5f}, z = {report.acceptance_z:.2f} (limit 5)",
        ),
    ]


# Fixed (p, q) cases of the exact block-verification check: k in {1, 2, 3}, V in {2, 3, 4};
# an int tuple is a point-mass draft.
_BLOCK_CASES: tuple[tuple[str, Any, Any], ...] = (
    ("k = 1", ((0.1, 0.2, 0.3, 0.4), (0.25,) * 4), ((0.4, 0.3, 0.2, 0.1),)),
    (
        "k = 2, q = 0 < p and p = 0 < q",
        ((0.6, 0.2, 0.2), (0.5, 0.0, 0.5), (0.4, 0.3, 0.3)),
        ((0.7, 0.3, 0.0), (0.4, 0.0, 0.6)),
    ),
    ("k = 2, point mass", ((0.2, 0.5, 0.3), (0.6, 0.1, 0.3), (0.3, 0.3, 0.4)), (1, 0)),
    (
        "k = 3",
        ((0.1, 0.2, 0.3, 0.4), (0.4, 0.1, 0.1, 0.4), (0.0, 0.5, 0.5, 0.0), (0.25,) * 4),
        ((0.3, 0.3, 0.2, 0.2), (0.1, 0.6, 0.2, 0.1), (0.5, 0.0, 0.25, 0.25)),
    ),
    (
        "k = 3, point mass",
        ((0.0, 0.1, 0.9), (0.3, 0.7, 0.0), (0.1, 0.8, 0.1), (0.2, 0.3, 0.5)),
        (2, 1, 1),
    ),
    (
        "k = 3, V = 2, an over-confident first draft",
        ((0.5, 0.5), (0.0, 1.0), (0.5, 0.5), (0.5, 0.5)),
        ((1.0, 0.0), (0.5, 0.5), (0.5, 0.5)),
    ),
)

# The Monte-Carlo case of the block kernel: V = 4, k = 2, 64 cells of the chain law.
_BLOCK_MC_P = ((0.1, 0.2, 0.3, 0.4), (0.4, 0.1, 0.1, 0.4), (0.25, 0.25, 0.25, 0.25))
_BLOCK_MC_Q = ((0.3, 0.3, 0.2, 0.2), (0.1, 0.6, 0.2, 0.1))


def _check_block_law() -> list[CheckResult]:
    worst = 0.0
    smallest_gain = math.inf
    largest_gain = -math.inf
    control = 0.0
    for _, p, q in _BLOCK_CASES:
        block = block_verification_law(p, q)
        target = target_chain_law(p)
        worst = max(worst, float(np.max(np.abs(block.law - target))))
        gain = block.expected_accepted_length - rejection_law(p, q).expected_accepted_length
        smallest_gain, largest_gain = min(smallest_gain, gain), max(largest_gain, gain)
        control = max(control, float(np.max(np.abs(block_first_failure_law(p, q).law - target))))
    return [
        CheckResult(
            "block verification: exact law equals the target",
            worst <= 1e-9,
            f"{len(_BLOCK_CASES)} cases, k = 1..3, point masses included; "
            f"max |law - prod p| over k + 1 tokens = {worst:.3g} (limit 1e-9)",
        ),
        CheckResult(
            "block verification: accepts at least as many drafts as token-wise rejection",
            smallest_gain >= -1e-12 and largest_gain > 1e-3,
            f"E[accepted] gain over token-wise: smallest {smallest_gain:.3g} (limit -1e-12), "
            f"largest {largest_gain:.4f} (must exceed 1e-3)",
        ),
        CheckResult(
            "block verification: the exact check catches a first-failure stop",
            control > 1e-3,
            f"max |law - prod p| of the first-failure stop = {control:.3g} (must exceed 1e-3)",
        ),
    ]


def _check_block_monte_carlo(backend: str) -> CheckResult:
    name = "block verification: chi-square of the kernel's chain"
    import specdec_np

    function = getattr(specdec_np, "block_verification_sample", None)
    if function is None:
        return CheckResult(name, False, "specdec_np.block_verification_sample is missing")
    num_rows = 200_000
    expected = block_verification_law(_BLOCK_MC_P, _BLOCK_MC_Q).expected_accepted_length
    report = monte_carlo_chain(
        kernel_sampler(backend, verifier=function),
        _BLOCK_MC_P,
        _BLOCK_MC_Q,
        num_rows,
        np.random.default_rng(54321),
        expected_accepted_length=expected,
    )
    return CheckResult(
        name,
        report.passed(),
        f"{num_rows} rows, V = 4, k = 2; p-value = {report.p_value:.3g} (must exceed 1e-4); "
        f"accepted length {report.mean_accepted_length:.4f}, exact {expected:.4f}, "
        f"z = {report.accepted_length_z:.2f} (limit 5); output format ok: {report.format_ok}",
    )


def _deterministic_batch(
    rng: np.random.Generator, dtype: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch_size, k, vocab_size = 64, 4, 50
    logits = rng.standard_normal((batch_size, k + 1, vocab_size)) * rng.uniform(
        0.5, 6.0, (batch_size, k + 1, 1)
    )
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    probs = probs.astype(dtype)
    argmax = probs[:, :k].argmax(axis=-1)
    random_ids = rng.integers(0, vocab_size, (batch_size, k))
    draft_ids = np.where(rng.random((batch_size, k)) < 0.7, argmax, random_ids).astype(np.int64)
    bonus = rng.integers(0, vocab_size, (batch_size, 1)).astype(np.int64)
    return probs, bonus, draft_ids


def _compare(name: str, fast: Any, reference: Sequence[Any]) -> tuple[bool, str]:
    pairs = zip(
        ("output_token_ids", "accepted_lengths", "num_accepted"),
        (fast.output_token_ids, fast.accepted_lengths, fast.num_accepted),
        reference,
    )
    for field, got, expected in pairs:
        got, expected = _to_host(got), _to_host(expected)
        if not np.array_equal(got, expected):
            rows = np.flatnonzero(np.any((got != expected).reshape(got.shape[0], -1), axis=1))
            return False, f"{name}: {field} differs from the reference in rows {rows[:8]}"
    return True, f"{name}: equal to the reference"


def _check_deterministic(backend: str) -> list[CheckResult]:
    from . import _reference, verify

    xp = _backend_module(backend)
    rng = np.random.default_rng(777)
    results = []
    typical: list[str] = []
    greedy: list[str] = []
    typical_ok = greedy_ok = True
    for dtype in (np.float32, np.float64):
        probs, bonus, draft_ids = _deterministic_batch(rng, dtype)
        target, bonus_x, draft_x = xp.asarray(probs), xp.asarray(bonus), xp.asarray(draft_ids)
        for threshold, alpha in ((0.09, 0.3), (0.3, 0.9)):
            fast = verify.typical_acceptance_sample(
                target, bonus_x, draft_x, posterior_threshold=threshold, posterior_alpha=alpha
            )
            reference = _reference.typical_acceptance_sample(
                target, bonus_x, draft_x, threshold, alpha
            )
            ok, text = _compare(f"{np.dtype(dtype).name} ({threshold}, {alpha})", fast, reference)
            typical_ok &= ok
            typical.append(text)
        ok, text = _compare(
            np.dtype(dtype).name,
            verify.greedy_sample(target, bonus_x, draft_x),
            _reference.greedy_sample(target, bonus_x, draft_x),
        )
        greedy_ok &= ok
        greedy.append(text)
    results.append(
        CheckResult("typical acceptance: kernel equals reference", typical_ok, "; ".join(typical))
    )
    results.append(CheckResult("greedy: kernel equals reference", greedy_ok, "; ".join(greedy)))
    return results


def run_checks(backend: str = "numpy") -> list[CheckResult]:
    """Run the conformance checks of every verifier.

    Rejection sampler: the exact oracle equals the target on fixed and random small cases
    (point masses and edge cases included) and for the joint of two outputs; the kernel
    on a stratified grid reproduces the oracle; a seeded Monte-Carlo run (2e5 rows) passes
    chi-square tests (p-value > 1e-4) on the first output and on the second given
    acceptance, and its acceptance rate is within 5 sigma of ``sum(min(p, q))``.
    Block verification: its exact law of the first ``k + 1`` tokens (continued by the
    target) equals the target's on fixed cases (k = 1..3, point masses included), its
    expected accepted length is never below token-wise rejection's and above it somewhere,
    a first-failure stop is caught by the same check, and the kernel passes a seeded
    chi-square test of the chain (1e5 rows) with its accepted length within 5 sigma.
    Typical acceptance and greedy: the kernels equal the array-API reference on fixed
    random batches (float32 and float64).

    Parameters
    ----------
    backend : {"numpy", "cupy"}
        Where the kernels run.  The oracle checks are pure NumPy either way.

    Returns
    -------
    list of CheckResult
        One per check; a check that raises is reported as failed with the exception.
    """
    _backend_module(backend)
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("rejection: exact oracle equals the target", _check_oracle),
        ("rejection: exact joint of the first two outputs (k = 2)", _check_joint_oracle),
        ("rejection: kernel on a stratified grid", lambda: _check_grid(backend)),
        ("rejection: Monte-Carlo checks", lambda: _check_monte_carlo(backend)),
        ("block verification: exact laws", _check_block_law),
        ("block verification: Monte-Carlo check", lambda: _check_block_monte_carlo(backend)),
        ("typical acceptance and greedy", lambda: _check_deterministic(backend)),
    ]
    results: list[CheckResult] = []
    for name, step in steps:
        start = time.perf_counter()
        try:
            outcome = step()
        except Exception as error:  # a crash is a failed check, with its reason
            results.append(CheckResult(name, False, f"raised {type(error).__name__}: {error}"))
            continue
        elapsed = time.perf_counter() - start
        for result in outcome if isinstance(outcome, list) else [outcome]:
            results.append(
                CheckResult(result.name, result.passed, f"{result.detail} [{elapsed:.2f} s]")
            )
    return results
