/* Attention on Hopper's warpgroup MMA (issue 24; auto's and tierzero.cuda_attention wgmma's): the
 * forward and the two-pass backward: bf16, head dim 128,
 * causal, tensors 16-byte aligned, an sm_90 device; everything else declines (1) and runs the
 * mma.sync kernels. Built for sm_90a alone (kernels/cuda/wgmma.cuh).
 *
 * The algorithms and their arithmetic are attention_mma.cu's: in the forward a block of 64 query
 * rows of one (batch, head), key tiles of 64 double-buffered with cp.async, the same online
 * softmax (softmax_step) and store (fwd_store), the longest rows first. What changes is the
 * products: one warpgroup (the block's 4 warps) issues S = Q K^T as 8 wgmma k16 slices from
 * shared memory and O += P V as 4 slices with P from registers, instead of each warp issuing
 * mma.sync per 16 x 8 tile. The warpgroup's accumulator fragment gives each warp 16 rows in
 * mma.sync's m16n8 layout, so softmax_step, kv_probs and pack_a work on it unchanged. The tiles
 * sit in shared memory in wgmma's 128-byte-swizzled layout: 64 rows by 128 columns as two
 * 64-column halves of 8 KiB each.
 *
 * Deterministic: every sum has a fixed order (the hardware's inside each product), so the same
 * bits every run; not the bits of the mma.sync kernels (another order inside the products). This
 * first version waits for each product before the next; overlapping them (two warpgroups, one's
 * softmax beside the other's products) is the next step. */
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace {

using namespace tz_attn;

constexpr int BM = 64, BN = 64, DH = 128;
constexpr int HALF = 64 * 128;           /* bytes of a 64 x 64 half of a tile */
constexpr int TILE = 2 * HALF;           /* 64 rows x 128 columns */
constexpr size_t SMEM = 5 * TILE + 1024; /* Q, two K and two V buffers, alignment slack */
using W128 = width<DH, false>;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* 64 rows of 128 bf16 from base + (row0 + r) * stride into a swizzled tile by the block's 128
 * threads, 16 bytes a copy; rows at or past `valid` are zero-filled. */
__device__ __forceinline__ void load_sw(uint8_t *s, const __nv_bfloat16 *base, size_t stride,
                                        int row0, int valid) {
  for (int i = threadIdx.x; i < 64 * 16; i += 128) {
    int r = i >> 4, ch = i & 15, ok = r < valid;
    const __nv_bfloat16 *src = base + (ok ? (size_t)(row0 + r) * stride : 0) + ch * 8;
    cp_async16(s + (ch >> 3) * HALF + tz_wgmma::sw128((uint32_t)r, (uint32_t)(ch & 7) * 8), src,
               ok ? 16 : 0);
  }
}

/* The key tiles' double buffer, at the start of key tile kt of n_kt (the forward's and dq's
 * loop): tile kt + 1 of K and V (rows from (kt + 1) * 64) starts loading into the other buffer,
 * and tile kt is waited for and made visible to the products. */
__device__ __forceinline__ void next_kv_tile(uint8_t *sK, uint8_t *sV, const __nv_bfloat16 *kb,
                                             const __nv_bfloat16 *vb, size_t ks, int kt, int n_kt,
                                             int T_) {
  const int buf = kt & 1;
  if (kt + 1 < n_kt) {
    int r0 = (kt + 1) * BN;
    load_sw(sK + (buf ^ 1) * TILE, kb, ks, r0, T_ - r0);
    load_sw(sV + (buf ^ 1) * TILE, vb, ks, r0, T_ - r0);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  tz_wgmma::fence_smem(); /* cp.async's writes, before the products read them */
  __syncthreads();
}

/* d = a b^T over the head dimension, 8 k16 slices, the accumulators overwritten: a and b 64 x 128
 * swizzled tiles, both K-major. Issued, not waited for. */
__device__ __forceinline__ void product_k(float (&d)[32], const uint8_t *a, const uint8_t *b) {
#pragma unroll
  for (int kk = 0; kk < DH / 16; kk++) {
    int off = (kk >> 2) * HALF + (kk & 3) * 32; /* slice kk: 32 bytes into half kk / 4 */
    tz_wgmma::mma_m64n64k16_bf16<0>(d, tz_wgmma::desc_k(a + off), tz_wgmma::desc_k(b + off),
                                    kk > 0);
  }
}

/* (d0 | d1) += a b over b's 64 rows, 4 k16 slices: a 64 x 64 in registers (pack_a's fragments of
 * probabilities or score gradients, a[j] for rows 16 j.. of b), b a 64 x 128 swizzled tile read
 * MN-major, its two 64-column halves into d0 and d1. Issued, not waited for. */
__device__ __forceinline__ void product_mn(float (&d0)[32], float (&d1)[32],
                                           const uint32_t (&a)[4][4], const uint8_t *b) {
#pragma unroll
  for (int j = 0; j < 4; j++) { /* slice j: rows 16 j.., 2048 bytes into each half */
    tz_wgmma::mma_m64n64k16_bf16_rs<1>(d0, a[j], tz_wgmma::desc_mn(b + j * 2048), 1);
    tz_wgmma::mma_m64n64k16_bf16_rs<1>(d1, a[j], tz_wgmma::desc_mn(b + HALF + j * 2048), 1);
  }
}
#endif

__global__ void __launch_bounds__(128)
    attn_fwd_wgmma_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *k, const __nv_bfloat16 *v, int T_, int H, int Hkv,
                          float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint8_t *sQ = sm, *sK = sm + TILE, *sV = sm + 3 * TILE; /* K, V: two buffers each */
  const int qt = gridDim.x - 1 - blockIdx.x;              /* the longest rows first */
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const int q0 = qt * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
  const __nv_bfloat16 *qb = q + (size_t)b * T_ * qs + (size_t)h * DH;
  const __nv_bfloat16 *kb = k + (size_t)b * T_ * ks + (size_t)hk * DH;
  const __nv_bfloat16 *vb = v + (size_t)b * T_ * ks + (size_t)hk * DH;
  const int n_kt = qt + 1; /* key tiles 0..qt: the last is the diagonal one */
  const int row_lo = q0 + warp * 16 + g, row_hi = row_lo + 8;

  load_sw(sQ, qb, qs, q0, T_ - q0);
  load_sw(sK, kb, ks, 0, T_);
  load_sw(sV, vb, ks, 0, T_);
  cp_async_commit();

  float o[DH / 8][4]; /* the output's two 64-column halves, o[0..7] and o[8..15] */
#pragma unroll
  for (int i = 0; i < DH / 8; i++)
    o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  for (int kt = 0; kt < n_kt; kt++) {
    const int buf = kt & 1;
    next_kv_tile(sK, sV, kb, vb, ks, kt, n_kt, T_);
    const uint8_t *Kt = sK + buf * TILE, *Vt = sV + buf * TILE;

    /* s = q k^T */
    float s[BN / 8][4];
    float(&sd)[32] = *reinterpret_cast<float(*)[32]>(&s[0][0]);
    tz_wgmma::fence();
    product_k(sd, sQ, Kt);
    tz_wgmma::commit();
    tz_wgmma::wait<0>();

    softmax_step<BN / 8, DH / 8>(s, o, m_lo, m_hi, l_lo, l_hi, kt == n_kt - 1, kt * BN, row_lo,
                                 row_hi, c, scale_log2);

    /* o += p v */
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int j = 0; j < BN / 16; j++)
      pack_a<__nv_bfloat16, BN / 8>(pa[j], s, j);
    float(&o0)[32] = *reinterpret_cast<float(*)[32]>(&o[0][0]);
    float(&o1)[32] = *reinterpret_cast<float(*)[32]>(&o[8][0]);
    tz_wgmma::fence();
    product_mn(o0, o1, pa, Vt);
    tz_wgmma::commit();
    tz_wgmma::wait<0>();
    __syncthreads(); /* this buffer is refilled two tiles from now */
  }

  fwd_store<__nv_bfloat16, W128>(out, lse, o, l_lo, l_hi, m_lo, m_hi, b, h, H, row_lo, row_hi, T_,
                                 DH, c);
#else
  (void)out, (void)lse, (void)q, (void)k, (void)v, (void)T_, (void)H, (void)Hkv, (void)scale_log2;
  __trap();
#endif
}

