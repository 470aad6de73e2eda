/* Training runs shared by test_train.c and tests/train_mpi: a small model, a config, and a run
 * that records every step's loss and every final parameter, so that two runs can be compared bit
 * for bit. */
#ifndef TZ_TEST_TRAIN_CASES_H
#define TZ_TEST_TRAIN_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/runtime.h"
#include "core/sched.h"
#include "testlib.h"
#include "trainer/data/data.h"
#include "trainer/model/model.h"
#include "trainer/data/synthetic.h"
#include "trainer/step/train.h"

#define TC_SEQ 16
#define TC_STEPS_MAX 24

/* A world of one: a runtime with small staging chunks and the "single" comm. */
struct tc_world {
  tz_runtime *rt;
  tz_comm *comm;
};

static inline void tc_world_open(struct tc_world *w) {
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.chunk_bytes = 64 << 10;
  rp.staging_bytes = 1 << 20;
  TZ_ASSERT_OK(tz_runtime_create(&rp, &w->rt));
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  struct tz_comm_params cp;
  tz_comm_params_init(&cp);
  cp.progress = tz_runtime_progress(w->rt);
  TZ_ASSERT_OK(tz_comm_create("single", &bs, &cp, &w->comm));
}

static inline void tc_world_close(struct tc_world *w) {
  tz_comm_destroy(w->comm);
  tz_runtime_destroy(w->rt);
}

/* Four layers, grouped-query attention, tied embeddings: every phase kind in a few milliseconds. */
static inline void tc_model(struct tz_model_config *m) {
  memset(m, 0, sizeof *m);
  m->d_model = 64;
  m->n_layer = 4;
  m->n_head = 4;
  m->n_kv_head = 2;
  m->ffn_dim = 160;
  m->vocab = 96;
  m->max_seq = 32;
  m->rope_theta = 10000.0;
  m->norm_eps = 1e-5;
  m->tie_embeddings = 1;
}

struct tc_opts {
  int micro, accum;      /* micro-batch per rank, accumulation steps */
  double clip;           /* gradient_clipping; 0 off */
  const char *param_dev; /* offload_param.device: "none", "cpu", "nvme" */
  const char *opt_dev;   /* offload_optimizer.device */
  const char *nvme_dir;  /* tierzero.nvme_path */
  int jitter_us;
  enum tz_opt_mode mode;
  const int8_t *force_tiers; /* a mixed plan */
  uint64_t window;           /* scheduler budget; 0 the trainer's default (a quarter) */
  uint64_t gpu_free;         /* tc_plan_only: a made-up GPU's free bytes; 0 the device's */
  double layer_rate;         /* tc_plan_only: the layer's rate given; 0 measured or unknown */
  int steps;
  int untied;
  const char *backend;  /* the compute backend: NULL (cpu) or "cuda" */
  int small_window;     /* the window: 1, the plan's minimum and a half (streams and evicts); 2,
                           the minimum itself */
  int fp16;             /* fp16.enabled, a dynamic loss scale from 2^12 */
  const char *cpu_adam; /* tierzero.cpu_adam; NULL the default */
  int cpu_adam_search;  /* tierzero.cpu_adam_search: 1 true, -1 false, 0 the default (auto) */
  int window_carry;     /* tierzero.window_carry: 1 true, -1 false, 0 the default (auto) */
  const char *hbm_budget, *host_budget; /* tierzero.hbm_budget, host_budget; NULL the default */
  int auto_placement;                   /* the plan chooses the homes */
  int overlap;                          /* tierzero.overlap_collectives */
  int no_overlap_comm;                  /* zero_optimization.overlap_comm false */
  /* tierzero.weight_decay_exclude ("bias:norm", ...); NULL "none": every tensor decays, as the
   * direct references of the cases compute it */
  const char *decay_exclude;
  const char *weight_decay; /* optimizer.params.weight_decay; NULL 0.1 */
  const char *lr;           /* optimizer.params.lr; NULL 0.01 */
  const char *recompute;    /* tierzero.recompute ("none", "0-1:3.mlp", ...); NULL the default */
  const struct tz_plan_rates *rates; /* the plan's rates; NULL none (the bound unknown) */
  const tz_data *data;   /* the batches: NULL synthetic sequences; else this data set's (seq_len
                            TC_SEQ), packed rows with their positions and targets */
  int mlp_chunk;         /* the model's mlp_chunk (tokens a chunk of the MLP); 0 auto (one chunk) */
  int head_chunk;        /* the model's head_chunk (tokens a chunk of the head); 0 auto (one) */
  const char *act_dev;   /* tierzero.offload_activations ("cpu", "nvme"); NULL the default */
  int cpu_checkpointing; /* activation_checkpointing.cpu_checkpointing true */
  int experts; /* the model's MLPs 4 experts, 2 a token, renormalised, the load-balancing loss on
                  (each layer then two blocks: docs/model.md, "Mixture of experts") */
};

