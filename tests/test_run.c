/* The run loop (trainer/run/run.h), world of one, cpu backend, the tiny model on synthetic data:
 *  - the cadence rules: which steps evaluate and save for given every-N settings and a last step;
 *  - a run's events: evaluations after steps 2, 4 and 5, checkpoints after 2, 4 and 5 (the last),
 *    the export after the steps, a metrics line per step and a summary;
 *  - the homes' rate after the first step, in the summary and learned by the rates cache;
 *  - a stop request (SIGTERM) during step 2 stops the run after step 2 with a checkpoint there,
 *    and without ckpt_dir saves nothing; the error says so;
 *  - a resume continues at the checkpoint's step with the losses and exported parameters of a run
 *    that never stopped;
 *  - the batch of a step and rank, synthetic and from the built-in corpus;
 *  - the flags' values and rules, the backend choice, a plan-only run;
 *  - lr 1e30: the run stops at its first non-finite step with no checkpoint or export of it and
 *    that step's loss in the summary; fp16 overflow steps are skipped, not stopped; an import
 *    holding a NaN is refused before any step. */
#define _GNU_SOURCE
#include "collectives/launch.h"
#include "core/error.h"
#include "kernels/compute.h"
#include "run_once.h"
#include "testlib.h"
#include "trainer/data/data.h"
#include "trainer/model/hf.h"
#include "trainer/run/metrics.h"
#include "trainer/step/rates_cache.h"
#include "trainer/run/run.h"
#include "trainer/run/signals.h"
#include "trainer/data/synthetic.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *dir;

/* What a run told. */
struct rec {
  enum tz_run_event_kind kinds[128];
  int n;
  int64_t step[32]; /* each STEP's step, its evaluation and loss */
  int has_eval[32];
  float loss[32];
  float norm[32];
  int skipped[32];
  int n_steps;
  int n_summary;
  double summary_loss; /* the summary's last loss */
  double home_rate;    /* the summary's */
  int below_bound;     /* the summary's steps under their bound */
  int64_t ckpt[16];
  int n_ckpt;
  int64_t resumed, exported;
  int stop_at; /* raise SIGTERM in this step's event; 0 never */
};

static int record(void *arg, const struct tz_run_event *ev) {
  struct rec *r = arg;
  if (r->n < 128)
    r->kinds[r->n++] = ev->kind;
  if (ev->kind == TZ_RUN_STEP && r->n_steps < 32) {
    r->step[r->n_steps] = ev->metrics->step;
    r->has_eval[r->n_steps] = ev->metrics->has_eval;
    r->norm[r->n_steps] = (float)ev->metrics->grad_norm;
    r->skipped[r->n_steps] = ev->metrics->skipped;
    r->loss[r->n_steps++] = (float)ev->metrics->loss;
    if (ev->step == r->stop_at)
      raise(SIGTERM);
  }
  if (ev->kind == TZ_RUN_CHECKPOINT && r->n_ckpt < 16)
    r->ckpt[r->n_ckpt++] = ev->step;
  if (ev->kind == TZ_RUN_SUMMARY) {
    r->n_summary++;
    r->summary_loss = ev->summary->last_loss;
    r->home_rate = ev->home_rate;
    r->below_bound = tz_metrics_summary_below_bound(ev->summary);
  }
  if (ev->kind == TZ_RUN_RESUMED)
    r->resumed = ev->step;
  if (ev->kind == TZ_RUN_EXPORTED)
    r->exported = ev->step;
  return 0;
}

/* dir/name in a buffer of its own (one of eight, used in turn). */
static const char *at(const char *name) {
  static char bufs[8][1024];
  static int next;
  char *b = bufs[next++ % 8];
  snprintf(b, sizeof bufs[0], "%s/%s", dir, name);
  return b;
}

static void options(struct tz_run_options *o, struct rec *r, int64_t steps) {
  memset(r, 0, sizeof *r);
  r->resumed = r->exported = -1;
  tz_run_options_init(o);
  o->model = "tiny";
  o->data = "synthetic";
  o->seq = 16;
  o->steps = steps;
  o->rates = at("rates.json"); /* measured by the first run, read by the others */
  o->on_event = record;
  o->arg = r;
}

