# cython: language_level=3
"""CPU kernels of specdec_np.

Kernels only: every function here trusts its caller (``specdec_np._backend``) for dtypes
and contiguity, checks shapes and offsets in O(B) before it indexes anything, and reads
random uniforms that the caller drew.  What a kernel never trusts is a token id: the driver
checks each request's ids against the vocabulary before a row function uses one as an
index, and reports a bad id through ``row_status`` instead of reading out of bounds.

Structure: one driver per batch layout walks the requests and hands each request's rows,
ids and uniforms to the row function of the verifier (``ROW_FUNCTIONS``), with its ``k_b``
and ``V``.  The chain driver :func:`verify_chains` serves the padded ``[B, k+1, V]`` batch
and the ragged one alike: request ``b`` owns draft rows and ids
``draft_offsets[b] .. draft_offsets[b+1]`` and the ``k_b + 1`` target rows that start at
``draft_offsets[b] + b``.

The ``row_status`` codes are those of ``specdec_np._contract``.
"""

from cython.parallel cimport prange, threadid
from cython.view cimport array
from libc.math cimport exp, isinf, ldexp
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint64_t

cdef extern from "_rowscan.h" nogil:
    double specdec_residual_sum_f(
        const float* p, const float* q, Py_ssize_t point_mass, double rho, double scale,
        Py_ssize_t start, Py_ssize_t stop,
    )
    double specdec_residual_sum_d(
        const double* p, const double* q, Py_ssize_t point_mass, double rho, double scale,
        Py_ssize_t start, Py_ssize_t stop,
    )
    void specdec_residual_sum_f_accumulate(
        const float* p, const float* q, Py_ssize_t point_mass, double rho, double scale,
        Py_ssize_t start, Py_ssize_t stop, double* lanes,
    )
    void specdec_residual_sum_d_accumulate(
        const double* p, const double* q, Py_ssize_t point_mass, double rho, double scale,
        Py_ssize_t start, Py_ssize_t stop, double* lanes,
    )
    double specdec_combine_lanes(const double* lanes)
    double specdec_residual_weight(double p, double q, double rho, double scale)
    double specdec_entropy_max_f(
        const float* row, Py_ssize_t start, Py_ssize_t stop, bint want_entropy,
        float* maximum,
    )
    double specdec_entropy_max_d(
        const double* row, Py_ssize_t start, Py_ssize_t stop, bint want_entropy,
        double* maximum,
    )
    Py_ssize_t specdec_count_beating_f(
        const float* row, Py_ssize_t start, Py_ssize_t stop, float p_x, Py_ssize_t x
    )
    Py_ssize_t specdec_count_beating_d(
        const double* row, Py_ssize_t start, Py_ssize_t stop, double p_x, Py_ssize_t x
    )

cdef extern from "_logits.h" nogil:
    ctypedef struct specdec_row_law:
        double z_max
        double cutoff
        double normaliser
        int64_t num_infinite
        int64_t status
    void specdec_row_law_f(
        const float* logits, Py_ssize_t V, float temperature, int64_t top_k, double top_p,
        double min_p, specdec_row_law* law,
    )
    void specdec_row_law_d(
        const double* logits, Py_ssize_t V, double temperature, int64_t top_k, double top_p,
        double min_p, specdec_row_law* law,
    )
    double specdec_law_probability_f(
        const float* logits, Py_ssize_t y, float temperature, const specdec_row_law* law
    )
    double specdec_law_probability_d(
        const double* logits, Py_ssize_t y, double temperature, const specdec_row_law* law
    )
    void specdec_law_materialise_f(
        const float* logits, Py_ssize_t V, float temperature, const specdec_row_law* law,
        float* out,
    )
    void specdec_law_materialise_d(
        const double* logits, Py_ssize_t V, double temperature, const specdec_row_law* law,
        double* out,
    )

cdef extern from *:
    """
    #if SPECDEC_OPENMP
    #include <omp.h>
    static int specdec_openmp_max_threads(void) { return omp_get_max_threads(); }
    #else
    static int specdec_openmp_max_threads(void) { return 1; }
    #endif
    """
    int SPECDEC_OPENMP
    int SPECDEC_DEBUG_BUILD
    double SPECDEC_GREEDY_MARGIN
    # A float64 residual sum that overflows is recomputed with every weight times
    # 2**SPECDEC_OVERFLOW_EXPONENT (see specdec_np/_contract.py).
    int SPECDEC_OVERFLOW_EXPONENT
    int specdec_openmp_max_threads() nogil

ctypedef fused probability_t:
    float
    double

ctypedef fused token_id_t:
    int32_t
    int64_t

# Two-level inverse CDF: at most this many block sums are kept on the stack.
DEF MAX_BLOCKS = 512
DEF MIN_BLOCK = 2048
# Entropy/argmax work in blocks so that the argmax can be located by re-reading one
# cache-hot block instead of carrying an index through the vectorised loop.
DEF SCAN_BLOCK = 1024

# Row functions, by index: the registry names them, the drivers switch on the index.
ROW_FUNCTIONS = (
    "rejection_row",
    "block_verification_row",
    "typical_acceptance_row",
    "greedy_row",
)
DEF ROW_REJECTION = 0
DEF ROW_BLOCK = 1
DEF ROW_TYPICAL = 2
DEF ROW_GREEDY = 3

GREEDY_MARGIN = SPECDEC_GREEDY_MARGIN


def openmp_enabled() -> bool:
    """Whether this build of the kernels was compiled with OpenMP."""
    return bool(SPECDEC_OPENMP)


def debug_build() -> bool:
    """Whether this build has Cython's bounds, wraparound and initialized checks on."""
    return bool(SPECDEC_DEBUG_BUILD)


def openmp_max_threads() -> int:
    """OpenMP's default thread count for this process (1 without OpenMP)."""
    return specdec_openmp_max_threads()


# --------------------------------------------------------------------------------------
# Inverse-CDF draw from a residual
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


cdef Py_ssize_t draw_inverse_cdf(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass, double rho,
    Py_ssize_t V, double v
) noexcept nogil:
    """Token drawn from the weights max(rho p - q, 0) by inverse CDF at v; -1 if they sum
    to 0.

    Pass 1 sums blocks of the row; pass 2 skips whole blocks by their sums and scans one
    block, so the row is read about 1.x times (:func:`draw_by_blocks`).
    """
    return draw_by_blocks(<Request*>NULL, p, q, 0, point_mass, rho, V, v)


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


cdef struct Request:
    # What a row function needs besides its rows and ids: the request's k_b and V, its
    # uniforms (acceptance ones, then the residual one), the verifier's parameters, and
    # whether acceptance stops at the first rejection (causal counting) or tests every
    # position (vLLM's counters).  With logits, the request's sampling parameters, its
    # thread's scratch rows, and the processed law of the last target and draft row read.
    Py_ssize_t k
    Py_ssize_t V
    const double* uniforms
    const double* parameters
    bint causal
    bint logits
    double temperature
    int64_t top_k
    double top_p
    double min_p
    void* target_scratch
    void* draft_scratch
    Py_ssize_t target_law_row
    Py_ssize_t draft_law_row
    specdec_row_law target_law
    specdec_row_law draft_law


# --------------------------------------------------------------------------------------
# Row readers: how a row function sees its rows.  Probabilities are read as they are;
# logits through the processed law of their row (temperature, min-p, top-k, top-p),
# computed once per row read and materialised only where a whole row is scanned.
# --------------------------------------------------------------------------------------

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
                request.min_p, law,
            )
        else:
            specdec_row_law_d(
                rows + i * V, V, request.temperature, request.top_k, request.top_p,
                request.min_p, law,
            )
        cached[0] = i
    return law


cdef inline double read_probability(
    Request* request, const probability_t* rows, Py_ssize_t i, Py_ssize_t y, bint draft
) noexcept nogil:
    cdef const specdec_row_law* law
    cdef Py_ssize_t V = request.V
    if not request.logits:
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
    if rows == NULL or not request.logits:
        return rows + i * V if rows != NULL else rows
    law = row_law(request, rows, i, draft)
    scratch = <probability_t*>(request.draft_scratch if draft else request.target_scratch)
    if probability_t is float:
        specdec_law_materialise_f(rows + i * V, V, <float>request.temperature, law, scratch)
    else:
        specdec_law_materialise_d(rows + i * V, V, request.temperature, law, scratch)
    return scratch


