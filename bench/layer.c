/* tz-bench layer: one transformer layer, forward + backward, on the cuda compute backend in bf16,
 * timed beside the same layer in PyTorch (bf16, scaled_dot_product_attention pinned to its flash
 * backend; tools/bench_layer_torch.py) run in the same invocation. Also attention forward +
 * backward alone on both, the GEMM ceiling (bf16 8192^3 by default through the backend's
 * matmul, and torch.matmul), and each op's share of the layer time. Attention again with
 * tierzero.cuda_attention two-pass (the mma.sync kernels, which auto leaves for the warpgroup-MMA
 * ones at bf16 on an sm_90 device; elsewhere auto's own: then equal to the default row), on an
 * instance of its own over the same buffers, and the default's attention once more after it
 * (what the rows' order moves).
 *
 * Times are wall-clock between tz_compute_sync calls (the backend's stream drained before and
 * after), medians over --iters runs after --warmup; the layer and attention alone, and
 * PyTorch's, are timed in turn for --rounds rounds and each side's figure is its median over
 * them. The op shares come from one more pass through
 * a timed instance (kernels/compute_timed.h) that drains the stream around every call; they
 * are shares of the sum of those per-call times (which include a few microseconds of launch and
 * sync per call), not of the median above. Each op's rate sits beside them: TFLOP/s for the
 * products, and for the memory-bound ops GB/s of the least traffic their arguments imply, set
 * beside a device-to-device copy (the copy ceiling, read + write) timed in the same run.
 *
 * FLOPs (counted the same way for both sides): a layer's forward is 2 N (C HD + 2 C KD + HD C +
 * 3 C F) for the projections plus 2 B H T^2 D for causal attention (QK^T and PV over the lower
 * triangle); forward + backward is 3x that. Attention forward + backward alone is 3.5x its forward
 * (the backward's five products, as flash-attention benchmarks count). */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/error.h"
#include "kernels/compute.h"
#include "kernels/compute_timed.h"
#include "trainer/model/model.h"
#include "util/clock.h"

/* ---- the op shares: names of the timed instance's counters (kernels/compute_timed.h) ---- */

static const char *const op_names[TZ_OP_COUNT] = {
    [TZ_OP_MATMUL_NT] = "matmul x W^T",
    [TZ_OP_MATMUL_NN] = "matmul dy W",
    [TZ_OP_MATMUL_TN] = "matmul dy^T x",
    [TZ_OP_ATTENTION_FWD] = "attention_fwd",
    [TZ_OP_ATTENTION_BWD] = "attention_bwd",
    [TZ_OP_RMSNORM_FWD] = "rmsnorm_fwd",
    [TZ_OP_RMSNORM_BWD] = "rmsnorm_bwd",
    [TZ_OP_ROPE] = "rope",
    [TZ_OP_BIAS_ADD] = "bias_add",
    [TZ_OP_BIAS_GRAD] = "bias_grad",
    [TZ_OP_SWIGLU_FWD] = "swiglu_fwd",
    [TZ_OP_SWIGLU_BWD] = "swiglu_bwd",
    [TZ_OP_ADD] = "add",
    [TZ_OP_COPY] = "copy",
    [TZ_OP_OTHER] = "other",
};

/* ---- set-up ---- */

struct opts {
  int C, F, H, Hkv, T, B, iters, warmup, torch, json;
  int rounds; /* the layer and attention, then PyTorch's, this many times in turn */
  int gemm;   /* the ceiling's GEMM size: gemm^3 */
  /* attention alone with these variants (compute.h, struct tz_attn_opts; 0: none), its FLOP
   * counted over the (query, key) pairs it computes, so that its TFLOP/s is per computed tile */
  int window;
  float softcap;
  /* packed documents of heavy-tailed lengths with this mean (0: each row one document), in the
   * layer and attention alone: tokens per second counting every row token, attention's FLOP over
   * the pairs inside documents */
  int docs;
  /* attention alone, its forward + backward timed for --rounds rounds, nothing else: a kernel
   * change's A/B in seconds a run */
  int attn_only;
  /* a mixture-of-experts MLP (E experts of width Fe, k a token, norm_topk: the k weights
   * renormalised) in place of the SwiGLU; E 0: none */
  int E, k, Fe, norm_topk;
  enum tz_dtype G;
  const char *python, *script;
};

/* Fills n elements of dtype dt at dst with uniform values in [-scale, scale): a host pattern of
 * `chunk` values cast on the device over and over. */
