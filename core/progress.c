#define _GNU_SOURCE
#include "core/progress.h"
#include "core/error.h"
#include "core/internal.h"
#include "core/log.h"
#include "util/mix.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MAX_POLLERS 64

struct poller {
  tz_poll_fn fn;
  void *ctx;
  int fd;
};

struct tz_progress {
  pthread_t thread;
  int wake_fd;        /* eventfd: kicks the thread out of its sleep */
  int stop;           /* atomic */
  int busy;           /* atomic: work in flight that needs polling */
  pthread_mutex_t mu; /* guards pollers, watched and their counts */
  struct poller pollers[MAX_POLLERS];
  int n_pollers;
  int gen;            /* bumped when pollers change */
  tz_fence **watched; /* polled fences, the engine holds a reference to each */
  int n_watched, cap_watched;
  int jitter_us;
  uint64_t jitter_state;
  uint64_t round; /* atomic: rounds the engine has started */
};

static void drain_fd(int fd) {
  uint64_t v;
  while (read(fd, &v, sizeof v) == (ssize_t)sizeof v)
    ;
}

/* One round over the watched fences; returns how many completed. */
static int poll_watched(tz_progress *pe) {
  pthread_mutex_lock(&pe->mu);
  int n = pe->n_watched;
  if (n == 0) {
    pthread_mutex_unlock(&pe->mu);
    return 0;
  }
  tz_fence **snap = malloc(sizeof *snap * (size_t)n);
  if (!snap) {
    pthread_mutex_unlock(&pe->mu);
    return 0;
  }
  memcpy(snap, pe->watched, sizeof *snap * (size_t)n);
  pthread_mutex_unlock(&pe->mu);
  int done = 0;
  for (int i = 0; i < n; i++) {
    if (tz_fence_poll_once(snap[i])) {
      pthread_mutex_lock(&pe->mu);
      for (int j = 0; j < pe->n_watched; j++)
        if (pe->watched[j] == snap[i]) {
          pe->watched[j] = pe->watched[--pe->n_watched];
          break;
        }
      pthread_mutex_unlock(&pe->mu);
      tz_fence_release(snap[i]);
      done++;
    } else {
      snap[i] = NULL;
    }
  }
  free(snap);
  return done;
}

static void *engine_main(void *arg) {
  tz_progress *pe = arg;
  struct pollfd pfds[MAX_POLLERS + 1];
  struct poller local[MAX_POLLERS];
  int n_local = 0, gen = -1, idle_rounds = 0;
  while (!__atomic_load_n(&pe->stop, __ATOMIC_ACQUIRE)) {
    __atomic_add_fetch(&pe->round, 1, __ATOMIC_ACQ_REL);
    int jitter = __atomic_load_n(&pe->jitter_us, __ATOMIC_ACQUIRE);
    if (jitter > 0) {
      /* The state is re-seeded by tz_progress_set_jitter from another thread. */
      uint64_t st = __atomic_load_n(&pe->jitter_state, __ATOMIC_RELAXED);
      uint64_t us = tz_mix_next(&st) % (uint64_t)(jitter + 1);
      __atomic_store_n(&pe->jitter_state, st, __ATOMIC_RELAXED);
      usleep((useconds_t)us);
    }
    pthread_mutex_lock(&pe->mu);
    if (gen != pe->gen) {
      n_local = pe->n_pollers;
      memcpy(local, pe->pollers, sizeof local[0] * (size_t)n_local);
      gen = pe->gen;
    }
    pthread_mutex_unlock(&pe->mu);
    int handled = 0;
    for (int i = 0; i < n_local; i++) {
      int r = local[i].fn(local[i].ctx);
      if (r > 0)
        handled += r;
      else if (r < 0)
        TZ_DEBUG("progress: poller failed: %s", tz_err_msg());
    }
    handled += poll_watched(pe);
    if (handled) {
      idle_rounds = 0;
      continue;
    }
    int spinning = __atomic_load_n(&pe->busy, __ATOMIC_ACQUIRE) > 0;
    pthread_mutex_lock(&pe->mu);
    spinning |= pe->n_watched > 0;
    pthread_mutex_unlock(&pe->mu);
    /* Sleep until an fd says there is work; while something needs polling, for a short time
     * that backs off from 2 us to 200 us, so a CUDA event is seen soon after it completes. */
    int nfd = 0;
    pfds[nfd++] = (struct pollfd){.fd = pe->wake_fd, .events = POLLIN};
    for (int i = 0; i < n_local; i++)
      if (local[i].fd >= 0)
        pfds[nfd++] = (struct pollfd){.fd = local[i].fd, .events = POLLIN};
    struct timespec ts = {0, 0}, *tsp = NULL;
    if (spinning) {
      long us = idle_rounds < 8 ? 2 : idle_rounds < 64 ? 20 : 200;
      ts.tv_nsec = us * 1000;
      tsp = &ts;
      idle_rounds++;
    }
    int r = ppoll(pfds, (nfds_t)nfd, tsp, NULL);
    if (r > 0)
      for (int i = 0; i < nfd; i++)
        if (pfds[i].revents & POLLIN)
          drain_fd(pfds[i].fd);
  }
  return NULL;
}

