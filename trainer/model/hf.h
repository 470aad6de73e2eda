/* Hugging Face decoder checkpoints of the families llama (Llama 2 and 3.x), mistral, qwen2
 * (Qwen2, Qwen2.5) and qwen3 (dense): a directory with config.json and model.safetensors (or
 * model.safetensors.index.json and its shards), with the names
 *   model.embed_tokens.weight                              (V, C)
 *   model.layers.N.input_layernorm.weight                  (C)
 *   model.layers.N.self_attn.{q,k,v,o}_proj.weight         (H*D, C) (Hkv*D, C) x2 (C, H*D)
 *   model.layers.N.self_attn.{q,k,v}_proj.bias             (H*D) (Hkv*D) x2, qwen2 only
 *   model.layers.N.self_attn.{q,k}_norm.weight             (D), qwen3 only
 *   model.layers.N.post_attention_layernorm.weight         (C)
 *   model.layers.N.mlp.{gate,up,down}_proj.weight          (F, C) (F, C) (C, F)
 *   model.norm.weight                                      (C)
 *   lm_head.weight                                         (V, C), absent when tied
 * A Linear's weight is (out, in) there as here, and our RoPE uses HF's half-split pairing
 * (kernels/compute.h), so tensors move both ways unchanged: no permutation of q_proj or k_proj.
 * docs/model.md lists every config.json key: read, refused (and why) or ignored. */
#ifndef TZ_TRAINER_HF_H
#define TZ_TRAINER_HF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/compute.h"
#include "trainer/model/model.h"

/* A layer tensor that a family's checkpoints hold as rows of a fused one (struct tz_family's
 * fused_proj: wq, wk, wv in self_attn.qkv_proj; wg, wu in mlp.gate_up_proj). */
struct tz_hf_fused {
  const char *name; /* "self_attn.qkv_proj.weight", within the layer */
  int part;         /* which of the parts, in row order */
  int64_t first;    /* its first row in the fused tensor */
  int64_t rows;     /* the fused tensor's rows */
  int n_parts;
};
/* 1 and *out when layer tensor `tensor` of cfg's family is part of a fused tensor, else 0. */
int tz_hf_fused_part(const struct tz_model_config *cfg, int tensor, struct tz_hf_fused *out);

/* The HF name of tensor `tensor` (TZ_E_*, TZ_L_*, TZ_H_*) of block `block`. A layer tensor the
 * config does not have (numel 0 in its layout) still has its name; the parts of a fused tensor
 * have its name. */
int tz_hf_tensor_name(const struct tz_model_config *cfg, int block, int tensor, char *buf,
                      size_t len);
/* The checkpoint tensors tensor `tensor` of block `block` is split into: with experts, the
 * stacked wg, wu and wd are n_expert each (expert e's projection its e-th slice of rows,
 * model.layers.<i>.<moe_module>.experts.<e>.<gate/up/down name>.weight); else 1. */
int tz_hf_pieces(const struct tz_model_config *cfg, int block, int tensor);
/* The name of piece `piece` (tz_hf_tensor_name's where there is one piece). */
int tz_hf_piece_name(const struct tz_model_config *cfg, int block, int tensor, int piece, char *buf,
                     size_t len);

/* What config.json says beyond struct tz_model_config. */
#define TZ_HF_MAX_EOS 16
struct tz_hf_info {
  /* The attention window that applies to the model (mistral's sliding_window, whose absence
   * means transformers' default 4096); 0 when attention is full causal at every length (null,
   * or qwen2/qwen3 with use_sliding_window false). */
  int sliding_window;
  /* eos_token_id as written: a list is kept whole for generation_config.json (cfg->eos_id is
   * its first). */
  int n_eos;
  int eos[TZ_HF_MAX_EOS];
  char path[1024]; /* the config.json read, for messages */
};

/* path: a config.json file (an existing file, or a name ending in .json), or a directory
 * holding one (any other path: its config.json is looked for) -> cfg (and *dtype, may be NULL: the
 * torch_dtype or dtype key, f32 when absent; *info, may be NULL). Every family's keys are read;
 * TZ_ECONFIG naming the file and the key (and its value, and the limit) for a missing, wrong,
 * contradictory or out-of-range field; TZ_ENOTSUP naming them for what the model does not
 * compute (another rope type or activation, biases beyond qwen2's, experts, sliding-window or
 * other non-full attention layers, partial rotary, logit softcapping). Nothing is approximated.
 * A head_dim equal to hidden_size / num_attention_heads is stored as cfg->head_dim 0. */
