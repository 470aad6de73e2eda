/* The decoder's phases (model.h): the embedding, a transformer layer's forward and backward whole
 * or part by part, the head, and the FLOP they count, against kernels/compute.h only; the layout
 * they compute on is model_layout.c's. */
#include "trainer/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "trainer/model/model_internal.h"

/* The norms' weight offset for the kernels (kernels/compute.h): 1 for Gemma's (1 + w). */
static float norm_off(const struct tz_model_config *cfg) { return cfg->norm_offset ? 1.0f : 0.0f; }

/* ---- phases ---- */

int tz_model_check_batch(const struct tz_model_config *cfg, int B, int T) {
  if (B < 1 || T < 1 || T > cfg->max_seq)
    return tz_err_set(TZ_EINVAL, "model: batch %d x %d tokens (T must be in [1, max_seq %d])", B, T,
                      cfg->max_seq);
  return 0;
}

/* Gemma's embedding scale: sqrt(d_model) rounded to the storage dtype, as transformers makes its
 * normalizer a tensor of the hidden states' dtype. */
static float embedding_factor(tz_compute *cm, const struct tz_model_config *cfg) {
  float s = (float)sqrt((double)cfg->d_model);
  switch (tz_compute_dtype(cm)) {
  case TZ_BF16: return tz_bf16_to_f32(tz_f32_to_bf16(s));
  case TZ_F16: return tz_f16_to_f32(tz_f32_to_f16(s));
  default: return s;
  }
}

int tz_model_embed_fwd(tz_compute *cm, const struct tz_model_config *cfg, const void *embed,
                       const int32_t *tokens, void *x, int B, int T) {
  TZ_CHECK(tz_model_check_batch(cfg, B, T));
  TZ_CHECK(tz_compute_embedding_fwd(cm, x, tokens, embed, B * T, cfg->d_model, cfg->vocab));
  if (cfg->embed_scale)
    TZ_CHECK(tz_compute_scale(cm, tz_compute_dtype(cm), x, embedding_factor(cm, cfg),
                              (size_t)B * T * cfg->d_model));
  return 0;
}

int tz_model_embed_pad(const struct tz_model_config *cfg) {
  /* Every family's transformers model (llama, mistral, qwen2, qwen3, olmo2, phi3, gemma2,
   * gemma3, and the MoE ones) passes padding_idx = pad_token_id to its embedding. */
  return cfg->has_pad && cfg->pad_id >= 0 && cfg->pad_id < cfg->vocab ? cfg->pad_id : -1;
}

int tz_model_embed_bwd(tz_compute *cm, const struct tz_model_config *cfg, void *embed_grad,
                       const int32_t *tokens, const int32_t *host_tokens, void *dx, int B, int T) {
  TZ_CHECK(tz_model_check_batch(cfg, B, T));
  int pad = tz_model_embed_pad(cfg), N = B * T;
  if (pad >= 0) {
    if (!host_tokens)
      return tz_err_set(TZ_EINVAL, "model: embedding backward with pad_id %d needs the host tokens",
                        pad);
    /* The lookup's gradient never reaches the pad row: its positions' rows of dx zeroed, a call
     * for each run of consecutive pad tokens. */
    size_t row = (size_t)cfg->d_model * tz_dtype_size(tz_compute_dtype(cm));
    for (int n = 0; n < N;) {
      if (host_tokens[n] != pad) {
        n++;
        continue;
      }
      int e = n;
      while (e < N && host_tokens[e] == pad)
        e++;
      TZ_CHECK(tz_compute_zero(cm, (char *)dx + (size_t)n * row, (size_t)(e - n) * row));
      n = e;
    }
  }
  if (cfg->embed_scale)
    TZ_CHECK(tz_compute_scale(cm, tz_compute_dtype(cm), dx, embedding_factor(cm, cfg),
                              (size_t)B * T * cfg->d_model));
  return tz_compute_embedding_bwd(cm, embed_grad, dx, tokens, N, cfg->d_model, cfg->vocab);
}

/* The rows and width of a q or k norm: each head's D (TZ_QK_NORM_HEAD) or the whole projection
 * of nh heads (TZ_QK_NORM_ALL), over N tokens. */
static void qk_norm_shape(const struct tz_model_config *cfg, int N, int nh, int *rows, int *width) {
  int D = tz_model_head_dim(cfg), all = cfg->qk_norm == TZ_QK_NORM_ALL;
  *rows = all ? N : N * nh;
  *width = all ? nh * D : D;
}