int tz_progress_create(tz_progress **out) {
  tz_progress *pe = calloc(1, sizeof *pe);
  if (!pe)
    return tz_err_set(TZ_ENOMEM, "progress: no memory");
  pe->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (pe->wake_fd < 0) {
    int e = errno;
    free(pe);
    return tz_err_errno(e, "progress: eventfd");
  }
  pthread_mutex_init(&pe->mu, NULL);
  int e = pthread_create(&pe->thread, NULL, engine_main, pe);
  if (e) {
    close(pe->wake_fd);
    pthread_mutex_destroy(&pe->mu);
    free(pe);
    return tz_err_errno(e, "progress: pthread_create");
  }
  pthread_setname_np(pe->thread, "tz-progress");
  *out = pe;
  return 0;
}

void tz_progress_kick(tz_progress *pe) {
  uint64_t one = 1;
  ssize_t r = write(pe->wake_fd, &one, sizeof one);
  (void)r; /* a full counter already wakes the thread */
}

void tz_progress_destroy(tz_progress *pe) {
  if (!pe)
    return;
  __atomic_store_n(&pe->stop, 1, __ATOMIC_RELEASE);
  tz_progress_kick(pe);
  pthread_join(pe->thread, NULL);
  /* Fences still watched can no longer complete by polling: fail them, so no waiter hangs. */
  for (int i = 0; i < pe->n_watched; i++) {
    tz_fence_signal_msg(pe->watched[i], TZ_ECANCELED, "progress: engine stopped");
    tz_fence_release(pe->watched[i]);
  }
  free(pe->watched);
  close(pe->wake_fd);
  pthread_mutex_destroy(&pe->mu);
  free(pe);
}

int tz_progress_add(tz_progress *pe, tz_poll_fn fn, void *ctx, int wake_fd) {
  pthread_mutex_lock(&pe->mu);
  if (pe->n_pollers == MAX_POLLERS) {
    pthread_mutex_unlock(&pe->mu);
    return tz_err_set(TZ_ENOMEM, "progress: more than %d pollers", MAX_POLLERS);
  }
  pe->pollers[pe->n_pollers++] = (struct poller){fn, ctx, wake_fd};
  pe->gen++;
  pthread_mutex_unlock(&pe->mu);
  tz_progress_kick(pe);
  return 0;
}

void tz_progress_remove(tz_progress *pe, tz_poll_fn fn, void *ctx) {
  pthread_mutex_lock(&pe->mu);
  for (int i = 0; i < pe->n_pollers; i++)
    if (pe->pollers[i].fn == fn && pe->pollers[i].ctx == ctx) {
      memmove(&pe->pollers[i], &pe->pollers[i + 1],
              sizeof pe->pollers[0] * (size_t)(pe->n_pollers - i - 1));
      pe->n_pollers--;
      pe->gen++;
      break;
    }
  pthread_mutex_unlock(&pe->mu);
  /* The engine may be inside fn right now with its private copy. Once it has started two more
   * rounds it has refreshed that copy and left any call it was in. */
  if (pthread_equal(pthread_self(), pe->thread))
    return;
  uint64_t target = __atomic_load_n(&pe->round, __ATOMIC_ACQUIRE) + 2;
  while (__atomic_load_n(&pe->round, __ATOMIC_ACQUIRE) < target &&
         !__atomic_load_n(&pe->stop, __ATOMIC_ACQUIRE)) {
    tz_progress_kick(pe);
    usleep(20);
  }
}

void tz_progress_busy(tz_progress *pe, int delta) {
  if (__atomic_add_fetch(&pe->busy, delta, __ATOMIC_ACQ_REL) == delta && delta > 0)
    tz_progress_kick(pe);
}

int tz_progress_watch(tz_progress *pe, tz_fence *f) {
  pthread_mutex_lock(&pe->mu);
  if (pe->n_watched == pe->cap_watched) {
    int cap = pe->cap_watched ? pe->cap_watched * 2 : 64;
    tz_fence **w = realloc(pe->watched, sizeof *w * (size_t)cap);
    if (!w) {
      pthread_mutex_unlock(&pe->mu);
      return tz_err_set(TZ_ENOMEM, "progress: no memory to watch a fence");
    }
    pe->watched = w;
    pe->cap_watched = cap;
  }
  pe->watched[pe->n_watched++] = f;
  pthread_mutex_unlock(&pe->mu);
  tz_progress_kick(pe);
  return 0;
}

void tz_progress_set_jitter(tz_progress *pe, int max_us, uint64_t seed) {
  __atomic_store_n(&pe->jitter_state, seed, __ATOMIC_RELAXED);
  __atomic_store_n(&pe->jitter_us, max_us, __ATOMIC_RELEASE);
}
