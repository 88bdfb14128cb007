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

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_fastmath.h"

#if defined(__GNUC__) && !defined(SPECDEC_NO_VECTOR_EXTENSIONS)
#define SPECDEC_HAVE_VECTORS 1
/* 16-byte vectors map one to one onto SSE2/NEON registers; wider generic vectors get
 * split, and some of their operations scalarised, on a baseline x86-64 build. */
typedef float specdec_v4f __attribute__((vector_size(16)));
typedef double specdec_v2d __attribute__((vector_size(16)));
typedef int32_t specdec_v4i __attribute__((vector_size(16)));
typedef int64_t specdec_v2l __attribute__((vector_size(16)));
#else
#define SPECDEC_HAVE_VECTORS 0
#endif

/* Lane l (0..7) accumulates the elements start + 8*i + l; the lanes are combined as
 * ((L0 + L4) + (L1 + L5)) + ((L2 + L6) + (L3 + L7)) by every implementation below. */
#define SPECDEC_COMBINE_LANES(L)                                                           \
    ((((L)[0] + (L)[4]) + ((L)[1] + (L)[5])) + (((L)[2] + (L)[6]) + ((L)[3] + (L)[7])))

/* ---- residual mass: sum of max(p - q, 0) in float64 ---------------------------------- */

/* q == NULL stands for a point-mass draft: q = 1 at index point_mass, 0 elsewhere (and 0
 * everywhere for point_mass = -1).  Both forms go through the same arithmetic, so a
 * point-mass draft and its one-hot draft row give bit-identical sums. */
static inline double specdec_residual_weight(double p, double q)
{
    double w = p - q;
    return w > 0.0 ? w : 0.0;
}

#if SPECDEC_HAVE_VECTORS

static inline specdec_v2d specdec_positive_part(specdec_v2d w)
{
    const specdec_v2d zero = {0.0, 0.0};
    return (specdec_v2d)((specdec_v2l)w & (specdec_v2l)(w > zero));
}

/* q of a point-mass draft for indices first, first + 1. */
static inline specdec_v2d specdec_one_hot(ptrdiff_t first, ptrdiff_t point_mass)
{
    const specdec_v2d one = {1.0, 1.0};
    specdec_v2l index = {first, first + 1};
    specdec_v2l target = {point_mass, point_mass};
    return (specdec_v2d)((specdec_v2l)one & (specdec_v2l)(index == target));
}

/* Eight values as four float64 pairs, zero-filled past `left` (a full group when >= 8). */
static inline void specdec_load8_f(const float *x, ptrdiff_t left, specdec_v2d out[4])
{
    specdec_v4f low = {0.0f, 0.0f, 0.0f, 0.0f}, high = low;
    if (left >= 8) {
        memcpy(&low, x, sizeof low);
        memcpy(&high, x + 4, sizeof high);
    } else {
        float padded[8] = {0.0f};
        memcpy(padded, x, (size_t)left * sizeof(float));
        memcpy(&low, padded, sizeof low);
        memcpy(&high, padded + 4, sizeof high);
    }
    specdec_v2d a = {low[0], low[1]}, b = {low[2], low[3]};
    specdec_v2d c = {high[0], high[1]}, d = {high[2], high[3]};
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
}

static inline void specdec_load8_d(const double *x, ptrdiff_t left, specdec_v2d out[4])
{
    double padded[8] = {0.0};
    const double *source = x;
    if (left < 8) {
        memcpy(padded, x, (size_t)left * sizeof(double));
        source = padded;
    }
    memcpy(out, source, 4 * sizeof(specdec_v2d));
}

