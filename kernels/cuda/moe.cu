/* The mixture-of-experts ops (kernels/compute.h, "Mixture of experts") on the GPU: simple
 * kernels, deterministic, no floating-point atomics. The routing is a row per thread; the
 * grouping by expert is a radix sort of (expert, assignment) keys, so that each expert's rows are
 * in increasing assignment order as the contract asks, and the offsets come from the sorted keys;
 * the column sums of the probabilities are a block per expert with a fixed tree. The sums over a
 * token's k experts (scatter, combine) take its slots in increasing order, k at most
 * TZ_CUDA_MOE_MAX_K. The experts' projections are the backend's matmuls on each expert's rows. */
#include <stdint.h>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

#define THREADS 256
#define TZ_CUDA_MOE_MAX_K 32

template <typename T> __device__ __forceinline__ float tz_round_to(float x) {
  return tz_ld(tz_st<T>(x));
}

/* A row per thread: softmax in float, the k largest (ties to the lower expert), their weights
 * (renormalised with norm) rounded to T; keys[n*k + j] = expert << 32 | n*k + j. */
template <typename T>
__global__ void moe_route_kernel(float *probs, int32_t *idx, float *w, uint64_t *keys,
                                 const T *logits, int N, int E, int k, int norm) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    const T *l = logits + (size_t)n * E;
    float *p = probs + (size_t)n * E;
    float m = -INFINITY, sum = 0.0f;
    for (int e = 0; e < E; e++)
      m = fmaxf(m, tz_ld(l[e]));
    for (int e = 0; e < E; e++) {
      float v = expf(tz_ld(l[e]) - m);
      p[e] = v;
      sum += v;
    }
    for (int e = 0; e < E; e++)
      p[e] /= sum;
    int32_t *ix = idx + (size_t)n * k;
    float *wr = w + (size_t)n * k, s = 0.0f;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int i = 0; i < j && !taken; i++)
          taken = ix[i] == e;
        if (!taken && (best < 0 || p[e] > p[best]))
          best = e;
      }
      ix[j] = best;
      wr[j] = p[best];
      s += p[best];
    }
    for (int j = 0; j < k; j++) {
      float v = norm ? wr[j] / s : wr[j];
      wr[j] = tz_round_to<T>(v);
      size_t a = (size_t)n * k + j;
      keys[a] = (uint64_t)(uint32_t)ix[j] << 32 | (uint32_t)a;
    }
  }
}

/* From the sorted keys: rows, slot, and each expert's first row (offsets[e] = the first p whose
 * expert is at least e; offsets[E] = M). */
__global__ void moe_group_kernel(int32_t *rows, int32_t *slot, int32_t *offsets,
                                 const uint64_t *sorted, int M, int E, int k) {
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < M; p += gridDim.x * blockDim.x) {
    uint32_t a = (uint32_t)sorted[p];
    int e = (int)(sorted[p] >> 32), prev = p == 0 ? -1 : (int)(sorted[p - 1] >> 32);
    rows[p] = (int32_t)(a / (uint32_t)k);
    slot[a] = p;
    for (int f = prev + 1; f <= e; f++)
      offsets[f] = p;
    if (p == M - 1)
      for (int f = e + 1; f <= E; f++)
        offsets[f] = M;
  }
}

/* offsets of an empty batch: every expert's rows [0, 0) */
__global__ void moe_empty_kernel(int32_t *offsets, int E) {
  for (int f = threadIdx.x; f <= E; f += blockDim.x)
    offsets[f] = 0;
}

/* Block e: stats[e] += its assignments, stats[E + e] += the sum of probs[n][e] over n, each
 * thread's rows in increasing order, then a fixed tree over the threads. */
__global__ void moe_stats_kernel(float *stats, const float *probs, const int32_t *offsets, int N,
                                 int E) {
  __shared__ float part[THREADS];
  int e = blockIdx.x;
  float acc = 0.0f;
  for (int n = threadIdx.x; n < N; n += blockDim.x)
    acc += probs[(size_t)n * E + e];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s)
      part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    stats[e] += (float)(offsets[e + 1] - offsets[e]);
    stats[E + e] += part[0];
  }
}

template <typename T>
__global__ void moe_route_bwd_kernel(T *dlogits, const float *probs, const int32_t *idx,
                                     const float *w, const float *dw, const float *daux, int N,
                                     int E, int k, int norm) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    const float *p = probs + (size_t)n * E, *wr = w + (size_t)n * k, *g = dw + (size_t)n * k;
    const int32_t *ix = idx + (size_t)n * k;
    float s = 0.0f, gw = 0.0f, dot = 0.0f;
    for (int j = 0; j < k; j++) {
      s += p[ix[j]];
      gw += g[j] * wr[j];
    }
    /* the gradient at probs: daux, plus the weights' through their renormalisation */
    for (int e = 0; e < E; e++) {
      float d = daux ? daux[e] : 0.0f;
      for (int j = 0; j < k; j++)
        if (ix[j] == e)
          d += norm ? (g[j] - gw) / s : g[j];
      dot += p[e] * d;
    }
    for (int e = 0; e < E; e++) {
      float d = daux ? daux[e] : 0.0f;
      for (int j = 0; j < k; j++)
        if (ix[j] == e)
          d += norm ? (g[j] - gw) / s : g[j];
      dlogits[(size_t)n * E + e] = tz_st<T>(p[e] * (d - dot));
    }
  }
}

