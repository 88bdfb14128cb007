/* The per-element maths of specdec_np, written once for both backends.
 *
 * Every formula that the CPU kernels and the CUDA kernels compute element by element (or
 * position by position) is defined here, and nowhere else: the float32 exponential and
 * logarithm, the keys of z and their inverse, the weight w = exp(z - m) of float and
 * double rows, the law's probability of one entry and its stored value, the residual
 * weight, the clean draft value, the residual-update element, the entropy term, the min-p
 * bisection, the scalar decisions of the radix select, of the inverse-CDF draw and of the
 * verifiers.  The two backends give the same bits because they run the same code.  What is
 * not here is how a row is visited and summed: the CPU sums on eight lanes (rowscan.h),
 * the GPU in block reductions (specdec_np/_kernels/src/), each in a fixed order of its own.
 *
 * One text, four compilers: C11 under GCC or Clang (the Cython build, through rowscan.h,
 * logits_law.h and treescan.h), C++ under g++ (the CPU emulation of the CUDA kernels in the
 * tests), and CUDA C++ under nvcc and under NVRTC (cupy.RawModule), which has no system
 * headers: hence the guarded includes and integer types below.  On CUDA the modules are
 * compiled with --fmad=false, so that no product below is fused with a sum unless the text
 * says so (the exponential's explicit fused multiply-adds): every operation rounds as the
 * CPU's does.  The C builds are ISO C (-std=c11), which contracts nothing either.
 *
 * The formulas that the CPU also computes on vectors are macro bodies written with
 * operators that GNU C defines on scalars and on vectors alike (SPECDEC_DEFINE_FAST_EXP,
 * SPECDEC_DEFINE_FAST_LOG, SPECDEC_ENTROPY_TERM_F, SPECDEC_RESIDUAL_WEIGHT,
 * SPECDEC_RESIDUAL_UPDATE): the scalar instances are defined here, the vector instances
 * in the CPU headers from the same bodies, so the vector lanes and the scalars agree bit
 * for bit.  Changing a formula is a change of this file alone.
 *
 * The kernel contract's constants (SPECDEC_ENTROPY_EPSILON, SPECDEC_OVERFLOW_EXPONENT)
 * come from specdec_np/_runtime/contract.py: setup.py passes them to the C compiler and
 * specdec_np/_kernels/cuda.py writes them at the top of every CUDA source.
 */
#ifndef SPECDEC_ELEMENTWISE_H
#define SPECDEC_ELEMENTWISE_H

#if defined(__CUDACC_RTC__)
/* NVRTC provides no system header; these are the types of every CUDA target. */
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <math.h>
#include <stdint.h>
#include <string.h>
#endif

#if !defined(SPECDEC_ENTROPY_EPSILON) || !defined(SPECDEC_OVERFLOW_EXPONENT)
#error "the kernel contract's macros must be defined first (setup.py, specdec_np/_kernels/cuda.py's prelude)"
#endif

/* SPECDEC_SHARED qualifies every function below: an inline device function on CUDA (not
 * static, so that a source using only some of them compiles without warnings), a static
 * inline one in C and C++.  The infinities are spelled without math.h on CUDA. */
#if defined(__CUDACC__)
#define SPECDEC_SHARED __device__ __forceinline__
#define SPECDEC_INFINITY_F __int_as_float(0x7f800000)
#define SPECDEC_INFINITY_D __longlong_as_double(0x7ff0000000000000LL)
#else
#if defined(__GNUC__)
#define SPECDEC_SHARED static inline __attribute__((always_inline))
#else
#define SPECDEC_SHARED static inline
#endif
#define SPECDEC_INFINITY_F INFINITY
#define SPECDEC_INFINITY_D ((double)INFINITY)
#endif

/* ---- sums in lanes ------------------------------------------------------------------ */

/* Lane l (0..7) of a row sum accumulates the elements 8 i + l; the lanes are combined as
 * ((L0 + L4) + (L1 + L5)) + ((L2 + L6) + (L3 + L7)) by both backends. */
