/* The disk's figures in the metrics (issue 26, item 3; docs/data.md, "The disk's rates"):
 *  - the nvme tier tells the time it had transfers in flight (tz_tier_io_stats' busy_ns): more
 *    than 0 and no more than the wall time of the I/O, for many requests and for one; a memory
 *    tier cannot tell; a step's disk figures are the nvme tier's bytes read, written and busy
 *    time since the last figures, and a run without that tier has none;
 *  - a run of the tiny model with its optimizer state (fp32 master, m, v) on the nvme tier:
 *    every step's nvme_read_bytes and nvme_write_bytes are the nvme tier's counters' change in
 *    the step, the run reads the state homed there (the nvme arena's used bytes) once and writes
 *    it once per step, the rates are the bytes over the step's wall time and over the busy time,
 *    the busy time fits in the run's, and the summary line and the summary object give the timed
 *    steps' figures;
 *  - the same run with the optimizer state on the host has no nvme_* key and no disk line;
 *  - the summary's disk figures leave out the first step, as its other rates do;
 *  - a run under its bound whose disk moved faster than the cached probe's rate keeps the
 *    cache's entry with the disk's rate (nvme_run, the summary's disk_rate) for the next plan,
 *    where one whose disk is not faster drops the entry (trainer/run/run.c, summarize).
 * Skipped (77) where the nvme tier cannot run (no io_uring). */
#define _GNU_SOURCE
#include "collectives/launch.h"
#include "core/error.h"
#include "core/runtime.h"
#include "run_once.h"
#include "testlib.h"
#include "trainer/run/metrics.h"
#include "trainer/run/run.h"
#include "trainer/step/rates_cache.h"
#include "trainer/step/train_internal.h"
#include "util/clock.h"
#include "util/size.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *dir;
/* The runs' backend, the rates cache's key's first part. */
#define BACKEND "cpu"

#define MAX_STEPS 8

static void test_nvme_tier_tells_busy_time(void **state) {
  (void)state;
  tz_runtime *rt;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt));
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.capacity = 16 << 20;
  p.paths[0] = dir;
  p.n_paths = 1;
  p.name = "nvme";
  tz_tier *t;
  TZ_ASSERT_OK(tz_tier_create(rt, "nvme", &p, &t));
  struct tz_tier_io_stats st;
  tz_tier_io_stats(t, &st);
  assert_int_equal(st.has_busy, 1);
  assert_int_equal(st.busy_ns, 0); /* nothing moved yet */
  tz_extent e;
  TZ_ASSERT_OK(tz_tier_alloc(t, 16 << 20, &e));
  unsigned char *buf = aligned_alloc(4096, 16 << 20);
  assert_non_null(buf);
  memset(buf, 0x5a, 16 << 20);
  uint64_t t0 = tz_now_ns();
  TZ_ASSERT_OK(tz_tier_write_sync(&e, 0, buf, 16 << 20));
  TZ_ASSERT_OK(tz_tier_read_sync(&e, 0, buf, 16 << 20));
  uint64_t wall = tz_now_ns() - t0;
  tz_tier_io_stats(t, &st);
  assert_true(st.busy_ns > 0);
  assert_true(st.busy_ns <= wall);
  /* Idle, the busy time stays where it was. */
  uint64_t b = st.busy_ns;
  usleep(20000);
  tz_tier_io_stats(t, &st);
  assert_int_equal(st.busy_ns, b);
  /* One request alone (one stripe): its period opens and closes too. */
  t0 = tz_now_ns();
  TZ_ASSERT_OK(tz_tier_write_sync(&e, 0, buf, 1 << 20));
  wall = tz_now_ns() - t0;
  tz_tier_io_stats(t, &st);
  assert_true(st.busy_ns > b && st.busy_ns - b <= wall);
  tz_tier *h;
  tz_tier_params_init(&p);
  p.name = "host";
  p.capacity = 1 << 20;
  TZ_ASSERT_OK(tz_tier_create(rt, "host", &p, &h));
  tz_tier_io_stats(h, &st);
  assert_int_equal(st.has_busy, 0);
  assert_int_equal(st.busy_ns, 0);
  /* A step's figures from the tiers: the disk's are the nvme tier's, reads and writes apart. */
  tz_tier *tiers[2] = {h, t};
  struct tz_traffic_counters last;
  tz_metrics_counters_take(tiers, 2, &last);
  tz_tier_io_stats(t, &st);
  b = st.busy_ns;
  t0 = tz_now_ns();
  TZ_ASSERT_OK(tz_tier_write_sync(&e, 0, buf, 8 << 20));
  TZ_ASSERT_OK(tz_tier_read_sync(&e, 0, buf, 4 << 20));
  wall = tz_now_ns() - t0;
  struct tz_step_metrics m;
  tz_step_metrics_init(&m);
  TZ_ASSERT_OK(tz_metrics_step_traffic(&m, tiers, 2, &last));
  assert_int_equal(m.has_disk, 1);
  assert_int_equal(m.disk.read, 4 << 20);
  assert_int_equal(m.disk.written, 8 << 20);
  assert_true(m.disk.busy_s > 0 && m.disk.busy_s <= 1e-9 * (double)wall);
  /* Without the nvme tier among them, no disk. */
  tz_step_metrics_init(&m);
  TZ_ASSERT_OK(tz_metrics_step_traffic(&m, tiers, 1, &last));
  assert_int_equal(m.has_disk, 0);
  free(buf);
  tz_tier_free(&e);
  tz_runtime_destroy(rt);
}

