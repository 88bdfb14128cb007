"""The end-to-end demo behind ``specdec-np demo``: an n-gram target, two drafters and a
speculative-decoding loop that verifies through the engine entry point
(:class:`specdec_np.EngineVerifier`, the ragged layout of :func:`specdec_np.verify_ragged`).

Everything is built in memory at start-up, from text every Python installation has: the
docstrings of a fixed, sorted list of standard-library modules.  Nothing is downloaded and
nothing is cached on disk.

* Corpus: module, class, function and method docstrings (``__doc__``, cleaned with
  :func:`inspect.cleandoc`, duplicates dropped, doctest lines dropped), lowercased and
  split into words, numbers and the punctuation ``. , ; : ?``.  Documents are joined into
  one stream separated by ``<eos>``.  For one Python version on one platform the corpus is
  the same on every machine (a module missing from a stripped-down build is skipped, and
  ``python -OO`` removes the docstrings of pure-Python modules).
* Vocabulary: the most frequent words (ties broken alphabetically) plus ``<unk>`` and
  ``<eos>``.
* Target: an interpolated Kneser-Ney trigram model (absolute discounting at every order,
  continuation counts for the bigram and unigram levels, a little uniform mass at the
  bottom so that no word has probability zero).
* Drafters: prompt lookup (the tokens that followed an earlier occurrence of the
  request's last tokens in its own context: 0 to ``k`` point-mass drafts), or an
  interpolated bigram model with absolute discounting over an add-one unigram, a weaker
  model of the same text, sampled with each request's parameters.
* Requests: a mixed batch of greedy (temperature 0) and sampled ones with temperature,
  top-k and top-p (:data:`SAMPLING_CYCLE`).  The verifier gets the target's
  log-probabilities as logits, applies each request's parameters, and draws every bonus
  token itself, so the token a request gets without speculation has the same law.

Both models return dense float32 ``[N, V]`` distributions for ``N`` contexts at once; the
sparse counts are kept in CSR form and scattered into the dense rows with numpy indexing.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
import textwrap
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import registry
from .._reference.chains import process_logits
from ..engine import EngineVerifier
from ..metrics import VerificationMetrics

__all__ = [
    "CORPUS_MODULES",
    "DRAFTERS",
    "SAMPLING_CYCLE",
    "VERIFIERS",
    "Corpus",
    "DemoConfig",
    "DemoResult",
    "InterpolatedNGram",
    "Sampling",
    "build_corpus",
    "build_models",
    "detokenize",
    "format_text",
    "prompt_lookup",
    "run_demo",
]

#: Standard-library modules whose docstrings make the corpus (platform-independent ones;
#: ``os``, ``socket``, ``selectors``, ``locale`` and ``signal`` are left out on purpose
#: because their contents differ between operating systems).
CORPUS_MODULES: tuple[str, ...] = tuple(
    sorted(
        """
        abc argparse array ast asyncio base64 bdb binascii bisect bz2 calendar cmath cmd
        code codecs codeop collections colorsys concurrent.futures configparser contextlib
        contextvars copy copyreg csv dataclasses datetime decimal difflib dis doctest email
        email.message email.parser email.utils enum filecmp fnmatch fractions ftplib
        functools getopt gettext glob graphlib gzip hashlib heapq hmac html html.parser
        http http.client http.cookiejar http.cookies http.server imaplib importlib
        importlib.metadata inspect io ipaddress itertools json json.decoder json.encoder
        keyword linecache logging logging.handlers lzma mailbox math mimetypes netrc
        numbers operator optparse pathlib pdb pickle pickletools pkgutil plistlib poplib
        pprint profile pstats pydoc queue quopri random re reprlib runpy sched secrets
        shelve shlex shutil smtplib socketserver statistics string stringprep struct
        symtable sysconfig tabnanny tarfile tempfile textwrap threading timeit token
        tokenize tomllib trace traceback types typing unicodedata unittest unittest.mock
        urllib.parse urllib.request uuid warnings wave weakref xml.dom.minidom
        xml.etree.ElementTree xml.sax zipfile zipimport zlib zoneinfo
        """.split()
    )
)

#: The verifiers the demo can run: every registered one.
VERIFIERS: tuple[str, ...] = registry.names()
# The temperature-0 verifier accepts only the target's argmax, so with it the demo drafts
# argmax tokens and takes the argmax as bonus token.  The registry has no flag for this
# (yet), so the name is compared here, in this one place.
_ARGMAX_DECODING = "greedy"

UNK = "<unk>"
EOS = "<eos>"
_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|[0-9]+|[.,;:?]")
_PUNCTUATION = frozenset(".,;:?")
_MIN_CORPUS_TOKENS = 5000
_DISCOUNT = 0.75
_UNIFORM_MASS = 0.01


# -- corpus ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The tokenised demo corpus.

    Attributes
    ----------
    words : tuple of str
        The vocabulary; index ``i`` is token id ``i``.  ``words[0]`` is ``<unk>``,
        ``words[1]`` is ``<eos>``.
    stream : int64 ndarray
        All documents as token ids, each followed by ``<eos>`` (the stream starts with one
        ``<eos>`` too, so every document has a left context).
    documents : list of int64 ndarray
        Each document's token ids, without the ``<eos>``.
    modules : tuple of str
        The modules the docstrings came from (those importable here).
    """

    words: tuple[str, ...]
    stream: np.ndarray
    documents: list[np.ndarray]
    modules: tuple[str, ...]

    @property
    def vocab_size(self) -> int:
        """Number of token ids, ``<unk>`` and ``<eos>`` included."""
        return len(self.words)

    @property
    def eos_id(self) -> int:
        """Token id of ``<eos>``."""
        return 1


