/* GPU Adam(W) for optimizer state that lives in HBM: the definition in kernels/adam.h, bit for bit
 * the same as tz_adam_cpu on the same inputs. Exists only in CUDA builds; include it only from
 * code that is built with CUDA (the registries, the CUDA backends, CUDA-only tests and benches). */
#ifndef TZ_KERNELS_CUDA_ADAM_CUDA_H
#define TZ_KERNELS_CUDA_ADAM_CUDA_H

#include <stddef.h>

#include "kernels/adam.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Adam step over n elements, in place, enqueued on cuda_stream (a cudaStream_t; NULL is the
 * legacy default stream) and not waited for. Device pointers, same roles, dtypes and rules as
 * tz_adam_cpu (no alignment needed: 16-byte aligned arrays take the float4 path, others are
 * still correct). The hyperparameters are copied at launch, so p may be freed on return.
 * Returns 0, TZ_EINVAL (bad argument) or TZ_ECUDA (a launch failed, with CUDA's message);
 * errors while the kernel runs surface at the stream's next synchronisation. */
int tz_adam_cuda(const struct tz_adam_params *p, float *master, float *m, float *v,
                 const void *grad, enum tz_dtype grad_dtype, void *param_copy,
                 enum tz_dtype copy_dtype, size_t n, void *cuda_stream);

#ifdef __cplusplus
}
#endif

#endif
