/* The processed law of one logits row: temperature, min-p, top-k and top-p, without
 * sorting the vocabulary and without materialising the processed row.
 *
 * The law (docs/semantics.md) is, for a row l of dtype T (float or double):
 *   z = l / temperature in T (NaN counts as -inf and is never kept);
 *   m = max z; w = exp(z - m) (float32-accurate exp below for float rows, libm exp for
 *   double rows), every sum of w in float64;
 *   min-p keeps w >= min_p, top-k keeps z >= the K-th largest z (ties kept), top-p keeps
 *   the smallest most probable set whose mass reaches top_p of what min-p and top-k kept,
 *   plus every token tied with its last one;
 *   p = w / (sum of w over the kept set) on the kept set, 0 elsewhere.
 * Each filter keeps an upper set in z, so the kept set is {y : z(y) >= cutoff}.  A row
 * with +inf entries is uniform over them; a row without a finite maximum has no mass.
 *
 * A row takes two passes: the maximum, then the weights w and their sum (on eight lanes
 * y mod 8).  specdec_row_law can keep the weights of that pass (its `weights` argument,
 * then returns 1), and specdec_law_from_weights turns them into the processed row in
 * place: a row scanned whole costs one exponential per entry, not two.
 *
 * Summation orders are fixed by this code (eight lanes combined as in rowscan.h), and the
 * vector build and the scalar fallback (SPECDEC_NO_VECTOR_EXTENSIONS) give the same bits.
 * Every per-element formula (the exponential, the keys of z, w, an entry's probability and
 * stored value, the min-p bisection, the radix select's decisions) is elementwise.h's,
 * which the CUDA kernels compute too; this header adds how the CPU visits and sums a row.
 *
 * filter_order SPECDEC_FILTER_ORDER_LLAMA_CPP (the contract's code) filters at temperature 1
 * in llama.cpp's order instead (specdec_llama_cpp_law below); any other code is this order.
 *
 * SPECDEC_LOGITS_MUTATION (tests only) compiles deliberately wrong variants, so that the
 * tests can show that they catch them: 1 = top-p drops the tie group at its boundary;
 * 2 = llama.cpp's top-p weighs only what min-p keeps too; 3 = the sixteen-lane pass adds
 * the high half of each sixteen to the lanes before the low half; 4 = the exponential pass
 * split between threads returns the sum of its chunks' sums; 5 = the AVX-512 block sums
 * round every product, without the check for a float32 midpoint; 8 = the draw from a law's
 * survivors adds each to the lane of its rank, not of its index; 9 = the gathered survivors
 * drop the tie group at top-k's key (survivors.h); 12 = the exponential pass in groups adds
 * their weights to the lanes last group first.
 *
 * A row can be split between threads (the scratch's row_threads, rowthreads.h) when the
 * loop over requests runs on one, with the bits of one thread.  The filters' selections
 * (the radix select, top-k's key, the gathered survivors) and the scratch are
 * survivors.h's.
 */
#ifndef SPECDEC_LOGITS_H
#define SPECDEC_LOGITS_H

#include <stdlib.h>

#include "exponentials.h"
#include "rowscan.h"
#include "rowthreads.h"
#include "survivors.h"

/* SPECDEC_INLINE (always inlined vector helpers) comes from rowscan.h. */

/* ---- the two passes of a row: the maximum, then the weights and their sum ------------- */

/* The maximum z and the count of +inf entries (specdec_max_step of elementwise.h). */
#define SPECDEC_DEFINE_ROW_MAX_SCALAR(NAME, SUFFIX, T)                                      \
    SPECDEC_CLONES                                                                         \
    static void NAME(const T *logits, ptrdiff_t V, T temperature, T *z_max,                \
                     int64_t *num_infinite)                                                \
    {                                                                                      \
        T best = (T)-INFINITY;                                                             \
        int64_t infinite = 0;                                                              \
        for (ptrdiff_t y = 0; y < V; ++y)                                                  \
            specdec_max_step_##SUFFIX(logits[y] / temperature, &best, &infinite);          \
        *z_max = best;                                                                     \
        *num_infinite = infinite;                                                          \
    }

SPECDEC_DEFINE_ROW_MAX_SCALAR(specdec_row_max_d, d, double)

/* Sum of w over {z >= cutoff}, lane l taking the entries 8 i + l; with weights not NULL,
 * every w is stored there too (0 where z < cutoff), for the row's one exponential pass. */
#define SPECDEC_DEFINE_KEPT_SUM_SCALAR(NAME, T, WEIGHT)                                     \
    SPECDEC_CLONES                                                                         \
    static double NAME(const T *logits, ptrdiff_t V, T temperature, T z_max, T cutoff,     \
                       T *weights)                                                         \
    {                                                                                      \
        double lanes[8] = {0};                                                             \
        for (ptrdiff_t y = 0; y < V; ++y) {                                                \
            T z = logits[y] / temperature;                                                 \
            double w = z >= cutoff ? WEIGHT(z, z_max) : 0.0;                               \
            if (z >= cutoff)                                                               \
                lanes[y % 8] += w;                                                         \
            if (weights)                                                                   \
                weights[y] = (T)w;                                                         \
        }                                                                                  \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_KEPT_SUM_SCALAR(specdec_kept_sum_d, double, specdec_weight_d)

/* The processed row from the weights the law stored (in place): p = w / normaliser, the
 * bits specdec_kept_probability gives (w is 0 outside the kept set), without a second
 * exponential. */
#define SPECDEC_DEFINE_FROM_WEIGHTS(SUFFIX, T)                                              \
    SPECDEC_CLONES                                                                         \
    static void specdec_law_from_weights_##SUFFIX(T *weights, ptrdiff_t V, double normaliser) \
    {                                                                                      \
        for (ptrdiff_t y = 0; y < V; ++y)                                                  \
            weights[y] = (T)((double)weights[y] / normaliser);                             \
    }

SPECDEC_DEFINE_FROM_WEIGHTS(f, float)
SPECDEC_DEFINE_FROM_WEIGHTS(d, double)

/* Block j's sum of a draw's row p (specdec_residual_sum with q = 0, rho = 1 and scale = 1),
 * dividing the block's kept weights first where normaliser is not 0. */
#define SPECDEC_DEFINE_ONE_BLOCK_SUM(SUFFIX, T)                                             \
    static double specdec_one_block_sum_##SUFFIX(T *p, ptrdiff_t V, double normaliser,     \
                                                 ptrdiff_t block, ptrdiff_t j)             \
    {                                                                                      \
        ptrdiff_t start = j * block, stop = start + block < V ? start + block : V;         \
        if (normaliser != 0.0)                                                             \
            specdec_law_from_weights_##SUFFIX(p + start, stop - start, normaliser);        \
        return specdec_residual_sum_##SUFFIX(p + start, NULL, -1, 1.0, 1.0, 0, stop - start); \
    }

SPECDEC_DEFINE_ONE_BLOCK_SUM(f, float)
SPECDEC_DEFINE_ONE_BLOCK_SUM(d, double)

