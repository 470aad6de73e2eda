/* ZeRO-3 training on the scheduler, world of one, cpu backend:
 *  - against a direct reference (the whole-model runner, the same Adam, the same clipping), bit
 *    for bit;
 *  - placement invariance: offload none (every block used in place), cpu, nvme and a mixed plan,
 *    streaming what is homed outside the compute tier through a window of a quarter of the state,
 *    give the same bits;
 *  - folded and overlapped optimizer steps against unfolded ones, tied and untied: the same bits;
 *  - the plan: capacities respected, forced placements honoured, budgets below the minimum
 *    refused with the missing amount; the bound.
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
 * all at the homes. */
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
    assert_false(tz_trainer_plan(tr)->unknown_rates);
    tz_trainer_destroy(tr);
  }
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

/* The bound on a made-up machine: a phase waits for its inputs; slower tiers cost more. */
static void test_bound(void **state) {
  (void)state;
  uint64_t bytes[2][TZ_PLAN_KINDS] = {{1000000, 2000000, 2000000, 2000000, 2000000},
                                      {1000000, 2000000, 2000000, 2000000, 2000000}};
  struct tz_plan_phase ph[4];
  memset(ph, 0, sizeof ph);
  for (int i = 0; i < 2; i++) {
    snprintf(ph[i].name, sizeof ph[i].name, "fwd%d", i);
    ph[i].flop = 1e9;
    ph[i].n_uses = 1;
    ph[i].uses[0] = (struct tz_plan_use){i, TZ_PLAN_PARAM, 1};
    snprintf(ph[2 + i].name, sizeof ph[2 + i].name, "opt%d", i);
    ph[2 + i].adam_elems = 5e5;
    ph[2 + i].n_uses = 2;
    ph[2 + i].uses[0] = (struct tz_plan_use){i, TZ_PLAN_MASTER, 3};
    ph[2 + i].uses[1] = (struct tz_plan_use){i, TZ_PLAN_PARAM, 2};
  }
  struct tz_plan_request r;
  memset(&r, 0, sizeof r);
  r.n_groups = 2;
  r.bytes = (const uint64_t(*)[TZ_PLAN_KINDS])bytes;
  r.n_phases = 4;
  r.phases = ph;
  r.align = 4096;
  r.chunk = 4096;
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    r.force[k] = TZ_PLAN_AUTO;
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e9,
                                   .copy_out = 1e9,
                                   .copy_local = 1e11,
                                   .nvme_read = 1e8,
                                   .nvme_write = 1e8,
                                   .adam = 1e9};
  int8_t tiers[2 * TZ_PLAN_KINDS];
  struct tz_plan a, b, c;
  memset(tiers, TZ_PLAN_COMPUTE, sizeof tiers);
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 1 << 24, &a));
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 1 << 24, &b));
  memset(tiers, TZ_PLAN_NVME, sizeof tiers);
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 1 << 24, &c));
  /* Compute: 2 x 1 ms of forward, 2 x 0.5 ms of Adam = 3 ms; inputs in place cost 10-20 us. */
  assert_true(a.compute_s > 2.99e-3 && a.compute_s < 3.01e-3);
  assert_true(a.bound_s >= a.compute_s && a.bound_s < 3.2e-3);
  /* From host, through a window that holds every block: after the first step every read is a
   * hit, and the 6 MB written per step go out at 1 GB/s. */
  assert_true(b.bound_s > a.bound_s);
  assert_true(b.lane_s[0] == 0 && b.moved[TZ_PLAN_HOST] == 0);
  assert_true(b.lane_s[1] > 5.99e-3 && b.lane_s[1] < 6.01e-3);
  assert_true(b.bound_s >= b.lane_s[1]);
  /* The write-backs overlap the next step's compute: the out lane (6 ms) is the bound, not the
   * compute and the copies one after the other (9 ms). */
  assert_true(b.bound_s < b.lane_s[1] + 1e-6);
  /* From nvme: 60 ms of writes through the device, which is the bound. */
  assert_true(c.bound_s > b.bound_s);
  assert_true(c.bound_s >= c.lane_s[2] && c.bound_s < c.lane_s[2] + 1e-6);
  assert_true(c.lane_s[2] > 0.059 && c.lane_s[2] < 0.061);
  /* With no window to look ahead, every input waits for the phase before, and the window no
   * longer holds every block: some are read again every step. Slower still. */
  struct tz_plan d;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 4096 + 4 * 1024 * 1024, &d));
  assert_true(d.lookahead < c.lookahead);
  assert_true(d.moved[TZ_PLAN_NVME] > c.moved[TZ_PLAN_NVME]);
  assert_true(d.bound_s >= c.bound_s);
}

