/* What tz-train prints of a run: rank 0's lines for each of the run's events (trainer/run/run.h)
 * — the set-up with the rates and the plan, the progress, the summary — and --plan --fit's
 * answer. The main fills a struct tz_run_report and hands tz_run_report_event to the run as its
 * callback (tz_run_options.on_event, arg the report). */
#ifndef TZ_TRAINER_REPORT_H
#define TZ_TRAINER_REPORT_H

#include "core/config.h"
#include "trainer/run/fit.h"
#include "trainer/run/metrics.h"
#include "trainer/run/run.h"

struct tz_run_report {
  const struct tz_run_options *run;
  const struct tz_config *cfg;
  /* lines said after the weight decay, each "KEY VALUE from --FLAG" (the TrainingArguments
   * flags given), NULL-terminated; NULL for none */
  const char *const *overrides;
  enum tz_display_mode progress;
  int demo;         /* the summary says the demo's first and last loss */
  tz_display *disp; /* the progress, between TZ_RUN_BEGIN and TZ_RUN_STEPS_END */
};

/* Prints ev (rank 0's; other ranks' events print nothing). 0, or tz_display_create's error. */
int tz_run_report_event(void *arg, const struct tz_run_event *ev);

/* --plan --fit's answer (tz_fit's result), on stdout. */
void tz_run_report_fit(const struct tz_fit_result *r);

#endif
