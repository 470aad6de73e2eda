/* tools/plot_metrics.py on a metrics file written by the metrics writer itself (a configuration
 * line first, then steps with traffic and memory): the curves it draws (--series, without
 * matplotlib) hold every step's lr, gradient norm, tokens/s, bytes per tier and lane and memory
 * per tier; with matplotlib the five PNG images exist and are PNG images of some size; a
 * malformed file is refused with its line number; a missing matplotlib gives its own message.
 * Skipped without python3; the images are skipped without matplotlib. */
#define _GNU_SOURCE
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <jansson.h>

#include "core/error.h"
#include "trainer/run/metrics.h"

static const char *python;
static int have_matplotlib;
static char *script;

/* Runs cmd, returns its exit status and (when out is non-NULL) its output, stderr included. */
static int run(const char *cmd, char **out) {
  char *full = NULL;
  assert_true(asprintf(&full, "%s 2>&1", cmd) > 0);
  FILE *p = popen(full, "r");
  assert_non_null(p);
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  char chunk[512];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, p)) > 0)
    fwrite(chunk, 1, n, m);
  fclose(m);
  int st = pclose(p);
  free(full);
  if (out)
    *out = buf;
  else
    free(buf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_metrics(const char *path, int steps) {
  tz_metrics_writer *w = NULL;
  TZ_ASSERT_OK(tz_metrics_writer_create(path, 0, &w));
  struct tz_config cfg;
  tz_config_defaults(&cfg);
  TZ_ASSERT_OK(tz_metrics_write_config(w, &cfg, 0));
  tz_config_free(&cfg);
  struct tz_metrics_summary sum;
  tz_metrics_summary_init(&sum, 1e6, 1e12);
  for (int s = 1; s <= steps; s++) {
    struct tz_step_metrics m;
    tz_step_metrics_init(&m);
    m.step = s;
    m.total_steps = steps;
    m.loss = 5.5 * exp(-0.05 * s) + 1.0;
    m.lr = 1e-3;
    m.grad_norm = 1.0;
    m.tokens = 4096;
    m.step_s = 0.4 + 0.01 * (s % 5);
    m.bound_s = 0.3;
    m.stall_s = 0.05;
    m.elapsed_s = 0.42 * s;
    if (s % 10 == 0) {
      m.has_eval = 1;
      m.eval_loss = m.loss + 0.1;
    }
    uint64_t rd = 300000000 + 1000000 * (uint64_t)s;
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "nvme", "read", rd));
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "nvme", "write", 100000000));
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "host", "h2d", 800000000));
    m.n_memory = 2;
    snprintf(m.memory[0].tier, sizeof m.memory[0].tier, "compute");
    m.memory[0].used = 1ull << 30;
    m.memory[0].capacity = 2ull << 30;
    snprintf(m.memory[1].tier, sizeof m.memory[1].tier, "nvme");
    m.memory[1].used = (uint64_t)s << 20;
    m.memory[1].capacity = 1ull << 32;
    tz_metrics_derive(&m, 1e6, 1e12);
    TZ_ASSERT_OK(tz_metrics_write_step(w, &m));
    tz_metrics_summary_add(&sum, &m);
  }
  TZ_ASSERT_OK(tz_metrics_write_summary(w, &sum));
  tz_metrics_writer_destroy(w);
}

static void check_png(const char *dir, const char *name) {
  char *p = NULL;
  assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
  FILE *f = fopen(p, "rb");
  if (!f)
    print_error("%s was not written\n", p);
  assert_non_null(f);
  unsigned char sig[8];
  assert_int_equal(fread(sig, 1, 8, f), 8);
  assert_memory_equal(sig, "\x89PNG\r\n\x1a\n", 8);
  fseek(f, 0, SEEK_END);
  /* A plot of some substance, not an empty canvas header. */
  assert_true(ftell(f) > 5000);
  fclose(f);
  free(p);
}

/* The curve `name` of image `image` in the --series output: its values (borrowed from o). */
static json_t *curve(json_t *o, const char *image, const char *name) {
  json_t *c = json_object_get(json_object_get(o, image), name);
  if (!c)
    print_error("--series has no curve %s of %s.png\n", name, image);
  assert_non_null(c);
  return json_object_get(c, "value");
}

