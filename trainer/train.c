/* ZeRO-3 training on the scheduler (trainer/train.h, docs/training.md).
 *
 * Who touches what. The client thread (tz_trainer_step) enters the phases in order and queues
 * one job per phase on the scheduler's compute lane; every compute op and every collective of the
 * step runs in those jobs, one after the other on the lane's thread. Trainer-owned buffers in the
 * compute tier (activations, gathered weights, full gradients) are therefore only ever used by
 * one thread at a time, in phase order. The client writes only what no queued job reads: the
 * host copy of the tokens and the job slots, both double-buffered by step parity, and it waits
 * at the end of each step for that step's last backward phase, so the lane is never more than
 * one step behind. */
#define _GNU_SOURCE
#include "trainer/train.h"
#include "core/error.h"
#include "core/log.h"
#include "core/sched.h"
#include "core/tier.h"
#include "kernels/adam.h"
#include "trainer/lr.h"
#include "trainer/rates.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define ALIGN 4096 /* home extents and blocks: a page, the host and nvme tiers' alignment */

enum phase_kind { PH_EMBED, PH_FWD, PH_HEAD, PH_BWD, PH_EMBED_BWD, PH_OPT };

/* What a use is for: the phase's own block, or, with overlapped collectives, the next layer's
 * parameter shard (all-gathered during the phase for the phase after it) or the previous layer's
 * gradient shard (the reduce-scatter of its full gradient lands there during the phase). */
enum use_role { USE_OWN, USE_NEXT, USE_PREV };

struct phase {
  enum phase_kind kind;
  int block; /* model block */
  int micro;
  int next, prev; /* overlapped collectives: the block gathered ahead and the block whose gradient
                     is reduce-scattered during the phase; -1 none */
  int n_uses;
  struct tz_block_use uses[TZ_PLAN_KINDS];
  int kinds[TZ_PLAN_KINDS];  /* the kind of each use */
  int blocks[TZ_PLAN_KINDS]; /* the model block of each use */
  enum use_role roles[TZ_PLAN_KINDS];
  char name[24];
};

/* What one run of a phase needs, filled by the client at enter. */
struct job {
  tz_trainer *tr;
  int phase;
  void *ptr[TZ_PLAN_KINDS]; /* the view's pointers to the phase's own blocks, by kind */
  void *next_param;         /* overlapped collectives: the shard gathered ahead */
  void *prev_grad;          /* overlapped collectives: the gradient shard reduced into */
  int pending;              /* opt: 1 applies an update; 0 only refreshes param from master */
  int par;                  /* the step's parity (its slot) */
  struct tz_adam_params adam;
  float home_scale; /* opt at home: the gradient's factor, fixed at enter (the home lane must not
                       read what the compute lane's finish_step writes) */
  const int32_t *tokens_host; /* embed of micro 0: this step's tokens and targets */
  const int32_t *targets_host;
  float loss_scale; /* fp16: this step's loss scale; 1 otherwise */
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
  double cpu_share;    /* the share of parameters asked of CPU Adam at the homes (cpu_step) */
  int device;
  char device_name[256]; /* cuda: the GPU's name */
  tz_lane *lane;       /* cuda: the compute lane (a CUDA stream); the cpu backend's is the
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
  uint64_t (*bytes)[TZ_PLAN_KINDS]; /* per block and kind: bytes of the rank's block */
  tz_extent (*home)[TZ_PLAN_KINDS];
  int (*bid)[TZ_PLAN_KINDS]; /* scheduler block ids */
  char **names;
  struct tz_plan plan;

  struct phase *ph;
  int n_ph, loss_phase;
  struct job *jobs; /* 2 * n_ph: slots by step parity */
  int *at_home;      /* n_ph: the phase runs at its blocks' homes on the scheduler's home lane */
  uint8_t *cpu_step; /* nb: the CPU steps the block's optimizer state at its host homes
                        (tierzero.cpu_adam), if the plan homes it there */

  /* In the compute tier, trainer-owned (compute_fixed of the plan). */
  tz_extent buf;
  int32_t *tokens, *targets; /* (G, B, T) */
  void **x;                  /* L + 1 of (B, T, C) S: each layer's input, then the last output */
  void *dx;                  /* (B, T, C) S */
  struct tz_layer_acts acts;
  struct tz_layer_scratch ls;
  struct tz_head_scratch hs;
  void *gw, *gw_embed;     /* gathered weights: a layer or the head; the embedding */
  float *fg, *fg_embed;    /* full gradients of the same */
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
  float *partials;         /* (n_seg) sums of squares of norm segments */
  float *scal;             /* [0] loss sum over micro-batches, [1] the norm's sum of squares */
  int32_t *host_tokens[2]; /* host copies by step parity: tokens then targets, each G*N */
  float *host_scal;         /* [2]: the step's loss sum and squared norm, copied out */
  tz_tier *t_io;            /* a small host tier holding the two above: page-locked for a GPU */
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

  int64_t step, updates; /* steps done; Adam updates applied or queued */
  int pending;           /* folded: the last step's update is not applied yet */
};

const char *tz_opt_mode_name(enum tz_opt_mode m) {
  switch (m) {
  case TZ_OPT_AUTO:
    return "auto";
  case TZ_OPT_FOLDED:
    return "folded";
  case TZ_OPT_OVERLAPPED:
    return "overlapped";
  case TZ_OPT_UNFOLDED:
    return "unfolded";
  }
  return "?";
}

int tz_opt_mode_parse(const char *s, enum tz_opt_mode *out) {
  for (int m = TZ_OPT_AUTO; m <= TZ_OPT_UNFOLDED; m++)
    if (s && strcmp(s, tz_opt_mode_name((enum tz_opt_mode)m)) == 0) {
      *out = (enum tz_opt_mode)m;
      return 0;
    }
  return tz_err_set(TZ_EINVAL, "optimizer step '%s': expected auto, folded, overlapped or unfolded",
                    s ? s : "(null)");
}

