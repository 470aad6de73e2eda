/* Compute backends (DESIGN.md "Backends"): the model is written once against these operations, and
 * each backend implements them: `cpu` (float32; GEMM through OpenBLAS, the rest OpenMP) and `cuda`
 * (bf16 or fp16 storage with float32 accumulation; GEMM through cuBLASLt, own kernels elsewhere).
 *
 * Memory. Every tensor pointer below is in the backend's memory (host for cpu, device for cuda),
 * obtained from tz_compute_alloc or from a tier that the backend can address. Buffers from
 * tz_compute_alloc and parameter tensors are 256-byte aligned, but ops also receive pointers to a
 * chunk of rows inside them, aligned only to the element size (16 bytes for matrices whose rows
 * are a multiple of 8 elements): a kernel checks alignment before it takes a vectorised path.
 * Host memory is only touched by copy_in/copy_out.
 *
 * Ordering. Operations are enqueued on the instance's one compute stream, in call order, and may
 * return before they have run (cpu runs them at once). tz_compute_sync waits for all of them.
 * copy_in and copy_out are synchronous for the host buffer: they wait for earlier work, and the
 * host buffer may be reused as soon as they return. An error found when an operation is enqueued
 * is returned by that call; an error that happens while it runs is returned by the next sync.
 *
 * Dtypes. An instance has a storage dtype S (tz_compute_dtype: parameters, activations and their
 * gradients, logits) and a gradient dtype G (tz_compute_grad_dtype: parameter gradients, into which
 * backward accumulates). Arguments marked F32 are always float: saved statistics (rstd, logsumexp),
 * losses and reduction results. Elementwise ops take their dtype explicitly. Arithmetic is float32
 * whatever the storage: loads widen to float, stores round to nearest even.
 *
 * Determinism. The same inputs give the same bits on every run and for every thread count: no
 * floating-point atomics; every reduction has an order fixed by the op and its shapes alone (the
 * cpu backend sums over rows in row order; a GPU kernel may use a fixed tree). tz_compute_sum
 * fixes its order exactly (below), so the gradient norm is the same on every backend for the
 * same gradient bits.
 * An op that accumulates (+=) computes this call's whole contribution first and adds it onto the
 * old value once per element, so the result depends on the old value's bits, never on how they
 * were formed: accumulating two micro-batches into g equals adding their separate gradients.
 *
 * Shapes. N is a number of rows (tokens, N = B*T), C the model width, V the vocabulary, F the MLP
 * width, H / Hkv the query / key-value heads, D the head dimension. Matrices are row-major. */
#ifndef TZ_KERNELS_COMPUTE_H
#define TZ_KERNELS_COMPUTE_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tz_compute tz_compute;
struct tz_adam_params; /* kernels/adam.h */
struct tz_setting;     /* core/settings.h */

/* Parses "f32"/"fp32"/"float32", "bf16"/"bfloat16", "f16"/"fp16"/"float16". TZ_EINVAL otherwise. */
int tz_dtype_parse(const char *s, enum tz_dtype *out);

/* What a backend needs to create an instance. Zero means "the backend's default" throughout. */
struct tz_compute_params {
  int n_threads;            /* cpu: OpenMP and BLAS threads; 0: omp_get_max_threads() */
  int device;               /* cuda: device index */
  enum tz_dtype dtype;      /* S: storage of parameters and activations; cpu: TZ_F32 only */
  enum tz_dtype grad_dtype; /* G: parameter gradients; default TZ_F32 */
  uint64_t workspace_bytes; /* cuda: cuBLASLt workspace; default 32 MiB */
  void *stream;             /* cuda: a cudaStream_t on device `device` (else TZ_EINVAL) to
                               enqueue all work on, borrowed: the instance never destroys it
                               (destroy only synchronizes it), and the caller keeps it alive
                               until after tz_compute_destroy. NULL: the instance creates (and
                               destroys) its own non-blocking stream. cpu: ignored. */
  const char *settings;     /* the backend's own settings, "name=value,name=value"
                               (core/settings.h), parsed and checked by the backend: cuda's
                               attention kernels and matmul path (docs/config.md,
                               tierzero.cuda_*); NULL: its defaults. cpu has none. Their
                               environment variables win over them. */
};
void tz_compute_params_init(struct tz_compute_params *p);

