/* The scheduler's life: creation, blocks, the declared phases' tables and the budget, and freeing
 * it all; the client's calls that start and end it (tz_sched_declare, tz_sched_destroy) are
 * sched_phase.c's, above the window and the pump that this file never calls. The rules it keeps
 * are in sched_internal.h and docs/scheduler.md. */
#define _GNU_SOURCE
#include "core/sched_internal.h"
#include "core/config.h"

#include <stdlib.h>
#include <string.h>

/* ---- creation ---- */

void tz_sched_params_init(struct tz_sched_params *p) {
  memset(p, 0, sizeof *p);
  p->lookahead = 2;
  p->trace_step = -1;
  p->timeout_ms = 60000;
  p->seed = 1;
  p->wait_for_write_back = 1;
  p->carry = 1;
}

/* tierzero.sched_debug from the environment (TZ_SCHED_DEBUG), for a caller without a config; the
 * trainer passes the config's value in the params. */
static int debug_from_env(void) {
  struct tz_config c;
  tz_config_defaults(&c);
  int rc = tz_config_env_key(&c, "tierzero.sched_debug");
  if (rc < 0)
    TZ_WARN("sched: %s; decisions are not printed", tz_err_msg());
  int on = rc > 0 && c.tierzero.sched_debug;
  tz_config_free(&c);
  return on;
}

int tz_sched_create(tz_runtime *rt, const struct tz_sched_params *p, tz_sched **out) {
  if (!rt || !p || !p->compute)
    return tz_err_set(TZ_EINVAL, "sched: a runtime and a compute tier are required");
  if (p->lookahead < 0)
    return tz_err_set(TZ_EINVAL, "sched: lookahead %d is negative", p->lookahead);
  tz_sched *s = calloc(1, sizeof *s);
  if (!s)
    return tz_err_set(TZ_ENOMEM, "sched: no memory");
  s->rt = rt;
  s->p = *p;
  s->compute = p->compute;
  s->t0 = tz_now_ns();
  s->chunk = tz_runtime_chunk_bytes(rt);
  s->stage_all = p->stage_homes;
  s->debug = p->debug || debug_from_env();
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  int rc = 0;
  if (p->trace_path && !(s->trace_path = strdup(p->trace_path)))
    rc = tz_err_set(TZ_ENOMEM, "sched: no memory");
  s->p.trace_path = NULL;
  s->home_lane = p->home_lane;
  if (rc == 0 && p->lane) {
    s->lane = p->lane;
  } else if (rc == 0) {
    rc = tz_lane_create_cpu("compute", &s->lane);
    s->own_lane = rc == 0;
  }
  if (rc < 0) {
    free(s->trace_path);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return rc;
  }
  if (rc == 0 && (rc = tz_progress_add(tz_runtime_progress(rt), tz_sched_poll, s, -1)) == 0)
    s->polling = 1;
  if (rc < 0) {
    if (s->own_lane)
      tz_lane_destroy(s->lane);
    free(s->trace_path);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return rc;
  }
  if (p->jitter_us > 0) {
    tz_progress_set_jitter(tz_runtime_progress(rt), p->jitter_us, p->seed);
    tz_tier_set_copy_jitter(rt, p->jitter_us, p->seed + 1);
    tz_lane_set_jitter(s->lane, p->jitter_us, p->seed + 2);
  }
  s->trace_on = p->trace_step == 0 || p->trace_step == 1;
  dbg(s, "created: compute tier %s, lookahead %d, %s order, jitter %d us", tz_tier_name(s->compute),
      p->lookahead, p->record ? "recorded" : "declared", p->jitter_us);
  *out = s;
  return 0;
}

