/* The cuda compute backend: bf16 or fp16 storage (f32 too) with float32 arithmetic, GEMM through
 * cuBLASLt, everything else in this folder's kernels. Work goes on one stream per instance, in
 * call order: the caller's (params.stream, borrowed) or a non-blocking one the instance owns.
 * Every kernel is deterministic: each output element has one owner that computes it in a fixed
 * order, reductions use fixed trees (never floating-point atomics), and the GEMM algorithm for a
 * shape is chosen once and kept (matmul.cu). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/log.h"
}
#include "kernels/cuda/adam_cuda.h"
#include "kernels/cuda/common.cuh"
#include "util/gpu.h"

#define TZ_CUDA_DEFAULT_WORKSPACE (32u << 20)
#define TZ_CUDA_MIN_SCRATCH (4u << 20)
/* Copies between the host and the device of at most this many bytes go through c->link, a pinned
 * buffer that a kernel reads or writes over the link, not through a copy engine. A copy engine
 * takes its work in the order it was queued, whatever the stream: behind the scheduler's window
 * (tens of GB queued on its lanes at a step's start) a 256 KiB token upload waited 1.2 s, and the
 * 16 bytes of a sync's error record waited for every write-back queued before them
 * (docs/benchmarks-history.md, "Issue 26 on the H200, 2026-12-03, later"). */
#define TZ_CUDA_LINK_BYTES (4u << 20)

int tz_cuda_scratch(struct tz_cuda *c, size_t bytes, void **out) {
  if (bytes > c->scratch_bytes) {
    size_t want = c->scratch_bytes ? c->scratch_bytes : TZ_CUDA_MIN_SCRATCH;
    while (want < bytes)
      want *= 2;
    if (c->scratch) {
      /* cudaFree waits for the device, so no queued kernel still reads the old buffer. */
      TZ_CU(cudaFree(c->scratch));
      c->scratch = NULL;
      c->scratch_bytes = 0;
    }
    TZ_CU(cudaMalloc(&c->scratch, want));
    c->scratch_bytes = want;
  }
  *out = c->scratch;
  return 0;
}

static void cuda_destroy(void *ctx) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  if (!c)
    return;
  /* Errors here have nowhere to go; the instance is gone either way. */
  if (c->stream)
    (void)cudaStreamSynchronize(c->stream);
  tz_cuda_matmul_lanes_release(c);
  tz_cuda_matmul_release(c);
  if (c->lt)
    (void)cublasLtDestroy(c->lt);
  if (c->workspace)
    (void)cudaFree(c->workspace);
  if (c->scratch)
    (void)cudaFree(c->scratch);
  if (c->rope_cs)
    (void)cudaFree(c->rope_cs);
  if (c->rope_f_dev)
    (void)cudaFree(c->rope_f_dev);
  if (c->err_host)
    (void)cudaFreeHost(c->err_host);
  if (c->link)
    (void)cudaFreeHost(c->link);
  if (c->err_dev)
    (void)cudaFree(c->err_dev);
  if (c->stream && !c->stream_borrowed)
    (void)cudaStreamDestroy(c->stream);
  free(c);
}

/* dst[0, n) = src[0, n) by the threads of a kernel, either side in pinned host memory (read or
 * written over the link) or on the device: 16 bytes at a time where both are aligned to it. */
__global__ void link_copy(unsigned char *dst, const unsigned char *src, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
  size_t words = (((uintptr_t)dst | (uintptr_t)src) & 15u) == 0 ? n / 16 : 0;
  for (size_t w = i; w < words; w += stride)
    ((uint4 *)dst)[w] = ((const uint4 *)src)[w];
  for (size_t b = words * 16 + i; b < n; b += stride)
    dst[b] = src[b];
}

/* The error record into its pinned host copy, and cleared, by one kernel (no copy engine). */
__global__ void take_error(int *dev, int *host) {
  if (threadIdx.x < 4) {
    host[threadIdx.x] = dev[threadIdx.x];
    dev[threadIdx.x] = 0;
  }
}

/* A small copy through c->link, then a wait for it: the buffer is free whenever no call is in
 * one of these (each returns after its kernel ran). */
