/* fp16 loss scaling (train.h): DeepSpeed's DynamicLossScaler, on the client thread. */
#define _GNU_SOURCE
#include "trainer/step/train_internal.h"
#include "core/error.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* fp16.enabled: the scaler starts at fp16.loss_scale, or dynamic (loss_scale 0) at
 * 2^initial_scale_power; the step must then be folded or unfolded (auto becomes folded). */
int tz_train_loss_scale_init(tz_trainer *tr, const struct tz_trainer_params *p) {
  const struct tz_config *c = &tr->cfg;
  tr->fp16 = c->fp16.enabled != 0;
  if (tr->fp16) {
    if (p->opt_mode == TZ_OPT_AUTO)
      tr->mode = TZ_OPT_FOLDED;
    if (tr->mode == TZ_OPT_OVERLAPPED)
      return tz_err_set(TZ_ECONFIG, "train: the optimizer step cannot overlap backward with fp16 "
                                    "loss scaling: an overflow is known only when backward ends "
                                    "(use folded or unfolded)");
    tr->dynamic = c->fp16.loss_scale == 0;
    double s0 = tr->dynamic ? ldexp(1.0, c->fp16.initial_scale_power) : c->fp16.loss_scale;
    if (!(s0 <= FLT_MAX))
      return tz_err_set(TZ_ECONFIG, "train: fp16 loss scale %g is beyond the fp32 range", s0);
    tr->scale = (float)s0;
    tr->hysteresis_left = c->fp16.hysteresis;
    tr->last_overflow_iter = -1;
  }
  return 0;
}

/* DeepSpeed's DynamicLossScaler.update_scale (consecutive_hysteresis false): an overflow uses up
 * one unit of hysteresis, and the last one halves the scale (an overflow at the minimum scale is
 * an error, as there); `loss_scale_window` steps after the last overflow the scale doubles and the
 * hysteresis is restored. A fixed scale never changes. */
int tz_train_update_scale(tz_trainer *tr, int overflow) {
  const struct tz_config *c = &tr->cfg;
  if (overflow)
    tr->skipped++;
  if (!tr->dynamic)
    return 0;
  if (overflow) {
    if (c->fp16.hysteresis == 1 || tr->hysteresis_left == 1) {
      if ((double)tr->scale <= c->fp16.min_loss_scale)
        return tz_err_set(TZ_ECONFIG,
                          "train: step %lld: fp16 gradients overflow at the minimum loss scale "
                          "%g (fp16.min_loss_scale): the scale cannot decrease any more",
                          (long long)tr->step, (double)tr->scale);
      double next = (double)tr->scale / 2;
      tr->scale = (float)(next > c->fp16.min_loss_scale ? next : c->fp16.min_loss_scale);
    } else {
      tr->hysteresis_left--;
    }
    tr->last_overflow_iter = tr->scale_iter;
  } else if ((tr->scale_iter - tr->last_overflow_iter) % c->fp16.loss_scale_window == 0) {
    tr->hysteresis_left = c->fp16.hysteresis;
    if ((double)tr->scale * 2 <= FLT_MAX)
      tr->scale *= 2;
  }
  tr->scale_iter++;
  return 0;
}

double tz_trainer_loss_scale(const tz_trainer *tr) { return tr->fp16 ? tr->scale : 0; }
int64_t tz_trainer_skipped_steps(const tz_trainer *tr) { return tr->skipped; }

void tz_trainer_loss_scale_get(const tz_trainer *tr, struct tz_loss_scale_state *out) {
  memset(out, 0, sizeof *out);
  if (!tr->fp16)
    return;
  out->scale = tr->scale;
  out->hysteresis_left = tr->hysteresis_left;
  out->scale_iter = tr->scale_iter;
  out->last_overflow_iter = tr->last_overflow_iter;
  out->skipped = tr->skipped;
}

int tz_trainer_loss_scale_set(tz_trainer *tr, const struct tz_loss_scale_state *s) {
  if (tr->pending)
    return tz_err_set(TZ_EINVAL, "train: restoring the loss scale while an update is pending "
                                 "(sync first)");
  if (!tr->fp16) {
    if (s->scale != 0 || s->hysteresis_left || s->scale_iter || s->last_overflow_iter || s->skipped)
      return tz_err_set(TZ_EINVAL,
                        "train: a loss-scale state (scale %g, %lld skipped) for a "
                        "trainer without fp16",
                        s->scale, (long long)s->skipped);
    return 0;
  }
  if (!(s->scale > 0 && s->scale <= FLT_MAX) || s->hysteresis_left < 1 || s->scale_iter < 0 ||
      s->last_overflow_iter < -1 || s->last_overflow_iter >= s->scale_iter || s->skipped < 0 ||
      s->skipped > s->scale_iter || s->skipped > tr->step)
    return tz_err_set(TZ_EINVAL,
                      "train: loss-scale state out of range: scale %g, hysteresis left %d, "
                      "iteration %lld, last overflow %lld, %lld skipped of %lld steps",
                      s->scale, s->hysteresis_left, (long long)s->scale_iter,
                      (long long)s->last_overflow_iter, (long long)s->skipped, (long long)tr->step);
  tr->scale = (float)s->scale;
  tr->hysteresis_left = s->hysteresis_left;
  tr->scale_iter = s->scale_iter;
  tr->last_overflow_iter = s->last_overflow_iter;
  tr->skipped = s->skipped;
  tr->updates = tr->step - tr->skipped;
  return 0;
}
