/* The cpu backend's mixture-of-experts ops (kernels/compute.h, "Mixture of experts"): float32,
 * each output row computed by one thread in an order that does not depend on the thread count.
 * The grouping (a counting sort of the assignments by expert) is one sequential pass: it is
 * O(N k), negligible beside the experts' matmuls. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* The k largest of p (E) into idx, largest first; ties go to the lower expert. */
static void top_k(const float *p, int E, int k, int32_t *idx) {
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      int taken = 0;
      for (int i = 0; i < j && !taken; i++)
        taken = idx[i] == e;
      if (!taken && (best < 0 || p[e] > p[best]))
        best = e;
    }
    idx[j] = best;
  }
}

int tz_cpu_moe_route(void *ctx, const struct tz_moe_route *r, float *stats, const void *logits,
                     int N, int E, int k, int norm) {
  struct cpu *c = ctx;
  const float *lg = logits;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++) {
    const float *l = lg + (size_t)n * E;
    float *p = r->probs + (size_t)n * E;
    float m = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
      m = l[e] > m ? l[e] : m;
    for (int e = 0; e < E; e++)
      sum += p[e] = expf(l[e] - m);
    for (int e = 0; e < E; e++)
      p[e] /= sum;
    int32_t *idx = r->idx + (size_t)n * k;
    float *w = r->w + (size_t)n * k;
    top_k(p, E, k, idx);
    float s = 0.0f;
    for (int j = 0; j < k; j++)
      s += w[j] = p[idx[j]];
    if (norm)
      for (int j = 0; j < k; j++)
        w[j] /= s;
  }
  /* The grouping: a counting sort by expert, stable in (n, j). */
  int32_t *off = r->offsets;
  memset(off, 0, (size_t)(E + 1) * sizeof *off);
  for (size_t a = 0; a < (size_t)N * k; a++)
    off[r->idx[a] + 1]++;
  for (int e = 0; e < E; e++)
    off[e + 1] += off[e];
  int32_t next[TZ_MOE_MAX_EXPERTS];
  memcpy(next, off, (size_t)E * sizeof *next);
  for (int n = 0; n < N; n++)
    for (int j = 0; j < k; j++) {
      int32_t p = next[r->idx[(size_t)n * k + j]]++;
      r->rows[p] = n;
      r->slot[(size_t)n * k + j] = p;
    }
  if (stats) {
#pragma omp parallel for num_threads(c->nt) schedule(static)
    for (int e = 0; e < E; e++) {
      float ps = 0.0f;
      for (int n = 0; n < N; n++)
        ps += r->probs[(size_t)n * E + e];
      stats[e] += (float)(off[e + 1] - off[e]);
      stats[E + e] += ps;
    }
  }
  return 0;
}

int tz_cpu_moe_route_bwd(void *ctx, void *dlogits, const struct tz_moe_route *r, const float *dw,
                         const float *daux, int N, int E, int k, int norm) {
  struct cpu *c = ctx;
  float *dl = dlogits;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++) {
    const float *p = r->probs + (size_t)n * E;
    const int32_t *idx = r->idx + (size_t)n * k;
    const float *w = r->w + (size_t)n * k, *g = dw + (size_t)n * k;
    float *d = dl + (size_t)n * E; /* the gradient at probs first, then at the logits */
    for (int e = 0; e < E; e++)
      d[e] = daux ? daux[e] : 0.0f;
    /* w_j = v_j / s with s the sum of the chosen probs v: dv_i = (dw_i - sum_j dw_j w_j) / s */
    float s = 0.0f, gw = 0.0f;
    for (int j = 0; j < k; j++)
      s += p[idx[j]];
    for (int j = 0; j < k; j++)
      gw += g[j] * w[j];
    for (int j = 0; j < k; j++)
      d[idx[j]] += norm ? (g[j] - gw) / s : g[j];
    float dot = 0.0f; /* the softmax's backward: dl_e = p_e (dp_e - sum_f p_f dp_f) */
    for (int e = 0; e < E; e++)
      dot += p[e] * d[e];
    for (int e = 0; e < E; e++)
      d[e] = p[e] * (d[e] - dot);
  }
  return 0;
}

