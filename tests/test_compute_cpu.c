/* The cpu compute backend op by op: registry, casts and their rounding, the specified order of
 * tz_compute_sum and of tz_compute_sumsq_segments, the fused residual in rmsnorm_bwd's dres and
 * the SwiGLU's rebuild, rope, the bias ops, cross-entropy, and thread-count independence of the
 * reductions (attention and packed documents: test_compute_attention.c; matmul, matmul_add and
 * matmul_many: test_compute_matmul.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/adam.h"
#include "kernels/compute.h"
#include "kernels/compute_timed.h"
#include "core/dtype.h"
#include "compute_cpu_cases.h"
#include "testlib.h"

static void test_registry(void **state) {
  (void)state;
  assert_true(tz_compute_backend_count() >= 1);
  assert_string_equal(tz_compute_backend_name(0), "cpu");
  assert_null(tz_compute_backend_name(tz_compute_backend_count()));
  assert_true(tz_compute_backend_built("cpu"));
  assert_false(tz_compute_backend_built("tpu"));
  char why[256];
  assert_int_equal(tz_compute_probe("cpu", why, sizeof why), 0);
  assert_int_equal(tz_compute_probe("tpu", why, sizeof why), TZ_ENOENT);
  int has_cuda = 0;
  for (int i = 0; i < tz_compute_backend_count(); i++)
    has_cuda |= strcmp(tz_compute_backend_name(i), "cuda") == 0;
  assert_int_equal(tz_compute_backend_built("cuda"), has_cuda);
  if (!has_cuda) {
    assert_int_equal(tz_compute_probe("cuda", why, sizeof why), TZ_ENOTSUP);
    assert_non_null(strstr(why, "not compiled in"));
  }
  tz_compute *cm;
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  p.dtype = TZ_BF16;
  assert_int_equal(tz_compute_create("cpu", &p, &cm), TZ_ENOTSUP);
  assert_non_null(strstr(tz_err_msg(), "float32 only"));
  assert_int_equal(tz_compute_create("nope", NULL, &cm), TZ_ENOENT);
  cm = cpu(0);
  assert_true(tz_compute_threads(cm) >= 1);
  assert_string_equal(tz_compute_backend(cm), "cpu");
  assert_int_equal(tz_compute_dtype(cm), TZ_F32);
  assert_null(tz_compute_stream(cm));
  void *p1;
  TZ_ASSERT_OK(tz_compute_alloc(cm, 1000, &p1));
  assert_true(((uintptr_t)p1 & 255) == 0);
  tz_compute_free(cm, p1);
  tz_compute_destroy(cm);
  tz_compute_destroy(NULL);
  enum tz_dtype dt;
  TZ_ASSERT_OK(tz_dtype_parse("bfloat16", &dt));
  assert_int_equal(dt, TZ_BF16);
  TZ_ASSERT_OK(tz_dtype_parse("FP16", &dt));
  assert_int_equal(dt, TZ_F16);
  assert_int_equal(tz_dtype_parse("int8", &dt), TZ_EINVAL);
  assert_int_equal(tz_dtype_size(TZ_BF16), 2);
}

/* bf16: the nearest of the two neighbours, ties to the even one; checked in double. */
static void test_bf16_rounding(void **state) {
  (void)state;
  assert_int_equal(tz_f32_to_bf16(1.0f), 0x3f80);
  assert_int_equal(tz_f32_to_bf16(1.0f + 0x1.0p-8f), 0x3f80);     /* tie, to even */
  assert_int_equal(tz_f32_to_bf16(1.0f + 3 * 0x1.0p-8f), 0x3f82); /* tie, to even */
  assert_int_equal(tz_f32_to_bf16(INFINITY), 0x7f80);
  assert_true(isnan(tz_bf16_to_f32(tz_f32_to_bf16(NAN))));
  assert_int_equal(tz_f32_to_bf16(0x1.fffffep127f), 0x7f80); /* rounds up to inf */
  uint64_t st = 1;
  for (int i = 0; i < 200000; i++) {
    uint32_t u = (uint32_t)tz_test_rand(&st);
    float f = tz_f32_from_bits(u);
    if (!isfinite(f))
      continue;
    uint16_t h = tz_f32_to_bf16(f);
    /* The two bf16 neighbours of f towards zero and away from it; past the largest finite one
     * the "next" value is 2^128, which stands for infinity (the IEEE overflow rule). */
    uint32_t down = u & 0xffff0000u, up = down + 0x10000u;
    double lo = tz_f32_from_bits(down);
    double hi =
        (up & 0x7f800000u) == 0x7f800000u ? copysign(0x1.0p128, f) : (double)tz_f32_from_bits(up);
    double dl = fabs((double)f - lo), dh = fabs((double)f - hi);
    uint16_t want = dl < dh              ? (uint16_t)(down >> 16)
                    : dl > dh            ? (uint16_t)(up >> 16)
                    : ((down >> 16) & 1) ? (uint16_t)(up >> 16)
                                         : (uint16_t)(down >> 16);
    if (h != want)
      fail_msg("bf16 of %a (0x%08x): got 0x%04x want 0x%04x", (double)f, u, h, want);
  }
}

/* fp16 against the compiler's own conversion, over random bit patterns and special values. */
static void test_f16_rounding(void **state) {
  (void)state;
  uint64_t st = 2;
  for (int i = 0; i < 400000; i++) {
    uint32_t u = (uint32_t)tz_test_rand(&st);
    /* Bias towards fp16's range, where rounding is interesting. */
    if (i & 1)
      u = (u & 0x81ffffffu) | (((uint32_t)(100 + (tz_test_rand(&st) % 50))) << 23);
    float f = tz_f32_from_bits(u);
    _Float16 ref = (_Float16)f;
    uint16_t want;
    memcpy(&want, &ref, 2);
    uint16_t got = tz_f32_to_f16(f);
    if (isnan(f))
      assert_true(isnan(tz_f16_to_f32(got)));
    else if (got != want)
      fail_msg("f16 of %a (0x%08x): got 0x%04x want 0x%04x", (double)f, u, got, want);
  }
  for (uint32_t h = 0; h < 0x10000; h++) {
    _Float16 x;
    uint16_t hh = (uint16_t)h;
    memcpy(&x, &hh, 2);
    float want = (float)x, got = tz_f16_to_f32(hh);
    if (isnan(want))
      assert_true(isnan(got));
    else
      assert_memory_equal(&got, &want, 4);
  }
}

