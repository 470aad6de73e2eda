/* Step metrics, the JSONL file, the progress display and the run summary (metrics.h). */
#define _GNU_SOURCE
#include "trainer/run/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "util/clock.h"
#include "util/file.h"
#include "util/size.h"

/* ---- step figures ---- */

void tz_step_metrics_init(struct tz_step_metrics *m) {
  memset(m, 0, sizeof *m);
  m->loss = m->lr = m->grad_norm = m->eval_loss = m->epoch = NAN;
  m->tokens_per_s = m->tflops = m->mfu = NAN;
  m->disk.busy_s = NAN;
}

static int traffic_add(struct tz_traffic *t, int *n, const char *tier, const char *lane,
                       uint64_t bytes) {
  for (int i = 0; i < *n; i++)
    if (strcmp(t[i].tier, tier) == 0 && strcmp(t[i].lane, lane) == 0) {
      t[i].bytes += bytes;
      return 0;
    }
  if (strlen(tier) >= sizeof t->tier || strlen(lane) >= sizeof t->lane || !*tier || !*lane)
    return tz_err_set(TZ_EINVAL, "metrics: tier '%s' or lane '%s' is empty or too long", tier,
                      lane);
  if (*n >= TZ_METRICS_MAX_TRAFFIC)
    return tz_err_set(TZ_ENOMEM, "metrics: more than %d tier/lane pairs (adding %s/%s)",
                      TZ_METRICS_MAX_TRAFFIC, tier, lane);
  struct tz_traffic *e = &t[(*n)++];
  snprintf(e->tier, sizeof e->tier, "%s", tier);
  snprintf(e->lane, sizeof e->lane, "%s", lane);
  e->bytes = bytes;
  return 0;
}

int tz_step_metrics_add_traffic(struct tz_step_metrics *m, const char *tier, const char *lane,
                                uint64_t bytes) {
  return traffic_add(m->traffic, &m->n_traffic, tier, lane, bytes);
}

/* ---- tier traffic ---- */

void tz_metrics_counters_take(tz_tier *const *tiers, int n, struct tz_traffic_counters *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < n && out->n < TZ_METRICS_MAX_TIERS; i++) {
    if (!tiers[i])
      continue;
    struct tz_tier_io_stats st;
    tz_tier_io_stats(tiers[i], &st);
    out->tier[out->n].t = tiers[i];
    snprintf(out->tier[out->n].name, sizeof out->tier[0].name, "%s", tz_tier_name(tiers[i]));
    out->tier[out->n].read = st.bytes_read;
    out->tier[out->n].written = st.bytes_written;
    out->tier[out->n].busy_ns = st.busy_ns;
    out->tier[out->n].has_busy = st.has_busy;
    out->n++;
  }
}

/* The tier whose traffic the disk's figures are: the trainer's nvme tier (a fault tier of that
 * name when faults are injected, which cannot tell its busy time). */
static int is_disk(const char *name) { return strcmp(name, "nvme") == 0; }

/* Adds what each tier moved since *last to t (a step's or the summary's), then *last = now;
 * the disk's share of it in *disk (NULL: not wanted), *has_disk set when there is a disk. */
static int traffic_since(struct tz_traffic *t, int *nt, tz_tier *const *tiers, int n,
                         struct tz_traffic_counters *last, struct tz_disk_traffic *disk,
                         int *has_disk) {
  struct tz_traffic_counters now;
  tz_metrics_counters_take(tiers, n, &now);
  int rc = 0;
  for (int i = 0; i < now.n && rc == 0; i++) {
    uint64_t r0 = 0, w0 = 0, b0 = 0;
    for (int j = 0; j < last->n; j++)
      if (last->tier[j].t == now.tier[i].t) {
        r0 = last->tier[j].read;
        w0 = last->tier[j].written;
        b0 = last->tier[j].busy_ns;
      }
    if (disk && is_disk(now.tier[i].name)) {
      *has_disk = 1;
      disk->read = now.tier[i].read - r0;
      disk->written = now.tier[i].written - w0;
      disk->busy_s = now.tier[i].has_busy ? 1e-9 * (double)(now.tier[i].busy_ns - b0) : NAN;
    }
    /* Both lanes are written, zeros too: a tier that moved nothing in a step is a fact worth a
     * column, and every line then has the same keys. */
    rc = traffic_add(t, nt, now.tier[i].name, "read", now.tier[i].read - r0);
    if (rc == 0)
      rc = traffic_add(t, nt, now.tier[i].name, "write", now.tier[i].written - w0);
  }
  *last = now;
  return rc;
}

