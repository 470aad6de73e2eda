/* CPU sets by OS index (the numbers taskset, numactl and /proc/cpuinfo use), as a plain value type
 * that can be copied, compared and printed without a topology. TZ_CPUSET_MAX matches glibc's
 * CPU_SETSIZE; an index at or above it is refused with TZ_EINVAL where one is parsed. */
#ifndef TZ_CPUSET_H
#define TZ_CPUSET_H

#include <stddef.h>
#include <stdint.h>

#define TZ_CPUSET_MAX 1024

typedef struct tz_cpuset {
  uint64_t bits[TZ_CPUSET_MAX / 64];
} tz_cpuset;

void tz_cpuset_zero(tz_cpuset *s);
void tz_cpuset_set(tz_cpuset *s, int cpu); /* cpu outside [0, TZ_CPUSET_MAX) is ignored */
int tz_cpuset_isset(const tz_cpuset *s, int cpu);
int tz_cpuset_count(const tz_cpuset *s);
int tz_cpuset_empty(const tz_cpuset *s);
int tz_cpuset_equal(const tz_cpuset *a, const tz_cpuset *b);
int tz_cpuset_intersects(const tz_cpuset *a, const tz_cpuset *b);
int tz_cpuset_includes(const tz_cpuset *super, const tz_cpuset *sub); /* sub is within super */
void tz_cpuset_or(tz_cpuset *dst, const tz_cpuset *src);
void tz_cpuset_andnot(tz_cpuset *dst, const tz_cpuset *src); /* dst &= ~src */
/* First set index at or after from, or -1. Iterate: for (c = next(s, 0); c >= 0; c = next(s, c +
 * 1)) */
int tz_cpuset_next(const tz_cpuset *s, int from);

/* "0-3,8,10-11" (the kernel's cpulist format; "" for an empty set). Returns the length the full
 * string needs, like snprintf; the output is truncated to len - 1 characters. */
int tz_cpuset_format(const tz_cpuset *s, char *buf, size_t len);
/* Parses the cpulist format ("" and whitespace around it allowed). TZ_EINVAL with a message that
 * quotes the text on a syntax error or an index >= TZ_CPUSET_MAX. */
int tz_cpuset_parse(tz_cpuset *s, const char *text);

#endif
