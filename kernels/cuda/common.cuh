/* What the cuda compute backend's files share: the instance, the check macros, the storage types
 * and the launch entry points that compute.cu puts in the ops table. Only kernels/cuda/ includes
 * this header. */
#ifndef TZ_KERNELS_CUDA_COMMON_CUH
#define TZ_KERNELS_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "core/error.h"
}
#include "kernels/compute_impl.h"
#include "kernels/cuda/choice.h"

/* Returns TZ_ECUDA from the enclosing function, naming the call, CUDA's reason and where. */
#define TZ_CU(call)                                                                                \
  do {                                                                                             \
    cudaError_t tz_cu_e_ = (call);                                                                 \
    if (tz_cu_e_ != cudaSuccess)                                                                   \
      return tz_err_set(TZ_ECUDA, "cuda: %s: %s (%s:%d)", #call, cudaGetErrorString(tz_cu_e_),     \
                        __FILE__, __LINE__);                                                       \
  } while (0)

/* The same for cuBLASLt. */
#define TZ_LT(call)                                                                                \
  do {                                                                                             \
    cublasStatus_t tz_lt_s_ = (call);                                                              \
    if (tz_lt_s_ != CUBLAS_STATUS_SUCCESS)                                                         \
      return tz_err_set(TZ_ECUDA, "cuda: %s: %s (%s:%d)", #call,                                   \
                        cublasLtGetStatusString(tz_lt_s_), __FILE__, __LINE__);                    \
  } while (0)

/* After a kernel launch: a bad configuration is reported here, a fault at the next sync. */
#define TZ_CU_LAUNCHED() TZ_CU(cudaGetLastError())

/* Codes the kernels leave in the instance's error record (struct tz_cuda.err) when they meet
 * bad input that can only be seen on the device. */
enum {
  TZ_CUDA_BAD_EMBED_FWD = 1, /* a token outside [0, V) */
  TZ_CUDA_BAD_EMBED_BWD = 2,
  TZ_CUDA_BAD_TARGET = 3, /* a cross-entropy target outside [0, V) */
};

/* matmul_many's streams (matmul.cu): 4, the instance's and three side streams (measured on an
 * H100, docs/cuda-kernels.md); built with -DTZ_CUDA_MM_STREAMS=1 the ops table has no
 * matmul_many and the wrapper runs the calls one after the other. */
#ifndef TZ_CUDA_MM_STREAMS
#define TZ_CUDA_MM_STREAMS 4
#endif
#define TZ_CUDA_MM_LANES (TZ_CUDA_MM_STREAMS > 1 ? TZ_CUDA_MM_STREAMS : 1)

/* Matmul descriptors and the algorithm chosen for one shape (matmul.cu). */
struct tz_cuda_mm_entry;

