/* What model.c and model_moe.c share (private to tz_trainer): element pointers into buffers of
 * a dtype, the linear layer's forward and backward as matmuls, and the mixture-of-experts MLP
 * that the layer's phases call. */
#ifndef TZ_TRAINER_MODEL_INTERNAL_H
#define TZ_TRAINER_MODEL_INTERNAL_H

#include "core/error.h"
#include "trainer/model/model.h"

/* Element pointer arithmetic on buffers of dtype dt. */
static inline void *at(const void *base, uint64_t elems, enum tz_dtype dt) {
  return (char *)base + elems * tz_dtype_size(dt);
}

/* The linear layer's products as calls (tz_compute_matmul's arguments), one mapping for the
 * single calls below and the experts' batches (tz_compute_matmul_many). */
static inline int matmul_run(tz_compute *cm, struct tz_matmul_call c) {
  return tz_compute_matmul(cm, c.trans_a, c.trans_b, c.M, c.N, c.K, c.alpha, c.A, c.lda, c.B, c.ldb,
                           c.beta, c.C, c.c_dt, c.ldc);
}

/* y (N, out) = x (N, in) W^T, W (out, in): the linear layer. */
static inline struct tz_matmul_call linear_fwd_call(tz_compute *cm, void *y, const void *x,
                                                    const void *W, int N, int in, int out) {
  return (struct tz_matmul_call){.trans_b = 1,
                                 .M = N,
                                 .N = out,
                                 .K = in,
                                 .alpha = 1.0f,
                                 .A = x,
                                 .lda = in,
                                 .B = W,
                                 .ldb = in,
                                 .C = y,
                                 .c_dt = tz_compute_dtype(cm),
                                 .ldc = out};
}
static inline int linear_fwd(tz_compute *cm, void *y, const void *x, const void *W, int N, int in,
                             int out) {
  return matmul_run(cm, linear_fwd_call(cm, y, x, W, N, in, out));
}

/* y (N, out) = x W^T + r: the linear layer with the residual r added in the same rounding. */
static inline int linear_res_fwd(tz_compute *cm, void *y, const void *x, const void *W,
                                 const void *r, int N, int in, int out) {
  return tz_compute_matmul_add(cm, 0, 1, N, out, in, 1.0f, x, in, W, in, r, y, tz_compute_dtype(cm),
                               out);
}

/* dW (out, in) += dy^T x */
static inline struct tz_matmul_call linear_bwd_dw_call(tz_compute *cm, void *dW, const void *dy,
                                                       const void *x, int N, int in, int out) {
  return (struct tz_matmul_call){.trans_a = 1,
                                 .M = out,
                                 .N = in,
                                 .K = N,
                                 .alpha = 1.0f,
                                 .A = dy,
                                 .lda = out,
                                 .B = x,
                                 .ldb = in,
                                 .beta = 1.0f,
                                 .C = dW,
                                 .c_dt = tz_compute_grad_dtype(cm),
                                 .ldc = in};
}
static inline int linear_bwd_dw(tz_compute *cm, void *dW, const void *dy, const void *x, int N,
                                int in, int out) {
  return matmul_run(cm, linear_bwd_dw_call(cm, dW, dy, x, N, in, out));
}

/* dx (N, in) = dy W (+= when accumulate) */
static inline struct tz_matmul_call linear_bwd_dx_call(tz_compute *cm, void *dx, int accumulate,
                                                       const void *dy, const void *W, int N, int in,
                                                       int out) {
  return (struct tz_matmul_call){.M = N,
                                 .N = in,
                                 .K = out,
                                 .alpha = 1.0f,
                                 .A = dy,
                                 .lda = out,
                                 .B = W,
                                 .ldb = in,
                                 .beta = accumulate ? 1.0f : 0.0f,
                                 .C = dx,
                                 .c_dt = tz_compute_dtype(cm),
                                 .ldc = in};
}
static inline int linear_bwd_dx(tz_compute *cm, void *dx, int accumulate, const void *dy,
                                const void *W, int N, int in, int out) {
  return matmul_run(cm, linear_bwd_dx_call(cm, dx, accumulate, dy, W, N, in, out));
}

/* dW (out, in) += dy^T x; dx (N, in) = dy W (+= when accumulate). */
static inline int linear_bwd(tz_compute *cm, void *dx, int accumulate, void *dW, const void *dy,
                             const void *x, const void *W, int N, int in, int out) {
  TZ_CHECK(linear_bwd_dw(cm, dW, dy, x, N, in, out));
  return linear_bwd_dx(cm, dx, accumulate, dy, W, N, in, out);
}

/* The experts' MLP on h2 (N, C) into x_out = x2 + its output (stats += the routing's statistics
 * unless NULL), and its backward given dx_out: grads += the router's and experts' gradients,
 * s->dh = the gradient at h2 (a is rebuilt by the SwiGLU's backward when a_rebuilt). With a
 * shared expert, its gated SwiGLU too. trainer/model/model_moe.c. */
int tz_model_moe_fwd(tz_compute *cm, const struct tz_model_config *cfg,
                     const struct tz_block_layout *l, const void *params, const void *h2,
                     const struct tz_layer_acts *a, void *x_out, int N, float *stats);
int tz_model_moe_bwd(tz_compute *cm, const struct tz_model_config *cfg,
                     const struct tz_block_layout *l, const void *params, void *grads,
                     const void *h2, const struct tz_layer_acts *a, void *a_rebuilt,
                     const void *dx_out, const struct tz_layer_scratch *s, int N);

#endif
