#include "collectives/nccl_sum.h"

#include <stdint.h>

/* The conversions of core/dtype.h, for the device: the same integer steps, so the same bits. */
__device__ static float f32_from_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ static uint16_t bf16_from_f32(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

__device__ static float f32_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f)
    return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    float v = __fmul_rn((float)m, 5.9604644775390625e-8f);
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ static uint16_t f16_from_f32(float f) {
  uint32_t u = __float_as_uint(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u)
    return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    if (a < 0x33000000u)
      return sign;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - (int)(a >> 23);
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u)))
      q++;
    return (uint16_t)(sign | q);
  }
  uint32_t r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

template <int DT>
__global__ void sum_chunks(uint16_t *out, const uint16_t *in, size_t stride, size_t n,
                           int nchunks) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float acc = DT == 1 ? f32_from_bf16(in[i]) : f32_from_f16(in[i]);
    for (int r = 1; r < nchunks; r++) {
      uint16_t x = in[(size_t)r * stride + i];
      acc = __fadd_rn(acc, DT == 1 ? f32_from_bf16(x) : f32_from_f16(x));
    }
    out[i] = DT == 1 ? bf16_from_f32(acc) : f16_from_f32(acc);
  }
}

extern "C" cudaError_t tz_nccl_sum_chunks(void *out, const void *in, size_t stride, size_t n,
                                          int nchunks, int dtype, cudaStream_t s) {
  if (n == 0)
    return cudaSuccess;
  const int threads = 256;
  size_t want = (n + threads - 1) / threads;
  unsigned blocks = want < 65535 ? (unsigned)want : 65535u;
  if (dtype == 1)
    sum_chunks<1><<<blocks, threads, 0, s>>>((uint16_t *)out, (const uint16_t *)in, stride, n,
                                             nchunks);
  else if (dtype == 2)
    sum_chunks<2><<<blocks, threads, 0, s>>>((uint16_t *)out, (const uint16_t *)in, stride, n,
                                             nchunks);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}
