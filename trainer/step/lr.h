/* The learning rate of each optimizer step, as DeepSpeed's schedulers give it (docs/config.md,
 * "Learning-rate schedule"). */
#ifndef TZ_TRAINER_LR_H
#define TZ_TRAINER_LR_H

#include <stdint.h>

#include "core/config.h"

/* The learning rate of applied update `update` (0 for the first optimizer step; an update an fp16
 * overflow skipped is not counted), as DeepSpeed's engine gives it: the schedule at iteration
 * update - 1 (lr.c says why). total_steps replaces scheduler.total_num_steps when that is 0 (not
 * given); it matters only for WarmupDecayLR and WarmupCosineLR. Computed in double. */
double tz_lr_at(const struct tz_config *c, int64_t update, int64_t total_steps);

#endif
