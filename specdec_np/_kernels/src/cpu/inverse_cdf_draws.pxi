# --------------------------------------------------------------------------------------
# Inverse-CDF draws.  One draw, :func:`draw_by_blocks`, serves every case: probability
# rows and logits rows, residuals max(rho p - q, 0) of a draft row or of a point mass, and
# a row without some tokens (the point-mass tree step's final draw).  It sums the row in
# blocks and scans one of them, so the row is read about 1.x times; a logits row is first
# written once as probabilities to the thread's scratch row (probability_row).
# --------------------------------------------------------------------------------------

cdef inline double residual_weight(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass, double rho,
    double scale, Py_ssize_t y
) noexcept nogil:
    # Weight max(rho p - q, 0) * scale in float64.  With q == NULL the draft is a point mass
    # at ``point_mass`` (q = 1 there, 0 elsewhere; -1 means q = 0 everywhere), which makes
    # point-mass drafts identical to one-hot draft rows.  NaN weighs 0.
    if q != NULL:
        return specdec_residual_weight(<double>p[y], <double>q[y], rho, scale)
    return specdec_residual_weight(<double>p[y], 1.0 if y == point_mass else 0.0, rho, scale)


cdef inline double weight_sum(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass, double rho,
    double scale, Py_ssize_t start, Py_ssize_t stop
) noexcept nogil:
    if probability_t is float:
        return specdec_residual_sum_f(p, q, point_mass, rho, scale, start, stop)
    else:
        return specdec_residual_sum_d(p, q, point_mass, rho, scale, start, stop)


cdef inline double residual_total(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass, double rho,
    Py_ssize_t V
) noexcept nogil:
    """Z = sum_y max(rho p(y) - q(y), 0) in float64, over the whole row."""
    return weight_sum(p, q, point_mass, rho, 1.0, 0, V)


