/* Resuming training from checkpoints (trainer/checkpoint/resume.h), world of one, cpu backend:
 *  - 3 steps, save, resume in a fresh trainer, 3 more steps: the losses (as float bits) and every
 *    final parameter equal those of 6 steps straight;
 *  - the same with the resumed run placed elsewhere (offload none, cpu, nvme) than the saving one;
 *  - a corrupted shard: the error names the file and the section and offers the previous
 *    checkpoint;
 *  - a full disk while saving (the checkpoint layer's ENOSPC fault): a clear error, the previous
 *    checkpoint intact and still latest;
 *  - tz-train ($TZ_BIN/tz-train) sent SIGTERM after its first steps: exits non-zero saying so,
 *    leaves a checkpoint, and --resume continues with the losses of a straight run. */
#define _GNU_SOURCE
#include "collectives/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/runtime.h"
#include "testlib.h"
#include "train_cases.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/resume.h"
#include "trainer/step/train.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TOTAL 6

static char *dir;

/* What the next part_with runs differently: another model, decay options, and a resume that may
 * fail (its rc into load_rc, and the part stops there). NULL: the cases' own. */
struct variant {
  const struct tz_model_config *mc;
  const char *decay_exclude, *weight_decay;
  int *load_rc;
};
static const struct variant *var;

/* A run in a fresh trainer placed by dev: resumes from `from` (NULL: from scratch), trains steps
 * [start, until) (the schedule always planned for TOTAL), saves under `save` (NULL: no save) and
 * records the losses (at their global step) and the final parameters. Returns the save's rc. */
static int part_with(const char *dev, const char *from, int until, const char *save,
                     const struct tz_ckpt_options *opt, struct tc_result *res) {
  struct tc_world w;
  tc_world_open(&w);
  memset(res, 0, sizeof *res);
  struct tc_opts o;
  tc_opts_init(&o);
  o.param_dev = dev;
  o.opt_dev = dev;
  o.nvme_dir = dir;
  struct tz_model_config mc;
  tc_model(&mc);
  if (var && var->mc)
    mc = *var->mc;
  if (var) {
    o.decay_exclude = var->decay_exclude;
    o.weight_decay = var->weight_decay;
  }
  struct tz_config cfg;
  TZ_ASSERT_OK(tc_config(&cfg, &o, 1));
  struct tz_trainer_params tp;
  tz_trainer_params_init(&tp);
  tp.seq_len = TC_SEQ;
  tp.total_steps = TOTAL;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tz_trainer_create(&cfg, &mc, w.comm, w.rt, &tp, &tr));
  int64_t start = 0;
  if (from && var && var->load_rc) {
    *var->load_rc = tz_resume_load(tr, w.comm, from, &start);
    if (*var->load_rc < 0) {
      tz_trainer_destroy(tr);
      tz_config_free(&cfg);
      tc_world_close(&w);
      return 0;
    }
  } else if (from) {
    TZ_ASSERT_OK(tz_resume_load(tr, w.comm, from, &start));
    assert_int_equal(tz_trainer_steps_done(tr), start);
  }
  int n = o.accum * o.micro * TC_SEQ;
  int32_t tok[n], tgt[n];
  for (int s = (int)start; s < until; s++) {
    for (int k = 0; k < o.accum; k++)
      tz_synthetic_batch(7, tz_synthetic_first(s, k, 0, 1, o.accum, o.micro), o.micro, TC_SEQ,
                         mc.vocab, tok + k * o.micro * TC_SEQ, tgt + k * o.micro * TC_SEQ);
    struct tz_step_result sr;
    TZ_ASSERT_OK(tz_trainer_step(tr, tok, tgt, NULL, &sr));
    res->loss[s] = sr.loss;
  }
  res->steps = until;
  int rc = 0;
  if (save)
    rc = tz_resume_save_with(tr, w.comm, &cfg, save, 0, opt);
  res->nb = tz_model_n_blocks(&mc);
  for (int b = 0; b < res->nb; b++) {
    res->numel[b] = tz_model_block_numel(&mc, b);
    res->master[b] = malloc(sizeof(float) * res->numel[b]);
    res->param[b] = malloc(sizeof(float) * res->numel[b]);
    TZ_ASSERT_OK(tz_trainer_param_load(tr, b, TZ_PLAN_MASTER, res->master[b]));
    TZ_ASSERT_OK(tz_trainer_param_load(tr, b, TZ_PLAN_PARAM, res->param[b]));
  }
  tz_trainer_destroy(tr);
  tz_config_free(&cfg);
  tc_world_close(&w);
  return rc;
}

