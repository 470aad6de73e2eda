/* Adam and AdamW on fp32 master weights, with fp32 moments, for the optimizer phase.
 *
 * Every implementation (the CPU paths here, the CUDA kernel in kernels/cuda/adam_cuda.h) computes
 * exactly the following, operation by operation, in IEEE single precision with round to nearest
 * even, subnormals kept (never flushed), fma() a fused multiply-add rounded once, and no other
 * contraction. That makes their results bit-identical for the same inputs, so optimizer state can
 * move between tiers without changing a bit:
 *
 *   per call:  omb1 = 1 - beta1;  omb2 = 1 - beta2;  nlr = -lr
 *   per element i (p = master[i], m = m[i], v = v[i], gr = grad[i] converted exactly to float):
 *     g    = gr * grad_scale
 *     if (!decoupled) g = fma(weight_decay, p, g)         Adam: L2 term joins the gradient
 *     m'   = fma(beta1, m, omb1 * g)
 *     v'   = fma(beta2, v, omb2 * (g * g))
 *     mhat = m' * bias_corr1
 *     vhat = v' * bias_corr2
 *     den  = sqrt(vhat) + eps
 *     upd  = mhat / den
 *     if (decoupled) upd = fma(weight_decay, p, upd)      AdamW: decay joins the update
 *     p'   = fma(nlr, upd, p)
 *   stored: master[i] = N(p'), m[i] = N(m'), v[i] = N(v'), param_copy[i] = convert(N(p'))
 *   where N(x) replaces any NaN by the canonical quiet NaN 0x7fc00000 (CPUs and GPUs propagate NaN
 *   payloads differently; this keeps even a diverged step identical), and convert is the
 *   core/dtype.h conversion to the copy's dtype (bf16, f16: round to nearest even).
 * The weight-decay fma is done even when weight_decay is 0 (it can only change the sign of a zero,
 * and does so the same way everywhere).
 */
#ifndef TZ_KERNELS_ADAM_H
#define TZ_KERNELS_ADAM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tz_adam_params {
  float lr;
  float beta1, beta2; /* in [0, 1) */
  float eps;          /* >= 0 */
  float weight_decay;
  int decoupled;    /* 1: AdamW (decay added to the update); 0: Adam (L2 added to the gradient) */
  float bias_corr1; /* 1 / (1 - beta1^t), set by tz_adam_params_for_step */
  float bias_corr2; /* 1 / (1 - beta2^t), set by tz_adam_params_for_step */
  float grad_scale; /* multiplies the gradient first: 1/loss_scale times the clip coefficient */
};

/* Sets p->bias_corr1 and p->bias_corr2 for step t (t >= 1, the first step is 1) from p->beta1 and
 * p->beta2, and checks every field (tz_adam_params_check). beta^t is computed in double by
 * repeated squaring (IEEE multiplies only, so the same on every machine and libm), then
 * 1 / (1 - beta^t) in double, rounded once to float. Once per step, on the host, for all paths. */
int tz_adam_params_for_step(struct tz_adam_params *p, int64_t t);

/* 0, or TZ_EINVAL naming the field that is not finite or out of range. */
int tz_adam_params_check(const struct tz_adam_params *p);

/* Which CPU code runs. AUTO takes the widest that this CPU and OS support; the others are for
 * tests and benchmarks, and fail with TZ_ENOTSUP where unsupported. All give the same bits. */
enum tz_adam_cpu_path {
  TZ_ADAM_CPU_AUTO = 0,
  TZ_ADAM_CPU_SCALAR,
  TZ_ADAM_CPU_AVX2,   /* AVX2 + FMA + F16C, 8 lanes */
  TZ_ADAM_CPU_AVX512, /* AVX-512F, 16 lanes */
};

struct tz_adam_cpu_opts {
  int threads;                /* OpenMP threads; 0: ncpus with cpus, else omp_get_max_threads() */
  enum tz_adam_cpu_path path; /* TZ_ADAM_CPU_AUTO unless testing */
  /* Optional (ncpus), borrowed: thread i of the team is bound to cpus[i % ncpus] (the topology
   * advice's optimizer cores). The calling thread is thread 0 and stays bound after the call, so
   * call from the optimizer lane's own thread. A thread already bound to its cpu by an earlier
   * call is not bound again. NULL: threads are left where they are. */
  const int *cpus;
  int ncpus;
};

/* The elements are split into fixed chunks of TZ_ADAM_CPU_CHUNK (the same whatever the thread
 * count), each chunk done by one thread; a multiple of every vector width. */
#define TZ_ADAM_CPU_CHUNK ((size_t)1 << 15)

/* One Adam step over n elements, in place:
 *   master, m, v: (n) fp32, read and written
 *   grad:         (n) of grad_dtype (TZ_F32, TZ_BF16 or TZ_F16), read
 *   param_copy:   NULL, or (n) of copy_dtype, written in the same pass from the new master
 * The arrays must not overlap; no alignment is required. o may be NULL (all defaults).
 * FTZ/DAZ and the rounding mode are set to IEEE defaults in each thread for the call and restored.
 * Returns 0, TZ_EINVAL (bad argument), TZ_ENOTSUP (the forced path is unsupported here), or the
 * error of binding a thread to its cpu (then nothing was computed). */
int tz_adam_cpu(const struct tz_adam_params *p, float *master, float *m, float *v, const void *grad,
                enum tz_dtype grad_dtype, void *param_copy, enum tz_dtype copy_dtype, size_t n,
                const struct tz_adam_cpu_opts *o);

/* The ceiling tz_adam_cpu is measured against: the same loads and stores of the same arrays, in
 * the same chunks, on the same threads and path, with no arithmetic. It rotates the state
 * (master <- m, m <- v, v <- master, so the values stay valid Adam state for later runs) and
 * writes param_copy <- grad bitwise (the top 16 bits of an f32, or a 16-bit value shifted up
 * into an f32). Same arguments and errors as tz_adam_cpu. */
int tz_adam_cpu_ceiling(float *master, float *m, float *v, const void *grad,
                        enum tz_dtype grad_dtype, void *param_copy, enum tz_dtype copy_dtype,
                        size_t n, const struct tz_adam_cpu_opts *o);

/* Binds the OpenMP team of o->threads threads (the same count rule as tz_adam_cpu) to o->cpus as
 * tz_adam_cpu would, without computing anything: for work that must run where the optimizer
 * will, such as first-touch filling of its arrays. 0 when o->cpus is NULL. */
int tz_adam_cpu_bind(const struct tz_adam_cpu_opts *o);

/* 1 if this CPU and OS can run the path (AUTO and SCALAR always), else 0. */
int tz_adam_cpu_path_supported(enum tz_adam_cpu_path path);
/* The path AUTO resolves to here. */
enum tz_adam_cpu_path tz_adam_cpu_path_best(void);
/* "auto", "scalar", "avx2", "avx512"; "?" for other values. */
const char *tz_adam_cpu_path_name(enum tz_adam_cpu_path path);

#ifdef __cplusplus
}
#endif

#endif
