/* The cpu model's harness shared by test_model_cpu.c and test_model_moe.c: a model and batch with
 * float-representable parameters (struct setup), a cpu run of the model driver (run_cpu), the
 * comparison with the float64 reference (compare_setup), the bit checks of recompute, threads,
 * accumulation and recomputed parts, and a layer probe filled at random (probe_open). */
#ifndef TZ_TEST_MODEL_CASES_H
#define TZ_TEST_MODEL_CASES_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/compute.h"
#include "refmodel.h"
#include "testlib.h"
#include "trainer/model/model.h"

struct setup {
  struct tz_model_config cfg;
  int B, T;
  int32_t *tok, *tgt;
  double **P;    /* reference parameters (float-representable) */
  float **hostP; /* the same as float */
};

static inline struct setup *setup_new(struct tz_model_config cfg, int B, int T, uint64_t seed) {
  struct setup *s = calloc(1, sizeof *s);
  s->cfg = cfg;
  s->B = B;
  s->T = T;
  int N = B * T, nb = tz_model_n_blocks(&cfg);
  s->tok = malloc(sizeof(int32_t) * N);
  s->tgt = malloc(sizeof(int32_t) * N);
  uint64_t st = seed;
  for (int n = 0; n < N; n++) {
    s->tok[n] = (int32_t)(tz_test_rand(&st) % (uint64_t)cfg.vocab);
    s->tgt[n] = (int32_t)(tz_test_rand(&st) % (uint64_t)cfg.vocab);
  }
  s->P = ref_blocks_alloc(&cfg);
  assert_non_null(s->P);
  ref_blocks_randomize(&cfg, s->P, seed, 0.3);
  s->hostP = calloc((size_t)nb, sizeof *s->hostP);
  for (int b = 0; b < nb; b++) {
    uint64_t n = tz_model_block_numel(&cfg, b);
    s->hostP[b] = malloc(sizeof(float) * n);
    for (uint64_t e = 0; e < n; e++) {
      s->hostP[b][e] = (float)s->P[b][e];
      s->P[b][e] = s->hostP[b][e];
    }
  }
  return s;
}

static inline void setup_free(struct setup *s) {
  for (int b = 0; b < tz_model_n_blocks(&s->cfg); b++)
    free(s->hostP[b]);
  free(s->hostP);
  ref_blocks_free(&s->cfg, s->P);
  free(s->tok);
  free(s->tgt);
  free(s);
}

/* The result of one cpu run: loss, logits and gradients on the host. */
struct result {
  float loss;
  float *logits; /* (N, V) */
  float **grads; /* per block */
};

static inline void result_free(const struct tz_model_config *cfg, struct result *r) {
  for (int b = 0; b < tz_model_n_blocks(cfg); b++)
    free(r->grads[b]);
  free(r->grads);
  free(r->logits);
}

/* Runs `steps` forward-backward passes accumulating into the same gradients. */
static inline struct result run_cpu(struct setup *s, int threads, int checkpoint, int steps) {
  const struct tz_model_config *cfg = &s->cfg;
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  p.n_threads = threads;
  tz_compute *cm;
  TZ_ASSERT_OK(tz_compute_create("cpu", &p, &cm));
  assert_int_equal(tz_compute_threads(cm), threads);
  int nb = tz_model_n_blocks(cfg);
  void **dP = calloc((size_t)nb, sizeof *dP), **dG = calloc((size_t)nb, sizeof *dG);
  for (int b = 0; b < nb; b++) {
    size_t bytes = tz_model_block_numel(cfg, b) * sizeof(float);
    TZ_ASSERT_OK(tz_compute_alloc(cm, bytes, &dP[b]));
    TZ_ASSERT_OK(tz_compute_alloc(cm, bytes, &dG[b]));
    TZ_ASSERT_OK(tz_compute_copy_in(cm, dP[b], s->hostP[b], bytes));
    TZ_ASSERT_OK(tz_compute_zero(cm, dG[b], bytes));
  }
  tz_model_runner *r;
  TZ_ASSERT_OK(tz_model_runner_create(cm, cfg, s->B, s->T, checkpoint, &r));
  struct result res = {0};
  for (int i = 0; i < steps; i++)
    TZ_ASSERT_OK(tz_model_runner_step(r, dP, dG, s->tok, s->tgt, 0.0f, &res.loss));
  res.logits = malloc(sizeof(float) * s->B * s->T * cfg->vocab);
  TZ_ASSERT_OK(tz_model_runner_logits(r, dP, s->tok, res.logits));
  res.grads = calloc((size_t)nb, sizeof *res.grads);
  for (int b = 0; b < nb; b++) {
    size_t bytes = tz_model_block_numel(cfg, b) * sizeof(float);
    res.grads[b] = malloc(bytes);
    TZ_ASSERT_OK(tz_compute_copy_out(cm, res.grads[b], dG[b], bytes));
    tz_compute_free(cm, dP[b]);
    tz_compute_free(cm, dG[b]);
  }
  tz_model_runner_destroy(r);
  free(dP);
  free(dG);
  tz_compute_destroy(cm);
  return res;
}