/* The model of o: tc_model's, with experts where o asks. */
static inline void tc_model_of(const struct tc_opts *o, struct tz_model_config *m) {
  tc_model(m);
  m->mlp_chunk = o->mlp_chunk;
  m->head_chunk = o->head_chunk;
  if (o->untied)
    m->tie_embeddings = 0;
  if (o->experts) {
    m->n_expert = 4;
    m->n_expert_used = 2;
    m->moe_ffn_dim = 48;
    m->norm_topk = 1;
    m->router_aux_coef = 0.02;
    m->moe_aux = 1;
  }
}

static inline void tc_opts_init(struct tc_opts *o) {
  memset(o, 0, sizeof *o);
  o->micro = 2;
  o->accum = 2;
  o->clip = 0.05;
  o->param_dev = "none";
  o->opt_dev = "none";
  o->mode = TZ_OPT_AUTO;
  o->steps = 5;
}

/* What a run leaves: the loss of each step, the norm, and the master weights of every block. */
struct tc_result {
  int steps;
  float loss[TC_STEPS_MAX], norm[TC_STEPS_MAX];
  int nb;
  uint64_t numel[64];
  float *master[64], *param[64];
  struct tz_sched_stats st;
  uint64_t compute_fixed; /* the plan's trainer buffers in the compute tier */
  double coll_s;          /* the steps' tz_step_result.coll_s, summed */
  int carry;              /* tz_trainer_window_carry: the window carried copies across steps */
};

static inline void tc_result_free(struct tc_result *r) {
  for (int b = 0; b < r->nb; b++) {
    free(r->master[b]);
    free(r->param[b]);
  }
  memset(r, 0, sizeof *r);
}

static inline int tc_config(struct tz_config *c, const struct tc_opts *o, int world) {
  tz_config_defaults(c);
  char buf[64];
  snprintf(buf, sizeof buf, "%d", o->micro);
  TZ_CHECK(tz_config_set(c, "train_micro_batch_size_per_gpu", buf));
  snprintf(buf, sizeof buf, "%d", o->accum);
  TZ_CHECK(tz_config_set(c, "gradient_accumulation_steps", buf));
  snprintf(buf, sizeof buf, "%g", o->clip);
  TZ_CHECK(tz_config_set(c, "gradient_clipping", buf));
  TZ_CHECK(tz_config_set(c, "optimizer.params.lr", o->lr ? o->lr : "0.01"));
  TZ_CHECK(
      tz_config_set(c, "optimizer.params.weight_decay", o->weight_decay ? o->weight_decay : "0.1"));
  TZ_CHECK(tz_config_set(c, "tierzero.weight_decay_exclude",
                         o->decay_exclude ? o->decay_exclude : "none"));
  TZ_CHECK(tz_config_set(c, "zero_optimization.offload_param.device", o->param_dev));
  TZ_CHECK(tz_config_set(c, "zero_optimization.offload_optimizer.device", o->opt_dev));
  if (o->nvme_dir)
    TZ_CHECK(tz_config_set(c, "tierzero.nvme_path", o->nvme_dir));
  snprintf(buf, sizeof buf, "%d", o->jitter_us);
  TZ_CHECK(tz_config_set(c, "tierzero.jitter_us", buf));
  TZ_CHECK(tz_config_set(c, "seed", "7"));
  if (o->cpu_adam)
    TZ_CHECK(tz_config_set(c, "tierzero.cpu_adam", o->cpu_adam));
  if (o->window_carry)
    TZ_CHECK(tz_config_set(c, "tierzero.window_carry", o->window_carry > 0 ? "true" : "false"));
  if (o->cpu_adam_search)
    TZ_CHECK(
        tz_config_set(c, "tierzero.cpu_adam_search", o->cpu_adam_search > 0 ? "true" : "false"));
  /* Set either way: its default (auto) overlaps on GPUs, and the cases compare both. */
  TZ_CHECK(tz_config_set(c, "tierzero.overlap_collectives", o->overlap ? "true" : "false"));
  if (o->no_overlap_comm)
    TZ_CHECK(tz_config_set(c, "zero_optimization.overlap_comm", "false"));
  if (o->hbm_budget)
    TZ_CHECK(tz_config_set(c, "tierzero.hbm_budget", o->hbm_budget));
  if (o->host_budget)
    TZ_CHECK(tz_config_set(c, "tierzero.host_budget", o->host_budget));
  if (o->recompute)
    TZ_CHECK(tz_config_set(c, "tierzero.recompute", o->recompute));
  if (o->act_dev)
    TZ_CHECK(tz_config_set(c, "tierzero.offload_activations", o->act_dev));
  if (o->cpu_checkpointing)
    TZ_CHECK(tz_config_set(c, "activation_checkpointing.cpu_checkpointing", "true"));
  if (o->fp16) {
    TZ_CHECK(tz_config_set(c, "fp16.enabled", "true"));
    TZ_CHECK(tz_config_set(c, "fp16.initial_scale_power", "12"));
  }
  return tz_config_resolve_batch(c, world);
}

