/* fault: wraps another tier and injects errors, for tests. The spec (params.faults; programs take
 * it from the config's tierzero.faults or TZ_FAULTS) is a comma-separated list of items:
 *   KIND@N      the Nth operation (reads and writes counted together, from 1)
 *   KIND%P      each operation with probability P percent (seeded: seed=S, default 1)
 *   delay=US    every operation starts US microseconds late (on the fault tier's own thread),
 *               at most 10000000 (10 s)
 *   seed=S      the seed of the KIND%P draws (a whole number)
 * KIND is one of
 *   eio         the operation fails with EIO         eio-read, eio-write: only reads, writes
 *   enospc      a write fails with ENOSPC
 *   short       the operation is done as two partial operations (a transparent retry)
 *   flip        one bit of the data is flipped: after a read, or in what a write stores
 * and nvme-short@N, nvme-eagain@N are read by the nvme tier itself (its real resubmission path):
 * the Nth request it puts on its ring, resubmissions and retries counted, asks the kernel for
 * half its length, or is answered -EAGAIN without being submitted; every such item counts.
 * The wrapped tier shares its arena with this one and must only be used through it; its
 * checksums, when it keeps them, are kept here instead, above the faults, so that a flipped bit
 * is caught just as one flipped by the medium would be. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/tier_impl.h"
#include "util/mix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { F_EIO, F_EIO_READ, F_EIO_WRITE, F_ENOSPC, F_SHORT, F_FLIP, F_KINDS };
static const char *const kind_names[F_KINDS] = {"eio",    "eio-read", "eio-write",
                                                "enospc", "short",    "flip"};

struct rule {
  int kind;
  uint64_t at; /* fires at this operation, or 0 */
  double pct;  /* or with this probability */
};

struct fault {
  tz_tier *base;
  struct rule rules[32];
  int n_rules;
  unsigned delay_us;
  uint64_t seed;
  uint64_t ops; /* atomic */
  tz_pool *delay_pool;
  pthread_mutex_t mu;
  uint64_t injected[F_KINDS];
};

/* The longest delay=US: longer would look like a hang (a run's every operation waits it). */
#define MAX_DELAY_US 10000000ull

/* A whole number, all of s, into *v; 0 or -1. */
static int whole(const char *s, unsigned long long *v) {
  char *end = NULL;
  errno = 0;
  if (!(*s >= '0' && *s <= '9'))
    return -1;
  *v = strtoull(s, &end, 10);
  return errno || *end ? -1 : 0;
}

/* The refusal of item: the key it came from, the item, what would work. */
static int bad_item(const tz_tier *t, const char *item, const char *why) {
  return tz_err_set(TZ_EINVAL, "%s: tierzero.faults (or TZ_FAULTS): bad fault item \"%s\": %s",
                    t->name, item, why);
}

static int parse_item(tz_tier *t, struct fault *f, const char *item) {
  unsigned long long u;
  if (strncmp(item, "delay=", 6) == 0) {
    if (whole(item + 6, &u) < 0 || u > MAX_DELAY_US)
      return bad_item(t, item, "delay is in microseconds, 0 to 10000000 (10 s) per operation");
    f->delay_us = (unsigned)u;
    return 0;
  }
  if (strncmp(item, "seed=", 5) == 0) {
    if (whole(item + 5, &u) < 0)
      return bad_item(t, item, "seed=S takes a whole number");
    f->seed = u;
    return 0;
  }
  const char *sep = strpbrk(item, "@%");
  int kind = -1;
  for (int k = 0; sep && k < F_KINDS; k++)
    if ((size_t)(sep - item) == strlen(kind_names[k]) &&
        strncmp(item, kind_names[k], (size_t)(sep - item)) == 0)
      kind = k;
  if (kind < 0)
    return bad_item(t, item,
                    "expected KIND@N or KIND%P with KIND one of eio, eio-read, eio-write, enospc, "
                    "short, flip; or delay=US, seed=S");
  if (f->n_rules == 32)
    return bad_item(t, item, "at most 32 KIND@N and KIND%P items");
  struct rule *r = &f->rules[f->n_rules];
  if (*sep == '@') {
    if (whole(sep + 1, &u) < 0 || u == 0)
      return bad_item(t, item, "KIND@N takes an operation number, a whole number from 1");
    r->at = u;
  } else {
    char *end = NULL;
    double v = strtod(sep + 1, &end);
    if (end == sep + 1 || *end || !(v > 0 && v <= 100))
      return bad_item(t, item, "KIND%P takes a percentage above 0 and at most 100");
    r->pct = v;
  }
  r->kind = kind;
  f->n_rules++;
  return 0;
}

