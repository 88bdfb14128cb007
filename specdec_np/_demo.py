"""The end-to-end demo behind ``specdec-np demo``: two n-gram language models and a
speculative-decoding loop that uses this package's verifiers.

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
* Draft: an interpolated bigram model with absolute discounting over an add-one unigram:
  a weaker model of the same text, as a draft should be.

Both return dense float32 ``[N, V]`` distributions for ``N`` contexts at once; the sparse
counts are kept in CSR form and scattered into the dense rows with numpy indexing.
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

import specdec_np

from . import registry
from .samplers import SpecDecodeBaseSampler

__all__ = [
    "CORPUS_MODULES",
    "VERIFIERS",
    "Corpus",
    "DemoConfig",
    "DemoResult",
    "InterpolatedNGram",
    "build_corpus",
    "build_models",
    "detokenize",
    "format_text",
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


# -- decoding loop -----------------------------------------------------------------------


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run.

    Attributes
    ----------
    verifier : str
        A name of :func:`specdec_np.registry.names`.
    k : int
        Draft tokens per step.
    batch : int
        Number of sequences decoded together.
    tokens : int
        Tokens to generate per sequence (a sequence may overshoot by up to ``k``).
    seed : int
        Seeds the draft and bonus sampling and the stochastic verifiers' samplers.
    vocab_size : int
        Words in the vocabulary (before ``<unk>`` and ``<eos>``).
    prompt_length : int
        Tokens of each prompt (the start of a corpus document); at least 2, the target's
        context.
    """

    verifier: str = "rejection"
    k: int = 4
    batch: int = 8
    tokens: int = 300
    seed: int = 0
    vocab_size: int = 4000
    prompt_length: int = 8

    def __post_init__(self) -> None:
        if self.verifier not in registry.names():
            raise ValueError(
                f"verifier must be one of {registry.names()}; found {self.verifier!r}"
            )
        for name, minimum in (("k", 1), ("batch", 1), ("tokens", 1), ("prompt_length", 2)):
            if getattr(self, name) < minimum:
                raise ValueError(f"{name} must be at least {minimum}; found {getattr(self, name)}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2; found {self.vocab_size}")


@dataclass
class DemoResult:
    """What a demo run produced and measured.

    Attributes
    ----------
    config : DemoConfig
    prompts, continuations : list of list of str
        Per sequence, the prompt words and the generated words.
    sampler : SpecDecodeBaseSampler
        The verifier, with its counters.
    target_calls : int
        Batched target forward passes (one per decoding step).
    verified_rows : int
        Sequence-steps verified (the target scored ``k + 1`` positions for each).
    drafted_tokens, accepted_prefix_tokens, emitted_tokens : int
        Draft tokens proposed; those kept (the accepted prefixes); tokens appended.
    expected_acceptance : float
        Mean over drafted positions of ``sum_y min(p(y), q(y))``: the expected value of
        ``draft_acceptance_rate`` for token-wise rejection sampling, whose counter tests
        every position independently (NaN for the other verifiers, whose acceptance rule
        or count is different).
    verifier_seconds : list of float
        Wall time of each verifier call.
    corpus_tokens, corpus_documents, corpus_modules, vocab_size : int
    target_name, draft_name : str
    build_seconds, decode_seconds : float
    """

    config: DemoConfig
    prompts: list[list[str]]
    continuations: list[list[str]]
    sampler: SpecDecodeBaseSampler
    target_calls: int = 0
    verified_rows: int = 0
    drafted_tokens: int = 0
    accepted_prefix_tokens: int = 0
    emitted_tokens: int = 0
    expected_acceptance: float = math.nan
    verifier_seconds: list[float] = field(default_factory=list)
    corpus_tokens: int = 0
    corpus_documents: int = 0
    corpus_modules: int = 0
    vocab_size: int = 0
    target_name: str = ""
    draft_name: str = ""
    build_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        """Draft tokens kept (accepted prefixes) over draft tokens proposed."""
        return (
            self.accepted_prefix_tokens / self.drafted_tokens if self.drafted_tokens else math.nan
        )

    @property
    def tokens_per_target_call(self) -> float:
        """Mean tokens a sequence gains per target forward pass (``r + 1`` per step)."""
        return self.emitted_tokens / self.verified_rows if self.verified_rows else math.nan

    @property
    def verifier_ms_per_call(self) -> float:
        """Mean verifier wall time per call, in milliseconds."""
        if not self.verifier_seconds:
            return math.nan
        return 1e3 * float(np.mean(self.verifier_seconds))

    def summary(self) -> dict[str, Any]:
        """The measurements as a JSON-ready dict (text excluded)."""
        s = self.sampler
        verifier_ms = 1e3 * np.asarray(self.verifier_seconds)
        return {
            "verifier": self.config.verifier,
            "k": self.config.k,
            "batch": self.config.batch,
            "tokens_per_sequence": self.config.tokens,
            "seed": self.config.seed,
            "target": self.target_name,
            "draft": self.draft_name,
            "vocab_size": self.vocab_size,
            "corpus_tokens": self.corpus_tokens,
            "corpus_documents": self.corpus_documents,
            "corpus_modules": self.corpus_modules,
            "target_calls": self.target_calls,
            "verified_rows": self.verified_rows,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_prefix_tokens,
            "generated_tokens": self.emitted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "expected_position_acceptance": self.expected_acceptance,
            "mean_tokens_per_target_call": self.tokens_per_target_call,
            "verifier_ms_per_call": self.verifier_ms_per_call,
            "verifier_ms_median": float(np.median(verifier_ms)) if verifier_ms.size else math.nan,
            "build_seconds": self.build_seconds,
            "decode_seconds": self.decode_seconds,
            "counters": {
                "num_accepted_tokens": int(s.num_accepted_tokens),
                "num_emitted_tokens": int(s.num_emitted_tokens),
                "num_draft_tokens": int(s.num_draft_tokens),
                "draft_acceptance_rate": s.draft_acceptance_rate,
                "system_efficiency": s.system_efficiency,
                "mean_accepted_length": s.mean_accepted_length,
            },
        }


