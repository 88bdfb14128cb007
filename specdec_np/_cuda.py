"""CUDA kernels of the CuPy backend: source strings, ``RawModule`` compilation and launches.

The CUDA C++ sources live in module-level strings (the way ``cupyx.scipy`` keeps its kernels)
and are compiled with :class:`cupy.RawModule` (NVRTC, ``--std=c++17``) the first time a kernel
is needed on a device; the compiled modules are cached per ``(device id, source)``. Every kernel
is a template, instantiated through ``name_expressions`` for ``float``/``double``
probabilities and ``int``/``long long`` token ids (see :func:`instantiation_names`).

This module never imports CuPy at import time: every function that needs it imports it
lazily, so ``import specdec_np._cuda`` works (and :func:`cuda_sources` can be compiled with
``nvcc`` by the test-suite) on a machine without CuPy.

Kernels and launch configurations
---------------------------------
``rejection_sample_kernel<ProbT, IdT>``, ``typical_acceptance_kernel<ProbT, IdT>``,
``greedy_kernel<ProbT, IdT>``
    One thread block of ``BLOCK_SIZE`` (512) threads per row, grid ``B``, no dynamic shared
    memory (static shared memory: about 8 KiB for the rejection kernel, 12 KiB for the other
    two). The typical-acceptance and greedy kernels loop over the ``k`` positions inside the
    block, one coalesced pass over a vocabulary row per position that needs one. The
    rejection kernel tests the ``k`` positions in parallel, then reads only row ``r`` (the
    first rejection) to draw the recovered token (reduction + scan over the vocabulary).
``init_call_state_kernel``
    One block of one thread, launched right before a verifier on the same stream.
``create_output_kernel<IdT>``
    One thread per row, ``CREATE_OUTPUT_BLOCK`` (256) threads per block, grid
    ``ceil(B / 256)``.

Device-side error flag protocol
-------------------------------
Some input errors can only be seen on the device without a host synchronisation: a token id
outside ``[0, V)``, and (rejection sampler only) a row whose residual *and* target have no
positive mass. Each verifier call therefore gets a 4-slot ``int64`` call state
``{pending accepted, pending emitted, error flag, blocks done}``, set to
``{0, 0, NO_ERROR, 0}`` by ``init_call_state_kernel`` (:data:`NO_ERROR` is ``2**63 - 1``).
A block that finds a problem stores a code into the flag with ``atomicMin``. The codes index
a virtual ``[2, B, k + 1]`` array, so the smallest code is the first problem in row-major
order:

* ``code = b * (k + 1) + i`` with ``0 <= code < B * (k + 1)``: an out-of-range token id at
  row ``b``; column ``i < k`` is ``draft_token_ids[b, i]``, column ``i == k`` is
  ``bonus_token_ids[b]``. The kernel never uses such an id as an index: the row's output is
  all ``-1`` and its per-row statistics are 0.
* ``code = B * (k + 1) + b * (k + 1) + r``: zero-mass row (rejection sampler): at row ``b``
  the first rejected position ``r`` has neither residual nor target mass (invalid,
  unnormalised input such as an all-zero or all-NaN row). ``out[b, r]`` is written as ``0``
  only so that the memory stays valid; it is not a sample.
* :data:`NO_ERROR`: no problem.

Out-of-range ids always take precedence over zero-mass rows. No kernel ever reads or writes
outside its arrays whatever the ids hold.

Thread 0 of each block adds its row's counter increments (accepted tests, emitted tokens) to
the pending slots with ``atomicAdd``, then takes a ticket; the last block of the grid adds the
pending totals to the caller's ``counters`` **only if the flag is still** :data:`NO_ERROR`.
So a failed call changes no counter, without any host synchronisation, in two launches.

The launchers return the flag (a ``(1,)`` view of the call state) without looking at it:
looking would synchronise. The caller checks it at the point it documents, with
:func:`check_error_flag` (which synchronises and raises ``ValueError``) or
:func:`decode_error_flag` on a value it already copied to the host.

The same kernels also write the CPU kernels' per-row ``row_status`` (``0`` verified,
``1 + column`` for an out-of-range id, ``-(1 + r)`` for a zero-mass row) when given one:
:data:`core_like` exposes them with ``specdec_np._core``'s calling convention.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import _contract

__all__ = [
    "BLOCK_SIZE",
    "CREATE_OUTPUT_BLOCK",
    "NO_ERROR",
    "GREEDY_MARGIN",
    "check_error_flag",
    "core_like",
    "create_output",
    "cuda_sources",
    "decode_error_flag",
    "greedy_sample",
    "instantiation_names",
    "rejection_sample",
    "typical_acceptance_sample",
]

#: Threads per block of the per-row verifier kernels (one block per row).
BLOCK_SIZE = 512
#: Threads per block of ``create_output_kernel`` (one thread per row).
CREATE_OUTPUT_BLOCK = 256
#: Greedy shortcut, as in the CPU kernel: ``p(x) > 0.5 + GREEDY_MARGIN`` accepts ``x`` without
#: reading its row (the unique argmax of any row that sums to 1 within ``2 * GREEDY_MARGIN``).
GREEDY_MARGIN = _contract.GREEDY_MARGIN
#: Value of the device error flag when no error was found (``LLONG_MAX``).
NO_ERROR = int(np.iinfo(np.int64).max)

_COMPILE_OPTIONS = ("--std=c++17",)

# ---------------------------------------------------------------------------------------------
# CUDA sources
# ---------------------------------------------------------------------------------------------

_COMMON_HEADER = (
    "// ---- specdec_np: shared device helpers ----\n"
    "// No #include: NVRTC (cupy.RawModule) and nvcc both provide everything used here.\n"
    "namespace specdec {\n"
    "// Not every source uses every constant, hence [[maybe_unused]].\n"
    "// Threads per block of the per-row kernels, and of create_output_kernel.\n"
    f"[[maybe_unused]] constexpr int kBlock = {BLOCK_SIZE};\n"
    f"[[maybe_unused]] constexpr int kRowsPerBlock = {CREATE_OUTPUT_BLOCK};\n"
    "// Greedy shortcut: p(x) > 0.5 + kGreedyMargin makes x the argmax of a probability row.\n"
    f"[[maybe_unused]] constexpr double kGreedyMargin = {GREEDY_MARGIN!r};\n"
    + r"""[[maybe_unused]] constexpr int kWarp = 32;
[[maybe_unused]] constexpr int kWarps = kBlock / kWarp;  // segments of the first draw level
[[maybe_unused]] constexpr int kUnroll = 4;  // independent 16-byte loads in flight per thread
[[maybe_unused]] constexpr long long kNoError = 0x7fffffffffffffffLL;  // flag value: no error
[[maybe_unused]] constexpr long long kNone = 0x7fffffffffffffffLL;  // "no index" in reductions

static_assert(kBlock % kWarp == 0 && (kBlock & (kBlock - 1)) == 0,
              "kBlock must be a power of two and a multiple of the warp size");

__device__ __forceinline__ long long min_ll(long long a, long long b) { return a < b ? a : b; }

__device__ __forceinline__ double negative_infinity() {
    return -__longlong_as_double(0x7ff0000000000000LL);
}

// Counters are long long on the device; CUDA's 64-bit atomicAdd is on unsigned long long
// (two's complement makes the sum identical).
__device__ __forceinline__ void add_counter(long long* counter, long long value) {
    atomicAdd(reinterpret_cast<unsigned long long*>(counter),
              static_cast<unsigned long long>(value));
}

// p * ln(p + 1e-5): the per-element entropy term. float rows use float32 logf and a float32
// product (the accuracy of the CPU kernel), double rows double log. Accumulated in double.
__device__ __forceinline__ double entropy_term(float p) {
    return static_cast<double>(p * logf(p + 1e-5f));
}
__device__ __forceinline__ double entropy_term(double p) { return p * log(p + 1e-5); }

