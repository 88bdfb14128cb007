"""Rows and sampling parameters of the engine layouts (ragged chains and trees).

Both engine layouts take their target (and draft) rows as logits or as probabilities and
per-request sampling parameters (``docs/semantics.md`` §8).  This module says which form
was given, checks the parameters, tells the greedy requests (``temperature == 0``) from
the sampled ones, and writes the float64 ``[B, 5]`` table the kernels read with logits
rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .._runtime import checks as _validate
from .._runtime import contract as _contract

__all__ = [
    "RequestSampling",
    "RowForm",
    "SamplingParameters",
    "check_tempered_rows",
    "greedy_requests",
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
    """

    temperature: Any = None
    top_k: Any = None
    top_p: Any = None
    min_p: Any = None
    filter_order: str = "vllm"

    def filters(self) -> dict[str, Any]:
        """The per-request parameters by name (everything but the filter order)."""
        return {name: getattr(self, name) for name in self._fields if name != "filter_order"}


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
        return bool(self.greedy.size) and bool(self.greedy.all())

    def request_codes(self, greedy_code: int, code: int, xp: Any) -> Any:
        """int8 ``[B]`` kernel codes for a batch that mixes greedy and sampled requests;
        None when every request takes the same code."""
        if not self.greedy.any() or self.greedy.all():
            return None
        return xp.asarray(np.where(self.greedy, greedy_code, code).astype(np.int8))


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

    Returns
    -------
    RequestSampling
    """
    filter_order = _validate.check_filter_order(parameters.filter_order)
    sampling = _validate.check_sampling_parameters(
        batch_size, vocab_size, from_logits=form.from_logits, row_dtype=rows[0].dtype,
        divides_logits=form.processed, **parameters.filters(),
    )
    if strict:
        for name, values, logits in zip(
            (form.target_name, form.draft_name), rows, (form.from_logits, form.draft_from_logits)
        ):
            if logits:
                _validate.check_logit_values(name, values, xp)
            else:
                _validate.check_probability_values(name, values, xp)
    greedy = greedy_requests(sampling, every_request_greedy, batch_size)
    for name, values, logits, counts in zip(
        (form.target_name, form.draft_name), rows, (form.from_logits, form.draft_from_logits),
        rows_per_request,
    ):
        if logits and values is not None:
            check_tempered_rows(sampling["temperature"], greedy, name, values, counts, xp)
    table = None
    if form.processed:
        table = xp.asarray(sampling_table(sampling, greedy, batch_size, filter_order))
    return RequestSampling(greedy, table)


def check_tempered_rows(
    temperature: np.ndarray | None,
    greedy: np.ndarray,
    name: str,
    rows: Any,
    rows_per_request: np.ndarray,
    xp: Any,
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

    Raises
    ------
    ValueError
        Naming ``temperature``, the first request and row that overflow, and the logit.
    """
    if temperature is None or not rows.shape[0]:
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
        largest[start:stop] = _largest_finite(rows[start:stop], xp)
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
