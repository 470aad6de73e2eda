/* Creating and destroying a trainer: options, the compute backend, the tiers, the GPU's lanes,
 * the homes' initial shards and the scheduler. */
#define _GNU_SOURCE
#include "trainer/step/train_internal.h"
#include "trainer/step/machine.h"
#include "core/error.h"
#include "core/log.h"
#include "trainer/step/rates.h"
#include "trainer/step/rates_cache.h"
#include "util/clock.h"
#include "util/size.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *tz_opt_mode_name(enum tz_opt_mode m) {
  switch (m) {
  case TZ_OPT_AUTO: return "auto";
  case TZ_OPT_FOLDED: return "folded";
  case TZ_OPT_OVERLAPPED: return "overlapped";
  case TZ_OPT_UNFOLDED: return "unfolded";
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

static void *tier_ptr(tz_tier *t, uint64_t off) {
  void *p = tz_tier_device_ptr(t, off);
  return p ? p : tz_tier_host_ptr(t, off);
}

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
  return tz_train_loss_scale_init(tr, p);
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
    if (!tz_compute_backend_built("cuda"))
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
    TZ_CHECK(
        tz_compute_device_info("cuda", p->device >= 0 ? p->device : tr->cfg.tierzero.device, &d));
    tr->device = d.index;
    snprintf(tr->device_name, sizeof tr->device_name, "%s", d.name);
  } else {
    return tz_err_set(TZ_ENOENT, "train: no compute backend '%s' (cpu or cuda)", backend);
  }
  tr->es = tz_dtype_size(tr->S);
  /* every backend's settings checked now, before anything is allocated */
  char settings[256];
  TZ_CHECK(tz_train_compute_settings(&tr->cfg, tr->backend, settings, sizeof settings));
  return tz_model_backend_check(&tr->mc, tr->backend, settings, p->seq_len);
}

int tz_train_compute_settings(const struct tz_config *c, const char *backend, char *buf,
                              size_t len) {
  const char *key, *b, *name, *value;
  for (int i = 0; tz_config_backend_setting(c, i, &key, &b, &name, &value); i++) {
    /* a compute backend's (cuda) or a tier's (hbm) */
    int compute = tz_compute_backend_built(b), tier = !compute && tz_tier_backend_built(b);
    if (!compute && !tier) {
      TZ_WARN("config: %s is a setting of the %s backend, which this build lacks: ignored", key, b);
      continue;
    }
    char one[256];
    snprintf(one, sizeof one, "%s=%s", name, value);
    if ((compute ? tz_compute_settings_check(b, one) : tz_tier_settings_check(b, one)) < 0) {
      char why[512];
      snprintf(why, sizeof why, "%s", tz_err_msg());
      return tz_err_set(TZ_ECONFIG, "config: %s: %s", key, why);
    }
  }
  return tz_config_backend_settings(c, backend, buf, len);
}

/* The compute instance's parameters: after the compute tier and, on a GPU, the lane, whose
 * stream it enqueues on (so that the scheduler's waits on that lane order its work). settings
 * holds the backend's settings string for as long as cp is used (checked by choose_backend). */
static int compute_params(const tz_trainer *tr, struct tz_compute_params *cp, char *settings,
                          size_t len) {
  tz_compute_params_init(cp);
  cp->n_threads = tr->cfg.tierzero.threads;
  cp->dtype = tr->S;
  cp->grad_dtype = TZ_F32;
  cp->device = tr->device;
  TZ_CHECK(tz_config_backend_settings(&tr->cfg, tr->backend, settings, len));
  cp->settings = settings;
  return 0;
}

static int create_compute(tz_trainer *tr) {
  struct tz_compute_params cp;
  char settings[256];
  TZ_CHECK(compute_params(tr, &cp, settings, sizeof settings));
  if (tr->lane)
    cp.stream = tz_lane_native(tr->lane);
  return tz_compute_create(tr->backend, &cp, &tr->cm);
}

