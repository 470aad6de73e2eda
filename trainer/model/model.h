/* The Llama-shaped decoder, written once against the compute ops (kernels/compute.h):
 * token embedding; n_layer blocks of RMSNorm, causal grouped-query self-attention with RoPE,
 * RMSNorm, SwiGLU MLP, each with a residual; final RMSNorm; LM head (tied to the embedding or
 * not); cross-entropy loss. The attention's options (q/k/v biases, q/k norms per head or over the
 * whole projection, a head dim of its own, llama3 RoPE scaling) and where the norms sit (before
 * each part, or on its output before the residual) make it Mistral's, Qwen2's, Qwen3's and OLMo
 * 2's decoders too.
 *
 * Parameters live in blocks: block 0 is the embedding, blocks 1..n_layer the transformer layers,
 * block n_layer+1 the head (final norm and, when untied, the LM head). A block is one flat buffer;
 * a table gives each tensor's offset and shape. Every offset is a multiple of TZ_MODEL_ALIGN
 * elements, so every tensor is 256-byte aligned in f32 and in 16-bit storage alike and the layout
 * (in elements) is the same for every dtype: an fp32 master shard and a bf16 parameter shard of
 * the same block line up element for element. A block is padded (with zeros that no op reads) to
 * a multiple of world_size * TZ_MODEL_ALIGN so that it splits into equal aligned shards.
 *
 * Layer functions take pointers to their block's buffer and to activation buffers, all in the
 * compute backend's memory, so the scheduler can place them anywhere. Gradients accumulate (+=)
 * into gradient blocks of the same layout (dtype G), so micro-batches add up. */
#ifndef TZ_TRAINER_MODEL_H
#define TZ_TRAINER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/compute.h"

/* The families of Hugging Face decoders this model computes. They differ only in the flags below
 * (and the family names the export's model_type and architectures); what each has is its row of
 * the family table (trainer/model/family.c), which is where a new family goes:
 *   llama   (LlamaForCausalLM, Llama 2 and 3.x): no biases, no q/k norm; rope default or llama3
 *   mistral (MistralForCausalLM): as llama; a sliding window at least the training sequence
 *   qwen2   (Qwen2ForCausalLM, Qwen2 and 2.5): q, k and v projections carry biases
 *   qwen3   (Qwen3ForCausalLM, dense): RMSNorm of q and k per head (weight (D)) before RoPE
 *   olmo2   (Olmo2ForCausalLM, OLMo 2): the norms on the attention's and the MLP's outputs before
 *           the residual, none before them; RMSNorm of the whole q and k projections
 *   phi3    (Phi3ForCausalLM, Phi-3 and Phi-4 with full rotary and default RoPE): llama's math,
 *           its checkpoints' q/k/v and gate/up projections fused (trainer/model/hf.c)
 *   gemma2  (Gemma2ForCausalLM, Gemma 2): (1 + w) norms before and after each part, the
 *           tanh-gelu gate, the embedding scaled, the scores scaled by query_pre_attn_scalar and
 *           soft-capped, the logits soft-capped, sliding layers alternating with full ones
 *   gemma3_text (Gemma3ForCausalLM, Gemma 3 1B and the text of the larger ones): Gemma 2's math
 *           without its softcaps, with q/k norms per head, five sliding layers to one full, and
 *           the sliding layers' own RoPE base (rope_local_base_freq)
 *   qwen3_moe (Qwen3MoeForCausalLM): qwen3's attention, every MLP experts (n_expert > 0)
 *   mixtral (MixtralForCausalLM): mistral's attention, experts renormalised always
 *   olmoe   (OlmoeForCausalLM): llama's norms, q/k norms over the whole projections, experts
 *   qwen2_moe (Qwen2MoeForCausalLM, Qwen1.5-MoE, Qwen2-57B-A14B): qwen2's attention, experts and
 *           a gated shared expert (shared_ffn_dim) */
enum tz_model_family {
  TZ_FAMILY_LLAMA = 0,
  TZ_FAMILY_MISTRAL,
  TZ_FAMILY_QWEN2,
  TZ_FAMILY_QWEN3,
  TZ_FAMILY_OLMO2,
  TZ_FAMILY_PHI3,
  TZ_FAMILY_GEMMA2,
  TZ_FAMILY_GEMMA3,
  TZ_FAMILY_QWEN3_MOE,
  TZ_FAMILY_MIXTRAL,
  TZ_FAMILY_OLMOE,
  TZ_FAMILY_QWEN2_MOE,
  TZ_FAMILY_COUNT
};

/* Where a layer's two RMSNorms sit. */
enum tz_norm_place {
  TZ_NORM_PRE = 0, /* x2 = x + attn(norm(x)), out = x2 + mlp(norm(x2)): Llama and most */
  TZ_NORM_POST,    /* x2 = x + norm(attn(x)), out = x2 + norm(mlp(x2)): OLMo 2 */
  TZ_NORM_BOTH,    /* x2 = x + norm(attn(norm(x))), out = x2 + norm(mlp(norm(x2))): Gemma 2, 3 */
};

/* The q/k norms: none, RMSNorm over D of each head (Qwen3), or over the whole projection, H*D
 * for q and Hkv*D for k (OLMo 2); either way before RoPE. */
enum tz_qk_norm { TZ_QK_NORM_NONE = 0, TZ_QK_NORM_HEAD, TZ_QK_NORM_ALL };

