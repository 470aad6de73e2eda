/* Hopper's warpgroup MMA (wgmma.mma_async, sm_90a), the building block of issue 24's attention:
 * one warpgroup (4 warps, 128 threads) multiplies a 64 x 16 tile of A by a 16 x 64 tile of B into
 * 64 x 64 float accumulators, both operands read from shared memory through matrix descriptors.
 *
 * Shared memory layout (the one these helpers describe): a tile of 64 bf16 columns per 128-byte
 * row, 8 rows to a 1024-byte atom, with the 128-byte swizzle: the 16-byte chunk c of row r sits at
 * chunk c ^ (r % 8). Every tile starts 1024-byte aligned.
 *  - K-major operand (A, or B stored n by k: the product A B^T, as Q K^T): rows are m (or n), the
 *    64 columns k. The k16 slice at k0 starts k0 * 2 bytes into the tile; 8-row groups are 1024
 *    bytes apart (the descriptor's stride byte offset).
 *  - MN-major B (stored k by n, n contiguous: the product A B, as P V): rows are k, the 64 columns
 *    n, read transposed (tnspB 1). The k16 slice at k0 starts k0 * 128 bytes in; its two 8-row
 *    groups are 1024 bytes apart.
 * Accumulators: thread t of the warpgroup holds rows 16 (t / 32) + (t % 32) / 4 (+ 8), and for
 * each 8-column block j the columns 8 j + 2 (t % 4) (+ 1): d[4 j + 0..3] = (row, col), (row,
 * col + 1), (row + 8, col), (row + 8, col + 1), as mma.sync's m16n8 fragment repeated across n.
 *
 * Everything here compiles only for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); a file that uses it is
 * built for that architecture alone. */
#ifndef TZ_KERNELS_CUDA_WGMMA_CUH
#define TZ_KERNELS_CUDA_WGMMA_CUH

#include <stdint.h>

namespace tz_wgmma {

/* The byte offset of bf16 element (r, c) of a swizzled tile of 64 columns, from its base. */
__host__ __device__ __forceinline__ uint32_t sw128(uint32_t r, uint32_t c) {
  return r * 128u + ((((c >> 3) ^ (r & 7u)) << 4) | ((c & 7u) << 1));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

/* A shared-memory matrix descriptor for a 128-byte-swizzled tile starting at p (a shared
 * address; the tile's atom 1024-byte aligned, p at most a row's 128 bytes past it): the start
 * address and both byte offsets in 16-byte units, base offset 0, swizzle mode 1 (128 bytes). */
__device__ __forceinline__ uint64_t desc_sw128(const void *p, uint32_t lead, uint32_t stride) {
  uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
  return (uint64_t)((a & 0x3FFFFu) >> 4) | ((uint64_t)((lead >> 4) & 0x3FFFu) << 16) |
         ((uint64_t)((stride >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

/* K-major: the leading offset is unused with a swizzle (one 16-byte unit by convention). */
__device__ __forceinline__ uint64_t desc_k(const void *p) { return desc_sw128(p, 16, 1024); }
/* MN-major, one atom wide (64 columns): both offsets step 8 rows of k. */
__device__ __forceinline__ uint64_t desc_mn(const void *p) { return desc_sw128(p, 1024, 1024); }

/* The 32 accumulators of an m64n64 product: the asm's operands 0..31 and their list. */
#define TZ_WGMMA_D32_ASM                                                                           \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                        \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
#define TZ_WGMMA_D32(d)                                                                            \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),  \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),     \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),   \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),   \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

/* Registers written by other instructions (or shared memory by the async proxy) are ordered
 * before the wgmma that follows. */
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Shared memory written with ordinary stores, made visible to wgmma's reads (then a barrier). */
__device__ __forceinline__ void fence_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* d = a b + (accumulate ? d : 0), m64n64k16, bf16 in, float out; TransB 0: B K-major, 1:
 * MN-major. The accumulators stay in flight until wait() after commit(). */
template <int TransB>
__device__ __forceinline__ void mma_m64n64k16_bf16(float (&d)[32], uint64_t da, uint64_t db,
                                                   int accumulate) {
  asm volatile("{\n"
               ".reg .pred p;\n"
               "setp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TZ_WGMMA_D32_ASM
               "%32, %33, p, 1, 1, 0, %35;\n"
               "}\n"
               : TZ_WGMMA_D32(d)
               : "l"(da), "l"(db), "r"(accumulate), "n"(TransB));
}

/* The same with A from registers (a 64 x 16 tile, each warp's 16 rows in mma.sync's m16n8k16 A
 * fragment: a[0] (row g, cols 2c, 2c+1), a[1] (g + 8, 2c..), a[2] (g, 2c + 8..), a[3] (g + 8,
 * 2c + 8..), g = lane / 4, c = lane % 4, the lower column in the low half): how probabilities
 * computed as one product's accumulators feed the next without shared memory. The registers
 * must not change until wait(). */
template <int TransB>
__device__ __forceinline__ void mma_m64n64k16_bf16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                      uint64_t db, int accumulate) {
  asm volatile("{\n"
               ".reg .pred p;\n"
               "setp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " TZ_WGMMA_D32_ASM
               "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n"
               "}\n"
               : TZ_WGMMA_D32(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(TransB));
}

#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

} // namespace tz_wgmma

#endif
