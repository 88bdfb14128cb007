# cython: language_level=3
"""CPU kernels of specdec_np.

Kernels only: every function here trusts its caller (``specdec_np._backend``) for shapes,
dtypes and contiguity, and reads random uniforms that the caller drew.  What a kernel never
trusts is a token id: each row checks its ids against the vocabulary before it uses one as
an index, and reports a bad id through ``row_status`` instead of reading out of bounds.

``row_status[b]`` protocol, shared by every batch kernel:

* ``0``: row ``b`` verified;
* ``1 + c``: the token id in column ``c`` of the virtual ``[B, k + 1]`` id array (columns
  ``0 .. k-1`` are the draft ids, column ``k`` is the bonus id) is outside ``[0, V)``;
  nothing else of that row was read or written;
* ``-(1 + r)``: the rejection sampler had to draw at position ``r`` and the target row had no
  positive probability (invalid input); the row's output is meaningless.
"""

from cython.parallel cimport prange
from libc.math cimport exp
from libc.stdint cimport int32_t, int64_t, uint8_t

cdef extern from "_rowscan.h" nogil:
    double specdec_residual_sum_f(
        const float* p, const float* q, Py_ssize_t point_mass, Py_ssize_t start,
        Py_ssize_t stop,
    )
    double specdec_residual_sum_d(
        const double* p, const double* q, Py_ssize_t point_mass, Py_ssize_t start,
        Py_ssize_t stop,
    )
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

# Greedy shortcut: a draft token with p(x) above 1/2 + GREEDY_MARGIN is the unique argmax of
# any row whose sum is within 2 * GREEDY_MARGIN of one (checked in strict mode).
DEF GREEDY_MARGIN_C = 5e-4
GREEDY_MARGIN = GREEDY_MARGIN_C


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
# Inverse-CDF draw for the rejection sampler
# --------------------------------------------------------------------------------------

cdef inline double residual_weight(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass, Py_ssize_t y
) noexcept nogil:
    # Weight max(p - q, 0) in float64.  With q == NULL the draft is a point mass at
    # ``point_mass`` (q = 1 there, 0 elsewhere; -1 means q = 0 everywhere), which makes
    # point-mass drafts identical to one-hot draft rows.  NaN fails ``> 0`` and weighs 0.
    cdef double w
    if q != NULL:
        w = <double>p[y] - <double>q[y]
    else:
        w = <double>p[y] - (1.0 if y == point_mass else 0.0)
    return w if w > 0.0 else 0.0


cdef inline double weight_sum(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass,
    Py_ssize_t start, Py_ssize_t stop
) noexcept nogil:
    if probability_t is float:
        return specdec_residual_sum_f(p, q, point_mass, start, stop)
    else:
        return specdec_residual_sum_d(p, q, point_mass, start, stop)


