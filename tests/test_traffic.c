/* Tier traffic in the metrics (issue #27 item 9): a run of the tiny model whose parameters and
 * optimizer state live on NVMe moves bytes through the nvme tier every step, and each step's
 * `bytes` are the change of the tiers' I/O counters (core/tier.h tz_tier_io_stats) since the
 * previous step's figures; the summary's are the change over the whole run; the metrics file
 * holds the same numbers, a `memory` object per step, and the resolved configuration in its first
 * line. */
#define _GNU_SOURCE
#include "collectives/launch.h"
#include "core/error.h"
#include "run_once.h"
#include "testlib.h"
#include "trainer/run/metrics.h"
#include "trainer/run/run.h"
#include "trainer/step/train_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;

#define MAX_STEPS 8

/* The counters of the trainer's nvme, host and compute tiers, read in the event callback. */
struct counts {
  uint64_t nvme_read, nvme_write, host_read, host_write, compute_read, compute_write;
};

struct rec {
  int n_steps;
  struct counts begin, at_step[MAX_STEPS], at_summary;
  uint64_t step_nvme_read[MAX_STEPS], step_nvme_write[MAX_STEPS], step_compute_write[MAX_STEPS];
  int step_has_memory[MAX_STEPS];
  uint64_t sum_nvme_read, sum_nvme_write;
  int summary_seen;
};

static void take(const tz_trainer *tr, struct counts *c) {
  struct tz_tier_io_stats st;
  memset(c, 0, sizeof *c);
  if (tr->t_nvme) {
    tz_tier_io_stats(tr->t_nvme, &st);
    c->nvme_read = st.bytes_read;
    c->nvme_write = st.bytes_written;
  }
  if (tr->t_host) {
    tz_tier_io_stats(tr->t_host, &st);
    c->host_read = st.bytes_read;
    c->host_write = st.bytes_written;
  }
  tz_tier_io_stats(tr->t_compute, &st);
  c->compute_read = st.bytes_read;
  c->compute_write = st.bytes_written;
}

static uint64_t lane_bytes(const struct tz_traffic *t, int n, const char *tier, const char *lane) {
  for (int i = 0; i < n; i++)
    if (strcmp(t[i].tier, tier) == 0 && strcmp(t[i].lane, lane) == 0)
      return t[i].bytes;
  return UINT64_MAX; /* absent */
}

static int record(void *arg, const struct tz_run_event *ev) {
  struct rec *r = arg;
  if (ev->kind == TZ_RUN_BEGIN)
    take(ev->trainer, &r->begin);
  if (ev->kind == TZ_RUN_STEP && r->n_steps < MAX_STEPS) {
    const struct tz_step_metrics *m = ev->metrics;
    int i = r->n_steps++;
    take(ev->trainer, &r->at_step[i]);
    r->step_nvme_read[i] = lane_bytes(m->traffic, m->n_traffic, "nvme", "read");
    r->step_nvme_write[i] = lane_bytes(m->traffic, m->n_traffic, "nvme", "write");
    r->step_compute_write[i] = lane_bytes(m->traffic, m->n_traffic, "compute", "write");
    r->step_has_memory[i] = m->n_memory;
  }
  if (ev->kind == TZ_RUN_SUMMARY) {
    r->summary_seen = 1;
    take(ev->trainer, &r->at_summary);
    r->sum_nvme_read = lane_bytes(ev->summary->traffic, ev->summary->n_traffic, "nvme", "read");
    r->sum_nvme_write = lane_bytes(ev->summary->traffic, ev->summary->n_traffic, "nvme", "write");
  }
  return 0;
}

static int run_nvme(int64_t steps, const char *metrics, struct rec *r) {
  memset(r, 0, sizeof *r);
  struct tz_run_options o;
  tz_run_options_init(&o);
  o.model = "tiny";
  o.data = "synthetic";
  o.seq = 16;
  o.steps = steps;
  o.metrics = metrics;
  o.on_event = record;
  o.arg = r;
  char path_set[1100], rates[1100];
  snprintf(path_set, sizeof path_set, "tierzero.nvme_path=%s", dir);
  snprintf(rates, sizeof rates, "%s/rates.json", dir);
  o.rates = rates;
  const char *sets[] = {"train_micro_batch_size_per_gpu=2",
                        "gradient_accumulation_steps=1",
                        "zero_optimization.offload_param.device=nvme",
                        "zero_optimization.offload_optimizer.device=nvme",
                        "gradient_clipping=1",
                        path_set};
  struct tz_run_result res;
  int rc = tz_test_run_once(&o, sets, 6, &res);
  return rc;
}

