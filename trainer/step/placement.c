/* Sizes and the plan: what each block and buffer takes, where the plan puts each block's state,
 * and which blocks the CPU steps at their homes. */
#define _GNU_SOURCE
#include "trainer/step/train_internal.h"
#include "core/error.h"
#include "core/log.h"
#include "trainer/step/machine.h"
#include "trainer/step/recompute.h"
#include "util/size.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* ---- sizes and the plan ---- */

/* The seconds of some parts' forwards (TZ_PART_*; with TZ_PART_ATTN_OUT the attention part's
 * without its op) in the probe's part_s. */
static double parts_s(const double part_s[3], unsigned parts) {
  double attn = parts & TZ_PART_ATTN_OUT ? part_s[2] : part_s[0];
  return (parts & TZ_PART_ATTN ? attn : 0) + (parts & TZ_PART_MLP ? part_s[1] : 0);
}

double tz_train_timed_flop(double layer_flop, double layer_s, const double part_s[3], int bwd,
                           unsigned parts, unsigned recompute) {
  double t = part_s[0] + part_s[1];
  if (!(t > 0 && layer_s > 2 * t))
    return -1;
  double s = parts_s(part_s, parts & TZ_PARTS_ALL);
  if (bwd)
    s = (layer_s - 2 * t) * s / t + parts_s(part_s, recompute);
  return 4.0 * layer_flop * s / layer_s;
}

/* FLOP of one phase for one micro-batch; backward includes the parts of the forward it
 * recomputes (tr->recompute). A layer's phases at their timed shares where the layer was timed
 * (tz_train_timed_flop), else at their FLOPs: a forward its parts', a backward twice that and
 * what it recomputes. */
static double phase_flop(const tz_trainer *tr, const struct phase *p) {
  const struct tz_model_config *c = &tr->mc;
  double N = tr->N, C = c->d_model, V = c->vocab;
  unsigned parts = (unsigned)tz_model_block_parts(c, p->block);
  int l = tz_model_block_layer(c, p->block);
  if (p->kind == PH_HEAD)
    return 3.0 * 2.0 * N * C * V;
  if (l < 0 || (p->kind != PH_FWD && p->kind != PH_BWD))
    return 0;
  unsigned rec = tz_model_parts_recomputed(tr->recompute[l], parts);
  double timed = tz_train_timed_flop(tz_model_layer_flop(c, tr->B, tr->T), tr->layer_s, tr->part_s,
                                     p->kind == PH_BWD, parts, rec);
  if (timed >= 0)
    return timed;
  /* a layer's block: its parts' share (the whole layer but with experts) */
  double layer = tz_model_layer_part_flop(c, tr->B, tr->T, parts);
  return p->kind == PH_FWD ? layer : 2.0 * layer + tz_train_recompute_flop(tr, rec);
}

double tz_train_recompute_flop(const tz_trainer *tr, unsigned parts) {
  const struct tz_model_config *c = &tr->mc;
  double layer = tz_model_layer_flop(c, tr->B, tr->T), t = tr->part_s[0] + tr->part_s[1];
  if (!(t > 0))
    return tz_model_layer_part_flop(c, tr->B, tr->T, parts);
  return layer * parts_s(tr->part_s, parts) / t;
}

static uint64_t sizes_total(const uint64_t *sizes, int n) {
  uint64_t t = 0;
  for (int i = 0; i < n; i++)
    t += round_up(sizes[i], 256);
  return t;
}

void tz_train_buffer_sizes(const tz_trainer *tr, uint64_t *sz) {
  const struct tz_model_config *c = &tr->mc;
  uint64_t x = (uint64_t)tr->N * (uint64_t)c->d_model * tr->es, maxp = 0;
  for (int b = 1; b < tr->nb; b++)
    if (tr->padded[b] > maxp)
      maxp = tr->padded[b];
  sz[BUF_TOKENS] = sz[BUF_TARGETS] = sz[BUF_POS] =
      (uint64_t)tr->G * (uint64_t)tr->N * sizeof(int32_t);
  sz[BUF_DX] = x;
  /* The head's scratch lies in the layers' working activations (carve_buffers): nothing in them
   * lives from a layer's forward to its backward (what a backward reads is kept in BUF_KEEP,
   * recomputed or rebuilt), so the head, between the last forward and the first backward, may
   * take them; at 393,216 tokens of Llama-3.1-8B's width that is 6 GiB less of the compute tier. */
  uint64_t work = tz_model_acts_work_bytes(c, tr->S, tr->B, tr->T);
  uint64_t head = tz_model_head_scratch_bytes(c, tr->S, tr->B, tr->T);
  sz[BUF_ACTS] = work > head ? work : head;
  sz[BUF_LS] = tz_model_scratch_bytes(c, tr->S, tr->B, tr->T);
  sz[BUF_GW] = maxp * tr->es * (tr->overlap ? 2 : 1);
  sz[BUF_GWE] = tr->padded[0] * tr->es;
  sz[BUF_FG] = maxp * sizeof(float) * (tr->overlap ? 2 : 1);
  sz[BUF_FGE] = tr->padded[0] * sizeof(float);
  sz[BUF_PARTIALS] = tr->n_seg * sizeof(float);
  /* with the load-balancing loss: its routing statistics (2E) and gradient (E) after them */
  sz[BUF_SCAL] = (4 + (tz_model_aux_coef(c) > 0 ? 3 * (uint64_t)c->n_expert : 0)) * sizeof(float);
  sz[BUF_KEEP] = tz_recompute_kept_bytes(c, tr->S, tr->B, tr->T, tr->recompute);
  sz[BUF_ACC] = tr->acc_n * sizeof(float);
}

static int tier_of_device(enum tz_offload_device d) {
  return d == TZ_OFFLOAD_CPU ? TZ_PLAN_HOST : d == TZ_OFFLOAD_NVME ? TZ_PLAN_NVME : TZ_PLAN_COMPUTE;
}

/* Where the layers' inputs live (TZ_PLAN_ACT): tierzero.offload_activations, or with "auto"
 * host memory where activation_checkpointing.cpu_checkpointing asks for it, the plan's choice
 * with --auto-placement, and the compute tier otherwise (where they always were). */
static int activations_tier(const tz_trainer *tr, const struct tz_trainer_params *p) {
  const struct tz_config *c = &tr->cfg;
  int asked = c->tierzero.offload_activations; /* "auto", then the offload devices' names */
  if (asked > 0)
    return tier_of_device((enum tz_offload_device)(asked - 1));
  if (c->activation_checkpointing.cpu_checkpointing)
    return TZ_PLAN_HOST;
  return p->auto_placement ? TZ_PLAN_AUTO : TZ_PLAN_COMPUTE;
}

