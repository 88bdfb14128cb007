# --------------------------------------------------------------------------------------
# Row readers: how a row function sees its rows.  Probabilities are read as they are;
# logits through the processed law of their row (temperature, min-p, top-k, top-p),
# computed once per row read and materialised only where a whole row is scanned.
# --------------------------------------------------------------------------------------

cdef enum:
    # Which rows of a request are logits, when it has sampling parameters (bit flags).
    TARGET_LOGITS = 1
    DRAFT_LOGITS = 2


cdef inline void init_request(
    Request* request, Py_ssize_t k, Py_ssize_t V, const double* uniforms,
    const double* parameters, bint causal, const double* sampling, int row_forms,
    probability_t* scratch, specdec_law_scratch* law_scratch
) noexcept nogil:
    """Fill a Request; ``sampling`` (temperature, top-k, top-p, min-p, filter order code) is
    NULL for probability rows, and ``scratch`` (two rows of V) and ``law_scratch`` (the
    thread's, from :func:`new_law_scratch`) are then unused; with it, ``row_forms`` says
    which rows are logits (``TARGET_LOGITS``, ``DRAFT_LOGITS``), the others being
    probabilities used as they are."""
    request.k = k
    request.V = V
    request.uniforms = uniforms
    request.parameters = parameters
    request.causal = causal
    request.logits = sampling != NULL and (row_forms & TARGET_LOGITS) != 0
    request.draft_logits = sampling != NULL and (row_forms & DRAFT_LOGITS) != 0
    request.target_law_row = -1
    request.draft_law_row = -1
    request.target_weights_row = -1
    request.draft_weights_row = -1
    request.target_handed_out = False
    request.draft_handed_out = False
    request.target_adjust = NULL
    request.draft_adjust = NULL
    request.target_adjusted_row = -1
    request.draft_adjusted_row = -1
    if sampling != NULL:
        request.temperature = sampling[0]
        request.top_k = <int64_t>sampling[1]
        request.top_p = sampling[2]
        request.min_p = sampling[3]
        request.filter_order = <int>sampling[4]
        request.target_scratch = scratch
        request.draft_scratch = scratch + V
        request.law_scratch = law_scratch


cdef enum:
    # Bit j of a bitmask word allows token 32 w + j.
    MASK_WORD_BITS = 32


cdef void adjusted_row(
    const probability_t* source, Py_ssize_t V, const int32_t* words, const int64_t* ids,
    const probability_t* values, Py_ssize_t count, probability_t* out
) noexcept nogil:
    """Row ``source`` with the surface's adjustments into ``out``: each token whose bit
    in ``words`` (NULL: none) is clear set to -inf, then ``out[ids[e]] = values[e]``.  A
    copy of the row (vectorised), then only the words that are not all ones are visited."""
    cdef Py_ssize_t w, j, base, full = V // MASK_WORD_BITS
    cdef uint32_t word
    cdef probability_t minus_infinity = -INFINITY
    memcpy(out, source, V * sizeof(probability_t))
    if words != NULL:
        for w in range(full):
            word = <uint32_t>words[w]
            if word == <uint32_t>0xFFFFFFFF:
                continue
            base = w * MASK_WORD_BITS
            if word == 0:
                for j in range(MASK_WORD_BITS):
                    out[base + j] = minus_infinity
            else:
                for j in range(MASK_WORD_BITS):
                    if not (word >> j) & 1:
                        out[base + j] = minus_infinity
        base = full * MASK_WORD_BITS
        if base < V:
            word = <uint32_t>words[full]
            for j in range(V - base):
                if not (word >> j) & 1:
                    out[base + j] = minus_infinity
    for j in range(count):
        out[ids[j]] = values[j]


cdef inline bint adjusts_row(
    const RowAdjust* adjust, Py_ssize_t row, Py_ssize_t* start, Py_ssize_t* stop
) noexcept nogil:
    """Whether ``adjust`` (NULL: none) changes row ``row`` of its rows array; its
    overrides are entries ``start[0] .. stop[0]``."""
    start[0] = 0
    stop[0] = 0
    if adjust == NULL:
        return False
    if adjust.offsets != NULL:
        start[0] = adjust.offsets[row]
        stop[0] = adjust.offsets[row + 1]
    return adjust.bitmask != NULL or start[0] < stop[0]


