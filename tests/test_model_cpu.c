/* The model on the cpu backend against the float64 reference: logits, loss and every parameter's
 * gradient (norm-wise relative error < 1e-5), with grouped-query attention, tied and untied
 * embeddings, odd T, and each flag of the model families (q/k/v biases, q/k norms, llama3 RoPE, a
 * head_dim with H*D != d_model) alone and all together. Also: checkpointed backward equals the
 * stored-activation backward bit for bit; runs and thread counts give identical bits; gradients
 * accumulate; layout, config checks and init; the pad token's embedding row (transformers'
 * padding_idx: no gradient from the lookup). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/compute.h"
#include "model_cases.h"
#include "refmodel.h"
#include "testlib.h"
#include "trainer/model/model.h"

static void test_ref_gqa_untied_odd_t(void **state) {
  (void)state;
  compare_with_reference(small_cfg(), 2, 7, 101);
}

static void test_ref_tied_mha(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.tie_embeddings = 1;
  c.n_kv_head = 4;
  compare_with_reference(c, 3, 5, 102);
}

/* Wider than one channel slice of the cpu reductions, one key-value head for all query heads. */
static void test_ref_wide_mqa(void **state) {
  (void)state;
  struct tz_model_config c = {.d_model = 80,
                              .n_layer = 1,
                              .n_head = 5,
                              .n_kv_head = 1,
                              .ffn_dim = 72,
                              .vocab = 50,
                              .max_seq = 16,
                              .rope_theta = 500000.0,
                              .norm_eps = 1e-6,
                              .tie_embeddings = 1};
  compare_with_reference(c, 1, 11, 103);
}

static void test_checkpoint_bit_exact(void **state) {
  (void)state;
  struct setup *s = setup_new(small_cfg(), 2, 9, 201);
  struct result a = run_cpu(s, 2, 1, 1), b = run_cpu(s, 2, 0, 1);
  assert_true(bits_equal(&s->cfg, &a, &b, 18));
  result_free(&s->cfg, &a);
  result_free(&s->cfg, &b);
  setup_free(s);
}

static void test_deterministic_threads(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.d_model = 160; /* several channel slices, so threads really split the reductions */
  c.n_head = 8;
  struct setup *s = setup_new(c, 2, 13, 202);
  struct result a = run_cpu(s, 2, 1, 1), b = run_cpu(s, 2, 1, 1);
  assert_true(bits_equal(&s->cfg, &a, &b, 26));
  int threads[] = {1, 3, 4};
  for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
    struct result t = run_cpu(s, threads[i], 1, 1);
    if (!bits_equal(&s->cfg, &a, &t, 26))
      fail_msg("%d threads give different bits from 2", threads[i]);
    result_free(&s->cfg, &t);
  }
  result_free(&s->cfg, &a);
  result_free(&s->cfg, &b);
  setup_free(s);
}

/* Two steps into the same gradient buffers give exactly twice one step (g + g is exact). */
static void test_grads_accumulate(void **state) {
  (void)state;
  struct setup *s = setup_new(small_cfg(), 1, 6, 203);
  struct result one = run_cpu(s, 2, 1, 1), two = run_cpu(s, 2, 1, 2);
  for (int b = 0; b < tz_model_n_blocks(&s->cfg); b++)
    for (uint64_t e = 0; e < tz_model_block_numel(&s->cfg, b); e++)
      if (two.grads[b][e] != 2.0f * one.grads[b][e])
        fail_msg("block %d element %llu: two steps %.9g, one step %.9g", b, (unsigned long long)e,
                 two.grads[b][e], one.grads[b][e]);
  result_free(&s->cfg, &one);
  result_free(&s->cfg, &two);
  setup_free(s);
}

/* ---- the model families' flags, each alone and all together ---- */

static struct tz_model_config llama3_rope(struct tz_model_config c) {
  /* Short original context, so that at T <= 16 some frequencies are kept, some slowed by factor
   * and some in the smoothed band between (wavelengths 2 pi / f against 64 and 16). */
  c.rope_type = TZ_ROPE_LLAMA3;
  c.rope_factor = 8.0;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_max_pos = 64;
  return c;
}

/* Every flag on: Qwen3 with attention biases, llama3 RoPE, H*D != C, a tied head. */
static struct tz_model_config all_on_cfg(void) {
  struct tz_model_config c = llama3_rope(small_cfg());
  c.d_model = 64;
  c.head_dim = 24;
  c.qkv_bias = 1;
  c.qk_norm = 1;
  c.tie_embeddings = 1;
  c.family = TZ_FAMILY_QWEN3;
  return c;
}

/* OLMo 2: the norms on the attention's and the MLP's outputs, none before them, and q/k norms
 * over the whole projections. */
static struct tz_model_config olmo2_cfg(void) {
  struct tz_model_config c = small_cfg();
  c.qk_norm = TZ_QK_NORM_ALL;
  c.norm_place = TZ_NORM_POST;
  c.family = TZ_FAMILY_OLMO2;
  return c;
}

/* OLMo 2's flags with every other: biases, llama3 RoPE, H*D != C, a tied head. */
static struct tz_model_config olmo2_all_on_cfg(void) {
  struct tz_model_config c = all_on_cfg();
  c.qk_norm = TZ_QK_NORM_ALL;
  c.norm_place = TZ_NORM_POST;
  c.family = TZ_FAMILY_OLMO2;
  return c;
}

static void test_ref_olmo2(void **state) {
  (void)state;
  compare_with_reference(olmo2_cfg(), 2, 7, 111);
  compare_with_reference(olmo2_all_on_cfg(), 2, 11, 112);
  struct tz_model_config c = olmo2_all_on_cfg();
  c.tie_embeddings = 0;
  c.n_kv_head = 1;
  compare_with_reference(c, 1, 16, 113);
}

/* Gemma 2: (1 + w) norms before and after each part, the tanh-gelu gate, the embedding scaled,
 * the attention's own scale, soft-capped scores and logits, sliding layers (window 3 < T)
 * alternating with full ones, a tied head. */
static struct tz_model_config gemma2_cfg(void) {
  struct tz_model_config c = small_cfg();
  c.norm_place = TZ_NORM_BOTH;
  c.norm_offset = 1;
  c.glu_act = TZ_GLU_GELU_TANH;
  c.embed_scale = 1;
  c.attn_scale = 0.3;
  c.attn_softcap = 2.0;
  c.final_softcap = 3.0;
  c.sliding_window = 3;
  c.window_pattern = 2;
  c.tie_embeddings = 1;
  return c;
}