cdef Py_ssize_t draw_inverse_cdf(
    const probability_t* p, const probability_t* q, Py_ssize_t point_mass,
    Py_ssize_t V, double v
) noexcept nogil:
    """Token drawn from the weights max(p - q, 0) by inverse CDF at v; -1 if they sum to 0.

    Pass 1 sums blocks of the row; pass 2 skips whole blocks by their sums and scans one
    block, so the row is read about 1.x times.
    """
    cdef double block_sums[MAX_BLOCKS]
    cdef Py_ssize_t block = MIN_BLOCK
    cdef Py_ssize_t num_blocks, j, y, start, stop
    cdef double total = 0.0, threshold, running = 0.0, w
    if V > block * MAX_BLOCKS:
        block = ((V + MAX_BLOCKS - 1) // MAX_BLOCKS + 7) // 8 * 8
    num_blocks = (V + block - 1) // block
    for j in range(num_blocks):
        start = j * block
        stop = start + block if start + block < V else V
        block_sums[j] = weight_sum(p, q, point_mass, start, stop)
        total += block_sums[j]
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
        w = residual_weight(p, q, point_mass, y)
        running += w
        if w > 0.0 and running > threshold:
            return y
    # Rounding made the scan miss (or the total was infinite): the last positive weight.
    y = V - 1
    while y >= 0:
        if residual_weight(p, q, point_mass, y) > 0.0:
            return y
        y -= 1
    return -1


cdef inline Py_ssize_t invalid_id_column(
    const token_id_t* draft_ids, token_id_t bonus_id, Py_ssize_t k, Py_ssize_t V
) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(k):
        if draft_ids[i] < 0 or draft_ids[i] >= V:
            return i
    if bonus_id < 0 or bonus_id >= V:
        return k
    return -1


cdef inline int require(bint condition, str what) except -1:
    # O(1) guard: the kernels index with bounds checks off, so mismatched shapes from a
    # direct caller must stop here rather than in an out-of-bounds read.
    if not condition:
        raise ValueError(f"kernel arguments have inconsistent shapes: {what}")
    return 0


cdef inline int require_rows(
    Py_ssize_t B, Py_ssize_t k, Py_ssize_t V, Py_ssize_t positions,
    Py_ssize_t ids_rows, Py_ssize_t bonus_rows, const int64_t[:, ::1] output,
    Py_ssize_t lengths_rows, Py_ssize_t accepted_rows, Py_ssize_t status_rows,
) except -1:
    require(k >= 1 and V >= 1 and positions == k + 1, "target must be [B, k+1, V], k, V >= 1")
    require(ids_rows == B and bonus_rows == B, "token ids must have B rows")
    require(
        output.shape[0] == B and output.shape[1] == k + 1 and lengths_rows == B
        and accepted_rows == B and status_rows == B,
        "outputs must be [B, k+1] and [B]",
    )
    return 0


cdef Py_ssize_t first_failed_row(const int64_t[::1] row_status) noexcept nogil:
    cdef Py_ssize_t b
    for b in range(row_status.shape[0]):
        if row_status[b] != 0:
            return b
    return -1


cdef inline void write_output_row(
    const token_id_t* draft_ids, Py_ssize_t accepted_length, int64_t last_token,
    Py_ssize_t k, int64_t* out
) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(accepted_length):
        out[i] = draft_ids[i]
    out[accepted_length] = last_token
    for i in range(accepted_length + 1, k + 1):
        out[i] = -1


cdef int64_t rejection_row(
    const probability_t* target, const probability_t* draft, const token_id_t* draft_ids,
    token_id_t bonus_id, const double* uniforms, Py_ssize_t k, Py_ssize_t V,
    int64_t* out, int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t i, x, r = k, token
    cdef int64_t passed = 0
    cdef double p_x, q_x
    cdef Py_ssize_t bad = invalid_id_column(draft_ids, bonus_id, k, V)
    if bad >= 0:
        return 1 + bad
    for i in range(k):
        x = draft_ids[i]
        p_x = target[i * V + x]
        q_x = draft[i * V + x] if draft != NULL else 1.0
        if uniforms[i] * q_x < p_x:
            passed += 1
        elif r == k:
            r = i
    num_accepted[0] = passed
    accepted_length[0] = r
    if r == k:
        write_output_row(draft_ids, k, bonus_id, k, out)
        return 0
    x = draft_ids[r]
    if draft != NULL:
        token = draw_inverse_cdf(target + r * V, draft + r * V, -1, V, uniforms[k])
    else:
        token = draw_inverse_cdf(target + r * V, <const probability_t*>NULL, x, V, uniforms[k])
    if token < 0:
        # The residual has no mass (the rejection had probability zero): draw from p_r.
        token = draw_inverse_cdf(target + r * V, <const probability_t*>NULL, -1, V, uniforms[k])
    if token < 0:
        return -(1 + r)
    write_output_row(draft_ids, r, token, k, out)
    return 0


def rejection_sample(
    const probability_t[:, :, ::1] target_with_bonus_probs,
    const probability_t[:, :, ::1] draft_probs,
    bint point_mass_drafts,
    const token_id_t[:, ::1] draft_token_ids,
    const token_id_t[::1] bonus_token_ids,
    const double[:, ::1] uniforms,
    int64_t[:, ::1] output,
    int64_t[::1] accepted_lengths,
    int64_t[::1] num_accepted,
    int64_t[::1] row_status,
    int num_threads,
):
    """Fused rejection-sampling verification of a batch (SPEC 4.1).

    Parameters
    ----------
    target_with_bonus_probs : float32 or float64 [B, k+1, V], C-contiguous
    draft_probs : same dtype [B, k, V]
        Ignored (pass any array of the right dtype) when ``point_mass_drafts``.
    point_mass_drafts : bool
        Drafts are point masses at ``draft_token_ids`` (``draft_probs=None``).
    draft_token_ids : int32 or int64 [B, k]
    bonus_token_ids : same dtype [B]
    uniforms : float64 [B, k+1]
        Columns ``0 .. k-1`` are the acceptance uniforms, column ``k`` the residual one.
    output : int64 [B, k+1]
    accepted_lengths, num_accepted, row_status : int64 [B]
        Outputs: accepted prefix length, acceptance tests passed (all positions), and the
        row status of the module docstring.
    num_threads : int
        Threads for the loop over rows.

    Returns
    -------
    int
        The first row whose ``row_status`` is not 0, or -1 if every row verified.
    """
    cdef Py_ssize_t B = target_with_bonus_probs.shape[0]
    cdef Py_ssize_t k = draft_token_ids.shape[1]
    cdef Py_ssize_t V = target_with_bonus_probs.shape[2]
    cdef Py_ssize_t b
    cdef const probability_t* draft_base
    require_rows(
        B, k, V, target_with_bonus_probs.shape[1], draft_token_ids.shape[0],
        bonus_token_ids.shape[0], output, accepted_lengths.shape[0], num_accepted.shape[0],
        row_status.shape[0],
    )
    require(uniforms.shape[0] == B and uniforms.shape[1] == k + 1, "uniforms must be [B, k+1]")
    require(
        point_mass_drafts or (
            draft_probs.shape[0] == B and draft_probs.shape[1] == k and draft_probs.shape[2] == V
        ),
        "draft_probs must be [B, k, V]",
    )
    if B == 0:
        return -1
    draft_base = NULL if point_mass_drafts else &draft_probs[0, 0, 0]
    # use_threads_if: a one-thread call skips the OpenMP team (about half a microsecond).
    for b in prange(
        B, nogil=True, num_threads=num_threads, schedule="dynamic",
        use_threads_if=num_threads > 1,
    ):
        row_status[b] = rejection_row(
            &target_with_bonus_probs[b, 0, 0],
            NULL if draft_base == NULL else draft_base + b * k * V,
            &draft_token_ids[b, 0], bonus_token_ids[b], &uniforms[b, 0], k, V,
            &output[b, 0], &accepted_lengths[b], &num_accepted[b],
        )
    return first_failed_row(row_status)


# --------------------------------------------------------------------------------------
# Entropy and argmax for the deterministic verifiers
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
    """Entropy -sum p ln(p + 1e-5) (float64, if ``want_entropy``) and, if ``argmax`` is not
    NULL, the first index of the maximum, both in one pass.  NaN entries never win the
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
    const probability_t* target, const token_id_t* draft_ids, token_id_t bonus_id,
    Py_ssize_t k, Py_ssize_t V, double posterior_threshold, double posterior_alpha,
    int64_t* out, int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t i, r = k, recovered = 0, argmax = 0
    cdef int64_t passed = 0
    cdef double p_x, entropy, threshold
    cdef Py_ssize_t bad = invalid_id_column(draft_ids, bonus_id, k, V)
    if bad >= 0:
        return 1 + bad
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
    write_output_row(draft_ids, r, bonus_id if r == k else recovered, k, out)
    return 0


def typical_acceptance_sample(
    const probability_t[:, :, ::1] target_with_bonus_probs,
    const token_id_t[:, ::1] draft_token_ids,
    const token_id_t[::1] bonus_token_ids,
    double posterior_threshold,
    double posterior_alpha,
    int64_t[:, ::1] output,
    int64_t[::1] accepted_lengths,
    int64_t[::1] num_accepted,
    int64_t[::1] row_status,
    int num_threads,
):
    """Fused typical-acceptance verification of a batch (SPEC 4.3).

    Parameters as :func:`rejection_sample`, without draft probabilities and uniforms, plus
    ``posterior_threshold`` and ``posterior_alpha`` (finite, non-negative).  Returns the
    first failed row or -1.
    """
    cdef Py_ssize_t B = target_with_bonus_probs.shape[0]
    cdef Py_ssize_t k = draft_token_ids.shape[1]
    cdef Py_ssize_t V = target_with_bonus_probs.shape[2]
    cdef Py_ssize_t b
    require_rows(
        B, k, V, target_with_bonus_probs.shape[1], draft_token_ids.shape[0],
        bonus_token_ids.shape[0], output, accepted_lengths.shape[0], num_accepted.shape[0],
        row_status.shape[0],
    )
    if B == 0:
        return -1
    for b in prange(
        B, nogil=True, num_threads=num_threads, schedule="dynamic",
        use_threads_if=num_threads > 1,
    ):
        row_status[b] = typical_acceptance_row(
            &target_with_bonus_probs[b, 0, 0], &draft_token_ids[b, 0],
            bonus_token_ids[b], k, V, posterior_threshold, posterior_alpha,
            &output[b, 0], &accepted_lengths[b], &num_accepted[b],
        )
    return first_failed_row(row_status)


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
    const probability_t* target, const token_id_t* draft_ids, token_id_t bonus_id,
    Py_ssize_t k, Py_ssize_t V,
    int64_t* out, int64_t* accepted_length, int64_t* num_accepted
) noexcept nogil:
    cdef Py_ssize_t i, x, r = k, recovered = 0, argmax = 0
    cdef int64_t passed = 0
    cdef bint accepted
    cdef Py_ssize_t bad = invalid_id_column(draft_ids, bonus_id, k, V)
    if bad >= 0:
        return 1 + bad
    for i in range(k):
        x = draft_ids[i]
        if target[i * V + x] > 0.5 + GREEDY_MARGIN_C:
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
    write_output_row(draft_ids, r, bonus_id if r == k else recovered, k, out)
    return 0


def greedy_sample(
    const probability_t[:, :, ::1] target_with_bonus_probs,
    const token_id_t[:, ::1] draft_token_ids,
    const token_id_t[::1] bonus_token_ids,
    int64_t[:, ::1] output,
    int64_t[::1] accepted_lengths,
    int64_t[::1] num_accepted,
    int64_t[::1] row_status,
    int num_threads,
):
    """Fused greedy (temperature 0) verification of a batch (SPEC 4.2).

    Parameters as :func:`typical_acceptance_sample`, without the posteriors.  Returns the
    first failed row or -1.
    """
    cdef Py_ssize_t B = target_with_bonus_probs.shape[0]
    cdef Py_ssize_t k = draft_token_ids.shape[1]
    cdef Py_ssize_t V = target_with_bonus_probs.shape[2]
    cdef Py_ssize_t b
    require_rows(
        B, k, V, target_with_bonus_probs.shape[1], draft_token_ids.shape[0],
        bonus_token_ids.shape[0], output, accepted_lengths.shape[0], num_accepted.shape[0],
        row_status.shape[0],
    )
    if B == 0:
        return -1
    for b in prange(
        B, nogil=True, num_threads=num_threads, schedule="dynamic",
        use_threads_if=num_threads > 1,
    ):
        row_status[b] = greedy_row(
            &target_with_bonus_probs[b, 0, 0], &draft_token_ids[b, 0],
            bonus_token_ids[b], k, V,
            &output[b, 0], &accepted_lengths[b], &num_accepted[b],
        )
    return first_failed_row(row_status)


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
            write_output_row(&draft_token_ids[b, 0], r, last, k, &output[b, 0])
            accepted_lengths[b] = r
            num_accepted[b] = passed
            row_status[b] = 0
    return first_failed_row(row_status)