/* The host tier's default capacity: the memory available now (MemAvailable: free plus what the
 * kernel can reclaim) less a tenth of the machine's, at least 8 GiB, for everything else; from
 * the machine's facts where the caller gives them (tests), else read here. */
static uint64_t host_default_budget(const struct tz_machine_facts *m) {
  uint64_t avail = 0, total = 0;
  FILE *f = NULL;
  if (m && m->mem_available != TZ_MACHINE_UNKNOWN) {
    avail = m->mem_available;
    total = m->mem_total != TZ_MACHINE_UNKNOWN ? m->mem_total : avail;
  } else {
    f = fopen("/proc/meminfo", "r");
  }
  if (f) {
    char key[64];
    unsigned long long kib;
    while (fscanf(f, "%63s %llu kB", key, &kib) == 2) {
      if (strcmp(key, "MemAvailable:") == 0)
        avail = (uint64_t)kib << 10;
      else if (strcmp(key, "MemTotal:") == 0)
        total = (uint64_t)kib << 10;
    }
    fclose(f);
  }
  if (!avail) { /* no /proc: half of the free pages */
    long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 2 : 0;
  }
  uint64_t keep = total / 10 > (8ull << 30) ? total / 10 : (8ull << 30);
  return avail > keep ? round_up(avail - keep, ALIGN) - ALIGN : 0;
}

/* Which blocks the CPU steps at their homes: the last ones, until they hold tierzero.cpu_adam of
 * the parameters (their forward comes late in the step, and their gradients first in backward).
 * The default: every block on a CPU-only machine, none with a GPU. */
void tz_train_choose_cpu_steps(tz_trainer *tr, double share) {
  if (share < 0)
    share = tr->gpu ? 0 : 1;
  tr->cpu_share = share;
  uint64_t total = 0, taken = 0;
  for (int b = 0; b < tr->nb; b++)
    total += tr->numel[b];
  for (int b = tr->nb - 1; b >= 0; b--) {
    /* Short of the share by less than a millionth of the parameters counts as reached: the
     * share printed (%g) of a set of blocks (tierzero.cpu_adam_search) gives those blocks. */
    tr->cpu_step[b] = share > 0 && (double)taken + 1e-6 * (double)total < share * (double)total;
    taken += tr->cpu_step[b] ? tr->numel[b] : 0;
  }
}

/* Recomputes plan's bound and lane figures for the request r (its phases changed), keeping its
 * homes and window. */
static int rebound(const struct tz_plan_request *r, struct tz_plan *plan) {
  struct tz_plan b;
  memset(&b, 0, sizeof b);
  TZ_CHECK(tz_plan_bound(r, plan->tier, plan->window, &b));
  plan->bound_s = b.bound_s;
  plan->compute_s = b.compute_s;
  memcpy(plan->lane_s, b.lane_s, sizeof plan->lane_s);
  memcpy(plan->moved, b.moved, sizeof plan->moved);
  plan->lookahead = b.lookahead;
  plan->unknown_rates = b.unknown_rates;
  tz_plan_free(&b);
  return 0;
}

/* Whether phase i runs at its blocks' homes on the scheduler's home lane, with the homes `tiers`:
 * an opt phase of a block the CPU steps (tz_train_choose_cpu_steps), whose state lives in host
 * memory (nothing on nvme; on a GPU every use at home, the gradient too). CPU Adam then updates the
 * shards in place instead of copying them into the compute tier and back, and overlaps the
 * compute lane. Unfolded steps keep opt on the compute lane: there it must follow the step's
 * finish_step, which only the compute lane's order gives. */
static int home_phase(const tz_trainer *tr, int i, const int8_t *tiers) {
  const struct phase *ph = &tr->ph[i];
  if (ph->kind != PH_OPT || !tr->cpu_step[ph->block] || tr->mode == TZ_OPT_UNFOLDED)
    return 0;
  int host = 0, nvme = 0, device = 0;
  for (int u = 0; u < ph->n_uses; u++) {
    int t = tiers[ph->blocks[u] * TZ_PLAN_KINDS + ph->kinds[u]];
    host |= t == TZ_PLAN_HOST;
    nvme |= t == TZ_PLAN_NVME;
    device |= t == TZ_PLAN_COMPUTE && tr->gpu;
  }
  return host && !nvme && !device;
}

/* The plan's view of each phase: its FLOP, Adam elements, collective bytes (held up or beside
 * the compute) and uses. */
static void plan_phases(tz_trainer *tr, struct tz_plan_phase *pp) {
  double share = tr->world > 1 ? (double)(tr->world - 1) / tr->world : 0;
  for (int i = 0; i < tr->n_ph; i++) {
    const struct phase *ph = &tr->ph[i];
    snprintf(pp[i].name, sizeof pp[i].name, "%s", ph->name);
    pp[i].flop = phase_flop(tr, ph);
    if (ph->kind == PH_OPT) {
      pp[i].adam_elems = (double)tr->shard[ph->block];
    } else if (!tr->overlap) {
      int reads = ph->kind != PH_EMBED_BWD, grads = ph->kind >= PH_HEAD;
      pp[i].coll_bytes = share * (double)tr->padded[ph->block] *
                         ((double)reads * (double)tr->es + (double)grads * 4.0);
    } else {
      /* The embedding's own gather and reduce-scatter hold the phase up; the next layer's gather
       * and the previous one's reduce-scatter run beside its compute, and the phase after waits
       * for them. */
      if (ph->kind == PH_EMBED || ph->kind == PH_EMBED_BWD)
        pp[i].coll_bytes =
            share * (double)tr->padded[0] * (ph->kind == PH_EMBED ? (double)tr->es : 4.0);
      if (ph->next >= 0)
        pp[i].coll_async += share * (double)tr->padded[ph->next] * (double)tr->es;
      if (ph->prev >= 0)
        pp[i].coll_async += share * (double)tr->padded[ph->prev] * 4.0;
    }
    pp[i].n_uses = ph->n_uses;
    for (int u = 0; u < ph->n_uses; u++)
      pp[i].uses[u] = (struct tz_plan_use){ph->blocks[u], ph->kinds[u], ph->uses[u].access};
  }
}

