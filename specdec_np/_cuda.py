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
``create_output_kernel<IdT>``
    One thread per row, ``CREATE_OUTPUT_BLOCK`` (256) threads per block,
    ``ceil(B / 256)`` blocks.
``rejection_sample_kernel<ProbT, IdT>``, ``typical_acceptance_kernel<ProbT, IdT>``,
``greedy_kernel<ProbT, IdT>``
    One thread block of ``BLOCK_SIZE`` (512) threads per row, ``B`` blocks, no dynamic
    shared memory. The typical-acceptance and greedy kernels loop over the ``k`` positions
    inside the block.
``commit_counters_kernel``
    One thread; adds the call's pending counter increments to the caller's counters.

Device-side error flag protocol
-------------------------------
Some input errors can only be seen on the device without a host synchronisation: a token id
outside ``[0, V)``, and (rejection sampler only) a row whose residual *and* target have no
positive mass. The verifier launchers therefore allocate an ``int64`` array ``error_flag`` of
shape ``(1,)`` initialised to :data:`NO_ERROR` (``2**63 - 1``) and every kernel block that
finds a problem stores a code into it with ``atomicMin``. The codes index a virtual
``[2, B, k + 1]`` array, so the smallest code is the first problem in row-major order:

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

The kernels add their counter increments (accepted, emitted) to a per-call ``pending`` pair
with ``atomicAdd``; a one-thread ``commit_counters_kernel`` launched right after adds the pair
to the caller's counters **only if the flag is still** :data:`NO_ERROR`, so a failed call
changes no counter, without any host synchronisation.

The launchers return the flag without looking at it (looking would synchronise). The caller
checks it at the point it documents, with :func:`check_error_flag` (which synchronises and
raises ``ValueError``) or :func:`decode_error_flag` on a value it already copied to the host.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = [
    "BLOCK_SIZE",
    "CREATE_OUTPUT_BLOCK",
    "NO_ERROR",
    "check_error_flag",
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
    f"constexpr int kBlock = {BLOCK_SIZE};  // threads per block of the per-row kernels\n"
    f"constexpr int kRowsPerBlock = {CREATE_OUTPUT_BLOCK};  // create_output_kernel block\n"
    + r"""constexpr int kWarp = 32;
constexpr int kWarps = kBlock / kWarp;        // segments of the first draw level
constexpr int kUnroll = 4;                    // independent loads in flight per thread
constexpr long long kNoError = 0x7fffffffffffffffLL;  // error flag value: no error
constexpr long long kNone = 0x7fffffffffffffffLL;     // "no index yet" in reductions

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

// p * ln(p + 1e-5): the per-element entropy term. float rows use the float32 logf (the
// accuracy the CPU kernel uses), double rows the double log. Accumulated in double.
__device__ __forceinline__ double entropy_term(float p) {
    return static_cast<double>(p) * static_cast<double>(logf(p + 1e-5f));
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

// One pass over a probability row: argmax (first index on ties; NaN entries ignored; kNone if
// every entry is NaN) and, when WithEntropy, sum_y p(y) * ln(p(y) + 1e-5). Reads are coalesced
// (thread t reads t, t + kBlock, ...), kUnroll loads in flight per thread.
template <bool WithEntropy, typename ProbT>
__device__ void row_argmax_entropy(const ProbT* __restrict__ row, long long vocab,
                                   double& best, long long& best_index, double& plogp,
                                   double* value_buf, long long* index_buf, double* sum_buf) {
    best = negative_infinity();
    best_index = kNone;
    plogp = 0.0;
    for (long long base = threadIdx.x; base < vocab; base += (long long)kBlock * kUnroll) {
        ProbT vals[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const long long y = base + (long long)u * kBlock;
            vals[u] = y < vocab ? row[y] : ProbT(0);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
            const long long y = base + (long long)u * kBlock;
            if (y < vocab) {
                const double p = static_cast<double>(vals[u]);
                if (p > best || (p == best && y < best_index)) {
                    best = p;
                    best_index = y;
                }
                if (WithEntropy) plogp += entropy_term(vals[u]);
            }
        }
    }
    block_argmax_and_sum(best, best_index, plogp, value_buf, index_buf, sum_buf);
}

// Checks every id of row b (draft ids and the bonus id) against [0, vocab). On failure the
// row's output becomes -1, its statistics 0, the flag gets the first bad column, and false is
// returned to every thread (the caller returns; no id of the row is ever used as an index).
template <typename IdT>
__device__ bool validate_row_ids(const IdT* __restrict__ draft_ids,
                                 const IdT* __restrict__ bonus_ids, long long b, long long k,
                                 long long vocab, long long* __restrict__ out_row,
                                 long long* __restrict__ accepted_lengths,
                                 long long* __restrict__ num_accepted_per_row,
                                 long long* __restrict__ error_flag, long long* first_bad) {
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
        atomicMin(error_flag, b * (k + 1) + bad);
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

// Thread 0: per-row statistics and this block's contribution to the pending counters.
__device__ __forceinline__ void finish_row(long long b, long long r, long long num_accepted,
                                           long long* __restrict__ accepted_lengths,
                                           long long* __restrict__ num_accepted_per_row,
                                           long long* counters, bool count) {
    if (threadIdx.x != 0) return;
    accepted_lengths[b] = r;
    num_accepted_per_row[b] = num_accepted;
    if (count) {
        add_counter(counters + 0, num_accepted);
        add_counter(counters + 1, r + 1);
    }
}
}  // namespace specdec

// Adds the pending counter increments of one call to the caller's counters, unless the call
// raised the error flag. Launch: 1 block of 1 thread.
__global__ void commit_counters_kernel(const long long* __restrict__ pending,
                                       const long long* __restrict__ error_flag,
                                       long long* __restrict__ counters) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && *error_flag == specdec::kNoError) {
        counters[0] += pending[0];
        counters[1] += pending[1];
    }
}
"""
)

