/* DeepSpeed 0.19's WarmupLR, WarmupDecayLR and WarmupCosineLR, step for step as its engine runs
 * them (deepspeed/runtime/lr_schedules.py and runtime/engine.py; docs/config.md, "Learning-rate
 * schedule"):
 * - The engine builds the scheduler at iteration -1, which sets the optimizer's rate to the
 *   schedule's start (WarmupLR and WarmupDecayLR: warmup_min_lr; WarmupCosineLR: 0), and steps
 *   the scheduler after each optimizer step that is applied (not after one an fp16 overflow
 *   skipped). So applied update u (from 0) runs at iteration u - 1: the first at the start, the
 *   second at iteration 0, whose warm-up is 0 too.
 * - warmup_num_steps is raised to 2 everywhere it is used (the log warm-up's log(w), the linear
 *   one's it / w, the end of the warm-up, the decays' spans); 0 or less is refused at start
 *   (config.c), as DeepSpeed 0.19.3 refuses it.
 * - The log warm-up multiplies by 1 / log(w) as DeepSpeed does (not a division), in double.
 * - WarmupLR's peak without warmup_max_lr is optimizer.params.lr; WarmupDecayLR's is 0.001 (the
 *   keyword's default there); WarmupCosineLR scales optimizer.params.lr.
 * - WarmupCosineLR holds at cos_min_ratio once past total_num_steps (its progress is at most 1);
 *   WarmupDecayLR holds at warmup_min_lr.
 * - tierzero.warmup_ratio r > 0 (Hugging Face's warmup_ratio) makes the warm-up ceil(r * total)
 *   steps, total being total_num_steps or the run's, as the Trainer's get_warmup_steps fills
 *   warmup_num_steps "auto"; raised to 2 like any warm-up. */
#include "trainer/step/lr.h"

#include <math.h>

/* The warm-up's gamma at iteration it (0 <= it < w), w >= 2. */
static double warmup_gamma(const struct tz_config *c, int64_t it, int64_t w) {
  if (c->scheduler.warmup_type == TZ_WARMUP_LOG)
    return (1.0 / log((double)w)) * log((double)it + 1.0);
  return (double)it / (double)w;
}

double tz_lr_at(const struct tz_config *c, int64_t update, int64_t total_steps) {
  if (c->scheduler.type == TZ_LR_CONSTANT)
    return c->optimizer.lr;
  int64_t it = update - 1; /* the scheduler's last_batch_iteration when update runs */
  int64_t total = c->scheduler.total_num_steps > 0 ? c->scheduler.total_num_steps : total_steps;
  int64_t w = c->tierzero.warmup_ratio > 0 ? (int64_t)ceil(c->tierzero.warmup_ratio * (double)total)
                                           : c->scheduler.warmup_num_steps;
  w = w > 2 ? w : 2;
  double lo = c->scheduler.warmup_min_lr;
  switch (c->scheduler.type) {
  case TZ_LR_CONSTANT: break;
  case TZ_LR_WARMUP:
  case TZ_LR_WARMUP_DECAY: {
    double hi = c->scheduler.warmup_max_lr >= 0
                    ? c->scheduler.warmup_max_lr
                    : (c->scheduler.type == TZ_LR_WARMUP ? c->optimizer.lr : 1e-3);
    if (it < 0)
      return lo;
    double gamma;
    if (it < w)
      gamma = warmup_gamma(c, it, w);
    else if (c->scheduler.type == TZ_LR_WARMUP)
      gamma = 1.0;
    else
      gamma = fmax(0.0, (double)(total - it) / fmax(1.0, (double)(total - w)));
    return lo + (hi - lo) * gamma;
  }
  case TZ_LR_WARMUP_COSINE: {
    if (it < 0)
      return 0.0;
    double ratio;
    if (it < w) {
      double wmr = c->scheduler.warmup_min_ratio;
      ratio = wmr + warmup_gamma(c, it, w) * (1.0 - wmr);
    } else {
      double real_last = (double)(it - w + 1);
      double real_total = (double)(total - w > 1 ? total - w : 1);
      double progress = fmin(1.0, real_last / real_total);
      double cmr = c->scheduler.cos_min_ratio;
      ratio = (1.0 + cos(M_PI * progress)) / 2.0;
      ratio = fmax(0.0, cmr + (1.0 - cmr) * ratio);
    }
    return c->optimizer.lr * ratio;
  }
  }
  return c->optimizer.lr;
}
