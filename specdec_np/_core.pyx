# cython: language_level=3
"""CPU kernels of specdec_np.

Kernels only: every function here trusts its caller (``specdec_np._runtime.arrays``) for dtypes
and contiguity, checks shapes and offsets in O(B) before it indexes anything, and reads
random uniforms that the caller drew.  What a kernel never trusts is a token id: the driver
checks each request's ids against the vocabulary before a row function uses one as an
index, and reports a bad id through ``row_status`` instead of reading out of bounds.

Structure: one driver per batch layout walks the requests and hands each request's rows,
ids and uniforms to the row function (chains) or the walk step (trees) of its verifier,
with its ``k_b`` and ``V``.  The drivers know no verifier: they call through tables of
function pointers indexed by the registry code (:attr:`specdec_np.registry.Verifier.code`,
:attr:`specdec_np.registry.TreeMethod.code`), which ``specdec_np._kernels.dispatch`` binds once
from the registry (:func:`bind_chain_rows`, :func:`bind_tree_steps`).  The chain driver
:func:`verify_chains` serves the padded ``[B, k+1, V]`` batch and the ragged one alike:
request ``b`` owns draft rows and ids ``draft_offsets[b] .. draft_offsets[b+1]`` and the
``k_b + 1`` target rows that start at ``draft_offsets[b] + b``.

The code lives in ``specdec_np/_kernels/src/cpu/``, one concept per include file (the
CUDA side has the same stems in ``src/cuda/``; C shared by both is in ``src/common/``):

* ``registry_binding.pxi``: the tables of row functions and tree steps, bound from the
  registry;
* ``row_readers.pxi``: how a row function sees its rows (probabilities, or logits through
  their processed law), its argmax and entropy;
* ``inverse_cdf_draws.pxi``: the inverse-CDF draws (residuals, exclusions, logits);
* ``chain_rows.pxi``: the chain row functions (the registry's ``row_function``);
* ``argument_checks.pxi``: the O(B) guards and the token-id check;
* ``chain_driver.pxi``: :func:`verify_chains` and :func:`ragged_offsets`;
* ``direct_calls.pxi``: :func:`verify_chains_direct` and :func:`check_ragged_call`, the
  chain driver and a ragged call's checks on NumPy arrays without typed memoryviews;
* ``tree_walks.pxi``: the tree steps (the registry's ``walk``);
* ``tree_driver.pxi``: :func:`verify_trees` and :func:`tree_layout_is_valid`;
* ``output_formatting.pxi``: output rows and :func:`create_output`;
* ``processed_rows.pxi``: :func:`processed_rows`, the processed law of logits rows;
* ``shard_passes.pxi``: a rank's passes over its slice of columns in verification across
  vocabulary shards (:func:`shard_stats`, :func:`shard_weights`,
  :func:`shard_at_least`, :func:`shard_exp`, :func:`shard_divided`,
  :func:`shard_residuals`, :func:`shard_positive_sums`, :func:`shard_first_crossings`,
  :func:`shard_argmax`) and the host side of its filters' rounds (:func:`float_keys`,
  :func:`key_floats`, :func:`list_record`, :func:`merge_shard_lists`, :func:`top_k_keys`,
  :func:`min_p_keys`, :func:`top_p_keys`), rejection sampling's decisions from the
  gathered numbers (:func:`rejection_lengths`), the draws' rows of rows without a filter
  (:func:`dense_draw_rows`) and the shard each draw falls in (:func:`draw_shards`).

This file keeps the declarations they share.  The ``row_status`` codes are those of
``specdec_np._runtime.contract``.
"""

cimport numpy as cnp
from cython.parallel cimport parallel, prange, threadid
from cython.view cimport array
from libc.float cimport DBL_MAX, DBL_MIN, FLT_MAX, FLT_MIN
from libc.math cimport INFINITY, floor, isinf, ldexp
from libc.stdint cimport INT64_MAX, int8_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, qsort
from libc.string cimport memcpy

# NumPy's C API: the direct calls (direct_calls.pxi) read arrays through it.
cnp.import_array()

cdef extern from "elementwise.h" nogil:
    # The scalar decisions both backends take from the shared header.
    double specdec_clean(double x)
    bint specdec_draw_stops(double weight, double running, double threshold)
    double specdec_next_block_weight(double rho, double p_x, double q_x)
    double specdec_block_check(double total, double rho)
    double specdec_typical_threshold(double plogp, double alpha, double posterior_threshold)

cdef extern from "rowscan.h" nogil:
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
        const float* row, Py_ssize_t start, Py_ssize_t stop, float* maximum
    )
    double specdec_entropy_max_d(
        const double* row, Py_ssize_t start, Py_ssize_t stop, double* maximum
    )
    Py_ssize_t specdec_row_argmax_f(const float* row, Py_ssize_t V)
    Py_ssize_t specdec_row_argmax_d(const double* row, Py_ssize_t V)
    Py_ssize_t specdec_count_beating_f(
        const float* row, Py_ssize_t start, Py_ssize_t stop, float p_x, Py_ssize_t x
    )
    Py_ssize_t specdec_count_beating_d(
        const double* row, Py_ssize_t start, Py_ssize_t stop, double p_x, Py_ssize_t x
    )

