/* tierzero.recompute (trainer/step/recompute.h): the key's forms and its refusals, the order "auto"
 * keeps parts in, the bytes kept, and the words the plan's report uses. */
#define _GNU_SOURCE
#include "core/config.h"
#include "core/error.h"
#include "testlib.h"
#include "trainer/model/model.h"
#include "trainer/step/recompute.h"
#include "trainer/step/train_internal.h"

#include <math.h>
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
  /* "attn-proj": the attention part but its op, whose output is kept; "attn" (or the whole
   * layer) wins over it in either order */
  const uint8_t proj = TZ_PART_ATTN | TZ_PART_ATTN_OUT;
  TZ_ASSERT_OK(parse("attn-proj", &mode, p));
  for (int i = 0; i < L; i++)
    assert_int_equal(p[i], proj);
  TZ_ASSERT_OK(parse("0-2.attn-proj:1:2.attn:5.attn:5.attn-proj:6.mlp:6.attn-proj", &mode, p));
  const uint8_t want2[L] = {proj, TZ_PARTS_ALL, TZ_PART_ATTN,       0,
                            0,    TZ_PART_ATTN, proj | TZ_PART_MLP, 0};
  assert_memory_equal(p, want2, L);
}

static void test_refusals(void **state) {
  (void)state;
  int mode;
  uint8_t p[L];
  const char *bad[] = {"0-8",   "3-1",    "x",          "2.ffn",      "-1",         "3-",
                       "all:1", "1:none", "1.attn.mlp", "2.attnproj", "attn-proj.1"};
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

/* The three items' order a byte: the MLP, the attention's output, the rest of the attention part.
 * `want` holds the parts (TZ_PART_*) in order, each item run the last layer first. */
static void expect_order(const struct tz_recompute_item *it, int n, const unsigned want[3]) {
  for (int k = 0; k < 3 * n; k++) {
    assert_int_equal(it[k].part, want[k / n]);
    assert_int_equal(it[k].layer, n - 1 - k % n);
  }
}

/* llama-7b's shape at 4 x 2048 tokens in bf16: by FLOP its MLP saves the most per byte kept (2.2
 * TFLOP for 344 MiB, gate and up), then the attention's output (0.14 for 65 MiB, att and lse),
 * then the rest of its part (1.1 for 256 MiB, q/k/v and x2, but never before its output: 4.1 a
 * byte against the output's 2.0); by costs that make the attention op dearer (its kernels run
 * slower per FLOP on an H200) the output first; costs where the rest of the part saves the more a
 * byte still keep the output first; the bytes are the parts' sums. */
static void test_order_and_bytes(void **state) {
  (void)state;
  struct tz_model_config mc;
  TZ_ASSERT_OK(tz_model_preset("llama-7b", &mc));
  int n = mc.n_layer;
  struct tz_recompute_item *it = malloc(3 * (size_t)n * sizeof *it);
  assert_non_null(it);
  const unsigned A = TZ_PART_ATTN, M = TZ_PART_MLP, O = TZ_PART_ATTN_OUT;
  const double timed[3] = {3.3e-3, 3.4e-3, 2.0e-3};
  tz_recompute_order(&mc, TZ_BF16, 4, 2048, timed, it);
  expect_order(it, n, (const unsigned[3]){O, M, A});
  const double proj_dear[3] = {3.3e-3, 3.4e-3, 3.2e-3};
  tz_recompute_order(&mc, TZ_BF16, 4, 2048, proj_dear, it);
  expect_order(it, n, (const unsigned[3]){M, O, A});
  const double flop[3] = {tz_model_layer_part_flop(&mc, 4, 2048, A),
                          tz_model_layer_part_flop(&mc, 4, 2048, M),
                          tz_model_layer_part_flop(&mc, 4, 2048, A | O)};
  assert_true(flop[0] - flop[2] == 2.0 * 4 * 2048 * 2048 * 4096); /* the op's scores and sum */
  tz_recompute_order(&mc, TZ_BF16, 4, 2048, flop, it);
  expect_order(it, n, (const unsigned[3]){M, O, A});
  uint8_t *p = malloc((size_t)n);
  assert_non_null(p);
  uint64_t mlp = tz_model_acts_part_bytes(&mc, TZ_BF16, 4, 2048, TZ_PART_MLP);
  uint64_t attn = tz_model_acts_part_bytes(&mc, TZ_BF16, 4, 2048, TZ_PART_ATTN);
  uint64_t out = tz_model_acts_part_bytes(&mc, TZ_BF16, 4, 2048, TZ_PART_ATTN_OUT);
  assert_true(mlp == 2ull * 8192 * 11008 * 2);                        /* g, u */
  assert_true(attn == 4ull * 8192 * 4096 * 2 + 4ull * 32 * 2048 * 4 + /* q, k, v, att; lse */
                          8192ull * 4096 * 2);                        /* x2 */
  assert_true(out == 8192ull * 4096 * 2 + 4ull * 32 * 2048 * 4);      /* att, lse */
  assert_true(tz_model_acts_part_bytes(&mc, TZ_BF16, 4, 2048, A | O) == attn);
  char buf[128];
  tz_recompute_keep_first(it, n + 2, n, p); /* every MLP, the last two layers' outputs */
  assert_true(tz_recompute_kept_bytes(&mc, TZ_BF16, 4, 2048, p) == (uint64_t)n * mlp + 2 * out);
  assert_int_equal(p[n - 1], A | O);
  assert_int_equal(p[n - 3], A);
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf),
                      "attention in layers 0-31 (its output kept in 30-31); MLP in none");
  tz_recompute_keep_first(it, 2 * n + 2, n, p); /* and the last two layers' attention parts */
  assert_true(tz_recompute_kept_bytes(&mc, TZ_BF16, 4, 2048, p) ==
              (uint64_t)n * mlp + (uint64_t)(n - 2) * out + 2 * attn);
  assert_int_equal(p[n - 1], 0);
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf),
                      "attention in layers 0-29 (its output kept in 0-29); MLP in none");
  tz_recompute_keep_first(it, 0, n, p);
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf), "all");
  assert_true(tz_recompute_kept_bytes(&mc, TZ_BF16, 4, 2048, p) == 0);
  tz_recompute_keep_first(it, 3 * n, n, p);
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf), "none");
  p[3] = TZ_PART_MLP;
  p[5] = TZ_PART_MLP;
  p[6] = TZ_PART_MLP;
  assert_string_equal(tz_recompute_describe(p, n, buf, sizeof buf),
                      "attention in layers none; MLP in 3, 5-6");
  free(p);
  free(it);
}

