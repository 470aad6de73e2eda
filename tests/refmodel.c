/* The float64 reference model; see refmodel.h. Shapes in comments; N = B*T rows. */
#include "refmodel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "testlib.h"

double **ref_blocks_alloc(const struct tz_model_config *cfg) {
  int nb = tz_model_n_blocks(cfg);
  double **b = calloc((size_t)nb, sizeof *b);
  if (!b)
    return NULL;
  for (int i = 0; i < nb; i++) {
    b[i] = calloc(tz_model_block_numel(cfg, i), sizeof(double));
    if (!b[i]) {
      ref_blocks_free(cfg, b);
      return NULL;
    }
  }
  return b;
}

void ref_blocks_free(const struct tz_model_config *cfg, double **blocks) {
  if (!blocks)
    return;
  for (int i = 0; i < tz_model_n_blocks(cfg); i++)
    free(blocks[i]);
  free(blocks);
}

void ref_blocks_randomize(const struct tz_model_config *cfg, double **blocks, uint64_t seed,
                          double scale) {
  uint64_t st = seed;
  for (int b = 0; b < tz_model_n_blocks(cfg); b++) {
    struct tz_block_layout l;
    tz_model_block_layout(cfg, b, &l);
    memset(blocks[b], 0, sizeof(double) * l.numel);
    for (int i = 0; i < l.n; i++) {
      int bias = l.kind == TZ_BLOCK_LAYER && (i == TZ_L_BQ || i == TZ_L_BK || i == TZ_L_BV);
      int norm = l.t[i].ndim == 1 && !bias;
      for (uint64_t e = 0; e < l.t[i].numel; e++) {
        double u = (double)(tz_test_rand(&st) >> 11) * 0x1.0p-53; /* [0, 1) */
        /* with the (1 + w) norms, w near 0 (the effective weight near 1 either way) */
        double nw = cfg->norm_offset ? 0.4 * u - 0.2 : 0.8 + 0.4 * u;
        blocks[b][l.t[i].offset + e] = norm ? nw : scale * (2 * u - 1);
      }
    }
  }
}

/* ---- building blocks, forward ---- */

/* y (N, out) = x (N, in) W^T with W (out, in) */
static void linear(double *y, const double *x, const double *W, int N, int in, int out) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < out; o++) {
      double s = 0;
      for (int i = 0; i < in; i++)
        s += x[n * in + i] * W[o * in + i];
      y[n * out + o] = s;
    }
}

/* The norms' weight offset: 1 for Gemma's (1 + w) (set per run by ref_model_run). */
static double norm_off;

/* y (N, C) = x * rstd * (norm_off + w); rstd (N) */
static void rmsnorm(double *y, double *rstd, const double *x, const double *w, int N, int C,
                    double eps) {
  for (int n = 0; n < N; n++) {
    double ss = 0;
    for (int c = 0; c < C; c++)
      ss += x[n * C + c] * x[n * C + c];
    rstd[n] = 1.0 / sqrt(ss / C + eps);
    for (int c = 0; c < C; c++)
      y[n * C + c] = x[n * C + c] * rstd[n] * (norm_off + w[c]);
  }
}

/* y (N, n) += b (n) */
static void bias_add(double *y, const double *b, int N, int n) {
  if (b)
    for (int r = 0; r < N; r++)
      for (int j = 0; j < n; j++)
        y[r * n + j] += b[j];
}

/* The rotation frequencies (D/2) of cfg's rope, as transformers computes them (rope_type
 * "default", or "llama3": _compute_llama3_parameters), here in double. */
static void rope_freqs(const struct tz_model_config *cfg, int D, double *f) {
  double factor = cfg->rope_factor, lo_f = cfg->rope_low_freq_factor,
         hi_f = cfg->rope_high_freq_factor, old_ctx = cfg->rope_original_max_pos;
  for (int i = 0; i < D / 2; i++) {
    double inv = pow(cfg->rope_theta, -2.0 * i / D);
    f[i] = inv;
    if (cfg->rope_type == 2) /* linear: positions interpolated, t / factor */
      f[i] = inv / factor;
    if (cfg->rope_type == 3) { /* yarn, as transformers' _compute_yarn_parameters writes it */
      double base = cfg->rope_theta, orig = cfg->rope_original_max_pos;
      double lo = D * log(orig / (cfg->rope_beta_fast * 2 * M_PI)) / (2 * log(base));
      double hi = D * log(orig / (cfg->rope_beta_slow * 2 * M_PI)) / (2 * log(base));
      if (cfg->rope_truncate)
        lo = floor(lo), hi = ceil(hi);
      lo = fmax(lo, 0), hi = fmin(hi, D - 1);
      if (lo == hi)
        hi += 0.001;
      double ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1), extrap = 1 - ramp;
      f[i] = inv / factor * (1 - extrap) + inv * extrap;
    }
    if (cfg->rope_type != 1)
      continue;
    double wavelen = 2 * M_PI / inv;
    double low_freq_wavelen = old_ctx / lo_f, high_freq_wavelen = old_ctx / hi_f;
    double scaled = wavelen > low_freq_wavelen ? inv / factor : inv;
    double smooth = (old_ctx / wavelen - lo_f) / (hi_f - lo_f);
    double smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    int medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f[i] = medium ? smoothed : scaled;
  }
}

/* The scores' scale: query_pre_attn_scalar's, else 1/sqrt(D); times yarn's attention factor
 * squared (transformers multiplies cos and sin by it, so q and k each). */
static double ref_scale(const struct tz_model_config *cfg, int D) {
  double s = cfg->attn_scale > 0 ? cfg->attn_scale : 1.0 / sqrt((double)D);
  double af = cfg->rope_attn_factor > 0 && !cfg->rope_rot ? cfg->rope_attn_factor : 1.0;
  return s * af * af;
}

/* With partial rotary the attention factor scales cos and sin (the rotated dims alone), as
 * transformers applies it. */
static double rope_mscale(const struct tz_model_config *cfg) {
  return cfg->rope_rot && cfg->rope_attn_factor > 0 ? cfg->rope_attn_factor : 1.0;
}

