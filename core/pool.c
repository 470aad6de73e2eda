#define _GNU_SOURCE
#include "core/pool.h"
#include "core/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct job {
  int (*fn)(void *arg);
  void *arg;
  tz_fence *done;
  struct job *next;
};

struct tz_pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct job *head, **tail;
  int stop, n_threads;
  int jitter_us;
  uint64_t jitter_state;
  pthread_t threads[];
};

static void *worker(void *arg) {
  tz_pool *p = arg;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->head && !p->stop)
      pthread_cond_wait(&p->cv, &p->mu);
    struct job *j = p->head;
    if (!j) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    p->head = j->next;
    if (!p->head)
      p->tail = &p->head;
    uint64_t delay = 0;
    if (p->jitter_us > 0) {
      uint64_t z = (p->jitter_state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
      delay = (z ^ (z >> 29)) % (uint64_t)(p->jitter_us + 1);
    }
    pthread_mutex_unlock(&p->mu);
    if (delay)
      usleep((useconds_t)delay);
    tz_err_clear();
    int rc = j->fn(j->arg);
    if (j->done) {
      tz_fence_signal(j->done, rc < 0 ? rc : 0);
      tz_fence_release(j->done);
    }
    free(j);
  }
}

int tz_pool_create(int threads, const char *name, tz_pool **out) {
  if (threads < 1)
    threads = 1;
  tz_pool *p = calloc(1, sizeof *p + sizeof(pthread_t) * (size_t)threads);
  if (!p)
    return tz_err_set(TZ_ENOMEM, "pool %s: no memory", name);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->tail = &p->head;
  for (int i = 0; i < threads; i++) {
    int e = pthread_create(&p->threads[i], NULL, worker, p);
    if (e) {
      p->n_threads = i;
      tz_pool_destroy(p);
      return tz_err_errno(e, "pool %s: pthread_create", name);
    }
    char tn[16];
    snprintf(tn, sizeof tn, "tz-%.8s-%d", name, i % 100);
    pthread_setname_np(p->threads[i], tn);
    p->n_threads = i + 1;
  }
  *out = p;
  return 0;
}

void tz_pool_destroy(tz_pool *p) {
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->n_threads; i++)
    pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}

int tz_pool_submit(tz_pool *p, int (*fn)(void *arg), void *arg, tz_fence **done) {
  struct job *j = malloc(sizeof *j);
  tz_fence *f = done ? tz_fence_create() : NULL;
  if (!j || (done && !f)) {
    free(j);
    tz_fence_release(f);
    return tz_err_set(TZ_ENOMEM, "pool: no memory for a job");
  }
  *j = (struct job){fn, arg, f ? tz_fence_retain(f) : NULL, NULL};
  pthread_mutex_lock(&p->mu);
  *p->tail = j;
  p->tail = &j->next;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (done)
    *done = f;
  return 0;
}

void tz_pool_set_jitter(tz_pool *p, int max_us, uint64_t seed) {
  pthread_mutex_lock(&p->mu);
  p->jitter_us = max_us;
  p->jitter_state = seed;
  pthread_mutex_unlock(&p->mu);
}
