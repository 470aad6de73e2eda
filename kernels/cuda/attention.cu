/* Causal grouped-query attention, flash-style: the (T, T) matrix of scores is never formed.
 *
 * Two implementations. attention_mma.cu has the tensor-core kernels for 16-bit storage and head
 * dims that are multiples of 4 up to 128 (the shapes that matter for speed). This file has plain
 * float kernels for every other case (f32 storage, other head dims) and for checking the
 * tensor-core ones (TZ_CUDA_ATTENTION=simple selects them everywhere). Both have the same
 * structure: forward   one block per (query tile, head, batch): key/value tiles pass through shared
 *             memory, an online softmax keeps each row's max and sum in float, and the row's
 *             logsumexp is saved for backward;
 *   backward  delta = rowsum(dout * out) first; then one pass per query tile recomputes the
 *             probabilities from the logsumexp and accumulates dq, and a separate pass per key
 *             tile recomputes them again and accumulates dk and dv over the query heads of its
 *             group and every later query, in a fixed order. No output has two writers, so no
 *             atomics are needed.
 * The plain kernels follow the cpu backend's loop order (dot products over d in order, sums over
 * keys or queries in increasing index), so with f32 storage they differ from it only by expf
 * (and tanhf, softcapped). Every kernel takes the variants (common.cuh, struct tz_attn_var) and
 * packed documents; which serves a call is tz_cuda_attention_choose's (choice.c). */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define LOG2E_F 1.4426950408889634f

#define BQ 32 /* query rows per tile */
#define BK 32 /* key rows per tile */
#define THREADS 256

/* A (rows, D) tile of x (row t at base + t * stride) into float shared memory with row pitch
 * `pitch`; rows at or past T_ are zero. */
template <typename T>
__device__ void tile_to_float(float *s, int pitch, const T *base, size_t stride, int row0, int rows,
                              int T_, int D) {
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
    int r = e / D, d = e % D, t = row0 + r;
    s[r * pitch + d] = t < T_ ? tz_ld(base[(size_t)t * stride + d]) : 0.0f;
  }
}

__device__ __forceinline__ float dot_f(const float *a, const float *b, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; d++)
    s = __fadd_rn(s, __fmul_rn(a[d], b[d]));
  return s;
}

/* A score from its product (the cpu backend's attn_score): dot * scale, through the softcap
 * where there is one, whose slope (1 - tanh^2; 1 without) goes to *slope. */
__device__ __forceinline__ float plain_score(float dot, const tz_attn_var &v, float *slope) {
  float s = __fmul_rn(dot, v.scale);
  *slope = 1.0f;
  if (v.cap > 0.0f) {
    float th = tanhf(__fdiv_rn(s, v.cap));
    s = __fmul_rn(v.cap, th);
    *slope = __fsub_rn(1.0f, __fmul_rn(th, th));
  }
  return s;
}

/* The score gradient times the scale (the cpu's (ds * slope) * scale; ds * scale uncapped) */
__device__ __forceinline__ float plain_dscore(float ds, float slope, const tz_attn_var &v) {
  return v.cap > 0.0f ? __fmul_rn(__fmul_rn(ds, slope), v.scale) : __fmul_rn(ds, v.scale);
}

/* ---- forward ---- */

