/* The cpu compute backend: float32 storage, GEMM through OpenBLAS, everything else plain loops
 * parallelised with OpenMP over independent outputs. Each output element is computed by one thread
 * with a loop order that does not depend on the thread count, so results are bit-identical for
 * any number of threads. Written for clarity first; the trainer's tiny demo model is what it must
 * run at a reasonable speed. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/adam.h"
#include "core/dtype.h"
#include "kernels/cpu/cpu.h"

/* Channel slices that one thread owns in rmsnorm's reduction over rows for dw. */
#define COL_BLOCK 64

static inline float ld(enum tz_dtype dt, const void *p, size_t i) {
  switch (dt) {
  case TZ_BF16: return tz_bf16_to_f32(((const uint16_t *)p)[i]);
  case TZ_F16: return tz_f16_to_f32(((const uint16_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

static inline void st(enum tz_dtype dt, void *p, size_t i, float v) {
  switch (dt) {
  case TZ_BF16: ((uint16_t *)p)[i] = tz_f32_to_bf16(v); break;
  case TZ_F16: ((uint16_t *)p)[i] = tz_f32_to_f16(v); break;
  default: ((float *)p)[i] = v;
  }
}

static void cpu_destroy(void *ctx) {
  struct cpu *c = ctx;
  free(c->tmp);
  free(c);
}

static int cpu_sync(void *ctx) {
  (void)ctx;
  return 0;
}

/* ---- memory ---- */

static int cpu_alloc(void *ctx, size_t bytes, void **out) {
  (void)ctx;
  size_t rounded = (bytes + 255) & ~(size_t)255;
  void *p = aligned_alloc(256, rounded);
  if (!p)
    return tz_err_set(TZ_ENOMEM, "compute cpu: cannot allocate %zu bytes", bytes);
  *out = p;
  return 0;
}

static void cpu_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}

static int cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  (void)ctx;
  memcpy(dst, src, bytes);
  return 0;
}

static int cpu_zero(void *ctx, void *dst, size_t bytes) {
  (void)ctx;
  memset(dst, 0, bytes);
  return 0;
}

/* ---- elementwise ---- */

static int cpu_fill(void *ctx, enum tz_dtype dt, void *x, float value, size_t n) {
  struct cpu *c = ctx;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (size_t i = 0; i < n; i++)
    st(dt, x, i, value);
  return 0;
}

static int cpu_scale(void *ctx, enum tz_dtype dt, void *x, float alpha, size_t n) {
  struct cpu *c = ctx;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (size_t i = 0; i < n; i++)
    st(dt, x, i, ld(dt, x, i) * alpha);
  return 0;
}

static int cpu_axpy(void *ctx, enum tz_dtype dt, void *y, float alpha, const void *x, size_t n) {
  struct cpu *c = ctx;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (size_t i = 0; i < n; i++) {
    float ax = alpha * ld(dt, x, i);
    st(dt, y, i, ld(dt, y, i) + ax);
  }
  return 0;
}

static int cpu_add(void *ctx, enum tz_dtype dt, void *out, const void *a, const void *b, size_t n) {
  struct cpu *c = ctx;
  if (dt == TZ_F32) {
    float *o = out;
    const float *x = a, *y = b;
#pragma omp parallel for num_threads(c->nt) schedule(static)
    for (size_t i = 0; i < n; i++)
      o[i] = x[i] + y[i];
    return 0;
  }
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (size_t i = 0; i < n; i++)
    st(dt, out, i, ld(dt, a, i) + ld(dt, b, i));
  return 0;
}

static int cpu_cast(void *ctx, void *dst, enum tz_dtype dst_dt, const void *src,
                    enum tz_dtype src_dt, size_t n) {
  struct cpu *c = ctx;
  if (dst_dt == src_dt) {
    memcpy(dst, src, n * tz_dtype_size(dst_dt));
    return 0;
  }
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (size_t i = 0; i < n; i++)
    st(dst_dt, dst, i, ld(src_dt, src, i));
  return 0;
}

/* ---- reductions, in the order compute.h specifies ---- */

static float chunk_partial(enum tz_dtype dt, const void *x, size_t begin, size_t len, int square) {
  float lane[32] = {0};
  for (size_t i = 0; i < len; i++) {
    float v = ld(dt, x, begin + i);
    if (square)
      v = v * v;
    lane[i % 32] += v;
  }
  for (int s = 16; s >= 1; s /= 2)
    for (int l = 0; l < s; l++)
      lane[l] += lane[l + s];
  return lane[0];
}

static size_t n_chunks(size_t n) { return (n + TZ_SUM_CHUNK - 1) / TZ_SUM_CHUNK; }

/* One level: x (n) -> partials (n_chunks(n)), the chunks shared out over nt threads (none are
 * started for nt == 1, as when the caller is already one of a team). */
static void sum_level(int nt, enum tz_dtype dt, const void *x, size_t n, int square,
                      float *partials) {
  size_t nc = n_chunks(n);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (size_t ci = 0; ci < nc; ci++) {
    size_t begin = ci * TZ_SUM_CHUNK;
    size_t len = n - begin < TZ_SUM_CHUNK ? n - begin : TZ_SUM_CHUNK;
    partials[ci] = chunk_partial(dt, x, begin, len, square);
  }
}

/* R of compute.h for x (n >= 1). The levels of partials alternate between a (n_chunks(n) floats)
 * and b (n_chunks(n_chunks(n)) floats): every level after the first is at most as long as b. */
static float sum_levels(int nt, enum tz_dtype dt, const void *x, size_t n, int square, float *a,
                        float *b) {
  float *bufs[2] = {a, b};
  sum_level(nt, dt, x, n, square, a);
  size_t len = n_chunks(n);
  int cur = 0;
  while (len > 1) {
    sum_level(nt, TZ_F32, bufs[cur], len, 0, bufs[cur ^ 1]);
    cur ^= 1;
    len = n_chunks(len);
  }
  return bufs[cur][0];
}

static int cpu_sum(void *ctx, float *out, enum tz_dtype dt, const void *x, size_t n, int square,
                   int accumulate) {
  struct cpu *c = ctx;
  float r = 0.0f;
  if (n > 0) {
    size_t na = n_chunks(n), nb = n_chunks(na);
    float *buf = malloc((na + nb) * sizeof *buf);
    if (!buf)
      return tz_err_set(TZ_ENOMEM, "compute cpu sum: cannot allocate %zu partials", na + nb);
    r = sum_levels(c->nt, dt, x, n, square, buf, buf + na);
    free(buf);
  }
  *out = (accumulate ? *out : 0.0f) + r;
  return 0;
}

/* One segment per thread at a time, each summed by that thread alone in the same levels as
 * cpu_sum, with the same final addition onto 0. */
static int cpu_sumsq_segments(void *ctx, float *out, enum tz_dtype dt, const void *x,
                              size_t seg_len, size_t n_seg) {
  struct cpu *c = ctx;
  if (seg_len == 0) {
    for (size_t j = 0; j < n_seg; j++)
      out[j] = 0.0f; /* 0 + R with R = 0 */
    return 0;
  }
  size_t na = n_chunks(seg_len), nb = n_chunks(na), per = na + nb;
  int nt = (size_t)c->nt < n_seg ? c->nt : (int)n_seg;
  float *buf = malloc((size_t)nt * per * sizeof *buf);
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "compute cpu sumsq_segments: cannot allocate %zu partials",
                      (size_t)nt * per);
  size_t seg_bytes = seg_len * tz_dtype_size(dt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t j = 0; j < n_seg; j++) {
    float *a = buf + (size_t)omp_get_thread_num() * per;
    out[j] = 0.0f + sum_levels(1, dt, (const char *)x + j * seg_bytes, seg_len, 1, a, a + na);
  }
  free(buf);
  return 0;
}

/* ---- matmul ----
 * C is cut into fixed tiles of MM_TILE_M x MM_TILE_N, each computed by one single-threaded BLAS
 * call over the whole K, the tiles spread over the OpenMP threads. The tiles do not depend on the
 * thread count, so neither do the bits; and only OpenMP's threads run, so BLAS's own pool does not
 * compete with them for the cores. */
#define MM_TILE_M 64
#define MM_TILE_N 512

static void gemm_tiles(int nt, int trans_a, int trans_b, int M, int N, int K, float alpha,
                       const float *A, int lda, const float *B, int ldb, float *C, int ldc) {
  int tm = (M + MM_TILE_M - 1) / MM_TILE_M, tn = (N + MM_TILE_N - 1) / MM_TILE_N;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int t = 0; t < tm * tn; t++) {
    int i0 = (t / tn) * MM_TILE_M, j0 = (t % tn) * MM_TILE_N;
    int m = M - i0 < MM_TILE_M ? M - i0 : MM_TILE_M, n = N - j0 < MM_TILE_N ? N - j0 : MM_TILE_N;
    /* rows i0.. of op(A): rows of A, or columns of A when transposed; likewise columns of op(B) */
    const float *a = trans_a ? A + i0 : A + (size_t)i0 * lda;
    const float *b = trans_b ? B + (size_t)j0 * ldb : B + j0;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, K, alpha, a, lda, b, ldb, 0.0f,
                C + (size_t)i0 * ldc + j0, ldc);
  }
}

