"""CUDA kernels of the CuPy backend: source strings, ``RawModule`` compilation and launches.

The CUDA C++ sources live in module-level strings (the way ``cupyx.scipy`` keeps its kernels)
and are compiled with :class:`cupy.RawModule` (NVRTC, ``--std=c++17``) the first time a kernel
is needed on a device; the compiled modules are cached per ``(device id, source)``.  Every
kernel is a template, instantiated through ``name_expressions`` for ``float``/``double``
probabilities and ``int``/``long long`` token ids (see :func:`instantiation_names`).

This module never imports CuPy at import time: every function that needs it imports it
lazily, so ``import specdec_np._cuda`` works (and :func:`cuda_sources` can be compiled with
``nvcc`` by the test-suite) on a machine without CuPy.

Structure
---------
One kernel skeleton serves every verifier, as the chain driver of ``specdec_np._core`` does
on the CPU: ``verify_chains_kernel<Row, ProbT, IdT>`` runs one thread block of
:data:`BLOCK_SIZE` threads per request (grid ``B``).  The block reads the request's draft
offsets, checks its token ids against ``V``, runs ``Row::run`` (the verifier's row functor,
named by the registry entry's ``cuda_row``) and writes the output row, the per-request
statistics and ``row_status`` exactly where and as the CPU driver does:

* ``0``: verified; the output row is the accepted prefix, the emitted token, then ``-1``;
* ``1 + column``: an id outside ``[0, V)`` (column ``k_b`` is the bonus id); nothing else of
  the request is read or written;
* ``-(1 + r)``: a token had to be drawn at position ``r`` from a target row without mass;
  the output row is not written.

``verify_trees_kernel<ProbT, IdT>`` is the tree driver's (``_core.verify_trees``) for
probability rows: one block per request walks its tree from the root, reading only the rows
on the walked path and the children tested there.  Per node the block shares the row passes
(the greedy argmax, an RRS draft row's mass, the residual update ``r <- (r - q_j)+`` into
the request's float64 working pair, the final inverse-CDF draw) and every thread repeats the
scalar steps (which child next, its test), so the whole block takes one path.  The working
rows are one ``[B, 2 V]`` buffer per call.  Its row status follows the CPU tree driver: ``0``,
``1 + j`` for a bad id at node ``j``, ``-(1 + i)`` for a row without mass (``i = 0`` the
root, ``j + 1`` node ``j``).  The elementwise arithmetic (divisions by a mass, ``max``, the
residual's differences) is the CPU's, operation for operation, so each element is the same
double; the float64 sums (residual and draft-row masses, inverse-CDF totals) are taken in
another, fixed, order (block reductions).  GPU and CPU therefore differ only where a uniform
lies within rounding of a decision or CDF boundary, the rule of the chain kernels.

``create_output_kernel<IdT>`` (vLLM's ``_create_output``) runs one thread per row,
:data:`CREATE_OUTPUT_BLOCK` threads per block.

:data:`core_like` exposes them with ``specdec_np._core``'s calling convention; its kernels
return None instead of the first failed row, which the caller reads from ``row_status``
(``_backend.first_failed_row``: the one host synchronisation of a call).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import _contract, registry

__all__ = [
    "BLOCK_SIZE",
    "CREATE_OUTPUT_BLOCK",
    "core_like",
    "cuda_sources",
    "instantiation_names",
]

#: Threads per block of ``verify_chains_kernel`` (one block per request).
BLOCK_SIZE = 512
#: Threads per block of ``create_output_kernel`` (one thread per row).
CREATE_OUTPUT_BLOCK = 256

_COMPILE_OPTIONS = ("--std=c++17",)
_PROB_CTYPES: dict[str, str] = {"float32": "float", "float64": "double"}
_ID_CTYPES: dict[str, str] = {"int32": "int", "int64": "long long"}

# ---------------------------------------------------------------------------------------------
# CUDA sources
# ---------------------------------------------------------------------------------------------

_PRELUDE = (
    "// ---- specdec_np: kernel contract (specdec_np/_contract.py) and launch constants ----\n"
    "// No #include: NVRTC (cupy.RawModule) and nvcc both provide everything used here.\n"
    + "".join(f"#define {name} {value}\n" for name, value in _contract.compile_time_macros())
    + "namespace specdec {\n"
    "// Not every source uses every constant, hence [[maybe_unused]].\n"
    f"[[maybe_unused]] constexpr int kBlock = {BLOCK_SIZE};\n"
    f"[[maybe_unused]] constexpr int kRowsPerBlock = {CREATE_OUTPUT_BLOCK};\n"
    + r"""[[maybe_unused]] constexpr double kGreedyMargin = SPECDEC_GREEDY_MARGIN;