// Block-wide reduction of a running (max value, first index) pair and a double sum; every
// thread receives the result. A NaN value never becomes the maximum because per-thread scans
// skip NaN, and (-inf, kNone) is the identity.
__device__ void block_argmax_and_sum(double& value, long long& index, double& sum,
                                     double* value_buf, long long* index_buf,
                                     double* sum_buf) {
    const int t = threadIdx.x;
    value_buf[t] = value;
    index_buf[t] = index;
    sum_buf[t] = sum;
    __syncthreads();
    for (int stride = kBlock / 2; stride > 0; stride >>= 1) {
        if (t < stride) {
            const double v = value_buf[t + stride];
            const long long i = index_buf[t + stride];
            if (v > value_buf[t] || (v == value_buf[t] && i < index_buf[t])) {
                value_buf[t] = v;
                index_buf[t] = i;
            }
            sum_buf[t] += sum_buf[t + stride];
        }
        __syncthreads();
    }
    value = value_buf[0];
    index = index_buf[0];
    sum = sum_buf[0];
    __syncthreads();  // the buffers may be reused as soon as this returns
}

// 16 bytes of probabilities, loaded with one vector instruction (float4 / double2 width).
template <typename ProbT>
struct alignas(16) Pack {
    static constexpr int kSize = 16 / sizeof(ProbT);
    ProbT v[kSize];
};

__device__ __forceinline__ bool aligned16(const void* ptr) {
    return (reinterpret_cast<unsigned long long>(ptr) & 15ULL) == 0ULL;
}

// Calls f(y, p[y], q[y]) (q[y] read only when HasQ, else ProbT(0)) for the elements of
// [lo, hi) that belong to `worker` of `workers` cooperating threads, in increasing y for each
// worker. Consecutive workers read consecutive 16-byte packs (coalesced, kUnroll packs in
// flight per thread) when p + lo (and q + lo) are 16-byte aligned; otherwise, and for the
// tail, consecutive workers read consecutive elements.
template <bool HasQ, typename ProbT, typename F>
__device__ __forceinline__ void visit_range(const ProbT* __restrict__ p,
                                            const ProbT* __restrict__ q, long long lo,
                                            long long hi, int worker, int workers, F& f) {
    constexpr int kVec = Pack<ProbT>::kSize;
    long long scalar_lo = lo;
    if (lo < hi && aligned16(p + lo) && (!HasQ || aligned16(q + lo))) {
        const long long packs = (hi - lo) / kVec;
        const Pack<ProbT>* pp = reinterpret_cast<const Pack<ProbT>*>(p + lo);
        const Pack<ProbT>* qp = HasQ ? reinterpret_cast<const Pack<ProbT>*>(q + lo) : nullptr;
        for (long long j = worker; j < packs; j += (long long)workers * kUnroll) {
            Pack<ProbT> pv[kUnroll];
            Pack<ProbT> qv[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const long long jj = j + (long long)u * workers;
                if (jj < packs) {
                    pv[u] = pp[jj];
                    if (HasQ) qv[u] = qp[jj];
                }
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const long long jj = j + (long long)u * workers;
                if (jj < packs) {
#pragma unroll
                    for (int e = 0; e < kVec; ++e) {
                        f(lo + jj * kVec + e, pv[u].v[e], HasQ ? qv[u].v[e] : ProbT(0));
                    }
                }
            }
        }
        scalar_lo = lo + packs * kVec;
    }
    for (long long base = scalar_lo + worker; base < hi; base += (long long)workers * kUnroll) {
        ProbT pv[kUnroll];
        ProbT qv[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const long long y = base + (long long)u * workers;
            pv[u] = y < hi ? p[y] : ProbT(0);
            qv[u] = (HasQ && y < hi) ? q[y] : ProbT(0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const long long y = base + (long long)u * workers;
            if (y < hi) f(y, pv[u], qv[u]);
        }
    }
}

// One pass over a probability row by the whole block: argmax (first index on ties; NaN entries
// ignored; kNone if every entry is NaN) and, when WithEntropy, sum_y p(y) * ln(p(y) + 1e-5).
// Every thread receives the results.
template <bool WithEntropy, typename ProbT>
__device__ void row_argmax_entropy(const ProbT* __restrict__ row, long long vocab,
                                   double& best, long long& best_index, double& plogp,
                                   double* value_buf, long long* index_buf, double* sum_buf) {
    double my_best = negative_infinity();
    long long my_index = kNone;
    double my_sum = 0.0;
    auto visit = [&](long long y, ProbT value, ProbT) {
        const double p = static_cast<double>(value);
        if (p > my_best || (p == my_best && y < my_index)) {
            my_best = p;
            my_index = y;
        }
        if (WithEntropy) my_sum += entropy_term(value);
    };
    visit_range<false>(row, static_cast<const ProbT*>(nullptr), 0, vocab, (int)threadIdx.x,
                       kBlock, visit);
    block_argmax_and_sum(my_best, my_index, my_sum, value_buf, index_buf, sum_buf);
    best = my_best;
    best_index = my_index;
    plogp = my_sum;
}

// The argmax reported for a row: 0 when no entry is above -inf (all NaN or -inf), as the CPU
// kernel does; otherwise the first index of the maximum.
__device__ __forceinline__ long long argmax_or_zero(double best, long long best_index) {
    return (best_index == kNone || !(best > negative_infinity())) ? 0 : best_index;
}

// Per-call state of the verifier kernels (module docstring of specdec_np._cuda): the pending
// counter increments, the error flag and the number of blocks done, set to {0, 0, kNoError, 0}
// by init_call_state_kernel before the verifier is launched.
enum CallState { kPendingAccepted = 0, kPendingEmitted = 1, kErrorFlag = 2, kBlocksDone = 3 };

__device__ __forceinline__ long long atomic_read(long long* address) {
    return static_cast<long long>(atomicAdd(reinterpret_cast<unsigned long long*>(address), 0ULL));
}

// Thread 0 of every block calls this exactly once, after the block's last write to `state`.
// The last block to finish adds the pending increments to `counters` unless the error flag
// is set (the threadfence-reduction pattern: all of the call's state updates are atomics made
// visible by the fence before the block takes its ticket). No-op when state is nullptr.
__device__ void finish_block(long long* state, long long* counters) {
    if (threadIdx.x != 0 || state == nullptr) return;
    __threadfence();
    const unsigned long long done =
        atomicAdd(reinterpret_cast<unsigned long long*>(state + kBlocksDone), 1ULL);
    if (done + 1ULL != static_cast<unsigned long long>(gridDim.x)) return;
    __threadfence();
    if (counters == nullptr || atomic_read(state + kErrorFlag) != kNoError) return;
    add_counter(counters + 0, atomic_read(state + kPendingAccepted));
    add_counter(counters + 1, atomic_read(state + kPendingEmitted));
}

// Checks every id of row b (draft ids and the bonus id) against [0, vocab). On failure the
// row's output becomes -1, its statistics 0, row_status[b] (if given) 1 + the first bad
// column, the error flag (if state is given) b * (k + 1) + that column, the block is finished,
// and false is returned to every thread (the caller returns: no id of the row is ever used as
// an index).
template <typename IdT>
__device__ bool validate_row_ids(const IdT* __restrict__ draft_ids,
                                 const IdT* __restrict__ bonus_ids, long long b, long long k,
                                 long long vocab, long long* __restrict__ out_row,
                                 long long* __restrict__ accepted_lengths,
                                 long long* __restrict__ num_accepted_per_row,
                                 long long* counters, long long* state,
                                 long long* __restrict__ row_status, long long* first_bad) {
    const int t = threadIdx.x;
    if (t == 0) *first_bad = kNone;
    __syncthreads();
    for (long long j = t; j <= k; j += kBlock) {
        const long long id = j < k ? static_cast<long long>(draft_ids[b * k + j])
                                   : static_cast<long long>(bonus_ids[b]);
        if (id < 0 || id >= vocab) atomicMin(first_bad, j);
    }
    __syncthreads();
    const long long bad = *first_bad;
    if (bad == kNone) return true;
    for (long long j = t; j <= k; j += kBlock) out_row[j] = -1;
    if (t == 0) {
        accepted_lengths[b] = 0;
        num_accepted_per_row[b] = 0;
        if (row_status != nullptr) row_status[b] = 1 + bad;
        if (state != nullptr) atomicMin(state + kErrorFlag, b * (k + 1) + bad);
        finish_block(state, counters);
    }
    return false;
}

// Writes row b's output: draft prefix x_0..x_{r-1}, then `token` at r, then -1 to column k.
template <typename IdT>
__device__ void write_row(long long* __restrict__ out_row, const IdT* __restrict__ draft_row,
                          long long k, long long r, long long token) {
    for (long long j = threadIdx.x; j <= k; j += kBlock) {
        out_row[j] = j < r ? static_cast<long long>(draft_row[j]) : (j == r ? token : -1LL);
    }
}

// Thread 0: per-row statistics, row status (0, or `status` for a zero-mass row, whose flag the
// caller already raised), this block's pending counter increments (none for a failed row),
// then finish_block.
__device__ __forceinline__ void finish_row(long long b, long long r, long long num_accepted,
                                           long long status,
                                           long long* __restrict__ accepted_lengths,
                                           long long* __restrict__ num_accepted_per_row,
                                           long long* counters, long long* state,
                                           long long* row_status) {
    if (threadIdx.x != 0) return;
    accepted_lengths[b] = r;
    num_accepted_per_row[b] = num_accepted;
    if (row_status != nullptr) row_status[b] = status;
    if (status == 0 && state != nullptr) {
        add_counter(state + kPendingAccepted, num_accepted);
        add_counter(state + kPendingEmitted, r + 1);
    }
    finish_block(state, counters);
}
}  // namespace specdec

