"""The whole sampling surface of a draft position: context, penalties, masks, stops, logprobs.

Production requests carry settings that depend on the text before a row, which inside a
draft chain or tree includes the drafts before that position (``docs/semantics.md``, "The
whole sampling surface").  This module checks them (:func:`checked_surface`), applies the
row settings to the rows a call reads (:meth:`SurfacePlan.adjusted_batch`: masks and bias,
then penalties, in the rows' dtype), and after the kernel cuts each emitted run at its
first stop token or its budget and adds the logprobs (:meth:`SurfacePlan.finish`).  The
order is vLLM v1's: masks and bias, penalties, temperature and filters.

The row settings reach the rows one of two ways, with the same bits:

* in the kernel (the chain and tree kernels of both backends, and the CPU law of
  ``processed_probs`` and ``sample_tokens``; :mod:`specdec_np._layouts.row_adjustments`):
  only the entries the settings touch are computed on the host, from the rows' own values
  at those entries (gathered on the device for CuPy rows), as a bitmask of the allowed
  tokens and per row a sparse list of final values; the kernel applies them to a row in a
  working row (a CPU thread's, a CUDA request's) when it is about to read it, and runs its
  law there.  Nothing of ``[rows, V]`` is copied;
* on copies (:func:`adjust_rows`: relaxed methods, strict mode, ``report_bias``, and
  ``processed_probs`` and ``sample_tokens``'s probabilities on CuPy rows): the rows of the
  requests with a setting are copied with the settings applied, and the kernels run their
  unchanged law on the copies; nothing is copied when no request has a setting.

A call with none of these settings never enters this module
(:meth:`SamplingParameters.surface_on` is False).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from .._kernels import dispatch as _dispatch
from .._runtime import arrays as _backend
from . import row_adjustments as _row_adjustments
from . import sampling as _sampling

__all__ = [
    "RowContexts",
    "Surface",
    "SurfacePlan",
    "adjust_rows",
    "checked_surface",
    "adjusted_rows_of",
    "cut_runs",
    "law_rows",
    "plan_for",
]

#: Settings that change a row (the others cut the run or report logprobs).
ROW_SETTINGS = (
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "allowed_token_ids",
    "bad_words_token_ids",
    "min_tokens",
    "token_bitmask",
)


class Surface(NamedTuple):
    """The checked settings of a call's requests (host arrays; None = off everywhere).

    Attributes
    ----------
    prompts, outputs : list of int64 arrays (or None) per request
        ``prompt_token_ids`` and ``output_token_ids``: the context before this step.
    repetition, frequency, presence : float64 [B]
        1, 0 and 0 are off.
    bias : list of (int64 ids, float64 values) or None per request
    allowed : list of int64 arrays or None per request
    bad_words : list of lists of int64 arrays, or None, per request
    min_tokens : int64 [B]
    stops : list of int64 arrays or None per request
    max_tokens : int64 [B] or None
    bitmask : int32 [rows, ceil(V / 32)] or None, on the rows' backend
    logprobs : int or None
    """

    prompts: list[Any]
    outputs: list[Any]
    repetition: np.ndarray
    frequency: np.ndarray
    presence: np.ndarray
    bias: list[Any]
    allowed: list[Any]
    bad_words: list[Any]
    min_tokens: np.ndarray
    stops: list[Any]
    max_tokens: Any
    bitmask: Any
    logprobs: int | None

    def request_adjusts(self, b: int) -> bool:
        """Whether request ``b`` has a setting that changes its rows (the bitmask aside)."""
        return bool(
            self.repetition[b] != 1.0
            or self.frequency[b] != 0.0
            or self.presence[b] != 0.0
            or self.bias[b] is not None
            or self.allowed[b] is not None
            or self.bad_words[b] is not None
            or (self.min_tokens[b] > 0 and self.stops[b] is not None)
        )

    @property
    def needs_logits(self) -> str | None:
        """The first setting given that only logits can carry, or None."""
        batch = range(len(self.prompts))
        for name, on in (
            ("repetition_penalty", any(self.repetition[b] != 1.0 for b in batch)),
            ("frequency_penalty", any(self.frequency[b] != 0.0 for b in batch)),
            ("presence_penalty", any(self.presence[b] != 0.0 for b in batch)),
            ("logit_bias", any(entry is not None for entry in self.bias)),
            ("allowed_token_ids", any(entry is not None for entry in self.allowed)),
            ("bad_words_token_ids", any(entry is not None for entry in self.bad_words)),
            ("min_tokens", any(
                self.min_tokens[b] > 0 and self.stops[b] is not None for b in batch
            )),
            ("token_bitmask", self.bitmask is not None),
        ):
            if on:
                return name
        return None


class RowContexts(NamedTuple):
    """Which request and which drafts of this step precede each row a layout holds.

    Attributes
    ----------
    requests : int64 [R]
        The request of each target row.
    prefixes : list of int64 arrays, one per target row
        The drafts of this step before the row: drafts ``0 .. i - 1`` at chain position
        ``i``, the node's ancestors and the node itself for a tree node's row.
    draft_targets : int64 [D]
        For each draft row, the target row with the same context and mask (both predict
        the same token).
    """

    requests: np.ndarray
    prefixes: list[np.ndarray]
    draft_targets: np.ndarray


# ---- checks -----------------------------------------------------------------------------


def _per_request_numbers(
    name: str, value: Any, batch_size: int, off: float, valid: Callable[[np.ndarray], Any],
    rule: str, integer: bool = False,
) -> np.ndarray:
    """A scalar or ``[B]`` setting as float64 (or int64) ``[B]``, every entry checked."""
    dtype = np.int64 if integer else np.float64
    if value is None:
        return np.full(batch_size, off, dtype=dtype)
    host = value.get() if hasattr(value, "get") else value
    array = np.asarray(host)
    if array.dtype == object or array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a number or an array of numbers; found {value!r}")
    if integer and array.dtype.kind == "f":
        raise TypeError(f"{name} must be an integer or an integer array; found {array.dtype}")
    if array.ndim == 0:
        array = np.full(batch_size, array.item())
    if array.shape != (batch_size,):
        raise ValueError(f"{name} must be a scalar or have shape [B] = [{batch_size}]; found "
                         f"shape {list(array.shape)}")
    array = array.astype(dtype)
    bad = np.flatnonzero(~np.asarray(valid(array), dtype=bool))
    if bad.size:
        raise ValueError(f"{name} must be {rule}; found {array[bad[0]]!r} for request "
                         f"{int(bad[0])}")
    return array


def _token_sequence(name: str, value: Any, vocab_size: int, label: str) -> np.ndarray:
    """One sequence of token ids as int64, every id in ``[0, V)``."""
    host = value.get() if hasattr(value, "get") else value
    array = np.asarray(host)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold 1-D sequences of integer ids; found {value!r} "
                        f"for {label}")
    array = array.astype(np.int64)
    bad = np.flatnonzero((array < 0) | (array >= vocab_size))
    if bad.size:
        raise ValueError(f"{name} must hold ids in [0, V) = [0, {vocab_size}); found "
                         f"{int(array[bad[0]])} for {label}")
    return array


def _per_request_entries(name: str, value: Any, batch_size: int) -> list[Any]:
    """A per-request sequence: None (off for all) or one entry per request."""
    if value is None:
        return [None] * batch_size
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__"):
        raise TypeError(f"{name} must be a sequence with one entry per request; found "
                        f"{type(value).__name__}")
    if len(value) != batch_size:
        raise ValueError(f"{name} must have one entry per request (B = {batch_size}); found "
                         f"{len(value)}")
    return list(value)


def _sequences(name: str, value: Any, batch_size: int, vocab_size: int) -> list[Any]:
    return [
        None if entry is None else _token_sequence(name, entry, vocab_size, f"request {b}")
        for b, entry in enumerate(_per_request_entries(name, value, batch_size))
    ]


def _bias(value: Any, batch_size: int, vocab_size: int) -> list[Any]:
    checked: list[Any] = []
    for b, entry in enumerate(_per_request_entries("logit_bias", value, batch_size)):
        if entry is None or not len(entry):
            checked.append(None)
            continue
        if not isinstance(entry, Mapping):
            raise TypeError(f"logit_bias must hold one mapping (token -> bias) per request; "
                            f"found {type(entry).__name__} for request {b}")
        ids = _token_sequence("logit_bias", np.asarray(list(entry.keys())), vocab_size,
                              f"request {b}")
        values = np.asarray([float(bias) for bias in entry.values()], dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(f"logit_bias must be finite; found {values[bad[0]]!r} for token "
                             f"{int(ids[bad[0]])} of request {b}")
        checked.append((ids, values))
    return checked


def _bad_words(value: Any, batch_size: int, vocab_size: int) -> list[Any]:
    checked: list[Any] = []
    for b, entry in enumerate(_per_request_entries("bad_words_token_ids", value, batch_size)):
        if entry is None or not len(entry):
            checked.append(None)
            continue
        words = []
        for index, word in enumerate(entry):
            label = f"word {index} of request {b}"
            if word is None or not len(word):
                raise ValueError(f"bad_words_token_ids must not hold an empty word; found "
                                 f"one as {label}")
            words.append(_token_sequence("bad_words_token_ids", word, vocab_size, label))
        checked.append(words)
    return checked


def _bitmask(value: Any, rows: int, vocab_size: int, xp: Any) -> Any:
    if value is None:
        return None
    if not hasattr(value, "dtype") or not hasattr(value, "shape"):
        value = np.asarray(value)
    words = -(-vocab_size // 32)
    if np.dtype(value.dtype) != np.int32:
        raise TypeError(f"token_bitmask must be an int32 array (xgrammar's layout); found "
                        f"{value.dtype}")
    if tuple(value.shape) != (rows, words):
        raise ValueError(f"token_bitmask must have shape [rows, ceil(V / 32)] = [{rows}, "
                         f"{words}]; found shape {list(value.shape)}")
    return xp.asarray(value)


def checked_surface(
    parameters: _sampling.SamplingParameters,
    batch_size: int,
    vocab_size: int,
    target_rows: int,
    xp: Any,
) -> Surface:
    """The surface settings of ``parameters``, checked, each error naming its setting.

    Parameters
    ----------
    parameters : SamplingParameters
    batch_size, vocab_size : int
    target_rows : int
        The number of target rows (the bitmask has one mask per target row).
    xp : module
        The rows' array library (the bitmask is kept on it).

    Returns
    -------
    Surface
    """
    prompts = _sequences("prompt_token_ids", parameters.prompt_token_ids, batch_size,
                         vocab_size)
    outputs = _sequences("output_token_ids", parameters.output_token_ids, batch_size,
                         vocab_size)
    repetition = _per_request_numbers(
        "repetition_penalty", parameters.repetition_penalty, batch_size, 1.0,
        lambda a: np.isfinite(a) & (a > 0), "finite and > 0",
    )
    frequency, presence = (
        _per_request_numbers(name, getattr(parameters, name), batch_size, 0.0,
                             lambda a: np.isfinite(a) & (np.abs(a) <= 2), "finite, in [-2, 2]")
        for name in ("frequency_penalty", "presence_penalty")
    )
    min_tokens = _per_request_numbers(
        "min_tokens", parameters.min_tokens, batch_size, 0, lambda a: a >= 0, ">= 0",
        integer=True,
    )
    max_tokens = None
    if parameters.max_tokens is not None:
        max_tokens = _per_request_numbers(
            "max_tokens", parameters.max_tokens, batch_size, 0, lambda a: a >= 1,
            ">= 1 (the request's remaining budget)", integer=True,
        )
    logprobs = parameters.logprobs
    if logprobs is not None:
        if isinstance(logprobs, bool) or not isinstance(logprobs, (int, np.integer)):
            raise TypeError(f"logprobs must be an int or None; found {logprobs!r}")
        if logprobs < 0:
            raise ValueError(f"logprobs must be >= 0; found {logprobs}")
        logprobs = int(logprobs)
    return Surface(
        prompts=prompts,
        outputs=outputs,
        repetition=repetition,
        frequency=frequency,
        presence=presence,
        bias=_bias(parameters.logit_bias, batch_size, vocab_size),
        allowed=_sequences("allowed_token_ids", parameters.allowed_token_ids, batch_size,
                           vocab_size),
        bad_words=_bad_words(parameters.bad_words_token_ids, batch_size, vocab_size),
        min_tokens=min_tokens,
        stops=_sequences("stop_token_ids", parameters.stop_token_ids, batch_size, vocab_size),
        max_tokens=max_tokens,
        bitmask=_bitmask(parameters.token_bitmask, target_rows, vocab_size, xp),
        logprobs=logprobs,
    )


# ---- the rows ---------------------------------------------------------------------------


def adjust_rows(
    rows: Any,
    row_indices: np.ndarray,
    context_rows: np.ndarray,
    contexts: RowContexts,
    surface: Surface,
    xp: Any,
) -> Any:
    """A copy of ``rows`` with the settings applied to the rows ``row_indices``: masks and
    bias, then penalties, each in the rows' dtype (``docs/semantics.md``).

    The rows of one request are adjusted together: its bias, its allowed ids and its
    penalties over the columns its context touches (the output's and prompt's tokens and
    the drafts), one gather and one scatter each; only the bad words and the minimum
    length, which depend on each row's own context, are applied row by row.

    Parameters
    ----------
    rows : float32 or float64 [R, V]
        Logits (not written).
    row_indices : int64 [n]
        The rows to adjust.
    context_rows : int64 [n]
        For each, the target row whose context and mask it takes.
    contexts : RowContexts
    surface : Surface
    xp : module

    Returns
    -------
    array [R, V]
        A new array; the rows not listed are copied as they are.
    """
    dtype = rows.dtype
    vocab_size = int(rows.shape[1])
    minus_infinity = dtype.type(-np.inf)
    if surface.bitmask is not None and row_indices.size:
        allowed = _row_adjustments.bitmask_allowed(
            surface.bitmask, xp.asarray(context_rows), vocab_size, xp
        )
        if row_indices.size == rows.shape[0] and np.array_equal(
            row_indices, np.arange(row_indices.size)
        ):
            # Every row in order (the common case): the masked copy in one pass.
            adjusted = xp.where(allowed, rows, minus_infinity)
        else:
            adjusted = xp.array(rows, copy=True)
            block = adjusted[xp.asarray(row_indices)]
            adjusted[xp.asarray(row_indices)] = xp.where(allowed, block, minus_infinity)
    else:
        adjusted = xp.array(rows, copy=True)
    owners = contexts.requests[context_rows] if row_indices.size else row_indices
    for b in np.unique(owners).tolist():
        if not surface.request_adjusts(b):
            continue
        chosen = owners == b
        _adjust_request(
            adjusted, row_indices[chosen], context_rows[chosen], contexts, surface, b,
            _RequestTables(surface, b, vocab_size, xp), xp,
        )
    return adjusted


def _adjust_request(
    adjusted: Any,
    row_indices: np.ndarray,
    context_rows: np.ndarray,
    contexts: RowContexts,
    surface: Surface,
    b: int,
    tables: _RequestTables,
    xp: Any,
) -> None:
    """Request ``b``'s rows of ``adjusted``, in place: bias, allowed ids, bad words and
    the minimum length, then the repetition, frequency and presence penalties."""
    dtype = adjusted.dtype
    minus_infinity = dtype.type(-np.inf)
    rows = xp.asarray(row_indices)[:, None]
    # Masks and bias (a mask makes -inf, which a finite bias leaves -inf).
    if surface.bias[b] is not None:
        ids, bias = surface.bias[b]
        adjusted[rows, xp.asarray(ids)[None, :]] += xp.asarray(bias.astype(dtype))[None, :]
    if tables.disallowed is not None:
        adjusted[rows, tables.disallowed[None, :]] = minus_infinity
    output = surface.outputs[b]
    prefixes = [contexts.prefixes[source] for source in context_rows.tolist()]
    if surface.bad_words[b] is not None or tables.non_stops is not None:
        for row, prefix in zip(row_indices.tolist(), prefixes):
            context = prefix if output is None else np.concatenate([output, prefix])
            values = adjusted[row]
            for word in surface.bad_words[b] or ():
                head = word[:-1]
                if head.size <= context.size and np.array_equal(
                    context[context.size - head.size:], head
                ):
                    values[int(word[-1])] = minus_infinity
            if tables.non_stops is not None and context.size < surface.min_tokens[b]:
                # vLLM's rule: the stops stay possible when nothing else is.
                if bool(xp.any(values[tables.non_stops] > minus_infinity)):
                    values[tables.stops] = minus_infinity
    repetition = surface.repetition[b] != 1.0
    frequency = surface.frequency[b] != 0.0 or surface.presence[b] != 0.0
    if not (repetition or frequency):
        return
    # The columns any row's context touches, and each row's count of each: the output's
    # counts (shared) plus the drafts before the row.
    drafted = np.concatenate(prefixes) if prefixes else np.zeros(0, dtype=np.int64)
    prompt = tables.prompt_array if repetition else np.zeros(0, dtype=np.int64)
    columns = np.unique(np.concatenate([tables.output_tokens, prompt, drafted]))
    if not columns.size:
        return
    counts = np.zeros((row_indices.size, columns.size), dtype=np.int64)
    counts[:, np.searchsorted(columns, tables.output_tokens)] = tables.output_times
    for i, prefix in enumerate(prefixes):
        np.add.at(counts[i], np.searchsorted(columns, prefix), 1)
    device_columns = xp.asarray(columns)[None, :]
    values = adjusted[rows, device_columns]
    if repetition:
        seen = xp.asarray((counts > 0) | np.isin(columns, prompt)[None, :])
        penalty = dtype.type(surface.repetition[b])
        values = xp.where(seen, xp.where(values > 0, values / penalty, values * penalty), values)
    if frequency and counts.any():
        # Subtracting 0 where a token has no count leaves every value as it is.
        term = surface.frequency[b] * counts + surface.presence[b] * (counts > 0)
        values = values - xp.asarray(term.astype(dtype))
    adjusted[rows, device_columns] = values


def law_rows(rows: Any, table: Any, out: Any = None, adjustments: Any = None) -> Any:
    """The processed law of logits rows under a sampling table (one row per row), written
    by the kernels' own law functions: the law the verifiers draw from, bit for bit.

    ``adjustments`` (NumPy rows only): the rows' settings as
    :class:`~specdec_np._layouts.row_adjustments.RowAdjustments`, applied by the kernel to
    each row it reads (the rows are not copied)."""
    xp = _backend.array_namespace(rows)
    if out is None:
        out = xp.empty(rows.shape, dtype=rows.dtype)
    num_rows, vocab_size = (int(n) for n in rows.shape)
    threads = _backend.thread_count(num_rows, vocab_size)
    device = _backend.device_of(rows)
    if device is None:
        # Threads inside a row when the loop over rows runs on one (the CUDA kernel has a
        # block per row and takes no such option).
        row_threads = _backend.row_thread_count(threads, vocab_size)
        _dispatch.kernels_for(device).processed_rows(
            rows, table, out, threads, row_threads=row_threads,
            adjustments=None if adjustments is None else adjustments.kernel_arguments(),
        )
    else:
        _dispatch.kernels_for(device).processed_rows(rows, table, out, threads)
    return out


class _RequestTables:
    """What every row of one request shares: the output's token counts, the prompt's
    tokens, the disallowed ids and the stop and non-stop ids (computed once a call)."""

    def __init__(self, surface: Surface, b: int, vocab_size: int, xp: Any) -> None:
        output = surface.outputs[b]
        empty = np.zeros(0, dtype=np.int64)
        self.output_tokens, self.output_times = empty, empty
        if output is not None:
            self.output_tokens, self.output_times = np.unique(output, return_counts=True)
        prompt = surface.prompts[b]
        self.prompt_array = empty if prompt is None else np.unique(prompt)
        self.disallowed = None
        if surface.allowed[b] is not None:
            keep = np.zeros(vocab_size, dtype=bool)
            keep[surface.allowed[b]] = True
            self.disallowed = xp.asarray(np.flatnonzero(~keep))
        self.stops = self.non_stops = None
        if surface.stops[b] is not None and surface.min_tokens[b] > 0:
            others = np.ones(vocab_size, dtype=bool)
            others[surface.stops[b]] = False
            self.stops = xp.asarray(surface.stops[b])
            self.non_stops = xp.asarray(np.flatnonzero(others))


# ---- stops and logprobs -----------------------------------------------------------------


def cut_runs(
    output_token_ids: Any, accepted_lengths: Any, surface: Surface, xp: Any,
    accepted_nodes: Any = None,
) -> np.ndarray:
    """Cut each emitted run at its first stop token (kept) or its budget, in place.

    Returns
    -------
    bool [B]
        ``finished``: a stop token was emitted, or exactly the budget was.
    """
    tokens = output_token_ids.get() if xp is not np else output_token_ids
    lengths = accepted_lengths.get() if xp is not np else accepted_lengths
    batch_size = int(tokens.shape[0])
    finished = np.zeros(batch_size, dtype=bool)
    for b in range(batch_size):
        run = int(lengths[b]) + 1
        emitted = run
        stops = surface.stops[b]
        if stops is not None:
            hits = np.flatnonzero(np.isin(tokens[b, :run], stops))
            if hits.size:
                emitted = int(hits[0]) + 1
                finished[b] = True
        if surface.max_tokens is not None and emitted >= surface.max_tokens[b]:
            emitted = int(surface.max_tokens[b])
            finished[b] = True
        if emitted < run:
            output_token_ids[b, emitted:] = -1
            accepted_lengths[b] = min(int(lengths[b]), emitted)
            if accepted_nodes is not None:
                accepted_nodes[b, emitted:] = -1
    return finished


class SurfacePlan:
    """The surface of one engine call: the adjusted rows before the kernel, the cut runs and
    the logprobs after it.

    Parameters
    ----------
    surface : Surface
    contexts : RowContexts
    original_target : array [R, V]
        The target rows as given (for the raw logprobs).
    from_logits : bool
    """

    def __init__(
        self, surface: Surface, contexts: RowContexts, original_target: Any, from_logits: bool
    ) -> None:
        self.surface = surface
        self.contexts = contexts
        self.original_target = original_target
        self.from_logits = from_logits
        self.target = original_target
        #: The row settings for the chain kernel to apply (target rows, draft rows:
        #: :class:`~specdec_np._layouts.row_adjustments.RowAdjustments` or None), when
        #: :meth:`adjusted_batch` left them to it; else None.
        self.adjustments: tuple[Any, Any] | None = None

    def request_contexts(self) -> list[list[int]]:
        """Each request's prompt, then its output so far, as Python ints."""
        return [
            [int(t) for part in (prompt, output) if part is not None for t in part]
            for prompt, output in zip(self.surface.prompts, self.surface.outputs)
        ]

    def adjusted_batch(self, batch: Any, in_kernel: bool = False) -> Any:
        """``batch`` with its logits rows adjusted (the same batch when nothing changes).

        With ``in_kernel`` (a chain or tree call whose kernel applies the row adjustments
        of :mod:`specdec_np._layouts.row_adjustments`),
        the rows are left as they are and :attr:`adjustments` holds the settings instead
        (:meth:`kernel_options` hands them to the kernel)."""
        surface, contexts = self.surface, self.contexts
        xp = batch.xp
        if surface.needs_logits is None:
            return batch
        every = surface.bitmask is not None
        targets = np.flatnonzero([
            every or surface.request_adjusts(int(b)) for b in contexts.requests
        ]).astype(np.int64)
        drafts = None
        if batch.draft_rows is not None and self.draft_from_logits:
            drafts = np.flatnonzero([
                every or surface.request_adjusts(int(contexts.requests[t]))
                for t in contexts.draft_targets
            ]).astype(np.int64)
        if in_kernel:
            parts = [(batch.target_rows, targets, targets)]
            if drafts is not None and drafts.size:
                parts.append((batch.draft_rows, drafts, contexts.draft_targets[drafts]))
            found = _row_adjustments.sparse_adjustments_of(parts, contexts, surface)
            self.adjustments = (
                found[0] if targets.size else None, found[1] if len(found) > 1 else None
            )
            return batch
        changes: dict[str, Any] = {}
        if targets.size:
            self.target = adjust_rows(batch.target_rows, targets, targets, contexts, surface, xp)
            changes["target_rows"] = self.target
        if drafts is not None and drafts.size:
            changes["draft_rows"] = adjust_rows(
                batch.draft_rows, drafts, contexts.draft_targets[drafts], contexts, surface, xp,
            )
        return batch._replace(**changes) if changes else batch

    def kernel_options(self, batch: Any, threads: int) -> dict[str, Any]:
        """The kernel's options for :attr:`adjustments` (empty without them): each rows
        array's adjustments and the working rows they are made in."""
        if self.adjustments is None or self.adjustments == (None, None):
            return {}
        target, draft = self.adjustments
        # A CPU thread's two adjusted rows, or a CUDA request's.
        rows = _dispatch.working_rows(batch.device, max(threads, 1), batch.batch_size)
        options: dict[str, Any] = {
            "adjusted_rows": _dispatch.scratch_rows(
                batch.xp, rows, batch.vocab_size, batch.target_rows.dtype, slot="adjusted",
            ),
        }
        if target is not None:
            options["target_adjustments"] = target.kernel_arguments()
        if draft is not None:
            options["draft_adjustments"] = draft.kernel_arguments()
        return options

    def target_rows_at(self, rows: Any, xp: Any) -> Any:
        """The adjusted target rows ``rows`` (host int64 indices), as the law read them."""
        if self.adjustments is None or self.adjustments[0] is None:
            return self.target[xp.asarray(rows)]
        return self.adjustments[0].apply(self.original_target[xp.asarray(rows)], rows)

    draft_from_logits = False

    def recorder(self, record: Callable[[Any, Any], None] | None, xp: Any) -> Any:
        """``record`` called with the cut result (counters count what was emitted)."""
        if record is None:
            return None

        def cut_then_record(result: Any, commit: Any) -> None:
            self._cut(result, xp)
            record(result, commit)

        return cut_then_record

    def _cut(self, result: Any, xp: Any) -> None:
        if getattr(result, "finished", None) is not None:
            return
        result.finished = xp.asarray(cut_runs(
            result.output_token_ids, result.accepted_lengths, self.surface, xp,
            getattr(result, "accepted_nodes", None),
        ))

    def finish(
        self, result: Any, xp: Any, greedy: np.ndarray, table: Any,
        emitted_rows: Callable[[Any], np.ndarray],
    ) -> Any:
        """The result cut at its stops and budgets, with its logprobs when asked for."""
        self._cut(result, xp)
        if self.surface.logprobs is not None:
            _add_logprobs(self, result, xp, greedy, table, emitted_rows(result))
        return result