/* Registry (defined in registry/compute.c, above every backend, as are the device queries
 * below, which name a backend too; tz_kernels itself calls none of them). Backends compiled into
 * this build, in order: "cpu", and "cuda" with CUDA. */
int tz_compute_backend_count(void);
const char *tz_compute_backend_name(int i);
/* 1 when this build has the backend `name` (whether or not it can run here: tz_compute_probe). */
int tz_compute_backend_built(const char *name);
/* 0 when the backend can run here; otherwise a negative code and why[] says why
 * ("cuda: not compiled in", "cuda: cudaGetDeviceCount: no CUDA-capable device is detected"). */
int tz_compute_probe(const char *backend, char *why, size_t why_len);
/* The settings backend takes (tz_compute_params.settings), *n of them; NULL with *n 0 for a
 * backend that has none or is not in this build. Static. */
const struct tz_setting *tz_compute_settings(const char *backend, int *n);
/* Checks settings for backend as tz_compute_create would (the environment included), without
 * creating anything: TZ_ECONFIG naming what is wrong; TZ_ENOENT for a backend not in this build. */
int tz_compute_settings_check(const char *backend, const char *settings);
/* 1 when an instance of backend with these settings (the environment included) computes the
 * families' variants (rmsnorm's w_offset, struct tz_attn_opts, TZ_GLU_GELU_TANH, the softcaps),
 * 0 when it refuses them; negative (tz_compute_settings_check's errors) when the settings are bad.
 */
int tz_compute_variants(const char *backend, const char *settings);
/* 1 when backend's instances have the mixture-of-experts ops (below), 2 when also their shared
 * expert's gate (gate_fwd, gate_bwd), 0 when they refuse them; TZ_ENOENT for a backend not in
 * this build. */
int tz_compute_moe(const char *backend);

/* Creates an instance. The caller owns it and destroys it with tz_compute_destroy after every
 * allocation from it has been freed. p may be NULL for defaults. Errors: TZ_ENOENT (no such
 * backend), TZ_ENOTSUP (cannot run here, or a dtype the backend lacks), TZ_ENOMEM, TZ_ECUDA. */
int tz_compute_create(const char *backend, const struct tz_compute_params *p, tz_compute **out);
void tz_compute_destroy(tz_compute *cm); /* NULL is a no-op; waits for work in flight */

/* What a backend can say about one of its devices, before any instance exists (to plan with). */
struct tz_compute_device {
  int index;      /* the device asked about; for -1, the calling thread's current one (0 when it
                     has none) */
  char name[256]; /* "NVIDIA H200"; "" when the driver cannot say */
  int numa_node;  /* the host NUMA node closest to the device; -1 when the system has no NUMA or
                     the driver cannot say */
};
/* Fills *out for `device` (-1: the current one) of backend. Facts the driver cannot give keep the
 * defaults above, so this fails only with TZ_ENOTSUP: a backend without devices (cpu) or not
 * compiled in, or TZ_ENOENT: no such backend. */
int tz_compute_device_info(const char *backend, int device, struct tz_compute_device *out);
/* Free and total bytes of the memory of `device` of backend now. TZ_ENOTSUP for a backend without
 * devices; TZ_ECUDA (the backend's error) when the device cannot be asked. */
int tz_compute_device_memory(const char *backend, int device, uint64_t *free_bytes,
                             uint64_t *total_bytes);

const char *tz_compute_backend(const tz_compute *cm);
enum tz_dtype tz_compute_dtype(const tz_compute *cm);      /* S */
enum tz_dtype tz_compute_grad_dtype(const tz_compute *cm); /* G */
int tz_compute_threads(const tz_compute *cm);              /* cpu threads; 1 for cuda */
/* The native stream work is enqueued on (a cudaStream_t for cuda: params.stream when given, else
 * the instance's own), for a tier or the scheduler to order copies and events against; NULL for
 * backends without one (cpu). Borrowed. */
void *tz_compute_stream(tz_compute *cm);

/* Waits until every operation enqueued so far has completed; returns the first error among them. */
int tz_compute_sync(tz_compute *cm);

/* ---- Memory ---- */

