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

The engine layout's options are arguments of the same kernel, as they are of the CPU driver:
``request_methods`` (then ``Row`` is ``MixedRow``, a switch over the registry's functors on
each request's row-function index), ``causal``, ``draw_bonus`` (the lazy bonus, drawn from the
processed bonus row with uniform ``k_b + 1``, or its argmax for a greedy request) and
``sampling`` (the rows are logits). Logits rows are read through the processed law of
``specdec_np/_logits.h``, computed by the block with the CPU's operations in the CPU's order
(``row_law``: online maximum and normaliser, min-p bisection, top-k and top-p by radix
select over the keys of ``z``, never a sort); a row that is scanned whole (a residual draw,
an entropy, a lazy bonus) is materialised into the request's two scratch rows of one
per-call ``[B, 2 V]`` buffer. ``docs/semantics.md`` says where a real device can differ.

``verify_trees_kernel<ProbT, IdT>`` is the tree driver's (``_core.verify_trees``): one
block per request walks its tree from the root, reading only the rows on the walked path and
the children tested there.  Logits rows go through the chain kernel's readers (a test reads
one entry through its row's law; a row read whole is materialised into the request's
scratch pair), as the CPU tree driver reads them.  Per node the block shares the row passes
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

# --fmad=false: no multiply-add is contracted, so the float64 arithmetic of the logits law
# rounds as the CPU kernels' does (the float32 exponential uses _rn intrinsics anyway).
_COMPILE_OPTIONS = ("--std=c++17", "--fmad=false")
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

// ---- logits rows: the processed law of specdec_np/_logits.h, bit for bit ----------------
// Every operation below is the one of _logits.h, in the same order: the float32 exponential
// is written with round-to-nearest intrinsics (never contracted into a fused multiply-add,
// and the module is compiled with --fmad=false for the double arithmetic), and every float64
// sum runs in the CPU's order (eight lanes y mod 8, combined as in _rowscan.h; histogram
// buckets in element order). The one operation that is not the CPU's is the float64 `exp`
// (CUDA's instead of the host libm) in the rescaling of the online pass and in the weights of
// float64 rows: both are within an ulp, and docs/semantics.md says what that can change.
constexpr int kHistogramBits = 11;
constexpr int kBuckets = 1 << kHistogramBits;
constexpr int kLanes = 8;        // the CPU's summation lanes
constexpr int kLaneBlock = 64;   // entries per step of the online pass (8 per lane)
constexpr int kPathStack = 64;   // block verification keeps p(x_j), q(x_j) up to this k

// exp(x) in float32, the polynomial of _logits.h (specdec_fast_expf): 0 for x < -104, -inf
// and NaN; x > 88 clamped.
__device__ __forceinline__ float fast_expf(float x) {
    if (!(x >= -104.0f)) return 0.0f;
    const float clamped = x > 88.0f ? 88.0f : x;
    const float n_float =
        __fsub_rn(__fadd_rn(__fmul_rn(clamped, 0x1.715476p+0f), 0x1.8p+23f), 0x1.8p+23f);
    float r = __fsub_rn(clamped, __fmul_rn(n_float, 0x1.63p-1f));
    r = __fsub_rn(r, __fmul_rn(n_float, -0x1.bd0106p-13f));
    float q = __fadd_rn(__fmul_rn(r, 0x1.6a243ap-10f), 0x1.1239ep-7f);
    q = __fadd_rn(__fmul_rn(q, r), 0x1.5558f2p-5f);
    q = __fadd_rn(__fmul_rn(q, r), 0x1.555492p-3f);
    q = __fadd_rn(__fmul_rn(q, r), 0x1.fffffcp-2f);
    const float mantissa = __fadd_rn(1.0f, __fadd_rn(r, __fmul_rn(__fmul_rn(r, r), q)));
    const int n = static_cast<int>(n_float);
    const int n_low = n >> 1;  // 2^n as two exact powers of two: a subnormal rounds once
    const int n_high = n - n_low;
    return __fmul_rn(__fmul_rn(mantissa, __int_as_float((n_low + 127) << 23)),
                     __int_as_float((n_high + 127) << 23));
}

// Keys: a monotone integer image of z (-0 and +0 share one, NaN is 0, below -inf), its
// inverse, and the weight w = exp(z - m) of each row dtype.
template <typename T>
struct LawTraits;
template <>
struct LawTraits<float> {
    using Key = unsigned int;
    static constexpr int kKeyBits = 32;
    __device__ static float infinity() { return __int_as_float(0x7f800000); }
    __device__ static Key key(float z) {
        if (z != z) return 0u;
        const unsigned int bits = __float_as_uint(z + 0.0f);
        return bits ^ ((bits >> 31) ? 0xffffffffu : 0x80000000u);
    }
    __device__ static float value(Key key) {
        return __uint_as_float((key & 0x80000000u) ? key ^ 0x80000000u : ~key);
    }
    __device__ static double weight(float z, float z_max) {
        return static_cast<double>(fast_expf(__fsub_rn(z, z_max)));
    }
};
template <>
struct LawTraits<double> {
    using Key = unsigned long long;
    static constexpr int kKeyBits = 64;
    __device__ static double infinity() { return __longlong_as_double(0x7ff0000000000000LL); }
    __device__ static Key key(double z) {
        if (z != z) return 0ULL;
        const Key bits = static_cast<Key>(__double_as_longlong(z + 0.0));
        return bits ^ ((bits >> 63) ? 0xffffffffffffffffULL : 0x8000000000000000ULL);
    }
    __device__ static double value(Key key) {
        const Key bits = (key & 0x8000000000000000ULL) ? key ^ 0x8000000000000000ULL : ~key;
        return __longlong_as_double(static_cast<long long>(bits));
    }
    __device__ static double weight(double z, double z_max) {
        const double x = z - z_max;
        return x == x ? exp(x) : 0.0;
    }
};

// The law of one row (specdec_row_law): kept set {y : z(y) >= cutoff}; status 1: no mass.
struct Law {
    double z_max;
    double cutoff;
    double normaliser;
    long long num_infinite;
    long long status;
};