def _add_logprobs(
    plan: SurfacePlan, result: Any, xp: Any, greedy: np.ndarray, table: Any,
    rows: np.ndarray,
) -> None:
    """``logprobs``, ``raw_logprobs``, ``top_token_ids`` and ``top_logprobs`` of the emitted
    tokens (``rows`` [B, W]: each emitted position's target row, -1 where none)."""
    tokens = result.output_token_ids
    host_tokens = tokens.get() if xp is not np else np.asarray(tokens)
    batch_size, width = host_tokens.shape
    count = plan.surface.logprobs or 0
    processed = np.full((batch_size, width), np.nan, dtype=np.float32)
    raw = np.full((batch_size, width), np.nan, dtype=np.float32)
    top_ids = np.full((batch_size, width, count), -1, dtype=np.int64)
    top_values = np.full((batch_size, width, count), np.nan, dtype=np.float32)
    where = np.argwhere((rows >= 0) & (host_tokens >= 0))
    if where.size:
        picked = rows[where[:, 0], where[:, 1]]
        picked_device = xp.asarray(picked)
        if plan.from_logits:
            requests = where[:, 0]
            host_table = table.get() if hasattr(table, "get") else np.asarray(table)
            row_table = np.array(host_table[requests], copy=True)
            # A greedy request's processed law is the softmax of its adjusted row.
            row_table[greedy[requests], :4] = (1.0, 0.0, 1.0, 0.0)
            law_rows_ = law_rows(plan.target_rows_at(picked, xp), xp.asarray(row_table))
            raw_rows = _log_softmax(plan.original_target[picked_device], xp)
        else:
            law_rows_ = plan.target[picked_device]
            raw_rows = None
        law_host = law_rows_.get() if xp is not np else np.asarray(law_rows_)
        chosen = host_tokens[where[:, 0], where[:, 1]]
        index = np.arange(chosen.size)
        with np.errstate(divide="ignore"):
            chosen_log = np.log(law_host[index, chosen].astype(np.float64))
        processed[where[:, 0], where[:, 1]] = chosen_log
        if raw_rows is None:
            raw[where[:, 0], where[:, 1]] = chosen_log
        else:
            # _log_softmax's rows are on the host already, on either backend.
            raw[where[:, 0], where[:, 1]] = raw_rows[index, chosen]
        if count:
            order = _most_likely(law_host, count)
            kept = order.shape[1]
            top_ids[where[:, 0], where[:, 1], :kept] = order
            with np.errstate(divide="ignore"):
                top_values[where[:, 0], where[:, 1], :kept] = np.log(
                    np.take_along_axis(law_host, order, axis=1).astype(np.float64)
                )
    result.logprobs = xp.asarray(processed)
    result.raw_logprobs = xp.asarray(raw)
    result.top_token_ids = xp.asarray(top_ids)
    result.top_logprobs = xp.asarray(top_values)