int tz_metrics_step_traffic(struct tz_step_metrics *m, tz_tier *const *tiers, int n,
                            struct tz_traffic_counters *last) {
  m->n_memory = 0;
  for (int i = 0; i < n && m->n_memory < TZ_METRICS_MAX_TIERS; i++) {
    if (!tiers[i])
      continue;
    struct tz_arena_stats as;
    tz_tier_arena_stats(tiers[i], &as);
    struct tz_tier_memory *e = &m->memory[m->n_memory++];
    snprintf(e->tier, sizeof e->tier, "%s", tz_tier_name(tiers[i]));
    e->used = as.used;
    e->capacity = as.capacity;
  }
  return traffic_since(m->traffic, &m->n_traffic, tiers, n, last, &m->disk, &m->has_disk);
}

void tz_disk_rates_of(const struct tz_disk_traffic *d, double wall_s, struct tz_disk_rates *out) {
  double r = (double)d->read, w = (double)d->written;
  int wall = wall_s > 0, busy = d->busy_s > 0; /* false for NaN */
  out->read_gbs = wall ? r / wall_s / 1e9 : NAN;
  out->write_gbs = wall ? w / wall_s / 1e9 : NAN;
  out->busy_read_gbs = busy ? r / d->busy_s / 1e9 : NAN;
  out->busy_write_gbs = busy ? w / d->busy_s / 1e9 : NAN;
  out->busy_share = wall && isfinite(d->busy_s) ? d->busy_s / wall_s : NAN;
  out->read_share = r + w > 0 ? r / (r + w) : NAN;
}

double tz_metrics_flops_per_token(const struct tz_model_config *cfg, int T, int recompute) {
  double n = (double)tz_model_n_active_params(cfg); /* a token's: k of each layer's experts */
  double attn = (double)cfg->n_layer * (double)T * (double)cfg->d_model;
  return recompute ? 8.0 * n + 16.0 * attn : 6.0 * n + 12.0 * attn;
}

/* Dense (no structured sparsity) peaks from the vendors' data sheets; more specific names first,
 * since a name is matched by substring. */
static const struct {
  const char *name;
  double fp32, half; /* FLOP/s: plain fp32; fp16 and bf16 tensor cores */
} peaks[] = {
    {"GH200", 66.9e12, 989.4e12},     {"H200 NVL", 60.0e12, 835.5e12}, {"H200", 66.9e12, 989.4e12},
    {"H100 PCIe", 51.2e12, 756.5e12}, {"H100 NVL", 60.0e12, 835.5e12}, {"H100", 66.9e12, 989.4e12},
    {"A100", 19.5e12, 312.0e12},      {"L40S", 91.6e12, 362.05e12},
};

double tz_metrics_peak_flops(const char *device_name, enum tz_precision precision) {
  if (!device_name)
    return 0.0;
  for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
    if (strstr(device_name, peaks[i].name))
      return precision == TZ_PRECISION_FP32 ? peaks[i].fp32 : peaks[i].half;
  return 0.0;
}

void tz_metrics_derive(struct tz_step_metrics *m, double flops_per_token, double peak_flops) {
  if (m->step_s > 0.0) {
    m->tokens_per_s = (double)m->tokens / m->step_s;
    m->tflops = flops_per_token * m->tokens_per_s / 1e12;
  } else {
    m->tokens_per_s = m->tflops = NAN;
  }
  m->mfu = peak_flops > 0.0 ? m->tflops * 1e12 / peak_flops : NAN;
}

/* ---- formatting ---- */

/* 1234567 -> "1.23M". */
static void fmt_si(char *buf, size_t n, double v) {
  if (!isfinite(v)) {
    snprintf(buf, n, "-");
    return;
  }
  const char *units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (fabs(v) >= 1000.0 && u < 5) {
    v /= 1000.0;
    u++;
  }
  snprintf(buf, n,
           u == 0            ? "%.0f%s"
           : fabs(v) < 10.0  ? "%.2f%s"
           : fabs(v) < 100.0 ? "%.1f%s"
                             : "%.0f%s",
           v, units[u]);
}

/* 3725 -> "1h02m", 65 -> "1m05s", 7.2 -> "7s". */
static void fmt_duration(char *buf, size_t n, double s) {
  if (!isfinite(s) || s < 0) {
    snprintf(buf, n, "?");
    return;
  }
  uint64_t t = (uint64_t)llround(s);
  if (t >= 86400)
    snprintf(buf, n, "%" PRIu64 "d%02" PRIu64 "h", t / 86400, t % 86400 / 3600);
  else if (t >= 3600)
    snprintf(buf, n, "%" PRIu64 "h%02" PRIu64 "m", t / 3600, t % 3600 / 60);
  else if (t >= 60)
    snprintf(buf, n, "%" PRIu64 "m%02" PRIu64 "s", t / 60, t % 60);
  else
    snprintf(buf, n, "%" PRIu64 "s", t);
}

