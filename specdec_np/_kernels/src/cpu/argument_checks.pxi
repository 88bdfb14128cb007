# --------------------------------------------------------------------------------------
# Argument checks.  The kernels index with bounds checks off, so every driver checks its
# shapes and offsets in O(B) before it indexes anything, and each request's token ids
# before a row function uses one as an index.
# --------------------------------------------------------------------------------------

cdef inline int require(bint condition, str what) except -1:
    # O(B) guard: the kernels index with bounds checks off, so inconsistent arguments
    # from a direct caller must stop here rather than in an out-of-bounds read.
    if not condition:
        raise ValueError(f"kernel arguments are inconsistent: {what}")
    return 0


# NumPy arrays are taken by the entries that avoid typed memoryviews (direct_calls.pxi,
# first_tempered_overflow, processed_rows): taking a memoryview costs about half a
# microsecond (a buffer request, a format check, a memoryview object), which a small call
# pays per argument.  take_array checks what a memoryview would, on the array itself.

cdef struct ArrayView:
    # An array's data and its (at most two) dimensions, as take_array found them.
    void* data
    Py_ssize_t rows
    Py_ssize_t columns
    Py_ssize_t itemsize


cdef enum:
    # The kinds of item take_array accepts (bool counts as unsigned: one byte, 0 or 1).
    FLOAT_ITEMS = 0
    SIGNED_ITEMS = 1
    UNSIGNED_ITEMS = 2


cdef int take_array(
    object x, str name, int ndim, int kind, Py_ssize_t itemsize, bint writeable,
    ArrayView* view
) except -1:
    """Fill ``view`` from the NumPy array ``x``, which must have ``ndim`` (1 or 2)
    dimensions, items of ``kind`` and ``itemsize`` bytes (0: 4 or 8), native byte order,
    C-contiguity and, if ``writeable``, be writeable (what a typed memoryview requires)."""
    cdef cnp.ndarray array
    cdef bint kind_matches
    cdef Py_ssize_t size
    if not cnp.PyArray_Check(x):
        raise TypeError(
            f"kernel arguments are inconsistent: {name} must be a NumPy array; found "
            f"{type(x).__name__}"
        )
    array = <cnp.ndarray>x
    if kind == FLOAT_ITEMS:
        kind_matches = cnp.PyArray_ISFLOAT(array)
    elif kind == SIGNED_ITEMS:
        kind_matches = cnp.PyArray_ISSIGNED(array)
    else:
        kind_matches = cnp.PyArray_ISUNSIGNED(array) or cnp.PyArray_ISBOOL(array)
    size = cnp.PyArray_ITEMSIZE(array)
    if (
        cnp.PyArray_NDIM(array) != ndim
        or not kind_matches
        or (size != itemsize if itemsize else (size != 4 and size != 8))
        or not cnp.PyArray_ISNOTSWAPPED(array)
        or not cnp.PyArray_IS_C_CONTIGUOUS(array)
        or (writeable and not cnp.PyArray_ISWRITEABLE(array))
    ):
        raise ValueError(
            f"kernel arguments are inconsistent: {name} must be a native, C-contiguous"
            f"{', writeable' if writeable else ''} array of {ndim} dimension(s) with "
            f"{('float', 'int', 'uint')[kind]}{8 * itemsize if itemsize else '32/64'} "
            f"items; found {x.dtype} of shape {x.shape}, C-contiguous "
            f"{bool(cnp.PyArray_IS_C_CONTIGUOUS(array))}, writeable "
            f"{bool(cnp.PyArray_ISWRITEABLE(array))}"
        )
    view.data = cnp.PyArray_DATA(array)
    view.rows = cnp.PyArray_DIM(array, 0)
    view.columns = cnp.PyArray_DIM(array, 1) if ndim == 2 else 1
    view.itemsize = size
    return 0


cdef Py_ssize_t require_offsets_at(
    const int64_t* draft_offsets, Py_ssize_t count, Py_ssize_t B, Py_ssize_t T
) except -1:
    """Check that the ``count`` offsets at ``draft_offsets`` are ``0 = offsets[0] <= ... <=
    offsets[B] = T``, in O(B); return the largest k_b."""
    cdef Py_ssize_t b, k_b, max_k = 0
    require(count == B + 1, "draft_offsets must have B + 1 entries")
    require(draft_offsets[0] == 0 and draft_offsets[B] == T, "draft_offsets must span [0, T]")
    for b in range(B):
        k_b = draft_offsets[b + 1] - draft_offsets[b]
        require(k_b >= 0, "draft_offsets must not decrease")
        max_k = k_b if k_b > max_k else max_k
    return max_k


