"""This rank's part of the processed law of the sampled requests' logits rows.

The rows stay as they were handed over (the target's, then the draft's: no copy of either
where every row is read); ``z = logits / t`` is computed only where it is read.  A
threshold on ``z`` is a threshold on the logits: ``fl(l / t)`` is monotone in ``l``, so
``{y : z(y) >= c} = {y : l(y) >= lambda}`` for the least such ``lambda``
(:meth:`LogitRows.logit_floors`; the kernels' candidate scan finds it the same way), and
one comparison of the logits finds the entries a filter keeps.

The passes over the slice are the kernels' (``specdec_np/_kernels/src/cpu/shardscan.h``
through ``_core``): the maxima with those of sets of columns (``shard_stats``), the
entries at a threshold (``shard_at_least``), the weights of
a row given its global maximum with their sum on the law's eight lanes
(``shard_weights``) and the law's weight of single entries (``shard_exp``); for CuPy rows
the CUDA kernels' twins of them (``shard_passes.cu``, the CUDA law's exponential and
lanes), the rows and the weights staying on the device.
:class:`LawRows` then holds the weights ``w = exp(z - max z)`` of the entries kept here:
for a row without a filter every entry's, computed once for the whole slice; for a
filtered row only its kept entries'.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._runtime.arrays import thread_block
from .rows import RowSet, Sparse, filled, library, passes, to_host

__all__ = ["Entries", "LawRows", "LogitRows", "law_weights"]

#: Entries a row is expected to keep at most at a threshold, for the room the candidate
#: scan writes into (more only costs a second pass).
GUESS = 1024

_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_ROWS.flags.writeable = False


def law_weights(values: np.ndarray, top: np.ndarray, like: Any = None) -> np.ndarray:
    """``w = exp(values - top)`` by the law's rule, in the rows' dtype (the kernels' float32
    exponential for float32 values, ``exp`` for float64; 0 for NaN), ``top`` broadcast
    against ``values``, both of one dtype (the kernels' ``shard_exp``; on the device of
    ``like`` when that is a CuPy array, the device law's exponential)."""
    dtype = np.result_type(values, top)  # NumPy's promotion, as values - top would take
    values, top = np.asarray(values, dtype=dtype), np.asarray(top, dtype=dtype)
    if top.shape != values.shape:
        if top.ndim <= values.ndim and all(
            t in (1, v) for t, v in zip(top.shape[::-1], values.shape[::-1], strict=False)
        ):
            # top broadcast into values' shape, without np.broadcast_arrays' Python.
            spread = np.empty(values.shape, dtype=dtype)
            spread[...] = top
            top = spread
        else:
            values, top = np.broadcast_arrays(values, top)
    flat = np.ascontiguousarray(values).reshape(-1)
    out = np.empty(flat.size, dtype=dtype)
    top = np.ascontiguousarray(top).reshape(-1)
    if like is not None and library(like) is not np:
        passes(like).shard_exp(flat, top, out, like)
    else:
        passes(flat).shard_exp(flat, top, out)
    return out.reshape(values.shape)


class Entries(NamedTuple):
    """Some entries of some rows: row (of the whole set), column and value, row by row
    and column by column."""

    rows: np.ndarray
    columns: np.ndarray
    values: np.ndarray


class LogitRows:
    """Logits rows held as parts (each a view or a copy), seen through ``values = logits /
    divisor`` per row (``divisor`` 1: the logits themselves).

    Parameters
    ----------
    parts : list of float32 or float64 [n_i, width] arrays
        The rows, part after part.
    divisor : same dtype [R]
        Per row the temperature (or 1).
    """

    def __init__(self, parts: list[np.ndarray], divisor: np.ndarray) -> None:
        self.parts = parts
        self.divisor = divisor
        self.dtype = divisor.dtype
        self.width = int(parts[0].shape[1]) if parts else 0
        self.unit = not np.count_nonzero(divisor != 1)
        # Each part's first row and end, as Python ints (read by every pass).
        first = 0
        self.spans: list[tuple[int, int, np.ndarray]] = []
        for part in parts:
            self.spans.append((first, first + int(part.shape[0]), part))
            first += int(part.shape[0])
        self.count = first
        self.firsts = np.array([span[0] for span in self.spans], dtype=np.int64)

    def with_divisor(self, divisor: np.ndarray) -> LogitRows:
        """The same rows seen through another divisor."""
        return LogitRows(self.parts, divisor)

    def _spans(self) -> list[tuple[int, int, np.ndarray]]:
        return self.spans

    def logits(self, rows: np.ndarray) -> np.ndarray:
        """The logits of ``rows`` (a copy)."""
        out = np.empty((rows.size, self.width), dtype=self.dtype)
        for first, end, part in self._spans():
            at = ((rows >= first) & (rows < end)).nonzero()[0]
            if at.size:
                out[at] = to_host(part[rows[at] - first])
        return out

    def values(self, rows: np.ndarray) -> np.ndarray:
        """``logits / divisor`` of ``rows`` (a new array)."""
        if self.unit:
            return self.logits(rows)
        out = np.empty((rows.size, self.width), dtype=self.dtype)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for first, end, part in self._spans():
                at = ((rows >= first) & (rows < end)).nonzero()[0]
                if not at.size:
                    continue
                divisor = self.divisor[rows[at], None]
                local = rows[at] - first
                in_order = at.size == part.shape[0] and at[-1] - at[0] + 1 == at.size
                if in_order and (local == np.arange(at.size)).all():
                    # The whole part, in order: divided straight into place.
                    np.divide(to_host(part), divisor, out=out[at[0] : at[-1] + 1])
                else:
                    out[at] = to_host(part[local]) / divisor
        return out

    def entry_values(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """``logits / divisor`` at the entries ``(rows[i], columns[i])``."""
        out = np.empty(rows.size, dtype=self.dtype)
        for first, end, part in self._spans():
            at = ((rows >= first) & (rows < end)).nonzero()[0]
            if at.size:
                out[at] = to_host(part[rows[at] - first, columns[at]])
        if not self.unit:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                out /= self.divisor[rows]
        return out

    def maxima(self, groups: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
        """float64 ``[R, 3]`` per row: the largest value (NaN never), its count of
        ``+inf``, and the largest finite logit; and, with ``groups`` (at most half the
        width), the largest logit of each of ``groups`` sets of columns (``[R, groups]``,
        ``-inf`` for a set of NaN alone), found in the same pass (the kernels'
        ``shard_stats``).  Each is an entry of the row: the ``C``-th largest of them is at
        most the row's ``C``-th largest."""
        table = np.zeros((self.count, 3))
        groups = groups if 0 < 2 * groups <= self.width else 0
        grouped = np.zeros((self.count, groups), dtype=self.dtype)
        for first, end, part in self._spans():
            passes(part).shard_stats(library(part).ascontiguousarray(part),
                                     self.divisor[first:end], groups, table[first:end],
                                     grouped[first:end])
        return table, grouped if groups else None

    def logit_floors(self, floors: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Per row of ``rows`` the least logit ``l`` with ``fl(l / t) >= floors`` (same
        dtype; ``-inf`` for a floor of ``-inf``), so that ``l >= lambda`` is ``z >= floor``;
        NaN where that was not found within a few steps (the caller then compares ``z``)."""
        if self.unit:
            return floors.copy()
        dtype = self.dtype
        t = self.divisor[rows]
        biggest = np.finfo(dtype).max
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            guess = np.clip(floors * t, -biggest, biggest).astype(dtype)
            guess = np.where(floors == -np.inf, dtype.type(-np.inf), guess)
            for _ in range(4):
                low = ~(guess / t >= floors)
                if not low.any():
                    break
                guess = np.where(low, np.nextafter(guess, dtype.type(np.inf)), guess)
            for _ in range(4):
                below = np.nextafter(guess, dtype.type(-np.inf))
                lower = (below / t >= floors) & (guess > -np.inf)
                if not lower.any():
                    break
                guess = np.where(lower, below, guess)
            exact = (guess / t >= floors) & ~(np.nextafter(guess, dtype.type(-np.inf)) / t
                                              >= floors)
        exact |= floors == -np.inf
        return np.where(exact, guess, dtype.type(np.nan))

    def at_least(self, rows: np.ndarray, floors: np.ndarray) -> Entries:
        """The entries of ``rows`` whose value reaches the row's floor (NaN never), row by
        row and column by column (one compiled pass: the kernels' ``shard_at_least``)."""
        found_rows: list[np.ndarray] = []
        found_columns: list[np.ndarray] = []
        found_values: list[np.ndarray] = []
        floors = np.asarray(floors, dtype=self.dtype)
        rows = np.asarray(rows, dtype=np.int64)
        in_order = rows.size < 2 or not np.count_nonzero(rows[1:] < rows[:-1])
        if in_order:
            # Ascending rows: each part's rows are one run of them, cut where it starts.
            cuts = rows.searchsorted(self.firsts).tolist() + [rows.size]
        for index, (first, end, part) in enumerate(self._spans()):
            if in_order:
                at: Any = slice(cuts[index], cuts[index + 1])
                picked = rows[at]
            else:
                at = ((rows >= first) & (rows < end)).nonzero()[0]
                picked = rows[at]
            if not picked.size:
                continue
            block = library(part).ascontiguousarray(part)
            local = picked - first
            divisor = np.ascontiguousarray(self.divisor[picked])
            limit = np.ascontiguousarray(floors[at])
            counts = np.zeros(picked.size, dtype=np.int64)
            # One pass over the rows, into room for a generous guess (pages never written
            # cost nothing); past it the pass counts, and a second one writes them all.
            room = min(picked.size * self.width, picked.size * GUESS) + self.width + 1
            while True:
                columns = np.empty(room, dtype=np.int64)
                values = np.empty(room, dtype=self.dtype)
                total, written = passes(block).shard_at_least(block, local, divisor, limit,
                                                              counts, columns, values)
                if written:
                    break
                room = total + self.width + 1
            found_rows.append(picked.repeat(counts))
            found_columns.append(columns[:total])
            found_values.append(values[:total])
        if not found_rows:
            empty = np.zeros(0, dtype=np.int64)
            return Entries(empty, empty, np.zeros(0, dtype=self.dtype))
        if len(found_rows) == 1:
            return Entries(found_rows[0], found_columns[0], found_values[0])
        row_of = np.concatenate(found_rows)
        columns = np.concatenate(found_columns)
        values = np.concatenate(found_values)
        if in_order:
            # The parts hold ascending row ranges: with rows in order, so are the entries.
            return Entries(row_of, columns, values)
        order = np.lexsort((columns, row_of))
        return Entries(row_of[order], columns[order], values[order])


class LawRows:
    """The law rows of one call on this rank, once their maxima and floors are agreed.

    Parameters
    ----------
    logits : LogitRows
        The rows, seen through their temperatures (``z``).
    top : same dtype [R]
        The rows' global maxima of ``z``.
    infinite : bool [R]
        Rows with ``+inf`` entries (uniform over them).
    no_mass : bool [R]
        Rows without a finite maximum.
    floors : same dtype [R] or None
        Per row the least kept ``z`` (NaN: no filter, every entry kept).
    kept : Entries or None
        Entries at or above the floors of some filtered rows, already found (the
        candidates), with ``covered`` saying which rows they hold whole.
    covered : bool [R] or None
    """

    def __init__(
        self,
        logits: LogitRows,
        top: np.ndarray,
        infinite: np.ndarray,
        no_mass: np.ndarray,
        floors: np.ndarray | None,
        kept: Entries | None = None,
        covered: np.ndarray | None = None,
    ) -> None:
        self.logits = logits
        self.dtype = logits.dtype
        self.top = top
        self.infinite = infinite
        self.no_mass = no_mass
        rows, width = logits.count, logits.width
        self.width = width
        plain = ~infinite & ~no_mass
        self.floors = floors
        filtered = None
        if floors is not None:
            filtered = plain & ~np.isnan(floors)
        self.dense = (plain if filtered is None else plain & ~filtered).nonzero()[0]
        self.masses = np.zeros(rows)
        # Every entry's weight in the rows without a filter (in the rows' dtype: a
        # float32 weight is a float32 value), by position in self.dense.
        self.dense_at = filled(rows, -1, dtype=np.int64)
        self.dense_at[self.dense] = np.arange(self.dense.size)
        # Every entry is written by the weights' pass below, where the rows lie.
        self.library = library(logits.parts[0]) if logits.parts else np
        if self.library is np:
            # Tens of MB a step at large batches: in the thread's kept memory, not fresh
            # pages (benchmarks/results/2026-12-07-sharded-reuse).
            self.dense_weights = thread_block("shard_weights", self.dense.size, width,
                                              self.dtype)
        else:
            self.dense_weights = self.library.empty((self.dense.size, width), dtype=self.dtype)
        if self.dense.size and width:
            # One compiled pass a row: the law's weights and their sum on its eight lanes
            # (the kernels' shard_weights).
            no_cutoff = filled(self.dense.size, -np.inf, dtype=self.dtype)
            dense_masses = np.zeros(self.dense.size)
            z_max = np.ascontiguousarray(top[self.dense], dtype=self.dtype)
            divisor = logits.divisor[self.dense]
            # self.dense is sorted, so a part's rows are one run of it, cut where it starts.
            cuts = self.dense.searchsorted(logits.firsts).tolist() + [self.dense.size]
            for index, (first, _, part) in enumerate(logits._spans()):
                run = slice(cuts[index], cuts[index + 1])
                if run.start == run.stop:
                    continue
                passes(part).shard_weights(
                    self.library.ascontiguousarray(part), self.dense[run] - first,
                    divisor[run], z_max[run], no_cutoff[run], self.dense_weights[run],
                    dense_masses[run],
                )
            self.masses[self.dense] = dense_masses
        # The kept entries of the filtered rows, with their weights.
        sparse = _NO_ROWS if filtered is None else filtered.nonzero()[0]
        self.kept = Entries(np.zeros(0, np.int64), np.zeros(0, np.int64),
                            np.zeros(0, self.dtype))
        self.kept_weights = np.zeros(0, dtype=self.dtype)
        if sparse.size and width and floors is not None and filtered is not None:
            parts = []
            if kept is not None and covered is not None:
                take = covered[kept.rows] & filtered[kept.rows]
                take &= kept.values >= floors[kept.rows]
                parts.append(Entries(kept.rows[take], kept.columns[take], kept.values[take]))
                sparse = sparse[~covered[sparse]]
            if sparse.size:
                parts.append(logits.at_least(sparse, floors[sparse]))
            if len(parts) == 1:
                self.kept = parts[0]
            else:
                row_of = np.concatenate([part.rows for part in parts])
                order = np.lexsort((np.concatenate([part.columns for part in parts]), row_of))
                self.kept = Entries(
                    row_of[order],
                    np.concatenate([part.columns for part in parts])[order],
                    np.concatenate([part.values for part in parts])[order],
                )
            like = logits.parts[0] if self.library is not np else None
            self.kept_weights = law_weights(self.kept.values, top[self.kept.rows], like)
            self.masses += np.bincount(
                self.kept.rows, weights=self.kept_weights.astype(np.float64), minlength=rows
            )[:rows]
        spread = infinite.nonzero()[0]
        self.any_infinite = bool(spread.size)
        if spread.size:
            self.masses[spread] = np.count_nonzero(logits.values(spread) == np.inf, axis=1)
        self._kept_keys: np.ndarray | None = None

    def token_weights(self, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """float64 ``w`` of the entries ``(rows[i], columns[i])`` of this rank's slice (0
        where not kept), read from the weights computed for the rows' masses."""
        weights = np.zeros(rows.size)
        dense = self.dense_at[rows]
        at = (dense >= 0).nonzero()[0]
        if at.size:
            weights[at] = to_host(self.dense_weights[dense[at], columns[at]])
        if self.kept.rows.size:
            # The kept entries are sorted by (row, column): find each asked entry there.
            width = max(self.width, 1)
            keys = self._kept_keys
            if keys is None:
                keys = self._kept_keys = self.kept.rows * width + self.kept.columns
            asked = rows * width + columns
            place = np.minimum(keys.searchsorted(asked), keys.size - 1)
            found = (keys[place] == asked) & (dense < 0)
            weights = np.where(found, self.kept_weights[place], weights)
        spread = self.infinite[rows].nonzero()[0] if self.any_infinite else _NO_ROWS
        if spread.size:
            values = self.logits.entry_values(rows[spread], columns[spread])
            weights[spread] = values == np.inf
        return weights

    def _divided(self, weights: np.ndarray, normalisers: np.ndarray) -> np.ndarray:
        """``p = w / sum w`` rounded to the rows' dtype as the kernels store it, float64
        (0 where the row has no mass)."""
        divisor = np.where(normalisers > 0.0, normalisers, np.inf)
        return (weights / divisor).astype(self.dtype).astype(np.float64)

    def _divide_dense(self, dense: np.ndarray, normalisers: np.ndarray, out: np.ndarray,
                      out_rows: np.ndarray) -> None:
        """``out[out_rows[i]] = p`` of dense row ``dense[i]`` (:meth:`_divided`'s bits, by
        the kernels' ``shard_divided``: one pass a row)."""
        if not dense.size or not self.width:
            return
        divisor = np.where(normalisers > 0.0, normalisers, np.inf).astype(np.float64)
        passes(self.dense_weights).shard_divided(self.dense_weights, dense.astype(np.int64),
                                                 divisor, out, out_rows)

    def entry_probabilities(self, rows: np.ndarray, columns: np.ndarray,
                            normalisers: np.ndarray) -> np.ndarray:
        """float64 ``p`` at the entries ``(rows[i], columns[i])``, ``normalisers[i]`` the
        whole mass of ``rows[i]``."""
        return self._divided(self.token_weights(rows, columns), normalisers)

    def probability_rows(self, rows: np.ndarray, normalisers: np.ndarray) -> RowSet:
        """``p`` of law rows ``rows`` (row ``i`` of the result is ``rows[i]``): a row without
        a filter whole, a filtered row's kept entries, a row with ``+inf`` entries those."""
        dense = self.dense_at[rows]
        whole = (dense >= 0).nonzero()[0]
        block = self.library.empty((whole.size, self.width))
        self._divide_dense(dense[whole], normalisers[whole], block,
                           np.arange(whole.size, dtype=np.int64))
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        chosen = _NO_ROWS
        if self.kept.rows.size:
            where = filled(self.logits.count, -1, dtype=np.int64)
            where[rows] = np.arange(rows.size)
            chosen = (where[self.kept.rows] >= 0).nonzero()[0]
        if chosen.size:
            target = where[self.kept.rows[chosen]]
            weights = self._divided(self.kept_weights[chosen].astype(np.float64),
                                    normalisers[target])
            parts.append((target, self.kept.columns[chosen], weights))
        spread = self.infinite[rows].nonzero()[0] if self.any_infinite else _NO_ROWS
        if spread.size:
            row_of, columns = np.nonzero(self.logits.values(rows[spread]) == np.inf)
            weights = self._divided(np.ones(row_of.size), normalisers[spread[row_of]])
            parts.append((spread[row_of], columns, weights))
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return RowSet(rows.size, whole, block, Sparse(empty, empty, np.zeros(0)))
        row_of = np.concatenate([part[0] for part in parts])
        columns = np.concatenate([part[1] for part in parts])
        weights = np.concatenate([part[2] for part in parts])
        if row_of.size and (len(parts) > 1 or np.count_nonzero(row_of[1:] < row_of[:-1])):
            order = np.lexsort((columns, row_of))
            row_of, columns, weights = row_of[order], columns[order], weights[order]
        return RowSet(rows.size, whole, block, Sparse(row_of, columns, weights))

    def probabilities(self, rows: np.ndarray, normalisers: np.ndarray) -> np.ndarray:
        """float64 ``[len(rows), width]``: ``p = w / sum w`` on this rank's columns, rounded
        to the rows' dtype as the kernels store it (0 outside the kept set).

        Parameters
        ----------
        rows : int array
            Law rows.
        normalisers : float64 [len(rows)]
            The rows' whole kept masses (0: no mass, every ``p`` is 0).
        """
        dense = self.dense_at[rows]
        at = (dense >= 0).nonzero()[0]
        # Rows without a filter are written whole by the compiled division; the others
        # start at 0 (outside the kept set), and every value is rounded to the rows' dtype.
        xp = self.library
        out = xp.empty((rows.size, self.width)) if at.size == rows.size else xp.zeros(
            (rows.size, self.width))
        if at.size:
            self._divide_dense(dense[at], normalisers[at], out, at.astype(np.int64))
        divisor = np.where(normalisers > 0.0, normalisers, np.inf)
        chosen = _NO_ROWS
        if self.kept.rows.size:
            where = filled(self.logits.count, -1, dtype=np.int64)
            where[rows] = np.arange(rows.size)
            chosen = (where[self.kept.rows] >= 0).nonzero()[0]
        if chosen.size:
            target = where[self.kept.rows[chosen]]
            out[target, self.kept.columns[chosen]] = xp.asarray((
                self.kept_weights[chosen].astype(np.float64) / divisor[target]
            ).astype(self.dtype))
        spread = self.infinite[rows].nonzero()[0] if self.any_infinite else _NO_ROWS
        if spread.size:
            out[spread] = xp.asarray((
                (self.logits.values(rows[spread]) == np.inf) / divisor[spread, None]
            ).astype(self.dtype))
        return out
