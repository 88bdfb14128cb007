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

from cython.parallel cimport prange
from libc.math cimport exp, isinf, ldexp
from libc.stdint cimport int32_t, int64_t, uint8_t

cdef extern from "_rowscan.h" nogil:
    double specdec_residual_sum_f(
        const float* p, const float* q, Py_ssize_t point_mass, double rho, double scale,
        Py_ssize_t start, Py_ssize_t stop,
    )
    double specdec_residual_sum_d(
        const double* p, const double* q, Py_ssize_t point_mass, double rho, double scale,
        Py_ssize_t start, Py_ssize_t stop,
    )
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
# A float64 residual sum that overflows is recomputed with every weight times 2**-64:
# exact for every weight that matters (weights below 2**-960 of the largest are lost, far
# below any probability a double can resolve).
DEF OVERFLOW_EXPONENT = -64

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
    block, so the row is read about 1.x times.
    """
    cdef double block_sums[MAX_BLOCKS]
    cdef Py_ssize_t block = MIN_BLOCK
    cdef Py_ssize_t num_blocks, j, y, start, stop
    cdef double total, threshold, running = 0.0, w, scale = 1.0
    cdef int _attempt
    if V > block * MAX_BLOCKS:
        block = ((V + MAX_BLOCKS - 1) // MAX_BLOCKS + 7) // 8 * 8
    num_blocks = (V + block - 1) // block
    for _attempt in range(2):
        total = 0.0
        for j in range(num_blocks):
            start = j * block
            stop = start + block if start + block < V else V
            block_sums[j] = weight_sum(p, q, point_mass, rho, scale, start, stop)
            total += block_sums[j]
        if not isinf(total):
            break
        # Finite weights whose float64 sum overflows (float64 rows near 1e308): scale them
        # down by a power of two rather than let v * inf bias the draw to the last token.
        scale = ldexp(1.0, OVERFLOW_EXPONENT)
    if not total > 0.0:
        return -1
    threshold = v * total
    j = 0
    while j < num_blocks and not running + block_sums[j] > threshold:
        running += block_sums[j]
        j += 1
    # Scan on from the chosen block; it normally ends inside it, but block sums and the
    # running sum round differently, so a miss simply continues to the next block.
    for y in range(j * block, V):
        w = residual_weight(p, q, point_mass, rho, scale, y)
        running += w
        if w > 0.0 and running > threshold:
            return y
    # Rounding made the scan miss (or a weight was infinite): the last positive weight.
    y = V - 1
    while y >= 0:
        if residual_weight(p, q, point_mass, rho, scale, y) > 0.0:
            return y
        y -= 1
    return -1


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


cdef inline double draft_probability(
    const probability_t* draft, Py_ssize_t i, Py_ssize_t V, Py_ssize_t x
) noexcept nogil:
    # Negative and NaN draft entries count as 0 (so u * q < p never accepts p <= 0).
    cdef double q_x
    if draft == NULL:
        return 1.0
    q_x = draft[i * V + x]
    return q_x if q_x > 0.0 else 0.0


# --------------------------------------------------------------------------------------
# Row functions: one request of any layout.  Each gets the request's k + 1 target rows
# (contiguous, row stride V), its k draft rows (or NULL for point-mass drafts), its k
# draft ids (already checked against V), its bonus id, its uniforms and the verifier's
# parameters; it writes the accepted length, the emitted token after the accepted prefix
# and the per-request acceptance count, and returns a row status.
# --------------------------------------------------------------------------------------

cdef int64_t rejection_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, const double* uniforms, Py_ssize_t k, Py_ssize_t V,
    const double* parameters, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t i, r = k, token
    cdef int64_t passed = 0
    cdef double p_x
    for i in range(k):
        # Each position is tested independently, as vLLM counts acceptances.
        p_x = target[i * V + draft_ids[i]]
        if uniforms[i] * draft_probability(draft, i, V, draft_ids[i]) < p_x:
            passed += 1
        elif r == k:
            r = i
    num_accepted[0] = passed
    accepted_length[0] = r
    if r == k:
        last_token[0] = bonus_id
        return 0
    token = draw_residual(
        target + r * V, draft + r * V if draft != NULL else draft, draft_ids[r], 1.0, V,
        uniforms[k],
    )
    if token < 0:
        return -(1 + r)
    last_token[0] = token
    return 0


cdef double block_weight(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    Py_ssize_t i, Py_ssize_t V
) noexcept nogil:
    """rho_i of block verification: rho_0 = 1, rho_j = min(1, rho_{j-1} p(x) / q(x)).

    Recomputed from the start each time, in one fixed order: the backward scan needs it
    at a few positions only, and a row read costs far more than these k scalars.  A token
    with p <= 0 (or NaN) sets rho to 0 for good, so no later q = 0 can revive it.
    """
    cdef double rho = 1.0, p_x, q_x
    cdef Py_ssize_t j
    for j in range(i):
        p_x = target[j * V + draft_ids[j]]
        q_x = draft_probability(draft, j, V, draft_ids[j])
        if not p_x > 0.0 or rho == 0.0:
            rho = 0.0
        elif rho * p_x >= q_x:
            rho = 1.0
        else:
            rho = rho * p_x / q_x
    return rho


cdef int64_t block_verification_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    int64_t bonus_id, const double* uniforms, Py_ssize_t k, Py_ssize_t V,
    const double* parameters, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t i, tau = 0, token
    cdef double rho, h, total, denominator
    cdef const probability_t* draft_row
    # tau is the largest i whose check passes: scan down and stop there, so that no row
    # below tau is read (a later position can rescue an earlier failed check).
    i = k
    while i >= 1:
        rho = block_weight(target, draft, draft_ids, i, V)
        if i == k or rho >= 1.0 or rho == 0.0:
            # h_k = rho_k; rho_i = 1 gives h_i = 1 and rho_i = 0 gives h_i = 0 unread.
            h = rho
        else:
            draft_row = draft + i * V if draft != NULL else draft
            total = residual_total(
                target + i * V, draft_row, -1 if draft != NULL else draft_ids[i], rho, V
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
    rho = block_weight(target, draft, draft_ids, tau, V)
    token = draw_residual(
        target + tau * V, draft + tau * V if draft != NULL else draft, draft_ids[tau], rho, V,
        uniforms[k],
    )
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
    int64_t bonus_id, const double* uniforms, Py_ssize_t k, Py_ssize_t V,
    const double* parameters, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t i, r = k, recovered = 0, argmax = 0
    cdef int64_t passed = 0
    cdef double p_x, entropy, threshold
    cdef double posterior_threshold = parameters[0], posterior_alpha = parameters[1]
    for i in range(k):
        p_x = target[i * V + draft_ids[i]]
        # The threshold never exceeds posterior_threshold: above it, no entropy is needed.
        if p_x > posterior_threshold:
            passed += 1
            continue
        # The argmax is only needed at the first rejection, so only while none was seen.
        entropy = entropy_and_argmax(target + i * V, V, True, &argmax if r == k else NULL)
        # alpha = 0 means a zero threshold even where exp(-H) overflows (0 * inf is NaN).
        threshold = posterior_alpha * exp(-entropy) if posterior_alpha > 0.0 else 0.0
        if threshold > posterior_threshold:
            threshold = posterior_threshold
        if p_x > threshold:
            passed += 1
        elif r == k:
            r = i
            recovered = argmax
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
    int64_t bonus_id, const double* uniforms, Py_ssize_t k, Py_ssize_t V,
    const double* parameters, int64_t* last_token, int64_t* accepted_length,
    int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t i, x, r = k, recovered = 0, argmax = 0
    cdef int64_t passed = 0
    cdef bint accepted
    for i in range(k):
        x = draft_ids[i]
        if target[i * V + x] > 0.5 + SPECDEC_GREEDY_MARGIN:
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


cdef inline int64_t verify_request(
    int method, const probability_t* target, const probability_t* draft,
    const token_id_t* draft_ids, int64_t bonus_id, const double* uniforms, Py_ssize_t k,
    Py_ssize_t V, const double* parameters, Py_ssize_t width, int64_t* out,
    int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil:
    """The skeleton every verifier shares: id check, row function, output row."""
    cdef int64_t status, last_token = 0
    cdef Py_ssize_t bad = invalid_id_column(draft_ids, bonus_id, k, V)
    if bad >= 0:
        return 1 + bad
    if method == ROW_REJECTION:
        status = rejection_row(
            target, draft, draft_ids, bonus_id, uniforms, k, V, parameters, &last_token,
            accepted_length, num_accepted,
        )
    elif method == ROW_BLOCK:
        status = block_verification_row(
            target, draft, draft_ids, bonus_id, uniforms, k, V, parameters, &last_token,
            accepted_length, num_accepted,
        )
    elif method == ROW_TYPICAL:
        status = typical_acceptance_row(
            target, draft, draft_ids, bonus_id, uniforms, k, V, parameters, &last_token,
            accepted_length, num_accepted,
        )
    else:
        status = greedy_row(
            target, draft, draft_ids, bonus_id, uniforms, k, V, parameters, &last_token,
            accepted_length, num_accepted,
        )
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
):
    """Verify a batch of draft chains with the row function ``ROW_FUNCTIONS[method]``.

    Parameters
    ----------
    method : int
        Index into ``ROW_FUNCTIONS``.
    target_rows : float32 or float64 [T + B, V], C-contiguous
        Request ``b`` owns the ``k_b + 1`` rows from ``draft_offsets[b] + b`` on: its draft
        positions, then its bonus position.
    draft_rows : same dtype [T, V]
        Ignored (pass any array of the right dtype) when ``point_mass_drafts``.
    point_mass_drafts : bool
        Drafts are point masses at their token ids.
    draft_token_ids : int32 or int64 [T]
    bonus_token_ids : same dtype [B]
    draft_offsets : int64 [B + 1]
        ``0 = draft_offsets[0] <= ... <= draft_offsets[B] = T``; ``k_b`` is the difference.
    uniforms : float64 [B, W]
        Request ``b`` reads columns ``0 .. k_b``: acceptance uniforms, then the residual
        one.  ``W >= max k_b + 1`` for the stochastic verifiers; ``[B, 0]`` for the others.
    parameters : float64 [P]
        The verifier's parameters (typical acceptance: threshold, alpha).
    output : int64 [B, width], ``width >= max k_b + 1``
    accepted_lengths, num_accepted, row_status : int64 [B]
        Accepted prefix length, acceptance count and row status (``specdec_np._contract``).
    num_threads : int
        Threads for the loop over requests.

    Returns
    -------
    int
        The first request whose ``row_status`` is not 0, or -1 if every request verified.
    """
    cdef Py_ssize_t B = bonus_token_ids.shape[0]
    cdef Py_ssize_t V = target_rows.shape[1]
    cdef Py_ssize_t T = draft_token_ids.shape[0]
    cdef Py_ssize_t width = output.shape[1]
    cdef Py_ssize_t b, max_k, start
    cdef bint stochastic = method == ROW_REJECTION or method == ROW_BLOCK
    cdef const probability_t* draft_base
    cdef const token_id_t* ids_base
    cdef const double* uniform_base
    require(0 <= method < len(ROW_FUNCTIONS), "unknown row function")
    require(V >= 1, "the vocabulary must not be empty")
    max_k = require_offsets(draft_offsets, B, T)
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
    require(
        not stochastic or (uniforms.shape[0] == B and uniforms.shape[1] >= max_k + 1),
        "uniforms must be [B, >= max k + 1]",
    )
    require(method != ROW_TYPICAL or parameters.shape[0] >= 2, "typical needs 2 parameters")
    if B == 0:
        return -1
    draft_base = NULL if point_mass_drafts or T == 0 else &draft_rows[0, 0]
    # Pointer arithmetic, not indexing: a last request with k_b = 0 starts at T.
    ids_base = &draft_token_ids[0] if T > 0 else NULL
    uniform_base = &uniforms[0, 0] if stochastic else NULL
    # use_threads_if: a one-thread call skips the OpenMP team (about half a microsecond).
    for b in prange(
        B, nogil=True, num_threads=num_threads, schedule="dynamic",
        use_threads_if=num_threads > 1,
    ):
        start = draft_offsets[b]
        row_status[b] = verify_request(
            method,
            &target_rows[start + b, 0],
            NULL if draft_base == NULL else draft_base + start * V,
            ids_base + start if ids_base != NULL else ids_base,
            bonus_token_ids[b],
            NULL if uniform_base == NULL else uniform_base + b * uniforms.shape[1],
            draft_offsets[b + 1] - start, V,
            &parameters[0] if parameters.shape[0] > 0 else NULL,
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