cdef inline void make_adjusted_row(
    const probability_t* source, Py_ssize_t V, const RowAdjust* adjust, Py_ssize_t row,
    Py_ssize_t start, Py_ssize_t stop, probability_t* out
) noexcept nogil:
    """Row ``row`` of ``adjust``'s rows array (at ``source``) adjusted into ``out``."""
    adjusted_row(
        source, V, NULL if adjust.bitmask == NULL else adjust.bitmask + row * adjust.words,
        adjust.ids + start, <const probability_t*>adjust.values + start, stop - start, out,
    )


cdef inline void bind_adjustments(
    Request* request, const RowAdjust* target_adjust, const RowAdjust* draft_adjust,
    Py_ssize_t target_first_row, Py_ssize_t draft_first_row, probability_t* adjusted
) noexcept nogil:
    """Hand a request the sampling surface's adjustments of its logits rows (NULL: none),
    which index its rows from ``target_first_row`` and ``draft_first_row``; the adjusted
    rows are made in ``adjusted``, the thread's two rows of V."""
    if request.logits and target_adjust != NULL:
        request.target_adjust = target_adjust
        request.target_first_row = target_first_row
        request.target_adjusted = adjusted
    if request.draft_logits and draft_adjust != NULL:
        request.draft_adjust = draft_adjust
        request.draft_first_row = draft_first_row
        request.draft_adjusted = adjusted + request.V


cdef inline const probability_t* logits_row(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft
) noexcept nogil:
    """Row ``i`` of a request's logits rows as its law reads it: the row itself, or,
    where the sampling surface adjusts it (a chain call's ``RowAdjust``), the adjusted
    row in the thread's adjusted row of its kind (made when the row is first read, and
    again when another row of its kind was made since).  ``rows`` must not be NULL."""
    cdef const RowAdjust* adjust = request.draft_adjust if draft else request.target_adjust
    cdef Py_ssize_t V = request.V
    cdef Py_ssize_t row, start, stop
    cdef probability_t* out
    if adjust == NULL:
        return rows + i * V
    row = (request.draft_first_row if draft else request.target_first_row) + i
    if not adjusts_row(adjust, row, &start, &stop):
        return rows + i * V
    if draft:
        out = <probability_t*>request.draft_adjusted
        if request.draft_adjusted_row == i:
            return out
        request.draft_adjusted_row = i
    else:
        out = <probability_t*>request.target_adjusted
        if request.target_adjusted_row == i:
            return out
        request.target_adjusted_row = i
    make_adjusted_row(rows + i * V, V, adjust, row, start, stop, out)
    return out


cdef inline bint top_k_filters(int64_t top_k, Py_ssize_t V) noexcept nogil:
    """Whether top-k drops entries: then a law can find its kept set among top-k's
    survivors alone, without an exponential per entry (``specdec_survivors_row``)."""
    return 0 < top_k < V


cdef inline bint compute_row_law(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft,
    probability_t* weights
) noexcept nogil:
    """Row ``i``'s law into the request's cache; with ``weights`` (a row of V, or NULL),
    whether the row's weights were kept there (see ``specdec_row_law``)."""
    cdef specdec_row_law* law = &request.draft_law if draft else &request.target_law
    cdef Py_ssize_t V = request.V
    cdef int stored
    cdef const probability_t* row = logits_row(request, rows, i, draft)
    if probability_t is float:
        stored = specdec_row_law_f(
            row, V, <float>request.temperature, request.top_k, request.top_p,
            request.min_p, request.filter_order, request.law_scratch, weights, law,
        )
    else:
        stored = specdec_row_law_d(
            row, V, request.temperature, request.top_k, request.top_p,
            request.min_p, request.filter_order, request.law_scratch, weights, law,
        )
    if draft:
        request.draft_law_row = i
        request.draft_weights_row = i if stored != 0 else -1
    else:
        request.target_law_row = i
        request.target_weights_row = i if stored != 0 else -1
    return stored != 0


