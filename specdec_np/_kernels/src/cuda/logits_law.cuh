// The processed law of a logits row (temperature, min-p, top-k, top-p, in vLLM's order or in
// llama.cpp's), computed by the whole block: specdec_row_law of specdec_np/_kernels/src/cpu/logits_law.h, bit
// for bit.
//
// Every per-element formula is elementwise.h's (the exponential, the keys of z, the weight
// w, an entry's probability and stored value, the min-p bisection, the radix select's
// buckets and walk), and every float64 sum runs in the CPU's order: the kept sum (the
// normaliser, over every entry when no filter drops one) on eight lanes y mod 8 (one thread
// each), combined as on the CPU; a mass histogram by one thread in element order. The
// maximum and the counting histograms are exact in any order, so the whole block may fill
// them. The one operation that is not the CPU's is the float64 exp (CUDA's, not the host
// libm) in the weights of float64 rows: within an ulp, and docs/semantics.md says what that
// can change.
//
// With top-k on, a long row's law starts from top-k's survivors (gather_survivors: block
// maxima, their k-th largest as a bound, the entries at or above it gathered in element
// order into shared memory) and every later pass reads them alone, in the same order and
// with the same bits as over the row; otherwise, and where they do not fit, the row.
#include "block.cuh"

namespace specdec {
// The law's functions of elementwise.h for each row dtype (suffix f: float, d: double).
template <typename T>
struct LawTraits;
#define SPECDEC_LAW_TRAITS(T, SUFFIX, KEY_T, KEY_BITS, INFINITY_T)                          \
    template <>                                                                            \
    struct LawTraits<T> {                                                                  \
        using Key = KEY_T;                                                                 \
        static constexpr int kKeyBits = KEY_BITS;                                          \
        __device__ static T infinity() { return INFINITY_T; }                              \
        __device__ static Key key(T z) { return specdec_key_##SUFFIX(z); }                 \
        __device__ static T value(Key key) { return specdec_value_##SUFFIX(key); }         \
        __device__ static double weight(T z, T z_max) {                                    \
            return specdec_weight_##SUFFIX(z, z_max);                                      \
        }                                                                                  \
        __device__ static void max_step(T z, T* best, int64_t* num_infinite) {             \
            specdec_max_step_##SUFFIX(z, best, num_infinite);                              \
        }                                                                                  \
        __device__ static Key min_p_floor(T z_max, double min_p) {                         \
            return specdec_min_p_floor_##SUFFIX(z_max, min_p);                             \
        }                                                                                  \
        __device__ static int bucket(Key key, Key floor_key, Key prefix, int known_bits,   \
                                     int shift, int width) {                               \
            return specdec_select_bucket_##SUFFIX(key, floor_key, prefix, known_bits, shift, \
                                                  width);                                  \
        }                                                                                  \
        __device__ static double probability(T z, const specdec_row_law& law) {            \
            return specdec_entry_probability_##SUFFIX(z, &law);                            \
        }                                                                                  \
        __device__ static T stored(T z, const specdec_row_law& law) {                      \
            return specdec_entry_materialised_##SUFFIX(z, &law);                           \
        }                                                                                  \
    };
SPECDEC_LAW_TRAITS(float, f, uint32_t, 32, SPECDEC_INFINITY_F)
SPECDEC_LAW_TRAITS(double, d, uint64_t, 64, SPECDEC_INFINITY_D)
#undef SPECDEC_LAW_TRAITS

// The entries a law reads: a whole row (RowEntries) or top-k's survivors gathered from it
// (SurvivorEntries, in element order), each at a temperature (RowEntries also reads the
// blocks' maxima, held as doubles): z(i) is the z of the i-th entry, position(i) its index in the row, and lane(l, f) calls f(i) for the entries of
// the CPU's summation lane l (index mod 8) in element order. Every pass below visits an
// entry as the row's pass visits it; an entry it skips (below a floor or a cutoff, or
// not the largest) is one that the survivors may leave out.
template <typename T, typename Stored = T>
struct RowEntries {
    const Stored* row;
    T temperature;
    long long count;
    __device__ T z(long long i) const { return static_cast<T>(row[i]) / temperature; }
    __device__ long long position(long long i) const { return i; }
    template <typename F>
    __device__ void lane(int l, F f) const {
        for (long long y = l; y < count; y += kLanes) f(y);
    }
};
template <typename T>
struct SurvivorEntries {
    const SurvivorList* list;
    T temperature;
    long long count;
    __device__ T z(long long i) const { return static_cast<T>(list->logit[i]) / temperature; }
    __device__ long long position(long long i) const { return list->position[i]; }
    template <typename F>
    __device__ void lane(int l, F f) const {
        for (long long i = 0; i < count; ++i) {
            if (list->position[i] % kLanes == l) f(i);
        }
    }
};

// The maximum z and the count of +inf entries (the CPU's first pass; a maximum is a
// selection and the count an integer, so the lanes' grouping changes neither): lane l
// (thread l) takes the entries y = l mod 8; every thread receives the results. Over
// survivors that hold every entry at or above some z of the row, a lane holding the
// maximum finds the same first one of it, and the others lose to it as before.
template <typename T, typename Entries>
__device__ void max_pass(const Entries& entries, Scratch& s, T& z_max, long long& num_infinite) {
    using Traits = LawTraits<T>;
    const int t = threadIdx.x;
    if (t < kLanes) {
        T best = -Traits::infinity();
        int64_t infinite = 0;
        entries.lane(t, [&](long long i) { Traits::max_step(entries.z(i), &best, &infinite); });
        s.lane_best[t] = static_cast<double>(best);
        s.lane_infinite[t] = infinite;
    }
    __syncthreads();
    T best = -Traits::infinity();
    num_infinite = 0;
    for (int l = 0; l < kLanes; ++l) {
        const T lane_best = static_cast<T>(s.lane_best[l]);
        best = lane_best > best ? lane_best : best;
        num_infinite += s.lane_infinite[l];
    }
    z_max = best;
    __syncthreads();  // the lanes may be reused as soon as this returns
}

// sum of w over {z >= cutoff}, lane y mod 8 in element order (the CPU's kept sum).
template <typename T, typename Entries>
__device__ double kept_sum(const Entries& entries, T z_max, T cutoff, Scratch& s) {
    const int t = threadIdx.x;
    if (t < kLanes) {
        double sum = 0.0;
        entries.lane(t, [&](long long i) {
            const T z = entries.z(i);
            if (z >= cutoff) sum += LawTraits<T>::weight(z, z_max);
        });
        s.lane_sum[t] = sum;
    }
    __syncthreads();
    const double total = SPECDEC_COMBINE_LANES(s.lane_sum);
    __syncthreads();
    return total;
}

// Radix select over the keys of z (specdec_select): the largest key v such that the entries
// with key >= v (and >= floor_key) reach `need`, counting each entry as 1 or (by_mass) as
// its w, need then being top_p times the total; 0 when every entry falls short. A counting
// histogram holds integers, exact in any order, so the whole block fills it; a mass
// histogram is summed by thread 0 in element order, the CPU's order. Thread 0 walks the
// buckets from the top and broadcasts what it found. Over survivors that hold every entry
// with a key at or above the answer (and, by mass, every entry at or above floor_key), each
// bucket from the top down to the chosen one is what the row gives, so the walk stops at
// the same one.
template <typename T, typename Entries>
__device__ typename LawTraits<T>::Key select_key(const Entries& entries, T z_max,
                                                 typename LawTraits<T>::Key floor_key,
                                                 bool by_mass, double need, Scratch& s) {
    using Traits = LawTraits<T>;
    using Key = typename Traits::Key;
    const int t = threadIdx.x;
    double* histogram = s.law.histogram;
    Key prefix = 0;
    double above = 0.0;
    int known_bits = 0;
    while (known_bits < Traits::kKeyBits) {
        int shift;
        const int width = specdec_select_width(Traits::kKeyBits, known_bits, &shift);
        const int buckets = 1 << width;
        for (int bucket = t; bucket < buckets; bucket += kBlock) histogram[bucket] = 0.0;
        __syncthreads();
        if (!by_mass || t == 0) {
            const long long first = by_mass ? 0 : t;
            const long long step = by_mass ? 1 : kBlock;
            for (long long i = first; i < entries.count; i += step) {
                const T z = entries.z(i);
                const int bucket =
                    Traits::bucket(Traits::key(z), floor_key, prefix, known_bits, shift, width);
                if (bucket < 0) continue;
                if (by_mass) {
                    histogram[bucket] += Traits::weight(z, z_max);
                } else {
                    atomicAdd(&histogram[bucket], 1.0);
                }
            }
        }
        __syncthreads();
        if (t == 0) {
            if (known_bits == 0 && by_mass) need *= specdec_histogram_total(histogram, buckets);
            const int chosen = specdec_select_walk(histogram, buckets, known_bits, need, &above);
            s.select_failed = chosen < 0;
            s.select_prefix = static_cast<unsigned long long>(
                chosen < 0 ? Key(0) : (prefix | (static_cast<Key>(chosen) << shift)));
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

// Whether entry (l, position) wins over (best, best_position) in extreme_logit: a larger
// (or lower) logit, or an equal one at a smaller index mod kBlock, then a smaller index.
// Equal logits differ in their bits only as -0 and +0; the rule picks the zero that the
// row's reduction keeps (thread y mod kBlock visits its entries in element order, and
// thread 0 takes the threads in order, each replacing the best only with a strictly better
// logit), wherever the entries were gathered from.
template <typename T>
__device__ __forceinline__ bool extreme_wins(bool lowest, T l, long long position, T best,
                                             long long best_position) {
    if (lowest ? l < best : l > best) return true;
    if (!(l == best) || best_position < 0) return false;
    const long long thread = position % kBlock;
    const long long best_thread = best_position % kBlock;
    return thread < best_thread || (thread == best_thread && position < best_position);
}

// The largest logit of the row (lowest false), or the lowest logit whose key is at least
// floor_key (lowest true), to every thread: a minimum or maximum is exact in any order, so
// the whole block reduces it (`logits`: entries at temperature 1).
template <typename T, typename Entries>
__device__ T extreme_logit(const Entries& logits, bool lowest,
                           typename LawTraits<T>::Key floor_key, Scratch& s) {
    using Traits = LawTraits<T>;
    const int t = threadIdx.x;
    T best = lowest ? Traits::infinity() : -Traits::infinity();
    long long best_position = -1;
    for (long long i = t; i < logits.count; i += kBlock) {
        const T l = logits.z(i);
        if (lowest && !(Traits::key(l) >= floor_key)) continue;
        if (extreme_wins(lowest, l, logits.position(i), best, best_position)) {
            best = l;
            best_position = logits.position(i);
        }
    }
    s.reduce.value[t] = static_cast<double>(best);
    s.reduce.index[t] = best_position;
    __syncthreads();
    if (t == 0) {
        for (int other = 1; other < kBlock; ++other) {
            const T l = static_cast<T>(s.reduce.value[other]);
            if (extreme_wins(lowest, l, s.reduce.index[other], best, best_position)) {
                best = l;
                best_position = s.reduce.index[other];
            }
        }
        s.reduce.value[0] = static_cast<double>(best);
    }
    __syncthreads();
    const T result = static_cast<T>(s.reduce.value[0]);
    __syncthreads();  // the reduction's storage may be reused as soon as this returns
    return result;
}

// An exclusive prefix sum of one count per thread over the block (Hillis and Steele, in
// the histogram's storage), with the total; every thread calls it.
__device__ __forceinline__ long long block_prefix_sum(long long mine, long long& total,
                                                      Scratch& s) {
    const int t = threadIdx.x;
    int from = 0;
    s.law.prefix_sum[from][t] = mine;
    __syncthreads();
    for (int distance = 1; distance < kBlock; distance <<= 1) {
        const long long sum =
            s.law.prefix_sum[from][t] + (t >= distance ? s.law.prefix_sum[from][t - distance] : 0);
        s.law.prefix_sum[1 - from][t] = sum;
        from = 1 - from;
        __syncthreads();
    }
    const long long inclusive = s.law.prefix_sum[from][t];
    total = s.law.prefix_sum[from][kBlock - 1];
    __syncthreads();  // the storage may be reused as soon as this returns
    return inclusive - mine;
}

// Top-k's survivors of a long row, without the radix select's passes over it (the CPU's
// specdec_gather_top of survivors.h, block-wide). The row is cut into at most kRowBlocks
// blocks of a multiple of 16 entries, thread t taking a run of consecutive blocks, and one
// pass that only compares logits (NaN never wins) finds the largest logit of each. The
// k-th largest of these maxima (a select over them alone) is the logit of k different
// entries, so the k-th largest logit is at least it, and the k-th largest z (the division
// by the temperature is monotone) at least its z, the threshold. Only the blocks whose
// maximum's z reaches the threshold are read again, and the logits and indices of their
// entries with z >= threshold, which are every such entry of the row, are gathered into
// the scratch in element order (each thread's count, then a prefix sum, then the entries
// at its offset). They hold top-k's set in either filter order (l >= the k-th largest l
// has z >= the threshold), the row's maximum and its +inf entries, and every entry that a
// later filter or the kept sum reads. Returns how many (at least top_k), to every thread,
// or -1 where the row is short, has fewer than top_k blocks, or more than kSurvivors
// entries reach the threshold (many equal logits): the law then reads the row.
template <typename T>
__device__ long long gather_survivors(const T* row, long long vocab, T temperature,
                                      long long top_k, Scratch& s) {
    using Traits = LawTraits<T>;
    constexpr long long kQuantum = 16;
    constexpr int kPerThread = kRowBlocks / kBlock;
    if (vocab <= 2 * kSurvivors || vocab > 0x7fffffffLL || top_k > kSurvivors) return -1;
    const long long size = kQuantum * ((vocab + kQuantum * kRowBlocks - 1) / (kQuantum * kRowBlocks));
    const long long blocks = (vocab + size - 1) / size;
    if (top_k > blocks) return -1;
    const int t = threadIdx.x;
    const long long per_thread = (blocks + kBlock - 1) / kBlock;  // at most kPerThread
    const long long first = min_ll(blocks, t * per_thread);
    const long long last = min_ll(blocks, first + per_thread);
    // Each loop over the thread's blocks has a fixed count, so that `largest` stays in
    // registers.
    T largest[kPerThread];
    for (int j = 0; j < kPerThread; ++j) {
        const long long b = first + j;
        T best = -Traits::infinity();
        if (b < last) {
            const long long end = min_ll(vocab, (b + 1) * size);
            for (long long y = b * size; y < end; ++y) {
                const T l = row[y];
                best = l > best ? l : best;
            }
            s.law.block_max[b] = static_cast<double>(best);
        }
        largest[j] = best;
    }
    __syncthreads();
    const T one = static_cast<T>(1);
    const RowEntries<T, double> maxima{s.law.block_max, one, blocks};
    const typename Traits::Key bound_key =
        select_key<T>(maxima, one, 1, false, static_cast<double>(top_k), s);
    const T bound = Traits::value(bound_key);
    const T threshold = bound / temperature;
    if (bound_key < 1 || threshold != threshold) return -1;  // the same in every thread
    long long mine = 0;
    for (int j = 0; j < kPerThread; ++j) {
        const long long b = first + j;
        if (b >= last || !(largest[j] / temperature >= threshold)) continue;
        const long long end = min_ll(vocab, (b + 1) * size);
        for (long long y = b * size; y < end; ++y) mine += row[y] / temperature >= threshold;
    }
    long long count;
    long long at = block_prefix_sum(mine, count, s);
    if (count < top_k || count > kSurvivors) return -1;
    SurvivorList& list = s.law.survivors;  // the maxima are no longer read
    for (int j = 0; j < kPerThread; ++j) {
        const long long b = first + j;
        if (b >= last || !(largest[j] / temperature >= threshold)) continue;
        const long long end = min_ll(vocab, (b + 1) * size);
        for (long long y = b * size; y < end; ++y) {
            const T l = row[y];
            if (l / temperature >= threshold) {
                list.logit[at] = static_cast<double>(l);
                list.position[at] = static_cast<int>(y);
                ++at;
            }
        }
    }
    __syncthreads();
    return count;
}
// The cutoff and normaliser of a law in llama.cpp's order (specdec_llama_cpp_law of
// logits_law.h): top-k, top-p (over top-k's set) and min-p on the logits at temperature 1, the
// kept set then taken at the temperature from the z of its lowest logit. `entries`: the row,
// or top-k's survivors, which hold every logit a filter keeps and every kept z (the lowest
// kept logit is at least the k-th largest, whose z reaches their threshold).
template <typename T, typename Entries>
__device__ void llama_cpp_law(const T* row, long long vocab, const Entries& entries,
                              T temperature, T z_max, long long top_k, double top_p,
                              double min_p, Scratch& s, specdec_row_law& law) {
    using Traits = LawTraits<T>;
    using Key = typename Traits::Key;
    const T one = static_cast<T>(1);
    Entries logits = entries;  // the same entries at temperature 1
    logits.temperature = one;
    // l / 1 is l, so at temperature 1 the largest logit is z_max.
    const T l_max = temperature == one ? z_max : extreme_logit<T>(logits, false, Key(0), s);
    Key floor_key = 1;  // NaN (key 0) is never kept
    if (top_k > 0 && top_k < vocab) {
        const Key k_key = select_key<T>(logits, l_max, Key(1), false,
                                        static_cast<double>(top_k), s);
        floor_key = k_key > floor_key ? k_key : floor_key;  // 0: too few entries, all kept
    }
    if (top_p < 1.0) {
        const Key p_key = select_key<T>(logits, l_max, floor_key, true, top_p, s);
        floor_key = p_key > floor_key ? p_key : floor_key;
    }
    bool min_p_decides = false;
    if (min_p > 0.0) {
        const Key m_key = Traits::min_p_floor(l_max, min_p);
        min_p_decides = m_key > floor_key;
        floor_key = min_p_decides ? m_key : floor_key;
    }
    if (floor_key <= 1) {
        law.cutoff = -infinity();
        const RowEntries<T> whole{row, temperature, vocab};
        law.normaliser = kept_sum(whole, z_max, -Traits::infinity(), s);
        return;
    }
    // Top-k's and top-p's keys are those of entries; min-p's bisection key need not be.
    T lowest = Traits::value(floor_key);
    if (min_p_decides && temperature != one) {
        lowest = extreme_logit<T>(logits, true, floor_key, s);
    }
    const T cutoff = lowest / temperature;
    law.cutoff = static_cast<double>(cutoff);
    law.normaliser = kept_sum(entries, z_max, cutoff, s);
}

// The filters of a law in vLLM's order over `entries` (the row or top-k's survivors,
// which hold every entry that top-k keeps): the cutoff and normaliser.
template <typename T, typename Entries>
__device__ void vllm_law(const T* row, long long vocab, const Entries& entries, T temperature,
                         T z_max, long long top_k, double top_p, double min_p, Scratch& s,
                         specdec_row_law& law) {
    using Traits = LawTraits<T>;
    using Key = typename Traits::Key;
    Key floor_key = 1;  // NaN (key 0) is never kept
    if (min_p > 0.0) floor_key = Traits::min_p_floor(z_max, min_p);  // in every thread alike
    if (top_k > 0 && top_k < vocab) {
        const Key k_key =
            select_key<T>(entries, z_max, Key(1), false, static_cast<double>(top_k), s);
        floor_key = k_key > floor_key ? k_key : floor_key;
    }
    if (top_p < 1.0) {
        // The CPU selects over the gathered survivors of min-p and top-k when they are few;
        // skipping the others in element order sums the same entries in the same order.
        const Key p_key = select_key<T>(entries, z_max, floor_key, true, top_p, s);
        floor_key = p_key > floor_key ? p_key : floor_key;
    }
    if (floor_key <= 1) {
        law.cutoff = -infinity();
        const RowEntries<T> whole{row, temperature, vocab};
        law.normaliser = kept_sum(whole, z_max, -Traits::infinity(), s);
        return;
    }
    const T cutoff = Traits::value(floor_key);
    law.cutoff = static_cast<double>(cutoff);
    law.normaliser = kept_sum(entries, z_max, cutoff, s);
}

// The law of one logits row (specdec_row_law), to every thread. With top-k on, a long row's
// law starts from top-k's survivors (gather_survivors): its maximum, filters and normaliser
// then read them alone, with the row's bits; otherwise (and where they do not fit) the row.
// Not inlined: every row reader calls it, and one copy per dtype keeps the module's compile
// time down.
template <typename T>
__device__ __noinline__ specdec_row_law row_law(const T* row, long long vocab, T temperature,
                                                long long top_k, double top_p, double min_p,
                                                int filter_order, Scratch& s) {
    using Traits = LawTraits<T>;
    const long long count = top_k > 0 && top_k < vocab
                                ? gather_survivors(row, vocab, temperature, top_k, s)
                                : -1;
    const RowEntries<T> whole{row, temperature, vocab};
    const SurvivorEntries<T> survivors{&s.law.survivors, temperature, count};
    T z_max;
    long long num_infinite;
    if (count >= 0) {
        max_pass(survivors, s, z_max, num_infinite);
    } else {
        max_pass(whole, s, z_max, num_infinite);
    }
    specdec_row_law law{static_cast<double>(z_max), 0.0, 0.0, num_infinite, 0};
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
    if (filter_order == SPECDEC_FILTER_ORDER_LLAMA_CPP) {
        if (count >= 0) {
            llama_cpp_law(row, vocab, survivors, temperature, z_max, top_k, top_p, min_p, s, law);
        } else {
            llama_cpp_law(row, vocab, whole, temperature, z_max, top_k, top_p, min_p, s, law);
        }
    } else if (count >= 0) {
        vllm_law(row, vocab, survivors, temperature, z_max, top_k, top_p, min_p, s, law);
    } else {
        vllm_law(row, vocab, whole, temperature, z_max, top_k, top_p, min_p, s, law);
    }
    return law;
}

// p(y) in float64 from the one logit row[y] (specdec_law_probability); 0 without mass.
template <typename T>
__device__ __forceinline__ double law_probability(const T* row, long long y, T temperature,
                                                  const specdec_row_law& law) {
    return LawTraits<T>::probability(row[y] / temperature, law);
}

// p(y) as the CPU materialises it, in the row's dtype (specdec_law_materialise).
template <typename T>
__device__ __forceinline__ T materialised(const T* row, long long y, T temperature,
                                          const specdec_row_law& law) {
    return LawTraits<T>::stored(row[y] / temperature, law);
}
}  // namespace specdec