static void assert_close(double got, double want) {
  if (!(fabs(got - want) <= 1e-12 * fabs(want))) {
    fprintf(stderr, "got %.17g, want %.17g\n", got, want);
    fail();
  }
}

/* A plan request for the bound's tests: groups of blocks (bytes), one step's phases, 4 KiB
 * alignment, the scheduler's chunk, nothing forced. */
static struct tz_plan_request plan_request(int n_groups, const uint64_t (*bytes)[TZ_PLAN_KINDS],
                                           const struct tz_plan_phase *ph, int n_phases,
                                           uint64_t chunk) {
  struct tz_plan_request r;
  memset(&r, 0, sizeof r);
  r.n_groups = n_groups;
  r.bytes = bytes;
  r.n_phases = n_phases;
  r.phases = ph;
  r.align = 4096;
  r.chunk = chunk;
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    r.force[k] = TZ_PLAN_AUTO;
  return r;
}

/* A block the scheduler's window still holds costs no copy in: the bound and the bytes moved
 * follow the window's hits and misses (the scheduler's eviction rule: farthest next use first).
 * Blocks of 1 MiB at 1 ms a copy; 0.5 ms of compute per phase. */
static void test_plan_bound_counts_window_hits(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double t = 1e-3, c = 0.5e-3;
  uint64_t bytes[3][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_PARAM] = bytes[1][TZ_PLAN_PARAM] = bytes[2][TZ_PLAN_PARAM] = S;
  bytes[2][TZ_PLAN_MASTER] = S;
  /* Two micro-batches' forward over layers 0 and 1 (as gradient accumulation runs them), then a
   * phase that needs two blocks. */
  struct tz_plan_phase ph[5];
  memset(ph, 0, sizeof ph);
  const char *names[5] = {"fwd0.0", "fwd1.0", "fwd0.1", "fwd1.1", "head"};
  const int group[5] = {0, 1, 0, 1, 2};
  for (int i = 0; i < 5; i++) {
    snprintf(ph[i].name, sizeof ph[i].name, "%s", names[i]);
    ph[i].flop = 5e8;
    ph[i].n_uses = 1;
    ph[i].uses[0] = (struct tz_plan_use){group[i], TZ_PLAN_PARAM, TZ_ACCESS_READ};
  }
  ph[4].n_uses = 2;
  ph[4].uses[1] = (struct tz_plan_use){2, TZ_PLAN_MASTER, TZ_ACCESS_READ};
  struct tz_plan_request r = plan_request(3, bytes, ph, 4, chunk);
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e3 * (double)S,
                                   .copy_out = 1e3 * (double)S,
                                   .nvme_read = 1e3 * (double)S};
  int8_t tiers[3 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;

  /* The four forward phases, a window of one phase's working set: each layer evicts the other,
   * and every use is a miss. No phase can be prefetched beside another: each waits for the one
   * before, then for its copy. 4 x (t + c), as when every use was copied in. */
  r.n_phases = 4;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_int_equal(p.lookahead, 0);
  assert_close(p.bound_s, 4 * (t + c));
  assert_close(p.compute_s, 4 * c);
  assert_close(p.lane_s[0], 4 * t);
  assert_close(p.moved[TZ_PLAN_HOST], 4.0 * (double)S);

  /* A window that holds both layers: after the first step nothing is copied in, and the step is
   * its compute. The same from nvme: no read from the disk either. */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_close(p.bound_s, 4 * c);
  assert_true(p.lane_s[0] == 0 && p.lane_s[2] == 0 && p.moved[TZ_PLAN_HOST] == 0);
  memset(tiers, TZ_PLAN_NVME, sizeof tiers);
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_close(p.bound_s, 4 * c);
  assert_true(p.lane_s[0] == 0 && p.lane_s[2] == 0 && p.moved[TZ_PLAN_NVME] == 0);
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);

  /* With head, the same window (head's working set, the minimum): head evicts layer 1 (used
   * again later than layer 0), then layer 0, so each step reads both layers for the first
   * micro-batch and finds them there for the second. Lookahead: the three phases after fwd0.0
   * are prefetched one phase ahead, fwd0.0 and head none. The second step, from head's end in
   * the first (6 ms):
   *   fwd0.0 copy 6-7, compute 7-7.5;   fwd1.0 copy 7-8, compute 8-8.5;
   *   fwd0.1 and fwd1.1 hits, compute 8.5-9.5;   head copies 9.5-11.5, compute 11.5-12.
   * 6 ms with 4 MiB copied in, where copying every use in read 6 MiB and took 7 ms. */
  r.n_phases = 5;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_int_equal(p.lookahead, 0);
  assert_close(p.bound_s, 6e-3);
  assert_close(p.compute_s, 5 * c);
  assert_close(p.lane_s[0], 4 * t);
  assert_close(p.moved[TZ_PLAN_HOST], 4.0 * (double)S);

  /* A window below that minimum: head's second block cannot stay beside its first (it is copied
   * in and dropped), and every use is a miss: 4 x (t + c) + (2t + c). */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.bound_s, 4 * (t + c) + 2 * t + c);
  assert_close(p.lane_s[0], 6 * t);
  assert_close(p.moved[TZ_PLAN_HOST], 6.0 * (double)S);
}

