/* fp16 loss scaling in the trainer (cpu backend, world of one), DeepSpeed's semantics:
 *  - without overflow, a power-of-two scale changes no bit: losses, norms and parameters equal
 *    those of the same run without fp16, folded and unfolded;
 *  - a scale so large that the scaled gradient's norm overflows fp32: each such step is skipped
 *    (the master weights keep every bit), the scale follows DynamicLossScaler's rule (hysteresis,
 *    halving, doubling after loss_scale_window good steps, and overflowing again after a
 *    doubling), checked against an independent transcription of that rule;
 *  - an overflow at min_loss_scale stops training with a message naming it. */
#define _GNU_SOURCE
#include "testlib.h"
#include "train_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A trainer for tc_model with clipping, and fp16 set by `sets` (KEY=VALUE, NULL-terminated). */
static tz_trainer *make(struct tc_world *w, const struct tc_opts *o, const char *const *sets) {
  struct tz_model_config mc;
  tc_model(&mc);
  struct tz_config cfg;
  TZ_ASSERT_OK(tc_config(&cfg, o, 1));
  for (int i = 0; sets && sets[i]; i++) {
    char key[128];
    const char *eq = strchr(sets[i], '=');
    snprintf(key, sizeof key, "%.*s", (int)(eq - sets[i]), sets[i]);
    TZ_ASSERT_OK(tz_config_set(&cfg, key, eq + 1));
  }
  struct tz_trainer_params tp;
  tz_trainer_params_init(&tp);
  tp.seq_len = TC_SEQ;
  tp.total_steps = 64;
  tp.opt_mode = o->mode;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tz_trainer_create(&cfg, &mc, w->comm, w->rt, &tp, &tr));
  tz_config_free(&cfg);
  return tr;
}

static int step(tz_trainer *tr, const struct tc_opts *o, int s, struct tz_step_result *r) {
  struct tz_model_config mc;
  tc_model(&mc);
  int n = o->accum * o->micro * TC_SEQ;
  int32_t tok[1024], tgt[1024];
  assert_true(n <= 1024);
  for (int k = 0; k < o->accum; k++)
    tz_synthetic_batch(7, tz_synthetic_first(s, k, 0, 1, o->accum, o->micro), o->micro, TC_SEQ,
                       mc.vocab, tok + k * o->micro * TC_SEQ, tgt + k * o->micro * TC_SEQ);
  return tz_trainer_step(tr, tok, tgt, NULL, r);
}

/* Every block's master weights, one buffer. */
static float *masters(tz_trainer *tr) {
  struct tz_model_config mc;
  tc_model(&mc);
  uint64_t total = 0;
  for (int b = 0; b < tz_model_n_blocks(&mc); b++)
    total += tz_model_block_numel(&mc, b);
  float *all = malloc(total * sizeof(float)), *p = all;
  assert_non_null(all);
  for (int b = 0; b < tz_model_n_blocks(&mc); b++) {
    TZ_ASSERT_OK(tz_trainer_param_load(tr, b, TZ_PLAN_MASTER, p));
    p += tz_model_block_numel(&mc, b);
  }
  return all;
}

static size_t masters_bytes(void) {
  struct tz_model_config mc;
  tc_model(&mc);
  uint64_t total = 0;
  for (int b = 0; b < tz_model_n_blocks(&mc); b++)
    total += tz_model_block_numel(&mc, b);
  return total * sizeof(float);
}

static void test_exact_without_overflow(void **state) {
  (void)state;
  static const char *const fp16[] = {"fp16.enabled=true", "fp16.initial_scale_power=12",
                                     "fp16.loss_scale_window=2", NULL};
  enum tz_opt_mode modes[] = {TZ_OPT_FOLDED, TZ_OPT_UNFOLDED};
  for (int m = 0; m < 2; m++) {
    struct tc_world w;
    tc_world_open(&w);
    struct tc_opts o;
    tc_opts_init(&o);
    o.mode = modes[m];
    tz_trainer *a = make(&w, &o, NULL), *b = make(&w, &o, fp16);
    double scale = 4096;
    for (int s = 0; s < 5; s++) {
      struct tz_step_result ra, rb;
      TZ_ASSERT_OK(step(a, &o, s, &ra));
      TZ_ASSERT_OK(step(b, &o, s, &rb));
      assert_int_equal(rb.skipped, 0);
      assert_memory_equal(&ra.loss, &rb.loss, sizeof ra.loss);
      assert_memory_equal(&ra.grad_norm, &rb.grad_norm, sizeof ra.grad_norm);
      assert_true(ra.lr == rb.lr);
      /* Doubling every loss_scale_window = 2 good steps: after steps 2 and 4. */
      if (s % 2 == 1)
        scale *= 2;
      assert_true(rb.loss_scale == scale);
      assert_true(ra.loss_scale == 0);
    }
    float *pa = masters(a), *pb = masters(b);
    assert_memory_equal(pa, pb, masters_bytes());
    free(pa);
    free(pb);
    assert_int_equal(tz_trainer_skipped_steps(b), 0);
    tz_trainer_destroy(a);
    tz_trainer_destroy(b);
    tc_world_close(&w);
  }
}

