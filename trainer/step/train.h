/* ZeRO-3 training of the Llama model on the scheduler (docs/training.md).
 *
 * Every model block (the embedding, each layer, the head) is cut into world-size shards, and each
 * rank's shard of five kinds of state is a scheduler block: param (storage dtype), master, m, v
 * (fp32) and grad (fp32, accumulated over micro-batches); so is each layer's input and the
 * head's (TZ_PLAN_ACT: what the backward recomputes from, written by the forward of the block
 * before). The plan (core/plan.h) gives each its home: the compute tier, host memory or NVMe.
 * A step is a sequence of phases, declared once:
 *   embed, fwd(i), head, bwd(i), embed-bwd for each micro-batch, and opt(b) for each model block,
 * where each phase all-gathers the full weights it needs from the shards and each backward phase
 * reduce-scatters its full gradient into the rank's gradient shard. The trainer never copies
 * state between tiers itself: the scheduler brings each phase's blocks into the compute tier and
 * writes back what the phase changed.
 *
 * The optimizer step (DESIGN.md "A training step") runs in one of three places in the order,
 * always with exactly the result of synchronous Adam:
 *   folded      opt(b) just before block b's first forward of the next step: needed when the
 *               global gradient norm (clipping) must be known before any update;
 *   overlapped  opt(b) right after block b's last backward: without clipping;
 *   unfolded    every opt(b) at the end of the step (the reference).
 * With folded steps the last update is pending after tz_trainer_step returns; tz_trainer_sync
 * applies it (checkpoint, evaluation and export call it first), tz_trainer_wait does not.
 *
 * Threads: one client thread calls these functions. Phase work runs on the scheduler's compute
 * lane; collectives inside it. Every rank calls the same functions in the same order (those that
 * say "collective" talk to the other ranks). */
#ifndef TZ_TRAINER_TRAIN_H
#define TZ_TRAINER_TRAIN_H

#include <stdint.h>
#include <stdio.h>

#include "collectives/comm.h"
#include "core/config.h"
#include "core/plan.h"
#include "core/runtime.h"
#include "trainer/model/model.h"

typedef struct tz_trainer tz_trainer;
struct tz_machine_facts; /* trainer/step/machine.h */

enum tz_opt_mode {
  TZ_OPT_AUTO = 0, /* folded with gradient clipping, overlapped without */
  TZ_OPT_FOLDED,
  TZ_OPT_OVERLAPPED, /* refused with gradient clipping */
  TZ_OPT_UNFOLDED,
};
const char *tz_opt_mode_name(enum tz_opt_mode m); /* "auto", "folded", ... */
int tz_opt_mode_parse(const char *s, enum tz_opt_mode *out);

/* Norm segments: the gradient norm is the sum, in a fixed order, of the sums of squares of
 * segments of this many elements of each block; shards are multiples of it, so every world size
 * sums the same segments in the same order (docs/training.md). */
#define TZ_TRAIN_NORM_SEGMENT 16384

