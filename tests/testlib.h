/* What every test executable shares: cmocka, a skip convention, temporary directories, random data.
 */
#ifndef TZ_TESTLIB_H
#define TZ_TESTLIB_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* ctest's SKIP_RETURN_CODE: the machine lacks what the test needs. */
#define TZ_TEST_SKIP 77

/* Prints "SKIP: <why>" and exits 77. Call from main, before cmocka runs. */
_Noreturn void tz_test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A fresh directory under $TZ_TEST_TMPDIR (or /tmp), removed with its files by tz_test_rmdir. */
char *tz_test_mkdtemp(const char *tag);
void tz_test_rmdir(char *dir);

/* Deterministic pseudo-random bytes (splitmix64 of seed and index). */
void tz_test_fill(void *buf, size_t n, uint64_t seed);
uint64_t tz_test_rand(uint64_t *state);

/* Fine-tuning data as tools/tz-data writes it (docs/data.md): the mask file of the n tokens
 * (tok[] < 65536, an llm.c shard of version 1 at path) with bytes m, at path + ".mask", its
 * header's crc32s and counts computed. Asserts on failure. */
void tz_test_write_mask(const char *path, const uint32_t *tok, const uint8_t *m, size_t n);

/* Asserts rc == 0 and prints the thread's error message when it is not. */
#define TZ_ASSERT_OK(call)                                                                         \
  do {                                                                                             \
    int tz_t_rc_ = (call);                                                                         \
    if (tz_t_rc_ != 0)                                                                             \
      print_error("%s -> %d (%s): %s\n", #call, tz_t_rc_, tz_strerror(tz_t_rc_), tz_err_msg());    \
    assert_int_equal(tz_t_rc_, 0);                                                                 \
  } while (0)

/* Asserts |a - b| <= rel |b| (relative closeness to the expected b), printing both when not. */
#define TZ_ASSERT_REL(a, b, rel)                                                                   \
  do {                                                                                             \
    double tz_t_a_ = (a), tz_t_b_ = (b);                                                           \
    if (!(fabs(tz_t_a_ - tz_t_b_) <= (rel)*fabs(tz_t_b_)))                                         \
      print_error("%s = %.17g, expected %.17g\n", #a, tz_t_a_, tz_t_b_);                           \
    assert_true(fabs(tz_t_a_ - tz_t_b_) <= (rel)*fabs(tz_t_b_));                                   \
  } while (0)

#endif
