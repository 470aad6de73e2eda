/* Hugging Face config.json in and out, generation_config.json and the tokenizer's files (hf.h;
 * the tensors and shards are hf.c's). */
#define _GNU_SOURCE
#include "trainer/model/hf.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "trainer/model/family.h"
#include "trainer/model/hf_internal.h"
#include "util/file.h"
#include "util/input.h"

char *tz_hf_join(const char *dir, const char *name) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", dir, name) < 0)
    return NULL;
  return p;
}

/* ---- config.json ---- */

/* An integer key in [lo, hi]; absent or null: dflt unless required. */
static int get_int(const struct tz_hf_cfgp *p, const char *key, int required, int dflt, int64_t lo,
                   int64_t hi, int *out) {
  json_t *v = tz_hf_jget(p, key);
  char t[100];
  if (!v) {
    if (required)
      return tz_err_set(TZ_ECONFIG, "%s: missing \"%s\"", p->path, key);
    *out = dflt;
    return 0;
  }
  if (!json_is_integer(v))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" must be an integer, not %s", p->path, key,
                      tz_hf_jtext(v, t, sizeof t));
  json_int_t x = json_integer_value(v);
  if (x < lo || x > hi)
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" is %lld, outside the supported range [%lld, %lld]",
                      p->path, key, (long long)x, (long long)lo, (long long)hi);
  *out = (int)x;
  return 0;
}

static int get_bool(const struct tz_hf_cfgp *p, const char *key, int dflt, int *out) {
  json_t *v = tz_hf_jget(p, key);
  char t[100];
  if (!v) {
    *out = dflt;
    return 0;
  }
  if (!json_is_boolean(v))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" must be true or false, not %s", p->path, key,
                      tz_hf_jtext(v, t, sizeof t));
  *out = json_is_true(v);
  return 0;
}

/* A token id key: an integer in [0, vocab), or null / absent (*has 0); eos_token_id may be a
 * list, kept in ids[0..*n) (its first is the id). */
static int get_id(const struct tz_hf_cfgp *p, const char *key, int vocab, int *has, int *id,
                  int *ids, int *n) {
  json_t *v = tz_hf_jget(p, key);
  char t[100];
  *has = 0;
  if (n)
    *n = 0;
  if (!v)
    return 0;
  size_t count = json_is_array(v) ? json_array_size(v) : 1;
  if ((json_is_array(v) && !n) || (!json_is_array(v) && !json_is_integer(v)))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" must be an integer%s, not %s", p->path, key,
                      n ? " or a list of integers" : "", tz_hf_jtext(v, t, sizeof t));
  if (count > TZ_HF_MAX_EOS)
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" lists %zu ids, more than the %d supported", p->path,
                      key, count, TZ_HF_MAX_EOS);
  for (size_t i = 0; i < count; i++) {
    json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
    if (!json_is_integer(e))
      return tz_err_set(TZ_ECONFIG, "%s: \"%s\" must hold integers, not %s", p->path, key,
                        tz_hf_jtext(e, t, sizeof t));
    json_int_t x = json_integer_value(e);
    if (x < 0 || x >= vocab)
      return tz_err_set(TZ_ECONFIG,
                        "%s: \"%s\" %lld is outside the vocabulary [0, %d) of vocab_size", p->path,
                        key, (long long)x, vocab);
    if (i == 0) {
      *id = (int)x;
      *has = 1;
    }
    if (n)
      ids[(*n)++] = (int)x;
  }
  return 0;
}

/* The experts of a family with them (trainer/model/family.h, moe_module): every layer sparse, top-k
 * of a softmax router, with the family's renormalisation; routing variants refused by name. */
