/* The "mpi" backend: host buffers, CPU ranks, under mpirun.
 *
 * Threads. Every MPI call of a collective is made on the progress engine's thread: a collective
 * is queued by the caller and started, tested and finished by this backend's poller. MPI itself is
 * initialized (and the communicator duplicated and freed) on the thread that creates and destroys
 * the comm, while nothing is in flight. So MPI_THREAD_SERIALIZED suffices, and that is what we
 * ask for: a program that calls MPI itself while a collective of this comm is in flight must have
 * initialized MPI with MPI_THREAD_MULTIPLE.
 *
 * One collective at a time. The poller starts a collective only when the one before it has
 * completed. An all-reduce takes two MPI collectives (an all-to-all, then an all-gather), and with
 * several in flight ranks could start the second stages in different orders; one at a time keeps
 * the order of MPI calls the same on every rank, and costs little since collectives on one
 * communicator share the same links anyway.
 *
 * Fixed-order sums. MPI's own reductions sum in an order of the library's choosing. Here a
 * reduce-scatter is an all-to-all that brings each rank the P chunks of its shard, summed locally
 * in rank order; an all-reduce is that on P near-equal shards followed by an all-gather. Every
 * element is thus x0 + x1 + ... + x(P-1) in that order, bit-identical to a serial reference.
 *
 * Hangs. A collective that runs longer than the timeout means a rank is missing: the poller logs
 * which collective (kind, sequence number, size) and calls MPI_Abort, which ends the whole job.
 * A rank that dies is Open MPI's to detect; mpirun then ends the others. */
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "collectives/comm_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "util/clock.h"

enum mpi_kind { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, OP_BROADCAST, OP_BARRIER };
static const char *const kind_names[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                         "barrier"};

struct mpi_op {
  struct mpi_op *next;
  enum mpi_kind kind;
  const void *send;
  void *recv;
  size_t n; /* bytes (all_gather, broadcast) or elements (reductions) */
  enum tz_dtype dt;
  int root;
  tz_fence *after; /* owned reference, or NULL */
  tz_fence *done;  /* the poller's reference; the caller holds another */
  uint64_t seq;    /* the comm's collective number, the same on every rank */
  int stage;       /* 0: waiting for after; 1, 2: that MPI call is in flight */
  int rc;
  char *msg; /* why it failed, for the waiter (signalled from another thread) */
  MPI_Request req;
  MPI_Datatype type; /* a block type for byte counts above INT_MAX; MPI_DATATYPE_NULL else */
  double started;
};

struct mpi_ctx {
  MPI_Comm comm;
  int rank, size;
  tz_progress *pe;
  int own_pe;
  double timeout_s;
  enum tz_dtype accum;

  pthread_mutex_t lock; /* the queue, pending, failed */
  pthread_cond_t idle;
  struct mpi_op *head, *tail;
  int pending; /* queued or active */
  int failed;  /* the first error; later collectives are canceled */
  uint64_t next_seq;

  /* The poller's alone. */
  struct mpi_op *active;
  void *scratch; /* the chunks of this rank's shard, for the active reduction */
  size_t scratch_cap;
  int *sc, *sd, *rc, *rd; /* counts and displacements (P each) of the active vector collective */
};

