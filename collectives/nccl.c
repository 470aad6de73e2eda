/* The "nccl" backend: device buffers (host buffers go through a device copy, synchronously: see
 * "Host buffers"), one process per GPU, collectives on the comm's own stream.
 *
 * Launch. Collectives are enqueued by the calling thread, in call order, under a lock (a comm may
 * be used from the caller and from progress callbacks). Each completes on a polled fence over a
 * CUDA event recorded after it; the progress engine polls the event. An `after` fence made by this
 * comm needs no wait (stream order); any other pending fence is waited for on the host before the
 * launch (the trainer orders its lanes with the comm's stream itself: tz_lane_order).
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0) so that no NCCL call can wait
 * forever: initialization and a launch that needs new connections are polled with
 * ncclCommGetAsyncError up to the timeout.
 *
 * Sums. fp32 payloads, and 16-bit payloads reduced in their own dtype, use NCCL's reductions:
 * bit-reproducible for a fixed world size and topology with NCCL_ALGO and NCCL_PROTO pinned.
 * 16-bit payloads reduced in fp32 are exchanged with send/recv and summed on the GPU in rank
 * order (nccl_sum.cu), which gives the same bits as the mpi backend.
 *
 * Failure. The poller of each fence also reads ncclCommGetAsyncError and the collective's age;
 * an asynchronous NCCL error (a peer gone, a network error) or a collective older than the
 * timeout aborts the communicator with ncclCommAbort, which makes the kernels in flight return.
 * The fence then fails (TZ_ECOMM or TZ_ETIMEDOUT) and so does every later collective. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/comm_impl.h"
#include "collectives/nccl_sum.h"
#include "core/error.h"
#include "core/log.h"
#include "util/clock.h"

struct nccl_ctx {
  ncclComm_t comm;
  cudaStream_t stream;
  int device, rank, size;
  tz_progress *pe;
  int own_pe;
  double timeout_s;
  enum tz_dtype accum;

  pthread_mutex_t lock; /* launches, scratch, abort */
  atomic_int aborted;   /* 0, or the error that ended the communicator */
  atomic_int inflight;  /* fences not yet completed */
  uint64_t seq;         /* collectives launched */
  void *scratch;        /* device: the chunks of this rank's shard, for fp32-accumulated sums */
  size_t scratch_cap;
  float *one; /* device: the barrier's all-reduce of one float */
  /* This comm's fence ops: a fence with these is on this comm's stream, which needs no wait. */
  struct tz_fence_poll_ops fence_ops;
};

/* A collective's completion: what its fence polls. The event comes first so that a compute
 * backend can find it at the start of the object tz_fence_native hands back. */
struct nccl_done {
  cudaEvent_t event;
  struct nccl_ctx *ctx;
  const char *op;
  uint64_t seq;
  size_t bytes;
  double started;
};

static int cuda_error(cudaError_t e, const char *what, int rank) {
  return tz_err_set(TZ_ECUDA, "comm nccl: rank %d: %s: %s", rank, what, cudaGetErrorString(e));
}

