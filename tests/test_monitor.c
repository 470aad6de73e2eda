/* Live monitoring (trainer/run/monitor.h): a ds_config's tensorboard and csv_monitor sections.
 * - The keys: defaults, values, bad values refused naming the key, wandb.enabled refused with
 *   the alternatives, the monitors left out of checkpoints' configurations.
 * - The directory: DeepSpeed's os.path.join(output_path, job_name), with its defaults.
 * - The event file, read back here independently of the writer: every record's length and data
 *   carry TFRecord's masked CRC-32C, the first event holds file_version "brain.Event:2" and no
 *   step, each step's event holds its scalars at its x (DeepSpeed's global samples); the file is
 *   whole after each write while the monitor is open. Its name is TensorBoard's.
 * - The CSV files: one per tag, DeepSpeed's names, header and rows, values as Python's repr.
 * - Errors: a directory that cannot be made names the keys and the path; bad writes.
 * - tz-train end to end on the cpu backend ($TZ_BIN): a ds_config with both sections writes one
 *   value per step of each tag at DeepSpeed's x, its loss, learning rate (the scheduler's after
 *   the step) and fp16 loss scale; CSV under the default directory; wandb and a directory that
 *   cannot be made are refused before the first step. */
#define _GNU_SOURCE
#include "testlib.h"
#include "tfevents.h"

#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/config.h"
#include "core/error.h"
#include "trainer/run/monitor.h"

static char *dir;

/* ---- Reading an event file: tests/tfevents.h ---- */

/* The first event: the file version, no step, a wall time of now. */
static void check_first(const struct tfev *e) {
  assert_string_equal(e->version, "brain.Event:2");
  assert_false(e->has_step);
  assert_int_equal(e->n, 0);
  assert_true(e->wall > 1.6e9 && e->wall < 1e11);
}

/* The whole of path (NUL-terminated; caller frees), NULL when it cannot be read. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  char *s = NULL;
  size_t cap = 0;
  ssize_t n = getdelim(&s, &cap, '\0', f);
  fclose(f);
  if (n < 0) {
    free(s);
    return strdup("");
  }
  return s;
}

/* The one file of d whose name starts with prefix (asserts there is exactly one). */
static char *only_file(const char *d, const char *prefix) {
  DIR *dd = opendir(d);
  if (!dd)
    print_error("cannot open %s\n", d);
  assert_non_null(dd);
  char *found = NULL;
  struct dirent *de;
  while ((de = readdir(dd))) {
    if (strncmp(de->d_name, prefix, strlen(prefix)) != 0)
      continue;
    assert_null(found);
    assert_true(asprintf(&found, "%s/%s", d, de->d_name) > 0);
  }
  closedir(dd);
  assert_non_null(found);
  return found;
}

/* ---- The keys ---- */