struct tz_model_config {
  int d_model;        /* C */
  int n_layer;        /* L */
  int n_head;         /* H */
  int n_kv_head;      /* Hkv; n_head % n_kv_head == 0 (grouped-query attention when smaller) */
  int ffn_dim;        /* F, the SwiGLU hidden width */
  int vocab;          /* V */
  int max_seq;        /* the longest sequence T */
  double rope_theta;  /* RoPE base */
  double norm_eps;    /* RMSNorm epsilon (every norm of the model, q/k norms included) */
  int tie_embeddings; /* 1: the LM head is the embedding matrix */
  /* Zero in every field below is the Llama 2 shape of the presets. */
  int head_dim;                /* D, even; 0: d_model / n_head (which must divide) */
  enum tz_model_family family; /* for names only: the math follows the flags */
  int qkv_bias;                /* 1: q, k and v projections add a bias (bq (H*D), bk, bv) */
  int qk_norm;    /* enum tz_qk_norm: q_norm, k_norm of (D) per head, or (H*D), (Hkv*D) for ALL */
  int norm_place; /* enum tz_norm_place: PRE has attn_norm and mlp_norm, POST attn_post_norm and
                     mlp_post_norm (the layer tensors below), BOTH all four */
  /* RoPE scaling (struct tz_rope of kernels/compute.h without theta): rope_type 0 default,
   * 1 llama3 with the other four fields, 2 linear with rope_factor, 3 yarn with rope_factor,
   * rope_original_max_pos, rope_beta_fast, rope_beta_slow and rope_truncate, 4 longrope,
   * TZ_MODEL_ROPE_DYNAMIC with rope_factor */
  int rope_type;
  double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
  int rope_original_max_pos;
  /* Initialisation: 0 is the presets' (tz_model_init_block); > 0 initialises as transformers does
   * the family (normal(0, init_std) for every matrix and the embedding, norms 1, biases 0) */
  double init_std;
  /* Token ids the export writes (config.json, generation_config.json): bos, eos and pad, each
   * valid when has_<id> is 1 (ids from an import or a data sidecar) */
  int has_bos, has_eos, has_pad;
  int bos_id, eos_id, pad_id;
  /* Gemma's math (zero: Llama's; kernels/compute.h has each op's):
   *   norm_offset    1: every norm scales by (1 + w), the weights stored as transformers stores
   *                  them (zero at initialisation)
   *   glu_act        enum tz_glu of the MLP's gate: TZ_GLU_SILU, TZ_GLU_GELU_TANH
   *   embed_scale    1: the embedding's output times sqrt(d_model) rounded to the storage dtype
   *                  (transformers' normalizer), its gradient likewise
   *   attn_scale     the attention scores' scale (query_pre_attn_scalar^-1/2); 0: 1/sqrt(D)
   *   attn_softcap   > 0: the scores soft-capped (attn_logit_softcapping)
   *   final_softcap  > 0: the logits soft-capped (final_logit_softcapping)
   *   sliding_window > 0: the sliding layers' attention window (tz_model_layer_window);
   *   window_pattern with it: 0 every layer slides; k > 0 layer i attends fully when
   *                  (i + 1) % k == 0 and slides otherwise (Gemma 2: 2, Gemma 3: 6)
   *   rope_local_theta > 0: the sliding layers' RoPE, default type with this base (Gemma 3's
   *                  rope_local_base_freq); the full layers keep the model's rope */
  int norm_offset, glu_act, embed_scale;
  double attn_scale, attn_softcap, final_softcap;
  int sliding_window, window_pattern;
  int window_from; /* with sliding_window: the layers below it attend fully (Qwen's
                      max_window_layers); 0: from the first */
  double rope_local_theta;
  /* yarn (rope_type 3): the ramp's bounds and rounding, and the attention factor transformers
   * multiplies cos and sin by (0: 1), here the scores' scale times its square where the whole
   * head rotates, the rope's cos and sin with partial rotary (rope_rot) */
  double rope_beta_fast, rope_beta_slow;
  int rope_truncate;
  double rope_attn_factor;
  /* longrope (rope_type 4, Phi-3.5): head_dim / 2 factors each, the short ones at sequences of
   * at most rope_original_max_pos tokens and the long ones above (transformers picks by the
   * positions' length), and rope_attn_factor as yarn's */
  double rope_short_factor[TZ_ROPE_MAX_D / 2], rope_long_factor[TZ_ROPE_MAX_D / 2];
  /* partial rotary (Phi-4-mini's partial_rotary_factor): RoPE rotates the first rope_rot dims of
   * each head (even, at most head_dim; the longrope factors are rope_rot / 2), the rest pass;
   * 0: all of them */
  int rope_rot;
  /* Mixture of experts (Qwen3-MoE, Mixtral, OLMoE; 0 experts: the dense MLP of ffn_dim). Every
   * layer's MLP is n_expert SwiGLU experts of width moe_ffn_dim (F_e), each token sent to the
   * n_expert_used (k) of largest softmax(router) probability and their outputs added with those
   * probabilities as weights, divided by their sum when norm_topk (Mixtral always; Qwen3-MoE and
   * OLMoE by norm_topk_prob). router_aux_coef is transformers' router_aux_loss_coef, moe_aux its
   * output_router_logits: with both, the load-balancing loss times the coefficient is added to
   * the loss (tz_model_aux_coef). ffn_dim is then unused (kept for the export). */
  int n_expert, n_expert_used, moe_ffn_dim, norm_topk;
  double router_aux_coef;
  int moe_aux;
  /* With experts, a shared expert (Qwen2-MoE): a SwiGLU of width shared_ffn_dim every token
   * goes through, its output times sigmoid(x shared_gate^T) added to the experts'; 0: none */
  int shared_ffn_dim;
  /* The dense MLP runs over chunks of this many tokens (rows) in the forward, the recompute and
   * the backward, so that its (rows, F) intermediates (a, and the backward's da, dg, du) are a
   * chunk's, not the whole micro-batch's; 0: auto, tz_model_mlp_rows. Every chunk's weight
   * gradients add into the same sums in chunk order, so the bits are fixed by this and the shape.
   */
  int mlp_chunk;
  /* The head (logits, loss and their backward) runs over chunks of this many tokens, so that the
   * logits are a chunk's; 0: auto, tz_model_head_rows. The head's weight gradient adds each
   * chunk's product in chunk order, so the bits are fixed by this and the shape. */
  int head_chunk;
};

