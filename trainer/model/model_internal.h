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

/* y (N, out) = x (N, in) W^T, W (out, in): the linear layer. */
static inline int linear_fwd(tz_compute *cm, void *y, const void *x, const void *W, int N, int in,
                             int out) {
  return tz_compute_matmul(cm, 0, 1, N, out, in, 1.0f, x, in, W, in, 0.0f, y, tz_compute_dtype(cm),
                           out);
}

/* y (N, out) = x W^T + r: the linear layer with the residual r added in the same rounding. */
static inline int linear_res_fwd(tz_compute *cm, void *y, const void *x, const void *W,
                                 const void *r, int N, int in, int out) {
  return tz_compute_matmul_add(cm, 0, 1, N, out, in, 1.0f, x, in, W, in, r, y, tz_compute_dtype(cm),
                               out);
}

/* dW (out, in) += dy^T x */
static inline int linear_bwd_dw(tz_compute *cm, void *dW, const void *dy, const void *x, int N,
                                int in, int out) {
  return tz_compute_matmul(cm, 1, 0, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW,
                           tz_compute_grad_dtype(cm), in);
}

/* dx (N, in) = dy W (+= when accumulate) */
static inline int linear_bwd_dx(tz_compute *cm, void *dx, int accumulate, const void *dy,
                                const void *W, int N, int in, int out) {
  return tz_compute_matmul(cm, 0, 0, N, in, out, 1.0f, dy, out, W, in, accumulate ? 1.0f : 0.0f, dx,
                           tz_compute_dtype(cm), in);
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
