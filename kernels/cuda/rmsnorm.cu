/* RMSNorm, statistics in float. A block owns a row; the row is cut into chunks of CH columns and
 * thread t of the block owns chunks t, t + THREADS, ...: it sums its chunks' columns in order
 * (chunk by chunk, column by column), then tz_block_sum's fixed tree combines the threads. A
 * chunk is one 16-byte load of 16-bit storage (two of f32) where every row is 16-byte aligned,
 * single loads of the same columns in the same order elsewhere, so alignment changes no bit. A
 * thread keeps up to MAX_CACHE of its chunks in registers between the sum and the pass that writes
 * (rows of up to 8192 columns are read once); chunks past those are read again. The block kernels
 * are built for each CACHE up to that, and a launch takes the smallest that holds the row, so
 * registers a row does not need do not cost occupancy.
 *
 * Rows of at most WARP_MAX_C columns (the per-head q/k norms of Qwen3: N*H rows of the head dim,
 * where a block per row would leave most of its threads idle and the launch would be block
 * scheduling) go one warp per row instead, each lane standing in for the THREADS / 32 threads of
 * the block kernel it would be (lane l for threads l, l + 32, ...), with the same butterflies: the
 * same bits as the block kernel, so the choice between the two changes no result.
 *
 * The weight gradient is a reduction over rows, done without atomics in two passes: fixed segments
 * of ROWS_PER_PART rows are summed in row order per column into a workspace, then the segments'
 * partial sums are added in TOTAL_GROUPS interleaved groups, each in segment order, the groups in
 * order, and the total added to dw. The segment length and the groups are constants, so the order
 * never depends on the device or the launch.
 *
 * The weight offset (compute.h: 0, or Gemma's 1) is added to each weight in float as it is loaded,
 * only where it is not 0, so that an offset of 0 keeps the weight's bits (-0 included). */
#include "kernels/cuda/common.cuh"

#define THREADS 256
#define CH 8                              /* columns in a chunk */
#define MAX_CACHE 4                       /* chunks a thread keeps in registers, at most */
#define WARP_SLOTS (WARP_MAX_C / CH / 32) /* chunks a lane of a row's warp holds */
#define ROWS_PER_PART 64
#define COL_THREADS 128
#define WARP_MAX_C 512      /* widths up to this: one warp per row */
#define VIRT (THREADS / 32) /* the block kernel's warps, one lane of a row's warp each */
#define TOTAL_UNROLL 32     /* parts loaded together before they are added in order */

/* The columns [j0, j0 + CH) of a row (those below C; the rest 0): one or two 16-byte loads where
 * vec (rows 16-byte aligned) and the chunk is whole, single loads otherwise. */
template <typename T>
__device__ __forceinline__ void load_chunk(const T *row, int j0, int C, int vec, float (&v)[CH]) {
  if (vec && j0 + CH <= C) {
#pragma unroll
    for (int h = 0; h < CH; h += tz_vec<T>::n)
      tz_ld16(row + j0 + h, v + h);
  } else {
#pragma unroll
    for (int e = 0; e < CH; e++)
      v[e] = j0 + e < C ? tz_ld(row[j0 + e]) : 0.0f;
  }
}

/* A chunk as stored: CH elements of T in 16-byte words, kept packed in registers (half the
 * registers of floats for 16-bit storage) and converted where used; unpacked, the values of
 * load_chunk's (0 past C). */
template <typename T> struct raw_chunk { uint4 q[CH * sizeof(T) / 16]; };

template <typename T>
__device__ __forceinline__ void load_raw(const T *row, int j0, int C, int vec, raw_chunk<T> &r) {
  if (vec && j0 + CH <= C) {
#pragma unroll
    for (int h = 0; h < (int)(CH * sizeof(T) / 16); h++)
      r.q[h] = *reinterpret_cast<const uint4 *>(row + j0 + h * tz_vec<T>::n);
  } else {
    T *e = reinterpret_cast<T *>(r.q);
#pragma unroll
    for (int i = 0; i < CH; i++)
      e[i] = j0 + i < C ? row[j0 + i] : tz_st<T>(0.0f);
  }
}

