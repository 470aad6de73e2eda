/* Private to the trainer's own files: the trainer's state (struct tz_trainer, its phases and
 * jobs) and the steps one of them calls in another. The API is trainer/step/train.h. The files, by
 * concept: setup.c (options, the backend, tiers, lane and scheduler: create and destroy),
 * placement.c (sizes and the plan), phases.c (the order of a step, the jobs that run its phases,
 * the collectives inside them), step.c (the step, the pending update, evaluation), loss_scale.c
 * (fp16 loss scaling), train.c (loading and storing state, accessors).
 *
 * ZeRO-3 training on the scheduler (docs/training.md).
 *
 * Who touches what. The client thread (tz_trainer_step) enters the phases in order and queues
 * one job per phase on the scheduler's compute lane; every compute op and every collective of the
 * step runs in those jobs, one after the other on the lane's thread. Trainer-owned buffers in the
 * compute tier (activations, gathered weights, full gradients) are therefore only ever used by
 * one thread at a time, in phase order. The client writes only what no queued job reads: the
 * host copy of the tokens and the job slots, both double-buffered by step parity, and it waits
 * at the end of each step for that step's last backward phase, so the lane is never more than
 * one step behind. */
#ifndef TZ_TRAINER_TRAIN_INTERNAL_H
#define TZ_TRAINER_TRAIN_INTERNAL_H

#include <limits.h>
#include <stdint.h>

#include "core/lane.h"
#include "core/sched.h"
#include "core/tier.h"
#include "kernels/adam.h"
#include "trainer/step/train.h"

#define ALIGN 4096 /* home extents and blocks: a page, the host and nvme tiers' alignment */

enum phase_kind { PH_EMBED, PH_FWD, PH_HEAD, PH_BWD, PH_EMBED_BWD, PH_OPT };

/* What a use is for: the phase's own block; the input of the block after it (TZ_PLAN_ACT), which
 * the phase writes; or, with overlapped collectives, the next layer's parameter shard
 * (all-gathered during the phase for the phase after it) or the previous layer's gradient shard
 * (the reduce-scatter of its full gradient lands there during the phase). */
enum use_role { USE_OWN, USE_OUT, USE_NEXT, USE_PREV };

struct phase {
  enum phase_kind kind;
  int block; /* model block */
  int micro;
  int next, prev; /* overlapped collectives: the block gathered ahead and the block whose gradient
                     is reduce-scattered during the phase; -1 none */
  int n_uses;
  struct tz_block_use uses[TZ_PLAN_MAX_USES];
  int kinds[TZ_PLAN_MAX_USES];  /* the kind of each use */
  int blocks[TZ_PLAN_MAX_USES]; /* the model block of each use */
  enum use_role roles[TZ_PLAN_MAX_USES];
  char name[24];
};

/* What one run of a phase needs, filled by the client at enter. */
struct job {
  tz_trainer *tr;
  int phase;
  void *ptr[TZ_PLAN_KINDS]; /* the view's pointers to the phase's own blocks, by kind */
  void *out;                /* the input of the block after the phase's, which it writes */
  void *next_param;         /* overlapped collectives: the shard gathered ahead */
  void *prev_grad;          /* overlapped collectives: the gradient shard reduced into */
  int pending;              /* opt: 1 applies an update; 0 only refreshes param from master */
  int par;                  /* the step's parity (its slot) */
  struct tz_adam_params adam;
  float home_scale; /* opt at home: the gradient's factor, fixed at enter (the home lane must not
                       read what the compute lane's finish_step writes) */
  const int32_t *tokens_host; /* embed of micro 0: this step's tokens and targets */
  const int32_t *targets_host;
  const int32_t *pos_host; /* packed documents: their positions (tz_step_docs); NULL: none */
  float targets;           /* the step's targets over every rank: the loss's divisor */
  float loss_scale;        /* fp16: this step's loss scale; 1 otherwise */
};

