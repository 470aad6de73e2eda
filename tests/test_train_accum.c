/* Gradient accumulation with gradient shards forced out of the compute tier (any offloaded
 * optimizer on a CPU-only machine; the blocks the CPU steps at their host homes beside a GPU):
 * micro-batches 0..G-2 add into a sum in the compute tier and the last one writes the shard,
 * once a step (trainer/step/phases.c, accumulate).
 *  - the same bits as the gradients kept in the compute tier (offload none), with the CPU's Adam
 *    at the homes for every block, half of them and none, folded (clipping) and overlapped (none),
 *    and optimizer state in host memory or on nvme;
 *  - the bytes written back a step do not grow with the micro-batches (the shard is written once,
 *    not read and written by every later micro-batch), and the sums take the shards' bytes in the
 *    compute tier;
 *  - a compute tier with no room for the sums: the plan goes without them and trains the same
 *    bits, each micro-batch then writing the shard back.
 * argv[1]: "plain", or "jitter" (random delays in the scheduler's lanes and the progress engine).
 */
#define _GNU_SOURCE
#include "core/config.h"
#include "core/error.h"
#include "core/plan.h"
#include "core/sched.h"
#include "testlib.h"
#include "train_cases.h"
#include "trainer/step/train.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int jitter_us;
static char *nvme_dir;

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "test_train_accum: a test hung for 240 s (watchdog)\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(1);
}

static void run(const struct tc_opts *o, struct tc_result *r) {
  tc_run_single(o, jitter_us, nvme_dir, r);
}

/* The gradient bytes of a step: every block's padded shard (a world of one: the whole block),
 * as the sums hold them. */
static uint64_t grad_bytes(const struct tc_result *r) {
  uint64_t b = 0;
  for (int i = 0; i < r->nb; i++)
    b += (r->numel[i] + TZ_TRAIN_NORM_SEGMENT - 1) / TZ_TRAIN_NORM_SEGMENT * TZ_TRAIN_NORM_SEGMENT *
         sizeof(float);
  return b;
}

static void test_same_bits(void **state) {
  (void)state;
  static const char *const shares[] = {NULL, "0.5", "0"}; /* NULL: every block at home */
  static const char *const devs[] = {"cpu", "nvme"};
  for (int clip = 0; clip < 2; clip++) {
    struct tc_opts o;
    tc_opts_init(&o);
    o.accum = 3; /* micro-batch 1 adds into the sum, 2 writes the shard */
    o.clip = clip ? 0.05 : 0;
    struct tc_result ref;
    run(&o, &ref); /* every gradient shard in the compute tier, accumulated in place */
    for (int d = 0; d < 2; d++)
      for (int s = 0; s < 3; s++) {
        o.param_dev = "cpu";
        o.opt_dev = devs[d];
        o.cpu_adam = shares[s];
        struct tc_result got;
        run(&o, &got);
        char what[96];
        snprintf(what, sizeof what, "%s, optimizer on %s, cpu_adam %s",
                 clip ? "folded" : "overlapped", devs[d], shares[s] ? shares[s] : "1");
        tc_expect_same(&ref, &got, what);
        /* The sums sit beside the buffers the run without offload has. */
        assert_true(got.compute_fixed >= ref.compute_fixed + grad_bytes(&got));
        tc_result_free(&got);
      }
    tc_result_free(&ref);
  }
}

/* Written back once a step whatever the micro-batches: with Adam at the homes the step writes
 * back only the gradient shards (the CPU updates the state in place); without, the state and the
 * parameters too, once. */
static void test_written_once(void **state) {
  (void)state;
  static const char *const shares[] = {NULL, "0"};
  static const int accums[] = {1, 2, 4};
  for (int s = 0; s < 2; s++) {
    uint64_t flushed[3];
    for (int a = 0; a < 3; a++) {
      struct tc_opts o;
      tc_opts_init(&o);
      o.accum = accums[a];
      o.param_dev = "cpu";
      o.opt_dev = "cpu";
      o.cpu_adam = shares[s];
      struct tc_result r;
      run(&o, &r);
      flushed[a] = r.st.flush_bytes;
      /* At least every step's gradient shards. */
      assert_true(flushed[a] >= (uint64_t)o.steps * grad_bytes(&r));
      tc_result_free(&r);
    }
    if (flushed[1] != flushed[0] || flushed[2] != flushed[0])
      print_error("cpu_adam %s: written back %llu, %llu, %llu bytes with 1, 2, 4 micro-batches\n",
                  shares[s] ? shares[s] : "1", (unsigned long long)flushed[0],
                  (unsigned long long)flushed[1], (unsigned long long)flushed[2]);
    assert_true(flushed[1] == flushed[0] && flushed[2] == flushed[0]);
  }
}

/* A compute budget that holds the buffers and window but not the sums: the plan without them. */
static void test_no_room_for_sums(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.accum = 4;
  o.param_dev = "cpu";
  o.opt_dev = "cpu";
  o.nvme_dir = nvme_dir;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, NULL, 0, &tr));
  const struct tz_plan *p = tz_trainer_plan(tr);
  uint64_t with = p->compute_fixed, minw = p->min_window;
  tz_trainer_destroy(tr);
  tc_world_close(&w);
  struct tc_result sums, none;
  run(&o, &sums);
  char hbm[32];
  /* Short of the sums' bytes by half of them: the window's minimum still fits. */
  uint64_t gb = grad_bytes(&sums);
  snprintf(hbm, sizeof hbm, "%llu", (unsigned long long)(with - gb / 2 + minw));
  o.hbm_budget = hbm;
  run(&o, &none);
  tc_expect_same(&sums, &none, "no room for the sums");
  assert_true(none.compute_fixed + gb / 2 <= with);
  /* Without the sums the later micro-batches write the shards back again. */
  assert_true(none.st.flush_bytes > sums.st.flush_bytes);
  tc_result_free(&sums);
  tc_result_free(&none);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "jitter") == 0)
    jitter_us = 200;
  signal(SIGALRM, watchdog);
  alarm(240);
  nvme_dir = tz_test_mkdtemp("train_accum");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_same_bits),
      cmocka_unit_test(test_written_once),
      cmocka_unit_test(test_no_room_for_sums),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(nvme_dir);
  return rc;
}
