/* The public wrappers: argument checks live here once, so backends see only calls that make
 * sense. The registry (registry/compute.c) lists the backends. */
#include "kernels/compute.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/settings.h"
#include "kernels/compute_impl.h"

int tz_dtype_parse(const char *s, enum tz_dtype *out) {
  static const struct {
    const char *name;
    enum tz_dtype dt;
  } names[] = {{"f32", TZ_F32},       {"fp32", TZ_F32}, {"float32", TZ_F32}, {"bf16", TZ_BF16},
               {"bfloat16", TZ_BF16}, {"f16", TZ_F16},  {"fp16", TZ_F16},    {"float16", TZ_F16}};
  for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++) {
    if (strcasecmp(s, names[i].name) == 0) {
      *out = names[i].dt;
      return 0;
    }
  }
  return tz_err_set(TZ_EINVAL, "dtype: unknown '%s' (want f32, bf16 or f16)", s ? s : "(null)");
}

static int dtype_valid(enum tz_dtype dt) { return dt == TZ_F32 || dt == TZ_BF16 || dt == TZ_F16; }

void tz_compute_params_init(struct tz_compute_params *p) {
  memset(p, 0, sizeof *p);
  p->dtype = TZ_F32;
  p->grad_dtype = TZ_F32;
}

int tz_compute_create_from(const struct tz_compute_backend *b, const struct tz_compute_params *p,
                           tz_compute **out) {
  *out = NULL;
  const char *backend = b->name;
  struct tz_compute_params q;
  tz_compute_params_init(&q);
  if (p)
    q = *p;
  if (!dtype_valid(q.dtype) || !dtype_valid(q.grad_dtype))
    return tz_err_set(TZ_EINVAL, "compute %s: invalid dtype %d or grad_dtype %d", backend,
                      (int)q.dtype, (int)q.grad_dtype);
  if (q.n_threads < 0)
    return tz_err_set(TZ_EINVAL, "compute %s: n_threads %d < 0", backend, q.n_threads);
  char who[64];
  snprintf(who, sizeof who, "compute %s", backend);
  int64_t settings[TZ_COMPUTE_MAX_SETTINGS];
  if (b->n_settings > TZ_COMPUTE_MAX_SETTINGS)
    return tz_err_set(TZ_EINVAL, "%s: %d settings, more than %d", who, b->n_settings,
                      TZ_COMPUTE_MAX_SETTINGS);
  TZ_CHECK(tz_settings_parse(who, b->settings, b->n_settings, q.settings, settings));
  tz_compute *cm = calloc(1, sizeof *cm);
  if (!cm)
    return tz_err_set(TZ_ENOMEM, "compute %s: out of memory", backend);
  cm->backend = b->name;
  cm->dtype = q.dtype;
  cm->grad_dtype = q.grad_dtype;
  cm->n_threads = 1;
  int rc = b->create(&q, settings, cm);
  if (rc < 0) {
    free(cm);
    return rc;
  }
  *out = cm;
  return 0;
}

void tz_compute_destroy(tz_compute *cm) {
  if (!cm)
    return;
  cm->ops->destroy(cm->ctx);
  free(cm);
}

const char *tz_compute_backend(const tz_compute *cm) { return cm->backend; }
enum tz_dtype tz_compute_dtype(const tz_compute *cm) { return cm->dtype; }
enum tz_dtype tz_compute_grad_dtype(const tz_compute *cm) { return cm->grad_dtype; }
int tz_compute_threads(const tz_compute *cm) { return cm->n_threads; }

void *tz_compute_stream(tz_compute *cm) {
  return cm->ops->stream ? cm->ops->stream(cm->ctx) : NULL;
}

int tz_compute_sync(tz_compute *cm) { return cm->ops->sync(cm->ctx); }

/* ---- argument checks ---- */

#define NEED(cond, ...)                                                                            \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      return tz_err_set(TZ_EINVAL, __VA_ARGS__);                                                   \
  } while (0)

static int check_dt(const char *op, enum tz_dtype dt) {
  NEED(dtype_valid(dt), "compute %s: invalid dtype %d", op, (int)dt);
  return 0;
}

int tz_compute_alloc(tz_compute *cm, size_t bytes, void **out) {
  *out = NULL;
  return cm->ops->alloc(cm->ctx, bytes ? bytes : 1, out);
}

void tz_compute_free(tz_compute *cm, void *p) {
  if (p)
    cm->ops->free(cm->ctx, p);
}

int tz_compute_copy_in(tz_compute *cm, void *dst, const void *host_src, size_t bytes) {
  if (!bytes)
    return 0;
  NEED(dst && host_src, "compute copy_in: NULL pointer");
  return cm->ops->copy_in(cm->ctx, dst, host_src, bytes);
}