def _docstrings(module_names: Sequence[str]) -> tuple[list[str], list[str]]:
    """Docstrings of the modules, their public classes, functions and methods, in a fixed
    order (modules as given, names sorted), without duplicates."""
    texts: list[str] = []
    seen: set[str] = set()
    found: list[str] = []

    def add(doc: Any) -> None:
        if not isinstance(doc, str) or not doc.strip():
            return
        doc = inspect.cleandoc(doc)
        if doc not in seen:
            seen.add(doc)
            texts.append(doc)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module_name in module_names:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            found.append(module_name)
            add(module.__doc__)
            owners = (module_name, "_" + module_name)
            for name, obj in sorted(vars(module).items()):
                if name.startswith("_") or getattr(obj, "__module__", None) not in owners:
                    continue
                add(getattr(obj, "__doc__", None))
                if inspect.isclass(obj):
                    for member_name, member in sorted(vars(obj).items()):
                        if member_name.startswith("_"):
                            continue
                        if callable(member) or isinstance(member, property):
                            add(getattr(member, "__doc__", None))
    return texts, found


def _tokenize(text: str) -> list[str]:
    """Lowercase words, numbers and ``. , ; : ?``; doctest lines are dropped."""
    lines = (
        line for line in text.lower().splitlines() if not line.lstrip().startswith((">>>", "..."))
    )
    return _TOKEN.findall("\n".join(lines))


def build_corpus(vocab_size: int = 4000, modules: Sequence[str] = CORPUS_MODULES) -> Corpus:
    """Build the demo corpus from standard-library docstrings.

    Parameters
    ----------
    vocab_size : int
        Number of words kept (the most frequent; ties broken alphabetically); the others
        become ``<unk>``.  ``<unk>`` and ``<eos>`` come on top.
    modules : sequence of str
        Modules to read; those that cannot be imported are skipped.

    Returns
    -------
    Corpus

    Raises
    ------
    RuntimeError
        If fewer than a few thousand tokens are found (for example under ``python -OO``).
    """
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be at least 2; found {vocab_size}")
    texts, found = _docstrings(modules)
    tokenized = [tokens for tokens in map(_tokenize, texts) if tokens]
    counts = Counter(token for tokens in tokenized for token in tokens)
    total = sum(counts.values())
    if total < _MIN_CORPUS_TOKENS:
        raise RuntimeError(
            f"the standard-library docstrings gave only {total} tokens (need "
            f"{_MIN_CORPUS_TOKENS}); was Python started with -OO?"
        )
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:vocab_size]
    words = (UNK, EOS, *sorted(word for word, _ in ranked))
    index = {word: i for i, word in enumerate(words)}
    documents = [
        np.fromiter((index.get(token, 0) for token in tokens), dtype=np.int64, count=len(tokens))
        for tokens in tokenized
    ]
    eos = np.ones(1, dtype=np.int64)
    stream = np.concatenate([eos, *(part for doc in documents for part in (doc, eos))])
    return Corpus(words=words, stream=stream, documents=documents, modules=tuple(found))