// Sets a verifier call's state to {0, 0, kNoError, 0}. Launch: 1 block of 1 thread, on the
// verifier's stream, right before it.
__global__ void init_call_state_kernel(long long* __restrict__ state) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        state[specdec::kPendingAccepted] = 0;
        state[specdec::kPendingEmitted] = 0;
        state[specdec::kErrorFlag] = specdec::kNoError;
        state[specdec::kBlocksDone] = 0;
    }
}
"""
)

_CREATE_OUTPUT_SOURCE = r"""
// vLLM's _create_output. Row b: r = first position whose `accepted` is false (k if none);
// out[b, :r] = draft ids, out[b, r] = substitute[b, r] if r < k else bonus[b], rest -1.
// counters[0] += number of true entries of accepted[b] (all positions, also after r),
// counters[1] += r + 1 (atomicAdd on device).
// With vocab >= 0 the ids are checked as the CPU kernel does: draft and bonus ids all, the
// substitute id where it is emitted, against [0, vocab); a bad row gets row_status[b] =
// 1 + column (draft column i < k, bonus k, substitute at r: k + 1 + r), output -1, statistics
// 0, and adds nothing to the counters. vocab < 0 copies ids verbatim (they are never used as
// indices). accepted_lengths, num_accepted_per_row, counters and row_status may be nullptr.
// Launch: grid ceil(B / kRowsPerBlock), block kRowsPerBlock; one thread per row.
template <typename IdT>
__global__ void __launch_bounds__(specdec::kRowsPerBlock)
create_output_kernel(const unsigned char* __restrict__ accepted,
                     const IdT* __restrict__ substitute_token_ids,
                     const IdT* __restrict__ draft_token_ids,
                     const IdT* __restrict__ bonus_token_ids, long long batch, long long k,
                     long long vocab, long long* __restrict__ out,
                     long long* __restrict__ accepted_lengths,
                     long long* __restrict__ num_accepted_per_row,
                     long long* __restrict__ counters, long long* __restrict__ row_status) {
    const long long b = (long long)blockIdx.x * specdec::kRowsPerBlock + threadIdx.x;
    if (b >= batch) return;
    const bool check = vocab >= 0;
    const unsigned char* acc = accepted + b * k;
    const IdT* draft = draft_token_ids + b * k;
    long long* row = out + b * (k + 1);
    long long r = k;
    long long num_accepted = 0;
    long long bad = -1;
    for (long long i = 0; i < k; ++i) {
        if (acc[i] != 0) {
            ++num_accepted;
        } else if (r == k) {
            r = i;
        }
    }
    if (check) {
        for (long long j = 0; j <= k && bad < 0; ++j) {
            const long long id = j < k ? static_cast<long long>(draft[j])
                                       : static_cast<long long>(bonus_token_ids[b]);
            if (id < 0 || id >= vocab) bad = j;
        }
    }
    const long long last = r < k ? static_cast<long long>(substitute_token_ids[b * k + r])
                                 : static_cast<long long>(bonus_token_ids[b]);
    if (check && bad < 0 && r < k && (last < 0 || last >= vocab)) bad = k + 1 + r;
    if (bad >= 0) {
        for (long long j = 0; j <= k; ++j) row[j] = -1;
        if (accepted_lengths != nullptr) accepted_lengths[b] = 0;
        if (num_accepted_per_row != nullptr) num_accepted_per_row[b] = 0;
        if (row_status != nullptr) row_status[b] = 1 + bad;
        return;
    }
    for (long long j = 0; j <= k; ++j) {
        row[j] = j < r ? static_cast<long long>(draft[j]) : (j == r ? last : -1LL);
    }
    if (accepted_lengths != nullptr) accepted_lengths[b] = r;
    if (num_accepted_per_row != nullptr) num_accepted_per_row[b] = num_accepted;
    if (row_status != nullptr) row_status[b] = 0;
    if (counters != nullptr) {
        specdec::add_counter(counters + 0, num_accepted);
        specdec::add_counter(counters + 1, r + 1);
    }
}
"""

_REJECTION_SOURCE = r"""
namespace specdec {

// Non-negative draw weights of one vocabulary row, w > 0 ? w : 0 in double (so NaN contributes
// nothing and never enters a sum):
//   kDenseResidual  max(p - q, 0)                       (draft probabilities given)
//   kPointResidual  max(p - [y == x], 0)                (point-mass draft at x: identical to a
//                                                        one-hot q row)
//   kTargetOnly     max(p, 0)                           (fallback when the residual is empty)
enum WeightMode { kDenseResidual, kPointResidual, kTargetOnly };

template <typename ProbT, int Mode>
struct Weight {
    using Prob = ProbT;
    static constexpr bool kHasQ = Mode == kDenseResidual;
    const ProbT* __restrict__ p;
    const ProbT* __restrict__ q;  // kDenseResidual only
    long long x;                  // kPointResidual only
    __device__ __forceinline__ double at(long long y, ProbT pv, ProbT qv) const {
        double w = static_cast<double>(pv);
        if (Mode == kDenseResidual) w -= static_cast<double>(qv);
        if (Mode == kPointResidual && y == x) w -= 1.0;
        return w > 0.0 ? w : 0.0;
    }
    __device__ __forceinline__ double operator()(long long y) const {
        return at(y, p[y], kHasQ ? q[y] : ProbT(0));
    }
};

struct DrawScratch {
    double a[kBlock];
    double b[kBlock];
    double segment_sum[kWarps];
    double base;
    double threshold;
    int segment;
    int first_thread;
    int last_thread;
    long long token;
};

// Inverse-CDF draw from the weights w(0..V-1) with the uniform v, by the whole block.
// Returns the first y (index order) whose running double sum of w exceeds v * Z, Z the double
// sum of w; -1 (to every thread) when Z == 0. Three levels, so the row is read about 1.1 times:
//   1. the row is cut into kWarps contiguous segments, warp g sums segment g with coalesced
//      reads; thread 0 adds the segment sums in order (Z) and picks the segment where the
//      running sum crosses v * Z;
//   2. that segment is cut into kBlock contiguous chunks, one per thread; a block inclusive
//      scan of the chunk sums picks the chunk where the running sum crosses;
//   3. the owner of that chunk scans it element by element.
// At every level only a unit with positive weight can be picked: the first whose running sum
// exceeds v * Z, else (rounding made the scan miss) the last one with positive weight. So the
// token drawn always has w > 0, and it is the exact inverse CDF wherever v * Z is not within
// rounding of a CDF boundary.
template <typename W>
__device__ long long block_inverse_cdf(const W& weight, long long vocab, double v,
                                       DrawScratch& s) {
    const int t = threadIdx.x;
    const int warp = t / kWarp;
    const int lane = t % kWarp;
    if (t == 0) {
        s.first_thread = kBlock;
        s.last_thread = -1;
    }
    // Level 1: segment sums. Segment starts are multiples of the 16-byte pack size, so the
    // segments of an aligned row are aligned too.
    constexpr long long kVec = Pack<typename W::Prob>::kSize;
    const long long segment_length = ((vocab + kWarps - 1) / kWarps + kVec - 1) / kVec * kVec;
    {
        const long long lo = min_ll((long long)warp * segment_length, vocab);
        const long long hi = min_ll(lo + segment_length, vocab);
        double acc = 0.0;
        auto add = [&](long long y, typename W::Prob pv, typename W::Prob qv) {
            acc += weight.at(y, pv, qv);
        };
        visit_range<W::kHasQ>(weight.p, weight.q, lo, hi, lane, kWarp, add);
        s.a[t] = acc;
    }
    __syncthreads();
    if (t < kWarps) {
        double sum = 0.0;
        for (int l = 0; l < kWarp; ++l) sum += s.a[t * kWarp + l];
        s.segment_sum[t] = sum;
    }
    __syncthreads();
    if (t == 0) {
        double total = 0.0;
        for (int g = 0; g < kWarps; ++g) total += s.segment_sum[g];
        const double threshold = v * total;
        int chosen = -1;
        int last = -1;
        double chosen_base = 0.0;
        double last_base = 0.0;
        double running = 0.0;
        for (int g = 0; g < kWarps; ++g) {
            const double before = running;
            running += s.segment_sum[g];
            if (s.segment_sum[g] > 0.0) {
                last = g;
                last_base = before;
                if (chosen < 0 && running > threshold) {
                    chosen = g;
                    chosen_base = before;
                }
            }
        }
        if (chosen < 0) {
            chosen = last;
            chosen_base = last_base;
        }
        s.segment = chosen;
        s.base = chosen_base;
        s.threshold = threshold;
    }
    __syncthreads();
    const int segment = s.segment;
    if (segment < 0) {
        __syncthreads();  // everyone has read s.segment before the scratch is reused
        return -1;
    }
    const double base = s.base;
    const double threshold = s.threshold;

    // Level 2: chunk sums inside the chosen segment, block inclusive scan (Hillis-Steele).
    const long long seg_lo = min_ll((long long)segment * segment_length, vocab);
    const long long seg_hi = min_ll(seg_lo + segment_length, vocab);
    const long long chunk = (seg_hi - seg_lo + kBlock - 1) / kBlock;
    const long long my_lo = seg_lo + (long long)t * chunk;
    const long long my_hi = min_ll(my_lo + chunk, seg_hi);
    double mine = 0.0;
#pragma unroll 4
    for (long long y = my_lo; y < my_hi; ++y) mine += weight(y);
    s.a[t] = mine;
    __syncthreads();
    double* src = s.a;
    double* dst = s.b;
    for (int offset = 1; offset < kBlock; offset <<= 1) {
        const double value = t >= offset ? src[t - offset] + src[t] : src[t];
        dst[t] = value;
        __syncthreads();
        double* tmp = src;
        src = dst;
        dst = tmp;
    }
    const double inclusive = src[t];
    const double exclusive = t > 0 ? src[t - 1] : 0.0;
    if (mine > 0.0) {
        atomicMax(&s.last_thread, t);
        if (base + inclusive > threshold) atomicMin(&s.first_thread, t);
    }
    __syncthreads();
    const int owner = s.first_thread < kBlock ? s.first_thread : s.last_thread;

    // Level 3: the owner scans its chunk.
    if (t == owner) {
        double running = base + exclusive;
        long long token = -1;
        long long last_positive = -1;
        for (long long y = my_lo; y < my_hi; ++y) {
            const double w = weight(y);
            if (w > 0.0) {
                last_positive = y;
                running += w;
                if (running > threshold) {
                    token = y;
                    break;
                }
            }
        }
        s.token = token >= 0 ? token : last_positive;
    }
    __syncthreads();
    const long long token = s.token;
    __syncthreads();
    return token;
}
}  // namespace specdec

