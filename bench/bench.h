/* tz-bench subcommands: one file each, listed in tz-bench.c's table. Each returns a process
 * exit code (0 ok, 1 failed, 2 usage, 77 skipped: the machine lacks what it needs). */
#ifndef TZ_BENCH_H
#define TZ_BENCH_H

#include <stdint.h>

int tz_bench_tiers(int argc, char **argv);   /* bench/tiers.c */
int tz_bench_collectives(int argc, char **argv); /* bench/collectives.c */

/* What tz-bench tiers passes on to its GPU rows (bench/tiers_gpu.cu). */
struct tz_bench_tiers_opts {
  int json;
  const char *path; /* directory on the drive */
  uint64_t size;    /* bytes per measurement */
  int reps;
};

/* The baseline tz-bench collectives sets beside the comm: the same library calls made directly on
 * the comm's own communicator (bench/collectives_mpi.c, bench/collectives_nccl.c, built when the
 * library is). Buffers are where the backend wants them (host for mpi, device for nccl). */
typedef struct tz_comm tz_comm;
struct tz_bench_coll_direct {
  /* Allocates send and recv of max_bytes each, set to zero. */
  int (*setup)(tz_comm *c, uint64_t max_bytes, void **ctx, void **send, void **recv);
  /* iters back-to-back calls, then waits for the last; 0 or a negative code. */
  int (*all_gather)(void *ctx, const void *send, void *recv, uint64_t bytes_per_rank, int iters);
  int (*reduce_scatter)(void *ctx, const void *send, void *recv, uint64_t count, int dtype,
                        int iters);
  void (*teardown)(void *ctx);
};
const struct tz_bench_coll_direct *tz_bench_coll_direct_mpi(void) __attribute__((weak));
const struct tz_bench_coll_direct *tz_bench_coll_direct_nccl(void) __attribute__((weak));

/* Wall-clock seconds, monotonic. */
double tz_bench_now(void);
/* Median of n values (sorts v in place). */
double tz_bench_median(double *v, int n);
/* Parses "4M", "1G", "128K", "4096" (powers of two); returns 0 on error. */
uint64_t tz_bench_parse_size(const char *s);

#endif
