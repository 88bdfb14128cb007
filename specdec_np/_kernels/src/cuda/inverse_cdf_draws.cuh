// The inverse-CDF draw by a whole block: from the weights max(rho p - q, 0) * scale of a
// row (the residual of a rejected position, or a row itself), in three levels.
//
// Each weight is elementwise.h's specdec_residual_weight, the CPU's to the bit; each level
// stops by elementwise.h's rule (specdec_draw_stops). The float64 sums run in the order of
// the levels (segments, chunks, elements), not the CPU's blocks, so a drawn token can
// differ from the CPU's only where v * Z lies within rounding of a CDF boundary.
#include "row_visits.cuh"

namespace specdec {
// The draw weights of a row: q from the draft row (HasQ) or a point mass at x (q = 1 there,
// 0 elsewhere; x = -1: q = 0 everywhere). scale is a power of two: 1 unless the sum
// overflows.
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
        const double q_y = HasQ ? static_cast<double>(qv) : (y == x ? 1.0 : 0.0);
        return specdec_residual_weight(static_cast<double>(pv), q_y, rho, scale);
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
//      weight times specdec_overflow_scale(), as on the CPU, so that v * Z stays finite;
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
        weight.scale = specdec_overflow_scale();
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
            }
            if (chosen < 0 && specdec_draw_stops(s.segment_sum[g], running, threshold)) {
                chosen = g;
                chosen_base = before;
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
    if (mine > 0.0) atomicMax(&s.last_thread, t);
    if (specdec_draw_stops(mine, base + inclusive, threshold)) atomicMin(&s.first_thread, t);
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
                if (specdec_draw_stops(w, running, threshold)) {
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

// Inverse-CDF draw from a row taken as it is (negative and NaN entries weigh 0), -1 if it
// has no mass.
template <typename T>
__device__ long long draw_row(const T* row, long long vocab, double v, DrawScratch& s) {
    return block_inverse_cdf(Weight<T, false>{row, nullptr, -1, 1.0, 1.0}, vocab, v, s);
}
}  // namespace specdec