/* bytes of backend memory, 256-byte aligned, contents undefined. Freed with tz_compute_free
 * (NULL is a no-op). Not for the training step's steady state, which uses tier arenas. */
int tz_compute_alloc(tz_compute *cm, size_t bytes, void **out);
void tz_compute_free(tz_compute *cm, void *p);
/* host -> backend and backend -> host; synchronous for the host buffer (see Ordering). */
int tz_compute_copy_in(tz_compute *cm, void *dst, const void *host_src, size_t bytes);
int tz_compute_copy_out(tz_compute *cm, void *host_dst, const void *src, size_t bytes);
/* backend -> backend; the ranges may not overlap unless dst == src (then a no-op). */
int tz_compute_copy(tz_compute *cm, void *dst, const void *src, size_t bytes);
/* Sets bytes to zero. */
int tz_compute_zero(tz_compute *cm, void *dst, size_t bytes);

/* ---- Elementwise (x, y, out: (n) of dtype dt) ---- */

/* x[i] = value */
int tz_compute_fill(tz_compute *cm, enum tz_dtype dt, void *x, float value, size_t n);
/* x[i] *= alpha */
int tz_compute_scale(tz_compute *cm, enum tz_dtype dt, void *x, float alpha, size_t n);
/* y[i] += alpha * x[i]  (as y + (alpha*x): two roundings in float, no fused multiply-add) */
int tz_compute_axpy(tz_compute *cm, enum tz_dtype dt, void *y, float alpha, const void *x,
                    size_t n);
/* out[i] = a[i] + b[i]  (the residual add; out may alias a or b) */
int tz_compute_add(tz_compute *cm, enum tz_dtype dt, void *out, const void *a, const void *b,
                   size_t n);
/* dst (n, dst_dt) = src (n, src_dt): widening is exact, narrowing rounds to nearest even.
 * Every backend supports every pair here, the cpu one included. dst and src do not overlap. */
int tz_compute_cast(tz_compute *cm, void *dst, enum tz_dtype dst_dt, const void *src,
                    enum tz_dtype src_dt, size_t n);

/* ---- Reductions ----
 * *out (F32, one float in backend memory) = (accumulate ? *out : 0) + R, where R sums f(x[i]) over
 * x (n, dt) with f(v) = v (tz_compute_sum) or v*v (tz_compute_sumsq, each square rounded to float),
 * in exactly this order, which every backend follows so that the result has the same bits:
 *   - split x into chunks of TZ_SUM_CHUNK elements (the last may be short);
 *   - a chunk's partial: 32 lanes; lane l adds, in float, f(x[j*32 + l]) for j = 0, 1, ... within
 *     the chunk, starting from 0; then for s = 16, 8, 4, 2, 1: lane[l] += lane[l + s] for l < s;
 *     the partial is lane[0]. (A warp-per-chunk kernel with shuffle-down is exactly this.)
 *   - while more than one partial remains, the sequence of partials is reduced again in the same
 *     way (f(v) = v), chunk by chunk;
 *   - R is the last partial (0 when n == 0), added to the starting value last. */
#define TZ_SUM_CHUNK 1024
int tz_compute_sum(tz_compute *cm, float *out, enum tz_dtype dt, const void *x, size_t n,
                   int accumulate);
int tz_compute_sumsq(tz_compute *cm, float *out, enum tz_dtype dt, const void *x, size_t n,
                     int accumulate);
/* Many sums of squares in one call: x is n_seg consecutive segments of seg_len elements of dt,
 * and out (n_seg) F32 receives, for each j, exactly the bits of
 *   tz_compute_sumsq(cm, out + j, dt, x + j * seg_len elements, seg_len, 0)
 * (the order above within each segment; out[j] = 0 when seg_len == 0). One kernel launch on cuda,
 * the segments spread over threads on cpu. n_seg == 0 does nothing. out must not overlap x. */
int tz_compute_sumsq_segments(tz_compute *cm, float *out, enum tz_dtype dt, const void *x,
                              size_t seg_len, size_t n_seg);