/* ---- the backward in two passes, attention_mma.cu's algorithm and arithmetic ----
 * dq: a block of 64 query rows; per key tile, s = q k^T and dp = dout v^T (8 k16 slices each,
 * both from shared memory), ds = p (dp - delta) in registers, dq += ds k (4 slices, ds from
 * registers, K read as an MN-major B). dk, dv: a block of 64 key rows; per chunk of 64 queries
 * (the group's heads in increasing order, then the queries from the key tile on), s^T = k q^T
 * and dp^T = v dout^T, p^T and ds^T by kv_probs, dv += p^T dout and dk += ds^T q. Every product
 * is an m64n64k16 of the forward's shapes, so the tiles, descriptors and fragments are the
 * forward's. */

constexpr size_t BWD_SMEM = 6 * TILE + 4 * 64 * sizeof(float) + 1024;

__global__ void __launch_bounds__(128)
    attn_bwd_dq_wgmma_kernel(__nv_bfloat16 *dq, const __nv_bfloat16 *dout,
                             const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                             const __nv_bfloat16 *v, const float *lse, const float *delta, int T_,
                             int H, int Hkv, float scale, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint8_t *sQ = sm, *sdO = sm + TILE, *sK = sm + 2 * TILE, *sV = sm + 4 * TILE;
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const int q0 = qt * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
  const __nv_bfloat16 *qb = q + (size_t)b * T_ * qs + (size_t)h * DH;
  const __nv_bfloat16 *dob = dout + (size_t)b * T_ * qs + (size_t)h * DH;
  const __nv_bfloat16 *kb = k + (size_t)b * T_ * ks + (size_t)hk * DH;
  const __nv_bfloat16 *vb = v + (size_t)b * T_ * ks + (size_t)hk * DH;
  const int n_kt = qt + 1;
  const int row_lo = q0 + warp * 16 + g, row_hi = row_lo + 8;
  const float *lb = lse + ((size_t)b * H + h) * T_, *db = delta + ((size_t)b * H + h) * T_;
  const float lse_lo = row_lo < T_ ? __fmul_rn(lb[row_lo], LOG2E) : 0.0f;
  const float lse_hi = row_hi < T_ ? __fmul_rn(lb[row_hi], LOG2E) : 0.0f;
  const float del_lo = row_lo < T_ ? db[row_lo] : 0.0f;
  const float del_hi = row_hi < T_ ? db[row_hi] : 0.0f;

  load_sw(sQ, qb, qs, q0, T_ - q0);
  load_sw(sdO, dob, qs, q0, T_ - q0);
  load_sw(sK, kb, ks, 0, T_);
  load_sw(sV, vb, ks, 0, T_);
  cp_async_commit();

  float acc[DH / 8][4];
#pragma unroll
  for (int i = 0; i < DH / 8; i++)
    acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  for (int kt = 0; kt < n_kt; kt++) {
    const int buf = kt & 1;
    next_kv_tile(sK, sV, kb, vb, ks, kt, n_kt, T_);
    const uint8_t *Kt = sK + buf * TILE, *Vt = sV + buf * TILE;

    float s[BN / 8][4], dp[BN / 8][4];
    float(&sd)[32] = *reinterpret_cast<float(*)[32]>(&s[0][0]);
    float(&dpd)[32] = *reinterpret_cast<float(*)[32]>(&dp[0][0]);
    tz_wgmma::fence();
    product_k(sd, sQ, Kt);
    product_k(dpd, sdO, Vt);
    tz_wgmma::commit();
    tz_wgmma::wait<0>();

    q_probs<BN / 8>(s, dp, kt == n_kt - 1, kt * BN, row_lo, row_hi, lse_lo, lse_hi, del_lo, del_hi,
                    c, scale_log2);

    /* acc += ds k */
    uint32_t dsa[BN / 16][4];
#pragma unroll
    for (int j = 0; j < BN / 16; j++)
      pack_a<__nv_bfloat16, BN / 8>(dsa[j], dp, j);
    float(&a0)[32] = *reinterpret_cast<float(*)[32]>(&acc[0][0]);
    float(&a1)[32] = *reinterpret_cast<float(*)[32]>(&acc[8][0]);
    tz_wgmma::fence();
    product_mn(a0, a1, dsa, Kt);
    tz_wgmma::commit();
    tz_wgmma::wait<0>();
    __syncthreads();
  }

  q_store<__nv_bfloat16, W128>(dq + (size_t)b * T_ * qs + (size_t)h * DH, acc, qs, row_lo, row_hi,
                               T_, DH, scale, c);
#else
  (void)dq, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)T_, (void)H;
  (void)Hkv, (void)scale, (void)scale_log2;
  __trap();