/* DynamicLossScaler.update_scale, transcribed from its definition for the check. */
struct scaler {
  double scale, min;
  int hysteresis, left, window;
  long iter, last_overflow;
};

static void scaler_update(struct scaler *s, int overflow) {
  if (overflow) {
    if (s->hysteresis == 1 || s->left == 1)
      s->scale = fmax(s->scale / 2, s->min);
    else
      s->left--;
    s->last_overflow = s->iter;
  } else if ((s->iter - s->last_overflow) % s->window == 0) {
    s->left = s->hysteresis;
    s->scale *= 2;
  }
  s->iter++;
}

static void test_overflow_skips(void **state) {
  (void)state;
  static const char *const fp16[] = {"fp16.enabled=true", "fp16.initial_scale_power=100",
                                     "fp16.hysteresis=2", "fp16.loss_scale_window=3", NULL};
  enum tz_opt_mode modes[] = {TZ_OPT_FOLDED, TZ_OPT_UNFOLDED};
  for (int m = 0; m < 2; m++) {
    struct tc_world w;
    tc_world_open(&w);
    struct tc_opts o;
    tc_opts_init(&o);
    o.mode = modes[m];
    tz_trainer *tr = make(&w, &o, fp16);
    assert_true(tz_trainer_loss_scale(tr) == ldexp(1, 100));
    struct scaler ref = {ldexp(1, 100), 1, 2, 2, 3, 0, -1};
    int skipped = 0, good = 0, s;
    for (s = 0; s < 64 && good < 4; s++) {
      float *before = masters(tr);
      struct tz_step_result r;
      TZ_ASSERT_OK(step(tr, &o, s, &r));
      float *after = masters(tr);
      if (r.skipped) {
        assert_false(isfinite(r.grad_norm));
        assert_memory_equal(before, after, masters_bytes());
        assert_true(s > 0 || r.loss_scale == ldexp(1, 100)); /* hysteresis: kept once */
        skipped++;
      } else {
        assert_true(isfinite(r.grad_norm));
        assert_memory_not_equal(before, after, masters_bytes());
        good++;
      }
      scaler_update(&ref, r.skipped);
      if (r.loss_scale != ref.scale)
        print_error("step %d: loss scale %g, expected %g\n", s, r.loss_scale, ref.scale);
      assert_true(r.loss_scale == ref.scale);
      free(before);
      free(after);
    }
    print_message("mode %s: %d steps skipped, scale now 2^%g\n", tz_opt_mode_name(modes[m]),
                  skipped, log2(tz_trainer_loss_scale(tr)));
    assert_int_equal(good, 4);
    /* 2^100 times a gradient norm of order 1 overflows the fp32 sum of squares (2^128): at
     * least the hysteresis step and a dozen halvings are skipped. */
    assert_true(skipped > 12);
    assert_int_equal(tz_trainer_skipped_steps(tr), skipped);
    tz_trainer_destroy(tr);
    tc_world_close(&w);
  }
}

static void test_min_scale(void **state) {
  (void)state;
  /* min_loss_scale 2^109. */
  static const char *const fp16[] = {"fp16.enabled=true", "fp16.initial_scale_power=110",
                                     "fp16.hysteresis=1",
                                     "fp16.min_loss_scale=649037107316853453566312041152512", NULL};
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  tz_trainer *tr = make(&w, &o, fp16);
  struct tz_step_result r;
  TZ_ASSERT_OK(step(tr, &o, 0, &r)); /* 2^110 overflows: down to the minimum */
  assert_int_equal(r.skipped, 1);
  assert_true(r.loss_scale == ldexp(1, 109));
  int rc = step(tr, &o, 1, &r);
  assert_int_equal(rc, TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "fp16.min_loss_scale"));
  tz_trainer_destroy(tr);
  tc_world_close(&w);
}

static void test_overlapped_refused(void **state) {
  (void)state;
  static const char *const fp16[] = {"fp16.enabled=true", NULL};
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.clip = 0;
  struct tz_model_config mc;
  tc_model(&mc);
  struct tz_config cfg;
  TZ_ASSERT_OK(tc_config(&cfg, &o, 1));
  TZ_ASSERT_OK(tz_config_set(&cfg, "fp16.enabled", "true"));
  struct tz_trainer_params tp;
  tz_trainer_params_init(&tp);
  tp.seq_len = TC_SEQ;
  tp.opt_mode = TZ_OPT_OVERLAPPED;
  tz_trainer *tr = NULL;
  assert_int_equal(tz_trainer_create(&cfg, &mc, w.comm, w.rt, &tp, &tr), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "fp16"));
  tz_config_free(&cfg);
  /* Auto picks folded with fp16 even without clipping. */
  tr = make(&w, &o, fp16);
  assert_int_equal(tz_trainer_opt_mode(tr), TZ_OPT_FOLDED);
  tz_trainer_destroy(tr);
  tc_world_close(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact_without_overflow),
      cmocka_unit_test(test_overflow_skips),
      cmocka_unit_test(test_min_scale),
      cmocka_unit_test(test_overlapped_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