template <typename T>
__global__ void __launch_bounds__(THREADS)
    attn_fwd_kernel(T *out, float *lse, const T *q, const T *k, const T *v, int T_, int H, int Hkv,
                    int D, const tz_attn_var var, const int32_t *pos) {
  extern __shared__ float smem[];
  const int DP = D + 1;     /* key and value rows padded: threads of a warp read different rows */
  float *sQ = smem;         /* (BQ, D) */
  float *sO = sQ + BQ * D;  /* (BQ, D) unnormalised output */
  float *sK = sO + BQ * D;  /* (BK, DP) */
  float *sV = sK + BK * DP; /* (BK, DP) */
  float *sS = sV + BK * DP; /* (BQ, BK) scores, then probabilities */
  float *sM = sS + BQ * BK; /* (BQ) running max */
  float *sL = sM + BQ;      /* (BQ) running sum */
  float *sA = sL + BQ;      /* (BQ) rescale factor of this tile */
  int *sSt = (int *)(sA + BQ);               /* (BQ) the first key of each row (tz_first_key) */
  const int qt = gridDim.x - 1 - blockIdx.x; /* the longest rows first */
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const int i0 = qt * BQ;
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const T *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
  const T *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const T *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;

  tile_to_float(sQ, D, qb, qs, i0, BQ, T_, D);
  for (int e = threadIdx.x; e < BQ * D; e += blockDim.x)
    sO[e] = 0.0f;
  if (threadIdx.x < BQ) {
    sM[threadIdx.x] = -INFINITY;
    sL[threadIdx.x] = 0.0f;
    sSt[threadIdx.x] = tz_first_key(pos, b, T_, i0 + threadIdx.x, var.window);
  }
  __syncthreads();
  const int last_key = min(i0 + BQ, T_) - 1;
  /* Key tiles before the first row's first key hold no key any row of the tile sees. */
  for (int j0 = sSt[0] / BK * BK; j0 <= last_key; j0 += BK) {
    __syncthreads(); /* the previous tile is no longer read */
    tile_to_float(sK, DP, kb, ks, j0, BK, T_, D);
    tile_to_float(sV, DP, vb, ks, j0, BK, T_, D);
    __syncthreads();
    for (int e = threadIdx.x; e < BQ * BK; e += blockDim.x) {
      int i = e / BK, j = e % BK, ti = i0 + i, tj = j0 + j;
      float slope;
      sS[e] = tj <= ti && tj >= sSt[i] && ti < T_
                  ? plain_score(dot_f(sQ + i * D, sK + j * DP, D), var, &slope)
                  : -INFINITY;
    }
    __syncthreads();
    if (threadIdx.x < BQ) {
      int i = threadIdx.x;
      float *row = sS + i * BK;
      float m_old = sM[i], m = m_old;
      for (int j = 0; j < BK; j++)
        m = fmaxf(m, row[j]);
      float alpha = 1.0f, sum = 0.0f;
      if (m == -INFINITY) {
        /* nothing visible yet (only rows past T_): keep the row empty */
        for (int j = 0; j < BK; j++)
          row[j] = 0.0f;
      } else {
        alpha = expf(__fsub_rn(m_old, m));
        for (int j = 0; j < BK; j++) {
          row[j] = expf(__fsub_rn(row[j], m));
          sum = __fadd_rn(sum, row[j]);
        }
      }
      sM[i] = m;
      sL[i] = __fadd_rn(__fmul_rn(sL[i], alpha), sum);
      sA[i] = alpha;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < BQ * D; e += blockDim.x) {
      int i = e / D, d = e % D;
      const float *p = sS + i * BK;
      float o = __fmul_rn(sO[e], sA[i]);
      for (int j = 0; j < BK; j++)
        o = __fadd_rn(o, __fmul_rn(p[j], sV[j * DP + d]));
      sO[e] = o;
    }
  }
  __syncthreads();
  T *ob = out + (size_t)b * T_ * qs + (size_t)h * D;
  for (int e = threadIdx.x; e < BQ * D; e += blockDim.x) {
    int i = e / D, d = e % D, ti = i0 + i;
    if (ti < T_)
      ob[(size_t)ti * qs + d] = tz_st<T>(__fdiv_rn(sO[e], sL[i]));
  }
  if (threadIdx.x < BQ && i0 + (int)threadIdx.x < T_) {
    int i = threadIdx.x;
    lse[((size_t)b * H + h) * T_ + i0 + i] = __fadd_rn(sM[i], logf(sL[i]));
  }
}

/* ---- backward ---- */

/* delta[b][h][t] = sum over d of dout * out: one warp per (b, t, h) row. */
template <typename T>
__global__ void attn_delta_kernel(float *delta, const T *dout, const T *out, int T_, int H, int D,
                                  size_t rows) {
  size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  unsigned lane = threadIdx.x & 31u;
  if (r >= rows)
    return; /* whole warps */
  const T *a = dout + r * D, *o = out + r * D;
  float s = 0.0f;
  for (int d = lane; d < D; d += 32)
    s = __fadd_rn(s, __fmul_rn(tz_ld(a[d]), tz_ld(o[d])));
  for (int m = 16; m >= 1; m >>= 1)
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
  if (lane == 0) {
    /* r enumerates (b, t, h) with h fastest; delta is (B, H, T) */
    size_t h = r % (size_t)H, bt = r / (size_t)H;
    size_t t = bt % (size_t)T_, b = bt / (size_t)T_;
    delta[(b * H + h) * T_ + t] = s;
  }
}

