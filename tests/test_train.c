/* ZeRO-3 training on the scheduler, world of one, cpu backend:
 *  - against a direct reference (the whole-model runner, the same Adam, the same clipping), bit
 *    for bit;
 *  - placement invariance: offload none (every block used in place), cpu, nvme and a mixed plan,
 *    streaming what is homed outside the compute tier through a window of a quarter of the state,
 *    give the same bits;
 *  - folded and overlapped optimizer steps against unfolded ones, tied and untied: the same bits;
 *  - the plan: capacities respected, forced placements honoured, budgets below the minimum
 *    refused with the missing amount (the bound on made-up requests: test_plan_bound.c).
 * argv[1]: "plain", or "jitter" (random delays in the scheduler's lanes and the progress engine).
 */
#define _GNU_SOURCE
#include "collectives/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/plan.h"
#include "core/runtime.h"
#include "core/sched.h"
#include "kernels/adam.h"
#include "kernels/compute.h"
#include "testlib.h"
#include "train_cases.h"
#include "trainer/step/lr.h"
#include "trainer/model/model.h"
#include "trainer/data/synthetic.h"
#include "trainer/step/train.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int jitter_us;
static char *nvme_dir;

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "test_train: a test hung for 240 s (watchdog)\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(1);
}

static void run(const struct tc_opts *o, struct tc_result *r) {
  tc_run_single(o, jitter_us, nvme_dir, r);
}

/* ---- a direct reference: the runner, then the same segment norm, clipping and Adam ---- */

static void test_reference(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.accum = 1;
  o.steps = 3;
  o.mode = TZ_OPT_FOLDED;
  struct tc_result got;
  run(&o, &got);

  struct tz_model_config mc;
  tc_model(&mc);
  struct tz_config cfg;
  TZ_ASSERT_OK(tc_config(&cfg, &o, 1));
  tz_compute *cm;
  TZ_ASSERT_OK(tz_compute_create("cpu", NULL, &cm));
  void **params, **grads;
  TZ_ASSERT_OK(tz_model_blocks_alloc(cm, &mc, &params));
  TZ_ASSERT_OK(tz_model_blocks_alloc(cm, &mc, &grads));
  TZ_ASSERT_OK(tz_model_blocks_init(cm, &mc, 7, params));
  int nb = tz_model_n_blocks(&mc), N = o.micro * TC_SEQ;
  float *master[8], *m[8], *v[8], *seg = malloc(sizeof(float) * TZ_TRAIN_NORM_SEGMENT);
  float partial[256];
  for (int b = 0; b < nb; b++) {
    uint64_t n = tz_model_block_numel(&mc, b);
    master[b] = malloc(sizeof(float) * n);
    m[b] = calloc(n, sizeof(float));
    v[b] = calloc(n, sizeof(float));
    TZ_ASSERT_OK(tz_model_init_block(&mc, b, 7, 0, n, master[b]));
  }
  tz_model_runner *r;
  TZ_ASSERT_OK(tz_model_runner_create(cm, &mc, o.micro, TC_SEQ, 1, &r));
  int32_t tok[64 * TC_SEQ], tgt[64 * TC_SEQ];
  for (int s = 0; s < o.steps; s++) {
    for (int b = 0; b < nb; b++)
      memset(grads[b], 0, sizeof(float) * tz_model_block_numel(&mc, b));
    tz_synthetic_batch(7, tz_synthetic_first(s, 0, 0, 1, 1, o.micro), o.micro, TC_SEQ, mc.vocab,
                       tok, tgt);
    float loss;
    TZ_ASSERT_OK(tz_model_runner_step(r, params, grads, tok, tgt, 1.0f / (float)N, &loss));
    if (memcmp(&loss, &got.loss[s], sizeof loss) != 0)
      print_error("step %d: loss %.9g, reference %.9g\n", s, got.loss[s], loss);
    assert_memory_equal(&loss, &got.loss[s], sizeof loss);
    /* The norm: sums of squares of each block's segments, in block order, summed in the fixed
     * order of tz_compute_sum. */
    int np = 0;
    for (int b = 0; b < nb; b++) {
      uint64_t n = tz_model_block_numel(&mc, b);
      for (uint64_t off = 0; off < n; off += TZ_TRAIN_NORM_SEGMENT) {
        uint64_t len = n - off < TZ_TRAIN_NORM_SEGMENT ? n - off : TZ_TRAIN_NORM_SEGMENT;
        memset(seg, 0, sizeof(float) * TZ_TRAIN_NORM_SEGMENT);
        memcpy(seg, (float *)grads[b] + off, sizeof(float) * len);
        assert_true(np < 256);
        TZ_ASSERT_OK(tz_compute_sumsq(cm, &partial[np++], TZ_F32, seg, TZ_TRAIN_NORM_SEGMENT, 0));
      }
    }
    float sumsq;
    TZ_ASSERT_OK(tz_compute_sum(cm, &sumsq, TZ_F32, partial, (size_t)np, 0));
    double norm = sqrt((double)sumsq), coef = o.clip / (norm + 1e-6);
    assert_true(coef < 1.0); /* the test means clipping to happen */
    float fnorm = (float)norm;
    assert_memory_equal(&fnorm, &got.norm[s], sizeof fnorm);
    struct tz_adam_params ap = {.lr = (float)tz_lr_at(&cfg, s, o.steps),
                                .beta1 = (float)cfg.optimizer.betas[0],
                                .beta2 = (float)cfg.optimizer.betas[1],
                                .eps = (float)cfg.optimizer.eps,
                                .weight_decay = (float)cfg.optimizer.weight_decay,
                                .decoupled = cfg.optimizer.adam_w_mode,
                                .grad_scale = (float)coef};
    TZ_ASSERT_OK(tz_adam_params_for_step(&ap, s + 1));
    for (int b = 0; b < nb; b++)
      TZ_ASSERT_OK(tz_adam_cpu(&ap, master[b], m[b], v[b], grads[b], TZ_F32, params[b], TZ_F32,
                               tz_model_block_numel(&mc, b), NULL));
  }
  for (int b = 0; b < nb; b++) {
    uint64_t n = tz_model_block_numel(&mc, b);
    assert_memory_equal(master[b], got.master[b], sizeof(float) * n);
    assert_memory_equal(params[b], got.param[b], sizeof(float) * n);
    free(master[b]);
    free(m[b]);
    free(v[b]);
  }
  tz_model_runner_destroy(r);
  tz_model_blocks_free(cm, &mc, params);
  tz_model_blocks_free(cm, &mc, grads);
  tz_compute_destroy(cm);
  tz_config_free(&cfg);
  free(seg);
  tc_result_free(&got);
}

