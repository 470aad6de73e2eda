/* A training step, the folded update still pending after one, and evaluation. */
#define _GNU_SOURCE
#include "trainer/step/train_internal.h"
#include "core/error.h"
#include "core/log.h"
#include "trainer/step/lr.h"
#include "util/clock.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

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

/* Enters the step's phases in order and queues each one's job on its lane (the job slots of
 * parity par); *done (the caller's) is the fence of the loss phase, after which the step's
 * results are ready. */
static int queue_phases(tz_trainer *tr, int par, int pending, const struct tz_adam_params *ap,
                        const int32_t *ht, size_t n, int has_pos, float targets, tz_fence **done) {
  for (int i = 0; i < tr->n_ph; i++) {
    struct job *j = &tr->jobs[(size_t)par * (size_t)tr->n_ph + (size_t)i];
    struct tz_view v;
    TZ_CHECK(tz_sched_enter(tr->sched, i, &v));
    memset(j, 0, sizeof *j);
    j->tr = tr;
    j->phase = i;
    for (int u = 0; u < v.n_blocks; u++) {
      const struct phase *ph = &tr->ph[i];
      if (ph->roles[u] == USE_OUT)
        j->out = v.blocks[u].ptr;
      else if (ph->roles[u] == USE_NEXT)
        j->next_param = v.blocks[u].ptr;
      else if (ph->roles[u] == USE_PREV)
        j->prev_grad = v.blocks[u].ptr;
      else
        j->ptr[ph->kinds[u]] = v.blocks[u].ptr;
    }
    j->pending = pending;
    j->par = par;
    j->adam = *ap;
    /* Folded, the previous step's factor (its loss phase has completed); overlapped, always 1
     * (neither clipping nor loss scaling). */
    j->home_scale = tr->mode == TZ_OPT_FOLDED ? tr->opt_scale : 1.0f;
    j->tokens_host = ht;
    j->targets_host = ht + n;
    j->pos_host = has_pos ? ht + 2 * n : NULL;
    j->targets = targets;
    j->loss_scale = tr->fp16 ? tr->scale : 1.0f;
    int rc = tz_sched_submit(tr->sched, tz_train_run_job, j);
    int rc2 = tz_sched_leave(tr->sched, i);
    if (rc < 0 || rc2 < 0)
      return rc < 0 ? rc : rc2;
    /* The step's results are ready when the lane has run its last backward phase. */
    if (i == tr->loss_phase)
      TZ_CHECK(tz_lane_record(v.lane, done));
  }
  return 0;
}

/* Once the step's results are ready: the updates counted, the one left pending, the loss scale.
 * *update: the index of this step's own update. */
static int count_update(tz_trainer *tr, int pending, int64_t *update) {
  /* Folded, `pending` was the previous step's update, applied in this step's opt phases;
   * otherwise this step's own, which an overflow has dropped. */
  int overflow = tr->overflow, folded = tr->mode == TZ_OPT_FOLDED;
  int64_t before = tr->updates;
  if (folded ? pending : !overflow)
    tr->updates++;
  *update = folded ? tr->updates : before;
  tr->pending = tr->mode == TZ_OPT_FOLDED && !overflow;
  if (tr->fp16) {
    float used = tr->scale;
    TZ_CHECK(tz_train_update_scale(tr, overflow));
    if (overflow) /* the client reports it (tz_step_result.skipped) */
      TZ_INFO("train: step %lld: fp16 overflow at loss scale %g, update skipped; the scale is now "
              "%g",
              (long long)tr->step, (double)used, (double)tr->scale);
  }
  return 0;
}

/* What the client is told of the step (tz_step_result), but its collective time. */
static void fill_result(tz_trainer *tr, struct tz_step_result *res, double t0,
                        const struct tz_sched_stats *st0, int64_t update) {
  struct tz_sched_stats st1;
  tz_sched_stats(tr->sched, &st1);
  res->step = tr->step;
  res->loss = tr->loss;
  res->grad_norm = tr->norm;
  res->clip_scale = tr->clip_scale;
  res->lr = tz_lr_at(&tr->cfg, update, tr->total_steps);
  res->skipped = tr->overflow;
  res->loss_scale = tr->fp16 ? tr->scale : 0;
  res->step_s = tz_now_s() - t0;
  res->stall_s = st1.stall_s - st0->stall_s;
}

