/* Elementwise operations: fill, scale, axpy, the residual add, casts and SwiGLU. One thread per
 * element in a grid-stride loop; each output depends on its own index only, so aliasing an
 * output with an input of the same index is safe. The arithmetic is spelled out with _rn
 * intrinsics in the order compute.h and the cpu backend use. */
#include "kernels/cuda/common.cuh"

#define THREADS 256

#define GRID_STRIDE(i, n)                                                                          \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
       i += (size_t)gridDim.x * blockDim.x)

template <typename T> __global__ void fill_kernel(T *x, float value, size_t n) {
  T v = tz_st<T>(value);
  GRID_STRIDE(i, n) x[i] = v;
}

template <typename T> __global__ void scale_kernel(T *x, float alpha, size_t n) {
  GRID_STRIDE(i, n) x[i] = tz_st<T>(__fmul_rn(tz_ld(x[i]), alpha));
}

/* y + (alpha * x): two roundings in float, no fused multiply-add (compute.h). */
template <typename T> __global__ void axpy_kernel(T *y, float alpha, const T *x, size_t n) {
  GRID_STRIDE(i, n) {
    float ax = __fmul_rn(alpha, tz_ld(x[i]));
    y[i] = tz_st<T>(__fadd_rn(tz_ld(y[i]), ax));
  }
}

template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, size_t n) {
  GRID_STRIDE(i, n) out[i] = tz_st<T>(__fadd_rn(tz_ld(a[i]), tz_ld(b[i])));
}

template <typename TD, typename TS> __global__ void cast_kernel(TD *dst, const TS *src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = tz_st<TD>(tz_ld(src[i]));
}

/* silu(g) * u with silu(g) = g / (1 + exp(-g)) */
template <typename T> __global__ void swiglu_fwd_kernel(T *out, const T *g, const T *u, size_t n) {
  GRID_STRIDE(i, n) {
    float gi = tz_ld(g[i]);
    float silu = __fdiv_rn(gi, __fadd_rn(1.0f, expf(-gi)));
    out[i] = tz_st<T>(__fmul_rn(silu, tz_ld(u[i])));
  }
}

/* dg = dout u silu'(g) with silu'(g) = sig (1 + g (1 - sig)); du = dout silu(g). */
template <typename T>
__global__ void swiglu_bwd_kernel(T *dg, T *du, const T *dout, const T *g, const T *u, size_t n) {
  GRID_STRIDE(i, n) {
    float gi = tz_ld(g[i]), ui = tz_ld(u[i]), d = tz_ld(dout[i]);
    float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gi)));
    float silu = __fmul_rn(gi, sig);
    float dsilu = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(gi, __fsub_rn(1.0f, sig))));
    float dgi = __fmul_rn(__fmul_rn(d, ui), dsilu);
    float dui = __fmul_rn(d, silu);
    dg[i] = tz_st<T>(dgi);
    du[i] = tz_st<T>(dui);
  }
}

int tz_cuda_fill(void *ctx, enum tz_dtype dt, void *x, float value, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<tz_cuda_grid(c, n, THREADS), THREADS, 0, c->stream>>>((T *)x, value, n);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_scale(void *ctx, enum tz_dtype dt, void *x, float alpha, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<tz_cuda_grid(c, n, THREADS), THREADS, 0, c->stream>>>((T *)x, alpha, n);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_axpy(void *ctx, enum tz_dtype dt, void *y, float alpha, const void *x, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    axpy_kernel<T>
        <<<tz_cuda_grid(c, n, THREADS), THREADS, 0, c->stream>>>((T *)y, alpha, (const T *)x, n);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_add(void *ctx, enum tz_dtype dt, void *out, const void *a, const void *b, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T><<<tz_cuda_grid(c, n, THREADS), THREADS, 0, c->stream>>>((T *)out, (const T *)a,
                                                                          (const T *)b, n);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_cast(void *ctx, void *dst, enum tz_dtype dst_dt, const void *src, enum tz_dtype src_dt,
                 size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  if (dst_dt == src_dt) {
    TZ_CU(
        cudaMemcpyAsync(dst, src, n * tz_dtype_size(dst_dt), cudaMemcpyDeviceToDevice, c->stream));
    return 0;
  }
  return tz_cuda_dispatch(dst_dt, [&](auto dtag) {
    using TD = decltype(dtag);
    return tz_cuda_dispatch(src_dt, [&](auto stag) {
      using TS = decltype(stag);
      cast_kernel<TD, TS>
          <<<tz_cuda_grid(c, n, THREADS), THREADS, 0, c->stream>>>((TD *)dst, (const TS *)src, n);
      TZ_CU_LAUNCHED();
      return 0;
    });
  });
}

int tz_cuda_swiglu_fwd(void *ctx, void *out, const void *g, const void *u, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    swiglu_fwd_kernel<T><<<tz_cuda_grid(c, n, THREADS), THREADS, 0, c->stream>>>(
        (T *)out, (const T *)g, (const T *)u, n);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_swiglu_bwd(void *ctx, void *dg, void *du, const void *dout, const void *g,
                       const void *u, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    swiglu_bwd_kernel<T><<<tz_cuda_grid(c, n, THREADS), THREADS, 0, c->stream>>>(
        (T *)dg, (T *)du, (const T *)dout, (const T *)g, (const T *)u, n);
    TZ_CU_LAUNCHED();
    return 0;
  });
}