[[maybe_unused]] constexpr double kEntropyEpsilon = SPECDEC_ENTROPY_EPSILON;
[[maybe_unused]] constexpr int kOverflowExponent = SPECDEC_OVERFLOW_EXPONENT;
[[maybe_unused]] constexpr long long kNone = 0x7fffffffffffffffLL;  // "no index" in reductions
}  // namespace specdec
"""
)

_ROW_HELPERS = r"""
namespace specdec {
constexpr int kWarp = 32;
constexpr int kWarps = kBlock / kWarp;  // segments of the first draw level
constexpr int kUnroll = 4;              // independent 16-byte loads in flight per thread

static_assert(kBlock % kWarp == 0 && (kBlock & (kBlock - 1)) == 0,
              "kBlock must be a power of two and a multiple of the warp size");

__device__ __forceinline__ long long min_ll(long long a, long long b) { return a < b ? a : b; }
__device__ __forceinline__ long long clamp_ll(long long x, long long lo, long long hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}
__device__ __forceinline__ double infinity() { return __longlong_as_double(0x7ff0000000000000LL); }

// p * ln(p + epsilon): the per-element entropy term. float rows use float32 logf and a float32
// product (the accuracy of the CPU kernel), double rows double log. Accumulated in double.
__device__ __forceinline__ double entropy_term(float p) {
    return static_cast<double>(p * logf(p + static_cast<float>(kEntropyEpsilon)));
}
__device__ __forceinline__ double entropy_term(double p) { return p * log(p + kEntropyEpsilon); }

// A draft probability as every kernel reads it: negative and NaN entries count as 0.
__device__ __forceinline__ double clean_draft(double q) { return q > 0.0 ? q : 0.0; }

// Shared memory of one block: the draw levels and the argmax/sum reduction never overlap in
// time, so they share storage.
struct ReduceScratch {
    double value[kBlock];
    long long index[kBlock];
    double sum[kBlock];
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
struct Scratch {
    union {
        ReduceScratch reduce;
        DrawScratch draw;
    };
    long long first_bad;
    long long first_reject;
    unsigned long long passed;
};

// One request as a row functor sees it: its k + 1 target rows (row stride vocab), its k draft
// rows (nullptr for point-mass drafts), its k draft ids (checked against vocab), its bonus
// id, its uniforms (k + 1; nullptr for deterministic verifiers) and the parameters.
template <typename ProbT, typename IdT>
struct RowArgs {
    const ProbT* __restrict__ target;
    const ProbT* __restrict__ draft;
    const IdT* __restrict__ draft_ids;
    long long bonus_id;
    const double* __restrict__ uniforms;
    const double* __restrict__ parameters;
    long long k;
    long long vocab;
};

// What Row::run returns, to every thread of the block.
struct RowResult {
    long long last_token;
    long long accepted_length;
    long long num_accepted;
    long long status;
};

// Block-wide reduction of a running (max value, first index) pair and a double sum; every
// thread receives the result. A NaN value never becomes the maximum because per-thread scans
// skip NaN, and (-inf, kNone) is the identity.
__device__ void block_argmax_and_sum(double& value, long long& index, double& sum,
                                     ReduceScratch& r) {
    const int t = threadIdx.x;
    r.value[t] = value;
    r.index[t] = index;
    r.sum[t] = sum;
    __syncthreads();
    for (int stride = kBlock / 2; stride > 0; stride >>= 1) {
        if (t < stride) {
            const double v = r.value[t + stride];
            const long long i = r.index[t + stride];
            if (v > r.value[t] || (v == r.value[t] && i < r.index[t])) {
                r.value[t] = v;
                r.index[t] = i;
            }
            r.sum[t] += r.sum[t + stride];
        }
        __syncthreads();
    }
    value = r.value[0];
    index = r.index[0];
    sum = r.sum[0];
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
// ignored; kNone if every entry is NaN) and, when WithEntropy, sum_y p(y) * ln(p(y) + eps).
// Every thread receives the results.
template <bool WithEntropy, typename ProbT>
__device__ void row_argmax_entropy(const ProbT* __restrict__ row, long long vocab,
                                   double& best, long long& best_index, double& plogp,
                                   ReduceScratch& r) {
    best = -infinity();
    best_index = kNone;
    plogp = 0.0;
    auto visit = [&](long long y, ProbT value, ProbT) {
        const double p = static_cast<double>(value);
        if (p > best || (p == best && y < best_index)) {
            best = p;
            best_index = y;
        }
        if (WithEntropy) plogp += entropy_term(value);
    };
    visit_range<false>(row, static_cast<const ProbT*>(nullptr), 0, vocab, (int)threadIdx.x,
                       kBlock, visit);
    block_argmax_and_sum(best, best_index, plogp, r);
}

// The argmax reported for a row: 0 when no entry is above -inf (all NaN or -inf), as the CPU
// kernel does; otherwise the first index of the maximum.
__device__ __forceinline__ long long argmax_or_zero(double best, long long best_index) {
    return (best_index == kNone || !(best > -infinity())) ? 0 : best_index;
}

// Draw weight max(rho p(y) - q(y), 0) * scale in double, by the CPU kernels' rule: q from the
// draft row (HasQ) or a point mass at x (q = 1 there, 0 elsewhere; x = -1: q = 0 everywhere),
// negative and NaN q count as 0, NaN weighs 0. rho * p is rounded on its own (no fused
// multiply-add), as on the CPU. scale is a power of two: 1 unless the sum overflows.
template <typename ProbT, bool HasQ>
struct Weight {
    using Prob = ProbT;
    static constexpr bool kHasQ = HasQ;
    const ProbT* __restrict__ p;
    const ProbT* __restrict__ q;
    long long x;
    double rho;
    double scale;
    __device__ __forceinline__ double at(long long y, ProbT pv, ProbT qv) const {
        const double q_y = HasQ ? clean_draft(static_cast<double>(qv)) : (y == x ? 1.0 : 0.0);
        const double w = __dmul_rn(rho, static_cast<double>(pv)) - q_y;
        return (w > 0.0 ? w : 0.0) * scale;
    }
    __device__ __forceinline__ double operator()(long long y) const {
        return at(y, p[y], HasQ ? q[y] : ProbT(0));
    }
};

// First-level segments: kWarps contiguous pieces of the row whose starts are multiples of
// the 16-byte pack size, so that the segments of an aligned row are aligned too.
template <typename ProbT>
__device__ __forceinline__ long long segment_length(long long vocab) {
    constexpr long long kVec = Pack<ProbT>::kSize;
    return ((vocab + kWarps - 1) / kWarps + kVec - 1) / kVec * kVec;
}

// Warp g sums segment g of the weights (coalesced) into s.segment_sum[g]; returns the sum of
// the segment sums in segment order, to every thread.
template <typename W>
__device__ double segment_sums(const W& weight, long long vocab, DrawScratch& s) {
    const int t = threadIdx.x;
    const long long length = segment_length<typename W::Prob>(vocab);
    const long long lo = min_ll((long long)(t / kWarp) * length, vocab);
    const long long hi = min_ll(lo + length, vocab);
    double acc = 0.0;
    auto add = [&](long long y, typename W::Prob pv, typename W::Prob qv) {
        acc += weight.at(y, pv, qv);
    };
    visit_range<W::kHasQ>(weight.p, weight.q, lo, hi, t % kWarp, kWarp, add);
    s.a[t] = acc;
    __syncthreads();
    if (t < kWarps) {
        double sum = 0.0;
        for (int l = 0; l < kWarp; ++l) sum += s.a[t * kWarp + l];
        s.segment_sum[t] = sum;
    }
    __syncthreads();
    double total = 0.0;
    for (int g = 0; g < kWarps; ++g) total += s.segment_sum[g];
    return total;
}

// Inverse-CDF draw from the weights w(0..V-1) with the uniform v, by the whole block.
// Returns the first y (index order) whose running double sum of w exceeds v * Z, Z the double
// sum of w; -1 (to every thread) when Z == 0. Three levels, so the row is read about 1.1 times:
//   1. segment sums (segment_sums); a sum that overflows to inf is taken again with every
//      weight times 2**kOverflowExponent, as on the CPU, so that v * Z stays finite;
//      thread 0 picks the segment where the running sum crosses v * Z;
//   2. that segment is cut into kBlock contiguous chunks, one per thread; a block inclusive
//      scan of the chunk sums picks the chunk where the running sum crosses;
//   3. the owner of that chunk scans it element by element.
// At every level only a unit with positive weight can be picked: the first whose running sum
// exceeds v * Z, else (rounding made the scan miss) the last one with positive weight. So the
// token drawn always has w > 0, and it is the exact inverse CDF wherever v * Z is not within
// rounding of a CDF boundary.
template <typename W>
__device__ long long block_inverse_cdf(W weight, long long vocab, double v, DrawScratch& s) {
    const int t = threadIdx.x;
    double total = segment_sums(weight, vocab, s);
    if (total == infinity()) {
        weight.scale = ldexp(1.0, kOverflowExponent);
        total = segment_sums(weight, vocab, s);
    }
    if (!(total > 0.0)) return -1;  // the same total in every thread: a uniform return
    if (t == 0) {
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
        s.segment = chosen < 0 ? last : chosen;
        s.base = chosen < 0 ? last_base : chosen_base;
        s.threshold = threshold;
        s.first_thread = kBlock;
        s.last_thread = -1;
    }
    __syncthreads();
    const int segment = s.segment;
    const double base = s.base;
    const double threshold = s.threshold;

    // Level 2: chunk sums inside the chosen segment, block inclusive scan (Hillis-Steele).
    const long long length = segment_length<typename W::Prob>(vocab);
    const long long seg_lo = min_ll((long long)segment * length, vocab);
    const long long seg_hi = min_ll(seg_lo + length, vocab);
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

// Z = sum_y max(rho p(y) - q(y), 0) in double over one row (q: the draft row, or the point
// mass at x when q is nullptr), to every thread.
template <typename ProbT>
__device__ double residual_sum(const ProbT* p, const ProbT* q, long long x, double rho,
                               long long vocab, DrawScratch& s) {
    if (q != nullptr) return segment_sums(Weight<ProbT, true>{p, q, -1, rho, 1.0}, vocab, s);
    return segment_sums(Weight<ProbT, false>{p, nullptr, x, rho, 1.0}, vocab, s);
}

// The token drawn at a position that is not accepted: from max(rho p - q, 0) (q the draft
// row, or the point mass at x); from p itself when that has no mass; -1 when p has none either.
template <typename ProbT>
__device__ long long draw_residual(const ProbT* p, const ProbT* q, long long x, double rho,
                                   long long vocab, double v, DrawScratch& s) {
    long long token = q != nullptr
                          ? block_inverse_cdf(Weight<ProbT, true>{p, q, -1, rho, 1.0}, vocab, v, s)
                          : block_inverse_cdf(Weight<ProbT, false>{p, nullptr, x, rho, 1.0},
                                              vocab, v, s);
    if (token < 0) {
        token = block_inverse_cdf(Weight<ProbT, false>{p, nullptr, -1, 1.0, 1.0}, vocab, v, s);
    }
    return token;
}

// q_i(x_i) of a request (1 for a point-mass draft), negative and NaN counted as 0.
template <typename ProbT, typename IdT>
__device__ __forceinline__ double draft_probability(const RowArgs<ProbT, IdT>& a, long long i) {
    if (a.draft == nullptr) return 1.0;
    return clean_draft(static_cast<double>(a.draft[i * a.vocab + a.draft_ids[i]]));
}

template <typename ProbT, typename IdT>
__device__ __forceinline__ double target_probability(const RowArgs<ProbT, IdT>& a, long long i) {
    return static_cast<double>(a.target[i * a.vocab + a.draft_ids[i]]);
}

template <typename ProbT, typename IdT>
__device__ __forceinline__ const ProbT* draft_row(const RowArgs<ProbT, IdT>& a, long long i) {
    return a.draft != nullptr ? a.draft + i * a.vocab : nullptr;
}
}  // namespace specdec
"""

# One functor per registry entry, named by its ``cuda_row``: ``run`` is called by every thread
# of the block, which all receive the same RowResult.
_ROW_FUNCTORS = r"""
// Token-wise rejection sampling: position i passes iff u_i * q_i(x_i) < p_i(x_i) (float64),
// every position tested in parallel (vLLM counts them all); at the first failure r a token
// is drawn from max(p_r - q_r, 0), from p_r when that has no mass. Only row r is read.
struct RejectionRow {
    static constexpr bool kReadsUniforms = true;
    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        if (threadIdx.x == 0) {
            s.first_reject = a.k;
            s.passed = 0ULL;
        }
        __syncthreads();
        for (long long i = threadIdx.x; i < a.k; i += specdec::kBlock) {
            if (a.uniforms[i] * specdec::draft_probability(a, i) <
                specdec::target_probability(a, i)) {
                atomicAdd(&s.passed, 1ULL);
            } else {
                atomicMin(&s.first_reject, i);
            }
        }
        __syncthreads();
        const long long r = s.first_reject;
        specdec::RowResult result{a.bonus_id, r, static_cast<long long>(s.passed), 0};
        if (r == a.k) return result;
        result.last_token = specdec::draw_residual(
            a.target + r * a.vocab, specdec::draft_row(a, r),
            static_cast<long long>(a.draft_ids[r]), 1.0, a.vocab, a.uniforms[a.k], s.draw);
        if (result.last_token < 0) result.status = -(1 + r);
        return result;
    }
};

// Block verification (Sun et al.): rho_0 = 1, rho_i = min(1, rho_{i-1} p(x) / q(x)) in float64
// (1 when rho p >= q; 0 for good once p <= 0 or NaN); h_k = rho_k and, for i < k,
// h_i = Z_i / (Z_i + 1 - rho_i) with Z_i the weighted residual mass (0 if the denominator is
// not positive). tau is the largest i with eta_i < h_i: scanning down from k stops there, so
// no row below tau is read. Then a draw from max(rho_tau p_tau - q_tau, 0), from p_tau when
// that has no mass.
struct BlockVerificationRow {
    static constexpr bool kReadsUniforms = true;