static void test_keys(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  assert_int_equal(c.tensorboard.enabled, 0);
  assert_null(c.tensorboard.output_path);
  assert_null(c.tensorboard.job_name);
  assert_int_equal(c.csv_monitor.enabled, 0);
  TZ_ASSERT_OK(tz_config_load_string(
      &c,
      "{\"tensorboard\": {\"enabled\": true, \"output_path\": \"\", \"job_name\": \"j\"},"
      " \"csv_monitor\": {\"enabled\": true, \"output_path\": \"out/\"},"
      " \"wandb\": {\"enabled\": false, \"project\": \"p\", \"team\": null}}",
      "ds.json"));
  assert_int_equal(c.tensorboard.enabled, 1);
  assert_string_equal(c.tensorboard.output_path, ""); /* DeepSpeed's default, given */
  assert_string_equal(c.tensorboard.job_name, "j");
  assert_int_equal(c.csv_monitor.enabled, 1);
  assert_string_equal(c.csv_monitor.output_path, "out/");
  assert_null(c.csv_monitor.job_name);
  /* wandb's other keys are DeepSpeed's, and not used */
  assert_int_equal(tz_config_ignored_count(&c), 1);
  assert_string_equal(tz_config_ignored(&c, 0), "wandb.project");
  TZ_ASSERT_OK(tz_monitor_check(&c));
  /* A run's settings: a checkpoint's configuration has none of them. */
  struct tz_config saved;
  TZ_ASSERT_OK(tz_config_copy(&saved, &c));
  tz_config_forget_run(&saved);
  assert_int_equal(saved.tensorboard.enabled, 0);
  assert_null(saved.tensorboard.job_name);
  assert_int_equal(saved.csv_monitor.enabled, 0);
  assert_null(saved.csv_monitor.output_path);
  tz_config_free(&saved);

  /* Bad values name the key; the configuration stays as it was. */
  static const struct {
    const char *json, *want;
  } bad[] = {
      {"{\"tensorboard\": {\"enabled\": \"yes\"}}", "ds.json: tensorboard.enabled: expected true"},
      {"{\"tensorboard\": {\"job_name\": 3}}", "ds.json: tensorboard.job_name: expected a string"},
      {"{\"csv_monitor\": {\"output_path\": [\"a\"]}}",
       "ds.json: csv_monitor.output_path: expected a string"},
      {"{\"csv_monitor\": 1}", "ds.json: csv_monitor: expected an object"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(tz_config_load_string(&c, bad[i].json, "ds.json"), TZ_ECONFIG);
    if (!strstr(tz_err_msg(), bad[i].want))
      print_error("%s: %s\n", bad[i].json, tz_err_msg());
    assert_non_null(strstr(tz_err_msg(), bad[i].want));
  }
  assert_string_equal(c.tensorboard.job_name, "j");

  /* wandb: refused, naming the key and what to use. */
  assert_int_equal(tz_config_load_string(&c, "{\"wandb\": {\"enabled\": true}}", "ds.json"),
                   TZ_ECONFIG);
  const char *msg = tz_err_msg();
  assert_non_null(strstr(msg, "ds.json: wandb.enabled: only false is supported, got true"));
  assert_non_null(strstr(msg, "tensorboard"));
  assert_non_null(strstr(msg, "csv_monitor"));
  assert_non_null(strstr(msg, "wandb sync"));
  assert_int_equal(tz_config_set(&c, "wandb.enabled", "true"), TZ_ECONFIG);
  TZ_ASSERT_OK(tz_config_set(&c, "tensorboard.output_path", "")); /* as text too */
  assert_string_equal(c.tensorboard.output_path, "");

  /* No directory at all: refused before anything is made, naming both keys. */
  TZ_ASSERT_OK(tz_config_set(&c, "tensorboard.job_name", ""));
  assert_int_equal(tz_monitor_check(&c), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "tensorboard.output_path and tensorboard.job_name"));
  tz_monitor *m = NULL;
  assert_int_equal(tz_monitor_create(&c, &m), TZ_ECONFIG);
  assert_null(m);
  tz_config_free(&c);
}

/* DeepSpeed's log_dir = os.path.join(output_path, job_name), defaults "" and "DeepSpeedJobName"
 * (deepspeed/monitor/tensorboard.py, csv_monitor.py, config.py). */
static void test_dir_rule(void **state) {
  (void)state;
  static const struct {
    const char *out, *job, *want;
  } cases[] = {
      {NULL, NULL, "DeepSpeedJobName"},
      {"", NULL, "DeepSpeedJobName"},
      {NULL, "job", "job"},
      {"", "job", "job"},
      {"out", "job", "out/job"},
      {"output/ds_logs/", "zero_infinity", "output/ds_logs/zero_infinity"},
      {"/abs", "job", "/abs/job"},
      {"out", "/elsewhere/job", "/elsewhere/job"}, /* an absolute job_name stands alone */
      {"out", "", "out/"},
      {"out", "a/b", "out/a/b"},
      {"", "", ""},
  };
  char buf[64];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    TZ_ASSERT_OK(tz_monitor_dir(cases[i].out, cases[i].job, buf, sizeof buf));
    assert_string_equal(buf, cases[i].want);
  }
  assert_int_equal(tz_monitor_dir("out", "job", buf, 7), TZ_EINVAL);
  TZ_ASSERT_OK(tz_monitor_dir("out", "job", buf, 8));
}

/* ---- The files ---- */

