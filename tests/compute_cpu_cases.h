/* What the cpu backend's op-by-op suites share (test_compute_cpu.c, test_compute_attention.c): an
 * instance with some threads, uniform floats in [0, 1) from testlib's generator. */
#ifndef TZ_TESTS_COMPUTE_CPU_CASES_H
#define TZ_TESTS_COMPUTE_CPU_CASES_H

#include <stdint.h>

#include "kernels/compute.h"
#include "testlib.h"

static inline tz_compute *cpu(int threads) {
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  p.n_threads = threads;
  tz_compute *cm;
  TZ_ASSERT_OK(tz_compute_create("cpu", &p, &cm));
  return cm;
}

static inline float urand(uint64_t *st) {
  return (float)((double)(tz_test_rand(st) >> 11) * 0x1.0p-53);
}

#endif
