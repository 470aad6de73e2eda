/* Measuring and caching the plan's machine rates (trainer/rates.h).
 *
 * The cache is one JSON object per machine: {"version": 1, "<set-up>": {rates...}, ...}, where
 * the set-up names what the rates depend on beside the machine (the compute backend and the NVMe
 * directory), so a run with another directory measures again and adds its entry. */
#define _GNU_SOURCE
#include "trainer/rates.h"
#include "core/error.h"
#include "core/log.h"
#include "core/tier.h"
#include "kernels/adam.h"
#include "kernels/compute.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROBE_BYTES (8u << 20)
#define REPS 5

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tz_rates_default_path(char *buf, size_t len) {
  char host[128] = "localhost";
  gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = 0;
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (xdg && *xdg)
    snprintf(buf, len, "%s/tierzero/rates-%s.json", xdg, host);
  else if (home && *home)
    snprintf(buf, len, "%s/.cache/tierzero/rates-%s.json", home, host);
  else
    return tz_err_set(TZ_ENOENT, "rates: neither XDG_CACHE_HOME nor HOME is set");
  return 0;
}

static const char *nvme_dir(const struct tz_config *c) {
  if (c->tierzero.nvme_path.n > 0)
    return c->tierzero.nvme_path.path[0];
  if (c->zero_optimization.offload_optimizer.nvme_path)
    return c->zero_optimization.offload_optimizer.nvme_path;
  return c->zero_optimization.offload_param.nvme_path;
}

static void setup_key(const struct tz_config *c, const char *backend, char *buf, size_t len) {
  const char *dir = nvme_dir(c);
  char real[PATH_MAX];
  if (dir && realpath(dir, real))
    dir = real;
  snprintf(buf, len, "%s|nvme:%s", backend, dir ? dir : "-");
}

static const char *const fields[] = {"flops",     "copy_in",    "copy_out", "copy_local",
                                     "nvme_read", "nvme_write", "adam"};
#define N_FIELDS 7

static double *field(struct tz_plan_rates *r, int i) {
  double *f[N_FIELDS] = {&r->flops,     &r->copy_in,    &r->copy_out, &r->copy_local,
                         &r->nvme_read, &r->nvme_write, &r->adam};
  return f[i];
}

static int cache_read(const char *path, const char *key, struct tz_plan_rates *out) {
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  if (!root)
    return 0;
  json_t *e = json_object_get(root, key);
  int ok = json_is_object(e) && json_integer_value(json_object_get(root, "version")) == 1;
  for (int i = 0; ok && i < N_FIELDS; i++) {
    json_t *v = json_object_get(e, fields[i]);
    ok = json_is_number(v) && json_number_value(v) >= 0;
    if (ok)
      *field(out, i) = json_number_value(v);
  }
  json_decref(root);
  return ok;
}

static int mkdirs(const char *path) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return tz_err_errno(errno, "rates: cannot create %s", buf);
      *p = '/';
    }
  return 0;
}

static int cache_write(const char *path, const char *key, const struct tz_plan_rates *r) {
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  if (!json_is_object(root)) {
    json_decref(root);
    root = json_object();
  }
  json_t *e = json_object();
  struct tz_plan_rates copy = *r;
  for (int i = 0; i < N_FIELDS; i++)
    json_object_set_new(e, fields[i], json_real(*field(&copy, i)));
  json_object_set_new(root, "version", json_integer(1));
  json_object_set_new(root, key, e);
  TZ_CHECK(mkdirs(path));
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  int rc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_SORT_KEYS);
  json_decref(root);
  if (rc != 0)
    return tz_err_set(TZ_EIO, "rates: cannot write %s", tmp);
  if (rename(tmp, path) < 0) {
    unlink(tmp);
    return tz_err_errno(errno, "rates: cannot rename %s to %s", tmp, path);
  }
  return 0;
}

/* Bytes per second of tz_transfer from src to dst, best of REPS. */
static int time_transfer(tz_runtime *rt, const tz_extent *dst, const tz_extent *src, double *out) {
  double best = 0;
  for (int i = 0; i < REPS; i++) {
    tz_fence *f = NULL;
    double t0 = now_s();
    TZ_CHECK(tz_transfer(rt, dst, 0, src, 0, PROBE_BYTES, &f));
    int rc = tz_fence_wait(f, -1);
    tz_fence_release(f);
    TZ_CHECK(rc);
    double t = now_s() - t0;
    if (i == 0 || t < best)
      best = t;
  }
  *out = best > 0 ? PROBE_BYTES / best : 0;
  return 0;
}