/* ---- placement invariance ---- */

static void test_placement(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  /* A window of a quarter of the state: the host run streams and evicts. */
  tc_check_placement(&o, jitter_us, nvme_dir, "");
}

/* The same with experts: each layer's attention and MLP are blocks of their own, streamed,
 * evicted and homed apart (the mixed plan puts a layer's two blocks in different tiers). */
static void test_placement_experts(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.experts = 1;
  tc_check_placement(&o, jitter_us, nvme_dir, "experts: ");
}

/* ---- where the optimizer step runs ---- */

static void test_folded(void **state) {
  (void)state;
  for (int untied = 0; untied < 2; untied++) {
    struct tc_opts o;
    tc_opts_init(&o);
    o.untied = untied;
    o.param_dev = "cpu";
    o.mode = TZ_OPT_UNFOLDED;
    struct tc_result unfolded, folded;
    run(&o, &unfolded);
    o.mode = TZ_OPT_FOLDED;
    run(&o, &folded);
    tc_expect_same(&unfolded, &folded, untied ? "folded, untied" : "folded");
    tc_result_free(&unfolded);
    tc_result_free(&folded);
  }
}

/* tierzero.cpu_adam: the CPU steps the last blocks' optimizer state at its homes (home phases),
 * the rest is stepped in the compute tier; every share gives the same bits, folded (clipping)
 * and overlapped (none). */
