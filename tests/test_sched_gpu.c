/* The scheduler with a CUDA-stream compute lane (tz_hbm_lane_create) and the compute tier in GPU
 * memory: blocks homed in host memory or in nvme (a directory under /var/tmp; their fills and
 * write-backs go through the scheduler's pinned staging chunks, so that the lane still waits on
 * copy events only), or in the GPU's memory itself (used in place), phases whose "compute" is
 * copies and memsets launched on the lane's stream, several steps, results checked byte for byte
 * against a host model after tz_sched_sync. The lane waits on the device only: it refuses a
 * pending host fence, and the scheduler never hands it one (a refusal would fail the run). Skips
 * (77) without a GPU.
 *
 * Per layer l: W (read), G (written whole), A (read and written). Phase fwd_l: A's first half
 * moves to its second half, then its first half is set to a byte of (step, l). Phase bwd_l (layers
 * in reverse): G = W, then G's first quarter is set to a byte of (step, l). */
#include "core/error.h"
#include "core/lane.h"
#include "core/runtime.h"
#include "core/sched.h"
#include "core/tier.h"
#include "testlib.h"
#include "tiers/hbm.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { L = 4, STEPS = 5, B = 256 << 10, CHUNK = 256 << 10 };

struct env {
  tz_runtime *rt;
  tz_tier *host, *hbm, *nvme; /* nvme: NULL unless the homes are there */
  char *dir;                  /* the nvme tier's directory */
  tz_lane *lane;
  tz_sched *s;
  tz_extent homes[3 * L];
  int w[L], g[L], a[L];
};

/* chunk: the runtime's chunk, which is also the size of the scheduler's staging chunks. */
static void env_make(struct env *e, uint64_t chunk) {
  memset(e, 0, sizeof *e);
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.chunk_bytes = chunk;
  rp.staging_bytes = 4 * CHUNK;
  TZ_ASSERT_OK(tz_runtime_create(&rp, &e->rt));
  struct tz_tier_params tp;
  tz_tier_params_init(&tp);
  tp.name = "home";
  tp.capacity = 3 * L * (uint64_t)B + (1 << 20);
  TZ_ASSERT_OK(tz_tier_create(e->rt, "host", &tp, &e->host));
  tz_tier_params_init(&tp);
  tp.name = "compute";
  tp.capacity = 16 << 20;
  tp.device = 0;
  TZ_ASSERT_OK(tz_tier_create(e->rt, "hbm", &tp, &e->hbm));
  TZ_ASSERT_OK(tz_hbm_lane_create(e->hbm, &e->lane));
}

/* An nvme tier for the homes, in a directory of its own under /var/tmp. */
static void env_add_nvme(struct env *e) {
  e->dir = strdup("/var/tmp/tz-sched-gpu-XXXXXX");
  assert_non_null(e->dir);
  assert_non_null(mkdtemp(e->dir));
  struct tz_tier_params tp;
  tz_tier_params_init(&tp);
  tp.name = "nvme";
  tp.capacity = 3 * L * (uint64_t)B + (1 << 20);
  tp.paths[0] = e->dir;
  tp.n_paths = 1;
  TZ_ASSERT_OK(tz_tier_create(e->rt, "nvme", &tp, &e->nvme));
}

static void env_free(struct env *e) {
  tz_sched_destroy(e->s);
  tz_lane_destroy(e->lane);
  tz_runtime_destroy(e->rt);
  if (e->dir)
    tz_test_rmdir(e->dir);
}

/* 1: the A blocks (read and written by forward) are homed in the GPU's memory, the compute tier,
 * and used in place; W and G stay in host memory or nvme. */
static int a_in_place;

static unsigned char fwd_byte(int step, int l) { return (unsigned char)(1 + 16 * step + l); }
static unsigned char bwd_byte(int step, int l) { return (unsigned char)(101 + 16 * step + l); }

