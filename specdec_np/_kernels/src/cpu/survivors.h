/* Top-k's survivors over a logits row (logits_law.h's law): the block maxima, the gathering
 * of the entries a filter keeps, so that top-p and the kept sum work on them alone, and
 * their weights and kept sum; the keys they are gathered at are selections.h's.
 *
 * Each finds a set of entries that the law defines (docs/semantics.md); the key of z and
 * the weights are elementwise.h's, the same in every build.  The tests build the header
 * with fewer candidates (SPECDEC_TOP_P_CANDIDATES) and without the AVX2 code
 * (SPECDEC_NO_X86_AVX2) to compare each shortcut with the full scans.
 */
#ifndef SPECDEC_SURVIVORS_H
#define SPECDEC_SURVIVORS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "selections.h"

/* ---- the gathering ---------------------------------------------------------------- */

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
 * with SPECDEC_NO_X86_AVX2 to compare the two. */
#if SPECDEC_X86_AVX2
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
     * when more than SPECDEC_TOP_P_CANDIDATES are.  Eight groups' hits go into one mask   \
     * (their set bits in element order), so that a block, which holds about one hit,     \
     * costs a branch or two on its hits, not one per group. */                            \
    __attribute__((target("avx2"))) static inline int specdec_gather_block_x86_##SUFFIX(   \
        const T *logits, ptrdiff_t y, ptrdiff_t end, T floor, T *z_out, ptrdiff_t *y_out,  \
        ptrdiff_t *count)                                                                  \
    {                                                                                      \
        const VEC c = _mm256_set1_##PS(floor);                                             \
        for (; y + 8 * LANES <= end; y += 8 * LANES) {                                     \
            uint64_t hits = 0;                                                             \
            for (int j = 0; j < 8; ++j)                                                    \
                hits |= (uint64_t)_mm256_movemask_##PS(_mm256_cmp_##PS(                    \
                            _mm256_loadu_##PS(logits + y + j * LANES), c, _CMP_GE_OQ))     \
                        << (j * LANES);                                                    \
            for (; hits; hits &= hits - 1) {                                               \
                ptrdiff_t x = y + __builtin_ctzll(hits);                                   \
                if (!specdec_keep_##SUFFIX(logits[x], x, z_out, y_out, count))             \
                    return 0;                                                              \
            }                                                                              \
        }                                                                                  \
        for (; y < end; y += LANES) {                                                      \
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
        if (SPECDEC_X86_AVX2 && specdec_has_avx2()) {                                      \
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
        if (SPECDEC_X86_AVX2 && specdec_has_avx2())                                        \
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

SPECDEC_DEFINE_GATHER_TOP(f, float, uint32_t)
SPECDEC_DEFINE_GATHER_TOP(d, double, uint64_t)

#endif