static int fill_random(tz_compute *cm, void *dst, enum tz_dtype dt, size_t n, float scale,
                       uint64_t seed) {
  enum { CHUNK = 1 << 20 };
  float *h = malloc(CHUNK * sizeof *h);
  void *tmp = NULL;
  int rc = h ? tz_compute_alloc(cm, CHUNK * sizeof(float), &tmp)
             : tz_err_set(TZ_ENOMEM, "bench layer: out of memory");
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; rc == 0 && i < CHUNK; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    h[i] = scale * (float)((double)(s >> 11) * 0x1.0p-52 - 1.0);
  }
  if (rc == 0)
    rc = tz_compute_copy_in(cm, tmp, h, CHUNK * sizeof(float));
  for (size_t off = 0; rc == 0 && off < n; off += CHUNK) {
    size_t len = n - off < CHUNK ? n - off : CHUNK;
    rc = tz_compute_cast(cm, (char *)dst + off * tz_dtype_size(dt), dt, tmp, TZ_F32, len);
  }
  if (rc == 0)
    rc = tz_compute_sync(cm);
  tz_compute_free(cm, tmp);
  free(h);
  return rc;
}

/* The layer's buffers (tz_layer_probe) with weights ~ 0.02 (norm weights too: the values do not
 * change the time), inputs of order one, an upstream gradient of a mean loss's size. */
static int layer_alloc(tz_compute *cm, const struct tz_model_config *cfg, const struct opts *o,
                       struct tz_layer_probe *l) {
  TZ_CHECK(tz_layer_probe_alloc(cm, cfg, o->B, o->T, l));
  enum tz_dtype S = tz_compute_dtype(cm);
  uint64_t np = tz_model_layer_numel(cfg);
  size_t x = (size_t)o->B * o->T * o->C;
  int rc = fill_random(cm, l->params, S, np, 0.02f, 1);
  if (rc == 0)
    rc = fill_random(cm, l->x_in, S, x, 1.0f, 2);
  if (rc == 0)
    rc = fill_random(cm, l->dx_out, S, x, 1e-3f, 3);
  if (rc < 0)
    tz_layer_probe_free(cm, l);
  return rc;
}

static int attn_step(tz_compute *cm, const struct tz_model_config *cfg, const struct opts *o,
                     struct tz_layer_probe *l) {
  int D = tz_model_head_dim(cfg);
  const struct tz_attn_opts var = {.softcap = o->softcap, .window = o->window};
  const struct tz_attn_opts *opt = o->window || o->softcap > 0 ? &var : NULL;
  TZ_CHECK(tz_compute_attention_fwd(cm, l->acts.att, l->acts.lse, l->acts.q, l->acts.k, l->acts.v,
                                    o->B, o->T, o->H, o->Hkv, D, l->pos, opt));
  return tz_compute_attention_bwd(cm, l->scratch.dq, l->scratch.dk, l->scratch.dv, l->scratch.delta,
                                  l->scratch.datt, l->acts.q, l->acts.k, l->acts.v, l->acts.att,
                                  l->acts.lse, o->B, o->T, o->H, o->Hkv, D, l->pos, opt);
}

/* Positions of packed documents for B rows of T tokens (host, B*T): lengths drawn from a Pareto
 * law of shape 2 (heavy-tailed, as chat data's are) with mean `mean`, from a fixed seed, the last
 * of a row cut at its end; *pairs gets the (query, key) pairs causal attention inside the
 * documents computes, *n_docs their number. */
static void doc_positions(int32_t *pos, int B, int T, int mean, double *pairs, int *n_docs) {
  uint64_t st = 0x9e3779b97f4a7c15ull;
  *pairs = 0;
  *n_docs = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T;) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      double u = ((double)(st >> 11) + 1.0) / 9007199254740993.0; /* (0, 1] */
      int len = (int)ceil(mean / 2.0 / sqrt(u));
      if (len > T - t)
        len = T - t;
      for (int i = 0; i < len; i++)
        pos[(size_t)b * T + t + i] = i;
      *pairs += (double)len * (len + 1) / 2;
      (*n_docs)++;
      t += len;
    }
}

/* The (query, key) pairs causal attention over T tokens computes: T (T + 1) / 2, or with a window
 * W each query's last W keys at most. */
static double attn_pairs(int T, int W) {
  if (W <= 0 || W >= T)
    return (double)T * (T + 1) / 2;
  return (double)W * (W + 1) / 2 + (double)(T - W) * W;
}

/* The copy ceiling's copies a step: the memory-bound ops' GB/s are set beside it */
#define COPY_REPS 8

/* What a timed step runs. */
struct step {
  tz_compute *cm;
  const struct tz_model_config *cfg;
  const struct opts *o;
  struct tz_layer_probe *l;
  int which; /* 0 the layer, 1 attention alone, 2 the GEMM, 3 the copy ceiling */
  void *A, *B, *C;
};

