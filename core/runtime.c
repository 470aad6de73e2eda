#include "core/runtime.h"
#include "core/error.h"
#include "core/internal.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/tier_impl.h"
#include "util/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PAIRS 64
#define MAX_SLOTS 256

struct pair {
  const tz_tier *src, *dst;
  struct tz_pair_stats s;
  int in_flight;
  uint64_t busy_since_ns;
};

struct staged;

struct tz_runtime {
  struct tz_runtime_params p;
  const struct tz_tier_ops *host_ops; /* the backend of staging and other core host tiers */
  tz_progress *pe;
  tz_pool *copy_pool;
  pthread_mutex_t mu; /* tiers, pairs, slots */
  tz_tier *tiers;
  tz_tier *staging; /* a host tier that holds the staging slots */
  tz_extent staging_ext;
  unsigned char *slot_base;
  int n_slots;
  int free_slots[MAX_SLOTS];
  int n_free;
  struct staged *waiting, **waiting_tail; /* transfers waiting for a slot, FIFO */
  struct pair pairs[MAX_PAIRS];
  int n_pairs;
  int in_flight; /* atomic: transfers not yet completed */
};

void tz_runtime_params_init(struct tz_runtime_params *p) {
  memset(p, 0, sizeof *p);
  p->staging_bytes = 64ull << 20;
  p->chunk_bytes = 4ull << 20;
  p->numa_node = -1;
}

tz_progress *tz_runtime_progress(tz_runtime *rt) { return rt->pe; }
uint64_t tz_runtime_chunk_bytes(const tz_runtime *rt) { return rt->p.chunk_bytes; }
struct tz_pool *tz_runtime_copy_pool(tz_runtime *rt) {
  return rt->copy_pool;
}

int tz_runtime_host_tier(tz_runtime *rt, const struct tz_tier_params *p, tz_tier **out) {
  return tz_tier_create_from(rt, rt->host_ops, p, out);
}

int tz_runtime_create_from(const struct tz_runtime_params *p, const struct tz_tier_ops *host,
                           tz_runtime **out) {
  tz_runtime *rt = calloc(1, sizeof *rt);
  if (!rt)
    return tz_err_set(TZ_ENOMEM, "runtime: no memory");
  rt->host_ops = host;
  if (p)
    rt->p = *p;
  else
    tz_runtime_params_init(&rt->p);
  if (!rt->p.chunk_bytes)
    rt->p.chunk_bytes = 4ull << 20;
  if (!rt->p.staging_bytes)
    rt->p.staging_bytes = 64ull << 20;
  if (rt->p.staging_bytes < 2 * rt->p.chunk_bytes)
    rt->p.staging_bytes = 2 * rt->p.chunk_bytes;
  if (rt->p.staging_bytes / rt->p.chunk_bytes > MAX_SLOTS)
    rt->p.staging_bytes = rt->p.chunk_bytes * MAX_SLOTS;
  pthread_mutex_init(&rt->mu, NULL);
  rt->waiting_tail = &rt->waiting;
  int rc = tz_progress_create(&rt->pe);
  if (rc < 0)
    goto fail;
  rc = tz_pool_create(2, "copy", &rt->copy_pool);
  if (rc < 0)
    goto fail;
  /* Staging memory is a host tier like any other, so every backend registers it (pinned for
   * the GPU, fixed buffers for io_uring) through the same hook. */
  struct tz_tier_params tp;
  tz_tier_params_init(&tp);
  tp.name = "staging";
  tp.capacity = rt->p.staging_bytes;
  tp.numa_node = rt->p.numa_node;
  rc = tz_runtime_host_tier(rt, &tp, &rt->staging);
  if (rc < 0)
    goto fail;
  rc = tz_tier_alloc(rt->staging, rt->p.staging_bytes, &rt->staging_ext);
  if (rc < 0)
    goto fail;
  rt->slot_base = tz_tier_host_ptr(rt->staging, rt->staging_ext.offset);
  rt->n_slots = (int)(rt->p.staging_bytes / rt->p.chunk_bytes);
  for (int i = 0; i < rt->n_slots; i++)
    rt->free_slots[rt->n_free++] = rt->n_slots - 1 - i;
  *out = rt;
  return 0;
fail:
  tz_runtime_destroy(rt);
  return rc;
}

