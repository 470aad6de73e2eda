/* tz-bench subcommands: one file each, listed in tz-bench.c's table. Each returns a process
 * exit code (0 ok, 1 failed, 2 usage, 77 skipped: the machine lacks what it needs). */
#ifndef TZ_BENCH_H
#define TZ_BENCH_H

#include <stdint.h>

int tz_bench_tiers(int argc, char **argv);   /* bench/tiers.c */
int tz_bench_prefetch(int argc, char **argv); /* bench/prefetch.c */

/* What tz-bench tiers passes on to its GPU rows (bench/tiers_gpu.cu). */
struct tz_bench_tiers_opts {
  int json;
  const char *path; /* directory on the drive */
  uint64_t size;    /* bytes per measurement */
  int reps;
};

/* Wall-clock seconds, monotonic. */
double tz_bench_now(void);
/* Median of n values (sorts v in place). */
double tz_bench_median(double *v, int n);
/* Parses "4M", "1G", "128K", "4096" (powers of two); returns 0 on error. */
uint64_t tz_bench_parse_size(const char *s);

#endif
