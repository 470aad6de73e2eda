/* The "single" backend: a world of one, host buffers. Gathers and broadcasts are copies;
 * reductions go through the same summation as mpi (one chunk), so a bf16 payload is rounded the
 * same way as it would be on P ranks. A collective runs when its `after` fence completes: at once
 * on the calling thread, or on the thread that signals the fence. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm_impl.h"
#include "core/error.h"
#include "core/log.h"

struct single_ctx {
  enum tz_dtype accum;
  atomic_int failed; /* the first error; later collectives are canceled */
};

struct single_op {
  struct single_ctx *ctx;
  void *dst;
  const void *src;
  size_t n;   /* bytes to copy, or elements to reduce */
  int reduce; /* 1: n elements of dt through the summation */
  enum tz_dtype dt;
  tz_fence *done;
};

static int single_probe(char *why, size_t why_len) {
  (void)why, (void)why_len;
  return 0;
}

static int single_create(struct tz_bootstrap *bs, const struct tz_comm_params *p, int *rank,
                         int *size, void **out) {
  if (bs->size != 1)
    return tz_err_set(TZ_ECONFIG,
                      "comm single: the launch (%s) describes %d ranks; single is a "
                      "world of one",
                      tz_launch_kind_name(bs->kind), bs->size);
  struct single_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return tz_err_set(TZ_ENOMEM, "comm single: out of memory");
  ctx->accum = p->accum;
  *rank = 0;
  *size = 1;
  *out = ctx;
  return 0;
}

static void single_destroy(void *ctx) { free(ctx); }

static void run(struct single_op *op, int rc) {
  int prior = atomic_load(&op->ctx->failed);
  if (rc == 0 && prior)
    rc = tz_err_set(TZ_ECANCELED, "comm single: canceled: an earlier collective failed (%s)",
                    tz_strerror(prior));
  if (rc == 0 && op->n) {
    if (op->reduce)
      tz_comm_sum_chunks(op->dst, op->src, op->n, op->n, 1, op->dt,
                         op->ctx->accum == TZ_F32 || op->dt == TZ_F32);
    else if (op->dst != op->src)
      memmove(op->dst, op->src, op->n);
  }
  if (rc < 0 && !prior) {
    int zero = 0;
    atomic_compare_exchange_strong(&op->ctx->failed, &zero, rc);
  }
  tz_fence_signal(op->done, rc);
  tz_fence_release(op->done);
  free(op);
}

static void on_after(void *arg, int rc) { run(arg, rc < 0 ? rc : 0); }

static int submit(struct single_ctx *ctx, void *dst, const void *src, size_t n, int reduce,
                  enum tz_dtype dt, tz_fence *after, tz_fence **done) {
  if (atomic_load(&ctx->failed))
    return tz_err_set(TZ_ECANCELED, "comm single: an earlier collective failed (%s)",
                      tz_strerror(atomic_load(&ctx->failed)));
  struct single_op *op = calloc(1, sizeof *op);
  tz_fence *f = tz_fence_create();
  if (!op || !f) {
    free(op);
    tz_fence_release(f);
    return tz_err_set(TZ_ENOMEM, "comm single: out of memory");
  }
  *op = (struct single_op){
      .ctx = ctx, .dst = dst, .src = src, .n = n, .reduce = reduce, .dt = dt, .done = f};
  *done = tz_fence_retain(f);
  if (!after) {
    run(op, 0);
    return 0;
  }
  int rc = tz_fence_then(after, on_after, op);
  if (rc < 0) {
    tz_fence_release(*done);
    *done = NULL;
    tz_fence_release(f);
    free(op);
    return rc;
  }
  return 0;
}

static int single_all_gather(void *ctx, const void *send, void *recv, size_t bytes, tz_fence *after,
                             tz_fence **done) {
  return submit(ctx, recv, send, bytes, 0, TZ_F32, after, done);
}

static int single_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
                                 enum tz_dtype dt, tz_fence *after, tz_fence **done) {
  return submit(ctx, recv, send, count, 1, dt, after, done);
}

static int single_broadcast(void *ctx, void *buf, size_t bytes, int root, tz_fence *after,
                            tz_fence **done) {
  (void)bytes, (void)root;
  return submit(ctx, buf, buf, 0, 0, TZ_F32, after, done);
}

static int single_barrier(void *ctx, tz_fence *after, tz_fence **done) {
  return submit(ctx, NULL, NULL, 0, 0, TZ_F32, after, done);
}

static void single_abort(void *arg, int rc, const char *why) {
  struct single_ctx *ctx = arg;
  TZ_LOG_ERR("comm single: aborted: %s", why);
  int zero = 0;
  atomic_compare_exchange_strong(&ctx->failed, &zero, rc < 0 ? rc : TZ_ECANCELED);
}

const struct tz_comm_ops tz_comm_single_ops = {
    .name = "single",
    .probe = single_probe,
    .create = single_create,
    .destroy = single_destroy,
    .all_gather = single_all_gather,
    .reduce_scatter = single_reduce_scatter,
    .all_reduce = single_reduce_scatter, /* with one rank both are the sum of one chunk */
    .broadcast = single_broadcast,
    .barrier = single_barrier,
    .abort = single_abort,
};