/* What a phase's job launches: device pointers from the view, the stream from the lane. */
struct job {
  tz_lane *lane;
  unsigned char *src, *dst; /* bwd: W, G; fwd: A, A */
  unsigned char value;
  int fwd;
};

static int launch(void *arg) {
  const struct job *j = arg;
  cudaStream_t st = tz_lane_native(j->lane);
  cudaError_t e;
  if (j->fwd) {
    e = cudaMemcpyAsync(j->dst + B / 2, j->src, B / 2, cudaMemcpyDeviceToDevice, st);
    if (e == cudaSuccess)
      e = cudaMemsetAsync(j->dst, j->value, B / 2, st);
  } else {
    e = cudaMemcpyAsync(j->dst, j->src, B, cudaMemcpyDeviceToDevice, st);
    if (e == cudaSuccess)
      e = cudaMemsetAsync(j->dst, j->value, B / 4, st);
  }
  if (e != cudaSuccess)
    return tz_err_set(TZ_ECUDA, "test: launch on the lane's stream: %s", cudaGetErrorString(e));
  return 0;
}

static void *view_ptr(const struct tz_view *v, int block) {
  for (int k = 0; k < v->n_blocks; k++)
    if (v->blocks[k].block == block)
      return v->blocks[k].ptr;
  fail_msg("block %d is not in phase '%s'", block, v->name);
  return NULL;
}

static void check_block(struct env *e, int id, const unsigned char *want, const char *what) {
  unsigned char *got = malloc(B);
  assert_non_null(got);
  TZ_ASSERT_OK(tz_sched_block_load(e->s, id, got));
  for (int i = 0; i < B; i++)
    if (got[i] != want[i]) {
      print_error("%s: byte %d is %d, expected %d\n", what, i, got[i], want[i]);
      fail();
    }
  free(got);
}

/* Steps over blocks homed in host memory (nvme 0) or nvme (1) within `budget` (0: generous), with
 * jitter on the scheduler's host lanes; checks every block after each step's sync against the
 * host model. nvme homes use a quarter of a block as the chunk: each fill and write-back moves
 * four pieces through one staging chunk. */
