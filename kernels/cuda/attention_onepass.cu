/* Attention backward in one pass on tensor cores, deterministic (bf16 and fp16 storage, the head
 * dims and widths of attention_mma.cu).
 *
 * The two-pass backward (attention_mma.cu) computes dq in a pass of its own over the query tiles,
 * recomputing the scores and dout v^T there: 7 tile products. This one computes dq in the key
 * tiles' pass beside dk and dv, with the 5 products of flash attention: for each query chunk a key
 * tile's block already has dS^T = p^T (dp^T - delta) in registers (it needs it for dk), writes it
 * to shared memory, and multiplies dS by its key tile into the chunk's share of dq, a (BM, DP)
 * float tile. The shares of every key tile must be summed, and flash attention adds them with
 * floating-point atomics, in whatever order the blocks arrive. Here they are summed in one order,
 * always, from the chunk's diagonal key tile down to key tile 0:
 *
 *   - a float accumulator per (batch, head) of (query chunks x BM, DP) in the instance's scratch,
 *     and a counter per (batch, head, chunk), zeroed before the launch;
 *   - the chunk's diagonal key tile (the one holding its last row, or the sequence's last key)
 *     stores its share; key tile kt below it waits until the counter reads the number of tiles
 *     above it (they have added theirs), adds its share with reductions to L2 (`red.add`, each
 *     element receiving one addition at a time, in that order), and releases the next; key tile
 *     0 adds its share to the sum it reads, scales by 1 / sqrt(D) and writes dq in the storage
 *     dtype instead.
 *
 * A block only waits for the block of the same heads and batch with the next key tile. Blocks
 * take their (key tile, heads, batch) from a ticket drawn when they start (heads: a kv head's
 * group, or with grouped kv heads one query head, launch's kv_split), the last key tile first,
 * so the block waited for has always started, and the waits end whatever order the
 * hardware starts blocks in. Each block visits its query chunks from its diagonal to the last:
 * block kt + 1 reaches each chunk BN / BM chunks (of every head of the group) before block kt
 * does, so the addition block kt waits for is in general long done, and no block waits at its
 * start for a chain of others (in the order 0 first, every block met the sequence's last chunk at
 * once and the key tiles' additions went one after the other, 32 of them at T = 2048, 128 at
 * 8192). Every sum has a fixed order, so the result is the same bits every run, and a different
 * (but as accurate) rounding from the two-pass kernels'.
 *
 * Tiles: a block has WARPS warps of 16 key rows (BN = 16 WARPS keys) and visits query chunks of
 * BM rows (32 or 64), Q and dout double-buffered with cp.async as in attention_mma.cu. The dq
 * share's 16x16 units go to the warps by m-tile, so each warp loads a dS fragment once for all its
 * units. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ptx.cuh"

namespace {

using namespace tz_ptx;
using namespace tz_attn;

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(unsigned *p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
/* p[0] += x0, p[1] += x1 in L2, without waiting for the result. The counters let one addition
 * at a time reach an element, in a fixed order, so the sum's bits are fixed (each add rounds to
 * nearest; subnormal sums, below 1.2e-38, flush to zero). */
__device__ __forceinline__ void red_add(float2 *p, float x0, float x1) {
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x0), "f"(x1)
               : "memory");
}

/* A block's shape: WARPS warps of 16 key rows, query chunks of BM, width W. */
template <typename W, int WARPS_, int BM_> struct bwd_tiles {
  static constexpr int WARPS = WARPS_, BM = BM_, BN = 16 * WARPS_, NT = 32 * WARPS_;
  static constexpr int PS = BM_ + 8; /* dS^T's pitch: 16-byte rows, PS / 8 odd (see width) */
  static constexpr size_t smem =
      (size_t)(2 * BN + 4 * BM) * W::P * 2 + (size_t)BN * PS * 2 + 4 * BM * sizeof(float);
  static_assert(BM_ == 32 || BM_ == 64, "query chunk");
  static_assert(BN % BM_ == 0, "a key tile starts a query chunk");
};

