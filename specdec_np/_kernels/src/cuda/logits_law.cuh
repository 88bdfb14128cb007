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

// The maximum z and the count of +inf entries (the CPU's first pass; a maximum is a
// selection and the count an integer, so the lanes' grouping changes neither): lane l
// (thread l) takes the entries y = l mod 8; every thread receives the results.
template <typename T>
__device__ void max_pass(const T* row, long long vocab, T temperature, Scratch& s, T& z_max,
                         long long& num_infinite) {
    using Traits = LawTraits<T>;
    const int t = threadIdx.x;
    if (t < kLanes) {
        T best = -Traits::infinity();
        int64_t infinite = 0;
        for (long long entry = t; entry < vocab; entry += kLanes) {
            Traits::max_step(row[entry] / temperature, &best, &infinite);
        }
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
    const double total = SPECDEC_COMBINE_LANES(s.lane_sum);
    __syncthreads();
    return total;
}

// Radix select over the keys of z (specdec_select): the largest key v such that the entries
// with key >= v (and >= floor_key) reach `need`, counting each entry as 1 or (by_mass) as
// its w, need then being top_p times the total; 0 when every entry falls short. A counting
// histogram holds integers, exact in any order, so the whole block fills it; a mass
// histogram is summed by thread 0 in element order, the CPU's order. Thread 0 walks the
// buckets from the top and broadcasts what it found.
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
        int shift;
        const int width = specdec_select_width(Traits::kKeyBits, known_bits, &shift);
        const int buckets = 1 << width;
        for (int bucket = t; bucket < buckets; bucket += kBlock) histogram[bucket] = 0.0;
        __syncthreads();
        if (!by_mass || t == 0) {
            const long long first = by_mass ? 0 : t;
            const long long step = by_mass ? 1 : kBlock;
            for (long long y = first; y < vocab; y += step) {
                const T z = row[y] / temperature;
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

// The largest logit of the row (lowest false), or the lowest logit whose key is at least
// floor_key (lowest true), to every thread: a minimum or maximum is exact in any order, so
// the whole block reduces it.
template <typename T>
__device__ T extreme_logit(const T* row, long long vocab, bool lowest,
                           typename LawTraits<T>::Key floor_key, Scratch& s) {
    using Traits = LawTraits<T>;
    const int t = threadIdx.x;
    T best = lowest ? Traits::infinity() : -Traits::infinity();
    for (long long y = t; y < vocab; y += kBlock) {
        const T l = row[y];
        if (lowest ? Traits::key(l) >= floor_key && l < best : l > best) best = l;
    }
    s.reduce.value[t] = static_cast<double>(best);
    __syncthreads();
    if (t == 0) {
        for (int other = 1; other < kBlock; ++other) {
            const T l = static_cast<T>(s.reduce.value[other]);
            if (lowest ? l < best : l > best) best = l;
        }
        s.reduce.value[0] = static_cast<double>(best);
    }
    __syncthreads();
    const T result = static_cast<T>(s.reduce.value[0]);
    __syncthreads();  // the reduction's storage may be reused as soon as this returns
    return result;
}

// The cutoff and normaliser of a law in llama.cpp's order (specdec_llama_cpp_law of
// logits_law.h): top-k, top-p (over top-k's set) and min-p on the logits at temperature 1, the
// kept set then taken at the temperature from the z of its lowest logit.
template <typename T>
__device__ void llama_cpp_law(const T* row, long long vocab, T temperature, T z_max,
                              long long top_k, double top_p, double min_p, Scratch& s,
                              specdec_row_law& law) {
    using Traits = LawTraits<T>;
    using Key = typename Traits::Key;
    const T one = static_cast<T>(1);
    // l / 1 is l, so at temperature 1 the largest logit is z_max.
    const T l_max = temperature == one ? z_max : extreme_logit(row, vocab, false, Key(0), s);
    Key floor_key = 1;  // NaN (key 0) is never kept
    if (top_k > 0 && top_k < vocab) {
        const Key k_key = select_key(row, vocab, one, l_max, Key(1), false,
                                     static_cast<double>(top_k), s);
        floor_key = k_key > floor_key ? k_key : floor_key;  // 0: too few entries, all kept
    }
    if (top_p < 1.0) {
        const Key p_key = select_key(row, vocab, one, l_max, floor_key, true, top_p, s);
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
        law.normaliser = kept_sum(row, vocab, temperature, z_max, -Traits::infinity(), s);
        return;
    }
    // Top-k's and top-p's keys are those of entries; min-p's bisection key need not be.
    T lowest = Traits::value(floor_key);
    if (min_p_decides && temperature != one) lowest = extreme_logit(row, vocab, true, floor_key, s);
    const T cutoff = lowest / temperature;
    law.cutoff = static_cast<double>(cutoff);
    law.normaliser = kept_sum(row, vocab, temperature, z_max, cutoff, s);
}

// The law of one logits row (specdec_row_law), to every thread. Not inlined: every row
// reader calls it, and one copy per dtype keeps the module's compile time down.
template <typename T>
__device__ __noinline__ specdec_row_law row_law(const T* row, long long vocab, T temperature,
                                                long long top_k, double top_p, double min_p,
                                                int filter_order, Scratch& s) {
    using Traits = LawTraits<T>;
    using Key = typename Traits::Key;
    T z_max;
    long long num_infinite;
    max_pass(row, vocab, temperature, s, z_max, num_infinite);
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
        llama_cpp_law(row, vocab, temperature, z_max, top_k, top_p, min_p, s, law);
        return law;
    }
    Key floor_key = 1;  // NaN (key 0) is never kept
    if (min_p > 0.0) floor_key = Traits::min_p_floor(z_max, min_p);  // in every thread alike
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
        law.normaliser = kept_sum(row, vocab, temperature, z_max, -Traits::infinity(), s);
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
