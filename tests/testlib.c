#define _GNU_SOURCE
#include "testlib.h"
#include "trainer/data/data.h"
#include "util/crc32.h"
#include "util/mix.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void tz_test_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "SKIP: ");
  vfprintf(stdout, fmt, ap);
  fprintf(stdout, "\n");
  va_end(ap);
  fflush(stdout);
  exit(TZ_TEST_SKIP);
}

char *tz_test_mkdtemp(const char *tag) {
  const char *base = getenv("TZ_TEST_TMPDIR");
  if (!base || !*base)
    base = "/tmp";
  char *path = NULL;
  if (asprintf(&path, "%s/tz-%s-XXXXXX", base, tag) < 0)
    return NULL;
  if (!mkdtemp(path)) {
    free(path);
    return NULL;
  }
  return path;
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}

void tz_test_rmdir(char *dir) {
  if (!dir)
    return;
  nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

uint64_t tz_test_rand(uint64_t *s) { return tz_mix_next(s); }

void tz_test_fill(void *buf, size_t n, uint64_t seed) {
  uint8_t *p = buf;
  uint64_t s = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = tz_test_rand(&s);
    memcpy(p + i, &v, 8);
  }
  if (i < n) {
    uint64_t v = tz_test_rand(&s);
    memcpy(p + i, &v, n - i);
  }
}

void tz_test_write_mask(const char *path, const uint32_t *tok, const uint8_t *m, size_t n) {
  uint16_t *t16 = malloc((n ? n : 1) * sizeof *t16);
  char *mp = malloc(strlen(path) + 8);
  assert_true(t16 && mp);
  for (size_t i = 0; i < n; i++)
    t16[i] = (uint16_t)tok[i];
  uint32_t hdr[TZ_DATA_SHARD_HEADER_INTS] = {TZ_DATA_MASK_MAGIC, 1, (uint32_t)n,
                                             tz_crc32(0, t16, n * 2), tz_crc32(0, m, n)};
  for (size_t i = 0; i < n; i++) {
    hdr[5] += m[i] & TZ_DATA_MASK_TARGET;
    hdr[6] += (m[i] & TZ_DATA_MASK_START) != 0;
  }
  sprintf(mp, "%s.mask", path);
  FILE *f = fopen(mp, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(hdr, sizeof hdr, 1, f), 1);
  assert_int_equal(fwrite(m, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
  free(t16);
  free(mp);
}
