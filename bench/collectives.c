/* tz-bench collectives: all-gather and reduce-scatter bus bandwidth through tz_comm, beside the
 * same MPI or NCCL calls made directly on the same communicator and buffers in the same run. The
 * two are interleaved, and the median of each kept.
 *
 * Sizes are nccl-tests' "size": the whole gathered buffer (all-gather) or the whole input
 * (reduce-scatter). algbw = size / time and busbw = algbw * (P - 1) / P, nccl-tests' definition,
 * so the figures read against theirs. Each timing is a batch of back-to-back collectives that
 * starts after a barrier and ends when the last completes (rank 0's clock). */
#define _GNU_SOURCE
#include "bench/bench.h"
#include "collectives/comm.h"
#include "core/error.h"
#include "util/clock.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_AG, OP_RS };
static const char *const op_names[] = {"all_gather", "reduce_scatter"};

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: tz-bench collectives [--backend mpi|nccl] [--nproc N] [--min BYTES] [--max BYTES]\n"
      "                            [--reps N] [--dtype f32|bf16] [--json]\n"
      "  All-gather and reduce-scatter bus bandwidth through tz_comm beside MPI_Allgather /\n"
      "  MPI_Reduce_scatter_block or ncclAllGather / ncclReduceScatter called directly on the\n"
      "  same communicator. Run with mpirun -np N, with torchrun-style variables, or with\n"
      "  --nproc N (nccl: one worker per GPU).\n"
      "  --backend B   mpi or nccl (default: nccl where there is a GPU, else mpi)\n"
      "  --nproc N     start N workers on this machine (nccl)\n"
      "  --min --max   size range, doubling (default 1M..1G for nccl, 1M..64M for mpi)\n"
      "  --reps N      interleaved repetitions; the median is kept (default 5)\n"
      "  --dtype D     reduce-scatter payload (default f32)\n"
      "  --json        one JSON object per row\n");
}

static int wait_last(tz_fence *last, int rc) {
  if (last) {
    int w = tz_fence_wait(last, -1);
    if (rc == 0)
      rc = w;
    tz_fence_release(last);
  }
  return rc;
}

/* iters collectives back to back through the comm; waits for the last (they complete in order). */
static int run_ours(tz_comm *c, int op, const void *send, void *recv, uint64_t count,
                    enum tz_dtype dt, size_t es, int iters) {
  tz_fence *last = NULL;
  int rc = 0;
  for (int i = 0; i < iters && rc == 0; i++) {
    tz_fence *f = NULL;
    rc = op == OP_AG ? tz_comm_all_gather(c, send, recv, count * es, NULL, &f)
                     : tz_comm_reduce_scatter(c, send, recv, count, dt, NULL, &f);
    if (rc == 0) {
      tz_fence_release(last);
      last = f;
    }
  }
  return wait_last(last, rc);
}

static int run_direct(const struct tz_bench_coll_direct *d, void *ctx, int op, const void *send,
                      void *recv, uint64_t count, enum tz_dtype dt, size_t es, int iters) {
  return op == OP_AG ? d->all_gather(ctx, send, recv, count * es, iters)
                     : d->reduce_scatter(ctx, send, recv, count, (int)dt, iters);
}

static int barrier(tz_comm *c) {
  tz_fence *f = NULL;
  int rc = tz_comm_barrier(c, NULL, &f);
  return wait_last(f, rc);
}

