/* Attention on Hopper's warpgroup MMA (issue 24; auto's on sm_90): the forward and the two-pass
 * backward: bf16, causal, with or without packed documents and the variants (windows, softcaps,
 * the scale: VAR below), tensors 16-byte aligned, an sm_90 device, head dims that are multiples of
 * 8 from 64 to 128; everything else declines (1), and choice.c gives it the mma.sync or plain
 * kernels. Built for sm_90a alone (kernels/cuda/wgmma.cuh).
 *
 * The tiles are DP = 64 or 128 columns wide, one or two 64-column halves: head dim 64 and 128
 * exactly, the head dims between them padded to 128 (columns D..127 zero in shared memory, so
 * the products over the head dimension add zeros, and the stores skip them: the waste is the
 * padding's share of the products, 25% at 96).
 *
 * The algorithms and their arithmetic are attention_mma.cu's: per 64 query rows of one (batch,
 * head), key tiles of 64 loaded with cp.async ahead of use, the same online softmax
 * (softmax_probs, softmax_rescale) and store (fwd_store). What changes is the products: a
 * warpgroup (4 warps) issues S = Q K^T as 8 wgmma k16 slices from shared memory and O += P V as
 * 4 slices with P from registers, instead of each warp issuing mma.sync per 16 x 8 tile. The
 * warpgroup's accumulator fragment gives each warp 16 rows in mma.sync's m16n8 layout, so the
 * softmax, kv_probs and pack_a work on it unchanged. The tiles sit in shared memory in wgmma's
 * 128-byte-swizzled layout: 64 rows by DP columns as DP / 64 halves of 64 columns, 8 KiB each.
 *
 * A block is NWG warpgroups (128 NWG threads) that share the streamed tiles: in the forward and
 * dq, 64 NWG query rows (warpgroup w the 64 from 64 (NWG i + w)) against one stream of key
 * tiles; in dk/dv, 64 NWG keys against one stream of query chunks. A warpgroup runs exactly its
 * 64-row sequence of the one-warpgroup design (another's extra tile skipped: the diagonal one in
 * the forward and dq, each head's first chunk in dk/dv), so the bits do not depend on NWG. Two
 * halve the tiles read from L2 but measured slower (FWD_NWG below says why); the kernels run
 * with one, two blocks an SM. The forward's Q sits in registers (qop<true>): its scores then
 * read only K from shared memory.
 *
 * Inside a warpgroup the forward and dq overlap their products with the softmax (FA3's
 * intra-warpgroup pipelining): at key tile j the warpgroup issues tile j's scores, then tile
 * j - 1's P V (or dS K), waits for the scores alone and computes tile j's probabilities while
 * the second product runs. The accumulator sees the same operations in the same order (rescale
 * by tile j's factor after tile j - 1's product is added), so the bits are those of the serial
 * order. The buffer read one tile late (V in the forward, K in dq) has three slots.
 *
 * Deterministic: every sum has a fixed order (the hardware's inside each product), so the same
 * bits every run; not the bits of the mma.sync kernels (another order inside the products). */
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/wgmma.cuh"

/* TZ_ATTN_KV_KIND 1: the dk/dv kernels that keep the loop without the pipeline (softcaps, head
 * dim 64, padded head dims) built for their call's kind (cap_of), so a softcap's score is the
 * forward's and dq's arithmetic; ptxas: 32 bytes of spill for the exact softcap, 72 for approx
 * at head dim 128. Off until its GPU tests and its A/B ran (docs/cuda-kernels.md). */
#ifndef TZ_ATTN_KV_KIND
#define TZ_ATTN_KV_KIND 0
#endif
/* TZ_ATTN_FWD_PP 1, TZ_ATTN_DQ_PP 1: the causal forward, and dq, at head dim 128 on
 * attn_fwd_pp_kernel and attn_bwd_dq_pp_kernel (below) */
#ifndef TZ_ATTN_FWD_PP
#define TZ_ATTN_FWD_PP 0
#endif
#ifndef TZ_ATTN_DQ_PP
#define TZ_ATTN_DQ_PP 0
#endif