template <typename T>
__device__ __forceinline__ void unpack(const raw_chunk<T> &r, float (&v)[CH]) {
  const T *e = reinterpret_cast<const T *>(r.q);
#pragma unroll
  for (int i = 0; i < CH; i++)
    v[i] = tz_ld(e[i]);
}

template <typename T>
__device__ __forceinline__ void store_chunk(T *row, int j0, int C, int vec, const float (&v)[CH]) {
  if (vec && j0 + CH <= C) {
#pragma unroll
    for (int h = 0; h < CH; h += tz_vec<T>::n)
      tz_st16(row + j0 + h, v + h);
  } else {
#pragma unroll
    for (int e = 0; e < CH; e++)
      if (j0 + e < C)
        row[j0 + e] = tz_st<T>(v[e]);
  }
}

/* The weight's chunk at column j0 with the offset: off + w in float, w itself where off is 0 */
template <typename T>
__device__ __forceinline__ void load_w(const T *w, int j0, int C, int vec, float off,
                                       float (&v)[CH]) {
  load_chunk(w, j0, C, vec, v);
  if (off != 0.0f)
#pragma unroll
    for (int e = 0; e < CH; e++)
      v[e] = __fadd_rn(off, v[e]);
}

/* acc + the squares of the chunk's columns below C, in column order */
__device__ __forceinline__ float add_squares(float acc, const float (&v)[CH], int j0, int C) {
#pragma unroll
  for (int e = 0; e < CH; e++)
    if (j0 + e < C)
      acc = __fadd_rn(acc, __fmul_rn(v[e], v[e]));
  return acc;
}

/* acc + (w dy) x over the chunk's columns below C, in column order */
__device__ __forceinline__ float add_wdyx(float acc, const float (&w)[CH], const float (&dy)[CH],
                                          const float (&x)[CH], int j0, int C) {
#pragma unroll
  for (int e = 0; e < CH; e++)
    if (j0 + e < C)
      acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(w[e], dy[e]), x[e]));
  return acc;
}

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

__device__ __forceinline__ float rstd_of(float ss, int C, float eps) {
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)C), eps)));
}

/* The output's chunk at column j0 of the row at base: (x * r) * (off + w) */
template <typename T>
__device__ __forceinline__ void out_chunk(T *out, const T *w, size_t base, int j0, int C, int vec,
                                          const float (&x)[CH], float r, float off) {
  float wv[CH], o[CH];
  load_w(w, j0, C, vec, off, wv);
#pragma unroll
  for (int e = 0; e < CH; e++)
    o[e] = __fmul_rn(__fmul_rn(x[e], r), wv[e]);
  store_chunk(out + base, j0, C, vec, o);
}

/* dx's chunk at column j0 of the row at base: dres + r (w dy - x k), w the offset weight, dres
 * read before dx is written (it may be dx), 0 where there is none */
template <typename T>
__device__ __forceinline__ void load_res(const T *dres, size_t base, int j0, int C, int vec,
                                         float (&res)[CH]) {
  if (dres)
    load_chunk(dres + base, j0, C, vec, res);
  else
#pragma unroll
    for (int e = 0; e < CH; e++)
      res[e] = 0.0f;
}

/* the same with the residual's chunk already loaded (load_res) */
template <typename T>
__device__ __forceinline__ void dx_chunk_res(T *dx, const T *w, size_t base, int j0, int C, int vec,
                                             const float (&dy)[CH], const float (&x)[CH],
                                             const float (&res)[CH], float r, float k, float off) {
  float wv[CH], o[CH];
  load_w(w, j0, C, vec, off, wv);
#pragma unroll
  for (int e = 0; e < CH; e++) {
    float g = __fmul_rn(r, __fsub_rn(__fmul_rn(wv[e], dy[e]), __fmul_rn(x[e], k)));
    o[e] = __fadd_rn(res[e], g);
  }
  store_chunk(dx + base, j0, C, vec, o);
}