/* The accumulating matmul's scratch, floats: 16 MiB (whole tiles of rows, at least one). */
#define MATMUL_TMP ((size_t)4 << 20)

static int cpu_matmul(void *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha,
                      const void *A, int lda, const void *B, int ldb, float beta, const void *R,
                      void *C, enum tz_dtype c_dt, int ldc) {
  struct cpu *c = ctx;
  (void)c_dt; /* the wrapper allows S or F32, and S is F32 here */
  float *Cf = C;
  if (beta == 0.0f) {
    if (K > 0 && alpha != 0.0f) {
      gemm_tiles(c->nt, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, Cf, ldc);
    } else {
      for (int i = 0; i < M; i++)
        memset(Cf + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
    }
    return 0;
  }
  /* Accumulating: each element's whole product first, then one addition (compute.h). BLAS
   * itself would add partial products over blocks of K into C one block at a time. The products
   * go through a scratch of about MATMUL_TMP floats, whole tiles of rows at a time (the same
   * BLAS calls as one product, so the same bits): a whole product kept the head's weight
   * gradient, V x C floats (1.2 GB at 152k tokens of width 2048), beside the plan's memory. */
  size_t fit = N > 0 ? MATMUL_TMP / (size_t)N / MM_TILE_M * MM_TILE_M : MM_TILE_M;
  int rows = fit < MM_TILE_M ? MM_TILE_M : fit < (size_t)M ? (int)fit : M;
  size_t need = (size_t)rows * N;
  if (need > c->tmp_n) {
    float *t = realloc(c->tmp, need * sizeof *t);
    if (!t)
      return tz_err_set(TZ_ENOMEM, "compute cpu matmul: cannot allocate a (%d,%d) product", rows,
                        N);
    c->tmp = t;
    c->tmp_n = need;
  }
  float *P = c->tmp;
  const float *Rf = R;
  for (int i0 = 0; i0 < M; i0 += rows) {
    int m = M - i0 < rows ? M - i0 : rows;
    const float *a = trans_a ? (const float *)A + i0 : (const float *)A + (size_t)i0 * lda;
    if (K > 0 && alpha != 0.0f)
      gemm_tiles(c->nt, trans_a, trans_b, m, N, K, alpha, a, lda, B, ldb, P, N);
    else
      memset(P, 0, (size_t)m * N * sizeof *P);
#pragma omp parallel for num_threads(c->nt) schedule(static)
    for (int i = 0; i < m; i++) {
      float *row = Cf + (size_t)(i0 + i) * ldc;
      const float *rrow = Rf + (size_t)(i0 + i) * ldc, *pr = P + (size_t)i * N;
      if (beta == 1.0f)
        for (int j = 0; j < N; j++)
          row[j] = rrow[j] + pr[j];
      else
        for (int j = 0; j < N; j++)
          row[j] = beta * rrow[j] + pr[j];
    }
  }
  return 0;
}

/* ---- embedding ---- */

static int check_tokens(const char *op, const int32_t *tok, int N, int V) {
  for (int n = 0; n < N; n++)
    if (tok[n] < 0 || tok[n] >= V)
      return tz_err_set(TZ_EINVAL, "compute cpu %s: token %d at index %d is outside [0, %d)", op,
                        tok[n], n, V);
  return 0;
}

static int cpu_embedding_fwd(void *ctx, void *out, const int32_t *tokens, const void *wte, int N,
                             int C, int V) {
  struct cpu *c = ctx;
  TZ_CHECK(check_tokens("embedding_fwd", tokens, N, V));
  float *o = out;
  const float *w = wte;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++)
    memcpy(o + (size_t)n * C, w + (size_t)tokens[n] * C, (size_t)C * sizeof(float));
  return 0;
}