static int nccl_error(struct nccl_ctx *ctx, ncclResult_t r, const char *what) {
  const char *last = ctx && ctx->comm ? ncclGetLastError(ctx->comm) : NULL;
  return tz_err_set(r == ncclSystemError || r == ncclRemoteError ? TZ_ECOMM : TZ_ECUDA,
                    "comm nccl: rank %d: %s: %s%s%s", ctx ? ctx->rank : -1, what,
                    ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

/* Ends the communicator once: later calls only see ctx->aborted. Caller holds ctx->lock. */
static void abort_locked(struct nccl_ctx *ctx, int rc, const char *why) {
  int zero = 0;
  if (!atomic_compare_exchange_strong(&ctx->aborted, &zero, rc < 0 ? rc : TZ_ECOMM))
    return;
  TZ_LOG_ERR("comm nccl: rank %d of %d: aborting the communicator: %s", ctx->rank, ctx->size, why);
  if (ctx->comm)
    ncclCommAbort(ctx->comm);
  ctx->comm = NULL;
}

/* Polls a non-blocking communicator until its last call has finished. Caller holds ctx->lock. */
static int wait_ready_for(struct nccl_ctx *ctx, const char *what, double timeout_s) {
  double deadline = tz_now_s() + timeout_s;
  for (;;) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(ctx->comm, &st);
    if (r != ncclSuccess)
      st = r;
    if (st == ncclSuccess)
      return 0;
    if (st != ncclInProgress) {
      int rc = nccl_error(ctx, st, what);
      abort_locked(ctx, rc, tz_err_msg());
      return rc;
    }
    if (tz_now_s() > deadline) {
      int rc = tz_err_set(TZ_ETIMEDOUT,
                          "comm nccl: rank %d: %s did not finish within %.0f s "
                          "(TZ_COMM_TIMEOUT): a rank is missing",
                          ctx->rank, what, timeout_s);
      abort_locked(ctx, rc, tz_err_msg());
      return rc;
    }
    struct timespec ts = {0, 20 * 1000};
    nanosleep(&ts, NULL);
  }
}

static int wait_ready(struct nccl_ctx *ctx, const char *what) {
  return wait_ready_for(ctx, what, ctx->timeout_s);
}

/* ---- Completion fences ---- */

static int aborted_status(const struct nccl_done *d) {
  int rc = atomic_load(&d->ctx->aborted);
  return tz_err_set(rc, "comm nccl: rank %d: %s #%llu: the communicator was aborted (%s)",
                    d->ctx->rank, d->op, (unsigned long long)d->seq, tz_strerror(rc));
}

static int poll_once(struct nccl_done *d) {
  struct nccl_ctx *ctx = d->ctx;
  /* The engine's thread: without this its first CUDA call would set up a context on GPU 0. */
  cudaSetDevice(ctx->device);
  cudaError_t e = cudaEventQuery(d->event);
  if (e == cudaSuccess)
    return atomic_load(&ctx->aborted) ? aborted_status(d) : 1;
  if (e != cudaErrorNotReady) {
    char what[64];
    snprintf(what, sizeof what, "%s #%llu", d->op, (unsigned long long)d->seq);
    cuda_error(e, what, ctx->rank);
    TZ_LOG_ERR("%s", tz_err_msg());
    return TZ_ECUDA;
  }
  if (atomic_load(&ctx->aborted))
    return aborted_status(d);
  /* The launching thread may hold the lock for long only while connecting; skip a round then. */
  if (pthread_mutex_trylock(&ctx->lock) != 0)
    return 0;
  int rc = 0;
  char why_buf[512];
  snprintf(why_buf, sizeof why_buf, "%s #%llu: the communicator was aborted", d->op,
           (unsigned long long)d->seq);
  if (ctx->comm) {
    ncclResult_t st = ncclSuccess;
    ncclCommGetAsyncError(ctx->comm, &st);
    char *why = why_buf;
    if (st != ncclSuccess && st != ncclInProgress) {
      rc = nccl_error(ctx, st, d->op);
      snprintf(why, sizeof why_buf, "%s #%llu failed: %s", d->op, (unsigned long long)d->seq,
               tz_err_msg());
      abort_locked(ctx, rc, why);
    } else if (tz_now_s() - d->started > ctx->timeout_s) {
      rc = TZ_ETIMEDOUT;
      snprintf(why, sizeof why_buf,
               "%s #%llu (%zu bytes) did not complete within %.0f s "
               "(TZ_COMM_TIMEOUT): another rank has not joined it",
               d->op, (unsigned long long)d->seq, d->bytes, ctx->timeout_s);
      abort_locked(ctx, rc, why);
    }
  } else {
    rc = atomic_load(&ctx->aborted) ? atomic_load(&ctx->aborted) : TZ_ECOMM;
  }
  pthread_mutex_unlock(&ctx->lock);
  if (rc < 0) /* the message names the collective and why the communicator ended */
    tz_err_set(rc, "comm nccl: rank %d: %s", ctx->rank, why_buf);
  return rc;
}

/* The engine stops polling a fence once this returns non-zero: that is when the collective
 * stops counting as in flight, and the last time d touches the comm (which may be destroyed
 * while the caller still holds the fence). */
static int done_poll(void *arg) {
  struct nccl_done *d = arg;
  struct nccl_ctx *ctx = d->ctx;
  int rc = poll_once(d);
  if (rc != 0) {
    d->ctx = NULL;
    atomic_fetch_sub(&ctx->inflight, 1);
  }
  return rc;
}

/* When the fence's last reference goes: the event outlives the comm if the caller keeps it. */
static void done_destroy(void *arg) {
  struct nccl_done *d = arg;
  cudaEventDestroy(d->event);
  free(d);
}

/* ---- Launching ---- */

static ncclDataType_t nccl_type(enum tz_dtype dt) {
  switch (dt) {
  case TZ_BF16: return ncclBfloat16;
  case TZ_F16: return ncclFloat16;
  default: return ncclFloat32;
  }
}

/* Makes the stream wait for `after`. Caller holds the lock. */
static int wait_after(struct nccl_ctx *ctx, tz_fence *after, const char *op) {
  /* A fence of this comm is an event on this stream: stream order already waits for it. */
  if (!after || tz_fence_native(after, &ctx->fence_ops))
    return 0;
  int q = tz_fence_wait(after, (int64_t)(ctx->timeout_s * 1e9));
  if (q < 0)
    return tz_err_set(q, "comm nccl: rank %d: %s not started: its input failed (%s)", ctx->rank, op,
                      tz_strerror(q));
  return 0;
}

static int grow_scratch(struct nccl_ctx *ctx, size_t bytes) {
  if (bytes <= ctx->scratch_cap)
    return 0;
  /* Stream-ordered: the old buffer is freed after the collectives that use it, with no wait. */
  cudaError_t e = cudaSuccess;
  if (ctx->scratch)
    e = cudaFreeAsync(ctx->scratch, ctx->stream);
  ctx->scratch = NULL;
  ctx->scratch_cap = 0;
  if (e == cudaSuccess)
    e = cudaMallocAsync(&ctx->scratch, bytes, ctx->stream);
  if (e != cudaSuccess)
    return cuda_error(e, "scratch for a reduction", ctx->rank);
  ctx->scratch_cap = bytes;
  return 0;
}

enum nccl_kind { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_BROADCAST, OP_BARRIER };
static const char *const kind_names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                         "barrier"};

