/* The window under forced placement on a GPU (tierzero.window_carry auto), planned for a made-up
 * GPU (plan_only with gpu_free: no device is touched): with the state offloaded by the config and
 * no tierzero.hbm_budget, the window carries nothing into the next step and takes what the GPU
 * has free beside the buffers and the homes forced into it; asked to carry, it is the small
 * working set of four phases it was; a budget or a window given keeps the carry, as does the
 * plan's placement; on the cpu backend nothing changes. The bits of a window that carries and one
 * that does not are the same (test_sched, test_train_gpu's placement cases).
 * Skips (77) where the cuda backend is not built. */
#define _GNU_SOURCE
#include "core/config.h"
#include "core/error.h"
#include "core/plan.h"
#include "testlib.h"
#include "train_cases.h"
#include "trainer/step/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TZ_HAVE_CUDA
static struct tz_plan_rates rates; /* tc_gpu_rates(), set in main */

static const uint64_t gpu = 4ull << 30;

/* A plan of o for a GPU with gpu free bytes (backend "cuda"), or for the cpu backend. */
static int plan(struct tc_opts *o, const char *backend, int auto_place, uint64_t window,
                tz_trainer **tr) {
  o->backend = backend;
  o->auto_placement = auto_place;
  o->window = window;
  return tc_plan_gpu(o, &rates, gpu, tr);
}

static void offloaded(struct tc_opts *o) {
  tc_opts_init(o);
  o->param_dev = "cpu";
  o->opt_dev = "cpu";
  o->recompute = "all";
}

static void test_forced_window(void **state) {
  (void)state;
  struct tc_opts o;
  offloaded(&o);
  tz_trainer *tr = NULL;
  /* the GPU's free memory less its reserve, as the plan's placement takes it */
  TZ_ASSERT_OK(plan(&o, "cuda", 1, 0, &tr));
  uint64_t free_mem = tz_trainer_plan(tr)->capacity[TZ_PLAN_COMPUTE];
  tz_trainer_destroy(tr);
  /* the default: no carry, the GPU's free memory */
  TZ_ASSERT_OK(plan(&o, "cuda", 0, 0, &tr));
  assert_false(tz_trainer_window_carry(tr));
  const struct tz_plan *p = tz_trainer_plan(tr);
  assert_true(p->capacity[TZ_PLAN_COMPUTE] == free_mem);
  uint64_t big = p->window;
  assert_true(big + p->compute_fixed + p->used[TZ_PLAN_COMPUTE] <= free_mem);
  assert_true(big > 4 * p->min_window);
  tz_trainer_destroy(tr);
  /* asked to carry: the working set of four phases, as before */
  o.window_carry = 1;
  TZ_ASSERT_OK(plan(&o, "cuda", 0, 0, &tr));
  assert_true(tz_trainer_window_carry(tr));
  p = tz_trainer_plan(tr);
  assert_true(p->window == 4 * p->min_window);
  assert_true(p->capacity[TZ_PLAN_COMPUTE] < free_mem);
  tz_trainer_destroy(tr);
  /* told not to carry: the same as the default */
  o.window_carry = -1;
  TZ_ASSERT_OK(plan(&o, "cuda", 0, 0, &tr));
  assert_false(tz_trainer_window_carry(tr));
  assert_true(tz_trainer_plan(tr)->window == big);
  tz_trainer_destroy(tr);
}

/* tierzero.recompute auto keeps what fits beside the window's minimum, as it does with a budget:
 * the same activations kept as under that budget (a window sized as the rest, not counted whole
 * against the room, would leave none). */
static void test_forced_window_keeps(void **state) {
  (void)state;
  struct tc_opts o;
  offloaded(&o);
  o.recompute = NULL; /* auto */
  double flops = rates.flops;
  rates.flops = 1e8; /* the compute long beside the copies: keeping activations pays */
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(plan(&o, "cuda", 1, 0, &tr));
  char budget[32];
  snprintf(budget, sizeof budget, "%llu",
           (unsigned long long)tz_trainer_plan(tr)->capacity[TZ_PLAN_COMPUTE]);
  tz_trainer_destroy(tr);
  char buf[128];
  uint64_t kept = 0, kept_budget = 0;
  TZ_ASSERT_OK(plan(&o, "cuda", 0, 0, &tr));
  tz_trainer_recompute(tr, buf, sizeof buf, &kept, NULL);
  tz_trainer_destroy(tr);
  o.hbm_budget = budget;
  o.window_carry = -1;
  TZ_ASSERT_OK(plan(&o, "cuda", 0, 0, &tr));
  tz_trainer_recompute(tr, buf, sizeof buf, &kept_budget, NULL);
  tz_trainer_destroy(tr);
  rates.flops = flops;
  assert_true(kept_budget > 0);
  assert_true(kept == kept_budget);
}

/* What keeps the carry under auto: a budget, a window given, the plan's placement, the cpu
 * backend. */
static void test_auto_keeps_carry(void **state) {
  (void)state;
  struct tc_opts o;
  offloaded(&o);
  tz_trainer *tr = NULL;
  o.hbm_budget = "2GiB";
  TZ_ASSERT_OK(plan(&o, "cuda", 0, 0, &tr));
  assert_true(tz_trainer_window_carry(tr));
  tz_trainer_destroy(tr);
  o.hbm_budget = NULL;
  TZ_ASSERT_OK(plan(&o, "cuda", 0, 64ull << 20, &tr));
  assert_true(tz_trainer_window_carry(tr));
  assert_true(tz_trainer_plan(tr)->window == 64ull << 20);
  tz_trainer_destroy(tr);
  TZ_ASSERT_OK(plan(&o, "cuda", 1, 0, &tr));
  assert_true(tz_trainer_window_carry(tr));
  tz_trainer_destroy(tr);
  TZ_ASSERT_OK(plan(&o, NULL, 0, 0, &tr));
  assert_true(tz_trainer_window_carry(tr));
  tz_trainer_destroy(tr);
}

int main(void) {
  rates = tc_gpu_rates();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forced_window),
      cmocka_unit_test(test_forced_window_keeps),
      cmocka_unit_test(test_auto_keeps_carry),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  fprintf(stderr, "test_plan_forced_window: skipped: the cuda backend is not built here (it plans "
                  "for a GPU's memory and copies)\n");
  return 77;
}
#endif
