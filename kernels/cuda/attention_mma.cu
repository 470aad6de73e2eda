/* Tensor-core attention for bf16 and fp16 storage, head dims D that are multiples of 4 up to 128
 * (sm_80 and later; the build targets sm_90). Same algorithm as the plain kernels in attention.cu,
 * with the tile products done by mma.sync m16n8k16 (16-bit inputs, float accumulation) and
 * operands moved from shared memory to registers with ldmatrix.
 *
 * Widths. mma takes k in steps of 16, so shared tiles are DP columns wide, DP a multiple of 16.
 * D = 32, 64 and 128 with 16-byte aligned tensors run kernels built for exactly that width
 * (DP = D known at compile time, 16-byte copies). Every other D (and those three when a tensor
 * is only 8-byte aligned) runs a padded kernel: DP = 32 for D <= 32, 64 for D <= 64, else D
 * rounded up to a multiple of 16 (80, 96, 112, 128; D = 100 takes 112), with D a runtime value.
 * Columns D..DP-1 of every tile are zero-filled, so over the padded k range the products add
 * exact zeros, and outputs are written for d < D only. A head's row of D 16-bit elements is only
 * 8-byte aligned when D % 8 == 4 (D = 100: 200 bytes), so the padded kernels copy 8 bytes at a
 * time (one rule for every padded D), which needs D % 4 == 0 and 8-byte aligned tensors. The
 * softmax scale is 1 / sqrt(D) of the true D, or the variants' (common.cuh, struct tz_attn_var:
 * Gemma's scale and softcap, sliding windows, which start each row's keys where its document's
 * would).
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4 and
 * c = lane % 4:
 *   A (16x16, row-major)  a0: (g, 2c..2c+1)  a1: (g+8, 2c..2c+1)  a2: (g, 2c+8..)  a3: (g+8,
 * 2c+8..) B (16x8, k by n)      b0: (k 2c..2c+1, n g)  b1: (k 2c+8..2c+9, n g) C (16x8, float) c0,
 * c1: (g, 2c), (g, 2c+1)   c2, c3: (g+8, 2c), (g+8, 2c+1) Two C tiles side by side, (16, 16), hold
 * exactly the values an A fragment of the same 16x16 block needs, in the same threads: a0 = (C0.c0,
 * C0.c1), a1 = (C0.c2, C0.c3), a2 = (C1.c0, C1.c1), a3 = (C1.c2, C1.c3). That is how probabilities
 * computed as a product's output become the next product's input without leaving registers (pack_a
 * below).
 *
 * Each warp owns 16 rows of its block's tile (query rows in forward and dq, key rows in dk/dv),
 * so row statistics live in the 4 threads of a quad and are combined with two xor shuffles. Tiles
 * are copied global -> shared with cp.async, double-buffered so the next tile loads while this
 * one is used; rows past T are zero-filled and masked. Every sum has a fixed order (mma's own
 * accumulation order is fixed by the hardware), so results are the same bits every run. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/ptx.cuh"

#define WARPS 4
#define NTHREADS (WARPS * 32)

namespace {

using namespace tz_ptx;
using namespace tz_attn;

/* ---- forward: block = 64 query rows of one (batch, head); key tiles of 64 ---- */

constexpr int FWD_BM = 64, FWD_BN = 64;

template <typename W> constexpr size_t fwd_smem_bytes() {
  return (size_t)(FWD_BM + 4 * FWD_BN) * W::P * 2;
}