template <typename T>
__device__ __forceinline__ void dx_chunk(T *dx, const T *dres, const T *w, size_t base, int j0,
                                         int C, int vec, const float (&dy)[CH],
                                         const float (&x)[CH], float r, float k, float off) {
  float res[CH];
  load_res(dres, base, j0, C, vec, res);
  dx_chunk_res(dx, w, base, j0, C, vec, dy, x, res, r, k, off);
}

/* out = (x * rstd) * (off + w), rstd = 1 / sqrt(mean(x^2) + eps); vec: rows and w 16-byte
 * aligned */
template <typename T, int CACHE>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_fwd_kernel(T *out, float *rstd, const T *x, const T *w, int C, float eps, float off,
                       int vec) {
  __shared__ float sh[32];
  const size_t base = (size_t)blockIdx.x * C;
  const int n_ch = (C + CH - 1) / CH;
  float xs[CACHE][CH];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < CACHE; k++) {
    int ch = threadIdx.x + k * THREADS;
    if (ch < n_ch) {
      load_chunk(x + base, ch * CH, C, vec, xs[k]);
      ss = add_squares(ss, xs[k], ch * CH, C);
    }
  }
  for (int ch = threadIdx.x + CACHE * THREADS; ch < n_ch; ch += THREADS) {
    float v[CH];
    load_chunk(x + base, ch * CH, C, vec, v);
    ss = add_squares(ss, v, ch * CH, C);
  }
  const float r = rstd_of(tz_block_sum(ss, sh), C, eps);
  if (threadIdx.x == 0)
    rstd[blockIdx.x] = r;
    /* out may alias x: a thread writes only the chunks it alone read, after the sum */
#pragma unroll
  for (int k = 0; k < CACHE; k++) {
    int ch = threadIdx.x + k * THREADS;
    if (ch < n_ch)
      out_chunk(out, w, base, ch * CH, C, vec, xs[k], r, off);
  }
  for (int ch = threadIdx.x + CACHE * THREADS; ch < n_ch; ch += THREADS) {
    float v[CH];
    load_chunk(x + base, ch * CH, C, vec, v);
    out_chunk(out, w, base, ch * CH, C, vec, v, r, off);
  }
}

/* The same, one warp per row (C <= WARP_MAX_C, so each virtual thread owns at most one chunk and
 * only the first WARP_SLOTS * 32 own any): lane l holds, for each virtual thread v * 32 + l, that
 * thread's chunk. */
template <typename T>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_fwd_warp_kernel(T *out, float *rstd, const T *x, const T *w, int N, int C, float eps,
                            float off, int vec) {
  const int row = blockIdx.x * VIRT + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N)
    return; /* the whole warp: row is the same for its 32 lanes */
  const size_t base = (size_t)row * C;
  const int n_ch = (C + CH - 1) / CH;
  float xs[WARP_SLOTS][CH], acc[VIRT];
#pragma unroll
  for (int v = 0; v < VIRT; v++)
    acc[v] = 0.0f;
#pragma unroll
  for (int v = 0; v < WARP_SLOTS; v++) {
    int ch = v * 32 + lane;
    if (ch < n_ch) {
      load_chunk(x + base, ch * CH, C, vec, xs[v]);
      acc[v] = add_squares(0.0f, xs[v], ch * CH, C);
    }
  }
  const float r = rstd_of(warp_as_block_sum(acc), C, eps);
  if (lane == 0)
    rstd[row] = r;
#pragma unroll
  for (int v = 0; v < WARP_SLOTS; v++) {
    int ch = v * 32 + lane;
    if (ch < n_ch)
      out_chunk(out, w, base, ch * CH, C, vec, xs[v], r, off);
  }
}

