"""Rows and sampling parameters of the engine layouts (ragged chains and trees).

Both engine layouts take their target (and draft) rows as logits or as probabilities and
per-request sampling parameters (``docs/semantics.md`` §8).  This module says which form
was given, checks the parameters, tells the greedy requests (``temperature == 0``) from
the sampled ones, and writes the float64 ``[B, 5]`` table the kernels read with logits
rows.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .. import _core
from .._runtime import checks as _validate
from .._runtime import contract as _contract

__all__ = [
    "SURFACE_SETTINGS",
    "RequestSampling",
    "RowForm",
    "SamplingParameters",
    "check_tempered_rows",
    "checked_parameters",
    "greedy_requests",
    "kept_parameters",
    "parameters_key",
    "request_sampling",
    "row_form",
    "sampling_table",
]


class SamplingParameters(NamedTuple):
    """A call's sampling parameters, as given (checked by :func:`request_sampling`).

    The one record every front fills and the law reads: a new per-request setting is a new
    field here and a new step of the law, and nothing in between changes.

    Attributes
    ----------
    temperature, top_k, top_p, min_p : scalar, array [B] or None
        None is off (``docs/semantics.md`` §12).
    filter_order : {"vllm", "llama.cpp"}
        The order of the filters.
    prompt_token_ids, output_token_ids : sequence of B token sequences, or None
        The context before this step (``docs/semantics.md``, "The whole sampling surface").
    repetition_penalty, frequency_penalty, presence_penalty : scalar, array [B] or None
    logit_bias : sequence of B mappings (token -> bias), or None
    allowed_token_ids, stop_token_ids : sequence of B token sequences, or None
    bad_words_token_ids : sequence of B lists of token sequences, or None
    min_tokens, max_tokens : int, int array [B] or None
    token_bitmask : int32 array [rows, ceil(V / 32)] or None
    logprobs : int or None
    """

    temperature: Any = None
    top_k: Any = None
    top_p: Any = None
    min_p: Any = None
    filter_order: str = "vllm"
    prompt_token_ids: Any = None
    output_token_ids: Any = None
    repetition_penalty: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    logit_bias: Any = None
    allowed_token_ids: Any = None
    bad_words_token_ids: Any = None
    min_tokens: Any = None
    stop_token_ids: Any = None
    max_tokens: Any = None
    token_bitmask: Any = None
    logprobs: Any = None

    def filters(self) -> dict[str, Any]:
        """The per-request filter parameters by name (temperature, top-k, top-p, min-p)."""
        return {name: getattr(self, name) for name in _FILTERS}

    def surface_on(self) -> bool:
        """Whether a setting of the whole sampling surface (context, penalties, bias,
        masks, stops, logprobs) is given: only then does a call look at them."""
        # By identity, in C (arrays do not compare with None): every call asks this.
        return not all(map(operator.is_, _surface_values(self), _SURFACE_OFF))


_FILTERS = ("temperature", "top_k", "top_p", "min_p")

#: The settings of the whole sampling surface, by keyword (every front takes them).
SURFACE_SETTINGS = (
    "prompt_token_ids",
    "output_token_ids",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "allowed_token_ids",
    "bad_words_token_ids",
    "min_tokens",
    "stop_token_ids",
    "max_tokens",
    "token_bitmask",
    "logprobs",
)
_SURFACE_START = SamplingParameters._fields.index(SURFACE_SETTINGS[0])
# One slice when the settings are the record's last fields (as they are): one C step.
_surface_values = (
    operator.itemgetter(slice(_SURFACE_START, None))
    if SamplingParameters._fields[_SURFACE_START:] == SURFACE_SETTINGS
    else operator.itemgetter(*map(SamplingParameters._fields.index, SURFACE_SETTINGS))
)
_SURFACE_OFF = (None,) * len(SURFACE_SETTINGS)


class RowForm(NamedTuple):
    """Which form the rows were given in.

    Attributes
    ----------
    from_logits : bool
        The target rows are logits (the sampling filters apply to them).
    draft_from_logits : bool
        The draft rows are logits (processed with the target's parameters); False for
        draft probabilities, used as given, and for point-mass drafts.
    target_name, draft_name : str
        The arguments' names (``target_logits`` or ``target_probs``, ``draft_logits`` or
        ``draft_probs``).
    target, draft : array or None
        The arguments themselves.
    """

    from_logits: bool
    draft_from_logits: bool
    target_name: str
    draft_name: str
    target: Any
    draft: Any

    @property
    def processed(self) -> bool:
        """Whether some rows are logits: the kernels then read the sampling table."""
        return self.from_logits or self.draft_from_logits

    def kernel_options(self) -> dict[str, bool]:
        """Which rows the kernels process, when some are logits."""
        return {"target_logits": self.from_logits, "draft_logits": self.draft_from_logits}


def row_form(
    target_logits: Any, target_probs: Any, draft_logits: Any, draft_probs: Any
) -> RowForm:
    """The form of the rows: any target form with any draft form (vLLM v1 hands target
    logits with the drafter's probabilities); a ValueError unless exactly one target form
    and at most one draft form is given."""
    if (target_logits is None) == (target_probs is None):
        raise ValueError("give exactly one of target_logits and target_probs")
    if draft_logits is not None and draft_probs is not None:
        raise ValueError("give at most one of draft_logits and draft_probs")
    from_logits = target_logits is not None
    draft_from_logits = draft_logits is not None
    draft_name = "draft_logits" if draft_from_logits else "draft_probs"
    return RowForm(
        from_logits,
        draft_from_logits,
        "target_logits" if from_logits else "target_probs",
        draft_name,
        target_logits if from_logits else target_probs,
        draft_logits if draft_from_logits else draft_probs,
    )


class RequestSampling(NamedTuple):
    """The checked sampling of a batch's requests.

    Attributes
    ----------
    greedy : bool numpy array [B]
        The requests verified greedily on their raw rows.
    table : float64 array [B, 5] or None
        With logits rows, per request ``(temperature, top_k, top_p, min_p, filter order
        code)`` with the values of "off" (temperature 1, top-k 0, top-p 1, min-p 0), on the
        rows' backend; None with probability rows.
    """

    greedy: np.ndarray
    table: Any

    @property
    def all_greedy(self) -> bool:
        """Every request is greedy (and there is at least one)."""
        # A count, not a reduction: a NumPy reduction's fixed cost is a small call's.
        size = self.greedy.shape[0]
        return bool(size) and np.count_nonzero(self.greedy) == size

    def request_codes(self, greedy_code: int, code: int, xp: Any) -> Any:
        """int8 ``[B]`` kernel codes for a batch that mixes greedy and sampled requests;
        None when every request takes the same code."""
        size = self.greedy.shape[0]
        if size == 1 or np.count_nonzero(self.greedy) in (0, size):
            return None
        return xp.asarray(np.where(self.greedy, greedy_code, code).astype(np.int8))


class CheckedParameters(NamedTuple):
    """:func:`checked_parameters`: the checked parameters (those of
    :func:`specdec_np._runtime.checks.check_sampling_parameters`), the greedy requests
    and the host sampling table (None without logits rows)."""

    sampling: Mapping[str, np.ndarray | None]
    greedy: np.ndarray
    table: np.ndarray | None


#: Checked parameters given as Python numbers (the common engine call), by value
#: (:func:`parameters_key`): they do not change between calls, so a call with the same
#: numbers and shapes reuses them.
kept_parameters: dict[tuple[Any, ...], CheckedParameters] = {}
_KEPT_MAX = 256


def parameters_key(parameters: SamplingParameters, *shape: Any) -> tuple[Any, ...] | None:
    """The cache key of parameters that are all Python numbers or None, else None.

    Equal numbers check alike, with one exception: ``-0.0`` equals ``0.0`` but would keep
    its sign in the table, so it is not cached.
    """
    # The four filters and the filter order; a filter order that is not a string is
    # checked (and refused) by the general path, hashable or not.
    values = parameters[:5]
    if not _KEY_TYPES.issuperset(map(type, values)) or type(values[4]) is not str:
        return None
    if 0 in values:
        for value in values:
            if type(value) is float and value == 0.0 and math.copysign(1.0, value) < 0:
                return None
    return (values, shape)


_KEY_TYPES = frozenset({int, float, type(None), str})


def checked_parameters(
    batch_size: int,
    vocab_size: int,
    parameters: SamplingParameters,
    *,
    from_logits: bool,
    divides_logits: bool,
    row_dtype: Any,
    every_request_greedy: bool,
    table: bool,
) -> CheckedParameters:
    """The checked per-request parameters, the greedy requests and the sampling table.

    Parameters
    ----------
    batch_size, vocab_size : int
    parameters : SamplingParameters
        As given (the filter order is checked too).
    from_logits, divides_logits, row_dtype
        As :func:`specdec_np._runtime.checks.check_sampling_parameters` takes them.
    every_request_greedy : bool
        The call's method is greedy: every request is.
    table : bool
        Make the host sampling table (some rows are logits).

    Returns
    -------
    CheckedParameters
        Its arrays read-only when they come from the cache of calls with Python numbers.
    """
    key = parameters_key(
        parameters, batch_size, vocab_size, from_logits, divides_logits,
        row_dtype if isinstance(row_dtype, np.dtype) else np.dtype(row_dtype),
        every_request_greedy, table,
    )  # fmt: skip
    found = kept_parameters.get(key) if key is not None else None
    if found is not None:
        return found
    filter_order = _validate.check_filter_order(parameters.filter_order)
    if key is None:
        # [B] arrays (an engine's per-request parameters): checked and tabled in one
        # compiled pass; None (other inputs, or a refused value) leaves them to the checks
        # below, which word the error.
        itemsize = np.dtype(row_dtype).itemsize
        made = _core.sampling_arrays(
            batch_size, vocab_size, parameters.temperature, parameters.top_k,
            parameters.top_p, parameters.min_p, _contract.FILTER_ORDER_CODES[filter_order],
            from_logits, divides_logits, itemsize, every_request_greedy, table,
        ) if itemsize in (4, 8) else None  # fmt: skip
        if made is not None:
            names = ("temperature", "top_k", "top_p", "min_p")
            return CheckedParameters(dict(zip(names, made[:4])), made[4], made[5])
    sampling = _validate.check_sampling_parameters(
        batch_size, vocab_size, from_logits=from_logits, row_dtype=row_dtype,
        divides_logits=divides_logits, temperature=parameters.temperature,
        top_k=parameters.top_k, top_p=parameters.top_p, min_p=parameters.min_p,
    )  # fmt: skip
    greedy = greedy_requests(sampling, every_request_greedy, batch_size)
    host_table = sampling_table(sampling, greedy, batch_size, filter_order) if table else None
    found = CheckedParameters(sampling, greedy, host_table)
    if key is not None:
        for array in (*sampling.values(), greedy, host_table):
            if array is not None:
                array.flags.writeable = False
        if len(kept_parameters) >= _KEPT_MAX:
            kept_parameters.clear()
        kept_parameters[key] = found
    return found


def request_sampling(
    xp: Any,
    batch_size: int,
    vocab_size: int,
    strict: bool,
    form: RowForm,
    rows: tuple[Any, Any],
    *,
    every_request_greedy: bool,
    rows_per_request: tuple[np.ndarray, np.ndarray],
    parameters: SamplingParameters,
    adjustments: tuple[Any, Any] | None = None,
) -> RequestSampling:
    """The per-request sampling parameters, checked, and in strict mode the row values.

    Parameters
    ----------
    xp : module
    batch_size, vocab_size : int
    strict : bool
    form : RowForm
    rows : (target rows, draft rows or None)
        The kernel-ready rows, for the strict checks and the temperatures' overflow check.
    every_request_greedy : bool
        The call's method is greedy: every request is.
    rows_per_request : (int64 [B], int64 [B])
        How many consecutive target and draft rows each request owns, request by request.
    parameters : SamplingParameters
        As given (the filter order is checked here too).
    adjustments : (target, draft), optional
        The sampling surface's row settings that the kernel applies where it reads a
        row (:class:`specdec_np._layouts.row_adjustments.RowAdjustments` or None each): the
        temperatures' check reads the rows adjusted.

    Returns
    -------
    RequestSampling
    """
    sampling, greedy, host_table = checked_parameters(
        batch_size, vocab_size, parameters, from_logits=form.from_logits,
        divides_logits=form.processed, row_dtype=rows[0].dtype,
        every_request_greedy=every_request_greedy, table=form.processed,
    )  # fmt: skip
    if strict:
        for name, values, logits in zip(
            (form.target_name, form.draft_name), rows, (form.from_logits, form.draft_from_logits)
        ):
            if logits:
                _validate.check_logit_values(name, values, xp)
            else:
                _validate.check_probability_values(name, values, xp)
    for name, values, logits, counts, adjusted in zip(
        (form.target_name, form.draft_name), rows, (form.from_logits, form.draft_from_logits),
        rows_per_request, adjustments or (None, None),
    ):
        if logits and values is not None:
            check_tempered_rows(
                sampling["temperature"], greedy, name, values, counts, xp, adjusted
            )
    return RequestSampling(greedy, None if host_table is None else xp.asarray(host_table))


def check_tempered_rows(
    temperature: np.ndarray | None,
    greedy: np.ndarray,
    name: str,
    rows: Any,
    rows_per_request: np.ndarray,
    xp: Any,
    adjustments: Any = None,
) -> None:
    """Refuse a temperature at which the largest finite logit of a row it divides overflows.

    The kernels compute ``z = logits / t`` in the rows' dtype.  If the largest finite
    logit ``m`` of a row gives ``m / t = +inf``, the row would be drawn as if uniform over
    its overflowing entries; if it gives ``-inf``, every finite logit does and the row
    would lose its mass.  Both are refused.  A smaller logit that overflows to ``-inf``
    below a finite maximum is harmless: its weight ``exp(z - max z)`` is exactly 0 at any
    exponent range, and so is its share of every filter, so the law is unchanged.

    Correctly rounded division is monotone, so ``m / t`` decides for the whole row, and a
    temperature of at least 1 (in the rows' dtype) never overflows a finite logit: the
    rows are read only for requests with ``0 < t < 1``, one maximum pass over their rows
    (NaN ignored, ``-inf`` masks harmless), and each run of consecutive such rows is
    reduced in place, without a copy.

    Parameters
    ----------
    temperature : float64 [B] or None
        The checked temperatures (None: 1 everywhere).
    greedy : bool [B]
        Requests that read their rows raw (never divided).
    name : str
        The rows' argument, for the message.
    rows : float32 or float64 [R, V]
        Logits rows, request by request.
    rows_per_request : int64 [B]
        How many consecutive rows each request owns.
    xp : module
    adjustments : RowAdjustments, optional
        The sampling surface's settings of these rows, which the kernel applies where it
        reads a row (:class:`specdec_np._layouts.row_adjustments.RowAdjustments`): the rows are
        tested adjusted, each in a working row (NumPy rows), or the runs of rows at risk
        adjusted on the device (CuPy rows).

    Raises
    ------
    ValueError
        Naming ``temperature``, the first request and row that overflow, and the logit.
    """
    if temperature is None or not rows.shape[0]:
        return
    device_adjustments = None
    if adjustments is not None and xp is not np:
        # CuPy rows: the runs at risk below are read adjusted on the device, run by run.
        device_adjustments = adjustments
    elif adjustments is not None:
        counts = np.ascontiguousarray(rows_per_request, dtype=np.int64)
        if _core.first_tempered_overflow(
            rows, temperature, greedy, counts, adjustments.kernel_arguments()
        ) < 0:
            return
        # A refusal: its message is worded from the adjusted rows themselves.
        rows = adjustments.apply(rows)
    if type(rows) is np.ndarray and rows.dtype in _KERNEL_FLOATS and rows.flags.c_contiguous:
        # The test in one compiled pass; the passes below only word the message.
        counts = np.ascontiguousarray(rows_per_request, dtype=np.int64)
        if _core.first_tempered_overflow(rows, temperature, greedy, counts) < 0:
            return
    dtype = np.dtype(rows.dtype)
    divisor = temperature.astype(dtype)
    at_risk = ~greedy & (divisor < 1)
    if not at_risk.any():
        return
    row_at_risk = np.repeat(at_risk, rows_per_request)
    # Runs of consecutive rows at risk, as [start, stop) pairs.
    edges = np.flatnonzero(np.diff(row_at_risk.astype(np.int8), prepend=0, append=0))
    largest = np.full(rows.shape[0], -np.inf, dtype=dtype)
    for start, stop in zip(edges[::2].tolist(), edges[1::2].tolist()):
        run = rows[start:stop]
        if device_adjustments is not None:
            run = device_adjustments.apply(run, np.arange(start, stop))
        largest[start:stop] = _largest_finite(run, xp)
    requests = np.repeat(np.arange(temperature.shape[0]), rows_per_request)
    with np.errstate(over="ignore"):
        quotient = largest / divisor[requests]
    overflow = np.flatnonzero(row_at_risk & np.isfinite(largest) & np.isinf(quotient))
    if overflow.size:
        row = int(overflow[0])
        request = int(requests[row])
        raise ValueError(
            f"temperature must not make finite logits overflow in {dtype}; found "
            f"{float(temperature[request])!r} for request {request}, which divides the "
            f"largest finite logit {float(largest[row])!r} of {name} row {row} to "
            f"{float(quotient[row])}"
        )


_KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _largest_finite(rows: Any, xp: Any) -> np.ndarray:
    """The largest finite entry of each row, ``-inf`` for a row without one, on the host."""
    if xp is np:
        largest = np.fmax.reduce(rows, axis=1)  # NaN ignored, -inf never the largest
    else:
        largest = xp.max(xp.where(xp.isnan(rows), -xp.inf, rows), axis=1).get()
    infinite = np.flatnonzero(largest == np.inf)
    for row in infinite.tolist():
        # A +inf logit: the largest finite entry is below it (rare: only outside strict
        # mode, and then this row alone is read again).
        values = rows[row]
        finite = values[xp.isfinite(values)]
        largest[row] = float(finite.max()) if finite.size else -np.inf
    return largest


def greedy_requests(
    sampling: Mapping[str, Any], every_request: bool, batch_size: int
) -> np.ndarray:
    """bool [B]: the requests verified greedily (``temperature == 0``, or all of them)."""
    if every_request:
        return np.ones(batch_size, dtype=bool)
    if sampling["temperature"] is None:
        return np.zeros(batch_size, dtype=bool)
    return np.asarray(sampling["temperature"] == 0)


_SAMPLING_COLUMNS = (("temperature", 1.0), ("top_k", 0.0), ("top_p", 1.0), ("min_p", 0.0))


def sampling_table(
    sampling: Mapping[str, Any], greedy: np.ndarray, batch_size: int, filter_order: str = "vllm"
) -> np.ndarray:
    """float64 [B, 5]: temperature, top-k (0 = off), top-p, min-p and the filter order's
    code (``specdec_np._runtime.contract.FILTER_ORDER_CODES``) of every request, with the
    defaults of "off" (a greedy request reads its rows raw; its entries are unused)."""
    table = np.empty((batch_size, _contract.SAMPLING_COLUMNS), dtype=np.float64)
    for column, (name, off) in enumerate(_SAMPLING_COLUMNS):
        values = sampling[name]
        table[:, column] = off if values is None else values
    table[:, len(_SAMPLING_COLUMNS)] = _contract.FILTER_ORDER_CODES[filter_order]
    if sampling["temperature"] is not None:
        np.copyto(table[:, 0], 1.0, where=greedy)
    return table