/* The block sums of an inverse-CDF draw from a processed row p (specdec_residual_sum with
 * q = 0, rho = 1 and scale = 1 over each block [j block, (j + 1) block) of V, block a
 * multiple of 8), dividing kept weights into p first where normaliser is not 0
 * (specdec_law_from_weights, block by block, in place).  Each block's eight lanes are a
 * chain of dependent float64 additions, so four blocks are summed side by side: four
 * independent chains, each in its own order, which changes no bit of any block's sum. */
#if SPECDEC_HAVE_VECTORS
#define SPECDEC_DEFINE_BLOCK_SUMS(NAME, SUFFIX, T)                                          \
    SPECDEC_CLONES                                                                         \
    static void NAME(T *p, ptrdiff_t V, double normaliser, ptrdiff_t block,                \
                     double *block_sums)                                                   \
    {                                                                                      \
        ptrdiff_t num_blocks = (V + block - 1) / block, j = 0;                             \
        for (; j + 4 <= num_blocks && (j + 4) * block <= V; j += 4) {                      \
            specdec_v4d acc[4][2];                                                         \
            memset(acc, 0, sizeof acc);                                                    \
            for (ptrdiff_t y = 0; y < block; y += 8) {                                     \
                for (int b = 0; b < 4; ++b) {                                              \
                    T *x = p + (j + b) * block + y;                                        \
                    if (normaliser != 0.0)                                                 \
                        for (int l = 0; l < 8; ++l)                                        \
                            x[l] = (T)((double)x[l] / normaliser);                         \
                    specdec_residual_sum_##SUFFIX##_plain_group(x, 0, acc[b]);             \
                }                                                                          \
            }                                                                              \
            for (int b = 0; b < 4; ++b) {                                                  \
                double lanes[8];                                                           \
                memcpy(lanes, acc[b], sizeof lanes);                                       \
                block_sums[j + b] = SPECDEC_COMBINE_LANES(lanes);                          \
            }                                                                              \
        }                                                                                  \
        for (; j < num_blocks; ++j)                                                        \
            block_sums[j] = specdec_one_block_sum_##SUFFIX(p, V, normaliser, block, j);    \
    }
#else
#define SPECDEC_DEFINE_BLOCK_SUMS(NAME, SUFFIX, T)                                          \
    static void NAME(T *p, ptrdiff_t V, double normaliser, ptrdiff_t block,                \
                     double *block_sums)                                                   \
    {                                                                                      \
        for (ptrdiff_t j = 0; j * block < V; ++j)                                          \
            block_sums[j] = specdec_one_block_sum_##SUFFIX(p, V, normaliser, block, j);    \
    }
#endif

SPECDEC_DEFINE_BLOCK_SUMS(specdec_block_sums_f_divided, f, float)
SPECDEC_DEFINE_BLOCK_SUMS(specdec_block_sums_d, d, double)

#define SPECDEC_DEFINE_MATERIALISE_SCALAR(SUFFIX, T)                                        \
    SPECDEC_CLONES                                                                         \
    static void specdec_materialise_##SUFFIX##_scalar(const T *logits, ptrdiff_t start,     \
                                                      ptrdiff_t V, T temperature,          \
                                                      const specdec_row_law *law, T *out)  \
    {                                                                                      \
        T z_max = (T)law->z_max, cutoff = (T)law->cutoff;                                  \
        for (ptrdiff_t y = start; y < V; ++y)                                              \
            out[y] = specdec_kept_probability_##SUFFIX(logits[y] / temperature, z_max,      \
                                                       cutoff, law->normaliser);           \
    }

SPECDEC_DEFINE_MATERIALISE_SCALAR(d, double)
SPECDEC_DEFINE_MATERIALISE_SCALAR(f, float)

#if SPECDEC_HAVE_VECTORS

/* The larger of the two, lane by lane; NaN candidates never win. */
SPECDEC_INLINE specdec_v8f specdec_larger8(specdec_v8f candidates, specdec_v8f best)
{
    specdec_v8i wins = candidates > best;
    return (specdec_v8f)(((specdec_v8i)candidates & wins) | ((specdec_v8i)best & ~wins));
}

SPECDEC_INLINE specdec_v8f specdec_splat8(float x)
{
    return (specdec_v8f){x, x, x, x, x, x, x, x};
}

/* W z values from logits + y, -inf past `left` (specdec_load_z8, specdec_load_z16). */
#define SPECDEC_DEFINE_LOAD_Z(W)                                                            \
    SPECDEC_INLINE specdec_v##W##f specdec_load_z##W(const float *logits, ptrdiff_t left,   \
                                                     specdec_v##W##f temperature,          \
                                                     int divide)                           \
    {                                                                                      \
        specdec_v##W##f x;                                                                 \
        if (left >= W) {                                                                   \
            memcpy(&x, logits, sizeof x);                                                  \
        } else {                                                                           \
            float padded[W];                                                               \
            for (int l = 0; l < W; ++l)                                                    \
                padded[l] = l < left ? logits[l] : -INFINITY;                              \
            memcpy(&x, padded, sizeof x);                                                  \
        }                                                                                  \
        /* x / 1 is x bit for bit: skipping the division changes nothing but the time. */ \
        return divide ? x / temperature : x;                                               \
    }

SPECDEC_DEFINE_LOAD_Z(8)

SPECDEC_CLONES
static void specdec_row_max_f(const float *logits, ptrdiff_t V, float temperature,
                              float *z_max, int64_t *num_infinite)
{
    const specdec_v8f t8 = specdec_splat8(temperature);
    const specdec_v8f plus_infinity = specdec_splat8(INFINITY);
    /* Four independent maxima, so that the loop is bound by the loads and not by one chain
     * of compare-and-select; the maximum is a selection, so the grouping changes nothing. */
    specdec_v8f best[4] = {specdec_splat8(-INFINITY), specdec_splat8(-INFINITY),
                           specdec_splat8(-INFINITY), specdec_splat8(-INFINITY)};
    specdec_v8i infinite = {0, 0, 0, 0, 0, 0, 0, 0};
    const int divide = temperature != 1.0f;
    ptrdiff_t y = 0;
    for (; y + 32 <= V; y += 32) {
        for (int j = 0; j < 4; ++j) {
            specdec_v8f z = specdec_load_z8(logits + y + 8 * j, 8, t8, divide);
            best[j] = specdec_larger8(z, best[j]);
            infinite -= (specdec_v8i)(z == plus_infinity);
        }
    }
    for (; y < V; y += 8) {
        specdec_v8f z = specdec_load_z8(logits + y, V - y, t8, divide);
        best[0] = specdec_larger8(z, best[0]);
        infinite -= (specdec_v8i)(z == plus_infinity);
    }
    float result = -INFINITY;
    int64_t count = 0;
    for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 8; ++l)
            result = best[j][l] > result ? best[j][l] : result;
    for (int l = 0; l < 8; ++l)
        count += infinite[l];
    if (result == 0.0f) {
        /* -0 and +0 compare equal, and which one the lanes keep depends on where each zero
         * lies among them; the scalar scan's (the first in element order) is the one, so
         * a maximum of zero is found again in element order (the sign is visible in the
         * law's z_max). */
        int64_t ignored = 0;
        result = -INFINITY;
        for (ptrdiff_t x = 0; x < V; ++x)
            specdec_max_step_f(logits[x] / temperature, &result, &ignored);
    }
    *z_max = result;
    *num_infinite = count;
}

