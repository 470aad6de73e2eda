/* The cpu backend's attention op by op (split from test_compute_cpu.c): at 4,096 tokens against a
 * float64 reference that streams as the kernels must, the Gemma families' variants (a scale, a
 * softcap, sliding windows) forward and backward, and packed documents in RoPE and attention.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/compute.h"
#include "kernels/compute_timed.h"
#include "compute_cpu_cases.h"
#include "testlib.h"

/* The Gemma families' attention variants against float64 computed here: a scale, a softcap and a
 * sliding window (with packed documents too), forward and backward. ref_score: one score, scaled
 * and capped, and its slope through the cap. */
static double ref_score(const float *q, const float *k, int D, double scale, double cap,
                        double *slope) {
  double s = 0;
  for (int d = 0; d < D; d++)
    s += (double)q[d] * k[d];
  s *= scale;
  *slope = 1;
  if (cap > 0) {
    double th = tanh(s / cap);
    *slope = 1 - th * th;
    s = cap * th;
  }
  return s;
}

/* Attention at 4,096 tokens (grouped-query, 4 heads on 2), forward and backward, against a float64
 * reference that streams as the kernels must: per query an online softmax over the keys (running
 * max, sum and output), then a second pass with the final log-sum-exp for the gradients, never a
 * T x T matrix; dk and dv in (T, Hkv, D) sums. */
static void test_attention_long(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  enum { T = 4096, H = 4, Hkv = 2, D = 8 };
  const size_t nq = (size_t)T * H * D, nk = (size_t)T * Hkv * D;
  float *q = malloc(nq * sizeof *q), *o = malloc(nq * sizeof *o), *dout = malloc(nq * sizeof *dout),
        *dq = malloc(nq * sizeof *dq), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v),
        *dk = malloc(nk * sizeof *dk), *dv = malloc(nk * sizeof *dv),
        *lse = malloc((size_t)H * T * sizeof *lse), *delta = malloc((size_t)H * T * sizeof *delta);
  double *rdk = calloc(nk, sizeof *rdk), *rdv = calloc(nk, sizeof *rdv);
  assert_true(q && o && dout && dq && k && v && dk && dv && lse && delta && rdk && rdv);
  uint64_t st = 41;
  for (size_t i = 0; i < nq; i++)
    q[i] = 4 * urand(&st) - 2, dout[i] = 2 * urand(&st) - 1;
  for (size_t i = 0; i < nk; i++)
    k[i] = 4 * urand(&st) - 2, v[i] = 2 * urand(&st) - 1;
  TZ_ASSERT_OK(tz_compute_attention_fwd(cm, o, lse, q, k, v, 1, T, H, Hkv, D, NULL, NULL));
  TZ_ASSERT_OK(tz_compute_attention_bwd(cm, dq, dk, dv, delta, dout, q, k, v, o, lse, 1, T, H, Hkv,
                                        D, NULL, NULL));
  const double scale = 1 / sqrt((double)D);
  double err_o = 0, err_l = 0, err_dq = 0, big_o = 0, big_dq = 0;
  for (int h = 0; h < H; h++)
    for (int t = 0; t < T; t++) {
      const int hk = h / (H / Hkv);
      const float *qt = q + ((size_t)t * H + h) * D, *dt = dout + ((size_t)t * H + h) * D;
      double m = -INFINITY, sum = 0, out[D] = {0}, sl;
      for (int u = 0; u <= t; u++) { /* online: rescale what was summed when the max grows */
        double z = ref_score(qt, k + ((size_t)u * Hkv + hk) * D, D, scale, 0, &sl);
        double mn = fmax(m, z), r = exp(m - mn), p = exp(z - mn);
        const float *vu = v + ((size_t)u * Hkv + hk) * D;
        sum = sum * r + p;
        for (int d = 0; d < D; d++)
          out[d] = out[d] * r + p * vu[d];
        m = mn;
      }
      double l = m + log(sum), dl = 0, dqt[D] = {0};
      err_l = fmax(err_l, fabs(lse[(size_t)h * T + t] - l));
      for (int d = 0; d < D; d++) {
        out[d] /= sum;
        dl += (double)dt[d] * out[d];
        err_o = fmax(err_o, fabs(o[((size_t)t * H + h) * D + d] - out[d]));
        big_o = fmax(big_o, fabs(out[d]));
      }
      for (int u = 0; u <= t; u++) {
        const float *ku = k + ((size_t)u * Hkv + hk) * D, *vu = v + ((size_t)u * Hkv + hk) * D;
        double p = exp(ref_score(qt, ku, D, scale, 0, &sl) - l), dp = 0;
        for (int d = 0; d < D; d++)
          dp += (double)dt[d] * vu[d];
        double ds = p * (dp - dl) * scale;
        for (int d = 0; d < D; d++) {
          dqt[d] += ds * ku[d];
          rdk[((size_t)u * Hkv + hk) * D + d] += ds * qt[d];
          rdv[((size_t)u * Hkv + hk) * D + d] += p * dt[d];
        }
      }
      for (int d = 0; d < D; d++) {
        err_dq = fmax(err_dq, fabs(dq[((size_t)t * H + h) * D + d] - dqt[d]));
        big_dq = fmax(big_dq, fabs(dqt[d]));
      }
    }
  double err_dk = 0, err_dv = 0, big_dk = 0, big_dv = 0;
  for (size_t i = 0; i < nk; i++) {
    err_dk = fmax(err_dk, fabs(dk[i] - rdk[i])), big_dk = fmax(big_dk, fabs(rdk[i]));
    err_dv = fmax(err_dv, fabs(dv[i] - rdv[i])), big_dv = fmax(big_dv, fabs(rdv[i]));
  }
  print_message("T %d: out %.2e, lse %.2e, dq %.2e, dk %.2e, dv %.2e of the largest\n", T,
                err_o / big_o, err_l, err_dq / big_dq, err_dk / big_dk, err_dv / big_dv);
  assert_true(err_o < 1e-5 * big_o && err_l < 1e-4);
  assert_true(err_dq < 1e-4 * big_dq && err_dk < 1e-4 * big_dk && err_dv < 1e-4 * big_dv);
  free(q), free(o), free(dout), free(dq), free(k), free(v), free(dk), free(dv), free(lse);
  free(delta), free(rdk), free(rdv);
  tz_compute_destroy(cm);
}

