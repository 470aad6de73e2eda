/* The decoder's layout, initialisation and phases (model.h), against kernels/compute.h only. */
#include "trainer/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "trainer/model/model_internal.h"
#include "util/mix.h"

/* The norms' weight offset for the kernels (kernels/compute.h): 1 for Gemma's (1 + w). */
static float norm_off(const struct tz_model_config *cfg) { return cfg->norm_offset ? 1.0f : 0.0f; }

/* ---- layout ---- */

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

int tz_model_layer_blocks(const struct tz_model_config *cfg) { return tz_model_moe(cfg) ? 2 : 1; }
int tz_model_n_blocks(const struct tz_model_config *cfg) {
  return cfg->n_layer * tz_model_layer_blocks(cfg) + 2;
}
int tz_model_block_of_layer(const struct tz_model_config *cfg, int layer) {
  return 1 + layer * tz_model_layer_blocks(cfg);
}
int tz_model_block_layer(const struct tz_model_config *cfg, int block) {
  if (block <= 0 || block >= tz_model_n_blocks(cfg) - 1)
    return -1;
  return (block - 1) / tz_model_layer_blocks(cfg);
}
int tz_model_block_parts(const struct tz_model_config *cfg, int block) {
  if (tz_model_block_layer(cfg, block) < 0)
    return 0;
  if (!tz_model_moe(cfg))
    return TZ_PARTS_ALL;
  return (block - 1) % 2 ? TZ_PART_MLP : TZ_PART_ATTN;
}

/* The part of a layer (TZ_PART_*) each TZ_L_* tensor belongs to. */
static unsigned tensor_part(int t) {
  switch (t) {
  case TZ_L_MLP_NORM:
  case TZ_L_WG:
  case TZ_L_WU:
  case TZ_L_WD:
  case TZ_L_MLP_POST_NORM:
  case TZ_L_ROUTER:
  case TZ_L_SWG:
  case TZ_L_SWU:
  case TZ_L_SWD:
  case TZ_L_SGATE: return TZ_PART_MLP;
  default: return TZ_PART_ATTN;
  }
}

static void add_tensor(struct tz_block_layout *l, const char *name, int64_t rows, int64_t cols,
                       int ndim) {
  struct tz_param_info *t = &l->t[l->n++];
  t->name = name;
  t->offset = l->numel;
  t->ndim = ndim;
  t->shape[0] = rows;
  t->shape[1] = cols;
  t->numel = (uint64_t)rows * (uint64_t)cols;
  l->numel = round_up(t->offset + t->numel, TZ_MODEL_ALIGN);
}

/* A vector of n elements when present; else an entry without room (numel 0, ndim 0). */
static void add_optional(struct tz_block_layout *l, const char *name, int64_t n, int present) {
  add_tensor(l, name, present ? n : 0, present ? 1 : 0, present ? 1 : 0);
}

/* A layer's layout cut to one part's tensors (a layer with experts, whose parts are blocks of
 * their own): the other part's entries have no room, and the offsets close up in the same order. */
static void keep_part(struct tz_block_layout *l, unsigned part) {
  l->numel = 0;
  for (int i = 0; i < l->n; i++) {
    struct tz_param_info *t = &l->t[i];
    if (tensor_part(i) != part) {
      t->numel = 0;
      t->ndim = 0;
      t->shape[0] = t->shape[1] = 0;
    }
    t->offset = l->numel;
    l->numel = round_up(t->offset + t->numel, TZ_MODEL_ALIGN);
  }
}