static int link_copy_sync(struct tz_cuda *c, void *dst, const void *src, size_t bytes) {
  unsigned grid = tz_cuda_grid(c, (bytes + 15) / 16, 256);
  if (grid > 64u)
    grid = 64u; /* some 4 MiB at most: a few blocks keep the link's requests in flight */
  link_copy<<<grid, 256, 0, c->stream>>>((unsigned char *)dst, (const unsigned char *)src, bytes);
  TZ_CU(cudaGetLastError());
  TZ_CU(cudaStreamSynchronize(c->stream));
  return 0;
}

/* Reports (once) the bad input a kernel recorded since the last sync. The record lives in device
 * memory (atomics on mapped host memory are not atomic across PCIe on every machine) and comes
 * back through a small pinned buffer the kernel take_error writes. */
static int take_device_error(struct tz_cuda *c) {
  take_error<<<1, 32, 0, c->stream>>>(c->err_dev, c->err_host);
  TZ_CU(cudaGetLastError());
  TZ_CU(cudaStreamSynchronize(c->stream));
  int code = c->err_host[0];
  if (!code)
    return 0;
  int index = c->err_host[1], value = c->err_host[2], limit = c->err_host[3];
  const char *what = code == TZ_CUDA_BAD_EMBED_FWD   ? "embedding_fwd token"
                     : code == TZ_CUDA_BAD_EMBED_BWD ? "embedding_bwd token"
                                                     : "xent target";
  return tz_err_set(TZ_EINVAL, "compute cuda: %s %d at index %d is outside [0, %d)", what, value,
                    index, limit);
}

static int cuda_sync(void *ctx) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CU(cudaStreamSynchronize(c->stream));
  return take_device_error(c);
}

static void *cuda_stream(void *ctx) { return (void *)((struct tz_cuda *)ctx)->stream; }

/* ---- memory ---- */

static int cuda_alloc(void *ctx, size_t bytes, void **out) {
  (void)ctx;
  /* cudaMalloc returns at least 256-byte aligned memory. */
  cudaError_t e = cudaMalloc(out, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return tz_err_set(TZ_ENOMEM, "compute cuda: cannot allocate %zu bytes of device memory", bytes);
  }
  TZ_CU(e);
  return 0;
}

static void cuda_free(void *ctx, void *p) {
  (void)ctx;
  (void)cudaFree(p);
}

static int cuda_copy_in(void *ctx, void *dst, const void *host_src, size_t bytes) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  if (bytes <= TZ_CUDA_LINK_BYTES) {
    memcpy(c->link, host_src, bytes);
    return link_copy_sync(c, dst, c->link, bytes);
  }
  TZ_CU(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, c->stream));
  /* Synchronous for the host buffer (compute.h): the caller may reuse it on return. */
  TZ_CU(cudaStreamSynchronize(c->stream));
  return 0;
}

static int cuda_copy_out(void *ctx, void *host_dst, const void *src, size_t bytes) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  if (bytes <= TZ_CUDA_LINK_BYTES) {
    TZ_CHECK(link_copy_sync(c, c->link, src, bytes));
    memcpy(host_dst, c->link, bytes);
    return 0;
  }
  TZ_CU(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
  TZ_CU(cudaStreamSynchronize(c->stream));
  return 0;
}

static int cuda_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
  return 0;
}

static int cuda_zero(void *ctx, void *dst, size_t bytes) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  TZ_CU(cudaMemsetAsync(dst, 0, bytes, c->stream));
  return 0;
}

static int cuda_adam(void *ctx, const struct tz_adam_params *p, float *master, float *m, float *v,
                     const void *grad, enum tz_dtype grad_dtype, void *param_copy,
                     enum tz_dtype copy_dtype, size_t n) {
  struct tz_cuda *c = (struct tz_cuda *)ctx;
  return tz_adam_cuda(p, master, m, v, grad, grad_dtype, param_copy, copy_dtype, n, c->stream);
}

/* The ops, with and without the families' variants (the setting "variants": off until their
 * GPU checks pass; compute_impl.h). Packed documents: the plain attention kernels take pos
 * (attention.cu), RoPE and cross-entropy theirs (test_compute_cuda: test_attention_packed,
 * test_xent). */