/* The learning rate of run() and the settings it adds (NULL-terminated), for one test at a
 * time. */
static const char *lr_set = "optimizer.params.lr=0.01", *extra_sets[3];

/* tz_run in a world of one, with the configuration tz-train would make from these options. */
static int run(struct tz_run_options *o, struct tz_run_result *res) {
  const char *sets[6] = {"train_micro_batch_size_per_gpu=2", "gradient_accumulation_steps=2",
                         lr_set};
  int n = 3;
  for (int i = 0; extra_sets[i]; i++)
    sets[n++] = extra_sets[i];
  return tz_test_run_once(o, sets, n, res);
}

static int count(const struct rec *r, enum tz_run_event_kind k) {
  int n = 0;
  for (int i = 0; i < r->n; i++)
    n += r->kinds[i] == k;
  return n;
}

static int first(const struct rec *r, enum tz_run_event_kind k) {
  for (int i = 0; i < r->n; i++)
    if (r->kinds[i] == k)
      return i;
  return -1;
}

/* The whole file into a malloc'ed buffer (*n bytes). */
static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc(*n + 1);
  assert_non_null(b);
  assert_int_equal(fread(b, 1, *n, f), *n);
  b[*n] = 0;
  fclose(f);
  return b;
}

static int same_file(const char *a, const char *b) {
  size_t na, nb;
  char *x = slurp(a, &na), *y = slurp(b, &nb);
  int same = na == nb && memcmp(x, y, na) == 0;
  free(x);
  free(y);
  return same;
}

static void test_cadence_rules(void **state) {
  (void)state;
  struct tz_run_options o;
  tz_run_options_init(&o);
  o.steps = 10;
  for (int64_t s = 1; s <= 10; s++)
    assert_int_equal(tz_run_evaluates(&o, s), 0); /* eval_every 0: never */
  o.eval_every = 3;
  static const int evals[11] = {0, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1}; /* 3, 6, 9 and the last */
  for (int64_t s = 1; s <= 10; s++)
    assert_int_equal(tz_run_evaluates(&o, s), evals[s]);
  o.save_every = 4;
  for (int64_t s = 1; s <= 10; s++) /* no ckpt_dir: never, not even on a stop */
    assert_int_equal(tz_run_saves(&o, s, 1) + tz_run_saves(&o, s, 0), 0);
  o.ckpt_dir = "ck";
  for (int64_t s = 1; s <= 10; s++) {
    assert_int_equal(tz_run_saves(&o, s, 0), s == 4 || s == 8);
    assert_int_equal(tz_run_saves(&o, s, SIGTERM), 1);
  }
  o.save_every = 0;
  for (int64_t s = 1; s <= 10; s++)
    assert_int_equal(tz_run_saves(&o, s, 0), 0);
  /* The end: saved unless the last step was, or no step was taken. */
  assert_int_equal(tz_run_saves_at_end(&o, 0, -1), 1);
  assert_int_equal(tz_run_saves_at_end(&o, 0, 8), 1);
  assert_int_equal(tz_run_saves_at_end(&o, 0, 10), 0);
  assert_int_equal(tz_run_saves_at_end(&o, 10, 10), 0); /* resumed at the end */
  o.steps = 0;
  assert_int_equal(tz_run_saves_at_end(&o, 0, -1), 0);
  o.ckpt_dir = NULL;
  o.steps = 10;
  assert_int_equal(tz_run_saves_at_end(&o, 0, -1), 0);
}

