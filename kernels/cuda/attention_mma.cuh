/* The pieces the tensor-core attention kernels share (attention_mma.cu: forward and the two-pass
 * backward; attention_wgmma.cu: warpgroup MMA):
 * fragment addressing in shared tiles, tile widths, cp.async tile loads, and quad reductions. The
 * fragment layouts and the tile widths are described at the top of attention_mma.cu. */
#ifndef TZ_KERNELS_CUDA_ATTENTION_MMA_CUH
#define TZ_KERNELS_CUDA_ATTENTION_MMA_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/ptx.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

namespace tz_attn {

using namespace tz_ptx;

/* ---- fragment addressing in a row-major shared tile with pitch P elements ---- */

/* A fragment of the 16x16 block at (r0, c0). */
template <int P, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T *s, int r0, int c0, int lane) {
  ldsm_x4(a, s + (r0 + (lane & 15)) * P + c0 + (lane >> 4) * 8);
}

/* B fragments for two n-tiles from a tile stored n-major (row n holds the k values: B^T
 * row-major, e.g. K when B = K^T): rows n0..n0+15, k columns k0..k0+15. b[0], b[1] are n-tile
 * n0's b0, b1 and b[2], b[3] n-tile n0+8's. */
template <int P, typename T>
__device__ __forceinline__ void load_b_nmajor(uint32_t (&b)[4], const T *s, int n0, int k0,
                                              int lane) {
  ldsm_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * P + k0 + ((lane >> 3) & 1) * 8);
}

/* B fragments for two n-tiles from a tile stored k-major (row k holds the n values, e.g. V when
 * B = V): rows k0..k0+15, n columns n0..n0+15, through the transposing ldmatrix. */
template <int P, typename T>
__device__ __forceinline__ void load_b_kmajor(uint32_t (&b)[4], const T *s, int k0, int n0,
                                              int lane) {
  ldsm_x4_t(b, s + (k0 + (lane & 15)) * P + n0 + (lane >> 4) * 8);
}

/* The A fragment for columns 16j..16j+15 of a warp's (16, 8 * NT) float C tiles. */
template <typename T, int NT>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&c)[NT][4], int j) {
  a[0] = mma16<T>::pack(c[2 * j][0], c[2 * j][1]);
  a[1] = mma16<T>::pack(c[2 * j][2], c[2 * j][3]);
  a[2] = mma16<T>::pack(c[2 * j + 1][0], c[2 * j + 1][1]);
  a[3] = mma16<T>::pack(c[2 * j + 1][2], c[2 * j + 1][3]);
}

/* A tile width: DP columns in shared memory (a multiple of 16), row pitch P = DP + 8 elements
 * (rows stay 16-byte aligned, and P / 8 is odd, so the 8 rows an ldmatrix reads fall in distinct
 * bank groups). PAD: the true head dim D may be less than DP and is a runtime value. */
template <int DP_, bool PAD_> struct width {
  static constexpr int DP = DP_;
  static constexpr bool PAD = PAD_;
  static constexpr int P = DP_ + 8;
  static_assert(DP_ % 16 == 0 && DP_ >= 32 && DP_ <= 128, "tile width");
};

/* ROWS rows of D elements from global (row t at base + t * stride) into a shared tile of W's
 * width, with cp.async by a block of NT threads; rows at or past `valid` and columns D..DP-1 are
 * zero-filled (nothing is read for them). Exact widths copy 16 bytes at a time, padded ones 8. */
template <int ROWS, typename W, int NT = 128, typename T>
__device__ __forceinline__ void load_tile(T *s, const T *base, size_t stride, int row0, int valid,
                                          int D) {
  constexpr int CW = W::PAD ? 4 : 8; /* elements per copy */
  constexpr int CHUNKS = W::DP / CW;
  for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NT) {
    int r = i / CHUNKS, col = (i % CHUNKS) * CW;
    if constexpr (W::PAD) {
      int ok = r < valid && col < D;
      const T *src = base + (ok ? (size_t)(row0 + r) * stride + col : 0);
      cp_async8(s + r * W::P + col, src, ok ? 8 : 0);
    } else {
      (void)D;
      int ok = r < valid;
      const T *src = base + (ok ? (size_t)(row0 + r) * stride : 0) + col;
      cp_async16(s + r * W::P + col, src, ok ? 16 : 0);
    }
  }
}