/* MPI is initialized once per process; the comms this file created count their users. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_users;
static int g_we_initialized;

static int mpi_error(int err, const char *fmt, const char *what, int rank) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, s, &len) != MPI_SUCCESS)
    snprintf(s, sizeof s, "MPI error %d", err);
  return tz_err_set(TZ_ECOMM, fmt, rank, what, s);
}

static int mpi_probe(char *why, size_t why_len) {
  (void)why, (void)why_len;
  return 0;
}

static int mpi_init(void) {
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  pthread_mutex_lock(&g_lock);
  int rc = 0;
  if (!inited) {
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      rc = tz_err_set(TZ_ECOMM, "comm mpi: MPI_Init_thread failed");
    else
      g_we_initialized = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (rc == 0 && provided < MPI_THREAD_SERIALIZED)
    rc = tz_err_set(TZ_ENOTSUP,
                    "comm mpi: MPI provides thread level %d; this backend calls MPI "
                    "from its progress thread and needs MPI_THREAD_SERIALIZED or higher",
                    provided);
  if (rc == 0)
    g_users++;
  else if (g_we_initialized && g_users == 0) {
    MPI_Finalize();
    g_we_initialized = 0;
  }
  pthread_mutex_unlock(&g_lock);
  return rc;
}

static void mpi_release(void) {
  pthread_mutex_lock(&g_lock);
  if (--g_users == 0 && g_we_initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      MPI_Finalize();
  }
  pthread_mutex_unlock(&g_lock);
}

/* ---- The poller ---- */

static int grow_scratch(struct mpi_ctx *ctx, size_t bytes) {
  if (bytes <= ctx->scratch_cap)
    return 0;
  /* Kept across collectives: a fresh buffer each time would fault its pages in every time. */
  free(ctx->scratch);
  size_t cap = (bytes + 4095) & ~(size_t)4095;
  ctx->scratch = aligned_alloc(4096, cap);
  ctx->scratch_cap = ctx->scratch ? cap : 0;
  if (!ctx->scratch)
    return tz_err_set(TZ_ENOMEM, "comm mpi: rank %d: no memory for %zu bytes of reduction scratch",
                      ctx->rank, bytes);
  return 0;
}

/* bytes as (count, type): MPI_BYTE while the count fits an int, else blocks of a power of two. */
static int byte_type(struct mpi_op *op, size_t bytes, int *count, MPI_Datatype *type) {
  if (bytes <= INT32_MAX) {
    *count = (int)bytes;
    *type = MPI_BYTE;
    return 0;
  }
  size_t block = 1;
  while (block < ((size_t)1 << 20) && bytes % (block * 2) == 0)
    block *= 2;
  if (bytes / block > INT32_MAX)
    return tz_err_set(TZ_EINVAL, "comm mpi: %s of %zu bytes per rank is beyond MPI's int counts",
                      kind_names[op->kind], bytes);
  MPI_Type_contiguous((int)block, MPI_BYTE, &op->type);
  MPI_Type_commit(&op->type);
  *count = (int)(bytes / block);
  *type = op->type;
  return 0;
}

static MPI_Datatype elem_type(enum tz_dtype dt) {
  /* MPI only moves these; the sums are ours, so a 16-bit payload travels as uint16. */
  return dt == TZ_F32 ? MPI_FLOAT : MPI_UINT16_T;
}