// Shared memory of one block: the draw levels, the argmax/sum reduction and the law's
// histogram never overlap in time, so they share storage.
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
struct LawScratch {
    double histogram[kBuckets];
};
struct Scratch {
    union {
        ReduceScratch reduce;
        DrawScratch draw;
        LawScratch law;
    };
    long long first_bad;
    long long first_reject;
    unsigned long long passed;
    // The online pass and the kept sum: one float64 sum (and maximum) per lane.
    double lane_sum[kLanes];
    double lane_best[kLanes];
    long long lane_infinite[kLanes];
    // The radix select's state, broadcast by thread 0 after each histogram.
    unsigned long long select_prefix;
    double select_above;
    double select_need;
    int select_failed;
    // The law of the last target and draft row read (the CPU driver caches them alike).
    Law target_law;
    Law draft_law;
    long long target_law_row;
    long long draft_law_row;
    double path_p[kPathStack];
    double path_q[kPathStack];
};

// One request as a row functor sees it: its k + 1 target rows (row stride vocab), its k draft
// rows (nullptr for point-mass drafts), its k draft ids (checked against vocab), its bonus
// id, its uniforms (k + 1, or k + 2 with a lazy bonus; nullptr when nothing is drawn) and
// the parameters; its row-function index (a per-request method, -1 without), whether
// counting stops at the first rejection, and for logits rows its sampling parameters
// (temperature, top-k, top-p, min-p; nullptr for probability rows) and its two scratch rows
// of vocab entries (the processed target and draft row being read).
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
    int method;
    bool causal;
    const double* sampling;
    ProbT* scratch;  // written and read by this block: deliberately not __restrict__
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

// ---- the processed law of a logits row, computed by the whole block --------------------

__device__ __forceinline__ double rescale(double sum, double old_max, double new_max) {
    return new_max > old_max && old_max > -infinity() ? sum * exp(old_max - new_max) : sum;
}