/* Elements d and d + 1 of a row as one 32-bit store. p is 4-byte aligned wherever the kernels
 * call this: d is even, and so are row pitches and head offsets (D % 4 == 0), in tensors at
 * least 8-byte aligned. (A memcpy here compiled to four byte stores: T promises only 2.) */
template <typename T> __device__ __forceinline__ void store_pair(T *p, float lo, float hi) {
  *reinterpret_cast<uint32_t *>(p) = mma16<T>::pack(lo, hi);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/* The softcap's tanh by the hardware's tanh.approx.f32 (the setting softcap_tanh approx: one
 * instruction, relative error at most 2^-10.987). */
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
/* The softcap's exact tanh as 1 - 2 / (2^(2 x log2 e) + 1): two special-function instructions,
 * the 2^x and rcp.approx (1 ulp), where tanhf has them and its own steps around them; the capped
 * kernels are held by their instruction count, not that unit (docs/cuda-kernels.md). Within 3e-7
 * of tanh, tanhf's within 1e-7. 2^(2 x log2 e) is clamped at 2^64, where tanh is 1 in float. */
__device__ __forceinline__ float tanh_exact(float x) {
  float x2 = __fmul_rn(x, 2.0f * LOG2E);
  x2 = x2 > 64.0f ? 64.0f : x2; /* not fminf: a NaN stays one */
  const float d = __fadd_rn(ex2_approx(x2), 1.0f);
  return __fmaf_rn(-2.0f, rcp_approx(d), 1.0f);
}

/* How the kernels compute a score's log2 and the probability's 2^x. CAP: the softcap, fixed for
 * a kernel (attention_wgmma.cu builds one per kind, so a tile's loop is straight-line code):
 * CAP_NONE, CAP_EXACT (tanh_exact), CAP_APPROX (tanh_approx); CAP_RUNTIME reads cap_in > 0 and
 * approx at every score (the mma.sync kernels, built once for all calls). */
enum { CAP_RUNTIME = -1, CAP_NONE = 0, CAP_EXACT = 1, CAP_APPROX = 2 };

/* Whether a kernel of kind CAP computes a softcap (and ds takes its slope). */
template <int CAP> __device__ __forceinline__ bool capped(float cap_in) {
  return CAP > 0 || (CAP == CAP_RUNTIME && cap_in > 0.0f);
}

/* A probability's 2^x: the capped kernels' by ex2.approx.ftz (one instruction where exp2f is
 * four; a probability below 2^-126 becomes 0), the others' by exp2f. (FlashAttention 4's split
 * of a share of the 2^x onto the FMA units by a polynomial measured slower at every share: the
 * kernels are held by their instruction count, not the special-function unit;
 * docs/cuda-kernels.md.) */
template <int CAP> __device__ __forceinline__ float prob_exp2(float x) {
  return CAP > 0 ? ex2_approx(x) : exp2f(x);
}

/* A raw product's score in the log2 domain: raw * scale * log2(e), or with a softcap (cap_in =
 * scale / cap > 0; common.cuh, struct tz_attn_var) cap tanh(raw * scale / cap) log2(e), whose
 * slope (d capped / d uncapped: 1 - tanh^2) goes to *slope where slope is not NULL. approx
 * (CAP_RUNTIME only): the tanh by tanh_approx. The kernels built for the exact softcap
 * (CAP_EXACT) take its score in five instructions where tanh_exact and its scaling take nine:
 * the two multiplies before the 2^x as one by a constant of the kernel, no clamp (rcp.approx of
 * 2^x + 1 = inf is 0, so tanh is 1 there as it must be), and cap tanh log2(e) = cap log2(e)
 * (1 - 2 r) as one FMA of r; the slope's 1 - tanh^2 as one FMA too (docs/cuda-kernels.md). */
template <int CAP>
__device__ __forceinline__ float score_log2(float raw, float scale_log2, float cap_in,
                                            float cap_log2, float *slope = nullptr,
                                            bool approx = false) {
  if (CAP == CAP_EXACT) {
    /* r = 1 / (2^(2 raw cap_in log2 e) + 1), tanh = 1 - 2 r */
    const float r =
        rcp_approx(__fadd_rn(ex2_approx(__fmul_rn(raw, __fmul_rn(cap_in, 2.0f * LOG2E))), 1.0f));
    if (slope) {
      const float th = __fmaf_rn(-2.0f, r, 1.0f);
      *slope = __fmaf_rn(-th, th, 1.0f);
    }
    return __fmaf_rn(__fmul_rn(-2.0f, cap_log2), r, cap_log2);
  }
  if (CAP > 0 || (CAP == CAP_RUNTIME && cap_in > 0.0f)) {
    float t = __fmul_rn(raw, cap_in);
    float th = CAP == CAP_APPROX || (CAP == CAP_RUNTIME && approx) ? tanh_approx(t) : tanh_exact(t);
    if (slope)
      *slope = __fsub_rn(1.0f, __fmul_rn(th, th));
    return __fmul_rn(th, cap_log2);
  }
  return __fmul_rn(raw, scale_log2);
}

/* ---- the forward's online softmax (attention_mma.cu and attention_wgmma.cu) ---- */

/* One key tile's probabilities for a warp's 16 rows (row_lo, row_hi: this thread's two), the
 * tile's keys from key0: the scores s (raw products) become probabilities in place, the running
 * max m (of scores * scale * log2(e)) and this thread's part of the running sum l are updated,
 * and a_lo, a_hi are the factors exp2(old max - new max) the output is to be rescaled by. mask:
 * hide keys after the row (a tile that reaches past the warp's first row), and keys before
 * st_lo, st_hi, the rows' first keys (their documents' or windows', tz_first_key; 0 without).
 * cap_in, cap_log2: a softcap (score_log2; 0: none). */
template <int NS, int CAP = CAP_RUNTIME>
__device__ __forceinline__ void
softmax_probs(float (&s)[NS][4], float &m_lo, float &m_hi, float &l_lo, float &l_hi, float &a_lo,
              float &a_hi, bool mask, int key0, int row_lo, int row_hi, int c, float scale_log2,
              int st_lo = 0, int st_hi = 0, float cap_in = 0.0f, float cap_log2 = 0.0f,
              bool approx = false) {
  float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
  for (int nt = 0; nt < NS; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int key = key0 + nt * 8 + 2 * c + (e & 1);
      int row = e < 2 ? row_lo : row_hi, st = e < 2 ? st_lo : st_hi;
      float x = score_log2<CAP>(s[nt][e], scale_log2, cap_in, cap_log2, nullptr, approx);
      s[nt][e] = mask && (key > row || key < st) ? -INFINITY : x;
    }
    mx_lo = fmaxf(mx_lo, fmaxf(s[nt][0], s[nt][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[nt][2], s[nt][3]));
  }
  /* Key 0 is in tile 0 and visible to every row, so the max is finite from the first tile;
   * with packed documents a row may see no key of the tiles so far: its max stays -inf, its
   * factor 1 and its probabilities 0 (the same arithmetic otherwise). */
  mx_lo = quad_max(mx_lo);
  mx_hi = quad_max(mx_hi);
  a_lo = mx_lo == -INFINITY ? 1.0f : exp2f(__fsub_rn(m_lo, mx_lo));
  a_hi = mx_hi == -INFINITY ? 1.0f : exp2f(__fsub_rn(m_hi, mx_hi));
  m_lo = mx_lo;
  m_hi = mx_hi;
  const float b_lo = mx_lo == -INFINITY ? 0.0f : mx_lo, b_hi = mx_hi == -INFINITY ? 0.0f : mx_hi;
  float ps_lo = 0.0f, ps_hi = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NS; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float y = __fsub_rn(s[nt][e], e < 2 ? b_lo : b_hi);
      s[nt][e] = prob_exp2<CAP>(y);
    }
    ps_lo = __fadd_rn(ps_lo, __fadd_rn(s[nt][0], s[nt][1]));
    ps_hi = __fadd_rn(ps_hi, __fadd_rn(s[nt][2], s[nt][3]));
  }
  l_lo = __fadd_rn(__fmul_rn(l_lo, a_lo), ps_lo);
  l_hi = __fadd_rn(__fmul_rn(l_hi, a_hi), ps_hi);
}

