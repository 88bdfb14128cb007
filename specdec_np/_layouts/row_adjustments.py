"""The sampling surface's row settings as the chain kernels of both backends apply them,
where they read a row (``docs/semantics.md``, "The whole sampling surface", its cost).

:func:`sparse_adjustments_of` finds, for the target and draft rows of a call, the entries
each row's settings touch and their final values, from the rows' own values there, bit
for bit those of :func:`specdec_np._layouts.surface.adjust_rows` (which copies the rows);
the allowed ids become bitmask words beside the call's ``token_bitmask``.  The result,
:class:`RowAdjustments`, goes to ``_core.verify_chains_direct`` and to the temperatures'
overflow check (``_core.first_tempered_overflow``), which make a row adjusted in a working
row only when they read it, or, for CuPy rows, to the CUDA chain kernel
(``specdec_np._kernels.cuda``), which makes it in a request's adjusted row: the touched
columns are gathered on the device (one ``take`` per rows array), computed on the host as
for NumPy rows, and the small result is put on the device.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .._runtime import arrays as _backend

__all__ = [
    "RowAdjustments",
    "bitmask_allowed",
    "sparse_adjustments",
    "sparse_adjustments_of",
]


def bitmask_allowed(bitmask: Any, rows: Any, vocab_size: int, xp: Any) -> Any:
    """bool [len(rows), V]: bit ``j`` of word ``i`` of each row's mask allows ``32 i + j``."""
    if xp is np and np.little_endian:
        # A word's bytes in memory, least significant first: bit j of word i is bit j % 8
        # of byte 4 i + j // 8, which is what a little-endian unpacking reads.
        words = np.ascontiguousarray(bitmask[rows])
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
        return bits[:, :vocab_size].view(np.bool_)  # 0 and 1 bytes: no copy
    tokens = xp.arange(vocab_size)
    words = bitmask[rows][:, tokens // 32]
    return ((words >> (tokens % 32).astype(words.dtype)) & 1).astype(bool)


class RowAdjustments(NamedTuple):
    """The row settings of one rows array as the chain kernels apply them where they read a
    row: a bitmask, then a sparse list of final values per row (on the rows' device).

    Attributes
    ----------
    bitmask : int32 [R, ceil(V / 32)] or None
        Bit ``j`` of word ``w`` allows token ``32 w + j`` (xgrammar's layout); a clear bit
        makes the entry -inf.  The call's ``token_bitmask`` (each row taking its context
        row's mask) and the requests' ``allowed_token_ids``; None: every token allowed.
    offsets : int64 [R + 1] or None
        Row ``r``'s entries are ``offsets[r] .. offsets[r + 1]`` of ``ids`` and
        ``values``; None: none.
    ids : int64 [E]
        Token ids, in ``[0, V)``.
    values : float32 or float64 [E], the rows' dtype
        The entry's final value, every setting applied (-inf for a masked one): written
        over the masked row.

    Examples
    --------
    >>> import numpy as np
    >>> adjustments = RowAdjustments(None, np.array([0, 1]), np.array([2]),
    ...                              np.array([-np.inf], dtype=np.float32))
    >>> adjustments.apply(np.zeros((1, 3), dtype=np.float32))
    array([[  0.,   0., -inf]], dtype=float32)
    """

    bitmask: np.ndarray | None
    offsets: np.ndarray | None
    ids: np.ndarray
    values: np.ndarray

    def kernel_arguments(self) -> tuple[Any, Any, Any, Any]:
        """``(bitmask, offsets, ids, values)`` as ``_core.verify_chains_direct`` takes
        them."""
        return (self.bitmask, self.offsets, self.ids, self.values)

    def rows(self, indices: np.ndarray) -> RowAdjustments:
        """The adjustments of rows ``indices`` (int64 [n]), as those of a rows array made
        of these rows alone, in this order."""
        indices = np.asarray(indices, dtype=np.int64)
        bitmask = None if self.bitmask is None else self.bitmask[indices]
        if self.offsets is None:
            return RowAdjustments(bitmask, None, self.ids, self.values)
        starts, stops = self.offsets[indices], self.offsets[indices + 1]
        offsets = np.zeros(indices.size + 1, dtype=np.int64)
        np.cumsum(stops - starts, out=offsets[1:])
        entries = np.concatenate(
            [np.arange(start, stop) for start, stop in zip(starts.tolist(), stops.tolist())]
            or [np.zeros(0, dtype=np.int64)]
        )
        return RowAdjustments(bitmask, offsets, self.ids[entries], self.values[entries])

    def apply(self, rows: np.ndarray, indices: np.ndarray | None = None) -> np.ndarray:
        """A copy of ``rows`` adjusted as the kernel adjusts the rows it reads.

        Parameters
        ----------
        rows : float32 or float64 [n, V], NumPy or CuPy (the adjustments' backend)
            Rows ``indices`` of the rows array these adjustments are for (all of it when
            ``indices`` is None).
        indices : int64 [n], optional
            Host indices.

        Returns
        -------
        array [n, V]
        """
        xp = np if isinstance(rows, np.ndarray) else _backend.array_namespace(rows)
        if xp is np:
            rows = np.asarray(rows)
        indices = np.arange(rows.shape[0]) if indices is None else np.asarray(indices)
        vocab_size = rows.shape[1]
        if self.bitmask is None:
            adjusted = xp.array(rows, copy=True)
        else:
            at = indices if xp is np else xp.asarray(indices)
            allowed = bitmask_allowed(self.bitmask, at, vocab_size, xp)
            adjusted = xp.where(allowed, rows, rows.dtype.type(-np.inf))
        if self.offsets is not None and indices.size:
            # Every entry of the rows at once (a row's ids are distinct).
            offsets = _host(self.offsets)
            starts = offsets[indices]
            counts = offsets[indices + 1] - starts
            total = int(counts.sum())
            if total:
                owners = np.repeat(np.arange(indices.size), counts)
                entries = np.arange(total) + np.repeat(starts - (np.cumsum(counts) - counts),
                                                       counts)
                if xp is not np:
                    owners, entries = xp.asarray(owners), xp.asarray(entries)
                adjusted[owners, self.ids[entries]] = self.values[entries]
        return adjusted


def _host(array: Any) -> np.ndarray:
    """``array`` on the host: itself for a NumPy array, a copy of a CuPy one."""
    return array if isinstance(array, np.ndarray) else array.get()


def _allowed_words(allowed: np.ndarray, vocab_size: int) -> np.ndarray:
    """int32 [ceil(V / 32)]: the bitmask words that allow exactly ``allowed``."""
    keep = np.zeros(-(-vocab_size // 32) * 32, dtype=bool)
    keep[allowed] = True
    # Bit j of word i is bit j % 8 of the word's byte j // 8, least significant first.
    return np.packbits(keep, bitorder="little").view("<i4").astype(np.int32)


def sparse_adjustments(
    rows: np.ndarray,
    row_indices: np.ndarray,
    context_rows: np.ndarray,
    contexts: Any,
    surface: Any,
) -> RowAdjustments:
    """The row settings of ``rows`` as :class:`RowAdjustments`: the entries of each row
    that :func:`~specdec_np._layouts.surface.adjust_rows` would change, with the values it
    would give them, bit for bit.

    Each request's rows are gathered at the columns its settings touch (its bias, the last
    tokens of its bad words, its stop tokens, the tokens of its context and drafts), masked
    by the bitmask there, and adjusted as ``surface._adjust_request`` adjusts whole rows, in the
    same order and dtype; the allowed ids become bitmask words.  A masked entry stays -inf
    under every later step (a finite bias and the penalties leave -inf as it is), so the
    kernel's masking of the untouched entries gives the same row.  The minimum length's
    rule (stops stay possible when nothing else is) reads whether the rest of the row has a
    possible entry: one pass over that row, only for rows where the rule applies.

    Parameters
    ----------
    rows : float32 or float64 [R, V], NumPy or CuPy
        Logits (not written).
    row_indices, context_rows, contexts, surface
        As :func:`~specdec_np._layouts.surface.adjust_rows` takes them (a
        ``RowContexts`` and a checked ``Surface`` of that module).

    Returns
    -------
    RowAdjustments
    """
    return sparse_adjustments_of([(rows, row_indices, context_rows)], contexts, surface)[0]


def sparse_adjustments_of(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    contexts: Any,
    surface: Any,
) -> list[RowAdjustments]:
    """:func:`sparse_adjustments` of several rows arrays of one call (the target and the
    draft rows) at once: a request's columns, counts and masks are found once for the rows
    of every array, and its rows adjusted together.

    Parameters
    ----------
    parts : list of (rows, row_indices, context_rows)
        As :func:`sparse_adjustments` takes them, one rows array each (one dtype).
    contexts, surface
        As :func:`~specdec_np._layouts.surface.adjust_rows` takes them.

    Returns
    -------
    list of RowAdjustments
        One per part, on the rows' backend.
    """
    xp = _backend.array_namespace(parts[0][0]) if parts else np
    host_given = None if surface.bitmask is None else _host(surface.bitmask)
    bitmasks: list[np.ndarray | None] = []
    givens: list[np.ndarray | None] = []
    owners: list[np.ndarray] = []
    for rows, row_indices, context_rows in parts:
        num_rows = int(rows.shape[0])
        bitmask = given = None
        if host_given is not None and row_indices.size:
            given = host_given
            if given.shape[0] == row_indices.size == num_rows and np.array_equal(
                row_indices, context_rows
            ) and np.array_equal(row_indices, np.arange(num_rows)):
                bitmask = given = np.ascontiguousarray(given, dtype=np.int32)
            else:
                bitmask = np.full((num_rows, given.shape[1]), -1, dtype=np.int32)
                bitmask[row_indices] = given[context_rows]
        bitmasks.append(bitmask)
        givens.append(given)
        owners.append(contexts.requests[context_rows] if row_indices.size else row_indices)
    row_ids: list[dict[int, np.ndarray]] = [{} for _ in parts]
    row_values: list[dict[int, np.ndarray]] = [{} for _ in parts]
    requests = np.unique(np.concatenate(owners)) if owners else np.zeros(0, np.int64)
    for b in requests.tolist():
        if not surface.request_adjusts(b):
            continue
        chosen = []
        for number, (rows, row_indices, context_rows) in enumerate(parts):
            mine = owners[number] == b
            indices, sources = row_indices[mine], context_rows[mine]
            if surface.allowed[b] is not None and indices.size:
                words = _allowed_words(surface.allowed[b], int(rows.shape[1]))
                if bitmasks[number] is None:
                    bitmasks[number] = np.full((rows.shape[0], words.size), -1, np.int32)
                elif bitmasks[number] is givens[number]:
                    # The caller's mask is not written.
                    bitmasks[number] = np.array(bitmasks[number], copy=True)
                bitmasks[number][indices] &= words[None, :]
            chosen.append((rows, indices, sources, bitmasks[number]))
        columns, blocks = _request_entries(chosen, contexts, surface, b, host_given, xp)
        for number, ((_, indices, _, _), block) in enumerate(zip(chosen, blocks)):
            for n, row in enumerate(indices.tolist()):
                row_ids[number][row] = columns
                row_values[number][row] = block[n]
    found = []
    for number, (rows, _, _) in enumerate(parts):
        ids, values, dtype = row_ids[number], row_values[number], rows.dtype
        if not ids:
            found.append(_on_backend(RowAdjustments(
                bitmasks[number], None, np.zeros(0, np.int64), np.zeros(0, dtype)
            ), xp, surface.bitmask if bitmasks[number] is host_given else None))
            continue
        counts = np.zeros(rows.shape[0], dtype=np.int64)
        for row, entries in ids.items():
            counts[row] = entries.size
        offsets = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        ordered = sorted(ids)
        found.append(_on_backend(RowAdjustments(
            bitmasks[number],
            offsets,
            np.concatenate([ids[row] for row in ordered]).astype(np.int64),
            np.concatenate([values[row] for row in ordered]).astype(dtype, copy=False),
        ), xp, surface.bitmask if bitmasks[number] is host_given else None))
    return found


def _on_backend(found: RowAdjustments, xp: Any, given: Any) -> RowAdjustments:
    """``found`` (host arrays) on ``xp``'s device; ``given``: the call's own bitmask, already
    there, when ``found`` holds it unchanged."""
    if xp is np:
        return found
    bitmask = found.bitmask
    if given is not None:
        bitmask = xp.ascontiguousarray(given, dtype=xp.int32)
    elif bitmask is not None:
        bitmask = xp.asarray(bitmask)
    return RowAdjustments(
        bitmask,
        None if found.offsets is None else xp.asarray(found.offsets),
        xp.asarray(found.ids),
        xp.asarray(found.values),
    )


def _request_entries(
    parts: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray | None]],
    contexts: Any,
    surface: Any,
    b: int,
    given: np.ndarray | None,
    xp: Any,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Request ``b``'s touched columns (sorted) and their adjusted values, ``[n, C]`` for
    each part ``(rows, indices, context rows, bitmask)``, by the steps of
    ``surface._adjust_request`` on the gathered columns of all its rows together (on the
    host: CuPy rows are gathered on the device and the block brought over; ``given`` is
    the call's bitmask on the host, or None).

    The penalties run over every touched column: a column outside the context has no
    count and was not seen, and there the repetition keeps the value and the frequency
    and presence subtract 0, which leaves every value as it is."""
    dtype = parts[0][0].dtype
    vocab_size = int(parts[0][0].shape[1])
    minus_infinity = dtype.type(-np.inf)
    empty = np.zeros(0, dtype=np.int64)
    sizes = [int(indices.size) for _, indices, _, _ in parts]
    sources = np.concatenate([part[2] for part in parts])
    output = surface.outputs[b]
    output_tokens, output_times = empty, empty
    if output is not None:
        output_tokens, output_times = np.unique(output, return_counts=True)
    repetition = surface.repetition[b] != 1.0
    frequency = surface.frequency[b] != 0.0 or surface.presence[b] != 0.0
    prompt = empty
    if repetition and surface.prompts[b] is not None:
        prompt = np.unique(surface.prompts[b])
    prefixes = [contexts.prefixes[source] for source in sources.tolist()]
    minimum = surface.min_tokens[b] > 0 and surface.stops[b] is not None
    parts_of_columns = []
    if surface.bias[b] is not None:
        parts_of_columns.append(surface.bias[b][0])
    words = surface.bad_words[b] or ()
    parts_of_columns.extend(word[-1:] for word in words)
    if minimum:
        parts_of_columns.append(surface.stops[b])
    if repetition or frequency:
        parts_of_columns.extend([output_tokens, prompt, *prefixes])
    columns = np.unique(np.concatenate(parts_of_columns)) if parts_of_columns else empty
    if not columns.size:
        return columns, [np.zeros((size, 0), dtype=dtype) for size in sizes]
    gathered = []
    for rows, indices, _, _ in parts:
        if rows.flags.c_contiguous:
            # One take from the flat rows (a view): a 2-D fancy index costs a few times more.
            flat = indices[:, None] * vocab_size + columns
            taken = rows.reshape(-1).take(flat if xp is np else xp.asarray(flat))
        elif xp is np:
            taken = rows[indices[:, None], columns[None, :]]
        else:
            taken = rows[xp.asarray(indices)[:, None], xp.asarray(columns)[None, :]]
        gathered.append(_host(taken))
    block = np.concatenate(gathered) if len(gathered) > 1 else gathered[0]
    if given is not None:
        # The call's bitmask at these columns (the allowed ids come after the bias).
        host = given[sources[:, None], (columns // 32)[None, :]]
        bits = ((host >> (columns % 32).astype(np.int32)) & 1).astype(bool)
        block = np.where(bits, block, minus_infinity)
    if surface.bias[b] is not None:
        ids, bias = surface.bias[b]
        block[:, np.searchsorted(columns, ids)] += bias.astype(dtype)[None, :]
    if surface.allowed[b] is not None:
        block[:, ~np.isin(columns, surface.allowed[b])] = minus_infinity
    if words or minimum:
        stops = surface.stops[b]
        whole_rows = [(rows, int(row), bitmask) for rows, indices, _, bitmask in parts
                      for row in indices.tolist()]
        for n, prefix in enumerate(prefixes):
            context = prefix if output is None else np.concatenate([output, prefix])
            values = block[n]
            for word in words:
                head = word[:-1]
                if head.size <= context.size and np.array_equal(
                    context[context.size - head.size:], head
                ):
                    values[np.searchsorted(columns, int(word[-1]))] = minus_infinity
            if minimum and context.size < surface.min_tokens[b]:
                # vLLM's rule: the stops stay possible when nothing else is: a gathered
                # column other than a stop above -inf, or an entry outside them above -inf
                # and allowed (the stops are among the columns).
                rows, row, bitmask = whole_rows[n]
                here = (values > minus_infinity) & ~np.isin(columns, stops)
                if here.any() or _possible_elsewhere(rows, row, bitmask, columns, xp):
                    values[np.searchsorted(columns, stops)] = minus_infinity
    if repetition or frequency:
        counts = np.zeros((sources.size, columns.size), dtype=np.int64)
        if output_tokens.size:
            counts[:, np.searchsorted(columns, output_tokens)] = output_times
        for i, prefix in enumerate(prefixes):
            if prefix.size:
                np.add.at(counts[i], np.searchsorted(columns, prefix), 1)
        if repetition:
            seen = counts > 0
            if prompt.size:
                seen |= np.isin(columns, prompt)[None, :]
            penalty = dtype.type(surface.repetition[b])
            block = np.where(seen, np.where(block > 0, block / penalty, block * penalty), block)
        if frequency and counts.any():
            term = surface.frequency[b] * counts + surface.presence[b] * (counts > 0)
            block = block - term.astype(dtype)
    return columns, np.split(block, np.cumsum(sizes)[:-1])


def _possible_elsewhere(
    rows: Any, row: int, bitmask: np.ndarray | None, columns: np.ndarray, xp: Any
) -> bool:
    """Whether row ``row`` of ``rows`` has an entry outside ``columns`` above -inf and
    allowed by ``bitmask`` (host words, or None): one pass over the row where it lives,
    with the rows' array library (a CuPy row is never copied to the host)."""
    vocab_size = int(rows.shape[1])
    possible = rows[row] > rows.dtype.type(-np.inf)
    if bitmask is not None:
        words = bitmask[row : row + 1]
        at = np.zeros(1, dtype=np.int64)
        if xp is not np:
            words, at = xp.asarray(words), xp.asarray(at)
        possible &= bitmask_allowed(words, at, vocab_size, xp)[0]
    possible[columns if xp is np else xp.asarray(columns)] = False
    return bool(possible.any())
