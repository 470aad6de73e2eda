/* The CUDA-stream compute lane (tiers/hbm.h, tz_hbm_lane_create). A stream runs in order, so the
 * lane needs no queue of its own: a wait is cudaStreamWaitEvent on each input's event, a job is
 * the host launching kernels on the stream, a record is a pooled event polled by the progress
 * engine. What the host must still do is bookkeeping on completion:
 * - the record's fence completes when its event has and every input waited on since the previous
 *   record has on the host too, with the first error among them (a copy that failed poisons the
 *   lane, as on a CPU lane);
 * - stalls: a wait with info records a timing event before and one after its waits; the record
 *   that follows records one more. When its event completes, elapsed(before, after) is the stall
 *   and elapsed(after, end) the lane's busy time, and info is filled before the fence completes. */
#define _GNU_SOURCE
#include "tiers/hbm.h"
#include "tiers/hbm_impl.h"
#include "core/error.h"
#include "core/lane_impl.h"
#include "core/log.h"
#include "util/clock.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One metered wait: timing events around its cudaStreamWaitEvent calls. */
struct meter {
  cudaEvent_t before, after;
  struct tz_lane_wait *info;
  int late; /* some input was pending when the wait was made */
  struct meter *next;
};

struct hbm_lane {
  tz_tier *hbm;
  struct tz_hbm_stream *st;
  cudaStream_t s;
  int device;
  pthread_mutex_t mu;                  /* everything below */
  struct meter *meters, **meters_tail; /* waits since the last record, in order */
  tz_fence **inputs;                   /* fences waited on since the last record, retained */
  int n_inputs, cap_inputs;
  int rc; /* poisoned: the first error of an input or a job */
  char msg[384];
  cudaEvent_t *free_ev; /* timing events to reuse */
  int n_free, cap_free;
  int outstanding;      /* atomic: records whose completion has not been handled */
  cudaEvent_t order_ev; /* tz_lane_order from this lane: made at its first use */
};

/* One record: completes out when its event and its inputs have. */
struct rec {
  tz_lane *l;
  tz_fence *out;
  tz_fence *ev;    /* the pooled event's fence; out forwards it */
  cudaEvent_t end; /* timing event, when there are meters */
  struct meter *meters;
  tz_fence **inputs;
  int n_inputs;
  int left; /* atomic: ev and the inputs still pending */
  int rc;   /* the lane's poison when recorded */
  char msg[384];
};

static int cuda_err(cudaError_t e, const char *what, const tz_lane *l) {
  cudaGetLastError();
  return tz_err_set(e == cudaErrorMemoryAllocation ? TZ_ENOMEM : TZ_ECUDA, "lane %s: %s: %s",
                    l->name, what, cudaGetErrorString(e));
}

/* A CUDA event of the lane's GPU with the given flags. */
static int lane_event(tz_lane *l, unsigned flags, cudaEvent_t *out) {
  struct hbm_lane *h = l->ctx;
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) {
    cudaGetLastError();
    prev = -1;
  }
  cudaError_t e = cudaSetDevice(h->device);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(out, flags);
  if (prev >= 0)
    cudaSetDevice(prev);
  return e == cudaSuccess ? 0 : cuda_err(e, "cudaEventCreateWithFlags", l);
}

/* A timing event from the lane's pool, created on the lane's GPU when the pool is empty. */
static int timing_event(tz_lane *l, cudaEvent_t *out) {
  struct hbm_lane *h = l->ctx;
  pthread_mutex_lock(&h->mu);
  if (h->n_free > 0) {
    *out = h->free_ev[--h->n_free];
    pthread_mutex_unlock(&h->mu);
    return 0;
  }
  pthread_mutex_unlock(&h->mu);
  return lane_event(l, cudaEventDefault, out);
}

/* Lock held. */
static void timing_event_put(struct hbm_lane *h, cudaEvent_t ev) {
  if (h->n_free == h->cap_free) {
    int cap = h->cap_free ? 2 * h->cap_free : 16;
    cudaEvent_t *n = realloc(h->free_ev, sizeof *n * (size_t)cap);
    if (!n) {
      cudaEventDestroy(ev);
      return;
    }
    h->free_ev = n;
    h->cap_free = cap;
  }
  h->free_ev[h->n_free++] = ev;
}