void tz_runtime_destroy(tz_runtime *rt) {
  if (!rt)
    return;
  /* Transfers in flight complete through the engine; let them drain before tearing down. */
  while (__atomic_load_n(&rt->in_flight, __ATOMIC_ACQUIRE) > 0)
    tz_progress_kick(rt->pe), usleep(100);
  /* Tiers are destroyed newest first: a fault tier before the base it wraps, hbm before host. */
  while (rt->tiers)
    tz_tier_destroy(rt->tiers);
  tz_pool_destroy(rt->copy_pool);
  tz_progress_destroy(rt->pe);
  pthread_mutex_destroy(&rt->mu);
  free(rt);
}

/* Host arenas are registered with every tier that wants them (hbm: cudaHostRegister; nvme:
 * io_uring fixed buffers), whichever of the two was created first. */
static int host_arena(tz_tier *t, void **base) {
  if (!t->ops->host_ptr || t->alloc_owner != t)
    return 0;
  *base = t->ops->host_ptr(t, 0);
  return *base != NULL;
}

int tz_runtime_attach(tz_runtime *rt, tz_tier *t) {
  pthread_mutex_lock(&rt->mu);
  int rc = 0;
  void *base;
  for (tz_tier *o = rt->tiers; o && rc == 0; o = o->next) {
    if (host_arena(o, &base) && t->ops->register_host)
      rc = t->ops->register_host(t, base, o->capacity);
    if (rc == 0 && host_arena(t, &base) && o->ops->register_host)
      rc = o->ops->register_host(o, base, t->capacity);
  }
  if (rc == 0) {
    t->next = rt->tiers;
    rt->tiers = t;
  }
  pthread_mutex_unlock(&rt->mu);
  return rc;
}

void tz_runtime_detach(tz_runtime *rt, tz_tier *t) {
  pthread_mutex_lock(&rt->mu);
  for (tz_tier **pp = &rt->tiers; *pp; pp = &(*pp)->next)
    if (*pp == t) {
      *pp = t->next;
      break;
    }
  void *base;
  for (tz_tier *o = rt->tiers; o; o = o->next) {
    if (host_arena(t, &base) && o->ops->unregister_host)
      o->ops->unregister_host(o, base);
    if (host_arena(o, &base) && t->ops->unregister_host)
      t->ops->unregister_host(t, base);
  }
  pthread_mutex_unlock(&rt->mu);
}

/* ---- counters per tier pair ---- */

static struct pair *pair_get(tz_runtime *rt, const tz_tier *src, const tz_tier *dst) {
  for (int i = 0; i < rt->n_pairs; i++)
    if (rt->pairs[i].src == src && rt->pairs[i].dst == dst)
      return &rt->pairs[i];
  if (rt->n_pairs == MAX_PAIRS)
    return NULL;
  struct pair *p = &rt->pairs[rt->n_pairs++];
  memset(p, 0, sizeof *p);
  p->src = src;
  p->dst = dst;
  p->s.src = src->name;
  p->s.dst = dst->name;
  return p;
}

static void pair_begin(tz_runtime *rt, const tz_tier *src, const tz_tier *dst, uint64_t n,
                       int staged) {
  pthread_mutex_lock(&rt->mu);
  struct pair *p = pair_get(rt, src, dst);
  if (p) {
    p->s.bytes += n;
    p->s.transfers++;
    p->s.staged += (uint64_t)staged;
    if (p->in_flight++ == 0)
      p->busy_since_ns = tz_now_ns();
  }
  pthread_mutex_unlock(&rt->mu);
  __atomic_add_fetch(&rt->in_flight, 1, __ATOMIC_ACQ_REL);
}

static void pair_end(tz_runtime *rt, const tz_tier *src, const tz_tier *dst) {
  pthread_mutex_lock(&rt->mu);
  struct pair *p = pair_get(rt, src, dst);
  if (p && --p->in_flight == 0)
    p->s.busy_s += 1e-9 * (double)(tz_now_ns() - p->busy_since_ns);
  pthread_mutex_unlock(&rt->mu);
  __atomic_sub_fetch(&rt->in_flight, 1, __ATOMIC_ACQ_REL);
}

int tz_runtime_pair_stats(tz_runtime *rt, struct tz_pair_stats *out, int max) {
  pthread_mutex_lock(&rt->mu);
  int n = rt->n_pairs;
  for (int i = 0; i < n && i < max; i++) {
    out[i] = rt->pairs[i].s;
    if (rt->pairs[i].in_flight)
      out[i].busy_s += 1e-9 * (double)(tz_now_ns() - rt->pairs[i].busy_since_ns);
  }
  pthread_mutex_unlock(&rt->mu);
  return n;
}

/* ---- transfers ---- */

/* One transfer: completes `out` when its last stage has. */
struct xfer {
  tz_runtime *rt;
  const tz_tier *src, *dst;
  tz_fence *out;
};