static int block_add(tz_sched *s, const char *name, uint64_t bytes, const tz_extent *home,
                     int *id) {
  if (s->declared)
    return tz_err_set(TZ_EINVAL, "sched: block '%s' added after the phases were declared", name);
  if (!home || !home->tier || bytes == 0)
    return tz_err_set(TZ_EINVAL, "sched: block '%s' needs a home extent and a size", name);
  /* A device lane waits only on device events, so a fill's last hop must be a copy to the
   * device (from host or device memory). A home in neither (nvme) would go through the runtime's
   * staged path, whose transfer fence is host work: such blocks go through staging chunks of the
   * scheduler's own instead, nvme -> pinned chunk -> device, the last hop a copy with an event. */
  int staged = (tz_lane_native(s->lane) || s->stage_all) &&
               !tz_tier_host_ptr(home->tier, home->offset) &&
               !tz_tier_device_ptr(home->tier, home->offset);
  uint64_t xfer = round_up(bytes, tz_tier_alignment(home->tier));
  if (xfer > home->bytes)
    return tz_err_set(TZ_EINVAL,
                      "sched: block '%s' of %llu bytes (%llu rounded to %s's alignment) "
                      "does not fit its home extent of %llu bytes",
                      name, (unsigned long long)bytes, (unsigned long long)xfer,
                      tz_tier_name(home->tier), (unsigned long long)home->bytes);
  if (s->n_blocks == s->cap_blocks) {
    int cap = s->cap_blocks ? 2 * s->cap_blocks : 64;
    struct block *n = realloc(s->blocks, sizeof *n * (size_t)cap);
    if (!n)
      return tz_err_set(TZ_ENOMEM, "sched: no memory for block '%s'", name);
    s->blocks = n;
    s->cap_blocks = cap;
  }
  struct block *b = &s->blocks[s->n_blocks];
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "%s", name);
  b->bytes = bytes;
  b->xfer = xfer;
  b->home = *home;
  b->gen = b->home_gen = 1;
  b->in_place = home->tier == s->compute;
  b->staged = staged && !b->in_place;
  *id = s->n_blocks++;
  return 0;
}