template <typename T, typename W, typename C, bool SPLIT>
__global__ void __launch_bounds__(C::NT)
    attn_bwd_onepass_kernel(T *dq, T *dk, T *dv, float *dq_acc, unsigned *counts, unsigned *tickets,
                            const T *dout, const T *q, const T *k, const T *v, const float *lse,
                            const float *delta, int T_, int H, int Hkv, int D_, float scale,
                            float scale_log2) {
  constexpr int P = W::P, DP = W::DP, BN = C::BN, BM = C::BM, NT = C::NT, PS = C::PS;
  constexpr int WARPS = C::WARPS;
  const int D = W::PAD ? D_ : DP;
  constexpr int ND = DP / 8, NS = BM / 8;
  /* The dq share in 16x16 units (m-tile, pair of n-tiles): WPM warps to each of the chunk's
   * MTS m-tiles, each taking NPW of its NPD pairs, so a warp loads each dS fragment once for all
   * its units. */
  constexpr int NPD = DP / 16, MTS = BM / 16, WPM = WARPS / MTS, NPW = (NPD + WPM - 1) / WPM;
  static_assert(WARPS % MTS == 0, "whole m-tiles per warp group");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sK = (T *)smem_raw;               /* (BN, P) */
  T *sV = sK + BN * P;                 /* (BN, P) */
  T *sQ = sV + BN * P;                 /* 2 x (BM, P) */
  T *sdO = sQ + 2 * BM * P;            /* 2 x (BM, P) */
  T *sS = sdO + 2 * BM * P;            /* (BN, PS): dS^T of the chunk, keys by queries */
  float *sL = (float *)(sS + BN * PS); /* 2 x (BM): lse * log2(e), 0 past T */
  float *sD = sL + 2 * BM;             /* 2 x (BM): delta, 0 past T */
  /* The block's (key tile, heads, batch) comes from a ticket taken when it starts, the key tiles
   * from the last, then heads, then batches: a block waits only for the block with the next key
   * tile and the same heads, whose ticket is smaller, which has started, so the waits end whatever
   * order the hardware starts blocks in. Its heads: a kv head's whole group of query heads, or
   * with SPLIT one query head (launch's kv_split), its share of dk and dv then going to kv_part. */
  __shared__ unsigned ticket;
  if (threadIdx.x == 0)
    ticket = atomicAdd(tickets, 1u);
  __syncthreads();
  const int kt = (int)(gridDim.x - 1 - ticket % gridDim.x);
  const int hs = (int)(ticket / gridDim.x % gridDim.y);
  const int b = (int)(ticket / gridDim.x / gridDim.y);
  const int group = H / Hkv;
  const int hk = SPLIT ? hs / group : hs;
  const int k0 = kt * BN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const T *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const T *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  const int key_lo = k0 + warp * 16 + g, key_hi = key_lo + 8;
  const int n_qc = (T_ + BM - 1) / BM; /* query chunks of a head */
  const int ci0 = k0 / BM;             /* this block's first chunk: the one starting at k0 */
  const int n_chunks = n_qc - ci0;
  const int n_it = SPLIT ? n_chunks : group * n_chunks;
  /* Iteration `it`: chunk ci0 + it / group of head hk * group + it % group (with SPLIT: chunk
   * ci0 + it of head hs); block kt + 1 visits the same (head, chunk) group * BN / BM (BN / BM)
   * iterations earlier. */
  auto head_of = [&](int it) { return SPLIT ? hs : hk * group + it % group; };
  auto chunk_of = [&](int it) { return ci0 + (SPLIT ? it : it / group); };
  auto load_chunk = [&](int it, int buf) {
    int h = head_of(it);
    int i0 = chunk_of(it) * BM;
    kv_load_chunk<BM, W, NT>(sQ, sdO, sL, sD, q, dout, lse, delta, b, h, H, T_, D, i0, buf);
  };

  /* The chunk's last row's key tile: the first in its dq sum. */
  auto diagonal = [&](int i0) { return (i0 + BM - 1 < T_ - 1 ? i0 + BM - 1 : T_ - 1) / BN; };
  /* Iteration it's addition to dq, made visible and the next key tile let on: every thread's
   * additions before a barrier, then thread 0's fence and release (as cooperative groups' grid
   * barrier orders them). Iteration it + 1 calls it after its scores, a barrier and a tile's
   * products after the additions were issued, so that the fence finds them done; the key tile
   * waiting for it reaches that chunk BN / BM chunks later. */
  auto release = [&](int it) {
    if (kt == 0 || threadIdx.x != 0)
      return; /* key tile 0 writes dq and lets no one on */
    const int h = head_of(it), ci = chunk_of(it);
    __threadfence();
    st_release(counts + ((size_t)b * H + h) * n_qc + ci, (unsigned)(diagonal(ci * BM) - kt) + 1);
  };

  load_tile<BN, W, NT>(sK, kb, ks, k0, T_ - k0, D);
  load_tile<BN, W, NT>(sV, vb, ks, k0, T_ - k0, D);
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
    const int h = head_of(it), ci = chunk_of(it), i0 = ci * BM;
    const T *Qc = sQ + buf * BM * P, *dOc = sdO + buf * BM * P;
    const float *Lc = sL + buf * BM, *Dc = sD + buf * BM;

    float st[NS][4], dpt[NS][4];
    kv_scores<T, W, NS>(st, dpt, sK, sV, Qc, dOc, warp, lane);
    kv_probs<NS>(st, dpt, Lc, Dc, i0, key_lo, key_hi, T_, scale_log2, c);
    if (it > 0)
      release(it - 1);

      /* ds^T into shared memory for dq, rounded as the dk product's operand is */
#pragma unroll
    for (int nt = 0; nt < NS; nt++) {
      int row = warp * 16 + g, col = nt * 8 + 2 * c;
      *reinterpret_cast<uint32_t *>(sS + row * PS + col) = mma16<T>::pack(dpt[nt][0], dpt[nt][1]);
      *reinterpret_cast<uint32_t *>(sS + (row + 8) * PS + col) =
          mma16<T>::pack(dpt[nt][2], dpt[nt][3]);
    }

    kv_accumulate<T, W, NS>(dka, dva, st, dpt, Qc, dOc, lane);
    __syncthreads(); /* dS^T complete */

    /* this key tile's share of the chunk's dq: ds (BM, BN) k (BN, DP), units (mt, np0 + u) */
    const int mt = warp / WPM, np0 = (warp % WPM) * NPW;
    float qa[NPW][2][4];
#pragma unroll
    for (int u = 0; u < NPW; u++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        qa[u][0][e] = qa[u][1][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      uint32_t a[4];
      load_a_kmajor<PS>(a, sS, kk * 16, mt * 16, lane);
#pragma unroll
      for (int u = 0; u < NPW; u++) {
        if (NPD % WPM != 0 && np0 + u >= NPD)
          continue;
        uint32_t bf[4];
        load_b_kmajor<P>(bf, sK, kk * 16, (np0 + u) * 16, lane);
        mma16<T>::mma(qa[u][0], a, bf[0], bf[1]);
        mma16<T>::mma(qa[u][1], a, bf[2], bf[3]);
      }
    }

    /* Add it to the chunk's sum after the key tiles above it, from the diagonal one (`last`) down;
     * key tile 0 writes dq. */
    const unsigned pos = (unsigned)(diagonal(i0) - kt); /* key tiles before this one */
    unsigned *count = counts + ((size_t)b * H + h) * n_qc + ci;
    if (pos > 0) {
      if (threadIdx.x == 0)
        while (ld_acquire(count) != pos)
          __nanosleep(32);
      __syncthreads();
    }
    float *acc = dq_acc + ((size_t)b * H + h) * (size_t)n_qc * BM * DP;
    T *dqb = dq + (size_t)b * T_ * qs + (size_t)h * D;
#pragma unroll
    for (int u = 0; u < NPW; u++) {
      const int np = np0 + u;
      if (NPD % WPM != 0 && np >= NPD)
        continue;
#pragma unroll
      for (int half = 0; half < 2; half++) {
        const int col = np * 16 + half * 8 + 2 * c;
#pragma unroll
        for (int r = 0; r < 2; r++) {
          const int row = i0 + mt * 16 + g + 8 * r;
          float x0 = qa[u][half][2 * r], x1 = qa[u][half][2 * r + 1];
          float2 *pa = (float2 *)(acc + (size_t)row * DP + col);
          if (kt > 0) {
            if (pos == 0)
              __stcg(pa, make_float2(x0, x1));
            else
              red_add(pa, x0, x1);
          } else {
            if (pos > 0) {
              float2 prev = __ldcg(pa);
              x0 = __fadd_rn(prev.x, x0);
              x1 = __fadd_rn(prev.y, x1);
            }
            if (row < T_ && (!W::PAD || col < D))
              store_pair(dqb + (size_t)row * qs + col, __fmul_rn(x0, scale), __fmul_rn(x1, scale));
          }
        }
      }
    }
    __syncthreads(); /* this chunk's buffers are refilled two chunks from now; sS next chunk */
  }
  release(n_it - 1); /* the last chunk's, after the loop's last barrier */

  if constexpr (!SPLIT) {
    T *dkb = dk + (size_t)b * T_ * ks + (size_t)hk * D;
    T *dvb = dv + (size_t)b * T_ * ks + (size_t)hk * D;
    kv_store<T, W>(dkb, dvb, dka, dva, ks, key_lo, key_hi, T_, D, scale, c);
  } else {
    /* This head's sums, unscaled, at (b, key, hk, its index in the group), in the scratch after
     * the dq sums: kv_sum_kernel adds the group's in order. */
    float *kv_part = dq_acc + (size_t)gridDim.z * H * n_qc * BM * DP;
    const size_t n_part = (size_t)gridDim.z * T_ * H * DP; /* floats of each of dk, dv */
#pragma unroll
    for (int dt = 0; dt < ND; dt++) {
      const int d = dt * 8 + 2 * c;
#pragma unroll
      for (int r = 0; r < 2; r++) {
        const int key = r ? key_hi : key_lo;
        if (key >= T_)
          continue;
        /* (b, key, hk, hs - hk * group) = (b, key, hs): the group's heads side by side */
        const size_t at = (((size_t)b * T_ + key) * H + hs) * DP + d;
        __stcg((float2 *)(kv_part + at), make_float2(dka[dt][2 * r], dka[dt][2 * r + 1]));
        __stcg((float2 *)(kv_part + n_part + at), make_float2(dva[dt][2 * r], dva[dt][2 * r + 1]));
      }
    }
  }
}