/* The request's shape, buffers, window and the placement the config forces. */
static void plan_request(tz_trainer *tr, const struct tz_trainer_params *p,
                         struct tz_plan_phase *pp, struct tz_plan_request *out) {
  const struct tz_config *c = &tr->cfg;
  uint64_t sz[BUF_COUNT];
  tz_train_buffer_sizes(tr, sz);
  struct tz_plan_request r;
  memset(&r, 0, sizeof r);
  r.n_groups = tr->nb;
  r.bytes = (const uint64_t(*)[TZ_PLAN_KINDS])tr->bytes;
  r.n_phases = tr->n_ph;
  r.phases = pp;
  r.compute_fixed = round_up(sizes_total(sz, BUF_COUNT), ALIGN);
  r.compute_acts =
      round_up(sz[BUF_ACTS], 256) + round_up(sz[BUF_LS], 256) + round_up(sz[BUF_KEEP], 256);
  r.align = ALIGN;
  r.chunk = tz_runtime_chunk_bytes(tr->rt);
  r.window = p->window;
  r.lookahead = c->tierzero.lookahead > 0 ? c->tierzero.lookahead : 0;
  r.widen_moves = c->tierzero.plan_widen_moves;
  r.no_carry = !tr->carry;
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    r.force[k] = TZ_PLAN_AUTO;
  if (!p->auto_placement) {
    int pt = tier_of_device(c->zero_optimization.offload_param.device);
    int ot = tier_of_device(c->zero_optimization.offload_optimizer.device);
    r.force[TZ_PLAN_PARAM] = pt;
    r.force[TZ_PLAN_MASTER] = r.force[TZ_PLAN_M] = r.force[TZ_PLAN_V] = ot;
    /* Gradient shards are written by every micro-batch's backward. On a GPU, whose Adam runs
     * in its memory, they stay there: taking them to the host and back would add 8 bytes per
     * parameter and step to the host link. On a CPU-only machine they go with the optimizer
     * state, except to NVMe: there they stay in host memory, as ZeRO-Infinity keeps them. */
    r.force[TZ_PLAN_GRAD] = tr->gpu ? TZ_PLAN_COMPUTE : ot == TZ_PLAN_NVME ? TZ_PLAN_HOST : ot;
  }
  r.force[TZ_PLAN_ACT] = activations_tier(tr, p);
  r.force_each = p->force_tiers;
  if (p->rates)
    r.rates = *p->rates;
  if (tr->layer_rate > 0)
    r.rates.flops = tr->layer_rate;
  r.home_on_compute = !tr->gpu; /* home phases: guess_home_phases, then settle_home_phases */
  /* the CPU's Adam at the homes (trainer/step/phases.c): f32 master, m and v read and written, the
   * f32 gradient read, the parameter written in the storage dtype */
  r.home_adam_bytes = 7.0 * sizeof(float) + (double)tz_dtype_size(tr->S);
  *out = r;
}

/* On a GPU, the blocks the CPU steps (tierzero.cpu_adam) keep their gradients at home with the
 * optimizer state, which must be in host memory: with forced placement, where the config puts
 * the state there; with automatic placement, every kind of those blocks is homed there (the CPU
 * writes their parameters too), and the plan places the rest. *each (the caller frees it) is the
 * per-block placement that says so, when it applies. */
static int cpu_step_grads(tz_trainer *tr, const struct tz_trainer_params *p,
                          struct tz_plan_request *r, int8_t **each) {
  *each = NULL;
  int split = 0;
  for (int b = 0; b < tr->nb; b++)
    split |= tr->cpu_step[b];
  if (!tr->gpu || !split)
    return 0;
  if (!p->auto_placement && r->force[TZ_PLAN_MASTER] != TZ_PLAN_HOST) {
    memset(tr->cpu_step, 0, (size_t)tr->nb);
    TZ_WARN("train: tierzero.cpu_adam needs the optimizer state in host memory: offloaded to "
            "cpu by the config (offload_optimizer.device cpu) or placed by the plan "
            "(--auto-placement); Adam runs on the GPU");
    return 0;
  }
  int8_t *e = malloc((size_t)tr->nb * TZ_PLAN_KINDS);
  if (!e)
    return tz_err_set(TZ_ENOMEM, "train: no memory for the plan");
  for (int i = 0; i < tr->nb * TZ_PLAN_KINDS; i++)
    e[i] = p->force_tiers ? p->force_tiers[i] : TZ_PLAN_AUTO;
  for (int b = 0; b < tr->nb; b++)
    for (int k = 0; k < TZ_PLAN_STATE_KINDS && tr->cpu_step[b]; k++)
      if (k == TZ_PLAN_GRAD || p->auto_placement)
        e[b * TZ_PLAN_KINDS + k] = TZ_PLAN_HOST;
  r->force_each = e;
  *each = e;
  return 0;
}

/* Home phases, as far as forced homes tell before the plan (checked against its homes after). */
static int guess_home_phases(tz_trainer *tr, const struct tz_plan_request *r,
                             struct tz_plan_phase *pp) {
  int8_t *guess = malloc((size_t)tr->nb * TZ_PLAN_KINDS);
  if (!guess)
    return tz_err_set(TZ_ENOMEM, "train: no memory for the plan");
  for (int i = 0; i < tr->nb * TZ_PLAN_KINDS; i++) {
    int f = r->force_each ? r->force_each[i] : TZ_PLAN_AUTO;
    f = f == TZ_PLAN_AUTO ? r->force[i % TZ_PLAN_KINDS] : f;
    guess[i] = (int8_t)(f == TZ_PLAN_AUTO ? TZ_PLAN_COMPUTE : f);
  }
  for (int i = 0; i < tr->n_ph; i++)
    pp[i].at_home = home_phase(tr, i, guess);
  free(guess);
  return 0;
}

/* Folded, the opt phases that run at the homes (pp[].at_home) go first in the step, in block
 * order, and the rest keep theirs: tr->ph and pp are permuted alike (tr->loss_phase with them).
 * An opt phase of block b must only come before the step's first read of b's parameters, and
 * the previous step's gradients and clipping factor are complete when the step begins; in the
 * forward, where tz_train_build_phases puts it, the client enters it only once the window has
 * reached it, so the CPU's update of the last blocks would start after the GPU's update of all
 * the others had crossed the host link, and the forward would then wait for it (docs/training.md,
 * "Splitting Adam"). First, the home lane starts with the step and runs beside the GPU's opt
 * phases. Each block's update is the same whatever the order: the same bits. */
