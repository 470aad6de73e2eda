#include "collectives/nccl_sum.h"

#include <stdint.h>

#include "core/dtype.h"

/* core/dtype.h's conversions compile for the device too: the same integer steps as the host,
 * so the same bits as the mpi backend's sums. */
template <int DT>
__global__ void sum_chunks(uint16_t *out, const uint16_t *in, size_t stride, size_t n,
                           int nchunks) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float acc = DT == 1 ? tz_bf16_to_f32(in[i]) : tz_f16_to_f32(in[i]);
    for (int r = 1; r < nchunks; r++) {
      uint16_t x = in[(size_t)r * stride + i];
      acc = __fadd_rn(acc, DT == 1 ? tz_bf16_to_f32(x) : tz_f16_to_f32(x));
    }
    out[i] = DT == 1 ? tz_f32_to_bf16(acc) : tz_f32_to_f16(acc);
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
    sum_chunks<1>
        <<<blocks, threads, 0, s>>>((uint16_t *)out, (const uint16_t *)in, stride, n, nchunks);
  else if (dtype == 2)
    sum_chunks<2>
        <<<blocks, threads, 0, s>>>((uint16_t *)out, (const uint16_t *)in, stride, n, nchunks);
  else
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}