/* A layer's phases at their timed shares (tz_train_timed_flop), with times like the 8B shape's at
 * 131,072 tokens (a pass of 2.1 s, the parts' forwards 0.2 and 0.24 s, the attention's without its
 * op 0.03): the forward is its parts' forwards and the backward the rest of the pass less the
 * forward it recomputes, so that the two with every part recomputed are the whole pass (4 x the
 * layer's FLOP); keeping the attention's output takes its op's time off the backward; a layer with
 * experts' two blocks add up to the dense layer's; without times, or with parts' forwards that
 * make no sense beside the pass, -1 (the caller counts FLOPs). */
static void test_timed_costs(void **state) {
  (void)state;
  const double F = 3e14, s = 2.1, part[3] = {0.2, 0.24, 0.03}, unit = 4.0 * F / s;
  const unsigned A = TZ_PART_ATTN, M = TZ_PART_MLP, O = TZ_PART_ATTN_OUT, ALL = TZ_PARTS_ALL;
  double fwd = tz_train_timed_flop(F, s, part, 0, ALL, 0);
  double bwd_all = tz_train_timed_flop(F, s, part, 1, ALL, ALL);
  assert_true(fabs(fwd - unit * 0.44) < 1e-9 * F);
  assert_true(fabs(fwd + bwd_all - 4.0 * F) < 1e-9 * F);
  assert_true(fabs(bwd_all - unit * (2.1 - 0.88 + 0.44)) < 1e-9 * F);
  double bwd_none = tz_train_timed_flop(F, s, part, 1, ALL, 0);
  assert_true(fabs(bwd_none - unit * 1.22) < 1e-9 * F);
  double proj = tz_train_timed_flop(F, s, part, 1, ALL, A | O);
  double proj_mlp = tz_train_timed_flop(F, s, part, 1, ALL, A | O | M);
  assert_true(fabs(proj - unit * (1.22 + 0.03)) < 1e-9 * F);
  assert_true(fabs(proj_mlp - bwd_all + unit * (0.2 - 0.03)) < 1e-9 * F);
  /* a layer with experts: its attention block and its MLP block */
  double fa = tz_train_timed_flop(F, s, part, 0, A, 0),
         fm = tz_train_timed_flop(F, s, part, 0, M, 0);
  double ba = tz_train_timed_flop(F, s, part, 1, A, A),
         bm = tz_train_timed_flop(F, s, part, 1, M, M);
  assert_true(fabs(fa + fm - fwd) < 1e-9 * F && fabs(ba + bm - bwd_all) < 1e-9 * F);
  assert_true(fabs(ba - unit * (1.22 * 0.2 / 0.44 + 0.2)) < 1e-9 * F);
  const double none[3] = {0, 0, 0}, slow[3] = {0.6, 0.5, 0.1};
  assert_true(tz_train_timed_flop(F, s, none, 0, ALL, 0) == -1);
  assert_true(tz_train_timed_flop(F, 0, part, 1, ALL, ALL) == -1);
  assert_true(tz_train_timed_flop(F, s, slow, 1, ALL, ALL) == -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forms),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_order_and_bytes),
      cmocka_unit_test(test_timed_costs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