/* The first of the variants (Gemma's math, sliding windows) that cfg uses on sequences of T tokens
 * ("soft-capped attention scores", ...), which only backends with the variants compute
 * (kernels/compute.h: the cpu one); NULL for none. A window of T or more is no window. */
const char *tz_model_variant(const struct tz_model_config *cfg, int T);

/* 0 when backend, with its settings string (tz_compute_variants), computes cfg on sequences of T
 * tokens; else TZ_ENOTSUP naming the family, the backend and the variant (tz_model_variant) it
 * refuses, or the settings' error. */
int tz_model_backend_check(const struct tz_model_config *cfg, const char *backend,
                           const char *settings, int T);

/* The scores' scale (kernels/compute.h, struct tz_attn_opts; 0: 1/sqrt(D)): attn_scale, times
 * yarn's attention factor squared where it is not 1. */
double tz_model_attn_scale(const struct tz_model_config *cfg);

/* Whether layer i is of the sliding kind (transformers' layer_types "sliding_attention"), from
 * window_from and window_pattern, whatever its window. */
int tz_model_layer_slides(const struct tz_model_config *cfg, int layer);

/* The attention window of layer i (0-based) of cfg: 0 for full attention. */
int tz_model_layer_window(const struct tz_model_config *cfg, int layer);
/* The rope layer i rotates by on sequences of T tokens: the sliding layers' with
 * rope_local_theta, else the model's (longrope's short or long factors by T). */
void tz_model_layer_rope(const struct tz_model_config *cfg, int layer, int T, struct tz_rope *out);

/* rope_type "dynamic" (dynamic NTK): transformers raises the base only at sequences above
 * max_position_embeddings, which the model never trains (tz_model_check_batch), so below it the
 * rope is the default one; the type is kept for the export. */
#define TZ_MODEL_ROPE_DYNAMIC 5

/* The rope the kernels take for cfg (longrope: its short factors; dynamic: the default). */
void tz_model_rope(const struct tz_model_config *cfg, struct tz_rope *out);
/* The family's model_type ("llama") and its CausalLM class name, from the family table; NULL for
 * a value outside the enum. */
const char *tz_model_family_name(enum tz_model_family f);
const char *tz_model_family_architecture(enum tz_model_family f);
/* TZ_ENOENT naming the value and the list for a model_type the family table lacks. */
int tz_model_family_parse(const char *model_type, enum tz_model_family *out);

/* Presets: "tiny" (tests and the demo: byte vocabulary), "llama-1b", "llama-3b", "llama-7b",
 * "llama-13b". TZ_ENOENT for another name, with the list in the message. */
int tz_model_preset(const char *name, struct tz_model_config *out);
int tz_model_preset_count(void);
const char *tz_model_preset_name(int i); /* NULL past the end */

/* TZ_ECONFIG, naming the field, when a config cannot describe a model. */
int tz_model_config_check(const struct tz_model_config *cfg);
int tz_model_head_dim(const struct tz_model_config *cfg);
/* The dims RoPE rotates in each head: rope_rot, or head_dim (partial rotary aside). */
int tz_model_rope_dims(const struct tz_model_config *cfg); /* D */
/* Parameters of the model, without padding; the tied head is counted once. */
uint64_t tz_model_n_params(const struct tz_model_config *cfg);
/* The parameters a token's forward uses: tz_model_n_params less, with experts, the
 * n_expert - n_expert_used experts it is not routed to in each layer (the MoE's "active"). */
uint64_t tz_model_n_active_params(const struct tz_model_config *cfg);

/* ---- Blocks and their layout ---- */

#define TZ_MODEL_ALIGN 128 /* elements: 256 bytes of bf16/fp16, 512 of f32 */

/* The blocks in order: the embedding, each layer's, the head. A layer is one block, or with experts
 * two: its attention part (TZ_BLOCK_LAYER) and its MLP part, the router and the experts
 * (TZ_BLOCK_MOE), so that the plan places the experts, most of such a model's state, apart from
 * the attention, and the scheduler streams them as blocks of their own. */
enum tz_block_kind { TZ_BLOCK_EMBED, TZ_BLOCK_LAYER, TZ_BLOCK_HEAD, TZ_BLOCK_MOE };

/* Tensor indices inside each kind of block (the order of the layout table). */
enum { TZ_E_WTE, TZ_E_COUNT };
/* A layer block has every TZ_L_* entry (n == TZ_L_COUNT); the tensors a config does not have
 * (biases without qkv_bias, q/k norms without qk_norm, the norms of the other norm_place) have
 * numel 0, ndim 0, no room in the block, so a Llama layer's layout is what it was before they
 * existed. Code that walks a layout skips numel-0 entries. With experts, a layer's two blocks
 * each have every entry too, the other part's (TZ_PART_*) without room: the MLP's block holds
 * mlp_norm, wg, wu, wd, mlp_post_norm, the router and the shared expert, the layer's block the
 * rest. */