static int cpu_embedding_bwd(void *ctx, void *dwte, const void *dout, const int32_t *tokens, int N,
                             int C, int V) {
  struct cpu *c = ctx;
  TZ_CHECK(check_tokens("embedding_bwd", tokens, N, V));
  /* Group the rows by token with a stable counting sort: start[v] .. start[v+1] lists, in
   * increasing n, the rows whose token is v. One thread owns each vocabulary row. */
  int *start = calloc((size_t)V + 1, sizeof *start), *order = malloc((size_t)N * sizeof *order);
  float *acc = malloc((size_t)c->nt * C * sizeof *acc);
  if (!start || !order || !acc) {
    free(start), free(order), free(acc);
    return tz_err_set(TZ_ENOMEM, "compute cpu embedding_bwd: out of memory (V=%d, N=%d)", V, N);
  }
  for (int n = 0; n < N; n++)
    start[tokens[n] + 1]++;
  for (int v = 0; v < V; v++)
    start[v + 1] += start[v];
  int *fill = malloc((size_t)V * sizeof *fill);
  if (!fill) {
    free(start), free(order), free(acc);
    return tz_err_set(TZ_ENOMEM, "compute cpu embedding_bwd: out of memory (V=%d)", V);
  }
  memcpy(fill, start, (size_t)V * sizeof *fill);
  for (int n = 0; n < N; n++)
    order[fill[tokens[n]]++] = n;
  free(fill);
  float *dw = dwte;
  const float *d = dout;
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 8)
  for (int v = 0; v < V; v++) {
    if (start[v] == start[v + 1])
      continue;
    float *a = acc + (size_t)omp_get_thread_num() * C;
    for (int j = 0; j < C; j++)
      a[j] = 0.0f;
    for (int i = start[v]; i < start[v + 1]; i++) {
      const float *src = d + (size_t)order[i] * C;
      for (int j = 0; j < C; j++)
        a[j] += src[j];
    }
    float *row = dw + (size_t)v * C;
    for (int j = 0; j < C; j++)
      row[j] += a[j];
  }
  free(start);
  free(order);
  free(acc);
  return 0;
}