/* What a run told, read in the event callback. */
struct rec {
  int n_steps;
  double t_begin, t_summary; /* tz_now_s at the events */
  uint64_t nvme_read0, nvme_write0;
  uint64_t step_read[MAX_STEPS], step_write[MAX_STEPS]; /* the counters' change in the step */
  int has_disk[MAX_STEPS];
  struct tz_disk_traffic disk[MAX_STEPS];
  double step_s[MAX_STEPS];
  uint64_t nvme_used; /* the nvme arena's used bytes: the state homed there */
  int sum_has_disk;
  struct tz_disk_traffic sum_disk;
  int64_t sum_timed_steps;
  double sum_timed_s;
  char summary[4096];         /* tz_metrics_summary_print's text */
  double disk_rate;           /* the summary event's */
  int below_bound;            /* the summary's steps under their bound */
  struct tz_plan_rates rates; /* the rates the run planned with */
};

static void nvme_counts(const tz_trainer *tr, uint64_t *r, uint64_t *w) {
  *r = *w = 0;
  if (!tr->t_nvme)
    return;
  struct tz_tier_io_stats st;
  tz_tier_io_stats(tr->t_nvme, &st);
  *r = st.bytes_read;
  *w = st.bytes_written;
}

static int record(void *arg, const struct tz_run_event *ev) {
  struct rec *r = arg;
  if (ev->kind == TZ_RUN_BEGIN) {
    r->t_begin = tz_now_s();
    nvme_counts(ev->trainer, &r->nvme_read0, &r->nvme_write0);
  }
  if (ev->kind == TZ_RUN_STEP && r->n_steps < MAX_STEPS) {
    const struct tz_step_metrics *m = ev->metrics;
    int i = r->n_steps++;
    uint64_t rd, wr;
    nvme_counts(ev->trainer, &rd, &wr);
    r->step_read[i] = rd - r->nvme_read0;
    r->step_write[i] = wr - r->nvme_write0;
    r->nvme_read0 = rd;
    r->nvme_write0 = wr;
    r->has_disk[i] = m->has_disk;
    r->disk[i] = m->disk;
    r->step_s[i] = m->step_s;
    for (int k = 0; k < m->n_memory; k++)
      if (strcmp(m->memory[k].tier, "nvme") == 0)
        r->nvme_used = m->memory[k].used;
  }
  if (ev->kind == TZ_RUN_SUMMARY) {
    r->t_summary = tz_now_s();
    r->sum_has_disk = ev->summary->has_disk;
    r->sum_disk = ev->summary->timed_disk;
    r->sum_timed_steps = ev->summary->timed_steps;
    r->sum_timed_s = ev->summary->timed_s;
    r->disk_rate = ev->disk_rate;
    r->below_bound = tz_metrics_summary_below_bound(ev->summary);
    r->rates = *ev->rates;
    FILE *f = fmemopen(r->summary, sizeof r->summary - 1, "w");
    assert_non_null(f);
    tz_metrics_summary_print(ev->summary, f);
    fclose(f);
  }
  return 0;
}

