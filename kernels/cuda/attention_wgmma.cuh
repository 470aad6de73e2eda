/* The warpgroup-MMA attention's tiles and products (attention_wgmma.cu, attention_pp.cu; built
 * for sm_90a): 64-row tiles of DP = 64 or 128 columns in wgmma's 128-byte-swizzled layout, their
 * loads by cp.async, the products over the head dimension (product_k) and over a tile's rows
 * (product_mn), and the fragments between them. attention_wgmma.cu's comment says how the
 * kernels use them. */
#ifndef TZ_KERNELS_CUDA_ATTENTION_WGMMA_CUH
#define TZ_KERNELS_CUDA_ATTENTION_WGMMA_CUH

#include <stdint.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/wgmma.cuh"

/* TZ_ATTN_FWD_PP 1, TZ_ATTN_DQ_PP 1 (CUDA flags): the causal forward, and dq, at head dim 128
 * on attention_pp.cu's kernels (off until their GPU tests and A/B ran) */
#ifndef TZ_ATTN_FWD_PP
#define TZ_ATTN_FWD_PP 0
#endif
#ifndef TZ_ATTN_DQ_PP
#define TZ_ATTN_DQ_PP 0
#endif

namespace tz_wgattn {

using namespace tz_attn;

constexpr int WR = 64;         /* rows (queries or keys) of a warpgroup, keys of a tile */
constexpr int HALF = 64 * 128; /* bytes of a 64 x 64 half of a tile */
/* bytes of a tile of 64 rows by DP columns */
template <int DP> __host__ __device__ constexpr int tile_bytes() { return DP / 64 * HALF; }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* ROWS (64 or 128) rows of D bf16 from base + (row0 + r) * stride into swizzled tiles of DP
 * columns (row r in tile r / 64) by the block's threads, 16 bytes a copy; rows at or past `valid`
 * and columns D..DP-1 are zero-filled (D a multiple of 8). */
template <int ROWS, int NT, int DP>
__device__ __forceinline__ void load_sw(uint8_t *s, const __nv_bfloat16 *base, size_t stride,
                                        int row0, int valid, int D) {
  constexpr unsigned CPR = DP / 8; /* 16-byte chunks a row, a power of 2 */
  /* The addresses made once (docs/cuda-kernels.md). A thread's chunk column ch is the same in
   * every pass, its rows r0 + RSTEP j (RSTEP a multiple of 8 dividing 64), so the swizzle's r & 7
   * is r0's and a pass's shared offset a constant; the global address steps by RSTEP rows. The
   * profile counted some nine instructions a copy computing them each time (the forward's 16 a key
   * tile: 18% of its instructions). */
  constexpr int RSTEP = NT / CPR;
  static_assert(NT % CPR == 0 && RSTEP % 8 == 0 && 64 % RSTEP == 0, "rows a pass");
  const int ch = (int)threadIdx.x & (CPR - 1), r0 = (int)threadIdx.x / CPR;
  uint8_t *sp = s + (ch >> 3) * HALF + r0 * 128 + (((ch & 7) ^ (r0 & 7)) << 4);
  const __nv_bfloat16 *gp = base + (size_t)(row0 + r0) * stride + ch * 8;
  const size_t gstep = (size_t)RSTEP * stride;
  /* pass j's shared address: rows j RSTEP.. of the tiles */
  auto at = [&](int j) {
    return sp + (j * RSTEP >> 6) * tile_bytes<DP>() + (j * RSTEP & 63) * 128;
  };
  if (valid >= ROWS && ch * 8 < D) { /* a whole tile: no test a copy */
#pragma unroll
    for (int j = 0; j < ROWS / RSTEP; j++)
      cp_async16(at(j), gp + j * gstep, 16);
    return;
  }
#pragma unroll
  for (int j = 0; j < ROWS / RSTEP; j++) {
    int ok = r0 + j * RSTEP < valid && ch * 8 < D; /* nothing is read where not ok */
    cp_async16(at(j), ok ? gp + j * gstep : base, ok ? 16 : 0);
  }
}

/* The streamed tiles of step `it` (of n) are waited for and made visible to the products, the
 * next step's having been started by `issue_next` (called when there is one). */
template <typename F> __device__ __forceinline__ void next_step(int it, int n, F issue_next) {
  if (it + 1 < n) {
    issue_next();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  tz_wgmma::fence_smem(); /* cp.async's writes, before the products read them */
  __syncthreads();
}

/* After the first product's commit at tile kt: from the second tile on, the tile before's
 * second product is issued beside it (`issue`, committed here); then the first is waited for
 * alone, the second left running. */
template <typename F> __device__ __forceinline__ void beside(int kt, F issue) {
  if (kt > 0) {
    issue();
    tz_wgmma::commit();
    tz_wgmma::wait<1>();
  } else {
    tz_wgmma::wait<0>();
  }
}

/* d = a b^T over the head dimension, DP / 16 k16 slices, the accumulators overwritten: a and b
 * 64 x DP swizzled tiles, both K-major. Issued, not waited for. */
template <int DP>
__device__ __forceinline__ void product_k(float (&d)[32], const uint8_t *a, const uint8_t *b) {
#pragma unroll
  for (int kk = 0; kk < DP / 16; kk++) {
    int off = (kk >> 2) * HALF + (kk & 3) * 32; /* slice kk: 32 bytes into half kk / 4 */
    tz_wgmma::mma_m64n64k16_bf16<0>(d, tz_wgmma::desc_k(a + off), tz_wgmma::desc_k(b + off),
                                    kk > 0);
  }
}

/* The same with a from registers (load_afrag's fragments): only b is read from shared memory. */
template <int DP>
__device__ __forceinline__ void product_k(float (&d)[32], const uint32_t (&a)[DP / 16][4],
                                          const uint8_t *b) {
#pragma unroll
  for (int kk = 0; kk < DP / 16; kk++) {
    int off = (kk >> 2) * HALF + (kk & 3) * 32;
    tz_wgmma::mma_m64n64k16_bf16_rs<0>(d, a[kk], tz_wgmma::desc_k(b + off), kk > 0);
  }
}

/* A warp's 16 rows (warp * 16..) of a 64 x DP swizzled tile as A fragments of the DP / 16 k16
 * slices (wgmma.cuh's register layout). */
template <int DP>
__device__ __forceinline__ void load_afrag(uint32_t (&a)[DP / 16][4], const uint8_t *t, int warp,
                                           int g, int c) {
#pragma unroll
  for (int kk = 0; kk < DP / 16; kk++) {
    const uint8_t *h = t + (kk >> 2) * HALF;
    uint32_t r = (uint32_t)(warp * 16 + g), col = (uint32_t)((kk & 3) * 16 + 2 * c);
    a[kk][0] = *(const uint32_t *)(h + tz_wgmma::sw128(r, col));
    a[kk][1] = *(const uint32_t *)(h + tz_wgmma::sw128(r + 8, col));
    a[kk][2] = *(const uint32_t *)(h + tz_wgmma::sw128(r, col + 8));
    a[kk][3] = *(const uint32_t *)(h + tz_wgmma::sw128(r + 8, col + 8));
  }
}

/* Q (or dO) as product_k's first operand: the tile itself, or its fragments in registers. */
template <bool AREG, int DP> struct qop;
template <int DP> struct qop<false, DP> {
  const uint8_t *t;
  __device__ __forceinline__ void load(const uint8_t *tile, int, int, int) { t = tile; }
  __device__ __forceinline__ void product(float (&d)[32], const uint8_t *b) const {
    product_k<DP>(d, t, b);
  }
};
template <int DP> struct qop<true, DP> {
  uint32_t a[DP / 16][4];
  __device__ __forceinline__ void load(const uint8_t *tile, int warp, int g, int c) {
    load_afrag<DP>(a, tile, warp, g, c);
  }
  __device__ __forceinline__ void product(float (&d)[32], const uint8_t *b) const {
    product_k<DP>(d, a, b);
  }
};

/* acc += a b over b's 64 rows, 4 k16 slices: a 64 x 64 in registers (pack_a's fragments of
 * probabilities or score gradients, a[j] for rows 16 j.. of b), b a 64 x DP swizzled tile read
 * MN-major, its 64-column half n into acc[8 n .. 8 n + 7]. Issued, not waited for. */
template <int DP>
__device__ __forceinline__ void product_mn(float (&acc)[DP / 8][4], const uint32_t (&a)[4][4],
                                           const uint8_t *b) {
#pragma unroll
  for (int j = 0; j < 4; j++) { /* slice j: rows 16 j.., 2048 bytes into each half */
#pragma unroll
    for (int n = 0; n < DP / 64; n++) {
      float(&d)[32] = *reinterpret_cast<float(*)[32]>(&acc[8 * n][0]);
      tz_wgmma::mma_m64n64k16_bf16_rs<1>(d, a[j], tz_wgmma::desc_mn(b + n * HALF + j * 2048), 1);
    }
  }
}

__device__ __forceinline__ float (&flat(float (&x)[8][4]))[32] {
  return *reinterpret_cast<float(*)[32]>(&x[0][0]);
}

template <int NS>
__device__ __forceinline__ void pack_all(uint32_t (&a)[NS / 2][4], const float (&x)[NS][4]) {
#pragma unroll
  for (int j = 0; j < NS / 2; j++)
    pack_a<__nv_bfloat16, NS>(a[j], x, j);
}

template <int ND> __device__ __forceinline__ void zero(float (&x)[ND][4]) {
#pragma unroll
  for (int i = 0; i < ND; i++)
    x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.0f;
}
#endif

/* The query side's block (forward, dq) of NWG warpgroups: 64 NWG rows from 64 NWG i (i: the
 * longest first), warpgroup w's 64-row tile mt = NWG i + w; the block streams key tiles 0 ..
 * min(NWG i + NWG - 1, last), the warpgroup uses 0 .. mt (n_mine of them; none past T). w: the
 * thread's warpgroup among the block's query rows, where it is not threadIdx.x / 128
 * (attention_pp.cu's consumers, after its producer, pass theirs warp-uniform, so that ptxas does
 * not take their branches as divergent). */
template <int NWG> struct qblock {
  int i, wg, warp, g, c, mt, n_kt, n_mine, row_lo, row_hi;
  __device__ __forceinline__ qblock(int T_) {
    i = gridDim.x - 1 - blockIdx.x;
    wg = threadIdx.x >> 7;
    rows(T_);
  }
  __device__ __forceinline__ qblock(int T_, int w) {
    i = gridDim.x - 1 - blockIdx.x;
    wg = w;
    rows(T_);
  }
  __device__ __forceinline__ void rows(int T_) {
    warp = (threadIdx.x >> 5) & 3;
    int lane = threadIdx.x & 31;
    g = lane >> 2, c = lane & 3;
    const int n64 = (T_ + WR - 1) / WR;
    mt = NWG * i + wg;
    n_kt = min(NWG * i + NWG, n64);
    n_mine = mt < n64 ? mt + 1 : 0;
    row_lo = mt * WR + warp * 16 + g, row_hi = row_lo + 8;
  }
};

} /* namespace tz_wgattn */

#endif
