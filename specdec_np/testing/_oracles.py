"""Exact laws of the lossless verifiers, computed from their algorithms, pure NumPy.

These oracles prove the distributional claims of ``docs/semantics.md`` from the outside,
treating each verifier as a black box that maps inputs and uniforms to output token ids:

* **First tokens.**  For one or two positions the output distribution of the rejection
  sampler is computed analytically from its algorithm (docs/semantics.md §2.2): enumerate
  the draft token ``x ~ q``, integrate the acceptance uniform exactly
  (``P(u * q(x) < p(x)) = min(1, p(x) / q(x))``), and weight the normalised residual
  ``max(p - q, 0) / Z`` (``p`` itself when ``Z == 0``) by the rejection mass.  The
  oracle uses ``p`` only through these steps, so comparing it with ``p`` proves that the
  *algorithm* is lossless.
* **Chain laws.**  For any k and a small vocabulary, :func:`block_verification_law`
  and :func:`rejection_law` enumerate every tuple of drafts and integrate the uniforms
  exactly, giving the law of the first ``k + 1`` tokens when the verifier's output is
  continued by the target; a lossless verifier gives the product of the target rows
  (:func:`target_chain_law`).  :func:`block_first_failure_law` is the classic wrong block
  verifier, a negative control.  :func:`oracle_for` gives a registry verifier's law (its
  entry's ``oracle_name`` names a function of this module).
* **Stratified grids.**  Midpoint grids of uniforms (one stratum per cell of a regular
  grid in every uniform, every draft token in the support of ``q`` enumerated with its
  weight) fed to a real sampler reproduce the oracle up to an explicit quadrature bound
  (:func:`grid_error_bound`, :func:`chain_grid_error_bound`).
* **Threshold grids.**  :func:`threshold_batch` cuts every uniform's axis at every
  threshold a lossless verifier compares it with, so that the midpoint rule is exact for
  a correct verifier: the conformance kit's exact law.

The Monte-Carlo runs are in :mod:`specdec_np.testing._monte_carlo`, the chi-square tests in
:mod:`specdec_np.testing._statistics`.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "ChainLaw",
    "StratifiedBatch",
    "ThresholdBatch",
    "acceptance_probabilities",
    "acceptance_rate",
    "block_first_failure_law",
    "block_verification_law",
    "chain_grid_error_bound",
    "emitted_prefix_rows",
    "exact_first_token_distribution",
    "exact_first_two_tokens_distribution",
    "grid_chain_law",
    "grid_error_bound",
    "grid_output_distribution",
    "oracle_for",
    "prefix_laws",
    "rejection_law",
    "residual_distribution",
    "stratified_rejection_batch",
    "stratified_uniform_grid",
    "target_chain_law",
    "threshold_batch",
]


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


def acceptance_rate(p: Any, q: Any) -> float:
    """``P(accepted) = sum_x min(p(x), q(x))``: how often token-wise rejection accepts a
    draft drawn from ``q`` (docs/semantics.md §2.2).

    Parameters
    ----------
    p, q : array_like, float [V]
        Target and draft probabilities (``q`` normalised; a one-hot row for a point mass).

    Returns
    -------
    float
    """
    minimum = np.minimum(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64))
    return float(math.fsum(minimum.tolist()))


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
    p, q : array_like
        As for :func:`block_verification_law`.

    Returns
    -------
    ChainLaw
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
        Target rows; row ``k`` is the bonus position.
    q : array_like, float [k, V], or int [k]
        Draft rows or point-mass draft tokens, as for :func:`block_verification_law`.

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


def emitted_prefix_rows(output_token_ids: Any, vocab_size: int) -> np.ndarray:
    """Which rows are emitted tokens then ``-1`` padding, with at least one token.

    Parameters
    ----------
    output_token_ids : int [N, k+1]
    vocab_size : int

    Returns
    -------
    numpy.ndarray, bool [N]
        True where every entry is in ``[-1, V)``, entry 0 is a token and no token follows
        a ``-1``.  Whether the tokens are the drafts is not checked here.
    """
    output = np.asarray(output_token_ids)
    emitted = output >= 0
    lengths = emitted.sum(axis=1)
    positions = np.arange(output.shape[1])[None, :]
    in_range = np.all((output >= -1) & (output < vocab_size), axis=1)
    return (lengths >= 1) & in_range & np.all(emitted == (positions < lengths[:, None]), axis=1)


def grid_chain_law(output_token_ids: Any, weights: Any, p: Any, *,
                   bonus_drawn: bool = False) -> np.ndarray:
    """Weighted law of a batch's outputs continued by the target (see :class:`ChainLaw`).

    A row that accepted ``tau < k`` drafts keeps its ``tau + 1`` emitted tokens and is
    continued by ``p_{tau+1} .. p_k``; a row that accepted all ``k`` keeps its drafts and
    its bonus token is replaced by ``p_k`` (the batch's bonus ids are placeholders), or
    kept when the verifier drew it (``bonus_drawn``).

    Parameters
    ----------
    output_token_ids : int [N, k+1]
    weights : float [N]
    p : array_like, float [k+1, V]
    bonus_drawn : bool
        The verifier drew the bonus tokens from ``p_k`` itself: their law is checked too.

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
    if not np.all(emitted_prefix_rows(output, vocab_size)):
        raise ValueError("every output row must be emitted tokens in [0, V), then -1")
    tau = (output >= 0).sum(axis=1) - 1
    law = np.zeros((vocab_size,) * (k + 1), dtype=np.float64)
    for t in range(k + 1):
        rows = tau == t
        kept = t + 1 if t < k or bonus_drawn else k
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
# Threshold grids (exact for a correct verifier)
# --------------------------------------------------------------------------------------


class ThresholdBatch(NamedTuple):
    """Rows that integrate a verifier over its draft tokens and uniforms.

    Attributes
    ----------
    draft_token_ids : int64 [N, k]
    uniforms : float64 [N, k+1]
        Midpoints of the cells; columns ``0 .. k-1`` are the acceptance uniforms, ``k``
        the residual one.
    weights : float64 [N]
        Probability of each row: the draft tuple's probability times the cell's volume.
    """

    draft_token_ids: np.ndarray
    uniforms: np.ndarray
    weights: np.ndarray


def _cdf_points(weights: np.ndarray) -> list[float]:
    total = weights.sum()
    if not total > 0:
        return []
    return list(np.cumsum(weights) / total)


def _cut_axis(points: list[float], refine: int) -> tuple[np.ndarray, np.ndarray]:
    """Midpoints and widths of the cells cut by ``points`` and a regular ``refine`` grid."""
    cuts = np.unique(
        np.clip(np.concatenate([[0.0, 1.0], np.arange(1, refine) / refine, points]), 0, 1)
    )
    # Slivers narrower than 1e-12 change no probability beyond the law's tolerance, and
    # their midpoints could round onto a threshold (or onto 1.0).
    keep = np.concatenate([[True], np.diff(cuts) > 1e-12])
    keep[-1] = True
    cuts = cuts[keep]
    if cuts.size > 2 and cuts[-1] - cuts[-2] <= 1e-12:
        cuts = np.delete(cuts, -2)
    return (cuts[:-1] + cuts[1:]) / 2, np.diff(cuts)


def threshold_batch(p: Any, q: Any, refine: int,
                    also: Sequence[tuple[Any, Any]] = ()) -> ThresholdBatch:
    """Rows whose weighted outputs are a correct verifier's exact law.

    A correct verifier's output is constant between the thresholds it compares a uniform
    with (token-wise rejection's acceptance ratios, block verification's ``h_i``, the
    residual CDF points); cutting every axis at those thresholds makes the midpoint rule
    exact for it, so the law it yields (:func:`grid_chain_law`) can be compared with the
    target to rounding.  The regular ``refine`` cuts give a broken verifier's own
    thresholds room to show; ``also`` names broken verifiers' laws outright.

    Parameters
    ----------
    p : array_like, float [k+1, V]
        Target rows (row ``k`` is the bonus position).
    q : array_like, float [k, V]
        Draft rows; every tuple of draft tokens in their supports is enumerated.
    refine : int
        Regular cuts per axis, on top of the thresholds.
    also : sequence of (p, q)
        Other target and draft rows of the same shapes whose thresholds are cut too (the
        drafts still come from ``q``): a verifier that uses one of them instead of
        ``(p, q)`` (a sampling parameter ignored) is then integrated exactly as well, so
        its law differs from the target's by all its difference, never by a part the
        cells hide.

    Returns
    -------
    ThresholdBatch
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    laws = [(p, q)] + [(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
                       for a, b in also]
    k = q.shape[0]
    supports = [_draft_support(row) for row in q]
    rows: dict[str, list[np.ndarray]] = {"ids": [], "uniforms": [], "weights": []}
    for choice in itertools.product(*(range(s.size) for s, _ in supports)):
        drafts = np.array([supports[i][0][c] for i, c in enumerate(choice)], dtype=np.int64)
        weight = math.prod(float(supports[i][1][c]) for i, c in enumerate(choice))
        accept_points: list[list[float]] = [[] for _ in range(k)]
        residual_points: list[float] = []
        for target, draft in laws:
            # Both lossless algorithms' thresholds, so that either is exact here.
            thresholds, weighted = _block_terms(target, draft, tuple(drafts))
            ratios = acceptance_probabilities(target[np.arange(k), drafts],
                                              draft[np.arange(k), drafts])
            for i in range(k):
                accept_points[i] += [float(ratios[i]), thresholds[i]]
                residual_points += (
                    _cdf_points(weighted[i])
                    + _cdf_points(target[i])
                    + _cdf_points(np.maximum(target[i] - draft[i], 0.0))
                )
        axes = [_cut_axis(points, refine) for points in accept_points]
        axes.append(_cut_axis(residual_points, refine))
        mesh = np.meshgrid(*(axis[0] for axis in axes), indexing="ij")
        mids = np.stack([m.reshape(-1) for m in mesh], axis=1)
        mesh = np.meshgrid(*(axis[1] for axis in axes), indexing="ij")
        widths = np.prod(np.stack([w.reshape(-1) for w in mesh]), axis=0)
        rows["ids"].append(np.tile(drafts, (mids.shape[0], 1)))
        rows["uniforms"].append(mids)
        rows["weights"].append(widths * weight)
    return ThresholdBatch(*(np.concatenate(rows[name]) for name in ("ids", "uniforms", "weights")))


# --------------------------------------------------------------------------------------
# The registry's oracles
# --------------------------------------------------------------------------------------


def oracle_for(verifier: Any) -> Callable[[Any, Any], ChainLaw] | None:
    """A registry verifier's exact law, ``oracle(p, q) -> ChainLaw`` (None for a lossy
    verifier): the law of the emitted tokens continued by the target, and the expected
    accepted length.

    Parameters
    ----------
    verifier : specdec_np.registry.Verifier
    """
    if verifier.oracle_name is None:
        return None
    return getattr(sys.modules[__name__], verifier.oracle_name)
