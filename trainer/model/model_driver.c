/* The whole-model driver (tz_model_runner, for tests and tools) and one layer alone
 * (tz_layer_probe: tz-bench layer, the trainer's compute rate), on model.c's phases (model.h). */
#include "trainer/model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "util/clock.h"

/* ---- the whole-model driver ---- */

struct tz_model_runner {
  tz_compute *cm;
  const struct tz_model_config *cfg;
  int B, T, checkpoint;
  void *mem;                 /* one allocation for everything below */
  int32_t *tokens, *targets; /* (B, T) */
  int32_t *pos;              /* (B, T): tz_model_runner_set_pos's, when has_pos */
  int has_pos;
  void **xs;                  /* n_layer + 1 of (B, T, C): the input of each layer, then the
                                 final output */
  struct tz_layer_acts *acts; /* checkpoint ? 1 : n_layer */
  struct tz_layer_scratch scratch;
  struct tz_head_scratch head;
  void *dx;                    /* (B, T, C) the gradient flowing down */
  float *moe_stats, *moe_daux; /* with experts: 2E and E F32 (tz_model_moe_aux) */
};

int tz_model_runner_create(tz_compute *cm, const struct tz_model_config *cfg, int B, int T,
                           int checkpoint, tz_model_runner **out) {
  *out = NULL;
  TZ_CHECK(tz_model_config_check(cfg));
  TZ_CHECK(tz_model_check_batch(cfg, B, T));
  tz_model_runner *r = calloc(1, sizeof *r);
  int L = cfg->n_layer, n_acts = checkpoint ? 1 : L;
  if (r) {
    r->xs = calloc((size_t)L + 1, sizeof *r->xs);
    r->acts = calloc((size_t)n_acts, sizeof *r->acts);
  }
  if (!r || !r->xs || !r->acts) {
    tz_model_runner_destroy(r);
    return tz_err_set(TZ_ENOMEM, "model runner: out of memory");
  }
  r->cm = cm;
  r->cfg = cfg;
  r->B = B;
  r->T = T;
  r->checkpoint = checkpoint != 0;
  enum tz_dtype S = tz_compute_dtype(cm);
  size_t N = (size_t)B * T;
  size_t x_bytes = (N * cfg->d_model * tz_dtype_size(S) + 255) & ~(size_t)255;
  size_t tok_bytes = (N * sizeof(int32_t) + 255) & ~(size_t)255;
  size_t acts_bytes = tz_model_acts_bytes(cfg, S, B, T);
  size_t moe_bytes =
      tz_model_moe(cfg) ? (3 * (size_t)cfg->n_expert * sizeof(float) + 255) & ~255ul : 0;
  size_t total = 3 * tok_bytes + (size_t)(L + 2) * x_bytes + (size_t)n_acts * acts_bytes +
                 tz_model_scratch_bytes(cfg, S, B, T) + tz_model_head_scratch_bytes(cfg, S, B, T) +
                 moe_bytes;
  int rc = tz_compute_alloc(cm, total, &r->mem);
  if (rc < 0) {
    tz_model_runner_destroy(r);
    return rc;
  }
  char *p = r->mem;
  r->tokens = (int32_t *)p, p += tok_bytes;
  r->targets = (int32_t *)p, p += tok_bytes;
  r->pos = (int32_t *)p, p += tok_bytes;
  for (int i = 0; i <= L; i++)
    r->xs[i] = p, p += x_bytes;
  r->dx = p, p += x_bytes;
  for (int i = 0; i < n_acts; i++) {
    tz_model_acts_carve(cfg, S, B, T, p, &r->acts[i]);
    p += acts_bytes;
  }
  tz_model_scratch_carve(cfg, S, B, T, p, &r->scratch);
  p += tz_model_scratch_bytes(cfg, S, B, T);
  tz_model_head_scratch_carve(cfg, S, B, T, p, &r->head);
  p += tz_model_head_scratch_bytes(cfg, S, B, T);
  if (moe_bytes) {
    r->moe_stats = (float *)p;
    r->moe_daux = r->moe_stats + 2 * cfg->n_expert;
  }
  for (int i = 0; i < n_acts; i++)
    r->acts[i].moe_stats = r->moe_stats;
  *out = r;
  return 0;
}

