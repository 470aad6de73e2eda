/* tierzero.recompute (trainer/step/recompute.h): the key's forms and its refusals, the order "auto"
 * keeps parts in, the bytes kept, and the words the plan's report uses. */
#define _GNU_SOURCE
#include "core/config.h"
#include "core/error.h"
#include "testlib.h"
#include "trainer/model/model.h"
#include "trainer/step/recompute.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L 8

static int parse(const char *value, int *mode, uint8_t *parts) {
  struct tz_config c;
  tz_config_defaults(&c);
  int rc = value ? tz_config_set(&c, "tierzero.recompute", value) : 0;
  if (rc == 0)
    rc = tz_recompute_parse(&c, L, mode, parts);
  tz_config_free(&c);
  return rc;
}

static void test_forms(void **state) {
  (void)state;
  int mode;
  uint8_t p[L];
  TZ_ASSERT_OK(parse(NULL, &mode, p));
  assert_int_equal(mode, TZ_RECOMPUTE_AUTO);
  for (int i = 0; i < L; i++)
    assert_int_equal(p[i], TZ_PARTS_ALL);
  TZ_ASSERT_OK(parse("none", &mode, p));
  assert_int_equal(mode, TZ_RECOMPUTE_NONE);
  for (int i = 0; i < L; i++)
    assert_int_equal(p[i], 0);
  TZ_ASSERT_OK(parse("all", &mode, p));
  assert_int_equal(mode, TZ_RECOMPUTE_ALL);
  for (int i = 0; i < L; i++)
    assert_int_equal(p[i], TZ_PARTS_ALL);
  /* a list (':'-separated through tz_config_set, as TZ_RECOMPUTE): what it names is recomputed */
  TZ_ASSERT_OK(parse("0-2:5.mlp:6-7.attn", &mode, p));
  assert_int_equal(mode, TZ_RECOMPUTE_LIST);
  const uint8_t want[L] = {3, 3, 3, 0, 0, TZ_PART_MLP, TZ_PART_ATTN, TZ_PART_ATTN};
  assert_memory_equal(p, want, L);
  TZ_ASSERT_OK(parse("attn", &mode, p));
  for (int i = 0; i < L; i++)
    assert_int_equal(p[i], TZ_PART_ATTN);
  TZ_ASSERT_OK(parse("mlp:4", &mode, p));
  assert_int_equal(p[4], TZ_PARTS_ALL);
  assert_int_equal(p[3], TZ_PART_MLP);
}

static void test_refusals(void **state) {
  (void)state;
  int mode;
  uint8_t p[L];
  const char *bad[] = {"0-8", "3-1", "x", "2.ffn", "-1", "3-", "all:1", "1:none", "1.attn.mlp"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(parse(bad[i], &mode, p), TZ_ECONFIG);
    if (!strstr(tz_err_msg(), "tierzero.recompute"))
      fail_msg("\"%s\": the message does not name the key: %s", bad[i], tz_err_msg());
  }
  assert_int_equal(parse("0-8", &mode, p), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "0 to 7"));
  assert_int_equal(parse("2.ffn", &mode, p), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "\"2.ffn\""));
}

/* llama-7b's shape at 4 x 2048 tokens in bf16: by FLOP its MLP saves more per byte kept (2.2 TFLOP
 * for 344 MiB, gate and up, against 1.4 for 321, q/k/v, the attention's output and x2), so every
 * layer's MLP comes first, the last layer first; by costs that make the attention dearer per
 * byte (its kernels run slower per FLOP on an H200), the attention first; the bytes are the
 * parts' sums. */
static void test_order_and_bytes(void **state) {
  (void)state;
  struct tz_model_config mc;
  TZ_ASSERT_OK(tz_model_preset("llama-7b", &mc));
  int n = mc.n_layer;
  struct tz_recompute_item *it = malloc(2 * (size_t)n * sizeof *it);
  assert_non_null(it);
  const double flop[2] = {tz_model_layer_part_flop(&mc, 4, 2048, TZ_PART_ATTN),
                          tz_model_layer_part_flop(&mc, 4, 2048, TZ_PART_MLP)};
  const double timed[2] = {3.3e-3, 3.4e-3};
  tz_recompute_order(&mc, TZ_BF16, 4, 2048, timed, it);
  for (int k = 0; k < 2 * n; k++)
    assert_int_equal(it[k].part, k < n ? TZ_PART_ATTN : TZ_PART_MLP);
  tz_recompute_order(&mc, TZ_BF16, 4, 2048, flop, it);
  for (int k = 0; k < 2 * n; k++) {
    assert_int_equal(it[k].part, k < n ? TZ_PART_MLP : TZ_PART_ATTN);
    assert_int_equal(it[k].layer, n - 1 - k % n);
  }
  uint8_t *p = malloc((size_t)n);
  assert_non_null(p);
  tz_recompute_keep_first(it, n + 2, n, p);
  uint64_t mlp = tz_model_acts_part_bytes(&mc, TZ_BF16, 4, 2048, TZ_PART_MLP);
  uint64_t attn = tz_model_acts_part_bytes(&mc, TZ_BF16, 4, 2048, TZ_PART_ATTN);
  assert_true(mlp == 2ull * 8192 * 11008 * 2);                        /* g, u */
  assert_true(attn == 4ull * 8192 * 4096 * 2 + 4ull * 32 * 2048 * 4 + /* q, k, v, att; lse */
                          8192ull * 4096 * 2);                        /* x2 */
  assert_true(tz_recompute_kept_bytes(&mc, TZ_BF16, 4, 2048, p) == (uint64_t)n * mlp + 2 * attn);
  char buf[128];
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf),
                      "attention in layers 0-29; MLP in none");
  tz_recompute_keep_first(it, 0, n, p);
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf), "all");
  assert_true(tz_recompute_kept_bytes(&mc, TZ_BF16, 4, 2048, p) == 0);
  tz_recompute_keep_first(it, 2 * n, n, p);
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf), "none");
  p[3] = TZ_PART_MLP;
  p[5] = TZ_PART_MLP;
  p[6] = TZ_PART_MLP;
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf),
                      "attention in layers none; MLP in 3, 5-6");
  free(p);
  free(it);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forms),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_order_and_bytes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
