/* The collectives registry: which backends this build has, and creating a comm by name. The only
 * place that knows which backends were compiled in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm_impl.h"
#include "core/error.h"
#include "core/log.h"

static const struct tz_comm_ops *const backends[] = {
    &tz_comm_single_ops,
#ifdef TZ_HAVE_MPI
    &tz_comm_mpi_ops,
#endif
#ifdef TZ_HAVE_NCCL
    &tz_comm_nccl_ops,
#endif
};
#define N_BACKENDS ((int)(sizeof backends / sizeof *backends))

int tz_comm_backend_count(void) { return N_BACKENDS; }

const char *tz_comm_backend_name(int i) {
  return i >= 0 && i < N_BACKENDS ? backends[i]->name : NULL;
}

static const struct tz_comm_ops *find(const char *name) {
  for (int i = 0; i < N_BACKENDS; i++)
    if (name && strcmp(backends[i]->name, name) == 0)
      return backends[i];
  return NULL;
}

static int not_found(const char *name) {
  char list[128] = "";
  size_t n = 0;
  for (int i = 0; i < N_BACKENDS; i++)
    n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", backends[i]->name);
  int known = name && (strcmp(name, "mpi") == 0 || strcmp(name, "nccl") == 0);
  return tz_err_set(known ? TZ_ENOTSUP : TZ_ENOENT,
                    "comm: backend '%s' is not %s (this build "
                    "has: %s)",
                    name ? name : "(null)", known ? "built in" : "known", list);
}

int tz_comm_probe(const char *backend, char *why, size_t why_len) {
  const struct tz_comm_ops *ops = find(backend);
  if (!ops) {
    int rc = not_found(backend);
    if (why)
      snprintf(why, why_len, "%s", tz_err_msg());
    return rc;
  }
  return ops->probe(why, why_len);
}

#ifdef TZ_HAVE_MPI
/* For a launch by mpirun with no TCP address: rank 0's blob goes out over a temporary MPI comm. */
static int bcast_over_mpi(void *arg, void *buf, size_t len) {
  tz_fence *f = NULL;
  TZ_CHECK(tz_comm_broadcast(arg, buf, len, 0, NULL, &f));
  int rc = tz_fence_wait(f, -1);
  tz_fence_release(f);
  return rc;
}
#endif

int tz_comm_create(const char *backend, struct tz_bootstrap *bs, const struct tz_comm_params *p,
                   tz_comm **out) {
  *out = NULL;
  const struct tz_comm_ops *ops = find(backend);
  if (!ops)
    return not_found(backend);
  struct tz_comm_params defaults;
  if (!p) {
    tz_comm_params_init(&defaults);
    p = &defaults;
  }
  if (tz_dtype_size(p->accum) == 0)
    return tz_err_set(TZ_EINVAL, "comm: accumulation dtype %d is not a dtype", (int)p->accum);
  struct tz_bootstrap detected;
  if (!bs) {
    TZ_CHECK(tz_bootstrap_detect(&detected));
    bs = &detected;
  }
  tz_comm *c = calloc(1, sizeof *c);
  if (!c)
    return tz_err_set(TZ_ENOMEM, "comm: out of memory");

  tz_comm *bridge = NULL;
  if (ops->needs_bcast && bs->size > 1 && !tz_bootstrap_has_channel(bs)) {
#ifdef TZ_HAVE_MPI
    if (bs->kind == TZ_LAUNCH_MPIRUN) {
      int rc = tz_comm_create("mpi", bs, NULL, &bridge);
      if (rc < 0) {
        free(c);
        return rc;
      }
      bs->bcast_fn = bcast_over_mpi;
      bs->bcast_arg = bridge;
    }
#endif
  }
  int rank = -1, size = 0;
  int rc = ops->create(bs, p, &rank, &size, &c->ctx);
  if (bridge) {
    bs->bcast_fn = NULL;
    bs->bcast_arg = NULL;
    tz_comm_destroy(bridge);
  }
  if (rc < 0) {
    free(c);
    return rc;
  }
  c->ops = ops;
  c->rank = rank;
  c->size = size;
  c->accum_mode = p->accum;
  TZ_DEBUG("comm %s: rank %d of %d (launch: %s)", ops->name, rank, size,
           tz_launch_kind_name(bs->kind));
  *out = c;
  return 0;
}
