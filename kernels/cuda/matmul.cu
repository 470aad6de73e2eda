/* GEMM through cuBLASLt. compute.h's matrices are row-major and cuBLASLt's column-major: a
 * row-major (r, c) matrix with leading dimension ld is the column-major (c, r) matrix with the
 * same ld, its transpose. So C = op(A) op(B) is computed as the column-major C^T (N, M) =
 * op(B)^T op(A)^T, with B passed as cuBLASLt's first operand:
 *   - cuBLASLt A := our B, stored (K, N) when trans_b == 0 (column-major (N, K), op N) or (N, K)
 *     when trans_b != 0 (column-major (K, N), op T);
 *   - cuBLASLt B := our A, stored (M, K) when trans_a == 0 (column-major (K, M), op N) or (K, M)
 *     when trans_a != 0 (column-major (M, K), op T);
 *   - C and D: column-major (N, M) with ldc; C is the residual R that beta scales (R is D for
 *     tz_compute_matmul, the residual for tz_compute_matmul_add), D the output.
 * Float32 compute (CUBLAS_COMPUTE_32F, never TF32). The algorithm for each (transposes, sizes,
 * leading dimensions, dtypes, beta == 0, pointer alignments) is asked of the heuristic once and
 * kept in a table with its descriptors: the same call then always runs the same kernel with the
 * same workspace, which is what makes cuBLASLt bit-reproducible. Split-K algorithms may only
 * reduce their partial products in a float workspace: reducing in place would add pieces of the
 * product into C one at a time, and compute.h wants an accumulating call to add its whole
 * product once per element; reducing in the output type would round the pieces to 16 bits.
 * A shape cuBLASLt has no algorithm for (leading dimensions or pointers too poorly aligned for its
 * kernels) runs a plain tiled kernel instead; each such shape is logged once as a warning.
 * TZ_CUDA_MATMUL=plain (read at create) sends every call there, to test that kernel. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"

extern "C" {
#include "core/log.h"
}

struct mm_key {
  int trans_a, trans_b, M, N, K, lda, ldb, ldc;
  int s_dt, c_dt, beta_zero;
  int align_a, align_b, align_c; /* bytes, powers of two up to 256 */
};

struct tz_cuda_mm_entry {
  int used;
  int plain; /* no cuBLASLt algorithm: the plain kernel below */
  struct mm_key key;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;
};

static int alignment(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int al = 256;
  while (al > 1 && (a % (uintptr_t)al) != 0)
    al /= 2;
  return al;
}

static uint64_t key_hash(const struct mm_key *k) {
  /* FNV-1a over the key's ints */
  const int *w = (const int *)k;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof *k / sizeof(int); i++) {
    h ^= (uint32_t)w[i];
    h *= 1099511628211ull;
  }
  return h;
}

static int key_equal(const struct mm_key *a, const struct mm_key *b) {
  return memcmp(a, b, sizeof *a) == 0;
}

static void entry_release(struct tz_cuda_mm_entry *e) {
  if (e->op)
    (void)cublasLtMatmulDescDestroy(e->op);
  if (e->la)
    (void)cublasLtMatrixLayoutDestroy(e->la);
  if (e->lb)
    (void)cublasLtMatrixLayoutDestroy(e->lb);
  if (e->lc)
    (void)cublasLtMatrixLayoutDestroy(e->lc);
  memset(e, 0, sizeof *e);
}

void tz_cuda_matmul_release(struct tz_cuda *c) {
  for (size_t i = 0; i < c->mm_cap; i++)
    if (c->mm[i].used)
      entry_release(&c->mm[i]);
  free(c->mm);
  c->mm = NULL;
  c->mm_cap = c->mm_count = 0;
}

static struct tz_cuda_mm_entry *slot_for(struct tz_cuda_mm_entry *tab, size_t cap,
                                         const struct mm_key *k) {
  size_t i = (size_t)(key_hash(k) & (cap - 1));
  while (tab[i].used && !key_equal(&tab[i].key, k))
    i = (i + 1) & (cap - 1);
  return &tab[i];
}

/* Keeps the load factor at or below one half; entries move with their descriptors. */
static int table_reserve(struct tz_cuda *c) {
  if ((c->mm_count + 1) * 2 <= c->mm_cap)
    return 0;
  size_t cap = c->mm_cap ? c->mm_cap * 2 : 64;
  struct tz_cuda_mm_entry *tab =
      (struct tz_cuda_mm_entry *)calloc(cap, sizeof(struct tz_cuda_mm_entry));
  if (!tab)
    return tz_err_set(TZ_ENOMEM, "compute cuda matmul: cannot grow the algorithm table to %zu",
                      cap);
  for (size_t i = 0; i < c->mm_cap; i++)
    if (c->mm[i].used)
      *slot_for(tab, cap, &c->mm[i].key) = c->mm[i];
  free(c->mm);
  c->mm = tab;
  c->mm_cap = cap;
  return 0;
}