namespace {

using namespace tz_attn;

constexpr int WR = 64;         /* rows (queries or keys) of a warpgroup, keys of a tile */
constexpr int HALF = 64 * 128; /* bytes of a 64 x 64 half of a tile */
/* bytes of a tile of 64 rows by DP columns */
template <int DP> __host__ __device__ constexpr int tile_bytes() { return DP / 64 * HALF; }
/* Q (a tile per warpgroup), two K buffers, three V, alignment slack */
template <int DP> constexpr size_t fwd_smem(int nwg) {
  return (size_t)(nwg + 5) * tile_bytes<DP>() + 1024;
}

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
 * min(NWG i + NWG - 1, last), the warpgroup uses 0 .. mt (n_mine of them; none past T). */
template <int NWG> struct qblock {
  int i, wg, warp, g, c, mt, n_kt, n_mine, row_lo, row_hi;
  __device__ __forceinline__ qblock(int T_) {
    i = gridDim.x - 1 - blockIdx.x;
    wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3;
    int lane = threadIdx.x & 31;
    g = lane >> 2, c = lane & 3;
    const int n64 = (T_ + WR - 1) / WR;
    mt = NWG * i + wg;
    n_kt = min(NWG * i + NWG, n64);
    n_mine = mt < n64 ? mt + 1 : 0;
    row_lo = mt * WR + warp * 16 + g, row_hi = row_lo + 8;
  }
};

/* VAR, the kernels' kind of call: 0 causal, 1 packed documents or variants without a softcap,
 * 2 and 3 with one, its tanh exact or approximated (the setting softcap_tanh); the softcap's
 * kind, fixed for a kernel, makes a tile's loop straight-line code (attention_mma.cuh, CAP_*). */
__host__ __device__ constexpr int cap_of(int var) { return var >= 2 ? var - 1 : CAP_NONE; }

/* Packed documents and windows on the query side (VAR; common.cuh, tz_first_key): the block's
 * key tiles start at its first row's first key's (kt0: the tiles before hold no key any of its
 * rows sees), each row hides the keys before its own first (st_lo, st_hi), and a tile before the
 * warpgroup's last row's first key (st_wg) is masked (partial). The softcap's factors ride along.
 * Without VAR every field is 0 and the arithmetic is the causal kernels'. */
template <int VAR> struct firsts {
  int kt0, st_lo, st_hi, st_wg;
  float cap_in, cap_log2;
  template <int NWG>
  __device__ __forceinline__ firsts(const int32_t *pos, const tz_attn_var &var, int b, int T_,
                                    int q0, const qblock<NWG> &p) {
    kt0 = st_lo = st_hi = st_wg = 0;
    cap_in = VAR ? var.cap_in : 0.0f;
    cap_log2 = VAR ? var.cap_log2 : 0.0f;
    const int W_ = VAR ? var.window : 0;
    if (VAR && (pos || W_ > 0)) {
      kt0 = tz_first_key(pos, b, T_, q0, W_) / WR;
      st_lo = tz_first_key(pos, b, T_, p.row_lo, W_);
      st_hi = tz_first_key(pos, b, T_, p.row_hi, W_);
      st_wg = tz_first_key(pos, b, T_, min(p.mt * WR + WR - 1, T_ - 1), W_);
    }
  }
  __device__ __forceinline__ bool partial(int kt) const { return VAR && kt * WR < st_wg; }
};

template <int NWG, bool AREG, int DP, bool PAD, int VAR>
__global__ void __launch_bounds__(128 * NWG, 2 / NWG)
    attn_fwd_wgmma_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *k, const __nv_bfloat16 *v, int T_, int H, int Hkv,
                          int D, float scale_log2, const int32_t *pos, const tz_attn_var var) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  constexpr int NT = 128 * NWG, TILE = tile_bytes<DP>();
  if (!PAD) /* exact tiles: D the constant DP, its address arithmetic folded */
    D = DP;
  uint8_t *sQ = sm, *sK = sm + NWG * TILE, *sV = sm + (NWG + 2) * TILE; /* K: two, V: three */
  const qblock<NWG> p(T_);
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const __nv_bfloat16 *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
  const __nv_bfloat16 *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const __nv_bfloat16 *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  qop<AREG, DP> Qw;

  const int q0 = p.i * NWG * WR;
  const firsts<VAR> f(pos, var, b, T_, q0, p);
  load_sw<NWG * WR, NT, DP>(sQ, qb, qs, q0, T_ - q0, D);
  load_sw<WR, NT, DP>(sK, kb, ks, f.kt0 * WR, T_ - f.kt0 * WR, D);
  load_sw<WR, NT, DP>(sV, vb, ks, f.kt0 * WR, T_ - f.kt0 * WR, D);
  cp_async_commit();

  float o[DP / 8][4]; /* the output's 64-column halves, o[0..7] and (DP 128) o[8..15] */
  zero(o);
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  uint32_t pa[WR / 16][4]; /* the last tile's probabilities, for its p v */

  /* step j = kt - kt0 of the block's tiles picks the buffers */
  for (int kt = f.kt0; kt < p.n_kt; kt++) {
    const int j = kt - f.kt0;
    next_step(j, p.n_kt - f.kt0, [&] {
      int r0 = (kt + 1) * WR;
      load_sw<WR, NT, DP>(sK + ((j + 1) & 1) * TILE, kb, ks, r0, T_ - r0, D);
      load_sw<WR, NT, DP>(sV + ((j + 1) % 3) * TILE, vb, ks, r0, T_ - r0, D);
    });
    if (j == 0)
      Qw.load(sQ + p.wg * TILE, p.warp, p.g, p.c);
    if (kt < p.n_mine) {
      /* s = q k^T; beside it o += p v of the tile before */
      float s[WR / 8][4];
      tz_wgmma::fence();
      Qw.product(flat(s), sK + (j & 1) * TILE);
      tz_wgmma::commit();
      beside(j, [&] { product_mn<DP>(o, pa, sV + ((j - 1) % 3) * TILE); });
      float a_lo, a_hi; /* the mask a constant in each call: the masked tiles' code apart */
      if (kt == p.mt || f.partial(kt))
        softmax_probs<WR / 8, cap_of(VAR)>(s, m_lo, m_hi, l_lo, l_hi, a_lo, a_hi, true, kt * WR,
                                           p.row_lo, p.row_hi, p.c, scale_log2, f.st_lo, f.st_hi,
                                           f.cap_in, f.cap_log2);
      else
        softmax_probs<WR / 8, cap_of(VAR)>(s, m_lo, m_hi, l_lo, l_hi, a_lo, a_hi, false, kt * WR,
                                           p.row_lo, p.row_hi, p.c, scale_log2, 0, 0, f.cap_in,
                                           f.cap_log2);
      tz_wgmma::wait<0>();
      /* where no row of the warp moved its max the factors are 1 and the rescale exact: skipped */
      if (!__all_sync(0xffffffffu, a_lo == 1.0f && a_hi == 1.0f))
        softmax_rescale<DP / 8>(o, a_lo, a_hi);
      pack_all<WR / 8>(pa, s);
    }
    __syncthreads(); /* the buffers read here are refilled from the next step on */
  }
  if (p.n_mine == 0)
    return;
  tz_wgmma::fence();
  product_mn<DP>(o, pa, sV + ((p.n_mine - 1 - f.kt0) % 3) * TILE);
  tz_wgmma::commit();
  tz_wgmma::wait<0>();

  fwd_store<__nv_bfloat16, width<DP, PAD>>(out, lse, o, l_lo, l_hi, m_lo, m_hi, b, h, H, p.row_lo,
                                           p.row_hi, T_, D, p.c);
#else
  (void)out, (void)lse, (void)q, (void)k, (void)v, (void)T_, (void)H, (void)Hkv, (void)D;
  (void)scale_log2, (void)pos, (void)var;
  __trap();
#endif
}

#if TZ_ATTN_FWD_PP || TZ_ATTN_DQ_PP
/* ---- the causal forward and dq with a producer warpgroup and two consumers taking turns
 * (TZ_ATTN_FWD_PP 1, TZ_ATTN_DQ_PP 1: FlashAttention 3's warp specialization and ping-pong; off
 * until their GPU tests and A/B ran) ----
 * A block of 128 queries is three warpgroups: warpgroup 0 loads Q and the key tiles' K and V into
 * a ring of PP_STAGES stages (cp.async; a stage's "full" barrier is arrived on by each loading
 * thread once its copies landed, its "empty" one by each consumer warp once its products read
 * it), and warpgroups 1 and 2 each run exactly the one-warpgroup kernel's loop for their 64 rows
 * (queries 128 i + 64 c..), taking turns to issue their products (two named barriers): while one
 * computes a tile's softmax the other's products run. 384 threads launch with 168 registers a
 * thread; the producer gives them up down to 56 and the consumers take 224 (setmaxnreg, 64,512
 * of the 65,536), which ptxas allocates each side's code within: no spill (at 40 the producer's
 * loads spilled 68 bytes, and dq's producer loading its 128 rows of Q and dO in two calls 188;
 * a producer warp instead of a warpgroup, 288 threads, is rounded up to the same 168 a thread
 * and serializes the products). Same operations per row in the same order, so the same bits as
 * attn_fwd_wgmma_kernel and attn_bwd_dq_wgmma_kernel. */
