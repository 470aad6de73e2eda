/* Fences, CPU lanes and the progress engine: completion, callbacks, combined fences, polled
 * fences, errors with their messages, timeouts, and jitter. */
#include "core/error.h"
#include "core/fence.h"
#include "core/pool.h"
#include "core/progress.h"
#include "testlib.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void cb_count(void *arg, int rc) {
  __atomic_add_fetch((int *)arg, rc == 0 ? 1 : 1000, __ATOMIC_RELAXED);
}

static void test_signal_wait_callbacks(void **state) {
  (void)state;
  tz_fence *f = tz_fence_create();
  int count = 0;
  assert_int_equal(tz_fence_query(f), 0);
  TZ_ASSERT_OK(tz_fence_then(f, cb_count, &count));
  TZ_ASSERT_OK(tz_fence_then(f, cb_count, &count));
  assert_int_equal(tz_fence_wait(f, 1000000), TZ_ETIMEDOUT);
  tz_fence_signal(f, 0);
  assert_int_equal(count, 2);
  assert_int_equal(tz_fence_query(f), 1);
  TZ_ASSERT_OK(tz_fence_wait(f, -1));
  TZ_ASSERT_OK(tz_fence_then(f, cb_count, &count)); /* already done: runs at once */
  assert_int_equal(count, 3);
  tz_fence_release(f);
}

static void test_error_message_reaches_waiter(void **state) {
  (void)state;
  tz_fence *f = tz_fence_create();
  tz_fence_signal_msg(f, TZ_EIO, "disk: read of 4096 bytes at /x offset 8 failed");
  tz_err_clear();
  assert_int_equal(tz_fence_wait(f, -1), TZ_EIO);
  assert_string_equal(tz_err_msg(), "disk: read of 4096 bytes at /x offset 8 failed");
  assert_int_equal(tz_fence_query(f), TZ_EIO);
  tz_fence_release(f);
}

static void test_all(void **state) {
  (void)state;
  tz_fence *f[5];
  for (int i = 0; i < 5; i++)
    f[i] = tz_fence_create();
  tz_fence *all = tz_fence_all(f, 5);
  for (int i = 0; i < 4; i++)
    tz_fence_signal(f[i], 0);
  assert_int_equal(tz_fence_query(all), 0);
  tz_fence_signal_msg(f[4], TZ_ENOSPC, "full");
  assert_int_equal(tz_fence_wait(all, -1), TZ_ENOSPC);
  assert_string_equal(tz_err_msg(), "full");
  tz_fence_release(all);
  for (int i = 0; i < 5; i++)
    tz_fence_release(f[i]);
  tz_fence *none = tz_fence_all(NULL, 0);
  assert_int_equal(tz_fence_query(none), 1);
  tz_fence_release(none);
}

/* A callback added while the signalling thread still runs an earlier one must run after it, not
 * at once on the adding thread (a lane's wait meter relies on its callback running before the
 * lane's own: the phase it measures is freed once the lane has run it). */
struct order {
  tz_fence *f;
  sem_t started, go;
  int first_done; /* atomic */
  int second_saw; /* first_done as the second callback found it; -1 not run */
};

static void cb_first(void *arg, int rc) {
  (void)rc;
  struct order *o = arg;
  sem_post(&o->started);
  sem_wait(&o->go);
  __atomic_store_n(&o->first_done, 1, __ATOMIC_RELEASE);
}

static void cb_second(void *arg, int rc) {
  (void)rc;
  struct order *o = arg;
  o->second_saw = __atomic_load_n(&o->first_done, __ATOMIC_ACQUIRE);
}

static void *signal_thread(void *arg) {
  tz_fence_signal(((struct order *)arg)->f, 0);
  return NULL;
}

static void test_then_while_signalling_runs_after_earlier(void **state) {
  (void)state;
  struct order o = {.f = tz_fence_create(), .second_saw = -1};
  sem_init(&o.started, 0, 0);
  sem_init(&o.go, 0, 0);
  TZ_ASSERT_OK(tz_fence_then(o.f, cb_first, &o));
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, signal_thread, &o), 0);
  sem_wait(&o.started); /* f is complete now, and its first callback is running */
  assert_int_equal(tz_fence_query(o.f), 1);
  TZ_ASSERT_OK(tz_fence_then(o.f, cb_second, &o));
  sem_post(&o.go);
  pthread_join(t, NULL);
  assert_int_equal(o.second_saw, 1);
  /* Once the signalling thread is done, a callback runs at once again. */
  o.second_saw = -1;
  TZ_ASSERT_OK(tz_fence_then(o.f, cb_second, &o));
  assert_int_equal(o.second_saw, 1);
  sem_destroy(&o.started);
  sem_destroy(&o.go);
  tz_fence_release(o.f);
}

static int job_sleep(void *arg) {
  usleep(20000);
  __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
  return 0;
}

static int job_fail(void *arg) {
  (void)arg;
  return tz_err_set(TZ_EIO, "job failed on purpose");
}

