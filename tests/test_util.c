/* util/: clocks, size parsing and formatting, splitmix64 mixing, crc32c, mkdir -p and atomic
 * writes with fault hooks. */
#define _GNU_SOURCE
#include "testlib.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "util/clock.h"
#include "util/crc32.h"
#include "util/crc32c.h"
#include "util/file.h"
#include "util/mix.h"
#include "util/size.h"

/* ---- clocks ---- */

static void test_clock(void **state) {
  (void)state;
  uint64_t a = tz_now_ns();
  double s0 = tz_now_s();
  usleep(20000);
  uint64_t b = tz_now_ns();
  double s1 = tz_now_s();
  assert_true(b - a >= 20000000ull);
  assert_true(b - a < 5000000000ull);
  assert_true(s1 - s0 >= 0.02);
  /* one clock: the two readings agree to well under a millisecond */
  assert_true(fabs(1e-9 * (double)tz_now_ns() - tz_now_s()) < 1e-3);
  /* a deadline 1.5 s on: normalised, and that far from now */
  struct timespec now, dl = tz_deadline(CLOCK_MONOTONIC, 1500000000ull);
  clock_gettime(CLOCK_MONOTONIC, &now);
  assert_true(dl.tv_nsec >= 0 && dl.tv_nsec < 1000000000L);
  double ahead = (double)(dl.tv_sec - now.tv_sec) + 1e-9 * (double)(dl.tv_nsec - now.tv_nsec);
  assert_true(ahead > 1.4 && ahead <= 1.5);
  for (int i = 0; i < 1000; i++) {
    uint64_t t = tz_now_ns();
    assert_true(t >= b);
    b = t;
  }
}

/* ---- sizes ---- */

struct size_case {
  const char *s;
  int ok;
  uint64_t v;
};

static void check_sizes(enum tz_size_syntax syn, const struct size_case *c, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t v = 12345;
    int rc = tz_size_parse(c[i].s, syn, &v);
    if (rc != (c[i].ok ? 0 : -1) || (c[i].ok && v != c[i].v) || (!c[i].ok && v != 12345))
      fail_msg("syntax %d: '%s' -> %d, %llu (expected %s %llu)", (int)syn, c[i].s, rc,
               (unsigned long long)v, c[i].ok ? "ok" : "an error", (unsigned long long)c[i].v);
  }
}

static void test_size_units(void **state) {
  (void)state;
  static const struct size_case c[] = {
      {"4096", 1, 4096},
      {"0", 1, 0},
      {"16MiB", 1, 16ull << 20},
      {"2 GB", 1, 2000000000ull},
      {"1kb", 1, 1000},
      {"1KIB", 1, 1024},
      {"3 b", 1, 3},
      {"1PiB", 1, 1ull << 50},
      {"9223372036854775807", 1, 9223372036854775807ull},
      {"9223372036854775808", 0, 0},
      {"18446744073709551616", 0, 0},
      {"8192PiB", 0, 0},
      {"1.5GB", 0, 0},
      {"16M", 0, 0},
      {"-1", 0, 0},
      {" 1", 0, 0},
      {"1 ", 0, 0},
      {"1  MB", 0, 0},
      {"", 0, 0},
      {"MB", 0, 0},
  };
  check_sizes(TZ_SIZE_UNITS, c, sizeof c / sizeof c[0]);
}

static void test_size_letter(void **state) {
  (void)state;
  static const struct size_case c[] = {
      {"4096", 1, 4096},
      {"0", 1, 0},
      {"4M", 1, 4ull << 20},
      {"128K", 1, 128ull << 10},
      {"64MiB", 1, 64ull << 20},
      {"1g", 1, 1ull << 30},
      {"4MB", 1, 4ull << 20},
      {"7B", 1, 7},
      {"4T", 0, 0},
      {"x", 0, 0},
      {"", 0, 0},
      {"4 M", 0, 0},
      {"4MiBx", 0, 0},
      {"1.5M", 0, 0},
      /* strtoull read "-1" as 2^64 - 1 (tz-bench tiers --size -1: issue 48) */
      {"-1", 0, 0},
      {" -4M", 0, 0},
      {"18446744073709551616", 0, 0},
      {"17179869184G", 0, 0},
  };
  check_sizes(TZ_SIZE_LETTER, c, sizeof c / sizeof c[0]);
}

