/* The one kernel the nccl backend needs: the fixed-order sum of a reduction's chunks, for 16-bit
 * payloads accumulated in fp32 (collectives/nccl_sum.cu). */
#ifndef TZ_COLLECTIVES_NCCL_SUM_H
#define TZ_COLLECTIVES_NCCL_SUM_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues on s: out[i] = round(in[i] + in[stride + i] + ... + in[(nchunks-1) * stride + i]) for
 * i < n, summed in that order in fp32 and rounded once to nearest even, with in and out device
 * arrays of dtype (1: bf16, 2: f16, as enum tz_dtype). Rounding is core/dtype.h's, so the result
 * equals the mpi backend's. Returns the launch's error. */
cudaError_t tz_nccl_sum_chunks(void *out, const void *in, size_t stride, size_t n, int nchunks,
                               int dtype, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
