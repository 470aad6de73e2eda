/* A compute instance that times another's operations (kernels/compute_timed.h). */
#include "kernels/compute_timed.h"

#include <stdlib.h>

#include "core/error.h"
#include "kernels/compute_impl.h"
#include "util/clock.h"

struct timed {
  tz_compute *inner;
  struct tz_compute_times *times;
};

#define IN tm->inner->ops
#define CTX tm->inner->ctx

static double timed_begin(struct timed *tm) {
  (void)tz_compute_sync(tm->inner);
  return tz_now_s();
}

static void timed_end(struct timed *tm, int op, double t0, double bytes, double flop) {
  (void)tz_compute_sync(tm->inner);
  tm->times->seconds[op] += tz_now_s() - t0;
  tm->times->calls[op]++;
  tm->times->bytes[op] += bytes;
  tm->times->flop[op] += flop;
}

/* The call, timed under op with the bytes and flop it must move and compute (compute_timed.h) */
#define TIMED_WORK(op, bytes, flop, call)                                                          \
  do {                                                                                             \
    double t0_ = timed_begin(tm);                                                                  \
    int rc_ = (call);                                                                              \
    timed_end(tm, (op), t0_, (bytes), (flop));                                                     \
    return rc_;                                                                                    \
  } while (0)
#define TIMED(op, call) TIMED_WORK(op, 0.0, 0.0, call)

/* element sizes of the storage and gradient dtypes */
#define ES ((double)tz_dtype_size(tm->inner->dtype))
#define GS ((double)tz_dtype_size(tm->inner->grad_dtype))

static void s_destroy(void *ctx) { free(ctx); }
static int s_sync(void *ctx) {
  struct timed *tm = ctx;
  return IN->sync(CTX);
}
static void *s_stream(void *ctx) {
  struct timed *tm = ctx;
  return IN->stream ? IN->stream(CTX) : NULL;
}
static int s_alloc(void *ctx, size_t b, void **o) {
  struct timed *tm = ctx;
  return IN->alloc(CTX, b, o);
}
static void s_free(void *ctx, void *p) {
  struct timed *tm = ctx;
  IN->free(CTX, p);
}
static int s_copy_in(void *ctx, void *d, const void *s, size_t b) {
  struct timed *tm = ctx;
  return IN->copy_in(CTX, d, s, b);
}
static int s_copy_out(void *ctx, void *d, const void *s, size_t b) {
  struct timed *tm = ctx;
  return IN->copy_out(CTX, d, s, b);
}
static int s_copy(void *ctx, void *d, const void *s, size_t b) {
  struct timed *tm = ctx;
  TIMED_WORK(TZ_OP_COPY, 2.0 * (double)b, 0.0, IN->copy(CTX, d, s, b));
}
static int s_zero(void *ctx, void *d, size_t b) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->zero(CTX, d, b));
}
static int s_fill(void *ctx, enum tz_dtype dt, void *x, float v, size_t n) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->fill(CTX, dt, x, v, n));
}
static int s_scale(void *ctx, enum tz_dtype dt, void *x, float a, size_t n) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->scale(CTX, dt, x, a, n));
}
static int s_axpy(void *ctx, enum tz_dtype dt, void *y, float a, const void *x, size_t n) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->axpy(CTX, dt, y, a, x, n));
}
static int s_add(void *ctx, enum tz_dtype dt, void *o, const void *a, const void *b, size_t n) {
  struct timed *tm = ctx;
  TIMED_WORK(TZ_OP_ADD, 3.0 * (double)n * (double)tz_dtype_size(dt), 0.0,
             IN->add(CTX, dt, o, a, b, n));
}
static int s_cast(void *ctx, void *d, enum tz_dtype dd, const void *s, enum tz_dtype sd, size_t n) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->cast(CTX, d, dd, s, sd, n));
}
static int s_sum(void *ctx, float *o, enum tz_dtype dt, const void *x, size_t n, int sq, int acc) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->sum(CTX, o, dt, x, n, sq, acc));
}
static int s_sumsq_segments(void *ctx, float *o, enum tz_dtype dt, const void *x, size_t len,
                            size_t n_seg) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->sumsq_segments(CTX, o, dt, x, len, n_seg));
}
static int s_matmul(void *ctx, int ta, int tb, int M, int N, int K, float alpha, const void *A,
                    int lda, const void *B, int ldb, float beta, const void *R, void *C,
                    enum tz_dtype c_dt, int ldc) {
  struct timed *tm = ctx;
  int op = ta ? TZ_OP_MATMUL_TN : tb ? TZ_OP_MATMUL_NT : TZ_OP_MATMUL_NN;
  double mn = (double)M * N, cs = (double)tz_dtype_size(c_dt);
  double bytes = ((double)M * K + (double)K * N) * ES + mn * cs * (beta != 0.0f ? 2.0 : 1.0);
  TIMED_WORK(op, bytes, 2.0 * mn * K,
             IN->matmul(CTX, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, R, C, c_dt, ldc));
}
static int s_emb_fwd(void *ctx, void *o, const int32_t *t, const void *w, int N, int C, int V) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->embedding_fwd(CTX, o, t, w, N, C, V));
}
static int s_emb_bwd(void *ctx, void *dw, const void *d, const int32_t *t, int N, int C, int V) {
  struct timed *tm = ctx;
  TIMED(TZ_OP_OTHER, IN->embedding_bwd(CTX, dw, d, t, N, C, V));
}
/* The timed table says it has the variants (variants 1) for whichever backend it wraps; one
 * that does not is refused here as tz_compute_* would refuse it. */