/* ---- the metrics file ---- */

struct tz_metrics_writer {
  FILE *f;
  char *path;
};

int tz_metrics_writer_create(const char *path, int append, tz_metrics_writer **out) {
  *out = NULL;
  tz_metrics_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->path = strdup(path))) {
    free(w);
    return tz_err_set(TZ_ENOMEM, "metrics: out of memory");
  }
  w->f = fopen(path, append ? "ae" : "we");
  if (!w->f) {
    int e = errno;
    free(w->path);
    free(w);
    return tz_err_errno(e, "metrics: cannot open %s", path);
  }
  *out = w;
  return 0;
}

/* The whole of path in *buf (malloc'd, *n bytes); an absent file, and what is not a regular file
 * (/dev/stdout, a pipe: nothing to read back, and a read could block), are empty (*buf NULL). */
static int read_all(const char *path, char **buf, size_t *n) {
  *buf = NULL;
  *n = 0;
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return 0;
  FILE *f = fopen(path, "re");
  if (!f)
    return errno == ENOENT ? 0 : tz_err_errno(errno, "metrics: cannot read %s", path);
  size_t cap = 0;
  for (;;) {
    if (*n == cap) {
      char *b = realloc(*buf, cap = cap ? 2 * cap : 1 << 16);
      if (!b) {
        fclose(f);
        free(*buf);
        *buf = NULL;
        return tz_err_set(TZ_ENOMEM, "metrics: no memory to read %s", path);
      }
      *buf = b;
    }
    size_t got = fread(*buf + *n, 1, cap - *n, f);
    *n += got;
    if (got == 0)
      break;
  }
  int e = ferror(f) ? errno : 0;
  fclose(f);
  if (e) {
    free(*buf);
    *buf = NULL;
    return tz_err_errno(e, "metrics: cannot read %s", path);
  }
  return 0;
}

/* How many bytes of the file's n to keep when resuming after step: the lines before the first step
 * object past it (that one, and whatever the run wrote after it, its summary included, describe
 * steps the resumed run does again), and never a last line without its newline (torn by the
 * crash). Lines that are not step objects are kept. */
static size_t resume_keep(const char *buf, size_t n, int64_t step) {
  size_t off = 0;
  while (off < n) {
    const char *nl = memchr(buf + off, '\n', n - off);
    if (!nl)
      break;
    size_t len = (size_t)(nl - (buf + off)) + 1;
    json_error_t err;
    json_t *o = json_loadb(buf + off, len, 0, &err);
    json_t *s = json_object_get(o, "step");
    int past = json_is_integer(s) && json_integer_value(s) > step &&
               !json_is_true(json_object_get(o, "summary"));
    json_decref(o);
    if (past)
      break;
    off += len;
  }
  return off;
}

int tz_metrics_writer_resume(const char *path, int64_t step, tz_metrics_writer **out) {
  *out = NULL;
  char *buf;
  size_t n;
  TZ_CHECK(read_all(path, &buf, &n));
  size_t keep = resume_keep(buf, n, step);
  int rc = 0;
  /* A rename over the file: a crash leaves the old lines or the new, never a half-cut file. */
  if (keep < n)
    rc = tz_atomic_write_file(path, buf, keep, &(struct tz_atomic_params){.what = "metrics"});
  free(buf);
  return rc < 0 ? rc : tz_metrics_writer_create(path, 1, out);
}

void tz_metrics_writer_destroy(tz_metrics_writer *w) {
  if (!w)
    return;
  fclose(w->f);
  free(w->path);
  free(w);
}

/* JSON has no NaN or infinity: those are null. */
/* v in fmt, or "nan", "inf", "-inf": printf writes "-nan" for a NaN with its sign bit set. */
static void fmt_value(char *buf, size_t len, const char *fmt, double v) {
  if (isnan(v))
    snprintf(buf, len, "nan");
  else if (isinf(v))
    snprintf(buf, len, v > 0 ? "inf" : "-inf");
  else
    snprintf(buf, len, fmt, v);
}

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *traffic_json(const struct tz_traffic *t, int n) {
  json_t *o = json_object();
  for (int i = 0; o && i < n; i++) {
    json_t *tier = json_object_get(o, t[i].tier);
    if (!tier) {
      tier = json_object();
      if (json_object_set_new(o, t[i].tier, tier) != 0)
        return json_decref(o), NULL;
    }
    if (json_object_set_new(tier, t[i].lane, json_integer((json_int_t)t[i].bytes)) != 0)
      return json_decref(o), NULL;
  }
  return o;
}

