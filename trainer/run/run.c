/* A whole training run (trainer/run/run.h): set-up, the steps and their cadence, the end. */
#define _GNU_SOURCE
#include "trainer/run/run_internal.h"

#include "core/error.h"
#include "core/log.h"
#include "core/sched.h"
#include "kernels/compute.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/run/export.h"
#include "trainer/model/hf.h"
#include "trainer/step/lr.h"
#include "trainer/run/monitor.h"
#include "trainer/step/rates.h"
#include "trainer/checkpoint/resume.h"
#include "trainer/run/signals.h"
#include "trainer/data/synthetic.h"
#include "topo/topo.h"
#include "util/clock.h"

#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void tz_run_options_init(struct tz_run_options *o) {
  memset(o, 0, sizeof *o);
  o->seq = 64;
  o->steps = 10;
  o->backend = "cpu";
  o->val_fraction = 0.05;
  o->export_dtype = TZ_BF16;
  o->export_shard_bytes = 5000000000ull;
  o->trace_step = -1;
  o->seed = -1;
}

/* ---- The model ---- */

void tz_run_trainer_params(const struct tz_run_options *o, struct tz_plan_rates *rates,
                           struct tz_trainer_params *tp) {
  tz_trainer_params_init(tp);
  tp->seq_len = o->seq;
  tp->total_steps = o->steps;
  tp->opt_mode = o->mode;
  tp->auto_placement = o->auto_placement;
  tp->rates = rates;
  tp->plan_only = o->plan_only;
  tp->compute_backend = o->backend;
  tp->device = o->device;
  tp->measure_layer = 1;
  tp->rates_path = o->rates;
  tp->remeasure = o->remeasure;
  tp->gpu_free = o->gpu_memory;
  tp->layer_rate = o->layer_rate;
  tp->plan_world = o->plan_world;
  if (o->coll_rate > 0)
    rates->collective = o->coll_rate;
}

int tz_run_model(const char *name, struct tz_model_config *mc, char *dir, size_t len) {
  if (len)
    dir[0] = 0;
  if (tz_model_preset(name, mc) == 0)
    return 0;
  struct stat st;
  if (stat(name, &st) != 0) {
    char why[256];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(TZ_ENOENT,
                      "--model: %s; or a Hugging Face config.json (a file, or a directory "
                      "holding one): no such file %s",
                      why, name);
  }
  char file[4096], base[4096];
  if (S_ISDIR(st.st_mode)) {
    snprintf(file, sizeof file, "%s/config.json", name);
    snprintf(dir, len, "%s", name);
  } else {
    snprintf(file, sizeof file, "%s", name);
    snprintf(base, sizeof base, "%s", name);
    snprintf(dir, len, "%s", dirname(base));
  }
  /* A directory, or a file named config.json, reads as its directory; another file name as
   * itself (tz_hf_config_read takes both). */
  snprintf(base, sizeof base, "%s", file);
  const char *arg = S_ISDIR(st.st_mode) || strcmp(basename(base), "config.json") == 0 ? dir : name;
  /* init_std is initializer_range (transformers' 0.02 when absent): the model is initialised
   * as transformers initialises the family. */
  return tz_hf_config_read(arg, mc, NULL);
}

/* ---- The cadence ---- */

int tz_run_evaluates(const struct tz_run_options *o, int64_t done) {
  return o->eval_every && (done % o->eval_every == 0 || done == o->steps);
}

int tz_run_saves(const struct tz_run_options *o, int64_t done, int stop) {
  return o->ckpt_dir && (stop || (o->save_every && done % o->save_every == 0));
}

int tz_run_saves_at_end(const struct tz_run_options *o, int64_t start, int64_t saved) {
  return o->ckpt_dir && saved != o->steps && o->steps > start;
}

/* ---- Batches ---- */

int tz_run_fill_batch(const struct tz_run_batch *b, int64_t step, int val, int32_t *tok,
                      int32_t *tgt, struct tz_step_docs *docs, int32_t *pos) {
  if (docs)
    *docs = (struct tz_step_docs){0};
  for (int k = 0; k < b->accum; k++) {
    int64_t o = (int64_t)k * b->micro * b->seq;
    int32_t *ti = tok + o, *tt = tgt + o;
    if (!b->data) {
      /* Synthetic validation sequences: indices far past any training run's. */
      uint64_t first = tz_synthetic_first(step, k, b->rank, b->world, b->accum, b->micro);
      tz_synthetic_batch(b->seed, val ? (1ull << 48) + first : first, b->micro, b->seq, b->vocab,
                         ti, tt);
    } else {
      TZ_CHECK(tz_data_batch_docs(
          b->data, val ? TZ_DATA_VAL : TZ_DATA_TRAIN,
          tz_data_sample_index((uint64_t)step, b->accum, k, b->world, b->rank, b->micro), b->micro,
          ti, tt, docs && tz_data_packed(b->data) ? pos + o : NULL));
    }
  }
  if (docs && b->data && tz_data_packed(b->data)) {
    /* The step's samples over every rank are consecutive global indices (data.h). */
    uint64_t n = (uint64_t)b->accum * (uint64_t)b->world * (uint64_t)b->micro;
    docs->pos = pos;
    docs->targets =
        (int64_t)tz_data_targets(b->data, val ? TZ_DATA_VAL : TZ_DATA_TRAIN, (uint64_t)step * n, n);
  }
  return 0;
}

