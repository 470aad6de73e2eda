/* Element types of tensors and buffers, and conversions between float and the 16-bit storage
 * formats on the host: round to nearest even, NaN stays NaN (quiet, sign kept), overflow goes to
 * infinity, fp16 subnormals are kept. Every host path that narrows a float uses these, so that two
 * paths that compute the same float store the same bits. */
#ifndef TZ_CORE_DTYPE_H
#define TZ_CORE_DTYPE_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum tz_dtype {
  TZ_F32 = 0,
  TZ_BF16 = 1,
  TZ_F16 = 2,
};

static inline uint32_t tz_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float tz_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t tz_bf16_from_f32(float f) {
  uint32_t u = tz_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u);
  /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry into the
   * exponent is the correct result (up to infinity). */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float tz_f32_from_bf16(uint16_t h) { return tz_f32_from_bits((uint32_t)h << 16); }

static inline uint16_t tz_f16_from_f32(float f) {
  uint32_t u = tz_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) /* rounds to 65520 or more: infinity (and infinity itself) */
    return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    /* Below the smallest normal (2^-14): a subnormal, in units of 2^-24. */
    if (a < 0x33000000u) /* below 2^-25: rounds to zero */
      return sign;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(a >> 23); /* 14..24 */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
      q++;
    return (uint16_t)(sign | q);
  }
  /* Normal: rebias the exponent and round the mantissa from 23 to 10 bits; a carry moves into
   * the exponent correctly. */
  uint32_t r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

static inline float tz_f32_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f)
    return tz_f32_from_bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    /* zero or subnormal: m * 2^-24, exact in float */
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return tz_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

#ifdef __cplusplus
}
#endif

#endif