static void test_ref_gemma2(void **state) {
  (void)state;
  /* the variants only the cpu backend computes, named for the refusal on another */
  struct tz_model_config l = small_cfg(), g = gemma2_cfg();
  assert_null(tz_model_variant(&l, 16));
  assert_string_equal(tz_model_variant(&g, 16), "soft-capped attention scores");
  g.attn_softcap = 0, g.sliding_window = 0, g.attn_scale = 0, g.norm_offset = 0, g.glu_act = 0;
  assert_string_equal(tz_model_variant(&g, 16), "soft-capped logits");
  compare_with_reference(gemma2_cfg(), 2, 7, 121);
  struct tz_model_config c = gemma2_cfg(); /* with q/k norms (Gemma 3), every layer sliding */
  c.qk_norm = TZ_QK_NORM_HEAD;
  c.window_pattern = 0;
  c.tie_embeddings = 0;
  compare_with_reference(c, 1, 16, 122);
}

/* Gemma 3: Gemma 2's layer without the softcaps, q/k norms per head (offset too), the sliding
 * layers' own RoPE base; three layers with every third full (0 and 1 slide, 2 does not). */
static struct tz_model_config gemma3_cfg(void) {
  struct tz_model_config c = gemma2_cfg();
  c.n_layer = 3;
  c.qk_norm = TZ_QK_NORM_HEAD;
  c.attn_softcap = 0;
  c.final_softcap = 0;
  c.window_pattern = 3;
  c.rope_local_theta = 50.0;
  c.rope_theta = 1e6;
  return c;
}

static void test_ref_gemma3(void **state) {
  (void)state;
  compare_with_reference(gemma3_cfg(), 2, 7, 123);
  struct tz_model_config c = gemma3_cfg(), e = c;
  assert_int_equal(tz_model_layer_window(&c, 0), 3);
  assert_int_equal(tz_model_layer_window(&c, 2), 0);
  struct tz_rope r0, r2;
  tz_model_layer_rope(&c, 0, 7, &r0);
  tz_model_layer_rope(&c, 2, 7, &r2);
  assert_true(r0.theta == 50.0 && r0.type == TZ_ROPE_DEFAULT && r2.theta == 1e6);
  /* the kind of a layer is the pattern's, not its window's: without a window (transformers'
   * sliding_window null) layers 0 and 1 still rotate at the sliding layers' base */
  e.sliding_window = 0;
  tz_model_layer_rope(&e, 1, 9, &r0);
  assert_true(r0.theta == 50.0 && tz_model_layer_window(&e, 1) == 0);
  compare_with_reference(e, 1, 9, 124);
}

/* yarn RoPE (Qwen2.5's long-context configs): the frequencies' ramp between the interpolated and
 * the original, with a head dim of 16 so that the ramp has dims on both sides, and the attention
 * factor as the scores' scale; mscale's default too. */
static void test_ref_yarn(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.head_dim = 16;
  c.rope_type = TZ_ROPE_YARN;
  c.rope_factor = 4.0;
  c.rope_original_max_pos = 64;
  c.rope_beta_fast = 32;
  c.rope_beta_slow = 1;
  c.rope_truncate = 1;
  c.rope_attn_factor = 0.1 * log(4.0) + 1.0;
  c.rope_theta = 100.0;
  compare_with_reference(c, 2, 7, 131);
  c.rope_truncate = 0;
  c.rope_attn_factor = 1.0; /* given as 1: no scale, llama's attention (the cuda backend's) */
  assert_null(tz_model_variant(&c, 7));
  compare_with_reference(c, 1, 16, 132);
  double f[8];
  struct tz_rope r;
  tz_model_rope(&c, &r);
  TZ_ASSERT_OK(tz_rope_inv_freq(&r, 16, f));
  /* the ramp: the first dims keep their frequency, the last are divided by the factor */
  assert_true(f[0] == 1.0 && fabs(f[7] - pow(100.0, -14.0 / 16) / 4.0) < 1e-15);
}

/* c with longrope over an original length of 8, factor 2 and its attention factor, and n factors
 * of each kind */
static struct tz_model_config with_longrope(struct tz_model_config c, int n) {
  c.rope_type = TZ_ROPE_LONGROPE;
  c.rope_original_max_pos = 8;
  c.rope_factor = 2.0;
  c.rope_attn_factor = sqrt(1.0 + log(2.0) / log(8.0));
  for (int i = 0; i < n; i++) {
    c.rope_short_factor[i] = 1.0 + 0.25 * i;
    c.rope_long_factor[i] = 1.0 + 1.5 * i;
  }
  return c;
}

/* longrope (Phi-3.5): the short factors at sequences up to the original length (7 of 8), the
 * long ones above it (12), the attention factor in the scores' scale. */
static void test_ref_longrope(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.head_dim = 16;
  c = with_longrope(c, 8);
  compare_with_reference(c, 2, 7, 133);
  compare_with_reference(c, 1, 12, 134);
  struct tz_rope a, b;
  tz_model_layer_rope(&c, 0, 8, &a);
  tz_model_layer_rope(&c, 0, 9, &b);
  assert_true(a.ext_factors == c.rope_short_factor && b.ext_factors == c.rope_long_factor);
  c.rope_long_factor[3] = 0;
  assert_int_equal(tz_model_config_check(&c), TZ_ECONFIG);
}

/* Partial rotary (Phi-4-mini: partial_rotary_factor 0.75): 12 of each head's 16 dims rotated, with
 * longrope's 6 factors of each kind, short and long; a variant the cpu backend computes. */
static void test_ref_partial_rotary(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.head_dim = 16;
  c.rope_rot = 12;
  compare_with_reference(c, 2, 7, 135);
  assert_string_equal(tz_model_variant(&c, 7), "partial rotary");
  c = with_longrope(c, 6);
  compare_with_reference(c, 1, 12, 136);
  c.rope_rot = 7;
  assert_int_equal(tz_model_config_check(&c), TZ_ECONFIG);
}

static void test_ref_qkv_bias(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.qkv_bias = 1;
  c.family = TZ_FAMILY_QWEN2;
  compare_with_reference(c, 2, 7, 104);
}

static void test_ref_qk_norm(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.qk_norm = 1;
  c.family = TZ_FAMILY_QWEN3;
  compare_with_reference(c, 2, 7, 105);
}

static void test_ref_llama3_rope(void **state) {
  (void)state;
  compare_with_reference(llama3_rope(small_cfg()), 2, 13, 106);
}

