/* tools/tz-tensorboard on a metrics file written by the metrics writer: the event file it writes
 * is read back here, independently of the tool: every record's length and data carry TFRecord's
 * masked CRC-32C, the first event holds file_version "brain.Event:2", and each step's event holds
 * the step's loss, learning rate and bytes per tier and lane as scalars, at that step. With the
 * tensorboard package installed, its own reader reads the same scalars; without it that case is
 * skipped (it says so). Skipped without python3. */
#define _GNU_SOURCE
#include "testlib.h"
#include "tfevents.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "core/error.h"
#include "trainer/run/metrics.h"

static char *tool, *dir, *metrics, *events;

#define STEPS 6

static double loss_of(int s) { return 4.0 - 0.25 * s; }
static uint64_t read_of(int s) { return 1000000ull * (uint64_t)s; }

static void write_metrics(const char *path) {
  tz_metrics_writer *w = NULL;
  TZ_ASSERT_OK(tz_metrics_writer_create(path, 0, &w));
  struct tz_config cfg;
  tz_config_defaults(&cfg);
  TZ_ASSERT_OK(tz_metrics_write_config(w, &cfg, 0));
  tz_config_free(&cfg);
  for (int s = 1; s <= STEPS; s++) {
    struct tz_step_metrics m;
    tz_step_metrics_init(&m);
    m.step = s;
    m.loss = loss_of(s);
    m.lr = 1e-3 * s;
    m.grad_norm = 0.5;
    m.tokens = 1024;
    m.step_s = 0.5;
    m.elapsed_s = 0.5 * s;
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "nvme", "read", read_of(s)));
    tz_metrics_derive(&m, 1e6, 0);
    TZ_ASSERT_OK(tz_metrics_write_step(w, &m));
  }
  tz_metrics_writer_destroy(w);
}

static void run_tool(void) {
  char *cmd = NULL, *logdir = NULL;
  assert_true(asprintf(&logdir, "%s/tb", dir) > 0);
  assert_true(asprintf(&cmd, "python3 '%s' '%s' --logdir '%s' > '%s/out' 2>&1", tool, metrics,
                       logdir, dir) > 0);
  int st = system(cmd);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  free(cmd);
  DIR *d = opendir(logdir);
  assert_non_null(d);
  struct dirent *de;
  while ((de = readdir(d)))
    if (strncmp(de->d_name, "events.out.tfevents.", 20) == 0) {
      free(events);
      assert_true(asprintf(&events, "%s/%s", logdir, de->d_name) > 0);
    }
  closedir(d);
  free(logdir);
  assert_non_null(events);
}

static void test_event_file(void **state) {
  (void)state;
  run_tool();
  struct tfev ev[STEPS + 2];
  int n = tfev_read(events, ev, STEPS + 2);
  assert_int_equal(n, STEPS + 1);
  assert_string_equal(ev[0].version, "brain.Event:2");
  assert_false(ev[0].has_step);
  for (int s = 1; s < n; s++) {
    const struct tfev *e = &ev[s];
    assert_true(e->has_step);
    assert_int_equal(e->step, s);
    assert_true(e->wall > 0);
    assert_float_equal(tfev_scalar(e, "train/loss"), (float)loss_of(s), 0);
    assert_float_equal(tfev_scalar(e, "train/lr"), (float)(1e-3 * s), 0);
    assert_float_equal(tfev_scalar(e, "bytes/nvme/read"), (float)read_of(s), 0);
  }
}

/* TensorBoard's own reader, where the package is installed. */
static void test_tensorboard_reads_it(void **state) {
  (void)state;
  if (system("python3 -c 'import tensorboard' >/dev/null 2>&1") != 0) {
    fprintf(stderr, "test_tensorboard: the tensorboard package is not installed (pip install "
                    "tensorboard): its reader is not tried\n");
    skip();
  }
  if (!events)
    run_tool();
  char *cmd = NULL;
  assert_true(
      asprintf(&cmd,
               "python3 -c \"from tensorboard.backend.event_processing.event_accumulator import "
               "EventAccumulator as A; a = A('%s'); a.Reload(); "
               "v = [e.value for e in a.Scalars('train/loss')]; "
               "assert len(v) == %d and abs(v[-1] - %g) < 1e-6, v\"",
               events, STEPS, loss_of(STEPS)) > 0);
  assert_int_equal(system(cmd), 0);
  free(cmd);
}

int main(void) {
  const char *data = getenv("TZ_TEST_DATA");
  if (asprintf(&tool, "%s/../../tools/tz-tensorboard", data ? data : "tests/data") < 0)
    return 1;
  struct stat st;
  if (stat(tool, &st) != 0)
    tz_test_skip("%s not found (TZ_TEST_DATA should be the source tree's tests/data)", tool);
  if (system("python3 -c 'import json' >/dev/null 2>&1") != 0)
    tz_test_skip("no python3");
  dir = tz_test_mkdtemp("tensorboard");
  if (asprintf(&metrics, "%s/m.jsonl", dir) < 0)
    return 1;
  write_metrics(metrics);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_event_file),
      cmocka_unit_test(test_tensorboard_reads_it),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  free(metrics);
  free(events);
  free(tool);
  return rc;
}