/* A configuration with the monitors in DIR/<sub>/tb/job and DIR/<sub>/csv/job. */
static void monitor_config(struct tz_config *c, const char *sub, int tb, int csv) {
  tz_config_defaults(c);
  char path[1200];
  snprintf(path, sizeof path, "%s/%s/tb", dir, sub);
  if (tb) {
    TZ_ASSERT_OK(tz_config_set(c, "tensorboard.enabled", "true"));
    TZ_ASSERT_OK(tz_config_set(c, "tensorboard.output_path", path));
    TZ_ASSERT_OK(tz_config_set(c, "tensorboard.job_name", "job"));
  }
  snprintf(path, sizeof path, "%s/%s/csv/", dir, sub);
  if (csv) {
    TZ_ASSERT_OK(tz_config_set(c, "csv_monitor.enabled", "true"));
    TZ_ASSERT_OK(tz_config_set(c, "csv_monitor.output_path", path));
    TZ_ASSERT_OK(tz_config_set(c, "csv_monitor.job_name", "job"));
  }
}

#define STEPS 3
#define BATCH 32

/* The steps written, each value's Python repr beside it (computed with Python 3). */
static const struct {
  double loss, lr, scale, grad, step_s, tps, eval;
  const char *loss_s, *lr_s, *scale_s, *grad_s, *step_s_s, *tps_s, *eval_s;
} rows[STEPS] = {
    {2.345599889755249, 0.0, 65536.0, 1e-05, 0.25, 1.5e16, 0, "2.345599889755249", "0.0", "65536.0",
     "1e-05", "0.25", "1.5e+16", NULL},
    {0.1, 0.0001, 32768.0, 123456789012345678.0, 1e16, -0.0, 7.25e-05, "0.1", "0.0001", "32768.0",
     "1.2345678901234568e+17", "1e+16", "-0.0", "7.25e-05"},
    {NAN, 1.0 / 3, INFINITY, 1e15, 5e-324, 0.00012, 0, "nan", "0.3333333333333333", "inf",
     "1000000000000000.0", "5e-324", "0.00012", NULL},
};

static void write_step(tz_monitor *m, int i) {
  struct tz_monitor_step s = {.samples = (int64_t)(i + 1) * BATCH,
                              .train_loss = rows[i].loss,
                              .lr = rows[i].lr,
                              .has_loss_scale = 1,
                              .loss_scale = rows[i].scale,
                              .has_eval = rows[i].eval_s != NULL,
                              .eval_loss = rows[i].eval,
                              .grad_norm = rows[i].grad,
                              .step_s = rows[i].step_s,
                              .tokens_per_s = rows[i].tps};
  TZ_ASSERT_OK(tz_monitor_write_step(m, &s));
}

static void check_value(float got, double want) {
  if (isnan(want))
    assert_true(isnan(got));
  else
    assert_true(got == (float)want && !signbit(got) == !signbit(want));
}

