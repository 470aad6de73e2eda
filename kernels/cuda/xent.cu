/* Cross-entropy fused with the softmax, one block per row. The first pass walks the vocabulary
 * once, each thread keeping an online (max, sum of exp) over its strided elements; the pairs are
 * combined by a fixed butterfly (the combine is symmetric, so every lane gets the same bits).
 * The second pass writes (softmax - onehot) * dscale over the row in place if asked. The logits
 * are read in chunks of the block's width and never staged whole. With a softcap (compute.h),
 * each logit l is z = cap * tanh(l / cap) (tz_softcap) wherever it is read, and the gradient is
 * multiplied by dz/dl = 1 - (z / cap)^2 after dscale, the cpu backend's order; cap 0 reads l
 * itself and multiplies by nothing. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define THREADS 512

struct ms {
  float m; /* running max */
  float s; /* sum of exp(x - m) */
};

__device__ __forceinline__ struct ms ms_combine(struct ms a, struct ms b) {
  struct ms r;
  r.m = fmaxf(a.m, b.m);
  /* An empty side (m = -inf, s = 0) adds nothing, and -inf - -inf never reaches expf. */
  float ea = a.m == -INFINITY ? 0.0f : __fmul_rn(a.s, expf(__fsub_rn(a.m, r.m)));
  float eb = b.m == -INFINITY ? 0.0f : __fmul_rn(b.s, expf(__fsub_rn(b.m, r.m)));
  r.s = __fadd_rn(ea, eb);
  return r;
}

__device__ __forceinline__ struct ms ms_shfl_xor(struct ms a, int lanes) {
  struct ms r;
  r.m = __shfl_xor_sync(0xffffffffu, a.m, lanes);
  r.s = __shfl_xor_sync(0xffffffffu, a.s, lanes);
  return r;
}

template <typename T>
__global__ void xent_kernel(float *losses, T *dlogits, const T *logits, const int32_t *targets,
                            int V, float dscale, float cap, int *err) {
  __shared__ struct ms sh[32];
  int n = blockIdx.x;
  size_t row = (size_t)n * V;
  int tgt = targets[n];
  if (tgt == TZ_TARGET_IGNORE) { /* not a target: no loss, no gradient */
    if (threadIdx.x == 0)
      losses[n] = 0.0f;
    if (dlogits)
      for (int j = threadIdx.x; j < V; j += blockDim.x)
        dlogits[row + j] = tz_st<T>(0.0f);
    return;
  }
  if (tgt < 0 || tgt >= V) {
    if (threadIdx.x == 0)
      tz_cuda_report(err, TZ_CUDA_BAD_TARGET, n, tgt, V);
    return; /* the whole block leaves */
  }
  /* Read before any thread can overwrite it in place. */
  float x_tgt = tz_softcap(tz_ld(logits[row + tgt]), cap);
  struct ms acc = {-INFINITY, 0.0f};
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float x = tz_softcap(tz_ld(logits[row + j]), cap);
    if (x > acc.m) {
      acc.s =
          acc.m == -INFINITY ? 1.0f : __fadd_rn(__fmul_rn(acc.s, expf(__fsub_rn(acc.m, x))), 1.0f);
      acc.m = x;
    } else {
      acc.s = __fadd_rn(acc.s, expf(__fsub_rn(x, acc.m)));
    }
  }
  for (int s = 16; s >= 1; s >>= 1)
    acc = ms_combine(acc, ms_shfl_xor(acc, s));
  unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, n_warps = blockDim.x >> 5;
  if (lane == 0)
    sh[warp] = acc;
  __syncthreads(); /* also: every thread has finished reading the row before anyone writes */
  struct ms t = {-INFINITY, 0.0f};
  if (lane < n_warps)
    t = sh[lane];
  for (int s = 16; s >= 1; s >>= 1)
    t = ms_combine(t, ms_shfl_xor(t, s));
  float lse = __fadd_rn(t.m, logf(t.s));
  if (threadIdx.x == 0)
    losses[n] = __fsub_rn(lse, x_tgt);
  if (!dlogits)
    return;
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    float z = tz_softcap(tz_ld(logits[row + j]), cap);
    float p = expf(__fsub_rn(z, lse));
    float d = __fmul_rn(j == tgt ? __fsub_rn(p, 1.0f) : p, dscale);
    if (cap > 0.0f) {
      float th = __fdiv_rn(z, cap);
      d = __fmul_rn(d, __fsub_rn(1.0f, __fmul_rn(th, th)));
    }
    dlogits[row + j] = tz_st<T>(d);
  }
}

int tz_cuda_xent(void *ctx, float *losses, void *dlogits, const void *logits,
                 const int32_t *targets, int N, int V, float dscale, float softcap) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    xent_kernel<T><<<(unsigned)N, THREADS, 0, c->stream>>>(losses, (T *)dlogits, (const T *)logits,
                                                           targets, V, dscale, softcap, c->err_dev);
    TZ_CU_LAUNCHED();
    return 0;
  });
}