/* The attention part of a layer's forward: a->h1 .. a->x2 from x_in (x2 = x_in + attention; with
 * TZ_NORM_POST, x_in + the norm of attention's output, through a->o). */
/* The attention's variants for layer `layer` of cfg (kernels/compute.h, struct tz_attn_opts). */
/* A window of T or more keys is every key: passed as none, so that a backend without windows
 * computes such a layer (Mistral's 4096 at shorter sequences). */
static struct tz_attn_opts attn_opts(const struct tz_model_config *cfg, int layer, int T) {
  int w = tz_model_layer_window(cfg, layer);
  return (struct tz_attn_opts){.scale = (float)tz_model_attn_scale(cfg),
                               .softcap = (float)cfg->attn_softcap,
                               .window = w < T ? w : 0};
}

/* The layout of the block holding a layer's part (TZ_PART_ATTN or TZ_PART_MLP): the layer's block,
 * or with experts the MLP's own. Every layer has the same. */
static int part_layout(const struct tz_model_config *cfg, unsigned part,
                       struct tz_block_layout *l) {
  int b = tz_model_block_of_layer(cfg, 0);
  if (part == TZ_PART_MLP)
    b += tz_model_layer_blocks(cfg) - 1;
  return tz_model_block_layout(cfg, b, l);
}

/* The weights of a layer's part: w holds its blocks in order (tz_model_layer_blocks). */
static void *part_w(const struct tz_model_config *cfg, void *const *w, unsigned part) {
  return w[part == TZ_PART_MLP ? tz_model_layer_blocks(cfg) - 1 : 0];
}

/* The attention part's forward; op 0 leaves out the attention op, whose output a->att and
 * a->lse already hold (TZ_PART_ATTN_OUT). */
static int attn_fwd(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                    const void *params, const void *x_in, const struct tz_layer_acts *a, int op,
                    int B, int T, const int32_t *pos) {
  struct tz_block_layout l = {0};
  TZ_CHECK(part_layout(cfg, TZ_PART_ATTN, &l));
  enum tz_dtype S = tz_compute_dtype(cm);
  int N = B * T, C = cfg->d_model, H = cfg->n_head, Hkv = cfg->n_kv_head;
  int D = tz_model_head_dim(cfg), HD = H * D, KD = Hkv * D;
  float eps = (float)cfg->norm_eps, off = norm_off(cfg);
  struct tz_rope rope;
  tz_model_layer_rope(cfg, layer, T, &rope);
  struct tz_attn_opts opt = attn_opts(cfg, layer, T);
#define P(i) at(params, l.t[i].offset, S)
  int pre = cfg->norm_place != TZ_NORM_POST, post = cfg->norm_place != TZ_NORM_PRE;
  const void *h1 = pre ? a->h1 : x_in;
  if (pre)
    TZ_CHECK(tz_compute_rmsnorm_fwd(cm, a->h1, a->rstd1, x_in, P(TZ_L_ATTN_NORM), N, C, eps, off));
  /* As transformers' Qwen2, Qwen3 and OLMo 2: the projection and its bias, then the q/k norm,
   * then RoPE. With a norm the projection stays in q_pre / k_pre for the norm's backward. */
  void *qp = cfg->qk_norm ? a->q_pre : a->q, *kp = cfg->qk_norm ? a->k_pre : a->k;
  TZ_CHECK(linear_fwd(cm, qp, h1, P(TZ_L_WQ), N, C, HD));
  TZ_CHECK(linear_fwd(cm, kp, h1, P(TZ_L_WK), N, C, KD));
  TZ_CHECK(linear_fwd(cm, a->v, h1, P(TZ_L_WV), N, C, KD));
  if (cfg->qkv_bias) {
    TZ_CHECK(tz_compute_bias_add(cm, qp, P(TZ_L_BQ), N, HD));
    TZ_CHECK(tz_compute_bias_add(cm, kp, P(TZ_L_BK), N, KD));
    TZ_CHECK(tz_compute_bias_add(cm, a->v, P(TZ_L_BV), N, KD));
  }
  if (cfg->qk_norm) {
    int rq, wq, rk, wk;
    qk_norm_shape(cfg, N, H, &rq, &wq);
    qk_norm_shape(cfg, N, Hkv, &rk, &wk);
    TZ_CHECK(
        tz_compute_rmsnorm_fwd(cm, a->q, a->rstd_q, qp, P(TZ_L_QNORM), rq, wq, eps, norm_off(cfg)));
    TZ_CHECK(
        tz_compute_rmsnorm_fwd(cm, a->k, a->rstd_k, kp, P(TZ_L_KNORM), rk, wk, eps, norm_off(cfg)));
  }
  TZ_CHECK(tz_compute_rope_fwd(cm, a->q, B, T, H, D, &rope, pos));
  TZ_CHECK(tz_compute_rope_fwd(cm, a->k, B, T, Hkv, D, &rope, pos));
  if (op)
    TZ_CHECK(
        tz_compute_attention_fwd(cm, a->att, a->lse, a->q, a->k, a->v, B, T, H, Hkv, D, pos, &opt));
  if (post) { /* x2 = x_in + norm(att wo^T), each rounded as transformers' OLMo 2 rounds them */
    TZ_CHECK(linear_fwd(cm, a->o, a->att, P(TZ_L_WO), N, HD, C));
    TZ_CHECK(tz_compute_rmsnorm_fwd(cm, a->x2, a->rstd_o, a->o, P(TZ_L_ATTN_POST_NORM), N, C, eps,
                                    norm_off(cfg)));
    TZ_CHECK(tz_compute_add(cm, S, a->x2, x_in, a->x2, (size_t)N * C));
  } else { /* x2 = x_in + att wo^T, the residual added in the projection's rounding */
    TZ_CHECK(linear_res_fwd(cm, a->x2, a->att, P(TZ_L_WO), x_in, N, HD, C));
  }
#undef P
  return 0;
}