template <typename T>
__global__ void moe_gather_kernel(T *xs, const T *x, const int32_t *rows, int M, int C) {
  size_t total = (size_t)M * C;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t p = i / (size_t)C, c = i % (size_t)C;
    xs[i] = x[(size_t)rows[p] * C + c];
  }
}

/* Token n's k slots in increasing order, with their j. */
__device__ __forceinline__ void sorted_slots(const int32_t *slot, int n, int k, int32_t *s,
                                             int *js) {
  for (int j = 0; j < k; j++) {
    int32_t v = slot[(size_t)n * k + j];
    int i = j;
    for (; i > 0 && s[i - 1] > v; i--) {
      s[i] = s[i - 1];
      js[i] = js[i - 1];
    }
    s[i] = v;
    js[i] = j;
  }
}

/* out[n][c] = res[n][c] + sum over the token's slots of w * y (combine), or the sum of dxs
 * (scatter: w NULL, res NULL). */
template <typename T>
__global__ void moe_sum_kernel(T *out, const T *res, const T *y, const float *w,
                               const int32_t *slot, int N, int k, int C) {
  size_t total = (size_t)N * C;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    int n = (int)(i / (size_t)C), c = (int)(i % (size_t)C);
    int32_t s[TZ_CUDA_MOE_MAX_K];
    int js[TZ_CUDA_MOE_MAX_K];
    sorted_slots(slot, n, k, s, js);
    float acc = 0.0f;
    for (int q = 0; q < k; q++) {
      float v = tz_ld(y[(size_t)s[q] * C + c]);
      acc += w ? w[(size_t)n * k + js[q]] * v : v;
    }
    out[i] = tz_st<T>(res ? tz_ld(res[i]) + acc : acc);
  }
}

/* A warp per assignment a = n*k + j: dy row slot[a] = w[a] * dout row n; dw[a] = dout row n . y
 * row slot[a], each lane's columns in order, then a fixed shuffle tree. */
template <typename T>
__global__ void moe_combine_bwd_kernel(T *dy, float *dw, const T *dout, const T *y, const float *w,
                                       const int32_t *slot, int M, int k, int C) {
  int lane = threadIdx.x & 31, warps = (gridDim.x * blockDim.x) >> 5;
  for (int a = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; a < M; a += warps) {
    size_t p = (size_t)slot[a], n = (size_t)(a / k);
    float wa = w[a], dot = 0.0f;
    for (int c = lane; c < C; c += 32) {
      float g = tz_ld(dout[n * C + c]);
      dot += g * tz_ld(y[p * C + c]);
      dy[p * C + c] = tz_st<T>(wa * g);
    }
    for (int s = 16; s > 0; s >>= 1)
      dot += __shfl_down_sync(0xffffffffu, dot, s);
    if (lane == 0)
      dw[a] = dot;
  }
}

/* Qwen2-MoE's shared-expert gate: out row n = res row n + sigmoid(s[n]) * y row n, in float,
 * rounded once; out may alias res (each element read before it is written). */
template <typename T>
__global__ void moe_gate_fwd_kernel(T *out, const T *res, const T *y, const T *s, int N, int C) {
  size_t total = (size_t)N * C;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    float g = 1.0f / (1.0f + expf(-tz_ld(s[i / (size_t)C])));
    out[i] = tz_st<T>(tz_ld(res[i]) + g * tz_ld(y[i]));
  }
}

/* A warp per row: dy row n = sigmoid(s[n]) * dout row n; ds[n] = g (1 - g) (dout row n . y row
 * n), each lane's columns in order, then a fixed shuffle tree. */
template <typename T>
__global__ void moe_gate_bwd_kernel(T *dy, T *ds, const T *dout, const T *y, const T *s, int N,
                                    int C) {
  int lane = threadIdx.x & 31, warps = (gridDim.x * blockDim.x) >> 5;
  for (int n = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; n < N; n += warps) {
    size_t row = (size_t)n * C;
    float g = 1.0f / (1.0f + expf(-tz_ld(s[n]))), dot = 0.0f;
    for (int c = lane; c < C; c += 32) {
      float d = tz_ld(dout[row + c]);
      dot += d * tz_ld(y[row + c]);
      dy[row + c] = tz_st<T>(g * d);
    }
    for (int o = 16; o > 0; o >>= 1)
      dot += __shfl_down_sync(0xffffffffu, dot, o);
    if (lane == 0)
      ds[n] = tz_st<T>(g * (1.0f - g) * dot);
  }
}