static void test_event_file(void **state) {
  (void)state;
  struct tz_config c;
  monitor_config(&c, "events", 1, 0);
  tz_monitor *m = NULL;
  TZ_ASSERT_OK(tz_monitor_create(&c, &m));
  assert_non_null(m);
  assert_null(tz_monitor_csv_dir(m));
  const char *path = tz_monitor_event_file(m);
  assert_non_null(path);
  /* TensorBoard's name: events.out.tfevents.<10-digit seconds>.<host>.<pid>.<n> */
  char want_dir[1200], host[256], tail[512];
  snprintf(want_dir, sizeof want_dir, "%s/events/tb/job/events.out.tfevents.", dir);
  assert_memory_equal(path, want_dir, strlen(want_dir));
  const char *name = path + strlen(want_dir);
  for (int i = 0; i < 10; i++)
    assert_true(name[i] >= '0' && name[i] <= '9');
  assert_true(labs(atol(name) - (long)time(NULL)) < 100);
  assert_int_equal(gethostname(host, sizeof host), 0);
  snprintf(tail, sizeof tail, ".%s.%ld.", host, (long)getpid());
  assert_memory_equal(name + 10, tail, strlen(tail));

  struct tfev ev[STEPS + 2];
  /* Whole right after it opens (the first record), and after each step while still open. */
  assert_int_equal(tfev_read(path, ev, STEPS + 2), 1);
  check_first(&ev[0]);
  for (int i = 0; i < STEPS; i++) {
    write_step(m, i);
    assert_int_equal(tfev_read(path, ev, STEPS + 2), i + 2);
  }
  for (int i = 0; i < STEPS; i++) {
    const struct tfev *e = &ev[i + 1];
    assert_true(e->has_step);
    assert_int_equal(e->step, (i + 1) * BATCH);
    assert_true(e->wall >= ev[0].wall);
    /* DeepSpeed's tags, then tierzero's own, in this order */
    static const char *const tags[] = {"Train/Samples/train_loss", "Train/Samples/lr",
                                       "Train/Samples/loss_scale", "Train/Samples/eval_loss",
                                       "tierzero/grad_norm",       "tierzero/step_time_s",
                                       "tierzero/tokens_per_s"};
    int k = 0;
    for (int t = 0; t < 7; t++) {
      if (t == 3 && !rows[i].eval_s)
        continue;
      assert_string_equal(e->tag[k], tags[t]);
      k++;
    }
    assert_int_equal(e->n, k);
    check_value(tfev_scalar(e, "Train/Samples/train_loss"), rows[i].loss);
    check_value(tfev_scalar(e, "Train/Samples/lr"), rows[i].lr);
    check_value(tfev_scalar(e, "Train/Samples/loss_scale"), rows[i].scale);
    if (rows[i].eval_s)
      check_value(tfev_scalar(e, "Train/Samples/eval_loss"), rows[i].eval);
    check_value(tfev_scalar(e, "tierzero/grad_norm"), rows[i].grad);
    check_value(tfev_scalar(e, "tierzero/step_time_s"), rows[i].step_s);
    check_value(tfev_scalar(e, "tierzero/tokens_per_s"), rows[i].tps);
  }
  /* A second monitor in the same second and directory gets a file of its own. */
  tz_monitor *m2 = NULL;
  TZ_ASSERT_OK(tz_monitor_create(&c, &m2));
  assert_string_not_equal(tz_monitor_event_file(m2), path);
  tz_monitor_destroy(m2);
  tz_monitor_destroy(m);
  tz_monitor_destroy(NULL);
  tz_config_free(&c);
}

/* The CSV file of tag in d with its expected header and rows (the rows' values given for the
 * steps at which the tag was written). */
static void check_csv(const char *d, const char *file, const char *header, const char *rows_text) {
  char path[1300];
  snprintf(path, sizeof path, "%s/%s", d, file);
  char *got = slurp(path);
  if (!got)
    print_error("no file %s\n", path);
  assert_non_null(got);
  char *want = NULL;
  assert_true(asprintf(&want, "step,%s\r\n%s", header, rows_text) > 0);
  if (strcmp(got, want) != 0)
    print_error("%s:\n%s\nexpected:\n%s\n", path, got, want);
  assert_string_equal(got, want);
  free(want);
  free(got);
}