__device__ __forceinline__ double combine_lanes(const double* l) {
    return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// The maximum z, the count of +inf entries and sum_y exp(z - m) in the CPU's online order:
// lane l (thread l) takes the entries y = l mod 8, 64 entries a step; every thread receives
// the results.
template <typename T>
__device__ void online_pass(const T* row, long long vocab, T temperature, Scratch& s,
                            T& z_max, double& normaliser, long long& num_infinite) {
    using Traits = LawTraits<T>;
    const int t = threadIdx.x;
    if (t < kLanes) {
        T best = -Traits::infinity();
        double sum = 0.0;
        long long infinite = 0;
        for (long long start = 0; start < vocab; start += kLaneBlock) {
            T z[kLaneBlock / kLanes];
            T block_best = best;
            for (int j = 0; j < kLaneBlock / kLanes; ++j) {
                const long long y = start + (long long)kLanes * j + t;
                z[j] = y < vocab ? row[y] / temperature : -Traits::infinity();
                block_best = z[j] > block_best ? z[j] : block_best;
                infinite += z[j] == Traits::infinity();
            }
            sum = rescale(sum, static_cast<double>(best), static_cast<double>(block_best));
            best = block_best;
            for (int j = 0; j < kLaneBlock / kLanes; ++j) sum += Traits::weight(z[j], best);
        }
        s.lane_sum[t] = sum;
        s.lane_best[t] = static_cast<double>(best);
        s.lane_infinite[t] = infinite;
    }
    __syncthreads();
    T result = -Traits::infinity();
    for (int l = 0; l < kLanes; ++l) {
        const T lane_best = static_cast<T>(s.lane_best[l]);
        result = lane_best > result ? lane_best : result;
    }
    double lanes[kLanes];
    num_infinite = 0;
    for (int l = 0; l < kLanes; ++l) {
        lanes[l] = rescale(s.lane_sum[l], s.lane_best[l], static_cast<double>(result));
        num_infinite += s.lane_infinite[l];
    }
    z_max = result;
    normaliser = combine_lanes(lanes);
    __syncthreads();  // the lanes may be reused as soon as this returns
}

// sum of w over {z >= cutoff}, lane y mod 8 in element order (the CPU's kept sum).
template <typename T>
__device__ double kept_sum(const T* row, long long vocab, T temperature, T z_max, T cutoff,
                           Scratch& s) {
    const int t = threadIdx.x;
    if (t < kLanes) {
        double sum = 0.0;
        for (long long y = t; y < vocab; y += kLanes) {
            const T z = row[y] / temperature;
            if (z >= cutoff) sum += LawTraits<T>::weight(z, z_max);
        }
        s.lane_sum[t] = sum;
    }
    __syncthreads();
    const double total = combine_lanes(s.lane_sum);
    __syncthreads();
    return total;
}

// Radix select over the keys of z (specdec_select): the largest key v such that the entries
// with key >= v (and >= floor_key) reach `need`, counting each entry as 1 or (by_mass) as
// its w, need then being top_p times the total; 0 when every entry falls short. A counting
// histogram holds integers, exact in any order, so the whole block fills it; a mass
// histogram is summed by thread 0 in element order, the CPU's order. Thread 0 walks the
// buckets from the top.
template <typename T>
__device__ typename LawTraits<T>::Key select_key(const T* row, long long vocab, T temperature,
                                                 T z_max, typename LawTraits<T>::Key floor_key,
                                                 bool by_mass, double need, Scratch& s) {
    using Traits = LawTraits<T>;
    using Key = typename Traits::Key;
    const int t = threadIdx.x;
    double* histogram = s.law.histogram;
    Key prefix = 0;
    double above = 0.0;
    int known_bits = 0;
    while (known_bits < Traits::kKeyBits) {
        const int left = Traits::kKeyBits - known_bits;
        const int width = left < kHistogramBits ? left : kHistogramBits;
        const int shift = Traits::kKeyBits - known_bits - width;
        const int buckets = 1 << width;
        for (int bucket = t; bucket < buckets; bucket += kBlock) histogram[bucket] = 0.0;
        __syncthreads();
        if (!by_mass || t == 0) {
            const long long first = by_mass ? 0 : t;
            const long long step = by_mass ? 1 : kBlock;
            for (long long y = first; y < vocab; y += step) {
                const T z = row[y] / temperature;
                const Key key = Traits::key(z);
                if (key < floor_key) continue;
                if (known_bits > 0 && (key >> (shift + width)) != (prefix >> (shift + width)))
                    continue;
                const Key mask = static_cast<Key>(buckets - 1);
                const int bucket = static_cast<int>((key >> shift) & mask);
                if (by_mass) {
                    histogram[bucket] += Traits::weight(z, z_max);
                } else {
                    atomicAdd(&histogram[bucket], 1.0);
                }
            }
        }
        __syncthreads();
        if (t == 0) {
            if (known_bits == 0 && by_mass) {
                double total = 0.0;
                for (int bucket = buckets - 1; bucket >= 0; --bucket) total += histogram[bucket];
                need *= total;
            }
            int chosen = -1;
            int lowest_filled = -1;
            for (int bucket = buckets - 1; bucket >= 0; --bucket) {
                if (histogram[bucket] > 0.0) lowest_filled = bucket;
                if (histogram[bucket] > 0.0 && above + histogram[bucket] >= need) {
                    chosen = bucket;
                    break;
                }
                above += histogram[bucket];
            }
            int failed = 0;
            if (chosen < 0) {
                // The sub-buckets of a chosen bucket sum, in another grouping, to a hair less
                // than it did: its lowest value is then the one that reaches need.
                if (known_bits == 0 || lowest_filled < 0) failed = 1;
                chosen = lowest_filled;
            }
            s.select_failed = failed;
            s.select_prefix = static_cast<unsigned long long>(
                failed ? Key(0) : (prefix | (static_cast<Key>(chosen) << shift)));
            s.select_above = above;
            s.select_need = need;
        }
        __syncthreads();
        if (s.select_failed) return Key(0);  // the same value in every thread
        prefix = static_cast<Key>(s.select_prefix);
        above = s.select_above;
        need = s.select_need;
        known_bits += width;
    }
    return prefix;
}

// The law of one logits row (specdec_row_law), to every thread. Not inlined: every row
// reader calls it, and one copy per dtype keeps the module's compile time down.
template <typename T>
__device__ __noinline__ Law row_law(const T* row, long long vocab, T temperature, long long top_k,
                       double top_p, double min_p, Scratch& s) {
    using Traits = LawTraits<T>;
    using Key = typename Traits::Key;
    T z_max;
    double normaliser;
    long long num_infinite;
    online_pass(row, vocab, temperature, s, z_max, normaliser, num_infinite);
    Law law{static_cast<double>(z_max), 0.0, 0.0, num_infinite, 0};
    if (num_infinite > 0) {
        law.cutoff = infinity();
        law.normaliser = static_cast<double>(num_infinite);
        return law;
    }
    if (!(z_max > -Traits::infinity())) {
        law.status = 1;
        law.cutoff = infinity();
        return law;
    }
    Key floor_key = 1;  // NaN (key 0) is never kept
    if (min_p > 0.0) {
        // w is monotone in z: bisection over the keys, in every thread alike.
        Key low = Traits::key(-Traits::infinity());
        Key high = Traits::key(z_max);
        while (high - low > 1) {
            const Key middle = low + (high - low) / 2;
            if (Traits::weight(Traits::value(middle), z_max) >= min_p) {
                high = middle;
            } else {
                low = middle;
            }
        }
        floor_key = high;
    }
    if (top_k > 0 && top_k < vocab) {
        const Key k_key = select_key(row, vocab, temperature, z_max, Key(1), false,
                                     static_cast<double>(top_k), s);
        floor_key = k_key > floor_key ? k_key : floor_key;
    }
    if (top_p < 1.0) {
        // The CPU selects over the gathered survivors of min-p and top-k when they are few;
        // skipping the others in element order sums the same entries in the same order.
        const Key p_key = select_key(row, vocab, temperature, z_max, floor_key, true, top_p, s);
        floor_key = p_key > floor_key ? p_key : floor_key;
    }
    if (floor_key <= 1) {
        law.cutoff = -infinity();
        law.normaliser = normaliser;
        return law;
    }
    const T cutoff = Traits::value(floor_key);
    law.cutoff = static_cast<double>(cutoff);
    law.normaliser = kept_sum(row, vocab, temperature, z_max, cutoff, s);
    return law;
}

// p(y) in float64 from the one logit row[y] (specdec_law_probability); 0 without mass.
template <typename T>
__device__ __forceinline__ double law_probability(const T* row, long long y, T temperature,
                                                  const Law& law) {
    const T z = row[y] / temperature;
    if (law.status != 0) return 0.0;
    if (law.num_infinite > 0) return z == LawTraits<T>::infinity() ? 1.0 / law.normaliser : 0.0;
    if (!(static_cast<double>(z) >= law.cutoff)) return 0.0;
    return LawTraits<T>::weight(z, static_cast<T>(law.z_max)) / law.normaliser;
}

// p(y) as the CPU materialises it, in the row's dtype (specdec_law_materialise).
template <typename T>
__device__ __forceinline__ T materialised(const T* row, long long y, T temperature,
                                          const Law& law) {
    if (law.status != 0 || law.num_infinite > 0) {
        return static_cast<T>(law_probability(row, y, temperature, law));
    }
    const T z = row[y] / temperature;
    return z >= static_cast<T>(law.cutoff)
               ? static_cast<T>(LawTraits<T>::weight(z, static_cast<T>(law.z_max)) /
                                law.normaliser)
               : T(0);
}

// ---- row readers: probabilities as they are, logits through their row's law -------------

// The law of row i of the request's target (or draft) rows, computed once per row read in a
// row (the cache of the CPU driver). Block-wide: every thread must call it.
template <typename ProbT, typename IdT>
__device__ Law cached_law(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i, bool draft) {
    const long long cached = draft ? s.draft_law_row : s.target_law_row;
    if (cached != i) {
        const ProbT* rows = draft ? a.draft : a.target;
        const Law law = row_law(rows + i * a.vocab, a.vocab, static_cast<ProbT>(a.sampling[0]),
                                static_cast<long long>(a.sampling[1]), a.sampling[2],
                                a.sampling[3], s);
        __syncthreads();  // every thread has read the cached row index
        if (threadIdx.x == 0) {
            if (draft) {
                s.draft_law = law;
                s.draft_law_row = i;
            } else {
                s.target_law = law;
                s.target_law_row = i;
            }
        }
        __syncthreads();
        return law;
    }
    return draft ? s.draft_law : s.target_law;
}

// p_i(y) or q_i(y) in float64 (block-wide with logits).
template <typename ProbT, typename IdT>
__device__ double read_probability(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i,
                                   long long y, bool draft) {
    const ProbT* rows = draft ? a.draft : a.target;
    if (a.sampling == nullptr) return static_cast<double>(rows[i * a.vocab + y]);
    const Law law = cached_law(a, s, i, draft);
    return law_probability(rows + i * a.vocab, y, static_cast<ProbT>(a.sampling[0]), law);
}

template <typename ProbT, typename IdT>
__device__ double target_p(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i) {
    return read_probability(a, s, i, static_cast<long long>(a.draft_ids[i]), false);
}

// q_i(x_i): 1 for a point-mass draft; negative and NaN count as 0.
template <typename ProbT, typename IdT>
__device__ double draft_p(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i) {
    if (a.draft == nullptr) return 1.0;
    return clean_draft(read_probability(a, s, i, static_cast<long long>(a.draft_ids[i]), true));
}

// Row i as probabilities: the row itself, or its processed law written to the request's
// scratch row (nullptr stays nullptr: a point-mass draft). Block-wide with logits.
template <typename ProbT, typename IdT>
__device__ const ProbT* processed_row(const RowArgs<ProbT, IdT>& a, Scratch& s, long long i,
                                      bool draft) {
    const ProbT* rows = draft ? a.draft : a.target;
    if (rows == nullptr) return rows;
    if (a.sampling == nullptr) return rows + i * a.vocab;
    const Law law = cached_law(a, s, i, draft);
    const ProbT temperature = static_cast<ProbT>(a.sampling[0]);
    const ProbT* row = rows + i * a.vocab;
    ProbT* out = a.scratch + (draft ? a.vocab : 0);
    __syncthreads();  // every earlier reader of this scratch row is done
    for (long long y = threadIdx.x; y < a.vocab; y += kBlock) {
        out[y] = materialised(row, y, temperature, law);
    }
    __syncthreads();
    return out;
}

// Block-wide, at the start of a request: forgets the row laws cached for the block's previous
// request and returns the first position j < count whose id ids[j] lies outside [0, vocab)
// (with check_last, position count holds `last`, a chain's bonus id), or kNone. A bad id is
// reported by its position and never used as an index.
template <typename IdT>
__device__ long long start_request(const IdT* __restrict__ ids, long long count, long long last,
                                   bool check_last, long long vocab, Scratch& s) {
    if (threadIdx.x == 0) {
        s.first_bad = kNone;
        s.target_law_row = -1;
        s.draft_law_row = -1;
    }
    __syncthreads();
    const long long positions = check_last ? count + 1 : count;
    for (long long j = threadIdx.x; j < positions; j += kBlock) {
        const long long id = j < count ? static_cast<long long>(ids[j]) : last;
        if (id < 0 || id >= vocab) atomicMin(&s.first_bad, j);
    }
    __syncthreads();
    return s.first_bad;
}
}  // namespace specdec
"""

# One functor per registry entry, named by its ``cuda_row``: ``run`` is called by every thread
# of the block, which all receive the same RowResult.
_ROW_FUNCTORS = r"""
// Token-wise rejection sampling: position i passes iff u_i * q_i(x_i) < p_i(x_i) (float64).
// Probability rows: every position is tested in parallel (vLLM counts them all; causal
// counting keeps the prefix). Logits rows: positions in order, each reading its row's law,
// stopping at the first failure when causal. At the first failure r a token is drawn from
// max(p_r - q_r, 0), from p_r when that has no mass. Only row r is read for the draw.
struct RejectionRow {
    __device__ static bool reads_uniforms(int) { return true; }
    __device__ static bool bonus_by_argmax(int) { return false; }
    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        long long r = a.k;
        long long passed = 0;
        if (a.sampling == nullptr) {
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
            r = s.first_reject;
            passed = a.causal ? r : static_cast<long long>(s.passed);
        } else {
            for (long long i = 0; i < a.k; ++i) {  // uniform loop: the same path in every thread
                const double p_x = specdec::target_p(a, s, i);
                const double q_x = specdec::draft_p(a, s, i);
                if (a.uniforms[i] * q_x < p_x) {
                    ++passed;
                } else if (r == a.k) {
                    r = i;
                    if (a.causal) break;
                }
            }
        }
        specdec::RowResult result{a.bonus_id, r, passed, 0};
        if (r == a.k) return result;
        const ProbT* p = specdec::processed_row(a, s, r, false);
        const ProbT* q = specdec::processed_row(a, s, r, true);
        result.last_token = specdec::draw_residual(p, q, static_cast<long long>(a.draft_ids[r]),
                                                   1.0, a.vocab, a.uniforms[a.k], s.draw);
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
    __device__ static bool reads_uniforms(int) { return true; }
    __device__ static bool bonus_by_argmax(int) { return false; }

