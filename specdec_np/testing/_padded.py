"""The conformance kit on the padded layout: the stateless chain form of the samplers.

The verifier is called as ``verifier(target_with_bonus_probs [B, k+1, V], bonus_token_ids
[B, 1], draft_probs [B, k, V] or None, draft_token_ids [B, k], *, uniforms=[B, k+1])``
(``docs/testing.md``, the calling convention).  :func:`run` checks it: the exact law by
integration over the uniforms, Monte Carlo once per randomness source it takes, the bug
catalogue, batch invariance, seeds, the output format; the deterministic kinds against
their rule (greedy: the argmax) or their reference (typical acceptance).  The ragged layout
reuses every check here through an adapter (:mod:`specdec_np.testing._ragged`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import registry
from .._reference import chains as _reference
from . import _monte_carlo, _oracles, _statistics
from ._report import PropertyResult, TimeLimit, guard, has_keyword, positional_count, skipped

__all__ = ["PaddedTarget", "run"]

#: The largest double below 1, the top of the uniforms' range.
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_ALPHA = 1e-4
_MAX_SIGMA = 5.0
_LAW_TOLERANCE = 1e-9

#: Every randomness source the kit feeds, by keyword, and how the report names it
#: (``"own"``: none given, the verifier draws its own).
SOURCE_LABELS = {
    "uniforms": "explicit uniforms",
    "generator": "generator=",
    "seeded_seqs": "seeded_seqs=",
    "counter_seeds": "counter_seeds=",
    "own": "its own randomness",
}


class PaddedTarget:
    """The verifier under test, called with NumPy inputs, returning int64 NumPy outputs."""

    def __init__(self, verifier: Callable[..., Any], kind: str, probs_dtype: Any,
                 limit: TimeLimit) -> None:
        self.verifier = verifier
        self.probs_dtype = probs_dtype
        self.limit = limit
        self.takes_uniforms = has_keyword(verifier, "uniforms")
        self.takes_seeded_seqs = has_keyword(verifier, "seeded_seqs")
        self.takes_generator = has_keyword(verifier, "generator")
        self.takes_counter_seeds = has_keyword(verifier, "counter_seeds")
        # A verifier that reads no draft rows may leave them out of its signature.
        self.three_arguments = (not registry.get(kind).reads_draft_probs
                                and positional_count(verifier) == 3)
        self.raw_dtypes: set[str] = set()
        self.format_errors: list[str] = []

    def sources(self) -> list[str]:
        """The randomness sources the verifier takes, of :data:`SOURCE_LABELS`."""
        return [source for source in SOURCE_LABELS if source != "own"
                and getattr(self, f"takes_{source}")]

    def __call__(
        self,
        target: np.ndarray,
        bonus: np.ndarray,
        draft_probs: np.ndarray | None,
        draft_ids: np.ndarray,
        uniforms: np.ndarray | None = None,
        **keywords: Any,
    ) -> np.ndarray:
        if uniforms is not None:
            keywords["uniforms"] = np.ascontiguousarray(uniforms, dtype=np.float64)
        target = np.ascontiguousarray(target, dtype=self.probs_dtype)
        if draft_probs is not None:
            draft_probs = np.ascontiguousarray(draft_probs, dtype=self.probs_dtype)
        if self.three_arguments:
            result = self.limit.call(self.verifier, target, bonus, draft_ids, **keywords)
        else:
            result = self.limit.call(self.verifier, target, bonus, draft_probs, draft_ids,
                                     **keywords)
        output = _monte_carlo.to_numpy(getattr(result, "output_token_ids", result))
        self.raw_dtypes.add(str(output.dtype))
        expected = (draft_ids.shape[0], draft_ids.shape[1] + 1)
        problem = ""
        if output.dtype.kind not in "iu":
            problem = f"the output must have an integer dtype; found {output.dtype}"
        elif output.shape != expected:
            problem = f"the output must have shape {list(expected)}; found {list(output.shape)}"
        if problem:
            self.format_errors.append(problem)
            raise TypeError(problem)
        return output.astype(np.int64)


# --------------------------------------------------------------------------------------
# Exact law by integration over the uniforms
# --------------------------------------------------------------------------------------


def _oracle_law(kind: str, p: np.ndarray, q: np.ndarray) -> tuple[Any, str]:
    """The registry's exact law for this kind: ``(law, expected_accepted_length)``.

    The oracle ``law(p [k+1, V], q [k, V])`` of :mod:`specdec_np.testing._oracles` returns a
    ``ChainLaw``: ``law`` is the law ``[V] * (k+1)`` of the output continued by the target
    (the bonus token drawn from ``p_k``), ``expected_accepted_length`` a float.
    """
    entry = registry.get(kind)
    name = entry.oracle_name
    law_function = _oracles.oracle_for(entry)
    if law_function is None:
        return None, f"no oracle for {kind} in this installation"
    try:
        result = law_function(p, q)
        law = np.asarray(result.law, dtype=np.float64)
        expected_length = float(result.expected_accepted_length)
    except Exception as error:  # the oracle's own limits are not the verifier's fault
        return None, f"oracle {name} failed: {type(error).__name__}: {error}"
    if law.shape != (p.shape[1],) * p.shape[0]:
        return None, f"oracle {name} returned a law of shape {law.shape}"
    return (law, expected_length), f"oracle {name}"


def _completed_law(output: np.ndarray, weights: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Law ``[V] * (k+1)`` of the output completed to ``k+1`` tokens by target draws.

    The bonus is a fixed input here, so a row that accepted every draft is completed from
    ``p_k`` like the others; rows that are not an emitted prefix then ``-1`` count for
    nothing (they are the format check's business).
    """
    well_formed = _oracles.emitted_prefix_rows(output, p.shape[1])
    return _oracles.grid_chain_law(output[well_formed], weights[well_formed], p)


