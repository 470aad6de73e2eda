/* The warpgroup MMA building block (kernels/cuda/wgmma.cuh) against a float64 reference: one
 * warpgroup multiplies 64 x 64 bf16 tiles staged in 128-byte-swizzled shared memory, k16 slice by
 * slice, into float accumulators, with B K-major (A B^T, as Q K^T) and MN-major (A B, as P V), A
 * from shared memory or from registers, and accumulating onto values already in the registers. The
 * inputs are multiples of 1/8 in [-1, 1] (exact in bf16) and the sums of their products exact in
 * float, so every element must equal the reference bit for bit whatever the order of the sums: a
 * wrong descriptor, swizzle or fragment layout moves or mixes elements, and the test prints where.
 * Skips (77) without an sm_90 GPU. */
#include "kernels/cuda/wgmma.cuh"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T 64

/* c (+)= a b^T (TransB 0, b n by k) or a b (TransB 1, b k by n), 64 x 64 x 64; Regs: a from
 * registers (each k16 slice packed into the A fragment), else from shared memory. */
template <int TransB, int Regs>
__global__ void product(const uint16_t *a, const uint16_t *b, float *c, int onto) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) uint8_t sa[T * 128];
  __shared__ __align__(1024) uint8_t sb[T * 128];
  int t = threadIdx.x;
  for (int i = t; i < T * T; i += blockDim.x) {
    int r = i / T, col = i % T;
    *(uint16_t *)(sa + tz_wgmma::sw128(r, col)) = a[i];
    *(uint16_t *)(sb + tz_wgmma::sw128(r, col)) = b[i];
  }
  tz_wgmma::fence_smem();
  __syncthreads();
  int row = 16 * (t / 32) + (t % 32) / 4, col0 = 2 * (t % 4);
  float d[32];
  for (int j = 0; j < 8; j++)
    for (int e = 0; e < 4; e++)
      d[4 * j + e] = onto ? c[(row + 8 * (e / 2)) * T + 8 * j + col0 + e % 2] : 0.0f;
  uint32_t af[T / 16][4];
  if (Regs) { /* rows row, row + 8 of each slice's columns 2c, 2c + 1 and 2c + 8, 2c + 9 */
    for (int kk = 0; kk < T / 16; kk++)
      for (int i = 0; i < 4; i++) {
        int r = row + 8 * (i & 1), k = 16 * kk + col0 + 8 * (i >> 1);
        af[kk][i] = (uint32_t)a[r * T + k] | (uint32_t)a[r * T + k + 1] << 16;
      }
  }
  tz_wgmma::fence();
  for (int k0 = 0; k0 < T; k0 += 16) {
    uint64_t db = TransB ? tz_wgmma::desc_mn(sb + 128 * k0) : tz_wgmma::desc_k(sb + 2 * k0);
    if (Regs)
      tz_wgmma::mma_m64n64k16_bf16_rs<TransB>(d, af[k0 / 16], db, onto || k0 > 0);
    else
      tz_wgmma::mma_m64n64k16_bf16<TransB>(d, tz_wgmma::desc_k(sa + 2 * k0), db, onto || k0 > 0);
  }
  tz_wgmma::commit();
  tz_wgmma::wait<0>();
  for (int j = 0; j < 8; j++)
    for (int e = 0; e < 4; e++)
      c[(row + 8 * (e / 2)) * T + 8 * j + col0 + e % 2] = d[4 * j + e];
#else
  (void)a;
  (void)b;
  (void)c;
  (void)onto;
  __trap();
#endif
}

static uint16_t bf16_bits(float x) { /* x is exact in bf16 */
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)(u >> 16);
}

static int check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "test_wgmma: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

/* One product on the GPU against the reference; 0 when every element matches. */
static int one(int trans_b, int regs, int onto, unsigned seed) {
  static float a[T * T], b[T * T], c0[T * T], got[T * T];
  static double want[T * T];
  static uint16_t ha[T * T], hb[T * T];
  srand(seed);
  for (int i = 0; i < T * T; i++) {
    a[i] = (float)(rand() % 17 - 8) / 8.0f;
    b[i] = (float)(rand() % 17 - 8) / 8.0f;
    c0[i] = onto ? (float)(rand() % 65 - 32) / 4.0f : 0.0f;
    ha[i] = bf16_bits(a[i]);
    hb[i] = bf16_bits(b[i]);
  }
  /* trans_b 0: b is n by k (c = a b^T); 1: b is k by n (c = a b) */
  for (int m = 0; m < T; m++)
    for (int n = 0; n < T; n++) {
      double s = c0[m * T + n];
      for (int k = 0; k < T; k++)
        s += (double)a[m * T + k] * (double)(trans_b ? b[k * T + n] : b[n * T + k]);
      want[m * T + n] = s;
    }
  uint16_t *da = NULL, *db = NULL;
  float *dc = NULL;
  int rc = check(cudaMalloc(&da, sizeof ha), "cudaMalloc") ||
           check(cudaMalloc(&db, sizeof hb), "cudaMalloc") ||
           check(cudaMalloc(&dc, sizeof got), "cudaMalloc") ||
           check(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice), "copy a") ||
           check(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice), "copy b") ||
           check(cudaMemcpy(dc, c0, sizeof got, cudaMemcpyHostToDevice), "copy c");
  if (!rc) {
    if (trans_b && regs)
      product<1, 1><<<1, 128>>>(da, db, dc, onto);
    else if (trans_b)
      product<1, 0><<<1, 128>>>(da, db, dc, onto);
    else if (regs)
      product<0, 1><<<1, 128>>>(da, db, dc, onto);
    else
      product<0, 0><<<1, 128>>>(da, db, dc, onto);
    rc = check(cudaGetLastError(), "launch") || check(cudaDeviceSynchronize(), "the product") ||
         check(cudaMemcpy(got, dc, sizeof got, cudaMemcpyDeviceToHost), "copy back");
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  if (rc)
    return rc;
  int bad = 0;
  for (int i = 0; i < T * T; i++)
    if ((double)got[i] != want[i]) {
      if (bad < 8)
        fprintf(stderr, "  (%d, %d): got %.9g, want %.9g\n", i / T, i % T, got[i], want[i]);
      bad++;
    }
  printf("%s A from %s, B %s, %s: %d of %d elements differ\n", bad ? "FAIL" : "ok",
         regs ? "registers" : "shared memory", trans_b ? "MN-major (a b)" : "K-major (a b^T)",
         onto ? "onto c" : "from zero", bad, T * T);
  return bad != 0;
}

int main(void) {
  int n = 0;
  cudaDeviceProp p;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess || p.major != 9 || p.minor != 0) {
    printf("SKIP: wgmma needs an sm_90 device (this one is sm_%d%d)\n", p.major, p.minor);
    return 77;
  }
  int fail = 0;
  fail |= one(0, 0, 0, 1);
  fail |= one(1, 0, 0, 2);
  fail |= one(1, 0, 1, 3);
  fail |= one(0, 0, 1, 4);
  fail |= one(0, 1, 0, 5); /* as S = Q K^T with Q in registers */
  fail |= one(1, 1, 0, 6); /* as O = P V */
  fail |= one(1, 1, 1, 7);
  return fail;
}