/* The rate the plan's compute lane runs at: one layer's forward and backward with recompute (its
 * fwd and bwd phases) at the run's micro-batch, on an instance of the run's compute backend that
 * lives only for this. A 4096^3 matmul (rates->flops) runs faster than a layer, whose attention,
 * norms and elementwise kernels it does not count: llama-7b's step on an H200 took 1.8 times the
 * bound it gave. */
/* The layer's key in the rates cache: everything its time depends on beside the machine (whose
 * file it is): the backend and its device, dtype, threads and settings; the layer's shape and
 * the features that add work; the micro-batch. */
static void layer_key(const tz_trainer *tr, tz_compute *cm, const char *settings, char *buf,
                      size_t len) {
  const struct tz_model_config *m = &tr->mc;
  snprintf(buf, len,
           "layer|%s%s%s|%s|threads %d|%s|C %d H %d Hkv %d D %d F %d bias %d qk_norm %d norms %d "
           "rope %d glu %d window %d softcap %d|B %d T %d",
           tr->backend, tr->device_name[0] ? " " : "", tr->device_name, tz_dtype_name(tr->S),
           tz_compute_threads(cm), settings[0] ? settings : "-", m->d_model, m->n_head,
           m->n_kv_head, tz_model_head_dim(m), m->ffn_dim, m->qkv_bias, m->qk_norm, m->norm_place,
           m->rope_type, m->glu_act, tz_model_layer_window(m, 0), m->attn_softcap > 0, tr->B,
           tr->T);
}

static int measure_layer(tz_trainer *tr, const struct tz_trainer_params *p) {
  struct tz_compute_params cp;
  char settings[256];
  TZ_CHECK(compute_params(tr, &cp, settings, sizeof settings));
  tz_compute *cm = NULL;
  TZ_CHECK(tz_compute_create(tr->backend, &cp, &cm));
  double s = 0;
  /* A planning-only run times a layer within a budget and caches nothing: the budget may have
   * left it untimed. Else the cache's entry for this layer, when it has one. */
  char def[PATH_MAX], key[1024];
  const char *path = p->rates_path;
  if (!path && tz_rates_default_path(def, sizeof def) == 0)
    path = def;
  if (p->plan_only)
    path = NULL;
  layer_key(tr, cm, settings, key, sizeof key);
  double cached[TZ_RATES_LAYER_FIELDS];
  int rc = 0;
  if (path && !p->remeasure && tz_rates_layer_read(path, key, cached)) {
    s = cached[0];
    tr->part_s[0] = cached[1];
    tr->part_s[1] = cached[2];
    tr->part_s[2] = cached[3];
    tr->layer_cached = 1;
  } else {
    /* With what each part's recomputing costs, for tierzero.recompute. */
    rc = tz_rates_layer_time(cm, &tr->mc, tr->B, tr->T, p->plan_only ? TZ_RATES_PLAN_PROBE_S : 0,
                             p->rates ? p->rates->flops : 0, &s, tr->part_s);
    const double v[TZ_RATES_LAYER_FIELDS] = {s, tr->part_s[0], tr->part_s[1], tr->part_s[2]};
    if (rc == 0 && s > 0 && path && tz_rates_layer_write(path, key, v) < 0)
      TZ_WARN("%s (the layer is timed again next time)", tz_err_msg());
  }
  tz_compute_destroy(cm);
  TZ_CHECK(rc);
  tr->layer_rate = s > 0 ? 4.0 * tz_model_layer_flop(&tr->mc, tr->B, tr->T) / s : 0;
  tr->layer_s = s > 0 ? s : 0;
  return 0;
}

int tz_trainer_layer_cached(const tz_trainer *tr) { return tr->layer_cached; }

double tz_trainer_layer_rate(const tz_trainer *tr) { return tr->layer_rate; }

struct tz_trainer_setup_times tz_trainer_setup_times(const tz_trainer *tr) {
  return tr->setup;
}

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

