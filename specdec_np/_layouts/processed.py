"""The processed law as a function, and the draw of a step without drafts.

:func:`processed_probs` returns the rows of exactly the law the verifiers draw from (the
same bits: it is written by the kernels' own law functions), and :func:`sample_tokens`
draws one token per row as a bonus position draws it, for the steps of an engine that
have no drafts (and, with ``return_probs=True``, each drawn token's probability under that
law: the ``q`` a drafter hands its verifier).  Both take the sampling parameters of
:func:`specdec_np.verify_ragged`; ``docs/semantics.md`` §12 defines the law.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .._runtime import arrays as _backend
from .._runtime import checks as _validate
from .._runtime import philox as _philox
from .._runtime import uniforms as _random
from . import fast_path as _fast
from . import ragged as _ragged
from . import sampling as _sampling
from . import surface as _surface
from .engine_call import RowSources, UniformSource, engine_call, new_record
from .sampling import SamplingParameters

__all__ = ["SampledTokens", "processed_probs", "sample_tokens"]


class SampledTokens(NamedTuple):
    """What :func:`sample_tokens` returns with ``return_probs=True``: a pair that unpacks as
    ``token_ids, probs = ...``.

    Attributes
    ----------
    token_ids : int64 array [N]
        Row ``i``'s token.
    probs : float64 array [N]
        The probability of row ``i``'s token under the law it was drawn from: the entry
        of :func:`processed_probs` for a logits row (1.0 for a greedy row), the entry as
        given for a probability row.

    Examples
    --------
    >>> import numpy as np
    >>> import specdec_np
    >>> logits = np.array([[0.0, 1.0, 2.0]])
    >>> token_ids, probs = specdec_np.sample_tokens(
    ...     logits=logits, uniforms=np.array([0.5]), return_probs=True)
    >>> bool(probs[0] == specdec_np.processed_probs(logits)[0, token_ids[0]])
    True
    """

    token_ids: Any
    probs: Any


@_backend.array_front()
def processed_probs(
    logits: Any,
    *,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    filter_order: str = "vllm",
    out: Any = None,
    prompt_token_ids: Any = None,
    output_token_ids: Any = None,
    repetition_penalty: Any = None,
    frequency_penalty: Any = None,
    presence_penalty: Any = None,
    logit_bias: Any = None,
    allowed_token_ids: Any = None,
    bad_words_token_ids: Any = None,
    min_tokens: Any = None,
    stop_token_ids: Any = None,
    token_bitmask: Any = None,
) -> Any:
    """The processed law of logits rows: the distribution every verifier and
    :func:`sample_tokens` draw from, bit for bit.

    Parameters
    ----------
    logits : float32 or float64 [N, V] (or [V]), array_like
        float16 and bfloat16 are taken as float32.
    temperature, top_k, top_p, min_p : scalar or array [N], optional
        As in :func:`specdec_np.verify_ragged`; None is off.  A row with temperature 0 is
        greedy: its law is the point mass at the argmax of the raw row (first index on
        ties, NaN never wins).
    filter_order : {"vllm", "llama.cpp"}
        The order of the filters: ``"vllm"`` filters ``logits / temperature``;
        ``"llama.cpp"`` runs top-k, top-p and min-p on the logits at temperature 1 and
        applies the temperature to what they keep (``docs/semantics.md`` §12).
    out : array of the result's dtype, optional
        ``[N, V]`` (``[V]`` too when there is one row), C-contiguous and writeable:
        written and returned.
    prompt_token_ids, output_token_ids, repetition_penalty, frequency_penalty, \