/* dx = dres + r (w dy - x k), k = r^2 mean(w dy x), w the offset weight (off + w): the gradient
 * through the norm for one row; dres NULL adds it to 0. dres may be dx: a thread reads a chunk of
 * it before it writes that chunk. */
template <typename T, int CACHE>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_bwd_dx_kernel(T *dx, const T *dres, const T *dout, const T *x, const T *w,
                          const float *rstd, int C, float off, int vec) {
  __shared__ float sh[32];
  const size_t base = (size_t)blockIdx.x * C;
  const int n_ch = (C + CH - 1) / CH;
  const float r = rstd[blockIdx.x];
  float xs[CACHE][CH], dys[CACHE][CH], wv[CH];
  float dot = 0.0f;
#pragma unroll
  for (int k = 0; k < CACHE; k++) {
    int ch = threadIdx.x + k * THREADS;
    if (ch < n_ch) {
      load_chunk(x + base, ch * CH, C, vec, xs[k]);
      load_chunk(dout + base, ch * CH, C, vec, dys[k]);
      load_w(w, ch * CH, C, vec, off, wv);
      dot = add_wdyx(dot, wv, dys[k], xs[k], ch * CH, C);
    }
  }
  for (int ch = threadIdx.x + CACHE * THREADS; ch < n_ch; ch += THREADS) {
    float xv[CH], dy[CH];
    load_chunk(x + base, ch * CH, C, vec, xv);
    load_chunk(dout + base, ch * CH, C, vec, dy);
    load_w(w, ch * CH, C, vec, off, wv);
    dot = add_wdyx(dot, wv, dy, xv, ch * CH, C);
  }
  dot = tz_block_sum(dot, sh);
  const float kk = __fmul_rn(__fmul_rn(r, r), __fdiv_rn(dot, (float)C));
#pragma unroll
  for (int k = 0; k < CACHE; k++) {
    int ch = threadIdx.x + k * THREADS;
    if (ch < n_ch)
      dx_chunk(dx, dres, w, base, ch * CH, C, vec, dys[k], xs[k], r, kk, off);
  }
  for (int ch = threadIdx.x + CACHE * THREADS; ch < n_ch; ch += THREADS) {
    float xv[CH], dy[CH];
    load_chunk(x + base, ch * CH, C, vec, xv);
    load_chunk(dout + base, ch * CH, C, vec, dy);
    dx_chunk(dx, dres, w, base, ch * CH, C, vec, dy, xv, r, kk, off);
  }
}

/* The same, one warp per row (C <= WARP_MAX_C), as rmsnorm_fwd_warp_kernel. */
template <typename T>
__global__ void __launch_bounds__(THREADS)
    rmsnorm_bwd_dx_warp_kernel(T *dx, const T *dres, const T *dout, const T *x, const T *w,
                               const float *rstd, int N, int C, float off, int vec) {
  const int row = blockIdx.x * VIRT + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= N)
    return;
  const size_t base = (size_t)row * C;
  const int n_ch = (C + CH - 1) / CH;
  const float r = rstd[row];
  float xs[WARP_SLOTS][CH], dys[WARP_SLOTS][CH], wv[CH], acc[VIRT];
#pragma unroll
  for (int v = 0; v < VIRT; v++)
    acc[v] = 0.0f;
#pragma unroll
  for (int v = 0; v < WARP_SLOTS; v++) {
    int ch = v * 32 + lane;
    if (ch < n_ch) {
      load_chunk(x + base, ch * CH, C, vec, xs[v]);
      load_chunk(dout + base, ch * CH, C, vec, dys[v]);
      load_w(w, ch * CH, C, vec, off, wv);
      acc[v] = add_wdyx(0.0f, wv, dys[v], xs[v], ch * CH, C);
    }
  }
  const float dot = warp_as_block_sum(acc);
  const float kk = __fmul_rn(__fmul_rn(r, r), __fdiv_rn(dot, (float)C));