/* rope_type linear (position interpolation): every frequency over the factor. */
static void test_ref_linear_rope(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.rope_type = TZ_ROPE_LINEAR;
  c.rope_factor = 4.0;
  compare_with_reference(c, 2, 13, 114);
  /* the frequencies are the default's over the factor, bit for bit */
  struct tz_rope d = {.theta = 10000.0},
                 l = {.theta = 10000.0, .type = TZ_ROPE_LINEAR, .factor = 4.0};
  double fd[16], fl[16];
  TZ_ASSERT_OK(tz_rope_inv_freq(&d, 32, fd));
  TZ_ASSERT_OK(tz_rope_inv_freq(&l, 32, fl));
  for (int i = 0; i < 16; i++)
    assert_true(fl[i] == fd[i] / 4.0);
  l.factor = 0.5;
  assert_int_equal(tz_rope_check(&l), TZ_EINVAL);
}

/* H*D = 128 against C = 64: every (N, H*D) buffer, wo's shape and the attention scale. */
static void test_ref_head_dim_wide(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.d_model = 64;
  c.head_dim = 32;
  compare_with_reference(c, 2, 5, 107);
}

/* D = 24 (not a power of two), H*D = 96, C = 64, tied head. */
static void test_ref_head_dim_24_tied(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  c.d_model = 64;
  c.head_dim = 24;
  c.tie_embeddings = 1;
  compare_with_reference(c, 1, 9, 108);
}

static void test_ref_all_on(void **state) {
  (void)state;
  compare_with_reference(all_on_cfg(), 2, 11, 109);
  struct tz_model_config c = all_on_cfg();
  c.tie_embeddings = 0;
  c.n_kv_head = 1;
  compare_with_reference(c, 1, 16, 110);
}

static void test_all_on_bits(void **state) {
  (void)state;
  all_on_bits(all_on_cfg());
  all_on_bits(olmo2_all_on_cfg());
  all_on_bits(gemma2_cfg());
  all_on_bits(gemma3_cfg());
}

/* The layout with the optional tensors; Llama's unchanged; the sizes that follow H*D. */
static void test_layout_families(void **state) {
  (void)state;
  struct tz_model_config c;
  TZ_ASSERT_OK(tz_model_preset("tiny", &c));
  struct tz_block_layout base, l;
  TZ_ASSERT_OK(tz_model_block_layout(&c, 1, &base));
  assert_int_equal(base.n, TZ_L_COUNT);
  for (int i = TZ_L_BQ; i < TZ_L_COUNT; i++) {
    assert_true(base.t[i].numel == 0 && base.t[i].ndim == 0);
    assert_true(base.t[i].offset == base.numel); /* no room */
  }
  assert_true(base.t[TZ_L_WD].offset + base.t[TZ_L_WD].numel <= base.numel);
  uint64_t llama_params = tz_model_n_params(&c);
  size_t llama_acts = tz_model_acts_bytes(&c, TZ_F32, 2, 16);
  struct tz_model_config q = c;
  q.qkv_bias = 1;
  q.qk_norm = 1;
  q.head_dim = 64; /* C 128, H 4: H*D 256, Hkv*D 128 */
  TZ_ASSERT_OK(tz_model_config_check(&q));
  TZ_ASSERT_OK(tz_model_block_layout(&q, 1, &l));
  assert_int_equal(l.n, TZ_L_COUNT);
  int64_t HD = 256, KD = 128, C = 128;
  assert_true(l.t[TZ_L_WQ].shape[0] == HD && l.t[TZ_L_WQ].shape[1] == C);
  assert_true(l.t[TZ_L_WK].shape[0] == KD && l.t[TZ_L_WV].shape[0] == KD);
  assert_true(l.t[TZ_L_WO].shape[0] == C && l.t[TZ_L_WO].shape[1] == HD);
  assert_true(l.t[TZ_L_BQ].numel == (uint64_t)HD && l.t[TZ_L_BQ].ndim == 1);
  assert_true(l.t[TZ_L_BK].numel == (uint64_t)KD && l.t[TZ_L_BV].numel == (uint64_t)KD);
  assert_true(l.t[TZ_L_QNORM].numel == 64 && l.t[TZ_L_KNORM].numel == 64);
  assert_string_equal(l.t[TZ_L_BQ].name, "bq");
  assert_string_equal(l.t[TZ_L_KNORM].name, "k_norm");
  for (int i = 1; i < l.n; i++)
    assert_true(l.t[i].offset >= l.t[i - 1].offset + l.t[i - 1].numel &&
                l.t[i].offset % TZ_MODEL_ALIGN == 0);
  uint64_t per_layer = (uint64_t)(2 * C * HD + 2 * C * KD) + 3 * (uint64_t)C * 352 +
                       2 * (uint64_t)C + (uint64_t)(HD + 2 * KD + 2 * 64);
  assert_true(tz_model_n_params(&q) == 256 * 128 + 128 + 4 * per_layer);
  /* activations grow only with qk_norm (q and k before the norms, their statistics) */
  struct tz_model_config b = c;
  b.qkv_bias = 1;
  assert_true(tz_model_acts_bytes(&b, TZ_F32, 2, 16) == llama_acts);
  assert_true(tz_model_n_params(&b) == llama_params + 4 * (128 + 2 * 64));
  b.qk_norm = 1;
  assert_true(tz_model_acts_bytes(&b, TZ_F32, 2, 16) > llama_acts);
  /* FLOP: attention counts H*D, the projections their shapes */
  double N = 2.0 * 16, mat = (double)(2 * C * HD + 2 * C * KD) + 3.0 * C * 352;
  assert_true(tz_model_layer_flop(&q, 2, 16) == 2.0 * N * mat + 2.0 * 2 * 16.0 * 16.0 * HD);
  /* OLMo 2: no norms before the parts, two on their outputs, q/k norms of the whole projections;
   * the same number of norm weights per layer as Qwen3's but for the q/k norms' width */
  struct tz_model_config o = q;
  o.qkv_bias = 0;
  o.qk_norm = TZ_QK_NORM_ALL;
  o.norm_place = TZ_NORM_POST;
  TZ_ASSERT_OK(tz_model_block_layout(&o, 1, &l));
  assert_int_equal(l.n, TZ_L_COUNT);
  assert_true(l.t[TZ_L_ATTN_NORM].numel == 0 && l.t[TZ_L_MLP_NORM].numel == 0);
  assert_true(l.t[TZ_L_ATTN_POST_NORM].numel == (uint64_t)C &&
              l.t[TZ_L_MLP_POST_NORM].numel == (uint64_t)C);
  assert_true(l.t[TZ_L_QNORM].numel == (uint64_t)HD && l.t[TZ_L_KNORM].numel == (uint64_t)KD);
  assert_string_equal(l.t[TZ_L_ATTN_POST_NORM].name, "attn_post_norm");
  assert_string_equal(l.t[TZ_L_MLP_POST_NORM].name, "mlp_post_norm");
  for (int i = 1; i < l.n; i++)
    assert_true(l.t[i].offset >= l.t[i - 1].offset + l.t[i - 1].numel &&
                l.t[i].offset % TZ_MODEL_ALIGN == 0);
  uint64_t olmo_layer = (uint64_t)(2 * C * HD + 2 * C * KD) + 3 * (uint64_t)C * 352 +
                        2 * (uint64_t)C + (uint64_t)(HD + KD);
  assert_true(tz_model_n_params(&o) == 256 * 128 + 128 + 4 * olmo_layer);
  /* the kept activations: each part's output before its norm and the norm's statistics, in
   * place of the norms before the parts (which the backward rebuilt, so only the full layout
   * had them) */
  struct tz_model_config pre = o;
  pre.norm_place = TZ_NORM_PRE;
  size_t es = sizeof(float), nt = 2 * 16;
  size_t one = (nt * C * es + 255) / 256 * 256 + (nt * es + 255) / 256 * 256;
  assert_true(tz_model_acts_part_bytes(&o, TZ_F32, 2, 16, TZ_PARTS_ALL) ==
              tz_model_acts_part_bytes(&pre, TZ_F32, 2, 16, TZ_PARTS_ALL) + 2 * one);
  assert_true(tz_model_acts_bytes(&o, TZ_F32, 2, 16) == tz_model_acts_bytes(&pre, TZ_F32, 2, 16));
}