enum {
  TZ_L_ATTN_NORM,      /* (C) with TZ_NORM_PRE */
  TZ_L_WQ,             /* (H*D, C): q = x wq^T (+ bq) */
  TZ_L_WK,             /* (Hkv*D, C) */
  TZ_L_WV,             /* (Hkv*D, C) */
  TZ_L_WO,             /* (C, H*D) */
  TZ_L_MLP_NORM,       /* (C) with TZ_NORM_PRE */
  TZ_L_WG,             /* (F, C): gate */
  TZ_L_WU,             /* (F, C): up */
  TZ_L_WD,             /* (C, F): down */
  TZ_L_BQ,             /* (H*D) with qkv_bias */
  TZ_L_BK,             /* (Hkv*D) with qkv_bias */
  TZ_L_BV,             /* (Hkv*D) with qkv_bias */
  TZ_L_QNORM,          /* (D) with qk_norm HEAD, (H*D) with ALL */
  TZ_L_KNORM,          /* (D) with qk_norm HEAD, (Hkv*D) with ALL */
  TZ_L_ATTN_POST_NORM, /* (C) with TZ_NORM_POST: on the attention's output, before the residual */
  TZ_L_MLP_POST_NORM,  /* (C) with TZ_NORM_POST: on the MLP's output */
  TZ_L_ROUTER,         /* (E, C) with experts: the router's logits = x router^T; then wg and wu
                          are (E*F_e, C), expert e's rows e*F_e.., and wd (E*C, F_e), expert e's
                          rows e*C.. */
  TZ_L_SWG,            /* (F_s, C) with a shared expert: its gate, up and down projections */
  TZ_L_SWU,            /* (F_s, C) */
  TZ_L_SWD,            /* (C, F_s) */
  TZ_L_SGATE,          /* (1, C): its gate's logit = x shared_gate^T */
  TZ_L_COUNT
};
enum {
  TZ_H_NORM, /* (C) */
  TZ_H_LM,   /* (V, C); absent when tie_embeddings (the head uses the embedding's wte) */
  TZ_H_COUNT
};

struct tz_param_info {
  const char *name; /* short name: "wte", "attn_norm", "wq", ... "norm", "lm_head" */
  uint64_t offset;  /* elements from the block's start; a multiple of TZ_MODEL_ALIGN */
  int ndim;         /* 1 or 2 */
  int64_t shape[2]; /* row-major; shape[1] is 1 for a vector */
  uint64_t numel;
};

struct tz_block_layout {
  enum tz_block_kind kind;
  int layer; /* 0-based transformer layer for TZ_BLOCK_LAYER, else -1 */
  int n;     /* tensors in t[] */
  struct tz_param_info t[TZ_L_COUNT];
  uint64_t numel; /* the end of the last tensor, rounded up to TZ_MODEL_ALIGN */
};

/* n_layer * tz_model_layer_blocks + 2 */
int tz_model_n_blocks(const struct tz_model_config *cfg);
/* The blocks of each layer: 1, or 2 with experts (the MLP's block right after the layer's). */
int tz_model_layer_blocks(const struct tz_model_config *cfg);
/* A layer's first block: 1 + layer * tz_model_layer_blocks. */
int tz_model_block_of_layer(const struct tz_model_config *cfg, int layer);
/* The layer a block belongs to; -1 for the embedding and the head. */
int tz_model_block_layer(const struct tz_model_config *cfg, int block);
/* The parts of its layer (TZ_PART_* bits) a block holds: TZ_PARTS_ALL for a dense layer's,
 * TZ_PART_ATTN or TZ_PART_MLP for a layer with experts, 0 for the embedding and the head. */
int tz_model_block_parts(const struct tz_model_config *cfg, int block);
/* TZ_EINVAL for a block outside [0, n_blocks). */
int tz_model_block_layout(const struct tz_model_config *cfg, int block,
                          struct tz_block_layout *out);
uint64_t tz_model_block_numel(const struct tz_model_config *cfg, int block);
/* The block's size rounded up to a multiple of world_size * TZ_MODEL_ALIGN (world_size >= 1):
 * world_size equal shards, each a multiple of TZ_MODEL_ALIGN elements. */
uint64_t tz_model_block_numel_padded(const struct tz_model_config *cfg, int block, int world_size);
/* A layer's blocks one after the other, as one buffer (tests, tz-bench layer): its elements; its
 * layout, every tensor's offset from the first block's start (the MLP's after the layer's
 * block with experts); the blocks' addresses in such a buffer base of dtype dt (w[1] == w[0]
 * for a layer of one block), for tz_model_layer_fwd. */
uint64_t tz_model_layer_numel(const struct tz_model_config *cfg);
int tz_model_layer_layout(const struct tz_model_config *cfg, struct tz_block_layout *out);
void tz_model_layer_split(const struct tz_model_config *cfg, void *base, enum tz_dtype dt,
                          void *w[2]);
/* tz_model_block_numel_padded summed over a layer's blocks (all layers have one layout). */
uint64_t tz_model_layer_numel_padded(const struct tz_model_config *cfg, int world_size);

/* ---- Initialisation ----
 * Each element is a function of (seed, block, tensor, index within the tensor) only, so any
 * range of any block can be filled independently (a rank its shard) with the same numbers at every
 * world size: a splitmix64 hash of those four gives two uniforms, turned into a normal by
 * Box-Muller. With init_std == 0 (the presets): weights ~ normal(0, 0.02); the two projections
 * that write into the residual stream (wo and wd) ~ normal(0, 0.02 / sqrt(2 * n_layer)), as GPT-2
 * and Llama reference training do, so the residual's variance does not grow with depth. With
 * init_std > 0, as transformers' _init_weights: every matrix and the embedding ~ normal(0,
 * init_std), and the embedding's pad_id row 0 when has_pad. Both: RMSNorm weights (q/k norms
 * too) = 1; biases = 0; padding = 0.
 * Fills out[0 .. end-begin) with elements [begin, end) of the block (f32, host memory). */
int tz_model_init_block(const struct tz_model_config *cfg, int block, uint64_t seed, uint64_t begin,
                        uint64_t end, float *out);

/* ---- Mixture of experts ---- */

/* 1 when cfg's MLPs are experts. */
static inline int tz_model_moe(const struct tz_model_config *cfg) { return cfg->n_expert > 0; }
/* The load-balancing loss's coefficient in the loss: router_aux_coef with moe_aux, else 0. */
static inline double tz_model_aux_coef(const struct tz_model_config *cfg) {
  return tz_model_moe(cfg) && cfg->moe_aux ? cfg->router_aux_coef : 0.0;
}