static int write_line(tz_metrics_writer *w, json_t *o) {
  if (!o)
    return tz_err_set(TZ_ENOMEM, "metrics: out of memory building a line for %s", w->path);
  /* 10 significant digits: enough for every figure, and 3e-4 stays "0.0003". */
  int rc = json_dumpf(o, w->f, JSON_COMPACT | JSON_REAL_PRECISION(10));
  json_decref(o);
  if (rc != 0 || fputc('\n', w->f) == EOF || fflush(w->f) != 0) {
    int e = errno ? errno : EIO;
    clearerr(w->f);
    return tz_err_errno(e, "metrics: cannot write to %s", w->path);
  }
  return 0;
}

/* json_object_set_new that remembers a failure instead of returning it. */
static void put(json_t *o, const char *key, json_t *v, int *bad) {
  if (!v || json_object_set_new(o, key, v) != 0)
    *bad = 1;
}

/* The disk's keys (docs/data.md, "The disk's rates"), of a step or of the timed steps. */
static void put_disk(json_t *o, const struct tz_disk_traffic *d, double wall_s, int *bad) {
  struct tz_disk_rates r;
  tz_disk_rates_of(d, wall_s, &r);
  put(o, "nvme_read_bytes", json_integer((json_int_t)d->read), bad);
  put(o, "nvme_write_bytes", json_integer((json_int_t)d->written), bad);
  put(o, "nvme_read_gbs", num(r.read_gbs), bad);
  put(o, "nvme_write_gbs", num(r.write_gbs), bad);
  put(o, "nvme_read_share", num(r.read_share), bad);
  put(o, "nvme_busy_s", num(d->busy_s), bad);
  put(o, "nvme_busy_share", num(r.busy_share), bad);
  put(o, "nvme_busy_read_gbs", num(r.busy_read_gbs), bad);
  put(o, "nvme_busy_write_gbs", num(r.busy_write_gbs), bad);
}

static json_t *memory_json(const struct tz_tier_memory *t, int n) {
  json_t *o = json_object();
  for (int i = 0; o && i < n; i++) {
    json_t *e = json_pack("{s:I, s:I}", "used", (json_int_t)t[i].used, "capacity",
                          (json_int_t)t[i].capacity);
    if (!e || json_object_set_new(o, t[i].tier, e) != 0)
      return json_decref(o), NULL;
  }
  return o;
}

int tz_metrics_write_config(tz_metrics_writer *w, const struct tz_config *cfg, int64_t start_step) {
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  if (!mem)
    return tz_err_set(TZ_ENOMEM, "metrics: out of memory for the configuration of %s", w->path);
  int rc = tz_config_dump(cfg, mem);
  fclose(mem);
  json_error_t err;
  json_t *c = rc == 0 ? json_loadb(text, len, 0, &err) : NULL;
  free(text);
  if (rc < 0) {
    json_decref(c);
    return rc;
  }
  json_t *o = c ? json_pack("{s:o, s:I}", "config", c, "start_step", (json_int_t)start_step) : NULL;
  if (!o)
    return tz_err_set(TZ_ENOMEM, "metrics: cannot build the configuration line of %s", w->path);
  return write_line(w, o);
}

int tz_metrics_write_step(tz_metrics_writer *w, const struct tz_step_metrics *m) {
  json_t *o = json_object();
  int bad = !o;
  if (o) {
    put(o, "step", json_integer(m->step), &bad);
    if (m->total_steps > 0)
      put(o, "total_steps", json_integer(m->total_steps), &bad);
    put(o, "elapsed_s", num(m->elapsed_s), &bad);
    put(o, "loss", num(m->loss), &bad);
    put(o, "lr", num(m->lr), &bad);
    put(o, "grad_norm", num(m->grad_norm), &bad);
    put(o, "tokens", json_integer((json_int_t)m->tokens), &bad);
    put(o, "tokens_per_s", num(m->tokens_per_s), &bad);
    put(o, "tflops", num(m->tflops), &bad);
    put(o, "mfu", num(m->mfu), &bad);
    put(o, "step_s", num(m->step_s), &bad);
    put(o, "bound_s", m->bound_s > 0 ? num(m->bound_s) : json_null(), &bad);
    put(o, "stall_s", num(m->stall_s), &bad);
    put(o, "coll_s", num(m->coll_s), &bad);
    put(o, "skipped", json_boolean(m->skipped), &bad);
    if (m->loss_scale > 0)
      put(o, "loss_scale", num(m->loss_scale), &bad);
    if (m->has_eval)
      put(o, "eval_loss", num(m->eval_loss), &bad);
    if (isfinite(m->epoch))
      put(o, "epoch", num(m->epoch), &bad);
    put(o, "bytes", traffic_json(m->traffic, m->n_traffic), &bad);
    put(o, "memory", memory_json(m->memory, m->n_memory), &bad);
    if (m->has_disk)
      put_disk(o, &m->disk, m->step_s, &bad);
  }
  if (bad) {
    json_decref(o);
    o = NULL;
  }
  return write_line(w, o);
}

