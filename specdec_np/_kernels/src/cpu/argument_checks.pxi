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


def first_tempered_overflow(
    const probability_t[:, ::1] rows,
    const double[::1] temperature,
    const uint8_t[::1] greedy,
    const int64_t[::1] rows_per_request,
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
    greedy : uint8 [B]
        Non-zero for a request that reads its rows raw.
    rows_per_request : int64 [B]
        How many consecutive rows each request owns (summing to at most ``R``).
    """
    cdef Py_ssize_t B = temperature.shape[0]
    cdef Py_ssize_t b, total = 0, found
    require(greedy.shape[0] == B and rows_per_request.shape[0] == B,
            "temperature, greedy and rows_per_request must have B entries")
    for b in range(B):
        require(rows_per_request[b] >= 0, "rows_per_request must be >= 0")
        total += rows_per_request[b]
    require(total <= rows.shape[0], "rows_per_request must sum to at most R")
    if B == 0:
        return -1
    with nogil:
        found = tempered_overflow_row(
            &rows[0, 0] if rows.shape[0] > 0 else NULL, rows.shape[1], &temperature[0],
            &greedy[0], &rows_per_request[0], 0, B,
        )
    return found


cdef Py_ssize_t tempered_overflow_row(
    const probability_t* rows, Py_ssize_t V, const double* temperature,
    const uint8_t* greedy, const int64_t* counts, int64_t extra, Py_ssize_t B
) noexcept nogil:
    """:func:`first_tempered_overflow` on checked arguments: request ``b`` owns
    ``counts[b] + extra`` consecutive rows of ``V`` at ``rows`` (which hold them all)."""
    cdef Py_ssize_t b, r, i, start = 0, found = -1
    cdef probability_t divisor, largest, value
    cdef const probability_t* row
    for b in range(B):
        divisor = <probability_t>temperature[b]
        if not greedy[b] and divisor < 1:
            for r in range(start, start + counts[b] + extra):
                row = rows + r * V
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
