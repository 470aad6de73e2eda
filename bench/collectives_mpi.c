/* tz-bench collectives' baseline for the mpi backend: MPI_Allgather and MPI_Reduce_scatter_block
 * on the comm's own communicator, host buffers. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "collectives/comm.h"
#include "core/error.h"

struct mpi_direct {
  MPI_Comm comm;
  void *send, *recv;
};

static int setup(tz_comm *c, uint64_t max_bytes, void **ctx, void **send, void **recv) {
  MPI_Comm *mc = tz_comm_native(c, "mpi_comm");
  if (!mc)
    return tz_err_set(TZ_EINVAL, "bench: the comm is not an mpi comm");
  struct mpi_direct *d = calloc(1, sizeof *d);
  if (!d)
    return TZ_ENOMEM;
  d->comm = *mc;
  d->send = aligned_alloc(4096, max_bytes);
  d->recv = aligned_alloc(4096, max_bytes);
  if (!d->send || !d->recv) {
    free(d->send);
    free(d->recv);
    free(d);
    return tz_err_set(TZ_ENOMEM, "bench: no memory for 2 x %llu bytes",
                      (unsigned long long)max_bytes);
  }
  memset(d->send, 0, max_bytes);
  memset(d->recv, 0, max_bytes);
  *ctx = d;
  *send = d->send;
  *recv = d->recv;
  return 0;
}

static int all_gather(void *ctx, const void *send, void *recv, uint64_t bytes, int iters) {
  struct mpi_direct *d = ctx;
  for (int i = 0; i < iters; i++)
    if (MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, d->comm) !=
        MPI_SUCCESS)
      return tz_err_set(TZ_ECOMM, "bench: MPI_Allgather failed");
  return 0;
}

static int reduce_scatter(void *ctx, const void *send, void *recv, uint64_t count, int dtype,
                          int iters) {
  struct mpi_direct *d = ctx;
  if (dtype != TZ_F32)
    return tz_err_set(TZ_ENOTSUP, "bench: MPI has no bf16 sum to compare with");
  for (int i = 0; i < iters; i++)
    if (MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, d->comm) !=
        MPI_SUCCESS)
      return tz_err_set(TZ_ECOMM, "bench: MPI_Reduce_scatter_block failed");
  return 0;
}

static void teardown(void *ctx) {
  struct mpi_direct *d = ctx;
  if (!d)
    return;
  free(d->send);
  free(d->recv);
  free(d);
}

static const struct tz_bench_coll_direct mpi_direct = {
    .setup = setup,
    .all_gather = all_gather,
    .reduce_scatter = reduce_scatter,
    .teardown = teardown,
};

const struct tz_bench_coll_direct *tz_bench_coll_direct_mpi(void) { return &mpi_direct; }