static int start_stage1(struct mpi_ctx *ctx, struct mpi_op *op) {
  int P = ctx->size, err = MPI_SUCCESS, count = 0;
  MPI_Datatype type = MPI_BYTE;
  size_t es = tz_dtype_size(op->dt);
  switch (op->kind) {
  case OP_ALL_GATHER: {
    TZ_CHECK(byte_type(op, op->n, &count, &type));
    const void *send =
        op->send == (char *)op->recv + (size_t)ctx->rank * op->n ? MPI_IN_PLACE : op->send;
    err = MPI_Iallgather(send, count, type, op->recv, count, type, ctx->comm, &op->req);
    break;
  }
  case OP_BROADCAST:
    TZ_CHECK(byte_type(op, op->n, &count, &type));
    err = MPI_Ibcast(op->recv, count, type, op->root, ctx->comm, &op->req);
    break;
  case OP_BARRIER: err = MPI_Ibarrier(ctx->comm, &op->req); break;
  case OP_REDUCE_SCATTER:
    if (op->n > INT32_MAX)
      return tz_err_set(TZ_EINVAL,
                        "comm mpi: reduce_scatter of %zu elements per rank is beyond "
                        "MPI's int counts",
                        op->n);
    TZ_CHECK(grow_scratch(ctx, (size_t)P * op->n * es));
    err = MPI_Ialltoall(op->send, (int)op->n, elem_type(op->dt), ctx->scratch, (int)op->n,
                        elem_type(op->dt), ctx->comm, &op->req);
    break;
  case OP_ALL_REDUCE: {
    size_t c = (op->n + (size_t)P - 1) / (size_t)P; /* shard length; the last ones may be short */
    if (c > INT32_MAX || op->n > INT32_MAX)
      return tz_err_set(TZ_EINVAL,
                        "comm mpi: all_reduce of %zu elements is beyond MPI's int "
                        "counts",
                        op->n);
    size_t mine_lo = c * (size_t)ctx->rank < op->n ? c * (size_t)ctx->rank : op->n;
    size_t mine = op->n - mine_lo < c ? op->n - mine_lo : c;
    TZ_CHECK(grow_scratch(ctx, (size_t)P * mine * es + 1));
    for (int q = 0; q < P; q++) {
      size_t lo = c * (size_t)q < op->n ? c * (size_t)q : op->n;
      ctx->sc[q] = (int)(op->n - lo < c ? op->n - lo : c);
      ctx->sd[q] = (int)lo;
      ctx->rc[q] = (int)mine;
      ctx->rd[q] = (int)(mine * (size_t)q);
    }
    err = MPI_Ialltoallv(op->send, ctx->sc, ctx->sd, elem_type(op->dt), ctx->scratch, ctx->rc,
                         ctx->rd, elem_type(op->dt), ctx->comm, &op->req);
    break;
  }
  }
  if (err != MPI_SUCCESS)
    return mpi_error(err, "comm mpi: rank %d: starting %s: %s", kind_names[op->kind], ctx->rank);
  op->stage = 1;
  op->started = tz_now_s();
  return 0;
}

/* The MPI call of op's stage has completed: sums, and either starts stage 2 (returns 0) or is
 * done (returns 1). */
static int advance(struct mpi_ctx *ctx, struct mpi_op *op) {
  int P = ctx->size;
  int accum_f32 = ctx->accum == TZ_F32 || op->dt == TZ_F32;
  size_t es = tz_dtype_size(op->dt);
  if (op->kind == OP_REDUCE_SCATTER) {
    tz_comm_sum_chunks(op->recv, ctx->scratch, op->n, op->n, P, op->dt, accum_f32);
    return 1;
  }
  if (op->kind == OP_ALL_REDUCE && op->stage == 1) {
    int mine = ctx->rc[0];
    tz_comm_sum_chunks((char *)op->recv + (size_t)ctx->sd[ctx->rank] * es, ctx->scratch,
                       (size_t)mine, (size_t)mine, P, op->dt, accum_f32);
    int err = MPI_Iallgatherv(MPI_IN_PLACE, 0, elem_type(op->dt), op->recv, ctx->sc, ctx->sd,
                              elem_type(op->dt), ctx->comm, &op->req);
    if (err != MPI_SUCCESS)
      return mpi_error(err, "comm mpi: rank %d: starting %s's gather: %s", kind_names[op->kind],
                       ctx->rank);
    op->stage = 2;
    return 0;
  }
  return 1;
}

static void watchdog(struct mpi_ctx *ctx, struct mpi_op *op) {
  double ran = tz_now_s() - op->started;
  if (ran < ctx->timeout_s)
    return;
  TZ_LOG_ERR("comm mpi: rank %d of %d: %s #%llu (%zu %s) did not complete within %.0f s "
             "(TZ_COMM_TIMEOUT): another rank has not joined it (MPI cannot say which); aborting "
             "the job",
             ctx->rank, ctx->size, kind_names[op->kind], (unsigned long long)op->seq, op->n,
             op->kind == OP_ALL_GATHER || op->kind == OP_BROADCAST ? "bytes" : "elements",
             ctx->timeout_s);
  MPI_Abort(ctx->comm, 1);
}