cdef inline Py_ssize_t raw_argmax(
    const probability_t* rows, Py_ssize_t i, Py_ssize_t V
) noexcept nogil:
    # Greedy requests compare raw values: the argmax of logits is the argmax of any
    # temperature's probabilities.
    cdef Py_ssize_t argmax = 0
    entropy_and_argmax(rows + i * V, V, False, &argmax)
    return argmax


# --------------------------------------------------------------------------------------
# Draws from logits rows.  The processed rows are never materialised whole: each block of
# the inverse CDF is processed into the first entries of the thread's scratch rows (where
# it stays in cache) and summed there, and the chosen block is processed again to be
# scanned.  Every entry gets the bits that materialising the whole row gives it, the
# blocks and their sums are those of draw_inverse_cdf, so the draw is the same.
# --------------------------------------------------------------------------------------

cdef inline void process_range(
    Request* request, const probability_t* rows, Py_ssize_t i, bint draft, Py_ssize_t start,
    Py_ssize_t stop, probability_t* out
) noexcept nogil:
    """Entries ``start .. stop`` of row ``i``'s processed law, written to ``out[0 ..]``."""
    cdef const specdec_row_law* law = row_law(request, rows, i, draft)
    cdef const probability_t* logits = rows + i * request.V + start
    if probability_t is float:
        specdec_law_materialise_f(logits, stop - start, <float>request.temperature, law, out)
    else:
        specdec_law_materialise_d(logits, stop - start, request.temperature, law, out)


cdef inline Py_ssize_t process_residual_block(
    Request* request, const probability_t* target, Py_ssize_t i, const probability_t* draft,
    Py_ssize_t point_mass, Py_ssize_t start, Py_ssize_t stop
) noexcept nogil:
    """p (and q unless ``draft`` is NULL) of row ``i`` over ``start .. stop`` into the
    scratch rows; returns the point mass as an index into the block (-1 outside it)."""
    process_range(request, target, i, False, start, stop,
                  <probability_t*>request.target_scratch)
    if draft != NULL:
        process_range(request, draft, i, True, start, stop,
                      <probability_t*>request.draft_scratch)
    return point_mass - start if start <= point_mass < stop else -1


cdef inline Py_ssize_t block_rows(
    Request* request, const probability_t* p, const probability_t* q, Py_ssize_t i,
    Py_ssize_t point_mass, Py_ssize_t start, Py_ssize_t stop, const probability_t** block_p,
    const probability_t** block_q
) noexcept nogil:
    """Entries ``start .. stop`` of the weights' rows, indexed from 0: views of the rows
    ``p`` and ``q`` when ``request`` is NULL (probabilities), else row ``i`` of the
    request's logits rows ``p`` and ``q`` processed into its scratch.  Returns the point
    mass as an index into the block (-1 outside it)."""
    if request == NULL:
        block_p[0] = p + start
        block_q[0] = NULL if q == NULL else q + start
        return point_mass - start if start <= point_mass < stop else -1
    block_p[0] = <const probability_t*>request.target_scratch
    block_q[0] = NULL if q == NULL else <const probability_t*>request.draft_scratch
    return process_residual_block(request, p, i, q, point_mass, start, stop)


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


cdef Py_ssize_t draw_by_blocks(
    Request* request, const probability_t* p, const probability_t* q, Py_ssize_t i,
    Py_ssize_t point_mass, double rho, Py_ssize_t V, double v
) noexcept nogil:
    """The inverse-CDF draw of :func:`draw_inverse_cdf`, over the rows that
    :func:`block_rows` gives block by block (probabilities, or logits processed into
    scratch: the same blocks, sums and scan either way)."""
    cdef double block_sums[MAX_BLOCKS]
    cdef Py_ssize_t block
    cdef Py_ssize_t num_blocks, j, y, start, stop, mass
    cdef double total, threshold, running = 0.0, w, scale = 1.0
    cdef int _attempt
    cdef const probability_t* block_p
    cdef const probability_t* block_q
    block = draw_block_size(V)
    num_blocks = (V + block - 1) // block
    for _attempt in range(2):
        total = 0.0
        for j in range(num_blocks):
            start = j * block
            stop = start + block if start + block < V else V
            mass = block_rows(request, p, q, i, point_mass, start, stop, &block_p, &block_q)
            block_sums[j] = weight_sum(block_p, block_q, mass, rho, scale, 0, stop - start)
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
    while j < num_blocks:
        start = j * block
        stop = start + block if start + block < V else V
        mass = block_rows(request, p, q, i, point_mass, start, stop, &block_p, &block_q)
        for y in range(stop - start):
            w = residual_weight(block_p, block_q, mass, rho, scale, y)
            running += w
            if w > 0.0 and running > threshold:
                return start + y
        j += 1
    # Rounding made the scan miss (or a weight was infinite): the last positive weight.
    j = num_blocks - 1
    while j >= 0:
        start = j * block
        stop = start + block if start + block < V else V
        mass = block_rows(request, p, q, i, point_mass, start, stop, &block_p, &block_q)
        y = stop - start - 1
        while y >= 0:
            if residual_weight(block_p, block_q, mass, rho, scale, y) > 0.0:
                return start + y
            y -= 1
        j -= 1
    return -1


cdef inline Py_ssize_t draw_processed(
    Request* request, const probability_t* target, Py_ssize_t i, const probability_t* draft,
    Py_ssize_t point_mass, double rho, double v
) noexcept nogil:
    """:func:`draw_inverse_cdf` over the weights max(rho p - q, 0) of logits row ``i``
    (target, and draft unless NULL: then q is the point mass at ``point_mass``, none for
    -1), block by block as described above."""
    return draw_by_blocks(request, target, draft, i, point_mass, rho, request.V, v)


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
    if not request.logits:
        return residual_total(
            target + i * V, NULL if draft == NULL else draft + i * V, point_mass, rho, V
        )
    for start in range(8):
        lanes[start] = 0.0
    # Blocks are multiples of 8 long, so each entry keeps its lane of the one-call sum.
    for start in range(0, V, MIN_BLOCK):
        stop = start + MIN_BLOCK if start + MIN_BLOCK < V else V
        mass = process_residual_block(request, target, i, draft, point_mass, start, stop)
        if probability_t is float:
            specdec_residual_sum_f_accumulate(p, q, mass, rho, 1.0, 0, stop - start, lanes)
        else:
            specdec_residual_sum_d_accumulate(p, q, mass, rho, 1.0, 0, stop - start, lanes)
    return specdec_combine_lanes(lanes)


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
    for start in range(0, V, SCAN_BLOCK):
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
        process_range(request, target, i, False, start, stop, p)
        if probability_t is float:
            total += specdec_entropy_max_f(p, 0, stop - start, True, &block_best)
        else:
            total += specdec_entropy_max_d(p, 0, stop - start, True, &block_best)
        if block_best > best:
            best = block_best
            best_block_start = start
    if argmax != NULL:
        if best > -1.0 / 0.0:
            start = best_block_start
            stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
            process_range(request, target, i, False, start, stop, p)
            argmax[0] = start + locate_first(p, 0, stop - start, best)
        else:
            argmax[0] = 0
    return -total


cdef inline Py_ssize_t residual_token(
    Request* request, const probability_t* target, const probability_t* draft, Py_ssize_t i,
    Py_ssize_t x, double rho, double v
) noexcept nogil:
    """:func:`draw_residual` at position ``i`` (draft id ``x``) of a request's rows."""
    cdef Py_ssize_t V = request.V
    cdef Py_ssize_t token
    if not request.logits:
        return draw_residual(
            target + i * V, NULL if draft == NULL else draft + i * V, x, rho, V, v
        )
    token = draw_processed(request, target, i, draft, -1 if draft != NULL else x, rho, v)
    if token < 0:
        token = draw_processed(request, target, i, <const probability_t*>NULL, -1, 1.0, v)
    return token