void tz_trainer_params_init(struct tz_trainer_params *p) {
  memset(p, 0, sizeof *p);
  p->seq_len = 64;
  p->opt_mode = TZ_OPT_AUTO;
  p->device = -1;
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *tier_ptr(tz_tier *t, uint64_t off) {
  void *p = tz_tier_device_ptr(t, off);
  return p ? p : tz_tier_host_ptr(t, off);
}

/* ---- collectives inside jobs: issued and waited for on the compute lane ---- */

static int wait_release(tz_fence *f) {
  int rc = tz_fence_wait(f, -1);
  tz_fence_release(f);
  return rc < 0 ? rc : 0;
}

/* Split streams (tr->split): the comm's stream waits for what the lane's stream has been given so
 * far (to_comm), or the other way round (from_comm), on the device. */
static int stream_order(tz_trainer *tr, int to_comm) {
  if (!tr->comm_lane)
    return tz_err_set(TZ_ENOTSUP, "train: split streams without a lane on the comm's stream");
  return to_comm ? tz_lane_order(tr->lane, tr->comm_lane) : tz_lane_order(tr->comm_lane, tr->lane);
}

/* The step parity of the job this thread is running, -1 outside a job: collectives issued by
 * evaluation, loads and exports are not a step's. Per thread, since home phases run beside the
 * compute lane's jobs. */
static _Thread_local int job_par = -1;

/* Records one timing mark of a collective pair on the lane (a GPU job's collectives only; the
 * marks are made with the lane): end 0 opens the next pair, 1 closes it. Pairs past coll_cap are
 * not timed. */
static int coll_event(tz_trainer *tr, int end) {
  if (!tr->coll_timer || job_par < 0)
    return 0;
  int p = job_par, n = tr->coll_n[p];
  if (n >= tr->coll_cap)
    return 0;
  TZ_CHECK(tz_lane_timer_mark(tr->coll_timer, (p * tr->coll_cap + n) * 2 + end));
  if (end)
    tr->coll_n[p] = n + 1;
  return 0;
}

/* The step of parity p's collective time, once the lane has passed its last collective (the
 * step's loss phase); the parity's count starts again. */
static double coll_take(tz_trainer *tr, int p) {
  double s = tr->coll_host[p];
  tr->coll_host[p] = 0;
  for (int i = 0; i < tr->coll_n[p]; i++) {
    double t = 0;
    int first = (p * tr->coll_cap + i) * 2;
    if (tz_lane_timer_elapsed(tr->coll_timer, first, first + 1, &t) == 0 && t > 0)
      s += t;
  }
  tr->coll_n[p] = 0;
  return s;
}

/* Before a collective: its inputs, written by earlier compute, are ready when it starts. On one
 * stream, the collective's time on the lane starts here. */
static int coll_begin(tz_trainer *tr) {
  if (tr->split)
    return stream_order(tr, 1);
  return coll_event(tr, 0);
}

/* A collective issued inside a job has completed in order when the next op runs: on a CPU lane
 * the job waits for it; on a GPU the comm enqueues it on its stream, which is the lane's (stream
 * order is the wait) or, split, one the lane's stream is made to wait for. */
static int coll_done(tz_trainer *tr, tz_fence *f) {
  if (!tr->gpu) {
    double t0 = now_s();
    int rc = wait_release(f);
    if (job_par >= 0)
      tr->coll_host[job_par] += now_s() - t0;
    return rc;
  }
  tz_fence_release(f);
  if (!tr->split)
    return coll_event(tr, 1);
  TZ_CHECK(coll_event(tr, 0));
  TZ_CHECK(stream_order(tr, 0));
  return coll_event(tr, 1);
}

/* The full weights of block b from the rank's shard: all-gathered into buf, or with one rank the
 * shard itself (nothing to gather); *out says which. */
static int gather(tz_trainer *tr, int b, void *shard, void *buf, void **out) {
  if (tr->world == 1) {
    *out = shard;
    return 0;
  }
  tz_fence *f = NULL;
  TZ_CHECK(coll_begin(tr));
  TZ_CHECK(tz_comm_all_gather(tr->comm, shard, buf, tr->shard[b] * tr->es, NULL, &f));
  *out = buf;
  return coll_done(tr, f);
}

/* Adds the rank's reduced part of a gradient (n floats) into its gradient shard; micro-batch 0
 * copies it: the sum then starts from the first term, as the reduction's does, so accumulation
 * and a larger world give the same bits. */
static int accumulate(tz_trainer *tr, float *grad, const float *mine, uint64_t n, int micro) {
  if (micro == 0)
    return tz_compute_copy(tr->cm, grad, mine, n * sizeof(float));
  return tz_compute_add(tr->cm, TZ_F32, grad, grad, mine, n);
}

/* Reduce-scatters the full gradient fg of block b and accumulates the rank's part. */
static int reduce_into(tz_trainer *tr, int b, float *fg, float *grad, int micro) {
  uint64_t n = tr->shard[b];
  float *mine = fg + (uint64_t)tr->rank * n;
  if (tr->world > 1) {
    tz_fence *f = NULL;
    TZ_CHECK(coll_begin(tr));
    TZ_CHECK(tz_comm_reduce_scatter(tr->comm, fg, mine, n, TZ_F32, NULL, &f));
    TZ_CHECK(coll_done(tr, f));
  }
  return accumulate(tr, grad, mine, n, micro);
}

/* Sums of squares of the rank's norm segments of block b's gradient shard. */
static int norm_partials(tz_trainer *tr, int b, const float *grad) {
  uint64_t per = tr->shard[b] / TZ_TRAIN_NORM_SEGMENT;
  uint64_t first = (uint64_t)tr->rank * per;
  uint64_t nseg = (tr->numel[b] + TZ_TRAIN_NORM_SEGMENT - 1) / TZ_TRAIN_NORM_SEGMENT;
  if (first >= nseg)
    return 0; /* the rank's shard is all padding */
  uint64_t mine = nseg - first < per ? nseg - first : per;
  return tz_compute_sumsq_segments(tr->cm, tr->partials + tr->seg_off[b] + first, TZ_F32, grad,
                                   TZ_TRAIN_NORM_SEGMENT, mine);
}

/* ---- overlapped collectives (tierzero.overlap_collectives, more than one rank) ----
 * A phase issues the all-gather of the next layer's weights (ph->next) and the reduce-scatter of
 * the previous layer's full gradient (ph->prev) before its compute and completes them after it:
 * on a CPU lane it waits for them then, on a GPU they are ordered on the comm's stream. */
struct inflight {
  tz_fence *gather, *reduce;
};

static int issue_ahead(tz_trainer *tr, const struct phase *ph, const struct job *j,
                       struct inflight *f) {
  f->gather = f->reduce = NULL;
  if (ph->next < 0 && ph->prev < 0) /* an opt phase: nothing to order before */
    return 0;
  TZ_CHECK(coll_begin(tr));
  if (ph->next >= 0)
    TZ_CHECK(tz_comm_all_gather(tr->comm, j->next_param, tr->gw2[ph->next % 2],
                                tr->shard[ph->next] * tr->es, NULL, &f->gather));
  if (ph->prev >= 0) {
    uint64_t n = tr->shard[ph->prev];
    float *fg = tr->fg2[ph->prev % 2];
    TZ_CHECK(tz_comm_reduce_scatter(tr->comm, fg, fg + (uint64_t)tr->rank * n, n, TZ_F32, NULL,
                                    &f->reduce));
  }
  return 0;
}

/* Completes what issue_ahead started (always, also after a failure in between: the buffers stay
 * in use until then), then adds the reduced gradient into the previous layer's shard as
 * reduce_into does. rc: the phase's status so far, returned unless this fails first. */
static int complete_ahead(tz_trainer *tr, const struct phase *ph, const struct job *j,
                          struct inflight *f, int rc) {
  int g = f->gather ? coll_done(tr, f->gather) : 0;
  int r = f->reduce ? coll_done(tr, f->reduce) : 0;
  f->gather = f->reduce = NULL;
  if (rc < 0 || g < 0 || r < 0)
    return rc < 0 ? rc : g < 0 ? g : r;
  if (ph->prev < 0)
    return 0;
  uint64_t n = tr->shard[ph->prev];
  float *grad = j->prev_grad;
  TZ_CHECK(accumulate(tr, grad, tr->fg2[ph->prev % 2] + (uint64_t)tr->rank * n, n, ph->micro));
  return ph->micro == tr->G - 1 ? norm_partials(tr, ph->prev, grad) : 0;
}

/* The step's totals, once its last backward is done: loss, gradient norm, clip factor, and with
 * fp16 whether the scaled gradient overflowed. The gradient holds loss_scale times the true one;
 * the norm reported and clipped on is the true one. */
static int finish_step(tz_trainer *tr, float loss_scale) {
  tz_fence *f = NULL;
  if (tr->world > 1) {
    TZ_CHECK(coll_begin(tr));
    TZ_CHECK(tz_comm_all_reduce(tr->comm, tr->scal, tr->scal, 1, TZ_F32, NULL, &f));
    TZ_CHECK(coll_done(tr, f));
    TZ_CHECK(coll_begin(tr));
    TZ_CHECK(tz_comm_all_reduce(tr->comm, tr->partials, tr->partials, tr->n_seg, TZ_F32, NULL, &f));
    TZ_CHECK(coll_done(tr, f));
  }
  TZ_CHECK(tz_compute_sum(tr->cm, tr->scal + 1, TZ_F32, tr->partials, tr->n_seg, 0));
  float *host = tr->host_scal;
  TZ_CHECK(tz_compute_copy_out(tr->cm, host, tr->scal, 2 * sizeof(float)));
  TZ_CHECK(tz_compute_zero(tr->cm, tr->partials, tr->n_seg * sizeof(float)));
  TZ_CHECK(tz_compute_sync(tr->cm));
  tr->loss = host[0] / (float)((int64_t)tr->G * tr->world * tr->N);
  tr->overflow = tr->fp16 && !isfinite(host[1]);
  double norm = sqrt((double)host[1]) / (double)loss_scale;
  tr->norm = (float)norm;
  tr->clip_scale = 1.0f;
  if (tr->clip > 0 && !tr->overflow) {
    /* DeepSpeed's rule: scale by clip / (norm + 1e-6) when that is below 1. */
    double coef = tr->clip / (norm + 1e-6);
    if (coef < 1.0)
      tr->clip_scale = (float)coef;
  }
  /* Without fp16 exactly the factor used before loss scaling existed; with it, a power-of-two
   * scale is undone exactly by the multiplication by its inverse. */
  tr->opt_scale = tr->clip > 0 ? tr->clip_scale : 1.0f;
  if (tr->fp16)
    tr->opt_scale *= 1.0f / loss_scale;
  return 0;
}

/* dst (n of S) = src (n floats) on the host, with the rounding every backend uses, on every
 * core. */
static void host_cast(void *dst, enum tz_dtype S, const float *src, uint64_t n) {
  if (S == TZ_F32) {
    memcpy(dst, src, n * sizeof(float));
    return;
  }
  uint16_t *d = dst;
#pragma omp parallel for schedule(static) if (n > (1u << 16))
  for (uint64_t i = 0; i < n; i++)
    d[i] = S == TZ_BF16 ? tz_f32_to_bf16(src[i]) : tz_f32_to_f16(src[i]);
}

/* Threads for CPU Adam at the homes: tierzero.threads; else the compute instance's on a CPU-only
 * machine, and beside a GPU every CPU this process may run on but two, left to the thread that
 * launches the GPU's kernels and to the progress engine. */
static int home_threads(const tz_trainer *tr) {
  if (!tr->gpu && tr->cfg.tierzero.threads <= 0)
    return tz_compute_threads(tr->cm);
  return tz_rates_home_threads(&tr->cfg); /* tierzero.threads when set */
}

static int run_opt(tz_trainer *tr, struct job *j, int b) {
  float *master = j->ptr[TZ_PLAN_MASTER], *m = j->ptr[TZ_PLAN_M], *v = j->ptr[TZ_PLAN_V];
  const float *grad = j->ptr[TZ_PLAN_GRAD];
  void *param = j->ptr[TZ_PLAN_PARAM];
  uint64_t n = tr->shard[b];
  if (tr->at_home[j->phase]) {
    /* At the homes, on the home lane (folded or overlapped only: create_sched): the factor was
     * fixed at enter, and an overflow has already made j->pending 0. */
    if (!j->pending) {
      host_cast(param, tr->S, master, n);
      return 0;
    }
    struct tz_adam_params p = j->adam;
    p.grad_scale = j->home_scale;
    struct tz_adam_cpu_opts o = {.threads = home_threads(tr)};
    return tz_adam_cpu(&p, master, m, v, grad, TZ_F32, param, tr->S, n, &o);
  }
  /* Unfolded, the opt phases run after the step's finish_step on this lane, and an overflow
   * drops the update here; folded, the client has already dropped it (j->pending 0). */
  if (!j->pending || tr->overflow)
    return tz_compute_cast(tr->cm, param, tr->S, master, TZ_F32, n);
  struct tz_adam_params p = j->adam;
  p.grad_scale = tr->opt_scale;
  /* The same bits on every backend (kernels/adam.h); the cpu one runs on the instance's threads. */
  return tz_compute_adam(tr->cm, &p, master, m, v, grad, TZ_F32, param, tr->S, n);
}

/* The phase's compute (and without overlapped collectives its own gathers and reductions), on
 * the lane: w is the phase's full weights, gathered here or, overlapped, by the phase before. */
static int run_compute(tz_trainer *tr, const struct job *j, const struct phase *ph) {
  const struct tz_model_config *mc = &tr->mc;
  int b = ph->block, k = ph->micro, B = tr->B, T = tr->T, L = tr->L;
  size_t N = (size_t)tr->N;
  float dscale = 1.0f / (float)((int64_t)tr->G * tr->world * tr->N) * j->loss_scale;
  int ov = tr->overlap;
  void *w = ov ? tr->gw2[b % 2] : NULL;
  float *fg = tr->fg2[b % 2];
  switch (ph->kind) {
  case PH_EMBED:
    return tz_model_embed_fwd(tr->cm, mc, tr->gw_embed, tr->tokens + (size_t)k * N, tr->x[0], B, T);
  case PH_FWD:
    if (!ov)
      TZ_CHECK(gather(tr, b, j->ptr[TZ_PLAN_PARAM], tr->gw, &w));
    return tz_model_layer_fwd(tr->cm, mc, w, tr->x[b - 1], tr->x[b], &tr->acts, B, T);
  case PH_HEAD: {
    if (!ov)
      TZ_CHECK(gather(tr, b, j->ptr[TZ_PLAN_PARAM], tr->gw, &w));
    TZ_CHECK(tz_compute_zero(tr->cm, fg, tr->padded[b] * sizeof(float)));
    if (tr->tied)
      TZ_CHECK(tz_compute_zero(tr->cm, tr->fg_embed, tr->padded[0] * sizeof(float)));
    TZ_CHECK(tz_model_head(tr->cm, mc, w, tr->gw_embed, fg, tr->tied ? tr->fg_embed : NULL,
                           tr->x[L], tr->targets + (size_t)k * N, dscale, tr->dx, &tr->hs, B, T));
    if (k == 0)
      TZ_CHECK(tz_compute_copy(tr->cm, tr->scal, tr->hs.loss, sizeof(float)));
    else
      TZ_CHECK(tz_compute_add(tr->cm, TZ_F32, tr->scal, tr->scal, tr->hs.loss, 1));
    if (ov) /* reduce-scattered by the next phase */
      return 0;
    TZ_CHECK(reduce_into(tr, b, fg, j->ptr[TZ_PLAN_GRAD], k));
    return k == tr->G - 1 ? norm_partials(tr, b, j->ptr[TZ_PLAN_GRAD]) : 0;
  }
  case PH_BWD:
    if (!ov)
      TZ_CHECK(gather(tr, b, j->ptr[TZ_PLAN_PARAM], tr->gw, &w));
    TZ_CHECK(tz_compute_zero(tr->cm, fg, tr->padded[b] * sizeof(float)));
    TZ_CHECK(tz_model_layer_bwd(tr->cm, mc, w, fg, tr->x[b - 1], &tr->acts, 1, tr->dx, tr->dx,
                                &tr->ls, B, T));
    if (ov)
      return 0;
    TZ_CHECK(reduce_into(tr, b, fg, j->ptr[TZ_PLAN_GRAD], k));
    return k == tr->G - 1 ? norm_partials(tr, b, j->ptr[TZ_PLAN_GRAD]) : 0;
  case PH_EMBED_BWD:
    if (!tr->tied)
      TZ_CHECK(tz_compute_zero(tr->cm, tr->fg_embed, tr->padded[0] * sizeof(float)));
    return tz_model_embed_bwd(tr->cm, mc, tr->fg_embed, tr->tokens + (size_t)k * N, tr->dx, B, T);
  case PH_OPT:
    break;
  }
  return tz_err_set(TZ_EINVAL, "train: phase %d of kind %d has no compute", j->phase, ph->kind);
}

static int run_phase(tz_trainer *tr, struct job *j) {
  const struct phase *ph = &tr->ph[j->phase];
  int b = ph->block, k = ph->micro;
  if (ph->kind == PH_OPT)
    return run_opt(tr, j, b);
  if (ph->kind == PH_EMBED) {
    if (k == 0) {
      TZ_CHECK(tz_compute_copy_in(tr->cm, tr->tokens, j->tokens_host,
                                  (size_t)tr->G * (size_t)tr->N * sizeof(int32_t)));
      TZ_CHECK(tz_compute_copy_in(tr->cm, tr->targets, j->targets_host,
                                  (size_t)tr->G * (size_t)tr->N * sizeof(int32_t)));
    }
    /* The tied head of this micro-batch reads the embedding again, after the phase has left:
     * it is kept in gw_embed (copied from the shard with one rank). */
    void *w;
    if (tr->world == 1)
      TZ_CHECK(tz_compute_copy(tr->cm, tr->gw_embed, j->ptr[TZ_PLAN_PARAM], tr->shard[b] * tr->es));
    else
      TZ_CHECK(gather(tr, b, j->ptr[TZ_PLAN_PARAM], tr->gw_embed, &w));
  }
  struct inflight f = {NULL, NULL};
  int rc = tr->overlap ? issue_ahead(tr, ph, j, &f) : 0;
  if (rc == 0)
    rc = run_compute(tr, j, ph);
  if (tr->overlap)
    rc = complete_ahead(tr, ph, j, &f, rc);
  if (rc < 0 || ph->kind != PH_EMBED_BWD)
    return rc;
  TZ_CHECK(reduce_into(tr, b, tr->fg_embed, j->ptr[TZ_PLAN_GRAD], k));
  if (k < tr->G - 1)
    return 0;
  TZ_CHECK(norm_partials(tr, b, j->ptr[TZ_PLAN_GRAD]));
  return finish_step(tr, j->loss_scale);
}

static int run_job(void *arg) {
  struct job *j = arg;
  job_par = j->par;
  int rc = run_phase(j->tr, j);
  job_par = -1;
  return rc;
}

/* ---- the order of a step ---- */

static void use_of(struct phase *p, tz_trainer *tr, int block, int kind, int access,
                   enum use_role role) {
  p->uses[p->n_uses] = (struct tz_block_use){tr->bid ? tr->bid[block][kind] : -1, access};
  p->kinds[p->n_uses] = kind;
  p->blocks[p->n_uses] = block;
  p->roles[p->n_uses++] = role;
}

static void use(struct phase *p, tz_trainer *tr, int kind, int access) {
  use_of(p, tr, p->block, kind, access, USE_OWN);
}

static int add_phase(tz_trainer *tr, int *n, enum phase_kind kind, int block, int micro) {
  struct phase *p = &tr->ph[(*n)++];
  memset(p, 0, sizeof *p);
  p->kind = kind;
  p->block = block;
  p->micro = micro;
  p->next = p->prev = -1;
  int gacc = micro == 0 ? TZ_ACCESS_WRITE : TZ_ACCESS_READWRITE;
  /* Overlapped collectives (tr->overlap): a layer's or the head's weights are gathered during
   * the phase before the one that computes with them, and its gradient is reduce-scattered
   * during the phase after: those phases use the shards, the computing one neither. The
   * embedding keeps gathering and reducing its own (the first and last phases of a pass). */
  int ov = tr->overlap, L = tr->L, H = L + 1;
  switch (kind) {
  case PH_EMBED:
    snprintf(p->name, sizeof p->name, "embed.%d", micro);
    use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_READ);
    p->next = ov ? 1 : -1;
    break;
  case PH_FWD:
    snprintf(p->name, sizeof p->name, "fwd%d.%d", block - 1, micro);
    if (!ov)
      use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_READ);
    p->next = ov ? block + 1 : -1;
    break;
  case PH_HEAD:
    snprintf(p->name, sizeof p->name, "head.%d", micro);
    if (!ov) {
      use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_READ);
      use(p, tr, TZ_PLAN_GRAD, gacc);
    }
    p->next = ov ? L : -1;
    break;
  case PH_BWD:
    snprintf(p->name, sizeof p->name, "bwd%d.%d", block - 1, micro);
    if (!ov) {
      use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_READ);
      use(p, tr, TZ_PLAN_GRAD, gacc);
    }
    p->next = ov && block > 1 ? block - 1 : -1;
    p->prev = ov ? block + 1 : -1;
    break;
  case PH_EMBED_BWD:
    snprintf(p->name, sizeof p->name, "embed-bwd.%d", micro);
    use(p, tr, TZ_PLAN_GRAD, gacc);
    p->prev = ov ? (L > 0 ? 1 : H) : -1;
    break;
  case PH_OPT:
    snprintf(p->name, sizeof p->name, "opt-%s", tr->names[block]);
    use(p, tr, TZ_PLAN_MASTER, TZ_ACCESS_READWRITE);
    use(p, tr, TZ_PLAN_M, TZ_ACCESS_READWRITE);
    use(p, tr, TZ_PLAN_V, TZ_ACCESS_READWRITE);
    use(p, tr, TZ_PLAN_GRAD, TZ_ACCESS_READ);
    use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_WRITE);
    break;
  }
  if (p->next >= 0)
    use_of(p, tr, p->next, TZ_PLAN_PARAM, TZ_ACCESS_READ, USE_NEXT);
  if (p->prev >= 0)
    use_of(p, tr, p->prev, TZ_PLAN_GRAD, gacc, USE_PREV);
  return *n - 1;
}