static void test_events(void **state) {
  (void)state;
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 5);
  o.eval_every = 2;
  o.save_every = 2;
  o.ckpt_dir = at("events-ck");
  o.metrics = at("events.jsonl");
  o.export_dir = at("events-export/a");
  struct tz_run_result res;
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(res.stopped, 0);
  assert_int_equal(res.steps_done, 5);
  assert_int_equal(res.saved, 5);
  assert_int_equal(r.n_steps, 5);
  static const int evals[5] = {0, 1, 0, 1, 1};
  for (int i = 0; i < 5; i++) {
    assert_int_equal(r.step[i], i + 1);
    assert_int_equal(r.has_eval[i], evals[i]);
  }
  assert_int_equal(r.n_ckpt, 3);
  assert_int_equal(r.ckpt[0], 2);
  assert_int_equal(r.ckpt[1], 4);
  assert_int_equal(r.ckpt[2], 5);
  assert_int_equal(access(at("events-ck/step-00000004/manifest"), F_OK), 0);
  /* The order: model, plan, begin, the steps, their end, the export, the summary, the end. */
  assert_int_equal(r.kinds[0], TZ_RUN_MODEL);
  assert_int_equal(r.kinds[1], TZ_RUN_PLANNED);
  assert_int_equal(r.kinds[2], TZ_RUN_BEGIN);
  assert_int_equal(count(&r, TZ_RUN_STEPS_END), 1);
  assert_true(first(&r, TZ_RUN_STEPS_END) > first(&r, TZ_RUN_CHECKPOINT));
  assert_true(first(&r, TZ_RUN_EXPORTED) > first(&r, TZ_RUN_STEPS_END));
  assert_true(first(&r, TZ_RUN_SUMMARY) > first(&r, TZ_RUN_EXPORTED));
  assert_int_equal(r.kinds[r.n - 1], TZ_RUN_ENDED);
  assert_int_equal(count(&r, TZ_RUN_EVAL), 0);
  assert_int_equal(r.exported, 5);
  tz_hf_model *hm = NULL;
  TZ_ASSERT_OK(tz_hf_open(at("events-export/a"), &hm));
  tz_hf_close(hm);
  size_t n;
  char *m = slurp(o.metrics, &n);
  int lines = 0;
  for (size_t i = 0; i < n; i++)
    lines += m[i] == '\n';
  assert_int_equal(lines, 7); /* the configuration, five steps and the summary */
  assert_non_null(strstr(m, "\"summary\""));
  free(m);
}

/* The rate the CPU's Adam reached at the homes after the first step (on a CPU-only machine every
 * block's Adam runs at its host homes) is the summary's and joins the rates cache's entry, which
 * the next plan reads; a run under its bound drops the entry instead (its rates were measured
 * slow). */
static void test_home_rate_learned(void **state) {
  (void)state;
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 4);
  o.rates = at("learn-rates.json");
  extra_sets[0] = "zero_optimization.offload_param.device=cpu";
  extra_sets[1] = "zero_optimization.offload_optimizer.device=cpu";
  struct tz_run_result res;
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(r.n_summary, 1);
  assert_true(r.home_rate > 0);
  struct tz_config cfg;
  tz_config_defaults(&cfg);
  struct tz_plan_rates rates;
  memset(&rates, 0, sizeof rates);
  char key[4200];
  tz_rates_cache_key(&cfg, "cpu", key, sizeof key);
  int cached = tz_rates_cache_read(o.rates, key, &rates);
  if (r.below_bound) {
    assert_false(cached);
  } else {
    assert_true(cached);
    assert_true(rates.adam_home_run == r.home_rate);
  }
  tz_config_free(&cfg);
  /* One step: no run of the home phases after the first step, nothing learned. */
  options(&o, &r, 1);
  o.rates = at("learn-one.json");
  TZ_ASSERT_OK(run(&o, &res));
  assert_true(r.home_rate == 0);
  extra_sets[0] = extra_sets[1] = NULL;
}