static void run_steps(uint64_t budget, int jitter_us, int nvme) {
  struct env e;
  env_make(&e, nvme ? CHUNK / 4 : CHUNK);
  if (nvme)
    env_add_nvme(&e);
  struct tz_sched_params p;
  tz_sched_params_init(&p);
  p.compute = e.hbm;
  p.lane = e.lane;
  p.budget = budget;
  p.lookahead = 2;
  p.jitter_us = jitter_us;
  p.seed = 5;
  p.timeout_ms = 20000;
  TZ_ASSERT_OK(tz_sched_create(e.rt, &p, &e.s));
  unsigned char *wref[L], *aref[L], *gref[L];
  unsigned char *buf = aligned_alloc(4096, B); /* aligned for the nvme tier's direct I/O */
  assert_non_null(buf);
  for (int l = 0; l < L; l++) {
    int *ids[3] = {&e.w[l], &e.g[l], &e.a[l]};
    const char *kind[3] = {"w", "g", "a"};
    for (int k = 0; k < 3; k++) {
      tz_extent *h = &e.homes[3 * l + k];
      TZ_ASSERT_OK(tz_tier_alloc(a_in_place && k == 2 ? e.hbm : nvme ? e.nvme : e.host, B, h));
      tz_test_fill(buf, B, 1000 + 10 * (uint64_t)l + (uint64_t)k);
      TZ_ASSERT_OK(tz_tier_write_sync(h, 0, buf, B));
      char name[16];
      snprintf(name, sizeof name, "L%d.%s", l, kind[k]);
      TZ_ASSERT_OK(tz_sched_block_add(e.s, name, B, h, ids[k]));
    }
    wref[l] = malloc(B);
    aref[l] = malloc(B);
    gref[l] = malloc(B);
    assert_true(wref[l] && aref[l] && gref[l]);
    tz_test_fill(wref[l], B, 1000 + 10 * (uint64_t)l);
    tz_test_fill(gref[l], B, 1000 + 10 * (uint64_t)l + 1);
    tz_test_fill(aref[l], B, 1000 + 10 * (uint64_t)l + 2);
  }
  struct tz_block_use uses[2 * L][2];
  struct tz_phase_decl ph[2 * L];
  char names[2 * L][16];
  for (int l = 0; l < L; l++) {
    uses[l][0] = (struct tz_block_use){e.a[l], TZ_ACCESS_READWRITE};
    snprintf(names[l], sizeof names[l], "fwd%d", l);
    ph[l] = (struct tz_phase_decl){names[l], uses[l], 1};
    int b = L + (L - 1 - l); /* backward runs the layers in reverse */
    uses[b][0] = (struct tz_block_use){e.w[l], TZ_ACCESS_READ};
    uses[b][1] = (struct tz_block_use){e.g[l], TZ_ACCESS_WRITE};
    snprintf(names[b], sizeof names[b], "bwd%d", l);
    ph[b] = (struct tz_phase_decl){names[b], uses[b], 2};
  }
  if (budget) { /* a small budget: blocks are evicted and brought in again */
    uint64_t min;
    TZ_ASSERT_OK(tz_sched_min_budget(e.s, ph, 2 * L, &min));
    assert_true(min <= budget);
  }
  TZ_ASSERT_OK(tz_sched_declare(e.s, ph, 2 * L));

  /* The lane waits on device events only: a pending host fence is refused, nothing enqueued. */
  tz_fence *host = tz_fence_create();
  assert_non_null(host);
  assert_int_equal(tz_lane_wait(e.lane, host, NULL), TZ_EINVAL);
  tz_fence_signal(host, 0);
  tz_fence_release(host);

  for (int step = 0; step < STEPS; step++) {
    for (int i = 0; i < 2 * L; i++) {
      struct tz_view v;
      TZ_ASSERT_OK(tz_sched_enter(e.s, i, &v));
      assert_ptr_equal(v.lane, e.lane);
      struct job j = {.lane = e.lane, .fwd = i < L};
      if (j.fwd) {
        int l = i;
        j.src = j.dst = view_ptr(&v, e.a[l]);
        if (a_in_place) /* the view is the home itself */
          assert_ptr_equal(j.src, tz_tier_device_ptr(e.hbm, e.homes[3 * l + 2].offset));
        j.value = fwd_byte(step, l);
        memmove(aref[l] + B / 2, aref[l], B / 2);
        memset(aref[l], j.value, B / 2);
      } else {
        int l = L - 1 - (i - L);
        j.src = view_ptr(&v, e.w[l]);
        j.dst = view_ptr(&v, e.g[l]);
        j.value = bwd_byte(step, l);
        memcpy(gref[l], wref[l], B);
        memset(gref[l], j.value, B / 4);
      }
      TZ_ASSERT_OK(tz_sched_submit(e.s, launch, &j));
      TZ_ASSERT_OK(tz_sched_leave(e.s, i));
    }
    TZ_ASSERT_OK(tz_sched_step_end(e.s));
    if (step == 0 || step == STEPS - 1) {
      TZ_ASSERT_OK(tz_sched_sync(e.s));
      for (int l = 0; l < L; l++) {
        char what[64];
        snprintf(what, sizeof what, "step %d L%d.w", step, l);
        check_block(&e, e.w[l], wref[l], what);
        snprintf(what, sizeof what, "step %d L%d.g", step, l);
        check_block(&e, e.g[l], gref[l], what);
        snprintf(what, sizeof what, "step %d L%d.a", step, l);
        check_block(&e, e.a[l], aref[l], what);
        /* After the sync the homes hold the latest bytes too. */
        TZ_ASSERT_OK(tz_tier_read_sync(&e.homes[3 * l + 2], 0, buf, B));
        assert_memory_equal(buf, aref[l], B);
      }
    }
  }
  TZ_ASSERT_OK(tz_sched_sync(e.s));

  struct tz_sched_stats st;
  tz_sched_stats(e.s, &st);
  assert_int_equal(st.phases, (uint64_t)(2 * L * STEPS));
  assert_int_equal(st.over_budget, 0);
  assert_true(st.peak_used <= st.budget);
  assert_true(st.stall_s >= 0);
  assert_true(st.compute_s > 0);
  /* Every W and A at least once; A not at all when it is used in place. */
  assert_true(st.fills >= (uint64_t)(a_in_place ? L : 2 * L));
  assert_int_equal(st.in_place, a_in_place ? (uint64_t)(L * STEPS) : 0);
  for (int l = 0; l < L && a_in_place; l++) {
    uint64_t fills, flushes;
    TZ_ASSERT_OK(tz_sched_block_stats(e.s, e.a[l], &fills, &flushes, NULL));
    assert_int_equal(fills + flushes, 0);
  }
  struct tz_sched_phase_stats ps[2 * L];
  assert_int_equal(tz_sched_phase_stats(e.s, ps, 2 * L), 2 * L);
  for (int i = 0; i < 2 * L; i++) {
    assert_int_equal(ps[i].runs, STEPS);
    assert_true(ps[i].stall_s >= 0);
    assert_true(ps[i].stalls <= ps[i].runs);
  }
  struct tz_lane_stats ls;
  tz_lane_stats(e.lane, &ls);
  assert_true(ls.stall_s >= 0);
  assert_int_equal(ls.jobs, (uint64_t)(2 * L * STEPS));
  /* The lane's inputs went to the stream (a wait on the copy's event, or none when the copy had
   * completed by then: which of the two depends on timing), never to a host wait. */
  struct tz_hbm_stats hs;
  TZ_ASSERT_OK(tz_hbm_stats(e.hbm, &hs));
  assert_true(hs.stream_waits + hs.waits_done > 0);
  assert_true(hs.h2d_copies > 0 && hs.d2h_copies > 0);
  assert_int_equal(hs.d2d_copies, 0); /* nothing copied from HBM homes into the window */
  /* nvme homes: two staging chunks (nvme->compute, compute->nvme) of the runtime's chunk, and
   * every byte moved went through them, none through the runtime's own staged path. */
  assert_int_equal(st.staging, nvme ? 2 * tz_runtime_chunk_bytes(e.rt) : 0);
  if (nvme) {
    struct tz_pair_stats pst[32];
    int np = tz_runtime_pair_stats(e.rt, pst, 32);
    uint64_t in = 0, out = 0;
    for (int i = 0; i < np && i < 32; i++) {
      assert_int_equal(pst[i].staged, 0);
      if (strcmp(pst[i].src, "sched-staging") == 0 && strcmp(pst[i].dst, "compute") == 0)
        in += pst[i].bytes;
      if (strcmp(pst[i].src, "compute") == 0 && strcmp(pst[i].dst, "sched-staging") == 0)
        out += pst[i].bytes;
      assert_false(strcmp(pst[i].src, "nvme") == 0 && strcmp(pst[i].dst, "compute") == 0);
    }
    assert_int_equal(in, st.fill_bytes);
    assert_int_equal(out, st.flush_bytes);
  }
  printf("budget %llu: %llu fills, %llu write-backs, %llu evictions, stall %.3f ms, compute "
         "%.3f ms, %llu stream waits (%llu inputs already done)\n",
         (unsigned long long)st.budget, (unsigned long long)st.fills,
         (unsigned long long)st.flushes, (unsigned long long)st.evictions, 1e3 * st.stall_s,
         1e3 * st.compute_s, (unsigned long long)hs.stream_waits,
         (unsigned long long)hs.waits_done);
  for (int l = 0; l < L; l++) {
    free(wref[l]);
    free(aref[l]);
    free(gref[l]);
  }
  free(buf);
  env_free(&e);
}