template <typename T, typename W>
__global__ void __launch_bounds__(NTHREADS)
    attn_fwd_mma_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int T_, int H,
                        int Hkv, int D_, float scale_log2, const int32_t *pos,
                        const tz_attn_var var) {
  constexpr int P = W::P, DP = W::DP;
  const int D = W::PAD ? D_ : DP; /* the head dim; tile columns D..DP-1 are zero */
  constexpr int KD = DP / 16, ND = DP / 8, NS = FWD_BN / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = (T *)smem_raw;                     /* (BM, P) */
  T *sK = sQ + FWD_BM * P;                   /* 2 x (BN, P) */
  T *sV = sK + 2 * FWD_BN * P;               /* 2 x (BN, P) */
  const int qt = gridDim.x - 1 - blockIdx.x; /* the longest rows first */
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const int q0 = qt * FWD_BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const T *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
  const T *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const T *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  const int n_kt = qt + 1; /* key tiles 0..qt: the last is the diagonal one */
  const int row_lo = q0 + warp * 16 + g, row_hi = row_lo + 8;
  /* Packed documents and windows: the tiles before the block's first row's first key hold no
   * key any row sees (first keys increase along a row); each row hides the keys before its own. */
  const int W_ = var.window;
  const bool firsts = pos || W_ > 0;
  const int kt0 = firsts ? tz_first_key(pos, b, T_, q0, W_) / FWD_BN : 0;
  const int st_lo = firsts ? tz_first_key(pos, b, T_, row_lo, W_) : 0;
  const int st_hi = firsts ? tz_first_key(pos, b, T_, row_hi, W_) : 0;

  load_tile<FWD_BM, W>(sQ, qb, qs, q0, T_ - q0, D);
  load_tile<FWD_BN, W>(sK, kb, ks, kt0 * FWD_BN, T_ - kt0 * FWD_BN, D);
  load_tile<FWD_BN, W>(sV, vb, ks, kt0 * FWD_BN, T_ - kt0 * FWD_BN, D);
  cp_async_commit();

  uint32_t qf[KD][4];
  float o[ND][4];
#pragma unroll
  for (int i = 0; i < ND; i++)
    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY; /* running max of scores * scale * log2(e) */
  float l_lo = 0.0f, l_hi = 0.0f;           /* this thread's part of the running sum */

  for (int kt = kt0; kt < n_kt; kt++) {
    const int buf = (kt - kt0) & 1;
    if (kt + 1 < n_kt) {
      int r0 = (kt + 1) * FWD_BN;
      load_tile<FWD_BN, W>(sK + (buf ^ 1) * FWD_BN * P, kb, ks, r0, T_ - r0, D);
      load_tile<FWD_BN, W>(sV + (buf ^ 1) * FWD_BN * P, vb, ks, r0, T_ - r0, D);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (kt == kt0) {
#pragma unroll
      for (int kk = 0; kk < KD; kk++)
        load_a<P>(qf[kk], sQ, warp * 16, kk * 16, lane);
    }
    const T *Kt = sK + buf * FWD_BN * P, *Vt = sV + buf * FWD_BN * P;

    float s[NS][4];
#pragma unroll
    for (int i = 0; i < NS; i++)
      s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
#pragma unroll
      for (int np = 0; np < NS / 2; np++) {
        uint32_t bf[4];
        load_b_nmajor<P>(bf, Kt, np * 16, kk * 16, lane);
        mma16<T>::mma(s[2 * np], qf[kk], bf[0], bf[1]);
        mma16<T>::mma(s[2 * np + 1], qf[kk], bf[2], bf[3]);
      }
    }

    /* scores in the log2 domain; the diagonal tile hides keys after the query */
    softmax_step<NS, ND>(s, o, m_lo, m_hi, l_lo, l_hi, kt == n_kt - 1 || firsts, kt * FWD_BN,
                         row_lo, row_hi, c, scale_log2, st_lo, st_hi, var.cap_in, var.cap_log2,
                         var.tanh_approx);

    /* o += p v */
#pragma unroll
    for (int j = 0; j < FWD_BN / 16; j++) {
      uint32_t pa[4];
      pack_a<T, NS>(pa, s, j);
#pragma unroll
      for (int dp = 0; dp < DP / 16; dp++) {
        uint32_t bf[4];
        load_b_kmajor<P>(bf, Vt, j * 16, dp * 16, lane);
        mma16<T>::mma(o[2 * dp], pa, bf[0], bf[1]);
        mma16<T>::mma(o[2 * dp + 1], pa, bf[2], bf[3]);
      }
    }
    __syncthreads(); /* this buffer is refilled two tiles from now */
  }

  fwd_store<T, W>(out, lse, o, l_lo, l_hi, m_lo, m_hi, b, h, H, row_lo, row_hi, T_, D, c);
}

