/* A float64 reference of the whole model (trainer/model/model.h), written for obviousness: plain
 * loops, every intermediate kept, the backward derived by hand step by step. Parameters use the
 * model's block layout (tz_model_block_layout), in double; the flags of the config (q, k, v biases,
 * q/k norms, head_dim, llama3 RoPE) as transformers' Llama, Qwen2 and Qwen3 compute them. Used to
 * check the compute backends; itself checked by finite differences (test_refmodel_fd). */
#ifndef TZ_TESTS_REFMODEL_H
#define TZ_TESTS_REFMODEL_H

#include <stdint.h>

#include "trainer/model/model.h"

/* params[b]: block b (tz_model_block_numel doubles). tokens and targets: B*T each.
 * logits (B*T*V) and grads may be NULL. grads[b] (same layout) are overwritten, not accumulated;
 * the loss is the mean over the B*T tokens. Returns 0, or TZ_ENOMEM / TZ_EINVAL. */
int ref_model_run(const struct tz_model_config *cfg, double *const *params, const int32_t *tokens,
                  const int32_t *targets, int B, int T, double *logits, double *loss,
                  double *const *grads);

/* Block buffers of doubles, zeroed; ref_blocks_free frees them. NULL when out of memory. */
double **ref_blocks_alloc(const struct tz_model_config *cfg);
void ref_blocks_free(const struct tz_model_config *cfg, double **blocks);

/* Random parameters for tests: matrix and bias entries uniform in [-scale, scale), norm weights
 * (q and k norms too) uniform in [0.8, 1.2), padding 0; a function of seed only. */
void ref_blocks_randomize(const struct tz_model_config *cfg, double **blocks, uint64_t seed,
                          double scale);

#endif
