/* The model's configuration (model.h): the presets, the config's check, and what follows from a
 * config alone: its variants and backend check, each layer's window and rope, head and rotary
 * dims, parameter counts. */
#include "trainer/model/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

/* ---- config ---- */

/* One preset a paragraph, aligned by hand. */
/* clang-format off */
static const struct {
  const char *name;
  struct tz_model_config cfg;
} presets[] = {
    /* Byte-level vocabulary; small enough to train on two cores in minutes. */
    {"tiny", {.d_model = 128, .n_layer = 4, .n_head = 4, .n_kv_head = 2, .ffn_dim = 352,
              .vocab = 256, .max_seq = 256, .rope_theta = 10000.0, .norm_eps = 1e-5,
              .tie_embeddings = 1}},
    {"llama-1b", {.d_model = 2048, .n_layer = 16, .n_head = 16, .n_kv_head = 16, .ffn_dim = 5632,
                  .vocab = 32000, .max_seq = 2048, .rope_theta = 10000.0, .norm_eps = 1e-5,
                  .tie_embeddings = 0}},
    {"llama-3b", {.d_model = 3200, .n_layer = 26, .n_head = 32, .n_kv_head = 32, .ffn_dim = 8640,
                  .vocab = 32000, .max_seq = 2048, .rope_theta = 10000.0, .norm_eps = 1e-6,
                  .tie_embeddings = 0}},
    {"llama-7b", {.d_model = 4096, .n_layer = 32, .n_head = 32, .n_kv_head = 32, .ffn_dim = 11008,
                  .vocab = 32000, .max_seq = 2048, .rope_theta = 10000.0, .norm_eps = 1e-5,
                  .tie_embeddings = 0}},
    {"llama-13b", {.d_model = 5120, .n_layer = 40, .n_head = 40, .n_kv_head = 40,
                   .ffn_dim = 13824, .vocab = 32000, .max_seq = 2048, .rope_theta = 10000.0,
                   .norm_eps = 1e-5, .tie_embeddings = 0}},
};
/* clang-format on */
#define N_PRESETS ((int)(sizeof presets / sizeof presets[0]))

int tz_model_preset_count(void) { return N_PRESETS; }

const char *tz_model_preset_name(int i) { return i >= 0 && i < N_PRESETS ? presets[i].name : NULL; }

int tz_model_preset(const char *name, struct tz_model_config *out) {
  for (int i = 0; name && i < N_PRESETS; i++)
    if (strcmp(name, presets[i].name) == 0) {
      *out = presets[i].cfg;
      return 0;
    }
  return tz_err_set(TZ_ENOENT,
                    "model: no preset '%s' (tiny, llama-1b, llama-3b, llama-7b, llama-13b)",
                    name ? name : "(null)");
}

