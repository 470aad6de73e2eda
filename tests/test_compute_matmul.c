/* The cpu backend's matmuls (split from test_compute_cpu.c): tz_compute_matmul with transposes,
 * leading dimensions and accumulation, the fused residual (matmul_add), and matmul_many (each call
 * with the bits it has alone, a bad call refused by index).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/compute.h"
#include "compute_cpu_cases.h"
#include "testlib.h"

static void test_matmul(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  int M = 37, N = 29, K = 300;
  uint64_t st = 5;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
      float *A = malloc(sizeof(float) * (ta ? K : M) * lda);
      float *B = malloc(sizeof(float) * (tb ? N : K) * ldb);
      float *C = malloc(sizeof(float) * M * ldc), *C0 = malloc(sizeof(float) * M * ldc);
      for (int i = 0; i < (ta ? K : M) * lda; i++)
        A[i] = urand(&st) - 0.5f;
      for (int i = 0; i < (tb ? N : K) * ldb; i++)
        B[i] = urand(&st) - 0.5f;
      for (int i = 0; i < M * ldc; i++)
        C[i] = NAN; /* beta = 0 ignores it */
      TZ_ASSERT_OK(
          tz_compute_matmul(cm, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.0f, C, TZ_F32, ldc));
      for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
          double s = 0;
          for (int k = 0; k < K; k++)
            s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) *
                 (tb ? B[j * ldb + k] : B[k * ldb + j]);
          assert_true(fabs(C[i * ldc + j] - 0.5 * s) < 1e-5);
        }
        for (int j = N; j < ldc; j++)
          assert_true(isnan(C[i * ldc + j])); /* outside the matrix: untouched */
      }
      /* beta = 1: the old value plus the product computed alone. */
      memcpy(C0, C, sizeof(float) * M * ldc);
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
          C[i * ldc + j] = C0[i * ldc + j] = (float)(i - j);
      float *P = malloc(sizeof(float) * M * ldc);
      TZ_ASSERT_OK(
          tz_compute_matmul(cm, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, P, TZ_F32, ldc));
      TZ_ASSERT_OK(
          tz_compute_matmul(cm, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, TZ_F32, ldc));
      for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
          assert_true(C[i * ldc + j] == C0[i * ldc + j] + P[i * ldc + j]);
      free(P);
      free(A);
      free(B);
      free(C);
      free(C0);
    }
  /* An accumulating product wider than the backend's scratch (16 MiB: 64 rows of 65,543 columns
   * at a time, so three passes here): the same bits as the product computed alone, added. */
  for (int ta = 0; ta < 2; ta++) {
    const int m = 130, n = 65543, k = 3, ld = n;
    float *A = malloc(sizeof(float) * m * k), *B = malloc(sizeof(float) * k * n);
    float *C = malloc(sizeof(float) * m * ld), *C0 = malloc(sizeof(float) * m * ld);
    float *P = malloc(sizeof(float) * m * ld);
    for (int i = 0; i < m * k; i++)
      A[i] = urand(&st) - 0.5f;
    for (int i = 0; i < k * n; i++)
      B[i] = urand(&st) - 0.5f;
    for (size_t i = 0; i < (size_t)m * ld; i++)
      C[i] = C0[i] = (float)(i % 1000) - 500.0f;
    TZ_ASSERT_OK(
        tz_compute_matmul(cm, ta, 0, m, n, k, 1.0f, A, ta ? m : k, B, n, 0.0f, P, TZ_F32, ld));
    TZ_ASSERT_OK(
        tz_compute_matmul(cm, ta, 0, m, n, k, 1.0f, A, ta ? m : k, B, n, 1.0f, C, TZ_F32, ld));
    size_t bad = 0;
    for (size_t i = 0; i < (size_t)m * ld; i++)
      bad += C[i] != C0[i] + P[i];
    assert_int_equal(bad, 0);
    free(A);
    free(B);
    free(C);
    free(C0);
    free(P);
  }
  float dummy = 0;
  assert_int_equal(
      tz_compute_matmul(cm, 0, 0, 2, 2, 2, 1, &dummy, 1, &dummy, 2, 0, &dummy, TZ_F32, 2),
      TZ_EINVAL); /* lda < K */
  assert_non_null(strstr(tz_err_msg(), "lda"));
  assert_int_equal(
      tz_compute_matmul(cm, 0, 0, 2, 2, 2, 1, &dummy, 2, &dummy, 2, 0, &dummy, TZ_BF16, 2),
      TZ_EINVAL);
  tz_compute_destroy(cm);
}

/* matmul_add: C = R + the product in one rounding, the bits of beta = 1 on a C that held R,
 * with R elsewhere or R == C; R overlapping C otherwise is refused. */