    // rho_i, recomputed forward in one fixed order (the CPU kernel's): the scan needs it at a
    // few positions only, and a row read costs far more than these i scalars.
    template <typename ProbT, typename IdT>
    __device__ static double rho(const specdec::RowArgs<ProbT, IdT>& a, long long i) {
        double value = 1.0;
        for (long long j = 0; j < i; ++j) {
            const double p = specdec::target_probability(a, j);
            const double q = specdec::draft_probability(a, j);
            if (!(p > 0.0) || value == 0.0) {
                value = 0.0;
            } else if (value * p >= q) {
                value = 1.0;
            } else {
                value = value * p / q;
            }
        }
        return value;
    }

    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        long long tau = 0;
        for (long long i = a.k; i >= 1; --i) {  // uniform loop: every thread takes the same path
            const double rho_i = rho(a, i);
            double h = rho_i;  // h_k = rho_k; rho_i = 1 gives h_i = 1, rho_i = 0 gives 0 unread
            if (i < a.k && rho_i < 1.0 && rho_i != 0.0) {
                const double total = specdec::residual_sum(
                    a.target + i * a.vocab, specdec::draft_row(a, i),
                    static_cast<long long>(a.draft_ids[i]), rho_i, a.vocab, s.draw);
                const double denominator = total + (1.0 - rho_i);
                // NaN (a NaN target entry on the path) fails every check.
                h = denominator > 0.0 ? total / denominator : 0.0;
            }
            if (a.uniforms[i - 1] < h) {
                tau = i;
                break;
            }
        }
        specdec::RowResult result{a.bonus_id, tau, tau, 0};
        if (tau == a.k) return result;
        result.last_token = specdec::draw_residual(
            a.target + tau * a.vocab, specdec::draft_row(a, tau),
            static_cast<long long>(a.draft_ids[tau]), rho(a, tau), a.vocab, a.uniforms[a.k],
            s.draw);
        if (result.last_token < 0) result.status = -(1 + tau);
        return result;
    }
};

// The decision scan shared by the deterministic verifiers: position i passes when
// p_i(x_i) > shortcut without reading its row; otherwise one coalesced pass finds the row's
// argmax (first index on ties, NaN ignored, 0 if nothing is above -inf) and, WithEntropy,
// sum_y p ln(p + eps), and passes(p_x, x, argmax, plogp) decides. Every position is decided
// (the counters need all of them); at the first failure the argmax is emitted.
template <bool WithEntropy, typename ProbT, typename IdT, typename Passes>
__device__ specdec::RowResult decide_positions(const specdec::RowArgs<ProbT, IdT>& a,
                                               specdec::Scratch& s, double shortcut,
                                               const Passes& passes) {
    specdec::RowResult result{a.bonus_id, a.k, 0, 0};
    for (long long i = 0; i < a.k; ++i) {  // uniform loop: every thread takes the same path
        const double p_x = specdec::target_probability(a, i);
        if (p_x > shortcut) {
            ++result.num_accepted;
            continue;
        }
        double best;
        long long best_index;
        double plogp;
        specdec::row_argmax_entropy<WithEntropy>(a.target + i * a.vocab, a.vocab, best,
                                                 best_index, plogp, s.reduce);
        const long long argmax = specdec::argmax_or_zero(best, best_index);
        if (passes(p_x, static_cast<long long>(a.draft_ids[i]), argmax, plogp)) {
            ++result.num_accepted;
        } else if (result.accepted_length == a.k) {
            result.accepted_length = i;
            result.last_token = argmax;
        }
    }
    return result;
}

// Typical acceptance (Medusa): position i passes iff
// p_i(x_i) > min(threshold, alpha * exp(-H_i)), H_i = -sum_y p_i(y) ln(p_i(y) + eps) (double
// accumulation); p > threshold passes unread (the minimum never exceeds it), and a NaN
// entropy never passes. parameters = (posterior_threshold, posterior_alpha). Rows need not
// be normalised.
struct TypicalAcceptanceRow {
    static constexpr bool kReadsUniforms = false;
    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        const double posterior_threshold = a.parameters[0];
        const double posterior_alpha = a.parameters[1];
        auto passes = [&](double p_x, long long, long long, double plogp) {
            // alpha = 0 means a zero threshold even where exp(-H) overflows (0 * inf is NaN).
            double threshold = posterior_alpha > 0.0 ? posterior_alpha * exp(plogp) : 0.0;
            if (threshold > posterior_threshold) threshold = posterior_threshold;
            return p_x > threshold;
        };
        return decide_positions<true>(a, s, posterior_threshold, passes);
    }
};