static void op_free(struct mpi_op *op) {
  if (op->type != MPI_DATATYPE_NULL)
    MPI_Type_free(&op->type);
  tz_fence_release(op->after);
  tz_fence_release(op->done);
  free(op->msg);
  free(op);
}

static int mpi_poll(void *arg) {
  struct mpi_ctx *ctx = arg;
  struct mpi_op *finished = NULL, **finished_tail = &finished;
  int handled = 0;
  for (;;) {
    struct mpi_op *op = ctx->active;
    if (!op) {
      pthread_mutex_lock(&ctx->lock);
      op = ctx->head;
      if (op) {
        ctx->head = op->next;
        if (!ctx->head)
          ctx->tail = NULL;
        op->next = NULL;
      }
      pthread_mutex_unlock(&ctx->lock);
      if (!op)
        break;
      ctx->active = op;
    }
    int rc = 0, complete = 0;
    if (op->stage == 0) {
      int q = op->after ? tz_fence_query(op->after) : 1;
      if (q == 0)
        break;
      pthread_mutex_lock(&ctx->lock);
      int failed = ctx->failed;
      pthread_mutex_unlock(&ctx->lock);
      if (q < 0) {
        rc = tz_err_set(q, "comm mpi: rank %d: %s #%llu not started: its input failed (%s)",
                        ctx->rank, kind_names[op->kind], (unsigned long long)op->seq,
                        tz_strerror(q));
        TZ_LOG_ERR("%s", tz_err_msg());
      } else if (failed) {
        rc = tz_err_set(TZ_ECANCELED,
                        "comm mpi: rank %d: %s #%llu canceled: an earlier "
                        "collective failed (%s)",
                        ctx->rank, kind_names[op->kind], (unsigned long long)op->seq,
                        tz_strerror(failed));
      } else if ((rc = start_stage1(ctx, op)) < 0) {
        TZ_LOG_ERR("%s", tz_err_msg());
      }
      complete = rc < 0;
    }
    while (!complete) {
      int flag = 0;
      int err = MPI_Test(&op->req, &flag, MPI_STATUS_IGNORE);
      if (err != MPI_SUCCESS) {
        rc = mpi_error(err, "comm mpi: rank %d: %s failed: %s", kind_names[op->kind], ctx->rank);
        TZ_LOG_ERR("%s", tz_err_msg());
        complete = 1;
        break;
      }
      if (!flag) {
        watchdog(ctx, op);
        break;
      }
      rc = advance(ctx, op);
      if (rc < 0)
        TZ_LOG_ERR("%s", tz_err_msg());
      complete = rc != 0;
    }
    if (!complete)
      break;
    op->rc = rc < 0 ? rc : 0;
    if (op->rc < 0) {
      op->msg = strdup(tz_err_msg());
      pthread_mutex_lock(&ctx->lock);
      if (!ctx->failed)
        ctx->failed = op->rc;
      pthread_mutex_unlock(&ctx->lock);
    }
    ctx->active = NULL;
    *finished_tail = op;
    finished_tail = &op->next;
    handled++;
  }
  /* Signalled last: a waiter woken here may call MPI itself once this comm is idle, and by now
   * this thread has made its last MPI call of the round. */
  while (finished) {
    struct mpi_op *op = finished;
    finished = op->next;
    tz_fence_signal_msg(op->done, op->rc, op->msg);
    op_free(op);
    pthread_mutex_lock(&ctx->lock);
    if (--ctx->pending == 0)
      pthread_cond_broadcast(&ctx->idle);
    pthread_mutex_unlock(&ctx->lock);
    tz_progress_busy(ctx->pe, -1);
  }
  return handled;
}

/* ---- Submission ---- */