cdef Py_ssize_t require_offsets(
    const int64_t[::1] draft_offsets, Py_ssize_t B, Py_ssize_t T
) except -1:
    """:func:`require_offsets_at` on a memoryview."""
    if draft_offsets.shape[0] == 0:
        return require_offsets_at(NULL, 0, B, T)
    return require_offsets_at(&draft_offsets[0], draft_offsets.shape[0], B, T)


cdef inline Py_ssize_t invalid_id_column(
    const token_id_t* draft_ids, int64_t bonus_id, Py_ssize_t k, int64_t V
) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(k):
        if draft_ids[i] < 0 or draft_ids[i] >= V:
            return i
    if bonus_id < 0 or bonus_id >= V:
        return k
    return -1


def first_invalid_id(
    const token_id_t[::1] draft_token_ids,
    const token_id_t[::1] bonus_token_ids,
    const int64_t[::1] draft_offsets,
    int64_t vocab_size,
):
    """The first token id outside ``[0, vocab_size)``, in request order.

    The Python layer calls this before any uniform is drawn, so that a bad id fails a
    call without moving a generator; the drivers check again before they index.

    Parameters
    ----------
    draft_token_ids : int32 or int64 [T]
    bonus_token_ids : same dtype [B]
    draft_offsets : int64 [B + 1]
        As in :func:`verify_chains`.
    vocab_size : int

    Returns
    -------
    tuple of int or None
        ``(request, column)`` (column ``k_b`` is the bonus id), or None if every id is valid.
    """
    cdef Py_ssize_t B = bonus_token_ids.shape[0]
    cdef Py_ssize_t T = draft_token_ids.shape[0]
    cdef Py_ssize_t b, bad = -1
    cdef const token_id_t* ids_base = &draft_token_ids[0] if T > 0 else NULL
    require_offsets(draft_offsets, B, T)
    with nogil:
        for b in range(B):
            bad = invalid_id_column(
                ids_base + draft_offsets[b] if ids_base != NULL else ids_base,
                bonus_token_ids[b], draft_offsets[b + 1] - draft_offsets[b], vocab_size,
            )
            if bad >= 0:
                break
    return (b, bad) if bad >= 0 else None