def exact_probability_row(rng: np.random.Generator, size: int) -> np.ndarray:
    """A probability row of multiples of 1/1024 summing to exactly 1, with a zero: the
    same numbers in float32 and float64, so the law of a lossless verifier is the target's
    to rounding in either dtype."""
    row = rng.dirichlet(np.ones(size))
    row[rng.integers(size)] = 0.0
    counts = np.floor(row / row.sum() * 1024)
    counts[np.argmax(counts)] += 1024 - counts.sum()
    return counts / 1024


def _law_cases(vocab_size: int, rng: np.random.Generator) -> list[tuple]:
    """(label, p [k+1, V], q [k, V], regular cuts per axis) cases of the exact-law check."""

    def sparse(size: int) -> np.ndarray:
        return exact_probability_row(rng, size)

    size = max(3, min(vocab_size, 4))
    cases: list[tuple] = [
        ("random k = 2", np.stack([sparse(size) for _ in range(3)]),
         np.stack([sparse(size) for _ in range(2)])),
        ("q = 0 < p", np.array([[0.25, 0.25, 0.5], [0.125, 0.375, 0.5]]),
         np.array([[0.0, 0.5, 0.5]])),
        ("p = 0 < q", np.array([[0.0, 0.625, 0.375], [0.125, 0.375, 0.5]]),
         np.array([[0.5, 0.25, 0.25]])),
        ("disjoint supports", np.array([[0.0, 0.0, 0.75, 0.25], [0.25] * 4]),
         np.array([[0.5, 0.5, 0.0, 0.0]])),
        ("p == q, k = 2",
         np.array([[0.25, 0.25, 0.5], [0.625, 0.375, 0.0], [0.25, 0.375, 0.375]]),
         np.array([[0.25, 0.25, 0.5], [0.625, 0.375, 0.0]])),
    ]
    cases = [(*case, 8) for case in cases]
    # A surplus at position 0 (p / q = 7/4) then a deficit (4/7): block verification's
    # capped weight is 4/7, the prefix ratio min(1, 7/4 * 4/7) of hierarchical speculative
    # decoding's code 1, and its two-token law is off by 3/16 in total variation.  Fixed,
    # so that no seed's random rows can hide that rule; that rule accepts where block
    # verification rejects across whole cells, so two regular cuts per axis are enough
    # (84 rows, where 8 would cost 2240).
    cases.append(("surplus then deficit, k = 2",
                  np.array([[0.875, 0.125], [0.5, 0.5], [0.5, 0.5]]),
                  np.array([[0.5, 0.5], [0.125, 0.875]]), 2))
    return cases


def _check_exact_law(target: PaddedTarget, kind: str, vocab_size: int,
                     rng: np.random.Generator) -> list[PropertyResult]:
    worst, worst_oracle, rows_fed = 0.0, 0.0, 0
    worst_label = ""
    oracle_notes: list[str] = []
    oracle_used = False
    for label, p, q, refine in _law_cases(vocab_size, rng):
        batch = _oracles.threshold_batch(p, q, refine=refine)
        n = batch.draft_token_ids.shape[0]
        output = target(
            np.ascontiguousarray(np.broadcast_to(p, (n, *p.shape))),
            np.full((n, 1), int(np.argmax(p[-1])), dtype=np.int64),
            np.ascontiguousarray(np.broadcast_to(q, (n, *q.shape))),
            batch.draft_token_ids,
            batch.uniforms,
        )
        rows_fed += n
        law = _completed_law(output, batch.weights, p)
        # The cases' rows sum to exactly one: the product of the rows is the target's law.
        error = float(np.max(np.abs(law - _oracles.target_chain_law(p))))
        if error > worst:
            worst, worst_label = error, label
        oracle, note = _oracle_law(kind, p, q)
        if oracle is not None:
            oracle_used = True
            exact_law, expected_length = oracle
            length = float(np.dot((output != -1).sum(axis=1) - 1, batch.weights))
            worst_oracle = max(worst_oracle, float(np.max(np.abs(law - exact_law))),
                               abs(length - expected_length))
        else:
            oracle_notes.append(note)
    results = [
        PropertyResult(
            "exact law equals the target",
            worst <= _LAW_TOLERANCE,
            f"max err {worst:.2g}",
            f"{rows_fed} rows integrating drafts and uniforms (cells cut at every threshold"
            f" of rejection and block verification),"
            f" V <= 4, k <= 2; law of the output completed by target draws vs the product of"
            f" the target rows; limit {_LAW_TOLERANCE:g}"
            + (f"; worst case: {worst_label}" if worst > _LAW_TOLERANCE else ""),
        )
    ]
    if oracle_used:
        results.append(PropertyResult(
            "exact law equals the oracle", worst_oracle <= _LAW_TOLERANCE,
            f"max err {worst_oracle:.2g}",
            f"the same law and the mean accepted length vs the exact {kind} oracle; limit "
            f"{_LAW_TOLERANCE:g}"))
    else:
        results.append(skipped("exact law equals the oracle", sorted(set(oracle_notes))[0]))
    return results