// Rejection sampling (SPEC 4.1). Launch: grid B, block specdec::kBlock; one block per row.
// target [B, k+1, V], draft_probs [B, k, V] or nullptr (point-mass drafts), draft_ids [B, k],
// bonus_ids [B], uniforms [B, k+1] (columns 0..k-1 acceptance, column k residual), all
// C-contiguous. Outputs out [B, k+1], accepted_lengths [B] (r_b), num_accepted_per_row [B];
// state (or nullptr): the per-call state {pending accepted, pending emitted, error flag, blocks
// done}; the last block adds the pending increments to counters[0..1] (accepted tests, emitted
// tokens) if no error was flagged. row_status (or nullptr): the CPU kernels' per-row protocol.
template <typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock, 1)
rejection_sample_kernel(const ProbT* __restrict__ target, const ProbT* __restrict__ draft_probs,
                        const IdT* __restrict__ draft_ids, const IdT* __restrict__ bonus_ids,
                        const double* __restrict__ uniforms, long long batch, long long k,
                        long long vocab, long long* __restrict__ out,
                        long long* __restrict__ accepted_lengths,
                        long long* __restrict__ num_accepted_per_row,
                        long long* counters, long long* state,
                        long long* __restrict__ row_status) {
    __shared__ long long first_bad;
    __shared__ long long first_reject;
    __shared__ unsigned long long num_accepted;
    __shared__ specdec::DrawScratch scratch;
    const long long b = blockIdx.x;
    if (b >= batch) {  // never launched so (grid = B), but every block must finish
        specdec::finish_block(state, counters);
        return;
    }
    const int t = threadIdx.x;
    long long* out_row = out + b * (k + 1);
    if (!specdec::validate_row_ids(draft_ids, bonus_ids, b, k, vocab, out_row, accepted_lengths,
                                   num_accepted_per_row, counters, state, row_status,
                                   &first_bad)) {
        return;
    }
    if (t == 0) {
        first_reject = k;
        num_accepted = 0ULL;
    }
    __syncthreads();
    // Independent acceptance test of every position (the counter needs all of them).
    const double* u_row = uniforms + b * (k + 1);
    for (long long i = t; i < k; i += specdec::kBlock) {
        const long long x = static_cast<long long>(draft_ids[b * k + i]);
        const double p = static_cast<double>(target[(b * (k + 1) + i) * vocab + x]);
        const double q = draft_probs != nullptr
                             ? static_cast<double>(draft_probs[(b * k + i) * vocab + x])
                             : 1.0;
        if (u_row[i] * q < p) {
            atomicAdd(&num_accepted, 1ULL);
        } else {
            atomicMin(&first_reject, i);
        }
    }
    __syncthreads();
    const long long r = first_reject;
    const long long accepted_count = static_cast<long long>(num_accepted);
    long long token;
    long long status = 0;
    if (r == k) {
        token = static_cast<long long>(bonus_ids[b]);
    } else {
        // Only row r is read: the residual, and the target as a fallback when it has no mass.
        const ProbT* p_row = target + (b * (k + 1) + r) * vocab;
        const double v = u_row[k];
        if (draft_probs != nullptr) {
            const specdec::Weight<ProbT, specdec::kDenseResidual> w{
                p_row, draft_probs + (b * k + r) * vocab, -1};
            token = specdec::block_inverse_cdf(w, vocab, v, scratch);
        } else {
            const specdec::Weight<ProbT, specdec::kPointResidual> w{
                p_row, nullptr, static_cast<long long>(draft_ids[b * k + r])};
            token = specdec::block_inverse_cdf(w, vocab, v, scratch);
        }
        if (token < 0) {
            const specdec::Weight<ProbT, specdec::kTargetOnly> w{p_row, nullptr, -1};
            token = specdec::block_inverse_cdf(w, vocab, v, scratch);
        }
        if (token < 0) {  // zero-mass row: invalid input, reported through the flag
            status = -(1 + r);
            token = 0;
            if (t == 0 && state != nullptr) {
                atomicMin(state + specdec::kErrorFlag, batch * (k + 1) + b * (k + 1) + r);
            }
        }
    }
    specdec::write_row(out_row, draft_ids + b * k, k, r, token);
    specdec::finish_row(b, r, accepted_count, status, accepted_lengths, num_accepted_per_row,
                        counters, state, row_status);
}
"""

_TYPICAL_SOURCE = r"""
// Typical acceptance (SPEC 4.3). Launch: grid B, block specdec::kBlock; one block per row,
// looping over the k positions. Position i is accepted iff
//     p_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H_i)),
//     H_i = -sum_y p_i(y) * ln(p_i(y) + 1e-5)   (double accumulation),
// with the shortcut p > posterior_threshold => accepted without reading the row; a NaN entropy
// never accepts. The recovered token at the first rejection r is argmax p_r (first index on
// ties, NaN entries ignored, 0 if no entry is above -inf), computed in the same pass as the
// entropy; the bonus id if all k are accepted. Inputs need not be normalised.
template <typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock, 1)
typical_acceptance_kernel(const ProbT* __restrict__ target, const IdT* __restrict__ draft_ids,
                          const IdT* __restrict__ bonus_ids, double posterior_threshold,
                          double posterior_alpha, long long batch, long long k, long long vocab,
                          long long* __restrict__ out, long long* __restrict__ accepted_lengths,
                          long long* __restrict__ num_accepted_per_row,
                          long long* counters, long long* state,
                          long long* __restrict__ row_status) {
    __shared__ long long first_bad;
    __shared__ double value_buf[specdec::kBlock];
    __shared__ long long index_buf[specdec::kBlock];
    __shared__ double sum_buf[specdec::kBlock];
    const long long b = blockIdx.x;
    if (b >= batch) {  // never launched so (grid = B), but every block must finish
        specdec::finish_block(state, counters);
        return;
    }
    long long* out_row = out + b * (k + 1);
    if (!specdec::validate_row_ids(draft_ids, bonus_ids, b, k, vocab, out_row, accepted_lengths,
                                   num_accepted_per_row, counters, state, row_status,
                                   &first_bad)) {
        return;
    }
    long long r = k;
    long long recovered = 0;
    long long accepted_count = 0;
    for (long long i = 0; i < k; ++i) {  // uniform loop: every thread takes the same branches
        const ProbT* row = target + (b * (k + 1) + i) * vocab;
        const long long x = static_cast<long long>(draft_ids[b * k + i]);
        const double px = static_cast<double>(row[x]);
        if (px > posterior_threshold) {
            ++accepted_count;
            continue;
        }
        double best;
        long long best_index;
        double plogp;
        specdec::row_argmax_entropy<true>(row, vocab, best, best_index, plogp, value_buf,
                                          index_buf, sum_buf);
        // min(posterior_threshold, alpha * exp(-H)), H = -plogp, written as the CPU kernel
        // does: alpha = 0 gives 0 even where exp overflows, and a NaN entropy never accepts.
        double threshold = posterior_alpha > 0.0 ? posterior_alpha * exp(plogp) : 0.0;
        if (threshold > posterior_threshold) threshold = posterior_threshold;
        if (px > threshold) {
            ++accepted_count;
        } else if (r == k) {
            r = i;
            recovered = specdec::argmax_or_zero(best, best_index);
        }
    }
    const long long token = r == k ? static_cast<long long>(bonus_ids[b]) : recovered;
    specdec::write_row(out_row, draft_ids + b * k, k, r, token);
    specdec::finish_row(b, r, accepted_count, 0, accepted_lengths, num_accepted_per_row, counters,
                        state, row_status);
}
"""

_GREEDY_SOURCE = r"""
// Greedy verification (SPEC 4.2). Launch: grid B, block specdec::kBlock; one block per row,
// looping over the k positions. Position i is accepted iff x_i == argmax p_i (first index on
// ties, NaN entries ignored, 0 if no entry is above -inf). As in the CPU kernel,
// p_i(x_i) > 0.5 + kGreedyMargin accepts without reading the row (exact for rows that are
// probability distributions, the documented input contract); every other position is tested
// (the counter needs all of them) with one coalesced pass over its row. The token after the
// accepted prefix is argmax p_r at the first mismatch r, or the bonus id if all k match.
template <typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock, 1)
greedy_kernel(const ProbT* __restrict__ target, const IdT* __restrict__ draft_ids,
              const IdT* __restrict__ bonus_ids, long long batch, long long k, long long vocab,
              long long* __restrict__ out, long long* __restrict__ accepted_lengths,
              long long* __restrict__ num_accepted_per_row, long long* counters,
              long long* state, long long* __restrict__ row_status) {
    __shared__ long long first_bad;
    __shared__ double value_buf[specdec::kBlock];
    __shared__ long long index_buf[specdec::kBlock];
    __shared__ double sum_buf[specdec::kBlock];
    const long long b = blockIdx.x;
    if (b >= batch) {  // never launched so (grid = B), but every block must finish
        specdec::finish_block(state, counters);
        return;
    }
    long long* out_row = out + b * (k + 1);
    if (!specdec::validate_row_ids(draft_ids, bonus_ids, b, k, vocab, out_row, accepted_lengths,
                                   num_accepted_per_row, counters, state, row_status,
                                   &first_bad)) {
        return;
    }
    long long r = k;
    long long recovered = 0;
    long long accepted_count = 0;
    for (long long i = 0; i < k; ++i) {  // uniform loop
        const ProbT* row = target + (b * (k + 1) + i) * vocab;
        const long long x = static_cast<long long>(draft_ids[b * k + i]);
        if (static_cast<double>(row[x]) > 0.5 + specdec::kGreedyMargin) {
            ++accepted_count;  // the unique argmax of a probability row: row not read
            continue;
        }
        double best;
        long long best_index;
        double unused;
        specdec::row_argmax_entropy<false>(row, vocab, best, best_index, unused, value_buf,
                                           index_buf, sum_buf);
        const long long argmax = specdec::argmax_or_zero(best, best_index);
        if (x == argmax) {
            ++accepted_count;
        } else if (r == k) {
            r = i;
            recovered = argmax;
        }
    }
    const long long token = r == k ? static_cast<long long>(bonus_ids[b]) : recovered;
    specdec::write_row(out_row, draft_ids + b * k, k, r, token);
    specdec::finish_row(b, r, accepted_count, 0, accepted_lengths, num_accepted_per_row, counters,
                        state, row_status);
}
"""

_KERNEL_SOURCES: dict[str, str] = {
    "create_output": _CREATE_OUTPUT_SOURCE,
    "rejection_sample": _REJECTION_SOURCE,
    "typical_acceptance": _TYPICAL_SOURCE,
    "greedy": _GREEDY_SOURCE,
}

_KERNEL_TEMPLATES: dict[str, str] = {
    "create_output": "create_output_kernel",
    "rejection_sample": "rejection_sample_kernel",
    "typical_acceptance": "typical_acceptance_kernel",
    "greedy": "greedy_kernel",
}

_PROB_CTYPES: dict[str, str] = {"float32": "float", "float64": "double"}
_ID_CTYPES: dict[str, str] = {"int32": "int", "int64": "long long"}
_INIT_KERNEL = "init_call_state_kernel"

_STATE_SIZE = 4  # pending accepted, pending emitted, error flag, blocks done
_ERROR_FLAG_SLOT = 2


def _name_expression(source: str, prob_dtype: Any = None, id_dtype: Any = None) -> str:
    """Return the template instantiation of ``source``'s kernel for the given dtypes."""
    template = _KERNEL_TEMPLATES[source]
    id_ctype = _ID_CTYPES[np.dtype(id_dtype).name]
    if source == "create_output":
        return f"{template}<{id_ctype}>"
    return f"{template}<{_PROB_CTYPES[np.dtype(prob_dtype).name]}, {id_ctype}>"