#define SPECDEC_COMBINE_LANES(L)                                                           \
    ((((L)[0] + (L)[4]) + ((L)[1] + (L)[5])) + (((L)[2] + (L)[6]) + ((L)[3] + (L)[7])))

/* ---- the specified float32 exponential ------------------------------------------------ */

/* libm's expf is an opaque call per element, which stops the CPU loops from vectorising
 * and differs between libraries; this one is a fixed sequence of IEEE float32 operations,
 * seven of them fused multiply-adds (FMA(a, b, c) = a b + c rounded once), written once
 * with operators that GNU C defines on scalars and on vectors alike.  Every instance gives
 * the same bits, because every operation is correctly rounded: fmaf on CUDA and in the
 * scalar instance (hardware FMA where the CPU has it, libm's correctly rounded fmaf
 * elsewhere), vfmadd on the CPU's FMA3 and AVX-512 clones (rowscan.h's SPECDEC_CLONES).
 * docs/semantics.md ("The exponential") states the sequence:
 *   x is clamped to [-104, 88] (below -104, -inf and NaN give 0 at the end);
 *   n = FMA(x, log2 e, 1.5 2^23) - 1.5 2^23      (round(x / ln 2), ties to even)
 *   r = FMA(n, -C1, x); r = FMA(n, C2, r)        (x - n ln 2, ln 2 = C1 - C2, C1 with 9
 *                                                 significant bits, so n C1 is exact)
 *   q = FMA(r, Q4, Q3); q = FMA(q, r, Q2); q = FMA(q, r, Q1); q = FMA(q, r, Q0)
 *   e = 1 + FMA(r r, q, r)                       (exp(r) = 1 + r + r^2 Q(r), Q fitted for
 *                                                 this project: Lawson-weighted least
 *                                                 squares on Chebyshev nodes, relative
 *                                                 error 3e-9 on |r| <= 0.3466)
 *   result = (e 2^floor(n/2)) 2^(n - floor(n/2))  (two exact powers of two, so that a
 *                                                 subnormal result is rounded once).
 * FMA is fmaf on scalars, a lane-wise fmaf on vectors (which GCC compiles to one vfmadd
 * where the target has FMA); constants are float32 scalars, broadcast by the vector FMA.
 *
 * SPECDEC_DEFINE_FAST_EXP_GROUPS defines NAME(x, out) over GROUPS independent values,
 * out[g] = exp(x[g]), each step run on every group before the next: an AVX2 CPU then has
 * GROUPS chains in flight where one chain of ~25 dependent steps leaves its units idle
 * (exponentials.h).  SPECDEC_DEFINE_FAST_EXP defines NAME(x) from one group. */
#if defined(__CUDACC__)
#define SPECDEC_EACH_GROUP(...)                                                            \
    _Pragma("unroll") for (int g_ = 0; g_ < groups_; ++g_) { __VA_ARGS__; }
#elif defined(__GNUC__)
/* Unrolled before the arrays below are split into registers (GCC keeps them in memory
 * otherwise). */
#define SPECDEC_EACH_GROUP(...)                                                            \
    _Pragma("GCC unroll 8") for (int g_ = 0; g_ < groups_; ++g_) { __VA_ARGS__; }
#else
#define SPECDEC_EACH_GROUP(...)                                                            \
    for (int g_ = 0; g_ < groups_; ++g_) {                                                 \
        __VA_ARGS__;                                                                       \
    }
#endif

