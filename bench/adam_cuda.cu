/* tz-bench adam --gpu: tz_adam_cuda beside the device's own copy bandwidth, both timed with
 * events on one stream, interleaved, in the same run. The copy moves as many bytes (read plus
 * written) as one Adam pass: cudaMemcpyAsync device to device of half Adam's byte count. */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cuda/adam_cuda.h"
extern "C" {
#include "bench/bench.h"
#include "core/error.h"
}

#define CK(call)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "tz-bench adam: %s: %s\n", #call, cudaGetErrorString(e_));                   \
      rc = 1;                                                                                      \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

extern "C" int tz_bench_adam_gpu(size_t n, enum tz_dtype gdt, int has_copy, enum tz_dtype cdt,
                                 int reps, int json) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr, "tz-bench adam: --gpu: no CUDA device\n");
    return 77;
  }
  const size_t gsize = tz_dtype_size(gdt), csize = has_copy ? tz_dtype_size(cdt) : 0;
  /* read master, grad, m, v; write master, m, v, copy */
  const size_t bpp = 12 + gsize + 12 + csize;
  const size_t half = n * bpp / 2;
  int rc = 0;
  float *p = NULL, *m = NULL, *v = NULL;
  void *g = NULL, *copy = NULL, *src = NULL, *dst = NULL;
  cudaStream_t st = NULL;
  cudaEvent_t ev[3] = {NULL, NULL, NULL};
  double *ta = (double *)calloc((size_t)reps, sizeof(double));
  double *tc = (double *)calloc((size_t)reps, sizeof(double));
  cudaDeviceProp prop;
  struct tz_adam_params hp = {};
  if (!ta || !tc) {
    fprintf(stderr, "tz-bench adam: out of memory\n");
    rc = 1;
    goto out;
  }
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaMalloc((void **)&p, n * 4));
  CK(cudaMalloc((void **)&m, n * 4));
  CK(cudaMalloc((void **)&v, n * 4));
  CK(cudaMalloc(&g, n * gsize));
  if (has_copy)
    CK(cudaMalloc(&copy, n * csize));
  CK(cudaMalloc(&src, half));
  CK(cudaMalloc(&dst, half));
  /* byte patterns that are ordinary floats: master 0.747, m and grad 7.1e-4, v 6.7e-7 */
  CK(cudaMemset(p, 0x3f, n * 4));
  CK(cudaMemset(m, 0x3a, n * 4));
  CK(cudaMemset(v, 0x35, n * 4));
  CK(cudaMemset(g, 0x3a, n * gsize));
  CK(cudaMemset(src, 0, half));
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int k = 0; k < 3; k++)
    CK(cudaEventCreate(&ev[k]));
  hp.lr = 1e-3f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.999f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.01f;
  hp.decoupled = 1;
  hp.grad_scale = 1.0f;
  CK(cudaDeviceSynchronize());
  /* interleaved passes; the first of each is a warm-up and not counted */
  for (int r = -1; r < reps; r++) {
    if (tz_adam_params_for_step(&hp, r + 2) != 0) {
      fprintf(stderr, "tz-bench adam: %s\n", tz_err_msg());
      rc = 1;
      goto out;
    }
    CK(cudaEventRecord(ev[0], st));
    if (tz_adam_cuda(&hp, p, m, v, g, gdt, copy, cdt, n, st) != 0) {
      fprintf(stderr, "tz-bench adam: %s\n", tz_err_msg());
      rc = 1;
      goto out;
    }
    CK(cudaEventRecord(ev[1], st));
    CK(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice, st));
    CK(cudaEventRecord(ev[2], st));
    CK(cudaEventSynchronize(ev[2]));
    float ms_adam = 0, ms_copy = 0;
    CK(cudaEventElapsedTime(&ms_adam, ev[0], ev[1]));
    CK(cudaEventElapsedTime(&ms_copy, ev[1], ev[2]));
    if (r >= 0) {
      ta[r] = 1e-3 * ms_adam;
      tc[r] = 1e-3 * ms_copy;
    }
  }
  {
    /* the ratio is the median over back-to-back pairs; the copy moves as many bytes as Adam, so
     * each pair's ratio is copy time / Adam time */
    double *pair = (double *)calloc((size_t)reps, sizeof(double));
    if (!pair) {
      fprintf(stderr, "tz-bench adam: out of memory\n");
      rc = 1;
      goto out;
    }
    for (int r = 0; r < reps; r++)
      pair[r] = tc[r] / ta[r];
    const double ratio = tz_bench_median(pair, reps);
    free(pair);
    const double sa = tz_bench_median(ta, reps), sc = tz_bench_median(tc, reps);
    const double gp = (double)n / sa * 1e-9, gbps = (double)(n * bpp) / sa * 1e-9;
    const double copy_gbps = 2.0 * (double)half / sc * 1e-9;
    if (json)
      printf("{\"bench\":\"adam\",\"device\":\"gpu\",\"name\":\"%s\",\"n\":%zu,\"grad\":\"%s\","
             "\"copy\":\"%s\",\"bytes_per_param\":%zu,\"seconds\":%.6f,\"gparams_per_s\":%.3f,"
             "\"gbps\":%.1f,\"ceiling\":%.1f,\"ratio\":%.4f}\n",
             prop.name, n, tz_dtype_name(gdt), has_copy ? tz_dtype_name(cdt) : "none", bpp, sa, gp,
             gbps, copy_gbps, ratio);
    else
      printf("tz-bench adam --gpu: %s, %zu params, grad %s, copy %s, %zu bytes/param, median of "
             "%d\n  adam %.2f Gparam/s, %.1f GB/s; device-to-device copy %.1f GB/s (read + "
             "written); ratio %.3f (target >= 0.80)%s\n",
             prop.name, n, tz_dtype_name(gdt), has_copy ? tz_dtype_name(cdt) : "none", bpp, reps,
             gp, gbps, copy_gbps, ratio, ratio < 0.80 ? ": BELOW TARGET" : "");
  }
out:
  for (int k = 0; k < 3; k++)
    if (ev[k])
      cudaEventDestroy(ev[k]);
  if (st)
    cudaStreamDestroy(st);
  cudaFree(p);
  cudaFree(m);
  cudaFree(v);
  cudaFree(g);
  cudaFree(copy);
  cudaFree(src);
  cudaFree(dst);
  free(ta);
  free(tc);
  return rc;
}
