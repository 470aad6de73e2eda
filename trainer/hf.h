/* Hugging Face Llama checkpoints: a directory with config.json (LlamaForCausalLM) and
 * model.safetensors (or model.safetensors.index.json and its shards), with the names
 *   model.embed_tokens.weight                              (V, C)
 *   model.layers.N.input_layernorm.weight                  (C)
 *   model.layers.N.self_attn.{q,k,v,o}_proj.weight         (H*D, C) (Hkv*D, C) x2 (C, H*D)
 *   model.layers.N.post_attention_layernorm.weight         (C)
 *   model.layers.N.mlp.{gate,up,down}_proj.weight          (F, C) (F, C) (C, F)
 *   model.norm.weight                                      (C)
 *   lm_head.weight                                         (V, C), absent when tied
 * A Linear's weight is (out, in) there as here, and our RoPE uses HF's half-split pairing
 * (kernels/compute.h), so tensors move both ways unchanged: no permutation of q_proj or k_proj. */
#ifndef TZ_TRAINER_HF_H
#define TZ_TRAINER_HF_H

#include <stddef.h>

#include "kernels/compute.h"
#include "trainer/model.h"

/* The HF name of tensor `tensor` (TZ_E_*, TZ_L_*, TZ_H_*) of block `block`. */
int tz_hf_tensor_name(const struct tz_model_config *cfg, int block, int tensor, char *buf,
                      size_t len);

/* config.json in dir -> cfg. TZ_ECONFIG naming the key for a missing or wrong field, TZ_ENOTSUP
 * for a Llama variant this model does not implement (rope_scaling, biases, another activation).
 * *dtype (may be NULL) gets torch_dtype (f32 when absent). */
int tz_hf_config_read(const char *dir, struct tz_model_config *cfg, enum tz_dtype *dtype);
/* Writes dir/config.json for cfg with torch_dtype dtype (through a temporary file and rename). */
int tz_hf_config_write(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype);

typedef struct tz_hf_model tz_hf_model;

/* Opens dir: reads config.json and opens model.safetensors or the shards listed by
 * model.safetensors.index.json. The caller owns *out. */
int tz_hf_open(const char *dir, tz_hf_model **out);
void tz_hf_close(tz_hf_model *m); /* NULL is a no-op */
const struct tz_model_config *tz_hf_config(const tz_hf_model *m);
/* Block `block` in our layout (tz_model_block_numel floats, host memory; padding zeroed). Every
 * tensor must be present with its exact shape (TZ_ENOENT / TZ_EFORMAT naming it). */
int tz_hf_read_block(tz_hf_model *m, int block, float *out);
/* Every block into backend memory: blocks[b] (tz_model_block_numel elements of the storage
 * dtype of cm each). */
int tz_hf_load(tz_hf_model *m, tz_compute *cm, void *const *blocks);

/* Writes dir/config.json and dir/model.safetensors (tensors stored as dtype: f32, bf16 or f16)
 * with metadata {"format": "pt"}. get_block(arg, b, buf) fills buf with block b as floats in our
 * layout; one block is in memory at a time. dir is created if it does not exist. */
int tz_hf_export(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype,
                 int (*get_block)(void *arg, int block, float *buf), void *arg);
/* The same from blocks in backend memory (storage dtype of cm). */
int tz_hf_export_compute(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype,
                         tz_compute *cm, void *const *blocks);

#endif
