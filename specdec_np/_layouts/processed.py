"""The processed law as a function, and the draw of a step without drafts.

:func:`processed_probs` returns the rows of exactly the law the verifiers draw from (the
same bits: it is written by the kernels' own law functions), and :func:`sample_tokens`
draws one token per row as a bonus position draws it, for the steps of an engine that
have no drafts.  Both take the sampling parameters of :func:`specdec_np.verify_ragged`;
``docs/semantics.md`` §12 defines the law.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from .._runtime import arrays as _backend
from .._runtime import checks as _validate
from .._runtime import uniforms as _random
from . import ragged as _ragged
from . import sampling as _sampling
from . import surface as _surface
from .engine_call import RowSources, UniformSource, engine_call
from .sampling import SamplingParameters

__all__ = ["processed_probs", "sample_tokens"]


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
    if surface_on:
        # Masks and bias, then penalties, before the temperature and the filters.
        rows = _surface.adjusted_rows_of(parameters, rows, xp)
    # The same per-request sampling as a verification call's, each row its own request.
    request = _sampling.request_sampling(
        xp, batch_size, vocab_size, False,
        _sampling.RowForm(True, False, "logits", "draft_probs", rows, None),
        (rows, None), every_request_greedy=False,
        rows_per_request=(_filled(batch_size, 1), _filled(batch_size, 0)),
        parameters=parameters,
    )  # fmt: skip
    greedy = request.greedy
    _surface.law_rows(rows, request.table, result)
    if np.count_nonzero(greedy):
        chosen = xp.asarray(np.flatnonzero(greedy))
        raw = rows[chosen]
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


@_backend.array_front(device_from=("logits", "probs"), library_from=("logits", "probs"))
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
    prompt_token_ids, output_token_ids, repetition_penalty, frequency_penalty, \
presence_penalty, logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens, \
stop_token_ids, token_bitmask : optional
        The row settings of :func:`processed_probs`, each row its own request.

    Returns
    -------
    int64 array [N]
        Row ``i``'s token, in the inputs' array library.

    Raises
    ------
    TypeError, ValueError
        On bad input, naming the argument; a ValueError for a row without positive
        probability.
    """
    _validate.check_filter_order(filter_order)
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
        column = _random.explicit_uniforms(uniforms, like=rows)
        if tuple(column.shape) != (batch_size,):
            raise ValueError(
                f"uniforms must have shape [N] = [{batch_size}]; found shape "
                f"{_validate.shape_text(column.shape)}"
            )
        xp = _backend.array_namespace(rows)
        explicit = xp.stack([xp.zeros(batch_size, dtype=xp.float64), column], axis=1)
    # A step without drafts is a ragged call whose requests all have k_b = 0: the same
    # generator gives the same tokens.  No draft ids: an empty list becomes an array of
    # the rows' library.
    drafts = _NO_DRAFTS if isinstance(rows, np.ndarray) else []
    result = engine_call(
        _ragged.RaggedCall("rejection", {}, _filled(batch_size, 0), drafts, None),
        RowSources(target_logits=rows if logits is not None else None,
                   target_probs=rows if probs is not None else None),
        SamplingParameters(
            temperature, top_k, top_p, min_p, filter_order, prompt_token_ids,
            output_token_ids, repetition_penalty, frequency_penalty, presence_penalty,
            logit_bias, allowed_token_ids, bad_words_token_ids, min_tokens, stop_token_ids,
            None, token_bitmask,
        ),
        UniformSource(explicit, generator, seeded_seqs, counter_seeds),
        strict_mode=False,
        out=None,
    )  # fmt: skip
    return result.output_token_ids[:, 0]