struct nccl_args {
  enum nccl_kind kind;
  const void *send;
  void *recv;
  size_t n; /* bytes or elements */
  enum tz_dtype dt;
  int root;
};

static int group_end(struct nccl_ctx *ctx, const char *what) {
  ncclResult_t r = ncclGroupEnd();
  if (r == ncclInProgress)
    return wait_ready(ctx, what);
  if (r != ncclSuccess) {
    int rc = nccl_error(ctx, r, what);
    abort_locked(ctx, rc, tz_err_msg());
    return rc;
  }
  return 0;
}

/* Exchanges with send/recv so that scratch holds, for each rank r, r's chunk of my shard:
 * scratch[r * mine .. ] = r's send[lo_me .. lo_me + mine). lens[q], los[q]: shard q's extent. */
static int gather_my_chunks(struct nccl_ctx *ctx, const char *send, const size_t *los,
                            const size_t *lens, size_t es, ncclDataType_t t) {
  size_t mine = lens[ctx->rank];
  char *scratch = ctx->scratch;
  if (mine) {
    cudaError_t e =
        cudaMemcpyAsync(scratch + (size_t)ctx->rank * mine * es, send + los[ctx->rank] * es,
                        mine * es, cudaMemcpyDeviceToDevice, ctx->stream);
    if (e != cudaSuccess)
      return cuda_error(e, "cudaMemcpyAsync", ctx->rank);
  }
  ncclGroupStart();
  for (int r = 0; r < ctx->size; r++) {
    if (r == ctx->rank)
      continue;
    if (lens[r])
      ncclSend(send + los[r] * es, lens[r], t, r, ctx->comm, ctx->stream);
    if (mine)
      ncclRecv(scratch + (size_t)r * mine * es, mine, t, r, ctx->comm, ctx->stream);
  }
  return group_end(ctx, "exchange of shard chunks");
}

