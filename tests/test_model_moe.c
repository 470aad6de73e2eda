/* The model's mixture-of-experts layers on the cpu backend against the float64 reference (loss,
 * logits, every gradient), the same bits with recompute, threads and recomputed parts, and the
 * experts as blocks of their own (docs/model.md, "Mixture of experts"). */
#include "model_cases.h"

/* Mixture of experts: 6 experts of width 24, 2 a token, renormalised with the load-balancing
 * loss (Qwen3-MoE with output_router_logits), then 1 a token unnormalised (OLMoE-like, with the
 * q/k norms over the whole projection): loss, logits and every gradient against the float64
 * reference; the same bits with recompute, on other thread counts, and with each part
 * recomputed. */
static struct tz_model_config moe_cfg(void) {
  struct tz_model_config c = small_cfg();
  c.n_expert = 6;
  c.n_expert_used = 2;
  c.moe_ffn_dim = 24;
  c.norm_topk = 1;
  c.router_aux_coef = 0.02;
  c.moe_aux = 1;
  c.qk_norm = TZ_QK_NORM_HEAD;
  return c;
}

static void test_ref_moe(void **state) {
  (void)state;
  struct tz_model_config c = moe_cfg();
  compare_with_reference(c, 2, 7, 301);
  all_on_bits(c);
  partial_recompute_bits(c);
  c.shared_ffn_dim = 20; /* Qwen2-MoE: a shared expert beside the routed ones, q/k/v biases */
  c.qkv_bias = 1;
  c.qk_norm = 0;
  compare_with_reference(c, 2, 7, 303);
  partial_recompute_bits(c);
  c.shared_ffn_dim = 0;
  c.qkv_bias = 0;
  c.n_expert_used = 1;
  c.norm_topk = 0;
  c.moe_aux = 0;
  c.qk_norm = TZ_QK_NORM_ALL;
  compare_with_reference(c, 3, 5, 302);
  /* the active parameters: the dense parts and k of the E experts a layer */
  assert_true(tz_model_n_params(&c) - tz_model_n_active_params(&c) ==
              (uint64_t)c.n_layer * (6 - 1) * 3 * 24 * 32);
  /* the experts' flops: k of them a token, and the router */
  double N = 3.0 * 5;
  assert_true(tz_model_layer_part_flop(&c, 3, 5, TZ_PART_MLP) == 2.0 * N * 32 * (3.0 * 1 * 24 + 6));
}

/* Experts as blocks of their own: a layer with experts is two blocks, its attention's and its
 * MLP's (the MLP norm, the router, the experts, the shared expert), which split the layer's
 * tensors between them; a layer draws the numbers at initialisation it drew as one block (its
 * attention's equal a dense twin's); the forward and backward part by part (the backward the
 * MLP's, then the attention's, as the trainer's phases run them) give the whole layer's bits. */