static int home_first(tz_trainer *tr, struct tz_plan_phase *pp) {
  int n = tr->n_ph, k = 0, loss = tr->loss_phase;
  if (tr->mode != TZ_OPT_FOLDED)
    return 0;
  struct phase *ph = malloc(sizeof *ph * (size_t)n);
  struct tz_plan_phase *q = malloc(sizeof *q * (size_t)n);
  if (!ph || !q) {
    free(ph);
    free(q);
    return tz_err_set(TZ_ENOMEM, "train: no memory for the order of a step");
  }
  for (int pass = 1; pass >= 0; pass--)
    for (int i = 0; i < n; i++)
      if (!!pp[i].at_home == pass) {
        if (i == tr->loss_phase)
          loss = k;
        ph[k] = tr->ph[i];
        q[k++] = pp[i];
      }
  memcpy(tr->ph, ph, sizeof *ph * (size_t)n);
  memcpy(pp, q, sizeof *q * (size_t)n);
  tr->loss_phase = loss;
  free(ph);
  free(q);
  return 0;
}

/* The GPU's free memory for the plan: p->gpu_free when only planning, else asked of the backend,
 * less a reserve; 0 without a GPU. */
static int gpu_free_bytes(tz_trainer *tr, const struct tz_trainer_params *p, uint64_t *out) {
  uint64_t gpu_free = 0;
  *out = 0;
  if (!tr->gpu)
    return 0;
  uint64_t total = 0;
  if (p->plan_only && p->gpu_free)
    gpu_free = total = p->gpu_free;
  else
    TZ_CHECK(tz_compute_device_memory(tr->backend, tr->device, &gpu_free, &total));
  /* Left to the CUDA context's growth, cuBLASLt, NCCL and the allocator's slack. */
  uint64_t reserve = total / 32 > (2ull << 30) ? total / 32 : (2ull << 30);
  *out = gpu_free > reserve ? round_up(gpu_free - reserve, ALIGN) - ALIGN : 0;
  return 0;
}

/* Whether the compute tier is the GPU's free memory and the window what the homes and buffers
 * leave of it, without a tierzero.hbm_budget: the plan's placement, or forced placement whose
 * window carries nothing across steps (a working set, however large; setup.c, choose_carry). */
static int window_takes_free(const tz_trainer *tr, const struct tz_trainer_params *p) {
  return tr->gpu && (p->auto_placement || (!tr->carry && !p->window));
}

/* Capacities. The compute tier: tierzero.hbm_budget; without one, on a GPU with the plan's
 * placement or a window that carries nothing into the next step, its free memory; else room for
 * the buffers, the homes forced into it and a window (a quarter of the state on a CPU-only
 * machine, where the compute tier is host memory and a small window makes every path of the
 * scheduler run; four phases' working sets on a GPU). */
static int compute_capacity(tz_trainer *tr, const struct tz_trainer_params *p,
                            struct tz_plan_request *rq) {
  const struct tz_config *c = &tr->cfg;
  struct tz_plan_request r = *rq;
  uint64_t state = 0;
  for (int b = 0; b < tr->nb; b++)
    for (int k = 0; k < TZ_PLAN_STATE_KINDS; k++)
      state += round_up(tr->bytes[b][k], ALIGN);
  r.capacity[TZ_PLAN_COMPUTE] = c->tierzero.hbm_budget;
  uint64_t gpu_free;
  TZ_CHECK(gpu_free_bytes(tr, p, &gpu_free));
  if (!r.capacity[TZ_PLAN_COMPUTE] && window_takes_free(tr, p)) {
    /* The plan chooses: every free byte of the GPU, the window what the homes leave. Or forced
     * placement whose window carries nothing across steps (setup.c, choose_carry): a working
     * set, however large, so the free memory too. */
    r.capacity[TZ_PLAN_COMPUTE] = gpu_free;
  } else if (!r.capacity[TZ_PLAN_COMPUTE]) {
    /* Placement forced by the config: the compute tier holds the buffers, the homes forced into
     * it and a window, not a cache of the state offloaded elsewhere (DeepSpeed's offload means
     * the GPU holds a working set). The window: a quarter of the state on a CPU-only machine,
     * so that the scheduler streams; four times the largest phase's working set on a GPU, room
     * to prefetch a few phases ahead. */
    uint64_t forced = 0;
    for (int b = 0; b < tr->nb; b++)
      for (int k = 0; k < TZ_PLAN_KINDS; k++) {
        int f = p->force_tiers ? p->force_tiers[b * TZ_PLAN_KINDS + k] : TZ_PLAN_AUTO;
        if (f == TZ_PLAN_AUTO)
          f = r.force[k];
        forced += f == TZ_PLAN_COMPUTE ? round_up(tr->bytes[b][k], ALIGN) : 0;
      }
    uint64_t min = tz_plan_min_window(&r);
    uint64_t window = p->window ? p->window : tr->gpu ? 4 * min : round_up(state / 4, ALIGN);
    if (window < min)
      window = min;
    r.capacity[TZ_PLAN_COMPUTE] = r.compute_fixed + forced + window;
    if (tr->gpu && r.capacity[TZ_PLAN_COMPUTE] > gpu_free && !p->window) {
      /* A window smaller than four phases' worth, when the GPU has no more. */
      r.capacity[TZ_PLAN_COMPUTE] = gpu_free;
      window = gpu_free > r.compute_fixed + forced ? gpu_free - r.compute_fixed - forced : 0;
    }
    if (!p->window)
      r.window = window;
  }
  *rq = r;
  return 0;
}

/* The host and nvme tiers' capacities; r's compute tier's is set (compute_capacity). */
static void other_capacities(tz_trainer *tr, const struct tz_trainer_params *p,
                             struct tz_plan_request *r) {
  const struct tz_config *c = &tr->cfg;
  /* Without a budget, the ranks (taken to share this machine) share what is available. On a
   * CPU-only machine the compute tier is host memory too: without either budget the host tier
   * takes what the compute tier leaves of the rank's share, so that the two defaults together
   * fit the machine (tz_train_check_machine) and the plan sends the rest to the disk. */
  uint64_t share = host_default_budget(p->machine) / (uint64_t)tr->world;
  if (!tr->gpu && !c->tierzero.hbm_budget)
    share = share > r->capacity[TZ_PLAN_COMPUTE] ? share - r->capacity[TZ_PLAN_COMPUTE] : 0;
  r->capacity[TZ_PLAN_HOST] =
      c->tierzero.host_budget ? c->tierzero.host_budget : round_up(share, ALIGN);
  const char *dir = tz_machine_nvme_dir(c);
  r->capacity[TZ_PLAN_NVME] = 0;
  r->nvme_capacity_why = NULL;
  if (dir) {
    struct statvfs vfs;
    r->capacity[TZ_PLAN_NVME] = c->tierzero.nvme_budget;
    char *why = tr->nvme_capacity_why;
    size_t len = sizeof tr->nvme_capacity_why;
    if (r->capacity[TZ_PLAN_NVME]) {
      snprintf(why, len, "tierzero.nvme_budget");
    } else if (statvfs(dir, &vfs) == 0) {
      uint64_t free_b = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
      r->capacity[TZ_PLAN_NVME] = free_b / 2;
      char fb[32];
      tz_bytes_format(fb, sizeof fb, (double)free_b, &tz_bytes_iec);
      snprintf(why, len, "half the free space of nvme_path %s, which has %s free", dir, fb);
    } else {
      snprintf(why, len, "nvme_path %s: %s", dir, strerror(errno));
    }
    r->nvme_capacity_why = why;
  }
}