/* The load-balancing loss of one micro-batch (transformers' load_balancing_loss_func without an
 * attention mask) from stats, the sums over its n_layer layers of tz_compute_moe_route's
 * statistics (2E floats: assignments, then probs summed, per expert), each layer routing `rows`
 * tokens: with R = rows * n_layer rows in all, E * sum_e (count_e / R) (probs_e / R). daux (E),
 * unless NULL, receives its gradient at each row's probs times scale: scale * E * count_e / R^2
 * (the counts are constants of the routing), which the layers' backward adds (moe_daux). */
double tz_model_moe_aux(const struct tz_model_config *cfg, const float *stats, int rows,
                        double scale, float *daux);

/* ---- Parameter blocks in backend memory ---- */

/* One buffer per block (tz_model_block_numel elements of the storage dtype of cm each), zeroed.
 * *out is an array of n_blocks pointers; free both with tz_model_blocks_free. */
int tz_model_blocks_alloc(tz_compute *cm, const struct tz_model_config *cfg, void ***out);
void tz_model_blocks_free(tz_compute *cm, const struct tz_model_config *cfg, void **blocks);
/* Every block initialised by tz_model_init_block(seed) and stored in the storage dtype. */
int tz_model_blocks_init(tz_compute *cm, const struct tz_model_config *cfg, uint64_t seed,
                         void *const *blocks);
/* n host floats <-> n elements of the storage dtype in backend memory (cast on the backend);
 * synchronous. */
int tz_model_block_upload(tz_compute *cm, void *dst, const float *src, uint64_t n);
int tz_model_block_download(tz_compute *cm, float *dst, const void *src, uint64_t n);

/* ---- Activations (backend memory, storage dtype S unless said; N = B*T) ---- */

/* What one layer's forward keeps for its backward. */
struct tz_layer_acts {
  void *h1;     /* (N, C) attention-norm output */
  float *rstd1; /* (N) F32 */
  void *q;      /* (N, H*D) after RoPE (and the q norm before it, with qk_norm) */
  void *k;      /* (N, Hkv*D) after RoPE (and the k norm) */
  void *v;      /* (N, Hkv*D) */
  void *att;    /* (N, H*D) attention output, before wo */
  float *lse;   /* (B, H, T) F32 logsumexp of the scores */
  void *x2;     /* (N, C) the residual stream after attention */
  void *h2;     /* (N, C) MLP-norm output */
  float *rstd2; /* (N) F32 */
  void *g;      /* (N, F) gate projection, or one MLP chunk's rows when gu_chunk */
  void *u;      /* (N, F) up projection, the same */
  int gu_chunk; /* 1: g and u hold one chunk (tz_model_mlp_rows), the trainer's working acts
                   (tz_model_acts_work_carve), whose MLP the backward recomputes chunk by chunk */
  void *a;      /* (rows, F) silu(g) * u of one chunk (tz_model_mlp_rows) */
  /* With experts (n_expert > 0), g, u and a are (M, F_e) for the M = N*k assignments grouped by
   * expert, and the MLP part also keeps the routing (kernels/compute.h, struct tz_moe_route) and
   * the experts' outputs y; the router's logits and the gathered inputs xs are rebuilt. */
  void *y;          /* (M, C) each assignment's expert output */
  float *probs;     /* (N, E) F32 */
  int32_t *idx;     /* (N, k) */
  float *rw;        /* (N, k) F32 the routing weights */
  int32_t *offsets; /* (E+1) */
  int32_t *rows;    /* (M) */
  int32_t *slot;    /* (M) */
  void *xs;         /* (M, C) the MLP norm's output of each assignment's token */
  void *rlogits;    /* (N, E) the router's logits */
  /* with a shared expert: its gate and up projections and output (kept with the MLP part), its
   * gate's logits (kept), its SwiGLU (rebuilt) */
  void *sg, *su, *ys, *slog, *sa;
  /* Set by the caller, never carved: moe_stats (2E F32, or NULL) receives += the forward's
   * routing statistics (tz_compute_moe_route's; a recompute adds none), and moe_daux (E F32, or
   * NULL) is the load-balancing loss's gradient at each row's probs (tz_model_moe_aux) that the
   * backward adds. */
  float *moe_stats;
  const float *moe_daux;
  /* With qk_norm only (NULL and no room otherwise): the q and k projections (with their biases)
   * before the norms, and the norms' statistics, one per head and token (HEAD) or per token
   * (ALL). */
  void *q_pre;   /* (N, H*D) */
  void *k_pre;   /* (N, Hkv*D) */
  float *rstd_q; /* (N*H) or (N) F32 */
  float *rstd_k; /* (N*Hkv) or (N) F32 */
  /* With TZ_NORM_POST only (where h1, rstd1, h2 and rstd2 are NULL: the parts read x_in and x2
   * themselves): each part's output before its norm, and the norm's statistics. */
  void *o;       /* (N, C) att wo^T */
  float *rstd_o; /* (N) F32 */
  void *m;       /* (N, C) the MLP's down projection */
  float *rstd_m; /* (N) F32 */
};

/* Scratch for a layer's backward, shared by all layers. */
struct tz_layer_scratch {
  void *dh;     /* (N, C) gradient of a norm output */
  void *da;     /* (rows, F): one MLP chunk's (tz_model_mlp_rows) */
  void *dg;     /* (rows, F) */
  void *du;     /* (rows, F) */
  void *datt;   /* (N, H*D) */
  void *dq;     /* (N, H*D) */
  void *dk;     /* (N, Hkv*D) */
  void *dv;     /* (N, Hkv*D) */
  float *delta; /* (B, H, T) F32 */
  /* with experts (da, dg, du are then (M, F_e)) */
  void *dy;   /* (M, C) the gradient at the experts' outputs, then at their inputs */
  void *dlog; /* (N, E) the gradient at the router's logits */
  float *dw;  /* (N, k) F32 the gradient at the routing weights */
  /* with a shared expert: the gradients at its output, SwiGLU, gate and up (N, F_s), its logit */
  void *dys, *dsa, *dsg, *dsu, *dslog;
};

