/* GPU Adam: the definition in kernels/adam.h, operation by operation, so that it matches the CPU
 * paths bit for bit. Every floating-point operation is an explicit PTX instruction with .rn and
 * without .ftz: nvcc's -ftz, -prec-div, -prec-sqrt, -fmad and -use_fast_math change what plain
 * C++ arithmetic and even the __f*_rn intrinsics compile to (with -ftz=true __fdiv_rn becomes
 * div.rn.ftz.f32), but never an instruction written out, and PTX never contracts an add or mul
 * that carries an explicit rounding mode. NaN tests and the bf16/f16 conversions are integer
 * code (core/dtype.h), also untouched by those flags. */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>

#include <atomic>

#include "kernels/cuda/adam_cuda.h"
extern "C" {
#include "core/error.h"
}

namespace {

constexpr int kCopyNone = -1;
constexpr int kThreads = 256;
constexpr uint32_t kCanonNan = 0x7fc00000u;

/* The per-call constants of the definition, computed once on the host in float. */
struct Consts {
  float gs, wd, b1, omb1, b2, omb2, bc1, bc2, eps, nlr;
  int decoupled;
};

__device__ __forceinline__ float add_rn(float a, float b) {
  float r;
  asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float mul_rn(float a, float b) {
  float r;
  asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}
__device__ __forceinline__ float div_rn(float a, float b) {
  float r;
  asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float sqrt_rn(float a) {
  float r;
  asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}

__device__ __forceinline__ float canon(float x) {
  return (__float_as_uint(x) & 0x7fffffffu) > 0x7f800000u ? __uint_as_float(kCanonNan) : x;
}

/* One element, exactly as kernels/adam.h defines it. */
__device__ __forceinline__ void adam_elem(const Consts &c, float &p, float &m, float &v, float gr) {
  const float p0 = p;
  float g = mul_rn(gr, c.gs);
  if (!c.decoupled)
    g = fma_rn(c.wd, p0, g);
  const float m1 = fma_rn(c.b1, m, mul_rn(c.omb1, g));
  const float v1 = fma_rn(c.b2, v, mul_rn(c.omb2, mul_rn(g, g)));
  const float mhat = mul_rn(m1, c.bc1);
  const float vhat = mul_rn(v1, c.bc2);
  const float den = add_rn(sqrt_rn(vhat), c.eps);
  float upd = div_rn(mhat, den);
  if (c.decoupled)
    upd = fma_rn(c.wd, p0, upd);
  p = canon(fma_rn(c.nlr, upd, p0));
  m = canon(m1);
  v = canon(v1);
}

template <int G> __device__ __forceinline__ float widen(uint16_t h) {
  return G == TZ_BF16 ? tz_bf16_to_f32(h) : tz_f16_to_f32(h);
}

template <int C> __device__ __forceinline__ uint16_t narrow(float x) {
  return C == TZ_BF16 ? tz_f32_to_bf16(x) : tz_f32_to_f16(x);
}

/* Elements [begin, end), one at a time: unaligned arrays, and the ends around the float4 body. */
template <int G, int C>
__global__ void adam_scalar(Consts c, float *__restrict__ p, float *__restrict__ m,
                            float *__restrict__ v, const void *__restrict__ g,
                            void *__restrict__ copy, size_t begin, size_t end) {
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = begin + (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < end; i += stride) {
    float gr = G == TZ_F32 ? static_cast<const float *>(g)[i]
                           : widen<G>(static_cast<const uint16_t *>(g)[i]);
    float P = p[i], M = m[i], V = v[i];
    adam_elem(c, P, M, V, gr);
    p[i] = P;
    m[i] = M;
    v[i] = V;
    if (C == TZ_F32)
      static_cast<float *>(copy)[i] = P;
    else if (C != kCopyNone)
      static_cast<uint16_t *>(copy)[i] = narrow<C>(P);
  }
}

/* Groups of four elements from begin (every array aligned there for its vector load). */
template <int G, int C>
__global__ void adam_vec4(Consts c, float *__restrict__ p, float *__restrict__ m,
                          float *__restrict__ v, const void *__restrict__ g,
                          void *__restrict__ copy, size_t begin, size_t n4) {
  float4 *p4 = reinterpret_cast<float4 *>(p + begin);
  float4 *m4 = reinterpret_cast<float4 *>(m + begin);
  float4 *v4 = reinterpret_cast<float4 *>(v + begin);
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n4; k += stride) {
    float gr[4];
    if (G == TZ_F32) {
      const float4 q = reinterpret_cast<const float4 *>(static_cast<const float *>(g) + begin)[k];
      gr[0] = q.x, gr[1] = q.y, gr[2] = q.z, gr[3] = q.w;
    } else {
      const uint2 q = reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(g) + begin)[k];
      gr[0] = widen<G>((uint16_t)(q.x & 0xffffu));
      gr[1] = widen<G>((uint16_t)(q.x >> 16));
      gr[2] = widen<G>((uint16_t)(q.y & 0xffffu));
      gr[3] = widen<G>((uint16_t)(q.y >> 16));
    }
    float4 P = p4[k], M = m4[k], V = v4[k];
    adam_elem(c, P.x, M.x, V.x, gr[0]);
    adam_elem(c, P.y, M.y, V.y, gr[1]);
    adam_elem(c, P.z, M.z, V.z, gr[2]);
    adam_elem(c, P.w, M.w, V.w, gr[3]);
    p4[k] = P;
    m4[k] = M;
    v4[k] = V;
    if (C == TZ_F32) {
      reinterpret_cast<float4 *>(static_cast<float *>(copy) + begin)[k] = P;
    } else if (C != kCopyNone) {
      uint2 q;
      q.x = (uint32_t)narrow<C>(P.x) | (uint32_t)narrow<C>(P.y) << 16;
      q.y = (uint32_t)narrow<C>(P.z) | (uint32_t)narrow<C>(P.w) << 16;
      reinterpret_cast<uint2 *>(static_cast<uint16_t *>(copy) + begin)[k] = q;
    }
  }
}

bool aligned(const void *ptr, size_t a) { return ((uintptr_t)ptr & (a - 1)) == 0; }

/* As many blocks as can be resident at once (and no more than the work needs): every block runs
 * from the start, so the grid-stride loops share the work evenly; a block that had to wait for a
 * slot would run its whole share after the others. per_sm is the kernel's occupancy. */
unsigned blocks_for(size_t work, int sms, int per_sm) {
  const size_t cap = (size_t)sms * (size_t)(per_sm > 0 ? per_sm : 1);
  const size_t b = (work + kThreads - 1) / kThreads;
  return (unsigned)(b < cap ? b : cap);
}

/* A kernel's resident blocks per SM, asked once per kernel (it depends on the kernel and the
 * architecture only, and a process drives one kind of GPU). */
template <typename K> int occupancy(K kernel, std::atomic<int> &cache) {
  int v = cache.load(std::memory_order_relaxed);
  if (v == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, kThreads, 0) != cudaSuccess ||
        v < 1)
      v = 1;
    cache.store(v, std::memory_order_relaxed);
  }
  return v;
}