/* The phases that will run at the homes with the plan's homes; the bound again if the guess
 * (guess_home_phases) was wrong for any. */
static int settle_home_phases(tz_trainer *tr, const struct tz_plan_request *r,
                              struct tz_plan_phase *pp) {
  int changed = 0;
  for (int i = 0; i < tr->n_ph; i++) {
    tr->at_home[i] = home_phase(tr, i, tr->plan.tier);
    changed |= tr->at_home[i] != pp[i].at_home;
    pp[i].at_home = tr->at_home[i];
  }
  return changed ? rebound(r, &tr->plan) : 0;
}

/* With TZ_LOG=debug, the bound's second step phase by phase (tz_plan_timeline): which lane waits
 * for which, for every plan made (the last one is the plan run). */
static int log_timeline(tz_trainer *tr, const struct tz_plan_request *r) {
  if (!tz_log_enabled(TZ_LOG_DEBUG))
    return 0;
  struct tz_plan_event *ev = calloc((size_t)r->n_phases, sizeof *ev);
  if (!ev)
    return tz_err_set(TZ_ENOMEM, "train: no memory for the plan's timeline");
  int rc = tz_plan_timeline(r, tr->plan.tier, tr->plan.window, ev);
  if (rc == 0) {
    TZ_DEBUG("train: the plan's bound %.3f s, CPU Adam share %g; its second step, ms from its "
             "start:",
             tr->plan.bound_s, tr->cpu_share);
    tz_plan_print_timeline(stderr, ev, r->n_phases, "  ");
  }
  free(ev);
  return rc;
}

/* With accumulation, the blocks whose gradient shard the request r forces out of the compute
 * tier (a block the CPU steps at its host home beside a GPU, tierzero.cpu_adam; any offloaded
 * optimizer on a CPU-only machine) get a sum in the compute tier (tr->acc_off), when `on`: the
 * shard is then written once, by the last micro-batch, and not brought in and written back by
 * every later one (4 bytes a parameter each way a micro-batch, against 4 once a step). The plan
 * chooses the homes of the others, and a sum beside a shard it moved out would take the room it
 * freed. 1 when the blocks changed (the phases' uses change with them). */
static int choose_accumulators(tz_trainer *tr, const struct tz_plan_request *r, int on) {
  int changed = 0;
  tr->acc_n = 0;
  for (int b = 0; b < tr->nb; b++) {
    int f = r->force_each ? r->force_each[b * TZ_PLAN_KINDS + TZ_PLAN_GRAD] : TZ_PLAN_AUTO;
    if (f == TZ_PLAN_AUTO)
      f = r->force[TZ_PLAN_GRAD];
    uint64_t off = UINT64_MAX;
    if (on && tr->G > 1 && (f == TZ_PLAN_HOST || f == TZ_PLAN_NVME)) {
      off = tr->acc_n;
      tr->acc_n += round_up(tr->shard[b], 64); /* 256-byte aligned, as every tensor */
    }
    changed |= tr->acc_off[b] != off;
    tr->acc_off[b] = off;
  }
  return changed;
}

/* The plan for the parts tr->recompute names; with_acc: choose_accumulators' `on`. */
static int plan_try(tz_trainer *tr, const struct tz_trainer_params *p, int with_acc) {
  /* The step's order as built, before home_first moves the phases this plan runs at the homes. */
  TZ_CHECK(tz_train_build_phases(tr));
  struct tz_plan_phase *pp = calloc((size_t)tr->n_ph, sizeof *pp);
  if (!pp)
    return tz_err_set(TZ_ENOMEM, "train: no memory for the plan");
  plan_phases(tr, pp);
  struct tz_plan_request r;
  plan_request(tr, p, pp, &r);
  int8_t *each = NULL;
  int rc = cpu_step_grads(tr, p, &r, &each);
  if (rc == 0 && choose_accumulators(tr, &r, with_acc)) {
    /* The gradient uses and the buffers follow the sums: the same order, other uses. */
    rc = tz_train_build_phases(tr);
    if (rc == 0) {
      uint64_t sz[BUF_COUNT];
      tz_train_buffer_sizes(tr, sz);
      plan_phases(tr, pp);
      r.compute_fixed = round_up(sizes_total(sz, BUF_COUNT), ALIGN);
    }
  }
  if (rc == 0)
    rc = guess_home_phases(tr, &r, pp);
  if (rc == 0)
    rc = home_first(tr, pp);
  if (rc == 0)
    rc = compute_capacity(tr, p, &r);
  if (rc == 0) {
    other_capacities(tr, p, &r);
    rc = tz_plan_make(&r, &tr->plan);
    if (rc == TZ_ENOMEM && r.force[TZ_PLAN_ACT] == TZ_PLAN_AUTO) {
      /* The placement moves one block at a time and never back: layer inputs moved out early
       * (cheap for the bound) take host room the state needed later, and each grows the
       * window's minimum (llama-13b's longest sequence on an H200 fell from 42,311 tokens to
       * 39,382). Where that fails, the inputs in the compute tier, as before they could move. */
      char first[1024];
      snprintf(first, sizeof first, "%s", tz_err_msg());
      r.force[TZ_PLAN_ACT] = TZ_PLAN_COMPUTE;
      rc = tz_plan_make(&r, &tr->plan);
      if (rc == TZ_ENOMEM) { /* the refusal of the plan free to move them */
        r.force[TZ_PLAN_ACT] = TZ_PLAN_AUTO;
        tz_err_set(rc, "%s", first);
      }
    }
    if (rc == TZ_ENOMEM) { /* what the state needs in all, beside where it fell short */
      char why[1024], state[384];
      snprintf(why, sizeof why, "%s", tz_err_msg());
      tz_plan_state_summary(&r, state, sizeof state);
      rc = tz_err_set(rc, "%s; %s", why, state);
    }
  }
  if (rc == 0)
    rc = settle_home_phases(tr, &r, pp);
  if (rc == 0)
    rc = log_timeline(tr, &r);
  free(each);
  free(pp);
  return rc;
}