static inline double rel_err(const float *got, const double *want, uint64_t n) {
  double e = 0, w = 0;
  for (uint64_t i = 0; i < n; i++) {
    e += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    w += want[i] * want[i];
  }
  return w > 0 ? sqrt(e / w) : sqrt(e);
}

/* s's cpu run against the reference. */
static inline void compare_setup(struct setup *s) {
  struct tz_model_config cfg = s->cfg;
  int B = s->B, T = s->T, N = B * T, nb = tz_model_n_blocks(&cfg);
  double ref_loss, *ref_logits = malloc(sizeof(double) * N * cfg.vocab);
  double **G = ref_blocks_alloc(&cfg);
  TZ_ASSERT_OK(ref_model_run(&cfg, s->P, s->tok, s->tgt, B, T, ref_logits, &ref_loss, G));
  struct result r = run_cpu(s, 2, 1, 1);
  double le = fabs(r.loss - ref_loss) / ref_loss;
  double lge = rel_err(r.logits, ref_logits, (uint64_t)N * cfg.vocab);
  assert_true(le < 1e-5);
  assert_true(lge < 1e-5);
  double worst = 0;
  const char *worst_name = "";
  for (int b = 0; b < nb; b++) {
    struct tz_block_layout l;
    TZ_ASSERT_OK(tz_model_block_layout(&cfg, b, &l));
    for (int i = 0; i < l.n; i++) {
      if (l.t[i].numel == 0)
        continue; /* a tensor this config does not have */
      double e = rel_err(r.grads[b] + l.t[i].offset, G[b] + l.t[i].offset, l.t[i].numel);
      if (e > worst) {
        worst = e;
        worst_name = l.t[i].name;
      }
      double norm = 0;
      for (uint64_t k = 0; k < l.t[i].numel; k++)
        norm += G[b][l.t[i].offset + k] * G[b][l.t[i].offset + k];
      if (!(e < 1e-5) || !(norm > 0))
        fail_msg("block %d %s: gradient rel error %.3e (ref norm %.3e)", b, l.t[i].name, e,
                 sqrt(norm));
    }
  }
  print_message("loss rel %.2e, logits rel %.2e, worst gradient rel %.2e (%s)\n", le, lge, worst,
                worst_name);
  result_free(&cfg, &r);
  ref_blocks_free(&cfg, G);
  free(ref_logits);
}

static inline void compare_with_reference(struct tz_model_config cfg, int B, int T, uint64_t seed) {
  struct setup *s = setup_new(cfg, B, T, seed);
  compare_setup(s);
  setup_free(s);
}

static inline struct tz_model_config small_cfg(void) {
  struct tz_model_config c = {.d_model = 32,
                              .n_layer = 2,
                              .n_head = 4,
                              .n_kv_head = 2,
                              .ffn_dim = 40,
                              .vocab = 37,
                              .max_seq = 16,
                              .rope_theta = 10000.0,
                              .norm_eps = 1e-5,
                              .tie_embeddings = 0};
  return c;
}

