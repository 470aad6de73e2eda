/* Token embedding. Forward copies rows. Backward scatters gradient rows into dwte by token with
 * one owner per vocabulary row and no floating-point atomics: the owner of row v is the first
 * position n with tokens[n] == v (found with an integer atomicMin, whose result does not depend
 * on the order the atomics land in); it walks the positions from n upward and adds each matching
 * row of dout in increasing n, as compute.h asks. Tokens outside [0, V) are recorded for the next
 * sync and skipped. */
#include <limits.h>

#include "kernels/cuda/common.cuh"

#define THREADS 256
#define TOKEN_TILE 1024 /* positions staged in shared memory at a time by an owner */

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

/* first[v] = INT_MAX for every token present (the same value from every writer). */
__global__ void first_reset_kernel(int *first, const int32_t *tokens, int N, int V, int *err) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    int tok = tokens[n];
    if (tok < 0 || tok >= V)
      tz_cuda_report(err, TZ_CUDA_BAD_EMBED_BWD, n, tok, V);
    else
      first[tok] = INT_MAX;
  }
}

__global__ void first_min_kernel(int *first, const int32_t *tokens, int N, int V) {
  for (int n = blockIdx.x * blockDim.x + threadIdx.x; n < N; n += gridDim.x * blockDim.x) {
    int tok = tokens[n];
    if (tok >= 0 && tok < V)
      atomicMin(&first[tok], n);
  }
}

/* Block (n, column tile): if n is the first position of its token v, sums the dout rows m >= n
 * with tokens[m] == v for this tile's columns, in increasing m, in float, and adds the sum onto
 * dwte[v] once (compute.h: an accumulating op adds its whole contribution once per element). */
template <typename TG, typename TS>
__global__ void embedding_bwd_kernel(TG *dwte, const TS *dout, const int32_t *tokens,
                                     const int *first, int N, int C, int V) {
  __shared__ int stok[TOKEN_TILE];
  int n = blockIdx.x;
  int v = tokens[n];
  if (v < 0 || v >= V || first[v] != n)
    return; /* the whole block leaves: the condition is the same for all its threads */
  int j = blockIdx.y * blockDim.x + threadIdx.x;
  float acc = 0.0f;
  for (int m0 = n; m0 < N; m0 += TOKEN_TILE) {
    int cnt = N - m0 < TOKEN_TILE ? N - m0 : TOKEN_TILE;
    __syncthreads(); /* the previous tile has been read */
    for (int i = threadIdx.x; i < cnt; i += blockDim.x)
      stok[i] = tokens[m0 + i];
    __syncthreads();
    if (j < C)
      for (int i = 0; i < cnt; i++)
        if (stok[i] == v)
          acc = __fadd_rn(acc, tz_ld(dout[(size_t)(m0 + i) * C + j]));
  }
  if (j < C) {
    TG *w = dwte + (size_t)v * C + j;
    *w = tz_st<TG>(__fadd_rn(tz_ld(*w), acc));
  }
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
  void *scratch;
  TZ_CHECK(tz_cuda_scratch(c, (size_t)V * sizeof(int), &scratch));
  int *first = (int *)scratch;
  unsigned g = tz_cuda_grid(c, (size_t)N, THREADS);
  first_reset_kernel<<<g, THREADS, 0, c->stream>>>(first, tokens, N, V, c->err_dev);
  TZ_CU_LAUNCHED();
  first_min_kernel<<<g, THREADS, 0, c->stream>>>(first, tokens, N, V);
  TZ_CU_LAUNCHED();
  unsigned col_tiles = (unsigned)((C + THREADS - 1) / THREADS);
  if (col_tiles > 65535)
    return tz_err_set(TZ_EINVAL, "compute cuda embedding_bwd: C=%d is too wide", C);
  dim3 grid((unsigned)N, col_tiles);
  return tz_cuda_dispatch(c->G, [&](auto gtag) {
    using TG = decltype(gtag);
    return tz_cuda_dispatch(c->S, [&](auto stag) {
      using TS = decltype(stag);
      embedding_bwd_kernel<TG, TS><<<grid, THREADS, 0, c->stream>>>(
          (TG *)dwte, (const TS *)dout, tokens, first, N, C, V);
      TZ_CU_LAUNCHED();
      return 0;
    });
  });
}