static void test_cast_op(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  enum { n = 3000 };
  float *x = malloc(n * 4), *back = malloc(n * 4);
  uint16_t *h = malloc(n * 2);
  uint64_t st = 3;
  for (int i = 0; i < n; i++)
    x[i] = (urand(&st) - 0.5f) * 1000.0f;
  TZ_ASSERT_OK(tz_compute_cast(cm, h, TZ_BF16, x, TZ_F32, n));
  for (int i = 0; i < n; i++)
    assert_int_equal(h[i], tz_f32_to_bf16(x[i]));
  TZ_ASSERT_OK(tz_compute_cast(cm, back, TZ_F32, h, TZ_BF16, n));
  for (int i = 0; i < n; i++)
    assert_true(back[i] == tz_bf16_to_f32(h[i]));
  TZ_ASSERT_OK(tz_compute_cast(cm, h, TZ_F16, x, TZ_F32, n));
  for (int i = 0; i < n; i++)
    assert_int_equal(h[i], tz_f32_to_f16(x[i]));
  /* elementwise ops on 16-bit storage too */
  TZ_ASSERT_OK(tz_compute_fill(cm, TZ_BF16, h, 1.5f, n));
  TZ_ASSERT_OK(tz_compute_axpy(cm, TZ_BF16, h, 2.0f, h, n));
  TZ_ASSERT_OK(tz_compute_scale(cm, TZ_BF16, h, 0.5f, n));
  for (int i = 0; i < n; i++)
    assert_true(tz_bf16_to_f32(h[i]) == 2.25f);
  free(x);
  free(back);
  free(h);
  tz_compute_destroy(cm);
}

/* The order of compute.h, written as a recursion rather than levels of loops. */
static float spec_sum(const float *x, size_t n, int square) {
  if (n == 0)
    return 0.0f;
  size_t nc = (n + TZ_SUM_CHUNK - 1) / TZ_SUM_CHUNK;
  float *part = malloc(nc * sizeof *part);
  for (size_t c = 0; c < nc; c++) {
    float lane[32];
    for (int l = 0; l < 32; l++) {
      lane[l] = 0.0f;
      for (size_t j = 0; j < TZ_SUM_CHUNK / 32; j++) {
        size_t i = c * TZ_SUM_CHUNK + j * 32 + l;
        if (i < n)
          lane[l] += square ? x[i] * x[i] : x[i];
      }
    }
    for (int s = 16; s >= 1; s /= 2)
      for (int l = 0; l < s; l++)
        lane[l] += lane[l + s];
    part[c] = lane[0];
  }
  float r = nc == 1 ? part[0] : spec_sum(part, nc, 0);
  free(part);
  return r;
}

static void test_sum_order(void **state) {
  (void)state;
  size_t sizes[] = {0, 1, 31, 33, 1024, 1025, 5000, 1024 * 1024 + 7, 3 * 1024 * 1024 + 100};
  uint64_t st = 4;
  size_t maxn = sizes[sizeof sizes / sizeof sizes[0] - 1];
  float *x = malloc(maxn * sizeof *x);
  for (size_t i = 0; i < maxn; i++)
    x[i] = (urand(&st) - 0.3f) * (i % 7 == 0 ? 1000.0f : 1.0f);
  tz_compute *c1 = cpu(1), *c3 = cpu(3);
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    size_t n = sizes[k];
    for (int sq = 0; sq < 2; sq++) {
      float want = spec_sum(x, n, sq), a, b;
      if (sq) {
        TZ_ASSERT_OK(tz_compute_sumsq(c1, &a, TZ_F32, x, n, 0));
        TZ_ASSERT_OK(tz_compute_sumsq(c3, &b, TZ_F32, x, n, 0));
      } else {
        TZ_ASSERT_OK(tz_compute_sum(c1, &a, TZ_F32, x, n, 0));
        TZ_ASSERT_OK(tz_compute_sum(c3, &b, TZ_F32, x, n, 0));
      }
      assert_memory_equal(&a, &want, 4);
      assert_memory_equal(&b, &want, 4);
      double d = 0;
      for (size_t i = 0; i < n; i++)
        d += sq ? (double)x[i] * x[i] : x[i];
      assert_true(fabs(a - d) <= 1e-5 * (fabs(d) + 1));
      float acc = 10.0f;
      TZ_ASSERT_OK(sq ? tz_compute_sumsq(c3, &acc, TZ_F32, x, n, 1)
                      : tz_compute_sum(c3, &acc, TZ_F32, x, n, 1));
      assert_true(acc == 10.0f + want);
    }
  }
  free(x);
  tz_compute_destroy(c1);
  tz_compute_destroy(c3);
}

/* Random values of dtype dt with magnitudes spread over 2^-emax .. 2^emax (so that the order of
 * the sum shows in the bits), packed into dt's storage; vals receives them widened to float. */
static void *random_of(enum tz_dtype dt, size_t n, int emax, uint64_t *st, float *vals) {
  void *p = malloc((n ? n : 1) * tz_dtype_size(dt));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) {
    int e = (int)(tz_test_rand(st) % (uint64_t)(2 * emax + 1)) - emax;
    float v = ldexpf(urand(st) - 0.5f, e);
    if (dt == TZ_F32) {
      ((float *)p)[i] = v;
      vals[i] = v;
    } else if (dt == TZ_BF16) {
      ((uint16_t *)p)[i] = tz_f32_to_bf16(v);
      vals[i] = tz_bf16_to_f32(((uint16_t *)p)[i]);
    } else {
      ((uint16_t *)p)[i] = tz_f32_to_f16(v);
      vals[i] = tz_f16_to_f32(((uint16_t *)p)[i]);
    }
  }
  return p;
}

/* tz_compute_sumsq_segments gives, segment by segment, the bits of tz_compute_sumsq on that
 * segment and of the spec's order, for every input dtype, whole and short last chunks, a segment
 * of one element, segments with three levels, and any thread count. */