/* A block written first takes room in the window but is not copied in; the written copy is
 * copied out and stays, so the next phase that reads it finds it there. */
static void test_plan_bound_keeps_written_copies(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double t = 1e-3, c = 0.5e-3;
  uint64_t bytes[1][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_GRAD] = S;
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  snprintf(ph[0].name, sizeof ph[0].name, "bwd0");
  ph[0].flop = 5e8;
  ph[0].n_uses = 1;
  ph[0].uses[0] = (struct tz_plan_use){0, TZ_PLAN_GRAD, TZ_ACCESS_WRITE};
  snprintf(ph[1].name, sizeof ph[1].name, "opt0");
  ph[1].adam_elems = 5e5;
  ph[1].n_uses = 1;
  ph[1].uses[0] = (struct tz_plan_use){0, TZ_PLAN_GRAD, TZ_ACCESS_READ};
  struct tz_plan_request r = plan_request(1, bytes, ph, 2, chunk);
  r.rates = (struct tz_plan_rates){
      .flops = 1e12, .copy_in = 1e3 * (double)S, .copy_out = 1e3 * (double)S, .adam = 1e9};
  int8_t tiers[TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;
  /* Each step: bwd0 computes, its copy goes out (t) while opt0 computes on the copy kept. Steps
   * repeat as fast as the slower of the compute path (2c) and the out lane (t): the write-back
   * of one step overlaps the next (the bound does not model the next bwd0 waiting to overwrite a
   * copy still being written back). */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_true(p.lane_s[0] == 0 && p.moved[TZ_PLAN_HOST] == 0);
  assert_close(p.lane_s[1], t);
  assert_close(p.compute_s, 2 * c);
  assert_close(p.bound_s, 2 * c > t ? 2 * c : t);
}

/* A copy in needs room in the window, and a dirty copy holds its room until it is written back:
 * p0 updates A (fill, compute, write-back), p1 reads B, and the window holds one of them. B's
 * copy in waits for A's write-back, so a step is three copies one after the other (3t), not
 * two with the write-back beside the second copy in (2t). */
static void test_plan_bound_copy_waits_for_room(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double t = 1e-3;
  uint64_t bytes[2][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_MASTER] = bytes[1][TZ_PLAN_PARAM] = S;
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  snprintf(ph[0].name, sizeof ph[0].name, "p0");
  ph[0].n_uses = 1;
  ph[0].uses[0] = (struct tz_plan_use){0, TZ_PLAN_MASTER, TZ_ACCESS_READWRITE};
  snprintf(ph[1].name, sizeof ph[1].name, "p1");
  ph[1].n_uses = 1;
  ph[1].uses[0] = (struct tz_plan_use){1, TZ_PLAN_PARAM, TZ_ACCESS_READ};
  struct tz_plan_request r = plan_request(2, bytes, ph, 2, chunk);
  r.rates = (struct tz_plan_rates){
      .flops = 1e12, .copy_in = 1e3 * (double)S, .copy_out = 1e3 * (double)S, .adam = 1e9};
  int8_t tiers[2 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_int_equal(p.lookahead, 0);
  assert_close(p.lane_s[0], 2 * t);
  assert_close(p.lane_s[1], t);
  assert_close(p.bound_s, 3 * t);
  /* With room for both, B comes in while A goes out, and A stays: one copy in a step, beside the
   * write-back (t). */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_close(p.bound_s, t);
}

/* The two phases of the disk tests below: p0 updates block 0's master of S bytes, p1 block 1's
 * (bytes and ph: the caller's, which the request points into). */
static struct tz_plan_request disk_plan(uint64_t S, uint64_t chunk,
                                        uint64_t bytes[2][TZ_PLAN_KINDS],
                                        struct tz_plan_phase ph[2]) {
  memset(bytes, 0, sizeof(uint64_t) * 2 * TZ_PLAN_KINDS);
  bytes[0][TZ_PLAN_MASTER] = bytes[1][TZ_PLAN_MASTER] = S;
  memset(ph, 0, sizeof *ph * 2);
  for (int i = 0; i < 2; i++) {
    snprintf(ph[i].name, sizeof ph[i].name, "p%d", i);
    ph[i].n_uses = 1;
    ph[i].uses[0] = (struct tz_plan_use){i, TZ_PLAN_MASTER, TZ_ACCESS_READWRITE};
  }
  return plan_request(2, bytes, ph, 2, chunk);
}

/* The disk reading and writing at once: the bytes the two directions share cost nvme_duplex
 * (their sum a second), the rest its own direction's rate; without nvme_duplex the two time-share
 * the disk at the one-way rates. p0 updates A, p1 updates B, both homed on nvme, and the window
 * holds one of them, so each step reads and writes both; reads of S take r, writes w, a read and
 * a write of S at once d. */
static void test_plan_bound_disk_duplex(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double r_s = 1e-3, w_s = 0.5e-3, d_s = 2e-3;
  uint64_t bytes[2][TZ_PLAN_KINDS];
  struct tz_plan_phase ph[2];
  struct tz_plan_request r = disk_plan(S, chunk, bytes, ph);
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e6 * (double)S,
                                   .copy_out = 1e6 * (double)S,
                                   .nvme_read = (double)S / r_s,
                                   .nvme_write = (double)S / w_s};
  int8_t tiers[2 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_NVME, sizeof tiers);
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_close(p.moved[TZ_PLAN_NVME], 2.0 * (double)S);
  assert_close(p.lane_s[2], 2 * (r_s + w_s));
  assert_true(p.bound_s >= 2 * (r_s + w_s) && p.bound_s < 2 * (r_s + w_s) + 1e-4);
  /* At once the disk moves less than time-sharing gives: 2d for the two reads and writes. */
  r.rates.nvme_duplex = 2.0 * (double)S / d_s;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * d_s);
  assert_close(p.bound_s, 2 * d_s);
  /* ... and where it moves more, time-sharing's figure stays: the lane is never faster. */
  r.rates.nvme_duplex = 2.0 * (double)S / (0.5 * (r_s + w_s));
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * (r_s + w_s));
  /* p1 only reads B: reads of 2S and a write of S, S each way at once (d), the second read
   * alone (r). */
  r.rates.nvme_duplex = 2.0 * (double)S / d_s;
  ph[1].uses[0].access = TZ_ACCESS_READ;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], d_s + r_s);
  assert_true(p.bound_s >= d_s + r_s);
  /* Reads only: nothing to share, 2r. */
  ph[0].uses[0].access = TZ_ACCESS_READ;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * r_s);
}