# --------------------------------------------------------------------------------------
# Monte Carlo
# --------------------------------------------------------------------------------------


def _random_rows(rng: np.random.Generator, k: int, vocab_size: int,
                 dtype: Any) -> tuple[np.ndarray, ...]:
    """One target [k+1, V] and draft [k, V] with zeros, overlapping but not equal."""
    p = rng.dirichlet(np.full(vocab_size, 0.8), size=k + 1)
    p[:, 0] = 0.0  # a zero-probability target token in every row
    p /= p.sum(axis=1, keepdims=True)
    # Close to the target, as real drafts are, so that later positions are reached often.
    q = 0.6 * p[:k] + 0.4 * rng.dirichlet(np.full(vocab_size, 0.8), size=k)
    q[:, -1] = 0.0  # and a token the draft never proposes
    q /= q.sum(axis=1, keepdims=True)
    # The expectations use the values the verifier sees, rounded to its dtype.
    p = p.astype(dtype).astype(np.float64)
    q = q.astype(dtype).astype(np.float64)
    return p, q


def row_seed(source: str, salt: int, row: int) -> Any:
    """What a seeded source holds for one row: a Generator (``seeded_seqs``) or a
    ``(seed, position)`` pair (``counter_seeds``)."""
    if source == "seeded_seqs":
        return np.random.default_rng([salt, row])
    return (salt * 100_003 + row, 3)


def source_keywords(source: str, num_rows: int, salt: int) -> dict[str, Any]:
    """The keyword that makes a batch of ``num_rows`` rows draw from ``source``; empty for
    explicit uniforms and the verifier's own randomness (the caller adds the uniforms)."""
    if source == "generator":
        return {"generator": np.random.default_rng([salt, 99])}
    if source in SEEDED_SOURCES:
        return {source: {row: row_seed(source, salt, row) for row in range(num_rows)}}
    return {}


#: The randomness sources keyed by row, in the order the kit exercises them.
SEEDED_SOURCES = ("seeded_seqs", "counter_seeds")


def chain_chi_square(output: np.ndarray, p: np.ndarray,
                     rng: np.random.Generator) -> tuple[float, str, int]:
    """The chi-square tests of outputs completed by target draws, token by token and pair
    by pair, against the product of the rows ``p [k+1, V]``: ``(lowest p-value, its
    test, number of tests)``."""
    k, vocab_size = p.shape[0] - 1, p.shape[1]
    completed = _monte_carlo.complete_with_target(output, p, rng)
    if np.any(completed < 0) or np.any(completed >= vocab_size):
        return 0.0, "malformed output", 2 * k + 1
    p_values, labels = [], []
    for j in range(k + 1):
        p_values.append(_statistics.chi_square_test(
            np.bincount(completed[:, j], minlength=vocab_size), p[j]))
        labels.append(f"token {j}")
    for j in range(k):
        pair = completed[:, j] * vocab_size + completed[:, j + 1]
        p_values.append(_statistics.chi_square_test(
            np.bincount(pair, minlength=vocab_size**2), np.outer(p[j], p[j + 1])))
        labels.append(f"tokens {j},{j + 1}")
    worst = int(np.argmin(p_values))
    return float(p_values[worst]), labels[worst], len(p_values)