int tz_compute_copy_out(tz_compute *cm, void *host_dst, const void *src, size_t bytes) {
  if (!bytes)
    return 0;
  NEED(host_dst && src, "compute copy_out: NULL pointer");
  return cm->ops->copy_out(cm->ctx, host_dst, src, bytes);
}

int tz_compute_copy(tz_compute *cm, void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src)
    return 0;
  NEED(dst && src, "compute copy: NULL pointer");
  const char *d = dst, *s = src;
  NEED(d + bytes <= s || s + bytes <= d, "compute copy: overlapping ranges (%zu bytes)", bytes);
  return cm->ops->copy(cm->ctx, dst, src, bytes);
}

int tz_compute_zero(tz_compute *cm, void *dst, size_t bytes) {
  if (!bytes)
    return 0;
  NEED(dst, "compute zero: NULL pointer");
  return cm->ops->zero(cm->ctx, dst, bytes);
}

int tz_compute_fill(tz_compute *cm, enum tz_dtype dt, void *x, float value, size_t n) {
  TZ_CHECK(check_dt("fill", dt));
  if (!n)
    return 0;
  NEED(x, "compute fill: NULL pointer");
  return cm->ops->fill(cm->ctx, dt, x, value, n);
}

int tz_compute_scale(tz_compute *cm, enum tz_dtype dt, void *x, float alpha, size_t n) {
  TZ_CHECK(check_dt("scale", dt));
  if (!n)
    return 0;
  NEED(x, "compute scale: NULL pointer");
  return cm->ops->scale(cm->ctx, dt, x, alpha, n);
}

int tz_compute_axpy(tz_compute *cm, enum tz_dtype dt, void *y, float alpha, const void *x,
                    size_t n) {
  TZ_CHECK(check_dt("axpy", dt));
  if (!n)
    return 0;
  NEED(x && y, "compute axpy: NULL pointer");
  return cm->ops->axpy(cm->ctx, dt, y, alpha, x, n);
}

int tz_compute_add(tz_compute *cm, enum tz_dtype dt, void *out, const void *a, const void *b,
                   size_t n) {
  TZ_CHECK(check_dt("add", dt));
  if (!n)
    return 0;
  NEED(out && a && b, "compute add: NULL pointer");
  return cm->ops->add(cm->ctx, dt, out, a, b, n);
}

int tz_compute_cast(tz_compute *cm, void *dst, enum tz_dtype dst_dt, const void *src,
                    enum tz_dtype src_dt, size_t n) {
  TZ_CHECK(check_dt("cast", dst_dt));
  TZ_CHECK(check_dt("cast", src_dt));
  if (!n)
    return 0;
  NEED(dst && src, "compute cast: NULL pointer");
  return cm->ops->cast(cm->ctx, dst, dst_dt, src, src_dt, n);
}

int tz_compute_sum(tz_compute *cm, float *out, enum tz_dtype dt, const void *x, size_t n,
                   int accumulate) {
  TZ_CHECK(check_dt("sum", dt));
  NEED(out && (x || !n), "compute sum: NULL pointer");
  return cm->ops->sum(cm->ctx, out, dt, x, n, 0, accumulate);
}

int tz_compute_sumsq(tz_compute *cm, float *out, enum tz_dtype dt, const void *x, size_t n,
                     int accumulate) {
  TZ_CHECK(check_dt("sumsq", dt));
  NEED(out && (x || !n), "compute sumsq: NULL pointer");
  return cm->ops->sum(cm->ctx, out, dt, x, n, 1, accumulate);
}

int tz_compute_sumsq_segments(tz_compute *cm, float *out, enum tz_dtype dt, const void *x,
                              size_t seg_len, size_t n_seg) {
  TZ_CHECK(check_dt("sumsq_segments", dt));
  if (!n_seg)
    return 0;
  NEED(out && (x || !seg_len), "compute sumsq_segments: NULL pointer");
  NEED(seg_len <= SIZE_MAX / tz_dtype_size(dt) / n_seg,
       "compute sumsq_segments: %zu segments of %zu elements overflow the address space", n_seg,
       seg_len);
  return cm->ops->sumsq_segments(cm->ctx, out, dt, x, seg_len, n_seg);
}

