/* tierzero.cpu_adam beside a GPU with the homes chosen by the plan (--auto-placement), planned
 * for a made-up GPU (plan_only with gpu_free: no device is touched): every kind of state of the
 * blocks the CPU steps is homed in host memory (the CPU reads their gradients and writes their
 * parameters there), their opt phases run at the homes (the bound's CPU lane) and go first in the
 * folded step, the plan places the rest; tierzero.cpu_adam_search applies there too and never
 * picks a share whose bound is above the plan without the split. Forced placement with the
 * optimizer state in the compute tier still leaves the split off.
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
/* A plan for a GPU with gpu_free bytes free; cpu_adam (NULL: the default, none with a GPU),
 * search (1 true, -1 false, 0 the default: auto), auto placement or the offload devices given. */
static int plan(const char *cpu_adam, int search, int auto_place, const char *dev,
                uint64_t gpu_free, tz_trainer **tr) {
  struct tc_opts o;
  tc_opts_init(&o);
  o.accum = 4;
  o.param_dev = dev;
  o.opt_dev = dev;
  o.cpu_adam = cpu_adam;
  o.cpu_adam_search = search;
  o.recompute = "all";
  o.auto_placement = auto_place;
  o.backend = "cuda";
  const struct tz_plan_rates rates = tc_gpu_rates();
  return tc_plan_gpu(&o, &rates, gpu_free, tr);
}

static const uint64_t gpu = 4ull << 30;

static void test_auto_split(void **state) {
  (void)state;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(plan(NULL, 0, 1, "none", gpu, &tr));
  const struct tz_plan *p = tz_trainer_plan(tr);
  assert_true(tz_trainer_cpu_adam(tr) == 0);
  assert_true(p->lane_s[3] == 0); /* no home phase */
  double alone = p->bound_s;
  int nb = p->n_groups;
  tz_trainer_destroy(tr);

  TZ_ASSERT_OK(plan("0.5", 0, 1, "none", gpu, &tr));
  p = tz_trainer_plan(tr);
  assert_true(tz_trainer_cpu_adam(tr) >= 0.5);
  /* The last blocks, every kind at home: the CPU steps them there. */
  int home = 0;
  for (int g = nb - 1; g >= 0 && p->tier[g * TZ_PLAN_KINDS + TZ_PLAN_MASTER] == TZ_PLAN_HOST &&
                       p->tier[g * TZ_PLAN_KINDS + TZ_PLAN_GRAD] == TZ_PLAN_HOST;
       g--) {
    for (int k = 0; k < TZ_PLAN_STATE_KINDS; k++)
      assert_int_equal(p->tier[g * TZ_PLAN_KINDS + k], TZ_PLAN_HOST);
    home++;
  }
  assert_true(home >= 1 && home < nb);
  assert_true(p->lane_s[3] > 0); /* the CPU's Adam is on the bound's home lane */
  tz_trainer_destroy(tr);

  /* The search: its pick's bound is no worse than none at home (share 0 is among those tried). */
  TZ_ASSERT_OK(plan(NULL, 1, 1, "none", gpu, &tr));
  p = tz_trainer_plan(tr);
  assert_true(p->bound_s <= alone * (1 + 1e-9));
  tz_trainer_destroy(tr);
}

/* Forced placement that keeps the optimizer state in the compute tier: nothing for the CPU to
 * step at a host home, the split stays off (with a warning). */
static void test_forced_in_compute(void **state) {
  (void)state;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(plan("0.5", 0, 0, "none", gpu, &tr));
  assert_true(tz_trainer_cpu_adam(tr) == 0 || tz_trainer_plan(tr)->lane_s[3] == 0);
  const struct tz_plan *p = tz_trainer_plan(tr);
  for (int i = 0; i < p->n_groups * TZ_PLAN_KINDS; i++)
    assert_int_equal(p->tier[i], TZ_PLAN_COMPUTE);
  tz_trainer_destroy(tr);
}

/* tierzero.cpu_adam_search auto (the default): a config that offloads the optimizer state to cpu
 * on a GPU gets the plan's pick, the same share and bound as the search asked by name; given
 * false, given a tierzero.cpu_adam, or with the plan's placement, no search. */
static void test_search_auto(void **state) {
  (void)state;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(plan(NULL, 1, 0, "cpu", gpu, &tr));
  assert_true(tz_trainer_cpu_adam_searched(tr));
  double share = tz_trainer_cpu_adam(tr), bound = tz_trainer_plan(tr)->bound_s;
  tz_trainer_destroy(tr);
  TZ_ASSERT_OK(plan(NULL, -1, 0, "cpu", gpu, &tr));
  assert_false(tz_trainer_cpu_adam_searched(tr));
  assert_true(tz_trainer_cpu_adam(tr) == 0);
  double none = tz_trainer_plan(tr)->bound_s;
  tz_trainer_destroy(tr);
  /* the case is one where the search moves the share, so that auto's pick shows */
  assert_true(share > 0 && bound < none);

  TZ_ASSERT_OK(plan(NULL, 0, 0, "cpu", gpu, &tr));
  assert_true(tz_trainer_cpu_adam_searched(tr));
  assert_true(tz_trainer_cpu_adam(tr) == share);
  assert_true(tz_trainer_plan(tr)->bound_s == bound);
  tz_trainer_destroy(tr);

  TZ_ASSERT_OK(plan("0", 0, 0, "cpu", gpu, &tr)); /* a share given: kept */
  assert_false(tz_trainer_cpu_adam_searched(tr));
  assert_true(tz_trainer_cpu_adam(tr) == 0);
  tz_trainer_destroy(tr);
  TZ_ASSERT_OK(plan(NULL, 0, 1, "none", gpu, &tr)); /* the plan's placement: auto is off */
  assert_false(tz_trainer_cpu_adam_searched(tr));
  assert_true(tz_trainer_cpu_adam(tr) == 0);
  tz_trainer_destroy(tr);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_auto_split),
      cmocka_unit_test(test_forced_in_compute),
      cmocka_unit_test(test_search_auto),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
  fprintf(stderr, "test_plan_cpu_split: skipped: the cuda backend is not built here (it plans "
                  "for a GPU's memory and copies)\n");
  return 77;
}
#endif
