/* One transformer layer of each model family on the cuda backend (bf16 storage, f32 gradients)
 * against the cpu backend (float32): tz_model_layer_fwd, then tz_model_layer_bwd with stored
 * activations, with the forward recomputed and with only its attention or only its MLP part
 * recomputed (the same bits each time), for layers with q/k/v biases (Qwen2), q/k
 * RMSNorm per head (Qwen3), a head_dim that is not d_model / n_head, llama3 RoPE scaling, and
 * all of them at once with a 7:1 grouped-query ratio; a plain Llama layer first, as the control
 * that the harness itself agrees.
 *
 * What is checked, for each config:
 *   - both sides get the same parameters and inputs, rounded to bf16 (the cpu sees exactly the
 *     numbers the cuda side stores): matrices uniform with standard deviation 1/sqrt(fan_in),
 *     biases uniform in [-0.5, 0.5), norm weights 1 + uniform [-0.2, 0.2), so that every tensor
 *     moves the output by O(1) and a kernel that drops or mangles one fails;
 *   - the layer's increments, x_out - x_in and dx_in - dx_out (the residual passes the rest
 *     through unchanged and would hide an error in the layer), and every parameter gradient
 *     tensor, norm-wise: ||cuda - cpu|| / ||cpu|| <= TOL;
 *   - the same calls again give the same bits (forward output, input gradient, every gradient);
 *   - the recomputing backward (activations poisoned with NaN first) gives the same bits as the
 *     one from stored activations;
 *   - the cuda side's activations and backward scratch start as NaN, so anything read before it
 *     is written shows.
 * TOL = 2^-5: one layer's path from the inputs to a gradient crosses about 20 roundings to bf16
 * (about 10 stored activations forward, as many gradients backward), each ~2^-8 / sqrt(3) RMS and
 * independent: sqrt(20) * 2^-8 / sqrt(3) = 0.010 norm-wise; test_compute_cuda's whole tiny model
 * (about 40 roundings) measures 0.008 to 0.018 per tensor. 2^-5 keeps a margin of 3; a missing
 * bias, norm or a wrong rotation moves the checked tensors by O(0.1) to O(1).
 *
 * Exits 77 (skipped) where the build has no CUDA or the machine no CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/compute.h"
#include "testlib.h"
#include "trainer/model/model.h"

#define TOL 0x1p-5

static tz_compute *g_cpu, *g_gpu;
static int g_failures;
static uint64_t g_seed = 2207;

static float urand(float scale) {
  return scale * (float)(2.0 * (double)(tz_test_rand(&g_seed) >> 11) * 0x1.0p-53 - 1.0);
}

static float to_bf16(float x) { return tz_bf16_to_f32(tz_f32_to_bf16(x)); }

static double rel_err(const float *got, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * (double)ref[i];
  }
  return den == 0 ? sqrt(num) : sqrt(num / den);
}

static void check(const char *cfg, const char *what, const float *got, const float *ref, size_t n) {
  double e = rel_err(got, ref, n);
  int ok = e <= TOL; /* NaN fails */
  printf("  %-14s %-34s err %9.3e  tol %9.3e  %s\n", cfg, what, e, TOL, ok ? "ok" : "FAIL");
  if (!ok)
    g_failures++;
}

static void check_bits(const char *cfg, const char *what, const void *a, const void *b,
                       size_t bytes) {
  if (memcmp(a, b, bytes) != 0) {
    printf("  %-14s %-34s differ bit for bit: FAIL\n", cfg, what);
    g_failures++;
  }
}

/* ---- host <-> backend in a dtype ---- */

static void upload(tz_compute *cm, void *dst, const float *v, size_t n, enum tz_dtype dt) {
  size_t es = tz_dtype_size(dt);
  void *p = malloc((n ? n : 1) * es);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) {
    if (dt == TZ_F32)
      ((float *)p)[i] = v[i];
    else
      ((uint16_t *)p)[i] = tz_f32_to_bf16(v[i]);
  }
  TZ_ASSERT_OK(tz_compute_copy_in(cm, dst, p, n * es));
  free(p);
}

