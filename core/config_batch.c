/* Batch sizes: DeepSpeed's rule between the three, resolved once the world size is known; and the
 * other "auto" values whose Hugging Face rule ties them to another value of the run. */
#define _GNU_SOURCE
#include "core/config_internal.h"

#include <inttypes.h>

int tz_config_resolve_batch(struct tz_config *c, int world_size) {
  if (world_size < 1)
    return tz_err_set(TZ_EINVAL, "batch: world_size %d is not positive", world_size);
  int64_t tb = c->train_batch_size, mb = c->train_micro_batch_size_per_gpu;
  int64_t gas = c->gradient_accumulation_steps, w = world_size, prod;
  /* "auto" with no batch size given: Hugging Face TrainingArguments' per_device_train_batch_size
   * default (tz_config_set_auto) */
  if (tb <= 0 && mb <= 0 && tz_config_is_auto(c, "train_micro_batch_size_per_gpu"))
    mb = 8;
  if (tb > 0 && mb > 0 && gas > 0) {
    if (__builtin_mul_overflow(mb, gas, &prod) || __builtin_mul_overflow(prod, w, &prod) ||
        prod != tb)
      return tz_err_set(TZ_ECONFIG,
                        "batch: train_batch_size %" PRId64
                        " != train_micro_batch_size_per_gpu %" PRId64
                        " * gradient_accumulation_steps %" PRId64 " * world_size %d",
                        tb, mb, gas, world_size);
  } else if (tb > 0 && mb > 0) {
    if (__builtin_mul_overflow(mb, w, &prod) || tb % prod != 0)
      return tz_err_set(TZ_ECONFIG,
                        "batch: train_batch_size %" PRId64
                        " is not divisible by train_micro_batch_size_per_gpu %" PRId64
                        " * world_size %d",
                        tb, mb, world_size);
    gas = tb / prod;
  } else if (tb > 0) {
    if (gas <= 0)
      gas = 1;
    if (__builtin_mul_overflow(gas, w, &prod) || tb % prod != 0)
      return tz_err_set(TZ_ECONFIG,
                        "batch: train_batch_size %" PRId64
                        " is not divisible by gradient_accumulation_steps %" PRId64
                        " * world_size %d",
                        tb, gas, world_size);
    mb = tb / prod;
  } else if (mb > 0) {
    if (gas <= 0)
      gas = 1;
    if (__builtin_mul_overflow(mb, gas, &tb) || __builtin_mul_overflow(tb, w, &tb))
      return tz_err_set(TZ_ECONFIG,
                        "batch: train_micro_batch_size_per_gpu %" PRId64
                        " * gradient_accumulation_steps %" PRId64 " * world_size %d overflows",
                        mb, gas, world_size);
  } else {
    return tz_err_set(TZ_ECONFIG,
                      "batch: neither train_batch_size nor train_micro_batch_size_per_gpu is set "
                      "(gradient_accumulation_steps %" PRId64 ", world_size %d)",
                      gas, world_size);
  }
  c->train_batch_size = tb;
  c->train_micro_batch_size_per_gpu = mb;
  c->gradient_accumulation_steps = gas;
  /* Hugging Face Trainer's DeepSpeed integration (trainer_config_process) fills warmup_max_lr
   * with the learning rate it gives the optimizer and warmup_min_lr with 0: the schedule peaks at
   * the optimizer's lr, not at a default of its own. total_num_steps "auto" stays unset: the
   * trainer takes the run's steps for it (tz_trainer_params.total_steps). */
  if (tz_config_is_auto(c, "scheduler.params.warmup_max_lr"))
    c->scheduler.warmup_max_lr = c->optimizer.lr;
  if (tz_config_is_auto(c, "scheduler.params.warmup_min_lr"))
    c->scheduler.warmup_min_lr = 0;
  return 0;
}