int tz_sched_block_add(tz_sched *s, const char *name, uint64_t bytes, const tz_extent *home,
                       int *id) {
  pthread_mutex_lock(&s->mu);
  int rc = block_add(s, name, bytes, home, id);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int check_phases(tz_sched *s, const struct tz_phase_decl *phases, int n,
                        const int *at_home) {
  if (n < 1 || !phases)
    return tz_err_set(TZ_EINVAL, "sched: no phases declared");
  for (int i = 0; i < n; i++) {
    const struct tz_phase_decl *d = &phases[i];
    const char *name = d->name ? d->name : "(unnamed)";
    if (d->n_uses < 0 || d->n_uses > TZ_SCHED_MAX_USES || (d->n_uses && !d->uses))
      return tz_err_set(TZ_EINVAL, "sched: phase '%s' uses %d blocks (0..%d)", name, d->n_uses,
                        TZ_SCHED_MAX_USES);
    for (int k = 0; k < d->n_uses; k++) {
      const struct tz_block_use *u = &d->uses[k];
      if (u->block < 0 || u->block >= s->n_blocks)
        return tz_err_set(TZ_EINVAL, "sched: phase '%s' uses block %d; there are %d", name,
                          u->block, s->n_blocks);
      if (u->access < TZ_ACCESS_READ || u->access > TZ_ACCESS_READWRITE)
        return tz_err_set(TZ_EINVAL, "sched: phase '%s': block '%s' has access %d", name,
                          s->blocks[u->block].name, u->access);
      for (int j = 0; j < k; j++)
        if (d->uses[j].block == u->block)
          return tz_err_set(TZ_EINVAL, "sched: phase '%s' lists block '%s' twice", name,
                            s->blocks[u->block].name);
      /* A home phase runs on the host at the homes: each must be host memory. */
      const struct block *b = &s->blocks[u->block];
      if (at_home && at_home[i] && !tz_tier_host_ptr(b->home.tier, b->home.offset))
        return tz_err_set(TZ_EINVAL,
                          "sched: home phase '%s' uses block '%s', whose home in %s "
                          "is not host memory (a home phase runs at its blocks' homes)",
                          name, b->name, tz_tier_name(b->home.tier));
    }
  }
  return 0;
}

/* Bytes of the copies a phase needs at once: blocks used in place take none. */
static uint64_t phase_ws(tz_sched *s, const struct tz_phase_decl *d, int home, uint64_t align) {
  uint64_t ws = 0;
  if (home) /* at the homes: no copies */
    return 0;
  for (int k = 0; k < d->n_uses; k++) {
    const struct block *b = &s->blocks[d->uses[k].block];
    ws += b->in_place ? 0 : round_up(b->xfer, align);
  }
  return ws;
}

#define HOME(at_home, i) ((at_home) && (at_home)[i])

static int min_budget(tz_sched *s, const struct tz_phase_decl *phases, int n, const int *at_home,
                      uint64_t *bytes) {
  TZ_CHECK(check_phases(s, phases, n, at_home));
  uint64_t align = tz_tier_alignment(s->compute), max = 0;
  for (int i = 0; i < n; i++) {
    uint64_t ws = phase_ws(s, &phases[i], HOME(at_home, i), align);
    if (ws > max)
      max = ws;
  }
  *bytes = max + round_up(s->chunk, align);
  return 0;
}

int tz_sched_min_budget(tz_sched *s, const struct tz_phase_decl *phases, int n, uint64_t *bytes) {
  pthread_mutex_lock(&s->mu);
  int rc = min_budget(s, phases, n, NULL, bytes);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* Positions in the order where each block is used, for the eviction order. */
int tz_sched_index_order(tz_sched *s) {
  for (int i = 0; i < s->n_blocks; i++) {
    free(s->blocks[i].pos);
    s->blocks[i].pos = NULL;
    s->blocks[i].n_pos = 0;
  }
  for (int p = 0; p < s->order_n; p++) {
    const struct phase *ph = &s->phases[s->order[p]];
    for (int k = 0; k < ph->n_uses; k++) {
      struct block *b = &s->blocks[ph->uses[k].block];
      int *n = realloc(b->pos, sizeof *n * (size_t)(b->n_pos + 1));
      if (!n)
        return tz_err_set(TZ_ENOMEM, "sched: no memory");
      b->pos = n;
      b->pos[b->n_pos++] = p;
    }
  }
  return 0;
}

/* The budget: the params', or the compute tier's largest free range; whole alignment units. */
static uint64_t declare_budget(tz_sched *s) {
  uint64_t budget = s->p.budget;
  if (!budget) {
    struct tz_arena_stats st;
    tz_tier_arena_stats(s->compute, &st);
    budget = st.largest_free;
  }
  return budget / s->align * s->align;
}

/* params.stage_chunks staging chunks per transfer lane of staged blocks (home -> compute and back,
 * per home tier), in pinned host memory outside the compute budget; at most 32 in all (the busy
 * mask's bits). */
static int staging_chunks(tz_sched *s) {
  int per_lane = s->p.stage_chunks > 0 ? s->p.stage_chunks : 1;
  int n_chunks = 0;
  uint64_t lanes_seen = 0;
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    if (!b->staged || b->in_place)
      continue;
    int in = tz_sched_xlane_get(s, b->home.tier, s->compute),
        out = tz_sched_xlane_get(s, s->compute, b->home.tier);
    for (int l = 0; l < 2; l++) {
      int k = l ? out : in;
      if (k >= 0 && k < 64 && !(lanes_seen & (1ull << k))) {
        lanes_seen |= 1ull << k;
        n_chunks += per_lane;
      }
    }
  }
  return n_chunks > 32 ? 32 : n_chunks;
}

/* A budget below the minimum: the message names the phase that needs the most. */
static int budget_short(tz_sched *s, const struct tz_phase_decl *phases, int n, const int *at_home,
                        uint64_t budget, uint64_t min, const char *staging) {
  int worst = 0;
  for (int i = 0; i < n; i++)
    if (phase_ws(s, &phases[i], HOME(at_home, i), s->align) >
        phase_ws(s, &phases[worst], HOME(at_home, worst), s->align))
      worst = i;
  return tz_err_set(TZ_ENOMEM,
                    "sched: the budget of %llu bytes in %s is %llu bytes short of the "
                    "minimum %llu: phase '%s' needs %llu bytes of blocks at once, plus %llu for "
                    "one chunk per lane (1 compute lane)%s",
                    (unsigned long long)budget, tz_tier_name(s->compute),
                    (unsigned long long)(min - budget), (unsigned long long)min,
                    phases[worst].name ? phases[worst].name : "?",
                    (unsigned long long)phase_ws(s, &phases[worst], HOME(at_home, worst), s->align),
                    (unsigned long long)round_up(s->chunk, s->align), staging);
}

/* The home lane, made when a home phase is declared and params gave none. */
static int home_lane_make(tz_sched *s, int n, const int *at_home) {
  int any_home = 0;
  for (int i = 0; i < n; i++)
    any_home |= HOME(at_home, i);
  if (any_home && !s->home_lane) {
    TZ_CHECK(tz_lane_create_cpu("home", &s->home_lane));
    s->own_home_lane = 1;
    if (s->p.jitter_us > 0)
      tz_lane_set_jitter(s->home_lane, s->p.jitter_us, s->p.seed + 3);
  }
  return 0;
}

/* A staging chunk's size: params.stage_chunk_bytes, else the runtime's chunk, rounded up to the
 * compute tier's alignment. */
static uint64_t stage_chunk_bytes(const tz_sched *s) {
  uint64_t c = s->p.stage_chunk_bytes ? s->p.stage_chunk_bytes : s->chunk;
  return round_up(c, s->align);
}

/* The staging chunks' pinned host tier, carved first (DESIGN.md), before the budget. */
static int stage_reserve(tz_sched *s, int n_chunks) {
  struct tz_tier_params tp;
  tz_tier_params_init(&tp);
  tp.name = "sched-staging";
  uint64_t chunk = stage_chunk_bytes(s);
  tp.capacity = (uint64_t)n_chunks * chunk;
  int rc = tz_runtime_host_tier(s->rt, &tp, &s->stage_tier);
  if (rc == 0 && (rc = tz_tier_alloc(s->stage_tier, tp.capacity, &s->stage_ext)) < 0) {
    tz_tier_destroy(s->stage_tier);
    s->stage_tier = NULL;
  }
  if (rc < 0)
    return tz_err_set(rc,
                      "sched: %d staging chunks of %llu bytes in pinned host memory could "
                      "not be reserved: %s",
                      n_chunks, (unsigned long long)chunk, tz_err_msg());
  s->n_chunks = n_chunks;
  s->stage_chunk = chunk;
  return 0;
}

/* The budget's region of the compute tier, its arena (the scratch chunk first) and the tables of
 * phases and of the order. On failure nothing is left, the staging reserved before included. */
static int declare_alloc(tz_sched *s, int n, uint64_t budget) {
  int rc_region = tz_tier_alloc(s->compute, budget, &s->region);
  if (rc_region < 0) {
    tz_tier_free(&s->stage_ext);
    tz_tier_destroy(s->stage_tier);
    s->stage_tier = NULL;
    s->n_chunks = 0;
    return rc_region;
  }
  s->phases = calloc((size_t)n, sizeof *s->phases);
  s->order = malloc(sizeof *s->order * (size_t)n);
  s->order_cap = n;
  s->cur_cap = 2 * n;
  s->cur = malloc(sizeof *s->cur * (size_t)s->cur_cap);
  int rc =
      s->phases && s->order && s->cur ? tz_arena_create(budget, s->align, &s->arena) : TZ_ENOMEM;
  if (rc == 0)
    rc = tz_arena_alloc(s->arena, round_up(s->chunk, s->align), &s->scratch_off);
  if (rc < 0) {
    tz_tier_free(&s->region);
    tz_tier_free(&s->stage_ext);
    tz_tier_destroy(s->stage_tier);
    s->stage_tier = NULL;
    s->n_chunks = 0;
    tz_arena_destroy(s->arena);
    free(s->phases);
    free(s->order);
    free(s->cur);
    s->arena = NULL;
    s->phases = NULL;
    s->order = s->cur = NULL;
    return tz_err_set(TZ_ENOMEM, "sched: no memory for %d phases", n);
  }
  return 0;
}

/* The phases copied in; each block's copy size and transfer lanes. */
static void declare_tables(tz_sched *s, const struct tz_phase_decl *phases, int n,
                           const int *at_home) {
  for (int i = 0; i < n; i++) {
    struct phase *ph = &s->phases[i];
    snprintf(ph->name, sizeof ph->name, "%s", phases[i].name ? phases[i].name : "");
    if (!ph->name[0])
      snprintf(ph->name, sizeof ph->name, "phase%d", i);
    ph->n_uses = phases[i].n_uses;
    if (ph->n_uses)
      memcpy(ph->uses, phases[i].uses, sizeof ph->uses[0] * (size_t)ph->n_uses);
    ph->ws = phase_ws(s, &phases[i], HOME(at_home, i), s->align);
    ph->at_home = HOME(at_home, i);
  }
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    b->size = round_up(b->xfer, s->align);
    /* No transfer lane for a block in place: nothing moves, and the lane stats list only pairs
     * bytes are moved over. */
    b->xl_in = b->in_place ? -1 : tz_sched_xlane_get(s, b->home.tier, s->compute);
    b->xl_out = b->in_place ? -1 : tz_sched_xlane_get(s, s->compute, b->home.tier);
  }
}