static int inner_variants(const struct timed *tm, int asked, const char *op) {
  if (asked && !IN->variants)
    return tz_err_set(TZ_ENOTSUP, "compute %s: %s's variants are not in this backend",
                      tm->inner->backend, op);
  return 0;
}
static int s_rms_fwd(void *ctx, void *o, float *r, const void *x, const void *w, int N, int C,
                     float eps, float off) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_variants(tm, off != 0.0f, "rmsnorm_fwd"));
  double nc = (double)N * C;
  TIMED_WORK(TZ_OP_RMSNORM_FWD, (2.0 * nc + C) * ES + 4.0 * N, 0.0,
             IN->rmsnorm_fwd(CTX, o, r, x, w, N, C, eps, off));
}
static int s_rms_bwd(void *ctx, void *dx, const void *dres, void *dw, const void *dy, const void *x,
                     const void *w, const float *r, int N, int C, float off) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_variants(tm, off != 0.0f, "rmsnorm_bwd"));
  double nc = (double)N * C; /* dout, x read, dx written, dres read where there is one */
  double bytes = ((dres ? 4.0 : 3.0) * nc + C) * ES + 4.0 * N + 2.0 * C * GS;
  TIMED_WORK(TZ_OP_RMSNORM_BWD, bytes, 0.0,
             IN->rmsnorm_bwd(CTX, dx, dres, dw, dy, x, w, r, N, C, off));
}
/* The timed table says it takes a pos (docs 1) for whichever backend it wraps; one that does
 * not is refused here as tz_compute_* would refuse it. */