/* The tiny model, optimizer state on opt_dev ("nvme" or "cpu"), parameters on the host. */
static int run(const char *opt_dev, int64_t steps, const char *metrics, struct rec *r) {
  memset(r, 0, sizeof *r);
  struct tz_run_options o;
  tz_run_options_init(&o);
  o.backend = BACKEND;
  o.model = "tiny";
  o.data = "synthetic";
  o.seq = 16;
  o.steps = steps;
  o.metrics = metrics;
  o.on_event = record;
  o.arg = r;
  char path_set[1100], rates[1100], opt_set[128];
  snprintf(path_set, sizeof path_set, "tierzero.nvme_path=%s", dir);
  snprintf(rates, sizeof rates, "%s/rates.json", dir);
  snprintf(opt_set, sizeof opt_set, "zero_optimization.offload_optimizer.device=%s", opt_dev);
  o.rates = rates;
  const char *sets[] = {"train_micro_batch_size_per_gpu=2",
                        "gradient_accumulation_steps=1",
                        "zero_optimization.offload_param.device=cpu",
                        opt_set,
                        "gradient_clipping=1",
                        path_set};
  struct tz_run_result res;
  int rc = tz_test_run_once(&o, sets, 6, &res);
  if (rc != 0)
    print_error("%s\n", tz_err_msg());
  return rc;
}

/* The metrics file's lines: steps into st[] (*n_st of them), the summary into *sum. */
static void read_metrics(const char *path, json_t **st, int *n_st, json_t **sum) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[1 << 16];
  *n_st = 0;
  *sum = NULL;
  while (fgets(line, sizeof line, f)) {
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    assert_non_null(o);
    if (json_is_true(json_object_get(o, "summary")))
      *sum = o;
    else if (json_object_get(o, "step") && *n_st < MAX_STEPS)
      st[(*n_st)++] = o;
    else
      json_decref(o);
  }
  fclose(f);
}

static uint64_t int_key(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v))
    print_error("no integer %s\n", key);
  assert_true(json_is_integer(v));
  return (uint64_t)json_integer_value(v);
}

static double real_key(const json_t *o, const char *key) {
  json_t *v = json_object_get(o, key);
  if (!json_is_number(v))
    print_error("no number %s\n", key);
  assert_true(json_is_number(v));
  return json_number_value(v);
}