cdef inline Py_ssize_t row_token(
    Request* request, const probability_t* target, Py_ssize_t i, double v
) noexcept nogil:
    """A token drawn from row ``i``'s law by inverse CDF at ``v`` (-1 if it has no mass)."""
    if not request.logits:
        return draw_inverse_cdf(
            target + i * request.V, <const probability_t*>NULL, -1, 1.0, request.V, v
        )
    return draw_processed(request, target, i, <const probability_t*>NULL, -1, 1.0, v)


# --------------------------------------------------------------------------------------
# Row functions: one request of any layout.  Each gets the request's k + 1 target rows
# (contiguous, row stride V), its k draft rows (or NULL for point-mass drafts), its k
# draft ids (already checked against V), its bonus id and its Request; it writes the
# accepted length, the emitted token after the accepted prefix and the per-request
# acceptance count, and returns a row status.
# --------------------------------------------------------------------------------------

cdef int64_t rejection_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, Request* request, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t k = request.k
    cdef const double* uniforms = request.uniforms
    cdef Py_ssize_t i, r = k, token
    cdef int64_t passed = 0
    cdef double p_x, q_x
    for i in range(k):
        # Each position is tested independently, as vLLM counts acceptances.
        p_x = target_probability(request, target, i, draft_ids[i])
        q_x = draft_probability(request, draft, i, draft_ids[i])
        if uniforms[i] * q_x < p_x:
            passed += 1
        elif r == k:
            r = i
            if request.causal:
                break
    num_accepted[0] = passed
    accepted_length[0] = r
    if r == k:
        last_token[0] = bonus_id
        return 0
    token = residual_token(request, target, draft, r, draft_ids[r], 1.0, uniforms[k])
    if token < 0:
        return -(1 + r)
    last_token[0] = token
    return 0


DEF PATH_STACK = 64


cdef inline double next_block_weight(double rho, double p_x, double q_x) noexcept nogil:
    # rho_j = min(1, rho_{j-1} p(x) / q(x)), computed as 1 when rho p >= q (so q = 0 is
    # safe).  A token with p <= 0 (or NaN) sets rho to 0 for good, so no later q = 0 can
    # revive it.
    if not p_x > 0.0 or rho == 0.0:
        return 0.0
    if rho * p_x >= q_x:
        return 1.0
    return rho * p_x / q_x


cdef double block_weight(
    Request* request, const probability_t* target, const probability_t* draft,
    const token_id_t* draft_ids, const double* path_p, const double* path_q, Py_ssize_t i
) noexcept nogil:
    """rho_i of block verification, recomputed from rho_0 = 1 in one fixed order (the
    backward scan needs it at a few positions only).  ``path_p``/``path_q`` hold the
    path's p(x_j) and q(x_j) when the request is short enough to keep them; otherwise they
    are NULL and read again (a row read costs far more than these scalars)."""
    cdef double rho = 1.0
    cdef Py_ssize_t j
    for j in range(i):
        if path_p != NULL:
            rho = next_block_weight(rho, path_p[j], path_q[j])
        else:
            rho = next_block_weight(
                rho, target_probability(request, target, j, draft_ids[j]),
                draft_probability(request, draft, j, draft_ids[j]),
            )
    return rho


cdef int64_t block_verification_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, Request* request, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t k = request.k
    cdef const double* uniforms = request.uniforms
    cdef Py_ssize_t i, j, tau = 0, token
    cdef double rho, h, total, denominator
    cdef double path_p_stack[PATH_STACK]
    cdef double path_q_stack[PATH_STACK]
    cdef double* path_p = NULL
    cdef double* path_q = NULL
    if k <= PATH_STACK:
        # Each p(x_j) is read once: from logits it costs a pass over row j.
        path_p = path_p_stack
        path_q = path_q_stack
        for j in range(k):
            path_p[j] = target_probability(request, target, j, draft_ids[j])
            path_q[j] = draft_probability(request, draft, j, draft_ids[j])
    # tau is the largest i whose check passes: scan down and stop there, so that no row
    # below tau is read (a later position can rescue an earlier failed check).
    i = k
    while i >= 1:
        rho = block_weight(request, target, draft, draft_ids, path_p, path_q, i)
        if i == k or rho >= 1.0 or rho == 0.0:
            # h_k = rho_k; rho_i = 1 gives h_i = 1 and rho_i = 0 gives h_i = 0 unread.
            h = rho
        else:
            total = row_residual_total(
                request, target, draft, i, -1 if draft != NULL else draft_ids[i], rho
            )
            denominator = total + (1.0 - rho)
            # NaN (a NaN target entry on the path) fails every check.
            h = total / denominator if denominator > 0.0 else 0.0
        if uniforms[i - 1] < h:
            tau = i
            break
        i -= 1
    num_accepted[0] = tau
    accepted_length[0] = tau
    if tau == k:
        last_token[0] = bonus_id
        return 0
    rho = block_weight(request, target, draft, draft_ids, path_p, path_q, tau)
    token = residual_token(request, target, draft, tau, draft_ids[tau], rho, uniforms[k])
    if token < 0:
        return -(1 + tau)
    last_token[0] = token
    return 0


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
    for start in range(0, V, SCAN_BLOCK):
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
        if probability_t is float:
            total += specdec_entropy_max_f(row, start, stop, want_entropy, &block_best)
        else:
            total += specdec_entropy_max_d(row, start, stop, want_entropy, &block_best)
        if block_best > best:
            best = block_best
            best_block_start = start
    if argmax != NULL:
        if best > -1.0 / 0.0:
            stop = best_block_start + SCAN_BLOCK if best_block_start + SCAN_BLOCK < V else V
            argmax[0] = locate_first(row, best_block_start, stop, best)
        else:
            argmax[0] = 0
    return -total


cdef int64_t typical_acceptance_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, Request* request, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t k = request.k
    cdef Py_ssize_t i, r = k, recovered = 0, argmax = 0
    cdef int64_t passed = 0
    cdef double p_x, entropy, threshold
    cdef double posterior_threshold = request.parameters[0]
    cdef double posterior_alpha = request.parameters[1]
    for i in range(k):
        p_x = target_probability(request, target, i, draft_ids[i])
        # The threshold never exceeds posterior_threshold: above it, no entropy is needed.
        if p_x > posterior_threshold:
            passed += 1
            continue
        # The argmax is only needed at the first rejection, so only while none was seen.
        entropy = row_entropy_and_argmax(request, target, i, &argmax if r == k else NULL)
        # alpha = 0 means a zero threshold even where exp(-H) overflows (0 * inf is NaN).
        threshold = posterior_alpha * exp(-entropy) if posterior_alpha > 0.0 else 0.0
        if threshold > posterior_threshold:
            threshold = posterior_threshold
        if p_x > threshold:
            passed += 1
        elif r == k:
            r = i
            recovered = argmax
            if request.causal:
                break
    num_accepted[0] = passed
    accepted_length[0] = r
    last_token[0] = bonus_id if r == k else recovered
    return 0


cdef bint is_first_argmax(const probability_t* row, Py_ssize_t V, Py_ssize_t x) noexcept nogil:
    """Whether x is the first index of the maximum: stops at the first block with an entry
    that beats row[x] (larger, or equal at a lower index)."""
    cdef probability_t p_x = row[x]
    cdef Py_ssize_t start, stop, beaten
    cdef Py_ssize_t argmax = 0
    if p_x != p_x or p_x == -1.0 / 0.0:
        # NaN and -inf never win the scan's comparisons; the argmax rule decides for them
        # (a row with nothing above -inf has argmax 0), as at the first rejection.
        entropy_and_argmax(row, V, False, &argmax)
        return argmax == x
    for start in range(0, V, SCAN_BLOCK):
        stop = start + SCAN_BLOCK if start + SCAN_BLOCK < V else V
        if probability_t is float:
            beaten = specdec_count_beating_f(row, start, stop, p_x, x)
        else:
            beaten = specdec_count_beating_d(row, start, stop, p_x, x)
        if beaten:
            return False
    return True