static int inner_docs(const struct timed *tm, const char *op, const int32_t *pos) {
  if (pos && !IN->docs)
    return tz_err_set(TZ_ENOTSUP,
                      "compute %s: packed documents (a pos per token) are not enabled in the %s "
                      "backend",
                      op, tm->inner->backend);
  return 0;
}
static int s_rope(void *ctx, void *x, int B, int T, int nh, int D, int R, const double *f, float ms,
                  int inv, const int32_t *pos) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_docs(tm, "rope", pos));
  TIMED_WORK(TZ_OP_ROPE, 2.0 * B * (double)T * nh * R * ES, 0.0,
             IN->rope(CTX, x, B, T, nh, D, R, f, ms, inv, pos));
}
static int s_bias_add(void *ctx, void *x, const void *b, int N, int n) {
  struct timed *tm = ctx;
  if (!IN->bias_add)
    return tz_err_set(TZ_ENOTSUP, "compute %s: no bias_add in this backend", tm->inner->backend);
  TIMED_WORK(TZ_OP_BIAS_ADD, (2.0 * N * n + n) * ES, 0.0, IN->bias_add(CTX, x, b, N, n));
}
static int s_bias_grad(void *ctx, void *db, const void *dy, int N, int n) {
  struct timed *tm = ctx;
  if (!IN->bias_grad)
    return tz_err_set(TZ_ENOTSUP, "compute %s: no bias_grad in this backend", tm->inner->backend);
  TIMED_WORK(TZ_OP_BIAS_GRAD, (double)N * n * ES + 2.0 * n * GS, 0.0,
             IN->bias_grad(CTX, db, dy, N, n));
}
static int s_attn_fwd(void *ctx, void *o, float *l, const void *q, const void *k, const void *v,
                      int B, int T, int H, int Hkv, int D, const int32_t *pos,
                      const struct tz_attn_opts *opt) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_docs(tm, "attention_fwd", pos));
  TZ_CHECK(inner_variants(tm, opt->scale != 0.0f || opt->softcap != 0.0f || opt->window != 0,
                          "attention_fwd"));
  double bth = (double)B * T * H, btk = (double)B * T * Hkv;
  double bytes = (2.0 * bth + 2.0 * btk) * D * ES + 4.0 * bth; /* q, k, v, out; lse */
  TIMED_WORK(TZ_OP_ATTENTION_FWD, bytes, 2.0 * bth * T * D,
             IN->attention_fwd(CTX, o, l, q, k, v, B, T, H, Hkv, D, pos, opt));
}
static int s_attn_bwd(void *ctx, void *dq, void *dk, void *dv, float *delta, const void *dout,
                      const void *q, const void *k, const void *v, const void *o, const float *l,
                      int B, int T, int H, int Hkv, int D, const int32_t *pos,
                      const struct tz_attn_opts *opt) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_docs(tm, "attention_bwd", pos));
  TZ_CHECK(inner_variants(tm, opt->scale != 0.0f || opt->softcap != 0.0f || opt->window != 0,
                          "attention_bwd"));
  double bth = (double)B * T * H, btk = (double)B * T * Hkv;
  /* dout, q, out, dq and k, v, dk, dv; lse read, delta written */
  double bytes = (4.0 * bth + 4.0 * btk) * D * ES + 8.0 * bth;
  TIMED_WORK(
      TZ_OP_ATTENTION_BWD, bytes, 2.5 * 2.0 * bth * T * D,
      IN->attention_bwd(CTX, dq, dk, dv, delta, dout, q, k, v, o, l, B, T, H, Hkv, D, pos, opt));
}
static int s_glu_fwd(void *ctx, enum tz_glu act, void *o, const void *g, const void *u, size_t n) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_variants(tm, act != TZ_GLU_SILU, "glu_fwd"));
  TIMED_WORK(TZ_OP_SWIGLU_FWD, 3.0 * (double)n * ES, 0.0, IN->glu_fwd(CTX, act, o, g, u, n));
}
static int s_glu_bwd(void *ctx, enum tz_glu act, void *dg, void *du, void *o, const void *d,
                     const void *g, const void *u, size_t n) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_variants(tm, act != TZ_GLU_SILU, "glu_bwd"));
  TIMED_WORK(TZ_OP_SWIGLU_BWD, (o ? 6.0 : 5.0) * (double)n * ES, 0.0,
             IN->glu_bwd(CTX, act, dg, du, o, d, g, u, n));
}
static int s_xent(void *ctx, float *l, void *dl, const void *lg, const int32_t *t, int N, int V,
                  float ds, float cap) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_variants(tm, cap != 0.0f, "xent"));
  TIMED(TZ_OP_OTHER, IN->xent(CTX, l, dl, lg, t, N, V, ds, cap));
}
static int s_softcap(void *ctx, void *lg, size_t n, float cap) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_variants(tm, 1, "softcap"));
  TIMED(TZ_OP_OTHER, IN->softcap(CTX, lg, n, cap));
}
static int s_adam(void *ctx, const struct tz_adam_params *p, float *master, float *m, float *v,
                  const void *grad, enum tz_dtype gdt, void *copy, enum tz_dtype cdt, size_t n) {
  struct timed *tm = ctx;
  if (!IN->adam)
    return tz_err_set(TZ_ENOTSUP, "compute %s: no Adam in this backend", tm->inner->backend);
  TIMED(TZ_OP_OTHER, IN->adam(CTX, p, master, m, v, grad, gdt, copy, cdt, n));
}

/* The experts' ops, timed as other work; refused as the wrapper refuses them when the inner
 * backend has none. */