/* Layer i's frequencies: the sliding layers' own base with rope_local_theta (Gemma 3's
 * rope_local_base_freq, default type), else the model's. */
static void layer_freqs(const struct tz_model_config *cfg, int layer, int T, int D, double *f) {
  D = tz_model_rope_dims(cfg); /* partial rotary: the rotated dims' frequencies */
  if (cfg->rope_local_theta > 0 && tz_model_layer_slides(cfg, layer)) {
    for (int i = 0; i < D / 2; i++)
      f[i] = pow(cfg->rope_local_theta, -2.0 * i / D);
    return;
  }
  rope_freqs(cfg, D, f);
  if (cfg->rope_type == 4) /* longrope: the long factors above the original length */
    for (int i = 0; i < D / 2; i++)
      f[i] =
          pow(cfg->rope_theta, -2.0 * i / D) /
          (T > cfg->rope_original_max_pos ? cfg->rope_long_factor[i] : cfg->rope_short_factor[i]);
}

/* Rotates the first R dims of each head of x (B, T, nh, D) in place by the angles t * f[i] (as
 * transformers: q[..., :R] rotated, q[..., R:] passed): sign +1 forward, -1 the inverse (the
 * backward). */
static void rope(double *x, int B, int T, int nh, int D, int R, double ms, const double *f,
                 double sign) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < nh; h++)
        for (int i = 0; i < R / 2; i++) {
          double ang = t * f[i];
          double c = ms * cos(ang), s = ms * sign * sin(ang);
          double *v = x + ((b * T + t) * nh + h) * D;
          double x1 = v[i], x2 = v[i + R / 2];
          v[i] = x1 * c - x2 * s;
          v[i + R / 2] = x2 * c + x1 * s;
        }
}

/* The attention's variants of a layer: the scores' scale, their softcap (0: none), the window
 * (0: none; key u is scored by query t when t - u < window). */
struct ref_attn {
  double scale, cap;
  int window;
};

/* P (B, H, T, T): causal softmax of the scores, s = q k^T * scale, capped to cap tanh(s / cap)
 * where cap > 0, keys within the window; out (B, T, H, D) = P v. */
static void attention(double *out, double *P, const double *q, const double *k, const double *v,
                      int B, int T, int H, int Hkv, int D, const struct ref_attn *ra) {
  int group = H / Hkv;
  double scale = ra->scale;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        int hk = h / group;
        double *p = P + ((b * H + h) * T + t) * T;
        double m = -INFINITY;
        for (int u = 0; u < T; u++) {
          if (u > t || (ra->window > 0 && t - u >= ra->window)) {
            p[u] = -INFINITY;
            continue;
          }
          double s = 0;
          for (int d = 0; d < D; d++)
            s += q[((b * T + t) * H + h) * D + d] * k[((b * T + u) * Hkv + hk) * D + d];
          p[u] = s * scale;
          if (ra->cap > 0)
            p[u] = ra->cap * tanh(p[u] / ra->cap);
          if (p[u] > m)
            m = p[u];
        }
        double z = 0;
        for (int u = 0; u <= t; u++) {
          p[u] = exp(p[u] - m); /* 0 outside the window */
          z += p[u];
        }
        for (int u = 0; u <= t; u++)
          p[u] /= z;
        for (int u = t + 1; u < T; u++)
          p[u] = 0;
        for (int d = 0; d < D; d++) {
          double s = 0;
          for (int u = 0; u <= t; u++)
            s += p[u] * v[((b * T + u) * Hkv + hk) * D + d];
          out[((b * T + t) * H + h) * D + d] = s;
        }
      }
}

static double silu(double x) { return x / (1.0 + exp(-x)); }

/* The MLP's gate activation (enum tz_glu) and its derivative. */
static double gate_act(int act, double g) {
  if (act == TZ_GLU_GELU_TANH)
    return 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
  return silu(g);
}
static double gate_slope(int act, double g) {
  if (act == TZ_GLU_GELU_TANH) {
    double k0 = sqrt(2 / M_PI), th = tanh(k0 * (g + 0.044715 * g * g * g));
    return 0.5 * (1 + th) + 0.5 * g * (1 - th * th) * k0 * (1 + 3 * 0.044715 * g * g);
  }
  double s = 1.0 / (1.0 + exp(-g)); /* silu'(g) = s (1 + g (1 - s)) */
  return s * (1.0 + g * (1.0 - s));
}

/* db (n) += the column sums of dy (N, n) */
static void bias_bwd(double *db, const double *dy, int N, int n) {
  if (db)
    for (int r = 0; r < N; r++)
      for (int j = 0; j < n; j++)
        db[j] += dy[r * n + j];
}

/* ---- building blocks, backward ---- */

/* From y = x W^T: dx (N, in) += dy W, dW (out, in) += dy^T x */
static void linear_bwd(double *dx, double *dW, const double *dy, const double *x, const double *W,
                       int N, int in, int out) {
  for (int n = 0; n < N; n++)
    for (int o = 0; o < out; o++)
      for (int i = 0; i < in; i++) {
        dx[n * in + i] += dy[n * out + o] * W[o * in + i];
        dW[o * in + i] += dy[n * out + o] * x[n * in + i];
      }
}

/* From y_c = x_c r w_c, r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / C:
 * dx_j += w_j dy_j r - r^3 x_j / C * sum_c dy_c w_c x_c;  dw_c += dy_c x_c r */
static void rmsnorm_bwd(double *dx, double *dw, const double *dy, const double *x, const double *w,
                        const double *rstd, int N, int C) {
  for (int n = 0; n < N; n++) {
    double r = rstd[n], dot = 0;
    for (int c = 0; c < C; c++)
      dot += dy[n * C + c] * (norm_off + w[c]) * x[n * C + c];
    for (int c = 0; c < C; c++) {
      dx[n * C + c] += (norm_off + w[c]) * dy[n * C + c] * r - r * r * r * x[n * C + c] / C * dot;
      dw[c] += dy[n * C + c] * x[n * C + c] * r;
    }
  }
}

