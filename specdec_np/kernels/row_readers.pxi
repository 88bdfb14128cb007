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
    """Fill a Request; ``sampling`` (temperature, top-k, top-p, min-p) is NULL for
    probability rows, and ``scratch`` (two rows of V) and ``law_scratch`` (the thread's,
    from :func:`new_law_scratch`) are then unused; with it, ``row_forms`` says which rows
    are logits (``TARGET_LOGITS``, ``DRAFT_LOGITS``), the others being probabilities used
    as they are."""
    request.k = k
    request.V = V
    request.uniforms = uniforms
    request.parameters = parameters
    request.causal = causal
    request.logits = sampling != NULL and (row_forms & TARGET_LOGITS) != 0
    request.draft_logits = sampling != NULL and (row_forms & DRAFT_LOGITS) != 0
    request.target_law_row = -1
    request.draft_law_row = -1
    if sampling != NULL:
        request.temperature = sampling[0]
        request.top_k = <int64_t>sampling[1]
        request.top_p = sampling[2]
        request.min_p = sampling[3]
        request.target_scratch = scratch
        request.draft_scratch = scratch + V
        request.law_scratch = law_scratch


cdef inline const specdec_row_law* row_law(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft
) noexcept nogil:
    cdef specdec_row_law* law = &request.draft_law if draft else &request.target_law
    cdef Py_ssize_t* cached = &request.draft_law_row if draft else &request.target_law_row
    cdef Py_ssize_t V = request.V
    if cached[0] != i:
        if probability_t is float:
            specdec_row_law_f(
                rows + i * V, V, <float>request.temperature, request.top_k, request.top_p,
                request.min_p, request.law_scratch, law,
            )
        else:
            specdec_row_law_d(
                rows + i * V, V, request.temperature, request.top_k, request.top_p,
                request.min_p, request.law_scratch, law,
            )
        cached[0] = i
    return law


cdef inline double read_probability(
    Request* request, const probability_t* rows, Py_ssize_t i, Py_ssize_t y, bint draft
) noexcept nogil:
    cdef const specdec_row_law* law
    cdef Py_ssize_t V = request.V
    if not (request.draft_logits if draft else request.logits):
        return rows[i * V + y]
    law = row_law(request, rows, i, draft)
    if probability_t is float:
        return specdec_law_probability_f(rows + i * V, y, <float>request.temperature, law)
    else:
        return specdec_law_probability_d(rows + i * V, y, request.temperature, law)


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


cdef inline const probability_t* probability_row(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft
) noexcept nogil:
    """Row ``i`` as probabilities: the row itself, or its processed law written to the
    thread's scratch row (NULL stays NULL: a point-mass draft)."""
    cdef const specdec_row_law* law
    cdef Py_ssize_t V = request.V
    cdef probability_t* scratch
    if rows == NULL or not (request.draft_logits if draft else request.logits):
        return rows + i * V if rows != NULL else rows
    law = row_law(request, rows, i, draft)
    scratch = <probability_t*>(request.draft_scratch if draft else request.target_scratch)
    if probability_t is float:
        specdec_law_materialise_f(rows + i * V, V, <float>request.temperature, law, scratch)
    else:
        specdec_law_materialise_d(rows + i * V, V, request.temperature, law, scratch)
    return scratch


cdef inline void process_range(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft, Py_ssize_t start,
    Py_ssize_t stop, probability_t* out
) noexcept nogil:
    """Entries ``start .. stop`` of row ``i``'s processed law (or of the row itself, when
    it holds probabilities), written to ``out[0 ..]``."""
    cdef const specdec_row_law* law
    cdef const probability_t* logits = rows + i * request.V + start
    if not (request.draft_logits if draft else request.logits):
        memcpy(out, logits, (stop - start) * sizeof(probability_t))
        return
    law = row_law(request, rows, i, draft)
    if probability_t is float:
        specdec_law_materialise_f(logits, stop - start, <float>request.temperature, law, out)
    else:
        specdec_law_materialise_d(logits, stop - start, request.temperature, law, out)


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