static int inner_moe(struct timed *tm) {
  if (!IN->moe_route)
    return tz_err_set(TZ_ENOTSUP, "compute %s: the mixture-of-experts ops are not in this backend",
                      tm->inner->backend);
  return 0;
}
static int s_moe_route(void *ctx, const struct tz_moe_route *r, float *st, const void *lg, int N,
                       int E, int k, int norm) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_moe(tm));
  TIMED(TZ_OP_OTHER, IN->moe_route(CTX, r, st, lg, N, E, k, norm));
}
static int s_moe_route_bwd(void *ctx, void *dl, const struct tz_moe_route *r, const float *dw,
                           const float *daux, int N, int E, int k, int norm) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_moe(tm));
  TIMED(TZ_OP_OTHER, IN->moe_route_bwd(CTX, dl, r, dw, daux, N, E, k, norm));
}
static int s_moe_gather(void *ctx, void *xs, const void *x, const int32_t *rows, int M, int C) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_moe(tm));
  TIMED(TZ_OP_OTHER, IN->moe_gather(CTX, xs, x, rows, M, C));
}
static int s_moe_scatter(void *ctx, void *dx, const void *dxs, const int32_t *slot, int N, int k,
                         int C) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_moe(tm));
  TIMED(TZ_OP_OTHER, IN->moe_scatter(CTX, dx, dxs, slot, N, k, C));
}
static int s_moe_combine(void *ctx, void *o, const void *res, const void *y, const float *w,
                         const int32_t *slot, int N, int k, int C) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_moe(tm));
  TIMED(TZ_OP_OTHER, IN->moe_combine(CTX, o, res, y, w, slot, N, k, C));
}
static int s_moe_combine_bwd(void *ctx, void *dy, float *dw, const void *d, const void *y,
                             const float *w, const int32_t *slot, int N, int k, int C) {
  struct timed *tm = ctx;
  TZ_CHECK(inner_moe(tm));
  TIMED(TZ_OP_OTHER, IN->moe_combine_bwd(CTX, dy, dw, d, y, w, slot, N, k, C));
}

static int s_moe_gate_fwd(void *ctx, void *o, const void *res, const void *y, const void *s, int N,
                          int C) {
  struct timed *tm = ctx;
  if (!IN->moe_gate_fwd)
    return tz_err_set(TZ_ENOTSUP, "compute %s: moe_gate_fwd is not in this backend",
                      tm->inner->backend);
  TIMED(TZ_OP_OTHER, IN->moe_gate_fwd(CTX, o, res, y, s, N, C));
}
static int s_moe_gate_bwd(void *ctx, void *dy, void *ds, const void *d, const void *y,
                          const void *s, int N, int C) {
  struct timed *tm = ctx;
  if (!IN->moe_gate_bwd)
    return tz_err_set(TZ_ENOTSUP, "compute %s: moe_gate_bwd is not in this backend",
                      tm->inner->backend);
  TIMED(TZ_OP_OTHER, IN->moe_gate_bwd(CTX, dy, ds, d, y, s, N, C));
}

static const struct tz_compute_ops timed_ops = {
    .destroy = s_destroy,
    .sync = s_sync,
    .stream = s_stream,
    .alloc = s_alloc,
    .free = s_free,
    .copy_in = s_copy_in,
    .copy_out = s_copy_out,
    .copy = s_copy,
    .zero = s_zero,
    .fill = s_fill,
    .scale = s_scale,
    .axpy = s_axpy,
    .add = s_add,
    .cast = s_cast,
    .sum = s_sum,
    .sumsq_segments = s_sumsq_segments,
    .matmul = s_matmul,
    .embedding_fwd = s_emb_fwd,
    .embedding_bwd = s_emb_bwd,
    .rmsnorm_fwd = s_rms_fwd,
    .rmsnorm_bwd = s_rms_bwd,
    .rope = s_rope,
    .bias_add = s_bias_add,
    .bias_grad = s_bias_grad,
    .attention_fwd = s_attn_fwd,
    .attention_bwd = s_attn_bwd,
    .docs = 1,
    .variants = 1,
    .glu_fwd = s_glu_fwd,
    .glu_bwd = s_glu_bwd,
    .xent = s_xent,
    .softcap = s_softcap,
    .adam = s_adam,
    .moe_route = s_moe_route,
    .moe_route_bwd = s_moe_route_bwd,
    .moe_gather = s_moe_gather,
    .moe_scatter = s_moe_scatter,
    .moe_combine = s_moe_combine,
    .moe_combine_bwd = s_moe_combine_bwd,
    .moe_gate_fwd = s_moe_gate_fwd,
    .moe_gate_bwd = s_moe_gate_bwd,
};

int tz_compute_timed_create(tz_compute *inner, struct tz_compute_times *times, tz_compute **out) {
  *out = NULL;
  struct timed *tm = malloc(sizeof *tm);
  tz_compute *cm = malloc(sizeof *cm);
  if (!tm || !cm) {
    free(tm);
    free(cm);
    return tz_err_set(TZ_ENOMEM, "compute %s: out of memory for a timed instance", inner->backend);
  }
  *tm = (struct timed){inner, times};
  *cm = *inner;
  cm->ops = &timed_ops;
  cm->ctx = tm;
  *out = cm;
  return 0;
}