/* ---- the summary ---- */

void tz_metrics_summary_init(struct tz_metrics_summary *s, double flops_per_token,
                             double peak_flops) {
  memset(s, 0, sizeof *s);
  s->flops_per_token = flops_per_token;
  s->peak_flops = peak_flops;
  s->last_loss = s->last_eval_loss = NAN;
}

static void disk_add(struct tz_disk_traffic *to, const struct tz_disk_traffic *d) {
  to->read += d->read;
  to->written += d->written;
  to->busy_s += d->busy_s; /* NaN stays NaN: a step whose tier could not tell */
}

void tz_metrics_summary_add(struct tz_metrics_summary *s, const struct tz_step_metrics *m) {
  /* The first step's figures move from the timed totals out once a second arrives. */
  if (s->steps == 1 && s->timed_steps == 1) {
    s->timed_steps = 0;
    s->timed_tokens = 0;
    s->timed_s = s->timed_bound_s = s->timed_stall_s = s->timed_coll_s = 0;
    s->bound_steps = 0;
    s->timed_disk = (struct tz_disk_traffic){0};
  }
  s->steps++;
  s->skipped += m->skipped != 0;
  s->tokens += m->tokens;
  s->time_s += m->step_s;
  s->timed_steps++;
  s->timed_tokens += m->tokens;
  s->timed_s += m->step_s;
  s->timed_stall_s += m->stall_s;
  s->timed_coll_s += m->coll_s;
  if (m->bound_s > 0) {
    s->timed_bound_s += m->bound_s;
    s->bound_steps++;
  }
  if (m->has_disk) {
    s->has_disk = 1;
    disk_add(&s->timed_disk, &m->disk);
  }
  /* The last step's loss as it was, a non-finite one too (a run stopped by it); a step that fp16
   * loss scaling skipped replaces it only with a finite loss. */
  if (!m->skipped || isfinite(m->loss))
    s->last_loss = m->loss;
  if (m->has_eval && isfinite(m->eval_loss))
    s->last_eval_loss = m->eval_loss;
  for (int i = 0; i < m->n_traffic; i++)
    /* A summary has the same room as a step; pairs beyond it are left out of the totals. */
    (void)traffic_add(s->traffic, &s->n_traffic, m->traffic[i].tier, m->traffic[i].lane,
                      m->traffic[i].bytes);
}

int tz_metrics_summary_traffic_rest(struct tz_metrics_summary *s, tz_tier *const *tiers, int n,
                                    struct tz_traffic_counters *last) {
  return traffic_since(s->traffic, &s->n_traffic, tiers, n, last, NULL, NULL);
}

/* The summary's rates, for print and JSON alike. */
struct rates {
  double tokens_per_s, tflops, mfu, step_s, bound_s, stall_share, coll_share;
};

static struct rates summary_rates(const struct tz_metrics_summary *s) {
  struct rates r = {NAN, NAN, NAN, NAN, NAN, NAN, NAN};
  if (s->timed_steps > 0 && s->timed_s > 0) {
    r.tokens_per_s = (double)s->timed_tokens / s->timed_s;
    r.tflops = s->flops_per_token * r.tokens_per_s / 1e12;
    if (s->peak_flops > 0)
      r.mfu = r.tflops * 1e12 / s->peak_flops;
    r.step_s = s->timed_s / (double)s->timed_steps;
    r.stall_share = s->timed_stall_s / s->timed_s;
    r.coll_share = s->timed_coll_s / s->timed_s;
  }
  if (s->bound_steps > 0 && s->bound_steps == s->timed_steps)
    r.bound_s = s->timed_bound_s / (double)s->bound_steps;
  return r;
}

int tz_metrics_summary_below_bound(const struct tz_metrics_summary *s) {
  struct rates r = summary_rates(s);
  return isfinite(r.bound_s) && r.step_s < r.bound_s * (1.0 - TZ_BOUND_NOISE);
}