struct tz_cuda {
  int device;
  enum tz_dtype S;                       /* storage dtype */
  enum tz_dtype G;                       /* gradient dtype: S or TZ_F32 */
  int n_sm;                              /* multiprocessors, for grid sizes */
  size_t smem_optin;                     /* the most shared memory one block may ask for */
  enum tz_cuda_attention_mode attention; /* the setting "attention" (choice.h) */
  int sm90;             /* the device is sm_90, which the sm_90a kernels (wgmma) run on */
  int mm_plain;         /* the setting "matmul" plain: matmul's plain kernel instead of cuBLASLt */
  int norm_bwd_onepass; /* the setting "norm_bwd" one-pass (rmsnorm.cu) */
  int softcap_approx;   /* the setting "softcap_tanh" approx (attention_mma.cuh, score_log2) */
  cudaStream_t stream;  /* where all work goes: params.stream, or the instance's own */
  int stream_borrowed;  /* stream came from params.stream: never destroyed here */
  cublasLtHandle_t lt;
  void *workspace; /* cuBLASLt workspace, allocated once */
  size_t workspace_bytes;
  /* matmul_many's lanes (matmul.cu), made at its first call: lane[0] is stream with workspace,
   * the others side streams with their own workspaces; lanes 0 until made */
  int lanes;
  cudaStream_t lane[TZ_CUDA_MM_LANES];
  void *lane_ws[TZ_CUDA_MM_LANES];
  cudaEvent_t lane_fork, lane_done[TZ_CUDA_MM_LANES];
  struct tz_cuda_mm_entry *mm; /* open-addressing table of chosen algorithms */
  size_t mm_cap, mm_count;
  void *scratch; /* per-operation scratch (partial sums, tables), grown on demand */
  size_t scratch_bytes;
  float2 *rope_cs; /* (T, D/2) cos and sin for the last (T, D, rope_f) */
  size_t rope_cap; /* entries allocated */
  int rope_T, rope_D;
  float rope_mscale;                /* the table's cos and sin factor */
  double rope_f[TZ_ROPE_MAX_D / 2]; /* the frequencies of the table, host copy */
  double *rope_f_dev;               /* the same on the device (TZ_ROPE_MAX_D / 2) */
  int *err_dev;                     /* device: {code, index, value, limit} of the first bad input */
  int *err_host;                    /* pinned host copy of it, read at sync */
  unsigned char *link;              /* pinned host buffer of TZ_CUDA_LINK_BYTES: small copies
                                       between the host and the device (compute.cu) */
};

/* Returns scratch of at least bytes, 256-byte aligned, valid until the next call. Growing it
 * frees the old buffer, which waits for the device: it happens a few times, then never. */
int tz_cuda_scratch(struct tz_cuda *c, size_t bytes, void **out);

/* Grid size for a grid-stride loop over n items with blocks of `threads`. */
static inline unsigned tz_cuda_grid(const struct tz_cuda *c, size_t n, unsigned threads) {
  size_t blocks = (n + threads - 1) / threads;
  size_t cap = (size_t)c->n_sm * 32;
  if (blocks > cap)
    blocks = cap;
  return blocks ? (unsigned)blocks : 1u;
}

/* ---- storage types: loads widen to float, stores round to nearest even ----
 * Through core/dtype.h's integer conversions, the ones the cpu backend uses, so that both give
 * the same bits for every value, NaN payloads included. */

/* The first row of row t's document in sequence b of T_ rows: t - pos[b][t] (kernels/compute.h,
 * "Packed documents"), or 0 without pos; rows at or past T_ count as starting at T_ (they see no
 * key). Documents start in increasing order along a row. */
__device__ __forceinline__ int tz_doc_start(const int32_t *pos, int b, int T_, int t) {
  if (t >= T_)
    return T_;
  return pos ? t - pos[(size_t)b * T_ + t] : 0;
}

/* The attention variants (compute.h, struct tz_attn_opts) as the kernels apply them: the scores'
 * scale, a softcap (cap > 0: a score s becomes cap tanh(s / cap)) with its two factors for the
 * tensor-core kernels' log2 domain, and a sliding window (window > 0: query t sees keys u > t -
 * window). tz_attn_var_of makes it; a default one (Llama's) has scale 1 / sqrt(D), cap 0 and
 * window 0, and the kernels then compute what they computed before the variants, bit for bit. */
struct tz_attn_var {
  float scale;
  float cap;
  float cap_in;   /* scale / cap: a raw product times this is the tanh's argument */
  float cap_log2; /* cap * log2(e): tanh times this is the score in the log2 domain */
  int window;
  int tanh_approx; /* the setting softcap_tanh approx: the softcap's tanh by tanh.approx.f32 */
};
struct tz_attn_var tz_attn_var_of(const struct tz_attn_opts *opt, int D);
static inline bool tz_attn_var_default(const struct tz_attn_var &v, int D) {
  return v.cap == 0.0f && v.window == 0 && v.scale == 1.0f / sqrtf((float)D);
}