static int part(const char *dev, const char *from, int until, const char *save,
                struct tc_result *res) {
  return part_with(dev, from, until, save, NULL, res);
}

static char *root(const char *name) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return path;
}

/* The resumed run's losses of steps [from, TOTAL) and final parameters against the straight run. */
static void expect_same(const struct tc_result *straight, const struct tc_result *resumed, int from,
                        const char *what) {
  for (int s = from; s < TOTAL; s++) {
    if (memcmp(&straight->loss[s], &resumed->loss[s], sizeof(float)))
      print_error("%s: step %d loss %.9g vs %.9g\n", what, s, straight->loss[s], resumed->loss[s]);
    assert_memory_equal(&straight->loss[s], &resumed->loss[s], sizeof(float));
  }
  int ld;
  struct tc_result a = *straight, b = *resumed;
  memset(a.loss, 0, sizeof a.loss);
  memset(b.loss, 0, sizeof b.loss);
  uint64_t d = tc_diff(&a, &b, &ld);
  if (d)
    print_error("%s: %llu parameter elements differ\n", what, (unsigned long long)d);
  assert_int_equal(d, 0);
}

static void test_bit_exact(void **state) {
  (void)state;
  struct tc_result straight, first, resumed;
  TZ_ASSERT_OK(part("none", NULL, TOTAL, NULL, &straight));
  TZ_ASSERT_OK(part("none", NULL, 3, root("exact"), &first));
  for (int s = 0; s < 3; s++)
    assert_memory_equal(&straight.loss[s], &first.loss[s], sizeof(float));
  TZ_ASSERT_OK(part("none", NULL, 0, NULL, &resumed));
  int ld;
  assert_int_not_equal(tc_diff(&straight, &resumed, &ld), 0); /* the comparison can fail */
  tc_result_free(&resumed);
  TZ_ASSERT_OK(part("none", root("exact"), TOTAL, NULL, &resumed));
  expect_same(&straight, &resumed, 3, "resume");
  tc_result_free(&straight);
  tc_result_free(&first);
  tc_result_free(&resumed);
}

static void test_placement(void **state) {
  (void)state;
  static const char *devs[] = {"none", "cpu", "nvme"};
  struct tc_result straight, r;
  TZ_ASSERT_OK(part("cpu", NULL, TOTAL, NULL, &straight));
  for (int i = 0; i < 3; i++) {
    char name[64];
    snprintf(name, sizeof name, "place-%s", devs[i]);
    TZ_ASSERT_OK(part(devs[i], NULL, 2, root(name), &r));
    tc_result_free(&r);
    for (int j = 0; j < 3; j++) {
      char what[64];
      snprintf(what, sizeof what, "saved %s, resumed %s", devs[i], devs[j]);
      TZ_ASSERT_OK(part(devs[j], root(name), TOTAL, NULL, &r));
      expect_same(&straight, &r, 2, what);
      tc_result_free(&r);
    }
  }
  tc_result_free(&straight);
}

