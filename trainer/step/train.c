/* A trainer's state in and out (parameters and shards, the step count) and what it reports. The
 * rest of the trainer: trainer/step/train_internal.h. */
#define _GNU_SOURCE
#include "trainer/step/train_internal.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

/* Stages at most one f32 block beside dst (tz_train_check_machine counts two): on one rank the
 * scheduler's staging of the shard, else the gathered block. */
int tz_trainer_param_load(tz_trainer *tr, int block, int kind, float *dst) {
  if (block < 0 || block >= tr->nb || kind < 0 || kind >= TZ_PLAN_STATE_KINDS)
    return tz_err_set(TZ_EINVAL, "train: no block %d of kind %d", block, kind);
  TZ_CHECK(tz_trainer_sync(tr));
  uint64_t n = tr->shard[block], es = kind == TZ_PLAN_PARAM ? tr->es : sizeof(float);
  /* One rank's f32 shard is the block: read straight into dst, the scheduler's staging beside */
  if (tr->world == 1 && es == sizeof(float))
    return tz_sched_block_load_bytes(tr->sched, tr->bid[block][kind], dst,
                                     tr->numel[block] * sizeof(float));
  void *shard = malloc(n * es), *full = NULL;
  int rc = 0;
  if (!shard) {
    rc = tz_err_set(TZ_ENOMEM, "train: no memory to load block %d", block);
    goto out;
  }
  TZ_CHECK_GOTO(tz_sched_block_load(tr->sched, tr->bid[block][kind], shard), rc, out);
  if (tr->world == 1) {
    full = shard; /* the whole block */
    shard = NULL;
  } else {
    /* Gathered through the compute tier's gradient buffer: the lane is idle after the sync, and
     * a device comm needs device memory. */
    float *dev = block == 0 ? tr->fg_embed : tr->fg;
    char *mine = (char *)dev + (uint64_t)tr->rank * n * es;
    TZ_CHECK_GOTO(tz_compute_copy_in(tr->cm, mine, shard, n * es), rc, out);
    free(shard);
    shard = NULL;
    tz_fence *f = NULL;
    TZ_CHECK_GOTO(tz_train_coll_begin(tr), rc, out);
    TZ_CHECK_GOTO(tz_comm_all_gather(tr->comm, mine, dev, n * es, NULL, &f), rc, out);
    TZ_CHECK_GOTO(tz_train_wait_release(f), rc, out);
    if (!(full = malloc(tr->padded[block] * es))) {
      rc = tz_err_set(TZ_ENOMEM, "train: no memory to load block %d", block);
      goto out;
    }
    TZ_CHECK_GOTO(tz_compute_copy_out(tr->cm, full, dev, tr->padded[block] * es), rc, out);
  }
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
  if (block < 0 || block >= tr->nb || kind < 0 || kind >= TZ_PLAN_STATE_KINDS)
    return 0;
  return tr->bytes[block][kind];
}

uint64_t tz_trainer_act_bytes(const tz_trainer *tr, int block) {
  return block >= 0 && block < tr->nb ? tr->bytes[block][TZ_PLAN_ACT] : 0;
}

static int check_shard(const tz_trainer *tr, int block, int kind) {
  if (!tr->sched)
    return tz_err_set(TZ_EINVAL, "train: the trainer was made for its plan only");
  if (block < 0 || block >= tr->nb || kind < 0 || kind >= TZ_PLAN_STATE_KINDS)
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

/* The home phases' work so far into *w; returns how many home phases ran. */
static int home_work(const tz_trainer *tr, struct tz_home_work *w) {
  memset(w, 0, sizeof *w);
  struct tz_sched_phase_stats *ps = tr->sched ? calloc((size_t)tr->n_ph, sizeof *ps) : NULL;
  int n = ps ? tz_sched_phase_stats(tr->sched, ps, tr->n_ph) : 0, phases = 0;
  for (int i = 0; i < n && i < tr->n_ph; i++)
    if (ps[i].at_home && ps[i].runs > 0) {
      phases++;
      w->seconds += ps[i].compute_s;
      w->elements += (double)ps[i].runs * (double)tr->shard[tr->ph[i].block];
      w->runs = ps[i].runs > w->runs ? ps[i].runs : w->runs;
    }
  free(ps);
  return phases;
}

void tz_trainer_home_work(const tz_trainer *tr, struct tz_home_work *out) { home_work(tr, out); }

int tz_trainer_home_times(const tz_trainer *tr, double *measured_s, double *planned_s) {
  *measured_s = *planned_s = 0;
  struct tz_home_work w;
  int phases = home_work(tr, &w);
  if (phases > 0) {
    *measured_s = w.seconds / (double)w.runs;
    *planned_s = tr->plan.lane_s[TZ_PLAN_TIERS];
  }
  return phases;
}

void tz_trainer_sched_stats(tz_trainer *tr, struct tz_sched_stats *out) {
  if (tr->sched)
    tz_sched_stats(tr->sched, out);
  else
    memset(out, 0, sizeof *out);
}

int tz_trainer_tiers(const tz_trainer *tr, tz_tier *out[3]) {
  out[0] = tr->t_compute;
  out[1] = tr->t_host;
  out[2] = tr->t_nvme;
  return 3;
}

/* ---- evaluation, import, trace, loss scale ---- */

/* A shard's elements from src (have of them; the padding past them zero, as at initialisation)
 * into the scheduler's staging as dtype S: f32 for the master, the parameters' for them. */
struct shard_src {
  const float *src;
  uint64_t have;
  enum tz_dtype S;
};

static void fill_shard(void *dst, uint64_t bytes, void *arg) {
  const struct shard_src *f = arg;
  const uint64_t used = f->have * tz_dtype_size(f->S);
  tz_train_host_cast(dst, f->S, f->src, f->have);
  memset((char *)dst + used, 0, bytes - used);
}

int tz_trainer_param_store(tz_trainer *tr, int block, const float *src) {
  TZ_CHECK(check_shard(tr, block, TZ_PLAN_MASTER));
  if (tr->pending)
    return tz_err_set(TZ_EINVAL, "train: storing %s while an update is pending (sync first)",
                      tr->names[block]);
  uint64_t n = tr->shard[block], begin = (uint64_t)tr->rank * n, numel = tr->numel[block];
  /* The rank's part of src, made in the scheduler's staging: no shard of its own, so that an
   * import stages one f32 shard beside src (tz_train_check_machine) */
  struct shard_src from = {.src = src + (begin < numel ? begin : numel),
                           .have = begin < numel ? (numel - begin < n ? numel - begin : n) : 0,
                           .S = TZ_F32};
  TZ_CHECK(tz_sched_block_fill(tr->sched, tr->bid[block][TZ_PLAN_MASTER], fill_shard, &from));
  from.S = tr->S;
  return tz_sched_block_fill(tr->sched, tr->bid[block][TZ_PLAN_PARAM], fill_shard, &from);
}

int tz_trainer_trace_write(tz_trainer *tr, const char *path) {
  TZ_CHECK(tz_trainer_wait(tr));
  return tz_sched_trace_write(tr->sched, path);
}