static int parse_moe(const struct tz_hf_cfgp *p, struct tz_model_config *cfg) {
  const struct tz_family *fam = tz_family_of(cfg->family);
  char t[100];
  json_t *v;
  int a = 0, b = 0;
  TZ_CHECK(get_int(p, "num_experts", 0, 0, 1, TZ_MOE_MAX_EXPERTS, &a));
  TZ_CHECK(get_int(p, "num_local_experts", 0, 0, 1, TZ_MOE_MAX_EXPERTS, &b));
  if (!a && !b)
    return tz_err_set(TZ_ECONFIG, "%s: missing \"num_experts\" (or \"num_local_experts\")",
                      p->path);
  if (a && b && a != b)
    return tz_err_set(TZ_ECONFIG, "%s: \"num_experts\" %d and \"num_local_experts\" %d disagree",
                      p->path, a, b);
  cfg->n_expert = a ? a : b;
  TZ_CHECK(get_int(p, "num_experts_per_tok", 1, 0, 1, cfg->n_expert, &cfg->n_expert_used));
  TZ_CHECK(get_int(p, fam->moe_width_key, 1, 0, 1, 1 << 24, &cfg->moe_ffn_dim));
  if (fam->topk_norm)
    cfg->norm_topk = 1;
  else
    TZ_CHECK(get_bool(p, "norm_topk_prob", fam->norm_topk_default, &cfg->norm_topk));
  TZ_CHECK(tz_hf_num_of(p, p->root, "", "router_aux_loss_coef", 0, fam->router_aux_default,
                        &cfg->router_aux_coef));
  if (cfg->router_aux_coef < 0)
    return tz_err_set(TZ_ECONFIG, "%s: \"router_aux_loss_coef\" %g must not be negative", p->path,
                      cfg->router_aux_coef);
  TZ_CHECK(get_bool(p, "output_router_logits", 0, &cfg->moe_aux));
  if (fam->shared_expert) {
    TZ_CHECK(get_int(p, "shared_expert_intermediate_size", 1, 0, 1, 1 << 24, &cfg->shared_ffn_dim));
    if ((v = tz_hf_jget(p, "qkv_bias")) && !json_is_true(v))
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"qkv_bias\" is %s: model_type %s is implemented with its q, k and v "
                        "biases",
                        p->path, tz_hf_jtext(v, t, sizeof t), fam->model_type);
  }
  /* every layer sparse: Qwen's decoder_sparse_step 1 and no mlp_only_layers */
  int step = 1;
  TZ_CHECK(get_int(p, "decoder_sparse_step", 0, 1, 1, 1 << 16, &step));
  if (step != 1)
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"decoder_sparse_step\" is %d: layers with dense MLPs between the "
                      "sparse ones are not implemented (1: every layer sparse)",
                      p->path, step);
  if ((v = tz_hf_jget(p, "mlp_only_layers")) && !(json_is_array(v) && json_array_size(v) == 0))
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"mlp_only_layers\" is %s: dense layers among the sparse ones are not "
                      "implemented",
                      p->path, tz_hf_jtext(v, t, sizeof t));
  if ((v = tz_hf_jget(p, "router_jitter_noise")) &&
      !(json_is_number(v) && json_number_value(v) == 0.0))
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"router_jitter_noise\" is %s: the router's noise in training is not "
                      "implemented (0 routes as transformers does without it)",
                      p->path, tz_hf_jtext(v, t, sizeof t));
  if ((v = tz_hf_jget(p, "clip_qkv")) && !json_is_null(v))
    return tz_err_set(TZ_ENOTSUP, "%s: \"clip_qkv\" is %s: clipping q, k and v is not implemented",
                      p->path, tz_hf_jtext(v, t, sizeof t));
  static const char *const routing[] = {"n_group",
                                        "topk_group",
                                        "scoring_func",
                                        "routed_scaling_factor",
                                        "moe_layer_freq",
                                        "n_shared_experts",
                                        "shared_expert_intermediate_size",
                                        "capacity_factor"};
  for (size_t i = 0; i < sizeof routing / sizeof routing[0]; i++)
    if ((v = tz_hf_jget(p, routing[i])) && !json_is_null(v) &&
        !(fam->shared_expert && strcmp(routing[i], "shared_expert_intermediate_size") == 0))
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"%s\" is %s: routing here is a softmax's top-k over every expert, "
                        "without groups, scaling, shared experts or capacity",
                        p->path, routing[i], tz_hf_jtext(v, t, sizeof t));
  return 0;
}

