/* The mixture-of-experts MLP of a layer (trainer/model/model.h, "Mixture of experts"): the router,
 * the experts grouped by the routing, Qwen2-MoE's gated shared expert, the load-balancing loss,
 * on the compute ops (kernels/compute.h); model.c's layer phases call it for a config with
 * experts. */
#include "trainer/model/model_internal.h"

static struct tz_moe_route moe_route_of(const struct tz_layer_acts *a) {
  return (struct tz_moe_route){a->probs, a->idx, a->rw, a->offsets, a->rows, a->slot};
}

/* Expert e's rows of the (E*rows, cols) stacked weight W. */
static const void *expert_w(const void *W, int e, int rows, int cols, enum tz_dtype S) {
  return at(W, (uint64_t)e * rows * cols, S);
}

/* The experts' products, queued and run a batch at a time through tz_compute_matmul_many (side
 * by side where the backend can: each expert's rows alone are too few to fill a GPU); the calls
 * of a batch are independent, and a batch runs before anything after it. */
#define MM_BATCH 64
struct mm_queue {
  tz_compute *cm;
  int n;
  struct tz_matmul_call c[MM_BATCH];
};

static int mm_flush(struct mm_queue *q) {
  int rc = tz_compute_matmul_many(q->cm, q->n, q->c);
  q->n = 0;
  return rc;
}

static int mm_push(struct mm_queue *q, struct tz_matmul_call c) {
  q->c[q->n++] = c;
  return q->n == MM_BATCH ? mm_flush(q) : 0;
}

/* The experts' offsets (E+1), on the host: each expert's matmuls need its rows. */
static int moe_offsets(tz_compute *cm, const struct tz_model_config *cfg,
                       const struct tz_layer_acts *a, int32_t *off) {
  TZ_CHECK(tz_compute_copy_out(cm, off, a->offsets, (size_t)(cfg->n_expert + 1) * sizeof *off));
  return tz_compute_sync(cm);
}

/* The experts' MLP on h2 (N, C): the router's logits and the routing (stats += its statistics
 * unless NULL), the rows gathered by expert, each expert's SwiGLU on its rows, and x_out = x2 +
 * the weighted sum of each token's experts. */
int tz_model_moe_fwd(tz_compute *cm, const struct tz_model_config *cfg,
                     const struct tz_block_layout *l, const void *params, const void *h2,
                     const struct tz_layer_acts *a, void *x_out, int N, float *stats) {
  enum tz_dtype S = tz_compute_dtype(cm);
  int C = cfg->d_model, E = cfg->n_expert, k = cfg->n_expert_used, F = cfg->moe_ffn_dim;
  const void *Wg = at(params, l->t[TZ_L_WG].offset, S), *Wu = at(params, l->t[TZ_L_WU].offset, S);
  const void *Wd = at(params, l->t[TZ_L_WD].offset, S);
  TZ_CHECK(linear_fwd(cm, a->rlogits, h2, at(params, l->t[TZ_L_ROUTER].offset, S), N, C, E));
  struct tz_moe_route r = moe_route_of(a);
  TZ_CHECK(tz_compute_moe_route(cm, &r, stats, a->rlogits, N, E, k, cfg->norm_topk));
  int32_t off[TZ_MOE_MAX_EXPERTS + 1];
  TZ_CHECK(moe_offsets(cm, cfg, a, off));
  TZ_CHECK(tz_compute_moe_gather(cm, a->xs, h2, a->rows, N * k, C));
  struct mm_queue q = {.cm = cm};
  for (int e = 0; e < E; e++) {
    int m = off[e + 1] - off[e];
    if (!m)
      continue;
    const void *xs = at(a->xs, (uint64_t)off[e] * C, S);
    void *g = at(a->g, (uint64_t)off[e] * F, S), *u = at(a->u, (uint64_t)off[e] * F, S);
    TZ_CHECK(mm_push(&q, linear_fwd_call(cm, g, xs, expert_w(Wg, e, F, C, S), m, C, F)));
    TZ_CHECK(mm_push(&q, linear_fwd_call(cm, u, xs, expert_w(Wu, e, F, C, S), m, C, F)));
  }
  TZ_CHECK(mm_flush(&q));
  TZ_CHECK(tz_compute_glu_fwd(cm, (enum tz_glu)cfg->glu_act, a->a, a->g, a->u, (size_t)N * k * F));
  for (int e = 0; e < E; e++) {
    int m = off[e + 1] - off[e];
    if (m)
      TZ_CHECK(mm_push(&q, linear_fwd_call(cm, at(a->y, (uint64_t)off[e] * C, S),
                                           at(a->a, (uint64_t)off[e] * F, S),
                                           expert_w(Wd, e, C, F, S), m, F, C)));
  }
  TZ_CHECK(mm_flush(&q));
  TZ_CHECK(tz_compute_moe_combine(cm, x_out, a->x2, a->y, a->rw, a->slot, N, k, C));
  int Fs = cfg->shared_ffn_dim;
  if (!Fs)
    return 0;
  /* the shared expert, gated: x_out += sigmoid(h2 shared_gate^T) * its SwiGLU of h2 */
  TZ_CHECK(linear_fwd(cm, a->sg, h2, at(params, l->t[TZ_L_SWG].offset, S), N, C, Fs));
  TZ_CHECK(linear_fwd(cm, a->su, h2, at(params, l->t[TZ_L_SWU].offset, S), N, C, Fs));
  TZ_CHECK(tz_compute_glu_fwd(cm, (enum tz_glu)cfg->glu_act, a->sa, a->sg, a->su, (size_t)N * Fs));
  TZ_CHECK(linear_fwd(cm, a->ys, a->sa, at(params, l->t[TZ_L_SWD].offset, S), N, Fs, C));
  TZ_CHECK(linear_fwd(cm, a->slog, h2, at(params, l->t[TZ_L_SGATE].offset, S), N, C, 1));
  return tz_compute_moe_gate_fwd(cm, x_out, x_out, a->ys, a->slog, N, C);
}