/* The payload offset of section `name` in a rank file, from its index (docs/checkpoints.md). */
static uint64_t section_offset(const char *file, const char *name) {
  int fd = open(file, O_RDONLY);
  assert_true(fd >= 0);
  struct stat st;
  assert_int_equal(fstat(fd, &st), 0);
  unsigned char tr[64];
  assert_int_equal(pread(fd, tr, 64, st.st_size - 64), 64);
  uint64_t ioff, ibytes;
  memcpy(&ioff, tr + 8, 8);
  memcpy(&ibytes, tr + 16, 8);
  unsigned char *idx = malloc(ibytes);
  assert_int_equal(pread(fd, idx, ibytes, (off_t)ioff), (ssize_t)ibytes);
  close(fd);
  uint64_t found = 0;
  for (uint64_t p = 0; p + 24 <= ibytes;) {
    uint64_t off;
    uint16_t len;
    memcpy(&off, idx + p, 8);
    memcpy(&len, idx + p + 22, 2);
    if (len == strlen(name) && memcmp(idx + p + 24, name, len) == 0)
      found = off;
    p += 24 + len;
  }
  free(idx);
  assert_true(found > 0);
  return found;
}

static void test_corrupt(void **state) {
  (void)state;
  struct tc_result r;
  TZ_ASSERT_OK(part("none", NULL, 2, root("corrupt"), &r));
  tc_result_free(&r);
  TZ_ASSERT_OK(part("none", root("corrupt"), 4, root("corrupt"), &r));
  tc_result_free(&r);
  char file[1100];
  snprintf(file, sizeof file, "%s/step-00000004/rank-00000.bin", root("corrupt"));
  uint64_t off = section_offset(file, "layer1.m") + 100;
  int fd = open(file, O_RDWR);
  assert_true(fd >= 0);
  unsigned char c;
  assert_int_equal(pread(fd, &c, 1, (off_t)off), 1);
  c ^= 0x10;
  assert_int_equal(pwrite(fd, &c, 1, (off_t)off), 1);
  close(fd);

  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  struct tz_model_config mc;
  tc_model(&mc);
  struct tz_config cfg;
  TZ_ASSERT_OK(tc_config(&cfg, &o, 1));
  struct tz_trainer_params tp;
  tz_trainer_params_init(&tp);
  tp.seq_len = TC_SEQ;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tz_trainer_create(&cfg, &mc, w.comm, w.rt, &tp, &tr));
  int rc = tz_resume_load(tr, w.comm, root("corrupt"), NULL);
  const char *msg = tz_err_msg();
  print_message("corrupted: %s\n", msg);
  assert_int_equal(rc, TZ_ECHECKSUM);
  assert_non_null(strstr(msg, "step-00000004/rank-00000.bin"));
  assert_non_null(strstr(msg, "layer1.m"));
  assert_non_null(strstr(msg, "step-00000002"));
  tz_trainer_destroy(tr);
  tz_config_free(&cfg);
  tc_world_close(&w);
  /* The previous checkpoint it offers loads and continues as a straight run does. */
  struct tc_result straight;
  TZ_ASSERT_OK(part("none", NULL, TOTAL, NULL, &straight));
  char prev[1100];
  snprintf(prev, sizeof prev, "%s/step-00000002", root("corrupt"));
  TZ_ASSERT_OK(part("none", prev, TOTAL, NULL, &r));
  expect_same(&straight, &r, 2, "the previous checkpoint");
  tc_result_free(&r);
  tc_result_free(&straight);
}

/* A disk that fills up at the at-th write or fsync of the save path. */
struct disk_full {
  long at;
  _Atomic long ops; /* the hook is called from whichever thread runs a rank's save */
};

static int disk_full_before(void *ctx, int data_op) {
  struct disk_full *d = ctx;
  return data_op && ++d->ops == d->at ? ENOSPC : 0;
}

