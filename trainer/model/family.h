/* The table of model families: one row per Hugging Face model_type, holding everything in which
 * the families differ, so that config reading (hf_config.c), the model's flags, the export,
 * tz-model-check --families (which tools/hf_check.py and the tests read) and the checkers all
 * take it from here. A family that needs no new math is one row here plus its test fixture
 * (docs/model.md, "Adding a family", has the checklist for one that does). */
#ifndef TZ_TRAINER_FAMILY_H
#define TZ_TRAINER_FAMILY_H

#include "trainer/model/model.h"

/* How a family's config says its attention window. */
enum tz_family_window {
  TZ_WINDOW_NONE,   /* no window: a sliding_window key, if present, is only checked for type */
  TZ_WINDOW_ALWAYS, /* sliding_window applies to every layer; window_default when the key is
                       absent, none when it is null (mistral) */
  TZ_WINDOW_OPT_IN, /* sliding_window applies only where use_sliding_window is true, which is
                       refused: windowed layers are not implemented (qwen2, qwen3) */
  TZ_WINDOW_LAYERS, /* sliding_window (window_default when absent, none when null) applies to
                       the layers of the family's pattern (window_pattern), which layer_types,
                       when given, must follow: "full_attention" for layer i when
                       (i + 1) % window_pattern == 0, "sliding_attention" otherwise (gemma2) */
};

struct tz_family {
  enum tz_model_family id;
  const char *model_type;   /* "llama" */
  const char *architecture; /* "LlamaForCausalLM": the only architectures entry read */
  int max_pos;              /* max_position_embeddings where the config has none (the config
                               class's default) */
  int tie_default;          /* tie_word_embeddings where the config has none (the config class's
                               default: true for Gemma's, whose released configs leave it out) */
  int qkv_bias;             /* q, k and v projections carry biases by definition (attention_bias
                               is then not read, as transformers does not) */
  int qk_norm;              /* enum tz_qk_norm: none, over D of each q and k head (qwen3), or
                               over the whole projection (olmo2); before RoPE */
  enum tz_norm_place norm_place; /* before each part (llama) or on its output (olmo2) */
  int fused_proj;     /* the checkpoint holds q, k and v as one self_attn.qkv_proj (rows q, then k,
                         then v) and gate and up as one mlp.gate_up_proj (gate, then up): split on
                         import, fused again on export (phi3) */
  int partial_rotary; /* partial_rotary_factor below 1 allowed: RoPE on the first int(head_dim *
                         factor) dims of each head (phi3: Phi-4-mini) */
  enum tz_family_window window;
  int window_default; /* TZ_WINDOW_ALWAYS, TZ_WINDOW_LAYERS: the window when sliding_window is
                         absent */
  int window_pattern; /* TZ_WINDOW_LAYERS: every window_pattern-th layer attends fully */
  /* Gemma's math (the model config's norm_offset, glu_act, embed_scale, attn_scale, attn_softcap
   * and final_softcap): norms (1 + w), the embedding scaled by sqrt(hidden_size), the gate's
   * activation from hidden_activation (gelu_pytorch_tanh only; hidden_act is not read, as
   * transformers does not), the scores scaled by query_pre_attn_scalar^-1/2 and soft-capped by
   * attn_logit_softcapping, the logits by final_logit_softcapping; each key's default below
   * when absent, a softcap null for none. */
  int gemma;
  double query_pre_attn_scalar, attn_softcap, final_softcap;
  /* The sliding layers' own RoPE (gemma3_text): default type at rope_local_base_freq (10000
   * when absent), or transformers 5's rope_parameters.sliding_attention; the full layers' rope
   * is rope_theta (rope_theta_default when absent) with rope_scaling, or
   * rope_parameters.full_attention. */
  int rope_local;
  double rope_theta_default; /* 0: 10000, the other families' */
  /* Mixture of experts (every layer's MLP): the experts' module within the layer ("mlp"; Mixtral's
   * "block_sparse_moe"), holding `gate` (the router) and experts.<e>.<name> for the gate, up and
   * down projections' names (gate_proj, up_proj, down_proj; Mixtral's w1, w3, w2); the expert
   * count read from num_experts or num_local_experts (transformers 5's Qwen3-MoE writes the
   * latter, the hub's config the former; both must agree), num_experts_per_tok, the expert
   * width from moe_width_key (moe_intermediate_size; intermediate_size for Mixtral and OLMoE),
   * router_aux_loss_coef used only with output_router_logits true (as transformers computes
   * it), and the renormalisation: topk_norm 1 always (Mixtral), else norm_topk_prob (its
   * config class's default norm_topk_default when absent). NULL moe_module: a dense MLP. */
  const char *moe_module;
  const char *expert_proj[3];
  const char *moe_width_key;
  int topk_norm, norm_topk_default;
  const char *n_expert_key;  /* the expert count's key the export writes (num_experts) */
  double router_aux_default; /* router_aux_loss_coef when absent (the config class's) */
  /* a shared expert beside the routed ones (qwen2_moe): shared_expert_intermediate_size wide,
   * <moe_module>.shared_expert.{gate,up,down}_proj and <moe_module>.shared_expert_gate */
  int shared_expert;
  /* The constant keys the family's config class writes (save_pretrained), as a JSON object that
   * the export merges in; the window keys follow from `window`. */
  const char *export_keys;
};

/* The rows, TZ_FAMILY_COUNT of them in enum order. */
extern const struct tz_family tz_families[TZ_FAMILY_COUNT];

/* The row of f; NULL outside the enum. */
const struct tz_family *tz_family_of(enum tz_model_family f);
/* The row of model_type; NULL when no family has it. */
const struct tz_family *tz_family_find(const char *model_type);
/* "llama, mistral, qwen2 and qwen3": every model_type, for messages. */
const char *tz_family_list(void);
/* The table as JSON text (tz-model-check --families): an array of rows with every field above,
 * the window as "none", "always" or "opt-in". The caller frees it. NULL when out of memory. */
char *tz_family_table_json(void);

#endif