/* "  disk (nvme) read 10.03 MB a step at 179.60 MB/s, write ...": the timed steps' figures. */
static void print_disk(const struct tz_metrics_summary *s, FILE *f) {
  struct tz_disk_rates r;
  tz_disk_rates_of(&s->timed_disk, s->timed_s, &r);
  double steps = (double)s->timed_steps;
  char rb[32], rr[32], wb[32], wr[32], share[32];
  tz_bytes_format(rb, sizeof rb, (double)s->timed_disk.read / steps, &tz_bytes_si);
  tz_bytes_format(rr, sizeof rr, r.read_gbs * 1e9, &tz_bytes_si);
  tz_bytes_format(wb, sizeof wb, (double)s->timed_disk.written / steps, &tz_bytes_si);
  tz_bytes_format(wr, sizeof wr, r.write_gbs * 1e9, &tz_bytes_si);
  fmt_value(share, sizeof share, "%.3f", r.read_share);
  fprintf(f, "  disk (nvme) read %s a step at %s/s, write %s at %s/s (read share %s)", rb, rr, wb,
          wr, share);
  if (isfinite(r.busy_share)) {
    char br[32], bw[32];
    tz_bytes_format(br, sizeof br, r.busy_read_gbs * 1e9, &tz_bytes_si);
    tz_bytes_format(bw, sizeof bw, r.busy_write_gbs * 1e9, &tz_bytes_si);
    fprintf(f, "; busy %.1f%% of the step, at %s/s read and %s/s write while busy",
            100.0 * r.busy_share, br, bw);
  }
  fputc('\n', f);
}

void tz_metrics_summary_print(const struct tz_metrics_summary *s, FILE *f) {
  struct rates r = summary_rates(s);
  char a[32], b[32], c[32];
  fmt_si(a, sizeof a, (double)s->tokens);
  fmt_duration(b, sizeof b, s->time_s);
  fprintf(f, "summary: %" PRId64 " steps, %s tokens in %s", s->steps, a, b);
  if (s->skipped)
    fprintf(f, " (%" PRId64 " skipped on fp16 overflow)", s->skipped);
  fputc('\n', f);
  if (s->timed_steps == 0) {
    fprintf(f, "  no timed steps\n");
    return;
  }
  const char *over = s->timed_steps < s->steps ? " (steps after the first)" : "";
  fmt_si(a, sizeof a, r.tokens_per_s);
  fprintf(f, "  throughput  %s tokens/s, %.3g TFLOP/s", a, r.tflops);
  if (isfinite(r.mfu))
    fprintf(f, ", MFU %.1f%% of %.0f TFLOP/s peak", 100.0 * r.mfu, s->peak_flops / 1e12);
  else
    fprintf(f, ", MFU unknown (no peak for this device)");
  fprintf(f, "%s\n", over);
  fprintf(f, "  step time   %.4g s", r.step_s);
  if (isfinite(r.bound_s) && r.step_s >= r.bound_s)
    fprintf(f, " achieved, %.4g s bound: %.2fx the bound", r.bound_s, r.step_s / r.bound_s);
  else if (isfinite(r.bound_s) && !tz_metrics_summary_below_bound(s))
    fprintf(f, " achieved, %.4g s bound: at the bound (%.3fx, within the rates' %.0f%% noise)",
            r.bound_s, r.step_s / r.bound_s, 100.0 * TZ_BOUND_NOISE);
  else if (isfinite(r.bound_s))
    /* A lower bound that a run beats is no bound (docs/training.md "The bound"): no ratio. */
    fprintf(f,
            " achieved, under the plan's %.4g s bound, so the bound is wrong: the rates it was "
            "costed with were measured slow (a busy machine while probing?) and are measured "
            "again next run",
            r.bound_s);
  else
    fprintf(f, " achieved (no plan bound)");
  fprintf(f, "; stalls %.1f%% of step time", 100.0 * r.stall_share);
  if (r.coll_share > 0)
    fprintf(f, ", collectives %.1f%%", 100.0 * r.coll_share);
  fputc('\n', f);
  if (s->steps > 0) {
    char loss[32];
    fmt_value(loss, sizeof loss, "%.4f", s->last_loss);
    fprintf(f, "  loss        %s (last step)", loss);
    if (isfinite(s->last_eval_loss))
      fprintf(f, ", eval %.4f (last)", s->last_eval_loss);
    fputc('\n', f);
  }
  if (s->has_disk)
    print_disk(s, f);
  if (s->n_traffic > 0) {
    fprintf(f, "  bytes moved %-6s %-12s %12s %12s\n", "tier", "lane", "total", "per second");
    for (int i = 0; i < s->n_traffic; i++) {
      tz_bytes_format(a, sizeof a, (double)s->traffic[i].bytes, &tz_bytes_si);
      tz_bytes_format(b, sizeof b, s->time_s > 0 ? (double)s->traffic[i].bytes / s->time_s : NAN,
                      &tz_bytes_si);
      snprintf(c, sizeof c, "%s/s", b);
      fprintf(f, "              %-6s %-12s %12s %12s\n", s->traffic[i].tier, s->traffic[i].lane, a,
              s->time_s > 0 ? c : "-");
    }
  }
}

