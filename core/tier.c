#include "core/tier.h"
#include "core/error.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/tier_impl.h"
#include "util/clock.h"
#include "util/crc32c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tz_tier_params_init(struct tz_tier_params *p) {
  memset(p, 0, sizeof *p);
  p->numa_node = -1;
  p->checksum = -1;
}

int tz_tier_create_from(tz_runtime *rt, const struct tz_tier_ops *ops,
                        const struct tz_tier_params *p, tz_tier **out) {
  const char *backend = ops->name;
  char why[256] = "";
  int rc = ops->probe ? ops->probe(why, sizeof why) : 0;
  if (rc < 0)
    return tz_err_set(rc, "%s", why);
  if (p->capacity == 0 && !p->base)
    return tz_err_set(TZ_EINVAL, "%s: capacity is 0", backend);
  /* A backend with settings parses its own string at init, before it makes anything; one
   * without refuses any, as its empty table says (no setting "x" (it has: none)). */
  if (p->settings && *p->settings && ops->n_settings == 0)
    return tz_settings_parse(backend, NULL, 0, p->settings, NULL);
  tz_tier *t = calloc(1, sizeof *t);
  if (!t)
    return tz_err_set(TZ_ENOMEM, "%s: no memory", backend);
  t->ops = ops;
  t->rt = rt;
  snprintf(t->name, sizeof t->name, "%s", p->name && *p->name ? p->name : backend);
  t->capacity = p->capacity;
  t->align = 256; /* every tensor 256-byte aligned wherever it lives (DESIGN.md) */
  t->io_align = 1;
  t->alloc_owner = t;
  pthread_mutex_init(&t->mu, NULL);
  rc = ops->init(t, p);
  if (rc < 0)
    goto fail;
  if (t->io_align > t->align)
    t->align = t->io_align;
  if (t->alloc_owner == t) {
    rc = tz_arena_create(t->capacity, t->align, &t->arena);
    if (rc < 0)
      goto fail_fini;
  }
  if (t->integrity) {
    uint64_t units = t->capacity / t->io_align + 1;
    t->csum = calloc(units, sizeof *t->csum);
    t->csum_valid = calloc((units + 63) / 64, sizeof *t->csum_valid);
    if (!t->csum || !t->csum_valid) {
      rc = tz_err_set(TZ_ENOMEM, "%s: no memory for %llu checksums", t->name,
                      (unsigned long long)units);
      goto fail_fini;
    }
  }
  rc = tz_runtime_attach(rt, t);
  if (rc < 0)
    goto fail_fini;
  TZ_INFO("tier %s (%s): %.3f GiB, alignment %llu, io alignment %llu%s", t->name, backend,
          (double)t->capacity / (1 << 30), (unsigned long long)t->align,
          (unsigned long long)t->io_align, t->integrity ? ", checksums on" : "");
  *out = t;
  return 0;
fail_fini:
  ops->fini(t);
fail:
  tz_arena_destroy(t->arena);
  free(t->csum);
  free(t->csum_valid);
  pthread_mutex_destroy(&t->mu);
  free(t);
  return rc;
}