def _make_sampler(
    verifier: registry.Verifier, seed: np.random.SeedSequence
) -> SpecDecodeBaseSampler:
    """The verifier's sampler: stochastic ones seeded, deterministic ones with their
    registry defaults."""
    sampler_class = getattr(specdec_np, verifier.sampler_name)
    if verifier.stochastic:
        return sampler_class(seed=int(seed.generate_state(1, np.uint64)[0]))
    return sampler_class()


def _counts_like_token_wise_rejection(verifier: registry.Verifier) -> bool:
    """Whether ``draft_acceptance_rate`` has expectation ``sum_y min(p, q)`` per position:
    a lossless stochastic verifier that tests every position independently."""
    return verifier.stochastic and verifier.lossless and not verifier.causal_counts


def _sample_rows(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of ``probs`` [N, V] by inverse CDF (float64 running sums)."""
    cdf = np.cumsum(probs, axis=1, dtype=np.float64)
    threshold = rng.random(probs.shape[0]) * cdf[:, -1]
    tokens = (cdf <= threshold[:, None]).sum(axis=1)
    return np.minimum(tokens, probs.shape[1] - 1).astype(np.int64)


def _choose_prompts(corpus: Corpus, batch: int, length: int) -> list[np.ndarray]:
    """Starts of ``batch`` documents spread evenly over the corpus (long enough ones)."""
    long_enough = [doc for doc in corpus.documents if len(doc) >= length]
    if not long_enough:
        raise RuntimeError(f"no corpus document has {length} tokens")
    picks = np.linspace(0, len(long_enough) - 1, num=batch).round().astype(int)
    return [long_enough[i][:length] for i in picks]


def run_demo(
    config: DemoConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> DemoResult:
    """Run a speculative-decoding session with the n-gram target and draft.

    Each step: the draft samples ``k`` tokens autoregressively from its distributions
    (greedy: takes their argmax), the target scores the ``k + 1`` positions in one batched
    call, the bonus token is sampled from the target's last position (greedy: argmax),
    the verifier decides, and the emitted tokens are appended.  A sequence leaves the
    batch once it has ``config.tokens`` new tokens.

    Parameters
    ----------
    config : DemoConfig, optional
        Defaults to ``DemoConfig()``.
    progress : callable, optional
        Called as ``progress(done, total)`` after each step with the generated token count
        (capped per sequence) and its goal.

    Returns
    -------
    DemoResult
    """
    config = config or DemoConfig()
    start = time.perf_counter()
    corpus = build_corpus(config.vocab_size)
    target, draft = build_models(corpus)
    build_seconds = time.perf_counter() - start

    draft_seed, sampler_seed = np.random.SeedSequence(config.seed).spawn(2)
    rng = np.random.default_rng(draft_seed)
    verifier = registry.get(config.verifier)
    sampler = _make_sampler(verifier, sampler_seed)
    greedy = verifier.name == _ARGMAX_DECODING
    with_overlap = _counts_like_token_wise_rejection(verifier)
    k, B, N = config.k, config.batch, config.tokens
    V = corpus.vocab_size
    context = target.context_length

    prompts = _choose_prompts(corpus, B, config.prompt_length)
    P = config.prompt_length
    sequences = np.zeros((B, P + N + k + 1), dtype=np.int64)
    sequences[:, :P] = np.stack(prompts)
    lengths = np.full(B, P, dtype=np.int64)
    result = DemoResult(
        config=config,
        prompts=[],
        continuations=[],
        sampler=sampler,
        corpus_tokens=int(corpus.stream.size - len(corpus.documents) - 1),
        corpus_documents=len(corpus.documents),
        corpus_modules=len(corpus.modules),
        vocab_size=V,
        target_name=target.name,
        draft_name=draft.name,
        build_seconds=build_seconds,
    )
    overlap_sum = 0.0
    positions = np.arange(k + 1)

    decode_start = time.perf_counter()
    while True:
        rows = np.flatnonzero(lengths - P < N)
        if rows.size == 0:
            break
        b = rows.size
        # The last `context` tokens of each active sequence, then the k drafts.
        window = sequences[rows[:, None], lengths[rows, None] - context + np.arange(context)]
        draft_ids = np.empty((b, k), dtype=np.int64)
        draft_probs = np.empty((b, k, V), dtype=np.float32)
        last = window[:, -draft.context_length :]
        for i in range(k):
            q = draft.probs(last)
            draft_probs[:, i] = q
            draft_ids[:, i] = q.argmax(axis=1) if greedy else _sample_rows(q, rng)
            last = np.concatenate([last[:, 1:], draft_ids[:, i : i + 1]], axis=1)

        tokens = np.concatenate([window, draft_ids], axis=1)
        histories = np.stack([tokens[:, j : j + context] for j in range(k + 1)], axis=1)
        target_probs = target.probs(histories.reshape(-1, context)).reshape(b, k + 1, V)
        bonus = (
            target_probs[:, k].argmax(axis=1) if greedy else _sample_rows(target_probs[:, k], rng)
        )
        if with_overlap:
            overlap = np.minimum(target_probs[:, :k], draft_probs).sum(axis=2, dtype=np.float64)
            overlap_sum += float(overlap.sum())

        verifier_start = time.perf_counter()
        output = sampler(
            target_probs,
            bonus[:, None].astype(np.int64),
            None if greedy else draft_probs,
            draft_ids,
        )
        result.verifier_seconds.append(time.perf_counter() - verifier_start)

        keep = output >= 0
        emitted = keep.sum(axis=1)
        row_index, column = np.nonzero(keep)
        sequences[rows[row_index], lengths[rows][row_index] + positions[column]] = output[keep]
        lengths[rows] += emitted

        result.target_calls += 1
        result.verified_rows += b
        result.drafted_tokens += b * k
        result.accepted_prefix_tokens += int(emitted.sum()) - b
        result.emitted_tokens += int(emitted.sum())
        if progress is not None:
            progress(int(np.minimum(lengths - P, N).sum()), B * N)
    result.decode_seconds = time.perf_counter() - decode_start
    if with_overlap and result.drafted_tokens:
        result.expected_acceptance = overlap_sum / result.drafted_tokens

    words = corpus.words
    for row in range(B):
        result.prompts.append([words[t] for t in sequences[row, :P]])
        result.continuations.append([words[t] for t in sequences[row, P : lengths[row]]])
    return result


def format_text(result: DemoResult, samples: int = 3, width: int = 88) -> list[str]:
    """The first ``samples`` generated texts, wrapped, as lines."""
    lines: list[str] = []
    for row in range(min(samples, len(result.prompts))):
        prompt = detokenize(result.prompts[row])
        continuation = detokenize(result.continuations[row])
        lines.append(f"[{row}] prompt: {prompt}")
        lines.extend(
            textwrap.wrap(
                continuation, width=width, initial_indent="    ", subsequent_indent="    "
            )
        )
        lines.append("")
    return lines