#define SPECDEC_DEFINE_FAST_EXP_GROUPS(QUALIFIER, NAME, FLOAT_T, INT_T, TO_INT, TO_MASK,  \
                                       FMA, GROUPS)                                        \
    QUALIFIER void NAME(const FLOAT_T *x, FLOAT_T *out)                                    \
    {                                                                                      \
        enum { groups_ = GROUPS };                                                         \
        const float lowest = -104.0f, highest = 88.0f;                                     \
        int32_t lowest_bits, highest_bits;                                                 \
        memcpy(&lowest_bits, &lowest, sizeof lowest_bits);                                 \
        memcpy(&highest_bits, &highest, sizeof highest_bits);                              \
        INT_T keep[GROUPS], clamped_bits[GROUPS], n[GROUPS];                               \
        FLOAT_T clamped[GROUPS], n_float[GROUPS], r[GROUPS], q[GROUPS], mantissa[GROUPS];  \
        SPECDEC_EACH_GROUP(                                                                \
            INT_T x_bits; memcpy(&x_bits, &x[g_], sizeof x_bits);                          \
            /* keep is all ones where x >= -104 (never for NaN or -inf), else zero. */     \
            keep[g_] = TO_MASK(x[g_] >= lowest);                                           \
            INT_T above_highest = TO_MASK(x[g_] > highest);                                \
            /* Two selects (a ^ ((a ^ b) & mask) is b where mask is set, else a): this     \
             * form keeps GCC 12's sixteen-lane code in vector registers. */               \
            INT_T highest_x = (x_bits & 0) + highest_bits;                                 \
            INT_T lowest_x = (x_bits & 0) + lowest_bits;                                   \
            clamped_bits[g_] = x_bits ^ ((x_bits ^ highest_x) & above_highest);            \
            clamped_bits[g_] ^= (clamped_bits[g_] ^ lowest_x) & ~keep[g_];                 \
            memcpy(&clamped[g_], &clamped_bits[g_], sizeof clamped[g_]))                   \
        /* Adding and removing 1.5 * 2^23 rounds to the nearest integer, ties to even. */  \
        SPECDEC_EACH_GROUP(                                                                \
            n_float[g_] = FMA(clamped[g_], 0x1.715476p+0f, 0x1.8p+23f) - 0x1.8p+23f)       \
        SPECDEC_EACH_GROUP(r[g_] = FMA(n_float[g_], -0x1.63p-1f, clamped[g_]))             \
        SPECDEC_EACH_GROUP(r[g_] = FMA(n_float[g_], 0x1.bd0106p-13f, r[g_]))               \
        SPECDEC_EACH_GROUP(q[g_] = FMA(r[g_], 0x1.6a243ap-10f, 0x1.1239ep-7f))             \
        SPECDEC_EACH_GROUP(q[g_] = FMA(q[g_], r[g_], 0x1.5558f2p-5f))                      \
        SPECDEC_EACH_GROUP(q[g_] = FMA(q[g_], r[g_], 0x1.555492p-3f))                      \
        SPECDEC_EACH_GROUP(q[g_] = FMA(q[g_], r[g_], 0x1.fffffcp-2f))                      \
        SPECDEC_EACH_GROUP(mantissa[g_] = 1.0f + FMA(r[g_] * r[g_], q[g_], r[g_]))         \
        SPECDEC_EACH_GROUP(n[g_] = TO_INT(n_float[g_]))                                    \
        SPECDEC_EACH_GROUP(                                                                \
            INT_T n_low = n[g_] >> 1;                                                      \
            INT_T n_high = n[g_] - n_low;                                                  \
            INT_T scale_low_bits = (n_low + 127) << 23;                                    \
            INT_T scale_high_bits = (n_high + 127) << 23;                                  \
            FLOAT_T scale_low, scale_high;                                                 \
            memcpy(&scale_low, &scale_low_bits, sizeof scale_low);                         \
            memcpy(&scale_high, &scale_high_bits, sizeof scale_high);                      \
            FLOAT_T result = (mantissa[g_] * scale_low) * scale_high;                      \
            INT_T result_bits;                                                             \
            memcpy(&result_bits, &result, sizeof result_bits);                             \
            result_bits &= keep[g_];                                                       \
            memcpy(&out[g_], &result_bits, sizeof result_bits))                            \
    }

#define SPECDEC_DEFINE_FAST_EXP(QUALIFIER, NAME, FLOAT_T, INT_T, TO_INT, TO_MASK, FMA)     \
    SPECDEC_DEFINE_FAST_EXP_GROUPS(QUALIFIER, NAME##_group, FLOAT_T, INT_T, TO_INT,       \
                                   TO_MASK, FMA, 1)                                        \
    QUALIFIER FLOAT_T NAME(FLOAT_T x)                                                      \
    {                                                                                      \
        FLOAT_T result;                                                                    \
        NAME##_group(&x, &result);                                                         \
        return result;                                                                     \
    }

