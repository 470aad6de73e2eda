/* The float64 reference model against finite differences: every parameter's gradient, on tiny
 * configs with grouped-query attention, tied and untied embeddings and an odd sequence length,
 * and with each flag of the model families (q/k/v biases, q/k norms, llama3 RoPE, head_dim with
 * H*D != d_model) alone and all together. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/error.h"
#include "refmodel.h"
#include "testlib.h"

static struct tz_model_config tiny_cfg(int tie) {
  struct tz_model_config c = {.d_model = 8,
                              .n_layer = 2,
                              .n_head = 2,
                              .n_kv_head = 1,
                              .ffn_dim = 12,
                              .vocab = 7,
                              .max_seq = 8,
                              .rope_theta = 10000.0,
                              .norm_eps = 1e-5,
                              .tie_embeddings = tie};
  return c;
}

static void check_fd(const struct tz_model_config *cfg, int B, int T, uint64_t seed) {
  int N = B * T;
  int32_t *tok = malloc(sizeof *tok * N), *tgt = malloc(sizeof *tgt * N);
  uint64_t st = seed;
  for (int n = 0; n < N; n++) {
    tok[n] = (int32_t)(tz_test_rand(&st) % (uint64_t)cfg->vocab);
    tgt[n] = (int32_t)(tz_test_rand(&st) % (uint64_t)cfg->vocab);
  }
  double **P = ref_blocks_alloc(cfg), **G = ref_blocks_alloc(cfg);
  assert_non_null(P);
  assert_non_null(G);
  /* Weights larger than at initialisation, so that every path carries a visible gradient. */
  ref_blocks_randomize(cfg, P, seed, 0.5);
  double loss;
  TZ_ASSERT_OK(ref_model_run(cfg, P, tok, tgt, B, T, NULL, &loss, G));
  assert_true(isfinite(loss) && loss > 0);
  const double h = 1e-5;
  int checked = 0;
  double worst = 0;
  const char *worst_name = "";
  for (int b = 0; b < tz_model_n_blocks(cfg); b++) {
    struct tz_block_layout l;
    TZ_ASSERT_OK(tz_model_block_layout(cfg, b, &l));
    for (int i = 0; i < l.n; i++) {
      if (l.t[i].numel == 0)
        continue; /* a tensor this config does not have */
      double err2 = 0, ref2 = 0;
      for (uint64_t e = 0; e < l.t[i].numel; e++) {
        double *p = &P[b][l.t[i].offset + e];
        double keep = *p, lp, lm;
        *p = keep + h;
        TZ_ASSERT_OK(ref_model_run(cfg, P, tok, tgt, B, T, NULL, &lp, NULL));
        *p = keep - h;
        TZ_ASSERT_OK(ref_model_run(cfg, P, tok, tgt, B, T, NULL, &lm, NULL));
        *p = keep;
        double fd = (lp - lm) / (2 * h), an = G[b][l.t[i].offset + e];
        /* Each element: relative 1e-6, with an absolute floor for gradients near zero that is
         * far below the finite-difference noise of a loss of order 1. */
        if (fabs(fd - an) > 1e-6 * fabs(an) + 1e-9)
          fail_msg("block %d %s[%llu]: analytic %.12g, finite difference %.12g", b, l.t[i].name,
                   (unsigned long long)e, an, fd);
        err2 += (fd - an) * (fd - an);
        ref2 += an * an;
        checked++;
      }
      assert_true(ref2 > 0); /* every tensor receives a gradient */
      assert_true(sqrt(err2 / ref2) < 1e-6);
      if (sqrt(err2 / ref2) > worst) {
        worst = sqrt(err2 / ref2);
        worst_name = l.t[i].name;
      }
    }
    /* Padding never receives a gradient. */
    for (int i = 0; i < l.n; i++) {
      uint64_t end = l.t[i].offset + l.t[i].numel;
      uint64_t next = i + 1 < l.n ? l.t[i + 1].offset : l.numel;
      for (uint64_t e = end; e < next; e++)
        assert_true(G[b][e] == 0.0);
    }
  }
  assert_true(checked == (int)tz_model_n_params(cfg));
  print_message("%d gradients, worst norm-wise rel error %.2e (%s)\n", checked, worst, worst_name);
  ref_blocks_free(cfg, P);
  ref_blocks_free(cfg, G);
  free(tok);
  free(tgt);
}

