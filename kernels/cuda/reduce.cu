/* tz_compute_sum, tz_compute_sumsq and tz_compute_sumsq_segments in exactly the order compute.h
 * fixes: one warp per chunk of TZ_SUM_CHUNK elements, lane l summing elements l, l+32, ... of its
 * chunk, then a shuffle-down tree; levels of partials reduced the same way until one is left. The
 * cpu backend follows the same order, so both give the same bits for the same input. */
#include "kernels/cuda/common.cuh"

#define THREADS 256
#define WARPS_PER_BLOCK (THREADS / 32)

static __host__ __device__ __forceinline__ size_t n_chunks(size_t n) {
  return (n + TZ_SUM_CHUNK - 1) / TZ_SUM_CHUNK;
}

/* The partial of one chunk x[0, len), len <= TZ_SUM_CHUNK, f(v) = v or v*v: lane l adds
 * f(x[l]), f(x[l+32]), ... in that order from 0, then lane[l] += lane[l + s] for s = 16 ... 1.
 * Every lane of the warp calls it; the partial is in lane 0. A full chunk loads all of a lane's
 * values before adding them, so that its loads are in flight together rather than one per add. */
template <typename T>
__device__ __forceinline__ float warp_chunk_partial(const T *x, size_t len, int square,
                                                    unsigned lane) {
  float acc = 0.0f;
  if (len == TZ_SUM_CHUNK) {
    float v[TZ_SUM_CHUNK / 32];
#pragma unroll
    for (int j = 0; j < TZ_SUM_CHUNK / 32; j++)
      v[j] = tz_ld(x[lane + 32 * j]);
#pragma unroll
    for (int j = 0; j < TZ_SUM_CHUNK / 32; j++)
      acc = __fadd_rn(acc, square ? __fmul_rn(v[j], v[j]) : v[j]);
  } else {
    for (size_t i = lane; i < len; i += 32) {
      float v = tz_ld(x[i]);
      acc = __fadd_rn(acc, square ? __fmul_rn(v, v) : v);
    }
  }
  for (int s = 16; s >= 1; s >>= 1)
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, s));
  return acc;
}

/* One level: x (n) -> partials (n_chunks(n)), a warp per chunk over the whole grid; with out
 * non-NULL there is one chunk and its partial R goes to *out = (accumulate ? *out : 0) + R. */
template <typename T>
__global__ void sum_level_kernel(const T *x, size_t n, int square, float *partials, float *out,
                                 int accumulate) {
  size_t chunk = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  unsigned lane = threadIdx.x & 31u;
  if (chunk >= n_chunks(n))
    return; /* the whole warp leaves together: chunk is the same for its 32 lanes */
  size_t begin = chunk * TZ_SUM_CHUNK;
  size_t len = n - begin < TZ_SUM_CHUNK ? n - begin : TZ_SUM_CHUNK;
  float acc = warp_chunk_partial(x + begin, len, square, lane);
  if (lane == 0) {
    if (out)
      *out = __fadd_rn(accumulate ? *out : 0.0f, acc);
    else
      partials[chunk] = acc;
  }
}

/* n == 0: R = 0, still added to the starting value as compute.h says. */
__global__ void sum_empty_kernel(float *out, int accumulate) {
  *out = __fadd_rn(accumulate ? *out : 0.0f, 0.0f);
}

template <typename T>
static int launch_level(struct tz_cuda *c, const T *x, size_t n, int square, float *partials,
                        float *out, int accumulate) {
  size_t blocks = (n_chunks(n) + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
  if (blocks > 0x7fffffffu)
    return tz_err_set(TZ_EINVAL, "compute cuda sum: %zu elements is too many", n);
  sum_level_kernel<T>
      <<<(unsigned)blocks, THREADS, 0, c->stream>>>(x, n, square, partials, out, accumulate);
  TZ_CU_LAUNCHED();
  return 0;
}

int tz_cuda_sum(void *ctx, float *out, enum tz_dtype dt, const void *x, size_t n, int square,
                int accumulate) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  if (n == 0) {
    sum_empty_kernel<<<1, 1, 0, c->stream>>>(out, accumulate);
    TZ_CU_LAUNCHED();
    return 0;
  }
  /* Scratch holds two consecutive levels of partials: the one being read and the next. */
  size_t n0 = n_chunks(n);
  size_t n1 = n_chunks(n0);
  size_t off1 = (n0 * sizeof(float) + 255) & ~(size_t)255;
  void *scratch = NULL;
  if (n0 > 1)
    TZ_CHECK(tz_cuda_scratch(c, off1 + n1 * sizeof(float), &scratch));
  float *bufs[2] = {(float *)scratch, scratch ? (float *)((char *)scratch + off1) : NULL};
  int rc = tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    return launch_level<T>(c, (const T *)x, n, square, bufs[0], n0 == 1 ? out : NULL, accumulate);
  });
  TZ_CHECK(rc);
  /* Each further level reads one buffer and writes the other; a level's partials are at most
   * n1 long after the first, so both fit. */
  size_t len = n0;
  int cur = 0;
  while (len > 1) {
    size_t next = n_chunks(len);
    TZ_CHECK(launch_level<float>(c, bufs[cur], len, 0, bufs[cur ^ 1], next == 1 ? out : NULL,
                                 accumulate));
    cur ^= 1;
    len = next;
  }
  return 0;
}

