/* The tensor cores' rate under warpgroup MMA at the attention kernels' shapes: how many TFLOP/s
 * back-to-back m64nNk16 products reach for N 64 (the kernels' key tiles today) and N 128 (tiles of
 * 128 keys), A from registers or from shared memory, with one warpgroup a block and one or two
 * blocks an SM, each warpgroup waiting for its products every 8 k16 slices (a tile's product over
 * head dim 128, as the kernels do) or keeping two groups in flight. It answers whether 64-key
 * tiles cap the products' rate before any kernel is rewritten for 128 (docs/cuda-kernels.md,
 * "The products' rate at 64 and 128 keys a tile"). The operands are zeros: only time is measured.
 *
 *   nvcc -arch=sm_90a -O3 -std=c++17 -I. tools/wgmma-rate.cu -o /tmp/wgmma-rate && /tmp/wgmma-rate
 */
#include "kernels/cuda/wgmma.cuh"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "wgmma-rate: %s: %s\n", #x, cudaGetErrorString(e_));                         \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define D64_ASM                                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "     \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "     \
  "%56, %57, %58, %59, %60, %61, %62, %63}, "
#define D64(d)                                                                                     \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),   \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),   \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),   \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),   \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

/* m64n128k16, B K-major from shared memory, A from registers or from shared memory */
__device__ __forceinline__ void mma128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " D64_ASM
               "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"
               : D64(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void mma128_ss(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " D64_ASM
               "%64, %65, 1, 1, 1, 0, 0;\n"
               : D64(d)
               : "l"(da), "l"(db));
}
#endif

/* One warpgroup's products: iters tiles of 8 k16 slices each (head dim 128), into one set of
 * accumulators waited for after each tile (PIPE 0) or two sets alternating with one group left in
 * flight (PIPE 1). B: N rows of 128 bf16 (two 64-column swizzled halves); A: 64 rows. */
template <int N, bool RS, bool PIPE>
__global__ void __launch_bounds__(128) rate(int iters, const uint32_t *ain, float *sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char raw[];
  uint8_t *sm = (uint8_t *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
  constexpr int HALF_B = N * 128, HALF_A = 64 * 128;
  uint8_t *sb = sm, *sa = sm + 2 * HALF_B;
  for (int i = threadIdx.x; i < (2 * HALF_B + 2 * HALF_A) / 16; i += blockDim.x)
    ((uint4 *)sm)[i] = make_uint4(0, 0, 0, 0);
  tz_wgmma::fence_smem();
  __syncthreads();
  uint32_t a[8][4]; /* loaded, so that the compiler keeps 32 registers as a real kernel would */
  for (int kk = 0; kk < 8; kk++)
    for (int i = 0; i < 4; i++)
      a[kk][i] = ain[(kk * 4 + i) * 128 + threadIdx.x];
  constexpr int ND = N / 2;
  float d0[64] = {}, d1[64] = {};
  auto tile = [&](float(&d)[64]) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
      /* slice kk: 32 bytes into half kk / 4 */
      const uint8_t *b = sb + (kk >> 2) * HALF_B + (kk & 3) * 32;
      const uint8_t *aa = sa + (kk >> 2) * HALF_A + (kk & 3) * 32;
      if constexpr (N == 128) {
        if constexpr (RS)
          mma128_rs(d, a[kk], tz_wgmma::desc_k(b));
        else
          mma128_ss(d, tz_wgmma::desc_k(aa), tz_wgmma::desc_k(b));
      } else {
        float(&h)[32] = *reinterpret_cast<float(*)[32]>(&d[0]);
        if constexpr (RS)
          tz_wgmma::mma_m64n64k16_bf16_rs<0>(h, a[kk], tz_wgmma::desc_k(b), 1);
        else
          tz_wgmma::mma_m64n64k16_bf16<0>(h, tz_wgmma::desc_k(aa), tz_wgmma::desc_k(b), 1);
      }
    }
  };
  if (PIPE) {
    for (int it = 0; it < iters; it += 2) {
      tz_wgmma::fence();
      tile(d0);
      tz_wgmma::commit();
      tz_wgmma::wait<1>();
      tz_wgmma::fence();
      tile(d1);
      tz_wgmma::commit();
      tz_wgmma::wait<1>();
    }
  } else {
    for (int it = 0; it < iters; it++) {
      tz_wgmma::fence();
      tile(d0);
      tz_wgmma::commit();
      tz_wgmma::wait<0>();
    }
  }
  tz_wgmma::wait<0>();
  float s = 0.0f;
  for (int i = 0; i < ND; i++)
    s += d0[i] + d1[i];
  if (s != 0.0f)
    sink[threadIdx.x] = s;
#else
  (void)iters, (void)ain, (void)sink;
#endif
}

template <int N, bool RS, bool PIPE>
static int run(int nsm, int per_sm, const uint32_t *ain, float *sink) {
  size_t smem = 2 * (size_t)N * 128 + 2 * 64 * 128 + 1024;
  CHECK(cudaFuncSetAttribute(rate<N, RS, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             (int)smem));
  int iters = 20000, blocks = nsm * per_sm;
  rate<N, RS, PIPE><<<blocks, 128, smem>>>(100, ain, sink); /* warm-up */
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  rate<N, RS, PIPE><<<blocks, 128, smem>>>(iters, ain, sink);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  double flop = 2.0 * 64 * N * 128 * (double)iters * blocks;
  printf("N %3d  A from %-9s  %-28s  %d block(s) an SM: %7.1f TFLOP/s\n", N,
         RS ? "registers" : "shared", PIPE ? "two groups in flight" : "waited for every tile",
         per_sm, flop / (ms * 1e-3) / 1e12);
  return 0;
}

int main(void) {
  int dev = 0, nsm = 0;
  cudaDeviceProp p;
  CHECK(cudaGetDeviceProperties(&p, dev));
  nsm = p.multiProcessorCount;
  if (p.major != 9) {
    fprintf(stderr, "wgmma-rate: needs an sm_90 GPU (this is sm_%d%d)\n", p.major, p.minor);
    return 77;
  }
  int khz = 0;
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  printf("%s, %d SMs, %d MHz\n", p.name, nsm, khz / 1000);
  float *sink;
  uint32_t *ain;
  CHECK(cudaMalloc(&sink, 1024 * sizeof(float)));
  CHECK(cudaMalloc(&ain, 32 * 128 * sizeof(uint32_t)));
  CHECK(cudaMemset(ain, 0, 32 * 128 * sizeof(uint32_t)));
  int rc = 0;
  for (int per_sm = 1; per_sm <= 2; per_sm++) {
    rc |= run<64, true, false>(nsm, per_sm, ain, sink);
    rc |= run<64, true, true>(nsm, per_sm, ain, sink);
    rc |= run<64, false, false>(nsm, per_sm, ain, sink);
    rc |= run<128, true, false>(nsm, per_sm, ain, sink);
    rc |= run<128, true, true>(nsm, per_sm, ain, sink);
    rc |= run<128, false, false>(nsm, per_sm, ain, sink);
  }
  return rc;
}