static int submit(struct mpi_ctx *ctx, enum mpi_kind kind, const void *send, void *recv, size_t n,
                  enum tz_dtype dt, int root, tz_fence *after, tz_fence **done) {
  struct mpi_op *op = calloc(1, sizeof *op);
  tz_fence *f = op ? tz_fence_create() : NULL;
  if (!f) {
    free(op);
    return tz_err_set(TZ_ENOMEM, "comm mpi: out of memory");
  }
  *op = (struct mpi_op){.kind = kind,
                        .send = send,
                        .recv = recv,
                        .n = n,
                        .dt = dt,
                        .root = root,
                        .after = after ? tz_fence_retain(after) : NULL,
                        .done = f,
                        .req = MPI_REQUEST_NULL,
                        .type = MPI_DATATYPE_NULL};
  pthread_mutex_lock(&ctx->lock);
  if (ctx->failed) {
    int failed = ctx->failed;
    pthread_mutex_unlock(&ctx->lock);
    op_free(op);
    return tz_err_set(TZ_ECANCELED, "comm mpi: rank %d: %s after an earlier collective failed (%s)",
                      ctx->rank, kind_names[kind], tz_strerror(failed));
  }
  op->seq = ctx->next_seq++;
  if (ctx->tail)
    ctx->tail->next = op;
  else
    ctx->head = op;
  ctx->tail = op;
  ctx->pending++;
  *done = tz_fence_retain(f);
  pthread_mutex_unlock(&ctx->lock);
  tz_progress_busy(ctx->pe, +1);
  tz_progress_kick(ctx->pe);
  return 0;
}

static int mpi_all_gather(void *ctx, const void *send, void *recv, size_t bytes, tz_fence *after,
                          tz_fence **done) {
  return submit(ctx, OP_ALL_GATHER, send, recv, bytes, TZ_F32, 0, after, done);
}

static int mpi_reduce_scatter(void *ctx, const void *send, void *recv, size_t count,
                              enum tz_dtype dt, tz_fence *after, tz_fence **done) {
  return submit(ctx, OP_REDUCE_SCATTER, send, recv, count, dt, 0, after, done);
}

static int mpi_all_reduce(void *ctx, const void *send, void *recv, size_t count, enum tz_dtype dt,
                          tz_fence *after, tz_fence **done) {
  return submit(ctx, OP_ALL_REDUCE, send, recv, count, dt, 0, after, done);
}

static int mpi_broadcast(void *ctx, void *buf, size_t bytes, int root, tz_fence *after,
                         tz_fence **done) {
  return submit(ctx, OP_BROADCAST, buf, buf, bytes, TZ_F32, root, after, done);
}

static int mpi_barrier(void *ctx, tz_fence *after, tz_fence **done) {
  return submit(ctx, OP_BARRIER, NULL, NULL, 0, TZ_F32, 0, after, done);
}

/* ---- Life cycle ---- */

static void ctx_free(struct mpi_ctx *ctx) {
  free(ctx->scratch);
  free(ctx->sc);
  free(ctx->sd);
  free(ctx->rc);
  free(ctx->rd);
  pthread_mutex_destroy(&ctx->lock);
  pthread_cond_destroy(&ctx->idle);
  free(ctx);
}

