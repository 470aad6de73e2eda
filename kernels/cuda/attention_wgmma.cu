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
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/wgmma.cuh"

/* TZ_ATTN_KV_KIND 1: the dk/dv kernels that keep the loop without the pipeline (softcaps, head
 * dim 64, padded head dims) built for their call's kind (cap_of), so a softcap's score is the
 * forward's and dq's arithmetic; ptxas: 32 bytes of spill for the exact softcap, 72 for approx
 * at head dim 128. Off until its GPU tests and its A/B ran (docs/cuda-kernels.md). */
#ifndef TZ_ATTN_KV_KIND
#define TZ_ATTN_KV_KIND 0
#endif

namespace {

using namespace tz_attn;
using namespace tz_wgattn;

/* Q (a tile per warpgroup), two K buffers, three V, alignment slack */
template <int DP> constexpr size_t fwd_smem(int nwg) {
  return (size_t)(nwg + 5) * tile_bytes<DP>() + 1024;
}

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
        return tz_cuda_attention_fwd_pp(c, out, lse, q, k, v, B, T, H, Hkv, var);
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
        rc = tz_cuda_attention_dq_pp(c, dq, delta, dout, q, k, v, lse, B, T, H, Hkv, var);
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
