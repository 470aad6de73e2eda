/* Parsing and formatting sizes (util/size.h). */
#include "util/size.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The power of two a unit letter stands for (K 10, M 20, G 30, T 40, P 50), either case, among
 * the first `count` of them; 0 for any other character. */
static int letter_shift(char c, int count) {
  static const char letters[] = "KMGTP";
  for (int i = 0; i < count; i++)
    if (toupper((unsigned char)c) == letters[i])
      return 10 * (i + 1);
  return 0;
}

static int parse_units(const char *s, uint64_t *out) {
  static const struct {
    const char *unit;
    uint64_t mult;
  } units[] = {
      {"B", 1},
      {"kB", 1000ull},
      {"KB", 1000ull},
      {"MB", 1000000ull},
      {"GB", 1000000000ull},
      {"TB", 1000000000000ull},
      {"PB", 1000000000000000ull},
      {"KiB", 1ull << 10},
      {"MiB", 1ull << 20},
      {"GiB", 1ull << 30},
      {"TiB", 1ull << 40},
      {"PiB", 1ull << 50},
  };
  const char *p = s;
  uint64_t v = 0;
  if (!isdigit((unsigned char)*p))
    return -1;
  for (; isdigit((unsigned char)*p); p++)
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
      return -1;
  if (*p == ' ')
    p++;
  uint64_t mult = 1;
  if (*p) {
    mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
      if (strcasecmp(p, units[i].unit) == 0)
        mult = units[i].mult;
    if (!mult)
      return -1;
  } else if (p != s && p[-1] == ' ') {
    return -1; /* a trailing space without a unit */
  }
  if (__builtin_mul_overflow(v, mult, &v) || v > (uint64_t)INT64_MAX)
    return -1;
  *out = v;
  return 0;
}

/* TZ_SIZE_LETTER and TZ_SIZE_LEADING: strtoull's number (so also its leading blanks), shifted by
 * the letter. A minus sign (strtoull reads "-1" as 2^64 - 1) and a size past 2^64 are refused. */
static int parse_letter(const char *s, int rest_ignored, uint64_t *out) {
  char *end;
  const char *p = s + strspn(s, " \t\n\v\f\r");
  if (*p == '-')
    return -1;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s || errno == ERANGE)
    return -1;
  int shift = letter_shift(*end, 3);
  if (shift) {
    if (v > (~0ull >> shift))
      return -1;
    v <<= shift;
    end++;
  }
  if (!rest_ignored) {
    if (*end == 'i' || *end == 'B')
      end++;
    if (*end == 'B')
      end++;
    if (*end)
      return -1;
  }
  *out = (uint64_t)v;
  return 0;
}

static int parse_real(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || v < 0 || errno)
    return -1;
  double mul = 1;
  if (*end) {
    int shift = letter_shift(*end, 4);
    if (!shift)
      return -1;
    mul = (double)(1ull << shift);
    if (end[1] && strcasecmp(end + 1, "B") && strcasecmp(end + 1, "iB"))
      return -1;
  }
  double bytes = v * mul;
  /* NaN, infinity and sizes of 2^63 and more are no size (they do not fit a signed count). */
  if (!(bytes < 9223372036854775808.0))
    return -1;
  *out = (uint64_t)bytes;
  return 0;
}

int tz_size_parse(const char *s, enum tz_size_syntax syntax, uint64_t *out) {
  if (!s)
    return -1;
  switch (syntax) {
  case TZ_SIZE_UNITS: return parse_units(s, out);
  case TZ_SIZE_LETTER: return parse_letter(s, 0, out);
  case TZ_SIZE_REAL: return parse_real(s, out);
  case TZ_SIZE_LEADING: return parse_letter(s, 1, out);
  }
  return -1;
}

const struct tz_bytes_style tz_bytes_si = {.si = 1, .max_unit = 5, .digits = {0, 2, 2, 2, 2, 2}};
const struct tz_bytes_style tz_bytes_iec = {.si = 0, .max_unit = 5, .digits = {0, 1, 1, 1, 1, 1}};
const struct tz_bytes_style tz_bytes_plan = {.si = 0, .max_unit = 3, .digits = {0, 1, 2, 2}};

void tz_bytes_format(char *buf, size_t len, double bytes, const struct tz_bytes_style *style) {
  static const char *const si[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  static const char *const iec[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double base = style->si ? 1000.0 : 1024.0;
  int max = style->max_unit < 0 ? 0 : style->max_unit > 5 ? 5 : style->max_unit;
  int u = 0;
  /* Repeated division, not one by the unit's multiple: the printed digits were always made so. */
  while (bytes >= base && u < max) {
    bytes /= base;
    u++;
  }
  snprintf(buf, len, "%.*f %s", (int)style->digits[u], bytes, style->si ? si[u] : iec[u]);
}