template <int G, int C>
void launch(const Consts &c, float *p, float *m, float *v, const void *g, void *copy, size_t n,
            cudaStream_t s, int sms) {
  const size_t gsize = G == TZ_F32 ? 4 : 2, csize = C == TZ_F32 ? 4 : 2;
  /* peel elements until master is 16-byte aligned; the float4 body needs the others aligned at
   * the same element too, which holds when all arrays are aligned alike (tensors are 256-byte
   * aligned); otherwise everything goes element by element */
  size_t head = ((16 - ((uintptr_t)p & 15)) & 15) / 4;
  if (head > n)
    head = n;
  const bool vec = aligned(m + head, 16) && aligned(v + head, 16) &&
                   aligned(static_cast<const char *>(g) + head * gsize, 4 * gsize) &&
                   (C == kCopyNone || aligned(static_cast<char *>(copy) + head * csize, 4 * csize));
  static std::atomic<int> scalar_occ{0}, vec_occ{0};
  if (!vec) {
    const int occ = occupancy(adam_scalar<G, C>, scalar_occ);
    adam_scalar<G, C><<<blocks_for(n, sms, occ), kThreads, 0, s>>>(c, p, m, v, g, copy, 0, n);
    return;
  }
  const size_t n4 = (n - head) / 4, body_end = head + 4 * n4;
  if (head)
    adam_scalar<G, C><<<1, kThreads, 0, s>>>(c, p, m, v, g, copy, 0, head);
  if (n4) {
    const int occ = occupancy(adam_vec4<G, C>, vec_occ);
    adam_vec4<G, C><<<blocks_for(n4, sms, occ), kThreads, 0, s>>>(c, p, m, v, g, copy, head, n4);
  }
  if (body_end < n)
    adam_scalar<G, C><<<1, kThreads, 0, s>>>(c, p, m, v, g, copy, body_end, n);
}