static void test_stop(void **state) {
  (void)state;
  TZ_ASSERT_OK(tz_signals_install());
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 6);
  o.ckpt_dir = at("stop-ck");
  o.save_every = 4;
  r.stop_at = 2;
  struct tz_run_result res;
  assert_int_equal(run(&o, &res), TZ_ECANCELED);
  assert_non_null(strstr(tz_err_msg(), "after step 2; checkpoint saved"));
  assert_int_equal(res.stopped, 1);
  assert_int_equal(res.stop_signal, SIGTERM);
  assert_int_equal(res.steps_done, 2);
  assert_int_equal(r.n_steps, 2); /* no step after the one the request came in */
  assert_int_equal(r.n_ckpt, 1);
  assert_int_equal(r.ckpt[0], 2);
  assert_int_equal(access(at("stop-ck/step-00000002/manifest"), F_OK), 0);
  assert_int_equal(count(&r, TZ_RUN_STEPS_END), 1);
  assert_int_equal(count(&r, TZ_RUN_SUMMARY) + count(&r, TZ_RUN_ENDED), 0);
  /* Without a checkpoint directory: stopped all the same, nothing saved. */
  TZ_ASSERT_OK(tz_signals_install());
  options(&o, &r, 6);
  r.stop_at = 3;
  assert_int_equal(run(&o, &res), TZ_ECANCELED);
  assert_non_null(strstr(tz_err_msg(), "after step 3; nothing saved"));
  assert_int_equal(res.steps_done, 3);
  assert_int_equal(r.n_ckpt, 0);
}

/* A request left pending (a failed assertion above) would stop the next test's runs. */
static int stop_teardown(void **state) {
  (void)state;
  tz_signals_clear();
  tz_signals_restore();
  return 0;
}

static void test_resume(void **state) {
  (void)state;
  struct tz_run_options o;
  struct rec straight, part, rest;
  struct tz_run_result res;
  options(&o, &straight, 4);
  o.export_dir = at("straight");
  TZ_ASSERT_OK(run(&o, &res));
  options(&o, &part, 2);
  o.ckpt_dir = at("resume-ck");
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(part.n_ckpt, 1);
  options(&o, &rest, 4);
  o.resume = at("resume-ck");
  o.export_dir = at("resumed");
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(res.start, 2);
  assert_int_equal(rest.resumed, 2);
  assert_int_equal(rest.n_steps, 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(rest.step[i], i + 3);
    assert_memory_equal(&rest.loss[i], &straight.loss[i + 2], sizeof(float));
  }
  /* A root resumed from keeps its saves: the end is saved there as step 4. */
  assert_int_equal(rest.n_ckpt, 1);
  assert_int_equal(rest.ckpt[0], 4);
  assert_int_equal(rest.exported, 4);
  assert_true(same_file(at("straight/model.safetensors"), at("resumed/model.safetensors")));
  /* The export is that of the trained parameters, not the initial ones. */
  options(&o, &part, 0);
  o.export_dir = at("initial");
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(part.exported, 0);
  assert_false(same_file(at("straight/model.safetensors"), at("initial/model.safetensors")));
}