/* The nvme tier (through a fault tier with tierzero.faults) for the plan's nvme homes. */
static int create_nvme_tier(tz_trainer *tr) {
  const struct tz_config *c = &tr->cfg;
  const struct tz_plan *pl = &tr->plan;
  struct tz_tier_params tp;
  const char *dir = tz_machine_nvme_dir(c);
  if (!dir)
    return tz_err_set(TZ_ECONFIG, "train: state is placed on nvme but no directory is given "
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
  return 0;
}

/* The step's tokens and results cross to the compute tier through a host tier of their own,
 * which the runtime page-locks for a GPU (a copy from pageable memory is staged by the driver
 * and blocks). */
static int create_io_tier(tz_trainer *tr) {
  const struct tz_config *c = &tr->cfg;
  struct tz_tier_params tp;
  uint64_t tok = round_up((uint64_t)tr->G * (uint64_t)tr->N * 3 * sizeof(int32_t), 256);
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
  return 0;
}

/* The trainer-owned buffers, carved out of the compute tier's buf (sz: tz_train_buffer_sizes)
 * and zeroed. */
static int carve_buffers(tz_trainer *tr, const uint64_t *sz) {
  const struct tz_plan *pl = &tr->plan;
  char *base = tier_ptr(tr->t_compute, tr->buf.offset), *q = base;
#define CARVE(i) (q += round_up(sz[i], 256), q - round_up(sz[i], 256))
  tr->tokens = (int32_t *)CARVE(BUF_TOKENS);
  tr->targets = (int32_t *)CARVE(BUF_TARGETS);
  tr->pos = (int32_t *)CARVE(BUF_POS);
  tr->dx = CARVE(BUF_DX);
  /* g and u one MLP chunk's: where a layer keeps its MLP they are the kept part's */
  /* the head's scratch in the same room as the layers' working acts (tz_train_buffer_sizes) */
  char *work = CARVE(BUF_ACTS);
  tz_model_acts_work_carve(&tr->mc, tr->S, tr->B, tr->T, work, &tr->acts);
  tz_model_head_scratch_carve(&tr->mc, tr->S, tr->B, tr->T, work, &tr->hs);
  tz_model_scratch_carve(&tr->mc, tr->S, tr->B, tr->T, CARVE(BUF_LS), &tr->ls);
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
  char *keep = CARVE(BUF_KEEP);
  tr->acc = (float *)CARVE(BUF_ACC);
#undef CARVE
  /* Each layer's kept parts side by side in BUF_KEEP; its recomputed ones are the shared acts'. */
  for (int i = 0; i < tr->L; i++) {
    unsigned kept = tz_model_parts_kept(tr->recompute[i]);
    tr->lacts[i] = tr->acts;
    tz_model_acts_carve_parts(&tr->mc, tr->S, tr->B, tr->T, kept, keep, &tr->lacts[i]);
    keep += tz_model_acts_kept_bytes(&tr->mc, tr->S, tr->B, tr->T, kept);
  }
  /* The load-balancing loss: every layer's forward adds its routing statistics, every backward
   * its gradient (phases.c, moe_aux) */
  tr->moe_stats = tr->moe_daux = NULL;
  if (tz_model_aux_coef(&tr->mc) > 0) {
    tr->moe_stats = tr->scal + 4;
    tr->moe_daux = tr->moe_stats + 2 * tr->mc.n_expert;
    for (int i = 0; i < tr->L; i++) {
      tr->lacts[i].moe_stats = tr->moe_stats;
      tr->lacts[i].moe_daux = tr->moe_daux;
    }
  }
  TZ_CHECK(tz_compute_zero(tr->cm, base, (size_t)pl->compute_fixed));
  return tz_compute_sync(tr->cm);
}

/* The compute tier could not be made (rc): with a budget given, the message names it and what
 * would work (the machine check only warned about it: trainer/step/machine.h). */
static int compute_refused(const tz_trainer *tr, int rc, uint64_t capacity) {
  uint64_t budget = tr->cfg.tierzero.hbm_budget;
  if (!budget)
    return rc;
  char why[512], a[32], b[32];
  snprintf(why, sizeof why, "%s", tz_err_msg());
  tz_bytes_format(a, sizeof a, (double)capacity, &tz_bytes_plan);
  tz_bytes_format(b, sizeof b, (double)budget, &tz_bytes_plan);
  return tz_err_set(rc,
                    "train: the compute tier of %s (tierzero.hbm_budget %s, or TZ_HBM_BUDGET) "
                    "cannot be made: %s; a budget this machine's %s can hold, or none (the plan "
                    "then sizes the tier to what is free), would work",
                    a, b, why, tr->gpu ? "GPU" : "host memory");
}

static int create_tiers(tz_trainer *tr) {
  const struct tz_config *c = &tr->cfg;
  const struct tz_plan *pl = &tr->plan;
  uint64_t sz[BUF_COUNT];
  tz_train_buffer_sizes(tr, sz);
  struct tz_tier_params tp;
  tz_tier_params_init(&tp);
  tp.name = "compute";
  tp.numa_node = c->tierzero.numa_node;
  tp.capacity = pl->compute_fixed + pl->used[TZ_PLAN_COMPUTE] + pl->window;
  tp.device = tr->device;
  char settings[256];
  if (tr->gpu) {
    TZ_CHECK(tz_config_backend_settings(c, "hbm", settings, sizeof settings));
    tp.settings = settings;
  }
  int rc = tz_tier_create(tr->rt, tr->gpu ? "hbm" : "host", &tp, &tr->t_compute);
  if (rc < 0)
    return compute_refused(tr, rc, tp.capacity);
  if (pl->used[TZ_PLAN_HOST]) {
    tz_tier_params_init(&tp);
    tp.name = "host";
    tp.numa_node = c->tierzero.numa_node;
    tp.capacity = pl->used[TZ_PLAN_HOST];
    TZ_CHECK(tz_tier_create(tr->rt, "host", &tp, &tr->t_host));
  }
  if (pl->used[TZ_PLAN_NVME])
    TZ_CHECK(create_nvme_tier(tr));
  TZ_CHECK(create_io_tier(tr));
  if (tr->gpu)
    TZ_CHECK(create_lane(tr));
  TZ_CHECK(create_compute(tr));
  TZ_CHECK(tz_tier_alloc(tr->t_compute, pl->compute_fixed, &tr->buf));
  return carve_buffers(tr, sz);
}

static tz_tier *tier_for(tz_trainer *tr, int t) {
  return t == TZ_PLAN_COMPUTE ? tr->t_compute : t == TZ_PLAN_HOST ? tr->t_host : tr->t_nvme;
}

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
      if (!tr->bytes[b][k]) /* the embedding's input: none */
        continue;
      tz_tier *t = tier_for(tr, tr->plan.tier[b * TZ_PLAN_KINDS + k]);
      TZ_CHECK_GOTO(tz_tier_alloc(t, tr->bytes[b][k], &tr->home[b][k]), rc, out);
      dev[k] = tz_tier_device_ptr(t, tr->home[b][k].offset);
      at[k] = dev[k] ? NULL : tz_tier_host_ptr(t, tr->home[b][k].offset);
    }
    float *master = at[TZ_PLAN_MASTER] ? at[TZ_PLAN_MASTER] : f32;
    TZ_CHECK_GOTO(tz_model_init_block(&tr->mc, b, (uint64_t)tr->cfg.seed, begin, begin + n, master),
                  rc, out);
    int zeroed = 0; /* buf holds zeros */
    /* The state; a block's input is written by the phase before its first use in a step. */
    for (int k = 0; k < TZ_PLAN_STATE_KINDS; k++) {
      uint64_t bytes = tr->bytes[b][k];
      const void *src = NULL;
      if (k == TZ_PLAN_MASTER) {
        src = master;
      } else if (k == TZ_PLAN_PARAM) {
        tz_train_host_cast(at[k] ? at[k] : buf, tr->S, master, n);
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
        TZ_CHECK_GOTO(tz_tier_write_sync(&tr->home[b][k], 0, src, round_up(bytes, ALIGN)), rc, out);
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
  sp.wait_for_write_back = c->tierzero.wait_for_write_back;
  sp.carry = tr->carry;
  sp.defer_rewrite = c->tierzero.defer_rewrite;
  sp.queue_bytes = c->tierzero.copy_queue;
  sp.stage_chunk_bytes = c->tierzero.nvme_stage_bytes;
  sp.stage_chunks = c->tierzero.nvme_stage_chunks;
  TZ_CHECK(tz_sched_create(tr->rt, &sp, &tr->sched));
  tr->bid = calloc((size_t)tr->nb, sizeof *tr->bid);
  if (!tr->bid)
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  for (int b = 0; b < tr->nb; b++)
    for (int k = 0; k < TZ_PLAN_KINDS; k++) {
      char name[64];
      snprintf(name, sizeof name, "%s.%s", tr->names[b], tz_plan_kind_name(k));
      tr->bid[b][k] = -1; /* the embedding's input: none, and no phase uses it */
      if (tr->bytes[b][k])
        TZ_CHECK(
            tz_sched_block_add(tr->sched, name, tr->bytes[b][k], &tr->home[b][k], &tr->bid[b][k]));
    }
  for (int i = 0; i < tr->n_ph; i++)
    for (int u = 0; u < tr->ph[i].n_uses; u++)
      tr->ph[i].uses[u].block = tr->bid[tr->ph[i].blocks[u]][tr->ph[i].kinds[u]];
  if (tr->n_ph <= 0)
    return tz_err_set(TZ_EINVAL, "train: no phases to declare");
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
    v = tr->gpu &&
        (p->auto_placement || tr->cfg.zero_optimization.offload_param.device == TZ_OFFLOAD_NONE);
  tr->overlap = v && tr->cfg.zero_optimization.overlap_comm && tr->world > 1;
}

/* Whether the plan picks the CPU's share of Adam (tr->cpu_adam_search). tierzero.cpu_adam_search
 * true or false decides; auto searches on a GPU whose config offloads the optimizer state to the
 * host (offload_optimizer.device cpu, forced placement) when no tierzero.cpu_adam is given: the
 * split gives the same bits, and where it applies the searched share measured 1.2x faster than
 * none (llama-3b on an H200, docs/training.md "Splitting Adam"). With --auto-placement the plan
 * may keep the state in HBM, where a share only moves it out: auto leaves the search off. */
static void choose_cpu_adam_search(tz_trainer *tr, const struct tz_trainer_params *p) {
  const struct tz_config *c = &tr->cfg;
  int v = c->tierzero.cpu_adam_search;
  if (v < 0)
    v = tr->gpu && !p->auto_placement && c->tierzero.cpu_adam < 0 &&
        c->zero_optimization.offload_optimizer.device == TZ_OFFLOAD_CPU;
  tr->cpu_adam_search = v;
}

/* Whether the window carries copies into the next step (tr->carry; placement.c sizes the window
 * by it). tierzero.window_carry true or false decides; auto carries, except on a GPU with the
 * placement forced by the config and neither tierzero.hbm_budget nor a window given: there the
 * window takes the GPU's free memory as a working set, each step reading its blocks from their
 * homes, which DeepSpeed's offload promises (the GPU no cache of what the config put elsewhere)
 * and which measured 1.15-1.2x faster than the small carrying window forced placement had
 * (tz-offload llama-3b on H200s, the CPU's share searched: 0.786-0.823 s against 0.930-0.978;
 * llama-7b at 8 micro-batches 1.007x tz-auto; docs/training.md, "The window under forced
 * placement"). */
static void choose_carry(tz_trainer *tr, const struct tz_trainer_params *p) {
  int v = tr->cfg.tierzero.window_carry;
  if (v < 0)
    v = !(tr->gpu && !p->auto_placement && !tr->cfg.tierzero.hbm_budget && !p->window);
  tr->carry = v;
}

/* The run's shape: the model, the ranks (those planned for, with plan_world), the batch. */
static int init_shape(tz_trainer *tr, const struct tz_config *cfg, const struct tz_model_config *mc,
                      tz_comm *comm, tz_runtime *rt, const struct tz_trainer_params *p) {
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
  if (p->trace_path && !(tr->trace_path = strdup(p->trace_path)))
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  return 0;
}

/* Everything up to the plan: options, the backend, sizes, the phases, the layer's rate, the
 * blocks the CPU steps, the plan. Allocates nothing in a tier. */
static int plan_trainer(tz_trainer *tr, const struct tz_trainer_params *p) {
  TZ_CHECK(check_options(tr, p));
  TZ_CHECK(choose_backend(tr, p));
  choose_overlap(tr, p);
  choose_cpu_adam_search(tr, p);
  choose_carry(tr, p);
  TZ_CHECK(tz_train_sizes(tr));
  TZ_CHECK(tz_train_build_phases(tr));
  tr->at_home = calloc((size_t)tr->n_ph, sizeof *tr->at_home);
  if (!tr->at_home)
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  /* Whether the state fits, in the plan's budgets and on this machine, does not depend on the
   * layer's rate: a plan that cannot fit is refused in a second, before the probe (minutes for
   * a large layer on a CPU) allocates a layer's worth of buffers. The rate changes only the
   * bound, and with it which blocks move first: the plan is made again with it. */
  int given = p->plan_only && p->layer_rate > 0;
  if (given)
    tr->layer_rate = p->layer_rate;
  tz_train_choose_cpu_steps(tr, tr->cfg.tierzero.cpu_adam);
  TZ_CHECK(tz_train_make_plan(tr, p));
  TZ_CHECK(tz_train_check_machine(tr, p));
  if ((given || !p->measure_layer) && !tr->cpu_adam_search)
    return 0;
  uint64_t used[TZ_PLAN_TIERS];
  memcpy(used, tr->plan.used, sizeof used);
  tz_plan_free(&tr->plan);
  if (!given && p->measure_layer)
    TZ_CHECK(measure_layer(tr, p));
  if (tr->cpu_adam_search)
    TZ_CHECK(tz_train_search_cpu_steps(tr, p));
  else
    tz_train_choose_cpu_steps(tr, tr->cfg.tierzero.cpu_adam);
  TZ_CHECK(tz_train_make_plan(tr, p));
  /* The same budgets; the homes may have moved between host and nvme. */
  return memcmp(used, tr->plan.used, sizeof used) ? tz_train_check_machine(tr, p) : 0;
}

/* What the plan asks for: the tiers, the homes with their initial shards, the scheduler. */
static int build_trainer(tz_trainer *tr) {
  tr->lacts = calloc((size_t)tr->L + 1, sizeof *tr->lacts);
  tr->jobs = calloc(2 * (size_t)tr->n_ph, sizeof *tr->jobs);
  if (!tr->lacts || !tr->jobs)
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  double t0 = tz_now_s();
  TZ_CHECK(create_tiers(tr));
  double t1 = tz_now_s();
  TZ_CHECK(init_homes(tr));
  double t2 = tz_now_s();
  TZ_CHECK(create_sched(tr));
  tr->setup.tiers_s = t1 - t0;
  tr->setup.shards_s = t2 - t1;
  tr->setup.sched_s = tz_now_s() - t2;
  TZ_INFO("train: rank %d of %d, %d blocks, %d phases per step, optimizer step %s, window %llu "
          "bytes; tiers made in %.1f s, shards initialised in %.1f s, scheduler in %.1f s",
          tr->rank, tr->world, tr->nb, tr->n_ph, tz_opt_mode_name(tr->mode),
          (unsigned long long)tr->plan.window, tr->setup.tiers_s, tr->setup.shards_s,
          tr->setup.sched_s);
  return 0;
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
  TZ_CHECK_GOTO(init_shape(tr, cfg, mc, comm, rt, p), rc, fail);
  double t0 = tz_now_s();
  TZ_CHECK_GOTO(plan_trainer(tr, p), rc, fail);
  tr->setup.plan_s = tz_now_s() - t0;
  if (!p->plan_only)
    TZ_CHECK_GOTO(build_trainer(tr), rc, fail);
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
  free(tr->acc_off);
  free(tr->lacts);
  free(tr->recompute);
  tz_tier_free(&tr->io);
  tz_tier_destroy(tr->t_io);
  free(tr->trace_path);
  tz_config_free(&tr->cfg);
  free(tr);
}