struct tz_trainer {
  struct tz_config cfg;
  struct tz_model_config mc;
  tz_comm *comm;
  int rank, world;
  tz_runtime *rt;
  tz_compute *cm;
  const char *backend; /* "cpu" or "cuda" */
  int gpu;             /* cuda: the compute tier is GPU `device`'s memory, the lane its stream */
  double layer_rate;   /* measure_layer: FLOP/s of a layer's fwd and bwd phases; 0 not measured */
  int layer_cached;    /* 1: layer_rate and part_s are the rates cache's, not timed by this run */
  char nvme_capacity_why[PATH_MAX + 96]; /* the plan request's nvme_capacity_why */
  struct tz_trainer_setup_times setup;   /* tz_trainer_setup_times */
  double cpu_share;    /* the share of parameters asked of CPU Adam at the homes (cpu_step) */
  int cpu_adam_search; /* the plan picks cpu_share (tierzero.cpu_adam_search, auto resolved) */
  int carry; /* the window's copies serve the next step too (tierzero.window_carry resolved) */
  int device;
  char device_name[256]; /* cuda: the GPU's name */
  tz_lane *lane;         /* cuda: the compute lane (a CUDA stream); the cpu backend's is the
                            scheduler's own */
  enum tz_dtype S;
  size_t es; /* bytes per element of S */
  tz_tier *t_compute, *t_host, *t_nvme;
  tz_tier *t_nvme_base; /* under t_nvme when tierzero.faults wraps it in a fault tier */
  tz_sched *sched;
  enum tz_opt_mode mode;
  int B, T, G, N, L, nb, tied;
  double clip;
  int64_t total_steps;

  uint64_t *numel, *padded, *shard; /* per model block, elements */
  uint64_t *seg_off;                /* per block: its first norm segment */
  uint64_t n_seg;                   /* norm segments of the whole model */
  uint64_t (*bytes)[TZ_PLAN_KINDS]; /* per block and kind: bytes of the rank's block (the state
                                       kinds a shard's; TZ_PLAN_ACT the block's whole input, 0
                                       for the embedding, which has none) */
  tz_extent (*home)[TZ_PLAN_KINDS];
  int (*bid)[TZ_PLAN_KINDS]; /* scheduler block ids; -1 for a block of 0 bytes */
  char **names;
  struct tz_plan plan;

  struct phase *ph;
  int n_ph, loss_phase;
  struct job *jobs;  /* 2 * n_ph: slots by step parity */
  int *at_home;      /* n_ph: the phase runs at its blocks' homes on the scheduler's home lane */
  uint8_t *cpu_step; /* nb: the CPU steps the block's optimizer state at its host homes
                        (tierzero.cpu_adam), if the plan homes it there */
  /* nb: where block b's sum of micro-batches 0..G-2 is kept in acc (floats), or UINT64_MAX:
   * accumulated in its gradient shard. With accumulation, a shard forced out of the compute tier
   * (trainer/step/phases.c, accumulate) is then written once a step, by the last micro-batch. */
  uint64_t *acc_off;
  uint64_t acc_n; /* floats of acc */

