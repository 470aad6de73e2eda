/* tz-bench subcommands: one file each, listed in tz-bench.c's table. Each returns a process
 * exit code (0 ok, 1 failed, 2 usage, 77 skipped: the machine lacks what it needs). */
#ifndef TZ_BENCH_H
#define TZ_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

int tz_bench_tiers(int argc, char **argv);       /* bench/tiers.c */
int tz_bench_adam(int argc, char **argv);        /* bench/adam.c */
int tz_bench_collectives(int argc, char **argv); /* bench/collectives.c */
int tz_bench_layer(int argc, char **argv);       /* bench/layer.c */
int tz_bench_prefetch(int argc, char **argv);    /* bench/prefetch.c */

/* bench/adam_cuda.cu, CUDA builds only (weak, so bench/adam.c links without it): GPU Adam on n
 * parameters against device-to-device copy bandwidth; prints a line (or a JSON object). Returns
 * an exit code (77: no GPU). */
int tz_bench_adam_gpu(size_t n, enum tz_dtype gdt, int has_copy, enum tz_dtype cdt, int reps,
                      int json) __attribute__((weak));

/* tz-bench prefetch on a GPU (CUDA builds only; weak, so bench/prefetch.c links without them and
 * uses the CPU lane). bench/prefetch_gpu.c: the compute lane as a CUDA stream of the hbm tier
 * (tz_hbm_lane_create), and a lane job that launches the spin on the lane's stream without
 * waiting for it. bench/spin.cu: the spin kernel, `seconds` long on the GPU's timer; -1 with the
 * CUDA error in why when the launch fails. */
typedef struct tz_tier tz_tier;
typedef struct tz_lane tz_lane;
struct tz_bench_gpu_spin_arg {
  tz_lane *lane;
  double seconds;
};
int tz_bench_gpu_lane_create(tz_tier *hbm, tz_lane **out) __attribute__((weak));
int tz_bench_gpu_spin_job(void *arg) __attribute__((weak));
int tz_bench_gpu_spin(void *cuda_stream, double seconds, char *why, size_t why_len)
    __attribute__((weak));

/* What `tz-bench tiers` hands its GPU rows. */
struct tz_bench_tiers_opts {
  int json;         /* one JSON object per row instead of a table */
  const char *path; /* a directory on the drive for the nvme rows; NULL: tmpfs (/dev/shm) only */
  uint64_t size;    /* bytes moved per measurement; 0: 1 GiB */
  int reps;         /* repetitions, tier and raw interleaved, the median kept; the GPU rows take
                     * at least 5 */
};
/* bench/tiers_gpu.c, in CUDA builds only (bench/CMakeLists.txt): the GPU rows of `tz-bench
 * tiers`. Returns 0, 1 (failed, with a message on stderr) or 77 (no GPU: nothing printed on
 * stdout, the reason on stderr). */
int tz_bench_tiers_gpu(const struct tz_bench_tiers_opts *o);

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

/* Median of n values (sorts v in place). */
double tz_bench_median(double *v, int n);
/* Parses "4M", "1G", "128K", "4096" (powers of two; util/size.h, TZ_SIZE_LETTER); returns 0 on
 * error. */
uint64_t tz_bench_parse_size(const char *s);

#endif