_CREATE_OUTPUT_SOURCE = r"""
// vLLM's _create_output. Row b: r = first position whose `accepted` is false (k if none);
// out[b, :r] = draft ids, out[b, r] = substitute[b, r] if r < k else bonus[b], rest -1.
// counters[0] += number of true entries of accepted[b] (all positions, also after r),
// counters[1] += r + 1 (atomicAdd on device).
// Launch: grid ceil(B / kRowsPerBlock), block kRowsPerBlock; one thread per row.
template <typename IdT>
__global__ void __launch_bounds__(specdec::kRowsPerBlock)
create_output_kernel(const unsigned char* __restrict__ accepted,
                     const IdT* __restrict__ substitute_token_ids,
                     const IdT* __restrict__ draft_token_ids,
                     const IdT* __restrict__ bonus_token_ids, long long batch, long long k,
                     long long* __restrict__ out, long long* __restrict__ counters) {
    const long long b = (long long)blockIdx.x * specdec::kRowsPerBlock + threadIdx.x;
    if (b >= batch) return;
    const unsigned char* acc = accepted + b * k;
    long long r = k;
    long long num_accepted = 0;
    for (long long i = 0; i < k; ++i) {
        if (acc[i] != 0) {
            ++num_accepted;
        } else if (r == k) {
            r = i;
        }
    }
    long long* row = out + b * (k + 1);
    for (long long j = 0; j <= k; ++j) {
        long long value = -1;
        if (j < r) {
            value = static_cast<long long>(draft_token_ids[b * k + j]);
        } else if (j == r) {
            value = r < k ? static_cast<long long>(substitute_token_ids[b * k + r])
                          : static_cast<long long>(bonus_token_ids[b]);
        }
        row[j] = value;
    }
    specdec::add_counter(counters + 0, num_accepted);
    specdec::add_counter(counters + 1, r + 1);
}
"""