static void test_cpu_adam_share(void **state) {
  (void)state;
  for (int clip = 0; clip < 2; clip++) {
    struct tc_opts o;
    tc_opts_init(&o);
    o.clip = clip ? 0.05 : 0;
    o.param_dev = "cpu";
    o.opt_dev = "cpu";
    struct tc_result all, half, none;
    run(&o, &all); /* the default on a CPU-only machine: every block at home */
    o.cpu_adam = "0.5";
    run(&o, &half);
    o.cpu_adam = "0";
    run(&o, &none);
    tc_expect_same(&all, &half, clip ? "folded, half at home" : "overlapped, half at home");
    tc_expect_same(&all, &none, clip ? "folded, none at home" : "overlapped, none at home");
    assert_true(all.st.home_s > 0 && half.st.home_s > 0);
    assert_true(none.st.home_s == 0);
    /* Stepped at home, the state does not cross into the compute tier: less traffic. */
    assert_true(all.st.fill_bytes < half.st.fill_bytes && half.st.fill_bytes < none.st.fill_bytes);
    tc_result_free(&all);
    tc_result_free(&half);
    tc_result_free(&none);
  }
}

static void test_overlapped(void **state) {
  (void)state;
  for (int untied = 0; untied < 2; untied++) {
    struct tc_opts o;
    tc_opts_init(&o);
    o.untied = untied;
    o.clip = 0;
    o.opt_dev = "cpu";
    o.mode = TZ_OPT_UNFOLDED;
    struct tc_result unfolded, overlapped;
    run(&o, &unfolded);
    o.mode = TZ_OPT_AUTO; /* without clipping: overlapped */
    run(&o, &overlapped);
    tc_expect_same(&unfolded, &overlapped, untied ? "overlapped, untied" : "overlapped");
    tc_result_free(&unfolded);
    tc_result_free(&overlapped);
  }
}

/* ---- resume: the rank's shards saved after some steps and stored into a new trainer ---- */

struct saved {
  int nb;
  void *shard[16][TZ_PLAN_KINDS];
};

/* Steps [from, to) of the run of o on trainer tr; losses into loss[from..to). */
static void steps(tz_trainer *tr, const struct tc_opts *o, int from, int to, float *loss) {
  struct tz_model_config mc;
  tc_model(&mc);
  int n = o->accum * o->micro * TC_SEQ;
  int32_t *tok = malloc(sizeof *tok * (size_t)n), *tgt = malloc(sizeof *tgt * (size_t)n);
  for (int s = from; s < to; s++) {
    for (int k = 0; k < o->accum; k++)
      tz_synthetic_batch(7, tz_synthetic_first(s, k, 0, 1, o->accum, o->micro), o->micro, TC_SEQ,
                         mc.vocab, tok + k * o->micro * TC_SEQ, tgt + k * o->micro * TC_SEQ);
    struct tz_step_result r;
    TZ_ASSERT_OK(tz_trainer_step(tr, tok, tgt, NULL, &r));
    assert_int_equal(r.step, s);
    loss[s] = r.loss;
  }
  free(tok);
  free(tgt);
}

static tz_trainer *trainer(struct tc_world *w, const struct tc_opts *o, struct tz_config *cfg) {
  struct tz_model_config mc;
  tc_model(&mc);
  TZ_ASSERT_OK(tc_config(cfg, o, 1));
  struct tz_trainer_params tp;
  tz_trainer_params_init(&tp);
  tp.seq_len = TC_SEQ;
  tp.total_steps = o->steps;
  tp.opt_mode = o->mode;
  tz_trainer *tr;
  TZ_ASSERT_OK(tz_trainer_create(cfg, &mc, w->comm, w->rt, &tp, &tr));
  return tr;
}

/* tr's fp32 master weights (and with param its parameters) are want's, to the bit. */
static void expect_params(tz_trainer *tr, const struct tc_result *want, int param) {
  for (int b = 0; b < want->nb; b++) {
    float *m = malloc(sizeof(float) * want->numel[b]);
    TZ_ASSERT_OK(tz_trainer_param_load(tr, b, TZ_PLAN_MASTER, m));
    assert_memory_equal(m, want->master[b], sizeof(float) * want->numel[b]);
    if (param) {
      TZ_ASSERT_OK(tz_trainer_param_load(tr, b, TZ_PLAN_PARAM, m));
      assert_memory_equal(m, want->param[b], sizeof(float) * want->numel[b]);
    }
    free(m);
  }
}

