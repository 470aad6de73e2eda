/* `tz-train --plan --fit micro-batch|layers|seq`: the largest micro-batch, the most layers of the
 * model's shape, or the longest sequence, that this machine holds, found by bisection over the plan
 * (docs/training.md, "What fits"). A value holds when its plan fits the budgets and the machine's
 * limits (trainer/step/machine.h): exactly what tz-train checks before allocating. */
#ifndef TZ_TRAINER_FIT_H
#define TZ_TRAINER_FIT_H

#include <stdint.h>

#include "collectives/comm.h"
#include "core/config.h"
#include "core/runtime.h"
#include "trainer/model/model.h"
#include "trainer/run/run.h"
#include "trainer/step/train.h"

enum tz_fit_what {
  TZ_FIT_MICRO_BATCH = 1, /* train_micro_batch_size_per_gpu, the accumulation kept */
  TZ_FIT_LAYERS = 2,      /* n_layer (num_hidden_layers), every other dimension kept */
  TZ_FIT_SEQ = 3,         /* tokens per sequence (--seq), the micro-batch kept; the model's
                             max_position_embeddings raised to it for the plan (the answer says
                             where it lies beyond) */
};
/* "micro-batch", "layers" or "seq" into *out; TZ_EINVAL naming what is expected. */
int tz_fit_parse(const char *s, enum tz_fit_what *out);
const char *tz_fit_name(enum tz_fit_what w);

#define TZ_FIT_MAX_MICRO_BATCH (1 << 20)
#define TZ_FIT_MAX_LAYERS 4096
#define TZ_FIT_MAX_SEQ (1 << 24)

struct tz_fit_result {
  enum tz_fit_what what;
  int64_t best;    /* the largest value that holds; 0: not even 1 */
  int64_t refused; /* best + 1, which does not hold; 0: every value up to limit holds */
  int64_t limit;   /* the search's ceiling (TZ_FIT_MAX_*) */
  double bound_s;  /* the bound of best's plan (with the layer's rate when measured) */
  int unknown_rates;
  int plans;         /* plans made by the search */
  int64_t model_max; /* TZ_FIT_SEQ: the model's max_position_embeddings */
  char why[1024];    /* refused's refusal, or 1's when best is 0 */
};

/* The bisection for the trainer that cfg, mc and tp describe (tp->plan_only is implied; the
 * search's plans skip the layer probe, the answer's plan takes tp->measure_layer). A refusal
 * other than TZ_ENOMEM (a plan that does not fit) is returned as it is. */
int tz_fit(const struct tz_config *cfg, const struct tz_model_config *mc, tz_comm *comm,
           tz_runtime *rt, const struct tz_trainer_params *tp, enum tz_fit_what what,
           struct tz_fit_result *out);

/* tz_fit for a run of options o (the model, the rates, the trainer's parameters as tz_run
 * chooses them, with plan_only). */
int tz_run_fit(const struct tz_run_options *o, const struct tz_config *cfg, tz_comm *comm,
               tz_runtime *rt, enum tz_fit_what what, struct tz_fit_result *out);

#endif
