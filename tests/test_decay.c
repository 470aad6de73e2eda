/* Per-tensor weight decay (trainer/step/decay.h, tierzero.weight_decay_exclude):
 *  - a shard crossing several tensors gets decay on exactly the elements of the tensors that are
 *    not excluded, checked element by element against a one-element Adam with that element's own
 *    decay, found from the tensor names alone;
 *  - every world size (shard boundaries inside tensors) gives the same bits;
 *  - the config key: the default, "none", a list, and a bad name refused naming key and value;
 *    the benchmark configs decay every tensor, as their PyTorch peers;
 *  - training (world of one, every placement): with the default, after one step the norm weights
 *    are those of a run without decay and every other tensor is that of a run decaying all. */
#define _GNU_SOURCE
#include "core/config.h"
#include "core/error.h"
#include "kernels/adam.h"
#include "testlib.h"
#include "train_cases.h"
#include "trainer/step/decay.h"
#include "trainer/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Excluded, by the tensor's name only (independent of decay.c's table). */
static int excluded_by_name(const char *name, unsigned ex) {
  size_t n = strlen(name);
  if (n >= 4 && strcmp(name + n - 4, "norm") == 0)
    return (ex & TZ_DECAY_NORM) != 0;
  if (n == 2 && name[0] == 'b')
    return (ex & TZ_DECAY_BIAS) != 0;
  if (strcmp(name, "wte") == 0 || strcmp(name, "lm_head") == 0)
    return (ex & TZ_DECAY_EMBED) != 0;
  return 0;
}

static void model(struct tz_model_config *m, int untied) {
  tc_model(m);
  m->tie_embeddings = !untied;
  m->qkv_bias = 1; /* their tensors are in the layout once the model has them */
  m->qk_norm = 1;
}

static struct tz_adam_params params(void) {
  struct tz_adam_params p = {.lr = 0.01f,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .decoupled = 1,
                             .grad_scale = 1.0f};
  assert_int_equal(tz_adam_params_for_step(&p, 1), 0);
  return p;
}

struct state {
  float *master, *m, *v, *grad;
};

static int adam_fn(void *ctx, const struct tz_adam_params *p, uint64_t off, uint64_t n) {
  struct state *s = ctx;
  struct tz_adam_cpu_opts o = {.threads = 2};
  return tz_adam_cpu(p, s->master + off, s->m + off, s->v + off, s->grad + off, TZ_F32, NULL,
                     TZ_F32, n, &o);
}

/* Block b's state, padded to `padded` elements: real tensors random, padding zero. */
static void fill(const struct tz_block_layout *l, uint64_t padded, struct state *s, uint64_t seed) {
  s->master = calloc(padded, sizeof(float));
  s->m = calloc(padded, sizeof(float));
  s->v = calloc(padded, sizeof(float));
  s->grad = calloc(padded, sizeof(float));
  assert_non_null(s->master && s->m && s->v && s->grad);
  for (int t = 0; t < l->n; t++) {
    const struct tz_param_info *ti = &l->t[t];
    for (uint64_t i = 0; i < ti->numel; i++) {
      uint64_t e = ti->offset + i, r = seed * 1000003u + e;
      s->master[e] = 0.5f + (float)((tz_test_rand(&r) >> 40) % 1000) / 1000.0f;
      s->grad[e] = ((float)((tz_test_rand(&r) >> 40) % 2001) - 1000.0f) / 1000.0f;
      s->m[e] = s->grad[e] * 0.1f;
      s->v[e] = s->grad[e] * s->grad[e] * 0.05f;
    }
  }
}

static void state_free(struct state *s) {
  free(s->master);
  free(s->m);
  free(s->v);
  free(s->grad);
}

/* Block b stepped by tz_decay_adam at world size W (each rank's shard one call) into out. */
static void step_sharded(const struct tz_model_config *mc, int b, unsigned ex, int W,
                         struct state *out) {
  struct tz_block_layout l;
  assert_int_equal(tz_model_block_layout(mc, b, &l), 0);
  uint64_t padded = tz_model_block_numel_padded(mc, b, W), shard = padded / (uint64_t)W;
  fill(&l, padded, out, (uint64_t)b + 1);
  struct tz_adam_params p = params();
  for (int r = 0; r < W; r++) {
    uint64_t off = (uint64_t)r * shard;
    struct state s = {out->master + off, out->m + off, out->v + off, out->grad + off};
    TZ_ASSERT_OK(tz_decay_adam(mc, b, ex, off, shard, &p, adam_fn, &s));
  }
}