/* The output's rows scaled by softmax_probs' factors (before the tile's p v is added). */
template <int ND>
__device__ __forceinline__ void softmax_rescale(float (&o)[ND][4], float a_lo, float a_hi) {
#pragma unroll
  for (int dt = 0; dt < ND; dt++) {
    o[dt][0] = __fmul_rn(o[dt][0], a_lo);
    o[dt][1] = __fmul_rn(o[dt][1], a_lo);
    o[dt][2] = __fmul_rn(o[dt][2], a_hi);
    o[dt][3] = __fmul_rn(o[dt][3], a_hi);
  }
}

/* Both: a key tile's step of the online softmax, the output rescaled at once. */
template <int NS, int ND>
__device__ __forceinline__ void
softmax_step(float (&s)[NS][4], float (&o)[ND][4], float &m_lo, float &m_hi, float &l_lo,
             float &l_hi, bool mask, int key0, int row_lo, int row_hi, int c, float scale_log2,
             int st_lo = 0, int st_hi = 0, float cap_in = 0.0f, float cap_log2 = 0.0f,
             bool approx = false) {
  float a_lo, a_hi;
  softmax_probs<NS>(s, m_lo, m_hi, l_lo, l_hi, a_lo, a_hi, mask, key0, row_lo, row_hi, c,
                    scale_log2, st_lo, st_hi, cap_in, cap_log2, approx);
  softmax_rescale<ND>(o, a_lo, a_hi);
}