static void test_attention_variants(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  enum { B = 2, T = 11, H = 4, Hkv = 2, D = 8 };
  const int nq = B * T * H * D, nk = B * T * Hkv * D;
  float q[nq], k[nk], v[nk], o[nq], dout[nq], dq[nq], dk[nk], dv[nk], lse[B * H * T],
      delta[B * H * T];
  double rdq[nq], rdk[nk], rdv[nk];
  uint64_t st = 21;
  for (int i = 0; i < nq; i++)
    q[i] = 4 * urand(&st) - 2, dout[i] = 2 * urand(&st) - 1;
  for (int i = 0; i < nk; i++)
    k[i] = 4 * urand(&st) - 2, v[i] = 2 * urand(&st) - 1;
  int32_t pos[B * T];
  for (int t = 0; t < T; t++) /* row 0 one document, row 1 two (the second from t = 6) */
    pos[t] = t, pos[T + t] = t < 6 ? t : t - 6;
  const struct tz_attn_opts cases[] = {
      {0.3f, 0.0f, 0}, {0.0f, 2.5f, 0}, {0.0f, 0.0f, 3}, {0.2f, 1.5f, 4}, {0.0f, 0.0f, 1}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int packed = 0; packed < 2; packed++) {
      const struct tz_attn_opts *a = &cases[c];
      const int32_t *ps = packed ? pos : NULL;
      TZ_ASSERT_OK(tz_compute_attention_fwd(cm, o, lse, q, k, v, B, T, H, Hkv, D, ps, a));
      TZ_ASSERT_OK(tz_compute_attention_bwd(cm, dq, dk, dv, delta, dout, q, k, v, o, lse, B, T, H,
                                            Hkv, D, ps, a));
      double scale = a->scale > 0 ? a->scale : 1 / sqrt((double)D);
      memset(rdq, 0, sizeof rdq), memset(rdk, 0, sizeof rdk), memset(rdv, 0, sizeof rdv);
      for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
          for (int t = 0; t < T; t++) {
            int hk = h / (H / Hkv), u0 = ps ? t - ps[b * T + t] : 0;
            if (a->window > 0 && t - a->window + 1 > u0)
              u0 = t - a->window + 1;
            const float *qt = q + ((b * T + t) * H + h) * D, *dt = dout + ((b * T + t) * H + h) * D;
            double z[T], sl[T], m = -INFINITY, sum = 0, out[D], dp[T], pdp = 0;
            for (int u = u0; u <= t; u++) {
              z[u] = ref_score(qt, k + ((b * T + u) * Hkv + hk) * D, D, scale, a->softcap, &sl[u]);
              m = fmax(m, z[u]);
            }
            for (int u = u0; u <= t; u++)
              sum += exp(z[u] - m);
            assert_true(fabs(lse[(b * H + h) * T + t] - (m + log(sum))) < 1e-5);
            for (int d = 0; d < D; d++)
              out[d] = 0;
            for (int u = u0; u <= t; u++) {
              double p = exp(z[u] - m) / sum;
              const float *vu = v + ((b * T + u) * Hkv + hk) * D;
              dp[u] = 0;
              for (int d = 0; d < D; d++) {
                out[d] += p * vu[d];
                dp[u] += (double)dt[d] * vu[d];
                rdv[((b * T + u) * Hkv + hk) * D + d] += p * dt[d];
              }
              pdp += p * dp[u];
            }
            for (int d = 0; d < D; d++)
              assert_true(fabs(o[((b * T + t) * H + h) * D + d] - out[d]) < 1e-5);
            for (int u = u0; u <= t; u++) {
              double p = exp(z[u] - m) / sum, ds = p * (dp[u] - pdp) * sl[u] * scale;
              const float *ku = k + ((b * T + u) * Hkv + hk) * D;
              for (int d = 0; d < D; d++) {
                rdq[((b * T + t) * H + h) * D + d] += ds * ku[d];
                rdk[((b * T + u) * Hkv + hk) * D + d] += ds * qt[d];
              }
            }
          }
      for (int i = 0; i < nq; i++)
        assert_true(fabs(dq[i] - rdq[i]) < 1e-5);
      for (int i = 0; i < nk; i++)
        assert_true(fabs(dk[i] - rdk[i]) < 1e-5 && fabs(dv[i] - rdv[i]) < 1e-5);
    }
  /* a window of 0 and the defaults are Llama's attention: the bits of opt NULL */
  float o2[nq];
  struct tz_attn_opts zero = {0};
  TZ_ASSERT_OK(tz_compute_attention_fwd(cm, o, lse, q, k, v, B, T, H, Hkv, D, NULL, NULL));
  TZ_ASSERT_OK(tz_compute_attention_fwd(cm, o2, lse, q, k, v, B, T, H, Hkv, D, NULL, &zero));
  assert_memory_equal(o, o2, sizeof o);
  zero.window = -1;
  assert_int_equal(tz_compute_attention_fwd(cm, o, lse, q, k, v, B, T, H, Hkv, D, NULL, &zero),
                   TZ_EINVAL);
  tz_compute_destroy(cm);
}

