/* core/dtype.h conversions: known values (ties to even, NaN, infinity, subnormals, overflow),
 * exhaustive round trips, and agreement with the x86 F16C instructions where the CPU has them. */
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static float f_of(uint32_t u) { return tz_f32_from_bits(u); }

static void test_sizes_names(void **state) {
  (void)state;
  assert_int_equal(tz_dtype_size(TZ_F32), 4);
  assert_int_equal(tz_dtype_size(TZ_BF16), 2);
  assert_int_equal(tz_dtype_size(TZ_F16), 2);
  assert_int_equal(tz_dtype_size((enum tz_dtype)7), 0);
  assert_string_equal(tz_dtype_name(TZ_BF16), "bf16");
  assert_string_equal(tz_dtype_name((enum tz_dtype)7), "?");
}

static void test_bf16_known(void **state) {
  (void)state;
  static const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3f800000, 0x3f80}, /* 1 */
      {0x3f808000, 0x3f80}, /* tie between 0x3f80 and 0x3f81: to even, down */
      {0x3f818000, 0x3f82}, /* tie between 0x3f81 and 0x3f82: to even, up */
      {0x3f808001, 0x3f81}, /* just above the tie */
      {0x3f807fff, 0x3f80}, /* just below the tie */
      {0xbf808000, 0xbf80}, /* negative tie */
      {0xbf818000, 0xbf82}, {0x00000000, 0x0000},
      {0x80000000, 0x8000}, {0x00008000, 0x0000}, /* subnormal tie to even zero */
      {0x00018000, 0x0002},                       /* subnormal tie to even, up */
      {0x00008001, 0x0001},                       /* subnormal, kept (not flushed) */
      {0x807fffff, 0x8080}, /* largest subnormal rounds to the smallest normal */
      {0x7f800000, 0x7f80}, /* +inf */
      {0xff800000, 0xff80}, /* -inf */
      {0x7f7fffff, 0x7f80}, /* FLT_MAX overflows to inf */
      {0x7f7f7fff, 0x7f7f}, /* below the overflow tie */
      {0x7f7f8000, 0x7f80}, /* tie at the top: to even, which is inf */
      {0x7fc00000, 0x7fc0}, /* quiet NaN */
      {0x7f800001, 0x7fc0}, /* signalling NaN, payload only in low bits: quiet, not inf */
      {0x7fa00000, 0x7fe0}, /* signalling NaN keeps its payload top and becomes quiet */
      {0xffc12345, 0xffc1}, /* negative NaN keeps sign, payload top is not rounded */
      {0x7fffffff, 0x7fff}, /* NaN with all ones must not carry into the sign */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint16_t got = tz_f32_to_bf16(f_of(cases[i].in));
    if (got != cases[i].out)
      print_error("bf16(0x%08x) = 0x%04x, want 0x%04x\n", cases[i].in, got, cases[i].out);
    assert_int_equal(got, cases[i].out);
  }
}

/* Every bf16 value converts to float and back unchanged (NaN included: its payload sits in the
 * kept bits, and quiet NaNs stay as they are). */
static void test_bf16_round_trip(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = tz_bf16_to_f32((uint16_t)h);
    assert_int_equal(tz_f32_bits(f), h << 16);
    int nan = (h & 0x7fff) > 0x7f80;
    uint16_t back = tz_f32_to_bf16(f);
    assert_int_equal(back, nan ? (h | 0x40) : h);
  }
}

/* Rounding to bf16 agrees with exact arithmetic on random floats: the result is one of the two
 * neighbours, the nearer one, and the even one on a tie. */