def _check_monte_carlo(target: PaddedTarget, kind: str, k: int, vocab_size: int, num_rows: int,
                       rng: np.random.Generator, outputs: list) -> list[PropertyResult]:
    p, q = _random_rows(rng, k, vocab_size, target.probs_dtype)
    results: list[PropertyResult] = []
    first_output = None
    # Every source the verifier takes is a separate path to test (a generator= path may
    # be wrong where explicit uniforms are right); seeded sources get a fifth of the rows.
    for position, source in enumerate(target.sources() or ["own"]):
        rows = num_rows if source not in SEEDED_SOURCES else max(num_rows // 5, 1000)
        ids = _monte_carlo.draw_drafts(q, rows, rng)
        bonus = _monte_carlo.draw_from(p[k], rows, rng).reshape(rows, 1)
        uniforms = rng.random((rows, k + 1)) if source == "uniforms" else None
        output = target(np.ascontiguousarray(np.broadcast_to(p, (rows, *p.shape))), bonus,
                        np.ascontiguousarray(np.broadcast_to(q, (rows, *q.shape))), ids,
                        uniforms, **source_keywords(source, rows, 7 + position))
        outputs.append((output, ids, f"Monte Carlo batch ({SOURCE_LABELS[source]})",
                        vocab_size))
        lowest, worst, tests = chain_chi_square(output, p, rng)
        name = "Monte Carlo chi-square"
        if position:
            name += f" ({SOURCE_LABELS[source]})"
        results.append(PropertyResult(
            name, lowest > _ALPHA, f"min p = {lowest:.3g}",
            f"{rows} rows, k = {k}, V = {vocab_size}, {SOURCE_LABELS[source]}; {tests} "
            f"chi-square tests of the output completed by target draws (each token and each "
            f"adjacent pair) vs the target; each p must exceed {_ALPHA:g}; lowest: {worst}"))
        if first_output is None:
            first_output = output
    output = first_output if first_output is not None else np.zeros((1, k + 1), np.int64)
    emitted = output != -1
    accepted = np.clip(emitted.sum(axis=1) - 1, 0, k)
    mean_length = float(accepted.mean())
    rates = [_oracles.acceptance_rate(p[j], q[j]) for j in range(k)]
    expected = sum(math.prod(rates[:j]) for j in range(1, k + 1))
    # The acceptance property follows from how the verifier counts: one that tests every
    # position on its own (token-wise) accepts position j, once reached, with probability
    # sum(min(p_j, q_j)); one that accepts a prefix as a whole (block verification) must not
    # accept fewer drafts than token-wise rejection does.
    if not registry.get(kind).causal_counts:
        zs = []
        for j in range(k):
            reached = accepted >= j
            n = int(reached.sum())
            if n == 0:
                zs.append(math.inf)
                continue
            zs.append(_statistics.binomial_z(float((accepted[reached] > j).mean()), rates[j], n))
        worst_z = max(zs, key=abs)
        results.append(PropertyResult(
            "acceptance rate = sum(min(p, q))", abs(worst_z) <= _MAX_SIGMA,
            f"|z| = {abs(worst_z):.2f}",
            f"per-position acceptance given the position was reached vs sum(min(p_j, q_j)) = "
            f"{', '.join(f'{r:.4f}' for r in rates)}; mean accepted length {mean_length:.4f} "
            f"(expected {expected:.4f}); |z| must not exceed {_MAX_SIGMA:g}"))
    else:
        z = _statistics.mean_z(accepted, expected)
        results.append(PropertyResult(
            "accepts at least token-wise rejection", z >= -_MAX_SIGMA,
            f"z = {z:.2f}",
            f"mean accepted length {mean_length:.4f} vs token-wise rejection's "
            f"{expected:.4f}; block verification must not accept fewer (z >= -{_MAX_SIGMA:g})"))
    return results


# --------------------------------------------------------------------------------------
# The bug catalogue
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Case:
    """Regression rows: one target/draft pair, drafts, uniforms and a rule for the output."""

    p: np.ndarray
    q: np.ndarray | None
    drafts: tuple[int, ...]
    uniforms: tuple[tuple[float, ...], ...]
    allowed: Callable[[np.ndarray], bool]
    what: str
    #: The rule when the verifier draws its own uniforms; None: explicit uniforms only.
    loose: Callable[[np.ndarray], bool] | None = None


def _recovered_in(tokens: set[int], position: int) -> Callable[[np.ndarray], bool]:
    """Where the row stops at ``position`` (rejected there), it emits one of ``tokens``."""

    def rule(row: np.ndarray) -> bool:
        emitted = row[row != -1]
        return len(emitted) != position + 1 or int(emitted[-1]) in tokens

    return rule


def _first_token_in(tokens: set[int], length: int) -> Callable[[np.ndarray], bool]:
    def rule(row: np.ndarray) -> bool:
        emitted = row[row != -1]
        return len(emitted) == length and int(emitted[-1]) in tokens
    return rule


_GRID16 = tuple((i + 0.5) / 16 for i in range(16))


def _catalogue(kind: str) -> dict[str, list[_Case]]:
    p_zero = np.array([[0.0, 0.5, 0.0, 0.5], [0.25] * 4])
    q_spread = np.array([[0.25, 0.25, 0.25, 0.25]])
    catalogue = {
        "zero-probability tokens never emitted": [
            _Case(p_zero, q_spread, (0,), tuple((u, v) for u in (0.0, 0.5) for v in _GRID16),
                  _first_token_in({1, 3}, 1), "p(x) = 0 < q(x): reject, recover in supp p",
                  _first_token_in({1, 3}, 1)),
            _Case(p_zero, q_spread, (2,), ((0.0, 0.0), (0.0, _BELOW_ONE)),
                  _first_token_in({1, 3}, 1), "p(x) = 0, u = 0"),
            _Case(p_zero, None, (0,), ((0.0, 0.0), (0.0, _BELOW_ONE), (0.3, 0.7)),
                  _first_token_in({1, 3}, 1), "point-mass draft on p = 0",
                  _first_token_in({1, 3}, 1)),
        ],
        "boundary uniforms (0 and 1 - 2^-53)": [
            _Case(np.array([[0.0, 0.5, 0.0, 0.5, 0.0], [0.2] * 5]), np.array([[0.2] * 5]),
                  (0,), ((0.0, 0.0), (_BELOW_ONE, _BELOW_ONE), (0.0, _BELOW_ONE)),
                  _first_token_in({1, 3}, 1), "residual weight 0 at both ends"),
            _Case(np.array([[0.25, 0.5, 0.25], [0.2, 0.3, 0.5]]),
                  np.array([[0.25, 0.25, 0.5]]), (1,), ((_BELOW_ONE, 0.5), (0.0, 0.5)),
                  _first_token_in({0, 1, 2}, 2), "p(x) >= q(x): accept at u = 1 - 2^-53"),
        ],
        "q = 0 < p always accepted": [
            _Case(np.array([[0.25, 0.25, 0.5], [0.2, 0.3, 0.5]]), np.array([[0.0, 0.5, 0.5]]),
                  (0,), tuple((u, 0.5) for u in (0.0, 0.5, _BELOW_ONE)),
                  _first_token_in({0, 1, 2}, 2), "draft x = 0 with q(x) = 0 < p(x)",
                  _first_token_in({0, 1, 2}, 2)),
        ],
        "point-mass rule not applied to sampled drafts": [
            # Correct: accept with 0.5, residual max(p - q, 0) = token 0 only.  Point-mass
            # rules accept with p(x) = 0.25 and recover from p without x (tokens 0 or 2).
            _Case(np.array([[0.5, 0.25, 0.25, 0.0], [0.25] * 4]),
                  np.array([[0.25, 0.5, 0.25, 0.0]]), (1,),
                  tuple((u, v) for u in (0.3, 0.45) for v in (0.1, 0.9)),
                  _first_token_in({0, 1, 2, 3}, 2), "u < 0.5 accepts"),
            _Case(np.array([[0.5, 0.25, 0.25, 0.0], [0.25] * 4]),
                  np.array([[0.25, 0.5, 0.25, 0.0]]), (1,),
                  tuple((u, v) for u in (0.6, 0.9) for v in _GRID16),
                  _first_token_in({0}, 1), "rejected: residual is token 0 only",
                  _recovered_in({0}, 0)),
        ],
        "residual from the right row": [
            # Position 0 always accepts; the residual of position 1 is token 2 alone, that
            # of position 0 token 1 alone: a row mix-up emits 1 or 3.
            _Case(np.array([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.75, 0.25], [0.25] * 4]),
                  np.array([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.25, 0.75]]), (1, 3),
                  tuple((0.5, u, v) for u in (0.4, 0.8) for v in _GRID16),
                  _first_token_in({2}, 2), "reject at 1: recover max(p_1 - q_1, 0)",
                  _recovered_in({2}, 1)),
        ],
    }
    # A draft outside both supports (q(x) = p(x) = 0) fails a position's own test
    # (u * 0 < 0); a verifier that accepts a prefix as a whole need not define that 0 / 0.
    if not registry.get(kind).causal_counts:
        catalogue["zero residual falls back to p (not token 0)"] = [
            _Case(np.array([[0.0, 0.5, 0.25, 0.25], [0.25] * 4]),
                  np.array([[0.0, 0.5, 0.25, 0.25]]), (0,), tuple((0.5, v) for v in _GRID16),
                  _first_token_in({1, 2, 3}, 1), "p == q, draft off both supports",
                  _first_token_in({1, 2, 3}, 1)),
        ]
    return catalogue