#define SPECDEC_DEFINE_RESIDUAL_SUM(NAME, T, LOAD8)                                         \
    static inline void NAME##_group(const T *p, const T *q, ptrdiff_t point_mass,          \
                                    ptrdiff_t y, ptrdiff_t left, specdec_v2d acc[4])       \
    {                                                                                      \
        specdec_v2d p8[4], q8[4];                                                          \
        LOAD8(p + y, left, p8);                                                            \
        if (q) {                                                                           \
            LOAD8(q + y, left, q8);                                                        \
        } else if (point_mass < 0) {                                                       \
            for (int pair = 0; pair < 4; ++pair)                                           \
                q8[pair] = (specdec_v2d){0.0, 0.0};                                        \
        } else {                                                                           \
            for (int pair = 0; pair < 4; ++pair)                                           \
                q8[pair] = specdec_one_hot(y + 2 * pair, point_mass);                      \
        }                                                                                  \
        for (int pair = 0; pair < 4; ++pair)                                               \
            acc[pair] += specdec_positive_part(p8[pair] - q8[pair]);                       \
    }                                                                                      \
    static double NAME(const T *p, const T *q, ptrdiff_t point_mass, ptrdiff_t start,      \
                       ptrdiff_t stop)                                                     \
    {                                                                                      \
        specdec_v2d acc[4] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};             \
        ptrdiff_t y = start;                                                               \
        if (q) {                                                                           \
            for (; y + 8 <= stop; y += 8)                                                  \
                NAME##_group(p, q, point_mass, y, 8, acc);                                 \
        } else {                                                                           \
            /* q is zero outside the group holding point_mass: p - 0 is p exactly. */      \
            for (; y + 8 <= stop; y += 8) {                                                \
                if (point_mass >= y && point_mass < y + 8)                                 \
                    NAME##_group(p, NULL, point_mass, y, 8, acc);                          \
                else                                                                       \
                    NAME##_group(p, NULL, -1, y, 8, acc);                                  \
            }                                                                              \
        }                                                                                  \
        if (y < stop)                                                                      \
            NAME##_group(p, q, point_mass, y, stop - y, acc);                              \
        double lanes[8] = {acc[0][0], acc[0][1], acc[1][0], acc[1][1],                     \
                           acc[2][0], acc[2][1], acc[3][0], acc[3][1]};                    \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_RESIDUAL_SUM(specdec_residual_sum_f, float, specdec_load8_f)
SPECDEC_DEFINE_RESIDUAL_SUM(specdec_residual_sum_d, double, specdec_load8_d)

#else