/* ---- Before the run ---- */

const char *tz_run_comm_backend(const struct tz_bootstrap *bs) {
  return bs->size == 1 ? "single" : bs->kind == TZ_LAUNCH_MPIRUN ? "mpi" : "nccl";
}

const char *tz_run_compute_backend(const char *asked, const char *comm_backend) {
  if (asked && strcmp(asked, "auto") != 0)
    return asked;
  char why[256];
  return strcmp(comm_backend, "mpi") != 0 && tz_compute_probe("cuda", why, sizeof why) == 0 ? "cuda"
                                                                                            : "cpu";
}

void tz_run_place(const struct tz_bootstrap *bs, struct tz_config *cfg,
                  struct tz_runtime_params *rp, struct tz_run_placement *out) {
  memset(out, 0, sizeof *out);
  struct tz_topo_load_params lp;
  tz_topo_load_params_init(&lp);
  struct tz_topo_advice_params ap;
  tz_topo_advice_params_init(&ap);
  tz_topo *topo = NULL;
  struct tz_topo_advice *adv = NULL;
  if (tz_topo_load(&lp, &topo) < 0 || tz_topo_advise(topo, &ap, &adv) < 0) {
    tz_log(TZ_LOG_INFO, "tz-train: no placement advice: %s", tz_err_msg());
    goto out;
  }
  int gpu = tz_topo_gpu_count(topo) > 0 ? bs->local_rank % tz_topo_gpu_count(topo) : -1;
  const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(adv, gpu);
  if (!pl)
    goto out;
  out->known = 1;
  out->advised = cfg->tierzero.numa_node < 0 && pl->numa_node >= 0;
  if (out->advised) /* the effective config says where every host tier goes */
    cfg->tierzero.numa_node = pl->numa_node;
  rp->numa_node = cfg->tierzero.numa_node;
  out->numa_node = rp->numa_node;
  if (gpu >= 0 && tz_topo_bind_thread(topo, &pl->cpus) < 0)
    tz_log(TZ_LOG_WARN, "tz-train: cannot bind to the advised cpus: %s", tz_err_msg());
  struct tz_topo_binding b;
  if (tz_topo_binding_readback(topo, &b) == 0)
    tz_topo_binding_format(&b, out->binding, sizeof out->binding);
out:
  tz_topo_advice_destroy(adv);
  tz_topo_destroy(topo);
}

int tz_run_world_open(struct tz_bootstrap *bs, struct tz_config *cfg, struct tz_run_world *w) {
  memset(w, 0, sizeof *w);
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.staging_bytes = cfg->tierzero.staging_bytes;
  rp.chunk_bytes = cfg->tierzero.chunk_bytes;
  rp.numa_node = cfg->tierzero.numa_node;
  tz_run_place(bs, cfg, &rp, &w->placement);
  TZ_CHECK(tz_runtime_create(&rp, &w->rt));
  struct tz_comm_params cp;
  tz_comm_params_init(&cp);
  cp.progress = tz_runtime_progress(w->rt);
  cp.timeout_s = cfg->tierzero.comm_timeout;
  /* The launcher's exchanges from here on keep the same limit. */
  bs->timeout_s = cfg->tierzero.comm_timeout;
  return tz_comm_create(tz_run_comm_backend(bs), bs, &cp, &w->comm);
}

void tz_run_world_close(struct tz_run_world *w) {
  tz_comm_destroy(w->comm);
  tz_runtime_destroy(w->rt);
  w->comm = NULL;
  w->rt = NULL;
}

/* ---- The run ---- */

static int emit(struct tz_run_state *r, struct tz_run_event *ev) {
  ev->rank = r->rank;
  ev->world = r->world;
  ev->trainer = r->tr;
  ev->model = &r->mc;
  ev->model_name = r->model_name;
  return r->o->on_event ? r->o->on_event(r->o->arg, ev) : 0;
}

static int emit_kind(struct tz_run_state *r, enum tz_run_event_kind kind, int64_t step) {
  struct tz_run_event ev = {.kind = kind, .step = step};
  return emit(r, &ev);
}

/* A disk's rate over its busy time is known from enough bytes: below that a few requests'
 * latency decides it (and can only make it slower). */
#define DISK_RATE_MIN_BYTES (16.0 * 1024 * 1024)
/* How much faster than the probe's rate the disk must have moved to explain a run under its
 * bound. */
#define DISK_FASTER 1.02

/* The disk's reads and writes together over the time it was busy in the timed steps, bytes per
 * second; 0 without a disk, its busy time, or enough bytes. */