static int step_run(const struct step *s) {
  switch (s->which) {
  case 0: return tz_layer_probe_step(s->cm, s->cfg, s->l, 0);
  case 1: return attn_step(s->cm, s->cfg, s->o, s->l);
  case 2: {
    int n = s->o->gemm;
    return tz_compute_matmul(s->cm, 0, 0, n, n, n, 1.0f, s->A, n, s->B, n, 0.0f, s->C, TZ_BF16, n);
  }
  default: /* COPY_REPS device-to-device copies of the GEMM's A into C */
    for (int i = 0; i < COPY_REPS; i++)
      TZ_CHECK(tz_compute_copy(s->cm, s->C, s->A, (size_t)s->o->gemm * s->o->gemm * 2));
    return 0;
  }
}

/* *out = median seconds of `iters` runs of the step after `warmup`, the stream drained around
 * each run. */
static int time_median(const struct step *s, int warmup, int iters, double *out) {
  double *ts = calloc((size_t)iters, sizeof *ts);
  if (!ts)
    return tz_err_set(TZ_ENOMEM, "bench layer: out of memory");
  int rc = 0;
  for (int i = 0; i < warmup + iters && rc == 0; i++) {
    rc = tz_compute_sync(s->cm);
    double t0 = tz_now_s();
    if (rc == 0)
      rc = step_run(s);
    if (rc == 0)
      rc = tz_compute_sync(s->cm);
    if (i >= warmup)
      ts[i - warmup] = tz_now_s() - t0;
  }
  if (rc == 0)
    *out = tz_bench_median(ts, iters);
  free(ts);
  return rc;
}

/* One pass of the layer through the timing wrapper (each op timed alone): *times. */
static int op_shares(tz_compute *cm, const struct tz_model_config *cfg, struct tz_layer_probe *l,
                     struct tz_compute_times *times) {
  tz_compute *timed = NULL;
  int rc = tz_compute_timed_create(cm, times, &timed);
  if (rc == 0)
    rc = tz_layer_probe_step(timed, cfg, l, 0);
  if (rc == 0)
    rc = tz_compute_sync(cm);
  tz_compute_destroy(timed);
  return rc;
}

/* ---- the comparison ---- */

struct torch_result {
  int ok;
  char why[256];
  double layer_ms, attn_ms, gemm_tflops;
  char version[64], device[128];
};

static void run_torch(const struct opts *o, struct torch_result *r) {
  memset(r, 0, sizeof *r);
  char cmd[2048], moe[128] = "";
  if (o->E)
    snprintf(moe, sizeof moe, " --experts %d --experts-used %d --moe-ffn %d%s", o->E, o->k, o->Fe,
             o->norm_topk ? " --norm-topk" : "");
  snprintf(cmd, sizeof cmd,
           "%s '%s' --d-model %d --ffn %d --heads %d --kv-heads %d --seq %d --batch %d "
           "--iters %d --warmup %d --gemm-size %d%s 2>&1",
           o->python, o->script, o->C, o->F, o->H, o->Hkv, o->T, o->B, o->iters, o->warmup, o->gemm,
           moe);
  FILE *p = popen(cmd, "r");
  if (!p) {
    snprintf(r->why, sizeof r->why, "cannot run %s", o->python);
    return;
  }
  /* The JSON is the last line that parses; anything else (warnings) is passed through. */
  char line[8192];
  json_t *last = NULL;
  while (fgets(line, sizeof line, p)) {
    json_t *j = line[0] == '{' ? json_loads(line, 0, NULL) : NULL;
    if (j) {
      json_decref(last);
      last = j;
    } else if (!o->json) {
      fprintf(stderr, "pytorch: %s", line);
    }
  }
  int st = pclose(p);
  const char *err = last ? json_string_value(json_object_get(last, "error")) : NULL;
  if (!last || err) {
    snprintf(r->why, sizeof r->why, "%s", err ? err : "no result (exit status %d)");
    if (!err)
      snprintf(r->why, sizeof r->why, "no result from %s (exit status %d)", o->script, st);
    json_decref(last);
    return;
  }
  r->layer_ms = json_number_value(json_object_get(last, "layer_ms"));
  r->attn_ms = json_number_value(json_object_get(last, "attn_ms"));
  r->gemm_tflops = json_number_value(json_object_get(last, "gemm_tflops"));
  const char *v = json_string_value(json_object_get(last, "torch"));
  const char *d = json_string_value(json_object_get(last, "device"));
  snprintf(r->version, sizeof r->version, "%s", v ? v : "?");
  snprintf(r->device, sizeof r->device, "%s", d ? d : "?");
  r->ok = r->layer_ms > 0 && r->attn_ms > 0;
  if (!r->ok)
    snprintf(r->why, sizeof r->why, "incomplete result from %s", o->script);
  json_decref(last);
}

/* One line of the table; theirs < 0: not measured. With is_time the speed column is theirs / ours
 * (above 1: faster than PyTorch). */
