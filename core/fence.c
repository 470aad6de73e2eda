#include "core/fence.h"
#include "core/error.h"
#include "core/internal.h"
#include "util/clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct callback {
  void (*fn)(void *arg, int rc);
  void *arg;
  struct callback *next;
};

struct tz_fence {
  int refs;   /* atomic */
  int done;   /* atomic: 0 pending, 1 complete */
  int firing; /* under mu: the signalling thread is still running callbacks */
  int rc;
  char *msg; /* owned; the error message for waiters */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct callback *cbs; /* run in the order they were added */
  struct callback **cbs_tail;
  const struct tz_fence_poll_ops *poll_ops; /* polled fences only */
  void *poll_ctx;
  tz_fence *via; /* owned reference: the fence this one forwards (tz_fence_forward) */
};

static tz_fence *fence_alloc(void) {
  tz_fence *f = calloc(1, sizeof *f);
  if (!f)
    return NULL;
  f->refs = 1;
  f->cbs_tail = &f->cbs;
  pthread_mutex_init(&f->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&f->cv, &ca);
  pthread_condattr_destroy(&ca);
  return f;
}

tz_fence *tz_fence_create(void) { return fence_alloc(); }

tz_fence *tz_fence_completed(int rc) {
  tz_fence *f = fence_alloc();
  if (f) {
    f->rc = rc;
    __atomic_store_n(&f->done, 1, __ATOMIC_RELEASE);
  }
  return f;
}

tz_fence *tz_fence_retain(tz_fence *f) {
  __atomic_add_fetch(&f->refs, 1, __ATOMIC_RELAXED);
  return f;
}