void tz_model_runner_destroy(tz_model_runner *r) {
  if (!r)
    return;
  if (r->mem)
    tz_compute_free(r->cm, r->mem);
  free(r->xs);
  free(r->acts);
  free(r);
}

int tz_model_runner_set_pos(tz_model_runner *r, const int32_t *pos) {
  r->has_pos = pos != NULL;
  if (!pos)
    return 0;
  return tz_compute_copy_in(r->cm, r->pos, pos, (size_t)r->B * r->T * sizeof(int32_t));
}

static int runner_forward(tz_model_runner *r, void *const *params, const int32_t *tokens) {
  const struct tz_model_config *cfg = r->cfg;
  size_t N = (size_t)r->B * r->T;
  TZ_CHECK(tz_compute_copy_in(r->cm, r->tokens, tokens, N * sizeof(int32_t)));
  if (r->moe_stats)
    TZ_CHECK(tz_compute_zero(r->cm, r->moe_stats, 2 * (size_t)cfg->n_expert * sizeof(float)));
  TZ_CHECK(tz_model_embed_fwd(r->cm, cfg, params[0], r->tokens, r->xs[0], r->B, r->T));
  for (int i = 0; i < cfg->n_layer; i++) {
    const struct tz_layer_acts *a = &r->acts[r->checkpoint ? 0 : i];
    TZ_CHECK(tz_model_layer_fwd(r->cm, cfg, i, params + tz_model_block_of_layer(cfg, i), r->xs[i],
                                r->xs[i + 1], a, r->B, r->T, r->has_pos ? r->pos : NULL));
  }
  return 0;
}

int tz_model_runner_step(tz_model_runner *r, void *const *params, void *const *grads,
                         const int32_t *tokens, const int32_t *targets, float dscale, float *loss) {
  const struct tz_model_config *cfg = r->cfg;
  int L = cfg->n_layer, B = r->B, T = r->T, H = tz_model_n_blocks(cfg) - 1;
  size_t N = (size_t)B * T, n_targets = 0;
  for (size_t i = 0; i < N; i++)
    n_targets += targets[i] != TZ_TARGET_IGNORE;
  if (dscale <= 0.0f)
    dscale = n_targets ? 1.0f / (float)n_targets : 0.0f;
  TZ_CHECK(runner_forward(r, params, tokens));
  TZ_CHECK(tz_compute_copy_in(r->cm, r->targets, targets, N * sizeof(int32_t)));
  TZ_CHECK(tz_model_head(r->cm, cfg, params[H], params[0], grads ? grads[H] : NULL,
                         grads ? grads[0] : NULL, r->xs[L], r->targets, dscale, r->dx, &r->head, B,
                         T));
  /* The load-balancing loss of the forward's routing, and its gradient for the backward. */
  double aux = 0.0;
  if (r->moe_stats && tz_model_aux_coef(cfg) > 0) {
    float stats[2 * TZ_MOE_MAX_EXPERTS], daux[TZ_MOE_MAX_EXPERTS];
    TZ_CHECK(tz_compute_copy_out(r->cm, stats, r->moe_stats, 2 * sizeof(float) * cfg->n_expert));
    aux = tz_model_moe_aux(cfg, stats, (int)N, tz_model_aux_coef(cfg), daux);
    TZ_CHECK(tz_compute_copy_in(r->cm, r->moe_daux, daux, sizeof(float) * cfg->n_expert));
  }
  for (int i = 0; r->moe_stats && i < (r->checkpoint ? 1 : L); i++)
    r->acts[i].moe_daux = tz_model_aux_coef(cfg) > 0 ? r->moe_daux : NULL;
  if (grads) {
    for (int i = L - 1; i >= 0; i--) {
      int blk = tz_model_block_of_layer(cfg, i);
      const struct tz_layer_acts *a = &r->acts[r->checkpoint ? 0 : i];
      TZ_CHECK(tz_model_layer_bwd(r->cm, cfg, i, params + blk, grads + blk, r->xs[i], a,
                                  r->checkpoint ? TZ_PARTS_ALL : 0, r->dx, r->dx, &r->scratch, B, T,
                                  r->has_pos ? r->pos : NULL));
    }
    TZ_CHECK(tz_model_embed_bwd(r->cm, cfg, grads[0], r->tokens, tokens, r->dx, B, T));
  }
  float sum = 0.0f;
  TZ_CHECK(tz_compute_copy_out(r->cm, &sum, r->head.loss, sizeof sum));
  TZ_CHECK(tz_compute_sync(r->cm));
  *loss = (float)((n_targets ? sum / (float)n_targets : 0.0f) + tz_model_aux_coef(cfg) * aux);
  return 0;
}

