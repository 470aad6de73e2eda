/* Lanes: the generic wrappers, and the CPU lane. A CPU lane is a chain of fences: each job starts
 * when the fence before it (the previous job, or the fences waited on since) completes, and runs on
 * the lane's own pool thread. Nothing in it blocks the thread that feeds it. */
#include "core/lane_impl.h"
#include "core/error.h"
#include "core/internal.h"
#include "core/pool.h"
#include "core/tier.h"
#include "util/clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tz_lane_create_ops(const struct tz_lane_ops *ops, void *ctx, const char *name, tz_lane **out) {
  tz_lane *l = calloc(1, sizeof *l);
  if (!l)
    return tz_err_set(TZ_ENOMEM, "lane %s: no memory", name);
  l->ops = ops;
  l->ctx = ctx;
  snprintf(l->name, sizeof l->name, "%s", name);
  *out = l;
  return 0;
}

void tz_lane_destroy(tz_lane *l) {
  if (!l)
    return;
  l->ops->destroy(l);
  free(l);
}

const char *tz_lane_name(const tz_lane *l) { return l->name; }

void *tz_lane_native(tz_lane *l) { return l->ops->native ? l->ops->native(l) : NULL; }

int tz_lane_wait(tz_lane *l, tz_fence *f, struct tz_lane_wait *info) {
  return l->ops->wait(l, &f, 1, info);
}

int tz_lane_wait_all(tz_lane *l, tz_fence *const *fs, int n, struct tz_lane_wait *info) {
  if (n < 0 || (n > 0 && !fs))
    return tz_err_set(TZ_EINVAL, "lane %s: wait on %d fences", l->name, n);
  return l->ops->wait(l, fs, n, info);
}

int tz_lane_submit(tz_lane *l, int (*fn)(void *arg), void *arg) {
  if (!l->ops->submit)
    return tz_err_set(TZ_ENOTSUP,
                      "lane %s (%s): runs no host functions; launch work on its "
                      "native handle",
                      l->name, l->ops->kind);
  return l->ops->submit(l, fn, arg);
}

int tz_lane_record(tz_lane *l, tz_fence **out) { return l->ops->record(l, out); }

int tz_lane_order(tz_lane *from, tz_lane *to) {
  if (from->ops == to->ops && from->ops->order)
    return from->ops->order(from, to);
  tz_fence *f = NULL;
  TZ_CHECK(tz_lane_record(from, &f));
  int rc = tz_lane_wait(to, f, NULL);
  tz_fence_release(f);
  return rc;
}

struct tz_lane_timer {
  tz_lane *l;
  void *ctx;
  int n;
};

int tz_lane_timer_create(tz_lane *l, int n, tz_lane_timer **out) {
  *out = NULL;
  if (!l->ops->timer_create)
    return tz_err_set(TZ_ENOTSUP, "lane %s (%s): cannot time its work", l->name, l->ops->kind);
  if (n < 1)
    return tz_err_set(TZ_EINVAL, "lane %s: a timer of %d marks", l->name, n);
  tz_lane_timer *t = calloc(1, sizeof *t);
  if (!t)
    return tz_err_set(TZ_ENOMEM, "lane %s: no memory for a timer", l->name);
  int rc = l->ops->timer_create(l, n, &t->ctx);
  if (rc < 0) {
    free(t);
    return rc;
  }
  t->l = l;
  t->n = n;
  *out = t;
  return 0;
}

int tz_lane_timer_mark(tz_lane_timer *t, int i) {
  if (i < 0 || i >= t->n)
    return tz_err_set(TZ_EINVAL, "lane %s: timing mark %d outside [0, %d)", t->l->name, i, t->n);
  return t->l->ops->timer_mark(t->l, t->ctx, i);
}

int tz_lane_timer_elapsed(tz_lane_timer *t, int i, int j, double *seconds) {
  *seconds = 0;
  if (i < 0 || i >= t->n || j < 0 || j >= t->n)
    return tz_err_set(TZ_EINVAL, "lane %s: timing marks %d, %d outside [0, %d)", t->l->name, i, j,
                      t->n);
  return t->l->ops->timer_elapsed(t->l, t->ctx, i, j, seconds);
}