cdef bint adjusted_largest(
    const probability_t* row, Py_ssize_t V, const RowAdjust* adjust, Py_ssize_t r,
    Py_ssize_t first, Py_ssize_t last, probability_t* largest
) noexcept nogil:
    """The largest finite entry of row ``r`` adjusted, into ``largest``, without making
    the row, where one read of the raw row decides it: when the raw row's first maximum is
    finite, allowed by the bitmask and not overridden (it then survives, and no surviving
    raw entry exceeds it), or when the raw row has nothing above -inf (no raw entry
    survives finite), the answer is the larger of it and the finite overrides.  False
    otherwise (a +inf entry, a maximum masked or overridden): the caller makes the row."""
    cdef Py_ssize_t y = row_argmax(row, V), e
    cdef probability_t best = row[y], value
    cdef const probability_t* values = <const probability_t*>adjust.values
    if best == INFINITY:
        return False
    if best > -INFINITY:
        if adjust.bitmask != NULL and not (
            (<uint32_t>adjust.bitmask[r * adjust.words + y // MASK_WORD_BITS]
             >> (y % MASK_WORD_BITS)) & 1
        ):
            return False
        for e in range(first, last):
            if adjust.ids[e] == y:
                return False
    else:
        best = -INFINITY
    for e in range(first, last):
        value = values[e]
        # NaN compares false; +inf is not finite.
        if value > best and value < INFINITY:
            best = value
    largest[0] = best
    return True


cdef Py_ssize_t tempered_overflow_row(
    const probability_t* rows, Py_ssize_t V, const double* temperature,
    const uint8_t* greedy, const int64_t* counts, int64_t extra, Py_ssize_t B,
    bint skip_lone_rows, const RowAdjust* adjust, probability_t* work
) noexcept nogil:
    """:func:`first_tempered_overflow` on checked arguments: request ``b`` owns
    ``counts[b] + extra`` consecutive rows of ``V`` at ``rows`` (which hold them all);
    with ``adjust`` (NULL: none), each row read is first adjusted into ``work`` (a row of
    V).  ``skip_lone_rows``: a request with no other row than its one extra row is not
    read (the law checks that row, adjusted, as it reads it: the kernels'
    ``finds_overflow``)."""
    cdef Py_ssize_t b, r, i, start = 0, found = -1, first, last
    cdef probability_t divisor, largest, value
    cdef int64_t infinite
    cdef const probability_t* row
    for b in range(B):
        divisor = <probability_t>temperature[b]
        if not greedy[b] and divisor < 1 and not (skip_lone_rows and counts[b] == 0):
            for r in range(start, start + counts[b] + extra):
                row = rows + r * V
                if adjusts_row(adjust, r, &first, &last):
                    if adjusted_largest(row, V, adjust, r, first, last, &largest):
                        if largest > -INFINITY and isinf(largest / divisor):
                            found = r
                            break
                        continue
                    make_adjusted_row(row, V, adjust, r, first, last, work)
                    row = work
                # The vectorised maximum pass of the law (NaN never wins); a row with a
                # +inf entry is scanned again for its largest finite one.
                infinite = 0
                if probability_t is float:
                    specdec_row_max_f(row, V, 1.0, &largest, &infinite)
                else:
                    specdec_row_max_d(row, V, 1.0, &largest, &infinite)
                if infinite:
                    largest = -INFINITY
                    for i in range(V):
                        value = row[i]
                        # NaN compares false; +inf is not finite.
                        if value > largest and value < INFINITY:
                            largest = value
                if largest > -INFINITY and isinf(largest / divisor):
                    found = r
                    break
        if found >= 0:
            break
        start += counts[b] + extra
    return found


cdef Py_ssize_t overflow_row(
    ArrayView* rows, const double* temperature, const uint8_t* greedy, const int64_t* counts,
    int64_t extra, Py_ssize_t B, bint skip_lone_rows=False, const RowAdjust* adjust=NULL,
    void* work=NULL
) noexcept:
    """:func:`tempered_overflow_row` on checked rows of either float dtype."""
    cdef Py_ssize_t found
    with nogil:
        if rows.itemsize == 4:
            found = tempered_overflow_row(
                <const float*>rows.data, rows.columns, temperature, greedy, counts, extra, B,
                skip_lone_rows, adjust, <float*>work,
            )
        else:
            found = tempered_overflow_row(
                <const double*>rows.data, rows.columns, temperature, greedy, counts, extra, B,
                skip_lone_rows, adjust, <double*>work,
            )
    return found


def first_tempered_overflow(
    object rows,
    object temperature,
    object greedy,
    object rows_per_request,
    object adjustments=None,
):
    """The first row whose largest finite logit overflows when divided by its request's
    temperature in the rows' dtype, or -1 (the test of
    ``specdec_np._layouts.sampling.check_tempered_rows``, which words the message).

    Only rows of requests that are not greedy and whose temperature, cast to the rows'
    dtype, is below 1 are read: one pass each, NaN and infinities skipped.

    Parameters
    ----------
    rows : float32 or float64 [R, V], C-contiguous
        Logits rows, request by request.
    temperature : float64 [B]
    greedy : bool or uint8 [B]
        Non-zero for a request that reads its rows raw.
    rows_per_request : int64 [B]
        How many consecutive rows each request owns (summing to at most ``R``).
    adjustments : tuple, optional
        The sampling surface's adjustments of the rows, as
        :func:`verify_chains_direct` takes them: the test reads each row adjusted.
    """
    cdef ArrayView row_view, temperature_view, greedy_view, count_view
    cdef RowAdjust adjust
    cdef const int64_t* counts
    cdef Py_ssize_t B, b, total = 0, found
    cdef void* work
    take_array(rows, "rows", 2, FLOAT_ITEMS, 0, False, &row_view)
    take_array(temperature, "temperature", 1, FLOAT_ITEMS, 8, False, &temperature_view)
    take_array(greedy, "greedy", 1, UNSIGNED_ITEMS, 1, False, &greedy_view)
    take_array(rows_per_request, "rows_per_request", 1, SIGNED_ITEMS, 8, False, &count_view)
    B = temperature_view.rows
    counts = <const int64_t*>count_view.data
    require(greedy_view.rows == B and count_view.rows == B,
            "temperature, greedy and rows_per_request must have B entries")
    for b in range(B):
        require(counts[b] >= 0, "rows_per_request must be >= 0")
        total += counts[b]
    require(total <= row_view.rows, "rows_per_request must sum to at most R")
    if adjustments is None:
        return overflow_row(
            &row_view, <const double*>temperature_view.data, <const uint8_t*>greedy_view.data,
            counts, 0, B,
        )
    take_adjustments(
        adjustments, "adjustments", row_view.rows, row_view.columns, row_view.itemsize, &adjust
    )
    work = malloc(row_view.columns * row_view.itemsize)
    if work == NULL:
        raise MemoryError("no memory for the adjusted row")
    found = overflow_row(
        &row_view, <const double*>temperature_view.data, <const uint8_t*>greedy_view.data,
        counts, 0, B, False, &adjust, work,
    )
    free(work)
    return found