static void test_sumsq_segments(void **state) {
  (void)state;
  static const enum tz_dtype dts[] = {TZ_F32, TZ_BF16, TZ_F16};
  static const size_t lens[] = {16384, 1000, 1024, 3000, 1, 1024 * 1024 + 5};
  static const size_t segs[] = {1, 7};
  tz_compute *c1 = cpu(1), *c3 = cpu(3);
  uint64_t st = 11;
  for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
      for (size_t si = 0; si < sizeof segs / sizeof segs[0]; si++) {
        enum tz_dtype dt = dts[d];
        size_t L = lens[li], S = segs[si];
        if (L > 16384 && S > 2)
          S = 2; /* three levels need no more than two segments to show */
        size_t n = L * S, esz = tz_dtype_size(dt);
        float *vals = malloc(n * sizeof *vals);
        assert_non_null(vals);
        void *x = random_of(dt, n, dt == TZ_F16 ? 6 : 30, &st, vals);
        float *a = malloc(S * sizeof *a), *b = malloc(S * sizeof *b);
        assert_non_null(a);
        assert_non_null(b);
        TZ_ASSERT_OK(tz_compute_sumsq_segments(c1, a, dt, x, L, S));
        TZ_ASSERT_OK(tz_compute_sumsq_segments(c3, b, dt, x, L, S));
        for (size_t j = 0; j < S; j++) {
          float one = -1.0f;
          TZ_ASSERT_OK(tz_compute_sumsq(c3, &one, dt, (const char *)x + j * L * esz, L, 0));
          float want = spec_sum(vals + j * L, L, 1);
          assert_memory_equal(&one, &want, 4);
          assert_memory_equal(&a[j], &want, 4);
          assert_memory_equal(&b[j], &want, 4);
          double d2 = 0;
          for (size_t i = 0; i < L; i++)
            d2 += (double)vals[j * L + i] * vals[j * L + i];
          assert_true(fabs(a[j] - d2) <= 1e-5 * d2);
        }
        free(a), free(b), free(x), free(vals);
      }
  /* No segments: nothing is written. Empty segments: zeros, as tz_compute_sumsq of nothing. */
  float out[3] = {7.0f, 7.0f, 7.0f}, x1 = 2.0f;
  TZ_ASSERT_OK(tz_compute_sumsq_segments(c3, out, TZ_F32, &x1, 16384, 0));
  TZ_ASSERT_OK(tz_compute_sumsq_segments(c3, out, TZ_F32, NULL, 16384, 0));
  assert_true(out[0] == 7.0f && out[1] == 7.0f && out[2] == 7.0f);
  TZ_ASSERT_OK(tz_compute_sumsq_segments(c3, out, TZ_BF16, &x1, 0, 3));
  for (int j = 0; j < 3; j++)
    assert_true(out[j] == 0.0f && !signbit(out[j]));
  assert_int_equal(tz_compute_sumsq_segments(c3, NULL, TZ_F32, &x1, 1, 1), TZ_EINVAL);
  assert_int_equal(tz_compute_sumsq_segments(c3, out, TZ_F32, NULL, 1, 1), TZ_EINVAL);
  assert_int_equal(tz_compute_sumsq_segments(c3, out, (enum tz_dtype)99, &x1, 1, 1), TZ_EINVAL);
  assert_int_equal(tz_compute_sumsq_segments(c3, out, TZ_F32, &x1, SIZE_MAX / 8, 3), TZ_EINVAL);
  tz_compute_destroy(c1);
  tz_compute_destroy(c3);
}

/* rmsnorm_bwd's residual: dx = dres + g in one rounding. dres == dx accumulates; NULL gives the
 * bits of accumulating onto zeros; another tensor gives the bits of copying it into dx first. */
static void test_rmsnorm_bwd_residual(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  int N = 9, C = 50;
  size_t NC = (size_t)N * C;
  uint64_t st = 3;
  float *x = malloc(NC * 4), *dy = malloc(NC * 4), *res = malloc(NC * 4), *w = malloc(C * 4);
  float *dx_acc = malloc(NC * 4), *dx = malloc(NC * 4), *rstd = malloc(N * 4);
  float *dw_acc = calloc(C, 4), *dw = calloc(C, 4), *h = malloc(NC * 4);
  assert_true(x && dy && res && w && dx_acc && dx && rstd && dw_acc && dw && h);
  for (size_t i = 0; i < NC; i++) {
    x[i] = 2 * urand(&st) - 1;
    dy[i] = 2 * urand(&st) - 1;
    res[i] = 2 * urand(&st) - 1;
  }
  for (int j = 0; j < C; j++)
    w[j] = urand(&st) + 0.5f;
  TZ_ASSERT_OK(tz_compute_rmsnorm_fwd(cm, h, rstd, x, w, N, C, 1e-5f, 0.0f));
  /* the reference: copy the residual into dx, then accumulate onto it */
  memcpy(dx_acc, res, NC * 4);
  TZ_ASSERT_OK(tz_compute_rmsnorm_bwd(cm, dx_acc, dx_acc, dw_acc, dy, x, w, rstd, N, C, 0.0f));
  for (size_t i = 0; i < NC; i++)
    dx[i] = NAN; /* not read */
  TZ_ASSERT_OK(tz_compute_rmsnorm_bwd(cm, dx, res, dw, dy, x, w, rstd, N, C, 0.0f));
  assert_memory_equal(dx, dx_acc, NC * 4);
  assert_memory_equal(dw, dw_acc, C * 4);
  /* NULL: onto zeros */
  memset(dx_acc, 0, NC * 4);
  TZ_ASSERT_OK(tz_compute_rmsnorm_bwd(cm, dx_acc, dx_acc, dw_acc, dy, x, w, rstd, N, C, 0.0f));
  for (size_t i = 0; i < NC; i++)
    dx[i] = NAN;
  TZ_ASSERT_OK(tz_compute_rmsnorm_bwd(cm, dx, NULL, dw, dy, x, w, rstd, N, C, 0.0f));
  assert_memory_equal(dx, dx_acc, NC * 4);
  /* the gradient itself, in float64: dres + r (w dy - x r^2 mean(w dy x)) */
  TZ_ASSERT_OK(tz_compute_rmsnorm_bwd(cm, dx, res, dw, dy, x, w, rstd, N, C, 0.0f));
  for (int n = 0; n < N; n++) {
    double ss = 0, dot = 0;
    for (int j = 0; j < C; j++) {
      ss += (double)x[n * C + j] * x[n * C + j];
      dot += (double)w[j] * dy[n * C + j] * x[n * C + j];
    }
    double r = 1 / sqrt(ss / C + 1e-5);
    for (int j = 0; j < C; j++) {
      double g = r * (w[j] * dy[n * C + j] - x[n * C + j] * r * r * dot / C);
      assert_true(fabs(dx[n * C + j] - (res[n * C + j] + g)) < 1e-5);
    }
  }
  free(x), free(dy), free(res), free(w), free(dx_acc), free(dx), free(rstd), free(dw_acc);
  free(dw), free(h);
  tz_compute_destroy(cm);
}

/* swiglu_bwd with out: the forward's output in the same pass, swiglu_fwd's bits; the gradients
 * the same bits as without it. */