static void test_size_real(void **state) {
  (void)state;
  static const struct size_case c[] = {
      {"1.5G", 1, 1610612736ull},
      {"64GiB", 1, 64ull << 30},
      {"512m", 1, 512ull << 20},
      {"1T", 1, 1ull << 40},
      {"4096", 1, 4096},
      {"2kb", 1, 2048},
      {"0.5K", 1, 512},
      {"1e3", 1, 1000},
      {"1.9", 1, 1},
      {"1B", 0, 0},
      {"-1", 0, 0},
      {"1Gx", 0, 0},
      {"1P", 0, 0},
      {"inf", 0, 0},
      {"nan", 0, 0},
      {"1e30", 0, 0},
      {"8192P", 0, 0},
      {"", 0, 0},
  };
  check_sizes(TZ_SIZE_REAL, c, sizeof c / sizeof c[0]);
}

static void test_size_leading(void **state) {
  (void)state;
  static const struct size_case c[] = {
      {"4M", 1, 4ull << 20},
      {"4MiB", 1, 4ull << 20},
      {"8k pieces", 1, 8192},
      {"64", 1, 64},
      {"x", 0, 0},
      {"", 0, 0},
  };
  check_sizes(TZ_SIZE_LEADING, c, sizeof c / sizeof c[0]);
}

static void test_bytes_format(void **state) {
  (void)state;
  static const struct {
    const struct tz_bytes_style *st;
    double b;
    const char *out;
  } c[] = {
      {&tz_bytes_si, 999, "999 B"},
      {&tz_bytes_si, 1500, "1.50 kB"},
      {&tz_bytes_si, 1.5e9, "1.50 GB"},
      {&tz_bytes_si, 1e18, "1000.00 PB"},
      {&tz_bytes_iec, 1023, "1023 B"},
      {&tz_bytes_iec, 1536, "1.5 KiB"},
      {&tz_bytes_iec, 3.0 * (1ull << 40), "3.0 TiB"},
      {&tz_bytes_iec, (double)(1ull << 60), "1024.0 PiB"},
      {&tz_bytes_plan, 1023, "1023 B"},
      {&tz_bytes_plan, 1536, "1.5 KiB"},
      {&tz_bytes_plan, 1.5 * (1 << 20), "1.50 MiB"},
      {&tz_bytes_plan, 5.0 * (1ull << 40), "5120.00 GiB"},
  };
  char buf[32];
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    tz_bytes_format(buf, sizeof buf, c[i].b, c[i].st);
    assert_string_equal(buf, c[i].out);
  }
  tz_bytes_format(buf, sizeof buf, NAN, &tz_bytes_si);
  assert_string_equal(buf, "nan B");
  tz_bytes_format(buf, 5, 1536, &tz_bytes_iec); /* cut to the buffer */
  assert_string_equal(buf, "1.5 ");
}

/* ---- mixing ---- */

static void test_mix(void **state) {
  (void)state;
  /* splitmix64's published sequence from state 0 */
  uint64_t s = 0;
  assert_true(tz_mix_next(&s) == 0xe220a8397b1dcdafull);
  assert_true(tz_mix_next(&s) == 0x6e789e6aa1b965f4ull);
  assert_true(tz_mix_next(&s) == 0x06c45d188009454full);
  assert_true(s == 3 * TZ_MIX_GAMMA);
  /* The finalizer alone (initialisation) and with the increment (data order) differ. */
  assert_true(tz_mix_init(0) == 0);
  assert_true(tz_mix_init(12345) == 0xf36cf1164265dd51ull);
  assert_true(tz_mix_data(0) == 0xe220a8397b1dcdafull);
  assert_true(tz_mix_data(12345) == tz_mix_init(12345 + TZ_MIX_GAMMA));
}