/* Lock held. The first error is kept. */
static void poison(struct hbm_lane *h, int rc, const char *msg) {
  if (h->rc < 0 || rc >= 0)
    return;
  h->rc = rc;
  snprintf(h->msg, sizeof h->msg, "%s", msg && *msg ? msg : "an input of the lane failed");
}

static int lane_wait(tz_lane *l, tz_fence *const *fs, int n, struct tz_lane_wait *info) {
  struct hbm_lane *h = l->ctx;
  /* Refuse before enqueueing anything: a stream cannot wait on host work. */
  int late = 0;
  for (int i = 0; i < n; i++) {
    if (!fs[i])
      continue;
    if (!tz_hbm_fence_waitable(fs[i]))
      return tz_err_set(TZ_EINVAL,
                        "lane %s: a CUDA stream cannot wait on a pending host fence "
                        "(an nvme read, a staged transfer, a fence of several; input %d of %d): "
                        "hand it the fence of the host->hbm copy that follows",
                        l->name, i, n);
    late |= tz_fence_query(fs[i]) == 0;
  }
  struct meter *m = NULL;
  if (info) {
    m = calloc(1, sizeof *m);
    if (!m)
      return tz_err_set(TZ_ENOMEM, "lane %s: no memory", l->name);
    m->info = info;
    m->late = late;
    int rc = timing_event(l, &m->before);
    if (rc == 0 && (rc = timing_event(l, &m->after)) < 0) {
      pthread_mutex_lock(&h->mu);
      timing_event_put(h, m->before);
      pthread_mutex_unlock(&h->mu);
    }
    if (rc < 0) {
      free(m);
      return rc;
    }
    cudaError_t e = cudaEventRecord(m->before, h->s);
    if (e != cudaSuccess) {
      rc = cuda_err(e, "cudaEventRecord before a wait", l);
      pthread_mutex_lock(&h->mu);
      timing_event_put(h, m->before);
      timing_event_put(h, m->after);
      pthread_mutex_unlock(&h->mu);
      free(m);
      return rc;
    }
  }
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    if (!fs[i])
      continue;
    int q = tz_fence_query(fs[i]);
    if (q < 0) { /* failed: poison the lane with its message, as a CPU lane would */
      tz_fence_wait(fs[i], 0);
      pthread_mutex_lock(&h->mu);
      poison(h, q, tz_err_msg());
      pthread_mutex_unlock(&h->mu);
      continue;
    }
    rc = tz_hbm_stream_wait(h->hbm, fs[i], h->s);
  }
  if (m && rc == 0) {
    cudaError_t e = cudaEventRecord(m->after, h->s);
    if (e != cudaSuccess)
      rc = cuda_err(e, "cudaEventRecord after a wait", l);
  }
  pthread_mutex_lock(&h->mu);
  if (rc < 0) {
    poison(h, rc, tz_err_msg());
    if (m) {
      timing_event_put(h, m->before);
      timing_event_put(h, m->after);
      free(m);
    }
    pthread_mutex_unlock(&h->mu);
    return rc;
  }
  if (m) {
    *h->meters_tail = m;
    h->meters_tail = &m->next;
  }
  for (int i = 0; i < n; i++) {
    if (!fs[i] || tz_fence_query(fs[i]) == 1)
      continue;
    if (h->n_inputs == h->cap_inputs) {
      int cap = h->cap_inputs ? 2 * h->cap_inputs : 64;
      tz_fence **nf = realloc(h->inputs, sizeof *nf * (size_t)cap);
      if (!nf) { /* the stream waits anyway; only the host's view of an error could be late */
        tz_fence_wait(fs[i], -1);
        continue;
      }
      h->inputs = nf;
      h->cap_inputs = cap;
    }
    h->inputs[h->n_inputs++] = tz_fence_retain(fs[i]);
  }
  pthread_mutex_unlock(&h->mu);
  __atomic_add_fetch(&l->waits, 1, __ATOMIC_RELAXED);
  return 0;
}