/* ---- the exponential pass: sixteen lanes (AVX-512), or eight in groups (AVX2) ---------- */

/* Whether any lane of a comparison's mask is set. */
SPECDEC_INLINE int specdec_any8(specdec_v8i mask)
{
    uint64_t words[4];
    memcpy(words, &mask, sizeof words);
    return ((words[0] | words[1]) | (words[2] | words[3])) != 0;
}

SPECDEC_INLINE int specdec_any16(specdec_v16i mask)
{
    uint64_t words[8];
    memcpy(words, &mask, sizeof words);
    return ((words[0] | words[1]) | (words[2] | words[3]) | (words[4] | words[5]) |
            (words[6] | words[7])) != 0;
}

/* lanes[l] += w[l] (and then += w[8 + l]): element order on the eight lanes. */
SPECDEC_INLINE void specdec_add_lanes16(specdec_v16f w, specdec_lanes16 *lanes)
{
    specdec_v8f half[2];
    memcpy(half, &w, sizeof half);
    const int first = SPECDEC_LOGITS_MUTATION == 3; /* wrong on purpose: the high half first */
    *lanes += __builtin_convertvector(half[first], specdec_v8d);
    *lanes += __builtin_convertvector(half[1 - first], specdec_v8d);
}

SPECDEC_DEFINE_LOAD_Z(16)

/* Sixteen lanes run on the CPUs that have AVX-512, from a function compiled for it alone
 * and chosen at run time (SPECDEC_AVX512_PATH, rowscan.h): GCC 12 lowers the masks of
 * sixteen-lane code one lane at a time in target_clones' clones and in helpers compiled for
 * the baseline CPU (so the group below is a macro). */

/* One group of W lanes of a kept sum at logits + y (`left` >= W: a full group), in the
 * function below (t_, m_, c_ and lanes are its; ADD_LANES adds W weights to the lanes).
 * The exponential of a group that keeps nothing is skipped (its weights are +0, which
 * leaves every lane as it is); with no cutoff every non-NaN entry is kept, so no group is
 * tested. */