/* A comparison as a mask of all ones or zeros (a scalar comparison gives 1 or 0). */
#define SPECDEC_TO_INT32(x) ((int32_t)(x))
#define SPECDEC_SCALAR_MASK(condition) (-(int32_t)(condition))
#define SPECDEC_SCALAR_FMA(a, b, c) fmaf((a), (b), (c))
SPECDEC_DEFINE_FAST_EXP(SPECDEC_SHARED, specdec_fast_expf, float, int32_t, SPECDEC_TO_INT32,
                        SPECDEC_SCALAR_MASK, SPECDEC_SCALAR_FMA)

/* ---- a float32-accurate natural logarithm ------------------------------------------- */

/* libm's logf is an opaque call per element, which stops the entropy loop from
 * vectorising; this one is branch-free integer and polynomial arithmetic, one body for
 * scalars and vectors like the exponential.  The polynomial was fitted for this project by
 * least squares on Chebyshev nodes: log1p(f) = f - f^2/2 + f^3 P(f) for f in
 * [sqrt(1/2) - 1, sqrt(2) - 1], with a maximum absolute error there of 4e-8 (about one
 * float32 ulp).  Valid for positive, normal, finite x, which is what the kernels pass (a
 * probability plus the entropy epsilon); other inputs give a finite but meaningless value,
 * never a trap. */
#define SPECDEC_DEFINE_FAST_LOG(QUALIFIER, NAME, FLOAT_T, INT_T, TO_FLOAT)                  \
    QUALIFIER FLOAT_T NAME(FLOAT_T x)                                                      \
    {                                                                                      \
        INT_T bits;                                                                        \
        memcpy(&bits, &x, sizeof bits);                                                    \
        INT_T exponent = ((bits >> 23) & 0xff) - 127;                                      \
        INT_T mantissa_bits = (bits & 0x007fffff) | 0x3f800000;                            \
        /* Centre the mantissa on 1 so that the polynomial stays small. */                 \
        INT_T above_sqrt2 = (INT_T)(mantissa_bits > 0x3fb504f3) & 1;                       \
        mantissa_bits -= above_sqrt2 << 23;                                                \
        exponent += above_sqrt2;                                                           \
        FLOAT_T mantissa;                                                                  \
        memcpy(&mantissa, &mantissa_bits, sizeof mantissa);                                \
        FLOAT_T f = mantissa - 1.0f;                                                       \
        FLOAT_T polynomial = f * -0.0810227021574974f + 0.1271267831325531f;               \
        polynomial = polynomial * f - 0.12972144782543182f;                                \
        polynomial = polynomial * f + 0.14202114939689636f;                                \
        polynomial = polynomial * f - 0.166422501206398f;                                  \
        polynomial = polynomial * f + 0.20001471042633057f;                                \
        polynomial = polynomial * f - 0.2500029504299164f;                                 \
        polynomial = polynomial * f + 0.333333283662796f;                                  \
        FLOAT_T f2 = f * f;                                                                \
        FLOAT_T log1p_f = f - 0.5f * f2 + f2 * f * polynomial;                             \
        FLOAT_T e = TO_FLOAT(exponent);                                                    \
        /* ln 2 in two parts, so that e * ln 2 adds no rounding error of its own. */       \
        return e * 0.693359375f + (e * -2.12194440e-4f + log1p_f);                         \
    }

#define SPECDEC_TO_FLOAT(x) ((float)(x))
SPECDEC_DEFINE_FAST_LOG(SPECDEC_SHARED, specdec_fast_logf, float, int32_t, SPECDEC_TO_FLOAT)

/* ---- clean values, residual weights and updates -------------------------------------- */

/* max(x, 0) with NaN counted as 0: a draft probability as every kernel reads it (negative
 * and NaN entries weigh nothing) and the positive part of a weight. */
SPECDEC_SHARED double specdec_clean(double x)
{
    return x > 0.0 ? x : 0.0;
}