static void test_resume(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.jitter_us = jitter_us;
  o.nvme_dir = nvme_dir;
  o.opt_dev = "nvme";
  struct tc_result whole;
  run(&o, &whole);
  struct tc_world w;
  tc_world_open(&w);
  struct tz_config cfg;
  float loss[TC_STEPS_MAX];
  tz_trainer *tr = trainer(&w, &o, &cfg);
  steps(tr, &o, 0, 3, loss);
  struct saved sv;
  sv.nb = whole.nb;
  for (int b = 0; b < sv.nb; b++)
    for (int k = 0; k < TZ_PLAN_STATE_KINDS; k++) {
      sv.shard[b][k] = malloc(tz_trainer_shard_bytes(tr, b, k));
      TZ_ASSERT_OK(tz_trainer_shard_load(tr, b, k, sv.shard[b][k]));
    }
  assert_int_equal(tz_trainer_steps_done(tr), 3);
  tz_trainer_destroy(tr);
  tz_config_free(&cfg);
  tr = trainer(&w, &o, &cfg);
  for (int b = 0; b < sv.nb; b++)
    for (int k = 0; k < TZ_PLAN_STATE_KINDS; k++) {
      TZ_ASSERT_OK(tz_trainer_shard_store(tr, b, k, sv.shard[b][k]));
      free(sv.shard[b][k]);
    }
  TZ_ASSERT_OK(tz_trainer_set_steps_done(tr, 3));
  steps(tr, &o, 3, o.steps, loss);
  assert_memory_equal(loss, whole.loss, sizeof(float) * (size_t)o.steps);
  expect_params(tr, &whole, 0);
  tz_trainer_destroy(tr);
  tz_config_free(&cfg);
  tc_world_close(&w);
  tc_result_free(&whole);
}

/* The end of a run that reads nothing after its last step: tz_trainer_wait leaves the folded
 * update pending (steps done cannot be set while one is), and a later sync applies it with the
 * same bits as a sync straight away (tc_run's). */
static void test_wait_leaves_update_pending(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.mode = TZ_OPT_FOLDED;
  o.param_dev = "cpu";
  struct tc_result whole;
  run(&o, &whole);
  struct tc_world w;
  tc_world_open(&w);
  struct tz_config cfg;
  float loss[TC_STEPS_MAX];
  tz_trainer *tr = trainer(&w, &o, &cfg);
  steps(tr, &o, 0, o.steps, loss);
  TZ_ASSERT_OK(tz_trainer_wait(tr));
  assert_int_equal(tz_trainer_set_steps_done(tr, o.steps), TZ_EINVAL);
  TZ_ASSERT_OK(tz_trainer_sync(tr));
  TZ_ASSERT_OK(tz_trainer_set_steps_done(tr, o.steps));
  expect_params(tr, &whole, 1);
  tz_trainer_destroy(tr);
  tz_config_free(&cfg);
  tc_world_close(&w);
  tc_result_free(&whole);
}

static void test_overlap_refused_with_clipping(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.mode = TZ_OPT_OVERLAPPED;
  struct tc_result r;
  int rc = tc_run(&o, w.comm, w.rt, &r);
  assert_int_equal(rc, TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "gradient_clipping"));
  tc_world_close(&w);
}

/* ---- the plan ---- */

static int make_plan_only(struct tc_world *w, const char *hbm, const char *host, int auto_place,
                          const char *pdev, const char *odev, tz_trainer **tr) {
  struct tc_opts o;
  tc_opts_init(&o);
  o.param_dev = pdev;
  o.opt_dev = odev;
  o.nvme_dir = nvme_dir;
  o.hbm_budget = hbm;
  o.host_budget = host;
  o.auto_placement = auto_place;
  o.recompute = "all"; /* these plans are about the state's homes, not about activations */
  struct tz_plan_rates rates = {.flops = 1e11,
                                .copy_in = 2e10,
                                .copy_out = 2e10,
                                .copy_local = 1e11,
                                .nvme_read = 3e9,
                                .nvme_write = 2e9,
                                .adam = 1e9};
  return tc_plan_only(&o, w, &rates, 0, tr);
}

/* measure_layer: the plan's compute rate is a layer's forward and backward timed on the backend,
 * not rates->flops (here absurdly fast, and Adam too: the compute lane would cost nothing). */
