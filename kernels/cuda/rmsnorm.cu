/* RMSNorm, statistics in float. A block owns a row: each thread sums its columns in order, then
 * tz_block_sum's fixed tree combines them. The weight gradient is a reduction over rows, done
 * without atomics in two passes: fixed segments of ROWS_PER_PART rows are summed in row order per
 * column into a workspace, then the segments' partial sums are added in segment order and the
 * total added to dw. The segment length is a constant, so the order never depends on the device
 * or the launch. */
#include "kernels/cuda/common.cuh"

#define THREADS 256
#define ROWS_PER_PART 64
#define COL_THREADS 128

/* out = (x * rstd) * w, rstd = 1 / sqrt(mean(x^2) + eps) */
template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *x, const T *w, int C, float eps) {
  __shared__ float sh[32];
  size_t row = (size_t)blockIdx.x * C;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    float v = tz_ld(x[row + j]);
    ss = __fadd_rn(ss, __fmul_rn(v, v));
  }
  ss = tz_block_sum(ss, sh);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)C), eps)));
  if (threadIdx.x == 0)
    rstd[blockIdx.x] = r;
  /* out may alias x: each element is read and written by the same thread, after the sum. */
  for (int j = threadIdx.x; j < C; j += blockDim.x)
    out[row + j] = tz_st<T>(__fmul_rn(__fmul_rn(tz_ld(x[row + j]), r), tz_ld(w[j])));
}

/* dx += r (w dy - x k), k = r^2 mean(w dy x): the gradient through the norm for one row. */
template <typename T>
__global__ void rmsnorm_bwd_dx_kernel(T *dx, const T *dout, const T *x, const T *w,
                                      const float *rstd, int C) {
  __shared__ float sh[32];
  size_t row = (size_t)blockIdx.x * C;
  float r = rstd[blockIdx.x];
  float dot = 0.0f;
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    float wdy = __fmul_rn(tz_ld(w[j]), tz_ld(dout[row + j]));
    dot = __fadd_rn(dot, __fmul_rn(wdy, tz_ld(x[row + j])));
  }
  dot = tz_block_sum(dot, sh);
  float k = __fmul_rn(__fmul_rn(r, r), __fdiv_rn(dot, (float)C));
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    float wdy = __fmul_rn(tz_ld(w[j]), tz_ld(dout[row + j]));
    float g = __fmul_rn(r, __fsub_rn(wdy, __fmul_rn(tz_ld(x[row + j]), k)));
    dx[row + j] = tz_st<T>(__fadd_rn(tz_ld(dx[row + j]), g));
  }
}

/* part[p][j] = sum over rows [p*ROWS_PER_PART, ...) in order of dy[n][j] * (x[n][j] * r[n]) */
template <typename T>
__global__ void rmsnorm_bwd_dw_part_kernel(float *part, const T *dout, const T *x,
                                           const float *rstd, int N, int C) {
  int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= C)
    return;
  int n0 = blockIdx.x * ROWS_PER_PART;
  int n1 = n0 + ROWS_PER_PART < N ? n0 + ROWS_PER_PART : N;
  float acc = 0.0f;
  for (int n = n0; n < n1; n++) {
    size_t i = (size_t)n * C + j;
    acc = __fadd_rn(acc, __fmul_rn(tz_ld(dout[i]), __fmul_rn(tz_ld(x[i]), rstd[n])));
  }
  part[(size_t)blockIdx.x * C + j] = acc;
}

/* dw[j] += sum over parts in order of part[p][j] */
template <typename TG>
__global__ void rmsnorm_bwd_dw_total_kernel(TG *dw, const float *part, int n_parts, int C) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= C)
    return;
  float acc = 0.0f;
  for (int p = 0; p < n_parts; p++)
    acc = __fadd_rn(acc, part[(size_t)p * C + j]);
  dw[j] = tz_st<TG>(__fadd_rn(tz_ld(dw[j]), acc));
}

int tz_cuda_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *x, const void *w, int N,
                        int C, float eps) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_fwd_kernel<T><<<(unsigned)N, THREADS, 0, c->stream>>>((T *)out, rstd, (const T *)x,
                                                                  (const T *)w, C, eps);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_rmsnorm_bwd(void *ctx, void *dx, void *dw, const void *dout, const void *x,
                        const void *w, const float *rstd, int N, int C) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  /* parts on the grid's x (up to 2^31 - 1: q/k norms have N*H rows), columns on y */
  int n_parts = (N + ROWS_PER_PART - 1) / ROWS_PER_PART;
  void *scratch;
  TZ_CHECK(tz_cuda_scratch(c, (size_t)n_parts * C * sizeof(float), &scratch));
  float *part = (float *)scratch;
  unsigned col_blocks = (unsigned)((C + COL_THREADS - 1) / COL_THREADS);
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_bwd_dx_kernel<T><<<(unsigned)N, THREADS, 0, c->stream>>>(
        (T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd, C);
    TZ_CU_LAUNCHED();
    rmsnorm_bwd_dw_part_kernel<T>
        <<<dim3((unsigned)n_parts, col_blocks), COL_THREADS, 0, c->stream>>>(
            part, (const T *)dout, (const T *)x, rstd, N, C);
    TZ_CU_LAUNCHED();
    return tz_cuda_dispatch(c->G, [&](auto gtag) {
      using TG = decltype(gtag);
      rmsnorm_bwd_dw_total_kernel<TG>
          <<<col_blocks, COL_THREADS, 0, c->stream>>>((TG *)dw, part, n_parts, C);
      TZ_CU_LAUNCHED();
      return 0;
    });
  });
}
