/* tools/tz-tensorboard on a metrics file written by the metrics writer: the event file it writes
 * is read back here, independently of the tool: every record's length and data carry TFRecord's
 * masked CRC-32C, the first event holds file_version "brain.Event:2", and each step's event holds
 * the step's loss, learning rate and bytes per tier and lane as scalars, at that step. With the
 * tensorboard package installed, its own reader reads the same scalars; without it that case is
 * skipped (it says so). Skipped without python3. */
#define _GNU_SOURCE
#include "testlib.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "core/error.h"
#include "trainer/metrics.h"
#include "util/crc32c.h"

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

static uint32_t masked(const void *p, size_t n) {
  uint32_t c = tz_crc32c(0, p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* A protocol-buffer reader over [p, end). */
struct pb {
  const unsigned char *p, *end;
};

static uint64_t varint(struct pb *b) {
  uint64_t v = 0;
  for (int shift = 0; b->p < b->end && shift < 64; shift += 7) {
    unsigned char c = *b->p++;
    v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80))
      return v;
  }
  fail_msg("truncated varint");
  return 0;
}

/* What one event holds that the checks look at. */
struct ev {
  int has_step;
  int64_t step;
  double wall;
  char version[32];
  int n;
  char tag[32][40];
  float value[32];
};

static void parse_value(struct pb b, struct ev *e) {
  assert_true(e->n < 32);
  while (b.p < b.end) {
    uint64_t key = varint(&b);
    if (key == (1 << 3 | 2)) {
      uint64_t len = varint(&b);
      assert_true(len < sizeof e->tag[0] && len <= (uint64_t)(b.end - b.p));
      memcpy(e->tag[e->n], b.p, len);
      e->tag[e->n][len] = 0;
      b.p += len;
    } else if (key == (2 << 3 | 5)) {
      memcpy(&e->value[e->n], b.p, 4);
      b.p += 4;
    } else {
      fail_msg("unexpected field %llu in a Value", (unsigned long long)key);
    }
  }
  e->n++;
}

static void parse_event(const unsigned char *p, size_t n, struct ev *e) {
  memset(e, 0, sizeof *e);
  struct pb b = {p, p + n};
  while (b.p < b.end) {
    uint64_t key = varint(&b);
    if (key == (1 << 3 | 1)) {
      memcpy(&e->wall, b.p, 8);
      b.p += 8;
    } else if (key == (2 << 3 | 0)) {
      e->has_step = 1;
      e->step = (int64_t)varint(&b);
    } else if (key == (3 << 3 | 2) || key == (5 << 3 | 2)) {
      uint64_t len = varint(&b);
      assert_true(len <= (uint64_t)(b.end - b.p));
      if (key == (3 << 3 | 2)) {
        assert_true(len < sizeof e->version);
        memcpy(e->version, b.p, len);
      } else {
        struct pb s = {b.p, b.p + len};
        while (s.p < s.end) {
          assert_int_equal(varint(&s), 1 << 3 | 2);
          uint64_t vl = varint(&s);
          assert_true(vl <= (uint64_t)(s.end - s.p));
          parse_value((struct pb){s.p, s.p + vl}, e);
          s.p += vl;
        }
      }
      b.p += len;
    } else {
      fail_msg("unexpected field %llu in an Event", (unsigned long long)key);
    }
  }
}

static float scalar(const struct ev *e, const char *tag) {
  for (int i = 0; i < e->n; i++)
    if (strcmp(e->tag[i], tag) == 0)
      return e->value[i];
  print_error("step %lld has no scalar %s\n", (long long)e->step, tag);
  fail();
  return 0;
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
  FILE *f = fopen(events, "rb");
  assert_non_null(f);
  int n = 0;
  unsigned char head[12];
  while (fread(head, 1, 12, f) == 12) {
    uint64_t len;
    uint32_t crc;
    memcpy(&len, head, 8);
    memcpy(&crc, head + 8, 4);
    assert_int_equal(crc, masked(head, 8));
    assert_true(len < 1 << 20);
    unsigned char *data = malloc(len + 4);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, len + 4, f), len + 4);
    memcpy(&crc, data + len, 4);
    assert_int_equal(crc, masked(data, len));
    struct ev e;
    parse_event(data, len, &e);
    free(data);
    if (n == 0) {
      assert_string_equal(e.version, "brain.Event:2");
      assert_false(e.has_step);
    } else {
      assert_true(e.has_step);
      assert_int_equal(e.step, n);
      assert_true(e.wall > 0);
      assert_float_equal(scalar(&e, "train/loss"), (float)loss_of(n), 0);
      assert_float_equal(scalar(&e, "train/lr"), (float)(1e-3 * n), 0);
      assert_float_equal(scalar(&e, "bytes/nvme/read"), (float)read_of(n), 0);
    }
    n++;
  }
  assert_true(feof(f));
  fclose(f);
  assert_int_equal(n, STEPS + 1);
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