/* dk and dv of a split launch: for each (batch, key, kv head) and column pair, the parts' sums
 * added in part order (so fixed bits), dk scaled as kv_store scales it, stored in T. */
template <typename T, typename W>
__global__ void kv_sum_kernel(T *dk, T *dv, const float *kv_part, size_t rows, int split, int D,
                              float scale) {
  constexpr int DP = W::DP;
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * (DP / 2))
    return;
  const size_t row = i / (DP / 2);
  const int d = (int)(i % (DP / 2)) * 2;
  if (W::PAD && d >= D)
    return;
  const size_t n_part = rows * split * DP;
  const float *pk = kv_part + row * split * DP + d, *pv = pk + n_part;
  float2 sk = __ldcg((const float2 *)pk), sv = __ldcg((const float2 *)pv);
  for (int s = 1; s < split; s++) {
    float2 xk = __ldcg((const float2 *)(pk + (size_t)s * DP));
    float2 xv = __ldcg((const float2 *)(pv + (size_t)s * DP));
    sk.x = __fadd_rn(sk.x, xk.x);
    sk.y = __fadd_rn(sk.y, xk.y);
    sv.x = __fadd_rn(sv.x, xv.x);
    sv.y = __fadd_rn(sv.y, xv.y);
  }
  store_pair(dk + row * D + d, __fmul_rn(sk.x, scale), __fmul_rn(sk.y, scale));
  store_pair(dv + row * D + d, sv.x, sv.y);
}