static inline int bits_equal(const struct tz_model_config *cfg, const struct result *a,
                             const struct result *b, int N) {
  if (memcmp(&a->loss, &b->loss, sizeof a->loss) != 0)
    return 0;
  if (memcmp(a->logits, b->logits, sizeof(float) * N * cfg->vocab) != 0)
    return 0;
  for (int k = 0; k < tz_model_n_blocks(cfg); k++)
    if (memcmp(a->grads[k], b->grads[k], sizeof(float) * tz_model_block_numel(cfg, k)) != 0)
      return 0;
  return 1;
}

/* The checkpointed backward (the forward recomputed) equals the stored one, and thread counts
 * change no bit. */
static inline void recompute_thread_bits(struct tz_model_config cfg) {
  struct setup *s = setup_new(cfg, 2, 9, 205);
  struct result a = run_cpu(s, 2, 1, 1), b = run_cpu(s, 2, 0, 1), t = run_cpu(s, 3, 1, 1);
  assert_true(bits_equal(&s->cfg, &a, &b, 18));
  assert_true(bits_equal(&s->cfg, &a, &t, 18));
  result_free(&s->cfg, &a);
  result_free(&s->cfg, &b);
  result_free(&s->cfg, &t);
  setup_free(s);
}

/* With every flag on: recompute_thread_bits, and gradients accumulate exactly (a step's weight
 * gradients one sum each: with MLP chunks they are a sum of the chunks', rounded in order, which
 * two steps do not double exactly). */
static inline void all_on_bits(struct tz_model_config cfg) {
  recompute_thread_bits(cfg);
  struct setup *s;
  /* untied: a tied embedding takes two contributions per step, so two steps are not 2x one */
  struct tz_model_config c = cfg;
  c.tie_embeddings = 0;
  s = setup_new(c, 1, 6, 206);
  struct result one = run_cpu(s, 2, 0, 1), two = run_cpu(s, 2, 0, 2);
  for (int k = 0; k < tz_model_n_blocks(&s->cfg); k++)
    for (uint64_t e = 0; e < tz_model_block_numel(&s->cfg, k); e++)
      if (two.grads[k][e] != 2.0f * one.grads[k][e])
        fail_msg("block %d element %llu: two steps %.9g, one step %.9g", k, (unsigned long long)e,
                 two.grads[k][e], one.grads[k][e]);
  result_free(&s->cfg, &one);
  result_free(&s->cfg, &two);
  setup_free(s);
}

/* A cpu instance and a layer probe of c at B x T, its parameters, input and output gradient
 * uniform in [-0.5, 0.5) from seed. */
static inline void probe_open(const struct tz_model_config *c, int B, int T, uint64_t seed,
                              tz_compute **cmp, struct tz_layer_probe *l) {
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  TZ_ASSERT_OK(tz_compute_create("cpu", &p, cmp));
  tz_compute *cm = *cmp;
  TZ_ASSERT_OK(tz_layer_probe_alloc(cm, c, B, T, l));
  uint64_t np = tz_model_layer_numel(c), nx = (uint64_t)l->B * l->T * c->d_model;
  float *h = malloc((np + 2 * nx) * sizeof *h);
  assert_non_null(h);
  for (uint64_t i = 0; i < np + 2 * nx; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    h[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) - 0.5);
  }
  TZ_ASSERT_OK(tz_model_block_upload(cm, l->params, h, np));
  TZ_ASSERT_OK(tz_model_block_upload(cm, l->x_in, h + np, nx));
  TZ_ASSERT_OK(tz_model_block_upload(cm, l->dx_out, h + np + nx, nx));
  free(h);
}

/* Backward with only the attention part, only the MLP part, or both recomputed gives the bits of
 * the stored forward's (the activations of the recomputed parts NaN before, so that a part that
 * is read but not recomputed shows, and in every case the tensors a kept part does not keep:
 * the norms' outputs and the SwiGLU, which the backward rebuilds); so does the attention part
 * recomputed but for its op (TZ_PART_ATTN_OUT: all of it NaN but att and lse), which reads the
 * kept output and does not run the op again (a changed att changes the gradients). */
