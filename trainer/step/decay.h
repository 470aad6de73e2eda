/* Which parameters weight decay applies to (tierzero.weight_decay_exclude, docs/config.md).
 *
 * Hugging Face Trainer decays every weight matrix but no bias and no norm weight: shrinking a
 * norm's gain or a bias towards zero is not the regularisation decay is for (it changes the scale
 * the next layer sees, not the weights' complexity). tierzero does the same by default; the
 * embedding (and an untied LM head) can be excluded too, and "none" decays every tensor, as the
 * PyTorch peers of the benchmarks do.
 *
 * A rank's shard of a block is a flat range of elements crossing several tensors. It is cut into
 * runs of equal decay taken from the block layout (tz_model_block_layout), and Adam runs once per
 * run with that run's weight decay (0 for an excluded run): the per-element arithmetic is
 * kernels/adam.h's, so every backend and every world size gives the same bits. Padding (between
 * tensors and after the last) belongs to the run of the tensor before it; it is zero with a zero
 * gradient and stays zero either way. */
#ifndef TZ_TRAINER_DECAY_H
#define TZ_TRAINER_DECAY_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "kernels/adam.h"
#include "trainer/model/model.h"

/* What is excluded from decay: a set of these bits. */
enum {
  TZ_DECAY_BIAS = 1,  /* bq, bk, bv */
  TZ_DECAY_NORM = 2,  /* attn_norm, mlp_norm, the final norm, q_norm, k_norm */
  TZ_DECAY_EMBED = 4, /* wte and an untied lm_head */
};
#define TZ_DECAY_DEFAULT (TZ_DECAY_BIAS | TZ_DECAY_NORM)

/* The set from the config's tierzero.weight_decay_exclude: not set is TZ_DECAY_DEFAULT, "none"
 * (alone) is 0, else each of "bias", "norm", "embed". TZ_ECONFIG naming the key, the value and
 * the names that work. */
int tz_decay_exclude_parse(const struct tz_config *c, unsigned *out);
/* "none" or the names joined by commas ("bias,norm"), into buf. */
const char *tz_decay_exclude_name(unsigned exclude, char *buf, size_t len);
/* The inverse of tz_decay_exclude_name (a checkpoint's record). TZ_EINVAL for another text. */
int tz_decay_exclude_from_name(const char *name, unsigned *out);

/* 1 when tensor t (its index in the layout of a block of that kind) is excluded by exclude. */
int tz_decay_tensor_excluded(enum tz_block_kind kind, int t, unsigned exclude);

struct tz_decay_run {
  uint64_t begin, end; /* elements, relative to the range's first */
  int decay;           /* 1: the config's weight decay; 0: none */
};
/* At most this many runs in any range (one per tensor). */
#define TZ_DECAY_MAX_RUNS TZ_L_COUNT

/* Cuts elements [begin, end) of block `block` into runs of equal decay (neighbours merged), in
 * order, covering the range. Returns the count (>= 1 for a non-empty range, 0 for an empty one)
 * or TZ_EINVAL (bad block). */
int tz_decay_runs(const struct tz_model_config *cfg, int block, unsigned exclude, uint64_t begin,
                  uint64_t end, struct tz_decay_run runs[TZ_DECAY_MAX_RUNS]);

/* One Adam call over n elements starting at element off of the caller's range, with p. */
typedef int (*tz_decay_adam_fn)(void *ctx, const struct tz_adam_params *p, uint64_t off,
                                uint64_t n);
/* Adam over elements [begin, begin + n) of block `block`: fn once per run, with p's weight decay
 * or 0. Stops at the first error and returns it. */
int tz_decay_adam(const struct tz_model_config *cfg, int block, unsigned exclude, uint64_t begin,
                  uint64_t n, const struct tz_adam_params *p, tz_decay_adam_fn fn, void *ctx);

#endif