static void test_swiglu_bwd_rebuild(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  size_t n = 1001;
  uint64_t st = 9;
  float *g = malloc(n * 4), *u = malloc(n * 4), *d = malloc(n * 4), *a = malloc(n * 4);
  float *a2 = malloc(n * 4), *dg = malloc(n * 4), *du = malloc(n * 4), *dg2 = malloc(n * 4),
        *du2 = malloc(n * 4);
  assert_true(g && u && d && a && a2 && dg && du && dg2 && du2);
  for (size_t i = 0; i < n; i++) {
    g[i] = 12 * urand(&st) - 6;
    u[i] = 4 * urand(&st) - 2;
    d[i] = 2 * urand(&st) - 1;
    a2[i] = NAN;
  }
  TZ_ASSERT_OK(tz_compute_glu_fwd(cm, TZ_GLU_SILU, a, g, u, n));
  TZ_ASSERT_OK(tz_compute_glu_bwd(cm, TZ_GLU_SILU, dg, du, NULL, d, g, u, n));
  TZ_ASSERT_OK(tz_compute_glu_bwd(cm, TZ_GLU_SILU, dg2, du2, a2, d, g, u, n));
  assert_memory_equal(a2, a, n * 4);
  assert_memory_equal(dg2, dg, n * 4);
  assert_memory_equal(du2, du, n * 4);
  for (size_t i = 0; i < n; i++) {
    double sg = 1 / (1 + exp(-(double)g[i]));
    assert_true(fabs(a2[i] - g[i] * sg * u[i]) < 1e-5 * (1 + fabs(g[i] * u[i])));
  }
  /* out may not alias the other tensors */
  assert_int_equal(tz_compute_glu_bwd(cm, TZ_GLU_SILU, dg, du, du, d, g, u, n), TZ_EINVAL);
  free(g), free(u), free(d), free(a), free(a2), free(dg), free(du), free(dg2), free(du2);
  tz_compute_destroy(cm);
}

static void test_rope_inverse(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  int B = 2, T = 9, nh = 3, D = 8;
  int n = B * T * nh * D;
  float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
  uint64_t st = 6;
  for (int i = 0; i < n; i++)
    x[i] = y[i] = urand(&st) - 0.5f;
  struct tz_rope rope = {.theta = 10000.0};
  TZ_ASSERT_OK(tz_compute_rope_fwd(cm, y, B, T, nh, D, &rope, NULL));
  /* position 0 is the identity; later positions move, preserving each pair's norm */
  for (int i = 0; i < nh * D; i++)
    assert_true(y[i] == x[i]);
  int moved = 0;
  for (int i = nh * D; i < n; i++)
    moved += y[i] != x[i];
  assert_true(moved > n / 2);
  /* the half-split pairing: (i, i + D/2) at t = 1, i = 0 rotates by exactly 1 radian */
  size_t base = (size_t)1 * nh * D;
  float c = (float)cos(1.0), s = (float)sin(1.0);
  assert_true(y[base] == x[base] * c - x[base + D / 2] * s);
  assert_true(y[base + D / 2] == x[base + D / 2] * c + x[base] * s);
  TZ_ASSERT_OK(tz_compute_rope_bwd(cm, y, B, T, nh, D, &rope, NULL));
  for (int i = 0; i < n; i++)
    assert_true(fabsf(y[i] - x[i]) < 1e-6f);
  assert_int_equal(tz_compute_rope_fwd(cm, y, B, T, nh, 7, &rope, NULL), TZ_EINVAL);
  free(x);
  free(y);
  tz_compute_destroy(cm);
}

/* Partial rotary (rope.rot = R < D, Phi-4-mini): each head's first R dims are rotated as a head of
 * R dims alone would be (the same bits: frequencies of R, pairs (i, i + R/2)), the rest pass
 * unchanged; an odd R, or one above D, is refused. */
static void test_rope_partial(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  enum { B = 2, T = 9, nh = 3, D = 16, R = 12 };
  int n = B * T * nh * D, nr = B * T * nh * R;
  float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
  float *r = malloc(sizeof(float) * nr);
  uint64_t st = 16;
  for (int i = 0; i < n; i++)
    x[i] = y[i] = urand(&st) - 0.5f;
  for (int row = 0; row < B * T * nh; row++)
    memcpy(r + row * R, x + row * D, sizeof(float) * R);
  struct tz_rope part = {.theta = 500.0, .rot = R}, whole = {.theta = 500.0};
  for (int dir = 0; dir < 2; dir++) {
    if (dir == 0) {
      TZ_ASSERT_OK(tz_compute_rope_fwd(cm, y, B, T, nh, D, &part, NULL));
      TZ_ASSERT_OK(tz_compute_rope_fwd(cm, r, B, T, nh, R, &whole, NULL));
    } else {
      TZ_ASSERT_OK(tz_compute_rope_bwd(cm, y, B, T, nh, D, &part, NULL));
      TZ_ASSERT_OK(tz_compute_rope_bwd(cm, r, B, T, nh, R, &whole, NULL));
    }
    int moved = 0;
    for (int row = 0; row < B * T * nh; row++)
      for (int d = 0; d < D; d++) {
        float want = d < R ? r[row * R + d] : x[row * D + d];
        assert_true(memcmp(&y[row * D + d], &want, sizeof want) == 0);
        moved += d < R && y[row * D + d] != x[row * D + d];
      }
    assert_true(moved > nr / 2 || dir == 1);
  }
  part.rot = 11;
  assert_int_equal(tz_compute_rope_fwd(cm, y, B, T, nh, D, &part, NULL), TZ_EINVAL);
  part.rot = 18;
  assert_int_equal(tz_compute_rope_fwd(cm, y, B, T, nh, D, &part, NULL), TZ_EINVAL);
  free(x), free(y), free(r);
  tz_compute_destroy(cm);
}

/* bias_add against a plain double sum (one rounding: exact match), bias_grad's column sums in
 * row order against double (and their exact float order), accumulation onto db, the same bits for
 * every thread count, widths over several channel slices, and the argument checks. */