/* A run's disk rate (nvme_run) above the probe's scales the probe's disk rates up to it: the same
 * plan as test_plan_bound_disk_duplex's first, its lane 1.5 times faster with a run at 1.5 times
 * the probe's "at once" rate; one at or below the probe's changes nothing (the faster of the
 * two), and without nvme_duplex the slower direction is the probe's rate. */
static void test_plan_bound_disk_learned(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double r_s = 1e-3, w_s = 0.5e-3, d_s = 2e-3;
  uint64_t bytes[2][TZ_PLAN_KINDS];
  struct tz_plan_phase ph[2];
  struct tz_plan_request r = disk_plan(S, chunk, bytes, ph);
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e6 * (double)S,
                                   .copy_out = 1e6 * (double)S,
                                   .nvme_read = (double)S / r_s,
                                   .nvme_write = (double)S / w_s,
                                   .nvme_duplex = 2.0 * (double)S / d_s};
  int8_t tiers[2 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_NVME, sizeof tiers);
  struct tz_plan p;
  r.rates.nvme_run = 1.5 * r.rates.nvme_duplex;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * d_s / 1.5);
  assert_close(p.bound_s, 2 * d_s / 1.5);
  r.rates.nvme_run = 0.5 * r.rates.nvme_duplex; /* slower than the probe: the probe's */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * d_s);
  /* No "at once" rate: the probe's is the slower direction's (reads, S / r_s); a run at twice
   * it halves the time-shared lane. */
  r.rates.nvme_duplex = 0;
  r.rates.nvme_run = 2.0 * (double)S / r_s;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], (r_s + w_s));
  struct tz_plan_rates e = tz_plan_disk_rates(&r.rates);
  assert_close(e.nvme_read, 2.0 * (double)S / r_s);
  assert_close(e.nvme_write, 2.0 * (double)S / w_s);
  assert_true(e.flops == r.rates.flops && e.copy_in == r.rates.copy_in);
}