/* The draw weight max(rho p - q, 0) * scale, q already clean.  rho scales the target
 * (block verification's weighted residual; 1 for token-wise rejection, where multiplying
 * by it is exact); scale, a power of two (1 unless a float64 sum would overflow), is
 * applied last, so it changes no decision between weights.  POSITIVE is specdec_clean on
 * scalars, a lane mask on the CPU's vectors. */
#define SPECDEC_RESIDUAL_WEIGHT(POSITIVE, p, q_clean, rho, scale)                           \
    (POSITIVE((rho) * (p) - (q_clean)) * (scale))

SPECDEC_SHARED double specdec_residual_weight(double p, double q, double rho, double scale)
{
    return SPECDEC_RESIDUAL_WEIGHT(specdec_clean, p, specdec_clean(q), rho, scale);
}

/* One element of the tree residual update, in place on a and b:
 *   a <- a / src_mass   (skipped when src_mass is 1: a / 1 is a)
 *   b <- max(b, 0) / q_mass   (NaN counts as 0; skipped when q_mass is 1)
 *   a <- max(a - b, 0)   (NaN weighs 0)
 * divide_src and divide_q say whether the masses differ from 1 (the CPU tests that once
 * per row). */
#define SPECDEC_RESIDUAL_UPDATE(POSITIVE, a, b, src_mass, divide_src, q_mass, divide_q)     \
    do {                                                                                   \
        if (divide_src)                                                                    \
            (a) = (a) / (src_mass);                                                        \
        (b) = POSITIVE(b);                                                                 \
        if (divide_q)                                                                      \
            (b) = (b) / (q_mass);                                                          \
        (a) = POSITIVE((a) - (b));                                                         \
    } while (0)

SPECDEC_SHARED double specdec_residual_update_element(double a, double src_mass, double b,
                                                      double q_mass)
{
    SPECDEC_RESIDUAL_UPDATE(specdec_clean, a, b, src_mass, src_mass != 1.0, q_mass,
                            q_mass != 1.0);
    return a;
}

/* The factor applied to every weight of a row whose float64 sum overflows to inf, so that
 * v * Z stays finite (specdec_np/_runtime/contract.py: OVERFLOW_EXPONENT). */
SPECDEC_SHARED double specdec_overflow_scale(void)
{
    return ldexp(1.0, SPECDEC_OVERFLOW_EXPONENT);
}

/* ---- the entropy term -------------------------------------------------------------- */

/* p ln(p + epsilon), a term of typical acceptance's entropy, accumulated in float64.  float
 * rows take the float32 logarithm above and a float32 product (LOG is specdec_fast_logf on
 * scalars, its vector instance on the CPU's vectors); double rows libm's log. */
#define SPECDEC_ENTROPY_TERM_F(LOG, p) ((p) * LOG((p) + (float)SPECDEC_ENTROPY_EPSILON))

SPECDEC_SHARED double specdec_entropy_term_f(float p)
{
    return (double)SPECDEC_ENTROPY_TERM_F(specdec_fast_logf, p);
}

SPECDEC_SHARED double specdec_entropy_term_d(double p)
{
    return p * log(p + SPECDEC_ENTROPY_EPSILON);
}

/* ---- the processed law of a logits row: keys, weights, entries ----------------------- */

/* The law of one row: the kept set is {y : z(y) >= cutoff} (docs/semantics.md). */
typedef struct {
    double z_max;      /* m: the largest z (+inf when the row has +inf entries) */
    double cutoff;     /* the kept set is {y : z(y) >= cutoff}; -inf keeps every non-NaN z */
    double normaliser; /* sum of w over the kept set (the count of +inf entries if any) */
    int64_t num_infinite;
    int64_t status; /* 0: a law; 1: no entry has a finite maximum, the row has no mass;
                       2: its largest finite logit overflows at the temperature (a check
                       left to the law, specdec_law_scratch's finds_overflow) */
} specdec_row_law;

