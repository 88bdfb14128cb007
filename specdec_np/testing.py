"""A conformance kit for speculative-decoding verifiers written anywhere.

:func:`check_verifier` treats a verifier as a black box and reports, property by property,
whether its outputs have the distribution and the format a lossless verifier must have.
It needs only NumPy; torch, JAX or CuPy verifiers are checked through
:class:`TorchAdapter` and :class:`DLPackAdapter`.  ``docs/testing.md`` is the user guide.

The verifier's calling convention (the stateless chain form)::

    verifier(target_with_bonus_probs,  # float64 (or probs_dtype) [B, k+1, V]
             bonus_token_ids,          # int64 [B, 1]
             draft_probs,              # same dtype [B, k, V], or None (point-mass drafts)
             draft_token_ids,          # int64 [B, k]
             *, uniforms=...)          # float64 [B, k+1]: columns 0..k-1 accept, k residual

For ``kind="greedy"`` the call is ``verifier(target, bonus, draft_probs, draft_token_ids)``
(``draft_probs`` is None) or, for a callable with three positional parameters,
``verifier(target, bonus, draft_token_ids)``.  The verifier may return the ``[B, k+1]``
output (NumPy, or anything DLPack or ``__array__`` can read) or an object with an
``output_token_ids`` attribute.  A callable without a ``uniforms`` keyword (seen by
``inspect.signature``, or declared by a ``takes_uniforms`` attribute) is tested by Monte
Carlo only.  ``seeded_seqs`` and ``generator`` keywords, where present, are exercised
with :class:`numpy.random.Generator` objects.

The exact laws and threshold grids are those of :mod:`specdec_np._oracles`, the chi-square
tests and sigma rules those of :mod:`specdec_np._statistics`, the draws and the output
format rule those of :mod:`specdec_np._monte_carlo`; per-kind facts come from the
registry entry (``stochastic``, ``reads_draft_probs``, ``causal_counts``,
``oracle_name``).  ``specdec-np check`` runs this kit over the registry
(:mod:`specdec_np._self_check`).
"""

from __future__ import annotations

import importlib
import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _monte_carlo, _oracles, _statistics, registry

__all__ = [
    "KINDS",
    "ConformanceError",
    "ConformanceReport",
    "DLPackAdapter",
    "PropertyResult",
    "TorchAdapter",
    "check_verifier",
]

#: The kinds the kit checks: every lossless verifier of the registry (against its exact
#: law) and greedy verification (against the argmax rule).
KINDS = (*registry.names(lossless=True), "greedy")

#: The largest double below 1, the top of the uniforms' range.
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
_ALPHA = 1e-4
_MAX_SIGMA = 5.0
_LAW_TOLERANCE = 1e-9


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PropertyResult:  # numpydoc ignore=PR01
    """One row of a :class:`ConformanceReport`.

    Attributes
    ----------
    name : str
        The property checked.
    passed : bool
        False when the verifier violates the property (or crashed while checked).
    figure : str
        The measured number, short (``"max err 3e-17"``, ``"p = 0.41"``, ``"skipped"``).
    detail : str
        What was fed and what was found, for a human.
    """

    name: str
    passed: bool
    figure: str
    detail: str


class ConformanceError(AssertionError):
    """Raised by :meth:`ConformanceReport.raise_if_failed`; the message is the report."""