/* Keys whose presence (with a value other than these) means computation the model does not do. */
static int refuse_unsupported(const struct tz_hf_cfgp *p, const struct tz_model_config *cfg) {
  char t[100];
  json_t *v;
  const struct tz_family *fam = tz_family_of(cfg->family);
  /* Gemma's gate activation is hidden_activation's (its config class has no hidden_act) */
  if (fam->gemma) {
    if ((v = tz_hf_jget(p, "hidden_activation")) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "gelu_pytorch_tanh")))
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"hidden_activation\" is %s: model_type %s's MLP is implemented "
                        "with \"gelu_pytorch_tanh\" only",
                        p->path, tz_hf_jtext(v, t, sizeof t), fam->model_type);
  } else if ((v = tz_hf_jget(p, "hidden_act")) &&
             (!json_is_string(v) || strcmp(json_string_value(v), "silu"))) {
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"hidden_act\" is %s: the MLP is SwiGLU, only \"silu\" is implemented",
                      p->path, tz_hf_jtext(v, t, sizeof t));
  }
  if ((v = tz_hf_jget(p, "mlp_bias")) && !json_is_false(v))
    return tz_err_set(TZ_ENOTSUP, "%s: \"mlp_bias\" is %s: the MLP projections have no biases here",
                      p->path, tz_hf_jtext(v, t, sizeof t));
  /* Where q, k and v biases are the family's definition (qwen2), its attention_bias key means
   * nothing to transformers and is not read. The other families have no bias at all, and
   * llama's attention_bias would also put one on o_proj. */
  if (!fam->qkv_bias && (v = tz_hf_jget(p, "attention_bias")) && !json_is_false(v))
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"attention_bias\" is %s: model_type %s with attention biases (on "
                      "q/k/v and o_proj) is not implemented",
                      p->path, tz_hf_jtext(v, t, sizeof t), fam->model_type);
  /* experts in a family without them, or routing variants no family here has */
  static const char *const experts[] = {"n_routed_experts", "num_experts", "num_local_experts"};
  for (size_t i = 0; i < (fam->moe_module ? 1u : 3u); i++)
    if ((v = tz_hf_jget(p, experts[i])) && !(json_is_integer(v) && json_integer_value(v) == 0))
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"%s\" is %s: mixture-of-experts layers are implemented for %s "
                        "(model_type %s has none)",
                        p->path, experts[i], tz_hf_jtext(v, t, sizeof t),
                        "qwen3_moe, mixtral and olmoe", fam->model_type);
  /* Training here has no dropout: a config that asks for it would train differently from
   * transformers' model in train mode. */
  static const char *const drops[] = {"attention_dropout", "resid_pdrop", "embd_pdrop",
                                      "hidden_dropout", "dropout"};
  for (size_t i = 0; i < sizeof drops / sizeof drops[0]; i++)
    if ((v = tz_hf_jget(p, drops[i])) && !(json_is_number(v) && json_number_value(v) == 0.0))
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"%s\" is %s: dropout is not implemented (0 trains "
                        "as transformers does)",
                        p->path, drops[i], tz_hf_jtext(v, t, sizeof t));
  static const char *const caps[] = {"attn_logit_softcapping", "final_logit_softcapping"};
  for (int i = 0; i < 2 && !fam->gemma; i++)
    if ((v = tz_hf_jget(p, caps[i])))
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"%s\" is %s: logit softcapping is implemented for the Gemma "
                        "families only",
                        p->path, caps[i], tz_hf_jtext(v, t, sizeof t));
  if ((v = tz_hf_jget(p, "use_bidirectional_attention")) && !json_is_false(v))
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"use_bidirectional_attention\" is %s: attention is causal here",
                      p->path, tz_hf_jtext(v, t, sizeof t));
  /* a window opted into (qwen2, qwen3) is parse_window's, its layer_types with it */
  json_t *use = tz_hf_jget(p, "use_sliding_window");
  int opted = fam->window == TZ_WINDOW_OPT_IN && use && !json_is_false(use);
  if ((v = tz_hf_jget(p, "layer_types")) && fam->window != TZ_WINDOW_LAYERS && !opted) {
    if (!json_is_array(v) || json_array_size(v) != (size_t)cfg->n_layer)
      return tz_err_set(TZ_ECONFIG,
                        "%s: \"layer_types\" must be a list of num_hidden_layers (%d) strings, "
                        "not %s",
                        p->path, cfg->n_layer, tz_hf_jtext(v, t, sizeof t));
    for (size_t i = 0; i < json_array_size(v); i++) {
      json_t *e = json_array_get(v, i);
      if (!json_is_string(e) || strcmp(json_string_value(e), "full_attention") != 0)
        return tz_err_set(TZ_ENOTSUP,
                          "%s: \"layer_types\"[%zu] is %s: only \"full_attention\" layers are "
                          "implemented",
                          p->path, i, tz_hf_jtext(e, t, sizeof t));
    }
  }
  return 0;
}

/* layer_types, when given, against the layers cfg slides (tz_model_layer_slides, with the
 * window fields already set): one entry a layer, "sliding_attention" where it slides and
 * "full_attention" elsewhere; rule says the family's rule in the refusal. */
static int check_layer_types(const struct tz_hf_cfgp *p, const struct tz_model_config *cfg,
                             const char *rule) {
  json_t *v = tz_hf_jget(p, "layer_types");
  char t[100];
  if (!v)
    return 0;
  if (!json_is_array(v) || json_array_size(v) != (size_t)cfg->n_layer)
    return tz_err_set(TZ_ECONFIG,
                      "%s: \"layer_types\" must be a list of num_hidden_layers (%d) strings, "
                      "not %s",
                      p->path, cfg->n_layer, tz_hf_jtext(v, t, sizeof t));
  for (int i = 0; i < cfg->n_layer; i++) {
    json_t *e = json_array_get(v, (size_t)i);
    const char *want = tz_model_layer_slides(cfg, i) ? "sliding_attention" : "full_attention";
    if (!json_is_string(e) || strcmp(json_string_value(e), want) != 0)
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"layer_types\"[%d] is %s where %s has \"%s\": other patterns are "
                        "not implemented",
                        p->path, i, tz_hf_jtext(e, t, sizeof t), rule, want);
  }
  return 0;
}

/* Qwen's window (TZ_WINDOW_OPT_IN): with use_sliding_window true, sliding_window (4096 when
 * absent, null none) on the layers from max_window_layers (28 when absent) on, as transformers'
 * Qwen2Config makes layer_types; layer_types given must be that. */
static int parse_opt_in_window(const struct tz_hf_cfgp *p, struct tz_model_config *cfg) {
  json_t *use = tz_hf_jget(p, "use_sliding_window"),
         *raw = json_object_get(p->root, "sliding_window");
  char t[100];
  if (!use || json_is_false(use))
    return 0; /* the window's value, if any, unused */
  if (!json_is_true(use))
    return tz_err_set(TZ_ECONFIG, "%s: \"use_sliding_window\" must be true or false, not %s",
                      p->path, tz_hf_jtext(use, t, sizeof t));
  if (raw && json_is_null(raw))
    return 0;
  TZ_CHECK(get_int(p, "sliding_window", 0, 4096, 1, INT32_MAX, &cfg->sliding_window));
  TZ_CHECK(get_int(p, "max_window_layers", 0, 28, 0, INT32_MAX, &cfg->window_from));
  cfg->window_pattern = 0;
  char rule[96];
  snprintf(rule, sizeof rule, "Qwen's rule (the layers from max_window_layers, %d, on slide)",
           cfg->window_from);
  return check_layer_types(p, cfg, rule);
}

