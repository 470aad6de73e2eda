/* The cache of the plan's machine rates (trainer/step/rates.h, trainer/step/rates_cache.h): one
 * JSON object per machine, {"version": 5, "<set-up>": {rates...}, ...}, where the set-up names what
 * the rates depend on beside the machine (the compute backend and the NVMe directory), so a run
 * with another directory measures again and adds its entry. */
#define _GNU_SOURCE
#include "trainer/step/rates_cache.h"
#include "trainer/step/machine.h"
#include "core/error.h"
#include "trainer/step/train_internal.h"
#include "util/file.h"
#include "util/input.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

void tz_rates_cache_key(const struct tz_config *c, const char *backend, char *buf, size_t len) {
  const char *dir = tz_machine_nvme_dir(c);
  char real[PATH_MAX];
  if (dir && realpath(dir, real))
    dir = real;
  snprintf(buf, len, "%s|nvme:%s", backend, dir ? dir : "-");
}

/* Entries of another version were measured another way and are measured again: 2 since
 * adam_home is timed on the home phases' threads with bf16 parameters written; 3 since the disk
 * is timed on 64 MiB, both directions at once too (nvme_duplex); 4 since each direction of the
 * host link is timed beside the other (copy_in_both, copy_out_both); 5 since the link's copies
 * are 256 MiB and the CPU's Adam beside them 64 Mi elements. */
#define RATES_VERSION 5

static const char *const fields[] = {
    "flops",         "copy_in",    "copy_out",       "copy_duplex",  "copy_in_both",
    "copy_out_both", "copy_local", "nvme_read",      "nvme_write",   "nvme_duplex",
    "adam",          "adam_home",  "adam_home_busy", "copy_in_adam", "copy_out_adam",
    "adam_home_run", "nvme_run"};
/* The fields every entry of this version has; the ones after them came later and are 0
 * (unknown) in an entry without them: the plan then runs without what they add. adam_home_run
 * and nvme_run are not measured by the probes but by a run (tz_rates_learn): a fresh entry has
 * none. */
#define N_REQUIRED 12

double *tz_rates_field(struct tz_plan_rates *r, int i) {
  double *f[TZ_RATES_N_FIELDS] = {
      &r->flops,         &r->copy_in,    &r->copy_out,       &r->copy_duplex,  &r->copy_in_both,
      &r->copy_out_both, &r->copy_local, &r->nvme_read,      &r->nvme_write,   &r->nvme_duplex,
      &r->adam,          &r->adam_home,  &r->adam_home_busy, &r->copy_in_adam, &r->copy_out_adam,
      &r->adam_home_run, &r->nvme_run};
  return f[i];
}

/* key's entry of a cache of this version, NULL for none. */
static json_t *entry_of(json_t *root, const char *key) {
  json_t *e = json_object_get(root, key);
  return json_is_object(e) && json_integer_value(json_object_get(root, "version")) == RATES_VERSION
             ? e
             : NULL;
}

int tz_rates_cache_read(const char *path, const char *key, struct tz_plan_rates *out) {
  json_error_t err;
  json_t *root = tz_input_json(path, 0, &err);
  if (!root)
    return 0;
  json_t *e = entry_of(root, key);
  int ok = e != NULL;
  /* All or nothing: an incomplete entry (one written before a field existed) leaves *out as it
   * was, so no stale value outlives the measurement that replaces it. */
  struct tz_plan_rates got = *out;
  for (int i = 0; ok && i < TZ_RATES_N_FIELDS; i++) {
    json_t *v = json_object_get(e, fields[i]);
    if (!v && i >= N_REQUIRED) {
      *tz_rates_field(&got, i) = 0;
      continue;
    }
    ok = json_is_number(v) && json_number_value(v) >= 0;
    if (ok)
      *tz_rates_field(&got, i) = json_number_value(v);
  }
  json_decref(root);
  if (ok)
    *out = got;
  return ok;
}

/* Writes root to path as the cache's text, durably like the other writers; the process id in
 * the temporary name keeps ranks that measure at once from writing the same temporary file. */
static int write_root(const char *path, json_t *root) {
  char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
  const struct tz_atomic_params ap = {.what = "rates", .tmp_pid = 1};
  int rc = text ? tz_atomic_write_file(path, text, strlen(text), &ap)
                : tz_err_set(TZ_ENOMEM, "rates: out of memory for %s", path);
  free(text);
  return rc;
}

