# --------------------------------------------------------------------------------------
# The processed law of logits rows, materialised: the rows ``specdec_np.processed_probs``
# returns, written by the very functions the row readers use, so they are the bits the
# verifiers draw from.
# --------------------------------------------------------------------------------------

cdef void process_row(
    const probability_t* logits, Py_ssize_t V, const double* sampling,
    specdec_law_scratch* scratch, probability_t* out
) noexcept nogil:
    # The law lives in this frame, its scratch on the heap: one per thread of the loop.  A
    # law whose kept set lies within its gathered survivors (top-k on) writes them alone and
    # zeros; otherwise it keeps its weights in ``out`` when it can, divided there.
    cdef specdec_row_law law
    cdef bint undivided
    cdef probability_t* weights = NULL if top_k_filters(<int64_t>sampling[1], V) else out
    if probability_t is float:
        undivided = specdec_row_law_f(
            logits, V, <float>sampling[0], <int64_t>sampling[1], sampling[2], sampling[3],
            <int>sampling[4], scratch, weights, &law,
        )
        if scratch.survivors >= 0:
            specdec_survivors_row_f(scratch, &law, V, out)
        elif undivided:
            specdec_law_from_weights_f(out, V, law.normaliser)
        else:
            specdec_law_materialise_f(logits, V, <float>sampling[0], &law, out)
    else:
        undivided = specdec_row_law_d(
            logits, V, sampling[0], <int64_t>sampling[1], sampling[2], sampling[3],
            <int>sampling[4], scratch, weights, &law,
        )
        if scratch.survivors >= 0:
            specdec_survivors_row_d(scratch, &law, V, out)
        elif undivided:
            specdec_law_from_weights_d(out, V, law.normaliser)
        else:
            specdec_law_materialise_d(logits, V, sampling[0], &law, out)


def processed_rows(
    object logits,
    object sampling,
    object out,
    int num_threads,
    int row_threads=1,
    object adjustments=None,
):
    """Write the processed law of every logits row.

    Parameters
    ----------
    logits : float32 or float64 [N, V], C-contiguous
    sampling : float64 [N, 5]
        Per row ``(temperature, top_k, top_p, min_p, filter order code)``, top-k 0 = off,
        temperature > 0 (``specdec_np._runtime.contract.FILTER_ORDER_CODES``).
    out : same dtype as ``logits`` [N, V]
        Written: row ``i``'s law (all zeros for a row without a finite maximum).
    num_threads : int
        Threads for the loop over rows.
    row_threads : int
        Threads for the passes over one row when the loop over rows runs on one thread
        (``num_threads`` <= 1); 0 or 1: one.  The bits of one thread either way.
    adjustments : tuple, optional
        The sampling surface's row settings, ``(bitmask, offsets, ids, values)`` as
        :func:`verify_chains_direct` takes them for its target rows: a row they touch is
        adjusted into a working row of its thread before its law is computed (``logits``
        is not written).

    Notes
    -----
    The arrays are NumPy arrays, taken without typed memoryviews (``take_array``).
    """
    cdef ArrayView rows, table, written
    cdef RowAdjust adjust
    cdef const RowAdjust* adjusting = NULL
    take_array(logits, "logits", 2, FLOAT_ITEMS, 0, False, &rows)
    take_array(sampling, "sampling", 2, FLOAT_ITEMS, 8, False, &table)
    take_array(out, "out", 2, FLOAT_ITEMS, rows.itemsize, True, &written)
    require(rows.columns >= 1, "the vocabulary must not be empty")
    require(table.rows == rows.rows and table.columns == 5, "sampling must be [N, 5]")
    require(written.rows == rows.rows and written.columns == rows.columns, "out must be [N, V]")
    if adjustments is not None:
        take_adjustments(
            adjustments, "adjustments", rows.rows, rows.columns, rows.itemsize, &adjust
        )
        adjusting = &adjust
    if rows.rows == 0:
        return
    if rows.itemsize == 4:
        process_rows(
            <const float*>rows.data, <const double*>table.data, <float*>written.data,
            rows.rows, rows.columns, num_threads, row_threads, adjusting,
        )
    else:
        process_rows(
            <const double*>rows.data, <const double*>table.data, <double*>written.data,
            rows.rows, rows.columns, num_threads, row_threads, adjusting,
        )


cdef inline void process_adjusted_row(
    const probability_t* logits, Py_ssize_t V, const double* sampling,
    specdec_law_scratch* scratch, probability_t* out, const RowAdjust* adjust, Py_ssize_t i,
    probability_t* work
) noexcept nogil:
    """:func:`process_row` of row ``i``, adjusted into ``work`` first where ``adjust``
    (NULL: none) touches it."""
    cdef Py_ssize_t start, stop
    if adjusts_row(adjust, i, &start, &stop):
        make_adjusted_row(logits, V, adjust, i, start, stop, work)
        logits = work
    process_row(logits, V, sampling, scratch, out)


cdef int process_rows(
    const probability_t* logits, const double* sampling, probability_t* out, Py_ssize_t N,
    Py_ssize_t V, int num_threads, int row_threads, const RowAdjust* adjust
) except -1:
    """:func:`processed_rows` on checked arrays (``N >= 1``); with ``adjust``, each thread
    adjusts the rows it touches in a working row of its own."""
    cdef Py_ssize_t i
    cdef specdec_law_scratch* scratch = NULL
    cdef specdec_law_scratch* serial_scratch = NULL
    cdef probability_t* work = NULL
    cdef size_t work_bytes = V * sizeof(probability_t) if adjust != NULL else 0
    cdef int failed = 0
    if num_threads <= 1:
        # One thread, outside any OpenMP region, as in verify_chains: row threads' teams are
        # never nested in an inactive region (libgomp would start new threads for each).
        serial_scratch = take_law_scratch(True, row_threads)
        if work_bytes:
            work = <probability_t*>malloc(work_bytes)
        if serial_scratch == NULL or (work_bytes and work == NULL):
            give_back_law_scratch(serial_scratch)
            free(work)
            raise MemoryError("processed_rows: the law's scratch could not be allocated")
        with nogil:
            for i in range(N):
                process_adjusted_row(
                    logits + i * V, V, sampling + 5 * i, serial_scratch, out + i * V, adjust, i,
                    work,
                )
        give_back_law_scratch(serial_scratch)
        free(work)
        return 0
    # Each thread of the team allocates its law scratch (and working row) once for the
    # call.  Its rows run on that thread alone (specdec_row_threads: no team is nested in a
    # parallel loop).
    with nogil, parallel(num_threads=num_threads):
        scratch = new_law_scratch(True, 1)
        work = <probability_t*>malloc(work_bytes) if work_bytes else NULL
        # Every thread meets the loop (a worksharing loop that some skipped would hang).
        for i in prange(N, schedule="dynamic"):
            if scratch == NULL or (work_bytes and work == NULL):
                failed += 1
            else:
                process_adjusted_row(
                    logits + i * V, V, sampling + 5 * i, scratch, out + i * V, adjust, i, work
                )
        free(scratch)
        free(work)
    if failed:
        raise MemoryError("processed_rows: the law's scratch could not be allocated")
    return 0