/* From out_t = sum_u P_tu v_u, P = softmax(S), S_tu = q_t . k_u * scale:
 * dv_u += P_tu dout_t; dP_tu = dout_t . v_u; dS_tu = P_tu (dP_tu - sum_w P_tw dP_tw);
 * dq_t += scale dS_tu k_u; dk_u += scale dS_tu q_t.  dq, dk, dv accumulate (zeroed by caller). */
static void attention_bwd(double *dq, double *dk, double *dv, const double *dout, const double *P,
                          const double *q, const double *k, const double *v, int B, int T, int H,
                          int Hkv, int D, const struct ref_attn *ra) {
  int group = H / Hkv;
  double scale = ra->scale;
  double *dP = malloc(sizeof(double) * T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        int hk = h / group;
        const double *p = P + ((b * H + h) * T + t) * T;
        const double *dot_ = dout + ((b * T + t) * H + h) * D;
        double pdp = 0;
        for (int u = 0; u <= t; u++) {
          dP[u] = 0;
          for (int d = 0; d < D; d++) {
            dP[u] += dot_[d] * v[((b * T + u) * Hkv + hk) * D + d];
            dv[((b * T + u) * Hkv + hk) * D + d] += p[u] * dot_[d];
          }
          pdp += p[u] * dP[u];
        }
        for (int u = 0; u <= t; u++) {
          double dS = p[u] * (dP[u] - pdp);
          if (ra->cap > 0) { /* through cap tanh(s / cap): times 1 - tanh^2 */
            double s = 0;
            for (int d = 0; d < D; d++)
              s += q[((b * T + t) * H + h) * D + d] * k[((b * T + u) * Hkv + hk) * D + d];
            double th = tanh(s * scale / ra->cap);
            dS *= 1 - th * th;
          }
          for (int d = 0; d < D; d++) {
            dq[((b * T + t) * H + h) * D + d] += scale * dS * k[((b * T + u) * Hkv + hk) * D + d];
            dk[((b * T + u) * Hkv + hk) * D + d] += scale * dS * q[((b * T + t) * H + h) * D + d];
          }
        }
      }
  free(dP);
}

/* ---- the model ---- */

/* ---- mixture of experts ----
 * Token by token, each chosen expert run on the token alone: router logits h Wr^T, softmax, the
 * k largest (ties to the lower expert), their weights (divided by their sum with norm_topk), the
 * output the weighted sum of the experts' SwiGLUs. */
struct ref_moe {
  double *p; /* (N, E) */
  int *idx;  /* (N, k) */
  double *w; /* (N, k) */
  double *g; /* (N, k, F_e) each choice's gate, up and activation */
  double *u;
  double *a;
  double *y; /* (N, k, C) each choice's expert output */
  /* the shared expert (Qwen2-MoE): its gate, up, SwiGLU (N, F_s), output (N, C), gate logit */
  double *sg, *su, *sa, *ys, *slog;
};

static double sigm(double x) { return 1.0 / (1.0 + exp(-x)); }

static void moe_fwd_ref(const struct tz_model_config *cfg, const struct tz_block_layout *l,
                        const double *P, const double *h, int N, struct ref_moe *m, double *out,
                        double *count, double *psum) {
  int C = cfg->d_model, E = cfg->n_expert, k = cfg->n_expert_used, F = cfg->moe_ffn_dim;
  const double *Wr = P + l->t[TZ_L_ROUTER].offset;
  for (int n = 0; n < N; n++) {
    const double *hn = h + (size_t)n * C;
    double *p = m->p + (size_t)n * E, mx = -INFINITY, z = 0, s = 0;
    for (int e = 0; e < E; e++) {
      p[e] = 0;
      for (int c = 0; c < C; c++)
        p[e] += hn[c] * Wr[(size_t)e * C + c];
      mx = p[e] > mx ? p[e] : mx;
    }
    for (int e = 0; e < E; e++)
      z += p[e] = exp(p[e] - mx);
    for (int e = 0; e < E; e++) {
      p[e] /= z;
      psum[e] += p[e];
    }
    int *idx = m->idx + (size_t)n * k;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int i = 0; i < j; i++)
          taken |= idx[i] == e;
        if (!taken && (best < 0 || p[e] > p[best]))
          best = e;
      }
      idx[j] = best;
      count[best] += 1;
      s += p[best];
    }
    for (int j = 0; j < k; j++) {
      int e = idx[j];
      double wj = m->w[(size_t)n * k + j] = p[e] / (cfg->norm_topk ? s : 1.0);
      size_t r = (size_t)n * k + j;
      double *g = m->g + r * F, *u = m->u + r * F, *a = m->a + r * F, *y = m->y + r * C;
      linear(g, hn, P + l->t[TZ_L_WG].offset + (size_t)e * F * C, 1, C, F);
      linear(u, hn, P + l->t[TZ_L_WU].offset + (size_t)e * F * C, 1, C, F);
      for (int f = 0; f < F; f++)
        a[f] = gate_act(cfg->glu_act, g[f]) * u[f];
      linear(y, a, P + l->t[TZ_L_WD].offset + (size_t)e * C * F, 1, F, C);
      for (int c = 0; c < C; c++)
        out[(size_t)n * C + c] += wj * y[c];
    }
    int Fs = cfg->shared_ffn_dim;
    if (Fs) { /* out += sigmoid(h . shared_gate) * shared SwiGLU(h) */
      double *sg = m->sg + (size_t)n * Fs, *su = m->su + (size_t)n * Fs,
             *sa = m->sa + (size_t)n * Fs;
      double *ys = m->ys + (size_t)n * C;
      linear(sg, hn, P + l->t[TZ_L_SWG].offset, 1, C, Fs);
      linear(su, hn, P + l->t[TZ_L_SWU].offset, 1, C, Fs);
      for (int f = 0; f < Fs; f++)
        sa[f] = gate_act(cfg->glu_act, sg[f]) * su[f];
      linear(ys, sa, P + l->t[TZ_L_SWD].offset, 1, Fs, C);
      linear(m->slog + n, hn, P + l->t[TZ_L_SGATE].offset, 1, C, 1);
      for (int c = 0; c < C; c++)
        out[(size_t)n * C + c] += sigm(m->slog[n]) * ys[c];
    }
  }
}