def detokenize(words: Sequence[str]) -> str:
    """Join words into text: no space before punctuation, ``<eos>`` kept visible."""
    pieces: list[str] = []
    for word in words:
        if pieces and word not in _PUNCTUATION:
            pieces.append(" ")
        pieces.append(word)
    return "".join(pieces)


# -- n-gram models -----------------------------------------------------------------------


@dataclass(frozen=True)
class _ConditionalTable:
    """Sparse discounted counts of one order, in CSR form over its contexts.

    For context ``c`` (sorted keys ``contexts``), entries ``offsets[c] : offsets[c+1]``
    hold the next words seen after it and ``max(count - d, 0) / total(c)``; ``backoff[c] =
    d * types(c) / total(c)`` is the mass passed to the lower order.  Contexts never seen
    pass all their mass down.
    """

    contexts: np.ndarray
    offsets: np.ndarray
    next_words: np.ndarray
    discounted: np.ndarray
    backoff: np.ndarray

    @classmethod
    def from_counts(
        cls,
        context_keys: np.ndarray,
        next_words: np.ndarray,
        counts: np.ndarray,
        discount: float,
    ) -> _ConditionalTable:
        """Build from parallel arrays sorted by ``(context_keys, next_words)``."""
        contexts, starts, types = np.unique(context_keys, return_index=True, return_counts=True)
        offsets = np.append(starts, len(context_keys)).astype(np.int64)
        totals = np.add.reduceat(counts.astype(np.float64), starts) if len(starts) else np.zeros(0)
        per_entry_total = np.repeat(totals, types)
        discounted = np.maximum(counts - discount, 0.0) / per_entry_total
        backoff = discount * types / totals
        return cls(
            contexts.astype(np.int64), offsets, next_words.astype(np.int64), discounted, backoff
        )

    def add_into(self, out: np.ndarray, keys: np.ndarray, scale: np.ndarray) -> None:
        """For each row ``n``: ``out[n] += scale[n] * discounted(keys[n])`` and
        ``scale[n] *= backoff(keys[n])`` where the context was seen (in place)."""
        slot = np.searchsorted(self.contexts, keys)
        slot = np.minimum(slot, len(self.contexts) - 1)
        seen = self.contexts[slot] == keys
        rows = np.flatnonzero(seen)
        if rows.size == 0:
            return
        slot = slot[rows]
        starts = self.offsets[slot]
        lengths = self.offsets[slot + 1] - starts
        ends = np.cumsum(lengths)
        entries = np.arange(ends[-1]) + np.repeat(starts - (ends - lengths), lengths)
        out[np.repeat(rows, lengths), self.next_words[entries]] += self.discounted[
            entries
        ] * np.repeat(scale[rows], lengths)
        scale[rows] *= self.backoff[slot]