/* dq for one (query tile, head, batch): dq_t = scale sum_u p (dp - delta_t) k_u. */
template <typename T>
__global__ void __launch_bounds__(THREADS)
    attn_bwd_dq_kernel(T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse,
                       const float *delta, int T_, int H, int Hkv, int D, const tz_attn_var var,
                       const int32_t *pos) {
  extern __shared__ float smem[];
  const int DP = D + 1;
  float *sQ = smem;          /* (BQ, D) */
  float *sdO = sQ + BQ * D;  /* (BQ, D) */
  float *sdQ = sdO + BQ * D; /* (BQ, D) */
  float *sK = sdQ + BQ * D;  /* (BK, DP) */
  float *sV = sK + BK * DP;  /* (BK, DP) */
  float *sW = sV + BK * DP;  /* (BQ, BK) ds * scale */
  float *sLse = sW + BQ * BK;
  float *sDel = sLse + BQ;
  int *sSt = (int *)(sDel + BQ); /* (BQ) the first key of each row (tz_first_key) */
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / (H / Hkv);
  const int i0 = qt * BQ;
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const T *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
  const T *dob = dout + (size_t)b * T_ * qs + (size_t)h * D;
  const T *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const T *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;
  const float *lb = lse + ((size_t)b * H + h) * T_, *db = delta + ((size_t)b * H + h) * T_;

  tile_to_float(sQ, D, qb, qs, i0, BQ, T_, D);
  tile_to_float(sdO, D, dob, qs, i0, BQ, T_, D);
  for (int e = threadIdx.x; e < BQ * D; e += blockDim.x)
    sdQ[e] = 0.0f;
  if (threadIdx.x < BQ) {
    int ti = i0 + threadIdx.x;
    sLse[threadIdx.x] = ti < T_ ? lb[ti] : 0.0f;
    sDel[threadIdx.x] = ti < T_ ? db[ti] : 0.0f;
    sSt[threadIdx.x] = tz_first_key(pos, b, T_, ti, var.window);
  }
  __syncthreads();
  const int last_key = min(i0 + BQ, T_) - 1;
  for (int j0 = sSt[0] / BK * BK; j0 <= last_key; j0 += BK) {
    __syncthreads();
    tile_to_float(sK, DP, kb, ks, j0, BK, T_, D);
    tile_to_float(sV, DP, vb, ks, j0, BK, T_, D);
    __syncthreads();
    for (int e = threadIdx.x; e < BQ * BK; e += blockDim.x) {
      int i = e / BK, j = e % BK, ti = i0 + i, tj = j0 + j;
      float w = 0.0f;
      if (tj <= ti && tj >= sSt[i] && ti < T_) {
        float slope;
        float s = plain_score(dot_f(sQ + i * D, sK + j * DP, D), var, &slope);
        float p = expf(__fsub_rn(s, sLse[i]));
        float ds = __fmul_rn(p, __fsub_rn(dot_f(sdO + i * D, sV + j * DP, D), sDel[i]));
        w = plain_dscore(ds, slope, var);
      }
      sW[e] = w;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < BQ * D; e += blockDim.x) {
      int i = e / D, d = e % D;
      const float *w = sW + i * BK;
      float acc = sdQ[e];
      for (int j = 0; j < BK; j++)
        acc = __fadd_rn(acc, __fmul_rn(w[j], sK[j * DP + d]));
      sdQ[e] = acc;
    }
  }
  __syncthreads();
  T *dqb = dq + (size_t)b * T_ * qs + (size_t)h * D;
  for (int e = threadIdx.x; e < BQ * D; e += blockDim.x) {
    int i = e / D, d = e % D, ti = i0 + i;
    if (ti < T_)
      dqb[(size_t)ti * qs + d] = tz_st<T>(sdQ[e]);
  }
}

/* dk and dv for one (key tile, key-value head, batch): sums over the group's query heads in
 * increasing h, and within a head over queries t >= u in increasing t, as the cpu backend. */
