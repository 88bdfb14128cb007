/* The selections of a key over a logits row's entries (logits_law.h's law, survivors.h's
 * gathering): the law's scratch, the radix select of a key by count or by mass, and top-k's
 * key by quickselect, with its partitions on vectors where the CPU has them.
 *
 * Each finds a key that the law defines (docs/semantics.md); the key of z and the weights
 * are elementwise.h's, and a histogram's sums run in element order and its walk in bucket
 * order, the same in every build.  The tests build the header with fewer candidates
 * (SPECDEC_TOP_P_CANDIDATES), without the quickselect (SPECDEC_QUICKSELECT_PARTITIONS = 0),
 * without the AVX-512 code (SPECDEC_AVX512_PATH = 0) and without the AVX2 code
 * (SPECDEC_NO_X86_AVX2) to compare each shortcut with the full scans.
 */
#ifndef SPECDEC_SELECTIONS_H
#define SPECDEC_SELECTIONS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rowscan.h"

/* ---- the radix select ---------------------------------------------------------------- */

/* Top-p after min-p or top-k selects over at most this many gathered survivors; with more
 * it scans the row.  The tests build the header with a smaller one to compare the two
 * paths. */
#ifndef SPECDEC_TOP_P_CANDIDATES
#define SPECDEC_TOP_P_CANDIDATES 2048
#endif

/* The law's working memory: the radix select's histogram, the gathered survivors, their
 * weights and two buffers of their keys (96 KiB for double rows).  It comes from the heap,
 * one per thread (specdec_law_scratch_new, freed with free): a thread's stack may be
 * 32 KiB (Python's smallest) or 16 KiB (OMP_STACKSIZE=16K), and no kernel keeps large
 * buffers there.  The histogram is all zeros between calls (each pass of the select clears
 * the buckets it filled), so that a pass over few entries costs what they cost, not a
 * clear and a walk of every bucket. */
typedef struct {
    double histogram[1 << SPECDEC_HISTOGRAM_BITS];
    union {
        float f[SPECDEC_TOP_P_CANDIDATES];
        double d[SPECDEC_TOP_P_CANDIDATES];
    } candidates, candidate_weights;
    ptrdiff_t positions[SPECDEC_TOP_P_CANDIDATES];
    /* The radix select's entries that share the prefix found so far (a set it selects
     * over that fits here). */
    int32_t members[SPECDEC_TOP_P_CANDIDATES];
    union {
        uint32_t f[SPECDEC_TOP_P_CANDIDATES];
        uint64_t d[SPECDEC_TOP_P_CANDIDATES];
    } keys, spare_keys;
    /* Threads for the passes over one row (rowthreads.h); 0 (calloc's) or 1: one. */
    int row_threads;
    /* Non-zero where the caller left the temperature's overflow check (docs/semantics.md,
     * "Temperatures that overflow") to the law of the rows it reads: a row whose largest
     * finite logit overflows at a temperature below 1 then has no law (status 2), not the
     * uniform law over its overflowing entries (logits_law.h, specdec_row_law). */
    int finds_overflow;
    /* After a law (logits_law.h): how many gathered entries hold its whole kept set, with
     * their z in `candidates`, weights in `candidate_weights` and indices in `positions`,
     * in element order (the kept ones are those with z >= the law's cutoff); -1 when the
     * law scanned the row instead. */
    ptrdiff_t survivors;
} specdec_law_scratch;

/* A zeroed scratch (NULL when the allocation fails). */
static inline specdec_law_scratch *specdec_law_scratch_new(void)
{
    return (specdec_law_scratch *)calloc(1, sizeof(specdec_law_scratch));
}

/* Radix select over the keys of the z values: the largest key v such that the entries with
 * key >= v (and key >= floor_key) reach `need`, counting each entry as 1 (by_mass = 0) or
 * as its w (by_mass = 1; then need is top_p times the total, which the first histogram
 * gives).  Returns 0 when even every entry falls short.  Each pass histograms the next
 * SPECDEC_HISTOGRAM_BITS bits of the keys that share the prefix found so far; histogram
 * sums run in element order and the walk in bucket order, the same in every build; the
 * buckets and the walk are elementwise.h's.  A set that fits the scratch's members is read
 * and keyed once: each later pass reads only the entries of the bucket the pass before
 * chose, still in element order, so that every bucket sums as a pass over the whole set
 * would.  When one entry is left, its key is the answer: each later pass would fill one
 * bucket, with its weight, and choose it. */
