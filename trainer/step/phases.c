/* The order of a step and the jobs that run its phases on the compute lane, with the collectives
 * they issue (trainer/step/train_internal.h says who touches what). */
#define _GNU_SOURCE
#include "trainer/step/train_internal.h"
#include "core/error.h"
#include "trainer/step/decay.h"
#include "trainer/step/rates.h"
#include "util/clock.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- collectives inside jobs: issued and waited for on the compute lane ---- */

int tz_train_wait_release(tz_fence *f) {
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
double tz_train_coll_take(tz_trainer *tr, int p) {
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
int tz_train_coll_begin(tz_trainer *tr) {
  if (tr->split)
    return stream_order(tr, 1);
  return coll_event(tr, 0);
}

/* A collective issued inside a job has completed in order when the next op runs: on a CPU lane
 * the job waits for it; on a GPU the comm enqueues it on its stream, which is the lane's (stream
 * order is the wait) or, split, one the lane's stream is made to wait for. */
static int coll_done(tz_trainer *tr, tz_fence *f) {
  if (!tr->gpu) {
    double t0 = tz_now_s();
    int rc = tz_train_wait_release(f);
    if (job_par >= 0)
      tr->coll_host[job_par] += tz_now_s() - t0;
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
  TZ_CHECK(tz_train_coll_begin(tr));
  TZ_CHECK(tz_comm_all_gather(tr->comm, shard, buf, tr->shard[b] * tr->es, NULL, &f));
  *out = buf;
  return coll_done(tr, f);
}

/* Adds the rank's reduced part of block b's gradient (n floats) into its gradient shard;
 * micro-batch 0 copies it: the sum then starts from the first term, as the reduction's does, so
 * accumulation and a larger world give the same bits. A block with a sum of its own in the
 * compute tier (tr->acc_off, a shard forced out of it) adds micro-batches 0..G-2 there and the
 * last one writes the shard, acc + mine: the same additions in the same order, and the shard
 * crosses the host link once a step instead of in and out for every micro-batch. */
static int accumulate(tz_trainer *tr, int b, float *grad, const float *mine, uint64_t n,
                      int micro) {
  float *acc = tr->acc_off[b] == UINT64_MAX ? NULL : tr->acc + tr->acc_off[b];
  if (acc && micro == tr->G - 1)
    return tz_compute_add(tr->cm, TZ_F32, grad, acc, mine, n);
  float *sum = acc ? acc : grad;
  if (micro == 0)
    return tz_compute_copy(tr->cm, sum, mine, n * sizeof(float));
  return tz_compute_add(tr->cm, TZ_F32, sum, sum, mine, n);
}

/* Reduce-scatters the full gradient fg of block b and accumulates the rank's part. */
static int reduce_into(tz_trainer *tr, int b, float *fg, float *grad, int micro) {
  uint64_t n = tr->shard[b];
  float *mine = fg + (uint64_t)tr->rank * n;
  if (tr->world > 1) {
    tz_fence *f = NULL;
    TZ_CHECK(tz_train_coll_begin(tr));
    TZ_CHECK(tz_comm_reduce_scatter(tr->comm, fg, mine, n, TZ_F32, NULL, &f));
    TZ_CHECK(coll_done(tr, f));
  }
  return accumulate(tr, b, grad, mine, n, micro);
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
  TZ_CHECK(tz_train_coll_begin(tr));
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
  TZ_CHECK(
      accumulate(tr, ph->prev, grad, tr->fg2[ph->prev % 2] + (uint64_t)tr->rank * n, n, ph->micro));
  return ph->micro == tr->G - 1 ? norm_partials(tr, ph->prev, grad) : 0;
}

/* The step's totals, once its last backward is done: loss, gradient norm, clip factor, and with
 * fp16 whether the scaled gradient overflowed. The gradient holds loss_scale times the true one;
 * the norm reported and clipped on is the true one. */
static int finish_step(tz_trainer *tr, float loss_scale, float targets) {
  tz_fence *f = NULL;
  if (tr->world > 1) {
    TZ_CHECK(tz_train_coll_begin(tr));
    TZ_CHECK(tz_comm_all_reduce(tr->comm, tr->scal, tr->scal, 1, TZ_F32, NULL, &f));
    TZ_CHECK(coll_done(tr, f));
    TZ_CHECK(tz_train_coll_begin(tr));
    TZ_CHECK(tz_comm_all_reduce(tr->comm, tr->partials, tr->partials, tr->n_seg, TZ_F32, NULL, &f));
    TZ_CHECK(coll_done(tr, f));
  }
  TZ_CHECK(tz_compute_sum(tr->cm, tr->scal + 1, TZ_F32, tr->partials, tr->n_seg, 0));
  float *host = tr->host_scal;
  TZ_CHECK(tz_compute_copy_out(tr->cm, host, tr->scal, 2 * sizeof(float)));
  TZ_CHECK(tz_compute_zero(tr->cm, tr->partials, tr->n_seg * sizeof(float)));
  TZ_CHECK(tz_compute_sync(tr->cm));
  tr->loss = host[0] / targets;
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
void tz_train_host_cast(void *dst, enum tz_dtype S, const float *src, uint64_t n) {
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
int tz_train_home_threads(const tz_trainer *tr) {
  if (!tr->gpu && tr->cfg.tierzero.threads <= 0)
    return tz_compute_threads(tr->cm);
  return tz_rates_home_threads(&tr->cfg); /* tierzero.threads when set */
}

struct adam_run {
  tz_trainer *tr;
  int cpu;
  float *master, *m, *v;
  const float *grad;
  char *param; /* elements of tr->S */
};

static int adam_run(void *ctx, const struct tz_adam_params *p, uint64_t off, uint64_t n) {
  const struct adam_run *a = ctx;
  tz_trainer *tr = a->tr;
  void *param = a->param ? a->param + off * tr->es : NULL;
  if (a->cpu) {
    struct tz_adam_cpu_opts o = {.threads = tz_train_home_threads(tr)};
    return tz_adam_cpu(p, a->master + off, a->m + off, a->v + off, a->grad + off, TZ_F32, param,
                       tr->S, n, &o);
  }
  return tz_compute_adam(tr->cm, p, a->master + off, a->m + off, a->v + off, a->grad + off, TZ_F32,
                         param, tr->S, n);
}

int tz_train_adam(tz_trainer *tr, int b, int cpu, const struct tz_adam_params *p, float *master,
                  float *m, float *v, const float *grad, void *param) {
  struct adam_run a = {tr, cpu, master, m, v, grad, param};
  uint64_t n = tr->shard[b];
  return tz_decay_adam(&tr->mc, b, tr->decay_exclude, (uint64_t)tr->rank * n, n, p, adam_run, &a);
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
      tz_train_host_cast(param, tr->S, master, n);
      return 0;
    }
    struct tz_adam_params p = j->adam;
    p.grad_scale = j->home_scale;
    return tz_train_adam(tr, b, 1, &p, master, m, v, grad, param);
  }
  /* Unfolded, the opt phases run after the step's finish_step on this lane, and an overflow
   * drops the update here; folded, the client has already dropped it (j->pending 0). */
  if (!j->pending || tr->overflow)
    return tz_compute_cast(tr->cm, param, tr->S, master, TZ_F32, n);
  struct tz_adam_params p = j->adam;
  p.grad_scale = tr->opt_scale;
  /* The same bits on every backend (kernels/adam.h); the cpu one runs on the instance's threads. */
  return tz_train_adam(tr, b, 0, &p, master, m, v, grad, param);
}

/* A micro-batch's load-balancing loss, once its forward has routed every layer
 * (tz_model_moe_aux): its gradient for the layers' backward, and scal[2] = the micro-batch's loss
 * sum plus the router coefficient times its share of the step's mean over micro-batches and
 * ranks, in targets' worth (finish_step divides by the step's targets). As transformers adds it to
 * each forward's loss, the gradient mean over micro-batches and ranks (DeepSpeed's) of coef x aux.
 */
static int moe_aux(tz_trainer *tr, const struct job *j) {
  const struct tz_model_config *mc = &tr->mc;
  int E = mc->n_expert;
  float stats[2 * TZ_MOE_MAX_EXPERTS], daux[TZ_MOE_MAX_EXPERTS];
  TZ_CHECK(tz_compute_copy_out(tr->cm, stats, tr->moe_stats, 2 * (size_t)E * sizeof(float)));
  double share = tz_model_aux_coef(mc) / ((double)tr->G * (double)tr->world);
  double aux = tz_model_moe_aux(mc, stats, tr->N, share * j->loss_scale, daux);
  TZ_CHECK(tz_compute_copy_in(tr->cm, tr->moe_daux, daux, (size_t)E * sizeof(float)));
  float add = (float)(share * aux * j->targets);
  TZ_CHECK(tz_compute_copy_in(tr->cm, tr->scal + 2, &add, sizeof add));
  return tz_compute_add(tr->cm, TZ_F32, tr->scal + 2, tr->hs.loss, tr->scal + 2, 1);
}

/* The phase's compute (and without overlapped collectives its own gathers and reductions), on
 * the lane: w is the phase's full weights, gathered here or, overlapped, by the phase before. */
static int run_compute(tz_trainer *tr, const struct job *j, const struct phase *ph) {
  const struct tz_model_config *mc = &tr->mc;
  int b = ph->block, k = ph->micro, B = tr->B, T = tr->T;
  size_t N = (size_t)tr->N;
  float dscale = 1.0f / j->targets * j->loss_scale;
  const int32_t *pos = j->pos_host ? tr->pos + (size_t)k * N : NULL;
  int ov = tr->overlap;
  void *w = ov ? tr->gw2[b % 2] : NULL;
  float *fg = tr->fg2[b % 2];
  switch (ph->kind) {
  case PH_EMBED:
    if (tr->moe_stats) /* the micro-batch's routing statistics start from 0 */
      TZ_CHECK(tz_compute_zero(tr->cm, tr->moe_stats, 2 * (size_t)mc->n_expert * sizeof(float)));
    return tz_model_embed_fwd(tr->cm, mc, tr->gw_embed, tr->tokens + (size_t)k * N, j->out, B, T);
  case PH_FWD: {
    if (!ov)
      TZ_CHECK(gather(tr, b, j->ptr[TZ_PLAN_PARAM], tr->gw, &w));
    int l = tz_model_block_layer(mc, b);
    unsigned parts = (unsigned)tz_model_block_parts(mc, b);
    struct tz_layer_acts a = tr->lacts[l];
    /* A layer whose parts are blocks (experts): x2 is the MLP block's input, a block of the
     * tiers the attention's phase writes (j->out) and the MLP's reads. */
    if (parts == TZ_PART_ATTN)
      a.x2 = j->out;
    else if (parts == TZ_PART_MLP)
      a.x2 = j->ptr[TZ_PLAN_ACT];
    /* the phase's one block in both of a layer's slots: each part reads only its own */
    void *wl[2] = {w, w};
    return tz_model_layer_part_fwd(tr->cm, mc, l, wl, j->ptr[TZ_PLAN_ACT], j->out, &a, parts, B, T,
                                   pos);
  }
  case PH_HEAD: {
    if (!ov)
      TZ_CHECK(gather(tr, b, j->ptr[TZ_PLAN_PARAM], tr->gw, &w));
    TZ_CHECK(tz_compute_zero(tr->cm, fg, tr->padded[b] * sizeof(float)));
    if (tr->tied)
      TZ_CHECK(tz_compute_zero(tr->cm, tr->fg_embed, tr->padded[0] * sizeof(float)));
    TZ_CHECK(tz_model_head(tr->cm, mc, w, tr->gw_embed, fg, tr->tied ? tr->fg_embed : NULL,
                           j->ptr[TZ_PLAN_ACT], tr->targets + (size_t)k * N, dscale, tr->dx,
                           &tr->hs, B, T));
    /* the micro-batch's loss (with the load-balancing loss's share, moe_aux) formed first, then
     * added to the step's: the order of the sums across ranks' micro-batches */
    const float *mb_loss = tr->hs.loss;
    if (tr->moe_stats) {
      TZ_CHECK(moe_aux(tr, j));
      mb_loss = tr->scal + 2;
    }
    if (k == 0)
      TZ_CHECK(tz_compute_copy(tr->cm, tr->scal, mb_loss, sizeof(float)));
    else
      TZ_CHECK(tz_compute_add(tr->cm, TZ_F32, tr->scal, tr->scal, mb_loss, 1));
    if (ov) /* reduce-scattered by the next phase */
      return 0;
    TZ_CHECK(reduce_into(tr, b, fg, j->ptr[TZ_PLAN_GRAD], k));
    return k == tr->G - 1 ? norm_partials(tr, b, j->ptr[TZ_PLAN_GRAD]) : 0;
  }
  case PH_BWD: {
    if (!ov)
      TZ_CHECK(gather(tr, b, j->ptr[TZ_PLAN_PARAM], tr->gw, &w));
    TZ_CHECK(tz_compute_zero(tr->cm, fg, tr->padded[b] * sizeof(float)));
    int l = tz_model_block_layer(mc, b);
    unsigned parts = (unsigned)tz_model_block_parts(mc, b);
    struct tz_layer_acts a = tr->lacts[l];
    if (parts == TZ_PART_MLP) /* its input, x2 (PH_FWD) */
      a.x2 = j->ptr[TZ_PLAN_ACT];
    void *wl[2] = {w, w}, *gl[2] = {fg, fg};
    TZ_CHECK(tz_model_layer_part_bwd(tr->cm, mc, l, wl, gl, j->ptr[TZ_PLAN_ACT], &a, parts,
                                     tz_model_parts_recomputed(tr->recompute[l], parts), tr->dx,
                                     tr->dx, &tr->ls, B, T, pos));
    if (ov)
      return 0;
    TZ_CHECK(reduce_into(tr, b, fg, j->ptr[TZ_PLAN_GRAD], k));
    return k == tr->G - 1 ? norm_partials(tr, b, j->ptr[TZ_PLAN_GRAD]) : 0;
  }
  case PH_EMBED_BWD:
    if (!tr->tied)
      TZ_CHECK(tz_compute_zero(tr->cm, tr->fg_embed, tr->padded[0] * sizeof(float)));
    return tz_model_embed_bwd(tr->cm, mc, tr->fg_embed, tr->tokens + (size_t)k * N,
                              j->tokens_host + (size_t)k * N, tr->dx, B, T);
  case PH_OPT: break;
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
      if (j->pos_host)
        TZ_CHECK(tz_compute_copy_in(tr->cm, tr->pos, j->pos_host,
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
  return finish_step(tr, j->loss_scale, j->targets);
}

int tz_train_run_job(void *arg) {
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

/* The input of the block after the phase's (its TZ_PLAN_ACT), written by the phase. */
static void use_out(struct phase *p, tz_trainer *tr) {
  use_of(p, tr, p->block + 1, TZ_PLAN_ACT, TZ_ACCESS_WRITE, USE_OUT);
}

/* How micro-batch `micro` uses block b's gradient shard (accumulate): written by micro-batch 0,
 * read and written by the later ones; with a sum of its own in the compute tier, untouched before
 * the last micro-batch, which writes it. 0: not used. */
static int grad_access(const tz_trainer *tr, int b, int micro) {
  if (tr->acc_off[b] != UINT64_MAX)
    return micro == tr->G - 1 ? TZ_ACCESS_WRITE : 0;
  return micro == 0 ? TZ_ACCESS_WRITE : TZ_ACCESS_READWRITE;
}

/* A layer phase's name: fwd3.0 for layer 3's, micro-batch 0; with experts fwd3.0 and fwd3-moe.0
 * for its two blocks. */
static void phase_name(struct phase *p, const tz_trainer *tr, const char *what, int block,
                       int micro) {
  int moe = tz_model_block_parts(&tr->mc, block) == TZ_PART_MLP;
  snprintf(p->name, sizeof p->name, "%s%d%s.%d", what, tz_model_block_layer(&tr->mc, block),
           moe ? "-moe" : "", micro);
}

static int add_phase(tz_trainer *tr, int *n, enum phase_kind kind, int block, int micro) {
  struct phase *p = &tr->ph[(*n)++];
  memset(p, 0, sizeof *p);
  p->kind = kind;
  p->block = block;
  p->micro = micro;
  p->next = p->prev = -1;
  int gacc = grad_access(tr, block, micro);
  /* Overlapped collectives (tr->overlap): a layer's or the head's weights are gathered during
   * the phase before the one that computes with them, and its gradient is reduce-scattered
   * during the phase after: those phases use the shards, the computing one neither. The
   * embedding keeps gathering and reducing its own (the first and last phases of a pass). */
  int ov = tr->overlap, H = tr->nb - 1, M = H - 1; /* M: the layers' blocks, 1 .. M */
  switch (kind) {
  case PH_EMBED:
    snprintf(p->name, sizeof p->name, "embed.%d", micro);
    use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_READ);
    use_out(p, tr);
    p->next = ov ? 1 : -1;
    break;
  case PH_FWD:
    phase_name(p, tr, "fwd", block, micro);
    if (!ov)
      use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_READ);
    use(p, tr, TZ_PLAN_ACT, TZ_ACCESS_READ);
    use_out(p, tr);
    p->next = ov ? block + 1 : -1;
    break;
  case PH_HEAD:
    snprintf(p->name, sizeof p->name, "head.%d", micro);
    use(p, tr, TZ_PLAN_ACT, TZ_ACCESS_READ);
    if (!ov) {
      use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_READ);
      if (gacc)
        use(p, tr, TZ_PLAN_GRAD, gacc);
    }
    p->next = ov ? M : -1;
    break;
  case PH_BWD:
    phase_name(p, tr, "bwd", block, micro);
    use(p, tr, TZ_PLAN_ACT, TZ_ACCESS_READ);
    if (!ov) {
      use(p, tr, TZ_PLAN_PARAM, TZ_ACCESS_READ);
      if (gacc)
        use(p, tr, TZ_PLAN_GRAD, gacc);
    }
    p->next = ov && block > 1 ? block - 1 : -1;
    p->prev = ov ? block + 1 : -1;
    break;
  case PH_EMBED_BWD:
    snprintf(p->name, sizeof p->name, "embed-bwd.%d", micro);
    if (gacc)
      use(p, tr, TZ_PLAN_GRAD, gacc);
    p->prev = ov ? (M > 0 ? 1 : H) : -1;
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
  if (p->prev >= 0 && grad_access(tr, p->prev, micro))
    use_of(p, tr, p->prev, TZ_PLAN_GRAD, grad_access(tr, p->prev, micro), USE_PREV);
  return *n - 1;
}

/* Builds the step's phases in order (DESIGN.md "A training step"). */
int tz_train_build_phases(tz_trainer *tr) {
  /* the layers' blocks 1 .. M (a layer's one, or with experts its two), the head's H */
  int G = tr->G, H = tr->nb - 1, M = H - 1;
  TZ_CHECK(tz_decay_exclude_parse(&tr->cfg, &tr->decay_exclude));
  tr->n_ph = G * (2 * M + 3) + tr->nb;
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
    for (int i = 0; i < M; i++) {
      if (folded && first && (ov ? i + 2 <= H : 1))
        add_phase(tr, &n, PH_OPT, ov ? i + 2 : 1 + i, 0);
      add_phase(tr, &n, PH_FWD, 1 + i, k);
    }
    if (folded && first && !ov)
      add_phase(tr, &n, PH_OPT, H, 0);
    add_phase(tr, &n, PH_HEAD, H, k);
    if (overlapped && last && !ov)
      add_phase(tr, &n, PH_OPT, H, 0);
    for (int i = M - 1; i >= 0; i--) {
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
