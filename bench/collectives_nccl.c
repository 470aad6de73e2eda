/* tz-bench collectives' baseline for the nccl backend: ncclAllGather and ncclReduceScatter on the
 * comm's own communicator and stream, device buffers, the stream synchronized after the last. */
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>

#include "bench/bench.h"
#include "collectives/comm.h"
#include "core/error.h"

struct nccl_direct {
  ncclComm_t comm;
  cudaStream_t stream;
  void *send, *recv;
};

static int setup(tz_comm *c, uint64_t max_bytes, void **ctx, void **send, void **recv) {
  ncclComm_t *nc = tz_comm_native(c, "nccl_comm");
  cudaStream_t *s = tz_comm_native(c, "cuda_stream");
  if (!nc || !s)
    return tz_err_set(TZ_EINVAL, "bench: the comm is not an nccl comm");
  struct nccl_direct *d = calloc(1, sizeof *d);
  if (!d)
    return TZ_ENOMEM;
  d->comm = *nc;
  d->stream = *s;
  cudaError_t e = cudaMalloc(&d->send, max_bytes);
  if (e == cudaSuccess)
    e = cudaMalloc(&d->recv, max_bytes);
  if (e == cudaSuccess)
    e = cudaMemset(d->send, 0, max_bytes);
  if (e == cudaSuccess)
    e = cudaMemset(d->recv, 0, max_bytes);
  if (e != cudaSuccess) {
    cudaFree(d->send);
    cudaFree(d->recv);
    free(d);
    return tz_err_set(TZ_ECUDA, "bench: 2 x %llu bytes of device memory: %s",
                      (unsigned long long)max_bytes, cudaGetErrorString(e));
  }
  *ctx = d;
  *send = d->send;
  *recv = d->recv;
  return 0;
}

/* The comm is non-blocking: a call that returns ncclInProgress is still being launched, and the
 * next call must wait until it is. */
static ncclResult_t settle(struct nccl_direct *d, ncclResult_t r) {
  while (r == ncclInProgress)
    if (ncclCommGetAsyncError(d->comm, &r) != ncclSuccess)
      return ncclInternalError;
  return r;
}

static int finish(struct nccl_direct *d, ncclResult_t r, const char *what) {
  if (r != ncclSuccess)
    return tz_err_set(TZ_ECOMM, "bench: %s: %s", what, ncclGetErrorString(r));
  cudaError_t e = cudaStreamSynchronize(d->stream);
  return e == cudaSuccess ? 0 : tz_err_set(TZ_ECUDA, "bench: %s: %s", what, cudaGetErrorString(e));
}

static int all_gather(void *ctx, const void *send, void *recv, uint64_t bytes, int iters) {
  struct nccl_direct *d = ctx;
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < iters && r == ncclSuccess; i++)
    r = settle(d, ncclAllGather(send, recv, bytes, ncclUint8, d->comm, d->stream));
  return finish(d, r, "ncclAllGather");
}

static int reduce_scatter(void *ctx, const void *send, void *recv, uint64_t count, int dtype,
                          int iters) {
  struct nccl_direct *d = ctx;
  ncclDataType_t t = dtype == TZ_BF16 ? ncclBfloat16 : dtype == TZ_F16 ? ncclFloat16 : ncclFloat32;
  ncclResult_t r = ncclSuccess;
  for (int i = 0; i < iters && r == ncclSuccess; i++)
    r = settle(d, ncclReduceScatter(send, recv, count, t, ncclSum, d->comm, d->stream));
  return finish(d, r, "ncclReduceScatter");
}

static void teardown(void *ctx) {
  struct nccl_direct *d = ctx;
  if (!d)
    return;
  cudaFree(d->send);
  cudaFree(d->recv);
  free(d);
}

static const struct tz_bench_coll_direct nccl_direct = {
    .setup = setup,
    .all_gather = all_gather,
    .reduce_scatter = reduce_scatter,
    .teardown = teardown,
};

const struct tz_bench_coll_direct *tz_bench_coll_direct_nccl(void) { return &nccl_direct; }