cdef int64_t greedy_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, Request* request, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t k = request.k, V = request.V
    cdef Py_ssize_t i, x, r = k, recovered = 0, argmax = 0
    cdef int64_t passed = 0
    cdef bint accepted
    for i in range(k):
        x = draft_ids[i]
        if request.logits:
            # Raw logits: no probability shortcut, the full argmax decides.
            argmax = raw_argmax(target, i, V)
            accepted = argmax == x
        elif target[i * V + x] > 0.5 + SPECDEC_GREEDY_MARGIN:
            accepted = True
        elif r == k:
            entropy_and_argmax(target + i * V, V, False, &argmax)
            accepted = argmax == x
        else:
            accepted = is_first_argmax(target + i * V, V, x)
        if accepted:
            passed += 1
        elif r == k:
            r = i
            recovered = argmax
            if request.causal:
                break
    num_accepted[0] = passed
    accepted_length[0] = r
    last_token[0] = bonus_id if r == k else recovered
    return 0


# --------------------------------------------------------------------------------------
# The chain driver (padded and ragged batches)
# --------------------------------------------------------------------------------------

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


cdef inline int require(bint condition, str what) except -1:
    # O(B) guard: the kernels index with bounds checks off, so inconsistent arguments
    # from a direct caller must stop here rather than in an out-of-bounds read.
    if not condition:
        raise ValueError(f"kernel arguments are inconsistent: {what}")
    return 0


cdef Py_ssize_t require_offsets(
    const int64_t[::1] draft_offsets, Py_ssize_t B, Py_ssize_t T
) except -1:
    """Check ``0 = offsets[0] <= ... <= offsets[B] = T`` in O(B); return the largest k_b."""
    cdef Py_ssize_t b, k_b, max_k = 0
    require(draft_offsets.shape[0] == B + 1, "draft_offsets must have B + 1 entries")
    require(draft_offsets[0] == 0 and draft_offsets[B] == T, "draft_offsets must span [0, T]")
    for b in range(B):
        k_b = draft_offsets[b + 1] - draft_offsets[b]
        require(k_b >= 0, "draft_offsets must not decrease")
        max_k = k_b if k_b > max_k else max_k
    return max_k


cdef Py_ssize_t first_failed_row(const int64_t[::1] row_status) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(row_status.shape[0]):
        if row_status[b] != 0:
            return b
    return -1


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


cdef inline void init_request(
    Request* request, Py_ssize_t k, Py_ssize_t V, const double* uniforms,
    const double* parameters, bint causal, const double* sampling, probability_t* scratch
) noexcept nogil:
    """Fill a Request; ``sampling`` (temperature, top-k, top-p, min-p) is NULL for
    probability rows, and ``scratch`` (two rows of V) is then unused."""
    request.k = k
    request.V = V
    request.uniforms = uniforms
    request.parameters = parameters
    request.causal = causal
    request.logits = sampling != NULL
    request.target_law_row = -1
    request.draft_law_row = -1
    if sampling != NULL:
        request.temperature = sampling[0]
        request.top_k = <int64_t>sampling[1]
        request.top_p = sampling[2]
        request.min_p = sampling[3]
        request.target_scratch = scratch
        request.draft_scratch = scratch + V