static void test_plan_layer_rate(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  struct tz_plan_rates rates = {.flops = 1e20, .copy_in = 2e10, .copy_out = 2e10, .adam = 1e20};
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
  assert_true(tz_trainer_layer_rate(tr) == 0);
  double matmul = tz_trainer_plan(tr)->compute_s;
  tz_trainer_destroy(tr);
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 1, &tr));
  double rate = tz_trainer_layer_rate(tr), measured = tz_trainer_plan(tr)->compute_s;
  assert_true(rate > 0 && rate < 1e15);
  assert_true(measured > 1000 * matmul);
  tz_trainer_destroy(tr);
  tc_world_close(&w);
}

/* tierzero.cpu_adam_search: the plan's pick of the share has a bound no larger than none and
 * all at the homes. Its default (auto) searches only beside a GPU (test_plan_cpu_split): on the
 * cpu backend the CPU steps everything, as before. */
static void test_cpu_adam_search(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.param_dev = "cpu";
  o.opt_dev = "cpu";
  struct tz_plan_rates rates = {.flops = 1e9, .copy_in = 2e9, .copy_out = 2e9, .adam = 1e8};
  const char *how[3] = {NULL, "0", "1"}; /* the search, then none and all at the homes */
  double bound[3], share[3];
  for (int i = 0; i < 3; i++) {
    o.cpu_adam_search = i == 0;
    o.cpu_adam = how[i];
    tz_trainer *tr = NULL;
    TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
    bound[i] = tz_trainer_plan(tr)->bound_s;
    share[i] = tz_trainer_cpu_adam(tr);
    assert_int_equal(tz_trainer_cpu_adam_searched(tr), i == 0);
    assert_false(tz_trainer_plan(tr)->unknown_rates);
    tz_trainer_destroy(tr);
  }
  o.cpu_adam_search = 0; /* auto */
  o.cpu_adam = NULL;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
  assert_false(tz_trainer_cpu_adam_searched(tr));
  assert_true(tz_trainer_cpu_adam(tr) == 1);
  tz_trainer_destroy(tr);
  assert_true(share[0] >= 0 && share[0] <= 1); /* a count of last blocks: test_plan_home */
  assert_true(share[1] == 0 && share[2] == 1);
  assert_true(bound[0] <= bound[1] && bound[0] <= bound[2]);
  tc_world_close(&w);
}

static void test_plan(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  tz_trainer *tr = NULL;
  /* Forced: every kind where the config puts it. */
  TZ_ASSERT_OK(make_plan_only(&w, NULL, NULL, 0, "cpu", "nvme", &tr));
  const struct tz_plan *p = tz_trainer_plan(tr);
  for (int g = 0; g < p->n_groups; g++) {
    assert_int_equal(p->tier[g * TZ_PLAN_KINDS + TZ_PLAN_PARAM], TZ_PLAN_HOST);
    assert_int_equal(p->tier[g * TZ_PLAN_KINDS + TZ_PLAN_MASTER], TZ_PLAN_NVME);
    assert_int_equal(p->tier[g * TZ_PLAN_KINDS + TZ_PLAN_M], TZ_PLAN_NVME);
    assert_int_equal(p->tier[g * TZ_PLAN_KINDS + TZ_PLAN_V], TZ_PLAN_NVME);
    assert_int_equal(p->tier[g * TZ_PLAN_KINDS + TZ_PLAN_GRAD], TZ_PLAN_HOST);
  }
  assert_true(p->bound_s > 0);
  assert_false(p->unknown_rates);
  double forced_bound = p->bound_s;
  uint64_t state_bytes = p->used[TZ_PLAN_HOST] + p->used[TZ_PLAN_NVME];
  uint64_t minw = p->min_window;
  tz_trainer_destroy(tr);
  /* The buffers of a plan that chooses every home (the forced one's also hold the sums of the
   * gradients it forces out of the compute tier, accumulated there). */
  TZ_ASSERT_OK(make_plan_only(&w, NULL, NULL, 1, "none", "none", &tr));
  uint64_t fixed = tz_trainer_plan(tr)->compute_fixed;
  tz_trainer_destroy(tr);

  /* Auto, with room in the compute tier for fixed buffers, half the state and the minimum window,
   * and host room for a quarter: every capacity holds, and some state stays in each tier. */
  char hbm[32], host[32];
  snprintf(hbm, sizeof hbm, "%llu", (unsigned long long)(fixed + state_bytes / 2 + minw));
  snprintf(host, sizeof host, "%llu", (unsigned long long)(state_bytes / 4));
  TZ_ASSERT_OK(make_plan_only(&w, hbm, host, 1, "none", "none", &tr));
  p = tz_trainer_plan(tr);
  for (int t = 0; t < TZ_PLAN_TIERS; t++)
    assert_true(p->used[t] <= p->capacity[t]);
  assert_true(p->compute_fixed + p->used[TZ_PLAN_COMPUTE] + p->window <=
              p->capacity[TZ_PLAN_COMPUTE]);
  assert_true(p->window >= p->min_window);
  assert_true(p->used[TZ_PLAN_COMPUTE] > 0 && p->used[TZ_PLAN_HOST] > 0 &&
              p->used[TZ_PLAN_NVME] > 0);
  /* Keeping state in faster tiers than the forced cpu/nvme plan never predicts a slower step. */
  assert_true(p->bound_s <= forced_bound);
  tz_trainer_destroy(tr);

  /* A budget below the minimum: refused, saying by how much. */
  snprintf(hbm, sizeof hbm, "%llu", (unsigned long long)(fixed + minw - 8192));
  int rc = make_plan_only(&w, hbm, NULL, 1, "none", "none", &tr);
  assert_int_equal(rc, TZ_ENOMEM);
  assert_null(tr);
  assert_non_null(strstr(tz_err_msg(), "8.0 KiB short"));
  /* Forced into a compute tier that cannot hold it: refused too. */
  snprintf(hbm, sizeof hbm, "%llu", (unsigned long long)(fixed + 2 * minw));
  rc = make_plan_only(&w, hbm, NULL, 0, "none", "none", &tr);
  assert_int_equal(rc, TZ_ENOMEM);
  assert_non_null(strstr(tz_err_msg(), "short"));
  tc_world_close(&w);
}

