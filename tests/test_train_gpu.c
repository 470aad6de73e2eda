/* ZeRO-3 training on a GPU (the cuda backend), world of one:
 *  - placement invariance: state in HBM (every block used in place, GPU Adam on it), on host, on
 *    nvme (staged through the scheduler's pinned chunks) and a mixed plan, streaming what is homed
 *    outside HBM through a window of the plan's minimum and a half: the same bits;
 *  - folded and overlapped optimizer steps against unfolded ones: the same bits;
 *  - fp16 storage with loss scaling: placement changes no bit, and it learns as bf16 does;
 *  - the GPU's run against the cpu backend's (fp32): bf16 storage keeps the first loss within 1%
 *    and later ones within 6%, and both learn;
 *  - tierzero.cpu_adam (part of Adam on the CPU at the host homes): the same bits;
 *  - tierzero.recompute all, none, a list and auto: the same bits;
 *  - a layer timed on the GPU gives the plan its compute rate.
 * argv[1]: "plain", or "jitter" (random delays in the scheduler's lanes and the progress engine).
 * Skips (77) without a CUDA device. */
#define _GNU_SOURCE
#include "kernels/compute.h"
#include "testlib.h"
#include "train_cases.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int jitter_us;
static char *nvme_dir;

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "test_train_gpu: a test hung for 240 s (watchdog)\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(1);
}

static void run(const struct tc_opts *o, struct tc_result *r) {
  tc_run_single(o, jitter_us, nvme_dir, r);
}

static void gpu_opts(struct tc_opts *o) {
  tc_opts_init(o);
  o->backend = "cuda";
  o->small_window = 1;
}

static void test_placement(void **state) {
  (void)state;
  struct tc_opts o;
  gpu_opts(&o);
  /* Every home in HBM for the first run; the window small, so the host run streams. */
  tc_check_placement(&o, jitter_us, nvme_dir, "gpu: ");
}

/* The same with experts (each layer's attention and MLP blocks of their own, on the cuda
 * backend's experts ops). */
static void test_placement_experts(void **state) {
  (void)state;
  struct tc_opts o;
  gpu_opts(&o);
  o.experts = 1;
  tc_check_placement(&o, jitter_us, nvme_dir, "gpu experts: ");
}

static void test_folded(void **state) {
  (void)state;
  struct tc_opts o;
  gpu_opts(&o);
  o.param_dev = "cpu";
  o.mode = TZ_OPT_UNFOLDED;
  struct tc_result unfolded, folded;
  run(&o, &unfolded);
  o.mode = TZ_OPT_FOLDED;
  run(&o, &folded);
  tc_expect_same(&unfolded, &folded, "gpu: folded");
  tc_result_free(&unfolded);
  tc_result_free(&folded);
}

/* Forced placement's default window on a GPU (tierzero.window_carry auto): the GPU's free memory,
 * nothing carried into the next step, each step reading the offloaded state from the host again:
 * the same bits as everything in HBM. */
static void test_forced_default_window(void **state) {
  (void)state;
  struct tc_opts o;
  gpu_opts(&o);
  o.small_window = 0;
  struct tc_result hbm, host;
  run(&o, &hbm);
  o.param_dev = "cpu";
  o.opt_dev = "cpu";
  run(&o, &host);
  assert_false(host.carry);
  assert_true(host.st.fills >= (uint64_t)o.steps); /* read from the homes again each step */
  tc_expect_same(&hbm, &host, "gpu: forced placement's default window");
  tc_result_free(&hbm);
  tc_result_free(&host);
}

static void test_overlapped(void **state) {
  (void)state;
  struct tc_opts o;
  gpu_opts(&o);
  o.clip = 0;
  o.opt_dev = "cpu";
  o.mode = TZ_OPT_UNFOLDED;
  struct tc_result unfolded, overlapped;
  run(&o, &unfolded);
  o.mode = TZ_OPT_AUTO; /* without clipping: overlapped */
  run(&o, &overlapped);
  tc_expect_same(&unfolded, &overlapped, "gpu: overlapped");
  tc_result_free(&unfolded);
  tc_result_free(&overlapped);
}

/* tierzero.cpu_adam on a GPU: the last blocks' Adam runs on the CPU at their host homes (their
 * gradients homed there too), the rest on the GPU; CPU and GPU Adam give the same bits, so every
 * share trains the same, folded (clipping) and overlapped (none). */
static void test_cpu_adam_share(void **state) {
  (void)state;
  for (int clip = 0; clip < 2; clip++) {
    struct tc_opts o;
    gpu_opts(&o);
    o.clip = clip ? 0.05 : 0;
    o.param_dev = "cpu";
    o.opt_dev = "cpu";
    struct tc_result none, half;
    run(&o, &none); /* the default with a GPU: Adam on the GPU */
    o.cpu_adam = "0.5";
    run(&o, &half);
    tc_expect_same(&none, &half,
                   clip ? "gpu: folded, half on the CPU" : "gpu: overlapped, half on the CPU");
    assert_true(none.st.home_s == 0 && half.st.home_s > 0);
    tc_result_free(&none);
    tc_result_free(&half);
  }
}