#define SPECDEC_KEPT_GROUP(W, ADD_LANES, y, left, divide, filtered, weights)               \
    do {                                                                                   \
        specdec_v##W##f z_ = specdec_load_z##W(logits + (y), (left), t_, (divide));        \
        specdec_v##W##i kept_ = (specdec_v##W##i)(z_ >= c_);                               \
        specdec_v##W##f w_ = specdec_splat##W(0.0f);                                       \
        if (!(filtered) || specdec_any##W(kept_)) {                                        \
            w_ = (specdec_v##W##f)((specdec_v##W##i)specdec_fast_expf##W(z_ - m_) & kept_); \
            ADD_LANES(w_, &lanes);                                                         \
        }                                                                                  \
        if (weights) {                                                                     \
            if ((left) >= W)                                                               \
                memcpy((weights) + (y), &w_, sizeof w_);                                   \
            else                                                                           \
                memcpy((weights) + (y), &w_, (size_t)(left) * sizeof(float));              \
        }                                                                                  \
    } while (0)

/* SPECDEC_EXP_GROUPS full groups of W lanes side by side (exponentials.h), without a
 * cutoff; each adds its weights to the lanes in element order, like SPECDEC_KEPT_GROUP.
 * Without a cutoff the kept set is every z that is not NaN, and the exponential's own
 * mask already gives 0 where z - z_max is NaN or -inf, so no comparison of z is needed. */
#define SPECDEC_KEPT_GROUPS(W, ADD_LANES, y, divide, weights)                              \
    do {                                                                                   \
        enum { groups_ = SPECDEC_EXP_GROUPS };                                             \
        specdec_v##W##f x_[SPECDEC_EXP_GROUPS], w_[SPECDEC_EXP_GROUPS];                    \
        SPECDEC_EACH_GROUP(                                                                \
            x_[g_] = specdec_load_z##W(logits + (y) + W * g_, W, t_, (divide)) - m_)       \
        specdec_fast_expf##W##_groups(x_, w_);                                             \
        SPECDEC_EACH_GROUP(                                                                \
            ADD_LANES(w_[SPECDEC_LOGITS_MUTATION == 12 ? groups_ - 1 - g_ : g_], &lanes);  \
            if (weights) memcpy((weights) + (y) + W * g_, &w_[g_], sizeof w_[g_]))         \
    } while (0)

/* Sum of w over {z >= cutoff} on the lanes y mod 8, W lanes at a time (SPECDEC_EXP_GROUPS
 * groups at a time without a cutoff where GROUPED); with weights not NULL every w is stored
 * there too (0 where z < cutoff).  Each case of the loop is written out, so that the common
 * one (temperature 1, no cutoff) runs without a test per group. */
#define SPECDEC_DEFINE_KEPT_SUM_F(NAME, ATTRIBUTES, W, GROUPED, ADD_LANES)               \
    ATTRIBUTES static double NAME(const float *logits, ptrdiff_t V, float temperature,     \
                                  float z_max, float cutoff, float *weights)               \
    {                                                                                      \
        const specdec_v##W##f t_ = specdec_splat##W(temperature);                          \
        const specdec_v##W##f m_ = specdec_splat##W(z_max), c_ = specdec_splat##W(cutoff); \
        const int divide = temperature != 1.0f, filtered = cutoff > -INFINITY;             \
        const ptrdiff_t step = W * SPECDEC_EXP_GROUPS;                                     \
        specdec_lanes##W lanes;                                                            \
        memset(&lanes, 0, sizeof lanes);                                                   \
        ptrdiff_t y = 0;                                                                   \
        if ((GROUPED) && !filtered) {                                                      \
            if (divide)                                                                    \
                for (; y + step <= V; y += step)                                           \
                    SPECDEC_KEPT_GROUPS(W, ADD_LANES, y, 1, weights);                      \
            else if (weights)                                                              \
                for (; y + step <= V; y += step)                                           \
                    SPECDEC_KEPT_GROUPS(W, ADD_LANES, y, 0, weights);                      \
            else                                                                           \
                for (; y + step <= V; y += step)                                           \
                    SPECDEC_KEPT_GROUPS(W, ADD_LANES, y, 0, (float *)NULL);                \
        }                                                                                  \
        if (!divide && !filtered) {                                                        \
            if (weights)                                                                   \
                for (; y + W <= V; y += W)                                                 \
                    SPECDEC_KEPT_GROUP(W, ADD_LANES, y, W, 0, 0, weights);                 \
            else                                                                           \
                for (; y + W <= V; y += W)                                                 \
                    SPECDEC_KEPT_GROUP(W, ADD_LANES, y, W, 0, 0, (float *)NULL);           \
        } else {                                                                           \
            for (; y + W <= V; y += W)                                                     \
                SPECDEC_KEPT_GROUP(W, ADD_LANES, y, W, divide, filtered, weights);         \
        }                                                                                  \
        if (y < V)                                                                         \
            SPECDEC_KEPT_GROUP(W, ADD_LANES, y, V - y, divide, filtered, weights);         \
        double sums[8];                                                                    \
        memcpy(sums, &lanes, sizeof sums);                                                 \
        return SPECDEC_COMBINE_LANES(sums);                                                \
    }

SPECDEC_DEFINE_KEPT_SUM_F(specdec_kept_sum_f_narrow, SPECDEC_CLONES, 8, 0,
                          specdec_add_lanes8)

#if SPECDEC_X86_AVX2
SPECDEC_DEFINE_KEPT_SUM_F(specdec_kept_sum_f_avx2, SPECDEC_AVX2, 8, 1,
                          specdec_add_lanes8_avx2)
#endif

#if SPECDEC_AVX512_PATH
SPECDEC_DEFINE_KEPT_SUM_F(specdec_kept_sum_f_wide, SPECDEC_AVX512, 16, 1,
                          specdec_add_lanes16)
#endif

static double specdec_kept_sum_f(const float *logits, ptrdiff_t V, float temperature,
                                 float z_max, float cutoff, float *weights)
{
#if SPECDEC_AVX512_PATH
    if (specdec_cpu_has_avx512())
        return specdec_kept_sum_f_wide(logits, V, temperature, z_max, cutoff, weights);
#endif
#if SPECDEC_X86_AVX2
    if (specdec_has_avx2())
        return specdec_kept_sum_f_avx2(logits, V, temperature, z_max, cutoff, weights);
#endif
    return specdec_kept_sum_f_narrow(logits, V, temperature, z_max, cutoff, weights);
}

SPECDEC_CLONES
static void specdec_materialise_f_vector(const float *logits, ptrdiff_t V, float temperature,
                                         const specdec_row_law *law, float *out)
{
    const specdec_v8f t8 = specdec_splat8(temperature), m8 = specdec_splat8((float)law->z_max);
    const specdec_v8f c8 = specdec_splat8((float)law->cutoff);
    const double s = law->normaliser;
    const specdec_v4d s4 = {s, s, s, s};
    ptrdiff_t y = 0;
    for (; y + 8 <= V; y += 8) {
        specdec_v8f z = specdec_load_z8(logits + y, 8, t8, 1);
        specdec_v8i kept = (specdec_v8i)(z >= c8);
        specdec_v4d w_low, w_high;
        specdec_widen8(specdec_fast_expf8(z - m8), &w_low, &w_high);
        specdec_v8f p = specdec_join8(__builtin_convertvector(w_low / s4, specdec_v4f),
                                      __builtin_convertvector(w_high / s4, specdec_v4f));
        p = (specdec_v8f)((specdec_v8i)p & kept);
        memcpy(out + y, &p, sizeof p);
    }
    specdec_materialise_f_scalar(logits, y, V, temperature, law, out);
}

#else

SPECDEC_DEFINE_ROW_MAX_SCALAR(specdec_row_max_f, f, float)
SPECDEC_DEFINE_KEPT_SUM_SCALAR(specdec_kept_sum_f, float, specdec_weight_f)

static void specdec_materialise_f_vector(const float *logits, ptrdiff_t V, float temperature,
                                         const specdec_row_law *law, float *out)
{
    specdec_materialise_f_scalar(logits, 0, V, temperature, law, out);
}

#endif

/* ---- a float row's block sums on AVX-512: the division by products -------------------- */

/* The draw's block sums of a float row (specdec_block_sums_f_divided's bits) at the cost of
 * a product per entry instead of a float64 division, on the CPUs that have AVX-512.  With
 * r = 1 / n rounded (n >= 1), t = w r is within three float64 ulps of w / n (two
 * roundings; six across a power of 2), so rounding t to float32 gives the bits of rounding
 * w / n to float64 and then to float32, unless a float32 midpoint lies within 32 ulps of t
 * (the 29 bits of t below a float32's 24 are within 32 of 1 followed by 28 zeros) or t is
 * a float32 subnormal (fewer bits): then, about once in 2^23 entries, the group of eight
 * is divided.  Groups of four full blocks are done here (returns how many blocks), the
 * rest by the division.  Mutation 5 (tests only) skips the check. */
#if SPECDEC_HAVE_VECTORS && SPECDEC_AVX512_PATH

#define SPECDEC_DIVIDED_GROUP_WIDE(x, acc)                                                  \
    do {                                                                                   \
        __m512d t_ = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x)), reciprocal);        \
        __m512i from_ = _mm512_add_epi64(                                                  \
            _mm512_and_si512(_mm512_castpd_si512(t_), low_bits), from_midpoint);           \
        __mmask8 exact_ = _mm512_cmp_epu64_mask(from_, near, _MM_CMPINT_LE) |              \
                          (_mm512_cmp_pd_mask(t_, smallest_normal, _CMP_LT_OQ) &           \
                           _mm512_cmp_pd_mask(t_, zero, _CMP_NEQ_OQ));                     \
        __m512d p_;                                                                        \
        if (exact_ && SPECDEC_LOGITS_MUTATION != 5) {                                      \
            for (int l_ = 0; l_ < 8; ++l_)                                                 \
                (x)[l_] = (float)((double)(x)[l_] / normaliser);                           \
            p_ = _mm512_cvtps_pd(_mm256_loadu_ps(x));                                      \
        } else {                                                                           \
            __m256 rounded_ = _mm512_cvtpd_ps(t_);                                         \
            _mm256_storeu_ps((x), rounded_);                                               \
            p_ = _mm512_cvtps_pd(rounded_);                                                \
        }                                                                                  \
        /* specdec_positive_part: p where p > 0, else +0. */                               \
        (acc) = _mm512_add_pd((acc), _mm512_maskz_mov_pd(                                  \
                                         _mm512_cmp_pd_mask(p_, zero, _CMP_GT_OQ), p_));   \
    } while (0)

SPECDEC_AVX512 static ptrdiff_t
specdec_block_sums_f_wide(float *p, ptrdiff_t V, double normaliser, ptrdiff_t block,
                          double *block_sums)
{
    const __m512d reciprocal = _mm512_set1_pd(1.0 / normaliser);
    const __m512i low_bits = _mm512_set1_epi64(0x1fffffff);
    const __m512i from_midpoint = _mm512_set1_epi64(32 - 0x10000000);
    const __m512i near = _mm512_set1_epi64(64);
    const __m512d smallest_normal = _mm512_set1_pd(0x1p-126), zero = _mm512_setzero_pd();
    ptrdiff_t num_blocks = (V + block - 1) / block, j = 0;
    for (; j + 4 <= num_blocks && (j + 4) * block <= V; j += 4) {
        __m512d acc0 = zero, acc1 = zero, acc2 = zero, acc3 = zero;
        for (ptrdiff_t y = 0; y < block; y += 8) {
            SPECDEC_DIVIDED_GROUP_WIDE(p + j * block + y, acc0);
            SPECDEC_DIVIDED_GROUP_WIDE(p + (j + 1) * block + y, acc1);
            SPECDEC_DIVIDED_GROUP_WIDE(p + (j + 2) * block + y, acc2);
            SPECDEC_DIVIDED_GROUP_WIDE(p + (j + 3) * block + y, acc3);
        }
        double lanes[4][8];
        _mm512_storeu_pd(lanes[0], acc0);
        _mm512_storeu_pd(lanes[1], acc1);
        _mm512_storeu_pd(lanes[2], acc2);
        _mm512_storeu_pd(lanes[3], acc3);
        for (int b = 0; b < 4; ++b)
            block_sums[j + b] = SPECDEC_COMBINE_LANES(lanes[b]);
    }
    return j;
}
#endif