/* TZ_WINDOW_LAYERS (gemma2): the window of the sliding layers, and layer_types, when given, the
 * family's pattern (family.h). */
static int parse_layer_windows(const struct tz_hf_cfgp *p, struct tz_model_config *cfg) {
  const struct tz_family *fam = tz_family_of(cfg->family);
  json_t *raw = json_object_get(p->root, "sliding_window"); /* an integer or null (parse_window) */
  /* hub configs of Gemma 3 say the pattern as sliding_window_pattern */
  TZ_CHECK(get_int(p, "sliding_window_pattern", 0, fam->window_pattern, 1, 1 << 16,
                   &cfg->window_pattern));
  if (!raw)
    cfg->sliding_window = fam->window_default;
  else if (json_is_null(raw))
    cfg->sliding_window = 0;
  else
    TZ_CHECK(get_int(p, "sliding_window", 0, 0, 1, INT32_MAX, &cfg->sliding_window));
  char rule[96];
  snprintf(rule, sizeof rule, "model_type %s's pattern (every %d%s layer full, the others sliding)",
           fam->model_type, cfg->window_pattern, cfg->window_pattern == 2 ? "nd" : "th");
  return check_layer_types(p, cfg, rule);
}

/* The family's attention window (its row's window rule): mistral's sliding_window applies to every
 * layer (transformers' MistralConfig defaults it to 4096 when absent; null is none); the Qwen
 * families' applies only with use_sliding_window (parse_opt_in_window); Gemma's to the layers of
 * its pattern (parse_layer_windows); llama has none. *window: an every-layer window's value. */
static int parse_window(const struct tz_hf_cfgp *p, struct tz_model_config *cfg, int *window) {
  json_t *raw = json_object_get(p->root, "sliding_window");
  *window = 0;
  if (raw && !json_is_null(raw) && !json_is_integer(raw)) {
    char t[100];
    return tz_err_set(TZ_ECONFIG, "%s: \"sliding_window\" must be an integer or null, not %s",
                      p->path, tz_hf_jtext(raw, t, sizeof t));
  }
  const struct tz_family *fam = tz_family_of(cfg->family);
  if (fam->window == TZ_WINDOW_OPT_IN)
    return parse_opt_in_window(p, cfg);
  if (fam->window == TZ_WINDOW_LAYERS)
    return parse_layer_windows(p, cfg);
  if (fam->window != TZ_WINDOW_ALWAYS)
    return 0;
  if (!raw)
    *window = fam->window_default;
  else
    TZ_CHECK(get_int(p, "sliding_window", 0, 0, 1, INT32_MAX, window));
  cfg->sliding_window = *window; /* every layer (window_pattern 0) */
  return 0;
}

/* Gemma's scale and softcaps (family.h, gemma): the key's number, the family's default when
 * absent; a softcap null is none (0), a scalar must be positive. */
static int parse_gemma(const struct tz_hf_cfgp *p, struct tz_model_config *cfg) {
  const struct tz_family *fam = tz_family_of(cfg->family);
  cfg->norm_offset = 1;
  cfg->embed_scale = 1;
  cfg->glu_act = TZ_GLU_GELU_TANH;
  double qpas;
  TZ_CHECK(
      tz_hf_num_of(p, p->root, "", "query_pre_attn_scalar", 0, fam->query_pre_attn_scalar, &qpas));
  if (!(qpas > 0) || !isfinite(qpas))
    return tz_err_set(TZ_ECONFIG, "%s: \"query_pre_attn_scalar\" %g must be positive", p->path,
                      qpas);
  cfg->attn_scale = 1.0 / sqrt(qpas);
  const char *keys[2] = {"attn_logit_softcapping", "final_logit_softcapping"};
  double dflt[2] = {fam->attn_softcap, fam->final_softcap};
  double *out[2] = {&cfg->attn_softcap, &cfg->final_softcap};
  for (int i = 0; i < 2; i++) {
    json_t *v = json_object_get(p->root, keys[i]);
    if (v && json_is_null(v)) {
      *out[i] = 0;
      continue;
    }
    TZ_CHECK(tz_hf_num_of(p, p->root, "", keys[i], 0, dflt[i], out[i]));
    if (!v && dflt[i] == 0) /* the family has none by default (gemma3_text) */
      continue;
    if (!(*out[i] > 0) || !isfinite(*out[i]))
      return tz_err_set(TZ_ECONFIG, "%s: \"%s\" %g must be positive (null: none)", p->path, keys[i],
                        *out[i]);
  }
  return 0;
}

