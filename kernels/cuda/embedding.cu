/* Token embedding. Forward copies rows. Backward scatters gradient rows into dwte by token with
 * one owner per vocabulary row and no floating-point atomics: the positions are sorted by (token,
 * position), so that each token's positions form one run in increasing order; the block at the
 * start of a run owns the row and adds the run's rows of dout in that order, as compute.h asks.
 * Work is linear in the positions (an owner scanning every later position for its token made it
 * quadratic: 52 ms of llama-3b's step at 8192 positions). Tokens outside [0, V) are recorded for
 * the next sync and skipped. */
#include <stdint.h>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

#define THREADS 256

template <typename T>
__global__ void embedding_fwd_kernel(T *out, const int32_t *tokens, const T *wte, int N, int C,
                                     int V, int *err) {
  size_t total = (size_t)N * C;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    int n = (int)(i / (size_t)C), j = (int)(i % (size_t)C);
    int tok = tokens[n];
    if (tok < 0 || tok >= V) {
      if (j == 0)
        tz_cuda_report(err, TZ_CUDA_BAD_EMBED_FWD, n, tok, V);
      continue;
    }
    out[i] = wte[(size_t)tok * C + j];
  }
}

/* keys[n] = token << 32 | n: sorted, the positions of each token are contiguous and in
 * increasing n. A token outside [0, V) is recorded and keyed past every valid one. */
__global__ void embedding_keys_kernel(uint64_t *keys, const int32_t *tokens, int N, int V,
                                      int *err) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    int tok = tokens[n];
    uint64_t t = (uint32_t)tok;
    if (tok < 0 || tok >= V) {
      tz_cuda_report(err, TZ_CUDA_BAD_EMBED_BWD, n, tok, V);
      t = 0xffffffffu;
    }
    keys[n] = t << 32 | (uint32_t)n;
  }
}

/* Block (i, column tile) of the sorted keys: if i starts its token v's run, sums the dout rows
 * of the run for this tile's columns, in increasing position, in float, and adds the sum onto
 * dwte[v] once (compute.h: an accumulating op adds its whole contribution once per element). */
template <typename TG, typename TS>
__global__ void embedding_bwd_kernel(TG *dwte, const TS *dout, const uint64_t *sorted, int N, int C,
                                     int V) {
  int i = blockIdx.x;
  uint32_t v = (uint32_t)(sorted[i] >> 32);
  if (v >= (uint32_t)V || (i > 0 && (uint32_t)(sorted[i - 1] >> 32) == v))
    return; /* the whole block leaves: the condition is the same for all its threads */
  int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= C)
    return;
  float acc = 0.0f;
  for (int k = i; k < N && (uint32_t)(sorted[k] >> 32) == v; k++)
    acc = __fadd_rn(acc, tz_ld(dout[(size_t)(uint32_t)sorted[k] * C + j]));
  TG *w = dwte + (size_t)v * C + j;
  *w = tz_st<TG>(__fadd_rn(tz_ld(*w), acc));
}

int tz_cuda_embedding_fwd(void *ctx, void *out, const int32_t *tokens, const void *wte, int N,
                          int C, int V) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using T = decltype(tag);
    embedding_fwd_kernel<T><<<tz_cuda_grid(c, (size_t)N * C, THREADS), THREADS, 0, c->stream>>>(
        (T *)out, tokens, (const T *)wte, N, C, V, c->err_dev);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_embedding_bwd(void *ctx, void *dwte, const void *dout, const int32_t *tokens, int N,
                          int C, int V) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  unsigned col_tiles = (unsigned)((C + THREADS - 1) / THREADS);
  if (col_tiles > 65535)
    return tz_err_set(TZ_EINVAL, "compute cuda embedding_bwd: C=%d is too wide", C);
  if (N <= 0)
    return 0;
  /* Scratch: the keys, the sorted keys, then the sort's own temporary storage. */
  size_t sort_bytes = 0, keys_bytes = ((size_t)N * sizeof(uint64_t) + 255) / 256 * 256;
  TZ_CU(cub::DeviceRadixSort::SortKeys(NULL, sort_bytes, (const uint64_t *)NULL, (uint64_t *)NULL,
                                       N, 0, 64, c->stream));
  void *scratch;
  TZ_CHECK(tz_cuda_scratch(c, 2 * keys_bytes + sort_bytes, &scratch));
  uint64_t *keys = (uint64_t *)scratch, *sorted = (uint64_t *)((char *)scratch + keys_bytes);
  void *tmp = (char *)scratch + 2 * keys_bytes;
  embedding_keys_kernel<<<tz_cuda_grid(c, (size_t)N, THREADS), THREADS, 0, c->stream>>>(
      keys, tokens, N, V, c->err_dev);
  TZ_CU_LAUNCHED();
  TZ_CU(cub::DeviceRadixSort::SortKeys(tmp, sort_bytes, keys, sorted, N, 0, 64, c->stream));
  dim3 grid((unsigned)N, col_tiles);
  return tz_cuda_dispatch(c->G, [&](auto gtag) {
    using TG = decltype(gtag);
    return tz_cuda_dispatch(c->S, [&](auto stag) {
      using TS = decltype(stag);
      embedding_bwd_kernel<TG, TS>
          <<<grid, THREADS, 0, c->stream>>>((TG *)dwte, (const TS *)dout, sorted, N, C, V);
      TZ_CU_LAUNCHED();
      return 0;
    });
  });
}