/* The plan, with the sums of choose_accumulators where the compute tier holds them; otherwise
 * without (each micro-batch then brings the shard in and writes it back, as without them). The
 * compute tier is sized to hold them beside the window, but for a tierzero.hbm_budget: within
 * one, they take the window's room, and the plan keeps them only if its bound is no worse. */
static int plan_once(tz_trainer *tr, const struct tz_trainer_params *p) {
  int rc = plan_try(tr, p, 1);
  if (tr->acc_n == 0 || (rc < 0 && rc != TZ_ENOMEM))
    return rc;
  if (rc == TZ_ENOMEM) {
    char why[1024];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    tz_plan_free(&tr->plan);
    rc = plan_try(tr, p, 0);
    if (rc == 0)
      TZ_DEBUG("train: gradients accumulated at their homes, not in the compute tier: %s", why);
    return rc;
  }
  if (!tr->cfg.tierzero.hbm_budget || tr->plan.unknown_rates)
    return 0;
  double with = tr->plan.bound_s;
  tz_plan_free(&tr->plan);
  rc = plan_try(tr, p, 0);
  if (rc < 0 && rc != TZ_ENOMEM)
    return rc;
  if (rc == 0 && tr->plan.bound_s < with * (1 - 1e-9)) {
    TZ_DEBUG("train: gradients accumulated at their homes: bound %.4g s against %.4g s with "
             "their sums in the compute tier (tierzero.hbm_budget)",
             tr->plan.bound_s, with);
    return 0;
  }
  tz_plan_free(&tr->plan);
  return plan_try(tr, p, 1);
}

/* The most the compute tier could grow by beyond the plan tr->plan (made with every part
 * recomputed): what tierzero.hbm_budget, the GPU's free memory or, on a CPU-only machine, the host
 * budget its homes leave allows, less the buffers and the window (only its minimum where the plan
 * gives the window what the tier has left: a budget, or window_takes_free). Not less the homes
 * in the compute tier: kept activations may take their room where the bound gains (at 131,072
 * tokens of Llama-3.1-8B's shape on an H200 the state filled the HBM that keeping the attention's
 * output would have saved a quarter of the step with), and a plan that cannot place them fails
 * (choose_recompute stops there). */
static int keep_room(tz_trainer *tr, const struct tz_trainer_params *p, uint64_t *room) {
  const struct tz_plan *pl = &tr->plan;
  uint64_t have = tr->cfg.tierzero.hbm_budget;
  if (!have && tr->gpu)
    TZ_CHECK(gpu_free_bytes(tr, p, &have));
  else if (!have)
    have = pl->capacity[TZ_PLAN_HOST] > pl->used[TZ_PLAN_HOST]
               ? pl->capacity[TZ_PLAN_HOST] - pl->used[TZ_PLAN_HOST]
               : 0;
  int window_free = !p->window && (tr->cfg.tierzero.hbm_budget || window_takes_free(tr, p));
  uint64_t use = pl->compute_fixed + (window_free ? pl->min_window : pl->window);
  *room = have > use ? have - use : 0;
  return 0;
}

/* The plan with the first k items kept: 1 and its bound in *s where it fits (the kept bytes within
 * room, and a plan), 0 where it does not, or the error. */
static int keep_first_plan(tz_trainer *tr, const struct tz_trainer_params *p,
                           const struct tz_recompute_item *items, int k, uint64_t room, double *s) {
  tz_recompute_keep_first(items, k, tr->L, tr->recompute);
  if (tz_recompute_kept_bytes(&tr->mc, tr->S, tr->B, tr->T, tr->recompute) > room)
    return 0;
  tz_plan_free(&tr->plan);
  int rc = plan_once(tr, p);
  if (rc == TZ_ENOMEM)
    return 0;
  if (rc < 0)
    return rc;
  *s = tr->plan.unknown_rates ? INFINITY : tr->plan.bound_s;
  return 1;
}

/* tierzero.recompute "auto": keeps the first k items in tz_recompute_order's order, for the k
 * whose plan predicts the least bound (the fewer kept on a tie in a billion), of those whose kept
 * activations fit in keep_room and whose plan fits; k = 0 (every part recomputed, as before) when
 * the rates are unknown. A plan takes up to a fifth of a second at llama-13b's 40 layers, 3 x 40
 * items: the ks are tried every L / 8 first (all of them below 8 layers), then one by one around
 * the best of those (the bound falls with each item kept while the items save more than the
 * homes they push out cost, then rises: a step of L / 8 finds that turn). */
static int choose_recompute(tz_trainer *tr, const struct tz_trainer_params *p) {
  int L = tr->L;
  memset(tr->recompute, TZ_PARTS_ALL, (size_t)L);
  TZ_CHECK(plan_once(tr, p));
  tr->recompute_all_s = tr->plan.bound_s;
  if (L == 0 || tr->plan.unknown_rates)
    return 0;
  uint64_t room;
  TZ_CHECK(keep_room(tr, p, &room));
  struct tz_recompute_item *items = malloc(TZ_RECOMPUTE_ITEMS * (size_t)L * sizeof *items);
  if (!items)
    return tz_err_set(TZ_ENOMEM, "train: no memory for the recompute plan");
  const double cost[TZ_RECOMPUTE_ITEMS] = {
      tz_train_recompute_flop(tr, TZ_PART_ATTN), tz_train_recompute_flop(tr, TZ_PART_MLP),
      tz_train_recompute_flop(tr, TZ_PART_ATTN | TZ_PART_ATTN_OUT)};
  tz_recompute_order(&tr->mc, tr->S, tr->B, tr->T, cost, items);
  const int n = TZ_RECOMPUTE_ITEMS * L, stride = L >= 8 ? L / 8 : 1;
  int best = 0, limit = n + 1, rc = 0; /* limit: the least k known not to fit */
  double best_s = tr->plan.bound_s, s = 0;
  for (int k = stride; k <= n; k += stride) {
    rc = keep_first_plan(tr, p, items, k, room, &s);
    if (rc <= 0) { /* more kept fits even less */
      limit = k;
      break;
    }
    if (s < best_s * (1 - 1e-9)) {
      best = k;
      best_s = s;
    }
  }
  /* one by one around the best, the fewer kept first */
  int lo = best - stride + 1 > 1 ? best - stride + 1 : 1;
  int hi = best + stride - 1 < limit - 1 ? best + stride - 1 : limit - 1;
  for (int k = lo; rc >= 0 && stride > 1 && k <= hi; k++) {
    if (k % stride == 0)
      continue;
    rc = keep_first_plan(tr, p, items, k, room, &s);
    if (rc == 0 && k > best)
      break;
    if (rc > 0 && (s < best_s * (1 - 1e-9) || (k < best && s <= best_s * (1 + 1e-9)))) {
      best = k;
      best_s = s;
    }
  }
  if (rc < 0) {
    free(items);
    return rc;
  }
  tz_recompute_keep_first(items, best, L, tr->recompute);
  free(items);
  tz_plan_free(&tr->plan);
  return plan_once(tr, p);
}