/* dh (N, C) += the gradient at h; G += the router's and experts' gradients, given dout at the
 * output and daux (E) at each row's probs. */
static void moe_bwd_ref(const struct tz_model_config *cfg, const struct tz_block_layout *l,
                        const double *P, double *G, const double *h, int N, const struct ref_moe *m,
                        const double *dout, const double *daux, double *dh) {
  int C = cfg->d_model, E = cfg->n_expert, k = cfg->n_expert_used, F = cfg->moe_ffn_dim;
  double *da = malloc(sizeof(double) * F), *dg = malloc(sizeof(double) * F);
  double *du = malloc(sizeof(double) * F), *dp = malloc(sizeof(double) * E);
  double *dw = malloc(sizeof(double) * k), *dy = malloc(sizeof(double) * C);
  for (int n = 0; n < N; n++) {
    const double *hn = h + (size_t)n * C, *g_out = dout + (size_t)n * C;
    const double *p = m->p + (size_t)n * E, *w = m->w + (size_t)n * k;
    const int *idx = m->idx + (size_t)n * k;
    double *dhn = dh + (size_t)n * C;
    for (int j = 0; j < k; j++) {
      int e = idx[j];
      size_t r = (size_t)n * k + j;
      const double *g = m->g + r * F, *u = m->u + r * F, *a = m->a + r * F, *y = m->y + r * C;
      dw[j] = 0;
      for (int c = 0; c < C; c++) {
        dw[j] += g_out[c] * y[c];
        dy[c] = w[j] * g_out[c];
      }
      memset(da, 0, sizeof(double) * F);
      linear_bwd(da, G + l->t[TZ_L_WD].offset + (size_t)e * C * F, dy, a,
                 P + l->t[TZ_L_WD].offset + (size_t)e * C * F, 1, F, C);
      for (int f = 0; f < F; f++) {
        dg[f] = da[f] * u[f] * gate_slope(cfg->glu_act, g[f]);
        du[f] = da[f] * gate_act(cfg->glu_act, g[f]);
      }
      linear_bwd(dhn, G + l->t[TZ_L_WG].offset + (size_t)e * F * C, dg, hn,
                 P + l->t[TZ_L_WG].offset + (size_t)e * F * C, 1, C, F);
      linear_bwd(dhn, G + l->t[TZ_L_WU].offset + (size_t)e * F * C, du, hn,
                 P + l->t[TZ_L_WU].offset + (size_t)e * F * C, 1, C, F);
    }
    /* the weights: w_j = p_j / s (norm_topk) or p_j; then the softmax */
    double s = 0, gw = 0, dot = 0;
    for (int j = 0; j < k; j++) {
      s += p[idx[j]];
      gw += dw[j] * w[j];
    }
    for (int e = 0; e < E; e++)
      dp[e] = daux[e];
    for (int j = 0; j < k; j++)
      dp[idx[j]] += cfg->norm_topk ? (dw[j] - gw) / s : dw[j];
    for (int e = 0; e < E; e++)
      dot += p[e] * dp[e];
    for (int e = 0; e < E; e++)
      dp[e] = p[e] * (dp[e] - dot); /* now at the logits */
    linear_bwd(dhn, G + l->t[TZ_L_ROUTER].offset, dp, hn, P + l->t[TZ_L_ROUTER].offset, 1, C, E);
    int Fs = cfg->shared_ffn_dim;
    if (Fs) { /* the shared expert through its gate */
      const double *sg = m->sg + (size_t)n * Fs, *su = m->su + (size_t)n * Fs;
      const double *sa = m->sa + (size_t)n * Fs, *ys = m->ys + (size_t)n * C;
      double gs = sigm(m->slog[n]), dot = 0, dsl;
      double *dys = malloc(sizeof(double) * C), *das = calloc((size_t)Fs, sizeof(double));
      double *dgs = malloc(sizeof(double) * Fs), *dus = malloc(sizeof(double) * Fs);
      for (int c = 0; c < C; c++) {
        dot += g_out[c] * ys[c];
        dys[c] = gs * g_out[c];
      }
      dsl = gs * (1 - gs) * dot;
      linear_bwd(das, G + l->t[TZ_L_SWD].offset, dys, sa, P + l->t[TZ_L_SWD].offset, 1, Fs, C);
      for (int f = 0; f < Fs; f++) {
        dgs[f] = das[f] * su[f] * gate_slope(cfg->glu_act, sg[f]);
        dus[f] = das[f] * gate_act(cfg->glu_act, sg[f]);
      }
      linear_bwd(dhn, G + l->t[TZ_L_SWG].offset, dgs, hn, P + l->t[TZ_L_SWG].offset, 1, C, Fs);
      linear_bwd(dhn, G + l->t[TZ_L_SWU].offset, dus, hn, P + l->t[TZ_L_SWU].offset, 1, C, Fs);
      linear_bwd(dhn, G + l->t[TZ_L_SGATE].offset, &dsl, hn, P + l->t[TZ_L_SGATE].offset, 1, C, 1);
      free(dys), free(das), free(dgs), free(dus);
    }
  }
  free(da), free(dg), free(du), free(dp), free(dw), free(dy);
}