int tz_model_config_check(const struct tz_model_config *c) {
#define NEED(cond, ...)                                                                            \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      return tz_err_set(TZ_ECONFIG, "model config: " __VA_ARGS__);                                 \
  } while (0)
  NEED(c->d_model > 0, "d_model %d must be positive", c->d_model);
  NEED(c->n_layer > 0, "n_layer %d must be positive", c->n_layer);
  NEED(c->head_dim >= 0, "head_dim %d must be positive (or 0: d_model / n_head)", c->head_dim);
  if (c->head_dim == 0) {
    NEED(c->n_head > 0 && c->d_model % c->n_head == 0,
         "n_head %d must be positive and divide d_model %d (or set head_dim)", c->n_head,
         c->d_model);
    NEED((c->d_model / c->n_head) % 2 == 0, "head dim %d (d_model / n_head) must be even for RoPE",
         c->d_model / c->n_head);
  } else {
    NEED(c->n_head > 0, "n_head %d must be positive", c->n_head);
    NEED(c->head_dim % 2 == 0, "head_dim %d must be even for RoPE", c->head_dim);
  }
  NEED(tz_model_head_dim(c) <= TZ_ROPE_MAX_D, "head dim %d is larger than RoPE's %d",
       tz_model_head_dim(c), TZ_ROPE_MAX_D);
  NEED(c->n_kv_head > 0 && c->n_head % c->n_kv_head == 0,
       "n_kv_head %d must be positive and divide n_head %d", c->n_kv_head, c->n_head);
  NEED(c->ffn_dim > 0, "ffn_dim %d must be positive", c->ffn_dim);
  NEED(c->vocab > 0, "vocab %d must be positive", c->vocab);
  NEED(c->max_seq > 0, "max_seq %d must be positive", c->max_seq);
  NEED(c->rope_theta > 0.0, "rope_theta %g must be positive", c->rope_theta);
  struct tz_rope rope;
  tz_model_rope(c, &rope);
  if (tz_rope_check(&rope) < 0) {
    /* its message names the field (factor is rope_factor here, and so on); copied, as the
     * message buffer is what tz_err_set writes */
    char why[256];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(TZ_ECONFIG, "model config: rope_type %d: %s", c->rope_type, why);
  }
  NEED(c->rope_rot >= 0 && c->rope_rot % 2 == 0 && c->rope_rot <= tz_model_head_dim(c),
       "rope_rot %d must be even and at most head_dim %d", c->rope_rot, tz_model_head_dim(c));
  for (int i = 0; c->rope_type == TZ_ROPE_LONGROPE && i < tz_model_rope_dims(c) / 2; i++)
    NEED(isfinite(c->rope_short_factor[i]) && c->rope_short_factor[i] > 0 &&
             isfinite(c->rope_long_factor[i]) && c->rope_long_factor[i] > 0,
         "longrope's factors %d (short %g, long %g) must be positive", i, c->rope_short_factor[i],
         c->rope_long_factor[i]);
  NEED(c->norm_eps >= 0.0, "norm_eps %g must not be negative", c->norm_eps);
  NEED(c->tie_embeddings == 0 || c->tie_embeddings == 1, "tie_embeddings %d must be 0 or 1",
       c->tie_embeddings);
  NEED((unsigned)c->family < TZ_FAMILY_COUNT,
       "family %d is none of the %d of trainer/model/family.c", (int)c->family, TZ_FAMILY_COUNT);
  NEED(c->qkv_bias == 0 || c->qkv_bias == 1, "qkv_bias %d must be 0 or 1", c->qkv_bias);
  NEED(c->qk_norm >= TZ_QK_NORM_NONE && c->qk_norm <= TZ_QK_NORM_ALL,
       "qk_norm %d must be 0 (none), 1 (per head) or 2 (the whole projection)", c->qk_norm);
  NEED(c->norm_place >= TZ_NORM_PRE && c->norm_place <= TZ_NORM_BOTH,
       "norm_place %d must be 0 (before each part), 1 (on its output) or 2 (both)", c->norm_place);
  NEED(c->norm_offset == 0 || c->norm_offset == 1, "norm_offset %d must be 0 or 1", c->norm_offset);
  NEED(c->glu_act == TZ_GLU_SILU || c->glu_act == TZ_GLU_GELU_TANH,
       "glu_act %d must be 0 (silu) or 1 (gelu_pytorch_tanh)", c->glu_act);
  NEED(c->embed_scale == 0 || c->embed_scale == 1, "embed_scale %d must be 0 or 1", c->embed_scale);
  NEED(isfinite(c->attn_scale) && c->attn_scale >= 0.0, "attn_scale %g must not be negative",
       c->attn_scale);
  NEED(isfinite(c->attn_softcap) && c->attn_softcap >= 0.0, "attn_softcap %g must not be negative",
       c->attn_softcap);
  NEED(isfinite(c->final_softcap) && c->final_softcap >= 0.0,
       "final_softcap %g must not be negative", c->final_softcap);
  NEED(isfinite(c->rope_attn_factor) && c->rope_attn_factor >= 0.0,
       "rope_attn_factor %g must not be negative", c->rope_attn_factor);
  NEED(isfinite(c->rope_local_theta) && c->rope_local_theta >= 0.0,
       "rope_local_theta %g must not be negative", c->rope_local_theta);
  NEED(c->window_from >= 0, "window_from %d must not be negative", c->window_from);
  NEED(c->sliding_window >= 0 && c->window_pattern >= 0,
       "sliding_window %d and window_pattern %d must not be negative", c->sliding_window,
       c->window_pattern);
  NEED(isfinite(c->init_std) && c->init_std >= 0.0,
       "init_std %g must be finite and not negative (0: the presets' initialisation)", c->init_std);
  NEED(c->has_bos == 0 || c->has_bos == 1, "has_bos %d must be 0 or 1", c->has_bos);
  NEED(c->has_eos == 0 || c->has_eos == 1, "has_eos %d must be 0 or 1", c->has_eos);
  NEED(c->has_pad == 0 || c->has_pad == 1, "has_pad %d must be 0 or 1", c->has_pad);
  if (tz_model_moe(c)) {
    NEED(c->n_expert <= TZ_MOE_MAX_EXPERTS && c->n_expert_used >= 1 &&
             c->n_expert_used <= c->n_expert,
         "n_expert_used %d must be in [1, n_expert %d] and n_expert at most %d", c->n_expert_used,
         c->n_expert, TZ_MOE_MAX_EXPERTS);
    NEED(c->moe_ffn_dim > 0, "moe_ffn_dim %d must be positive", c->moe_ffn_dim);
    NEED(c->norm_topk == 0 || c->norm_topk == 1, "norm_topk %d must be 0 or 1", c->norm_topk);
    NEED(isfinite(c->router_aux_coef) && c->router_aux_coef >= 0.0,
         "router_aux_coef %g must be finite and not negative", c->router_aux_coef);
    NEED(c->moe_aux == 0 || c->moe_aux == 1, "moe_aux %d must be 0 or 1", c->moe_aux);
    NEED(c->shared_ffn_dim >= 0 && (int64_t)c->shared_ffn_dim * c->d_model < INT32_MAX,
         "shared_ffn_dim %d must not be negative", c->shared_ffn_dim);
    NEED(c->norm_place == TZ_NORM_PRE,
         "experts with norm_place %d: the mixture-of-experts layers have their norms before each "
         "part only",
         c->norm_place);
    NEED((int64_t)c->n_expert * c->moe_ffn_dim * c->d_model < INT32_MAX,
         "the experts' %d x %d x %d weights have more than 2^31 elements", c->n_expert,
         c->moe_ffn_dim, c->d_model);
  } else {
    NEED(c->n_expert == 0, "n_expert %d must not be negative", c->n_expert);
    NEED(c->shared_ffn_dim == 0, "shared_ffn_dim %d without experts", c->shared_ffn_dim);
  }
  /* Offsets are 64-bit, but the compute ops take int dimensions. */
  NEED((int64_t)c->vocab * c->d_model < INT32_MAX,
       "the embedding's vocab (vocab_size) %d x d_model (hidden_size) %d has more than 2^31 "
       "elements",
       c->vocab, c->d_model);
  NEED((int64_t)c->ffn_dim * c->d_model < INT32_MAX,
       "the MLP's ffn_dim (intermediate_size) %d x d_model (hidden_size) %d has more than 2^31 "
       "elements",
       c->ffn_dim, c->d_model);
  NEED((int64_t)c->n_head * tz_model_head_dim(c) * c->d_model < INT32_MAX,
       "the attention's n_head (num_attention_heads) %d x head_dim %d x d_model (hidden_size) %d "
       "has more than 2^31 elements",
       c->n_head, tz_model_head_dim(c), c->d_model);