/* Builds the step's phases in order (DESIGN.md "A training step"). */
static int build_phases(tz_trainer *tr) {
  int L = tr->L, G = tr->G, H = L + 1;
  tr->n_ph = G * (2 * L + 3) + tr->nb;
  free(tr->ph);
  tr->ph = calloc((size_t)tr->n_ph, sizeof *tr->ph);
  if (!tr->ph)
    return tz_err_set(TZ_ENOMEM, "train: no memory for %d phases", tr->n_ph);
  int n = 0, folded = tr->mode == TZ_OPT_FOLDED, overlapped = tr->mode == TZ_OPT_OVERLAPPED;
  /* Folded, opt(b) writes block b's parameters before anything reads them in the step; with
   * overlapped collectives that is the phase before fwd(b), which gathers them, so each opt
   * comes one phase earlier. Overlapped, opt(b) reads b's gradient once it is complete: after
   * bwd(b), or with overlapped collectives after the phase that reduce-scatters it. */
  int ov = tr->overlap;
  for (int k = 0; k < G; k++) {
    int first = k == 0, last = k == G - 1;
    if (folded && first) {
      add_phase(tr, &n, PH_OPT, 0, 0);
      if (ov)
        add_phase(tr, &n, PH_OPT, 1, 0);
    }
    add_phase(tr, &n, PH_EMBED, 0, k);
    for (int i = 0; i < L; i++) {
      if (folded && first && (ov ? i + 2 <= H : 1))
        add_phase(tr, &n, PH_OPT, ov ? i + 2 : 1 + i, 0);
      add_phase(tr, &n, PH_FWD, 1 + i, k);
    }
    if (folded && first && !ov)
      add_phase(tr, &n, PH_OPT, H, 0);
    add_phase(tr, &n, PH_HEAD, H, k);
    if (overlapped && last && !ov)
      add_phase(tr, &n, PH_OPT, H, 0);
    for (int i = L - 1; i >= 0; i--) {
      add_phase(tr, &n, PH_BWD, 1 + i, k);
      if (overlapped && last)
        add_phase(tr, &n, PH_OPT, ov ? 2 + i : 1 + i, 0);
    }
    int eb = add_phase(tr, &n, PH_EMBED_BWD, 0, k);
    if (last)
      tr->loss_phase = eb;
    if (overlapped && last) {
      if (ov)
        add_phase(tr, &n, PH_OPT, 1, 0);
      add_phase(tr, &n, PH_OPT, 0, 0);
    }
  }
  if (tr->mode == TZ_OPT_UNFOLDED)
    for (int b = 0; b < tr->nb; b++)
      add_phase(tr, &n, PH_OPT, b, 0);
  return n == tr->n_ph ? 0
                       : tz_err_set(TZ_EINVAL, "train: %d phases built, %d expected", n, tr->n_ph);
}

/* ---- sizes and the plan ---- */

/* FLOP of one phase for one micro-batch; backward includes the recomputed forward. */
static double phase_flop(const tz_trainer *tr, const struct phase *p) {
  const struct tz_model_config *c = &tr->mc;
  double N = tr->N, C = c->d_model, V = c->vocab;
  double layer = tz_model_layer_flop(c, tr->B, tr->T);
  switch (p->kind) {
  case PH_FWD:
    return layer;
  case PH_BWD:
    return 3.0 * layer;
  case PH_HEAD:
    return 3.0 * 2.0 * N * C * V;
  default:
    return 0;
  }
}

static uint64_t sizes_total(const uint64_t *sizes, int n) {
  uint64_t t = 0;
  for (int i = 0; i < n; i++)
    t += round_up(sizes[i], 256);
  return t;
}

enum {
  BUF_TOKENS,
  BUF_TARGETS,
  BUF_DX,
  BUF_ACTS,
  BUF_LS,
  BUF_HS,
  BUF_GW,
  BUF_GWE,
  BUF_FG,
  BUF_FGE,
  BUF_PARTIALS,
  BUF_SCAL,
  BUF_X,
  BUF_COUNT
};

static void buffer_sizes(const tz_trainer *tr, uint64_t *sz) {
  const struct tz_model_config *c = &tr->mc;
  uint64_t x = (uint64_t)tr->N * (uint64_t)c->d_model * tr->es, maxp = 0;
  for (int b = 1; b < tr->nb; b++)
    if (tr->padded[b] > maxp)
      maxp = tr->padded[b];
  sz[BUF_TOKENS] = sz[BUF_TARGETS] = (uint64_t)tr->G * (uint64_t)tr->N * sizeof(int32_t);
  sz[BUF_DX] = x;
  sz[BUF_ACTS] = tz_model_acts_bytes(c, tr->S, tr->B, tr->T);
  sz[BUF_LS] = tz_model_scratch_bytes(c, tr->S, tr->B, tr->T);
  sz[BUF_HS] = tz_model_head_scratch_bytes(c, tr->S, tr->B, tr->T);
  sz[BUF_GW] = maxp * tr->es * (tr->overlap ? 2 : 1);
  sz[BUF_GWE] = tr->padded[0] * tr->es;
  sz[BUF_FG] = maxp * sizeof(float) * (tr->overlap ? 2 : 1);
  sz[BUF_FGE] = tr->padded[0] * sizeof(float);
  sz[BUF_PARTIALS] = tr->n_seg * sizeof(float);
  sz[BUF_SCAL] = 4 * sizeof(float);
  sz[BUF_X] = (uint64_t)(tr->L + 1) * round_up(x, 256);
}

static int tier_of_device(enum tz_offload_device d) {
  return d == TZ_OFFLOAD_CPU ? TZ_PLAN_HOST : d == TZ_OFFLOAD_NVME ? TZ_PLAN_NVME : TZ_PLAN_COMPUTE;
}

static const char *nvme_dir(const struct tz_config *c) {
  if (c->tierzero.nvme_path.n > 0)
    return c->tierzero.nvme_path.path[0];
  if (c->zero_optimization.offload_optimizer.nvme_path)
    return c->zero_optimization.offload_optimizer.nvme_path;
  return c->zero_optimization.offload_param.nvme_path;
}

/* The host tier's default capacity: the memory available now (MemAvailable: free plus what the
 * kernel can reclaim) less a tenth of the machine's, at least 8 GiB, for everything else. */
static uint64_t host_default_budget(void) {
  uint64_t avail = 0, total = 0;
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char key[64];
    unsigned long long kib;
    while (fscanf(f, "%63s %llu kB", key, &kib) == 2) {
      if (strcmp(key, "MemAvailable:") == 0)
        avail = (uint64_t)kib << 10;
      else if (strcmp(key, "MemTotal:") == 0)
        total = (uint64_t)kib << 10;
    }
    fclose(f);
  }
  if (!avail) { /* no /proc: half of the free pages */
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 2 : 0;
  }
  uint64_t keep = total / 10 > (8ull << 30) ? total / 10 : (8ull << 30);
  return avail > keep ? round_up(avail - keep, ALIGN) - ALIGN : 0;
}

/* Which blocks the CPU steps at their homes: the last ones, until they hold tierzero.cpu_adam of
 * the parameters (their forward comes late in the step, and their gradients first in backward).
 * The default: every block on a CPU-only machine, none with a GPU. */
static void choose_cpu_steps(tz_trainer *tr, double share) {
  if (share < 0)
    share = tr->gpu ? 0 : 1;
  tr->cpu_share = share;
  uint64_t total = 0, taken = 0;
  for (int b = 0; b < tr->nb; b++)
    total += tr->numel[b];
  for (int b = tr->nb - 1; b >= 0; b--) {
    tr->cpu_step[b] = share > 0 && (double)taken < share * (double)total;
    taken += tr->cpu_step[b] ? tr->numel[b] : 0;
  }
}

/* Recomputes plan's bound and lane figures for the request r (its phases changed), keeping its
 * homes and window. */
static int rebound(const struct tz_plan_request *r, struct tz_plan *plan) {
  struct tz_plan b;
  memset(&b, 0, sizeof b);
  TZ_CHECK(tz_plan_bound(r, plan->tier, plan->window, &b));
  plan->bound_s = b.bound_s;
  plan->compute_s = b.compute_s;
  memcpy(plan->lane_s, b.lane_s, sizeof plan->lane_s);
  memcpy(plan->moved, b.moved, sizeof plan->moved);
  plan->lookahead = b.lookahead;
  plan->unknown_rates = b.unknown_rates;
  tz_plan_free(&b);
  return 0;
}

/* Whether phase i runs at its blocks' homes on the scheduler's home lane, with the homes `tiers`:
 * an opt phase of a block the CPU steps (choose_cpu_steps), whose state lives in host memory
 * (nothing on nvme; on a GPU every use at home, the gradient too). CPU Adam then updates the
 * shards in place instead of copying them into the compute tier and back, and overlaps the
 * compute lane. Unfolded steps keep opt on the compute lane: there it must follow the step's
 * finish_step, which only the compute lane's order gives. */
static int home_phase(const tz_trainer *tr, int i, const int8_t *tiers) {
  const struct phase *ph = &tr->ph[i];
  if (ph->kind != PH_OPT || !tr->cpu_step[ph->block] || tr->mode == TZ_OPT_UNFOLDED)
    return 0;
  int host = 0, nvme = 0, device = 0;
  for (int u = 0; u < ph->n_uses; u++) {
    int t = tiers[ph->blocks[u] * TZ_PLAN_KINDS + ph->kinds[u]];
    host |= t == TZ_PLAN_HOST;
    nvme |= t == TZ_PLAN_NVME;
    device |= t == TZ_PLAN_COMPUTE && tr->gpu;
  }
  return host && !nvme && !device;
}