int tz_cpu_moe_gather(void *ctx, void *xs, const void *x, const int32_t *rows, int M, int C) {
  struct cpu *c = ctx;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int p = 0; p < M; p++)
    memcpy((float *)xs + (size_t)p * C, (const float *)x + (size_t)rows[p] * C,
           (size_t)C * sizeof(float));
  return 0;
}

/* The k slots of token n in increasing order (the order every sum over them takes), each with
 * its j. */
static void sorted_slots(const int32_t *slot, int n, int k, int32_t *s, int *js) {
  for (int j = 0; j < k; j++) {
    int32_t v = slot[(size_t)n * k + j];
    int i = j;
    for (; i > 0 && s[i - 1] > v; i--) {
      s[i] = s[i - 1];
      js[i] = js[i - 1];
    }
    s[i] = v;
    js[i] = j;
  }
}

/* out row n = res row n (NULL: 0) + the sum over the token's slots, in increasing order, of
 * y's rows, each times its weight (w NULL: 1): combine, and scatter as its unweighted case. */
static void moe_sum(int nt, float *out, const float *res, const float *y, const float *w,
                    const int32_t *slot, int N, int k, int C) {
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int n = 0; n < N; n++) {
    int32_t s[TZ_MOE_MAX_EXPERTS];
    int js[TZ_MOE_MAX_EXPERTS];
    sorted_slots(slot, n, k, s, js);
    float *o = out + (size_t)n * C;
    const float *rr = res ? res + (size_t)n * C : NULL;
    for (int ch = 0; ch < C; ch++) {
      float acc = 0.0f;
      for (int i = 0; i < k; i++) {
        float v = y[(size_t)s[i] * C + ch];
        acc += w ? w[(size_t)n * k + js[i]] * v : v;
      }
      o[ch] = rr ? rr[ch] + acc : acc;
    }
  }
}

int tz_cpu_moe_scatter(void *ctx, void *dx, const void *dxs, const int32_t *slot, int N, int k,
                       int C) {
  struct cpu *c = ctx;
  moe_sum(c->nt, dx, NULL, dxs, NULL, slot, N, k, C);
  return 0;
}

int tz_cpu_moe_combine(void *ctx, void *out, const void *res, const void *y, const float *w,
                       const int32_t *slot, int N, int k, int C) {
  struct cpu *c = ctx;
  moe_sum(c->nt, out, res, y, w, slot, N, k, C);
  return 0;
}

int tz_cpu_moe_combine_bwd(void *ctx, void *dy, float *dw, const void *dout, const void *y,
                           const float *w, const int32_t *slot, int N, int k, int C) {
  struct cpu *c = ctx;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++) {
    const float *g = (const float *)dout + (size_t)n * C;
    for (int j = 0; j < k; j++) {
      size_t p = (size_t)slot[(size_t)n * k + j];
      const float *yr = (const float *)y + p * C;
      float *d = (float *)dy + p * C, wj = w[(size_t)n * k + j], dot = 0.0f;
      for (int ch = 0; ch < C; ch++) {
        dot += g[ch] * yr[ch];
        d[ch] = wj * g[ch];
      }
      dw[(size_t)n * k + j] = dot;
    }
  }
  return 0;
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

int tz_cpu_moe_gate_fwd(void *ctx, void *out, const void *res, const void *y, const void *s, int N,
                        int C) {
  struct cpu *c = ctx;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++) {
    float g = sigmoid(((const float *)s)[n]);
    const float *r = (const float *)res + (size_t)n * C, *yr = (const float *)y + (size_t)n * C;
    float *o = (float *)out + (size_t)n * C;
    for (int ch = 0; ch < C; ch++)
      o[ch] = r[ch] + g * yr[ch];
  }
  return 0;
}

int tz_cpu_moe_gate_bwd(void *ctx, void *dy, void *ds, const void *dout, const void *y,
                        const void *s, int N, int C) {
  struct cpu *c = ctx;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++) {
    float g = sigmoid(((const float *)s)[n]), dot = 0.0f;
    const float *d = (const float *)dout + (size_t)n * C, *yr = (const float *)y + (size_t)n * C;
    float *o = (float *)dy + (size_t)n * C;
    for (int ch = 0; ch < C; ch++) {
      dot += d[ch] * yr[ch];
      o[ch] = g * d[ch];
    }
    ((float *)ds)[n] = g * (1.0f - g) * dot;
  }
  return 0;
}