static void test_bias_ops(void **state) {
  (void)state;
  int N = 37, n = 150; /* more than two 64-column slices, a short last one */
  float *x = malloc(sizeof(float) * N * n), *y = malloc(sizeof(float) * N * n);
  float *b = malloc(sizeof(float) * n), *db = malloc(sizeof(float) * n);
  float *db1 = malloc(sizeof(float) * n);
  uint64_t st = 9;
  for (int i = 0; i < N * n; i++)
    x[i] = urand(&st) - 0.5f;
  for (int j = 0; j < n; j++)
    b[j] = urand(&st) - 0.5f;
  int threads[] = {1, 2, 3};
  for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
    tz_compute *cm = cpu(threads[ti]);
    memcpy(y, x, sizeof(float) * N * n);
    TZ_ASSERT_OK(tz_compute_bias_add(cm, y, b, N, n));
    for (int r = 0; r < N; r++)
      for (int j = 0; j < n; j++)
        if (y[r * n + j] != (float)((double)x[r * n + j] + (double)b[j]))
          fail_msg("bias_add (%d threads): [%d][%d] %.9g, want %.9g", threads[ti], r, j,
                   y[r * n + j], (double)x[r * n + j] + (double)b[j]);
    /* db starts non-zero: the sums are added onto it once */
    for (int j = 0; j < n; j++)
      db[j] = 0.25f * (float)j;
    TZ_ASSERT_OK(tz_compute_bias_grad(cm, db, x, N, n));
    for (int j = 0; j < n; j++) {
      double want = 0;
      float order = 0.0f;
      for (int r = 0; r < N; r++) {
        want += x[r * n + j];
        order += x[r * n + j];
      }
      if (fabs(db[j] - (0.25 * j + want)) > 1e-5)
        fail_msg("bias_grad (%d threads): column %d %.9g, want %.9g", threads[ti], j, db[j],
                 0.25 * j + want);
      if (db[j] != 0.25f * (float)j + order)
        fail_msg("bias_grad (%d threads): column %d is not the row-order float sum added once",
                 threads[ti], j);
    }
    if (ti == 0)
      memcpy(db1, db, sizeof(float) * n);
    else
      assert_memory_equal(db, db1, sizeof(float) * n);
    TZ_ASSERT_OK(tz_compute_bias_add(cm, y, b, 0, n)); /* no rows: nothing to do */
    assert_int_equal(tz_compute_bias_add(cm, y, b, N, 0), TZ_EINVAL);
    assert_int_equal(tz_compute_bias_grad(cm, db, x, -1, n), TZ_EINVAL);
    assert_int_equal(tz_compute_bias_grad(cm, NULL, x, N, n), TZ_EINVAL);
    tz_compute_destroy(cm);
  }
  /* Through a timed instance: the same bits, each op counted under its own name. */
  tz_compute *cm = cpu(2), *timed;
  struct tz_compute_times times;
  memset(&times, 0, sizeof times);
  TZ_ASSERT_OK(tz_compute_timed_create(cm, &times, &timed));
  for (int j = 0; j < n; j++)
    db[j] = 0.25f * (float)j;
  TZ_ASSERT_OK(tz_compute_bias_grad(timed, db, x, N, n));
  assert_memory_equal(db, db1, sizeof(float) * n);
  memcpy(y, x, sizeof(float) * N * n);
  TZ_ASSERT_OK(tz_compute_bias_add(timed, y, b, N, n));
  assert_true(y[n + 1] == x[n + 1] + b[1]);
  assert_int_equal(times.calls[TZ_OP_BIAS_ADD], 1);
  assert_int_equal(times.calls[TZ_OP_BIAS_GRAD], 1);
  /* and the work the arguments imply: bytes each input read and output written once, flop */
  assert_true(times.bytes[TZ_OP_BIAS_ADD] == (2.0 * N * n + n) * 4);
  assert_true(times.bytes[TZ_OP_BIAS_GRAD] == (double)N * n * 4 + 2.0 * n * 4);
  TZ_ASSERT_OK(tz_compute_glu_bwd(timed, TZ_GLU_SILU, y, y + n, x + n, x, b, b, (size_t)n));
  assert_true(times.bytes[TZ_OP_SWIGLU_BWD] == 6.0 * n * 4);
  TZ_ASSERT_OK(tz_compute_matmul(timed, 0, 1, 2, 3, n, 1.0f, x, n, x, n, 1.0f, y, TZ_F32, 3));
  assert_true(times.flop[TZ_OP_MATMUL_NT] == 2.0 * 2 * 3 * n);
  assert_true(times.bytes[TZ_OP_MATMUL_NT] == (2.0 * n + 3.0 * n) * 4 + 2 * 6 * 4);
  assert_true(times.bytes[TZ_OP_OTHER] == 0 && times.flop[TZ_OP_BIAS_ADD] == 0);
  tz_compute_destroy(timed);
  tz_compute_destroy(cm);
  free(x);
  free(y);
  free(b);
  free(db);
  free(db1);
}

static void test_xent(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  int N = 5, V = 1000;
  float *lg = malloc(sizeof(float) * N * V), *dl = malloc(sizeof(float) * N * V);
  float losses[5], losses2[5];
  int32_t tgt[5] = {0, 999, 17, 500, 17};
  uint64_t st = 7;
  for (int i = 0; i < N * V; i++)
    lg[i] = (urand(&st) - 0.5f) * 20.0f;
  TZ_ASSERT_OK(tz_compute_xent(cm, losses2, NULL, lg, tgt, N, V, 0.0f, 0.0f));
  memcpy(dl, lg, sizeof(float) * N * V);
  TZ_ASSERT_OK(tz_compute_xent(cm, losses, dl, dl, tgt, N, V, 0.25f, 0.0f)); /* in place */
  assert_memory_equal(losses, losses2, sizeof losses);
  for (int n = 0; n < N; n++) {
    const float *r = lg + n * V;
    double m = -INFINITY, z = 0;
    for (int j = 0; j < V; j++)
      m = fmax(m, r[j]);
    for (int j = 0; j < V; j++)
      z += exp(r[j] - m);
    double lse = m + log(z);
    assert_true(fabs(losses[n] - (lse - r[tgt[n]])) < 1e-5);
    double rowsum = 0;
    for (int j = 0; j < V; j++) {
      double want = (exp(r[j] - lse) - (j == tgt[n])) * 0.25;
      assert_true(fabs(dl[n * V + j] - want) < 1e-7);
      rowsum += dl[n * V + j];
    }
    assert_true(fabs(rowsum) < 1e-6);
  }
  tgt[3] = 1000;
  assert_int_equal(tz_compute_xent(cm, losses, NULL, lg, tgt, N, V, 1.0f, 0.0f), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "index 3"));
  free(lg);
  free(dl);
  tz_compute_destroy(cm);
}