/* A trainer made for its plan only (tz_trainer_plan) from o's config and backend, with rates;
 * measure_layer as in tz_trainer_params. */
static inline int tc_plan_only(const struct tc_opts *o, const struct tc_world *w,
                               const struct tz_plan_rates *rates, int measure_layer,
                               tz_trainer **tr) {
  struct tz_model_config mc;
  tc_model_of(o, &mc);
  struct tz_config cfg;
  int rc = tc_config(&cfg, o, 1);
  if (rc == 0) {
    struct tz_trainer_params tp;
    tz_trainer_params_init(&tp);
    tp.seq_len = TC_SEQ;
    tp.plan_only = 1;
    tp.auto_placement = o->auto_placement;
    tp.force_tiers = o->force_tiers;
    tp.compute_backend = o->backend;
    tp.window = o->window;
    tp.gpu_free = o->gpu_free;
    tp.layer_rate = o->layer_rate;
    tp.rates = rates;
    tp.measure_layer = measure_layer;
    rc = tz_trainer_create(&cfg, &mc, w->comm, w->rt, &tp, tr);
  }
  tz_config_free(&cfg);
  return rc;
}

/* A made-up GPU's rates, for plans of GPU placement made without a device (tc_plan_gpu). */
static inline struct tz_plan_rates tc_gpu_rates(void) {
  return (struct tz_plan_rates){.flops = 2e12,
                                .copy_in = 2e9,
                                .copy_out = 2e9,
                                .copy_duplex = 3.6e9,
                                .copy_local = 1e11,
                                .adam = 2e10,
                                .adam_home = 5e8};
}

/* tc_plan_only for a made-up GPU with gpu_free bytes free (no device is touched), the layer at
 * rates->flops, in a world of its own. */
static inline int tc_plan_gpu(struct tc_opts *o, const struct tz_plan_rates *rates,
                              uint64_t gpu_free, tz_trainer **tr) {
  struct tc_world w;
  tc_world_open(&w);
  o->gpu_free = gpu_free;
  o->layer_rate = rates->flops;
  int rc = tc_plan_only(o, &w, rates, 0, tr);
  tc_world_close(&w);
  return rc;
}

/* Trains o->steps steps on comm's world and records the result (every rank gets the full
 * parameters). */