int tz_model_block_layout(const struct tz_model_config *cfg, int block,
                          struct tz_block_layout *out) {
  int nb = tz_model_n_blocks(cfg);
  if (block < 0 || block >= nb)
    return tz_err_set(TZ_EINVAL, "model: block %d outside [0, %d)", block, nb);
  memset(out, 0, sizeof *out);
  unsigned parts = (unsigned)tz_model_block_parts(cfg, block);
  int64_t C = cfg->d_model, F = cfg->ffn_dim, V = cfg->vocab;
  int64_t D = tz_model_head_dim(cfg), HD = (int64_t)cfg->n_head * D,
          KD = (int64_t)cfg->n_kv_head * D;
  out->layer = -1;
  if (block == 0) {
    out->kind = TZ_BLOCK_EMBED;
    add_tensor(out, "wte", V, C, 2);
  } else if (block == nb - 1) {
    out->kind = TZ_BLOCK_HEAD;
    add_tensor(out, "norm", C, 1, 1);
    if (!cfg->tie_embeddings)
      add_tensor(out, "lm_head", V, C, 2);
  } else {
    out->kind = parts == TZ_PART_MLP ? TZ_BLOCK_MOE : TZ_BLOCK_LAYER;
    out->layer = tz_model_block_layer(cfg, block);
    int pre = cfg->norm_place != TZ_NORM_POST, post = cfg->norm_place != TZ_NORM_PRE;
    add_optional(out, "attn_norm", C, pre);
    add_tensor(out, "wq", HD, C, 2);
    add_tensor(out, "wk", KD, C, 2);
    add_tensor(out, "wv", KD, C, 2);
    add_tensor(out, "wo", C, HD, 2);
    add_optional(out, "mlp_norm", C, pre);
    int64_t E = cfg->n_expert > 0 ? cfg->n_expert : 1;
    if (cfg->n_expert > 0)
      F = cfg->moe_ffn_dim;
    add_tensor(out, "wg", E * F, C, 2);
    add_tensor(out, "wu", E * F, C, 2);
    add_tensor(out, "wd", E * C, F, 2);
    /* after every Llama tensor, so that a Llama layer's offsets do not move */
    add_optional(out, "bq", HD, cfg->qkv_bias);
    add_optional(out, "bk", KD, cfg->qkv_bias);
    add_optional(out, "bv", KD, cfg->qkv_bias);
    int all = cfg->qk_norm == TZ_QK_NORM_ALL;
    add_optional(out, "q_norm", all ? HD : D, cfg->qk_norm != TZ_QK_NORM_NONE);
    add_optional(out, "k_norm", all ? KD : D, cfg->qk_norm != TZ_QK_NORM_NONE);
    add_optional(out, "attn_post_norm", C, post);
    add_optional(out, "mlp_post_norm", C, post);
    if (cfg->n_expert > 0)
      add_tensor(out, "router", cfg->n_expert, C, 2);
    else
      add_optional(out, "router", 0, 0);
    int64_t Fs = tz_model_moe(cfg) ? cfg->shared_ffn_dim : 0;
    add_tensor(out, "shared_wg", Fs, Fs ? C : 0, Fs ? 2 : 0);
    add_tensor(out, "shared_wu", Fs, Fs ? C : 0, Fs ? 2 : 0);
    add_tensor(out, "shared_wd", Fs ? C : 0, Fs, Fs ? 2 : 0);
    add_tensor(out, "shared_gate", Fs ? 1 : 0, Fs ? C : 0, Fs ? 2 : 0);
    if (parts != TZ_PARTS_ALL)
      keep_part(out, parts);
  }
  return 0;
}

uint64_t tz_model_block_numel(const struct tz_model_config *cfg, int block) {
  struct tz_block_layout l = {0};
  if (tz_model_block_layout(cfg, block, &l) < 0)
    return 0;
  return l.numel;
}

uint64_t tz_model_block_numel_padded(const struct tz_model_config *cfg, int block, int world_size) {
  if (world_size < 1)
    world_size = 1;
  return round_up(tz_model_block_numel(cfg, block), (uint64_t)world_size * TZ_MODEL_ALIGN);
}

uint64_t tz_model_layer_numel(const struct tz_model_config *cfg) {
  uint64_t n = 0;
  for (int i = 0; i < tz_model_layer_blocks(cfg); i++)
    n += tz_model_block_numel(cfg, tz_model_block_of_layer(cfg, 0) + i);
  return n;
}

int tz_model_layer_layout(const struct tz_model_config *cfg, struct tz_block_layout *out) {
  int b0 = tz_model_block_of_layer(cfg, 0);
  TZ_CHECK(tz_model_block_layout(cfg, b0, out));
  if (tz_model_layer_blocks(cfg) == 1)
    return 0;
  struct tz_block_layout m;
  TZ_CHECK(tz_model_block_layout(cfg, b0 + 1, &m));
  for (int i = 0; i < m.n; i++)
    if (m.t[i].numel) {
      out->t[i] = m.t[i];
      out->t[i].offset += out->numel;
    }
  out->numel += m.numel;
  return 0;
}