#define SPECDEC_DEFINE_SELECT(SUFFIX, T, KEY_T, KEY_BITS)                                   \
    SPECDEC_CLONES                                                                         \
    static KEY_T specdec_select_##SUFFIX(const T *logits, ptrdiff_t V, T temperature,       \
                                         T z_max, KEY_T floor_key, int by_mass, double need, \
                                         const T *weights, specdec_law_scratch *scratch)   \
    {                                                                                      \
        double *histogram = scratch->histogram;                                            \
        int32_t *members = V <= SPECDEC_TOP_P_CANDIDATES ? scratch->members : NULL;        \
        KEY_T *member_keys = scratch->spare_keys.SUFFIX;                                   \
        ptrdiff_t visited = V; /* after the first pass: members[0 .. visited) */           \
        KEY_T prefix = 0;                                                                  \
        double above = 0.0;                                                                \
        int known_bits = 0;                                                                \
        /* The filled buckets are marked in `filled`, words bottom_word to top_word; the   \
         * others hold 0, which adds nothing to the total or to the walk's sums, so both   \
         * visit the marked buckets alone, from the top, and clear them and their words    \
         * after each pass (see the scratch). */                                           \
        uint64_t filled[(1 << SPECDEC_HISTOGRAM_BITS) / 64] = {0};                         \
        /* z / 1 is z: the division is skipped, not the rounding changed. */              \
        const int divide = temperature != (T)1;                                            \
        while (known_bits < KEY_BITS) {                                                    \
            int shift;                                                                     \
            int width = specdec_select_width(KEY_BITS, known_bits, &shift);                \
            int top_word = -1, bottom_word = (1 << SPECDEC_HISTOGRAM_BITS) / 64;           \
            for (ptrdiff_t i = 0; i < visited; ++i) {                                      \
                ptrdiff_t y = i;                                                           \
                KEY_T key;                                                                 \
                if (members && known_bits > 0) {                                           \
                    y = members[i];                                                        \
                    key = member_keys[i];                                                  \
                } else {                                                                   \
                    key = specdec_key_##SUFFIX(divide ? logits[y] / temperature : logits[y]); \
                    if (members)                                                           \
                        member_keys[i] = key;                                              \
                }                                                                          \
                int bucket = specdec_select_bucket_##SUFFIX(key, floor_key, prefix, known_bits, \
                                                            shift, width);                 \
                if (bucket >= 0) {                                                         \
                    histogram[bucket] +=                                                   \
                        !by_mass  ? 1.0                                                    \
                        : weights ? (double)weights[y]                                     \
                                  : specdec_weight_##SUFFIX(logits[y] / temperature, z_max); \
                    int word = bucket >> 6;                                                \
                    filled[word] |= (uint64_t)1 << (bucket & 63);                          \
                    top_word = word > top_word ? word : top_word;                          \
                    bottom_word = word < bottom_word ? word : bottom_word;                 \
                }                                                                          \
            }                                                                              \
            if (known_bits == 0 && by_mass) {                                              \
                double total = 0.0;                                                        \
                for (int word = top_word; word >= bottom_word; --word) {                   \
                    for (uint64_t bits = filled[word]; bits;) {                            \
                        int bucket = 64 * word + 63 - __builtin_clzll(bits);               \
                        bits &= ~((uint64_t)1 << (bucket & 63));                           \
                        total += histogram[bucket];                                        \
                    }                                                                      \
                }                                                                          \
                need *= total;                                                             \
            }                                                                              \
            int chosen = -1, lowest_filled = -1;                                           \
            for (int word = top_word; word >= bottom_word && chosen < 0; --word) {         \
                for (uint64_t bits = filled[word]; bits && chosen < 0;) {                  \
                    int bucket = 64 * word + 63 - __builtin_clzll(bits);                   \
                    bits &= ~((uint64_t)1 << (bucket & 63));                               \
                    if (specdec_select_walk_bucket(histogram[bucket], bucket, need, &above, \
                                                   &lowest_filled))                        \
                        chosen = bucket;                                                   \
                }                                                                          \
            }                                                                              \
            if (chosen < 0 && known_bits > 0)                                              \
                chosen = lowest_filled;                                                    \
            for (int word = bottom_word; word <= top_word; ++word) {                       \
                for (uint64_t bits = filled[word]; bits; bits &= bits - 1)                 \
                    histogram[64 * word + __builtin_ctzll(bits)] = 0.0;                    \
                filled[word] = 0;                                                          \
            }                                                                              \
            if (chosen < 0)                                                                \
                return 0;                                                                  \
            if (members) {                                                                 \
                ptrdiff_t kept = 0;                                                        \
                for (ptrdiff_t i = 0; i < visited; ++i) {                                  \
                    KEY_T key = member_keys[i];                                            \
                    if (specdec_select_bucket_##SUFFIX(key, floor_key, prefix, known_bits, \
                                                       shift, width) == chosen) {          \
                        members[kept] = (int32_t)(known_bits > 0 ? members[i] : i);        \
                        member_keys[kept++] = key;                                         \
                    }                                                                      \
                }                                                                          \
                if (kept == 1 || (SPECDEC_LOGITS_MUTATION == 11 && kept == 2))             \
                    return member_keys[0]; /* 11: wrong on purpose, one pass too few */    \
                visited = kept;                                                            \
            }                                                                              \
            prefix |= (KEY_T)chosen << shift;                                              \
            known_bits += width;                                                           \
        }                                                                                  \
        return prefix;                                                                     \
    }