static inline int tc_run(const struct tc_opts *o, tz_comm *comm, tz_runtime *rt,
                         struct tc_result *res) {
  memset(res, 0, sizeof *res);
  struct tz_model_config mc;
  tc_model_of(o, &mc);
  int world = tz_comm_size(comm), rank = tz_comm_rank(comm);
  struct tz_config cfg;
  int rc = tc_config(&cfg, o, world);
  if (rc < 0) {
    tz_config_free(&cfg);
    return rc;
  }
  struct tz_trainer_params tp;
  tz_trainer_params_init(&tp);
  tp.seq_len = TC_SEQ;
  tp.total_steps = o->steps;
  tp.opt_mode = o->mode;
  tp.force_tiers = o->force_tiers;
  tp.auto_placement = o->auto_placement;
  tp.window = o->window;
  tp.compute_backend = o->backend;
  tp.rates = o->rates;
  tz_trainer *tr = NULL;
  int n = o->accum * o->micro * TC_SEQ;
  int32_t *tok = malloc(sizeof *tok * (size_t)n), *tgt = malloc(sizeof *tgt * (size_t)n);
  int32_t *pos = malloc(sizeof *pos * (size_t)n);
  if (!tok || !tgt || !pos) {
    rc = tz_err_set(TZ_ENOMEM, "test: no memory");
    goto out;
  }
  if (o->small_window) {
    tp.plan_only = 1;
    TZ_CHECK_GOTO(tz_trainer_create(&cfg, &mc, comm, rt, &tp, &tr), rc, out);
    uint64_t min = tz_trainer_plan(tr)->min_window;
    tz_trainer_destroy(tr);
    tr = NULL;
    tp.plan_only = 0;
    tp.window = o->small_window == 2 ? min : (min + min / 2 + 4095) / 4096 * 4096;
  }
  TZ_CHECK_GOTO(tz_trainer_create(&cfg, &mc, comm, rt, &tp, &tr), rc, out);
  for (int s = 0; s < o->steps; s++) {
    struct tz_step_docs docs = {0};
    for (int k = 0; k < o->accum; k++) {
      int o_k = k * o->micro * TC_SEQ;
      if (o->data) {
        uint64_t first = tz_data_sample_index((uint64_t)s, o->accum, k, world, rank, o->micro);
        TZ_CHECK_GOTO(tz_data_batch_docs(o->data, TZ_DATA_TRAIN, first, o->micro, tok + o_k,
                                         tgt + o_k, pos + o_k),
                      rc, out);
        continue;
      }
      uint64_t first = tz_synthetic_first(s, k, rank, world, o->accum, o->micro);
      tz_synthetic_batch(7, first, o->micro, TC_SEQ, mc.vocab, tok + o_k, tgt + o_k);
    }
    if (o->data) {
      uint64_t all = (uint64_t)o->accum * (uint64_t)world * (uint64_t)o->micro;
      docs.pos = pos;
      docs.targets = (int64_t)tz_data_targets(o->data, TZ_DATA_TRAIN, (uint64_t)s * all, all);
    }
    struct tz_step_result sr;
    TZ_CHECK_GOTO(tz_trainer_step(tr, tok, tgt, o->data ? &docs : NULL, &sr), rc, out);
    res->loss[s] = sr.loss;
    res->norm[s] = sr.grad_norm;
    res->coll_s += sr.coll_s;
    res->steps = s + 1;
  }
  TZ_CHECK_GOTO(tz_trainer_sync(tr), rc, out);
  res->nb = tz_model_n_blocks(&mc);
  for (int b = 0; b < res->nb; b++) {
    res->numel[b] = tz_model_block_numel(&mc, b);
    res->master[b] = malloc(sizeof(float) * res->numel[b]);
    res->param[b] = malloc(sizeof(float) * res->numel[b]);
    if (!res->master[b] || !res->param[b]) {
      rc = tz_err_set(TZ_ENOMEM, "test: no memory");
      goto out;
    }
    TZ_CHECK_GOTO(tz_trainer_param_load(tr, b, TZ_PLAN_MASTER, res->master[b]), rc, out);
    TZ_CHECK_GOTO(tz_trainer_param_load(tr, b, TZ_PLAN_PARAM, res->param[b]), rc, out);
  }
  tz_trainer_sched_stats(tr, &res->st);
  res->carry = tz_trainer_window_carry(tr);
  res->compute_fixed = tz_trainer_plan(tr)->compute_fixed;
out:
  tz_trainer_destroy(tr);
  tz_config_free(&cfg);
  free(tok);
  free(tgt);
  free(pos);
  return rc;
}

/* Fine-tuning data: a shard of TC_PACKED_TOKENS tokens and its mask (tools/tz-data's layout) in
 * dir, *path_out the shard's path (malloc'd): documents of 2 to 30 tokens below 93, the second
 * half of each a target, every seventh with none. */