/* The block sums of an inverse-CDF draw from a float row (specdec_block_sums_f_divided). */
static void specdec_block_sums_f(float *p, ptrdiff_t V, double normaliser, ptrdiff_t block,
                                 double *block_sums)
{
    ptrdiff_t done = 0;
#if SPECDEC_HAVE_VECTORS && SPECDEC_AVX512_PATH
    if (normaliser >= 1.0 && normaliser < INFINITY && block % 8 == 0 &&
        specdec_cpu_has_avx512())
        done = specdec_block_sums_f_wide(p, V, normaliser, block, block_sums);
#endif
    if (done * block < V)
        specdec_block_sums_f_divided(p + done * block, V - done * block, normaliser, block,
                                     block_sums + done);
}

/* ---- threads inside a row (rowthreads.h) -------------------------------------------- */

SPECDEC_DEFINE_ROW_PASSES(f, float, specdec_row_max_f, specdec_kept_sum_f)
SPECDEC_DEFINE_ROW_PASSES(d, double, specdec_row_max_d, specdec_kept_sum_d)

/* ---- the maximum from top-k's survivors ------------------------------------------------ */

/* specdec_row_law's `gathered` when it gathered nothing (it did not try, or the maximum below
 * could not be trusted); -1 is a gathering that failed. */
#define SPECDEC_NOT_GATHERED (-2)

/* The row's maximum z and count of +inf z from the entries gathered in element order with
 * z >= some threshold, which hold every z equal to the maximum: what the row scan finds
 * (specdec_max_step, the first of the tied zeros in element order).  `values` are z
 * (temperature 1) or logits gathered at temperature 1 (llama.cpp's order), of which z =
 * l / temperature: then an entry left out can still tie with the maximum once divided, and
 * a maximum of zero (its sign) or of +inf (the count) is not trusted (returns 0). */
#define SPECDEC_DEFINE_GATHERED_MAX(SUFFIX, T)                                              \
    static int specdec_gathered_max_##SUFFIX(const T *values, ptrdiff_t count, T temperature, \
                                             T *z_max, int64_t *num_infinite)              \
    {                                                                                      \
        T best = (T)-INFINITY;                                                             \
        int64_t infinite = 0;                                                              \
        for (ptrdiff_t i = 0; i < count; ++i)                                              \
            specdec_max_step_##SUFFIX(values[i], &best, &infinite);                        \
        if (temperature != (T)1) {                                                         \
            /* A correctly rounded division by t > 0 is monotone: the largest l / t is     \
             * (largest l) / t, one division; when it is finite, no z is +inf. */          \
            best = best / temperature;                                                     \
            infinite = 0;                                                                  \
        }                                                                                  \
        *z_max = best;                                                                     \
        *num_infinite = infinite;                                                          \
        return temperature == (T)1 || !(best == (T)0 || best == (T)INFINITY);              \
    }

SPECDEC_DEFINE_GATHERED_MAX(f, float)
SPECDEC_DEFINE_GATHERED_MAX(d, double)

/* ---- llama.cpp's filter order ---------------------------------------------------------- */

#ifndef SPECDEC_FILTER_ORDER_LLAMA_CPP
#error "the kernel contract's macros must be defined first (setup.py, specdec_np/_kernels/cuda.py's prelude)"
#endif

/* The cutoff and normaliser of a row law in llama.cpp's order (docs/semantics.md §12), for
 * a row with mass and a finite maximum z_max; `weights` and the result as in
 * specdec_row_law (below).  The filters
 * read the logits l at temperature 1, with w1 = exp(l - max l): top-k keeps l >= the K-th
 * largest l (ties kept), top-p keeps, of what top-k kept, the smallest most probable set
 * whose w1 reaches top_p of top-k's, with the tie group of the token that reaches it, and
 * min-p keeps w1 >= min_p (max l is the maximum of the row and of every kept set).  Each
 * keeps an upper set in l: S1 = {y : key(l(y)) >= floor_key}.  At the temperature the law
 * keeps {y : z(y) >= z of S1's lowest logit}: S1, and a token whose z rounds to that z
 * (ties at the temperature are kept, as everywhere in the law). */