int tz_train_make_plan(tz_trainer *tr, const struct tz_trainer_params *p) {
  if (tr->recompute_mode == TZ_RECOMPUTE_AUTO && !(p->plan_only && p->holds_only))
    return choose_recompute(tr, p);
  int rc = plan_once(tr, p);
  uint64_t kept = tz_recompute_kept_bytes(&tr->mc, tr->S, tr->B, tr->T, tr->recompute);
  if (rc == TZ_ENOMEM && kept > 0) {
    char why[1024], b[32];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    tz_bytes_format(b, sizeof b, (double)kept, &tz_bytes_plan);
    rc = tz_err_set(rc,
                    "%s; tierzero.recompute keeps %s of activations in the compute tier, and "
                    "\"auto\" (the plan keeps what fits) or \"all\" needs less",
                    why, b);
  }
  return rc;
}

/* The plan's needs against what the machine can give (trainer/step/machine.h), before anything is
 * allocated: on a CPU-only machine the compute tier is host memory too. */
int tz_train_check_machine(tz_trainer *tr, const struct tz_trainer_params *p) {
  const struct tz_config *c = &tr->cfg;
  const struct tz_plan *pl = &tr->plan;
  if (p->plan_only && p->gpu_free)
    return 0; /* planning for another machine's GPU */
  struct tz_machine_facts here;
  const struct tz_machine_facts *f = p->machine;
  const char *dirs[TZ_MAX_PATHS];
  int n_dirs = 0;
  if (c->tierzero.nvme_path.n > 0)
    for (int i = 0; i < c->tierzero.nvme_path.n && i < TZ_MAX_PATHS; i++)
      dirs[n_dirs++] = c->tierzero.nvme_path.path[i];
  else if (tz_machine_nvme_dir(c))
    dirs[n_dirs++] = tz_machine_nvme_dir(c);
  if (!f) {
    tz_machine_facts_read(dirs, pl->used[TZ_PLAN_NVME] ? n_dirs : 0, tr->backend, tr->device,
                          &here);
    f = &here;
  }
  uint64_t most = 0, most_shard = 0;
  for (int b = 0; b < tr->nb; b++) {
    most = tr->padded[b] > most ? tr->padded[b] : most;
    most_shard = tr->shard[b] > most_shard ? tr->shard[b] : most_shard;
  }
  /* The io tier's token buffers, and two f32 copies of the largest block: the initialisation's
   * two shard buffers (pinned on a GPU); an import's block beside the scheduler's staging of a
   * shard, an export's beside that staging or, on more ranks, beside the gathered block
   * (train.c, tz_trainer_param_load and _store). */
  uint64_t io = round_up((uint64_t)tr->G * (uint64_t)tr->N * 4 * sizeof(int32_t) + 256, ALIGN);
  uint64_t init = 2 * round_up(most * sizeof(float), ALIGN);
  uint64_t init_pinned = 2 * round_up(most_shard * sizeof(float), ALIGN);
  /* With nvme homes on a GPU, the scheduler's staging chunks (a set per direction). */
  uint64_t staging =
      tr->gpu && pl->used[TZ_PLAN_NVME]
          ? 2 * (uint64_t)c->tierzero.nvme_stage_chunks * c->tierzero.nvme_stage_bytes
          : 0;
  struct tz_machine_need n = {
      .gpu = tr->gpu,
      .compute = pl->compute_fixed + pl->used[TZ_PLAN_COMPUTE] + pl->window,
      .host = pl->used[TZ_PLAN_HOST] + io + init + staging,
      .pinned = tr->gpu ? pl->used[TZ_PLAN_HOST] + io + init_pinned + staging : 0,
      .nvme_per_dir = n_dirs ? pl->used[TZ_PLAN_NVME] / (uint64_t)n_dirs : pl->used[TZ_PLAN_NVME],
      .ranks = tr->world,
      .compute_budget = c->tierzero.hbm_budget,
      .host_budget = c->tierzero.host_budget,
      .nvme_budget = c->tierzero.nvme_budget,
  };
  TZ_DEBUG("train: the machine check's needs: compute tier %llu bytes, host %llu (io %llu, "
           "staging of the largest block %llu), pinned %llu",
           (unsigned long long)n.compute, (unsigned long long)n.host, (unsigned long long)io,
           (unsigned long long)init, (unsigned long long)n.pinned);
  return tz_machine_check(&n, f);
}

/* The last k blocks stepped by the CPU (k = 0: none); cpu_share: their share of the parameters.
 * tz_train_choose_cpu_steps with that share picks the same blocks. */
static void choose_cpu_blocks(tz_trainer *tr, int k) {
  uint64_t total = 0, taken = 0;
  for (int b = 0; b < tr->nb; b++) {
    tr->cpu_step[b] = b >= tr->nb - k;
    total += tr->numel[b];
    taken += tr->cpu_step[b] ? tr->numel[b] : 0;
  }
  tr->cpu_share = total ? (double)taken / (double)total : 0;
}

/* The blocks tz_train_choose_cpu_steps gives the CPU for share (the last ones). */
static int cpu_blocks_of(tz_trainer *tr, double share) {
  tz_train_choose_cpu_steps(tr, share);
  int k = 0;
  while (k < tr->nb && tr->cpu_step[tr->nb - 1 - k])
    k++;
  return k;
}

/* The bound of the plan with the last k blocks stepped by the CPU into *bound; 0 when that plan
 * does not fit or its rates are unknown (passed over), 1 when known, or an error. */
