"""The conformance kit on the tree layout: a callable with ``verify_tree``'s keywords.

The verifier is called with keywords only (``docs/testing.md``, the tree layout):
``num_nodes [B]``, ``tree_parents [N]``, ``draft_token_ids [N]``, one of ``target_probs`` /
``target_logits`` ``[N + B, V]`` (per request its root row, then one row per node),
``draft_probs`` / ``draft_logits`` ``[N, V]`` where the method reads draft rows,
``method=kind`` where it takes ``method``, the sampling parameters (arrays ``[B]``) and one
randomness source: ``uniforms [B, max_nodes + 1]``, ``generator``, ``seeded_seqs`` or
``counter_seeds``.  It returns an object with ``output_token_ids [B, max_depth + 1]`` (and,
where it has them, ``accepted_nodes [B, max_depth]`` and ``accepted_lengths [B]``), or the
output ids alone.

The kinds are the registry's tree methods (:func:`specdec_np.registry.tree_method_names`),
each checked through its own registry entry: its drafting (how the kit draws the
children, as a drafter would), whether it reads draft rows, and its exact emission law
(``oracle_name``, :func:`specdec_np._reference.trees.tree_emission_law`); a method added to
the registry is checked with no change here.  :func:`run` checks, for a stochastic method:

* the exact law on two small trees, every draft assignment enumerated and the uniforms
  integrated cell by cell (each node's axis cut at its acceptance probability, from the
  method's ``sibling_walk``; skipped for a method that has none), against the oracle and,
  continued by the target, against the target;
* Monte Carlo on three tree shapes, once per randomness source the verifier takes: the
  emitted token tuples against the method's exact law (chi-square), and the output
  continued by target draws against the target's own law (lossless);
* the same from logits with temperature, top-k, top-p and min-p (the law of the processed
  rows, so that a filter ignored fails);
* the exact laws from logits of the ragged layout's settings
  (:data:`specdec_np.testing._ragged.SETTING_CASES`), one chain tree of 0 or 1 nodes per
  setting, one property per class of settings (and draft logits with target
  probabilities, for a method that reads draft rows);
* zero-probability drafts tested at u = 0 (never accepted, never emitted);
* greedy requests (temperature 0) mixed in: the greedy walk of the reference;
and for ``"greedy"`` the reference's greedy walk on random trees with ties.  Then batch
invariance, seeds and the output format (a root-down path of accepted nodes, their tokens,
one final token, -1 padding).  A verifier that walks greedily when asked for a stochastic
method emits one tuple per tree and fails the chi-square tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import registry
from .._reference import trees as _tree_reference
from . import _monte_carlo, _oracles, _statistics
from . import _padded as _kit_padded
from . import _ragged as _kit_ragged
from ._padded import SEEDED_SOURCES, SOURCE_LABELS, source_keywords
from ._report import (
    PropertyResult,
    TimeLimit,
    format_result,
    greedy_result,
    guard_keywords,
    has_keyword,
    layout_keywords,
    skipped,
)

__all__ = ["TreeTarget", "run"]

KEYWORDS = ("target_logits", "target_probs", "draft_logits", "draft_probs", "method",
            "temperature", "top_k", "top_p", "min_p", "uniforms", "generator", "seeded_seqs",
            "counter_seeds")
#: The tree shapes of the Monte Carlo checks (parents within the request).
SHAPES = ((-1, -1, 0), (-1, 0, 0, -1), (-1, 0))
_ALPHA = 1e-4
_BELOW_ONE = float(np.nextafter(1.0, 0.0))
#: The sampling parameters of the checks from logits; each filter removes mass at V = 5.
_FILTERS = {"temperature": 0.8, "top_k": 3, "top_p": 0.9, "min_p": 0.05}


class TreeTarget:
    """The tree verifier under test: keywords in, NumPy ``(output, accepted_nodes or None,
    lengths or None)`` out, the shapes checked.

    Parameters
    ----------
    verifier : callable
    kind : str
        A registry tree method, passed as ``method=`` where the verifier takes it.
    dtype : numpy.dtype
    limit : TimeLimit
    """

    def __init__(self, verifier: Callable[..., Any], kind: str, dtype: Any,
                 limit: TimeLimit) -> None:
        self.verifier = verifier
        self.kind = kind
        self.method = registry.get_tree_method(kind)
        self.dtype = dtype
        self.limit = limit
        self.takes = {name: has_keyword(verifier, name) for name in KEYWORDS}
        self.format_errors: list[str] = []

    def sources(self) -> list[str]:
        """The randomness sources the verifier takes."""
        return [s for s in ("uniforms", "generator", *SEEDED_SOURCES) if self.takes[s]]

    def __call__(self, **values: Any) -> tuple[np.ndarray, Any, Any]:
        max_depth = int(values.pop("max_depth"))
        keywords = layout_keywords(
            self.takes, values, ("num_nodes", "tree_parents", "draft_token_ids"), self.kind
        )
        result = self.limit.call(self.verifier, **keywords)
        output = _monte_carlo.to_numpy(getattr(result, "output_token_ids", result))
        nodes = getattr(result, "accepted_nodes", None)
        lengths = getattr(result, "accepted_lengths", None)
        width = max_depth + 1
        batch_size = np.asarray(values["num_nodes"]).size
        problem = ""
        if output.dtype.kind not in "iu":
            problem = f"output_token_ids must have an integer dtype; found {output.dtype}"
        elif output.shape != (batch_size, width):
            problem = (f"output_token_ids must have shape [B, max_depth + 1] = "
                       f"{[batch_size, width]}; found {list(output.shape)}")
        if problem:
            self.format_errors.append(problem)
            raise TypeError(problem)
        if nodes is not None:
            nodes = _monte_carlo.to_numpy(nodes).astype(np.int64)
        if lengths is not None:
            lengths = _monte_carlo.to_numpy(lengths).astype(np.int64)
        return output.astype(np.int64), nodes, lengths


# --------------------------------------------------------------------------------------
# Requests: trees drawn as a drafter draws them
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    """One request: its tree, rows (in its batch's form), parameters and uniforms."""

    parents: tuple[int, ...]
    tokens: np.ndarray
    target: np.ndarray
    draft: np.ndarray | None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    uniforms: np.ndarray | None = None
    shape: int = -1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def depth(self) -> int:
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths, default=0)


