/* Vectorised reductions over one vocabulary row, used by the kernels in _core.pyx.
 *
 * Cython cannot express SIMD, and GCC will not vectorise a float64 sum on its own without
 * -ffast-math (which would also let it reorder every other sum).  These helpers use the
 * GNU vector extensions (GCC and Clang) so that the summation order is fixed by this code,
 * identical in the scalar fallback (SPECDEC_NO_VECTOR_EXTENSIONS).
 *
 * Every function works on a half-open range [start, stop) of one row; elements past the
 * last full group of 8 are handled by a zero-padded group (padding contributes nothing), so
 * the vector code and the tail share one formula.
 */
#ifndef SPECDEC_ROWSCAN_H
#define SPECDEC_ROWSCAN_H

#include <stddef.h>

/* The per-element formulas (and the lane order) are those of both backends. */
#include "elementwise.h"

/* Helpers that take or return vectors must be inlined into their callers: a helper left
 * out of line is compiled for the baseline CPU, while the AVX2 clone of its caller passes
 * 32-byte vectors in registers, so the two would disagree on where the vector is. */
#ifndef SPECDEC_INLINE
#if defined(__GNUC__)
#define SPECDEC_INLINE static inline __attribute__((always_inline))
#else
#define SPECDEC_INLINE static inline
#endif
#endif

#if defined(__GNUC__) && !defined(SPECDEC_NO_VECTOR_EXTENSIONS)
#define SPECDEC_HAVE_VECTORS 1
typedef float specdec_v4f __attribute__((vector_size(16)));
#else
#define SPECDEC_HAVE_VECTORS 0
#endif

#define SPECDEC_TO_V8F(x) __builtin_convertvector((x), specdec_v8f)

/* x86-64 glibc builds carry an AVX-512 clone (x86-64-v4) and an AVX2 + FMA3 clone
 * (x86-64-v3) of the hot loops, besides the baseline one; an ifunc picks the widest the CPU
 * has when the module loads.  Every clone does the same correctly rounded operations in the
 * same order (the exponential's fused multiply-adds included: a vfmadd in the first two,
 * libm's fmaf in the baseline), so they return identical bits.  The tests build the
 * headers with one clone at a time (-DSPECDEC_CLONES=...) to compare them. */
#ifndef SPECDEC_CLONES
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__clang__)
#define SPECDEC_CLONES                                                                     \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPECDEC_CLONES
#endif
#endif

/* The tests build the headers with SPECDEC_LOGITS_MUTATION set to a code that breaks one
 * step on purpose (each named where it acts), to show that their comparisons see it. */
#ifndef SPECDEC_LOGITS_MUTATION
#define SPECDEC_LOGITS_MUTATION 0
#endif

/* Code written for AVX-512 (x86-64-v4) alone, with its intrinsics, runs where the CPU has
 * it, chosen at run time by specdec_cpu_has_avx512; elsewhere the same operations run on
 * narrower vectors or one lane at a time, with the same bits.  The tests build the headers
 * with SPECDEC_AVX512_PATH=0 to compare the two. */
#ifndef SPECDEC_AVX512_PATH
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SPECDEC_AVX512_PATH 1
#else
#define SPECDEC_AVX512_PATH 0
#endif
#endif

#if SPECDEC_AVX512_PATH
#include <immintrin.h>

#define SPECDEC_AVX512 __attribute__((target("arch=x86-64-v4")))

/* Whether this CPU runs x86-64-v4 code (the AVX-512 subsets it assumes). */
static inline int specdec_cpu_has_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512cd");
}
#endif

/* Code written for AVX2 (top-k's survivors, survivors.h, the partitions of its key,
 * selections.h, and the exponential pass's four groups, exponentials.h) runs where the CPU
 * has AVX2 and FMA, chosen at run time by specdec_has_avx2, with the generic code's bits.
 * The tests build the headers with SPECDEC_NO_X86_AVX2 to compare the two. */
#if SPECDEC_HAVE_VECTORS && defined(__x86_64__) && defined(__GNUC__) &&                    \
    !defined(SPECDEC_NO_X86_AVX2)
#include <immintrin.h>
#define SPECDEC_X86_AVX2 1
#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))