/* The first key row t of sequence b sees: its document's first (tz_doc_start) or its window's,
 * whichever is later (rows at or past T_: T_, no key). Nondecreasing along a row. */
__device__ __forceinline__ int tz_first_key(const int32_t *pos, int b, int T_, int t, int window) {
  int u0 = tz_doc_start(pos, b, T_, t);
  return window > 0 && t - window + 1 > u0 ? t - window + 1 : u0;
}

__device__ __forceinline__ float tz_ld(float x) { return x; }
__device__ __forceinline__ float tz_ld(__nv_bfloat16 x) {
  return tz_bf16_to_f32(__bfloat16_as_ushort(x));
}
__device__ __forceinline__ float tz_ld(__half x) { return tz_f16_to_f32(__half_as_ushort(x)); }

template <typename T> __device__ __forceinline__ T tz_st(float x);
template <> __device__ __forceinline__ float tz_st<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 tz_st<__nv_bfloat16>(float x) {
  return __ushort_as_bfloat16(tz_f32_to_bf16(x));
}
template <> __device__ __forceinline__ __half tz_st<__half>(float x) {
  return __ushort_as_half(tz_f32_to_f16(x));
}

/* ---- 16-byte vectors: tz_vec<T>::n elements of T, loaded and stored whole ----
 * Each element converts as tz_ld / tz_st do, so a kernel that takes its elements 16 bytes at a
 * time gives the bits of one that takes them one at a time. The address must be 16-byte aligned
 * (tz_cuda_aligned16). */
template <typename T> struct tz_vec { static constexpr int n = 16 / (int)sizeof(T); };

template <typename T> __device__ __forceinline__ void tz_ld16(const T *p, float *out) {
  uint4 raw = *reinterpret_cast<const uint4 *>(p);
  const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
  for (int k = 0; k < tz_vec<T>::n; k++)
    out[k] = tz_ld(e[k]);
}

template <typename T> __device__ __forceinline__ void tz_st16(T *p, const float *in) {
  uint4 raw;
  T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
  for (int k = 0; k < tz_vec<T>::n; k++)
    e[k] = tz_st<T>(in[k]);
  *reinterpret_cast<uint4 *>(p) = raw;
}

static inline int tz_cuda_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Calls f with a value of the C++ type of dt: f(float()), f(__nv_bfloat16()) or f(__half()). */
template <typename F> static inline int tz_cuda_dispatch(enum tz_dtype dt, F f) {
  switch (dt) {
  case TZ_F32: return f(float());
  case TZ_BF16: return f(__nv_bfloat16());
  case TZ_F16: return f(__half());
  }
  return tz_err_set(TZ_EINVAL, "cuda: invalid dtype %d", (int)dt);
}

/* A logit through the softcap (compute.h: tz_compute_xent, tz_compute_softcap) in float, the cpu
 * backend's order: cap * tanh(l / cap); cap 0: l itself. */
__device__ __forceinline__ float tz_softcap(float l, float cap) {
  return cap > 0.0f ? __fmul_rn(cap, tanhf(__fdiv_rn(l, cap))) : l;
}

/* Records the first bad input a kernel meets (integer atomics only: which one wins does not
 * change any floating-point result, and the host reports it at the next sync). */
__device__ __forceinline__ void tz_cuda_report(int *err, int code, int index, int value,
                                               int limit) {
  if (atomicCAS(&err[0], 0, code) == 0) {
    err[1] = index;
    err[2] = value;
    err[3] = limit;
  }
}

/* The sum of v over the block, every thread receiving it. blockDim.x is a multiple of 32 (at most
 * 1024); sh is 32 floats of shared memory. A butterfly within each warp, then across the warps'
 * sums: the tree is fixed, and commutativity makes every lane's result the same bits. */
