/* The pieces the tensor-core attention kernels share (attention_mma.cu: forward and the two-pass
 * backward; attention_onepass.cu: the one-pass backward): fragment addressing in shared tiles,
 * tile widths, cp.async tile loads, and quad reductions. The fragment layouts and the tile
 * widths are described at the top of attention_mma.cu. */
#ifndef TZ_KERNELS_CUDA_ATTENTION_MMA_CUH
#define TZ_KERNELS_CUDA_ATTENTION_MMA_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/ptx.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

namespace tz_attn {

using namespace tz_ptx;

/* ---- fragment addressing in a row-major shared tile with pitch P elements ---- */

/* A fragment of the 16x16 block at (r0, c0). */
template <int P, typename T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T *s, int r0, int c0, int lane) {
  ldsm_x4(a, s + (r0 + (lane & 15)) * P + c0 + (lane >> 4) * 8);
}

/* B fragments for two n-tiles from a tile stored n-major (row n holds the k values: B^T
 * row-major, e.g. K when B = K^T): rows n0..n0+15, k columns k0..k0+15. b[0], b[1] are n-tile
 * n0's b0, b1 and b[2], b[3] n-tile n0+8's. */
template <int P, typename T>
__device__ __forceinline__ void load_b_nmajor(uint32_t (&b)[4], const T *s, int n0, int k0,
                                              int lane) {
  ldsm_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * P + k0 + ((lane >> 3) & 1) * 8);
}

/* B fragments for two n-tiles from a tile stored k-major (row k holds the n values, e.g. V when
 * B = V): rows k0..k0+15, n columns n0..n0+15, through the transposing ldmatrix. */
template <int P, typename T>
__device__ __forceinline__ void load_b_kmajor(uint32_t (&b)[4], const T *s, int k0, int n0,
                                              int lane) {
  ldsm_x4_t(b, s + (k0 + (lane & 15)) * P + n0 + (lane >> 4) * 8);
}

/* An A fragment of the 16x16 block at rows m0.., k columns k0.. from a tile stored k-major
 * (row k holds the m values: A^T row-major, e.g. dS when dS^T is stored), through the
 * transposing ldmatrix: matrices (k0.., m0..), (k0.., m0 + 8..), (k0 + 8.., m0..), (k0 + 8..,
 * m0 + 8..) give a0..a3. */
template <int P, typename T>
__device__ __forceinline__ void load_a_kmajor(uint32_t (&a)[4], const T *s, int k0, int m0,
                                              int lane) {
  ldsm_x4_t(a, s + (k0 + (lane & 7) + ((lane >> 4) << 3)) * P + m0 + ((lane >> 3) & 1) * 8);
}

/* The A fragment for columns 16j..16j+15 of a warp's (16, 8 * NT) float C tiles. */
template <typename T, int NT>
__device__ __forceinline__ void pack_a(uint32_t (&a)[4], const float (&c)[NT][4], int j) {
  a[0] = mma16<T>::pack(c[2 * j][0], c[2 * j][1]);
  a[1] = mma16<T>::pack(c[2 * j][2], c[2 * j][3]);
  a[2] = mma16<T>::pack(c[2 * j + 1][0], c[2 * j + 1][1]);
  a[3] = mma16<T>::pack(c[2 * j + 1][2], c[2 * j + 1][3]);
}

/* A tile width: DP columns in shared memory (a multiple of 16), row pitch P = DP + 8 elements
 * (rows stay 16-byte aligned, and P / 8 is odd, so the 8 rows an ldmatrix reads fall in distinct
 * bank groups). PAD: the true head dim D may be less than DP and is a runtime value. */
template <int DP_, bool PAD_> struct width {
  static constexpr int DP = DP_;
  static constexpr bool PAD = PAD_;
  static constexpr int P = DP_ + 8;
  static_assert(DP_ % 16 == 0 && DP_ >= 32 && DP_ <= 128, "tile width");
};

/* ROWS rows of D elements from global (row t at base + t * stride) into a shared tile of W's
 * width, with cp.async by a block of NT threads; rows at or past `valid` and columns D..DP-1 are
 * zero-filled (nothing is read for them). Exact widths copy 16 bytes at a time, padded ones 8. */
template <int ROWS, typename W, int NT = 128, typename T>
__device__ __forceinline__ void load_tile(T *s, const T *base, size_t stride, int row0, int valid,
                                          int D) {
  constexpr int CW = W::PAD ? 4 : 8; /* elements per copy */
  constexpr int CHUNKS = W::DP / CW;
  for (int i = threadIdx.x; i < ROWS * CHUNKS; i += NT) {
    int r = i / CHUNKS, col = (i % CHUNKS) * CW;
    if constexpr (W::PAD) {
      int ok = r < valid && col < D;
      const T *src = base + (ok ? (size_t)(row0 + r) * stride + col : 0);
      cp_async8(s + r * W::P + col, src, ok ? 8 : 0);
    } else {
      (void)D;
      int ok = r < valid;
      const T *src = base + (ok ? (size_t)(row0 + r) * stride : 0) + col;
      cp_async16(s + r * W::P + col, src, ok ? 16 : 0);
    }
  }
}

template <typename T> __device__ __forceinline__ void store_pair(T *p, float lo, float hi) {
  uint32_t u = mma16<T>::pack(lo, hi);
  memcpy(p, &u, 4);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/* Calls f(w) with the tile width w for head dim D (1 <= D <= 128): the exact width where `exact`
 * (D is 32, 64 or 128 and every tensor 16-byte aligned), else the padded width 32 for D <= 32,
 * 64 for D <= 64, and above that D rounded up to a multiple of 16. */
template <typename F> int with_width(int D, bool exact, F f) {
  if (exact) {
    switch (D) {
    case 32: return f(width<32, false>{});
    case 64: return f(width<64, false>{});
    case 128: return f(width<128, false>{});
    default: break;
    }
  }
  switch ((D + 15) / 16) {
  case 1:
  case 2: return f(width<32, true>{});
  case 3: /* head dims between 32 and 64 are rare: one width for them */
  case 4: return f(width<64, true>{});
  case 5: return f(width<80, true>{});
  case 6: return f(width<96, true>{});
  case 7: return f(width<112, true>{});
  default: return f(width<128, true>{});
  }
}

} /* namespace tz_attn */

#endif