static double run_disk_rate(const struct tz_metrics_summary *s) {
  const struct tz_disk_traffic *d = &s->timed_disk;
  double bytes = (double)d->read + (double)d->written;
  if (!s->has_disk || !(d->busy_s > 0) || bytes < DISK_RATE_MIN_BYTES)
    return 0;
  return bytes / d->busy_s;
}

/* The summary event of the steps this run took, and the metrics file's summary line. */
static int summarize(struct tz_run_state *r) {
  struct tz_sched_stats st;
  tz_trainer_sched_stats(r->tr, &st);
  /* Two runs of the home phases at least after the first step (the first one's update runs in
   * the second step, folded), the rate over them. */
  struct tz_home_work w;
  tz_trainer_home_work(r->tr, &w);
  double home_rate = w.runs >= r->home0.runs + 2 && w.seconds > r->home0.seconds
                         ? (w.elements - r->home0.elements) / (w.seconds - r->home0.seconds)
                         : 0;
  tz_tier *tiers[3];
  TZ_CHECK(
      tz_metrics_summary_traffic_rest(&r->sum, tiers, tz_trainer_tiers(r->tr, tiers), &r->traffic));
  double disk_rate = run_disk_rate(&r->sum);
  struct tz_run_event ev = {.kind = TZ_RUN_SUMMARY,
                            .summary = &r->sum,
                            .sched = &st,
                            .first_loss = r->res->first_loss,
                            .last_loss = r->res->last_loss,
                            .home_rate = home_rate,
                            .disk_rate = disk_rate,
                            .rates = &r->rates};
  TZ_CHECK(emit(r, &ev));
  if (r->mw)
    TZ_CHECK(tz_metrics_write_summary(r->mw, &r->sum));
  /* A run faster than its bound shows the cached rates were measured slow: measure them again,
   * unless its disk moved faster than the probe's rate, which explains it: the cache then keeps
   * the disk's rate, and the next plan costs the disk at it (a run under that bound measures
   * again). Else the cache keeps the rate the CPU's Adam reached at the homes after the first
   * step and the disk's, for the next plan on this set-up (the probes' are not what a run
   * reaches: core/plan.h). */
  double planned = tz_plan_disk_probe_rate(&r->rates);
  if (r->rates.nvme_run > planned)
    planned = r->rates.nvme_run;
  int below = tz_metrics_summary_below_bound(&r->sum);
  if (r->rank == 0 && below && !(disk_rate > planned * DISK_FASTER)) {
    if (tz_rates_forget(r->cfg, r->o->backend, r->o->rates) < 0)
      tz_log(TZ_LOG_WARN, "tz-train: %s", tz_err_msg());
  } else if (r->rank == 0 && tz_rates_learn(r->cfg, r->o->backend, r->o->rates,
                                            below ? 0 : home_rate, disk_rate) < 0) {
    tz_log(TZ_LOG_WARN, "tz-train: %s (the next plan takes the probe's rates)", tz_err_msg());
  }
  return 0;
}

/* ---- Live monitoring (trainer/run/monitor.h), on rank 0 ---- */

/* The config's monitors, their directories made and their files opened before the first step
 * (when the run takes one), so that a place that cannot take them fails the run before it
 * trains. Every rank follows rank 0's verdict. */
static int monitor_open(struct tz_run_state *r) {
  if (r->o->steps <= tz_run_ckpt_start(r->o))
    return 0;
  int rc = r->rank == 0 ? tz_monitor_create(r->cfg, &r->mon) : 0;
  return tz_run_rank0_agree(r, rc, "tensorboard, csv_monitor");
}

/* Step m as DeepSpeed's engine reports it: at its global_samples, every step done (skipped ones
 * too) times the global batch (train_batch_size), with the rate its scheduler gives after the step:
 * that of the update after the ones applied (steps done less the fp16 overflows skipped). */
static int monitor_write(struct tz_run_state *r, const struct tz_step_metrics *m) {
  const struct tz_config *tc = tz_trainer_config(r->tr);
  struct tz_monitor_step s = {
      .samples = m->step * r->batch.accum * r->batch.micro * r->world,
      .train_loss = m->loss,
      .lr = tz_lr_at(tc, m->step - tz_trainer_skipped_steps(r->tr), r->o->steps),
      .has_loss_scale = tc->fp16.enabled,
      .loss_scale = m->loss_scale,
      .has_eval = m->has_eval,
      .eval_loss = m->eval_loss,
      .grad_norm = m->grad_norm,
      .step_s = m->step_s,
      .tokens_per_s = m->tokens_per_s,
  };
  return tz_monitor_write_step(r->mon, &s);
}