static int launch(struct nccl_ctx *ctx, const struct nccl_args *a) {
  size_t es = tz_dtype_size(a->dt);
  ncclDataType_t t = nccl_type(a->dt);
  int ours = a->dt != TZ_F32 && ctx->accum == TZ_F32; /* 16-bit payload summed in fp32 */
  int P = ctx->size;
  switch (a->kind) {
  case OP_ALL_GATHER:
    ncclGroupStart();
    ncclAllGather(a->send, a->recv, a->n, ncclUint8, ctx->comm, ctx->stream);
    return group_end(ctx, "ncclAllGather");
  case OP_BROADCAST:
    ncclGroupStart();
    ncclBroadcast(a->recv, a->recv, a->n, ncclUint8, a->root, ctx->comm, ctx->stream);
    return group_end(ctx, "ncclBroadcast");
  case OP_BARRIER:
    ncclGroupStart();
    ncclAllReduce(ctx->one, ctx->one, 1, ncclFloat32, ncclSum, ctx->comm, ctx->stream);
    return group_end(ctx, "barrier");
  case OP_REDUCE_SCATTER: {
    if (!ours) {
      ncclGroupStart();
      ncclReduceScatter(a->send, a->recv, a->n, t, ncclSum, ctx->comm, ctx->stream);
      return group_end(ctx, "ncclReduceScatter");
    }
    size_t *los = calloc((size_t)P * 2, sizeof *los);
    if (!los)
      return tz_err_set(TZ_ENOMEM, "comm nccl: out of memory");
    size_t *lens = los + P;
    for (int q = 0; q < P; q++)
      los[q] = (size_t)q * a->n, lens[q] = a->n;
    int rc = grow_scratch(ctx, (size_t)P * a->n * es + 1);
    if (rc == 0)
      rc = gather_my_chunks(ctx, a->send, los, lens, es, t);
    free(los);
    TZ_CHECK(rc);
    cudaError_t e =
        tz_nccl_sum_chunks(a->recv, ctx->scratch, a->n, a->n, P, (int)a->dt, ctx->stream);
    return e == cudaSuccess ? 0 : cuda_error(e, "reduce_scatter's sum", ctx->rank);
  }
  case OP_ALL_REDUCE: {
    if (!ours) {
      ncclGroupStart();
      ncclAllReduce(a->send, a->recv, a->n, t, ncclSum, ctx->comm, ctx->stream);
      return group_end(ctx, "ncclAllReduce");
    }
    size_t *los = calloc((size_t)P * 2, sizeof *los);
    if (!los)
      return tz_err_set(TZ_ENOMEM, "comm nccl: out of memory");
    size_t *lens = los + P;
    size_t c = (a->n + (size_t)P - 1) / (size_t)P;
    for (int q = 0; q < P; q++) {
      los[q] = c * (size_t)q < a->n ? c * (size_t)q : a->n;
      lens[q] = a->n - los[q] < c ? a->n - los[q] : c;
    }
    size_t mine = lens[ctx->rank], lo = los[ctx->rank];
    int rc = grow_scratch(ctx, (size_t)P * mine * es + 1);
    if (rc == 0)
      rc = gather_my_chunks(ctx, a->send, los, lens, es, t);
    if (rc == 0) {
      cudaError_t e = tz_nccl_sum_chunks((char *)a->recv + lo * es, ctx->scratch, mine, mine, P,
                                         (int)a->dt, ctx->stream);
      if (e != cudaSuccess)
        rc = cuda_error(e, "all_reduce's sum", ctx->rank);
    }
    if (rc == 0) {
      /* Everyone's summed shard to everyone: an all-gather of unequal pieces. */
      char *recv = a->recv;
      ncclGroupStart();
      for (int q = 0; q < P; q++) {
        if (q == ctx->rank)
          continue;
        if (mine)
          ncclSend(recv + lo * es, mine, t, q, ctx->comm, ctx->stream);
        if (lens[q])
          ncclRecv(recv + los[q] * es, lens[q], t, q, ctx->comm, ctx->stream);
      }
      rc = group_end(ctx, "all_reduce's gather");
    }
    free(los);
    return rc;
  }
  }
  return tz_err_set(TZ_EINVAL, "comm nccl: unknown collective %d", (int)a->kind);
}

