/* Elementwise operations: fill, scale, axpy, the residual add, casts, the gated activations
 * (SwiGLU and GeGLU) and the logit softcap, in grid-stride loops; each output depends on its own
 * index only, so aliasing an output with an input of the same index is safe. All but fill and the
 * casts go through the map kernel below (16 bytes at a time where aligned); fill and the casts
 * one element a thread. The arithmetic is spelled out with _rn intrinsics in the order compute.h
 * and the cpu backend use. */
#include "kernels/cuda/common.cuh"

#define THREADS 256

#define GRID_STRIDE(i, n)                                                                          \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
       i += (size_t)gridDim.x * blockDim.x)

template <typename T> __global__ void fill_kernel(T *x, float value, size_t n) {
  T v = tz_st<T>(value);
  GRID_STRIDE(i, n) x[i] = v;
}

template <typename TD, typename TS> __global__ void cast_kernel(TD *dst, const TS *src, size_t n) {
  GRID_STRIDE(i, n) dst[i] = tz_st<TD>(tz_ld(src[i]));
}

/* ---- The map kernel: outputs of an index from the inputs of that index ----
 * op(y, x) computes the NO outputs y of one element from its NI inputs x, in float. Where every
 * pointer is 16-byte aligned, a thread takes tz_vec<T>::n elements at a time (16-byte loads and
 * stores: a bf16 element alone is a 2-byte access, an eighth of what the memory system moves
 * best), the last n % tz_vec<T>::n one at a time; elsewhere all go one at a time. Every element
 * goes through the same op either way, so alignment changes no bit. A thread loads all inputs of
 * its elements before it stores, so an output may alias an input of the same index. */
template <typename T, int NI, int NO> struct map_ptrs {
  const T *in[NI];
  T *out[NO];
};

template <typename T, int NI, int NO, typename Op>
__global__ void map_kernel(map_ptrs<T, NI, NO> p, size_t n, int vec, Op op) {
  constexpr int V = tz_vec<T>::n;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t nv = vec ? n / V : 0;
  for (size_t i = tid; i < nv; i += stride) {
    float x[NI][V], y[NO][V];
#pragma unroll
    for (int k = 0; k < NI; k++)
      tz_ld16(p.in[k] + i * V, x[k]);
#pragma unroll
    for (int e = 0; e < V; e++) {
      float xe[NI], ye[NO];
#pragma unroll
      for (int k = 0; k < NI; k++)
        xe[k] = x[k][e];
      op(ye, xe);
#pragma unroll
      for (int k = 0; k < NO; k++)
        y[k][e] = ye[k];
    }
#pragma unroll
    for (int k = 0; k < NO; k++)
      tz_st16(p.out[k] + i * V, y[k]);
  }
  for (size_t i = nv * V + tid; i < n; i += stride) {
    float xe[NI], ye[NO];
#pragma unroll
    for (int k = 0; k < NI; k++)
      xe[k] = tz_ld(p.in[k][i]);
    op(ye, xe);
#pragma unroll
    for (int k = 0; k < NO; k++)
      p.out[k][i] = tz_st<T>(ye[k]);
  }
}

template <typename T, int NI, int NO, typename Op>
static int map_launch(struct tz_cuda *c, map_ptrs<T, NI, NO> p, size_t n, Op op) {
  int vec = 1;
  for (int k = 0; k < NI; k++)
    vec &= tz_cuda_aligned16(p.in[k]);
  for (int k = 0; k < NO; k++)
    vec &= tz_cuda_aligned16(p.out[k]);
  size_t items = vec ? (n + tz_vec<T>::n - 1) / tz_vec<T>::n : n;
  map_kernel<T, NI, NO, Op>
      <<<tz_cuda_grid(c, items, THREADS), THREADS, 0, c->stream>>>(p, n, vec, op);
  TZ_CU_LAUNCHED();
  return 0;
}

struct scale_op {
  float alpha;
  __device__ void operator()(float *y, const float *x) const { y[0] = __fmul_rn(x[0], alpha); }
};

/* y + (alpha * x): two roundings in float, no fused multiply-add (compute.h). x = {y, x} */
struct axpy_op {
  float alpha;
  __device__ void operator()(float *y, const float *x) const {
    y[0] = __fadd_rn(x[0], __fmul_rn(alpha, x[1]));
  }
};

struct add_op {
  __device__ void operator()(float *y, const float *x) const { y[0] = __fadd_rn(x[0], x[1]); }
};

/* silu(g) * u with silu(g) = g / (1 + exp(-g)) */
__device__ __forceinline__ float swiglu1(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* gelu(g) = (0.5 g) (1 + th), th = tanh(k0 (g + k1 g^3)), k0 = sqrt(2/pi), k1 = 0.044715, and,
 * unless NULL, its derivative 0.5 (1 + th) + (0.5 g) ((1 - th^2) (k0 (1 + 3 k1 g^2))): the cpu
 * backend's gelu_tanh, operation for operation. */
__device__ __forceinline__ float gelu_tanh(float g, float *slope) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  float g2 = __fmul_rn(g, g);
  float th = tanhf(__fmul_rn(k0, __fadd_rn(g, __fmul_rn(k1, __fmul_rn(g2, g)))));
  float half_g = __fmul_rn(0.5f, g);
  if (slope) {
    float inner = __fmul_rn(k0, __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f, k1), g2)));
    float dth = __fmul_rn(__fsub_rn(1.0f, __fmul_rn(th, th)), inner);
    *slope = __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, th)), __fmul_rn(half_g, dth));
  }
  return __fmul_rn(half_g, __fadd_rn(1.0f, th));
}

