#include "core/cpuset.h"

#include "core/error.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORDS (TZ_CPUSET_MAX / 64)

void tz_cpuset_zero(tz_cpuset *s) { memset(s, 0, sizeof *s); }

void tz_cpuset_set(tz_cpuset *s, int cpu) {
  if (cpu >= 0 && cpu < TZ_CPUSET_MAX)
    s->bits[cpu / 64] |= 1ull << (cpu % 64);
}

int tz_cpuset_isset(const tz_cpuset *s, int cpu) {
  if (cpu < 0 || cpu >= TZ_CPUSET_MAX)
    return 0;
  return (int)((s->bits[cpu / 64] >> (cpu % 64)) & 1);
}

int tz_cpuset_count(const tz_cpuset *s) {
  int n = 0;
  for (int i = 0; i < WORDS; i++)
    n += __builtin_popcountll(s->bits[i]);
  return n;
}

int tz_cpuset_empty(const tz_cpuset *s) {
  for (int i = 0; i < WORDS; i++)
    if (s->bits[i])
      return 0;
  return 1;
}

int tz_cpuset_equal(const tz_cpuset *a, const tz_cpuset *b) {
  return memcmp(a->bits, b->bits, sizeof a->bits) == 0;
}

int tz_cpuset_intersects(const tz_cpuset *a, const tz_cpuset *b) {
  for (int i = 0; i < WORDS; i++)
    if (a->bits[i] & b->bits[i])
      return 1;
  return 0;
}

int tz_cpuset_includes(const tz_cpuset *super, const tz_cpuset *sub) {
  for (int i = 0; i < WORDS; i++)
    if (sub->bits[i] & ~super->bits[i])
      return 0;
  return 1;
}

void tz_cpuset_or(tz_cpuset *dst, const tz_cpuset *src) {
  for (int i = 0; i < WORDS; i++)
    dst->bits[i] |= src->bits[i];
}

void tz_cpuset_andnot(tz_cpuset *dst, const tz_cpuset *src) {
  for (int i = 0; i < WORDS; i++)
    dst->bits[i] &= ~src->bits[i];
}

int tz_cpuset_next(const tz_cpuset *s, int from) {
  if (from < 0)
    from = 0;
  for (int w = from / 64; w < WORDS; w++) {
    uint64_t v = s->bits[w];
    if (w == from / 64)
      v &= ~0ull << (from % 64);
    if (v)
      return w * 64 + __builtin_ctzll(v);
  }
  return -1;
}

int tz_cpuset_format(const tz_cpuset *s, char *buf, size_t len) {
  size_t need = 0;
  if (len)
    buf[0] = '\0';
  for (int c = tz_cpuset_next(s, 0); c >= 0;) {
    int end = c;
    while (end + 1 < TZ_CPUSET_MAX && tz_cpuset_isset(s, end + 1))
      end++;
    char item[32];
    int n = end == c ? snprintf(item, sizeof item, "%s%d", need ? "," : "", c)
                     : snprintf(item, sizeof item, "%s%d-%d", need ? "," : "", c, end);
    if (need + (size_t)n < len)
      memcpy(buf + need, item, (size_t)n + 1);
    else if (need < len)
      buf[need] = '\0';
    need += (size_t)n;
    c = tz_cpuset_next(s, end + 1);
  }
  return (int)need;
}

static int parse_index(const char **p, const char *text, int *out) {
  if (!isdigit((unsigned char)**p))
    return tz_err_set(TZ_EINVAL, "cpu list \"%s\": expected a number at \"%s\"", text, *p);
  char *end;
  long v = strtol(*p, &end, 10);
  if (v >= TZ_CPUSET_MAX)
    return tz_err_set(TZ_EINVAL, "cpu list \"%s\": cpu %ld is beyond the %d this build handles",
                      text, v, TZ_CPUSET_MAX);
  *p = end;
  *out = (int)v;
  return 0;
}

int tz_cpuset_parse(tz_cpuset *s, const char *text) {
  tz_cpuset_zero(s);
  const char *p = text;
  while (isspace((unsigned char)*p))
    p++;
  if (*p == '\0')
    return 0;
  for (;;) {
    int lo = 0, hi = 0;
    TZ_CHECK(parse_index(&p, text, &lo));
    hi = lo;
    if (*p == '-') {
      p++;
      TZ_CHECK(parse_index(&p, text, &hi));
      if (hi < lo)
        return tz_err_set(TZ_EINVAL, "cpu list \"%s\": range %d-%d runs backwards", text, lo, hi);
    }
    for (int c = lo; c <= hi; c++)
      tz_cpuset_set(s, c);
    while (isspace((unsigned char)*p))
      p++;
    if (*p == '\0')
      return 0;
    if (*p != ',')
      return tz_err_set(TZ_EINVAL, "cpu list \"%s\": unexpected \"%s\"", text, p);
    p++;
  }
}