/* Each step's nvme bytes are nonzero (the state homed there is read and written back every step)
 * and equal to the counters' change since the previous step; the summary's to the change over the
 * run. */
static void test_step_bytes_are_counter_deltas(void **state) {
  (void)state;
  struct rec r;
  int rc = run_nvme(4, NULL, &r);
  if (rc != 0)
    print_error("%s\n", tz_err_msg());
  assert_int_equal(rc, 0);
  assert_int_equal(r.n_steps, 4);
  const struct counts *prev = &r.begin;
  uint64_t sum_r = 0, sum_w = 0;
  for (int i = 0; i < r.n_steps; i++) {
    assert_true(r.step_nvme_read[i] != UINT64_MAX);
    assert_true(r.step_nvme_write[i] != UINT64_MAX);
    assert_true(r.step_nvme_read[i] > 0);
    assert_true(r.step_nvme_write[i] > 0);
    assert_int_equal(r.step_nvme_read[i], r.at_step[i].nvme_read - prev->nvme_read);
    assert_int_equal(r.step_nvme_write[i], r.at_step[i].nvme_write - prev->nvme_write);
    assert_int_equal(r.step_compute_write[i], r.at_step[i].compute_write - prev->compute_write);
    assert_true(r.step_has_memory[i] >= 2);
    sum_r += r.step_nvme_read[i];
    sum_w += r.step_nvme_write[i];
    prev = &r.at_step[i];
  }
  assert_true(r.summary_seen);
  assert_int_equal(r.sum_nvme_read, r.at_summary.nvme_read - r.begin.nvme_read);
  assert_int_equal(r.sum_nvme_write, r.at_summary.nvme_write - r.begin.nvme_write);
  assert_true(r.sum_nvme_read >= sum_r);
  assert_true(r.sum_nvme_write >= sum_w);
}

/* The metrics file: a configuration line first, then one line per step whose bytes are the
 * step's figures, with the memory of each tier. */
static void test_metrics_file(void **state) {
  (void)state;
  char path[1100];
  snprintf(path, sizeof path, "%s/m.jsonl", dir);
  struct rec r;
  int rc = run_nvme(3, path, &r);
  if (rc != 0)
    print_error("%s\n", tz_err_msg());
  assert_int_equal(rc, 0);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[1 << 16];
  int n = 0, steps = 0;
  while (fgets(line, sizeof line, f)) {
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    assert_non_null(o);
    if (n == 0) {
      json_t *c = json_object_get(o, "config");
      assert_true(json_is_object(c));
      assert_string_equal(
          json_string_value(json_object_get(
              json_object_get(json_object_get(c, "zero_optimization"), "offload_param"), "device")),
          "nvme");
      assert_int_equal(json_integer_value(json_object_get(o, "start_step")), 0);
    } else if (json_object_get(o, "step")) {
      json_t *b = json_object_get(json_object_get(o, "bytes"), "nvme");
      assert_true(json_is_object(b));
      assert_int_equal(json_integer_value(json_object_get(b, "read")), r.step_nvme_read[steps]);
      assert_int_equal(json_integer_value(json_object_get(b, "write")), r.step_nvme_write[steps]);
      json_t *mem = json_object_get(json_object_get(o, "memory"), "nvme");
      assert_true(json_integer_value(json_object_get(mem, "used")) > 0);
      assert_true(json_integer_value(json_object_get(mem, "capacity")) >=
                  json_integer_value(json_object_get(mem, "used")));
      steps++;
    } else {
      assert_true(json_is_true(json_object_get(o, "summary")));
      json_t *b = json_object_get(json_object_get(o, "bytes"), "nvme");
      assert_int_equal(json_integer_value(json_object_get(b, "read")), r.sum_nvme_read);
    }
    json_decref(o);
    n++;
  }
  fclose(f);
  assert_int_equal(steps, 3);
}

int main(void) {
  dir = tz_test_mkdtemp("traffic");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step_bytes_are_counter_deltas),
      cmocka_unit_test(test_metrics_file),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