template <int G>
void launch_copy(int cdt, const Consts &c, float *p, float *m, float *v, const void *g, void *copy,
                 size_t n, cudaStream_t s, int sms) {
  switch (cdt) {
  case TZ_F32: launch<G, TZ_F32>(c, p, m, v, g, copy, n, s, sms); break;
  case TZ_BF16: launch<G, TZ_BF16>(c, p, m, v, g, copy, n, s, sms); break;
  case TZ_F16: launch<G, TZ_F16>(c, p, m, v, g, copy, n, s, sms); break;
  default: launch<G, kCopyNone>(c, p, m, v, g, copy, n, s, sms); break;
  }
}

} // namespace

extern "C" int tz_adam_cuda(const struct tz_adam_params *hp, float *master, float *m, float *v,
                            const void *grad, enum tz_dtype grad_dtype, void *param_copy,
                            enum tz_dtype copy_dtype, size_t n, void *cuda_stream) {
  TZ_CHECK(tz_adam_params_check(hp));
  if (n && (!master || !m || !v || !grad))
    return tz_err_set(TZ_EINVAL,
                      "adam (cuda): NULL array (master %p, m %p, v %p, grad %p) for "
                      "%zu elements",
                      (void *)master, (void *)m, (void *)v, grad, n);
  if (grad_dtype != TZ_F32 && grad_dtype != TZ_BF16 && grad_dtype != TZ_F16)
    return tz_err_set(TZ_EINVAL, "adam (cuda): gradient dtype %d is not f32, bf16 or f16",
                      (int)grad_dtype);
  if (param_copy && copy_dtype != TZ_F32 && copy_dtype != TZ_BF16 && copy_dtype != TZ_F16)
    return tz_err_set(TZ_EINVAL, "adam (cuda): parameter copy dtype %d is not f32, bf16 or f16",
                      (int)copy_dtype);
  /* the GPU faults on a misaligned element access; the CPU would not notice */
  if (!aligned(master, 4) || !aligned(m, 4) || !aligned(v, 4) ||
      !aligned(grad, tz_dtype_size(grad_dtype)) ||
      (param_copy && !aligned(param_copy, tz_dtype_size(copy_dtype))))
    return tz_err_set(TZ_EINVAL,
                      "adam (cuda): an array is not aligned to its element size "
                      "(master %p, m %p, v %p, grad %p, copy %p)",
                      (void *)master, (void *)m, (void *)v, grad, param_copy);
  if (n == 0)
    return 0;
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess)
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess)
    return tz_err_set(TZ_ECUDA, "adam (cuda): querying the device: %s", cudaGetErrorString(e));
  Consts c;
  c.gs = hp->grad_scale;
  c.wd = hp->weight_decay;
  c.b1 = hp->beta1;
  c.omb1 = 1.0f - hp->beta1; /* host arithmetic, the same as kernels/cpu */
  c.b2 = hp->beta2;
  c.omb2 = 1.0f - hp->beta2;
  c.bc1 = hp->bias_corr1;
  c.bc2 = hp->bias_corr2;
  c.eps = hp->eps;
  c.nlr = -hp->lr;
  c.decoupled = hp->decoupled;
  cudaStream_t s = static_cast<cudaStream_t>(cuda_stream);
  const int cdt = param_copy ? (int)copy_dtype : kCopyNone;
  switch (grad_dtype) {
  case TZ_F32: launch_copy<TZ_F32>(cdt, c, master, m, v, grad, param_copy, n, s, sms); break;
  case TZ_BF16: launch_copy<TZ_BF16>(cdt, c, master, m, v, grad, param_copy, n, s, sms); break;
  case TZ_F16: launch_copy<TZ_F16>(cdt, c, master, m, v, grad, param_copy, n, s, sms); break;
  }
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return tz_err_set(TZ_ECUDA, "adam (cuda): launching for %zu elements: %s", n,
                      cudaGetErrorString(e));
  return 0;
}