/* ---- rmsnorm ---- */

static int cpu_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *x, const void *w, int N,
                           int C, float eps, float off) {
  struct cpu *c = ctx;
  float *o = out;
  const float *xf = x, *wf = w;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++) {
    const float *xr = xf + (size_t)n * C;
    float ss = 0.0f;
    for (int j = 0; j < C; j++)
      ss += xr[j] * xr[j];
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    rstd[n] = r;
    float *orow = o + (size_t)n * C;
    for (int j = 0; j < C; j++)
      orow[j] = (xr[j] * r) * (off + wf[j]);
  }
  return 0;
}

static int cpu_rmsnorm_bwd(void *ctx, void *dx, const void *dres, void *dw, const void *dout,
                           const void *x, const void *w, const float *rstd, int N, int C,
                           float off) {
  struct cpu *c = ctx;
  float *dxf = dx, *dwf = dw;
  const float *dy = dout, *xf = x, *wf = w, *dr = dres;
  /* dx_j = dres_j + r * (w_j dy_j - x_j r^2 mean_i(w_i dy_i x_i)), w_j the offset weight */
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++) {
    const float *dyr = dy + (size_t)n * C, *xr = xf + (size_t)n * C;
    float r = rstd[n];
    float dot = 0.0f;
    for (int j = 0; j < C; j++)
      dot += ((off + wf[j]) * dyr[j]) * xr[j];
    float k = (r * r) * (dot / (float)C);
    float *dxr = dxf + (size_t)n * C;
    const float *drr = dr ? dr + (size_t)n * C : NULL;
    for (int j = 0; j < C; j++)
      dxr[j] = (drr ? drr[j] : 0.0f) + r * ((off + wf[j]) * dyr[j] - xr[j] * k);
  }
  int nb = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int b = 0; b < nb; b++) {
    int c0 = b * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
    float acc[COL_BLOCK] = {0};
    for (int n = 0; n < N; n++) {
      const float *dyr = dy + (size_t)n * C, *xr = xf + (size_t)n * C;
      float r = rstd[n];
      for (int j = c0; j < c1; j++)
        acc[j - c0] += dyr[j] * (xr[j] * r);
    }
    for (int j = c0; j < c1; j++)
      dwf[j] += acc[j - c0];
  }
  return 0;
}

/* ---- rope ---- */

/* pos as compute.h's "Packed documents" has it, or TZ_EINVAL naming the first row and token that
 * break it. */
static int check_pos(const char *op, const int32_t *pos, int B, int T) {
  if (!pos)
    return 0;
  for (int b = 0; b < B; b++) {
    const int32_t *p = pos + (size_t)b * T;
    for (int t = 0; t < T; t++)
      if (p[t] != 0 && (t == 0 || p[t] != p[t - 1] + 1))
        return tz_err_set(TZ_EINVAL,
                          "compute cpu %s: pos %d at row %d token %d (a position is 0 or the one "
                          "before it plus 1, and each row starts at 0)",
                          op, p[t], b, t);
  }
  return 0;
}