static void check_bad(struct tz_model_config c, const char *field) {
  assert_int_equal(tz_model_config_check(&c), TZ_ECONFIG);
  if (!strstr(tz_err_msg(), field))
    fail_msg("config check names '%s'? message: %s", field, tz_err_msg());
}

static void test_config_check_families(void **state) {
  (void)state;
  struct tz_model_config ok = all_on_cfg(), c;
  TZ_ASSERT_OK(tz_model_config_check(&ok));
  c = ok, c.head_dim = 23, check_bad(c, "head_dim 23");
  c = ok, c.head_dim = -2, check_bad(c, "head_dim -2");
  c = ok, c.head_dim = 0, c.n_head = 3, check_bad(c, "n_head 3");
  c = ok, c.head_dim = 0; /* 64 / 4 */
  TZ_ASSERT_OK(tz_model_config_check(&c));
  c = ok, c.head_dim = 2048, check_bad(c, "head dim 2048");
  char fam[32];
  snprintf(fam, sizeof fam, "family %d", TZ_FAMILY_COUNT);
  c = ok, c.family = TZ_FAMILY_COUNT, check_bad(c, fam);
  c = ok, c.qkv_bias = 2, check_bad(c, "qkv_bias 2");
  c = ok, c.qk_norm = -1, check_bad(c, "qk_norm -1");
  c = ok, c.qk_norm = 3, check_bad(c, "qk_norm 3");
  c = ok, c.norm_place = 3, check_bad(c, "norm_place 3");
  c = ok, c.norm_offset = 2, check_bad(c, "norm_offset 2");
  c = ok, c.glu_act = 2, check_bad(c, "glu_act 2");
  c = ok, c.embed_scale = -1, check_bad(c, "embed_scale -1");
  c = ok, c.attn_scale = -1, check_bad(c, "attn_scale -1");
  c = ok, c.attn_softcap = NAN, check_bad(c, "attn_softcap");
  c = ok, c.final_softcap = -2, check_bad(c, "final_softcap -2");
  c = ok, c.sliding_window = -1, check_bad(c, "sliding_window -1");
  c = ok, c.rope_local_theta = -1, check_bad(c, "rope_local_theta -1");
  c = ok, c.norm_place = TZ_NORM_POST, c.qk_norm = TZ_QK_NORM_ALL;
  TZ_ASSERT_OK(tz_model_config_check(&c));
  c = ok, c.init_std = -0.02, check_bad(c, "init_std -0.02");
  c = ok, c.init_std = NAN, check_bad(c, "init_std");
  c = ok, c.rope_type = 3, check_bad(c, "rope_type 3");
  c = ok, c.rope_type = TZ_ROPE_LINEAR, c.rope_factor = 0.5, check_bad(c, "factor 0.5");
  c = ok, c.rope_type = TZ_ROPE_LINEAR, c.rope_high_freq_factor = 0; /* llama3's fields unused */
  TZ_ASSERT_OK(tz_model_config_check(&c));
  c = ok, c.rope_factor = 0.5, check_bad(c, "factor 0.5");
  c = ok, c.rope_high_freq_factor = 1.0, check_bad(c, "high_freq_factor 1");
  c = ok, c.rope_original_max_pos = 0, check_bad(c, "original_max_position_embeddings 0");
  c = ok, c.has_pad = 3, check_bad(c, "has_pad 3");
  c = ok, c.rope_type = 0, c.rope_factor = 0; /* the scaling fields unused */
  TZ_ASSERT_OK(tz_model_config_check(&c));
}

/* init_std > 0: every matrix and the embedding ~ normal(0, init_std), wo and wd too; norms 1;
 * biases 0; the pad row of the embedding 0; any range the same slice of the whole. init_std 0:
 * biases 0 and q/k norms 1 there too. */
static void test_init_std(void **state) {
  (void)state;
  for (int mode = 0; mode < 2; mode++) {
    struct tz_model_config c = all_on_cfg();
    c.n_layer = 4;
    c.init_std = mode ? 0.05 : 0.0;
    c.has_pad = 1;
    c.pad_id = 3;
    for (int blk = 0; blk < tz_model_n_blocks(&c); blk++) {
      struct tz_block_layout l;
      TZ_ASSERT_OK(tz_model_block_layout(&c, blk, &l));
      float *all = malloc(sizeof(float) * l.numel), *part = malloc(sizeof(float) * l.numel);
      TZ_ASSERT_OK(tz_model_init_block(&c, blk, 7, 0, l.numel, all));
      uint64_t lo = l.numel / 3 + 1, hi = l.numel - l.numel / 5;
      TZ_ASSERT_OK(tz_model_init_block(&c, blk, 7, lo, hi, part));
      assert_memory_equal(part, all + lo, sizeof(float) * (hi - lo));
      for (int t = 0; t < l.n; t++) {
        const struct tz_param_info *p = &l.t[t];
        if (p->numel == 0)
          continue;
        const float *x = all + p->offset;
        double s2 = 0;
        for (uint64_t e = 0; e < p->numel; e++)
          s2 += (double)x[e] * x[e];
        int bias = l.kind == TZ_BLOCK_LAYER && (t == TZ_L_BQ || t == TZ_L_BK || t == TZ_L_BV);
        if (bias) {
          assert_true(s2 == 0.0);
        } else if (p->ndim == 1) {
          assert_true(s2 == (double)p->numel);
        } else {
          double want = mode ? 0.05
                        : l.kind == TZ_BLOCK_LAYER && (t == TZ_L_WO || t == TZ_L_WD)
                            ? 0.02 / sqrt(2.0 * c.n_layer)
                            : 0.02;
          uint64_t n = p->numel;
          if (l.kind == TZ_BLOCK_EMBED && mode) {
            for (int j = 0; j < c.d_model; j++)
              assert_true(x[3 * c.d_model + j] == 0.0f);
            n -= (uint64_t)c.d_model;
          } else if (l.kind == TZ_BLOCK_EMBED) {
            assert_true(x[3 * c.d_model] != 0.0f); /* the presets' init keeps the pad row */
          }
          double rms = sqrt(s2 / n);
          if (fabs(rms - want) > 0.1 * want)
            fail_msg("init_std %g block %d %s: rms %g, want about %g", c.init_std, blk, p->name,
                     rms, want);
        }
      }
      free(all);
      free(part);
    }
  }
}