struct tz_trainer_params {
  int seq_len;         /* T; the micro-batch B is the config's train_micro_batch_size_per_gpu */
  int64_t total_steps; /* for the LR schedules that decay, when the config does not say */
  enum tz_opt_mode opt_mode;
  int auto_placement;        /* 1: the plan chooses homes where the config does not force them;
                                0 (default): offload_param.device and offload_optimizer.device */
  const int8_t *force_tiers; /* optional (n_blocks * TZ_PLAN_KINDS): a tier per block or
                                TZ_PLAN_AUTO; wins over the config (tests, mixed plans) */
  uint64_t window;           /* the scheduler's budget in the compute tier; 0: what is left */
  const struct tz_plan_rates *rates; /* for the bound; NULL: all unknown (bound not predicted) */
  const char *compute_backend;       /* "cpu" (default): fp32 on host memory, phases on a CPU
                                        lane; "cuda": bf16 (fp16 with fp16.enabled) on a GPU, the
                                        compute tier its memory, phases launched on its stream,
                                        GPU Adam; more than one rank needs the nccl comm */
  int device;                        /* cuda: the GPU; -1 (default): tierzero.device, else the
                                        calling thread's current device */
  int plan_only; /* 1: make the plan and stop (tz_trainer_plan), allocate nothing */
  /* plan_only: whether the plan holds is all that is asked (a --fit probe): tierzero.recompute
   * "auto" stops at its first plan, every part recomputed, which decides that, and does not
   * search what to keep (a tenth of a second a plan, dozens of plans) */
  int holds_only;
  int measure_layer; /* 1: time one layer's forward and backward on the compute backend at the
                        run's shape, and give the plan that rate (tz_trainer_layer_rate)
                        instead of rates->flops, a matmul's */
  /* measure_layer: the rates cache (trainer/step/rates_cache.h; NULL: the default path) whose entry
   * for this layer's shape, batch, backend and settings gives the time instead of the probe,
   * and which a probe's time is written to; with remeasure the probe runs whatever is there. */
  const char *rates_path;
  int remeasure;
  const char *trace_path; /* with the config's tierzero.trace_step: where that step's lane trace
                             goes (tz_trainer_trace_write, or the trainer's destruction); copied */
  /* Planning for a GPU this machine need not have (plan_only, cuda): the GPU's free memory and a
   * layer's rate (as tz-train prints it on that machine) instead of asking the GPU; 0: ask. */
  uint64_t gpu_free;
  double layer_rate;
  /* plan_only: plan rank 0 of a world of this many ranks instead of the comm's (0: the comm's). */
  int plan_world;
  /* What this machine can give each tier, that the plan is checked against before anything is
   * allocated (trainer/step/machine.h; tests give made-up ones); NULL: this machine's, read at
   * creation. Planning for another machine's GPU (gpu_free) checks nothing. */
  const struct tz_machine_facts *machine;
};
void tz_trainer_params_init(struct tz_trainer_params *p);

/* The settings string of compute backend `backend` from the config's backend keys
 * (tierzero.cuda_attention, ...: tz_config_backend_setting), after checking every such key the
 * config sets against its backend, a compute backend's or a tier's (tierzero.gds is the hbm
 * tier's; the environment's variables included), whichever backend runs:
 * TZ_ECONFIG naming the key and what its backend accepts. A key of a backend this build lacks is
 * warned about and left out. TZ_EINVAL when the string does not fit in len. */
int tz_train_compute_settings(const struct tz_config *c, const char *backend, char *buf,
                              size_t len);

/* Creates the tiers the plan needs inside rt (compute: a host tier of tierzero.hbm_budget bytes
 * on a CPU-only machine; host; nvme under tierzero.nvme_path), places every rank's shards in them
 * initialised from (seed, index) (the same numbers at every world size), and declares the step's
 * phases. cfg (batch sizes already resolved for comm's world size) and mc are copied; comm and rt
 * are borrowed and must outlive the trainer. Errors: TZ_ECONFIG (an option the trainer cannot
 * honour, named), TZ_ENOMEM (the plan does not fit: the message says by how much), tier errors. */
int tz_trainer_create(const struct tz_config *cfg, const struct tz_model_config *mc, tz_comm *comm,
                      tz_runtime *rt, const struct tz_trainer_params *p, tz_trainer **out);
/* Waits for everything in flight, then frees; the tiers it created go with it. NULL is a no-op. */
void tz_trainer_destroy(tz_trainer *tr);

struct tz_step_result {
  int64_t step;      /* 0-based index of the step just done */
  float loss;        /* mean loss of the step's targets over every rank's micro-batches */
  float grad_norm;   /* global norm of the step's gradient, before clipping */
  float clip_scale;  /* the factor the gradient is scaled by (1 without clipping) */
  double lr;         /* learning rate of this step's update */
  double step_s;     /* wall time of tz_trainer_step */
  double stall_s;    /* compute-lane time spent waiting for inputs in this step */
  double coll_s;     /* compute-lane time spent in collectives or waiting for them in this step
                        (with overlapped collectives, only the waits); 0 on one rank */
  int skipped;       /* fp16: 1 when the gradients overflowed and the update was dropped */
  double loss_scale; /* fp16: the loss scale after this step's update of it (the next step's);
                        0 without fp16 */
};

