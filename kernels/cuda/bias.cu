/* The bias of a linear layer (compute.h): add, and the gradient's column sums.
 *
 * add: x[r][j] = x[r][j] + b[j] in float, rounded once; the same bits as the cpu backend. A
 * thread owns VEC consecutive elements of one row (16-byte loads when n % VEC == 0 and x, b are
 * 16-byte aligned; one element otherwise), in a grid-stride loop.
 *
 * grad: db[j] += sum over rows of dy[r][j], without atomics, in an order fixed by N alone:
 *   - the rows are cut into parts of PART_ROWS (the last may be short);
 *   - within a part, warp w of WARPS sums rows w, w + WARPS, w + 2 WARPS, ... of the part in
 *     increasing order, from 0; the part's sum is then 0 + s_0 + s_1 + ... + s_{WARPS-1} in that
 *     order (through shared memory), written to a float workspace (n_parts, n);
 *   - a second pass adds the parts in increasing order from 0, then adds that total onto db
 *     once, rounding to G once.
 * Which columns a thread owns (VEC) changes nothing in a column's order, so the bits do not
 * depend on alignment or on n.
 *
 * Speed, N = 8192 and n = 3584 in bf16 on an H200 (4.8 TB/s of HBM): grad reads 58.7 MB of dy
 * and writes and reads back 32 x 3584 floats (0.9 MB, in L2): the floor is 58.7 MB / 4.8 TB/s =
 * 12.2 us. The first pass has 32 parts x 14 column strips = 448 blocks of 256 threads, each warp
 * keeping 8 16-byte loads in flight (about 15 MB in flight over the device, more than the ~5 MB
 * bandwidth x latency asks); the second pass is 3584 threads reading 32 floats each from L2.
 * add reads and writes x (2 x 58.7 MB) and reads b from cache: floor 24.5 us. Both well under
 * 0.1 ms. */
#include <stdint.h>

#include "kernels/cuda/common.cuh"

#define ADD_THREADS 256
#define PART_ROWS 256 /* rows per partial sum of grad */
#define WARPS 8       /* warps of a grad block; PART_ROWS / WARPS rows per warp */
#define UNROLL 8      /* rows a warp loads before adding them */
#define TOTAL_THREADS 128

template <typename T, int V> struct alignas(sizeof(T) * V) vec { T v[V]; };

/* ---- add ---- */

template <typename T, int V>
__global__ void bias_add_kernel(T *x, const T *b, size_t units, size_t units_per_row) {
  for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < units;
       u += (size_t)gridDim.x * blockDim.x) {
    size_t j = (u % units_per_row) * V;
    vec<T, V> xv = *(const vec<T, V> *)(x + u * V);
    vec<T, V> bv = *(const vec<T, V> *)(b + j);
#pragma unroll
    for (int e = 0; e < V; e++)
      xv.v[e] = tz_st<T>(__fadd_rn(tz_ld(xv.v[e]), tz_ld(bv.v[e])));
    *(vec<T, V> *)(x + u * V) = xv;
  }
}

template <typename T, int V>
static int launch_add(struct tz_cuda *c, void *x, const void *b, int N, int n) {
  size_t units_per_row = (size_t)n / V, units = (size_t)N * units_per_row;
  bias_add_kernel<T, V><<<tz_cuda_grid(c, units, ADD_THREADS), ADD_THREADS, 0, c->stream>>>(
      (T *)x, (const T *)b, units, units_per_row);
  TZ_CU_LAUNCHED();
  return 0;
}

int tz_cuda_bias_add(void *ctx, void *x, const void *b, int N, int n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    if (n % V == 0 && tz_cuda_aligned16(x) && tz_cuda_aligned16(b))
      return launch_add<T, V>(c, x, b, N, n);
    return launch_add<T, 1>(c, x, b, N, n);
  });
}

/* ---- grad ---- */

/* Block (part p, column strip s): 32 lanes x WARPS warps; lane l owns columns
 * s * 32 V + l V ... + V - 1 (those below n), warp w the rows of part p congruent to w. */