static inline int specdec_has_avx2(void)
{
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known;
}
#else
#define SPECDEC_X86_AVX2 0
static inline int specdec_has_avx2(void) { return 0; }
#endif

/* ---- residual mass: sum of max(rho p - q, 0) * scale in float64 ---------------------- */

/* NAME_accumulate adds a range's weights to eight running lanes, so that a row summed in
 * pieces whose lengths are multiples of 8 gets the bits of one NAME call over the row. */
static inline double specdec_combine_lanes(const double lanes[8])
{
    return SPECDEC_COMBINE_LANES(lanes);
}

/* q == NULL stands for a point-mass draft: q = 1 at index point_mass, 0 elsewhere (and 0
 * everywhere for point_mass = -1).  Both forms go through the same arithmetic, so a
 * point-mass draft and its one-hot draft row give bit-identical sums.  Each weight is
 * specdec_residual_weight of elementwise.h (on vectors, its SPECDEC_RESIDUAL_WEIGHT body):
 * negative and NaN draft entries count as 0, so a weight is positive only where p is. */

#if SPECDEC_HAVE_VECTORS

typedef double specdec_v4d __attribute__((vector_size(32)));
typedef int64_t specdec_v4l __attribute__((vector_size(32)));


SPECDEC_INLINE specdec_v4d specdec_positive_part(specdec_v4d w)
{
    const specdec_v4d zero = {0.0, 0.0, 0.0, 0.0};
    return (specdec_v4d)((specdec_v4l)w & (specdec_v4l)(w > zero));
}

/* q of a point-mass draft for indices first .. first + 3. */
SPECDEC_INLINE specdec_v4d specdec_one_hot(ptrdiff_t first, ptrdiff_t point_mass)
{
    const specdec_v4d one = {1.0, 1.0, 1.0, 1.0};
    specdec_v4l index = {first, first + 1, first + 2, first + 3};
    specdec_v4l target = {point_mass, point_mass, point_mass, point_mass};
    return (specdec_v4d)((specdec_v4l)one & (specdec_v4l)(index == target));
}

/* Eight values as two float64 quadruples, zero-filled past `left` (full group if >= 8). */
SPECDEC_INLINE void specdec_load8_f(const float *x, ptrdiff_t left, specdec_v4d out[2])
{
    specdec_v4f low, high;
    if (left >= 8) {
        memcpy(&low, x, sizeof low);
        memcpy(&high, x + 4, sizeof high);
    } else {
        float padded[8] = {0.0f};
        memcpy(padded, x, (size_t)left * sizeof(float));
        memcpy(&low, padded, sizeof low);
        memcpy(&high, padded + 4, sizeof high);
    }
    out[0] = __builtin_convertvector(low, specdec_v4d);
    out[1] = __builtin_convertvector(high, specdec_v4d);
}

SPECDEC_INLINE void specdec_load8_d(const double *x, ptrdiff_t left, specdec_v4d out[2])
{
    if (left >= 8) {
        /* Two 32-byte copies: GCC lowers one 64-byte copy into the pair so that a float64
         * row scans six times slower (measured at V = 128256; see benchmarks/README.md). */
        memcpy(&out[0], x, sizeof out[0]);
        memcpy(&out[1], x + 4, sizeof out[1]);
    } else {
        double padded[8] = {0.0};
        memcpy(padded, x, (size_t)left * sizeof(double));
        memcpy(out, padded, 2 * sizeof(specdec_v4d));
    }
}