static int make_plan(tz_trainer *tr, const struct tz_trainer_params *p) {
  const struct tz_config *c = &tr->cfg;
  struct tz_plan_phase *pp = calloc((size_t)tr->n_ph, sizeof *pp);
  if (!pp)
    return tz_err_set(TZ_ENOMEM, "train: no memory for the plan");
  int rc = 0;
  double share = tr->world > 1 ? (double)(tr->world - 1) / tr->world : 0;
  for (int i = 0; i < tr->n_ph; i++) {
    const struct phase *ph = &tr->ph[i];
    snprintf(pp[i].name, sizeof pp[i].name, "%s", ph->name);
    pp[i].flop = phase_flop(tr, ph);
    if (ph->kind == PH_OPT) {
      pp[i].adam_elems = (double)tr->shard[ph->block];
    } else if (!tr->overlap) {
      int reads = ph->kind != PH_EMBED_BWD, grads = ph->kind >= PH_HEAD;
      pp[i].coll_bytes = share * (double)tr->padded[ph->block] *
                         ((double)reads * (double)tr->es + (double)grads * 4.0);
    } else {
      /* The embedding's own gather and reduce-scatter hold the phase up; the next layer's gather
       * and the previous one's reduce-scatter run beside its compute, and the phase after waits
       * for them. */
      if (ph->kind == PH_EMBED || ph->kind == PH_EMBED_BWD)
        pp[i].coll_bytes =
            share * (double)tr->padded[0] * (ph->kind == PH_EMBED ? (double)tr->es : 4.0);
      if (ph->next >= 0)
        pp[i].coll_async += share * (double)tr->padded[ph->next] * (double)tr->es;
      if (ph->prev >= 0)
        pp[i].coll_async += share * (double)tr->padded[ph->prev] * 4.0;
    }
    pp[i].n_uses = ph->n_uses;
    for (int u = 0; u < ph->n_uses; u++)
      pp[i].uses[u] = (struct tz_plan_use){ph->blocks[u], ph->kinds[u], ph->uses[u].access};
  }
  uint64_t sz[BUF_COUNT];
  buffer_sizes(tr, sz);
  struct tz_plan_request r;
  memset(&r, 0, sizeof r);
  r.n_groups = tr->nb;
  r.bytes = (const uint64_t(*)[TZ_PLAN_KINDS])tr->bytes;
  r.n_phases = tr->n_ph;
  r.phases = pp;
  r.compute_fixed = round_up(sizes_total(sz, BUF_COUNT), ALIGN);
  r.align = ALIGN;
  r.chunk = tz_runtime_chunk_bytes(tr->rt);
  r.window = p->window;
  r.lookahead = c->tierzero.lookahead > 0 ? c->tierzero.lookahead : 0;
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    r.force[k] = TZ_PLAN_AUTO;
  if (!p->auto_placement) {
    int pt = tier_of_device(c->zero_optimization.offload_param.device);
    int ot = tier_of_device(c->zero_optimization.offload_optimizer.device);
    r.force[TZ_PLAN_PARAM] = pt;
    r.force[TZ_PLAN_MASTER] = r.force[TZ_PLAN_M] = r.force[TZ_PLAN_V] = ot;
    /* Gradient shards are written by every micro-batch's backward. On a GPU, whose Adam runs
     * in its memory, they stay there: taking them to the host and back would add 8 bytes per
     * parameter and step to the host link. On a CPU-only machine they go with the optimizer
     * state, except to NVMe: there they stay in host memory, as ZeRO-Infinity keeps them. */
    r.force[TZ_PLAN_GRAD] = tr->gpu ? TZ_PLAN_COMPUTE : ot == TZ_PLAN_NVME ? TZ_PLAN_HOST : ot;
  }
  r.force_each = p->force_tiers;
  /* On a GPU, the blocks the CPU steps (tierzero.cpu_adam) keep their gradients at home with the
   * optimizer state, which must be in host memory: forced placement only. */
  int8_t *each = NULL;
  int split = 0;
  for (int b = 0; b < tr->nb; b++)
    split |= tr->cpu_step[b];
  if (tr->gpu && split) {
    if (p->auto_placement || r.force[TZ_PLAN_MASTER] != TZ_PLAN_HOST) {
      memset(tr->cpu_step, 0, (size_t)tr->nb);
      TZ_WARN("train: tierzero.cpu_adam needs the optimizer state offloaded to cpu by the config "
              "(offload_optimizer.device cpu, no --auto-placement); Adam runs on the GPU");
    } else {
      each = malloc((size_t)tr->nb * TZ_PLAN_KINDS);
      if (!each) {
        free(pp);
        return tz_err_set(TZ_ENOMEM, "train: no memory for the plan");
      }
      for (int i = 0; i < tr->nb * TZ_PLAN_KINDS; i++)
        each[i] = p->force_tiers ? p->force_tiers[i] : TZ_PLAN_AUTO;
      for (int b = 0; b < tr->nb; b++)
        if (tr->cpu_step[b])
          each[b * TZ_PLAN_KINDS + TZ_PLAN_GRAD] = TZ_PLAN_HOST;
      r.force_each = each;
    }
  }
  if (p->rates)
    r.rates = *p->rates;
  if (tr->layer_rate > 0)
    r.rates.flops = tr->layer_rate;
  /* Home phases, as far as forced homes tell before the plan (checked against its homes below). */
  r.home_on_compute = !tr->gpu;
  int8_t *guess = malloc((size_t)tr->nb * TZ_PLAN_KINDS);
  if (!guess) {
    free(each);
    free(pp);
    return tz_err_set(TZ_ENOMEM, "train: no memory for the plan");
  }
  for (int i = 0; i < tr->nb * TZ_PLAN_KINDS; i++) {
    int f = r.force_each ? r.force_each[i] : TZ_PLAN_AUTO;
    f = f == TZ_PLAN_AUTO ? r.force[i % TZ_PLAN_KINDS] : f;
    guess[i] = (int8_t)(f == TZ_PLAN_AUTO ? TZ_PLAN_COMPUTE : f);
  }
  for (int i = 0; i < tr->n_ph; i++)
    pp[i].at_home = home_phase(tr, i, guess);
  free(guess);
  uint64_t state = 0;
  for (int b = 0; b < tr->nb; b++)
    for (int k = 0; k < TZ_PLAN_KINDS; k++)
      state += round_up(tr->bytes[b][k], ALIGN);
  /* Capacities. The compute tier: tierzero.hbm_budget; without one, room for the buffers, the
   * homes forced into it and a window of a quarter of the state (on a CPU-only machine the
   * compute tier is host memory, and a small window makes every path of the scheduler run). */
  r.capacity[TZ_PLAN_COMPUTE] = c->tierzero.hbm_budget;
  uint64_t gpu_free = 0;
  if (tr->gpu) {
    uint64_t total = 0;
    if (p->plan_only && p->gpu_free) {
      gpu_free = total = p->gpu_free;
    } else if ((rc = tz_compute_device_memory(tr->backend, tr->device, &gpu_free, &total)) < 0) {
      free(each);
      free(pp);
      return rc;
    }
    /* Left to the CUDA context's growth, cuBLASLt, NCCL and the allocator's slack. */
    uint64_t reserve = total / 32 > (2ull << 30) ? total / 32 : (2ull << 30);
    gpu_free = gpu_free > reserve ? round_up(gpu_free - reserve, ALIGN) - ALIGN : 0;
  }
  if (!r.capacity[TZ_PLAN_COMPUTE] && tr->gpu && p->auto_placement) {
    /* The plan chooses: every free byte of the GPU, the window what the homes leave. */
    r.capacity[TZ_PLAN_COMPUTE] = gpu_free;
  } else if (!r.capacity[TZ_PLAN_COMPUTE]) {
    /* Placement forced by the config: the compute tier holds the buffers, the homes forced into
     * it and a window, not a cache of the state offloaded elsewhere (DeepSpeed's offload means
     * the GPU holds a working set). The window: a quarter of the state on a CPU-only machine,
     * so that the scheduler streams; four times the largest phase's working set on a GPU, room
     * to prefetch a few phases ahead. */
    uint64_t forced = 0;
    for (int b = 0; b < tr->nb; b++)
      for (int k = 0; k < TZ_PLAN_KINDS; k++) {
        int f = p->force_tiers ? p->force_tiers[b * TZ_PLAN_KINDS + k] : TZ_PLAN_AUTO;
        if (f == TZ_PLAN_AUTO)
          f = r.force[k];
        forced += f == TZ_PLAN_COMPUTE ? round_up(tr->bytes[b][k], ALIGN) : 0;
      }
    uint64_t min = tz_plan_min_window(&r);
    uint64_t window = p->window ? p->window : tr->gpu ? 4 * min : round_up(state / 4, ALIGN);
    if (window < min)
      window = min;
    r.capacity[TZ_PLAN_COMPUTE] = r.compute_fixed + forced + window;
    if (tr->gpu && r.capacity[TZ_PLAN_COMPUTE] > gpu_free && !p->window) {
      /* A window smaller than four phases' worth, when the GPU has no more. */
      r.capacity[TZ_PLAN_COMPUTE] = gpu_free;
      window = gpu_free > r.compute_fixed + forced ? gpu_free - r.compute_fixed - forced : 0;
    }
    if (!p->window)
      r.window = window;
  }
  /* Without a budget, the ranks (taken to share this machine) share what is available. */
  r.capacity[TZ_PLAN_HOST] = c->tierzero.host_budget
                                 ? c->tierzero.host_budget
                                 : round_up(host_default_budget() / (uint64_t)tr->world, ALIGN);
  const char *dir = nvme_dir(c);
  r.capacity[TZ_PLAN_NVME] = 0;
  if (dir) {
    struct statvfs vfs;
    r.capacity[TZ_PLAN_NVME] = c->tierzero.nvme_budget;
    if (!r.capacity[TZ_PLAN_NVME] && statvfs(dir, &vfs) == 0)
      r.capacity[TZ_PLAN_NVME] = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize / 2;
  }
  rc = tz_plan_make(&r, &tr->plan);
  if (rc == 0) {
    /* The phases that will run at the homes with the plan's homes; the bound again if the
     * guess above was wrong for any. */
    int changed = 0;
    for (int i = 0; i < tr->n_ph; i++) {
      tr->at_home[i] = home_phase(tr, i, tr->plan.tier);
      changed |= tr->at_home[i] != pp[i].at_home;
      pp[i].at_home = tr->at_home[i];
    }
    if (changed)
      rc = rebound(&r, &tr->plan);
  }
  free(each);
  free(pp);
  return rc;
}

/* tierzero.cpu_adam_search: of the shares 0, 1/8, ..., 1, the one whose plan predicts the least
 * bound (the smaller on a tie within a part in a billion); shares whose plan does not fit are
 * passed over. With a GPU only where the share can apply (make_plan): otherwise, and when a
 * plan's rates are unknown, the default. Leaves cpu_step chosen for make_plan to plan again. */
static int search_cpu_steps(tz_trainer *tr, const struct tz_trainer_params *p) {
  const struct tz_config *c = &tr->cfg;
  int applies = !tr->gpu || (!p->auto_placement &&
                             tier_of_device(c->zero_optimization.offload_optimizer.device) ==
                                 TZ_PLAN_HOST);
  double best = -1, best_bound = 0;
  for (int k = 0; applies && k <= 8; k++) {
    choose_cpu_steps(tr, k / 8.0);
    int rc = make_plan(tr, p);
    int known = rc == 0 && !tr->plan.unknown_rates;
    double bound = tr->plan.bound_s;
    tz_plan_free(&tr->plan);
    if (known && (best < 0 || bound < best_bound * (1 - 1e-9))) {
      best = k / 8.0;
      best_bound = bound;
    }
  }
  choose_cpu_steps(tr, best >= 0 ? best : c->tierzero.cpu_adam);
  return 0;
}

double tz_trainer_cpu_adam(const tz_trainer *tr) { return tr->cpu_share; }

/* ---- creation ---- */