/* The host link moves less with both directions busy than each alone, and a window carries
 * only so much of a run of phases' copies across its ends. K = 12 phases p0..p11 update their
 * own block of S (read, write) with no compute, then bwd computes C = 10t with none; copies of S
 * take t each way alone; the window W holds two blocks and a chunk. Farthest next use keeps
 * blocks 0 and 11 across the step's end, so each step copies in the other ten and writes all
 * twelve back (the out lane busy 12t). p1's copy comes in during bwd; each later one follows the
 * write-back that frees its room, one t after another, and the last two write-backs run into
 * bwd: the lanes' path is C + 10t. The link term: the run
 * p0..p11 computes nothing, and of its 22S the window carries at most 2W across its ends; the
 * rest crosses while it runs, at most at the link's rate. */
static void test_plan_bound_link_both_ways(void **state) {
  (void)state;
  enum { K = 12 };
  const uint64_t S = 1 << 20, chunk = 4096, W = 2 * S + chunk;
  const double t = 1e-3, C = 10 * t;
  uint64_t bytes[K][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  struct tz_plan_phase ph[K + 1];
  memset(ph, 0, sizeof ph);
  for (int i = 0; i < K; i++) {
    bytes[i][TZ_PLAN_MASTER] = S;
    snprintf(ph[i].name, sizeof ph[i].name, "p%d", i);
    ph[i].n_uses = 1;
    ph[i].uses[0] = (struct tz_plan_use){i, TZ_PLAN_MASTER, TZ_ACCESS_READWRITE};
  }
  snprintf(ph[K].name, sizeof ph[K].name, "bwd");
  ph[K].flop = C * 1e12;
  struct tz_plan_request r = plan_request(K, bytes, ph, K + 1, chunk);
  r.rates =
      (struct tz_plan_rates){.flops = 1e12, .copy_in = (double)S / t, .copy_out = (double)S / t};
  int8_t tiers[K * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, W, &p));
  assert_false(p.unknown_rates);
  assert_close(p.moved[TZ_PLAN_HOST], (K - 2.0) * (double)S);
  assert_close(p.lane_s[1], K * t);
  assert_close(p.compute_s, C);
  double path = C + (K - 2) * t;
  assert_close(p.path_s, path);
  /* Nothing known of the two directions at once: each alone, less one window (the out lane's
   * 12S at S/t, less W), below the path. */
  assert_close(p.link_s, C + (K * (double)S - (double)W) * t / (double)S);
  assert_close(p.bound_s, path);
  /* Both at once at 1.2 S/t (0.6 each beside the other): (22S - 2W) / 1.2 is longer than the
   * path, and is the bound. */
  r.rates.copy_in_both = r.rates.copy_out_both = 0.6 * (double)S / t;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, W, &p));
  double link = C + ((2 * K - 2.0) * (double)S - 2.0 * (double)W) / (1.2 * (double)S / t);
  assert_close(p.path_s, path);
  assert_close(p.link_s, link);
  assert_close(p.bound_s, link);
  /* copy_duplex, where it is above the two beside each other summed, is the link's rate; and
   * where both at once move less than one direction alone, the link is that direction's (a
   * schedule could run the directions one after the other). */
  r.rates.copy_duplex = 1.5 * (double)S / t;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, W, &p));
  assert_close(p.link_s, C + ((2 * K - 2.0) * (double)S - 2.0 * (double)W) / (1.5 * (double)S / t));
  r.rates.copy_duplex = 0;
  r.rates.copy_in_both = r.rates.copy_out_both = 0.25 * (double)S / t;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, W, &p));
  assert_close(p.link_s, C + ((2 * K - 2.0) * (double)S - 2.0 * (double)W) / ((double)S / t));
  /* A window that holds every block: nothing is copied in after the first step, and the
   * write-backs go out beside bwd and the next forward. */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, K * S + chunk, &p));
  assert_true(p.moved[TZ_PLAN_HOST] == 0);
  assert_true(p.bound_s < path);
}