static int cpu_rope(void *ctx, void *x, int B, int T, int nh, int D, int R, const double *inv_freq,
                    float mscale, int inverse, const int32_t *pos) {
  struct cpu *c = ctx;
  TZ_CHECK(check_pos("rope", pos, B, T));
  int half = R / 2; /* dims R..D-1 pass unchanged */
  float *cs = malloc((size_t)T * half * 2 * sizeof *cs);
  if (!cs)
    return tz_err_set(TZ_ENOMEM, "compute cpu rope: cannot allocate a (%d,%d) table", T, D);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      double ang = (double)t * inv_freq[i];
      float co = (float)cos(ang), si = (float)sin(ang);
      if (mscale != 1.0f)
        co *= mscale, si *= mscale;
      cs[((size_t)t * half + i) * 2] = co;
      cs[((size_t)t * half + i) * 2 + 1] = inverse ? -si : si;
    }
  float *xf = x;
#pragma omp parallel for num_threads(c->nt) schedule(static) collapse(2)
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int p = pos ? pos[(size_t)b * T + t] : t; /* < T: each row starts at 0 */
      const float *ct = cs + (size_t)p * half * 2;
      for (int h = 0; h < nh; h++) {
        float *v = xf + (((size_t)b * T + t) * nh + h) * D;
        for (int i = 0; i < half; i++) {
          float co = ct[2 * i], si = ct[2 * i + 1];
          float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * co - x2 * si;
          v[i + half] = x2 * co + x1 * si;
        }
      }
    }
  free(cs);
  return 0;
}

/* ---- bias ---- */

static int cpu_bias_add(void *ctx, void *x, const void *b, int N, int n) {
  struct cpu *c = ctx;
  float *xf = x;
  const float *bf = b;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int r = 0; r < N; r++) {
    float *row = xf + (size_t)r * n;
    for (int j = 0; j < n; j++)
      row[j] = row[j] + bf[j];
  }
  return 0;
}

/* One thread owns a slice of COL_BLOCK columns and walks the rows in increasing order, as
 * rmsnorm's dw does, so the sums do not depend on the thread count. */
static int cpu_bias_grad(void *ctx, void *db, const void *dy, int N, int n) {
  struct cpu *c = ctx;
  float *dbf = db;
  const float *d = dy;
  int nb = (n + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int b = 0; b < nb; b++) {
    int c0 = b * COL_BLOCK, c1 = c0 + COL_BLOCK < n ? c0 + COL_BLOCK : n;
    float acc[COL_BLOCK] = {0};
    for (int r = 0; r < N; r++) {
      const float *row = d + (size_t)r * n;
      for (int j = c0; j < c1; j++)
        acc[j - c0] += row[j];
    }
    for (int j = c0; j < c1; j++)
      dbf[j] += acc[j - c0];
  }
  return 0;
}

/* ---- attention ---- */

static float dotf(const float *a, const float *b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* The attention's score of q and k (compute.h, struct tz_attn_opts): the product times scale, soft-
 * capped when cap > 0; *slope (unless NULL) receives d score / d (q . k scale), 1 - tanh^2. */
static float attn_score(const float *q, const float *k, int D, float scale, float cap,
                        float *slope) {
  float s = dotf(q, k, D) * scale;
  if (cap > 0.0f) {
    float th = tanhf(s / cap);
    s = cap * th;
    if (slope)
      *slope = 1.0f - th * th;
  } else if (slope) {
    *slope = 1.0f;
  }
  return s;
}

/* The first key query t of row b scores: its document's first, or the window's. */
static int attn_first_key(const int32_t *pos, int b, int T, int t, int window) {
  int u0 = pos ? t - pos[(size_t)b * T + t] : 0;
  return window > 0 && t - window + 1 > u0 ? t - window + 1 : u0;
}

static int cpu_attention_fwd(void *ctx, void *out, float *lse, const void *q, const void *k,
                             const void *v, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                             const struct tz_attn_opts *opt) {
  struct cpu *c = ctx;
  TZ_CHECK(check_pos("attention_fwd", pos, B, T));
  float *scratch = malloc((size_t)c->nt * T * sizeof *scratch);
  if (!scratch)
    return tz_err_set(TZ_ENOMEM, "compute cpu attention_fwd: cannot allocate %d scores", T);
  const float *qf = q, *kf = k, *vf = v;
  float *of = out;
  int group = H / Hkv;
  float scale = opt->scale > 0.0f ? opt->scale : 1.0f / sqrtf((float)D), cap = opt->softcap;
  /* One row of scores (b, h, t) per iteration; the (T,T) matrix is never formed. */
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 16) collapse(3)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        float *s = scratch + (size_t)omp_get_thread_num() * T;
        int hk = h / group;
        int u0 = attn_first_key(pos, b, T, t, opt->window);
        const float *qt = qf + (((size_t)b * T + t) * H + h) * D;
        float m = -INFINITY;
        for (int u = u0; u <= t; u++) {
          s[u] = attn_score(qt, kf + (((size_t)b * T + u) * Hkv + hk) * D, D, scale, cap, NULL);
          if (s[u] > m)
            m = s[u];
        }
        float sum = 0.0f;
        for (int u = u0; u <= t; u++) {
          s[u] = expf(s[u] - m);
          sum += s[u];
        }
        lse[((size_t)b * H + h) * T + t] = m + logf(sum);
        float inv = 1.0f / sum;
        float *ot = of + (((size_t)b * T + t) * H + h) * D;
        for (int d = 0; d < D; d++)
          ot[d] = 0.0f;
        for (int u = u0; u <= t; u++) {
          float p = s[u] * inv;
          const float *vu = vf + (((size_t)b * T + u) * Hkv + hk) * D;
          for (int d = 0; d < D; d++)
            ot[d] += p * vu[d];
        }
      }
  free(scratch);
  return 0;
}