/* g and u of rows [r0, ...): where they hold all the rows, those rows; one chunk's (gu_chunk),
 * its start */
static void *gu_rows(const struct tz_layer_acts *a, void *t, int r0, int F, enum tz_dtype S) {
  return at(t, a->gu_chunk ? 0 : (uint64_t)r0 * F, S);
}

/* The dense MLP on rows [r0, r0 + n) of the norm's output (a->h2, or x2 without input norms):
 * g, u, the chunk's a, and those rows of x_out (through a->m and a->rstd_m with the norm on the
 * output). */
static int mlp_chunk_fwd(tz_compute *cm, const struct tz_model_config *cfg,
                         const struct tz_block_layout *l, const void *params,
                         const struct tz_layer_acts *a, void *x_out, int r0, int n) {
  enum tz_dtype S = tz_compute_dtype(cm);
  int C = cfg->d_model, F = cfg->ffn_dim;
  float eps = (float)cfg->norm_eps;
  int pre = cfg->norm_place != TZ_NORM_POST, post = cfg->norm_place != TZ_NORM_PRE;
#define P(i) at(params, l->t[i].offset, S)
  const void *h = at(pre ? a->h2 : a->x2, (uint64_t)r0 * C, S);
  const void *x2 = at(a->x2, (uint64_t)r0 * C, S);
  void *g = gu_rows(a, a->g, r0, F, S), *u = gu_rows(a, a->u, r0, F, S);
  void *xo = at(x_out, (uint64_t)r0 * C, S);
  TZ_CHECK(linear_fwd(cm, g, h, P(TZ_L_WG), n, C, F));
  TZ_CHECK(linear_fwd(cm, u, h, P(TZ_L_WU), n, C, F));
  TZ_CHECK(tz_compute_glu_fwd(cm, (enum tz_glu)cfg->glu_act, a->a, g, u, (size_t)n * F));
  if (post) {
    void *m = at(a->m, (uint64_t)r0 * C, S);
    TZ_CHECK(linear_fwd(cm, m, a->a, P(TZ_L_WD), n, F, C));
    TZ_CHECK(tz_compute_rmsnorm_fwd(cm, xo, a->rstd_m + r0, m, P(TZ_L_MLP_POST_NORM), n, C, eps,
                                    norm_off(cfg)));
    TZ_CHECK(tz_compute_add(cm, S, xo, x2, xo, (size_t)n * C));
  } else {
    TZ_CHECK(linear_res_fwd(cm, xo, a->a, P(TZ_L_WD), x2, n, F, C));
  }
#undef P
  return 0;
}

/* The MLP part: a->h2, a->rstd2, a->g, a->u, a->a from a->x2, and x_out = x2 + the MLP's output
 * (TZ_NORM_POST: x2 + the norm of the output, through a->m); with experts, moe_fwd's (stats:
 * the routing's statistics, or NULL). */