/* ---- forward with 128 query rows a block: two 16-row tiles per warp ----
 * attention_mma.cu's forward with each warp owning rows warp * 16 and 64 + warp * 16 of its
 * block, so every K and V fragment a warp loads from shared memory feeds two products instead of
 * one (half the shared-memory reads a product), and each key tile loaded serves 128 rows. Q's
 * fragments are read from shared memory at each key tile instead of being kept in registers
 * (they would not fit beside two tiles' output). A warp skips the product for a row tile that
 * the key tile lies wholly after (the upper half of the last key tile for the first row tile):
 * that changes no bit, since such a tile would scale the running sums by exp2(0) = 1 and add 0.
 * Per element the same operations in the same order as attention_mma.cu's forward, so the same
 * bits. */

constexpr int F2_MT = 2, F2_BM = 64 * F2_MT, F2_BN = 64;

template <typename W> constexpr size_t fwd2_smem_bytes() {
  return (size_t)(F2_BM + 4 * F2_BN) * W::P * 2;
}

template <typename T, typename W>
__global__ void __launch_bounds__(128)
    attn_fwd_mma2_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int T_, int H,
                         int Hkv, int D_, float scale_log2) {
  constexpr int P = W::P, DP = W::DP, MT = F2_MT, BM = F2_BM, BN = F2_BN;
  const int D = W::PAD ? D_ : DP;
  constexpr int KD = DP / 16, ND = DP / 8, NS = BN / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T *sQ = (T *)smem_raw;                     /* (BM, P) */
  T *sK = sQ + BM * P;                       /* 2 x (BN, P) */
  T *sV = sK + 2 * BN * P;                   /* 2 x (BN, P) */
  const int qt = gridDim.x - 1 - blockIdx.x; /* the longest rows first */
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const int q0 = qt * BM;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const T *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
  const T *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const T *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  /* key tiles up to the block's last row, and none starting at or past T */
  const int last_row = q0 + BM - 1 < T_ - 1 ? q0 + BM - 1 : T_ - 1;
  const int n_kt = last_row / BN + 1;
  int row_lo[MT], row_hi[MT];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    row_lo[mt] = q0 + mt * 64 + warp * 16 + g;
    row_hi[mt] = row_lo[mt] + 8;
  }

  load_tile<BM, W>(sQ, qb, qs, q0, T_ - q0, D);
  load_tile<BN, W>(sK, kb, ks, 0, T_, D);
  load_tile<BN, W>(sV, vb, ks, 0, T_, D);
  cp_async_commit();

  float o[MT][ND][4];
  float m_lo[MT], m_hi[MT], l_lo[MT], l_hi[MT];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int i = 0; i < ND; i++)
      o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
    m_lo[mt] = m_hi[mt] = -INFINITY;
    l_lo[mt] = l_hi[mt] = 0.0f;
  }

  for (int kt = 0; kt < n_kt; kt++) {
    const int buf = kt & 1;
    if (kt + 1 < n_kt) {
      int r0 = (kt + 1) * BN;
      load_tile<BN, W>(sK + (buf ^ 1) * BN * P, kb, ks, r0, T_ - r0, D);
      load_tile<BN, W>(sV + (buf ^ 1) * BN * P, vb, ks, r0, T_ - r0, D);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T *Kt = sK + buf * BN * P, *Vt = sV + buf * BN * P;
    /* the row tiles this key tile reaches: its first key at or before the tile's last row */
    bool live[MT];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
      live[mt] = kt * BN <= q0 + mt * 64 + warp * 16 + 15;

    float s[MT][NS][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int i = 0; i < NS; i++)
        s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
        load_a<P>(qa[mt], sQ, mt * 64 + warp * 16, kk * 16, lane);
#pragma unroll
      for (int np = 0; np < NS / 2; np++) {
        uint32_t bf[4];
        load_b_nmajor<P>(bf, Kt, np * 16, kk * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          if (!live[mt])
            continue;
          mma16<T>::mma(s[mt][2 * np], qa[mt], bf[0], bf[1]);
          mma16<T>::mma(s[mt][2 * np + 1], qa[mt], bf[2], bf[3]);
        }
      }
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      if (!live[mt])
        continue;
      /* scores in the log2 domain; keys after the query hidden where the tile reaches them */
      const bool mask = (kt + 1) * BN - 1 > q0 + mt * 64 + warp * 16;
      softmax_step<NS, ND>(s[mt], o[mt], m_lo[mt], m_hi[mt], l_lo[mt], l_hi[mt], mask, kt * BN,
                           row_lo[mt], row_hi[mt], c, scale_log2);
    }

    /* o += p v, each V fragment serving both row tiles */
#pragma unroll
    for (int j = 0; j < BN / 16; j++) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
        pack_a<T, NS>(pa[mt], s[mt], j);
#pragma unroll
      for (int dp = 0; dp < DP / 16; dp++) {
        uint32_t bf[4];
        load_b_kmajor<P>(bf, Vt, j * 16, dp * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          if (!live[mt])
            continue;
          mma16<T>::mma(o[mt][2 * dp], pa[mt], bf[0], bf[1]);
          mma16<T>::mma(o[mt][2 * dp + 1], pa[mt], bf[2], bf[3]);
        }
      }
    }
    __syncthreads(); /* this buffer is refilled two tiles from now */
  }