struct ref_layer {
  struct ref_moe mo; /* with experts */
  double *x;         /* (N, C) layer input */
  double *h1;        /* (N, C) */
  double *r1;        /* (N) */
  double *qp;        /* (N, H*D) the projection (with its bias), before the q norm */
  double *kp;        /* (N, Hkv*D) */
  double *rq;        /* (N*H) the q norm's rstd */
  double *rk;        /* (N*Hkv) */
  double *q;         /* (N, H*D) after the q norm (when there is one) and rope */
  double *k;         /* (N, Hkv*D) after the k norm and rope */
  double *v;         /* (N, Hkv*D) */
  double *P;         /* (B, H, T, T) */
  double *att;       /* (N, H*D) */
  double *o;         /* (N, C) att wo^T: norm_place POST's input of its attention norm */
  double *ro;        /* (N) */
  double *m;         /* (N, C) a wd^T: norm_place POST's input of its MLP norm */
  double *rm;        /* (N) */
  double *x2;        /* (N, C) */
  double *h2;        /* (N, C) */
  double *r2;        /* (N) */
  double *g, *u;     /* (N, F) */
  double *a;         /* (N, F) */
};

/* The model on L + 2 buffers: the embedding, each layer's blocks one after the other
 * (tz_model_layer_layout), the head. */
static int run_layers(const struct tz_model_config *cfg, double *const *params,
                      const int32_t *tokens, const int32_t *targets, int B, int T,
                      double *logits_out, double *loss, double *const *grads) {
  int N = B * T, C = cfg->d_model, F = cfg->ffn_dim, V = cfg->vocab, L = cfg->n_layer;
  int H = cfg->n_head, Hkv = cfg->n_kv_head, D = cfg->head_dim ? cfg->head_dim : C / H;
  int HD = H * D, KD = Hkv * D, bias = cfg->qkv_bias, qkn = cfg->qk_norm;
  int pre = cfg->norm_place != TZ_NORM_POST, post = cfg->norm_place != TZ_NORM_PRE;
  int all = qkn == TZ_QK_NORM_ALL;
  norm_off = cfg->norm_offset ? 1.0 : 0.0;
  /* Gemma's embedding scale, its final softcap */
  double emb = cfg->embed_scale ? sqrt((double)C) : 1.0, fcap = cfg->final_softcap;
  /* the q and k norms' rows and widths: each head's D, or (all) the whole projection */
  int qrows = all ? N : N * H, qw = all ? HD : D, krows = all ? N : N * Hkv, kw = all ? KD : D;
  double eps = cfg->norm_eps;
  for (int n = 0; n < N; n++)
    if (tokens[n] < 0 || tokens[n] >= V || targets[n] < 0 || targets[n] >= V)
      return tz_err_set(TZ_EINVAL, "ref model: token or target out of range at %d", n);
  if (D % 2 || D / 2 > 512)
    return tz_err_set(TZ_EINVAL, "ref model: head dim %d", D);
  double freqs[512];
  struct tz_block_layout ll, hl;
  tz_model_layer_layout(cfg, &ll);
  tz_model_block_layout(cfg, tz_model_n_blocks(cfg) - 1, &hl);
  /* The layout is the model's: it must hold the tensors this reference reads, in their shapes. */
  const struct {
    int i;
    int64_t rows, cols;
  } want[] = {{TZ_L_WQ, HD, C},
              {TZ_L_WK, KD, C},
              {TZ_L_WO, C, HD},
              {TZ_L_BQ, bias ? HD : 0, bias},
              {TZ_L_BK, bias ? KD : 0, bias},
              {TZ_L_BV, bias ? KD : 0, bias},
              {TZ_L_QNORM, qkn ? qw : 0, qkn != 0},
              {TZ_L_KNORM, qkn ? kw : 0, qkn != 0},
              {TZ_L_ATTN_NORM, pre ? C : 0, pre},
              {TZ_L_MLP_NORM, pre ? C : 0, pre},
              {TZ_L_ATTN_POST_NORM, post ? C : 0, post},
              {TZ_L_MLP_POST_NORM, post ? C : 0, post}};
  for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
    const struct tz_param_info *t = &ll.t[want[w].i];
    if (ll.n != TZ_L_COUNT || t->shape[0] != want[w].rows || t->shape[1] != want[w].cols ||
        t->numel != (uint64_t)(want[w].rows * want[w].cols))
      return tz_err_set(TZ_EINVAL, "ref model: layer tensor %d is (%lld, %lld), want (%lld, %lld)",
                        want[w].i, (long long)t->shape[0], (long long)t->shape[1],
                        (long long)want[w].rows, (long long)want[w].cols);
  }
  const double *wte = params[0];
  const double *hnorm = params[L + 1] + hl.t[TZ_H_NORM].offset;
  const double *wlm = cfg->tie_embeddings ? wte : params[L + 1] + hl.t[TZ_H_LM].offset;

  /* Everything in one zeroed arena, freed at the end. */
  size_t per_layer =
      (size_t)N * (6 * C + 3 * HD + 3 * KD + 3 * F + 4 + H + Hkv) + (size_t)B * H * T * T;
  size_t total = per_layer * L + (size_t)N * (2 * C + 1 + V) + (size_t)N * C * 5 +
                 (size_t)N * (2 * HD + 3 * KD + 2 * F + HD) + (size_t)N * V;
  double *arena = calloc(total, sizeof(double));
  struct ref_layer *ly = calloc((size_t)L, sizeof *ly);
  if (!arena || !ly) {
    free(arena);
    free(ly);
    return tz_err_set(TZ_ENOMEM, "ref model: out of memory");
  }
  /* the experts' intermediates, and the routing's counts and probability sums over all layers */
  int moe = tz_model_moe(cfg), E = moe ? cfg->n_expert : 1, K = moe ? cfg->n_expert_used : 1;
  int Fe = moe ? cfg->moe_ffn_dim : 1;
  double count[TZ_MOE_MAX_EXPERTS] = {0}, psum[TZ_MOE_MAX_EXPERTS] = {0};
  double daux[TZ_MOE_MAX_EXPERTS] = {0};
  int oom = 0;
  for (int i = 0; moe && i < L; i++) {
    struct ref_moe *mo = &ly[i].mo;
    mo->p = malloc(sizeof(double) * N * E);
    mo->idx = malloc(sizeof(int) * N * K);
    mo->w = malloc(sizeof(double) * N * K);
    mo->g = malloc(sizeof(double) * N * K * Fe);
    mo->u = malloc(sizeof(double) * N * K * Fe);
    mo->a = malloc(sizeof(double) * N * K * Fe);
    mo->y = malloc(sizeof(double) * N * K * C);
    int Fs = cfg->shared_ffn_dim > 0 ? cfg->shared_ffn_dim : 1;
    mo->sg = malloc(sizeof(double) * N * Fs);
    mo->su = malloc(sizeof(double) * N * Fs);
    mo->sa = malloc(sizeof(double) * N * Fs);
    mo->ys = malloc(sizeof(double) * N * C);
    mo->slog = malloc(sizeof(double) * N);
    oom |= !mo->p || !mo->idx || !mo->w || !mo->g || !mo->u || !mo->a || !mo->y || !mo->sg ||
           !mo->su || !mo->sa || !mo->ys || !mo->slog;
  }
  double *p = arena;