static void test_fill_batch(void **state) {
  (void)state;
  enum { SEQ = 8, MICRO = 2, ACCUM = 3, N = SEQ * MICRO * ACCUM };
  struct tz_run_batch b = {
      .seed = 11, .vocab = 96, .seq = SEQ, .micro = MICRO, .accum = ACCUM, .rank = 1, .world = 2};
  int32_t tok[N], tgt[N], want_tok[SEQ * MICRO], want_tgt[SEQ * MICRO], val[N];
  TZ_ASSERT_OK(tz_run_fill_batch(&b, 5, 0, tok, tgt, NULL, NULL));
  for (int k = 0; k < ACCUM; k++) {
    tz_synthetic_batch(11, tz_synthetic_first(5, k, 1, 2, ACCUM, MICRO), MICRO, SEQ, 96, want_tok,
                       want_tgt);
    assert_memory_equal(tok + k * SEQ * MICRO, want_tok, sizeof want_tok);
    assert_memory_equal(tgt + k * SEQ * MICRO, want_tgt, sizeof want_tgt);
  }
  TZ_ASSERT_OK(tz_run_fill_batch(&b, 0, 1, val, tgt, NULL, NULL));
  tz_synthetic_batch(11, (1ull << 48) + tz_synthetic_first(0, 0, 1, 2, ACCUM, MICRO), MICRO, SEQ,
                     96, want_tok, want_tgt);
  assert_memory_equal(val, want_tok, sizeof want_tok);
  /* The built-in corpus: the windows tz_data_sample_index gives step 3 of rank 1. */
  struct tz_data_params dp = {.seq_len = SEQ, .seed = 11, .val_fraction = 0.05};
  tz_data *d = NULL;
  TZ_ASSERT_OK(tz_data_open(NULL, 256, &dp, &d));
  b.data = d;
  b.vocab = 256;
  TZ_ASSERT_OK(tz_run_fill_batch(&b, 3, 0, tok, tgt, NULL, NULL));
  for (int k = 0; k < ACCUM; k++) {
    TZ_ASSERT_OK(tz_data_batch_io(d, TZ_DATA_TRAIN, tz_data_sample_index(3, ACCUM, k, 2, 1, MICRO),
                                  MICRO, want_tok, want_tgt));
    assert_memory_equal(tok + k * SEQ * MICRO, want_tok, sizeof want_tok);
    assert_memory_equal(tgt + k * SEQ * MICRO, want_tgt, sizeof want_tgt);
  }
  TZ_ASSERT_OK(
      tz_run_fill_batch(&b, 1, 1, val, tgt, NULL, NULL)); /* the validation split's windows */
  TZ_ASSERT_OK(tz_data_batch_io(d, TZ_DATA_VAL, tz_data_sample_index(1, ACCUM, 1, 2, 1, MICRO),
                                MICRO, want_tok, want_tgt));
  assert_memory_equal(val + SEQ * MICRO, want_tok, sizeof want_tok);
  tz_data_destroy(d);
}

static void test_options(void **state) {
  (void)state;
  struct tz_run_options o;
  tz_run_options_init(&o);
  TZ_ASSERT_OK(tz_run_option_set(&o, "steps", "12"));
  TZ_ASSERT_OK(tz_run_option_set(&o, "seq", "32"));
  TZ_ASSERT_OK(tz_run_option_set(&o, "layer-rate", "446"));
  TZ_ASSERT_OK(tz_run_option_set(&o, "plan", NULL));
  TZ_ASSERT_OK(tz_run_option_set(&o, "export-dtype", "bf16"));
  assert_int_equal(o.steps, 12);
  assert_int_equal(o.seq, 32);
  assert_true(o.layer_rate == 446e12);
  assert_int_equal(o.plan_only, 1);
  assert_int_equal(o.export_dtype, TZ_BF16);
  assert_int_equal(tz_run_option_set(&o, "steps", "-1"), TZ_EINVAL);
  assert_string_equal(tz_err_msg(), "--steps: expected a non-negative integer, got '-1'");
  assert_int_equal(tz_run_option_set(&o, "seq", "0"), TZ_EINVAL);
  assert_int_equal(tz_run_option_set(&o, "world", "4097"), TZ_EINVAL);
  assert_int_equal(tz_run_option_set(&o, "nproc", "2"), TZ_EINVAL); /* not a run's */
  assert_int_equal(tz_run_option_is_switch("remeasure"), 1);
  assert_int_equal(tz_run_option_is_switch("keep"), 0);
  assert_int_equal(tz_run_option_is_switch("config"), -1);
  /* The rules between them. */
  tz_run_options_init(&o);
  o.trace_step = 2;
  assert_int_equal(tz_run_options_check(&o, 1), TZ_EINVAL);
  o.trace_path = "t.json";
  TZ_ASSERT_OK(tz_run_options_check(&o, 1));
  o.trace_step = 10; /* of 10 steps, numbered from 0 */
  assert_int_equal(tz_run_options_check(&o, 1), TZ_EINVAL);
  tz_run_options_init(&o);
  o.resume = "";
  assert_int_equal(tz_run_options_check(&o, 1), TZ_EINVAL);
  o.resume = "";
  o.ckpt_dir = "ck";
  TZ_ASSERT_OK(tz_run_options_check(&o, 1));
  assert_string_equal(o.resume, "ck");
  tz_run_options_init(&o);
  o.plan_world = 2;
  assert_int_equal(tz_run_options_check(&o, 1), TZ_EINVAL); /* not plan_only */
  o.plan_only = 1;
  TZ_ASSERT_OK(tz_run_options_check(&o, 1));
  assert_int_equal(tz_run_options_check(&o, 2), TZ_EINVAL);
  /* --val-data is evaluated on: it needs --eval-every. */
  tz_run_options_init(&o);
  TZ_ASSERT_OK(tz_run_option_set(&o, "val-data", "v.bin"));
  assert_int_equal(tz_run_options_check(&o, 1), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "--eval-every"));
  TZ_ASSERT_OK(tz_run_option_set(&o, "eval-every", "2"));
  TZ_ASSERT_OK(tz_run_options_check(&o, 1));
  /* --model: a preset or an existing path, else the presets named. */
  tz_run_options_init(&o);
  o.model = "no-such-model";
  assert_int_equal(tz_run_options_check(&o, 1), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "llama-7b"));
  assert_non_null(strstr(tz_err_msg(), "config.json"));
}