class InterpolatedNGram:
    """An interpolated n-gram language model with dense probability output.

    ``p(w | h) = A_n(w | h) + B_n(h) * (A_{n-1}(w | h') + B_{n-1}(h') * (... * base(w)))``
    where ``A`` are the discounted counts and ``B`` the back-off masses of each order.

    Parameters
    ----------
    tables : list of _ConditionalTable
        From the highest order down to the bigram; table ``j`` conditions on the last
        ``len(tables) - j`` tokens.
    base : float64 ndarray [V]
        The unigram distribution at the bottom (sums to 1, no zeros).
    name : str
        A description for the summary.
    """

    def __init__(self, tables: list[_ConditionalTable], base: np.ndarray, name: str) -> None:
        self.tables = tables
        self.base = base
        self.name = name
        self.vocab_size = int(base.shape[0])

    @property
    def context_length(self) -> int:
        """Number of previous tokens the model conditions on."""
        return len(self.tables)

    def probs(self, history: np.ndarray) -> np.ndarray:
        """Next-token distributions.

        Parameters
        ----------
        history : int ndarray [N, context_length]
            The last tokens of each context, oldest first.

        Returns
        -------
        float32 ndarray [N, V]
            Each row sums to one (up to float32 rounding) and has no zero.
        """
        history = np.asarray(history, dtype=np.int64)
        n_rows = history.shape[0]
        out = np.zeros((n_rows, self.vocab_size), dtype=np.float64)
        scale = np.ones(n_rows, dtype=np.float64)
        for depth, table in zip(range(self.context_length, 0, -1), self.tables):
            keys = np.zeros(n_rows, dtype=np.int64)
            for column in range(self.context_length - depth, self.context_length):
                keys = keys * self.vocab_size + history[:, column]
            table.add_into(out, keys, scale)
        out += scale[:, None] * self.base[None, :]
        return out.astype(np.float32)

    def log_probs(self, history: np.ndarray) -> np.ndarray:
        """Next-token log-probabilities, the logits an engine would hand the verifier.

        Parameters
        ----------
        history : int ndarray [N, context_length]
            The last tokens of each context, oldest first.

        Returns
        -------
        float32 ndarray [N, V]
            ``log p``, with ``-inf`` for a token of probability zero (this model has none).
        """
        probs = self.probs(history)
        with np.errstate(divide="ignore"):
            return np.log(probs)