/* ---- Matrix multiply ----
 * C (M,N) = alpha * op(A) (M,K) * op(B) (K,N) + beta * C, row-major.
 * op(A) is A (M,K) with leading dimension lda when trans_a == 0, and A^T where A is (K,M) with
 * leading dimension lda when trans_a != 0; likewise B. C has leading dimension ldc.
 * A and B are S; C is c_dt, which is S or TZ_F32 (G for a weight gradient: beta = 1 accumulates).
 * beta == 0 ignores C's previous contents (NaN included). Accumulation is float; the choice of
 * algorithm is made once per shape and kept, so the same call gives the same bits every time. */
int tz_compute_matmul(tz_compute *cm, int trans_a, int trans_b, int M, int N, int K, float alpha,
                      const void *A, int lda, const void *B, int ldb, float beta, void *C,
                      enum tz_dtype c_dt, int ldc);
/* C (M,N) = alpha * op(A) op(B) + R: a residual R (M,N) of c_dt with leading dimension ldc added
 * to the product in the same rounding, the bits of tz_compute_matmul with beta = 1 on a C that held
 * R, without the copy (the residual add fused into the projection). R may be C; otherwise the two
 * do not overlap. */
int tz_compute_matmul_add(tz_compute *cm, int trans_a, int trans_b, int M, int N, int K,
                          float alpha, const void *A, int lda, const void *B, int ldb,
                          const void *R, void *C, enum tz_dtype c_dt, int ldc);

/* One product of tz_compute_matmul_many: tz_compute_matmul's arguments. */
struct tz_matmul_call {
  int trans_a, trans_b, M, N, K;
  float alpha;
  const void *A;
  int lda;
  const void *B;
  int ldb;
  float beta;
  void *C;
  enum tz_dtype c_dt;
  int ldc;
};
/* n independent products, each calls[i] with the bits tz_compute_matmul gives it alone: no call
 * writes what another reads or writes. A backend may run them side by side (the cuda backend on
 * its stream and three side streams: the experts' products, each too small to fill the GPU
 * alone); all are done, in the instance's order, before its next op. A bad call is refused
 * naming its index, before any runs. */
int tz_compute_matmul_many(tz_compute *cm, int n, const struct tz_matmul_call *calls);

/* ---- Embedding ----
 * fwd: out (N,C) S = wte (V,C) S [tokens (N) int32]
 * bwd: dwte (V,C) G += scatter of dout (N,C) S by token, each row's contributions added in
 *      increasing n (no atomics: one owner per output element).
 * A token outside [0, V) is TZ_EINVAL (cpu checks at once; cuda may report it at sync). */
int tz_compute_embedding_fwd(tz_compute *cm, void *out, const int32_t *tokens, const void *wte,
                             int N, int C, int V);
int tz_compute_embedding_bwd(tz_compute *cm, void *dwte, const void *dout, const int32_t *tokens,
                             int N, int C, int V);

/* ---- RMSNorm: y = x * rstd * (w_offset + w), rstd = 1 / sqrt(mean(x^2) + eps), in float ----
 * w_offset is 0 (Llama: y = x * rstd * w) or 1 (Gemma, whose weights are stored as w - 1 and
 * start at 0): (w_offset + w) is formed in float. A backend without the offset (ops' variants 0)
 * refuses one that is not 0, by name.
 * fwd: out (N,C) S; rstd (N) F32 saved for backward; x (N,C) S; w (C) S. out may alias x.
 * bwd: dx (N,C) S = dres + the gradient through the norm, added in float and rounded once:
 *      dres (N,C) S is the gradient that reaches x by the residual (NULL: none, dx = 0 + the
 *      norm's gradient); dres may be dx (accumulating) or another tensor (the residual's copy
 *      fused into the norm's backward). dw (C) G += sum over rows in row order; dout, x, w, rstd
 *      as in fwd. dx must not alias dout or x. */
int tz_compute_rmsnorm_fwd(tz_compute *cm, void *out, float *rstd, const void *x, const void *w,
                           int N, int C, float eps, float w_offset);
int tz_compute_rmsnorm_bwd(tz_compute *cm, void *dx, const void *dres, void *dw, const void *dout,
                           const void *x, const void *w, const float *rstd, int N, int C,
                           float w_offset);

