/* Collectives, world of one: the "single" backend's results, `after` ordering and failure, the
 * registry, and the library's fixed-order chunk sum against the serial reference. */
#include "collectives/comm.h"
#include "collectives/comm_impl.h"
#include "comm_ref.h"
#include "core/error.h"
#include "testlib.h"

#include <stdlib.h>
#include <string.h>

static tz_comm *make_single(enum tz_dtype accum) {
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.accum = accum;
  tz_comm *c = NULL;
  TZ_ASSERT_OK(tz_comm_create("single", &bs, &p, &c));
  return c;
}

static void wait_ok(tz_fence *f) {
  assert_non_null(f);
  TZ_ASSERT_OK(tz_fence_wait(f, 5000000000ll));
  tz_fence_release(f);
}

static void test_registry(void **state) {
  (void)state;
  assert_true(tz_comm_backend_count() >= 1);
  assert_string_equal(tz_comm_backend_name(0), "single");
  assert_null(tz_comm_backend_name(tz_comm_backend_count()));
  char why[256] = "";
  assert_true(tz_comm_probe("single", why, sizeof why) >= 0);
  assert_int_equal(tz_comm_probe("carrier-pigeon", why, sizeof why), TZ_ENOENT);
  assert_non_null(strstr(why, "carrier-pigeon"));
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  tz_comm *c = NULL;
  assert_int_equal(tz_comm_create("carrier-pigeon", &bs, NULL, &c), TZ_ENOENT);
  assert_null(c);
  /* A world of two is not one the single backend can serve. */
  bs.size = 2;
  assert_int_equal(tz_comm_create("single", &bs, NULL, &c), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "2 ranks"));
  tz_comm_destroy(NULL);
}

static void test_collectives(void **state) {
  (void)state;
  tz_comm *c = make_single(TZ_F32);
  assert_int_equal(tz_comm_rank(c), 0);
  assert_int_equal(tz_comm_size(c), 1);
  assert_string_equal(tz_comm_backend(c), "single");
  enum { N = 1001 };
  unsigned char a[N], b[N];
  tz_test_fill(a, N, 1);
  memset(b, 0, N);
  tz_fence *f = NULL;
  TZ_ASSERT_OK(tz_comm_all_gather(c, a, b, N, NULL, &f));
  wait_ok(f);
  assert_memory_equal(a, b, N);

  float x[N], y[N];
  ref_fill(x, N, TZ_F32, 2);
  TZ_ASSERT_OK(tz_comm_reduce_scatter(c, x, y, N, TZ_F32, NULL, &f));
  wait_ok(f);
  assert_memory_equal(x, y, sizeof x);
  memset(y, 0, sizeof y);
  TZ_ASSERT_OK(tz_comm_all_reduce(c, x, y, N, TZ_F32, NULL, &f));
  wait_ok(f);
  assert_memory_equal(x, y, sizeof x);
  /* In place, and bf16 through the fp32 sum of one chunk: the same bits. */
  uint16_t h[N], h0[N];
  ref_fill(h, N, TZ_BF16, 3);
  memcpy(h0, h, sizeof h);
  TZ_ASSERT_OK(tz_comm_all_reduce(c, h, h, N, TZ_BF16, NULL, &f));
  wait_ok(f);
  assert_memory_equal(h, h0, sizeof h);

  TZ_ASSERT_OK(tz_comm_broadcast(c, a, N, 0, NULL, &f));
  wait_ok(f);
  TZ_ASSERT_OK(tz_comm_barrier(c, NULL, &f));
  wait_ok(f);
  /* done == NULL: nobody waits, and nothing leaks (ASan would say). */
  TZ_ASSERT_OK(tz_comm_barrier(c, NULL, NULL));

  assert_int_equal(tz_comm_broadcast(c, a, N, 1, NULL, &f), TZ_EINVAL);
  assert_null(f);
  assert_int_equal(tz_comm_all_gather(c, NULL, b, N, NULL, &f), TZ_EINVAL);
  assert_int_equal(tz_comm_reduce_scatter(c, x, y, N, (enum tz_dtype)7, NULL, &f), TZ_EINVAL);
  assert_int_equal(tz_comm_all_reduce(c, x, y, SIZE_MAX / 2, TZ_F32, NULL, &f), TZ_EINVAL);
  assert_null(tz_comm_native(c, "mpi_comm"));
  tz_comm_destroy(c);
}

