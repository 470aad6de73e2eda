/* The GPU "compute" of tz-bench prefetch: one thread that spins for a set time on a stream, so a
 * phase occupies the compute lane the way a layer's kernels would, without touching memory. */
#include <cuda_runtime_api.h>
#include <stdint.h>

/* Spins until `ns` nanoseconds have passed on the GPU's global timer. The timer, not clock64:
 * the SM clock changes with boost and power state, so a cycle count would not be a fixed time. */
__global__ void tz_bench_spin_kernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

/* bench/bench.h. Launches the spin on cuda_stream; returns 0, or -1 with the CUDA error's text in
 * why (the launch fails only for a bad stream or a broken context). */
extern "C" int tz_bench_gpu_spin(void *cuda_stream, double seconds, char *why, size_t why_len) {
  uint64_t ns = seconds > 0 ? (uint64_t)(seconds * 1e9) : 0;
  tz_bench_spin_kernel<<<1, 1, 0, (cudaStream_t)cuda_stream>>>(ns);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess)
    return 0;
  if (why && why_len) {
    const char *m = cudaGetErrorString(e);
    size_t i = 0;
    for (; m[i] && i + 1 < why_len; i++)
      why[i] = m[i];
    why[i] = 0;
  }
  return -1;
}