static int submit(struct nccl_ctx *ctx, const struct nccl_args *a, tz_fence *after,
                  tz_fence **done) {
  const char *op = kind_names[a->kind];
  struct nccl_done *d = calloc(1, sizeof *d);
  if (!d)
    return tz_err_set(TZ_ENOMEM, "comm nccl: out of memory");
  pthread_mutex_lock(&ctx->lock);
  int rc = 0;
  if (atomic_load(&ctx->aborted)) {
    rc = tz_err_set(TZ_ECANCELED, "comm nccl: rank %d: %s on a communicator that was aborted (%s)",
                    ctx->rank, op, tz_strerror(atomic_load(&ctx->aborted)));
    goto out;
  }
  cudaError_t e = cudaSetDevice(ctx->device);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&d->event, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    d->event = NULL;
    rc = cuda_error(e, "creating an event", ctx->rank);
    goto out;
  }
  TZ_CHECK_GOTO(wait_after(ctx, after, op), rc, out);
  TZ_CHECK_GOTO(launch(ctx, a), rc, out);
  e = cudaEventRecord(d->event, ctx->stream);
  if (e != cudaSuccess) {
    rc = cuda_error(e, "cudaEventRecord", ctx->rank);
    goto out;
  }
  d->ctx = ctx;
  d->op = op;
  d->seq = ctx->seq++;
  d->bytes =
      a->kind == OP_ALL_GATHER || a->kind == OP_BROADCAST ? a->n : a->n * tz_dtype_size(a->dt);
  d->started = tz_now_s();
out:
  if (rc < 0) {
    /* A collective this rank could not launch is one the others wait for in vain. */
    char why[600];
    snprintf(why, sizeof why, "%s not launched: %s", op, tz_err_msg());
    abort_locked(ctx, rc, why);
  }
  pthread_mutex_unlock(&ctx->lock);
  if (rc < 0) {
    if (d->event)
      cudaEventDestroy(d->event);
    free(d);
    return rc;
  }
  atomic_fetch_add(&ctx->inflight, 1);
  tz_fence *f = tz_fence_create_polled(ctx->pe, &ctx->fence_ops, d);
  if (!f) {
    /* The collective is on the stream; without a fence nobody learns when it ends. */
    atomic_fetch_sub(&ctx->inflight, 1);
    done_destroy(d);
    return tz_err_set(TZ_ENOMEM, "comm nccl: out of memory for a fence");
  }
  *done = f;
  return 0;
}

/* ---- Host buffers ----
 * NCCL reads and writes device memory only. Small exchanges of the control plane (a rank's rates,
 * a stop flag, a failure count) live in host memory; they go through a device copy: the caller's
 * `after` is waited for on the host, the input copied in, the collective launched, waited for
 * (its fence keeps the timeout and abort handling), and the result copied out before the fence is
 * handed back, already complete. */