/* Collectives issued at a phase's start run beside its compute (coll_async): a phase takes the
 * longer of the two; in the phase (coll_bytes) they add to it. Two phases of compute c. */
static void test_plan_bound_overlapped_collectives(void **state) {
  (void)state;
  const uint64_t chunk = 4096;
  const double c = 1e-3, a = 0.5e-3, rate = 1e9;
  uint64_t bytes[1][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  for (int i = 0; i < 2; i++) {
    snprintf(ph[i].name, sizeof ph[i].name, "p%d", i);
    ph[i].flop = 1e12 * c;
    ph[i].coll_async = rate * a;
  }
  struct tz_plan_request r = plan_request(1, bytes, ph, 2, chunk);
  r.rates = (struct tz_plan_rates){.flops = 1e12, .collective = rate};
  int8_t tiers[TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_COMPUTE, sizeof tiers);
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, chunk, &p));
  assert_false(p.unknown_rates);
  assert_close(p.bound_s, 2 * c);
  for (int i = 0; i < 2; i++)
    ph[i].coll_async = rate * 3 * a;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, chunk, &p));
  assert_close(p.bound_s, 2 * 3 * a);
  for (int i = 0; i < 2; i++) {
    ph[i].coll_async = 0;
    ph[i].coll_bytes = rate * a;
  }
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, chunk, &p));
  assert_close(p.bound_s, 2 * (c + a));
}

/* A home phase (Adam on the CPU at the host homes) copies nothing; a phase reading what it wrote
 * copies it in after it ends, and it starts after the previous step's compute (a folded update
 * waits for the norm). opt0 at home (h), then fwd0 reading the new parameters (copy t, compute
 * c): each step is h + t + c; on its own lane the CPU's time is the home lane's, with
 * home_on_compute (a CPU-only machine) the compute lane's. */
static void test_plan_bound_home_phases(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double t = 1e-3, c = 0.5e-3, h = 2e-3;
  uint64_t bytes[1][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_PARAM] = S;
  bytes[0][TZ_PLAN_MASTER] = S;
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  snprintf(ph[0].name, sizeof ph[0].name, "opt0");
  ph[0].adam_elems = 1e6;
  ph[0].at_home = 1;
  ph[0].n_uses = 2;
  ph[0].uses[0] = (struct tz_plan_use){0, TZ_PLAN_MASTER, TZ_ACCESS_READ | TZ_ACCESS_WRITE};
  ph[0].uses[1] = (struct tz_plan_use){0, TZ_PLAN_PARAM, TZ_ACCESS_WRITE};
  snprintf(ph[1].name, sizeof ph[1].name, "fwd0");
  ph[1].flop = 5e8;
  ph[1].n_uses = 1;
  ph[1].uses[0] = (struct tz_plan_use){0, TZ_PLAN_PARAM, TZ_ACCESS_READ};
  struct tz_plan_request r = plan_request(1, bytes, ph, 2, chunk);
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e3 * (double)S,
                                   .copy_out = 1e3 * (double)S,
                                   .adam = 1e12,
                                   .adam_home = 5e8};
  int8_t tiers[TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;
  /* A window that holds both blocks: the parameters are read again all the same, being new. */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_close(p.bound_s, h + t + c);
  assert_close(p.lane_s[3], h);
  assert_close(p.compute_s, c);
  assert_close(p.lane_s[0], t);
  assert_true(p.lane_s[1] == 0);
  assert_close(p.moved[TZ_PLAN_HOST], (double)S); /* the parameters in; no master, no copy out */
  r.home_on_compute = 1;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_close(p.bound_s, h + t + c);
  assert_true(p.lane_s[3] == 0);
  assert_close(p.compute_s, h + c);
  /* The same phase on the compute lane: master comes in and both go out, Adam at its rate. */
  ph[0].at_home = 0;
  r.home_on_compute = 0;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_true(p.lane_s[3] == 0);
  assert_close(p.lane_s[1], 2 * t);
  assert_true(p.moved[TZ_PLAN_HOST] == 0); /* the window holds both from the first step */
}

