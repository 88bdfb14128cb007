/* The filters' selections over a logits row (logits_law.h's law): the law's scratch, the radix
 * select of a key by count or by mass, top-k's key by quickselect, and the gathering of
 * the entries a filter keeps, so that top-p and the kept sum work on them alone.
 *
 * Each finds a key or a set of entries that the law defines (docs/semantics.md); the key of
 * z and the weights are elementwise.h's, and a histogram's sums run in element order and
 * its walk in bucket order, the same in every build.  The tests build the header with
 * fewer candidates (SPECDEC_TOP_P_CANDIDATES) and without the quickselect
 * (SPECDEC_QUICKSELECT_PARTITIONS = 0) to compare each shortcut with the full scans.
 */
#ifndef SPECDEC_SURVIVORS_H
#define SPECDEC_SURVIVORS_H

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
        while (known_bits < KEY_BITS) {                                                    \
            int shift;                                                                     \
            int width = specdec_select_width(KEY_BITS, known_bits, &shift);                \
            /* The filled buckets are marked in `filled`, words bottom_word to top_word;   \
             * the others hold 0, which adds nothing to the total or to the walk's sums,   \
             * so both visit the marked buckets alone, from the top, and clear them after  \
             * (see the scratch). */                                                       \
            uint64_t filled[(1 << SPECDEC_HISTOGRAM_BITS) / 64] = {0};                     \
            int top_word = -1, bottom_word = (1 << SPECDEC_HISTOGRAM_BITS) / 64;           \
            for (ptrdiff_t i = 0; i < visited; ++i) {                                      \
                ptrdiff_t y = i;                                                           \
                KEY_T key;                                                                 \
                if (members && known_bits > 0) {                                           \
                    y = members[i];                                                        \
                    key = member_keys[i];                                                  \
                } else {                                                                   \
                    key = specdec_key_##SUFFIX(logits[y] / temperature);                   \
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
            for (int word = bottom_word; word <= top_word; ++word)                         \
                for (uint64_t bits = filled[word]; bits; bits &= bits - 1)                 \
                    histogram[64 * word + __builtin_ctzll(bits)] = 0.0;                    \
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

/* Whether any of the 32 bytes of logits at x is at least the threshold: the gather's test
 * of a group that is most often empty. */
#if SPECDEC_HAVE_VECTORS
#define SPECDEC_DEFINE_ANY_AT_LEAST(SUFFIX, T, KEY_T)                                       \
    SPECDEC_INLINE int specdec_any_at_least_##SUFFIX(const T *x, T threshold)              \
    {                                                                                      \
        typedef T group_t __attribute__((vector_size(32)));                               \
        typedef KEY_T mask_t __attribute__((vector_size(32)));                            \
        group_t z, c = (group_t){0} + threshold;                                           \
        memcpy(&z, x, sizeof z);                                                           \
        mask_t hit = (mask_t)(z >= c);                                                     \
        uint64_t words[4];                                                                 \
        memcpy(words, &hit, sizeof words);                                                 \
        return ((words[0] | words[1]) | (words[2] | words[3])) != 0;                       \
    }
#else
#define SPECDEC_DEFINE_ANY_AT_LEAST(SUFFIX, T, KEY_T)                                       \
    static inline int specdec_any_at_least_##SUFFIX(const T *x, T threshold)               \
    {                                                                                      \
        int any = 0;                                                                       \
        for (size_t l = 0; l < 32 / sizeof(T); ++l)                                        \
            any |= x[l] >= threshold;                                                      \
        return any;                                                                        \
    }
#endif

SPECDEC_DEFINE_ANY_AT_LEAST(f, float, uint32_t)
SPECDEC_DEFINE_ANY_AT_LEAST(d, double, uint64_t)

/* The smallest logit l (not NaN) with l / temperature >= threshold (temperature > 0), by
 * bisection over the keys: the division is monotone, so {l >= it} is {l / temperature >=
 * threshold}, and a pass can compare logits without dividing each.  The keys where the
 * test turns are one, whatever the search: it starts from a bracket around threshold *
 * temperature, within a few ulps of the answer, widened in doubling steps, so that it takes
 * a few dependent divisions instead of one per key bit. */
#define SPECDEC_DEFINE_LOGIT_FLOOR(SUFFIX, T, KEY_T, INFINITY_T)                            \
    static T specdec_logit_floor_##SUFFIX(T threshold, T temperature)                      \
    {                                                                                      \
        KEY_T low = specdec_key_##SUFFIX(-INFINITY_T), high = specdec_key_##SUFFIX(INFINITY_T); \
        if (specdec_value_##SUFFIX(low) / temperature >= threshold)                        \
            return specdec_value_##SUFFIX(low);                                            \
        /* value(low) / t < threshold <= value(high) / t (+inf / t is +inf). */             \
        KEY_T guess = specdec_key_##SUFFIX(threshold * temperature), step = 1;             \
        if (SPECDEC_LOGITS_MUTATION == 10 && guess > low && guess < high)                  \
            return specdec_value_##SUFFIX(guess); /* wrong on purpose: the guess itself */ \
        if (guess > low && guess < high) {                                                 \
            if (specdec_value_##SUFFIX(guess) / temperature >= threshold) {                \
                for (high = guess; high - low > step; step *= 2) {                         \
                    if (!(specdec_value_##SUFFIX(high - step) / temperature >= threshold)) { \
                        low = high - step;                                                 \
                        break;                                                             \
                    }                                                                      \
                    high -= step;                                                          \
                }                                                                          \
            } else {                                                                       \
                for (low = guess; high - low > step; step *= 2) {                          \
                    if (specdec_value_##SUFFIX(low + step) / temperature >= threshold) {   \
                        high = low + step;                                                 \
                        break;                                                             \
                    }                                                                      \
                    low += step;                                                           \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        while (high - low > 1) {                                                           \
            KEY_T middle = low + (high - low) / 2;                                         \
            if (specdec_value_##SUFFIX(middle) / temperature >= threshold)                 \
                high = middle;                                                             \
            else                                                                           \
                low = middle;                                                              \
        }                                                                                  \
        return specdec_value_##SUFFIX(high);                                               \
    }

SPECDEC_DEFINE_LOGIT_FLOOR(f, float, uint32_t, (float)INFINITY)
SPECDEC_DEFINE_LOGIT_FLOOR(d, double, uint64_t, (double)INFINITY)

/* The largest logit of x[0 .. n) (n a multiple of 64), -inf when every entry is NaN: NaN
 * never wins, so a block's maximum is at least each of its other entries. */
#if SPECDEC_HAVE_VECTORS
#define SPECDEC_DEFINE_BLOCK_GROUPS(SUFFIX, T, KEY_T)                                       \
    typedef T specdec_block_group_##SUFFIX __attribute__((vector_size(32)));              \
    typedef KEY_T specdec_block_mask_##SUFFIX __attribute__((vector_size(32)));           \
    /* z where z > best, else best (NaN never wins, as in the scalar scan). */             \
    SPECDEC_INLINE specdec_block_group_##SUFFIX specdec_block_larger_##SUFFIX(             \
        specdec_block_group_##SUFFIX z, specdec_block_group_##SUFFIX best)                 \
    {                                                                                      \
        specdec_block_mask_##SUFFIX wins = (specdec_block_mask_##SUFFIX)(z > best);        \
        return (specdec_block_group_##SUFFIX)(((specdec_block_mask_##SUFFIX)z & wins) |    \
                                              ((specdec_block_mask_##SUFFIX)best & ~wins)); \
    }
#define SPECDEC_DEFINE_BLOCK_LARGEST(SUFFIX, T, KEY_T)                                      \
    SPECDEC_INLINE T specdec_block_largest_##SUFFIX(const T *x, ptrdiff_t n)               \
    {                                                                                      \
        typedef specdec_block_group_##SUFFIX group_t;                                      \
        const ptrdiff_t lanes = 32 / sizeof(T);                                            \
        /* Four running maxima, so that the loop is bound by its loads and not by the      \
         * chain of a compare and a select, then the lanes folded by halves (a chain of    \
         * one compare per lane would bound the pass).  A maximum is a selection: the      \
         * grouping changes nothing. */                                                   \
        const group_t lowest = (group_t){0} + (T)-INFINITY;                                \
        group_t best[4] = {lowest, lowest, lowest, lowest};                                \
        for (ptrdiff_t y = 0; y < n; y += 4 * lanes) {                                     \
            for (int j = 0; j < 4; ++j) {                                                  \
                group_t z;                                                                 \
                memcpy(&z, x + y + j * lanes, sizeof z);                                   \
                best[j] = specdec_block_larger_##SUFFIX(z, best[j]);                        \
            }                                                                              \
        }                                                                                  \
        best[0] = specdec_block_larger_##SUFFIX(best[1], best[0]);                          \
        best[2] = specdec_block_larger_##SUFFIX(best[3], best[2]);                          \
        return specdec_fold_largest_##SUFFIX(specdec_block_larger_##SUFFIX(best[2], best[0])); \
    }
#else
#define SPECDEC_DEFINE_BLOCK_LARGEST(SUFFIX, T, KEY_T)                                      \
    static inline T specdec_block_largest_##SUFFIX(const T *x, ptrdiff_t n)                \
    {                                                                                      \
        T largest = (T)-INFINITY;                                                          \
        for (ptrdiff_t y = 0; y < n; ++y)                                                  \
            largest = x[y] > largest ? x[y] : largest;                                     \
        return largest;                                                                    \
    }
#endif

#if SPECDEC_HAVE_VECTORS
SPECDEC_DEFINE_BLOCK_GROUPS(f, float, uint32_t)
SPECDEC_DEFINE_BLOCK_GROUPS(d, double, uint64_t)

/* The largest lane, by halves. */
SPECDEC_INLINE float specdec_fold_largest_f(specdec_block_group_f top)
{
    const specdec_block_mask_f halves = {4, 5, 6, 7, 0, 1, 2, 3};
    const specdec_block_mask_f quarters = {2, 3, 0, 1, 6, 7, 4, 5};
    const specdec_block_mask_f neighbours = {1, 0, 3, 2, 5, 4, 7, 6};
    top = specdec_block_larger_f(__builtin_shuffle(top, halves), top);
    top = specdec_block_larger_f(__builtin_shuffle(top, quarters), top);
    top = specdec_block_larger_f(__builtin_shuffle(top, neighbours), top);
    return top[0];
}

SPECDEC_INLINE double specdec_fold_largest_d(specdec_block_group_d top)
{
    const specdec_block_mask_d halves = {2, 3, 0, 1};
    const specdec_block_mask_d neighbours = {1, 0, 3, 2};
    top = specdec_block_larger_d(__builtin_shuffle(top, halves), top);
    top = specdec_block_larger_d(__builtin_shuffle(top, neighbours), top);
    return top[0];
}
#endif

SPECDEC_DEFINE_BLOCK_LARGEST(f, float, uint32_t)
SPECDEC_DEFINE_BLOCK_LARGEST(d, double, uint64_t)

/* What both gatherings and both block passes below share: keeping a gathered entry (0 when
 * SPECDEC_TOP_P_CANDIDATES are kept already) and the largest logit of a row's last, partial
 * block (NaN never wins). */
#define SPECDEC_DEFINE_GATHER_STEPS(SUFFIX, T)                                              \
    static inline int specdec_keep_##SUFFIX(T value, ptrdiff_t x, T *z_out, ptrdiff_t *y_out, \
                                            ptrdiff_t *count)                              \
    {                                                                                      \
        if (*count == SPECDEC_TOP_P_CANDIDATES)                                            \
            return 0;                                                                      \
        z_out[*count] = value;                                                             \
        y_out[*count] = x;                                                                 \
        ++*count;                                                                          \
        return 1;                                                                          \
    }                                                                                      \
    static inline T specdec_tail_largest_##SUFFIX(const T *logits, ptrdiff_t y, ptrdiff_t V) \
    {                                                                                      \
        T largest = (T)-INFINITY;                                                          \
        for (; y < V; ++y)                                                                 \
            largest = logits[y] > largest ? logits[y] : largest;                           \
        return largest;                                                                    \
    }

SPECDEC_DEFINE_GATHER_STEPS(f, float)
SPECDEC_DEFINE_GATHER_STEPS(d, double)

/* The two passes of top-k's survivors in AVX2 instructions, on x86-64 CPUs that have them
 * (picked at run time, the generic code otherwise): the block maxima with vmaxps, whose
 * max(a, b) is a > b ? a : b, the generic code's select (NaN candidates never win, a tie
 * keeps the running maximum), in the generic code's grouping and fold, so the same bits;
 * the gathering with one mask of a group's hits (its set bits in element order), where the
 * generic code tests the group and then each of its entries.  The tests build the header
 * with SPECDEC_NO_X86_SURVIVORS to compare the two. */
#if SPECDEC_HAVE_VECTORS && defined(__x86_64__) && defined(__GNUC__) &&                    \
    !defined(SPECDEC_NO_X86_SURVIVORS)
#include <immintrin.h>
#define SPECDEC_X86_SURVIVORS 1

static inline int specdec_has_avx2(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") != 0;
    }
    return known;
}

__attribute__((target("avx2"))) static inline __m256 specdec_x86_fold_f(__m256 top)
{
    top = _mm256_max_ps(_mm256_permute2f128_ps(top, top, 1), top); /* halves */
    top = _mm256_max_ps(_mm256_permute_ps(top, 0x4E), top);       /* quarters */
    return _mm256_max_ps(_mm256_permute_ps(top, 0xB1), top);      /* neighbours */
}

__attribute__((target("avx2"))) static inline __m256d specdec_x86_fold_d(__m256d top)
{
    top = _mm256_max_pd(_mm256_permute2f128_pd(top, top, 1), top); /* halves */
    return _mm256_max_pd(_mm256_permute_pd(top, 0x5), top);       /* neighbours */
}

#define SPECDEC_DEFINE_X86_SURVIVORS(SUFFIX, T, VEC, PS, LANES, FIRST)                      \
    __attribute__((target("avx2"))) static void specdec_block_maxima_x86_##SUFFIX(         \
        const T *logits, ptrdiff_t V, ptrdiff_t block, T *maxima)                          \
    {                                                                                      \
        const VEC lowest = _mm256_set1_##PS((T)-INFINITY);                                 \
        ptrdiff_t b = 0, y = 0;                                                            \
        for (; y + block <= V; y += block, ++b) {                                          \
            VEC best[4] = {lowest, lowest, lowest, lowest};                                \
            for (ptrdiff_t x = y; x < y + block; x += 4 * LANES)                           \
                for (int j = 0; j < 4; ++j)                                                \
                    best[j] = _mm256_max_##PS(_mm256_loadu_##PS(logits + x + j * LANES),   \
                                              best[j]);                                    \
            best[0] = _mm256_max_##PS(best[1], best[0]);                                   \
            best[2] = _mm256_max_##PS(best[3], best[2]);                                   \
            maxima[b] = FIRST(specdec_x86_fold_##SUFFIX(_mm256_max_##PS(best[2], best[0]))); \
        }                                                                                  \
        if (y < V)                                                                         \
            maxima[b] = specdec_tail_largest_##SUFFIX(logits, y, V);                       \
    }                                                                                      \
    /* The entries of logits[y .. end) at or above the floor, kept in element order; 0     \
     * when more than SPECDEC_TOP_P_CANDIDATES are. */                                     \
    __attribute__((target("avx2"))) static inline int specdec_gather_block_x86_##SUFFIX(   \
        const T *logits, ptrdiff_t y, ptrdiff_t end, T floor, T *z_out, ptrdiff_t *y_out,  \
        ptrdiff_t *count)                                                                  \
    {                                                                                      \
        const VEC c = _mm256_set1_##PS(floor);                                             \
        ptrdiff_t tested = y; /* the groups before it were tested, four by one mask */    \
        for (; y < end; y += LANES) {                                                      \
            if (y >= tested && y + 4 * LANES <= end) {                                     \
                /* Four groups by one mask first: a block holds about one hit. */          \
                VEC any = _mm256_or_##PS(                                                  \
                    _mm256_or_##PS(                                                        \
                        _mm256_cmp_##PS(_mm256_loadu_##PS(logits + y), c, _CMP_GE_OQ),    \
                        _mm256_cmp_##PS(_mm256_loadu_##PS(logits + y + LANES), c,         \
                                        _CMP_GE_OQ)),                                      \
                    _mm256_or_##PS(                                                        \
                        _mm256_cmp_##PS(_mm256_loadu_##PS(logits + y + 2 * LANES), c,     \
                                        _CMP_GE_OQ),                                       \
                        _mm256_cmp_##PS(_mm256_loadu_##PS(logits + y + 3 * LANES), c,     \
                                        _CMP_GE_OQ)));                                     \
                tested = y + 4 * LANES;                                                    \
                if (!_mm256_movemask_##PS(any)) {                                          \
                    y += 3 * LANES;                                                        \
                    continue;                                                              \
                }                                                                          \
            }                                                                              \
            unsigned hits = 0;                                                             \
            if (y + LANES <= end)                                                          \
                hits = (unsigned)_mm256_movemask_##PS(                                     \
                    _mm256_cmp_##PS(_mm256_loadu_##PS(logits + y), c, _CMP_GE_OQ));        \
            else                                                                           \
                for (ptrdiff_t x = y; x < end; ++x)                                        \
                    hits |= (unsigned)(logits[x] >= floor) << (x - y);                     \
            for (; hits; hits &= hits - 1) {                                               \
                ptrdiff_t x = y + __builtin_ctz(hits);                                     \
                if (!specdec_keep_##SUFFIX(logits[x], x, z_out, y_out, count))             \
                    return 0;                                                              \
            }                                                                              \
        }                                                                                  \
        return 1;                                                                          \
    }                                                                                      \
    /* The blocks whose maximum reaches the floor, found LANES blocks at a time by one     \
     * mask: about one block in ten passes, at random, which a branch per block would      \
     * mispredict. */                                                                      \
    __attribute__((target("avx2"))) static ptrdiff_t specdec_gather_blocks_x86_##SUFFIX(   \
        const T *logits, ptrdiff_t V, ptrdiff_t block, const T *maxima, ptrdiff_t blocks,  \
        T floor, T *z_out, ptrdiff_t *y_out)                                               \
    {                                                                                      \
        const VEC c = _mm256_set1_##PS(floor);                                             \
        ptrdiff_t count = 0;                                                               \
        for (ptrdiff_t first = 0; first < blocks; first += LANES) {                        \
            unsigned passing = 0;                                                          \
            if (first + LANES <= blocks)                                                   \
                passing = (unsigned)_mm256_movemask_##PS(                                  \
                    _mm256_cmp_##PS(_mm256_loadu_##PS(maxima + first), c, _CMP_GE_OQ));    \
            else                                                                           \
                for (ptrdiff_t b = first; b < blocks; ++b)                                 \
                    passing |= (unsigned)(maxima[b] >= floor) << (b - first);              \
            for (; passing; passing &= passing - 1) {                                      \
                ptrdiff_t y = (first + __builtin_ctz(passing)) * block;                    \
                if (!specdec_gather_block_x86_##SUFFIX(logits, y, y + block < V ? y + block : V, \
                                                      floor, z_out, y_out, &count))        \
                    return -1;                                                             \
            }                                                                              \
        }                                                                                  \
        return count;                                                                      \
    }

SPECDEC_DEFINE_X86_SURVIVORS(f, float, __m256, ps, 8, _mm256_cvtss_f32)
SPECDEC_DEFINE_X86_SURVIVORS(d, double, __m256d, pd, 4, _mm256_cvtsd_f64)
#else
#define SPECDEC_X86_SURVIVORS 0
static inline int specdec_has_avx2(void) { return 0; }
#define SPECDEC_DEFINE_X86_SURVIVORS(SUFFIX, T)                                             \
    static inline void specdec_block_maxima_x86_##SUFFIX(const T *logits, ptrdiff_t V,      \
                                                         ptrdiff_t block, T *maxima)       \
    {                                                                                      \
        (void)logits, (void)V, (void)block, (void)maxima;                                  \
    }                                                                                      \
    static inline ptrdiff_t specdec_gather_blocks_x86_##SUFFIX(                            \
        const T *logits, ptrdiff_t V, ptrdiff_t block, const T *maxima, ptrdiff_t blocks,  \
        T floor, T *z_out, ptrdiff_t *y_out)                                               \
    {                                                                                      \
        (void)logits, (void)V, (void)block, (void)maxima, (void)blocks, (void)floor;       \
        (void)z_out, (void)y_out;                                                          \
        return -1;                                                                         \
    }