/* ---- crc32c ---- */

static void test_crc32c(void **state) {
  (void)state;
  assert_true(tz_crc32c(0, "123456789", 9) == 0xe3069283u);
  unsigned char z[32], ff[32];
  memset(z, 0, sizeof z);
  memset(ff, 0xff, sizeof ff);
  assert_true(tz_crc32c(0, z, sizeof z) == 0x8a9136aau); /* RFC 3720 B.4 */
  assert_true(tz_crc32c(0, ff, sizeof ff) == 0x62a8ab43u);
  assert_true(tz_crc32c(0, NULL, 0) == 0);
  /* Extending piece by piece gives the checksum of the whole, at every split and alignment. */
  unsigned char buf[301];
  tz_test_fill(buf, sizeof buf, 7);
  uint32_t whole = tz_crc32c(0, buf, sizeof buf);
  for (size_t cut = 0; cut <= sizeof buf; cut += 13)
    assert_true(tz_crc32c(tz_crc32c(0, buf, cut), buf + cut, sizeof buf - cut) == whole);
  buf[100] ^= 1;
  assert_true(tz_crc32c(0, buf, sizeof buf) != whole);
}

/* ---- crc32 (zlib's, for tz-data's mask files) ---- */

/* The check value of the IEEE polynomial, and zlib.crc32 of 1000 bytes (i*7+3)&255 and of its
 * first 13 (Python's), extended piece by piece at every split. */
static void test_crc32(void **state) {
  (void)state;
  assert_true(tz_crc32(0, "123456789", 9) == 0xcbf43926u);
  unsigned char b[1000];
  for (int i = 0; i < 1000; i++)
    b[i] = (unsigned char)((i * 7 + 3) & 255);
  assert_true(tz_crc32(0, b, sizeof b) == 0x17bc2a46u);
  assert_true(tz_crc32(0, b, 13) == 0xa97ad5c1u);
  for (size_t cut = 0; cut <= sizeof b; cut += 7)
    assert_true(tz_crc32(tz_crc32(0, b, cut), b + cut, sizeof b - cut) == 0x17bc2a46u);
  assert_true(tz_crc32(0, NULL, 0) == 0);
}

/* ---- files ---- */

/* Fault hooks for the tests: count operations by kind, fail the fail_at-th with fail_errno. */
struct hook_log {
  int ops[TZ_FILE_RMDIR + 1];
  int n, fail_at, fail_errno;
};

static int hook_before(void *ctx, enum tz_file_op op, const char *path) {
  (void)path;
  struct hook_log *l = ctx;
  l->ops[op]++;
  return ++l->n == l->fail_at ? l->fail_errno : 0;
}

static int is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static char *join(const char *a, const char *b) {
  char *p = NULL;
  assert_true(asprintf(&p, "%s/%s", a, b) > 0);
  return p;
}

