/* The residual update of tree verification, r <- (r - q_j)+, over one vocabulary row.
 *
 * After a sibling is rejected, SpecInfer and RRS replace the node's residual r (the target
 * row, or the residual of the previous rejection divided by its mass) by the positive part
 * of r minus the sibling's draft row (divided by its mass for RRS), writing it to a float64
 * working row and returning its float64 sum.  Each element is SPECDEC_RESIDUAL_UPDATE of
 * elementwise.h (the CUDA kernels' too), in the order of the reference:
 *
 *   a = src[y] / src_mass   (src_mass == 1: a = src[y], which is the same number)
 *   b = max(q[y], 0) / q_mass   (NaN counts as 0; q_mass == 1: no division)
 *   w = a - b if a - b > 0 else 0   (NaN weighs 0)
 *
 * The sum uses eight lanes combined as in rowscan.h, so that its order is fixed by this
 * code and not by the compiler.  GCC does not vectorise these loops on its own (a float64
 * sum in a fixed order); the vector versions below use rowscan.h's GNU vector types, and
 * the scalar fallback (SPECDEC_NO_VECTOR_EXTENSIONS) does the same operations per element
 * and per lane, so both give the same bits (IEEE division and comparisons are exact per
 * lane, and the zero padding of a last partial group adds +0 to a lane).
 */
#ifndef SPECDEC_TREESCAN_H
#define SPECDEC_TREESCAN_H

#include "rowscan.h"

#if SPECDEC_HAVE_VECTORS