/* ---- RoPE, in place, the "half-split" convention of Hugging Face Llama ----
 * x (B,T,nh,D) S, D even, D <= TZ_ROPE_MAX_D. The rotated dims R are rope->rot, or D when that is
 * 0 (R even, 0 < R <= D: Phi-4-mini's partial_rotary_factor); dims R..D-1 pass unchanged. Row t
 * of sequence b is at position p = pos[b*T + t] (pos: TZ_POS below), or t when pos is NULL. For
 * i in [0, R/2): angle = p * f_i with f_i = tz_rope_inv_freq (below), the product in double, then
 * cos and sin rounded to float; (x[i], x[i+R/2]) becomes (x[i]*cos - x[i+R/2]*sin,
 * x[i+R/2]*cos + x[i]*sin). This is HF's q*cos + rotate_half(q)*sin (on q[..., :R]), so q_proj
 * and k_proj weights move between the two without permutation. R < D is a variant (a backend
 * without them refuses it by name).
 * bwd applies the transpose (the rotation by -angle) to the gradient dx (B,T,nh,D) in place. */
#define TZ_ROPE_MAX_D 1024
enum tz_rope_type {
  TZ_ROPE_DEFAULT = 0,  /* Hugging Face rope_type "default": f_i = theta^(-2i/D) */
  TZ_ROPE_LLAMA3 = 1,   /* rope_type "llama3" (Llama 3.1 and later): f_i rescaled by wavelength */
  TZ_ROPE_LINEAR = 2,   /* rope_type "linear" (position interpolation): f_i / factor */
  TZ_ROPE_YARN = 3,     /* rope_type "yarn": f_i blended between f_i and f_i / factor by a ramp */
  TZ_ROPE_LONGROPE = 4, /* rope_type "longrope": f_i / ext_factors[i] */
};
struct tz_rope {
  double theta; /* the base, > 0 */
  enum tz_rope_type type;
  /* TZ_ROPE_LLAMA3 only: factor >= 1, 0 < low_freq_factor < high_freq_factor,
   * original_max_pos > 0 (rope_scaling's factor, low_freq_factor, high_freq_factor and
   * original_max_position_embeddings). TZ_ROPE_LINEAR: factor >= 1 alone. */
  double factor, low_freq_factor, high_freq_factor;
  int original_max_pos;
  /* TZ_ROPE_YARN: factor > 0, original_max_pos > 0, beta_fast and beta_slow (32 and 1 in
   * transformers when absent), truncate (1: the ramp's ends rounded out to whole dims). Its
   * attention factor scales cos and sin, so the scores by its square: the model's, not the
   * rope's (trainer/model/model.h, rope_attn_factor). */
  double beta_fast, beta_slow;
  int truncate;
  /* TZ_ROPE_LONGROPE: R/2 positive factors, the short or the long ones of the config as the
   * model picks them by the sequence's length (borrowed for the call) */
  const double *ext_factors;
  int rot; /* the rotated dims R of each head (even); 0: all of them */
  /* cos and sin times mscale, in float after their rounding (transformers' attention_scaling of
   * yarn and longrope: with partial rotary only the rotated dims carry it, so the model passes it
   * here; with the whole head rotated it folds its square into the scores' scale instead).
   * 0 or 1: none. Another value is a variant. */
  double mscale;
};
/* TZ_EINVAL naming the field for a rope that cannot be used. */
int tz_rope_check(const struct tz_rope *r);
/* out[i] (i in [0, R/2)) = f_i, in double, on the host, for head dim D and R rotated dims (r->rot,
 * or D); every backend rotates by these numbers, which use R where D is written below:
 *   base_i = 1 / theta^(2i/D)            (pow in double)
 *   default: f_i = base_i
 *   llama3:  w = 2 pi / base_i; lo = original_max_pos / low_freq_factor;
 *            hi = original_max_pos / high_freq_factor;
 *            f_i = base_i                when w < hi (high frequencies kept)
 *                  base_i / factor       when w > lo (low frequencies slowed)
 *                  (1 - s) base_i / factor + s base_i, s = (original_max_pos / w - low_freq_factor)
 *                                        / (high_freq_factor - low_freq_factor), otherwise
 *   linear:  f_i = base_i / factor
 *   yarn:    c(b) = D ln(original_max_pos / (2 pi b)) / (2 ln theta); lo = c(beta_fast),
 *            hi = c(beta_slow), floored and ceiled with truncate; lo = max(lo, 0),
 *            hi = min(hi, D - 1), hi += 0.001 when equal; r_i = clamp((i - lo) / (hi - lo), 0, 1);
 *            f_i = (base_i / factor) r_i + base_i (1 - r_i)
 *   longrope: f_i = base_i / ext_factors[i]
 * (transformers' _compute_llama3_parameters, _compute_linear_scaling_rope_parameters and
 * _compute_yarn_parameters, in double where they work in float32). */