SPECDEC_DEFINE_X86_SURVIVORS(f, float)
SPECDEC_DEFINE_X86_SURVIVORS(d, double)
#endif

/* Top-k's survivors without the radix select's passes over the whole row.  The row is cut
 * into at most SPECDEC_TOP_P_CANDIDATES blocks (of a multiple of 64 entries), and one pass
 * that only compares logits (no division, no exponential) finds the largest logit of each.
 * The K-th largest of these maxima is the logit of K different entries, so the K-th largest
 * logit of the row is at least it, and so is the K-th largest z at the temperature (the
 * division by t > 0 is monotone): every entry that top-k keeps has a logit at or above the
 * smallest logit whose z reaches that maximum's z (specdec_logit_floor), and lies in a block
 * whose maximum is at or above it too.  Those blocks alone (about K of them on a row without
 * many ties) are read again, and the z values and indices of their entries at or above it
 * are gathered in element order; specdec_top_k_key over them finds the key it finds over the
 * row, since they hold every entry with a key at or above the answer.  Returns how many were
 * gathered (at least `need`), or -1 when the row has fewer than `need` blocks or gathered
 * entries, or more than SPECDEC_TOP_P_CANDIDATES entries pass (many equal logits, say): the
 * caller then selects over the row. */
#define SPECDEC_DEFINE_GATHER_TOP(SUFFIX, T, KEY_T)                                         \
    SPECDEC_CLONES                                                                         \
    static void specdec_block_maxima_##SUFFIX(const T *logits, ptrdiff_t V, ptrdiff_t block, \
                                              T *maxima)                                   \
    {                                                                                      \
        if (SPECDEC_X86_SURVIVORS && specdec_has_avx2()) {                                 \
            specdec_block_maxima_x86_##SUFFIX(logits, V, block, maxima);                    \
            return;                                                                        \
        }                                                                                  \
        ptrdiff_t b = 0, y = 0;                                                            \
        for (; y + block <= V; y += block, ++b)                                            \
            maxima[b] = specdec_block_largest_##SUFFIX(logits + y, block);                 \
        if (y < V)                                                                         \
            maxima[b] = specdec_tail_largest_##SUFFIX(logits, y, V);                       \
    }                                                                                      \
    /* The logits and indices of the entries at or above `floor` in the blocks whose      \
     * maximum reaches it, in element order, a 32-byte group at a time (few pass); -1 when \
     * more than SPECDEC_TOP_P_CANDIDATES do. */                                           \
    SPECDEC_CLONES                                                                         \
    static ptrdiff_t specdec_gather_blocks_##SUFFIX(const T *logits, ptrdiff_t V,           \
                                                    ptrdiff_t block, const T *maxima,      \
                                                    ptrdiff_t blocks, T floor, T *z_out,   \
                                                    ptrdiff_t *y_out)                      \
    {                                                                                      \
        if (SPECDEC_X86_SURVIVORS && specdec_has_avx2())                                   \
            return specdec_gather_blocks_x86_##SUFFIX(logits, V, block, maxima, blocks,     \
                                                      floor, z_out, y_out);                \
        const ptrdiff_t group = 32 / sizeof(T);                                            \
        ptrdiff_t count = 0;                                                               \
        for (ptrdiff_t b = 0; b < blocks; ++b) {                                           \
            if (!(maxima[b] >= floor))                                                     \
                continue;                                                                  \
            ptrdiff_t end = b * block + block < V ? b * block + block : V;                 \
            for (ptrdiff_t y = b * block; y < end; y += group) {                           \
                if (y + group <= end &&                                                    \
                    !specdec_any_at_least_##SUFFIX(logits + y, floor))                       \
                    continue;                                                              \
                for (ptrdiff_t x = y; x < y + group && x < end; ++x) {                     \
                    if (logits[x] >= floor &&                                              \
                        !specdec_keep_##SUFFIX(logits[x], x, z_out, y_out, &count))         \
                        return -1;                                                         \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        return count;                                                                      \
    }                                                                                      \
    static ptrdiff_t specdec_gather_top_##SUFFIX(const T *logits, ptrdiff_t V,              \
                                                 T temperature, int divide, int64_t need,  \
                                                 specdec_law_scratch *scratch)             \
    {                                                                                      \
        const ptrdiff_t most = SPECDEC_TOP_P_CANDIDATES;                                   \
        /* Blocks of 64 entries at the least, more where the row is long against `need`    \
         * (about eight blocks per kept entry, up to 256 entries): each block's maximum    \
         * costs a fold of its lanes and a place in the selection after the pass. */      \
        ptrdiff_t wide = V / (64 * 8 * (ptrdiff_t)(need > 0 ? need : 1));                   \
        wide = wide < 1 ? 1 : wide > 4 ? 4 : wide;                                         \
        const ptrdiff_t least = (V + 64 * most - 1) / (64 * most);                         \
        const ptrdiff_t block = 64 * (least > wide ? least : wide);                        \
        const ptrdiff_t blocks = (V + block - 1) / block;                                  \
        if (need > (int64_t)blocks)                                                        \
            return -1;                                                                     \
        /* The gathered entries' weights are computed only after the gathering: their     \
         * buffer holds the block maxima until then. */                                    \
        T *maxima = scratch->candidate_weights.SUFFIX;                                     \
        specdec_block_maxima_##SUFFIX(logits, V, block, maxima);                           \
        KEY_T key = specdec_top_k_key_##SUFFIX(maxima, blocks, (T)1, need, (T)INFINITY,    \
                                               scratch);                                   \
        if (key < 1)                                                                       \
            return -1;                                                                     \
        T floor = specdec_value_##SUFFIX(key);                                             \
        if (temperature != (T)1) {                                                         \
            T threshold = floor / temperature;                                             \
            if (threshold != threshold)                                                    \
                return -1;                                                                 \
            floor = specdec_logit_floor_##SUFFIX(threshold, temperature);                  \
        }                                                                                  \
        T *z = scratch->candidates.SUFFIX;                                                 \
        ptrdiff_t count = specdec_gather_blocks_##SUFFIX(logits, V, block, maxima, blocks,  \
                                                         floor, z, scratch->positions);    \
        if (count < (ptrdiff_t)need)                                                       \
            return -1;                                                                     \
        if (divide && temperature != (T)1)                                                 \
            for (ptrdiff_t i = 0; i < count; ++i)                                          \
                z[i] = z[i] / temperature;                                                 \
        return count;                                                                      \
    }                                                                                      \
    /* Keep the gathered entries with key >= floor_key, in order; returns how many. */     \
    static ptrdiff_t specdec_compact_##SUFFIX(T *z, ptrdiff_t *y, ptrdiff_t count,          \
                                              KEY_T floor_key)                             \
    {                                                                                      \
        /* Stores at or before the entry read, and no branch on a random outcome. */       \
        ptrdiff_t kept = 0;                                                                \
        for (ptrdiff_t i = 0; i < count; ++i) {                                            \
            T z_i = z[i];                                                                  \
            ptrdiff_t y_i = y[i];                                                          \
            z[kept] = z_i;                                                                 \
            y[kept] = y_i;                                                                 \
            /* Mutation 9 (tests only): the entries at the floor key are dropped. */       \
            kept += SPECDEC_LOGITS_MUTATION == 9 ? specdec_key_##SUFFIX(z_i) > floor_key     \
                                                 : specdec_key_##SUFFIX(z_i) >= floor_key;   \
        }                                                                                  \
        return kept;                                                                       \
    }                                                                                      \
    /* The gathered logits (not divided) whose z at the temperature reaches that of the    \
     * logit of `floor_key`, in order (every one the law may keep when that logit is the  \
     * lowest it keeps: a lower logit can tie with it in z); returns how many. */          \
    static ptrdiff_t specdec_compact_ties_##SUFFIX(T *logits, ptrdiff_t *y, ptrdiff_t count, \
                                                   KEY_T floor_key, T temperature)         \
    {                                                                                      \
        if (temperature != (T)1 && floor_key > 1)                                          \
            floor_key = specdec_key_##SUFFIX(specdec_logit_floor_##SUFFIX(                 \
                specdec_value_##SUFFIX(floor_key) / temperature, temperature));            \
        return specdec_compact_##SUFFIX(logits, y, count, floor_key);                      \
    }                                                                                      \
    /* The weights w = exp(z - z_max) of gathered entries, computed once for the top-p  \
     * select, the kept sum and the row's weights (T holds each exactly: a float32 weight \
     * of a float row, a float64 one of a double row). */                                 \
    SPECDEC_CLONES                                                                         \
    static const T *specdec_candidate_weights_##SUFFIX(const T *z, ptrdiff_t count, T z_max, \
                                                       T *w)                               \
    {                                                                                      \
        for (ptrdiff_t i = 0; i < count; ++i)                                              \
            w[i] = (T)specdec_weight_##SUFFIX(z[i], z_max);                                \
        return w;                                                                          \
    }                                                                                      \
    /* The kept sum of specdec_kept_sum over gathered entries z with weights w: each       \
     * weight goes to the lane of its index, in element order, as the row scan adds it (the \
     * scan adds +0 for the entries it does not keep, which changes no lane). */          \
    static double specdec_kept_sum_gathered_##SUFFIX(const T *z, const T *w,                \
                                                     const ptrdiff_t *y, ptrdiff_t count,  \
                                                     T cutoff)                             \
    {                                                                                      \
        double lanes[8] = {0};                                                             \
        for (ptrdiff_t i = 0; i < count; ++i)                                              \
            if (z[i] >= cutoff)                                                            \
                lanes[y[i] % 8] += (double)w[i];                                           \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }                                                                                      \
                                                                                           \
    /* The law's weights of a row whose kept entries were all gathered: 0 elsewhere, no   \
     * exponential outside them (specdec_row_law's `weights`). */                          \
    static void specdec_gathered_weights_##SUFFIX(const T *z, const T *w,                   \
                                                  const ptrdiff_t *y, ptrdiff_t count,     \
                                                  T cutoff, ptrdiff_t V, T *weights)       \
    {                                                                                      \
        memset(weights, 0, (size_t)V * sizeof(T));                                         \
        for (ptrdiff_t i = 0; i < count; ++i)                                              \
            if (z[i] >= cutoff)                                                            \
                weights[y[i]] = w[i];                                                      \
    }