class _Rows:
    """Rows by path, drawn once each: the target's row after a path and the draft's row
    below a path at a sibling position, as logits or as probabilities (multiples of
    1/1024, with a zero), as ``form`` says for the target and the draft rows."""

    def __init__(self, rng: np.random.Generator, vocab_size: int,
                 form: tuple[str, str]) -> None:
        self.rng = rng
        self.vocab_size = vocab_size
        self.form = form
        self.rows: dict[tuple, np.ndarray] = {}

    def logits(self, kind: str) -> bool:
        """Whether the ``"target"`` or ``"draft"`` rows are logits."""
        return self.form[0 if kind == "target" else 1] == "logits"

    def _row(self, key: tuple) -> np.ndarray:
        if key not in self.rows:
            if self.logits(key[0]):
                # Flatter draft logits: after the filters a draft row keeps at least three
                # tokens, enough to draw the siblings of every shape without replacement.
                scale = 1.5 if key[0] == "target" else 0.3
                row = self.rng.standard_normal(self.vocab_size) * scale
            else:
                row = _kit_padded.exact_probability_row(self.rng, self.vocab_size)
            self.rows[key] = row
        return self.rows[key]

    def target(self, path: tuple[int, ...]) -> np.ndarray:
        return self._row(("target", path))

    def draft(self, path: tuple[int, ...], sibling: int) -> np.ndarray:
        return self._row(("draft", path, sibling))


class _Laws:
    """The laws the verifier must follow: the rows of :class:`_Rows`, processed where they
    are logits (the reference's processing, with one request setting)."""

    def __init__(self, rows: _Rows, settings: dict[str, Any], dtype: Any) -> None:
        self.source = rows
        self.settings = settings
        self.dtype = dtype
        self.cache: dict[tuple, np.ndarray] = {}

    def _law(self, key: tuple, row: np.ndarray) -> np.ndarray:
        if key not in self.cache:
            if self.source.logits(key[0]):
                value = _kit_ragged.process(row[None, :], self.settings, self.dtype)[0]
            else:
                value = np.asarray(row, dtype=self.dtype).astype(np.float64)
            self.cache[key] = value
        return self.cache[key]

    def target(self, path: tuple[int, ...]) -> np.ndarray:
        return self._law(("target", path), self.source.target(path))

    def draft(self, path: tuple[int, ...], sibling: int) -> np.ndarray:
        return self._law(("draft", path, sibling), self.source.draft(path, sibling))