#define SPECDEC_DEFINE_LLAMA_CPP_LAW(SUFFIX, T, KEY_T, KEPT_SUM)                            \
    static int specdec_llama_cpp_law_##SUFFIX(const T *logits, ptrdiff_t V, T temperature,  \
                                              T z_max, int64_t top_k, double top_p,        \
                                              double min_p, ptrdiff_t gathered,            \
                                              specdec_law_scratch *scratch, T *weights,    \
                                              specdec_row_law *law)                        \
    {                                                                                      \
        KEY_T floor_key = 1; /* NaN (key 0) is never kept */                               \
        /* Top-k's survivors, gathered (count >= 0) when they fit: they hold the row's     \
         * maximum and every token a later filter keeps, and every other logit is below    \
         * the smallest of them. */                                                        \
        T *candidates = scratch->candidates.SUFFIX;                                        \
        ptrdiff_t *positions = scratch->positions;                                         \
        ptrdiff_t count = -1;                                                              \
        if (top_k > 0 && top_k < (int64_t)V) {                                             \
            /* Counting selects read no weight: z_max stands in for max l.  `gathered`:    \
             * the row law gathered them already (SPECDEC_NOT_GATHERED: it did not). */     \
            count = gathered != SPECDEC_NOT_GATHERED                                       \
                        ? gathered                                                         \
                        : specdec_gather_top_##SUFFIX(logits, V, temperature, 0, top_k, scratch); \
            KEY_T k_key = count >= 0                                                       \
                              ? specdec_top_k_key_##SUFFIX(candidates, count, (T)1, top_k, \
                                                           z_max, scratch)                 \
                              : specdec_select_##SUFFIX(logits, V, (T)1, z_max, 1, 0,       \
                                                        (double)top_k, NULL, scratch);     \
            /* 0: fewer than top_k entries that are not NaN, and every one is kept. */     \
            floor_key = k_key > floor_key ? k_key : floor_key;                             \
            if (count >= 0)                                                                \
                count = specdec_compact_ties_##SUFFIX(candidates, positions, count, floor_key, \
                                                      temperature);                        \
        }                                                                                  \
        /* l / 1 is l, so at temperature 1 the largest logit is z_max. */                  \
        const T *scanned = count >= 0 ? candidates : logits;                               \
        const ptrdiff_t scanned_count = count >= 0 ? count : V;                            \
        T l_max = z_max;                                                                   \
        if (temperature != (T)1) {                                                         \
            l_max = (T)-INFINITY;                                                          \
            for (ptrdiff_t i = 0; i < scanned_count; ++i)                                  \
                l_max = scanned[i] > l_max ? scanned[i] : l_max;                           \
        }                                                                                  \
        if (top_p < 1.0) {                                                                 \
            /* Over top-k's set alone: llama.cpp runs min-p after top-p. */                \
            KEY_T p_floor = floor_key;                                                     \
            if (SPECDEC_LOGITS_MUTATION == 2 && min_p > 0.0) {                             \
                /* wrong on purpose: top-p's mass over min-p's set too (vLLM's order) */   \
                KEY_T m_key = specdec_min_p_floor_##SUFFIX(l_max, min_p);                  \
                p_floor = m_key > p_floor ? m_key : p_floor;                               \
            }                                                                              \
            /* The weights at temperature 1 once, not in each pass of the select. */     \
            const T *w1 = count < 0 ? NULL : specdec_candidate_weights_##SUFFIX(          \
                candidates, count, l_max, scratch->candidate_weights.SUFFIX);              \
            KEY_T p_key = specdec_select_##SUFFIX(scanned, scanned_count, (T)1, l_max,     \
                                                  p_floor, 1, top_p, w1, scratch);          \
            floor_key = p_key > floor_key ? p_key : floor_key;                             \
        }                                                                                  \
        int min_p_decides = 0;                                                             \
        if (min_p > 0.0) {                                                                 \
            KEY_T m_key = specdec_min_p_floor_##SUFFIX(l_max, min_p);                      \
            min_p_decides = m_key > floor_key;                                             \
            floor_key = min_p_decides ? m_key : floor_key;                                 \
        }                                                                                  \
        if (floor_key <= 1) {                                                              \
            law->cutoff = -INFINITY;                                                       \
            law->normaliser = KEPT_SUM(logits, V, temperature, z_max, (T)-INFINITY, weights, \
                                       scratch->row_threads);                              \
            return weights != NULL;                                                        \
        }                                                                                  \
        /* Top-k's and top-p's keys are those of entries; min-p's bisection key need not   \
         * be, and at another temperature the lowest kept logit itself is needed. */       \
        T lowest = specdec_value_##SUFFIX(floor_key);                                      \
        if (min_p_decides && temperature != (T)1) {                                        \
            lowest = (T)INFINITY;                                                          \
            for (ptrdiff_t i = 0; i < scanned_count; ++i)                                  \
                if (specdec_key_##SUFFIX(scanned[i]) >= floor_key && scanned[i] < lowest)   \
                    lowest = scanned[i];                                                   \
        }                                                                                  \
        T cutoff = lowest / temperature;                                                   \
        law->cutoff = (double)cutoff;                                                      \
        /* The gathered logits hold every one whose z reaches that of top-k's lowest       \
         * (specdec_compact_ties: a lower logit may tie with it in z), so every token the \
         * law keeps: the sum over their z is the row scan's. */                          \
        if (count >= 0) {                                                                  \
            for (ptrdiff_t i = 0; i < count; ++i)                                          \
                candidates[i] = candidates[i] / temperature;                               \
            const T *w = specdec_candidate_weights_##SUFFIX(                               \
                candidates, count, z_max, scratch->candidate_weights.SUFFIX);              \
            law->normaliser = specdec_kept_sum_gathered_##SUFFIX(candidates, w, positions, \
                                                                 count, cutoff);           \
            scratch->survivors = count;                                                    \
            if (!weights)                                                                  \
                return 0;                                                                  \
            specdec_gathered_weights_##SUFFIX(candidates, w, positions, count, cutoff, V,  \
                                              weights);                                    \
            return 1;                                                                      \
        }                                                                                  \
        law->normaliser = KEPT_SUM(logits, V, temperature, z_max, cutoff, weights,          \
                                   scratch->row_threads);                                  \
        return weights != NULL;                                                            \
    }

SPECDEC_DEFINE_LLAMA_CPP_LAW(f, float, uint32_t, specdec_law_kept_sum_f)
SPECDEC_DEFINE_LLAMA_CPP_LAW(d, double, uint64_t, specdec_law_kept_sum_d)

/* ---- public entry points ------------------------------------------------------------------ */

/* The law of a row: the cutoff, given m and the count of +inf entries (-inf when no filter
 * drops anything; min-p needs no pass over the row, specdec_min_p_floor), and the
 * normaliser.  With `weights` (V entries, not NULL), the weights of the row's exponential
 * pass are kept there (0 outside the kept set; a row whose kept entries were all gathered
 * gets zeros and their weights alone): then it returns 1 (and the row needs
 * specdec_law_from_weights alone), else 0 (a row with +inf entries or without mass).
 * `filter_order` SPECDEC_FILTER_ORDER_LLAMA_CPP filters in llama.cpp's order
 * (specdec_llama_cpp_law), any other code in vLLM's. */