int tz_model_runner_logits(tz_model_runner *r, void *const *params, const int32_t *tokens,
                           float *logits) {
  const struct tz_model_config *cfg = r->cfg;
  enum tz_dtype S = tz_compute_dtype(r->cm);
  size_t n = (size_t)r->B * r->T * cfg->vocab;
  TZ_CHECK(runner_forward(r, params, tokens));
  void *buf = NULL, *f32 = NULL;
  int rc;
  TZ_CHECK_GOTO(tz_compute_alloc(r->cm, n * tz_dtype_size(S), &buf), rc, out);
  TZ_CHECK_GOTO(tz_model_head_logits(r->cm, cfg, params[tz_model_n_blocks(cfg) - 1], params[0],
                                     r->xs[cfg->n_layer], buf, &r->head, r->B, r->T),
                rc, out);
  if (S != TZ_F32) {
    TZ_CHECK_GOTO(tz_compute_alloc(r->cm, n * sizeof(float), &f32), rc, out);
    TZ_CHECK_GOTO(tz_compute_cast(r->cm, f32, TZ_F32, buf, S, n), rc, out);
  }
  TZ_CHECK_GOTO(tz_compute_copy_out(r->cm, logits, f32 ? f32 : buf, n * sizeof(float)), rc, out);
  rc = tz_compute_sync(r->cm);
out:
  tz_compute_free(r->cm, buf);
  tz_compute_free(r->cm, f32);
  return rc;
}

void tz_layer_probe_free(tz_compute *cm, struct tz_layer_probe *l) {
  void *all[] = {l->params, l->grads, l->x_in,     l->x_out,
                 l->dx_out, l->dx_in, l->acts_mem, l->scratch_mem};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i])
      tz_compute_free(cm, all[i]);
  memset(l, 0, sizeof *l);
}

/* n elements of dtype t at dst (compute memory) from a repeated pseudo-random pattern in
 * [-scale, scale]: a probe on zeros times kernels fed zeros, which a GPU runs faster (less power
 * drawn, higher clocks) than the step's real data. */