SPECDEC_DEFINE_SELECT(f, float, uint32_t, 32)
SPECDEC_DEFINE_SELECT(d, double, uint64_t, 64)

/* ---- the partitions of top-k's key and the gathering of survivors -------------------- */

/* Each step goes through the entries from `start` on, with its running counts; the fronts
 * below run a vector version (sixteen lanes on AVX-512, eight on AVX2) over the full groups
 * it can and this one over the rest.  Every key is stored to both sides and each side's
 * count advances by its comparison (no branch on a key, whose side is random: a branch on it
 * mispredicts one time in two, about ten cycles an entry); a store lands at or before the
 * entry being read.  The sixteen-lane versions store only the lanes they keep (masked), so
 * that they write no further than these; the eight-lane ones write whole groups, which end
 * at or before the end of the group being read (within the range these write).
 *
 * specdec_partition_values_from: the keys of values[start, count) (over the temperature),
 *   above the pivot to keys, below it (and not NaN's, key 0) to other; returns how many
 *   are not NaN's.
 * specdec_partition_keys_from: the same over keys[start, n) in place, none of them NaN's.
 * specdec_gather_at_or_above_from: the z and indices of the entries of logits[start, V)
 *   with key >= floor_key, in element order, after the `kept` already gathered; returns
 *   how many there are then. */
#define SPECDEC_DEFINE_PARTITION_STEPS(SUFFIX, T, KEY_T)                                    \
    static ptrdiff_t specdec_partition_values_from_##SUFFIX(                               \
        const T *values, ptrdiff_t start, ptrdiff_t count, T temperature, KEY_T pivot,     \
        KEY_T *keys, KEY_T *other, ptrdiff_t *larger, ptrdiff_t *smaller)                  \
    {                                                                                      \
        const int divide = temperature != (T)1;                                            \
        ptrdiff_t n = 0, up = *larger, down = *smaller;                                    \
        for (ptrdiff_t i = start; i < count; ++i) {                                        \
            /* z / 1 is z: the division is skipped, not the rounding changed. */          \
            KEY_T key = specdec_key_##SUFFIX(divide ? values[i] / temperature : values[i]); \
            keys[up] = key;                                                                \
            other[down] = key;                                                             \
            n += key >= 1;                                                                 \
            up += key > pivot;                                                             \
            down += key < pivot && key >= 1;                                               \
        }                                                                                  \
        *larger = up;                                                                      \
        *smaller = down;                                                                   \
        return n;                                                                          \
    }                                                                                      \
    static void specdec_partition_keys_from_##SUFFIX(KEY_T *keys, ptrdiff_t start,          \
                                                     ptrdiff_t n, KEY_T pivot, KEY_T *other, \
                                                     ptrdiff_t *larger, ptrdiff_t *smaller) \
    {                                                                                      \
        ptrdiff_t up = *larger, down = *smaller;                                           \
        for (ptrdiff_t i = start; i < n; ++i) {                                            \
            KEY_T key = keys[i];                                                           \
            keys[up] = key;                                                                \
            other[down] = key;                                                             \
            up += key > pivot;                                                             \
            down += key < pivot;                                                           \
        }                                                                                  \
        *larger = up;                                                                      \
        *smaller = down;                                                                   \
    }                                                                                      \
    static ptrdiff_t specdec_gather_at_or_above_from_##SUFFIX(                             \
        const T *logits, ptrdiff_t start, ptrdiff_t V, T temperature, KEY_T floor_key,     \
        T *z_out, ptrdiff_t *y_out, ptrdiff_t kept)                                        \
    {                                                                                      \
        const int divide = temperature != (T)1;                                            \
        for (ptrdiff_t y = start; y < V; ++y) {                                            \
            T z = divide ? logits[y] / temperature : logits[y];                            \
            z_out[kept] = z;                                                               \
            y_out[kept] = y;                                                               \
            kept += specdec_key_##SUFFIX(z) >= floor_key;                                  \
        }                                                                                  \
        return kept;                                                                       \
    }