static int mlp_fwd(tz_compute *cm, const struct tz_model_config *cfg, const void *params,
                   const struct tz_layer_acts *a, void *x_out, int B, int T, float *stats) {
  struct tz_block_layout l = {0};
  TZ_CHECK(part_layout(cfg, TZ_PART_MLP, &l));
  enum tz_dtype S = tz_compute_dtype(cm);
  int N = B * T, C = cfg->d_model;
  float eps = (float)cfg->norm_eps;
#define P(i) at(params, l.t[i].offset, S)
  int pre = cfg->norm_place != TZ_NORM_POST;
  const void *h2 = pre ? a->h2 : a->x2;
  if (pre)
    TZ_CHECK(tz_compute_rmsnorm_fwd(cm, a->h2, a->rstd2, a->x2, P(TZ_L_MLP_NORM), N, C, eps,
                                    norm_off(cfg)));
  if (tz_model_moe(cfg))
    return tz_model_moe_fwd(cm, cfg, &l, params, h2, a, x_out, N, stats);
  /* chunk by chunk (tz_model_mlp_rows) */
  const int R = tz_model_mlp_rows(cfg, N);
  for (int r0 = 0; r0 < N; r0 += R)
    TZ_CHECK(mlp_chunk_fwd(cm, cfg, &l, params, a, x_out, r0, N - r0 < R ? N - r0 : R));
#undef P
  return 0;
}

int tz_model_layer_fwd(tz_compute *cm, const struct tz_model_config *cfg, int layer, void *const *w,
                       const void *x_in, void *x_out, const struct tz_layer_acts *a, int B, int T,
                       const int32_t *pos) {
  return tz_model_layer_part_fwd(cm, cfg, layer, w, x_in, x_out, a, TZ_PARTS_ALL, B, T, pos);
}

int tz_model_layer_part_fwd(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                            void *const *w, const void *x_in, void *x_out,
                            const struct tz_layer_acts *a, unsigned parts, int B, int T,
                            const int32_t *pos) {
  TZ_CHECK(tz_model_check_batch(cfg, B, T));
  if (parts & TZ_PART_ATTN)
    TZ_CHECK(attn_fwd(cm, cfg, layer, part_w(cfg, w, TZ_PART_ATTN), x_in, a,
                      !(parts & TZ_PART_ATTN_OUT), B, T, pos));
  return parts & TZ_PART_MLP
             ? mlp_fwd(cm, cfg, part_w(cfg, w, TZ_PART_MLP), a, x_out, B, T, a->moe_stats)
             : 0;
}

int tz_model_layer_bwd(tz_compute *cm, const struct tz_model_config *cfg, int layer, void *const *w,
                       void *const *dw, const void *x_in, const struct tz_layer_acts *a,
                       unsigned recompute, const void *dx_out, void *dx_in,
                       const struct tz_layer_scratch *s, int B, int T, const int32_t *pos) {
  return tz_model_layer_part_bwd(cm, cfg, layer, w, dw, x_in, a, TZ_PARTS_ALL, recompute, dx_out,
                                 dx_in, s, B, T, pos);
}

/* The attention part's backward, once attn_ready has run: given dx2, the gradient at x2, grads +=
 * the part's gradients and dx_in = the gradient at x_in (dx_in may alias dx2). */