/* Entry e (taken) as key's in path, the other entries kept, the file's version this one's. */
static int put_entry(const char *path, const char *key, json_t *e) {
  json_error_t err;
  json_t *root = tz_input_json(path, 0, &err);
  if (!json_is_object(root)) {
    json_decref(root);
    root = json_object();
  }
  json_object_set_new(root, "version", json_integer(RATES_VERSION));
  json_object_set_new(root, key, e);
  int de = tz_file_mkdir_p(NULL, path, TZ_MKDIR_PARENTS | TZ_MKDIR_DURABLE);
  if (de) {
    json_decref(root);
    return tz_err_errno(de, "rates: cannot create the directory of %s", path);
  }
  int rc = write_root(path, root);
  json_decref(root);
  return rc;
}

int tz_rates_cache_write(const char *path, const char *key, const struct tz_plan_rates *r) {
  json_t *e = json_object();
  struct tz_plan_rates copy = *r;
  for (int i = 0; i < TZ_RATES_N_FIELDS; i++)
    json_object_set_new(e, fields[i], json_real(*tz_rates_field(&copy, i)));
  return put_entry(path, key, e);
}

static const char *const layer_fields[TZ_RATES_LAYER_FIELDS] = {"layer_s", "attn_fwd_s",
                                                                "mlp_fwd_s", "attn_proj_fwd_s"};

int tz_rates_layer_read(const char *path, const char *key, double s[TZ_RATES_LAYER_FIELDS]) {
  json_error_t err;
  json_t *root = tz_input_json(path, 0, &err);
  if (!root)
    return 0;
  json_t *e = entry_of(root, key);
  int ok = e != NULL;
  double got[TZ_RATES_LAYER_FIELDS];
  for (int i = 0; ok && i < TZ_RATES_LAYER_FIELDS; i++) {
    json_t *v = json_object_get(e, layer_fields[i]);
    ok = json_is_number(v) && json_number_value(v) >= 0;
    got[i] = ok ? json_number_value(v) : 0;
  }
  ok = ok && got[0] > 0; /* an entry without the pass's time is no measurement */
  json_decref(root);
  if (ok)
    memcpy(s, got, sizeof got);
  return ok;
}

int tz_rates_layer_write(const char *path, const char *key, const double s[TZ_RATES_LAYER_FIELDS]) {
  json_t *e = json_object();
  for (int i = 0; i < TZ_RATES_LAYER_FIELDS; i++)
    json_object_set_new(e, layer_fields[i], json_real(s[i]));
  return put_entry(path, key, e);
}

int tz_rates_forget(const struct tz_config *cfg, const char *backend, const char *path) {
  char def[PATH_MAX], key[PATH_MAX + 64];
  if (!path && tz_rates_default_path(def, sizeof def) == 0)
    path = def;
  if (!path)
    return 0;
  json_error_t err;
  json_t *root = tz_input_json(path, 0, &err);
  tz_rates_cache_key(cfg, backend, key, sizeof key);
  int rc = 0, dropped = 0;
  if (json_is_object(root)) {
    dropped = json_object_del(root, key) == 0;
    /* the backend's layer timings too (the bound's compute term is theirs) */
    char prefix[64];
    snprintf(prefix, sizeof prefix, "layer|%s", backend);
    size_t n = strlen(prefix);
    const char *k;
    json_t *v, *tmp;
    json_object_foreach_safe(root, tmp, k, v) {
      (void)v;
      if (strncmp(k, prefix, n) == 0 && (k[n] == '|' || k[n] == ' ')) {
        json_object_del(root, k);
        dropped = 1;
      }
    }
  }
  if (dropped)
    rc = write_root(path, root);
  json_decref(root);
  return rc;
}

int tz_rates_learn(const struct tz_config *cfg, const char *backend, const char *path,
                   double adam_home_run, double nvme_run) {
  char def[PATH_MAX], key[PATH_MAX + 64];
  if (!path && tz_rates_default_path(def, sizeof def) == 0)
    path = def;
  if (!path || (!(adam_home_run > 0) && !(nvme_run > 0)))
    return 0;
  tz_rates_cache_key(cfg, backend, key, sizeof key);
  struct tz_plan_rates r;
  memset(&r, 0, sizeof r);
  if (!tz_rates_cache_read(path, key, &r))
    return 0; /* no complete entry of this version: the next run measures anyway */
  json_error_t err;
  json_t *root = tz_input_json(path, 0, &err);
  json_t *e = json_object_get(root, key);
  int rc = 0;
  if (json_is_object(e)) {
    if (adam_home_run > 0)
      json_object_set_new(e, "adam_home_run", json_real(adam_home_run));
    if (nvme_run > 0)
      json_object_set_new(e, "nvme_run", json_real(nvme_run));
    rc = write_root(path, root);
  }
  json_decref(root);
  return rc;
}