static void test_optimizer_on_nvme(void **state) {
  (void)state;
  char path[1100];
  snprintf(path, sizeof path, "%s/nvme.jsonl", dir);
  struct rec r;
  enum { STEPS = 4 };
  assert_int_equal(run("nvme", STEPS, path, &r), 0);
  assert_int_equal(r.n_steps, STEPS);
  /* master, m and v of every parameter: 12 bytes each, a multiple of the tier's 4 KiB. */
  assert_true(r.nvme_used > 0);
  uint64_t sum_r = 0, sum_w = 0;
  double busy = 0;
  for (int i = 0; i < STEPS; i++) {
    assert_int_equal(r.has_disk[i], 1);
    assert_int_equal(r.disk[i].read, r.step_read[i]);
    assert_int_equal(r.disk[i].written, r.step_write[i]);
    assert_true(r.disk[i].read > 0 && r.disk[i].written > 0);
    assert_true(r.disk[i].busy_s > 0);
    sum_r += r.disk[i].read;
    sum_w += r.disk[i].written;
    busy += r.disk[i].busy_s;
  }
  /* The state homed on the disk is read once and written once a step: over the run (the last
   * step's write-backs reach the counters after its figures, so the sum of the steps is within
   * one step of it), and in the summary's traffic exactly. */
  assert_true(sum_r <= STEPS * r.nvme_used && sum_r + r.nvme_used >= STEPS * r.nvme_used);
  assert_true(sum_w <= STEPS * r.nvme_used && sum_w + r.nvme_used >= STEPS * r.nvme_used);
  /* The busy time fits in the run: a unit wrong by a factor of 1000 would not. */
  assert_true(busy <= r.t_summary - r.t_begin);

  json_t *st[MAX_STEPS], *sum;
  int n;
  read_metrics(path, st, &n, &sum);
  assert_int_equal(n, STEPS);
  for (int i = 0; i < STEPS; i++) {
    uint64_t rd = int_key(st[i], "nvme_read_bytes"), wr = int_key(st[i], "nvme_write_bytes");
    assert_int_equal(rd, r.step_read[i]);
    assert_int_equal(wr, r.step_write[i]);
    json_t *b = json_object_get(json_object_get(st[i], "bytes"), "nvme");
    assert_int_equal(json_integer_value(json_object_get(b, "read")), rd);
    double step_s = real_key(st[i], "step_s"), busy_s = real_key(st[i], "nvme_busy_s");
    TZ_ASSERT_REL(real_key(st[i], "nvme_read_gbs"), (double)rd / step_s / 1e9, 1e-8);
    TZ_ASSERT_REL(real_key(st[i], "nvme_write_gbs"), (double)wr / step_s / 1e9, 1e-8);
    TZ_ASSERT_REL(real_key(st[i], "nvme_busy_read_gbs"), (double)rd / busy_s / 1e9, 1e-8);
    TZ_ASSERT_REL(real_key(st[i], "nvme_busy_write_gbs"), (double)wr / busy_s / 1e9, 1e-8);
    TZ_ASSERT_REL(real_key(st[i], "nvme_busy_share"), busy_s / step_s, 1e-8);
    TZ_ASSERT_REL(real_key(st[i], "nvme_read_share"), (double)rd / (double)(rd + wr), 1e-8);
    TZ_ASSERT_REL(busy_s, r.disk[i].busy_s, 1e-8);
  }
  assert_non_null(sum);
  json_t *b = json_object_get(json_object_get(sum, "bytes"), "nvme");
  assert_int_equal(json_integer_value(json_object_get(b, "read")), STEPS * r.nvme_used);
  assert_int_equal(json_integer_value(json_object_get(b, "write")), STEPS * r.nvme_used);
  /* The summary's disk keys: steps 2 to 4, the timed ones. */
  uint64_t tr = r.step_read[1] + r.step_read[2] + r.step_read[3];
  uint64_t tw = r.step_write[1] + r.step_write[2] + r.step_write[3];
  double ts = r.step_s[1] + r.step_s[2] + r.step_s[3];
  assert_int_equal(r.sum_timed_steps, 3);
  assert_int_equal(int_key(sum, "nvme_read_bytes"), tr);
  assert_int_equal(int_key(sum, "nvme_write_bytes"), tw);
  TZ_ASSERT_REL(real_key(sum, "nvme_read_gbs"), (double)tr / ts / 1e9, 1e-8);
  TZ_ASSERT_REL(real_key(sum, "nvme_write_gbs"), (double)tw / ts / 1e9, 1e-8);
  TZ_ASSERT_REL(real_key(sum, "nvme_busy_s"),
                r.disk[1].busy_s + r.disk[2].busy_s + r.disk[3].busy_s, 1e-8);
  for (int i = 0; i < n; i++)
    json_decref(st[i]);
  json_decref(sum);
  /* The printed summary's line, with the timed steps' bytes a step. */
  char want[128], a[32];
  tz_bytes_format(a, sizeof a, (double)tr / 3.0, &tz_bytes_si);
  snprintf(want, sizeof want, "  disk (nvme) read %s a step at ", a);
  if (!strstr(r.summary, want))
    print_error("no '%s' in:\n%s", want, r.summary);
  assert_non_null(strstr(r.summary, want));
  assert_non_null(strstr(r.summary, "while busy"));
}