/* ---- tierzero.recompute ---- */

/* Every part recomputed, none, a list and the plan's choice give the same bits, with the state in
 * the compute tier and streamed from the host; keeping takes compute-tier memory in that order. */
static void test_recompute_modes(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.hbm_budget = "64MiB"; /* room to keep everything: auto keeps what lowers the bound */
  struct tz_plan_rates rates = {.flops = 1e9, .copy_in = 2e9, .copy_out = 2e9, .adam = 1e8};
  o.rates = &rates;
  tc_check_recompute(&o, jitter_us, nvme_dir, "");
}

/* The MLP in chunks of 5 tokens (32 rows a micro-batch: six of 5 and one of 2), where the trainer's
 * working activations hold one chunk of g and u, and the head in chunks of 7 (four of 7 and one of
 * 4): every recompute mode, and every placement, gives the bits of the others. */
static void test_mlp_chunks(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.mlp_chunk = 5;
  o.head_chunk = 7;
  o.hbm_budget = "64MiB";
  struct tz_plan_rates rates = {.flops = 1e9, .copy_in = 2e9, .copy_out = 2e9, .adam = 1e8};
  o.rates = &rates;
  tc_check_recompute(&o, jitter_us, nvme_dir, "chunks: ");
  tc_opts_init(&o);
  o.mlp_chunk = 5;
  o.head_chunk = 7;
  tc_check_placement(&o, jitter_us, nvme_dir, "chunks: ");
  /* the compute tier holds a chunk of g, u, a, da, dg and du where it held every row's (32 rows
   * of 160 floats each, 5 now; the buffers' sum is rounded to pages) */
  struct tc_result whole, chunked;
  o.recompute = "all";
  tc_run_single(&o, jitter_us, nvme_dir, &chunked);
  o.mlp_chunk = 0;
  tc_run_single(&o, jitter_us, nvme_dir, &whole);
  assert_true(chunked.compute_fixed + (uint64_t)6 * (32 - 5) * 160 * 4 - 8192 <=
              whole.compute_fixed);
  tc_result_free(&whole);
  tc_result_free(&chunked);
}

/* The plan's figure is what the run needs: recompute "none" trains with the compute tier's
 * budget at the plan's minimum (the buffers with every activation kept, the homes and the
 * smallest window), and a page less is refused naming the key; "auto" at that page less keeps
 * less and trains to the same bits. */