static int mpi_create(struct tz_bootstrap *bs, const struct tz_comm_params *p, int *rank, int *size,
                      void **out) {
  TZ_CHECK(mpi_init());
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size != bs->size || world_rank != bs->rank) {
    mpi_release();
    return tz_err_set(TZ_ECONFIG,
                      "comm mpi: MPI sees rank %d of %d but the launch (%s) says rank "
                      "%d of %d: run the mpi backend under mpirun",
                      world_rank, world_size, tz_launch_kind_name(bs->kind), bs->rank, bs->size);
  }
  struct mpi_ctx *ctx = calloc(1, sizeof *ctx);
  int P = world_size;
  if (!ctx) {
    mpi_release();
    return tz_err_set(TZ_ENOMEM, "comm mpi: out of memory");
  }
  pthread_mutex_init(&ctx->lock, NULL);
  pthread_cond_init(&ctx->idle, NULL);
  ctx->comm = MPI_COMM_NULL;
  ctx->rank = world_rank;
  ctx->size = P;
  ctx->timeout_s = tz_comm_timeout(p);
  ctx->accum = p->accum;
  ctx->sc = calloc((size_t)P, sizeof(int));
  ctx->sd = calloc((size_t)P, sizeof(int));
  ctx->rc = calloc((size_t)P, sizeof(int));
  ctx->rd = calloc((size_t)P, sizeof(int));
  int rc = 0;
  if (!ctx->sc || !ctx->sd || !ctx->rc || !ctx->rd) {
    rc = tz_err_set(TZ_ENOMEM, "comm mpi: out of memory");
    goto fail;
  }
  int err = MPI_Comm_dup(MPI_COMM_WORLD, &ctx->comm);
  if (err != MPI_SUCCESS) {
    rc = mpi_error(err, "comm mpi: rank %d: %s: %s", "MPI_Comm_dup", world_rank);
    goto fail;
  }
  /* Errors come back to us as codes and end up in fences, instead of MPI aborting at once. */
  MPI_Comm_set_errhandler(ctx->comm, MPI_ERRORS_RETURN);
  ctx->pe = p->progress;
  if (!ctx->pe) {
    TZ_CHECK_GOTO(tz_progress_create(&ctx->pe), rc, fail);
    ctx->own_pe = 1;
  }
  TZ_CHECK_GOTO(tz_progress_add(ctx->pe, mpi_poll, ctx, -1), rc, fail);
  *rank = world_rank;
  *size = P;
  *out = ctx;
  return 0;
fail:
  if (ctx->own_pe)
    tz_progress_destroy(ctx->pe);
  if (ctx->comm != MPI_COMM_NULL)
    MPI_Comm_free(&ctx->comm);
  ctx_free(ctx);
  mpi_release();
  return rc;
}

static void mpi_destroy(void *arg) {
  struct mpi_ctx *ctx = arg;
  if (!ctx)
    return;
  pthread_mutex_lock(&ctx->lock);
  if (ctx->pending) {
    /* The poller's watchdog bounds every started collective; this bounds the rest. */
    struct timespec ts =
        tz_deadline(CLOCK_REALTIME, ((uint64_t)ctx->timeout_s + 5) * 1000000000ull);
    while (ctx->pending && pthread_cond_timedwait(&ctx->idle, &ctx->lock, &ts) == 0)
      ;
  }
  int pending = ctx->pending;
  pthread_mutex_unlock(&ctx->lock);
  if (pending) {
    TZ_LOG_ERR("comm mpi: rank %d: destroyed with %d collectives still waiting for their inputs; "
               "aborting the job",
               ctx->rank, pending);
    MPI_Abort(ctx->comm, 1);
  }
  tz_progress_remove(ctx->pe, mpi_poll, ctx);
  if (ctx->own_pe)
    tz_progress_destroy(ctx->pe);
  MPI_Comm_free(&ctx->comm);
  ctx_free(ctx);
  mpi_release();
}

static void mpi_abort(void *arg, int rc, const char *why) {
  struct mpi_ctx *ctx = arg;
  TZ_LOG_ERR("comm mpi: rank %d of %d: aborting the job (%s): %s", ctx->rank, ctx->size,
             tz_strerror(rc), why);
  MPI_Abort(ctx->comm, 1);
}

static void *mpi_native(void *arg, const char *what) {
  struct mpi_ctx *ctx = arg;
  return strcmp(what, "mpi_comm") == 0 ? &ctx->comm : NULL;
}

const struct tz_comm_ops tz_comm_mpi_ops = {
    .name = "mpi",
    .probe = mpi_probe,
    .create = mpi_create,
    .destroy = mpi_destroy,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_reduce = mpi_all_reduce,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
    .native = mpi_native,
};