static void test_csv_files(void **state) {
  (void)state;
  struct tz_config c;
  monitor_config(&c, "csv", 0, 1);
  for (int run = 0; run < 2; run++) {
    tz_monitor *m = NULL;
    TZ_ASSERT_OK(tz_monitor_create(&c, &m));
    assert_null(tz_monitor_event_file(m));
    for (int i = 0; i < STEPS; i++)
      write_step(m, i);
    tz_monitor_destroy(m);
  }
  char d[1200];
  snprintf(d, sizeof d, "%s/csv/csv/job", dir);
  /* Each file: DeepSpeed's name (the tag, '/' as '_'), "step,<last part>", "<x>,<repr>". Opened
   * to append, as DeepSpeed's 'a+': the second monitor's header and rows follow the first's. */
  const struct {
    const char *file, *header;
    int col;
  } files[] = {
      {"Train_Samples_train_loss.csv", "train_loss", 0},
      {"Train_Samples_lr.csv", "lr", 1},
      {"Train_Samples_loss_scale.csv", "loss_scale", 2},
      {"tierzero_grad_norm.csv", "grad_norm", 3},
      {"tierzero_step_time_s.csv", "step_time_s", 4},
      {"tierzero_tokens_per_s.csv", "tokens_per_s", 5},
  };
  for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
    char text[1024] = "", once[512] = "";
    size_t at = 0;
    for (int i = 0; i < STEPS; i++) {
      const char *v[] = {rows[i].loss_s, rows[i].lr_s,     rows[i].scale_s,
                         rows[i].grad_s, rows[i].step_s_s, rows[i].tps_s};
      at += (size_t)snprintf(once + at, sizeof once - at, "%d,%s\r\n", (i + 1) * BATCH,
                             v[files[f].col]);
    }
    snprintf(text, sizeof text, "%sstep,%s\r\n%s", once, files[f].header, once);
    check_csv(d, files[f].file, files[f].header, text);
  }
  /* eval_loss only where a step had one */
  char eval_rows[256];
  snprintf(eval_rows, sizeof eval_rows, "%d,%s\r\nstep,eval_loss\r\n%d,%s\r\n", 2 * BATCH,
           rows[1].eval_s, 2 * BATCH, rows[1].eval_s);
  check_csv(d, "Train_Samples_eval_loss.csv", "eval_loss", eval_rows);

  /* Tags of tz_monitor_write: a space becomes '_' in the name, the header is the last part. */
  tz_monitor *m = NULL;
  TZ_ASSERT_OK(tz_monitor_create(&c, &m));
  struct tz_monitor_scalar v[] = {{"a b/c d", 1.5}, {"plain", 2}};
  TZ_ASSERT_OK(tz_monitor_write(m, 7, v, 2));
  check_csv(d, "a_b_c_d.csv", "c d", "7,1.5\r\n");
  check_csv(d, "plain.csv", "plain", "7,2.0\r\n");
  /* Tags that cannot be written: refused, nothing written. */
  struct tz_monitor_scalar bad[] = {{"", 1}};
  assert_int_equal(tz_monitor_write(m, 8, bad, 1), TZ_EINVAL);
  char longtag[TZ_MONITOR_MAX_TAG + 2];
  memset(longtag, 'x', sizeof longtag - 1);
  longtag[sizeof longtag - 1] = 0;
  bad[0].tag = longtag;
  assert_int_equal(tz_monitor_write(m, 8, bad, 1), TZ_EINVAL);
  assert_int_equal(tz_monitor_write(m, 8, v, TZ_MONITOR_MAX_SCALARS + 1), TZ_EINVAL);
  check_csv(d, "plain.csv", "plain", "7,2.0\r\n");
  tz_monitor_destroy(m);
  tz_config_free(&c);
}

/* A directory that cannot be made (a file stands where a parent would be): refused at creation,
 * naming the keys and the path. */
static void test_unmakeable_dir(void **state) {
  (void)state;
  char file[1200];
  snprintf(file, sizeof file, "%s/a-file", dir);
  FILE *f = fopen(file, "w");
  assert_non_null(f);
  fclose(f);
  for (int which = 0; which < 2; which++) {
    const char *section = which ? "csv_monitor" : "tensorboard";
    struct tz_config c;
    tz_config_defaults(&c);
    char key[64];
    snprintf(key, sizeof key, "%s.enabled", section);
    TZ_ASSERT_OK(tz_config_set(&c, key, "true"));
    snprintf(key, sizeof key, "%s.output_path", section);
    TZ_ASSERT_OK(tz_config_set(&c, key, file));
    tz_monitor *m = NULL;
    int rc = tz_monitor_create(&c, &m);
    assert_true(rc < 0);
    assert_null(m);
    char want[1400];
    snprintf(want, sizeof want, "%s.output_path, %s.job_name: cannot create the directory %s/%s",
             section, section, file, "DeepSpeedJobName");
    if (!strstr(tz_err_msg(), want))
      print_error("%s\n", tz_err_msg());
    assert_non_null(strstr(tz_err_msg(), want));
    tz_config_free(&c);
  }
}

/* ---- tz-train end to end ---- */

static char bin[1024];

/* tz-train on the cpu backend in DIR/<sub> (its working directory), its output in DIR/<sub>/out.
 * Returns the exit status. */
static int tz_train(const char *sub, const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "mkdir -p %s/%s && cd %s/%s && XDG_CACHE_HOME=%s/cache OMP_NUM_THREADS=1 %s --backend "
           "cpu %s > out 2>&1",
           dir, sub, dir, sub, dir, bin, args);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *train_output(const char *sub) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s/out", dir, sub);
  char *s = slurp(path);
  assert_non_null(s);
  return s;
}

