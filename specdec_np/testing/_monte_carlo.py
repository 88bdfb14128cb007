"""Monte-Carlo runs of the verifiers: random drafts and uniforms, chi-square verdicts.

Many rows with draft tokens drawn from ``q`` and random uniforms go through a verifier
seen as a black box; the emitted tokens are compared with the target by Pearson's
chi-square test (:mod:`specdec_np.testing._statistics`) and the acceptance with its exact rate
(:mod:`specdec_np.testing._oracles`).  :func:`monte_carlo_rejection` tests the first two outputs
of a rejection sampler, :func:`monte_carlo_chain` a whole chain continued by the target.
The pieces are shared with the conformance kit (:mod:`specdec_np.testing`): the draws
(:func:`draw_from`, :func:`draw_drafts`), the completion of an output by the target
(:func:`complete_with_target`) and the output-format rule (:func:`format_problem`).
:func:`kernel_sampler` makes the package's own functions such black boxes, on NumPy or
CuPy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import verify
from .._runtime import arrays as _backend
from ._oracles import acceptance_rate, target_chain_law
from ._statistics import binomial_z, chi_square_test, mean_z

__all__ = [
    "ChainMonteCarloReport",
    "MonteCarloReport",
    "Sampler",
    "array_module",
    "complete_with_target",
    "draw_drafts",
    "draw_from",
    "format_problem",
    "kernel_sampler",
    "monte_carlo_chain",
    "monte_carlo_rejection",
    "to_numpy",
]

#: A verifier seen as a black box: ``sampler(target_with_bonus_probs, bonus_token_ids,
#: draft_probs, draft_token_ids, uniforms) -> output_token_ids``, all NumPy.
Sampler = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


# --------------------------------------------------------------------------------------
# Draws
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


def draw_drafts(q: Any, num_rows: int, rng: np.random.Generator) -> np.ndarray:
    """Draft tokens of ``num_rows`` rows, position ``i`` drawn from ``q[i]``.

    Parameters
    ----------
    q : array_like, float [k, V]
    num_rows : int
    rng : numpy.random.Generator
        Drawn position by position (all rows of position 0 first).

    Returns
    -------
    numpy.ndarray, int64 [num_rows, k]
    """
    q = np.asarray(q, dtype=np.float64)
    return np.stack([draw_from(q[i], num_rows, rng) for i in range(q.shape[0])], axis=1)


def _is_point_mass(q: Any) -> bool:
    """Whether ``q`` gives point-mass draft tokens (a sequence of ints) rather than rows."""
    return isinstance(q, (list, tuple)) and all(isinstance(t, (int, np.integer)) for t in q)


def _identical_drafts(
    q: Any, k: int, vocab_size: int, num_rows: int, rng: np.random.Generator, dtype: Any
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """The drafts of ``num_rows`` identical rows: ``(q64, draft_probs, draft_token_ids)``.

    ``q`` is either draft rows ``[k, V]`` (ids drawn from them, the rows broadcast in
    ``dtype``) or point-mass tokens (every row drafts them, ``draft_probs`` None, ``q64``
    their one-hot rows).
    """
    if _is_point_mass(q):
        q64 = np.zeros((k, vocab_size))
        q64[np.arange(k), np.asarray(q)] = 1.0
        return q64, None, np.tile(np.asarray(q, dtype=np.int64), (num_rows, 1))
    q = np.asarray(q, dtype=dtype)
    q64 = q.astype(np.float64)
    draft_probs = np.ascontiguousarray(np.broadcast_to(q, (num_rows, k, vocab_size)))
    return q64, draft_probs, draw_drafts(q64, num_rows, rng)


def complete_with_target(output: Any, p: Any, rng: np.random.Generator) -> np.ndarray:
    """The outputs completed to ``k + 1`` tokens by draws from the target rows.

    A lossless verifier's output followed by tokens drawn from the target has the target's
    law of the whole block (here the product of the fixed target rows).

    Parameters
    ----------
    output : int [N, k+1]
        ``-1`` where nothing was emitted.
    p : array_like, float [k+1, V]
    rng : numpy.random.Generator
        Drawn column by column, for the rows missing that column.

    Returns
    -------
    numpy.ndarray, int64 [N, k+1]
    """
    completed = np.array(output, dtype=np.int64)
    p = np.asarray(p, dtype=np.float64)
    for j in range(p.shape[0]):
        missing = completed[:, j] < 0
        completed[missing, j] = draw_from(p[j], int(missing.sum()), rng)
    return completed


def format_problem(output: np.ndarray, draft_token_ids: np.ndarray, vocab_size: int) -> str:
    """Empty if every row is an accepted draft prefix, one token, then -1; else why not.

    Parameters
    ----------
    output : int [N, k+1]
    draft_token_ids : int [N, k]
    vocab_size : int

    Returns
    -------
    str
        The first problem found, naming the row, or ``""``.
    """
    k = draft_token_ids.shape[1]
    emitted = output != -1
    length = emitted.sum(axis=1)
    bad = np.flatnonzero(np.any((output < -1) | (output >= vocab_size), axis=1))
    if bad.size:
        return f"row {bad[0]} holds an id outside [-1, V): {output[bad[0]].tolist()}"
    positions = np.arange(k + 1)
    contiguous = emitted == (positions[None, :] < length[:, None])
    bad = np.flatnonzero(~np.all(contiguous, axis=1) | (length == 0))
    if bad.size:
        return f"row {bad[0]} is not tokens then -1 padding: {output[bad[0]].tolist()}"
    prefix = positions[None, :k] < (length[:, None] - 1)
    bad = np.flatnonzero(np.any(prefix & (output[:, :k] != draft_token_ids), axis=1))
    if bad.size:
        return (
            f"row {bad[0]}: {output[bad[0]].tolist()} is not a prefix of the drafts "
            f"{draft_token_ids[bad[0]].tolist()} followed by one token"
        )
    return ""


# --------------------------------------------------------------------------------------
# The first two outputs of a rejection sampler
# --------------------------------------------------------------------------------------


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
    k, vocab_size = p.shape[0] - 1, p.shape[1]
    q64, draft_probs, draft_ids = _identical_drafts(q, k, vocab_size, num_rows, rng, dtype)
    p64 = p.astype(np.float64)
    target = np.ascontiguousarray(np.broadcast_to(p, (num_rows, k + 1, vocab_size)))
    bonus = np.full((num_rows, 1), vocab_size - 1, dtype=np.int64)
    uniforms = rng.random((num_rows, k + 1))
    output = np.asarray(sampler(target, bonus, draft_probs, draft_ids, uniforms))
    first = output[:, 0]
    if np.any((first < 0) | (first >= vocab_size)):
        return MonteCarloReport(num_rows, 0.0, math.nan, math.nan, math.inf, None, False)
    first_p = chi_square_test(np.bincount(first, minlength=vocab_size), p64[0])
    # Output 1 is -1 exactly when position 0 was rejected (r = 0), for every k >= 1.
    accepted = output[:, 1] >= 0
    rate = float(accepted.mean())
    expected = acceptance_rate(p64[0], q64[0])
    second_p = None
    if k >= 2:
        second = output[accepted, 1]
        if second.size and np.all((second >= 0) & (second < vocab_size)):
            second_p = chi_square_test(np.bincount(second, minlength=vocab_size), p64[1])
        else:
            second_p = 1.0 if second.size == 0 else 0.0
    return MonteCarloReport(
        num_rows=num_rows,
        first_p_value=first_p,
        acceptance_rate=rate,
        expected_acceptance_rate=expected,
        acceptance_z=binomial_z(rate, expected, num_rows),
        second_p_value=second_p,
        format_ok=not format_problem(output, draft_ids, vocab_size),
    )


# --------------------------------------------------------------------------------------
# Whole chains
# --------------------------------------------------------------------------------------


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
        As for :func:`monte_carlo_rejection`.

    Returns
    -------
    ChainMonteCarloReport
    """
    p = np.asarray(p, dtype=dtype)
    k, vocab_size = p.shape[0] - 1, p.shape[1]
    p64 = p.astype(np.float64)
    _, draft_probs, draft_ids = _identical_drafts(q, k, vocab_size, num_rows, rng, dtype)
    target = np.ascontiguousarray(np.broadcast_to(p, (num_rows, k + 1, vocab_size)))
    bonus = draw_from(p64[k], num_rows, rng)[:, None]
    uniforms = rng.random((num_rows, k + 1))
    output = np.asarray(sampler(target, bonus, draft_probs, draft_ids, uniforms))
    if format_problem(output, draft_ids, vocab_size):
        return ChainMonteCarloReport(
            num_rows, 0.0, math.nan, expected_accepted_length, math.inf, False
        )
    completed = complete_with_target(output, p64, rng)
    flat = np.zeros(num_rows, dtype=np.int64)
    for j in range(k + 1):
        flat = flat * vocab_size + completed[:, j]
    counts = np.bincount(flat, minlength=vocab_size ** (k + 1))
    p_value = chi_square_test(counts, target_chain_law(p64).reshape(-1))
    lengths = (output >= 0).sum(axis=1) - 1
    z = 0.0 if expected_accepted_length is None else mean_z(lengths, expected_accepted_length)
    return ChainMonteCarloReport(
        num_rows=num_rows,
        p_value=p_value,
        mean_accepted_length=float(lengths.mean()),
        expected_accepted_length=expected_accepted_length,
        accepted_length_z=z,
        format_ok=True,
    )