template <typename T, int V>
__global__ void __launch_bounds__(32 * WARPS)
    bias_grad_part_kernel(float *part, const T *dy, int N, int n) {
  __shared__ float sh[WARPS][32 * V];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = (blockIdx.y * 32 + lane) * V;
  const bool owner = j0 < n; /* with V > 1, n % V == 0: all V columns exist */
  const int r_begin = blockIdx.x * PART_ROWS;
  const int r_end = min(r_begin + PART_ROWS, N);
  float acc[V];
#pragma unroll
  for (int e = 0; e < V; e++)
    acc[e] = 0.0f;
  if (owner) {
    int r = r_begin + warp;
    /* UNROLL rows loaded, then added in row order: the loads are in flight together */
    for (; r + (UNROLL - 1) * WARPS < r_end; r += UNROLL * WARPS) {
      vec<T, V> in[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; u++)
        in[u] = *(const vec<T, V> *)(dy + (size_t)(r + u * WARPS) * n + j0);
#pragma unroll
      for (int u = 0; u < UNROLL; u++)
#pragma unroll
        for (int e = 0; e < V; e++)
          acc[e] = __fadd_rn(acc[e], tz_ld(in[u].v[e]));
    }
    for (; r < r_end; r += WARPS) {
      vec<T, V> in = *(const vec<T, V> *)(dy + (size_t)r * n + j0);
#pragma unroll
      for (int e = 0; e < V; e++)
        acc[e] = __fadd_rn(acc[e], tz_ld(in.v[e]));
    }
  }
#pragma unroll
  for (int e = 0; e < V; e++)
    sh[warp][lane * V + e] = acc[e];
  __syncthreads();
  /* the part's sum, warps in order: thread t of the block finishes columns t, t + 32 WARPS, ... */
  for (int col = threadIdx.x; col < 32 * V; col += 32 * WARPS) {
    int j = blockIdx.y * 32 * V + col;
    if (j >= n)
      continue;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; w++)
      s = __fadd_rn(s, sh[w][col]);
    part[(size_t)blockIdx.x * n + j] = s;
  }
}

/* db[j] += sum over parts in increasing order of part[p][j] */
template <typename TG>
__global__ void bias_grad_total_kernel(TG *db, const float *part, int n_parts, int n) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n)
    return;
  float acc = 0.0f;
  int p = 0;
  for (; p + UNROLL <= n_parts; p += UNROLL) { /* UNROLL loads in flight, added in order */
    float v[UNROLL];
#pragma unroll
    for (int i = 0; i < UNROLL; i++)
      v[i] = part[(size_t)(p + i) * n + j];
#pragma unroll
    for (int i = 0; i < UNROLL; i++)
      acc = __fadd_rn(acc, v[i]);
  }
  for (; p < n_parts; p++)
    acc = __fadd_rn(acc, part[(size_t)p * n + j]);
  db[j] = tz_st<TG>(__fadd_rn(tz_ld(db[j]), acc));
}

template <typename T, int V>
static int launch_part(struct tz_cuda *c, float *part, const void *dy, int N, int n, int n_parts) {
  unsigned strips = (unsigned)(((size_t)n + 32 * V - 1) / (32 * V));
  bias_grad_part_kernel<T, V>
      <<<dim3((unsigned)n_parts, strips), 32 * WARPS, 0, c->stream>>>(part, (const T *)dy, N, n);
  TZ_CU_LAUNCHED();
  return 0;
}

int tz_cuda_bias_grad(void *ctx, void *db, const void *dy, int N, int n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  int n_parts = (N + PART_ROWS - 1) / PART_ROWS;
  if ((n + 31) / 32 > 65535)
    return tz_err_set(TZ_EINVAL, "compute cuda bias_grad: n=%d columns is more than %d", n,
                      65535 * 32);
  void *scratch;
  TZ_CHECK(tz_cuda_scratch(c, (size_t)n_parts * (size_t)n * sizeof(float), &scratch));
  float *part = (float *)scratch;
  TZ_CHECK(tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = 16 / sizeof(T);
    if (n % V == 0 && tz_cuda_aligned16(dy))
      return launch_part<T, V>(c, part, dy, N, n, n_parts);
    return launch_part<T, 1>(c, part, dy, N, n, n_parts);
  }));
  return tz_cuda_dispatch(c->G, [&](auto gtag) {
    using TG = decltype(gtag);
    unsigned blocks = (unsigned)((n + TOTAL_THREADS - 1) / TOTAL_THREADS);
    bias_grad_total_kernel<TG><<<blocks, TOTAL_THREADS, 0, c->stream>>>((TG *)db, part, n_parts, n);
    TZ_CU_LAUNCHED();
    return 0;
  });
}