void tz_tier_destroy(tz_tier *t) {
  if (!t)
    return;
  tz_runtime_detach(t->rt, t);
  t->ops->fini(t);
  tz_arena_destroy(t->arena);
  free(t->csum);
  free(t->csum_valid);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

const char *tz_tier_name(const tz_tier *t) { return t->name; }
const char *tz_tier_backend(const tz_tier *t) { return t->ops->name; }
uint64_t tz_tier_capacity(const tz_tier *t) { return t->capacity; }
uint64_t tz_tier_alignment(const tz_tier *t) { return t->align; }

void *tz_tier_host_ptr(tz_tier *t, uint64_t off) {
  return t->ops->host_ptr ? t->ops->host_ptr(t, off) : NULL;
}

void *tz_tier_device_ptr(tz_tier *t, uint64_t off) {
  return t->ops->device_ptr ? t->ops->device_ptr(t, off) : NULL;
}

int tz_tier_alloc(tz_tier *t, uint64_t bytes, tz_extent *out) {
  tz_tier *o = t->alloc_owner;
  uint64_t off;
  pthread_mutex_lock(&o->mu);
  int rc = tz_arena_alloc(o->arena, bytes, &off);
  struct tz_arena_stats st;
  if (rc < 0)
    tz_arena_stats(o->arena, &st);
  pthread_mutex_unlock(&o->mu);
  if (rc == TZ_EINVAL)
    return tz_err_set(rc, "%s: allocation of 0 bytes", t->name);
  if (rc < 0)
    return tz_err_set(TZ_ENOMEM,
                      "%s: cannot allocate %llu bytes: %llu of %llu bytes free, largest free "
                      "range %llu",
                      t->name, (unsigned long long)bytes, (unsigned long long)st.free,
                      (unsigned long long)st.capacity, (unsigned long long)st.largest_free);
  out->tier = t;
  out->offset = off;
  out->bytes = (bytes + o->align - 1) & ~(o->align - 1);
  return 0;
}

void tz_tier_free(tz_extent *e) {
  if (!e || !e->tier)
    return;
  tz_tier *o = e->tier->alloc_owner;
  pthread_mutex_lock(&o->mu);
  int rc = tz_arena_free(o->arena, e->offset);
  pthread_mutex_unlock(&o->mu);
  if (rc < 0)
    TZ_LOG_ERR("%s: freeing an extent it does not hold (offset %llu)", e->tier->name,
               (unsigned long long)e->offset);
  e->tier = NULL;
}

void tz_tier_arena_stats(const tz_tier *t, struct tz_arena_stats *out) {
  tz_tier *o = t->alloc_owner;
  pthread_mutex_lock(&o->mu);
  tz_arena_stats(o->arena, out);
  pthread_mutex_unlock(&o->mu);
}

void tz_tier_io_stats(const tz_tier *t, struct tz_tier_io_stats *out) {
  *out = (struct tz_tier_io_stats){
      .bytes_read = __atomic_load_n(&t->bytes_read, __ATOMIC_RELAXED),
      .bytes_written = __atomic_load_n(&t->bytes_written, __ATOMIC_RELAXED),
      .n_reads = __atomic_load_n(&t->n_reads, __ATOMIC_RELAXED),
      .n_writes = __atomic_load_n(&t->n_writes, __ATOMIC_RELAXED),
      .csum_errors = __atomic_load_n(&t->csum_errors, __ATOMIC_RELAXED),
      .resubmits = __atomic_load_n(&t->resubmits, __ATOMIC_RELAXED),
      .retries = __atomic_load_n(&t->retries, __ATOMIC_RELAXED),
  };
  if (t->ops->busy_ns) {
    out->busy_ns = t->ops->busy_ns(t);
    out->has_busy = 1;
  }
}

static void describe(tz_tier *t, uint64_t off, char *buf, size_t len) {
  if (t->ops->describe)
    t->ops->describe(t, off, buf, len);
  else
    snprintf(buf, len, "%s offset %llu", t->name, (unsigned long long)off);
}

static int check_io(const tz_extent *e, uint64_t off, const void *buf, uint64_t n, const char *op) {
  tz_tier *t = e->tier;
  if (!t)
    return tz_err_set(TZ_EINVAL, "%s: empty extent", op);
  if (off > e->bytes || n > e->bytes - off)
    return tz_err_set(TZ_EINVAL, "%s %s: [%llu, +%llu) is outside the extent of %llu bytes",
                      t->name, op, (unsigned long long)off, (unsigned long long)n,
                      (unsigned long long)e->bytes);
  uint64_t a = t->io_align;
  if (a > 1 && (off % a || n % a || (uintptr_t)buf % a))
    return tz_err_set(
        TZ_EINVAL, "%s %s: offset %llu, length %llu and buffer %p must be multiples of %llu",
        t->name, op, (unsigned long long)off, (unsigned long long)n, buf, (unsigned long long)a);
  return 0;
}

static void csum_record(tz_tier *t, uint64_t off, const void *buf, uint64_t n) {
  const unsigned char *p = buf;
  for (uint64_t u = off / t->io_align, i = 0; i < n; i += t->io_align, u++) {
    t->csum[u] = tz_crc32c(0, p + i, t->io_align);
    __atomic_fetch_or(&t->csum_valid[u / 64], 1ull << (u % 64), __ATOMIC_RELEASE);
  }
}

int tz_tier_write(const tz_extent *dst, uint64_t off, const void *buf, uint64_t n,
                  tz_fence **done) {
  TZ_CHECK(check_io(dst, off, buf, n, "write"));
  tz_tier *t = dst->tier;
  if (n == 0) {
    *done = tz_fence_completed(0);
    return *done ? 0 : TZ_ENOMEM;
  }
  if (t->integrity)
    csum_record(t, dst->offset + off, buf, n);
  TZ_CHECK(t->ops->write(t, dst->offset + off, buf, n, done));
  __atomic_add_fetch(&t->bytes_written, n, __ATOMIC_RELAXED);
  __atomic_add_fetch(&t->n_writes, 1, __ATOMIC_RELAXED);
  return 0;
}

struct verify {
  tz_tier *t;
  uint64_t off, n;
  const unsigned char *buf;
  tz_fence *out;
};

static void verify_done(void *arg, int rc) {
  struct verify *v = arg;
  tz_tier *t = v->t;
  char msg[512] = "";
  if (rc == 0) {
    for (uint64_t u = v->off / t->io_align, i = 0; i < v->n; i += t->io_align, u++) {
      if (!(__atomic_load_n(&t->csum_valid[u / 64], __ATOMIC_ACQUIRE) & (1ull << (u % 64))))
        continue; /* never written: nothing to check against */
      uint32_t c = tz_crc32c(0, v->buf + i, t->io_align);
      if (c != t->csum[u]) {
        char where[256];
        describe(t, u * t->io_align, where, sizeof where);
        snprintf(msg, sizeof msg,
                 "%s: checksum mismatch in the %llu-byte block at arena offset %llu (%s): "
                 "crc32c %08x, expected %08x",
                 t->name, (unsigned long long)t->io_align, (unsigned long long)(u * t->io_align),
                 where, c, t->csum[u]);
        __atomic_add_fetch(&t->csum_errors, 1, __ATOMIC_RELAXED);
        rc = TZ_ECHECKSUM;
        break;
      }
    }
  } else {
    snprintf(msg, sizeof msg, "%s", tz_err_msg());
  }
  tz_fence_signal_msg(v->out, rc, msg);
  tz_fence_release(v->out);
  free(v);
}

int tz_tier_read(const tz_extent *src, uint64_t off, void *buf, uint64_t n, tz_fence **done) {
  TZ_CHECK(check_io(src, off, buf, n, "read"));
  tz_tier *t = src->tier;
  if (n == 0) {
    *done = tz_fence_completed(0);
    return *done ? 0 : TZ_ENOMEM;
  }
  tz_fence *inner;
  if (!t->integrity) {
    TZ_CHECK(t->ops->read(t, src->offset + off, buf, n, done));
  } else {
    struct verify *v = malloc(sizeof *v);
    tz_fence *out = tz_fence_create();
    if (!v || !out) {
      free(v);
      tz_fence_release(out);
      return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
    }
    *v = (struct verify){t, src->offset + off, n, buf, tz_fence_retain(out)};
    int rc = t->ops->read(t, src->offset + off, buf, n, &inner);
    if (rc < 0) {
      free(v);
      tz_fence_release(out);
      tz_fence_release(out);
      return rc;
    }
    if (tz_fence_then(inner, verify_done, v) < 0) {
      rc = tz_fence_wait(inner, -1);
      verify_done(v, rc);
    }
    tz_fence_release(inner);
    *done = out;
  }
  __atomic_add_fetch(&t->bytes_read, n, __ATOMIC_RELAXED);
  __atomic_add_fetch(&t->n_reads, 1, __ATOMIC_RELAXED);
  return 0;
}

int tz_tier_write_sync(const tz_extent *dst, uint64_t off, const void *buf, uint64_t n) {
  tz_fence *f;
  TZ_CHECK(tz_tier_write(dst, off, buf, n, &f));
  int rc = tz_fence_wait(f, -1);
  tz_fence_release(f);
  return rc;
}

int tz_tier_read_sync(const tz_extent *src, uint64_t off, void *buf, uint64_t n) {
  tz_fence *f;
  TZ_CHECK(tz_tier_read(src, off, buf, n, &f));
  int rc = tz_fence_wait(f, -1);
  tz_fence_release(f);
  return rc;
}

int tz_tier_stream(const tz_extent *ext, void *buf, uint64_t bytes, uint64_t block, int depth,
                   int write, double *seconds) {
  if (block == 0 || depth < 1 || bytes % block)
    return tz_err_set(TZ_EINVAL, "stream: %llu bytes is not a whole number of %llu-byte blocks",
                      (unsigned long long)bytes, (unsigned long long)block);
  tz_fence **f = calloc((size_t)depth, sizeof *f);
  if (!f)
    return tz_err_set(TZ_ENOMEM, "stream: no memory");
  unsigned char *b = buf;
  uint64_t n_ops = bytes / block, issued = 0, done = 0;
  int rc = 0;
  uint64_t t0 = tz_now_ns();
  while (done < n_ops && rc == 0) {
    while (issued < n_ops && issued - done < (uint64_t)depth) {
      int slot = (int)(issued % (uint64_t)depth);
      void *p = b + (uint64_t)slot * block;
      rc = write ? tz_tier_write(ext, issued * block, p, block, &f[slot])
                 : tz_tier_read(ext, issued * block, p, block, &f[slot]);
      if (rc < 0)
        break;
      issued++;
    }
    if (rc < 0)
      break;
    int slot = (int)(done % (uint64_t)depth);
    rc = tz_fence_wait(f[slot], -1);
    tz_fence_release(f[slot]);
    done++;
  }
  *seconds = 1e-9 * (double)(tz_now_ns() - t0);
  while (done < issued) {
    int slot = (int)(done++ % (uint64_t)depth);
    tz_fence_wait(f[slot], -1);
    tz_fence_release(f[slot]);
  }
  free(f);
  return rc;
}

void tz_tier_set_copy_jitter(tz_runtime *rt, int max_us, uint64_t seed) {
  tz_pool_set_jitter(tz_runtime_copy_pool(rt), max_us, seed);
}
