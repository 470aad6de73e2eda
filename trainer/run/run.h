/* A whole training run, as tz-train makes it (docs/training.md): the model chosen (a preset, or a
 * Hugging Face checkpoint's config), the rates and the plan, the trainer, an import or a resume,
 * the data, then the steps with their evaluation and checkpoint cadence and the stop agreement
 * between ranks, and at the end the last checkpoint, a trace, an export and the summary.
 *
 * The run prints nothing: what a user sees comes through events (struct tz_run_event) that the
 * caller prints, in the order they happen, and through the log (core/log.h). The options are named
 * after tz-train's flags, and so are the errors that name one.
 *
 * Threads: one client thread. Every rank of the comm calls tz_run with the same options. */
#ifndef TZ_TRAINER_RUN_H
#define TZ_TRAINER_RUN_H

#include <stdint.h>

#include "collectives/comm.h"
#include "collectives/launch.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/plan.h"
#include "core/runtime.h"
#include "trainer/data/data.h"
#include "trainer/run/metrics.h"
#include "trainer/model/model.h"
#include "trainer/step/train.h"

struct tz_sched_stats;
struct tz_ckpt_options; /* trainer/checkpoint/checkpoint.h */

/* What happened, delivered to tz_run_options.on_event on every rank (ev->rank says which) in this
 * order; the pointers are borrowed for the call. */
enum tz_run_event_kind {
  TZ_RUN_MODEL,      /* the model is chosen (model, model_name), the data opened; step: the steps
                        the run ends after (--epochs resolved); the rates and the plan follow */
  TZ_RUN_PLANNED,    /* the trainer exists (trainer, rates, setup_s, rates_s); with plan_only the
                        run ends after it */
  TZ_RUN_IMPORTED,   /* the parameters are import_dir's */
  TZ_RUN_RESUMED,    /* step: the checkpoint's, where the steps continue */
  TZ_RUN_DATA,       /* data: opened (not with data "synthetic") */
  TZ_RUN_BEGIN,      /* the steps start (a progress display may open) */
  TZ_RUN_STEP,       /* metrics: one step done, with its evaluation if it had one */
  TZ_RUN_CHECKPOINT, /* step: saved under ckpt_dir as step-<step> */
  TZ_RUN_EVAL,       /* eval_loss: the evaluation of a run of no steps (steps 0, eval_every) */
  TZ_RUN_STEPS_END,  /* no STEP or EVAL follows (a display may close); also when the run fails
                        after BEGIN */
  TZ_RUN_TRACE,      /* step: trace_step, whose trace is in trace_path (rank 0, which writes it) */
  TZ_RUN_EXPORTED,   /* step: the steps done, whose parameters are in export_dir */
  TZ_RUN_SUMMARY,    /* summary, sched, first_loss, last_loss: a run of steps > 0 */
  TZ_RUN_ENDED,      /* tail_s: seconds since the last step returned (teardown included); the
                        last event of a run that succeeded, plan_only excepted */
};

struct tz_run_event {
  enum tz_run_event_kind kind;
  int rank, world;
  int64_t step;
  const char *model_name; /* the preset, or import_dir for a checkpoint's own config */
  const struct tz_model_config *model;
  const tz_trainer *trainer;         /* from PLANNED on */
  const struct tz_plan_rates *rates; /* PLANNED and SUMMARY: the rates the plan took */
  double setup_s;                    /* PLANNED: seconds since the rates were asked for */
  double rates_s;                    /* PLANNED: of which getting the rates */
  const tz_data *data;
  const struct tz_step_metrics *metrics;
  float eval_loss;
  const struct tz_metrics_summary *summary;
  const struct tz_sched_stats *sched;
  double first_loss, last_loss; /* of the steps this run took */
  double home_rate; /* SUMMARY: the CPU's Adam at the homes after the first step, elements per
                       second (0: no home phases, or fewer than two runs of them); the rates
                       cache keeps it for the next plan unless the rates are measured again */
  double disk_rate; /* SUMMARY: the disk's reads and writes together over its busy time in the
                       timed steps, bytes per second (0: no disk, or too few bytes to tell); the
                       rates cache keeps it for the next plan (tz_rates_learn) */
  double tail_s;
};

/* Returns 0, or a negative TZ_E* code (with tz_err_set's message) that ends the run with it. */
typedef int (*tz_run_event_fn)(void *arg, const struct tz_run_event *ev);