def _split_keys(keys: np.ndarray, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    return keys // vocab_size, keys % vocab_size


def build_models(corpus: Corpus) -> tuple[InterpolatedNGram, InterpolatedNGram]:
    """Train the target (Kneser-Ney trigram) and the draft (bigram) on the corpus.

    Returns
    -------
    target, draft : InterpolatedNGram
    """
    V = corpus.vocab_size
    s = corpus.stream
    uniform = np.full(V, 1.0 / V)

    bigram_keys, bigram_counts = np.unique(s[:-1] * V + s[1:], return_counts=True)
    trigram_keys, trigram_counts = np.unique(
        (s[:-2] * V + s[1:-1]) * V + s[2:], return_counts=True
    )

    # Target: interpolated Kneser-Ney.  Bigram level from continuation counts
    # N1+(. v w); unigram level from N1+(. w); a little uniform mass below.
    tri_context, tri_word = _split_keys(trigram_keys, V)
    trigram_table = _ConditionalTable.from_counts(tri_context, tri_word, trigram_counts, _DISCOUNT)
    continuation_keys, continuation_counts = np.unique(trigram_keys % (V * V), return_counts=True)
    kn_context, kn_word = _split_keys(continuation_keys, V)
    kn_bigram_table = _ConditionalTable.from_counts(
        kn_context, kn_word, continuation_counts, _DISCOUNT
    )
    left_types = np.bincount(bigram_keys % V, minlength=V).astype(np.float64)
    kn_unigram = (1.0 - _UNIFORM_MASS) * left_types / left_types.sum() + _UNIFORM_MASS * uniform
    target = InterpolatedNGram(
        [trigram_table, kn_bigram_table],
        kn_unigram,
        "interpolated Kneser-Ney trigram",
    )

    # Draft: bigram with absolute discounting over an add-one unigram.
    bi_context, bi_word = _split_keys(bigram_keys, V)
    bigram_table = _ConditionalTable.from_counts(bi_context, bi_word, bigram_counts, _DISCOUNT)
    add_one = (np.bincount(s, minlength=V) + 1.0) / (len(s) + V)
    draft = InterpolatedNGram([bigram_table], add_one, "interpolated bigram")
    return target, draft


# -- drafters and sampling settings ----------------------------------------------------------


#: The demo's drafters: ``prompt-lookup`` proposes what followed the latest earlier
#: occurrence of the request's last tokens in its own context (point-mass drafts, anything
#: from 0 to ``k`` of them); ``ngram`` samples ``k`` tokens from the bigram draft model
#: (drafts with real probabilities).
DRAFTERS: tuple[str, ...] = ("prompt-lookup", "ngram")

# Longest n-gram first: a longer match predicts its continuation better.  No unigram
# level, so a request whose last two tokens never occurred before proposes nothing.
_LOOKUP_NGRAM_SIZES = (3, 2)


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters of one request.

    Attributes
    ----------
    temperature : float
        0: greedy (argmax of the raw target row).
    top_k : int
        0: off.
    top_p : float
        1: off.
    """

    temperature: float
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        """Whether the request decodes by argmax."""
        return self.temperature == 0

    def describe(self) -> str:
        """A short label, for example ``"T=0.8 top-p 0.9"``."""
        if self.greedy:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.top_p < 1:
            parts.append(f"top-p {self.top_p:g}")
        return " ".join(parts)


#: Request ``b`` decodes with ``SAMPLING_CYCLE[b % len(SAMPLING_CYCLE)]``: a batch that
#: mixes greedy and sampled requests with every filter the demo exercises.
SAMPLING_CYCLE: tuple[Sampling, ...] = (
    Sampling(0.0),
    Sampling(1.0),
    Sampling(0.8, top_p=0.9),
    Sampling(0.7, top_k=50, top_p=0.95),
)


def prompt_lookup(context: np.ndarray, k: int) -> np.ndarray:
    """Prompt-lookup drafts of one request.

    Parameters
    ----------
    context : int64 ndarray [L]
        The request's tokens so far (prompt and generated).
    k : int
        The most drafts to propose.

    Returns
    -------
    int64 ndarray [k_b], ``0 <= k_b <= k``
        The tokens that followed the latest earlier occurrence of the context's last
        3 tokens (else its last 2), as many as there are, at most ``k``; empty when
        neither occurred before.
    """
    length = context.shape[0]
    for n in _LOOKUP_NGRAM_SIZES:
        if length <= n:
            continue
        # Windows that end before the last token, so that each has a continuation.
        windows = np.lib.stride_tricks.sliding_window_view(context[: length - 1], n)
        hits = np.flatnonzero((windows == context[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return context[start : start + k]
    return context[:0]


def _draw(
    logits: np.ndarray, sampling: Sequence[Sampling], rng: np.random.Generator
) -> np.ndarray:
    """One token per row of ``logits`` [N, V] from the row's processed law (the argmax for
    a greedy request): the law the verifier applies to the same logits."""
    tokens = logits.argmax(axis=1).astype(np.int64)
    sampled = np.flatnonzero([not s.greedy for s in sampling])
    if sampled.size:
        probs = process_logits(
            logits[sampled],
            np.array([sampling[i].temperature for i in sampled]),
            np.array([sampling[i].top_k for i in sampled]),
            np.array([sampling[i].top_p for i in sampled]),
            np.zeros(sampled.size),
        )
        tokens[sampled] = _sample_rows(probs, rng)
    return tokens


def _sample_rows(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of ``probs`` [N, V] by inverse CDF (float64 running sums)."""
    cdf = np.cumsum(probs, axis=1, dtype=np.float64)
    threshold = rng.random(probs.shape[0]) * cdf[:, -1]
    tokens = (cdf <= threshold[:, None]).sum(axis=1)
    return np.minimum(tokens, probs.shape[1] - 1).astype(np.int64)