static int cpu_attention_bwd(void *ctx, void *dq, void *dk, void *dv, float *delta,
                             const void *dout, const void *q, const void *k, const void *v,
                             const void *out, const float *lse, int B, int T, int H, int Hkv, int D,
                             const int32_t *pos, const struct tz_attn_opts *opt) {
  struct cpu *c = ctx;
  TZ_CHECK(check_pos("attention_bwd", pos, B, T));
  const float *qf = q, *kf = k, *vf = v, *of = out, *dof = dout;
  float *dqf = dq, *dkf = dk, *dvf = dv;
  int group = H / Hkv, window = opt->window;
  float scale = opt->scale > 0.0f ? opt->scale : 1.0f / sqrtf((float)D), cap = opt->softcap;
#define Q_AT(b, t, h) (qf + (((size_t)(b)*T + (t)) * H + (h)) * D)
#define DO_AT(b, t, h) (dof + (((size_t)(b)*T + (t)) * H + (h)) * D)
#define K_AT(b, t, h) (kf + (((size_t)(b)*T + (t)) * Hkv + (h)) * D)
#define V_AT(b, t, h) (vf + (((size_t)(b)*T + (t)) * Hkv + (h)) * D)
  /* With p = exp(s - lse), dp = dout_t . v_u and delta_t = dout_t . out_t, the score gradient is
   * ds = p (dp - delta_t); dq_t = scale sum_u ds k_u, dk_u = scale sum_{h,t} ds q_t and
   * dv_u = sum_{h,t} p dout_t. Pass 1 owns query rows, pass 2 owns key rows, and each recomputes
   * p and ds, so no thread ever adds into another's output. With pos, query t reads the keys
   * [t - pos_t, t] of its document, and key u is read by the queries [u, end of u's document);
   * with a window, the keys and queries less than window apart. Softcapped, ds goes back through
   * the cap's slope before the product's scale. */
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 16) collapse(3)
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++) {
        int hk = h / group;
        const float *qt = Q_AT(b, t, h), *dot_ = DO_AT(b, t, h);
        float dl = dotf(dot_, of + (((size_t)b * T + t) * H + h) * D, D);
        delta[((size_t)b * H + h) * T + t] = dl;
        float l = lse[((size_t)b * H + h) * T + t];
        float *dqt = dqf + (((size_t)b * T + t) * H + h) * D;
        for (int d = 0; d < D; d++)
          dqt[d] = 0.0f;
        for (int u = attn_first_key(pos, b, T, t, window); u <= t; u++) {
          const float *ku = K_AT(b, u, hk);
          float slope;
          float p = expf(attn_score(qt, ku, D, scale, cap, &slope) - l);
          float ds = p * (dotf(dot_, V_AT(b, u, hk), D) - dl);
          float w = (ds * slope) * scale;
          for (int d = 0; d < D; d++)
            dqt[d] += w * ku[d];
        }
      }