static uint64_t check_block(const struct tz_model_config *mc, int b, unsigned ex) {
  struct tz_block_layout l;
  assert_int_equal(tz_model_block_layout(mc, b, &l), 0);
  struct state ref;
  uint64_t padded = tz_model_block_numel_padded(mc, b, 1), excluded = 0;
  fill(&l, padded, &ref, (uint64_t)b + 1);
  struct tz_adam_params p = params();
  /* the direct computation: each element alone, with its tensor's decay */
  for (int t = 0; t < l.n; t++) {
    const struct tz_param_info *ti = &l.t[t];
    struct tz_adam_params q = p;
    int ex_t = excluded_by_name(ti->name, ex);
    if (ex_t)
      q.weight_decay = 0;
    excluded += ex_t ? ti->numel : 0;
    for (uint64_t i = 0; i < ti->numel; i++) {
      uint64_t e = ti->offset + i;
      struct state s = {ref.master + e, ref.m + e, ref.v + e, ref.grad + e};
      TZ_ASSERT_OK(adam_fn(&s, &q, 0, 1));
    }
  }
  static const int worlds[] = {1, 2, 3, 4, 8, 13};
  for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
    struct state got;
    step_sharded(mc, b, ex, worlds[w], &got);
    uint64_t bad = 0;
    for (int t = 0; t < l.n; t++)
      for (uint64_t i = 0; i < l.t[t].numel; i++) {
        uint64_t e = l.t[t].offset + i;
        if (memcmp(&got.master[e], &ref.master[e], 4) || memcmp(&got.m[e], &ref.m[e], 4) ||
            memcmp(&got.v[e], &ref.v[e], 4)) {
          if (bad++ < 3)
            print_error("block %d world %d: %s[%llu] %.9g, the direct computation %.9g\n", b,
                        worlds[w], l.t[t].name, (unsigned long long)i, (double)got.master[e],
                        (double)ref.master[e]);
        }
      }
    /* padding stays zero */
    uint64_t n = tz_model_block_numel_padded(mc, b, worlds[w]);
    for (uint64_t e = l.numel; e < n; e++)
      bad += got.master[e] != 0.0f;
    assert_int_equal(bad, 0);
    state_free(&got);
  }
  state_free(&ref);
  return excluded;
}

static void test_elements(void **state) {
  (void)state;
  static const unsigned sets[] = {TZ_DECAY_DEFAULT, 0, TZ_DECAY_NORM, TZ_DECAY_EMBED,
                                  TZ_DECAY_BIAS | TZ_DECAY_NORM | TZ_DECAY_EMBED};
  for (int untied = 0; untied < 2; untied++) {
    struct tz_model_config mc;
    model(&mc, untied);
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
      uint64_t ex = 0;
      for (int b = 0; b < tz_model_n_blocks(&mc); b++)
        ex += check_block(&mc, b, sets[s]);
      /* something is excluded exactly when the set says so: the norms at least */
      assert_true((ex > 0) == (sets[s] != 0));
    }
  }
}

/* The runs of a layer shard: excluded norms make their own runs, neighbours merge. */
static void test_runs(void **state) {
  (void)state;
  struct tz_model_config mc;
  tc_model(&mc);
  struct tz_block_layout l;
  assert_int_equal(tz_model_block_layout(&mc, 1, &l), 0);
  struct tz_decay_run r[TZ_DECAY_MAX_RUNS];
  uint64_t n = tz_model_block_numel_padded(&mc, 1, 1);
  int nr = tz_decay_runs(&mc, 1, TZ_DECAY_DEFAULT, 0, n, r);
  assert_int_equal(nr, 4); /* attn_norm | wq..wo | mlp_norm | wg..wd */
  assert_int_equal(r[0].decay, 0);
  assert_int_equal(r[0].end, l.t[TZ_L_WQ].offset);
  assert_int_equal(r[1].begin, l.t[TZ_L_WQ].offset);
  assert_int_equal(r[1].end, l.t[TZ_L_MLP_NORM].offset);
  assert_int_equal(r[2].decay, 0);
  assert_int_equal(r[3].end, n);
  assert_int_equal(tz_decay_runs(&mc, 1, 0, 0, n, r), 1);
  /* a shard starting inside wq and ending inside mlp_norm's padding */
  uint64_t a = l.t[TZ_L_WQ].offset + 128, e = l.t[TZ_L_MLP_NORM].offset + 64;
  nr = tz_decay_runs(&mc, 1, TZ_DECAY_DEFAULT, a, e, r);
  assert_int_equal(nr, 2);
  assert_int_equal(r[0].begin, 0);
  assert_int_equal(r[0].end, l.t[TZ_L_MLP_NORM].offset - a);
  assert_int_equal(r[1].end, e - a);
}