    __device__ static double next_rho(double value, double p, double q) {
        if (!(p > 0.0) || value == 0.0) return 0.0;
        if (value * p >= q) return 1.0;
        return value * p / q;
    }

    // rho_i, recomputed forward in one fixed order (the CPU kernel's): the scan needs it at a
    // few positions only, and a row read costs far more than these i scalars. With logits
    // p(x_j) and q(x_j) come from s.path when the chain is short enough to keep them (each
    // costs a pass over its row), else from the rows again.
    template <typename ProbT, typename IdT>
    __device__ static double rho(const specdec::RowArgs<ProbT, IdT>& a, specdec::Scratch& s,
                                 long long i, bool from_path) {
        double value = 1.0;
        for (long long j = 0; j < i; ++j) {
            if (from_path) {
                value = next_rho(value, s.path_p[j], s.path_q[j]);
            } else if (a.sampling == nullptr) {
                value = next_rho(value, specdec::target_probability(a, j),
                                 specdec::draft_probability(a, j));
            } else {
                const double p = specdec::target_p(a, s, j);
                value = next_rho(value, p, specdec::draft_p(a, s, j));
            }
        }
        return value;
    }

    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        const bool from_path = a.sampling != nullptr && a.k <= specdec::kPathStack;
        if (from_path) {
            for (long long j = 0; j < a.k; ++j) {
                const double p = specdec::target_p(a, s, j);
                const double q = specdec::draft_p(a, s, j);
                if (threadIdx.x == 0) {
                    s.path_p[j] = p;
                    s.path_q[j] = q;
                }
            }
            __syncthreads();
        }
        long long tau = 0;
        for (long long i = a.k; i >= 1; --i) {  // uniform loop: every thread takes the same path
            const double rho_i = rho(a, s, i, from_path);
            double h = rho_i;  // h_k = rho_k; rho_i = 1 gives h_i = 1, rho_i = 0 gives 0 unread
            if (i < a.k && rho_i < 1.0 && rho_i != 0.0) {
                const ProbT* p = specdec::processed_row(a, s, i, false);
                const ProbT* q = specdec::processed_row(a, s, i, true);
                const double total = specdec::residual_sum(
                    p, q, static_cast<long long>(a.draft_ids[i]), rho_i, a.vocab, s.draw);
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
        const double rho_tau = rho(a, s, tau, from_path);
        const ProbT* p = specdec::processed_row(a, s, tau, false);
        const ProbT* q = specdec::processed_row(a, s, tau, true);
        result.last_token = specdec::draw_residual(
            p, q, static_cast<long long>(a.draft_ids[tau]), rho_tau, a.vocab, a.uniforms[a.k],
            s.draw);
        if (result.last_token < 0) result.status = -(1 + tau);
        return result;
    }
};

// The decision scan shared by the deterministic verifiers: position i passes when
// p_i(x_i) > shortcut without reading its row; otherwise one coalesced pass finds the row's
// argmax (first index on ties, NaN ignored, 0 if nothing is above -inf) and, WithEntropy,
// sum_y p ln(p + eps), and passes(p_x, x, argmax, plogp) decides. Raw: the rows are read as
// they are (greedy: the argmax of logits is the argmax at any temperature); otherwise
// through the law of a logits row. Every position is decided (the counters need all of
// them) unless counting is causal; at the first failure the argmax is emitted.
template <bool WithEntropy, bool Raw, typename ProbT, typename IdT, typename Passes>
__device__ specdec::RowResult decide_positions(const specdec::RowArgs<ProbT, IdT>& a,
                                               specdec::Scratch& s, double shortcut,
                                               const Passes& passes) {
    specdec::RowResult result{a.bonus_id, a.k, 0, 0};
    for (long long i = 0; i < a.k; ++i) {  // uniform loop: every thread takes the same path
        const double p_x = Raw ? specdec::target_probability(a, i) : specdec::target_p(a, s, i);
        if (p_x > shortcut) {
            ++result.num_accepted;
            continue;
        }
        double best;
        long long best_index;
        double plogp;
        const ProbT* row = Raw ? a.target + i * a.vocab : specdec::processed_row(a, s, i, false);
        specdec::row_argmax_entropy<WithEntropy>(row, a.vocab, best, best_index, plogp,
                                                 s.reduce);
        const long long argmax = specdec::argmax_or_zero(best, best_index);
        if (passes(p_x, static_cast<long long>(a.draft_ids[i]), argmax, plogp)) {
            ++result.num_accepted;
        } else if (result.accepted_length == a.k) {
            result.accepted_length = i;
            result.last_token = argmax;
            if (a.causal) break;
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
    __device__ static bool reads_uniforms(int) { return false; }
    __device__ static bool bonus_by_argmax(int) { return false; }
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
        return decide_positions<true, false>(a, s, posterior_threshold, passes);
    }
};

// Greedy verification: position i passes iff x_i is the first index of the maximum of its
// raw row. For probability rows p_i(x_i) > 0.5 + kGreedyMargin passes unread (the unique
// argmax of a probability row, the input contract); logits rows have no such shortcut.
struct GreedyRow {
    __device__ static bool reads_uniforms(int) { return false; }
    __device__ static bool bonus_by_argmax(int) { return true; }
    template <typename ProbT, typename IdT>
    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,
                                             specdec::Scratch& s) {
        auto passes = [](double, long long x, long long argmax, double) { return x == argmax; };
        const double shortcut =
            a.sampling == nullptr ? 0.5 + specdec::kGreedyMargin : specdec::infinity();
        return decide_positions<false, true>(a, s, shortcut, passes);
    }
};
"""

_SKELETON = r"""
// The one kernel of every verifier, with the arguments of specdec_np._core.verify_chains:
// target_rows [T + B, V], draft_rows [T, V] or nullptr (point-mass drafts), draft_token_ids
// [T], bonus_token_ids [B], draft_offsets [B + 1], uniforms [B, uniform_width] (read by
// stochastic rows and lazy bonuses only), parameters [P]; outputs output [B, width],
// accepted_lengths, num_accepted and row_status [B]; then the engine layout's options:
// request_methods [B] (row-function indices, read by MixedRow; nullptr otherwise), causal
// (stop at the first rejection), draw_bonus (a fully accepted request draws its bonus from
// its bonus row with uniform k_b + 1, its argmax for a greedy request; bonus ids unread),
// sampling [B, 4] (the rows are logits: temperature, top-k, top-p, min-p; nullptr for
// probabilities) and scratch [B, 2 V] (two processed rows per request; with sampling only).
// Request b owns drafts draft_offsets[b] .. draft_offsets[b+1] and the k_b + 1 target rows
// from draft_offsets[b] + b. Launch: grid B, block kBlock.
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
                     long long* __restrict__ num_accepted, long long* __restrict__ row_status,
                     const signed char* __restrict__ request_methods, long long causal,
                     long long draw_bonus, const double* __restrict__ sampling,
                     ProbT* scratch) {
    __shared__ specdec::Scratch scratch_space;
    specdec::Scratch& shared = scratch_space;
    const long long b = blockIdx.x;
    if (b >= batch) return;
    const int t = threadIdx.x;
    const int method = request_methods != nullptr ? static_cast<int>(request_methods[b]) : -1;
    const bool lazy_bonus = draw_bonus != 0;
    const bool reads_uniforms = Row::reads_uniforms(method) || lazy_bonus;
    // The layouts write consistent offsets; clamping them only guarantees that a direct
    // caller's inconsistent ones never make a block read or write outside the arrays.
    const long long start = specdec::clamp_ll(draft_offsets[b], 0, num_drafts);
    const long long stop = specdec::clamp_ll(draft_offsets[b + 1], start, num_drafts);
    long long most = width - 1;
    if (reads_uniforms) most = specdec::min_ll(most, uniform_width - 1 - (lazy_bonus ? 1 : 0));
    const long long k = specdec::clamp_ll(stop - start, 0, most < 0 ? 0 : most);
    const IdT* ids = draft_token_ids + start;
    // A lazy bonus is drawn, not read: its id is neither checked nor used.
    const long long bonus = lazy_bonus ? 0 : static_cast<long long>(bonus_token_ids[b]);

    // Ids first (column k_b is the bonus id).
    const long long bad = specdec::start_request(ids, k, bonus, true, vocab, shared);
    if (bad != specdec::kNone) {
        if (t == 0) row_status[b] = 1 + bad;
        return;
    }

    const specdec::RowArgs<ProbT, IdT> args{
        target_rows + (start + b) * vocab,
        draft_rows != nullptr ? draft_rows + start * vocab : nullptr,
        ids,
        bonus,
        reads_uniforms ? uniforms + b * uniform_width : nullptr,
        parameters,
        k,
        vocab,
        method,
        causal != 0,
        sampling != nullptr ? sampling + 4 * b : nullptr,
        sampling != nullptr ? scratch + b * 2 * vocab : nullptr,
    };
    specdec::RowResult result = Row::run(args, shared);
    if (lazy_bonus && result.status == 0 && result.accepted_length == k) {
        // The bonus row is read only now that every draft was accepted (uniform branch).
        if (Row::bonus_by_argmax(method)) {
            double best;
            long long best_index;
            double unused;
            specdec::row_argmax_entropy<false>(args.target + k * vocab, vocab, best,
                                               best_index, unused, shared.reduce);
            result.last_token = specdec::argmax_or_zero(best, best_index);
        } else {
            const ProbT* p = specdec::processed_row(args, shared, k, false);
            result.last_token = specdec::block_inverse_cdf(
                specdec::Weight<ProbT, false>{p, nullptr, -1, 1.0, 1.0}, vocab,
                args.uniforms[k + 1], shared.draw);
            if (result.last_token < 0) result.status = -(1 + k);
        }
    }
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
    "greedy_tree_step": "kWalkGreedy",
    "point_mass_tree_step": "kWalkPointMass",
    "specinfer_tree_step": "kWalkSpecInfer",
    "rrs_tree_step": "kWalkRrs",
}