/* The warp's rows of the output, o / l, and their logsumexp in natural log, for (batch b,
 * head h) of out (B, T, H, D) and lse (B, H, T). */
template <typename T, typename W>
__device__ __forceinline__ void
fwd_store(T *out, float *lse, const float (&o)[W::DP / 8][4], float l_lo, float l_hi, float m_lo,
          float m_hi, int b, int h, int H, int row_lo, int row_hi, int T_, int D, int c) {
  const size_t qs = (size_t)H * D;
  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);
  const float inv_lo = __fdiv_rn(1.0f, l_lo), inv_hi = __fdiv_rn(1.0f, l_hi);
  T *ob = out + (size_t)b * T_ * qs + (size_t)h * D;
#pragma unroll
  for (int dt = 0; dt < W::DP / 8; dt++) {
    int d = dt * 8 + 2 * c; /* d and d + 1 are both below D or both not (D % 4 == 0) */
    if (W::PAD && d >= D)
      continue;
    if (row_lo < T_)
      store_pair(ob + (size_t)row_lo * qs + d, __fmul_rn(o[dt][0], inv_lo),
                 __fmul_rn(o[dt][1], inv_lo));
    if (row_hi < T_)
      store_pair(ob + (size_t)row_hi * qs + d, __fmul_rn(o[dt][2], inv_hi),
                 __fmul_rn(o[dt][3], inv_hi));
  }
  if (c == 0) {
    float *lb = lse + ((size_t)b * H + h) * T_;
    if (row_lo < T_)
      lb[row_lo] = __fmul_rn(__fadd_rn(m_lo, log2f(l_lo)), LN2);
    if (row_hi < T_)
      lb[row_hi] = __fmul_rn(__fadd_rn(m_hi, log2f(l_hi)), LN2);
  }
}