def cuda_sources() -> dict[str, str]:
    """Return every CUDA source compiled by this module.

    Returns
    -------
    dict of str to str
        Source name (``"create_output"``, ``"rejection_sample"``, ``"typical_acceptance"``,
        ``"greedy"``) to the full CUDA C++ text handed to :class:`cupy.RawModule`, including the
        shared header. Each text is self-contained (no ``#include``) and compiles on its own.
    """
    return {name: _COMMON_HEADER + body for name, body in _KERNEL_SOURCES.items()}


def instantiation_names(source: str | None = None) -> list[str]:
    """Return the kernel name expressions (template instantiations) compiled for a source.

    Parameters
    ----------
    source : str, optional
        A key of :func:`cuda_sources`. ``None`` (default) lists the names of every source.

    Returns
    -------
    list of str
        Name expressions such as ``"rejection_sample_kernel<float, long long>"``, exactly as
        passed to ``cupy.RawModule(name_expressions=...)`` and to ``get_function``. Every
        source also contains the non-template ``"init_call_state_kernel"``, listed once per
        source.

    Raises
    ------
    KeyError
        If ``source`` is not a source name.
    """
    if source is None:
        sources = list(_KERNEL_SOURCES)
    elif source in _KERNEL_SOURCES:
        sources = [source]
    else:
        raise KeyError(f"unknown CUDA source {source!r}; expected one of {list(_KERNEL_SOURCES)}")
    names: list[str] = []
    for name in sources:
        if name == "create_output":
            names.extend(_name_expression(name, None, idt) for idt in _ID_CTYPES)
        else:
            names.extend(
                _name_expression(name, pdt, idt) for pdt in _PROB_CTYPES for idt in _ID_CTYPES
            )
        names.append(_INIT_KERNEL)
    return names


# ---------------------------------------------------------------------------------------------
# Compilation cache
# ---------------------------------------------------------------------------------------------

