/* A rank's passes over its slice of columns in verification across vocabulary shards
 * (specdec_np._sharded, docs/semantics.md "Verification across vocabulary shards").
 *
 * A rank holds the columns start .. start + width - 1 of each row.  What it sends and keeps
 * is the law of logits_law.h cut at the protocol's exchanges:
 *
 *   specdec_shard_stats: a row's largest z = l / t (NaN never), its count of +inf z and
 *     its largest finite logit, and the largest logit of each of G sets of columns (set g
 *     holds g, g + G, g + 2 G, ...), whose C-th largest bounds the row's C-th largest;
 *   specdec_shard_weights: w = exp(z - m) over {z >= cutoff} given the row's global
 *     maximum m, stored, and their sum: specdec_kept_sum of logits_law.h, the unsharded
 *     law's own pass (the same exponential and the same eight lanes y mod 8, counted from
 *     the slice's first column), so that with one rank the sums are the unsharded call's;
 *   specdec_shard_at_least: the entries of a slice whose z reaches a threshold (a
 *     candidate list, a filter's kept set), column by column, or their count;
 *   specdec_shard_exp: w = exp(x - m) of some entries, the law's elementwise weight;
 *   specdec_shard_divided: p = w / sum w of a row as the kernels store it, in float64;
 *   specdec_shard_residual, specdec_shard_positive_sum, specdec_shard_first_crossing: a
 *     rejected draw's residual, a draw's mass on the slice and its scan inside the shard
 *     the draw falls in.
 *
 * The maxima are selections (any grouping gives the same value); z = l / t is computed in
 * the rows' dtype as the law does, and fl(l / t) is monotone in l, so the largest z is the
 * largest logit's.  Rows are read with a stride between them (a block of rows in place).
 */
#ifndef SPECDEC_SHARDSCAN_H
#define SPECDEC_SHARDSCAN_H

#include "logits_law.h"

/* Lanes of the running maxima when no sets of columns are asked for. */
#define SPECDEC_SHARD_LANES 32
/* The 32-byte groups that the candidate scan tests at once (most runs of them keep
 * nothing). */
#define SPECDEC_SHARD_RUN_GROUPS 8

/* Whether any of the SPECDEC_SHARD_RUN_GROUPS 32-byte groups at x is at least the threshold:
 * their masks are combined before one test (survivors.h's specdec_any_at_least tests one
 * group), so that a scan that keeps little costs what its loads do. */
#if SPECDEC_HAVE_VECTORS
#define SPECDEC_DEFINE_SHARD_ANY_RUN(SUFFIX, T, KEY_T)                                     \
    SPECDEC_INLINE int specdec_shard_any_run_##SUFFIX(const T *x, T threshold)             \
    {                                                                                      \
        typedef T group_t __attribute__((vector_size(32)));                                \
        typedef KEY_T mask_t __attribute__((vector_size(32)));                             \
        const group_t c = (group_t){0} + threshold;                                        \
        mask_t hit = {0};                                                                  \
        for (int g = 0; g < SPECDEC_SHARD_RUN_GROUPS; ++g) {                               \
            group_t z;                                                                     \
            memcpy(&z, x + g * (ptrdiff_t)(32 / sizeof(T)), sizeof z);                     \
            hit |= (mask_t)(z >= c);                                                       \
        }                                                                                  \
        uint64_t words[4];                                                                 \
        memcpy(words, &hit, sizeof words);                                                 \
        return ((words[0] | words[1]) | (words[2] | words[3])) != 0;                       \
    }
#else
#define SPECDEC_DEFINE_SHARD_ANY_RUN(SUFFIX, T, KEY_T)                                     \
    static inline int specdec_shard_any_run_##SUFFIX(const T *x, T threshold)              \
    {                                                                                      \
        int any = 0;                                                                       \
        for (size_t l = 0; l < SPECDEC_SHARD_RUN_GROUPS * 32 / sizeof(T); ++l)             \
            any |= x[l] >= threshold;                                                      \
        return any;                                                                        \
    }
#endif

SPECDEC_DEFINE_SHARD_ANY_RUN(f, float, uint32_t)
SPECDEC_DEFINE_SHARD_ANY_RUN(d, double, uint64_t)