#pragma unroll
  for (int v = 0; v < WARP_SLOTS; v++) {
    int ch = v * 32 + lane;
    if (ch < n_ch)
      dx_chunk(dx, dres, w, base, ch * CH, C, vec, dys[v], xs[v], r, kk, off);
  }
}

/* The backward in one pass (the setting norm_bwd one-pass; rows of WARP_MAX_C < C <= MAX_CACHE *
 * ONEPASS_THREADS * CH columns): block b takes the rows [b * ROWS_PER_BLOCK, ...) in order,
 * computes each row's dx as rmsnorm_bwd_dx_kernel does, in blocks of ONEPASS_THREADS (thread t
 * owns chunks t, t + ONEPASS_THREADS, ...; the residual's chunks loaded with x's and dout's,
 * before the row's sum, so that a row waits for memory once), and keeps its chunks' sums of
 * dy * (x * r) over those rows in registers, in row order, written as part b of the weight
 * gradient: dout and x are read once, where the two-pass backward reads them again for the
 * parts. Chunks stay packed in registers (raw_chunk): at Llama-7B's width a thread holds one of
 * each tensor in 64 registers, two blocks a multiprocessor. dx's and dw's bits differ from the
 * two-pass kernels' (other threads a row, parts of ROWS_PER_BLOCK rows), each fixed by the
 * shape. Measured on an H100 at 8192 x 4096 bf16 with a residual (docs/cuda-kernels.md): 512
 * threads and 32 rows 0.104 ms, 0.92 of a copy of the same bytes; 256 threads 0.110-0.136 at
 * 4 to 32 rows, and 64 rows 0.134-0.149 (too few blocks); the two-pass kernels 0.199. */
#define ROWS_PER_BLOCK 32
#define ONEPASS_THREADS 512
template <typename T, int CACHE, int NT = ONEPASS_THREADS>
__global__ void __launch_bounds__(NT)
    rmsnorm_bwd_onepass_kernel(T *dx, float *part, const T *dres, const T *dout, const T *x,
                               const T *w, const float *rstd, int N, int C, float off, int vec,
                               int rows = ROWS_PER_BLOCK) {
  __shared__ float sh[32];
  const int n_ch = (C + CH - 1) / CH;
  const int n0 = blockIdx.x * rows;
  const int n1 = n0 + rows < N ? n0 + rows : N;
  float acc[CACHE][CH];
#pragma unroll
  for (int k = 0; k < CACHE; k++)
#pragma unroll
    for (int e = 0; e < CH; e++)
      acc[k][e] = 0.0f;
  for (int n = n0; n < n1; n++) {
    const size_t base = (size_t)n * C;
    const float r = rstd[n];
    raw_chunk<T> xr[CACHE], dr[CACHE], rr[CACHE];
#pragma unroll
    for (int k = 0; k < CACHE; k++) {
      int ch = threadIdx.x + k * NT;
      if (ch < n_ch) {
        load_raw(x + base, ch * CH, C, vec, xr[k]);
        load_raw(dout + base, ch * CH, C, vec, dr[k]);
        if (dres)
          load_raw(dres + base, ch * CH, C, vec, rr[k]);
      }
    }
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < CACHE; k++) {
      int ch = threadIdx.x + k * NT;
      if (ch < n_ch) {
        float xv[CH], dy[CH], wv[CH];
        unpack(xr[k], xv);
        unpack(dr[k], dy);
        load_w(w, ch * CH, C, vec, off, wv);
        dot = add_wdyx(dot, wv, dy, xv, ch * CH, C);
      }
    }
    dot = tz_block_sum(dot, sh);
    const float kk = __fmul_rn(__fmul_rn(r, r), __fdiv_rn(dot, (float)C));
#pragma unroll
    for (int k = 0; k < CACHE; k++) {
      int ch = threadIdx.x + k * NT;
      if (ch < n_ch) {
        float xv[CH], dy[CH], res[CH];
        unpack(xr[k], xv);
        unpack(dr[k], dy);
        if (dres)
          unpack(rr[k], res);
        else
#pragma unroll
          for (int e = 0; e < CH; e++)
            res[e] = 0.0f;
        dx_chunk_res(dx, w, base, ch * CH, C, vec, dy, xv, res, r, kk, off);
#pragma unroll
        for (int e = 0; e < CH; e++)
          acc[k][e] = __fadd_rn(acc[k][e], __fmul_rn(dy[e], __fmul_rn(xv[e], r)));
      }
    }
  }
  float *out = part + (size_t)blockIdx.x * C;