cdef extern from "selections.h" nogil:
    # The law's working memory (heap, one per thread): see new_law_scratch.
    ctypedef struct specdec_law_scratch:
        # Threads for the passes over one row (0 or 1: one; used only outside a parallel
        # loop over requests).
        int row_threads
        # Non-zero: a row whose largest finite logit overflows at the temperature has no
        # law (status 2); the fast path's calls leave that check to the law.
        int finds_overflow
        # After a law: how many gathered entries hold its kept set (-1: none).
        Py_ssize_t survivors
    specdec_law_scratch* specdec_law_scratch_new()

cdef extern from "logits_law.h" nogil:
    ctypedef struct specdec_row_law:
        double z_max
        double cutoff
        double normaliser
        int64_t num_infinite
        int64_t status
    # With weights (V entries, or NULL), 1 when the row's weights were kept there.
    int specdec_row_law_f(
        const float* logits, Py_ssize_t V, float temperature, int64_t top_k, double top_p,
        double min_p, int filter_order, specdec_law_scratch* scratch, float* weights,
        specdec_row_law* law,
    )
    int specdec_row_law_d(
        const double* logits, Py_ssize_t V, double temperature, int64_t top_k, double top_p,
        double min_p, int filter_order, specdec_law_scratch* scratch, double* weights,
        specdec_row_law* law,
    )
    # The largest z = logits / temperature (NaN never), and how many entries are +inf.
    void specdec_row_max_f(
        const float* logits, Py_ssize_t V, float temperature, float* z_max,
        int64_t* num_infinite,
    )
    void specdec_row_max_d(
        const double* logits, Py_ssize_t V, double temperature, double* z_max,
        int64_t* num_infinite,
    )
    void specdec_law_from_weights_f(float* weights, Py_ssize_t V, double normaliser)
    void specdec_law_from_weights_d(double* weights, Py_ssize_t V, double normaliser)
    void specdec_block_sums_f(
        float* p, Py_ssize_t V, double normaliser, Py_ssize_t block, double* block_sums
    )
    void specdec_block_sums_d(
        double* p, Py_ssize_t V, double normaliser, Py_ssize_t block, double* block_sums
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
    # From the survivors of the law just computed (scratch.survivors >= 0): the processed
    # row, and the inverse-CDF draw at v with the bits of the draw from that row.
    void specdec_survivors_row_f(
        const specdec_law_scratch* scratch, const specdec_row_law* law, Py_ssize_t V,
        float* out,
    )
    void specdec_survivors_row_d(
        const specdec_law_scratch* scratch, const specdec_row_law* law, Py_ssize_t V,
        double* out,
    )
    Py_ssize_t specdec_survivors_draw_f(
        specdec_law_scratch* scratch, const specdec_row_law* law, Py_ssize_t block, double v
    )
    Py_ssize_t specdec_survivors_draw_d(
        specdec_law_scratch* scratch, const specdec_row_law* law, Py_ssize_t block, double v
    )

cdef extern from "rowthreads.h" nogil:
    # The threads a row of V entries takes for a law scratch's row_threads (1: its passes
    # run on the calling thread); declared so that the build depends on the header.
    int specdec_row_threads(int requested, Py_ssize_t V)

cdef extern from "treescan.h" nogil:
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
    # 2**SPECDEC_OVERFLOW_EXPONENT (see specdec_np/_runtime/contract.py).
    int SPECDEC_OVERFLOW_EXPONENT
    int64_t SPECDEC_STATUS_NO_MEMORY
    int specdec_openmp_max_threads() nogil

ctypedef fused probability_t:
    float
    double

ctypedef fused token_id_t:
    int32_t
    int64_t

# Two-level inverse CDF: at most MAX_BLOCKS block sums are kept on the stack, and blocks
# are at least MIN_BLOCK long.  Entropy/argmax work in blocks of SCAN_BLOCK so that the
# argmax can be located by re-reading one cache-hot block instead of carrying an index
# through the vectorised loop.  (Enum constants, not Python ones: Cython sizes arrays with
# them, and loops step by them with while, since range() wants a literal step.)
cdef enum:
    MAX_BLOCKS = 512
    MIN_BLOCK = 2048
    SCAN_BLOCK = 1024


cdef struct RowAdjust:
    # The sampling surface's adjustments of one rows array, applied where a row is read
    # (specdec_np._layouts.row_adjustments.RowAdjustments): per row an optional bitmask of
    # ``words`` int32 words (bit j of word w allows token 32 w + j; NULL: every token),
    # then the overrides ``ids[offsets[r] .. offsets[r + 1]]`` set to ``values`` (the
    # rows' dtype; NULL offsets: none).
    const int32_t* bitmask
    Py_ssize_t words
    const int64_t* offsets
    const int64_t* ids
    const void* values


cdef struct Request:
    # What a row function needs besides its rows and ids: the request's k_b and V, its
    # uniforms (acceptance ones, then the residual one), the verifier's parameters, and
    # whether acceptance stops at the first rejection (causal counting) or tests every
    # position (vLLM's counters).  With logits, the request's sampling parameters, its
    # thread's scratch rows and law scratch, and the processed law of the last target and
    # draft row read.
    Py_ssize_t k
    Py_ssize_t V
    const double* uniforms
    const double* parameters
    bint causal
    bint logits
    bint draft_logits
    double temperature
    int64_t top_k
    double top_p
    double min_p
    int filter_order
    void* target_scratch
    void* draft_scratch
    specdec_law_scratch* law_scratch
    # Which row's law weights the scratch rows hold (-1: none), and whether a scratch row
    # was handed out as a processed row (from then on no law writes to it).
    Py_ssize_t target_weights_row
    Py_ssize_t draft_weights_row
    bint target_handed_out
    bint draft_handed_out
    Py_ssize_t target_law_row
    Py_ssize_t draft_law_row
    specdec_row_law target_law
    specdec_row_law draft_law
    # Trees only (set by the tree driver): the request's child lists
    # (specdec_np._layouts.tree_links; first_child from the root's entry on), so that a step
    # finds children in O(1).
    const int64_t* first_child
    const int64_t* next_sibling
    const int64_t* next_distinct_sibling
    const int8_t* repeated_token
    # A tree walk's float64 working rows of V (two, or one per depth for the walks that
    # keep a residual per node of the walked path).
    Py_ssize_t working_rows
    # Set by the chain and tree drivers (NULL otherwise): the surface's adjustments of
    # the target and draft rows, the index in them of the request's first row, and the
    # thread's two adjusted rows of V with the row each holds (-1: none).
    const RowAdjust* target_adjust
    const RowAdjust* draft_adjust
    Py_ssize_t target_first_row
    Py_ssize_t draft_first_row
    void* target_adjusted
    void* draft_adjusted
    Py_ssize_t target_adjusted_row
    Py_ssize_t draft_adjusted_row


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


cdef inline specdec_law_scratch* new_law_scratch(
    bint wanted, int row_threads, bint finds_overflow=False
) noexcept nogil:
    """A thread's law scratch from the heap (free it with ``free``); NULL when not
    ``wanted`` (probability rows) or when the allocation fails, which the drivers report
    as the row status SPECDEC_STATUS_NO_MEMORY.  ``row_threads`` threads run the passes
    over one row (the maximum and the exponentials) when the loop over requests runs on
    one thread: the bits of one thread (``specdec_row_threads`` of ``rowthreads.h``).
    ``finds_overflow``: the law refuses a row whose largest finite logit overflows at its
    temperature (status 2), for a caller that left that check to the rows the law reads."""
    cdef specdec_law_scratch* scratch
    if not wanted:
        return NULL
    scratch = specdec_law_scratch_new()
    if scratch != NULL:
        scratch.row_threads = row_threads
        scratch.finds_overflow = finds_overflow
    return scratch


# One law scratch kept between the one-thread calls (the GIL guards it): a fresh one is a
# 96 KiB calloc, and its zeroing, per call, which a small batch notices.  A scratch handed
# back is as a call leaves it (the histogram all zeros), which is what every row of a call
# already finds after the row before it.
cdef specdec_law_scratch* spare_law_scratch = NULL


cdef specdec_law_scratch* take_law_scratch(
    bint wanted, int row_threads, bint finds_overflow=False
) noexcept:
    """:func:`new_law_scratch` for a one-thread call, the kept one when there is one; the
    caller holds the GIL and hands it back with :func:`give_back_law_scratch`."""
    global spare_law_scratch
    cdef specdec_law_scratch* scratch = spare_law_scratch
    if not wanted:
        return NULL
    if scratch == NULL:
        return new_law_scratch(True, row_threads, finds_overflow)
    spare_law_scratch = NULL
    scratch.row_threads = row_threads
    scratch.finds_overflow = finds_overflow
    return scratch


cdef void give_back_law_scratch(specdec_law_scratch* scratch) noexcept:
    """Keep ``scratch`` for the next one-thread call, or free it (the caller holds the
    GIL)."""
    global spare_law_scratch
    if scratch == NULL:
        return
    if spare_law_scratch == NULL:
        spare_law_scratch = scratch
    else:
        free(scratch)


include "_kernels/src/cpu/registry_binding.pxi"
include "_kernels/src/cpu/row_readers.pxi"
include "_kernels/src/cpu/inverse_cdf_draws.pxi"
include "_kernels/src/cpu/chain_rows.pxi"
include "_kernels/src/cpu/argument_checks.pxi"
include "_kernels/src/cpu/chain_driver.pxi"
include "_kernels/src/cpu/direct_calls.pxi"
include "_kernels/src/cpu/tree_walks.pxi"
include "_kernels/src/cpu/tree_driver.pxi"
include "_kernels/src/cpu/output_formatting.pxi"
include "_kernels/src/cpu/processed_rows.pxi"
include "_kernels/src/cpu/shard_passes.pxi"