static int bound_with_cpu_blocks(tz_trainer *tr, const struct tz_trainer_params *p, int k,
                                 double *bound) {
  choose_cpu_blocks(tr, k);
  int rc = tz_train_make_plan(tr, p);
  int known = rc == 0 && !tr->plan.unknown_rates;
  *bound = tr->plan.bound_s;
  tz_plan_free(&tr->plan);
  return known;
}

/* tierzero.cpu_adam_search: of the shares 0, 1/8, ..., 1, the one whose plan predicts the least
 * bound; then, between its neighbours in that list, every count of last blocks: a share is taken
 * a block at a time, and where the CPU's and the link's paths balance can fall between two
 * eighths (llama-3b on an H200: 6 layers and the head, 0.23 of the parameters). The fewer blocks
 * on a tie within a part in a billion; plans that do not fit are passed over. With a GPU only
 * where the share can apply (tz_train_make_plan): otherwise, and when a plan's rates are unknown,
 * the default. Leaves cpu_step chosen for tz_train_make_plan to plan again. */
int tz_train_search_cpu_steps(tz_trainer *tr, const struct tz_trainer_params *p) {
  const struct tz_config *c = &tr->cfg;
  int applies = !tr->gpu || p->auto_placement ||
                tier_of_device(c->zero_optimization.offload_optimizer.device) == TZ_PLAN_HOST;
  int blocks[9], best = -1, lo = 0, hi = 0;
  double best_bound = 0, bound;
  for (int e = 0; applies && e <= 8; e++) {
    blocks[e] = cpu_blocks_of(tr, e / 8.0);
    if (e > 0 && blocks[e] == blocks[e - 1])
      continue; /* the same blocks as the share before */
    if (bound_with_cpu_blocks(tr, p, blocks[e], &bound) &&
        (best < 0 || bound < best_bound * (1 - 1e-9))) {
      best = blocks[e];
      best_bound = bound;
      lo = e > 0 ? blocks[e - 1] : blocks[e];
      hi = e < 8 ? cpu_blocks_of(tr, (e + 1) / 8.0) : blocks[e];
    }
  }
  int coarse = best;
  for (int k = lo + 1; best >= 0 && k < hi; k++)
    if (k != coarse && bound_with_cpu_blocks(tr, p, k, &bound) &&
        (bound < best_bound * (1 - 1e-9) || (k < best && bound <= best_bound * (1 + 1e-9)))) {
      best = k;
      best_bound = bound;
    }
  if (best >= 0)
    choose_cpu_blocks(tr, best);
  else
    tz_train_choose_cpu_steps(tr, c->tierzero.cpu_adam);
  return 0;
}

double tz_trainer_cpu_adam(const tz_trainer *tr) { return tr->cpu_share; }

int tz_trainer_cpu_adam_searched(const tz_trainer *tr) { return tr->cpu_adam_search; }

int tz_trainer_window_carry(const tz_trainer *tr) { return tr->carry; }

const char *tz_trainer_recompute(const tz_trainer *tr, char *buf, size_t len, uint64_t *kept,
                                 double *all_s) {
  if (kept)
    *kept = tz_recompute_kept_bytes(&tr->mc, tr->S, tr->B, tr->T, tr->recompute);
  if (all_s)
    *all_s = tr->recompute_mode == TZ_RECOMPUTE_AUTO ? tr->recompute_all_s : 0;
  return tz_recompute_describe(tr->recompute, tr->L, buf, len);
}

int tz_train_sizes(tz_trainer *tr) {
  int nb = tr->nb;
  tr->numel = calloc((size_t)nb, sizeof *tr->numel);
  tr->padded = calloc((size_t)nb, sizeof *tr->padded);
  tr->shard = calloc((size_t)nb, sizeof *tr->shard);
  tr->seg_off = calloc((size_t)nb, sizeof *tr->seg_off);
  tr->bytes = calloc((size_t)nb, sizeof *tr->bytes);
  tr->home = calloc((size_t)nb, sizeof *tr->home);
  tr->names = calloc((size_t)nb + 1, sizeof *tr->names);
  tr->cpu_step = calloc((size_t)nb, 1);
  tr->acc_off = malloc((size_t)nb * sizeof *tr->acc_off);
  tr->recompute = calloc((size_t)tr->L + 1, 1);
  if (!tr->numel || !tr->padded || !tr->shard || !tr->seg_off || !tr->bytes || !tr->home ||
      !tr->names || !tr->cpu_step || !tr->acc_off || !tr->recompute)
    return tz_err_set(TZ_ENOMEM, "train: no memory");
  for (int b = 0; b < nb; b++)
    tr->acc_off[b] = UINT64_MAX;
  TZ_CHECK(tz_recompute_parse(&tr->cfg, tr->L, &tr->recompute_mode, tr->recompute));
  uint64_t unit = (uint64_t)tr->world * TZ_TRAIN_NORM_SEGMENT;
  for (int b = 0; b < nb; b++) {
    tr->numel[b] = tz_model_block_numel(&tr->mc, b);
    tr->padded[b] = round_up(tr->numel[b], unit);
    tr->shard[b] = tr->padded[b] / (uint64_t)tr->world;
    tr->seg_off[b] = tr->n_seg;
    tr->n_seg += (tr->numel[b] + TZ_TRAIN_NORM_SEGMENT - 1) / TZ_TRAIN_NORM_SEGMENT;
    tr->bytes[b][TZ_PLAN_PARAM] = tr->shard[b] * tr->es;
    for (int k = TZ_PLAN_MASTER; k < TZ_PLAN_STATE_KINDS; k++)
      tr->bytes[b][k] = tr->shard[b] * sizeof(float);
    /* the block's input, whole on every rank: (B, T, C) of S; the embedding has none */
    tr->bytes[b][TZ_PLAN_ACT] = b ? (uint64_t)tr->N * (uint64_t)tr->mc.d_model * tr->es : 0;
    char name[32];
    if (b == 0)
      snprintf(name, sizeof name, "embed");
    else if (b == nb - 1)
      snprintf(name, sizeof name, "head");
    else if (tz_model_block_parts(&tr->mc, b) == TZ_PART_MLP)
      snprintf(name, sizeof name, "layer%d.moe", tz_model_block_layer(&tr->mc, b));
    else
      snprintf(name, sizeof name, "layer%d", tz_model_block_layer(&tr->mc, b));
    if (!(tr->names[b] = strdup(name)))
      return tz_err_set(TZ_ENOMEM, "train: no memory");
  }
  return 0;
}
