/* GPU Adam against the CPU scalar path: every output (master, m, v, the parameter copy) bit for
 * bit after every one of many random steps, for every gradient and copy dtype, with subnormals,
 * huge values, infinities and NaNs, for n that are not multiples of 4, with arrays that start off
 * the 16-byte boundary (alike, and each differently), and without writing outside the arrays.
 * CUDA builds only; skips (77) without a GPU. */
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#ifdef TZ_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "adam_cases.h"
#include "kernels/cuda/adam_cuda.h"

#define GUARD 16
#define SENTINEL 0xa5

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess)                                                                         \
      print_error("%s: %s\n", #call, cudaGetErrorString(e_));                                      \
    assert_int_equal(e_, cudaSuccess);                                                             \
  } while (0)

/* Host arrays (n) and device arrays (n) inside guarded device allocations. */
struct pair {
  size_t n;
  enum tz_dtype gdt, cdt;
  int has_copy;
  float *p, *m, *v;
  void *g, *copy;           /* host */
  void *d[5];               /* device: master, m, v, grad, copy (element pointers) */
  void *dbase[5];           /* device allocations */
  size_t dbytes[5], off[5]; /* allocation sizes; element offsets of d in dbase */
  size_t esize[5];
};

static void pair_init(struct pair *s, size_t n, enum tz_dtype gdt, int has_copy, enum tz_dtype cdt,
                      const size_t off[5]) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->gdt = gdt;
  s->cdt = cdt;
  s->has_copy = has_copy;
  s->p = malloc(n * 4);
  s->m = malloc(n * 4);
  s->v = malloc(n * 4);
  s->g = malloc(n * tz_dtype_size(gdt));
  s->copy = has_copy ? calloc(n, tz_dtype_size(cdt)) : NULL;
  assert_true(s->p && s->m && s->v && s->g && (!has_copy || s->copy));
  const size_t es[5] = {4, 4, 4, tz_dtype_size(gdt), tz_dtype_size(cdt)};
  for (int k = 0; k < 5; k++) {
    s->esize[k] = es[k];
    if (k == 4 && !has_copy)
      continue;
    s->off[k] = off ? off[k] : 0;
    s->dbytes[k] = (s->off[k] + n + GUARD) * es[k];
    CUDA_OK(cudaMalloc(&s->dbase[k], s->dbytes[k]));
    CUDA_OK(cudaMemset(s->dbase[k], SENTINEL, s->dbytes[k]));
    s->d[k] = (char *)s->dbase[k] + s->off[k] * es[k];
  }
}

static void pair_free(struct pair *s) {
  free(s->p);
  free(s->m);
  free(s->v);
  free(s->g);
  free(s->copy);
  for (int k = 0; k < 5; k++)
    if (s->dbase[k])
      CUDA_OK(cudaFree(s->dbase[k]));
}

static void *host_array(struct pair *s, int k) {
  void *h[5] = {s->p, s->m, s->v, s->g, s->copy};
  return h[k];
}

static void pair_upload(struct pair *s, int k) {
  CUDA_OK(cudaMemcpy(s->d[k], host_array(s, k), s->n * s->esize[k], cudaMemcpyHostToDevice));
  /* A copy from pageable memory may return before the data has landed, and the kernel's stream is
   * non-blocking, so it is not ordered after the copy: wait for the device. */
  CUDA_OK(cudaDeviceSynchronize());
}

/* Device outputs equal the host's, bit for bit; the guards around them are untouched. */
static void pair_compare(struct pair *s, const char *ctx) {
  static const char *names[5] = {"master", "m", "v", "grad", "copy"};
  for (int k = 0; k < 5; k++) {
    if (!s->dbase[k])
      continue;
    unsigned char *all = malloc(s->dbytes[k]);
    assert_non_null(all);
    CUDA_OK(cudaMemcpy(all, s->dbase[k], s->dbytes[k], cudaMemcpyDeviceToHost));
    const unsigned char *dev = all + s->off[k] * s->esize[k];
    const unsigned char *host = host_array(s, k);
    if (memcmp(dev, host, s->n * s->esize[k]) != 0) {
      for (size_t i = 0; i < s->n; i++) {
        if (memcmp(dev + i * s->esize[k], host + i * s->esize[k], s->esize[k]) == 0)
          continue;
        uint32_t x = 0, y = 0;
        memcpy(&x, host + i * s->esize[k], s->esize[k]);
        memcpy(&y, dev + i * s->esize[k], s->esize[k]);
        print_error("%s: %s differs at %zu of %zu: cpu 0x%08x, gpu 0x%08x\n", ctx, names[k], i,
                    s->n, x, y);
        break;
      }
      free(all);
      fail();
    }
    for (size_t i = 0; i < s->off[k] * s->esize[k]; i++)
      assert_int_equal(all[i], SENTINEL);
    for (size_t i = (s->off[k] + s->n) * s->esize[k]; i < s->dbytes[k]; i++)
      assert_int_equal(all[i], SENTINEL);
    free(all);
  }
}