/* ---- the query tiles' pass of the backward (attention_mma.cu's dq kernel, attention_wgmma.cu's)
 * Query rows are the warps' M dimension: s = q k^T, dp = dout v^T, ds = p (dp - delta); dq +=
 * ds k. */

/* ds into dp, in place, for the warp's 16 query rows (row_lo, row_hi: this thread's two, with
 * their lse * log2(e) and delta) against a key tile of 8 NS keys from key0; diag: the tile of
 * the rows' own keys, where keys after the row give 0; keys before st_lo, st_hi (the rows' first
 * keys, tz_first_key; 0 without) give 0 in every tile. cap_in, cap_log2: a softcap, whose slope
 * ds takes (score_log2; 0: none). */
template <int NS, int CAP = CAP_RUNTIME>
__device__ __forceinline__ void
q_probs(const float (&s)[NS][4], float (&dp)[NS][4], bool diag, int key0, int row_lo, int row_hi,
        float lse_lo, float lse_hi, float del_lo, float del_hi, int c, float scale_log2,
        int st_lo = 0, int st_hi = 0, float cap_in = 0.0f, float cap_log2 = 0.0f,
        bool approx = false) {
#pragma unroll
  for (int nt = 0; nt < NS; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int key = key0 + nt * 8 + 2 * c + (e & 1);
      int row = e < 2 ? row_lo : row_hi, st = e < 2 ? st_lo : st_hi;
      float l2 = e < 2 ? lse_lo : lse_hi, dl = e < 2 ? del_lo : del_hi;
      float slope = 1.0f;
      float x = score_log2<CAP>(s[nt][e], scale_log2, cap_in, cap_log2, &slope, approx);
      float p = (diag && key > row) || key < st ? 0.0f : prob_exp2<CAP>(__fsub_rn(x, l2));
      float ds = __fmul_rn(p, __fsub_rn(dp[nt][e], dl));
      dp[nt][e] = capped<CAP>(cap_in) ? __fmul_rn(ds, slope) : ds; /* ds */
    }
  }
}

/* The warp's rows of dq (times scale) into dqb (the (batch, head)'s first row, rows qs apart). */
template <typename T, typename W>
__device__ __forceinline__ void q_store(T *dqb, const float (&acc)[W::DP / 8][4], size_t qs,
                                        int row_lo, int row_hi, int T_, int D, float scale, int c) {
#pragma unroll
  for (int dt = 0; dt < W::DP / 8; dt++) {
    int d = dt * 8 + 2 * c;
    if (W::PAD && d >= D)
      continue;
    if (row_lo < T_)
      store_pair(dqb + (size_t)row_lo * qs + d, __fmul_rn(acc[dt][0], scale),
                 __fmul_rn(acc[dt][1], scale));
    if (row_hi < T_)
      store_pair(dqb + (size_t)row_hi * qs + d, __fmul_rn(acc[dt][2], scale),
                 __fmul_rn(acc[dt][3], scale));
  }
}

/* ---- the key tiles' pass of the backward (attention_mma.cu's dk/dv kernel, attention_wgmma.cu's)
 * Key rows are the warps' M dimension: s^T = k q^T, p^T = exp(s^T - lse), dp^T = v dout^T,
 * ds^T = p^T (dp^T - delta); dv += p^T dout, dk += ds^T q. */

/* A chunk's BM rows of lse and delta (batch b, head h of H, queries from t0) into buffer buf of sL
 * and sD by threads 0..BM-1 (cp.async: one float each, a row's start needs no alignment), rows
 * at or past T_ zero; lse in natural log, kv_lse_log2 scales it at use. By cp.async with the
 * chunk's tiles, since loads waited for here held the loading warps, and the block's barrier all
 * of them, a round trip to memory a chunk (the profile's stall: docs/cuda-kernels.md). */