/* Packed documents (compute.h): a row holding several documents computes, for each, the bits of
 * that document alone in a row of its own, in RoPE and in attention's forward and backward (the
 * cpu kernels sum each document's keys and queries in the order they would alone); padding is a
 * document like any other. A pos that breaks the rule is refused naming the row and token, and
 * the timed wrapper passes pos through. */
static void test_packed_documents(void **state) {
  (void)state;
  tz_compute *plain = cpu(3), *cm = NULL;
  struct tz_compute_times times;
  memset(&times, 0, sizeof times);
  TZ_ASSERT_OK(tz_compute_timed_create(plain, &times, &cm));
  enum { B = 2, T = 24, H = 4, Hkv = 2, D = 8 };
  static const int docs[B][6] = {{5, 1, 10, 8, 0}, {24, 0}}; /* lengths, 0-ended; sum T */
  int32_t pos[B * T];
  for (int b = 0; b < B; b++)
    for (int i = 0, t = 0; docs[b][i]; i++)
      for (int j = 0; j < docs[b][i]; j++)
        pos[b * T + t++] = j;
  size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * H * T;
  float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
  float *out = malloc(nq * 4), *lse = malloc(nl * 4), *delta = malloc(nl * 4);
  float *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
  float *rq = malloc(nq * 4); /* q after rope, packed */
  uint64_t st = 11;
  for (size_t i = 0; i < nq; i++)
    q[i] = urand(&st) - 0.5f, dout[i] = urand(&st) - 0.5f;
  for (size_t i = 0; i < nk; i++)
    k[i] = urand(&st) - 0.5f, v[i] = urand(&st) - 0.5f;
  struct tz_rope rope = {.theta = 500.0};
  memcpy(rq, q, nq * 4);
  TZ_ASSERT_OK(tz_compute_rope_fwd(cm, rq, B, T, H, D, &rope, pos));
  TZ_ASSERT_OK(tz_compute_attention_fwd(cm, out, lse, q, k, v, B, T, H, Hkv, D, pos, NULL));
  TZ_ASSERT_OK(tz_compute_attention_bwd(cm, dq, dk, dv, delta, dout, q, k, v, out, lse, B, T, H,
                                        Hkv, D, pos, NULL));
  int n_docs = 0, differs_from_unpacked = 0;
  for (int b = 0; b < B; b++)
    for (int i = 0, t0 = 0; docs[b][i]; t0 += docs[b][i++]) {
      int L = docs[b][i];
      size_t aq = (size_t)L * H * D, ak = (size_t)L * Hkv * D;
      size_t oq = ((size_t)b * T + t0) * H * D, ok = ((size_t)b * T + t0) * Hkv * D;
      float *o1 = malloc(aq * 4), *l1 = malloc((size_t)H * L * 4), *d1 = malloc((size_t)H * L * 4);
      float *dq1 = malloc(aq * 4), *dk1 = malloc(ak * 4), *dv1 = malloc(ak * 4);
      float *r1 = malloc(aq * 4);
      memcpy(r1, q + oq, aq * 4);
      TZ_ASSERT_OK(tz_compute_rope_fwd(cm, r1, 1, L, H, D, &rope, NULL));
      assert_memory_equal(r1, rq + oq, aq * 4);
      TZ_ASSERT_OK(tz_compute_attention_fwd(cm, o1, l1, q + oq, k + ok, v + ok, 1, L, H, Hkv, D,
                                            NULL, NULL));
      TZ_ASSERT_OK(tz_compute_attention_bwd(cm, dq1, dk1, dv1, d1, dout + oq, q + oq, k + ok,
                                            v + ok, o1, l1, 1, L, H, Hkv, D, NULL, NULL));
      assert_memory_equal(o1, out + oq, aq * 4);
      assert_memory_equal(dq1, dq + oq, aq * 4);
      assert_memory_equal(dk1, dk + ok, ak * 4);
      assert_memory_equal(dv1, dv + ok, ak * 4);
      for (int h = 0; h < H; h++)
        assert_memory_equal(l1 + (size_t)h * L, lse + ((size_t)b * H + h) * T + t0, (size_t)L * 4);
      differs_from_unpacked += t0 > 0;
      n_docs++;
      free(o1), free(l1), free(d1), free(dq1), free(dk1), free(dv1), free(r1);
    }
  assert_int_equal(n_docs, 5);
  assert_true(differs_from_unpacked == 3);
  /* Without pos the same rows are one document each: another output where documents follow. */
  float *o2 = malloc(nq * 4);
  TZ_ASSERT_OK(tz_compute_attention_fwd(cm, o2, lse, q, k, v, B, T, H, Hkv, D, NULL, NULL));
  assert_memory_not_equal(o2 + 5 * H * D, out + 5 * H * D, (size_t)H * D * 4);
  assert_memory_equal(o2, out, (size_t)5 * H * D * 4); /* the first document is the same */
  /* Broken positions: a row not starting at 0, a jump. */
  pos[T + 7] = 3;
  assert_int_equal(tz_compute_attention_fwd(cm, o2, lse, q, k, v, B, T, H, Hkv, D, pos, NULL),
                   TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "row 1 token 7"));
  pos[T + 7] = 7;
  pos[0] = 1;
  assert_int_equal(tz_compute_rope_fwd(cm, rq, B, T, H, D, &rope, pos), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "row 0 token 0"));
  free(q), free(k), free(v), free(dout), free(out), free(lse), free(delta), free(dq), free(dk);
  free(dv), free(rq), free(o2);
  tz_compute_destroy(cm);
  tz_compute_destroy(plain);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_variants),
      cmocka_unit_test(test_attention_long),
      cmocka_unit_test(test_packed_documents),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
