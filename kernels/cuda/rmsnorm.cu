/* RMSNorm, statistics in float. A block owns a row: each thread sums its columns in order, then
 * tz_block_sum's fixed tree combines them. Rows of at most WARP_MAX_C columns (the per-head q/k
 * norms of Qwen3: N*H rows of the head dim, where a block per row would leave most of its threads
 * idle and the launch would be block scheduling) go one warp per row instead, each lane standing
 * in for the THREADS / 32 threads of the block kernel it would be (lane l for threads l, l + 32,
 * ...), with the same butterflies: the same bits as the block kernel, so the choice between the
 * two changes no result. The weight gradient is a reduction over rows, done without atomics in
 * two passes: fixed segments of ROWS_PER_PART rows are summed in row order per column into a
 * workspace, then the segments' partial sums are added in segment order and the total added to
 * dw. The segment length is a constant, so the order never depends on the device or the
 * launch. */
#include "kernels/cuda/common.cuh"

#define THREADS 256
#define ROWS_PER_PART 64
#define COL_THREADS 128
#define WARP_MAX_C 512      /* widths up to this: one warp per row */
#define VIRT (THREADS / 32) /* the block kernel's warps, one lane of a row's warp each */
#define TOTAL_UNROLL 32     /* parts loaded together before they are added in order */

/* tz_block_sum of a THREADS-thread block, by one warp: lane l's acc[w] is what thread w * 32 + l
 * of the block holds. Each virtual warp's xor butterfly, then the butterfly over the warps' sums
 * (0 in lanes past VIRT), as tz_block_sum does; every lane gets the sum. */
__device__ __forceinline__ float warp_as_block_sum(const float (&acc)[VIRT]) {
  const unsigned lane = threadIdx.x & 31u;
  float t = 0.0f;
#pragma unroll
  for (int w = 0; w < VIRT; w++) {
    float v = acc[w];
    for (int s = 16; s >= 1; s >>= 1)
      v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, s));
    if (lane == (unsigned)w)
      t = v;
  }
  for (int s = 16; s >= 1; s >>= 1)
    t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, s));
  return t;
}

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

/* The same, one warp per row (C <= WARP_MAX_C): lane l sums, for each virtual thread
 * w * 32 + l, the columns that thread of the block kernel would (w * 32 + l + k * THREADS). */
template <typename T>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_fwd_warp_kernel(T *out, float *rstd, const T *x, const T *w, int N, int C, float eps) {
  const int row = blockIdx.x * VIRT + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N)
    return; /* the whole warp: row is the same for its 32 lanes */
  const size_t base = (size_t)row * C;
  float acc[VIRT];
#pragma unroll
  for (int v = 0; v < VIRT; v++)
    acc[v] = 0.0f;
  for (int j0 = 0; j0 < C; j0 += THREADS) {
#pragma unroll
    for (int v = 0; v < VIRT; v++) {
      int j = j0 + v * 32 + lane;
      if (j < C) {
        float xv = tz_ld(x[base + j]);
        acc[v] = __fadd_rn(acc[v], __fmul_rn(xv, xv));
      }
    }
  }
  float ss = warp_as_block_sum(acc);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)C), eps)));
  if (lane == 0)
    rstd[row] = r;
  /* out may alias x: a lane writes only the columns it alone read, after the sum */
  for (int j = lane; j < C; j += 32)
    out[base + j] = tz_st<T>(__fmul_rn(__fmul_rn(tz_ld(x[base + j]), r), tz_ld(w[j])));
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

/* The same, one warp per row (C <= WARP_MAX_C), as rmsnorm_fwd_warp_kernel. */
template <typename T>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_bwd_dx_warp_kernel(T *dx, const T *dout, const T *x, const T *w, const float *rstd,
                               int N, int C) {
  const int row = blockIdx.x * VIRT + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N)
    return;
  const size_t base = (size_t)row * C;
  const float r = rstd[row];
  float acc[VIRT];
#pragma unroll
  for (int v = 0; v < VIRT; v++)
    acc[v] = 0.0f;
  for (int j0 = 0; j0 < C; j0 += THREADS) {
#pragma unroll
    for (int v = 0; v < VIRT; v++) {
      int j = j0 + v * 32 + lane;
      if (j < C) {
        float wdy = __fmul_rn(tz_ld(w[j]), tz_ld(dout[base + j]));
        acc[v] = __fadd_rn(acc[v], __fmul_rn(wdy, tz_ld(x[base + j])));
      }
    }
  }
  float dot = warp_as_block_sum(acc);
  float k = __fmul_rn(__fmul_rn(r, r), __fdiv_rn(dot, (float)C));
  for (int j = lane; j < C; j += 32) {
    float wdy = __fmul_rn(tz_ld(w[j]), tz_ld(dout[base + j]));
    float g = __fmul_rn(r, __fsub_rn(wdy, __fmul_rn(tz_ld(x[base + j]), k)));
    dx[base + j] = tz_st<T>(__fadd_rn(tz_ld(dx[base + j]), g));
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
  /* in order, TOTAL_UNROLL loads in flight at a time: N*H rows of the q/k norms make thousands
   * of parts for a few hundred columns, and one load at a time would be all latency */
  float acc = 0.0f;
  int p = 0;
  for (; p + TOTAL_UNROLL <= n_parts; p += TOTAL_UNROLL) {
    float v[TOTAL_UNROLL];
#pragma unroll
    for (int i = 0; i < TOTAL_UNROLL; i++)
      v[i] = part[(size_t)(p + i) * C + j];
#pragma unroll
    for (int i = 0; i < TOTAL_UNROLL; i++)
      acc = __fadd_rn(acc, v[i]);
  }
  for (; p < n_parts; p++)
    acc = __fadd_rn(acc, part[(size_t)p * C + j]);
  dw[j] = tz_st<TG>(__fadd_rn(tz_ld(dw[j]), acc));
}

int tz_cuda_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *x, const void *w, int N,
                        int C, float eps) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    if (C <= WARP_MAX_C)
      rmsnorm_fwd_warp_kernel<T><<<(unsigned)((N + VIRT - 1) / VIRT), THREADS, 0, c->stream>>>(
          (T *)out, rstd, (const T *)x, (const T *)w, N, C, eps);
    else
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
    if (C <= WARP_MAX_C)
      rmsnorm_bwd_dx_warp_kernel<T><<<(unsigned)((N + VIRT - 1) / VIRT), THREADS, 0, c->stream>>>(
          (T *)dx, (const T *)dout, (const T *)x, (const T *)w, rstd, N, C);
    else
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
