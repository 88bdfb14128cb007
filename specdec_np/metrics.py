"""Running acceptance metrics of an engine's verifier, mergeable across workers.

Every field is a sum, so the metrics of several workers (or of several windows) merge by
addition (``a + b``, or :meth:`VerificationMetrics.merge`), and every derived figure is
computed from the sums.  The one acceptance figure is the *causal* one: drafts in the
accepted prefix, over drafts proposed (``acceptance_rate``), which is what decides how
many tokens a target call yields.  See ``docs/semantics.md``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _core

__all__ = ["VerificationMetrics"]


@dataclass(eq=False)
class VerificationMetrics:  # numpydoc ignore=PR01
    """Sums over verified requests.

    Attributes
    ----------
    requests : int
        Requests verified (one target call each).
    drafted : int
        Draft tokens proposed.
    accepted : int
        Draft tokens in the accepted prefixes (causal).
    emitted : int
        Tokens emitted: the accepted prefixes plus one token per request.
    accepted_at : numpy.ndarray, int64 [n]
        ``accepted_at[j]``: requests whose draft at position ``j`` was accepted (so
        ``accepted_at[0] >= accepted_at[1] >= ...``); grows as longer drafts arrive.
    drafted_at : numpy.ndarray, int64 [n]
        ``drafted_at[j]``: requests that proposed a draft at position ``j``.
    total_variation_sum : float
        The bias measured at every emitted position of the calls made with
        ``report_bias=True`` (``docs/semantics.md``, "Relaxed methods"), summed.
    measured_positions : int
        How many emitted positions those calls measured.

    Examples
    --------
    Two requests of two drafts, one accepting both and one neither:

    >>> import numpy as np
    >>> from specdec_np import VerificationMetrics
    >>> metrics = VerificationMetrics()
    >>> metrics.record(np.array([2, 2]), np.array([2, 0]))
    >>> metrics.acceptance_rate, metrics.mean_accepted_length, metrics.acceptance_by_position
    (0.5, 2.0, array([0.5, 0.5]))
    >>> (metrics + metrics).requests
    4
    """

    requests: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    accepted_at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    drafted_at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    total_variation_sum: float = 0.0
    measured_positions: int = 0

    def record(
        self, num_draft_tokens: Any, accepted_lengths: Any, commit: Any = None,
        emitted: Any = None, total_variation: Any = None,
    ) -> None:
        """Add one verification call.

        Parameters
        ----------
        num_draft_tokens : int [B]
            ``k_b`` per request.
        accepted_lengths : int [B]
            Causal accepted length per request (NumPy or CuPy; read once).
        commit : object with a ``done`` attribute, optional
            Set to True as the last step of the record (a verifier's call then keeps its
            draws; see ``specdec_np._kernels.dispatch.Commit``).
        emitted : int [B], optional
            Tokens emitted per request, where a stop or a budget cut the run (the sampling
            surface); ``accepted_lengths + 1`` when None.
        total_variation : float [B, W], optional
            The call's measured bias per emitted position (NaN elsewhere), from
            ``report_bias=True``.
        """
        if emitted is None and total_variation is None and _core.record_metrics(
            self.__dict__, num_draft_tokens, accepted_lengths, commit
        ):
            # The common record (NumPy int64 counts, no growth), the steps below in one
            # compiled call: the same fields, set all or none, commit.done last.
            return
        drafted = _host(num_draft_tokens)
        accepted = _host(accepted_lengths)
        if drafted.shape[0] <= _PYTHON_MAX and accepted.shape[0] <= _PYTHON_MAX:
            # A small batch on Python ints: a NumPy reduction costs more than a request.
            drafted_list, accepted_list = drafted.tolist(), accepted.tolist()
            width = max([0, *drafted_list, *accepted_list])
            drafted_sum, accepted_sum = sum(drafted_list), sum(accepted_list)
        else:
            width = int(max(drafted.max(initial=0), accepted.max(initial=0)))
            drafted_sum, accepted_sum = int(drafted.sum()), int(accepted.sum())
        size = int(drafted.shape[0])
        if width <= self.accepted_at.shape[0]:
            accepted_at, drafted_at = self.accepted_at.copy(), self.drafted_at.copy()
        else:
            accepted_at, drafted_at = self._grown(width)
        # The per-position counts in one compiled pass each, O(B + the lengths' sum).
        _core.add_position_counts(accepted, accepted_at)
        _core.add_position_counts(drafted, drafted_at)
        new = (
            self.requests + size,
            self.drafted + drafted_sum,
            self.accepted + accepted_sum,
            self.emitted + (
                accepted_sum + size if emitted is None else int(_host(emitted).sum())
            ),
            accepted_at,
            drafted_at,
            *(
                (self.total_variation_sum, self.measured_positions)
                if total_variation is None else _bias_sums(self, total_variation)
            ),
        )  # fmt: skip
        # Everything is computed on copies first; the fields are then set in one compiled
        # step (a dict update), put back if an interrupt lands before the commit, so a call
        # is recorded whole or not at all.
        fields = self.__dict__
        old = _fields_of(self)
        try:
            fields.update(zip(_FIELDS, new))
            if commit is not None:
                commit.done = True
        except BaseException:
            fields.update(zip(_FIELDS, old))
            raise

    def _grown(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the per-position counts, at least ``width`` long."""
        extra = max(width - self.accepted_at.shape[0], 0)
        if not extra:
            return self.accepted_at.copy(), self.drafted_at.copy()
        padding = np.zeros(extra, np.int64)
        return (
            np.concatenate([self.accepted_at, padding]),
            np.concatenate([self.drafted_at, padding]),
        )

    def merge(self, other: VerificationMetrics) -> VerificationMetrics:
        """The metrics of both (a new object); the same as ``self + other``.

        Parameters
        ----------
        other : VerificationMetrics
            The metrics to add (another worker's or another window's).

        Returns
        -------
        VerificationMetrics
            Every sum and per-position count of both; neither operand changes.
        """
        width = max(self.accepted_at.shape[0], other.accepted_at.shape[0])
        merged = VerificationMetrics(
            self.requests + other.requests,
            self.drafted + other.drafted,
            self.accepted + other.accepted,
            self.emitted + other.emitted,
        )
        merged.accepted_at, merged.drafted_at = merged._grown(width)
        merged.total_variation_sum = self.total_variation_sum + other.total_variation_sum
        merged.measured_positions = self.measured_positions + other.measured_positions
        for part in (self, other):
            merged.accepted_at[: part.accepted_at.shape[0]] += part.accepted_at
            merged.drafted_at[: part.drafted_at.shape[0]] += part.drafted_at
        return merged

    def __add__(self, other: Any) -> VerificationMetrics:
        if not isinstance(other, VerificationMetrics):
            return NotImplemented
        return self.merge(other)

    def __radd__(self, other: Any) -> VerificationMetrics:
        # sum(metrics) starts from 0.
        if isinstance(other, int) and other == 0:
            return self.merge(VerificationMetrics())
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VerificationMetrics):
            return NotImplemented
        width = max(self.accepted_at.shape[0], other.accepted_at.shape[0])
        padded = [
            np.pad(array, (0, width - array.shape[0]))
            for array in (self.accepted_at, self.drafted_at, other.accepted_at, other.drafted_at)
        ]
        return (
            (self.requests, self.drafted, self.accepted, self.emitted,
             self.total_variation_sum, self.measured_positions)
            == (other.requests, other.drafted, other.accepted, other.emitted,
                other.total_variation_sum, other.measured_positions)
            and np.array_equal(padded[0], padded[2])
            and np.array_equal(padded[1], padded[3])
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over drafted ones (causal); NaN before any draft."""
        return self.accepted / self.drafted if self.drafted else math.nan

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verified request (what one target call yields a request);
        NaN before any request."""
        return self.emitted / self.requests if self.requests else math.nan

    @property
    def mean_total_variation(self) -> float:
        """The measured bias per measured emitted position; NaN before any (0 for a
        lossless verifier)."""
        if not self.measured_positions:
            return math.nan
        return self.total_variation_sum / self.measured_positions

    @property
    def acceptance_by_position(self) -> np.ndarray:
        """Of the requests that drafted position ``j``, the share that accepted it.

        The per-position acceptance histogram: float64 ``[n]``, NaN where no request
        drafted position ``j``.
        """
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(
                self.drafted_at > 0, self.accepted_at / np.maximum(self.drafted_at, 1), np.nan
            )


#: Batches of at most this many requests are recorded on Python ints.
_PYTHON_MAX = 16

_FIELDS = ("requests", "drafted", "accepted", "emitted", "accepted_at", "drafted_at",
           "total_variation_sum", "measured_positions")
_fields_of = operator.attrgetter(*_FIELDS)
_INT64 = np.dtype(np.int64)


def _bias_sums(metrics: VerificationMetrics, total_variation: Any) -> tuple[float, int]:
    """The bias sums with one call's measured positions added."""
    if total_variation is None:
        return metrics.total_variation_sum, metrics.measured_positions
    values = total_variation.get() if hasattr(total_variation, "get") else total_variation
    values = np.asarray(values, dtype=np.float64)
    measured = ~np.isnan(values)
    return (
        metrics.total_variation_sum + float(values[measured].sum()),
        metrics.measured_positions + int(measured.sum()),
    )


def _host(values: Any) -> np.ndarray:
    """int64 ``[B]`` on the host, C-contiguous (the kernels' own arrays as they are)."""
    if (
        type(values) is np.ndarray
        and values.dtype == _INT64
        and values.ndim == 1
        and values.flags.c_contiguous
    ):
        return values
    if not isinstance(values, np.ndarray) and hasattr(values, "get"):
        values = values.get()
    return np.ascontiguousarray(values, dtype=np.int64).reshape(-1)