void tz_lane_timer_destroy(tz_lane_timer *t) {
  if (!t)
    return;
  t->l->ops->timer_destroy(t->l, t->ctx);
  free(t);
}

void tz_lane_stats(const tz_lane *l, struct tz_lane_stats *out) {
  out->busy_s = 1e-9 * (double)__atomic_load_n(&l->busy_ns, __ATOMIC_RELAXED);
  out->stall_s = 1e-9 * (double)__atomic_load_n(&l->stall_ns, __ATOMIC_RELAXED);
  out->jobs = __atomic_load_n(&l->jobs, __ATOMIC_RELAXED);
  out->waits = __atomic_load_n(&l->waits, __ATOMIC_RELAXED);
}

void tz_lane_set_jitter(tz_lane *l, int max_us, uint64_t seed) {
  if (l->ops->set_jitter)
    l->ops->set_jitter(l, max_us, seed);
}

/* ---- the CPU lane ---- */

struct cpu_lane {
  tz_pool *pool;      /* one thread */
  pthread_mutex_t mu; /* tail */
  tz_fence *tail;     /* completes when everything submitted so far has */
};

struct cpu_job {
  tz_lane *l;
  int (*fn)(void *arg);
  void *arg;
  tz_fence *done;
};

/* Measures one wait: the later of "the work before it finished" and "the wait was made", against
 * the time f completed. */
struct wait_meter {
  tz_lane *l;
  struct tz_lane_wait *info;
  uint64_t t_call, t_prev, t_f;
  int left; /* atomic: callbacks still to run */
};

static void meter_finish(struct wait_meter *m) {
  uint64_t start = m->t_prev > m->t_call ? m->t_prev : m->t_call;
  uint64_t stall = m->t_f > start ? m->t_f - start : 0;
  m->info->stall_ns = stall;
  m->info->ready_ns = start + stall;
  __atomic_add_fetch(&m->l->stall_ns, stall, __ATOMIC_RELAXED);
  free(m);
}

static void meter_prev(void *arg, int rc) {
  (void)rc;
  struct wait_meter *m = arg;
  m->t_prev = tz_now_ns();
  if (__atomic_sub_fetch(&m->left, 1, __ATOMIC_ACQ_REL) == 0)
    meter_finish(m);
}

static void meter_f(void *arg, int rc) {
  (void)rc;
  struct wait_meter *m = arg;
  m->t_f = tz_now_ns();
  if (__atomic_sub_fetch(&m->left, 1, __ATOMIC_ACQ_REL) == 0)
    meter_finish(m);
}

/* A host thread can wait on anything: the fences become one. */
static int cpu_wait(tz_lane *l, tz_fence *const *fs, int n, struct tz_lane_wait *info) {
  struct cpu_lane *c = l->ctx;
  tz_fence *f = n == 1 && fs[0] ? tz_fence_retain(fs[0]) : tz_fence_all(fs, n);
  if (!f)
    return tz_err_set(TZ_ENOMEM, "lane %s: no memory for a fence", l->name);
  struct wait_meter *m = NULL;
  if (info) {
    m = calloc(1, sizeof *m);
    if (!m) {
      tz_fence_release(f);
      return tz_err_set(TZ_ENOMEM, "lane %s: no memory", l->name);
    }
    *m = (struct wait_meter){.l = l, .info = info, .t_call = tz_now_ns(), .left = 2};
  }
  pthread_mutex_lock(&c->mu);
  tz_fence *prev = c->tail;
  /* The meter's callbacks go on before the combined fence's, so the measurement is written
   * before anything that waits on the lane can run. */
  if (m && tz_fence_then(prev, meter_prev, m) < 0)
    meter_prev(m, 0);
  if (m && tz_fence_then(f, meter_f, m) < 0)
    meter_f(m, 0);
  tz_fence *both[2] = {prev, f};
  tz_fence *all = tz_fence_all(both, 2);
  if (!all) {
    pthread_mutex_unlock(&c->mu);
    tz_fence_release(f);
    return tz_err_set(TZ_ENOMEM, "lane %s: no memory for a fence", l->name);
  }
  c->tail = all;
  pthread_mutex_unlock(&c->mu);
  tz_fence_release(prev);
  tz_fence_release(f);
  __atomic_add_fetch(&l->waits, 1, __ATOMIC_RELAXED);
  return 0;
}