static int attn_bwd(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                    const void *params, void *grads, const void *x_in,
                    const struct tz_layer_acts *a, const void *dx2, void *dx_in,
                    const struct tz_layer_scratch *s, int B, int T, const int32_t *pos) {
  struct tz_block_layout l = {0};
  TZ_CHECK(part_layout(cfg, TZ_PART_ATTN, &l));
  enum tz_dtype S = tz_compute_dtype(cm), G = tz_compute_grad_dtype(cm);
  int N = B * T, C = cfg->d_model, H = cfg->n_head, Hkv = cfg->n_kv_head;
  int D = tz_model_head_dim(cfg), HD = H * D, KD = Hkv * D;
  struct tz_rope rope;
  tz_model_layer_rope(cfg, layer, T, &rope);
  struct tz_attn_opts opt = attn_opts(cfg, layer, T);
  int pre = cfg->norm_place != TZ_NORM_POST, post = cfg->norm_place != TZ_NORM_PRE;
#define P(i) at(params, l.t[i].offset, S)
#define GR(i) at(grads, l.t[i].offset, G)
  const void *h1 = pre ? a->h1 : x_in;
  /* x2 = x_in + att wo^T; dx2 is the gradient at x2. With the norm on the output, its gradient
   * at o goes to dh (free until the q, k and v backward write it). */
  const void *dout_o = dx2;
  if (post) {
    TZ_CHECK(tz_compute_rmsnorm_bwd(cm, s->dh, NULL, GR(TZ_L_ATTN_POST_NORM), dx2, a->o,
                                    P(TZ_L_ATTN_POST_NORM), a->rstd_o, N, C, norm_off(cfg)));
    dout_o = s->dh;
  }
  TZ_CHECK(linear_bwd(cm, s->datt, 0, GR(TZ_L_WO), dout_o, a->att, P(TZ_L_WO), N, HD, C));
  TZ_CHECK(tz_compute_attention_bwd(cm, s->dq, s->dk, s->dv, s->delta, s->datt, a->q, a->k, a->v,
                                    a->att, a->lse, B, T, H, Hkv, D, pos, &opt));
  TZ_CHECK(tz_compute_rope_bwd(cm, s->dq, B, T, H, D, &rope, pos));
  TZ_CHECK(tz_compute_rope_bwd(cm, s->dk, B, T, Hkv, D, &rope, pos));
  /* dqp, dkp: the gradients at the biased projections. Through the norms they go to buffers
   * free by now (rmsnorm_bwd's dx must not alias its dout): datt (N, H*D), read only by the
   * attention's backward, and dq, whose (N, H*D) holds a (N, Hkv*D) once dq itself is used. */
  void *dqp = s->dq, *dkp = s->dk;
  if (cfg->qk_norm) {
    dqp = s->datt;
    dkp = s->dq;
    int rq, wq, rk, wk;
    qk_norm_shape(cfg, N, H, &rq, &wq);
    qk_norm_shape(cfg, N, Hkv, &rk, &wk);
    TZ_CHECK(tz_compute_rmsnorm_bwd(cm, dqp, NULL, GR(TZ_L_QNORM), s->dq, a->q_pre, P(TZ_L_QNORM),
                                    a->rstd_q, rq, wq, norm_off(cfg)));
    TZ_CHECK(tz_compute_rmsnorm_bwd(cm, dkp, NULL, GR(TZ_L_KNORM), s->dk, a->k_pre, P(TZ_L_KNORM),
                                    a->rstd_k, rk, wk, norm_off(cfg)));
  }
  if (cfg->qkv_bias) {
    TZ_CHECK(tz_compute_bias_grad(cm, GR(TZ_L_BQ), dqp, N, HD));
    TZ_CHECK(tz_compute_bias_grad(cm, GR(TZ_L_BK), dkp, N, KD));
    TZ_CHECK(tz_compute_bias_grad(cm, GR(TZ_L_BV), s->dv, N, KD));
  }
  TZ_CHECK(linear_bwd(cm, s->dh, 0, GR(TZ_L_WQ), dqp, h1, P(TZ_L_WQ), N, C, HD));
  TZ_CHECK(linear_bwd(cm, s->dh, 1, GR(TZ_L_WK), dkp, h1, P(TZ_L_WK), N, C, KD));
  TZ_CHECK(linear_bwd(cm, s->dh, 1, GR(TZ_L_WV), s->dv, h1, P(TZ_L_WV), N, C, KD));
  /* The residual passes dx2 through: dx_in = dx2 + the norm's gradient, the copy fused into the
   * norm's backward. */
  if (!pre)
    return tz_compute_add(cm, S, dx_in, dx2, s->dh, (size_t)N * C);
  return tz_compute_rmsnorm_bwd(cm, dx_in, dx2, GR(TZ_L_ATTN_NORM), s->dh, x_in, P(TZ_L_ATTN_NORM),
                                a->rstd1, N, C, norm_off(cfg));
#undef P
#undef GR
}

/* What the attention part's backward reads, before any part's backward runs: its forward again
 * into a (recompute, TZ_PART_* bits: TZ_PART_ATTN, and with TZ_PART_ATTN_OUT but for the op; the
 * MLP's recompute starts from the x2 it writes), or h1 rebuilt (kept: acts_layout keeps no norm
 * output). */
static int attn_ready(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                      const void *params, const void *x_in, const struct tz_layer_acts *a,
                      unsigned recompute, int B, int T, const int32_t *pos) {
  if (recompute & TZ_PART_ATTN)
    return attn_fwd(cm, cfg, layer, params, x_in, a, !(recompute & TZ_PART_ATTN_OUT), B, T, pos);
  if (cfg->norm_place == TZ_NORM_POST)
    return 0;
  struct tz_block_layout l = {0};
  TZ_CHECK(part_layout(cfg, TZ_PART_ATTN, &l));
  return tz_compute_rmsnorm_fwd(cm, a->h1, a->rstd1, x_in,
                                at(params, l.t[TZ_L_ATTN_NORM].offset, tz_compute_dtype(cm)), B * T,
                                cfg->d_model, (float)cfg->norm_eps, norm_off(cfg));
}

