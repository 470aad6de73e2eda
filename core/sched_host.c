/* Host access to blocks: load a block's latest bytes, store new ones at its home. */
#define _GNU_SOURCE
#include "core/sched_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- host access to blocks ---- */

static int block_quiet(tz_sched *s, void *arg) {
  (void)s;
  const struct block *b = arg;
  return b->running == 0 && !b->c.filling && !b->c.flushing;
}

static void *bounce_alloc(tz_sched *s, const struct block *b) {
  uint64_t a = tz_tier_alignment(b->home.tier);
  if (a < s->align)
    a = s->align;
  void *p = NULL;
  return posix_memalign(&p, a, b->xfer) == 0 ? p : NULL;
}

int tz_sched_block_load_bytes(tz_sched *s, int id, void *dst, uint64_t len) {
  pthread_mutex_lock(&s->mu);
  int rc = s->err                        ? err_return(s)
           : id < 0 || id >= s->n_blocks ? tz_err_set(TZ_EINVAL, "sched: no block %d", id)
                                         : 0;
  if (rc < 0) {
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  struct block *b = &s->blocks[id];
  if (tz_sched_wait_until(s, block_quiet, b, "a block to load", 1) < 0) {
    rc = err_return(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  /* The copy when there is a current one (pinned while read), else the home, which then holds
   * the latest generation. */
  tz_extent from = b->home;
  int from_copy = b->c.ext.tier && b->c.gen == b->gen && !b->c.unwritten;
  if (from_copy) {
    from = b->c.ext;
    b->c.pins++;
  }
  pthread_mutex_unlock(&s->mu);
  void *buf = bounce_alloc(s, b);
  rc = buf ? tz_tier_read_sync(&from, 0, buf, b->xfer)
           : tz_err_set(TZ_ENOMEM, "sched: no memory to load '%s'", b->name);
  if (rc == 0)
    memcpy(dst, buf, len < b->bytes ? len : b->bytes);
  free(buf);
  pthread_mutex_lock(&s->mu);
  if (from_copy)
    b->c.pins--;
  pthread_mutex_unlock(&s->mu);
  tz_sched_pump(s);
  return rc;
}

int tz_sched_home_begin(tz_sched *s, int id, tz_extent *home) {
  pthread_mutex_lock(&s->mu);
  int rc = s->err                        ? err_return(s)
           : id < 0 || id >= s->n_blocks ? tz_err_set(TZ_EINVAL, "sched: no block %d", id)
                                         : 0;
  if (rc == 0 && s->open)
    rc = tz_err_set(TZ_EINVAL, "sched: store while phase '%s' is open",
                    s->phases[s->open->phase].name);
  struct block *b = rc == 0 ? &s->blocks[id] : NULL;
  if (rc == 0 && tz_sched_wait_until(s, block_quiet, b, "a block to store", 1) < 0)
    rc = err_return(s);
  if (rc == 0 && b->storing)
    rc = tz_err_set(TZ_EINVAL, "sched: '%s' is already being written at its home", b->name);
  if (rc == 0 && !b->in_place && b->c.ext.tier && b->c.gen > b->home_gen)
    rc = tz_err_set(TZ_EINVAL,
                    "sched: the home of '%s' is older than its copy (generation %llu "
                    "of %llu): sync first",
                    b->name, (unsigned long long)b->home_gen, (unsigned long long)b->c.gen);
  if (rc == 0) {
    b->storing = 1; /* no fill reads the home, no copy goes, while it is written */
    *home = b->home;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int tz_sched_home_end(tz_sched *s, int id, int rc) {
  pthread_mutex_lock(&s->mu);
  if (id < 0 || id >= s->n_blocks || !s->blocks[id].storing) {
    pthread_mutex_unlock(&s->mu);
    return tz_err_set(TZ_EINVAL, "sched: block %d is not being written at its home", id);
  }
  struct block *b = &s->blocks[id];
  b->storing = 0;
  if (rc < 0) {
    fail_locked(s, rc, "sched: storing block '%s' in %s failed: %s", b->name,
                tz_tier_name(b->home.tier), tz_err_msg());
    rc = err_return(s);
  } else {
    b->gen++;
    b->home_gen = b->gen;
    dbg(s, "store '%s': generation %llu in %s", b->name, (unsigned long long)b->gen,
        tz_tier_name(b->home.tier));
    /* A copy made before is stale. Unused, it goes; pinned by phases the window has reserved,
     * it is brought in again now, before any of them can enter. */
    if (b->c.ext.tier && b->c.pins == 0) {
      tz_sched_copy_free(s, b, "stale");
    } else if (b->c.ext.tier) {
      b->c.gen = b->gen;
      b->c.unwritten = 0;
      tz_sched_start_xfer(s, b, ACT_FILL, 1, s->step);
    }
  }
  pthread_mutex_unlock(&s->mu);
  tz_sched_pump(s);
  return rc;
}

int tz_sched_block_load(tz_sched *s, int id, void *dst) {
  return tz_sched_block_load_bytes(s, id, dst, UINT64_MAX);
}

int tz_sched_block_fill(tz_sched *s, int id, void (*fill)(void *dst, uint64_t bytes, void *arg),
                        void *arg) {
  tz_extent home;
  TZ_CHECK(tz_sched_home_begin(s, id, &home));
  const struct block *b = &s->blocks[id];
  void *buf = bounce_alloc(s, b);
  int rc;
  if (buf) {
    fill(buf, b->bytes, arg);
    memset((char *)buf + b->bytes, 0, b->xfer - b->bytes);
    rc = tz_tier_write_sync(&home, 0, buf, b->xfer);
  } else {
    rc = tz_err_set(TZ_ENOMEM, "sched: no memory to store '%s'", b->name);
  }
  free(buf);
  return tz_sched_home_end(s, id, rc);
}

static void fill_copy(void *dst, uint64_t bytes, void *src) { memcpy(dst, src, bytes); }

int tz_sched_block_store(tz_sched *s, int id, const void *src) {
  return tz_sched_block_fill(s, id, fill_copy, (void *)src);
}