template <typename T>
__global__ void __launch_bounds__(THREADS)
    attn_bwd_dkdv_kernel(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                         const float *lse, const float *delta, int T_, int H, int Hkv, int D,
                         const tz_attn_var var, const int32_t *pos) {
  extern __shared__ float smem[];
  const int DP = D + 1;
  float *sK = smem;          /* (BK, D) */
  float *sV = sK + BK * D;   /* (BK, D) */
  float *sdK = sV + BK * D;  /* (BK, D) */
  float *sdV = sdK + BK * D; /* (BK, D) */
  float *sQ = sdV + BK * D;  /* (BQ, DP) */
  float *sdO = sQ + BQ * DP; /* (BQ, DP) */
  float *sP = sdO + BQ * DP; /* (BK, BQ) p */
  float *sW = sP + BK * BQ;  /* (BK, BQ) ds * scale */
  float *sLse = sW + BK * BQ;
  float *sDel = sLse + BQ;
  int *sSt = (int *)(sDel + BQ); /* (BQ) the first key of each query row (tz_first_key) */
  const int j0 = blockIdx.x * BK, hk = blockIdx.y, b = blockIdx.z;
  const int group = H / Hkv;
  const size_t qs = (size_t)H * D, ks = (size_t)Hkv * D;
  const T *kb = k + (size_t)b * T_ * ks + (size_t)hk * D;
  const T *vb = v + (size_t)b * T_ * ks + (size_t)hk * D;

  tile_to_float(sK, D, kb, ks, j0, BK, T_, D);
  tile_to_float(sV, D, vb, ks, j0, BK, T_, D);
  for (int e = threadIdx.x; e < BK * D; e += blockDim.x)
    sdK[e] = sdV[e] = 0.0f;
  for (int h = hk * group; h < (hk + 1) * group; h++) {
    const T *qb = q + (size_t)b * T_ * qs + (size_t)h * D;
    const T *dob = dout + (size_t)b * T_ * qs + (size_t)h * D;
    const float *lb = lse + ((size_t)b * H + h) * T_, *db = delta + ((size_t)b * H + h) * T_;
    /* queries from the tile holding j0 onward; earlier ones cannot see these keys, and once a
     * tile's first query's first key (its document's or its window's) lies past the last key
     * here, no later query sees one (first keys increase along a row) */
    for (int i0 = j0 / BQ * BQ; i0 < T_ && tz_first_key(pos, b, T_, i0, var.window) < j0 + BK;
         i0 += BQ) {
      __syncthreads();
      tile_to_float(sQ, DP, qb, qs, i0, BQ, T_, D);
      tile_to_float(sdO, DP, dob, qs, i0, BQ, T_, D);
      if (threadIdx.x < BQ) {
        int ti = i0 + threadIdx.x;
        sLse[threadIdx.x] = ti < T_ ? lb[ti] : 0.0f;
        sDel[threadIdx.x] = ti < T_ ? db[ti] : 0.0f;
        sSt[threadIdx.x] = tz_first_key(pos, b, T_, ti, var.window);
      }
      __syncthreads();
      for (int e = threadIdx.x; e < BK * BQ; e += blockDim.x) {
        int j = e / BQ, i = e % BQ, tj = j0 + j, ti = i0 + i;
        float p = 0.0f, w = 0.0f;
        if (tj <= ti && tj >= sSt[i] && ti < T_) {
          float slope;
          float s = plain_score(dot_f(sQ + i * DP, sK + j * D, D), var, &slope);
          p = expf(__fsub_rn(s, sLse[i]));
          float ds = __fmul_rn(p, __fsub_rn(dot_f(sdO + i * DP, sV + j * D, D), sDel[i]));
          w = plain_dscore(ds, slope, var);
        }
        sP[e] = p;
        sW[e] = w;
      }
      __syncthreads();
      for (int e = threadIdx.x; e < BK * D; e += blockDim.x) {
        int j = e / D, d = e % D;
        const float *p = sP + j * BQ, *w = sW + j * BQ;
        float ak = sdK[e], av = sdV[e];
        for (int i = 0; i < BQ; i++) {
          ak = __fadd_rn(ak, __fmul_rn(w[i], sQ[i * DP + d]));
          av = __fadd_rn(av, __fmul_rn(p[i], sdO[i * DP + d]));
        }
        sdK[e] = ak;
        sdV[e] = av;
      }
    }
  }
  __syncthreads();
  T *dkb = dk + (size_t)b * T_ * ks + (size_t)hk * D;
  T *dvb = dv + (size_t)b * T_ * ks + (size_t)hk * D;
  for (int e = threadIdx.x; e < BK * D; e += blockDim.x) {
    int j = e / D, d = e % D, tj = j0 + j;
    if (tj < T_) {
      dkb[(size_t)tj * ks + d] = tz_st<T>(sdK[e]);
      dvb[(size_t)tj * ks + d] = tz_st<T>(sdV[e]);
    }
  }
}