void tz_model_layer_split(const struct tz_model_config *cfg, void *base, enum tz_dtype dt,
                          void *w[2]) {
  w[0] = w[1] = base;
  if (tz_model_layer_blocks(cfg) == 2)
    w[1] = (char *)base +
           tz_model_block_numel(cfg, tz_model_block_of_layer(cfg, 0)) * tz_dtype_size(dt);
}

uint64_t tz_model_layer_numel_padded(const struct tz_model_config *cfg, int world_size) {
  uint64_t n = 0;
  for (int i = 0; i < tz_model_layer_blocks(cfg); i++)
    n += tz_model_block_numel_padded(cfg, tz_model_block_of_layer(cfg, 0) + i, world_size);
  return n;
}

uint64_t tz_model_n_params(const struct tz_model_config *cfg) {
  uint64_t n = 0;
  for (int b = 0; b < tz_model_n_blocks(cfg); b++) {
    struct tz_block_layout l;
    if (tz_model_block_layout(cfg, b, &l) < 0)
      return 0;
    for (int i = 0; i < l.n; i++)
      n += l.t[i].numel;
  }
  return n;
}

/* A token's parameters: with experts, k of each layer's E (their counts the same in every layer).
 */
uint64_t tz_model_n_active_params(const struct tz_model_config *cfg) {
  uint64_t n = tz_model_n_params(cfg);
  if (!tz_model_moe(cfg))
    return n;
  uint64_t expert = 3ull * (uint64_t)cfg->moe_ffn_dim * (uint64_t)cfg->d_model;
  return n - (uint64_t)cfg->n_layer * (uint64_t)(cfg->n_expert - cfg->n_expert_used) * expert;
}

/* ---- initialisation ---- */