  /* In the compute tier, trainer-owned (compute_fixed of the plan). */
  tz_extent buf;
  int32_t *tokens, *targets; /* (G, B, T) */
  int32_t *pos;              /* (G, B, T): packed documents' positions */
  void *dx; /* (B, T, C) S; each layer's input, and the head's, is a block of the tiers
               (TZ_PLAN_ACT) */
  struct tz_layer_acts acts;   /* the activations a recomputed part is written to, shared */
  struct tz_layer_acts *lacts; /* L: each layer's: its kept parts in BUF_KEEP, the rest acts' */
  struct tz_layer_scratch ls;
  struct tz_head_scratch hs;
  void *gw, *gw_embed;  /* gathered weights: a layer or the head; the embedding */
  float *fg, *fg_embed; /* full gradients of the same */
  float *acc;           /* BUF_ACC: the micro-batch sums of acc_off's blocks */
  /* tierzero.overlap_collectives with more than one rank: block b's gathered weights and full
   * gradient are gw2[b % 2] and fg2[b % 2] (gw2[0] is gw and fg2[0] is fg), so that a phase can
   * gather the next layer and reduce-scatter the previous one's gradient while it computes. */
  int overlap;
  void *gw2[2];
  float *fg2[2];
  /* GPU with overlapped collectives: the lane's stream computes while the comm's own stream runs
   * the collectives; each collective waits for the compute issued before it (to_comm) and the
   * compute that uses its result waits for it (from_comm), ordered through comm_lane, a lane on
   * the comm's stream (tz_lane_order). */
  int split;
  tz_lane *comm_lane;
  /* The compute lane's time in collectives (tz_step_result.coll_s), by step parity: host time in
   * the waits of a CPU lane; on a GPU, pairs of timing marks on the lane around each collective
   * (one stream) or around its wait for one (split), read at the step's end. Only the compute
   * lane's jobs issue collectives, one at a time (job_par says which step's). */
  double coll_host[2];
  tz_lane_timer *coll_timer; /* [parity][pair][2] marks, coll_cap pairs per parity; NULL: one
                                rank, or a lane that cannot time */
  int coll_cap, coll_n[2];
  float *partials;  /* (n_seg) sums of squares of norm segments */
  float *scal;      /* [0] loss sum over micro-batches, [1] the norm's sum of squares,
                       [2] the load-balancing loss's share */
  float *moe_stats; /* with the load-balancing loss (tz_model_aux_coef): the micro-batch's
                       routing statistics (2E), then moe_daux (E) its gradient; else NULL */
  float *moe_daux;
  int32_t *host_tokens[2]; /* host copies by step parity: tokens, targets, pos, each G*N */
  float *host_scal;        /* [2]: the step's loss sum and squared norm, copied out */
  tz_tier *t_io;           /* a small host tier holding the two above: page-locked for a GPU */
  tz_extent io;

  /* Written by the step's last backward job, read by the client after the step's fence. */
  float loss, norm, clip_scale;
  float opt_scale; /* the factor Adam multiplies the step's gradient by: clip / loss scale */
  int overflow;    /* fp16: the step's gradient norm is not finite; its update is dropped */

  /* fp16 loss scaling (train.h), DeepSpeed's DynamicLossScaler state; client thread only. */
  int fp16, dynamic;
  float scale;
  int hysteresis_left;
  int64_t scale_iter, last_overflow_iter, skipped;
  char *trace_path;

  unsigned decay_exclude; /* tierzero.weight_decay_exclude (trainer/step/decay.h) */
  int recompute_mode;     /* tierzero.recompute (trainer/step/recompute.h) */
  uint8_t *recompute;     /* L: the parts (TZ_PART_*) each layer's backward recomputes */
  double recompute_all_s; /* auto: the bound with every part recomputed; 0 not planned */
  double layer_s;   /* measure_layer: the probe's forward and backward with every part recomputed,
                       seconds; 0: not timed */
  double part_s[3]; /* measure_layer: the attention and the MLP part's forward, and the attention
                       part's without its op (TZ_PART_ATTN_OUT), seconds; 0: not timed (their
                       FLOPs stand in) */

  int64_t step, updates; /* steps done; Adam updates applied or queued */
  int pending;           /* folded: the last step's update is not applied yet */
};

enum {
  BUF_TOKENS,
  BUF_TARGETS,
  BUF_POS, /* packed documents' positions (tz_step_docs) */
  BUF_DX,
  BUF_ACTS, /* the layers' working activations, and in the same room the head's scratch */
  BUF_LS,
  BUF_GW,
  BUF_GWE,
  BUF_FG,
  BUF_FGE,
  BUF_PARTIALS,
  BUF_SCAL,
  BUF_KEEP, /* the kept parts of every layer's activations (tr->recompute) */
  BUF_ACC,  /* acc: gradients accumulated before the last micro-batch (tr->acc_off) */
  BUF_COUNT
};

static inline uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- phases.c ---- */

