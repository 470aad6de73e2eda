/* Serial references for the collectives tests. Every rank can compute any rank's input from
 * (seed, rank), so each rank checks its own results without further communication. The sums are
 * the plain loops of the specification (comm.h), written here independently of the library. */
#ifndef TZ_TESTS_COMM_REF_H
#define TZ_TESTS_COMM_REF_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "testlib.h"

static inline size_t ref_esize(enum tz_dtype dt) { return dt == TZ_F32 ? 4 : 2; }

static inline float ref_load(const void *p, size_t i, enum tz_dtype dt) {
  if (dt == TZ_F32)
    return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return dt == TZ_BF16 ? tz_bf16_to_f32(h) : tz_f16_to_f32(h);
}

static inline void ref_store(void *p, size_t i, enum tz_dtype dt, float v) {
  if (dt == TZ_F32)
    ((float *)p)[i] = v;
  else
    ((uint16_t *)p)[i] = dt == TZ_BF16 ? tz_f32_to_bf16(v) : tz_f32_to_f16(v);
}

/* v rounded to dt and back. */
static inline float ref_round(float v, enum tz_dtype dt) {
  if (dt == TZ_BF16)
    return tz_bf16_to_f32(tz_f32_to_bf16(v));
  if (dt == TZ_F16)
    return tz_f16_to_f32(tz_f32_to_f16(v));
  return v;
}

/* n values of dt with mixed signs and magnitudes (2^-10 .. 2^10), so that the order of a sum
 * shows in its low bits. */
static inline void ref_fill(void *buf, size_t n, enum tz_dtype dt, uint64_t seed) {
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 12345;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = tz_test_rand(&s);
    float u = (float)(r >> 40) / (float)(1u << 24); /* [0, 1) */
    int e = (int)((r >> 8) % 21) - 10;
    float v = ldexpf(u * 2.0f - 1.0f, e);
    ref_store(buf, i, dt, v);
  }
}

/* out[i] = in[0][off + i] + in[1][off + i] + ... in rank order; fp32 arithmetic rounded once at
 * the end when accum_f32, else rounded to dt after every addition. */
static inline void ref_sum(void *out, void *const *in, size_t off, size_t n, int P,
                           enum tz_dtype dt, int accum_f32) {
  for (size_t i = 0; i < n; i++) {
    float acc = ref_load(in[0], off + i, dt);
    for (int q = 1; q < P; q++) {
      acc = acc + ref_load(in[q], off + i, dt);
      if (!accum_f32)
        acc = ref_round(acc, dt);
    }
    ref_store(out, i, dt, acc);
  }
}

/* The first index where a and b differ (n elements of es bytes), or -1. */
static inline long ref_first_diff(const void *a, const void *b, size_t n, size_t es) {
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0)
      return (long)i;
  return -1;
}

#endif