static void test_enospc(void **state) {
  (void)state;
  struct tc_result r;
  TZ_ASSERT_OK(part("none", NULL, 2, root("full"), &r));
  tc_result_free(&r);
  /* The 5th write or fsync of the save fails as a full disk makes it. */
  struct disk_full full = {5, 0};
  struct tz_ckpt_options opt = {.hooks = {.before_op = disk_full_before, .ctx = &full}};
  int rc = part_with("none", root("full"), 4, root("full"), &opt, &r);
  tc_result_free(&r);
  print_message("disk full: %s\n", tz_err_msg());
  assert_int_equal(rc, TZ_ENOSPC);
  assert_non_null(strstr(tz_err_msg(), "rank-00000.bin"));
  uint64_t latest = 0;
  TZ_ASSERT_OK(tz_ckpt_latest(root("full"), &latest));
  assert_int_equal(latest, 2);
  uint64_t steps[4];
  assert_int_equal(tz_ckpt_list(root("full"), steps, 4), 1);
  char path[1100];
  snprintf(path, sizeof path, "%s/step-00000002", root("full"));
  TZ_ASSERT_OK(tz_ckpt_check(path, 1));
  snprintf(path, sizeof path, "%s/step-00000004.tmp", root("full"));
  assert_int_not_equal(access(path, F_OK), 0);
}

/* ---- the format's versions and the model record ---- */

static char *first_line(const char *stepdir) {
  static char line[128];
  char path[1200];
  snprintf(path, sizeof path, "%s/manifest", stepdir);
  FILE *f = fopen(path, "r");
  line[0] = 0;
  if (f) {
    if (!fgets(line, sizeof line, f))
      line[0] = 0;
    fclose(f);
  }
  return line;
}

/* A checkpoint written in version 1's layout (no model record in its state) still resumes, bit
 * for bit; the current writer writes version 2. */
static void test_version1(void **state) {
  (void)state;
  struct tc_result straight, first, resumed;
  struct tz_ckpt_options v1 = {.version = 1};
  TZ_ASSERT_OK(part("none", NULL, TOTAL, NULL, &straight));
  TZ_ASSERT_OK(part_with("none", NULL, 3, root("v1"), &v1, &first));
  char path[1200];
  snprintf(path, sizeof path, "%s/step-00000003", root("v1"));
  assert_non_null(strstr(first_line(path), "tierzero-checkpoint 1 "));
  tz_ckpt_reader *r = NULL;
  TZ_ASSERT_OK(tz_ckpt_open(path, 0, &r));
  assert_int_equal(tz_ckpt_version(r), 1);
  char *st = NULL;
  TZ_ASSERT_OK(tz_ckpt_get_json(r, "state", &st));
  assert_null(strstr(st, "\"model\""));
  free(st);
  tz_ckpt_close(r);
  TZ_ASSERT_OK(part("none", root("v1"), TOTAL, NULL, &resumed));
  expect_same(&straight, &resumed, 3, "resume of version 1");
  tc_result_free(&resumed);
  /* the current version records the model */
  TZ_ASSERT_OK(part("none", NULL, 3, root("v2"), &resumed));
  tc_result_free(&resumed);
  snprintf(path, sizeof path, "%s/step-00000003", root("v2"));
  assert_non_null(strstr(first_line(path), "tierzero-checkpoint 2 "));
  TZ_ASSERT_OK(tz_ckpt_open(path, 0, &r));
  TZ_ASSERT_OK(tz_ckpt_get_json(r, "state", &st));
  assert_non_null(strstr(st, "\"family\":\"llama\""));
  assert_non_null(strstr(st, "\"n_layer\":4"));
  assert_non_null(strstr(st, "\"weight_decay_exclude\":\"none\""));
  free(st);
  tz_ckpt_close(r);
  tc_result_free(&straight);
  tc_result_free(&first);
}

/* A resume with another model is refused naming the field and both values; one with another
 * weight-decay exclusion, naming both. */
