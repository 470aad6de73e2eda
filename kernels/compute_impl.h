/* For compute backends only: the ops table behind tz_compute (kernels/compute.h) and the backend
 * descriptors the registry (registry/compute.c) lists. A backend fills one `static const struct
 * tz_compute_ops` with designated initializers and exports one `struct tz_compute_backend`.
 * Every entry has the meaning, arguments and errors of the public function of the same name in
 * compute.h; the wrapper has already checked the arguments it can (sizes, NULL pointers, dtypes
 * against the instance) before it calls the entry. */
#ifndef TZ_KERNELS_COMPUTE_IMPL_H
#define TZ_KERNELS_COMPUTE_IMPL_H

#include "kernels/compute.h"

/* The most settings one compute backend has (a bound for parsing them on the stack). */
#define TZ_COMPUTE_MAX_SETTINGS 8

#ifdef __cplusplus
extern "C" {
#endif

struct tz_compute_ops {
  void (*destroy)(void *ctx);
  int (*sync)(void *ctx);
  void *(*stream)(void *ctx); /* optional: NULL means the backend has no native stream */

  int (*alloc)(void *ctx, size_t bytes, void **out);
  void (*free)(void *ctx, void *p);
  int (*copy_in)(void *ctx, void *dst, const void *host_src, size_t bytes);
  int (*copy_out)(void *ctx, void *host_dst, const void *src, size_t bytes);
  int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
  int (*zero)(void *ctx, void *dst, size_t bytes);

  int (*fill)(void *ctx, enum tz_dtype dt, void *x, float value, size_t n);
  int (*scale)(void *ctx, enum tz_dtype dt, void *x, float alpha, size_t n);
  int (*axpy)(void *ctx, enum tz_dtype dt, void *y, float alpha, const void *x, size_t n);
  int (*add)(void *ctx, enum tz_dtype dt, void *out, const void *a, const void *b, size_t n);
  int (*cast)(void *ctx, void *dst, enum tz_dtype dst_dt, const void *src, enum tz_dtype src_dt,
              size_t n);
  /* square: 0 for tz_compute_sum, 1 for tz_compute_sumsq */
  int (*sum)(void *ctx, float *out, enum tz_dtype dt, const void *x, size_t n, int square,
             int accumulate);
  /* seg_len may be 0; n_seg >= 1, and n_seg * seg_len elements fit in size_t bytes */
  int (*sumsq_segments)(void *ctx, float *out, enum tz_dtype dt, const void *x, size_t seg_len,
                        size_t n_seg);

  /* C = alpha op(A) op(B) + beta R: R is C for tz_compute_matmul, the residual for
   * tz_compute_matmul_add (beta 1); R is not read when beta == 0. */
  int (*matmul)(void *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha,
                const void *A, int lda, const void *B, int ldb, float beta, const void *R, void *C,
                enum tz_dtype c_dt, int ldc);
  /* optional: NULL means the wrapper runs the calls through matmul one after the other. The
   * calls are checked, none with M or N 0, n >= 1. */
  int (*matmul_many)(void *ctx, int n, const struct tz_matmul_call *calls);

  int (*embedding_fwd)(void *ctx, void *out, const int32_t *tokens, const void *wte, int N, int C,
                       int V);
  int (*embedding_bwd)(void *ctx, void *dwte, const void *dout, const int32_t *tokens, int N, int C,
                       int V);
  /* w_offset, attention's opt (never NULL here), glu's act and xent's softcap are their defaults
   * (0, all zero, TZ_GLU_SILU, 0) unless the backend has variants (below) */
  int (*rmsnorm_fwd)(void *ctx, void *out, float *rstd, const void *x, const void *w, int N, int C,
                     float eps, float w_offset);
  int (*rmsnorm_bwd)(void *ctx, void *dx, const void *dres, void *dw, const void *dout,
                     const void *x, const void *w, const float *rstd, int N, int C, float w_offset);
  /* R: the rotated dims (even, <= D; below D only with variants); inv_freq: R/2 host doubles,
   * tz_rope_inv_freq's (borrowed for the call: a backend that keeps a table keeps its own copy);
   * mscale: cos and sin times it (1: none; another only with variants); inverse: 0 forward
   * rotation, 1 its transpose (backward) */
  int (*rope)(void *ctx, void *x, int B, int T, int nh, int D, int R, const double *inv_freq,
              float mscale, int inverse, const int32_t *pos);
  int (*bias_add)(void *ctx, void *x, const void *b, int N, int n);
  int (*bias_grad)(void *ctx, void *db, const void *dy, int N, int n);
  int (*attention_fwd)(void *ctx, void *out, float *lse, const void *q, const void *k,
                       const void *v, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                       const struct tz_attn_opts *opt);
  int (*attention_bwd)(void *ctx, void *dq, void *dk, void *dv, float *delta, const void *dout,
                       const void *q, const void *k, const void *v, const void *out,
                       const float *lse, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                       const struct tz_attn_opts *opt);
  /* 1: rope and attention take a non-NULL pos and xent takes TZ_TARGET_IGNORE (compute.h,
   * "Packed documents"); 0: the wrapper refuses a pos by name before any entry is called. */
  int docs;
  /* 1: the families' variants (Gemma's): rmsnorm's w_offset, attention's struct tz_attn_opts, glu's
   * TZ_GLU_GELU_TANH, xent's softcap and softcap; 0: the wrapper refuses them by name before any
   * entry is called (softcap may then be NULL). */
  int variants;
  int (*glu_fwd)(void *ctx, enum tz_glu act, void *out, const void *g, const void *u, size_t n);
  int (*glu_bwd)(void *ctx, enum tz_glu act, void *dg, void *du, void *out, const void *dout,
                 const void *g, const void *u, size_t n);
  int (*xent)(void *ctx, float *losses, void *dlogits, const void *logits, const int32_t *targets,
              int N, int V, float dscale, float softcap);
  int (*softcap)(void *ctx, void *logits, size_t n, float softcap);
  /* optional: NULL means the backend has no Adam (tz_compute_adam is TZ_ENOTSUP). */
  int (*adam)(void *ctx, const struct tz_adam_params *p, float *master, float *m, float *v,
              const void *grad, enum tz_dtype grad_dtype, void *param_copy,
              enum tz_dtype copy_dtype, size_t n);
  /* optional, all or none: NULL means the backend has no mixture-of-experts ops (the wrapper
   * refuses them by name); norm is 0 or 1 */
  int (*moe_route)(void *ctx, const struct tz_moe_route *r, float *stats, const void *logits, int N,
                   int E, int k, int norm);
  int (*moe_route_bwd)(void *ctx, void *dlogits, const struct tz_moe_route *r, const float *dw,
                       const float *daux, int N, int E, int k, int norm);
  int (*moe_gather)(void *ctx, void *xs, const void *x, const int32_t *rows, int M, int C);
  int (*moe_scatter)(void *ctx, void *dx, const void *dxs, const int32_t *slot, int N, int k,
                     int C);
  int (*moe_combine)(void *ctx, void *out, const void *res, const void *y, const float *w,
                     const int32_t *slot, int N, int k, int C);
  int (*moe_combine_bwd)(void *ctx, void *dy, float *dw, const void *dout, const void *y,
                         const float *w, const int32_t *slot, int N, int k, int C);
  /* optional, both or neither (with the ones above): the shared expert's gate */
  int (*moe_gate_fwd)(void *ctx, void *out, const void *res, const void *y, const void *s, int N,
                      int C);
  int (*moe_gate_bwd)(void *ctx, void *dy, void *ds, const void *dout, const void *y, const void *s,
                      int N, int C);
};

struct tz_compute {
  const struct tz_compute_ops *ops;
  void *ctx;
  const char *backend;      /* the descriptor's name */
  enum tz_dtype dtype;      /* S */
  enum tz_dtype grad_dtype; /* G */
  int n_threads;
};

/* One per backend. create() receives parameters with defaults already filled in (dtype and
 * grad_dtype valid enum values, n_threads >= 1 for cpu) and p->settings parsed against the
 * backend's table into settings[n_settings] (core/settings.h: an enum's index, a boolean, a
 * size), and fills the instance's ops, ctx and n_threads; the registry sets the rest. It returns
 * TZ_ENOTSUP for a dtype it lacks. */
struct tz_compute_backend {
  const char *name;
  int (*probe)(char *why, size_t why_len);
  int (*create)(const struct tz_compute_params *p, const int64_t *settings, tz_compute *cm);
  /* optional, both or neither: NULL means the backend has no devices (TZ_ENOTSUP). device_info
   * receives *out with the defaults of compute.h already set; device is >= -1. */
  int (*device_info)(int device, struct tz_compute_device *out);
  int (*device_memory)(int device, uint64_t *free_bytes, uint64_t *total_bytes);
  /* optional: NULL with n_settings 0 means the backend takes no settings (any is refused). The
   * backend's create parses tz_compute_params.settings against these itself. */
  const struct tz_setting *settings;
  int n_settings;
  /* optional: whether an instance made with these parsed settings has the families' variants
   * (its ops' variants); NULL: the ops' variants are the same for every instance, and this is
   * 1 exactly when variants_always is */
  int (*variants)(const int64_t *settings);
  int variants_always;
  /* 1: every instance has the mixture-of-experts ops, 2: their shared expert's gate too
   * (tz_compute_moe) */
  int moe;
};

/* Creates an instance of backend b (tz_compute_create's checks and errors, the backend's probe
 * aside): the registry's tz_compute_create finds b by name and probes it first. */
int tz_compute_create_from(const struct tz_compute_backend *b, const struct tz_compute_params *p,
                           tz_compute **out);

/* kernels/cpu/compute.c and kernels/cuda/compute.cu; the registry (registry/compute.c) lists
 * cuda only with CUDA. */
extern const struct tz_compute_backend tz_compute_backend_cpu;
extern const struct tz_compute_backend tz_compute_backend_cuda;

#ifdef __cplusplus
}
#endif

#endif