#undef NEED
  return 0;
}

double tz_model_attn_scale(const struct tz_model_config *cfg) {
  double af = cfg->rope_attn_factor;
  if (af <= 0 || af == 1.0 || cfg->rope_rot) /* partial rotary: the rope's (tz_model_rope) */
    return cfg->attn_scale;
  double s = cfg->attn_scale > 0 ? cfg->attn_scale : 1.0 / sqrt((double)tz_model_head_dim(cfg));
  return s * af * af;
}

const char *tz_model_variant(const struct tz_model_config *cfg, int T) {
  return cfg->attn_softcap > 0                                ? "soft-capped attention scores"
         : cfg->sliding_window > 0 && cfg->sliding_window < T ? "sliding-window attention"
         : tz_model_attn_scale(cfg) > 0 ? "an attention scale other than 1/sqrt(head_dim)"
         : cfg->norm_offset             ? "(1 + w) norms"
         : cfg->glu_act                 ? "the gelu_pytorch_tanh gate"
         : cfg->final_softcap > 0       ? "soft-capped logits"
         : cfg->rope_rot > 0 && cfg->rope_rot < tz_model_head_dim(cfg) ? "partial rotary"
                                                                       : NULL;
}

int tz_model_layer_slides(const struct tz_model_config *cfg, int layer) {
  return layer >= cfg->window_from &&
         (cfg->window_pattern <= 0 || (layer + 1) % cfg->window_pattern != 0);
}