static float *download(tz_compute *cm, const void *src, size_t n, enum tz_dtype dt) {
  size_t es = tz_dtype_size(dt);
  void *p = malloc((n ? n : 1) * es);
  float *v = malloc((n ? n : 1) * sizeof *v);
  assert_non_null(p);
  assert_non_null(v);
  TZ_ASSERT_OK(tz_compute_sync(cm));
  TZ_ASSERT_OK(tz_compute_copy_out(cm, p, src, n * es));
  for (size_t i = 0; i < n; i++)
    v[i] = dt == TZ_F32 ? ((const float *)p)[i] : tz_bf16_to_f32(((const uint16_t *)p)[i]);
  free(p);
  return v;
}

/* ---- one layer's buffers on one backend ---- */

struct side {
  tz_compute *cm;
  enum tz_dtype S, G;
  void *params, *grads, *x_in, *x_out, *dx_out, *dx_in, *acts_mem, *scratch_mem;
  size_t acts_bytes, scratch_bytes;
  struct tz_layer_acts acts;
  struct tz_layer_scratch scratch;
};

static void side_open(struct side *s, tz_compute *cm, const struct tz_model_config *cfg, int B,
                      int T) {
  memset(s, 0, sizeof *s);
  s->cm = cm;
  s->S = tz_compute_dtype(cm);
  s->G = tz_compute_grad_dtype(cm);
  uint64_t np = tz_model_layer_numel(cfg);
  size_t nx = (size_t)B * T * cfg->d_model;
  s->acts_bytes = tz_model_acts_bytes(cfg, s->S, B, T);
  s->scratch_bytes = tz_model_scratch_bytes(cfg, s->S, B, T);
  TZ_ASSERT_OK(tz_compute_alloc(cm, np * tz_dtype_size(s->S), &s->params));
  TZ_ASSERT_OK(tz_compute_alloc(cm, np * tz_dtype_size(s->G), &s->grads));
  void **xs[4] = {&s->x_in, &s->x_out, &s->dx_out, &s->dx_in};
  for (int i = 0; i < 4; i++)
    TZ_ASSERT_OK(tz_compute_alloc(cm, nx * tz_dtype_size(s->S), xs[i]));
  TZ_ASSERT_OK(tz_compute_alloc(cm, s->acts_bytes, &s->acts_mem));
  TZ_ASSERT_OK(tz_compute_alloc(cm, s->scratch_bytes, &s->scratch_mem));
  TZ_ASSERT_OK(tz_compute_zero(cm, s->acts_mem, s->acts_bytes));
  TZ_ASSERT_OK(tz_compute_zero(cm, s->scratch_mem, s->scratch_bytes));
  tz_model_acts_carve(cfg, s->S, B, T, s->acts_mem, &s->acts);
  tz_model_scratch_carve(cfg, s->S, B, T, s->scratch_mem, &s->scratch);
}

static void side_close(struct side *s) {
  void *ps[8] = {s->params, s->grads, s->x_in,     s->x_out,
                 s->dx_out, s->dx_in, s->acts_mem, s->scratch_mem};
  for (int i = 0; i < 8; i++)
    tz_compute_free(s->cm, ps[i]);
}

/* NaN over a whole buffer, whatever it holds: bf16 NaN pairs (0x7fc0 0x7fc0) are a float NaN
 * too. bytes is a multiple of 256 (the carving's alignment). */
static void poison(struct side *s, void *p, size_t bytes) {
  TZ_ASSERT_OK(tz_compute_fill(s->cm, TZ_BF16, p, NAN, bytes / 2));
}

/* What one forward and backward leave: host copies, floats. */
struct result {
  float *x_out, *dx_in, *grads;
};

static void result_free(struct result *r) {
  free(r->x_out), free(r->dx_in), free(r->grads);
  memset(r, 0, sizeof *r);
}

/* Forward (unless every part is recomputed), then backward from zeroed gradients, recomputing
 * the parts in recompute (TZ_PART_*); the cuda side's activations and scratch are NaN before,
 * and so are the recomputed parts' activations between the forward and the backward. */