/* The first field in which two model configs differ, or NULL. */
static const char *model_mismatch(const struct tz_model_config *a,
                                  const struct tz_model_config *b) {
  return a->d_model != b->d_model                 ? "d_model (hidden_size)"
         : a->n_layer != b->n_layer               ? "n_layer (num_hidden_layers)"
         : a->n_head != b->n_head                 ? "n_head (num_attention_heads)"
         : a->n_kv_head != b->n_kv_head           ? "n_kv_head (num_key_value_heads)"
         : a->ffn_dim != b->ffn_dim               ? "ffn_dim (intermediate_size)"
         : a->vocab != b->vocab                   ? "vocab (vocab_size)"
         : a->rope_theta != b->rope_theta         ? "rope_theta"
         : a->norm_eps != b->norm_eps             ? "norm_eps (rms_norm_eps)"
         : a->tie_embeddings != b->tie_embeddings ? "tie_embeddings (tie_word_embeddings)"
                                                  : NULL;
}

/* 1 when dir holds a tokenizer.json, which then goes into path (len bytes). */
static int has_tokenizer(const char *dir, char *path, size_t len) {
  if (!dir || !*dir)
    return 0;
  snprintf(path, len, "%s/tokenizer.json", dir);
  return access(path, R_OK) == 0;
}

/* 1 when dir holds any tokenizer file an export copies (tokenizer.json, a sentencepiece
 * tokenizer.model, tokenizer_config.json). */
static int has_tokenizer_files(const char *dir) {
  static const char *const names[] = {"tokenizer.json", "tokenizer.model", "tokenizer_config.json"};
  char path[4200];
  for (size_t i = 0; dir && *dir && i < sizeof names / sizeof *names; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (access(path, R_OK) == 0)
      return 1;
  }
  return 0;
}

/* Where the tokenizer is: the export copies its files from import_dir, else from the --model
 * directory (the first that holds any); the data's sidecars are checked against --tokenizer,
 * else the tokenizer.json of that directory. */
static void find_tokenizer(struct tz_run_state *r) {
  char path[4200];
  const char *dirs[] = {r->o->import_dir, r->model_dir};
  for (int i = 0; i < 2 && !r->tokenizer_dir[0]; i++)
    if (has_tokenizer_files(dirs[i])) {
      snprintf(r->tokenizer_dir, sizeof r->tokenizer_dir, "%s", dirs[i]);
      if (has_tokenizer(dirs[i], path, sizeof path))
        snprintf(r->tokenizer, sizeof r->tokenizer, "%s", path);
    }
  if (r->o->tokenizer)
    snprintf(r->tokenizer, sizeof r->tokenizer, "%s", r->o->tokenizer);
}

/* Gemma's math runs on the cpu backend only (kernels/compute.h, variants): refused at start on
 * another, naming what of it the model uses. */
static int backend_computes(const struct tz_run_state *r) {
  const char *backend = r->o->backend ? r->o->backend : "cpu";
  char settings[256];
  TZ_CHECK(tz_train_compute_settings(r->cfg, backend, settings, sizeof settings));
  return tz_model_backend_check(&r->mc, backend, settings, r->o->seq);
}

/* The model: the preset or config.json named by --model or tierzero.model; with
 * --import-safetensors and none named, the checkpoint's config (its max_seq from the checkpoint
 * too). */
static int choose_model(struct tz_run_state *r) {
  const struct tz_run_options *o = r->o;
  const char *preset = o->model ? o->model : r->cfg->tierzero.model;
  if (!preset && !r->hm)
    preset = "tiny";
  if (!preset) {
    r->mc = *tz_hf_config(r->hm);
    r->model_name = o->import_dir;
    find_tokenizer(r);
    return backend_computes(r);
  }
  TZ_CHECK(tz_run_model(preset, &r->mc, r->model_dir, sizeof r->model_dir));
  r->model_name = preset;
  find_tokenizer(r);
  TZ_CHECK(backend_computes(r));
  const char *diff = r->hm ? model_mismatch(&r->mc, tz_hf_config(r->hm)) : NULL;
  if (diff)
    return tz_err_set(TZ_ECONFIG, "--import-safetensors %s: its %s differs from model %s's",
                      o->import_dir, diff, preset);
  return 0;
}

/* The rates the plan costs with, then the trainer and its plan. */
static int plan(struct tz_run_state *r) {
  const struct tz_run_options *o = r->o;
  double t_start = tz_now_s();
  int rc = tz_rates_get(r->cfg, o->backend, r->rt, r->comm, o->rates, o->remeasure, &r->rates);
  if (rc < 0 && o->gpu_memory) {
    char why[512];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    rc = tz_err_set(rc,
                    "--gpu-memory: %s holds no rates for this set-up and this machine cannot "
                    "measure a GPU's (%s): give --rates the cache of a run on the GPU machine",
                    o->rates ? o->rates : "the rates cache", why);
  }
  if (rc < 0)
    return rc;
  double t_rates = tz_now_s();
  struct tz_trainer_params tp;
  tz_run_trainer_params(o, &r->rates, &tp);
  TZ_CHECK(tz_trainer_create(r->cfg, &r->mc, r->comm, r->rt, &tp, &r->tr));
  double now = tz_now_s();
  struct tz_run_event ev = {.kind = TZ_RUN_PLANNED,
                            .rates = &r->rates,
                            .setup_s = now - t_start,
                            .rates_s = t_rates - t_start};
  return emit(r, &ev);
}