static void test_model_refused(void **state) {
  (void)state;
  struct tc_result r;
  TZ_ASSERT_OK(part("none", NULL, 2, root("model"), &r));
  tc_result_free(&r);
  struct tz_model_config mc;
  int rc = 0;
  static const struct {
    const char *field, *want;
  } cases[] = {{"n_layer", "n_layer 4, this run's 3"},
               {"rope_theta", "rope_theta 10000, this run's 500000"},
               {"family", "family \"llama\", this run's \"mistral\""},
               {"norm_eps", "norm_eps 1e-05, this run's 1e-06"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tc_model(&mc);
    if (i == 0)
      mc.n_layer = 3;
    else if (i == 1)
      mc.rope_theta = 500000;
    else if (i == 2)
      mc.family = TZ_FAMILY_MISTRAL;
    else
      mc.norm_eps = 1e-6;
    struct variant v = {.mc = &mc, .load_rc = &rc};
    var = &v;
    rc = 0;
    part("none", root("model"), 3, NULL, &r);
    var = NULL;
    tc_result_free(&r);
    print_message("%s: %s\n", cases[i].field, tz_err_msg());
    assert_int_equal(rc, TZ_ECONFIG);
    assert_non_null(strstr(tz_err_msg(), cases[i].want));
  }
  /* the same model with head_dim given as what it is resumes */
  tc_model(&mc);
  mc.head_dim = mc.d_model / mc.n_head;
  struct variant same = {.mc = &mc, .load_rc = &rc};
  var = &same;
  part("none", root("model"), 3, NULL, &r);
  var = NULL;
  tc_result_free(&r);
  assert_int_equal(rc, 0);
  /* another exclusion, with weight decay: refused naming both; without, nothing changes */
  struct variant ex = {.decay_exclude = "bias:norm", .load_rc = &rc};
  var = &ex;
  part("none", root("model"), 3, NULL, &r);
  var = NULL;
  tc_result_free(&r);
  print_message("decay: %s\n", tz_err_msg());
  assert_int_equal(rc, TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "\"none\", this run has \"bias,norm\""));
  struct variant ex0 = {.decay_exclude = "bias:norm", .weight_decay = "0", .load_rc = &rc};
  var = &ex0;
  part("none", root("model"), 3, NULL, &r);
  var = NULL;
  tc_result_free(&r);
  assert_int_equal(rc, 0);
}

/* ---- tz-train ---- */

static char bin[1024];

static int tz_train(const char *args, const char *out) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s/cache OMP_NUM_THREADS=1 %s %s > %s/%s 2>&1", dir,
           bin, args, dir, out);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *name) {
  static char buf[1 << 16];
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f)
    return buf[0] = 0, buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

/* The losses of a metrics file by step (1-based), as floats; returns the last step. */
static int losses(const char *name, float *loss, int cap) {
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  char line[4096];
  int last = 0;
  while (fgets(line, sizeof line, f)) {
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    if (!o)
      break; /* a line being written */
    json_t *s = json_object_get(o, "step");
    if (json_is_integer(s) && !json_is_true(json_object_get(o, "summary"))) {
      int k = (int)json_integer_value(s);
      if (k >= 1 && k <= cap) {
        loss[k - 1] = (float)json_number_value(json_object_get(o, "loss"));
        last = k;
      }
    }
    json_decref(o);
  }
  fclose(f);
  return last;
}

#define CLI_ARGS                                                                                   \
  "--model tiny --seed 3 --seq 32 --data synthetic --set gradient_clipping=1.0 "                   \
  "--set train_micro_batch_size_per_gpu=2"