cdef inline Py_ssize_t draw_block_size(Py_ssize_t V) noexcept nogil:
    # MIN_BLOCK, or larger so that at most MAX_BLOCKS block sums are kept on the stack.
    if V > MIN_BLOCK * MAX_BLOCKS:
        return ((V + MAX_BLOCKS - 1) // MAX_BLOCKS + 7) // 8 * 8
    return MIN_BLOCK


cdef inline Py_ssize_t block_holding(
    const double* block_sums, Py_ssize_t num_blocks, double threshold, double* running
) noexcept nogil:
    """The first block whose running sum passes ``threshold`` (``num_blocks`` if none),
    adding the skipped blocks' sums to ``running``."""
    cdef Py_ssize_t j = 0
    while j < num_blocks and not running[0] + block_sums[j] > threshold:
        running[0] += block_sums[j]
        j += 1
    return j


cdef inline Py_ssize_t block_rows(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass, Py_ssize_t start,
    Py_ssize_t stop, const probability_t** block_p, const probability_t** block_q
) noexcept nogil:
    """Entries ``start .. stop`` of the weights' rows, indexed from 0.  Returns the point
    mass as an index into the block (-1 outside it)."""
    block_p[0] = p + start
    block_q[0] = NULL if q == NULL else q + start
    return point_mass - start if start <= point_mass < stop else -1


cdef Py_ssize_t draw_by_blocks(
    Request* request, const probability_t* p, const probability_t* q, Py_ssize_t i,
    Py_ssize_t point_mass, double rho, Py_ssize_t V, double v, const int64_t* excluded,
    Py_ssize_t num_excluded
) noexcept nogil:
    """Token drawn by inverse CDF at ``v`` from the weights max(rho p - q, 0), without the
    tokens ``excluded[0 .. num_excluded - 1]`` (sorted and distinct; none for 0); -1 if no
    weight is left.

    The rows are ``p`` and ``q`` themselves when ``request`` is NULL (probabilities), else
    row ``i`` of the request's rows as :func:`probability_row` gives them (a logits row's
    law written to the thread's scratch row, with the weights of the law's one exponential
    pass); q NULL is the point mass at ``point_mass`` (-1: none).
    Pass 1 sums the blocks, taking the excluded tokens' weights out of their blocks'
    sums; pass 2 skips whole blocks by their sums and scans one, skipping the excluded
    tokens.  Weights that a logits row's law kept are divided in pass 1, block by block,
    just before the block is summed: the block is then read from L1, not the row twice.
    """
    cdef double block_sums[MAX_BLOCKS]
    cdef Py_ssize_t block
    cdef Py_ssize_t num_blocks, j, y, start, stop, mass, e
    cdef double total, threshold, running = 0.0, w, scale = 1.0
    cdef double p_normaliser = 0.0, q_normaliser = 0.0
    cdef int _attempt
    cdef const probability_t* block_p
    cdef const probability_t* block_q
    if (
        request != NULL and request.logits and q == NULL and point_mass < 0 and rho == 1.0
        and num_excluded == 0 and request.target_law_row != i
        and top_k_filters(request.top_k, V)
    ):
        # A row drawn from as it is, whose law is new: from top-k's survivors alone when
        # they hold its kept set (the same token as from the whole row), without the row.
        compute_row_law(request, p, i, False, NULL)
        if request.law_scratch.survivors >= 0:
            if probability_t is float:
                return specdec_survivors_draw_f(
                    request.law_scratch, &request.target_law, draw_block_size(V), v
                )
            else:
                return specdec_survivors_draw_d(
                    request.law_scratch, &request.target_law, draw_block_size(V), v
                )
    if request != NULL:
        p = undivided_probability_row(request, p, i, False, &p_normaliser)
        q = undivided_probability_row(request, q, i, True, &q_normaliser)
    block = draw_block_size(V)
    num_blocks = (V + block - 1) // block
    for _attempt in range(2):
        total = 0.0
        e = 0
        if _attempt == 0 and q == NULL and point_mass < 0 and rho == 1.0 and num_excluded == 0:
            # A row drawn from as it is (a bonus token, a row without residual mass).
            if probability_t is float:
                specdec_block_sums_f(<float*>p, V, p_normaliser, block, block_sums)
            else:
                specdec_block_sums_d(<double*>p, V, p_normaliser, block, block_sums)
            for j in range(num_blocks):
                total += block_sums[j]
            if not isinf(total):
                break
            scale = ldexp(1.0, SPECDEC_OVERFLOW_EXPONENT)
            continue
        for j in range(num_blocks):
            start = j * block
            stop = start + block if start + block < V else V
            if _attempt == 0:
                divide_weights(<probability_t*>p + start, stop - start, p_normaliser)
                if q != NULL:
                    divide_weights(<probability_t*>q + start, stop - start, q_normaliser)
            mass = block_rows(p, q, point_mass, start, stop, &block_p, &block_q)
            block_sums[j] = weight_sum(block_p, block_q, mass, rho, scale, 0, stop - start)
            if e < num_excluded and excluded[e] < stop:
                while e < num_excluded and excluded[e] < stop:
                    if excluded[e] >= start:
                        block_sums[j] -= residual_weight(
                            block_p, block_q, mass, rho, scale, excluded[e] - start
                        )
                    e += 1
                # A block whose weights were all taken out can keep a rounding residue.
                if block_sums[j] < 0.0:
                    block_sums[j] = 0.0
            total += block_sums[j]
        if not isinf(total):
            break
        # Finite weights whose float64 sum overflows (float64 rows near 1e308): scale them
        # down by a power of two rather than let v * inf bias the draw to the last token.
        scale = ldexp(1.0, SPECDEC_OVERFLOW_EXPONENT)
    if not total > 0.0:
        return -1
    threshold = v * total
    j = block_holding(block_sums, num_blocks, threshold, &running)
    # Scan on from the chosen block; it normally ends inside it, but block sums and the
    # running sum round differently, so a miss simply continues to the next block.
    e = 0
    while j < num_blocks:
        start = j * block
        stop = start + block if start + block < V else V
        mass = block_rows(p, q, point_mass, start, stop, &block_p, &block_q)
        for y in range(stop - start):
            while e < num_excluded and excluded[e] < start + y:
                e += 1
            if e < num_excluded and excluded[e] == start + y:
                continue
            w = residual_weight(block_p, block_q, mass, rho, scale, y)
            running += w
            if specdec_draw_stops(w, running, threshold):
                return start + y
        j += 1
    # Rounding made the scan miss (or a weight was infinite): the last positive weight.
    j = num_blocks - 1
    e = num_excluded - 1
    while j >= 0:
        start = j * block
        stop = start + block if start + block < V else V
        mass = block_rows(p, q, point_mass, start, stop, &block_p, &block_q)
        y = stop - start - 1
        while y >= 0:
            while e >= 0 and excluded[e] > start + y:
                e -= 1
            if not (e >= 0 and excluded[e] == start + y) and (
                residual_weight(block_p, block_q, mass, rho, scale, y) > 0.0
            ):
                return start + y
            y -= 1
        j -= 1
    return -1


cdef Py_ssize_t draw_inverse_cdf(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass, double rho,
    Py_ssize_t V, double v
) noexcept nogil:
    """:func:`draw_by_blocks` over probability rows, without exclusions."""
    return draw_by_blocks(<Request*>NULL, p, q, 0, point_mass, rho, V, v, NULL, 0)


cdef inline Py_ssize_t draw_residual(
    const probability_t* p, const probability_t* q, Py_ssize_t x, double rho, Py_ssize_t V,
    double v
) noexcept nogil:
    """The recovered token at a rejected position: from max(rho p - q, 0), where q is the
    draft row (or the point mass at ``x`` when q is NULL); from p itself when that residual
    has no mass; -1 when p has none either."""
    cdef Py_ssize_t token = draw_inverse_cdf(p, q, -1 if q != NULL else x, rho, V, v)
    if token < 0:
        token = draw_inverse_cdf(p, <const probability_t*>NULL, -1, 1.0, V, v)
    return token


cdef inline Py_ssize_t residual_token(
    Request* request, const probability_t* target, const probability_t* draft, Py_ssize_t i,
    Py_ssize_t x, double rho, double v
) noexcept nogil:
    """:func:`draw_residual` at position ``i`` (draft id ``x``) of a request's rows."""
    cdef Py_ssize_t V = request.V
    cdef Py_ssize_t token
    if not (request.logits or (draft != NULL and request.draft_logits)):
        return draw_residual(
            target + i * V, NULL if draft == NULL else draft + i * V, x, rho, V, v
        )
    token = draw_by_blocks(
        request, target, draft, i, -1 if draft != NULL else x, rho, V, v, NULL, 0
    )
    if token < 0:
        token = draw_by_blocks(
            request, target, <const probability_t*>NULL, i, -1, 1.0, V, v, NULL, 0
        )
    return token


cdef inline Py_ssize_t row_token(
    Request* request, const probability_t* target, Py_ssize_t i, double v
) noexcept nogil:
    """A token drawn from row ``i``'s law by inverse CDF at ``v`` (-1 if it has no mass)."""
    if not request.logits:
        return draw_inverse_cdf(
            target + i * request.V, <const probability_t*>NULL, -1, 1.0, request.V, v
        )
    return draw_by_blocks(
        request, target, <const probability_t*>NULL, i, -1, 1.0, request.V, v, NULL, 0
    )