static int measure_tiers(const struct tz_config *c, tz_runtime *rt, struct tz_plan_rates *r) {
  tz_tier *a = NULL, *b = NULL, *n = NULL;
  tz_extent ea = {0}, ea2 = {0}, eb = {0}, en = {0};
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.capacity = 2 * PROBE_BYTES;
  p.name = "rates-host";
  int rc;
  TZ_CHECK_GOTO(tz_tier_create(rt, "host", &p, &a), rc, out);
  p.name = "rates-compute";
  TZ_CHECK_GOTO(tz_tier_create(rt, "host", &p, &b), rc, out);
  TZ_CHECK_GOTO(tz_tier_alloc(a, PROBE_BYTES, &ea), rc, out);
  TZ_CHECK_GOTO(tz_tier_alloc(a, PROBE_BYTES, &ea2), rc, out);
  TZ_CHECK_GOTO(tz_tier_alloc(b, PROBE_BYTES, &eb), rc, out);
  memset(tz_tier_host_ptr(a, ea.offset), 1, PROBE_BYTES);
  memset(tz_tier_host_ptr(b, eb.offset), 2, PROBE_BYTES);
  TZ_CHECK_GOTO(time_transfer(rt, &eb, &ea, &r->copy_in), rc, out);
  TZ_CHECK_GOTO(time_transfer(rt, &ea, &eb, &r->copy_out), rc, out);
  TZ_CHECK_GOTO(time_transfer(rt, &ea2, &ea, &r->copy_local), rc, out);
  const char *dir = nvme_dir(c);
  if (dir) {
    tz_tier_params_init(&p);
    p.name = "rates-nvme";
    p.capacity = PROBE_BYTES;
    p.paths[0] = dir;
    p.n_paths = 1;
    p.checksum = c->tierzero.nvme_checksum;
    p.buffered = c->tierzero.nvme_buffered;
    TZ_CHECK_GOTO(tz_tier_create(rt, "nvme", &p, &n), rc, out);
    TZ_CHECK_GOTO(tz_tier_alloc(n, PROBE_BYTES, &en), rc, out);
    TZ_CHECK_GOTO(time_transfer(rt, &en, &ea, &r->nvme_write), rc, out);
    TZ_CHECK_GOTO(time_transfer(rt, &ea, &en, &r->nvme_read), rc, out);
  }
out:
  tz_tier_free(&en);
  tz_tier_free(&ea);
  tz_tier_free(&ea2);
  tz_tier_free(&eb);
  tz_tier_destroy(n);
  tz_tier_destroy(b);
  tz_tier_destroy(a);
  return rc;
}

static int measure_compute(const char *backend, struct tz_plan_rates *r) {
  enum { M = 512 };
  tz_compute *cm = NULL;
  void *a = NULL, *b = NULL, *c = NULL;
  int rc;
  TZ_CHECK(tz_compute_create(backend, NULL, &cm));
  size_t bytes = (size_t)M * M * tz_dtype_size(tz_compute_dtype(cm));
  TZ_CHECK_GOTO(tz_compute_alloc(cm, bytes, &a), rc, out);
  TZ_CHECK_GOTO(tz_compute_alloc(cm, bytes, &b), rc, out);
  TZ_CHECK_GOTO(tz_compute_alloc(cm, bytes, &c), rc, out);
  TZ_CHECK_GOTO(tz_compute_fill(cm, tz_compute_dtype(cm), a, 0.5f, (size_t)M * M), rc, out);
  TZ_CHECK_GOTO(tz_compute_fill(cm, tz_compute_dtype(cm), b, 0.25f, (size_t)M * M), rc, out);
  double best = 0;
  for (int i = 0; i < REPS + 1; i++) {
    double t0 = now_s();
    TZ_CHECK_GOTO(
        tz_compute_matmul(cm, 0, 1, M, M, M, 1.0f, a, M, b, M, 0.0f, c, tz_compute_dtype(cm), M),
        rc, out);
    TZ_CHECK_GOTO(tz_compute_sync(cm), rc, out);
    double t = now_s() - t0;
    if (i > 0 && (best == 0 || t < best)) /* the first call chooses the algorithm */
      best = t;
  }
  r->flops = best > 0 ? 2.0 * M * M * M / best : 0;
out:
  tz_compute_free(cm, a);
  tz_compute_free(cm, b);
  tz_compute_free(cm, c);
  tz_compute_destroy(cm);
  return rc;
}