static void xfer_done(void *arg, int rc) {
  struct xfer *x = arg;
  pair_end(x->rt, x->src, x->dst);
  tz_fence_signal_msg(x->out, rc, rc < 0 ? tz_err_msg() : NULL);
  tz_fence_release(x->out);
  free(x);
}

/* A staged transfer: chunks move src -> slot -> dst, up to `depth` chunks in flight, so the
 * read of chunk k+1 overlaps the write of chunk k. Slots are shared by every staged transfer
 * of the runtime; a transfer with no slot waits in a FIFO and is resumed when one frees. */
struct staged {
  tz_runtime *rt;
  tz_extent src, dst;
  uint64_t src_off, dst_off, n;
  uint64_t next;     /* bytes issued */
  uint64_t finished; /* bytes written */
  int active;        /* chunks in flight */
  int rc;
  char msg[384];
  tz_fence *out;
  int queued;
  struct staged *next_wait;
  pthread_mutex_t mu;
};

struct chunk {
  struct staged *s;
  int slot;
  uint64_t off, len;
};

static void staged_pump(struct staged *s);

static void staged_finish(struct staged *s) {
  tz_runtime *rt = s->rt;
  pair_end(rt, s->src.tier, s->dst.tier);
  tz_fence_signal_msg(s->out, s->rc, s->msg);
  tz_fence_release(s->out);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static void slot_release(tz_runtime *rt, int slot) {
  pthread_mutex_lock(&rt->mu);
  rt->free_slots[rt->n_free++] = slot;
  struct staged *w = rt->waiting;
  if (w) {
    rt->waiting = w->next_wait;
    if (!rt->waiting)
      rt->waiting_tail = &rt->waiting;
    w->queued = 0;
  }
  pthread_mutex_unlock(&rt->mu);
  if (w)
    staged_pump(w);
}

static void chunk_end(struct chunk *c, int rc) {
  struct staged *s = c->s;
  tz_runtime *rt = s->rt;
  int slot = c->slot;
  pthread_mutex_lock(&s->mu);
  if (rc < 0 && s->rc == 0) {
    s->rc = rc;
    snprintf(s->msg, sizeof s->msg, "%s", tz_err_msg());
  }
  s->active--;
  s->finished += c->len;
  int last = s->active == 0 && (s->rc < 0 || s->next == s->n) && !s->queued;
  pthread_mutex_unlock(&s->mu);
  free(c);
  slot_release(rt, slot);
  if (last)
    staged_finish(s);
  else
    staged_pump(s);
}

static void chunk_written(void *arg, int rc) { chunk_end(arg, rc); }

static void chunk_read(void *arg, int rc) {
  struct chunk *c = arg;
  struct staged *s = c->s;
  if (rc < 0) {
    chunk_end(c, rc);
    return;
  }
  tz_fence *f;
  rc = tz_tier_write(&s->dst, s->dst_off + c->off,
                     s->rt->slot_base + (uint64_t)c->slot * s->rt->p.chunk_bytes, c->len, &f);
  if (rc < 0) {
    chunk_end(c, rc);
    return;
  }
  if (tz_fence_then(f, chunk_written, c) < 0)
    chunk_end(c, tz_fence_wait(f, -1));
  tz_fence_release(f);
}

/* Issues as many chunks as slots and the depth allow. Safe to call from any thread. */
static void staged_pump(struct staged *s) {
  tz_runtime *rt = s->rt;
  const int depth = 4;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    if (s->rc < 0 || s->next == s->n || s->active >= depth || s->queued) {
      pthread_mutex_unlock(&s->mu);
      return;
    }
    pthread_mutex_lock(&rt->mu);
    if (rt->n_free == 0) {
      /* No slot: wait in line. A transfer with chunks in flight is resumed by its own. */
      if (s->active == 0) {
        s->queued = 1;
        s->next_wait = NULL;
        *rt->waiting_tail = s;
        rt->waiting_tail = &s->next_wait;
      }
      pthread_mutex_unlock(&rt->mu);
      pthread_mutex_unlock(&s->mu);
      return;
    }
    int slot = rt->free_slots[--rt->n_free];
    pthread_mutex_unlock(&rt->mu);
    uint64_t len = s->n - s->next;
    if (len > rt->p.chunk_bytes)
      len = rt->p.chunk_bytes;
    struct chunk *c = malloc(sizeof *c);
    if (!c) {
      s->rc = tz_err_set(TZ_ENOMEM, "transfer: no memory for a chunk");
      snprintf(s->msg, sizeof s->msg, "%s", tz_err_msg());
      pthread_mutex_unlock(&s->mu);
      slot_release(rt, slot);
      return;
    }
    *c = (struct chunk){s, slot, s->next, len};
    s->next += len;
    s->active++;
    pthread_mutex_unlock(&s->mu);
    tz_fence *f;
    int rc = tz_tier_read(&s->src, s->src_off + c->off,
                          rt->slot_base + (uint64_t)slot * rt->p.chunk_bytes, len, &f);
    if (rc < 0) {
      chunk_end(c, rc);
      return;
    }
    if (tz_fence_then(f, chunk_read, c) < 0)
      chunk_read(c, tz_fence_wait(f, -1));
    tz_fence_release(f);
  }
}