/* The MLP part's backward, first recomputing its forward from a->x2 (recompute) or rebuilding
 * h2 and, with experts, the gathered inputs (kept): given dx_out, the gradient at x_out, grads
 * += the part's gradients and dx2 = the gradient at x2 (dx2 may alias dx_out). */
static int mlp_bwd(tz_compute *cm, const struct tz_model_config *cfg, int layer, const void *params,
                   void *grads, const struct tz_layer_acts *a, int recompute, const void *dx_out,
                   void *dx2, const struct tz_layer_scratch *s, int B, int T) {
  struct tz_block_layout l = {0};
  TZ_CHECK(part_layout(cfg, TZ_PART_MLP, &l));
  enum tz_dtype S = tz_compute_dtype(cm), G = tz_compute_grad_dtype(cm);
  int N = B * T, C = cfg->d_model, F = cfg->ffn_dim;
  float eps = (float)cfg->norm_eps;
  int pre = cfg->norm_place != TZ_NORM_POST, post = cfg->norm_place != TZ_NORM_PRE;
#define P(i) at(params, l.t[i].offset, S)
#define GR(i) at(grads, l.t[i].offset, G)
  /* The SwiGLU's output a, which the down projection's weight gradient reads: recomputed with
   * the MLP, else rebuilt by the SwiGLU's backward in the same pass (a_rebuilt). The recomputed
   * x_out is not needed, and the scratch's dh is free until the MLP backward. */
  void *a_rebuilt = NULL;
  const int moe = tz_model_moe(cfg), mlp_again = recompute != 0;
  if (a->gu_chunk && !mlp_again && tz_model_mlp_rows(cfg, N) < N)
    return tz_err_set(TZ_EINVAL,
                      "model: layer %d: g and u of one MLP chunk (the working acts) "
                      "with the MLP part not recomputed",
                      layer);
  if (mlp_again && moe) {
    TZ_CHECK(mlp_fwd(cm, cfg, params, a, s->dh, B, T, NULL));
  } else if (mlp_again) { /* the norm now, the rest chunk by chunk below */
    if (pre)
      TZ_CHECK(tz_compute_rmsnorm_fwd(cm, a->h2, a->rstd2, a->x2, P(TZ_L_MLP_NORM), N, C, eps,
                                      norm_off(cfg)));
  } else {
    if (pre)
      TZ_CHECK(tz_compute_rmsnorm_fwd(cm, a->h2, a->rstd2, a->x2, P(TZ_L_MLP_NORM), N, C, eps,
                                      norm_off(cfg)));
    a_rebuilt = a->a;
    if (tz_model_moe(cfg)) /* the experts' inputs, gathered again */
      TZ_CHECK(tz_compute_moe_gather(cm, a->xs, a->h2, a->rows, N * cfg->n_expert_used, C));
  }
  const void *h2 = pre ? a->h2 : a->x2;
  /* MLP: x_out = x2 + (silu(h2 wg^T) * (h2 wu^T)) wd^T, dx_out is the gradient of the output.
   * With the norm on the MLP's output, dm (in dh, free until the gate's and up's backward
   * write it) is the gradient at the down projection's output. */
  if (moe) {
    TZ_CHECK(tz_model_moe_bwd(cm, cfg, &l, params, grads, h2, a, a_rebuilt, dx_out, s, N));
  } else {
    /* Chunk by chunk as the forward ran: recomputed, each chunk's forward (g, u and a, into one
     * chunk's room where the acts hold one) just before its backward; kept, a rebuilt by the
     * SwiGLU's backward (the same bits as the forward's). With the norm on the output its
     * backward too, a chunk's rows at a time (dm in those rows of dh). A chunk's rows of dm are
     * read before the gate's and up's backward write the same rows of dh. */
    const int R = tz_model_mlp_rows(cfg, N);
    for (int r0 = 0; r0 < N; r0 += R) {
      const int n = N - r0 < R ? N - r0 : R;
      if (mlp_again) /* its x_out (the residual stream) unused, into dh's rows for now */
        TZ_CHECK(mlp_chunk_fwd(cm, cfg, &l, params, a, s->dh, r0, n));
      const void *h = at(h2, (uint64_t)r0 * C, S);
      const void *g = gu_rows(a, a->g, r0, F, S), *u = gu_rows(a, a->u, r0, F, S);
      void *dh = at(s->dh, (uint64_t)r0 * C, S);
      const void *dmc = at(dx_out, (uint64_t)r0 * C, S);
      if (post) {
        TZ_CHECK(tz_compute_rmsnorm_bwd(cm, dh, NULL, GR(TZ_L_MLP_POST_NORM), dmc,
                                        at(a->m, (uint64_t)r0 * C, S), P(TZ_L_MLP_POST_NORM),
                                        a->rstd_m + r0, n, C, norm_off(cfg)));
        dmc = dh;
      }
      TZ_CHECK(linear_bwd_dx(cm, s->da, 0, dmc, P(TZ_L_WD), n, F, C));
      TZ_CHECK(tz_compute_glu_bwd(cm, (enum tz_glu)cfg->glu_act, s->dg, s->du,
                                  mlp_again ? NULL : a->a, s->da, g, u, (size_t)n * F));
      TZ_CHECK(linear_bwd_dw(cm, GR(TZ_L_WD), dmc, a->a, n, F, C));
      TZ_CHECK(linear_bwd(cm, dh, 0, GR(TZ_L_WG), s->dg, h, P(TZ_L_WG), n, C, F));
      TZ_CHECK(linear_bwd(cm, dh, 1, GR(TZ_L_WU), s->du, h, P(TZ_L_WU), n, C, F));
    }
  }
  /* The residual passes dx_out through unchanged: dx2 = dx_out + the norm's gradient, the copy
   * fused into the norm's backward (or, the norm on the output, dx_out + the MLP input's). */
  if (!pre)
    return tz_compute_add(cm, S, dx2, dx_out, s->dh, (size_t)N * C);
  return tz_compute_rmsnorm_bwd(cm, dx2, dx_out, GR(TZ_L_MLP_NORM), s->dh, a->x2, P(TZ_L_MLP_NORM),
                                a->rstd2, N, C, norm_off(cfg));
#undef P
#undef GR
}