/* A sharp softmax over a large vocabulary, as a trained model's: one logit 0, the other 200063
 * at -18, each exp(-18) = 1.5e-8 below half the float ulp of the sum near 1. Summed in float
 * they are all lost and the loss comes out 0 where it is log(1 + 200063 exp(-18)) = 3.05e-3;
 * the sum must keep them (transformers' loss of a trained Phi-4-mini at 200064 tokens was 1.2e-3
 * above a float sum's). */
static void test_xent_sharp_large_vocabulary(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  const int V = 200064;
  float *lg = malloc(sizeof(float) * V), loss;
  int32_t tgt = 7;
  for (int j = 0; j < V; j++)
    lg[j] = j == tgt ? 0.0f : -18.0f;
  TZ_ASSERT_OK(tz_compute_xent(cm, &loss, NULL, lg, &tgt, 1, V, 0.0f, 0.0f));
  double want = log1p((V - 1) * exp(-18.0));
  assert_true(fabs(loss - want) < 1e-7 * want + 1e-9);
  free(lg);
  tz_compute_destroy(cm);
}

/* The Gemma families' elementwise variants against float64 computed here: the GeGLU's tanh gelu
 * and its derivative; RMSNorm with its weight offset (1 + w), forward and backward;
 * cross-entropy through a final softcap and tz_compute_softcap (their attention:
 * test_compute_attention.c). */
static void test_gemma_elementwise(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  enum { N = 3, C = 40, n = N * C };
  float g[n], u[n], d[n], a[n], dg[n], du[n], x[n], w[C], y[n], dx[n], dw[C], rstd[N];
  uint64_t st = 5;
  for (int i = 0; i < n; i++)
    g[i] = 10 * urand(&st) - 5, u[i] = 4 * urand(&st) - 2, d[i] = 2 * urand(&st) - 1,
    x[i] = 4 * urand(&st) - 2;
  for (int j = 0; j < C; j++)
    w[j] = urand(&st) - 0.5f, dw[j] = 0;
  /* GeGLU, tanh gelu: value and derivative (the derivative against central differences in
   * double of the same formula) */
  TZ_ASSERT_OK(tz_compute_glu_fwd(cm, TZ_GLU_GELU_TANH, a, g, u, n));
  TZ_ASSERT_OK(tz_compute_glu_bwd(cm, TZ_GLU_GELU_TANH, dg, du, NULL, d, g, u, n));
  for (int i = 0; i < n; i++) {
    double G = g[i], k0 = sqrt(2 / M_PI);
#define GELU(z) (0.5 * (z) * (1 + tanh(k0 * ((z) + 0.044715 * (z) * (z) * (z)))))
    double gl = GELU(G), h = 1e-5, slope = (GELU(G + h) - GELU(G - h)) / (2 * h);
#undef GELU
    assert_true(fabs(a[i] - gl * u[i]) < 1e-5 * (1 + fabs(gl * u[i])));
    assert_true(fabs(du[i] - d[i] * gl) < 1e-5);
    assert_true(fabs(dg[i] - d[i] * u[i] * slope) < 1e-5);
  }
  /* RMSNorm with the weight offset: y = x rstd (1 + w); dx and dw by hand in double */
  TZ_ASSERT_OK(tz_compute_rmsnorm_fwd(cm, y, rstd, x, w, N, C, 1e-6f, 1.0f));
  TZ_ASSERT_OK(tz_compute_rmsnorm_bwd(cm, dx, NULL, dw, d, x, w, rstd, N, C, 1.0f));
  double rdw[C] = {0};
  for (int r = 0; r < N; r++) {
    double ss = 0, dot = 0;
    for (int j = 0; j < C; j++)
      ss += (double)x[r * C + j] * x[r * C + j];
    double rs = 1 / sqrt(ss / C + 1e-6);
    for (int j = 0; j < C; j++) {
      assert_true(fabs(y[r * C + j] - x[r * C + j] * rs * (1 + (double)w[j])) < 1e-5);
      dot += (1 + (double)w[j]) * d[r * C + j] * x[r * C + j];
      rdw[j] += d[r * C + j] * x[r * C + j] * rs;
    }
    for (int j = 0; j < C; j++) {
      double want = rs * ((1 + (double)w[j]) * d[r * C + j] - x[r * C + j] * rs * rs * dot / C);
      assert_true(fabs(dx[r * C + j] - want) < 1e-5);
    }
  }
  for (int j = 0; j < C; j++)
    assert_true(fabs(dw[j] - rdw[j]) < 1e-5);
  assert_int_equal(tz_compute_rmsnorm_fwd(cm, y, rstd, x, w, N, C, 1e-6f, 2.0f), TZ_EINVAL);
  /* Cross-entropy through the softcap, and the softcap alone */
  enum { V = 300 };
  float lg[V * 2], dl[V * 2], loss[2], capd[V * 2];
  int32_t tgt[2] = {7, 299};
  for (int i = 0; i < 2 * V; i++)
    lg[i] = 80 * urand(&st) - 40;
  const float cap = 30.0f;
  TZ_ASSERT_OK(tz_compute_xent(cm, loss, dl, lg, tgt, 2, V, 0.5f, cap));
  memcpy(capd, lg, sizeof lg);
  TZ_ASSERT_OK(tz_compute_softcap(cm, capd, 2 * V, cap));
  for (int r = 0; r < 2; r++) {
    double z[V], m = -INFINITY, s = 0;
    for (int j = 0; j < V; j++) {
      z[j] = cap * tanh(lg[r * V + j] / (double)cap);
      assert_true(fabs(capd[r * V + j] - z[j]) < 1e-5);
      m = fmax(m, z[j]);
    }
    for (int j = 0; j < V; j++)
      s += exp(z[j] - m);
    double lse = m + log(s);
    assert_true(fabs(loss[r] - (lse - z[tgt[r]])) < 1e-4);
    for (int j = 0; j < V; j++) {
      double th = z[j] / cap;
      double want = (exp(z[j] - lse) - (j == tgt[r])) * 0.5 * (1 - th * th);
      assert_true(fabs(dl[r * V + j] - want) < 1e-6);
    }
  }
  tz_compute_destroy(cm);
}

/* TZ_TARGET_IGNORE: a row that is no target has loss 0 and dlogits 0, the others the bits of a
 * call without it; another negative target is refused. */