int tz_model_backend_check(const struct tz_model_config *cfg, const char *backend,
                           const char *settings, int T) {
  if (tz_model_moe(cfg)) {
    int moe = tz_compute_moe(backend);
    if (moe < 0)
      return moe;
    if (moe == 1 && cfg->shared_ffn_dim > 0)
      return tz_err_set(TZ_ENOTSUP,
                        "model_type %s on the %s backend: its shared expert's gate runs on the "
                        "cpu backend only until the %s backend has a kernel for it (--backend "
                        "cpu)",
                        tz_model_family_name(cfg->family), backend, backend);
    if (!moe)
      return tz_err_set(TZ_ENOTSUP,
                        "model_type %s on the %s backend: its mixture-of-experts layers run on "
                        "the cpu backend only until the %s backend has kernels for them "
                        "(--backend cpu)",
                        tz_model_family_name(cfg->family), backend, backend);
  }
  const char *variant = tz_model_variant(cfg, T);
  if (!variant)
    return 0;
  int has = tz_compute_variants(backend, settings);
  if (has < 0)
    return has;
  if (has)
    return 0;
  return tz_err_set(TZ_ENOTSUP,
                    "model_type %s on the %s backend: the %s backend computes its %s only with "
                    "its setting variants on (tierzero.cuda_variants, TZ_CUDA_VARIANTS; the "
                    "default), which this run turned off; --backend cpu computes it too",
                    tz_model_family_name(cfg->family), backend, backend, variant);
}

int tz_model_layer_window(const struct tz_model_config *cfg, int layer) {
  return cfg->sliding_window > 0 && tz_model_layer_slides(cfg, layer) ? cfg->sliding_window : 0;
}

void tz_model_layer_rope(const struct tz_model_config *cfg, int layer, int T, struct tz_rope *out) {
  tz_model_rope(cfg, out);
  if (cfg->rope_type == TZ_ROPE_LONGROPE && T > cfg->rope_original_max_pos)
    out->ext_factors = cfg->rope_long_factor;
  if (cfg->rope_local_theta > 0 && tz_model_layer_slides(cfg, layer))
    *out = (struct tz_rope){
        .theta = cfg->rope_local_theta, .type = TZ_ROPE_DEFAULT, .rot = cfg->rope_rot};
}

int tz_model_head_dim(const struct tz_model_config *cfg) {
  return cfg->head_dim ? cfg->head_dim : cfg->d_model / cfg->n_head;
}

int tz_model_rope_dims(const struct tz_model_config *cfg) {
  return cfg->rope_rot ? cfg->rope_rot : tz_model_head_dim(cfg);
}

void tz_model_rope(const struct tz_model_config *cfg, struct tz_rope *out) {
  *out = (struct tz_rope){.theta = cfg->rope_theta,
                          .type = cfg->rope_type == TZ_MODEL_ROPE_DYNAMIC
                                      ? TZ_ROPE_DEFAULT
                                      : (enum tz_rope_type)cfg->rope_type,
                          .factor = cfg->rope_factor,
                          .low_freq_factor = cfg->rope_low_freq_factor,
                          .high_freq_factor = cfg->rope_high_freq_factor,
                          .original_max_pos = cfg->rope_original_max_pos,
                          .beta_fast = cfg->rope_beta_fast,
                          .beta_slow = cfg->rope_beta_slow,
                          .truncate = cfg->rope_truncate,
                          .ext_factors = cfg->rope_short_factor,
                          .rot = cfg->rope_rot,
                          .mscale = cfg->rope_rot ? cfg->rope_attn_factor : 0.0};
}