static int on_device(const void *p) {
  struct cudaPointerAttributes at;
  if (!p)
    return 1;
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    cudaGetLastError(); /* an unregistered pointer is an error on older runtimes: clear it */
    return 0;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged;
}

static int copy_to(struct nccl_ctx *ctx, void *dst, const void *src, size_t n,
                   enum cudaMemcpyKind kind) {
  cudaError_t e = n ? cudaMemcpyAsync(dst, src, n, kind, ctx->stream) : cudaSuccess;
  if (e == cudaSuccess && kind == cudaMemcpyDeviceToHost)
    e = cudaStreamSynchronize(ctx->stream);
  return e == cudaSuccess ? 0 : cuda_error(e, "copy of a host buffer", ctx->rank);
}

static int submit_staged(struct nccl_ctx *ctx, const struct nccl_args *a, size_t send_b,
                         size_t recv_b, tz_fence *after, tz_fence **done) {
  const char *op = kind_names[a->kind];
  if (after) {
    int q = tz_fence_wait(after, (int64_t)(ctx->timeout_s * 1e9));
    if (q < 0)
      return tz_err_set(q, "comm nccl: rank %d: %s not started: its input failed (%s)", ctx->rank,
                        op, tz_strerror(q));
  }
  int in_place = a->send == a->recv;
  int host_send = !in_place && !on_device(a->send), host_recv = !on_device(a->recv);
  size_t sb = host_send ? send_b : 0, rb = host_recv ? recv_b : 0;
  cudaError_t e = cudaSetDevice(ctx->device);
  char *stage = NULL;
  if (e == cudaSuccess)
    e = cudaMallocAsync((void **)&stage, sb + rb + 1, ctx->stream);
  if (e != cudaSuccess)
    return cuda_error(e, "device copy of a host buffer", ctx->rank);
  struct nccl_args s = *a;
  if (host_send)
    s.send = stage;
  if (host_recv)
    s.recv = stage + sb;
  if (in_place)
    s.send = s.recv;
  int rc = 0;
  if (host_send)
    rc = copy_to(ctx, stage, a->send, sb, cudaMemcpyHostToDevice);
  /* The data in place, and a broadcast's root data, go in through the receive buffer. */
  if (rc == 0 && host_recv && (in_place || a->kind == OP_BROADCAST))
    rc = copy_to(ctx, stage + sb, a->recv, rb, cudaMemcpyHostToDevice);
  tz_fence *f = NULL;
  if (rc == 0)
    rc = submit(ctx, &s, NULL, &f);
  if (rc == 0)
    rc = tz_fence_wait(f, -1);
  if (rc == 0 && host_recv)
    rc = copy_to(ctx, a->recv, stage + sb, rb, cudaMemcpyDeviceToHost);
  cudaFreeAsync(stage, ctx->stream);
  if (rc < 0) {
    tz_fence_release(f);
    return rc;
  }
  *done = f;
  return 0;
}

/* submit, or submit_staged when a buffer is in host memory. */
static int submit_any(struct nccl_ctx *ctx, const struct nccl_args *a, size_t send_b, size_t recv_b,
                      tz_fence *after, tz_fence **done) {
  if (a->kind == OP_BARRIER || (on_device(a->send) && on_device(a->recv)))
    return submit(ctx, a, after, done);
  return submit_staged(ctx, a, send_b, recv_b, after, done);
}

static int nccl_all_gather(void *ctx, const void *send, void *recv, size_t bytes, tz_fence *after,
                           tz_fence **done) {
  struct nccl_args a = {.kind = OP_ALL_GATHER, .send = send, .recv = recv, .n = bytes};
  struct nccl_ctx *c = ctx;
  return submit_any(c, &a, bytes, bytes * (size_t)c->size, after, done);
}