/* Exports: bf16 by default, f32 and fp16 asked for; shard sizes in save_pretrained's units. */
static void test_export_options(void **state) {
  (void)state;
  struct tz_run_options o;
  tz_run_options_init(&o);
  assert_int_equal(o.export_dtype, TZ_BF16);
  assert_true(o.export_shard_bytes == 5000000000ull);
  TZ_ASSERT_OK(tz_run_option_set(&o, "export-dtype", "fp16"));
  assert_int_equal(o.export_dtype, TZ_F16);
  TZ_ASSERT_OK(tz_run_option_set(&o, "export-dtype", "f32"));
  assert_int_equal(o.export_dtype, TZ_F32);
  assert_int_equal(tz_run_option_set(&o, "export-dtype", "f64"), TZ_EINVAL);
  assert_string_equal(tz_err_msg(), "--export-dtype: expected f32, bf16 or fp16, got 'f64'");
  static const struct {
    const char *text;
    uint64_t bytes;
  } sizes[] = {{"5GB", 5000000000ull},
               {"500MB", 500000000ull},
               {"2GiB", 2147483648ull},
               {"1.5kb", 1500},
               {"123", 123}};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    TZ_ASSERT_OK(tz_run_option_set(&o, "export-shard-size", sizes[i].text));
    assert_true(o.export_shard_bytes == sizes[i].bytes);
  }
  const char *bad[] = {"0", "-5GB", "5XB", "GB", ""};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    assert_int_equal(tz_run_option_set(&o, "export-shard-size", bad[i]), TZ_EINVAL);
}

/* --model as a config.json: the file or its directory, the shape it says, initialised with its
 * initializer_range (0.02 when absent); a preset leaves the directory empty. */
static void test_model_config(void **state) {
  (void)state;
  struct tz_model_config mc;
  char where[4096];
  TZ_ASSERT_OK(tz_run_model("tiny", &mc, where, sizeof where));
  assert_string_equal(where, "");
  assert_true(mc.init_std == 0); /* the presets keep their own initialisation */
  assert_int_equal(mkdir(at("cfg"), 0755), 0);
  FILE *f = fopen(at("cfg/config.json"), "w");
  assert_non_null(f);
  fputs("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, "
        "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
        "\"vocab_size\": 300, \"initializer_range\": 0.05}",
        f);
  fclose(f);
  TZ_ASSERT_OK(tz_run_model(at("cfg"), &mc, where, sizeof where));
  assert_string_equal(where, at("cfg"));
  assert_int_equal(mc.n_layer, 3);
  assert_int_equal(mc.vocab, 300);
  assert_true(mc.init_std == 0.05);
  memset(&mc, 0, sizeof mc);
  TZ_ASSERT_OK(tz_run_model(at("cfg/config.json"), &mc, where, sizeof where));
  assert_string_equal(where, at("cfg"));
  assert_int_equal(mc.d_model, 64);
  f = fopen(at("cfg/config.json"), "w");
  assert_non_null(f);
  fputs("{\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 4, \"vocab_size\": 300}",
        f);
  fclose(f);
  TZ_ASSERT_OK(tz_run_model(at("cfg"), &mc, where, sizeof where));
  assert_true(mc.init_std == 0.02);
  assert_int_equal(tz_run_model(at("nothing"), &mc, where, sizeof where), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), at("nothing")));
}

