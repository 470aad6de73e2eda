/* The collectives backend interface: one static const ops table per backend file, filled with
 * designated initializers. The public wrappers (comm.c) check arguments, so a backend sees only
 * valid ones: send and recv non-NULL, dt one of the dtypes, 0 <= root < size, and, where
 * accumulation is in fp32, every dtype; sizes that do not overflow size_t when multiplied by P. */
#ifndef TZ_COMM_IMPL_H
#define TZ_COMM_IMPL_H

#include "collectives/comm.h"

struct tz_comm_ops {
  const char *name;
  /* >= 0: usable here (the most ranks per machine, 0 for no limit); negative, with why. */
  int (*probe)(char *why, size_t why_len);
  /* Joins the world of bs. Sets *rank and *size to what the backend itself sees, and *ctx. */
  int (*create)(struct tz_bootstrap *bs, const struct tz_comm_params *p, int *rank, int *size,
                void **ctx);
  /* Waits for what is in flight (bounded by the timeout), then frees. */
  void (*destroy)(void *ctx);
  /* The collectives, as in comm.h. On success *done holds a fence the caller owns; on failure
   * nothing is left behind and the caller's error message is set. */
  int (*all_gather)(void *ctx, const void *send, void *recv, size_t bytes, tz_fence *after,
                    tz_fence **done);
  int (*reduce_scatter)(void *ctx, const void *send, void *recv, size_t count, enum tz_dtype dt,
                        tz_fence *after, tz_fence **done);
  int (*all_reduce)(void *ctx, const void *send, void *recv, size_t count, enum tz_dtype dt,
                    tz_fence *after, tz_fence **done);
  int (*broadcast)(void *ctx, void *buf, size_t bytes, int root, tz_fence *after, tz_fence **done);
  int (*barrier)(void *ctx, tz_fence *after, tz_fence **done);
  void (*abort)(void *ctx, int rc, const char *why);
  /* optional: NULL means the backend has no native handles. */
  void *(*native)(void *ctx, const char *what);
  /* Set when create needs tz_bootstrap_bcast (nccl's unique id); the registry then supplies a
   * channel over MPI when the launch has none. */
  int needs_bcast;
};

struct tz_comm {
  const struct tz_comm_ops *ops;
  void *ctx;
  int rank, size;
  enum tz_dtype accum_mode; /* as in params: TZ_F32, or the payload's own */
};

extern const struct tz_comm_ops tz_comm_single_ops;
extern const struct tz_comm_ops tz_comm_mpi_ops;
extern const struct tz_comm_ops tz_comm_nccl_ops;

/* Helpers the backends share (comm.c). */
/* The timeout in seconds: p->timeout_s, else tz_comm_env_timeout(). */
double tz_comm_timeout(const struct tz_comm_params *p);
/* tierzero.comm_timeout as the environment sets it ($TZ_COMM_TIMEOUT, read through the config's
 * mapping, tz_config_env_key), else 300 (a value that is set but not a positive number is warned
 * about, once per process). For callers without a config: the launcher's exchanges (launch.c)
 * and every backend's watchdog when params leave timeout_s at 0. */
double tz_comm_env_timeout(void);
/* out[i] = sum over r in 0..nchunks-1, in that order, of in[r * stride + i], for i < n, with
 * in and out of dtype dt; arithmetic in fp32 when accum_f32, else in dt (rounding after every
 * addition). out may alias chunk 0 only if it is exactly in. */
void tz_comm_sum_chunks(void *out, const void *in, size_t stride, size_t n, int nchunks,
                        enum tz_dtype dt, int accum_f32);

#endif