@dataclass
class ConformanceReport:  # numpydoc ignore=PR01
    """The outcome of :func:`check_verifier`.

    Attributes
    ----------
    kind : str
        The kind checked, one of :data:`KINDS`.
    verifier : str
        The verifier's name.
    rows : list of PropertyResult
        One per property, in the order checked.
    seconds : float
        Wall-clock time of the whole run.
    """

    kind: str
    verifier: str
    rows: list[PropertyResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """True iff every property passed."""
        return all(row.passed for row in self.rows)

    def failed(self) -> list[str]:
        """Names of the failed properties.

        Returns
        -------
        list of str
            In the order checked; empty when every property passed.
        """
        return [row.name for row in self.rows if not row.passed]

    def __str__(self) -> str:
        header = ("property", "result", "figure", "detail")
        cells = [(r.name, "PASS" if r.passed else "FAIL", r.figure, r.detail) for r in self.rows]
        widths = [max(len(row[i]) for row in [header, *cells]) for i in range(3)]

        def line(row: tuple[str, ...]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(row[:3], widths)) + "  " + row[3]

        failures = len(self.failed())
        verdict = "all passed" if not failures else f"{failures} FAILED"
        return "\n".join(
            [
                f"conformance of {self.verifier} (kind {self.kind!r})",
                line(header),
                line(tuple("-" * w for w in widths) + ("-" * 6,)),
                *(line(row) for row in cells),
                f"{len(self.rows)} properties, {verdict} [{self.seconds:.1f} s]",
            ]
        )

    def raise_if_failed(self) -> None:
        """Raise :class:`ConformanceError` (an ``AssertionError``) if any property failed.

        Raises
        ------
        ConformanceError
            With the failed property names and the whole report as the message.
        """
        if not self.passed:
            raise ConformanceError(
                f"{self.verifier} fails {', '.join(self.failed())}\n{self}"
            )


# --------------------------------------------------------------------------------------
# Adapters
# --------------------------------------------------------------------------------------


def _has_keyword(fn: Any, name: str) -> bool:
    declared = getattr(fn, f"takes_{name}", None)
    if declared is not None:
        return bool(declared)
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get(name)
    return parameter is not None and parameter.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


def _positional_count(fn: Any) -> int | None:
    declared = getattr(fn, "positional_arguments", None)
    if declared is not None:
        return int(declared)
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = [p.kind for p in parameters]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return None
    return sum(
        k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for k in kinds
    )


class _Adapter:
    """Shared part of the adapters: convert arguments in, outputs out, declare keywords."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable; found {type(fn).__name__}")
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.takes_uniforms = _has_keyword(fn, "uniforms")
        self.takes_seeded_seqs = _has_keyword(fn, "seeded_seqs")
        self.takes_generator = _has_keyword(fn, "generator")
        self.positional_arguments = _positional_count(fn)

    def _to(self, value: Any) -> Any:
        raise NotImplementedError

    def _generator(self, generator: np.random.Generator) -> Any:
        return generator

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        converted = [None if a is None else self._to(a) for a in args]
        keywords: dict[str, Any] = {}
        for name, value in kwargs.items():
            if name == "uniforms":
                keywords[name] = self._to(value)
            elif name == "generator":
                keywords[name] = self._generator(value)
            elif name == "seeded_seqs":
                keywords[name] = {row: self._generator(g) for row, g in value.items()}
            else:
                keywords[name] = value
        result = self.fn(*converted, **keywords)
        output = getattr(result, "output_token_ids", result)
        return _monte_carlo.to_numpy(output)


def _torch() -> Any:
    """torch, imported only when an adapter is used: it is never a dependency."""
    return importlib.import_module("torch")


class TorchAdapter(_Adapter):
    """Check a torch verifier: NumPy inputs become tensors on ``device``, outputs NumPy.

    torch is imported on the first call, never by ``import specdec_np.testing``.
    ``numpy.random.Generator`` objects passed as ``generator=`` or in ``seeded_seqs`` are
    turned into ``torch.Generator`` objects on ``device`` seeded by one 63-bit draw each.

    Parameters
    ----------
    fn : callable
        The torch verifier, with the stateless chain signature (see the module docstring).
    device : str
        Where the tensors go (``"cpu"``, ``"cuda"``, ...).
    """

    def __init__(self, fn: Callable[..., Any], device: str = "cpu") -> None:
        super().__init__(fn)
        self.device = device

    def _to(self, value: Any) -> Any:
        torch = _torch()
        return torch.from_numpy(np.ascontiguousarray(value)).to(self.device)

    def _generator(self, generator: np.random.Generator) -> Any:
        torch = _torch()
        seeded = torch.Generator(device=self.device)
        seeded.manual_seed(int(generator.integers(2**63 - 1)))
        return seeded


class DLPackAdapter(_Adapter):
    """Check a verifier on any DLPack array library (JAX, CuPy, ...).

    Parameters
    ----------
    fn : callable
        The verifier, with the stateless chain signature (see the module docstring).
    from_numpy : callable
        Turns a NumPy array into the library's array (``jax.numpy.asarray``,
        ``cupy.asarray``, ``torch.from_numpy``).  Outputs come back through DLPack, or
        ``.get()`` / ``__array__`` where DLPack cannot reach the host.
    """

    def __init__(self, fn: Callable[..., Any], from_numpy: Callable[[np.ndarray], Any]) -> None:
        super().__init__(fn)
        if not callable(from_numpy):
            raise TypeError(f"from_numpy must be callable; found {type(from_numpy).__name__}")
        self.from_numpy = from_numpy

    def _to(self, value: Any) -> Any:
        return self.from_numpy(np.ascontiguousarray(value))


class _Target:
    """The verifier under test, called with NumPy inputs, returning int64 NumPy outputs."""

    def __init__(self, verifier: Callable[..., Any], kind: str, probs_dtype: Any) -> None:
        self.verifier = verifier
        self.probs_dtype = probs_dtype
        self.takes_uniforms = _has_keyword(verifier, "uniforms")
        self.takes_seeded_seqs = _has_keyword(verifier, "seeded_seqs")
        self.takes_generator = _has_keyword(verifier, "generator")
        # A verifier that reads no draft rows may leave them out of its signature.
        self.three_arguments = (not registry.get(kind).reads_draft_probs
                                and _positional_count(verifier) == 3)
        self.raw_dtypes: set[str] = set()
        self.format_errors: list[str] = []

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
            result = self.verifier(target, bonus, draft_ids, **keywords)
        else:
            result = self.verifier(target, bonus, draft_probs, draft_ids, **keywords)
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

    The oracle ``law(p [k+1, V], q [k, V])`` of :mod:`specdec_np._oracles` returns a
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


def _law_cases(vocab_size: int, rng: np.random.Generator) -> list[tuple]:
    """(label, p [k+1, V], q [k, V]) cases of the exact-law check."""

    def sparse(size: int) -> np.ndarray:
        # Multiples of 1/1024 summing to exactly 1: the same numbers in float32 and float64,
        # so the law of a lossless verifier is the target's to rounding in either dtype.
        row = rng.dirichlet(np.ones(size))
        row[rng.integers(size)] = 0.0
        counts = np.floor(row / row.sum() * 1024)
        counts[np.argmax(counts)] += 1024 - counts.sum()
        return counts / 1024

    size = max(3, min(vocab_size, 4))
    cases = [
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
    return cases


def _check_exact_law(target: _Target, kind: str, vocab_size: int,
                     rng: np.random.Generator) -> list[PropertyResult]:
    worst, worst_oracle, rows_fed = 0.0, 0.0, 0
    worst_label = ""
    oracle_notes: list[str] = []
    oracle_used = False
    for label, p, q in _law_cases(vocab_size, rng):
        batch = _oracles.threshold_batch(p, q, refine=8)
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
        results.append(PropertyResult("exact law equals the oracle", True, "skipped",
                                      sorted(set(oracle_notes))[0]))
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


def _check_monte_carlo(target: _Target, kind: str, k: int, vocab_size: int, num_rows: int,
                       rng: np.random.Generator, outputs: list) -> list[PropertyResult]:
    p, q = _random_rows(rng, k, vocab_size, target.probs_dtype)
    ids = _monte_carlo.draw_drafts(q, num_rows, rng)
    bonus = _monte_carlo.draw_from(p[k], num_rows, rng).reshape(num_rows, 1)
    uniforms = rng.random((num_rows, k + 1))
    output = target(np.ascontiguousarray(np.broadcast_to(p, (num_rows, *p.shape))), bonus,
                    np.ascontiguousarray(np.broadcast_to(q, (num_rows, *q.shape))), ids,
                    uniforms if target.takes_uniforms else None)
    outputs.append((output, ids, "Monte Carlo batch", vocab_size))
    completed = _monte_carlo.complete_with_target(output, p, rng)
    if np.any(completed < 0) or np.any(completed >= vocab_size):
        p_values = [0.0]
        worst = "malformed output"
    else:
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
        worst = labels[int(np.argmin(p_values))]
    source = "explicit uniforms" if target.takes_uniforms else "its own randomness"
    results = [PropertyResult(
        "Monte Carlo chi-square", min(p_values) > _ALPHA, f"min p = {min(p_values):.3g}",
        f"{num_rows} rows, k = {k}, V = {vocab_size}, {source}; {2 * k + 1} chi-square tests of "
        f"the output completed by target draws (each token and each adjacent pair) vs the "
        f"target; each p must exceed {_ALPHA:g}; lowest: {worst}")]
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


def _run_case(target: _Target, case: _Case, copies: int) -> tuple[np.ndarray, np.ndarray]:
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


def _check_catalogue(target: _Target, kind: str, outputs: list) -> list[PropertyResult]:
    results = []
    for name, cases in _catalogue(kind).items():
        rows, problems, skipped, ran = 0, [], [], []
        for case in cases:
            if not target.takes_uniforms and case.loose is None:
                continue
            ran.append(case.what)
            try:
                output, ids = _run_case(target, case, copies=2000)
            except Exception as error:  # a crash on a regression input is a finding
                if case.q is None:
                    skipped.append(f"draft_probs=None not supported ({type(error).__name__})")
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
            results.append(PropertyResult(name, True, "skipped",
                                          "needs explicit uniforms (uniforms= keyword)"))
            continue
        mode = "explicit uniforms" if target.takes_uniforms else "own randomness, 2000 copies"
        detail = "; ".join(problems) if problems else (
            f"{rows} rows ({mode}): " + "; ".join(ran))
        if skipped:
            detail += "; " + "; ".join(sorted(set(skipped)))
        results.append(PropertyResult(name, not problems,
                                      f"{len(problems)}/{len(ran)} cases fail", detail))
    if target.takes_uniforms:
        results.append(_check_reused_uniform(target))
    else:
        results.append(PropertyResult("residual uses its own uniform", True, "skipped",
                                      "needs explicit uniforms (uniforms= keyword)"))
    return results


def _check_reused_uniform(target: _Target) -> PropertyResult:
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


def _call(target: _Target, batch: dict, entry: registry.Verifier, **keywords: Any) -> np.ndarray:
    uniforms = batch["uniforms"] if (target.takes_uniforms and entry.stochastic
                                     and "seeded_seqs" not in keywords
                                     and "generator" not in keywords) else None
    draft_probs = batch["draft_probs"] if entry.reads_draft_probs else None
    return target(batch["target"], batch["bonus"], draft_probs, batch["ids"], uniforms,
                  **keywords)


def _check_batch_invariance(target: _Target, kind: str, k: int, vocab_size: int,
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
        results.append(PropertyResult("batch invariance", True, "skipped",
                                      "needs explicit uniforms or seeded_seqs"))
    if not entry.stochastic:
        return results
    if target.takes_seeded_seqs:
        def seeds(rows: range) -> dict[int, np.random.Generator]:
            return {i: np.random.default_rng([1234, b]) for i, b in enumerate(rows)}
        first = _call(target, batch, entry, seeded_seqs=seeds(range(size)))
        again = _call(target, batch, entry, seeded_seqs=seeds(range(size)))
        alone = np.concatenate([_call(target, _subset(batch, np.array([b])), entry,
                                      seeded_seqs={0: np.random.default_rng([1234, b])})
                                for b in range(8)])
        bad = np.flatnonzero(np.any(first != again, axis=1) | np.pad(
            np.any(alone != first[:8], axis=1), (0, size - 8)))
        results.append(PropertyResult(
            "seeded rows reproducible and batch-invariant", bad.size == 0,
            f"{bad.size} rows differ",
            "seeded_seqs: the same generators give the same rows, alone or in the batch"))
    if target.takes_generator:
        first = _call(target, batch, entry, generator=np.random.default_rng(99))
        again = _call(target, batch, entry, generator=np.random.default_rng(99))
        bad = np.flatnonzero(np.any(first != again, axis=1))
        results.append(PropertyResult(
            "generator reproducible", bad.size == 0, f"{bad.size} rows differ",
            "two calls with equally seeded generator= must give equal outputs"))
    if not (target.takes_seeded_seqs or target.takes_generator):
        results.append(PropertyResult("seed reproducibility", True, "skipped",
                                      "the verifier takes neither seeded_seqs nor generator"))
    return results


def _check_format(target: _Target, outputs: list) -> PropertyResult:
    problems = sorted(set(target.format_errors))
    if not outputs and not problems:
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


def _check_greedy(target: _Target, k: int, vocab_size: int, rng: np.random.Generator,
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
# Entry point
# --------------------------------------------------------------------------------------


def _guard(name: str, step: Callable[[], Any]) -> list[PropertyResult]:
    try:
        outcome = step()
    except Exception as error:  # a crash is a failed property, with its reason
        return [PropertyResult(name, False, "raised", f"{type(error).__name__}: {error}")]
    return outcome if isinstance(outcome, list) else [outcome]


def check_verifier(
    verifier: Callable[..., Any],
    kind: str = "rejection",
    *,
    vocab_size: int = 8,
    k: int = 3,
    seed: int = 0,
    num_rows: int = 100_000,
    probs_dtype: Any = np.float64,
) -> ConformanceReport:
    """Run the conformance kit on a verifier and report every property.

    Parameters
    ----------
    verifier : callable
        The verifier with the stateless chain signature (see the module docstring), or an
        adapter (:class:`TorchAdapter`, :class:`DLPackAdapter`) around one.
    kind : str
        What the verifier claims to be, one of :data:`KINDS`: a lossless verifier of the
        registry (checked for the target's law) or greedy verification (checked against
        the argmax rule).
    vocab_size : int
        V of the Monte Carlo, batch-invariance and greedy batches (the exact law uses
        V <= 4 and k <= 2 to stay small).  At least 3.
    k : int
        Draft length of those batches; at least 1.
    seed : int
        Seed of every random input; the same seed gives the same report.
    num_rows : int
        Rows of the Monte Carlo batch; at least 1000.
    probs_dtype : {numpy.float64, numpy.float32}
        dtype of the probability arrays fed to the verifier (uniforms are always float64).
        The exact-law inputs are multiples of 1/1024, the same in both dtypes.

    Returns
    -------
    ConformanceReport
        ``report.passed`` is True iff every property passed; ``print(report)`` shows the
        table; ``report.raise_if_failed()`` raises with it.

    Raises
    ------
    TypeError
        If ``verifier`` is not callable.
    ValueError
        If ``kind`` is not one of :data:`KINDS` or a size is out of range.
    """
    if not callable(verifier):
        raise TypeError(f"verifier must be callable; found {type(verifier).__name__}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; found {kind!r}")
    for name, value, minimum in (("vocab_size", vocab_size, 3), ("k", k, 1),
                                 ("num_rows", num_rows, 1000)):
        if not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}; found {value!r}")
    if np.dtype(probs_dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"probs_dtype must be float32 or float64; found {probs_dtype!r}")
    start = time.perf_counter()
    target = _Target(verifier, kind, np.dtype(probs_dtype))
    label = getattr(verifier, "__qualname__", None) or getattr(verifier, "__name__", None)
    report = ConformanceReport(kind, str(label or type(verifier).__name__))
    rng = np.random.default_rng(seed)
    outputs: list = []
    rows = report.rows
    # The one deterministic kind, greedy, is checked against its rule: the argmax.
    if not registry.get(kind).stochastic:
        rows += _guard("argmax rule", lambda: _check_greedy(target, k, vocab_size, rng, outputs))
    else:
        if target.takes_uniforms:
            rows += _guard("exact law equals the target",
                           lambda: _check_exact_law(target, kind, vocab_size, rng))
        else:
            rows.append(PropertyResult("exact law equals the target", True, "skipped",
                                       "needs explicit uniforms (uniforms= keyword); "
                                       "Monte Carlo only"))
        rows += _guard("Monte Carlo chi-square", lambda: _check_monte_carlo(
            target, kind, k, vocab_size, num_rows, rng, outputs))
        rows += _guard("bug catalogue", lambda: _check_catalogue(target, kind, outputs))
    rows += _guard("batch invariance", lambda: _check_batch_invariance(
        target, kind, k, vocab_size, rng, outputs))
    rows.append(_guard("output format", lambda: _check_format(target, outputs))[0])
    report.seconds = time.perf_counter() - start
    return report