cdef inline const specdec_row_law* row_law(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft
) noexcept nogil:
    # A law for reads of single entries keeps its weights in the scratch row for a later
    # scan of the same row (a rejected row's residual), but only while no scratch row of
    # its kind was handed out: until then nothing else can be using it.
    cdef Py_ssize_t cached = request.draft_law_row if draft else request.target_law_row
    cdef bint handed_out = request.draft_handed_out if draft else request.target_handed_out
    cdef probability_t* weights = NULL
    if cached != i:
        if not handed_out and rows != NULL:
            weights = <probability_t*>(
                request.draft_scratch if draft else request.target_scratch
            )
        compute_row_law(request, rows, i, draft, weights)
    return &request.draft_law if draft else &request.target_law


cdef inline double read_probability(
    Request* request, const probability_t* rows, Py_ssize_t i, Py_ssize_t y, bint draft
) noexcept nogil:
    cdef const specdec_row_law* law
    cdef Py_ssize_t V = request.V
    if not (request.draft_logits if draft else request.logits):
        return rows[i * V + y]
    law = row_law(request, rows, i, draft)
    if probability_t is float:
        return specdec_law_probability_f(
            logits_row(request, rows, i, draft), y, <float>request.temperature, law
        )
    else:
        return specdec_law_probability_d(
            logits_row(request, rows, i, draft), y, request.temperature, law
        )


cdef inline double target_probability(
    Request* request, const probability_t* target, Py_ssize_t i, Py_ssize_t y
) noexcept nogil:
    return read_probability(request, target, i, y, False)


cdef inline double draft_probability(
    Request* request, const probability_t* draft, Py_ssize_t i, Py_ssize_t y
) noexcept nogil:
    # Negative and NaN draft entries count as 0 (so u * q < p never accepts p <= 0).
    cdef double q_y
    if draft == NULL:
        return 1.0
    q_y = read_probability(request, draft, i, y, True)
    return q_y if q_y > 0.0 else 0.0


cdef inline const probability_t* undivided_probability_row(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft,
    double* normaliser
) noexcept nogil:
    """Row ``i`` as :func:`probability_row` gives it, except that a row whose law kept the
    weights of its exponential pass comes back undivided: then ``normaliser[0]`` is what
    to divide them by (``specdec_law_from_weights``, which a caller may run block by block
    while the block is in cache), else 0 (the row is probabilities already).  From the
    first call on, the scratch row of its kind is the caller's."""
    cdef const specdec_row_law* law
    cdef Py_ssize_t V = request.V
    cdef Py_ssize_t cached = request.draft_law_row if draft else request.target_law_row
    cdef Py_ssize_t weights_row
    cdef probability_t* scratch
    normaliser[0] = 0.0
    if rows == NULL or not (request.draft_logits if draft else request.logits):
        return rows + i * V if rows != NULL else rows
    scratch = <probability_t*>(request.draft_scratch if draft else request.target_scratch)
    if draft:
        request.draft_handed_out = True
    else:
        request.target_handed_out = True
    weights_row = request.draft_weights_row if draft else request.target_weights_row
    if (cached == i and weights_row == i) or (
        cached != i and compute_row_law(request, rows, i, draft, scratch)
    ):
        law = &request.draft_law if draft else &request.target_law
        if draft:
            request.draft_weights_row = -1
        else:
            request.target_weights_row = -1
        normaliser[0] = law.normaliser
        return scratch
    if draft:
        request.draft_weights_row = -1
    else:
        request.target_weights_row = -1
    law = row_law(request, rows, i, draft)
    if probability_t is float:
        specdec_law_materialise_f(
            logits_row(request, rows, i, draft), V, <float>request.temperature, law, scratch
        )
    else:
        specdec_law_materialise_d(
            logits_row(request, rows, i, draft), V, request.temperature, law, scratch
        )
    return scratch


cdef inline void divide_weights(
    probability_t* weights, Py_ssize_t count, double normaliser
) noexcept nogil:
    """The processed row from ``count`` weights kept by the law, in place (nothing when
    ``normaliser`` is 0: the row is probabilities already)."""
    if normaliser == 0.0:
        return
    if probability_t is float:
        specdec_law_from_weights_f(weights, count, normaliser)
    else:
        specdec_law_from_weights_d(weights, count, normaliser)


