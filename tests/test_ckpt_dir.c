/* The checkpoint directory a run is given (--ckpt-dir), checked before any step (trainer/run.h,
 * docs/checkpoints.md "One run per directory"), through tz_run in a world of one, cpu backend,
 * the tiny model on synthetic data:
 *  - a second run given the directory of a run still going is refused at start, naming the
 *    holder's pid; once that holder is killed with SIGKILL the directory is free again;
 *  - a directory that cannot be created or written is refused before the first step, naming it;
 *  - a file system with less free space than one checkpoint more than keep holds is refused
 *    before the first step, saying what is needed and what is free (the free space is the test's
 *    through the checkpoint options' free_bytes hook); with enough free space the run goes on. */
#define _GNU_SOURCE
#include "collectives/launch.h"
#include "core/error.h"
#include "testlib.h"
#include "trainer/checkpoint.h"
#include "trainer/run.h"

#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *dir;

struct rec {
  int n_steps, n_ckpt;
  int signal_fd; /* >= 0: at TZ_RUN_BEGIN, write a byte here and wait to be killed */
};

static int record(void *arg, const struct tz_run_event *ev) {
  struct rec *r = arg;
  if (ev->kind == TZ_RUN_STEP)
    r->n_steps++;
  if (ev->kind == TZ_RUN_CHECKPOINT)
    r->n_ckpt++;
  if (ev->kind == TZ_RUN_BEGIN && r->signal_fd >= 0) {
    char c = 1;
    if (write(r->signal_fd, &c, 1) != 1)
      _exit(3);
    for (;;)
      pause();
  }
  return 0;
}

static const char *at(const char *name) {
  static char bufs[8][1024];
  static int next;
  char *b = bufs[next++ % 8];
  snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
  return b;
}

static void options(struct tz_run_options *o, struct rec *r, int64_t steps) {
  memset(r, 0, sizeof *r);
  r->signal_fd = -1;
  tz_run_options_init(o);
  o->model = "tiny";
  o->data = "synthetic";
  o->seq = 16;
  o->steps = steps;
  o->rates = at("rates.json");
  o->on_event = record;
  o->arg = r;
}

static int run(struct tz_run_options *o, struct tz_run_result *res) {
  static const char *const sets[] = {"train_micro_batch_size_per_gpu=2",
                                     "gradient_accumulation_steps=2", "optimizer.params.lr=0.01"};
  struct tz_run_sources src = {.sets = sets, .n_sets = 3};
  TZ_ASSERT_OK(tz_run_options_check(o, 1));
  struct tz_config cfg;
  TZ_ASSERT_OK(tz_run_config(o, &src, 1, &cfg));
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  struct tz_run_world w;
  TZ_ASSERT_OK(tz_run_world_open(&bs, &cfg, &w));
  int rc = tz_run(o, &cfg, w.comm, w.rt, res);
  tz_run_world_close(&w);
  tz_config_free(&cfg);
  return rc;
}

/* Runs first, before this process has started any thread: the holder is a forked child that
 * begins a long run in the directory and stops in its TZ_RUN_BEGIN event until it is killed. */
static void test_second_writer_refused(void **state) {
  (void)state;
  const char *ck = at("shared-ck");
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    close(p[0]);
    struct tz_run_options o;
    struct rec r;
    options(&o, &r, 1000000);
    r.signal_fd = p[1];
    o.ckpt_dir = ck;
    struct tz_run_result res;
    run(&o, &res);
    _exit(2); /* the holder never ends on its own */
  }
  close(p[1]);
  char c = 0;
  ssize_t got = read(p[0], &c, 1);
  close(p[0]);
  if (got != 1) {
    int st = 0;
    waitpid(child, &st, 0);
    fail_msg("the holder run ended before its first step (status %d)", st);
  }

  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 3);
  o.ckpt_dir = ck;
  struct tz_run_result res;
  int rc = run(&o, &res);
  char want[64];
  snprintf(want, sizeof want, "in use by pid %d", (int)child);
  const char *msg = tz_err_msg();
  int refused = rc == TZ_EBUSY && strstr(msg, ck) && strstr(msg, "--ckpt-dir") &&
                strstr(msg, want) && r.n_steps == 0;

  /* The kernel drops the lock of a process killed with SIGKILL: the next run is not blocked. */
  assert_int_equal(kill(child, SIGKILL), 0);
  int st = 0;
  assert_int_equal(waitpid(child, &st, 0), child);
  assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  if (!refused)
    fail_msg("a second writer of %s was not refused at start: rc %d, %d steps taken, \"%s\"", ck,
             rc, r.n_steps, msg);

  options(&o, &r, 3);
  o.ckpt_dir = ck;
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(r.n_steps, 3);
  assert_int_equal(res.saved, 3);
  /* Two runs one after the other in one process: the first released the directory. */
  options(&o, &r, 4);
  o.ckpt_dir = ck;
  o.resume = "";
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(r.n_steps, 1);
}

