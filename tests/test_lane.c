/* Lanes through the generic interface, on CPU lanes: tz_lane_order (recorded on one lane, waited
 * on by the other), timing marks refused by a lane that cannot time, and the registry of device
 * lanes refusing a host tier. The CUDA-stream lanes' own order and marks are in test_hbm.c. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/lane.h"
#include "core/runtime.h"
#include "core/tier.h"
#include "testlib.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_NS (30ll * 1000000000ll)

static int g_flag, g_seen;

static int set_late(void *arg) {
  (void)arg;
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  __atomic_store_n(&g_flag, 1, __ATOMIC_RELEASE);
  return 0;
}

static int read_flag(void *arg) {
  (void)arg;
  g_seen = __atomic_load_n(&g_flag, __ATOMIC_ACQUIRE);
  return 0;
}

static int failing_job(void *arg) {
  (void)arg;
  return tz_err_set(TZ_EIO, "test: a failing job");
}

static int wait_release(tz_fence *f) {
  int rc = tz_fence_wait(f, WAIT_NS);
  tz_fence_release(f);
  return rc;
}

/* Work submitted to `to` after tz_lane_order runs after what `from` had: both ways, and a failed
 * job on `from` reaches `to` as a failed input. */
static void test_order(void **state) {
  (void)state;
  tz_lane *a, *b;
  TZ_ASSERT_OK(tz_lane_create_cpu("a", &a));
  TZ_ASSERT_OK(tz_lane_create_cpu("b", &b));
  for (int dir = 0; dir < 2; dir++) {
    tz_lane *from = dir ? b : a, *to = dir ? a : b;
    g_flag = 0;
    g_seen = -1;
    TZ_ASSERT_OK(tz_lane_submit(from, set_late, NULL));
    TZ_ASSERT_OK(tz_lane_order(from, to));
    TZ_ASSERT_OK(tz_lane_submit(to, read_flag, NULL));
    tz_fence *f;
    TZ_ASSERT_OK(tz_lane_record(to, &f));
    TZ_ASSERT_OK(wait_release(f));
    assert_int_equal(g_seen, 1);
  }
  TZ_ASSERT_OK(tz_lane_submit(a, failing_job, NULL));
  TZ_ASSERT_OK(tz_lane_order(a, b));
  tz_fence *f;
  TZ_ASSERT_OK(tz_lane_record(b, &f));
  assert_int_equal(wait_release(f), TZ_EIO);
  tz_lane_destroy(a);
  tz_lane_destroy(b);
}

/* A CPU lane cannot time its work: the caller times it on the host. */
static void test_timer_refused(void **state) {
  (void)state;
  tz_lane *l;
  TZ_ASSERT_OK(tz_lane_create_cpu("cpu", &l));
  tz_lane_timer *t = (tz_lane_timer *)l;
  assert_int_equal(tz_lane_timer_create(l, 4, &t), TZ_ENOTSUP);
  assert_null(t);
  tz_lane_timer_destroy(NULL);
  tz_lane_destroy(l);
}

/* A host tier has no device lanes; the error names the tier. */
static void test_device_lane_refused(void **state) {
  (void)state;
  tz_runtime *rt;
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  TZ_ASSERT_OK(tz_runtime_create(&rp, &rt));
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.name = "some-host";
  p.capacity = 1 << 20;
  tz_tier *t;
  TZ_ASSERT_OK(tz_tier_create(rt, "host", &p, &t));
  tz_lane *l = (tz_lane *)t;
  assert_int_equal(tz_lane_create_device(t, NULL, NULL, &l), TZ_ENOTSUP);
  assert_null(l);
  assert_non_null(strstr(tz_err_msg(), "some-host"));
  tz_tier_destroy(t);
  tz_runtime_destroy(rt);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order),
      cmocka_unit_test(test_timer_refused),
      cmocka_unit_test(test_device_lane_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