cdef inline int64_t verify_request(
    int method, const probability_t* target, const probability_t* draft,
    const token_id_t* draft_ids, int64_t bonus_id, bint draw_bonus, Py_ssize_t k,
    Py_ssize_t V, const double* uniforms, const double* parameters, bint causal,
    const double* sampling, probability_t* scratch,
    Py_ssize_t width, int64_t* out, int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil:
    """The skeleton every verifier shares: id check, row function, bonus, output row.

    ``sampling`` (temperature, top-k, top-p, min-p) is NULL for probability rows, and
    ``scratch`` then unused; with logits, ``scratch`` is the thread's two rows of V.
    """
    cdef int64_t status, last_token = 0
    cdef Request request_fields
    cdef Request* request = &request_fields
    cdef Py_ssize_t bad = invalid_id_column(draft_ids, 0 if draw_bonus else bonus_id, k, V)
    if bad >= 0:
        return 1 + bad
    init_request(request, k, V, uniforms, parameters, causal, sampling, scratch)
    if method == ROW_REJECTION:
        status = rejection_row(
            target, draft, draft_ids, bonus_id, request, &last_token, accepted_length,
            num_accepted,
        )
    elif method == ROW_BLOCK:
        status = block_verification_row(
            target, draft, draft_ids, bonus_id, request, &last_token, accepted_length,
            num_accepted,
        )
    elif method == ROW_TYPICAL:
        status = typical_acceptance_row(
            target, draft, draft_ids, bonus_id, request, &last_token, accepted_length,
            num_accepted,
        )
    else:
        status = greedy_row(
            target, draft, draft_ids, bonus_id, request, &last_token, accepted_length,
            num_accepted,
        )
    if status == 0 and draw_bonus and accepted_length[0] == k:
        # The bonus row is read only now that every draft was accepted: its argmax for a
        # greedy request, otherwise a draw from its processed law with the last uniform.
        if method == ROW_GREEDY:
            last_token = raw_argmax(target, k, V)
        else:
            last_token = row_token(request, target, k, uniforms[k + 1])
            if last_token < 0:
                status = -(1 + k)
    if status == 0:
        write_output_row(draft_ids, accepted_length[0], last_token, width, out)
    return status


def verify_chains(
    int method,
    const probability_t[:, ::1] target_rows,
    const probability_t[:, ::1] draft_rows,
    bint point_mass_drafts,
    const token_id_t[::1] draft_token_ids,
    const token_id_t[::1] bonus_token_ids,
    const int64_t[::1] draft_offsets,
    const double[:, ::1] uniforms,
    const double[::1] parameters,
    int64_t[:, ::1] output,
    int64_t[::1] accepted_lengths,
    int64_t[::1] num_accepted,
    int64_t[::1] row_status,
    int num_threads,
    const int8_t[::1] request_methods=None,
    bint causal=False,
    bint draw_bonus=False,
    const double[:, ::1] sampling=None,
    probability_t[:, ::1] scratch=None,
):
    """Verify a batch of draft chains with the row functions of ``ROW_FUNCTIONS``.

    Parameters
    ----------
    method : int
        Index into ``ROW_FUNCTIONS``: the verifier of every request (unless
        ``request_methods`` is given).
    target_rows : float32 or float64 [T + B, V], C-contiguous
        Request ``b`` owns the ``k_b + 1`` rows from ``draft_offsets[b] + b`` on: its draft
        positions, then its bonus position.
    draft_rows : same dtype [T, V]
        Ignored (pass any array of the right dtype) when ``point_mass_drafts``.
    point_mass_drafts : bool
        Drafts are point masses at their token ids.
    draft_token_ids : int32 or int64 [T]
    bonus_token_ids : same dtype [B]
        Ignored (pass any ``[B]`` array) when ``draw_bonus``.
    draft_offsets : int64 [B + 1]
        ``0 = draft_offsets[0] <= ... <= draft_offsets[B] = T``; ``k_b`` is the difference.
    uniforms : float64 [B, W]
        Request ``b`` reads columns ``0 .. k_b``: acceptance uniforms, then the residual
        one, then (``draw_bonus``) the bonus one.  ``W >= max k_b + 1 + draw_bonus`` when
        any request is stochastic or draws its bonus; ``[B, 0]`` otherwise.
    parameters : float64 [P]
        The verifiers' parameters (typical acceptance: threshold, alpha).
    output : int64 [B, width], ``width >= max k_b + 1``
    accepted_lengths, num_accepted, row_status : int64 [B]
        Accepted prefix length, acceptance count and row status (``specdec_np._contract``).
    num_threads : int
        Threads for the loop over requests.
    request_methods : int8 [B], optional
        Per-request index into ``ROW_FUNCTIONS`` (mixed greedy and sampled batches).
    causal : bool
        Stop at the first rejection (``num_accepted`` = accepted prefix; later rows are
        never read) instead of testing every position as vLLM counts them.
    draw_bonus : bool
        Draw each fully accepted request's bonus token from its bonus row instead of
        taking ``bonus_token_ids``.
    sampling : float64 [B, 4], optional
        The rows are logits: per request ``(temperature, top_k, top_p, min_p)`` of the
        processed law (top-k 0 = off); greedy requests read their rows raw.
    scratch : same dtype as the rows [num_threads, 2 * V], optional
        Working rows for logits (a thread's processed target and draft row).

    Returns
    -------
    int
        The first request whose ``row_status`` is not 0, or -1 if every request verified.
    """
    cdef Py_ssize_t B = draft_offsets.shape[0] - 1
    cdef Py_ssize_t V = target_rows.shape[1]
    cdef Py_ssize_t T = draft_token_ids.shape[0]
    cdef Py_ssize_t width = output.shape[1]
    cdef Py_ssize_t b, max_k, start
    cdef int request_method
    cdef bint stochastic = draw_bonus or method == ROW_REJECTION or method == ROW_BLOCK
    cdef bint per_request = request_methods is not None
    cdef const probability_t* draft_base
    cdef const token_id_t* ids_base
    cdef const double* uniform_base
    cdef const double* parameter_base
    cdef const double* sampling_base = NULL
    cdef probability_t* scratch_base = NULL
    cdef bint typical = method == ROW_TYPICAL
    require(B >= 0, "draft_offsets must have B + 1 entries")
    require(0 <= method < len(ROW_FUNCTIONS), "unknown row function")
    require(V >= 1, "the vocabulary must not be empty")
    max_k = require_offsets(draft_offsets, B, T)
    require(bonus_token_ids.shape[0] == B, "bonus_token_ids must have B entries")
    require(target_rows.shape[0] == T + B, "target_rows must have T + B rows")
    require(
        point_mass_drafts or (draft_rows.shape[0] == T and draft_rows.shape[1] == V),
        "draft_rows must be [T, V]",
    )
    require(
        output.shape[0] == B and width >= max_k + 1 and accepted_lengths.shape[0] == B
        and num_accepted.shape[0] == B and row_status.shape[0] == B,
        "outputs must be [B, >= max k + 1] and [B]",
    )
    if per_request:
        require(request_methods.shape[0] == B, "request_methods must have B entries")
        for b in range(B):
            require(
                0 <= request_methods[b] < len(ROW_FUNCTIONS), "unknown row function"
            )
            stochastic = stochastic or request_methods[b] == ROW_REJECTION
            stochastic = stochastic or request_methods[b] == ROW_BLOCK
            typical = typical or request_methods[b] == ROW_TYPICAL
    require(
        not stochastic or (uniforms.shape[0] == B and uniforms.shape[1] >= max_k + 1 + draw_bonus),
        "uniforms must be [B, >= max k + 1 (+ 1 to draw the bonus)]",
    )
    require(
        not typical or parameters.shape[0] >= 2,
        "parameters must hold the 2 typical-acceptance values",
    )
    if sampling is not None:
        require(
            sampling.shape[0] == B and sampling.shape[1] == 4, "sampling must be [B, 4]"
        )
        require(
            scratch is not None and scratch.shape[0] >= (num_threads if num_threads > 1 else 1)
            and scratch.shape[1] == 2 * V,
            "scratch must be [num_threads, 2 V]",
        )
    if B == 0:
        return -1
    if sampling is not None:
        sampling_base = &sampling[0, 0]
        scratch_base = &scratch[0, 0]
    draft_base = NULL if point_mass_drafts or T == 0 else &draft_rows[0, 0]
    # Pointer arithmetic, not indexing: a last request with k_b = 0 starts at T.
    ids_base = &draft_token_ids[0] if T > 0 else NULL
    uniform_base = &uniforms[0, 0] if stochastic else NULL
    parameter_base = &parameters[0] if parameters.shape[0] > 0 else NULL
    # use_threads_if: a one-thread call skips the OpenMP team (about half a microsecond).
    for b in prange(
        B, nogil=True, num_threads=num_threads, schedule="dynamic",
        use_threads_if=num_threads > 1,
    ):
        start = draft_offsets[b]
        request_method = request_methods[b] if per_request else method
        row_status[b] = verify_request(
            request_method,
            &target_rows[start + b, 0],
            NULL if draft_base == NULL else draft_base + start * V,
            ids_base + start if ids_base != NULL else ids_base,
            bonus_token_ids[b], draw_bonus, draft_offsets[b + 1] - start, V,
            NULL if uniform_base == NULL else uniform_base + b * uniforms.shape[1],
            parameter_base, causal,
            NULL if sampling_base == NULL else sampling_base + 4 * b,
            NULL if scratch_base == NULL else scratch_base + threadid() * 2 * V,
            width, &output[b, 0], &accepted_lengths[b], &num_accepted[b],
        )
    return first_failed_row(row_status)


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


def ragged_offsets(const int64_t[::1] counts, int64_t[::1] offsets):
    """``offsets = [0, cumsum(counts)]`` and the largest count, in one O(B) pass.

    The ragged layout's Python layer calls this instead of three NumPy reductions, whose
    fixed costs dominate a small batch.

    Parameters
    ----------
    counts : int64 [B]
        ``k_b`` per request.
    offsets : int64 [B + 1]
        Written: ``offsets[b]`` is the sum of the counts before request ``b``.

    Returns
    -------
    tuple of int
        ``(max k_b, first request with k_b < 0)``; the second is -1 when there is none
        (then the offsets are complete; otherwise they stop at that request), and the
        first is 0 for an empty batch.
    """
    cdef Py_ssize_t B = counts.shape[0]
    cdef Py_ssize_t b
    cdef int64_t running = 0, largest = 0
    require(offsets.shape[0] == B + 1, "offsets must have B + 1 entries")
    offsets[0] = 0
    for b in range(B):
        if counts[b] < 0:
            return largest, b
        # Wrapping as NumPy's cumsum does (signed overflow would be undefined in C).
        running = <int64_t>(<uint64_t>running + <uint64_t>counts[b])
        largest = counts[b] if counts[b] > largest else largest
        offsets[b + 1] = running
    return largest, -1


# --------------------------------------------------------------------------------------
# Output formatting (vLLM's _create_output)
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# The tree layout (docs/semantics.md, trees).  Request b owns nodes node_offsets[b] ..
# node_offsets[b + 1] - 1; its N_b + 1 target rows start at node_offsets[b] + b (the root
# row, then one row per node) and its draft rows at node_offsets[b].  A node's children
# are the later nodes whose parent it is, tried in node order; the walk only moves to
# higher node indices, so it ends within N_b steps whatever the parents say.
# --------------------------------------------------------------------------------------

cdef extern from "_treescan.h" nogil:
    double specdec_residual_update_ff(
        const float* src, double src_mass, const float* q, double q_mass, Py_ssize_t V,
        double* dst,
    )
    double specdec_residual_update_df(
        const double* src, double src_mass, const float* q, double q_mass, Py_ssize_t V,
        double* dst,
    )
    double specdec_residual_update_dd(
        const double* src, double src_mass, const double* q, double q_mass, Py_ssize_t V,
        double* dst,
    )
    double specdec_clean_sum_f(const float* q, Py_ssize_t V)
    double specdec_clean_sum_d(const double* q, Py_ssize_t V)
    void specdec_clean_copy_f(const float* src, Py_ssize_t V, double* dst)
    void specdec_clean_copy_d(const double* src, Py_ssize_t V, double* dst)

# Tree walks, by index: the registry's tree methods name them, the driver switches on it.
TREE_WALKS = (
    "greedy_tree_step",
    "point_mass_tree_step",
    "specinfer_tree_step",
    "rrs_tree_step",
)
DEF WALK_GREEDY = 0
DEF WALK_POINT_MASS = 1
DEF WALK_SPECINFER = 2
DEF WALK_RRS = 3


cdef inline Py_ssize_t next_child(
    const int64_t* parents, Py_ssize_t num_nodes, Py_ssize_t node, Py_ssize_t after
) noexcept nogil:
    """The first child of ``node`` (-1: the root) with an index above ``after``, or -1."""
    cdef Py_ssize_t j
    for j in range(after + 1, num_nodes):
        if parents[j] == node:
            return j
    return -1


cdef inline bint tried_before(
    const int64_t* parents, const token_id_t* ids, Py_ssize_t node, Py_ssize_t first,
    Py_ssize_t child, int64_t token
) noexcept nogil:
    """Whether a sibling tried before ``child`` (from ``first`` on) proposed ``token``."""
    cdef Py_ssize_t j
    for j in range(first, child):
        if parents[j] == node and ids[j] == token:
            return True
    return False


cdef inline double clean(double value) noexcept nogil:
    # Negative and NaN entries weigh 0.
    return value if value > 0.0 else 0.0


cdef inline double residual_update(
    const probability_t* p, const double* residual, double mass, const probability_t* q,
    double q_mass, Py_ssize_t V, double* out
) noexcept nogil:
    """out = (r - q / q_mass)+ with r = residual / mass, or the target row p while no
    residual was kept; returns its float64 sum (``_treescan.h``)."""
    if residual == NULL:
        if probability_t is float:
            return specdec_residual_update_ff(p, 1.0, q, q_mass, V, out)
        else:
            return specdec_residual_update_dd(p, 1.0, q, q_mass, V, out)
    if probability_t is float:
        return specdec_residual_update_df(residual, mass, q, q_mass, V, out)
    else:
        return specdec_residual_update_dd(residual, mass, q, q_mass, V, out)


cdef inline double draft_row_mass(const probability_t* q, Py_ssize_t V) noexcept nogil:
    if probability_t is float:
        return specdec_clean_sum_f(q, V)
    else:
        return specdec_clean_sum_d(q, V)


cdef inline void clean_copy(const probability_t* src, Py_ssize_t V, double* out) noexcept nogil:
    if probability_t is float:
        specdec_clean_copy_f(src, V, out)
    else:
        specdec_clean_copy_d(src, V, out)


DEF MAX_EXCLUDED = 256


cdef Py_ssize_t draw_excluding_children(
    const probability_t* p, const token_id_t* ids, const int64_t* parents,
    Py_ssize_t num_nodes, Py_ssize_t node, Py_ssize_t first, Py_ssize_t V, double v,
    double* working
) noexcept nogil:
    """Inverse-CDF draw at ``v`` from the row ``p`` without the tokens of ``node``'s
    children (from child ``first`` on; -1: none); -1 if nothing with mass is left.

    The children's tokens are few: their weights are taken out of their blocks' sums and
    skipped in the scan, so the row is read about once, as :func:`draw_inverse_cdf` reads
    it, and never copied.  Past ``MAX_EXCLUDED`` distinct tokens the row is copied to
    ``working`` with them zeroed instead."""
    cdef double block_sums[MAX_BLOCKS]
    cdef int64_t excluded[MAX_EXCLUDED]
    cdef Py_ssize_t block
    cdef Py_ssize_t num_blocks, j, y, start, stop, child, count = 0, e
    cdef double total, threshold, running = 0.0, w, scale = 1.0
    cdef int64_t token
    cdef int _attempt
    if first < 0:
        return draw_inverse_cdf(p, <const probability_t*>NULL, -1, 1.0, V, v)
    child = first
    while child >= 0:
        token = ids[child]
        # Insertion into the sorted distinct tokens.
        e = count
        while e > 0 and excluded[e - 1] > token:
            e -= 1
        if e == 0 or excluded[e - 1] != token:
            if count == MAX_EXCLUDED:
                clean_copy(p, V, working)
                child = first
                while child >= 0:
                    working[ids[child]] = 0.0
                    child = next_child(parents, num_nodes, node, child)
                return draw_inverse_cdf(
                    <const double*>working, <const double*>NULL, -1, 1.0, V, v
                )
            for j in range(count, e, -1):
                excluded[j] = excluded[j - 1]
            excluded[e] = token
            count += 1
        child = next_child(parents, num_nodes, node, child)
    block = draw_block_size(V)
    num_blocks = (V + block - 1) // block
    for _attempt in range(2):
        for j in range(num_blocks):
            start = j * block
            stop = start + block if start + block < V else V
            block_sums[j] = weight_sum(
                p, <const probability_t*>NULL, -1, 1.0, scale, start, stop
            )
        for e in range(count):
            y = excluded[e]
            block_sums[y // block] -= residual_weight(
                p, <const probability_t*>NULL, -1, 1.0, scale, y
            )
        total = 0.0
        for j in range(num_blocks):
            # A block whose weights were all taken out can keep a rounding residue.
            if block_sums[j] < 0.0:
                block_sums[j] = 0.0
            total += block_sums[j]
        if not isinf(total):
            break
        scale = ldexp(1.0, SPECDEC_OVERFLOW_EXPONENT)
    if not total > 0.0:
        return -1
    threshold = v * total
    j = block_holding(block_sums, num_blocks, threshold, &running)
    e = 0
    while e < count and excluded[e] < j * block:
        e += 1
    for y in range(j * block, V):
        if e < count and excluded[e] == y:
            e += 1
            continue
        w = residual_weight(p, <const probability_t*>NULL, -1, 1.0, scale, y)
        running += w
        if w > 0.0 and running > threshold:
            return y
    e = count - 1
    y = V - 1
    while y >= 0:
        if e >= 0 and excluded[e] == y:
            e -= 1
        elif residual_weight(p, <const probability_t*>NULL, -1, 1.0, scale, y) > 0.0:
            return y
        y -= 1
    return -1


cdef bint layout_is_valid(
    const int64_t[::1] num_nodes, const int64_t[::1] tree_parents,
    const int64_t[::1] draft_token_ids, int64_t vocab_size, int64_t max_depth,
    int64_t[::1] node_offsets, int64_t[::1] depths,
) noexcept nogil:
    cdef Py_ssize_t B = num_nodes.shape[0], N = tree_parents.shape[0]
    cdef Py_ssize_t b, j, start = 0
    cdef int64_t count, parent, token, depth
    node_offsets[0] = 0
    for b in range(B):
        count = num_nodes[b]
        # Compared with what is left of N, so that the running sum never wraps.
        if count < 0 or count > N - start:
            return False
        for j in range(count):
            parent = tree_parents[start + j]
            if parent < -1 or parent >= j:
                return False
            token = draft_token_ids[start + j]
            if vocab_size >= 0 and (token < 0 or token >= vocab_size):
                return False
            depth = 1 if parent < 0 else depths[start + parent] + 1
            if depth > max_depth:
                return False
            depths[start + j] = depth
        start += count
        node_offsets[b + 1] = start
    return start == N


def tree_layout_is_valid(
    const int64_t[::1] num_nodes,
    const int64_t[::1] tree_parents,
    const int64_t[::1] draft_token_ids,
    int64_t vocab_size,
    int64_t max_depth,
    int64_t[::1] node_offsets,
    int64_t[::1] depths,
):
    """Check a tree layout in one O(N) pass, filling its offsets and depths.

    The checks of ``specdec_np._trees.validate_tree``, whose NumPy passes have fixed costs
    that dominate a small batch: the tree layer calls this first and runs those passes
    (which say what is wrong) only when it fails.

    Parameters
    ----------
    num_nodes : int64 [B]
    tree_parents : int64 [N]
    draft_token_ids : int64 [N]
    vocab_size : int
        Tokens must lie in ``0 .. vocab_size - 1``; negative: not checked.
    max_depth : int
        The deepest node allowed (a child of the root has depth 1).
    node_offsets : int64 [B + 1]
        Written: ``[0, cumsum(num_nodes)]``.
    depths : int64 [N]
        Written: each node's depth.

    Returns
    -------
    bool
        True when every count is ``>= 0`` and they sum to ``N``, every parent lies in
        ``-1 .. node index - 1`` of its request, every token in the vocabulary and every
        depth ``<= max_depth``; False at the first violation (the outputs are then
        partial).
    """
    cdef bint valid
    if (
        node_offsets.shape[0] != num_nodes.shape[0] + 1
        or depths.shape[0] != tree_parents.shape[0]
        or draft_token_ids.shape[0] != tree_parents.shape[0]
    ):
        return False
    with nogil:
        valid = layout_is_valid(
            num_nodes, tree_parents, draft_token_ids, vocab_size, max_depth, node_offsets,
            depths,
        )
    return valid


cdef Py_ssize_t greedy_tree_step(
    const probability_t* target, const token_id_t* ids, const int64_t* parents,
    Request* request, Py_ssize_t node, int64_t* final_token
) noexcept nogil:
    """The child of ``node`` whose token is the argmax of its row, or -1 with that argmax
    in ``final_token``."""
    cdef Py_ssize_t argmax = raw_argmax(target, node + 1, request.V)
    cdef Py_ssize_t child = next_child(parents, request.k, node, node)
    while child >= 0:
        if ids[child] == argmax:
            return child
        child = next_child(parents, request.k, node, child)
    final_token[0] = argmax
    return -1


cdef Py_ssize_t point_mass_tree_step(
    const probability_t* target, const token_id_t* ids, const int64_t* parents,
    Request* request, Py_ssize_t node, double* working, int64_t* final_token
) noexcept nogil:
    """Deterministic candidates: accept child j iff u_j (1 - removed) < r(x_j), where r is
    the row with the tokens of the siblings tried before removed (``removed`` their mass);
    if every child fails, draw from the row without them.  Returns the accepted child, or
    -1 with the final token (-2: the row has no mass)."""
    cdef Py_ssize_t V = request.V, row = node + 1
    cdef Py_ssize_t first = next_child(parents, request.k, node, node)
    cdef Py_ssize_t child = first
    cdef double removed = 0.0, r_x
    cdef int64_t x, last_removed = -1
    cdef Py_ssize_t token
    cdef const probability_t* p
    while child >= 0:
        x = ids[child]
        if tried_before(parents, ids, node, first, child, x):
            r_x = 0.0
        else:
            r_x = target_probability(request, target, row, x)
        if request.uniforms[child] * (1.0 - removed) < r_x:
            return child
        if r_x > 0.0:
            removed += r_x
            last_removed = x
        child = next_child(parents, request.k, node, child)
    p = probability_row(request, target, row, False)
    token = draw_excluding_children(
        p, ids, parents, request.k, node, first, V, request.uniforms[request.k], working
    )
    if token < 0 and first >= 0:
        # Only rounding leaves nothing: the last rejection removed the last token with
        # mass, which the exact walk would have accepted.
        token = last_removed
    if token < 0:
        return -2
    final_token[0] = token
    return -1


cdef Py_ssize_t residual_tree_step(
    const probability_t* target, const probability_t* draft, const token_id_t* ids,
    const int64_t* parents, Request* request, Py_ssize_t node, bint without_replacement,
    double* working, int64_t* final_token
) noexcept nogil:
    """SpecInfer (and, ``without_replacement``, RRS): accept child j iff u_j q_j(x_j) <
    r(x_j); on rejection r <- (r - q_j)+ renormalised, kept only if it has mass.  For RRS
    q_j is the draft row with the tokens of the siblings tried before taken out and
    renormalised.  ``working`` holds two rows of V (the residual and its update).
    Returns the accepted child, or -1 with the final token (-2: no mass)."""
    cdef Py_ssize_t V = request.V, row = node + 1
    cdef Py_ssize_t first = next_child(parents, request.k, node, node)
    cdef Py_ssize_t child = first, sibling
    cdef double* residual = NULL
    cdef double* update
    cdef double mass = 1.0, q_mass, r_x, q_x, updated_mass, a
    cdef int64_t x, t
    cdef Py_ssize_t token
    cdef const probability_t* p = NULL
    cdef const probability_t* q
    while child >= 0:
        x = ids[child]
        q = NULL
        q_mass = 1.0
        if without_replacement and child != first:
            q = probability_row(request, draft, child, True)
            q_mass = draft_row_mass(q, V)
            sibling = first
            while sibling < child:
                t = ids[sibling]
                if not tried_before(parents, ids, node, first, sibling, t):
                    q_mass -= clean(q[t])
                sibling = next_child(parents, request.k, node, sibling)
            if tried_before(parents, ids, node, first, child, x):
                q_x = 0.0
            else:
                q_x = clean(q[x])
            if not q_mass > 0.0:
                q_mass = 1.0
            elif q_mass != 1.0:
                q_x = q_x / q_mass
        else:
            q_x = draft_probability(request, draft, child, x)
        if residual != NULL:
            r_x = residual[x]
        else:
            r_x = target_probability(request, target, row, x)
        if mass != 1.0:
            r_x = r_x / mass
        if request.uniforms[child] * q_x < r_x:
            return child
        if q == NULL:
            q = probability_row(request, draft, child, True)
        if residual == NULL and p == NULL:
            p = probability_row(request, target, row, False)
        if residual == NULL and q_mass == 1.0 and next_child(parents, request.k, node, child) < 0:
            # The last child of a node whose residual is still its row (a chain's case):
            # the draw from (p - q)+, or from p if that has no mass, reads both rows as the
            # chain verifiers do, instead of writing the update first.  The weights, block
            # sums and fallback are those of the update and the draw below.
            token = draw_residual(p, q, -1, 1.0, V, request.uniforms[request.k])
            if token < 0:
                return -2
            final_token[0] = token
            return -1
        update = working if residual != working else working + V
        updated_mass = residual_update(p, residual, mass, q, q_mass, V, update)
        if without_replacement and child != first:
            # The tried siblings' tokens are out of q_j: their residual is r alone.
            sibling = first
            while sibling < child:
                t = ids[sibling]
                if not tried_before(parents, ids, node, first, sibling, t):
                    a = residual[t] if residual != NULL else <double>p[t]
                    if mass != 1.0:
                        a = a / mass
                    a = clean(a)
                    updated_mass += a - update[t]
                    update[t] = a
                sibling = next_child(parents, request.k, node, sibling)
        if updated_mass > 0.0:
            residual = update
            mass = updated_mass
        child = next_child(parents, request.k, node, child)
    if residual != NULL:
        token = draw_inverse_cdf(
            <const double*>residual, <const double*>NULL, -1, 1.0, V, request.uniforms[request.k]
        )
    else:
        if p == NULL:
            p = probability_row(request, target, row, False)
        token = draw_inverse_cdf(
            p, <const probability_t*>NULL, -1, 1.0, V, request.uniforms[request.k]
        )
    if token < 0:
        return -2
    final_token[0] = token
    return -1


cdef int64_t walk_tree(
    int method, const probability_t* target, const probability_t* draft,
    const token_id_t* ids, const int64_t* parents, Py_ssize_t num_nodes, Py_ssize_t V,
    const double* uniforms, const double* sampling, probability_t* scratch, double* working,
    Py_ssize_t depth_width, int64_t* nodes_out, int64_t* tokens_out, int64_t* length
) noexcept nogil:
    """One request's walk: id check, steps from the root, output rows; a row status."""
    cdef Request request_fields
    cdef Request* request = &request_fields
    cdef Py_ssize_t node = -1, child, depth = 0, i
    cdef int64_t final_token = -1
    cdef bint use_drafts
    cdef Py_ssize_t bad = invalid_id_column(ids, 0, num_nodes, V)
    if bad >= 0:
        return 1 + bad
    init_request(request, num_nodes, V, uniforms, NULL, True, sampling, scratch)
    # Without draft rows SpecInfer and RRS walk as point-mass candidates.
    use_drafts = draft != NULL and (method == WALK_SPECINFER or method == WALK_RRS)
    while True:
        if method == WALK_GREEDY:
            child = greedy_tree_step(target, ids, parents, request, node, &final_token)
        elif use_drafts:
            child = residual_tree_step(
                target, draft, ids, parents, request, node, method == WALK_RRS, working,
                &final_token,
            )
        else:
            child = point_mass_tree_step(
                target, ids, parents, request, node, working, &final_token
            )
        if child == -2:
            return -(1 + node + 1)
        if child < 0:
            break
        if depth == depth_width:
            # The driver checked the output against the deepest node; this bound only
            # keeps a write inside the row whatever happens.
            return 1 + child
        nodes_out[depth] = child
        tokens_out[depth] = ids[child]
        depth += 1
        node = child
    tokens_out[depth] = final_token
    length[0] = depth
    for i in range(depth, depth_width):
        nodes_out[i] = -1
        tokens_out[i + 1] = -1
    return 0


def verify_trees(
    int method,
    const probability_t[:, ::1] target_rows,
    const probability_t[:, ::1] draft_rows,
    bint point_mass_drafts,
    const token_id_t[::1] draft_token_ids,
    const int64_t[::1] tree_parents,
    const int64_t[::1] node_offsets,
    const double[:, ::1] uniforms,
    int64_t[:, ::1] accepted_nodes,
    int64_t[:, ::1] output,
    int64_t[::1] accepted_lengths,
    int64_t[::1] row_status,
    int num_threads,
    const int8_t[::1] request_methods=None,
    const double[:, ::1] sampling=None,
    probability_t[:, ::1] scratch=None,
    double[:, ::1] working=None,
):
    """Verify a batch of draft trees with the walks of ``TREE_WALKS``.

    Parameters
    ----------
    method : int
        Index into ``TREE_WALKS``: the walk of every request (unless ``request_methods``).
    target_rows : float32 or float64 [N + B, V], C-contiguous
        Request ``b`` owns the ``N_b + 1`` rows from ``node_offsets[b] + b`` on: its root
        row, then one row per node.
    draft_rows : same dtype [N, V]
        The row each node was drawn from; ignored when ``point_mass_drafts``.
    point_mass_drafts : bool
    draft_token_ids : int32 or int64 [N]
    tree_parents : int64 [N]
        Parent of each node within its request (``-1``: the root), below the node's index.
    node_offsets : int64 [B + 1]
        ``0 = node_offsets[0] <= ... <= node_offsets[B] = N``.
    uniforms : float64 [B, W]
        Request ``b`` reads column ``j`` for node ``j``'s test and column ``N_b`` for the
        final token; ``W >= max N_b + 1`` when a request walks stochastically, else any.
    accepted_nodes : int64 [B, D]
        ``D`` at least the deepest node of the batch; written ``-1`` padded.
    output : int64 [B, D + 1]
    accepted_lengths, row_status : int64 [B]
        Row status: 0, ``1 + j`` for a bad token id at node ``j``, ``-(1 + i)`` for a row
        without mass (``i = 0`` the root, ``j + 1`` node ``j``).
    num_threads : int
    request_methods : int8 [B], optional
        Per-request index into ``TREE_WALKS`` (mixed greedy and sampled batches).
    sampling : float64 [B, 4], optional
        The rows are logits: per request ``(temperature, top_k, top_p, min_p)``.
    scratch : same dtype as the rows [num_threads, 2 V], optional
        With ``sampling``: a thread's processed target and draft row.
    working : float64 [num_threads, 2 V], optional
        A thread's residual rows; required when a request walks stochastically.

    Returns
    -------
    int
        The first request whose ``row_status`` is not 0, or -1.
    """
    cdef Py_ssize_t B = node_offsets.shape[0] - 1
    cdef Py_ssize_t V = target_rows.shape[1]
    cdef Py_ssize_t N = draft_token_ids.shape[0]
    cdef Py_ssize_t D = accepted_nodes.shape[1]
    cdef Py_ssize_t b, j, start, max_nodes, thread, parent, max_depth = 0
    cdef int64_t[::1] depths
    cdef int request_method
    cdef bint stochastic = method != WALK_GREEDY
    cdef bint per_request = request_methods is not None
    cdef Py_ssize_t threads = num_threads if num_threads > 1 else 1
    cdef const probability_t* draft_base
    cdef const token_id_t* ids_base
    cdef const int64_t* parents_base
    cdef const double* uniform_base
    cdef const double* sampling_base = NULL
    cdef probability_t* scratch_base = NULL
    cdef double* working_base = NULL
    require(B >= 0, "node_offsets must have B + 1 entries")
    require(0 <= method < len(TREE_WALKS), "unknown tree walk")
    require(V >= 1, "the vocabulary must not be empty")
    max_nodes = require_offsets(node_offsets, B, N)
    require(tree_parents.shape[0] == N, "tree_parents must have N entries")
    depths = array((N if N > 0 else 1,), sizeof(int64_t), "q")
    for b in range(B):
        start = node_offsets[b]
        for j in range(node_offsets[b + 1] - start):
            parent = tree_parents[start + j]
            require(
                -1 <= parent < j, "tree_parents must name an earlier node of the request or -1"
            )
            depths[start + j] = 1 if parent < 0 else depths[start + parent] + 1
            max_depth = depths[start + j] if depths[start + j] > max_depth else max_depth
    require(D >= max_depth, "accepted_nodes must be [B, >= the deepest node]")
    require(target_rows.shape[0] == N + B, "target_rows must have N + B rows")
    require(
        point_mass_drafts or (draft_rows.shape[0] == N and draft_rows.shape[1] == V),
        "draft_rows must be [N, V]",
    )
    require(
        accepted_nodes.shape[0] == B and output.shape[0] == B and output.shape[1] == D + 1
        and accepted_lengths.shape[0] == B and row_status.shape[0] == B,
        "outputs must be [B, D], [B, D + 1] and [B]",
    )
    if per_request:
        require(request_methods.shape[0] == B, "request_methods must have B entries")
        for b in range(B):
            require(0 <= request_methods[b] < len(TREE_WALKS), "unknown tree walk")
            stochastic = stochastic or request_methods[b] != WALK_GREEDY
    require(
        not stochastic or (uniforms.shape[0] == B and uniforms.shape[1] >= max_nodes + 1),
        "uniforms must be [B, >= max N_b + 1]",
    )
    require(
        not stochastic or (
            working is not None and working.shape[0] >= threads and working.shape[1] == 2 * V
        ),
        "working must be [num_threads, 2 V]",
    )
    if sampling is not None:
        require(sampling.shape[0] == B and sampling.shape[1] == 4, "sampling must be [B, 4]")
        require(
            scratch is not None and scratch.shape[0] >= threads and scratch.shape[1] == 2 * V,
            "scratch must be [num_threads, 2 V]",
        )
    if B == 0:
        return -1
    if sampling is not None:
        sampling_base = &sampling[0, 0]
        scratch_base = &scratch[0, 0]
    if stochastic:
        working_base = &working[0, 0]
    draft_base = NULL if point_mass_drafts or N == 0 else &draft_rows[0, 0]
    ids_base = &draft_token_ids[0] if N > 0 else NULL
    parents_base = &tree_parents[0] if N > 0 else NULL
    uniform_base = &uniforms[0, 0] if stochastic else NULL
    for b in prange(
        B, nogil=True, num_threads=num_threads, schedule="dynamic",
        use_threads_if=num_threads > 1,
    ):
        start = node_offsets[b]
        thread = threadid()
        request_method = request_methods[b] if per_request else method
        row_status[b] = walk_tree(
            request_method,
            &target_rows[start + b, 0],
            NULL if draft_base == NULL else draft_base + start * V,
            ids_base + start if ids_base != NULL else ids_base,
            parents_base + start if parents_base != NULL else parents_base,
            node_offsets[b + 1] - start, V,
            NULL if uniform_base == NULL else uniform_base + b * uniforms.shape[1],
            NULL if sampling_base == NULL else sampling_base + 4 * b,
            NULL if scratch_base == NULL else scratch_base + thread * 2 * V,
            NULL if working_base == NULL else working_base + thread * 2 * V,
            D, &accepted_nodes[b, 0] if D > 0 else NULL, &output[b, 0],
            &accepted_lengths[b],
        )
    return first_failed_row(row_status)