static cudaDataType_t cuda_type(int dt) {
  return dt == TZ_BF16 ? CUDA_R_16BF : dt == TZ_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static int entry_build(struct tz_cuda *c, struct tz_cuda_mm_entry *e) {
  const struct mm_key *k = &e->key;
  cublasOperation_t op_first = k->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  /* our B */
  cublasOperation_t op_second = k->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N; /* our A */
  TZ_LT(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  TZ_LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                       sizeof op_first));
  TZ_LT(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                       sizeof op_second));
  cudaDataType_t st = cuda_type(k->s_dt), ct = cuda_type(k->c_dt);
  /* Stored shapes, column-major (rows, cols): see the top of this file. */
  TZ_LT(cublasLtMatrixLayoutCreate(&e->la, st, k->trans_b ? k->K : k->N, k->trans_b ? k->N : k->K,
                                   k->ldb));
  TZ_LT(cublasLtMatrixLayoutCreate(&e->lb, st, k->trans_a ? k->M : k->K, k->trans_a ? k->K : k->M,
                                   k->lda));
  TZ_LT(cublasLtMatrixLayoutCreate(&e->lc, ct, k->N, k->M, k->ldc));

  cublasLtMatmulPreference_t pref;
  TZ_LT(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = c->workspace_bytes;
  uint32_t al_a = (uint32_t)k->align_b, al_b = (uint32_t)k->align_a, al_c = (uint32_t)k->align_c;
  cublasStatus_t st1 = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  if (st1 == CUBLAS_STATUS_SUCCESS)
    st1 = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                               &schemes, sizeof schemes);
  if (st1 == CUBLAS_STATUS_SUCCESS)
    st1 = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                               &al_a, sizeof al_a);
  if (st1 == CUBLAS_STATUS_SUCCESS)
    st1 = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                               &al_b, sizeof al_b);
  if (st1 == CUBLAS_STATUS_SUCCESS)
    st1 = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                               &al_c, sizeof al_c);
  if (st1 == CUBLAS_STATUS_SUCCESS)
    st1 = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                               &al_c, sizeof al_c);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  if (st1 == CUBLAS_STATUS_SUCCESS)
    st1 = cublasLtMatmulAlgoGetHeuristic(c->lt, e->op, e->la, e->lb, e->lc, e->lc, pref, 1, &res,
                                         &found);
  (void)cublasLtMatmulPreferenceDestroy(pref);
  if (st1 == CUBLAS_STATUS_NOT_SUPPORTED || (st1 == CUBLAS_STATUS_SUCCESS && found < 1)) {
    e->plain = 1;
    TZ_WARN("compute cuda matmul: cuBLASLt has no algorithm for M=%d N=%d K=%d trans_a=%d "
            "trans_b=%d lda=%d ldb=%d ldc=%d %s -> %s (alignments %d/%d/%d); using the plain "
            "kernel for this shape",
            k->M, k->N, k->K, k->trans_a, k->trans_b, k->lda, k->ldb, k->ldc,
            tz_dtype_name((enum tz_dtype)k->s_dt), tz_dtype_name((enum tz_dtype)k->c_dt),
            k->align_a, k->align_b, k->align_c);
    return 0;
  }
  TZ_LT(st1);
  e->algo = res.algo;
  return 0;
}

static int lookup(struct tz_cuda *c, const struct mm_key *k, struct tz_cuda_mm_entry **out) {
  if (c->mm_cap) {
    struct tz_cuda_mm_entry *e = slot_for(c->mm, c->mm_cap, k);
    if (e->used) {
      *out = e;
      return 0;
    }
  }
  TZ_CHECK(table_reserve(c));
  struct tz_cuda_mm_entry fresh;
  memset(&fresh, 0, sizeof fresh);
  fresh.key = *k;
  int rc = entry_build(c, &fresh);
  if (rc < 0) {
    entry_release(&fresh);
    return rc;
  }
  fresh.used = 1;
  struct tz_cuda_mm_entry *e = slot_for(c->mm, c->mm_cap, k);
  *e = fresh;
  c->mm_count++;
  *out = e;
  return 0;
}

/* C = beta * R for K == 0 or alpha == 0, where no product is formed (as the cpu backend does):
 * beta == 0 writes zeros whatever C held. */
template <typename T>
__global__ void scale_c_kernel(const T *R, T *C, int M, int N, int ldc, float beta) {
  size_t total = (size_t)M * N;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t off = i / (size_t)N * (size_t)ldc + i % (size_t)N;
    C[off] = tz_st<T>(beta == 0.0f ? 0.0f : __fmul_rn(tz_ld(R[off]), beta));
  }
}