static void test_no_nvme_no_disk_keys(void **state) {
  (void)state;
  char path[1100];
  snprintf(path, sizeof path, "%s/host.jsonl", dir);
  struct rec r;
  assert_int_equal(run("cpu", 3, path, &r), 0);
  assert_int_equal(r.n_steps, 3);
  for (int i = 0; i < 3; i++)
    assert_int_equal(r.has_disk[i], 0);
  assert_int_equal(r.sum_has_disk, 0);
  assert_null(strstr(r.summary, "disk"));
  json_t *st[MAX_STEPS], *sum;
  int n;
  read_metrics(path, st, &n, &sum);
  assert_int_equal(n, 3);
  assert_non_null(sum);
  for (int i = 0; i <= n; i++) {
    json_t *o = i < n ? st[i] : sum;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
      if (strncmp(key, "nvme", 4) == 0)
        print_error("key %s in a run without nvme\n", key);
      assert_false(strncmp(key, "nvme", 4) == 0);
    }
    json_decref(o);
  }
}

/* The summary's disk figures: the steps after the first, the busy time unknown (NaN) once a step
 * could not tell it. */
static void test_summary_leaves_out_first_step(void **state) {
  (void)state;
  struct tz_metrics_summary s;
  tz_metrics_summary_init(&s, 1e6, 0);
  for (int i = 1; i <= 3; i++) {
    struct tz_step_metrics m;
    tz_step_metrics_init(&m);
    m.step = i;
    m.tokens = 100;
    m.step_s = i == 1 ? 10.0 : 0.5;
    m.has_disk = 1;
    m.disk = (struct tz_disk_traffic){
        .read = i == 1 ? 7 : 3000000000ull, .written = i == 1 ? 7 : 1000000000ull, .busy_s = 0.25};
    tz_metrics_summary_add(&s, &m);
  }
  assert_int_equal(s.has_disk, 1);
  assert_int_equal(s.timed_disk.read, 6000000000ull);
  assert_int_equal(s.timed_disk.written, 2000000000ull);
  TZ_ASSERT_REL(s.timed_disk.busy_s, 0.5, 1e-12);
  struct tz_disk_rates dr;
  tz_disk_rates_of(&s.timed_disk, s.timed_s, &dr);
  TZ_ASSERT_REL(dr.read_gbs, 6.0, 1e-12);
  TZ_ASSERT_REL(dr.write_gbs, 2.0, 1e-12);
  TZ_ASSERT_REL(dr.busy_read_gbs, 12.0, 1e-12);
  TZ_ASSERT_REL(dr.busy_share, 0.5, 1e-12);
  TZ_ASSERT_REL(dr.read_share, 0.75, 1e-12);
  char text[2048] = "";
  FILE *f = fmemopen(text, sizeof text - 1, "w");
  tz_metrics_summary_print(&s, f);
  fclose(f);
  const char *want = "  disk (nvme) read 3.00 GB a step at 6.00 GB/s, write 1.00 GB at 2.00 GB/s "
                     "(read share 0.750); busy 50.0% of the step, at 12.00 GB/s read and 4.00 "
                     "GB/s write while busy\n";
  if (!strstr(text, want))
    print_error("no '%s' in:\n%s", want, text);
  assert_non_null(strstr(text, want));
  /* A step whose tier cannot tell its busy time: the run's is unknown, and not printed. */
  struct tz_step_metrics m;
  tz_step_metrics_init(&m);
  m.step = 4;
  m.step_s = 0.5;
  m.has_disk = 1;
  tz_metrics_summary_add(&s, &m);
  assert_true(isnan(s.timed_disk.busy_s));
  f = fmemopen(text, sizeof text - 1, "w");
  tz_metrics_summary_print(&s, f);
  fclose(f);
  assert_non_null(strstr(text, "(read share 0.750)\n"));
}

/* The rates cache's one entry of the set-ups with the disk in this directory (key "BACKEND|nvme:
 * DIR", not a layer's), or NULL; root's. */
static json_t *setup_entry(json_t *root) {
  char real[PATH_MAX], suffix[PATH_MAX + 8];
  assert_non_null(realpath(dir, real));
  snprintf(suffix, sizeof suffix, "|nvme:%s", real);
  const size_t n = strlen(suffix);
  const char *k;
  json_t *v, *found = NULL;
  json_object_foreach(root, k, v) {
    size_t len = strlen(k);
    if (json_is_object(v) && strncmp(k, "layer|", 6) != 0 && len > n &&
        strcmp(k + len - n, suffix) == 0) {
      assert_null(found);
      found = v;
    }
  }
  return found;
}