/* Builds the step's phases in order (DESIGN.md "A training step"). */
int tz_train_build_phases(tz_trainer *tr);
/* Runs the phase of job arg (a struct job) on the lane: the scheduler's job function. */
int tz_train_run_job(void *arg);
/* Before a collective: its inputs, written by earlier compute, are ready when it starts. */
int tz_train_coll_begin(tz_trainer *tr);
/* Waits for f and releases it. */
int tz_train_wait_release(tz_fence *f);
/* The collective time of the step of parity p, read once its loss phase has passed. */
double tz_train_coll_take(tz_trainer *tr, int p);
/* dst (n of S) = src (n floats) on the host, on every core. */
void tz_train_host_cast(void *dst, enum tz_dtype S, const float *src, uint64_t n);
/* Threads for CPU Adam at the homes. */
int tz_train_home_threads(const tz_trainer *tr);
/* Adam over the rank's shard of block b (tr->shard[b] elements of each array), once per run of
 * equal weight decay (trainer/step/decay.h): tz_adam_cpu on the home threads when cpu, else
 * tz_compute_adam on the compute backend. */
int tz_train_adam(tz_trainer *tr, int b, int cpu, const struct tz_adam_params *p, float *master,
                  float *m, float *v, const float *grad, void *param);

/* ---- placement.c ---- */

/* Per-block element counts, shards, bytes and names. */
int tz_train_sizes(tz_trainer *tr);
/* The FLOP the plan counts for a backward's recomputing parts (TZ_PART_*) of a layer: its
 * forward's, shared between the parts as their timed forwards share its time (tr->part_s), or
 * as their FLOPs do when they were not timed. */
double tz_train_recompute_flop(const tz_trainer *tr, unsigned parts);
/* A layer's block's phase (the forward, or with bwd the backward recomputing `recompute`) in the
 * plan's FLOP, from the probe's times: layer_s the whole layer's forward, its forward again and its
 * backward, part_s its parts' forwards alone (tz_rates_layer_time). The forward of the block's
 * parts is their timed forwards; the backward is the probe's backward (layer_s less twice the
 * parts' forwards), shared between the parts as their forwards are, and the forwards it
 * recomputes; seconds become FLOP at the plan's layer rate, 4 layer_flop / layer_s. Where the
 * layer's forward and backward run at different rates (at 131,072 tokens of the 8B shape its
 * backward took 3.76 times its forward, not the FLOPs' 3), a backward that recomputes less is
 * costed at what it runs, not at the whole pass's mean rate. -1 where the times do not allow it
 * (not timed, or the parts' forwards more than half the pass: noise): the caller counts FLOPs. */
double tz_train_timed_flop(double layer_flop, double layer_s, const double part_s[3], int bwd,
                           unsigned parts, unsigned recompute);
/* The bytes of each trainer-owned buffer in the compute tier (BUF_*). */
void tz_train_buffer_sizes(const tz_trainer *tr, uint64_t *sz);
/* Which blocks the CPU steps at their homes, for a share of the parameters (< 0: the default). */
void tz_train_choose_cpu_steps(tz_trainer *tr, double share);
/* tierzero.cpu_adam_search: the share whose plan predicts the least bound. */
int tz_train_search_cpu_steps(tz_trainer *tr, const struct tz_trainer_params *p);
/* The plan (tr->plan) and the phases that run at the homes (tr->at_home). */
int tz_train_make_plan(tz_trainer *tr, const struct tz_trainer_params *p);
/* The plan against what the machine can give (trainer/step/machine.h); TZ_ENOMEM naming the tier.
 */
int tz_train_check_machine(tz_trainer *tr, const struct tz_trainer_params *p);

/* ---- loss_scale.c ---- */

/* fp16.enabled: the loss scaler's initial state, and the optimizer step it allows. */
int tz_train_loss_scale_init(tz_trainer *tr, const struct tz_trainer_params *p);
/* After a step: the scaler's update for its overflow (or not). */
int tz_train_update_scale(tz_trainer *tr, int overflow);

#endif