#define TAKE(n) (p += (n), p - (n))
  for (int i = 0; i < L; i++) {
    ly[i].x = TAKE((size_t)N * C);
    ly[i].h1 = TAKE((size_t)N * C);
    ly[i].r1 = TAKE((size_t)N);
    ly[i].qp = TAKE((size_t)N * HD);
    ly[i].kp = TAKE((size_t)N * KD);
    ly[i].rq = TAKE((size_t)N * H);
    ly[i].rk = TAKE((size_t)N * Hkv);
    ly[i].q = TAKE((size_t)N * HD);
    ly[i].k = TAKE((size_t)N * KD);
    ly[i].v = TAKE((size_t)N * KD);
    ly[i].P = TAKE((size_t)B * H * T * T);
    ly[i].att = TAKE((size_t)N * HD);
    ly[i].o = TAKE((size_t)N * C);
    ly[i].ro = TAKE((size_t)N);
    ly[i].m = TAKE((size_t)N * C);
    ly[i].rm = TAKE((size_t)N);
    ly[i].x2 = TAKE((size_t)N * C);
    ly[i].h2 = TAKE((size_t)N * C);
    ly[i].r2 = TAKE((size_t)N);
    ly[i].g = TAKE((size_t)N * F);
    ly[i].u = TAKE((size_t)N * F);
    ly[i].a = TAKE((size_t)N * F);
  }
  double *xL = TAKE((size_t)N * C), *hN = TAKE((size_t)N * C), *rN = TAKE((size_t)N);
  double *logits = TAKE((size_t)N * V);
  double *dx = TAKE((size_t)N * C), *dh = TAKE((size_t)N * C), *dx2 = TAKE((size_t)N * C);
  double *dm = TAKE((size_t)N * C), *dob = TAKE((size_t)N * C);
  double *datt = TAKE((size_t)N * HD), *dq = TAKE((size_t)N * HD), *dk = TAKE((size_t)N * KD),
         *dv = TAKE((size_t)N * KD), *da = TAKE((size_t)N * F), *dgu = TAKE((size_t)N * F);
  double *dqp = TAKE((size_t)N * HD), *dkp = TAKE((size_t)N * KD);
  double *dlogits = TAKE((size_t)N * V);
