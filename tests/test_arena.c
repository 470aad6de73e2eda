/* The arena allocator against a simple reference model (a map of which units are taken) under
 * random sequences of allocations and frees. */
#include "core/arena.h"
#include "core/error.h"
#include "testlib.h"

#include <stdlib.h>
#include <string.h>

#define UNITS 512
#define ALIGN 256

struct live {
  uint64_t off, len;
};

/* The reference: a fit exists iff some run of free units is long enough. */
static int ref_has_run(const unsigned char *taken, uint64_t units) {
  uint64_t run = 0;
  for (int i = 0; i < UNITS; i++) {
    run = taken[i] ? 0 : run + 1;
    if (run >= units)
      return 1;
  }
  return 0;
}

static void check_stats(tz_arena *a, const unsigned char *taken, int n_live) {
  struct tz_arena_stats st;
  tz_arena_stats(a, &st);
  uint64_t used = 0, largest = 0, run = 0, ranges = 0;
  for (int i = 0; i < UNITS; i++) {
    used += taken[i];
    if (taken[i]) {
      run = 0;
    } else {
      ranges += run == 0;
      run++;
      if (run > largest)
        largest = run;
    }
  }
  assert_int_equal(st.used, used * ALIGN);
  assert_int_equal(st.free, (UNITS - used) * ALIGN);
  assert_int_equal(st.largest_free, largest * ALIGN);
  assert_int_equal(st.n_extents, n_live);
  assert_int_equal(st.n_free_ranges, ranges); /* free neighbours are always merged */
}

static void test_random_against_reference(void **state) {
  (void)state;
  for (uint64_t seed = 1; seed <= 20; seed++) {
    tz_arena *a;
    TZ_ASSERT_OK(tz_arena_create(UNITS * ALIGN, ALIGN, &a));
    unsigned char taken[UNITS] = {0};
    struct live live[UNITS];
    int n_live = 0;
    uint64_t s = seed;
    for (int step = 0; step < 4000; step++) {
      if (n_live == 0 || tz_test_rand(&s) % 100 < 55) {
        uint64_t bytes = 1 + tz_test_rand(&s) % (tz_test_rand(&s) % 4 ? 4 * ALIGN : 64 * ALIGN);
        uint64_t units = (bytes + ALIGN - 1) / ALIGN;
        uint64_t off;
        int rc = tz_arena_alloc(a, bytes, &off);
        if (rc == TZ_ENOMEM) {
          assert_false(ref_has_run(taken, units));
          continue;
        }
        assert_int_equal(rc, 0);
        assert_int_equal(off % ALIGN, 0);
        assert_int_equal(tz_arena_size(a, off), units * ALIGN);
        for (uint64_t u = off / ALIGN; u < off / ALIGN + units; u++) {
          assert_true(u < UNITS);
          assert_int_equal(taken[u], 0); /* never hands out what is taken */
          taken[u] = 1;
        }
        live[n_live++] = (struct live){off, units};
      } else {
        int i = (int)(tz_test_rand(&s) % (uint64_t)n_live);
        TZ_ASSERT_OK(tz_arena_free(a, live[i].off));
        for (uint64_t u = live[i].off / ALIGN; u < live[i].off / ALIGN + live[i].len; u++)
          taken[u] = 0;
        live[i] = live[--n_live];
      }
      if (step % 50 == 0)
        check_stats(a, taken, n_live);
    }
    while (n_live)
      TZ_ASSERT_OK(tz_arena_free(a, live[--n_live].off));
    memset(taken, 0, sizeof taken);
    check_stats(a, taken, 0);
    tz_arena_destroy(a);
  }
}

static void test_bad_frees_and_sizes(void **state) {
  (void)state;
  tz_arena *a;
  TZ_ASSERT_OK(tz_arena_create(1 << 20, 4096, &a));
  uint64_t off;
  assert_int_equal(tz_arena_alloc(a, 0, &off), TZ_EINVAL);
  TZ_ASSERT_OK(tz_arena_alloc(a, 1, &off));
  assert_int_equal(tz_arena_free(a, off + 4096), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "is not an allocation"));
  TZ_ASSERT_OK(tz_arena_free(a, off));
  assert_int_equal(tz_arena_free(a, off), TZ_EINVAL); /* a double free is caught */
  assert_int_equal(tz_arena_alloc(a, UINT64_MAX - 10, &off), TZ_ENOMEM);
  tz_arena_destroy(a);
  assert_int_equal(tz_arena_create(1 << 20, 3000, &a), TZ_EINVAL);
}

static void test_fragmentation_reported(void **state) {
  (void)state;
  tz_arena *a;
  TZ_ASSERT_OK(tz_arena_create(8 * 4096, 4096, &a));
  uint64_t o[8];
  for (int i = 0; i < 8; i++)
    TZ_ASSERT_OK(tz_arena_alloc(a, 4096, &o[i]));
  for (int i = 0; i < 8; i += 2)
    TZ_ASSERT_OK(tz_arena_free(a, o[i]));
  struct tz_arena_stats st;
  tz_arena_stats(a, &st);
  assert_int_equal(st.free, 4 * 4096);
  assert_int_equal(st.largest_free, 4096);
  assert_true(st.fragmentation > 0.74 && st.fragmentation < 0.76);
  uint64_t off;
  assert_int_equal(tz_arena_alloc(a, 2 * 4096, &off), TZ_ENOMEM); /* free, but not in one piece */
  tz_arena_stats(a, &st);
  assert_int_equal(st.failed, 1);
  tz_arena_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_against_reference),
      cmocka_unit_test(test_bad_frees_and_sizes),
      cmocka_unit_test(test_fragmentation_reported),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