static void test_layout(void **state) {
  (void)state;
  for (int i = 0; i < tz_model_preset_count(); i++) {
    struct tz_model_config c;
    TZ_ASSERT_OK(tz_model_preset(tz_model_preset_name(i), &c));
    TZ_ASSERT_OK(tz_model_config_check(&c));
    for (int b = 0; b < tz_model_n_blocks(&c); b++) {
      struct tz_block_layout l;
      TZ_ASSERT_OK(tz_model_block_layout(&c, b, &l));
      uint64_t end = 0;
      for (int t = 0; t < l.n; t++) {
        assert_true(l.t[t].offset % TZ_MODEL_ALIGN == 0);
        assert_true(l.t[t].offset >= end);
        assert_true(l.t[t].numel == (uint64_t)(l.t[t].shape[0] * l.t[t].shape[1]));
        end = l.t[t].offset + l.t[t].numel;
      }
      assert_true(l.numel >= end && l.numel % TZ_MODEL_ALIGN == 0);
      for (int w = 1; w <= 48; w++) {
        uint64_t p = tz_model_block_numel_padded(&c, b, w);
        assert_true(p >= l.numel && p % ((uint64_t)w * TZ_MODEL_ALIGN) == 0);
        assert_true(p - l.numel < (uint64_t)w * TZ_MODEL_ALIGN);
      }
    }
  }
  struct tz_model_config c;
  TZ_ASSERT_OK(tz_model_preset("llama-7b", &c));
  assert_true(tz_model_n_params(&c) == 6738415616ull); /* the published LLaMA-7B count */
  assert_true(tz_model_layer_numel_padded(&c, 6) % (6 * TZ_MODEL_ALIGN) == 0);
  assert_true(tz_model_checkpoint_default(&c, TZ_BF16, 1, 2048));
  struct tz_model_config tiny;
  TZ_ASSERT_OK(tz_model_preset("tiny", &tiny));
  assert_false(tz_model_checkpoint_default(&tiny, TZ_F32, 8, 256));
  assert_int_equal(tz_model_preset("llama-99b", &c), TZ_ENOENT);
  c.n_kv_head = 3;
  assert_int_equal(tz_model_config_check(&c), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "n_kv_head"));
}

/* One layer alone: its FLOP count by hand for llama-7b (C 4096, 32 heads of 128, FFN 11008,
 * B 4, T 2048), and a timed forward and recomputing backward on the cpu backend. */
static void test_layer_probe(void **state) {
  (void)state;
  struct tz_model_config c;
  TZ_ASSERT_OK(tz_model_preset("llama-7b", &c));
  double matrices = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008, N = 4.0 * 2048;
  double want = 2.0 * N * matrices + 2.0 * 4 * 2048.0 * 2048.0 * 4096;
  assert_true(tz_model_layer_flop(&c, 4, 2048) == want);
  TZ_ASSERT_OK(tz_model_preset("tiny", &c));
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  tz_compute *cm;
  TZ_ASSERT_OK(tz_compute_create("cpu", &p, &cm));
  double s = 0;
  TZ_ASSERT_OK(tz_layer_probe_time(cm, &c, 2, 32, 2, &s));
  assert_true(s > 0 && s < 10);
  assert_int_equal(tz_layer_probe_time(cm, &c, 2, 32, 0, &s), TZ_EINVAL);
  assert_true(s == 0);
  struct tz_layer_probe l;
  TZ_ASSERT_OK(tz_layer_probe_alloc(cm, &c, 2, 32, &l));
  TZ_ASSERT_OK(tz_layer_probe_step(cm, &c, &l, 0));
  TZ_ASSERT_OK(tz_compute_sync(cm));
  tz_layer_probe_free(cm, &l);
  tz_layer_probe_free(cm, &l); /* zeroed: a no-op */
  /* every flag on, the forward recomputed in backward as the trainer does */
  struct tz_model_config q = all_on_cfg();
  TZ_ASSERT_OK(tz_layer_probe_alloc(cm, &q, 2, 16, &l));
  TZ_ASSERT_OK(tz_layer_probe_step(cm, &q, &l, TZ_PARTS_ALL));
  TZ_ASSERT_OK(tz_compute_sync(cm));
  tz_layer_probe_free(cm, &l);
  tz_compute_destroy(cm);
}

/* The trainer's working acts (g and u one MLP chunk's): a layer whose MLP the backward recomputes
 * gives the bits it gives with g and u whole, with every part recomputed too; one whose MLP is
 * kept cannot use them (its g and u must hold every row). */