# -- decoding loop -----------------------------------------------------------------------


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run.

    Attributes
    ----------
    verifier : str
        A name of :func:`specdec_np.registry.names`: the method of the sampled requests
        (the temperature-0 verifier makes every request greedy), or of
        :func:`specdec_np.registry.relaxed_names`.
    drafter : str
        One of :data:`DRAFTERS`.
    k : int
        The most draft tokens per request and step.
    batch : int
        Number of requests decoded together; request ``b`` samples with
        ``SAMPLING_CYCLE[b % len(SAMPLING_CYCLE)]``.
    tokens : int
        Tokens to generate per request (a request may overshoot by up to ``k``).
    seed : int
        Seeds the draft sampling and the verifier's uniforms.
    vocab_size : int
        Words in the vocabulary (before ``<unk>`` and ``<eos>``).
    prompt_length : int
        Tokens of each prompt (the start of a corpus document); at least 2, the target's
        context.
    method_parameters : dict
        The verifier's keyword parameters (a relaxed method's, say).
    report_bias : bool
        Measure each step's bias (``report_bias=True``), accumulated in the engine's
        metrics (``mean_total_variation``).
    """

    verifier: str = "rejection"
    drafter: str = DRAFTERS[0]
    k: int = 4
    batch: int = 8
    tokens: int = 300
    seed: int = 0
    vocab_size: int = 4000
    prompt_length: int = 8
    method_parameters: dict[str, Any] = field(default_factory=dict)
    report_bias: bool = False

    def __post_init__(self) -> None:
        known = registry.names() + registry.relaxed_names()
        if self.verifier not in known:
            raise ValueError(f"verifier must be one of {known}; found {self.verifier!r}")
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {DRAFTERS}; found {self.drafter!r}")
        for name, minimum in (("k", 1), ("batch", 1), ("tokens", 1), ("prompt_length", 2)):
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be at least {minimum}; found {getattr(self, name)}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2; found {self.vocab_size}")

    def sampling(self) -> list[Sampling]:
        """The sampling parameters of every request, ``[batch]``."""
        if self.verifier == _ARGMAX_DECODING:
            return [Sampling(0.0)] * self.batch
        return [SAMPLING_CYCLE[b % len(SAMPLING_CYCLE)] for b in range(self.batch)]


@dataclass
class DemoResult:
    """What a demo run produced and measured.

    Attributes
    ----------
    config : DemoConfig
    sampling : list of Sampling
        Per request.
    prompts, continuations : list of list of str
        Per request, the prompt words and the generated words.
    token_ids : list of int64 ndarray
        Per request, the prompt and generated token ids.
    engine : EngineVerifier
        The verifier, with its running metrics.
    target_calls : int
        Batched target forward passes (one per decoding step).
    verifier_seconds : list of float
        Wall time of each verifier call.
    corpus_tokens, corpus_documents, corpus_modules, vocab_size : int
    target_name, drafter_name : str
    build_seconds, decode_seconds : float
    """

    config: DemoConfig
    sampling: list[Sampling]
    engine: EngineVerifier
    prompts: list[list[str]] = field(default_factory=list)
    continuations: list[list[str]] = field(default_factory=list)
    token_ids: list[np.ndarray] = field(default_factory=list)
    target_calls: int = 0
    verifier_seconds: list[float] = field(default_factory=list)
    corpus_tokens: int = 0
    corpus_documents: int = 0
    corpus_modules: int = 0
    vocab_size: int = 0
    target_name: str = ""
    drafter_name: str = ""
    build_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def metrics(self) -> VerificationMetrics:
        """The engine's running metrics (one request-step per verified request)."""
        return self.engine.metrics

    @property
    def verifier_ms_per_call(self) -> float:
        """Mean verifier wall time per call, in milliseconds."""
        if not self.verifier_seconds:
            return math.nan
        return 1e3 * float(np.mean(self.verifier_seconds))

    def summary(self) -> dict[str, Any]:
        """The measurements as a JSON-ready dict (text excluded)."""
        m = self.metrics
        verifier_ms = 1e3 * np.asarray(self.verifier_seconds)
        with_drafts = int(m.drafted_at[0]) if m.drafted_at.size else 0
        return {
            "verifier": self.config.verifier,
            "drafter": self.config.drafter,
            "k": self.config.k,
            "batch": self.config.batch,
            "tokens_per_sequence": self.config.tokens,
            "seed": self.config.seed,
            "target": self.target_name,
            "draft": self.drafter_name,
            "sampling": [
                {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p}
                for s in self.sampling
            ],
            "greedy_requests": sum(s.greedy for s in self.sampling),
            "vocab_size": self.vocab_size,
            "corpus_tokens": self.corpus_tokens,
            "corpus_documents": self.corpus_documents,
            "corpus_modules": self.corpus_modules,
            "target_calls": self.target_calls,
            "verified_requests": m.requests,
            "requests_without_drafts": m.requests - with_drafts,
            "drafted_tokens": m.drafted,
            "accepted_tokens": m.accepted,
            "generated_tokens": m.emitted,
            "acceptance_rate": m.acceptance_rate,
            "mean_tokens_per_request_step": m.mean_accepted_length,
            "acceptance_by_position": [float(x) for x in m.acceptance_by_position],
            "accepted_at": [int(x) for x in m.accepted_at],
            "drafted_at": [int(x) for x in m.drafted_at],
            "verifier_ms_per_call": self.verifier_ms_per_call,
            "verifier_ms_median": float(np.median(verifier_ms)) if verifier_ms.size else math.nan,
            "build_seconds": self.build_seconds,
            "decode_seconds": self.decode_seconds,
        }


