/* A float32-accurate natural logarithm that compilers can vectorise.
 *
 * libm's logf is an opaque call per element, which stops the entropy loop of the typical
 * acceptance kernel from vectorising; this version is branch-free integer and polynomial
 * arithmetic only.  The polynomial was fitted by least squares on Chebyshev nodes for this
 * project (log1p(f) = f - f^2/2 + f^3 P(f), f in [sqrt(1/2) - 1, sqrt(2) - 1]); its maximum
 * absolute error there is 4e-8, about one float32 ulp.
 *
 * Valid for positive, normal, finite x, which is what the kernels pass (p + 1e-5 with
 * p >= 0).  Other inputs give a finite but meaningless value, never a trap.
 */
#ifndef SPECDEC_FASTMATH_H
#define SPECDEC_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float specdec_fast_logf(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    int32_t exponent = (int32_t)((bits >> 23) & 0xffu) - 127;
    uint32_t mantissa_bits = (bits & 0x007fffffu) | 0x3f800000u;
    /* Centre the mantissa on 1 (range [sqrt(1/2), sqrt(2))) so the polynomial stays small. */
    uint32_t above_sqrt2 = mantissa_bits > 0x3fb504f3u;
    mantissa_bits -= above_sqrt2 << 23;
    exponent += (int32_t)above_sqrt2;
    float mantissa;
    memcpy(&mantissa, &mantissa_bits, sizeof mantissa);
    float f = mantissa - 1.0f;
    float polynomial = -0.0810227021574974f;
    polynomial = polynomial * f + 0.1271267831325531f;
    polynomial = polynomial * f - 0.12972144782543182f;
    polynomial = polynomial * f + 0.14202114939689636f;
    polynomial = polynomial * f - 0.166422501206398f;
    polynomial = polynomial * f + 0.20001471042633057f;
    polynomial = polynomial * f - 0.2500029504299164f;
    polynomial = polynomial * f + 0.333333283662796f;
    float f2 = f * f;
    float log1p_f = f - 0.5f * f2 + f2 * f * polynomial;
    /* ln 2 split in two so that exponent * ln2 adds no rounding error of its own. */
    return (float)exponent * 0.693359375f + ((float)exponent * -2.12194440e-4f + log1p_f);
}

#endif