/* A standard normal from (seed, block, tensor, index) alone. */
static double init_normal(uint64_t seed, int block, int tensor, uint64_t i) {
  uint64_t h = tz_mix_init(seed + TZ_MIX_GAMMA);
  h = tz_mix_init(h ^ ((uint64_t)(uint32_t)block << 32 | (uint32_t)tensor));
  h = tz_mix_init(h ^ i);
  uint64_t h2 = tz_mix_init(h + TZ_MIX_GAMMA);
  /* u1 in (0, 1], u2 in [0, 1): 53-bit uniforms */
  double u1 = ((double)(h >> 11) + 1.0) * 0x1.0p-53;
  double u2 = (double)(h2 >> 11) * 0x1.0p-53;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

int tz_model_init_block(const struct tz_model_config *cfg, int block, uint64_t seed, uint64_t begin,
                        uint64_t end, float *out) {
  struct tz_block_layout l = {0};
  TZ_CHECK(tz_model_block_layout(cfg, block, &l));
  if (begin > end)
    return tz_err_set(TZ_EINVAL, "model init: block %d range [%llu, %llu) is reversed", block,
                      (unsigned long long)begin, (unsigned long long)end);
  memset(out, 0, (size_t)(end - begin) * sizeof *out);
  double std_out = 0.02 / sqrt(2.0 * cfg->n_layer);
  /* transformers' _init_weights zeroes the embedding's padding_idx (pad_token_id) row */
  int64_t pad_row = cfg->init_std > 0.0 && cfg->has_pad && cfg->pad_id >= 0 &&
                            cfg->pad_id < cfg->vocab && l.kind == TZ_BLOCK_EMBED
                        ? cfg->pad_id
                        : -1;
  uint64_t pad_lo = pad_row < 0 ? 0 : (uint64_t)pad_row * (uint64_t)cfg->d_model;
  uint64_t pad_hi = pad_row < 0 ? 0 : pad_lo + (uint64_t)cfg->d_model;
  /* The numbers name a layer's tensors by the layer (layer + 1), whichever of its blocks holds
   * them, and the head by n_layer + 1: a layer whose parts are blocks of their own (experts)
   * draws the numbers it drew as one block. */
  int id = l.kind == TZ_BLOCK_EMBED ? 0 : l.kind == TZ_BLOCK_HEAD ? cfg->n_layer + 1 : l.layer + 1;
  for (int ti = 0; ti < l.n; ti++) {
    const struct tz_param_info *t = &l.t[ti];
    if (t->numel == 0)
      continue;
    uint64_t lo = t->offset > begin ? t->offset : begin;
    uint64_t hi = t->offset + t->numel < end ? t->offset + t->numel : end;
    int layer = l.kind == TZ_BLOCK_LAYER || l.kind == TZ_BLOCK_MOE;
    if (layer && (ti == TZ_L_BQ || ti == TZ_L_BK || ti == TZ_L_BV))
      continue; /* biases start at 0 */
    int is_norm = t->ndim == 1;
    double std = cfg->init_std > 0.0 ? cfg->init_std : 0.02;
    if (cfg->init_std == 0.0 && layer && (ti == TZ_L_WO || ti == TZ_L_WD))
      std = std_out;
      /* Each element is a function of its index alone, so threads change no bit; a 7B model's
       * seven billion normals take minutes on one core. */
#pragma omp parallel for schedule(static) if (hi - lo > 65536)
    for (uint64_t e = lo; e < hi; e++) {
      uint64_t i = e - t->offset;
      out[e - begin] = is_norm                     ? 1.0f
                       : i >= pad_lo && i < pad_hi ? 0.0f
                                                   : (float)(std * init_normal(seed, id, ti, i));
    }
  }
  return 0;
}

/* ---- parameter blocks in backend memory ---- */

int tz_model_blocks_alloc(tz_compute *cm, const struct tz_model_config *cfg, void ***out) {
  *out = NULL;
  int nb = tz_model_n_blocks(cfg);
  void **b = calloc((size_t)nb, sizeof *b);
  if (!b)
    return tz_err_set(TZ_ENOMEM, "model: out of memory");
  size_t es = tz_dtype_size(tz_compute_dtype(cm));
  for (int i = 0; i < nb; i++) {
    size_t bytes = tz_model_block_numel(cfg, i) * es;
    int rc = tz_compute_alloc(cm, bytes, &b[i]);
    if (!rc)
      rc = tz_compute_zero(cm, b[i], bytes);
    if (rc < 0) {
      tz_model_blocks_free(cm, cfg, b);
      return rc;
    }
  }
  *out = b;
  return 0;
}

void tz_model_blocks_free(tz_compute *cm, const struct tz_model_config *cfg, void **blocks) {
  if (!blocks)
    return;
  for (int i = 0; i < tz_model_n_blocks(cfg); i++)
    tz_compute_free(cm, blocks[i]);
  free(blocks);
}

int tz_model_block_upload(tz_compute *cm, void *dst, const float *src, uint64_t n) {
  enum tz_dtype S = tz_compute_dtype(cm);
  if (S == TZ_F32) {
    TZ_CHECK(tz_compute_copy_in(cm, dst, src, n * sizeof(float)));
    return tz_compute_sync(cm);
  }
  void *tmp;
  TZ_CHECK(tz_compute_alloc(cm, n * sizeof(float), &tmp));
  int rc = tz_compute_copy_in(cm, tmp, src, n * sizeof(float));
  if (!rc)
    rc = tz_compute_cast(cm, dst, S, tmp, TZ_F32, n);
  if (!rc)
    rc = tz_compute_sync(cm);
  tz_compute_free(cm, tmp);
  return rc;
}

int tz_model_block_download(tz_compute *cm, float *dst, const void *src, uint64_t n) {
  enum tz_dtype S = tz_compute_dtype(cm);
  if (S == TZ_F32) {
    TZ_CHECK(tz_compute_copy_out(cm, dst, src, n * sizeof(float)));
    return tz_compute_sync(cm);
  }
  void *tmp;
  TZ_CHECK(tz_compute_alloc(cm, n * sizeof(float), &tmp));
  int rc = tz_compute_cast(cm, tmp, TZ_F32, src, S, n);
  if (!rc)
    rc = tz_compute_copy_out(cm, dst, tmp, n * sizeof(float));
  if (!rc)
    rc = tz_compute_sync(cm);
  tz_compute_free(cm, tmp);
  return rc;
}

int tz_model_blocks_init(tz_compute *cm, const struct tz_model_config *cfg, uint64_t seed,
                         void *const *blocks) {
  for (int b = 0; b < tz_model_n_blocks(cfg); b++) {
    uint64_t n = tz_model_block_numel(cfg, b);
    float *buf = malloc(sizeof(float) * n);
    if (!buf)
      return tz_err_set(TZ_ENOMEM, "model: cannot allocate block %d (%llu floats)", b,
                        (unsigned long long)n);
    int rc = tz_model_init_block(cfg, b, seed, 0, n, buf);
    if (!rc)
      rc = tz_model_block_upload(cm, blocks[b], buf, n);
    free(buf);
    TZ_CHECK(rc);
  }
  return 0;
}

/* ---- activation buffers ---- */

struct carver {
  char *base; /* NULL: only count */
  size_t off;
};

static void *carve(struct carver *c, size_t bytes) {
  void *p = c->base ? c->base + c->off : NULL;
  c->off += (bytes + 255) & ~(size_t)255;
  return p;
}

/* What a kept part holds, the attention part's then the MLP part's, each contiguous; then, in
 * the full layout only (kept_only 0), the tensors the backward rebuilds from the kept ones
 * (tz_model_layer_bwd): the norms' outputs and statistics (h1, rstd1 from x_in; h2, rstd2 from
 * x2) in a pass each, and the SwiGLU (a from g and u) in its backward's pass. A layer whose parts
 * are kept apart (the trainer's kept activations) carves only what they keep; the rest is the
 * shared acts'. */
/* The rows and width of the MLP's hidden tensors (g, u, a): N x ffn_dim, or with experts the N*k
 * assignments x moe_ffn_dim. */
static void mlp_shape(const struct tz_model_config *cfg, size_t N, size_t *M, size_t *F) {
  int moe = tz_model_moe(cfg);
  *M = moe ? N * (size_t)cfg->n_expert_used : N;
  *F = (size_t)(moe ? cfg->moe_ffn_dim : cfg->ffn_dim);
}

/* work: the trainer's working acts, g and u one MLP chunk's (gu_chunk). kept_only 2: what the
 * trainer keeps, where a layer with experts keeps no x2 of its attention part (its x2 is the MLP
 * block's input, a block of the tiers: tz_model_block_parts). */
static void acts_layout(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                        unsigned parts, int kept_only, int work, struct carver *c,
                        struct tz_layer_acts *a) {
  size_t N = (size_t)B * T, es = tz_dtype_size(dt), M, F;
  mlp_shape(cfg, N, &M, &F);
  size_t C = cfg->d_model, D = tz_model_head_dim(cfg);
  size_t E = (size_t)cfg->n_expert, k = (size_t)cfg->n_expert_used;
  int moe = tz_model_moe(cfg);
  size_t HD = cfg->n_head * D, KD = cfg->n_kv_head * D;
  int pre = cfg->norm_place != TZ_NORM_POST, post = cfg->norm_place != TZ_NORM_PRE;
  if (parts & TZ_PART_ATTN) {
    /* only with q/k norms, so that a Llama layer's activations stay what they were */
    int qkn = cfg->qk_norm != TZ_QK_NORM_NONE, all = cfg->qk_norm == TZ_QK_NORM_ALL;
    a->q_pre = qkn ? carve(c, N * HD * es) : NULL;
    a->k_pre = qkn ? carve(c, N * KD * es) : NULL;
    a->rstd_q = qkn ? carve(c, N * (all ? 1 : cfg->n_head) * sizeof(float)) : NULL;
    a->rstd_k = qkn ? carve(c, N * (all ? 1 : cfg->n_kv_head) * sizeof(float)) : NULL;
    a->o = post ? carve(c, N * C * es) : NULL;
    a->rstd_o = post ? carve(c, N * sizeof(float)) : NULL;
    a->q = carve(c, N * HD * es);
    a->k = carve(c, N * KD * es);
    a->v = carve(c, N * KD * es);
    a->att = carve(c, N * HD * es);
    a->lse = carve(c, (size_t)B * cfg->n_head * T * sizeof(float));
    if (!(kept_only == 2 && moe))
      a->x2 = carve(c, N * C * es);
  }
  if (parts & TZ_PART_MLP) {
    int chunk = work && !tz_model_moe(cfg);
    size_t gu = chunk ? (size_t)tz_model_mlp_rows(cfg, (int)N) : M;
    a->gu_chunk = chunk;
    a->g = carve(c, gu * F * es);
    a->u = carve(c, gu * F * es);
    if (moe) {
      a->y = carve(c, M * C * es);
      a->probs = carve(c, N * E * sizeof(float));
      a->idx = carve(c, N * k * sizeof(int32_t));
      a->rw = carve(c, N * k * sizeof(float));
      a->offsets = carve(c, (E + 1) * sizeof(int32_t));
      a->rows = carve(c, M * sizeof(int32_t));
      a->slot = carve(c, M * sizeof(int32_t));
      size_t Fs = (size_t)cfg->shared_ffn_dim;
      a->sg = Fs ? carve(c, N * Fs * es) : NULL;
      a->su = Fs ? carve(c, N * Fs * es) : NULL;
      a->ys = Fs ? carve(c, N * C * es) : NULL;
      a->slog = Fs ? carve(c, N * es) : NULL;
    }
    a->m = post ? carve(c, N * C * es) : NULL;
    a->rstd_m = post ? carve(c, N * sizeof(float)) : NULL;
  }
  if (kept_only)
    return;
  if ((parts & TZ_PART_ATTN) && pre) {
    a->h1 = carve(c, N * C * es);
    a->rstd1 = carve(c, N * sizeof(float));
  }
  if ((parts & TZ_PART_MLP) && pre) {
    a->h2 = carve(c, N * C * es);
    a->rstd2 = carve(c, N * sizeof(float));
  }
  if (parts & TZ_PART_MLP) {
    a->a = carve(c, (moe ? M : (size_t)tz_model_mlp_rows(cfg, (int)N)) * F * es);
    if (moe) {
      a->xs = carve(c, M * C * es);
      a->rlogits = carve(c, N * E * es);
      a->sa = cfg->shared_ffn_dim ? carve(c, N * (size_t)cfg->shared_ffn_dim * es) : NULL;
    }
  }
}

/* The bytes of a layout (acts_layout's parts, kept_only and work). */
static size_t layout_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                           unsigned parts, int kept_only, int work) {
  struct carver c = {0};
  struct tz_layer_acts a;
  acts_layout(cfg, dt, B, T, parts, kept_only, work, &c, &a);
  return c.off;
}

