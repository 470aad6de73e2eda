/* Element types and the conversions every backend shares.
 *
 * The conversions are written with integer operations only, so that C, CPU vector code and CUDA
 * device code (this header compiles as CUDA C++, where the functions are __host__ __device__)
 * produce the same bits for every input, NaN and subnormals included:
 *   float -> bf16, float -> f16: IEEE round to nearest, ties to even; overflow gives infinity;
 *     subnormal results are kept (never flushed); a NaN stays a NaN with its sign and the top bits
 *     of its payload, made quiet (the f16 rule is what x86 VCVTPS2PH does).
 *   bf16 -> float: exact, a NaN unchanged (the bits shifted up).
 *   f16 -> float: exact; a NaN keeps sign and payload and is made quiet (as VCVTPH2PS does).
 */
#ifndef TZ_DTYPE_H
#define TZ_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum tz_dtype { TZ_F32 = 0, TZ_BF16 = 1, TZ_F16 = 2 };

#if defined(__CUDACC__)
#define TZ_DTYPE_FN static inline __host__ __device__
#else
#define TZ_DTYPE_FN static inline
#endif

/* Bytes per element; 0 for a value outside the enum. */
TZ_DTYPE_FN size_t tz_dtype_size(enum tz_dtype t) {
  return t == TZ_F32 ? 4 : (t == TZ_BF16 || t == TZ_F16) ? 2 : 0;
}

/* "f32", "bf16", "f16", or "?" for a value outside the enum. */
TZ_DTYPE_FN const char *tz_dtype_name(enum tz_dtype t) {
  return t == TZ_F32 ? "f32" : t == TZ_BF16 ? "bf16" : t == TZ_F16 ? "f16" : "?";
}

TZ_DTYPE_FN uint32_t tz_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
#endif
}

TZ_DTYPE_FN float tz_f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

TZ_DTYPE_FN uint16_t tz_f32_to_bf16(float f) {
  uint32_t u = tz_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u); /* NaN: keep sign and payload top, set quiet bit */
  /* Adding 0x7fff plus the lowest kept bit rounds ties to even; a carry out of the mantissa
   * bumps the exponent, and out of the largest finite value gives infinity, as it should. */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

TZ_DTYPE_FN float tz_bf16_to_f32(uint16_t h) { return tz_f32_from_bits((uint32_t)h << 16); }

TZ_DTYPE_FN uint16_t tz_f32_to_f16(float f) {
  uint32_t u = tz_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) /* NaN */
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x03ffu));
  if (a >= 0x38800000u) {         /* |f| >= 2^-14: normal in f16, or overflow */
    uint32_t r = a - 0x38000000u; /* rebias the exponent from 127 to 15 */
    r += 0x0fffu + ((r >> 13) & 1u);
    r >>= 13;
    return (uint16_t)(sign | (r >= 0x7c00u ? 0x7c00u : r));
  }
  if (a < 0x33000000u) /* |f| < 2^-25, under half the smallest subnormal */
    return sign;
  /* Subnormal in f16: the result is round(|f| / 2^-24), with |f| = M * 2^(E - 150). */
  uint32_t e = a >> 23; /* 102 .. 112 */
  uint32_t mant = (a & 0x007fffffu) | 0x00800000u;
  uint32_t shift = 126u - e; /* 14 .. 24 */
  uint32_t k = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (k & 1u)))
    k++; /* 0x400 here is the smallest normal, which is also the right encoding */
  return (uint16_t)(sign | k);
}

TZ_DTYPE_FN float tz_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x03ffu;
  if (e == 0x1fu) /* infinity, or NaN made quiet */
    return tz_f32_from_bits(sign | 0x7f800000u | (mant ? 0x00400000u : 0u) | (mant << 13));
  if (e != 0)
    return tz_f32_from_bits(sign | ((e + 112u) << 23) | (mant << 13));
  if (mant == 0)
    return tz_f32_from_bits(sign);
  /* Subnormal: normalise; the value mant * 2^-24 is a normal float. */
  uint32_t exp = 113u; /* the float exponent of 2^-14, the f16 subnormal scale */
  while (!(mant & 0x0400u)) {
    mant <<= 1;
    exp--;
  }
  return tz_f32_from_bits(sign | (exp << 23) | ((mant & 0x03ffu) << 13));
}

#undef TZ_DTYPE_FN

#endif