#define CUDA_OPS(VARIANTS)                                                                         \
  {                                                                                                \
    .destroy = cuda_destroy, .sync = cuda_sync, .stream = cuda_stream, .alloc = cuda_alloc,        \
    .free = cuda_free, .copy_in = cuda_copy_in, .copy_out = cuda_copy_out, .copy = cuda_copy,      \
    .zero = cuda_zero, .fill = tz_cuda_fill, .scale = tz_cuda_scale, .axpy = tz_cuda_axpy,         \
    .add = tz_cuda_add, .cast = tz_cuda_cast, .sum = tz_cuda_sum,                                  \
    .sumsq_segments = tz_cuda_sumsq_segments, .matmul = tz_cuda_matmul,                            \
    .matmul_many = MATMUL_MANY, .embedding_fwd = tz_cuda_embedding_fwd,                            \
    .embedding_bwd = tz_cuda_embedding_bwd, .rmsnorm_fwd = tz_cuda_rmsnorm_fwd,                    \
    .rmsnorm_bwd = tz_cuda_rmsnorm_bwd, .rope = tz_cuda_rope, .bias_add = tz_cuda_bias_add,        \
    .bias_grad = tz_cuda_bias_grad, .attention_fwd = tz_cuda_attention_fwd,                        \
    .attention_bwd = tz_cuda_attention_bwd, .docs = 1, .variants = VARIANTS,                       \
    .glu_fwd = tz_cuda_glu_fwd, .glu_bwd = tz_cuda_glu_bwd, .xent = tz_cuda_xent,                  \
    .softcap = tz_cuda_softcap, .adam = cuda_adam, .moe_route = tz_cuda_moe_route,                 \
    .moe_route_bwd = tz_cuda_moe_route_bwd, .moe_gather = tz_cuda_moe_gather,                      \
    .moe_scatter = tz_cuda_moe_scatter, .moe_combine = tz_cuda_moe_combine,                        \
    .moe_combine_bwd = tz_cuda_moe_combine_bwd, .moe_gate_fwd = tz_cuda_moe_gate_fwd,              \
    .moe_gate_bwd = tz_cuda_moe_gate_bwd,                                                          \
  }
/* The independent products side by side (tz_compute_matmul_many on side streams, common.cuh's
 * TZ_CUDA_MM_STREAMS; tools/gpu-check.sh mmstreams times them beside a build without). */
#if TZ_CUDA_MM_STREAMS > 1
#define MATMUL_MANY tz_cuda_matmul_many
#else
#define MATMUL_MANY NULL
#endif
static const struct tz_compute_ops cuda_ops = CUDA_OPS(0), cuda_ops_variants = CUDA_OPS(1);
#undef MATMUL_MANY
#undef CUDA_OPS

static int cuda_probe(char *why, size_t why_len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    if (why && why_len)
      snprintf(why, why_len, "cuda: %s",
               e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
    (void)cudaGetLastError();
    return TZ_ENOTSUP;
  }
  return 0;
}