static int parse_config(json_t *root, const char *path, struct tz_model_config *cfg,
                        enum tz_dtype *dtype, struct tz_hf_info *info) {
  struct tz_hf_cfgp p = {.root = root, .path = path, .partial = 1.0};
  char t[100];
  if (!json_is_object(root))
    return tz_err_set(TZ_ECONFIG, "%s: not a JSON object", path);
  memset(cfg, 0, sizeof *cfg);
  memset(info, 0, sizeof *info);
  snprintf(info->path, sizeof info->path, "%s", path);
  /* A config without model_type is taken as llama, as before the other families. */
  json_t *mt = tz_hf_jget(&p, "model_type");
  if (mt && !json_is_string(mt))
    return tz_err_set(TZ_ECONFIG, "%s: \"model_type\" must be a string, not %s", path,
                      tz_hf_jtext(mt, t, sizeof t));
  if (mt && tz_model_family_parse(json_string_value(mt), &cfg->family) < 0)
    return tz_err_set(TZ_ENOTSUP, "%s: \"model_type\" is \"%s\": the families are %s", path,
                      json_string_value(mt), tz_family_list());
  const struct tz_family *fam = tz_family_of(cfg->family);
  const char *arch = fam->architecture;
  json_t *ar = tz_hf_jget(&p, "architectures");
  if (ar) {
    int ok = json_is_array(ar);
    for (size_t i = 0; ok && i < json_array_size(ar); i++)
      ok = json_is_string(json_array_get(ar, i)) &&
           strcmp(json_string_value(json_array_get(ar, i)), arch) == 0;
    if (!ok)
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"architectures\" is %s: model_type %s is read as [\"%s\"] only", path,
                        tz_hf_jtext(ar, t, sizeof t), fam->model_type, arch);
  }
  /* Limits: what the int fields and the kernels take; the model's own check follows. */
  TZ_CHECK(get_int(&p, "hidden_size", 1, 0, 1, 1 << 20, &cfg->d_model));
  TZ_CHECK(get_int(&p, "num_hidden_layers", 1, 0, 1, 1 << 16, &cfg->n_layer));
  TZ_CHECK(get_int(&p, "num_attention_heads", 1, 0, 1, 1 << 16, &cfg->n_head));
  TZ_CHECK(get_int(&p, "num_key_value_heads", 0, cfg->n_head, 1, 1 << 16, &cfg->n_kv_head));
  TZ_CHECK(get_int(&p, "intermediate_size", 1, 0, 1, 1 << 24, &cfg->ffn_dim));
  TZ_CHECK(get_int(&p, "vocab_size", 1, 0, 1, INT32_MAX, &cfg->vocab));
  TZ_CHECK(get_int(&p, "max_position_embeddings", 0, fam->max_pos, 1, INT32_MAX, &cfg->max_seq));
  if (cfg->n_head % cfg->n_kv_head != 0)
    return tz_err_set(TZ_ECONFIG,
                      "%s: \"num_attention_heads\" %d is not a multiple of "
                      "\"num_key_value_heads\" %d",
                      path, cfg->n_head, cfg->n_kv_head);
  int hd = 0;
  TZ_CHECK(get_int(&p, "head_dim", 0, 0, 1, TZ_ROPE_MAX_D, &hd));
  if (!hd && cfg->d_model % cfg->n_head != 0)
    return tz_err_set(TZ_ECONFIG,
                      "%s: \"hidden_size\" %d is not a multiple of \"num_attention_heads\" %d "
                      "and there is no \"head_dim\"",
                      path, cfg->d_model, cfg->n_head);
  if (!hd && cfg->d_model / cfg->n_head > TZ_ROPE_MAX_D)
    return tz_err_set(TZ_ECONFIG,
                      "%s: the head dimension hidden_size / num_attention_heads = %d is above "
                      "the limit %d",
                      path, cfg->d_model / cfg->n_head, TZ_ROPE_MAX_D);
  int D = hd ? hd : cfg->d_model / cfg->n_head;
  if (D % 2 != 0)
    return tz_err_set(TZ_ECONFIG, "%s: %s %d is odd: RoPE rotates pairs of a head's dimensions",
                      path, hd ? "\"head_dim\"" : "hidden_size / num_attention_heads", D);
  /* Stored as 0 when it is the default, so that such a config is the one of before head_dim. */
  cfg->head_dim = cfg->d_model % cfg->n_head == 0 && D == cfg->d_model / cfg->n_head ? 0 : D;
  TZ_CHECK(refuse_unsupported(&p, cfg));
  TZ_CHECK(parse_window(&p, cfg, &info->sliding_window));
  if (fam->moe_module)
    TZ_CHECK(parse_moe(&p, cfg));
  if (fam->gemma)
    TZ_CHECK(parse_gemma(&p, cfg));
  TZ_CHECK(tz_hf_rope_read(&p, fam, cfg));
  TZ_CHECK(tz_hf_num_of(&p, root, "", "rms_norm_eps", 0, 1e-6, &cfg->norm_eps));
  if (cfg->norm_eps < 0)
    return tz_err_set(TZ_ECONFIG, "%s: \"rms_norm_eps\" %g must not be negative", path,
                      cfg->norm_eps);
  TZ_CHECK(tz_hf_num_of(&p, root, "", "initializer_range", 0, 0.02, &cfg->init_std));
  if (cfg->init_std <= 0)
    return tz_err_set(TZ_ECONFIG, "%s: \"initializer_range\" %g must be positive", path,
                      cfg->init_std);
  TZ_CHECK(get_bool(&p, "tie_word_embeddings", fam->tie_default, &cfg->tie_embeddings));
  cfg->qkv_bias = fam->qkv_bias;
  cfg->qk_norm = fam->qk_norm;
  cfg->norm_place = fam->norm_place;
  TZ_CHECK(get_id(&p, "bos_token_id", cfg->vocab, &cfg->has_bos, &cfg->bos_id, NULL, NULL));
  TZ_CHECK(
      get_id(&p, "eos_token_id", cfg->vocab, &cfg->has_eos, &cfg->eos_id, info->eos, &info->n_eos));
  TZ_CHECK(get_id(&p, "pad_token_id", cfg->vocab, &cfg->has_pad, &cfg->pad_id, NULL, NULL));
  {
    /* transformers 5 writes "dtype", earlier versions and most hub configs "torch_dtype" */
    enum tz_dtype local;
    if (!dtype)
      dtype = &local;
    *dtype = TZ_F32;
    const char *key = "torch_dtype";
    json_t *dt = tz_hf_jget(&p, key);
    if (!dt) {
      key = "dtype";
      dt = tz_hf_jget(&p, key);
    }
    if (dt && (!json_is_string(dt) || tz_dtype_parse(json_string_value(dt), dtype) < 0))
      return tz_err_set(TZ_ECONFIG, "%s: \"%s\" %s is not float32, bfloat16 or float16", path, key,
                        tz_hf_jtext(dt, t, sizeof t));
  }
  int rc = tz_model_config_check(cfg);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(rc, "%s: %s", path, why);
  }
  return 0;
}