/* What a step's rows hold beyond tokens and targets when they pack documents (fine-tuning data,
 * trainer/data/data.h), each rank's own. */
struct tz_step_docs {
  const int32_t *pos; /* shaped as tokens, host: each token's position in its document
                         (trainer/model/model.h, tz_model_layer_fwd); NULL: each row one document */
  int64_t targets;    /* the targets (not TZ_TARGET_IGNORE) of the step over every rank and
                         micro-batch, the same on every rank: the loss is their mean and the
                         gradient its gradient, as Hugging Face's Trainer computes them; 0: every
                         token is one */
};

/* One optimizer step (collective). tokens and targets: gradient_accumulation_steps * B * T int32
 * each, host memory, this rank's micro-batches one after the other; a target may be
 * TZ_TARGET_IGNORE (kernels/compute.h). docs NULL: every token a target, each row one document.
 * Returns once the step's loss is known; the scheduler may still be writing back and, unfolded
 * or overlapped, updating. */
int tz_trainer_step(tz_trainer *tr, const int32_t *tokens, const int32_t *targets,
                    const struct tz_step_docs *docs, struct tz_step_result *res);

/* Applies a pending (folded) update and waits until every home holds the latest state
 * (collective). */
int tz_trainer_sync(tz_trainer *tr);
/* Waits for the phases and write-backs in flight, and leaves a pending (folded) update pending:
 * the end of a run that reads no parameter after its last step (no checkpoint, export or
 * evaluation), where applying it would only cost time (a pass over every block's state). */
int tz_trainer_wait(tz_trainer *tr);

/* Evaluation (collective): syncs (the pending update is applied first), then runs the forward
 * phases only -- embed, each layer, the head's loss -- over tokens and targets, shaped as for
 * tz_trainer_step (gradient_accumulation_steps * B * T int32 each, host), and gives the mean
 * token loss over every rank's micro-batches. Changes no state: no gradient, no update, the step
 * count stays. The declared step order stays that of training: evaluation reads each block's
 * parameter shard through the scheduler (tz_sched_block_load) and computes on the calling thread
 * while the compute lane is idle. */
int tz_trainer_eval(tz_trainer *tr, const int32_t *tokens, const int32_t *targets,
                    const struct tz_step_docs *docs, float *loss);

/* The lane trace of the config's tierzero.trace_step to path (core/sched.h
 * tz_sched_trace_write); waits first so that the step has completed (tz_trainer_wait: a pending
 * update stays pending). TZ_ENOENT when no step is traced, TZ_EBUSY when the run has not reached
 * that step. */
int tz_trainer_trace_write(tz_trainer *tr, const char *path);

/* fp16 loss scaling (DeepSpeed's DynamicLossScaler; the config's fp16 section). The cpu backend
 * computes in fp32, but the loss gradient is still multiplied by the scale, the gradient norm
 * checked for inf or NaN, and a step whose norm is not finite skipped: its update dropped (the
 * master, m, v, the Adam step and the learning-rate schedule stay), and, with a dynamic scale,
 * after `hysteresis` overflows the scale halves (never below min_loss_scale); after
 * loss_scale_window steps without overflow it doubles. Powers of two scale and unscale exactly,
 * so a run without overflow gives the bits of the same run without fp16. The current scale (the
 * one the next step uses); 0 without fp16. */
double tz_trainer_loss_scale(const tz_trainer *tr);
/* Steps skipped on overflow so far. */
int64_t tz_trainer_skipped_steps(const tz_trainer *tr);