static void row(const char *name, double ours, double theirs, int is_time, const char *target) {
  char t[32] = "-", r[32] = "";
  if (theirs >= 0)
    snprintf(t, sizeof t, "%12.3f", theirs);
  if (theirs >= 0 && is_time)
    snprintf(r, sizeof r, "%8.3f", theirs / ours);
  printf("%-28s %12.3f %12s %8s %8s\n", name, ours, t, r, target);
}

#define MAX_ROUNDS 16

/* The median of v[0..n), v left as it is (tz_bench_median sorts). */
static double median_of(const double *v, int n) {
  double c[MAX_ROUNDS];
  memcpy(c, v, sizeof *c * (size_t)n);
  return tz_bench_median(c, n);
}

static int bench(const struct opts *o) {
  struct tz_model_config cfg = {.d_model = o->C,
                                .n_layer = 1,
                                .n_head = o->H,
                                .n_kv_head = o->Hkv,
                                .ffn_dim = o->F,
                                .vocab = 256,
                                .max_seq = o->T,
                                .rope_theta = 10000.0,
                                .norm_eps = 1e-5,
                                .tie_embeddings = 1, /* the family fields 0: a Llama layer */
                                .n_expert = o->E,
                                .n_expert_used = o->k,
                                .moe_ffn_dim = o->Fe,
                                .norm_topk = o->norm_topk};
  TZ_CHECK(tz_model_config_check(&cfg));
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  p.dtype = TZ_BF16;
  p.grad_dtype = o->G;
  tz_compute *cm;
  TZ_CHECK(tz_compute_create("cuda", &p, &cm));
  struct tz_layer_probe l;
  int rc = layer_alloc(cm, &cfg, o, &l);
  if (rc < 0) {
    tz_compute_destroy(cm);
    return rc;
  }
  /* 2 B H T^2 D, as flash-attention benchmarks count causal attention (4 B H D per pair, over
   * T^2 / 2 pairs); with a window or documents, over the pairs it computes */
  double share = attn_pairs(o->T, o->window) / attn_pairs(o->T, 0);
  void *pos_dev = NULL;
  if (o->docs) {
    int32_t *pos = malloc(sizeof *pos * (size_t)o->B * o->T);
    double pairs = 0;
    int n_docs = 0;
    rc = pos ? 0 : tz_err_set(TZ_ENOMEM, "layer: no memory for %d x %d positions", o->B, o->T);
    if (rc == 0) {
      doc_positions(pos, o->B, o->T, o->docs, &pairs, &n_docs);
      share = pairs / (o->B * attn_pairs(o->T, 0));
      rc = tz_compute_alloc(cm, sizeof *pos * (size_t)o->B * o->T, &pos_dev);
    }
    if (rc == 0)
      rc = tz_compute_copy_in(cm, pos_dev, pos, sizeof *pos * (size_t)o->B * o->T);
    if (rc == 0)
      rc = tz_compute_sync(cm);
    free(pos);
    if (rc < 0) {
      tz_compute_free(cm, pos_dev);
      tz_layer_probe_free(cm, &l);
      tz_compute_destroy(cm);
      return rc;
    }
    l.pos = pos_dev;
    if (!o->json)
      printf("packed documents: %d in %d rows of %d tokens (heavy-tailed lengths, mean %d asked, "
             "%.1f had); attention computes %.3f of the causal pairs\n",
             n_docs, o->B, o->T, o->docs, (double)o->B * o->T / n_docs, share);
  }
  double t_layer = 0, t_attn = 0, t_gemm = 0;
  int D = tz_model_head_dim(&cfg);
  double attn_fwd_flops = 2.0 * o->B * o->H * (double)o->T * o->T * D * share;
  double layer_flops = 3.0 * tz_model_layer_flop(&cfg, o->B, o->T);
  double attn_flops = 3.5 * attn_fwd_flops;
  if (o->attn_only) {
    struct step sa = {.cm = cm, .cfg = &cfg, .o = o, .l = &l, .which = 1};
    double ra[MAX_ROUNDS];
    for (int r = 0; r < o->rounds && rc == 0; r++)
      rc = time_median(&sa, o->warmup, o->iters, &ra[r]);
    tz_layer_probe_free(cm, &l);
    tz_compute_free(cm, pos_dev);
    tz_compute_destroy(cm);
    if (rc < 0)
      return rc;
    printf("attention fwd+bwd: B %d T %d H %d/%d D %d window %d softcap %g, %.3f of the causal "
           "pairs; ms a round:",
           o->B, o->T, o->H, o->Hkv, D, o->window, o->softcap, share);
    for (int r = 0; r < o->rounds; r++)
      printf(" %.3f", ra[r] * 1e3);
    t_attn = median_of(ra, o->rounds);
    printf("; median %.3f ms, %.1f TFLOP/s per computed pair\n", t_attn * 1e3,
           attn_flops / t_attn / 1e12);
    return 0;
  }

  /* The layer and attention alone, then PyTorch's, in turn for o->rounds rounds: each side's
   * figure is its median over the rounds, so a drift of the machine's clocks between the two
   * processes moves both (one run of each moved the layer's ratio by 8% between runs). */
  struct step st = {.cm = cm, .cfg = &cfg, .o = o, .l = &l, .which = 0};
  double rl[MAX_ROUNDS] = {0}, ra[MAX_ROUNDS] = {0}, pl[MAX_ROUNDS] = {0};
  double pa[MAX_ROUNDS] = {0}, pg[MAX_ROUNDS] = {0};
  struct torch_result tr;
  memset(&tr, 0, sizeof tr);
  snprintf(tr.why, sizeof tr.why, "--no-torch");
  int torch = o->torch, n_torch = 0;
  for (int r = 0; r < o->rounds && rc == 0; r++) {
    st.which = 0;
    rc = time_median(&st, o->warmup, o->iters, &rl[r]);
    st.which = 1;
    if (rc == 0)
      rc = time_median(&st, o->warmup, o->iters, &ra[r]);
    if (rc == 0 && torch) {
      struct torch_result t;
      run_torch(o, &t);
      if (!t.ok) { /* its reason stands for the table; no further rounds of it */
        tr = t;
        torch = 0;
        continue;
      }
      if (n_torch == 0)
        tr = t;
      pl[n_torch] = t.layer_ms, pa[n_torch] = t.attn_ms, pg[n_torch] = t.gemm_tflops;
      n_torch++;
    }
  }
  if (rc == 0) {
    t_layer = median_of(rl, o->rounds);
    t_attn = median_of(ra, o->rounds);
  }
  if (torch && n_torch == o->rounds) {
    tr.layer_ms = median_of(pl, n_torch);
    tr.attn_ms = median_of(pa, n_torch);
    tr.gemm_tflops = median_of(pg, n_torch);
  }
  struct tz_compute_times times;
  memset(&times, 0, sizeof times);
  /* Attention again with the mma.sync kernels (tierzero.cuda_attention two-pass), on an instance
   * of its own over the same buffers: auto takes the warpgroup-MMA ones where they build (bf16,
   * sm_90; kernels/cuda/choice.c), so this row is what they gain. */
  double t_twopass = 0;
  if (rc == 0) {
    struct tz_compute_params q = p;
    q.settings = "attention=two-pass";
    struct step s2 = st;
    rc = tz_compute_create("cuda", &q, &s2.cm);
    if (rc == 0)
      rc = time_median(&s2, o->warmup, o->iters, &t_twopass);
    tz_compute_destroy(s2.cm);
  }
  /* The default's attention once more, last: a row that moves between its two timings moved with
   * the machine (clocks, the order of the rows), not with its kernels. */
  double t_attn_again = 0;
  if (rc == 0)
    rc = time_median(&st, o->warmup, o->iters, &t_attn_again);
  if (rc == 0)
    rc = op_shares(cm, &cfg, &l, &times);
  tz_layer_probe_free(cm, &l);
  tz_compute_free(cm, pos_dev);
  size_t gemm_bytes = (size_t)o->gemm * o->gemm * 2;
  st.which = 2;
  if (rc == 0)
    rc = tz_compute_alloc(cm, gemm_bytes, &st.A);
  if (rc == 0)
    rc = tz_compute_alloc(cm, gemm_bytes, &st.B);
  if (rc == 0)
    rc = tz_compute_alloc(cm, gemm_bytes, &st.C);
  if (rc == 0)
    rc = fill_random(cm, st.A, TZ_BF16, gemm_bytes / 2, 1.0f, 4);
  if (rc == 0)
    rc = fill_random(cm, st.B, TZ_BF16, gemm_bytes / 2, 1.0f, 5);
  if (rc == 0)
    rc = time_median(&st, 2, 5, &t_gemm);
  double t_copy = 0;
  st.which = 3;
  if (rc == 0)
    rc = time_median(&st, 2, 5, &t_copy);
  tz_compute_free(cm, st.A);
  tz_compute_free(cm, st.B);
  tz_compute_free(cm, st.C);
  tz_compute_destroy(cm);
  if (rc < 0)
    return rc;

  double gemm_tflops = 2.0 * o->gemm * (double)o->gemm * o->gemm / t_gemm / 1e12;
  double copy_gbps = 2.0 * COPY_REPS * (double)gemm_bytes / t_copy / 1e9; /* read + write */
  double op_total = 0;
  for (int i = 0; i < TZ_OP_COUNT; i++)
    op_total += times.seconds[i];
  if (o->json) {
    printf("{\"bench\":\"layer\",\"d_model\":%d,\"ffn\":%d,\"heads\":%d,\"kv_heads\":%d,"
           "\"seq\":%d,\"batch\":%d,\"grad_dtype\":\"%s\",\"layer_ms\":%.4f,"
           "\"layer_tflops\":%.2f,\"attn_ms\":%.4f,\"attn_tflops\":%.2f,\"gemm_size\":%d,"
           "\"gemm_tflops\":%.2f",
           o->C, o->F, o->H, o->Hkv, o->T, o->B, tz_dtype_name(o->G), t_layer * 1e3,
           layer_flops / t_layer / 1e12, t_attn * 1e3, attn_flops / t_attn / 1e12, o->gemm,
           gemm_tflops);
    if (o->E)
      printf(",\"experts\":%d,\"experts_used\":%d,\"moe_ffn\":%d,\"norm_topk\":%s", o->E, o->k,
             o->Fe, o->norm_topk ? "true" : "false");
    if (tr.ok)
      printf(",\"torch_layer_ms\":%.4f,\"torch_attn_ms\":%.4f,\"torch_gemm_tflops\":%.2f,"
             "\"layer_ratio\":%.4f,\"attn_ratio\":%.4f",
             tr.layer_ms, tr.attn_ms, tr.gemm_tflops, tr.layer_ms / (t_layer * 1e3),
             tr.attn_ms / (t_attn * 1e3));
    printf(",\"rounds\":%d,\"layer_ms_rounds\":[", o->rounds);
    for (int r = 0; r < o->rounds; r++)
      printf("%s%.4f", r ? "," : "", rl[r] * 1e3);
    printf("]");
    if (tr.ok) {
      printf(",\"torch_layer_ms_rounds\":[");
      for (int r = 0; r < o->rounds; r++)
        printf("%s%.4f", r ? "," : "", pl[r]);
      printf("]");
    }
    printf(",\"attn_twopass_ms\":%.4f,\"attn_again_ms\":%.4f", t_twopass * 1e3, t_attn_again * 1e3);
    printf(",\"shares\":{");
    for (int i = 0; i < TZ_OP_COUNT; i++)
      printf("%s\"%s\":%.4f", i ? "," : "", op_names[i],
             op_total > 0 ? times.seconds[i] / op_total : 0);
    printf("},\"copy_gbps\":%.1f,\"ops\":{", copy_gbps);
    for (int i = 0, first = 1; i < TZ_OP_COUNT; i++) {
      if (!times.calls[i])
        continue;
      printf("%s\"%s\":{\"ms\":%.4f,\"calls\":%d,\"gbps\":%.1f,\"tflops\":%.1f}", first ? "" : ",",
             op_names[i], times.seconds[i] * 1e3, times.calls[i],
             times.bytes[i] / times.seconds[i] / 1e9, times.flop[i] / times.seconds[i] / 1e12);
      first = 0;
    }
    printf("}}\n");
    return 0;
  }
  if (o->E)
    printf("one layer, forward + backward: d_model %d, %d experts of %d, %d a token%s, heads "
           "%d/%d (head dim %d), seq %d, micro-batch %d, causal, bf16 storage, %s gradients\n",
           o->C, o->E, o->Fe, o->k, o->norm_topk ? " (renormalised)" : "", o->H, o->Hkv, D, o->T,
           o->B, tz_dtype_name(o->G));
  else
    printf("one layer, forward + backward: d_model %d, ffn %d, heads %d/%d (head dim %d), seq "
           "%d, micro-batch %d, causal, bf16 storage, %s gradients\n",
           o->C, o->F, o->H, o->Hkv, D, o->T, o->B, tz_dtype_name(o->G));
  if (tr.ok)
    printf("pytorch %s on %s, sdpa pinned to flash\n", tr.version, tr.device);
  else
    printf("pytorch: not measured (%s)\n", tr.why);
  printf("%d rounds in turn, medians below; the layer's ms a round (tierzero / pytorch):",
         o->rounds);
  for (int r = 0; r < o->rounds; r++)
    if (tr.ok)
      printf(" %.3f/%.3f", rl[r] * 1e3, pl[r]);
    else
      printf(" %.3f", rl[r] * 1e3);
  printf("\n");
  char gemm_name[64];
  snprintf(gemm_name, sizeof gemm_name, "GEMM ceiling bf16 %d^3", o->gemm);
  printf("\n%-28s %12s %12s %8s %8s\n", "", "tierzero", "pytorch", "speed", "target");
  row("layer fwd+bwd ms", t_layer * 1e3, tr.ok ? tr.layer_ms : -1, 1, ">=1.10");
  row("layer model TFLOP/s", layer_flops / t_layer / 1e12,
      tr.ok ? layer_flops / (tr.layer_ms * 1e-3) / 1e12 : -1, 0, "");
  row("attention fwd+bwd ms", t_attn * 1e3, tr.ok ? tr.attn_ms : -1, 1, ">=1.00");
  row("attention TFLOP/s", attn_flops / t_attn / 1e12,
      tr.ok ? attn_flops / (tr.attn_ms * 1e-3) / 1e12 : -1, 0, "");
  row("  two-pass backward ms", t_twopass * 1e3, tr.ok ? tr.attn_ms : -1, 1, ">=1.00");
  row("  again, after the others", t_attn_again * 1e3, tr.ok ? tr.attn_ms : -1, 1, ">=1.00");
  row(gemm_name, gemm_tflops, tr.ok ? tr.gemm_tflops : -1, 0, "");
  row("copy ceiling GB/s (rd+wr)", copy_gbps, -1, 0, "");
  printf("(speed = pytorch time / tierzero time; TFLOP/s count the same FLOPs for both)\n");
  printf("\nshare of the layer time per op (each call timed alone, stream drained around it; "
         "sum %.3f ms):\n",
         op_total * 1e3);
  printf("  %-16s %7s %9s %6s   %s\n", "", "share", "ms", "calls",
         "rate (GB/s beside the copy ceiling)");
  for (int i = 0; i < TZ_OP_COUNT; i++) {
    if (!times.calls[i])
      continue;
    printf("  %-16s %6.1f%%  %9.3f %5d", op_names[i], 100.0 * times.seconds[i] / op_total,
           times.seconds[i] * 1e3, times.calls[i]);
    double gbps = times.bytes[i] / times.seconds[i] / 1e9;
    if (times.flop[i] > 0)
      printf("   %7.1f TFLOP/s\n", times.flop[i] / times.seconds[i] / 1e12);
    else if (times.bytes[i] > 0)
      printf("   %7.1f GB/s (%.2f of the copy)\n", gbps, gbps / copy_gbps);
    else
      printf("\n");
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: tz-bench layer [--d-model N] [--ffn N] [--heads N] [--kv-heads N] [--seq N]\n"
          "                      [--batch N] [--iters N] [--warmup N] [--grad-dtype bf16|f32]\n"
          "                      [--gemm-size N] [--python PY] [--torch-script PATH]\n"
          "                      [--no-torch] [--rounds N] [--json] [--window N] [--softcap C]\n"
          "                      [--docs N] [--experts E --experts-used K --moe-ffn F\n"
          "                      [--norm-topk]] [--attention-only]\n"
          "  One transformer layer forward + backward on the cuda backend (bf16) beside PyTorch\n"
          "  (bf16, flash attention) run in the same invocation; attention alone; the bf16 GEMM\n"
          "  ceiling (N^3, --gemm-size, default 8192); each op's share; attention again on the\n"
          "  mma.sync kernels (two-pass). Defaults: Llama-7B's\n"
          "  layer, d_model 4096, ffn 11008, 32 heads, seq 2048, micro-batch 4, gradients bf16\n"
          "  as PyTorch's, 10 iterations after 3 warm-up, 3 rounds of both sides in turn (the\n"
          "  layer and attention; each side's median over them). Exit 77 without a CUDA device.\n"
          "  --window, --softcap: attention alone with a sliding window of N keys and soft-capped\n"
          "  scores (the cuda setting variants turned on), its TFLOP/s per computed (query, key)\n"
          "  pair; the layer stays Llama's and PyTorch is not run.\n"
          "  --docs N: rows packed with documents of heavy-tailed lengths of mean N (packed\n"
          "  fine-tuning), in the layer and attention; PyTorch is not run (compare with the\n"
          "  same command without it, one after the other).\n"
          "  --attention-only: attention alone (forward + backward), --rounds medians, nothing\n"
          "  else (a kernel's A/B).\n"
          "  --experts E: the MLP a mixture of E experts of width --moe-ffn, --experts-used a\n"
          "  token (--norm-topk: their weights renormalised), as Qwen3-MoE and OLMoE; PyTorch's\n"
          "  as transformers computes it (a loop over the experts; no load-balancing loss on\n"
          "  either side). OLMoE-1B-7B's layer: --d-model 2048 --heads 16 --kv-heads 16\n"
          "  --experts 64 --experts-used 8 --moe-ffn 1024.\n");
}

