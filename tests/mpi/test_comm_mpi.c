/* The mpi backend under mpirun: every collective against the serial reference on random data of
 * odd sizes, bit for bit, in place and not, for every dtype and both accumulations; ordering of
 * many collectives in flight and of `after` fences; failure of an input on every rank.
 *
 * Every rank runs the same cmocka group; mpirun's exit status is non-zero when any rank failed.
 * argv[1] selects a failure scenario instead of the suite:
 *   kill   rank 1 raises SIGKILL after a few collectives while the others keep going;
 *   hang   rank 1 never joins an all-gather; the others' watchdog (TZ_COMM_TIMEOUT) fires.
 * Both must end the whole job; tests/mpi/expect_failure.cmake checks how fast and what it says. */
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "comm_ref.h"
#include "core/error.h"
#include "testlib.h"
#include "util/clock.h"

static tz_progress *pe;
static tz_comm *comm;
static int P, me;

static void wait_ok(tz_fence *f) {
  assert_non_null(f);
  TZ_ASSERT_OK(tz_fence_wait(f, 60ll * 1000000000ll));
  tz_fence_release(f);
}

static int setup(void **state) {
  (void)state;
  struct tz_bootstrap bs;
  if (tz_bootstrap_detect(&bs) < 0 || tz_progress_create(&pe) < 0)
    return -1;
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.progress = pe;
  if (tz_comm_create("mpi", &bs, &p, &comm) < 0) {
    fprintf(stderr, "rank %d: %s\n", bs.rank, tz_err_msg());
    return -1;
  }
  P = tz_comm_size(comm);
  me = tz_comm_rank(comm);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tz_comm_destroy(comm);
  tz_progress_destroy(pe);
  return 0;
}

/* Each rank's input for a test: a function of (test, rank) that every rank can compute. */
static uint64_t seed_of(int test, int rank) { return (uint64_t)test * 1000 + (uint64_t)rank; }

static void test_world(void **state) {
  (void)state;
  struct tz_bootstrap bs;
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.kind, TZ_LAUNCH_MPIRUN);
  assert_int_equal(bs.rank, me);
  assert_int_equal(bs.size, P);
  assert_true(P >= 2);
  MPI_Comm *mc = tz_comm_native(comm, "mpi_comm");
  assert_non_null(mc);
  int n = 0;
  MPI_Comm_size(*mc, &n);
  assert_int_equal(n, P);
  assert_null(tz_comm_native(comm, "nccl_comm"));
}

static void test_all_gather(void **state) {
  (void)state;
  const size_t sizes[] = {0, 1, 13, 4099, 100003};
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    for (int in_place = 0; in_place < 2; in_place++) {
      size_t n = sizes[si];
      unsigned char *send = malloc(n + 1), *recv = malloc((size_t)P * n + 1);
      unsigned char *ref = malloc((size_t)P * n + 1);
      for (int q = 0; q < P; q++)
        tz_test_fill(ref + (size_t)q * n, n, seed_of((int)si, q));
      memset(recv, 0xee, (size_t)P * n);
      const void *src = send;
      if (in_place) {
        memcpy(recv + (size_t)me * n, ref + (size_t)me * n, n);
        src = recv + (size_t)me * n;
      } else {
        memcpy(send, ref + (size_t)me * n, n);
      }
      tz_fence *f;
      TZ_ASSERT_OK(tz_comm_all_gather(comm, src, recv, n, NULL, &f));
      wait_ok(f);
      assert_memory_equal(recv, ref, (size_t)P * n);
      free(send);
      free(recv);
      free(ref);
    }
  }
}

/* Reduce-scatter and all-reduce against ref_sum, for one comm and accumulation. */
static void check_reductions(tz_comm *c, int accum_f32, enum tz_dtype only) {
  const size_t counts[] = {1, 3, 7, 1001, 65537};
  for (int dti = 0; dti < 3; dti++) {
    enum tz_dtype dt = (enum tz_dtype)dti;
    if (!accum_f32 && dt != only && dt != TZ_F32)
      continue;
    size_t es = ref_esize(dt);
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      for (int in_place = 0; in_place < 2; in_place++) {
        size_t n = counts[ci];
        /* Reduce-scatter: each rank's input is P chunks of n; all ranks' inputs, for the
         * reference. */
        void *all[64];
        for (int q = 0; q < P; q++) {
          all[q] = malloc((size_t)P * n * es);
          ref_fill(all[q], (size_t)P * n, dt, seed_of(100 + dti * 10 + (int)ci, q));
        }
        char *send = malloc((size_t)P * n * es), *recv = malloc(n * es), *ref = malloc(n * es);
        memcpy(send, all[me], (size_t)P * n * es);
        ref_sum(ref, all, (size_t)me * n, n, P, dt, accum_f32 || dt == TZ_F32);
        void *out = in_place ? send + (size_t)me * n * es : recv;
        tz_fence *f;
        TZ_ASSERT_OK(tz_comm_reduce_scatter(c, send, out, n, dt, NULL, &f));
        wait_ok(f);
        long d = ref_first_diff(out, ref, n, es);
        if (d >= 0)
          print_error("reduce_scatter %s n=%zu in_place=%d: first difference at %ld\n",
                      dt == TZ_F32    ? "f32"
                      : dt == TZ_BF16 ? "bf16"
                                      : "f16",
                      n, in_place, d);
        assert_int_equal(d, -1);

        /* All-reduce: each rank's input is the first n elements of its buffer. */
        char *full = malloc(n * es);
        ref_sum(full, all, 0, n, P, dt, accum_f32 || dt == TZ_F32);
        memcpy(send, all[me], n * es);
        char *ar_out = in_place ? send : malloc(n * es);
        TZ_ASSERT_OK(tz_comm_all_reduce(c, send, ar_out, n, dt, NULL, &f));
        wait_ok(f);
        d = ref_first_diff(ar_out, full, n, es);
        if (d >= 0)
          print_error("all_reduce n=%zu in_place=%d: first difference at %ld\n", n, in_place, d);
        assert_int_equal(d, -1);
        if (!in_place)
          free(ar_out);
        free(full);
        for (int q = 0; q < P; q++)
          free(all[q]);
        free(send);
        free(recv);
        free(ref);
      }
    }
  }
}