static void test_fd_untied_gqa(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  check_fd(&c, 2, 5, 11);
}

static void test_fd_tied_gqa(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(1);
  check_fd(&c, 1, 7, 12);
}

static void test_fd_mha(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.n_kv_head = 2;
  c.n_layer = 1;
  check_fd(&c, 2, 3, 13);
}

static void test_fd_qkv_bias(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.qkv_bias = 1;
  check_fd(&c, 2, 5, 14);
}

static void test_fd_qk_norm(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.qk_norm = 1;
  check_fd(&c, 2, 5, 15);
}

/* OLMo 2: norms on the parts' outputs, q/k norms over the whole projections. */
static void test_fd_olmo2(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.qk_norm = TZ_QK_NORM_ALL;
  c.norm_place = TZ_NORM_POST;
  c.family = TZ_FAMILY_OLMO2;
  check_fd(&c, 2, 5, 16);
}

/* Gemma 2's math: (1 + w) norms on both sides of each part, the tanh-gelu gate, the scaled
 * embedding, the attention's scale and softcap, a window of 2 on the first layer, the final
 * softcap; tied. */
static void test_fd_gemma2(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(1);
  c.norm_place = TZ_NORM_BOTH;
  c.norm_offset = 1;
  c.glu_act = TZ_GLU_GELU_TANH;
  c.embed_scale = 1;
  c.attn_scale = 0.4;
  c.attn_softcap = 1.5;
  c.final_softcap = 2.0;
  c.sliding_window = 2;
  c.window_pattern = 2;
  check_fd(&c, 2, 5, 17);
}

/* Gemma 3's: no softcaps, q/k norms per head with the (1 + w) offset, three layers with the
 * third full and the sliding ones at their own RoPE base. */
static void test_fd_gemma3(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(1);
  c.n_layer = 3;
  c.norm_place = TZ_NORM_BOTH;
  c.norm_offset = 1;
  c.glu_act = TZ_GLU_GELU_TANH;
  c.embed_scale = 1;
  c.attn_scale = 0.4;
  c.qk_norm = TZ_QK_NORM_HEAD;
  c.sliding_window = 2;
  c.window_pattern = 3;
  c.rope_local_theta = 7.0;
  check_fd(&c, 2, 5, 19);
}

/* yarn: its frequencies and its attention factor in the scores' scale. */
static void test_fd_yarn(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.rope_type = TZ_ROPE_YARN;
  c.rope_factor = 4.0;
  c.rope_original_max_pos = 16;
  c.rope_beta_fast = 32;
  c.rope_beta_slow = 1;
  c.rope_truncate = 1;
  c.rope_attn_factor = 1.3;
  check_fd(&c, 2, 5, 23);
}

/* longrope at a sequence above the original length: the long factors, the attention factor. */
static void test_fd_longrope(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.rope_type = TZ_ROPE_LONGROPE;
  c.rope_original_max_pos = 4;
  c.rope_factor = 2.0;
  c.rope_attn_factor = 1.2;
  c.rope_short_factor[0] = 1.0, c.rope_short_factor[1] = 1.5;
  c.rope_long_factor[0] = 2.0, c.rope_long_factor[1] = 5.0;
  check_fd(&c, 2, 5, 29);
}

/* Partial rotary: 6 of each head's 8 dims rotated, the other 2 passed. */
static void test_fd_partial_rotary(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.head_dim = 8;
  c.rope_rot = 6;
  check_fd(&c, 2, 5, 31);
}

/* D = 4: frequencies 1 (wavelength 2 pi, in the smoothed band between 16 / 4 and 16 / 1) and
 * 1/100 (slowed by the factor). */
