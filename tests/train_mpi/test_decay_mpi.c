/* Per-tensor weight decay (tierzero.weight_decay_exclude, trainer/step/decay.h) on P ranks under
 * mpirun against a world of one accumulating the same micro-batches: every rank's shard cuts the
 * tensors at other places, and the bits are the same (folded and overlapped updates, offloaded
 * state with Adam at the host homes, tied and untied). A run that decays the norms differs, so
 * the comparison sees the exclusion. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "core/error.h"
#include "core/runtime.h"
#include "testlib.h"
#include "mpi_world.h"
#include "train_cases.h"

static char *nvme_dir;

static void run_pair(struct tc_opts o, const char *what) {
  o.nvme_dir = nvme_dir;
  o.decay_exclude = "bias:norm:embed";
  struct tc_result many, one, all;
  TZ_ASSERT_OK(tc_run(&o, comm, rt, &many));
  mw_run_single(o, &one);
  tc_expect_same(&many, &one, what);
  o.decay_exclude = NULL; /* every tensor decays: other bits */
  TZ_ASSERT_OK(tc_run(&o, comm, rt, &all));
  int ld;
  assert_true(tc_diff(&many, &all, &ld) > 0);
  tc_result_free(&many);
  tc_result_free(&one);
  tc_result_free(&all);
}

static void test_folded(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.accum = 1;
  o.steps = 3;
  o.mode = TZ_OPT_FOLDED;
  run_pair(o, "decay, folded");
  o.untied = 1;
  run_pair(o, "decay, folded, untied");
}

static void test_offloaded(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.accum = 1;
  o.micro = 1;
  o.steps = 3;
  o.clip = 0;
  o.param_dev = "cpu";
  o.opt_dev = "cpu";
  run_pair(o, "decay, offloaded, overlapped, Adam at the homes");
}

int main(void) {
  mw_watchdog_arm("test_decay_mpi", 150);
  nvme_dir = tz_test_mkdtemp("decay-mpi");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_folded),
      cmocka_unit_test(test_offloaded),
  };
  int rc = cmocka_run_group_tests(tests, mw_setup, mw_teardown);
  tz_test_rmdir(nvme_dir);
  return rc;
}