#define SPECDEC_DEFINE_SHARD_PASSES(SUFFIX, T)                                             \
    /* The larger of best[g] and row[g] for g < count; NaN never wins. */                  \
    SPECDEC_INLINE void specdec_shard_larger_##SUFFIX(T *restrict best,                    \
                                                      const T *restrict row,               \
                                                      ptrdiff_t count)                     \
    {                                                                                      \
        for (ptrdiff_t g = 0; g < count; ++g)                                              \
            best[g] = row[g] > best[g] ? row[g] : best[g];                                 \
    }                                                                                      \
                                                                                           \
    /* One row: stats[0] the largest z, stats[1] its count of +inf z, stats[2] the largest \
     * finite logit; with groups > 0 (2 groups <= width) group_max[g] the largest logit of \
     * set g (-inf where it has none). */                                                  \
    SPECDEC_CLONES                                                                         \
    static void specdec_shard_row_stats_##SUFFIX(const T *row, ptrdiff_t width,            \
                                                 T temperature, ptrdiff_t groups,          \
                                                 double *stats, T *group_max)              \
    {                                                                                      \
        T lanes[SPECDEC_SHARD_LANES];                                                      \
        T *best = groups > 0 ? group_max : lanes;                                          \
        ptrdiff_t step = groups > 0 ? groups : SPECDEC_SHARD_LANES, y = 0;                 \
        for (ptrdiff_t g = 0; g < step; ++g)                                               \
            best[g] = (T)-INFINITY;                                                        \
        for (; y + step <= width; y += step)                                               \
            specdec_shard_larger_##SUFFIX(best, row + y, step);                            \
        T top = (T)-INFINITY;                                                              \
        for (ptrdiff_t g = 0; g < step; ++g)                                               \
            top = best[g] > top ? best[g] : top;                                           \
        for (; y < width; ++y) /* columns past the last whole set */                       \
            top = row[y] > top ? row[y] : top;                                             \
        T largest_finite = top;                                                            \
        if (top == (T)INFINITY) {                                                          \
            largest_finite = (T)-INFINITY;                                                 \
            for (ptrdiff_t x = 0; x < width; ++x)                                          \
                if (row[x] > largest_finite && row[x] < (T)INFINITY)                       \
                    largest_finite = row[x];                                               \
        }                                                                                  \
        T z_max = top / temperature;                                                       \
        int64_t infinite = 0;                                                              \
        if (z_max == (T)INFINITY)                                                          \
            for (ptrdiff_t x = 0; x < width; ++x)                                          \
                infinite += row[x] / temperature == (T)INFINITY;                           \
        stats[0] = (double)z_max;                                                          \
        stats[1] = (double)infinite;                                                       \
        stats[2] = (double)largest_finite;                                                 \
    }                                                                                      \
                                                                                           \
    /* The entries of the row with z = l / t >= threshold (NaN never), column by column:   \
     * their columns and z where columns is not NULL (which then hold one entry more than  \
     * are found: each entry is written before the test that keeps it, so that the pass    \
     * has no branch to mispredict); returns how many.  As in survivors.h's gather, the    \
     * logits are compared with the least logit whose z reaches the threshold (the         \
     * division is monotone: the same entries), and only the entries found are divided. */ \
    SPECDEC_CLONES                                                                         \
    static ptrdiff_t specdec_shard_at_least_##SUFFIX(const T *restrict row,                \
                                                    ptrdiff_t width, T temperature,        \
                                                    T threshold, int64_t *restrict columns, \
                                                    T *restrict values)                    \
    {                                                                                      \
        if (threshold != threshold)                                                        \
            return 0;                                                                      \
        const int divide = temperature != (T)1;                                            \
        const T floor =                                                                    \
            divide ? specdec_logit_floor_##SUFFIX(threshold, temperature) : threshold;     \
        ptrdiff_t found = 0;                                                               \
        if (!columns) {                                                                    \
            for (ptrdiff_t y = 0; y < width; ++y)                                          \
                found += row[y] >= floor;                                                  \
            return found;                                                                  \
        }                                                                                  \
        const ptrdiff_t group = 32 / sizeof(T), run = SPECDEC_SHARD_RUN_GROUPS * group;    \
        ptrdiff_t y = 0;                                                                   \
        while (y + group <= width) {                                                       \
            /* Most runs of eight groups, and most groups, keep nothing: one vector test   \
             * passes each. */                                                             \
            if (y % run == 0 && y + run <= width &&                                        \
                !specdec_shard_any_run_##SUFFIX(row + y, floor)) {                         \
                y += run;                                                                  \
                continue;                                                                  \
            }                                                                              \
            if (!specdec_any_at_least_##SUFFIX(row + y, floor)) {                          \
                y += group;                                                                \
                continue;                                                                  \
            }                                                                              \
            for (ptrdiff_t x = y; x < y + group; ++x) {                                    \
                columns[found] = x;                                                        \
                values[found] = row[x];                                                    \
                found += row[x] >= floor;                                                  \
            }                                                                              \
            y += group;                                                                    \
        }                                                                                  \
        for (; y < width; ++y) {                                                           \
            columns[found] = y;                                                            \
            values[found] = row[y];                                                        \
            found += row[y] >= floor;                                                      \
        }                                                                                  \
        if (divide)                                                                        \
            for (ptrdiff_t i = 0; i < found; ++i)                                          \
                values[i] = values[i] / temperature;                                       \
        return found;                                                                      \
    }

SPECDEC_DEFINE_SHARD_PASSES(f, float)
SPECDEC_DEFINE_SHARD_PASSES(d, double)

/* p = w / normaliser rounded to the rows' dtype as the kernels store a probability (the
 * expression of specdec_law_from_weights), held in float64 for the draws' float64 rows. */