#pragma unroll
  for (int mt = 0; mt < MT; mt++)
    fwd_store<T, W>(out, lse, o[mt], l_lo[mt], l_hi[mt], m_lo[mt], m_hi[mt], b, h, H, row_lo[mt],
                    row_hi[mt], T_, D, c);
}

template <typename E, typename W>
int launch_fwd2(struct tz_cuda *c, void *out, float *lse, const void *q, const void *k,
                const void *v, int B, int T, int H, int Hkv, int D) {
  constexpr size_t smem = fwd2_smem_bytes<W>();
  auto kern = attn_fwd_mma2_kernel<E, W>;
  if (smem > c->smem_optin)
    return 1;
  TZ_CU(cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem));
  dim3 grid((unsigned)((T + F2_BM - 1) / F2_BM), (unsigned)H, (unsigned)B);
  float scale_log2 = 1.0f / sqrtf((float)D) * LOG2E;
  kern<<<grid, 128, smem, c->stream>>>((E *)out, lse, (const E *)q, (const E *)k, (const E *)v, T,
                                       H, Hkv, D, scale_log2);
  TZ_CU_LAUNCHED();
  return 0;
}

/* ---- the one-pass backward's launch ---- */

/* The accumulator's and the counters' bytes for a shape and tile. */
template <typename W, typename C> void scratch_layout(int B, int T, int H, size_t *acc, size_t *n) {
  size_t n_qc = (size_t)((T + C::BM - 1) / C::BM);
  *acc = (size_t)B * H * n_qc * C::BM * W::DP * sizeof(float);
  *n = (size_t)B * H * n_qc;
}

