/* The checkpoint directory a run is given (--ckpt-dir), checked before any step (trainer/run/run.h,
 * docs/checkpoints.md "One run per directory"), through tz_run in a world of one, cpu backend,
 * the tiny model on synthetic data:
 *  - a second run given the directory of a run still going is refused at start, naming the
 *    holder's pid; once that holder is killed with SIGKILL the directory is free again;
 *  - a directory that cannot be created or written is refused before the first step, naming it;
 *  - a file system with less free space than one checkpoint more than keep holds is refused
 *    before the first step, saying what is needed and what is free (the free space is the test's
 *    through the checkpoint options' free_bytes hook); with enough free space the run goes on;
 *  - a save that fails (ENOSPC, EIO from the checkpoint options' before_op hook, armed after a
 *    chosen step) says which step's save failed and what a resume can use now, verified to its
 *    checksums: the checkpoint latest still names, none, a damaged latest and the intact one
 *    before it, a latest older than the newest complete checkpoint. */
#define _GNU_SOURCE
#include "collectives/launch.h"
#include "core/error.h"
#include "run_once.h"
#include "testlib.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/run/run.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *dir;

/* A save that fails: once armed, the at-th write or fsync fails with err. */
struct fail_save {
  int armed, err;
  long at, ops;
};

static int fail_before(void *ctx, int data_op) {
  struct fail_save *f = ctx;
  return f->armed && data_op && ++f->ops == f->at ? f->err : 0;
}

struct rec {
  int n_steps, n_ckpt;
  int signal_fd; /* >= 0: at TZ_RUN_BEGIN, write a byte here and wait to be killed */
  struct fail_save *fail;
  int64_t arm_after; /* the step after which fail is armed */
};

static int record(void *arg, const struct tz_run_event *ev) {
  struct rec *r = arg;
  if (ev->kind == TZ_RUN_STEP)
    r->n_steps++;
  if (ev->kind == TZ_RUN_STEP && r->fail && ev->step == r->arm_after)
    r->fail->armed = 1;
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
  return tz_test_run_once(o, sets, 3, res);
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

/* A run of `steps` saving every `every` into ck (resumed from `from` when not NULL), whose save
 * after step `fail_at` fails with err; returns the run's rc with the message in msg. */
static int failing_run(const char *ck, const char *from, int64_t steps, int64_t every,
                       int64_t fail_at, int err, char *msg, size_t len) {
  struct fail_save f = {.err = err, .at = 3};
  struct tz_ckpt_options co = {.hooks = {.before_op = fail_before, .ctx = &f}};
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, steps);
  r.fail = &f;
  r.arm_after = fail_at;
  o.ckpt_dir = ck;
  o.save_every = every;
  o.resume = from;
  o.ckpt_options = &co;
  struct tz_run_result res;
  int rc = run(&o, &res);
  snprintf(msg, len, "%s", tz_err_msg());
  print_message("%s\n", msg);
  return rc;
}

static void expect_in(const char *msg, const char *want) {
  if (!strstr(msg, want))
    fail_msg("\"%s\" is not in the message: %s", want, msg);
}

static void test_failed_save_names_latest(void **state) {
  (void)state;
  char msg[4096], want[1200];
  /* latest still names the last save: verified intact */
  const char *ck = at("fail-intact");
  assert_int_equal(failing_run(ck, NULL, 4, 2, 4, ENOSPC, msg, sizeof msg), TZ_ENOSPC);
  expect_in(msg, "the save of step 4 failed");
  expect_in(msg, "No space left on device");
  snprintf(want, sizeof want,
           "latest still names step-00000002 in %s, intact (its checksums "
           "verified): --resume %s",
           ck, ck);
  expect_in(msg, want);
  /* nothing saved before */
  ck = at("fail-none");
  assert_int_equal(failing_run(ck, NULL, 2, 0, 2, EIO, msg, sizeof msg), TZ_EIO);
  expect_in(msg, "the save of step 2 failed");
  snprintf(want, sizeof want, "%s holds no checkpoint (no latest): nothing to resume from", ck);
  expect_in(msg, want);
}

static void flip(const char *path, long off) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  int c = fgetc(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  fputc(c ^ 0x10, f);
  fclose(f);
}

static void test_failed_save_damaged_latest(void **state) {
  (void)state;
  char msg[4096], want[1200];
  const char *ck = at("fail-damaged");
  struct tz_run_options o;
  struct rec r;
  struct tz_run_result res;
  options(&o, &r, 4);
  o.ckpt_dir = ck;
  o.save_every = 2;
  TZ_ASSERT_OK(run(&o, &res));
  /* a payload byte of latest's step-4: its structure still passes, its checksums do not */
  char file[1200];
  snprintf(file, sizeof file, "%s/step-00000004/rank-00000.bin", ck);
  struct stat st;
  assert_int_equal(stat(file, &st), 0);
  flip(file, (long)st.st_size / 2);
  char from[1200];
  snprintf(from, sizeof from, "%s/step-00000002", ck);
  assert_int_equal(failing_run(ck, from, 6, 0, 6, ENOSPC, msg, sizeof msg), TZ_ENOSPC);
  expect_in(msg, "the save of step 6 failed");
  expect_in(msg, "latest names step-00000004, which is damaged");
  expect_in(msg, "crc32c mismatch");
  snprintf(want, sizeof want,
           "the newest intact checkpoint (its checksums verified) is step-00000002: --resume "
           "%s/step-00000002",
           ck);
  expect_in(msg, want);
}

static void test_failed_save_latest_older(void **state) {
  (void)state;
  char msg[4096], want[1200];
  const char *ck = at("fail-older");
  struct tz_run_options o;
  struct rec r;
  struct tz_run_result res;
  options(&o, &r, 4);
  o.ckpt_dir = ck;
  o.save_every = 2;
  TZ_ASSERT_OK(run(&o, &res));
  /* latest left at step 2, as a save whose update of latest failed leaves it */
  char latest[1200];
  snprintf(latest, sizeof latest, "%s/latest", ck);
  FILE *f = fopen(latest, "w");
  assert_non_null(f);
  fputs("step-00000002\n", f);
  fclose(f);
  char from[1200];
  snprintf(from, sizeof from, "%s/step-00000004", ck);
  assert_int_equal(failing_run(ck, from, 6, 0, 6, EIO, msg, sizeof msg), TZ_EIO);
  expect_in(msg, "the save of step 6 failed");
  expect_in(msg, "latest still names step-00000002");
  snprintf(want, sizeof want,
           "latest is older than step-00000004, the newest complete checkpoint: --resume "
           "%s/step-00000004",
           ck);
  expect_in(msg, want);
}

int main(void) {
  dir = tz_test_mkdtemp("ckpt-dir");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_second_writer_refused),
      cmocka_unit_test(test_unwritable_dir_refused_at_start),
      cmocka_unit_test(test_too_small_dir_refused_at_start),
      cmocka_unit_test(test_failed_save_names_latest),
      cmocka_unit_test(test_failed_save_damaged_latest),
      cmocka_unit_test(test_failed_save_latest_older),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