_MODULES: dict[tuple[int, str], Any] = {}
_MODULES_LOCK = threading.Lock()


def _module(source: str) -> Any:
    """Return the ``RawModule`` of ``source`` for the current device, compiling it once."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), source)
    module = _MODULES.get(key)
    if module is None:
        with _MODULES_LOCK:
            module = _MODULES.get(key)
            if module is None:
                module = cupy.RawModule(
                    code=_COMMON_HEADER + _KERNEL_SOURCES[source],
                    options=_COMPILE_OPTIONS,
                    name_expressions=instantiation_names(source),
                )
                _MODULES[key] = module
    return module


def _kernel(source: str, name_expression: str) -> Any:
    """Return the compiled kernel ``name_expression`` of ``source`` on the current device."""
    return _module(source).get_function(name_expression)


# ---------------------------------------------------------------------------------------------
# Launch helpers (O(1) host-side checks only: they guard device memory, never synchronise)
# ---------------------------------------------------------------------------------------------


def _require(array: Any, name: str, ndim: int, dtypes: tuple[str, ...]) -> None:
    if array.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array, found shape {tuple(array.shape)}")
    if np.dtype(array.dtype).name not in dtypes:
        raise TypeError(f"{name}: expected dtype in {dtypes}, found {array.dtype}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array")


def _require_shape(array: Any, name: str, shape: tuple[int, ...]) -> None:
    if tuple(array.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, found {tuple(array.shape)}")


def _require_bonus(bonus_ids: Any, batch: int, id_dtype: Any) -> None:
    if tuple(bonus_ids.shape) not in ((batch,), (batch, 1)):
        raise ValueError(
            f"bonus_token_ids: expected shape ({batch},) or ({batch}, 1), "
            f"found {tuple(bonus_ids.shape)}"
        )
    if bonus_ids.dtype != id_dtype:
        raise TypeError(
            f"bonus_token_ids: expected dtype {np.dtype(id_dtype)} (as draft_token_ids), "
            f"found {bonus_ids.dtype}"
        )
    if not bonus_ids.flags.c_contiguous:
        raise ValueError("bonus_token_ids: expected a C-contiguous array")


def _require_int64(array: Any, name: str, shape: tuple[int, ...]) -> None:
    if tuple(array.shape) != shape or np.dtype(array.dtype) != np.int64:
        raise ValueError(
            f"{name}: expected an int64 array of shape {shape}, "
            f"found {array.dtype} {tuple(array.shape)}"
        )
    if not array.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array")


def _require_one_device(**named: Any) -> None:
    """All CuPy arrays on one device (``None`` entries skipped); O(1), no synchronisation."""
    devices = {name: array.device.id for name, array in named.items() if array is not None}
    if len(set(devices.values())) > 1:
        found = ", ".join(f"{name} on device {device}" for name, device in devices.items())
        raise ValueError(f"expected every array on one CUDA device, found {found}")


def _check_target_and_ids(target: Any, draft_ids: Any, bonus_ids: Any) -> tuple[int, int, int]:
    _require(target, "target_with_bonus_probs", 3, tuple(_PROB_CTYPES))
    batch, k_plus_1, vocab = (int(n) for n in target.shape)
    if k_plus_1 < 1:
        raise ValueError("target_with_bonus_probs: expected shape [B, k+1, V] with k+1 >= 1")
    k = k_plus_1 - 1
    _require(draft_ids, "draft_token_ids", 2, tuple(_ID_CTYPES))
    _require_shape(draft_ids, "draft_token_ids", (batch, k))
    _require_bonus(bonus_ids, batch, draft_ids.dtype)
    return batch, k, vocab


def _check_draft_probs(draft_probs: Any, target: Any, batch: int, k: int, vocab: int) -> None:
    _require(draft_probs, "draft_probs", 3, tuple(_PROB_CTYPES))
    _require_shape(draft_probs, "draft_probs", (batch, k, vocab))
    if draft_probs.dtype != target.dtype:
        raise TypeError(
            f"draft_probs: expected dtype {target.dtype} (as the target), "
            f"found {draft_probs.dtype}"
        )


def _check_row_buffers(
    batch: int, k: int, output: Any, accepted_lengths: Any, num_accepted: Any, row_status: Any
) -> None:
    _require_int64(output, "output", (batch, k + 1))
    _require_int64(accepted_lengths, "accepted_lengths", (batch,))
    _require_int64(num_accepted, "num_accepted", (batch,))
    _require_int64(row_status, "row_status", (batch,))


def _launch_verifier(
    source: str, target: Any, draft_ids: Any, args: tuple[Any, ...], tail: tuple[Any, ...]
) -> None:
    """Launch ``source``'s verifier kernel: one block of ``BLOCK_SIZE`` threads per row."""
    batch = int(target.shape[0])
    kernel = _kernel(source, _name_expression(source, target.dtype, draft_ids.dtype))
    kernel((batch,), (BLOCK_SIZE,), (*args, *tail))


def _run_verifier(
    source: str, target: Any, draft_ids: Any, args: tuple[Any, ...], counters: Any
) -> tuple[Any, Any, Any, Any]:
    """Allocate the outputs, initialise the call state, launch the verifier (module doc).

    One ``int64`` allocation holds ``out``, ``accepted_lengths``, ``num_accepted_per_row`` and
    the 4-slot call state, whose slot 2 is the returned ``error_flag``: two launches per call
    (``init_call_state_kernel``, then the verifier, whose last block commits the counters).
    """
    import cupy

    batch, k = int(target.shape[0]), int(draft_ids.shape[1])
    cells = batch * (k + 1)
    buffer = cupy.empty((cells + 2 * batch + _STATE_SIZE,), dtype=cupy.int64)
    out = buffer[:cells].reshape(batch, k + 1)
    accepted_lengths = buffer[cells : cells + batch]
    num_accepted_per_row = buffer[cells + batch : cells + 2 * batch]
    state = buffer[cells + 2 * batch :]
    if batch == 0:  # no kernel of ours runs: the flag is filled by CuPy
        return out, accepted_lengths, num_accepted_per_row, cupy.full((1,), NO_ERROR, cupy.int64)
    _kernel(source, _INIT_KERNEL)((1,), (1,), (state,))
    tail = (out, accepted_lengths, num_accepted_per_row, counters, state, None)
    _launch_verifier(source, target, draft_ids, args, tail)
    return (
        out,
        accepted_lengths,
        num_accepted_per_row,
        state[_ERROR_FLAG_SLOT : _ERROR_FLAG_SLOT + 1],
    )


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------


def create_output(
    accepted: Any,
    substitute_token_ids: Any,
    draft_token_ids: Any,
    bonus_token_ids: Any,
    counters: Any,
) -> Any:
    """Format verifier decisions into the ``[B, k+1]`` output (vLLM's ``_create_output``).

    Parameters
    ----------
    accepted : cupy.ndarray
        ``[B, k]`` bool or uint8, C-contiguous: per-position acceptance.
    substitute_token_ids : cupy.ndarray
        ``[B, k]`` int32/int64: token emitted at the first rejected position.
    draft_token_ids : cupy.ndarray
        ``[B, k]`` int32/int64, C-contiguous: the draft tokens.
    bonus_token_ids : cupy.ndarray
        ``[B]`` or ``[B, 1]``: token emitted when all ``k`` are accepted.
    counters : cupy.ndarray
        int64 ``[2]`` on the same device; ``counters[0] +=`` number of accepted positions
        (all of them, also after the first rejection), ``counters[1] +=`` emitted tokens.

    Returns
    -------
    cupy.ndarray
        int64 ``[B, k+1]``: accepted prefix of length ``r``, then the substitute (``r < k``) or
        the bonus token, then ``-1``. Ids are copied verbatim (never used as indices), so they
        are not range-checked. Substitute and bonus ids of another integer dtype than the
        draft ids are cast to it. Asynchronous: nothing waits for the device.
    """
    import cupy

    _require(accepted, "accepted", 2, ("bool", "uint8"))
    batch, k = (int(n) for n in accepted.shape)
    _require(draft_token_ids, "draft_token_ids", 2, tuple(_ID_CTYPES))
    _require_shape(draft_token_ids, "draft_token_ids", (batch, k))
    _require_int64(counters, "counters", (2,))
    _require_one_device(
        accepted=accepted,
        substitute_token_ids=substitute_token_ids,
        draft_token_ids=draft_token_ids,
        bonus_token_ids=bonus_token_ids,
        counters=counters,
    )
    id_dtype = draft_token_ids.dtype
    with accepted.device:
        substitute = cupy.ascontiguousarray(substitute_token_ids.astype(id_dtype, copy=False))
        _require_shape(substitute, "substitute_token_ids", (batch, k))
        bonus = cupy.ascontiguousarray(bonus_token_ids.astype(id_dtype, copy=False))
        _require_bonus(bonus, batch, id_dtype)
        out = cupy.empty((batch, k + 1), dtype=cupy.int64)
        if batch == 0:
            return out
        kernel = _kernel("create_output", _name_expression("create_output", None, id_dtype))
        grid = (batch + CREATE_OUTPUT_BLOCK - 1) // CREATE_OUTPUT_BLOCK
        args = (accepted, substitute, draft_token_ids, bonus, np.int64(batch), np.int64(k))
        kernel(
            (grid,), (CREATE_OUTPUT_BLOCK,), (*args, np.int64(-1), out, None, None, counters, None)
        )
    return out