/* Blocks a kv head's query heads are dealt to: one head a block where the group has more than one
 * (grouped-query heads), so that no block holds a group's worth of the longest key tile's work
 * (with the whole group in a block, key tile 0's blocks, which start last, set the kernel's end:
 * Qwen2-7B's 28 heads on 4, 5.11 ms against 3.35 for llama-7b's 32 on 32; a model of the blocks'
 * list schedule, docs/cuda-kernels.md, predicts the kernel 1.64x its ideal whole and 1.09x split).
 * Their shares of dk and dv are then summed in a kernel of their own, in a fixed order. */
static int kv_split(int H, int Hkv) { return H / Hkv; }

template <typename E, typename W, typename C>
int launch(struct tz_cuda *c, void *dq, void *dk, void *dv, const float *delta, const void *dout,
           const void *q, const void *k, const void *v, const float *lse, int B, int T, int H,
           int Hkv, int D) {
  const int split = kv_split(H, Hkv);
  auto kern =
      split > 1 ? attn_bwd_onepass_kernel<E, W, C, true> : attn_bwd_onepass_kernel<E, W, C, false>;
  if (C::smem > c->smem_optin)
    return 1; /* a device with less shared memory: the two-pass kernels */
  size_t acc_bytes, n_counts;
  scratch_layout<W, C>(B, T, H, &acc_bytes, &n_counts);
  const size_t rows = (size_t)B * T * Hkv; /* of dk and dv */
  /* the dq sums, the parts of dk and dv (split > 1), the counters and the ticket counter */
  const size_t part_bytes = split > 1 ? 2 * rows * split * W::DP * sizeof(float) : 0;
  void *scratch;
  const size_t need = acc_bytes + part_bytes + (n_counts + 1) * sizeof(unsigned);
  if (need > c->scratch_bytes) {
    /* Growing the scratch frees it first. Where even that leaves too little device memory (a
     * plan that took nearly all of it, a long sequence), the two-pass kernels, which need no
     * scratch, run instead of failing the step. */
    size_t free_b = 0, total_b = 0;
    TZ_CU(cudaMemGetInfo(&free_b, &total_b));
    if (tz_cuda_scratch_grown(c, need) > free_b + c->scratch_bytes)
      return 1;
  }
  TZ_CHECK(tz_cuda_scratch(c, need, &scratch));
  float *acc = (float *)scratch;
  float *part = (float *)((char *)scratch + acc_bytes); /* split > 1: as the kernel finds it */
  unsigned *counts = (unsigned *)((char *)scratch + acc_bytes + part_bytes);
  TZ_CU(cudaMemsetAsync(counts, 0, (n_counts + 1) * sizeof(unsigned), c->stream));
  TZ_CU(cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)C::smem));
  float scale = 1.0f / sqrtf((float)D);
  dim3 grid((unsigned)((T + C::BN - 1) / C::BN), (unsigned)(Hkv * split), (unsigned)B);
  kern<<<grid, C::NT, C::smem, c->stream>>>(
      (E *)dq, (E *)dk, (E *)dv, acc, counts, counts + n_counts, (const E *)dout, (const E *)q,
      (const E *)k, (const E *)v, lse, delta, T, H, Hkv, D, scale, scale * LOG2E);
  TZ_CU_LAUNCHED();
  if (split > 1) {
    const size_t n = rows * (W::DP / 2);
    kv_sum_kernel<E, W><<<(unsigned)((n + 255) / 256), 256, 0, c->stream>>>((E *)dk, (E *)dv, part,
                                                                            rows, split, D, scale);
    TZ_CU_LAUNCHED();
  }
  return 0;
}