static void test_xent_ignore(void **state) {
  (void)state;
  tz_compute *cm = cpu(2);
  enum { N = 6, V = 11 };
  float lg[N * V], dl[N * V], dl2[N * V], loss[N], loss2[N];
  int32_t tgt[N] = {3, 0, 10, 5, 7, 1}, tgt2[N];
  uint64_t st = 5;
  for (int i = 0; i < N * V; i++)
    lg[i] = 4 * urand(&st) - 2;
  TZ_ASSERT_OK(tz_compute_xent(cm, loss, dl, lg, tgt, N, V, 0.5f, 0.0f));
  memcpy(tgt2, tgt, sizeof tgt);
  tgt2[1] = tgt2[4] = TZ_TARGET_IGNORE;
  TZ_ASSERT_OK(tz_compute_xent(cm, loss2, dl2, lg, tgt2, N, V, 0.5f, 0.0f));
  for (int n = 0; n < N; n++) {
    if (tgt2[n] == TZ_TARGET_IGNORE) {
      assert_true(loss2[n] == 0.0f && loss[n] > 0.0f);
      for (int j = 0; j < V; j++)
        assert_true(dl2[n * V + j] == 0.0f);
    } else {
      assert_true(loss2[n] == loss[n]);
      assert_memory_equal(dl2 + n * V, dl + n * V, V * sizeof(float));
    }
  }
  tgt2[2] = -2;
  assert_int_equal(tz_compute_xent(cm, loss2, NULL, lg, tgt2, N, V, 1.0f, 0.0f), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "index 2"));
  tz_compute_destroy(cm);
}

/* tz_compute_adam on the cpu backend is tz_adam_cpu on the instance's threads, bit for bit, and
 * the cpu backend has no devices to ask about. */
static void test_adam_op(void **state) {
  (void)state;
  enum { n = 70001 };
  float *a = malloc(sizeof(float) * 4 * n), *b = malloc(sizeof(float) * 4 * n);
  uint16_t *ca = malloc(2 * n), *cb = malloc(2 * n);
  assert_non_null(a && b && ca && cb);
  uint64_t st = 7;
  for (int i = 0; i < 4 * n; i++)
    a[i] = urand(&st) - 0.5f;
  for (int i = 0; i < n; i++) /* v >= 0 */
    a[2 * n + i] = fabsf(a[2 * n + i]);
  memcpy(b, a, sizeof(float) * 4 * n);
  struct tz_adam_params p = {.lr = 1e-3f,
                             .beta1 = 0.9f,
                             .beta2 = 0.999f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .decoupled = 1,
                             .grad_scale = 0.5f};
  TZ_ASSERT_OK(tz_adam_params_for_step(&p, 3));
  tz_compute *cm = cpu(3);
  TZ_ASSERT_OK(tz_compute_adam(cm, &p, a, a + n, a + 2 * n, a + 3 * n, TZ_F32, ca, TZ_BF16, n));
  TZ_ASSERT_OK(tz_compute_sync(cm));
  struct tz_adam_cpu_opts o = {.threads = tz_compute_threads(cm)};
  TZ_ASSERT_OK(tz_adam_cpu(&p, b, b + n, b + 2 * n, b + 3 * n, TZ_F32, cb, TZ_BF16, n, &o));
  assert_memory_equal(a, b, sizeof(float) * 4 * n);
  assert_memory_equal(ca, cb, 2 * n);
  p.beta1 = 1.5f;
  assert_int_equal(tz_compute_adam(cm, &p, a, a + n, a + 2 * n, a + 3 * n, TZ_F32, NULL, TZ_F32, n),
                   TZ_EINVAL);
  tz_compute_destroy(cm);
  struct tz_compute_device d;
  assert_int_equal(tz_compute_device_info("cpu", 0, &d), TZ_ENOTSUP);
  assert_int_equal(d.numa_node, -1);
  uint64_t fr = 1, tot = 1;
  assert_int_equal(tz_compute_device_memory("cpu", 0, &fr, &tot), TZ_ENOTSUP);
  assert_true(fr == 0 && tot == 0);
  assert_int_equal(tz_compute_device_info("tpu", 0, &d), TZ_ENOENT);
  free(a);
  free(b);
  free(ca);
  free(cb);
}

/* The experts' ops against plain double loops: routing (softmax, top-k, the weights with and
 * without their normalisation, the grouping by expert and the load-balancing statistics), the
 * gather, the weighted combine with its residual, and the backward ops: combine_bwd and scatter
 * by their definitions, route_bwd against central differences of the routing weights in double
 * (the choice of experts held), on every thread count the same bits. */