def _run_case(target: PaddedTarget, case: _Case, copies: int) -> tuple[np.ndarray, np.ndarray]:
    k = len(case.drafts)
    explicit = target.takes_uniforms
    uniforms = np.array(case.uniforms, dtype=np.float64) if explicit else None
    n = uniforms.shape[0] if uniforms is not None else copies
    p = np.ascontiguousarray(np.broadcast_to(case.p, (n, *case.p.shape)))
    q = None
    if case.q is not None:
        q = np.ascontiguousarray(np.broadcast_to(case.q, (n, *case.q.shape)))
    ids = np.tile(np.array(case.drafts, dtype=np.int64), (n, 1))
    bonus = np.full((n, 1), int(np.argmax(case.p[k])), dtype=np.int64)
    return target(p, bonus, q, ids, uniforms), ids


def _check_catalogue(target: PaddedTarget, kind: str, outputs: list) -> list[PropertyResult]:
    results = []
    for name, cases in _catalogue(kind).items():
        rows, problems, notes, ran = 0, [], [], []
        for case in cases:
            if not target.takes_uniforms and case.loose is None:
                continue
            ran.append(case.what)
            try:
                output, ids = _run_case(target, case, copies=2000)
            except Exception as error:  # a crash on a regression input is a finding
                if case.q is None:
                    notes.append(f"draft_probs=None not supported ({type(error).__name__})")
                else:
                    problems.append(f"{case.what}: raised {type(error).__name__}: {error}")
                continue
            outputs.append((output, ids, name, case.p.shape[1]))
            rows += output.shape[0]
            # Cases without a loose rule were skipped above when the verifier draws its own.
            rule = case.allowed if target.takes_uniforms or case.loose is None else case.loose
            bad = [i for i, row in enumerate(output) if not rule(row)]
            if bad:
                where = (f" at uniforms {list(case.uniforms[bad[0]])}"
                         if target.takes_uniforms else "")
                problems.append(f"{case.what}: {len(bad)}/{output.shape[0]} rows wrong, e.g. "
                                f"{output[bad[0]].tolist()}{where}")
        if not ran:
            results.append(skipped(name, "needs explicit uniforms (uniforms= keyword)"))
            continue
        mode = "explicit uniforms" if target.takes_uniforms else "own randomness, 2000 copies"
        detail = "; ".join(problems) if problems else (
            f"{rows} rows ({mode}): " + "; ".join(ran))
        if notes:
            detail += "; " + "; ".join(sorted(set(notes)))
        results.append(PropertyResult(name, not problems,
                                      f"{len(problems)}/{len(ran)} cases fail", detail))
    if target.takes_uniforms:
        results.append(_check_reused_uniform(target))
    else:
        results.append(skipped("residual uses its own uniform",
                               "needs explicit uniforms (uniforms= keyword)"))
    return results