static int parse_spec(tz_tier *t, struct fault *f, const char *spec) {
  if (!spec || !*spec)
    return 0;
  char *copy = strdup(spec), *save = NULL;
  if (!copy)
    return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  int rc = 0;
  for (char *item = strtok_r(copy, ",", &save); item && rc == 0;
       item = strtok_r(NULL, ",", &save)) {
    while (*item == ' ')
      item++;
    if (strncmp(item, "nvme-", 5) != 0) /* those are the nvme tier's */
      rc = parse_item(t, f, item);
  }
  free(copy);
  return rc;
}

static int fault_init(tz_tier *t, const struct tz_tier_params *p) {
  if (!p->base)
    return tz_err_set(TZ_EINVAL, "%s: no base tier to wrap", t->name);
  struct fault *f = calloc(1, sizeof *f);
  if (!f)
    return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  f->base = p->base;
  f->seed = 1;
  pthread_mutex_init(&f->mu, NULL);
  int rc = parse_spec(t, f, p->faults);
  if (rc == 0 && f->delay_us)
    rc = tz_pool_create(2, "fault", &f->delay_pool);
  if (rc < 0) {
    pthread_mutex_destroy(&f->mu);
    free(f);
    return rc;
  }
  tz_tier *b = p->base;
  t->ctx = f;
  t->capacity = b->capacity;
  t->align = b->align;
  t->io_align = b->io_align;
  t->alloc_owner = b->alloc_owner;
  /* Checksums move above the faults. */
  t->integrity = b->integrity;
  b->integrity = 0;
  free(b->csum);
  free(b->csum_valid);
  b->csum = NULL;
  b->csum_valid = NULL;
  return 0;
}