static void test_moe_blocks(void **state) {
  (void)state;
  struct tz_model_config c = moe_cfg();
  c.shared_ffn_dim = 20;
  int L = c.n_layer, nb = tz_model_n_blocks(&c);
  assert_int_equal(tz_model_layer_blocks(&c), 2);
  assert_int_equal(nb, 2 * L + 2);
  assert_int_equal(tz_model_block_layer(&c, 0), -1);
  assert_int_equal(tz_model_block_layer(&c, nb - 1), -1);
  assert_int_equal(tz_model_block_parts(&c, nb - 1), 0);
  struct tz_block_layout la, lm, lh, whole;
  TZ_ASSERT_OK(tz_model_block_layout(&c, nb - 1, &lh));
  assert_int_equal(lh.kind, TZ_BLOCK_HEAD);
  for (int i = 0; i < L; i++) {
    int b = tz_model_block_of_layer(&c, i);
    assert_int_equal(b, 1 + 2 * i);
    assert_int_equal(tz_model_block_layer(&c, b), i);
    assert_int_equal(tz_model_block_layer(&c, b + 1), i);
    assert_int_equal(tz_model_block_parts(&c, b), TZ_PART_ATTN);
    assert_int_equal(tz_model_block_parts(&c, b + 1), TZ_PART_MLP);
    TZ_ASSERT_OK(tz_model_block_layout(&c, b, &la));
    TZ_ASSERT_OK(tz_model_block_layout(&c, b + 1, &lm));
    assert_int_equal(la.kind, TZ_BLOCK_LAYER);
    assert_int_equal(lm.kind, TZ_BLOCK_MOE);
    assert_int_equal(la.layer, i);
    assert_int_equal(lm.layer, i);
    for (int t = 0; t < TZ_L_COUNT; t++)
      assert_false(la.t[t].numel && lm.t[t].numel);
    static const int mlp[] = {TZ_L_MLP_NORM, TZ_L_WG,  TZ_L_WU,  TZ_L_WD,   TZ_L_ROUTER,
                              TZ_L_SWG,      TZ_L_SWU, TZ_L_SWD, TZ_L_SGATE};
    for (size_t k = 0; k < sizeof mlp / sizeof mlp[0]; k++)
      assert_true(lm.t[mlp[k]].numel > 0 && la.t[mlp[k]].numel == 0);
    assert_true(la.t[TZ_L_WQ].numel > 0 && la.t[TZ_L_ATTN_NORM].numel > 0);
  }
  TZ_ASSERT_OK(tz_model_layer_layout(&c, &whole));
  assert_true(whole.numel == la.numel + lm.numel && whole.numel == tz_model_layer_numel(&c));
  assert_true(whole.t[TZ_L_WG].offset == la.numel + lm.t[TZ_L_WG].offset);
  /* the attention block of layer 1 draws a dense twin's layer-1 numbers */
  struct tz_model_config d = c;
  d.n_expert = d.n_expert_used = 0;
  d.shared_ffn_dim = 0;
  struct tz_block_layout ld;
  TZ_ASSERT_OK(tz_model_block_layout(&d, tz_model_block_of_layer(&d, 1), &ld));
  TZ_ASSERT_OK(tz_model_block_layout(&c, tz_model_block_of_layer(&c, 1), &la));
  float *fd = malloc(sizeof(float) * ld.numel), *fc = malloc(sizeof(float) * la.numel);
  assert_non_null(fd);
  assert_non_null(fc);
  TZ_ASSERT_OK(tz_model_init_block(&d, tz_model_block_of_layer(&d, 1), 5, 0, ld.numel, fd));
  TZ_ASSERT_OK(tz_model_init_block(&c, tz_model_block_of_layer(&c, 1), 5, 0, la.numel, fc));
  assert_memory_equal(fd + ld.t[TZ_L_WQ].offset, fc + la.t[TZ_L_WQ].offset,
                      sizeof(float) * la.t[TZ_L_WQ].numel);
  assert_memory_equal(fd + ld.t[TZ_L_WO].offset, fc + la.t[TZ_L_WO].offset,
                      sizeof(float) * la.t[TZ_L_WO].numel);
  free(fd);
  free(fc);
  /* the trainer keeps no x2 of the attention part: it is the MLP block's input */
  size_t x2 = ((size_t)2 * 7 * c.d_model * sizeof(float) + 255) & ~(size_t)255;
  assert_true(tz_model_acts_kept_bytes(&c, TZ_F32, 2, 7, TZ_PART_ATTN) ==
              tz_model_acts_part_bytes(&c, TZ_F32, 2, 7, TZ_PART_ATTN) - x2);
  assert_true(tz_model_acts_kept_bytes(&d, TZ_F32, 2, 7, TZ_PART_ATTN) ==
              tz_model_acts_part_bytes(&d, TZ_F32, 2, 7, TZ_PART_ATTN));
  /* the layer whole, then part by part */
  int B = 2, T = 7;
  tz_compute *cm;
  struct tz_layer_probe l;
  probe_open(&c, B, T, 55, &cm, &l);
  uint64_t np = tz_model_layer_numel(&c), nx = (uint64_t)B * T * c.d_model;
  float *got[3];
  for (int r = 0; r < 3; r++) {
    got[r] = malloc((np + 2 * nx) * sizeof(float));
    assert_non_null(got[r]);
    TZ_ASSERT_OK(tz_compute_zero(cm, l.grads, np * sizeof(float)));
    if (r == 0) {
      TZ_ASSERT_OK(tz_model_layer_fwd(cm, &c, 1, l.w, l.x_in, l.x_out, &l.acts, B, T, NULL));
      TZ_ASSERT_OK(tz_model_layer_bwd(cm, &c, 1, l.w, l.dw, l.x_in, &l.acts, 0, l.dx_out, l.dx_in,
                                      &l.scratch, B, T, NULL));
    } else {
      unsigned rec = r == 2 ? TZ_PARTS_ALL : 0;
      for (unsigned p = TZ_PART_ATTN; p <= TZ_PART_MLP; p <<= 1)
        TZ_ASSERT_OK(
            tz_model_layer_part_fwd(cm, &c, 1, l.w, l.x_in, l.x_out, &l.acts, p, B, T, NULL));
      TZ_ASSERT_OK(tz_model_layer_part_bwd(cm, &c, 1, l.w, l.dw, l.x_in, &l.acts, TZ_PART_MLP, rec,
                                           l.dx_out, l.dx_in, &l.scratch, B, T, NULL));
      TZ_ASSERT_OK(tz_model_layer_part_bwd(cm, &c, 1, l.w, l.dw, l.x_in, &l.acts, TZ_PART_ATTN, rec,
                                           l.dx_in, l.dx_in, &l.scratch, B, T, NULL));
    }
    TZ_ASSERT_OK(tz_model_block_download(cm, got[r], l.grads, np));
    TZ_ASSERT_OK(tz_model_block_download(cm, got[r] + np, l.dx_in, nx));
    TZ_ASSERT_OK(tz_model_block_download(cm, got[r] + np + nx, l.x_out, nx));
  }
  for (uint64_t i = 0; i < np + 2 * nx; i++)
    assert_true(isfinite(got[0][i]));
  for (int r = 1; r < 3; r++)
    if (memcmp(got[r], got[0], (np + 2 * nx) * sizeof(float)) != 0)
      fail_msg("the layer part by part (recompute %d) changed its bits", r == 2);
  for (int r = 0; r < 3; r++)
    free(got[r]);
  tz_layer_probe_free(cm, &l);
  tz_compute_destroy(cm);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ref_moe),
      cmocka_unit_test(test_moe_blocks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