def _check_reused_uniform(target: PaddedTarget) -> PropertyResult:
    """Rejected at position 0 whatever u in [0.5, 1); the residual (tokens 0, 1 with weights
    1/2, 1/2) must follow column k of the uniforms only."""
    p = np.array([[0.5, 0.5, 0.0, 0.0], [0.25] * 4])
    q = np.array([[0.0, 0.0, 0.5, 0.5]])
    us = np.array([0.55, 0.7, 0.85, 0.99])
    vs = np.array(_GRID16)
    uniforms = np.stack(np.meshgrid(us, vs, indexing="ij"), axis=-1).reshape(-1, 2)
    n = uniforms.shape[0]
    output = target(np.ascontiguousarray(np.broadcast_to(p, (n, 2, 4))),
                    np.zeros((n, 1), dtype=np.int64),
                    np.ascontiguousarray(np.broadcast_to(q, (n, 1, 4))),
                    np.full((n, 1), 2, dtype=np.int64), uniforms)
    tokens = output[:, 0].reshape(us.size, vs.size)
    varies_with_u = bool(np.any(tokens != tokens[:1]))
    share = [float(np.mean(row == 0)) for row in tokens]
    ok = not varies_with_u and all(abs(s - 0.5) < 1e-12 for s in share)
    return PropertyResult(
        "residual uses its own uniform", ok,
        "u-dependent" if varies_with_u else f"P(0) = {share[0]:.3f}",
        f"draft rejected for every u; recovered token vs u in {us.tolist()} (must not change) "
        f"and v on 16 strata (token 0 on half of them); found P(token 0) per u = {share}")


# --------------------------------------------------------------------------------------
# Batch invariance and seeds
# --------------------------------------------------------------------------------------


def _mixed_batch(rng: np.random.Generator, k: int, vocab_size: int, size: int) -> dict:
    p = rng.dirichlet(np.full(vocab_size, 0.5), size=(size, k + 1))
    q = rng.dirichlet(np.full(vocab_size, 0.5), size=(size, k))
    ids = np.array([[_monte_carlo.draw_from(q[b, i], 1, rng)[0] for i in range(k)]
                    for b in range(size)], dtype=np.int64)
    bonus = rng.integers(0, vocab_size, (size, 1)).astype(np.int64)
    return {"target": p, "bonus": bonus, "draft_probs": q, "ids": ids,
            "uniforms": rng.random((size, k + 1))}


def _subset(batch: dict, rows: np.ndarray) -> dict:
    return {name: np.ascontiguousarray(value[rows]) for name, value in batch.items()}


def _call(target: PaddedTarget, batch: dict, entry: registry.Verifier,
          **keywords: Any) -> np.ndarray:
    uniforms = batch["uniforms"] if (target.takes_uniforms and entry.stochastic
                                     and not keywords) else None
    draft_probs = batch["draft_probs"] if entry.reads_draft_probs else None
    return target(batch["target"], batch["bonus"], draft_probs, batch["ids"], uniforms,
                  **keywords)


def _check_batch_invariance(target: PaddedTarget, kind: str, k: int, vocab_size: int,
                            rng: np.random.Generator, outputs: list) -> list[PropertyResult]:
    entry = registry.get(kind)
    size = 32
    batch = _mixed_batch(rng, k, vocab_size, size)
    results = []
    if not entry.stochastic or target.takes_uniforms:
        full = _call(target, batch, entry)
        outputs.append((full, batch["ids"], "batch invariance", vocab_size))
        order = rng.permutation(size)
        permuted = _call(target, _subset(batch, order), entry)
        singles = np.concatenate([_call(target, _subset(batch, np.array([b])), entry)
                                  for b in range(8)])
        differing = sorted(
            set(np.flatnonzero(np.any(permuted != full[order], axis=1)).tolist())
            | set(np.flatnonzero(np.any(singles != full[:8], axis=1)).tolist()))
        results.append(PropertyResult(
            "batch invariance", not differing, f"{len(differing)} rows differ",
            f"{size} random rows (k = {k}, V = {vocab_size}) in a batch, permuted, and 8 of them "
            f"alone, {'same uniforms' if entry.stochastic else 'no uniforms'}: outputs must be "
            f"equal"))
    else:
        results.append(skipped("batch invariance", "needs explicit uniforms"))
    if not entry.stochastic:
        return results
    results += seed_checks(
        target.sources(),
        lambda rows, **keywords: _call(target, _subset(batch, np.asarray(rows)), entry,
                                       **keywords),
        size)
    return results


def seed_checks(sources: list[str], call: Callable[..., np.ndarray],
                size: int) -> list[PropertyResult]:
    """Reproducibility of each seeded source, and batch invariance of the per-row ones.

    ``call(rows, **keywords)`` runs the verifier on those rows of a batch of ``size``
    (rows ``0 .. 7`` alone are compared with the batch) and returns its outputs.
    """
    results = []
    for source in SEEDED_SOURCES:
        if source not in sources:
            continue
        every = list(range(size))
        batch_seeds = source_keywords(source, size, 1234)
        first = call(every, **batch_seeds)
        again = call(every, **source_keywords(source, size, 1234))
        alone_seeds = [{0: row_seed(source, 1234, b)} for b in range(8)]
        alone = np.concatenate([call([b], **{source: seeds})
                                for b, seeds in enumerate(alone_seeds)])
        bad = np.flatnonzero(np.any(first != again, axis=1) | np.pad(
            np.any(alone != first[:8], axis=1), (0, size - 8)))
        results.append(PropertyResult(
            f"{source} rows reproducible and batch-invariant", bad.size == 0,
            f"{bad.size} rows differ",
            f"{source}: the same seeds give the same rows, alone or in a batch of {size}"))
        if source == "seeded_seqs":
            results.append(_draw_count_result(batch_seeds[source], alone_seeds, size))
    if "generator" in sources:
        every = list(range(size))
        first = call(every, generator=np.random.default_rng(99))
        again = call(every, generator=np.random.default_rng(99))
        bad = np.flatnonzero(np.any(first != again, axis=1))
        results.append(PropertyResult(
            "generator reproducible", bad.size == 0, f"{bad.size} rows differ",
            "two calls with equally seeded generator= must give equal outputs"))
    if not set(sources) & {"generator", *SEEDED_SOURCES}:
        results.append(skipped("seed reproducibility",
                               "the verifier takes none of generator, seeded_seqs, "
                               "counter_seeds"))
    return results