static void test_generous(void **state) {
  (void)state;
  run_steps(0, 0, 0);
}

/* Two phases' working sets plus the chunk: the window evicts and refills every step. */
static void test_tight(void **state) {
  (void)state;
  run_steps(4 * (uint64_t)B + CHUNK, 0, 0);
}

static void test_tight_jitter(void **state) {
  (void)state;
  run_steps(4 * (uint64_t)B + CHUNK, 200, 0);
}

/* A homed in HBM, used in place, beside W and G streamed from host memory. */
static void test_in_place(void **state) {
  (void)state;
  a_in_place = 1;
  run_steps(0, 0, 0);
  run_steps(2 * (uint64_t)B + CHUNK, 200, 0); /* the minimum: W and G of one phase, a chunk */
  a_in_place = 0;
}

static int nvme_usable(void) {
  char why[256];
  if (tz_tier_probe("nvme", why, sizeof why) < 0) {
    print_message("nvme unavailable (%s): nothing to check\n", why);
    return 0;
  }
  return 1;
}

/* nvme homes: fills nvme -> staging chunk -> GPU, write-backs back the same way. */
static void test_nvme_generous(void **state) {
  (void)state;
  if (nvme_usable())
    run_steps(0, 0, 1);
}

static void test_nvme_tight(void **state) {
  (void)state;
  if (nvme_usable())
    run_steps(4 * (uint64_t)B + CHUNK, 0, 1);
}