/* act(g) * u. x = {g, u}, y = {out} */
template <enum tz_glu ACT> struct glu_fwd_op {
  __device__ void operator()(float *y, const float *x) const {
    y[0] = ACT == TZ_GLU_GELU_TANH ? __fmul_rn(gelu_tanh(x[0], NULL), x[1]) : swiglu1(x[0], x[1]);
  }
};

/* dg = (dout u) act'(g), du = dout act(g); SiLU's silu'(g) = sig (1 + g (1 - sig)) and du from
 * g sig. x = {dout, g, u}, y = {dg, du} and, with REBUILD, the forward's out (glu_fwd_op's bits) */
template <enum tz_glu ACT, int REBUILD> struct glu_bwd_op {
  __device__ void operator()(float *y, const float *x) const {
    float d = x[0], gi = x[1], ui = x[2];
    if (ACT == TZ_GLU_GELU_TANH) {
      float slope, a = gelu_tanh(gi, &slope);
      y[0] = __fmul_rn(__fmul_rn(d, ui), slope);
      y[1] = __fmul_rn(d, a);
      if (REBUILD)
        y[2] = __fmul_rn(a, ui);
      return;
    }
    float sig = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gi)));
    float silu = __fmul_rn(gi, sig);
    float dsilu = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(gi, __fsub_rn(1.0f, sig))));
    y[0] = __fmul_rn(__fmul_rn(d, ui), dsilu);
    y[1] = __fmul_rn(d, silu);
    if (REBUILD)
      y[2] = swiglu1(gi, ui);
  }
};

/* l = cap * tanh(l / cap) (tz_softcap) */
struct softcap_op {
  float cap;
  __device__ void operator()(float *y, const float *x) const { y[0] = tz_softcap(x[0], cap); }
};

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
    return map_launch(c, map_ptrs<T, 1, 1>{{(const T *)x}, {(T *)x}}, n, scale_op{alpha});
  });
}

int tz_cuda_axpy(void *ctx, enum tz_dtype dt, void *y, float alpha, const void *x, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    return map_launch(c, map_ptrs<T, 2, 1>{{(const T *)y, (const T *)x}, {(T *)y}}, n,
                      axpy_op{alpha});
  });
}

int tz_cuda_add(void *ctx, enum tz_dtype dt, void *out, const void *a, const void *b, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    return map_launch(c, map_ptrs<T, 2, 1>{{(const T *)a, (const T *)b}, {(T *)out}}, n, add_op{});
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

/* Calls f with a value of the tz_glu tag type of act, or refuses an act it does not know. */
template <enum tz_glu A> struct glu_tag { static constexpr enum tz_glu value = A; };
template <typename F> static int with_glu(enum tz_glu act, F f) {
  switch (act) {
  case TZ_GLU_SILU: return f(glu_tag<TZ_GLU_SILU>());
  case TZ_GLU_GELU_TANH: return f(glu_tag<TZ_GLU_GELU_TANH>());
  }
  return tz_err_set(TZ_EINVAL, "cuda glu: invalid activation %d", (int)act);
}

int tz_cuda_glu_fwd(void *ctx, enum tz_glu act, void *out, const void *g, const void *u, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    return with_glu(act, [&](auto atag) {
      constexpr enum tz_glu A = decltype(atag)::value;
      return map_launch(c, map_ptrs<T, 2, 1>{{(const T *)g, (const T *)u}, {(T *)out}}, n,
                        glu_fwd_op<A>{});
    });
  });
}

int tz_cuda_glu_bwd(void *ctx, enum tz_glu act, void *dg, void *du, void *out, const void *dout,
                    const void *g, const void *u, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    return with_glu(act, [&](auto atag) {
      constexpr enum tz_glu A = decltype(atag)::value;
      const T *in[3] = {(const T *)dout, (const T *)g, (const T *)u};
      if (out)
        return map_launch(c, map_ptrs<T, 3, 3>{{in[0], in[1], in[2]}, {(T *)dg, (T *)du, (T *)out}},
                          n, glu_bwd_op<A, 1>{});
      return map_launch(c, map_ptrs<T, 3, 2>{{in[0], in[1], in[2]}, {(T *)dg, (T *)du}}, n,
                        glu_bwd_op<A, 0>{});
    });
  });
}

int tz_cuda_softcap(void *ctx, void *logits, size_t n, float softcap) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    return map_launch(c, map_ptrs<T, 1, 1>{{(const T *)logits}, {(T *)logits}}, n,
                      softcap_op{softcap});
  });
}