cdef inline const probability_t* probability_row(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft
) noexcept nogil:
    """Row ``i`` as probabilities: the row itself, or its processed law written to the
    thread's scratch row (NULL stays NULL: a point-mass draft).  The weights of the law's
    exponential pass are divided in the scratch row where they are (a law computed now, or
    one that a single-entry read kept there): one exponential per entry for the law and the
    row together.  From the first call on, the scratch row of its kind is the caller's."""
    cdef double normaliser
    cdef const probability_t* row = undivided_probability_row(
        request, rows, i, draft, &normaliser
    )
    divide_weights(<probability_t*>row, request.V, normaliser)
    return row


# --------------------------------------------------------------------------------------
# Row scans: argmax and entropy (typical acceptance, greedy), residual mass (block
# verification), in fixed blocks so that probabilities and logits give the same bits.
# --------------------------------------------------------------------------------------

cdef Py_ssize_t locate_first(
    const probability_t* row, Py_ssize_t start, Py_ssize_t stop, probability_t value
) noexcept nogil:
    cdef Py_ssize_t y
    for y in range(start, stop):
        if row[y] == value:
            return y
    return start


cdef inline Py_ssize_t row_argmax(const probability_t* row, Py_ssize_t V) noexcept nogil:
    """The first index of the maximum of ``row[:V]``, in one read of the row.  NaN entries
    never win; a row with no entry above -inf has argmax 0."""
    if probability_t is float:
        return specdec_row_argmax_f(row, V)
    else:
        return specdec_row_argmax_d(row, V)


cdef double entropy_and_argmax(
    const probability_t* row, Py_ssize_t V, Py_ssize_t* argmax
) noexcept nogil:
    """Entropy -sum p ln(p + epsilon) (float64) and, if ``argmax`` is not NULL, the first
    index of the maximum (as :func:`row_argmax` finds it), both in one pass."""
    cdef probability_t best = -1.0 / 0.0
    cdef probability_t block_best
    cdef Py_ssize_t start, stop, best_block_start = 0
    cdef double total = 0.0
    start = 0
    while start < V:
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
        if probability_t is float:
            total += specdec_entropy_max_f(row, start, stop, &block_best)
        else:
            total += specdec_entropy_max_d(row, start, stop, &block_best)
        if block_best > best:
            best = block_best
            best_block_start = start
        start += SCAN_BLOCK
    if argmax != NULL:
        if best > -1.0 / 0.0:
            stop = best_block_start + SCAN_BLOCK if best_block_start + SCAN_BLOCK < V else V
            argmax[0] = locate_first(row, best_block_start, stop, best)
        else:
            argmax[0] = 0
    return -total


cdef inline Py_ssize_t raw_argmax(
    Request* request, const probability_t* rows, Py_ssize_t i
) noexcept nogil:
    # Greedy requests compare raw values (after the sampling surface's adjustments): the
    # argmax of logits is the argmax of any temperature's probabilities.
    return row_argmax(logits_row(request, rows, i, False), request.V)


cdef double row_entropy_and_argmax(
    Request* request, const probability_t* target, Py_ssize_t i, Py_ssize_t* argmax
) noexcept nogil:
    """:func:`entropy_and_argmax` of row ``i``'s law (with the entropy), on the row as
    :func:`probability_row` gives it."""
    return entropy_and_argmax(probability_row(request, target, i, False), request.V, argmax)


cdef double row_residual_total(
    Request* request, const probability_t* target, const probability_t* draft, Py_ssize_t i,
    Py_ssize_t point_mass, double rho
) noexcept nogil:
    """:func:`residual_total` of row ``i`` (q the draft row, or the point mass at
    ``point_mass`` when ``draft`` is NULL), on the rows as :func:`probability_row` gives
    them."""
    cdef const probability_t* p = probability_row(request, target, i, False)
    cdef const probability_t* q = probability_row(request, draft, i, True)
    return residual_total(p, q, point_mass, rho, request.V)