static void test_after_orders_and_fails(void **state) {
  (void)state;
  tz_comm *c = make_single(TZ_F32);
  char src[64] = "the input, written before its fence completes", dst[64] = "";
  tz_fence *in = tz_fence_create(), *f = NULL;
  TZ_ASSERT_OK(tz_comm_all_gather(c, src, dst, sizeof src, in, &f));
  assert_int_equal(tz_fence_query(f), 0);
  assert_string_equal(dst, "");
  tz_fence_signal(in, 0);
  wait_ok(f);
  assert_string_equal(dst, src);
  tz_fence_release(in);

  /* A failed input fails the collective with its error; the comm is then done for. */
  in = tz_fence_create();
  TZ_ASSERT_OK(tz_comm_barrier(c, in, &f));
  tz_fence_signal_msg(in, TZ_EIO, "nvme: read failed");
  assert_int_equal(tz_fence_wait(f, -1), TZ_EIO);
  tz_fence_release(f);
  tz_fence_release(in);
  assert_int_equal(tz_comm_barrier(c, NULL, &f), TZ_ECANCELED);
  assert_null(f);
  tz_comm_destroy(c);

  c = make_single(TZ_F32);
  tz_comm_abort(c, TZ_ECOMM, "test");
  assert_int_equal(tz_comm_barrier(c, NULL, &f), TZ_ECANCELED);
  tz_comm_destroy(c);
}

static void test_accum_dtype_rules(void **state) {
  (void)state;
  tz_comm *c = make_single(TZ_BF16);
  uint16_t a[3] = {0x3f80, 0x4000, 0x4040}, b[3];
  float x[3] = {1, 2, 3}, y[3];
  tz_fence *f;
  TZ_ASSERT_OK(tz_comm_all_reduce(c, a, b, 3, TZ_BF16, NULL, &f));
  wait_ok(f);
  assert_memory_equal(a, b, sizeof a);
  TZ_ASSERT_OK(tz_comm_all_reduce(c, x, y, 3, TZ_F32, NULL, &f)); /* fp32 stays fp32 */
  wait_ok(f);
  assert_int_equal(tz_comm_all_reduce(c, a, b, 3, TZ_F16, NULL, &f), TZ_EINVAL);
  tz_comm_destroy(c);
}

/* The library's chunk sum (what mpi and single use) against the serial reference, bit for bit,
 * for every dtype and both accumulations, at odd sizes around its block boundary. */
static void test_sum_chunks_matches_reference(void **state) {
  (void)state;
  const size_t sizes[] = {1, 7, 2047, 2048, 2049, 5001};
  const int ranks[] = {1, 2, 3, 5};
  for (int dti = 0; dti < 3; dti++) {
    enum tz_dtype dt = (enum tz_dtype)dti;
    size_t es = ref_esize(dt);
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
      for (size_t pi = 0; pi < sizeof ranks / sizeof *ranks; pi++) {
        for (int accum_f32 = 0; accum_f32 < 2; accum_f32++) {
          size_t n = sizes[si];
          int P = ranks[pi];
          size_t stride = n + 3; /* chunks need not be adjacent */
          char *in = malloc((size_t)P * stride * es);
          char *out = malloc(n * es), *ref = malloc(n * es);
          void *chunks[8];
          for (int q = 0; q < P; q++) {
            ref_fill(in + (size_t)q * stride * es, stride, dt, (uint64_t)(q * 100 + si));
            chunks[q] = in + (size_t)q * stride * es;
          }
          tz_comm_sum_chunks(out, in, stride, n, P, dt, accum_f32);
          ref_sum(ref, chunks, 0, n, P, dt, accum_f32);
          long d = ref_first_diff(out, ref, n, es);
          if (d >= 0)
            print_error("dt %d n %zu P %d accum_f32 %d: first difference at %ld\n", dti, n, P,
                        accum_f32, d);
          assert_int_equal(d, -1);
          free(in);
          free(out);
          free(ref);
        }
      }
    }
  }
}

/* Sums in a different order give different bits on this data: the test above would notice an
 * implementation that reordered. */
static void test_order_is_visible(void **state) {
  (void)state;
  enum { N = 4096, P = 4 };
  float *in = malloc(sizeof(float) * N * P), fwd[N], rev[N];
  for (int q = 0; q < P; q++)
    ref_fill(in + q * N, N, TZ_F32, (uint64_t)q + 7);
  int differ = 0;
  for (int i = 0; i < N; i++) {
    fwd[i] = ((in[i] + in[N + i]) + in[2 * N + i]) + in[3 * N + i];
    rev[i] = ((in[3 * N + i] + in[2 * N + i]) + in[N + i]) + in[i];
    differ += memcmp(&fwd[i], &rev[i], 4) != 0;
  }
  assert_true(differ > 100);
  free(in);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry),
      cmocka_unit_test(test_collectives),
      cmocka_unit_test(test_after_orders_and_fails),
      cmocka_unit_test(test_accum_dtype_rules),
      cmocka_unit_test(test_sum_chunks_matches_reference),
      cmocka_unit_test(test_order_is_visible),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