int tz_cuda_moe_route(void *ctx, const struct tz_moe_route *r, float *stats, const void *logits,
                      int N, int E, int k, int norm) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  int M = N * k;
  if (M == 0) {
    moe_empty_kernel<<<1, THREADS, 0, c->stream>>>(r->offsets, E);
    TZ_CU_LAUNCHED();
    return 0;
  }
  size_t sort_bytes = 0, keys_bytes = ((size_t)M * sizeof(uint64_t) + 255) / 256 * 256;
  TZ_CU(cub::DeviceRadixSort::SortKeys(NULL, sort_bytes, (const uint64_t *)NULL, (uint64_t *)NULL,
                                       M, 0, 64, c->stream));
  void *scratch;
  TZ_CHECK(tz_cuda_scratch(c, 2 * keys_bytes + sort_bytes, &scratch));
  uint64_t *keys = (uint64_t *)scratch, *sorted = (uint64_t *)((char *)scratch + keys_bytes);
  void *tmp = (char *)scratch + 2 * keys_bytes;
  TZ_CHECK(tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    moe_route_kernel<T><<<tz_cuda_grid(c, (size_t)N, THREADS), THREADS, 0, c->stream>>>(
        r->probs, r->idx, r->w, keys, (const T *)logits, N, E, k, norm);
    TZ_CU_LAUNCHED();
    return 0;
  }));
  TZ_CU(cub::DeviceRadixSort::SortKeys(tmp, sort_bytes, keys, sorted, M, 0, 64, c->stream));
  moe_group_kernel<<<tz_cuda_grid(c, (size_t)M, THREADS), THREADS, 0, c->stream>>>(
      r->rows, r->slot, r->offsets, sorted, M, E, k);
  TZ_CU_LAUNCHED();
  if (stats) {
    moe_stats_kernel<<<E, THREADS, 0, c->stream>>>(stats, r->probs, r->offsets, N, E);
    TZ_CU_LAUNCHED();
  }
  return 0;
}

int tz_cuda_moe_route_bwd(void *ctx, void *dlogits, const struct tz_moe_route *r, const float *dw,
                          const float *daux, int N, int E, int k, int norm) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    moe_route_bwd_kernel<T><<<tz_cuda_grid(c, (size_t)N, THREADS), THREADS, 0, c->stream>>>(
        (T *)dlogits, r->probs, r->idx, r->w, dw, daux, N, E, k, norm);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_moe_gather(void *ctx, void *xs, const void *x, const int32_t *rows, int M, int C) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    moe_gather_kernel<T><<<tz_cuda_grid(c, (size_t)M * C, THREADS), THREADS, 0, c->stream>>>(
        (T *)xs, (const T *)x, rows, M, C);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

static int moe_k(int k, const char *op) {
  if (k > TZ_CUDA_MOE_MAX_K)
    return tz_err_set(TZ_ENOTSUP,
                      "compute cuda %s: %d experts a token, more than the %d its "
                      "kernels take",
                      op, k, TZ_CUDA_MOE_MAX_K);
  return 0;
}

int tz_cuda_moe_scatter(void *ctx, void *dx, const void *dxs, const int32_t *slot, int N, int k,
                        int C) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CHECK(moe_k(k, "moe_scatter"));
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    moe_sum_kernel<T><<<tz_cuda_grid(c, (size_t)N * C, THREADS), THREADS, 0, c->stream>>>(
        (T *)dx, (const T *)NULL, (const T *)dxs, (const float *)NULL, slot, N, k, C);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_moe_combine(void *ctx, void *out, const void *res, const void *y, const float *w,
                        const int32_t *slot, int N, int k, int C) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CHECK(moe_k(k, "moe_combine"));
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    moe_sum_kernel<T><<<tz_cuda_grid(c, (size_t)N * C, THREADS), THREADS, 0, c->stream>>>(
        (T *)out, (const T *)res, (const T *)y, w, slot, N, k, C);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_moe_combine_bwd(void *ctx, void *dy, float *dw, const void *dout, const void *y,
                            const float *w, const int32_t *slot, int N, int k, int C) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  int M = N * k;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    moe_combine_bwd_kernel<T><<<tz_cuda_grid(c, (size_t)M * 32, THREADS), THREADS, 0, c->stream>>>(
        (T *)dy, dw, (const T *)dout, (const T *)y, w, slot, M, k, C);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_moe_gate_fwd(void *ctx, void *out, const void *res, const void *y, const void *s, int N,
                         int C) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    moe_gate_fwd_kernel<T><<<tz_cuda_grid(c, (size_t)N * C, THREADS), THREADS, 0, c->stream>>>(
        (T *)out, (const T *)res, (const T *)y, (const T *)s, N, C);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_moe_gate_bwd(void *ctx, void *dy, void *ds, const void *dout, const void *y,
                         const void *s, int N, int C) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    moe_gate_bwd_kernel<T><<<tz_cuda_grid(c, (size_t)N * 32, THREADS), THREADS, 0, c->stream>>>(
        (T *)dy, (T *)ds, (const T *)dout, (const T *)y, (const T *)s, N, C);
    TZ_CU_LAUNCHED();
    return 0;
  });
}