static struct result side_run(struct side *s, const struct tz_model_config *cfg, int B, int T,
                              unsigned recompute) {
  uint64_t np = tz_model_layer_numel(cfg);
  size_t nx = (size_t)B * T * cfg->d_model;
  int gpu = s->cm == g_gpu;
  TZ_ASSERT_OK(tz_compute_zero(s->cm, s->grads, np * tz_dtype_size(s->G)));
  if (gpu) {
    poison(s, s->acts_mem, s->acts_bytes);
    poison(s, s->scratch_mem, s->scratch_bytes);
    TZ_ASSERT_OK(tz_compute_fill(s->cm, s->S, s->x_out, NAN, nx));
    TZ_ASSERT_OK(tz_compute_fill(s->cm, s->S, s->dx_in, NAN, nx));
  }
  struct result r = {0};
  void *w[2], *dw[2];
  tz_model_layer_split(cfg, s->params, s->S, w);
  tz_model_layer_split(cfg, s->grads, s->G, dw);
  if (recompute != TZ_PARTS_ALL) {
    TZ_ASSERT_OK(tz_model_layer_fwd(s->cm, cfg, 0, w, s->x_in, s->x_out, &s->acts, B, T, NULL));
    r.x_out = download(s->cm, s->x_out, nx, s->S);
  }
  if (gpu && recompute != TZ_PARTS_ALL) {
    /* the acts are what the attention part keeps, what the MLP part keeps, then what the
     * backward rebuilds from them (tz_model_acts_carve_parts): the recomputed parts and the
     * rebuilt tensors are poisoned, so a read of either before it is written shows */
    size_t attn = tz_model_acts_part_bytes(cfg, s->S, B, T, TZ_PART_ATTN);
    size_t all = tz_model_acts_part_bytes(cfg, s->S, B, T, TZ_PARTS_ALL);
    if (recompute & TZ_PART_ATTN_OUT) { /* all of the part but att and lse, before x2 */
      size_t o0 = (size_t)((char *)s->acts.att - (char *)s->acts_mem);
      size_t o1 = (size_t)((char *)s->acts.x2 - (char *)s->acts_mem);
      poison(s, s->acts_mem, o0);
      poison(s, (char *)s->acts_mem + o1, attn - o1);
    } else if (recompute & TZ_PART_ATTN) {
      poison(s, s->acts_mem, attn);
    }
    if (recompute & TZ_PART_MLP)
      poison(s, (char *)s->acts_mem + attn, all - attn);
    poison(s, (char *)s->acts_mem + all, s->acts_bytes - all);
  }
  TZ_ASSERT_OK(tz_model_layer_bwd(s->cm, cfg, 0, w, dw, s->x_in, &s->acts, recompute, s->dx_out,
                                  s->dx_in, &s->scratch, B, T, NULL));
  r.dx_in = download(s->cm, s->dx_in, nx, s->S);
  r.grads = download(s->cm, s->grads, np, s->G);
  return r;
}

/* Random parameters of a layer by tensor kind (see the top), rounded to bf16; padding 0. */
static float *layer_params(const struct tz_model_config *cfg) {
  struct tz_block_layout l;
  TZ_ASSERT_OK(tz_model_layer_layout(cfg, &l));
  float *p = calloc(l.numel ? l.numel : 1, sizeof *p);
  assert_non_null(p);
  for (int t = 0; t < l.n; t++) {
    const struct tz_param_info *ti = &l.t[t];
    int norm = t == TZ_L_ATTN_NORM || t == TZ_L_MLP_NORM || t == TZ_L_QNORM || t == TZ_L_KNORM ||
               t == TZ_L_ATTN_POST_NORM || t == TZ_L_MLP_POST_NORM;
    int bias = t == TZ_L_BQ || t == TZ_L_BK || t == TZ_L_BV;
    float a = ti->ndim == 2 ? sqrtf(3.0f / (float)ti->shape[1]) : 0.0f;
    for (uint64_t i = 0; i < ti->numel; i++)
      p[ti->offset + i] = to_bf16(norm ? 1.0f + urand(0.2f) : bias ? urand(0.5f) : urand(a));
  }
  return p;
}

/* One random layer (its parameters by tensor kind, an input and an output gradient, bf16) into
 * both sides; the host copies of the input and the gradient in *x and *dy, the caller's. */