/* The whole loss-scaler state, for checkpoints: a run resumed with it continues with the scales,
 * skips and Adam steps of a run that never stopped. */
struct tz_loss_scale_state {
  double scale;               /* the scale the next step uses */
  int hysteresis_left;        /* overflows left before the scale halves */
  int64_t scale_iter;         /* steps seen by the scaler */
  int64_t last_overflow_iter; /* its step of the last overflow, -1 for none; the good steps since
                                 are scale_iter - last_overflow_iter - 1 */
  int64_t skipped;            /* steps skipped on overflow: their updates were never applied */
};
/* The state into *out (all zero, with scale 0, without fp16). */
void tz_trainer_loss_scale_get(const tz_trainer *tr, struct tz_loss_scale_state *out);
/* Restores it (a resume), between steps with no update pending. Without fp16 only the all-zero
 * state of tz_trainer_loss_scale_get is accepted; a scale that is not positive and finite, or a
 * count out of range, is TZ_EINVAL. The Adam step becomes steps done minus skipped. */
int tz_trainer_loss_scale_set(tz_trainer *tr, const struct tz_loss_scale_state *s);

/* The full block `block` (tz_model_block_numel elements, padding removed) gathered from every
 * rank's shard into dst (host floats): kind TZ_PLAN_PARAM (converted from the storage dtype),
 * TZ_PLAN_MASTER, TZ_PLAN_M, TZ_PLAN_V or TZ_PLAN_GRAD. Syncs first (collective). */
int tz_trainer_param_load(tz_trainer *tr, int block, int kind, float *dst);

/* Replaces the parameters of block `block` from src, the full block (tz_model_block_numel
 * floats, host): the rank's part of it becomes its master shard and, converted, its parameter
 * shard; m, v and the gradient stay (an import before training; tz_trainer_param_load reads it
 * back). Between steps, with no update pending (TZ_EINVAL otherwise). */
int tz_trainer_param_store(tz_trainer *tr, int block, const float *src);

/* ---- Checkpoints: the rank's own shards, as they are stored (resume at the same world size) ----
 */

/* Bytes of the rank's shard of (block, kind): shard elements times 4, or times the storage
 * dtype's size for TZ_PLAN_PARAM. 0 for a block or kind that does not exist (TZ_PLAN_ACT is not
 * state: tz_trainer_act_bytes). */
uint64_t tz_trainer_shard_bytes(const tz_trainer *tr, int block, int kind);
/* Bytes of block `block`'s input (TZ_PLAN_ACT, a micro-batch's, whole on every rank): 0 for the
 * embedding and for a block that does not exist. */
uint64_t tz_trainer_act_bytes(const tz_trainer *tr, int block);
/* The rank's shard into dst (tz_trainer_shard_bytes). Applies a pending update first (collective
 * only in that it must be called on every rank alike; it sends nothing). */
int tz_trainer_shard_load(tz_trainer *tr, int block, int kind, void *dst);
/* Replaces the rank's shard (a resume). Between steps, with no update pending. */
int tz_trainer_shard_store(tz_trainer *tr, int block, int kind, const void *src);
/* The model and the configuration the trainer was made with (its copies). Borrowed. */
const struct tz_model_config *tz_trainer_model(const tz_trainer *tr);
const struct tz_config *tz_trainer_config(const tz_trainer *tr);
/* Steps done (each one's update applied after tz_trainer_sync). */
int64_t tz_trainer_steps_done(const tz_trainer *tr);
/* Declares that the stored state is that after `steps` steps: the next step is number `steps`,
 * with that learning rate, and the Adam step `steps` minus the skipped steps
 * (tz_trainer_loss_scale_set). Between steps, with no update pending. */
int tz_trainer_set_steps_done(tz_trainer *tr, int64_t steps);