static void test_pool_runs_concurrently(void **state) {
  (void)state;
  tz_pool *p;
  TZ_ASSERT_OK(tz_pool_create(2, "test", &p));
  int flag = 0;
  tz_fence *f;
  TZ_ASSERT_OK(tz_pool_submit(p, job_sleep, &flag, &f));
  /* The caller goes on while the job runs: a synchronous lane would have set the flag already. */
  assert_int_equal(__atomic_load_n(&flag, __ATOMIC_ACQUIRE), 0);
  assert_int_equal(tz_fence_query(f), 0);
  TZ_ASSERT_OK(tz_fence_wait(f, 5000000000ll));
  assert_int_equal(flag, 1);
  tz_fence_release(f);
  TZ_ASSERT_OK(tz_pool_submit(p, job_fail, NULL, &f));
  assert_int_equal(tz_fence_wait(f, 5000000000ll), TZ_EIO);
  assert_string_equal(tz_err_msg(), "job failed on purpose");
  tz_fence_release(f);
  tz_pool_destroy(p);
}

struct countdown {
  int left; /* atomic */
  int destroyed;
};

static int poll_countdown(void *ctx) {
  struct countdown *c = ctx;
  return __atomic_sub_fetch(&c->left, 1, __ATOMIC_ACQ_REL) <= 0 ? 1 : 0;
}

static void destroy_countdown(void *ctx) { ((struct countdown *)ctx)->destroyed = 1; }

static const struct tz_fence_poll_ops countdown_ops = {
    .kind = "countdown", .poll = poll_countdown, .destroy = destroy_countdown};

static void test_polled_fences(void **state) {
  (void)state;
  for (int jitter = 0; jitter <= 1; jitter++) {
    tz_progress *pe;
    TZ_ASSERT_OK(tz_progress_create(&pe));
    if (jitter)
      tz_progress_set_jitter(pe, 200, 7);
    enum { N = 100 };
    struct countdown c[N];
    tz_fence *f[N];
    for (int i = 0; i < N; i++) {
      c[i] = (struct countdown){.left = 1 + i % 17};
      f[i] = tz_fence_create_polled(pe, &countdown_ops, &c[i]);
      assert_non_null(f[i]);
      void *native = tz_fence_native(f[i], &countdown_ops); /* NULL once done */
      assert_true(native == NULL || native == &c[i]);
    }
    for (int i = 0; i < N; i++) {
      TZ_ASSERT_OK(tz_fence_wait(f[i], 10000000000ll));
      assert_null(tz_fence_native(f[i], &countdown_ops)); /* done: nothing left to wait on */
      tz_fence_release(f[i]);
    }
    tz_progress_destroy(pe); /* the engine's references are gone too: every ctx destroyed */
    for (int i = 0; i < N; i++)
      assert_int_equal(c[i].destroyed, 1);
  }
}

static int poller_calls;
static int poll_fn(void *ctx) {
  (void)ctx;
  __atomic_add_fetch(&poller_calls, 1, __ATOMIC_RELAXED);
  return 0;
}

static void test_poller_removed_is_not_called(void **state) {
  (void)state;
  tz_progress *pe;
  TZ_ASSERT_OK(tz_progress_create(&pe));
  TZ_ASSERT_OK(tz_progress_add(pe, poll_fn, NULL, -1));
  tz_progress_busy(pe, 1);
  for (int i = 0; i < 5000 && __atomic_load_n(&poller_calls, __ATOMIC_RELAXED) == 0; i++)
    usleep(1000);
  assert_true(__atomic_load_n(&poller_calls, __ATOMIC_RELAXED) > 0);
  tz_progress_remove(pe, poll_fn, NULL);
  int after = __atomic_load_n(&poller_calls, __ATOMIC_RELAXED);
  usleep(10000);
  assert_int_equal(__atomic_load_n(&poller_calls, __ATOMIC_RELAXED), after);
  tz_progress_busy(pe, -1);
  tz_progress_destroy(pe);
}

static const struct tz_fence_poll_ops barrier_ops = {.kind = "other", .poll = poll_countdown};

static void test_destroy_fails_pending_polled(void **state) {
  (void)state;
  tz_progress *pe;
  TZ_ASSERT_OK(tz_progress_create(&pe));
  struct countdown c = {.left = 1 << 30};
  tz_fence *f = tz_fence_create_polled(pe, &countdown_ops, &c);
  assert_ptr_equal(tz_fence_native(f, &countdown_ops), &c); /* pending: its backend object */
  assert_null(tz_fence_native(f, &barrier_ops));            /* asked by another backend */
  tz_progress_destroy(pe);
  /* The engine is gone: the fence must not leave a waiter hanging. */
  assert_int_equal(tz_fence_wait(f, 1000000000ll), TZ_ECANCELED);
  tz_fence_release(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_signal_wait_callbacks),
      cmocka_unit_test(test_error_message_reaches_waiter),
      cmocka_unit_test(test_all),
      cmocka_unit_test(test_then_while_signalling_runs_after_earlier),
      cmocka_unit_test(test_pool_runs_concurrently),
      cmocka_unit_test(test_polled_fences),
      cmocka_unit_test(test_poller_removed_is_not_called),
      cmocka_unit_test(test_destroy_fails_pending_polled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