static void test_matmul_add(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  int M = 21, N = 13, K = 70, ldc = N + 3;
  uint64_t st = 11;
  float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
  float *R = malloc(sizeof(float) * M * ldc), *C = malloc(sizeof(float) * M * ldc);
  float *Cb = malloc(sizeof(float) * M * ldc);
  assert_true(A && B && R && C && Cb);
  for (int i = 0; i < M * K; i++)
    A[i] = urand(&st) - 0.5f;
  for (int i = 0; i < K * N; i++)
    B[i] = urand(&st) - 0.5f;
  for (int i = 0; i < M * ldc; i++) {
    R[i] = 4.0f * urand(&st) - 2.0f;
    C[i] = NAN;
    Cb[i] = R[i];
  }
  TZ_ASSERT_OK(tz_compute_matmul(cm, 0, 0, M, N, K, 0.5f, A, K, B, N, 1.0f, Cb, TZ_F32, ldc));
  TZ_ASSERT_OK(tz_compute_matmul_add(cm, 0, 0, M, N, K, 0.5f, A, K, B, N, R, C, TZ_F32, ldc));
  for (int i = 0; i < M; i++) {
    for (int j = 0; j < N; j++) {
      assert_memory_equal(&C[i * ldc + j], &Cb[i * ldc + j], sizeof(float));
      double p = 0;
      for (int k = 0; k < K; k++)
        p += (double)A[i * K + k] * B[k * N + j];
      assert_true(fabs(C[i * ldc + j] - (R[i * ldc + j] + 0.5 * p)) < 1e-5);
    }
    for (int j = N; j < ldc; j++)
      assert_true(isnan(C[i * ldc + j])); /* outside the matrix: untouched */
  }
  /* R == C: the accumulating call itself */
  TZ_ASSERT_OK(tz_compute_matmul_add(cm, 0, 0, M, N, K, 0.5f, A, K, B, N, R, R, TZ_F32, ldc));
  for (int i = 0; i < M; i++)
    assert_memory_equal(&R[i * ldc], &Cb[i * ldc], N * sizeof(float));
  /* K == 0: C = R */
  TZ_ASSERT_OK(tz_compute_matmul_add(cm, 0, 0, M, N, 0, 0.5f, A, K, B, N, Cb, C, TZ_F32, ldc));
  for (int i = 0; i < M; i++)
    assert_memory_equal(&C[i * ldc], &Cb[i * ldc], N * sizeof(float));
  assert_int_equal(tz_compute_matmul_add(cm, 0, 0, M, N, K, 1, A, K, B, N, R + 1, R, TZ_F32, ldc),
                   TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "overlaps"));
  assert_int_equal(tz_compute_matmul_add(cm, 0, 0, M, N, K, 1, A, K, B, N, NULL, C, TZ_F32, ldc),
                   TZ_EINVAL);
  free(A), free(B), free(R), free(C), free(Cb);
  tz_compute_destroy(cm);
}

/* matmul_many: each call's bits are tz_compute_matmul's alone (the three kinds the experts run:
 * forward, a weight gradient accumulated, an input gradient overwritten then accumulated), an
 * empty call among them does nothing, and a bad call is refused naming its index before any call
 * runs. */
static void test_matmul_many(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  enum { NC = 7, CN = 32 * 32 }; /* C's room: the largest product is K x K */
  const int M = 19, K = 24, N = 11;
  uint64_t st = 5;
  float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
  float *Bt = malloc(sizeof(float) * N * K), *C[NC], *Cs[NC];
  assert_true(A && B && Bt);
  for (int i = 0; i < M * K; i++)
    A[i] = urand(&st) - 0.5f;
  for (int i = 0; i < K * N; i++)
    B[i] = urand(&st) - 0.5f, Bt[i] = urand(&st) - 0.5f;
  struct tz_matmul_call calls[NC];
  for (int c = 0; c < NC; c++) {
    C[c] = malloc(sizeof(float) * CN), Cs[c] = malloc(sizeof(float) * CN);
    assert_true(C[c] && Cs[c]);
    for (int i = 0; i < CN; i++)
      C[c][i] = Cs[c][i] = 2.0f * urand(&st) - 1.0f;
    /* (0,0) A B, (0,1) A Bt^T, (1,0) A^T A accumulated; beta 0 and 1; one call empty */
    int kind = c % 3, rows = c == 4 ? 0 : M - c;
    struct tz_matmul_call m = {.M = rows,
                               .N = N,
                               .K = K,
                               .alpha = 1.0f,
                               .A = A,
                               .lda = K,
                               .B = B,
                               .ldb = N,
                               .beta = (float)(c & 1),
                               .C = C[c],
                               .c_dt = TZ_F32,
                               .ldc = N};
    if (kind == 1)
      m.trans_b = 1, m.alpha = 0.5f, m.B = Bt, m.ldb = K, m.beta = 0.0f;
    if (kind == 2)
      m.trans_a = 1, m.M = K, m.N = K, m.K = rows, m.B = A, m.ldb = K, m.beta = 1.0f, m.ldc = K;
    calls[c] = m;
  }
  for (int c = 0; c < NC; c++) {
    struct tz_matmul_call m = calls[c];
    TZ_ASSERT_OK(tz_compute_matmul(cm, m.trans_a, m.trans_b, m.M, m.N, m.K, m.alpha, m.A, m.lda,
                                   m.B, m.ldb, m.beta, Cs[c], m.c_dt, m.ldc));
  }
  TZ_ASSERT_OK(tz_compute_matmul_many(cm, NC, calls));
  for (int c = 0; c < NC; c++)
    assert_memory_equal(C[c], Cs[c], sizeof(float) * CN);
  /* a product of the forward kind against float64 */
  double p = 0;
  for (int k = 0; k < K; k++)
    p += (double)A[3 * K + k] * B[k * N + 5];
  assert_true(fabs(C[0][3 * N + 5] - p) < 1e-5);
  TZ_ASSERT_OK(tz_compute_matmul_many(cm, 0, NULL));
  /* call 2's ldc too small: refused by index, call 0 not run */
  memcpy(Cs[0], C[0], sizeof(float) * CN);
  calls[2].ldc = calls[2].N - 1;
  assert_int_equal(tz_compute_matmul_many(cm, NC, calls), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "call 2 of 7"));
  assert_memory_equal(C[0], Cs[0], sizeof(float) * CN);
  for (int c = 0; c < NC; c++)
    free(C[c]), free(Cs[c]);
  free(A), free(B), free(Bt);
  tz_compute_destroy(cm);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_matmul_add),
      cmocka_unit_test(test_matmul_many),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