static void write_file(const char *sub, const char *name, const char *text) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s", dir, sub);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* Rows of a CSV file after its header: x and value, as the run wrote them. */
static int csv_rows(const char *path, long *x, double *v, int max) {
  char *s = slurp(path);
  if (!s)
    print_error("no file %s\n", path);
  assert_non_null(s);
  char *line = strstr(s, "\r\n");
  assert_non_null(line);
  int n = 0;
  for (line += 2; *line; n++) {
    assert_true(n < max);
    char *end;
    x[n] = strtol(line, &end, 10);
    assert_int_equal(*end, ',');
    v[n] = strtod(end + 1, &end);
    assert_memory_equal(end, "\r\n", 2);
    line = end + 2;
  }
  free(s);
  return n;
}

#define E2E_STEPS 3

static void test_tz_train(void **state) {
  (void)state;
  /* micro 2 x accumulation 2 on one rank: 4 samples a step. The tensorboard directory is given;
   * the CSV's is DeepSpeed's default, ./DeepSpeedJobName in the run's working directory. fp16:
   * the loss scale is reported. */
  write_file("e2e", "ds.json",
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,\n"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},\n"
             " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,\n"
             "   \"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10, \"warmup_type\": "
             "\"linear\"}},\n"
             " \"fp16\": {\"enabled\": true},\n"
             " \"tensorboard\": {\"enabled\": true, \"output_path\": \"logs/\", \"job_name\": "
             "\"tb_job\"},\n"
             " \"csv_monitor\": {\"enabled\": true}}\n");
  char args[1024];
  snprintf(args, sizeof args,
           "--config ds.json --model tiny --steps %d --seq 16 --data synthetic --metrics m.jsonl",
           E2E_STEPS);
  int rc = tz_train("e2e", args);
  char *out = train_output("e2e");
  if (rc != 0)
    print_error("%s", out);
  assert_int_equal(rc, 0);
  /* The sections are used: not listed as keys without use. */
  assert_null(strstr(out, "config key tensorboard is not used"));
  assert_null(strstr(out, "config key csv_monitor is not used"));
  free(out);

  /* The metrics file: each step's loss, loss scale and whether it was skipped. */
  char path[1200];
  snprintf(path, sizeof path, "%s/e2e/m.jsonl", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  double loss[E2E_STEPS], scale[E2E_STEPS];
  int skipped[E2E_STEPS], n = 0;
  char line[1 << 16];
  while (fgets(line, sizeof line, f)) {
    json_t *o = json_loads(line, 0, NULL);
    assert_non_null(o);
    if (json_object_get(o, "step") && !json_object_get(o, "summary")) {
      assert_true(n < E2E_STEPS);
      loss[n] = json_number_value(json_object_get(o, "loss"));
      scale[n] = json_number_value(json_object_get(o, "loss_scale"));
      skipped[n] = json_is_true(json_object_get(o, "skipped"));
      n++;
    }
    json_decref(o);
  }
  fclose(f);
  assert_int_equal(n, E2E_STEPS);

  /* DeepSpeed's get_lr() after step k: the scheduler has stepped once per update applied (A),
   * so it is at iteration A - 1: linear warm-up over 10, 0.01 (A - 1) / 10, and warmup_min_lr 0
   * before any update. */
  double lr[E2E_STEPS];
  for (int i = 0, applied = 0; i < E2E_STEPS; i++) {
    applied += !skipped[i];
    lr[i] = applied > 0 ? 0.01 * (applied - 1) / 10 : 0;
  }

  snprintf(path, sizeof path, "%s/e2e/logs/tb_job", dir);
  char *events = only_file(path, "events.out.tfevents.");
  struct tfev ev[E2E_STEPS + 2];
  assert_int_equal(tfev_read(events, ev, E2E_STEPS + 2), E2E_STEPS + 1);
  free(events);
  check_first(&ev[0]);
  for (int i = 0; i < E2E_STEPS; i++) {
    const struct tfev *e = &ev[i + 1];
    assert_int_equal(e->step, 4 * (i + 1));
    TZ_ASSERT_REL(tfev_scalar(e, "Train/Samples/train_loss"), loss[i], 1e-6);
    TZ_ASSERT_REL(tfev_scalar(e, "Train/Samples/loss_scale"), scale[i], 1e-6);
    assert_true(fabs(tfev_scalar(e, "Train/Samples/lr") - lr[i]) <= 1e-7 * 0.01);
    assert_true(tfev_scalar(e, "tierzero/grad_norm") > 0);
    assert_true(tfev_scalar(e, "tierzero/step_time_s") > 0);
    assert_true(tfev_scalar(e, "tierzero/tokens_per_s") > 0);
    assert_false(tfev_has(e, "Train/Samples/eval_loss"));
  }

  /* The CSV files in ./DeepSpeedJobName: one row per step. */
  static const char *const files[] = {"Train_Samples_train_loss.csv", "Train_Samples_lr.csv",
                                      "Train_Samples_loss_scale.csv", "tierzero_grad_norm.csv",
                                      "tierzero_step_time_s.csv",     "tierzero_tokens_per_s.csv"};
  for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
    snprintf(path, sizeof path, "%s/e2e/DeepSpeedJobName/%s", dir, files[k]);
    long x[E2E_STEPS + 1];
    double v[E2E_STEPS + 1];
    assert_int_equal(csv_rows(path, x, v, E2E_STEPS + 1), E2E_STEPS);
    for (int i = 0; i < E2E_STEPS; i++) {
      assert_int_equal(x[i], 4 * (i + 1));
      if (k == 0)
        TZ_ASSERT_REL(v[i], loss[i], 1e-9);
      else if (k == 1)
        assert_true(fabs(v[i] - lr[i]) <= 1e-15);
    }
  }
}