/* ---- backward dq: block = 64 query rows of one (batch, head); key tiles of 64 ----
 * p = exp(s - lse), ds = p (dp - delta) with dp = dout . v; dq = scale * sum over keys of ds k. */

constexpr int DQ_BM = 64, DQ_BN = 64;

template <typename W> constexpr size_t dq_smem_bytes() {
  return (size_t)(2 * DQ_BM + 4 * DQ_BN) * W::P * 2;
}

template <typename T, typename W>
__global__ void __launch_bounds__(NTHREADS)
    attn_bwd_dq_mma_kernel(T *dq, const T *dout, const T *q, const T *k, const T *v,
                           const float *lse, const float *delta, int T_, int H, int Hkv, int D_,
                           float scale, float scale_log2, const int32_t *pos,
                           const tz_attn_var var) {
  constexpr int P = W::P, DP = W::DP;
  const int D = W::PAD ? D_ : DP;
  constexpr int ND = DP / 8, NS = DQ_BN / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = (T *)smem_raw;      /* (BM, P) */
  T *sdO = sQ + DQ_BM * P;    /* (BM, P) */
  T *sK = sdO + DQ_BM * P;    /* 2 x (BN, P) */
  T *sV = sK + 2 * DQ_BN * P; /* 2 x (BN, P) */
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const int q0 = qt * DQ_BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const T *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
  const T *dob = dout + (size_t)b * T_ * qs + (size_t)h * D;
  const T *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const T *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  const int n_kt = qt + 1;
  const int row_lo = q0 + warp * 16 + g, row_hi = row_lo + 8;
  const float *lb = lse + ((size_t)b * H + h) * T_, *db = delta + ((size_t)b * H + h) * T_;
  /* rows past T get harmless values; they are never stored */
  const float lse_lo = row_lo < T_ ? __fmul_rn(lb[row_lo], LOG2E) : 0.0f;
  const float lse_hi = row_hi < T_ ? __fmul_rn(lb[row_hi], LOG2E) : 0.0f;
  const float del_lo = row_lo < T_ ? db[row_lo] : 0.0f;
  const float del_hi = row_hi < T_ ? db[row_hi] : 0.0f;
  /* Packed documents and windows: as the forward, from the block's first row's first key. */
  const int W_ = var.window;
  const bool firsts = pos || W_ > 0;
  const int kt0 = firsts ? tz_first_key(pos, b, T_, q0, W_) / DQ_BN : 0;
  const int st_lo = firsts ? tz_first_key(pos, b, T_, row_lo, W_) : 0;
  const int st_hi = firsts ? tz_first_key(pos, b, T_, row_hi, W_) : 0;

  load_tile<DQ_BM, W>(sQ, qb, qs, q0, T_ - q0, D);
  load_tile<DQ_BM, W>(sdO, dob, qs, q0, T_ - q0, D);
  load_tile<DQ_BN, W>(sK, kb, ks, kt0 * DQ_BN, T_ - kt0 * DQ_BN, D);
  load_tile<DQ_BN, W>(sV, vb, ks, kt0 * DQ_BN, T_ - kt0 * DQ_BN, D);
  cp_async_commit();

  float acc[ND][4];
#pragma unroll
  for (int i = 0; i < ND; i++)
    acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  for (int kt = kt0; kt < n_kt; kt++) {
    const int buf = (kt - kt0) & 1;
    if (kt + 1 < n_kt) {
      int r0 = (kt + 1) * DQ_BN;
      load_tile<DQ_BN, W>(sK + (buf ^ 1) * DQ_BN * P, kb, ks, r0, T_ - r0, D);
      load_tile<DQ_BN, W>(sV + (buf ^ 1) * DQ_BN * P, vb, ks, r0, T_ - r0, D);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *Kt = sK + buf * DQ_BN * P, *Vt = sV + buf * DQ_BN * P;

    float s[NS][4], dp[NS][4];
    scores_pair<T, W, NS>(s, dp, sQ, sdO, Kt, Vt, warp, lane); /* s = q k^T, dp = dout v^T */

    q_probs<NS>(s, dp, kt == n_kt - 1, kt * DQ_BN, row_lo, row_hi, lse_lo, lse_hi, del_lo, del_hi,
                c, scale_log2, st_lo, st_hi, var.cap_in, var.cap_log2, var.tanh_approx);

    /* acc += ds k */
#pragma unroll
    for (int j = 0; j < DQ_BN / 16; j++) {
      uint32_t dsa[4];
      pack_a<T, NS>(dsa, dp, j);
#pragma unroll
      for (int dn = 0; dn < DP / 16; dn++) {
        uint32_t bf[4];
        load_b_kmajor<P>(bf, Kt, j * 16, dn * 16, lane);
        mma16<T>::mma(acc[2 * dn], dsa, bf[0], bf[1]);
        mma16<T>::mma(acc[2 * dn + 1], dsa, bf[2], bf[3]);
      }
    }
    __syncthreads();
  }

  q_store<T, W>(dq + (size_t)b * T_ * qs + (size_t)h * D, acc, qs, row_lo, row_hi, T_, D, scale, c);
}

/* ---- backward dk, dv: block = 64 key rows of one (batch, kv head); query chunks of 32 ----
 * Transposed products, so the key rows are the warps' M dimension:
 * s^T = k q^T, p^T = exp(s^T - lse), dp^T = v dout^T, ds^T = p^T (dp^T - delta);
 * dv = sum p^T dout, dk = scale * sum ds^T q, over the group's heads (increasing h) and then
 * the queries from the key tile on (increasing t). */

constexpr int KV_BN = 64, KV_BM = 32;

template <typename W> constexpr size_t dkdv_smem_bytes() {
  return (size_t)(2 * KV_BN + 4 * KV_BM) * W::P * 2 + 4 * KV_BM * sizeof(float);
}

template <typename T, typename W>
__global__ void __launch_bounds__(NTHREADS)
    attn_bwd_dkdv_mma_kernel(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                             const float *lse, const float *delta, int T_, int H, int Hkv, int D_,
                             float scale, float scale_log2, const int32_t *pos,
                             const tz_attn_var var) {
  constexpr int P = W::P, DP = W::DP;
  const int D = W::PAD ? D_ : DP;
  constexpr int ND = DP / 8, NS = KV_BM / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sK = (T *)smem_raw;                      /* (BN, P) */
  T *sV = sK + KV_BN * P;                     /* (BN, P) */
  T *sQ = sV + KV_BN * P;                     /* 2 x (BM, P) */
  T *sdO = sQ + 2 * KV_BM * P;                /* 2 x (BM, P) */
  float *sL = (float *)(sdO + 2 * KV_BM * P); /* 2 x (BM): lse * log2(e), 0 past T */
  float *sD = sL + 2 * KV_BM;                 /* 2 x (BM): delta, 0 past T */
  const int kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = H / Hkv;
  const int k0 = kt * KV_BN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t ks = (size_t)Hkv * D;
  const T *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const T *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  const int key_lo = k0 + warp * 16 + g, key_hi = key_lo + 8;
  int n_chunks = (T_ - k0 + KV_BM - 1) / KV_BM;
  /* Packed documents: no query from the first chunk whose first query's document starts past
   * this tile's last key on sees a key of it (documents start in increasing order). */
  if (pos) {
    int n = 0;
    while (n < n_chunks && tz_doc_start(pos, b, T_, k0 + n * KV_BM) < k0 + KV_BN)
      n++;
    n_chunks = n;
  }
  /* A window: no query window or more past this tile's last key sees a key of it. */
  if (var.window > 0) {
    int n = (KV_BN - 2 + var.window) / KV_BM + 1;
    n_chunks = n < n_chunks ? n : n_chunks;
  }
  const int n_it = group * n_chunks;

  /* Chunk `it`: head hk * group + it / n_chunks, queries from k0 + (it % n_chunks) * BM. */
  auto load_chunk = [&](int it, int buf) {
    int h = hk * group + it / n_chunks;
    int i0 = k0 + (it % n_chunks) * KV_BM;
    kv_load_chunk<KV_BM, W, NTHREADS>(sQ, sdO, sL, sD, q, dout, lse, delta, b, h, H, T_, D, i0,
                                      buf);
  };

  load_tile<KV_BN, W>(sK, kb, ks, k0, T_ - k0, D);
  load_tile<KV_BN, W>(sV, vb, ks, k0, T_ - k0, D);
  load_chunk(0, 0);
  cp_async_commit();

  float dka[ND][4], dva[ND][4];
#pragma unroll
  for (int i = 0; i < ND; i++) {
    dka[i][0] = dka[i][1] = dka[i][2] = dka[i][3] = 0.0f;
    dva[i][0] = dva[i][1] = dva[i][2] = dva[i][3] = 0.0f;
  }

  for (int it = 0; it < n_it; it++) {
    const int buf = it & 1;
    if (it + 1 < n_it) {
      load_chunk(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int i0 = k0 + (it % n_chunks) * KV_BM;
    const T *Qc = sQ + buf * KV_BM * P, *dOc = sdO + buf * KV_BM * P;
    const float *Lc = sL + buf * KV_BM, *Dc = sD + buf * KV_BM;

    float st[NS][4], dpt[NS][4];
    scores_pair<T, W, NS>(st, dpt, sK, sV, Qc, dOc, warp, lane);
    kv_probs<NS>(st, dpt, Lc, Dc, i0, key_lo, key_hi, T_, scale_log2, c, true, pos, b, var.window,
                 var.cap_in, var.cap_log2, var.tanh_approx);
    kv_accumulate<T, W, NS>(dka, dva, st, dpt, Qc, dOc, lane);
    __syncthreads();
  }

  T *dkb = dk + (size_t)b * T_ * ks + (size_t)hk * D;
  T *dvb = dv + (size_t)b * T_ * ks + (size_t)hk * D;
  kv_store<T, W>(dkb, dvb, dka, dva, ks, key_lo, key_hi, T_, D, scale, c);
}

/* ---- launches ---- */

template <typename E, typename W>
int launch_fwd(struct tz_cuda *c, void *out, float *lse, const void *q, const void *k,
               const void *v, int B, int T, int H, int Hkv, int D, const int32_t *pos,
               const tz_attn_var &var) {
  constexpr size_t smem = fwd_smem_bytes<W>();
  auto kern = attn_fwd_mma_kernel<E, W>;
  TZ_CU(cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem));
  dim3 grid((unsigned)((T + FWD_BM - 1) / FWD_BM), (unsigned)H, (unsigned)B);
  float scale_log2 = var.scale * LOG2E;
  kern<<<grid, NTHREADS, smem, c->stream>>>((E *)out, lse, (const E *)q, (const E *)k, (const E *)v,
                                            T, H, Hkv, D, scale_log2, pos, var);
  TZ_CU_LAUNCHED();
  return 0;
}

template <typename E, typename W>
int launch_bwd(struct tz_cuda *c, void *dq, void *dk, void *dv, const float *delta,
               const void *dout, const void *q, const void *k, const void *v, const float *lse,
               int B, int T, int H, int Hkv, int D, const int32_t *pos, const tz_attn_var &var) {
  constexpr size_t smem_q = dq_smem_bytes<W>(), smem_kv = dkdv_smem_bytes<W>();
  auto kq = attn_bwd_dq_mma_kernel<E, W>;
  auto kkv = attn_bwd_dkdv_mma_kernel<E, W>;
  TZ_CU(cudaFuncSetAttribute((const void *)kq, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem_q));
  TZ_CU(cudaFuncSetAttribute((const void *)kkv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem_kv));
  float scale = var.scale;
  float scale_log2 = scale * LOG2E;
  dim3 grid_q((unsigned)((T + DQ_BM - 1) / DQ_BM), (unsigned)H, (unsigned)B);
  kq<<<grid_q, NTHREADS, smem_q, c->stream>>>((E *)dq, (const E *)dout, (const E *)q, (const E *)k,
                                              (const E *)v, lse, delta, T, H, Hkv, D, scale,
                                              scale_log2, pos, var);
  TZ_CU_LAUNCHED();
  dim3 grid_kv((unsigned)((T + KV_BN - 1) / KV_BN), (unsigned)Hkv, (unsigned)B);
  kkv<<<grid_kv, NTHREADS, smem_kv, c->stream>>>((E *)dk, (E *)dv, (const E *)dout, (const E *)q,
                                                 (const E *)k, (const E *)v, lse, delta, T, H, Hkv,
                                                 D, scale, scale_log2, pos, var);
  TZ_CU_LAUNCHED();
  return 0;
}

} /* namespace */

static bool aligned(const void *p, uintptr_t bytes) { return ((uintptr_t)p & (bytes - 1)) == 0; }

/* Whether the tensor-core kernels take a call, and with which width: 16-bit storage, D a
 * multiple of 4 up to 128, every tensor 8-byte aligned for the padded kernels' copies, and
 * 16-byte aligned for an exact width (compute.h promises 256 for every tensor). Returns 0 when
 * they do not take it, 1 for a padded width, 2 for an exact one. */
static int mma_route(const struct tz_cuda *c, int D, const void *const *ts, int n) {
  if ((c->S != TZ_BF16 && c->S != TZ_F16) || D % 4 != 0 || D > 128)
    return 0;
  bool a16 = true;
  for (int i = 0; i < n; i++) {
    if (!aligned(ts[i], 8))
      return 0;
    a16 = a16 && aligned(ts[i], 16);
  }
  return a16 && (D == 32 || D == 64 || D == 128) ? 2 : 1;
}

int tz_cuda_attention_fwd_mma(struct tz_cuda *c, void *out, float *lse, const void *q,
                              const void *k, const void *v, int B, int T, int H, int Hkv, int D,
                              const int32_t *pos, const tz_attn_var &var) {
  const void *ts[] = {out, q, k, v};
  int route = mma_route(c, D, ts, 4);
  if (!route)
    return 1;
  return with_width(D, route == 2, [&](auto w) {
    using W = decltype(w);
    if (c->S == TZ_BF16)
      return launch_fwd<__nv_bfloat16, W>(c, out, lse, q, k, v, B, T, H, Hkv, D, pos, var);
    return launch_fwd<__half, W>(c, out, lse, q, k, v, B, T, H, Hkv, D, pos, var);
  });
}

int tz_cuda_attention_bwd_mma(struct tz_cuda *c, void *dq, void *dk, void *dv, const float *delta,
                              const void *dout, const void *q, const void *k, const void *v,
                              const float *lse, int B, int T, int H, int Hkv, int D,
                              const int32_t *pos, const tz_attn_var &var) {
  const void *ts[] = {dq, dk, dv, dout, q, k, v};
  int route = mma_route(c, D, ts, 7);
  if (!route)
    return 1;
  return with_width(D, route == 2, [&](auto w) {
    using W = decltype(w);
    if (c->S == TZ_BF16)
      return launch_bwd<__nv_bfloat16, W>(c, dq, dk, dv, delta, dout, q, k, v, lse, B, T, H, Hkv, D,
                                          pos, var);
    return launch_bwd<__half, W>(c, dq, dk, dv, delta, dout, q, k, v, lse, B, T, H, Hkv, D, pos,
                                 var);
  });
}
