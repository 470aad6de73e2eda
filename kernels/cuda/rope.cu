/* RoPE in place, half-split convention (compute.h), over the first R of each head's D dims (R = D
 * but for partial rotary; the rest pass unchanged). The (T, R/2) table of cos and sin is computed
 * on the device in double from the front end's frequencies, as the cpu backend does on the host,
 * rounded to float, and kept in the instance until a call with another (T, R, frequencies)
 * replaces it; the table does not depend on the direction, which only flips the sign of sin. */
#include <string.h>

#include "kernels/cuda/common.cuh"

#define THREADS 256

__global__ void rope_table_kernel(float2 *cs, int T, int D, const double *f, float mscale) {
  int half = D / 2;
  size_t total = (size_t)T * half;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    int t = (int)(e / (size_t)half), i = (int)(e % (size_t)half);
    double ang = (double)t * f[i];
    float co = (float)cos(ang), si = (float)sin(ang);
    if (mscale != 1.0f) /* yarn's and longrope's attention factor with partial rotary */
      co = __fmul_rn(co, mscale), si = __fmul_rn(si, mscale);
    cs[e] = make_float2(co, si);
  }
}

template <typename T>
__global__ void rope_apply_kernel(T *x, const float2 *cs, int T_, int nh, int D, int R, int inverse,
                                  size_t total, const int32_t *pos) {
  int half = R / 2;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    /* e enumerates (b, t, h, i) with i fastest */
    int i = (int)(e % (size_t)half);
    size_t bth = e / (size_t)half;
    int t = pos ? pos[bth / (size_t)nh] : (int)((bth / (size_t)nh) % (size_t)T_);
    T *v = x + bth * (size_t)D;
    float2 c = cs[(size_t)t * half + i];
    float co = c.x, si = inverse ? -c.y : c.y;
    float x1 = tz_ld(v[i]), x2 = tz_ld(v[i + half]);
    v[i] = tz_st<T>(__fsub_rn(__fmul_rn(x1, co), __fmul_rn(x2, si)));
    v[i + half] = tz_st<T>(__fadd_rn(__fmul_rn(x2, co), __fmul_rn(x1, si)));
  }
}

/* The same rotation, RV consecutive i at a time: the x[i] and x[i + R/2] of a vector are 16-byte
 * loads (one each for 16-bit storage, two for f32) and their cos and sin four 16-byte loads of the
 * table, where R/2 is a multiple of RV and every row of x starts on 16 bytes. Each element's
 * arithmetic is rope_apply_kernel's, so the two give the same bits. */
#define RV 8
template <typename T>
__global__ void rope_apply_vec_kernel(T *x, const float2 *cs, int T_, int nh, int D, int R,
                                      int inverse, size_t total, const int32_t *pos) {
  const int half = R / 2, hv = half / RV;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    /* e enumerates (b, t, h, vector of i) with the vector fastest */
    int i0 = (int)(e % (size_t)hv) * RV;
    size_t bth = e / (size_t)hv;
    int t = pos ? pos[bth / (size_t)nh] : (int)((bth / (size_t)nh) % (size_t)T_);
    T *v = x + bth * (size_t)D;
    float x1[RV], x2[RV], c[2 * RV];
#pragma unroll
    for (int h = 0; h < RV; h += tz_vec<T>::n) {
      tz_ld16(v + i0 + h, x1 + h);
      tz_ld16(v + half + i0 + h, x2 + h);
    }
    const float4 *t4 = reinterpret_cast<const float4 *>(cs + (size_t)t * half + i0);
#pragma unroll
    for (int q = 0; q < RV / 2; q++) {
      float4 f = t4[q];
      c[4 * q] = f.x, c[4 * q + 1] = f.y, c[4 * q + 2] = f.z, c[4 * q + 3] = f.w;
    }
    float y1[RV], y2[RV];
#pragma unroll
    for (int k = 0; k < RV; k++) {
      float co = c[2 * k], si = inverse ? -c[2 * k + 1] : c[2 * k + 1];
      y1[k] = __fsub_rn(__fmul_rn(x1[k], co), __fmul_rn(x2[k], si));
      y2[k] = __fadd_rn(__fmul_rn(x2[k], co), __fmul_rn(x1[k], si));
    }
#pragma unroll
    for (int h = 0; h < RV; h += tz_vec<T>::n) {
      tz_st16(v + i0 + h, y1 + h);
      tz_st16(v + half + i0 + h, y2 + h);
    }
  }
}

static int rope_table(struct tz_cuda *c, int T, int D, const double *f, float mscale) {
  size_t fbytes = (size_t)(D / 2) * sizeof(double);
  if (c->rope_cs && c->rope_T == T && c->rope_D == D && c->rope_mscale == mscale &&
      memcmp(c->rope_f, f, fbytes) == 0)
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
  rope_table_kernel<<<tz_cuda_grid(c, entries, THREADS), THREADS, 0, c->stream>>>(
      c->rope_cs, T, D, c->rope_f_dev, mscale);
  TZ_CU_LAUNCHED();
  c->rope_T = T;
  c->rope_D = D;
  c->rope_mscale = mscale;
  return 0;
}

int tz_cuda_rope(void *ctx, void *x, int B, int T, int nh, int D, int R, const double *inv_freq,
                 float mscale, int inverse, const int32_t *pos) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CHECK(rope_table(c, T, R, inv_freq, mscale));
  size_t total = (size_t)B * T * nh * (R / 2);
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using TT = decltype(tag);
    if ((R / 2) % RV == 0 && tz_cuda_aligned16(x) && ((size_t)D * sizeof(TT)) % 16 == 0) {
      size_t vectors = total / RV;
      rope_apply_vec_kernel<TT><<<tz_cuda_grid(c, vectors, THREADS), THREADS, 0, c->stream>>>(
          (TT *)x, c->rope_cs, T, nh, D, R, inverse, vectors, pos);
    } else {
      rope_apply_kernel<TT><<<tz_cuda_grid(c, total, THREADS), THREADS, 0, c->stream>>>(
          (TT *)x, c->rope_cs, T, nh, D, R, inverse, total, pos);
    }
    TZ_CU_LAUNCHED();
    return 0;
  });
}