/* The checks tz_compute_matmul and tz_compute_matmul_add share; op names the caller. */
static int matmul_check(tz_compute *cm, const char *op, int trans_a, int trans_b, int M, int N,
                        int K, const void *A, int lda, const void *B, int ldb, const void *C,
                        enum tz_dtype c_dt, int ldc) {
  NEED(M >= 0 && N >= 0 && K >= 0, "compute %s: negative size M=%d N=%d K=%d", op, M, N, K);
  NEED(c_dt == cm->dtype || c_dt == TZ_F32,
       "compute %s: C dtype %s is neither the storage dtype %s nor f32", op, tz_dtype_name(c_dt),
       tz_dtype_name(cm->dtype));
  /* The stored A is (M,K), or (K,M) when transposed: its rows have K or M elements. */
  NEED(lda >= (trans_a ? M : K) && lda >= 1, "compute %s: lda %d too small", op, lda);
  NEED(ldb >= (trans_b ? K : N) && ldb >= 1, "compute %s: ldb %d too small", op, ldb);
  NEED(ldc >= N && ldc >= 1, "compute %s: ldc %d < N %d", op, ldc, N);
  NEED(!M || !N || (C && (K == 0 || (A && B))), "compute %s: NULL pointer", op);
  return 0;
}

int tz_compute_matmul(tz_compute *cm, int trans_a, int trans_b, int M, int N, int K, float alpha,
                      const void *A, int lda, const void *B, int ldb, float beta, void *C,
                      enum tz_dtype c_dt, int ldc) {
  TZ_CHECK(matmul_check(cm, "matmul", trans_a, trans_b, M, N, K, A, lda, B, ldb, C, c_dt, ldc));
  if (!M || !N)
    return 0;
  return cm->ops->matmul(cm->ctx, trans_a != 0, trans_b != 0, M, N, K, alpha, A, lda, B, ldb, beta,
                         C, C, c_dt, ldc);
}

int tz_compute_matmul_add(tz_compute *cm, int trans_a, int trans_b, int M, int N, int K,
                          float alpha, const void *A, int lda, const void *B, int ldb,
                          const void *R, void *C, enum tz_dtype c_dt, int ldc) {
  TZ_CHECK(matmul_check(cm, "matmul_add", trans_a, trans_b, M, N, K, A, lda, B, ldb, C, c_dt, ldc));
  if (!M || !N)
    return 0;
  NEED(R, "compute matmul_add: NULL residual");
  size_t span = ((size_t)(M - 1) * ldc + N) * tz_dtype_size(c_dt);
  const char *r = R, *c = C;
  NEED(r == c || r + span <= c || c + span <= r,
       "compute matmul_add: the residual overlaps C without being C");
  return cm->ops->matmul(cm->ctx, trans_a != 0, trans_b != 0, M, N, K, alpha, A, lda, B, ldb, 1.0f,
                         R, C, c_dt, ldc);
}

int tz_compute_matmul_many(tz_compute *cm, int n, const struct tz_matmul_call *calls) {
  NEED(n >= 0 && (n == 0 || calls), "compute matmul_many: %d calls at %p", n, (const void *)calls);
  int live = 0;
  for (int i = 0; i < n; i++) {
    const struct tz_matmul_call *c = &calls[i];
    char op[48];
    snprintf(op, sizeof op, "matmul_many (call %d of %d)", i, n);
    TZ_CHECK(matmul_check(cm, op, c->trans_a, c->trans_b, c->M, c->N, c->K, c->A, c->lda, c->B,
                          c->ldb, c->C, c->c_dt, c->ldc));
    live += c->M && c->N;
  }
  if (live == n && live > 1 && cm->ops->matmul_many)
    return cm->ops->matmul_many(cm->ctx, n, calls);
  for (int i = 0; i < n; i++) {
    const struct tz_matmul_call *c = &calls[i];
    if (c->M && c->N)
      TZ_CHECK(cm->ops->matmul(cm->ctx, c->trans_a != 0, c->trans_b != 0, c->M, c->N, c->K,
                               c->alpha, c->A, c->lda, c->B, c->ldb, c->beta, c->C, c->C, c->c_dt,
                               c->ldc));
  }
  return 0;
}

int tz_compute_embedding_fwd(tz_compute *cm, void *out, const int32_t *tokens, const void *wte,
                             int N, int C, int V) {
  NEED(N >= 0 && C > 0 && V > 0, "compute embedding_fwd: bad sizes N=%d C=%d V=%d", N, C, V);
  if (!N)
    return 0;
  NEED(out && tokens && wte, "compute embedding_fwd: NULL pointer");
  return cm->ops->embedding_fwd(cm->ctx, out, tokens, wte, N, C, V);
}

int tz_compute_embedding_bwd(tz_compute *cm, void *dwte, const void *dout, const int32_t *tokens,
                             int N, int C, int V) {
  NEED(N >= 0 && C > 0 && V > 0, "compute embedding_bwd: bad sizes N=%d C=%d V=%d", N, C, V);
  if (!N)
    return 0;
  NEED(dwte && dout && tokens, "compute embedding_bwd: NULL pointer");
  return cm->ops->embedding_bwd(cm->ctx, dwte, dout, tokens, N, C, V);
}