SPECDEC_DEFINE_PARTITION_STEPS(f, float, uint32_t)
SPECDEC_DEFINE_PARTITION_STEPS(d, double, uint64_t)

#if SPECDEC_HAVE_VECTORS && SPECDEC_AVX512_PATH
/* Sixteen floats' keys (specdec_key_f's): -0 becomes +0, NaN's key is 0. */
SPECDEC_AVX512 static inline __m512i specdec_keys16_f(__m512 z)
{
    typedef uint32_t keys16 __attribute__((vector_size(64)));
    z = _mm512_add_ps(z, _mm512_setzero_ps());
    __m512i bits = _mm512_castps_si512(z);
    keys16 key = SPECDEC_KEY_FROM_BITS_F((keys16)bits, (keys16)_mm512_srai_epi32(bits, 31));
    return _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(z, z, _CMP_ORD_Q), (__m512i)key);
}

/* The lanes of `lanes` chosen by `chosen`, in lane order, stored at out (only they). */
SPECDEC_AVX512 static inline int specdec_store_chosen16(uint32_t *out, __mmask16 chosen,
                                                        __m512i lanes)
{
    int count = __builtin_popcount((unsigned)chosen);
    /* A compress into a register and a masked store: a compress into memory is slow on
     * some CPUs that have it (AMD's Zen 4). */
    _mm512_mask_storeu_epi32(out, (__mmask16)((1u << count) - 1u),
                             _mm512_maskz_compress_epi32(chosen, lanes));
    return count;
}

/* The partition steps sixteen entries at a time over the full groups; each returns how
 * many entries it did (a multiple of 16), for the steps above to finish. */
SPECDEC_AVX512 static ptrdiff_t specdec_partition_values_f_wide16(
    const float *values, ptrdiff_t count, float temperature, uint32_t pivot, uint32_t *keys,
    uint32_t *other, ptrdiff_t *larger, ptrdiff_t *smaller, ptrdiff_t *n)
{
    const int divide = temperature != 1.0f;
    const __m512 t = _mm512_set1_ps(temperature);
    const __m512i p = _mm512_set1_epi32((int)pivot), zero = _mm512_setzero_si512();
    ptrdiff_t i = 0, up = *larger, down = *smaller, present = *n;
    for (; i + 16 <= count; i += 16) {
        __m512 z = _mm512_loadu_ps(values + i);
        if (divide)
            z = _mm512_div_ps(z, t);
        __m512i key = specdec_keys16_f(z);
        __mmask16 not_nan = _mm512_cmp_epu32_mask(key, zero, _MM_CMPINT_NE);
        present += __builtin_popcount((unsigned)not_nan);
        /* Mutation 7 (tests only): the keys compare as signed integers. */
        __mmask16 above = SPECDEC_LOGITS_MUTATION == 7
                              ? _mm512_cmp_epi32_mask(key, p, _MM_CMPINT_NLE)
                              : _mm512_cmp_epu32_mask(key, p, _MM_CMPINT_NLE);
        up += specdec_store_chosen16(keys + up, above, key);
        down += specdec_store_chosen16(
            other + down, _mm512_mask_cmp_epu32_mask(not_nan, key, p, _MM_CMPINT_LT), key);
    }
    *larger = up;
    *smaller = down;
    *n = present;
    return i;
}

SPECDEC_AVX512 static ptrdiff_t specdec_partition_keys_f_wide16(uint32_t *keys, ptrdiff_t n,
                                                              uint32_t pivot, uint32_t *other,
                                                              ptrdiff_t *larger,
                                                              ptrdiff_t *smaller)
{
    const __m512i p = _mm512_set1_epi32((int)pivot);
    ptrdiff_t i = 0, up = *larger, down = *smaller;
    for (; i + 16 <= n; i += 16) {
        /* Loaded before the stores, which end at or before i + 16. */
        __m512i key = _mm512_loadu_si512(keys + i);
        up += specdec_store_chosen16(keys + up, _mm512_cmp_epu32_mask(key, p, _MM_CMPINT_NLE),
                                     key);
        down += specdec_store_chosen16(other + down,
                                       _mm512_cmp_epu32_mask(key, p, _MM_CMPINT_LT), key);
    }
    *larger = up;
    *smaller = down;
    return i;
}