static int probe_fill(tz_compute *cm, void *dst, uint64_t n, enum tz_dtype t, float scale,
                      uint64_t seed) {
  enum { PATTERN = 1 << 20 };
  size_t es = tz_dtype_size(t);
  unsigned char *h = malloc((size_t)PATTERN * es);
  if (!h)
    return tz_err_set(TZ_ENOMEM, "layer probe: no memory for its input pattern");
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < PATTERN; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    float f = scale * ((float)(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
    if (t == TZ_F32)
      memcpy(h + i * es, &f, sizeof f);
    else {
      uint16_t v = t == TZ_BF16 ? tz_f32_to_bf16(f) : tz_f32_to_f16(f);
      memcpy(h + i * es, &v, sizeof v);
    }
  }
  int rc = 0;
  for (uint64_t off = 0; off < n && rc == 0; off += PATTERN) {
    uint64_t k = n - off < PATTERN ? n - off : PATTERN;
    rc = tz_compute_copy_in(cm, (unsigned char *)dst + off * es, h, (size_t)(k * es));
  }
  free(h);
  return rc;
}

int tz_layer_probe_alloc(tz_compute *cm, const struct tz_model_config *cfg, int B, int T,
                         struct tz_layer_probe *l) {
  memset(l, 0, sizeof *l);
  enum tz_dtype S = tz_compute_dtype(cm), G = tz_compute_grad_dtype(cm);
  /* the layer's blocks one after the other in params and grads (w and dw point at each) */
  uint64_t np = tz_model_layer_numel(cfg);
  size_t x_bytes = (size_t)B * (size_t)T * (size_t)cfg->d_model * tz_dtype_size(S);
  size_t sizes[8] = {np * tz_dtype_size(S),
                     np * tz_dtype_size(G),
                     x_bytes,
                     x_bytes,
                     x_bytes,
                     x_bytes,
                     tz_model_acts_bytes(cfg, S, B, T),
                     tz_model_scratch_bytes(cfg, S, B, T)};
  void **at[8] = {&l->params, &l->grads, &l->x_in,     &l->x_out,
                  &l->dx_out, &l->dx_in, &l->acts_mem, &l->scratch_mem};
  int rc = 0;
  for (int i = 0; i < 8 && rc == 0; i++) {
    rc = tz_compute_alloc(cm, sizes[i], at[i]);
    if (rc == 0)
      rc = tz_compute_zero(cm, *at[i], sizes[i]);
  }
  /* The inputs hold data of the magnitudes training sees (the rest is written before it is
   * read, or accumulated into). */
  uint64_t nx = (uint64_t)B * (uint64_t)T * (uint64_t)cfg->d_model;
  if (rc == 0)
    rc = probe_fill(cm, l->params, np, S, 0.02f, 1);
  if (rc == 0)
    rc = probe_fill(cm, l->x_in, nx, S, 1.0f, 2);
  if (rc == 0)
    rc = probe_fill(cm, l->dx_out, nx, S, 0.5f, 3);
  if (rc < 0) {
    tz_layer_probe_free(cm, l);
    return rc;
  }
  tz_model_acts_carve(cfg, S, B, T, l->acts_mem, &l->acts);
  tz_model_scratch_carve(cfg, S, B, T, l->scratch_mem, &l->scratch);
  tz_model_layer_split(cfg, l->params, S, l->w);
  tz_model_layer_split(cfg, l->grads, G, l->dw);
  l->B = B;
  l->T = T;
  return 0;
}

int tz_layer_probe_step(tz_compute *cm, const struct tz_model_config *cfg,
                        const struct tz_layer_probe *l, unsigned recompute) {
  TZ_CHECK(tz_model_layer_fwd(cm, cfg, 0, l->w, l->x_in, l->x_out, &l->acts, l->B, l->T, l->pos));
  return tz_model_layer_bwd(cm, cfg, 0, l->w, l->dw, l->x_in, &l->acts, recompute, l->dx_out,
                            l->dx_in, &l->scratch, l->B, l->T, l->pos);
}

int tz_layer_probe_time(tz_compute *cm, const struct tz_model_config *cfg, int B, int T, int reps,
                        double *seconds) {
  *seconds = 0;
  if (reps < 1)
    return tz_err_set(TZ_EINVAL, "layer probe: %d passes to time (at least 1)", reps);
  struct tz_layer_probe l;
  TZ_CHECK(tz_layer_probe_alloc(cm, cfg, B, T, &l));
  int rc = 0;
  double w0 = tz_now_s();
  do
    rc = tz_layer_probe_step(cm, cfg, &l, 1);
  while (rc == 0 && (rc = tz_compute_sync(cm)) == 0 && tz_now_s() - w0 < TZ_LAYER_PROBE_WARM_S);
  double t0 = tz_now_s();
  for (int i = 0; i < reps && rc == 0; i++)
    rc = tz_layer_probe_step(cm, cfg, &l, 1);
  if (rc == 0)
    rc = tz_compute_sync(cm);
  if (rc == 0)
    *seconds = (tz_now_s() - t0) / reps;
  tz_layer_probe_free(cm, &l);
  return rc;
}