/* A run on a config.json's shape: planned and trained like a preset. */
static void test_model_config_run(void **state) {
  (void)state;
  struct tz_run_options o;
  struct rec r;
  struct tz_run_result res;
  options(&o, &r, 2);
  o.model = at("cfg");
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(r.n_steps, 2);
  options(&o, &r, 2);
  o.model = at("cfg/config.json");
  o.plan_only = 1;
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(r.n_steps, 0);
}

static void test_backend_choice(void **state) {
  (void)state;
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  assert_string_equal(tz_run_comm_backend(&bs), "single");
  bs.size = 2;
  bs.kind = TZ_LAUNCH_MPIRUN;
  assert_string_equal(tz_run_comm_backend(&bs), "mpi");
  bs.kind = TZ_LAUNCH_NPROC;
  assert_string_equal(tz_run_comm_backend(&bs), "nccl");
  assert_string_equal(tz_run_compute_backend("cuda", "mpi"), "cuda"); /* asked for: kept */
  assert_string_equal(tz_run_compute_backend("cpu", "nccl"), "cpu");
  assert_string_equal(tz_run_compute_backend("auto", "mpi"), "cpu"); /* mpi ranks: the CPU */
  char why[256];
  const char *gpu = tz_compute_probe("cuda", why, sizeof why) == 0 ? "cuda" : "cpu";
  assert_string_equal(tz_run_compute_backend(NULL, "single"), gpu);
}
/* lr 1e30 makes the tiny model's gradient non-finite within a few steps: the run stops at the
 * first such step with an error naming it, keeps no checkpoint or export of that step (the
 * earlier checkpoints stay), and its summary's last loss is that step's. */
static void test_nonfinite_step_stops(void **state) {
  (void)state;
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 8);
  o.ckpt_dir = at("nan-ck");
  o.save_every = 1;
  o.export_dir = at("nan-export");
  lr_set = "optimizer.params.lr=1e30";
  struct tz_run_result res;
  int rc = run(&o, &res);
  lr_set = "optimizer.params.lr=0.01";
  assert_int_not_equal(rc, 0);
  assert_true(r.n_steps >= 1 && r.n_steps < 8);
  int n = r.n_steps; /* the step that stopped it: the last, and the first non-finite one */
  for (int i = 0; i < n - 1; i++)
    assert_true(isfinite(r.loss[i]) && isfinite(r.norm[i]));
  assert_false(isfinite(r.loss[n - 1]) && isfinite(r.norm[n - 1]));
  char want[64];
  snprintf(want, sizeof want, "step %d: ", n);
  assert_non_null(strstr(tz_err_msg(), want));
  assert_non_null(strstr(tz_err_msg(), "stopping"));
  assert_int_equal(res.steps_done, n);
  assert_int_equal(res.saved, n - 1 > 0 ? n - 1 : -1);
  assert_int_equal(r.n_ckpt, n - 1);
  for (int i = 0; i < r.n_ckpt; i++)
    assert_true(r.ckpt[i] < n);
  char ck[64];
  snprintf(ck, sizeof ck, "nan-ck/step-%08d", n);
  assert_int_not_equal(access(at(ck), F_OK), 0);
  assert_int_equal(r.exported, -1);
  assert_int_not_equal(access(at("nan-export"), F_OK), 0);
  assert_int_equal(count(&r, TZ_RUN_ENDED), 0);
  /* The summary tells the last step's loss as it was, not an earlier finite one. */
  assert_int_equal(r.n_summary, 1);
  float last = (float)r.summary_loss;
  assert_memory_equal(&last, &r.loss[n - 1], sizeof last);
}

