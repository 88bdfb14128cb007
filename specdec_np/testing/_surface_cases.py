"""The cases of the conformance kit's sampling-settings checks, and the laws they must have.

:data:`CASES` holds one request setting each (penalties whose drafts repeat tokens, a
grammar bitmask along the drafts, a logit bias at temperatures below and above 1, allowed
ids, bad words and ``min_tokens`` along the drafts); :class:`Model` holds a case's rows and
computes the law of each row after the tokens before it as the reference does
(:func:`specdec_np._reference.surface.adjust_logits`, then
:func:`specdec_np._reference.chains.process_logits`), under the right law or one of the
wrong ones of :data:`VARIANTS`; :func:`case_model` draws a case's rows once per process.
:mod:`specdec_np.testing._surface` runs the checks.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._reference import chains as _reference
from .._reference import surface as surface_reference
from . import _monte_carlo

__all__ = ["ASPECTS", "CASES", "SURFACE_KEYWORDS", "VARIANTS", "Model", "SurfaceCase",
           "case_model"]

#: The keywords of the sampling settings the kit may pass.
SURFACE_KEYWORDS = ("prompt_token_ids", "output_token_ids", "repetition_penalty",
                    "frequency_penalty", "presence_penalty", "logit_bias",
                    "allowed_token_ids", "bad_words_token_ids", "min_tokens",
                    "stop_token_ids", "max_tokens", "token_bitmask", "logprobs")
#: Per-request settings passed as one entry per request (None: off for that request).
LISTED = ("prompt_token_ids", "output_token_ids", "logit_bias", "allowed_token_ids",
          "bad_words_token_ids", "stop_token_ids")
#: Per-request numbers passed as arrays ``[B]``, with their values that are off.
NUMBERS = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
           "min_tokens": 0}
#: Sampling parameters and their values that are off.
OFF: dict[str, Any] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
#: The vocabulary and the drafts per request of the exact laws.
VOCAB = 6
DRAFTS = 2
#: How far each wrong law of a case must move some row the drafts reach (:func:`movement`),
#: for the exact laws and for the Monte Carlo check.
MOVES = 1e-3
MONTE_CARLO_MOVES = 0.15
ATTEMPTS = 200

#: The wrong ways of handling a case's settings whose thresholds the exact laws also cut,
#: so that a verifier that follows one is integrated exactly and shows its whole error.
VARIANTS = {
    "settings off": "the row settings ignored",
    "without the draft prefix": "the context of every row is the output before the step "
                                "(the drafts before the row left out)",
    "masks ignored": "the bitmask ignored",
    "bonus row without its mask": "the bonus row's bitmask ignored",
    "draft rows without the mask": "the draft logits not masked",
    "bias after temperature": "the bias added after the temperature",
}

Grammar = Callable[[int, tuple[int, ...]], frozenset[int]]


def chain_grammar(row: int, prefix: tuple[int, ...]) -> frozenset[int]:
    """Forbidden tokens: 1 first; no immediate repeat and no 3 next; at the bonus, the
    tokens of the parity of the draft before it."""
    if row == 0:
        return frozenset({1})
    if row == 1:
        return frozenset({prefix[0], 3})
    return frozenset(range(prefix[-1] % 2, VOCAB, 2))


def narrow_grammar(row: int, prefix: tuple[int, ...]) -> frozenset[int]:
    """Two tokens allowed at each draft position (0 or 3, then the two after the first
    draft), the bonus as in :func:`chain_grammar`: the draft logits' support is small."""
    if row == 0:
        return frozenset(range(VOCAB)) - {0, 3}
    if row == 1:
        return frozenset(range(VOCAB)) - {(prefix[0] + 1) % VOCAB, (prefix[0] + 2) % VOCAB}
    return chain_grammar(row, prefix)


@dataclass(frozen=True)
class SurfaceCase:
    """One request setting of the sampling-settings checks.

    Attributes
    ----------
    aspect : str
        The property it belongs to.
    settings : dict
        The request's keywords of :data:`SURFACE_KEYWORDS` (one request's value each).
    sampling : dict
        Its temperature and filters (the others off).
    drafts : tuple of tuples of int, or None
        Point-mass draft tuples, each checked alone; None: the drafts are drawn from draft
        logits processed like the target's (the verifier must take ``draft_logits``).
    grammar : callable or None
        ``grammar(row, drafts before it)``: the tokens its bitmask forbids.
    variants : tuple of str
        The wrong laws of :data:`VARIANTS` the exact law also cuts at.
    """

    aspect: str
    settings: dict[str, Any]
    sampling: dict[str, Any]
    drafts: tuple[tuple[int, ...], ...] | None
    grammar: Grammar | None = None
    variants: tuple[str, ...] = ()

    @property
    def keywords(self) -> tuple[str, ...]:
        """The verifier's keywords this case needs."""
        names = [*self.settings, *(name for name in self.sampling if name != "temperature")]
        if self.grammar is not None:
            names.append("token_bitmask")
        if self.drafts is None:
            names.append("draft_logits")
        return tuple(names)

    @property
    def label(self) -> str:
        """The case, for a report."""
        parts = [f"{name} {value}" for name, value in {**self.sampling, **self.settings}.items()]
        if self.grammar is not None:
            parts.append(f"bitmask of {self.grammar.__name__.lstrip('_')}")
        if self.drafts is None:
            parts.append("drafts from draft logits")
        elif self.drafts:
            parts.append(f"point-mass drafts {list(self.drafts)}")
        return ", ".join(parts)