#pragma unroll
  for (int k = 0; k < CACHE; k++) {
    int j0 = (threadIdx.x + k * NT) * CH;
#pragma unroll
    for (int e = 0; e < CH; e++)
      if (j0 + e < C)
        out[j0 + e] = acc[k][e];
  }
}

/* part[p][j] = sum over rows [p*ROWS_PER_PART, ...) in order of dy[n][j] * (x[n][j] * r[n]).
 * A thread owns a chunk of CH columns, their sums side by side; rows go UNROLL at a time, their
 * loads issued together, their additions in row order. */
#define PART_UNROLL 4
template <typename T>
__global__ void __launch_bounds__(COL_THREADS)
    rmsnorm_bwd_dw_part_kernel(float *part, const T *dout, const T *x, const float *rstd, int N,
                               int C, int vec) {
  const int ch = blockIdx.y * blockDim.x + threadIdx.x, j0 = ch * CH;
  if (j0 >= C)
    return;
  const int n0 = blockIdx.x * ROWS_PER_PART;
  const int n1 = n0 + ROWS_PER_PART < N ? n0 + ROWS_PER_PART : N;
  float acc[CH];
#pragma unroll
  for (int e = 0; e < CH; e++)
    acc[e] = 0.0f;
  int n = n0;
  for (; n + PART_UNROLL <= n1; n += PART_UNROLL) {
    float dy[PART_UNROLL][CH], xv[PART_UNROLL][CH], r[PART_UNROLL];
#pragma unroll
    for (int u = 0; u < PART_UNROLL; u++) {
      size_t row = (size_t)(n + u) * C;
      load_chunk(dout + row, j0, C, vec, dy[u]);
      load_chunk(x + row, j0, C, vec, xv[u]);
      r[u] = rstd[n + u];
    }
#pragma unroll
    for (int u = 0; u < PART_UNROLL; u++)
#pragma unroll
      for (int e = 0; e < CH; e++)
        acc[e] = __fadd_rn(acc[e], __fmul_rn(dy[u][e], __fmul_rn(xv[u][e], r[u])));
  }
  for (; n < n1; n++) {
    float dy[CH], xv[CH];
    size_t row = (size_t)n * C;
    load_chunk(dout + row, j0, C, vec, dy);
    load_chunk(x + row, j0, C, vec, xv);
    float r = rstd[n];
#pragma unroll
    for (int e = 0; e < CH; e++)
      acc[e] = __fadd_rn(acc[e], __fmul_rn(dy[e], __fmul_rn(xv[e], r)));
  }
  float *out = part + (size_t)blockIdx.x * C;
#pragma unroll
  for (int e = 0; e < CH; e++)
    if (j0 + e < C)
      out[j0 + e] = acc[e];
}

/* dw[j] += the sum of part[p][j] over the parts: TOTAL_GROUPS groups, group g the parts g, g +
 * TOTAL_GROUPS, ... in order, then the groups' sums in group order. A block is TOTAL_COLS
 * columns by the groups, a column's groups in one warp's lanes apart (a warp reads TOTAL_COLS
 * adjacent floats of one part): one thread per column would leave the sum of hundreds of parts
 * (thousands for the q/k norms' N*H rows) to a few thousand threads, all latency. */