static void sides_fill(struct side *a, struct side *b, const struct tz_model_config *cfg, int B,
                       int T, float **x, float **dy) {
  uint64_t np = tz_model_layer_numel(cfg);
  size_t nx = (size_t)B * T * cfg->d_model;
  float *p = layer_params(cfg);
  *x = malloc(nx * sizeof **x);
  *dy = malloc(nx * sizeof **dy);
  assert_non_null(*x);
  assert_non_null(*dy);
  for (size_t i = 0; i < nx; i++) {
    (*x)[i] = to_bf16(urand(1.0f));
    (*dy)[i] = to_bf16(urand(1.0f));
  }
  struct side *sides[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    upload(sides[i]->cm, sides[i]->params, p, np, sides[i]->S);
    upload(sides[i]->cm, sides[i]->x_in, *x, nx, sides[i]->S);
    upload(sides[i]->cm, sides[i]->dx_out, *dy, nx, sides[i]->S);
  }
  free(p);
}

static void layer_case(const char *name, const struct tz_model_config *cfg, int B, int T) {
  int before = g_failures;
  if (tz_model_config_check(cfg) < 0)
    fail_msg("%s: the config is refused: %s", name, tz_err_msg());
  struct side c, g;
  side_open(&c, g_cpu, cfg, B, T);
  side_open(&g, g_gpu, cfg, B, T);
  uint64_t np = tz_model_layer_numel(cfg);
  size_t nx = (size_t)B * T * cfg->d_model;
  float *x, *dy;
  sides_fill(&c, &g, cfg, B, T, &x, &dy);
  struct result ref = side_run(&c, cfg, B, T, 0);
  struct result got = side_run(&g, cfg, B, T, 0);
  struct result again = side_run(&g, cfg, B, T, 0);
  struct result rec = side_run(&g, cfg, B, T, TZ_PARTS_ALL);
  struct result rec_attn = side_run(&g, cfg, B, T, TZ_PART_ATTN);
  struct result rec_mlp = side_run(&g, cfg, B, T, TZ_PART_MLP);
  struct result rec_proj = side_run(&g, cfg, B, T, TZ_PART_ATTN | TZ_PART_ATTN_OUT);

  /* the increments the layer adds to the residual stream and to its gradient */
  float *inc[2][2];
  struct result *rs[2] = {&ref, &got};
  for (int i = 0; i < 2; i++) {
    inc[i][0] = malloc(nx * sizeof(float));
    inc[i][1] = malloc(nx * sizeof(float));
    assert_non_null(inc[i][0]);
    assert_non_null(inc[i][1]);
    for (size_t j = 0; j < nx; j++) {
      inc[i][0][j] = rs[i]->x_out[j] - x[j];
      inc[i][1][j] = rs[i]->dx_in[j] - dy[j];
    }
  }
  check(name, "x_out - x_in", inc[1][0], inc[0][0], nx);
  check(name, "dx_in - dx_out", inc[1][1], inc[0][1], nx);
  struct tz_block_layout l;
  TZ_ASSERT_OK(tz_model_layer_layout(cfg, &l));
  char what[96];
  for (int t = 0; t < l.n; t++) {
    if (!l.t[t].numel)
      continue;
    snprintf(what, sizeof what, "grad %s", l.t[t].name);
    check(name, what, got.grads + l.t[t].offset, ref.grads + l.t[t].offset, l.t[t].numel);
  }
  check_bits(name, "x_out, second run", got.x_out, again.x_out, nx * sizeof(float));
  check_bits(name, "dx_in, second run", got.dx_in, again.dx_in, nx * sizeof(float));
  check_bits(name, "grads, second run", got.grads, again.grads, np * sizeof(float));
  check_bits(name, "dx_in, recomputed", got.dx_in, rec.dx_in, nx * sizeof(float));
  check_bits(name, "grads, recomputed", got.grads, rec.grads, np * sizeof(float));
  check_bits(name, "dx_in, attention recomputed", got.dx_in, rec_attn.dx_in, nx * sizeof(float));
  check_bits(name, "grads, attention recomputed", got.grads, rec_attn.grads, np * sizeof(float));
  check_bits(name, "dx_in, MLP recomputed", got.dx_in, rec_mlp.dx_in, nx * sizeof(float));
  check_bits(name, "grads, MLP recomputed", got.grads, rec_mlp.grads, np * sizeof(float));
  check_bits(name, "dx_in, attention but its op recomputed", got.dx_in, rec_proj.dx_in,
             nx * sizeof(float));
  check_bits(name, "grads, attention but its op recomputed", got.grads, rec_proj.grads,
             np * sizeof(float));
  printf("  %-14s %s\n", name, g_failures == before ? "ok" : "FAILED");
  for (int i = 0; i < 2; i++)
    free(inc[i][0]), free(inc[i][1]);
  result_free(&ref), result_free(&got), result_free(&again), result_free(&rec);
  result_free(&rec_attn), result_free(&rec_mlp), result_free(&rec_proj);
  free(x), free(dy);
  side_close(&c);
  side_close(&g);
}