static int lane_submit(tz_lane *l, int (*fn)(void *arg), void *arg) {
  struct hbm_lane *h = l->ctx;
  pthread_mutex_lock(&h->mu);
  /* An input known to have failed already: launch nothing on bytes that did not arrive. */
  for (int i = 0; i < h->n_inputs && h->rc == 0; i++) {
    int q = tz_fence_query(h->inputs[i]);
    if (q < 0) {
      tz_fence_wait(h->inputs[i], 0);
      poison(h, q, tz_err_msg());
    }
  }
  int poisoned = h->rc < 0;
  pthread_mutex_unlock(&h->mu);
  if (poisoned)
    return 0; /* skipped; the next record's fence carries the error */
  int rc = fn(arg);
  __atomic_add_fetch(&l->jobs, 1, __ATOMIC_RELAXED);
  if (rc < 0) {
    pthread_mutex_lock(&h->mu);
    poison(h, rc, tz_err_msg());
    pthread_mutex_unlock(&h->mu);
  }
  return 0;
}

static double elapsed_ns(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return ms > 0 ? 1e6 * (double)ms : 0;
}

/* Every part of the record has completed: read the meters, then complete out. */
static void rec_finish(struct rec *r) {
  tz_lane *l = r->l;
  struct hbm_lane *h = l->ctx;
  uint64_t now = tz_now_ns();
  int rc = r->rc;
  const char *msg = r->msg;
  int q = tz_fence_query(r->ev);
  char evmsg[384] = "";
  if (rc == 0 && q < 0) {
    tz_fence_wait(r->ev, 0);
    snprintf(evmsg, sizeof evmsg, "%s", tz_err_msg());
    rc = q;
    msg = evmsg;
  }
  char inmsg[384] = "";
  for (int i = 0; i < r->n_inputs; i++) {
    q = tz_fence_query(r->inputs[i]);
    if (rc == 0 && q < 0) {
      tz_fence_wait(r->inputs[i], 0);
      snprintf(inmsg, sizeof inmsg, "%s", tz_err_msg());
      rc = q;
      msg = inmsg;
    }
    tz_fence_release(r->inputs[i]);
  }
  free(r->inputs);
  uint64_t busy = 0;
  pthread_mutex_lock(&h->mu);
  for (struct meter *m = r->meters, *next; m; m = next) {
    next = m->next;
    uint64_t stall = m->late && rc == 0 ? (uint64_t)elapsed_ns(m->before, m->after) : 0;
    uint64_t run = rc == 0 ? (uint64_t)elapsed_ns(m->after, r->end) : 0;
    m->info->stall_ns = stall;
    m->info->ready_ns = now > run ? now - run : now;
    __atomic_add_fetch(&l->stall_ns, stall, __ATOMIC_RELAXED);
    if (!next)
      busy = run;
    timing_event_put(h, m->before);
    timing_event_put(h, m->after);
    free(m);
  }
  if (r->meters)
    timing_event_put(h, r->end);
  if (rc < 0)
    poison(h, rc, msg);
  pthread_mutex_unlock(&h->mu);
  __atomic_add_fetch(&l->busy_ns, busy, __ATOMIC_RELAXED);
  tz_fence_signal_msg(r->out, rc, rc < 0 ? msg : NULL);
  tz_fence_release(r->out);
  tz_fence_release(r->ev);
  free(r);
  __atomic_sub_fetch(&h->outstanding, 1, __ATOMIC_ACQ_REL);
}

static void rec_part(void *arg, int rc) {
  (void)rc;
  struct rec *r = arg;
  if (__atomic_sub_fetch(&r->left, 1, __ATOMIC_ACQ_REL) == 0)
    rec_finish(r);
}