int tz_rope_inv_freq(const struct tz_rope *r, int D, double *out);
int tz_compute_rope_fwd(tz_compute *cm, void *x, int B, int T, int nh, int D,
                        const struct tz_rope *rope, const int32_t *pos);
int tz_compute_rope_bwd(tz_compute *cm, void *dx, int B, int T, int nh, int D,
                        const struct tz_rope *rope, const int32_t *pos);

/* ---- Bias of a linear layer (Qwen2's q, k and v projections) ----
 * add: x (N,n) S, x[r][j] = x[r][j] + b[j] in float, rounded to S once; b (n) S.
 * grad: db (n) G += the column sums of dy (N,n) S: each column's sum is formed in float in an
 *       order fixed by the backend and (N, n) alone (the cpu backend: rows in increasing order),
 *       then added onto db once (the accumulate rule above). */
int tz_compute_bias_add(tz_compute *cm, void *x, const void *b, int N, int n);
int tz_compute_bias_grad(tz_compute *cm, void *db, const void *dy, int N, int n);

/* ---- Packed documents: pos ----
 * A row of T tokens may hold several documents (packed fine-tuning data, trainer/data/data.h). pos
 * (B,T) int32, in the backend's memory like tokens, gives each token's position in its document:
 * pos[b*T] = 0, and each next pos is 0 (a document starts) or the one before plus 1. Attention
 * stays inside a document (block-diagonal causal) and RoPE rotates by pos, so a packed row
 * computes, document by document, what each document alone would. NULL: each row is one
 * document (positions 0..T-1), today's bits. A backend without packed documents (ops' docs 0)
 * refuses a non-NULL pos with TZ_ENOTSUP, by name; cpu and cuda have them (cuda in its mma.sync
 * and plain attention kernels: a call with pos does not take the warpgroup-MMA ones).
 * The cpu backend checks the rule above (TZ_EINVAL naming the row); cuda trusts it. */

/* ---- Causal self-attention with grouped-query heads ----
 * q (B,T,H,D), k and v (B,T,Hkv,D), out (B,T,H,D): S. H % Hkv == 0; query head h reads key-value
 * head h / (H/Hkv). Scores s = (q_t . k_u) * scale for u <= t, softmax over u, out_t = sum p v_u.
 * With pos, only u in [t - pos[b*T + t], t], the keys of t's document, are scored.
 * The variants of struct tz_attn_opts (NULL: all zero, Llama's attention):
 *   scale    0: 1 / sqrt(D); else the scores' scale (Gemma's query_pre_attn_scalar^-1/2)
 *   softcap  > 0: each score s becomes softcap * tanh(s / softcap) before the softmax (Gemma 2's
 *            attn_logit_softcapping), in float; 0: none
 *   window   > 0: query t scores only the keys u with t - u < window (a sliding-window layer, as
 *            transformers masks it: kv_idx > q_idx - sliding_window), inside its document too;
 *            0: every earlier key
 * A backend without them (ops' variants 0) refuses any that is not zero, by name.
 * lse (B,H,T) F32: the logsumexp of each row of scores, saved for backward (flash-style: no
 * (T,T) matrix needs to be kept).
 * bwd: dq (B,T,H,D), dk and dv (B,T,Hkv,D) S are overwritten; dout, q, k, v, out, lse as in fwd.
 *      delta (B,H,T) F32 is scratch the caller provides (it receives rowsum(dout * out)).
 *      dk and dv sum over the H/Hkv query heads of a group and over t in an order that the
 *      backend fixes (never the thread count or timing). */
struct tz_attn_opts {
  float scale, softcap;
  int window;
};
int tz_compute_attention_fwd(tz_compute *cm, void *out, float *lse, const void *q, const void *k,
                             const void *v, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                             const struct tz_attn_opts *opt);