/* The key of a float z that is not NaN, from the bits of z + 0 and the mask of its sign
 * (all ones for a negative z, else 0): one expression for one key and for a vector of
 * them (the CPU's sixteen-lane partitions). */
#define SPECDEC_KEY_FROM_BITS_F(bits, sign_mask) ((bits) ^ ((sign_mask) | 0x80000000u))

/* The monotone integer image of a z value: keys compare as the values do, -0 and +0
 * share one key, and NaN gets key 0, below every value (-inf has a key above 0). */
SPECDEC_SHARED uint32_t specdec_key_f(float z)
{
    if (z != z)
        return 0;
    z = z + 0.0f;
    uint32_t bits;
    memcpy(&bits, &z, sizeof bits);
    return SPECDEC_KEY_FROM_BITS_F(bits, (bits >> 31) ? 0xffffffffu : 0u);
}

SPECDEC_SHARED float specdec_value_f(uint32_t key)
{
    uint32_t bits = (key & 0x80000000u) ? key ^ 0x80000000u : ~key;
    float z;
    memcpy(&z, &bits, sizeof z);
    return z;
}

SPECDEC_SHARED uint64_t specdec_key_d(double z)
{
    if (z != z)
        return 0;
    z = z + 0.0;
    uint64_t bits;
    memcpy(&bits, &z, sizeof bits);
    return bits ^ ((bits >> 63) ? 0xffffffffffffffffull : 0x8000000000000000ull);
}

SPECDEC_SHARED double specdec_value_d(uint64_t key)
{
    uint64_t bits = (key & 0x8000000000000000ull) ? key ^ 0x8000000000000000ull : ~key;
    double z;
    memcpy(&z, &bits, sizeof z);
    return z;
}

/* w = exp(z - m): the float32 exponential above for float rows, libm's exp for double
 * rows (NaN weighs 0). */
SPECDEC_SHARED double specdec_weight_f(float z, float z_max)
{
    return (double)specdec_fast_expf(z - z_max);
}

SPECDEC_SHARED double specdec_weight_d(double z, double z_max)
{
    double x = z - z_max;
    return x == x ? exp(x) : 0.0;
}