#endif
}

__global__ void __launch_bounds__(128)
    attn_bwd_dkdv_wgmma_kernel(__nv_bfloat16 *dk, __nv_bfloat16 *dv, const __nv_bfloat16 *dout,
                               const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                               const __nv_bfloat16 *v, const float *lse, const float *delta,
                               int T_, int H, int Hkv, float scale, float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint8_t *sK = sm, *sV = sm + TILE, *sQ = sm + 2 * TILE, *sdO = sm + 4 * TILE; /* Q, dO: 2 each */
  float *sL = (float *)(sm + 6 * TILE), *sD = sL + 2 * 64; /* per buffer: lse * log2(e), delta */
  const int kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = H / Hkv;
  const int k0 = kt * BN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t qs = (size_t)H * DH, ks = (size_t)Hkv * DH;
  const __nv_bfloat16 *kb = k + (size_t)b * T_ * ks + (size_t)hk * DH;
  const __nv_bfloat16 *vb = v + (size_t)b * T_ * ks + (size_t)hk * DH;
  const int key_lo = k0 + warp * 16 + g, key_hi = key_lo + 8;
  const int n_chunks = (T_ - k0 + BM - 1) / BM;
  const int n_it = group * n_chunks;

  /* Chunk `it`: head hk * group + it / n_chunks, queries from k0 + (it % n_chunks) * 64. */
  auto load_chunk = [&](int it, int buf) {
    int h = hk * group + it / n_chunks;
    int i0 = k0 + (it % n_chunks) * BM;
    const __nv_bfloat16 *qb = q + (size_t)b * T_ * qs + (size_t)h * DH;
    const __nv_bfloat16 *dob = dout + (size_t)b * T_ * qs + (size_t)h * DH;
    load_sw(sQ + buf * TILE, qb, qs, i0, T_ - i0);
    load_sw(sdO + buf * TILE, dob, qs, i0, T_ - i0);
    if (threadIdx.x < BM) {
      int t = i0 + threadIdx.x;
      const size_t row = ((size_t)b * H + h) * T_;
      sL[buf * BM + threadIdx.x] = t < T_ ? __fmul_rn(lse[row + t], LOG2E) : 0.0f;
      sD[buf * BM + threadIdx.x] = t < T_ ? delta[row + t] : 0.0f;
    }
  };

  load_sw(sK, kb, ks, k0, T_ - k0);
  load_sw(sV, vb, ks, k0, T_ - k0);
  load_chunk(0, 0);
  cp_async_commit();

  float dka[DH / 8][4], dva[DH / 8][4];
#pragma unroll
  for (int i = 0; i < DH / 8; i++) {
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
    tz_wgmma::fence_smem();
    __syncthreads();
    const int i0 = k0 + (it % n_chunks) * BM;
    const uint8_t *Qc = sQ + buf * TILE, *dOc = sdO + buf * TILE;
    const float *Lc = sL + buf * BM, *Dc = sD + buf * BM;

    float st[BM / 8][4], dpt[BM / 8][4];
    float(&std_)[32] = *reinterpret_cast<float(*)[32]>(&st[0][0]);
    float(&dptd)[32] = *reinterpret_cast<float(*)[32]>(&dpt[0][0]);
    tz_wgmma::fence();
    product_k(std_, sK, Qc);
    product_k(dptd, sV, dOc);
    tz_wgmma::commit();
    tz_wgmma::wait<0>();

    kv_probs<BM / 8>(st, dpt, Lc, Dc, i0, key_lo, key_hi, T_, scale_log2, c);

    /* dv += p^T dout, dk += ds^T q */
    uint32_t pa[BM / 16][4], dsa[BM / 16][4];
#pragma unroll
    for (int j = 0; j < BM / 16; j++) {
      pack_a<__nv_bfloat16, BM / 8>(pa[j], st, j);
      pack_a<__nv_bfloat16, BM / 8>(dsa[j], dpt, j);
    }
    float(&v0)[32] = *reinterpret_cast<float(*)[32]>(&dva[0][0]);
    float(&v1)[32] = *reinterpret_cast<float(*)[32]>(&dva[8][0]);
    float(&k0a)[32] = *reinterpret_cast<float(*)[32]>(&dka[0][0]);
    float(&k1a)[32] = *reinterpret_cast<float(*)[32]>(&dka[8][0]);
    tz_wgmma::fence();
#pragma unroll
    for (int j = 0; j < BM / 16; j++) { /* product_mn's two products, slice by slice */
      tz_wgmma::mma_m64n64k16_bf16_rs<1>(v0, pa[j], tz_wgmma::desc_mn(dOc + j * 2048), 1);
      tz_wgmma::mma_m64n64k16_bf16_rs<1>(v1, pa[j], tz_wgmma::desc_mn(dOc + HALF + j * 2048), 1);
      tz_wgmma::mma_m64n64k16_bf16_rs<1>(k0a, dsa[j], tz_wgmma::desc_mn(Qc + j * 2048), 1);
      tz_wgmma::mma_m64n64k16_bf16_rs<1>(k1a, dsa[j], tz_wgmma::desc_mn(Qc + HALF + j * 2048), 1);
    }
    tz_wgmma::commit();
    tz_wgmma::wait<0>();
    __syncthreads();
  }

  __nv_bfloat16 *dkb = dk + (size_t)b * T_ * ks + (size_t)hk * DH;
  __nv_bfloat16 *dvb = dv + (size_t)b * T_ * ks + (size_t)hk * DH;
  kv_store<__nv_bfloat16, W128>(dkb, dvb, dka, dva, ks, key_lo, key_hi, T_, DH, scale, c);
#else
  (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)T_;
  (void)H, (void)Hkv, (void)scale, (void)scale_log2;
  __trap();
#endif
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} /* namespace */

