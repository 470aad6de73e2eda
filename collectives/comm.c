/* The public collectives API: argument checks, then the backend's ops table. */
#include "collectives/comm_impl.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

double tz_comm_env_timeout(void) {
  /* Once: the launcher and every communicator read it, and one warning says it all. */
  static atomic_int warned;
  struct tz_config c;
  tz_config_defaults(&c);
  int rc = tz_config_env_key(&c, "tierzero.comm_timeout");
  double v = c.tierzero.comm_timeout;
  tz_config_free(&c);
  if (rc >= 0)
    return v;
  if (!atomic_exchange(&warned, 1))
    TZ_WARN("launch: %s; using 300", tz_err_msg());
  return 300;
}

double tz_comm_timeout(const struct tz_comm_params *p) {
  if (p && p->timeout_s > 0)
    return p->timeout_s;
  return tz_comm_env_timeout();
}

void tz_comm_params_init(struct tz_comm_params *p) {
  memset(p, 0, sizeof *p);
  p->device = -1;
  p->accum = TZ_F32;
}

/* Blocks of this many elements stay in L1 while the chunks are added into them. */
#define SUM_BLOCK 2048

static inline float load(const void *p, size_t i, enum tz_dtype dt) {
  switch (dt) {
  case TZ_BF16: return tz_bf16_to_f32(((const uint16_t *)p)[i]);
  case TZ_F16: return tz_f16_to_f32(((const uint16_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

static inline float round_to(float v, enum tz_dtype dt) {
  switch (dt) {
  case TZ_BF16: return tz_bf16_to_f32(tz_f32_to_bf16(v));
  case TZ_F16: return tz_f16_to_f32(tz_f32_to_f16(v));
  default: return v;
  }
}

void tz_comm_sum_chunks(void *out, const void *in, size_t stride, size_t n, int nchunks,
                        enum tz_dtype dt, int accum_f32) {
  size_t es = tz_dtype_size(dt);
  const char *base = in;
  if (dt == TZ_F32) {
    float acc[SUM_BLOCK];
    for (size_t b = 0; b < n; b += SUM_BLOCK) {
      size_t m = n - b < SUM_BLOCK ? n - b : SUM_BLOCK;
      memcpy(acc, base + b * 4, m * 4);
      for (int r = 1; r < nchunks; r++) {
        const float *x = (const float *)(base + ((size_t)r * stride + b) * 4);
        for (size_t i = 0; i < m; i++)
          acc[i] += x[i];
      }
      memcpy((char *)out + b * 4, acc, m * 4);
    }
    return;
  }
  float acc[SUM_BLOCK];
  for (size_t b = 0; b < n; b += SUM_BLOCK) {
    size_t m = n - b < SUM_BLOCK ? n - b : SUM_BLOCK;
    for (size_t i = 0; i < m; i++)
      acc[i] = load(base, b + i, dt);
    for (int r = 1; r < nchunks; r++) {
      const void *x = base + ((size_t)r * stride + b) * es;
      if (accum_f32)
        for (size_t i = 0; i < m; i++)
          acc[i] += load(x, i, dt);
      else
        for (size_t i = 0; i < m; i++)
          acc[i] = round_to(acc[i] + load(x, i, dt), dt);
    }
    uint16_t *o = (uint16_t *)out + b;
    if (dt == TZ_BF16)
      for (size_t i = 0; i < m; i++)
        o[i] = tz_f32_to_bf16(acc[i]);
    else
      for (size_t i = 0; i < m; i++)
        o[i] = tz_f32_to_f16(acc[i]);
  }
}

/* ---- Public wrappers ---- */

void tz_comm_destroy(tz_comm *c) {
  if (!c)
    return;
  c->ops->destroy(c->ctx);
  free(c);
}

int tz_comm_rank(const tz_comm *c) { return c->rank; }
int tz_comm_size(const tz_comm *c) { return c->size; }
const char *tz_comm_backend(const tz_comm *c) { return c->ops->name; }

static int check_common(tz_comm *c, tz_fence **done, const char *op) {
  if (!c)
    return tz_err_set(TZ_EINVAL, "comm: %s on a NULL comm", op);
  if (done)
    *done = NULL;
  return 0;
}

/* Hands the fence to the caller, or drops it when nobody waits. */
static int finish(int rc, tz_fence *f, tz_fence **done) {
  if (rc < 0)
    return rc;
  if (done)
    *done = f;
  else
    tz_fence_release(f);
  return 0;
}

static int check_reduce(tz_comm *c, const void *send, void *recv, size_t count, enum tz_dtype dt,
                        size_t mult, const char *op) {
  if (!send || !recv)
    return tz_err_set(TZ_EINVAL, "comm %s: %s with a NULL buffer", c->ops->name, op);
  if (tz_dtype_size(dt) == 0)
    return tz_err_set(TZ_EINVAL, "comm %s: %s: unknown dtype %d", c->ops->name, op, (int)dt);
  if (c->accum_mode != TZ_F32 && dt != TZ_F32 && dt != c->accum_mode)
    return tz_err_set(TZ_EINVAL,
                      "comm %s: %s of %s was configured to reduce in %s; a payload "
                      "is reduced in fp32 or in its own dtype",
                      c->ops->name, op, tz_dtype_name(dt), tz_dtype_name(c->accum_mode));
  if (count > SIZE_MAX / mult / tz_dtype_size(dt))
    return tz_err_set(TZ_EINVAL, "comm %s: %s of %zu elements overflows", c->ops->name, op, count);
  return 0;
}

int tz_comm_all_gather(tz_comm *c, const void *send, void *recv, size_t bytes, tz_fence *after,
                       tz_fence **done) {
  TZ_CHECK(check_common(c, done, "all_gather"));
  if (!send || !recv)
    return tz_err_set(TZ_EINVAL, "comm %s: all_gather with a NULL buffer", c->ops->name);
  if (bytes > SIZE_MAX / (size_t)c->size)
    return tz_err_set(TZ_EINVAL, "comm %s: all_gather of %zu bytes overflows", c->ops->name, bytes);
  tz_fence *f = NULL;
  int rc = c->ops->all_gather(c->ctx, send, recv, bytes, after, &f);
  return finish(rc, f, done);
}

int tz_comm_reduce_scatter(tz_comm *c, const void *send, void *recv, size_t count, enum tz_dtype dt,
                           tz_fence *after, tz_fence **done) {
  TZ_CHECK(check_common(c, done, "reduce_scatter"));
  TZ_CHECK(check_reduce(c, send, recv, count, dt, (size_t)c->size, "reduce_scatter"));
  tz_fence *f = NULL;
  int rc = c->ops->reduce_scatter(c->ctx, send, recv, count, dt, after, &f);
  return finish(rc, f, done);
}

int tz_comm_all_reduce(tz_comm *c, const void *send, void *recv, size_t count, enum tz_dtype dt,
                       tz_fence *after, tz_fence **done) {
  TZ_CHECK(check_common(c, done, "all_reduce"));
  TZ_CHECK(check_reduce(c, send, recv, count, dt, (size_t)c->size, "all_reduce"));
  tz_fence *f = NULL;
  int rc = c->ops->all_reduce(c->ctx, send, recv, count, dt, after, &f);
  return finish(rc, f, done);
}

int tz_comm_broadcast(tz_comm *c, void *buf, size_t bytes, int root, tz_fence *after,
                      tz_fence **done) {
  TZ_CHECK(check_common(c, done, "broadcast"));
  if (!buf)
    return tz_err_set(TZ_EINVAL, "comm %s: broadcast with a NULL buffer", c->ops->name);
  if (root < 0 || root >= c->size)
    return tz_err_set(TZ_EINVAL, "comm %s: broadcast from root %d in a world of %d", c->ops->name,
                      root, c->size);
  tz_fence *f = NULL;
  int rc = c->ops->broadcast(c->ctx, buf, bytes, root, after, &f);
  return finish(rc, f, done);
}

int tz_comm_barrier(tz_comm *c, tz_fence *after, tz_fence **done) {
  TZ_CHECK(check_common(c, done, "barrier"));
  tz_fence *f = NULL;
  int rc = c->ops->barrier(c->ctx, after, &f);
  return finish(rc, f, done);
}

void tz_comm_abort(tz_comm *c, int rc, const char *why) {
  if (c)
    c->ops->abort(c->ctx, rc, why ? why : "");
}

void *tz_comm_native(tz_comm *c, const char *what) {
  if (!c || !what || !c->ops->native)
    return NULL;
  return c->ops->native(c->ctx, what);
}