void tz_fence_release(tz_fence *f) {
  if (!f || __atomic_sub_fetch(&f->refs, 1, __ATOMIC_ACQ_REL) != 0)
    return;
  for (struct callback *c = f->cbs, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  if (f->poll_ops && f->poll_ops->destroy && f->poll_ctx)
    f->poll_ops->destroy(f->poll_ctx);
  tz_fence_release(f->via);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  free(f->msg);
  free(f);
}

void tz_fence_signal_msg(tz_fence *f, int rc, const char *msg) {
  pthread_mutex_lock(&f->mu);
  f->rc = rc;
  if (rc < 0 && msg && *msg && !f->msg)
    f->msg = strdup(msg);
  __atomic_store_n(&f->done, 1, __ATOMIC_RELEASE);
  f->firing = 1;
  pthread_cond_broadcast(&f->cv);
  /* Callbacks may release the last other reference; keep f alive until they have run. */
  tz_fence_retain(f);
  /* A callback added while these run (tz_fence_then sees `firing`) joins the list and runs here
   * after them: one added later never runs before one added earlier, whatever the threads. */
  for (;;) {
    struct callback *cbs = f->cbs;
    f->cbs = NULL;
    f->cbs_tail = &f->cbs;
    if (!cbs) {
      f->firing = 0;
      break;
    }
    pthread_mutex_unlock(&f->mu);
    /* Callbacks learn the error's message the way any code does: from this thread's message. */
    if (rc < 0)
      tz_err_set(rc, "%s", f->msg ? f->msg : tz_strerror(rc));
    for (struct callback *c = cbs, *n; c; c = n) {
      n = c->next;
      c->fn(c->arg, rc);
      free(c);
    }
    pthread_mutex_lock(&f->mu);
  }
  pthread_mutex_unlock(&f->mu);
  tz_fence_release(f);
}

void tz_fence_signal(tz_fence *f, int rc) {
  tz_fence_signal_msg(f, rc, rc < 0 ? tz_err_msg() : NULL);
}

int tz_fence_query(tz_fence *f) {
  if (!__atomic_load_n(&f->done, __ATOMIC_ACQUIRE))
    return 0;
  return f->rc < 0 ? f->rc : 1;
}

static int fence_result(tz_fence *f) {
  if (f->rc < 0)
    tz_err_set(f->rc, "%s", f->msg ? f->msg : tz_strerror(f->rc));
  return f->rc;
}

int tz_fence_wait(tz_fence *f, int64_t timeout_ns) {
  if (__atomic_load_n(&f->done, __ATOMIC_ACQUIRE))
    return fence_result(f);
  struct timespec dl;
  if (timeout_ns >= 0)
    dl = tz_deadline(CLOCK_MONOTONIC, (uint64_t)timeout_ns);
  pthread_mutex_lock(&f->mu);
  while (!f->done) {
    if (timeout_ns < 0) {
      pthread_cond_wait(&f->cv, &f->mu);
    } else if (pthread_cond_timedwait(&f->cv, &f->mu, &dl) == ETIMEDOUT && !f->done) {
      pthread_mutex_unlock(&f->mu);
      return tz_err_set(TZ_ETIMEDOUT, "fence: no completion within %.3f s",
                        (double)timeout_ns * 1e-9);
    }
  }
  pthread_mutex_unlock(&f->mu);
  return fence_result(f);
}

int tz_fence_then(tz_fence *f, void (*fn)(void *arg, int rc), void *arg) {
  struct callback *c = malloc(sizeof *c);
  if (!c)
    return tz_err_set(TZ_ENOMEM, "fence: no memory for a callback");
  c->fn = fn;
  c->arg = arg;
  c->next = NULL;
  pthread_mutex_lock(&f->mu);
  if (f->done && !f->firing) {
    int rc = f->rc;
    pthread_mutex_unlock(&f->mu);
    free(c);
    if (rc < 0)
      tz_err_set(rc, "%s", f->msg ? f->msg : tz_strerror(rc));
    fn(arg, rc);
    return 0;
  }
  *f->cbs_tail = c;
  f->cbs_tail = &c->next;
  pthread_mutex_unlock(&f->mu);
  return 0;
}

struct all_ctx {
  tz_fence *out;
  int left; /* atomic */
  int rc;   /* atomic: first error */
  char msg[256];
};

static void all_one(void *arg, int rc) {
  struct all_ctx *a = arg;
  if (rc < 0) {
    int zero = 0;
    if (__atomic_compare_exchange_n(&a->rc, &zero, rc, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      strncpy(a->msg, tz_err_msg(), sizeof a->msg - 1);
  }
  if (__atomic_sub_fetch(&a->left, 1, __ATOMIC_ACQ_REL) == 0) {
    tz_fence *out = a->out;
    int r = __atomic_load_n(&a->rc, __ATOMIC_ACQUIRE);
    char msg[256];
    memcpy(msg, a->msg, sizeof msg);
    free(a);
    tz_fence_signal_msg(out, r, msg);
    tz_fence_release(out);
  }
}

tz_fence *tz_fence_all(tz_fence *const *fs, int n) {
  tz_fence *out = tz_fence_create();
  struct all_ctx *a = calloc(1, sizeof *a);
  if (!out || !a) {
    free(a);
    tz_fence_release(out);
    return NULL;
  }
  a->out = tz_fence_retain(out);
  a->left = n + 1; /* +1 held until every callback is registered */
  for (int i = 0; i < n; i++) {
    if (!fs[i] || tz_fence_then(fs[i], all_one, a) < 0)
      all_one(a, 0);
  }
  all_one(a, 0);
  return out;
}

tz_fence *tz_fence_create_polled(tz_progress *pe, const struct tz_fence_poll_ops *ops, void *ctx) {
  tz_fence *f = fence_alloc();
  if (!f)
    return NULL;
  f->poll_ops = ops;
  f->poll_ctx = ctx;
  if (tz_progress_watch(pe, tz_fence_retain(f)) < 0) {
    f->poll_ctx = NULL; /* the caller still owns ctx on failure */
    tz_fence_release(f);
    tz_fence_release(f);
    return NULL;
  }
  return f;
}

void *tz_fence_native(tz_fence *f, const struct tz_fence_poll_ops *ops) {
  if (__atomic_load_n(&f->done, __ATOMIC_ACQUIRE))
    return NULL;
  /* The inner fence may have completed already while f's callbacks still run: its object is
   * still valid (f holds it), and waiting on it is then a no-op, which is what f means too. */
  while (f->via)
    f = f->via;
  return f->poll_ops == ops ? f->poll_ctx : NULL;
}

void tz_fence_forward(tz_fence *f, tz_fence *inner) { f->via = tz_fence_retain(inner); }

int tz_fence_poll_once(tz_fence *f) {
  if (__atomic_load_n(&f->done, __ATOMIC_ACQUIRE))
    return 1;
  int r = f->poll_ops->poll(f->poll_ctx);
  if (r != 0)
    tz_fence_signal(f, r < 0 ? r : 0);
  return r != 0;
}