/* Refusals before the first step: wandb at the configuration (exit 2), a directory that cannot
 * be made at the run's start (exit 1), each naming the key. */
static void test_tz_train_refusals(void **state) {
  (void)state;
  write_file("refuse", "wandb.json", "{\"wandb\": {\"enabled\": true, \"project\": \"p\"}}\n");
  assert_int_equal(tz_train("refuse", "--config wandb.json --model tiny --steps 3 --seq 16 "
                                      "--data synthetic"),
                   2);
  char *out = train_output("refuse");
  if (!strstr(out, "wandb.json: wandb.enabled: only false is supported"))
    print_error("%s", out);
  assert_non_null(strstr(out, "wandb.json: wandb.enabled: only false is supported"));
  assert_null(strstr(out, "step 1"));
  free(out);

  write_file("refuse", "file", "");
  write_file("refuse", "tb.json",
             "{\"tensorboard\": {\"enabled\": true, \"output_path\": \"file\"}}\n");
  int rc = tz_train("refuse", "--config tb.json --model tiny --steps 3 --seq 16 --data synthetic");
  out = train_output("refuse");
  if (rc == 0 || !strstr(out, "tensorboard.output_path, tensorboard.job_name: cannot create the "
                              "directory file/DeepSpeedJobName"))
    print_error("status %d: %s", rc, out);
  assert_true(rc != 0);
  assert_non_null(strstr(out, "tensorboard.output_path, tensorboard.job_name: cannot create the "
                              "directory file/DeepSpeedJobName"));
  assert_null(strstr(out, "step 1"));
  free(out);
}

int main(void) {
  const char *b = getenv("TZ_BIN");
  snprintf(bin, sizeof bin, "%s/tz-train", b ? b : "");
  dir = tz_test_mkdtemp("monitor");
  const struct CMUnitTest unit[] = {
      cmocka_unit_test(test_keys),           cmocka_unit_test(test_dir_rule),
      cmocka_unit_test(test_event_file),     cmocka_unit_test(test_csv_files),
      cmocka_unit_test(test_unmakeable_dir),
  };
  const struct CMUnitTest e2e[] = {
      cmocka_unit_test(test_tz_train),
      cmocka_unit_test(test_tz_train_refusals),
  };
  int rc = cmocka_run_group_tests_name("monitor", unit, NULL, NULL);
  /* tz-train runs only through ctest, which says where it is */
  if (b)
    rc |= cmocka_run_group_tests_name("monitor_tz_train", e2e, NULL, NULL);
  else
    fprintf(stderr, "test_monitor: TZ_BIN is not set (run through ctest): tz-train not run\n");
  tz_test_rmdir(dir);
  return rc;
}