_REJECTION_SOURCE = r"""
namespace specdec {

// Non-negative draw weights of one vocabulary row (w > 0 ? w : 0, so NaN contributes 0).
// Residual with a dense draft row: max(p - q, 0).
template <typename ProbT>
struct DenseResidual {
    const ProbT* __restrict__ p;
    const ProbT* __restrict__ q;
    __device__ __forceinline__ double operator()(long long y) const {
        const double w = static_cast<double>(p[y]) - static_cast<double>(q[y]);
        return w > 0.0 ? w : 0.0;
    }
};

// Residual with a point-mass draft at x (q = 1 at x, 0 elsewhere): identical to DenseResidual
// with a one-hot q row.
template <typename ProbT>
struct PointResidual {
    const ProbT* __restrict__ p;
    long long x;
    __device__ __forceinline__ double operator()(long long y) const {
        const double w = static_cast<double>(p[y]) - (y == x ? 1.0 : 0.0);
        return w > 0.0 ? w : 0.0;
    }
};

// The target row itself: fallback when the residual has no mass.
template <typename ProbT>
struct TargetWeight {
    const ProbT* __restrict__ p;
    __device__ __forceinline__ double operator()(long long y) const {
        const double w = static_cast<double>(p[y]);
        return w > 0.0 ? w : 0.0;
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
template <typename Weight>
__device__ long long block_inverse_cdf(const Weight& weight, long long vocab, double v,
                                       DrawScratch& s) {
    const int t = threadIdx.x;
    const int warp = t / kWarp;
    const int lane = t % kWarp;
    if (t == 0) {
        s.first_thread = kBlock;
        s.last_thread = -1;
    }
    // Level 1: segment sums.
    const long long segment_length = (vocab + kWarps - 1) / kWarps;
    {
        const long long lo = (long long)warp * segment_length;
        const long long hi = min_ll(lo + segment_length, vocab);
        double acc = 0.0;
        for (long long base = lo + lane; base < hi; base += (long long)kWarp * kUnroll) {
            double w[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) {
                const long long y = base + (long long)u * kWarp;
                w[u] = y < hi ? weight(y) : 0.0;
            }
#pragma unroll
            for (int u = 0; u < kUnroll; ++u) acc += w[u];
        }
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
    const long long seg_lo = (long long)segment * segment_length;
    const long long seg_hi = min_ll(seg_lo + segment_length, vocab);
    const long long chunk = (seg_hi - seg_lo + kBlock - 1) / kBlock;
    const long long my_lo = seg_lo + (long long)t * chunk;
    const long long my_hi = min_ll(my_lo + chunk, seg_hi);
    double mine = 0.0;
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
// counters[0..1] += (accepted tests, emitted tokens); error_flag: see the module docstring.
template <typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock)
rejection_sample_kernel(const ProbT* __restrict__ target, const ProbT* __restrict__ draft_probs,
                        const IdT* __restrict__ draft_ids, const IdT* __restrict__ bonus_ids,
                        const double* __restrict__ uniforms, long long batch, long long k,
                        long long vocab, long long* __restrict__ out,
                        long long* __restrict__ accepted_lengths,
                        long long* __restrict__ num_accepted_per_row,
                        long long* __restrict__ counters, long long* __restrict__ error_flag) {
    __shared__ long long first_bad;
    __shared__ long long first_reject;
    __shared__ unsigned long long num_accepted;
    __shared__ specdec::DrawScratch scratch;
    const long long b = blockIdx.x;
    if (b >= batch) return;
    const int t = threadIdx.x;
    long long* out_row = out + b * (k + 1);
    if (!specdec::validate_row_ids(draft_ids, bonus_ids, b, k, vocab, out_row, accepted_lengths,
                                   num_accepted_per_row, error_flag, &first_bad)) {
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
    bool valid = true;
    if (r == k) {
        token = static_cast<long long>(bonus_ids[b]);
    } else {
        // Only row r is read: the residual, and the target as a fallback when it has no mass.
        const ProbT* p_row = target + (b * (k + 1) + r) * vocab;
        const double v = u_row[k];
        if (draft_probs != nullptr) {
            const specdec::DenseResidual<ProbT> w{p_row, draft_probs + (b * k + r) * vocab};
            token = specdec::block_inverse_cdf(w, vocab, v, scratch);
        } else {
            const specdec::PointResidual<ProbT> w{p_row,
                                                  static_cast<long long>(draft_ids[b * k + r])};
            token = specdec::block_inverse_cdf(w, vocab, v, scratch);
        }
        if (token < 0) {
            const specdec::TargetWeight<ProbT> w{p_row};
            token = specdec::block_inverse_cdf(w, vocab, v, scratch);
        }
        if (token < 0) {  // zero-mass row: invalid input, reported through the flag
            valid = false;
            token = 0;
            if (t == 0) atomicMin(error_flag, batch * (k + 1) + b * (k + 1) + r);
        }
    }
    specdec::write_row(out_row, draft_ids + b * k, k, r, token);
    specdec::finish_row(b, r, accepted_count, accepted_lengths, num_accepted_per_row, counters,
                        valid);
}
"""