# --------------------------------------------------------------------------------------
# The package's kernels as black boxes
# --------------------------------------------------------------------------------------


def array_module(backend: str) -> Any:
    """The array module of a backend name.

    Parameters
    ----------
    backend : {"numpy", "cupy"}

    Returns
    -------
    module
        :mod:`numpy`, or :mod:`cupy` (a TypeError if it is not installed).

    Raises
    ------
    ValueError
        For another name.
    """
    if backend == "numpy":
        return np
    if backend == "cupy":
        return _backend.cuda_module()
    raise ValueError(f"backend must be 'numpy' or 'cupy'; found {backend!r}")


def to_numpy(value: Any) -> np.ndarray:
    """A NumPy array of ``value``: itself, through DLPack, or a host copy of a device array.

    Parameters
    ----------
    value : array-like
        A NumPy, CuPy, torch or other DLPack array, or anything ``numpy.asarray`` reads.

    Returns
    -------
    numpy.ndarray
    """
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError, ValueError):
            pass  # a device array: try the host copies below
    if hasattr(value, "get"):
        return np.asarray(value.get())
    if hasattr(value, "cpu"):
        return np.asarray(value.cpu())
    return np.asarray(value)


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
    xp = array_module(backend)

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
        return to_numpy(result.output_token_ids)

    return sampler