static int lane_record(tz_lane *l, tz_fence **out) {
  struct hbm_lane *h = l->ctx;
  struct rec *r = calloc(1, sizeof *r);
  tz_fence *f = tz_fence_create();
  if (!r || !f) {
    free(r);
    tz_fence_release(f);
    return tz_err_set(TZ_ENOMEM, "lane %s: no memory for a fence", l->name);
  }
  r->l = l;
  pthread_mutex_lock(&h->mu);
  int metered = h->meters != NULL;
  pthread_mutex_unlock(&h->mu);
  int rc = metered ? timing_event(l, &r->end) : 0;
  if (rc == 0 && metered) {
    cudaError_t e = cudaEventRecord(r->end, h->s);
    if (e != cudaSuccess)
      rc = cuda_err(e, "cudaEventRecord at a record", l);
  } else if (rc < 0) {
    metered = 0; /* no event was taken */
  }
  if (rc == 0)
    rc = tz_hbm_stream_record(h->st, "compute lane work", &r->ev);
  if (rc < 0) { /* the meters stay for the next record */
    if (metered && r->end) {
      pthread_mutex_lock(&h->mu);
      timing_event_put(h, r->end);
      pthread_mutex_unlock(&h->mu);
    }
    free(r);
    tz_fence_release(f);
    return rc;
  }
  /* One thread feeds the lane (core/lane.h): the meters are still those seen above. */
  pthread_mutex_lock(&h->mu);
  r->meters = h->meters;
  h->meters = NULL;
  h->meters_tail = &h->meters;
  r->inputs = h->inputs;
  r->n_inputs = h->n_inputs;
  h->inputs = NULL;
  h->n_inputs = h->cap_inputs = 0;
  r->rc = h->rc;
  snprintf(r->msg, sizeof r->msg, "%s", h->msg);
  pthread_mutex_unlock(&h->mu);
  r->out = tz_fence_retain(f);
  /* f completes with the event and only host bookkeeping after it: a stream may wait on it. */
  tz_fence_forward(f, r->ev);
  __atomic_add_fetch(&h->outstanding, 1, __ATOMIC_ACQ_REL);
  r->left = r->n_inputs + 2; /* +1 held until every callback is registered */
  if (tz_fence_then(r->ev, rec_part, r) < 0) {
    tz_fence_wait(r->ev, -1);
    rec_part(r, 0);
  }
  for (int i = 0; i < r->n_inputs; i++)
    if (tz_fence_then(r->inputs[i], rec_part, r) < 0) {
      tz_fence_wait(r->inputs[i], -1);
      rec_part(r, 0);
    }
  rec_part(r, 0);
  *out = f;
  return 0;
}

/* Both lanes are streams: `to` waits on the device for an event recorded on `from`'s stream. The
 * event is from's, reused: cudaStreamWaitEvent waits for the record made just before it. */
static int lane_order(tz_lane *from, tz_lane *to) {
  struct hbm_lane *h = from->ctx, *t = to->ctx;
  if (!h->order_ev)
    TZ_CHECK(lane_event(from, cudaEventDisableTiming, &h->order_ev));
  cudaError_t e = cudaEventRecord(h->order_ev, h->s);
  if (e == cudaSuccess)
    e = cudaStreamWaitEvent(t->s, h->order_ev, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tz_err_set(TZ_ECUDA, "lane %s: ordering lane %s after it: %s", from->name, to->name,
                      cudaGetErrorString(e));
  }
  return 0;
}

/* Timing marks: n timing events on the lane's stream. */
struct marks {
  int n;
  cudaEvent_t ev[];
};

static void lane_timer_destroy(tz_lane *l, void *ctx) {
  (void)l;
  struct marks *m = ctx;
  for (int i = 0; i < m->n; i++)
    cudaEventDestroy(m->ev[i]);
  free(m);
}

static int lane_timer_create(tz_lane *l, int n, void **ctx) {
  struct marks *m = calloc(1, sizeof *m + sizeof m->ev[0] * (size_t)n);
  if (!m)
    return tz_err_set(TZ_ENOMEM, "lane %s: no memory for %d timing marks", l->name, n);
  for (; m->n < n; m->n++) {
    int rc = lane_event(l, cudaEventDefault, &m->ev[m->n]);
    if (rc < 0) {
      lane_timer_destroy(l, m);
      return rc;
    }
  }
  *ctx = m;
  return 0;
}

static int lane_timer_mark(tz_lane *l, void *ctx, int i) {
  struct hbm_lane *h = l->ctx;
  struct marks *m = ctx;
  cudaError_t e = cudaEventRecord(m->ev[i], h->s);
  return e == cudaSuccess ? 0 : cuda_err(e, "recording a timing mark", l);
}