_TREE_SOURCE = (
    "namespace specdec {\n"
    "// The walks, numbered as specdec_np._core.TREE_WALKS (the launcher passes that index).\n"
    + "".join(
        f"constexpr int {constant} = {index};\n"
        for index, constant in enumerate(_TREE_WALK_CONSTANTS.values())
    )
    + r"""
// One request of the tree layout as its block sees it: the fields of a chain request (its
// N_b + 1 target rows: the root row, then one per node; its N_b draft rows, nullptr for
// point-mass candidates; its ids; k = N_b; its uniforms, column j for node j's test and
// column N_b for the final token; for logits rows its sampling parameters and two scratch
// rows), so that the chain's row readers read its rows; then its parents (an index within
// the request, -1 for the root) and its two float64 working rows of V (the residual and its
// update, ping-pong as on the CPU; nullptr for greedy walks).
template <typename ProbT, typename IdT>
struct TreeArgs : RowArgs<ProbT, IdT> {
    const long long* __restrict__ parents;
    double* working;
};

// The first child of `node` (-1: the root) with an index above `after`, or -1. Children are
// later nodes, so a walk only moves forward and ends within N_b steps whatever the parents.
template <typename ProbT, typename IdT>
__device__ long long next_child(const TreeArgs<ProbT, IdT>& a, long long node, long long after) {
    for (long long j = after + 1; j < a.k; ++j) {
        if (a.parents[j] == node) return j;
    }
    return -1;
}

// Whether a sibling tried before `child` (from `first` on) proposed `token`.
template <typename ProbT, typename IdT>
__device__ bool tried_before(const TreeArgs<ProbT, IdT>& a, long long node, long long first,
                             long long child, long long token) {
    for (long long j = first; j < child; ++j) {
        if (a.parents[j] == node && static_cast<long long>(a.draft_ids[j]) == token) return true;
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
        if (static_cast<long long>(a.draft_ids[child]) == argmax) return child;
    }
    final_token = argmax;
    return -1;
}

// Deterministic candidates: child j passes iff u_j (1 - removed) < r(x_j), r the node's row
// with the tokens of the siblings tried before removed (their mass `removed`); when every
// child fails, a draw from the row without them (copied, cleaned, to the working row).
// As on the CPU, a logits row is read through its law for the tests and materialised for
// the draw. Returns the accepted child, or -1 with the final token (-2: no mass).
template <typename ProbT, typename IdT>
__device__ long long point_mass_tree_step(const TreeArgs<ProbT, IdT>& a, long long node,
                                          long long& final_token, Scratch& s) {
    const long long vocab = a.vocab;
    const long long first = next_child(a, node, node);
    double removed = 0.0;
    long long last_removed = -1;
    for (long long child = first; child >= 0; child = next_child(a, node, child)) {
        const long long x = static_cast<long long>(a.draft_ids[child]);
        const double r_x = tried_before(a, node, first, child, x)
                               ? 0.0
                               : read_probability(a, s, node + 1, x, false);
        if (a.uniforms[child] * (1.0 - removed) < r_x) return child;
        if (r_x > 0.0) {
            removed += r_x;
            last_removed = x;
        }
    }
    const ProbT* p = processed_row(a, s, node + 1, false);
    const double v = a.uniforms[a.k];
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
                row[a.draft_ids[child]] = 0.0;
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
// lives in one working row and its update goes to the other. As on the CPU, a logits row is
// read through its law for a test and materialised (p once, q_j per child) where a whole row
// is read. Returns the accepted child, or -1 with the final token (-2: no mass).
// `fixed_mass` is shared memory for thread 0's result.
template <typename ProbT, typename IdT>
__device__ long long residual_tree_step(const TreeArgs<ProbT, IdT>& a, long long node,
                                        bool without_replacement, long long& final_token,
                                        Scratch& s, double& fixed_mass) {
    const long long vocab = a.vocab;
    const ProbT* p = nullptr;
    const long long first = next_child(a, node, node);
    // The parent's step ended on a read of its residual, which this step overwrites: no
    // thread may update a working row before every thread has read it.
    __syncthreads();
    const double* residual = nullptr;
    double mass = 1.0;
    for (long long child = first; child >= 0; child = next_child(a, node, child)) {
        const long long x = static_cast<long long>(a.draft_ids[child]);
        const ProbT* q = nullptr;
        const bool reduced = without_replacement && child != first;
        double q_mass = 1.0;
        double q_x;
        if (reduced) {
            q = processed_row(a, s, child, true);
            q_mass = clean_sum(q, vocab, s.reduce);
            for (long long sibling = first; sibling < child;
                 sibling = next_child(a, node, sibling)) {
                const long long t = static_cast<long long>(a.draft_ids[sibling]);
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
            q_x = draft_p(a, s, child);
        }
        double r_x =
            residual != nullptr ? residual[x] : read_probability(a, s, node + 1, x, false);
        if (mass != 1.0) r_x = r_x / mass;
        if (a.uniforms[child] * q_x < r_x) return child;
        if (q == nullptr) q = processed_row(a, s, child, true);
        if (residual == nullptr && p == nullptr) p = processed_row(a, s, node + 1, false);
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
                    const long long t = static_cast<long long>(a.draft_ids[sibling]);
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
    const double v = a.uniforms[a.k];
    if (residual == nullptr && p == nullptr) p = processed_row(a, s, node + 1, false);
    const long long token =
        residual != nullptr ? draw_row(residual, vocab, v, s.draw) : draw_row(p, vocab, v, s.draw);
    if (token < 0) return -2;
    final_token = token;
    return -1;
}
}  // namespace specdec

// Tree verification with the arguments of specdec_np._core.verify_trees:
// target_rows [N + B, V], draft_rows [N, V] or nullptr (point-mass candidates),
// draft_token_ids and tree_parents [N], node_offsets [B + 1], uniforms [B, uniform_width],
// request_methods [B] or nullptr (then every request walks `method`), working [B, 2 V] (a
// request's residual rows; nullptr when no request walks stochastically); outputs
// accepted_nodes [B, depth_width], output [B, depth_width + 1], accepted_lengths and
// row_status [B], written where and as the CPU driver writes them; then sampling [B, 4]
// (the rows are logits: temperature, top-k, top-p, min-p; nullptr for probabilities) and
// scratch [B, 2 V] (a request's processed target and draft row; with sampling only).
// Launch: grid B, block kBlock. Every thread of a block walks the same path (the scalar steps
// are repeated by each thread, the row passes are shared), so every __syncthreads is reached
// by the whole block.
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
                    long long* __restrict__ row_status, const double* __restrict__ sampling,
                    ProbT* scratch) {
    __shared__ specdec::Scratch shared;
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

    // Ids first (by node).
    const long long bad = specdec::start_request(ids, nodes, 0, false, vocab, shared);
    if (bad != specdec::kNone) {
        if (t == 0) row_status[b] = 1 + bad;
        return;
    }

    const specdec::TreeArgs<ProbT, IdT> args{
        {
            target_rows + (start + b) * vocab,
            draft_rows != nullptr ? draft_rows + start * vocab : nullptr,
            ids,
            0,  // a tree has no bonus id
            stochastic ? uniforms + b * uniform_width : nullptr,
            nullptr,  // nor verifier parameters
            nodes,
            vocab,
            -1,
            false,
            sampling != nullptr ? sampling + 4 * b : nullptr,
            sampling != nullptr ? scratch + b * 2 * vocab : nullptr,
        },
        tree_parents + start,
        stochastic ? working + b * 2 * vocab : nullptr,
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
            child = specdec::greedy_tree_step(args, node, final_token, shared);
        } else if (use_drafts) {
            child = specdec::residual_tree_step(args, node, walk == specdec::kWalkRrs,
                                                final_token, shared, fixed_mass);
        } else {
            child = specdec::point_mass_tree_step(args, node, final_token, shared);
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


#: The row functor of a batch with per-request methods (``request_methods``).
MIXED_ROW = "MixedRow"


def _mixed_row() -> str:
    """``MixedRow``: the registry's row functors behind one switch on the request's
    row-function index (the numbering of ``_core.ROW_FUNCTIONS``, which the callers of
    ``verify_chains`` use on both backends), so mixed greedy and sampled requests share one
    launch.  Indices outside it (the caller validates them) take the last case."""
    cases = [(verifier.code, verifier.cuda_row) for verifier in registry.VERIFIERS]

    def switch(subject: str, call: str) -> str:
        lines = [f"        switch ({subject}) {{"]
        for number, (code, row) in enumerate(cases):
            label = "default:\n        " if number == len(cases) - 1 else ""
            lines.append(f"        {label}case {code}:\n            return {row}::{call};")
        lines.append("        }")
        return "\n".join(lines)

    return (
        "\n// One request's row functor chosen by its row-function index (a per-request method).\n"
        f"struct {MIXED_ROW} {{\n"
        "    __device__ static bool reads_uniforms(int method) {\n"
        f"{switch('method', 'reads_uniforms(method)')}\n"
        "    }\n"
        "    __device__ static bool bonus_by_argmax(int method) {\n"
        f"{switch('method', 'bonus_by_argmax(method)')}\n"
        "    }\n"
        "    template <typename ProbT, typename IdT>\n"
        "    __device__ static specdec::RowResult run(const specdec::RowArgs<ProbT, IdT>& a,\n"
        "                                             specdec::Scratch& s) {\n"
        f"{switch('a.method', 'run(a, s)')}\n"
        "    }\n"
        "};\n"
    )


_SOURCE_CACHE: dict[str, str] = {}


def _sources() -> dict[str, str]:
    """The CUDA sources by name, built once (``MixedRow`` needs the CPU row numbering)."""
    if not _SOURCE_CACHE:
        _SOURCE_CACHE["create_output"] = _PRELUDE + _CREATE_OUTPUT_SOURCE
        _SOURCE_CACHE["verify_chains"] = (
            _PRELUDE + _ROW_HELPERS + _ROW_FUNCTORS + _mixed_row() + _SKELETON
        )
        _SOURCE_CACHE["verify_trees"] = _PRELUDE + _ROW_HELPERS + _TREE_SOURCE
    return _SOURCE_CACHE


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
    return dict(_sources())


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
    if source is not None and source not in _sources():
        raise KeyError(f"unknown CUDA source {source!r}; expected one of {list(_sources())}")
    names: list[str] = []
    if source in (None, "create_output"):
        names.extend(_create_output_name(id_dtype) for id_dtype in _ID_CTYPES)
    if source in (None, "verify_chains"):
        rows = [verifier.cuda_row for verifier in registry.VERIFIERS] + [MIXED_ROW]
        names.extend(
            _verify_name(row, prob_dtype, id_dtype)
            for row in rows
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
                    code=_sources()[source],
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


def _guard_sampling(batch: int, vocab: int, dtype: Any, sampling: Any, scratch: Any) -> None:
    """With logits rows, ``sampling`` is float64 ``[B, 4]`` and ``scratch`` the rows' dtype
    ``[B, 2 V]`` (a request's processed target and draft row)."""
    if sampling is None:
        return
    _guard(sampling, "sampling", ("float64",), (batch, 4))
    if scratch is None:
        raise ValueError("scratch: expected a [B, 2 V] array with sampling, found None")
    _guard(scratch, "scratch", (np.dtype(dtype).name,), (batch, 2 * vocab))


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
        if not 0 <= method < len(registry.VERIFIERS):
            raise ValueError(
                f"method: expected an index into _core.ROW_FUNCTIONS "
                f"(0 .. {len(registry.VERIFIERS) - 1}), found {method}"
            )
        verifier = registry.VERIFIERS[method]
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
        request_methods: Any = None,
        causal: bool = False,
        draw_bonus: bool = False,
        sampling: Any = None,
        scratch: Any = None,
    ) -> None:
        """Verify a batch of draft chains (``_core.verify_chains``'s signature and meaning).

        Launches ``verify_chains_kernel<Row, ProbT, IdT>`` for the registry verifier of
        ``method`` (``MixedRow`` when ``request_methods`` is given): grid ``B``,
        :data:`BLOCK_SIZE` threads.  Offsets are used as given, clamped on the device to the
        arrays (and ``k_b`` to the output and uniform widths).  The engine options are
        ``_core.verify_chains``'s, except that ``scratch`` is float ``[B, 2 V]`` (one pair of
        processed rows per request, not per thread) and that the values of
        ``request_methods`` are trusted (the engine layout writes them).
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
        if request_methods is not None:
            _guard(request_methods, "request_methods", ("int8",), (batch,))
        draws = verifier.stochastic or draw_bonus or request_methods is not None
        _guard(uniforms, "uniforms", ("float64",), (batch if draws else None, None))
        least = int(verifier.stochastic or request_methods is not None) + int(bool(draw_bonus))
        if draws and int(uniforms.shape[1]) < least:
            raise ValueError(
                f"uniforms: expected at least {least} column(s), found {int(uniforms.shape[1])}"
            )
        _guard(parameters, "parameters", ("float64",), (None,))
        if int(parameters.shape[0]) < len(verifier.parameters):
            raise ValueError(
                f"parameters: expected {len(verifier.parameters)} for {verifier.name}, "
                f"found {int(parameters.shape[0])}"
            )
        _guard_sampling(batch, vocab, target_rows.dtype, sampling, scratch)
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
            "request_methods": request_methods,
            "causal": np.int64(bool(causal)),
            "draw_bonus": np.int64(bool(draw_bonus)),
            "sampling": sampling,
            "scratch": scratch if sampling is not None else None,
        }
        row = MIXED_ROW if request_methods is not None else verifier.cuda_row
        name = _verify_name(row, target_rows.dtype, draft_token_ids.dtype)
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
        """Verify a batch of draft trees (``_core.verify_trees``'s signature and meaning).

        Launches ``verify_trees_kernel<ProbT, IdT>``: grid ``B``, :data:`BLOCK_SIZE` threads,
        one block walking each request.  ``working`` must be float64 ``[B, 2 V]`` (one pair of
        residual rows per request, not per thread) whenever a walk is stochastic, and with
        ``sampling`` (logits rows) ``scratch`` must be ``[B, 2 V]`` in the rows' dtype (one
        processed target and draft row per request).  Offsets are used as given, clamped on
        the device to the arrays (and ``N_b`` to the uniform width); a walk deeper than
        ``accepted_nodes`` reports ``1 + node`` in ``row_status``.

        Raises
        ------
        TypeError
            For arrays of the wrong dtype.
        ValueError
            For an unknown walk, inconsistent shapes or arrays on several devices.
        """
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
        greedy = list(_TREE_WALK_CONSTANTS).index("greedy_tree_step")
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
        _guard_sampling(batch, vocab, target_rows.dtype, sampling, scratch)
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
            "sampling": sampling,
            "scratch": scratch if sampling is not None else None,
        }
        name = _tree_name(target_rows.dtype, draft_token_ids.dtype)
        _launch("verify_trees", name, batch, BLOCK_SIZE, arguments)


#: The kernels with ``specdec_np._core``'s calling convention, so that the chain driver's
#: caller runs on CuPy arrays unchanged.
core_like = _CoreLikeKernels()
