/* RoPE in place, half-split convention (compute.h). The (T, D/2) table of cos and sin is computed
 * on the device in double, as the cpu backend does on the host, rounded to float, and kept in the
 * instance until a call with another (T, D, theta) replaces it; the table does not depend on the
 * direction, which only flips the sign of sin. */
#include "kernels/cuda/common.cuh"

#define THREADS 256

__global__ void rope_table_kernel(float2 *cs, int T, int D, float theta) {
  int half = D / 2;
  size_t total = (size_t)T * half;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    int t = (int)(e / (size_t)half), i = (int)(e % (size_t)half);
    double ang = (double)t * pow((double)theta, -2.0 * i / (double)D);
    cs[e] = make_float2((float)cos(ang), (float)sin(ang));
  }
}

template <typename T>
__global__ void rope_apply_kernel(T *x, const float2 *cs, int T_, int nh, int D, int inverse,
                                  size_t total) {
  int half = D / 2;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    /* e enumerates (b, t, h, i) with i fastest */
    int i = (int)(e % (size_t)half);
    size_t bth = e / (size_t)half;
    int t = (int)((bth / (size_t)nh) % (size_t)T_);
    T *v = x + bth * (size_t)D;
    float2 c = cs[(size_t)t * half + i];
    float co = c.x, si = inverse ? -c.y : c.y;
    float x1 = tz_ld(v[i]), x2 = tz_ld(v[i + half]);
    v[i] = tz_st<T>(__fsub_rn(__fmul_rn(x1, co), __fmul_rn(x2, si)));
    v[i + half] = tz_st<T>(__fadd_rn(__fmul_rn(x2, co), __fmul_rn(x1, si)));
  }
}

static int rope_table(struct tz_cuda *c, int T, int D, float theta) {
  if (c->rope_cs && c->rope_T == T && c->rope_D == D && c->rope_theta == theta)
    return 0;
  size_t entries = (size_t)T * (D / 2);
  if (entries > c->rope_cap) {
    if (c->rope_cs) {
      /* cudaFree waits for the device, so no queued kernel still reads the old table. */
      TZ_CU(cudaFree(c->rope_cs));
      c->rope_cs = NULL;
      c->rope_cap = 0;
    }
    TZ_CU(cudaMalloc((void **)&c->rope_cs, entries * sizeof(float2)));
    c->rope_cap = entries;
  }
  /* Kernels already queued with the old table run before this one on the stream. */
  rope_table_kernel<<<tz_cuda_grid(c, entries, THREADS), THREADS, 0, c->stream>>>(c->rope_cs, T, D,
                                                                                  theta);
  c->rope_T = 0; /* marked valid only once the launch is known to be accepted */
  TZ_CU_LAUNCHED();
  c->rope_T = T;
  c->rope_D = D;
  c->rope_theta = theta;
  return 0;
}

int tz_cuda_rope(void *ctx, void *x, int B, int T, int nh, int D, float theta, int inverse) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CHECK(rope_table(c, T, D, theta));
  size_t total = (size_t)B * T * nh * (D / 2);
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using TT = decltype(tag);
    rope_apply_kernel<TT><<<tz_cuda_grid(c, total, THREADS), THREADS, 0, c->stream>>>(
        (TT *)x, c->rope_cs, T, nh, D, inverse, total);
    TZ_CU_LAUNCHED();
    return 0;
  });
}