#define TC_PACKED_TOKENS 900
static inline void tc_write_packed(const char *dir, char **path_out) {
  uint32_t tok[TC_PACKED_TOKENS];
  uint8_t m[TC_PACKED_TOKENS];
  uint64_t st = 21;
  int docs = 0;
  for (size_t k = 0; k < TC_PACKED_TOKENS; docs++) {
    size_t len = 2 + tz_test_rand(&st) % 29;
    if (len > TC_PACKED_TOKENS - k)
      len = TC_PACKED_TOKENS - k;
    for (size_t i = 0; i < len; i++) {
      tok[k + i] = 3 + (uint32_t)(tz_test_rand(&st) % 90);
      m[k + i] = i == 0                          ? TZ_DATA_MASK_START
                 : docs % 7 != 3 && i >= len / 2 ? TZ_DATA_MASK_TARGET
                                                 : 0;
    }
    k += len;
  }
  size_t plen = strlen(dir) + 32;
  char *p = malloc(plen);
  assert_non_null(p);
  snprintf(p, plen, "%s/chat_000.bin", dir);
  uint16_t t16[TC_PACKED_TOKENS];
  for (int i = 0; i < TC_PACKED_TOKENS; i++)
    t16[i] = (uint16_t)tok[i];
  int32_t hdr[TZ_DATA_SHARD_HEADER_INTS] = {TZ_DATA_SHARD_MAGIC, 1, TC_PACKED_TOKENS};
  FILE *f = fopen(p, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(hdr, sizeof hdr, 1, f), 1);
  assert_int_equal(fwrite(t16, sizeof t16, 1, f), 1);
  assert_int_equal(fclose(f), 0);
  tz_test_write_mask(p, tok, m, TC_PACKED_TOKENS);
  *path_out = p;
}

/* tc_write_packed's data in dir, opened for the cases (seq_len TC_SEQ, the model's vocabulary);
 * *path_out as there. */
static inline tz_data *tc_open_packed(const char *dir, char **path_out) {
  tc_write_packed(dir, path_out);
  struct tz_data_params dp = {.seq_len = TC_SEQ, .seed = 7};
  tz_data *d = NULL;
  TZ_ASSERT_OK(tz_data_open(*path_out, 96, &dp, &d));
  assert_true(tz_data_packed(d));
  return d;
}

/* Number of elements whose bits differ between the two runs' parameters, and whether the losses
 * differ in any bit. */
static inline uint64_t tc_diff(const struct tc_result *a, const struct tc_result *b,
                               int *loss_differs) {
  *loss_differs = a->steps != b->steps || memcmp(a->loss, b->loss, sizeof a->loss) != 0;
  uint64_t d = 0;
  for (int i = 0; i < a->nb && i < b->nb; i++)
    for (uint64_t e = 0; e < a->numel[i]; e++) {
      d += memcmp(&a->master[i][e], &b->master[i][e], sizeof(float)) != 0;
      d += memcmp(&a->param[i][e], &b->param[i][e], sizeof(float)) != 0;
    }
  return d + (uint64_t)(a->nb != b->nb);
}

/* o in a world of one with the given jitter and nvme directory; asserts that every step ran and
 * gave a finite, positive loss. */
static inline void tc_run_single(const struct tc_opts *o, int jitter_us, const char *nvme_dir,
                                 struct tc_result *r) {
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts oo = *o;
  oo.jitter_us = jitter_us;
  oo.nvme_dir = nvme_dir;
  TZ_ASSERT_OK(tc_run(&oo, w.comm, w.rt, r));
  tc_world_close(&w);
  assert_int_equal(r->steps, o->steps);
  for (int s = 0; s < r->steps; s++)
    assert_true(isfinite(r->loss[s]) && r->loss[s] > 0);
}

/* Asserts two runs gave the same bits, printing the losses and the count of differing elements
 * when not. */
static inline void tc_expect_same(const struct tc_result *a, const struct tc_result *b,
                                  const char *what) {
  int ld;
  uint64_t d = tc_diff(a, b, &ld);
  if (ld || d) {
    for (int s = 0; s < a->steps; s++)
      print_error("%s: step %d loss %.9g vs %.9g\n", what, s, a->loss[s], b->loss[s]);
    print_error("%s: %llu parameter elements differ\n", what, (unsigned long long)d);
  }
  assert_false(ld);
  assert_int_equal(d, 0);
}

/* Placement invariance from base (its offload devices "none"): every home in the compute tier
 * (every block used in place, nothing brought in or written back), then the layers' inputs alone
 * on the host and on nvme (written back after the forward, brought in for the backward),
 * parameters and optimizer state on the host (streamed in and evicted through the window), on
 * nvme, and a mixed plan: the same bits each time. what prefixes the messages. */