#undef TAKE

  /* Forward. */
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      ly[0].x[n * C + c] = wte[tokens[n] * C + c] * emb;
  for (int i = 0; i < L; i++) {
    struct ref_layer *y = &ly[i];
    const double *P = params[i + 1];
#define W(idx) (P + ll.t[idx].offset)
#define WB(idx) (bias ? W(idx) : NULL)
    /* OLMo 2 (post only): no norm before the attention or the MLP; one on each one's output;
     * Gemma (both): each */
    const double *h1 = pre ? y->h1 : y->x, *h2 = pre ? y->h2 : y->x2;
    struct ref_attn ra = {ref_scale(cfg, D), cfg->attn_softcap, tz_model_layer_window(cfg, i)};
    layer_freqs(cfg, i, T, D, freqs);
    if (pre)
      rmsnorm(y->h1, y->r1, y->x, W(TZ_L_ATTN_NORM), N, C, eps);
    /* transformers' Qwen2 / Qwen3 / OLMo 2 attention: q = q_proj(h) (bias included), then q_norm
     * over each head's D (or the whole projection), then the rotary embedding; likewise k; v has
     * only its bias. */
    linear(y->qp, h1, W(TZ_L_WQ), N, C, HD);
    bias_add(y->qp, WB(TZ_L_BQ), N, HD);
    linear(y->kp, h1, W(TZ_L_WK), N, C, KD);
    bias_add(y->kp, WB(TZ_L_BK), N, KD);
    linear(y->v, h1, W(TZ_L_WV), N, C, KD);
    bias_add(y->v, WB(TZ_L_BV), N, KD);
    if (qkn) {
      rmsnorm(y->q, y->rq, y->qp, W(TZ_L_QNORM), qrows, qw, eps);
      rmsnorm(y->k, y->rk, y->kp, W(TZ_L_KNORM), krows, kw, eps);
    } else {
      memcpy(y->q, y->qp, sizeof(double) * N * HD);
      memcpy(y->k, y->kp, sizeof(double) * N * KD);
    }
    rope(y->q, B, T, H, D, tz_model_rope_dims(cfg), rope_mscale(cfg), freqs, 1);
    rope(y->k, B, T, Hkv, D, tz_model_rope_dims(cfg), rope_mscale(cfg), freqs, 1);
    attention(y->att, y->P, y->q, y->k, y->v, B, T, H, Hkv, D, &ra);
    if (post) {
      linear(y->o, y->att, W(TZ_L_WO), N, HD, C);
      rmsnorm(y->x2, y->ro, y->o, W(TZ_L_ATTN_POST_NORM), N, C, eps);
    } else {
      linear(y->x2, y->att, W(TZ_L_WO), N, HD, C);
    }
    for (int e = 0; e < N * C; e++)
      y->x2[e] += y->x[e];
    if (pre)
      rmsnorm(y->h2, y->r2, y->x2, W(TZ_L_MLP_NORM), N, C, eps);
    double *out = i + 1 < L ? ly[i + 1].x : xL;
    if (moe && !oom) {
      memset(out, 0, sizeof(double) * N * C);
      moe_fwd_ref(cfg, &ll, P, h2, N, &y->mo, out, count, psum);
    } else if (!moe) {
      linear(y->g, h2, W(TZ_L_WG), N, C, F);
      linear(y->u, h2, W(TZ_L_WU), N, C, F);
      for (int e = 0; e < N * F; e++)
        y->a[e] = gate_act(cfg->glu_act, y->g[e]) * y->u[e];
    }
    if (!moe && post) {
      linear(y->m, y->a, W(TZ_L_WD), N, F, C);
      rmsnorm(out, y->rm, y->m, W(TZ_L_MLP_POST_NORM), N, C, eps);
    } else if (!moe) {
      linear(out, y->a, W(TZ_L_WD), N, F, C);
    }
    for (int e = 0; e < N * C; e++)
      out[e] += y->x2[e];
#undef W
#undef WB
  }
  rmsnorm(hN, rN, xL, hnorm, N, C, eps);
  linear(logits, hN, wlm, N, C, V);
  double total_loss = 0;
  if (fcap > 0) /* Gemma 2's final softcap: the logits are capped ones */
    for (size_t e = 0; e < (size_t)N * V; e++)
      logits[e] = fcap * tanh(logits[e] / fcap);
  for (int n = 0; n < N; n++) {
    const double *row = logits + (size_t)n * V;
    double m = -INFINITY, z = 0;
    for (int j = 0; j < V; j++)
      m = row[j] > m ? row[j] : m;
    for (int j = 0; j < V; j++)
      z += exp(row[j] - m);
    double lse = m + log(z);
    total_loss += lse - row[targets[n]];
    /* d(mean loss)/d logits = (softmax - onehot) / N */
    for (int j = 0; j < V; j++) {
      double th = fcap > 0 ? row[j] / fcap : 0; /* through the cap: times 1 - tanh^2 */
      dlogits[(size_t)n * V + j] = (exp(row[j] - lse) - (j == targets[n])) / N * (1 - th * th);
    }
  }
  *loss = total_loss / N;
  if (moe && tz_model_aux_coef(cfg) > 0) { /* the load-balancing loss over every layer's rows */
    double R = (double)N * L, aux = 0;
    for (int e = 0; e < E; e++) {
      aux += count[e] / R * psum[e] / R;
      daux[e] = tz_model_aux_coef(cfg) * E * count[e] / (R * R);
    }
    *loss += tz_model_aux_coef(cfg) * aux * E;
  }
  if (logits_out)
    memcpy(logits_out, logits, sizeof(double) * N * V);

  if (grads) {
    for (int b = 0; b < L + 2; b++)
      memset(grads[b], 0,
             sizeof(double) * (b == 0       ? tz_model_block_numel(cfg, 0)
                               : b == L + 1 ? tz_model_block_numel(cfg, tz_model_n_blocks(cfg) - 1)
                                            : tz_model_layer_numel(cfg)));
    double *gwlm = cfg->tie_embeddings ? grads[0] : grads[L + 1] + hl.t[TZ_H_LM].offset;
    /* Head: logits = hN wlm^T, hN = rmsnorm(xL). */
    linear_bwd(dh, gwlm, dlogits, hN, wlm, N, C, V);
    rmsnorm_bwd(dx, grads[L + 1] + hl.t[TZ_H_NORM].offset, dh, xL, hnorm, rN, N, C);
    for (int i = L - 1; i >= 0; i--) {
      struct ref_layer *y = &ly[i];
      const double *P = params[i + 1];
      double *G = grads[i + 1];
#define W(idx) (P + ll.t[idx].offset)
#define GW(idx) (G + ll.t[idx].offset)
#define GB(idx) (bias ? GW(idx) : NULL)
      const double *h1 = pre ? y->h1 : y->x, *h2 = pre ? y->h2 : y->x2;
      struct ref_attn ra = {ref_scale(cfg, D), cfg->attn_softcap, tz_model_layer_window(cfg, i)};
      layer_freqs(cfg, i, T, D, freqs);
      /* dx is the gradient at this layer's output; out = x2 + a wd^T (post: x2 + norm(m),
       * m = a wd^T) */
      memcpy(dx2, dx, sizeof(double) * N * C);
      const double *dmo = dx;
      if (post) {
        memset(dm, 0, sizeof(double) * N * C);
        rmsnorm_bwd(dm, GW(TZ_L_MLP_POST_NORM), dx, y->m, W(TZ_L_MLP_POST_NORM), y->rm, N, C);
        dmo = dm;
      }
      memset(dh, 0, sizeof(double) * N * C);
      if (moe) {
        moe_bwd_ref(cfg, &ll, P, G, h2, N, &y->mo, dmo, daux, dh);
      } else {
        memset(da, 0, sizeof(double) * N * F);
        linear_bwd(da, GW(TZ_L_WD), dmo, y->a, W(TZ_L_WD), N, F, C);
        /* a = act(g) u: da/dg = u act'(g) */
        for (int e = 0; e < N * F; e++)
          dgu[e] = da[e] * y->u[e] * gate_slope(cfg->glu_act, y->g[e]);
        linear_bwd(dh, GW(TZ_L_WG), dgu, h2, W(TZ_L_WG), N, C, F);
        for (int e = 0; e < N * F; e++)
          dgu[e] = da[e] * gate_act(cfg->glu_act, y->g[e]);
        linear_bwd(dh, GW(TZ_L_WU), dgu, h2, W(TZ_L_WU), N, C, F);
      }
      if (!pre)
        for (int e = 0; e < N * C; e++)
          dx2[e] += dh[e];
      else
        rmsnorm_bwd(dx2, GW(TZ_L_MLP_NORM), dh, y->x2, W(TZ_L_MLP_NORM), y->r2, N, C);
      /* x2 = x + att wo^T (post: x + norm(o), o = att wo^T) */
      memcpy(dx, dx2, sizeof(double) * N * C);
      const double *doo = dx2;
      if (post) {
        memset(dob, 0, sizeof(double) * N * C);
        rmsnorm_bwd(dob, GW(TZ_L_ATTN_POST_NORM), dx2, y->o, W(TZ_L_ATTN_POST_NORM), y->ro, N, C);
        doo = dob;
      }
      memset(datt, 0, sizeof(double) * N * HD);
      linear_bwd(datt, GW(TZ_L_WO), doo, y->att, W(TZ_L_WO), N, HD, C);
      memset(dq, 0, sizeof(double) * N * HD);
      memset(dk, 0, sizeof(double) * N * KD);
      memset(dv, 0, sizeof(double) * N * KD);
      attention_bwd(dq, dk, dv, datt, y->P, y->q, y->k, y->v, B, T, H, Hkv, D, &ra);
      /* rope is a rotation: its backward is the inverse rotation */
      rope(dq, B, T, H, D, tz_model_rope_dims(cfg), rope_mscale(cfg), freqs, -1);
      rope(dk, B, T, Hkv, D, tz_model_rope_dims(cfg), rope_mscale(cfg), freqs, -1);
      /* the q and k norms, rows of D per head; then dqp, dkp are the gradients at the biased
       * projections */
      if (qkn) {
        memset(dqp, 0, sizeof(double) * N * HD);
        memset(dkp, 0, sizeof(double) * N * KD);
        rmsnorm_bwd(dqp, GW(TZ_L_QNORM), dq, y->qp, W(TZ_L_QNORM), y->rq, qrows, qw);
        rmsnorm_bwd(dkp, GW(TZ_L_KNORM), dk, y->kp, W(TZ_L_KNORM), y->rk, krows, kw);
      } else {
        memcpy(dqp, dq, sizeof(double) * N * HD);
        memcpy(dkp, dk, sizeof(double) * N * KD);
      }
      bias_bwd(GB(TZ_L_BQ), dqp, N, HD);
      bias_bwd(GB(TZ_L_BK), dkp, N, KD);
      bias_bwd(GB(TZ_L_BV), dv, N, KD);
      memset(dh, 0, sizeof(double) * N * C);
      linear_bwd(dh, GW(TZ_L_WQ), dqp, h1, W(TZ_L_WQ), N, C, HD);
      linear_bwd(dh, GW(TZ_L_WK), dkp, h1, W(TZ_L_WK), N, C, KD);
      linear_bwd(dh, GW(TZ_L_WV), dv, h1, W(TZ_L_WV), N, C, KD);
      if (!pre)
        for (int e = 0; e < N * C; e++)
          dx[e] += dh[e];
      else
        rmsnorm_bwd(dx, GW(TZ_L_ATTN_NORM), dh, y->x, W(TZ_L_ATTN_NORM), y->r1, N, C);
#undef W
#undef GW
#undef GB
    }
    /* transformers' nn.Embedding(padding_idx=pad_token_id): the lookup gives the pad token's
     * row no gradient (tied, the head's still reaches it) */
    int pad = cfg->has_pad && cfg->pad_id >= 0 && cfg->pad_id < cfg->vocab ? cfg->pad_id : -1;
    for (int n = 0; n < N; n++)
      if (tokens[n] != pad)
        for (int c = 0; c < C; c++)
          grads[0][tokens[n] * C + c] += dx[n * C + c] * emb;
  }
  for (int i = 0; moe && i < L; i++) {
    struct ref_moe *mo = &ly[i].mo;
    free(mo->p), free(mo->idx), free(mo->w), free(mo->g), free(mo->u), free(mo->a), free(mo->y);
    free(mo->sg), free(mo->su), free(mo->sa), free(mo->ys), free(mo->slog);
  }
  free(arena);
  free(ly);
  return oom ? tz_err_set(TZ_ENOMEM, "ref model: out of memory for the experts") : 0;
}

