/* A fence that forwards another (tz_fence_forward) hands out the inner fence's backend object
 * while it is pending, so a device lane can wait on a transfer's fence without the host; and a
 * transfer with a host side gives such a fence. Runs without a GPU: the polled fence here is a
 * flag the test sets. */
#include "core/error.h"
#include "core/fence.h"
#include "core/progress.h"
#include "core/runtime.h"
#include "core/tier.h"
#include "testlib.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_NS (10ll * 1000000000ll)

struct flag {
  int set;       /* atomic: the "device work" has finished */
  int destroyed; /* atomic */
};

static int flag_poll(void *ctx) {
  struct flag *f = ctx;
  return __atomic_load_n(&f->set, __ATOMIC_ACQUIRE) ? 1 : 0;
}

static void flag_destroy(void *ctx) {
  struct flag *f = ctx;
  __atomic_add_fetch(&f->destroyed, 1, __ATOMIC_ACQ_REL);
}

static const struct tz_fence_poll_ops flag_ops = {
    .kind = "test-flag",
    .poll = flag_poll,
    .destroy = flag_destroy,
};
static const struct tz_fence_poll_ops other_ops = {.kind = "other", .poll = flag_poll};

static void test_forward_native(void **state) {
  (void)state;
  tz_progress *pe;
  TZ_ASSERT_OK(tz_progress_create(&pe));
  struct flag fl = {0, 0};
  tz_fence *inner = tz_fence_create_polled(pe, &flag_ops, &fl);
  assert_non_null(inner);
  tz_fence *outer = tz_fence_create();
  tz_fence_forward(outer, inner);
  /* A plain fence has no backend object; a forwarding one has its inner fence's, of its kind. */
  tz_fence *plain = tz_fence_create();
  assert_null(tz_fence_native(plain, &flag_ops));
  assert_ptr_equal(tz_fence_native(inner, &flag_ops), &fl);
  assert_ptr_equal(tz_fence_native(outer, &flag_ops), &fl);
  assert_null(tz_fence_native(outer, &other_ops));
  /* The inner fence completes; the outer one is still pending (its host bookkeeping has not run):
   * its object is still handed out, and still alive, since the outer fence holds the inner. */
  __atomic_store_n(&fl.set, 1, __ATOMIC_RELEASE);
  TZ_ASSERT_OK(tz_fence_wait(inner, WAIT_NS));
  tz_fence_release(inner);
  assert_int_equal(__atomic_load_n(&fl.destroyed, __ATOMIC_ACQUIRE), 0);
  assert_ptr_equal(tz_fence_native(outer, &flag_ops), &fl);
  assert_int_equal(tz_fence_query(outer), 0);
  /* Once the outer fence completes there is nothing to wait for. */
  tz_fence_signal(outer, 0);
  assert_null(tz_fence_native(outer, &flag_ops));
  tz_fence_release(outer);
  /* The inner fence goes with the outer one, or once the engine drops its own reference, which
   * it does just after signalling. */
  for (int i = 0; i < 100000 && __atomic_load_n(&fl.destroyed, __ATOMIC_ACQUIRE) == 0; i++) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(__atomic_load_n(&fl.destroyed, __ATOMIC_ACQUIRE), 1);
  tz_fence_release(plain);
  tz_progress_destroy(pe);
}

/* tz_transfer to or from a host tier wraps the copy's fence in one that forwards it. With host
 * tiers on both sides that copy's fence is a CPU lane's (no backend object): the transfer's fence
 * gives none either, and is a plain waitable fence. */
static void test_transfer_fence_forwards(void **state) {
  (void)state;
  tz_runtime *rt;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt));
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.capacity = 8 << 20;
  tz_tier *a, *b;
  p.name = "a";
  TZ_ASSERT_OK(tz_tier_create(rt, "host", &p, &a));
  p.name = "b";
  TZ_ASSERT_OK(tz_tier_create(rt, "host", &p, &b));
  tz_extent x, y;
  TZ_ASSERT_OK(tz_tier_alloc(a, 4 << 20, &x));
  TZ_ASSERT_OK(tz_tier_alloc(b, 4 << 20, &y));
  tz_test_fill(tz_tier_host_ptr(a, x.offset), 4 << 20, 3);
  tz_fence *f;
  TZ_ASSERT_OK(tz_transfer(rt, &y, 0, &x, 0, 4 << 20, &f));
  assert_null(tz_fence_native(f, &flag_ops));
  TZ_ASSERT_OK(tz_fence_wait(f, WAIT_NS));
  tz_fence_release(f);
  assert_memory_equal(tz_tier_host_ptr(b, y.offset), tz_tier_host_ptr(a, x.offset), 4 << 20);
  tz_runtime_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_native),
      cmocka_unit_test(test_transfer_fence_forwards),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
