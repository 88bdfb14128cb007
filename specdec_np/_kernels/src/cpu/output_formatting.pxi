# --------------------------------------------------------------------------------------
# Output formatting: a request's output row, the first failed request, and vLLM's
# _create_output for callers that decided acceptance themselves.
# --------------------------------------------------------------------------------------

cdef inline void write_output_row(
    const token_id_t* draft_ids, Py_ssize_t accepted_length, int64_t last_token,
    Py_ssize_t width, int64_t* out
) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(accepted_length):
        out[i] = draft_ids[i]
    out[accepted_length] = last_token
    for i in range(accepted_length + 1, width):
        out[i] = -1


cdef Py_ssize_t first_failed_row(const int64_t[::1] row_status) noexcept nogil:
    if row_status.shape[0] == 0:
        return -1
    return first_failed_row_at(&row_status[0], row_status.shape[0])


cdef Py_ssize_t first_failed_row_at(const int64_t* row_status, Py_ssize_t B) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(B):
        if row_status[b] != 0:
            return b
    return -1


def create_output(
    const uint8_t[:, ::1] accepted,
    const token_id_t[:, ::1] substitute_token_ids,
    const token_id_t[:, ::1] draft_token_ids,
    const token_id_t[::1] bonus_token_ids,
    int64_t vocab_size,
    int64_t[:, ::1] output,
    int64_t[::1] accepted_lengths,
    int64_t[::1] num_accepted,
    int64_t[::1] row_status,
):
    """Format verified rows: accepted prefix, then substitute or bonus, then -1.

    Parameters
    ----------
    accepted : uint8 [B, k]
        Non-zero where the position's acceptance test passed (not necessarily causal).
    substitute_token_ids, draft_token_ids : int32 or int64 [B, k]
    bonus_token_ids : same dtype [B]
    vocab_size : int
        Ids must lie in ``[0, vocab_size)``; draft and bonus ids are all checked, substitute
        ids where they are emitted.  Pass ``2**63 - 1`` when the vocabulary is unknown.
    output : int64 [B, k+1]
    accepted_lengths, num_accepted, row_status : int64 [B]
        As in :func:`rejection_sample`; a bad emitted substitute id reports column
        ``k + 1 + r`` (``r`` its position).

    Returns
    -------
    int
        The first failed row, or -1.
    """
    cdef Py_ssize_t B = accepted.shape[0]
    cdef Py_ssize_t k = accepted.shape[1]
    cdef Py_ssize_t b, i, r, bad
    cdef int64_t passed
    cdef int64_t last
    require(
        k >= 1 and substitute_token_ids.shape[0] == B and substitute_token_ids.shape[1] == k
        and draft_token_ids.shape[0] == B and draft_token_ids.shape[1] == k
        and bonus_token_ids.shape[0] == B and output.shape[0] == B and output.shape[1] == k + 1
        and accepted_lengths.shape[0] == B and num_accepted.shape[0] == B
        and row_status.shape[0] == B,
        "ids must be [B, k] (k >= 1) and [B], outputs [B, k+1] and [B]",
    )
    with nogil:
        for b in range(B):
            bad = invalid_id_column(&draft_token_ids[b, 0], bonus_token_ids[b], k, vocab_size)
            if bad >= 0:
                row_status[b] = 1 + bad
                continue
            r = k
            passed = 0
            for i in range(k):
                if accepted[b, i]:
                    passed += 1
                elif r == k:
                    r = i
            if r < k:
                last = substitute_token_ids[b, r]
                if last < 0 or last >= vocab_size:
                    row_status[b] = 1 + k + 1 + r
                    continue
            else:
                last = bonus_token_ids[b]
            write_output_row(&draft_token_ids[b, 0], r, last, k + 1, &output[b, 0])
            accepted_lengths[b] = r
            num_accepted[b] = passed
            row_status[b] = 0
    return first_failed_row(row_status)
