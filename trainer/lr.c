/* DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR, step for step (deepspeed/runtime/
 * lr_schedules.py): the same warm-up shapes (log: log(it + 1) / log(warmup), linear: it / warmup,
 * with warmup at least 2 for log), the same decays. */
#include "trainer/lr.h"

#include <math.h>

static double warmup_gamma(const struct tz_config *c, int64_t it) {
  int64_t w = c->scheduler.warmup_num_steps;
  if (c->scheduler.warmup_type == TZ_WARMUP_LOG) {
    double wl = (double)(w > 2 ? w : 2);
    return log((double)it + 1.0) / log(wl);
  }
  return w > 0 ? (double)it / (double)w : 1.0;
}

double tz_lr_at(const struct tz_config *c, int64_t it, int64_t total_steps) {
  int64_t warm = c->scheduler.warmup_num_steps;
  int64_t total = c->scheduler.total_num_steps > 0 ? c->scheduler.total_num_steps : total_steps;
  double lo = c->scheduler.warmup_min_lr, hi = c->scheduler.warmup_max_lr;
  switch (c->scheduler.type) {
  case TZ_LR_CONSTANT: return c->optimizer.lr;
  case TZ_LR_WARMUP: return it < warm ? lo + (hi - lo) * warmup_gamma(c, it) : hi;
  case TZ_LR_WARMUP_DECAY: {
    if (it < warm)
      return lo + (hi - lo) * warmup_gamma(c, it);
    int64_t span = total - warm > 1 ? total - warm : 1;
    double g = (double)(total - it) / (double)span;
    return lo + (hi - lo) * (g > 0 ? g : 0);
  }
  case TZ_LR_WARMUP_COSINE: {
    double ratio;
    if (it < warm) {
      ratio = c->scheduler.warmup_min_ratio +
              (1.0 - c->scheduler.warmup_min_ratio) * warmup_gamma(c, it);
    } else {
      double real_step = (double)(it - warm + 1), real_total = (double)(total - warm);
      if (real_total < 1)
        real_total = 1;
      ratio = (1.0 + cos(M_PI * real_step / real_total)) / 2.0;
      ratio = c->scheduler.cos_min_ratio + (1.0 - c->scheduler.cos_min_ratio) * ratio;
      if (ratio < 0)
        ratio = 0;
    }
    return c->optimizer.lr * ratio;
  }
  }
  return c->optimizer.lr;
}