/* One level of a block's own reduction: src (n >= 1) -> dst (n_chunks(n)), the block's warps
 * taking its chunks in turn; when that is a single partial R, *out = 0 + R instead (the
 * non-accumulating end of tz_cuda_sum). */
template <typename T>
__device__ __forceinline__ void block_level(const T *src, size_t n, int square, float *dst,
                                            float *out) {
  unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, n_warps = blockDim.x >> 5;
  size_t nc = n_chunks(n);
  for (size_t ci = warp; ci < nc; ci += n_warps) {
    size_t begin = ci * TZ_SUM_CHUNK;
    size_t len = n - begin < TZ_SUM_CHUNK ? n - begin : TZ_SUM_CHUNK;
    float p = warp_chunk_partial(src + begin, len, square, lane);
    if (lane == 0) {
      if (nc == 1)
        *out = __fadd_rn(0.0f, p);
      else
        dst[ci] = p;
    }
  }
}

/* Segment blockIdx.x of x (n_seg, seg_len) -> out[blockIdx.x], all levels in one block. The first
 * level's partials stay in shared memory when there are at most TZ_SUM_CHUNK of them (segments
 * of up to 2^20 elements: the next level is then the last); longer segments keep their levels in
 * global scratch, stride floats per segment, alternating as in tz_cuda_sum. */
template <typename T>
__global__ void sumsq_segments_kernel(const T *x, size_t seg_len, float *scratch, size_t stride,
                                      float *out) {
  __shared__ float sh[TZ_SUM_CHUNK];
  size_t seg = blockIdx.x;
  float *o = out + seg;
  if (seg_len == 0) {
    if (threadIdx.x == 0)
      *o = __fadd_rn(0.0f, 0.0f);
    return;
  }
  size_t nc = n_chunks(seg_len);
  float *cur = sh, *next = NULL; /* the level being read and the one being written */
  if (nc > TZ_SUM_CHUNK) {
    cur = scratch + seg * stride;
    next = cur + nc;
  }
  block_level(x + seg * seg_len, seg_len, 1, cur, o);
  size_t len = nc;
  while (len > 1) {  /* len is the same for the whole block, so every thread reaches the barrier */
    __syncthreads(); /* the level's partials, shared or global, are visible to the whole block */
    block_level<float>(cur, len, 0, next, o);
    float *t = cur;
    cur = next;
    next = t;
    len = n_chunks(len);
  }
}

int tz_cuda_sumsq_segments(void *ctx, float *out, enum tz_dtype dt, const void *x, size_t seg_len,
                           size_t n_seg) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  if (n_seg > 0x7fffffffu)
    return tz_err_set(TZ_EINVAL, "compute cuda sumsq_segments: %zu segments is too many", n_seg);
  size_t nc = n_chunks(seg_len);
  float *scratch = NULL;
  size_t stride = 0;
  if (nc > TZ_SUM_CHUNK) {
    stride = nc + n_chunks(nc);
    void *p;
    TZ_CHECK(tz_cuda_scratch(c, n_seg * stride * sizeof(float), &p));
    scratch = (float *)p;
  }
  /* A warp per chunk, up to WARPS_PER_BLOCK: no idle warps for short segments. */
  unsigned warps = nc < WARPS_PER_BLOCK ? (nc ? (unsigned)nc : 1u) : WARPS_PER_BLOCK;
  return tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    sumsq_segments_kernel<T><<<(unsigned)n_seg, warps * 32, 0, c->stream>>>((const T *)x, seg_len,
                                                                            scratch, stride, out);
    TZ_CU_LAUNCHED();
    return 0;
  });
}