constexpr int PP_STAGES = 4;
/* NQ query-side tiles, the stages' K and V, the barriers */
constexpr size_t pp_smem(int nq) {
  return (size_t)(nq + 2 * PP_STAGES) * tile_bytes<128>() + 2 * PP_STAGES * 8 + 1024;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(b)) : "memory");
}
/* Waits until the barrier's phase of the given parity completed. */
__device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity) {
  asm volatile("{\n"
               ".reg .pred done;\n"
               "WAIT%=:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra WAIT%=;\n"
               "}\n" ::"r"(smem_addr(b)),
               "r"(parity)
               : "memory");
}
/* Named barriers 1 and 2 between the two consumers (256 threads): sync waits for the other's
 * arrive. */
__device__ __forceinline__ void turn_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void turn_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

/* A block's shared memory and barriers, its query rows (128 i..) and key tiles, for the
 * producer and the consumers alike. NQ: the query side's tiles (2: Q; 4: Q and dO). */
template <int NQ> struct pp_block {
  static constexpr int TILE = tile_bytes<128>();
  uint8_t *sQ, *sKV; /* query tiles (NQ), then stage s: K at sKV + 2 s TILE, V one tile on */
  uint64_t *full, *empty;
  int i, wg, n64, n_kt;
  bool both; /* the second consumer has rows */
  __device__ __forceinline__ pp_block(int T_) {
    extern __shared__ unsigned char smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    sQ = sm, sKV = sm + NQ * TILE;
    full = (uint64_t *)(sKV + 2 * PP_STAGES * TILE), empty = full + PP_STAGES;
    i = gridDim.x - 1 - blockIdx.x; /* the longest first */
    /* the warpgroup, warp-uniform to the compiler (so its branches are not divergent ones) */
    wg = __shfl_sync(0xffffffffu, (int)threadIdx.x >> 7, 0);
    n64 = (T_ + WR - 1) / WR;
    n_kt = min(2 * i + 2, n64);
    both = 2 * i + 1 < n64;
    if (threadIdx.x == 0) {
      for (int s = 0; s < PP_STAGES; s++) {
        mbar_init(&full[s], 128);
        mbar_init(&empty[s], both ? 8 : 4); /* a consumer warp each */
      }
    }
    __syncthreads();
  }
  __device__ __forceinline__ uint8_t *K(int kt) const { return sKV + 2 * (kt % PP_STAGES) * TILE; }
  __device__ __forceinline__ uint8_t *V(int kt) const {
    return sKV + (2 * (kt % PP_STAGES) + 1) * TILE;
  }
  /* warpgroup 0: the query side's tiles (qb's rows, and dob's where NQ is 4) with the first key
   * tile, then each key tile's K and V into its stage once the consumers released it */
  __device__ __forceinline__ void produce(const __nv_bfloat16 *qb, const __nv_bfloat16 *dob,
                                          size_t qs, const __nv_bfloat16 *kb,
                                          const __nv_bfloat16 *vb, size_t ks, int T_) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
    const int q0 = 2 * i * WR;
    for (int j = 0; j < n_kt; j++) {
      if (j >= PP_STAGES)
        mbar_wait(&empty[j % PP_STAGES], (unsigned)((j / PP_STAGES - 1) & 1));
      if (j == 0) /* 64 rows a call: fewer addresses live in the producer's registers */
        for (int t = 0; t < NQ; t++) {
          const int r0 = q0 + (t & 1) * WR;
          load_sw<WR, 128, 128>(sQ + t * TILE, t < 2 ? qb : dob, qs, r0, T_ - r0, 128);
        }
      load_sw<WR, 128, 128>(K(j), kb, ks, j * WR, T_ - j * WR, 128);
      load_sw<WR, 128, 128>(V(j), vb, ks, j * WR, T_ - j * WR, 128);
      cp_async_commit();
      if (j > 0) { /* the tile before landed: its stage is full */
        cp_async_wait<1>();
        tz_wgmma::fence_smem();
        mbar_arrive(&full[(j - 1) % PP_STAGES]);
      }
    }
    cp_async_wait<0>();
    tz_wgmma::fence_smem();
    mbar_arrive(&full[(n_kt - 1) % PP_STAGES]);
  }
  /* a consumer's wait for tile kt's stage */
  __device__ __forceinline__ void wait_full(int kt) {
    mbar_wait(&full[kt % PP_STAGES], (unsigned)((kt / PP_STAGES) & 1));
    tz_wgmma::fence_smem();
  }
  /* a consumer warp's release of tile kt's stage, its products done */
  __device__ __forceinline__ void release(int kt, int lane) {
    if (lane == 0)
      mbar_arrive(&empty[kt % PP_STAGES]);
  }
};

/* The consumers' turns at issuing products: consumer 0 first; barrier 1 is consumer 0's to wait
 * on, 2 consumer 1's. Consumer 1 has one tile more (its diagonal), so it owes consumer 0 no turn
 * after consumer 0's last tile, and consumer 0 gives it one after its loop. */
struct pp_turns {
  bool on;
  int c, n;
  __device__ __forceinline__ pp_turns(bool both, int c_, int n_mine) : on(both), c(c_), n(n_mine) {
    if (on && c == 1)
      turn_arrive(1);
  }
  __device__ __forceinline__ void take() const {
    if (on)
      turn_sync(1 + c);
  }
  __device__ __forceinline__ void give(int kt) const {
    if (on && (c == 0 || kt < n - 2))
      turn_arrive(2 - c);
  }
  __device__ __forceinline__ void done() const {
    if (on && c == 0)
      turn_arrive(2);
  }
};

#endif