size_t tz_model_acts_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T) {
  return layout_bytes(cfg, dt, B, T, TZ_PARTS_ALL, 0, 0);
}

void tz_model_acts_carve(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                         void *base, struct tz_layer_acts *out) {
  memset(out, 0, sizeof *out);
  struct carver c = {.base = base};
  acts_layout(cfg, dt, B, T, TZ_PARTS_ALL, 0, 0, &c, out);
}

size_t tz_model_acts_work_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T) {
  return layout_bytes(cfg, dt, B, T, TZ_PARTS_ALL, 0, 1);
}

void tz_model_acts_work_carve(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                              void *base, struct tz_layer_acts *out) {
  memset(out, 0, sizeof *out);
  struct carver c = {.base = base};
  acts_layout(cfg, dt, B, T, TZ_PARTS_ALL, 0, 1, &c, out);
}

size_t tz_model_acts_part_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                                unsigned parts) {
  return layout_bytes(cfg, dt, B, T, parts, 1, 0);
}

size_t tz_model_acts_kept_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                                unsigned parts) {
  return layout_bytes(cfg, dt, B, T, parts, 2, 0);
}

void tz_model_acts_carve_parts(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                               unsigned parts, void *base, struct tz_layer_acts *out) {
  struct carver c = {.base = base};
  acts_layout(cfg, dt, B, T, parts, 2, 0, &c, out);
}