static int nccl_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
                               enum tz_dtype dt, tz_fence *after, tz_fence **done) {
  struct nccl_args a = {
      .kind = OP_REDUCE_SCATTER, .send = send, .recv = recv, .n = count, .dt = dt};
  struct nccl_ctx *c = ctx;
  size_t b = count * tz_dtype_size(dt);
  return submit_any(c, &a, b * (size_t)c->size, b, after, done);
}

static int nccl_all_reduce(void *ctx, const void *send, void *recv, size_t count, enum tz_dtype dt,
                           tz_fence *after, tz_fence **done) {
  struct nccl_args a = {.kind = OP_ALL_REDUCE, .send = send, .recv = recv, .n = count, .dt = dt};
  size_t b = count * tz_dtype_size(dt);
  return submit_any(ctx, &a, b, b, after, done);
}

static int nccl_broadcast(void *ctx, void *buf, size_t bytes, int root, tz_fence *after,
                          tz_fence **done) {
  struct nccl_args a = {.kind = OP_BROADCAST, .send = buf, .recv = buf, .n = bytes, .root = root};
  return submit_any(ctx, &a, bytes, bytes, after, done);
}

static int nccl_barrier(void *ctx, tz_fence *after, tz_fence **done) {
  struct nccl_args a = {.kind = OP_BARRIER};
  return submit(ctx, &a, after, done);
}

/* ---- Life cycle ---- */

static int nccl_probe(char *why, size_t why_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why)
      snprintf(why, why_len, "nccl: no GPU visible (%s)",
               e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return TZ_ENOTSUP;
  }
  return n;
}

static void ctx_free(struct nccl_ctx *ctx) {
  if (ctx->scratch)
    cudaFreeAsync(ctx->scratch, ctx->stream);
  if (ctx->one)
    cudaFree(ctx->one);
  if (ctx->stream)
    cudaStreamDestroy(ctx->stream);
  if (ctx->own_pe)
    tz_progress_destroy(ctx->pe);
  pthread_mutex_destroy(&ctx->lock);
  free(ctx);
}

static int nccl_create(struct tz_bootstrap *bs, const struct tz_comm_params *p, int *rank,
                       int *size, void **out) {
  char why[256];
  int ngpu = nccl_probe(why, sizeof why);
  if (ngpu < 0)
    return tz_err_set(TZ_ENOTSUP, "comm %s", why);
  int device = p->device >= 0 ? p->device : bs->local_rank;
  if (device >= ngpu)
    return tz_err_set(TZ_ECONFIG,
                      "comm nccl: rank %d (local rank %d) wants GPU %d but %d are "
                      "visible",
                      bs->rank, bs->local_rank, device, ngpu);
  /* NVLink SHARP needs a fabric manager set-up that is not there; the caller's choice wins. */
  setenv("NCCL_NVLS_ENABLE", "0", 0);

  struct nccl_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return tz_err_set(TZ_ENOMEM, "comm nccl: out of memory");
  pthread_mutex_init(&ctx->lock, NULL);
  ctx->device = device;
  ctx->rank = bs->rank;
  ctx->size = bs->size;
  ctx->timeout_s = tz_comm_timeout(p);
  ctx->accum = p->accum;
  ctx->fence_ops =
      (struct tz_fence_poll_ops){.kind = "cuda-event", .poll = done_poll, .destroy = done_destroy};
  int rc = 0;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess)
    e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaMalloc((void **)&ctx->one, sizeof(float));
  if (e == cudaSuccess)
    e = cudaMemset(ctx->one, 0, sizeof(float));
  if (e != cudaSuccess) {
    rc = cuda_error(e, "setting up the device", bs->rank);
    goto fail;
  }
  ctx->pe = p->progress;
  if (!ctx->pe) {
    TZ_CHECK_GOTO(tz_progress_create(&ctx->pe), rc, fail);
    ctx->own_pe = 1;
  }

  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (bs->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      rc = nccl_error(NULL, r, "ncclGetUniqueId");
      goto fail;
    }
  }
  TZ_CHECK_GOTO(tz_bootstrap_bcast(bs, &id, sizeof id), rc, fail);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  pthread_mutex_lock(&ctx->lock);
  ncclResult_t r = ncclCommInitRankConfig(&ctx->comm, bs->size, id, bs->rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    rc = nccl_error(ctx, r, "ncclCommInitRankConfig");
    if (ctx->comm)
      ncclCommAbort(ctx->comm);
    ctx->comm = NULL;
  } else {
    /* Every rank is known to be alive (the bootstrap reached them all), and setting up a
     * communicator can legitimately take long at scale: a short collective timeout (a test's)
     * does not apply here. */
    rc = wait_ready_for(ctx, "ncclCommInitRankConfig", ctx->timeout_s > 120 ? ctx->timeout_s : 120);
  }
  pthread_mutex_unlock(&ctx->lock);
  if (rc < 0)
    goto fail;
  *rank = bs->rank;
  *size = bs->size;
  *out = ctx;
  TZ_INFO("comm nccl: rank %d of %d on GPU %d", bs->rank, bs->size, device);
  return 0;
