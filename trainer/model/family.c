/* The table of model families (family.h). */
#include "trainer/model/family.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

const struct tz_family tz_families[TZ_FAMILY_COUNT] = {
    [TZ_FAMILY_LLAMA] = {.id = TZ_FAMILY_LLAMA,
                         .model_type = "llama",
                         .architecture = "LlamaForCausalLM",
                         .max_pos = 2048,
                         .window = TZ_WINDOW_NONE,
                         .export_keys = "{\"attention_bias\": false, \"mlp_bias\": false, "
                                        "\"pretraining_tp\": 1}"},
    [TZ_FAMILY_MISTRAL] = {.id = TZ_FAMILY_MISTRAL,
                           .model_type = "mistral",
                           .architecture = "MistralForCausalLM",
                           .max_pos = 131072,
                           .window = TZ_WINDOW_ALWAYS,
                           .window_default = 4096,
                           .export_keys = "{}"},
    [TZ_FAMILY_QWEN2] = {.id = TZ_FAMILY_QWEN2,
                         .model_type = "qwen2",
                         .architecture = "Qwen2ForCausalLM",
                         .max_pos = 32768,
                         .qkv_bias = 1,
                         .window = TZ_WINDOW_OPT_IN,
                         .export_keys = "{}"},
    [TZ_FAMILY_QWEN3] = {.id = TZ_FAMILY_QWEN3,
                         .model_type = "qwen3",
                         .architecture = "Qwen3ForCausalLM",
                         .max_pos = 32768,
                         .qk_norm = 1,
                         .window = TZ_WINDOW_OPT_IN,
                         .export_keys = "{\"attention_bias\": false}"},
    [TZ_FAMILY_OLMO2] = {.id = TZ_FAMILY_OLMO2,
                         .model_type = "olmo2",
                         .architecture = "Olmo2ForCausalLM",
                         .max_pos = 2048,
                         .qk_norm = TZ_QK_NORM_ALL,
                         .norm_place = TZ_NORM_POST,
                         .window = TZ_WINDOW_NONE,
                         .export_keys = "{\"attention_bias\": false}"},
    [TZ_FAMILY_PHI3] = {.id = TZ_FAMILY_PHI3,
                        .model_type = "phi3",
                        .architecture = "Phi3ForCausalLM",
                        .max_pos = 4096,
                        .fused_proj = 1,
                        .partial_rotary = 1,
                        .window = TZ_WINDOW_ALWAYS,
                        .window_default = 0,
                        .export_keys = "{\"resid_pdrop\": 0.0, \"embd_pdrop\": 0.0}"},
    [TZ_FAMILY_GEMMA2] = {.id = TZ_FAMILY_GEMMA2,
                          .tie_default = 1,
                          .model_type = "gemma2",
                          .architecture = "Gemma2ForCausalLM",
                          .max_pos = 8192,
                          .norm_place = TZ_NORM_BOTH,
                          .window = TZ_WINDOW_LAYERS,
                          .window_default = 4096,
                          .window_pattern = 2,
                          .gemma = 1,
                          .query_pre_attn_scalar = 256,
                          .attn_softcap = 50.0,
                          .final_softcap = 30.0,
                          .export_keys = "{\"attention_bias\": false, \"hidden_activation\": "
                                         "\"gelu_pytorch_tanh\", \"hidden_act\": "
                                         "\"gelu_pytorch_tanh\", \"cache_implementation\": "
                                         "\"hybrid\"}"},
    [TZ_FAMILY_GEMMA3] = {.id = TZ_FAMILY_GEMMA3,
                          .tie_default = 1,
                          .model_type = "gemma3_text",
                          .architecture = "Gemma3ForCausalLM",
                          .max_pos = 131072,
                          .qk_norm = TZ_QK_NORM_HEAD,
                          .norm_place = TZ_NORM_BOTH,
                          .window = TZ_WINDOW_LAYERS,
                          .window_default = 4096,
                          .window_pattern = 6,
                          .gemma = 1,
                          .query_pre_attn_scalar = 256,
                          .rope_local = 1,
                          .rope_theta_default = 1000000.0,
                          .export_keys = "{\"attention_bias\": false, \"hidden_activation\": "
                                         "\"gelu_pytorch_tanh\", \"use_bidirectional_attention\": "
                                         "false}"},
    [TZ_FAMILY_QWEN3_MOE] = {.id = TZ_FAMILY_QWEN3_MOE,
                             .model_type = "qwen3_moe",
                             .architecture = "Qwen3MoeForCausalLM",
                             .max_pos = 32768,
                             .qk_norm = 1,
                             .window = TZ_WINDOW_OPT_IN,
                             .moe_module = "mlp",
                             .expert_proj = {"gate_proj", "up_proj", "down_proj"},
                             .moe_width_key = "moe_intermediate_size",
                             .norm_topk_default = 0,
                             .n_expert_key = "num_experts",
                             .router_aux_default = 0.001,
                             .export_keys = "{\"attention_bias\": false, \"decoder_sparse_step\": "
                                            "1, \"mlp_only_layers\": []}"},
    [TZ_FAMILY_MIXTRAL] = {.id = TZ_FAMILY_MIXTRAL,
                           .model_type = "mixtral",
                           .architecture = "MixtralForCausalLM",
                           .max_pos = 131072,
                           .window = TZ_WINDOW_ALWAYS,
                           .window_default = 0,
                           .moe_module = "block_sparse_moe",
                           .expert_proj = {"w1", "w3", "w2"},
                           .moe_width_key = "intermediate_size",
                           .topk_norm = 1,
                           .n_expert_key = "num_local_experts",
                           .router_aux_default = 0.001,
                           .rope_theta_default = 1000000.0,
                           .export_keys = "{\"router_jitter_noise\": 0.0}"},
    [TZ_FAMILY_OLMOE] = {.id = TZ_FAMILY_OLMOE,
                         .model_type = "olmoe",
                         .architecture = "OlmoeForCausalLM",
                         .max_pos = 4096,
                         .qk_norm = TZ_QK_NORM_ALL,
                         .window = TZ_WINDOW_NONE,
                         .moe_module = "mlp",
                         .expert_proj = {"gate_proj", "up_proj", "down_proj"},
                         .moe_width_key = "intermediate_size",
                         .norm_topk_default = 0,
                         .n_expert_key = "num_experts",
                         .router_aux_default = 0.01,
                         .export_keys = "{\"attention_bias\": false, \"clip_qkv\": null}"},
    [TZ_FAMILY_QWEN2_MOE] = {.id = TZ_FAMILY_QWEN2_MOE,
                             .model_type = "qwen2_moe",
                             .architecture = "Qwen2MoeForCausalLM",
                             .max_pos = 32768,
                             .qkv_bias = 1,
                             .window = TZ_WINDOW_OPT_IN,
                             .moe_module = "mlp",
                             .expert_proj = {"gate_proj", "up_proj", "down_proj"},
                             .moe_width_key = "moe_intermediate_size",
                             .norm_topk_default = 0,
                             .n_expert_key = "num_experts",
                             .router_aux_default = 0.001,
                             .shared_expert = 1,
                             .export_keys = "{\"qkv_bias\": true, \"decoder_sparse_step\": 1, "
                                            "\"mlp_only_layers\": []}"},
};