int tz_hf_config_read(const char *path, struct tz_model_config *cfg, enum tz_dtype *dtype);
int tz_hf_config_read_info(const char *path, struct tz_model_config *cfg, enum tz_dtype *dtype,
                           struct tz_hf_info *info);

/* Writes dir/config.json for cfg with torch_dtype dtype (through a temporary file and rename):
 * the family's model_type, architectures and keys as transformers writes them. */
int tz_hf_config_write(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype);

typedef struct tz_hf_model tz_hf_model;

/* Opens dir: reads config.json and opens model.safetensors or every shard listed by
 * model.safetensors.index.json, and checks, before any tensor is read, that every tensor the
 * model reads is there with its shape and a dtype it reads (F32, BF16, F16) and that the
 * checkpoint holds nothing else (TZ_ENOENT / TZ_EFORMAT / TZ_ENOTSUP naming the file, the
 * tensor, both shapes); a shard the index names that cannot be opened is refused naming both.
 * The buffers rotary_emb.inv_freq of old checkpoints (derived from the config, ignored by
 * transformers too) are skipped. The caller owns *out. */
int tz_hf_open(const char *dir, tz_hf_model **out);
void tz_hf_close(tz_hf_model *m); /* NULL is a no-op */
const struct tz_model_config *tz_hf_config(const tz_hf_model *m);
const struct tz_hf_info *tz_hf_info(const tz_hf_model *m);
/* Block `block` in our layout (tz_model_block_numel floats, host memory; padding zeroed). Each
 * tensor is read once, in large sequential reads; a non-finite element is refused naming the
 * file, the tensor and the element (TZ_EFORMAT). */
int tz_hf_read_block(tz_hf_model *m, int block, float *out);
/* Every block into backend memory: blocks[b] (tz_model_block_numel elements of the storage
 * dtype of cm each). */
int tz_hf_load(tz_hf_model *m, tz_compute *cm, void *const *blocks);

/* ---- writing ---- */

struct tz_hf_export_opts {
  enum tz_dtype dtype;       /* stored dtype: f32, bf16 or f16 */
  uint64_t shard_bytes;      /* the largest shard, as save_pretrained's max_shard_size */
  const char *tokenizer_dir; /* NULL, or a directory whose tokenizer files are copied */
};
/* bf16, 5e9 bytes (save_pretrained's "5GB"), no tokenizer. */
void tz_hf_export_opts_init(struct tz_hf_export_opts *o);

/* Writes dir (created if it does not exist) as save_pretrained does: config.json,
 * generation_config.json, model.safetensors when every tensor fits in one shard of
 * o->shard_bytes, else model-0000K-of-0000N.safetensors and model.safetensors.index.json
 * (metadata.total_size, weight_map), tensors stored as o->dtype with metadata {"format": "pt"};
 * the tokenizer files of o->tokenizer_dir (tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json, tokenizer.model, vocab.json, merges.txt, vocab.txt, added_tokens.json,
 * chat_template.jinja, those present) copied. When o->tokenizer_dir holds a config.json of the same
 * family, what struct tz_model_config does not hold (mistral's sliding_window, the eos list) and
 * its generation_config.json's other fields are carried over. The export is written whole into
 * DIR.tmp-export beside dir and then swapped into place: an export that fails or is killed
 * leaves dir as it was, and a new one leaves none of an earlier export's files. dir may be new,
 * empty or hold an earlier export: a file an export does not write there is refused
 * (tz_hf_export_check_dir), untouched.
 * get_block(arg, b, buf) fills buf with block b as floats in our layout, called once per block in
 * order; one block is in memory at a time. o NULL: tz_hf_export_opts_init's. */
/* 0 when dir is missing, empty or holds only files an export writes; TZ_EEXIST naming the first
 * other file (tz-train asks before its first step). */
int tz_hf_export_check_dir(const char *dir);
int tz_hf_export(const char *dir, const struct tz_model_config *cfg,
                 const struct tz_hf_export_opts *o,
                 int (*get_block)(void *arg, int block, float *buf), void *arg);
/* The same from blocks in backend memory (storage dtype of cm). */
int tz_hf_export_compute(const char *dir, const struct tz_model_config *cfg,
                         const struct tz_hf_export_opts *o, tz_compute *cm, void *const *blocks);

#endif
