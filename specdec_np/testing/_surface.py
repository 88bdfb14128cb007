"""The conformance kit's sampling settings on the ragged layout: penalties, masks, bias, stops.

Engines hand a verifier rows and per-request settings whose effect on a row depends on the
text before it, which inside a draft chain includes the drafts before that position
(``docs/semantics.md``, "The whole sampling surface").  For a ragged verifier that takes
those keywords (``prompt_token_ids``, ``output_token_ids``, ``repetition_penalty``,
``frequency_penalty``, ``presence_penalty``, ``logit_bias``, ``allowed_token_ids``,
``bad_words_token_ids``, ``min_tokens``, ``stop_token_ids``, ``max_tokens``,
``token_bitmask``, ``logprobs``), :func:`run` checks:

* one property per class of row settings (the cases of
  :mod:`specdec_np.testing._surface_cases`): penalties whose drafts repeat tokens, a
  grammar bitmask computed along the drafts that forbids a draft and gives the bonus row
  its own mask, a logit bias at temperatures below and above 1, allowed ids, bad words and
  ``min_tokens`` along the drafts.  For the lossless kinds, the exact law on ``V = 6``,
  ``k = 2``: the law of row ``i`` given the tokens before it is the reference's, and the
  output continued by the target must have the law of the target's whole chain, to 1e-9.
  Point-mass drafts (each a lossless drafter alone) and, where the verifier takes draft
  logits, drafts drawn from draft logits processed with the same context are integrated
  over their uniforms in two calls: the acceptance uniforms on a grid cut at every
  acceptance threshold of the right law and of each wrong one the case names, which gives
  each grid cell's accepted length; then, for each accepted length, its largest cell swept
  over the residual or bonus uniform, cut at the CDF points of that position's rows.  For
  the deterministic kinds, equality with
  :func:`specdec_np._reference.ragged.verify_ragged`;
* greedy requests carrying every setting above, against the reference (the argmax of the
  rows after masks, bias and penalties);
* stop tokens and ``max_tokens``: the same batch with and without them (the same
  randomness) must give the run cut at its first stop (kept) or budget, nothing after,
  ``accepted_lengths`` counting only emitted drafts and ``finished`` where it is returned;
* ``logprobs=N``: each emitted token's processed and raw log-probability and the top
  ``N`` of the processed law, against the reference's;
* for a stochastic verifier without ``uniforms=``: a chi-square of the continued output
  against the target's chain law, per case (the exact laws are then skipped).

A keyword the verifier lacks makes the properties that need it skipped, never passed.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import registry
from .._reference import chains as _reference
from .._reference import ragged as ragged_reference
from .._reference import surface as surface_reference
from . import _monte_carlo, _oracles, _statistics
from ._padded import SOURCE_LABELS, source_keywords
from ._report import PropertyResult, guard_keywords, has_keyword, layout_keywords, skipped
from ._surface_cases import (
    ASPECTS,
    BIAS,
    CASES,
    DRAFTS,
    GRAMMAR,
    GREEDY,
    LOGPROBS,
    MASKS,
    NUMBERS,
    OFF,
    PENALTIES,
    PENALTY_SETTINGS,
    STOPS,
    SURFACE_KEYWORDS,
    VARIANTS,
    VOCAB,
    Grammar,
    Model,
    SurfaceCase,
    bitmask_word,
    case_model,
    chain_grammar,
    property_name,
)

__all__ = ["ASPECTS", "BIAS", "GRAMMAR", "GREEDY", "LOGPROBS", "MASKS", "PENALTIES", "STOPS",
           "run"]

_LAW_TOLERANCE = 1e-9
_ALPHA = 1e-4
#: Requests per case of the Monte Carlo run (verifiers without ``uniforms=``).
_MONTE_CARLO_REQUESTS = 600
#: Log-probabilities are float32: an absolute and a relative tolerance.
_LOG_TOLERANCE = (2e-5, 2e-6)
#: ``logprobs=N`` of the logprobs check.
_TOP = 3


# --------------------------------------------------------------------------------------
# Calls
# --------------------------------------------------------------------------------------


@dataclass
class _Result:
    """What the verifier returned, as NumPy: the ids and the attributes it has."""

    output: np.ndarray
    accepted_lengths: np.ndarray | None = None
    finished: np.ndarray | None = None
    logprobs: dict[str, np.ndarray] | None = None


def _read(result: Any, expected: tuple[int, int]) -> _Result:
    output = _monte_carlo.to_numpy(getattr(result, "output_token_ids", result))
    if output.dtype.kind not in "iu" or output.shape != expected:
        raise TypeError(f"the output must be integer ids of shape [B, max_k + 1] = "
                        f"{list(expected)}; found {output.dtype} {list(output.shape)}")

    def attribute(name: str) -> np.ndarray | None:
        value = getattr(result, name, None)
        return None if value is None else _monte_carlo.to_numpy(value)

    names = ("logprobs", "raw_logprobs", "top_token_ids", "top_logprobs")
    found = {name: attribute(name) for name in names}
    logprobs = None
    if all(value is not None for value in found.values()):
        logprobs = {name: np.asarray(value) for name, value in found.items()
                    if value is not None}
    return _Result(output.astype(np.int64), attribute("accepted_lengths"),
                   attribute("finished"), logprobs)


@dataclass
class _Caller:
    """Calls the ragged verifier with the sampling settings it takes."""

    target: Any
    takes: dict[str, bool] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.takes = {**self.target.takes, **{
            name: has_keyword(self.target.verifier, name) for name in SURFACE_KEYWORDS}}

    def __call__(self, values: dict[str, Any]) -> _Result:
        keywords = layout_keywords(self.takes, values, ("num_draft_tokens", "draft_token_ids"),
                                   self.target.kind)
        result = self.target.limit.call(self.target.verifier, **keywords)
        counts = np.asarray(values["num_draft_tokens"])
        return _read(result, (counts.size, int(counts.max(initial=0)) + 1))

    def lacks(self, names: tuple[str, ...]) -> str:
        """The first keyword of ``names`` the verifier lacks, as a skip reason, or ``""``."""
        for name in names:
            if not self.takes.get(name):
                return f"the verifier takes no {name}= keyword"
        return ""


@dataclass
class _Request:
    """One request of a call: its rows and settings (``model``), drafts and uniforms."""

    model: Model
    ids: tuple[int, ...]
    uniforms: np.ndarray
    greedy: bool = False
    bonus: int | None = None
    #: For the exact laws: which draft tuple, grid cell and stage it integrates.
    tag: Any = None

    @property
    def k(self) -> int:
        return len(self.ids)


def _assemble(requests: list[_Request], draft_form: str, dtype: Any,
              source: str | None = "uniforms", salt: int = 0) -> dict[str, Any]:
    """The keywords of one call holding ``requests``: ``draft_form`` is ``"point"``
    (one-hot draft probabilities), ``"logits"`` or ``"none"``; ``source`` the randomness
    (``"uniforms"``: each request's own, a seeded source or ``"generator"`` salted with
    ``salt``, or None: nothing passed)."""
    counts = np.array([r.k for r in requests], dtype=np.int64)
    max_k = int(counts.max(initial=0))
    batch_size = len(requests)
    vocab_size = requests[0].model.target.shape[1]
    values: dict[str, Any] = {
        "num_draft_tokens": counts,
        "draft_token_ids": np.array([x for r in requests for x in r.ids], dtype=np.int64),
        "target_logits": np.ascontiguousarray(
            np.concatenate([r.model.target[: r.k + 1] for r in requests]), dtype=dtype),
        "temperature": np.array([0.0 if r.greedy else float(
            r.model.case.sampling.get("temperature", 1.0)) for r in requests]),
    }
    if draft_form == "point":
        rows = np.zeros((int(counts.sum()), vocab_size), dtype=dtype)
        rows[np.arange(rows.shape[0]), values["draft_token_ids"]] = 1.0
        values["draft_probs"] = rows
    elif draft_form == "logits":
        values["draft_logits"] = np.ascontiguousarray(np.concatenate(
            [r.model.draft[: r.k] for r in requests if r.model.draft is not None]).reshape(
                -1, vocab_size), dtype=dtype)
    for name in ("top_k", "top_p", "min_p"):
        if any(name in r.model.case.sampling for r in requests):
            values[name] = np.array([r.model.case.sampling.get(name, OFF[name])
                                     for r in requests],
                                    dtype=np.int64 if name == "top_k" else np.float64)
    for name in sorted({name for r in requests for name in r.model.case.settings}):
        if name in NUMBERS:
            values[name] = np.array(
                [r.model.case.settings.get(name, NUMBERS[name]) for r in requests],
                dtype=np.int64 if name == "min_tokens" else np.float64)
        else:
            values[name] = [r.model.case.settings.get(name) for r in requests]
    if any(r.model.case.grammar is not None for r in requests):
        words = [bitmask_word(r.model.forbidden(i, r.ids[:i])) for r in requests
                 for i in range(r.k + 1)]
        values["token_bitmask"] = np.array(words, dtype=np.int32).reshape(-1, 1)
    if source == "uniforms":
        values["uniforms"] = np.zeros((batch_size, max_k + 2))
        for b, r in enumerate(requests):
            values["uniforms"][b, : r.k + 2] = r.uniforms
    elif source is not None:
        values.update(source_keywords(source, batch_size, salt))
    if any(r.bonus is not None for r in requests):
        values["bonus_token_ids"] = np.array([r.bonus if r.bonus is not None else 0
                                              for r in requests], dtype=np.int64)
    return values


def _reference_output(values: dict[str, Any], kind: str) -> np.ndarray:
    """The reference's ids for a call's keywords (a deterministic ``kind``, or greedy
    requests: no uniform is read)."""
    settings = {name: values[name] for name in SURFACE_KEYWORDS if values.get(name) is not None}
    draft = values.get("draft_logits")
    from_logits = draft is not None
    if draft is None:
        draft = values.get("draft_probs")
    counts = values["num_draft_tokens"]
    output = ragged_reference.verify_ragged(
        counts, values["draft_token_ids"], values["target_logits"], draft,
        method=kind, from_logits=True, draft_from_logits=from_logits,
        temperature=values["temperature"], top_k=values.get("top_k"),
        top_p=values.get("top_p"), min_p=values.get("min_p"),
        bonus_token_ids=values.get("bonus_token_ids"),
        uniforms=np.zeros((len(counts), int(np.max(counts, initial=0)) + 2)),
        settings=settings)
    return np.asarray(output[0])


def _draft_form(caller: _Caller, case: SurfaceCase) -> str:
    if case.drafts is None:
        return "logits"
    return "point" if caller.takes["draft_probs"] else "none"


# --------------------------------------------------------------------------------------
# The exact laws of the row settings
# --------------------------------------------------------------------------------------


def _acceptance_points(oracle: str | None, p: np.ndarray, q: np.ndarray,
                       drafts: tuple[int, ...]) -> list[list[float]]:
    """Per draft position, the thresholds a lossless verifier compares its acceptance
    uniform with: token-wise ratios (``oracle`` ``rejection_law``), block verification's
    ``h_i`` (``block_verification_law``), both for another."""
    k = len(drafts)
    points: list[list[float]] = [[] for _ in range(k)]
    if oracle != "block_verification_law":
        ratios = _oracles.acceptance_probabilities(p[np.arange(k), list(drafts)],
                                                   q[np.arange(k), list(drafts)])
        for i in range(k):
            points[i].append(float(ratios[i]))
    if oracle != "rejection_law":
        thresholds, _ = _oracles._block_terms(p, q, drafts)
        for i in range(k):
            points[i].append(float(thresholds[i]))
    return points


def _final_points(p: np.ndarray, q: np.ndarray, drafts: tuple[int, ...],
                  position: int) -> list[float]:
    """The CDF points of the law a lossless verifier draws the token after ``position``
    accepted drafts from: the residual rows of both algorithms (the target row where they
    have no mass), or the bonus row."""
    k = len(drafts)
    if position == k:
        return _oracles._cdf_points(p[k])
    _, weighted = _oracles._block_terms(p, q, drafts)
    points = (_oracles._cdf_points(weighted[position])
              + _oracles._cdf_points(np.maximum(p[position] - q[position], 0.0)))
    if weighted[position].sum() == 0 or np.all(p[position] <= q[position]):
        points += _oracles._cdf_points(p[position])
    return points


@dataclass(frozen=True)
class _Plan:
    """One case's exact law, all but the verifier's outputs.

    Attributes
    ----------
    model : Model
    first : tuple of _Request
        The acceptance cells of every draft tuple, the residual and bonus uniforms 1/2;
        each tagged ``(drafts, probability of the tuple times the cell's volume)``.
    finals : dict
        ``(drafts, accepted drafts)`` -> midpoints and widths of the residual (bonus)
        uniform's cells.
    greedy : tuple of _Request
        Greedy requests with the case's settings, and ``greedy_expected`` their outputs.
    """

    model: Model
    first: tuple[_Request, ...]
    finals: dict[tuple[tuple[int, ...], int], tuple[np.ndarray, np.ndarray]]
    greedy: tuple[_Request, ...]
    greedy_expected: np.ndarray


@functools.cache
def _plan(index: int, dtype_name: str, oracle: str | None) -> _Plan:
    model = case_model(index, dtype_name)
    case = model.case
    point_mass = case.drafts is not None
    tuples = model.drafts()
    model.prefetch([key for drafts, _ in tuples for variant in (None, *case.variants)
                    for key in model.chain_keys(drafts, variant, point_mass)])
    first = []
    finals = {}
    for drafts, weight in tuples:
        laws = [model.chain(drafts, variant, point_mass) for variant in (None, *case.variants)]
        axes = [_oracles._cut_axis([point for p, q in laws
                                    for point in _acceptance_points(oracle, p, q, drafts)[i]], 1)
                for i in range(len(drafts))]
        for cell in itertools.product(*(range(axis[0].size) for axis in axes)):
            mids = [float(axes[i][0][c]) for i, c in enumerate(cell)]
            volume = math.prod(float(axes[i][1][c]) for i, c in enumerate(cell))
            first.append(_Request(model, drafts, np.array([*mids, 0.5, 0.5]),
                                  tag=(drafts, weight * volume)))
        for position in range(len(drafts) + 1):
            finals[(drafts, position)] = _oracles._cut_axis(
                [point for p, q in laws for point in _final_points(p, q, drafts, position)], 1)
    model.target_law(DRAFTS)  # kept for the law errors
    greedy = _greedy_requests(model)
    expected = _reference_output(_assemble(greedy, "none", model.target.dtype, None),
                                 "greedy")
    return _Plan(model, tuple(first), finals, tuple(greedy), expected)


def _greedy_requests(model: Model) -> list[_Request]:
    """Greedy requests with the case's settings: the drafts the argmax accepts, ones it
    rejects at the first and at the second position, and the case's first tuple."""
    chain = model.greedy_chain()
    tuples = [chain, ((chain[0] + 1) % VOCAB, chain[1]), (chain[0], (chain[1] + 1) % VOCAB)]
    if model.case.drafts:
        tuples.append(model.case.drafts[0])
    return [_Request(model, tuple(drafts), np.zeros(len(drafts) + 2), greedy=True)
            for drafts in tuples]


@dataclass
class _Tally:
    """One law's emitted prefixes with their probabilities."""

    weights: dict[tuple[int, ...], float] = field(default_factory=dict)

    def add(self, prefix: tuple[int, ...], weight: float) -> None:
        self.weights[prefix] = self.weights.get(prefix, 0.0) + weight


@dataclass
class _Greedy:
    """The greedy requests checked across the batches, and those that were wrong."""

    count: int = 0
    wrong: list[str] = field(default_factory=list)

    def check(self, found: np.ndarray, expected: np.ndarray, requests: list[_Request],
              label: str) -> None:
        self.count += len(requests)
        for b, request in enumerate(requests):
            if np.any(found[b] != expected[b]):
                self.wrong.append(f"{label}: drafts {list(request.ids)} gave "
                                  f"{found[b].tolist()}, expected {expected[b].tolist()}")


def _emitted(row: np.ndarray, drafts: tuple[int, ...]) -> tuple[int, ...] | None:
    """The emitted tokens of an output row, or None unless they are an accepted draft
    prefix, one token in ``[0, V)``, then -1."""
    tokens = row[row >= 0]
    length = tokens.size
    if (length == 0 or length > len(drafts) + 1 or np.any(row[length:] != -1)
            or np.any(tokens >= VOCAB) or tuple(tokens[:-1].tolist()) != drafts[: length - 1]):
        return None
    return tuple(tokens.tolist())


def _law_error(model: Model, tally: _Tally) -> tuple[float, float]:
    """The largest difference between the law of the tallied outputs continued by the
    target and the target's chain law, and the mass on prefixes of target probability 0
    (counted in the difference too)."""
    truth = model.target_law(DRAFTS)
    law = np.zeros_like(truth)
    impossible = 0.0
    for prefix, weight in tally.weights.items():
        reach = math.prod(float(model.law(j, prefix[:j])[prefix[j]]) for j in range(len(prefix)))
        if reach == 0.0:
            impossible += weight
        else:
            law[prefix] += weight * truth[prefix] / reach
    return float(np.max(np.abs(law - truth))) + impossible, impossible


def _exact_case(caller: _Caller, oracle: str | None, index: int, greedy: _Greedy,
                problems: list[str]) -> tuple[list[tuple[float, str]], int]:
    """One case's law errors (per point-mass tuple, or one for drafts from draft logits)
    and the number of requests it sent."""
    plan = _plan(index, np.dtype(caller.target.dtype).name, oracle)
    model, case = plan.model, plan.model.case
    form = _draft_form(caller, case)
    requests = [*plan.first, *plan.greedy]
    result = caller(_assemble(requests, form, caller.target.dtype))
    greedy.check(result.output[len(plan.first):], plan.greedy_expected, list(plan.greedy),
                 case.aspect)
    # The accepted length of each acceptance cell; then, per draft tuple and length, the
    # largest such cell swept over the residual (bonus) uniform.
    masses: dict[tuple[tuple[int, ...], int], float] = {}
    widest: dict[tuple[tuple[int, ...], int], _Request] = {}
    for b, request in enumerate(plan.first):
        drafts, mass = request.tag
        emitted = _emitted(result.output[b], drafts)
        if emitted is None:
            problems.append(f"{case.label}: drafts {list(drafts)} gave "
                            f"{result.output[b].tolist()}")
            continue
        key = (drafts, len(emitted) - 1)
        masses[key] = masses.get(key, 0.0) + mass
        if key not in widest or widest[key].tag[1] < mass:
            widest[key] = request
    second = []
    for key, request in widest.items():
        mids, widths = plan.finals[key]
        for mid, width in zip(mids, widths):
            uniforms = request.uniforms.copy()
            uniforms[-2:] = mid
            second.append(_Request(model, key[0], uniforms, tag=(key, masses[key] * width)))
    output = caller(_assemble(second, form, caller.target.dtype)).output if second else None
    tallies: dict[tuple[int, ...], _Tally] = {}
    for b, request in enumerate(second):
        (drafts, position), mass = request.tag
        emitted = None if output is None else _emitted(output[b], drafts)
        if emitted is None or len(emitted) != position + 1:
            problems.append(f"{case.label}: drafts {list(drafts)} gave "
                            f"{None if output is None else output[b].tolist()} where the same "
                            f"acceptance uniforms accepted {position} with other residual "
                            f"and bonus uniforms")
            continue
        tallies.setdefault(drafts if case.drafts is not None else (), _Tally()).add(emitted,
                                                                                    mass)
    errors = []
    for drafts_key, tally in tallies.items():
        error, impossible = _law_error(model, tally)
        label = case.label + (f" (drafts {list(drafts_key)})" if drafts_key else "")
        if impossible:
            problems.append(f"{label}: tokens of target probability 0 emitted with "
                            f"probability {impossible:.3g}")
        errors.append((error, label))
    return errors, len(requests) + len(second)


def _exact_aspect(caller: _Caller, kind: str, aspect: str, greedy: _Greedy) -> PropertyResult:
    """The exact law of every case of ``aspect`` the verifier's keywords allow."""
    name = property_name(aspect)
    indices = [i for i, case in enumerate(CASES) if case.aspect == aspect]
    runnable = [i for i in indices if not caller.lacks(CASES[i].keywords)]
    if not runnable:
        return skipped(name, caller.lacks(CASES[indices[0]].keywords))
    oracle = registry.get(kind).oracle_name
    errors: list[tuple[float, str]] = []
    problems: list[str] = []
    sent = 0
    for index in runnable:
        found, count = _exact_case(caller, oracle, index, greedy, problems)
        errors += found
        sent += count
    worst, where = max(errors, default=(math.inf, "no output could be tallied"))
    passed = worst <= _LAW_TOLERANCE and not problems
    wrong_laws = sorted({VARIANTS[v] for i in runnable for v in CASES[i].variants})
    detail = (f"{sent} requests (V = {VOCAB}, k = {DRAFTS}, each row's law depending on the "
              f"tokens before it, the bonus drawn by the verifier, greedy requests mixed in), "
              f"cases: {'; '.join(CASES[i].label for i in runnable)}; law of the output "
              f"continued by the target vs the target's chain law (specdec_np._reference."
              f"surface.adjust_logits, then process_logits), limit {_LAW_TOLERANCE:g}; "
              f"uniforms cut at the thresholds of the right law and of these wrong ones: "
              f"{'; '.join(wrong_laws)}")
    if not passed:
        detail += f"; worst: {where}" + (f"; {problems[0]}" if problems else "")
    left_out = [i for i in indices if i not in runnable]
    if left_out:
        detail += (f"; not run: {CASES[left_out[0]].label} "
                   f"({caller.lacks(CASES[left_out[0]].keywords)})")
    return PropertyResult(name, passed, f"max err {worst:.2g}", detail)


@functools.cache
def _reference_plan(index: int, dtype_name: str, kind: str,
                    form: str) -> tuple[list[_Request], np.ndarray, np.ndarray]:
    """A deterministic kind's requests of one case (random drafts, the bonus given, greedy
    ones last), the reference's outputs, and which are on a knife edge."""
    model = case_model(index, dtype_name)
    rng = np.random.default_rng([index, 23])
    requests = [_Request(model, tuple(int(x) for x in rng.integers(0, VOCAB, DRAFTS)),
                         np.zeros(DRAFTS + 2), bonus=int(rng.integers(VOCAB)))
                for _ in range(8)]
    requests += [replace(r, bonus=int(rng.integers(VOCAB))) for r in _greedy_requests(model)]
    expected = _reference_output(_assemble(requests, form, model.target.dtype, None), kind)
    decisions = _reference.decisions_for(registry.get(kind))
    edges = np.array([not r.greedy and decisions(model.chain(r.ids)[0], None,
                                                 np.array(r.ids), None).knife_edge(1e-5)
                      for r in requests])
    return requests, expected, edges


def _reference_aspect(caller: _Caller, kind: str, aspect: str,
                      greedy: _Greedy) -> PropertyResult:
    """A deterministic kind on the cases of ``aspect`` against the reference."""
    name = property_name(aspect)
    indices = [i for i, case in enumerate(CASES) if case.aspect == aspect]
    runnable = [i for i in indices if not caller.lacks(CASES[i].keywords)]
    if not runnable:
        return skipped(name, caller.lacks(CASES[indices[0]].keywords))
    bad: list[str] = []
    count = 0
    for index in runnable:
        form = _draft_form(caller, CASES[index])
        requests, expected, edges = _reference_plan(
            index, np.dtype(caller.target.dtype).name, kind, form)
        output = caller(_assemble(requests, form, caller.target.dtype, None)).output
        rows = [b for b in range(len(requests)) if not edges[b]]
        sampled = [b for b in rows if not requests[b].greedy]
        count += len(sampled)
        bad += [f"{CASES[index].label}: drafts {list(requests[b].ids)} gave "
                f"{output[b].tolist()}, expected {expected[b].tolist()}"
                for b in sampled if np.any(output[b] != expected[b])]
        chosen = [b for b in rows if requests[b].greedy]
        greedy.check(output[chosen], expected[chosen], [requests[b] for b in chosen], aspect)
    return PropertyResult(
        name, not bad, f"{len(bad)}/{count} differ",
        f"{count} sampled requests (V = {VOCAB}, k = {DRAFTS}, random drafts, the bonus "
        f"given, greedy ones mixed in; decisions within rounding of a threshold left out) "
        f"vs specdec_np._reference.ragged.verify_ragged; cases: "
        f"{'; '.join(CASES[i].label for i in runnable)}" + (f"; e.g. {bad[0]}" if bad else ""))


# --------------------------------------------------------------------------------------
# Monte Carlo, for a stochastic verifier without uniforms=
# --------------------------------------------------------------------------------------


def _greedy_alone(caller: _Caller, kind: str, greedy: _Greedy) -> list[PropertyResult]:
    """Each case's greedy requests in a call of their own (they read no randomness)."""
    oracle = registry.get(kind).oracle_name
    for index, case in enumerate(CASES):
        if not caller.lacks(case.keywords):
            plan = _plan(index, np.dtype(caller.target.dtype).name, oracle)
            found = caller(_assemble(list(plan.greedy), _draft_form(caller, case),
                                     caller.target.dtype, None)).output
            greedy.check(found, plan.greedy_expected, list(plan.greedy), case.aspect)
    return []



def _monte_carlo_law(caller: _Caller, rng: np.random.Generator) -> PropertyResult:
    """Point-mass cases through the verifier's own randomness: a chi-square of the output
    continued by target draws against the target's chain law, per case."""
    source = next(iter(caller.target.sources()), "own")
    name = property_name(f"Monte Carlo ({SOURCE_LABELS[source]})")
    runnable = [i for i, case in enumerate(CASES) if case.drafts is not None
                and not caller.lacks(case.keywords)]
    if not runnable:
        return skipped(name, caller.lacks(CASES[0].keywords))
    lowest, worst = 1.0, ""
    for position, index in enumerate(runnable):
        model = case_model(index, np.dtype(caller.target.dtype).name, monte_carlo=True)
        tuples = model.case.drafts or ()
        requests = [_Request(model, tuples[b % len(tuples)], np.zeros(DRAFTS + 2))
                    for b in range(_MONTE_CARLO_REQUESTS)]
        output = caller(_assemble(requests, _draft_form(caller, model.case),
                                  caller.target.dtype, None if source == "own" else source,
                                  31 + position)).output
        emitted: dict[tuple[int, ...], int] = {}
        for b, request in enumerate(requests):
            tokens = _emitted(output[b], request.ids)
            if tokens is None:
                return PropertyResult(name, False, "malformed output",
                                      f"{model.case.label}: drafts {list(request.ids)} gave "
                                      f"{output[b].tolist()}")
            emitted[tokens] = emitted.get(tokens, 0) + 1
        counts = np.zeros((VOCAB,) * (DRAFTS + 1))
        for tokens, count in emitted.items():
            model.continue_into(counts, tokens, count, rng)
        p_value = _statistics.chi_square_test(counts.reshape(-1),
                                              model.target_law(DRAFTS).reshape(-1))
        if p_value <= lowest:
            lowest, worst = p_value, model.case.label
    return PropertyResult(
        name, lowest > _ALPHA, f"min p = {lowest:.3g}",
        f"{_MONTE_CARLO_REQUESTS} requests per case (V = {VOCAB}, k = {DRAFTS}, point-mass "
        f"drafts, the bonus drawn by the verifier), cases: "
        f"{'; '.join(CASES[i].label for i in runnable)}; chi-square of the output continued "
        f"by target draws vs the target's chain law; each p must exceed {_ALPHA:g}; "
        f"lowest: {worst}")


# --------------------------------------------------------------------------------------
# Stops, and logprobs
# --------------------------------------------------------------------------------------

RequestSettings = Callable[[int], tuple[dict[str, Any], dict[str, Any], Grammar | None]]


def _plain_requests(rng: np.random.Generator, count: int, dtype: Any, greedy_only: bool,
                    settings: RequestSettings | None = None,
                    max_k: int = 3) -> list[_Request]:
    """Requests with ``k_b`` in ``0..max_k`` whose drafts are mostly their rows' argmax
    (long accepted runs), a third greedy (all with ``greedy_only``), the others sampled at
    temperature 0.7 or 1.4, the bonus given; ``settings(b)`` gives request ``b``'s row
    settings, filters and grammar."""
    requests = []
    for b in range(count):
        k = int(rng.integers(0, max_k + 1))
        row_settings, sampling, grammar = settings(b) if settings else ({}, {}, None)
        sampling = {**sampling, "temperature": (0.7, 1.4)[b % 2]}
        target = np.asarray(rng.standard_normal((k + 1, VOCAB)) * 2.5, dtype=dtype)
        ids = np.where(rng.random(k) < 0.8, target[:k].argmax(axis=1),
                       rng.integers(0, VOCAB, k))
        model = Model(SurfaceCase("plain", row_settings, sampling, (), grammar), target, None)
        requests.append(_Request(model, tuple(int(x) for x in ids), rng.random(k + 2),
                                 greedy=greedy_only or b % 3 == 0,
                                 bonus=int(rng.integers(VOCAB))))
    return requests


@functools.cache
def _stop_plan(dtype_name: str, greedy_only: bool) -> tuple[list[_Request], list[Any],
                                                             list[int]]:
    """The requests of the stops check, their stop tokens and their budgets."""
    rng = np.random.default_rng(24)
    requests = _plain_requests(rng, 40, np.dtype(dtype_name), greedy_only)
    stops: list[Any] = []
    budgets = []
    for b, request in enumerate(requests):
        tokens = [*request.ids, int(rng.integers(VOCAB))]
        # Off, one token of the run (a draft mid-run, often), or two tokens of the vocabulary.
        stops.append(None if b % 4 == 0 else [tokens[int(rng.integers(len(tokens)))]]
                     if b % 4 < 3 else [int(x) for x in rng.choice(VOCAB, 2, replace=False)])
        budgets.append(int(rng.integers(1, 6)))
    return requests, stops, budgets


def _check_stops(caller: _Caller, kind: str) -> PropertyResult:
    """The same requests without and with stop tokens and budgets, the same randomness."""
    name = property_name(STOPS)
    missing = caller.lacks(("stop_token_ids", "max_tokens", "temperature"))
    if missing:
        return skipped(name, missing)
    source: str | None = None
    if registry.get(kind).stochastic:
        source = next(iter(caller.target.sources()), None)
    greedy_only = registry.get(kind).stochastic and source is None
    requests, stops, budgets = _stop_plan(np.dtype(caller.target.dtype).name, greedy_only)

    def call(with_stops: bool) -> _Result:
        values = _assemble(requests, "none", caller.target.dtype, source, salt=47)
        if with_stops:
            values["stop_token_ids"] = stops
            values["max_tokens"] = np.array(budgets, dtype=np.int64)
        return caller(values)

    free, cut = call(False), call(True)
    checked = ["ids"] + [name for name, value in (("accepted_lengths", cut.accepted_lengths),
                                                  ("finished", cut.finished)) if value is not None]
    bad = []
    for b in range(len(requests)):
        tokens = [int(t) for t in free.output[b] if t >= 0]
        length = (int(free.accepted_lengths[b]) if free.accepted_lengths is not None
                  else len(tokens) - 1)
        kept, drafts_kept, finished = surface_reference.cut_run(tokens, length, stops[b],
                                                                budgets[b])
        expected = kept + [-1] * (cut.output.shape[1] - len(kept))
        wrong = []
        if cut.output[b].tolist() != expected:
            wrong.append(f"ids {cut.output[b].tolist()}, expected {expected}")
        if cut.accepted_lengths is not None and int(cut.accepted_lengths[b]) != drafts_kept:
            wrong.append(f"accepted_lengths {int(cut.accepted_lengths[b])}, expected "
                         f"{drafts_kept}")
        if cut.finished is not None and bool(cut.finished[b]) != finished:
            wrong.append(f"finished {bool(cut.finished[b])}, expected {finished}")
        if wrong:
            bad.append(f"request {b} (run {tokens}, stops {stops[b]}, max_tokens "
                       f"{budgets[b]}): {'; '.join(wrong)}")
    randomness = ("greedy requests only (its own randomness cannot be repeated)"
                  if greedy_only else "no randomness" if source is None
                  else f"the same {SOURCE_LABELS[source]}")
    return PropertyResult(
        name, not bad, f"{len(bad)}/{len(requests)} wrong",
        f"{len(requests)} requests (k_b in 0..3, V = {VOCAB}, greedy ones mixed in, the bonus "
        f"given) called without and with stop_token_ids (often a draft) and max_tokens 1..5, "
        f"{randomness}: the second output must be the first cut at its first stop token "
        f"(kept) or its budget (specdec_np._reference.surface.cut_run); checked: "
        f"{', '.join(checked)}" + (f"; e.g. {bad[0]}" if bad else ""))


@functools.cache
def _logprob_plan(dtype_name: str, penalties: bool, bias: bool, top_k: bool,
                  bitmask: bool) -> list[_Request]:
    """The requests of the logprobs check: the penalties, a logit bias, top-k and a
    grammar on some requests, each where the verifier takes it."""

    def settings(b: int) -> tuple[dict[str, Any], dict[str, Any], Grammar | None]:
        row_settings: dict[str, Any] = {}
        if b % 2 == 0 and penalties:
            row_settings.update(PENALTY_SETTINGS)
        if b % 3 != 1 and bias:
            row_settings["logit_bias"] = {b % VOCAB: 1.5 - 0.5 * (b % 5)}
        sampling = {"top_k": _TOP} if b % 4 == 1 and top_k else {}
        return row_settings, sampling, chain_grammar if b % 2 == 1 and bitmask else None

    return _plain_requests(np.random.default_rng(25), 18, np.dtype(dtype_name), False,
                           settings, max_k=DRAFTS)


def _close(found: float, expected: float) -> bool:
    if math.isinf(expected):
        return found == expected
    absolute, relative = _LOG_TOLERANCE
    return abs(found - expected) <= absolute + relative * abs(expected)


def _logprob_problems(tables: dict[str, np.ndarray], row: np.ndarray, request: _Request,
                      greedy: bool) -> list[str]:
    """What is wrong in one request's logprobs ``tables`` (its rows of the four arrays)
    given its output ``row`` (``greedy``: it was verified greedily)."""
    tokens = [int(t) for t in row if t >= 0]
    problems = []
    for position in range(row.size):
        processed = float(tables["logprobs"][position])
        raw = float(tables["raw_logprobs"][position])
        top_ids = tables["top_token_ids"][position]
        top_values = tables["top_logprobs"][position].astype(np.float64)
        if position >= len(tokens):
            if not (math.isnan(processed) and math.isnan(raw) and np.all(top_ids == -1)
                    and np.all(np.isnan(top_values))):
                problems.append(f"position {position} (not emitted) is not NaN and -1 padded")
            continue
        token = tokens[position]
        law = request.model.law(position, tuple(tokens[:position]), greedy=greedy)
        with np.errstate(divide="ignore"):
            log_law = np.log(law)
        shifted = request.model.target[position].astype(np.float64)
        shifted -= shifted.max()
        raw_law = shifted - math.log(float(np.exp(shifted).sum()))
        if not _close(processed, float(log_law[token])):
            problems.append(f"position {position}: logprob {processed:.6g}, expected "
                            f"{float(log_law[token]):.6g}")
        if not _close(raw, float(raw_law[token])):
            problems.append(f"position {position}: raw logprob {raw:.6g}, expected "
                            f"{float(raw_law[token]):.6g}")
        order = sorted(range(VOCAB), key=lambda y: (-law[y], y))[: top_ids.size]
        for rank, expected_id in enumerate(order):
            found_id, found_value = int(top_ids[rank]), float(top_values[rank])
            expected_value = float(log_law[expected_id])
            if expected_value == -math.inf and found_id == -1 and math.isnan(found_value):
                continue  # probability 0: padding is allowed
            # A token tied with the expected one (to the tolerance) may stand in its place.
            if not (0 <= found_id < VOCAB and _close(found_value, expected_value)
                    and _close(float(log_law[found_id]), expected_value)):
                problems.append(f"position {position}: top {rank} is token {found_id} at "
                                f"{found_value:.6g}, expected {expected_id} at "
                                f"{expected_value:.6g}")
    return problems


def _check_logprobs(caller: _Caller, kind: str) -> PropertyResult:
    """Each emitted token's logprobs against the reference's law of its row."""
    name = property_name(LOGPROBS)
    missing = caller.lacks(("logprobs", "temperature"))
    if missing:
        return skipped(name, missing)
    entry = registry.get(kind)
    requests = _logprob_plan(np.dtype(caller.target.dtype).name,
                             not caller.lacks(tuple(PENALTY_SETTINGS)),
                             caller.takes["logit_bias"], caller.takes["top_k"],
                             caller.takes["token_bitmask"])
    source = "uniforms" if entry.stochastic and caller.takes["uniforms"] else None
    values = _assemble(requests, "none", caller.target.dtype, source)
    values["logprobs"] = _TOP
    result = caller(values)
    if result.logprobs is None:
        return PropertyResult(name, False, "missing",
                              "the verifier takes logprobs= but its result has no logprobs, "
                              "raw_logprobs, top_token_ids and top_logprobs")
    batch_size, width = result.output.shape
    shapes = {key: value.shape for key, value in result.logprobs.items()}
    expected_shapes = {"logprobs": (batch_size, width), "raw_logprobs": (batch_size, width),
                       "top_token_ids": (batch_size, width, _TOP),
                       "top_logprobs": (batch_size, width, _TOP)}
    if shapes != expected_shapes:
        return PropertyResult(name, False, "wrong shape",
                              f"found {shapes}, expected {expected_shapes}")
    bad = []
    for b, request in enumerate(requests):
        greedy = request.greedy or entry.greedy
        tables = {key: value[b] for key, value in result.logprobs.items()}
        problems = _logprob_problems(tables, result.output[b], request, greedy)
        if problems:
            label = "greedy" if greedy else request.model.case.label
            bad.append(f"request {b} ({label}): {problems[0]}")
    return PropertyResult(
        name, not bad, f"{len(bad)}/{len(requests)} wrong",
        f"{len(requests)} requests (k_b in 0..{DRAFTS}, V = {VOCAB}, logprobs={_TOP}, the "
        f"bonus given), temperatures 0, 0.7 and 1.4, top-k {_TOP}, and the penalties, a "
        f"logit bias and a grammar bitmask where the verifier takes them: each emitted "
        f"token's log-probability under its row's processed law (the softmax after masks, "
        f"bias and penalties for a greedy request) and under the raw softmax, and the top "
        f"{_TOP} of the processed law (ties to the lower id), vs the reference's law, to "
        f"{_LOG_TOLERANCE[0]:g} + {_LOG_TOLERANCE[1]:g} |x|; NaN and -1 past the run"
        + (f"; e.g. {bad[0]}" if bad else ""))


# --------------------------------------------------------------------------------------
# The sampling settings' run
# --------------------------------------------------------------------------------------


def run(target: Any, kind: str, rng: np.random.Generator) -> list[PropertyResult]:
    """Every sampling-settings property of a ragged verifier (see the module docstring).

    The rows of the checks come from generators of their own, the same in every run (the
    laws they need are computed once per process); ``rng`` draws the Monte Carlo
    continuations.

    Parameters
    ----------
    target : specdec_np.testing._ragged.RaggedTarget
        The verifier under test, its kind, dtype and time limit.
    kind : str
        A registry verifier name.
    rng : numpy.random.Generator

    Returns
    -------
    list of PropertyResult
        In report order.
    """
    caller = _Caller(target)
    stochastic = registry.get(kind).stochastic
    if not caller.takes["target_logits"]:
        reason = "the verifier takes no target_logits= (the settings need logits)"
        return [skipped(property_name(name), reason)
                for name in (*ASPECTS, GREEDY, STOPS, LOGPROBS)]
    rows: list[PropertyResult] = []
    greedy = _Greedy()
    exact = not stochastic or caller.takes["uniforms"]
    for aspect in ASPECTS:
        name = property_name(aspect)
        if not exact:
            rows.append(skipped(name, "needs explicit uniforms (uniforms= keyword); the "
                                      "Monte Carlo row checks the law"))
            continue
        check: Callable[[_Caller, str, str, _Greedy], PropertyResult] = (
            _exact_aspect if stochastic else _reference_aspect)
        rows += guard_keywords(name, functools.partial(check, caller, kind, aspect, greedy),
                               target.limit)
    if not exact:
        rows += guard_keywords(property_name("Monte Carlo"), lambda: _monte_carlo_law(caller, rng),
                               target.limit)
        rows += guard_keywords(property_name(GREEDY), lambda: _greedy_alone(caller, kind, greedy),
                               target.limit)
    if greedy.count:
        rows.append(PropertyResult(
            property_name(GREEDY), not greedy.wrong, f"{len(greedy.wrong)}/{greedy.count} wrong",
            "; ".join(greedy.wrong[:2]) if greedy.wrong else
            f"{greedy.count} temperature-0 requests with each case's settings, mixed into "
            f"the batches above, vs specdec_np._reference.ragged.verify_ragged (the argmax "
            f"after masks, bias and penalties)"))
    else:
        rows.append(skipped(property_name(GREEDY), "no batch with greedy requests ran"))
    rows += guard_keywords(property_name(STOPS), lambda: _check_stops(caller, kind), target.limit)
    rows += guard_keywords(property_name(LOGPROBS), lambda: _check_logprobs(caller, kind),
                           target.limit)
    return rows
