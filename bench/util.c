#include "bench/bench.h"
#include "util/size.h"

#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double tz_bench_median(double *v, int n) {
  if (n <= 0)
    return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t tz_bench_parse_size(const char *s) {
  uint64_t v;
  return tz_size_parse(s, TZ_SIZE_LETTER, &v) < 0 ? 0 : v;
}