static void moe_case(int N, int E, int k, int norm, int threads, float *keep_dl) {
  tz_compute *cm = cpu(threads);
  enum { C = 5 };
  int M = N * k;
  float *lg = malloc(sizeof(float) * N * E), *probs = malloc(sizeof(float) * N * E);
  int32_t *idx = malloc(sizeof(int32_t) * M), *rows = malloc(sizeof(int32_t) * M);
  int32_t *slot = malloc(sizeof(int32_t) * M), off[TZ_MOE_MAX_EXPERTS + 1];
  float *w = malloc(sizeof(float) * M), stats[2 * 64] = {0};
  uint64_t st = 77 + (uint64_t)N * E * k;
  for (int i = 0; i < N * E; i++)
    lg[i] = 4.0f * (urand(&st) - 0.5f);
  struct tz_moe_route r = {probs, idx, w, off, rows, slot};
  TZ_ASSERT_OK(tz_compute_moe_route(cm, &r, stats, lg, N, E, k, norm));
  TZ_ASSERT_OK(tz_compute_moe_route(cm, &r, stats, lg, N, E, k, norm)); /* stats accumulate */
  double cnt[64] = {0}, psum[64] = {0};
  for (int n = 0; n < N; n++) {
    double m = -1e300, z = 0.0, p[64];
    for (int e = 0; e < E; e++)
      m = fmax(m, lg[n * E + e]);
    for (int e = 0; e < E; e++)
      z += p[e] = exp((double)lg[n * E + e] - m);
    double s = 0.0;
    for (int e = 0; e < E; e++) {
      p[e] /= z;
      psum[e] += p[e];
      assert_true(fabs(probs[n * E + e] - p[e]) < 1e-6);
    }
    for (int j = 0; j < k; j++) { /* the j-th largest, none larger left out */
      int e = idx[n * k + j];
      assert_true(e >= 0 && e < E);
      for (int i = 0; i < j; i++)
        assert_true(idx[n * k + i] != e && p[idx[n * k + i]] >= p[e]);
      for (int f = 0; f < E; f++) {
        int chosen = 0;
        for (int i = 0; i < k; i++)
          chosen |= idx[n * k + i] == f;
        assert_true(chosen || p[f] <= p[e]);
      }
      s += p[e];
      cnt[e] += 1.0;
    }
    for (int j = 0; j < k; j++)
      assert_true(fabs(w[n * k + j] - p[idx[n * k + j]] / (norm ? s : 1.0)) < 1e-6);
  }
  assert_int_equal(off[0], 0);
  assert_int_equal(off[E], M);
  for (int e = 0; e < E; e++) {
    assert_int_equal(off[e + 1] - off[e], (int)cnt[e]);
    assert_true(fabs(stats[e] - 2.0 * cnt[e]) < 1e-6);
    assert_true(fabs(stats[E + e] - 2.0 * psum[e]) < 1e-5);
    for (int q = off[e]; q < off[e + 1]; q++) /* the expert's rows, in token order */
      assert_true(q == off[e] || rows[q] > rows[q - 1]);
  }
  for (int a = 0; a < M; a++) { /* slot and rows agree */
    assert_int_equal(rows[slot[a]], a / k);
    int e = 0;
    while (off[e + 1] <= slot[a])
      e++;
    assert_int_equal(e, idx[a]);
  }
  /* gather, combine (with a residual), combine_bwd and scatter */
  float *x = malloc(sizeof(float) * N * C), *xs = malloc(sizeof(float) * M * C);
  float *y = malloc(sizeof(float) * M * C), *out = malloc(sizeof(float) * N * C);
  float *g = malloc(sizeof(float) * N * C), *dy = malloc(sizeof(float) * M * C);
  float *dw = malloc(sizeof(float) * M), *dx = malloc(sizeof(float) * N * C);
  for (int i = 0; i < N * C; i++) {
    x[i] = urand(&st) - 0.5f;
    g[i] = urand(&st) - 0.5f;
  }
  for (int i = 0; i < M * C; i++)
    y[i] = urand(&st) - 0.5f;
  TZ_ASSERT_OK(tz_compute_moe_gather(cm, xs, x, rows, M, C));
  TZ_ASSERT_OK(tz_compute_moe_combine(cm, out, x, y, w, slot, N, k, C));
  TZ_ASSERT_OK(tz_compute_moe_combine_bwd(cm, dy, dw, g, y, w, slot, N, k, C));
  TZ_ASSERT_OK(tz_compute_moe_scatter(cm, dx, y, slot, N, k, C));
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      double o = x[n * C + c], sc = 0.0;
      for (int j = 0; j < k; j++) {
        int q = slot[n * k + j];
        assert_true(xs[q * C + c] == x[n * C + c]);
        o += (double)w[n * k + j] * y[q * C + c];
        sc += y[q * C + c];
        assert_true(dy[q * C + c] == w[n * k + j] * g[n * C + c]);
      }
      assert_true(fabs(out[n * C + c] - o) < 1e-6);
      assert_true(fabs(dx[n * C + c] - sc) < 1e-6);
    }
  for (int a = 0; a < M; a++) {
    double d = 0.0;
    for (int c = 0; c < C; c++)
      d += (double)g[(a / k) * C + c] * y[slot[a] * C + c];
    assert_true(fabs(dw[a] - d) < 1e-6);
  }
  /* route_bwd: f(l) = sum dw . w(l) + sum_n daux . p_n(l), the experts held */
  float daux[64], *dl = malloc(sizeof(float) * N * E);
  for (int e = 0; e < E; e++)
    daux[e] = urand(&st) - 0.5f;
  TZ_ASSERT_OK(tz_compute_moe_route_bwd(cm, dl, &r, dw, daux, N, E, k, norm));
  for (int n = 0; n < N; n++)
    for (int e = 0; e < E; e++) {
      double f[2];
      for (int sgn = 0; sgn < 2; sgn++) {
        double l[64], m = -1e300, z = 0.0, p[64], s = 0.0;
        for (int i = 0; i < E; i++)
          l[i] = lg[n * E + i] + (i == e ? (sgn ? -1e-5 : 1e-5) : 0.0);
        for (int i = 0; i < E; i++)
          m = fmax(m, l[i]);
        for (int i = 0; i < E; i++)
          z += p[i] = exp(l[i] - m);
        f[sgn] = 0.0;
        for (int i = 0; i < E; i++)
          f[sgn] += daux[i] * (p[i] /= z);
        for (int j = 0; j < k; j++)
          s += p[idx[n * k + j]];
        for (int j = 0; j < k; j++)
          f[sgn] += dw[n * k + j] * p[idx[n * k + j]] / (norm ? s : 1.0);
      }
      assert_true(fabs(dl[n * E + e] - (f[0] - f[1]) / 2e-5) < 1e-4);
    }
  if (keep_dl)
    memcpy(keep_dl, dl, sizeof(float) * N * E);
  free(lg), free(probs), free(idx), free(rows), free(slot), free(w), free(x), free(xs), free(y);
  free(out), free(g), free(dy), free(dw), free(dx), free(dl);
  tz_compute_destroy(cm);
}

static void test_moe_ops(void **state) {
  (void)state;
  float a[37 * 8], b[37 * 8];
  moe_case(37, 8, 2, 1, 1, a);
  moe_case(37, 8, 2, 1, 3, b);
  assert_memory_equal(a, b, sizeof a);
  moe_case(37, 8, 2, 0, 2, NULL);
  moe_case(11, 6, 1, 0, 2, NULL);
  moe_case(9, 4, 4, 1, 2, NULL);
  moe_case(0, 4, 2, 1, 2, NULL);
  /* bad sizes, by name */
  tz_compute *cm = cpu(1);
  struct tz_moe_route r = {0};
  assert_int_equal(tz_compute_moe_route(cm, &r, NULL, NULL, 4, 2, 3, 1), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "moe_route: bad sizes"));
  tz_compute_destroy(cm);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registry),
      cmocka_unit_test(test_bf16_rounding),
      cmocka_unit_test(test_f16_rounding),
      cmocka_unit_test(test_cast_op),
      cmocka_unit_test(test_sum_order),
      cmocka_unit_test(test_sumsq_segments),
      cmocka_unit_test(test_rmsnorm_bwd_residual),
      cmocka_unit_test(test_swiglu_bwd_rebuild),
      cmocka_unit_test(test_rope_inverse),
      cmocka_unit_test(test_rope_partial),
      cmocka_unit_test(test_bias_ops),
      cmocka_unit_test(test_xent),
      cmocka_unit_test(test_xent_sharp_large_vocabulary),
      cmocka_unit_test(test_gemma_elementwise),
      cmocka_unit_test(test_xent_ignore),
      cmocka_unit_test(test_adam_op),
      cmocka_unit_test(test_moe_ops),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
