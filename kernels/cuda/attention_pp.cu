/* Attention with a producer warpgroup and two consumer warpgroups taking turns (FlashAttention
 * 3's warp specialization and ping-pong), the causal forward and dq at head dim 128: built only
 * with TZ_ATTN_FWD_PP 1 or TZ_ATTN_DQ_PP 1 (CUDA flags), off until their GPU tests and A/B ran
 * (docs/cuda-kernels.md); attention_wgmma.cu calls them in place of its one-warpgroup kernels
 * for those calls. Built for sm_90a alone. */
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/wgmma.cuh"

#if TZ_ATTN_FWD_PP || TZ_ATTN_DQ_PP
namespace {

using namespace tz_attn;
using namespace tz_wgattn;

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
 * loads spilled 68 bytes, and dq's producer, loading Q and dO 128 rows a call, 188;
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
  /* a consumer's last product, acc += a b with b in the last tile kt's stage, then its release */
  __device__ __forceinline__ void last(float (&acc)[16][4], const uint32_t (&a)[4][4],
                                       const uint8_t *b, int kt, int lane) {
    tz_wgmma::fence();
    product_mn<128>(acc, a, b);
    tz_wgmma::commit();
    tz_wgmma::wait<0>();
    release(kt, lane);
  }
};

/* beside() with `between` called once the products are issued, before the wait (the turn passes
 * there), in the same branch as the issue: with the wait in a branch of its own ptxas serialized
 * the products (its note C7514). */
template <typename F, typename G>
__device__ __forceinline__ void beside_then(int kt, F issue, G between) {
  if (kt > 0) {
    issue();
    tz_wgmma::commit();
    between();
    tz_wgmma::wait<1>();
  } else {
    between();
    tz_wgmma::wait<0>();
  }
}

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

#if TZ_ATTN_FWD_PP
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
  const qblock<2> p(T_, B.wg - 1); /* consumer p.wg: rows 64 (2 i + p.wg).. */
  if (p.n_mine == 0)
    return; /* the second consumer of the last block of an odd count: no rows */
  const int c = p.wg, mt = p.mt, n_mine = p.n_mine, warp = p.warp, g = p.g, cq = p.c;
  const int row_lo = p.row_lo, row_hi = p.row_hi, lane = threadIdx.x & 31;
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
    /* o += p v of the tile before, beside; the turn passes once they are issued, not done */
    beside_then(
        kt, [&] { product_mn<DP>(o, pa, B.V(kt - 1)); }, [&] { turns.give(kt); });
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
  B.last(o, pa, B.V(n_mine - 1), n_mine - 1, lane);
  fwd_store<__nv_bfloat16, width<DP, false>>(out, lse, o, l_lo, l_hi, m_lo, m_hi, b, h, H, row_lo,
                                             row_hi, T_, D, cq);
#else
  (void)out, (void)lse, (void)q, (void)k, (void)v, (void)T_, (void)H, (void)Hkv, (void)scale_log2;
  __trap();
#endif
}
#endif

#if TZ_ATTN_DQ_PP
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
  const qblock<2> p(T_, B.wg - 1);
  if (p.n_mine == 0)
    return;
  const int c = p.wg, mt = p.mt, n_mine = p.n_mine, warp = p.warp, g = p.g, cq = p.c;
  const int row_lo = p.row_lo, row_hi = p.row_hi, lane = threadIdx.x & 31;
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
    beside_then(
        kt, [&] { product_mn<DP>(acc, dsa, B.K(kt - 1)); }, [&] { turns.give(kt); });
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
  B.last(acc, dsa, B.K(n_mine - 1), n_mine - 1, lane);
  q_store<__nv_bfloat16, width<DP, false>>(dq + (size_t)b * T_ * qs + (size_t)h * D, acc, qs,
                                           row_lo, row_hi, T_, D, scale, cq);
#else
  (void)dq, (void)dout, (void)q, (void)k, (void)v, (void)lse, (void)delta, (void)T_, (void)H;
  (void)Hkv, (void)scale, (void)scale_log2;
  __trap();
#endif
}
#endif

typedef __nv_bfloat16 E;

} /* namespace */

#if TZ_ATTN_FWD_PP
int tz_cuda_attention_fwd_pp(struct tz_cuda *c, void *out, float *lse, const void *q, const void *k,
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
int tz_cuda_attention_dq_pp(struct tz_cuda *c, void *dq, const float *delta, const void *dout,
                            const void *q, const void *k, const void *v, const float *lse, int B,
                            int T, int H, int Hkv, const tz_attn_var &var) {
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
#endif