/* The shapes: d_model 256, 4 heads on 2 kv heads (head dim 64), SwiGLU 512, T = 100 (more than
 * one attention tile, not a multiple of one), two sequences. llama3 scaling with an original
 * context of 64 (Llama 3.1's factors otherwise), so that T = 100 reaches all three of its
 * frequency bands. */
static struct tz_model_config base_config(void) {
  return (struct tz_model_config){.d_model = 256,
                                  .n_layer = 2,
                                  .n_head = 4,
                                  .n_kv_head = 2,
                                  .ffn_dim = 512,
                                  .vocab = 256,
                                  .max_seq = 128,
                                  .rope_theta = 10000.0,
                                  .norm_eps = 1e-6,
                                  .tie_embeddings = 1};
}

static void set_llama3(struct tz_model_config *c) {
  c->rope_theta = 500000.0;
  c->rope_type = TZ_ROPE_LLAMA3;
  c->rope_factor = 8.0;
  c->rope_low_freq_factor = 1.0;
  c->rope_high_freq_factor = 4.0;
  c->rope_original_max_pos = 64;
}

static void test_llama(void **state) {
  (void)state;
  g_failures = 0;
  struct tz_model_config c = base_config();
  layer_case("llama", &c, 2, 100);
  assert_int_equal(g_failures, 0);
}

static void test_qkv_bias(void **state) {
  (void)state;
  g_failures = 0;
  struct tz_model_config c = base_config();
  c.family = TZ_FAMILY_QWEN2;
  c.qkv_bias = 1;
  layer_case("qkv_bias", &c, 2, 100);
  assert_int_equal(g_failures, 0);
}

static void test_qk_norm(void **state) {
  (void)state;
  g_failures = 0;
  struct tz_model_config c = base_config();
  c.family = TZ_FAMILY_QWEN3;
  c.qk_norm = 1;
  layer_case("qk_norm", &c, 2, 100);
  assert_int_equal(g_failures, 0);
}

/* The trainer's working acts (g and u one MLP chunk's, tz_model_acts_work_carve) on the GPU: the
 * MLP recomputed chunk by chunk gives the bits of g and u whole. */
static void work_case(const char *name, const struct tz_model_config *cfg, int B, int T) {
  int before = g_failures;
  struct side g, w;
  side_open(&g, g_gpu, cfg, B, T);
  side_open(&w, g_gpu, cfg, B, T);
  assert_true(tz_model_acts_work_bytes(cfg, w.S, B, T) < w.acts_bytes);
  tz_model_acts_work_carve(cfg, w.S, B, T, w.acts_mem, &w.acts);
  uint64_t np = tz_model_layer_numel(cfg);
  size_t nx = (size_t)B * T * cfg->d_model;
  float *x, *dy;
  sides_fill(&g, &w, cfg, B, T, &x, &dy);
  struct result whole = side_run(&g, cfg, B, T, TZ_PART_MLP);
  struct result chunk = side_run(&w, cfg, B, T, TZ_PART_MLP);
  check_bits(name, "x_out, working acts", whole.x_out, chunk.x_out, nx * sizeof(float));
  check_bits(name, "dx_in, working acts", whole.dx_in, chunk.dx_in, nx * sizeof(float));
  check_bits(name, "grads, working acts", whole.grads, chunk.grads, np * sizeof(float));
  printf("  %-14s %s\n", name, g_failures == before ? "ok" : "FAILED");
  result_free(&whole), result_free(&chunk);
  free(x), free(dy);
  side_close(&g);
  side_close(&w);
}

/* The MLP in chunks of 48 tokens (200 rows: four of 48 and one of 8), against the cpu backend in
 * the same chunks, and with the recompute; then with the norms after (OLMo 2). */