int tz_metrics_write_summary(tz_metrics_writer *w, const struct tz_metrics_summary *s) {
  struct rates r = summary_rates(s);
  json_t *o = json_object();
  int bad = !o;
  if (o) {
    put(o, "summary", json_true(), &bad);
    put(o, "steps", json_integer(s->steps), &bad);
    put(o, "skipped", json_integer(s->skipped), &bad);
    put(o, "tokens", json_integer((json_int_t)s->tokens), &bad);
    put(o, "time_s", num(s->time_s), &bad);
    put(o, "timed_steps", json_integer(s->timed_steps), &bad);
    put(o, "tokens_per_s", num(r.tokens_per_s), &bad);
    put(o, "tflops", num(r.tflops), &bad);
    put(o, "mfu", num(r.mfu), &bad);
    put(o, "step_s", num(r.step_s), &bad);
    put(o, "bound_s", num(r.bound_s), &bad);
    put(o, "stall_share", num(r.stall_share), &bad);
    put(o, "coll_share", num(r.coll_share), &bad);
    put(o, "loss", num(s->last_loss), &bad);
    put(o, "eval_loss", num(s->last_eval_loss), &bad);
    put(o, "bytes", traffic_json(s->traffic, s->n_traffic), &bad);
    if (s->has_disk && s->timed_steps > 0)
      put_disk(o, &s->timed_disk, s->timed_s, &bad);
  }
  if (bad) {
    json_decref(o);
    o = NULL;
  }
  return write_line(w, o);
}

/* ---- the display ---- */

struct tz_display {
  FILE *f;
  enum tz_display_mode mode;
  int64_t every;
  int64_t seen;      /* steps shown or not */
  double ema_step_s; /* smoothed step time for the ETA */
  double last_draw;  /* monotonic seconds of the last bar redraw */
  int bar_showing;   /* the bar is on screen, without a newline after it */
  char line[512];    /* the last bar drawn */
};