/* ---- launches ---- */

static size_t fwd_smem(int D) {
  return sizeof(float) * ((size_t)2 * BQ * D + (size_t)2 * BK * (D + 1) + BQ * BK + 4 * BQ);
}
static size_t dq_smem(int D) {
  return sizeof(float) * ((size_t)3 * BQ * D + (size_t)2 * BK * (D + 1) + BQ * BK + 3 * BQ);
}
static size_t dkdv_smem(int D) {
  return sizeof(float) * ((size_t)4 * BK * D + (size_t)2 * BQ * (D + 1) + 2 * BK * BQ + 3 * BQ);
}

/* Grants a kernel the dynamic shared memory it needs, or says why it cannot have it. */
static int smem_grant(struct tz_cuda *c, const void *kernel, size_t bytes, const char *op, int D) {
  if (bytes > c->smem_optin)
    return tz_err_set(TZ_ENOTSUP,
                      "compute cuda %s: head dim %d needs %zu bytes of shared memory, the "
                      "device allows %zu",
                      op, D, bytes, c->smem_optin);
  TZ_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  return 0;
}

static int check_grid(int B, int H) {
  if (B > 65535 || H > 65535)
    return tz_err_set(TZ_EINVAL, "compute cuda attention: B=%d or heads=%d above 65535", B, H);
  return 0;
}

/* The least alignment of the n tensors ts, in bytes, up to 256. */
static unsigned least_alignment(const void *const *ts, int n) {
  uintptr_t bits = 256;
  for (int i = 0; i < n; i++)
    bits |= (uintptr_t)ts[i];
  return (unsigned)(bits & (~bits + 1));
}

/* The kernels tz_cuda_attention_choose gives a call of this instance. */
static struct tz_cuda_attention_choice choose(const struct tz_cuda *c, int H, int Hkv, int D,
                                              const void *const *ts, int n, const int32_t *pos,
                                              const struct tz_attn_var &var) {
  struct tz_cuda_attention_call call = {
      c->S, c->sm90, H, Hkv, D, least_alignment(ts, n), pos || !tz_attn_var_default(var, D)};
  return tz_cuda_attention_choose(c->attention, &call);
}

/* A kernel that declined a call the choice gave it: the choice and the kernel's own checks
 * disagree, a programmer's error. */
static int declined(const char *op, enum tz_cuda_attention_kernel k, int D) {
  return tz_err_set(TZ_EINVAL,
                    "compute cuda %s: the %s kernels declined head dim %d, which "
                    "tz_cuda_attention_choose gave them",
                    op, tz_cuda_attention_kernel_name(k), D);
}

struct tz_attn_var tz_attn_var_of(const struct tz_attn_opts *opt, int D) {
  struct tz_attn_var v = {1.0f / sqrtf((float)D), 0.0f, 0.0f, 0.0f, 0, 0};
  if (!opt)
    return v;
  if (opt->scale > 0.0f)
    v.scale = opt->scale;
  if (opt->softcap > 0.0f) {
    v.cap = opt->softcap;
    v.cap_in = v.scale / v.cap;
    v.cap_log2 = v.cap * LOG2E_F;
  }
  v.window = opt->window;
  return v;
}