static void test_mlp_chunks(void **state) {
  (void)state;
  g_failures = 0;
  struct tz_model_config c = base_config();
  c.mlp_chunk = 48;
  layer_case("mlp chunks", &c, 2, 100);
  work_case("working acts", &c, 2, 100);
  c.family = TZ_FAMILY_OLMO2;
  c.qk_norm = TZ_QK_NORM_ALL;
  c.norm_place = TZ_NORM_POST;
  layer_case("olmo2 chunks", &c, 2, 100);
  work_case("olmo2 working", &c, 2, 100);
  assert_int_equal(g_failures, 0);
}

/* OLMo 2: the norms on the parts' outputs and q/k norms over the whole projections (widths
 * H*D = 256 and Hkv*D); then with biases and 7:1 grouped-query attention. */
static void test_olmo2(void **state) {
  (void)state;
  g_failures = 0;
  struct tz_model_config c = base_config();
  c.family = TZ_FAMILY_OLMO2;
  c.qk_norm = TZ_QK_NORM_ALL;
  c.norm_place = TZ_NORM_POST;
  layer_case("olmo2", &c, 2, 100);
  c.n_head = 14;
  c.n_kv_head = 2;
  c.head_dim = 64;
  c.qkv_bias = 1;
  layer_case("olmo2 7:1 biases", &c, 2, 100);
  assert_int_equal(g_failures, 0);
}

static void test_head_dim(void **state) {
  (void)state;
  g_failures = 0;
  struct tz_model_config c = base_config();
  c.head_dim = 80; /* d_model / n_head is 64; the tensor cores' padded width 80 */
  layer_case("head_dim 80", &c, 2, 100);
  c.head_dim = 128; /* wider than d_model / n_head: H*D = 512 > d_model */
  layer_case("head_dim 128", &c, 2, 100);
  assert_int_equal(g_failures, 0);
}

static void test_llama3_rope(void **state) {
  (void)state;
  g_failures = 0;
  struct tz_model_config c = base_config();
  set_llama3(&c);
  layer_case("rope llama3", &c, 2, 100);
  assert_int_equal(g_failures, 0);
}

/* Everything at once: Qwen3-like (q/k norm, head dim 128 on d_model 256) with q/k/v biases,
 * llama3 RoPE and 14 query heads on 2 kv heads (Qwen2.5's 7:1). */
static void test_all(void **state) {
  (void)state;
  g_failures = 0;
  struct tz_model_config c = base_config();
  c.n_head = 14;
  c.n_kv_head = 2;
  c.head_dim = 128;
  c.ffn_dim = 640;
  c.qkv_bias = 1;
  c.qk_norm = 1;
  set_llama3(&c);
  layer_case("all", &c, 2, 100);
  c.head_dim = 64; /* 14 * 64 = 896 != 256 still */
  layer_case("all, D=64", &c, 1, 77);
  assert_int_equal(g_failures, 0);
}

static int group_setup(void **state) {
  (void)state;
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  p.dtype = TZ_BF16;
  p.grad_dtype = TZ_F32;
  if (tz_compute_create("cuda", &p, &g_gpu) < 0) {
    fprintf(stderr, "cuda bf16 instance: %s\n", tz_err_msg());
    return -1;
  }
  tz_compute_params_init(&p);
  if (tz_compute_create("cpu", &p, &g_cpu) < 0) {
    fprintf(stderr, "cpu instance: %s\n", tz_err_msg());
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  tz_compute_destroy(g_gpu);
  tz_compute_destroy(g_cpu);
  return 0;
}

int main(void) {
  char why[256];
  if (tz_compute_probe("cuda", why, sizeof why) < 0)
    tz_test_skip("%s", why);
  tz_compute *probe;
  int rc = tz_compute_create("cuda", NULL, &probe);
  if (rc == TZ_ENOTSUP)
    tz_test_skip("%s", tz_err_msg());
  if (rc == 0)
    tz_compute_destroy(probe);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_llama),    cmocka_unit_test(test_qkv_bias),
      cmocka_unit_test(test_qk_norm),  cmocka_unit_test(test_olmo2),
      cmocka_unit_test(test_head_dim), cmocka_unit_test(test_llama3_rope),
      cmocka_unit_test(test_all),      cmocka_unit_test(test_mlp_chunks),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