def _draw_count_result(batch: dict[int, Any], alone: list[dict[int, Any]],
                       size: int) -> PropertyResult:
    """Whether each seeded row drew as much from its generator in the batch as alone.

    A row's generator belongs to its request: what the verifier draws from it must depend
    on that request only (vLLM's contract for seeded requests), or the request's later
    steps, and so its text, change with the batch it is scheduled in, though every output
    of this call looks right.  The state after the call tells the number of draws.

    Parameters
    ----------
    batch : dict of int to numpy.random.Generator
        The generators of the batch call, by row, after it.
    alone : list of dict of int to numpy.random.Generator
        Row ``b``'s generator of its call alone (equally seeded), after it.
    size : int
        Rows of the batch.

    Returns
    -------
    PropertyResult
    """
    differ = [b for b, seeds in enumerate(alone)
              if batch[b].bit_generator.state != seeds[0].bit_generator.state]
    return PropertyResult(
        "seeded_seqs draws per row independent of the batch", not differ,
        f"{len(differ)}/{len(alone)} rows differ",
        f"the state of each of {len(alone)} rows' generators after the call, in a batch of "
        f"{size} and alone: a row draws the same number of values either way"
        + (f"; e.g. row {differ[0]}" if differ else ""))


def _check_format(target: PaddedTarget, outputs: list) -> PropertyResult:
    problems = sorted(set(target.format_errors))
    if not outputs and not problems:
        if target.limit.hung is not None:
            return skipped("output format", f"no output to check: {target.limit.hung}")
        problems.append("no call returned an output to check")
    rows = 0
    for output, ids, label, vocab_size in outputs:
        rows += output.shape[0]
        problem = _monte_carlo.format_problem(output, ids, vocab_size)
        if problem:
            problems.append(f"{label}: {problem}")
    dtypes = ", ".join(sorted(target.raw_dtypes))
    return PropertyResult(
        "output format", not problems, f"{len(problems)}/{len(outputs)} batches bad",
        "; ".join(problems) if problems else
        f"{rows} rows: integer dtype ({dtypes}), [B, k+1], accepted draft prefix, one token, "
        f"-1 padding")


# --------------------------------------------------------------------------------------
# Greedy
# --------------------------------------------------------------------------------------


def _greedy_expected(target: np.ndarray, bonus: np.ndarray, ids: np.ndarray) -> np.ndarray:
    k = ids.shape[1]
    argmax = target[:, :k].argmax(axis=-1)
    output = np.full((ids.shape[0], k + 1), -1, dtype=np.int64)
    for b in range(ids.shape[0]):
        for i in range(k):
            if ids[b, i] != argmax[b, i]:
                output[b, i] = argmax[b, i]
                break
            output[b, i] = ids[b, i]
        else:
            output[b, k] = bonus[b, 0]
    return output


def _check_greedy(target: PaddedTarget, k: int, vocab_size: int, rng: np.random.Generator,
                  outputs: list) -> list[PropertyResult]:
    size = 256
    logits = rng.standard_normal((size, k + 1, vocab_size)) * rng.uniform(0.5, 6, (size, k + 1, 1))
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = (probs / probs.sum(axis=-1, keepdims=True)).astype(np.float32)
    argmax = probs[:, :k].argmax(axis=-1)
    ids = np.where(rng.random((size, k)) < 0.8, argmax,
                   rng.integers(0, vocab_size, (size, k))).astype(np.int64)
    bonus = rng.integers(0, vocab_size, (size, 1)).astype(np.int64)
    output = target(probs, bonus, None, ids)
    outputs.append((output, ids, "greedy random batch", vocab_size))
    bad = np.flatnonzero(np.any(output != _greedy_expected(probs, bonus, ids), axis=1))
    results = [PropertyResult(
        "argmax rule", bad.size == 0, f"{bad.size} rows differ",
        f"{size} random float32 rows (k = {k}, V = {vocab_size}): accept x_i iff x_i = argmax "
        f"p_i, recover argmax at the first mismatch, bonus if none"
        + (f"; e.g. row {bad[0]}: {output[bad[0]].tolist()}, expected "
           f"{_greedy_expected(probs, bonus, ids)[bad[0]].tolist()}" if bad.size else ""))]
    # Ties: two maxima in every row; drafts take the first, the second or another index.
    tie = np.zeros((12, k + 1, vocab_size), dtype=np.float32)
    tie[:] = 0.5 / max(vocab_size - 2, 1) if vocab_size > 2 else 0.0
    first, second = 1, vocab_size - 1
    tie[:, :, first] = tie[:, :, second] = 0.25
    tie /= tie.sum(axis=-1, keepdims=True)
    choice = rng.integers(0, 3, (12, k))
    tie_ids = np.where(choice == 0, first, np.where(choice == 1, second, 0)).astype(np.int64)
    tie_ids[0] = first
    tie_ids[1, 0] = second
    tie_bonus = np.zeros((12, 1), dtype=np.int64)
    tie_output = target(tie, tie_bonus, None, tie_ids)
    outputs.append((tie_output, tie_ids, "greedy ties", vocab_size))
    expected = _greedy_expected(tie, tie_bonus, tie_ids)
    bad = np.flatnonzero(np.any(tie_output != expected, axis=1))
    results.append(PropertyResult(
        "first-index ties", bad.size == 0, f"{bad.size} rows differ",
        f"12 rows with two equal maxima (ids {first} and {second}): the first index is the "
        f"argmax" + (f"; e.g. {tie_output[bad[0]].tolist()}, expected "
                     f"{expected[bad[0]].tolist()}" if bad.size else "")))
    return results