/* steps random steps of one case; the CPU side runs the scalar path unless told otherwise. */
static void run_case(size_t n, enum tz_dtype gdt, int ci, const size_t off[5], int kinds, int steps,
                     enum tz_adam_cpu_path cpu_path, uint64_t seed) {
  enum tz_dtype cdt = ci < 0 ? TZ_F32 : (enum tz_dtype)ci;
  struct pair s;
  pair_init(&s, n, gdt, ci >= 0, cdt, off);
  uint64_t rng = seed;
  adam_case_fill(s.p, n, &rng, 0, kinds);
  adam_case_fill(s.m, n, &rng, 0, kinds);
  adam_case_fill(s.v, n, &rng, 1, kinds);
  for (int k = 0; k < 3; k++)
    pair_upload(&s, k);
  if (s.has_copy)
    pair_upload(&s, 4);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct tz_adam_cpu_opts o = {.threads = 1, .path = cpu_path};
  char ctx[160];
  for (int t = 1; t <= steps; t++) {
    struct tz_adam_params hp;
    TZ_ASSERT_OK(adam_case_params(&hp, &rng, t));
    adam_case_fill_grad(s.g, gdt, n, &rng, kinds);
    pair_upload(&s, 3);
    TZ_ASSERT_OK(tz_adam_cuda(&hp, s.d[0], s.d[1], s.d[2], s.d[3], gdt, s.has_copy ? s.d[4] : NULL,
                              cdt, n, stream));
    TZ_ASSERT_OK(tz_adam_cpu(&hp, s.p, s.m, s.v, s.g, gdt, s.copy, cdt, n, &o));
    CUDA_OK(cudaStreamSynchronize(stream));
    snprintf(ctx, sizeof ctx, "n %zu, grad %s, copy %s, offsets %zu,%zu,%zu,%zu,%zu, step %d", n,
             tz_dtype_name(gdt), ci < 0 ? "none" : tz_dtype_name(cdt), s.off[0], s.off[1], s.off[2],
             s.off[3], s.off[4], t);
    pair_compare(&s, ctx);
  }
  CUDA_OK(cudaStreamDestroy(stream));
  pair_free(&s);
}

static const size_t aligned_off[5] = {0, 0, 0, 0, 0};
static const size_t shifted_off[5] = {1, 1, 1, 1, 1}; /* alike: peeled head, float4 body, tail */
static const size_t mixed_off[5] = {1, 2, 3, 0, 3};   /* each differently: element by element */

static void test_matrix(void **state) {
  (void)state;
  const size_t ns[] = {1, 3, 4, 5, 1023, 100003};
  const enum tz_dtype gdts[] = {TZ_F32, TZ_BF16, TZ_F16};
  uint64_t seed = 1;
  for (int gi = 0; gi < 3; gi++)
    for (int ci = -1; ci < 3; ci++)
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        int kinds = (int)(seed % 2) ? ADAM_CASE_SPECIAL : ADAM_CASE_HUGE;
        run_case(ns[ni], gdts[gi], ci, aligned_off, kinds, 10, TZ_ADAM_CPU_SCALAR, seed++);
        if (ns[ni] == 5 || ns[ni] == 100003) {
          run_case(ns[ni], gdts[gi], ci, shifted_off, kinds, 6, TZ_ADAM_CPU_SCALAR, seed++);
          run_case(ns[ni], gdts[gi], ci, mixed_off, kinds, 6, TZ_ADAM_CPU_SCALAR, seed++);
        }
      }
}

/* A size past the grid's resident threads, so the grid-stride loops go round; the CPU side uses
 * its fastest path, which test_adam shows bit-identical to the scalar one. */
static void test_large(void **state) {
  (void)state;
  run_case((size_t)3 << 22 | 7, TZ_BF16, TZ_BF16, aligned_off, ADAM_CASE_SPECIAL, 3,
           TZ_ADAM_CPU_AUTO, 77);
  run_case((size_t)3 << 22 | 7, TZ_F32, TZ_BF16, shifted_off, ADAM_CASE_HUGE, 3, TZ_ADAM_CPU_AUTO,
           78);
}

static void test_errors(void **state) {
  (void)state;
  struct tz_adam_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .grad_scale = 1.0f};
  TZ_ASSERT_OK(tz_adam_params_for_step(&hp, 1));
  float *d;
  CUDA_OK(cudaMalloc((void **)&d, 64 * 4));
  assert_int_equal(
      tz_adam_cuda(&hp, d, d + 16, d + 32, d + 48, (enum tz_dtype)9, NULL, TZ_F32, 4, NULL),
      TZ_EINVAL);
  assert_int_equal(tz_adam_cuda(&hp, (float *)((char *)d + 1), d + 16, d + 32, d + 48, TZ_F32, NULL,
                                TZ_F32, 4, NULL),
                   TZ_EINVAL);
  assert_int_equal(tz_adam_cuda(&hp, d, NULL, d + 32, d + 48, TZ_F32, NULL, TZ_F32, 4, NULL),
                   TZ_EINVAL);
  TZ_ASSERT_OK(tz_adam_cuda(&hp, NULL, NULL, NULL, NULL, TZ_F32, NULL, TZ_F32, 0, NULL));
  hp.beta1 = 2.0f;
  assert_int_equal(tz_adam_cuda(&hp, d, d + 16, d + 32, d + 48, TZ_F32, NULL, TZ_F32, 4, NULL),
                   TZ_EINVAL);
  CUDA_OK(cudaFree(d));
}
#endif

int main(void) {
#ifndef TZ_HAVE_CUDA
  tz_test_skip("no CUDA device (built without CUDA)");
#else
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    tz_test_skip("no CUDA device");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_matrix),
      cmocka_unit_test(test_large),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
