/* The cpu backend's instance, shared by its files (compute.c: the ops table and most ops; moe.c:
 * the mixture-of-experts ops). Private to tz_kernels_cpu. */
#ifndef TZ_KERNELS_CPU_CPU_H
#define TZ_KERNELS_CPU_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/compute_impl.h"

struct cpu {
  int nt;       /* OpenMP and BLAS threads */
  float *tmp;   /* an accumulating matmul's product, grown on demand */
  size_t tmp_n; /* floats in tmp */
};

/* The mixture-of-experts entries of the ops table (kernels/compute.h has their contracts). */
int tz_cpu_moe_route(void *ctx, const struct tz_moe_route *r, float *stats, const void *logits,
                     int N, int E, int k, int norm);
int tz_cpu_moe_route_bwd(void *ctx, void *dlogits, const struct tz_moe_route *r, const float *dw,
                         const float *daux, int N, int E, int k, int norm);
int tz_cpu_moe_gather(void *ctx, void *xs, const void *x, const int32_t *rows, int M, int C);
int tz_cpu_moe_scatter(void *ctx, void *dx, const void *dxs, const int32_t *slot, int N, int k,
                       int C);
int tz_cpu_moe_combine(void *ctx, void *out, const void *res, const void *y, const float *w,
                       const int32_t *slot, int N, int k, int C);
int tz_cpu_moe_combine_bwd(void *ctx, void *dy, float *dw, const void *dout, const void *y,
                           const float *w, const int32_t *slot, int N, int k, int C);
int tz_cpu_moe_gate_fwd(void *ctx, void *out, const void *res, const void *y, const void *s, int N,
                        int C);
int tz_cpu_moe_gate_bwd(void *ctx, void *dy, void *ds, const void *dout, const void *y,
                        const void *s, int N, int C);

#endif