int tz_hf_config_read_info(const char *path, struct tz_model_config *cfg, enum tz_dtype *dtype,
                           struct tz_hf_info *info) {
  struct stat sb;
  struct tz_hf_info local;
  if (!info)
    info = &local;
  /* A directory, or a path that is neither a file nor a *.json name, is a model directory: the
   * message then names the config.json looked for. */
  size_t pl = strlen(path);
  int is_file =
      stat(path, &sb) == 0 ? !S_ISDIR(sb.st_mode) : pl >= 5 && strcmp(path + pl - 5, ".json") == 0;
  char *file = is_file ? strdup(path) : tz_hf_join(path, "config.json");
  if (!file)
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  json_error_t jerr;
  json_t *root = tz_input_json(file, JSON_REJECT_DUPLICATES, &jerr);
  int rc;
  if (!root) {
    rc = access(file, R_OK) != 0 ? tz_err_errno(errno, "hf: cannot read %s", file)
                                 : tz_err_set(TZ_ECONFIG, "%s: line %d column %d: %s", file,
                                              jerr.line, jerr.column, jerr.text);
  } else {
    rc = parse_config(root, file, cfg, dtype, info);
  }
  json_decref(root);
  free(file);
  return rc;
}

int tz_hf_config_read(const char *path, struct tz_model_config *cfg, enum tz_dtype *dtype) {
  return tz_hf_config_read_info(path, cfg, dtype, NULL);
}

/* ---- config.json and generation_config.json out ---- */

/* r as text with the fewest digits that read back to the same numbers (1e-06, not
 * 9.9999999999999995e-07), as Python's json writes them. */
static char *dump_shortest(json_t *r) {
  for (int p = 1; p <= 17; p++) {
    char *text = json_dumps(r, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(p));
    json_t *back = text ? json_loads(text, 0, NULL) : NULL;
    int same = back && json_equal(back, r);
    json_decref(back);
    if (same || p == 17 || !text)
      return text;
    free(text);
  }
  return NULL;
}

int tz_hf_write_json(const char *dir, const char *name, json_t *r) {
  char *text = dump_shortest(r);
  char *path = tz_hf_join(dir, name), *line = NULL;
  int rc;
  if (text && path && (line = malloc(strlen(text) + 2)))
    sprintf(line, "%s\n", text);
  if (!line)
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
  else
    rc = tz_atomic_write_file(path, line, strlen(line), &(struct tz_atomic_params){.what = "hf"});
  free(line);
  free(text);
  free(path);
  return rc;
}

static json_t *id_json(int has, int id) { return has ? json_integer(id) : json_null(); }

/* eos_token_id: the source's list when it starts with cfg's eos, else the one id. */
static json_t *eos_json(const struct tz_model_config *cfg, const struct tz_hf_info *info) {
  if (!cfg->has_eos)
    return json_null();
  if (!info || info->n_eos < 2 || info->eos[0] != cfg->eos_id)
    return json_integer(cfg->eos_id);
  json_t *a = json_array();
  for (int i = 0; i < info->n_eos; i++)
    json_array_append_new(a, json_integer(info->eos[i]));
  return a;
}

static const char *dtype_torch(enum tz_dtype dt) {
  return dt == TZ_BF16 ? "bfloat16" : dt == TZ_F16 ? "float16" : "float32";
}

/* Decimal digits of the shortest %g text of x that reads back to x. */
static int shortest_digits(double x) {
  char buf[40];
  for (int prec = 1; prec < 17; prec++) {
    snprintf(buf, sizeof buf, "%.*g", prec, x);
    if (strtod(buf, NULL) == x)
      return prec;
  }
  return 17;
}