static inline void tc_check_placement(const struct tc_opts *base, int jitter_us,
                                      const char *nvme_dir, const char *what) {
  struct tc_opts o = *base;
  struct tc_result none, cpu, nvme, mixed;
  char msg[64];
  tc_run_single(&o, jitter_us, nvme_dir, &none);
  assert_int_equal(none.st.fills, 0);
  assert_int_equal(none.st.flushes, 0);
  assert_true(none.st.in_place > 0);
  assert_int_equal(none.st.over_budget, 0);
  static const char *const act_devs[] = {"cpu", "nvme"};
  for (int i = 0; i < 2; i++) {
    struct tc_result acts;
    o.act_dev = act_devs[i];
    o.small_window = 2; /* else the window holds them from the forward to the backward */
    tc_run_single(&o, jitter_us, nvme_dir, &acts);
    assert_true(acts.st.fills > 0);
    assert_true(acts.st.flushes > 0);
    assert_int_equal(acts.st.over_budget, 0);
    snprintf(msg, sizeof msg, "%slayer inputs on %s", what, act_devs[i]);
    tc_expect_same(&none, &acts, msg);
    tc_result_free(&acts);
  }
  o.act_dev = NULL;
  o.small_window = base->small_window;
  o.param_dev = "cpu";
  o.opt_dev = "cpu";
  tc_run_single(&o, jitter_us, nvme_dir, &cpu);
  assert_true(cpu.st.fills > 0);
  assert_true(cpu.st.evictions > 0);
  assert_int_equal(cpu.st.over_budget, 0);
  snprintf(msg, sizeof msg, "%soffload cpu", what);
  tc_expect_same(&none, &cpu, msg);
  o.param_dev = "nvme";
  o.opt_dev = "nvme";
  tc_run_single(&o, jitter_us, nvme_dir, &nvme);
  snprintf(msg, sizeof msg, "%soffload nvme", what);
  tc_expect_same(&none, &nvme, msg);
  struct tz_model_config mc;
  tc_model_of(&o, &mc);
  int nb = tz_model_n_blocks(&mc);
  int8_t tiers[16 * TZ_PLAN_KINDS];
  for (int i = 0; i < nb * TZ_PLAN_KINDS; i++)
    tiers[i] = (int8_t)((i * 7 / 3) % TZ_PLAN_TIERS);
  o.force_tiers = tiers;
  tc_run_single(&o, jitter_us, nvme_dir, &mixed);
  snprintf(msg, sizeof msg, "%smixed plan", what);
  tc_expect_same(&none, &mixed, msg);
  tc_result_free(&none);
  tc_result_free(&cpu);
  tc_result_free(&nvme);
  tc_result_free(&mixed);
}

/* tierzero.recompute from base (its offload devices "none", its rates and budget set): every
 * part recomputed, none, a list and "auto" give the same bits, with the state in the compute tier
 * and then streamed from the host; keeping takes compute-tier memory in that order, and auto
 * (which the base's room lets keep) more than "all". what prefixes the messages. */
static inline void tc_check_recompute(const struct tc_opts *base, int jitter_us,
                                      const char *nvme_dir, const char *what) {
  /* the last: every layer keeps its attention's output and nothing else, but layer 1 (whole) */
  const char *modes[] = {"all", "none", "0-1:3.mlp", "auto", "attn-proj:mlp:1"};
  enum { NM = sizeof modes / sizeof modes[0] };
  for (int host = 0; host < 2; host++) {
    struct tc_opts o = *base;
    if (host)
      o.param_dev = o.opt_dev = "cpu";
    struct tc_result r[NM];
    for (int m = 0; m < NM; m++) {
      o.recompute = modes[m];
      tc_run_single(&o, jitter_us, nvme_dir, &r[m]);
    }
    for (int m = 1; m < NM; m++) {
      char msg[96];
      snprintf(msg, sizeof msg, "%srecompute %s%s", what, modes[m], host ? ", offloaded" : "");
      tc_expect_same(&r[0], &r[m], msg);
    }
    assert_true(r[0].compute_fixed < r[2].compute_fixed);
    assert_true(r[2].compute_fixed < r[1].compute_fixed);
    assert_true(r[3].compute_fixed > r[0].compute_fixed);
    assert_true(r[0].compute_fixed < r[4].compute_fixed && r[4].compute_fixed < r[2].compute_fixed);
    for (int m = 0; m < NM; m++)
      tc_result_free(&r[m]);
  }
}

#endif