int tz_bench_collectives(int argc, char **argv) {
  const char *backend = NULL, *dtype = "f32";
  int nproc = 0, reps = 5, json = 0;
  uint64_t min = 1 << 20, max = 0;
  static const struct option longopts[] = {{"backend", required_argument, 0, 'B'},
                                           {"nproc", required_argument, 0, 'n'},
                                           {"min", required_argument, 0, 'a'},
                                           {"max", required_argument, 0, 'b'},
                                           {"reps", required_argument, 0, 'r'},
                                           {"dtype", required_argument, 0, 'd'},
                                           {"json", no_argument, 0, 'j'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  int ch;
  optind = 1;
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
    case 'B': backend = optarg; break;
    case 'n': nproc = atoi(optarg); break;
    case 'a': min = tz_bench_parse_size(optarg); break;
    case 'b': max = tz_bench_parse_size(optarg); break;
    case 'r': reps = atoi(optarg); break;
    case 'd': dtype = optarg; break;
    case 'j': json = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  enum tz_dtype dt = TZ_F32;
  if (strcmp(dtype, "bf16") == 0)
    dt = TZ_BF16;
  else if (strcmp(dtype, "f32") != 0) {
    usage(stderr);
    return 2;
  }
  if (!min || reps < 1 || reps > 99 || nproc < 0 || (max && max < min)) {
    usage(stderr);
    return 2;
  }
  if (nproc > 1 && !tz_launch_is_worker() && backend && strcmp(backend, "nccl") == 0) {
    char why[256] = "";
    int gpus = tz_comm_probe("nccl", why, sizeof why);
    if (gpus < nproc) {
      fprintf(stderr, "tz-bench collectives: --nproc %d needs %d GPUs: %s\n", nproc, nproc,
              gpus < 0 ? why : "fewer are visible");
      return 77;
    }
  }
  if (nproc > 1 && !tz_launch_is_worker()) {
    /* Workers run this same command line; tz-bench's own name goes first again. */
    char **wargv = calloc((size_t)argc + 2, sizeof *wargv);
    if (!wargv)
      return 1;
    wargv[0] = "tz-bench";
    for (int i = 0; i < argc; i++)
      wargv[i + 1] = argv[i];
    int code = tz_launch_nproc(nproc, argc + 1, wargv);
    free(wargv);
    return code;
  }
  char why[256] = "";
  if (!backend)
    backend = tz_comm_probe("nccl", why, sizeof why) >= 0 ? "nccl" : "mpi";
  const struct tz_bench_coll_direct *direct = NULL;
  if (strcmp(backend, "mpi") == 0 && tz_bench_coll_direct_mpi)
    direct = tz_bench_coll_direct_mpi();
  else if (strcmp(backend, "nccl") == 0 && tz_bench_coll_direct_nccl)
    direct = tz_bench_coll_direct_nccl();
  if (tz_comm_probe(backend, why, sizeof why) < 0 || !direct) {
    fprintf(stderr, "tz-bench collectives: backend %s: %s\n", backend,
            why[0] ? why : "not in this build");
    return 77;
  }
  if (!max)
    max = strcmp(backend, "mpi") == 0 ? 64ull << 20 : 1ull << 30;

  struct tz_bootstrap bs;
  tz_comm *c = NULL;
  if (tz_bootstrap_detect(&bs) < 0 || tz_comm_create(backend, &bs, NULL, &c) < 0) {
    fprintf(stderr, "tz-bench collectives: %s\n", tz_err_msg());
    return 1;
  }
  int P = tz_comm_size(c), me = tz_comm_rank(c);
  if (P < 2) {
    fprintf(stderr, "tz-bench collectives: a world of one has nothing to measure: run under "
                    "mpirun -np N, or with --nproc N\n");
    tz_comm_destroy(c);
    return 77;
  }
  void *dctx = NULL, *send = NULL, *recv = NULL;
  if (direct->setup(c, max, &dctx, &send, &recv) < 0) {
    fprintf(stderr, "tz-bench collectives: rank %d: %s\n", me, tz_err_msg());
    tz_comm_destroy(c);
    return 1;
  }
  size_t es_rs = dt == TZ_F32 ? 4 : 2;
  if (me == 0 && !json)
    printf("collectives over %s, %d ranks, reduce-scatter of %s, median of %d; busbw = size/t * "
           "(P-1)/P (nccl-tests); direct = %s on the same communicator\n"
           "%-15s %10s %6s %12s %12s %7s\n",
           backend, P, dtype, reps,
           strcmp(backend, "mpi") == 0 ? "MPI_Allgather / MPI_Reduce_scatter_block"
                                       : "ncclAllGather / ncclReduceScatter",
           "op", "size", "iters", "tz GB/s", "direct GB/s", "ratio");
  int rc = 0;
  double worst_big = 0;
  for (uint64_t size = min; size <= max && rc == 0; size *= 2) {
    for (int op = OP_AG; op <= OP_RS && rc == 0; op++) {
      size_t es = op == OP_AG ? 1 : es_rs;
      uint64_t count = size / ((uint64_t)P * es); /* per rank: bytes, or elements to reduce */
      if (count == 0)
        continue;
      if (op == OP_AG) /* whole words, as a caller's tensors are */
        count &= ~(uint64_t)255;
      double bytes = (double)(count * es * (uint64_t)P);
      /* Enough back-to-back collectives that a batch takes well over the completion latency. */
      uint64_t batch = strcmp(backend, "mpi") == 0 ? 256ull << 20 : 4ull << 30;
      int iters = (int)(batch / size);
      iters = iters < 2 ? 2 : iters > 50 ? 50 : iters;
      double ours[99], raw[99];
      /* Warm-up: connections, scratch buffers, pages. */
      rc = run_ours(c, op, send, recv, count, dt, es, 1);
      if (rc == 0)
        rc = run_direct(direct, dctx, op, send, recv, count, dt, es, 1);
      for (int r = 0; r < reps && rc == 0; r++) {
        for (int k = 0; k < 2 && rc == 0; k++) {
          int first_ours = r % 2 == 0; /* alternate which goes first */
          int is_ours = k == 0 ? first_ours : !first_ours;
          if ((rc = barrier(c)) < 0)
            break;
          double t0 = tz_now_s();
          rc = is_ours ? run_ours(c, op, send, recv, count, dt, es, iters)
                       : run_direct(direct, dctx, op, send, recv, count, dt, es, iters);
          double t = (tz_now_s() - t0) / iters;
          (is_ours ? ours : raw)[r] = bytes / t * (double)(P - 1) / (double)P / 1e9;
        }
      }
      if (rc < 0)
        break;
      double o = tz_bench_median(ours, reps), d = tz_bench_median(raw, reps);
      double ratio = d > 0 ? o / d : 0;
      if (bytes >= 64.0 * (1 << 20) && (worst_big == 0 || ratio < worst_big))
        worst_big = ratio;
      if (me != 0)
        continue;
      if (json)
        printf("{\"bench\":\"collectives\",\"backend\":\"%s\",\"op\":\"%s\",\"ranks\":%d,"
               "\"dtype\":\"%s\",\"bytes\":%.0f,\"iters\":%d,\"busbw_gbps\":%.4f,"
               "\"direct_busbw_gbps\":%.4f,\"ratio\":%.4f}\n",
               backend, op_names[op], P, op == OP_AG ? "u8" : dtype, bytes, iters, o, d, ratio);
      else
        printf("%-15s %9.1fM %6d %12.2f %12.2f %7.3f\n", op_names[op], bytes / (1 << 20), iters, o,
               d, ratio);
      fflush(stdout);
    }
  }
  if (rc < 0)
    fprintf(stderr, "tz-bench collectives: rank %d: %s\n", me, tz_err_msg());
  else if (me == 0 && !json && worst_big > 0)
    printf("lowest ratio at 64 MiB and above: %.3f (target 0.95)\n", worst_big);
  direct->teardown(dctx);
  tz_comm_destroy(c);
  return rc < 0 ? 1 : 0;
}