static void test_mkdir_p(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("util");
  assert_non_null(root);
  char *deep = join(root, "a/b/c/"), *file = join(root, "x/y/f.json");
  struct hook_log log = {0};
  struct tz_file_hooks h = {.before = hook_before, .ctx = &log};

  assert_int_equal(tz_file_mkdir_p(&h, deep, TZ_MKDIR_DURABLE), 0);
  assert_true(is_dir(deep));
  assert_int_equal(log.ops[TZ_FILE_MKDIR], 3);
  assert_int_equal(log.ops[TZ_FILE_FSYNC], 3); /* each new directory's parent */
  /* existing: nothing to do */
  log = (struct hook_log){0};
  assert_int_equal(tz_file_mkdir_p(&h, deep, TZ_MKDIR_DURABLE), 0);
  assert_int_equal(log.n, 0);
  /* not durable: no fsync */
  char *e1 = join(root, "e/f");
  assert_int_equal(tz_file_mkdir_p(&h, e1, 0), 0);
  assert_int_equal(log.ops[TZ_FILE_MKDIR], 2);
  assert_int_equal(log.ops[TZ_FILE_FSYNC], 0);
  /* a file's directories only */
  assert_int_equal(tz_file_mkdir_p(NULL, file, TZ_MKDIR_PARENTS), 0);
  char *y = join(root, "x/y");
  assert_true(is_dir(y));
  assert_int_equal(access(file, F_OK), -1);
  /* a file in the way */
  FILE *fp = fopen(file, "w");
  assert_non_null(fp);
  fclose(fp);
  char *under = join(file, "z");
  assert_int_equal(tz_file_mkdir_p(NULL, file, 0), ENOTDIR);
  assert_int_equal(tz_file_mkdir_p(NULL, under, 0), ENOTDIR);
  /* a fault at the second mkdir: its errno, and nothing past it */
  char *g = join(root, "g/h/i");
  log = (struct hook_log){.fail_at = 2, .fail_errno = ENOSPC};
  assert_int_equal(tz_file_mkdir_p(&h, g, 0), ENOSPC);
  char *gh = join(root, "g/h");
  assert_false(is_dir(gh));
  assert_int_equal(log.n, 2);
  free(deep), free(file), free(e1), free(y), free(under), free(g), free(gh);
  tz_test_rmdir(root);
}

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp)
    return NULL;
  char *buf = calloc(1, 4096);
  size_t n = fread(buf, 1, 4095, fp);
  buf[n] = 0;
  fclose(fp);
  return buf;
}

static void test_atomic_write(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("util");
  assert_non_null(root);
  char *path = join(root, "config.json"), *tmp = join(root, "config.json.tmp");
  struct hook_log log = {0};
  struct tz_file_hooks h = {.before = hook_before, .ctx = &log};
  struct tz_atomic_params p = {.what = "test", .hooks = &h};

  TZ_ASSERT_OK(tz_atomic_write_file(path, "one", 3, &p));
  char *got = slurp(path);
  assert_string_equal(got, "one");
  free(got);
  assert_int_equal(access(tmp, F_OK), -1);
  assert_int_equal(log.ops[TZ_FILE_CREATE], 1);
  assert_int_equal(log.ops[TZ_FILE_FSYNC], 2); /* the file, then its directory */
  assert_int_equal(log.ops[TZ_FILE_RENAME], 1);

  /* A stale temporary file from a crashed writer is replaced. */
  FILE *fp = fopen(tmp, "w");
  assert_non_null(fp);
  fputs("stale and longer", fp);
  fclose(fp);
  tz_atomic_file *f;
  TZ_ASSERT_OK(tz_atomic_open(path, &p, &f));
  assert_string_equal(tz_atomic_tmp_path(f), tmp);
  TZ_ASSERT_OK(tz_atomic_write(f, "tw", 2));
  TZ_ASSERT_OK(tz_atomic_write(f, "o", 1));
  got = slurp(path);
  assert_string_equal(got, "one"); /* not published before the commit */
  free(got);
  TZ_ASSERT_OK(tz_atomic_commit(f));
  got = slurp(path);
  assert_string_equal(got, "two");
  free(got);

  /* Each failing point leaves the old contents and no temporary file. */
  for (int at = 1; at <= 4; at++) {
    log = (struct hook_log){.fail_at = at, .fail_errno = ENOSPC};
    int rc = tz_atomic_write_file(path, "three", 5, &p);
    assert_int_equal(rc, TZ_ENOSPC);
    assert_non_null(strstr(tz_err_msg(), "test: "));
    got = slurp(path);
    assert_string_equal(got, "two");
    free(got);
    assert_int_equal(access(tmp, F_OK), -1);
  }
  /* The fifth point, the directory's fsync, fails after the rename: the new name is published. */
  log = (struct hook_log){.fail_at = 5, .fail_errno = EIO};
  assert_int_equal(tz_atomic_write_file(path, "four", 4, &p), TZ_EIO);
  got = slurp(path);
  assert_string_equal(got, "four");
  free(got);

  /* No sync: no fsync at all; a temporary name with the process id; abort leaves no trace. */
  log = (struct hook_log){0};
  p.flags = TZ_ATOMIC_NO_SYNC;
  p.tmp_pid = 1;
  TZ_ASSERT_OK(tz_atomic_open(path, &p, &f));
  char want[64];
  snprintf(want, sizeof want, "config.json.%d.tmp", (int)getpid());
  assert_non_null(strstr(tz_atomic_tmp_path(f), want));
  char *pidtmp = strdup(tz_atomic_tmp_path(f));
  TZ_ASSERT_OK(tz_atomic_write(f, "five", 4));
  tz_atomic_abort(f);
  assert_int_equal(access(pidtmp, F_OK), -1);
  TZ_ASSERT_OK(tz_atomic_write_file(path, "six", 3, &p));
  assert_int_equal(log.ops[TZ_FILE_FSYNC], 0);
  got = slurp(path);
  assert_string_equal(got, "six");
  free(got);
  tz_atomic_abort(NULL);

  /* A directory that does not exist: the message names the temporary file. */
  char *nowhere = join(root, "no/such/file");
  assert_int_equal(tz_atomic_write_file(nowhere, "x", 1, NULL), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), "file: cannot create"));
  free(nowhere), free(pidtmp), free(path), free(tmp);
  tz_test_rmdir(root);
}