__device__ __forceinline__ float tz_block_sum(float v, float *sh) {
  for (int s = 16; s >= 1; s >>= 1)
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, s));
  unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, n_warps = blockDim.x >> 5;
  __syncthreads(); /* sh may still be read by a previous call */
  if (lane == 0)
    sh[warp] = v;
  __syncthreads();
  float t = lane < n_warps ? sh[lane] : 0.0f;
  for (int s = 16; s >= 1; s >>= 1)
    t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, s));
  return t;
}

/* ---- the operations (one file each; arguments as in compute_impl.h) ---- */

int tz_cuda_fill(void *ctx, enum tz_dtype dt, void *x, float value, size_t n);
int tz_cuda_scale(void *ctx, enum tz_dtype dt, void *x, float alpha, size_t n);
int tz_cuda_axpy(void *ctx, enum tz_dtype dt, void *y, float alpha, const void *x, size_t n);
int tz_cuda_add(void *ctx, enum tz_dtype dt, void *out, const void *a, const void *b, size_t n);
int tz_cuda_cast(void *ctx, void *dst, enum tz_dtype dst_dt, const void *src, enum tz_dtype src_dt,
                 size_t n);
int tz_cuda_glu_fwd(void *ctx, enum tz_glu act, void *out, const void *g, const void *u, size_t n);
int tz_cuda_glu_bwd(void *ctx, enum tz_glu act, void *dg, void *du, void *out, const void *dout,
                    const void *g, const void *u, size_t n);
int tz_cuda_softcap(void *ctx, void *logits, size_t n, float softcap);
/* moe.cu: the mixture-of-experts ops (compute_impl.h) */
int tz_cuda_moe_route(void *ctx, const struct tz_moe_route *r, float *stats, const void *logits,
                      int N, int E, int k, int norm);
int tz_cuda_moe_route_bwd(void *ctx, void *dlogits, const struct tz_moe_route *r, const float *dw,
                          const float *daux, int N, int E, int k, int norm);
int tz_cuda_moe_gather(void *ctx, void *xs, const void *x, const int32_t *rows, int M, int C);
int tz_cuda_moe_scatter(void *ctx, void *dx, const void *dxs, const int32_t *slot, int N, int k,
                        int C);
int tz_cuda_moe_combine(void *ctx, void *out, const void *res, const void *y, const float *w,
                        const int32_t *slot, int N, int k, int C);
int tz_cuda_moe_combine_bwd(void *ctx, void *dy, float *dw, const void *dout, const void *y,
                            const float *w, const int32_t *slot, int N, int k, int C);
int tz_cuda_moe_gate_fwd(void *ctx, void *out, const void *res, const void *y, const void *s, int N,
                         int C);
int tz_cuda_moe_gate_bwd(void *ctx, void *dy, void *ds, const void *dout, const void *y,
                         const void *s, int N, int C);
int tz_cuda_sum(void *ctx, float *out, enum tz_dtype dt, const void *x, size_t n, int square,
                int accumulate);
int tz_cuda_sumsq_segments(void *ctx, float *out, enum tz_dtype dt, const void *x, size_t seg_len,
                           size_t n_seg);
int tz_cuda_matmul(void *ctx, int trans_a, int trans_b, int M, int N, int K, float alpha,
                   const void *A, int lda, const void *B, int ldb, float beta, const void *R,
                   void *C, enum tz_dtype c_dt, int ldc);
void tz_cuda_matmul_release(struct tz_cuda *c); /* destroys the table's descriptors */
/* Independent products over the instance's stream and its side streams (matmul.cu; the ops
 * table's matmul_many unless built with TZ_CUDA_MM_STREAMS 1), and the side streams' release. */
int tz_cuda_matmul_many(void *ctx, int n, const struct tz_matmul_call *calls);
int tz_cuda_matmul_lanes_release(struct tz_cuda *c);
int tz_cuda_embedding_fwd(void *ctx, void *out, const int32_t *tokens, const void *wte, int N,
                          int C, int V);
int tz_cuda_embedding_bwd(void *ctx, void *dwte, const void *dout, const int32_t *tokens, int N,
                          int C, int V);