static void scratch_layout(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                           struct carver *c, struct tz_layer_scratch *s) {
  size_t N = (size_t)B * T, es = tz_dtype_size(dt), M, F;
  mlp_shape(cfg, N, &M, &F);
  size_t C = cfg->d_model, D = tz_model_head_dim(cfg);
  size_t HD = cfg->n_head * D, KD = cfg->n_kv_head * D;
  s->dh = carve(c, N * C * es);
  size_t R = tz_model_moe(cfg) ? M : (size_t)tz_model_mlp_rows(cfg, (int)N); /* a chunk's rows */
  s->da = carve(c, R * F * es);
  s->dg = carve(c, R * F * es);
  s->du = carve(c, R * F * es);
  s->dy = s->dlog = s->dys = s->dsa = s->dsg = s->dsu = s->dslog = NULL;
  s->dw = NULL;
  if (tz_model_moe(cfg)) {
    s->dy = carve(c, M * C * es);
    s->dlog = carve(c, N * (size_t)cfg->n_expert * es);
    s->dw = carve(c, M * sizeof(float));
    size_t Fs = (size_t)cfg->shared_ffn_dim;
    if (Fs) {
      s->dys = carve(c, N * C * es);
      s->dsa = carve(c, N * Fs * es);
      s->dsg = carve(c, N * Fs * es);
      s->dsu = carve(c, N * Fs * es);
      s->dslog = carve(c, N * es);
    }
  }
  s->datt = carve(c, N * HD * es);
  s->dq = carve(c, N * HD * es);
  s->dk = carve(c, N * KD * es);
  s->dv = carve(c, N * KD * es);
  s->delta = carve(c, (size_t)B * cfg->n_head * T * sizeof(float));
}