/* Scratch for the head. The head works on cfg->head_chunk rows of logits at a time, or (auto)
 * TZ_MODEL_HEAD_CHUNK_ELEMS / V rows (at least one): a constant of the config, so the order of its
 * sums never depends on memory. Each chunk's weight gradient is a product of depth `rows` added
 * onto the whole fp32 (V, C) gradient, which it reads and writes: 4.2 GB at Llama-3's vocabulary,
 * so a chunk needs some thousands of rows for its products, not that traffic, to set its time
 * (docs/training.md, "The head in chunks of tokens"). Built with another value (-D) only to
 * measure against it. */
#ifndef TZ_MODEL_HEAD_CHUNK_ELEMS
#define TZ_MODEL_HEAD_CHUNK_ELEMS (1u << 28)
#endif
/* The dense MLP's chunk: cfg->mlp_chunk tokens, or (auto) TZ_MODEL_MLP_CHUNK_ELEMS / F rounded down
 * to a multiple of 256 (at least 256), never more than N: one chunk up to some 24k tokens a
 * micro-batch at Llama-7B's F (the MLP then runs as it always did), six at 131k. With experts,
 * N (their rows are routed, not chunked). */
#define TZ_MODEL_MLP_CHUNK_ELEMS (1u << 28)
int tz_model_mlp_rows(const struct tz_model_config *cfg, int N);
struct tz_head_scratch {
  void *h;       /* (N, C) final-norm output */
  float *rstd;   /* (N) F32 */
  void *logits;  /* (rows, V): rows = tz_model_head_rows(cfg, N); dlogits in place */
  void *dh;      /* (N, C) */
  float *losses; /* (N) F32 per-token loss */
  float *loss;   /* (1) F32 sum of losses */
};
int tz_model_head_rows(const struct tz_model_config *cfg, int N);

/* Bytes for each of the three, carved from one buffer with every tensor 256-byte aligned, and
 * the carving itself (base: 256-byte aligned backend memory of at least that many bytes). */
size_t tz_model_acts_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T);
void tz_model_acts_carve(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                         void *base, struct tz_layer_acts *out);
/* What some parts of a layer's activations keep (TZ_PART_*) from its forward to its backward:
 * the attention part q, k, v, att, lse, x2 (with q_pre .. rstd_k), the MLP part g and u,
 * TZ_PART_ATTN_OUT without the attention part att and lse. The
 * rest (h1, rstd1, h2, rstd2, a) the backward rebuilds from x_in, x2, g and u
 * (tz_model_layer_bwd: the norms in a pass each, a in the SwiGLU backward's pass), so it needs
 * room only in the shared acts. Carving sets only
 * the kept pointers, so a layer's acts may hold parts from different buffers (kept ones, and
 * the shared ones: recomputed parts, rebuilt tensors). */
size_t tz_model_acts_part_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                                unsigned parts);
/* The working activations of a trainer that keeps each layer's kept parts apart (carve_parts):
 * the full layout but with g and u one MLP chunk's (gu_chunk), for the forward and the backward of
 * the layers whose MLP part is recomputed; where the MLP part is kept, g and u are the kept ones.
 * At 262,144 tokens of Llama-3.1-8B's F this holds 2 x 18,688 rows of g and u, not 2 x 262,144. */
size_t tz_model_acts_work_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T);
void tz_model_acts_work_carve(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                              void *base, struct tz_layer_acts *out);
/* What the trainer keeps of some parts of a layer, carved from base (tz_model_acts_kept_bytes of
 * room): tz_model_acts_part_bytes' tensors, less the attention part's x2 in a layer with experts,
 * whose x2 is the MLP block's input (a block of the tiers, tz_model_block_parts): the trainer
 * points acts->x2 at it. */
size_t tz_model_acts_kept_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                                unsigned parts);
void tz_model_acts_carve_parts(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                               unsigned parts, void *base, struct tz_layer_acts *out);
size_t tz_model_scratch_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T);
void tz_model_scratch_carve(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                            void *base, struct tz_layer_scratch *out);
size_t tz_model_head_scratch_bytes(const struct tz_model_config *cfg, enum tz_dtype dt, int B,
                                   int T);
void tz_model_head_scratch_carve(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T,
                                 void *base, struct tz_head_scratch *out);

/* ---- Phases (all pointers in backend memory; B*T rows; T <= max_seq) ---- */

/* 0 when B >= 1 and 1 <= T <= max_seq; else TZ_EINVAL naming both. */
int tz_model_check_batch(const struct tz_model_config *cfg, int B, int T);

/* x (B,T,C) = wte[tokens]; tokens (B,T) int32. */
int tz_model_embed_fwd(tz_compute *cm, const struct tz_model_config *cfg, const void *embed,
                       const int32_t *tokens, void *x, int B, int T);
/* The token whose embedding row the lookup gives no gradient: pad_id when has_pad and
 * 0 <= pad_id < vocab (transformers' nn.Embedding(padding_idx=pad_token_id), every family's);
 * -1 none. */
int tz_model_embed_pad(const struct tz_model_config *cfg);
/* Embedding gradient: embed_grad (block 0 layout, G) += scatter of dx (B,T,C) by token, but for
 * the rows whose token is tz_model_embed_pad's (their rows of dx are zeroed first: tied, the
 * head's gradient still reaches the pad row). host_tokens: the same (B,T) tokens in host
 * memory, which find those rows; needed only when there is a pad token (else may be NULL). With
 * embed_scale, dx is scaled in place first (the forward's scale), so it is clobbered. */
int tz_model_embed_bwd(tz_compute *cm, const struct tz_model_config *cfg, void *embed_grad,
                       const int32_t *tokens, const int32_t *host_tokens, void *dx, int B, int T);