int tz_cuda_rmsnorm_fwd(void *ctx, void *out, float *rstd, const void *x, const void *w, int N,
                        int C, float eps, float w_offset);
int tz_cuda_rmsnorm_bwd(void *ctx, void *dx, const void *dres, void *dw, const void *dout,
                        const void *x, const void *w, const float *rstd, int N, int C,
                        float w_offset);
int tz_cuda_rope(void *ctx, void *x, int B, int T, int nh, int D, int R, const double *inv_freq,
                 float mscale, int inverse, const int32_t *pos);
int tz_cuda_bias_add(void *ctx, void *x, const void *b, int N, int n);
int tz_cuda_bias_grad(void *ctx, void *db, const void *dy, int N, int n);
int tz_cuda_attention_fwd(void *ctx, void *out, float *lse, const void *q, const void *k,
                          const void *v, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                          const struct tz_attn_opts *opt);
int tz_cuda_attention_bwd(void *ctx, void *dq, void *dk, void *dv, float *delta, const void *dout,
                          const void *q, const void *k, const void *v, const void *out,
                          const float *lse, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                          const struct tz_attn_opts *opt);
int tz_cuda_xent(void *ctx, float *losses, void *dlogits, const void *logits,
                 const int32_t *targets, int N, int V, float dscale, float softcap);

/* The tensor-core attention kernels (attention_mma.cu): 16-bit storage, head dims that are
 * multiples of 4 up to 128, tensors at least 8-byte aligned. They return 1 when they do not
 * handle the call, so attention.cu falls back to the plain kernels. pos: packed documents
 * (compute.h), or NULL; var: the variants (tz_attn_var_of). */
int tz_cuda_attention_fwd_mma(struct tz_cuda *c, void *out, float *lse, const void *q,
                              const void *k, const void *v, int B, int T, int H, int Hkv, int D,
                              const int32_t *pos, const struct tz_attn_var &var);
int tz_cuda_attention_bwd_mma(struct tz_cuda *c, void *dq, void *dk, void *dv, const float *delta,
                              const void *dout, const void *q, const void *k, const void *v,
                              const float *lse, int B, int T, int H, int Hkv, int D,
                              const int32_t *pos, const struct tz_attn_var &var);
/* The forward and the two-pass backward on Hopper's warpgroup MMA (attention_wgmma.cu, built for
 * sm_90a): bf16, head dims 64 to 128 in multiples of 8 (where tz_cuda_attention_wgmma_takes
 * admits them), 16-byte aligned tensors, an sm_90 device; 1 where they do not take the call. The
 * backward reads delta as attention.cu's kernel leaves it. pos and var as the mma.sync kernels'. */
int tz_cuda_attention_fwd_wgmma(struct tz_cuda *c, void *out, float *lse, const void *q,
                                const void *k, const void *v, int B, int T, int H, int Hkv, int D,
                                const int32_t *pos, const struct tz_attn_var &var);
int tz_cuda_attention_bwd_wgmma(struct tz_cuda *c, void *dq, void *dk, void *dv, const float *delta,
                                const void *dout, const void *q, const void *k, const void *v,
                                const float *lse, int B, int T, int H, int Hkv, int D,
                                const int32_t *pos, const struct tz_attn_var &var);
/* attention_pp.cu's causal forward and dq at head dim 128 (defined only with TZ_ATTN_FWD_PP 1,
 * TZ_ATTN_DQ_PP 1; 1 where the device's shared memory is too small). */
int tz_cuda_attention_fwd_pp(struct tz_cuda *c, void *out, float *lse, const void *q, const void *k,
                             const void *v, int B, int T, int H, int Hkv,
                             const struct tz_attn_var &var);
int tz_cuda_attention_dq_pp(struct tz_cuda *c, void *dq, const float *delta, const void *dout,
                            const void *q, const void *k, const void *v, const float *lse, int B,
                            int T, int H, int Hkv, const struct tz_attn_var &var);

#endif