/* query_pre_attn_scalar back from the scale parse_gemma made of it (1 / sqrt(q)): of the numbers
 * near 1 / scale^2 that give exactly this scale again, the one with the fewest digits, which is
 * the config's own (256, or 39.7: 1 / scale^2 alone may be 39.700000000000003, whose scale
 * differs in the last bit). */
static double qpas_of_scale(double scale) {
  const double q0 = 1.0 / scale / scale; /* scale * scale overflows for a tiny scalar */
  double best = q0;
  int best_digits = 99;
  double c = q0;
  for (int i = 0; i < 16; i++)
    c = nextafter(c, 0.0);
  for (int i = 0; i <= 32; i++, c = nextafter(c, INFINITY)) {
    if (1.0 / sqrt(c) != scale)
      continue;
    int d = shortest_digits(c);
    if (d < best_digits)
      best = c, best_digits = d;
  }
  return best;
}

/* The keys transformers' config class of the family writes (save_pretrained), in both spellings
 * where transformers 5 renamed them (torch_dtype / dtype, rope_theta and rope_scaling /
 * rope_parameters), so that transformers 4 and 5 both read the same model. info (may be NULL):
 * what the source config said beyond cfg. */
int tz_hf_config_write_info(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype,
                            const struct tz_hf_info *info) {
  TZ_CHECK(tz_model_config_check(cfg));
  const struct tz_family *fam = tz_family_of(cfg->family);
  json_t *r = json_object(), *arch = json_array();
  json_array_append_new(arch, json_string(fam->architecture));
  json_object_set_new(r, "architectures", arch);
  json_object_set_new(r, "model_type", json_string(fam->model_type));
  json_object_set_new(r, "hidden_size", json_integer(cfg->d_model));
  json_object_set_new(r, "intermediate_size", json_integer(cfg->ffn_dim));
  json_object_set_new(r, "num_hidden_layers", json_integer(cfg->n_layer));
  json_object_set_new(r, "num_attention_heads", json_integer(cfg->n_head));
  json_object_set_new(r, "num_key_value_heads", json_integer(cfg->n_kv_head));
  json_object_set_new(r, "head_dim", json_integer(tz_model_head_dim(cfg)));
  json_object_set_new(r, "vocab_size", json_integer(cfg->vocab));
  json_object_set_new(r, "max_position_embeddings", json_integer(cfg->max_seq));
  TZ_CHECK(tz_hf_rope_write(r, cfg));
  json_object_set_new(r, "rms_norm_eps", json_real(cfg->norm_eps));
  json_object_set_new(r, "tie_word_embeddings", json_boolean(cfg->tie_embeddings));
  json_object_set_new(r, "hidden_act", json_string("silu"));
  json_object_set_new(r, "attention_dropout", json_real(0.0));
  json_object_set_new(r, "initializer_range", json_real(cfg->init_std > 0 ? cfg->init_std : 0.02));
  json_object_set_new(r, "use_cache", json_true());
  json_object_set_new(r, "bos_token_id", id_json(cfg->has_bos, cfg->bos_id));
  json_object_set_new(r, "eos_token_id", eos_json(cfg, info));
  json_object_set_new(r, "pad_token_id", id_json(cfg->has_pad, cfg->pad_id));
  json_object_set_new(r, "torch_dtype", json_string(dtype_torch(dtype)));
  json_object_set_new(r, "dtype", json_string(dtype_torch(dtype)));
  json_t *keys = json_loads(fam->export_keys, 0, NULL);
  if (!keys) {
    json_decref(r);
    return tz_err_set(TZ_EINVAL, "hf: family %s: its export_keys are not JSON", fam->model_type);
  }
  json_object_update(r, keys);
  json_decref(keys);
  switch (fam->window) {
  case TZ_WINDOW_NONE: break;
  case TZ_WINDOW_ALWAYS:
    /* the model's window, else none */
    json_object_set_new(r, "sliding_window",
                        cfg->sliding_window ? json_integer(cfg->sliding_window) : json_null());
    break;
  case TZ_WINDOW_LAYERS: {
    json_object_set_new(r, "sliding_window",
                        cfg->sliding_window ? json_integer(cfg->sliding_window) : json_null());
    json_t *lt = json_array();
    for (int i = 0; i < cfg->n_layer; i++)
      json_array_append_new(
          lt, json_string((i + 1) % cfg->window_pattern ? "sliding_attention" : "full_attention"));
    json_object_set_new(r, "layer_types", lt);
    json_object_set_new(r, "sliding_window_pattern", json_integer(cfg->window_pattern));
    break;
  }
  case TZ_WINDOW_OPT_IN: {
    int use = cfg->sliding_window > 0;
    json_object_set_new(r, "use_sliding_window", json_boolean(use));
    json_object_set_new(r, "sliding_window", use ? json_integer(cfg->sliding_window) : json_null());
    json_object_set_new(r, "max_window_layers",
                        json_integer(use ? cfg->window_from : cfg->n_layer));
    json_t *lt = json_array();
    for (int i = 0; i < cfg->n_layer; i++)
      json_array_append_new(
          lt, json_string(tz_model_layer_window(cfg, i) ? "sliding_attention" : "full_attention"));
    json_object_set_new(r, "layer_types", lt);
    break;
  }
  }
  if (fam->moe_module) {
    json_object_set_new(r, fam->n_expert_key, json_integer(cfg->n_expert));
    json_object_set_new(r, "num_experts_per_tok", json_integer(cfg->n_expert_used));
    json_object_set_new(r, fam->moe_width_key, json_integer(cfg->moe_ffn_dim));
    if (!fam->topk_norm)
      json_object_set_new(r, "norm_topk_prob", json_boolean(cfg->norm_topk));
    json_object_set_new(r, "router_aux_loss_coef", json_real(cfg->router_aux_coef));
    json_object_set_new(r, "output_router_logits", json_boolean(cfg->moe_aux));
    if (fam->shared_expert)
      json_object_set_new(r, "shared_expert_intermediate_size", json_integer(cfg->shared_ffn_dim));
  }
  if (fam->gemma) {
    double q = qpas_of_scale(cfg->attn_scale);
    json_object_set_new(r, "query_pre_attn_scalar",
                        q == nearbyint(q) && q < 0x1p53 ? json_integer((json_int_t)q)
                                                        : json_real(q));
    json_object_set_new(r, "attn_logit_softcapping",
                        cfg->attn_softcap > 0 ? json_real(cfg->attn_softcap) : json_null());
    json_object_set_new(r, "final_logit_softcapping",
                        cfg->final_softcap > 0 ? json_real(cfg->final_softcap) : json_null());
  }
  int rc = tz_hf_write_json(dir, "config.json", r);
  json_decref(r);
  return rc;
}