template <int BM>
__device__ __forceinline__ void kv_load_rows(float *sL, float *sD, const float *lse,
                                             const float *delta, int b, int H, int h, int t0,
                                             int T_, int buf) {
  if (threadIdx.x < BM) {
    int t = t0 + threadIdx.x;
    const size_t row = ((size_t)b * H + h) * T_;
    cp_async4(sL + buf * BM + threadIdx.x, lse + (t < T_ ? row + t : 0), t < T_ ? 4 : 0);
    cp_async4(sD + buf * BM + threadIdx.x, delta + (t < T_ ? row + t : 0), t < T_ ? 4 : 0);
  }
}

/* A query's lse * log2(e) from kv_load_rows' row. */
__device__ __forceinline__ float kv_lse_log2(const float *Lc, int qi) {
  return __fmul_rn(Lc[qi], LOG2E);
}

/* A chunk of BM queries from i0 of (batch b, head h) into buffer buf: Q and dout into sQ and sdO
 * (rows past T zero), lse into sL and delta into sD (0 past T); by a block of NT
 * threads, the tiles with cp.async (the caller commits). */
template <int BM, typename W, int NT, typename T>
__device__ __forceinline__ void kv_load_chunk(T *sQ, T *sdO, float *sL, float *sD, const T *q,
                                              const T *dout, const float *lse, const float *delta,
                                              int b, int h, int H, int T_, int D, int i0, int buf) {
  constexpr int P = W::P;
  const size_t qs = (size_t)H * D;
  const T *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
  const T *dob = dout + (size_t)b * T_ * qs + (size_t)h * D;
  load_tile<BM, W, NT>(sQ + buf * BM * P, qb, qs, i0, T_ - i0, D);
  load_tile<BM, W, NT>(sdO + buf * BM * P, dob, qs, i0, T_ - i0, D);
  kv_load_rows<BM>(sL, sD, lse, delta, b, H, h, i0, T_, buf);
}

/* The two products of a warp's 16 rows (rows warp * 16.. of tiles a0 and a1) against 8 NS rows
 * of b0 and b1 (rows 0..8 NS - 1), over the head dimension: x = a0 b0^T, y = a1 b1^T. The dq
 * kernel's s = q k^T and dp = dout v^T; the dk/dv kernel's s^T = k q^T and dp^T = v dout^T. */
template <typename T, typename W, int NS>
__device__ __forceinline__ void scores_pair(float (&x)[NS][4], float (&y)[NS][4], const T *a0,
                                            const T *a1, const T *b0, const T *b1, int warp,
                                            int lane) {
  constexpr int P = W::P, KD = W::DP / 16;
#pragma unroll
  for (int i = 0; i < NS; i++) {
    x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.0f;
    y[i][0] = y[i][1] = y[i][2] = y[i][3] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < KD; kk++) {
    uint32_t fa0[4], fa1[4];
    load_a<P>(fa0, a0, warp * 16, kk * 16, lane);
    load_a<P>(fa1, a1, warp * 16, kk * 16, lane);
#pragma unroll
    for (int np = 0; np < NS / 2; np++) {
      uint32_t bf[4];
      load_b_nmajor<P>(bf, b0, np * 16, kk * 16, lane);
      mma16<T>::mma(x[2 * np], fa0, bf[0], bf[1]);
      mma16<T>::mma(x[2 * np + 1], fa0, bf[2], bf[3]);
      load_b_nmajor<P>(bf, b1, np * 16, kk * 16, lane);
      mma16<T>::mma(y[2 * np], fa1, bf[0], bf[1]);
      mma16<T>::mma(y[2 * np + 1], fa1, bf[2], bf[3]);
    }
  }
}

/* Whether a masked chunk hides key from query: a key after the query, a query past T, a key
 * before the query's document's first (pos, with the sequence b) or window or more before it. */