int tz_model_layer_part_bwd(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                            void *const *w, void *const *dw, const void *x_in,
                            const struct tz_layer_acts *a, unsigned parts, unsigned recompute,
                            const void *dx_out, void *dx_in, const struct tz_layer_scratch *s,
                            int B, int T, const int32_t *pos) {
  TZ_CHECK(tz_model_check_batch(cfg, B, T));
  const void *wa = part_w(cfg, w, TZ_PART_ATTN), *wm = part_w(cfg, w, TZ_PART_MLP);
  void *ga = part_w(cfg, dw, TZ_PART_ATTN), *gm = part_w(cfg, dw, TZ_PART_MLP);
  int attn = (parts & TZ_PART_ATTN) != 0;
  if (attn) /* first: a recomputed MLP starts from the x2 the attention's recompute writes */
    TZ_CHECK(attn_ready(cm, cfg, layer, wa, x_in, a, recompute, B, T, pos));
  const void *dx2 = dx_out;
  if (parts & TZ_PART_MLP) {
    TZ_CHECK(
        mlp_bwd(cm, cfg, layer, wm, gm, a, (recompute & TZ_PART_MLP) != 0, dx_out, dx_in, s, B, T));
    dx2 = dx_in;
  }
  return attn ? attn_bwd(cm, cfg, layer, wa, ga, x_in, a, dx2, dx_in, s, B, T, pos) : 0;
}

/* The LM head's weight (V, C) and where its gradient goes. */
static void head_weights(tz_compute *cm, const struct tz_model_config *cfg, const void *head,
                         const void *embed, void *head_grad, void *embed_grad, const void **W,
                         void **dW) {
  struct tz_block_layout l = {0};
  tz_model_block_layout(cfg, tz_model_n_blocks(cfg) - 1, &l);
  if (cfg->tie_embeddings) {
    *W = embed;
    *dW = embed_grad;
  } else {
    *W = at(head, l.t[TZ_H_LM].offset, tz_compute_dtype(cm));
    *dW = head_grad ? at(head_grad, l.t[TZ_H_LM].offset, tz_compute_grad_dtype(cm)) : NULL;
  }
}