#define SPECDEC_DEFINE_ROW_LAW(SUFFIX, T, KEY_T, ROW_MAX, KEPT_SUM)                         \
    static int specdec_row_law_##SUFFIX(const T *logits, ptrdiff_t V, T temperature,        \
                                        int64_t top_k, double top_p, double min_p,         \
                                        int filter_order, specdec_law_scratch *scratch,    \
                                        T *weights, specdec_row_law *law)                  \
    {                                                                                      \
        T z_max;                                                                           \
        int64_t num_infinite;                                                              \
        scratch->survivors = -1;                                                           \
        /* Top-k's survivors first, where they are gathered from a long row: they hold the \
         * row's maximum, so that a row costs one pass that compares logits (no division, \
         * no exponential) and the rest works on the survivors alone. */                   \
        ptrdiff_t gathered = SPECDEC_NOT_GATHERED;                                         \
        if (top_k > 0 && top_k < (int64_t)V && V > SPECDEC_TOP_P_CANDIDATES) {             \
            int llama = filter_order == SPECDEC_FILTER_ORDER_LLAMA_CPP;                    \
            /* Counting selects read no weight: the maximum is not needed yet. */          \
            gathered = specdec_gather_top_##SUFFIX(logits, V, temperature, !llama, top_k,  \
                                                   scratch);                               \
            if (gathered >= 0 &&                                                           \
                !specdec_gathered_max_##SUFFIX(scratch->candidates.SUFFIX, gathered,       \
                                               llama ? temperature : (T)1, &z_max,         \
                                               &num_infinite))                             \
                gathered = SPECDEC_NOT_GATHERED;                                           \
        }                                                                                  \
        if (gathered < 0)                                                                  \
            ROW_MAX(logits, V, temperature, &z_max, &num_infinite, scratch->row_threads);  \
        law->z_max = (double)z_max;                                                        \
        law->num_infinite = num_infinite;                                                  \
        law->status = 0;                                                                   \
        /* Where the largest z is finite it is that of the largest finite logit, which    \
         * then does not overflow: only a row with +inf or without a finite z is read     \
         * again for it. */                                                               \
        if (scratch->finds_overflow && temperature < (T)1 &&                               \
            (num_infinite > 0 || !(z_max > (T)-INFINITY)) &&                               \
            specdec_overflows_##SUFFIX(logits, V, temperature)) {                          \
            law->status = 2;                                                               \
            law->cutoff = INFINITY;                                                        \
            law->normaliser = 0.0;                                                         \
            return 0;                                                                      \
        }                                                                                  \
        if (num_infinite > 0) {                                                            \
            law->cutoff = INFINITY;                                                        \
            law->normaliser = (double)num_infinite;                                        \
            return 0;                                                                      \
        }                                                                                  \
        if (!(z_max > (T)-INFINITY)) {                                                     \
            law->status = 1;                                                               \
            law->cutoff = INFINITY;                                                        \
            law->normaliser = 0.0;                                                         \
            return 0;                                                                      \
        }                                                                                  \
        if (filter_order == SPECDEC_FILTER_ORDER_LLAMA_CPP) {                              \
            return specdec_llama_cpp_law_##SUFFIX(logits, V, temperature, z_max, top_k, top_p, \
                                                  min_p, gathered, scratch, weights, law); \
        }                                                                                  \
        KEY_T floor_key = 1; /* NaN (key 0) is never kept */                               \
        if (min_p > 0.0)                                                                   \
            floor_key = specdec_min_p_floor_##SUFFIX(z_max, min_p);                        \
        /* Top-k's survivors, gathered (count >= 0) when they fit: top-p and the kept sum \
         * then work on them alone, since every later filter keeps a subset of them. */   \
        T *candidates = scratch->candidates.SUFFIX;                                        \
        ptrdiff_t *positions = scratch->positions;                                         \
        ptrdiff_t count = -1;                                                              \
        const T *w = NULL; /* the gathered entries' weights, once computed */              \
        if (top_k > 0 && top_k < (int64_t)V) {                                             \
            if (V <= SPECDEC_TOP_P_CANDIDATES) {                                           \
                /* A short row: top-k's key from the row itself, then its survivors in one \
                 * pass, so that its filters cost what its entries do. */                  \
                KEY_T k_key = specdec_top_k_key_##SUFFIX(logits, V, temperature, top_k, z_max, \
                                                         scratch);                         \
                floor_key = k_key > floor_key ? k_key : floor_key;                         \
                count = specdec_gather_at_or_above_##SUFFIX(logits, V, temperature, floor_key, \
                                                            candidates, positions);        \
            } else {                                                                       \
                count = gathered;                                                          \
                /* z / 1 is z, so the keys and weights of the gathered z are the same     \
                 * bits. */                                                                \
                KEY_T k_key = count >= 0                                                   \
                                  ? specdec_top_k_key_##SUFFIX(candidates, count, (T)1, top_k, \
                                                               z_max, scratch)             \
                                  : specdec_select_##SUFFIX(logits, V, temperature, z_max, 1, \
                                                            0, (double)top_k, NULL, scratch);    \
                floor_key = k_key > floor_key ? k_key : floor_key;                         \
                if (count >= 0)                                                            \
                    count = specdec_compact_##SUFFIX(candidates, positions, count, floor_key); \
            }                                                                              \
        }                                                                                  \
        if (top_p < 1.0) {                                                                 \
            /* After min-p alone few tokens are left too, and a short row is short: gather \
             * their z (in element order, so the histograms sum in the same order) and     \
             * select over them alone. */                                                  \
            if (count < 0 && V <= SPECDEC_TOP_P_CANDIDATES) {                              \
                count = specdec_gather_at_or_above_##SUFFIX(logits, V, temperature, floor_key, \
                                                            candidates, positions);        \
            } else if (count < 0 && floor_key > 1) {                                       \
                ptrdiff_t found = 0;                                                       \
                for (ptrdiff_t y = 0; y < V && found <= SPECDEC_TOP_P_CANDIDATES; ++y) {   \
                    T z = logits[y] / temperature;                                         \
                    if (specdec_key_##SUFFIX(z) >= floor_key) {                            \
                        if (found < SPECDEC_TOP_P_CANDIDATES) {                            \
                            candidates[found] = z;                                         \
                            positions[found] = y;                                          \
                        }                                                                  \
                        ++found;                                                           \
                    }                                                                      \
                }                                                                          \
                count = found <= SPECDEC_TOP_P_CANDIDATES ? found : -1;                    \
            }                                                                              \
            if (count >= 0)                                                                \
                w = specdec_candidate_weights_##SUFFIX(candidates, count, z_max,           \
                                                       scratch->candidate_weights.SUFFIX); \
            KEY_T p_key = count >= 0                                                       \
                              ? specdec_select_##SUFFIX(candidates, count, (T)1, z_max,   \
                                                        floor_key, 1, top_p, w, scratch)   \
                              : specdec_select_##SUFFIX(logits, V, temperature, z_max,    \
                                                        floor_key, 1, top_p, NULL, scratch);    \
            if (SPECDEC_LOGITS_MUTATION == 1 && p_key != specdec_key_##SUFFIX(z_max)) {     \
                /* wrong on purpose: the tie group at the boundary is dropped */           \
                int64_t tied = 0;                                                          \
                for (ptrdiff_t y = 0; y < V; ++y)                                          \
                    tied += specdec_key_##SUFFIX(logits[y] / temperature) == p_key;         \
                if (tied > 1)                                                              \
                    p_key += 1;                                                            \
            }                                                                              \
            floor_key = p_key > floor_key ? p_key : floor_key;                             \
        }                                                                                  \
        if (floor_key <= 1) {                                                              \
            law->cutoff = -INFINITY;                                                       \
            law->normaliser = KEPT_SUM(logits, V, temperature, z_max, (T)-INFINITY, weights, \
                                       scratch->row_threads);                              \
            return weights != NULL;                                                        \
        }                                                                                  \
        T cutoff = specdec_value_##SUFFIX(floor_key);                                      \
        law->cutoff = (double)cutoff;                                                      \
        if (count >= 0) {                                                                  \
            if (!w)                                                                        \
                w = specdec_candidate_weights_##SUFFIX(candidates, count, z_max,           \
                                                       scratch->candidate_weights.SUFFIX); \
            law->normaliser = specdec_kept_sum_gathered_##SUFFIX(candidates, w, positions, \
                                                                 count, cutoff);           \
            scratch->survivors = count;                                                    \
            if (!weights)                                                                  \
                return 0;                                                                  \
            specdec_gathered_weights_##SUFFIX(candidates, w, positions, count, cutoff, V,  \
                                              weights);                                    \
            return 1;                                                                      \
        }                                                                                  \
        law->normaliser = KEPT_SUM(logits, V, temperature, z_max, cutoff, weights,          \
                                   scratch->row_threads);                                  \
        return weights != NULL;                                                            \
    }

SPECDEC_DEFINE_ROW_LAW(f, float, uint32_t, specdec_law_row_max_f, specdec_law_kept_sum_f)
SPECDEC_DEFINE_ROW_LAW(d, double, uint64_t, specdec_law_row_max_d, specdec_law_kept_sum_d)

/* ---- a law's survivors alone: its processed row and its draw ------------------------- */