int tz_cuda_attention_fwd(void *ctx, void *out, float *lse, const void *q, const void *k,
                          const void *v, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                          const struct tz_attn_opts *opt) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CHECK(check_grid(B, H));
  const void *ts[] = {out, q, k, v};
  struct tz_attn_var var = tz_attn_var_of(opt, D);
  var.tanh_approx = c->softcap_approx; /* the tensor-core kernels' (the plain ones stay exact) */
  struct tz_cuda_attention_choice ch = choose(c, H, Hkv, D, ts, 4, pos, var);
  if (ch.fwd != TZ_CUDA_KERNEL_PLAIN) {
    int rc = ch.fwd == TZ_CUDA_KERNEL_WGMMA
                 ? tz_cuda_attention_fwd_wgmma(c, out, lse, q, k, v, B, T, H, Hkv, D, pos, var)
                 : tz_cuda_attention_fwd_mma(c, out, lse, q, k, v, B, T, H, Hkv, D, pos, var);
    return rc > 0 ? declined("attention_fwd", ch.fwd, D) : rc;
  }
  dim3 grid((unsigned)((T + BQ - 1) / BQ), (unsigned)H, (unsigned)B);
  size_t smem = fwd_smem(D);
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using TT = decltype(tag);
    TZ_CHECK(smem_grant(c, (const void *)attn_fwd_kernel<TT>, smem, "attention_fwd", D));
    attn_fwd_kernel<TT><<<grid, THREADS, smem, c->stream>>>(
        (TT *)out, lse, (const TT *)q, (const TT *)k, (const TT *)v, T, H, Hkv, D, var, pos);
    TZ_CU_LAUNCHED();
    return 0;
  });
}

int tz_cuda_attention_bwd(void *ctx, void *dq, void *dk, void *dv, float *delta, const void *dout,
                          const void *q, const void *k, const void *v, const void *out,
                          const float *lse, int B, int T, int H, int Hkv, int D, const int32_t *pos,
                          const struct tz_attn_opts *opt) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  struct tz_attn_var var = tz_attn_var_of(opt, D);
  var.tanh_approx = c->softcap_approx; /* the tensor-core kernels' (the plain ones stay exact) */
  TZ_CHECK(check_grid(B, H));
  size_t rows = (size_t)B * T * H;
  TZ_CHECK(tz_cuda_dispatch(c->S, [&](auto tag) {
    using TT = decltype(tag);
    size_t blocks = (rows * 32 + THREADS - 1) / THREADS;
    attn_delta_kernel<TT><<<(unsigned)blocks, THREADS, 0, c->stream>>>(
        delta, (const TT *)dout, (const TT *)out, T, H, D, rows);
    TZ_CU_LAUNCHED();
    return 0;
  }));
  const void *ts[] = {dq, dk, dv, dout, q, k, v};
  struct tz_cuda_attention_choice ch = choose(c, H, Hkv, D, ts, 7, pos, var);
  if (ch.bwd != TZ_CUDA_KERNEL_PLAIN) {
    int rc = ch.bwd == TZ_CUDA_KERNEL_WGMMA
                 ? tz_cuda_attention_bwd_wgmma(c, dq, dk, dv, delta, dout, q, k, v, lse, B, T, H,
                                               Hkv, D, pos, var)
                 : tz_cuda_attention_bwd_mma(c, dq, dk, dv, delta, dout, q, k, v, lse, B, T, H, Hkv,
                                             D, pos, var);
    return rc > 0 ? declined("attention_bwd", ch.bwd, D) : rc;
  }
  dim3 grid_q((unsigned)((T + BQ - 1) / BQ), (unsigned)H, (unsigned)B);
  dim3 grid_k((unsigned)((T + BK - 1) / BK), (unsigned)Hkv, (unsigned)B);
  size_t smem_q = dq_smem(D), smem_k = dkdv_smem(D);
  return tz_cuda_dispatch(c->S, [&](auto tag) {
    using TT = decltype(tag);
    TZ_CHECK(smem_grant(c, (const void *)attn_bwd_dq_kernel<TT>, smem_q, "attention_bwd", D));
    TZ_CHECK(smem_grant(c, (const void *)attn_bwd_dkdv_kernel<TT>, smem_k, "attention_bwd", D));
    attn_bwd_dq_kernel<TT><<<grid_q, THREADS, smem_q, c->stream>>>(
        (TT *)dq, (const TT *)dout, (const TT *)q, (const TT *)k, (const TT *)v, lse, delta, T, H,
        Hkv, D, var, pos);
    TZ_CU_LAUNCHED();
    attn_bwd_dkdv_kernel<TT><<<grid_k, THREADS, smem_k, c->stream>>>(
        (TT *)dk, (TT *)dv, (const TT *)dout, (const TT *)q, (const TT *)k, (const TT *)v, lse,
        delta, T, H, Hkv, D, var, pos);
    TZ_CU_LAUNCHED();
    return 0;
  });
}