__device__ __forceinline__ bool kv_hidden(int query, int key, int T_, const int32_t *pos, int b,
                                          int window) {
  return query < key || query >= T_ || (pos && key < query - pos[(size_t)b * T_ + query]) ||
         (window > 0 && query - key >= window);
}

/* p^T into st and ds^T into dpt, in place, for the chunk's queries from i0 (Lc: kv_load_rows'
 * lse, Dc: delta, per query); keys after the query and queries past T give 0. mask false:
 * a chunk whose every query sees every key and lies before T (the same arithmetic, no test). pos
 * (packed documents, with the sequence b; NULL without): a key before a query's document's
 * first gives 0 too; window (> 0): so does a key window or more before the query. cap_in,
 * cap_log2: a softcap, whose slope ds takes (score_log2; 0: none). */
template <int NS, int CAP = CAP_RUNTIME>
__device__ __forceinline__ void
kv_probs(float (&st)[NS][4], float (&dpt)[NS][4], const float *Lc, const float *Dc, int i0,
         int key_lo, int key_hi, int T_, float scale_log2, int c, bool mask = true,
         const int32_t *pos = nullptr, int b = 0, int window = 0, float cap_in = 0.0f,
         float cap_log2 = 0.0f, bool approx = false) {
#pragma unroll
  for (int nt = 0; nt < NS; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int qi = nt * 8 + 2 * c + (e & 1), query = i0 + qi;
      int key = e < 2 ? key_lo : key_hi;
      float slope = 1.0f;
      float x = score_log2<CAP>(st[nt][e], scale_log2, cap_in, cap_log2, &slope, approx);
      float p = mask && kv_hidden(query, key, T_, pos, b, window)
                    ? 0.0f
                    : prob_exp2<CAP>(__fsub_rn(x, kv_lse_log2(Lc, qi)));
      st[nt][e] = p;
      float ds = __fmul_rn(p, __fsub_rn(dpt[nt][e], Dc[qi]));
      dpt[nt][e] = capped<CAP>(cap_in) ? __fmul_rn(ds, slope) : ds; /* ds^T */
    }
  }
}

/* The first key query t (the chunk's qi-th, before T) sees, its position Pc[qi] read from the
 * chunk's row in shared memory (NULL: no packed documents): tz_first_key's value. */
__device__ __forceinline__ int kv_first_key(const int32_t *Pc, int t, int qi, int window) {
  int u0 = Pc ? t - Pc[qi] : 0;
  return window > 0 && t - window + 1 > u0 ? t - window + 1 : u0;
}

/* kv_probs in two steps for a kernel without a softcap that overlaps them with its products
 * (attention_wgmma.cu's dk/dv kernel): p^T into st (kv_p) while dp^T's product runs, then ds^T
 * into dpt from it (kv_ds) while dv's runs; each element's arithmetic is kv_probs'. kv_p's masks
 * read the chunk's positions (Pc, as kv_first_key) where kv_probs reads pos. */
template <int NS>
__device__ __forceinline__ void kv_p(float (&st)[NS][4], const float *Lc, int i0, int key_lo,
                                     int key_hi, int T_, float scale_log2, int c, bool mask,
                                     const int32_t *Pc, int window) {
#pragma unroll
  for (int nt = 0; nt < NS; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int qi = nt * 8 + 2 * c + (e & 1), query = i0 + qi;
      int key = e < 2 ? key_lo : key_hi;
      float x = score_log2<CAP_NONE>(st[nt][e], scale_log2, 0.0f, 0.0f);
      st[nt][e] = mask && (query < key || query >= T_ || key < kv_first_key(Pc, query, qi, window))
                      ? 0.0f
                      : prob_exp2<CAP_NONE>(__fsub_rn(x, kv_lse_log2(Lc, qi)));
    }
  }
}

