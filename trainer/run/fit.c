/* The largest micro-batch, the most layers or the longest sequence this machine holds
 * (trainer/run/fit.h). */
#define _GNU_SOURCE
#include "trainer/run/fit.h"
#include "core/error.h"
#include "trainer/model/hf.h"
#include "trainer/run/run.h"
#include "trainer/step/rates.h"

#include <stdio.h>
#include <string.h>

int tz_fit_parse(const char *s, enum tz_fit_what *out) {
  if (s && strcmp(s, "micro-batch") == 0)
    *out = TZ_FIT_MICRO_BATCH;
  else if (s && strcmp(s, "layers") == 0)
    *out = TZ_FIT_LAYERS;
  else if (s && strcmp(s, "seq") == 0)
    *out = TZ_FIT_SEQ;
  else
    return tz_err_set(TZ_EINVAL, "--fit '%s': expected micro-batch, layers or seq", s ? s : "");
  return 0;
}

const char *tz_fit_name(enum tz_fit_what w) {
  return w == TZ_FIT_MICRO_BATCH ? "micro-batch"
         : w == TZ_FIT_LAYERS    ? "layers"
         : w == TZ_FIT_SEQ       ? "seq"
                                 : "?";
}

struct search {
  const struct tz_config *cfg;
  const struct tz_model_config *mc;
  tz_comm *comm;
  tz_runtime *rt;
  const struct tz_trainer_params *tp;
  enum tz_fit_what what;
  struct tz_fit_result *out;
};

/* Plans with value v: 1 it holds, 0 it does not (its refusal in why), or an error. With keep,
 * the trainer made is returned in *tr. */
static int try_value(struct search *s, int64_t v, int measure, char *why, size_t len,
                     tz_trainer **tr) {
  struct tz_config c;
  TZ_CHECK(tz_config_copy(&c, s->cfg));
  struct tz_model_config mc = *s->mc;
  if (s->what == TZ_FIT_MICRO_BATCH) {
    c.train_micro_batch_size_per_gpu = v;
    c.train_batch_size = v * c.gradient_accumulation_steps * tz_comm_size(s->comm);
    if (s->tp->plan_world > 0)
      c.train_batch_size = v * c.gradient_accumulation_steps * s->tp->plan_world;
  } else if (s->what == TZ_FIT_LAYERS) {
    mc.n_layer = (int)v;
  }
  struct tz_trainer_params tp = *s->tp;
  if (s->what == TZ_FIT_SEQ) { /* the model admits it for the plan (tz_fit_result says) */
    tp.seq_len = (int)v;
    if (mc.max_seq < (int)v)
      mc.max_seq = (int)v;
  }
  tp.plan_only = 1;
  tp.holds_only = !tr; /* the value's search; the last plan, kept, says what to keep */
  tp.measure_layer = measure;
  tz_trainer *t = NULL;
  int rc = tz_trainer_create(&c, &mc, s->comm, s->rt, &tp, &t);
  tz_config_free(&c);
  s->out->plans++;
  if (rc == TZ_ENOMEM) {
    snprintf(why, len, "%s", tz_err_msg());
    return 0;
  }
  TZ_CHECK(rc);
  if (tr)
    *tr = t;
  else
    tz_trainer_destroy(t);
  return 1;
}

int tz_fit(const struct tz_config *cfg, const struct tz_model_config *mc, tz_comm *comm,
           tz_runtime *rt, const struct tz_trainer_params *tp, enum tz_fit_what what,
           struct tz_fit_result *out) {
  memset(out, 0, sizeof *out);
  out->what = what;
  out->limit = what == TZ_FIT_MICRO_BATCH ? TZ_FIT_MAX_MICRO_BATCH
               : what == TZ_FIT_LAYERS    ? TZ_FIT_MAX_LAYERS
                                          : TZ_FIT_MAX_SEQ;
  out->model_max = mc->max_seq;
  struct search s = {cfg, mc, comm, rt, tp, what, out};
  char why[1024];
  /* Doubling finds a value that holds (lo) and one that does not (hi); the bisection between
   * them the largest that holds: a plan that holds with v holds with every smaller v (each
   * needs no more of any tier). */
  int64_t lo = 0, hi = 0;
  for (int64_t v = 1; v <= out->limit; v *= 2) {
    int r = try_value(&s, v, 0, why, sizeof why, NULL);
    TZ_CHECK(r);
    if (!r) {
      hi = v;
      snprintf(out->why, sizeof out->why, "%s", why);
      break;
    }
    lo = v;
  }
  if (!hi && lo < out->limit) { /* every power of two held: the limit itself decides */
    int r = try_value(&s, out->limit, 0, why, sizeof why, NULL);
    TZ_CHECK(r);
    if (r)
      lo = out->limit;
    else {
      hi = out->limit;
      snprintf(out->why, sizeof out->why, "%s", why);
    }
  }
  while (hi && hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    int r = try_value(&s, mid, 0, why, sizeof why, NULL);
    TZ_CHECK(r);
    if (r) {
      lo = mid;
    } else {
      hi = mid;
      snprintf(out->why, sizeof out->why, "%s", why);
    }
  }
  out->best = lo;
  out->refused = hi;
  if (!lo)
    return 0;
  tz_trainer *tr = NULL;
  int r = try_value(&s, lo, tp->measure_layer, why, sizeof why, &tr);
  TZ_CHECK(r);
  if (!r) /* held without the probe: the same budgets with it */
    return tz_err_set(TZ_EINVAL, "fit: %s %lld held, then not: %s", tz_fit_name(what),
                      (long long)lo, why);
  out->bound_s = tz_trainer_plan(tr)->bound_s;
  out->unknown_rates = tz_trainer_plan(tr)->unknown_rates;
  tz_trainer_destroy(tr);
  return 0;
}

int tz_run_fit(const struct tz_run_options *o, const struct tz_config *cfg, tz_comm *comm,
               tz_runtime *rt, enum tz_fit_what what, struct tz_fit_result *out) {
  memset(out, 0, sizeof *out);
  /* the model as tz_run chooses it: --model (a preset or a Hugging Face config), the
   * configuration's, the import's, else tiny */
  struct tz_model_config mc;
  const char *name = o->model ? o->model : cfg->tierzero.model;
  if (name || !o->import_dir) {
    char dir[4096];
    TZ_CHECK(tz_run_model(name ? name : "tiny", &mc, dir, sizeof dir));
  } else {
    tz_hf_model *hm = NULL;
    TZ_CHECK(tz_hf_open(o->import_dir, &hm));
    mc = *tz_hf_config(hm);
    tz_hf_close(hm);
  }
  struct tz_plan_rates rates;
  TZ_CHECK(tz_rates_get(cfg, o->backend, rt, comm, o->rates, o->remeasure, &rates));
  /* the trainer's parameters as tz_run's plan sets them, a plan only */
  struct tz_trainer_params tp;
  tz_run_trainer_params(o, &rates, &tp);
  tp.plan_only = 1;
  return tz_fit(cfg, &mc, comm, rt, &tp, what, out);
}