static void test_reductions_fp32_accum(void **state) {
  (void)state;
  check_reductions(comm, 1, TZ_F32);
}

static void test_reductions_native_accum(void **state) {
  (void)state;
  struct tz_bootstrap bs;
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.accum = TZ_BF16; /* bf16 payloads rounded after every addition; own progress engine */
  tz_comm *c;
  TZ_ASSERT_OK(tz_comm_create("mpi", &bs, &p, &c));
  check_reductions(c, 0, TZ_BF16);
  uint16_t h[4] = {0};
  tz_fence *f = NULL;
  assert_int_equal(tz_comm_all_reduce(c, h, h, 4, TZ_F16, NULL, &f), TZ_EINVAL);
  tz_comm_destroy(c);
}

static void test_broadcast_and_barrier(void **state) {
  (void)state;
  const size_t n = 4099;
  unsigned char *buf = malloc(n), *ref = malloc(n);
  for (int root = 0; root < P; root += P - 1) {
    tz_test_fill(ref, n, seed_of(200, root));
    if (me == root)
      memcpy(buf, ref, n);
    else
      memset(buf, 0, n);
    tz_fence *f;
    TZ_ASSERT_OK(tz_comm_broadcast(comm, buf, n, root, NULL, &f));
    wait_ok(f);
    assert_memory_equal(buf, ref, n);
  }
  free(buf);
  free(ref);
  /* Nobody leaves the barrier before the last rank reaches it. */
  double t0 = tz_now_s();
  if (me == 0)
    usleep(300000);
  tz_fence *f;
  TZ_ASSERT_OK(tz_comm_barrier(comm, NULL, &f));
  wait_ok(f);
  assert_true(tz_now_s() - t0 >= 0.25);
}

/* Many collectives in flight at once, of every kind, waited for at the end. */
static void test_many_in_flight(void **state) {
  (void)state;
  enum { K = 24, N = 777 };
  float *in[K], *out[K], *ref[K];
  tz_fence *f[K];
  void *all[64];
  for (int q = 0; q < P; q++)
    all[q] = malloc(sizeof(float) * P * N);
  for (int k = 0; k < K; k++) {
    in[k] = malloc(sizeof(float) * P * N);
    out[k] = malloc(sizeof(float) * P * N);
    ref[k] = malloc(sizeof(float) * P * N);
    for (int q = 0; q < P; q++)
      ref_fill(all[q], (size_t)P * N, TZ_F32, seed_of(300 + k, q));
    memcpy(in[k], all[me], sizeof(float) * P * N);
    switch (k % 3) {
    case 0:
      ref_sum(ref[k], all, (size_t)me * N, N, P, TZ_F32, 1);
      TZ_ASSERT_OK(tz_comm_reduce_scatter(comm, in[k], out[k], N, TZ_F32, NULL, &f[k]));
      break;
    case 1:
      ref_sum(ref[k], all, 0, N, P, TZ_F32, 1);
      TZ_ASSERT_OK(tz_comm_all_reduce(comm, in[k], out[k], N, TZ_F32, NULL, &f[k]));
      break;
    default:
      for (int q = 0; q < P; q++)
        memcpy(ref[k] + (size_t)q * N, all[q], sizeof(float) * N);
      TZ_ASSERT_OK(tz_comm_all_gather(comm, in[k], out[k], sizeof(float) * N, NULL, &f[k]));
      break;
    }
  }
  for (int k = K - 1; k >= 0; k--) /* in reverse: completion does not depend on waiting */
    wait_ok(f[k]);
  for (int k = 0; k < K; k++) {
    size_t n = k % 3 == 2 ? (size_t)P * N : N;
    assert_int_equal(ref_first_diff(out[k], ref[k], n, 4), -1);
    free(in[k]);
    free(out[k]);
    free(ref[k]);
  }
  for (int q = 0; q < P; q++)
    free(all[q]);
}