static void test_series(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("plot");
  char *metrics = NULL, *cmd = NULL, *out = NULL;
  assert_true(asprintf(&metrics, "%s/metrics.jsonl", dir) > 0);
  write_metrics(metrics, 40);
  assert_true(asprintf(&cmd, "'%s' '%s' '%s' --series", python, script, metrics) > 0);
  int rc = run(cmd, &out);
  if (rc != 0)
    print_error("%s -> %d:\n%s\n", cmd, rc, out);
  assert_int_equal(rc, 0);
  json_error_t err;
  json_t *o = json_loads(out, 0, &err);
  if (!o)
    print_error("not JSON: %s\n%s\n", err.text, out);
  assert_non_null(o);
  assert_int_equal(json_array_size(curve(o, "training", "lr")), 40);
  assert_int_equal(json_array_size(curve(o, "training", "grad_norm")), 40);
  assert_int_equal(json_array_size(curve(o, "throughput", "tokens_per_s")), 40);
  json_t *rd = curve(o, "traffic", "nvme/read");
  assert_int_equal(json_array_size(rd), 40);
  /* GB/s over the step: step 1 read 301 MB in 0.41 s. */
  assert_float_equal(json_number_value(json_array_get(rd, 0)), 0.301 / 0.41, 1e-9);
  assert_int_equal(json_array_size(curve(o, "traffic", "host/h2d")), 40);
  json_t *mem = curve(o, "memory", "nvme");
  assert_int_equal(json_array_size(mem), 40);
  assert_float_equal(json_number_value(json_array_get(mem, 39)), 40.0 / 1024, 1e-12);
  json_decref(o);
  free(out);
  free(cmd);
  free(metrics);
  tz_test_rmdir(dir);
}

static void test_plots(void **state) {
  (void)state;
  if (!have_matplotlib)
    skip(); /* main said why */
  char *dir = tz_test_mkdtemp("plot");
  char *metrics = NULL, *cmd = NULL, *out = NULL;
  assert_true(asprintf(&metrics, "%s/metrics.jsonl", dir) > 0);
  write_metrics(metrics, 40);
  assert_true(asprintf(&cmd, "'%s' '%s' '%s' --out '%s/png' --prefix run1-", python, script,
                       metrics, dir) > 0);
  int rc = run(cmd, &out);
  if (rc != 0)
    print_error("%s -> %d:\n%s\n", cmd, rc, out);
  assert_int_equal(rc, 0);
  /* The script names what it wrote. */
  assert_non_null(strstr(out, "run1-loss.png"));
  free(out);
  free(cmd);
  char *png = NULL;
  assert_true(asprintf(&png, "%s/png", dir) > 0);
  check_png(png, "run1-loss.png");
  check_png(png, "run1-throughput.png");
  check_png(png, "run1-training.png");
  check_png(png, "run1-traffic.png");
  check_png(png, "run1-memory.png");
  free(png);
  free(metrics);
  tz_test_rmdir(dir);
}

static void test_bad_input(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("plot");
  char *metrics = NULL, *cmd = NULL, *out = NULL;
  assert_true(asprintf(&metrics, "%s/bad.jsonl", dir) > 0);
  FILE *f = fopen(metrics, "w");
  fputs("{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"loss\": \n", f);
  fclose(f);
  assert_true(asprintf(&cmd, "'%s' '%s' '%s' --out '%s'", python, script, metrics, dir) > 0);
  assert_int_equal(run(cmd, &out), 1);
  char *want = NULL;
  assert_true(asprintf(&want, "%s:2: not JSON", metrics) > 0);
  if (!strstr(out, want))
    print_error("output lacks \"%s\":\n%s\n", want, out);
  assert_non_null(strstr(out, want));
  free(want);
  free(out);
  free(cmd);

  /* Without matplotlib: a message that says how to get it, exit status 2. */
  assert_true(asprintf(&cmd,
                       "'%s' -c \"import sys, runpy; sys.modules['matplotlib'] = None; "
                       "sys.argv = ['plot_metrics.py', '%s', '--out', '%s']; "
                       "runpy.run_path('%s', run_name='__main__')\"",
                       python, metrics, dir, script) > 0);
  f = fopen(metrics, "w");
  fputs("{\"step\": 1, \"loss\": 2.0}\n", f);
  fclose(f);
  assert_int_equal(run(cmd, &out), 2);
  assert_non_null(strstr(out, "matplotlib is not installed"));
  free(out);
  free(cmd);
  free(metrics);
  tz_test_rmdir(dir);
}

int main(void) {
  const char *data = getenv("TZ_TEST_DATA");
  if (asprintf(&script, "%s/../../tools/plot_metrics.py", data ? data : "tests/data") < 0)
    return 1;
  struct stat st;
  if (stat(script, &st) != 0)
    tz_test_skip("%s not found (TZ_TEST_DATA should be the source tree's tests/data)", script);
  /* The first python3 that has matplotlib, the one on PATH, then the system's; else any python3,
   * for what needs no matplotlib. */
  static const char *const candidates[] = {"python3", "/usr/bin/python3"};
  for (int need = 1; need >= 0 && !python; need--)
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !python; i++) {
      char *cmd = NULL;
      if (asprintf(&cmd, "%s -c '%s' >/dev/null 2>&1", candidates[i],
                   need ? "import matplotlib" : "import json") < 0)
        return 1;
      if (system(cmd) == 0) {
        python = candidates[i];
        have_matplotlib = need;
      }
      free(cmd);
    }
  if (!python)
    tz_test_skip("no python3");
  if (!have_matplotlib)
    fprintf(stderr, "test_plot_metrics: no python3 with matplotlib: the images are not drawn "
                    "(pip install matplotlib, or apt-get install python3-matplotlib)\n");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_series),
      cmocka_unit_test(test_plots),
      cmocka_unit_test(test_bad_input),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  free(script);
  return rc;
}