static void work_acts_bits(struct tz_model_config c) {
  int B = 2, T = 9;
  tz_compute *cm;
  struct tz_layer_probe l;
  probe_open(&c, B, T, 91, &cm, &l);
  uint64_t np = tz_model_layer_numel(&c), nx = (uint64_t)B * T * c.d_model;
  float *got[2][2];
  size_t wb = tz_model_acts_work_bytes(&c, TZ_F32, B, T);
  assert_true(wb < tz_model_acts_bytes(&c, TZ_F32, B, T)); /* the caller's chunk is below N */
  void *wmem;
  TZ_ASSERT_OK(tz_compute_alloc(cm, wb, &wmem));
  struct tz_layer_acts work;
  tz_model_acts_work_carve(&c, TZ_F32, B, T, wmem, &work);
  assert_int_equal(work.gu_chunk, 1);
  static const unsigned rec[2] = {TZ_PART_MLP, TZ_PARTS_ALL};
  for (int w = 0; w < 2; w++)
    for (int r = 0; r < 2; r++) {
      const struct tz_layer_acts *a = w ? &work : &l.acts;
      got[w][r] = malloc((np + nx) * sizeof(float));
      assert_non_null(got[w][r]);
      TZ_ASSERT_OK(tz_compute_zero(cm, l.grads, np * sizeof(float)));
      TZ_ASSERT_OK(tz_model_layer_fwd(cm, &c, 0, l.w, l.x_in, l.x_out, a, B, T, NULL));
      TZ_ASSERT_OK(tz_model_layer_bwd(cm, &c, 0, l.w, l.dw, l.x_in, a, rec[r], l.dx_out, l.dx_in,
                                      &l.scratch, B, T, NULL));
      TZ_ASSERT_OK(tz_model_block_download(cm, got[w][r], l.grads, np));
      TZ_ASSERT_OK(tz_model_block_download(cm, got[w][r] + np, l.dx_in, nx));
    }
  for (int r = 0; r < 2; r++)
    if (memcmp(got[0][r], got[1][r], (np + nx) * sizeof(float)) != 0)
      fail_msg("g and u of one chunk changed the backward's bits (recompute %u)", rec[r]);
  assert_true(memcmp(got[0][0], got[0][1], (np + nx) * sizeof(float)) == 0);
  assert_int_equal(tz_model_layer_bwd(cm, &c, 0, l.w, l.dw, l.x_in, &work, 0, l.dx_out, l.dx_in,
                                      &l.scratch, B, T, NULL),
                   TZ_EINVAL);
  for (int w = 0; w < 2; w++)
    free(got[w][0]), free(got[w][1]);
  tz_compute_free(cm, wmem);
  tz_layer_probe_free(cm, &l);
  tz_compute_destroy(cm);
}

/* The dense MLP in chunks of tokens (mlp_chunk): against the float64 reference, with the norms
 * after (OLMo 2) and GeGLU (Gemma 2); the recompute and thread counts change no bit; one chunk of
 * all the rows is the MLP unchunked, bit for bit; the chunk's intermediates are what the
 * activations and scratch hold. */
static void test_mlp_chunks(void **state) {
  (void)state;
  struct tz_model_config cfgs[] = {small_cfg(), all_on_cfg(), olmo2_all_on_cfg(), gemma2_cfg()};
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    struct tz_model_config c = cfgs[i];
    c.mlp_chunk = 4; /* 14 rows: 4, 4, 4, 2; 18 rows: four of 4 and one of 2 */
    compare_with_reference(c, 2, 7, 121 + i);
    recompute_thread_bits(c);
    partial_recompute_bits(c);
    work_acts_bits(c);
  }
  struct tz_model_config c = all_on_cfg();
  struct setup *s = setup_new(c, 2, 9, 131);
  struct result whole = run_cpu(s, 2, 1, 1);
  s->cfg.mlp_chunk = 18;
  struct result one = run_cpu(s, 2, 1, 1);
  assert_true(bits_equal(&s->cfg, &whole, &one, 18));
  result_free(&s->cfg, &whole);
  result_free(&s->cfg, &one);
  setup_free(s);
  assert_int_equal(tz_model_mlp_rows(&c, 18), 18); /* auto: far more than 18 */
  c.mlp_chunk = 4;
  assert_int_equal(tz_model_mlp_rows(&c, 18), 4);
  assert_int_equal(tz_model_mlp_rows(&c, 3), 3);
  struct tz_model_config q;
  TZ_ASSERT_OK(tz_model_preset("llama-7b", &q));
  assert_int_equal(tz_model_mlp_rows(&q, 4 * 2048), 4 * 2048); /* today's shapes: one chunk */
  assert_int_equal(tz_model_mlp_rows(&q, 131072), 24320);      /* 2^28 / 11008, down to 256s */
  /* at 131k tokens the layer's (rows, F) intermediates are a chunk's: a, da, dg, du */
  size_t F = (size_t)q.ffn_dim, es = 2, N = 131072, R = 24320;
  q.mlp_chunk = (int)N;
  size_t whole_b =
      tz_model_acts_bytes(&q, TZ_BF16, 1, (int)N) + tz_model_scratch_bytes(&q, TZ_BF16, 1, (int)N);
  q.mlp_chunk = 0;
  size_t chunked =
      tz_model_acts_bytes(&q, TZ_BF16, 1, (int)N) + tz_model_scratch_bytes(&q, TZ_BF16, 1, (int)N);
  assert_true(whole_b - chunked == 4 * (N - R) * F * es);
}

/* The head in chunks of tokens (head_chunk): against the float64 reference (loss, logits and every
 * gradient, the head's and the tied embedding's among them), with Gemma 2's final softcap; the
 * recompute and thread counts change no bit; the chunk is what the logits' scratch holds; and the
 * automatic chunk: 2^28 / V rows. */
static void test_head_chunks(void **state) {
  (void)state;
  struct tz_model_config cfgs[] = {small_cfg(), all_on_cfg(), gemma2_cfg()};
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    struct tz_model_config c = cfgs[i];
    c.head_chunk = 4; /* 14 rows: 4, 4, 4, 2; 18 rows: four of 4 and one of 2 */
    compare_with_reference(c, 2, 7, 141 + i);
    recompute_thread_bits(c);
  }
  struct tz_model_config c = small_cfg();
  assert_int_equal(tz_model_head_rows(&c, 18), 18); /* auto: far more than 18 */
  c.head_chunk = 4;
  assert_int_equal(tz_model_head_rows(&c, 18), 4);
  assert_int_equal(tz_model_head_rows(&c, 3), 3);
  struct tz_model_config q;
  TZ_ASSERT_OK(tz_model_preset("llama-7b", &q));
  assert_int_equal(tz_model_head_rows(&q, 4 * 2048), 4 * 2048); /* 2^28 / 32000: one chunk */
  q.vocab = 128256;                                             /* Llama 3's vocabulary */
  assert_int_equal(tz_model_head_rows(&q, 131072), 2092);       /* 2^28 / 128256 */
  size_t N = 131072, R = 2092, V = (size_t)q.vocab, es = 2;
  q.head_chunk = (int)N;
  size_t whole = tz_model_head_scratch_bytes(&q, TZ_BF16, 1, (int)N);
  q.head_chunk = 0;
  size_t chunked = tz_model_head_scratch_bytes(&q, TZ_BF16, 1, (int)N);
  assert_true(whole - chunked == (N - R) * V * es);
}

