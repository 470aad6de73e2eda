/* Adam hyperparameters shared by every optimizer path: checks and per-step bias corrections. */
#include "kernels/adam.h"

#include <math.h>

#include "core/error.h"

static int check_betas(const struct tz_adam_params *p) {
  if (!(p->beta1 >= 0.0f && p->beta1 < 1.0f))
    return tz_err_set(TZ_EINVAL, "adam: beta1 is %g, outside [0, 1)", (double)p->beta1);
  if (!(p->beta2 >= 0.0f && p->beta2 < 1.0f))
    return tz_err_set(TZ_EINVAL, "adam: beta2 is %g, outside [0, 1)", (double)p->beta2);
  return 0;
}

int tz_adam_params_check(const struct tz_adam_params *p) {
  if (!p)
    return tz_err_set(TZ_EINVAL, "adam: params is NULL");
  TZ_CHECK(check_betas(p));
  const struct {
    const char *name;
    float value;
  } finite[] = {
      {"lr", p->lr},
      {"beta1", p->beta1},
      {"beta2", p->beta2},
      {"eps", p->eps},
      {"weight_decay", p->weight_decay},
      {"bias_corr1", p->bias_corr1},
      {"bias_corr2", p->bias_corr2},
      {"grad_scale", p->grad_scale},
  };
  for (size_t i = 0; i < sizeof finite / sizeof finite[0]; i++)
    if (!isfinite(finite[i].value))
      return tz_err_set(TZ_EINVAL, "adam: %s is %g, not finite", finite[i].name,
                        (double)finite[i].value);
  if (p->eps < 0.0f)
    return tz_err_set(TZ_EINVAL, "adam: eps is %g, negative", (double)p->eps);
  if (p->decoupled != 0 && p->decoupled != 1)
    return tz_err_set(TZ_EINVAL, "adam: decoupled is %d, not 0 or 1", p->decoupled);
  return 0;
}

/* beta^t by repeated squaring: only IEEE double multiplies, so no libm difference can reach the
 * bias corrections. */
static double pow_step(double beta, int64_t t) {
  double r = 1.0, b = beta;
  for (uint64_t e = (uint64_t)t; e; e >>= 1) {
    if (e & 1)
      r *= b;
    b *= b;
  }
  return r;
}

int tz_adam_params_for_step(struct tz_adam_params *p, int64_t t) {
  if (!p)
    return tz_err_set(TZ_EINVAL, "adam: params is NULL");
  if (t < 1)
    return tz_err_set(TZ_EINVAL, "adam: step %lld, the first step is 1", (long long)t);
  TZ_CHECK(check_betas(p));
  p->bias_corr1 = (float)(1.0 / (1.0 - pow_step((double)p->beta1, t)));
  p->bias_corr2 = (float)(1.0 / (1.0 - pow_step((double)p->beta2, t)));
  return tz_adam_params_check(p);
}