/* Sets the entry's disk rates to `rate` bytes a second (each way and at once) and its nvme_run to
 * `run` (0: none). */
static void set_disk_rates(const char *path, double rate, double run) {
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  assert_non_null(root);
  json_t *e = setup_entry(root);
  assert_non_null(e);
  json_object_set_new(e, "nvme_read", json_real(rate));
  json_object_set_new(e, "nvme_write", json_real(rate));
  json_object_set_new(e, "nvme_duplex", json_real(rate));
  json_object_set_new(e, "nvme_run", json_real(run));
  assert_int_equal(json_dump_file(root, path, 0), 0);
  json_decref(root);
}

/* The entry's nvme_run; -1 when the file has no entry for the set-up. */
static double nvme_run_of(const char *path) {
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  assert_non_null(root);
  json_t *e = setup_entry(root);
  double v = e ? json_number_value(json_object_get(e, "nvme_run")) : -1;
  json_decref(root);
  return v;
}

static void test_disk_rate_learned(void **state) {
  (void)state;
  char rates[1100];
  snprintf(rates, sizeof rates, "%s/rates.json", dir);
  struct rec r;
  enum { STEPS = 4 };
  assert_int_equal(run("nvme", STEPS, NULL, &r), 0); /* the probes' entry */
  assert_true(r.disk_rate > 0);
  assert_true(r.sum_disk.read + r.sum_disk.written >= (16u << 20));
  if (nvme_run_of(rates) == -1) {
    /* Probes that ran beside a loaded machine's other work can be slower than the run that
     * followed: the run, under its bound with its disk no faster, dropped the entry (run.c's
     * summarize). Put back the rates it planned with, for the runs below to change. */
    assert_int_equal(r.below_bound, 1);
    char real[PATH_MAX], key[PATH_MAX + 64];
    assert_non_null(realpath(dir, real));
    snprintf(key, sizeof key, "%s|nvme:%s", BACKEND, real);
    assert_int_equal(tz_rates_cache_write(rates, key, &r.rates), 0);
  }
  /* The probe at 100 KB/s: the disk term of the bound is hours, the run under it, its disk
   * faster: the entry is kept with the disk's rate. */
  set_disk_rates(rates, 1e5, 0);
  assert_int_equal(run("nvme", STEPS, NULL, &r), 0);
  assert_int_equal(r.below_bound, 1);
  assert_true(r.disk_rate > 1e5);
  assert_true(nvme_run_of(rates) == r.disk_rate);
  /* A run under its bound with its disk no faster than the rate the plan took (the run's rate
   * learned at 1e15 bytes a second beside the probe's): the entry is dropped, measured again. */
  set_disk_rates(rates, 1e5, 1e15);
  json_error_t err;
  json_t *root = json_load_file(rates, 0, &err);
  const char *k;
  json_t *v;
  json_object_foreach(setup_entry(root), k, v) { /* every other rate slow: the bound hours */
    if (strncmp(k, "nvme_", 5) != 0 && json_number_value(v) > 0)
      json_real_set(v, 1e3);
  }
  assert_int_equal(json_dump_file(root, rates, 0), 0);
  json_decref(root);
  assert_int_equal(run("nvme", STEPS, NULL, &r), 0);
  assert_int_equal(r.below_bound, 1);
  assert_true(nvme_run_of(rates) == -1);
}

int main(void) {
  char why[256];
  if (tz_tier_probe("nvme", why, sizeof why) < 0) {
    printf("skipped: the nvme tier cannot run here: %s\n", why);
    return 77;
  }
  dir = tz_test_mkdtemp("disk-rates");
  assert_non_null(dir);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_summary_leaves_out_first_step),
      cmocka_unit_test(test_nvme_tier_tells_busy_time),
      cmocka_unit_test(test_optimizer_on_nvme),
      cmocka_unit_test(test_no_nvme_no_disk_keys),
      cmocka_unit_test(test_disk_rate_learned),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