static void test_file_ops(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("util");
  assert_non_null(root);
  char *a = join(root, "a"), *b = join(root, "b"), *d = join(root, "d");
  int fd = -1;
  assert_int_equal(tz_file_create(NULL, a, 0644, &fd), 0);
  assert_int_equal(tz_file_pwrite(NULL, fd, "hello", 5, 2), 0);
  assert_int_equal(tz_file_fsync(NULL, fd), 0);
  close(fd);
  assert_int_equal(tz_file_create(NULL, a, 0644, &fd), EEXIST);
  assert_int_equal(tz_file_create(NULL, b, 0600, &fd), 0);
  assert_int_equal(tz_file_pwrite(NULL, fd, "B", 1, 0), 0);
  close(fd);
  struct stat sb;
  assert_int_equal(stat(b, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
  assert_int_equal(tz_file_exchange(NULL, a, b), 0);
  char *got = slurp(a);
  assert_string_equal(got, "B");
  free(got);
  assert_int_equal(tz_file_rename(NULL, b, a), 0);
  assert_int_equal(access(b, F_OK), -1);
  assert_int_equal(tz_file_mkdir(NULL, d), 0);
  assert_int_equal(tz_file_mkdir(NULL, d), EEXIST);
  assert_int_equal(tz_file_fsync_dir(NULL, d), 0);
  assert_int_equal(tz_file_fsync_dir(NULL, a), ENOTDIR);
  assert_int_equal(tz_file_rmdir(NULL, d), 0);
  assert_int_equal(tz_file_unlink(NULL, a), 0);
  assert_int_equal(tz_file_unlink(NULL, a), ENOENT);
  /* a hook's errno fails the operation before it is done */
  struct hook_log log = {.fail_at = 1, .fail_errno = EROFS};
  struct tz_file_hooks h = {.before = hook_before, .ctx = &log};
  assert_int_equal(tz_file_mkdir(&h, d), EROFS);
  assert_false(is_dir(d));
  free(a), free(b), free(d);
  tz_test_rmdir(root);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_clock),        cmocka_unit_test(test_size_units),
      cmocka_unit_test(test_size_letter),  cmocka_unit_test(test_size_real),
      cmocka_unit_test(test_size_leading), cmocka_unit_test(test_bytes_format),
      cmocka_unit_test(test_mix),          cmocka_unit_test(test_crc32c),
      cmocka_unit_test(test_crc32),        cmocka_unit_test(test_mkdir_p),
      cmocka_unit_test(test_atomic_write), cmocka_unit_test(test_file_ops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