/* A run's metrics file is its own; a resumed run continues the file of the run it resumes, from
 * the checkpoint's step (docs/data.md). */
static int open_metrics(struct tz_run_state *r) {
  if (r->o->resume)
    TZ_CHECK(tz_metrics_writer_resume(r->o->metrics, r->res->start, &r->mw));
  else
    TZ_CHECK(tz_metrics_writer_create(r->o->metrics, 0, &r->mw));
  return tz_metrics_write_config(r->mw, r->cfg, r->res->start);
}

/* The special tokens of the data's tokenizer, for the export, where the model has none of its
 * own (an import's config gives them). */
static void data_token_ids(struct tz_run_state *r) {
  const struct tz_data_tokenizer *t = tz_data_tokenizer(r->data);
  if (!t->known)
    return;
  if (!r->mc.has_bos && t->has_bos) {
    r->mc.has_bos = 1;
    r->mc.bos_id = t->bos_id;
  }
  if (!r->mc.has_eos && t->has_eos) {
    r->mc.has_eos = 1;
    r->mc.eos_id = t->eos_id;
  }
  if (!r->mc.has_pad && t->has_pad) {
    r->mc.has_pad = 1;
    r->mc.pad_id = t->pad_id;
  }
}

/* The state to start from (an import or a checkpoint), the data, the metrics file, the buffers. */
/* The data: --data, else the config's (a resume's: what the run it continues trained on);
 * none for synthetic sequences. Opened before the plan, so that --epochs can count its samples
 * and a refusal comes before any setup. */
static int open_data(struct tz_run_state *r) {
  const struct tz_run_options *o = r->o;
  const char *data = o->data ? o->data : r->cfg->tierzero.data;
  if (data && strcmp(data, "synthetic") == 0)
    return 0;
  struct tz_data_params dp = {.seq_len = o->seq,
                              .seed = (uint64_t)r->cfg->seed,
                              .val_spec = o->eval_every ? o->val_data : NULL,
                              .tokenizer = r->tokenizer[0] ? r->tokenizer : NULL,
                              .split_long = r->cfg->tierzero.long_documents};
  if (o->eval_every && !o->val_data)
    dp.val_fraction = o->val_fraction;
  TZ_CHECK(tz_data_open(data, r->mc.vocab, &dp, &r->data));
  data_token_ids(r);
  return 0;
}

int64_t tz_run_epoch_steps(double epochs, uint64_t samples, int64_t per_step) {
  double steps = ceil(epochs * (double)samples / (double)per_step);
  return steps < 1 ? 1 : (int64_t)steps;
}

/* tierzero.epochs (--epochs) as steps into *oo (a copy of the options the run reads from then
 * on): ceil(epochs * training samples / the global batch); --steps given too must agree. */
static int resolve_epochs(struct tz_run_state *r, struct tz_run_options *oo) {
  double epochs = r->cfg->tierzero.epochs;
  if (!(epochs > 0))
    return 0;
  if (!r->data)
    return tz_err_set(TZ_ECONFIG,
                      "--epochs %g: epochs are passes over --data, and this run has "
                      "synthetic sequences",
                      epochs);
  uint64_t samples = tz_data_n_samples(r->data, TZ_DATA_TRAIN);
  int64_t per_step = (int64_t)r->cfg->gradient_accumulation_steps *
                     r->cfg->train_micro_batch_size_per_gpu * r->world;
  int64_t steps = tz_run_epoch_steps(epochs, samples, per_step);
  if (oo->steps_set && oo->steps != steps && oo->steps != 0)
    return tz_err_set(TZ_ECONFIG,
                      "--steps %lld and --epochs %g disagree: %g epochs of %llu %s at %lld a step "
                      "(micro-batch x accumulation x ranks) are %lld steps; give one of them",
                      (long long)oo->steps, epochs, epochs, (unsigned long long)samples,
                      tz_data_packed(r->data) ? "packed rows" : "windows", (long long)per_step,
                      (long long)steps);
  if (!oo->steps_set || oo->steps != 0)
    oo->steps = steps;
  return 0;
}