#define SPECDEC_DEFINE_RESIDUAL_SUM(NAME, T, LOAD8)                                         \
    SPECDEC_INLINE void NAME##_group(const T *p, const T *q, ptrdiff_t point_mass,          \
                                    specdec_v4d rho, specdec_v4d scale, ptrdiff_t y,       \
                                    ptrdiff_t left, specdec_v4d acc[2])                    \
    {                                                                                      \
        specdec_v4d p8[2], q8[2];                                                          \
        LOAD8(p + y, left, p8);                                                            \
        if (q) {                                                                           \
            LOAD8(q + y, left, q8);                                                        \
            q8[0] = specdec_positive_part(q8[0]);                                          \
            q8[1] = specdec_positive_part(q8[1]);                                          \
        } else if (point_mass < 0) {                                                       \
            q8[0] = q8[1] = (specdec_v4d){0.0, 0.0, 0.0, 0.0};                             \
        } else {                                                                           \
            q8[0] = specdec_one_hot(y, point_mass);                                        \
            q8[1] = specdec_one_hot(y + 4, point_mass);                                    \
        }                                                                                  \
        acc[0] += SPECDEC_RESIDUAL_WEIGHT(specdec_positive_part, p8[0], q8[0], rho, scale); \
        acc[1] += SPECDEC_RESIDUAL_WEIGHT(specdec_positive_part, p8[1], q8[1], rho, scale); \
    }                                                                                      \
    /* The group above for q = 0, rho = 1 and scale = 1, where rho p - q is p and the      \
     * product by the scale is exact: the same bits in half the instructions. */          \
    SPECDEC_INLINE void NAME##_plain_group(const T *p, ptrdiff_t y, specdec_v4d acc[2])     \
    {                                                                                      \
        specdec_v4d p8[2];                                                                 \
        LOAD8(p + y, 8, p8);                                                               \
        acc[0] += specdec_positive_part(p8[0]);                                            \
        acc[1] += specdec_positive_part(p8[1]);                                            \
    }                                                                                      \
    SPECDEC_CLONES                                                                         \
    static void NAME##_accumulate(const T *p, const T *q, ptrdiff_t point_mass, double rho, \
                                  double scale, ptrdiff_t start, ptrdiff_t stop,           \
                                  double lanes[8])                                         \
    {                                                                                      \
        specdec_v4d acc[2];                                                                \
        memcpy(acc, lanes, sizeof acc);                                                    \
        const specdec_v4d rho4 = {rho, rho, rho, rho};                                     \
        const specdec_v4d scale4 = {scale, scale, scale, scale};                           \
        ptrdiff_t y = start;                                                               \
        if (q) {                                                                           \
            for (; y + 8 <= stop; y += 8)                                                  \
                NAME##_group(p, q, point_mass, rho4, scale4, y, 8, acc);                   \
        } else if (rho == 1.0 && scale == 1.0) {                                           \
            for (; y + 8 <= stop; y += 8) {                                                \
                if (point_mass >= y && point_mass < y + 8)                                 \
                    NAME##_group(p, NULL, point_mass, rho4, scale4, y, 8, acc);            \
                else                                                                       \
                    NAME##_plain_group(p, y, acc);                                         \
            }                                                                              \
        } else {                                                                           \
            /* q is zero outside the group holding point_mass: rho p - 0 is rho p. */      \
            for (; y + 8 <= stop; y += 8) {                                                \
                if (point_mass >= y && point_mass < y + 8)                                 \
                    NAME##_group(p, NULL, point_mass, rho4, scale4, y, 8, acc);            \
                else                                                                       \
                    NAME##_group(p, NULL, -1, rho4, scale4, y, 8, acc);                    \
            }                                                                              \
        }                                                                                  \
        if (y < stop)                                                                      \
            NAME##_group(p, q, point_mass, rho4, scale4, y, stop - y, acc);                \
        memcpy(lanes, acc, sizeof acc);                                                    \
    }                                                                                      \
    static double NAME(const T *p, const T *q, ptrdiff_t point_mass, double rho,           \
                       double scale, ptrdiff_t start, ptrdiff_t stop)                      \
    {                                                                                      \
        double lanes[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};                        \
        NAME##_accumulate(p, q, point_mass, rho, scale, start, stop, lanes);               \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_RESIDUAL_SUM(specdec_residual_sum_f, float, specdec_load8_f)
SPECDEC_DEFINE_RESIDUAL_SUM(specdec_residual_sum_d, double, specdec_load8_d)

#else

#define SPECDEC_DEFINE_RESIDUAL_SUM(NAME, T)                                                \
    static void NAME##_accumulate(const T *p, const T *q, ptrdiff_t point_mass, double rho, \
                                  double scale, ptrdiff_t start, ptrdiff_t stop,           \
                                  double lanes[8])                                         \
    {                                                                                      \
        for (ptrdiff_t y = start; y < stop; ++y) {                                         \
            double q_y = q ? (double)q[y] : (y == point_mass ? 1.0 : 0.0);                 \
            lanes[(y - start) % 8] += specdec_residual_weight((double)p[y], q_y, rho, scale); \
        }                                                                                  \
    }                                                                                      \
    static double NAME(const T *p, const T *q, ptrdiff_t point_mass, double rho,           \
                       double scale, ptrdiff_t start, ptrdiff_t stop)                      \
    {                                                                                      \
        double lanes[8] = {0};                                                             \
        NAME##_accumulate(p, q, point_mass, rho, scale, start, stop, lanes);               \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_RESIDUAL_SUM(specdec_residual_sum_f, float)
SPECDEC_DEFINE_RESIDUAL_SUM(specdec_residual_sum_d, double)

#endif

/* ---- entropy and maximum ------------------------------------------------------------- */

/* Returns sum_y p(y) * ln(p(y) + 1e-5) over [start, stop) in float64 and stores the
 * largest value in *maximum (NaN never wins; -inf if nothing beats it).  float rows use
 * the float32-accurate log above; double rows use libm.  A scan for the maximum alone is
 * specdec_row_argmax_SUFFIX's. */
static double specdec_entropy_max_d(const double *row, ptrdiff_t start, ptrdiff_t stop,
                                    double *maximum)
{
    double lanes[8] = {0};
    double best = -INFINITY;
    for (ptrdiff_t y = start; y < stop; ++y) {
        double p = row[y];
        lanes[(y - start) % 8] += specdec_entropy_term_d(p);
        best = p > best ? p : best;
    }
    *maximum = best;
    return SPECDEC_COMBINE_LANES(lanes);
}

#if SPECDEC_HAVE_VECTORS

typedef float specdec_v8f __attribute__((vector_size(32)));
typedef int32_t specdec_v8i __attribute__((vector_size(32)));

SPECDEC_DEFINE_FAST_LOG(SPECDEC_INLINE, specdec_fast_logf8, specdec_v8f, specdec_v8i,
                        SPECDEC_TO_V8F)

SPECDEC_INLINE specdec_v8f specdec_max8(specdec_v8f candidates, specdec_v8f best)
{
    specdec_v8i wins = candidates > best; /* NaN candidates never win */
    return (specdec_v8f)(((specdec_v8i)candidates & wins) | ((specdec_v8i)best & ~wins));
}

/* Eight floats as two float64 quadruples, lanes 0-3 and 4-7.  The halves are copied out:
 * written element by element ({x[0], x[1], ...}) GCC builds them with scalar moves. */
SPECDEC_INLINE void specdec_widen8(specdec_v8f x, specdec_v4d *low, specdec_v4d *high)
{
    specdec_v4f half[2];
    memcpy(half, &x, sizeof half);
    *low = __builtin_convertvector(half[0], specdec_v4d);
    *high = __builtin_convertvector(half[1], specdec_v4d);
}

/* The eight float64 lanes of an eight-wide pass (logits_law.h's kept sum) as two
 * quadruples (lanes 0-3, then 4-7): an AVX2 CPU holds each in a register, where GCC lowers
 * a sixty-four-byte vector through the stack (a store and partial reloads per group, which
 * doubled the pass's time). */
typedef struct {
    specdec_v4d low, high;
} specdec_lanes8;

SPECDEC_INLINE void specdec_add_lanes8(specdec_v8f w, specdec_lanes8 *lanes)
{
    specdec_v4d low, high;
    specdec_widen8(w, &low, &high);
    lanes->low += low;
    lanes->high += high;
}

/* Two float quadruples as eight floats, lanes 0-3 then 4-7. */
SPECDEC_INLINE specdec_v8f specdec_join8(specdec_v4f low, specdec_v4f high)
{
    specdec_v4f half[2] = {low, high};
    specdec_v8f x;
    memcpy(&x, half, sizeof x);
    return x;
}

SPECDEC_INLINE void specdec_entropy_group(specdec_v8f p, specdec_v4d *low, specdec_v4d *high)
{
    specdec_v4d term_low, term_high;
    specdec_widen8(SPECDEC_ENTROPY_TERM_F(specdec_fast_logf8, p), &term_low, &term_high);
    *low += term_low;
    *high += term_high;
}

SPECDEC_CLONES
static double specdec_entropy_max_f(const float *row, ptrdiff_t start, ptrdiff_t stop,
                                    float *maximum)
{
    const specdec_v8f minus_infinity = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                                        -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    specdec_v4d low = {0.0, 0.0, 0.0, 0.0}, high = low;
    specdec_v8f best = minus_infinity;
    ptrdiff_t y = start;
    for (; y + 8 <= stop; y += 8) {
        specdec_v8f p;
        memcpy(&p, row + y, sizeof p);
        best = specdec_max8(p, best);
        specdec_entropy_group(p, &low, &high);
    }
    if (y < stop) {
        /* Padding: p = 0 adds 0 * ln(1e-5) = 0 to the entropy; -inf never wins the max. */
        float values[8] = {0.0f}, candidates[8];
        specdec_v8f p, c;
        for (int lane = 0; lane < 8; ++lane)
            candidates[lane] = -INFINITY;
        memcpy(values, row + y, (size_t)(stop - y) * sizeof(float));
        memcpy(candidates, row + y, (size_t)(stop - y) * sizeof(float));
        memcpy(&p, values, sizeof p);
        memcpy(&c, candidates, sizeof c);
        best = specdec_max8(c, best);
        specdec_entropy_group(p, &low, &high);
    }
    float result = -INFINITY;
    for (int lane = 0; lane < 8; ++lane)
        result = best[lane] > result ? best[lane] : result;
    *maximum = result;
    double lanes[8] = {low[0], low[1], low[2], low[3], high[0], high[1], high[2], high[3]};
    return SPECDEC_COMBINE_LANES(lanes);
}

#else

static double specdec_entropy_max_f(const float *row, ptrdiff_t start, ptrdiff_t stop,
                                    float *maximum)
{
    double lanes[8] = {0};
    float best = -INFINITY;
    for (ptrdiff_t y = start; y < stop; ++y) {
        float p = row[y];
        lanes[(y - start) % 8] += specdec_entropy_term_f(p);
        best = p > best ? p : best;
    }
    *maximum = best;
    return SPECDEC_COMBINE_LANES(lanes);
}

#endif

/* ---- argmax of a whole row ------------------------------------------------------------ */

/* specdec_row_argmax_SUFFIX(row, V): the first index of the largest entry of row[0, V)
 * (NaN never wins; 0 for a row with nothing above -inf), in one read of the row.
 *
 * A block of SPECDEC_ARGMAX_BLOCK entries is reduced on SPECDEC_ARGMAX_LANES independent
 * running maxima (four AVX-512 registers of floats), so that the loads and not one compare
 * chain bound the loop; the index is found at the end by re-reading the one cache-hot
 * block that first reached the maximum.  The lanes are written as a plain loop over an
 * array because GCC compiles "candidate > best ? candidate : best" on it to maxps, whose
 * rule (the first operand if it is greater, else the second) is this one, while a GNU
 * vector mask-and-select costs a compare and a blend.  The maximum is a selection, so the
 * width and the grouping cannot change what is found: every clone returns the same index. */
#define SPECDEC_ARGMAX_BLOCK 2048
#define SPECDEC_ARGMAX_LANES 64

#define SPECDEC_DEFINE_ROW_ARGMAX(SUFFIX, T)                                                \
    SPECDEC_CLONES                                                                         \
    static ptrdiff_t specdec_row_argmax_##SUFFIX(const T *row, ptrdiff_t V)                \
    {                                                                                      \
        T best = (T)-INFINITY;                                                             \
        ptrdiff_t best_start = -1;                                                         \
        for (ptrdiff_t start = 0; start < V; start += SPECDEC_ARGMAX_BLOCK) {              \
            ptrdiff_t stop = V - start < SPECDEC_ARGMAX_BLOCK ? V                          \
                                                              : start + SPECDEC_ARGMAX_BLOCK; \
            T lanes[SPECDEC_ARGMAX_LANES], block_best;                                     \
            for (int lane = 0; lane < SPECDEC_ARGMAX_LANES; ++lane)                        \
                lanes[lane] = (T)-INFINITY;                                                \
            ptrdiff_t y = start;                                                           \
            for (; y + SPECDEC_ARGMAX_LANES <= stop; y += SPECDEC_ARGMAX_LANES)            \
                for (int lane = 0; lane < SPECDEC_ARGMAX_LANES; ++lane)                    \
                    lanes[lane] = row[y + lane] > lanes[lane] ? row[y + lane] : lanes[lane]; \
            /* Halving, not one lane after another: a chain of 64 dependent maxima would \
             * cost more than the block's loads. */                                        \
            for (int width = SPECDEC_ARGMAX_LANES / 2; width > 0; width /= 2)               \
                for (int lane = 0; lane < width; ++lane)                                   \
                    lanes[lane] = lanes[lane + width] > lanes[lane] ? lanes[lane + width]  \
                                                                    : lanes[lane];         \
            block_best = lanes[0];                                                         \
            for (; y < stop; ++y)                                                          \
                block_best = row[y] > block_best ? row[y] : block_best;                    \
            if (block_best > best) {                                                       \
                best = block_best;                                                         \
                best_start = start;                                                        \
            }                                                                              \
        }                                                                                  \
        if (best_start < 0)                                                                \
            return 0;                                                                      \
        /* Chunks of lanes with an or-reduction (vectorised), then the one chunk's entries, \
         * so that locating costs a fraction of the block's scan. */                       \
        ptrdiff_t y = best_start;                                                          \
        for (; y + SPECDEC_ARGMAX_LANES <= V; y += SPECDEC_ARGMAX_LANES) {                 \
            int found = 0;                                                                 \
            for (int lane = 0; lane < SPECDEC_ARGMAX_LANES; ++lane)                        \
                found |= row[y + lane] == best;                                            \
            if (found)                                                                     \
                break;                                                                     \
        }                                                                                  \
        while (row[y] != best)                                                             \
            ++y;                                                                           \
        return y;                                                                          \
    }

SPECDEC_DEFINE_ROW_ARGMAX(f, float)
SPECDEC_DEFINE_ROW_ARGMAX(d, double)

/* ---- greedy decision scan ------------------------------------------------------------- */

/* Number of entries in [start, stop) that beat row[x] = p_x: larger, or equal at a lower
 * index.  The caller stops at the first block where this is non-zero. */
#define SPECDEC_DEFINE_COUNT_BEATING(NAME, T)                                               \
    static ptrdiff_t NAME(const T *row, ptrdiff_t start, ptrdiff_t stop, T p_x, ptrdiff_t x) \
    {                                                                                      \
        ptrdiff_t count = 0;                                                               \
        ptrdiff_t split = x < start ? start : (x > stop ? stop : x);                       \
        for (ptrdiff_t y = start; y < split; ++y)                                          \
            count += row[y] >= p_x;                                                        \
        for (ptrdiff_t y = split; y < stop; ++y)                                           \
            count += row[y] > p_x;                                                         \
        return count;                                                                      \
    }

SPECDEC_DEFINE_COUNT_BEATING(specdec_count_beating_f, float)
SPECDEC_DEFINE_COUNT_BEATING(specdec_count_beating_d, double)

/* Whether the largest finite logit m of a row overflows at the temperature (m / t is +inf
 * or -inf in the rows' dtype; NaN and infinities skipped): the check of
 * specdec_np._layouts.sampling.check_tempered_rows, for a row the law reads. */
#define SPECDEC_DEFINE_OVERFLOWS(SUFFIX, T)                                                 \
    static int specdec_overflows_##SUFFIX(const T *logits, ptrdiff_t V, T temperature)      \
    {                                                                                      \
        T largest = (T)-INFINITY;                                                          \
        for (ptrdiff_t y = 0; y < V; ++y)                                                  \
            largest = logits[y] > largest && logits[y] < (T)INFINITY ? logits[y] : largest; \
        T z = largest / temperature;                                                       \
        return largest > (T)-INFINITY && (z == (T)INFINITY || z == (T)-INFINITY);          \
    }

SPECDEC_DEFINE_OVERFLOWS(f, float)
SPECDEC_DEFINE_OVERFLOWS(d, double)

#endif