/* The loss's divisor: docs' count of targets, else every token of the step. */
static int step_targets(const tz_trainer *tr, const struct tz_step_docs *docs, float *out) {
  int64_t all = (int64_t)tr->G * tr->world * tr->N;
  if (docs && docs->targets < 0)
    return tz_err_set(TZ_EINVAL, "train: %" PRId64 " targets in a step", docs->targets);
  if (docs && docs->targets > all)
    return tz_err_set(TZ_EINVAL, "train: %" PRId64 " targets in a step of %" PRId64 " tokens",
                      docs->targets, all);
  *out = (float)(docs && docs->targets ? docs->targets : all);
  return 0;
}

int tz_trainer_step(tz_trainer *tr, const int32_t *tokens, const int32_t *targets,
                    const struct tz_step_docs *docs, struct tz_step_result *res) {
  if (!tr->sched)
    return tz_err_set(TZ_EINVAL, "train: the trainer was made for its plan only");
  float n_targets = 0;
  TZ_CHECK(step_targets(tr, docs, &n_targets));
  double t0 = tz_now_s();
  struct tz_sched_stats st0;
  tz_sched_stats(tr->sched, &st0);
  int par = (int)(tr->step & 1);
  size_t n = (size_t)tr->G * (size_t)tr->N;
  int32_t *ht = tr->host_tokens[par];
  memcpy(ht, tokens, n * sizeof(int32_t));
  memcpy(ht + n, targets, n * sizeof(int32_t));
  int has_pos = docs && docs->pos;
  if (has_pos)
    memcpy(ht + 2 * n, docs->pos, n * sizeof(int32_t));
  /* Which update this step's opt phases apply: folded, the previous step's (if still pending);
   * otherwise this step's own. */
  int pending = tr->mode == TZ_OPT_FOLDED ? tr->pending : 1;
  struct tz_adam_params ap;
  memset(&ap, 0, sizeof ap);
  if (pending)
    TZ_CHECK(adam_params(tr, tr->updates, &ap));
  tz_fence *done = NULL;
  int64_t update = 0;
  int rc = queue_phases(tr, par, pending, &ap, ht, n, has_pos, n_targets, &done);
  if (rc < 0)
    goto out;
  TZ_CHECK_GOTO(tz_sched_step_end(tr->sched), rc, out);
  TZ_CHECK_GOTO(tz_fence_wait(done, -1), rc, out);
  TZ_CHECK_GOTO(count_update(tr, pending, &update), rc, out);
  if (res)
    fill_result(tr, res, t0, &st0, update);
  double coll = tz_train_coll_take(tr, par);
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
                       float *const buf[TZ_PLAN_STATE_KINDS]) {
  void *dev[TZ_PLAN_STATE_KINDS], *at[TZ_PLAN_STATE_KINDS];
  int on_gpu = tr->gpu, home[TZ_PLAN_STATE_KINDS] = {0}; /* 1: begun, written in place at home */
  for (int k = 0; k < TZ_PLAN_STATE_KINDS; k++) {
    const tz_extent *e = &tr->home[b][k];
    dev[k] = tz_tier_device_ptr(e->tier, e->offset);
    at[k] = dev[k] ? NULL : tz_tier_host_ptr(e->tier, e->offset);
    on_gpu &= dev[k] != NULL;
  }
  if (on_gpu)
    memcpy(at, dev, sizeof at);
  int rc = 0;
  for (int k = 0; k < TZ_PLAN_STATE_KINDS && rc == 0; k++) {
    tz_extent h;
    if (at[k] && k != TZ_PLAN_GRAD) /* the gradient is only read */
      home[k] = (rc = tz_sched_home_begin(tr->sched, tr->bid[b][k], &h)) == 0;
    else if (!at[k])
      rc = tz_sched_block_load(tr->sched, tr->bid[b][k], at[k] = buf[k]);
  }
  if (rc == 0) { /* on the GPU, the same bits as tz_adam_cpu (kernels/adam.h) */
    rc = tz_train_adam(tr, b, !on_gpu, ap, at[TZ_PLAN_MASTER], at[TZ_PLAN_M], at[TZ_PLAN_V],
                       at[TZ_PLAN_GRAD], at[TZ_PLAN_PARAM]);
    if (rc == 0 && on_gpu)
      rc = tz_compute_sync(tr->cm);
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
  float *buf[TZ_PLAN_STATE_KINDS] = {0};
  int rc = 0;
  for (int k = 0; k < TZ_PLAN_STATE_KINDS; k++)
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
  for (int k = 0; k < TZ_PLAN_STATE_KINDS; k++)
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
  TZ_CHECK(tz_train_coll_begin(tr));
  TZ_CHECK(tz_comm_all_gather(tr->comm, mine, full, bytes, NULL, &f));
  return tz_train_wait_release(f);
}

int tz_trainer_eval(tz_trainer *tr, const int32_t *tokens, const int32_t *targets,
                    const struct tz_step_docs *docs, float *loss) {
  if (!tr->sched)
    return tz_err_set(TZ_EINVAL, "train: the trainer was made for its plan only");
  float n_targets = 0;
  TZ_CHECK(step_targets(tr, docs, &n_targets));
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
  const int32_t *pos = docs && docs->pos ? tr->pos : NULL;
  if (pos)
    TZ_CHECK_GOTO(tz_compute_copy_in(tr->cm, tr->pos, docs->pos, n * sizeof(int32_t)), rc, out);
  TZ_CHECK_GOTO(gather_synced(tr, 0, host, tr->gw_embed), rc, out);
  /* The residual stream between layers in two (N, C) buffers of the backward's, free between
   * steps: the step's own layer inputs are blocks of the tiers (TZ_PLAN_ACT). */
  void *x[2] = {tr->dx, tr->ls.dh};
  for (int k = 0; k < tr->G; k++) {
    TZ_CHECK_GOTO(tz_model_embed_fwd(tr->cm, &tr->mc, tr->gw_embed, tr->tokens + (size_t)k * N,
                                     x[0], tr->B, tr->T),
                  rc, out);
    for (int b = 1; b < H; b++) { /* a layer's blocks one after the other: tr->acts holds x2 */
      int l = tz_model_block_layer(&tr->mc, b);
      void *w[2] = {tr->gw, tr->gw};
      TZ_CHECK_GOTO(gather_synced(tr, b, host, tr->gw), rc, out);
      TZ_CHECK_GOTO(tz_model_layer_part_fwd(tr->cm, &tr->mc, l, w, x[l % 2], x[(l + 1) % 2],
                                            &tr->acts, (unsigned)tz_model_block_parts(&tr->mc, b),
                                            tr->B, tr->T, pos ? pos + (size_t)k * N : NULL),
                    rc, out);
    }
    TZ_CHECK_GOTO(gather_synced(tr, H, host, tr->gw), rc, out);
    TZ_CHECK_GOTO(tz_model_head(tr->cm, &tr->mc, tr->gw, tr->gw_embed, NULL, NULL, x[tr->L % 2],
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
    TZ_CHECK_GOTO(tz_train_coll_begin(tr), rc, out);
    TZ_CHECK_GOTO(tz_comm_all_reduce(tr->comm, tr->scal + 2, tr->scal + 2, 1, TZ_F32, NULL, &f), rc,
                  out);
    TZ_CHECK_GOTO(tz_train_wait_release(f), rc, out);
    TZ_CHECK_GOTO(tz_compute_copy_out(tr->cm, &sum, tr->scal + 2, sizeof sum), rc, out);
  }
  TZ_CHECK_GOTO(tz_compute_sync(tr->cm), rc, out);
  *loss = sum / n_targets;
out:
  free(host);
  return rc;
}

const struct tz_model_config *tz_trainer_model(const tz_trainer *tr) { return &tr->mc; }
const struct tz_config *tz_trainer_config(const tz_trainer *tr) { return &tr->cfg; }
