/* Random Adam inputs shared by test_adam.c and test_adam_cuda.c: values of every kind (zeros of
 * both signs, subnormals, tiny normals; huge normals whose squares overflow; infinities and NaNs),
 * and hyperparameters that vary per step (subnormal eps and L2 decay included). */
#ifndef TZ_TEST_ADAM_CASES_H
#define TZ_TEST_ADAM_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "kernels/adam.h"
#include "testlib.h"

/* How wild the values are: each level adds to the one before. */
enum adam_case_kinds {
  ADAM_CASE_MODERATE = 0, /* zeros, subnormals, tiny normals, [2^-20, 2): nothing overflows */
  ADAM_CASE_HUGE = 1,     /* and normals up to 2^127, whose squares overflow */
  ADAM_CASE_SPECIAL = 2,  /* and infinities and NaNs */
};

static inline float adam_case_value(uint64_t *s, int kinds) {
  uint64_t r = tz_test_rand(s);
  uint32_t bits = (uint32_t)(r >> 32);
  float sign = (r >> 8) & 1 ? -1.0f : 1.0f;
  float frac = 1.0f + (float)(bits & 0xffffu) / 65536.0f;
  switch (r % 32) {
  case 0: return sign * 0.0f;
  case 1: /* subnormal */ return tz_f32_from_bits((bits & 0x807fffffu) | 1u);
  case 2: /* huge: squares overflow */
    if (kinds >= ADAM_CASE_HUGE)
      return sign * ldexpf(frac, 60 + (int)((bits >> 16) % 67));
    return sign * frac;
  case 3: /* tiny normal: squares are subnormal or zero */
    return sign * ldexpf(frac, -125 + (int)((bits >> 16) % 60));
  case 4:
    if (kinds >= ADAM_CASE_SPECIAL) {
      static const uint32_t sp[] = {0x7f800000u, 0xff800000u, 0x7fc00000u,
                                    0xffc00001u, 0x7f800001u, 0x7fa12345u};
      return tz_f32_from_bits(sp[(bits >> 16) % (sizeof sp / sizeof sp[0])]);
    }
    return sign * frac;
  default: /* the bulk: [2^-20, 2) */ return sign * ldexpf(frac, -(int)((bits >> 16) % 21));
  }
}

/* (n) floats; nonneg takes absolute values (second moments). */
static inline void adam_case_fill(float *x, size_t n, uint64_t *s, int nonneg, int kinds) {
  for (size_t i = 0; i < n; i++) {
    float f = adam_case_value(s, kinds);
    x[i] = nonneg ? fabsf(f) : f;
  }
}

/* (n) gradient elements of dtype dt. */
static inline void adam_case_fill_grad(void *g, enum tz_dtype dt, size_t n, uint64_t *s,
                                       int kinds) {
  for (size_t i = 0; i < n; i++) {
    float f = adam_case_value(s, kinds);
    if (dt == TZ_F32)
      ((float *)g)[i] = f;
    else if (dt == TZ_BF16)
      ((uint16_t *)g)[i] = tz_f32_to_bf16(f);
    else
      ((uint16_t *)g)[i] = tz_f32_to_f16(f);
  }
}

/* Hyperparameters for step t, varied by the random state; returns tz_adam_params_for_step's
 * code. */
static inline int adam_case_params(struct tz_adam_params *p, uint64_t *s, int64_t t) {
  uint64_t r = tz_test_rand(s);
  static const float eps[] = {1e-8f, 0.0f, 1e-40f /* subnormal */, 1e-6f};
  static const float wd[] = {0.0f, 0.01f, 0.1f};
  static const float gs[] = {1.0f, 0x1p-10f, 0.37f, 3.0f};
  memset(p, 0, sizeof *p);
  p->lr = ldexpf(1.0f + (float)(r & 0xffu) / 256.0f, -(int)(4 + (r >> 8) % 14));
  p->beta1 = (r >> 16) & 1 ? 0.9f : 0.8f;
  p->beta2 = (r >> 17) & 1 ? 0.999f : 0.95f;
  p->eps = eps[(r >> 20) % 4];
  p->weight_decay = wd[(r >> 24) % 3];
  p->decoupled = (int)((r >> 28) & 1);
  p->grad_scale = gs[(r >> 30) % 4];
  return tz_adam_params_for_step(p, t);
}

#endif