PENALTIES = "penalties along the drafts"
GRAMMAR = "grammar bitmask, the bonus row's too"
BIAS = "logit bias before temperature"
MASKS = "allowed ids, bad words and min_tokens along the drafts"
PENALTY_SETTINGS = {"prompt_token_ids": [0, 1], "output_token_ids": [2, 3, 2],
                     "repetition_penalty": 1.7, "frequency_penalty": 0.6,
                     "presence_penalty": 0.4}
CONTEXT = ("settings off", "without the draft prefix")

#: The cases, by property.  Each draft tuple is chosen to reach what the property is about:
#: a token drafted twice, a draft the grammar forbids, the bonus row under its own mask, a
#: bad word completed by the drafts, a stop token allowed only after the drafts.
CASES = (
    SurfaceCase(PENALTIES, PENALTY_SETTINGS, {"temperature": 0.8},
                ((4, 4), (2, 5)), variants=CONTEXT),
    SurfaceCase(PENALTIES, PENALTY_SETTINGS, {"temperature": 0.8, "top_k": 2}, None,
                variants=CONTEXT),
    SurfaceCase(GRAMMAR, {}, {"temperature": 1.3}, ((0, 0), (1, 2), (2, 4)),
                chain_grammar, ("masks ignored", "bonus row without its mask")),
    SurfaceCase(GRAMMAR, {}, {"temperature": 0.9}, None, narrow_grammar,
                ("masks ignored", "bonus row without its mask",
                 "draft rows without the mask")),
    SurfaceCase(BIAS, {"logit_bias": {1: 2.0, 4: -1.5, 0: 0.7}}, {"temperature": 0.5},
                ((1, 1), (3, 4)), variants=("settings off", "bias after temperature")),
    SurfaceCase(BIAS, {"logit_bias": {2: 1.2, 5: -0.8}}, {"temperature": 1.8, "top_k": 4},
                ((2, 5),), variants=("settings off", "bias after temperature")),
    SurfaceCase(MASKS, {"output_token_ids": [0, 3], "allowed_token_ids": [0, 1, 2, 3, 5],
                        "bad_words_token_ids": [[2, 3], [3, 1, 1]], "min_tokens": 4,
                        "stop_token_ids": [5]},
                {"temperature": 0.9}, ((1, 1), (2, 5), (1, 2)), variants=CONTEXT),
)
ASPECTS = tuple(dict.fromkeys(case.aspect for case in CASES))
GREEDY = "greedy requests after masks, bias and penalties"
STOPS = "stop tokens and max_tokens cut the run"
LOGPROBS = "logprobs (processed, raw, top-N)"


def property_name(name: str) -> str:
    """The report's name of a sampling-settings property."""
    return f"sampling settings: {name}"


def bitmask_word(forbidden: frozenset[int] | None) -> int:
    """The int32 word of an xgrammar bitmask of ``V < 32`` tokens: every bit set but the
    forbidden tokens'."""
    word = -1
    for token in forbidden or ():
        word &= ~(1 << token)
    return word


def one_request(settings: dict[str, Any]) -> dict[str, Any]:
    """One request's settings as the reference reads a batch of one."""
    return {name: [value] if name in LISTED else value for name, value in settings.items()}


def process(rows: np.ndarray, sampling: dict[str, Any]) -> np.ndarray:
    """The processed law of logits rows ``[n, V]`` (the reference's), float64."""
    values = {**OFF, **sampling}
    n = rows.shape[0]
    return np.asarray(_reference.process_logits(
        rows, np.full(n, float(values["temperature"])),
        np.full(n, int(values["top_k"]), dtype=np.int64), np.full(n, float(values["top_p"])),
        np.full(n, float(values["min_p"]))), dtype=np.float64)