// Greedy verification: position i passes iff x_i is the first index of the maximum of p_i.
// p_i(x_i) > 0.5 + kGreedyMargin passes unread: the unique argmax of a probability row (the
// input contract).
struct GreedyRow {
    static constexpr bool kReadsUniforms = false;
    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        auto passes = [](double, long long x, long long argmax, double) { return x == argmax; };
        return decide_positions<false>(a, s, 0.5 + specdec::kGreedyMargin, passes);
    }
};
"""

_SKELETON = r"""
// The one kernel of every verifier, with the arguments of specdec_np._core.verify_chains:
// target_rows [T + B, V], draft_rows [T, V] or nullptr (point-mass drafts), draft_token_ids
// [T], bonus_token_ids [B], draft_offsets [B + 1], uniforms [B, uniform_width] (read by
// stochastic rows only), parameters [P]; outputs output [B, width], accepted_lengths,
// num_accepted and row_status [B]. Request b owns drafts draft_offsets[b] .. draft_offsets[b+1]
// and the k_b + 1 target rows from draft_offsets[b] + b. Launch: grid B, block kBlock.
template <class Row, typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock, 1)
verify_chains_kernel(const ProbT* __restrict__ target_rows, const ProbT* __restrict__ draft_rows,
                     const IdT* __restrict__ draft_token_ids,
                     const IdT* __restrict__ bonus_token_ids,
                     const long long* __restrict__ draft_offsets,
                     const double* __restrict__ uniforms, long long uniform_width,
                     const double* __restrict__ parameters, long long batch, long long num_drafts,
                     long long vocab, long long width, long long* __restrict__ output,
                     long long* __restrict__ accepted_lengths,
                     long long* __restrict__ num_accepted, long long* __restrict__ row_status) {
    __shared__ specdec::Scratch scratch;
    const long long b = blockIdx.x;
    if (b >= batch) return;
    const int t = threadIdx.x;
    // The layouts write consistent offsets; clamping them only guarantees that a direct
    // caller's inconsistent ones never make a block read or write outside the arrays.
    const long long start = specdec::clamp_ll(draft_offsets[b], 0, num_drafts);
    const long long stop = specdec::clamp_ll(draft_offsets[b + 1], start, num_drafts);
    long long most = width - 1;
    if (Row::kReadsUniforms) most = specdec::min_ll(most, uniform_width - 1);
    const long long k = specdec::clamp_ll(stop - start, 0, most < 0 ? 0 : most);
    const IdT* ids = draft_token_ids + start;
    const long long bonus = static_cast<long long>(bonus_token_ids[b]);

    // Ids first: a bad one is reported by its column and never used as an index.
    if (t == 0) scratch.first_bad = specdec::kNone;
    __syncthreads();
    for (long long j = t; j <= k; j += specdec::kBlock) {
        const long long id = j < k ? static_cast<long long>(ids[j]) : bonus;
        if (id < 0 || id >= vocab) atomicMin(&scratch.first_bad, j);
    }
    __syncthreads();
    const long long bad = scratch.first_bad;
    if (bad != specdec::kNone) {
        if (t == 0) row_status[b] = 1 + bad;
        return;
    }

    const specdec::RowArgs<ProbT, IdT> args{
        target_rows + (start + b) * vocab,
        draft_rows != nullptr ? draft_rows + start * vocab : nullptr,
        ids,
        bonus,
        Row::kReadsUniforms ? uniforms + b * uniform_width : nullptr,
        parameters,
        k,
        vocab,
    };
    const specdec::RowResult result = Row::run(args, scratch);
    if (result.status == 0) {
        long long* out = output + b * width;
        const long long r = result.accepted_length;
        for (long long j = t; j < width; j += specdec::kBlock) {
            out[j] = j < r ? static_cast<long long>(ids[j]) : (j == r ? result.last_token : -1LL);
        }
    }
    if (t == 0) {
        accepted_lengths[b] = result.accepted_length;
        num_accepted[b] = result.num_accepted;
        row_status[b] = result.status;
    }
}
"""

_CREATE_OUTPUT_SOURCE = r"""
// vLLM's _create_output, with the ids checked as specdec_np._core.create_output does. Row b:
// r = the first position whose `accepted` is 0 (k if none); output[b] = the draft ids before
// r, then substitute[b, r] (r < k) or bonus[b], then -1; accepted_lengths[b] = r,
// num_accepted[b] = the non-zero entries of accepted[b] (after r too), row_status[b] = 0.
// Draft and bonus ids are all checked against [0, vocab), the substitute id where it is
// emitted; a bad one only sets row_status[b] = 1 + column (draft i < k, bonus k, substitute
// k + 1 + r). Launch: grid ceil(B / kRowsPerBlock), block kRowsPerBlock; one thread per row.
template <typename IdT>
__global__ void __launch_bounds__(specdec::kRowsPerBlock)
create_output_kernel(const unsigned char* __restrict__ accepted,
                     const IdT* __restrict__ substitute_token_ids,
                     const IdT* __restrict__ draft_token_ids,
                     const IdT* __restrict__ bonus_token_ids, long long batch, long long k,
                     long long vocab, long long* __restrict__ output,
                     long long* __restrict__ accepted_lengths,
                     long long* __restrict__ num_accepted, long long* __restrict__ row_status) {
    const long long b = (long long)blockIdx.x * specdec::kRowsPerBlock + threadIdx.x;
    if (b >= batch) return;
    const unsigned char* passed = accepted + b * k;
    const IdT* draft = draft_token_ids + b * k;
    for (long long j = 0; j <= k; ++j) {
        const long long id = j < k ? static_cast<long long>(draft[j])
                                   : static_cast<long long>(bonus_token_ids[b]);
        if (id < 0 || id >= vocab) {
            row_status[b] = 1 + j;
            return;
        }
    }
    long long r = k;
    long long count = 0;
    for (long long i = 0; i < k; ++i) {
        if (passed[i] != 0) {
            ++count;
        } else if (r == k) {
            r = i;
        }
    }
    const long long last = r < k ? static_cast<long long>(substitute_token_ids[b * k + r])
                                 : static_cast<long long>(bonus_token_ids[b]);
    if (r < k && (last < 0 || last >= vocab)) {
        row_status[b] = 1 + k + 1 + r;
        return;
    }
    long long* out = output + b * (k + 1);
    for (long long j = 0; j <= k; ++j) {
        out[j] = j < r ? static_cast<long long>(draft[j]) : (j == r ? last : -1LL);
    }
    accepted_lengths[b] = r;
    num_accepted[b] = count;
    row_status[b] = 0;
}
"""

# The tree kernel: one block per request walks its draft tree (the CPU's ``walk_tree``).
_TREE_WALK_CONSTANTS: dict[str, str] = {
    # Walk name (``specdec_np._core.TREE_WALKS``, in its order) -> the kernel's constant.
    "greedy_tree_walk": "kWalkGreedy",
    "point_mass_tree_walk": "kWalkPointMass",
    "specinfer_tree_walk": "kWalkSpecInfer",
    "rrs_tree_walk": "kWalkRrs",
}

_TREE_SOURCE = (
    "namespace specdec {\n"
    "// The walks, numbered as specdec_np._core.TREE_WALKS (the launcher passes that index).\n"
    + "".join(
        f"constexpr int {constant} = {index};\n"
        for index, constant in enumerate(_TREE_WALK_CONSTANTS.values())
    )
    + r"""
// One request of the tree layout as its block sees it: its N_b + 1 target rows (the root row,
// then one per node), its N_b draft rows (nullptr: point-mass candidates), ids, parents (an
// index within the request, -1 for the root), uniforms (column j for node j's test, column
// N_b for the final token) and its two float64 working rows of V (the residual and its
// update, ping-pong as on the CPU; nullptr for greedy walks).
template <typename ProbT, typename IdT>
struct TreeArgs {
    const ProbT* __restrict__ target;
    const ProbT* __restrict__ draft;
    const IdT* __restrict__ ids;
    const long long* __restrict__ parents;
    const double* __restrict__ uniforms;
    double* working;
    long long nodes;
    long long vocab;
};

// The first child of `node` (-1: the root) with an index above `after`, or -1. Children are
// later nodes, so a walk only moves forward and ends within N_b steps whatever the parents.
template <typename ProbT, typename IdT>
__device__ long long next_child(const TreeArgs<ProbT, IdT>& a, long long node, long long after) {
    for (long long j = after + 1; j < a.nodes; ++j) {
        if (a.parents[j] == node) return j;
    }
    return -1;
}

