/* Attention forward on Hopper's warpgroup MMA (issue 24; tierzero.cuda_attention wgmma): bf16,
 * head dim 128, causal, tensors 16-byte aligned, an sm_90 device; everything else declines (1)
 * and runs the mma.sync kernels. Built for sm_90a alone (kernels/cuda/wgmma.cuh).
 *
 * The algorithm and its arithmetic are attn_fwd_mma_kernel's (attention_mma.cu): a block of 64
 * query rows of one (batch, head), key tiles of 64 double-buffered with cp.async, the same online
 * softmax (softmax_step) and store (fwd_store), the longest rows first. What changes is the two
 * products: one warpgroup (the block's 4 warps) issues S = Q K^T as 8 wgmma k16 slices from
 * shared memory and O += P V as 4 slices with P from registers, instead of each warp issuing
 * mma.sync per 16 x 8 tile. The warpgroup's accumulator fragment gives each warp 16 rows in
 * mma.sync's m16n8 layout, so softmax_step and pack_a work on it unchanged. The tiles sit in
 * shared memory in wgmma's 128-byte-swizzled layout: 64 rows by 128 columns as two 64-column
 * halves of 8 KiB each.
 *
 * Deterministic: every sum has a fixed order (the hardware's inside each product), so the same
 * bits every run; not the bits of the mma.sync kernel (another order inside the products). This
 * first version waits for each product before the next; overlapping them (two warpgroups, one's
 * softmax beside the other's products) comes once it is checked on the GPU. */
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
    const uint8_t *Kt = sK + buf * TILE, *Vt = sV + buf * TILE;

    /* s = q k^T: k16 slice kk is 32 bytes into half kk / 4 of both tiles */
    float s[BN / 8][4];
    float(&sd)[32] = *reinterpret_cast<float(*)[32]>(&s[0][0]);
    tz_wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < DH / 16; kk++) {
      int off = (kk >> 2) * HALF + (kk & 3) * 32;
      tz_wgmma::mma_m64n64k16_bf16<0>(sd, tz_wgmma::desc_k(sQ + off), tz_wgmma::desc_k(Kt + off),
                                      kk > 0);
    }
    tz_wgmma::commit();
    tz_wgmma::wait<0>();

    softmax_step<BN / 8, DH / 8>(s, o, m_lo, m_hi, l_lo, l_hi, kt == n_kt - 1, kt * BN, row_lo,
                                 row_hi, c, scale_log2);

    /* o += p v: key slice j is rows 16 j.. of V, 2048 bytes into each half */
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int j = 0; j < BN / 16; j++)
      pack_a<__nv_bfloat16, BN / 8>(pa[j], s, j);
    float(&o0)[32] = *reinterpret_cast<float(*)[32]>(&o[0][0]);
    float(&o1)[32] = *reinterpret_cast<float(*)[32]>(&o[8][0]);
    tz_wgmma::fence();
#pragma unroll
    for (int j = 0; j < BN / 16; j++) {
      tz_wgmma::mma_m64n64k16_bf16_rs<1>(o0, pa[j], tz_wgmma::desc_mn(Vt + j * 2048), 1);
      tz_wgmma::mma_m64n64k16_bf16_rs<1>(o1, pa[j], tz_wgmma::desc_mn(Vt + HALF + j * 2048), 1);
    }
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