int tz_cuda_attention_fwd_wgmma(struct tz_cuda *c, void *out, float *lse, const void *q,
                                const void *k, const void *v, int B, int T, int H, int Hkv, int D) {
  if (c->S != TZ_BF16 || D != DH || !c->sm90 || SMEM > c->smem_optin || !aligned16(out) ||
      !aligned16(q) || !aligned16(k) || !aligned16(v))
    return 1;
  TZ_CU(cudaFuncSetAttribute((const void *)attn_fwd_wgmma_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM));
  dim3 grid((unsigned)((T + BM - 1) / BM), (unsigned)H, (unsigned)B);
  float scale_log2 = 1.0f / sqrtf((float)D) * LOG2E;
  attn_fwd_wgmma_kernel<<<grid, 128, SMEM, c->stream>>>(
      (__nv_bfloat16 *)out, lse, (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k,
      (const __nv_bfloat16 *)v, T, H, Hkv, scale_log2);
  TZ_CU_LAUNCHED();
  return 0;
}

int tz_cuda_attention_bwd_wgmma(struct tz_cuda *c, void *dq, void *dk, void *dv,
                                const float *delta, const void *dout, const void *q,
                                const void *k, const void *v, const float *lse, int B, int T,
                                int H, int Hkv, int D) {
  const void *ts[] = {dq, dk, dv, dout, q, k, v};
  for (const void *t : ts)
    if (!aligned16(t))
      return 1;
  if (c->S != TZ_BF16 || D != DH || !c->sm90 || BWD_SMEM > c->smem_optin)
    return 1;
  TZ_CU(cudaFuncSetAttribute((const void *)attn_bwd_dq_wgmma_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)BWD_SMEM));
  TZ_CU(cudaFuncSetAttribute((const void *)attn_bwd_dkdv_wgmma_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)BWD_SMEM));
  float scale = 1.0f / sqrtf((float)D), scale_log2 = scale * LOG2E;
  typedef __nv_bfloat16 E;
  dim3 grid_q((unsigned)((T + BM - 1) / BM), (unsigned)H, (unsigned)B);
  attn_bwd_dq_wgmma_kernel<<<grid_q, 128, BWD_SMEM, c->stream>>>(
      (E *)dq, (const E *)dout, (const E *)q, (const E *)k, (const E *)v, lse, delta, T, H, Hkv,
      scale, scale_log2);
  TZ_CU_LAUNCHED();
  dim3 grid_kv((unsigned)((T + BN - 1) / BN), (unsigned)Hkv, (unsigned)B);
  attn_bwd_dkdv_wgmma_kernel<<<grid_kv, 128, BWD_SMEM, c->stream>>>(
      (E *)dk, (E *)dv, (const E *)dout, (const E *)q, (const E *)k, (const E *)v, lse, delta, T,
      H, Hkv, scale, scale_log2);
  TZ_CU_LAUNCHED();
  return 0;
}
