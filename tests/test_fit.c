/* The plan's table of state per kind and tier, the state's sizes in a refusal, and `--plan --fit`
 * (trainer/run/fit.h): the bisection's answer holds and one more does not, on made-up machines. */
#define _GNU_SOURCE
#include "testlib.h"

#include "collectives/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/plan.h"
#include "core/runtime.h"
#include "trainer/run/fit.h"
#include "trainer/step/machine.h"
#include "trainer/model/model.h"
#include "trainer/step/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1ull << 20)
#define U TZ_MACHINE_UNKNOWN

static tz_runtime *rt;
static tz_comm *comm;
static char *nvme_dir;

static const struct tz_plan_rates rates = {.flops = 1e11,
                                           .copy_in = 2e10,
                                           .copy_out = 2e10,
                                           .nvme_read = 3e9,
                                           .nvme_write = 2e9,
                                           .adam = 1e9};

static struct tz_machine_facts machine(uint64_t mem) {
  return (struct tz_machine_facts){.mem_available = mem,
                                   .mem_total = U,
                                   .cgroup_max = U,
                                   .memlock = U,
                                   .nvme_free = U,
                                   .device_free = U,
                                   .device_total = U};
}

static void model(struct tz_model_config *m, int layers) {
  TZ_ASSERT_OK(tz_model_preset("tiny", m));
  m->n_layer = layers;
}

/* A config: micro-batch micro, the optimizer state on nvme (offload "nvme") or nowhere ("none"),
 * hbm an optional budget. */
static void config(struct tz_config *c, int micro, const char *offload, const char *hbm) {
  tz_config_defaults(c);
  char b[32];
  snprintf(b, sizeof b, "%d", micro);
  TZ_ASSERT_OK(tz_config_set(c, "train_micro_batch_size_per_gpu", b));
  TZ_ASSERT_OK(tz_config_set(c, "zero_optimization.offload_optimizer.device", offload));
  if (strcmp(offload, "none") != 0)
    TZ_ASSERT_OK(tz_config_set(c, "zero_optimization.offload_param.device", "cpu"));
  TZ_ASSERT_OK(tz_config_set(c, "tierzero.nvme_path", nvme_dir));
  if (hbm)
    TZ_ASSERT_OK(tz_config_set(c, "tierzero.hbm_budget", hbm));
  TZ_ASSERT_OK(tz_config_resolve_batch(c, 1));
}

static void params(struct tz_trainer_params *tp, const struct tz_machine_facts *f) {
  tz_trainer_params_init(tp);
  tp->seq_len = 32;
  tp->plan_only = 1;
  tp->rates = &rates;
  tp->machine = f;
}

static int make(int micro, int layers, int seq, const char *offload, const char *hbm,
                const struct tz_machine_facts *f, tz_trainer **tr) {
  struct tz_config c;
  config(&c, micro, offload, hbm);
  struct tz_model_config mc;
  model(&mc, layers);
  struct tz_trainer_params tp;
  params(&tp, f);
  tp.seq_len = seq;
  if (mc.max_seq < seq)
    mc.max_seq = seq;
  int rc = tz_trainer_create(&c, &mc, comm, rt, &tp, tr);
  tz_config_free(&c);
  return rc;
}

/* The table: each kind's bytes in each tier, the buffers split into activations and the rest, the
 * window, and totals that are the plan's. */