static void test_partial_recompute_bits(void **state) {
  (void)state;
  partial_recompute_bits(all_on_cfg());
  partial_recompute_bits(olmo2_all_on_cfg());
  partial_recompute_bits(gemma2_cfg());
  struct tz_model_config q;
  TZ_ASSERT_OK(tz_model_preset("llama-7b", &q));
  double N = 4.0 * 2048;
  assert_true(tz_model_layer_part_flop(&q, 4, 2048, TZ_PART_ATTN) ==
              2.0 * N * 4.0 * 4096 * 4096 + 2.0 * 4 * 2048.0 * 2048.0 * 4096);
  assert_true(tz_model_layer_part_flop(&q, 4, 2048, TZ_PART_MLP) == 2.0 * N * 3.0 * 4096 * 11008);
  assert_true(tz_model_layer_part_flop(&q, 4, 2048, 0) == 0);
}

static void test_init(void **state) {
  (void)state;
  struct tz_model_config c = small_cfg();
  int blk = tz_model_block_of_layer(&c, 1);
  struct tz_block_layout l;
  TZ_ASSERT_OK(tz_model_block_layout(&c, blk, &l));
  float *all = malloc(sizeof(float) * l.numel), *part = malloc(sizeof(float) * l.numel);
  TZ_ASSERT_OK(tz_model_init_block(&c, blk, 7, 0, l.numel, all));
  /* Any range is the same slice of the whole: shards initialise independently. */
  TZ_ASSERT_OK(tz_model_init_block(&c, blk, 7, 1000, 3333, part));
  assert_memory_equal(part, all + 1000, sizeof(float) * 2333);
  for (int t = 0; t < l.n; t++) {
    if (l.t[t].numel == 0)
      continue;
    const float *x = all + l.t[t].offset;
    double s2 = 0;
    for (uint64_t e = 0; e < l.t[t].numel; e++)
      s2 += (double)x[e] * x[e];
    double rms = sqrt(s2 / l.t[t].numel);
    if (l.t[t].ndim == 1)
      assert_true(rms == 1.0);
    else {
      double want = (t == TZ_L_WO || t == TZ_L_WD) ? 0.02 / sqrt(2.0 * c.n_layer) : 0.02;
      if (fabs(rms - want) > 0.1 * want)
        fail_msg("%s: rms %g, want about %g", l.t[t].name, rms, want);
    }
    uint64_t next = t + 1 < l.n ? l.t[t + 1].offset : l.numel;
    for (uint64_t e = l.t[t].offset + l.t[t].numel; e < next; e++)
      assert_true(all[e] == 0.0f);
  }
  /* Another seed, another layer: different numbers. */
  TZ_ASSERT_OK(tz_model_init_block(&c, blk, 8, 0, l.numel, part));
  assert_memory_not_equal(part + l.t[TZ_L_WQ].offset, all + l.t[TZ_L_WQ].offset, 64);
  TZ_ASSERT_OK(tz_model_init_block(&c, blk - 1, 7, 0, l.numel, part));
  assert_memory_not_equal(part + l.t[TZ_L_WQ].offset, all + l.t[TZ_L_WQ].offset, 64);
  free(all);
  free(part);
}

/* ---- the pad token ---- */

/* pad at the first two tokens, a lone one, a run across the rows' boundary and the last (B*T of
 * at least 14, T of 7 or more). */
static void put_pads(struct setup *s, int pad) {
  int N = s->B * s->T, at[] = {0, 1, 4, s->T - 1, s->T, N - 1};
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
    s->tok[at[i]] = pad;
}

/* transformers builds every family's embedding as nn.Embedding(vocab, hidden, padding_idx =
 * pad_token_id): the lookup gives the pad token's row no gradient. With has_pad, untied, that row's
 * gradient is 0; tied, it is the head's alone (an untied copy whose lm_head is the embedding: its
 * lm_head row, the same bits); every other gradient, the loss and the logits are those of the same
 * run without a pad token, bit for bit. The float64 reference agrees (Gemma's scaled embedding
 * too), and without the host tokens the backward refuses. */