static void test_unwritable_dir_refused_at_start(void **state) {
  (void)state;
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 3);
  o.ckpt_dir = "/proc/nope";
  struct tz_run_result res;
  int rc = run(&o, &res);
  assert_true(rc < 0);
  assert_int_equal(r.n_steps, 0);
  assert_int_equal(res.steps_done, 0);
  assert_non_null(strstr(tz_err_msg(), "--ckpt-dir /proc/nope"));

  /* A path through a regular file cannot be a directory. */
  FILE *f = fopen(at("plain"), "w");
  assert_non_null(f);
  fclose(f);
  options(&o, &r, 3);
  o.ckpt_dir = at("plain/ck");
  rc = run(&o, &res);
  assert_true(rc < 0);
  assert_int_equal(r.n_steps, 0);
  assert_non_null(strstr(tz_err_msg(), o.ckpt_dir));
  /* The probe leaves nothing behind in a directory it could write. */
}

/* The free space the free_bytes hook reports. */
static int fake_free(void *ctx, const char *root, uint64_t *bytes) {
  (void)root;
  *bytes = *(const uint64_t *)ctx;
  return 0;
}

/* Bytes of the files in a step directory. */
static uint64_t dir_bytes(const char *path) {
  DIR *d = opendir(path);
  assert_non_null(d);
  uint64_t n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char p[2048];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    if (e->d_name[0] != '.' && stat(p, &st) == 0 && S_ISREG(st.st_mode))
      n += (uint64_t)st.st_size;
  }
  closedir(d);
  return n;
}

static void test_too_small_dir_refused_at_start(void **state) {
  (void)state;
  /* One checkpoint's size, as written. */
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 1);
  o.ckpt_dir = at("size-ck");
  struct tz_run_result res;
  TZ_ASSERT_OK(run(&o, &res));
  uint64_t one = dir_bytes(at("size-ck/step-00000001"));
  assert_true(one > 4096);

  /* keep 2: three checkpoints at once (the new one is written before the oldest goes); room for
   * two is not enough. */
  uint64_t free_bytes = 2 * one;
  struct tz_ckpt_options co = {.hooks = {.free_bytes = fake_free, .ctx = &free_bytes}};
  options(&o, &r, 6);
  o.ckpt_dir = at("small-ck");
  o.save_every = 1;
  o.keep = 2;
  o.ckpt_options = &co;
  int rc = run(&o, &res);
  const char *msg = tz_err_msg();
  if (rc != TZ_ENOSPC || r.n_steps != 0)
    fail_msg("a directory with room for 2 checkpoints of %" PRIu64
             " bytes was not refused at start with keep 2: rc %d, %d steps, \"%s\"",
             one, rc, r.n_steps, msg);
  assert_non_null(strstr(msg, "--ckpt-dir"));
  assert_non_null(strstr(msg, o.ckpt_dir));
  const char *needs = strstr(msg, "needs ");
  assert_non_null(needs);
  unsigned long long need = strtoull(needs + 6, NULL, 10);
  /* What the writer writes, plus at most a page of JSON, the manifest and latest per checkpoint. */
  assert_true(need >= 3 * one);
  assert_true(need <= 3 * (one + 3 * 4096));
  char fr[64];
  snprintf(fr, sizeof fr, "%" PRIu64 " bytes free", free_bytes);
  assert_non_null(strstr(msg, fr));

  /* With room for them the same run goes on, and keeps 2. */
  free_bytes = need;
  options(&o, &r, 6);
  o.ckpt_dir = at("small-ck");
  o.save_every = 1;
  o.keep = 2;
  o.ckpt_options = &co;
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(r.n_steps, 6);
  uint64_t steps[8];
  assert_int_equal(tz_ckpt_list(o.ckpt_dir, steps, 8), 2);

  /* keep 0 keeps all: a run of 3 saves needs room for 3 of them, 2 are not enough. */
  free_bytes = 2 * one;
  options(&o, &r, 3);
  o.ckpt_dir = at("all-ck");
  o.save_every = 1;
  o.ckpt_options = &co;
  rc = run(&o, &res);
  assert_int_equal(rc, TZ_ENOSPC);
  assert_int_equal(r.n_steps, 0);
}

int main(void) {
  dir = tz_test_mkdtemp("ckpt-dir");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_writer_refused),
      cmocka_unit_test(test_unwritable_dir_refused_at_start),
      cmocka_unit_test(test_too_small_dir_refused_at_start),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