static void test_table(void **state) {
  (void)state;
  struct tz_machine_facts f = machine(64ull << 30);
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(make(2, 4, 32, "nvme", NULL, &f, &tr));
  const struct tz_plan *p = tz_trainer_plan(tr);
  uint64_t m = 0, param = 0;
  for (int b = 0; b < 6; b++) {
    m += (tz_trainer_shard_bytes(tr, b, TZ_PLAN_M) + 4095) / 4096 * 4096;
    param += (tz_trainer_shard_bytes(tr, b, TZ_PLAN_PARAM) + 4095) / 4096 * 4096;
  }
  assert_int_equal(p->kind_bytes[TZ_PLAN_M][TZ_PLAN_NVME], m);
  assert_int_equal(p->kind_bytes[TZ_PLAN_M][TZ_PLAN_COMPUTE], 0);
  assert_int_equal(p->kind_bytes[TZ_PLAN_PARAM][TZ_PLAN_HOST], param);
  for (int t = 0; t < TZ_PLAN_TIERS; t++) {
    uint64_t sum = 0;
    for (int k = 0; k < TZ_PLAN_KINDS; k++)
      sum += p->kind_bytes[k][t];
    assert_int_equal(sum, p->used[t]);
  }
  assert_true(p->compute_acts > 0 && p->compute_acts < p->compute_fixed);
  /* the layers' inputs, one per layer and the head's, where the config keeps them (the compute
   * tier: offload_activations auto without --auto-placement) */
  uint64_t inputs = 0;
  for (int b = 0; b < 6; b++)
    inputs += tz_trainer_act_bytes(tr, b);
  assert_int_equal(inputs, 5 * 2ull * 32 * (uint64_t)tz_trainer_model(tr)->d_model * 4);
  assert_int_equal(p->kind_bytes[TZ_PLAN_ACT][TZ_PLAN_COMPUTE], inputs);
  char *text = NULL;
  size_t len = 0;
  FILE *mf = open_memstream(&text, &len);
  tz_plan_print_table(mf, p, "  ");
  fclose(mf);
  static const char *const rows[] = {
      "  state ",        "  parameters ", "  gradients ",   "  master ", "  m ",    "  v ",
      "  layer inputs ", "  buffers ",    "  activations ", "  window ", "  total "};
  const char *at = text;
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    const char *r = strstr(at, rows[i]);
    if (!r)
      print_error("no row \"%s\" after: %s\n", rows[i], at);
    assert_non_null(r);
    at = r + 1;
  }
  free(text);
  tz_trainer_destroy(tr);
}

/* A plan refused says what the state needs in all, beside where it fell short. */
static void test_refusal_names_the_state(void **state) {
  (void)state;
  struct tz_machine_facts f = machine(64ull << 30);
  tz_trainer *tr = NULL;
  assert_int_equal(make(2, 4, 32, "none", "1MiB", &f, &tr), TZ_ENOMEM);
  const char *m = tz_err_msg();
  assert_non_null(strstr(m, "compute tier's budget of 1.00 MiB"));
  assert_non_null(strstr(m, "the state: parameters "));
  assert_non_null(strstr(m, " activations "));
  assert_non_null(strstr(m, "the layers' inputs "));
}

/* The answer holds, one more does not, and the refusal is that of one more; the bound is that of
 * the plan a run at the answer makes (the search's probes ask only whether a plan holds). */
static void check_fit(enum tz_fit_what what, const char *offload, const char *hbm,
                      const struct tz_machine_facts *f, int64_t at_least) {
  struct tz_config c;
  config(&c, 1, offload, hbm);
  struct tz_model_config mc;
  model(&mc, 4);
  struct tz_trainer_params tp;
  params(&tp, f);
  struct tz_fit_result r;
  TZ_ASSERT_OK(tz_fit(&c, &mc, comm, rt, &tp, what, &r));
  tz_config_free(&c);
  if (r.best < at_least || r.refused != r.best + 1)
    print_error("%s: best %lld, refused %lld: %s\n", tz_fit_name(what), (long long)r.best,
                (long long)r.refused, r.why);
  assert_true(r.best >= at_least);
  assert_int_equal(r.refused, r.best + 1);
  assert_true(r.bound_s > 0);
  assert_true(r.plans > 2);
  assert_non_null(strstr(r.why, "short") ? r.why : strstr(r.why, "more than this machine"));
  int micro = what == TZ_FIT_MICRO_BATCH ? (int)r.best : 1;
  int layers = what == TZ_FIT_LAYERS ? (int)r.best : 4;
  int seq = what == TZ_FIT_SEQ ? (int)r.best : 32;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(make(micro, layers, seq, offload, hbm, f, &tr));
  assert_true(tz_trainer_plan(tr)->bound_s == r.bound_s);
  tz_trainer_destroy(tr);
  tr = NULL;
  assert_int_equal(make(what == TZ_FIT_MICRO_BATCH ? micro + 1 : micro,
                        what == TZ_FIT_LAYERS ? layers + 1 : layers,
                        what == TZ_FIT_SEQ ? seq + 1 : seq, offload, hbm, f, &tr),
                   TZ_ENOMEM);
  assert_null(tr);
}