/* The experts' backward, given dx_out at x_out: grads += the router's and experts' gradients,
 * dh (N, C) = the gradient at h2. xs and h2 hold the forward's; a is rebuilt when a_rebuilt. */
int tz_model_moe_bwd(tz_compute *cm, const struct tz_model_config *cfg,
                     const struct tz_block_layout *l, const void *params, void *grads,
                     const void *h2, const struct tz_layer_acts *a, void *a_rebuilt,
                     const void *dx_out, const struct tz_layer_scratch *s, int N) {
  enum tz_dtype S = tz_compute_dtype(cm), G = tz_compute_grad_dtype(cm);
  int C = cfg->d_model, E = cfg->n_expert, k = cfg->n_expert_used, F = cfg->moe_ffn_dim;
  const void *Wg = at(params, l->t[TZ_L_WG].offset, S), *Wu = at(params, l->t[TZ_L_WU].offset, S);
  const void *Wd = at(params, l->t[TZ_L_WD].offset, S);
  void *dWg = at(grads, l->t[TZ_L_WG].offset, G), *dWu = at(grads, l->t[TZ_L_WU].offset, G);
  void *dWd = at(grads, l->t[TZ_L_WD].offset, G);
  TZ_CHECK(tz_compute_moe_combine_bwd(cm, s->dy, s->dw, dx_out, a->y, a->rw, a->slot, N, k, C));
  int32_t off[TZ_MOE_MAX_EXPERTS + 1];
  TZ_CHECK(moe_offsets(cm, cfg, a, off));
  /* Each product is the one a loop over the experts would run, in four rounds of independent
   * calls (the same bits: no product reads what another of its round writes): da = dy Wd, then
   * the SwiGLU's backward over every row at once (elementwise), then the weights' gradients,
   * then the gradient at the inputs, written where dy was (read no more), dg Wg and then += du
   * Wu. */
  struct mm_queue q = {.cm = cm};
  for (int e = 0; e < E; e++) {
    int m = off[e + 1] - off[e];
    if (m)
      TZ_CHECK(mm_push(&q, linear_bwd_dx_call(cm, at(s->da, (uint64_t)off[e] * F, S), 0,
                                              at(s->dy, (uint64_t)off[e] * C, S),
                                              expert_w(Wd, e, C, F, S), m, F, C)));
  }
  TZ_CHECK(mm_flush(&q));
  TZ_CHECK(tz_compute_glu_bwd(cm, (enum tz_glu)cfg->glu_act, s->dg, s->du, a_rebuilt, s->da, a->g,
                              a->u, (size_t)N * k * F));
  for (int e = 0; e < E; e++) {
    int m = off[e + 1] - off[e];
    if (!m)
      continue;
    uint64_t rf = (uint64_t)off[e] * F, rc = (uint64_t)off[e] * C;
    const void *dy = at(s->dy, rc, S), *xs = at(a->xs, rc, S);
    TZ_CHECK(mm_push(&q, linear_bwd_dw_call(cm, (void *)expert_w(dWd, e, C, F, G), dy,
                                            at(a->a, rf, S), m, F, C)));
    TZ_CHECK(mm_push(&q, linear_bwd_dw_call(cm, (void *)expert_w(dWg, e, F, C, G), at(s->dg, rf, S),
                                            xs, m, C, F)));
    TZ_CHECK(mm_push(&q, linear_bwd_dw_call(cm, (void *)expert_w(dWu, e, F, C, G), at(s->du, rf, S),
                                            xs, m, C, F)));
  }
  TZ_CHECK(mm_flush(&q));
  for (int pass = 0; pass < 2; pass++) {
    for (int e = 0; e < E; e++) {
      int m = off[e + 1] - off[e];
      if (!m)
        continue;
      uint64_t rf = (uint64_t)off[e] * F;
      const void *d = at(pass ? s->du : s->dg, rf, S);
      const void *W = expert_w(pass ? Wu : Wg, e, F, C, S);
      TZ_CHECK(mm_push(
          &q, linear_bwd_dx_call(cm, at(s->dy, (uint64_t)off[e] * C, S), pass, d, W, m, C, F)));
    }
    TZ_CHECK(mm_flush(&q));
  }
  TZ_CHECK(tz_compute_moe_scatter(cm, s->dh, s->dy, a->slot, N, k, C));
  struct tz_moe_route r = moe_route_of(a);
  TZ_CHECK(tz_compute_moe_route_bwd(cm, s->dlog, &r, s->dw, a->moe_daux, N, E, k, cfg->norm_topk));
  TZ_CHECK(linear_bwd(cm, s->dh, 1, at(grads, l->t[TZ_L_ROUTER].offset, G), s->dlog, h2,
                      at(params, l->t[TZ_L_ROUTER].offset, S), N, C, E));
  int Fs = cfg->shared_ffn_dim;
  if (!Fs)
    return 0;
    /* the shared expert: through its gate, then its SwiGLU (sa rebuilt by the SwiGLU's backward
     * unless recomputed) */
#define SP(i) at(params, l->t[i].offset, S)
#define SG(i) at(grads, l->t[i].offset, G)
  TZ_CHECK(tz_compute_moe_gate_bwd(cm, s->dys, s->dslog, dx_out, a->ys, a->slog, N, C));
  TZ_CHECK(linear_bwd_dx(cm, s->dsa, 0, s->dys, SP(TZ_L_SWD), N, Fs, C));
  TZ_CHECK(tz_compute_glu_bwd(cm, (enum tz_glu)cfg->glu_act, s->dsg, s->dsu,
                              a_rebuilt ? a->sa : NULL, s->dsa, a->sg, a->su, (size_t)N * Fs));
  TZ_CHECK(linear_bwd_dw(cm, SG(TZ_L_SWD), s->dys, a->sa, N, Fs, C));
  TZ_CHECK(linear_bwd(cm, s->dh, 1, SG(TZ_L_SWG), s->dsg, h2, SP(TZ_L_SWG), N, C, Fs));
  TZ_CHECK(linear_bwd(cm, s->dh, 1, SG(TZ_L_SWU), s->dsu, h2, SP(TZ_L_SWU), N, C, Fs));
  return linear_bwd(cm, s->dh, 1, SG(TZ_L_SGATE), s->dslog, h2, SP(TZ_L_SGATE), N, C, 1);
#undef SP
#undef SG
}

double tz_model_moe_aux(const struct tz_model_config *cfg, const float *stats, int rows,
                        double scale, float *daux) {
  int E = cfg->n_expert;
  double R = (double)rows * cfg->n_layer, aux = 0.0;
  if (E <= 0 || R <= 0)
    return 0.0;
  for (int e = 0; e < E; e++) {
    aux += ((double)stats[e] / R) * ((double)stats[E + e] / R);
    if (daux)
      daux[e] = (float)(scale * E * (double)stats[e] / (R * R));
  }
  return aux * E;
}
