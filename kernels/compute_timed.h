/* Per-operation times of a compute instance, for profilers (tz-bench layer). A timed instance
 * forwards every call to the instance it wraps; around each kernel it drains that instance's
 * stream (tz_compute_sync) before and after, and adds the wall time between to the operation's
 * counter. The times so include a few microseconds of launch and sync per call; allocation,
 * host copies, sync and the stream are forwarded untimed. */
#ifndef TZ_KERNELS_COMPUTE_TIMED_H
#define TZ_KERNELS_COMPUTE_TIMED_H

#include "kernels/compute.h"

enum tz_compute_timed_op {
  TZ_OP_MATMUL_NT, /* B transposed: x W^T in a layer's forward */
  TZ_OP_MATMUL_NN, /* dy W */
  TZ_OP_MATMUL_TN, /* A transposed: dy^T x */
  TZ_OP_ATTENTION_FWD,
  TZ_OP_ATTENTION_BWD,
  TZ_OP_RMSNORM_FWD,
  TZ_OP_RMSNORM_BWD,
  TZ_OP_ROPE,
  TZ_OP_BIAS_ADD,  /* the q, k, v projections' biases */
  TZ_OP_BIAS_GRAD, /* their gradients */
  TZ_OP_SWIGLU_FWD,
  TZ_OP_SWIGLU_BWD,
  TZ_OP_ADD,
  TZ_OP_COPY,
  TZ_OP_OTHER, /* zero, fill, scale, axpy, cast, sums, embedding, cross-entropy, Adam */
  TZ_OP_COUNT
};

/* Per operation: the time, the calls, and what the calls' arguments say they must do, so that a
 * profile can set each op beside its ceiling: bytes, the least memory traffic the contract implies
 * (every input read once, every output written once, an accumulated output both; an op whose
 * kernel reads a tensor twice still counts it once), and flop, the products' floating-point
 * operations (matmul 2 M N K; attention as tz-bench layer counts it: 2 B H T^2 D forward over the
 * causal triangle, 2.5 times that backward). TZ_OP_OTHER counts time and calls only. */
struct tz_compute_times {
  double seconds[TZ_OP_COUNT];
  int calls[TZ_OP_COUNT];
  double bytes[TZ_OP_COUNT];
  double flop[TZ_OP_COUNT];
};

/* *out: an instance with inner's backend and dtypes whose calls run on inner and add to *times
 * (both borrowed: they must outlive it). tz_compute_destroy(*out) leaves inner as it is. */
int tz_compute_timed_create(tz_compute *inner, struct tz_compute_times *times, tz_compute **out);

#endif