#define TOTAL_COLS 32
#define TOTAL_GROUPS 8
template <typename TG>
__global__ void __launch_bounds__(TOTAL_COLS *TOTAL_GROUPS)
    rmsnorm_bwd_dw_total_kernel(TG *dw, const float *part, int n_parts, int C) {
  __shared__ float sums[TOTAL_GROUPS][TOTAL_COLS];
  const int c = threadIdx.x % TOTAL_COLS, g = threadIdx.x / TOTAL_COLS;
  const int j = blockIdx.x * TOTAL_COLS + c;
  /* TOTAL_UNROLL loads in flight at a time, added in order */
  float acc = 0.0f;
  if (j < C) {
    int p = g;
    for (; p + (TOTAL_UNROLL - 1) * TOTAL_GROUPS < n_parts; p += TOTAL_UNROLL * TOTAL_GROUPS) {
      float v[TOTAL_UNROLL];
#pragma unroll
      for (int i = 0; i < TOTAL_UNROLL; i++)
        v[i] = part[(size_t)(p + i * TOTAL_GROUPS) * C + j];
#pragma unroll
      for (int i = 0; i < TOTAL_UNROLL; i++)
        acc = __fadd_rn(acc, v[i]);
    }
    for (; p < n_parts; p += TOTAL_GROUPS)
      acc = __fadd_rn(acc, part[(size_t)p * C + j]);
  }
  sums[g][c] = acc;
  __syncthreads();
  if (g == 0 && j < C) {
    float t = sums[0][c];
#pragma unroll
    for (int q = 1; q < TOTAL_GROUPS; q++)
      t = __fadd_rn(t, sums[q][c]);
    dw[j] = tz_st<TG>(__fadd_rn(tz_ld(dw[j]), t));
  }
}

/* Calls f with a cache_tag of the smallest CACHE (1, 2 or MAX_CACHE) whose
 * chunks hold a row of C columns in a block of NT threads, MAX_CACHE past that. */
template <int V> struct cache_tag { static constexpr int value = V; };
template <int NT = THREADS, typename F> static int with_cache(int C, F f) {
  int per_thread = ((C + CH - 1) / CH + NT - 1) / NT;
  if (per_thread <= 1)
    return f(cache_tag<1>());
  if (per_thread <= 2)
    return f(cache_tag<2>());
  return f(cache_tag<MAX_CACHE>());
}

/* Whether every row of the (N, C) tensors ts and the weight w start on 16 bytes. */
template <typename T> static int rows_aligned(int C, const void *const *ts, int n, const void *w) {
  if (((size_t)C * sizeof(T)) % 16 != 0 || !tz_cuda_aligned16(w))
    return 0;
  for (int i = 0; i < n; i++)
    if (ts[i] && !tz_cuda_aligned16(ts[i]))
      return 0;
  return 1;
}

int tz_cuda_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *x, const void *w, int N,
                        int C, float eps, float w_offset) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    const void *ts[2] = {out, x};
    int vec = rows_aligned<T>(C, ts, 2, w);
    if (C <= WARP_MAX_C) {
      rmsnorm_fwd_warp_kernel<T><<<(unsigned)((N + VIRT - 1) / VIRT), THREADS, 0, c->stream>>>(
          (T *)out, rstd, (const T *)x, (const T *)w, N, C, eps, w_offset, vec);
      TZ_CU_LAUNCHED();
      return 0;
    }
    return with_cache(C, [&](auto cache) {
      rmsnorm_fwd_kernel<T, decltype(cache)::value><<<(unsigned)N, THREADS, 0, c->stream>>>(
          (T *)out, rstd, (const T *)x, (const T *)w, C, eps, w_offset, vec);
      TZ_CU_LAUNCHED();
      return 0;
    });
  });
}