#define SPECDEC_DEFINE_RESIDUAL_SUM(NAME, T)                                                \
    static double NAME(const T *p, const T *q, ptrdiff_t point_mass, ptrdiff_t start,      \
                       ptrdiff_t stop)                                                     \
    {                                                                                      \
        double lanes[8] = {0};                                                             \
        for (ptrdiff_t y = start; y < stop; ++y) {                                         \
            double q_y = q ? (double)q[y] : (y == point_mass ? 1.0 : 0.0);                 \
            lanes[(y - start) % 8] += specdec_residual_weight((double)p[y], q_y);          \
        }                                                                                  \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_RESIDUAL_SUM(specdec_residual_sum_f, float)
SPECDEC_DEFINE_RESIDUAL_SUM(specdec_residual_sum_d, double)

#endif

/* ---- entropy and maximum ------------------------------------------------------------- */

/* Returns sum_y p(y) * ln(p(y) + 1e-5) over [start, stop) in float64 (when want_entropy)
 * and stores the largest value in *maximum (NaN never wins; -inf if nothing beats it).
 * float rows use the float32-accurate log of _fastmath.h; double rows use libm. */
static double specdec_entropy_max_d(const double *row, ptrdiff_t start, ptrdiff_t stop,
                                    int want_entropy, double *maximum)
{
    double lanes[8] = {0};
    double best = -INFINITY;
    for (ptrdiff_t y = start; y < stop; ++y) {
        double p = row[y];
        if (want_entropy)
            lanes[(y - start) % 8] += p * log(p + 1e-5);
        best = p > best ? p : best;
    }
    *maximum = best;
    return SPECDEC_COMBINE_LANES(lanes);
}

#if SPECDEC_HAVE_VECTORS

static inline specdec_v4f specdec_fast_logf4(specdec_v4f x)
{
    specdec_v4i bits;
    memcpy(&bits, &x, sizeof bits);
    specdec_v4i exponent = ((bits >> 23) & 0xff) - 127;
    specdec_v4i mantissa_bits = (bits & 0x007fffff) | 0x3f800000;
    specdec_v4i above_sqrt2 = -(mantissa_bits > 0x3fb504f3); /* 0 or 1 per lane */
    mantissa_bits -= above_sqrt2 << 23;
    exponent += above_sqrt2;
    specdec_v4f mantissa;
    memcpy(&mantissa, &mantissa_bits, sizeof mantissa);
    specdec_v4f f = mantissa - 1.0f;
    specdec_v4f polynomial = f * -0.0810227021574974f + 0.1271267831325531f;
    polynomial = polynomial * f - 0.12972144782543182f;
    polynomial = polynomial * f + 0.14202114939689636f;
    polynomial = polynomial * f - 0.166422501206398f;
    polynomial = polynomial * f + 0.20001471042633057f;
    polynomial = polynomial * f - 0.2500029504299164f;
    polynomial = polynomial * f + 0.333333283662796f;
    specdec_v4f f2 = f * f;
    specdec_v4f log1p_f = f - 0.5f * f2 + f2 * f * polynomial;
    specdec_v4f e = __builtin_convertvector(exponent, specdec_v4f);
    return e * 0.693359375f + (e * -2.12194440e-4f + log1p_f);
}

static inline specdec_v4f specdec_max4(specdec_v4f candidates, specdec_v4f best)
{
    specdec_v4i wins = candidates > best; /* NaN candidates never win */
    return (specdec_v4f)(((specdec_v4i)candidates & wins) | ((specdec_v4i)best & ~wins));
}

static double specdec_entropy_max_f(const float *row, ptrdiff_t start, ptrdiff_t stop,
                                    int want_entropy, float *maximum)
{
    const specdec_v4f minus_infinity = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    specdec_v2d acc[4] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};
    specdec_v4f best_low = minus_infinity, best_high = minus_infinity;
    for (ptrdiff_t y = start; y < stop; y += 8) {
        ptrdiff_t left = stop - y;
        float values[8] = {0.0f}, candidates[8];
        specdec_v4f p[2], c[2];
        if (left >= 8) {
            memcpy(p, row + y, sizeof p);
            memcpy(c, row + y, sizeof c);
        } else {
            for (int lane = 0; lane < 8; ++lane)
                candidates[lane] = -INFINITY;
            memcpy(values, row + y, (size_t)left * sizeof(float));
            memcpy(candidates, row + y, (size_t)left * sizeof(float));
            memcpy(p, values, sizeof p);
            memcpy(c, candidates, sizeof c);
        }
        best_low = specdec_max4(c[0], best_low);
        best_high = specdec_max4(c[1], best_high);
        if (want_entropy) {
            /* Padding lanes hold p = 0 and add 0 * ln(1e-5) = 0. */
            for (int half = 0; half < 2; ++half) {
                specdec_v4f term = p[half] * specdec_fast_logf4(p[half] + 1e-5f);
                specdec_v2d first = {term[0], term[1]}, second = {term[2], term[3]};
                acc[2 * half] += first;
                acc[2 * half + 1] += second;
            }
        }
    }
    float result = -INFINITY;
    for (int lane = 0; lane < 4; ++lane) {
        result = best_low[lane] > result ? best_low[lane] : result;
        result = best_high[lane] > result ? best_high[lane] : result;
    }
    *maximum = result;
    double lanes[8] = {acc[0][0], acc[0][1], acc[1][0], acc[1][1],
                       acc[2][0], acc[2][1], acc[3][0], acc[3][1]};
    return SPECDEC_COMBINE_LANES(lanes);
}

#else

static double specdec_entropy_max_f(const float *row, ptrdiff_t start, ptrdiff_t stop,
                                    int want_entropy, float *maximum)
{
    double lanes[8] = {0};
    float best = -INFINITY;
    for (ptrdiff_t y = start; y < stop; ++y) {
        float p = row[y];
        if (want_entropy)
            lanes[(y - start) % 8] += (double)(p * specdec_fast_logf(p + 1e-5f));
        best = p > best ? p : best;
    }
    *maximum = best;
    return SPECDEC_COMBINE_LANES(lanes);
}

#endif

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

#endif