__global__ void __launch_bounds__(384, 1)
    attn_fwd_pp_kernel(__nv_bfloat16 *out, float *lse, const __nv_bfloat16 *q,
                       const __nv_bfloat16 *k, const __nv_bfloat16 *v, int T_, int H, int Hkv,
                       float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int DP = 128, D = 128, TILE = tile_bytes<DP>();
  pp_block<2> B(T_);
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  if (B.wg == 0) { /* the producer */
    B.produce(q + (size_t)b * T_ * qs + (size_t)h * D, nullptr, qs,
              k + (size_t)b * T_ * ks + (size_t)hk * D, v + (size_t)b * T_ * ks + (size_t)hk * D,
              ks, T_);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
  const int c = B.wg - 1; /* the consumer: rows 64 (2 i + c).. */
  const int mt = 2 * B.i + c;
  if (mt >= B.n64)
    return; /* the second consumer of the last block of an odd count: no rows */
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, cq = lane & 3;
  const int row_lo = mt * WR + warp * 16 + g, row_hi = row_lo + 8;
  const int n_mine = mt + 1;
  const pp_turns turns(B.both, c, n_mine);
  qop<true, DP> Qw;
  float o[DP / 8][4];
  zero(o);
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  uint32_t pa[WR / 16][4];
  for (int kt = 0; kt < n_mine; kt++) {
    B.wait_full(kt);
    if (kt == 0)
      Qw.load(B.sQ + c * TILE, warp, g, cq);
    float s[WR / 8][4];
    turns.take();
    tz_wgmma::fence();
    Qw.product(flat(s), B.K(kt));
    tz_wgmma::commit();
    beside(kt, [&] { product_mn<DP>(o, pa, B.V(kt - 1)); });
    turns.give(kt);
    float a_lo, a_hi;
    if (kt == mt)
      softmax_probs<WR / 8, CAP_NONE>(s, m_lo, m_hi, l_lo, l_hi, a_lo, a_hi, true, kt * WR, row_lo,
                                      row_hi, cq, scale_log2, 0, 0, 0.0f, 0.0f);
    else
      softmax_probs<WR / 8, CAP_NONE>(s, m_lo, m_hi, l_lo, l_hi, a_lo, a_hi, false, kt * WR, row_lo,
                                      row_hi, cq, scale_log2, 0, 0, 0.0f, 0.0f);
    tz_wgmma::wait<0>();
    if (kt > 0) /* this warp's products read the tile before's stage: done */
      B.release(kt - 1, lane);
    if (!__all_sync(0xffffffffu, a_lo == 1.0f && a_hi == 1.0f))
      softmax_rescale<DP / 8>(o, a_lo, a_hi);
    pack_all<WR / 8>(pa, s);
  }
  turns.done();
  tz_wgmma::fence();
  product_mn<DP>(o, pa, B.V(n_mine - 1));
  tz_wgmma::commit();
  tz_wgmma::wait<0>();
  B.release(n_mine - 1, lane);
  fwd_store<__nv_bfloat16, width<DP, false>>(out, lse, o, l_lo, l_hi, m_lo, m_hi, b, h, H, row_lo,
                                             row_hi, T_, D, cq);
#else
  (void)out, (void)lse, (void)q, (void)k, (void)v, (void)T_, (void)H, (void)Hkv, (void)scale_log2;
  __trap();
#endif
}

/* dq the same way (TZ_ATTN_DQ_PP 1): the one-warpgroup dq kernel's loop per consumer, Q and dO
 * from shared memory, K read one tile late (its stage released after dq's product of it). */
__global__ void __launch_bounds__(384, 1)
    attn_bwd_dq_pp_kernel(__nv_bfloat16 *dq, const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                          const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse,
                          const float *delta, int T_, int H, int Hkv, float scale,
                          float scale_log2) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int DP = 128, D = 128, TILE = tile_bytes<DP>();
  pp_block<4> B(T_);
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  if (B.wg == 0) {
    B.produce(q + (size_t)b * T_ * qs + (size_t)h * D, dout + (size_t)b * T_ * qs + (size_t)h * D,
              qs, k + (size_t)b * T_ * ks + (size_t)hk * D,
              v + (size_t)b * T_ * ks + (size_t)hk * D, ks, T_);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
  const int c = B.wg - 1;
  const int mt = 2 * B.i + c;
  if (mt >= B.n64)
    return;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, cq = lane & 3;
  const int row_lo = mt * WR + warp * 16 + g, row_hi = row_lo + 8;
  const int n_mine = mt + 1;
  const float *lb = lse + ((size_t)b * H + h) * T_, *db = delta + ((size_t)b * H + h) * T_;
  const float lse_lo = row_lo < T_ ? __fmul_rn(lb[row_lo], LOG2E) : 0.0f;
  const float lse_hi = row_hi < T_ ? __fmul_rn(lb[row_hi], LOG2E) : 0.0f;
  const float del_lo = row_lo < T_ ? db[row_lo] : 0.0f;
  const float del_hi = row_hi < T_ ? db[row_hi] : 0.0f;
  const pp_turns turns(B.both, c, n_mine);
  qop<false, DP> Qw, dOw;
  float acc[DP / 8][4];
  zero(acc);
  uint32_t dsa[WR / 16][4];
  for (int kt = 0; kt < n_mine; kt++) {
    B.wait_full(kt);
    if (kt == 0) {
      Qw.load(B.sQ + c * TILE, warp, g, cq);
      dOw.load(B.sQ + (2 + c) * TILE, warp, g, cq);
    }
    float s[WR / 8][4], dp[WR / 8][4];
    turns.take();
    tz_wgmma::fence();
    Qw.product(flat(s), B.K(kt));
    dOw.product(flat(dp), B.V(kt));
    tz_wgmma::commit();
    beside(kt, [&] { product_mn<DP>(acc, dsa, B.K(kt - 1)); });
    turns.give(kt);
    if (kt == mt)
      q_probs<WR / 8, CAP_NONE>(s, dp, true, kt * WR, row_lo, row_hi, lse_lo, lse_hi, del_lo,
                                del_hi, cq, scale_log2, 0, 0, 0.0f, 0.0f);
    else
      q_probs<WR / 8, CAP_NONE>(s, dp, false, kt * WR, row_lo, row_hi, lse_lo, lse_hi, del_lo,
                                del_hi, cq, scale_log2, 0, 0, 0.0f, 0.0f);
    tz_wgmma::wait<0>();
    if (kt > 0)
      B.release(kt - 1, lane);
    pack_all<WR / 8>(dsa, dp);
  }
  turns.done();
  tz_wgmma::fence();
  product_mn<DP>(acc, dsa, B.K(n_mine - 1));
  tz_wgmma::commit();
  tz_wgmma::wait<0>();
  B.release(n_mine - 1, lane);
  q_store<__nv_bfloat16, width<DP, false>>(dq + (size_t)b * T_ * qs + (size_t)h * D, acc, qs,
                                           row_lo, row_hi, T_, D, scale, cq);
#else
  (void)dq, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)T_, (void)H;
  (void)Hkv, (void)scale, (void)scale_log2;
  __trap();
#endif
}
#endif