/* One transformer layer, the model's `layer`-th (0-based: whether it slides its attention window
 * follows from it, tz_model_layer_window): x_out (B,T,C) from x_in (B,T,C) and the layer's
 * weights w, its tz_model_layer_blocks blocks in order (as &blocks[tz_model_block_of_layer]);
 * acts receives what backward needs. x_out may alias x_in. pos (B,T) int32 in cm's memory: each
 * token's position in its document, for rows that pack several (kernels/compute.h, "Packed
 * documents"); NULL: each row one document. The layer phases below take it alike. */
int tz_model_layer_fwd(tz_compute *cm, const struct tz_model_config *cfg, int layer, void *const *w,
                       const void *x_in, void *x_out, const struct tz_layer_acts *acts, int B,
                       int T, const int32_t *pos);
/* The two parts of a layer, as activation checkpointing keeps or recomputes them, and as a layer
 * with experts splits into blocks (tz_model_block_parts). */
#define TZ_PART_ATTN 1u /* attention: its norm, q/k/v, attention, wo, the residual into x2 */
#define TZ_PART_MLP 2u  /* the MLP: its norm, gate and up, SwiGLU, the down projection */
/* Kept, a part holds what only its matrix products give (acts_layout): q/k/v, the attention's
 * output and x2; gate and up. */
#define TZ_PARTS_ALL 3u
/* The attention op's output (att and lse), kept while the rest of the attention part is
 * recomputed: a third bit that means "kept" wherever it stands. In a set of kept parts
 * (tz_model_acts_part_bytes, _kept_bytes, _carve_parts) without TZ_PART_ATTN, those two
 * tensors; in a recompute set beside TZ_PART_ATTN (tz_model_layer_part_bwd), and in a forward's
 * parts (tz_model_layer_part_fwd, _part_flop), the attention part but for the op, whose output
 * acts already holds: its norm, q/k/v, RoPE and wo again, not the scores. At long sequences the
 * op is most of the attention part's time and its output under a third of its bytes
 * (docs/training.md, "Recompute only what memory forces"). Beside TZ_PART_ATTN only; alone in a
 * recompute set it is nothing. */
#define TZ_PART_ATTN_OUT 4u
/* The parts kept of a layer that recomputes `recompute` (TZ_PART_* bits; the attention's output
 * kept only where its part is recomputed). */
static inline unsigned tz_model_parts_kept(unsigned recompute) {
  return (TZ_PARTS_ALL & ~recompute) |
         ((recompute & TZ_PART_ATTN) ? (recompute & TZ_PART_ATTN_OUT) : 0u);
}
/* What of `parts` (a block's: tz_model_block_parts) a layer that recomputes `recompute`
 * recomputes: with the attention part, whether its output is kept. */
static inline unsigned tz_model_parts_recomputed(unsigned recompute, unsigned parts) {
  unsigned r = recompute & parts;
  return (r & TZ_PART_ATTN) ? r | (recompute & TZ_PART_ATTN_OUT) : r;
}

/* The forward of some parts (TZ_PART_*), writing every tensor of the part, kept or not: the
 * attention part from x_in into acts (h1 .. x2), the MLP part from acts->x2 into acts (h2 .. a)
 * and x_out; both (tz_model_layer_fwd) in that order. A part reads only its block of w: the
 * attention w[0], the MLP w[tz_model_layer_blocks - 1]. With TZ_PART_ATTN_OUT beside
 * TZ_PART_ATTN the attention op is not run: acts->att and acts->lse hold its output. */
int tz_model_layer_part_fwd(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                            void *const *w, const void *x_in, void *x_out,
                            const struct tz_layer_acts *acts, unsigned parts, int B, int T,
                            const int32_t *pos);

/* Backward of one layer. recompute (TZ_PART_* bits) names the parts whose forward runs into acts
 * first, from x_in alone for the attention part and from acts->x2 for the MLP (activation
 * checkpointing; with TZ_PART_ATTN_OUT the attention's but its op's, acts->att and acts->lse
 * holding that layer's forward's); the parts not named must hold what tz_model_acts_carve_parts
 * keeps of this layer's forward of x_in, and the backward rebuilds the rest of them into acts (the
 * norms' outputs, the SwiGLU). Either way the bits are the same: the same kernels on the same
 * inputs. dw (the layer's blocks as w, G) += the parameter gradients; dx_in (B,T,C) = the gradient
 * at x_in, given dx_out at x_out. dx_in may alias dx_out. acts and scratch are clobbered. */
int tz_model_layer_bwd(tz_compute *cm, const struct tz_model_config *cfg, int layer, void *const *w,
                       void *const *dw, const void *x_in, const struct tz_layer_acts *acts,
                       unsigned recompute, const void *dx_out, void *dx_in,
                       const struct tz_layer_scratch *scratch, int B, int T, const int32_t *pos);
/* The backward of some parts, as tz_model_layer_bwd runs them (the MLP's, then the
 * attention's), with the gradients at their ends: the MLP part's dx_out at x_out and dx_in at
 * x2; the attention part's dx_out at x2 and dx_in at x_in (x_in read by it alone). Each part
 * reads and writes only its blocks of w and dw. The same bits as the whole layer's backward:
 * run one after the other, the MLP's then the attention's, they are its ops on the same inputs
 * (the attention's recompute, which the whole layer runs first, then runs between them). */
int tz_model_layer_part_bwd(tz_compute *cm, const struct tz_model_config *cfg, int layer,
                            void *const *w, void *const *dw, const void *x_in,
                            const struct tz_layer_acts *acts, unsigned parts, unsigned recompute,
                            const void *dx_out, void *dx_in, const struct tz_layer_scratch *scratch,
                            int B, int T, const int32_t *pos);

/* The head: final norm, LM head, cross-entropy on targets (B,T) int32. s->losses gets each
 * token's loss and s->loss their sum (tz_compute_sum order). With head_grad non-NULL also the
 * backward, the loss gradient scaled by dscale (1 / tokens in the step for a mean): head_grad
 * (the last block, G) += and, when tied, embed_grad += the LM head's gradient (else embed_grad is
 * unused); dx (B,T,C) = the gradient at x. embed is read only when tied. */