static struct tz_model_config llama3(struct tz_model_config c) {
  c.rope_type = TZ_ROPE_LLAMA3;
  c.rope_factor = 8.0;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_max_pos = 16;
  return c;
}

static void test_fd_llama3_rope(void **state) {
  (void)state;
  struct tz_model_config c = llama3(tiny_cfg(0));
  check_fd(&c, 1, 7, 16);
}

static void test_fd_head_dim(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.head_dim = 6; /* H*D = 12, C = 8 */
  check_fd(&c, 2, 4, 17);
}

static void test_fd_all_on(void **state) {
  (void)state;
  struct tz_model_config c = llama3(tiny_cfg(1));
  c.head_dim = 6;
  c.qkv_bias = 1;
  c.qk_norm = 1;
  check_fd(&c, 2, 5, 18);
  c.tie_embeddings = 0;
  c.n_kv_head = 2;
  check_fd(&c, 1, 6, 19);
}

/* The reference's loss at uniform logits is log(V): a check that does not depend on itself. */
/* Mixture of experts: 4 experts, 2 a token, the weights renormalised (Qwen3-MoE's
 * norm_topk_prob), per-head q/k norms, and the load-balancing loss; then 3 experts, 1 a token,
 * unnormalised (OLMoE's default) without it. The routing's choice is a step function; the
 * differences move no choice at these weights (a moved one would show as a large error). */
static void test_fd_moe(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  c.n_expert = 4;
  c.n_expert_used = 2;
  c.moe_ffn_dim = 6;
  c.norm_topk = 1;
  c.router_aux_coef = 0.05;
  c.moe_aux = 1;
  c.qk_norm = 1;
  check_fd(&c, 2, 5, 31);
  c.shared_ffn_dim = 5; /* Qwen2-MoE's shared expert, gated, with its q/k/v biases */
  c.qkv_bias = 1;
  check_fd(&c, 2, 5, 33);
  c.shared_ffn_dim = 0;
  c.qkv_bias = 0;
  c.n_expert = 3;
  c.n_expert_used = 1;
  c.norm_topk = 0;
  c.moe_aux = 0;
  c.qk_norm = 0;
  check_fd(&c, 2, 6, 32);
}

static void test_uniform_loss(void **state) {
  (void)state;
  struct tz_model_config c = tiny_cfg(0);
  double **P = ref_blocks_alloc(&c);
  assert_non_null(P);
  ref_blocks_randomize(&c, P, 5, 0.5);
  struct tz_block_layout hl;
  TZ_ASSERT_OK(tz_model_block_layout(&c, c.n_layer + 1, &hl));
  for (uint64_t e = 0; e < hl.t[TZ_H_LM].numel; e++)
    P[c.n_layer + 1][hl.t[TZ_H_LM].offset + e] = 0;
  int32_t tok[4] = {1, 2, 3, 4}, tgt[4] = {0, 6, 2, 5};
  double loss, logits[4 * 7];
  TZ_ASSERT_OK(ref_model_run(&c, P, tok, tgt, 1, 4, logits, &loss, NULL));
  assert_true(fabs(loss - log(7.0)) < 1e-15);
  ref_blocks_free(&c, P);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fd_untied_gqa),
      cmocka_unit_test(test_fd_tied_gqa),
      cmocka_unit_test(test_fd_mha),
      cmocka_unit_test(test_fd_qkv_bias),
      cmocka_unit_test(test_fd_qk_norm),
      cmocka_unit_test(test_fd_olmo2),
      cmocka_unit_test(test_fd_gemma2),
      cmocka_unit_test(test_fd_gemma3),
      cmocka_unit_test(test_fd_yarn),
      cmocka_unit_test(test_fd_longrope),
      cmocka_unit_test(test_fd_partial_rotary),
      cmocka_unit_test(test_fd_llama3_rope),
      cmocka_unit_test(test_fd_head_dim),
      cmocka_unit_test(test_fd_all_on),
      cmocka_unit_test(test_fd_moe),
      cmocka_unit_test(test_uniform_loss),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