struct delayed {
  tz_fence *f;
  int us;
  int rc;
};

static void *signal_later(void *arg) {
  struct delayed *d = arg;
  usleep((useconds_t)d->us);
  tz_fence_signal_msg(d->f, d->rc, d->rc ? "input failed on purpose" : NULL);
  return NULL;
}

/* A collective waits for its `after` fence, and the ones behind it wait their turn: collectives
 * start in call order on every rank even when inputs are ready in another order. */
static void test_after_orders(void **state) {
  (void)state;
  enum { N = 1000 };
  float a[N], b[64 * N], c[N], rs_ref[N];
  void *all[64];
  for (int q = 0; q < P; q++) {
    all[q] = malloc(sizeof(float) * P * N);
    ref_fill(all[q], (size_t)P * N, TZ_F32, seed_of(400, q));
  }
  float *rs_in = malloc(sizeof(float) * P * N);
  memcpy(rs_in, all[me], sizeof(float) * P * N);
  ref_sum(rs_ref, all, (size_t)me * N, N, P, TZ_F32, 1);
  for (int i = 0; i < N; i++)
    a[i] = (float)(me * N + i);
  struct delayed d = {.f = tz_fence_create(), .us = 50000 + 50000 * me};
  pthread_t th;
  tz_fence *f1, *f2;
  /* The input of the all-gather is written before its fence is signalled. */
  TZ_ASSERT_OK(tz_comm_all_gather(comm, a, b, sizeof a, d.f, &f1));
  TZ_ASSERT_OK(tz_comm_reduce_scatter(comm, rs_in, c, N, TZ_F32, NULL, &f2));
  usleep(10000);
  assert_int_equal(tz_fence_query(f1), 0);
  assert_int_equal(tz_fence_query(f2), 0); /* behind the all-gather */
  pthread_create(&th, NULL, signal_later, &d);
  wait_ok(f2);
  assert_true(tz_fence_query(f1) == 1);
  wait_ok(f1);
  pthread_join(th, NULL);
  tz_fence_release(d.f);
  for (int q = 0; q < P; q++)
    for (int i = 0; i < N; i++)
      assert_true(b[q * N + i] == (float)(q * N + i));
  assert_int_equal(ref_first_diff(c, rs_ref, N, 4), -1);
  for (int q = 0; q < P; q++)
    free(all[q]);
  free(rs_in);
}

/* An input that fails on every rank: the collective fails with its error without calling MPI,
 * and the comm refuses later collectives. */
static void test_failed_input(void **state) {
  (void)state;
  struct tz_bootstrap bs;
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.progress = pe;
  tz_comm *c;
  TZ_ASSERT_OK(tz_comm_create("mpi", &bs, &p, &c));
  tz_fence *in = tz_fence_create(), *f;
  TZ_ASSERT_OK(tz_comm_barrier(c, in, &f));
  tz_fence_signal_msg(in, TZ_EIO, "nvme: read failed");
  assert_int_equal(tz_fence_wait(f, -1), TZ_EIO);
  assert_non_null(strstr(tz_err_msg(), "barrier #0 not started"));
  tz_fence_release(f);
  tz_fence_release(in);
  assert_int_equal(tz_comm_barrier(c, NULL, &f), TZ_ECANCELED);
  tz_comm_destroy(c);
}

static int scenario(const char *mode) {
  if (setup(NULL) < 0)
    return 2;
  float x[256];
  for (int i = 0; i < 256; i++)
    x[i] = (float)i;
  if (strcmp(mode, "kill") == 0) {
    for (int i = 0;; i++) {
      if (i == 5 && me == 1)
        raise(SIGKILL); /* says nothing: the job's output must name it anyway */
      tz_fence *f;
      if (tz_comm_all_reduce(comm, x, x, 256, TZ_F32, NULL, &f) < 0 || tz_fence_wait(f, -1) < 0) {
        fprintf(stderr, "rank %d: %s\n", me, tz_err_msg());
        return 1;
      }
      tz_fence_release(f);
      if (i > 5)
        usleep(10000);
    }
  }
  if (strcmp(mode, "hang") == 0) {
    if (me == 1) {
      sleep(60); /* never joins */
      return 0;
    }
    float *all = malloc(sizeof x * (size_t)P);
    tz_fence *f;
    if (tz_comm_all_gather(comm, x, all, sizeof x, NULL, &f) == 0)
      tz_fence_wait(f, -1);
    return 1;
  }
  fprintf(stderr, "unknown mode %s\n", mode);
  return 2;
}

int main(int argc, char **argv) {
  if (argc > 1)
    return scenario(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_world),
      cmocka_unit_test(test_all_gather),
      cmocka_unit_test(test_reductions_fp32_accum),
      cmocka_unit_test(test_reductions_native_accum),
      cmocka_unit_test(test_broadcast_and_barrier),
      cmocka_unit_test(test_many_in_flight),
      cmocka_unit_test(test_after_orders),
      cmocka_unit_test(test_failed_input),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