def rejection_sample(
    target: Any,
    draft_probs: Any | None,
    draft_ids: Any,
    bonus_ids: Any,
    uniforms: Any,
    counters: Any,
) -> tuple[Any, Any, Any, Any]:
    """Run the fused rejection-sampling kernel (SPEC 4.1): one launch, one block per row.

    Parameters
    ----------
    target : cupy.ndarray
        ``[B, k+1, V]`` float32/float64, C-contiguous: target probabilities with the bonus
        position last.
    draft_probs : cupy.ndarray or None
        ``[B, k, V]`` of ``target``'s dtype, or ``None`` for point-mass drafts (``q = 1`` at the
        draft token).
    draft_ids : cupy.ndarray
        ``[B, k]`` int32/int64.
    bonus_ids : cupy.ndarray
        ``[B]`` or ``[B, 1]`` of ``draft_ids``'s dtype.
    uniforms : cupy.ndarray
        float64 ``[B, k+1]`` in ``[0, 1)``: columns ``0..k-1`` are the acceptance uniforms,
        column ``k`` the residual uniform.
    counters : cupy.ndarray
        int64 ``[2]`` (accepted, emitted), added to on the device only if the call raises no
        error flag.

    Returns
    -------
    out : cupy.ndarray
        int64 ``[B, k+1]``.
    accepted_lengths : cupy.ndarray
        int64 ``[B]``: ``r_b``, the accepted prefix length.
    num_accepted_per_row : cupy.ndarray
        int64 ``[B]``: positions whose acceptance test passed (all ``k`` tested).
    error_flag : cupy.ndarray
        int64 ``[1]``, :data:`NO_ERROR` unless an id was out of range or a row had no mass
        (module docstring). Not inspected here: check it with :func:`check_error_flag`.

    Notes
    -----
    Asynchronous (no host synchronisation): a one-thread state initialisation, then the
    verifier, whose last block commits the counters. ``B == 0`` returns empty arrays and
    launches no kernel of this module.
    """
    batch, k, vocab = _check_target_and_ids(target, draft_ids, bonus_ids)
    if draft_probs is not None:
        _check_draft_probs(draft_probs, target, batch, k, vocab)
    _require(uniforms, "uniforms", 2, ("float64",))
    _require_shape(uniforms, "uniforms", (batch, k + 1))
    _require_int64(counters, "counters", (2,))
    args = (target, draft_probs, draft_ids, bonus_ids, uniforms)
    _require_one_device(
        target_with_bonus_probs=target,
        draft_probs=draft_probs,
        draft_token_ids=draft_ids,
        bonus_token_ids=bonus_ids,
        uniforms=uniforms,
        counters=counters,
    )
    sizes = (np.int64(batch), np.int64(k), np.int64(vocab))
    with target.device:
        return _run_verifier("rejection_sample", target, draft_ids, (*args, *sizes), counters)


def typical_acceptance_sample(
    target: Any,
    draft_ids: Any,
    bonus_ids: Any,
    posterior_threshold: float,
    posterior_alpha: float,
    counters: Any,
) -> tuple[Any, Any, Any, Any]:
    """Run the typical-acceptance kernel (SPEC 4.3): one launch, one block per row.

    Parameters
    ----------
    target : cupy.ndarray
        ``[B, k+1, V]`` float32/float64, C-contiguous (need not be normalised).
    draft_ids : cupy.ndarray
        ``[B, k]`` int32/int64.
    bonus_ids : cupy.ndarray
        ``[B]`` or ``[B, 1]`` of ``draft_ids``'s dtype.
    posterior_threshold : float
        Accept when ``p(x) > posterior_threshold`` (the row is then not read).
    posterior_alpha : float
        Otherwise accept when ``p(x) > posterior_alpha * exp(-H)``.
    counters : cupy.ndarray
        int64 ``[2]`` (accepted, emitted), added to on the device only if no error is flagged.

    Returns
    -------
    tuple of cupy.ndarray
        ``(out, accepted_lengths, num_accepted_per_row, error_flag)`` as in
        :func:`rejection_sample`. The recovered token is ``argmax p_r`` (first index on ties,
        NaN entries ignored, ``0`` when no entry is above ``-inf``).
    """
    batch, k, vocab = _check_target_and_ids(target, draft_ids, bonus_ids)
    _require_int64(counters, "counters", (2,))
    _require_one_device(
        target_with_bonus_probs=target,
        draft_token_ids=draft_ids,
        bonus_token_ids=bonus_ids,
        counters=counters,
    )
    args = (
        target,
        draft_ids,
        bonus_ids,
        np.float64(posterior_threshold),
        np.float64(posterior_alpha),
        np.int64(batch),
        np.int64(k),
        np.int64(vocab),
    )
    with target.device:
        return _run_verifier("typical_acceptance", target, draft_ids, args, counters)


def greedy_sample(
    target: Any, draft_ids: Any, bonus_ids: Any, counters: Any
) -> tuple[Any, Any, Any, Any]:
    """Run the greedy (argmax) verification kernel (SPEC 4.2): one launch, one block per row.

    Parameters
    ----------
    target : cupy.ndarray
        ``[B, k+1, V]`` float32/float64, C-contiguous; rows are probability distributions
        (``p(x) > 0.5 + GREEDY_MARGIN`` accepts ``x`` without reading its row).
    draft_ids : cupy.ndarray
        ``[B, k]`` int32/int64.
    bonus_ids : cupy.ndarray
        ``[B]`` or ``[B, 1]`` of ``draft_ids``'s dtype.
    counters : cupy.ndarray
        int64 ``[2]`` (accepted, emitted), added to on the device only if no error is flagged.

    Returns
    -------
    tuple of cupy.ndarray
        ``(out, accepted_lengths, num_accepted_per_row, error_flag)`` as in
        :func:`rejection_sample`. Argmax: first index on ties, NaN entries ignored, ``0`` when
        no entry is above ``-inf``.
    """
    batch, k, vocab = _check_target_and_ids(target, draft_ids, bonus_ids)
    _require_int64(counters, "counters", (2,))
    _require_one_device(
        target_with_bonus_probs=target,
        draft_token_ids=draft_ids,
        bonus_token_ids=bonus_ids,
        counters=counters,
    )
    args = (target, draft_ids, bonus_ids, np.int64(batch), np.int64(k), np.int64(vocab))
    with target.device:
        return _run_verifier("greedy", target, draft_ids, args, counters)


# ---------------------------------------------------------------------------------------------
# The CPU kernels' calling convention (``specdec_np._core``), for ``_backend.kernels_for``
# ---------------------------------------------------------------------------------------------


def _launch_into_buffers(
    kernel: str,
    leading_args: tuple[Any, ...],
    target: Any,
    draft_token_ids: Any,
    bonus_token_ids: Any,
    buffers: tuple[Any, Any, Any, Any],
    **also_on_device: Any,
) -> None:
    """Check the shared arguments of a verifier, then launch ``kernel`` with
    ``leading_args``, the sizes ``B, k, V`` and the caller's ``(output, accepted_lengths,
    num_accepted, row_status)`` buffers (no device counters, no error flag)."""
    batch, k, vocab = _check_target_and_ids(target, draft_token_ids, bonus_token_ids)
    output, accepted_lengths, num_accepted, row_status = buffers
    _check_row_buffers(batch, k, output, accepted_lengths, num_accepted, row_status)
    _require_one_device(
        target_with_bonus_probs=target,
        draft_token_ids=draft_token_ids,
        bonus_token_ids=bonus_token_ids,
        output=output,
        row_status=row_status,
        **also_on_device,
    )
    if batch == 0:
        return
    sizes = (np.int64(batch), np.int64(k), np.int64(vocab))
    tail = (output, accepted_lengths, num_accepted, None, None, row_status)
    with target.device:
        _launch_verifier(kernel, target, draft_token_ids, (*leading_args, *sizes), tail)