/* The plain GEMM: 16x16 output tiles, K in steps of 16 through shared memory, each output's
 * products summed in increasing k in float, then C = alpha * sum (+ beta * R) rounded once. */
#define PT 16
template <typename T, typename TC>
__global__ void gemm_plain_kernel(int trans_a, int trans_b, int M, int N, int K, float alpha,
                                  const T *A, int lda, const T *B, int ldb, float beta, const TC *R,
                                  TC *C, int ldc) {
  __shared__ float sA[PT][PT + 1], sB[PT][PT + 1];
  int tx = threadIdx.x, ty = threadIdx.y;
  int i = blockIdx.y * PT + ty, j = blockIdx.x * PT + tx;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += PT) {
    int ka = k0 + tx, kb = k0 + ty, ia = blockIdx.y * PT + ty;
    /* sA[r][kk] = op(A)[row r of the tile][k0 + kk]; sB[kk][cc] = op(B)[k0 + kk][col cc] */
    sA[ty][tx] = ia < M && ka < K
                     ? tz_ld(trans_a ? A[(size_t)ka * lda + ia] : A[(size_t)ia * lda + ka])
                     : 0.0f;
    sB[ty][tx] =
        kb < K && j < N ? tz_ld(trans_b ? B[(size_t)j * ldb + kb] : B[(size_t)kb * ldb + j]) : 0.0f;
    __syncthreads();
    for (int kk = 0; kk < PT; kk++)
      acc = __fadd_rn(acc, __fmul_rn(sA[ty][kk], sB[kk][tx]));
    __syncthreads();
  }
  if (i < M && j < N) {
    size_t off = (size_t)i * ldc + j;
    float prod = __fmul_rn(alpha, acc);
    C[off] = tz_st<TC>(beta == 0.0f ? prod : __fadd_rn(__fmul_rn(beta, tz_ld(R[off])), prod));
  }
}

static int gemm_plain(struct tz_cuda *c, cudaStream_t st, int trans_a, int trans_b, int M, int N,
                      int K, float alpha, const void *A, int lda, const void *B, int ldb,
                      float beta, const void *R, void *C, enum tz_dtype c_dt, int ldc) {
  if ((M + PT - 1) / PT > 65535)
    return tz_err_set(TZ_EINVAL, "compute cuda matmul: M=%d too large for the plain kernel", M);
  dim3 grid((unsigned)((N + PT - 1) / PT), (unsigned)((M + PT - 1) / PT)), block(PT, PT);
  return tz_cuda_dispatch(c->S, [&](auto stag) {
    using T = decltype(stag);
    return tz_cuda_dispatch(c_dt, [&](auto ctag) {
      using TC = decltype(ctag);
      gemm_plain_kernel<T, TC><<<grid, block, 0, st>>>(trans_a, trans_b, M, N, K, alpha,
                                                       (const T *)A, lda, (const T *)B, ldb, beta,
                                                       (const TC *)R, (TC *)C, ldc);
      TZ_CU_LAUNCHED();
      return 0;
    });
  });
}

/* tz_cuda_matmul on stream st with cuBLASLt's workspace ws (of c->workspace_bytes): the same
 * kernel with the same workspace size for the same call on any stream, so the same bits. */
static int matmul_on(struct tz_cuda *c, cudaStream_t st, void *ws, int trans_a, int trans_b, int M,
                     int N, int K, float alpha, const void *A, int lda, const void *B, int ldb,
                     float beta, const void *R, void *C, enum tz_dtype c_dt, int ldc) {
  if (K == 0 || alpha == 0.0f) {
    if (beta == 1.0f && R == C)
      return 0;
    return tz_cuda_dispatch(c_dt, [&](auto tag) {
      using T = decltype(tag);
      scale_c_kernel<T><<<tz_cuda_grid(c, (size_t)M * N, 256), 256, 0, st>>>((const T *)R, (T *)C,
                                                                             M, N, ldc, beta);
      TZ_CU_LAUNCHED();
      return 0;
    });
  }
  if (c->mm_plain)
    return gemm_plain(c, st, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, R, C, c_dt,
                      ldc);
  struct mm_key k;
  memset(&k, 0, sizeof k);
  k.trans_a = trans_a;
  k.trans_b = trans_b;
  k.M = M;
  k.N = N;
  k.K = K;
  k.lda = lda;
  k.ldb = ldb;
  k.ldc = ldc;
  k.s_dt = (int)c->S;
  k.c_dt = (int)c_dt;
  k.beta_zero = beta == 0.0f;
  k.align_a = alignment(A);
  k.align_b = alignment(B);
  /* C and D share a layout and one alignment preference: the smaller of the two */
  int al_r = beta == 0.0f ? 256 : alignment(R), al_d = alignment(C);
  k.align_c = al_r < al_d ? al_r : al_d;
  struct tz_cuda_mm_entry *e;
  TZ_CHECK(lookup(c, &k, &e));
  if (e->plain)
    return gemm_plain(c, st, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, R, C, c_dt,
                      ldc);
  TZ_LT(cublasLtMatmul(c->lt, e->op, &alpha, B, e->la, A, e->lb, &beta, R, e->lc, C, e->lc,
                       &e->algo, ws, c->workspace_bytes, st));
  return 0;
}