/* The per-dtype functions of the law (suffix f: float rows, d: double rows). */
#define SPECDEC_DEFINE_LAW_ELEMENTS(SUFFIX, T, KEY_T, INFINITY_T)                           \
    /* One entry of the maximum pass: the running maximum (NaN never wins, so any grouping \
     * finds the same one) and the count of +inf entries. */                               \
    SPECDEC_SHARED void specdec_max_step_##SUFFIX(T z, T *best, int64_t *num_infinite)      \
    {                                                                                      \
        *best = z > *best ? z : *best;                                                     \
        *num_infinite += z == INFINITY_T;                                                  \
    }                                                                                      \
    /* min-p keeps w >= min_p, and w is monotone in z: the smallest key whose value has    \
     * w >= min_p, by bisection over the keys of all values of T (no pass over the row).   \
     * The bracket starts at the keys around z_max + log(min_p), where w crosses min_p     \
     * within a few keys: probes at doubling steps from there (at most eight) bound the    \
     * crossing before the bisection, which then takes a few exponentials instead of one   \
     * per bit of the key.  With w monotone the crossing is the same key. */               \
    SPECDEC_SHARED KEY_T specdec_min_p_floor_##SUFFIX(T z_max, double min_p)                \
    {                                                                                      \
        KEY_T low = specdec_key_##SUFFIX(-INFINITY_T), high = specdec_key_##SUFFIX(z_max);  \
        const T guess_value = (T)((double)z_max + log(min_p));                             \
        const KEY_T guess = specdec_key_##SUFFIX(guess_value);                             \
        if (guess_value == guess_value && guess > low && guess < high) {                   \
            /* Invariant of the bisection: w < min_p at low (or low is -inf's key), and    \
             * w >= min_p at high. */                                                      \
            int above =                                                                    \
                specdec_weight_##SUFFIX(specdec_value_##SUFFIX(guess), z_max) >= min_p;     \
            if (above)                                                                     \
                high = guess;                                                              \
            else                                                                           \
                low = guess;                                                               \
            KEY_T step = 1;                                                                \
            for (int probes = 0; probes < 8 && high - low > step; ++probes, step *= 2) {   \
                KEY_T probe = above ? high - step : low + step;                            \
                int probe_above =                                                          \
                    specdec_weight_##SUFFIX(specdec_value_##SUFFIX(probe), z_max) >= min_p; \
                if (probe_above)                                                           \
                    high = probe;                                                          \
                else                                                                       \
                    low = probe;                                                           \
                if (probe_above != above)                                                  \
                    break;                                                                 \
            }                                                                              \
        }                                                                                  \
        while (high - low > 1) {                                                           \
            KEY_T middle = low + (high - low) / 2;                                         \
            if (specdec_weight_##SUFFIX(specdec_value_##SUFFIX(middle), z_max) >= min_p)   \
                high = middle;                                                             \
            else                                                                           \
                low = middle;                                                              \
        }                                                                                  \
        return high;                                                                       \
    }                                                                                      \
    /* The bucket of a key in a pass of the radix select that histograms `width` bits from \
     * `shift` up, or -1 when the pass does not count the key: below floor_key, or outside \
     * the prefix of the known_bits top bits found so far. */                              \
    SPECDEC_SHARED int specdec_select_bucket_##SUFFIX(KEY_T key, KEY_T floor_key,           \
                                                      KEY_T prefix, int known_bits,        \
                                                      int shift, int width)                \
    {                                                                                      \
        if (key < floor_key)                                                               \
            return -1;                                                                     \
        if (known_bits > 0 && (key >> (shift + width)) != (prefix >> (shift + width)))     \
            return -1;                                                                     \
        return (int)((key >> shift) & (KEY_T)((1 << width) - 1));                          \
    }                                                                                      \
    /* p(y) in float64 from z = l(y) / temperature; 0 for a row without mass. */           \
    SPECDEC_SHARED double specdec_entry_probability_##SUFFIX(T z, const specdec_row_law *law) \
    {                                                                                      \
        if (law->status != 0)                                                              \
            return 0.0;                                                                    \
        if (law->num_infinite > 0)                                                         \
            return z == INFINITY_T ? 1.0 / law->normaliser : 0.0;                          \
        if (!((double)z >= law->cutoff))                                                   \
            return 0.0;                                                                    \
        return specdec_weight_##SUFFIX(z, (T)law->z_max) / law->normaliser;                \
    }                                                                                      \
    /* p(y) as a processed row stores it, in T, for a law with mass and a finite maximum   \
     * (z_max and cutoff are the law's, in T). */                                          \
    SPECDEC_SHARED T specdec_kept_probability_##SUFFIX(T z, T z_max, T cutoff,              \
                                                       double normaliser)                  \
    {                                                                                      \
        return z >= cutoff ? (T)(specdec_weight_##SUFFIX(z, z_max) / normaliser) : (T)0;   \
    }                                                                                      \
    /* p(y) as a processed row stores it, for any law. */                                  \
    SPECDEC_SHARED T specdec_entry_materialised_##SUFFIX(T z, const specdec_row_law *law)   \
    {                                                                                      \
        if (law->status != 0 || law->num_infinite > 0)                                     \
            return (T)specdec_entry_probability_##SUFFIX(z, law);                          \
        return specdec_kept_probability_##SUFFIX(z, (T)law->z_max, (T)law->cutoff,         \
                                                 law->normaliser);                         \
    }

SPECDEC_DEFINE_LAW_ELEMENTS(f, float, uint32_t, SPECDEC_INFINITY_F)
SPECDEC_DEFINE_LAW_ELEMENTS(d, double, uint64_t, SPECDEC_INFINITY_D)

/* ---- the scalar decisions of the radix select ---------------------------------------- */

/* Each pass of the radix select histograms SPECDEC_HISTOGRAM_BITS bits of the keys. */
#define SPECDEC_HISTOGRAM_BITS 11

/* The bits of the next pass: `width` (returned) bits below the known_bits top bits of a
 * key_bits-bit key, from bit *shift up; the last pass may take fewer. */