/* A placement that only moves out of the compute tier what its capacity asks leaves the window
 * at its minimum, too small to prefetch the next block while the last streams: the plan moves
 * more out while that lowers the bound. Four phases, each reading its own 1 MiB block (1 ms of
 * compute, 2 ms to copy), room for two blocks and the least window: with two blocks out each
 * copy overlaps one phase (6 ms a step); with three out and a window of two blocks, the copies
 * overlap and the window keeps one of them (4 ms, the compute). */
static void test_plan_trades_homes_for_window(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  uint64_t bytes[4][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  struct tz_plan_phase ph[4];
  memset(ph, 0, sizeof ph);
  for (int g = 0; g < 4; g++) {
    bytes[g][TZ_PLAN_PARAM] = S;
    snprintf(ph[g].name, sizeof ph[g].name, "fwd%d", g);
    ph[g].flop = 1e9;
    ph[g].n_uses = 1;
    ph[g].uses[0] = (struct tz_plan_use){g, TZ_PLAN_PARAM, TZ_ACCESS_READ};
  }
  struct tz_plan_request r = plan_request(4, bytes, ph, 4, chunk);
  r.capacity[TZ_PLAN_COMPUTE] = 3 * S + chunk;
  r.capacity[TZ_PLAN_HOST] = 4 * S;
  r.rates = (struct tz_plan_rates){
      .flops = 1e12, .copy_in = 0.5e3 * (double)S, .copy_out = 1e3 * (double)S, .adam = 1e9};
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_make(&r, &p));
  double best_two = 0;
  for (int a = 0; a < 4; a++)
    for (int b = a + 1; b < 4; b++) {
      int8_t tiers[4 * TZ_PLAN_KINDS];
      memset(tiers, TZ_PLAN_COMPUTE, sizeof tiers);
      tiers[a * TZ_PLAN_KINDS + TZ_PLAN_PARAM] = TZ_PLAN_HOST;
      tiers[b * TZ_PLAN_KINDS + TZ_PLAN_PARAM] = TZ_PLAN_HOST;
      struct tz_plan q;
      TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &q));
      if (best_two == 0 || q.bound_s < best_two)
        best_two = q.bound_s;
    }
  assert_true(p.used[TZ_PLAN_HOST] > 2 * S && p.used[TZ_PLAN_HOST] <= r.capacity[TZ_PLAN_HOST]);
  assert_true(p.compute_fixed + p.used[TZ_PLAN_COMPUTE] + p.window <= r.capacity[TZ_PLAN_COMPUTE]);
  assert_true(p.bound_s < best_two * (1 - 1e-9));
  tz_plan_free(&p);
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
 * working activations hold one chunk of g and u: every recompute mode, and every placement, gives
 * the bits of the others. */
static void test_mlp_chunks(void **state) {
  (void)state;
  struct tc_opts o;
  tc_opts_init(&o);
  o.mlp_chunk = 5;
  o.hbm_budget = "64MiB";
  struct tz_plan_rates rates = {.flops = 1e9, .copy_in = 2e9, .copy_out = 2e9, .adam = 1e8};
  o.rates = &rates;
  tc_check_recompute(&o, jitter_us, nvme_dir, "chunks: ");
  tc_opts_init(&o);
  o.mlp_chunk = 5;
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
      cmocka_unit_test(test_bound),
      cmocka_unit_test(test_plan_layer_rate),
      cmocka_unit_test(test_cpu_adam_search),
      cmocka_unit_test(test_plan_bound_counts_window_hits),
      cmocka_unit_test(test_plan_bound_home_phases),
      cmocka_unit_test(test_plan_trades_homes_for_window),
      cmocka_unit_test(test_plan_bound_keeps_written_copies),
      cmocka_unit_test(test_plan_bound_copy_waits_for_room),
      cmocka_unit_test(test_plan_bound_disk_duplex),
      cmocka_unit_test(test_plan_bound_disk_learned),
      cmocka_unit_test(test_plan_bound_link_both_ways),
      cmocka_unit_test(test_plan_bound_overlapped_collectives),
      cmocka_unit_test(test_plan),
      cmocka_unit_test(test_reference),
      cmocka_unit_test(test_placement),
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