int tz_bench_layer(int argc, char **argv) {
  /* The script lives in the source tree next to this file: <repo>/tools/. */
  static char script[4096];
  snprintf(script, sizeof script, "%s", __FILE__);
  char *slash = strrchr(script, '/');
  if (slash && slash - script >= 6 && strncmp(slash - 6, "/bench", 6) == 0)
    snprintf(slash - 6, sizeof script - (size_t)(slash - 6 - script),
             "/tools/bench_layer_torch.py");
  else
    snprintf(script, sizeof script, "tools/bench_layer_torch.py");
  struct opts o = {.C = 4096,
                   .F = 11008,
                   .H = 32,
                   .Hkv = 32,
                   .T = 2048,
                   .B = 4,
                   .iters = 10,
                   .warmup = 3,
                   .rounds = 3,
                   .torch = 1,
                   .json = 0,
                   .gemm = 8192,
                   .G = TZ_BF16,
                   .python = "python3",
                   .script = script};
  static const struct option longopts[] = {{"d-model", required_argument, 0, 'c'},
                                           {"ffn", required_argument, 0, 'f'},
                                           {"heads", required_argument, 0, 'H'},
                                           {"kv-heads", required_argument, 0, 'K'},
                                           {"seq", required_argument, 0, 't'},
                                           {"batch", required_argument, 0, 'b'},
                                           {"iters", required_argument, 0, 'i'},
                                           {"warmup", required_argument, 0, 'w'},
                                           {"grad-dtype", required_argument, 0, 'g'},
                                           {"python", required_argument, 0, 'p'},
                                           {"torch-script", required_argument, 0, 's'},
                                           {"no-torch", no_argument, 0, 'n'},
                                           {"json", no_argument, 0, 'j'},
                                           {"help", no_argument, 0, 'h'},
                                           {"gemm-size", required_argument, 0, 'm'},
                                           {"rounds", required_argument, 0, 'r'},
                                           {"window", required_argument, 0, 'W'},
                                           {"softcap", required_argument, 0, 'S'},
                                           {"docs", required_argument, 0, 'D'},
                                           {"experts", required_argument, 0, 'E'},
                                           {"experts-used", required_argument, 0, 'k'},
                                           {"moe-ffn", required_argument, 0, 'e'},
                                           {"norm-topk", no_argument, 0, 'N'},
                                           {"attention-only", no_argument, 0, 'A'},
                                           {0, 0, 0, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'c': o.C = atoi(optarg); break;
    case 'f': o.F = atoi(optarg); break;
    case 'H': o.H = atoi(optarg); break;
    case 'K': o.Hkv = atoi(optarg); break;
    case 't': o.T = atoi(optarg); break;
    case 'b': o.B = atoi(optarg); break;
    case 'i': o.iters = atoi(optarg); break;
    case 'w': o.warmup = atoi(optarg); break;
    case 'g':
      if (tz_dtype_parse(optarg, &o.G) < 0) {
        fprintf(stderr, "tz-bench layer: %s\n", tz_err_msg());
        return 2;
      }
      break;
    case 'p': o.python = optarg; break;
    case 's': o.script = optarg; break;
    case 'n': o.torch = 0; break;
    case 'j': o.json = 1; break;
    case 'm': o.gemm = atoi(optarg); break;
    case 'r': o.rounds = atoi(optarg); break;
    case 'W': o.window = atoi(optarg); break;
    case 'S': o.softcap = (float)atof(optarg); break;
    case 'D': o.docs = atoi(optarg); break;
    case 'E': o.E = atoi(optarg); break;
    case 'k': o.k = atoi(optarg); break;
    case 'e': o.Fe = atoi(optarg); break;
    case 'N': o.norm_topk = 1; break;
    case 'A': o.attn_only = 1, o.torch = 0; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (o.C < 1 || o.F < 1 || o.H < 1 || o.Hkv < 1 || o.T < 1 || o.B < 1 || o.iters < 1 ||
      o.warmup < 0 || o.gemm < 1 || o.rounds < 1 || o.rounds > MAX_ROUNDS || o.window < 0 ||
      o.docs < 0 || !(o.softcap >= 0.0f) || (o.G != TZ_BF16 && o.G != TZ_F32) || o.E < 0 ||
      (o.E && (o.k < 1 || o.k > o.E || o.Fe < 1)) || (!o.E && (o.k || o.Fe || o.norm_topk))) {
    usage(stderr);
    return 2;
  }
  if (o.window || o.softcap > 0) {
    /* the variants' kernels, on every instance the bench makes (its settings strings leave
     * variants to the environment); PyTorch's layer has no window to compare with */
    setenv("TZ_CUDA_VARIANTS", "1", 1);
    o.torch = 0;
  }
  if (o.docs) /* PyTorch's layer here has no document mask */
    o.torch = 0;
  char why[256];
  if (tz_compute_probe("cuda", why, sizeof why) < 0) {
    fprintf(stderr, "tz-bench layer: %s\n", why);
    return 77;
  }
  int rc = bench(&o);
  if (rc < 0) {
    fprintf(stderr, "tz-bench layer: %s\n", tz_err_msg());
    return rc == TZ_ENOTSUP ? 77 : 1;
  }
  return 0;
}