static int prepare(struct tz_run_state *r) {
  const struct tz_run_options *o = r->o;
  if (r->hm) {
    TZ_CHECK(tz_export_import(r->tr, r->hm, &r->mc));
    TZ_CHECK(emit_kind(r, TZ_RUN_IMPORTED, 0));
  }
  if (o->resume) {
    TZ_CHECK(tz_resume_load(r->tr, r->comm, o->resume, &r->res->start));
    r->res->saved = r->res->start;
    r->res->steps_done = r->res->start;
    TZ_CHECK(emit_kind(r, TZ_RUN_RESUMED, r->res->start));
    /* --steps counts from the start of the training, not of this run (issue 48: a resume past
     * it ended with "0 steps" and no word why) */
    if (r->res->start > o->steps && o->steps > 0 && !o->plan_only) /* 0: a conversion */
      return tz_err_set(TZ_EINVAL,
                        "--resume %s: the checkpoint is at step %lld, past --steps %lld (which "
                        "counts from the training's start): give --steps above %lld to train on",
                        o->resume, (long long)r->res->start, (long long)o->steps,
                        (long long)r->res->start);
    if (r->res->start == o->steps && r->rank == 0)
      tz_log(TZ_LOG_WARN,
             "resume: %s is at step %lld, which --steps %lld asks for: nothing to train", o->resume,
             (long long)r->res->start, (long long)o->steps);
  }
  if (r->data) {
    struct tz_run_event ev = {.kind = TZ_RUN_DATA, .data = r->data};
    TZ_CHECK(emit(r, &ev));
  }
  TZ_CHECK(tz_run_check_outputs(r)); /* before the metrics file is opened: it may be a FIFO */
  if (r->rank == 0 && o->metrics)
    TZ_CHECK(open_metrics(r));
  tz_tier *tiers[3];
  tz_metrics_counters_take(tiers, tz_trainer_tiers(r->tr, tiers), &r->traffic);
  r->began = 1;
  TZ_CHECK(emit_kind(r, TZ_RUN_BEGIN, r->res->start));
  r->batch = (struct tz_run_batch){.data = r->data,
                                   .seed = (uint64_t)r->cfg->seed,
                                   .vocab = r->mc.vocab,
                                   .seq = o->seq,
                                   .micro = (int)r->cfg->train_micro_batch_size_per_gpu,
                                   .accum = (int)r->cfg->gradient_accumulation_steps,
                                   .rank = r->rank,
                                   .world = r->world};
  r->n = (int64_t)r->batch.accum * r->batch.micro * o->seq;
  r->tok = malloc(sizeof *r->tok * (size_t)r->n);
  r->tgt = malloc(sizeof *r->tgt * (size_t)r->n);
  r->pos = malloc(sizeof *r->pos * (size_t)r->n);
  if (!r->tok || !r->tgt || !r->pos)
    return tz_err_set(TZ_ENOMEM, "tz-train: no memory for a batch");
  r->fpt = tz_metrics_flops_per_token(&r->mc, o->seq, 0);
  /* MFU against the GPU's dense peak at the precision it computes in (bf16 unless fp16). */
  r->peak = tz_metrics_peak_flops(tz_trainer_device_name(r->tr),
                                  r->cfg->precision == TZ_PRECISION_FP16 ? TZ_PRECISION_FP16
                                                                         : TZ_PRECISION_BF16) *
            (double)r->world;
  tz_metrics_summary_init(&r->sum, r->fpt, r->peak);
  return 0;
}

/* The validation loss (the same batch every time), into *loss. */
static int evaluate(struct tz_run_state *r, float *loss) {
  struct tz_step_docs docs;
  TZ_CHECK(tz_run_fill_batch(&r->batch, 0, 1, r->tok, r->tgt, &docs, r->pos));
  return tz_trainer_eval(r->tr, r->tok, r->tgt, &docs, loss);
}

/* ---- A non-finite step ---- */