/* A --fit probe (holds_only) asks only whether a plan holds: tierzero.recompute "auto" stops at
 * its first plan, every part recomputed, where a run's plan keeps what its room allows; the same
 * plan holds or not either way. */
static void test_probe_holds_only(void **state) {
  (void)state;
  struct tz_machine_facts f = machine(64ull << 30);
  char what[2][128];
  for (int probe = 0; probe < 2; probe++) {
    struct tz_config c;
    config(&c, 2, "none", NULL);
    struct tz_model_config mc;
    model(&mc, 4);
    struct tz_trainer_params tp;
    params(&tp, &f);
    tp.holds_only = probe;
    tz_trainer *tr = NULL;
    TZ_ASSERT_OK(tz_trainer_create(&c, &mc, comm, rt, &tp, &tr));
    tz_config_free(&c);
    tz_trainer_recompute(tr, what[probe], sizeof what[probe], NULL, NULL);
    tz_trainer_destroy(tr);
  }
  assert_string_equal(what[0], "none"); /* a run's plan: room for every part */
  assert_string_equal(what[1], "all");
}

static void test_fit_micro_batch(void **state) {
  (void)state;
  /* Bounded by the compute budget (activations grow with the micro-batch)... */
  struct tz_machine_facts f = machine(64ull << 30);
  check_fit(TZ_FIT_MICRO_BATCH, "nvme", "24MiB", &f, 2);
  /* ... and by the machine's memory, everything in the compute tier. */
  f = machine(80 * MIB);
  check_fit(TZ_FIT_MICRO_BATCH, "none", NULL, &f, 2);
}

static void test_fit_layers(void **state) {
  (void)state;
  struct tz_machine_facts f = machine(96 * MIB);
  check_fit(TZ_FIT_LAYERS, "none", NULL, &f, 2);
}

/* The longest sequence: bounded by the compute budget with the state on nvme (activations grow
 * with it), and by the machine's memory with everything in the compute tier; past the model's
 * max_position_embeddings (the tiny preset's 256), which the answer reports. */
static void test_fit_seq(void **state) {
  (void)state;
  struct tz_machine_facts f = machine(64ull << 30);
  check_fit(TZ_FIT_SEQ, "nvme", "24MiB", &f, 64);
  f = machine(160 * MIB);
  check_fit(TZ_FIT_SEQ, "none", NULL, &f, 257);
}

/* Nothing holds: 0, with the refusal of 1. */
static void test_fit_none(void **state) {
  (void)state;
  struct tz_config c;
  config(&c, 1, "none", NULL);
  struct tz_model_config mc;
  model(&mc, 4);
  struct tz_machine_facts f = machine(1 * MIB);
  struct tz_trainer_params tp;
  params(&tp, &f);
  struct tz_fit_result r;
  TZ_ASSERT_OK(tz_fit(&c, &mc, comm, rt, &tp, TZ_FIT_MICRO_BATCH, &r));
  tz_config_free(&c);
  assert_int_equal(r.best, 0);
  assert_int_equal(r.refused, 1);
  assert_non_null(strstr(r.why, "more than this machine can give (1.00 MiB"));
  enum tz_fit_what w;
  assert_int_equal(tz_fit_parse("batch", &w), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "expected micro-batch, layers or seq"));
  TZ_ASSERT_OK(tz_fit_parse("seq", &w));
  assert_int_equal(w, TZ_FIT_SEQ);
}

int main(void) {
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.chunk_bytes = 64 << 10;
  rp.staging_bytes = 1 << 20;
  if (tz_runtime_create(&rp, &rt) < 0)
    tz_test_skip("no runtime: %s", tz_err_msg());
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  struct tz_comm_params cp;
  tz_comm_params_init(&cp);
  cp.progress = tz_runtime_progress(rt);
  if (tz_comm_create("single", &bs, &cp, &comm) < 0)
    tz_test_skip("no comm: %s", tz_err_msg());
  nvme_dir = tz_test_mkdtemp("fit");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table),
      cmocka_unit_test(test_refusal_names_the_state),
      cmocka_unit_test(test_probe_holds_only),
      cmocka_unit_test(test_fit_micro_batch),
      cmocka_unit_test(test_fit_layers),
      cmocka_unit_test(test_fit_seq),
      cmocka_unit_test(test_fit_none),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(nvme_dir);
  tz_comm_destroy(comm);
  tz_runtime_destroy(rt);
  return rc;
}