SPECDEC_AVX512 static ptrdiff_t specdec_gather_at_or_above_f_wide16(
    const float *logits, ptrdiff_t V, float temperature, uint32_t floor_key, float *z_out,
    ptrdiff_t *y_out, ptrdiff_t *kept)
{
    const int divide = temperature != 1.0f;
    const __m512 t = _mm512_set1_ps(temperature);
    const __m512i floor = _mm512_set1_epi32((int)floor_key);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    ptrdiff_t y = 0, count = *kept;
    for (; y + 16 <= V; y += 16) {
        __m512 z = _mm512_loadu_ps(logits + y);
        if (divide)
            z = _mm512_div_ps(z, t);
        /* Mutation 6 (tests only): the entries at the floor key are dropped. */
        __mmask16 chosen = _mm512_cmp_epu32_mask(
            specdec_keys16_f(z), floor,
            SPECDEC_LOGITS_MUTATION == 6 ? _MM_CMPINT_NLE : _MM_CMPINT_NLT);
        if (!chosen)
            continue;
        int found = specdec_store_chosen16((uint32_t *)(z_out + count), chosen,
                                           _mm512_castps_si512(z));
        /* The chosen lanes' offsets, widened and added to y in 64 bits. */
        __m512i offsets = _mm512_maskz_compress_epi32(chosen, lane);
        __m512i base = _mm512_set1_epi64((long long)y);
        __m512i low = _mm512_add_epi64(base, _mm512_cvtepu32_epi64(
                                                 _mm512_castsi512_si256(offsets)));
        __m512i high = _mm512_add_epi64(base, _mm512_cvtepu32_epi64(
                                                  _mm512_extracti64x4_epi64(offsets, 1)));
        _mm512_mask_storeu_epi64(y_out + count, (__mmask8)((1u << (found < 8 ? found : 8)) - 1u),
                                 low);
        if (found > 8)
            _mm512_mask_storeu_epi64(y_out + count + 8, (__mmask8)((1u << (found - 8)) - 1u),
                                     high);
        count += found;
    }
    *kept = count;
    return y;
}

#endif

#if SPECDEC_X86_AVX2
/* The lanes that a mask of eight chooses, in lane order: the i-th nibble of entry m is the
 * lane of m's i-th set bit. */
#define SPECDEC_PACK_BIT(m, lane)                                                          \
    (((m) >> (lane) & 1u)                                                                  \
         ? (uint32_t)(lane) << (4 * __builtin_popcount((m) & ((1u << (lane)) - 1u)))       \
         : 0u)
#define SPECDEC_PACK(m)                                                                    \
    (SPECDEC_PACK_BIT(m, 0) | SPECDEC_PACK_BIT(m, 1) | SPECDEC_PACK_BIT(m, 2) |            \
     SPECDEC_PACK_BIT(m, 3) | SPECDEC_PACK_BIT(m, 4) | SPECDEC_PACK_BIT(m, 5) |            \
     SPECDEC_PACK_BIT(m, 6) | SPECDEC_PACK_BIT(m, 7))
#define SPECDEC_PACK4(m)                                                                   \
    SPECDEC_PACK(m), SPECDEC_PACK(m + 1), SPECDEC_PACK(m + 2), SPECDEC_PACK(m + 3)
#define SPECDEC_PACK16(m)                                                                  \
    SPECDEC_PACK4(m), SPECDEC_PACK4(m + 4), SPECDEC_PACK4(m + 8), SPECDEC_PACK4(m + 12)
#define SPECDEC_PACK64(m)                                                                  \
    SPECDEC_PACK16(m), SPECDEC_PACK16(m + 16), SPECDEC_PACK16(m + 32), SPECDEC_PACK16(m + 48)
static const uint32_t specdec_packed_lanes[256] = {SPECDEC_PACK64(0u), SPECDEC_PACK64(64u),
                                                   SPECDEC_PACK64(128u), SPECDEC_PACK64(192u)};

/* Eight floats' keys (specdec_keys16_f's). */
__attribute__((target("avx2"))) static inline __m256i specdec_keys8_f(__m256 z)
{
    typedef uint32_t keys8 __attribute__((vector_size(32)));
    z = _mm256_add_ps(z, _mm256_setzero_ps());
    __m256i bits = _mm256_castps_si256(z);
    keys8 key = SPECDEC_KEY_FROM_BITS_F((keys8)bits, (keys8)_mm256_srai_epi32(bits, 31));
    return _mm256_and_si256((__m256i)key, _mm256_castps_si256(_mm256_cmp_ps(z, z, _CMP_ORD_Q)));
}