int tz_model_head(tz_compute *cm, const struct tz_model_config *cfg, const void *head,
                  const void *embed, void *head_grad, void *embed_grad, const void *x,
                  const int32_t *targets, float dscale, void *dx, const struct tz_head_scratch *s,
                  int B, int T);
/* Forward only, all logits (B,T,V) S at once (evaluation, checks against other implementations). */
int tz_model_head_logits(tz_compute *cm, const struct tz_model_config *cfg, const void *head,
                         const void *embed, const void *x, void *logits,
                         const struct tz_head_scratch *s, int B, int T);

/* Whether to checkpoint activations (keep only each layer's input, recompute in backward) by
 * default: yes once keeping every layer's activations for B x T tokens would take more than
 * TZ_MODEL_ACTS_BUDGET bytes, which is every model larger than the tiny ones at useful batch
 * sizes; the costlier memory matters more than the third more compute then. */
#define TZ_MODEL_ACTS_BUDGET (1ull << 30)
int tz_model_checkpoint_default(const struct tz_model_config *cfg, enum tz_dtype dt, int B, int T);

/* ---- A whole-model driver for tests and tools (the trainer drives the phases itself) ---- */

/* ---- One layer alone (tz-bench layer; the trainer's compute rate) ---- */

/* FLOP of one layer's forward over B sequences of T tokens, as the trainer and tz-bench count
 * them: 2 per multiply-add of the layer's matrices for each token, plus causal attention's scores
 * and weighted sum (2 B T^2 H*D, the mask not subtracted; biases and q/k norms not counted).
 * Backward is twice that, and three times with the forward recomputed. */
double tz_model_layer_flop(const struct tz_model_config *cfg, int B, int T);
/* The forward FLOP of some parts (TZ_PART_*) as tz_model_layer_flop counts them: their sum over
 * both parts is that; with TZ_PART_ATTN_OUT beside TZ_PART_ATTN, less the attention op's. */
double tz_model_layer_part_flop(const struct tz_model_config *cfg, int B, int T, unsigned parts);

/* One layer's parameters (S) and their gradients (G), its input and output and their gradients,
 * activations and backward scratch, in cm's memory, zeroed, for B x T tokens. params and grads
 * hold the layer's blocks one after the other, w and dw point at each (tz_model_layer_fwd). */
struct tz_layer_probe {
  void *params, *grads, *x_in, *x_out, *dx_out, *dx_in, *acts_mem, *scratch_mem;
  void *w[2], *dw[2];
  struct tz_layer_acts acts;
  struct tz_layer_scratch scratch;
  int B, T;
  /* packed documents' positions (B*T int32 in cm's memory, kernels/compute.h "Packed
   * documents"): NULL after alloc; a caller may set its own (it keeps and frees it) */
  const int32_t *pos;
};
int tz_layer_probe_alloc(tz_compute *cm, const struct tz_model_config *cfg, int B, int T,
                         struct tz_layer_probe *l);
void tz_layer_probe_free(tz_compute *cm, struct tz_layer_probe *l); /* a zeroed probe: no-op */
/* Forward, then backward (recomputing the parts in recompute first, as the trainer's backward
 * phase does); enqueued on cm like any phase. */
int tz_layer_probe_step(tz_compute *cm, const struct tz_model_config *cfg,
                        const struct tz_layer_probe *l, unsigned recompute);
/* The mean of reps forward-and-recomputing-backward passes run back to back, in seconds: what
 * the trainer's fwd and bwd phases of a layer take on this backend, 4 x tz_model_layer_flop.
 * Untimed passes run first, back to back, for TZ_LAYER_PROBE_WARM_S (at least one): a GPU
 * coming out of idle runs its first tenth of a second on boost clocks a step never sees (an
 * H200, llama-7b's layer: 18.8 ms for the fastest of three after one, 20.0-20.2 for the mean
 * of 10 to 300 after 3 to 30). */
#define TZ_LAYER_PROBE_WARM_S 0.3
int tz_layer_probe_time(tz_compute *cm, const struct tz_model_config *cfg, int B, int T, int reps,
                        double *seconds);

typedef struct tz_model_runner tz_model_runner;

/* Buffers for batches of up to B x T tokens. checkpoint != 0 keeps only each layer's input and
 * recomputes the rest in backward; 0 keeps every layer's activations. The runner borrows cm and
 * cfg (both must outlive it) and owns what it allocates from cm. */
int tz_model_runner_create(tz_compute *cm, const struct tz_model_config *cfg, int B, int T,
                           int checkpoint, tz_model_runner **out);
void tz_model_runner_destroy(tz_model_runner *r); /* NULL is a no-op */

/* Forward and (grads non-NULL) backward over tokens and targets (B*T int32 each, host memory).
 * params[b] and grads[b] are block b's buffers in backend memory; grads += (accumulate).
 * A target TZ_TARGET_IGNORE is no target (kernels/compute.h). dscale <= 0 means 1 / the number
 * of targets. *loss (host) = the mean loss of the targets (0 when there are none), plus, with
 * experts and tz_model_aux_coef, that times the step's load-balancing loss (tz_model_moe_aux),
 * whose gradient the backward adds at that scale. */
int tz_model_runner_step(tz_model_runner *r, void *const *params, void *const *grads,
                         const int32_t *tokens, const int32_t *targets, float dscale, float *loss);
/* The positions of later steps' and logits' tokens in their documents, (B*T int32, host: see
 * tz_model_layer_fwd), copied; NULL: each row one document (the default). */
int tz_model_runner_set_pos(tz_model_runner *r, const int32_t *pos);
/* Forward only: logits (B*T*V floats, host memory) for tokens (host). */
int tz_model_runner_logits(tz_model_runner *r, void *const *params, const int32_t *tokens,
                           float *logits);

#endif