def _choose_prompts(corpus: Corpus, batch: int, length: int) -> list[np.ndarray]:
    """Starts of ``batch`` documents spread evenly over the corpus (long enough ones)."""
    long_enough = [doc for doc in corpus.documents if len(doc) >= length]
    if not long_enough:
        raise RuntimeError(f"no corpus document has {length} tokens")
    picks = np.linspace(0, len(long_enough) - 1, num=batch).round().astype(int)
    return [long_enough[i][:length] for i in picks]


def _ngram_drafts(
    draft: InterpolatedNGram,
    window: np.ndarray,
    k: int,
    sampling: Sequence[Sampling],
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """``k`` drafts per request from the draft model, each drawn from its processed law:
    ids int64 [b, k] and the draft's logits float32 [b, k, V] they were drawn from."""
    b = window.shape[0]
    ids = np.empty((b, k), dtype=np.int64)
    logits = np.empty((b, k, draft.vocab_size), dtype=np.float32)
    last = window[:, -draft.context_length :]
    for i in range(k):
        logits[:, i] = draft.log_probs(last)
        ids[:, i] = _draw(logits[:, i], sampling, rng)
        last = np.concatenate([last[:, 1:], ids[:, i : i + 1]], axis=1)
    return ids, logits


def run_demo(
    config: DemoConfig | None = None,
    progress: Callable[[int, int, VerificationMetrics], None] | None = None,
) -> DemoResult:
    """Run a speculative-decoding session with the n-gram target and a drafter.

    Each step, every unfinished request proposes ``k_b`` drafts (prompt lookup: 0 to
    ``k``; the n-gram drafter: ``k``, drawn from its processed law), the target scores the
    ``k_b + 1`` positions of every request in one batched call, and
    :class:`~specdec_np.EngineVerifier` verifies the flat batch from the target's logits
    with each request's temperature, top-k and top-p, drawing the bonus token itself.  A
    request leaves the batch once it has ``config.tokens`` new tokens.

    Parameters
    ----------
    config : DemoConfig, optional
        Defaults to ``DemoConfig()``.
    progress : callable, optional
        Called as ``progress(done, total, metrics)`` after each step with the generated
        token count (capped per request), its goal and the engine's running metrics.

    Returns
    -------
    DemoResult
    """
    config = config or DemoConfig()
    start = time.perf_counter()
    corpus = build_corpus(config.vocab_size)
    target, draft = build_models(corpus)
    build_seconds = time.perf_counter() - start

    draft_seed, verifier_seed = np.random.SeedSequence(config.seed).spawn(2)
    rng = np.random.default_rng(draft_seed)
    engine = EngineVerifier(
        config.verifier, seed=int(verifier_seed.generate_state(1, np.uint64)[0]),
        **config.method_parameters,
    )
    lookup = config.drafter == "prompt-lookup"
    sampling = config.sampling()
    temperature = np.array([s.temperature for s in sampling])
    top_k = np.array([s.top_k for s in sampling], dtype=np.int64)
    top_p = np.array([s.top_p for s in sampling])
    k, B, N = config.k, config.batch, config.tokens
    context = target.context_length

    prompts = _choose_prompts(corpus, B, config.prompt_length)
    P = config.prompt_length
    sequences = np.zeros((B, P + N + k + 1), dtype=np.int64)
    sequences[:, :P] = np.stack(prompts)
    lengths = np.full(B, P, dtype=np.int64)
    result = DemoResult(
        config=config,
        sampling=sampling,
        engine=engine,
        corpus_tokens=int(corpus.stream.size - len(corpus.documents) - 1),
        corpus_documents=len(corpus.documents),
        corpus_modules=len(corpus.modules),
        vocab_size=corpus.vocab_size,
        target_name=target.name,
        drafter_name=(
            "prompt lookup: what followed the latest earlier match of the request's last "
            "3 (else 2) tokens"
            if lookup
            else f"{draft.name}, sampled with each request's parameters"
        ),
        build_seconds=build_seconds,
    )
    positions = np.arange(k + 1)

    decode_start = time.perf_counter()
    while True:
        rows = np.flatnonzero(lengths - P < N)
        if rows.size == 0:
            break
        b = rows.size
        window = sequences[rows[:, None], lengths[rows, None] - context + np.arange(context)]
        draft_logits = None
        if lookup:
            proposals = [prompt_lookup(sequences[r, : lengths[r]], k) for r in rows]
            counts = np.array([p.shape[0] for p in proposals], dtype=np.int64)
            padded = np.zeros((b, k), dtype=np.int64)
            padded[positions[:k] < counts[:, None]] = np.concatenate(proposals)
        else:
            padded, logits = _ngram_drafts(draft, window, k, [sampling[r] for r in rows], rng)
            counts = np.full(b, k, dtype=np.int64)
        drafted = positions[:k] < counts[:, None]
        if not lookup:
            draft_logits = logits[drafted]

        # Request by request, its k_b draft positions then its bonus position.
        tokens = np.concatenate([window, padded], axis=1)
        histories = np.stack([tokens[:, j : j + context] for j in range(k + 1)], axis=1)
        target_logits = target.log_probs(histories[positions <= counts[:, None]])

        verifier_start = time.perf_counter()
        verified = engine(
            num_draft_tokens=counts,
            draft_token_ids=padded[drafted],
            target_logits=target_logits,
            draft_logits=draft_logits,
            temperature=temperature[rows],
            top_k=top_k[rows],
            top_p=top_p[rows],
            report_bias=config.report_bias,
        )
        result.verifier_seconds.append(time.perf_counter() - verifier_start)

        output = verified.output_token_ids
        keep = output >= 0
        row_index, column = np.nonzero(keep)
        sequences[rows[row_index], lengths[rows][row_index] + column] = output[keep]
        lengths[rows] += keep.sum(axis=1)
        result.target_calls += 1
        if progress is not None:
            progress(int(np.minimum(lengths - P, N).sum()), B * N, engine.metrics)
    result.decode_seconds = time.perf_counter() - decode_start

    words = corpus.words
    for row in range(B):
        result.token_ids.append(sequences[row, : lengths[row]].copy())
        result.prompts.append([words[t] for t in sequences[row, :P]])
        result.continuations.append([words[t] for t in sequences[row, P : lengths[row]]])
    return result


def format_text(result: DemoResult, samples: int = 3, width: int = 88) -> list[str]:
    """The first ``samples`` generated texts, wrapped, as lines."""
    lines: list[str] = []
    for row in range(min(samples, len(result.prompts))):
        prompt = detokenize(result.prompts[row])
        continuation = detokenize(result.continuations[row])
        lines.append(f"[{row}] ({result.sampling[row].describe()}) prompt: {prompt}")
        lines.extend(
            textwrap.wrap(
                continuation, width=width, initial_indent="    ", subsequent_indent="    "
            )
        )
        lines.append("")
    return lines
