/* Sizes in bytes: parsing what people type ("16MiB", "1.5G", "4096") and formatting byte counts
 * for them to read.
 *
 * The programs accept different syntaxes and print in different styles, and scripts and tests
 * depend on each; so one parser and one formatter serve them all, each program naming its syntax
 * or style, rather than every program changing to one. */
#ifndef TZ_UTIL_SIZE_H
#define TZ_UTIL_SIZE_H

#include <stddef.h>
#include <stdint.h>

enum tz_size_syntax {
  /* The config's (core/config.h): decimal digits, an optional single space, an optional unit,
   * case-insensitive: B, kB (10^3), MB, GB, TB, PB, KiB (2^10), MiB, GiB, TiB, PiB. No sign,
   * fraction or exponent; at most INT64_MAX bytes. "16MiB", "2 GB", "4096". */
  TZ_SIZE_UNITS,
  /* tz-bench's: a whole number as strtoull reads it, an optional letter k, m or g (either case,
   * powers of two), then optionally 'i' or 'B' and then 'B': "4M", "128K", "64MiB", "4096". */
  TZ_SIZE_LETTER,
  /* tz-topo's: a real number as strtod reads it, not negative, an optional letter K, M, G or T
   * (either case, powers of two) optionally followed by B or iB (either case), rounded toward
   * zero; below 2^63. "1.5G", "64GiB", "512m", "4096". */
  TZ_SIZE_REAL,
  /* Environment overrides read by a backend: a whole number as strtoull reads it and an optional
   * letter k, m or g (either case, powers of two); whatever follows is ignored. */
  TZ_SIZE_LEADING,
};

/* Parses s in the given syntax into *out. 0, or -1 (and *out untouched) when s is not such a
 * size. A size of 0 is valid; callers that need a positive size check for it. */
int tz_size_parse(const char *s, enum tz_size_syntax syntax, uint64_t *out);

/* How tz_bytes_format prints. */
struct tz_bytes_style {
  int si;                  /* 1: powers of 1000 named kB, MB, GB...; 0: of 1024, KiB, MiB... */
  int max_unit;            /* the largest unit used: 0 B, 1 kB or KiB, ... 5 PB or PiB */
  unsigned char digits[6]; /* decimals printed in each unit, from B up */
};
/* The styles the programs print in. */
extern const struct tz_bytes_style tz_bytes_si;   /* "999 B", "1.50 GB" (metrics, lanes) */
extern const struct tz_bytes_style tz_bytes_iec;  /* "999 B", "1.5 GiB", "2.0 TiB" (topology) */
extern const struct tz_bytes_style tz_bytes_plan; /* "999 B", "1.5 KiB", "1.50 GiB", at most GiB
                                                   * (the plan's messages) */

/* "<value> <unit>" into buf (cut to len): bytes divided by the unit's multiple, in the largest
 * unit of the style it is at least 1 of; not finite values print as printf prints them ("nan B").
 */
void tz_bytes_format(char *buf, size_t len, double bytes, const struct tz_bytes_style *style);

#endif