// Whether a sibling tried before `child` (from `first` on) proposed `token`.
template <typename ProbT, typename IdT>
__device__ bool tried_before(const TreeArgs<ProbT, IdT>& a, long long node, long long first,
                             long long child, long long token) {
    for (long long j = first; j < child; ++j) {
        if (a.parents[j] == node && static_cast<long long>(a.ids[j]) == token) return true;
    }
    return false;
}

// Block sum of a per-thread double (the reduction tree of block_argmax_and_sum).
__device__ double block_sum(double mine, ReduceScratch& r) {
    double value = -infinity();
    long long index = kNone;
    block_argmax_and_sum(value, index, mine, r);
    return mine;
}

// sum_y max(q(y), 0) (NaN counts as 0): an RRS draft row's mass before the tried siblings'
// tokens are taken out.
template <typename ProbT>
__device__ double clean_sum(const ProbT* __restrict__ q, long long vocab, ReduceScratch& r) {
    double acc = 0.0;
    for (long long y = threadIdx.x; y < vocab; y += kBlock) acc += clean_draft(q[y]);
    return block_sum(acc, r);
}

// dst = (src / src_mass - max(q, 0) / q_mass)+ elementwise, returning its double sum. Each
// element takes the CPU's operations in the CPU's order (no division by a mass of 1, NaN
// weighs 0), so every element is bit-identical to the CPU's; only the sum's order differs.
template <typename SrcT, typename QT>
__device__ double residual_update(const SrcT* __restrict__ src, double src_mass,
                                  const QT* __restrict__ q, double q_mass, long long vocab,
                                  double* __restrict__ dst, ReduceScratch& r) {
    const bool divide_src = src_mass != 1.0;
    const bool divide_q = q_mass != 1.0;
    double acc = 0.0;
    for (long long y = threadIdx.x; y < vocab; y += kBlock) {
        double a = static_cast<double>(src[y]);
        double b = static_cast<double>(q[y]);
        a = divide_src ? a / src_mass : a;
        b = b > 0.0 ? b : 0.0;
        b = divide_q ? b / q_mass : b;
        const double d = a - b;
        const double w = d > 0.0 ? d : 0.0;
        dst[y] = w;
        acc += w;
    }
    return block_sum(acc, r);
}

// Inverse-CDF draw from a row taken as it is (negative and NaN entries weigh 0), -1 if it
// has no mass.
template <typename T>
__device__ long long draw_row(const T* row, long long vocab, double v, DrawScratch& s) {
    return block_inverse_cdf(Weight<T, false>{row, nullptr, -1, 1.0, 1.0}, vocab, v, s);
}

// Greedy: the child whose token is the argmax of the node's row (first index on ties, NaN
// ignored, 0 if nothing is above -inf), or -1 with that argmax as the final token.
template <typename ProbT, typename IdT>
__device__ long long greedy_tree_step(const TreeArgs<ProbT, IdT>& a, long long node,
                                      long long& final_token, Scratch& s) {
    double best;
    long long best_index;
    double unused;
    row_argmax_entropy<false>(a.target + (node + 1) * a.vocab, a.vocab, best, best_index, unused,
                              s.reduce);
    const long long argmax = argmax_or_zero(best, best_index);
    for (long long child = next_child(a, node, node); child >= 0;
         child = next_child(a, node, child)) {
        if (static_cast<long long>(a.ids[child]) == argmax) return child;
    }
    final_token = argmax;
    return -1;
}

// Deterministic candidates: child j passes iff u_j (1 - removed) < r(x_j), r the node's row
// with the tokens of the siblings tried before removed (their mass `removed`); when every
// child fails, a draw from the row without them (copied, cleaned, to the working row).
// Returns the accepted child, or -1 with the final token (-2: no mass).
template <typename ProbT, typename IdT>
__device__ long long point_mass_tree_step(const TreeArgs<ProbT, IdT>& a, long long node,
                                          long long& final_token, Scratch& s) {
    const long long vocab = a.vocab;
    const ProbT* p = a.target + (node + 1) * vocab;
    const long long first = next_child(a, node, node);
    double removed = 0.0;
    long long last_removed = -1;
    for (long long child = first; child >= 0; child = next_child(a, node, child)) {
        const long long x = static_cast<long long>(a.ids[child]);
        const double r_x =
            tried_before(a, node, first, child, x) ? 0.0 : static_cast<double>(p[x]);
        if (a.uniforms[child] * (1.0 - removed) < r_x) return child;
        if (r_x > 0.0) {
            removed += r_x;
            last_removed = x;
        }
    }
    const double v = a.uniforms[a.nodes];
    long long token;
    if (first < 0) {
        token = draw_row(p, vocab, v, s.draw);
    } else {
        double* row = a.working;
        for (long long y = threadIdx.x; y < vocab; y += kBlock) {
            row[y] = clean_draft(static_cast<double>(p[y]));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (long long child = first; child >= 0; child = next_child(a, node, child)) {
                row[a.ids[child]] = 0.0;
            }
        }
        __syncthreads();
        token = draw_row(static_cast<const double*>(row), vocab, v, s.draw);
        // Only rounding leaves nothing: the last rejection removed the last token with mass,
        // which the exact walk would have accepted.
        if (token < 0) token = last_removed;
    }
    if (token < 0) return -2;
    final_token = token;
    return -1;
}

// SpecInfer (and, WithoutReplacement, RRS): child j passes iff u_j q_j(x_j) < r(x_j); on
// rejection r <- (r - q_j)+ renormalised, kept only if it has mass. For RRS q_j is the draft
// row with the tokens of the siblings tried before taken out and renormalised. The residual
// lives in one working row and its update goes to the other. Returns the accepted child, or
// -1 with the final token (-2: no mass). `fixed_mass` is shared memory for thread 0's result.
template <typename ProbT, typename IdT>
__device__ long long residual_tree_step(const TreeArgs<ProbT, IdT>& a, long long node,
                                        bool without_replacement, long long& final_token,
                                        Scratch& s, double& fixed_mass) {
    const long long vocab = a.vocab;
    const ProbT* p = a.target + (node + 1) * vocab;
    const long long first = next_child(a, node, node);
    // The parent's step ended on a read of its residual, which this step overwrites: no
    // thread may update a working row before every thread has read it.
    __syncthreads();
    const double* residual = nullptr;
    double mass = 1.0;
    for (long long child = first; child >= 0; child = next_child(a, node, child)) {
        const long long x = static_cast<long long>(a.ids[child]);
        const ProbT* q = a.draft + child * vocab;
        const bool reduced = without_replacement && child != first;
        double q_mass = 1.0;
        double q_x;
        if (reduced) {
            q_mass = clean_sum(q, vocab, s.reduce);
            for (long long sibling = first; sibling < child;
                 sibling = next_child(a, node, sibling)) {
                const long long t = static_cast<long long>(a.ids[sibling]);
                if (!tried_before(a, node, first, sibling, t)) {
                    q_mass -= clean_draft(static_cast<double>(q[t]));
                }
            }
            q_x = tried_before(a, node, first, child, x) ? 0.0
                                                        : clean_draft(static_cast<double>(q[x]));
            if (!(q_mass > 0.0)) {
                q_mass = 1.0;
            } else if (q_mass != 1.0) {
                q_x = q_x / q_mass;
            }
        } else {
            q_x = clean_draft(static_cast<double>(q[x]));
        }
        double r_x = residual != nullptr ? residual[x] : static_cast<double>(p[x]);
        if (mass != 1.0) r_x = r_x / mass;
        if (a.uniforms[child] * q_x < r_x) return child;
        double* update = residual != a.working ? a.working : a.working + vocab;
        double updated_mass =
            residual != nullptr
                ? residual_update(residual, mass, q, q_mass, vocab, update, s.reduce)
                : residual_update(p, 1.0, q, q_mass, vocab, update, s.reduce);
        if (reduced) {
            // The tried siblings' tokens are out of q_j: their residual is r alone. One thread
            // rewrites them, in sibling order, as the CPU does.
            if (threadIdx.x == 0) {
                for (long long sibling = first; sibling < child;
                     sibling = next_child(a, node, sibling)) {
                    const long long t = static_cast<long long>(a.ids[sibling]);
                    if (!tried_before(a, node, first, sibling, t)) {
                        double value =
                            residual != nullptr ? residual[t] : static_cast<double>(p[t]);
                        if (mass != 1.0) value = value / mass;
                        value = clean_draft(value);
                        updated_mass += value - update[t];
                        update[t] = value;
                    }
                }
                fixed_mass = updated_mass;
            }
            __syncthreads();
            updated_mass = fixed_mass;
            __syncthreads();  // fixed_mass may be written again by the next sibling
        }
        if (updated_mass > 0.0) {
            residual = update;
            mass = updated_mass;
        }
    }
    const double v = a.uniforms[a.nodes];
    const long long token =
        residual != nullptr ? draw_row(residual, vocab, v, s.draw) : draw_row(p, vocab, v, s.draw);
    if (token < 0) return -2;
    final_token = token;
    return -1;
}
}  // namespace specdec