static void test_sigterm(void **state) {
  (void)state;
  char ck[1100], metrics[1100], outp[1100], steps[32];
  snprintf(ck, sizeof ck, "%s/cli", dir);
  snprintf(metrics, sizeof metrics, "%s/stopped.jsonl", dir);
  snprintf(outp, sizeof outp, "%s/stopped.out", dir);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    char cache[1100];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("XDG_CACHE_HOME", cache, 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    execl(bin, bin, "--model", "tiny", "--seed", "3", "--seq", "32", "--data", "synthetic", "--set",
          "gradient_clipping=1.0", "--set", "train_micro_batch_size_per_gpu=2", "--steps", "100000",
          "--ckpt-dir", ck, "--metrics", metrics, (char *)NULL);
    _exit(127);
  }
  float loss[64];
  struct timespec ts = {0, 5000000};
  for (int i = 0; i < 6000 && losses("stopped.jsonl", loss, 64) < 2; i++)
    nanosleep(&ts, NULL);
  assert_int_equal(kill(pid, SIGTERM), 0);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  char *out = slurp("stopped.out");
  print_message("%s", strstr(out, "tz-train: rank") ? strstr(out, "tz-train: rank") : out);
  assert_true(WIFEXITED(st));
  assert_int_not_equal(WEXITSTATUS(st), 0);
  assert_non_null(strstr(out, "stopped by Terminated"));
  assert_non_null(strstr(out, "--resume"));
  uint64_t saved = 0;
  TZ_ASSERT_OK(tz_ckpt_latest(ck, &saved));
  int done = losses("stopped.jsonl", loss, 64);
  assert_true(saved >= 2 && (int)saved == done && saved + 3 <= 64);

  /* Resume to saved + 3 steps, against a straight run of as many. */
  float resumed[64], straight[64];
  int total = (int)saved + 3;
  snprintf(steps, sizeof steps, "%d", total);
  char args[4096];
  snprintf(args, sizeof args, CLI_ARGS " --steps %d --resume %s --metrics %s/resumed.jsonl", total,
           ck, dir);
  int rc = tz_train(args, "resumed.out");
  if (rc)
    print_error("%s", slurp("resumed.out"));
  assert_int_equal(rc, 0);
  assert_non_null(strstr(slurp("resumed.out"), "resumed from"));
  snprintf(args, sizeof args, CLI_ARGS " --steps %d --metrics %s/straight.jsonl", total, dir);
  assert_int_equal(tz_train(args, "straight.out"), 0);
  assert_int_equal(losses("straight.jsonl", straight, 64), total);
  assert_int_equal(losses("resumed.jsonl", resumed, 64), total);
  for (int s = 0; s < (int)saved; s++)
    assert_memory_equal(&straight[s], &loss[s], sizeof(float));
  for (int s = (int)saved; s < total; s++) {
    if (memcmp(&straight[s], &resumed[s], sizeof(float)))
      print_error("step %d: straight %.9g, resumed %.9g\n", s + 1, straight[s], resumed[s]);
    assert_memory_equal(&straight[s], &resumed[s], sizeof(float));
  }
  /* The end of the run saved the last step too. */
  TZ_ASSERT_OK(tz_ckpt_latest(ck, &saved));
  assert_int_equal(saved, total);
}

/* Resuming with a configuration whose seed differs (issue #27 item 5): the checkpoint's seed and
 * data position win, and one line says so naming both seeds; --reseed takes the new seed (the
 * data order changes from the resumed step on) and says that. */
#define RESEED_ARGS                                                                                \
  "--model tiny --seq 32 --data synthetic --set gradient_clipping=1.0 "                            \
  "--set train_micro_batch_size_per_gpu=2"

static int count_lines_with(const char *text, const char *a, const char *b) {
  int n = 0;
  for (const char *l = text; l && *l;) {
    const char *e = strchr(l, '\n');
    size_t len = e ? (size_t)(e - l) : strlen(l);
    char line[2048];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), l);
    n += strstr(line, a) && strstr(line, b);
    l = e ? e + 1 : NULL;
  }
  return n;
}