/* The lanes of `lanes` that the mask `chosen` picks, first and in lane order, in the eight
 * entries at out (those after them are left to later stores); returns how many. */
__attribute__((target("avx2"))) static inline int specdec_store_chosen8(uint32_t *out, int chosen,
                                                                       __m256i lanes)
{
    const __m256i nibbles = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    __m256i order = _mm256_and_si256(
        _mm256_srlv_epi32(_mm256_set1_epi32((int)specdec_packed_lanes[chosen]), nibbles),
        _mm256_set1_epi32(7));
    _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(lanes, order));
    return __builtin_popcount((unsigned)chosen);
}

/* The mask of eight lanes' comparison (its lanes all ones or zeros). */
#define SPECDEC_MASK8(x) _mm256_movemask_ps(_mm256_castsi256_ps(x))

/* The partition steps eight entries at a time (AVX2), as the sixteen-lane ones.  Keys
 * compare as unsigned integers: a key is above the pivot where their maximum is not the
 * pivot, below it where their maximum is not the key. */
__attribute__((target("avx2"))) static ptrdiff_t specdec_partition_values_f_wide8(
    const float *values, ptrdiff_t count, float temperature, uint32_t pivot, uint32_t *keys,
    uint32_t *other, ptrdiff_t *larger, ptrdiff_t *smaller, ptrdiff_t *n)
{
    const int divide = temperature != 1.0f;
    const __m256 t = _mm256_set1_ps(temperature);
    const __m256i p = _mm256_set1_epi32((int)pivot);
    ptrdiff_t i = 0, up = *larger, down = *smaller, present = *n;
    for (; i + 8 <= count; i += 8) {
        __m256 z = _mm256_loadu_ps(values + i);
        if (divide)
            z = _mm256_div_ps(z, t);
        __m256i key = specdec_keys8_f(z), top = _mm256_max_epu32(key, p);
        int nan = SPECDEC_MASK8(_mm256_cmpeq_epi32(key, _mm256_setzero_si256()));
        present += 8 - __builtin_popcount((unsigned)nan);
        /* Mutation 7 (tests only): the keys compare as signed integers. */
        int above = SPECDEC_LOGITS_MUTATION == 7
                        ? SPECDEC_MASK8(_mm256_cmpgt_epi32(key, p))
                        : ~SPECDEC_MASK8(_mm256_cmpeq_epi32(top, p)) & 0xff;
        int below = ~SPECDEC_MASK8(_mm256_cmpeq_epi32(top, key)) & ~nan & 0xff;
        up += specdec_store_chosen8(keys + up, above, key);
        down += specdec_store_chosen8(other + down, below, key);
    }
    *larger = up;
    *smaller = down;
    *n = present;
    return i;
}

__attribute__((target("avx2"))) static ptrdiff_t specdec_partition_keys_f_wide8(
    uint32_t *keys, ptrdiff_t n, uint32_t pivot, uint32_t *other, ptrdiff_t *larger,
    ptrdiff_t *smaller)
{
    const __m256i p = _mm256_set1_epi32((int)pivot);
    ptrdiff_t i = 0, up = *larger, down = *smaller;
    for (; i + 8 <= n; i += 8) {
        /* Loaded before the stores, which end at or before i + 8. */
        __m256i key = _mm256_loadu_si256((const __m256i *)(keys + i));
        __m256i top = _mm256_max_epu32(key, p);
        up += specdec_store_chosen8(keys + up, ~SPECDEC_MASK8(_mm256_cmpeq_epi32(top, p)) & 0xff,
                                    key);
        down += specdec_store_chosen8(
            other + down, ~SPECDEC_MASK8(_mm256_cmpeq_epi32(top, key)) & 0xff, key);
    }
    *larger = up;
    *smaller = down;
    return i;
}
#endif

/* The vector steps this CPU runs: sixteen lanes, else eight, else none (0 entries done). */
#if SPECDEC_HAVE_VECTORS && (SPECDEC_AVX512_PATH || SPECDEC_X86_AVX2)
static ptrdiff_t specdec_partition_values_f_wide(const float *values, ptrdiff_t count,
                                                 float temperature, uint32_t pivot,
                                                 uint32_t *keys, uint32_t *other,
                                                 ptrdiff_t *larger, ptrdiff_t *smaller,
                                                 ptrdiff_t *n)
{
#if SPECDEC_AVX512_PATH
    if (specdec_cpu_has_avx512())
        return specdec_partition_values_f_wide16(values, count, temperature, pivot, keys, other,
                                                 larger, smaller, n);
#endif
#if SPECDEC_X86_AVX2
    if (specdec_has_avx2())
        return specdec_partition_values_f_wide8(values, count, temperature, pivot, keys, other,
                                                larger, smaller, n);
#endif
    return 0;
}