class _CoreLikeKernels:
    """The kernels behind the signatures of ``specdec_np/_core.pyi``, on CuPy arrays.

    The caller allocates every output; the kernels fill ``row_status`` with the CPU protocol
    (``0`` verified, ``1 + column`` for an out-of-range id, ``-(1 + r)`` for a zero-mass row)
    and update no counter (the caller sums the per-row arrays). ``num_threads`` is accepted
    and ignored. Asynchronous: nothing here waits for the device; reading ``row_status``
    does.
    """

    @staticmethod
    def rejection_sample(
        target_with_bonus_probs: Any,
        draft_probs: Any,
        point_mass_drafts: bool,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        uniforms: Any,
        output: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        row_status: Any,
        num_threads: int = 1,
    ) -> None:
        """Rejection sampling into caller buffers (``_core.rejection_sample``'s signature)."""
        target = target_with_bonus_probs
        batch, k, vocab = _check_target_and_ids(target, draft_token_ids, bonus_token_ids)
        probs = None if point_mass_drafts else draft_probs
        if probs is not None:
            _check_draft_probs(probs, target, batch, k, vocab)
        _require(uniforms, "uniforms", 2, ("float64",))
        _require_shape(uniforms, "uniforms", (batch, k + 1))
        _launch_into_buffers(
            "rejection_sample",
            (target, probs, draft_token_ids, bonus_token_ids, uniforms),
            target,
            draft_token_ids,
            bonus_token_ids,
            (output, accepted_lengths, num_accepted, row_status),
            draft_probs=probs,
            uniforms=uniforms,
        )

    @staticmethod
    def typical_acceptance_sample(
        target_with_bonus_probs: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        posterior_threshold: float,
        posterior_alpha: float,
        output: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        row_status: Any,
        num_threads: int = 1,
    ) -> None:
        """Typical acceptance into caller buffers (``_core``'s signature)."""
        target = target_with_bonus_probs
        _launch_into_buffers(
            "typical_acceptance",
            (
                target,
                draft_token_ids,
                bonus_token_ids,
                np.float64(posterior_threshold),
                np.float64(posterior_alpha),
            ),
            target,
            draft_token_ids,
            bonus_token_ids,
            (output, accepted_lengths, num_accepted, row_status),
        )

    @staticmethod
    def greedy_sample(
        target_with_bonus_probs: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        output: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        row_status: Any,
        num_threads: int = 1,
    ) -> None:
        """Greedy verification into caller buffers (``_core``'s signature)."""
        target = target_with_bonus_probs
        _launch_into_buffers(
            "greedy",
            (target, draft_token_ids, bonus_token_ids),
            target,
            draft_token_ids,
            bonus_token_ids,
            (output, accepted_lengths, num_accepted, row_status),
        )

    @staticmethod
    def create_output(
        accepted: Any,
        substitute_token_ids: Any,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        vocab_size: int,
        output: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        row_status: Any,
    ) -> None:
        """``_create_output`` into caller buffers, ids checked against ``vocab_size``."""
        _require(accepted, "accepted", 2, ("bool", "uint8"))
        batch, k = (int(n) for n in accepted.shape)
        _require(draft_token_ids, "draft_token_ids", 2, tuple(_ID_CTYPES))
        _require_shape(draft_token_ids, "draft_token_ids", (batch, k))
        _require(substitute_token_ids, "substitute_token_ids", 2, tuple(_ID_CTYPES))
        _require_shape(substitute_token_ids, "substitute_token_ids", (batch, k))
        if substitute_token_ids.dtype != draft_token_ids.dtype:
            raise TypeError("substitute_token_ids: expected the dtype of draft_token_ids")
        _require_bonus(bonus_token_ids, batch, draft_token_ids.dtype)
        _check_row_buffers(batch, k, output, accepted_lengths, num_accepted, row_status)
        _require_one_device(
            accepted=accepted,
            substitute_token_ids=substitute_token_ids,
            draft_token_ids=draft_token_ids,
            output=output,
            row_status=row_status,
        )
        if batch == 0:
            return
        if vocab_size < 0:
            raise ValueError(f"vocab_size: expected a non-negative int, found {vocab_size}")
        id_dtype = draft_token_ids.dtype
        args = (accepted, substitute_token_ids, draft_token_ids, bonus_token_ids)
        sizes = (np.int64(batch), np.int64(k), np.int64(vocab_size))
        tail = (output, accepted_lengths, num_accepted, None, row_status)
        grid = (batch + CREATE_OUTPUT_BLOCK - 1) // CREATE_OUTPUT_BLOCK
        with accepted.device:
            kernel = _kernel("create_output", _name_expression("create_output", None, id_dtype))
            kernel((grid,), (CREATE_OUTPUT_BLOCK,), (*args, *sizes, *tail))


#: The kernels with ``specdec_np._core``'s calling convention (caller-allocated outputs and
#: ``row_status``, no counters), so that code written against ``_core`` runs on CuPy arrays.
core_like = _CoreLikeKernels()


# ---------------------------------------------------------------------------------------------
# Error flag
# ---------------------------------------------------------------------------------------------


def decode_error_flag(value: int, batch_size: int, k: int) -> tuple[str, int, int] | None:
    """Decode a host copy of a verifier kernel's error flag.

    Parameters
    ----------
    value : int
        The flag value (``int(error_flag[0])``).
    batch_size : int
        ``B`` of the call that produced the flag.
    k : int
        Number of draft positions of that call.

    Returns
    -------
    tuple of (str, int, int) or None
        ``None`` for :data:`NO_ERROR`. ``("draft_token_ids", row, position)`` or
        ``("bonus_token_ids", row, 0)`` for the first out-of-range id, or
        ``("zero_mass", row, position)`` for a rejected position with no residual and no
        target mass.

    Raises
    ------
    ValueError
        If ``value`` is not a code this module's kernels can produce for ``(B, k)``.
    """
    value = int(value)
    if value == NO_ERROR:
        return None
    width = k + 1
    cells = batch_size * width
    if 0 <= value < cells:
        row, column = divmod(value, width)
        if column == k:
            return ("bonus_token_ids", row, 0)
        return ("draft_token_ids", row, column)
    if cells <= value < 2 * cells:
        row, column = divmod(value - cells, width)
        return ("zero_mass", row, column)
    raise ValueError(f"error flag {value} is not a valid code for B={batch_size}, k={k}")


def check_error_flag(error_flag: Any, draft_ids: Any, bonus_ids: Any, vocab_size: int) -> None:
    """Raise if a verifier kernel flagged an error. **Synchronises** with the device.

    Parameters
    ----------
    error_flag : cupy.ndarray
        The int64 ``[1]`` flag returned by a launcher.
    draft_ids : cupy.ndarray
        The ``[B, k]`` draft ids of that call (read only on error, for the message).
    bonus_ids : cupy.ndarray
        The bonus ids of that call.
    vocab_size : int
        ``V`` of that call.

    Raises
    ------
    ValueError
        For an out-of-range id (naming the argument, the first offending ``(row, position)``
        and its value) or a zero-mass row.
    """
    batch, k = (int(n) for n in draft_ids.shape)
    decoded = decode_error_flag(int(error_flag[0]), batch, k)
    if decoded is None:
        return
    kind, row, position = decoded
    if kind == "draft_token_ids":
        found = int(draft_ids[row, position])
        raise ValueError(
            f"draft_token_ids: expected token ids in [0, {vocab_size}), found {found} "
            f"at (row, position) = ({row}, {position})"
        )
    if kind == "bonus_token_ids":
        found = int(bonus_ids.reshape(-1)[row])
        raise ValueError(
            f"bonus_token_ids: expected token ids in [0, {vocab_size}), found {found} "
            f"at (row, position) = ({row}, 0)"
        )
    raise ValueError(
        f"target_with_bonus_probs: expected positive probability mass at the rejected "
        f"position, found none (no residual and no target mass) at (row, position) = "
        f"({row}, {position})"
    )