#pragma omp parallel for num_threads(c->nt) schedule(dynamic, 16) collapse(3)
  for (int b = 0; b < B; b++)
    for (int hk = 0; hk < Hkv; hk++)
      for (int u = 0; u < T; u++) {
        const float *ku = K_AT(b, u, hk), *vu = V_AT(b, u, hk);
        float *dku = dkf + (((size_t)b * T + u) * Hkv + hk) * D;
        float *dvu = dvf + (((size_t)b * T + u) * Hkv + hk) * D;
        for (int d = 0; d < D; d++)
          dku[d] = dvu[d] = 0.0f;
        int end = T; /* one past the last query of u's document */
        if (pos)
          for (end = u + 1; end < T && pos[(size_t)b * T + end] != 0; end++)
            ;
        if (window > 0 && end > u + window)
          end = u + window;
        for (int h = hk * group; h < (hk + 1) * group; h++)
          for (int t = u; t < end; t++) {
            const float *qt = Q_AT(b, t, h), *dot_ = DO_AT(b, t, h);
            float l = lse[((size_t)b * H + h) * T + t];
            float dl = delta[((size_t)b * H + h) * T + t];
            float slope;
            float p = expf(attn_score(qt, ku, D, scale, cap, &slope) - l);
            float ds = p * (dotf(dot_, vu, D) - dl);
            float w = (ds * slope) * scale;
            for (int d = 0; d < D; d++) {
              dku[d] += w * qt[d];
              dvu[d] += p * dot_[d];
            }
          }
      }
#undef Q_AT
#undef DO_AT
#undef K_AT
#undef V_AT
  return 0;
}

/* ---- gated activations ---- */

/* gelu with tanh (compute.h, enum tz_glu) and, unless NULL, its derivative. */
static float gelu_tanh(float g, float *slope) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f; /* sqrt(2/pi) */
  float th = tanhf(k0 * (g + k1 * (g * g * g)));
  if (slope)
    *slope =
        0.5f * (1.0f + th) + (0.5f * g) * ((1.0f - th * th) * (k0 * (1.0f + 3.0f * k1 * (g * g))));
  return (0.5f * g) * (1.0f + th);
}

/* silu(g), the forward's expression (its bits) */
static float silu(float g) { return g / (1.0f + expf(-g)); }

static int cpu_glu_fwd(void *ctx, enum tz_glu act, void *out, const void *g, const void *u,
                       size_t n) {
  struct cpu *c = ctx;
  float *o = out;
  const float *gf = g, *uf = u;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (size_t i = 0; i < n; i++)
    o[i] = (act == TZ_GLU_GELU_TANH ? gelu_tanh(gf[i], NULL) : silu(gf[i])) * uf[i];
  return 0;
}

static int cpu_glu_bwd(void *ctx, enum tz_glu act, void *dg, void *du, void *out, const void *dout,
                       const void *g, const void *u, size_t n) {
  struct cpu *c = ctx;
  float *dgf = dg, *duf = du, *o = out;
  const float *dy = dout, *gf = g, *uf = u;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (size_t i = 0; i < n; i++) {
    float gi = gf[i], ui = uf[i], d = dy[i], slope, a;
    if (act == TZ_GLU_GELU_TANH) {
      a = gelu_tanh(gi, &slope);
      if (o) /* glu_fwd's expression, for its bits */
        o[i] = a * ui;
    } else { /* silu'(g) = sig (1 + g (1 - sig)); du from g sig, as before (its bits) */
      float sig = 1.0f / (1.0f + expf(-gi));
      slope = sig * (1.0f + gi * (1.0f - sig));
      a = gi * sig;
      if (o)
        o[i] = silu(gi) * ui;
    }
    dgf[i] = (d * ui) * slope;
    duf[i] = d * a;
  }
  return 0;
}

/* ---- cross-entropy ---- */

/* A logit through the softcap (compute.h, tz_compute_xent); cap 0: itself. */
static float capped(float l, float cap) { return cap > 0.0f ? cap * tanhf(l / cap) : l; }

