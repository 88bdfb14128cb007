"""The conformance kit's drafting check: a drafter and a verifier, end to end.

A verifier can be right and the output still not the target's: the drafter may draw its
tokens with the very uniforms the verifier's acceptance test reads next (vLLM's #54282), or
sample from a processed draft law (a temperature, top-k) and hand the verifier another
(the raw softmax).  Neither shows in :func:`specdec_np.testing.check_verifier`, which draws
the drafts itself.  :func:`check_drafting` runs the drafter as an engine does and the
verifier on what it returns.

The drafter is called with keywords only::

    drafter(num_draft_tokens=...,   # int64 [B]: k_b drafts per request
            draft_logits=...,       # float64 [T, V]: request by request, position by position
            temperature=..., top_k=..., top_p=..., min_p=...,   # [B], the requests' settings
            counter_seeds=...)      # {b: (seed, counter)}: the request's seed for this step
    -> (draft_token_ids,            # int [T]: the tokens it drew
        draft_probs)                # float [T, V]: the rows it drew them from (None: point masses)

``num_draft_tokens`` and ``draft_logits`` are required; the others are passed where the
drafter's signature takes them (``**kwargs`` takes every one; ``takes_<keyword>``
attributes declare them).  The same ``counter_seeds`` go to the verifier (a callable with
:func:`specdec_np.verify_ragged`'s keywords, that function by default), which reads the
counter-based uniforms of ``specdec_np.counter_uniforms(seed, counter, k_b + 2)``
(``docs/semantics.md``, the randomness of the ragged layout): draft noise must come from
elsewhere.  The verifier gets ``target_logits [T + B, V]`` with the same settings, the
drafter's tokens and rows, and draws the bonus itself.

Properties, in report order:

* drafter output format: ``[T]`` integer ids in ``[0, V)``, rows ``[T, V]`` that are
  distributions giving each drafted token positive probability;
* drafts follow the reported draft rows: per group and position, a chi-square of the drafted
  tokens against the rows the drafter reported (a drafter that samples the processed law and
  reports the raw softmax fails here);
* draft noise independent of the verifier's uniforms: per group, position and verifier
  column, the drafted token against the quartile of that column's counter uniform (a
  homogeneity chi-square; a drafter that draws with the verifier's uniforms fails here);
* drafts reproducible and batch-invariant: the same ``counter_seeds`` give the same drafts,
  in the batch or alone (an engine that preempts and recomputes relies on it);
* emitted law equals the target (drafter and verifier): the verifier's output, completed by
  target draws, against the processed target rows (the ground truth; both bugs above fail
  it).

Two groups of requests alternate in one batch, each with its own rows and settings chosen so
that both bugs move the law (:func:`_groups`): temperature 0.6 with top-k, ``k`` drafts;
temperature 1.5 with top-p and min-p, ``max(k - 1, 1)`` drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import registry
from .._layouts.ragged import verify_ragged
from .._reference import chains as _reference
from .._runtime.philox import counter_uniforms
from . import _monte_carlo, _statistics
from ._padded import chain_chi_square
from ._ragged import RaggedTarget
from ._report import (
    DEFAULT_TIMEOUT,
    ConformanceReport,
    PropertyResult,
    TimeLimit,
    checked_timeout,
    guard,
    guard_keywords,
    has_keyword,
    skipped,
)

__all__ = ["DRAFTER_KEYWORDS", "check_drafting"]

#: The keywords a drafter may take besides ``num_draft_tokens`` and ``draft_logits``.
DRAFTER_KEYWORDS = ("temperature", "top_k", "top_p", "min_p", "counter_seeds")
_ALPHA = 1e-4
#: Quartiles of a verifier uniform, the columns of the independence tables.
_BINS = 4
#: A token column of an independence table with fewer drafts than this is pooled.
_POOL_BELOW = 20
#: How far a reported row may be from summing to one (float32 rows pass).
_ROW_SUM_TOLERANCE = 1e-5


@dataclass(frozen=True)
class _Group:
    """Requests that share their rows and settings, so their output law is one law."""

    label: str
    drafts: int
    settings: dict[str, float]
    target_logits: np.ndarray  # [drafts + 1, V]
    draft_logits: np.ndarray  # [drafts, V]

    def processed(self, rows: np.ndarray) -> np.ndarray:
        """The law of ``rows`` under this group's settings (the reference's processing)."""
        n = rows.shape[0]
        return np.asarray(_reference.process_logits(
            np.ascontiguousarray(rows, dtype=np.float64),
            np.full(n, self.settings["temperature"]),
            np.full(n, int(self.settings["top_k"]), dtype=np.int64),
            np.full(n, self.settings["top_p"]), np.full(n, self.settings["min_p"])),
            dtype=np.float64)


def _groups(rng: np.random.Generator, k: int, vocab_size: int) -> list[_Group]:
    """The two groups' rows, built so that each bug moves the law a lot.

    Over the tokens both keep, the processed target law rises with the token id and the
    draft law falls (``p / q`` from about 0.3 to 2.5), so that a draft drawn by inverse CDF
    with the acceptance uniform is accepted far more often than ``min(1, p / q)`` where the
    CDF starts, and far less later.  The target's top tokens are pushed below its filters'
    cut (top-k, top-p), so that the target keeps the ids the draft prefers; the draft's
    filters drop a tail that holds a quarter of its raw softmax, and the temperatures
    (0.6, 1.5) reshape the rest, so that the raw softmax is far from the law it samples.
    A little noise from ``rng`` varies the rows with the seed.
    """
    rising = np.log(np.linspace(1.0, 4.0, vocab_size))
    kept = vocab_size // 2 + 1
    tail = np.where(np.arange(vocab_size) < kept, 0.0, -3.0)
    groups = []
    for label, drafts, settings in (
        ("temperature 0.6, top-k", k,
         {"temperature": 0.6, "top_k": kept, "top_p": 1.0, "min_p": 0.0}),
        ("temperature 1.5, top-p, min-p", max(k - 1, 1),
         {"temperature": 1.5, "top_k": 0, "top_p": 0.8, "min_p": 0.05}),
    ):
        scale = settings["temperature"]
        target = scale * (rising + tail) + 0.1 * rng.standard_normal((drafts + 1, vocab_size))
        draft = -scale * rising + 0.1 * rng.standard_normal((drafts, vocab_size))
        groups.append(_Group(label, drafts, settings, target, draft))
    return groups


@dataclass
class _Batch:
    """One engine step of ``B`` requests, the groups alternating."""

    groups: list[_Group]
    member: np.ndarray  # [B] group index of each request
    counts: np.ndarray  # [B] k_b
    starts: np.ndarray  # [B] first draft row of each request
    seeds: np.ndarray  # [B] uint64
    counters: np.ndarray  # [B] uint64

    def subset(self, rows: list[int]) -> _Batch:
        index = np.asarray(rows, dtype=np.int64)
        counts = self.counts[index]
        return _Batch(self.groups, self.member[index], counts,
                      np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64),
                      self.seeds[index], self.counters[index])

    def counter_seeds(self) -> dict[int, tuple[int, int]]:
        return {b: (int(s), int(c)) for b, (s, c) in enumerate(zip(self.seeds, self.counters))}

    def settings(self, name: str) -> np.ndarray:
        values = np.array([self.groups[g].settings[name] for g in self.member])
        return values.astype(np.int64) if name == "top_k" else values

    def drafter_values(self) -> dict[str, Any]:
        """Every keyword the kit may pass the drafter."""
        return {
            "num_draft_tokens": self.counts.copy(),
            "draft_logits": np.ascontiguousarray(np.concatenate(
                [self.groups[g].draft_logits for g in self.member]), dtype=np.float64),
            **{name: self.settings(name) for name in ("temperature", "top_k", "top_p",
                                                       "min_p")},
            "counter_seeds": self.counter_seeds(),
        }

    def target_logits(self) -> np.ndarray:
        """``[T + B, V]``: each request's draft positions, then its bonus position."""
        return np.ascontiguousarray(np.concatenate(
            [self.groups[g].target_logits for g in self.member]), dtype=np.float64)