static void test_nvme_tight_jitter(void **state) {
  (void)state;
  if (nvme_usable())
    run_steps(4 * (uint64_t)B + CHUNK, 200, 1);
}

/* A recorded fence of the lane is a device event: another stream can wait on it without the
 * host (tz_hbm_stream_wait accepts it), and a failing job poisons the lane's next fence. */
static int fail_job(void *arg) {
  (void)arg;
  return tz_err_set(TZ_EIO, "test: an injected job failure");
}

static void test_lane_fences(void **state) {
  (void)state;
  struct env e;
  env_make(&e, CHUNK);
  tz_fence *f;
  TZ_ASSERT_OK(tz_lane_record(e.lane, &f));
  cudaStream_t other;
  assert_int_equal(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  TZ_ASSERT_OK(tz_hbm_stream_wait(e.hbm, f, other));
  assert_int_equal(cudaStreamSynchronize(other), cudaSuccess);
  TZ_ASSERT_OK(tz_fence_wait(f, 10ll * 1000 * 1000 * 1000));
  tz_fence_release(f);
  TZ_ASSERT_OK(tz_lane_submit(e.lane, fail_job, NULL));
  TZ_ASSERT_OK(tz_lane_record(e.lane, &f));
  assert_int_equal(tz_fence_wait(f, 10ll * 1000 * 1000 * 1000), TZ_EIO);
  assert_non_null(strstr(tz_err_msg(), "injected job failure"));
  tz_fence_release(f);
  assert_int_equal(cudaStreamDestroy(other), cudaSuccess);
  env_free(&e);
}

int main(void) {
  char why[256];
  int n = 0;
  if (tz_tier_probe("hbm", why, sizeof why) < 0)
    tz_test_skip("%s", why);
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1)
    tz_test_skip("hbm: no CUDA device");
  if (cudaSetDevice(0) != cudaSuccess)
    tz_test_skip("hbm: cudaSetDevice(0) failed");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_generous),          cmocka_unit_test(test_tight),
      cmocka_unit_test(test_tight_jitter),      cmocka_unit_test(test_lane_fences),
      cmocka_unit_test(test_nvme_generous),     cmocka_unit_test(test_nvme_tight),
      cmocka_unit_test(test_nvme_tight_jitter), cmocka_unit_test(test_in_place),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
