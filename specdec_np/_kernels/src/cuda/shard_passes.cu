// shard_passes: a rank's passes over its slice of columns in verification across vocabulary
// shards when the rows are device arrays (specdec_np._sharded, docs/semantics.md
// "Verification across vocabulary shards"): the device twins of
// specdec_np/_kernels/src/cpu/shardscan.h, with its meanings and its orders.
//
// A rank holds the columns start .. start + width - 1 of each row; these kernels read the
// rows where they lie and hand back per-row numbers (maxima, argmaxes, masses, counts,
// columns), which the protocol exchanges.  The weights are the CUDA law's (LawTraits of
// logits_law.cuh: elementwise.h's exponential) and their sum runs on the law's eight lanes
// y mod 8, combined as the law combines them, so that with one rank the kept sums are the
// unsharded device call's.  Maxima, argmaxes and counts are selections or integers, exact
// in any order, so the whole block reduces them; the draws' float64 sums keep the CPU
// passes' orders (NumPy's pairwise order for a mass, column order for the scan), one thread
// per row, so that a device rank sends the bits a CPU rank sends.
#include "generated/contract.cuh"
#include "elementwise.h"
#include "logits_law.cuh"

namespace specdec {
// Storage of one block's reductions (the passes below never run two at once).
struct ShardScratch {
    double value[kBlock];
    long long index[kBlock];
};

// The largest of each thread's `mine` (NaN never wins: a NaN never passes `>`), to every
// thread.
__device__ double shard_block_max(double mine, ShardScratch& s) {
    const int t = threadIdx.x;
    s.value[t] = mine;
    __syncthreads();
    if (t == 0) {
        double best = s.value[0];
        for (int other = 1; other < kBlock; ++other) {
            best = s.value[other] > best ? s.value[other] : best;
        }
        s.value[0] = best;
    }
    __syncthreads();
    const double result = s.value[0];
    __syncthreads();  // the storage may be reused as soon as this returns
    return result;
}

// The sum of each thread's `mine` (integers: exact in any order), to every thread.
__device__ long long shard_block_count(long long mine, ShardScratch& s) {
    const int t = threadIdx.x;
    s.index[t] = mine;
    __syncthreads();
    if (t == 0) {
        long long total = 0;
        for (int other = 0; other < kBlock; ++other) total += s.index[other];
        s.index[0] = total;
    }
    __syncthreads();
    const long long result = s.index[0];
    __syncthreads();
    return result;
}

__device__ __forceinline__ double shard_positive(double x) { return x > 0.0 ? x : 0.0; }

// NumPy's pairwise sum of a float64 row's positive parts (shardscan.h's
// specdec_shard_pairwise_sum): blocks of at most 128 on eight accumulators, halves at
// multiples of 8 above; walked with an explicit stack (no recursion on the device).
__device__ double shard_pairwise_leaf(const double* a, long long n) {
    if (n < 8) {
        double sum = 0.0;
        for (long long i = 0; i < n; ++i) sum += shard_positive(a[i]);
        return sum;
    }
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = shard_positive(a[j]);
    long long i = 8;
    for (; i < n - (n % 8); i += 8) {
        for (int j = 0; j < 8; ++j) r[j] += shard_positive(a[i + j]);
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += shard_positive(a[i]);
    return sum;
}

constexpr int kPairwiseDepth = 64;  // halving a long long count ends well before this

__device__ double shard_pairwise_sum(const double* a, long long n) {
    long long first[kPairwiseDepth], size[kPairwiseDepth];
    double left[kPairwiseDepth];
    int stage[kPairwiseDepth];  // 0: not split yet, 1: left half running, 2: right half
    int depth = 0;
    first[0] = 0;
    size[0] = n;
    stage[0] = 0;
    for (;;) {
        if (size[depth] > 128) {  // split: the left half first
            long long half = size[depth] / 2;
            half -= half % 8;
            stage[depth] = 1;
            first[depth + 1] = first[depth];
            size[depth + 1] = half;
            stage[depth + 1] = 0;
            ++depth;
            continue;
        }
        double value = shard_pairwise_leaf(a + first[depth], size[depth]);
        // Hand the finished value up: a left half starts its right half, a right half
        // completes its parent.
        for (;;) {
            if (depth == 0) return value;
            --depth;
            if (stage[depth] == 1) {
                long long half = size[depth] / 2;
                half -= half % 8;
                left[depth] = value;
                stage[depth] = 2;
                first[depth + 1] = first[depth] + half;
                size[depth + 1] = size[depth] - half;
                stage[depth + 1] = 0;
                ++depth;
                break;
            }
            value = left[depth] + value;
        }
    }
}
}  // namespace specdec

// rows [count, width], temperature [count]: stats [count, 3] (the largest z = l / t, NaN
// never; its count of +inf z; the largest finite logit), and with groups > 0 (2 groups <=
// width) group_max [count, groups]: the largest logit of columns g, g + groups, ... over
// the whole sets only (-inf for a set of NaN alone). Launch: grid count, block kBlock.
template <typename T>
__global__ void __launch_bounds__(specdec::kBlock, 1)
shard_stats_kernel(const T* __restrict__ rows, long long count, long long width,
                   const T* __restrict__ temperature, long long groups,
                   double* __restrict__ stats, T* __restrict__ group_max) {
    using Traits = specdec::LawTraits<T>;
    __shared__ specdec::ShardScratch shared;
    const long long i = blockIdx.x;
    if (i >= count) return;
    const int t = threadIdx.x;
    const T* row = rows + i * width;
    const T infinity = Traits::infinity();
    T best = -infinity;
    for (long long y = t; y < width; y += specdec::kBlock) {
        best = row[y] > best ? row[y] : best;
    }
    const T top = static_cast<T>(specdec::shard_block_max(static_cast<double>(best), shared));
    T largest_finite = top;
    if (top == infinity) {
        T finite = -infinity;
        for (long long y = t; y < width; y += specdec::kBlock) {
            if (row[y] > finite && row[y] < infinity) finite = row[y];
        }
        largest_finite =
            static_cast<T>(specdec::shard_block_max(static_cast<double>(finite), shared));
    }
    const T z_max = top / temperature[i];
    long long infinite = 0;
    if (z_max == infinity) {
        for (long long y = t; y < width; y += specdec::kBlock) {
            infinite += row[y] / temperature[i] == infinity;
        }
        infinite = specdec::shard_block_count(infinite, shared);
    }
    if (groups > 0) {
        const long long whole = (width / groups) * groups;  // columns past it join no set
        for (long long g = t; g < groups; g += specdec::kBlock) {
            T largest = -infinity;
            for (long long y = g; y < whole; y += groups) {
                largest = row[y] > largest ? row[y] : largest;
            }
            group_max[i * groups + g] = largest;
        }
    }
    if (t == 0) {
        stats[3 * i] = static_cast<double>(z_max);
        stats[3 * i + 1] = static_cast<double>(infinite);
        stats[3 * i + 2] = static_cast<double>(largest_finite);
    }
}

// rows [count, width]: table [count, 2] = (largest value, start + the first column holding
// it), NaN never the largest; -inf and column start for a row with nothing above -inf (the
// CPU's specdec_row_argmax). Launch: grid count, block kBlock.
template <typename T>
__global__ void __launch_bounds__(specdec::kBlock, 1)
shard_argmax_kernel(const T* __restrict__ rows, long long count, long long width,
                    long long start, double* __restrict__ table) {
    __shared__ specdec::ShardScratch shared;
    const long long i = blockIdx.x;
    if (i >= count) return;
    const int t = threadIdx.x;
    const T* row = rows + i * width;
    T best = -specdec::LawTraits<T>::infinity();
    long long first = width;
    for (long long y = t; y < width; y += specdec::kBlock) {
        if (row[y] > best) {
            best = row[y];
            first = y;
        }
    }
    const double top = specdec::shard_block_max(static_cast<double>(best), shared);
    shared.index[t] = static_cast<double>(best) == top ? first : width;
    __syncthreads();
    if (t == 0) {
        long long lowest = width;
        for (int other = 0; other < specdec::kBlock; ++other) {
            lowest = shared.index[other] < lowest ? shared.index[other] : lowest;
        }
        if (!(top > -specdec::infinity())) lowest = 0;
        table[2 * i] = top;
        table[2 * i + 1] = static_cast<double>(start + lowest);
    }
}

// Rows indices[i] of rows [*, width]: weights[i] = w = exp(z - z_max[i]) over z = l /
// temperature[i] >= cutoff[i] (0 elsewhere, NaN never; the law's weight, stored in T), and
// masses[i] their sum on the law's eight lanes y mod 8 (logits_law.cuh's kept_sum).
// Launch: grid count, block kBlock.
template <typename T>
__global__ void __launch_bounds__(specdec::kBlock, 1)
shard_weights_kernel(const T* __restrict__ rows, long long width,
                     const long long* __restrict__ indices, long long count,
                     const T* __restrict__ temperature, const T* __restrict__ z_max,
                     const T* __restrict__ cutoff, T* __restrict__ weights,
                     double* __restrict__ masses) {
    __shared__ double lanes[specdec::kLanes];
    const long long i = blockIdx.x;
    if (i >= count) return;
    const int t = threadIdx.x;
    const T* row = rows + indices[i] * width;
    T* out = weights + i * width;
    for (long long y = t; y < width; y += specdec::kBlock) {
        const T z = row[y] / temperature[i];
        out[y] = z >= cutoff[i] ? static_cast<T>(specdec::LawTraits<T>::weight(z, z_max[i]))
                                : static_cast<T>(0);
    }
    __syncthreads();  // the block's stores are read back by the lanes below
    // A stored float32 weight is the law's weight exactly (a float32 exponential), so the
    // lanes add what kept_sum adds; an entry left out adds +0, which changes no sum.
    if (t < specdec::kLanes) {
        double sum = 0.0;
        for (long long y = t; y < width; y += specdec::kLanes) {
            sum += static_cast<double>(out[y]);
        }
        lanes[t] = sum;
    }
    __syncthreads();
    if (t == 0) masses[i] = SPECDEC_COMBINE_LANES(lanes);
}

// Rows indices[i]: the entries whose z = l / temperature[i] reaches thresholds[i] (NaN
// never; none for a NaN threshold). With columns null their count to counts[i]; else
// their columns and z written, column by column, from offsets[i] on. Launch: grid count,
// block kBlock; thread t scans one run of consecutive columns, so that a scan of the
// runs' counts places every entry in column order.
template <typename T>
__global__ void __launch_bounds__(specdec::kBlock, 1)
shard_at_least_kernel(const T* __restrict__ rows, long long width,
                      const long long* __restrict__ indices, long long count,
                      const T* __restrict__ temperature, const T* __restrict__ thresholds,
                      const long long* __restrict__ offsets, long long* __restrict__ counts,
                      long long* __restrict__ columns, T* __restrict__ values) {
    __shared__ specdec::ShardScratch shared;
    const long long i = blockIdx.x;
    if (i >= count) return;
    const int t = threadIdx.x;
    const T* row = rows + indices[i] * width;
    const T divisor = temperature[i], threshold = thresholds[i];
    const long long run = (width + specdec::kBlock - 1) / specdec::kBlock;
    const long long first = specdec::min_ll(t * run, width);
    const long long end = specdec::min_ll(first + run, width);
    long long found = 0;
    for (long long y = first; y < end; ++y) found += row[y] / divisor >= threshold;
    shared.index[t] = found;
    __syncthreads();
    if (t == 0) {
        long long total = 0;
        for (int other = 0; other < specdec::kBlock; ++other) {
            const long long mine = shared.index[other];
            shared.index[other] = total;  // the runs before it: where it writes
            total += mine;
        }
        if (columns == nullptr) counts[i] = total;
    }
    __syncthreads();
    if (columns == nullptr) return;
    long long at = offsets[i] + shared.index[t];
    for (long long y = first; y < end; ++y) {
        const T z = row[y] / divisor;
        if (z >= threshold) {
            columns[at] = y;
            values[at] = z;
            ++at;
        }
    }
}

// out = w = exp(x - z_max) of single entries by the law's rule (0 for NaN). Launch: grid
// (count + kBlock - 1) / kBlock, block kBlock.
template <typename T>
__global__ void shard_exp_kernel(const T* __restrict__ x, const T* __restrict__ z_max,
                                 long long count, T* __restrict__ out) {
    const long long i = static_cast<long long>(blockIdx.x) * specdec::kBlock + threadIdx.x;
    if (i < count) out[i] = static_cast<T>(specdec::LawTraits<T>::weight(x[i], z_max[i]));
}

// out[out_rows[i]] = p = weights[indices[i]] / divisors[i] rounded to T as the kernels
// store a probability, held in float64. Launch: grid count, block kBlock.
template <typename T>
__global__ void shard_divided_kernel(const T* __restrict__ weights, long long width,
                                     const long long* __restrict__ indices, long long count,
                                     const double* __restrict__ divisors,
                                     double* __restrict__ out,
                                     const long long* __restrict__ out_rows) {
    const long long i = blockIdx.x;
    if (i >= count) return;
    const T* row = weights + indices[i] * width;
    double* destination = out + out_rows[i] * width;
    for (long long y = threadIdx.x; y < width; y += specdec::kBlock) {
        const T p = static_cast<T>(static_cast<double>(row[y]) / divisors[i]);
        destination[y] = static_cast<double>(p);
    }
}

// In place, row indices[i] of rows [*, width] becomes max(scale[i] row - q[i], 0) (NaN
// stays NaN; q [count, width]). Launch: grid count, block kBlock.
__global__ void shard_residuals_kernel(double* __restrict__ rows, long long width,
                                       const long long* __restrict__ indices, long long count,
                                       const double* __restrict__ scale,
                                       const double* __restrict__ q) {
    const long long i = blockIdx.x;
    if (i >= count) return;
    double* row = rows + indices[i] * width;
    const double* subtract = q + i * width;
    for (long long y = threadIdx.x; y < width; y += specdec::kBlock) {
        const double x = scale[i] * row[y] - subtract[y];
        row[y] = x >= 0.0 || x != x ? x : 0.0;
    }
}

// sums[i]: the positive entries of row i of rows [count, width] summed in NumPy's pairwise
// order, from 0. Launch: grid (count + kWarp - 1) / kWarp, block kWarp (a thread a row).
__global__ void shard_positive_sums_kernel(const double* __restrict__ rows, long long count,
                                           long long width, double* __restrict__ sums) {
    const long long i = static_cast<long long>(blockIdx.x) * specdec::kWarp + threadIdx.x;
    if (i < count) sums[i] = 0.0 + specdec::shard_pairwise_sum(rows + i * width, width);
}

// found[i]: the column of the first positive entry of row indices[i] whose running sum (in
// column order, from 0) exceeds inside[i]; else its last positive entry; else its last
// column. Launch: grid (count + kWarp - 1) / kWarp, block kWarp (a thread a row).
__global__ void shard_first_crossings_kernel(const double* __restrict__ rows, long long width,
                                             const long long* __restrict__ indices,
                                             long long count, const double* __restrict__ inside,
                                             long long* __restrict__ found) {
    const long long i = static_cast<long long>(blockIdx.x) * specdec::kWarp + threadIdx.x;
    if (i >= count) return;
    const double* row = rows + indices[i] * width;
    double running = 0.0;
    long long last = width - 1;
    bool any = false;
    for (long long y = 0; y < width; ++y) {
        const double x = specdec::shard_positive(row[y]);
        running += x;
        if (x > 0.0) {
            if (running > inside[i]) {
                found[i] = y;
                return;
            }
            last = y;
            any = true;
        }
    }
    found[i] = any ? last : width - 1;
}