/* dw += the sum of the n_parts parts in order */
static int add_parts(struct tz_cuda *c, void *dw, const float *part, int n_parts, int C) {
  unsigned col_blocks = (unsigned)((C + TOTAL_COLS - 1) / TOTAL_COLS);
  return tz_cuda_dispatch(c->G, [&](auto gtag) {
    using TG = decltype(gtag);
    rmsnorm_bwd_dw_total_kernel<TG>
        <<<col_blocks, TOTAL_COLS * TOTAL_GROUPS, 0, c->stream>>>((TG *)dw, part, n_parts, C);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_rmsnorm_bwd(void *ctx, void *dx, const void *dres, void *dw, const void *dout,
                        const void *x, const void *w, const float *rstd, int N, int C,
                        float w_offset) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  if (c->norm_bwd_onepass && C > WARP_MAX_C && (C + CH - 1) / CH <= MAX_CACHE * ONEPASS_THREADS) {
    int n_blocks = (N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
    void *scratch;
    TZ_CHECK(tz_cuda_scratch(c, (size_t)n_blocks * C * sizeof(float), &scratch));
    float *part = (float *)scratch;
    TZ_CHECK(tz_cuda_dispatch(c->S, [&](auto tag) {
      using T = decltype(tag);
      const void *ts[4] = {dx, dres, dout, x};
      int vec = rows_aligned<T>(C, ts, 4, w);
      return with_cache<ONEPASS_THREADS>(C, [&](auto cache) {
        rmsnorm_bwd_onepass_kernel<T, decltype(cache)::value>
            <<<(unsigned)n_blocks, ONEPASS_THREADS, 0, c->stream>>>(
                (T *)dx, part, (const T *)dres, (const T *)dout, (const T *)x, (const T *)w, rstd,
                N, C, w_offset, vec);
        TZ_CU_LAUNCHED();
        return 0;
      });
    }));
    return add_parts(c, dw, part, n_blocks, C);
  }
  /* parts on the grid's x (up to 2^31 - 1: q/k norms have N*H rows), chunks of columns on y */
  int n_parts = (N + ROWS_PER_PART - 1) / ROWS_PER_PART;
  void *scratch;
  TZ_CHECK(tz_cuda_scratch(c, (size_t)n_parts * C * sizeof(float), &scratch));
  float *part = (float *)scratch;
  /* a thread per chunk: blocks of COL_THREADS, or of the chunks rounded up to a warp where a row
   * has fewer (the q/k norms' 128 columns are 16 chunks) */
  int n_ch = (C + CH - 1) / CH;
  int part_threads = n_ch < COL_THREADS ? (n_ch + 31) / 32 * 32 : COL_THREADS;
  unsigned chunk_blocks = (unsigned)((n_ch + part_threads - 1) / part_threads);
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    const void *ts[4] = {dx, dres, dout, x};
    int vec = rows_aligned<T>(C, ts, 4, w);
    if (C <= WARP_MAX_C) {
      rmsnorm_bwd_dx_warp_kernel<T><<<(unsigned)((N + VIRT - 1) / VIRT), THREADS, 0, c->stream>>>(
          (T *)dx, (const T *)dres, (const T *)dout, (const T *)x, (const T *)w, rstd, N, C,
          w_offset, vec);
      TZ_CU_LAUNCHED();
    } else {
      TZ_CHECK(with_cache(C, [&](auto cache) {
        rmsnorm_bwd_dx_kernel<T, decltype(cache)::value><<<(unsigned)N, THREADS, 0, c->stream>>>(
            (T *)dx, (const T *)dres, (const T *)dout, (const T *)x, (const T *)w, rstd, C,
            w_offset, vec);
        TZ_CU_LAUNCHED();
        return 0;
      }));
    }
    rmsnorm_bwd_dw_part_kernel<T>
        <<<dim3((unsigned)n_parts, chunk_blocks), part_threads, 0, c->stream>>>(
            part, (const T *)dout, (const T *)x, rstd, N, C, vec);
    TZ_CU_LAUNCHED();
    return add_parts(c, dw, part, n_parts, C);
  });
}