def _most_likely(law: np.ndarray, count: int) -> np.ndarray:
    """int64 [rows, min(count, V)]: each row's most likely tokens, ties to the lower id,
    without sorting the vocabulary (a partition, then a sort of the candidates: every
    token tied with the last one kept is a candidate)."""
    rows, vocab_size = law.shape
    count = min(count, vocab_size)
    if count >= vocab_size:
        return np.argsort(-law, axis=1, kind="stable")
    order = np.empty((rows, count), dtype=np.int64)
    last = np.partition(law, vocab_size - count, axis=1)[:, vocab_size - count]
    for row in range(rows):
        candidates = np.flatnonzero(law[row] >= last[row])
        ranked = candidates[np.argsort(-law[row, candidates], kind="stable")]
        order[row] = ranked[:count]
    return order


def _log_softmax(rows: Any, xp: Any) -> np.ndarray:
    """float64 log-softmax of logits rows on the host (NaN counts as -inf)."""
    host = rows.get() if xp is not np else np.asarray(rows)
    values = np.where(np.isnan(host), -np.inf, host.astype(np.float64))
    top = values.max(axis=1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return values - top - np.log(np.exp(values - top).sum(axis=1, keepdims=True))


def plan_for(
    parameters: _sampling.SamplingParameters,
    batch: Any,
    form: _sampling.RowForm,
    contexts: RowContexts,
) -> SurfacePlan:
    """The checked surface of an engine call and its plan.

    Raises
    ------
    TypeError, ValueError
        For a bad setting, naming it; a ValueError for a row setting with probability
        rows (penalties, bias and masks need logits).
    """
    surface = checked_surface(
        parameters, batch.batch_size, batch.vocab_size, int(batch.target_rows.shape[0]),
        batch.xp,
    )
    needs = surface.needs_logits
    if needs is not None and not form.from_logits:
        raise ValueError(f"{needs} needs logits rows: give target_logits, not target_probs")
    plan = SurfacePlan(surface, contexts, batch.target_rows, form.from_logits)
    plan.draft_from_logits = form.draft_from_logits
    return plan


def independent_contexts(num_rows: int) -> RowContexts:
    """Rows that are each their own request, with no drafts before them."""
    empty = np.zeros(0, dtype=np.int64)
    return RowContexts(np.arange(num_rows, dtype=np.int64), [empty] * num_rows,
                       np.zeros(0, dtype=np.int64))


def adjusted_rows_of(
    parameters: _sampling.SamplingParameters, rows: Any, xp: Any, in_kernel: bool = False
) -> tuple[Any, Any]:
    """Logits rows ``[N, V]``, each its own request without drafts, with the row settings
    of ``parameters``: ``(rows, adjustments)``.

    The rows are adjusted on a copy (the rows themselves when no setting is on), and
    ``adjustments`` is None; with ``in_kernel`` (NumPy float32 or float64 rows, whose law
    the CPU kernel computes) the rows are returned as they are and ``adjustments`` holds
    the settings (:class:`~specdec_np._layouts.row_adjustments.RowAdjustments`) for
    :func:`law_rows` to apply where it reads a row."""
    num_rows = int(rows.shape[0])
    surface = checked_surface(parameters, num_rows, int(rows.shape[1]), num_rows, xp)
    if surface.needs_logits is None:
        return rows, None
    indices = np.flatnonzero([
        surface.bitmask is not None or surface.request_adjusts(b) for b in range(num_rows)
    ]).astype(np.int64)
    contexts = independent_contexts(num_rows)
    if in_kernel:
        return rows, _row_adjustments.sparse_adjustments(
            rows, indices, indices, contexts, surface
        )
    return adjust_rows(rows, indices, indices, contexts, surface, xp), None