size_t tz_model_scratch_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T) {
  struct carver c = {0};
  struct tz_layer_scratch s;
  scratch_layout(cfg, dt, B, T, &c, &s);
  return c.off;
}

void tz_model_scratch_carve(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                            void *base, struct tz_layer_scratch *out) {
  struct carver c = {.base = base};
  scratch_layout(cfg, dt, B, T, &c, out);
}

int tz_model_mlp_rows(const struct tz_model_config *cfg, int N) {
  if (tz_model_moe(cfg))
    return N;
  int rows = cfg->mlp_chunk;
  if (rows <= 0) {
    rows = (int)(TZ_MODEL_MLP_CHUNK_ELEMS / (unsigned)cfg->ffn_dim) / 256 * 256;
    if (rows < 256)
      rows = 256;
  }
  return rows < N ? rows : N;
}

int tz_model_head_rows(const struct tz_model_config *cfg, int N) {
  int rows = (int)(TZ_MODEL_HEAD_CHUNK_ELEMS / (unsigned)cfg->vocab);
  if (rows < 1)
    rows = 1;
  return rows < N ? rows : N;
}

static void head_layout(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                        struct carver *c, struct tz_head_scratch *s) {
  size_t N = (size_t)B * T, es = tz_dtype_size(dt), C = cfg->d_model;
  s->h = carve(c, N * C * es);
  s->rstd = carve(c, N * sizeof(float));
  s->logits = carve(c, (size_t)tz_model_head_rows(cfg, (int)N) * cfg->vocab * es);
  s->dh = carve(c, N * C * es);
  s->losses = carve(c, N * sizeof(float));
  s->loss = carve(c, sizeof(float));
}

size_t tz_model_head_scratch_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B,
                                   int T) {
  struct carver c = {0};
  struct tz_head_scratch s;
  head_layout(cfg, dt, B, T, &c, &s);
  return c.off;
}

void tz_model_head_scratch_carve(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                                 void *base, struct tz_head_scratch *out) {
  struct carver c = {.base = base};
  head_layout(cfg, dt, B, T, &c, out);
}

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

static int attn_fwd(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                    const void *params, const void *x_in, const struct tz_layer_acts *a, int B,
                    int T, const int32_t *pos) {
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
    TZ_CHECK(attn_fwd(cm, cfg, layer, part_w(cfg, w, TZ_PART_ATTN), x_in, a, B, T, pos));
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
 * into a (recompute; the MLP's recompute starts from the x2 it writes), or h1 rebuilt (kept:
 * acts_layout keeps no norm output). */
static int attn_ready(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                      const void *params, const void *x_in, const struct tz_layer_acts *a,
                      int recompute, int B, int T, const int32_t *pos) {
  if (recompute)
    return attn_fwd(cm, cfg, layer, params, x_in, a, B, T, pos);
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
    TZ_CHECK(attn_ready(cm, cfg, layer, wa, x_in, a, (recompute & TZ_PART_ATTN) != 0, B, T, pos));
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
  double attn = 2.0 * N * C * D * (double)(2 * cfg->n_head + 2 * cfg->n_kv_head) +
                2.0 * (double)B * (double)T * (double)T * HD;
  double mlp = tz_model_moe(cfg)
                   ? 2.0 * N * C *
                         (3.0 * cfg->n_expert_used * cfg->moe_ffn_dim + cfg->n_expert +
                          3.0 * cfg->shared_ffn_dim + (cfg->shared_ffn_dim ? 1 : 0))
                   : 2.0 * N * 3.0 * C * F;
  return (parts & TZ_PART_ATTN ? attn : 0) + (parts & TZ_PART_MLP ? mlp : 0);
}