int tz_model_head(tz_compute *cm, const struct tz_model_config *cfg, const void *head,
                  const void *embed, void *head_grad, void *embed_grad, const void *x,
                  const int32_t *targets, float dscale, void *dx, const struct tz_head_scratch *s,
                  int B, int T) {
  TZ_CHECK(tz_model_check_batch(cfg, B, T));
  enum tz_dtype S = tz_compute_dtype(cm);
  int N = B * T, C = cfg->d_model, V = cfg->vocab;
  int bwd = head_grad != NULL;
  if (bwd && cfg->tie_embeddings && !embed_grad)
    return tz_err_set(TZ_EINVAL, "model head: tied embeddings need the embedding's gradient");
  const void *W;
  void *dW;
  head_weights(cm, cfg, head, embed, head_grad, embed_grad, &W, &dW);
  TZ_CHECK(tz_compute_rmsnorm_fwd(cm, s->h, s->rstd, x, head, N, C, (float)cfg->norm_eps,
                                  norm_off(cfg)));
  int rows = tz_model_head_rows(cfg, N);
  for (int r0 = 0; r0 < N; r0 += rows) {
    int nr = N - r0 < rows ? N - r0 : rows;
    const void *h = at(s->h, (uint64_t)r0 * C, S);
    TZ_CHECK(linear_fwd(cm, s->logits, h, W, nr, C, V));
    TZ_CHECK(tz_compute_xent(cm, s->losses + r0, bwd ? s->logits : NULL, s->logits, targets + r0,
                             nr, V, dscale, (float)cfg->final_softcap));
    if (bwd)
      TZ_CHECK(linear_bwd(cm, at(s->dh, (uint64_t)r0 * C, S), 0, dW, s->logits, h, W, nr, C, V));
  }
  TZ_CHECK(tz_compute_sum(cm, s->loss, TZ_F32, s->losses, (size_t)N, 0));
  if (bwd) {
    TZ_CHECK(tz_compute_rmsnorm_bwd(cm, dx, NULL, head_grad, s->dh, x, head, s->rstd, N, C,
                                    norm_off(cfg)));
  }
  return 0;
}

int tz_model_head_logits(tz_compute *cm, const struct tz_model_config *cfg, const void *head,
                         const void *embed, const void *x, void *logits,
                         const struct tz_head_scratch *s, int B, int T) {
  TZ_CHECK(tz_model_check_batch(cfg, B, T));
  int N = B * T, C = cfg->d_model, V = cfg->vocab;
  const void *W;
  void *dW;
  head_weights(cm, cfg, head, embed, NULL, NULL, &W, &dW);
  TZ_CHECK(tz_compute_rmsnorm_fwd(cm, s->h, s->rstd, x, head, N, C, (float)cfg->norm_eps,
                                  norm_off(cfg)));
  TZ_CHECK(linear_fwd(cm, logits, s->h, W, N, C, V));
  return cfg->final_softcap > 0
             ? tz_compute_softcap(cm, logits, (size_t)N * V, (float)cfg->final_softcap)
             : 0;
}

int tz_model_checkpoint_default(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T) {
  return (uint64_t)cfg->n_layer * tz_model_acts_bytes(cfg, dt, B, T) > TZ_MODEL_ACTS_BUDGET;
}

/* ---- One layer alone ---- */

double tz_model_layer_flop(const struct tz_model_config *cfg, int B, int T) {
  return tz_model_layer_part_flop(cfg, B, T, TZ_PARTS_ALL);
}

double tz_model_layer_part_flop(const struct tz_model_config *cfg, int B, int T, unsigned parts) {
  double N = (double)B * (double)T, C = cfg->d_model, F = cfg->ffn_dim;
  double D = tz_model_head_dim(cfg), HD = (double)cfg->n_head * D;
  double op = 2.0 * (double)B * (double)T * (double)T * HD; /* the attention op's scores and sum */
  double attn = 2.0 * N * C * D * (double)(2 * cfg->n_head + 2 * cfg->n_kv_head) +
                (parts & TZ_PART_ATTN_OUT ? 0 : op);
  double mlp = tz_model_moe(cfg)
                   ? 2.0 * N * C *
                         (3.0 * cfg->n_expert_used * cfg->moe_ffn_dim + cfg->n_expert +
                          3.0 * cfg->shared_ffn_dim + (cfg->shared_ffn_dim ? 1 : 0))
                   : 2.0 * N * 3.0 * C * F;
  return (parts & TZ_PART_ATTN ? attn : 0) + (parts & TZ_PART_MLP ? mlp : 0);
}