/* ---- the partitions of top-k's key and the gathering of survivors -------------------- */

/* Each step goes through the entries from `start` on, with its running counts; the fronts
 * below run the sixteen-lane version (AVX-512) over the full groups it can and this one
 * over the rest.  Every key is stored to both sides and each side's count advances by its
 * comparison (no branch on a key, whose side is random: a branch on it mispredicts one time
 * in two, about ten cycles an entry); a store lands at or before the entry being read, and
 * the vector versions store only the lanes they keep (masked), so that neither writes past
 * what these would.
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
SPECDEC_AVX512 static ptrdiff_t specdec_partition_values_f_wide(
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

SPECDEC_AVX512 static ptrdiff_t specdec_partition_keys_f_wide(uint32_t *keys, ptrdiff_t n,
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

SPECDEC_AVX512 static ptrdiff_t specdec_gather_at_or_above_f_wide(
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

#define SPECDEC_WIDE_F(call) (specdec_cpu_has_avx512() ? (call) : 0)
#else
#define SPECDEC_WIDE_F(call) 0
#endif
/* Double rows have no sixteen-lane steps. */
#define SPECDEC_WIDE_D(call) 0

/* The fronts: the sixteen-lane steps where they run, then the one-lane steps. */
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
SPECDEC_DEFINE_GATHER_TOP(f, float, uint32_t)
SPECDEC_DEFINE_GATHER_TOP(d, double, uint64_t)

#endif