def _batch(groups: list[_Group], num_requests: int, rng: np.random.Generator) -> _Batch:
    member = np.arange(num_requests) % len(groups)
    counts = np.array([groups[g].drafts for g in member], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    # Seeds as an engine holds them (one per sequence), counters its generated lengths.
    seeds = rng.integers(0, 2**63, num_requests).astype(np.uint64)
    counters = rng.integers(0, 4096, num_requests).astype(np.uint64)
    return _Batch(groups, member, counts, starts, seeds, counters)


class _Drafter:
    """The drafter under test: the keywords it takes in, ``(ids [T], rows [T, V] or None)``
    NumPy out, format problems collected."""

    def __init__(self, drafter: Callable[..., Any], limit: TimeLimit) -> None:
        self.drafter = drafter
        self.limit = limit
        self.takes = {name: has_keyword(drafter, name) for name in DRAFTER_KEYWORDS}

    def __call__(self, batch: _Batch) -> tuple[np.ndarray, np.ndarray | None]:
        values = batch.drafter_values()
        keywords = {name: value for name, value in values.items()
                    if name in ("num_draft_tokens", "draft_logits") or self.takes[name]}
        result = self.limit.call(self.drafter, **keywords)
        if isinstance(result, (str, bytes)) or not hasattr(result, "__len__") or len(
                result) != 2:
            raise TypeError("the drafter must return (draft_token_ids, draft_probs); found "
                            f"{type(result).__name__}")
        ids = _monte_carlo.to_numpy(result[0])
        rows = None if result[1] is None else _monte_carlo.to_numpy(result[1])
        total = int(batch.counts.sum())
        vocab_size = batch.groups[0].draft_logits.shape[1]
        problem = _format_problem(ids, rows, total, vocab_size)
        if problem:
            raise _MalformedDrafts(problem)
        return ids.astype(np.int64), None if rows is None else rows.astype(np.float64)


class _MalformedDrafts(ValueError):
    """The drafter's output breaks the calling convention."""


def _format_problem(ids: np.ndarray, rows: np.ndarray | None, total: int,
                    vocab_size: int) -> str:
    if ids.dtype.kind not in "iu":
        return f"draft_token_ids must have an integer dtype; found {ids.dtype}"
    if ids.shape != (total,):
        return f"draft_token_ids must have shape [T] = [{total}]; found {list(ids.shape)}"
    if total and (ids.min() < 0 or ids.max() >= vocab_size):
        return f"draft_token_ids must lie in [0, {vocab_size})"
    if rows is None:
        return ""
    if rows.dtype.kind != "f":
        return f"draft_probs must be floating point; found {rows.dtype}"
    if rows.shape != (total, vocab_size):
        return (f"draft_probs must have shape [T, V] = [{total}, {vocab_size}]; found "
                f"{list(rows.shape)}")
    values = rows.astype(np.float64)
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        return "draft_probs must be finite and non-negative"
    worst = float(np.max(np.abs(values.sum(axis=1) - 1.0), initial=0.0))
    if worst > _ROW_SUM_TOLERANCE:
        return f"each draft_probs row must sum to 1; one is off by {worst:.3g}"
    zero = np.flatnonzero(values[np.arange(total), ids] <= 0)
    if zero.size:
        return (f"draft {int(zero[0])} is token {int(ids[zero[0]])}, of probability 0 in the "
                f"row reported for it")
    return ""


# --------------------------------------------------------------------------------------
# The properties
# --------------------------------------------------------------------------------------


def _rows_of(batch: _Batch, group: int, position: int) -> np.ndarray:
    """The draft rows (indices into ``[T]``) of ``position`` in the requests of ``group``."""
    members = np.flatnonzero(batch.member == group)
    return batch.starts[members] + position


def _check_reported_rows(batch: _Batch, ids: np.ndarray,
                         rows: np.ndarray | None) -> PropertyResult:
    name = "drafts follow the reported draft rows"
    if rows is None:
        return skipped(name, "point-mass drafts (draft_probs None): the point-mass rule is "
                       "lossless whatever law the drafts come from")
    lowest, worst, tests = 1.0, "", 0
    vocab_size = rows.shape[1]
    for g, group in enumerate(batch.groups):
        for j in range(group.drafts):
            index = _rows_of(batch, g, j)
            p_value = _statistics.chi_square_test(
                np.bincount(ids[index], minlength=vocab_size), rows[index].mean(axis=0))
            tests += 1
            if p_value < lowest or not worst:
                lowest, worst = min(p_value, lowest), f"{group.label}, position {j}"
    return PropertyResult(
        name, lowest > _ALPHA, f"min p = {lowest:.3g}",
        f"{tests} chi-square tests of the drafted tokens of each group and position vs the "
        f"mean of the rows the drafter reported for them; each p must exceed {_ALPHA:g}; "
        f"lowest: {worst}")


def homogeneity_p_value(table: np.ndarray) -> float:
    """Pearson's test that the rows of a contingency table share one law.

    Columns with fewer than :data:`_POOL_BELOW` counts are pooled into one; empty rows and
    columns are dropped.

    Parameters
    ----------
    table : numpy.ndarray, int [R, C]

    Returns
    -------
    float
        The p-value (1 when fewer than two rows or columns are left).
    """
    table = np.asarray(table, dtype=np.float64)
    small = table.sum(axis=0) < _POOL_BELOW
    if small.any():
        table = np.concatenate([table[:, ~small], table[:, small].sum(axis=1, keepdims=True)],
                               axis=1)
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    if min(table.shape) < 2:
        return 1.0
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / table.sum()
    statistic = float(np.sum((table - expected) ** 2 / expected))
    return _statistics.chi_square_p_value(statistic, (table.shape[0] - 1) * (table.shape[1] - 1))


def _check_independence(batch: _Batch, ids: np.ndarray, takes_seeds: bool) -> PropertyResult:
    name = "draft noise independent of the verifier's uniforms"
    if not takes_seeds:
        return skipped(name, "the drafter takes no counter_seeds=: it draws its own noise")
    width = int(batch.counts.max(initial=0)) + 2
    uniforms = np.asarray(counter_uniforms(batch.seeds, batch.counters, width))
    vocab_size = batch.groups[0].draft_logits.shape[1]
    lowest, worst, tests = 1.0, "", 0
    for g, group in enumerate(batch.groups):
        members = np.flatnonzero(batch.member == g)
        for j in range(group.drafts):
            tokens = ids[batch.starts[members] + j]
            # The verifier reads columns 0 .. k_b - 1 (acceptance), k_b (residual), k_b + 1
            # (bonus): a draft may share none of them.
            for column in range(group.drafts + 2):
                quartile = np.minimum((uniforms[members, column] * _BINS).astype(np.int64),
                                      _BINS - 1)
                table = np.zeros((_BINS, vocab_size), dtype=np.int64)
                np.add.at(table, (quartile, tokens), 1)
                p_value = homogeneity_p_value(table)
                tests += 1
                if p_value < lowest or not worst:
                    lowest = min(p_value, lowest)
                    worst = f"{group.label}, position {j} vs column {column}"
    return PropertyResult(
        name, lowest > _ALPHA, f"min p = {lowest:.3g}",
        f"{tests} homogeneity chi-square tests: the drafted token of each group and position "
        f"vs the quartile of each uniform the verifier reads for that request "
        f"(counter_uniforms(seed, counter, k_b + 2)); each p must exceed {_ALPHA:g}; "
        f"lowest: {worst}")


def _check_reproducible(drafter: _Drafter, batch: _Batch, ids: np.ndarray,
                        rows: np.ndarray | None) -> PropertyResult:
    name = "drafts reproducible and batch-invariant (counter_seeds)"
    if not drafter.takes["counter_seeds"]:
        return skipped(name, "the drafter takes no counter_seeds=")
    size = min(32, batch.counts.size)
    head = batch.subset(list(range(size)))
    first_ids, first_rows = drafter(head)
    again_ids, again_rows = drafter(head)
    end = int(head.counts.sum())
    differ = set()
    if not np.array_equal(first_ids, again_ids) or not np.array_equal(first_ids, ids[:end]):
        differ.add("the same seeds gave other drafts")
    for b in range(min(8, size)):
        alone_ids, alone_rows = drafter(batch.subset([b]))
        span = slice(int(head.starts[b]), int(head.starts[b] + head.counts[b]))
        if not np.array_equal(alone_ids, first_ids[span]):
            differ.add(f"request {b} alone drafted {alone_ids.tolist()}, in the batch "
                       f"{first_ids[span].tolist()}")
        elif (alone_rows is None) != (first_rows is None) or (
                alone_rows is not None and first_rows is not None
                and not np.allclose(alone_rows, first_rows[span], rtol=0, atol=1e-12)):
            differ.add(f"request {b} alone reported other rows")
    if rows is not None and again_rows is not None and not np.allclose(
            again_rows, rows[:end], rtol=0, atol=1e-12):
        differ.add("the same seeds gave other rows")
    return PropertyResult(
        name, not differ, f"{len(differ)} differ",
        "; ".join(sorted(differ)[:2]) if differ else
        f"{size} requests drafted twice with equal counter_seeds, and 8 of them alone, as in "
        f"the batch of {batch.counts.size}: equal drafts and rows")


def _check_emitted_law(target: RaggedTarget, batch: _Batch, ids: np.ndarray,
                       rows: np.ndarray | None, rng: np.random.Generator) -> PropertyResult:
    name = "emitted law equals the target (drafter and verifier)"
    if not target.takes["target_logits"]:
        return skipped(name, "the verifier takes no target_logits=")
    values: dict[str, Any] = {
        "num_draft_tokens": batch.counts.copy(),
        "draft_token_ids": ids,
        "target_logits": batch.target_logits(),
        "draft_probs": rows,
        **{setting: batch.settings(setting)
           for setting in ("temperature", "top_k", "top_p", "min_p")},
    }
    if target.takes["counter_seeds"]:
        values["counter_seeds"] = batch.counter_seeds()
        source = "counter_seeds="
    elif target.takes["generator"]:
        values["generator"] = np.random.default_rng(int(rng.integers(2**63)))
        source = "generator= (the verifier takes no counter_seeds=)"
    else:
        source = "the verifier's own randomness"
    output = target(**values)
    lowest, worst, tests = 1.0, "", 0
    for g, group in enumerate(batch.groups):
        members = np.flatnonzero(batch.member == g)
        law = group.processed(group.target_logits)
        p_value, label, count = chain_chi_square(output[members, : group.drafts + 1], law, rng)
        tests += count
        if p_value < lowest or not worst:
            lowest, worst = min(p_value, lowest), f"{group.label}, {label}"
    return PropertyResult(
        name, lowest > _ALPHA, f"min p = {lowest:.3g}",
        f"{batch.counts.size} requests in {len(batch.groups)} alternating groups, V = "
        f"{batch.groups[0].draft_logits.shape[1]}, drafts and rows from the drafter, target "
        f"logits with the same settings, {source}, bonus drawn by the verifier; {tests} "
        f"chi-square tests of the output (completed by target draws) vs the processed target "
        f"rows; each p must exceed {_ALPHA:g}; lowest: {worst}")


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def check_drafting(
    drafter: Callable[..., Any],
    verifier: Callable[..., Any] | None = None,
    kind: str = "rejection",
    *,
    vocab_size: int = 6,
    k: int = 2,
    seed: int = 0,
    num_requests: int = 20_000,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> ConformanceReport:
    """Run a drafter as an engine does, verify its drafts, and check the output's law.

    The kit hands the drafter each request's draft logits, sampling settings and
    ``counter_seeds`` pair ``(seed, counter)``; the drafter returns the tokens it drew and
    the rows it drew them from; the verifier gets those with the target logits and the
    same ``counter_seeds``.  Its output must have the target's processed law, the drafts
    must follow the rows reported for them, and they must not depend on the uniforms the
    verifier reads (``docs/testing.md``, "Checking a drafter").

    Parameters
    ----------
    drafter : callable
        ``drafter(num_draft_tokens=int64 [B], draft_logits=float64 [T, V], *,
        temperature=[B], top_k=[B], top_p=[B], min_p=[B], counter_seeds={b: (seed,
        counter)}) -> (draft_token_ids [T], draft_probs [T, V] or None)``; the keywords after
        the first two only where its signature takes them.  Outputs may be NumPy arrays or
        anything DLPack or ``__array__`` can read.
    verifier : callable, optional
        A verifier with :func:`specdec_np.verify_ragged`'s keywords (``layout="ragged"`` of
        :func:`check_verifier`); :func:`specdec_np.verify_ragged` when None.
    kind : str
        The method the verifier is asked for (``method=`` where it takes it): a lossless
        stochastic verifier of the registry (``registry.names(stochastic=True,
        lossless=True)``).
    vocab_size : int
        V, at least 4.
    k : int
        Drafts per request of the first group (the second has ``max(k - 1, 1)``); at
        least 1.
    seed : int
        Seed of the rows and of the engine's seeds; the same seed gives the same report.
    num_requests : int
        Requests of the batch, at least 2000 (half per group).
    timeout : float or None
        Time limit of each call to the drafter or the verifier, in seconds, as in
        :func:`check_verifier`.

    Returns
    -------
    ConformanceReport
        On the ragged layout, ``report.verifier`` naming the drafter and the verifier.

    Raises
    ------
    TypeError
        If ``drafter`` or ``verifier`` is not callable.
    ValueError
        If ``kind`` is not a lossless stochastic verifier, the drafter takes no
        ``num_draft_tokens`` or ``draft_logits`` keyword, a size is out of range, or the
        timeout is (as in :func:`check_verifier`).

    Examples
    --------
    A drafter on :func:`specdec_np.sample_tokens`, with noise of its own (a generator per
    request, seeded from the request's seed and counter and a tag of the drafter's; where
    the library offers the draft domain, ``stream="draft"``, that is the simpler source):

    >>> import numpy as np
    >>> import specdec_np
    >>> from specdec_np.testing import check_drafting
    >>> def drafter(*, num_draft_tokens, draft_logits, temperature, top_k, counter_seeds):
    ...     counts = np.asarray(num_draft_tokens)
    ...     request = np.repeat(np.arange(counts.size), counts)
    ...     rows = specdec_np.processed_probs(
    ...         logits=draft_logits, temperature=temperature[request], top_k=top_k[request])
    ...     noise = np.concatenate([
    ...         np.random.default_rng([*counter_seeds[b], 0xD4AF7]).random(int(counts[b]))
    ...         for b in range(counts.size)])
    ...     return specdec_np.sample_tokens(probs=rows, uniforms=noise), rows
    >>> check_drafting(drafter, num_requests=4000).passed
    True
    """
    if not callable(drafter):
        raise TypeError(f"drafter must be callable; found {type(drafter).__name__}")
    if verifier is None:
        verifier = verify_ragged
    if not callable(verifier):
        raise TypeError(f"verifier must be callable; found {type(verifier).__name__}")
    kinds = registry.names(stochastic=True, lossless=True)
    if kind not in kinds:
        raise ValueError(f"kind must be one of {kinds}; found {kind!r}")
    missing = [name for name in ("num_draft_tokens", "draft_logits")
               if not has_keyword(drafter, name)]
    if missing:
        raise ValueError(f"drafter must take the keywords num_draft_tokens and draft_logits; "
                         f"it lacks {', '.join(missing)}")
    for name, value, minimum in (("vocab_size", vocab_size, 4), ("k", k, 1),
                                 ("num_requests", num_requests, 2000)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}; found {value!r}")
    limit = TimeLimit(checked_timeout(timeout))
    start = time.perf_counter()
    report = ConformanceReport(kind, f"{_label(drafter)} drafting for {_label(verifier)}",
                               layout="ragged")
    rng = np.random.default_rng(seed)
    batch = _batch(_groups(rng, k, vocab_size), num_requests, rng)
    under_test = _Drafter(drafter, limit)
    drafted: dict[str, Any] = {}

    def draft() -> PropertyResult:
        try:
            drafted["ids"], drafted["rows"] = under_test(batch)
        except _MalformedDrafts as problem:
            return PropertyResult("drafter output format", False, "malformed", str(problem))
        rows = drafted["rows"]
        return PropertyResult(
            "drafter output format", True, "0 problems",
            f"{int(batch.counts.sum())} drafts of {batch.counts.size} requests: integer ids "
            f"in [0, V), " + ("no rows (point-mass drafts)" if rows is None else
                              "rows [T, V] that are distributions, each draft possible in its "
                              "row"))

    report.rows += guard("drafter output format", draft, limit)
    names = ("drafts follow the reported draft rows",
             "draft noise independent of the verifier's uniforms",
             "drafts reproducible and batch-invariant (counter_seeds)",
             "emitted law equals the target (drafter and verifier)")
    if "ids" not in drafted:
        report.rows += [skipped(name, "the drafter's output could not be read")
                        for name in names]
    else:
        ids, rows = drafted["ids"], drafted["rows"]
        target = RaggedTarget(verifier, kind, np.dtype(np.float64), limit)
        report.rows += guard(names[0], lambda: _check_reported_rows(batch, ids, rows), limit)
        report.rows += guard(names[1], lambda: _check_independence(
            batch, ids, under_test.takes["counter_seeds"]), limit)
        report.rows += guard(names[2], lambda: _check_reproducible(under_test, batch, ids,
                                                                   rows), limit)
        report.rows += guard_keywords(names[3], lambda: _check_emitted_law(
            target, batch, ids, rows, rng), limit)
    report.seconds = time.perf_counter() - start
    return report


def _label(function: Any) -> str:
    return str(getattr(function, "__qualname__", None) or getattr(function, "__name__", None)
               or type(function).__name__)
