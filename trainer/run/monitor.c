/* Live monitoring (trainer/run/monitor.h): TensorBoard event files and DeepSpeed's CSV files. */
#define _GNU_SOURCE
#include "trainer/run/monitor.h"

#include "core/error.h"
#include "trainer/checkpoint/checkpoint.h"
#include "util/crc32c.h"
#include "util/file.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* DeepSpeed's defaults (deepspeed/monitor/config.py). */
#define DEFAULT_JOB "DeepSpeedJobName"

struct csv_file {
  char tag[TZ_MONITOR_MAX_TAG + 1];
  FILE *f;
};

struct tz_monitor {
  char *tb_path; /* the event file; NULL without tensorboard */
  FILE *tb;
  char *csv_dir; /* NULL without csv_monitor */
  int n_csv;     /* the tags written so far, each with its open file */
  struct csv_file csv[TZ_MONITOR_MAX_TAGS];
};

/* ---- The directory ---- */

int tz_monitor_dir(const char *output_path, const char *job_name, char *buf, size_t len) {
  const char *base = output_path ? output_path : "";
  const char *job = job_name ? job_name : DEFAULT_JOB;
  size_t nb = strlen(base);
  int n;
  if (job[0] == '/' || nb == 0)
    n = snprintf(buf, len, "%s", job);
  else
    n = snprintf(buf, len, "%s%s%s", base, base[nb - 1] == '/' ? "" : "/", job);
  if (n < 0 || (size_t)n >= len)
    return tz_err_set(TZ_EINVAL,
                      "monitor: the directory of output_path %s and job_name %s is "
                      "longer than %zu bytes",
                      base, job, len - 1);
  return 0;
}

/* The directory of one monitor's section ("tensorboard") into buf; TZ_ECONFIG naming its keys. */
static int section_dir(const char *section, const struct tz_config_monitor *c, char *buf,
                       size_t len) {
  if (tz_monitor_dir(c->output_path, c->job_name, buf, len) < 0)
    return tz_err_set(TZ_ECONFIG,
                      "%s.output_path, %s.job_name: the directory is longer than %zu "
                      "bytes",
                      section, section, len - 1);
  if (!buf[0])
    return tz_err_set(TZ_ECONFIG,
                      "%s.output_path and %s.job_name are both \"\": there is no directory to "
                      "write in (DeepSpeed writes in os.path.join(output_path, job_name), and "
                      "fails on \"\" too); give a job_name",
                      section, section);
  return 0;
}

int tz_monitor_check(const struct tz_config *cfg) {
  char dir[4096];
  if (cfg->tensorboard.enabled)
    TZ_CHECK(section_dir("tensorboard", &cfg->tensorboard, dir, sizeof dir));
  if (cfg->csv_monitor.enabled)
    TZ_CHECK(section_dir("csv_monitor", &cfg->csv_monitor, dir, sizeof dir));
  return 0;
}

/* Creates dir with its parents, as DeepSpeed's os.makedirs(log_dir, exist_ok=True). */
static int make_dir(const char *section, const char *dir) {
  int e = tz_file_mkdir_p(NULL, dir, 0);
  if (e)
    return tz_err_errno(e,
                        "%s.output_path, %s.job_name: cannot create the directory %s (the two "
                        "joined, as DeepSpeed joins them)",
                        section, section, dir);
  return 0;
}

/* ---- Protocol buffers and TFRecord framing ---- */

/* A growing byte buffer; a failed growth leaves oom set and the writes after it dropped. */
struct buf {
  unsigned char *p;
  size_t n, cap;
  int oom;
};

static void put(struct buf *b, const void *src, size_t n) {
  if (b->oom)
    return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n)
      cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, src, n);
  b->n += n;
}

static void put_varint(struct buf *b, uint64_t v) {
  unsigned char c[10];
  size_t n = 0;
  do {
    c[n] = (unsigned char)(v & 0x7f);
    v >>= 7;
    if (v)
      c[n] |= 0x80;
    n++;
  } while (v);
  put(b, c, n);
}