// Tree verification with the arguments of specdec_np._core.verify_trees (probability rows):
// target_rows [N + B, V], draft_rows [N, V] or nullptr (point-mass candidates),
// draft_token_ids and tree_parents [N], node_offsets [B + 1], uniforms [B, uniform_width],
// request_methods [B] or nullptr (then every request walks `method`), working [B, 2 V] (a
// request's residual rows; nullptr when no request walks stochastically); outputs
// accepted_nodes [B, depth_width], output [B, depth_width + 1], accepted_lengths and
// row_status [B], written where and as the CPU driver writes them. Launch: grid B, block
// kBlock. Every thread of a block walks the same path (the scalar steps are repeated by each
// thread, the row passes are shared), so every __syncthreads is reached by the whole block.
template <typename ProbT, typename IdT>
__global__ void __launch_bounds__(specdec::kBlock, 1)
verify_trees_kernel(const ProbT* __restrict__ target_rows, const ProbT* __restrict__ draft_rows,
                    const IdT* __restrict__ draft_token_ids,
                    const long long* __restrict__ tree_parents,
                    const long long* __restrict__ node_offsets,
                    const double* __restrict__ uniforms, long long uniform_width,
                    const signed char* __restrict__ request_methods, long long method,
                    long long batch, long long num_nodes, long long vocab, long long depth_width,
                    double* __restrict__ working, long long* __restrict__ accepted_nodes,
                    long long* __restrict__ output, long long* __restrict__ accepted_lengths,
                    long long* __restrict__ row_status) {
    __shared__ specdec::Scratch scratch;
    __shared__ double fixed_mass;
    const long long b = blockIdx.x;
    if (b >= batch) return;
    const int t = threadIdx.x;
    long long walk = request_methods != nullptr ? static_cast<long long>(request_methods[b])
                                                : method;
    // The launcher checks the walks and passes working rows and uniforms whenever a walk is
    // stochastic; these guards only keep a direct caller's call inside the arrays.
    if (walk < specdec::kWalkGreedy || walk > specdec::kWalkRrs || working == nullptr ||
        uniforms == nullptr || uniform_width < 1) {
        walk = specdec::kWalkGreedy;
    }
    const bool stochastic = walk != specdec::kWalkGreedy;
    // The layout writes consistent offsets; clamping them (and N_b to the uniforms) only
    // guarantees that inconsistent ones never make a block leave the arrays.
    const long long start = specdec::clamp_ll(node_offsets[b], 0, num_nodes);
    const long long stop = specdec::clamp_ll(node_offsets[b + 1], start, num_nodes);
    const long long nodes =
        stochastic ? specdec::min_ll(stop - start, uniform_width - 1) : stop - start;
    const IdT* ids = draft_token_ids + start;

    // Ids first: a bad one is reported by its node and never used as an index.
    if (t == 0) scratch.first_bad = specdec::kNone;
    __syncthreads();
    for (long long j = t; j < nodes; j += specdec::kBlock) {
        const long long id = static_cast<long long>(ids[j]);
        if (id < 0 || id >= vocab) atomicMin(&scratch.first_bad, j);
    }
    __syncthreads();
    const long long bad = scratch.first_bad;
    if (bad != specdec::kNone) {
        if (t == 0) row_status[b] = 1 + bad;
        return;
    }

    const specdec::TreeArgs<ProbT, IdT> args{
        target_rows + (start + b) * vocab,
        draft_rows != nullptr ? draft_rows + start * vocab : nullptr,
        ids,
        tree_parents + start,
        stochastic ? uniforms + b * uniform_width : nullptr,
        stochastic ? working + b * 2 * vocab : nullptr,
        nodes,
        vocab,
    };
    // Without draft rows SpecInfer and RRS walk as point-mass candidates.
    const bool use_drafts =
        draft_rows != nullptr && (walk == specdec::kWalkSpecInfer || walk == specdec::kWalkRrs);
    long long* nodes_out = accepted_nodes + b * depth_width;
    long long* tokens_out = output + b * (depth_width + 1);
    long long node = -1;
    long long depth = 0;
    long long final_token = -1;
    long long status = 0;
    for (;;) {  // uniform loop: every thread takes the same path
        long long child;
        if (walk == specdec::kWalkGreedy) {
            child = specdec::greedy_tree_step(args, node, final_token, scratch);
        } else if (use_drafts) {
            child = specdec::residual_tree_step(args, node, walk == specdec::kWalkRrs,
                                                final_token, scratch, fixed_mass);
        } else {
            child = specdec::point_mass_tree_step(args, node, final_token, scratch);
        }
        if (child == -2) {
            status = -(1 + node + 1);
            break;
        }
        if (child < 0) break;
        if (depth == depth_width) {
            // The driver sizes the output by the deepest node; this bound only keeps a write
            // inside the row whatever the parents say.
            status = 1 + child;
            break;
        }
        if (t == 0) {
            nodes_out[depth] = child;
            tokens_out[depth] = static_cast<long long>(ids[child]);
        }
        ++depth;
        node = child;
    }
    if (status == 0) {
        for (long long j = depth + t; j <= depth_width; j += specdec::kBlock) {
            tokens_out[j] = j == depth ? final_token : -1LL;
            if (j < depth_width) nodes_out[j] = -1;
        }
        if (t == 0) accepted_lengths[b] = depth;
    }
    if (t == 0) row_status[b] = status;
}
"""
)


_SOURCES: dict[str, str] = {
    "create_output": _PRELUDE + _CREATE_OUTPUT_SOURCE,
    "verify_chains": _PRELUDE + _ROW_HELPERS + _ROW_FUNCTORS + _SKELETON,
    "verify_trees": _PRELUDE + _ROW_HELPERS + _TREE_SOURCE,
}


def _verify_name(cuda_row: str, prob_dtype: Any, id_dtype: Any) -> str:
    prob = _PROB_CTYPES[np.dtype(prob_dtype).name]
    return f"verify_chains_kernel<{cuda_row}, {prob}, {_ID_CTYPES[np.dtype(id_dtype).name]}>"


def _tree_name(prob_dtype: Any, id_dtype: Any) -> str:
    prob = _PROB_CTYPES[np.dtype(prob_dtype).name]
    return f"verify_trees_kernel<{prob}, {_ID_CTYPES[np.dtype(id_dtype).name]}>"


def _create_output_name(id_dtype: Any) -> str:
    return f"create_output_kernel<{_ID_CTYPES[np.dtype(id_dtype).name]}>"


def cuda_sources() -> dict[str, str]:
    """Return every CUDA source compiled by this module.

    Returns
    -------
    dict of str to str
        Source name (``"create_output"``, ``"verify_chains"``, ``"verify_trees"``) to the
        full CUDA C++ text handed to :class:`cupy.RawModule`.  Each text is self-contained (no
        ``#include``) and compiles on its own.
    """
    return dict(_SOURCES)


def instantiation_names(source: str | None = None) -> list[str]:
    """Return the kernel name expressions (template instantiations) compiled for a source.

    Parameters
    ----------
    source : str, optional
        A key of :func:`cuda_sources`. ``None`` (default) lists the names of every source.

    Returns
    -------
    list of str
        Name expressions such as ``"verify_chains_kernel<RejectionRow, float, long long>"``
        (one per registry verifier, probability and id dtype) and
        ``"verify_trees_kernel<float, int>"`` (one per probability and id dtype), exactly as
        passed to ``cupy.RawModule(name_expressions=...)`` and to ``get_function``.

    Raises
    ------
    KeyError
        If ``source`` is not a source name.
    """
    if source is not None and source not in _SOURCES:
        raise KeyError(f"unknown CUDA source {source!r}; expected one of {list(_SOURCES)}")
    names: list[str] = []
    if source in (None, "create_output"):
        names.extend(_create_output_name(id_dtype) for id_dtype in _ID_CTYPES)
    if source in (None, "verify_chains"):
        names.extend(
            _verify_name(verifier.cuda_row, prob_dtype, id_dtype)
            for verifier in registry.VERIFIERS
            for prob_dtype in _PROB_CTYPES
            for id_dtype in _ID_CTYPES
        )
    if source in (None, "verify_trees"):
        names.extend(
            _tree_name(prob_dtype, id_dtype)
            for prob_dtype in _PROB_CTYPES
            for id_dtype in _ID_CTYPES
        )
    return names


# ---------------------------------------------------------------------------------------------
# Compilation cache
# ---------------------------------------------------------------------------------------------

_MODULES: dict[tuple[int, str], Any] = {}
_MODULES_LOCK = threading.Lock()


def _kernel(source: str, name_expression: str) -> Any:
    """The compiled kernel ``name_expression`` of ``source`` on the current device; the
    source's ``RawModule`` is compiled once per device."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), source)
    module = _MODULES.get(key)
    if module is None:
        with _MODULES_LOCK:
            module = _MODULES.get(key)
            if module is None:
                module = cupy.RawModule(
                    code=_SOURCES[source],
                    options=_COMPILE_OPTIONS,
                    name_expressions=instantiation_names(source),
                )
                _MODULES[key] = module
    return module.get_function(name_expression)


# ---------------------------------------------------------------------------------------------
# Memory guards: O(1) checks of what a kernel's indexing relies on (dtypes, contiguity, shapes
# consistent with each other, one device). The values were validated by the Python layer.
# ---------------------------------------------------------------------------------------------


def _guard(array: Any, name: str, dtypes: tuple[str, ...], shape: tuple[int | None, ...]) -> None:
    """``array`` has one of ``dtypes``, is C-contiguous and has ``shape`` (None: any size)."""
    found = tuple(int(n) for n in array.shape)
    if len(found) != len(shape) or any(s is not None and s != n for s, n in zip(shape, found)):
        expected = tuple("any" if s is None else s for s in shape)
        raise ValueError(f"{name}: expected shape {expected}, found {found}")
    if np.dtype(array.dtype).name not in dtypes:
        raise TypeError(f"{name}: expected dtype in {dtypes}, found {array.dtype}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array")


_OUTPUT_NAMES = ("output", "accepted_lengths", "num_accepted", "row_status")


def _guard_outputs(batch: int, width: int | None, buffers: tuple[Any, Any, Any, Any]) -> None:
    for name, array in zip(_OUTPUT_NAMES, buffers):
        _guard(array, name, ("int64",), (batch, width) if name == "output" else (batch,))


def _launch(source: str, name: str, grid: int, block: int, arguments: dict[str, Any]) -> None:
    """Launch kernel ``name`` of ``source`` with ``arguments`` (the kernel's parameters, by
    name, in order) on the device of its arrays, after checking that they share one (O(1),
    no synchronisation; ``None`` is a null pointer)."""
    arrays = {
        key: value
        for key, value in arguments.items()
        if value is not None and not isinstance(value, np.generic)
    }
    devices = {key: array.device.id for key, array in arrays.items()}
    if len(set(devices.values())) > 1:
        found = ", ".join(f"{key} on device {device}" for key, device in devices.items())
        raise ValueError(f"expected every array on one CUDA device, found {found}")
    with next(iter(arrays.values())).device:
        _kernel(source, name)((grid,), (block,), tuple(arguments.values()))


_VERIFIER_OF_ROW: dict[int, registry.Verifier] = {}


def _verifier_of_row(method: int) -> registry.Verifier:
    """The registry entry whose CPU row function has index ``method`` (the numbering of
    ``_core.ROW_FUNCTIONS``, which ``verify_chains`` callers use on both backends)."""
    verifier = _VERIFIER_OF_ROW.get(method)
    if verifier is None:
        from . import _core

        by_row = {v.row_function: v for v in registry.VERIFIERS}
        if not 0 <= method < len(_core.ROW_FUNCTIONS):
            raise ValueError(
                f"method: expected an index into _core.ROW_FUNCTIONS "
                f"(0 .. {len(_core.ROW_FUNCTIONS) - 1}), found {method}"
            )
        verifier = by_row[_core.ROW_FUNCTIONS[method]]
        _VERIFIER_OF_ROW[method] = verifier
    return verifier


# ---------------------------------------------------------------------------------------------
# The launch surface: specdec_np._core's calling convention on CuPy arrays
# ---------------------------------------------------------------------------------------------


class _CoreLikeKernels:
    """The kernels behind the signatures of ``specdec_np/_core.pyi``, on CuPy arrays.

    The caller allocates every output; the kernels write them as ``_core``'s do, ``row_status``
    included.  ``num_threads`` is accepted and ignored.  Asynchronous: nothing here waits for
    the device, and the kernels return None (reading ``row_status`` is the caller's one
    synchronisation).
    """

    @staticmethod
    def verify_chains(
        method: int,
        target_rows: Any,
        draft_rows: Any,
        point_mass_drafts: bool,
        draft_token_ids: Any,
        bonus_token_ids: Any,
        draft_offsets: Any,
        uniforms: Any,
        parameters: Any,
        output: Any,
        accepted_lengths: Any,
        num_accepted: Any,
        row_status: Any,
        num_threads: int = 1,
    ) -> None:
        """Verify a batch of draft chains (``_core.verify_chains``'s signature and meaning).

        Launches ``verify_chains_kernel<Row, ProbT, IdT>`` for the registry verifier of
        ``method``: grid ``B``, :data:`BLOCK_SIZE` threads.  Offsets are used as given,
        clamped on the device to the arrays (and ``k_b`` to the output and uniform widths).
        """
        verifier = _verifier_of_row(method)
        batch = int(bonus_token_ids.shape[0]) if bonus_token_ids.ndim == 1 else -1
        _guard(bonus_token_ids, "bonus_token_ids", tuple(_ID_CTYPES), (batch,))
        num_drafts = int(draft_token_ids.shape[0]) if draft_token_ids.ndim == 1 else -1
        _guard(
            draft_token_ids, "draft_token_ids", (np.dtype(bonus_token_ids.dtype).name,), (None,)
        )
        _guard(target_rows, "target_rows", tuple(_PROB_CTYPES), (num_drafts + batch, None))
        vocab = int(target_rows.shape[1])
        if vocab < 1:
            raise ValueError("target_rows: expected a non-empty vocabulary, found V = 0")
        draft = None if point_mass_drafts else draft_rows
        if draft is not None:
            dtype = (np.dtype(target_rows.dtype).name,)
            _guard(draft, "draft_rows", dtype, (num_drafts, vocab))
        _guard(draft_offsets, "draft_offsets", ("int64",), (batch + 1,))
        _guard(uniforms, "uniforms", ("float64",), (batch if verifier.stochastic else None, None))
        if verifier.stochastic and int(uniforms.shape[1]) < 1:
            raise ValueError("uniforms: expected at least one column, found 0")
        _guard(parameters, "parameters", ("float64",), (None,))
        if int(parameters.shape[0]) < len(verifier.parameters):
            raise ValueError(
                f"parameters: expected {len(verifier.parameters)} for {verifier.name}, "
                f"found {int(parameters.shape[0])}"
            )
        buffers = (output, accepted_lengths, num_accepted, row_status)
        _guard_outputs(batch, None, buffers)
        width = int(output.shape[1])
        if width < 1:
            raise ValueError("output: expected at least one column, found 0")
        if batch == 0:
            return
        arguments = {
            "target_rows": target_rows,
            "draft_rows": draft,
            "draft_token_ids": draft_token_ids,
            "bonus_token_ids": bonus_token_ids,
            "draft_offsets": draft_offsets,
            "uniforms": uniforms,
            "uniform_width": np.int64(uniforms.shape[1]),
            "parameters": parameters,
            "batch": np.int64(batch),
            "num_drafts": np.int64(num_drafts),
            "vocab": np.int64(vocab),
            "width": np.int64(width),
            **dict(zip(_OUTPUT_NAMES, buffers)),
        }
        name = _verify_name(verifier.cuda_row, target_rows.dtype, draft_token_ids.dtype)
        _launch("verify_chains", name, batch, BLOCK_SIZE, arguments)

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
        """``_create_output`` into caller buffers (``_core.create_output``'s signature), ids
        checked against ``vocab_size``.  One thread per row, :data:`CREATE_OUTPUT_BLOCK`
        threads per block."""
        batch = int(accepted.shape[0]) if accepted.ndim == 2 else -1
        k = int(accepted.shape[1]) if accepted.ndim == 2 else -1
        _guard(accepted, "accepted", ("bool", "uint8"), (batch, k))
        _guard(draft_token_ids, "draft_token_ids", tuple(_ID_CTYPES), (batch, k))
        same = (np.dtype(draft_token_ids.dtype).name,)
        _guard(substitute_token_ids, "substitute_token_ids", same, (batch, k))
        _guard(bonus_token_ids, "bonus_token_ids", same, (batch,))
        buffers = (output, accepted_lengths, num_accepted, row_status)
        _guard_outputs(batch, k + 1, buffers)
        if vocab_size < 0:
            raise ValueError(f"vocab_size: expected a non-negative int, found {vocab_size}")
        if batch == 0:
            return
        arguments = {
            "accepted": accepted,
            "substitute_token_ids": substitute_token_ids,
            "draft_token_ids": draft_token_ids,
            "bonus_token_ids": bonus_token_ids,
            "batch": np.int64(batch),
            "k": np.int64(k),
            "vocab": np.int64(vocab_size),
            **dict(zip(_OUTPUT_NAMES, buffers)),
        }
        grid = (batch + CREATE_OUTPUT_BLOCK - 1) // CREATE_OUTPUT_BLOCK
        name = _create_output_name(draft_token_ids.dtype)
        _launch("create_output", name, grid, CREATE_OUTPUT_BLOCK, arguments)

    @staticmethod
    def verify_trees(
        method: int,
        target_rows: Any,
        draft_rows: Any,
        point_mass_drafts: bool,
        draft_token_ids: Any,
        tree_parents: Any,
        node_offsets: Any,
        uniforms: Any,
        accepted_nodes: Any,
        output: Any,
        accepted_lengths: Any,
        row_status: Any,
        num_threads: int = 1,
        request_methods: Any = None,
        sampling: Any = None,
        scratch: Any = None,
        working: Any = None,
    ) -> None:
        """Verify a batch of draft trees (``_core.verify_trees``'s signature and meaning) on
        probability rows.

        Launches ``verify_trees_kernel<ProbT, IdT>``: grid ``B``, :data:`BLOCK_SIZE` threads,
        one block walking each request.  ``working`` must be float64 ``[B, 2 V]`` (one pair of
        residual rows per request, not per thread) whenever a walk is stochastic.  Offsets
        are used as given, clamped on the device to the arrays (and ``N_b`` to the uniform
        width); a walk deeper than ``accepted_nodes`` reports ``1 + node`` in ``row_status``.

        Raises
        ------
        TypeError
            For logits rows (``sampling``), which the CUDA tree kernel does not read, and
            for arrays of the wrong dtype.
        ValueError
            For an unknown walk, inconsistent shapes or arrays on several devices.
        """
        if sampling is not None or scratch is not None:
            raise TypeError(
                "sampling: the CUDA tree kernel reads probability rows only; expected "
                "sampling=None (logits rows run on NumPy), found a sampling table"
            )
        walks = len(_TREE_WALK_CONSTANTS)
        if not 0 <= method < walks:
            raise ValueError(
                f"method: expected an index into _core.TREE_WALKS (0 .. {walks - 1}), "
                f"found {method}"
            )
        batch = int(node_offsets.shape[0]) - 1 if node_offsets.ndim == 1 else -1
        _guard(node_offsets, "node_offsets", ("int64",), (max(batch, 0) + 1,))
        num_nodes = int(draft_token_ids.shape[0]) if draft_token_ids.ndim == 1 else -1
        _guard(draft_token_ids, "draft_token_ids", tuple(_ID_CTYPES), (num_nodes,))
        _guard(tree_parents, "tree_parents", ("int64",), (num_nodes,))
        _guard(target_rows, "target_rows", tuple(_PROB_CTYPES), (num_nodes + batch, None))
        vocab = int(target_rows.shape[1])
        if vocab < 1:
            raise ValueError("target_rows: expected a non-empty vocabulary, found V = 0")
        draft = None if point_mass_drafts else draft_rows
        if draft is not None:
            dtype = (np.dtype(target_rows.dtype).name,)
            _guard(draft, "draft_rows", dtype, (num_nodes, vocab))
        if request_methods is not None:
            _guard(request_methods, "request_methods", ("int8",), (batch,))
        greedy = list(_TREE_WALK_CONSTANTS).index("greedy_tree_walk")
        stochastic = method != greedy or request_methods is not None
        if stochastic:
            _guard(uniforms, "uniforms", ("float64",), (batch, None))
            if int(uniforms.shape[1]) < 1:
                raise ValueError("uniforms: expected at least one column, found 0")
            if working is None:
                raise ValueError("working: expected float64 [B, 2 V] for a stochastic walk")
            _guard(working, "working", ("float64",), (batch, 2 * vocab))
        depth = int(accepted_nodes.shape[1]) if accepted_nodes.ndim == 2 else -1
        _guard(accepted_nodes, "accepted_nodes", ("int64",), (batch, depth))
        _guard(output, "output", ("int64",), (batch, depth + 1))
        _guard(accepted_lengths, "accepted_lengths", ("int64",), (batch,))
        _guard(row_status, "row_status", ("int64",), (batch,))
        if batch == 0:
            return
        arguments = {
            "target_rows": target_rows,
            "draft_rows": draft,
            "draft_token_ids": draft_token_ids,
            "tree_parents": tree_parents,
            "node_offsets": node_offsets,
            "uniforms": uniforms if stochastic else None,
            "uniform_width": np.int64(uniforms.shape[1] if stochastic else 0),
            "request_methods": request_methods,
            "method": np.int64(method),
            "batch": np.int64(batch),
            "num_nodes": np.int64(num_nodes),
            "vocab": np.int64(vocab),
            "depth_width": np.int64(depth),
            "working": working if stochastic else None,
            "accepted_nodes": accepted_nodes,
            "output": output,
            "accepted_lengths": accepted_lengths,
            "row_status": row_status,
        }
        name = _tree_name(target_rows.dtype, draft_token_ids.dtype)
        _launch("verify_trees", name, batch, BLOCK_SIZE, arguments)


#: The kernels with ``specdec_np._core``'s calling convention, so that the chain driver's
#: caller runs on CuPy arrays unchanged.
core_like = _CoreLikeKernels()