/* The placement and bound in use (or made with plan_only). Borrowed. */
const struct tz_plan *tz_trainer_plan(const tz_trainer *tr);
/* Names of the plan's groups ("embed", "layer0", ..., "head"), for tz_plan_print. Borrowed. */
const char *const *tz_trainer_group_names(const tz_trainer *tr);
enum tz_opt_mode tz_trainer_opt_mode(const tz_trainer *tr); /* the mode in use, never AUTO */
/* 1: the collectives overlap the compute (tierzero.overlap_collectives, decided at creation) */
int tz_trainer_overlaps_collectives(const tz_trainer *tr);
/* The GPU the trainer computes on ("NVIDIA H200"), or NULL on the cpu backend. Borrowed. */
const char *tz_trainer_device_name(const tz_trainer *tr);
/* FLOP per second of a layer's forward and backward as measured at creation (measure_layer),
 * counted as the metrics count them (tz_model_layer_flop); 0 when not measured. */
double tz_trainer_layer_rate(const tz_trainer *tr);
/* 1 when that rate came from the rates cache (tz_trainer_params.rates_path), 0 when timed. */
int tz_trainer_layer_cached(const tz_trainer *tr);
/* Where creation's time went, in seconds: the plan (with the layer's measurement and the CPU
 * share's search), the tiers, the homes' initial shards, the scheduler (0 with plan_only for the
 * last three). */
struct tz_trainer_setup_times {
  double plan_s, tiers_s, shards_s, sched_s;
};
struct tz_trainer_setup_times tz_trainer_setup_times(const tz_trainer *tr);
/* The share of the parameters whose Adam the CPU runs at the host homes, as asked
 * (tierzero.cpu_adam, or the plan's pick with tierzero.cpu_adam_search); the blocks whose state
 * the plan homes elsewhere are stepped in the compute tier all the same. */
double tz_trainer_cpu_adam(const tz_trainer *tr);
/* Whether that share is the plan's pick (tierzero.cpu_adam_search, or its auto: on a GPU with the
 * optimizer state offloaded to cpu and no tierzero.cpu_adam given). */
int tz_trainer_cpu_adam_searched(const tz_trainer *tr);
/* Whether the scheduler's window carries copies into the next step (tierzero.window_carry, its
 * auto resolved). */
int tz_trainer_window_carry(const tz_trainer *tr);
/* What the backward recomputes (tierzero.recompute, the plan's choice with "auto"), in words
 * into buf ("all", "none", "attention in layers 0-19; MLP in none"); *kept (may be NULL) the
 * bytes of activations kept in the compute tier for it; *all_s (may be NULL) with "auto" the
 * bound recomputing every part, else 0. Returns buf. */
const char *tz_trainer_recompute(const tz_trainer *tr, char *buf, size_t len, uint64_t *kept,
                                 double *all_s);
/* The scheduler's statistics so far (core/sched.h). */
struct tz_sched_stats;
void tz_trainer_sched_stats(tz_trainer *tr, struct tz_sched_stats *out);
/* The CPU's Adam at the homes (the home lane's opt phases, tierzero.cpu_adam): their time a step
 * over the steps so far (the sum of their times over the most runs of one; the first step's
 * included) into *measured_s, the plan's for a step (its home lane's busy time; 0 where the plan
 * costs them on the compute lane) into *planned_s; returns how many phases ran there (0: none,
 * both 0). */
int tz_trainer_home_times(const tz_trainer *tr, double *measured_s, double *planned_s);
/* The home phases' work so far, summed over their runs: their time and the Adam elements they
 * updated (a run's rate between two readings is the difference of elements over the difference
 * of seconds), and the most runs of one. All 0 when no home phase ran. */
struct tz_home_work {
  uint64_t runs;
  double seconds, elements;
};
void tz_trainer_home_work(const tz_trainer *tr, struct tz_home_work *out);
/* The tiers the plan places state in: the compute tier, then host and nvme where the trainer
 * created them (NULL otherwise), into out[0..3); returns 3. Borrowed. */
int tz_trainer_tiers(const tz_trainer *tr, tz_tier *out[3]);

#endif