/* tierzero.recompute on a GPU: every part recomputed, none, a list and the plan's choice give
 * the same bits (the same kernels on the same inputs), with the state in HBM and streamed from
 * the host. */
static void test_recompute(void **state) {
  (void)state;
  struct tc_opts o;
  gpu_opts(&o);
  struct tz_plan_rates rates = {.flops = 1e12, .copy_in = 2e10, .copy_out = 2e10, .adam = 1e10};
  o.rates = &rates; /* no budget: the GPU's free memory is the room */
  tc_check_recompute(&o, jitter_us, nvme_dir, "gpu: ");
}

/* measure_layer on the GPU: a layer's forward and backward timed on the cuda backend gives the
 * plan its compute rate (test_train's test_plan_layer_rate on the cpu backend). */
static void test_layer_rate(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  gpu_opts(&o);
  struct tz_plan_rates rates = {.flops = 1e20, .copy_in = 2e10, .copy_out = 2e10, .adam = 1e20};
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 1, &tr));
  double rate = tz_trainer_layer_rate(tr);
  print_message("a small layer's forward and backward on the GPU: %.3g GFLOP/s\n", rate / 1e9);
  assert_true(rate > 0 && rate < 2e15);
  assert_true(tz_trainer_plan(tr)->compute_s > 0);
  tz_trainer_destroy(tr);
  tc_world_close(&w);
}

/* bf16 against fp32: not the same bits, but the same training. */
static void test_against_cpu(void **state) {
  (void)state;
  struct tc_opts o;
  gpu_opts(&o);
  o.steps = 12;
  struct tc_result gpu, cpu;
  run(&o, &gpu);
  o.backend = NULL;
  o.small_window = 0;
  run(&o, &cpu);
  /* The first step differs only by the rounding of the initial weights to bf16; later ones
   * drift as the two runs' updates differ. */
  for (int s = 0; s < o.steps; s++) {
    double rel = fabs((double)gpu.loss[s] - cpu.loss[s]) / cpu.loss[s], tol = s == 0 ? 0.01 : 0.06;
    if (rel > tol)
      print_error("step %d: gpu loss %.6f, cpu %.6f (%.3f apart)\n", s, gpu.loss[s], cpu.loss[s],
                  rel);
    assert_true(rel <= tol);
  }
  assert_true(gpu.loss[o.steps - 1] < 0.97f * gpu.loss[0]);
  assert_true(cpu.loss[o.steps - 1] < 0.97f * cpu.loss[0]);
  tc_result_free(&gpu);
  tc_result_free(&cpu);
}

/* fp16 storage with dynamic loss scaling (the cuda backend computes in fp16 then): it learns as
 * the bf16 run does, and placement still changes no bit. */
static void test_fp16(void **state) {
  (void)state;
  struct tc_opts o;
  gpu_opts(&o);
  o.fp16 = 1;
  o.steps = 12;
  struct tc_result fp16, bf16, fp16_host;
  run(&o, &fp16);
  o.param_dev = "cpu";
  o.opt_dev = "cpu";
  run(&o, &fp16_host);
  tc_expect_same(&fp16, &fp16_host, "gpu fp16: offload cpu");
  o.fp16 = 0;
  run(&o, &bf16);
  for (int s = 0; s < o.steps; s++) {
    double rel = fabs((double)fp16.loss[s] - bf16.loss[s]) / bf16.loss[s];
    if (rel > 0.06)
      print_error("step %d: fp16 loss %.6f, bf16 %.6f\n", s, fp16.loss[s], bf16.loss[s]);
    assert_true(rel <= 0.06);
  }
  assert_true(fp16.loss[o.steps - 1] < 0.97f * fp16.loss[0]);
  tc_result_free(&fp16);
  tc_result_free(&fp16_host);
  tc_result_free(&bf16);
}

int main(int argc, char **argv) {
  char why[256];
  if (tz_compute_probe("cuda", why, sizeof why) < 0)
    tz_test_skip("%s", why);
  if (argc > 1 && strcmp(argv[1], "jitter") == 0)
    jitter_us = 200;
  signal(SIGALRM, watchdog);
  alarm(240);
  nvme_dir = tz_test_mkdtemp("train-gpu");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_placement),
      cmocka_unit_test(test_placement_experts),
      cmocka_unit_test(test_folded),
      cmocka_unit_test(test_overlapped),
      cmocka_unit_test(test_forced_default_window),
      cmocka_unit_test(test_cpu_adam_share),
      cmocka_unit_test(test_layer_rate),
      cmocka_unit_test(test_against_cpu),
      cmocka_unit_test(test_fp16),
      cmocka_unit_test(test_recompute),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(nvme_dir);
  return rc;
}