cdef double entropy_and_argmax(
    const probability_t* row, Py_ssize_t V, bint want_entropy, Py_ssize_t* argmax
) noexcept nogil:
    """Entropy -sum p ln(p + epsilon) (float64, if ``want_entropy``) and, if ``argmax`` is
    not NULL, the first index of the maximum, both in one pass.  NaN entries never win the
    argmax; a row with no entry above -inf has argmax 0."""
    cdef probability_t best = -1.0 / 0.0
    cdef probability_t block_best
    cdef Py_ssize_t start, stop, best_block_start = 0
    cdef double total = 0.0
    start = 0
    while start < V:
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
        if probability_t is float:
            total += specdec_entropy_max_f(row, start, stop, want_entropy, &block_best)
        else:
            total += specdec_entropy_max_d(row, start, stop, want_entropy, &block_best)
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
    const probability_t* rows, Py_ssize_t i, Py_ssize_t V
) noexcept nogil:
    # Greedy requests compare raw values: the argmax of logits is the argmax of any
    # temperature's probabilities.
    cdef Py_ssize_t argmax = 0
    entropy_and_argmax(rows + i * V, V, False, &argmax)
    return argmax


cdef double row_entropy_and_argmax(
    Request* request, const probability_t* target, Py_ssize_t i, Py_ssize_t* argmax
) noexcept nogil:
    """:func:`entropy_and_argmax` of row ``i``'s law (with the entropy); from logits, each
    scan block is processed into scratch, and the argmax's block once more to locate it."""
    cdef Py_ssize_t V = request.V
    cdef probability_t* p = <probability_t*>request.target_scratch
    cdef probability_t best = -1.0 / 0.0
    cdef probability_t block_best
    cdef Py_ssize_t start, stop, best_block_start = 0
    cdef double total = 0.0
    if not request.logits:
        return entropy_and_argmax(target + i * V, V, True, argmax)
    start = 0
    while start < V:
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
        process_range(request, target, i, False, start, stop, p)
        if probability_t is float:
            total += specdec_entropy_max_f(p, 0, stop - start, True, &block_best)
        else:
            total += specdec_entropy_max_d(p, 0, stop - start, True, &block_best)
        if block_best > best:
            best = block_best
            best_block_start = start
        start += SCAN_BLOCK
    if argmax != NULL:
        if best > -1.0 / 0.0:
            start = best_block_start
            stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
            process_range(request, target, i, False, start, stop, p)
            argmax[0] = start + locate_first(p, 0, stop - start, best)
        else:
            argmax[0] = 0
    return -total


cdef double row_residual_total(
    Request* request, const probability_t* target, const probability_t* draft, Py_ssize_t i,
    Py_ssize_t point_mass, double rho
) noexcept nogil:
    """:func:`residual_total` of row ``i`` (q the draft row, or the point mass at
    ``point_mass`` when ``draft`` is NULL); from logits in blocks, one set of lanes."""
    cdef Py_ssize_t V = request.V
    cdef Py_ssize_t start, stop, mass
    cdef double lanes[8]
    cdef const probability_t* p = <const probability_t*>request.target_scratch
    cdef const probability_t* q = (
        <const probability_t*>request.draft_scratch if draft != NULL else NULL
    )
    if not (request.logits or (draft != NULL and request.draft_logits)):
        return residual_total(
            target + i * V, NULL if draft == NULL else draft + i * V, point_mass, rho, V
        )
    for start in range(8):
        lanes[start] = 0.0
    # Blocks are multiples of 8 long, so each entry keeps its lane of the one-call sum.
    start = 0
    while start < V:
        stop = start + MIN_BLOCK if start + MIN_BLOCK < V else V
        mass = process_residual_block(request, target, i, draft, point_mass, start, stop)
        if probability_t is float:
            specdec_residual_sum_f_accumulate(p, q, mass, rho, 1.0, 0, stop - start, lanes)
        else:
            specdec_residual_sum_d_accumulate(p, q, mass, rho, 1.0, 0, stop - start, lanes)
        start += MIN_BLOCK
    return specdec_combine_lanes(lanes)