static void fault_fini(tz_tier *t) {
  struct fault *f = t->ctx;
  if (!f)
    return;
  tz_pool_destroy(f->delay_pool);
  for (int k = 0; k < F_KINDS; k++)
    if (f->injected[k])
      TZ_INFO("%s: injected %s %llu times", t->name, kind_names[k],
              (unsigned long long)f->injected[k]);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

/* Which fault, if any, hits operation number op (a read when !write). */
static int pick(struct fault *f, uint64_t op, int write) {
  for (int i = 0; i < f->n_rules; i++) {
    const struct rule *r = &f->rules[i];
    int applies = r->kind == F_EIO || r->kind == F_SHORT || r->kind == F_FLIP ||
                  (r->kind == F_EIO_READ && !write) || (r->kind == F_EIO_WRITE && write) ||
                  (r->kind == F_ENOSPC && write);
    if (!applies)
      continue;
    if (r->at ? r->at == op
              : (double)(tz_mix_data(f->seed ^ tz_mix_data(op * 31 + (uint64_t)i)) % 1000000) <
                    r->pct * 1e4)
      return r->kind;
  }
  return -1;
}

/* One operation through the fault tier. */
struct fop {
  tz_tier *t;
  uint64_t off, n, op;
  unsigned char *buf;  /* the caller's */
  unsigned char *copy; /* flip on write: the altered data that is written */
  int write, kind;
  int stage; /* short: 0 first half, 1 second half */
  tz_fence *out;
};

static void fop_finish(struct fop *o, int rc, const char *msg) {
  tz_fence_signal_msg(o->out, rc, msg);
  tz_fence_release(o->out);
  free(o->copy);
  free(o);
}

static int fop_issue(struct fop *o);

static void fop_done(void *arg, int rc) {
  struct fop *o = arg;
  struct fault *f = o->t->ctx;
  if (rc < 0) {
    fop_finish(o, rc, tz_err_msg());
    return;
  }
  if (o->kind == F_SHORT && o->stage == 0) {
    o->stage = 1;
    rc = fop_issue(o);
    if (rc < 0)
      fop_finish(o, rc, tz_err_msg());
    return;
  }
  if (o->kind == F_FLIP && !o->write) {
    uint64_t bit = tz_mix_data(f->seed ^ o->op) % (o->n * 8);
    o->buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
  }
  fop_finish(o, 0, NULL);
}

static int fop_issue(struct fop *o) {
  struct fault *f = o->t->ctx;
  uint64_t off = o->off, n = o->n;
  unsigned char *buf = o->copy ? o->copy : o->buf;
  if (o->kind == F_SHORT) {
    uint64_t a = o->t->io_align, half = n / 2 / a * a;
    if (half == 0)
      half = n; /* too small to split: one operation */
    if (o->stage == 0) {
      n = half;
    } else {
      off += half;
      buf += half;
      n -= half;
      if (n == 0) {
        fop_done(o, 0);
        return 0;
      }
      __atomic_add_fetch(&o->t->resubmits, 1, __ATOMIC_RELAXED);
    }
  }
  tz_fence *inner;
  int rc = o->write ? f->base->ops->write(f->base, off, buf, n, &inner)
                    : f->base->ops->read(f->base, off, buf, n, &inner);
  if (rc < 0)
    return rc;
  if (tz_fence_then(inner, fop_done, o) < 0)
    fop_done(o, tz_fence_wait(inner, -1));
  tz_fence_release(inner);
  return 0;
}

static int fop_delayed(void *arg) {
  struct fop *o = arg;
  usleep(((struct fault *)o->t->ctx)->delay_us);
  int rc = fop_issue(o);
  if (rc < 0)
    fop_finish(o, rc, tz_err_msg());
  return 0;
}

static int fault_io(tz_tier *t, uint64_t off, unsigned char *buf, uint64_t n, int write,
                    tz_fence **done) {
  struct fault *f = t->ctx;
  uint64_t op = __atomic_add_fetch(&f->ops, 1, __ATOMIC_RELAXED);
  int kind = pick(f, op, write);
  tz_fence *out = tz_fence_create();
  struct fop *o = calloc(1, sizeof *o);
  if (!out || !o) {
    tz_fence_release(out);
    free(o);
    return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  }
  *o = (struct fop){.t = t,
                    .off = off,
                    .n = n,
                    .op = op,
                    .buf = buf,
                    .write = write,
                    .kind = kind,
                    .out = tz_fence_retain(out)};
  if (kind >= 0) {
    pthread_mutex_lock(&f->mu);
    f->injected[kind]++;
    pthread_mutex_unlock(&f->mu);
    TZ_DEBUG("%s: injecting %s at operation %llu", t->name, kind_names[kind],
             (unsigned long long)op);
  }
  *done = out;
  if (kind == F_EIO || kind == F_EIO_READ || kind == F_EIO_WRITE || kind == F_ENOSPC) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "%s: %s of %llu bytes at offset %llu failed: injected %s at "
             "operation %llu",
             t->name, write ? "write" : "read", (unsigned long long)n, (unsigned long long)off,
             kind == F_ENOSPC ? "ENOSPC" : "EIO", (unsigned long long)op);
    fop_finish(o, kind == F_ENOSPC ? TZ_ENOSPC : TZ_EIO, msg);
    return 0;
  }
  if (kind == F_FLIP && write) {
    if (posix_memalign((void **)&o->copy, t->io_align > 64 ? t->io_align : 64, n) != 0) {
      o->copy = NULL;
      fop_finish(o, TZ_ENOMEM, "fault: no memory");
      return 0;
    }
    memcpy(o->copy, buf, n);
    uint64_t bit = tz_mix_data(f->seed ^ op) % (n * 8);
    o->copy[bit / 8] ^= (unsigned char)(1u << (bit % 8));
  }
  int rc = f->delay_pool ? tz_pool_submit(f->delay_pool, fop_delayed, o, NULL) : fop_issue(o);
  if (rc < 0) {
    tz_fence_release(out);
    *done = NULL;
    fop_finish(o, rc, tz_err_msg());
    return rc;
  }
  return 0;
}

static int fault_read(tz_tier *t, uint64_t off, void *buf, uint64_t n, tz_fence **done) {
  return fault_io(t, off, buf, n, 0, done);
}

static int fault_write(tz_tier *t, uint64_t off, const void *buf, uint64_t n, tz_fence **done) {
  return fault_io(t, off, (unsigned char *)buf, n, 1, done);
}

static void *fault_host_ptr(tz_tier *t, uint64_t off) {
  struct fault *f = t->ctx;
  return f->base->ops->host_ptr ? f->base->ops->host_ptr(f->base, off) : NULL;
}

static void *fault_device_ptr(tz_tier *t, uint64_t off) {
  struct fault *f = t->ctx;
  return f->base->ops->device_ptr ? f->base->ops->device_ptr(f->base, off) : NULL;
}

static void fault_describe(tz_tier *t, uint64_t off, char *buf, size_t len) {
  struct fault *f = t->ctx;
  if (f->base->ops->describe)
    f->base->ops->describe(f->base, off, buf, len);
  else
    snprintf(buf, len, "%s offset %llu", f->base->name, (unsigned long long)off);
}

const struct tz_tier_ops tz_tier_fault_ops = {
    .name = "fault",
    .init = fault_init,
    .fini = fault_fini,
    .read = fault_read,
    .write = fault_write,
    .host_ptr = fault_host_ptr,
    .device_ptr = fault_device_ptr,
    .describe = fault_describe,
};
