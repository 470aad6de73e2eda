/* Training on two GPUs (the cuda backend, the nccl comm, two workers started by tz_launch_run)
 * against one GPU accumulating the same micro-batches in the same order: the same losses and
 * parameters, bit for bit. With two ranks every reduction is one addition of two terms, which
 * NCCL and the one-rank accumulation (micro-batch 0 copied, micro-batch 1 added) do alike.
 * Two cases: clipping with folded optimizer steps and state in GPU memory; no clipping,
 * overlapped steps and state on the host; and each again with overlapped collectives (the lane
 * and the comm on streams of their own, each phase gathering the next layer and reduce-scattering
 * the previous one's gradient while it computes).
 * Skips (77) with fewer than two GPUs. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm.h"
#include "collectives/launch.h"
#include "core/error.h"
#include "core/runtime.h"
#include "testlib.h"
#include "train_cases.h"

static char *self_path, *dir;

static void case_opts(int which, struct tc_opts *o) {
  tc_opts_init(o);
  o->backend = "cuda";
  o->small_window = 1;
  o->accum = 1;
  o->overlap = (which & 2) != 0;
  if (which & 1) {
    o->clip = 0;
    o->param_dev = "cpu";
    o->opt_dev = "cpu";
  }
}

static int write_result(const char *path, const struct tc_result *r) {
  FILE *f = fopen(path, "wb");
  if (!f)
    return tz_err_errno(errno, "test: cannot create %s", path);
  int ok = fwrite(&r->steps, sizeof r->steps, 1, f) == 1 &&
           fwrite(r->loss, sizeof(float), TC_STEPS_MAX, f) == TC_STEPS_MAX &&
           fwrite(&r->nb, sizeof r->nb, 1, f) == 1;
  for (int b = 0; ok && b < r->nb; b++)
    ok = fwrite(&r->numel[b], sizeof r->numel[b], 1, f) == 1 &&
         fwrite(r->master[b], sizeof(float), r->numel[b], f) == r->numel[b] &&
         fwrite(r->param[b], sizeof(float), r->numel[b], f) == r->numel[b];
  ok = fclose(f) == 0 && ok;
  return ok ? 0 : tz_err_set(TZ_EIO, "test: cannot write %s", path);
}

static int read_result(const char *path, struct tc_result *r) {
  memset(r, 0, sizeof *r);
  FILE *f = fopen(path, "rb");
  if (!f)
    return tz_err_errno(errno, "test: cannot open %s", path);
  int ok = fread(&r->steps, sizeof r->steps, 1, f) == 1 &&
           fread(r->loss, sizeof(float), TC_STEPS_MAX, f) == TC_STEPS_MAX &&
           fread(&r->nb, sizeof r->nb, 1, f) == 1 && r->nb > 0 && r->nb <= 64;
  for (int b = 0; ok && b < r->nb; b++) {
    ok = fread(&r->numel[b], sizeof r->numel[b], 1, f) == 1 && r->numel[b] < (1u << 26);
    if (!ok)
      break;
    r->master[b] = malloc(sizeof(float) * r->numel[b]);
    r->param[b] = malloc(sizeof(float) * r->numel[b]);
    ok = r->master[b] && r->param[b] &&
         fread(r->master[b], sizeof(float), r->numel[b], f) == r->numel[b] &&
         fread(r->param[b], sizeof(float), r->numel[b], f) == r->numel[b];
  }
  fclose(f);
  return ok ? 0 : tz_err_set(TZ_EIO, "test: %s is short or malformed", path);
}

/* A worker: one rank of the two, on its GPU; rank 0 writes the result to path. */
static int worker(int which, const char *path) {
  struct tz_bootstrap bs;
  tz_runtime *rt = NULL;
  tz_comm *comm = NULL;
  struct tc_result r;
  memset(&r, 0, sizeof r);
  int rc = tz_bootstrap_detect(&bs);
  if (rc == 0)
    rc = tz_runtime_create(NULL, &rt);
  if (rc == 0) {
    struct tz_comm_params p;
    tz_comm_params_init(&p);
    p.progress = tz_runtime_progress(rt);
    rc = tz_comm_create("nccl", &bs, &p, &comm);
  }
  struct tc_opts o;
  case_opts(which, &o);
  if (rc == 0)
    rc = tc_run(&o, comm, rt, &r);
  if (rc == 0 && bs.rank == 0)
    rc = write_result(path, &r);
  if (rc < 0)
    fprintf(stderr, "rank %d: %s\n", bs.rank, tz_err_msg());
  tc_result_free(&r);
  tz_comm_destroy(comm);
  tz_runtime_destroy(rt);
  return rc < 0 ? 1 : 0;
}

static void two_against_one(int which) {
  char path[4096], arg[16];
  snprintf(path, sizeof path, "%s/case%d.bin", dir, which);
  snprintf(arg, sizeof arg, "worker%d", which);
  char *argv[] = {self_path, arg, path, NULL};
  struct tz_launch_params lp;
  tz_launch_params_init(&lp);
  lp.nproc = 2;
  struct tz_launch_result res;
  TZ_ASSERT_OK(tz_launch_run(&lp, 3, argv, &res));
  assert_int_equal(res.exit_code, 0);
  struct tc_result two, one;
  TZ_ASSERT_OK(read_result(path, &two));

  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  case_opts(which, &o);
  o.accum = 2;
  TZ_ASSERT_OK(tc_run(&o, w.comm, w.rt, &one));
  tc_world_close(&w);

  int ld;
  uint64_t d = tc_diff(&two, &one, &ld);
  if (ld || d) {
    for (int s = 0; s < one.steps; s++)
      print_error("case %d: step %d loss %.9g (2 GPUs) vs %.9g (1 GPU, 2 micro-batches)\n", which,
                  s, two.loss[s], one.loss[s]);
    print_error("case %d: %llu parameter elements differ\n", which, (unsigned long long)d);
  }
  assert_false(ld);
  assert_int_equal(d, 0);
  for (int s = 0; s < one.steps; s++)
    assert_true(isfinite(one.loss[s]));
  tc_result_free(&two);
  tc_result_free(&one);
}

static void test_folded_in_gpu_memory(void **state) {
  (void)state;
  two_against_one(0);
}

static void test_overlapped_on_host(void **state) {
  (void)state;
  two_against_one(1);
}

static void test_folded_in_gpu_memory_collectives_overlapped(void **state) {
  (void)state;
  two_against_one(2);
}

static void test_overlapped_on_host_collectives_overlapped(void **state) {
  (void)state;
  two_against_one(3);
}

int main(int argc, char **argv) {
  self_path = argv[0];
  if (argc > 2 && strncmp(argv[1], "worker", 6) == 0)
    return worker(atoi(argv[1] + 6), argv[2]);
  char why[256] = "";
  int gpus = tz_comm_probe("nccl", why, sizeof why);
  if (gpus < 0)
    tz_test_skip("%s", why);
  if (gpus < 2)
    tz_test_skip("nccl: %d GPU visible; this test needs 2", gpus);
  dir = tz_test_mkdtemp("train-nccl");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_folded_in_gpu_memory),
      cmocka_unit_test(test_overlapped_on_host),
      cmocka_unit_test(test_folded_in_gpu_memory_collectives_overlapped),
      cmocka_unit_test(test_overlapped_on_host_collectives_overlapped),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
