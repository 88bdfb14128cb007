/* The float32 exponential of elementwise.h on CPU vectors, every instance from its one
 * body (SPECDEC_DEFINE_FAST_EXP and SPECDEC_DEFINE_FAST_EXP_GROUPS): eight lanes (every
 * x86-64 clone), sixteen (AVX-512), and groups of either side by side for the row's
 * exponential pass (logits_law.h's kept sums).
 *
 * The pass is bound by the exponential's chain of ~25 dependent steps: on one group at a
 * time, an out-of-order core holds too few groups in flight to keep its units busy.
 * SPECDEC_EXP_GROUPS groups, each step run on all of them before the next, hide that
 * latency (benchmarks/results/2026-12-07-exponential-groups).  Every lane still computes
 * the same correctly rounded operations, so every instance gives the same bits.
 *
 * GCC lowers a GNU vector wider than the register through memory, so the groups are arrays
 * of register-wide vectors, and the AVX2 pass widens its weights to float64 with
 * intrinsics (SPECDEC_AVX2, rowscan.h): GCC builds __builtin_convertvector's eight-to-four
 * widening from 128-bit halves there. */
#ifndef SPECDEC_EXPONENTIALS_H
#define SPECDEC_EXPONENTIALS_H

#include "rowscan.h"

#if SPECDEC_HAVE_VECTORS

/* ---- eight lanes --------------------------------------------------------------------- */

/* specdec_fast_expf of elementwise.h, from the same body, on eight lanes.  Its fused
 * multiply-add is fmaf lane by lane, which GCC turns into one vfmadd in the clones that
 * have FMA (SPECDEC_CLONES) and into correctly rounded libm calls in the baseline one: the
 * same bits either way. */
#define SPECDEC_TO_V8I(x) __builtin_convertvector((x), specdec_v8i)
#define SPECDEC_VECTOR_MASK(condition) ((specdec_v8i)(condition))

/* a b + c rounded once, W lanes (specdec_fma8, specdec_fma16). */
#define SPECDEC_DEFINE_FMA(W)                                                               \
    SPECDEC_INLINE specdec_v##W##f specdec_fma##W(specdec_v##W##f a, specdec_v##W##f b,     \
                                                  specdec_v##W##f c)                       \
    {                                                                                      \
        specdec_v##W##f result;                                                            \
        for (int l = 0; l < W; ++l)                                                        \
            result[l] = fmaf(a[l], b[l], c[l]);                                            \
        return result;                                                                     \
    }

SPECDEC_DEFINE_FMA(8)

SPECDEC_INLINE specdec_v8f specdec_broadcast8(float x)
{
    return (specdec_v8f){x, x, x, x, x, x, x, x};
}

SPECDEC_INLINE specdec_v8f specdec_same8(specdec_v8f x)
{
    return x;
}

/* An operand of the vector FMA: a vector as it is, a float32 constant on every lane. */
#define SPECDEC_LANES8(x) _Generic((x), float: specdec_broadcast8, default: specdec_same8)(x)
#define SPECDEC_VECTOR_FMA(a, b, c)                                                         \
    specdec_fma8(SPECDEC_LANES8(a), SPECDEC_LANES8(b), SPECDEC_LANES8(c))
SPECDEC_DEFINE_FAST_EXP(SPECDEC_INLINE, specdec_fast_expf8, specdec_v8f, specdec_v8i,
                        SPECDEC_TO_V8I, SPECDEC_VECTOR_MASK, SPECDEC_VECTOR_FMA)

/* ---- sixteen lanes ------------------------------------------------------------------- */

/* Eight float64 lanes (one AVX-512 register, two AVX2 ones) and sixteen float32 ones.  A
 * row sums on the eight lanes y mod 8 at either width: the low and the high half of a
 * sixteen are added to the same eight lanes, in element order, so both widths give the
 * same bits. */
typedef double specdec_v8d __attribute__((vector_size(64)));
typedef specdec_v8d specdec_lanes16;
typedef float specdec_v16f __attribute__((vector_size(64)));
typedef int32_t specdec_v16i __attribute__((vector_size(64)));

SPECDEC_DEFINE_FMA(16)

SPECDEC_INLINE specdec_v16f specdec_splat16(float x)
{
    return (specdec_v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

SPECDEC_INLINE specdec_v16f specdec_same16(specdec_v16f x)
{
    return x;
}

#define SPECDEC_LANES16(x) _Generic((x), float: specdec_splat16, default: specdec_same16)(x)
#define SPECDEC_VECTOR_FMA16(a, b, c)                                                       \
    specdec_fma16(SPECDEC_LANES16(a), SPECDEC_LANES16(b), SPECDEC_LANES16(c))
#define SPECDEC_TO_V16I(x) __builtin_convertvector((x), specdec_v16i)
#define SPECDEC_VECTOR_MASK16(condition) ((specdec_v16i)(condition))
SPECDEC_DEFINE_FAST_EXP(SPECDEC_INLINE, specdec_fast_expf16, specdec_v16f, specdec_v16i,
                        SPECDEC_TO_V16I, SPECDEC_VECTOR_MASK16, SPECDEC_VECTOR_FMA16)

/* ---- groups side by side ------------------------------------------------------------- */

#define SPECDEC_EXP_GROUPS 4

SPECDEC_DEFINE_FAST_EXP_GROUPS(SPECDEC_INLINE, specdec_fast_expf8_groups, specdec_v8f,
                               specdec_v8i, SPECDEC_TO_V8I, SPECDEC_VECTOR_MASK,
                               SPECDEC_VECTOR_FMA, SPECDEC_EXP_GROUPS)
SPECDEC_DEFINE_FAST_EXP_GROUPS(SPECDEC_INLINE, specdec_fast_expf16_groups, specdec_v16f,
                               specdec_v16i, SPECDEC_TO_V16I, SPECDEC_VECTOR_MASK16,
                               SPECDEC_VECTOR_FMA16, SPECDEC_EXP_GROUPS)

#if SPECDEC_X86_AVX2
/* specdec_add_lanes8 (rowscan.h) on AVX2: lanes 0-3 then 4-7, widened by vcvtps2pd. */
SPECDEC_AVX2 SPECDEC_INLINE void specdec_add_lanes8_avx2(specdec_v8f w,
                                                         specdec_lanes8 *lanes)
{
    lanes->low += (specdec_v4d)_mm256_cvtps_pd(_mm256_castps256_ps128((__m256)w));
    lanes->high += (specdec_v4d)_mm256_cvtps_pd(_mm256_extractf128_ps((__m256)w, 1));
}
#endif

#endif /* SPECDEC_HAVE_VECTORS */

#endif