static int lane_timer_elapsed(tz_lane *l, void *ctx, int i, int j, double *seconds) {
  struct marks *m = ctx;
  float ms = 0;
  cudaError_t e = cudaEventElapsedTime(&ms, m->ev[i], m->ev[j]);
  if (e != cudaSuccess)
    return cuda_err(e, "reading timing marks", l);
  *seconds = 1e-3 * (double)ms;
  return 0;
}

static void *lane_native(tz_lane *l) {
  struct hbm_lane *h = l->ctx;
  return h->s;
}

static void lane_destroy(tz_lane *l) {
  struct hbm_lane *h = l->ctx;
  if (!h)
    return;
  cudaStreamSynchronize(h->s);
  cudaGetLastError();
  /* Records whose inputs or events the progress engine has not yet seen complete. */
  while (__atomic_load_n(&h->outstanding, __ATOMIC_ACQUIRE) > 0)
    usleep(50);
  for (int i = 0; i < h->n_inputs; i++)
    tz_fence_release(h->inputs[i]);
  free(h->inputs);
  for (struct meter *m = h->meters, *next; m; m = next) {
    next = m->next;
    cudaEventDestroy(m->before);
    cudaEventDestroy(m->after);
    free(m);
  }
  for (int i = 0; i < h->n_free; i++)
    cudaEventDestroy(h->free_ev[i]);
  free(h->free_ev);
  if (h->order_ev)
    cudaEventDestroy(h->order_ev);
  tz_hbm_stream_destroy(h->st);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

static const struct tz_lane_ops hbm_lane_ops = {
    .kind = "cuda-stream",
    .wait = lane_wait,
    .submit = lane_submit,
    .record = lane_record,
    .native = lane_native,
    .order = lane_order,
    .timer_create = lane_timer_create,
    .timer_mark = lane_timer_mark,
    .timer_elapsed = lane_timer_elapsed,
    .timer_destroy = lane_timer_destroy,
    .destroy = lane_destroy,
};

static int lane_make(tz_tier *hbm, void *cuda_stream, const char *lane_name, tz_lane **out) {
  struct hbm_lane *h = calloc(1, sizeof *h);
  if (!h)
    return tz_err_set(TZ_ENOMEM, "hbm lane: no memory");
  int rc = cuda_stream ? tz_hbm_stream_adopt(hbm, cuda_stream, &h->st)
                       : tz_hbm_stream_create(hbm, &h->st);
  if (rc < 0) {
    free(h);
    return rc;
  }
  h->hbm = hbm;
  h->s = tz_hbm_stream_handle(h->st);
  h->device = tz_hbm_stream_device(h->st);
  h->meters_tail = &h->meters;
  pthread_mutex_init(&h->mu, NULL);
  char name[32];
  if (lane_name)
    snprintf(name, sizeof name, "%s", lane_name);
  else
    snprintf(name, sizeof name, "compute:%d", h->device);
  rc = tz_lane_create_ops(&hbm_lane_ops, h, name, out);
  if (rc < 0) {
    tz_hbm_stream_destroy(h->st);
    pthread_mutex_destroy(&h->mu);
    free(h);
  }
  return rc;
}

int tz_hbm_lane_create(tz_tier *hbm, tz_lane **out) { return lane_make(hbm, NULL, NULL, out); }

int tz_hbm_lane_create_on(tz_tier *hbm, void *cuda_stream, tz_lane **out) {
  if (!cuda_stream)
    return tz_err_set(TZ_EINVAL, "hbm lane: no stream given (NULL is the legacy default stream)");
  return lane_make(hbm, cuda_stream, NULL, out);
}

/* tz_lane_create_device for an hbm tier: native NULL is a stream of the lane's own here (never
 * the legacy default stream). */
static int device_lane_create(tz_tier *hbm, void *native, const char *name, tz_lane **out) {
  return lane_make(hbm, native, name, out);
}

const struct tz_lane_backend tz_lane_backend_hbm = {
    .tier = "hbm",
    .create = device_lane_create,
};