int tz_transfer(tz_runtime *rt, const tz_extent *dst, uint64_t dst_off, const tz_extent *src,
                uint64_t src_off, uint64_t n, tz_fence **done) {
  tz_tier *st = src->tier, *dt = dst->tier;
  if (!st || !dt)
    return tz_err_set(TZ_EINVAL, "transfer: empty extent");
  if (src_off > src->bytes || n > src->bytes - src_off || dst_off > dst->bytes ||
      n > dst->bytes - dst_off)
    return tz_err_set(TZ_EINVAL, "transfer %s -> %s: %llu bytes at %llu -> %llu out of range",
                      st->name, dt->name, (unsigned long long)n, (unsigned long long)src_off,
                      (unsigned long long)dst_off);
  tz_fence *f = NULL;
  int rc = TZ_ENOTSUP;
  void *sp = tz_tier_host_ptr(st, src->offset + src_off);
  void *dp = tz_tier_host_ptr(dt, dst->offset + dst_off);
  if (sp && dp && dt->io_align == 1) {
    rc = tz_tier_write(dst, dst_off, sp, n, &f);
  } else if (sp && (dt->io_align == 1 || (uintptr_t)sp % dt->io_align == 0)) {
    rc = tz_tier_write(dst, dst_off, sp, n, &f);
  } else if (dp && (st->io_align == 1 || (uintptr_t)dp % st->io_align == 0)) {
    rc = tz_tier_read(src, src_off, dp, n, &f);
  } else if (dt->ops->copy) {
    rc = dt->ops->copy(dt, dst->offset + dst_off, st, src->offset + src_off, n, &f);
    if (rc < 0 && rc != TZ_ENOTSUP)
      return rc;
  }
  if (rc == 0) {
    struct xfer *x = malloc(sizeof *x);
    tz_fence *out = tz_fence_create();
    if (!x || !out) {
      free(x);
      tz_fence_release(out);
      tz_fence_wait(f, -1);
      tz_fence_release(f);
      return tz_err_set(TZ_ENOMEM, "transfer: no memory");
    }
    *x = (struct xfer){rt, st, dt, tz_fence_retain(out)};
    /* out completes with f and only counters in between: a device lane may wait on f's event. */
    tz_fence_forward(out, f);
    pair_begin(rt, st, dt, n, 0);
    if (tz_fence_then(f, xfer_done, x) < 0)
      xfer_done(x, tz_fence_wait(f, -1));
    tz_fence_release(f);
    *done = out;
    return 0;
  }
  if (rc != TZ_ENOTSUP)
    return rc;
  /* Neither side is host memory and the pair has no direct path: stage through pinned host
   * buffers. Counted, never silent. */
  uint64_t a = st->io_align > dt->io_align ? st->io_align : dt->io_align;
  if (rt->p.chunk_bytes % a)
    return tz_err_set(TZ_EINVAL, "transfer %s -> %s: chunk of %llu bytes is not a multiple of %llu",
                      st->name, dt->name, (unsigned long long)rt->p.chunk_bytes,
                      (unsigned long long)a);
  struct staged *s = calloc(1, sizeof *s);
  tz_fence *out = tz_fence_create();
  if (!s || !out) {
    free(s);
    tz_fence_release(out);
    return tz_err_set(TZ_ENOMEM, "transfer: no memory");
  }
  s->rt = rt;
  s->src = *src;
  s->dst = *dst;
  s->src_off = src_off;
  s->dst_off = dst_off;
  s->n = n;
  s->out = tz_fence_retain(out);
  pthread_mutex_init(&s->mu, NULL);
  pair_begin(rt, st, dt, n, 1);
  TZ_DEBUG("transfer %s -> %s: %llu bytes staged in %llu-byte chunks", st->name, dt->name,
           (unsigned long long)n, (unsigned long long)rt->p.chunk_bytes);
  *done = out;
  if (n == 0)
    staged_finish(s);
  else
    staged_pump(s);
  return 0;
}