static ptrdiff_t specdec_partition_keys_f_wide(uint32_t *keys, ptrdiff_t n, uint32_t pivot,
                                               uint32_t *other, ptrdiff_t *larger,
                                               ptrdiff_t *smaller)
{
#if SPECDEC_AVX512_PATH
    if (specdec_cpu_has_avx512())
        return specdec_partition_keys_f_wide16(keys, n, pivot, other, larger, smaller);
#endif
#if SPECDEC_X86_AVX2
    if (specdec_has_avx2())
        return specdec_partition_keys_f_wide8(keys, n, pivot, other, larger, smaller);
#endif
    return 0;
}

static ptrdiff_t specdec_gather_at_or_above_f_wide(const float *logits, ptrdiff_t V,
                                                   float temperature, uint32_t floor_key,
                                                   float *z_out, ptrdiff_t *y_out,
                                                   ptrdiff_t *kept)
{
#if SPECDEC_AVX512_PATH
    if (specdec_cpu_has_avx512())
        return specdec_gather_at_or_above_f_wide16(logits, V, temperature, floor_key, z_out,
                                                   y_out, kept);
#endif
    return 0;
}
#define SPECDEC_WIDE_F(call) (call)
#else
#define SPECDEC_WIDE_F(call) 0
#endif
/* Double rows have no vector steps. */
#define SPECDEC_WIDE_D(call) 0

/* The fronts: the vector steps where they run, then the one-lane steps. */
#define SPECDEC_DEFINE_PARTITIONS(SUFFIX, T, KEY_T, WIDE)                                   \
    static ptrdiff_t specdec_partition_values_##SUFFIX(const T *values, ptrdiff_t count,    \
                                                       T temperature, KEY_T pivot,         \
                                                       KEY_T *keys, KEY_T *other,          \
                                                       ptrdiff_t *larger, ptrdiff_t *smaller) \
    {                                                                                      \
        ptrdiff_t n = 0;                                                                   \
        *larger = *smaller = 0;                                                            \
        ptrdiff_t done = WIDE(specdec_partition_values_##SUFFIX##_wide(                    \
            values, count, temperature, pivot, keys, other, larger, smaller, &n));         \
        return n + specdec_partition_values_from_##SUFFIX(values, done, count, temperature, \
                                                          pivot, keys, other, larger,      \
                                                          smaller);                        \
    }                                                                                      \
    static void specdec_partition_keys_##SUFFIX(KEY_T *keys, ptrdiff_t n, KEY_T pivot,      \
                                                KEY_T *other, ptrdiff_t *larger,           \
                                                ptrdiff_t *smaller)                        \
    {                                                                                      \
        *larger = *smaller = 0;                                                            \
        ptrdiff_t done = WIDE(specdec_partition_keys_##SUFFIX##_wide(keys, n, pivot, other, \
                                                                     larger, smaller));    \
        specdec_partition_keys_from_##SUFFIX(keys, done, n, pivot, other, larger, smaller); \
    }                                                                                      \
    /* The z values and indices, in element order, of the entries of a row of at most    \
     * SPECDEC_TOP_P_CANDIDATES with key >= floor_key (as the top-k path gathers its      \
     * survivors, so that the later filters and the kept sum work on them alone); returns \
     * how many. */                                                                        \
    static ptrdiff_t specdec_gather_at_or_above_##SUFFIX(const T *logits, ptrdiff_t V,      \
                                                         T temperature, KEY_T floor_key,   \
                                                         T *z_out, ptrdiff_t *y_out)       \
    {                                                                                      \
        ptrdiff_t kept = 0;                                                                \
        ptrdiff_t done = WIDE(specdec_gather_at_or_above_##SUFFIX##_wide(                  \
            logits, V, temperature, floor_key, z_out, y_out, &kept));                      \
        return specdec_gather_at_or_above_from_##SUFFIX(logits, done, V, temperature,      \
                                                        floor_key, z_out, y_out, kept);    \
    }

SPECDEC_DEFINE_PARTITIONS(f, float, uint32_t, SPECDEC_WIDE_F)
SPECDEC_DEFINE_PARTITIONS(d, double, uint64_t, SPECDEC_WIDE_D)

/* The tests build the header with a limit of 0, so that the radix select does it all. */
#ifndef SPECDEC_QUICKSELECT_PARTITIONS
#define SPECDEC_QUICKSELECT_PARTITIONS 64
#endif