static void test_recompute_budget(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.recompute = "none";
  o.hbm_budget = "64MiB";
  struct tz_plan_rates rates = {.flops = 1e9, .copy_in = 2e9, .copy_out = 2e9, .adam = 1e8};
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
  const struct tz_plan *pl = tz_trainer_plan(tr);
  uint64_t need = pl->compute_fixed + pl->used[TZ_PLAN_COMPUTE] + pl->min_window;
  uint64_t kept_none = 0;
  char what[128];
  tz_trainer_recompute(tr, what, sizeof what, &kept_none, NULL);
  assert_string_equal(what, "none");
  assert_true(kept_none > 0);
  tz_trainer_destroy(tr);
  tc_world_close(&w);
  char exact[32], less[32];
  snprintf(exact, sizeof exact, "%llu", (unsigned long long)need);
  snprintf(less, sizeof less, "%llu", (unsigned long long)(need - 4096));
  o.hbm_budget = exact;
  struct tc_result none, all, autom;
  run(&o, &none);
  assert_int_equal(none.st.over_budget, 0);
  o.hbm_budget = less;
  tc_world_open(&w);
  assert_int_equal(tc_plan_only(&o, &w, &rates, 0, &tr), TZ_ENOMEM);
  assert_non_null(strstr(tz_err_msg(), "tierzero.recompute keeps"));
  o.recompute = "auto";
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
  uint64_t kept_auto = 0;
  tz_trainer_recompute(tr, what, sizeof what, &kept_auto, NULL);
  assert_true(kept_auto < kept_none);
  tz_trainer_destroy(tr);
  tc_world_close(&w);
  run(&o, &autom);
  o.recompute = "all";
  o.hbm_budget = NULL;
  run(&o, &all);
  tc_expect_same(&all, &none, "recompute none at the plan's minimum");
  tc_expect_same(&all, &autom, "recompute auto a page below it");
  tc_result_free(&none);
  tc_result_free(&all);
  tc_result_free(&autom);
}

/* With automatic placement, a compute budget too small for the layers' inputs beside the state
 * (forced into it here) homes some of them in host memory: the plan says so, the run copies them
 * out after the forward and back for the backward, and the bits are those of a run that keeps
 * them all in the compute tier. */
static void test_inputs_budget(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.auto_placement = 1;
  o.hbm_budget = "64MiB";
  o.recompute = "all"; /* else a smaller budget keeps fewer activations instead */
  struct tz_plan_rates rates = {.flops = 1e9, .copy_in = 2e9, .copy_out = 2e9, .adam = 1e8};
  o.rates = &rates;
  struct tz_model_config mc;
  tc_model(&mc);
  int nb = tz_model_n_blocks(&mc);
  int8_t tiers[16 * TZ_PLAN_KINDS];
  for (int i = 0; i < nb * TZ_PLAN_KINDS; i++)
    tiers[i] = (int8_t)(i % TZ_PLAN_KINDS == TZ_PLAN_ACT ? TZ_PLAN_AUTO : TZ_PLAN_COMPUTE);
  o.force_tiers = tiers;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
  const struct tz_plan *pl = tz_trainer_plan(tr);
  uint64_t inputs = pl->kind_bytes[TZ_PLAN_ACT][TZ_PLAN_COMPUTE];
  assert_true(inputs > 0); /* room for all: they stay */
  assert_int_equal(pl->kind_bytes[TZ_PLAN_ACT][TZ_PLAN_HOST], 0);
  uint64_t need = pl->compute_fixed + pl->used[TZ_PLAN_COMPUTE] + pl->min_window;
  tz_trainer_destroy(tr);
  char budget[32];
  snprintf(budget, sizeof budget, "%llu", (unsigned long long)(need - inputs / 2) / 4096 * 4096);
  o.hbm_budget = budget;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
  pl = tz_trainer_plan(tr);
  assert_true(pl->kind_bytes[TZ_PLAN_ACT][TZ_PLAN_HOST] > 0);
  assert_int_equal(pl->kind_bytes[TZ_PLAN_ACT][TZ_PLAN_HOST] +
                       pl->kind_bytes[TZ_PLAN_ACT][TZ_PLAN_COMPUTE],
                   inputs);
  tz_trainer_destroy(tr);
  tc_world_close(&w);
  struct tc_result out, in;
  run(&o, &out);
  assert_true(out.st.fills > 0);
  assert_int_equal(out.st.over_budget, 0);
  o.hbm_budget = NULL;
  o.auto_placement = 0;
  o.force_tiers = NULL;
  run(&o, &in);
  assert_int_equal(in.st.fills, 0);
  tc_expect_same(&in, &out, "layer inputs homed on the host by the plan");
  tc_result_free(&out);
  tc_result_free(&in);
}