/* The processed row of a law whose kept set lies within its gathered survivors
 * (scratch->survivors >= 0, right after specdec_row_law): zeros and the survivors' p, the
 * bits specdec_law_from_weights gives from the row of weights (0 / n is +0). */
#define SPECDEC_DEFINE_SURVIVORS_ROW(SUFFIX, T)                                             \
    static void specdec_survivors_row_##SUFFIX(const specdec_law_scratch *scratch,          \
                                               const specdec_row_law *law, ptrdiff_t V,    \
                                               T *out)                                     \
    {                                                                                      \
        const T *z = scratch->candidates.SUFFIX, *w = scratch->candidate_weights.SUFFIX;   \
        const T cutoff = (T)law->cutoff;                                                   \
        memset(out, 0, (size_t)V * sizeof(T));                                             \
        for (ptrdiff_t i = 0; i < scratch->survivors; ++i)                                 \
            if (z[i] >= cutoff)                                                            \
                out[scratch->positions[i]] = (T)((double)w[i] / law->normaliser);          \
    }

SPECDEC_DEFINE_SURVIVORS_ROW(f, float)
SPECDEC_DEFINE_SURVIVORS_ROW(d, double)

/* The inverse-CDF draw at v from a law whose kept set lies within its gathered survivors
 * (scratch->survivors >= 0, right after specdec_row_law), with the bits of the draw from
 * the whole processed row (draw_by_blocks of the Cython kernels: its block sums, as
 * specdec_block_sums gives them, their running sum, and the scan of the chosen block on):
 * an entry outside the survivors is +0, which adds nothing to a lane, a block's sum or a
 * running sum and never stops a scan, so the survivors' p, each added to the lane of its
 * index in element order and each block summed as SPECDEC_COMBINE_LANES, give every sum
 * the row gives.  `block` is the draw's block (a multiple of 8).  Returns the token, or -1
 * when no weight is positive.  Overwrites the gathered entries and their weights. */
#define SPECDEC_DEFINE_SURVIVORS_DRAW(SUFFIX, T)                                            \
    static double specdec_survivors_block_sum_##SUFFIX(const T *p, const ptrdiff_t *y,      \
                                                       ptrdiff_t n, ptrdiff_t block,       \
                                                       ptrdiff_t *i)                       \
    {                                                                                      \
        /* Block y[*i] / block's sum, from its survivors *i, *i + 1, ...; *i moves past    \
         * (they are in element order: one division a block, none an entry). */           \
        double lanes[8] = {0};                                                             \
        const ptrdiff_t stop = (y[*i] / block + 1) * block;                                \
        for (; *i < n && y[*i] < stop; ++*i)                                               \
            lanes[SPECDEC_LOGITS_MUTATION == 8 ? *i % 8 : y[*i] % 8] += (double)p[*i];     \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }                                                                                      \
    static ptrdiff_t specdec_survivors_draw_##SUFFIX(specdec_law_scratch *scratch,          \
                                                     const specdec_row_law *law,           \
                                                     ptrdiff_t block, double v)            \
    {                                                                                      \
        T *p = scratch->candidates.SUFFIX;                                                 \
        const T *w = scratch->candidate_weights.SUFFIX;                                    \
        ptrdiff_t *y = scratch->positions;                                                 \
        const T cutoff = (T)law->cutoff;                                                   \
        /* The positive p of the kept survivors, in place, in element order. */           \
        ptrdiff_t n = 0;                                                                   \
        for (ptrdiff_t i = 0; i < scratch->survivors; ++i) {                               \
            T p_i = (T)((double)w[i] / law->normaliser);                                   \
            if (p[i] >= cutoff && p_i > (T)0) {                                            \
                p[n] = p_i;                                                                \
                y[n] = y[i];                                                               \
                ++n;                                                                       \
            }                                                                              \
        }                                                                                  \
        scratch->survivors = -1;                                                           \
        /* Each block's sum once, with the survivor it starts at, in the weights' and the  \
         * select's buffers (neither is read again; at most n blocks). */                 \
        double *sums = scratch->candidate_weights.d;                                       \
        int32_t *starts = scratch->members;                                                \
        ptrdiff_t blocks = 0;                                                              \
        double total = 0.0;                                                                \
        for (ptrdiff_t i = 0; i < n; ++blocks) {                                           \
            starts[blocks] = (int32_t)i;                                                   \
            sums[blocks] = specdec_survivors_block_sum_##SUFFIX(p, y, n, block, &i);       \
            total += sums[blocks];                                                         \
        }                                                                                  \
        if (!(total > 0.0))                                                                \
            return -1;                                                                     \
        const double threshold = v * total;                                                \
        double running = 0.0;                                                              \
        /* The first block whose running sum passes the threshold, then its entries on. */ \
        ptrdiff_t chosen = 0;                                                              \
        for (; chosen < blocks && !(running + sums[chosen] > threshold); ++chosen)         \
            running += sums[chosen];                                                       \
        const ptrdiff_t first = chosen < blocks ? starts[chosen] : n;                      \
        for (ptrdiff_t i = first; i < n; ++i) {                                            \
            running += (double)p[i];                                                       \
            if (specdec_draw_stops((double)p[i], running, threshold))                      \
                return y[i];                                                               \
        }                                                                                  \
        /* Rounding made the scan miss: the last positive weight. */                       \
        return y[n - 1];                                                                   \
    }

SPECDEC_DEFINE_SURVIVORS_DRAW(f, float)
SPECDEC_DEFINE_SURVIVORS_DRAW(d, double)

/* p(y) as float64 from the one logit logits[y]; 0 for a row without mass. */
#define SPECDEC_DEFINE_PROBABILITY(SUFFIX, T)                                               \
    static inline double specdec_law_probability_##SUFFIX(                                 \
        const T *logits, ptrdiff_t y, T temperature, const specdec_row_law *law)           \
    {                                                                                      \
        return specdec_entry_probability_##SUFFIX(logits[y] / temperature, law);           \
    }

SPECDEC_DEFINE_PROBABILITY(f, float)
SPECDEC_DEFINE_PROBABILITY(d, double)

/* The processed row p, in the row's dtype; all zeros for a row without mass. */
#define SPECDEC_DEFINE_MATERIALISE(SUFFIX, T, BODY)                                         \
    static void specdec_law_materialise_##SUFFIX(const T *logits, ptrdiff_t V,             \
                                                 T temperature, const specdec_row_law *law, \
                                                 T *out)                                   \
    {                                                                                      \
        if (law->status != 0 || law->num_infinite > 0) {                                   \
            for (ptrdiff_t y = 0; y < V; ++y)                                              \
                out[y] = specdec_entry_materialised_##SUFFIX(logits[y] / temperature, law); \
            return;                                                                        \
        }                                                                                  \
        BODY(logits, V, temperature, law, out);                                            \
    }

#define SPECDEC_MATERIALISE_D_BODY(logits, V, temperature, law, out)                        \
    specdec_materialise_d_scalar(logits, 0, V, temperature, law, out)

SPECDEC_DEFINE_MATERIALISE(f, float, specdec_materialise_f_vector)
SPECDEC_DEFINE_MATERIALISE(d, double, SPECDEC_MATERIALISE_D_BODY)


#endif