static int cpu_xent(void *ctx, float *losses, void *dlogits, const void *logits,
                    const int32_t *targets, int N, int V, float dscale, float cap) {
  struct cpu *c = ctx;
  for (int n = 0; n < N; n++)
    if (targets[n] != TZ_TARGET_IGNORE && (targets[n] < 0 || targets[n] >= V))
      return tz_err_set(TZ_EINVAL,
                        "compute cpu xent target: token %d at index %d is not in [0, %d) nor "
                        "TZ_TARGET_IGNORE",
                        targets[n], n, V);
  const float *lf = logits;
  float *dl = dlogits;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (int n = 0; n < N; n++) {
    if (targets[n] == TZ_TARGET_IGNORE) { /* not a target: no loss, no gradient */
      losses[n] = 0.0f;
      if (dl)
        memset(dl + (size_t)n * V, 0, (size_t)V * sizeof *dl);
      continue;
    }
    const float *row = lf + (size_t)n * V;
    float m = -INFINITY;
    for (int j = 0; j < V; j++) {
      float z = capped(row[j], cap);
      m = z > m ? z : m;
    }
    /* the sum in double: in float, once a trained model's softmax is sharp, the sum nears 1
     * from its largest term and the vocabulary's many terms below half its ulp (6e-8) are lost;
     * at a vocabulary of 200064 the loss came out 1.2e-3 low (tests/test_compute_cpu.c) */
    double sum = 0.0;
    for (int j = 0; j < V; j++)
      sum += (double)expf(capped(row[j], cap) - m);
    float lse = m + (float)log(sum);
    losses[n] = lse - capped(row[targets[n]], cap);
    if (dl) {
      float *drow = dl + (size_t)n * V;
      for (int j = 0; j < V; j++) {
        float z = capped(row[j], cap);
        float p = expf(z - lse);
        float g = (j == targets[n] ? p - 1.0f : p) * dscale;
        if (cap > 0.0f) { /* dz/dl = 1 - tanh^2 = 1 - (z / cap)^2 */
          float th = z / cap;
          g *= 1.0f - th * th;
        }
        drow[j] = g;
      }
    }
  }
  return 0;
}

static int cpu_softcap(void *ctx, void *logits, size_t n, float cap) {
  struct cpu *c = ctx;
  float *l = logits;
#pragma omp parallel for num_threads(c->nt) schedule(static)
  for (size_t i = 0; i < n; i++)
    l[i] = capped(l[i], cap);
  return 0;
}

/* At once, on the instance's threads: the same call the trainer made before Adam was an op. */
static int cpu_adam(void *ctx, const struct tz_adam_params *p, float *master, float *m, float *v,
                    const void *grad, enum tz_dtype grad_dtype, void *param_copy,
                    enum tz_dtype copy_dtype, size_t n) {
  struct cpu *c = ctx;
  struct tz_adam_cpu_opts o = {.threads = c->nt};
  return tz_adam_cpu(p, master, m, v, grad, grad_dtype, param_copy, copy_dtype, n, &o);
}

static const struct tz_compute_ops cpu_ops = {
    .destroy = cpu_destroy,
    .sync = cpu_sync,
    .stream = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .fill = cpu_fill,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .add = cpu_add,
    .cast = cpu_cast,
    .sum = cpu_sum,
    .sumsq_segments = cpu_sumsq_segments,
    .matmul = cpu_matmul,
    .embedding_fwd = cpu_embedding_fwd,
    .embedding_bwd = cpu_embedding_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .rope = cpu_rope,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .docs = 1,
    .variants = 1,
    .glu_fwd = cpu_glu_fwd,
    .glu_bwd = cpu_glu_bwd,
    .xent = cpu_xent,
    .softcap = cpu_softcap,
    .adam = cpu_adam,
    .moe_route = tz_cpu_moe_route,
    .moe_route_bwd = tz_cpu_moe_route_bwd,
    .moe_gather = tz_cpu_moe_gather,
    .moe_scatter = tz_cpu_moe_scatter,
    .moe_combine = tz_cpu_moe_combine,
    .moe_combine_bwd = tz_cpu_moe_combine_bwd,
    .moe_gate_fwd = tz_cpu_moe_gate_fwd,
    .moe_gate_bwd = tz_cpu_moe_gate_bwd,
};

static int cpu_probe(char *why, size_t why_len) {
  (void)why, (void)why_len;
  return 0;
}

static int cpu_create(const struct tz_compute_params *p, const int64_t *settings, tz_compute *cm) {
  (void)settings; /* it has none */
  if (p->dtype != TZ_F32 || p->grad_dtype != TZ_F32)
    return tz_err_set(TZ_ENOTSUP,
                      "compute cpu: storage %s, gradients %s: the cpu backend is float32 only",
                      tz_dtype_name(p->dtype), tz_dtype_name(p->grad_dtype));
  struct cpu *c = calloc(1, sizeof *c);
  if (!c)
    return tz_err_set(TZ_ENOMEM, "compute cpu: out of memory");
  c->nt = p->n_threads > 0 ? p->n_threads : omp_get_max_threads();
  if (c->nt < 1)
    c->nt = 1;
  /* BLAS runs single-threaded inside OpenMP's threads (see matmul). */
  openblas_set_num_threads(1);
  cm->ops = &cpu_ops;
  cm->ctx = c;
  cm->n_threads = c->nt;
  return 0;
}

const struct tz_compute_backend tz_compute_backend_cpu = {
    .name = "cpu",
    .probe = cpu_probe,
    .create = cpu_create,
    .variants_always = 1,
    .moe = 2,
};