# --------------------------------------------------------------------------------------
# Deterministic verifiers with parameters: the reference's rule
# --------------------------------------------------------------------------------------


def _check_reference_rule(target: PaddedTarget, kind: str, k: int, vocab_size: int,
                          rng: np.random.Generator, outputs: list) -> PropertyResult:
    """A deterministic verifier (typical acceptance) against its registry reference, at the
    registry's default parameters, on float32 rows of varied sharpness; rows with a
    decision within rounding of its boundary (``decisions_name``) are left out."""
    entry = registry.get(kind)
    size = 256
    logits = rng.standard_normal((size, k + 1, vocab_size)) * rng.uniform(0.2, 6, (size, k + 1, 1))
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = (probs / probs.sum(axis=-1, keepdims=True)).astype(np.float32)
    argmax = probs[:, :k].argmax(axis=-1)
    ids = np.where(rng.random((size, k)) < 0.7, argmax,
                   rng.integers(0, vocab_size, (size, k))).astype(np.int64)
    bonus = rng.integers(0, vocab_size, (size, 1)).astype(np.int64)
    output = target(probs, bonus, None, ids)
    outputs.append((output, ids, f"{kind} random batch", vocab_size))
    expected = np.asarray(_reference.reference_for(entry)(
        probs, bonus, None, ids, None)[0], dtype=np.int64)
    decisions = _reference.decisions_for(entry)
    clear = np.array([not decisions(probs[b], None, ids[b], None).knife_edge(1e-5)
                      for b in range(size)])
    bad = np.flatnonzero(np.any(output != expected, axis=1) & clear)
    accepted = float(np.mean((expected[clear] != -1).sum(axis=1) - 1))
    return PropertyResult(
        f"{kind} rule of the reference", bad.size == 0, f"{bad.size} rows differ",
        f"{int(clear.sum())} random float32 rows (k = {k}, V = {vocab_size}; "
        f"{size - int(clear.sum())} on a knife edge left out) at the default parameters "
        f"{dict(zip(entry.parameter_names, entry.parameter_defaults))} vs "
        f"specdec_np._reference.chains.{entry.reference_name} (mean accepted {accepted:.2f})"
        + (f"; e.g. row {bad[0]}: {output[bad[0]].tolist()}, expected "
           f"{expected[bad[0]].tolist()}" if bad.size else ""))


# --------------------------------------------------------------------------------------
# The padded layout's run
# --------------------------------------------------------------------------------------


def run(target: PaddedTarget, kind: str, *, k: int, vocab_size: int, num_rows: int,
        rng: np.random.Generator, exact: bool = True) -> list[PropertyResult]:
    """Every padded property of ``kind`` on ``target``, in report order.

    Parameters
    ----------
    target : PaddedTarget
        The verifier under test, with its time limit.
    kind : str
        A registry verifier name.
    k, vocab_size, num_rows : int
        Sizes of the Monte Carlo and batch checks.
    rng : numpy.random.Generator
        Every random input.
    exact : bool
        Run the exact-law check (it needs explicit uniforms).

    Returns
    -------
    list of PropertyResult
    """
    entry = registry.get(kind)
    limit = target.limit
    outputs: list = []
    rows: list[PropertyResult] = []
    if entry.greedy:
        rows += guard("argmax rule", lambda: _check_greedy(target, k, vocab_size, rng, outputs),
                      limit)
    elif not entry.stochastic:
        rows += guard(f"{kind} rule of the reference", lambda: _check_reference_rule(
            target, kind, k, vocab_size, rng, outputs), limit)
    else:
        if target.takes_uniforms and exact:
            rows += guard("exact law equals the target",
                          lambda: _check_exact_law(target, kind, vocab_size, rng), limit)
        else:
            rows.append(skipped("exact law equals the target",
                                "needs explicit uniforms (uniforms= keyword); Monte Carlo only"))
        rows += guard("Monte Carlo chi-square", lambda: _check_monte_carlo(
            target, kind, k, vocab_size, num_rows, rng, outputs), limit)
        rows += guard("bug catalogue", lambda: _check_catalogue(target, kind, outputs), limit)
    rows += guard("batch invariance", lambda: _check_batch_invariance(
        target, kind, k, vocab_size, rng, outputs), limit)
    rows.append(_check_format(target, outputs))
    return rows


def check(verifier: Callable[..., Any], kind: str, *, dtype: Any, limit: TimeLimit, k: int,
          vocab_size: int, num_rows: int, rng: np.random.Generator) -> list[PropertyResult]:
    """The padded layout's entry of the kit (``registry.get_layout("padded").kit``): every
    property of ``kind`` on ``verifier``, in report order, with the arguments every
    layout's kit takes.

    Parameters
    ----------
    verifier : callable
    kind : str
    dtype : numpy dtype
    limit : TimeLimit
    k, vocab_size, num_rows : int
    rng : numpy.random.Generator

    Returns
    -------
    list of PropertyResult
    """
    target = PaddedTarget(verifier, kind, dtype, limit)
    return run(target, kind, k=k, vocab_size=vocab_size, num_rows=num_rows, rng=rng)