static inline void partial_recompute_bits(struct tz_model_config c) {
  int B = 2, T = 9;
  tz_compute *cm;
  struct tz_layer_probe l;
  probe_open(&c, B, T, 77, &cm, &l);
  uint64_t np = tz_model_layer_numel(&c), nx = (uint64_t)B * T * c.d_model;
  /* The full layout: what the attention part keeps, what the MLP part keeps, then the rest. */
  size_t attn = tz_model_acts_part_bytes(&c, TZ_F32, B, T, TZ_PART_ATTN);
  size_t all = tz_model_acts_part_bytes(&c, TZ_F32, B, T, TZ_PARTS_ALL);
  size_t full = tz_model_acts_bytes(&c, TZ_F32, B, T);
  assert_true(attn > 0 && attn < all && all < full);
  /* att and lse, carved one after the other before x2 (acts_layout) */
  size_t out0 = (size_t)((char *)l.acts.att - (char *)l.acts_mem);
  size_t out1 = (size_t)((char *)l.acts.x2 - (char *)l.acts_mem);
  assert_true(out0 < out1 && out1 < attn);
  const unsigned O = TZ_PART_ATTN | TZ_PART_ATTN_OUT;
  const unsigned modes[] = {0, TZ_PART_ATTN, TZ_PART_MLP, TZ_PARTS_ALL, O, O | TZ_PART_MLP, O};
  enum { NM = sizeof modes / sizeof modes[0] };
  float *got[NM];
  for (unsigned i = 0; i < NM; i++) {
    unsigned m = modes[i];
    got[i] = malloc((np + nx) * sizeof(float));
    assert_non_null(got[i]);
    TZ_ASSERT_OK(tz_compute_zero(cm, l.grads, np * sizeof(float)));
    TZ_ASSERT_OK(tz_model_layer_fwd(cm, &c, 0, l.w, l.x_in, l.x_out, &l.acts, B, T, NULL));
    if (m & TZ_PART_ATTN_OUT) {
      TZ_ASSERT_OK(tz_compute_fill(cm, TZ_F32, l.acts_mem, NAN, out0 / sizeof(float)));
      TZ_ASSERT_OK(tz_compute_fill(cm, TZ_F32, (char *)l.acts_mem + out1, NAN,
                                   (attn - out1) / sizeof(float)));
      if (i == NM - 1) /* the last: an output the op would not give */
        TZ_ASSERT_OK(tz_compute_fill(cm, TZ_F32, l.acts.att, 0.25f,
                                     (size_t)B * T * c.n_head * tz_model_head_dim(&c)));
    } else if (m & TZ_PART_ATTN) {
      TZ_ASSERT_OK(tz_compute_fill(cm, TZ_F32, l.acts_mem, NAN, attn / sizeof(float)));
    }
    if (m & TZ_PART_MLP)
      TZ_ASSERT_OK(tz_compute_fill(cm, TZ_F32, (char *)l.acts_mem + attn, NAN,
                                   (all - attn) / sizeof(float)));
    TZ_ASSERT_OK(
        tz_compute_fill(cm, TZ_F32, (char *)l.acts_mem + all, NAN, (full - all) / sizeof(float)));
    TZ_ASSERT_OK(tz_model_layer_bwd(cm, &c, 0, l.w, l.dw, l.x_in, &l.acts, m, l.dx_out, l.dx_in,
                                    &l.scratch, B, T, NULL));
    TZ_ASSERT_OK(tz_model_block_download(cm, got[i], l.grads, np));
    TZ_ASSERT_OK(tz_model_block_download(cm, got[i] + np, l.dx_in, nx));
  }
  for (uint64_t i = 0; i < np + nx; i++)
    assert_true(isfinite(got[0][i]));
  for (unsigned i = 1; i < NM - 1; i++)
    if (memcmp(got[i], got[0], (np + nx) * sizeof(float)) != 0)
      fail_msg("recomputing parts %u changed the backward's bits", modes[i]);
  if (memcmp(got[NM - 1], got[0], (np + nx) * sizeof(float)) == 0)
    fail_msg("the attention's kept output was not what the backward read");
  for (unsigned i = 0; i < NM; i++)
    free(got[i]);
  tz_layer_probe_free(cm, &l);
  tz_compute_destroy(cm);
}

#endif
