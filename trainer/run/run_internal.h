/* Private to trainer/run/run.c and run_outputs.c: a run's state, and what run_outputs.c does
 * with it: the checkpoint directory claimed and checked before the first step, the outputs
 * checked before it, and an export that fails after the last step (its fallback). */
#ifndef TZ_TRAINER_RUN_INTERNAL_H
#define TZ_TRAINER_RUN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/model/hf.h"
#include "trainer/run/monitor.h"
#include "trainer/run/run.h"

/* One run of tz_run, from its options to its summary. */
struct tz_run_state {
  const struct tz_run_options *o;
  const struct tz_config *cfg;
  tz_comm *comm;
  tz_runtime *rt;
  struct tz_run_result *res;
  int rank, world;
  tz_hf_model *hm;
  struct tz_model_config mc;
  const char *model_name;
  char model_dir[4096];     /* the directory of --model's config.json; "" for a preset */
  char tokenizer_dir[4096]; /* the export's tokenizer files: import_dir's, else model_dir's, when
                               it has tokenizer.json; "" none */
  char tokenizer[4096];     /* the tokenizer.json the data's sidecars are checked against; "" */
  struct tz_plan_rates rates;
  tz_trainer *tr;
  tz_data *data;
  tz_metrics_writer *mw; /* rank 0, with o->metrics */
  tz_monitor *mon;       /* rank 0, with the config's tensorboard or csv_monitor enabled */
  struct tz_run_batch batch;
  int32_t *tok, *tgt; /* a step's batch: batch.accum * batch.micro * seq each */
  int32_t *pos;       /* packed data: the tokens' positions in their documents */
  int64_t n;          /* tokens of a step on this rank */
  double fpt, peak;   /* model FLOPs per token; the peak FLOP/s of all ranks (0: unknown) */
  double elapsed;     /* the steps' wall time so far */
  struct tz_metrics_summary sum;
  /* the tiers' I/O counters at the last step's figures */
  struct tz_traffic_counters traffic;
  /* The home phases' work at the end of this run's first step (their rate after it is what
   * the rates cache learns, tz_rates_learn) */
  struct tz_home_work home0;
  int began;     /* TZ_RUN_BEGIN told, TZ_RUN_STEPS_END not yet */
  double t_last; /* when the last step returned; 0 before */
  /* rank 0's claim on ckpt_dir, for the whole run */
  tz_ckpt_lock *lock;
};

/* Rank 0's verdict on what it alone makes (what), for every rank: the other ranks of its run
 * follow it, failing with a message that points to rank 0's. */
int tz_run_rank0_agree(struct tz_run_state *r, int rc, const char *what);
/* The step the run starts from: the resumed checkpoint's (0 when it cannot be read). */
int64_t tz_run_ckpt_start(const struct tz_run_options *o);
/* --ckpt-dir claimed by rank 0 for the whole run (r->lock), when the run saves. */
int tz_run_ckpt_claim(struct tz_run_state *r);
/* --ckpt-dir checked for room for the run's saves before its first step. */
int tz_run_ckpt_check(struct tz_run_state *r);
/* The files the run writes after its steps (--metrics, --trace, the export) checked before the
 * first. */
int tz_run_check_outputs(struct tz_run_state *r);
/* The checkpoint the run would resume from now, into buf: "the last checkpoint DIR/step-N ..."
 * or why none. */
void tz_run_last_checkpoint(const struct tz_run_state *r, char *buf, size_t len);
/* After an export that failed with rc (every rank told): the message says where the trained
 * state is, saving an emergency checkpoint where no checkpoint holds the last step; returns rc. */
int tz_run_export_failed(struct tz_run_state *r, int rc);

#endif