static int measure_adam(struct tz_plan_rates *r) {
  const size_t n = 1u << 20;
  float *buf = calloc(5 * n, sizeof(float));
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "rates: no memory for the Adam probe");
  struct tz_adam_params p = {.lr = 1e-3f,
                             .beta1 = 0.9f,
                             .beta2 = 0.999f,
                             .eps = 1e-8f,
                             .decoupled = 1,
                             .grad_scale = 1.0f};
  int rc = tz_adam_params_for_step(&p, 1);
  double best = 0;
  for (int i = 0; rc == 0 && i < REPS; i++) {
    double t0 = now_s();
    rc = tz_adam_cpu(&p, buf, buf + n, buf + 2 * n, buf + 3 * n, TZ_F32, buf + 4 * n, TZ_F32, n,
                     NULL);
    double t = now_s() - t0;
    if (i == 0 || t < best)
      best = t;
  }
  free(buf);
  r->adam = best > 0 ? (double)n / best : 0;
  return rc;
}

static int time_collective(tz_comm *comm, double *out) {
  int world = tz_comm_size(comm);
  *out = 0;
  if (world < 2)
    return 0;
  const size_t per = 1u << 20;
  char *buf = malloc(per * (size_t)world);
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "rates: no memory for the collective probe");
  memset(buf, 0, per * (size_t)world);
  char *mine = buf + per * (size_t)tz_comm_rank(comm);
  double best = 0;
  int rc = 0;
  for (int i = 0; rc == 0 && i < REPS; i++) {
    tz_fence *f = NULL;
    double t0 = now_s();
    rc = tz_comm_all_gather(comm, mine, buf, per, NULL, &f);
    if (rc == 0)
      rc = tz_fence_wait(f, -1);
    tz_fence_release(f);
    double t = now_s() - t0;
    if (i == 0 || t < best)
      best = t;
  }
  free(buf);
  /* Bus bandwidth as nccl-tests counts it: the gathered size over the time, times (P-1)/P. */
  if (rc == 0 && best > 0)
    *out = (double)per * world / best * (world - 1) / world;
  return rc < 0 ? rc : 0;
}

int tz_rates_get(const struct tz_config *cfg, const char *backend, tz_runtime *rt, tz_comm *comm,
                 const char *path, int refresh, struct tz_plan_rates *out) {
  memset(out, 0, sizeof *out);
  double v[N_FIELDS + 1] = {0};
  int rc0 = 0;
  if (tz_comm_rank(comm) == 0) {
    char def[PATH_MAX], key[PATH_MAX + 64];
    if (!path && tz_rates_default_path(def, sizeof def) == 0)
      path = def;
    setup_key(cfg, backend, key, sizeof key);
    int cached = !refresh && path && cache_read(path, key, out);
    int rc = 0;
    if (!cached) {
      rc = measure_tiers(cfg, rt, out);
      if (rc == 0)
        rc = measure_compute(backend, out);
      if (rc == 0)
        rc = measure_adam(out);
      if (rc == 0 && path && cache_write(path, key, out) < 0)
        TZ_WARN("%s (the rates are measured again next time)", tz_err_msg());
      if (rc == 0)
        TZ_INFO("rates: measured for %s%s%s", key, path ? ", cached in " : "", path ? path : "");
    }
    for (int i = 0; i < N_FIELDS; i++)
      v[i] = *field(out, i);
    v[N_FIELDS] = rc; /* the other ranks fail with rank 0 instead of waiting */
    rc0 = rc;
    if (tz_comm_size(comm) == 1)
      TZ_CHECK(rc);
  }
  if (tz_comm_size(comm) > 1) {
    tz_fence *f = NULL;
    TZ_CHECK(tz_comm_broadcast(comm, v, sizeof v, 0, NULL, &f));
    int rc = tz_fence_wait(f, -1);
    tz_fence_release(f);
    TZ_CHECK(rc);
    if (rc0 < 0)
      return rc0;
    if (v[N_FIELDS] < 0)
      return tz_err_set((int)v[N_FIELDS], "rates: rank 0 could not measure the machine's rates");
    for (int i = 0; i < N_FIELDS; i++)
      *field(out, i) = v[i];
  }
  return time_collective(comm, &out->collective);
}