def _draw_tree(parents: tuple[int, ...], method: registry.TreeMethod, rows: _Rows,
               laws: _Laws, rng: np.random.Generator,
               fixed: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """One request's tokens, target rows ``[n + 1, V]`` and draft rows ``[n, V]`` (None
    when the method reads none), the children drawn by the method's drafting."""
    n = len(parents)
    tokens = np.zeros(n, dtype=np.int64)
    paths: list[tuple[int, ...]] = []
    siblings: dict[int, list[int]] = {}
    draft_rows = []
    for node, parent in enumerate(parents):
        below = () if parent < 0 else paths[parent]
        earlier = siblings.setdefault(parent, [])
        position = len(earlier)
        if method.drafting == "independent":
            law = laws.draft(below, position)
            tokens[node] = _monte_carlo.draw_from(law, 1, rng)[0]
            draft_rows.append(rows.draft(below, position))
        elif method.drafting == "without_replacement":
            law = laws.draft(below, 0).copy()
            law[[tokens[s] for s in earlier]] = 0.0
            tokens[node] = _monte_carlo.draw_from(law / law.sum(), 1, rng)[0]
            draft_rows.append(rows.draft(below, 0))
        else:
            tokens[node] = fixed[node]
            draft_rows.append(rows.draft(below, position))
        earlier.append(node)
        paths.append(below + (int(tokens[node]),))
    target = np.stack([rows.target(())] + [rows.target(path) for path in paths])
    draft = np.stack(draft_rows) if draft_rows and method.reads_draft_probs else None
    if not draft_rows and method.reads_draft_probs:
        draft = np.zeros((0, rows.vocab_size))
    return tokens, target, draft


def _fixed_tokens(parents: tuple[int, ...], vocab_size: int) -> tuple[int, ...]:
    """Distinct sibling tokens for deterministic candidates: sibling s proposes s + 1."""
    seen: dict[int, int] = {}
    tokens = []
    for parent in parents:
        seen[parent] = seen.get(parent, 0) + 1
        tokens.append(seen[parent] % vocab_size)
    return tuple(tokens)


def _assemble(requests: list[_Request], form: str, dtype: Any, source: str = "uniforms",
              salt: int = 0, draft_form: str | None = None) -> dict[str, Any]:
    """The keywords of one call holding ``requests`` in order; the rows are ``form``
    (``"logits"`` or ``"probs"``), the draft rows ``draft_form`` (the same by default)."""
    counts = np.array([len(r.parents) for r in requests], dtype=np.int64)
    vocab_size = requests[0].target.shape[1]
    values: dict[str, Any] = {
        "num_nodes": counts,
        "tree_parents": np.array([p for r in requests for p in r.parents], dtype=np.int64),
        "draft_token_ids": np.concatenate([r.tokens for r in requests]).astype(np.int64),
        f"target_{form}": np.ascontiguousarray(np.concatenate([r.target for r in requests]),
                                               dtype=dtype),
        "temperature": np.array([r.temperature for r in requests]),
        "max_depth": max(r.depth() for r in requests),
    }
    if all(r.draft is not None for r in requests):
        values[f"draft_{draft_form or form}"] = np.ascontiguousarray(
            np.concatenate([r.draft for r in requests]).reshape(-1, vocab_size), dtype=dtype)
    if form == "logits":
        values["top_k"] = np.array([r.top_k for r in requests], dtype=np.int64)
        values["top_p"] = np.array([r.top_p for r in requests])
        values["min_p"] = np.array([r.min_p for r in requests])
    if source == "uniforms":
        uniforms = np.zeros((len(requests), int(counts.max(initial=0)) + 1))
        for b, r in enumerate(requests):
            if r.uniforms is not None:
                uniforms[b, : len(r.parents) + 1] = r.uniforms
        values["uniforms"] = uniforms
    else:
        values.update(source_keywords(source, len(requests), salt))
    return values


def _call(target: TreeTarget, requests: list[_Request], form: str, source: str = "uniforms",
          salt: int = 0, draft_form: str | None = None,
          **keywords: Any) -> tuple[np.ndarray, Any, Any]:
    values = _assemble(requests, form, target.dtype, "none" if keywords else source, salt,
                       draft_form)
    values.update(keywords)
    return target(**values)


# --------------------------------------------------------------------------------------
# What every output must satisfy: format, and the greedy walk for greedy requests
# --------------------------------------------------------------------------------------


def _greedy_walk(request: _Request) -> list[int]:
    """The reference's greedy walk of one request on its raw rows."""
    rows = np.where(np.isnan(request.target), -np.inf, request.target)
    _, output, length = _tree_reference.verify_tree(
        np.array([len(request.parents)]), np.array(request.parents, dtype=np.int64),
        request.tokens, rows, None, None, "greedy")
    return np.asarray(output)[0, : int(np.asarray(length)[0]) + 1].tolist()


class _Collector:
    """Format problems and greedy requests across every call of the run."""

    def __init__(self, all_greedy: bool) -> None:
        #: The method itself is greedy: every request must walk greedily, whatever its
        #: temperature.
        self.all_greedy = all_greedy
        self.format_problems: list[str] = []
        self.greedy_bad: list[str] = []
        self.greedy_count = 0
        self.requests = 0

    def record(self, requests: list[_Request], result: tuple, label: str) -> None:
        output, nodes, lengths = result
        self.requests += len(requests)
        for b, request in enumerate(requests):
            problem = _path_problem(request, output[b], None if nodes is None else nodes[b],
                                    None if lengths is None else int(lengths[b]),
                                    request.target.shape[1])
            if problem:
                self.format_problems.append(f"{label}, request {b}: {problem}")
            if request.greedy or self.all_greedy:
                self.greedy_count += 1
                expected = _greedy_walk(request)
                if output[b, : len(expected)].tolist() != expected or np.any(
                        output[b, len(expected):] != -1):
                    self.greedy_bad.append(f"{label}: request {b} gave {output[b].tolist()}, "
                                           f"expected {expected}")


def _path_problem(request: _Request, row: np.ndarray, nodes: Any, length: int | None,
                  vocab_size: int) -> str:
    """Empty if ``row`` is accepted nodes' tokens along a root-down path, one final token
    and -1 padding (matching ``nodes`` and ``length`` where given); else why not."""
    emitted = row[row != -1]
    count = emitted.size
    if count == 0 or np.any(row[:count] == -1) or np.any(row[count:] != -1):
        return f"{row.tolist()} is not tokens then -1 padding"
    if np.any((emitted < 0) | (emitted >= vocab_size)):
        return f"{row.tolist()} holds an id outside [0, V)"
    if length is not None and length != count - 1:
        return f"accepted_lengths {length} but {count - 1} accepted tokens in {row.tolist()}"
    parents = request.parents
    if nodes is not None:
        path = [int(n) for n in nodes[: count - 1]]
        if np.any(np.asarray(nodes[count - 1:]) != -1):
            return f"accepted_nodes {np.asarray(nodes).tolist()} not -1 past the accepted ones"
        previous = -1
        for node, token in zip(path, emitted[:-1].tolist()):
            if not 0 <= node < len(parents) or parents[node] != previous:
                return f"accepted_nodes {path} is not a root-down path of the tree {parents}"
            if int(request.tokens[node]) != token:
                return f"node {node} holds token {int(request.tokens[node])}, emitted {token}"
            previous = node
        return ""
    # Without accepted_nodes: some root-down path must carry the accepted tokens.
    frontier = [-1]
    for token in emitted[:-1].tolist():
        frontier = [n for n in range(len(parents)) if parents[n] in frontier
                    and int(request.tokens[n]) == token]
        if not frontier:
            return f"{row.tolist()}: no root-down path of the tree carries these tokens"
    return ""


# --------------------------------------------------------------------------------------
# Monte Carlo against the method's exact law and the target's
# --------------------------------------------------------------------------------------


def _shape_requests(target: TreeTarget, rows: _Rows, laws: _Laws, rng: np.random.Generator,
                    count: int, settings: dict[str, Any],
                    vocab_size: int) -> list[_Request]:
    requests = []
    for shape, parents in enumerate(SHAPES):
        fixed = _fixed_tokens(parents, vocab_size)
        for _ in range(count):
            tokens, target_rows, draft_rows = _draw_tree(parents, target.method, rows, laws,
                                                         rng, fixed)
            requests.append(_Request(parents, tokens, target_rows, draft_rows,
                                     uniforms=rng.random(len(parents) + 1), shape=shape,
                                     **settings))
    return requests


def _emission_tests(target: TreeTarget, requests: list[_Request], output: np.ndarray,
                    rows: _Rows, laws: _Laws,
                    rng: np.random.Generator) -> tuple[float, str, float, str]:
    """Per shape: chi-square of the emitted tuples vs the method's law, and of the output
    continued by target draws vs the target.  ``(lowest p vs the oracle, where, lowest p
    vs the target, where)``; the oracle's p is NaN when the method has none."""
    vocab_size = rows.vocab_size
    lowest_oracle, where_oracle = float("nan"), ""
    lowest_target, where_target = 1.0, ""
    shapes = np.array([r.shape for r in requests])
    for shape, parents in enumerate(SHAPES):
        members = np.flatnonzero(shapes == shape)
        emitted = [tuple(int(t) for t in output[b] if t != -1) for b in members]
        if target.method.oracle_name is not None:
            law = _tree_reference.tree_emission_law(
                target.kind, laws.target, parents, vocab_size,
                draft=laws.draft if target.method.drafting != "fixed" else None,
                draft_token_ids=_fixed_tokens(parents, vocab_size))
            support = sorted(set(law) | set(emitted))
            index = {tokens: i for i, tokens in enumerate(support)}
            counts = np.bincount([index[e] for e in emitted], minlength=len(support))
            p_value = _statistics.chi_square_test(
                counts, np.array([law.get(tokens, 0.0) for tokens in support]))
            if not p_value >= lowest_oracle:  # NaN-safe minimum
                lowest_oracle, where_oracle = p_value, f"tree {parents}"
        length = max(len(e) for e in emitted) if emitted else 1
        length = max(length, 2)
        continued = np.zeros(len(emitted), dtype=np.int64)
        for i, tokens in enumerate(emitted):
            path = tokens
            while len(path) < length:
                path = path + (int(_monte_carlo.draw_from(laws.target(path), 1, rng)[0]),)
            continued[i] = int(np.ravel_multi_index(path[:length], (vocab_size,) * length))
        expected = _tree_reference.continued_law({(): 1.0}, laws.target, length, vocab_size)
        p_value = _statistics.chi_square_test(
            np.bincount(continued, minlength=vocab_size**length), expected.reshape(-1))
        if p_value < lowest_target:
            lowest_target, where_target = p_value, f"tree {parents}"
    return lowest_oracle, where_oracle, lowest_target, where_target


def _check_monte_carlo(target: TreeTarget, form: str, settings: dict[str, Any],
                       vocab_size: int, num_rows: int, rng: np.random.Generator,
                       collector: _Collector, sources: list[str]) -> list[PropertyResult]:
    label = "probabilities" if form == "probs" else "logits with " + ", ".join(
        f"{name.replace('_', '-')} {value:g}" for name, value in settings.items())
    results = []
    for position, source in enumerate(sources):
        suffix = f"{'from logits, ' if form == 'logits' else ''}{SOURCE_LABELS[source]}"
        names = (f"emission law equals the {target.kind} oracle ({suffix})",
                 f"continued output has the target's law ({suffix})")
        if not target.takes[f"target_{form}"] or (
                target.method.reads_draft_probs and not target.takes[f"draft_{form}"]):
            return [skipped(names[0], f"the verifier takes no target_{form}= or draft_{form}=")]
        rows = _Rows(rng, vocab_size, (form, form))
        laws = _Laws(rows, settings, target.dtype)
        count = max(num_rows // (20 if source not in SEEDED_SOURCES else 40), 500)
        sampled = _shape_requests(target, rows, laws, rng, count, settings, vocab_size)
        greedy = [replace(r, temperature=0.0) for r in sampled[:: 40]]
        requests = sampled + greedy
        result = _call(target, requests, form, source, salt=21 + position)
        collector.record(requests, result, f"Monte Carlo ({suffix})")
        output = result[0][: len(sampled)]
        lowest_oracle, where_oracle, lowest_target, where_target = _emission_tests(
            target, sampled, output, rows, laws, rng)
        what = (f"{count} requests per tree of {[list(s) for s in SHAPES]} (V = {vocab_size}, "
                f"{label}, children drawn as '{target.method.drafting}' drafting draws them, "
                f"{len(greedy)} greedy requests mixed in), {SOURCE_LABELS[source]}")
        if target.method.oracle_name is None:
            results.append(skipped(names[0], f"tree method {target.kind!r} names no oracle"))
        else:
            results.append(PropertyResult(
                names[0], lowest_oracle > _ALPHA, f"min p = {lowest_oracle:.3g}",
                f"{what}; chi-square of the emitted tuples vs the exact law of "
                f"specdec_np._reference.trees.{target.method.oracle_name}; each p must exceed "
                f"{_ALPHA:g}; lowest: {where_oracle}"))
        results.append(PropertyResult(
            names[1], lowest_target > _ALPHA, f"min p = {lowest_target:.3g}",
            f"{what}; the output continued by target draws vs the target's law of as many "
            f"tokens; each p must exceed {_ALPHA:g}; lowest: {where_target}"))
    return results


def _check_zero_probability(target: TreeTarget, vocab_size: int,
                            collector: _Collector) -> PropertyResult:
    """Every child proposes a token of target probability 0 (the draft rows put mass on
    it); at u = 0, and at 1 - 2^-53, none is accepted and the final token has mass."""
    name = "zero-probability drafts never accepted (u = 0)"
    if not target.takes["target_probs"] or not target.takes["uniforms"]:
        return skipped(name, "needs target_probs= and explicit uniforms")
    parents = (-1, -1, 0)
    p = np.full(vocab_size, 1.0 / (vocab_size - 2))
    p[:2] = 0.0  # tokens 0 and 1 have target probability 0 everywhere
    q = np.zeros(vocab_size)
    q[:2] = 0.5
    requests = []
    for u in (0.0, 0.25, _BELOW_ONE):
        for final in (0.0, 0.5, _BELOW_ONE):
            requests.append(_Request(
                parents, np.array([0, 1, 0], dtype=np.int64), np.tile(p, (4, 1)),
                np.tile(q, (3, 1)) if target.method.reads_draft_probs else None,
                uniforms=np.array([u, u, u, final])))
    output, nodes, lengths = _call(target, requests, "probs")
    collector.record(requests, (output, nodes, lengths), "zero-probability drafts")
    bad = [b for b in range(len(requests))
           if (output[b] != -1).sum() != 1 or int(output[b, 0]) in (0, 1)]
    return PropertyResult(
        name, not bad, f"{len(bad)}/{len(requests)} wrong",
        f"tree {list(parents)}, V = {vocab_size}, every draft token of target probability 0 "
        f"(draft rows on them), node uniforms 0, 0.25, 1 - 2^-53: nothing accepted, the final "
        f"token in the target's support"
        + (f"; e.g. {output[bad[0]].tolist()} at uniforms "
           f"{np.asarray(requests[bad[0]].uniforms).tolist()}" if bad else ""))


# --------------------------------------------------------------------------------------
# The exact law, integrated over the drafts and the uniforms
# --------------------------------------------------------------------------------------

#: The trees and vocabulary of the exact law (every draft assignment is enumerated).
_EXACT_SHAPES = ((-1, -1, 0), (-1, 0))
_EXACT_V = 4
_LAW_TOLERANCE = 1e-9


def _path(tokens: tuple[int, ...], parents: tuple[int, ...], node: int) -> tuple[int, ...]:
    """The tokens from the root down to ``node`` (empty for the root, ``node = -1``)."""
    path: list[int] = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return tuple(reversed(path))


def _draft_position(parents: tuple[int, ...], node: int, drafting: str | None) -> int:
    """The sibling position whose draft row node ``node`` carries (0 for every sibling
    drawn without replacement from one row)."""
    if drafting == "without_replacement":
        return 0
    return sum(1 for other in range(node) if parents[other] == parents[node])


def _draft_assignments(parents: tuple[int, ...], method: registry.TreeMethod, laws: _Laws,
                       fixed: tuple[int, ...]) -> list[tuple[tuple[int, ...], float]]:
    """Every way the drafter can fill the tree, with its probability."""
    vocab_size = laws.source.vocab_size
    assignments: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for node, parent in enumerate(parents):
        grown = []
        for tokens, weight in assignments:
            below = _path(tokens, parents, parent)
            if method.drafting == "fixed":
                law = np.eye(vocab_size)[fixed[node]]
            else:
                law = laws.draft(below, _draft_position(parents, node, method.drafting)).copy()
                if method.drafting == "without_replacement":
                    law[[tokens[s] for s in range(node) if parents[s] == parent]] = 0.0
                    law = law / law.sum() if law.sum() > 0 else law
            grown += [(tokens + (x,), weight * float(law[x])) for x in range(vocab_size)
                      if law[x] > 0]
        assignments = grown
    return assignments


def _integration_requests(target: TreeTarget, parents: tuple[int, ...], tokens: tuple[int, ...],
                          weight: float, rows: _Rows, laws: _Laws, shape: int,
                          also: tuple[_Laws, ...] = ()) -> list[tuple[_Request, float]]:
    """One draft assignment's requests: every node axis cut at its acceptance probability
    (and 1/2), the final axis at every final law's CDF points (and quarters), under
    ``laws`` and under each of ``also`` (the laws of a verifier that ignores a setting,
    integrated exactly too, so that its whole difference shows)."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    accept: list[list[float]] = [[] for _ in range(n)]
    final_points: list[float] = []

    def visit(node: int, path: tuple[int, ...]) -> None:
        kids = children[node + 1]
        for law in (laws, *also):
            q_rows = [list(law.draft(path, _draft_position(parents, kid,
                                                           target.method.drafting)))
                      if target.method.reads_draft_probs else None for kid in kids]
            conditional, final = _tree_reference.sibling_walk(
                target.kind, list(law.target(path)), tuple(tokens[k] for k in kids), q_rows)
            final_points.extend(np.cumsum(final).tolist())
            for kid, probability in zip(kids, conditional):
                accept[kid].append(probability)
        for kid in kids:
            visit(kid, path + (tokens[kid],))

    visit(-1, ())
    axes = [_oracles._cut_axis(a, 2) for a in accept] + [_oracles._cut_axis(final_points, 4)]
    mids = np.stack([m.reshape(-1) for m in np.meshgrid(*(a[0] for a in axes),
                                                        indexing="ij")], axis=1)
    widths = np.prod(np.stack([w.reshape(-1) for w in np.meshgrid(*(a[1] for a in axes),
                                                                  indexing="ij")]), axis=0)
    paths = [_path(tokens, parents, node) for node in range(n)]
    target_rows = np.stack([rows.target(())] + [rows.target(path) for path in paths])
    draft_rows = None
    if target.method.reads_draft_probs:
        draft_rows = np.array([rows.draft(_path(tokens, parents, parents[node]),
                                          _draft_position(parents, node,
                                                          target.method.drafting))
                               for node in range(n)]).reshape(n, rows.vocab_size)
    token_array = np.array(tokens, dtype=np.int64)
    request = _Request(parents, token_array, target_rows, draft_rows, shape=shape,
                       **laws.settings)
    return [(replace(request, uniforms=mids[i]), weight * float(widths[i]))
            for i in range(mids.shape[0])]


def _integrated(target: TreeTarget, parents: tuple[int, ...], rows: _Rows, laws: _Laws,
                shape: int, also: tuple[_Laws, ...] = ()) -> list[tuple[_Request, float]]:
    """Every draft assignment of one tree, integrated (:func:`_integration_requests`).

    Raises
    ------
    KeyError
        For a method that does not decide sibling by sibling (no thresholds to cut at).
    """
    fixed = _fixed_tokens(parents, rows.vocab_size)
    weighted = []
    for tokens, weight in _draft_assignments(parents, target.method, laws, fixed):
        weighted += _integration_requests(target, parents, tokens, weight, rows, laws, shape,
                                          also)
    return weighted


def _law_errors(target: TreeTarget, weighted: list[tuple[_Request, float]], output: np.ndarray,
                shape: int, parents: tuple[int, ...], laws: _Laws) -> tuple[float, float]:
    """The largest errors of one integrated tree's law: the emitted tuples against the
    method's oracle, and the output continued by the target against the target."""
    vocab_size = laws.source.vocab_size
    law: dict[tuple[int, ...], float] = {}
    for b, (request, weight) in enumerate(weighted):
        if request.shape == shape:
            emitted = tuple(int(t) for t in output[b] if t != -1)
            law[emitted] = law.get(emitted, 0.0) + weight
    oracle = _tree_reference.tree_emission_law(
        target.kind, laws.target, parents, vocab_size,
        draft=laws.draft if target.method.drafting != "fixed" else None,
        draft_token_ids=_fixed_tokens(parents, vocab_size))
    oracle_error = max(abs(law.get(t, 0.0) - oracle.get(t, 0.0)) for t in set(law) | set(oracle))
    length = max(len(t) for t in law) if law else 1
    continued = _tree_reference.continued_law(law, laws.target, length, vocab_size)
    expected = _tree_reference.continued_law({(): 1.0}, laws.target, length, vocab_size)
    return oracle_error, float(np.max(np.abs(continued - expected)))


def _check_exact_law(target: TreeTarget, rng: np.random.Generator,
                     collector: _Collector) -> list[PropertyResult]:
    names = (f"exact law equals the {target.kind} oracle",
             "exact law: continued output has the target's law")
    if not (target.takes["target_probs"] and target.takes["uniforms"]) or (
            target.method.reads_draft_probs and not target.takes["draft_probs"]):
        return [skipped(name, "needs target_probs= (and draft_probs=) and explicit uniforms")
                for name in names]
    if target.method.oracle_name is None:
        return [skipped(name, f"tree method {target.kind!r} names no oracle") for name in names]
    rows = _Rows(rng, _EXACT_V, ("probs", "probs"))
    laws = _Laws(rows, {}, target.dtype)
    weighted: list[tuple[_Request, float]] = []
    try:
        for shape, parents in enumerate(_EXACT_SHAPES):
            weighted += _integrated(target, parents, rows, laws, shape)
    except KeyError:  # a method that does not decide sibling by sibling
        return [skipped(name, _NO_THRESHOLDS.format(kind=target.kind)) for name in names]
    requests = [request for request, _ in weighted]
    result = _call(target, requests, "probs")
    collector.record(requests, result, "exact law")
    worst_oracle, worst_target = 0.0, 0.0
    for shape, parents in enumerate(_EXACT_SHAPES):
        oracle_error, target_error = _law_errors(target, weighted, result[0], shape, parents,
                                                 laws)
        worst_oracle, worst_target = max(worst_oracle, oracle_error), max(worst_target,
                                                                          target_error)
    what = (f"{len(requests)} requests integrating every draft assignment of the trees "
            f"{[list(s) for s in _EXACT_SHAPES]} (V = {_EXACT_V}, rows multiples of 1/1024, "
            f"children drawn by '{target.method.drafting}' drafting) and the uniforms (each "
            f"node's axis cut at its acceptance probability, the final axis at every final "
            f"law's CDF points); limit {_LAW_TOLERANCE:g}")
    return [
        PropertyResult(names[0], worst_oracle <= _LAW_TOLERANCE, f"max err {worst_oracle:.2g}",
                       f"{what}; the law of the emitted tuples vs specdec_np._reference.trees."
                       f"{target.method.oracle_name}"),
        PropertyResult(names[1], worst_target <= _LAW_TOLERANCE, f"max err {worst_target:.2g}",
                       f"{what}; the output continued by the target vs the target's law"),
    ]


_NO_THRESHOLDS = ("tree method {kind!r} has no per-node acceptance thresholds to cut the "
                  "uniforms at; Monte Carlo only")


def _exact_logits_batch(target: TreeTarget, form: tuple[str, str],
                        cases: tuple[_kit_ragged.SettingCase, ...], rng: np.random.Generator,
                        collector: _Collector) -> list[tuple[_kit_ragged.SettingCase, float, str]]:
    """One batch of chain trees (``case.drafts`` nodes), one per case, each with its own
    settings, rows load-bearing for them, every draft assignment and uniform cell
    integrated; each case's largest error against the oracle and the target."""
    groups = []
    weighted: list[tuple[_Request, float]] = []
    vocab_size = _kit_ragged.EXACT_V
    for shape, case in enumerate(cases):
        parents = tuple(range(-1, case.drafts - 1))
        rows = _Rows(rng, vocab_size, form)
        # The rows that carry the settings, as on the ragged layout: the root's target row
        # and the one after it (whatever the first token), or with target probabilities
        # (taken as processed) the draft row below the root.
        if form[0] == "logits":
            carriers = _kit_ragged.load_bearing_logits(rng, case.drafts + 1, vocab_size,
                                                       case.settings, target.dtype)
            rows.rows[("target", ())] = carriers[0]
            for token in range(vocab_size * case.drafts):
                rows.rows[("target", (token,))] = carriers[1]
        else:
            rows.rows[("draft", (), 0)] = _kit_ragged.load_bearing_logits(
                rng, 1, vocab_size, case.settings, target.dtype)[0]
        laws = _Laws(rows, case.settings, target.dtype)
        ignored = tuple(_Laws(rows, {**case.settings, name: _kit_ragged.OFF[name]},
                              target.dtype)
                        for name, value in case.settings.items()
                        if value != _kit_ragged.OFF[name])
        weighted += _integrated(target, parents, rows, laws, shape, ignored)
        groups.append((shape, case, parents, laws))
    requests = [request for request, _ in weighted]
    output = _call(target, requests, form[0], draft_form=form[1])
    label = f"{form[0]}/{form[1]}"
    collector.record(requests, output, f"{label} exact batch")
    return [(case, max(_law_errors(target, weighted, output[0], shape, parents, laws)), label)
            for shape, case, parents, laws in groups]


def _check_exact_logits(target: TreeTarget, rng: np.random.Generator,
                        collector: _Collector) -> list[PropertyResult]:
    """The exact laws from logits on chain trees, one property per aspect of
    :data:`specdec_np.testing._ragged.SETTING_CASES`, and draft logits with target
    probabilities where the method reads draft rows."""
    reads = target.method.reads_draft_probs
    aspects = tuple(dict.fromkeys(case.aspect for case in _kit_ragged.SETTING_CASES))
    missing = (f"the verifier takes no target_logits=, {'draft_logits=, ' if reads else ''}"
               "or uniforms=")
    missing_draft = "the verifier takes no target_probs=, draft_logits= or uniforms="
    errors: list[tuple[_kit_ragged.SettingCase, float, str]] = []
    draft_errors: list[tuple[_kit_ragged.SettingCase, float, str]] = []
    if target.method.sequence_level:  # no per-node thresholds: known before any row is drawn
        missing = missing_draft = _NO_THRESHOLDS.format(kind=target.kind)
    else:
        if all(target.takes[n] for n in ("target_logits", "uniforms")) and (
                not reads or target.takes["draft_logits"]):
            errors = _exact_logits_batch(target, ("logits", "logits"),
                                         _kit_ragged.SETTING_CASES, rng, collector)
        if reads and all(target.takes[n] for n in ("target_probs", "draft_logits", "uniforms")):
            draft_errors = _exact_logits_batch(target, ("probs", "logits"),
                                               _kit_ragged.DRAFT_TEMPERATURE_CASES, rng,
                                               collector)
    what = (f"chain trees of 0 and 1 nodes (V = {_kit_ragged.EXACT_V}), each with its own "
            f"settings, every draft assignment (children drawn by "
            f"'{target.method.drafting}' drafting) and uniform cell integrated; the law of the "
            f"emitted tuples vs specdec_np._reference.trees.{target.method.oracle_name}, and "
            f"continued by the target vs the target's law, the rows processed")
    results = _kit_ragged.aspect_results("exact law from logits", aspects, errors, what, missing)
    if reads:  # a method that reads no draft rows has no draft logits to process
        results += _kit_ragged.aspect_results(
            "exact law from target probabilities", (_kit_ragged.DRAFT_TEMPERATURE,),
            draft_errors, what, missing_draft)
    return results


# --------------------------------------------------------------------------------------
# Greedy
# --------------------------------------------------------------------------------------


def _random_requests(target: TreeTarget, rng: np.random.Generator, vocab_size: int,
                     size: int, form: str, settings_menu: list[dict[str, Any]],
                     stochastic: bool) -> list[_Request]:
    """Random trees (up to 5 nodes), rows per node with ties sometimes, drafts mostly the
    argmax, per-request settings from the menu."""
    requests = []
    for b in range(size):
        n = int(rng.integers(0, 6))
        parents = tuple(int(rng.integers(-1, j)) for j in range(n))
        logits = rng.standard_normal((n + 1, vocab_size)) * 2
        if rng.random() < 0.3:
            logits[:, -1] = logits.max(axis=1)
        rows = logits if form == "logits" else np.exp(logits) / np.exp(logits).sum(
            axis=1, keepdims=True)
        argmax = rows.argmax(axis=1)
        tokens = np.array([argmax[parent + 1] if rng.random() < 0.6 else
                           rng.integers(vocab_size) for parent in parents], dtype=np.int64)
        draft = None
        if target.method.reads_draft_probs:
            draft = rng.standard_normal((n, vocab_size))
            if form != "logits":
                draft = np.exp(draft) / np.exp(draft).sum(axis=1, keepdims=True)
        requests.append(_Request(parents, tokens, rows, draft,
                                 uniforms=rng.random(n + 1) if stochastic else None,
                                 **settings_menu[b % len(settings_menu)]))
    return requests


def _check_greedy(target: TreeTarget, vocab_size: int, rng: np.random.Generator,
                  collector: _Collector) -> list[PropertyResult]:
    results = []
    for form in ("probs", "logits"):
        name = f"greedy walk of the reference ({form})"
        if not target.takes[f"target_{form}"]:
            results.append(skipped(name, f"the verifier takes no target_{form}="))
            continue
        # Temperature 0 and 1 alternate: the method must walk greedily either way.
        requests = _random_requests(target, rng, vocab_size, 200, form,
                                    [{"temperature": 0.0}, {}], stochastic=False)
        result = _call(target, requests, form, source="none")
        before = len(collector.greedy_bad)
        collector.record(requests, result, f"greedy trees ({form})")
        bad = collector.greedy_bad[before:]
        results.append(PropertyResult(
            name, not bad, f"{len(bad)}/{len(requests)} wrong",
            "; ".join(bad[:2]) if bad else
            f"{len(requests)} random trees (up to 5 nodes, V = {vocab_size}, ties among the "
            f"rows, temperature 0 and 1): follow the child equal to the first argmax, then "
            f"emit the argmax"))
    return results


# --------------------------------------------------------------------------------------
# Batch invariance and seeds
# --------------------------------------------------------------------------------------


def _check_batch(target: TreeTarget, vocab_size: int, rng: np.random.Generator,
                 collector: _Collector) -> list[PropertyResult]:
    stochastic = target.method.stochastic
    form = "logits" if target.takes["target_logits"] else "probs"
    menu = _kit_ragged.settings_menu() if form == "logits" else [{}, {"temperature": 0.0}]
    size = 32
    requests = _random_requests(target, rng, vocab_size, size, form, menu, stochastic)
    source = "uniforms" if stochastic else "none"

    def call(rows: list[int], **keywords: Any) -> np.ndarray:
        chosen = [requests[b] for b in rows]
        result = _call(target, chosen, form, source, **keywords)
        collector.record(chosen, result, "tree batch")
        return _widen(result[0], 6)

    results = []
    name = "tree batch invariance"
    if stochastic and not target.takes["uniforms"]:
        results.append(skipped(name, "needs explicit uniforms"))
    else:
        full = call(list(range(size)))
        order = rng.permutation(size)
        permuted = call(order.tolist())
        differing = set(order[np.flatnonzero(np.any(permuted != full[order], axis=1))].tolist())
        for b in range(8):
            if np.any(call([b])[0] != full[b]):
                differing.add(b)
        results.append(PropertyResult(
            name, not differing, f"{len(differing)} requests differ",
            f"{size} random trees (up to 5 nodes, V = {vocab_size}, {form}, per-request "
            f"settings, greedy ones mixed in) in a batch, permuted, and 8 alone, "
            f"{'same uniforms' if stochastic else 'no uniforms'}: each request's output must "
            f"be the same"))
    if stochastic:
        results += _kit_padded.seed_checks(target.sources(), call, size)
    return results


def _widen(output: np.ndarray, width: int) -> np.ndarray:
    return np.pad(output, ((0, 0), (0, width - output.shape[1])), constant_values=-1)


# --------------------------------------------------------------------------------------
# The tree layout's run
# --------------------------------------------------------------------------------------


def run(verifier: Callable[..., Any], kind: str, *, dtype: Any, limit: TimeLimit,
        vocab_size: int, num_rows: int, rng: np.random.Generator,
        k: int | None = None) -> list[PropertyResult]:
    """Every tree property of ``kind`` (see the module docstring), in report order.

    Parameters
    ----------
    verifier : callable
        With ``verify_tree``'s keywords.
    kind : str
        A registry tree method.
    dtype : numpy.dtype
    limit : TimeLimit
    vocab_size : int
        V of the random trees; the Monte Carlo trees use V = 5 (exact laws stay small).
    num_rows : int
        Sets the Monte Carlo sizes (a tenth per tree shape).
    rng : numpy.random.Generator
    k : int, optional
        Unused: the trees' depths come from the kit's own tree shapes (taken so that every
        layout's kit has one signature).

    Returns
    -------
    list of PropertyResult
    """
    target = TreeTarget(verifier, kind, dtype, limit)
    collector = _Collector(all_greedy=not target.method.stochastic)
    rows: list[PropertyResult] = []
    if not target.method.stochastic:
        rows += guard_keywords("greedy walk of the reference", lambda: _check_greedy(
            target, vocab_size, rng, collector), limit)
    else:
        sources = target.sources() or ["own"]
        rows += guard_keywords(f"exact law equals the {kind} oracle", lambda: _check_exact_law(
            target, rng, collector), limit)
        rows += guard_keywords("exact law from logits", lambda: _check_exact_logits(
            target, rng, collector), limit)
        rows += guard_keywords("Monte Carlo", lambda: _check_monte_carlo(
            target, "probs", {}, 5, num_rows, rng, collector, sources), limit)
        rows += guard_keywords("Monte Carlo from logits", lambda: _check_monte_carlo(
            target, "logits", _FILTERS, 5, num_rows, rng, collector, sources[:1]), limit)
        rows += guard_keywords("zero-probability drafts never accepted (u = 0)",
                         lambda: _check_zero_probability(target, 5, collector), limit)
    rows += guard_keywords("tree batch invariance", lambda: _check_batch(
        target, vocab_size, rng, collector), limit)
    if target.method.stochastic:
        rows.append(greedy_result(
            "greedy requests (temperature 0): the greedy walk", collector.greedy_count,
            collector.greedy_bad,
            "temperature-0 requests mixed into the batches above: the reference's greedy "
            "walk on their raw rows"))
    rows.append(format_result(
        "tree output format", sorted(set(target.format_errors)) + collector.format_problems,
        collector.requests,
        "output_token_ids [B, max_depth + 1] holding the accepted nodes' tokens along a "
        "root-down path, one final token, -1 padding; accepted_nodes and accepted_lengths "
        "consistent where returned"))
    return rows



#: The tree layout's entry of the kit (``registry.get_layout("tree").kit``), with the
#: arguments every layout's kit takes.
check = run