/* Little-endian, as protocol buffers' fixed64/fixed32 and TFRecord's lengths and CRCs are. */
static void put_le(struct buf *b, uint64_t v, int bytes) {
  unsigned char c[8];
  for (int i = 0; i < bytes; i++)
    c[i] = (unsigned char)(v >> (8 * i));
  put(b, c, (size_t)bytes);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

static void put_key(struct buf *b, int field, int wire) {
  put_varint(b, (uint64_t)field << 3 | (uint64_t)wire);
}

static void put_bytes(struct buf *b, int field, const void *p, size_t n) {
  put_key(b, field, WIRE_BYTES);
  put_varint(b, n);
  put(b, p, n);
}

/* TensorFlow's event.proto and summary.proto, the fields written here. */
enum {
  EVENT_WALL_TIME = 1,    /* double */
  EVENT_STEP = 2,         /* int64 */
  EVENT_FILE_VERSION = 3, /* string */
  EVENT_SUMMARY = 5,      /* Summary */
  SUMMARY_VALUE = 1,      /* repeated Summary.Value */
  VALUE_TAG = 1,          /* string */
  VALUE_SIMPLE = 2,       /* float */
};

static uint64_t bits64(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static uint32_t bits32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* An Event: the wall time, the step unless 0 (proto3 leaves defaults out, as TensorBoard's
 * writer does for its first event), then the file version or a summary of the scalars. */
static void put_event(struct buf *b, double wall, int64_t step, const char *version,
                      const struct tz_monitor_scalar *v, int n) {
  put_key(b, EVENT_WALL_TIME, WIRE_FIXED64);
  put_le(b, bits64(wall), 8);
  if (step != 0) {
    put_key(b, EVENT_STEP, WIRE_VARINT);
    put_varint(b, (uint64_t)step);
  }
  if (version)
    put_bytes(b, EVENT_FILE_VERSION, version, strlen(version));
  if (n == 0)
    return;
  struct buf s = {0};
  for (int i = 0; i < n; i++) {
    struct buf val = {0};
    put_bytes(&val, VALUE_TAG, v[i].tag, strlen(v[i].tag));
    put_key(&val, VALUE_SIMPLE, WIRE_FIXED32);
    put_le(&val, bits32((float)v[i].value), 4);
    put_bytes(&s, SUMMARY_VALUE, val.p, val.n);
    s.oom |= val.oom;
    free(val.p);
  }
  put_bytes(b, EVENT_SUMMARY, s.p, s.n);
  b->oom |= s.oom;
  free(s.p);
}

/* TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant. */
static uint32_t masked_crc(const void *p, size_t n) {
  uint32_t c = tz_crc32c(0, p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* One TFRecord around data: its length, the length's masked CRC, the data, the data's. */
static void put_record(struct buf *out, const struct buf *data) {
  unsigned char len[8];
  for (int i = 0; i < 8; i++)
    len[i] = (unsigned char)((uint64_t)data->n >> (8 * i));
  put(out, len, 8);
  put_le(out, masked_crc(len, 8), 4);
  put(out, data->p, data->n);
  put_le(out, masked_crc(data->p, data->n), 4);
  out->oom |= data->oom;
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- TensorBoard ---- */

/* TensorBoard's EventFileWriter numbers its writers in a process from 0 (the file name's last
 * part), so that two made in one second do not collide. */
static atomic_uint writer_uid;

/* One event appended to the event file as a record: in one fwrite, then a flush, so that when the
 * call returns the file ends on a whole record, for a reader to see while the run goes on. what
 * starts the message of a failed write. */
static int tb_append(tz_monitor *m, double wall, int64_t x, const char *version,
                     const struct tz_monitor_scalar *v, int n, const char *what) {
  struct buf ev = {0}, rec = {0};
  put_event(&ev, wall, x, version, v, n);
  put_record(&rec, &ev);
  free(ev.p);
  int rc = 0;
  if (rec.oom)
    rc = tz_err_set(TZ_ENOMEM, "tensorboard: out of memory");
  else if (fwrite(rec.p, 1, rec.n, m->tb) != rec.n || fflush(m->tb) != 0)
    rc = tz_err_errno(errno ? errno : EIO, "%s the event file %s", what, m->tb_path);
  free(rec.p);
  return rc;
}

/* The event file in dir, as TensorBoard's EventFileWriter names it, with its first event. */
static int tb_open(tz_monitor *m, const char *dir) {
  char host[256];
  if (gethostname(host, sizeof host) != 0)
    snprintf(host, sizeof host, "localhost");
  host[sizeof host - 1] = '\0';
  double wall = wall_now();
  unsigned uid = atomic_fetch_add(&writer_uid, 1);
  if (asprintf(&m->tb_path, "%s/events.out.tfevents.%010lld.%s.%ld.%u", dir, (long long)floor(wall),
               host, (long)getpid(), uid) < 0) {
    m->tb_path = NULL;
    return tz_err_set(TZ_ENOMEM, "tensorboard: out of memory");
  }
  m->tb = fopen(m->tb_path, "wxe");
  if (!m->tb)
    return tz_err_errno(errno,
                        "tensorboard.output_path, tensorboard.job_name: cannot create the "
                        "event file %s",
                        m->tb_path);
  return tb_append(m, wall, 0, "brain.Event:2", NULL, 0,
                   "tensorboard.output_path, tensorboard.job_name: cannot write");
}

static int tb_write(tz_monitor *m, int64_t x, const struct tz_monitor_scalar *v, int n) {
  return tb_append(m, wall_now(), x, NULL, v, n, "tensorboard: cannot write");
}

/* ---- CSV ---- */

/* The shortest decimal that reads back as a (finite, >= 0), as Python's repr finds it (David
 * Gay's shortest mode): the fewest significant digits, and of those the nearest to a. Into dig
 * (its digits, no trailing zero but for 0 itself) and *exp, the power of ten of the first. At
 * each count the correctly rounded digits are the nearest; when they do not read back, one
 * next to them may (the interval that reads back as a is not centred on it at a power of two),
 * and no other can. */
static void shortest(double a, char dig[24], int *exp) {
  char e[48], c[48];
  uint64_t m = 0;
  int x = 0, prec;
  for (prec = 0; prec <= 16; prec++) {
    snprintf(e, sizeof e, "%.*e", prec, a); /* d.ddde(+|-)XX */
    m = 0;
    const char *p = e;
    for (; *p != 'e'; p++)
      if (isdigit((unsigned char)*p))
        m = 10 * m + (uint64_t)(*p - '0');
    x = atoi(p + 1) - prec; /* a ~ m x 10^x */
    if (strtod(e, NULL) == a)
      break;
    int found = 0;
    for (int d = -1; d <= 1 && !found; d += 2) {
      if (m == 0 && d < 0)
        continue;
      snprintf(c, sizeof c, "%llue%d", (unsigned long long)(m + (uint64_t)(int64_t)d), x);
      if (strtod(c, NULL) == a) {
        m += (uint64_t)(int64_t)d;
        found = 1;
      }
    }
    if (found)
      break;
  }
  int nd = snprintf(dig, 24, "%llu", (unsigned long long)m);
  *exp = x + nd - 1;
  while (nd > 1 && dig[nd - 1] == '0')
    dig[--nd] = '\0';
}

/* v as Python's repr(float) writes it, as DeepSpeed's csv.writer does: the shortest digits
 * (shortest), positional when the decimal exponent is in [-4, 16) with at least one digit after
 * the point, else d.ddde+XX; nan, inf, -inf. */
static void py_repr(double v, char *out, size_t len) {
  if (isnan(v)) {
    snprintf(out, len, "nan");
    return;
  }
  if (isinf(v)) {
    snprintf(out, len, "%s", v > 0 ? "inf" : "-inf");
    return;
  }
  char dig[24];
  int exp;
  shortest(fabs(v), dig, &exp);
  int nd = (int)strlen(dig), neg = signbit(v) != 0;
  /* Built in a buffer that fits any double's repr, then copied out. */
  char r[48];
  size_t at = 0;
  if (neg)
    r[at++] = '-';
  int point = exp + 1; /* digits before the decimal point */
  if (exp < -4 || exp >= 16) {
    r[at++] = dig[0];
    if (nd > 1)
      at += (size_t)snprintf(r + at, sizeof r - at, ".%s", dig + 1);
    snprintf(r + at, sizeof r - at, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
  } else if (point <= 0) { /* 0.000ddd */
    r[at++] = '0';
    r[at++] = '.';
    for (int i = 0; i < -point; i++)
      r[at++] = '0';
    snprintf(r + at, sizeof r - at, "%s", dig);
  } else if (point >= nd) { /* ddd000.0 */
    memcpy(r + at, dig, (size_t)nd);
    at += (size_t)nd;
    for (int i = nd; i < point; i++)
      r[at++] = '0';
    snprintf(r + at, sizeof r - at, ".0");
  } else { /* dd.ddd */
    snprintf(r + at, sizeof r - at, "%.*s.%s", point, dig, dig + point);
  }
  snprintf(out, len, "%s", r);
}

/* The file of tag, opened (appended to, as DeepSpeed's 'a+') with its header row the first time
 * this monitor writes the tag: "step,<the tag's last '/' part>". */
static int csv_file(tz_monitor *m, const char *tag, FILE **out) {
  for (int i = 0; i < m->n_csv; i++)
    if (strcmp(m->csv[i].tag, tag) == 0) {
      *out = m->csv[i].f;
      return 0;
    }
  if (m->n_csv == TZ_MONITOR_MAX_TAGS)
    return tz_err_set(TZ_EINVAL, "csv_monitor: more than %d tags", TZ_MONITOR_MAX_TAGS);
  char name[TZ_MONITOR_MAX_TAG + 1], *path = NULL;
  snprintf(name, sizeof name, "%s", tag);
  for (char *c = name; *c; c++)
    if (*c == '/' || *c == ' ')
      *c = '_';
  /* DeepSpeed's log_dir + '/' + filename + '.csv' */
  if (asprintf(&path, "%s/%s.csv", m->csv_dir, name) < 0)
    return tz_err_set(TZ_ENOMEM, "csv_monitor: out of memory");
  FILE *f = fopen(path, "ae");
  if (!f) {
    int rc = tz_err_errno(errno, "csv_monitor: cannot open %s", path);
    free(path);
    return rc;
  }
  const char *header = strrchr(tag, '/') ? strrchr(tag, '/') + 1 : tag;
  if (fprintf(f, "step,%s\r\n", header) < 0) {
    int rc = tz_err_errno(errno ? errno : EIO, "csv_monitor: cannot write %s", path);
    fclose(f);
    free(path);
    return rc;
  }
  free(path);
  struct csv_file *c = &m->csv[m->n_csv++];
  snprintf(c->tag, sizeof c->tag, "%s", tag);
  c->f = f;
  *out = f;
  return 0;
}

static int csv_write(tz_monitor *m, int64_t x, const struct tz_monitor_scalar *v, int n) {
  for (int i = 0; i < n; i++) {
    FILE *f = NULL;
    TZ_CHECK(csv_file(m, v[i].tag, &f));
    char num[64];
    py_repr(v[i].value, num, sizeof num);
    if (fprintf(f, "%" PRId64 ",%s\r\n", x, num) < 0 || fflush(f) != 0)
      return tz_err_errno(errno ? errno : EIO, "csv_monitor: cannot write the file of %s in %s",
                          v[i].tag, m->csv_dir);
  }
  return 0;
}

/* ---- The monitor ---- */

int tz_monitor_create(const struct tz_config *cfg, tz_monitor **out) {
  *out = NULL;
  TZ_CHECK(tz_monitor_check(cfg));
  if (!cfg->tensorboard.enabled && !cfg->csv_monitor.enabled)
    return 0;
  tz_monitor *m = calloc(1, sizeof *m);
  if (!m)
    return tz_err_set(TZ_ENOMEM, "monitor: out of memory");
  char dir[4096];
  int rc = 0;
  if (cfg->tensorboard.enabled) {
    TZ_CHECK_GOTO(section_dir("tensorboard", &cfg->tensorboard, dir, sizeof dir), rc, fail);
    TZ_CHECK_GOTO(make_dir("tensorboard", dir), rc, fail);
    TZ_CHECK_GOTO(tb_open(m, dir), rc, fail);
  }
  if (cfg->csv_monitor.enabled) {
    TZ_CHECK_GOTO(section_dir("csv_monitor", &cfg->csv_monitor, dir, sizeof dir), rc, fail);
    TZ_CHECK_GOTO(make_dir("csv_monitor", dir), rc, fail);
    /* Its files are made as tags are first written: a probe shows now that they can be. */
    TZ_CHECK_GOTO(tz_ckpt_out_check("csv_monitor.output_path, csv_monitor.job_name:", dir, 0), rc,
                  fail);
    if (!(m->csv_dir = strdup(dir))) {
      rc = tz_err_set(TZ_ENOMEM, "monitor: out of memory");
      goto fail;
    }
  }
  *out = m;
  return 0;
fail:
  tz_monitor_destroy(m);
  return rc;
}

void tz_monitor_destroy(tz_monitor *m) {
  if (!m)
    return;
  if (m->tb)
    fclose(m->tb);
  for (int i = 0; i < m->n_csv; i++)
    fclose(m->csv[i].f);
  free(m->tb_path);
  free(m->csv_dir);
  free(m);
}

const char *tz_monitor_event_file(const tz_monitor *m) { return m->tb ? m->tb_path : NULL; }
const char *tz_monitor_csv_dir(const tz_monitor *m) { return m->csv_dir; }

int tz_monitor_write(tz_monitor *m, int64_t x, const struct tz_monitor_scalar *v, int n) {
  if (n < 0 || n > TZ_MONITOR_MAX_SCALARS)
    return tz_err_set(TZ_EINVAL, "monitor: %d scalars in one write (at most %d)", n,
                      TZ_MONITOR_MAX_SCALARS);
  for (int i = 0; i < n; i++) {
    size_t len = v[i].tag ? strlen(v[i].tag) : 0;
    if (len == 0 || len > TZ_MONITOR_MAX_TAG)
      return tz_err_set(TZ_EINVAL, "monitor: a tag of %zu bytes (1 to %d)", len,
                        TZ_MONITOR_MAX_TAG);
  }
  if (m->tb)
    TZ_CHECK(tb_write(m, x, v, n));
  if (m->csv_dir)
    TZ_CHECK(csv_write(m, x, v, n));
  return 0;
}

int tz_monitor_write_step(tz_monitor *m, const struct tz_monitor_step *s) {
  /* DeepSpeed's engine (runtime/engine.py, step) writes lr and, with fp16, loss_scale; its
   * train_loss (engine.py up to 0.18.2, pipe/engine.py) and eval_loss (pipe/engine.py) tags are
   * kept for the losses. */
  struct tz_monitor_scalar v[TZ_MONITOR_MAX_SCALARS];
  int n = 0;
  v[n++] = (struct tz_monitor_scalar){"Train/Samples/train_loss", s->train_loss};
  v[n++] = (struct tz_monitor_scalar){"Train/Samples/lr", s->lr};
  if (s->has_loss_scale)
    v[n++] = (struct tz_monitor_scalar){"Train/Samples/loss_scale", s->loss_scale};
  if (s->has_eval)
    v[n++] = (struct tz_monitor_scalar){"Train/Samples/eval_loss", s->eval_loss};
  v[n++] = (struct tz_monitor_scalar){"tierzero/grad_norm", s->grad_norm};
  v[n++] = (struct tz_monitor_scalar){"tierzero/step_time_s", s->step_s};
  v[n++] = (struct tz_monitor_scalar){"tierzero/tokens_per_s", s->tokens_per_s};
  return tz_monitor_write(m, s->samples, v, n);
}