static void job_finish(struct cpu_job *j, int rc) {
  tz_fence_signal_msg(j->done, rc, rc < 0 ? tz_err_msg() : NULL);
  tz_fence_release(j->done);
  free(j);
}

static int job_run(void *arg) {
  struct cpu_job *j = arg;
  uint64_t t0 = tz_now_ns();
  int rc = j->fn(j->arg);
  __atomic_add_fetch(&j->l->busy_ns, tz_now_ns() - t0, __ATOMIC_RELAXED);
  __atomic_add_fetch(&j->l->jobs, 1, __ATOMIC_RELAXED);
  job_finish(j, rc < 0 ? rc : 0);
  return 0;
}

static void job_start(void *arg, int rc) {
  struct cpu_job *j = arg;
  if (rc < 0) { /* poisoned: skip the job, pass the first error on */
    job_finish(j, rc);
    return;
  }
  struct cpu_lane *c = j->l->ctx;
  rc = tz_pool_submit(c->pool, job_run, j, NULL);
  if (rc < 0)
    job_finish(j, rc);
}

static int cpu_submit(tz_lane *l, int (*fn)(void *arg), void *arg) {
  struct cpu_lane *c = l->ctx;
  struct cpu_job *j = malloc(sizeof *j);
  tz_fence *done = tz_fence_create();
  if (!j || !done) {
    free(j);
    tz_fence_release(done);
    return tz_err_set(TZ_ENOMEM, "lane %s: no memory for a job", l->name);
  }
  *j = (struct cpu_job){l, fn, arg, done};
  pthread_mutex_lock(&c->mu);
  tz_fence *prev = c->tail;
  c->tail = tz_fence_retain(done);
  pthread_mutex_unlock(&c->mu);
  if (tz_fence_then(prev, job_start, j) < 0)
    job_start(j, tz_fence_wait(prev, -1));
  tz_fence_release(prev);
  return 0;
}

static int cpu_record(tz_lane *l, tz_fence **out) {
  struct cpu_lane *c = l->ctx;
  pthread_mutex_lock(&c->mu);
  *out = tz_fence_retain(c->tail);
  pthread_mutex_unlock(&c->mu);
  return 0;
}

static void cpu_set_jitter(tz_lane *l, int max_us, uint64_t seed) {
  struct cpu_lane *c = l->ctx;
  tz_pool_set_jitter(c->pool, max_us, seed);
}

static void cpu_destroy(tz_lane *l) {
  struct cpu_lane *c = l->ctx;
  if (!c)
    return;
  if (c->tail) {
    tz_fence_wait(c->tail, -1);
    tz_fence_release(c->tail);
  }
  tz_pool_destroy(c->pool);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static const struct tz_lane_ops cpu_lane_ops = {
    .kind = "cpu",
    .wait = cpu_wait,
    .submit = cpu_submit,
    .record = cpu_record,
    .set_jitter = cpu_set_jitter,
    .destroy = cpu_destroy,
};

int tz_lane_create_cpu(const char *name, tz_lane **out) {
  struct cpu_lane *c = calloc(1, sizeof *c);
  if (!c)
    return tz_err_set(TZ_ENOMEM, "lane %s: no memory", name);
  pthread_mutex_init(&c->mu, NULL);
  c->tail = tz_fence_completed(0);
  int rc = c->tail ? tz_pool_create(1, name, &c->pool)
                   : tz_err_set(TZ_ENOMEM, "lane %s: no memory", name);
  if (rc == 0)
    rc = tz_lane_create_ops(&cpu_lane_ops, c, name, out);
  if (rc < 0) {
    tz_fence_release(c->tail);
    tz_pool_destroy(c->pool);
    pthread_mutex_destroy(&c->mu);
    free(c);
  }
  return rc;
}