static void test_pad_row(void **state) {
  (void)state;
  const int B = 2, T = 7, N = B * T, pad = 5;
  struct tz_model_config c = small_cfg();
  int C = c.d_model, L = c.n_layer;
  c.pad_id = pad;
  for (int tied = 0; tied < 2; tied++) {
    c.tie_embeddings = tied;
    c.has_pad = 0;
    struct setup *s = setup_new(c, B, T, 141 + (uint64_t)tied);
    put_pads(s, pad);
    struct result off = run_cpu(s, 2, 1, 1);
    s->cfg.has_pad = 1;
    struct result on = run_cpu(s, 2, 1, 1);
    assert_memory_equal(&on.loss, &off.loss, sizeof on.loss);
    assert_memory_equal(on.logits, off.logits, sizeof(float) * N * c.vocab);
    for (int b = 0; b < tz_model_n_blocks(&c); b++)
      for (uint64_t e = 0; e < tz_model_block_numel(&c, b); e++)
        if ((b != 0 || e / (uint64_t)C != (uint64_t)pad) && on.grads[b][e] != off.grads[b][e])
          fail_msg("tied %d: block %d element %llu: %.9g with the pad token, %.9g without", tied, b,
                   (unsigned long long)e, on.grads[b][e], off.grads[b][e]);
    const float *row = on.grads[0] + (size_t)pad * C, *was = off.grads[0] + (size_t)pad * C;
    if (!tied) {
      for (int k = 0; k < C; k++)
        if (row[k] != 0.0f)
          fail_msg("untied: the pad row's gradient [%d] is %.9g, not 0", k, row[k]);
    } else {
      struct tz_model_config u = s->cfg;
      u.tie_embeddings = 0;
      struct setup *su = setup_new(u, B, T, 141);
      memcpy(su->tok, s->tok, sizeof(int32_t) * N);
      memcpy(su->tgt, s->tgt, sizeof(int32_t) * N);
      for (int b = 0; b <= L; b++)
        memcpy(su->hostP[b], s->hostP[b], sizeof(float) * tz_model_block_numel(&c, b));
      struct tz_block_layout lt, lu;
      TZ_ASSERT_OK(tz_model_block_layout(&c, L + 1, &lt));
      TZ_ASSERT_OK(tz_model_block_layout(&u, L + 1, &lu));
      memcpy(su->hostP[L + 1] + lu.t[TZ_H_NORM].offset, s->hostP[L + 1] + lt.t[TZ_H_NORM].offset,
             sizeof(float) * C);
      memcpy(su->hostP[L + 1] + lu.t[TZ_H_LM].offset, s->hostP[0], sizeof(float) * c.vocab * C);
      struct result ru = run_cpu(su, 2, 1, 1);
      assert_memory_equal(&ru.loss, &on.loss, sizeof ru.loss);
      const float *head = ru.grads[L + 1] + lu.t[TZ_H_LM].offset;
      for (int k = 0; k < C; k++)
        if (row[k] != head[(size_t)pad * C + k])
          fail_msg("tied: the pad row's gradient [%d] is %.9g, the head's alone %.9g", k, row[k],
                   head[(size_t)pad * C + k]);
      for (int v = 0; v < c.vocab; v++) /* the other rows: the head's and the lookup's */
        for (int k = 0; k < C; k++) {
          size_t e = (size_t)v * C + k;
          double want = (double)head[e] + ru.grads[0][e];
          if (v != pad && fabs(on.grads[0][e] - want) > 1e-6 * (1.0 + fabs(want)))
            fail_msg("tied: row %d [%d] %.9g, the head's and the lookup's %.9g", v, k,
                     on.grads[0][e], want);
          if (v == pad && ru.grads[0][e] != 0.0f)
            fail_msg("untied copy: the pad row's lookup gradient [%d] is %.9g", k, ru.grads[0][e]);
        }
      result_free(&u, &ru);
      setup_free(su);
    }
    double moved = 0; /* without the rule, the lookup's gradient reached the row */
    for (int k = 0; k < C; k++)
      moved += fabs((double)row[k] - was[k]);
    assert_true(moved > 0);
    compare_setup(s);
    result_free(&c, &on);
    result_free(&c, &off);
    setup_free(s);
  }
  /* Gemma's scaled embedding (the scale applied to dx after the zeroing), against the reference */
  struct tz_model_config g = gemma2_cfg();
  g.has_pad = 1, g.pad_id = pad;
  struct setup *s = setup_new(g, B, T, 143);
  put_pads(s, pad);
  compare_setup(s);
  /* no host tokens: refused; an out-of-range pad_id is no pad token */
  assert_int_equal(tz_model_embed_pad(&g), pad);
  g.pad_id = g.vocab;
  assert_int_equal(tz_model_embed_pad(&g), -1);
  g.pad_id = pad, g.has_pad = 0;
  assert_int_equal(tz_model_embed_pad(&g), -1);
  g.has_pad = 1;
  tz_compute *cm;
  TZ_ASSERT_OK(tz_compute_create("cpu", NULL, &cm));
  void *dx, *dw, *tok;
  TZ_ASSERT_OK(tz_compute_alloc(cm, sizeof(float) * N * g.d_model, &dx));
  TZ_ASSERT_OK(tz_compute_alloc(cm, sizeof(float) * g.vocab * g.d_model, &dw));
  TZ_ASSERT_OK(tz_compute_alloc(cm, sizeof(int32_t) * N, &tok));
  TZ_ASSERT_OK(tz_compute_copy_in(cm, tok, s->tok, sizeof(int32_t) * N));
  assert_int_equal(tz_model_embed_bwd(cm, &g, dw, tok, NULL, dx, B, T), TZ_EINVAL);
  tz_compute_free(cm, dx), tz_compute_free(cm, dw), tz_compute_free(cm, tok);
  tz_compute_destroy(cm);
  setup_free(s);
}

static void test_bad_inputs(void **state) {
  (void)state;
  struct setup *s = setup_new(small_cfg(), 1, 4, 204);
  tz_compute *cm;
  TZ_ASSERT_OK(tz_compute_create("cpu", NULL, &cm));
  int nb = tz_model_n_blocks(&s->cfg);
  void **dP = calloc((size_t)nb, sizeof *dP);
  for (int b = 0; b < nb; b++) {
    size_t bytes = tz_model_block_numel(&s->cfg, b) * sizeof(float);
    TZ_ASSERT_OK(tz_compute_alloc(cm, bytes, &dP[b]));
    TZ_ASSERT_OK(tz_compute_copy_in(cm, dP[b], s->hostP[b], bytes));
  }
  tz_model_runner *r;
  assert_int_equal(tz_model_runner_create(cm, &s->cfg, 1, 17, 1, &r), TZ_EINVAL); /* > max_seq */
  TZ_ASSERT_OK(tz_model_runner_create(cm, &s->cfg, 1, 4, 1, &r));
  float loss;
  s->tok[2] = s->cfg.vocab;
  assert_int_equal(tz_model_runner_step(r, dP, NULL, s->tok, s->tgt, 0, &loss), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "index 2"));
  s->tok[2] = 0;
  s->tgt[3] = -2; /* -1 is TZ_TARGET_IGNORE */
  assert_int_equal(tz_model_runner_step(r, dP, NULL, s->tok, s->tgt, 0, &loss), TZ_EINVAL);
  s->tgt[3] = 0;
  TZ_ASSERT_OK(tz_model_runner_step(r, dP, NULL, s->tok, s->tgt, 0, &loss));
  assert_true(isfinite(loss));
  tz_model_runner_destroy(r);
  for (int b = 0; b < nb; b++)
    tz_compute_free(cm, dP[b]);
  free(dP);
  tz_compute_destroy(cm);
  setup_free(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ref_gqa_untied_odd_t),
      cmocka_unit_test(test_ref_tied_mha),
      cmocka_unit_test(test_ref_wide_mqa),
      cmocka_unit_test(test_ref_qkv_bias),
      cmocka_unit_test(test_ref_qk_norm),
      cmocka_unit_test(test_ref_olmo2),
      cmocka_unit_test(test_ref_gemma2),
      cmocka_unit_test(test_ref_gemma3),
      cmocka_unit_test(test_ref_yarn),
      cmocka_unit_test(test_ref_longrope),
      cmocka_unit_test(test_ref_partial_rotary),
      cmocka_unit_test(test_ref_linear_rope),
      cmocka_unit_test(test_ref_llama3_rope),
      cmocka_unit_test(test_ref_head_dim_wide),
      cmocka_unit_test(test_ref_head_dim_24_tied),
      cmocka_unit_test(test_ref_all_on),
      cmocka_unit_test(test_all_on_bits),
      cmocka_unit_test(test_pad_row),
      cmocka_unit_test(test_layout_families),
      cmocka_unit_test(test_config_check_families),
      cmocka_unit_test(test_init_std),
      cmocka_unit_test(test_checkpoint_bit_exact),
      cmocka_unit_test(test_deterministic_threads),
      cmocka_unit_test(test_grads_accumulate),
      cmocka_unit_test(test_layout),
      cmocka_unit_test(test_layer_probe),
      cmocka_unit_test(test_partial_recompute_bits),
      cmocka_unit_test(test_mlp_chunks),
      cmocka_unit_test(test_head_chunks),
      cmocka_unit_test(test_init),
      cmocka_unit_test(test_bad_inputs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
