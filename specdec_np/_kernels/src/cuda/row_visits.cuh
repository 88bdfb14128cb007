// Block reductions and row visits: how the whole block reads one row and agrees on a result.
//
// The threads of a block visit a row in coalesced 16-byte packs (visit_range) and combine
// their partial results in a reduction tree (block_argmax_and_sum): an order of the GPU's
// own, fixed, not the CPU's eight lanes. Each element's term is elementwise.h's.
#include "block.cuh"

namespace specdec {
// p ln(p + epsilon), the entropy term of elementwise.h, for either row dtype.
__device__ __forceinline__ double entropy_term(float p) { return specdec_entropy_term_f(p); }
__device__ __forceinline__ double entropy_term(double p) { return specdec_entropy_term_d(p); }

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

// Block sum of a per-thread double (the reduction tree of block_argmax_and_sum).
__device__ double block_sum(double mine, ReduceScratch& r) {
    double value = -infinity();
    long long index = kNone;
    block_argmax_and_sum(value, index, mine, r);
    return mine;
}
}  // namespace specdec