struct tz_run_options {
  const char *model;      /* a preset or a config.json (tz_run_model); NULL: tierzero.model, else
                             import_dir's config, else tiny */
  const char *import_dir; /* a Hugging Face checkpoint to start from; NULL: initialised */
  const char *data;       /* tz_data_open's spec, or "synthetic"; NULL: the built-in corpus */
  int seq;                /* tokens per sequence (default 64) */
  int64_t steps;          /* the run ends after this many steps in all, a resume's included (10) */
  int steps_set;          /* --steps was given (tz_run_option_set): with epochs they must agree */
  double epochs;          /* --epochs: tierzero.epochs (tz_run_config); 0 not given */
  int64_t seed;           /* tz_run_config: the config's seed instead; -1 (default): kept */
  const char *backend;    /* "cpu" (default) or "cuda" (tz_run_compute_backend resolves auto) */
  int device;             /* the GPU (tz_trainer_params.device) */
  enum tz_opt_mode mode;
  int auto_placement;
  const char *rates; /* the rates cache (tz_rates_get); NULL: the default one */
  int remeasure;
  /* plan_only: the plan (TZ_RUN_PLANNED) and no steps; gpu_memory, layer_rate, plan_world and
   * coll_rate (bytes/s) plan for another machine (tz_trainer_params; 0: this one's). */
  int plan_only;
  uint64_t gpu_memory;
  double layer_rate;
  int plan_world;
  double coll_rate;
  const char *metrics;   /* a JSONL file, one object per step and a summary (rank 0); NULL none */
  int64_t eval_every;    /* the validation loss after every this many steps and the last; 0 none */
  double val_fraction;   /* the data's share held out for it (default 0.05) */
  const char *val_data;  /* tz_data_open's spec of a separate validation set (needs eval_every):
                            nothing of data is held out then */
  const char *tokenizer; /* the tokenizer.json the data's sidecars must name (by hash); NULL:
                            import_dir's or the --model directory's tokenizer.json if any */
  const char *ckpt_dir;  /* NULL: no checkpoints; else after every save_every steps (0: none),
                            the last step and a stop request, keeping the newest keep (0: all) */
  int64_t save_every, keep;
  const struct tz_ckpt_options *ckpt_options; /* optional: the checkpoint layer's hooks for the
                                                  checks of ckpt_dir at start and the saves */
  const char *resume;         /* a checkpoint (a root or a step directory) to continue from; NULL
                                 none; "" ckpt_dir's (tz_run_options_check) */
  int reseed;                 /* resume: the config's seed, not the checkpoint's (tz_resume_seed) */
  const char *export_dir;     /* after the steps, the parameters as safetensors (tz_hf_export) */
  enum tz_dtype export_dtype; /* TZ_BF16 (default), TZ_F32 or TZ_F16 */
  uint64_t export_shard_bytes; /* the largest safetensors file of an export (default 5e9, as
                                  save_pretrained's "5GB") */
  const char *trace_path;      /* where the lane trace of trace_step (tierzero.trace_step) goes */
  int64_t trace_step;          /* -1 (default): none */
  tz_run_event_fn on_event;    /* optional: NULL means nothing is told */
  void *arg;
};
void tz_run_options_init(struct tz_run_options *o);

/* The model that --model name stands for: a preset, or else a Hugging Face config.json, a file
 * or a directory holding one, read with tz_hf_config_read (no weights: the model is that shape,
 * initialised as transformers initialises the family, init_std from initializer_range, 0.02
 * when absent). dir (len bytes) gets the directory holding that config.json, where tokenizer
 * files would be ("" for a preset). TZ_ENOENT naming the presets for a name that is neither;
 * tz_hf_config_read's errors. */
int tz_run_model(const char *name, struct tz_model_config *mc, char *dir, size_t len);

/* The trainer's parameters the run's options make, the one mapping of them (tz_run, tz_run_fit):
 * rates is where the plan's rates are, --collective-rate applied to it here. */
void tz_run_trainer_params(const struct tz_run_options *o, struct tz_plan_rates *rates,
                           struct tz_trainer_params *tp);

/* Sets the option that tz-train's flag --name stands for from its text (value NULL for a switch:
 * plan, auto-placement, remeasure); strings are borrowed. TZ_EINVAL with a message naming the
 * flag and what it expects. */
int tz_run_option_set(struct tz_run_options *o, const char *name, const char *value);
/* 1 when the option of flag --name is a switch, 0 when it takes a value, -1 when there is none. */
int tz_run_option_is_switch(const char *name);
/* The rules between options, once all are set: resume "" becomes ckpt_dir, and a resume from a
 * checkpoint root (not one step directory) with no ckpt_dir saves there; the planning options
 * (gpu_memory, layer_rate, plan_world, coll_rate) need plan_only, plan_world excludes starting
 * launch_ranks > 1 ranks, gpu_memory needs backend cuda; trace_step and trace_path go together
 * and trace_step is below steps; model names a preset or an existing path; val_data needs
 * eval_every. TZ_EINVAL naming the flags. */
int tz_run_options_check(struct tz_run_options *o, int launch_ranks);

/* Where the configuration of a run comes from, in this order of precedence (each over the one
 * before): the built-in defaults, base_json (the demo's, with its nvme files under base_nvme_path),
 * a resume's saved configuration, each file, the TZ_* environment, each KEY=VALUE of sets, then
 * the options' seed and trace_step. */
struct tz_run_sources {
  const char *base_json, *base_name, *base_nvme_path; /* optional */
  const char *const *files;
  int n_files;
  const char *const *sets;
  int n_sets;
};
/* The effective configuration into cfg (tz_config_free it, also on failure), its batch resolved
 * for world ranks (4 sequences per micro-batch when no batch size is given), and the log level
 * set from it. TZ_ECONFIG and the config layer's errors. */