int tz_cuda_matmul(void *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha,
                   const void *A, int lda, const void *B, int ldb, float beta, const void *R,
                   void *C, enum tz_dtype c_dt, int ldc) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return matmul_on(c, c->stream, c->workspace, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
                   beta, R, C, c_dt, ldc);
}

/* ---- Independent products side by side (tz_compute_matmul_many) ----
 * The experts' products are many and each too small to fill the GPU (at OLMoE's shape an
 * expert's 512 rows make 16 to 32 output tiles for 132 multiprocessors: 0.2 of the matmul
 * ceiling, docs/benchmarks.md). Here the calls go round-robin over the instance's stream and
 * TZ_CUDA_MM_LANES - 1 side streams, each with its own cuBLASLt workspace (one call's workspace
 * must not be another's while both run), forked from the instance's stream by an event and joined
 * back to it by one each: what came before runs first, what comes after waits for all. Each call
 * is matmul_on's, the kernel the algorithm table holds for its shape, so its bits are the call's
 * alone, whatever runs beside it. The side streams and workspaces are made at the first call
 * (an instance that never has one pays nothing): TZ_CUDA_MM_LANES - 1 workspaces of
 * workspace_bytes (32 MiB by default) more device memory. */
int tz_cuda_matmul_lanes_release(struct tz_cuda *c) {
  for (int i = 0; i < TZ_CUDA_MM_LANES; i++) {
    if (c->lane_done[i])
      (void)cudaEventDestroy(c->lane_done[i]);
    if (i > 0 && c->lane[i])
      (void)cudaStreamDestroy(c->lane[i]);
    if (i > 0 && c->lane_ws[i])
      (void)cudaFree(c->lane_ws[i]);
    c->lane_done[i] = NULL, c->lane[i] = NULL, c->lane_ws[i] = NULL;
  }
  if (c->lane_fork)
    (void)cudaEventDestroy(c->lane_fork);
  c->lane_fork = NULL;
  c->lanes = 0;
  return 0;
}

static int lanes_make(struct tz_cuda *c) {
  if (c->lanes)
    return 0;
  c->lane[0] = c->stream;
  c->lane_ws[0] = c->workspace;
  TZ_CU(cudaEventCreateWithFlags(&c->lane_fork, cudaEventDisableTiming));
  for (int i = 0; i < TZ_CUDA_MM_LANES; i++) {
    TZ_CU(cudaEventCreateWithFlags(&c->lane_done[i], cudaEventDisableTiming));
    if (i > 0) {
      TZ_CU(cudaStreamCreateWithFlags(&c->lane[i], cudaStreamNonBlocking));
      cudaError_t e = cudaMalloc(&c->lane_ws[i], c->workspace_bytes);
      if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return tz_err_set(TZ_ENOMEM,
                          "compute cuda matmul_many: cannot allocate the workspace of side stream "
                          "%d (%zu bytes)",
                          i, c->workspace_bytes);
      }
      TZ_CU(e);
    }
  }
  c->lanes = TZ_CUDA_MM_LANES;
  return 0;
}

int tz_cuda_matmul_many(void *ctx, int n, const struct tz_matmul_call *calls) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  if (!c->lanes) {
    int rc = lanes_make(c);
    if (rc < 0) {
      tz_cuda_matmul_lanes_release(c);
      return rc;
    }
  }
  const int used = n < c->lanes ? n : c->lanes;
  TZ_CU(cudaEventRecord(c->lane_fork, c->stream));
  for (int l = 1; l < used; l++)
    TZ_CU(cudaStreamWaitEvent(c->lane[l], c->lane_fork, 0));
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const struct tz_matmul_call *m = &calls[i];
    const int l = i % used;
    rc = matmul_on(c, c->lane[l], c->lane_ws[l], m->trans_a != 0, m->trans_b != 0, m->M, m->N, m->K,
                   m->alpha, m->A, m->lda, m->B, m->ldb, m->beta, m->C, m->C, m->c_dt, m->ldc);
  }
  /* joined whatever happened: nothing after this call runs beside a side stream's work */
  for (int l = 1; l < used; l++) {
    TZ_CU(cudaEventRecord(c->lane_done[l], c->lane[l]));
    TZ_CU(cudaStreamWaitEvent(c->stream, c->lane_done[l], 0));
  }
  return rc;
}