_TYPICAL_SOURCE = r"""
// Typical acceptance (SPEC 4.3). Launch: grid B, block specdec::kBlock; one block per row,
// looping over the k positions. Position i is accepted iff
//     p_i(x_i) > min(posterior_threshold, posterior_alpha * exp(-H_i)),
//     H_i = -sum_y p_i(y) * ln(p_i(y) + 1e-5)   (double accumulation),
// evaluated as "p > posterior_threshold (shortcut: the row is not read) or p > alpha*exp(-H)",
// so a NaN entropy never accepts. The recovered token at the first rejection r is argmax p_r
// (first index on ties, NaN entries ignored, 0 if the row is all NaN), computed in the same
// pass as the entropy; the bonus id if all k are accepted. Inputs need not be normalised.
template <typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock)
typical_acceptance_kernel(const ProbT* __restrict__ target, const IdT* __restrict__ draft_ids,
                          const IdT* __restrict__ bonus_ids, double posterior_threshold,
                          double posterior_alpha, long long batch, long long k, long long vocab,
                          long long* __restrict__ out, long long* __restrict__ accepted_lengths,
                          long long* __restrict__ num_accepted_per_row,
                          long long* __restrict__ counters, long long* __restrict__ error_flag) {
    __shared__ long long first_bad;
    __shared__ double value_buf[specdec::kBlock];
    __shared__ long long index_buf[specdec::kBlock];
    __shared__ double sum_buf[specdec::kBlock];
    const long long b = blockIdx.x;
    if (b >= batch) return;
    long long* out_row = out + b * (k + 1);
    if (!specdec::validate_row_ids(draft_ids, bonus_ids, b, k, vocab, out_row, accepted_lengths,
                                   num_accepted_per_row, error_flag, &first_bad)) {
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
        const double threshold = posterior_alpha * exp(plogp);  // exp(-H), H = -plogp
        if (px > threshold) {
            ++accepted_count;
        } else if (r == k) {
            r = i;
            recovered = best_index == specdec::kNone ? 0 : best_index;
        }
    }
    const long long token = r == k ? static_cast<long long>(bonus_ids[b]) : recovered;
    specdec::write_row(out_row, draft_ids + b * k, k, r, token);
    specdec::finish_row(b, r, accepted_count, accepted_lengths, num_accepted_per_row, counters,
                        true);
}
"""