/* Top-k's key over gathered entries: what specdec_select (counting, floor key 1) finds,
 * the K-th largest key of the non-NaN entries (0 when there are fewer), by quickselect,
 * which costs a few passes over the entries instead of three histograms of 2^11 buckets.
 * The answer is one value, so any exact method finds the same; after
 * SPECDEC_QUICKSELECT_PARTITIONS partitions (an adversarial order) the radix select does
 * the job.  Each partition is three-way, with no branch on the keys (the steps above):
 * the larger keys are packed in place at the front of the range read and the smaller ones
 * in the other buffer; equal keys are counted, not stored.  The first partition reads the
 * z values themselves, with a pivot from a sample placed just above the K-th largest
 * (top-k keeps a few percent of a row, where the median of three would keep half); the
 * later ones take the median of three. */
#define SPECDEC_DEFINE_TOP_K_KEY(SUFFIX, T, KEY_T)                                          \
    static KEY_T specdec_top_k_pivot_##SUFFIX(const T *values, ptrdiff_t count,             \
                                              T temperature, int64_t top_k)                \
    {                                                                                      \
        enum { SAMPLE = 16 };                                                              \
        KEY_T sample[SAMPLE];                                                              \
        for (int i = 0; i < SAMPLE; ++i)                                                   \
            sample[i] =                                                                    \
                specdec_key_##SUFFIX(values[(ptrdiff_t)i * count / SAMPLE] / temperature);  \
        /* At most `rank` sampled keys above the pivot: about rank / SAMPLE of the row. */ \
        int rank = (int)(((double)top_k * SAMPLE + (double)count - 1) / (double)count) + 1; \
        KEY_T pivot = 0;                                                                   \
        int best = -1;                                                                     \
        for (int i = 0; i < SAMPLE; ++i) {                                                 \
            int above = 0;                                                                 \
            for (int j = 0; j < SAMPLE; ++j)                                               \
                above += sample[j] > sample[i];                                            \
            if (above <= rank && above > best) {                                           \
                best = above;                                                              \
                pivot = sample[i];                                                         \
            }                                                                              \
        }                                                                                  \
        return pivot;                                                                      \
    }                                                                                      \
    static KEY_T specdec_top_k_key_##SUFFIX(const T *values, ptrdiff_t count, T temperature, \
                                            int64_t top_k, T z_max,                        \
                                            specdec_law_scratch *scratch)                  \
    {                                                                                      \
        if (SPECDEC_QUICKSELECT_PARTITIONS == 0)                                           \
            return specdec_select_##SUFFIX(values, count, temperature, z_max, 1, 0,         \
                                           (double)top_k, NULL, scratch);        \
        KEY_T *keys = scratch->keys.SUFFIX, *other = scratch->spare_keys.SUFFIX;           \
        /* The answer is the (target + 1)-th largest of the n non-NaN keys. */             \
        ptrdiff_t target = (ptrdiff_t)top_k - 1, n = 0, larger = 0, smaller = 0;           \
        KEY_T pivot = specdec_top_k_pivot_##SUFFIX(values, count, temperature, top_k);     \
        n = specdec_partition_values_##SUFFIX(values, count, temperature, pivot, keys, other, \
                                              &larger, &smaller);                          \
        if (n < top_k)                                                                     \
            return 0;                                                                      \
        for (int partitions = 0;; ++partitions) {                                          \
            if (target < larger) {                                                         \
                n = larger;                                                                \
            } else if (target < n - smaller) {                                             \
                return pivot;                                                              \
            } else {                                                                       \
                target -= n - smaller;                                                     \
                n = smaller;                                                               \
                KEY_T *swapped = keys;                                                     \
                keys = other;                                                              \
                other = swapped;                                                           \
            }                                                                              \
            if (n == 1)                                                                    \
                return keys[0];                                                            \
            if (partitions == SPECDEC_QUICKSELECT_PARTITIONS)                              \
                return specdec_select_##SUFFIX(values, count, temperature, z_max, 1, 0,     \
                                               (double)top_k, NULL, scratch);    \
            KEY_T a = keys[0], b = keys[n / 2], c = keys[n - 1];                           \
            pivot = a < b ? (b < c ? b : (a < c ? c : a)) : (a < c ? a : (b < c ? c : b));  \
            specdec_partition_keys_##SUFFIX(keys, n, pivot, other, &larger, &smaller);     \
        }                                                                                  \
    }

SPECDEC_DEFINE_TOP_K_KEY(f, float, uint32_t)
SPECDEC_DEFINE_TOP_K_KEY(d, double, uint64_t)

#endif