/* ---- the backward in two passes, attention_mma.cu's algorithm and arithmetic ----
 * dq: per warpgroup 64 query rows; per key tile, s = q k^T and dp = dout v^T (8 k16 slices each,
 * both from shared memory), ds = p (dp - delta) in registers, dq += ds k (4 slices, ds from
 * registers, K read as an MN-major B), pipelined as the forward. dk, dv: per warpgroup 64 key
 * rows; per chunk of 64 queries (the group's heads in increasing order, then the queries from
 * the warpgroup's first key on), s^T = k q^T and dp^T = v dout^T, p^T and ds^T by kv_probs,
 * dv += p^T dout and dk += ds^T q. At head dim 128 without a softcap the loop is pipelined
 * inside the chunk (kv_p while dp^T's product runs, kv_ds while dv's runs, dk's beside the next
 * chunk's s^T: the same operations in the same order, so the same bits); the other kinds run
 * the chunk's steps one after another (a softcap's slope, or padded tiles, leave no registers
 * for it; at head dim 64 ptxas serializes the products, its note C7513). Every product is an
 * m64n64k16 of the forward's shapes, so the tiles, descriptors and fragments are the
 * forward's. */

/* Q, dO (a tile per warpgroup each), three K, two V */
template <int DP> constexpr size_t dq_smem(int nwg) {
  return (size_t)(2 * nwg + 5) * tile_bytes<DP>() + 1024;
}
/* K, V (a tile per warpgroup each), two buffers of Q, dO, lse, delta and the queries'
 * positions */
template <int DP> constexpr size_t kv_smem(int nwg) {
  return (size_t)(2 * nwg + 4) * tile_bytes<DP>() + 6 * WR * 4 + 1024;
}

template <int NWG, bool AREG, int DP, bool PAD, int VAR>
__global__ void __launch_bounds__(128 * NWG, 2 / NWG)
    attn_bwd_dq_wgmma_kernel(__nv_bfloat16 *dq, const __nv_bfloat16 *dout, const __nv_bfloat16 *q,
                             const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse,
                             const float *delta, int T_, int H, int Hkv, int D, float scale,
                             float scale_log2, const int32_t *pos, const tz_attn_var var) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  constexpr int NT = 128 * NWG, TILE = tile_bytes<DP>();
  if (!PAD) /* exact tiles: D the constant DP, its address arithmetic folded */
    D = DP;
  uint8_t *sQ = sm, *sdO = sm + NWG * TILE, *sK = sm + 2 * NWG * TILE;
  uint8_t *sV = sm + (2 * NWG + 3) * TILE;
  const qblock<NWG> p(T_);
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const __nv_bfloat16 *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
  const __nv_bfloat16 *dob = dout + (size_t)b * T_ * qs + (size_t)h * D;
  const __nv_bfloat16 *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const __nv_bfloat16 *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  const float *lb = lse + ((size_t)b * H + h) * T_, *db = delta + ((size_t)b * H + h) * T_;
  const int row_lo = p.row_lo, row_hi = p.row_hi;
  const float lse_lo = row_lo < T_ ? __fmul_rn(lb[row_lo], LOG2E) : 0.0f;
  const float lse_hi = row_hi < T_ ? __fmul_rn(lb[row_hi], LOG2E) : 0.0f;
  const float del_lo = row_lo < T_ ? db[row_lo] : 0.0f;
  const float del_hi = row_hi < T_ ? db[row_hi] : 0.0f;
  qop<AREG, DP> Qw, dOw;

  const int q0 = p.i * NWG * WR;
  const firsts<VAR> f(pos, var, b, T_, q0, p);
  load_sw<NWG * WR, NT, DP>(sQ, qb, qs, q0, T_ - q0, D);
  load_sw<NWG * WR, NT, DP>(sdO, dob, qs, q0, T_ - q0, D);
  load_sw<WR, NT, DP>(sK, kb, ks, f.kt0 * WR, T_ - f.kt0 * WR, D);
  load_sw<WR, NT, DP>(sV, vb, ks, f.kt0 * WR, T_ - f.kt0 * WR, D);
  cp_async_commit();

  float acc[DP / 8][4];
  zero(acc);
  uint32_t dsa[WR / 16][4]; /* the last tile's score gradients, for its ds k */

  for (int kt = f.kt0; kt < p.n_kt; kt++) {
    const int j = kt - f.kt0; /* the step: the buffers' index */
    next_step(j, p.n_kt - f.kt0, [&] {
      int r0 = (kt + 1) * WR;
      load_sw<WR, NT, DP>(sK + ((j + 1) % 3) * TILE, kb, ks, r0, T_ - r0, D);
      load_sw<WR, NT, DP>(sV + ((j + 1) & 1) * TILE, vb, ks, r0, T_ - r0, D);
    });
    if (j == 0) {
      Qw.load(sQ + p.wg * TILE, p.warp, p.g, p.c);
      dOw.load(sdO + p.wg * TILE, p.warp, p.g, p.c);
    }
    if (kt < p.n_mine) {
      /* s = q k^T, dp = dout v^T; beside them acc += ds k of the tile before */
      float s[WR / 8][4], dp[WR / 8][4];
      tz_wgmma::fence();
      Qw.product(flat(s), sK + (j % 3) * TILE);
      dOw.product(flat(dp), sV + (j & 1) * TILE);
      tz_wgmma::commit();
      beside(j, [&] { product_mn<DP>(acc, dsa, sK + ((j - 1) % 3) * TILE); });
      if (kt == p.mt)
        q_probs<WR / 8, cap_of(VAR)>(s, dp, true, kt * WR, row_lo, row_hi, lse_lo, lse_hi, del_lo,
                                     del_hi, p.c, scale_log2, f.st_lo, f.st_hi, f.cap_in,
                                     f.cap_log2);
      else if (f.partial(kt))
        q_probs<WR / 8, cap_of(VAR)>(s, dp, false, kt * WR, row_lo, row_hi, lse_lo, lse_hi, del_lo,
                                     del_hi, p.c, scale_log2, f.st_lo, f.st_hi, f.cap_in,
                                     f.cap_log2);
      else
        q_probs<WR / 8, cap_of(VAR)>(s, dp, false, kt * WR, row_lo, row_hi, lse_lo, lse_hi, del_lo,
                                     del_hi, p.c, scale_log2, 0, 0, f.cap_in, f.cap_log2);
      tz_wgmma::wait<0>();
      pack_all<WR / 8>(dsa, dp);
    }
    __syncthreads();
  }
  if (p.n_mine == 0)
    return;
  tz_wgmma::fence();
  product_mn<DP>(acc, dsa, sK + ((p.n_mine - 1 - f.kt0) % 3) * TILE);
  tz_wgmma::commit();
  tz_wgmma::wait<0>();

  q_store<__nv_bfloat16, width<DP, PAD>>(dq + (size_t)b * T_ * qs + (size_t)h * D, acc, qs, row_lo,
                                         row_hi, T_, D, scale, p.c);