int tz_sched_declare_tables(tz_sched *s, const struct tz_phase_decl *phases, int n,
                            const int *at_home) {
  if (s->declared)
    return tz_err_set(TZ_EINVAL, "sched: phases are declared once");
  uint64_t min;
  TZ_CHECK(min_budget(s, phases, n, at_home, &min));
  s->align = tz_tier_alignment(s->compute);
  uint64_t budget = declare_budget(s);
  int n_chunks = staging_chunks(s);
  char staging[160] = "";
  if (n_chunks)
    snprintf(staging, sizeof staging,
             "; besides, %d staging chunks of %llu bytes in pinned host "
             "memory for the blocks homed in neither host nor device memory",
             n_chunks, (unsigned long long)stage_chunk_bytes(s));
  if (budget < min)
    return budget_short(s, phases, n, at_home, budget, min, staging);
  TZ_CHECK(home_lane_make(s, n, at_home));
  if (n_chunks)
    TZ_CHECK(stage_reserve(s, n_chunks));
  TZ_CHECK(declare_alloc(s, n, budget));
  declare_tables(s, phases, n, at_home);
  s->n_phases = n;
  s->budget = budget;
  s->min_budget = min;
  s->used = round_up(s->chunk, s->align);
  s->peak = s->used;
  if (s->p.record) {
    s->recording = 1;
  } else {
    for (int i = 0; i < n; i++)
      s->order[i] = i;
    s->order_n = n;
    TZ_CHECK(tz_sched_index_order(s));
  }
  s->declared = 1;
  s->st.staging = (uint64_t)s->n_chunks * s->stage_chunk;
  dbg(s, "declared %d phases over %d blocks: budget %llu bytes in %s, minimum %llu%s", n,
      s->n_blocks, (unsigned long long)budget, tz_tier_name(s->compute), (unsigned long long)min,
      staging);
  return 0;
}

/* ---- destruction ---- */

void tz_sched_free(tz_sched *s) {
  for (int i = 0; i < s->n_blocks; i++) {
    struct copy *c = &s->blocks[i].c;
    tz_fence_release(c->ready);
    tz_fence_release(c->flushed);
    tz_fence_release(c->writer);
    tz_fence_release(s->blocks[i].cuse);
    free(s->blocks[i].pos);
  }
  if (s->own_lane)
    tz_lane_destroy(s->lane);
  if (s->own_home_lane)
    tz_lane_destroy(s->home_lane);
  tz_arena_destroy(s->arena);
  tz_tier_free(&s->region);
  tz_tier_free(&s->stage_ext);
  tz_tier_destroy(s->stage_tier);
  dbg(s, "destroyed");
  free(s->blocks);
  free(s->phases);
  free(s->order);
  free(s->cur);
  free(s->acts);
  free(s->hw);
  free(s->spans);
  free(s->trace_path);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}