const struct tz_family *tz_family_of(enum tz_model_family f) {
  return (unsigned)f < TZ_FAMILY_COUNT ? &tz_families[f] : NULL;
}

const struct tz_family *tz_family_find(const char *model_type) {
  for (int f = 0; model_type && f < TZ_FAMILY_COUNT; f++)
    if (strcmp(model_type, tz_families[f].model_type) == 0)
      return &tz_families[f];
  return NULL;
}

const char *tz_model_family_name(enum tz_model_family f) {
  return (unsigned)f < TZ_FAMILY_COUNT ? tz_families[f].model_type : NULL;
}

const char *tz_model_family_architecture(enum tz_model_family f) {
  return (unsigned)f < TZ_FAMILY_COUNT ? tz_families[f].architecture : NULL;
}

int tz_model_family_parse(const char *model_type, enum tz_model_family *out) {
  const struct tz_family *r = tz_family_find(model_type);
  if (!r)
    return tz_err_set(TZ_ENOENT, "model_type \"%s\" is not one of %s",
                      model_type ? model_type : "(null)", tz_family_list());
  *out = r->id;
  return 0;
}

static char family_list[256];
static pthread_once_t family_list_once = PTHREAD_ONCE_INIT;

static void family_list_init(void) {
  size_t at = 0;
  for (int f = 0; f < TZ_FAMILY_COUNT && at < sizeof family_list; f++)
    at += (size_t)snprintf(family_list + at, sizeof family_list - at, "%s%s",
                           f == 0                     ? ""
                           : f == TZ_FAMILY_COUNT - 1 ? " and "
                                                      : ", ",
                           tz_families[f].model_type);
}

const char *tz_family_list(void) {
  pthread_once(&family_list_once, family_list_init);
  return family_list;
}

char *tz_family_table_json(void) {
  static const char *const windows[] = {"none", "always", "opt-in", "layers"};
  static const char *const qk_norms[] = {"none", "head", "all"}, *const places[] = {"pre", "post",
                                                                                    "both"};
  json_t *a = json_array();
  for (int f = 0; a && f < TZ_FAMILY_COUNT; f++) {
    const struct tz_family *r = &tz_families[f];
    json_t *keys = json_loads(r->export_keys, 0, NULL);
    json_t *o = json_pack(
        "{s:s, s:s, s:i, s:b, s:b, s:s, s:s, s:b, s:b, s:s, s:i, s:i, s:b, s:f, s:f, s:f, s:s?, "
        "s:s?, s:b, s:b, s:s?, s:o}",
        "model_type", r->model_type, "architecture", r->architecture, "max_position_embeddings",
        r->max_pos, "tie_word_embeddings", r->tie_default, "qkv_bias", r->qkv_bias, "qk_norm",
        qk_norms[r->qk_norm], "norm_place", places[r->norm_place], "fused_proj", r->fused_proj,
        "partial_rotary", r->partial_rotary, "window", windows[r->window], "window_default",
        r->window_default, "window_pattern", r->window_pattern, "gemma", r->gemma,
        "query_pre_attn_scalar", r->query_pre_attn_scalar, "attn_logit_softcapping",
        r->attn_softcap, "final_logit_softcapping", r->final_softcap, "moe_module", r->moe_module,
        "moe_width_key", r->moe_width_key, "topk_norm", r->topk_norm, "shared_expert",
        r->shared_expert, "n_expert_key", r->n_expert_key, "export_keys",
        keys ? keys : json_object());
    if (!o || json_array_append_new(a, o) < 0) {
      json_decref(a);
      return NULL;
    }
  }
  char *s = a ? json_dumps(a, JSON_INDENT(1)) : NULL;
  json_decref(a);
  return s;
}