#else
  (void)dq, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)T_, (void)H;
  (void)Hkv, (void)D, (void)scale, (void)scale_log2, (void)pos, (void)var;
  __trap();
#endif
}

template <int NWG, int DP, bool PAD, int VAR>
__global__ void __launch_bounds__(128 * NWG, 2 / NWG)
    attn_bwd_dkdv_wgmma_kernel(__nv_bfloat16 *dk, __nv_bfloat16 *dv, const __nv_bfloat16 *dout,
                               const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                               const __nv_bfloat16 *v, const float *lse, const float *delta, int T_,
                               int H, int Hkv, int D, float scale, float scale_log2,
                               const int32_t *pos, const tz_attn_var var) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  /* K, V: a tile per warpgroup; Q, dO: two buffers each */
  constexpr int NT = 128 * NWG, TILE = tile_bytes<DP>();
  if (!PAD) /* exact tiles: D the constant DP, its address arithmetic folded */
    D = DP;
  uint8_t *sK = sm, *sV = sm + NWG * TILE, *sQ = sm + 2 * NWG * TILE;
  uint8_t *sdO = sm + (2 * NWG + 2) * TILE;
  float *sL = (float *)(sm + (2 * NWG + 4) * TILE), *sD = sL + 2 * WR; /* per buffer */
  int32_t *sP = (int32_t *)(sD + 2 * WR); /* the queries' positions, per buffer */
  const int hk = blockIdx.y, b = blockIdx.z;
  const int group = H / Hkv;
  const int k0 = blockIdx.x * NWG * WR; /* the block's 64 NWG keys */
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const __nv_bfloat16 *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const __nv_bfloat16 *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  const int key_lo = k0 + wg * WR + warp * 16 + g, key_hi = key_lo + 8;
  /* Chunks of 64 queries from k0, per head; warpgroup 1 (keys from k0 + 64, if any) skips each
   * head's first, where every query comes before its keys. */
  int n_chunks = (T_ - k0 + WR - 1) / WR;
  /* Packed documents and windows (VAR): the chunks from the first whose first query's first key
   * lies past the block's last key on see none of its keys (first keys increase along the
   * queries); a chunk whose last query's first key lies past the warpgroup's first key hides
   * some of its keys (masked). */
  const int W_ = VAR ? var.window : 0;
  const bool firsts = VAR && (pos || W_ > 0);
  const float cap_in = VAR ? var.cap_in : 0.0f, cap_log2 = VAR ? var.cap_log2 : 0.0f;
  /* the softcap read at every score (CAP_RUNTIME): built for each kind, this loop once needed
   * more than the 255 registers (ptxas serialized the products); at this tree ptxas fits it with
   * some spill and no such note, so TZ_ATTN_KV_KIND builds it per kind for its A/B */
#if TZ_ATTN_KV_KIND
  constexpr int CAP = cap_of(VAR); /* built per kind, as the forward and dq are */
#else
  constexpr int CAP = VAR ? CAP_RUNTIME : CAP_NONE;
#endif
  const bool approx = cap_of(VAR) == CAP_APPROX;
  if (firsts) {
    int n = 0;
    while (n < n_chunks && tz_first_key(pos, b, T_, k0 + n * WR, W_) < k0 + NWG * WR)
      n++;
    n_chunks = n;
  }
  const int n_it = group * n_chunks;
  const bool mine = k0 + wg * WR < T_;
  const uint8_t *Kw = sK + wg * TILE, *Vw = sV + wg * TILE;

  /* Chunk `it`: head hk * group + it / n_chunks, queries from k0 + (it % n_chunks) * 64. */
  auto load_chunk = [&](int it, int buf) {
    int h = hk * group + it / n_chunks;
    int i0 = k0 + (it % n_chunks) * WR;
    const __nv_bfloat16 *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
    const __nv_bfloat16 *dob = dout + (size_t)b * T_ * qs + (size_t)h * D;
    load_sw<WR, NT, DP>(sQ + buf * TILE, qb, qs, i0, T_ - i0, D);
    load_sw<WR, NT, DP>(sdO + buf * TILE, dob, qs, i0, T_ - i0, D);
    kv_load_rows<WR>(sL, sD, lse, delta, b, H, h, i0, T_, buf);
    if (VAR == 1 && pos && threadIdx.x < WR) { /* the pipelined loop's masks read them here */
      int t = i0 + (int)threadIdx.x;
      cp_async4(sP + buf * WR + threadIdx.x, pos + (t < T_ ? (size_t)b * T_ + t : 0),
                t < T_ ? 4 : 0);
    }
  };

  load_sw<NWG * WR, NT, DP>(sK, kb, ks, k0, T_ - k0, D);
  load_sw<NWG * WR, NT, DP>(sV, vb, ks, k0, T_ - k0, D);
  load_chunk(0, 0);
  cp_async_commit();

  float dka[DP / 8][4], dva[DP / 8][4];
  zero(dka);
  zero(dva);

  if constexpr (DP == 128 && !PAD && VAR <= 1) { /* pipelined (above): no softcap */
    uint32_t pa[WR / 16][4], dsa[WR / 16][4];
    for (int it = 0; it < n_it; it++) {
      const int buf = it & 1;
      cp_async_wait<0>();
      tz_wgmma::fence_smem();
      __syncthreads(); /* chunk it's tiles, visible to the products */
      const int i0 = k0 + (it % n_chunks) * WR;
      /* one warpgroup a block: it has keys (k0 < T) and takes every chunk (no branch) */
      const bool act = NWG == 1 || (mine && !(wg > 0 && it % n_chunks == 0));
      const uint8_t *Qc = sQ + buf * TILE, *dOc = sdO + buf * TILE;
      const float *Lc = sL + buf * WR, *Dc = sD + buf * WR;
      float st[WR / 8][4], dpt[WR / 8][4];
      if (act) {
        tz_wgmma::fence();
        product_k<DP>(flat(st), Kw, Qc);
        tz_wgmma::commit();
        product_k<DP>(flat(dpt), Vw, dOc);
        tz_wgmma::commit();
        tz_wgmma::wait<1>(); /* s^T, and the chunk before's dv and dk */
        /* the diagonal chunk, one past T, or one hiding keys before its queries' first */
        const int32_t *Pc = VAR == 1 && pos ? sP + buf * WR : nullptr;
        if (i0 < k0 + (wg + 1) * WR || i0 + WR > T_ ||
            (firsts && kv_first_key(Pc, i0 + WR - 1, WR - 1, W_) > k0 + wg * WR))
          kv_p<WR / 8>(st, Lc, i0, key_lo, key_hi, T_, scale_log2, c, true, Pc, W_);
        else
          kv_p<WR / 8>(st, Lc, i0, key_lo, key_hi, T_, scale_log2, c, false, nullptr, 0);
        pack_all<WR / 8>(pa, st);
        tz_wgmma::fence();
        product_mn<DP>(dva, pa, dOc); /* dv += p^T dout */
        tz_wgmma::commit();
      } else {
        tz_wgmma::wait<0>();
      }
      __syncthreads(); /* no warp reads the other buffer any more */
      if (it + 1 < n_it) {
        load_chunk(it + 1, buf ^ 1);
        cp_async_commit();
      }
      if (act) {
        tz_wgmma::wait<1>(); /* dp^T */
        kv_ds<WR / 8>(dpt, st, Dc, c);
        pack_all<WR / 8>(dsa, dpt);
        tz_wgmma::fence();
        product_mn<DP>(dka, dsa, Qc); /* dk += ds^T q, beside the next chunk's s^T */
        tz_wgmma::commit();
      }
    }
    tz_wgmma::wait<0>();
  } else {
    for (int it = 0; it < n_it; it++) {
      const int buf = it & 1;
      next_step(it, n_it, [&] { load_chunk(it + 1, buf ^ 1); });
      const int i0 = k0 + (it % n_chunks) * WR;
      if (mine && !(wg > 0 && it % n_chunks == 0)) {
        const uint8_t *Qc = sQ + buf * TILE, *dOc = sdO + buf * TILE;
        const float *Lc = sL + buf * WR, *Dc = sD + buf * WR;

        float st[WR / 8][4], dpt[WR / 8][4];
        tz_wgmma::fence();
        product_k<DP>(flat(st), Kw, Qc);
        product_k<DP>(flat(dpt), Vw, dOc);
        tz_wgmma::commit();
        tz_wgmma::wait<0>();

        /* the diagonal chunk, one past T, or one hiding keys before its queries' first */
        if (i0 < k0 + (wg + 1) * WR || i0 + WR > T_ ||
            (firsts && tz_first_key(pos, b, T_, i0 + WR - 1, W_) > k0 + wg * WR))
          kv_probs<WR / 8, CAP>(st, dpt, Lc, Dc, i0, key_lo, key_hi, T_, scale_log2, c, true,
                                firsts ? pos : nullptr, b, W_, cap_in, cap_log2, approx);
        else
          kv_probs<WR / 8, CAP>(st, dpt, Lc, Dc, i0, key_lo, key_hi, T_, scale_log2, c, false,
                                nullptr, b, 0, cap_in, cap_log2, approx);

        /* dv += p^T dout, dk += ds^T q */
        uint32_t pa[WR / 16][4], dsa[WR / 16][4];
        pack_all<WR / 8>(pa, st);
        pack_all<WR / 8>(dsa, dpt);
        tz_wgmma::fence();
        product_mn<DP>(dva, pa, dOc);
        product_mn<DP>(dka, dsa, Qc);
        tz_wgmma::commit();
        tz_wgmma::wait<0>();
      }
      __syncthreads();
    }
  }

  __nv_bfloat16 *dkb = dk + (size_t)b * T_ * ks + (size_t)hk * D;
  __nv_bfloat16 *dvb = dv + (size_t)b * T_ * ks + (size_t)hk * D;
  if (mine)
    kv_store<__nv_bfloat16, width<DP, PAD>>(dkb, dvb, dka, dva, ks, key_lo, key_hi, T_, D, scale,
                                            c);
