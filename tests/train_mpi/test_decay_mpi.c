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
#include "train_cases.h"

static tz_runtime *rt;
static tz_comm *comm;
static int P;
static char *nvme_dir;

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "test_decay_mpi: a test hung for 150 s (watchdog)\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(1);
}

static int setup(void **state) {
  (void)state;
  struct tz_bootstrap bs;
  if (tz_bootstrap_detect(&bs) < 0 || tz_runtime_create(NULL, &rt) < 0)
    return -1;
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.progress = tz_runtime_progress(rt);
  if (tz_comm_create("mpi", &bs, &p, &comm) < 0) {
    fprintf(stderr, "rank %d: %s\n", bs.rank, tz_err_msg());
    return -1;
  }
  P = tz_comm_size(comm);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tz_comm_destroy(comm);
  tz_runtime_destroy(rt);
  return 0;
}

static void run_single(struct tc_opts o, struct tc_result *r) {
  tz_runtime *rt1;
  tz_comm *c1;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt1));
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.progress = tz_runtime_progress(rt1);
  TZ_ASSERT_OK(tz_comm_create("single", &bs, &p, &c1));
  o.accum *= P;
  TZ_ASSERT_OK(tc_run(&o, c1, rt1, r));
  tz_comm_destroy(c1);
  tz_runtime_destroy(rt1);
}

static void run_pair(struct tc_opts o, const char *what) {
  o.nvme_dir = nvme_dir;
  o.decay_exclude = "bias:norm:embed";
  struct tc_result many, one, all;
  TZ_ASSERT_OK(tc_run(&o, comm, rt, &many));
  run_single(o, &one);
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
  signal(SIGALRM, watchdog);
  alarm(150);
  nvme_dir = tz_test_mkdtemp("decay-mpi");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_folded),
      cmocka_unit_test(test_offloaded),
  };
  int rc = cmocka_run_group_tests(tests, setup, teardown);
  tz_test_rmdir(nvme_dir);
  return rc;
}