static void test_config_key(void **state) {
  (void)state;
  struct tz_config c;
  unsigned ex = 99;
  char buf[64];
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_decay_exclude_parse(&c, &ex));
  assert_int_equal(ex, TZ_DECAY_BIAS | TZ_DECAY_NORM);
  assert_string_equal(tz_decay_exclude_name(ex, buf, sizeof buf), "bias,norm");
  TZ_ASSERT_OK(
      tz_config_load_string(&c, "{\"tierzero\": {\"weight_decay_exclude\": \"none\"}}", NULL));
  TZ_ASSERT_OK(tz_decay_exclude_parse(&c, &ex));
  assert_int_equal(ex, 0);
  assert_string_equal(tz_decay_exclude_name(ex, buf, sizeof buf), "none");
  TZ_ASSERT_OK(tz_config_load_string(
      &c, "{\"tierzero\": {\"weight_decay_exclude\": [\"norm\", \"embed\"]}}", NULL));
  TZ_ASSERT_OK(tz_decay_exclude_parse(&c, &ex));
  assert_int_equal(ex, TZ_DECAY_NORM | TZ_DECAY_EMBED);
  unsigned back = 0;
  TZ_ASSERT_OK(tz_decay_exclude_from_name(tz_decay_exclude_name(ex, buf, sizeof buf), &back));
  assert_int_equal(back, ex);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.weight_decay_exclude", "bias:norms"));
  assert_int_equal(tz_decay_exclude_parse(&c, &ex), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "tierzero.weight_decay_exclude"));
  assert_non_null(strstr(tz_err_msg(), "\"norms\""));
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.weight_decay_exclude", "none:norm"));
  assert_int_equal(tz_decay_exclude_parse(&c, &ex), TZ_ECONFIG);
  tz_config_free(&c);
}

static void test_bench_configs(void **state) {
  (void)state;
  static const char *const names[] = {"bench-auto.json", "bench-nvme.json", "bench-offload.json",
                                      "bench-stream.json"};
  const char *data = getenv("TZ_TEST_DATA");
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[2048];
    snprintf(path, sizeof path, "%s/../../configs/%s", data ? data : "tests/data", names[i]);
    struct tz_config c;
    tz_config_defaults(&c);
    TZ_ASSERT_OK(tz_config_load_file(&c, path));
    unsigned ex = 99;
    TZ_ASSERT_OK(tz_decay_exclude_parse(&c, &ex));
    if (ex != 0)
      fail_msg("%s excludes tensors from decay; its PyTorch peer decays every one", names[i]);
    tz_config_free(&c);
  }
  /* the demo: no decay, so its numbers do not depend on the key */
  char path[2048];
  snprintf(path, sizeof path, "%s/../../configs/demo.json", data ? data : "tests/data");
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_file(&c, path));
  assert_true(c.optimizer.weight_decay == 0);
  tz_config_free(&c);
}

/* One step of training: the default's norm tensors equal a run without decay, its other tensors
 * a run decaying everything. Then placement invariance and the folded update (applied by the
 * sync of tc_run, block by block) with the default. */
static void test_training(void **state) {
  (void)state;
  char *nvme = tz_test_mkdtemp("decay");
  struct tc_opts o;
  tc_opts_init(&o);
  o.steps = 1;
  o.mode = TZ_OPT_UNFOLDED;
  struct tc_result all, def, zero, folded;
  tc_run_single(&o, 0, nvme, &all);
  o.weight_decay = "0";
  tc_run_single(&o, 0, nvme, &zero);
  o.weight_decay = NULL;
  o.decay_exclude = "bias:norm";
  tc_run_single(&o, 0, nvme, &def);
  struct tz_model_config mc;
  tc_model(&mc);
  uint64_t norm_elems = 0, norm_bad = 0, other_bad = 0, norm_decayed = 0;
  for (int b = 0; b < def.nb; b++) {
    struct tz_block_layout l;
    assert_int_equal(tz_model_block_layout(&mc, b, &l), 0);
    for (int t = 0; t < l.n; t++)
      for (uint64_t i = 0; i < l.t[t].numel; i++) {
        uint64_t e = l.t[t].offset + i;
        if (excluded_by_name(l.t[t].name, TZ_DECAY_DEFAULT)) {
          norm_elems++;
          norm_bad += memcmp(&def.master[b][e], &zero.master[b][e], 4) != 0;
          norm_decayed += memcmp(&all.master[b][e], &zero.master[b][e], 4) != 0;
        } else {
          other_bad += memcmp(&def.master[b][e], &all.master[b][e], 4) != 0;
        }
      }
  }
  assert_true(norm_elems > 0);
  assert_true(norm_decayed > norm_elems / 2); /* decay changes the norms when not excluded */
  assert_int_equal(norm_bad, 0);
  assert_int_equal(other_bad, 0);
  o.mode = TZ_OPT_FOLDED;
  o.steps = 3;
  tc_run_single(&o, 0, nvme, &folded);
  struct tc_result unfolded;
  o.mode = TZ_OPT_UNFOLDED;
  tc_run_single(&o, 0, nvme, &unfolded);
  tc_expect_same(&folded, &unfolded, "decay: folded against unfolded");
  o.mode = TZ_OPT_AUTO;
  tc_check_placement(&o, 0, nvme, "decay: ");
  tc_result_free(&all);
  tc_result_free(&def);
  tc_result_free(&zero);
  tc_result_free(&folded);
  tc_result_free(&unfolded);
  tz_test_rmdir(nvme);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_runs),       cmocka_unit_test(test_elements),
      cmocka_unit_test(test_config_key), cmocka_unit_test(test_bench_configs),
      cmocka_unit_test(test_training),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