#else
  (void)dk, (void)dv, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)T_;
  (void)H, (void)Hkv, (void)D, (void)scale, (void)scale_log2, (void)pos, (void)var;
  __trap();
#endif
}

/* The blocks' warpgroups, as measured at Llama-7B's layer on the H200 (docs/cuda-kernels.md,
 * "Two warpgroups a block"): one each, two blocks an SM; the forward's scores with Q from
 * registers, dq's with Q and dO from shared memory (in registers dq needs 249 and ran 5%
 * slower). Two warpgroups sharing the streamed tiles halve the L2 reads but tie both to one
 * barrier a tile, so their softmax and products no longer interleave: forward +5%, dk/dv +14%. */
constexpr int FWD_NWG = 1, DQ_NWG = 1, KV_NWG = 1;

template <int NWG, bool AREG, int DP, bool PAD, int VAR>
int launch_fwd(struct tz_cuda *c, void *out, float *lse, const void *q, const void *k,
               const void *v, int B, int T, int H, int Hkv, int D, const int32_t *pos,
               const tz_attn_var &var) {
  const size_t sm = fwd_smem<DP>(NWG);
  if (sm > c->smem_optin)
    return 1;
  const void *kernel = (const void *)attn_fwd_wgmma_kernel<NWG, AREG, DP, PAD, VAR>;
  TZ_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
  dim3 grid((unsigned)((T + NWG * WR - 1) / (NWG * WR)), (unsigned)H, (unsigned)B);
  float scale_log2 = var.scale * LOG2E;
  attn_fwd_wgmma_kernel<NWG, AREG, DP, PAD, VAR><<<grid, 128 * NWG, sm, c->stream>>>(
      (__nv_bfloat16 *)out, lse, (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k,
      (const __nv_bfloat16 *)v, T, H, Hkv, D, scale_log2, pos, var);
  TZ_CU_LAUNCHED();
  return 0;
}

typedef __nv_bfloat16 E;

#if TZ_ATTN_FWD_PP
int launch_fwd_pp(struct tz_cuda *c, void *out, float *lse, const void *q, const void *k,
                  const void *v, int B, int T, int H, int Hkv, const tz_attn_var &var) {
  const size_t sm = pp_smem(2);
  if (sm > c->smem_optin)
    return 1;
  TZ_CU(cudaFuncSetAttribute((const void *)attn_fwd_pp_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
  dim3 grid((unsigned)((T + 2 * WR - 1) / (2 * WR)), (unsigned)H, (unsigned)B);
  attn_fwd_pp_kernel<<<grid, 384, sm, c->stream>>>((E *)out, lse, (const E *)q, (const E *)k,
                                                   (const E *)v, T, H, Hkv, var.scale * LOG2E);
  TZ_CU_LAUNCHED();
  return 0;
}
#endif

#if TZ_ATTN_DQ_PP
int launch_dq_pp(struct tz_cuda *c, void *dq, const float *delta, const void *dout, const void *q,
                 const void *k, const void *v, const float *lse, int B, int T, int H, int Hkv,
                 const tz_attn_var &var) {
  const size_t sm = pp_smem(4);
  if (sm > c->smem_optin)
    return 1;
  TZ_CU(cudaFuncSetAttribute((const void *)attn_bwd_dq_pp_kernel,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
  dim3 grid((unsigned)((T + 2 * WR - 1) / (2 * WR)), (unsigned)H, (unsigned)B);
  attn_bwd_dq_pp_kernel<<<grid, 384, sm, c->stream>>>((E *)dq, (const E *)dout, (const E *)q,
                                                      (const E *)k, (const E *)v, lse, delta, T, H,
                                                      Hkv, var.scale, var.scale * LOG2E);
  TZ_CU_LAUNCHED();
  return 0;
}
#endif

template <int NWG, bool AREG, int DP, bool PAD, int VAR>
int launch_dq(struct tz_cuda *c, void *dq, const float *delta, const void *dout, const void *q,
              const void *k, const void *v, const float *lse, int B, int T, int H, int Hkv, int D,
              const int32_t *pos, const tz_attn_var &var) {
  const size_t sm = dq_smem<DP>(NWG);
  if (sm > c->smem_optin)
    return 1;
  const void *kernel = (const void *)attn_bwd_dq_wgmma_kernel<NWG, AREG, DP, PAD, VAR>;
  TZ_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
  dim3 grid((unsigned)((T + NWG * WR - 1) / (NWG * WR)), (unsigned)H, (unsigned)B);
  attn_bwd_dq_wgmma_kernel<NWG, AREG, DP, PAD, VAR><<<grid, 128 * NWG, sm, c->stream>>>(
      (E *)dq, (const E *)dout, (const E *)q, (const E *)k, (const E *)v, lse, delta, T, H, Hkv, D,
      var.scale, var.scale * LOG2E, pos, var);
  TZ_CU_LAUNCHED();
  return 0;
}

template <int NWG, int DP, bool PAD, int VAR>
int launch_kv(struct tz_cuda *c, void *dk, void *dv, const float *delta, const void *dout,
              const void *q, const void *k, const void *v, const float *lse, int B, int T, int H,
              int Hkv, int D, const int32_t *pos, const tz_attn_var &var) {
  const size_t sm = kv_smem<DP>(NWG);
  if (sm > c->smem_optin)
    return 1;
  const void *kernel = (const void *)attn_bwd_dkdv_wgmma_kernel<NWG, DP, PAD, VAR>;
  TZ_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm));
  dim3 grid((unsigned)((T + NWG * WR - 1) / (NWG * WR)), (unsigned)Hkv, (unsigned)B);
  attn_bwd_dkdv_wgmma_kernel<NWG, DP, PAD, VAR><<<grid, 128 * NWG, sm, c->stream>>>(
      (E *)dk, (E *)dv, (const E *)dout, (const E *)q, (const E *)k, (const E *)v, lse, delta, T, H,
      Hkv, D, var.scale, var.scale * LOG2E, pos, var);
  TZ_CU_LAUNCHED();
  return 0;
}

template <int DP_, bool PAD_> struct tiles {
  static constexpr int DP = DP_;
  static constexpr bool PAD = PAD_;
};

/* Calls f with a tag of the call's kind (VAR, cap_of): the kernels built without packed documents
 * or variants are the causal ones, with no branch of the others' in them, and those with a
 * softcap are built for its tanh. */
template <int V> struct masked { static constexpr int VAR = V; };
template <typename F> int with_masks(const int32_t *pos, int D, const tz_attn_var &var, F f) {
  if (var.cap > 0.0f)
    return var.tanh_approx ? f(masked<3>{}) : f(masked<2>{});
  return pos || !tz_attn_var_default(var, D) ? f(masked<1>{}) : f(masked<0>{});
}

/* Calls f with the tiles for head dim D: 64 and 128 exactly, a multiple of 8 between them padded
 * to 128; 1 (declined) for any other. Which head dims run here is tz_cuda_attention_choose's
 * choice (auto keeps 128's). */
template <typename F> int with_tiles(int D, F f) {
  if (D == 128)
    return f(tiles<128, false>{});
  if (D % 8 != 0 || D < 64 || D > 128)
    return 1;
  if (D == 64)
    return f(tiles<64, false>{});
  return f(tiles<128, true>{});
}

} /* namespace */

int tz_cuda_attention_fwd_wgmma(struct tz_cuda *c, void *out, float *lse, const void *q,
                                const void *k, const void *v, int B, int T, int H, int Hkv, int D,
                                const int32_t *pos, const tz_attn_var &var) {
  if (c->S != TZ_BF16 || !c->sm90 || !tz_cuda_aligned16(out) || !tz_cuda_aligned16(q) ||
      !tz_cuda_aligned16(k) || !tz_cuda_aligned16(v))
    return 1;
  return with_tiles(D, [&](auto t) {
    using W = decltype(t);
    return with_masks(pos, D, var, [&](auto m) {
      using M = decltype(m);
#if TZ_ATTN_FWD_PP
      if constexpr (M::VAR == 0 && W::DP == 128 && !W::PAD)
        return launch_fwd_pp(c, out, lse, q, k, v, B, T, H, Hkv, var);
#endif
      return launch_fwd<FWD_NWG, true, W::DP, W::PAD, M::VAR>(c, out, lse, q, k, v, B, T, H, Hkv, D,
                                                              pos, var);
    });
  });
}

int tz_cuda_attention_bwd_wgmma(struct tz_cuda *c, void *dq, void *dk, void *dv, const float *delta,
                                const void *dout, const void *q, const void *k, const void *v,
                                const float *lse, int B, int T, int H, int Hkv, int D,
                                const int32_t *pos, const tz_attn_var &var) {
  const void *ts[] = {dq, dk, dv, dout, q, k, v};
  for (const void *t : ts)
    if (!tz_cuda_aligned16(t))
      return 1;
  if (c->S != TZ_BF16 || !c->sm90)
    return 1;
  return with_tiles(D, [&](auto t) {
    using W = decltype(t);
    return with_masks(pos, D, var, [&](auto m) {
      using M = decltype(m);
      int rc;
#if TZ_ATTN_DQ_PP
      if constexpr (M::VAR == 0 && W::DP == 128 && !W::PAD)
        rc = launch_dq_pp(c, dq, delta, dout, q, k, v, lse, B, T, H, Hkv, var);
      else
#endif
        rc = launch_dq<DQ_NWG, false, W::DP, W::PAD, M::VAR>(c, dq, delta, dout, q, k, v, lse, B, T,
                                                             H, Hkv, D, pos, var);
      if (rc)
        return rc;
      return launch_kv<KV_NWG, W::DP, W::PAD, M::VAR>(c, dk, dv, delta, dout, q, k, v, lse, B, T, H,
                                                      Hkv, D, pos, var);
    });
  });
}