/* fp16 at an initial scale that overflows: those steps are skipped by the loss scaler, as
 * designed, and the run goes on to its end. */
static void test_fp16_overflow_skipped_not_stopped(void **state) {
  (void)state;
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 3);
  extra_sets[0] = "fp16.enabled=true";
  extra_sets[1] = "fp16.initial_scale_power=100";
  struct tz_run_result res;
  int rc = run(&o, &res);
  extra_sets[0] = extra_sets[1] = NULL;
  TZ_ASSERT_OK(rc);
  assert_int_equal(res.steps_done, 3);
  assert_int_equal(r.n_steps, 3);
  assert_true(r.skipped[0]);
  assert_false(isfinite(r.norm[0]));
  assert_int_equal(count(&r, TZ_RUN_ENDED), 1);
}

static int get_init_block(void *arg, int b, float *buf) {
  const struct tz_model_config *mc = arg;
  TZ_CHECK(tz_model_init_block(mc, b, 7, 0, tz_model_block_numel(mc, b), buf));
  if (b == 2) /* one NaN in the second layer's block */
    buf[tz_model_block_numel(mc, b) / 2] = NAN;
  return 0;
}

/* --import-safetensors of a checkpoint with a NaN in one tensor is refused before any step,
 * naming the tensor and the file. */
static void test_nonfinite_import_refused(void **state) {
  (void)state;
  struct tz_model_config mc;
  TZ_ASSERT_OK(tz_model_preset("tiny", &mc));
  struct tz_hf_export_opts eo;
  tz_hf_export_opts_init(&eo);
  eo.dtype = TZ_F32;
  TZ_ASSERT_OK(tz_hf_export(at("nan-import"), &mc, &eo, get_init_block, &mc));
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 3);
  o.model = NULL;
  o.import_dir = at("nan-import");
  o.ckpt_dir = at("nan-import-ck");
  struct tz_run_result res;
  assert_int_equal(run(&o, &res), TZ_EFORMAT);
  assert_non_null(strstr(tz_err_msg(), "nan-import/model.safetensors"));
  assert_non_null(strstr(tz_err_msg(), "model.layers.1."));
  assert_non_null(strstr(tz_err_msg(), "nan"));
  assert_int_equal(r.n_steps, 0);
  assert_int_equal(count(&r, TZ_RUN_BEGIN) + count(&r, TZ_RUN_IMPORTED), 0);
  assert_int_not_equal(access(at("nan-import-ck/latest"), F_OK), 0);
}

static void test_plan_only(void **state) {
  (void)state;
  struct tz_run_options o;
  struct rec r;
  options(&o, &r, 5);
  o.plan_only = 1;
  o.ckpt_dir = at("plan-ck");
  struct tz_run_result res;
  TZ_ASSERT_OK(run(&o, &res));
  assert_int_equal(r.n, 2);
  assert_int_equal(r.kinds[0], TZ_RUN_MODEL);
  assert_int_equal(r.kinds[1], TZ_RUN_PLANNED);
  assert_int_equal(res.steps_done, 0);
  assert_int_not_equal(access(at("plan-ck"), F_OK), 0);
}

int main(void) {
  dir = tz_test_mkdtemp("run");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cadence_rules),
      cmocka_unit_test(test_events),
      cmocka_unit_test(test_home_rate_learned),
      cmocka_unit_test_teardown(test_stop, stop_teardown),
      cmocka_unit_test(test_resume),
      cmocka_unit_test(test_fill_batch),
      cmocka_unit_test(test_options),
      cmocka_unit_test(test_export_options),
      cmocka_unit_test(test_model_config),
      cmocka_unit_test(test_model_config_run),
      cmocka_unit_test(test_backend_choice),
      cmocka_unit_test(test_plan_only),
      cmocka_unit_test(test_nonfinite_step_stops),
      cmocka_unit_test(test_fp16_overflow_skipped_not_stopped),
      cmocka_unit_test(test_nonfinite_import_refused),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
