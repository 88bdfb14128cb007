"""The conformance kit on the ragged engine layout: a callable with ``verify_ragged``'s keywords.

The verifier is called with keywords only (``docs/testing.md``, the ragged layout):
``num_draft_tokens [B]``, ``draft_token_ids [T]``, one of ``target_probs`` /
``target_logits`` ``[T + B, V]``, ``draft_probs`` / ``draft_logits`` ``[T, V]`` (or
neither), ``method=kind`` where it takes ``method``, the sampling parameters
``temperature``, ``top_k``, ``top_p``, ``min_p`` (arrays ``[B]``), ``bonus_token_ids [B]``
or None (the verifier draws the bonus), and one randomness source: ``uniforms [B, max_k +
2]``, ``generator``, ``seeded_seqs`` or ``counter_seeds``.  It returns ``[B, max_k + 1]``
output ids (or an object with ``output_token_ids``).

:func:`run` checks, in order:

* every padded property (:mod:`specdec_np.testing._padded`) through an adapter that hands the
  padded batch over as probabilities, one request per row, the bonus given;
* for the lossless kinds, the exact law from logits: small requests, each with its own
  settings (:data:`SETTING_CASES`: temperatures below and above 1, each filter alone and
  the filters together, requests without drafts), in each logits form the verifier takes
  (logits/logits, logits/probabilities), the bonus drawn by the verifier and checked, and
  the uniforms integrated cell by cell: the law must be the product of the *processed*
  target rows (:func:`specdec_np._reference.chains.process_logits`).  Every setting of a request
  moves its law (:func:`load_bearing_logits`) and the cells are cut at the thresholds of
  each law with one setting off too, so a verifier that ignores a setting fails, and one
  property per class of settings says which class; target probabilities with draft
  logits at each request's temperature get their own property.  For the deterministic
  kinds, equality with the reference (:func:`specdec_np._reference.ragged.verify_ragged`) from
  logits;
* Monte Carlo from logits with every filter on, once per randomness source it takes;
* greedy requests (temperature 0) mixed into every batch: the argmax rule on raw rows;
* batch invariance of a ragged batch (permuted, requests alone; every setting of the
  exact laws mixed in), seeds (a seeded request's draws independent of its batch too),
  output format;
* the sampling settings (penalties, bias, masks, grammar bitmask, stops, logprobs) where
  the verifier takes them: :mod:`specdec_np.testing._surface`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .. import registry
from .._reference import chains as _reference
from .._reference import ragged as ragged_reference
from . import _monte_carlo, _oracles, _surface
from . import _padded as _kit_padded
from ._padded import SEEDED_SOURCES, SOURCE_LABELS, chain_chi_square, source_keywords
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

__all__ = ["RaggedTarget", "run"]

#: The keywords of ``verify_ragged`` the kit may pass.
KEYWORDS = ("target_logits", "target_probs", "draft_logits", "draft_probs", "method",
            "temperature", "top_k", "top_p", "min_p", "bonus_token_ids", "uniforms",
            "generator", "seeded_seqs", "counter_seeds")
_LAW_TOLERANCE = 1e-9
_ALPHA = 1e-4
#: The vocabulary of the exact-law requests (and of the tree layout's from logits).
EXACT_V = 5


class RaggedTarget:
    """The ragged verifier under test: keywords in, int64 ``[B, max_k + 1]`` NumPy out.

    Parameters
    ----------
    verifier : callable
    kind : str
        Passed as ``method=`` where the verifier takes it.
    dtype : numpy.dtype
        Of the logits and probability rows.
    limit : TimeLimit
    """

    def __init__(self, verifier: Callable[..., Any], kind: str, dtype: Any,
                 limit: TimeLimit) -> None:
        self.verifier = verifier
        self.kind = kind
        self.dtype = dtype
        self.limit = limit
        self.takes = {name: has_keyword(verifier, name) for name in KEYWORDS}
        for source in ("uniforms", "generator", *SEEDED_SOURCES):
            setattr(self, f"takes_{source}", self.takes[source])
        self.format_errors: list[str] = []

    def sources(self) -> list[str]:
        """The randomness sources the verifier takes."""
        return [s for s in ("uniforms", "generator", *SEEDED_SOURCES) if self.takes[s]]

    def keywords(self, values: dict[str, Any]) -> dict[str, Any]:
        """The keywords to pass: None values dropped where the verifier lacks the keyword,
        :class:`UnsupportedKeyword` for a value it has no keyword for."""
        return layout_keywords(
            self.takes, values, ("num_draft_tokens", "draft_token_ids"), self.kind
        )

    def __call__(self, **values: Any) -> np.ndarray:
        keywords = self.keywords(values)
        result = self.limit.call(self.verifier, **keywords)
        output = _monte_carlo.to_numpy(getattr(result, "output_token_ids", result))
        counts = np.asarray(values["num_draft_tokens"])
        expected = (counts.size, int(counts.max(initial=0)) + 1)
        problem = ""
        if output.dtype.kind not in "iu":
            problem = f"the output must have an integer dtype; found {output.dtype}"
        elif output.shape != expected:
            problem = (f"the output must have shape [B, max_k + 1] = {list(expected)}; found "
                       f"{list(output.shape)}")
        if problem:
            self.format_errors.append(problem)
            raise TypeError(problem)
        return output.astype(np.int64)


class _PaddedView:
    """The ragged verifier seen as a padded one: probabilities, ``k`` drafts per request,
    the bonus given; padded uniforms ``[B, k+1]`` get a bonus column (unread)."""

    positional_arguments = 4

    def __init__(self, target: RaggedTarget) -> None:
        self.target = target
        self.__name__ = "ragged"
        for source in ("uniforms", "generator", *SEEDED_SOURCES):
            setattr(self, f"takes_{source}", target.takes[source])

    def __call__(self, target_probs: np.ndarray, bonus: np.ndarray, draft_probs: Any,
                 ids: np.ndarray, **keywords: Any) -> np.ndarray:
        batch_size, k = ids.shape
        vocab_size = target_probs.shape[-1]
        if keywords.get("uniforms") is not None:
            keywords["uniforms"] = np.concatenate(
                [keywords["uniforms"], np.zeros((batch_size, 1))], axis=1)
        values = dict(
            num_draft_tokens=np.full(batch_size, k, dtype=np.int64),
            draft_token_ids=np.ascontiguousarray(ids.reshape(-1)),
            target_probs=np.ascontiguousarray(target_probs.reshape(-1, vocab_size)),
            draft_probs=None if draft_probs is None else np.ascontiguousarray(
                draft_probs.reshape(-1, vocab_size)),
            bonus_token_ids=np.ascontiguousarray(bonus.reshape(-1)), **keywords)
        # The padded target already holds the time limit: call the verifier directly.
        inner = self.target
        result = inner.verifier(**inner.keywords(values))
        return _monte_carlo.to_numpy(getattr(result, "output_token_ids", result))


# --------------------------------------------------------------------------------------
# Requests and batches
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Request:
    """One request: its rows (logits or probabilities as its batch's form says), drafts,
    sampling parameters, uniforms ``[k + 2]`` and, for the checks, the law it must have."""

    target: np.ndarray
    draft: np.ndarray | None
    ids: np.ndarray
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    uniforms: np.ndarray | None = None
    bonus: int | None = None
    case: int = -1
    weight: float = 0.0

    @property
    def k(self) -> int:
        return int(self.ids.size)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def settings(self) -> dict[str, Any]:
        """Its sampling parameters, as :func:`process` takes them."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "min_p": self.min_p}


def _assemble(requests: list[_Request], form: tuple[str, str], dtype: Any,
              source: str = "uniforms", salt: int = 0) -> dict[str, Any]:
    """The keywords of one call holding ``requests`` in order."""
    counts = np.array([r.k for r in requests], dtype=np.int64)
    max_k = int(counts.max(initial=0))
    vocab_size = requests[0].target.shape[1]
    values: dict[str, Any] = {
        "num_draft_tokens": counts,
        "draft_token_ids": np.concatenate([r.ids for r in requests]).astype(np.int64),
        f"target_{form[0]}": np.ascontiguousarray(
            np.concatenate([r.target for r in requests]), dtype=dtype),
        "temperature": np.array([r.temperature for r in requests]),
    }
    drafts = [r.draft for r in requests]
    if all(d is not None for d in drafts):
        values[f"draft_{form[1]}"] = np.ascontiguousarray(
            np.concatenate([d for d in drafts if d is not None]).reshape(-1, vocab_size),
            dtype=dtype)
    if form[0] == "logits":
        values["top_k"] = np.array([r.top_k for r in requests], dtype=np.int64)
        values["top_p"] = np.array([r.top_p for r in requests])
        values["min_p"] = np.array([r.min_p for r in requests])
    if all(r.bonus is not None for r in requests):
        values["bonus_token_ids"] = np.array([r.bonus for r in requests], dtype=np.int64)
    if source == "uniforms":
        uniforms = np.zeros((len(requests), max_k + 2))
        for b, r in enumerate(requests):
            if r.uniforms is not None:
                uniforms[b, : r.k + 2] = r.uniforms
        values["uniforms"] = uniforms
    else:
        values.update(source_keywords(source, len(requests), salt))
    return values


def _greedy_expected(request: _Request) -> list[int]:
    """The greedy rule on raw rows: accept while the draft is the first argmax (NaN never
    wins), the argmax at the first mismatch, the bonus (or the bonus row's argmax)."""
    rows = np.where(np.isnan(request.target), -np.inf, request.target)
    argmax = rows.argmax(axis=1)
    for i, x in enumerate(request.ids.tolist()):
        if x != argmax[i]:
            return [*request.ids[:i].tolist(), int(argmax[i])]
    bonus = int(argmax[request.k]) if request.bonus is None else request.bonus
    return [*request.ids.tolist(), bonus]


def _greedy_requests(rng: np.random.Generator, count: int, vocab_size: int, max_k: int,
                     form: tuple[str, str], lazy_bonus: bool) -> list[_Request]:
    """Temperature-0 requests: drafts mostly the argmax, some rows with tied maxima."""
    requests = []
    for _ in range(count):
        k = int(rng.integers(0, max_k + 1))
        logits = rng.standard_normal((k + 1, vocab_size)) * 3
        if rng.random() < 0.3:  # a tie: the first index is the argmax
            top = logits.max(axis=1)
            logits[:, -1] = top
        rows = logits if form[0] == "logits" else np.exp(logits) / np.exp(logits).sum(
            axis=1, keepdims=True)
        argmax = rows.argmax(axis=1)
        ids = np.where(rng.random(k) < 0.7, argmax[:k], rng.integers(0, vocab_size, k))
        draft = rng.standard_normal((k, vocab_size))
        if form[1] != "logits":
            draft = np.exp(draft) / np.exp(draft).sum(axis=1, keepdims=True)
        requests.append(_Request(rows, draft, ids.astype(np.int64), temperature=0.0,
                                 bonus=None if lazy_bonus else int(rng.integers(vocab_size))))
    return requests


def _interleave(rng: np.random.Generator, sampled: list[_Request],
                greedy: list[_Request]) -> list[_Request]:
    """The greedy requests scattered among the sampled ones (sampled order kept)."""
    slots = np.sort(rng.choice(len(sampled) + len(greedy), len(greedy), replace=False))
    merged, s, g = [], 0, 0
    for position in range(len(sampled) + len(greedy)):
        if g < len(greedy) and slots[g] == position:
            merged.append(greedy[g])
            g += 1
        else:
            merged.append(sampled[s])
            s += 1
    return merged


class _Collector:
    """What the ragged checks share: greedy requests checked by rule, formats by group."""

    def __init__(self) -> None:
        self.greedy_bad: list[str] = []
        self.greedy_count = 0
        self.format_problems: list[str] = []
        self.rows = 0

    def record(self, requests: list[_Request], output: np.ndarray, label: str,
               vocab_size: int) -> None:
        self.rows += len(requests)
        counts = np.array([r.k for r in requests])
        for k in np.unique(counts):
            members = np.flatnonzero(counts == k)
            ids = np.zeros((members.size, k), dtype=np.int64)
            for row, member in enumerate(members.tolist()):
                ids[row] = requests[member].ids
            problem = _monte_carlo.format_problem(output[members, : k + 1], ids, vocab_size)
            if not problem and np.any(output[members, k + 1:] != -1):
                problem = "a row is not -1 past its k_b + 1 tokens"
            if problem:
                self.format_problems.append(f"{label} (k_b = {k}): {problem}")
        for b, request in enumerate(requests):
            if not request.greedy:
                continue
            self.greedy_count += 1
            expected = _greedy_expected(request)
            found = output[b, : len(expected)].tolist()
            if found != expected or np.any(output[b, len(expected):] != -1):
                self.greedy_bad.append(f"{label}: request {b} gave {output[b].tolist()}, "
                                       f"expected {expected}")


# --------------------------------------------------------------------------------------
# The exact law from logits
# --------------------------------------------------------------------------------------


#: Each sampling parameter turned off (``None`` in ``verify_ragged``).
OFF: dict[str, Any] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


@dataclass(frozen=True)
class SettingCase:
    """One request setting of the exact laws from logits.

    Attributes
    ----------
    aspect : str
        The class of settings it belongs to, which names its property, so that a verifier
        that mishandles one class fails the property that says which.
    drafts : int
        ``k_b`` (a chain of that many nodes on the tree layout).
    settings : dict
        Its sampling parameters (the others off).
    """

    aspect: str
    drafts: int
    settings: dict[str, Any]

    @property
    def label(self) -> str:
        """The settings, for a report (``"temperature 1.7, top-k 3, k_b = 0"``)."""
        parts = [f"{name.replace('_', '-')} {value:g}" for name, value in self.settings.items()]
        return ", ".join(parts + [f"k_b = {self.drafts}"])


#: The settings of the exact laws from target logits: temperatures below and above 1,
#: each filter alone, the filters together (each one moving the law, see
#: :func:`load_bearing_logits`), and requests without drafts, whose one row is processed
#: too.  The batches that mix settings per request draw from the same list
#: (:func:`settings_menu`).
SETTING_CASES = (
    SettingCase("temperature below 1", 1, {"temperature": 0.6}),
    SettingCase("temperature above 1", 1, {"temperature": 1.7}),
    SettingCase("top-k", 1, {"top_k": 2}),
    SettingCase("top-p", 1, {"top_p": 0.6}),
    SettingCase("min-p", 1, {"min_p": 0.3}),
    SettingCase("filters together", 1, {"top_p": 0.8, "min_p": 0.15}),
    SettingCase("filters together", 1, {"temperature": 1.4, "top_k": 3, "top_p": 0.7}),
    SettingCase("filters together", 1, {"temperature": 0.8, "top_k": 4, "min_p": 0.1}),
    SettingCase("requests without drafts", 0, {"temperature": 0.5}),
    SettingCase("requests without drafts", 0, {"temperature": 1.8, "top_k": 3}),
    SettingCase("requests without drafts", 0, {"top_p": 0.8, "min_p": 0.15}),
)
#: The aspect of target probabilities with draft logits: probabilities are taken as
#: processed, and the draft logits get the request's temperature.
DRAFT_TEMPERATURE = "draft logits at each request's temperature"
#: Its settings: temperatures below and above 1.
DRAFT_TEMPERATURE_CASES = (
    SettingCase(DRAFT_TEMPERATURE, 1, {"temperature": 0.6}),
    SettingCase(DRAFT_TEMPERATURE, 1, {"temperature": 1.7}),
)
#: Tries of :func:`load_bearing_logits`; each succeeds with probability above 1/10 for
#: every case above, so running out is a kit bug, not bad luck.
_ATTEMPTS = 400
#: How far turning one setting off must move the law of some row.
_MOVES = 1e-3


def settings_menu() -> list[dict[str, Any]]:
    """Per-request settings of the batches that mix them: defaults, greedy (temperature
    0) and every case of :data:`SETTING_CASES`.

    Returns
    -------
    list of dict
    """
    return [{}, {"temperature": 0.0}, *(dict(case.settings) for case in SETTING_CASES)]


def process(rows: np.ndarray, settings: dict[str, Any], dtype: Any) -> np.ndarray:
    """The law of logits rows ``[n, V]`` under one request's settings (the reference's
    processing, :func:`specdec_np._reference.chains.process_logits`), in float64.

    Parameters
    ----------
    rows : numpy.ndarray
    settings : dict
        Sampling parameters; those absent are off.
    dtype : numpy.dtype
        Of the rows the verifier gets.

    Returns
    -------
    numpy.ndarray
    """
    values = {**OFF, **settings}
    n = rows.shape[0]
    return np.asarray(_reference.process_logits(
        np.ascontiguousarray(rows, dtype=dtype), np.full(n, float(values["temperature"])),
        np.full(n, int(values["top_k"]), dtype=np.int64), np.full(n, float(values["top_p"])),
        np.full(n, float(values["min_p"]))), dtype=np.float64)


def load_bearing_logits(rng: np.random.Generator, count: int, vocab_size: int,
                        settings: dict[str, Any], dtype: Any) -> np.ndarray:
    """``count`` logits rows on which every setting of ``settings`` moves the law.

    Turned off alone (temperature 1, top-k 0, top-p 1, min-p 0), each changes some row's
    processed law by more than :data:`_MOVES`: a verifier that ignores or misreads any of
    them (a filter dropped when another is on, a temperature clamped to 1) emits another
    law, which the exact law sees.

    Parameters
    ----------
    rng : numpy.random.Generator
    count, vocab_size : int
    settings : dict
    dtype : numpy.dtype

    Returns
    -------
    numpy.ndarray
        ``[count, V]`` in ``dtype``.

    Raises
    ------
    RuntimeError
        If no draw of :data:`_ATTEMPTS` qualifies (settings no row can make load-bearing).
    """
    active = [name for name, value in settings.items() if value != OFF[name]]
    for _ in range(_ATTEMPTS):
        # Each row its own spread: flat rows let top-k cut where min-p keeps everything,
        # peaked ones let min-p cut inside the top k.
        logits = np.asarray(rng.standard_normal((count, vocab_size))
                            * rng.uniform(0.5, 3.0, (count, 1)), dtype=dtype)
        if count == 0:
            return logits
        law = process(logits, settings, dtype)
        if all(np.max(np.abs(process(logits, {**settings, name: OFF[name]}, dtype) - law))
               > _MOVES for name in active):
            return logits
    raise RuntimeError(f"no logits rows on which each of {settings} moves the law")


def case_rows(rng: np.random.Generator, case: SettingCase, form: tuple[str, str],
              vocab_size: int, dtype: Any, rows: int | None = None) -> tuple[np.ndarray, ...]:
    """One case's rows as the verifier gets them and their laws: ``(target rows, draft
    rows, p, q)``.

    Target logits are load-bearing for the case's settings; target probabilities (taken as
    processed) are multiples of 1/1024; draft logits are processed with the settings
    (load-bearing when the target rows are probabilities: then the draft logits are where
    the temperature acts), draft probabilities used as given.

    Parameters
    ----------
    rng : numpy.random.Generator
    case : SettingCase
    form : (str, str)
        ``"logits"`` or ``"probs"``, for the target and the draft rows.
    vocab_size : int
    dtype : numpy.dtype
    rows : int, optional
        Target rows (``case.drafts + 1`` by default); the draft rows are one fewer.

    Returns
    -------
    tuple of numpy.ndarray
        ``[rows, V]``, ``[rows - 1, V]``, and their float64 laws.
    """
    count = case.drafts + 1 if rows is None else rows
    settings = case.settings
    if form[0] == "logits":
        target = load_bearing_logits(rng, count, vocab_size, settings, dtype)
        p = process(target, settings, dtype)
    else:  # probabilities exact in either dtype (the padded kit's rows)
        p = np.stack([_kit_padded.exact_probability_row(rng, vocab_size)
                      for _ in range(count)])
        target = np.asarray(p, dtype=dtype)
    if form[1] == "logits":
        if form[0] == "logits":
            draft = np.asarray(rng.standard_normal((count - 1, vocab_size)), dtype=dtype)
        else:
            draft = load_bearing_logits(rng, count - 1, vocab_size, settings, dtype)
        q = process(draft, settings, dtype)
    else:
        q = np.array([_kit_padded.exact_probability_row(rng, vocab_size)
                      for _ in range(count - 1)]).reshape(count - 1, vocab_size)
        draft = np.asarray(q, dtype=dtype)
    return target, draft, p, q


def ignored_laws(settings: dict[str, Any], form: tuple[str, str], target: np.ndarray,
                 draft: np.ndarray, p: np.ndarray, q: np.ndarray,
                 dtype: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    """The laws ``(p, q)`` of the rows with one setting turned off each: what a verifier
    that ignores that setting follows.  The exact laws cut the uniforms at their
    thresholds too, so that such a verifier's law is integrated exactly and differs from
    the target's by all that :func:`load_bearing_logits` made it move.

    Parameters
    ----------
    settings : dict
    form : (str, str)
    target, draft : numpy.ndarray
        The rows as the verifier gets them.
    p, q : numpy.ndarray
        Their laws under ``settings`` (kept where the rows are probabilities).
    dtype : numpy.dtype

    Returns
    -------
    list of (numpy.ndarray, numpy.ndarray)
    """
    laws = []
    for name, value in settings.items():
        if value != OFF[name]:
            changed = {**settings, name: OFF[name]}
            laws.append((process(target, changed, dtype) if form[0] == "logits" else p,
                         process(draft, changed, dtype) if form[1] == "logits" else q))
    return laws


def _exact_requests(rng: np.random.Generator, form: tuple[str, str], dtype: Any,
                    cases: tuple[SettingCase, ...]) -> tuple[list[_Request], list[tuple]]:
    """Every request of the exact-law batch of one form, and per case ``(case, processed
    target p [k+1, V], draft law q [k, V])``."""
    requests: list[_Request] = []
    laws = []
    for index, case in enumerate(cases):
        k = case.drafts
        target_rows, draft_rows, p, q = case_rows(rng, case, form, EXACT_V, dtype)
        laws.append((case, p, q))
        ignored = ignored_laws(case.settings, form, target_rows, draft_rows, p, q, dtype)
        if k == 0:  # the bonus alone: its residual uniform is never read
            batch = _oracles.ThresholdBatch(np.zeros((1, 0), dtype=np.int64),
                                            np.full((1, 1), 0.5), np.ones(1))
        else:
            # The thresholds make the law exact for a correct verifier and for one that
            # ignores a setting: few regular cuts are needed on top.
            batch = _oracles.threshold_batch(p, q, refine=2, also=ignored)
        bonus_mids, bonus_widths = _oracles._cut_axis(
            [x for rows in [p, *(law for law, _ in ignored)] for x in
             _oracles._cdf_points(rows[k])], 2)
        base = _Request(target_rows, draft_rows, np.zeros(k, dtype=np.int64), case=index,
                        **case.settings)
        for row in range(batch.draft_token_ids.shape[0]):
            for mid, width in zip(bonus_mids, bonus_widths):
                requests.append(replace(
                    base, ids=batch.draft_token_ids[row],
                    uniforms=np.concatenate([batch.uniforms[row], [mid]]),
                    weight=float(batch.weights[row] * width)))
    return requests, laws


def aspect_results(prefix: str, aspects: tuple[str, ...],
                   errors: list[tuple[SettingCase, float, str]], what: str,
                   missing: str) -> list[PropertyResult]:
    """One property per aspect, ``f"{prefix}: {aspect}"``, from each case's law error.

    Parameters
    ----------
    prefix : str
    aspects : tuple of str
        In report order.
    errors : list of (SettingCase, float, str)
        Each case run, its largest law error and the batch it ran in.
    what : str
        What was fed, for the detail.
    missing : str
        Why an aspect with no case run was skipped.

    Returns
    -------
    list of PropertyResult
    """
    results = []
    for aspect in aspects:
        name = f"{prefix}: {aspect}"
        mine = [(error, case, batch) for case, error, batch in errors if case.aspect == aspect]
        if not mine:
            results.append(skipped(name, missing))
            continue
        worst, case, batch = max(mine, key=lambda item: item[0])
        settings = sorted({c.label for _, c, _ in mine})
        batches = sorted({b for _, _, b in mine})
        results.append(PropertyResult(
            name, worst <= _LAW_TOLERANCE, f"max err {worst:.2g}",
            f"{what}; settings: {'; '.join(settings)}; in the {', '.join(batches)} batch"
            f"{'es' if len(batches) > 1 else ''}; limit {_LAW_TOLERANCE:g}"
            + (f"; worst: {case.label} ({batch})" if worst > _LAW_TOLERANCE else "")))
    return results


def _exact_batch(target: RaggedTarget, form: tuple[str, str], cases: tuple[SettingCase, ...],
                 oracle: Any, rng: np.random.Generator,
                 collector: _Collector) -> list[tuple[SettingCase, float, str]]:
    """One exact-law batch (greedy requests mixed in): each case's largest error against
    the product of the processed target rows and, where the kind has one, its oracle."""
    label = f"{form[0]}/{form[1]}"
    sampled, laws = _exact_requests(rng, form, target.dtype, cases)
    greedy = _greedy_requests(rng, 24, EXACT_V, 1, form, lazy_bonus=True)
    requests = _interleave(rng, sampled, greedy)
    output = target(**_assemble(requests, form, target.dtype))
    collector.record(requests, output, f"{label} exact batch", EXACT_V)
    case_of = np.array([r.case for r in requests])
    weights = np.array([r.weight for r in requests])
    errors = []
    for index, (case, p, q) in enumerate(laws):
        members = np.flatnonzero(case_of == index)
        k = p.shape[0] - 1
        law = _oracles.grid_chain_law(output[members, : k + 1], weights[members], p,
                                      bonus_drawn=True)
        error = float(np.max(np.abs(law - _oracles.target_chain_law(p))))
        if oracle is not None and k > 0:
            error = max(error, float(np.max(np.abs(law - oracle(p, q).law))))
        errors.append((case, error, label))
    return errors


def _check_exact_logits(target: RaggedTarget, kind: str, rng: np.random.Generator,
                        collector: _Collector) -> list[PropertyResult]:
    """The exact laws from logits, one property per aspect of :data:`SETTING_CASES` (run
    in each logits form the verifier takes) and one for draft logits with target
    probabilities."""
    oracle = _oracles.oracle_for(registry.get(kind))
    errors: list[tuple[SettingCase, float, str]] = []
    for form in (("logits", "logits"), ("logits", "probs")):
        if all(target.takes[n] for n in (f"target_{form[0]}", f"draft_{form[1]}", "uniforms")):
            errors += _exact_batch(target, form, SETTING_CASES, oracle, rng, collector)
    draft_errors: list[tuple[SettingCase, float, str]] = []
    if all(target.takes[n] for n in ("target_probs", "draft_logits", "uniforms")):
        draft_errors = _exact_batch(target, ("probs", "logits"), DRAFT_TEMPERATURE_CASES,
                                    oracle, rng, collector)
    what = (f"requests integrating drafts and uniforms (the bonus drawn by the verifier, "
            f"its uniform cut too), V = {EXACT_V}, each with its own settings, greedy "
            f"requests mixed in; law vs the product of the processed target rows"
            + (" and the exact oracle" if oracle is not None else ""))
    aspects = tuple(dict.fromkeys(case.aspect for case in SETTING_CASES))
    return aspect_results(
        "exact law from logits", aspects, errors, what,
        "the verifier takes no target_logits= with draft_logits= or draft_probs=, or no "
        "uniforms=") + aspect_results(
        "exact law from target probabilities", (DRAFT_TEMPERATURE,), draft_errors,
        what.replace("processed target rows", "target rows, the drafts drawn from the "
                     "processed draft logits"),
        "the verifier takes no target_probs= with draft_logits=, or no uniforms=")


def _check_reference_logits(target: RaggedTarget, kind: str, rng: np.random.Generator,
                            collector: _Collector, vocab_size: int,
                            k: int) -> PropertyResult:
    """A deterministic kind from logits with filters against the reference, row by row."""
    entry = registry.get(kind)
    name = f"{kind} from logits equals the reference"
    if not (target.takes["target_logits"] and target.takes["draft_logits"]):
        return skipped(name, "the verifier takes no target_logits= and draft_logits=")
    # The greedy requests are mixed in below, as in every batch.
    menu = [settings for settings in settings_menu() if settings.get("temperature") != 0.0]
    requests = []
    for b in range(96):
        length = int(rng.integers(0, k + 1))
        settings = menu[b % len(menu)]
        logits = rng.standard_normal((length + 1, vocab_size)) * rng.uniform(0.5, 4)
        request = _Request(logits, rng.standard_normal((length, vocab_size)),
                           np.zeros(length, dtype=np.int64),
                           bonus=int(rng.integers(vocab_size)), **settings)
        p = process(logits, request.settings, target.dtype)
        ids = np.where(rng.random(length) < 0.7, p[:length].argmax(axis=1),
                       rng.integers(0, vocab_size, length)).astype(np.int64)
        requests.append(replace(request, ids=ids))
    requests = _interleave(rng, requests, _greedy_requests(rng, 24, vocab_size, k,
                                                           ("logits", "logits"),
                                                           lazy_bonus=False))
    values = _assemble(requests, ("logits", "logits"), target.dtype, source="none")
    output = target(**values)
    collector.record(requests, output, "logits reference batch", vocab_size)
    expected, _ = ragged_reference.verify_ragged(
        values["num_draft_tokens"], values["draft_token_ids"], values["target_logits"],
        values["draft_logits"], method=kind, from_logits=True,
        temperature=values["temperature"], top_k=values["top_k"], top_p=values["top_p"],
        min_p=values["min_p"], bonus_token_ids=values["bonus_token_ids"],
        uniforms=np.zeros((len(requests), k + 2)))  # read by no deterministic rule
    expected = np.asarray(expected)
    decisions = _reference.decisions_for(entry)
    bad = []
    for b, request in enumerate(requests):
        if request.greedy or request.k == 0:
            edge = False
        else:
            p = process(request.target, request.settings, target.dtype)
            edge = decisions(p, None, request.ids, None).knife_edge(1e-5)
        if not edge and np.any(output[b] != expected[b]):
            bad.append(b)
    return PropertyResult(
        name, not bad, f"{len(bad)} requests differ",
        f"{len(requests)} requests (k_b in 0..{k}, V = {vocab_size}, greedy ones mixed in) from "
        f"logits with temperature, top-k, top-p and min-p vs specdec_np._reference.chains."
        f"verify_ragged" + (f"; e.g. request {bad[0]}: {output[bad[0]].tolist()}, expected "
                            f"{expected[bad[0]].tolist()}" if bad else ""))


# --------------------------------------------------------------------------------------
# Monte Carlo from logits, once per randomness source
# --------------------------------------------------------------------------------------


def _check_monte_carlo_logits(target: RaggedTarget, k: int, vocab_size: int, num_rows: int,
                              rng: np.random.Generator,
                              collector: _Collector) -> list[PropertyResult]:
    settings: dict[str, Any] = {"temperature": 0.8, "top_k": vocab_size // 2 + 1,
                                "top_p": 0.9, "min_p": 0.02}
    base = _Request(np.zeros((k + 1, vocab_size)), None, np.zeros(k, dtype=np.int64),
                    **settings)
    logits = np.ascontiguousarray(rng.standard_normal((k + 1, vocab_size)) * 1.5,
                                  dtype=target.dtype)
    draft_logits = np.ascontiguousarray(
        0.6 * logits[:k] + 0.8 * rng.standard_normal((k, vocab_size)), dtype=target.dtype)
    p = process(logits, settings, target.dtype)
    q = process(draft_logits, settings, target.dtype)
    results = []
    for position, source in enumerate(target.sources() or ["own"]):
        name = f"Monte Carlo from logits ({SOURCE_LABELS[source]})"
        if not (target.takes["target_logits"] and target.takes["draft_logits"]):
            results.append(skipped(name, "the verifier takes no target_logits= and "
                                   "draft_logits="))
            break
        # A fifth of the padded batch (a tenth with per-row seeds): filtered rows cost
        # more, and a filter ignored moves mass that 10 000 rows see.
        rows = max(num_rows // (5 if source not in SEEDED_SOURCES else 10), 1000)
        ids = _monte_carlo.draw_drafts(q, rows, rng)
        uniforms = rng.random((rows, k + 2))
        sampled = [replace(base, target=logits, draft=draft_logits, ids=ids[b],
                           uniforms=uniforms[b]) for b in range(rows)]
        greedy = _greedy_requests(rng, max(rows // 50, 8), vocab_size, k,
                                  ("logits", "logits"), lazy_bonus=True)
        requests = _interleave(rng, sampled, greedy)
        output = target(**_assemble(requests, ("logits", "logits"), target.dtype, source,
                                    salt=11 + position))
        collector.record(requests, output, f"Monte Carlo ({SOURCE_LABELS[source]})", vocab_size)
        keep = np.array([not r.greedy for r in requests])
        lowest, worst, tests = chain_chi_square(output[keep], p, rng)
        results.append(PropertyResult(
            name, lowest > _ALPHA, f"min p = {lowest:.3g}",
            f"{rows} sampled requests (and {len(greedy)} greedy ones), k = {k}, V = "
            f"{vocab_size}, logits with temperature 0.8, top-k {settings['top_k']}, top-p 0.9, "
            f"min-p 0.02, bonus drawn by the verifier; {tests} chi-square tests of the output "
            f"(completed by target draws) vs the processed target rows; each p must exceed "
            f"{_ALPHA:g}; lowest: {worst}"))
    return results


# --------------------------------------------------------------------------------------
# Batch invariance and seeds of a ragged batch
# --------------------------------------------------------------------------------------


def _mixed_requests(rng: np.random.Generator, k: int, vocab_size: int, stochastic: bool,
                    size: int) -> list[_Request]:
    menu = settings_menu()
    requests = []
    for b in range(size):
        length = int(rng.integers(0, k + 1))
        logits = rng.standard_normal((length + 1, vocab_size)) * 2
        ids = np.where(rng.random(length) < 0.6, logits[:length].argmax(axis=1),
                       rng.integers(0, vocab_size, length)).astype(np.int64)
        requests.append(_Request(
            logits, rng.standard_normal((length, vocab_size)), ids,
            uniforms=rng.random(length + 2),
            bonus=None if stochastic else int(rng.integers(vocab_size)),
            **menu[b % len(menu)]))
    return requests


def _check_ragged_batch(target: RaggedTarget, kind: str, k: int, vocab_size: int,
                        rng: np.random.Generator,
                        collector: _Collector) -> list[PropertyResult]:
    stochastic = registry.get(kind).stochastic
    name = "ragged batch invariance"
    if not (target.takes["target_logits"] and target.takes["draft_logits"]):
        return [skipped(name, "the verifier takes no target_logits= and draft_logits=")]
    size = 32
    requests = _mixed_requests(rng, k, vocab_size, stochastic, size)
    form = ("logits", "logits")
    source = "uniforms" if stochastic else "none"

    def call(rows: list[int], source: str = source, **keywords: Any) -> np.ndarray:
        chosen = [requests[b] for b in rows]
        values = _assemble(chosen, form, target.dtype, source="none" if keywords else source)
        output = target(**values, **keywords)
        collector.record(chosen, output, "ragged batch", vocab_size)
        return output

    results = []
    if stochastic and not target.takes["uniforms"]:
        results.append(skipped(name, "needs explicit uniforms"))
    else:
        full = call(list(range(size)))
        order = rng.permutation(size)
        permuted = call(order.tolist())
        width = full.shape[1]
        differing = set()
        for position, b in enumerate(order):
            if np.any(permuted[position, :width] != full[b, : permuted.shape[1]]):
                differing.add(int(b))
        for b in range(8):
            alone = call([b])
            if np.any(alone[0] != full[b, : alone.shape[1]]) or np.any(
                    full[b, alone.shape[1]:] != -1):
                differing.add(b)
        results.append(PropertyResult(
            name, not differing, f"{len(differing)} requests differ",
            f"{size} requests (k_b in 0..{k}, V = {vocab_size}, logits, per-request "
            f"temperature 0 to 1.3 and filters, greedy ones mixed in) in a batch, permuted, and "
            f"8 of them alone, {'same uniforms' if stochastic else 'no uniforms'}: each "
            f"request's output must be the same"))
    if stochastic:
        results += _kit_padded.seed_checks(
            target.sources(), lambda rows, **keywords: _pad(call(rows, **keywords), k), size)
    return results


def _pad(output: np.ndarray, k: int) -> np.ndarray:
    """``[B, max_k + 1]`` output widened to ``[B, k + 1]`` with -1 (batches of subsets)."""
    return np.pad(output, ((0, 0), (0, k + 1 - output.shape[1])), constant_values=-1)


# --------------------------------------------------------------------------------------
# The ragged layout's run
# --------------------------------------------------------------------------------------


def run(verifier: Callable[..., Any], kind: str, *, dtype: Any, limit: TimeLimit, k: int,
        vocab_size: int, num_rows: int, rng: np.random.Generator) -> list[PropertyResult]:
    """Every ragged property of ``kind`` (see the module docstring), in report order.

    Parameters
    ----------
    verifier : callable
        With ``verify_ragged``'s keywords.
    kind : str
        A registry verifier name.
    dtype : numpy.dtype
        Of the rows fed.
    limit : TimeLimit
        Of each call.
    k, vocab_size, num_rows : int
        Sizes of the Monte Carlo and batch checks.
    rng : numpy.random.Generator

    Returns
    -------
    list of PropertyResult
    """
    target = RaggedTarget(verifier, kind, dtype, limit)
    entry = registry.get(kind)
    collector = _Collector()
    rows: list[PropertyResult] = []
    if target.takes["target_probs"]:
        view = _kit_padded.PaddedTarget(_PaddedView(target), kind, dtype, limit)
        padded = _kit_padded.run(view, kind, k=k, vocab_size=vocab_size, num_rows=num_rows,
                                 rng=rng)
        rows += [replace(row, name=f"probabilities: {row.name}") for row in padded]
    else:
        rows.append(skipped("probabilities: every padded property",
                            "the verifier takes no target_probs="))
    if entry.stochastic:
        rows += guard_keywords("exact law from logits", lambda: _check_exact_logits(
            target, kind, rng, collector), limit)
        rows += guard_keywords("Monte Carlo from logits", lambda: _check_monte_carlo_logits(
            target, k, vocab_size, num_rows, rng, collector), limit)
    else:
        rows += guard_keywords(f"{kind} from logits equals the reference",
                         lambda: _check_reference_logits(target, kind, rng, collector,
                                                         vocab_size, k), limit)
    rows += guard_keywords("ragged batch invariance", lambda: _check_ragged_batch(
        target, kind, k, vocab_size, rng, collector), limit)
    # Last of the random checks: the draws of those above stay as they were.
    rows += _surface.run(target, kind, rng)
    rows.append(greedy_result(
        "greedy requests (temperature 0): argmax rule on raw rows", collector.greedy_count,
        collector.greedy_bad,
        "greedy requests mixed into the batches above (ties among them): accept while the "
        "draft is the first argmax of the raw row, the argmax at the first mismatch, the "
        "bonus row's argmax"))
    rows.append(format_result(
        "ragged output format", sorted(set(target.format_errors)) + collector.format_problems,
        collector.rows,
        "[B, max_k + 1], each request its accepted draft prefix, one token, -1 padding past "
        "k_b + 1"))
    return rows



#: The ragged layout's entry of the kit (``registry.get_layout("ragged").kit``), with the
#: arguments every layout's kit takes.
check = run
