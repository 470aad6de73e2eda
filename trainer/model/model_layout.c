/* The decoder's layout (model.h): its blocks and their tensors, the parameters' initialisation,
 * blocks in backend memory, and the activations' and scratch's buffers; the phases that compute
 * with them are model.c's. */
#include "trainer/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "trainer/model/model_internal.h"
#include "util/mix.h"

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
  } else if (parts & TZ_PART_ATTN_OUT) { /* the op's output alone, beside a recomputed part */
    a->att = carve(c, N * HD * es);
    a->lse = carve(c, (size_t)B * cfg->n_head * T * sizeof(float));
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
  int rows = cfg->head_chunk > 0 ? cfg->head_chunk
                                 : (int)(TZ_MODEL_HEAD_CHUNK_ELEMS / (unsigned)cfg->vocab);
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
