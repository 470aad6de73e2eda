/* tz_compute_sum and tz_compute_sumsq in exactly the order compute.h fixes: one warp per chunk of
 * TZ_SUM_CHUNK elements, lane l summing elements l, l+32, ... of its chunk, then a shuffle-down
 * tree; levels of partials reduced the same way until one is left. The cpu backend follows the
 * same order, so both give the same bits for the same input. */
#include "kernels/cuda/common.cuh"

#define THREADS 256
#define WARPS_PER_BLOCK (THREADS / 32)

/* One level: x (n) -> partials (ceil(n / TZ_SUM_CHUNK)); with out non-NULL there is one chunk and
 * its partial R goes to *out = (accumulate ? *out : 0) + R. */
template <typename T>
__global__ void sum_level_kernel(const T *x, size_t n, int square, float *partials, float *out,
                                 int accumulate) {
  size_t chunk = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  unsigned lane = threadIdx.x & 31u;
  size_t n_chunks = (n + TZ_SUM_CHUNK - 1) / TZ_SUM_CHUNK;
  if (chunk >= n_chunks)
    return; /* the whole warp leaves together: chunk is the same for its 32 lanes */
  size_t begin = chunk * TZ_SUM_CHUNK;
  size_t len = n - begin < TZ_SUM_CHUNK ? n - begin : TZ_SUM_CHUNK;
  float acc = 0.0f;
  for (size_t i = lane; i < len; i += 32) {
    float v = tz_ld(x[begin + i]);
    if (square)
      v = __fmul_rn(v, v);
    acc = __fadd_rn(acc, v);
  }
  /* lane[l] += lane[l + s] for l < s, s = 16 ... 1 */
  for (int s = 16; s >= 1; s >>= 1)
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, s));
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
  size_t n_chunks = (n + TZ_SUM_CHUNK - 1) / TZ_SUM_CHUNK;
  size_t blocks = (n_chunks + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK;
  if (blocks > 0x7fffffffu)
    return tz_err_set(TZ_EINVAL, "compute cuda sum: %zu elements is too many", n);
  sum_level_kernel<T><<<(unsigned)blocks, THREADS, 0, c->stream>>>(x, n, square, partials, out,
                                                                    accumulate);
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
  size_t n0 = (n + TZ_SUM_CHUNK - 1) / TZ_SUM_CHUNK;
  size_t n1 = (n0 + TZ_SUM_CHUNK - 1) / TZ_SUM_CHUNK;
  size_t off1 = (n0 * sizeof(float) + 255) & ~(size_t)255;
  void *scratch = NULL;
  if (n0 > 1)
    TZ_CHECK(tz_cuda_scratch(c, off1 + n1 * sizeof(float), &scratch));
  float *bufs[2] = {(float *)scratch, scratch ? (float *)((char *)scratch + off1) : NULL};
  int rc = tz_cuda_dispatch(dt, [&](auto tag) {
    using T = decltype(tag);
    return launch_level<T>(c, (const T *)x, n, square, bufs[0], n0 == 1 ? out : NULL,
                           accumulate);
  });
  TZ_CHECK(rc);
  /* Each further level reads one buffer and writes the other; a level's partials are at most
   * n1 long after the first, so both fit. */
  size_t len = n0;
  int cur = 0;
  while (len > 1) {
    size_t next = (len + TZ_SUM_CHUNK - 1) / TZ_SUM_CHUNK;
    TZ_CHECK(launch_level<float>(c, bufs[cur], len, 0, bufs[cur ^ 1], next == 1 ? out : NULL,
                                 accumulate));
    cur ^= 1;
    len = next;
  }
  return 0;
}