int tz_display_mode_parse(const char *name, enum tz_display_mode *out) {
  static const struct {
    const char *name;
    enum tz_display_mode mode;
  } names[] = {{"plain", TZ_DISPLAY_LINES}, {"bar", TZ_DISPLAY_BAR}, {"auto", TZ_DISPLAY_AUTO}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (name && strcmp(name, names[i].name) == 0) {
      *out = names[i].mode;
      return 0;
    }
  return tz_err_set(TZ_EINVAL,
                    "progress mode '%s': expected plain (a line per step), bar (one line redrawn "
                    "in place) or auto (a bar on a terminal, plain otherwise)",
                    name ? name : "");
}

int tz_display_create(FILE *f, enum tz_display_mode mode, int64_t every, tz_display **out) {
  *out = NULL;
  if (!f || every < 1 || mode < TZ_DISPLAY_AUTO || mode > TZ_DISPLAY_QUIET)
    return tz_err_set(TZ_EINVAL, "display: bad arguments (every %" PRId64 ", mode %d)", every,
                      (int)mode);
  tz_display *d = calloc(1, sizeof *d);
  if (!d)
    return tz_err_set(TZ_ENOMEM, "display: out of memory");
  d->f = f;
  d->every = every;
  if (mode == TZ_DISPLAY_AUTO)
    mode = isatty(fileno(f)) ? TZ_DISPLAY_BAR : TZ_DISPLAY_LINES;
  d->mode = mode;
  d->last_draw = -1.0;
  *out = d;
  return 0;
}

void tz_display_destroy(tz_display *d) {
  if (!d)
    return;
  if (d->bar_showing) {
    fputc('\n', d->f);
    fflush(d->f);
  }
  free(d);
}

enum tz_display_mode tz_display_mode_of(const tz_display *d) { return d->mode; }

static int term_width(FILE *f) {
  struct winsize ws;
  if (ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
    return ws.ws_col;
  return 100;
}

static double eta_s(const tz_display *d, const struct tz_step_metrics *m) {
  if (m->total_steps <= 0)
    return NAN;
  return (double)(m->total_steps - m->step) * d->ema_step_s;
}

static void draw_bar(tz_display *d, const struct tz_step_metrics *m) {
  char tok[32], eta[32], steps[48], rest[256];
  fmt_si(tok, sizeof tok, m->tokens_per_s);
  fmt_duration(eta, sizeof eta, eta_s(d, m));
  if (m->total_steps > 0)
    snprintf(steps, sizeof steps, "step %" PRId64 "/%" PRId64, m->step, m->total_steps);
  else
    snprintf(steps, sizeof steps, "step %" PRId64, m->step);
  snprintf(rest, sizeof rest, " loss %.4f | lr %.2e | %s tok/s | %.3g TFLOP/s | ETA %s", m->loss,
           m->lr, tok, m->tflops, eta);
  int width = term_width(d->f) - 1; /* the last column would wrap on some terminals */
  int room = width - (int)strlen(steps) - (int)strlen(rest) - 4;
  char bar[64] = "";
  if (m->total_steps > 0 && room >= 10) {
    int n = room < 40 ? room : 40;
    int filled = (int)((double)n * (double)m->step / (double)m->total_steps);
    filled = filled > n ? n : filled;
    bar[0] = ' ';
    bar[1] = '[';
    for (int i = 0; i < n; i++)
      bar[2 + i] = i < filled ? '#' : '.';
    bar[2 + n] = ']';
    bar[3 + n] = '\0';
  }
  snprintf(d->line, sizeof d->line, "%s%s%s", steps, bar, rest);
  if ((int)strlen(d->line) > width && width > 0)
    d->line[width] = '\0';
  /* \r to the start, the line, then clear what a longer previous line left. */
  fprintf(d->f, "\r%s\033[K", d->line);
  fflush(d->f);
  d->bar_showing = 1;
  d->last_draw = tz_now_s();
}

static void print_line(tz_display *d, const struct tz_step_metrics *m) {
  char tok[32], eta[32];
  fmt_si(tok, sizeof tok, m->tokens_per_s);
  fmt_duration(eta, sizeof eta, eta_s(d, m));
  if (m->total_steps > 0)
    fprintf(d->f, "step %" PRId64 "/%" PRId64, m->step, m->total_steps);
  else
    fprintf(d->f, "step %" PRId64, m->step);
  char loss[32], norm[32];
  fmt_value(loss, sizeof loss, "%.4f", m->loss);
  fmt_value(norm, sizeof norm, "%.3g", m->grad_norm);
  fprintf(d->f, " | loss %s | lr %.2e | grad norm %s | %s tok/s | %.3g TFLOP/s", loss, m->lr, norm,
          tok, m->tflops);
  if (isfinite(m->mfu))
    fprintf(d->f, " | MFU %.1f%%", 100.0 * m->mfu);
  fprintf(d->f, " | %.3g s/step", m->step_s);
  if (m->bound_s > 0)
    fprintf(d->f, " (bound %.3g)", m->bound_s);
  if (m->total_steps > 0)
    fprintf(d->f, " | ETA %s", eta);
  if (m->has_eval)
    fprintf(d->f, " | eval loss %.4f", m->eval_loss);
  if (m->skipped)
    fprintf(d->f, " | skipped: fp16 overflow (loss scale now %g)", m->loss_scale);
  fputc('\n', d->f);
  fflush(d->f);
}

void tz_display_step(tz_display *d, const struct tz_step_metrics *m) {
  /* The first step pays for warm-up: the ETA forgets it at the second. */
  d->seen++;
  if (d->seen <= 2 || !(d->ema_step_s > 0))
    d->ema_step_s = m->step_s;
  else
    d->ema_step_s = 0.9 * d->ema_step_s + 0.1 * m->step_s;
  int last = m->total_steps > 0 && m->step >= m->total_steps;
  switch (d->mode) {
  case TZ_DISPLAY_BAR:
    /* An eval result or a skipped step stays on screen as a line of its own. */
    if (m->has_eval || m->skipped) {
      char msg[128];
      if (m->has_eval)
        snprintf(msg, sizeof msg, "step %" PRId64 ": eval loss %.4f", m->step, m->eval_loss);
      else
        snprintf(msg, sizeof msg, "step %" PRId64 ": skipped, fp16 overflow (loss scale now %g)",
                 m->step, m->loss_scale);
      if (d->bar_showing)
        fprintf(d->f, "\r\033[K");
      fprintf(d->f, "%s\n", msg);
      d->bar_showing = 0;
      draw_bar(d, m);
    } else if (last || d->last_draw < 0 || tz_now_s() - d->last_draw >= 0.1) {
      /* At most ten redraws a second: a terminal is slow next to a fast step. */
      draw_bar(d, m);
    }
    break;
  case TZ_DISPLAY_LINES:
    if (m->step == 1 || m->step % d->every == 0 || last || m->has_eval || m->skipped)
      print_line(d, m);
    break;
  default: break;
  }
}

void tz_display_message(tz_display *d, const char *fmt, ...) {
  if (d->mode == TZ_DISPLAY_QUIET)
    return;
  if (d->bar_showing)
    fprintf(d->f, "\r\033[K");
  va_list ap;
  va_start(ap, fmt);
  vfprintf(d->f, fmt, ap);
  va_end(ap);
  fputc('\n', d->f);
  if (d->bar_showing)
    fprintf(d->f, "%s\033[K", d->line);
  fflush(d->f);
}