static int cuda_setup(struct tz_cuda *c, const struct tz_compute_params *p,
                      const int64_t *settings) {
  int n = 0;
  TZ_CU(cudaGetDeviceCount(&n));
  if (p->device < 0 || p->device >= n)
    return tz_err_set(TZ_EINVAL, "compute cuda: device %d outside [0, %d)", p->device, n);
  c->device = p->device;
  TZ_CU(cudaSetDevice(c->device));
  TZ_CU(cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, c->device));
  int optin = 0;
  TZ_CU(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->device));
  c->smem_optin = (size_t)optin;
  if (p->stream) {
    /* Work enqueued on a stream of another device would fail at its first launch; say so now. */
    cudaStream_t s = (cudaStream_t)p->stream;
    int dev = -1;
    TZ_CU(cudaStreamGetDevice(s, &dev));
    if (dev != c->device)
      return tz_err_set(TZ_EINVAL, "compute cuda: params.stream belongs to device %d, not %d", dev,
                        c->device);
    c->stream = s;
    c->stream_borrowed = 1;
  } else {
    TZ_CU(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  }
  TZ_LT(cublasLtCreate(&c->lt));
  c->workspace_bytes = p->workspace_bytes ? p->workspace_bytes : TZ_CUDA_DEFAULT_WORKSPACE;
  TZ_CU(cudaMalloc(&c->workspace, c->workspace_bytes));
  void *scratch;
  TZ_CHECK(tz_cuda_scratch(c, TZ_CUDA_MIN_SCRATCH, &scratch));
  /* Pinned host memory a kernel addresses by its host pointer (unified addressing, which every
   * 64-bit CUDA device of the toolkits this builds with has). */
  int unified = 0;
  TZ_CU(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, c->device));
  if (!unified)
    return tz_err_set(TZ_ENOTSUP, "compute cuda: device %d has no unified addressing", c->device);
  TZ_CU(cudaHostAlloc((void **)&c->err_host, 4 * sizeof(int), cudaHostAllocMapped));
  TZ_CU(cudaHostAlloc((void **)&c->link, TZ_CUDA_LINK_BYTES, cudaHostAllocMapped));
  TZ_CU(cudaMalloc((void **)&c->err_dev, 4 * sizeof(int)));
  TZ_CU(cudaMemsetAsync(c->err_dev, 0, 4 * sizeof(int), c->stream));
  c->attention = (enum tz_cuda_attention_mode)settings[TZ_CUDA_SET_ATTENTION];
  c->mm_plain = settings[TZ_CUDA_SET_MATMUL] == 1;
  c->norm_bwd_onepass = settings[TZ_CUDA_SET_NORM_BWD] == 1;
  c->softcap_approx = settings[TZ_CUDA_SET_SOFTCAP_TANH] == 1;
  int major = 0, minor = 0;
  TZ_CU(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device));
  TZ_CU(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, c->device));
  c->sm90 = major == 9 && minor == 0;
  return 0;
}

static int cuda_variants(const int64_t *settings) { return settings[TZ_CUDA_SET_VARIANTS] != 0; }

static int cuda_create(const struct tz_compute_params *p, const int64_t *settings, tz_compute *cm) {
  if (p->grad_dtype != TZ_F32 && p->grad_dtype != p->dtype)
    return tz_err_set(TZ_ENOTSUP,
                      "compute cuda: gradients in %s with storage %s: gradients must be f32 or "
                      "the storage dtype (weight gradients come out of a GEMM)",
                      tz_dtype_name(p->grad_dtype), tz_dtype_name(p->dtype));
  struct tz_cuda *c = (struct tz_cuda *)calloc(1, sizeof *c);
  if (!c)
    return tz_err_set(TZ_ENOMEM, "compute cuda: out of memory");
  c->S = p->dtype;
  c->G = p->grad_dtype;
  int rc = cuda_setup(c, p, settings);
  if (rc < 0) {
    cuda_destroy(c);
    return rc;
  }
  cm->ops = cuda_variants(settings) ? &cuda_ops_variants : &cuda_ops;
  cm->ctx = c;
  cm->n_threads = 1;
  return 0;
}

static int cuda_device_info(int device, struct tz_compute_device *out) {
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = 0;
  }
  out->index = device;
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    snprintf(out->name, sizeof out->name, "%s", prop.name);
  else
    (void)cudaGetLastError();
  out->numa_node = tz_gpu_host_numa_node(device);
  return 0;
}

/* cudaMemGetInfo on `device`; the calling thread's current device is left as it was. */
static int cuda_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes) {
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess)
    prev = -1;
  size_t f = 0, t = 0;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess)
    e = cudaMemGetInfo(&f, &t);
  if (prev >= 0)
    (void)cudaSetDevice(prev);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return tz_err_set(TZ_ECUDA, "compute cuda: the memory of GPU %d: %s", device,
                      cudaGetErrorString(e));
  }
  *free_bytes = f;
  *total_bytes = t;
  return 0;
}

const struct tz_compute_backend tz_compute_backend_cuda = {
    .name = "cuda",
    .probe = cuda_probe,
    .create = cuda_create,
    .device_info = cuda_device_info,
    .device_memory = cuda_device_memory,
    .settings = tz_cuda_settings,
    .n_settings = TZ_CUDA_N_SETTINGS,
    .variants = cuda_variants,
    .variants_always = 0,
    .moe = 2,
};