int tz_run_config(const struct tz_run_options *o, const struct tz_run_sources *src, int world,
                  struct tz_config *cfg);

/* What a run did, filled also when it fails. */
struct tz_run_result {
  int stopped;     /* 1: every rank agreed on a stop request (tz_run returned TZ_ECANCELED) */
  int stop_signal; /* the signal of that request */
  int64_t start;   /* the first step (a resume's) */
  int64_t steps_done;
  int64_t saved; /* the last checkpoint written or resumed from; -1 none */
  double first_loss, last_loss;
};

/* The run (collective). cfg is the effective configuration, its batch resolved for the comm's
 * world; comm and rt are borrowed. TZ_ECANCELED when stopped by a signal (trainer/run/signals.h,
 * installed by the caller) after a step; any error of the layers below with their message. */
int tz_run(const struct tz_run_options *o, const struct tz_config *cfg, tz_comm *comm,
           tz_runtime *rt, struct tz_run_result *res);

/* ---- The cadence, in steps done (1-based) ---- */

/* 1 when step `done` is followed by an evaluation: every eval_every steps, and the last. */
int tz_run_evaluates(const struct tz_run_options *o, int64_t done);
/* 1 when step `done` is followed by a checkpoint: every save_every steps, or at a stop request
 * (stop != 0); never without ckpt_dir. */
int tz_run_saves(const struct tz_run_options *o, int64_t done, int stop);
/* 1 when the end of a run that began at step start, with its last checkpoint at step saved (-1:
 * none), writes one: the last step was not saved yet and the run took a step. */
int tz_run_saves_at_end(const struct tz_run_options *o, int64_t start, int64_t saved);

/* ---- Batches ---- */

struct tz_run_batch {
  const tz_data *data; /* NULL: synthetic sequences */
  uint64_t seed;
  int vocab, seq, micro, accum;
  int rank, world;
};
/* The batch of step `step` (0-based): this rank's accum micro-batches of micro sequences of seq
 * tokens, one after the other in tok and tgt, or with val set the validation batch. docs, unless
 * NULL, receives what the trainer needs of packed data (tz_data_packed): the positions, written
 * into pos (shaped as tok), and the step's targets over every rank; zeroed otherwise. */
/* The steps of `epochs` passes over `samples` training samples at per_step a step (micro-batch x
 * accumulation x ranks): ceil(epochs * samples / per_step), at least 1. The last step may take
 * its rest from the next epoch's order, so every sample is seen at least `epochs` times (whole
 * epochs) and none a step early. */
int64_t tz_run_epoch_steps(double epochs, uint64_t samples, int64_t per_step);

int tz_run_fill_batch(const struct tz_run_batch *b, int64_t step, int val, int32_t *tok,
                      int32_t *tgt, struct tz_step_docs *docs, int32_t *pos);

/* ---- Before the run: the comm, the compute backend, the placement ---- */

/* The comm backend for a launch: "single" for one rank, "mpi" under mpirun, else "nccl". */
const char *tz_run_comm_backend(const struct tz_bootstrap *bs);
/* asked ("cpu", "cuda", "auto" or NULL for auto) resolved: auto is cuda when this build has it and
 * a GPU is visible, unless the ranks talk through mpi (comm_backend). */
const char *tz_run_compute_backend(const char *asked, const char *comm_backend);

/* Where a rank's pinned buffers and threads went (tz_run_place). */
struct tz_run_placement {
  int known;     /* 0: no advice for this rank (nothing changed; the rest is unset) */
  int numa_node; /* of the pinned buffers */
  int advised;   /* 1: from the topology's advice, 0: from tierzero.numa_node */
  char binding[256];
};
/* Where this rank's pinned buffers and threads go: tz-topo's advice, unless the config says
 * (tierzero.numa_node). With GPUs the calling thread, and so every thread it starts (the progress
 * engine, the lanes, OpenMP), is bound to the cores the advice gives this rank's GPU; a CPU-only
 * rank keeps every core for compute. A topology that cannot be read changes nothing (logged). */
void tz_run_place(const struct tz_bootstrap *bs, struct tz_config *cfg,
                  struct tz_runtime_params *rp, struct tz_run_placement *out);

/* What a rank runs in: its runtime (staging and chunks from the config, placed by tz_run_place)
 * and its comm (tz_run_comm_backend's). */
struct tz_run_world {
  tz_runtime *rt;
  tz_comm *comm;
  struct tz_run_placement placement; /* filled before anything is created */
};
/* Opens w for the launch bs (cfg's tierzero.numa_node may take the advice). On failure what was
 * made is kept in w for tz_run_world_close. */
int tz_run_world_open(struct tz_bootstrap *bs, struct tz_config *cfg, struct tz_run_world *w);
/* Destroys the comm, then the runtime; those not made are skipped. */
void tz_run_world_close(struct tz_run_world *w);

#endif