/* DeepSpeed's activation_checkpointing.cpu_checkpointing homes every layer's input in host
 * memory, and tierzero.offload_activations, when given, wins over it. */
static void test_cpu_checkpointing(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.cpu_checkpointing = 1;
  const char *acts[] = {NULL, "none", "nvme"};
  const int want[] = {TZ_PLAN_HOST, TZ_PLAN_COMPUTE, TZ_PLAN_NVME};
  o.nvme_dir = nvme_dir;
  for (int i = 0; i < 3; i++) {
    o.act_dev = acts[i];
    tz_trainer *tr = NULL;
    TZ_ASSERT_OK(tc_plan_only(&o, &w, NULL, 0, &tr));
    const struct tz_plan *pl = tz_trainer_plan(tr);
    uint64_t inputs = 0;
    for (int b = 0; b < pl->n_groups; b++)
      inputs += (tz_trainer_act_bytes(tr, b) + 4095) / 4096 * 4096;
    assert_true(inputs > 0);
    assert_int_equal(pl->kind_bytes[TZ_PLAN_ACT][want[i]], inputs);
    tz_trainer_destroy(tr);
  }
  tc_world_close(&w);
}

/* "auto" predicts a bound no larger than recomputing all and than keeping all, and says what it
 * chose; with unknown rates it recomputes everything, as before. */
static void test_recompute_auto_bound(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.hbm_budget = "64MiB";
  struct tz_plan_rates rates = {.flops = 1e9, .copy_in = 2e9, .copy_out = 2e9, .adam = 1e8};
  const char *modes[3] = {"auto", "all", "none"};
  double bound[3], all_s = 0;
  char what[128];
  for (int m = 0; m < 3; m++) {
    o.recompute = modes[m];
    tz_trainer *tr = NULL;
    TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
    bound[m] = tz_trainer_plan(tr)->bound_s;
    tz_trainer_recompute(tr, what, sizeof what, NULL, m == 0 ? &all_s : NULL);
    if (m == 0)
      assert_string_equal(what, "none"); /* the room holds everything: keeping all is least */
    tz_trainer_destroy(tr);
  }
  assert_true(bound[0] <= bound[1] && bound[0] <= bound[2]);
  assert_true(bound[0] < bound[1]);
  assert_true(all_s == bound[1]);
  struct tz_plan_rates none = {0};
  o.recompute = NULL; /* the default is auto */
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &none, 0, &tr));
  tz_trainer_recompute(tr, what, sizeof what, NULL, NULL);
  assert_string_equal(what, "all");
  tz_trainer_destroy(tr);
  tc_world_close(&w);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "jitter") == 0)
    jitter_us = 200;
  signal(SIGALRM, watchdog);
  alarm(240);
  nvme_dir = tz_test_mkdtemp("train");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_layer_rate),
      cmocka_unit_test(test_cpu_adam_search),
      cmocka_unit_test(test_plan),
      cmocka_unit_test(test_reference),
      cmocka_unit_test(test_placement),
      cmocka_unit_test(test_placement_experts),
      cmocka_unit_test(test_folded),
      cmocka_unit_test(test_cpu_adam_share),
      cmocka_unit_test(test_overlapped),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_wait_leaves_update_pending),
      cmocka_unit_test(test_overlap_refused_with_clipping),
      cmocka_unit_test(test_recompute_modes),
      cmocka_unit_test(test_mlp_chunks),
      cmocka_unit_test(test_recompute_budget),
      cmocka_unit_test(test_inputs_budget),
      cmocka_unit_test(test_cpu_checkpointing),
      cmocka_unit_test(test_recompute_auto_bound),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(nvme_dir);
  return rc;
}