presence_penalty, logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens, \
stop_token_ids, token_bitmask : optional
        The row settings of :func:`specdec_np.verify_ragged`, each row its own request
        (its context is its prompt and output; ``token_bitmask`` is ``[N, ceil(V / 32)]``).
        Applied before the temperature and the filters; a greedy row's point mass is at
        the argmax of its adjusted row.

    Returns
    -------
    array [N, V] (or [V]) of the logits' kernel dtype
        Non-negative rows summing to one (within rounding); all zeros for a row with no
        finite logit.

    Raises
    ------
    TypeError, ValueError
        On bad input, naming the argument.

    Examples
    --------
    Row 0 keeps its two most likely tokens; row 1 is greedy (temperature 0), a point mass at
    its argmax:

    >>> import numpy as np
    >>> from specdec_np import processed_probs
    >>> logits = np.log(np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    >>> processed_probs(logits, top_k=np.array([2, 0]), temperature=np.array([1.0, 0.0])).round(3)
    array([[0.625, 0.375, 0.   ],
           [0.   , 0.   , 1.   ]])
    """
    _validate.check_filter_order(filter_order)
    parameters = SamplingParameters(
        temperature, top_k, top_p, min_p, filter_order, prompt_token_ids, output_token_ids,
        repetition_penalty, frequency_penalty, presence_penalty, logit_bias,
        allowed_token_ids, bad_words_token_ids, min_tokens, stop_token_ids, None,
        token_bitmask,
    )
    surface_on = parameters.surface_on()
    rows = _backend.intake(logits, "logits")
    xp = _backend.array_namespace(rows)
    single = rows.ndim == 1
    if single:
        rows = rows.reshape(1, -1)
    if rows.ndim != 2 or rows.shape[1] < 1:
        raise ValueError(
            f"logits must have shape [N, V] or [V] with V >= 1; found shape "
            f"{_validate.shape_text(logits.shape if hasattr(logits, 'shape') else rows.shape)}"
        )
    rows, _ = _backend.kernel_rows(rows, None, "logits", "", xp, False)
    batch_size, vocab_size = (int(n) for n in rows.shape)
    result = _out_rows(out, xp, rows)
    adjustments = None
    if surface_on:
        # Masks and bias, then penalties, before the temperature and the filters (applied
        # by the CPU kernel where it reads a row; on a copy of the rows on a device).
        rows, adjustments = _surface.adjusted_rows_of(parameters, rows, xp, xp is np)
    # The same per-request sampling as a verification call's, each row its own request.
    request = _sampling.request_sampling(
        xp, batch_size, vocab_size, False,
        _sampling.RowForm(True, False, "logits", "draft_probs", rows, None),
        (rows, None), every_request_greedy=False,
        rows_per_request=(_filled(batch_size, 1), _filled(batch_size, 0)),
        parameters=parameters,
    )  # fmt: skip
    greedy = request.greedy
    _surface.law_rows(rows, request.table, result, adjustments)
    if np.count_nonzero(greedy):
        chosen = xp.asarray(np.flatnonzero(greedy))
        raw = rows[chosen] if adjustments is None else adjustments.apply(rows[chosen], chosen)
        raw = xp.where(xp.isnan(raw), xp.asarray(-np.inf, dtype=raw.dtype), raw)
        result[chosen] = 0
        result[chosen, raw.argmax(axis=1)] = 1
    return result[0] if single else result


@functools.lru_cache(maxsize=64)
def _filled(batch_size: int, value: int) -> np.ndarray:
    """int64 ``[B]`` of one value, read-only (made once per size): the one row each request
    of processed_probs owns, the zero drafts of sample_tokens."""
    array = np.full(batch_size, value, dtype=np.int64)
    array.flags.writeable = False
    return array


_NO_DRAFTS = _filled(0, 0)
#: Explicit uniforms taken as they are (native float64 and float32).
_UNIFORM_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))


def _out_rows(out: Any, xp: Any, rows: Any) -> Any:
    """``out`` checked to hold the rows' law, or a new array."""
    if out is None:
        return xp.empty(rows.shape, dtype=rows.dtype)
    if isinstance(out, np.ndarray):
        _validate.refuse_array_subclass(out, "out")
    if not _backend.is_array_of(out, xp) or out.dtype != rows.dtype:
        raise TypeError(f"out must be a {rows.dtype} array of the logits' backend")
    # One row may be written through its [V] view; several rows need the whole block.
    shapes = [tuple(rows.shape)] + ([tuple(rows.shape[1:])] if rows.shape[0] == 1 else [])
    if tuple(out.shape) not in shapes or not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(
            f"out must be a writeable C-contiguous array of shape "
            f"{_validate.shape_text(rows.shape)}; found {_validate.shape_text(out.shape)}"
        )
    if xp.may_share_memory(out, rows):
        raise ValueError("out shares memory with logits")
    return out.reshape(rows.shape)


# The keywords of a sampling step that a kept launch serves (fast_path.sample_lane), and
# the defaults that every other keyword of sample_tokens must have for it to serve it
# (sample_tokens' own, read from its signature below its definition).
_LANE_KEYWORDS = frozenset(
    {"logits", "temperature", "top_k", "top_p", "min_p", "filter_order", "uniforms", "generator"}
)
_LANE_DEFAULTS: dict[str, Any] = {}
_NOT_A_KEYWORD = object()


def _lane_key(call: dict[str, Any]) -> tuple[Any, ...] | None:
    """The lane key (fast_path.lane_key) of a sample_tokens call given as its keywords, or
    None: a call with anything but NumPy logits, plain settings and the defaults above."""
    if not _LANE_KEYWORDS.issuperset(call):
        for name, value in call.items():
            if name in _LANE_KEYWORDS:
                continue
            default = _LANE_DEFAULTS.get(name, _NOT_A_KEYWORD)
            if value is not default and not (type(value) is str and value == default):
                return None
    return _fast.lane_key(
        call.get("logits"),
        (call.get("temperature"), call.get("top_k"), call.get("top_p"), call.get("min_p")),
        call.get("filter_order", "vllm"),
    )


def _sampling_lane(call: dict[str, Any]) -> Any:
    """sample_tokens' answer from the launch that a call of the same kind kept, or None (the
    front then takes its steps): asked before the front, whose conversions a NumPy call
    does not need."""
    key = _lane_key(call)
    if key is None:
        return None
    return _fast.sample_lane(key, call["logits"], call.get("generator"), call.get("uniforms"))


@_backend.array_front(
    device_from=("logits", "probs"), library_from=("logits", "probs"), lane=_sampling_lane
)
def sample_tokens(
    *,
    logits: Any = None,
    probs: Any = None,
    temperature: Any = None,
    top_k: Any = None,
    top_p: Any = None,
    min_p: Any = None,
    filter_order: str = "vllm",
    uniforms: Any = None,
    generator: Any = None,
    seeded_seqs: Mapping[int, Any] | None = None,
    counter_seeds: Mapping[int, tuple[int, int]] | None = None,
    stream: str = "verify",
    return_probs: bool = False,
    prompt_token_ids: Any = None,
    output_token_ids: Any = None,
    repetition_penalty: Any = None,
    frequency_penalty: Any = None,
    presence_penalty: Any = None,
    logit_bias: Any = None,
    allowed_token_ids: Any = None,
    bad_words_token_ids: Any = None,
    min_tokens: Any = None,
    stop_token_ids: Any = None,
    token_bitmask: Any = None,
) -> Any:
    """Draw one token per row from its processed law: the draw a bonus position makes, for
    the steps without drafts.

    The same as :func:`specdec_np.verify_ragged` with ``num_draft_tokens`` all zero and
    ``bonus_token_ids=None`` (so the same generator gives the same tokens): a sampled row
    consumes two draws of its source (the residual draw a request without drafts reserves,
    then its token), a greedy row (temperature 0) none.

    Parameters
    ----------
    logits, probs : float32 or float64 [N, V], array_like
        Exactly one: logits processed with the sampling parameters, or probabilities
        taken as processed.
    temperature, top_k, top_p, min_p : scalar or array [N], optional
        As in :func:`specdec_np.verify_ragged`.
    filter_order : {"vllm", "llama.cpp"}
        As in :func:`processed_probs`.
    uniforms : float64 or float32 [N], optional
        Explicit uniforms in ``[0, 1)`` (float32, JAX's default, is widened exactly): row
        ``i``'s token is the inverse-CDF draw at ``uniforms[i]``.
    generator : numpy.random.Generator, cupy.random.Generator or None
        Source of the uniforms of rows without a seed of their own (a fresh unseeded
        generator when None).
    seeded_seqs : dict of int to Generator, optional
        Row index -> its own generator, as in :func:`specdec_np.verify_ragged`.
    counter_seeds : dict of int to (int, int), optional
        Row index -> ``(seed, position)``: counter-based Philox uniforms, as in
        :func:`specdec_np.verify_ragged`.
    stream : {"verify", "draft"}
        The counter domain of the ``counter_seeds`` rows
        (:func:`specdec_np.counter_uniforms`): ``"verify"`` (the default) draws as a
        bonus position of :func:`specdec_np.verify_ragged` does, bit for bit; a drafter
        draws its drafts with ``"draft"``, whose Philox blocks are never those of the
        ``"verify"`` stream, so its noise never equals the noise that tests those
        drafts under the same ``(seed, position)``.
    return_probs : bool
        Also return the probability of each drawn token under the law it was drawn from
        (the ``q`` to hand the verifier).  Computed only when asked for, one law pass
        over each sampled row.
    prompt_token_ids, output_token_ids, repetition_penalty, frequency_penalty, \
presence_penalty, logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens, \
stop_token_ids, token_bitmask : optional
        The row settings of :func:`processed_probs`, each row its own request.

    Returns
    -------
    int64 array [N], or SampledTokens
        Row ``i``'s token, in the inputs' array library.  With ``return_probs=True`` the
        pair ``(token_ids, probs)``: ``probs`` float64 ``[N]`` is, for logits rows, the
        drawn token's entry of :func:`processed_probs` with the same parameters, widened
        exactly to float64 (1.0 for a greedy row), and for probability rows the drawn
        token's entry as given (the rows are taken as processed).

    Raises
    ------
    TypeError, ValueError
        On bad input, naming the argument; a ValueError for a row without positive
        probability.

    Examples
    --------
    Explicit uniforms: row ``i``'s token is the inverse-CDF draw at ``uniforms[i]``.

    >>> import numpy as np
    >>> from specdec_np import sample_tokens
    >>> probs = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    >>> sample_tokens(probs=probs, uniforms=np.array([0.6, 0.05]))
    array([1, 0])
    >>> sample_tokens(logits=np.log(probs), temperature=0.0)
    array([0, 2])

    A drafter's step: its tokens from the draft stream, with the ``q`` it sampled from.

    >>> logits = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    >>> token_ids, probs = sample_tokens(
    ...     logits=logits, temperature=np.array([0.7, 0.0]), counter_seeds={0: (7, 12)},
    ...     stream="draft", return_probs=True)
    >>> float(probs[1])  # a greedy row's token is certain
    1.0
    """
    # The front asked the lane first (_sampling_lane); a sampling step on NumPy logits with
    # plain settings that comes here keeps its launch for the next one of its kind.
    lane_key = _lane_key(locals())
    _validate.check_filter_order(filter_order)
    _philox.check_stream(stream)
    if type(return_probs) is not bool:
        raise TypeError(f"return_probs must be a bool; found {type(return_probs).__name__}")
    rows = logits if logits is not None else probs
    if (logits is None) == (probs is None):
        raise ValueError("give exactly one of logits and probs")
    rows = _backend.intake(rows, "logits" if logits is not None else "probs")
    if rows.ndim != 2:
        raise ValueError(
            f"{'logits' if logits is not None else 'probs'} must have shape [N, V]; found "
            f"shape {_validate.shape_text(rows.shape)}"
        )
    batch_size = int(rows.shape[0])
    explicit = None
    if uniforms is not None:
        host = type(rows) is np.ndarray
        if host and type(uniforms) is np.ndarray and uniforms.dtype in _UNIFORM_DTYPES:
            # What explicit_uniforms takes in as it is (float32 is widened exactly when
            # it is written into the block below).
            column = uniforms
        else:
            column = _random.explicit_uniforms(uniforms, like=rows)
        if tuple(column.shape) != (batch_size,):
            raise ValueError(
                f"uniforms must have shape [N] = [{batch_size}]; found shape "
                f"{_validate.shape_text(column.shape)}"
            )
        xp = _backend.array_namespace(rows)
        if host and type(column) is np.ndarray:
            # The same block as the stack below, without its generic steps.
            explicit = np.zeros((batch_size, 2))
            explicit[:, 1] = column
        else:
            explicit = xp.stack([xp.zeros(batch_size, dtype=xp.float64), column], axis=1)
    # A step without drafts is a ragged call whose requests all have k_b = 0: the same
    # generator gives the same tokens.  No draft ids: an empty list becomes an array of
    # the rows' library.
    drafts = _NO_DRAFTS if isinstance(rows, np.ndarray) else []
    # The records made with every field in their order (new_record: no argument binding
    # on every call).
    call = _ragged.RaggedCall("rejection", {}, _filled(batch_size, 0), drafts, None)
    call.lane_key = lane_key
    result = engine_call(
        call,
        new_record(RowSources, (rows if logits is not None else None,
                                rows if probs is not None else None, None, None)),
        new_record(SamplingParameters, (
            temperature, top_k, top_p, min_p, filter_order, prompt_token_ids,
            output_token_ids, repetition_penalty, frequency_penalty, presence_penalty,
            logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens, stop_token_ids,
            None, token_bitmask, None,
        )),
        new_record(
            UniformSource, (explicit, generator, seeded_seqs, counter_seeds, None, None, stream)
        ),
        strict_mode=False,
        out=None,
    )  # fmt: skip
    token_ids = result.output_token_ids[:, 0]
    if not return_probs:
        return token_ids
    parameters = SamplingParameters(
        temperature, top_k, top_p, min_p, filter_order, prompt_token_ids, output_token_ids,
        repetition_penalty, frequency_penalty, presence_penalty, logit_bias,
        allowed_token_ids, bad_words_token_ids, min_tokens, stop_token_ids, None,
        token_bitmask,
    )
    return SampledTokens(
        token_ids, _drawn_probs(rows, logits is not None, parameters, token_ids)
    )


_LANE_DEFAULTS.update(
    (name, parameter.default)
    for name, parameter in inspect.signature(sample_tokens).parameters.items()
    if name not in _LANE_KEYWORDS
)


#: Entries of the law computed at once for ``return_probs`` (rows per block at least one):
#: the law of the sampled rows is made block by block, never as one ``[N, V]`` array.
_LAW_BLOCK_ENTRIES = 1 << 22


def _drawn_probs(rows: Any, from_logits: bool, parameters: SamplingParameters, tokens: Any) -> Any:
    """float64 ``[N]``: each drawn token's probability under its row's law (the entry of
    :func:`processed_probs` for logits rows, the entry as given for probability rows; 1.0
    for a greedy row).

    The call that drew the tokens has checked every argument.  A logits row's law is
    written by the kernels' law function for the sampled rows only, a block of them at a
    time, exactly as :func:`processed_probs` writes it (each row's law depends on that row
    and its parameters alone).
    """
    xp = _backend.array_namespace(rows)
    rows, _ = _backend.kernel_rows(rows, None, "logits" if from_logits else "probs", "", xp,
                                   False)  # fmt: skip
    batch_size, vocab_size = (int(n) for n in rows.shape)
    _, greedy, host_table = _sampling.checked_parameters(
        batch_size, vocab_size, parameters, from_logits=from_logits,
        divides_logits=from_logits, row_dtype=rows.dtype, every_request_greedy=False,
        table=from_logits,
    )  # fmt: skip
    probs = xp.ones(batch_size, dtype=xp.float64)
    sampled = np.flatnonzero(~greedy)
    if not sampled.size:
        return probs
    if not from_logits:
        chosen = xp.asarray(sampled)
        probs[chosen] = rows[chosen, tokens[chosen]].astype(xp.float64)
        return probs
    adjustments = None
    if parameters.surface_on():
        # Masks and bias, then penalties, as processed_probs applies them.
        rows, adjustments = _surface.adjusted_rows_of(parameters, rows, xp, xp is np)
    table = xp.asarray(host_table)
    block_rows = max(1, _LAW_BLOCK_ENTRIES // vocab_size)
    every_row = sampled.size == batch_size
    for start in range(0, sampled.size, block_rows):
        if every_row:
            # Consecutive rows: views, no copy of the rows.
            stop = min(start + block_rows, batch_size)
            chosen = xp.arange(start, stop)
            law = _surface.law_rows(
                rows[start:stop], table[start:stop], None,
                None if adjustments is None else adjustments.rows(np.arange(start, stop)),
            )
        else:
            host_chosen = sampled[start : start + block_rows]
            chosen = xp.asarray(host_chosen)
            law = _surface.law_rows(
                rows[chosen], table[chosen], None,
                None if adjustments is None else adjustments.rows(host_chosen),
            )
        probs[chosen] = law[xp.arange(law.shape[0]), tokens[chosen]].astype(xp.float64)
    return probs