int tz_compute_attention_bwd(tz_compute *cm, void *dq, void *dk, void *dv, float *delta,
                             const void *dout, const void *q, const void *k, const void *v,
                             const void *out, const float *lse, int B, int T, int H, int Hkv, int D,
                             const int32_t *pos, const struct tz_attn_opts *opt);

/* ---- Gated MLP activation: out = act(g) * u ----
 * act TZ_GLU_SILU (SwiGLU, Llama): silu(g) = g / (1 + exp(-g));
 *     TZ_GLU_GELU_TANH (GeGLU, Gemma's gelu_pytorch_tanh):
 *     gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
 * A backend without TZ_GLU_GELU_TANH (ops' variants 0) refuses it by name.
 * fwd: out (N,F) S from g, u (N,F) S. out may alias g or u.
 * bwd: dg, du (N,F) S overwritten from dout, g, u (N,F) S. dg may alias g, du may alias u.
 *      out (N,F) S, unless NULL, receives the forward's output in the same pass (the bits of
 *      glu_fwd), for a backward that rebuilds it instead of keeping it; it overlaps nothing. */
enum tz_glu { TZ_GLU_SILU = 0, TZ_GLU_GELU_TANH = 1 };
int tz_compute_glu_fwd(tz_compute *cm, enum tz_glu act, void *out, const void *g, const void *u,
                       size_t n);
int tz_compute_glu_bwd(tz_compute *cm, enum tz_glu act, void *dg, void *du, void *out,
                       const void *dout, const void *g, const void *u, size_t n);

/* ---- Cross-entropy fused with softmax: forward loss and backward dlogits in one call ----
 * logits (N,V) S, targets (N) int32 in [0, V) (else TZ_EINVAL, as for embedding), or
 * TZ_TARGET_IGNORE: a row that is not a target (a prompt token, padding), whose loss and dlogits
 * are 0.
 * softcap > 0 (Gemma 2's final_logit_softcapping): each logit l becomes z = softcap *
 * tanh(l / softcap) first, in float, and the gradient goes back through it; 0: z = l. A backend
 * without it (ops' variants 0) refuses one that is not 0, by name.
 * losses (N) F32 = logsumexp(z_n) - z_n[target_n].
 * dlogits (N,V) S = (softmax(z_n) - onehot(target_n)) * dscale * dz/dl, where the caller chooses
 * dscale (1 / the number of tokens in the whole step, for a mean over micro-batches). dlogits may
 * alias logits (computed in place); NULL skips the backward (evaluation). The row's max and sum
 * are float; backends may walk the vocabulary in chunks. */
#define TZ_TARGET_IGNORE (-1)
int tz_compute_xent(tz_compute *cm, float *losses, void *dlogits, const void *logits,
                    const int32_t *targets, int N, int V, float dscale, float softcap);
/* logits (N,V) S in place: l = softcap * tanh(l / softcap) (the logits Gemma 2 returns; xent
 * applies it itself). softcap > 0. */
int tz_compute_softcap(tz_compute *cm, void *logits, size_t n, float softcap);