/* v (non-finite) as printed: "nan", "inf" or "-inf" (a NaN's sign means nothing). */
static const char *nonfinite_name(double v) { return isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"; }

/* After step `done` (1-based) whose loss or gradient norm is not finite and which the fp16 loss
 * scaler did not skip: the run ends here, before anything writes the state (its update is
 * pending folded, or already applied unfolded): no checkpoint, no export, the summary of the steps
 * taken with that step's own loss, and an error naming the step. Every rank sees the same
 * all-reduced loss and norm, so every rank stops after the same step. */
static int stop_nonfinite(struct tz_run_state *r, int64_t done, double loss, double norm) {
  char what[128], ckpt[1200];
  if (isfinite(loss))
    snprintf(what, sizeof what, "gradient norm is %s (loss %.6g)", nonfinite_name(norm), loss);
  else if (isfinite(norm))
    snprintf(what, sizeof what, "loss is %s (gradient norm %.6g)", nonfinite_name(loss), norm);
  else
    snprintf(what, sizeof what, "loss is %s (gradient norm %s)", nonfinite_name(loss),
             nonfinite_name(norm));
  tz_run_last_checkpoint(r, ckpt, sizeof ckpt);
  r->began = 0;
  TZ_CHECK(emit_kind(r, TZ_RUN_STEPS_END, done));
  TZ_CHECK(summarize(r));
  return tz_err_set(TZ_EINVAL,
                    "step %lld: %s: stopping; %s (a learning rate too high, or bad data or "
                    "weights, makes training diverge)",
                    (long long)done, what, ckpt);
}

/* 1 when the step's figures are finite or the fp16 loss scaler skipped it (its overflow is a
 * skipped update by design, not a divergence). */
static int step_finite(const struct tz_step_metrics *m) {
  return m->skipped || (isfinite(m->loss) && isfinite(m->grad_norm));
}

/* Step s (0-based): the step, its figures, its evaluation when due, and the events. */
static int step(struct tz_run_state *r, int64_t s) {
  const struct tz_run_options *o = r->o;
  struct tz_step_docs docs;
  TZ_CHECK(tz_run_fill_batch(&r->batch, s, 0, r->tok, r->tgt, &docs, r->pos));
  struct tz_step_result sr;
  TZ_CHECK(tz_trainer_step(r->tr, r->tok, r->tgt, &docs, &sr));
  if (s == r->res->start) {
    r->res->first_loss = sr.loss;
    tz_trainer_home_work(r->tr, &r->home0);
  }
  r->res->last_loss = sr.loss;
  r->res->steps_done = s + 1;
  r->elapsed += sr.step_s;
  struct tz_step_metrics m;
  tz_step_metrics_init(&m);
  m.step = s + 1;
  m.total_steps = o->steps;
  m.elapsed_s = r->elapsed;
  m.loss = sr.loss;
  m.lr = sr.lr;
  m.grad_norm = sr.grad_norm;
  m.tokens = (uint64_t)r->n * (uint64_t)r->world;
  if (r->data) /* samples read by every rank so far over the samples of an epoch */
    m.epoch = (double)(s + 1) * (double)r->batch.accum * r->batch.micro * r->world /
              (double)tz_data_n_samples(r->data, TZ_DATA_TRAIN);
  m.step_s = sr.step_s;
  m.bound_s = tz_trainer_plan(r->tr)->bound_s;
  m.stall_s = sr.stall_s;
  m.coll_s = sr.coll_s;
  m.skipped = sr.skipped;
  m.loss_scale = sr.loss_scale;
  if (tz_run_evaluates(o, m.step)) {
    float el;
    TZ_CHECK(evaluate(r, &el));
    m.has_eval = 1;
    m.eval_loss = el;
  }
  tz_metrics_derive(&m, r->fpt, r->peak);
  tz_tier *tiers[3];
  TZ_CHECK(tz_metrics_step_traffic(&m, tiers, tz_trainer_tiers(r->tr, tiers), &r->traffic));
  tz_metrics_summary_add(&r->sum, &m);
  struct tz_run_event ev = {.kind = TZ_RUN_STEP, .step = m.step, .metrics = &m};
  TZ_CHECK(emit(r, &ev));
  if (r->mw)
    TZ_CHECK(tz_metrics_write_step(r->mw, &m));
  if (r->mon)
    TZ_CHECK(monitor_write(r, &m));
  return step_finite(&m) ? 0 : stop_nonfinite(r, m.step, m.loss, m.grad_norm);
}

static int save(struct tz_run_state *r, int64_t done) {
  TZ_CHECK(tz_resume_save_with(r->tr, r->comm, r->cfg, r->o->ckpt_dir, (int)r->o->keep,
                               r->o->ckpt_options));
  r->res->saved = done;
  return emit_kind(r, TZ_RUN_CHECKPOINT, done);
}

/* The steps, each followed by the stop agreement: a request on any rank stops every rank after
 * the same step, with a checkpoint when there is a ckpt_dir. */
/* The stop watchdog's grace (trainer/run/signals.h): tierzero.stop_grace, or until a step has ended
 * 20 times the plan's bound, at least 120 s (600 s without a bound), then 3 times the longest
 * step so far, at least 60 s. */
static void set_grace(const struct tz_run_state *r, double longest_step_s) {
  double g = r->cfg->tierzero.stop_grace, bound = tz_trainer_plan(r->tr)->bound_s;
  if (g <= 0 && longest_step_s > 0)
    g = fmax(60.0, 3.0 * longest_step_s);
  else if (g <= 0)
    g = isfinite(bound) && bound > 0 ? fmax(120.0, 20.0 * bound) : 600.0;
  tz_signals_set_grace((unsigned)ceil(fmin(g, 86400.0)));
}

static int steps(struct tz_run_state *r) {
  const struct tz_run_options *o = r->o;
  double longest = 0;
  set_grace(r, 0);
  const char *hang = getenv("TZ_TEST_HANG_AFTER_STEP"); /* test hook: a step that never ends */
  for (int64_t s = r->res->start; s < o->steps; s++) {
    double t0 = tz_now_s();
    TZ_CHECK(step(r, s));
    if (hang && atoll(hang) == s + 1)
      for (;;)
        pause();
    tz_signals_progress();
    longest = fmax(longest, tz_now_s() - t0);
    set_grace(r, longest);
    int sig = 0;
    TZ_CHECK(tz_resume_stop_agree(r->comm, tz_signals_pending(), &sig));
    if (tz_run_saves(o, s + 1, sig))
      TZ_CHECK(save(r, s + 1));
    if (sig) {
      r->res->stopped = 1;
      r->res->stop_signal = sig;
      return o->ckpt_dir ? tz_err_set(TZ_ECANCELED,
                                      "stopped by %s after step %lld; checkpoint saved: resume "
                                      "with --resume %s",
                                      strsignal(sig), (long long)(s + 1), o->ckpt_dir)
                         : tz_err_set(TZ_ECANCELED,
                                      "stopped by %s after step %lld; nothing saved (no "
                                      "--ckpt-dir)",
                                      strsignal(sig), (long long)(s + 1));
    }
  }
  r->t_last = tz_now_s();
  return 0;
}

/* After the steps: the last checkpoint, an evaluation of a run without steps, the trace, the
 * export and the summary. */
static int finish(struct tz_run_state *r) {
  const struct tz_run_options *o = r->o;
  if (tz_run_saves_at_end(o, r->res->start, r->res->saved))
    TZ_CHECK(save(r, o->steps));
  if (o->eval_every && o->steps == 0) {
    struct tz_run_event ev = {.kind = TZ_RUN_EVAL};
    TZ_CHECK(evaluate(r, &ev.eval_loss));
    TZ_CHECK(emit(r, &ev));
  }
  /* Nothing reads the parameters from here on but an export (which applies the last update
   * itself): the last step's folded update is left pending rather than applied for nothing. */
  TZ_CHECK(tz_trainer_wait(r->tr));
  r->began = 0;
  TZ_CHECK(emit_kind(r, TZ_RUN_STEPS_END, r->res->steps_done));
  /* the export first: the trained model before anything optional */
  if (o->export_dir) {
    struct tz_hf_export_opts eo;
    tz_hf_export_opts_init(&eo);
    eo.dtype = o->export_dtype;
    eo.shard_bytes = o->export_shard_bytes;
    eo.tokenizer_dir = r->tokenizer_dir[0] ? r->tokenizer_dir : NULL;
    int rc = tz_export_write(r->tr, &r->mc, o->export_dir, &eo, r->rank);
    if (rc == 0 && getenv("TZ_TEST_EXPORT_FAILS")) /* test hook: an export that fails late */
      rc = tz_err_set(TZ_EIO, "--export-safetensors %s: failed (TZ_TEST_EXPORT_FAILS)",
                      o->export_dir);
    char what[4200];
    snprintf(what, sizeof what, "--export-safetensors %s", o->export_dir);
    rc = tz_run_rank0_agree(r, rc, what);
    if (rc < 0)
      return tz_run_export_failed(r, rc);
    TZ_CHECK(emit_kind(r, TZ_RUN_EXPORTED, tz_trainer_steps_done(r->tr)));
  }
  if (o->trace_path && r->rank == 0) {
    TZ_CHECK(tz_trainer_trace_write(r->tr, o->trace_path));
    TZ_CHECK(emit_kind(r, TZ_RUN_TRACE, o->trace_step));
  }
  if (o->steps > 0)
    TZ_CHECK(summarize(r));
  return 0;
}

int tz_run(const struct tz_run_options *o, const struct tz_config *cfg, tz_comm *comm,
           tz_runtime *rt, struct tz_run_result *res) {
  memset(res, 0, sizeof *res);
  res->saved = -1;
  struct tz_run_state r = {.o = o, .cfg = cfg, .comm = comm, .rt = rt, .res = res};
  r.rank = tz_comm_rank(comm);
  r.world = o->plan_world ? o->plan_world : tz_comm_size(comm);
  if (o->import_dir)
    TZ_CHECK(tz_hf_open(o->import_dir, &r.hm));
  /* The options the run reads: --epochs resolved into steps once the data is open. */
  struct tz_run_options oo = *o;
  int rc = tz_run_ckpt_claim(&r);
  if (rc == 0)
    rc = choose_model(&r);
  if (rc == 0 && (!o->plan_only || cfg->tierzero.epochs > 0)) /* a plan needs no data */
    rc = open_data(&r);
  if (rc == 0)
    rc = resolve_epochs(&r, &oo);
  r.o = &oo;
  if (rc == 0)
    rc = emit_kind(&r, TZ_RUN_MODEL, oo.steps);
  if (rc == 0)
    rc = plan(&r);
  if (rc == 0 && !o->plan_only) {
    rc = tz_run_ckpt_check(&r);
    if (rc == 0)
      rc = monitor_open(&r);
    if (rc == 0)
      rc = prepare(&r);
    if (rc == 0)
      rc = steps(&r);
    if (rc == 0)
      rc = finish(&r);
    if (r.began) /* a failure after the steps began */
      emit_kind(&r, TZ_RUN_STEPS_END, res->steps_done);
  }
  tz_metrics_writer_destroy(r.mw);
  tz_monitor_destroy(r.mon);
  tz_data_destroy(r.data);
  free(r.tok);
  free(r.pos);
  free(r.tgt);
  tz_trainer_destroy(r.tr);
  r.tr = NULL;
  /* What a run costs past its steps is part of its price (once, a pending update applied
   * through host copies kept llama-7b running minutes after its last step). */
  if (rc == 0 && r.t_last > 0) {
    struct tz_run_event ev = {.kind = TZ_RUN_ENDED, .tail_s = tz_now_s() - r.t_last};
    rc = emit(&r, &ev);
  }
  tz_hf_close(r.hm);
  tz_ckpt_release(r.lock);
  return rc;
}