#define SPECDEC_DEFINE_SHARD_DIVIDED(SUFFIX, T)                                            \
    SPECDEC_CLONES                                                                         \
    static void specdec_shard_divided_##SUFFIX(const T *restrict weights, ptrdiff_t width, \
                                               double normaliser, double *restrict out)    \
    {                                                                                      \
        for (ptrdiff_t y = 0; y < width; ++y)                                              \
            out[y] = (double)(T)((double)weights[y] / normaliser);                         \
    }

SPECDEC_DEFINE_SHARD_DIVIDED(f, float)
SPECDEC_DEFINE_SHARD_DIVIDED(d, double)

/* The draws' float64 rows (a residual max(rho p - q, 0), or p), positive parts only (NaN
 * and what is not > 0 weigh nothing).  Their masses are summed as NumPy sums a float64
 * row (its pairwise summation: eight accumulators over blocks of at most 128, halves at
 * multiples of 8 above, after 0), the order the draws' masses have always had, so that
 * a compiled rank sends the same bits; the scan inside the chosen shard runs in column
 * order, as a cumulative sum does. */
SPECDEC_INLINE double specdec_shard_positive(double x)
{
    return x > 0.0 ? x : 0.0;
}

static double specdec_shard_pairwise_sum(const double *a, ptrdiff_t n)
{
    if (n < 8) {
        double sum = 0.0;
        for (ptrdiff_t i = 0; i < n; ++i)
            sum += specdec_shard_positive(a[i]);
        return sum;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; ++j)
            r[j] = specdec_shard_positive(a[j]);
        ptrdiff_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; ++j)
                r[j] += specdec_shard_positive(a[i + j]);
        double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i)
            sum += specdec_shard_positive(a[i]);
        return sum;
    }
    ptrdiff_t half = n / 2;
    half -= half % 8;
    return specdec_shard_pairwise_sum(a, half) + specdec_shard_pairwise_sum(a + half, n - half);
}

/* A rejected draw's residual in place: row = max(scale row - q, 0) (NaN stays NaN; a
 * zero's sign may differ from NumPy's maximum, and weighs nothing either way). */
SPECDEC_CLONES
static void specdec_shard_residual(double *restrict row, const double *restrict q,
                                   ptrdiff_t width, double scale)
{
    for (ptrdiff_t y = 0; y < width; ++y) {
        double x = scale * row[y] - q[y];
        row[y] = x >= 0.0 || x != x ? x : 0.0;
    }
}

/* The row's mass: 0 + its pairwise sum, as NumPy's reduction starts from its identity. */
static double specdec_shard_positive_sum(const double *row, ptrdiff_t width)
{
    return 0.0 + specdec_shard_pairwise_sum(row, width);
}

/* The column of the first positive entry whose running sum (in column order, from 0)
 * exceeds `inside`; else the last positive entry; else the last column. */
static ptrdiff_t specdec_shard_first_crossing(const double *row, ptrdiff_t width,
                                              double inside)
{
    double running = 0.0;
    ptrdiff_t last = width - 1;
    int any = 0;
    for (ptrdiff_t y = 0; y < width; ++y) {
        double x = specdec_shard_positive(row[y]);
        running += x;
        if (x > 0.0) {
            if (running > inside)
                return y;
            last = y;
            any = 1;
        }
    }
    return any ? last : width - 1;
}

/* w = exp(x - m) for float32 entries (specdec_weight_f, eight at a time where the vectors
 * are built: the same exponential, lane by lane), 0 for NaN. */
SPECDEC_CLONES
static void specdec_shard_exp_f(const float *x, const float *m, ptrdiff_t count, float *out)
{
    ptrdiff_t i = 0;
#if SPECDEC_HAVE_VECTORS
    for (; i + 8 <= count; i += 8) {
        specdec_v8f a, b;
        memcpy(&a, x + i, sizeof a);
        memcpy(&b, m + i, sizeof b);
        specdec_v8f w = specdec_fast_expf8(a - b);
        memcpy(out + i, &w, sizeof w);
    }
#endif
    for (; i < count; ++i)
        out[i] = (float)specdec_weight_f(x[i], m[i]);
}

static void specdec_shard_exp_d(const double *x, const double *m, ptrdiff_t count,
                                double *out)
{
    for (ptrdiff_t i = 0; i < count; ++i)
        out[i] = specdec_weight_d(x[i], m[i]);
}

/* The kept sum of a row's slice, w stored where weights is not NULL. */
static double specdec_shard_weights_f(const float *row, ptrdiff_t width, float temperature,
                                      float z_max, float cutoff, float *weights)
{
    return specdec_kept_sum_f(row, width, temperature, z_max, cutoff, weights);
}

static double specdec_shard_weights_d(const double *row, ptrdiff_t width, double temperature,
                                      double z_max, double cutoff, double *weights)
{
    return specdec_kept_sum_d(row, width, temperature, z_max, cutoff, weights);
}

#endif
