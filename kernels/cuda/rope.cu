/* RoPE in place, half-split convention (compute.h). The (T, D/2) table of cos and sin is computed
 * on the device in double from the front end's frequencies, as the cpu backend does on the host,
 * rounded to float, and kept in the instance until a call with another (T, D, frequencies)
 * replaces it; the table does not depend on the
 * direction, which only flips the sign of sin. */
#include <string.h>

#include "kernels/cuda/common.cuh"

#define THREADS 256

__global__ void rope_table_kernel(float2 *cs, int T, int D, const double *f) {
  int half = D / 2;
  size_t total = (size_t)T * half;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    int t = (int)(e / (size_t)half), i = (int)(e % (size_t)half);
    double ang = (double)t * f[i];
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

static int rope_table(struct tz_cuda *c, int T, int D, const double *f) {
  size_t fbytes = (size_t)(D / 2) * sizeof(double);
  if (c->rope_cs && c->rope_T == T && c->rope_D == D && memcmp(c->rope_f, f, fbytes) == 0)
    return 0;
  if (!c->rope_f_dev)
    TZ_CU(cudaMalloc((void **)&c->rope_f_dev, sizeof c->rope_f));
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
  /* Kernels already queued with the old table run before this one on the stream; the host copy
   * the frequencies come from stays put until the next table, which is queued after this one. */
  c->rope_T = 0; /* marked valid only once the launch is known to be accepted */
  memcpy(c->rope_f, f, fbytes);
  TZ_CU(cudaMemcpyAsync(c->rope_f_dev, c->rope_f, fbytes, cudaMemcpyHostToDevice, c->stream));
  rope_table_kernel<<<tz_cuda_grid(c, entries, THREADS), THREADS, 0, c->stream>>>(c->rope_cs, T, D,
                                                                                  c->rope_f_dev);
  TZ_CU_LAUNCHED();
  c->rope_T = T;
  c->rope_D = D;
  return 0;
}

int tz_cuda_rope(void *ctx, void *x, int B, int T, int nh, int D, const double *inv_freq,
                 int inverse) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CHECK(rope_table(c, T, D, inv_freq));
  size_t total = (size_t)B * T * nh * (D / 2);
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using TT = decltype(tag);
    rope_apply_kernel<TT><<<tz_cuda_grid(c, total, THREADS), THREADS, 0, c->stream>>>(
        (TT *)x, c->rope_cs, T, nh, D, inverse, total);
    TZ_CU_LAUNCHED();
    return 0;
  });
}
