/* fault: wraps another tier and injects errors, for tests. The spec (params.faults; programs take
 * it from the config's tierzero.faults or TZ_FAULTS) is core/faults.h's grammar. Each KIND:
 *   eio         the operation fails with EIO         eio-read, eio-write: only reads, writes
 *   enospc      a write fails with ENOSPC
 *   short       the operation is done as two partial operations (a transparent retry)
 *   flip        one bit of the data is flipped: after a read, or in what a write stores
 * delay=US runs every operation US microseconds late on the fault tier's own thread; the nvme-*
 * items are the nvme tier's (its real resubmission path), ignored here.
 * The wrapped tier shares its arena with this one and must only be used through it; its
 * checksums, when it keeps them, are kept here instead, above the faults, so that a flipped bit
 * is caught just as one flipped by the medium would be. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/faults.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/tier_impl.h"
#include "util/mix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fault {
  tz_tier *base;
  struct tz_faults spec;
  uint64_t ops; /* atomic */
  tz_pool *delay_pool;
  pthread_mutex_t mu;
  uint64_t injected[TZ_FAULT_KINDS];
};

static int fault_init(tz_tier *t, const struct tz_tier_params *p) {
  if (!p->base)
    return tz_err_set(TZ_EINVAL, "%s: no base tier to wrap", t->name);
  struct fault *f = calloc(1, sizeof *f);
  if (!f)
    return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  f->base = p->base;
  pthread_mutex_init(&f->mu, NULL);
  int rc = tz_faults_parse(p->faults, &f->spec);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    rc = tz_err_set(rc, "%s: %s", t->name, why);
  }
  if (rc == 0 && f->spec.delay_us)
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
  for (int k = 0; k < TZ_FAULT_KINDS; k++)
    if (f->injected[k])
      TZ_INFO("%s: injected %s %llu times", t->name, tz_fault_kind_name((enum tz_fault_kind)k),
              (unsigned long long)f->injected[k]);
  pthread_mutex_destroy(&f->mu);
  free(f);
}

/* Which fault, if any, hits operation number op (a read when !write). */
static int pick(struct fault *f, uint64_t op, int write) {
  for (int i = 0; i < f->spec.n_rules; i++) {
    const struct tz_fault_rule *r = &f->spec.rules[i];
    int applies = r->kind == TZ_FAULT_EIO || r->kind == TZ_FAULT_SHORT ||
                  r->kind == TZ_FAULT_FLIP || (r->kind == TZ_FAULT_EIO_READ && !write) ||
                  (r->kind == TZ_FAULT_EIO_WRITE && write) || (r->kind == TZ_FAULT_ENOSPC && write);
    if (!applies)
      continue;
    if (r->at ? r->at == op
              : (double)(tz_mix_data(f->spec.seed ^ tz_mix_data(op * 31 + (uint64_t)i)) % 1000000) <
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
  if (o->kind == TZ_FAULT_SHORT && o->stage == 0) {
    o->stage = 1;
    rc = fop_issue(o);
    if (rc < 0)
      fop_finish(o, rc, tz_err_msg());
    return;
  }
  if (o->kind == TZ_FAULT_FLIP && !o->write) {
    uint64_t bit = tz_mix_data(f->spec.seed ^ o->op) % (o->n * 8);
    o->buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
  }
  fop_finish(o, 0, NULL);
}

static int fop_issue(struct fop *o) {
  struct fault *f = o->t->ctx;
  uint64_t off = o->off, n = o->n;
  unsigned char *buf = o->copy ? o->copy : o->buf;
  if (o->kind == TZ_FAULT_SHORT) {
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
  usleep(((struct fault *)o->t->ctx)->spec.delay_us);
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
    TZ_DEBUG("%s: injecting %s at operation %llu", t->name,
             tz_fault_kind_name((enum tz_fault_kind)kind), (unsigned long long)op);
  }
  *done = out;
  if (kind == TZ_FAULT_EIO || kind == TZ_FAULT_EIO_READ || kind == TZ_FAULT_EIO_WRITE ||
      kind == TZ_FAULT_ENOSPC) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "%s: %s of %llu bytes at offset %llu failed: injected %s at "
             "operation %llu",
             t->name, write ? "write" : "read", (unsigned long long)n, (unsigned long long)off,
             kind == TZ_FAULT_ENOSPC ? "ENOSPC" : "EIO", (unsigned long long)op);
    fop_finish(o, kind == TZ_FAULT_ENOSPC ? TZ_ENOSPC : TZ_EIO, msg);
    return 0;
  }
  if (kind == TZ_FAULT_FLIP && write) {
    if (posix_memalign((void **)&o->copy, t->io_align > 64 ? t->io_align : 64, n) != 0) {
      o->copy = NULL;
      fop_finish(o, TZ_ENOMEM, "fault: no memory");
      return 0;
    }
    memcpy(o->copy, buf, n);
    uint64_t bit = tz_mix_data(f->spec.seed ^ op) % (n * 8);
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