/* TZ_ENOTSUP naming the backend and the op when a variant is asked of a backend without them
 * (compute_impl.h, variants). */
static int need_variants(tz_compute *cm, int asked, const char *what) {
  if (asked && !cm->ops->variants)
    return tz_err_set(TZ_ENOTSUP,
                      "compute %s: %s is not in this backend (the Gemma families' math runs on "
                      "the cpu backend; docs/model.md)",
                      cm->backend, what);
  return 0;
}

int tz_compute_rmsnorm_fwd(tz_compute *cm, void *out, float *rstd, const void *x, const void *w,
                           int N, int C, float eps, float w_offset) {
  NEED(N >= 0 && C > 0, "compute rmsnorm_fwd: bad sizes N=%d C=%d", N, C);
  NEED(eps >= 0.0f, "compute rmsnorm_fwd: eps %g < 0", (double)eps);
  NEED(w_offset == 0.0f || w_offset == 1.0f, "compute rmsnorm_fwd: w_offset %g is not 0 or 1",
       (double)w_offset);
  TZ_CHECK(need_variants(cm, w_offset != 0.0f, "rmsnorm_fwd with a weight offset (1 + w)"));
  if (!N)
    return 0;
  NEED(out && rstd && x && w, "compute rmsnorm_fwd: NULL pointer");
  return cm->ops->rmsnorm_fwd(cm->ctx, out, rstd, x, w, N, C, eps, w_offset);
}

int tz_compute_rmsnorm_bwd(tz_compute *cm, void *dx, const void *dres, void *dw, const void *dout,
                           const void *x, const void *w, const float *rstd, int N, int C,
                           float w_offset) {
  NEED(N >= 0 && C > 0, "compute rmsnorm_bwd: bad sizes N=%d C=%d", N, C);
  NEED(w_offset == 0.0f || w_offset == 1.0f, "compute rmsnorm_bwd: w_offset %g is not 0 or 1",
       (double)w_offset);
  TZ_CHECK(need_variants(cm, w_offset != 0.0f, "rmsnorm_bwd with a weight offset (1 + w)"));
  if (!N)
    return 0;
  NEED(dx && dw && dout && x && w && rstd, "compute rmsnorm_bwd: NULL pointer");
  NEED(dx != dout && dx != x, "compute rmsnorm_bwd: dx aliases dout or x");
  return cm->ops->rmsnorm_bwd(cm->ctx, dx, dres, dw, dout, x, w, rstd, N, C, w_offset);
}

int tz_rope_check(const struct tz_rope *r) {
  NEED(r, "rope: NULL parameters");
  NEED(isfinite(r->theta) && r->theta > 0.0, "rope: theta %g must be positive", r->theta);
  if (r->type == TZ_ROPE_DEFAULT)
    return 0;
  if (r->type == TZ_ROPE_LINEAR) {
    NEED(isfinite(r->factor) && r->factor >= 1.0, "rope linear: factor %g must be at least 1",
         r->factor);
    return 0;
  }
  if (r->type == TZ_ROPE_LONGROPE) {
    NEED(r->ext_factors, "rope longrope: no factors");
    return 0;
  }
  if (r->type == TZ_ROPE_YARN) {
    NEED(isfinite(r->factor) && r->factor > 0.0, "rope yarn: factor %g must be positive",
         r->factor);
    NEED(r->original_max_pos > 0, "rope yarn: original_max_position_embeddings %d must be positive",
         r->original_max_pos);
    NEED(isfinite(r->beta_fast) && isfinite(r->beta_slow) && r->beta_fast > 0.0 &&
             r->beta_slow > 0.0,
         "rope yarn: beta_fast %g and beta_slow %g must be positive", r->beta_fast, r->beta_slow);
    return 0;
  }
  NEED(r->type == TZ_ROPE_LLAMA3,
       "rope: type %d is none of default (0), llama3 (1), linear (2), yarn (3), longrope (4)",
       (int)r->type);
  NEED(isfinite(r->factor) && r->factor >= 1.0, "rope llama3: factor %g must be at least 1",
       r->factor);
  NEED(isfinite(r->low_freq_factor) && isfinite(r->high_freq_factor) && r->low_freq_factor > 0.0 &&
           r->high_freq_factor > r->low_freq_factor,
       "rope llama3: low_freq_factor %g and high_freq_factor %g must satisfy 0 < low < high",
       r->low_freq_factor, r->high_freq_factor);
  NEED(r->original_max_pos > 0, "rope llama3: original_max_position_embeddings %d must be positive",
       r->original_max_pos);
  return 0;
}