_GREEDY_SOURCE = r"""
// Greedy verification (SPEC 4.2). Launch: grid B, block specdec::kBlock; one block per row,
// looping over the k positions. Position i is accepted iff x_i == argmax p_i (first index on
// ties, NaN entries ignored, 0 if the row is all NaN); every position is tested (the counter
// needs all of them) with one coalesced pass over its row. The token after the accepted prefix
// is argmax p_r at the first mismatch r, or the bonus id if all k match.
template <typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock)
greedy_kernel(const ProbT* __restrict__ target, const IdT* __restrict__ draft_ids,
              const IdT* __restrict__ bonus_ids, long long batch, long long k, long long vocab,
              long long* __restrict__ out, long long* __restrict__ accepted_lengths,
              long long* __restrict__ num_accepted_per_row, long long* __restrict__ counters,
              long long* __restrict__ error_flag) {
    __shared__ long long first_bad;
    __shared__ double value_buf[specdec::kBlock];
    __shared__ long long index_buf[specdec::kBlock];
    __shared__ double sum_buf[specdec::kBlock];
    const long long b = blockIdx.x;
    if (b >= batch) return;
    long long* out_row = out + b * (k + 1);
    if (!specdec::validate_row_ids(draft_ids, bonus_ids, b, k, vocab, out_row, accepted_lengths,
                                   num_accepted_per_row, error_flag, &first_bad)) {
        return;
    }
    long long r = k;
    long long recovered = 0;
    long long accepted_count = 0;
    for (long long i = 0; i < k; ++i) {  // uniform loop
        const ProbT* row = target + (b * (k + 1) + i) * vocab;
        double best;
        long long best_index;
        double unused;
        specdec::row_argmax_entropy<false>(row, vocab, best, best_index, unused, value_buf,
                                           index_buf, sum_buf);
        const long long argmax = best_index == specdec::kNone ? 0 : best_index;
        if (static_cast<long long>(draft_ids[b * k + i]) == argmax) {
            ++accepted_count;
        } else if (r == k) {
            r = i;
            recovered = argmax;
        }
    }
    const long long token = r == k ? static_cast<long long>(bonus_ids[b]) : recovered;
    specdec::write_row(out_row, draft_ids + b * k, k, r, token);
    specdec::finish_row(b, r, accepted_count, accepted_lengths, num_accepted_per_row, counters,
                        true);
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
_COMMIT_KERNEL = "commit_counters_kernel"


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
        source also contains the non-template ``"commit_counters_kernel"``, listed once per
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
        names.append(_COMMIT_KERNEL)
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


def _require_counters(counters: Any) -> None:
    if tuple(counters.shape) != (2,) or np.dtype(counters.dtype) != np.int64:
        raise ValueError(
            "counters: expected an int64 array of shape (2,), "
            f"found {counters.dtype} {tuple(counters.shape)}"
        )
    if not counters.flags.c_contiguous:
        raise ValueError("counters: expected a C-contiguous array")


def _verifier_outputs(cupy: Any, batch: int, k: int) -> tuple[Any, Any, Any, Any]:
    out = cupy.empty((batch, k + 1), dtype=cupy.int64)
    accepted_lengths = cupy.empty((batch,), dtype=cupy.int64)
    num_accepted_per_row = cupy.empty((batch,), dtype=cupy.int64)
    error_flag = cupy.full((1,), NO_ERROR, dtype=cupy.int64)
    return out, accepted_lengths, num_accepted_per_row, error_flag


def _commit(source: str, pending: Any, error_flag: Any, counters: Any) -> None:
    _kernel(source, _COMMIT_KERNEL)((1,), (1,), (pending, error_flag, counters))


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
        ``[B, k]`` int32/int64: the draft tokens.
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
    id_dtype = draft_token_ids.dtype
    substitute = cupy.ascontiguousarray(substitute_token_ids.astype(id_dtype, copy=False))
    _require_shape(substitute, "substitute_token_ids", (batch, k))
    bonus = cupy.ascontiguousarray(bonus_token_ids.astype(id_dtype, copy=False))
    _require_bonus(bonus, batch, id_dtype)
    _require_counters(counters)
    with accepted.device:
        out = cupy.empty((batch, k + 1), dtype=cupy.int64)
        if batch == 0:
            return out
        kernel = _kernel("create_output", _name_expression("create_output", None, id_dtype))
        grid = (batch + CREATE_OUTPUT_BLOCK - 1) // CREATE_OUTPUT_BLOCK
        kernel(
            (grid,),
            (CREATE_OUTPUT_BLOCK,),
            (
                accepted,
                substitute,
                draft_token_ids,
                bonus,
                np.int64(batch),
                np.int64(k),
                out,
                counters,
            ),
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
    Asynchronous (no host synchronisation). ``B == 0`` returns empty arrays and launches
    nothing.
    """
    import cupy

    batch, k, vocab = _check_target_and_ids(target, draft_ids, bonus_ids)
    if draft_probs is not None:
        _require(draft_probs, "draft_probs", 3, tuple(_PROB_CTYPES))
        _require_shape(draft_probs, "draft_probs", (batch, k, vocab))
        if draft_probs.dtype != target.dtype:
            raise TypeError(
                f"draft_probs: expected dtype {target.dtype} (as the target), "
                f"found {draft_probs.dtype}"
            )
    _require(uniforms, "uniforms", 2, ("float64",))
    _require_shape(uniforms, "uniforms", (batch, k + 1))
    _require_counters(counters)
    with target.device:
        out, accepted_lengths, num_accepted_per_row, error_flag = _verifier_outputs(cupy, batch, k)
        if batch == 0:
            return out, accepted_lengths, num_accepted_per_row, error_flag
        pending = cupy.zeros((2,), dtype=cupy.int64)
        kernel = _kernel(
            "rejection_sample",
            _name_expression("rejection_sample", target.dtype, draft_ids.dtype),
        )
        kernel(
            (batch,),
            (BLOCK_SIZE,),
            (
                target,
                draft_probs,
                draft_ids,
                bonus_ids,
                uniforms,
                np.int64(batch),
                np.int64(k),
                np.int64(vocab),
                out,
                accepted_lengths,
                num_accepted_per_row,
                pending,
                error_flag,
            ),
        )
        _commit("rejection_sample", pending, error_flag, counters)
    return out, accepted_lengths, num_accepted_per_row, error_flag


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
        NaN entries ignored, ``0`` for an all-NaN row).
    """
    import cupy

    batch, k, vocab = _check_target_and_ids(target, draft_ids, bonus_ids)
    _require_counters(counters)
    with target.device:
        out, accepted_lengths, num_accepted_per_row, error_flag = _verifier_outputs(cupy, batch, k)
        if batch == 0:
            return out, accepted_lengths, num_accepted_per_row, error_flag
        pending = cupy.zeros((2,), dtype=cupy.int64)
        kernel = _kernel(
            "typical_acceptance",
            _name_expression("typical_acceptance", target.dtype, draft_ids.dtype),
        )
        kernel(
            (batch,),
            (BLOCK_SIZE,),
            (
                target,
                draft_ids,
                bonus_ids,
                np.float64(posterior_threshold),
                np.float64(posterior_alpha),
                np.int64(batch),
                np.int64(k),
                np.int64(vocab),
                out,
                accepted_lengths,
                num_accepted_per_row,
                pending,
                error_flag,
            ),
        )
        _commit("typical_acceptance", pending, error_flag, counters)
    return out, accepted_lengths, num_accepted_per_row, error_flag


def greedy_sample(
    target: Any, draft_ids: Any, bonus_ids: Any, counters: Any
) -> tuple[Any, Any, Any, Any]:
    """Run the greedy (argmax) verification kernel (SPEC 4.2): one launch, one block per row.

    Parameters
    ----------
    target : cupy.ndarray
        ``[B, k+1, V]`` float32/float64, C-contiguous.
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
        :func:`rejection_sample`. Argmax: first index on ties, NaN entries ignored, ``0`` for
        an all-NaN row.
    """
    import cupy

    batch, k, vocab = _check_target_and_ids(target, draft_ids, bonus_ids)
    _require_counters(counters)
    with target.device:
        out, accepted_lengths, num_accepted_per_row, error_flag = _verifier_outputs(cupy, batch, k)
        if batch == 0:
            return out, accepted_lengths, num_accepted_per_row, error_flag
        pending = cupy.zeros((2,), dtype=cupy.int64)
        kernel = _kernel("greedy", _name_expression("greedy", target.dtype, draft_ids.dtype))
        kernel(
            (batch,),
            (BLOCK_SIZE,),
            (
                target,
                draft_ids,
                bonus_ids,
                np.int64(batch),
                np.int64(k),
                np.int64(vocab),
                out,
                accepted_lengths,
                num_accepted_per_row,
                pending,
                error_flag,
            ),
        )
        _commit("greedy", pending, error_flag, counters)
    return out, accepted_lengths, num_accepted_per_row, error_flag


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
