/* Collectives (DESIGN.md "Backends"): all-gather, reduce-scatter, all-reduce, broadcast and
 * barrier over the ranks of a job, each asynchronous and completing on a fence.
 *
 * Backends: "single" (a world of one, host buffers), "mpi" (host buffers, CPU ranks; built with
 * MPI), "nccl" (device buffers, one process per GPU, its own stream; built with NCCL).
 *
 * Order. Every rank must issue the same collectives in the same order; a comm starts them in the
 * order they were called, each after its `after` fence, whatever order their inputs become ready
 * in. The buffers of a collective must stay valid, and its inputs unmodified, until its fence
 * completes.
 *
 * Reductions are sums. Arithmetic is fp32 unless params.accum says otherwise: a bf16 or fp16
 * payload is widened, summed in fp32 and rounded once (to nearest even) at the end.
 *  - mpi and single sum every element in rank order 0..P-1, so the result is bit-identical to a
 *    serial loop `acc = x0; acc += x1; ...` on any machine and with any MPI.
 *  - nccl: fp32 payloads (and payloads reduced in their own dtype) use NCCL's reduction, whose
 *    order is fixed for a given world size and algorithm: results are bit-reproducible from run to
 *    run when the world size, the topology and NCCL_ALGO / NCCL_PROTO are pinned. bf16 and fp16
 *    payloads with fp32 accumulation are exchanged with send/recv and summed in rank order on the
 *    GPU, bit-identical to mpi and single.
 *
 * Failure. An argument error is returned at once. A failure while a collective runs completes its
 * fence with the error, and every later collective of the comm fails with TZ_ECANCELED. A
 * collective that does not complete within the timeout ($TZ_COMM_TIMEOUT seconds, default 300)
 * is a hung job: mpi logs which collective and calls MPI_Abort, which ends every rank; nccl
 * aborts the communicator (ncclCommAbort), fails the fence with TZ_ETIMEDOUT, and the process is
 * expected to exit, which its launcher turns into the end of the others. */
#ifndef TZ_COMM_H
#define TZ_COMM_H

#include <stddef.h>

#include "collectives/launch.h"
#include "core/dtype.h"
#include "core/fence.h"
#include "core/progress.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tz_comm tz_comm;

struct tz_comm_params {
  tz_progress *progress; /* completes the fences (borrowed); NULL: the comm starts its own */
  int device;            /* nccl: the GPU; -1 (default): the bootstrap's local rank */
  double timeout_s;      /* watchdog on each collective; 0 (default): $TZ_COMM_TIMEOUT or 300;
                            tz-train passes tierzero.comm_timeout */
  /* Reduction arithmetic: TZ_F32 (default), or the payload's own dtype (a bf16 payload summed
   * in bf16, rounding after every addition; nccl then uses its native reduction). */
  enum tz_dtype accum;
};
void tz_comm_params_init(struct tz_comm_params *p);

/* Registry (defined in registry/comm.c, above every backend; tz_collectives itself calls none
 * of the four). Backends compiled into this build, in order: "single", then "mpi" and "nccl"
 * when built. */
int tz_comm_backend_count(void);
const char *tz_comm_backend_name(int i);

/* >= 0 when the backend can run here: the most ranks it can run per machine (nccl: the GPUs
 * visible; 0: no limit). Otherwise a negative code, and why[] says why. */
int tz_comm_probe(const char *backend, char *why, size_t why_len);

/* Creates this rank's end of a communicator over the world bs describes; every rank of the world
 * calls it. bs is used during the call (its exchange counter advances) and not kept. p may be
 * NULL for defaults. Blocks until every rank has joined, or the timeout.
 * Errors: TZ_ENOENT (no such backend), TZ_ENOTSUP (not built, no GPU, or the launch gives the
 * backend no way to meet: nccl under mpirun without MPI or MASTER_ADDR), TZ_ECONFIG (the world
 * the backend sees differs from bs), TZ_ECOMM, TZ_ECUDA, TZ_ETIMEDOUT. */
int tz_comm_create(const char *backend, struct tz_bootstrap *bs, const struct tz_comm_params *p,
                   tz_comm **out);
/* Waits for collectives in flight (up to the timeout, then aborts them), then frees. Fences the
 * caller still holds stay valid. Destroy a comm before the progress engine it was given. NULL is
 * a no-op. mpi finalizes MPI with the last comm if a comm initialized it. */
void tz_comm_destroy(tz_comm *c);

int tz_comm_rank(const tz_comm *c);
int tz_comm_size(const tz_comm *c);
const char *tz_comm_backend(const tz_comm *c);

/* In all of these: `after` (may be NULL) is a fence the collective waits for before it starts;
 * nccl's stream waits for a fence of this comm by stream order, and nccl waits on the host for
 * any other pending fence. *done gets a fence the caller owns (done may be NULL: nobody waits).
 * Buffers are host memory for single and mpi and device memory for nccl. P is the world size.
 * In-place forms: all_gather with send == recv + rank * bytes, reduce_scatter with
 * recv == send + rank * count elements, all_reduce with send == recv. */

/* recv (P * bytes) gets every rank's send (bytes), rank r's at r * bytes. */
int tz_comm_all_gather(tz_comm *c, const void *send, void *recv, size_t bytes, tz_fence *after,
                       tz_fence **done);
/* send (P * count of dt): chunk r is this rank's contribution to rank r's shard.
 * recv (count of dt) gets the sum over ranks of their chunk for this rank. */
int tz_comm_reduce_scatter(tz_comm *c, const void *send, void *recv, size_t count, enum tz_dtype dt,
                           tz_fence *after, tz_fence **done);
/* recv (count of dt) gets the elementwise sum over ranks of send (count of dt). */
int tz_comm_all_reduce(tz_comm *c, const void *send, void *recv, size_t count, enum tz_dtype dt,
                       tz_fence *after, tz_fence **done);
/* buf (bytes) on every rank gets root's buf. */
int tz_comm_broadcast(tz_comm *c, void *buf, size_t bytes, int root, tz_fence *after,
                      tz_fence **done);
/* Completes when every rank has reached it. */
int tz_comm_barrier(tz_comm *c, tz_fence *after, tz_fence **done);

/* Gives up on the communicator after a local error, so that the other ranks stop instead of
 * waiting for this one: mpi calls MPI_Abort (ending the job: MPI has no gentler way), nccl calls
 * ncclCommAbort and fails every collective in flight; single only marks it failed. why is logged.
 */
void tz_comm_abort(tz_comm *c, int rc, const char *why);

/* The backend's own handle, for benchmarks that call the library directly on the same
 * communicator: "mpi_comm" (MPI_Comm *), "nccl_comm" (ncclComm_t *), "cuda_stream"
 * (cudaStream_t *). NULL when the backend has no such thing. Borrowed. */
void *tz_comm_native(tz_comm *c, const char *what);

#ifdef __cplusplus
}
#endif

#endif