int tz_rope_inv_freq(const struct tz_rope *r, int D, double *out) {
  TZ_CHECK(tz_rope_check(r));
  NEED(D > 0 && D % 2 == 0 && D <= TZ_ROPE_MAX_D, "rope: head dim %d must be even and at most %d",
       D, TZ_ROPE_MAX_D);
  NEED(r->rot >= 0 && r->rot % 2 == 0 && r->rot <= D,
       "rope: rotated dims %d must be even and at most the head dim %d", r->rot, D);
  if (r->rot)
    D = r->rot; /* the frequencies of the rotated dims (transformers: int(head_dim * factor)) */
  double lo = 0, hi = 0, orig = r->original_max_pos;
  const double pi = 3.14159265358979323846; /* torch.pi */
  if (r->type == TZ_ROPE_LLAMA3) {
    lo = orig / r->low_freq_factor;
    hi = orig / r->high_freq_factor;
  } else if (r->type == TZ_ROPE_YARN) { /* the ramp's dims */
    lo = (double)D * log(orig / (r->beta_fast * 2.0 * pi)) / (2.0 * log(r->theta));
    hi = (double)D * log(orig / (r->beta_slow * 2.0 * pi)) / (2.0 * log(r->theta));
    if (r->truncate) {
      lo = floor(lo);
      hi = ceil(hi);
    }
    lo = lo > 0 ? lo : 0;
    hi = hi < D - 1 ? hi : D - 1;
    if (lo == hi)
      hi += 0.001;
  }
  for (int i = 0; i < D / 2; i++) {
    double f = 1.0 / pow(r->theta, (double)(2 * i) / (double)D);
    if (r->type == TZ_ROPE_LLAMA3) {
      double w = 2.0 * pi / f;
      if (w > lo) {
        f = f / r->factor;
      } else if (w >= hi) {
        double s = (orig / w - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
        f = (1.0 - s) * f / r->factor + s * f;
      }
    } else if (r->type == TZ_ROPE_LINEAR) {
      f = f / r->factor;
    } else if (r->type == TZ_ROPE_LONGROPE) {
      NEED(r->ext_factors[i] > 0 && isfinite(r->ext_factors[i]),
           "rope longrope: factor %d is %g, not positive", i, r->ext_factors[i]);
      f = f / r->ext_factors[i];
    } else if (r->type == TZ_ROPE_YARN) {
      double ramp = ((double)i - lo) / (hi - lo);
      ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
      f = (f / r->factor) * ramp + f * (1.0 - ramp);
    }
    out[i] = f;
  }
  return 0;
}

static int check_rope(const char *op, void *x, int B, int T, int nh, int D, const struct tz_rope *r,
                      double *inv_freq) {
  NEED(B >= 0 && T >= 0 && nh > 0 && D > 0 && D % 2 == 0 && D <= TZ_ROPE_MAX_D,
       "compute %s: bad sizes B=%d T=%d nh=%d D=%d (D must be even, at most %d)", op, B, T, nh, D,
       TZ_ROPE_MAX_D);
  NEED(x || !B || !T, "compute %s: NULL pointer", op);
  return tz_rope_inv_freq(r, D, inv_freq);
}

/* The rotated dims of rope r at head dim D and its cos and sin factor; fewer dims than D, or a
 * factor other than 1, need the variants. */
static int rope_rot(tz_compute *cm, const char *op, const struct tz_rope *r, int D, int *R,
                    float *mscale) {
  NEED(isfinite(r->mscale) && r->mscale >= 0.0, "compute %s: mscale %g must not be negative", op,
       r->mscale);
  *R = r->rot ? r->rot : D;
  *mscale = r->mscale == 0.0 ? 1.0f : (float)r->mscale;
  if (*R == D && *mscale == 1.0f)
    return 0;
  char what[80];
  if (*R != D)
    snprintf(what, sizeof what, "%s of %d of %d dims (partial rotary)", op, *R, D);
  else
    snprintf(what, sizeof what, "%s with cos and sin scaled by %g", op, (double)*mscale);
  return need_variants(cm, 1, what);
}

/* A pos for a backend without packed documents is refused here, naming what asked for it. */
static int check_pos(const tz_compute *cm, const char *op, const int32_t *pos) {
  if (pos && !cm->ops->docs)
    return tz_err_set(TZ_ENOTSUP,
                      "compute %s: packed documents (a pos per token) are not enabled in the %s "
                      "backend",
                      op, cm->backend);
  return 0;
}

int tz_compute_rope_fwd(tz_compute *cm, void *x, int B, int T, int nh, int D,
                        const struct tz_rope *rope, const int32_t *pos) {
  double f[TZ_ROPE_MAX_D / 2];
  int R = 0;
  float ms = 1.0f;
  TZ_CHECK(check_rope("rope_fwd", x, B, T, nh, D, rope, f));
  TZ_CHECK(check_pos(cm, "rope_fwd", pos));
  TZ_CHECK(rope_rot(cm, "rope_fwd", rope, D, &R, &ms));
  if (!B || !T)
    return 0;
  return cm->ops->rope(cm->ctx, x, B, T, nh, D, R, f, ms, 0, pos);
}

int tz_compute_rope_bwd(tz_compute *cm, void *dx, int B, int T, int nh, int D,
                        const struct tz_rope *rope, const int32_t *pos) {
  double f[TZ_ROPE_MAX_D / 2];
  int R = 0;
  float ms = 1.0f;
  TZ_CHECK(check_rope("rope_bwd", dx, B, T, nh, D, rope, f));
  TZ_CHECK(check_pos(cm, "rope_bwd", pos));
  TZ_CHECK(rope_rot(cm, "rope_bwd", rope, D, &R, &ms));
  if (!B || !T)
    return 0;
  return cm->ops->rope(cm->ctx, dx, B, T, nh, D, R, f, ms, 1, pos);
}

int tz_compute_bias_add(tz_compute *cm, void *x, const void *b, int N, int n) {
  NEED(N >= 0 && n > 0, "compute bias_add: bad sizes N=%d n=%d", N, n);
  if (!N)
    return 0;
  NEED(x && b, "compute bias_add: NULL pointer");
  NEED(cm->ops->bias_add, "compute bias_add: the %s backend has no bias_add", cm->backend);
  return cm->ops->bias_add(cm->ctx, x, b, N, n);
}

int tz_compute_bias_grad(tz_compute *cm, void *db, const void *dy, int N, int n) {
  NEED(N >= 0 && n > 0, "compute bias_grad: bad sizes N=%d n=%d", N, n);
  if (!N)
    return 0;
  NEED(db && dy, "compute bias_grad: NULL pointer");
  NEED(cm->ops->bias_grad, "compute bias_grad: the %s backend has no bias_grad", cm->backend);
  return cm->ops->bias_grad(cm->ctx, db, dy, N, n);
}

static int check_attn(tz_compute *cm, const char *op, int B, int T, int H, int Hkv, int D,
                      const struct tz_attn_opts *opt) {
  NEED(B >= 0 && T >= 0 && H > 0 && Hkv > 0 && D > 0 && H % Hkv == 0,
       "compute %s: bad sizes B=%d T=%d H=%d Hkv=%d D=%d (H must be a multiple of Hkv)", op, B, T,
       H, Hkv, D);
  NEED(isfinite(opt->scale) && opt->scale >= 0.0f && isfinite(opt->softcap) &&
           opt->softcap >= 0.0f && opt->window >= 0,
       "compute %s: bad variant scale %g softcap %g window %d", op, (double)opt->scale,
       (double)opt->softcap, opt->window);
  if (cm->ops->variants || (opt->scale == 0.0f && opt->softcap == 0.0f && opt->window == 0))
    return 0;
  char what[64]; /* the message only where it is refused: attention is on every layer's path */
  snprintf(what, sizeof what, "%s with %s", op,
           opt->softcap > 0.0f ? "softcapping"
           : opt->window > 0   ? "a sliding window"
                               : "a scale other than 1/sqrt(D)");
  return need_variants(cm, 1, what);
}

int tz_compute_attention_fwd(tz_compute *cm, void *out, float *lse, const void *q, const void *k,
                             const void *v, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                             const struct tz_attn_opts *opt) {
  static const struct tz_attn_opts none;
  if (!opt)
    opt = &none;
  TZ_CHECK(check_attn(cm, "attention_fwd", B, T, H, Hkv, D, opt));
  TZ_CHECK(check_pos(cm, "attention_fwd", pos));
  if (!B || !T)
    return 0;
  NEED(out && lse && q && k && v, "compute attention_fwd: NULL pointer");
  return cm->ops->attention_fwd(cm->ctx, out, lse, q, k, v, B, T, H, Hkv, D, pos, opt);
}

int tz_compute_attention_bwd(tz_compute *cm, void *dq, void *dk, void *dv, float *delta,
                             const void *dout, const void *q, const void *k, const void *v,
                             const void *out, const float *lse, int B, int T, int H, int Hkv, int D,
                             const int32_t *pos, const struct tz_attn_opts *opt) {
  static const struct tz_attn_opts none;
  if (!opt)
    opt = &none;
  TZ_CHECK(check_attn(cm, "attention_bwd", B, T, H, Hkv, D, opt));
  TZ_CHECK(check_pos(cm, "attention_bwd", pos));
  if (!B || !T)
    return 0;
  NEED(dq && dk && dv && delta && dout && q && k && v && out && lse,
       "compute attention_bwd: NULL pointer");
  return cm->ops->attention_bwd(cm->ctx, dq, dk, dv, delta, dout, q, k, v, out, lse, B, T, H, Hkv,
                                D, pos, opt);
}

static int check_glu(tz_compute *cm, const char *op, enum tz_glu act) {
  NEED(act == TZ_GLU_SILU || act == TZ_GLU_GELU_TANH, "compute %s: unknown activation %d", op,
       (int)act);
  return need_variants(cm, act != TZ_GLU_SILU,
                       op[4] == 'f' ? "glu_fwd with gelu_pytorch_tanh"
                                    : "glu_bwd with gelu_pytorch_tanh");
}

int tz_compute_glu_fwd(tz_compute *cm, enum tz_glu act, void *out, const void *g, const void *u,
                       size_t n) {
  TZ_CHECK(check_glu(cm, "glu_fwd", act));
  if (!n)
    return 0;
  NEED(out && g && u, "compute glu_fwd: NULL pointer");
  return cm->ops->glu_fwd(cm->ctx, act, out, g, u, n);
}

int tz_compute_glu_bwd(tz_compute *cm, enum tz_glu act, void *dg, void *du, void *out,
                       const void *dout, const void *g, const void *u, size_t n) {
  TZ_CHECK(check_glu(cm, "glu_bwd", act));
  if (!n)
    return 0;
  NEED(dg && du && dout && g && u, "compute glu_bwd: NULL pointer");
  NEED(!out || (out != dg && out != du && out != dout && out != g && out != u),
       "compute glu_bwd: out aliases another tensor");
  return cm->ops->glu_bwd(cm->ctx, act, dg, du, out, dout, g, u, n);
}

int tz_compute_xent(tz_compute *cm, float *losses, void *dlogits, const void *logits,
                    const int32_t *targets, int N, int V, float dscale, float softcap) {
  NEED(N >= 0 && V > 0, "compute xent: bad sizes N=%d V=%d", N, V);
  NEED(isfinite(softcap) && softcap >= 0.0f, "compute xent: softcap %g", (double)softcap);
  TZ_CHECK(need_variants(cm, softcap != 0.0f, "xent with a logit softcap"));
  if (!N)
    return 0;
  NEED(losses && logits && targets, "compute xent: NULL pointer");
  return cm->ops->xent(cm->ctx, losses, dlogits, logits, targets, N, V, dscale, softcap);
}

int tz_compute_softcap(tz_compute *cm, void *logits, size_t n, float softcap) {
  NEED(isfinite(softcap) && softcap > 0.0f, "compute softcap: softcap %g", (double)softcap);
  TZ_CHECK(need_variants(cm, 1, "softcap"));
  if (!n)
    return 0;
  NEED(logits, "compute softcap: NULL pointer");
  return cm->ops->softcap(cm->ctx, logits, n, softcap);
}

/* ---- mixture of experts ---- */

/* TZ_ENOTSUP naming the backend and the op for a backend without the experts' ops. */
static int need_moe(tz_compute *cm, const char *op) {
  if (!cm->ops->moe_route)
    return tz_err_set(TZ_ENOTSUP,
                      "compute %s: %s is not in this backend (mixture-of-experts layers run on "
                      "the cpu backend; docs/model.md)",
                      cm->backend, op);
  return 0;
}

static int check_moe(tz_compute *cm, const char *op, int N, int E, int k, int C) {
  TZ_CHECK(need_moe(cm, op));
  NEED(N >= 0 && C > 0 && k >= 1 && E >= k && E <= TZ_MOE_MAX_EXPERTS &&
           (int64_t)N * k <= INT32_MAX,
       "compute %s: bad sizes N=%d E=%d k=%d C=%d (want 1 <= k <= E <= %d)", op, N, E, k, C,
       TZ_MOE_MAX_EXPERTS);
  return 0;
}

int tz_compute_moe_route(tz_compute *cm, const struct tz_moe_route *r, float *stats,
                         const void *logits, int N, int E, int k, int norm) {
  TZ_CHECK(check_moe(cm, "moe_route", N, E, k, 1));
  NEED(r && r->probs && r->idx && r->w && r->offsets && r->rows && r->slot && logits,
       "compute moe_route: NULL pointer");
  return cm->ops->moe_route(cm->ctx, r, stats, logits, N, E, k, norm != 0);
}

int tz_compute_moe_route_bwd(tz_compute *cm, void *dlogits, const struct tz_moe_route *r,
                             const float *dw, const float *daux, int N, int E, int k, int norm) {
  TZ_CHECK(check_moe(cm, "moe_route_bwd", N, E, k, 1));
  if (!N)
    return 0;
  NEED(dlogits && r && r->probs && r->idx && r->w && dw, "compute moe_route_bwd: NULL pointer");
  return cm->ops->moe_route_bwd(cm->ctx, dlogits, r, dw, daux, N, E, k, norm != 0);
}

int tz_compute_moe_gather(tz_compute *cm, void *xs, const void *x, const int32_t *rows, int M,
                          int C) {
  TZ_CHECK(check_moe(cm, "moe_gather", M, 1, 1, C));
  if (!M)
    return 0;
  NEED(xs && x && rows && xs != x, "compute moe_gather: NULL or aliased pointer");
  return cm->ops->moe_gather(cm->ctx, xs, x, rows, M, C);
}

int tz_compute_moe_scatter(tz_compute *cm, void *dx, const void *dxs, const int32_t *slot, int N,
                           int k, int C) {
  TZ_CHECK(check_moe(cm, "moe_scatter", N, k, k, C));
  if (!N)
    return 0;
  NEED(dx && dxs && slot && dx != dxs, "compute moe_scatter: NULL or aliased pointer");
  return cm->ops->moe_scatter(cm->ctx, dx, dxs, slot, N, k, C);
}

int tz_compute_moe_combine(tz_compute *cm, void *out, const void *res, const void *y,
                           const float *w, const int32_t *slot, int N, int k, int C) {
  TZ_CHECK(check_moe(cm, "moe_combine", N, k, k, C));
  if (!N)
    return 0;
  NEED(out && y && w && slot && out != y, "compute moe_combine: NULL or aliased pointer");
  return cm->ops->moe_combine(cm->ctx, out, res, y, w, slot, N, k, C);
}

int tz_compute_moe_combine_bwd(tz_compute *cm, void *dy, float *dw, const void *dout, const void *y,
                               const float *w, const int32_t *slot, int N, int k, int C) {
  TZ_CHECK(check_moe(cm, "moe_combine_bwd", N, k, k, C));
  if (!N)
    return 0;
  NEED(dy && dw && dout && y && w && slot && dy != y && dy != dout,
       "compute moe_combine_bwd: NULL or aliased pointer");
  return cm->ops->moe_combine_bwd(cm->ctx, dy, dw, dout, y, w, slot, N, k, C);
}

int tz_compute_moe_gate_fwd(tz_compute *cm, void *out, const void *res, const void *y,
                            const void *s, int N, int C) {
  TZ_CHECK(check_moe(cm, "moe_gate_fwd", N, 1, 1, C));
  if (!cm->ops->moe_gate_fwd)
    return tz_err_set(TZ_ENOTSUP,
                      "compute %s: moe_gate_fwd (the shared expert's gate) is not in this backend",
                      cm->backend);
  if (!N)
    return 0;
  NEED(out && res && y && s && out != y, "compute moe_gate_fwd: NULL or aliased pointer");
  return cm->ops->moe_gate_fwd(cm->ctx, out, res, y, s, N, C);
}

int tz_compute_moe_gate_bwd(tz_compute *cm, void *dy, void *ds, const void *dout, const void *y,
                            const void *s, int N, int C) {
  TZ_CHECK(check_moe(cm, "moe_gate_bwd", N, 1, 1, C));
  if (!cm->ops->moe_gate_bwd)
    return tz_err_set(TZ_ENOTSUP,
                      "compute %s: moe_gate_bwd (the shared expert's gate) is not in this backend",
                      cm->backend);
  if (!N)
    return 0;
  NEED(dy && ds && dout && y && s && dy != y && dy != dout,
       "compute moe_gate_bwd: NULL or aliased pointer");
  return cm->ops->moe_gate_bwd(cm->ctx, dy, ds, dout, y, s, N, C);
}

int tz_compute_adam(tz_compute *cm, const struct tz_adam_params *p, float *master, float *m,
                    float *v, const void *grad, enum tz_dtype grad_dtype, void *param_copy,
                    enum tz_dtype copy_dtype, size_t n) {
  if (!cm->ops->adam)
    return tz_err_set(TZ_ENOTSUP, "compute %s: no Adam in this backend", cm->backend);
  NEED(p, "compute adam: NULL parameters");
  return cm->ops->adam(cm->ctx, p, master, m, v, grad, grad_dtype, param_copy, copy_dtype, n);
}