fail:
  ctx_free(ctx);
  return rc;
}

static void nccl_destroy(void *arg) {
  struct nccl_ctx *ctx = arg;
  if (!ctx)
    return;
  /* The fences in flight point at ctx; their pollers end by completion, error or timeout. */
  double deadline = tz_now_s() + ctx->timeout_s + 5;
  while (atomic_load(&ctx->inflight) > 0 && tz_now_s() < deadline) {
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  pthread_mutex_lock(&ctx->lock);
  if (atomic_load(&ctx->inflight) > 0)
    abort_locked(ctx, TZ_ETIMEDOUT, "destroyed with collectives still in flight");
  if (ctx->comm) {
    cudaSetDevice(ctx->device);
    ncclResult_t r = ncclCommFinalize(ctx->comm);
    if (r == ncclSuccess || r == ncclInProgress)
      r = wait_ready(ctx, "ncclCommFinalize") == 0 ? ncclSuccess : ncclInternalError;
    if (ctx->comm) {
      if (r == ncclSuccess)
        ncclCommDestroy(ctx->comm);
      else
        ncclCommAbort(ctx->comm);
      ctx->comm = NULL;
    }
  }
  pthread_mutex_unlock(&ctx->lock);
  /* After the abort every poller returns at its next round; one still to come would touch ctx. */
  deadline = tz_now_s() + 10;
  while (atomic_load(&ctx->inflight) > 0 && tz_now_s() < deadline) {
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (atomic_load(&ctx->inflight) > 0) {
    TZ_LOG_ERR("comm nccl: rank %d: %d collectives were never polled to the end (was the progress "
               "engine destroyed before the comm?); leaving the comm's memory in place",
               ctx->rank, atomic_load(&ctx->inflight));
    return;
  }
  ctx_free(ctx);
}

static void nccl_abort(void *arg, int rc, const char *why) {
  struct nccl_ctx *ctx = arg;
  pthread_mutex_lock(&ctx->lock);
  abort_locked(ctx, rc, why);
  pthread_mutex_unlock(&ctx->lock);
}

static void *nccl_native(void *arg, const char *what) {
  struct nccl_ctx *ctx = arg;
  if (strcmp(what, "nccl_comm") == 0)
    return &ctx->comm;
  if (strcmp(what, "cuda_stream") == 0)
    return &ctx->stream;
  if (strcmp(what, "device") == 0)
    return &ctx->device;
  return NULL;
}

const struct tz_comm_ops tz_comm_nccl_ops = {
    .name = "nccl",
    .probe = nccl_probe,
    .create = nccl_create,
    .destroy = nccl_destroy,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .native = nccl_native,
    .needs_bcast = 1,
};