SPECDEC_SHARED int specdec_select_width(int key_bits, int known_bits, int *shift)
{
    int width = key_bits - known_bits < SPECDEC_HISTOGRAM_BITS ? key_bits - known_bits
                                                               : SPECDEC_HISTOGRAM_BITS;
    *shift = key_bits - known_bits - width;
    return width;
}

/* The total of a pass's histogram, summed from the top bucket down: top-p's first pass
 * turns top_p into need = top_p times it. */
SPECDEC_SHARED double specdec_histogram_total(const double *histogram, int buckets)
{
    double total = 0.0;
    for (int bucket = buckets - 1; bucket >= 0; --bucket)
        total += histogram[bucket];
    return total;
}

/* The walk of one pass's histogram from its top bucket: the first filled bucket whose
 * entries, with those above it (accumulated into *above), reach `need`.  When none does,
 * after the first pass, the lowest filled bucket: the sub-buckets of a chosen bucket sum, in
 * another grouping, to a hair less than it did, and its lowest value is then the one that
 * reaches need.  -1 when every entry falls short. */
/* One bucket of the walk, from the top: whether it is the chosen one (else its entries join
 * *above).  An empty bucket changes nothing (adding 0 to *above is exact), so a walk may
 * visit only the buckets that were filled, in the same order, and get the same bits. */
SPECDEC_SHARED int specdec_select_walk_bucket(double count, int bucket, double need,
                                              double *above, int *lowest_filled)
{
    if (count > 0.0)
        *lowest_filled = bucket;
    if (count > 0.0 && *above + count >= need)
        return 1;
    *above += count;
    return 0;
}

SPECDEC_SHARED int specdec_select_walk(const double *histogram, int buckets, int known_bits,
                                       double need, double *above)
{
    int lowest_filled = -1;
    for (int bucket = buckets - 1; bucket >= 0; --bucket)
        if (specdec_select_walk_bucket(histogram[bucket], bucket, need, above, &lowest_filled))
            return bucket;
    return known_bits == 0 ? -1 : lowest_filled;
}

/* ---- the scalar decision of the inverse-CDF draw ------------------------------------ */

/* Every level of an inverse-CDF scan (an entry, a block, a segment) stops at the first
 * unit with weight whose running sum, up to and including it, exceeds threshold = v * Z. */
SPECDEC_SHARED int specdec_draw_stops(double weight, double running, double threshold)
{
    return weight > 0.0 && running > threshold;
}

/* ---- the scalar decisions of the verifiers ------------------------------------------- */

/* Block verification's weight rho_j = min(1, rho_{j-1} p(x) / q(x)), computed as 1 when
 * rho p >= q (so q = 0 is safe).  A token with p <= 0 (or NaN) sets rho to 0 for good, so no
 * later q = 0 can revive it. */
SPECDEC_SHARED double specdec_next_block_weight(double rho, double p_x, double q_x)
{
    if (!(p_x > 0.0) || rho == 0.0)
        return 0.0;
    if (rho * p_x >= q_x)
        return 1.0;
    return rho * p_x / q_x;
}

/* Block verification's check h_i = Z_i / (Z_i + 1 - rho_i), Z_i the weighted residual
 * mass; 0 where the denominator is not positive (NaN, from a NaN target entry on the path,
 * fails every check). */
SPECDEC_SHARED double specdec_block_check(double total, double rho)
{
    double denominator = total + (1.0 - rho);
    return denominator > 0.0 ? total / denominator : 0.0;
}

/* Typical acceptance's threshold min(posterior_threshold, alpha exp(-H)) from
 * plogp = sum_y p ln(p + epsilon) = -H; alpha = 0 means a zero threshold even where
 * exp(-H) overflows (0 * inf is NaN). */
SPECDEC_SHARED double specdec_typical_threshold(double plogp, double alpha,
                                                double posterior_threshold)
{
    double threshold = alpha > 0.0 ? alpha * exp(plogp) : 0.0;
    return threshold > posterior_threshold ? posterior_threshold : threshold;
}

#endif