static void test_bf16_random_nearest(void **state) {
  (void)state;
  uint64_t s = 42;
  for (int i = 0; i < 1000000; i++) {
    uint32_t u = (uint32_t)tz_test_rand(&s);
    float f = f_of(u);
    if (isnan(f) || isinf(f))
      continue;
    uint16_t h = tz_f32_to_bf16(f);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u; /* neighbours toward zero and away */
    double dl = fabs((double)f - (double)f_of(lo));
    /* past the largest bf16 the next step would be 2^128: rounding to inf happens from halfway */
    double dh = (hi & 0x7fffffffu) == 0x7f800000u ? 0x1p128 - fabs((double)f)
                                                  : fabs((double)f_of(hi) - (double)f);
    uint16_t want = dl < dh   ? (uint16_t)(lo >> 16)
                    : dh < dl ? (uint16_t)(hi >> 16)
                              : (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
    if (h != want)
      print_error("bf16(0x%08x) = 0x%04x, want 0x%04x\n", u, h, want);
    assert_int_equal(h, want);
  }
}

static void test_f16_known(void **state) {
  (void)state;
  static const struct {
    uint32_t in;
    uint16_t out;
  } cases[] = {
      {0x3f800000, 0x3c00},                       /* 1 */
      {0x3f801000, 0x3c00},                       /* 1 + 2^-11: tie, to even */
      {0x3f803000, 0x3c02},                       /* 1 + 3*2^-11: tie, to even, up */
      {0x477fe000, 0x7bff},                       /* 65504, the largest f16 */
      {0x477fefff, 0x7bff},                       /* just below the overflow tie */
      {0x477ff000, 0x7c00},                       /* 65520: tie, rounds to inf */
      {0x7f7fffff, 0x7c00},                       /* FLT_MAX */
      {0xff7fffff, 0xfc00}, {0x38800000, 0x0400}, /* 2^-14, smallest normal */
      {0x387fe000, 0x0400}, /* largest subnormal + half a step: tie, to even = smallest normal */
      {0x33800000, 0x0001}, /* 2^-24, smallest subnormal */
      {0x33000000, 0x0000}, /* 2^-25: tie, to even = 0 */
      {0x33000001, 0x0001}, /* just above: up */
      {0x33c00000, 0x0002}, /* 1.5 * 2^-24: tie, to even = 2 */
      {0xb3c00000, 0x8002}, {0x00000001, 0x0000}, /* float subnormal */
      {0x80000001, 0x8000}, {0x7f800000, 0x7c00}, {0xff800000, 0xfc00},
      {0x7fc00000, 0x7e00}, {0x7f800001, 0x7e00}, /* signalling NaN, payload in low bits: quiet NaN
                                                   */
      {0x7fa00000, 0x7f00}, {0xffffe000, 0xffff},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint16_t got = tz_f32_to_f16(f_of(cases[i].in));
    if (got != cases[i].out)
      print_error("f16(0x%08x) = 0x%04x, want 0x%04x\n", cases[i].in, got, cases[i].out);
    assert_int_equal(got, cases[i].out);
  }
  assert_true(tz_f16_to_f32(0x0001) == 0x1p-24f);
  assert_true(tz_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
  assert_true(tz_f16_to_f32(0x0400) == 0x1p-14f);
  assert_true(tz_f16_to_f32(0x7bff) == 65504.0f);
  assert_true(tz_f16_to_f32(0xc000) == -2.0f);
  assert_int_equal(tz_f32_bits(tz_f16_to_f32(0x8000)), 0x80000000u);
  assert_int_equal(tz_f32_bits(tz_f16_to_f32(0xfc00)), 0xff800000u);
  assert_int_equal(tz_f32_bits(tz_f16_to_f32(0x7c01)), 0x7fc02000u);
}

/* Every non-NaN f16 survives f16 -> float -> f16; the float is the exact value. */
static void test_f16_round_trip(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x03ff))
      continue;
    float f = tz_f16_to_f32((uint16_t)h);
    assert_int_equal(tz_f32_to_f16(f), h);
    int e = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double exact = e == 0x1f ? INFINITY : e ? ldexp(1024 + mant, e - 25) : ldexp(mant, -24);
    assert_true((double)fabsf(f) == exact);
  }
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
  return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

/* F16C agrees with the integer code on every f16 and on many random floats, NaN included; the
 * AVX paths of kernels/cpu rely on that. */
static void test_f16_matches_f16c(void **state) {
  (void)state;
  for (uint32_t h = 0; h < 0x10000; h++)
    assert_int_equal(tz_f32_bits(tz_f16_to_f32((uint16_t)h)),
                     tz_f32_bits(hw_f16_to_f32((uint16_t)h)));
  uint64_t s = 7;
  for (int i = 0; i < 4000000; i++) {
    uint32_t u = (uint32_t)tz_test_rand(&s);
    if (i & 1) /* half the samples near the f16 range, where rounding is interesting */
      u = (u & 0x807fffffu) | ((uint32_t)(100 + (u >> 23) % 46) << 23);
    float f = f_of(u);
    uint16_t a = tz_f32_to_f16(f), b = hw_f32_to_f16(f);
    if (a != b)
      print_error("f16(0x%08x): 0x%04x, F16C 0x%04x\n", u, a, b);
    assert_int_equal(a, b);
  }
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes_names),     cmocka_unit_test(test_bf16_known),
      cmocka_unit_test(test_bf16_round_trip), cmocka_unit_test(test_bf16_random_nearest),
      cmocka_unit_test(test_f16_known),       cmocka_unit_test(test_f16_round_trip),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("f16c")) {
    const struct CMUnitTest hw[] = {cmocka_unit_test(test_f16_matches_f16c)};
    rc |= cmocka_run_group_tests(hw, NULL, NULL);
  } else {
    printf("note: this CPU lacks F16C; the comparison with it did not run\n");
  }
#endif
  return rc;
}