class Model:
    """One request's rows and how the law of each follows from its context.

    Laws are computed in batches (:meth:`prefetch`) and kept: a law is keyed by ``(row,
    prefix, variant, draft, greedy)``.

    Parameters
    ----------
    case : SurfaceCase
    target : numpy.ndarray
        Raw target logits ``[k + 1, V]`` (the same at every context).
    draft : numpy.ndarray or None
        Raw draft logits ``[k, V]`` (cases with drafts from draft logits).
    """

    def __init__(self, case: SurfaceCase, target: np.ndarray, draft: np.ndarray | None):
        self.case = case
        self.target = target
        self.draft = draft
        self.cache: dict[tuple[Any, ...], np.ndarray] = {}

    def forbidden(self, row: int, prefix: tuple[int, ...]) -> frozenset[int] | None:
        """What the grammar forbids at ``row`` after ``prefix`` (None without one)."""
        grammar = self.case.grammar
        return None if grammar is None else grammar(row, prefix)

    def adjusted(self, places: list[tuple[int, tuple[int, ...]]], variant: str | None = None,
                 draft: bool = False) -> np.ndarray:
        """The rows after masks, bias and penalties ``[n, V]`` in the rows' dtype, one per
        ``(row, drafts before it)``, under the right law or a ``variant``."""
        settings = dict(self.case.settings)
        output = list(settings.get("output_token_ids", []))
        if variant == "settings off":
            settings = {}
        bias = settings.pop("logit_bias", None) if variant == "bias after temperature" else None
        k = self.target.shape[0] - 1
        contexts, words = [], []
        for row, prefix in places:
            contexts.append(output if variant == "without the draft prefix"
                            else output + list(prefix))
            unmasked = (variant == "masks ignored"
                        or (variant == "bonus row without its mask" and row == k)
                        or (variant == "draft rows without the mask" and draft))
            words.append(bitmask_word(None if unmasked else self.forbidden(row, prefix)))
        source = self.draft if draft and self.draft is not None else self.target
        rows = source[[row for row, _ in places]]
        masks = None if self.case.grammar is None else np.array(words, dtype=np.int32)[:, None]
        values = np.asarray(surface_reference.adjust_logits(
            np, rows, contexts, one_request(settings), 0, masks))
        if bias:
            # (x + T b) / T = x / T + b: the bias after the temperature.
            temperature = float(self.case.sampling.get("temperature", 1.0))
            shift = np.zeros(values.shape[1])
            for token, value in bias.items():
                shift[int(token)] = temperature * float(value)
            values = values + shift.astype(values.dtype)
        return values

    def prefetch(self, keys: list[tuple[Any, ...]]) -> None:
        """Compute the laws ``keys`` (``(row, prefix, variant, draft, greedy)``) not yet
        kept, one batch per ``(variant, draft, greedy)``."""
        groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
        for key in dict.fromkeys(keys):
            if key not in self.cache:
                groups.setdefault(key[2:], []).append(key)
        for (variant, draft, greedy), members in groups.items():
            values = self.adjusted([(row, prefix) for row, prefix, *_ in members], variant,
                                   draft)
            laws = process(values, {} if greedy else self.case.sampling)
            self.cache.update(zip(members, laws))

    def law(self, row: int, prefix: tuple[int, ...], variant: str | None = None,
            draft: bool = False, greedy: bool = False) -> np.ndarray:
        """The law of ``row`` after ``prefix`` ``[V]`` float64; ``greedy``: the softmax of
        the adjusted row (a greedy request's processed logprobs)."""
        key = (row, prefix, variant, draft, greedy)
        self.prefetch([key])
        return self.cache[key]

    def chain_keys(self, drafts: tuple[int, ...], variant: str | None = None,
                   point_mass: bool = True) -> list[tuple[Any, ...]]:
        """The keys of :meth:`chain`."""
        k = len(drafts)
        keys = [(i, drafts[:i], variant, False, False) for i in range(k + 1)]
        if not point_mass:
            keys += [(i, drafts[:i], variant, True, False) for i in range(k)]
        return keys

    def chain(self, drafts: tuple[int, ...], variant: str | None = None,
              point_mass: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The target rows ``[k + 1, V]`` and draft rows ``[k, V]`` along ``drafts``."""
        k = len(drafts)
        self.prefetch(self.chain_keys(drafts, variant, point_mass))
        p = np.stack([self.law(i, drafts[:i], variant) for i in range(k + 1)])
        if point_mass:
            q = np.zeros((k, p.shape[1]))
            q[np.arange(k), list(drafts)] = 1.0
        else:
            q = np.stack([self.law(i, drafts[:i], variant, draft=True) for i in range(k)])
        return p, q

    def target_law(self, k: int) -> np.ndarray:
        """The target's law of the whole chain ``[V] * (k + 1)``: the product of the rows,
        each after the tokens before it."""
        vocab_size = self.target.shape[1]
        law = np.ones(())
        for depth in range(k + 1):
            prefixes = list(itertools.product(range(vocab_size), repeat=depth))
            self.prefetch([(depth, prefix, None, False, False) for prefix in prefixes])
            rows = np.stack([self.cache[(depth, prefix, None, False, False)]
                             for prefix in prefixes])
            law = law[..., None] * rows.reshape((vocab_size,) * depth + (vocab_size,))
        return law

    def continue_into(self, counts: np.ndarray, prefix: tuple[int, ...], count: int,
                      rng: np.random.Generator) -> None:
        """Add to ``counts`` (``[V] * (k + 1)``) ``count`` copies of ``prefix`` each
        continued to ``k + 1`` tokens by draws from the target's rows."""
        if len(prefix) == counts.ndim:
            counts[prefix] += count
            return
        drawn = _monte_carlo.draw_from(self.law(len(prefix), prefix), count, rng)
        tokens, repeats = np.unique(drawn, return_counts=True)
        for token, repeat in zip(tokens.tolist(), repeats.tolist()):
            self.continue_into(counts, (*prefix, token), repeat, rng)

    def greedy_chain(self) -> tuple[int, ...]:
        """The drafts a greedy request accepts in full: the argmax after the settings."""
        tokens: tuple[int, ...] = ()
        for row in range(self.target.shape[0] - 1):
            values = self.adjusted([(row, tokens)])[0]
            tokens += (int(np.argmax(np.where(np.isnan(values), -np.inf, values))),)
        return tokens

    def drafts(self) -> list[tuple[tuple[int, ...], float]]:
        """Each draft tuple with its probability: the case's point masses one by one (each
        weight 1), or every tuple of the processed draft logits' support."""
        if self.case.drafts is not None:
            return [(tuple(drafts), 1.0) for drafts in self.case.drafts]
        k = self.target.shape[0] - 1
        found: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
        for i in range(k):
            self.prefetch([(i, prefix, None, True, False) for prefix, _ in found])
            longer = []
            for prefix, weight in found:
                q = self.law(i, prefix, draft=True)
                longer += [((*prefix, int(x)), weight * float(q[x])) for x in np.flatnonzero(q)]
            found = longer
        return found


def movement(model: Model, variant: str) -> float:
    """How far a wrong law moves the rows the drafts reach: the largest change of an entry
    of a target or draft row, times the probability that a lossless verifier reaches the
    row (the tuple's probability and the target probability of the drafts before it)."""
    point_mass = model.case.drafts is not None
    moved = 0.0
    for drafts, weight in model.drafts():
        p, q = model.chain(drafts, point_mass=point_mass)
        p_wrong, q_wrong = model.chain(drafts, variant, point_mass=point_mass)
        reach = weight
        for i in range(len(drafts) + 1):
            change = np.max(np.abs(p[i] - p_wrong[i]))
            if i < len(drafts):
                change = max(change, np.max(np.abs(q[i] - q_wrong[i])))
                moved = max(moved, reach * float(change))
                reach *= float(p[i, drafts[i]])
            else:
                moved = max(moved, reach * float(change))
    return moved


def find_model(case: SurfaceCase, rng: np.random.Generator, dtype: Any, moves: float) -> Model:
    """Rows for ``case`` on which each of its wrong laws moves the law by more than
    ``moves`` (:func:`movement`)."""
    k = DRAFTS
    for _ in range(ATTEMPTS):
        scale = rng.uniform(0.8, 2.0, (k + 1, 1))
        target = np.asarray(rng.standard_normal((k + 1, VOCAB)) * scale, dtype=dtype)
        draft = None
        if case.drafts is None:
            draft = np.asarray(0.6 * target[:k] + 0.8 * rng.standard_normal((k, VOCAB)),
                               dtype=dtype)
        model = Model(case, target, draft)
        point_mass = case.drafts is not None
        model.prefetch([key for drafts, _ in model.drafts()
                        for variant in (None, *case.variants)
                        for key in model.chain_keys(drafts, variant, point_mass)])
        if all(movement(model, variant) > moves for variant in case.variants):
            return model
    raise RuntimeError(f"no rows on which each wrong law of {case.label} moves the law")


@functools.cache
def case_model(index: int, dtype_name: str, monte_carlo: bool = False) -> Model:
    """The rows of ``CASES[index]``, drawn from a generator seeded by the index: the same
    in every run, so that each law is computed once per process.

    Parameters
    ----------
    index : int
    dtype_name : str
        Of the logits fed to the verifier.
    monte_carlo : bool
        Rows for the Monte Carlo check: each wrong law moves a reached row by
        :data:`MONTE_CARLO_MOVES` (:data:`MOVES` otherwise), which its sample sees.

    Returns
    -------
    Model
    """
    return find_model(CASES[index], np.random.default_rng([index, 26 if monte_carlo else 22]),
                  np.dtype(dtype_name), MONTE_CARLO_MOVES if monte_carlo else MOVES)