/* Layer i's blocks one after the other in merged (tz_model_layer_layout), or back. */
static void layer_copy(const struct tz_model_config *cfg, int i, double *const *blocks,
                       double *merged, int into_merged) {
  for (int k = 0, b = tz_model_block_of_layer(cfg, i); k < tz_model_layer_blocks(cfg); k++, b++) {
    size_t n = tz_model_block_numel(cfg, b);
    if (into_merged)
      memcpy(merged, blocks[b], sizeof(double) * n);
    else
      memcpy(blocks[b], merged, sizeof(double) * n);
    merged += n;
  }
}

int ref_model_run(const struct tz_model_config *cfg, double *const *params, const int32_t *tokens,
                  const int32_t *targets, int B, int T, double *logits_out, double *loss,
                  double *const *grads) {
  /* A layer's blocks (two with experts) as one buffer each, so that the reference reads a
   * layer's tensors as a whole whichever blocks hold them. */
  int L = cfg->n_layer, nb = tz_model_n_blocks(cfg);
  uint64_t nl = tz_model_layer_numel(cfg);
  double **pp = calloc((size_t)L + 2, sizeof *pp), **gg = calloc((size_t)L + 2, sizeof *gg);
  double *lp = malloc(sizeof(double) * (L * nl + 1)), *lg = calloc(L * nl + 1, sizeof(double));
  int rc = 0;
  if (!pp || !gg || !lp || !lg) {
    rc = tz_err_set(TZ_ENOMEM, "ref model: out of memory");
    goto out;
  }
  pp[0] = params[0];
  pp[L + 1] = params[nb - 1];
  if (grads) {
    gg[0] = grads[0];
    gg[L + 1] = grads[nb - 1];
  }
  for (int i = 0; i < L; i++) {
    pp[1 + i] = lp + i * nl;
    gg[1 + i] = lg + i * nl;
    layer_copy(cfg, i, params, pp[1 + i], 1);
  }
  rc = run_layers(cfg, pp, tokens, targets, B, T, logits_out, loss, grads ? gg : NULL);
  for (int i = 0; rc == 0 && grads && i < L; i++)
    layer_copy(cfg, i, grads, gg[1 + i], 0);
out:
  free(pp), free(gg), free(lp), free(lg);
  return rc;
}