template <int NS>
__device__ __forceinline__ void kv_ds(float (&dpt)[NS][4], const float (&st)[NS][4],
                                      const float *Dc, int c) {
#pragma unroll
  for (int nt = 0; nt < NS; nt++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      int qi = nt * 8 + 2 * c + (e & 1);
      dpt[nt][e] = __fmul_rn(st[nt][e], __fsub_rn(dpt[nt][e], Dc[qi])); /* ds^T */
    }
  }
}

/* dv += p^T dout and dk += ds^T q over the chunk's 8 NS queries. */
template <typename T, typename W, int NS>
__device__ __forceinline__ void
kv_accumulate(float (&dka)[W::DP / 8][4], float (&dva)[W::DP / 8][4], const float (&st)[NS][4],
              const float (&dpt)[NS][4], const T *Qc, const T *dOc, int lane) {
  constexpr int P = W::P, DP = W::DP;
#pragma unroll
  for (int j = 0; j < NS / 2; j++) {
    uint32_t pa[4], dsa[4];
    pack_a<T, NS>(pa, st, j);
    pack_a<T, NS>(dsa, dpt, j);
#pragma unroll
    for (int dn = 0; dn < DP / 16; dn++) {
      uint32_t bf[4];
      load_b_kmajor<P>(bf, dOc, j * 16, dn * 16, lane);
      mma16<T>::mma(dva[2 * dn], pa, bf[0], bf[1]);
      mma16<T>::mma(dva[2 * dn + 1], pa, bf[2], bf[3]);
      load_b_kmajor<P>(bf, Qc, j * 16, dn * 16, lane);
      mma16<T>::mma(dka[2 * dn], dsa, bf[0], bf[1]);
      mma16<T>::mma(dka[2 * dn + 1], dsa, bf[2], bf[3]);
    }
  }
}

/* The warp's rows of dk (times scale) and dv (dkb, dvb: the (batch, kv head)'s first row). */
template <typename T, typename W>
__device__ __forceinline__ void kv_store(T *dkb, T *dvb, const float (&dka)[W::DP / 8][4],
                                         const float (&dva)[W::DP / 8][4], size_t ks, int key_lo,
                                         int key_hi, int T_, int D, float scale, int c) {
#pragma unroll
  for (int dt = 0; dt < W::DP / 8; dt++) {
    int d = dt * 8 + 2 * c;
    if (W::PAD && d >= D)
      continue;
    if (key_lo < T_) {
      store_pair(dkb + (size_t)key_lo * ks + d, __fmul_rn(dka[dt][0], scale),
                 __fmul_rn(dka[dt][1], scale));
      store_pair(dvb + (size_t)key_lo * ks + d, dva[dt][0], dva[dt][1]);
    }
    if (key_hi < T_) {
      store_pair(dkb + (size_t)key_hi * ks + d, __fmul_rn(dka[dt][2], scale),
                 __fmul_rn(dka[dt][3], scale));
      store_pair(dvb + (size_t)key_hi * ks + d, dva[dt][2], dva[dt][3]);
    }
  }
}

/* Calls f(w) with the tile width w for head dim D (1 <= D <= 128): the exact width where `exact`
 * (D is 32, 64 or 128 and every tensor 16-byte aligned), else the padded width 32 for D <= 32,
 * 64 for D <= 64, and above that D rounded up to a multiple of 16. */
template <typename F> int with_width(int D, bool exact, F f) {
  if (exact) {
    switch (D) {
    case 32: return f(width<32, false>{});
    case 64: return f(width<64, false>{});
    case 128: return f(width<128, false>{});
    default: break;
    }
  }
  switch ((D + 15) / 16) {
  case 1:
  case 2: return f(width<32, true>{});
  case 3: /* head dims between 32 and 64 are rare: one width for them */
  case 4: return f(width<64, true>{});
  case 5: return f(width<80, true>{});
  case 6: return f(width<96, true>{});
  case 7: return f(width<112, true>{});
  default: return f(width<128, true>{});
  }
}

} /* namespace tz_attn */

#endif