#define SPECDEC_DEFINE_RESIDUAL_UPDATE(NAME, SRC_T, Q_T, LOAD_SRC, LOAD_Q)                 \
    SPECDEC_INLINE void NAME##_group(const SRC_T *src, specdec_v4d src_mass,              \
                                    int divide_src, const Q_T *q, specdec_v4d q_mass,     \
                                    int divide_q, ptrdiff_t y, ptrdiff_t left,             \
                                    double *dst, specdec_v4d acc[2])                       \
    {                                                                                      \
        specdec_v4d a[2], b[2];                                                            \
        LOAD_SRC(src + y, left, a);                                                        \
        LOAD_Q(q + y, left, b);                                                            \
        for (int half = 0; half < 2; ++half) {                                             \
            SPECDEC_RESIDUAL_UPDATE(specdec_positive_part, a[half], b[half], src_mass,     \
                                    divide_src, q_mass, divide_q);                         \
            acc[half] += a[half];                                                          \
        }                                                                                  \
        memcpy(dst + y, a, (size_t)(left < 8 ? left : 8) * sizeof(double));                \
    }                                                                                      \
    SPECDEC_CLONES                                                                         \
    static double NAME(const SRC_T *src, double src_mass, const Q_T *q, double q_mass,     \
                       ptrdiff_t V, double *dst)                                           \
    {                                                                                      \
        specdec_v4d acc[2] = {{0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}};                \
        const specdec_v4d src4 = {src_mass, src_mass, src_mass, src_mass};                 \
        const specdec_v4d q4 = {q_mass, q_mass, q_mass, q_mass};                           \
        const int divide_src = src_mass != 1.0, divide_q = q_mass != 1.0;                  \
        ptrdiff_t y = 0;                                                                   \
        for (; y + 8 <= V; y += 8)                                                         \
            NAME##_group(src, src4, divide_src, q, q4, divide_q, y, 8, dst, acc);          \
        if (y < V)                                                                         \
            NAME##_group(src, src4, divide_src, q, q4, divide_q, y, V - y, dst, acc);      \
        double lanes[8];                                                                   \
        memcpy(lanes, acc, sizeof lanes);                                                  \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_RESIDUAL_UPDATE(specdec_residual_update_ff, float, float, specdec_load8_f,
                               specdec_load8_f)
SPECDEC_DEFINE_RESIDUAL_UPDATE(specdec_residual_update_df, double, float, specdec_load8_d,
                               specdec_load8_f)
SPECDEC_DEFINE_RESIDUAL_UPDATE(specdec_residual_update_dd, double, double, specdec_load8_d,
                               specdec_load8_d)

/* sum of max(q[y], 0) over the row (NaN counts as 0), in the lane order above: the mass of
 * an RRS draft row before the tried siblings are taken out. */
#define SPECDEC_DEFINE_CLEAN_SUM(NAME, T, LOAD)                                            \
    SPECDEC_CLONES                                                                         \
    static double NAME(const T *q, ptrdiff_t V)                                            \
    {                                                                                      \
        specdec_v4d acc[2] = {{0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}};                \
        specdec_v4d b[2];                                                                  \
        for (ptrdiff_t y = 0; y < V; y += 8) {                                             \
            LOAD(q + y, V - y, b);                                                         \
            acc[0] += specdec_positive_part(b[0]);                                         \
            acc[1] += specdec_positive_part(b[1]);                                         \
        }                                                                                  \
        double lanes[8];                                                                   \
        memcpy(lanes, acc, sizeof lanes);                                                  \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_CLEAN_SUM(specdec_clean_sum_f, float, specdec_load8_f)
SPECDEC_DEFINE_CLEAN_SUM(specdec_clean_sum_d, double, specdec_load8_d)

/* dst[y] = max(src[y], 0) (NaN counts as 0): a target row copied to the working row so
 * that tokens can be taken out of it before the final draw. */
#define SPECDEC_DEFINE_CLEAN_COPY(NAME, T, LOAD)                                           \
    SPECDEC_CLONES                                                                         \
    static void NAME(const T *src, ptrdiff_t V, double *dst)                               \
    {                                                                                      \
        specdec_v4d a[2];                                                                  \
        for (ptrdiff_t y = 0; y < V; y += 8) {                                             \
            LOAD(src + y, V - y, a);                                                       \
            a[0] = specdec_positive_part(a[0]);                                            \
            a[1] = specdec_positive_part(a[1]);                                            \
            memcpy(dst + y, a, (size_t)(V - y < 8 ? V - y : 8) * sizeof(double));          \
        }                                                                                  \
    }

SPECDEC_DEFINE_CLEAN_COPY(specdec_clean_copy_f, float, specdec_load8_f)
SPECDEC_DEFINE_CLEAN_COPY(specdec_clean_copy_d, double, specdec_load8_d)

#else

#define SPECDEC_DEFINE_RESIDUAL_UPDATE(NAME, SRC_T, Q_T)                                   \
    static double NAME(const SRC_T *src, double src_mass, const Q_T *q, double q_mass,     \
                       ptrdiff_t V, double *dst)                                           \
    {                                                                                      \
        double lanes[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};                        \
        const int divide_src = src_mass != 1.0, divide_q = q_mass != 1.0;                  \
        ptrdiff_t y = 0;                                                                   \
        for (; y + 8 <= V; y += 8) {                                                       \
            for (int lane = 0; lane < 8; ++lane) {                                         \
                double a = (double)src[y + lane], b = (double)q[y + lane];                 \
                SPECDEC_RESIDUAL_UPDATE(specdec_clean, a, b, src_mass, divide_src, q_mass, \
                                        divide_q);                                         \
                dst[y + lane] = a;                                                         \
                lanes[lane] += a;                                                          \
            }                                                                              \
        }                                                                                  \
        for (int lane = 0; y < V; ++y, ++lane) {                                           \
            double a = (double)src[y], b = (double)q[y];                                   \
            SPECDEC_RESIDUAL_UPDATE(specdec_clean, a, b, src_mass, divide_src, q_mass,     \
                                    divide_q);                                             \
            dst[y] = a;                                                                    \
            lanes[lane] += a;                                                              \
        }                                                                                  \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_RESIDUAL_UPDATE(specdec_residual_update_ff, float, float)
SPECDEC_DEFINE_RESIDUAL_UPDATE(specdec_residual_update_df, double, float)
SPECDEC_DEFINE_RESIDUAL_UPDATE(specdec_residual_update_dd, double, double)

/* sum of max(q[y], 0) over the row (NaN counts as 0), in the lane order above: the mass of
 * an RRS draft row before the tried siblings are taken out. */
#define SPECDEC_DEFINE_CLEAN_SUM(NAME, T)                                                  \
    static double NAME(const T *q, ptrdiff_t V)                                            \
    {                                                                                      \
        double lanes[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};                        \
        ptrdiff_t y = 0;                                                                   \
        for (; y + 8 <= V; y += 8) {                                                       \
            for (int lane = 0; lane < 8; ++lane)                                           \
                lanes[lane] += specdec_clean((double)q[y + lane]);                         \
        }                                                                                  \
        for (int lane = 0; y < V; ++y, ++lane)                                             \
            lanes[lane] += specdec_clean((double)q[y]);                                    \
        return SPECDEC_COMBINE_LANES(lanes);                                               \
    }

SPECDEC_DEFINE_CLEAN_SUM(specdec_clean_sum_f, float)
SPECDEC_DEFINE_CLEAN_SUM(specdec_clean_sum_d, double)

/* dst[y] = max(src[y], 0) (NaN counts as 0): a target row copied to the working row so
 * that tokens can be taken out of it before the final draw. */
#define SPECDEC_DEFINE_CLEAN_COPY(NAME, T)                                                 \
    static void NAME(const T *src, ptrdiff_t V, double *dst)                               \
    {                                                                                      \
        for (ptrdiff_t y = 0; y < V; ++y)                                                  \
            dst[y] = specdec_clean((double)src[y]);                                        \
    }

SPECDEC_DEFINE_CLEAN_COPY(specdec_clean_copy_f, float)
SPECDEC_DEFINE_CLEAN_COPY(specdec_clean_copy_d, double)

#endif

#endif