static int check_options(tz_trainer *tr, const struct tz_trainer_params *p) {
  const struct tz_config *c = &tr->cfg;
  if (c->train_micro_batch_size_per_gpu < 1 || c->gradient_accumulation_steps < 1)
    return tz_err_set(TZ_ECONFIG, "train: batch sizes are not resolved (tz_config_resolve_batch)");
  if (c->train_micro_batch_size_per_gpu > INT32_MAX / 2 || c->gradient_accumulation_steps > 65536)
    return tz_err_set(TZ_ECONFIG, "train: micro batch %lld or accumulation %lld out of range",
                      (long long)c->train_micro_batch_size_per_gpu,
                      (long long)c->gradient_accumulation_steps);
  if (p->seq_len < 1 || p->seq_len > tr->mc.max_seq)
    return tz_err_set(TZ_ECONFIG, "train: sequence length %d is not in [1, max_seq %d]", p->seq_len,
                      tr->mc.max_seq);
  if (c->zero_optimization.stage != 3)
    TZ_WARN("train: zero_optimization.stage %d: tierzero always shards parameters, gradients and "
            "optimizer state (stage 3)",
            c->zero_optimization.stage);
  if (c->communication_data_type != TZ_PRECISION_FP32)
    return tz_err_set(TZ_ECONFIG,
                      "train: communication_data_type %s: gradients are reduced in "
                      "fp32 only",
                      c->communication_data_type == TZ_PRECISION_BF16 ? "bf16" : "fp16");
  if (c->gradient_predivide_factor != 1.0 || c->prescale_gradients)
    return tz_err_set(TZ_ECONFIG, "train: gradient_predivide_factor and prescale_gradients are not "
                                  "supported (the mean is taken once, in the loss gradient)");
  tr->clip = c->gradient_clipping;
  tr->mode = p->opt_mode;
  if (tr->mode == TZ_OPT_AUTO)
    tr->mode = tr->clip > 0 ? TZ_OPT_FOLDED : TZ_OPT_OVERLAPPED;
  if (tr->mode == TZ_OPT_OVERLAPPED && tr->clip > 0)
    return tz_err_set(TZ_ECONFIG,
                      "train: the optimizer step cannot overlap backward with "
                      "gradient_clipping %g: the global norm is known only when backward ends "
                      "(use folded or unfolded)",
                      tr->clip);
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

/* 1 when this build has the compute backend `name`. */
static int backend_built(const char *name) {
  for (int i = 0; i < tz_compute_backend_count(); i++)
    if (strcmp(tz_compute_backend_name(i), name) == 0)
      return 1;
  return 0;
}

/* The compute backend and its storage dtype, before anything is allocated (the plan needs the
 * dtype): cpu computes in fp32; cuda in bf16, or fp16 with fp16.enabled, on GPU tr->device. */
static int choose_backend(tz_trainer *tr, const struct tz_trainer_params *p) {
  const char *backend = p->compute_backend ? p->compute_backend : "cpu";
  const char *comm = tz_comm_backend(tr->comm);
  if (strcmp(backend, "cpu") == 0) {
    tr->backend = "cpu";
    tr->S = TZ_F32;
    if (tr->cfg.precision == TZ_PRECISION_BF16)
      TZ_WARN("train: the cpu backend computes in fp32; bf16.enabled is ignored");
    else if (tr->cfg.precision == TZ_PRECISION_FP16)
      TZ_INFO("train: the cpu backend computes in fp32; fp16 loss scaling still applies");
    if (strcmp(comm, "nccl") == 0)
      return tz_err_set(TZ_ENOTSUP, "train: the nccl comm reduces device buffers, and the cpu "
                                    "backend's are in host memory: run CPU ranks under mpirun (the "
                                    "mpi comm)");
  } else if (strcmp(backend, "cuda") == 0) {
    if (!backend_built("cuda"))
      return tz_err_set(TZ_ENOTSUP, "train: compute backend 'cuda': this build has no CUDA");
    tr->backend = "cuda";
    tr->gpu = 1;
    tr->S = tr->cfg.precision == TZ_PRECISION_FP16 ? TZ_F16 : TZ_BF16;
    if (tr->cfg.precision == TZ_PRECISION_FP32)
      TZ_INFO("train: the cuda backend computes in bf16 (neither bf16 nor fp16 is enabled); "
              "master weights, Adam state, gradients and reductions stay fp32");
    if (strcmp(comm, "mpi") == 0)
      return tz_err_set(TZ_ENOTSUP, "train: the mpi comm reduces host buffers, and the cuda "
                                    "backend's are in GPU memory: start one worker per GPU "
                                    "(tz-train --nproc N, or torchrun), which use the nccl comm");
    /* The GPU: the caller's, else the config's, else the calling thread's current device (the
     * nccl comm makes it the local rank's). */
    struct tz_compute_device d;
    TZ_CHECK(tz_compute_device_info("cuda", p->device >= 0 ? p->device : tr->cfg.tierzero.device,
                                    &d));
    tr->device = d.index;
    snprintf(tr->device_name, sizeof tr->device_name, "%s", d.name);
  } else {
    return tz_err_set(TZ_ENOENT, "train: no compute backend '%s' (cpu or cuda)", backend);
  }
  tr->es = tz_dtype_size(tr->S);
  return 0;
}

/* The compute instance: after the compute tier and, on a GPU, the lane, whose stream it enqueues
 * on (so that the scheduler's waits on that lane order its work). */
static void compute_params(const tz_trainer *tr, struct tz_compute_params *cp) {
  tz_compute_params_init(cp);
  cp->n_threads = tr->cfg.tierzero.threads;
  cp->dtype = tr->S;
  cp->grad_dtype = TZ_F32;
  cp->device = tr->device;
}

static int create_compute(tz_trainer *tr) {
  struct tz_compute_params cp;
  compute_params(tr, &cp);
  if (tr->lane)
    cp.stream = tz_lane_native(tr->lane);
  return tz_compute_create(tr->backend, &cp, &tr->cm);
}

/* The rate the plan's compute lane runs at: one layer's forward and backward with recompute (its
 * fwd and bwd phases) at the run's micro-batch, on an instance of the run's compute backend that
 * lives only for this. A 4096^3 matmul (rates->flops) runs faster than a layer, whose attention,
 * norms and elementwise kernels it does not count: llama-7b's step on an H200 took 1.8 times the
 * bound it gave. */
static int measure_layer(tz_trainer *tr) {
  struct tz_compute_params cp;
  compute_params(tr, &cp);
  tz_compute *cm = NULL;
  TZ_CHECK(tz_compute_create(tr->backend, &cp, &cm));
  double s = 0;
  int rc = tz_layer_probe_time(cm, &tr->mc, tr->B, tr->T, 3, &s);
  tz_compute_destroy(cm);
  TZ_CHECK(rc);
  tr->layer_rate = s > 0 ? 4.0 * tz_model_layer_flop(&tr->mc, tr->B, tr->T) / s : 0;
  return 0;
}

double tz_trainer_layer_rate(const tz_trainer *tr) { return tr->layer_rate; }

/* The GPU's compute lane. With more than one rank the nccl comm enqueues its collectives on its
 * own stream from the calling thread: the lane adopts that stream, so that compute and
 * collectives, both launched by the client thread in phase order, are ordered by the stream;
 * with overlapped collectives the lane gets a stream of its own, ordered with the comm's through
 * a second lane on the comm's stream (stream_order). */
static int create_lane(tz_trainer *tr) {
  if (tr->world == 1)
    return tz_lane_create_device(tr->t_compute, NULL, NULL, &tr->lane);
  void **s = tz_comm_native(tr->comm, "cuda_stream");
  if (!s || !*s)
    return tz_err_set(TZ_ENOTSUP, "train: the %s comm has no CUDA stream for the GPU lane",
                      tz_comm_backend(tr->comm));
  if (!tr->overlap) {
    TZ_CHECK(tz_lane_create_device(tr->t_compute, *s, NULL, &tr->lane));
  } else {
    /* Overlapped collectives: the lane on a stream of its own beside the comm's. */
    TZ_CHECK(tz_lane_create_device(tr->t_compute, *s, "comm", &tr->comm_lane));
    tr->split = 1;
    TZ_CHECK(tz_lane_create_device(tr->t_compute, NULL, NULL, &tr->lane));
  }
  /* The timing marks of the step's collectives (coll_event): at most four per phase. */
  int cap = 4 * tr->n_ph + 8;
  TZ_CHECK(tz_lane_timer_create(tr->lane, 2 * cap * 2, &tr->coll_timer));
  tr->coll_cap = cap;
  return 0;
}

static int sizes(tz_trainer *tr) {
  int nb = tr->nb;
  tr->numel = calloc((size_t)nb, sizeof *tr->numel);
  tr->padded = calloc((size_t)nb, sizeof *tr->padded);
  tr->shard = calloc((size_t)nb, sizeof *tr->shard);
  tr->seg_off = calloc((size_t)nb, sizeof *tr->seg_off);
  tr->bytes = calloc((size_t)nb, sizeof *tr->bytes);
  tr->home = calloc((size_t)nb, sizeof *tr->home);
  tr->names = calloc((size_t)nb + 1, sizeof *tr->names);
  tr->cpu_step = calloc((size_t)nb, 1);
  if (!tr->numel || !tr->padded || !tr->shard || !tr->seg_off || !tr->bytes || !tr->home ||
      !tr->names || !tr->cpu_step)
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  uint64_t unit = (uint64_t)tr->world * TZ_TRAIN_NORM_SEGMENT;
  for (int b = 0; b < nb; b++) {
    tr->numel[b] = tz_model_block_numel(&tr->mc, b);
    tr->padded[b] = round_up(tr->numel[b], unit);
    tr->shard[b] = tr->padded[b] / (uint64_t)tr->world;
    tr->seg_off[b] = tr->n_seg;
    tr->n_seg += (tr->numel[b] + TZ_TRAIN_NORM_SEGMENT - 1) / TZ_TRAIN_NORM_SEGMENT;
    tr->bytes[b][TZ_PLAN_PARAM] = tr->shard[b] * tr->es;
    for (int k = TZ_PLAN_MASTER; k < TZ_PLAN_KINDS; k++)
      tr->bytes[b][k] = tr->shard[b] * sizeof(float);
    char name[32];
    if (b == 0)
      snprintf(name, sizeof name, "embed");
    else if (b == nb - 1)
      snprintf(name, sizeof name, "head");
    else
      snprintf(name, sizeof name, "layer%d", b - 1);
    if (!(tr->names[b] = strdup(name)))
      return tz_err_set(TZ_ENOMEM, "train: no memory");
  }
  return 0;
}

static int create_tiers(tz_trainer *tr) {
  const struct tz_config *c = &tr->cfg;
  const struct tz_plan *pl = &tr->plan;
  uint64_t sz[BUF_COUNT];
  buffer_sizes(tr, sz);
  struct tz_tier_params tp;
  tz_tier_params_init(&tp);
  tp.name = "compute";
  tp.numa_node = c->tierzero.numa_node;
  tp.capacity = pl->compute_fixed + pl->used[TZ_PLAN_COMPUTE] + pl->window;
  tp.device = tr->device;
  TZ_CHECK(tz_tier_create(tr->rt, tr->gpu ? "hbm" : "host", &tp, &tr->t_compute));
  if (pl->used[TZ_PLAN_HOST]) {
    tz_tier_params_init(&tp);
    tp.name = "host";
    tp.numa_node = c->tierzero.numa_node;
    tp.capacity = pl->used[TZ_PLAN_HOST];
    TZ_CHECK(tz_tier_create(tr->rt, "host", &tp, &tr->t_host));
  }
  if (pl->used[TZ_PLAN_NVME]) {
    const char *dir = nvme_dir(c);
    if (!dir)
      return tz_err_set(TZ_ECONFIG,
                        "train: state is placed on nvme but no directory is given "
                        "(tierzero.nvme_path or zero_optimization.offload_*.nvme_path)");
    tz_tier_params_init(&tp);
    tp.name = "nvme";
    tp.capacity = pl->used[TZ_PLAN_NVME];
    if (c->tierzero.nvme_path.n > 0) {
      tp.n_paths = c->tierzero.nvme_path.n;
      for (int i = 0; i < tp.n_paths; i++)
        tp.paths[i] = c->tierzero.nvme_path.path[i];
    } else {
      tp.paths[0] = dir;
      tp.n_paths = 1;
    }
    tp.checksum = c->tierzero.nvme_checksum;
    tp.buffered = c->tierzero.nvme_buffered;
    /* DeepSpeed's aio.block_size (1 MiB unless set) is the stripe unit: the size of a request. */
    tp.queue_depth = c->tierzero.queue_depth;
    if (c->aio.block_size > 0)
      tp.stripe_bytes = (uint64_t)c->aio.block_size;
    tp.faults = c->tierzero.faults;
    if (c->tierzero.faults) {
      /* Fault injection (tests): the nvme tier wrapped in a fault tier, used only through it. */
      tp.name = "nvme-base";
      TZ_CHECK(tz_tier_create(tr->rt, "nvme", &tp, &tr->t_nvme_base));
      struct tz_tier_params fp;
      tz_tier_params_init(&fp);
      fp.name = "nvme";
      fp.capacity = pl->used[TZ_PLAN_NVME];
      fp.base = tr->t_nvme_base;
      fp.faults = c->tierzero.faults;
      TZ_CHECK(tz_tier_create(tr->rt, "fault", &fp, &tr->t_nvme));
    } else {
      TZ_CHECK(tz_tier_create(tr->rt, "nvme", &tp, &tr->t_nvme));
    }
  }
  /* The step's tokens and results cross to the compute tier through a host tier of their own,
   * which the runtime page-locks for a GPU (a copy from pageable memory is staged by the driver
   * and blocks). */
  uint64_t tok = round_up((uint64_t)tr->G * (uint64_t)tr->N * 2 * sizeof(int32_t), 256);
  tz_tier_params_init(&tp);
  tp.name = "io";
  tp.numa_node = c->tierzero.numa_node;
  tp.capacity = round_up(2 * tok + 256, ALIGN);
  TZ_CHECK(tz_tier_create(tr->rt, "host", &tp, &tr->t_io));
  TZ_CHECK(tz_tier_alloc(tr->t_io, tp.capacity, &tr->io));
  char *io = tz_tier_host_ptr(tr->t_io, tr->io.offset);
  tr->host_tokens[0] = (int32_t *)io;
  tr->host_tokens[1] = (int32_t *)(io + tok);
  tr->host_scal = (float *)(io + 2 * tok);
  if (tr->gpu)
    TZ_CHECK(create_lane(tr));
  TZ_CHECK(create_compute(tr));
  TZ_CHECK(tz_tier_alloc(tr->t_compute, pl->compute_fixed, &tr->buf));
  char *base = tier_ptr(tr->t_compute, tr->buf.offset), *q = base;
#define CARVE(i) (q += round_up(sz[i], 256), q - round_up(sz[i], 256))
  tr->tokens = (int32_t *)CARVE(BUF_TOKENS);
  tr->targets = (int32_t *)CARVE(BUF_TARGETS);
  tr->dx = CARVE(BUF_DX);
  tz_model_acts_carve(&tr->mc, tr->S, tr->B, tr->T, CARVE(BUF_ACTS), &tr->acts);
  tz_model_scratch_carve(&tr->mc, tr->S, tr->B, tr->T, CARVE(BUF_LS), &tr->ls);
  tz_model_head_scratch_carve(&tr->mc, tr->S, tr->B, tr->T, CARVE(BUF_HS), &tr->hs);
  tr->gw = CARVE(BUF_GW);
  tr->gw_embed = CARVE(BUF_GWE);
  tr->fg = (float *)CARVE(BUF_FG);
  tr->gw2[0] = tr->gw;
  tr->fg2[0] = tr->fg;
  tr->gw2[1] = tr->overlap ? (char *)tr->gw + sz[BUF_GW] / 2 : tr->gw;
  tr->fg2[1] = tr->overlap ? (float *)((char *)tr->fg + sz[BUF_FG] / 2) : tr->fg;
  tr->fg_embed = (float *)CARVE(BUF_FGE);
  tr->partials = (float *)CARVE(BUF_PARTIALS);
  tr->scal = (float *)CARVE(BUF_SCAL);
  char *xs = CARVE(BUF_X);
#undef CARVE
  uint64_t xb = round_up((uint64_t)tr->N * (uint64_t)tr->mc.d_model * tr->es, 256);
  for (int i = 0; i <= tr->L; i++)
    tr->x[i] = xs + (uint64_t)i * xb;
  TZ_CHECK(tz_compute_zero(tr->cm, base, (size_t)pl->compute_fixed));
  return tz_compute_sync(tr->cm);
}

static tz_tier *tier_for(tz_trainer *tr, int t) {
  return t == TZ_PLAN_COMPUTE ? tr->t_compute : t == TZ_PLAN_HOST ? tr->t_host : tr->t_nvme;
}

/* Allocates every home and writes the rank's initial shard into it. */
/* Sets bytes to zero on every core. */
static void host_zero(void *dst, uint64_t bytes) {
  const uint64_t piece = 1u << 22;
  int64_t n = (int64_t)((bytes + piece - 1) / piece);
#pragma omp parallel for schedule(static) if (n > 1)
  for (int64_t i = 0; i < n; i++) {
    uint64_t off = (uint64_t)i * piece;
    memset((char *)dst + off, 0, bytes - off < piece ? bytes - off : piece);
  }
}

/* Two buffers of `most` floats for the shards of homes outside host memory. With a GPU they lie
 * in a host tier of their own, which the runtime page-locks: a copy from pageable memory is staged
 * by the driver a piece at a time (llama-7b's 113 GiB of homes in HBM took minutes that way). */
static int init_buffers(tz_trainer *tr, uint64_t most, tz_tier **stage, float **f32, float **buf) {
  *stage = NULL;
  *f32 = *buf = NULL;
  uint64_t each = round_up(most * sizeof(float), ALIGN);
  if (tr->gpu) {
    struct tz_tier_params tp;
    tz_tier_params_init(&tp);
    tp.name = "init";
    tp.numa_node = tr->cfg.tierzero.numa_node;
    tp.capacity = 2 * each;
    tz_extent e = {0};
    TZ_CHECK(tz_tier_create(tr->rt, "host", &tp, stage));
    int rc = tz_tier_alloc(*stage, 2 * each, &e);
    if (rc < 0) {
      tz_tier_destroy(*stage);
      *stage = NULL;
      return rc;
    }
    *f32 = tz_tier_host_ptr(*stage, e.offset);
    *buf = (float *)((char *)*f32 + each);
    return 0;
  }
  if (posix_memalign((void **)f32, ALIGN, each) != 0 ||
      posix_memalign((void **)buf, ALIGN, each) != 0) {
    free(*f32);
    *f32 = NULL;
    return tz_err_set(TZ_ENOMEM, "train: no memory to initialise shards");
  }
  return 0;
}

/* Allocates every home and writes the rank's initial shard into it: straight into homes in host
 * memory (the master generated in place, the rest converted or zeroed on every core), zeros into
 * the GPU's homes by the GPU, through a buffer into the others. */
static int init_homes(tz_trainer *tr) {
  uint64_t most = 0;
  for (int b = 0; b < tr->nb; b++)
    if (tr->shard[b] > most)
      most = tr->shard[b];
  tz_tier *stage = NULL;
  float *f32 = NULL, *buf = NULL;
  TZ_CHECK(init_buffers(tr, most, &stage, &f32, &buf));
  int rc = 0, zeroed_on_device = 0;
  for (int b = 0; b < tr->nb && rc == 0; b++) {
    uint64_t n = tr->shard[b], begin = (uint64_t)tr->rank * n;
    void *at[TZ_PLAN_KINDS];  /* host addresses of the homes, NULL for device or nvme homes */
    void *dev[TZ_PLAN_KINDS]; /* device addresses of the homes in a GPU's memory */
    for (int k = 0; k < TZ_PLAN_KINDS; k++) {
      tz_tier *t = tier_for(tr, tr->plan.tier[b * TZ_PLAN_KINDS + k]);
      TZ_CHECK_GOTO(tz_tier_alloc(t, tr->bytes[b][k], &tr->home[b][k]), rc, out);
      dev[k] = tz_tier_device_ptr(t, tr->home[b][k].offset);
      at[k] = dev[k] ? NULL : tz_tier_host_ptr(t, tr->home[b][k].offset);
    }
    float *master = at[TZ_PLAN_MASTER] ? at[TZ_PLAN_MASTER] : f32;
    TZ_CHECK_GOTO(
        tz_model_init_block(&tr->mc, b, (uint64_t)tr->cfg.seed, begin, begin + n, master), rc,
        out);
    int zeroed = 0; /* buf holds zeros */
    for (int k = 0; k < TZ_PLAN_KINDS; k++) {
      uint64_t bytes = tr->bytes[b][k];
      const void *src = NULL;
      if (k == TZ_PLAN_MASTER) {
        src = master;
      } else if (k == TZ_PLAN_PARAM) {
        host_cast(at[k] ? at[k] : buf, tr->S, master, n);
        src = buf;
        zeroed = 0;
      } else if (at[k]) {
        host_zero(at[k], bytes);
      } else if (dev[k]) {
        TZ_CHECK_GOTO(tz_compute_zero(tr->cm, dev[k], (size_t)tr->home[b][k].bytes), rc, out);
        zeroed_on_device = 1;
        continue;
      } else {
        if (!zeroed)
          host_zero(buf, bytes);
        zeroed = 1;
        src = buf;
      }
      if (!at[k])
        TZ_CHECK_GOTO(tz_tier_write_sync(&tr->home[b][k], 0, src, round_up(bytes, ALIGN)), rc,
                      out);
    }
  }
out:
  if (zeroed_on_device) {
    int src = tz_compute_sync(tr->cm);
    rc = rc < 0 ? rc : src;
  }
  if (stage) {
    tz_tier_destroy(stage);
  } else {
    free(f32);
    free(buf);
  }
  return rc;
}

static int create_sched(tz_trainer *tr) {
  const struct tz_config *c = &tr->cfg;
  struct tz_sched_params sp;
  tz_sched_params_init(&sp);
  sp.compute = tr->t_compute;
  sp.budget = tr->plan.window;
  sp.lookahead = c->tierzero.lookahead >= 0 ? c->tierzero.lookahead : tr->n_ph;
  sp.jitter_us = c->tierzero.jitter_us;
  sp.seed = (uint64_t)c->seed + 1000003u * (uint64_t)tr->rank;
  sp.trace_step = (int)c->tierzero.trace_step;
  sp.trace_path = tr->trace_path;
  sp.lane = tr->lane;
  sp.debug = c->tierzero.sched_debug;
  TZ_CHECK(tz_sched_create(tr->rt, &sp, &tr->sched));
  tr->bid = calloc((size_t)tr->nb, sizeof *tr->bid);
  if (!tr->bid)
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  for (int b = 0; b < tr->nb; b++)
    for (int k = 0; k < TZ_PLAN_KINDS; k++) {
      char name[64];
      snprintf(name, sizeof name, "%s.%s", tr->names[b], tz_plan_kind_name(k));
      TZ_CHECK(
          tz_sched_block_add(tr->sched, name, tr->bytes[b][k], &tr->home[b][k], &tr->bid[b][k]));
    }
  for (int i = 0; i < tr->n_ph; i++)
    for (int u = 0; u < tr->ph[i].n_uses; u++)
      tr->ph[i].uses[u].block = tr->bid[tr->ph[i].blocks[u]][tr->ph[i].kinds[u]];
  struct tz_phase_decl *d = calloc((size_t)tr->n_ph, sizeof *d);
  if (!d)
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  for (int i = 0; i < tr->n_ph; i++) {
    d[i] = (struct tz_phase_decl){tr->ph[i].name, tr->ph[i].uses, tr->ph[i].n_uses};
  }
  int rc = tz_sched_declare_homes(tr->sched, d, tr->n_ph, tr->at_home);
  free(d);
  return rc;
}

/* Overlapped collectives (tr->overlap), with more than one rank. tierzero.overlap_collectives true
 * or false decides; auto (the default) overlaps on GPUs unless the parameters are forced off
 * them: a compute-bound step gains the collectives' time less what they slow the compute
 * (llama-7b on two H200s, everything in HBM: 1.046 -> 0.995 s), while a step bound by the host
 * link loses more to the second gathered-weight buffer's room and the next layer's shard needed
 * a phase earlier than it gains (llama-7b offloaded: 1.853 -> 1.897 s). DeepSpeed's overlap_comm
 * false turns it off. docs/training.md, "Overlapping the collectives". */
static void choose_overlap(tz_trainer *tr, const struct tz_trainer_params *p) {
  int v = tr->cfg.tierzero.overlap_collectives;
  if (v < 0)
    v = tr->gpu && (p->auto_placement ||
                    tr->cfg.zero_optimization.offload_param.device == TZ_OFFLOAD_NONE);
  tr->overlap = v && tr->cfg.zero_optimization.overlap_comm && tr->world > 1;
}

int tz_trainer_create(const struct tz_config *cfg, const struct tz_model_config *mc, tz_comm *comm,
                      tz_runtime *rt, const struct tz_trainer_params *p, tz_trainer **out) {
  *out = NULL;
  TZ_CHECK(tz_model_config_check(mc));
  struct tz_trainer_params defaults;
  if (!p) {
    tz_trainer_params_init(&defaults);
    p = &defaults;
  }
  tz_trainer *tr = calloc(1, sizeof *tr);
  if (!tr)
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  int rc = tz_config_copy(&tr->cfg, cfg);
  if (rc < 0) {
    free(tr);
    return rc;
  }
  tr->mc = *mc;
  tr->comm = comm;
  tr->rt = rt;
  tr->rank = tz_comm_rank(comm);
  tr->world = tz_comm_size(comm);
  if (p->plan_only && p->plan_world > 0) {
    tr->rank = 0;
    tr->world = p->plan_world;
  }
  tr->L = mc->n_layer;
  tr->nb = tz_model_n_blocks(mc);
  tr->tied = mc->tie_embeddings != 0;
  tr->B = (int)cfg->train_micro_batch_size_per_gpu;
  tr->G = (int)cfg->gradient_accumulation_steps;
  tr->T = p->seq_len;
  tr->N = tr->B * tr->T;
  tr->total_steps = p->total_steps;
  tr->clip_scale = 1.0f;
  tr->opt_scale = 1.0f;
  if (p->trace_path && !(tr->trace_path = strdup(p->trace_path))) {
    rc = tz_err_set(TZ_ENOMEM, "train: no memory");
    goto fail;
  }
  TZ_CHECK_GOTO(check_options(tr, p), rc, fail);
  TZ_CHECK_GOTO(choose_backend(tr, p), rc, fail);
  choose_overlap(tr, p);
  TZ_CHECK_GOTO(sizes(tr), rc, fail);
  TZ_CHECK_GOTO(build_phases(tr), rc, fail);
  if (p->plan_only && p->layer_rate > 0)
    tr->layer_rate = p->layer_rate;
  else if (p->measure_layer)
    TZ_CHECK_GOTO(measure_layer(tr), rc, fail);
  tr->at_home = calloc((size_t)tr->n_ph, sizeof *tr->at_home);
  if (!tr->at_home) {
    rc = tz_err_set(TZ_ENOMEM, "train: no memory");
    goto fail;
  }
  if (tr->cfg.tierzero.cpu_adam_search)
    TZ_CHECK_GOTO(search_cpu_steps(tr, p), rc, fail);
  else
    choose_cpu_steps(tr, tr->cfg.tierzero.cpu_adam);
  TZ_CHECK_GOTO(make_plan(tr, p), rc, fail);
  if (p->plan_only) {
    *out = tr;
    return 0;
  }
  tr->x = calloc((size_t)tr->L + 1, sizeof *tr->x);
  tr->jobs = calloc(2 * (size_t)tr->n_ph, sizeof *tr->jobs);
  if (!tr->x || !tr->jobs) {
    rc = tz_err_set(TZ_ENOMEM, "train: no memory");
    goto fail;
  }
  double t0 = now_s();
  TZ_CHECK_GOTO(create_tiers(tr), rc, fail);
  double t1 = now_s();
  TZ_CHECK_GOTO(init_homes(tr), rc, fail);
  double t2 = now_s();
  TZ_CHECK_GOTO(create_sched(tr), rc, fail);
  TZ_INFO("train: rank %d of %d, %d blocks, %d phases per step, optimizer step %s, window %llu "
          "bytes; tiers made in %.1f s, shards initialised in %.1f s, scheduler in %.1f s",
          tr->rank, tr->world, tr->nb, tr->n_ph, tz_opt_mode_name(tr->mode),
          (unsigned long long)tr->plan.window, t1 - t0, t2 - t1, now_s() - t2);
  *out = tr;
  return 0;
fail:
  tz_trainer_destroy(tr);
  return rc;
}

void tz_trainer_destroy(tz_trainer *tr) {
  if (!tr)
    return;
  tz_sched_destroy(tr->sched);
  if (tr->home)
    for (int b = 0; b < tr->nb; b++)
      for (int k = 0; k < TZ_PLAN_KINDS; k++)
        tz_tier_free(&tr->home[b][k]);
  tz_tier_free(&tr->buf);
  tz_compute_destroy(tr->cm);
  tz_lane_timer_destroy(tr->coll_timer);
  tz_lane_destroy(tr->lane);
  tz_lane_destroy(tr->comm_lane);
  tz_tier_destroy(tr->t_nvme);
  tz_tier_destroy(tr->t_nvme_base);
  tz_tier_destroy(tr->t_host);
  tz_tier_destroy(tr->t_compute);
  tz_plan_free(&tr->plan);
  if (tr->names)
    for (int b = 0; b < tr->nb; b++)
      free(tr->names[b]);
  free(tr->names);
  free(tr->numel);
  free(tr->padded);
  free(tr->shard);
  free(tr->seg_off);
  free(tr->bytes);
  free(tr->home);
  free(tr->bid);
  free(tr->ph);
  free(tr->jobs);
  free(tr->at_home);
  free(tr->cpu_step);
  free(tr->x);
  tz_tier_free(&tr->io);
  tz_tier_destroy(tr->t_io);
  free(tr->trace_path);
  tz_config_free(&tr->cfg);
  free(tr);
}

/* ---- steps ---- */

static int adam_params(tz_trainer *tr, int64_t update, struct tz_adam_params *p) {
  const struct tz_config *c = &tr->cfg;
  memset(p, 0, sizeof *p);
  p->lr = (float)tz_lr_at(c, update, tr->total_steps);
  p->beta1 = (float)c->optimizer.betas[0];
  p->beta2 = (float)c->optimizer.betas[1];
  p->eps = (float)c->optimizer.eps;
  p->weight_decay = (float)c->optimizer.weight_decay;
  p->decoupled = c->optimizer.adam_w_mode;
  p->grad_scale = 1.0f;
  return tz_adam_params_for_step(p, update + 1);
}

/* DeepSpeed's DynamicLossScaler.update_scale (consecutive_hysteresis false): an overflow uses up
 * one unit of hysteresis, and the last one halves the scale (an overflow at the minimum scale is
 * an error, as there); `loss_scale_window` steps after the last overflow the scale doubles and the
 * hysteresis is restored. A fixed scale never changes. */
static int update_scale(tz_trainer *tr, int overflow) {
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

int tz_trainer_step(tz_trainer *tr, const int32_t *tokens, const int32_t *targets,
                    struct tz_step_result *res) {
  if (!tr->sched)
    return tz_err_set(TZ_EINVAL, "train: the trainer was made for its plan only");
  double t0 = now_s();
  struct tz_sched_stats st0;
  tz_sched_stats(tr->sched, &st0);
  int par = (int)(tr->step & 1);
  size_t n = (size_t)tr->G * (size_t)tr->N;
  int32_t *ht = tr->host_tokens[par];
  memcpy(ht, tokens, n * sizeof(int32_t));
  memcpy(ht + n, targets, n * sizeof(int32_t));
  /* Which update this step's opt phases apply: folded, the previous step's (if still pending);
   * otherwise this step's own. */
  int pending = tr->mode == TZ_OPT_FOLDED ? tr->pending : 1;
  struct tz_adam_params ap;
  memset(&ap, 0, sizeof ap);
  if (pending)
    TZ_CHECK(adam_params(tr, tr->updates, &ap));
  tz_fence *done = NULL;
  int rc = 0;
  for (int i = 0; i < tr->n_ph; i++) {
    struct job *j = &tr->jobs[(size_t)par * (size_t)tr->n_ph + (size_t)i];
    struct tz_view v;
    TZ_CHECK_GOTO(tz_sched_enter(tr->sched, i, &v), rc, out);
    memset(j, 0, sizeof *j);
    j->tr = tr;
    j->phase = i;
    for (int u = 0; u < v.n_blocks; u++) {
      const struct phase *ph = &tr->ph[i];
      if (ph->roles[u] == USE_NEXT)
        j->next_param = v.blocks[u].ptr;
      else if (ph->roles[u] == USE_PREV)
        j->prev_grad = v.blocks[u].ptr;
      else
        j->ptr[ph->kinds[u]] = v.blocks[u].ptr;
    }
    j->pending = pending;
    j->par = par;
    j->adam = ap;
    /* Folded, the previous step's factor (its loss phase has completed); overlapped, always 1
     * (neither clipping nor loss scaling). */
    j->home_scale = tr->mode == TZ_OPT_FOLDED ? tr->opt_scale : 1.0f;
    j->tokens_host = ht;
    j->targets_host = ht + n;
    j->loss_scale = tr->fp16 ? tr->scale : 1.0f;
    rc = tz_sched_submit(tr->sched, run_job, j);
    int rc2 = tz_sched_leave(tr->sched, i);
    if (rc < 0 || rc2 < 0) {
      rc = rc < 0 ? rc : rc2;
      goto out;
    }
    /* The step's results are ready when the lane has run its last backward phase. */
    if (i == tr->loss_phase)
      TZ_CHECK_GOTO(tz_lane_record(v.lane, &done), rc, out);
  }
  TZ_CHECK_GOTO(tz_sched_step_end(tr->sched), rc, out);
  TZ_CHECK_GOTO(tz_fence_wait(done, -1), rc, out);
  /* Folded, `pending` was the previous step's update, applied in this step's opt phases;
   * otherwise this step's own, which an overflow has dropped. */
  int overflow = tr->overflow, folded = tr->mode == TZ_OPT_FOLDED;
  int64_t before = tr->updates;
  if (folded ? pending : !overflow)
    tr->updates++;
  int64_t update = folded ? tr->updates : before; /* the index of this step's own update */
  tr->pending = tr->mode == TZ_OPT_FOLDED && !overflow;
  if (tr->fp16) {
    float used = tr->scale;
    TZ_CHECK_GOTO(update_scale(tr, overflow), rc, out);
    if (overflow) /* the client reports it (tz_step_result.skipped) */
      TZ_INFO("train: step %lld: fp16 overflow at loss scale %g, update skipped; the scale is now "
              "%g",
              (long long)tr->step, (double)used, (double)tr->scale);
  }
  if (res) {
    struct tz_sched_stats st1;
    tz_sched_stats(tr->sched, &st1);
    res->step = tr->step;
    res->loss = tr->loss;
    res->grad_norm = tr->norm;
    res->clip_scale = tr->clip_scale;
    res->lr = tz_lr_at(&tr->cfg, update, tr->total_steps);
    res->skipped = overflow;
    res->loss_scale = tr->fp16 ? tr->scale : 0;
    res->step_s = now_s() - t0;
    res->stall_s = st1.stall_s - st0.stall_s;
  }
  double coll = coll_take(tr, par);
  if (res)
    res->coll_s = coll;
  tr->step++;
out:
  tz_fence_release(done);
  return rc;
}

/* Block b's update where its state lives: on the GPU when every home of the block is in its
 * memory; else by the CPU, in place at the homes in host memory (the compute tier of the cpu
 * backend included) and through the buffers buf for the others (nvme, the GPU's), which are
 * loaded first and, but for the gradient, stored after. Called after tz_sched_sync, with the
 * compute lane idle; the scheduler is told what changed at the homes. */
static int apply_block(tz_trainer *tr, const struct tz_adam_params *ap, int b,
                       float *const buf[TZ_PLAN_KINDS]) {
  void *dev[TZ_PLAN_KINDS], *at[TZ_PLAN_KINDS];
  int on_gpu = tr->gpu, home[TZ_PLAN_KINDS] = {0}; /* 1: begun, written in place at its home */
  for (int k = 0; k < TZ_PLAN_KINDS; k++) {
    const tz_extent *e = &tr->home[b][k];
    dev[k] = tz_tier_device_ptr(e->tier, e->offset);
    at[k] = dev[k] ? NULL : tz_tier_host_ptr(e->tier, e->offset);
    on_gpu &= dev[k] != NULL;
  }
  if (on_gpu)
    memcpy(at, dev, sizeof at);
  int rc = 0;
  for (int k = 0; k < TZ_PLAN_KINDS && rc == 0; k++) {
    tz_extent h;
    if (at[k] && k != TZ_PLAN_GRAD) /* the gradient is only read */
      home[k] = (rc = tz_sched_home_begin(tr->sched, tr->bid[b][k], &h)) == 0;
    else if (!at[k])
      rc = tz_sched_block_load(tr->sched, tr->bid[b][k], at[k] = buf[k]);
  }
  if (rc == 0 && on_gpu) { /* the same bits as tz_adam_cpu (kernels/adam.h) */
    rc = tz_compute_adam(tr->cm, ap, at[TZ_PLAN_MASTER], at[TZ_PLAN_M], at[TZ_PLAN_V],
                         at[TZ_PLAN_GRAD], TZ_F32, at[TZ_PLAN_PARAM], tr->S, tr->shard[b]);
    if (rc == 0)
      rc = tz_compute_sync(tr->cm);
  } else if (rc == 0) {
    struct tz_adam_cpu_opts o = {.threads = home_threads(tr)};
    rc = tz_adam_cpu(ap, at[TZ_PLAN_MASTER], at[TZ_PLAN_M], at[TZ_PLAN_V], at[TZ_PLAN_GRAD],
                     TZ_F32, at[TZ_PLAN_PARAM], tr->S, tr->shard[b], &o);
  }
  int first = rc;
  for (int k = 0; k < TZ_PLAN_GRAD; k++) {
    int r = 0;
    if (home[k])
      r = tz_sched_home_end(tr->sched, tr->bid[b][k], first);
    else if (at[k] == buf[k] && first == 0)
      r = tz_sched_block_store(tr->sched, tr->bid[b][k], buf[k]);
    if (rc == 0)
      rc = r;
  }
  return rc;
}

/* Applies the pending folded update, block by block (apply_block), with the same Adam the opt
 * phases run. */
static int apply_pending(tz_trainer *tr) {
  struct tz_adam_params ap;
  TZ_CHECK(adam_params(tr, tr->updates, &ap));
  ap.grad_scale = tr->opt_scale;
  uint64_t most = 0;
  for (int b = 0; b < tr->nb; b++)
    if (tr->shard[b] > most)
      most = tr->shard[b];
  float *buf[TZ_PLAN_KINDS] = {0};
  int rc = 0;
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    if (!(buf[k] = malloc(most * sizeof(float)))) {
      rc = tz_err_set(TZ_ENOMEM, "train: no memory to apply the pending update");
      goto out;
    }
  for (int b = 0; b < tr->nb && rc == 0; b++)
    rc = apply_block(tr, &ap, b, buf);
  if (rc == 0) {
    tr->updates++;
    tr->pending = 0;
  }
out:
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    free(buf[k]);
  return rc;
}

int tz_trainer_sync(tz_trainer *tr) {
  if (!tr->sched)
    return tz_err_set(TZ_EINVAL, "train: the trainer was made for its plan only");
  TZ_CHECK(tz_sched_sync(tr->sched));
  if (tr->pending)
    TZ_CHECK(apply_pending(tr));
  return tz_sched_sync(tr->sched);
}

int tz_trainer_wait(tz_trainer *tr) {
  if (!tr->sched)
    return tz_err_set(TZ_EINVAL, "train: the trainer was made for its plan only");
  return tz_sched_sync(tr->sched);
}

int tz_trainer_param_load(tz_trainer *tr, int block, int kind, float *dst) {
  if (block < 0 || block >= tr->nb || kind < 0 || kind >= TZ_PLAN_KINDS)
    return tz_err_set(TZ_EINVAL, "train: no block %d of kind %d", block, kind);
  TZ_CHECK(tz_trainer_sync(tr));
  uint64_t n = tr->shard[block], es = kind == TZ_PLAN_PARAM ? tr->es : sizeof(float);
  void *shard = malloc(n * es), *full = malloc(tr->padded[block] * es);
  int rc = 0;
  if (!shard || !full) {
    rc = tz_err_set(TZ_ENOMEM, "train: no memory to load block %d", block);
    goto out;
  }
  TZ_CHECK_GOTO(tz_sched_block_load(tr->sched, tr->bid[block][kind], shard), rc, out);
  /* Gathered through the compute tier's gradient buffer: the lane is idle after the sync, and a
   * device comm needs device memory. */
  float *dev = block == 0 ? tr->fg_embed : tr->fg;
  char *mine = (char *)dev + (uint64_t)tr->rank * n * es;
  TZ_CHECK_GOTO(tz_compute_copy_in(tr->cm, mine, shard, n * es), rc, out);
  if (tr->world > 1) {
    tz_fence *f = NULL;
    TZ_CHECK_GOTO(coll_begin(tr), rc, out);
    TZ_CHECK_GOTO(tz_comm_all_gather(tr->comm, mine, dev, n * es, NULL, &f), rc, out);
    TZ_CHECK_GOTO(wait_release(f), rc, out);
  }
  TZ_CHECK_GOTO(tz_compute_copy_out(tr->cm, full, dev, tr->padded[block] * es), rc, out);
  if (kind == TZ_PLAN_PARAM && tr->S != TZ_F32) {
    for (uint64_t i = 0; i < tr->numel[block]; i++) {
      uint16_t h = ((const uint16_t *)full)[i];
      dst[i] = tr->S == TZ_BF16 ? tz_bf16_to_f32(h) : tz_f16_to_f32(h);
    }
  } else {
    memcpy(dst, full, tr->numel[block] * sizeof(float));
  }
out:
  free(shard);
  free(full);
  return rc;
}

uint64_t tz_trainer_shard_bytes(const tz_trainer *tr, int block, int kind) {
  if (block < 0 || block >= tr->nb || kind < 0 || kind >= TZ_PLAN_KINDS)
    return 0;
  return tr->bytes[block][kind];
}

static int check_shard(const tz_trainer *tr, int block, int kind) {
  if (!tr->sched)
    return tz_err_set(TZ_EINVAL, "train: the trainer was made for its plan only");
  if (block < 0 || block >= tr->nb || kind < 0 || kind >= TZ_PLAN_KINDS)
    return tz_err_set(TZ_EINVAL, "train: no block %d of kind %d", block, kind);
  return 0;
}

int tz_trainer_shard_load(tz_trainer *tr, int block, int kind, void *dst) {
  TZ_CHECK(check_shard(tr, block, kind));
  TZ_CHECK(tz_trainer_sync(tr));
  return tz_sched_block_load(tr->sched, tr->bid[block][kind], dst);
}

int tz_trainer_shard_store(tz_trainer *tr, int block, int kind, const void *src) {
  TZ_CHECK(check_shard(tr, block, kind));
  if (tr->pending)
    return tz_err_set(TZ_EINVAL, "train: storing %s %s while an update is pending (sync first)",
                      tr->names[block], tz_plan_kind_name(kind));
  return tz_sched_block_store(tr->sched, tr->bid[block][kind], src);
}

int64_t tz_trainer_steps_done(const tz_trainer *tr) { return tr->step; }

int tz_trainer_set_steps_done(tz_trainer *tr, int64_t steps) {
  if (steps < 0)
    return tz_err_set(TZ_EINVAL, "train: %lld steps done", (long long)steps);
  if (tr->pending)
    return tz_err_set(TZ_EINVAL, "train: setting the step while an update is pending (sync first)");
  if (steps < tr->skipped)
    return tz_err_set(TZ_EINVAL, "train: %lld steps done, fewer than the %lld skipped",
                      (long long)steps, (long long)tr->skipped);
  tr->step = steps;
  tr->updates = steps - tr->skipped; /* a skipped step's update was never applied */
  return 0;
}

const struct tz_plan *tz_trainer_plan(const tz_trainer *tr) { return &tr->plan; }
const char *const *tz_trainer_group_names(const tz_trainer *tr) {
  return (const char *const *)tr->names;
}
enum tz_opt_mode tz_trainer_opt_mode(const tz_trainer *tr) { return tr->mode; }

int tz_trainer_overlaps_collectives(const tz_trainer *tr) { return tr->overlap; }
const char *tz_trainer_device_name(const tz_trainer *tr) {
  return tr->gpu && tr->device_name[0] ? tr->device_name : NULL;
}

void tz_trainer_sched_stats(tz_trainer *tr, struct tz_sched_stats *out) {
  if (tr->sched)
    tz_sched_stats(tr->sched, out);
  else
    memset(out, 0, sizeof *out);
}

/* ---- evaluation, import, trace, loss scale ---- */

/* The full parameters of block b into the compute-tier buffer full (padded elements of S): the
 * rank's shard from the scheduler, all-gathered through the gradient buffer, as
 * tz_trainer_param_load does. The lane is idle (after a sync). */
static int gather_synced(tz_trainer *tr, int b, void *host_shard, void *full) {
  uint64_t bytes = tr->shard[b] * tr->es;
  TZ_CHECK(tz_sched_block_load(tr->sched, tr->bid[b][TZ_PLAN_PARAM], host_shard));
  if (tr->world == 1)
    return tz_compute_copy_in(tr->cm, full, host_shard, bytes);
  char *mine = (char *)(b == 0 ? tr->fg_embed : tr->fg) + (uint64_t)tr->rank * bytes;
  TZ_CHECK(tz_compute_copy_in(tr->cm, mine, host_shard, bytes));
  tz_fence *f = NULL;
  TZ_CHECK(coll_begin(tr));
  TZ_CHECK(tz_comm_all_gather(tr->comm, mine, full, bytes, NULL, &f));
  return wait_release(f);
}

int tz_trainer_eval(tz_trainer *tr, const int32_t *tokens, const int32_t *targets, float *loss) {
  if (!tr->sched)
    return tz_err_set(TZ_EINVAL, "train: the trainer was made for its plan only");
  TZ_CHECK(tz_trainer_sync(tr));
  size_t N = (size_t)tr->N, n = (size_t)tr->G * N;
  uint64_t most = 0;
  for (int b = 0; b < tr->nb; b++)
    if (tr->shard[b] > most)
      most = tr->shard[b];
  void *host = malloc(most * tr->es);
  if (!host)
    return tz_err_set(TZ_ENOMEM, "train: no memory for evaluation");
  int rc = 0, H = tr->nb - 1;
  float sum = 0;
  TZ_CHECK_GOTO(tz_compute_copy_in(tr->cm, tr->tokens, tokens, n * sizeof(int32_t)), rc, out);
  TZ_CHECK_GOTO(tz_compute_copy_in(tr->cm, tr->targets, targets, n * sizeof(int32_t)), rc, out);
  TZ_CHECK_GOTO(gather_synced(tr, 0, host, tr->gw_embed), rc, out);
  for (int k = 0; k < tr->G; k++) {
    TZ_CHECK_GOTO(tz_model_embed_fwd(tr->cm, &tr->mc, tr->gw_embed, tr->tokens + (size_t)k * N,
                                     tr->x[0], tr->B, tr->T),
                  rc, out);
    for (int b = 1; b <= tr->L; b++) {
      TZ_CHECK_GOTO(gather_synced(tr, b, host, tr->gw), rc, out);
      TZ_CHECK_GOTO(tz_model_layer_fwd(tr->cm, &tr->mc, tr->gw, tr->x[b - 1], tr->x[b], &tr->acts,
                                       tr->B, tr->T),
                    rc, out);
    }
    TZ_CHECK_GOTO(gather_synced(tr, H, host, tr->gw), rc, out);
    TZ_CHECK_GOTO(tz_model_head(tr->cm, &tr->mc, tr->gw, tr->gw_embed, NULL, NULL, tr->x[tr->L],
                                tr->targets + (size_t)k * N, 0.0f, NULL, &tr->hs, tr->B, tr->T),
                  rc, out);
    float part;
    TZ_CHECK_GOTO(tz_compute_copy_out(tr->cm, &part, tr->hs.loss, sizeof part), rc, out);
    sum = k == 0 ? part : sum + part; /* the order the step sums its micro-batches in */
  }
  if (tr->world > 1) {
    /* Through the compute tier (a device comm needs device memory); scal[2] is free between
     * steps. */
    TZ_CHECK_GOTO(tz_compute_copy_in(tr->cm, tr->scal + 2, &sum, sizeof sum), rc, out);
    tz_fence *f = NULL;
    TZ_CHECK_GOTO(coll_begin(tr), rc, out);
    TZ_CHECK_GOTO(tz_comm_all_reduce(tr->comm, tr->scal + 2, tr->scal + 2, 1, TZ_F32, NULL, &f), rc,
                  out);
    TZ_CHECK_GOTO(wait_release(f), rc, out);
    TZ_CHECK_GOTO(tz_compute_copy_out(tr->cm, &sum, tr->scal + 2, sizeof sum), rc, out);
  }
  TZ_CHECK_GOTO(tz_compute_sync(tr->cm), rc, out);
  *loss = sum / (float)((int64_t)tr->G * tr->world * tr->N);
out:
  free(host);
  return rc;
}

int tz_trainer_param_store(tz_trainer *tr, int block, const float *src) {
  TZ_CHECK(check_shard(tr, block, TZ_PLAN_MASTER));
  if (tr->pending)
    return tz_err_set(TZ_EINVAL, "train: storing %s while an update is pending (sync first)",
                      tr->names[block]);
  uint64_t n = tr->shard[block], begin = (uint64_t)tr->rank * n, numel = tr->numel[block];
  float *master = calloc(n, sizeof(float));
  void *param = malloc(n * tr->es);
  int rc = 0;
  if (!master || !param) {
    rc = tz_err_set(TZ_ENOMEM, "train: no memory to store %s", tr->names[block]);
    goto out;
  }
  /* The padding past numel stays zero, as at initialisation. */
  if (begin < numel)
    memcpy(master, src + begin, (numel - begin < n ? numel - begin : n) * sizeof(float));
  host_cast(param, tr->S, master, n);
  TZ_CHECK_GOTO(tz_sched_block_store(tr->sched, tr->bid[block][TZ_PLAN_MASTER], master), rc, out);
  TZ_CHECK_GOTO(tz_sched_block_store(tr->sched, tr->bid[block][TZ_PLAN_PARAM], param), rc, out);
out:
  free(master);
  free(param);
  return rc;
}

int tz_trainer_trace_write(tz_trainer *tr, const char *path) {
  TZ_CHECK(tz_trainer_wait(tr));
  return tz_sched_trace_write(tr->sched, path);
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
    if (s->scale != 0 || s->hysteresis_left || s->scale_iter || s->last_overflow_iter ||
        s->skipped)
      return tz_err_set(TZ_EINVAL, "train: a loss-scale state (scale %g, %lld skipped) for a "
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
                      s->scale, s->hysteresis_left,
                      (long long)s->scale_iter, (long long)s->last_overflow_iter,
                      (long long)s->skipped, (long long)tr->step);
  tr->scale = (float)s->scale;
  tr->hysteresis_left = s->hysteresis_left;
  tr->scale_iter = s->scale_iter;
  tr->last_overflow_iter = s->last_overflow_iter;
  tr->skipped = s->skipped;
  tr->updates = tr->step - tr->skipped;
  return 0;
}