/* The tiles by index (the setting attention_tiles, tz_cuda_tile_names in choice.h): 0, 4 warps (64
 * keys) and query chunks of 32, built for every shape, the one-pass mode's default; 1, 8 warps
 * (128 keys) and query chunks of 64, what auto runs (tz_cuda_attention_onepass_tiles, choice.c),
 * built for bf16 at the head dims where it was measured fastest (128 exact, 96 padded; to keep
 * the build small). 4x64 and 8x32 won at no shape measured (docs/cuda-kernels.md) and are gone. */
template <typename W> constexpr bool auto_tiles() {
  return (W::DP == 128 && !W::PAD) || (W::DP == 96 && W::PAD);
}

template <typename E, typename W>
int launch_tiles(struct tz_cuda *c, int which, void *dq, void *dk, void *dv, const float *delta,
                 const void *dout, const void *q, const void *k, const void *v, const float *lse,
                 int B, int T, int H, int Hkv, int D) {
  if constexpr (auto_tiles<W>() && std::is_same<E, __nv_bfloat16>::value) {
    if (which == 1)
      return launch<E, W, bwd_tiles<W, 8, 64>>(c, dq, dk, dv, delta, dout, q, k, v, lse, B, T, H,
                                               Hkv, D);
  }
  (void)which;
  return launch<E, W, bwd_tiles<W, 4, 32>>(c, dq, dk, dv, delta, dout, q, k, v, lse, B, T, H, Hkv,
                                           D);
}

} /* namespace */

int tz_cuda_attention_bwd_onepass(struct tz_cuda *c, int tiles, void *dq, void *dk, void *dv,
                                  const float *delta, const void *dout, const void *q,
                                  const void *k, const void *v, const float *lse, int B, int T,
                                  int H, int Hkv, int D) {
  const void *ts[] = {dq, dk, dv, dout, q, k, v};
  int route = tz_cuda_attention_mma_route(c, D, ts, 7);
  if (!route)
    return 1;
  return with_width(D, route == 2, [&](auto w) {
    using W = decltype(w);
    if (c->S == TZ_BF16)
      return launch_tiles<__nv_bfloat16, W>(c, tiles, dq, dk, dv, delta, dout, q, k, v, lse, B, T,
                                            H, Hkv, D);
    return launch_tiles<__half, W>(c, tiles, dq, dk, dv, delta, dout, q, k, v, lse, B, T, H, Hkv,
                                   D);
  });
}

int tz_cuda_attention_fwd_onepass(struct tz_cuda *c, void *out, float *lse, const void *q,
                                  const void *k, const void *v, int B, int T, int H, int Hkv,
                                  int D) {
  const void *ts[] = {out, q, k, v};
  int route = tz_cuda_attention_mma_route(c, D, ts, 4);
  if (!route)
    return 1;
  return with_width(D, route == 2, [&](auto w) {
    using W = decltype(w);
    if (c->S == TZ_BF16)
      return launch_fwd2<__nv_bfloat16, W>(c, out, lse, q, k, v, B, T, H, Hkv, D);
    return launch_fwd2<__half, W>(c, out, lse, q, k, v, B, T, H, Hkv, D);
  });
}