static void test_reseed(void **state) {
  (void)state;
  char args[4096], cfg[1100];
  snprintf(cfg, sizeof cfg, "%s/seed9.json", dir);
  FILE *f = fopen(cfg, "w");
  assert_non_null(f);
  fputs("{\"seed\": 9}\n", f);
  fclose(f);
  float straight[8], resumed[8], reseeded[8], other[8];
  snprintf(args, sizeof args, RESEED_ARGS " --seed 3 --steps 4 --metrics %s/rs-straight.jsonl",
           dir);
  assert_int_equal(tz_train(args, "rs-straight.out"), 0);
  assert_int_equal(losses("rs-straight.jsonl", straight, 8), 4);
  snprintf(args, sizeof args, RESEED_ARGS " --seed 9 --steps 4 --metrics %s/rs-nine.jsonl", dir);
  assert_int_equal(tz_train(args, "rs-nine.out"), 0);
  assert_int_equal(losses("rs-nine.jsonl", other, 8), 4);
  snprintf(args, sizeof args, RESEED_ARGS " --seed 3 --steps 2 --ckpt-dir %s/rs", dir);
  assert_int_equal(tz_train(args, "rs-first.out"), 0);
  /* --config with seed 9: the checkpoint's seed 3 is kept */
  snprintf(args, sizeof args,
           RESEED_ARGS " --config %s --steps 4 --resume %s/rs/step-00000002 --metrics "
                       "%s/rs-resumed.jsonl",
           cfg, dir, dir);
  int rc = tz_train(args, "rs-resumed.out");
  char *out = slurp("rs-resumed.out");
  if (rc)
    print_error("%s", out);
  assert_int_equal(rc, 0);
  print_message("%s", strstr(out, "seed") ? strstr(out, "seed") : out);
  assert_int_equal(count_lines_with(out, "seed 3", "seed 9"), 1);
  assert_non_null(strstr(out, "--reseed"));
  assert_int_equal(losses("rs-resumed.jsonl", resumed, 8), 4);
  for (int s = 2; s < 4; s++)
    assert_memory_equal(&resumed[s], &straight[s], sizeof(float));
  /* --seed 9 on the command line: the same */
  snprintf(args, sizeof args,
           RESEED_ARGS " --seed 9 --steps 4 --resume %s/rs/step-00000002 --metrics "
                       "%s/rs-flag.jsonl",
           dir, dir);
  assert_int_equal(tz_train(args, "rs-flag.out"), 0);
  assert_int_equal(count_lines_with(slurp("rs-flag.out"), "seed 3", "seed 9"), 1);
  assert_int_equal(losses("rs-flag.jsonl", resumed, 8), 4);
  for (int s = 2; s < 4; s++)
    assert_memory_equal(&resumed[s], &straight[s], sizeof(float));
  /* --reseed: seed 9 from step 3 on, said */
  snprintf(args, sizeof args,
           RESEED_ARGS " --config %s --reseed --steps 4 --resume %s/rs/step-00000002 --metrics "
                       "%s/rs-reseeded.jsonl",
           cfg, dir, dir);
  rc = tz_train(args, "rs-reseeded.out");
  out = slurp("rs-reseeded.out");
  if (rc)
    print_error("%s", out);
  assert_int_equal(rc, 0);
  assert_int_equal(count_lines_with(out, "seed 9", "seed 3"), 1);
  assert_int_equal(losses("rs-reseeded.jsonl", reseeded, 8), 4);
  assert_true(memcmp(&reseeded[2], &straight[2], sizeof(float)) != 0);
  /* the same seed: nothing said */
  snprintf(args, sizeof args,
           RESEED_ARGS " --seed 3 --steps 3 --resume %s/rs/step-00000002 --metrics "
                       "%s/rs-same.jsonl",
           dir, dir);
  assert_int_equal(tz_train(args, "rs-same.out"), 0);
  assert_null(strstr(slurp("rs-same.out"), "--reseed"));
  (void)other;
}

int main(void) {
  const char *b = getenv("TZ_BIN");
  snprintf(bin, sizeof bin, "%s/tz-train", b ? b : "bin");
  dir = tz_test_mkdtemp("resume");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bit_exact),     cmocka_unit_test(test_placement),
      cmocka_unit_test(test_corrupt),       cmocka_unit_test(test_enospc),
      cmocka_unit_test(test_sigterm),       cmocka_unit_test(test_version1),
      cmocka_unit_test(test_model_refused), cmocka_unit_test(test_reseed),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