/* ---- Mixture of experts (Qwen3-MoE, Mixtral, OLMoE) ----
 * N tokens each go to k of E experts (1 <= k <= E <= TZ_MOE_MAX_EXPERTS); the M = N*k
 * assignments n*k + j (token n's j-th choice) are grouped by expert, so that each expert's rows
 * are contiguous and its projections are plain matmuls on them. A backend without these ops (the
 * ops' moe 0: cuda for now) refuses each by name. Everything is deterministic: no atomics, every
 * sum in an order fixed below.
 * route: probs (N,E) F32 = softmax of each row of logits (N,E) S, in float (max subtracted);
 *   idx (N,k) int32 the k experts of largest prob, largest first (ties: the lower expert first);
 *   w (N,k) F32 their probs, divided by their sum (added in j order) when norm, then rounded to S
 *   (transformers' routing weights are of the hidden dtype); and the grouping: offsets (E+1)
 *   int32 with expert e's rows in [offsets[e], offsets[e+1]), the assignments ordered by expert,
 *   then token; rows (M) int32 the token of each row; slot (M) int32 the row of assignment
 *   n*k + j. stats (2E) F32 unless NULL: stats[e] += the assignments of expert e, stats[E + e] +=
 *   the sum of probs[n][e] over n in increasing order (the load-balancing loss's two terms).
 * route_bwd: dlogits (N,E) S from dw (N,k) F32, the gradient at w, through the normalisation
 *   (norm) and the softmax; daux (E) F32 unless NULL is added to every row's gradient at probs
 *   (the load-balancing loss's). Reads probs, idx (and w with norm) of r.
 * gather: xs (M,C) S row p = x (N,C) S row rows[p].
 * scatter: dx (N,C) S row n = the sum of dxs (M,C) S rows slot[n*k + j] over j in increasing
 *   slot order (gather's backward), in float, rounded once.
 * combine: out (N,C) S row n = res row n (NULL: 0) + the sum over j, in increasing slot order,
 *   of w[n*k + j] * y row slot[n*k + j] (y (M,C) S: the experts' outputs), in float, rounded
 *   once. out may alias res.
 * combine_bwd: dy (M,C) S row slot[n*k + j] = w[n*k + j] * dout row n; dw (N,k) F32 = the dot
 *   product of dout row n and y row slot[n*k + j], over columns in order.
 * gate_fwd (Qwen2-MoE's shared expert): out (N,C) S row n = res row n + sigmoid(s[n]) * y row n,
 *   s (N) S the gate's logits, in float, rounded once; out may alias res.
 * gate_bwd: dy (N,C) S = sigmoid(s[n]) * dout row n; ds (N) S = sigmoid'(s[n]) times the dot
 *   product of dout row n and y row n (columns in order). The gate is optional within the
 *   experts' ops (tz_compute_moe says 2 for a backend that has it). */
#define TZ_MOE_MAX_EXPERTS 1024
struct tz_moe_route {
  float *probs;     /* (N,E) F32 */
  int32_t *idx;     /* (N,k) */
  float *w;         /* (N,k) F32 */
  int32_t *offsets; /* (E+1) */
  int32_t *rows;    /* (M) */
  int32_t *slot;    /* (M) */
};
int tz_compute_moe_route(tz_compute *cm, const struct tz_moe_route *r, float *stats,
                         const void *logits, int N, int E, int k, int norm);
int tz_compute_moe_route_bwd(tz_compute *cm, void *dlogits, const struct tz_moe_route *r,
                             const float *dw, const float *daux, int N, int E, int k, int norm);
int tz_compute_moe_gather(tz_compute *cm, void *xs, const void *x, const int32_t *rows, int M,
                          int C);
int tz_compute_moe_scatter(tz_compute *cm, void *dx, const void *dxs, const int32_t *slot, int N,
                           int k, int C);
int tz_compute_moe_combine(tz_compute *cm, void *out, const void *res, const void *y,
                           const float *w, const int32_t *slot, int N, int k, int C);
int tz_compute_moe_combine_bwd(tz_compute *cm, void *dy, float *dw, const void *dout, const void *y,
                               const float *w, const int32_t *slot, int N, int k, int C);
int tz_compute_moe_gate_fwd(tz_compute *cm, void *out, const void *res, const void *y,
                            const void *s, int N, int C);
int tz_compute_moe_gate_bwd(tz_compute *cm, void *dy, void *ds, const void *dout, const void *y,
                            const void *s, int N, int C);

/* ---- Optimizer ----
 * One Adam step over n elements in place, exactly as kernels/adam.h defines it (the same bits on
 * every backend): master, m, v (n) F32 read and written, grad (n) of grad_dtype read, param_copy
 * NULL or (n) of copy_dtype written from the new master; backend memory, not overlapping. p is
 * copied before the call returns. cpu: tz_adam_cpu on the instance's threads (tz_compute_threads),
 * run at once; cuda: the GPU kernel, enqueued. TZ_EINVAL as tz_adam_cpu; TZ_ENOTSUP for a backend
 * without it. */
int tz_compute_adam(tz_compute *cm, const struct tz_adam_params *p, float *master, float *m,
                    float *v, const void *grad, enum tz_dtype grad_dtype, void *param_copy,
                    enum tz_dtype copy_dtype, size_t n);

#ifdef __cplusplus
}
#endif

#endif