int tz_hf_config_write(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype) {
  return tz_hf_config_write_info(dir, cfg, dtype, NULL);
}

/* generation_config.json: the source's (tokenizer_dir), if it has one, with cfg's token ids. */
int tz_hf_generation_write(const char *dir, const struct tz_model_config *cfg,
                           const struct tz_hf_info *info, const char *src_dir) {
  json_t *r = NULL;
  if (src_dir) {
    char *p = tz_hf_join(src_dir, "generation_config.json");
    if (p)
      r = tz_input_json(p, 0, NULL);
    free(p);
    if (r && !json_is_object(r)) {
      json_decref(r);
      r = NULL;
    }
  }
  if (!r) {
    r = json_object();
    json_object_set_new(r, "_from_model_config", json_true());
  }
  if (cfg->has_bos)
    json_object_set_new(r, "bos_token_id", json_integer(cfg->bos_id));
  if (cfg->has_eos) {
    json_t *have = json_object_get(r, "eos_token_id");
    /* a source list that starts with our eos stays: generation stops at any of them */
    if (!(json_is_array(have) && json_integer_value(json_array_get(have, 0)) == cfg->eos_id))
      json_object_set_new(r, "eos_token_id", eos_json(cfg, info));
  }
  if (cfg->has_pad)
    json_object_set_new(r, "pad_token_id", json_integer(cfg->pad_id));
  int rc = tz_hf_write_json(dir, "generation_config.json", r);
  json_decref(r);
  return rc;
}

/* The files of a tokenizer, as transformers' tokenizers save and read them. */
static const char *const tokenizer_files[] = {"tokenizer.json",
                                              "tokenizer_config.json",
                                              "special_tokens_map.json",
                                              "tokenizer.model",
                                              "vocab.json",
                                              "merges.txt",
                                              "vocab.txt",
                                              "added_tokens.json",
                                              "chat_template.jinja"};

int tz_hf_is_tokenizer_file(const char *name) {
  for (size_t i = 0; i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++)
    if (strcmp(name, tokenizer_files[i]) == 0)
      return 1;
  return 0;
}

static int same_file(const char *a, const char *b) {
  struct stat x, y;
  return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static int copy_file(const char *from, const char *to) {
  FILE *fp = fopen(from, "rb");
  if (!fp)
    return tz_err_errno(errno, "hf: cannot read %s", from);
  char *buf = NULL;
  size_t n = 0, cap = 0;
  int rc = 0;
  for (;;) {
    if (n == cap) {
      char *g = realloc(buf, cap = cap ? cap * 2 : 1 << 16);
      if (!g) {
        rc = tz_err_set(TZ_ENOMEM, "hf: out of memory copying %s", from);
        break;
      }
      buf = g;
    }
    size_t got = fread(buf + n, 1, cap - n, fp);
    n += got;
    if (got == 0) {
      if (ferror(fp))
        rc = tz_err_errno(EIO, "hf: cannot read %s", from);
      break;
    }
  }
  fclose(fp);
  if (!rc)
    rc = tz_atomic_write_file(to, buf, n, &(struct tz_atomic_params){.what = "hf"});
  free(buf);
  return rc;
}

int tz_hf_copy_tokenizer(const char *dir, const char *src) {
  int rc = 0;
  for (size_t i = 0; !rc && i < sizeof tokenizer_files / sizeof tokenizer_files[0]; i++) {
    char *from = tz_hf_join(src, tokenizer_files[i]), *to = tz_hf_join(dir, tokenizer_files[i]);
    if (!from || !to)
      rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
    else if (access(from, F_OK) == 0 && !same_file(from, to))
      rc = copy_file(from, to);
    free(from);
    free(to);
  }
  return rc;
}
