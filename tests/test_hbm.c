/* The hbm tier beyond the conformance suite: a CUDA stream waits on fences on the device, the event
 * pool is reused (no cudaEventCreate in the steady state), host arenas are page-locked whichever
 * of the two tiers came first and unregistered when either goes, pinning time is reported,
 * copies are split at registration pieces, pageable buffers are counted, hbm->hbm is direct;
 * the tier's device lanes (tz_lane_create_device) order each other on the device and time marks.
 * Needs a GPU; exits 77 without one. Every wait has a timeout: a hang is a failure. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/lane.h"
#include "core/runtime.h"
#include "core/tier.h"
#include "testlib.h"
#include "tiers/hbm.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_NS (30ll * 1000000000ll)
#define CAP (64ull << 20)

static int n_gpus;

struct env {
  tz_runtime *rt;
  tz_tier *before; /* a host tier created before the hbm tier */
  tz_tier *hbm;
  tz_tier *after; /* and one after */
};

static int make_host(tz_runtime *rt, const char *name, uint64_t cap, tz_tier **out) {
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.name = name;
  p.capacity = cap;
  return tz_tier_create(rt, "host", &p, out);
}

/* settings: the tier's own (tz_tier_params.settings), NULL for none */
static int make_hbm_with(tz_runtime *rt, const char *name, int device, uint64_t cap,
                         const char *settings, tz_tier **out) {
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.name = name;
  p.capacity = cap;
  p.device = device;
  p.settings = settings;
  return tz_tier_create(rt, "hbm", &p, out);
}

static int make_hbm(tz_runtime *rt, const char *name, int device, uint64_t cap, tz_tier **out) {
  return make_hbm_with(rt, name, device, cap, NULL, out);
}

static int setup(void **state) {
  struct env *e = calloc(1, sizeof *e);
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.chunk_bytes = 1 << 20;
  rp.staging_bytes = 8 << 20;
  int rc = tz_runtime_create(&rp, &e->rt);
  if (rc == 0)
    rc = make_host(e->rt, "host-before", CAP, &e->before);
  if (rc == 0)
    rc = make_hbm(e->rt, "hbm", 0, CAP, &e->hbm);
  if (rc == 0)
    rc = make_host(e->rt, "host-after", CAP, &e->after);
  if (rc < 0) {
    print_error("setup: %s\n", tz_err_msg());
    return -1;
  }
  *state = e;
  return 0;
}

static int teardown(void **state) {
  struct env *e = *state;
  tz_runtime_destroy(e->rt);
  free(e);
  return 0;
}

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess)                                                                         \
      print_error("%s: %s\n", #call, cudaGetErrorString(e_));                                      \
    assert_int_equal(e_, cudaSuccess);                                                             \
  } while (0)

static int wait_release(tz_fence *f) {
  int rc = tz_fence_wait(f, WAIT_NS);
  tz_fence_release(f);
  return rc;
}

static enum cudaMemoryType mem_type(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return cudaMemoryTypeUnregistered;
  }
  return a.type;
}

static struct tz_hbm_stats stats(tz_tier *t) {
  struct tz_hbm_stats s;
  TZ_ASSERT_OK(tz_hbm_stats(t, &s));
  return s;
}

/* A copy into HBM, then, on a stream of the test's, a copy out of the same bytes after
 * tz_hbm_stream_wait on the first one's fence. No host wait sits between the two: if the stream
 * did not wait on the device, the copy out would race the copy in and see the previous round's
 * bytes. Both the fence of tz_tier_write (the event's own) and that of tz_transfer (which
 * forwards it) are used. */
static void test_stream_wait_orders_copies(void **state) {
  struct env *e = *state;
  const uint64_t n = 32ull << 20;
  tz_extent hx, hy, gx;
  TZ_ASSERT_OK(tz_tier_alloc(e->before, n, &hx));
  TZ_ASSERT_OK(tz_tier_alloc(e->after, n, &hy));
  TZ_ASSERT_OK(tz_tier_alloc(e->hbm, n, &gx));
  unsigned char *w = tz_tier_host_ptr(e->before, hx.offset);
  unsigned char *r = tz_tier_host_ptr(e->after, hy.offset);
  void *dev = tz_tier_device_ptr(e->hbm, gx.offset);
  assert_non_null(dev);
  cudaStream_t us;
  CUDA_OK(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking));
  struct tz_hbm_stats s0 = stats(e->hbm);
  for (int i = 0; i < 8; i++) {
    tz_test_fill(w, n, 1000 + (uint64_t)i);
    memset(r, 0, n);
    tz_fence *f;
    if (i % 2)
      TZ_ASSERT_OK(tz_transfer(e->rt, &gx, 0, &hx, 0, n, &f));
    else
      TZ_ASSERT_OK(tz_tier_write(&gx, 0, w, n, &f));
    TZ_ASSERT_OK(tz_hbm_stream_wait(e->hbm, f, us));
    CUDA_OK(cudaMemcpyAsync(r, dev, n, cudaMemcpyDeviceToHost, us));
    CUDA_OK(cudaStreamSynchronize(us));
    assert_memory_equal(r, w, n);
    TZ_ASSERT_OK(wait_release(f)); /* before w is refilled */
  }
  struct tz_hbm_stats s1 = stats(e->hbm);
  /* A 32 MiB copy takes far longer than the calls between its submission and the wait: the
   * stream must have waited on an event, not found the fences complete, at least once. */
  assert_true(s1.stream_waits - s0.stream_waits >= 1);
  assert_true(s1.stream_waits - s0.stream_waits <= 8);
  assert_int_equal(s1.pageable_copies, s0.pageable_copies);
  CUDA_OK(cudaStreamDestroy(us));
  tz_tier_free(&hx);
  tz_tier_free(&hy);
  tz_tier_free(&gx);
}

/* Fences a stream cannot wait on are refused; complete ones need nothing; failed ones fail. */
static void test_stream_wait_host_fences(void **state) {
  struct env *e = *state;
  cudaStream_t us;
  CUDA_OK(cudaStreamCreateWithFlags(&us, cudaStreamNonBlocking));
  struct tz_hbm_stats s0 = stats(e->hbm);
  tz_fence *pending = tz_fence_create();
  assert_int_equal(tz_hbm_stream_wait(e->hbm, pending, us), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "cannot wait on a pending host fence"));
  tz_fence_signal(pending, 0);
  TZ_ASSERT_OK(tz_hbm_stream_wait(e->hbm, pending, us));
  tz_fence_release(pending);
  tz_fence *failed = tz_fence_create();
  tz_fence_signal_msg(failed, TZ_EIO, "nvme: read of 4096 bytes at /x offset 0 failed");
  assert_int_equal(tz_hbm_stream_wait(e->hbm, failed, us), TZ_EIO);
  assert_non_null(strstr(tz_err_msg(), "/x offset 0"));
  tz_fence_release(failed);
  tz_fence *done = tz_fence_completed(0);
  assert_int_equal(tz_hbm_stream_wait(e->before, done, us), TZ_EINVAL); /* not an hbm tier */
  tz_fence_release(done);
  assert_int_equal(stats(e->hbm).stream_waits, s0.stream_waits);
  CUDA_OK(cudaStreamSynchronize(us));
  CUDA_OK(cudaStreamDestroy(us));
}

/* 10000 copies, at most 64 in flight: every one takes an event from the pool made at creation. */
static void test_event_pool_reused(void **state) {
  struct env *e = *state;
  enum { N = 10000, DEPTH = 64 };
  const uint64_t piece = 4096;
  tz_extent hx, gx;
  TZ_ASSERT_OK(tz_tier_alloc(e->before, DEPTH * piece, &hx));
  TZ_ASSERT_OK(tz_tier_alloc(e->hbm, DEPTH * piece, &gx));
  unsigned char *w = tz_tier_host_ptr(e->before, hx.offset);
  tz_test_fill(w, DEPTH * piece, 5);
  struct tz_hbm_stats s0 = stats(e->hbm);
  assert_int_equal(s0.events_created, s0.events_at_init);
  tz_fence *ring[DEPTH] = {0};
  for (int i = 0; i < N; i++) {
    int k = i % DEPTH;
    if (ring[k])
      TZ_ASSERT_OK(wait_release(ring[k]));
    uint64_t off = (uint64_t)k * piece;
    if (i % 2)
      TZ_ASSERT_OK(tz_tier_read(&gx, off, w + off, piece, &ring[k]));
    else
      TZ_ASSERT_OK(tz_tier_write(&gx, off, w + off, piece, &ring[k]));
  }
  for (int k = 0; k < DEPTH; k++)
    TZ_ASSERT_OK(wait_release(ring[k]));
  struct tz_hbm_stats s1 = stats(e->hbm);
  assert_int_equal(s1.events_created, s0.events_created);
  assert_int_equal(s1.h2d_copies - s0.h2d_copies, N / 2);
  assert_int_equal(s1.d2h_copies - s0.d2h_copies, N / 2);
  /* The engine drops its reference to a fence just after signalling it: the last events come
   * back to the pool a moment after the waits return. */
  for (int i = 0; i < 10000 && stats(e->hbm).events_in_use; i++) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  assert_int_equal(stats(e->hbm).events_in_use, 0);
  tz_tier_free(&hx);
  tz_tier_free(&gx);
}

/* Host arenas made before and after the hbm tier are page-locked, the time it took reported. */
static void test_pinning_reported(void **state) {
  struct env *e = *state;
  struct tz_hbm_stats s = stats(e->hbm);
  assert_int_equal(s.pinned_arenas, 3); /* staging, host-before, host-after */
  assert_true(s.pinned_bytes >= 2 * CAP + (8 << 20));
  assert_true(s.pin_seconds > 0);
  double per_gib = tz_hbm_pin_seconds_per_gib(e->hbm);
  assert_true(per_gib > 0 && per_gib < 1000);
  print_message("pinned %.3f GiB at %.3f s/GiB\n", (double)s.pinned_bytes / (1 << 30), per_gib);
  assert_int_equal(mem_type(tz_tier_host_ptr(e->before, 0)), cudaMemoryTypeHost);
  assert_int_equal(mem_type(tz_tier_host_ptr(e->after, 0)), cudaMemoryTypeHost);
  assert_int_equal(mem_type(tz_tier_host_ptr(e->after, CAP - 4096)), cudaMemoryTypeHost);
  char why[256];
  int gds = tz_hbm_gds_usable(why, sizeof why);
  assert_true(gds == 0 || gds == 1);
  assert_true(strlen(why) > 0);
  print_message("GPUDirect Storage: %s (%s)\n", gds ? "usable" : "not usable", why);
}

/* Registration follows the tiers' lives, whichever goes first. */
static void test_registration_lifecycle(void **state) {
  (void)state;
  tz_runtime *rt;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt));
  tz_tier *before, *hbm, *after;
  TZ_ASSERT_OK(make_host(rt, "before", 16 << 20, &before));
  void *bp = tz_tier_host_ptr(before, 0);
  assert_int_equal(mem_type(bp), cudaMemoryTypeUnregistered);
  TZ_ASSERT_OK(make_hbm(rt, "hbm", 0, 16 << 20, &hbm));
  assert_int_equal(mem_type(bp), cudaMemoryTypeHost);
  TZ_ASSERT_OK(make_host(rt, "after", 16 << 20, &after));
  assert_int_equal(mem_type(tz_tier_host_ptr(after, 0)), cudaMemoryTypeHost);
  assert_int_equal(stats(hbm).pinned_arenas, 3);
  tz_tier_destroy(after); /* the host tier goes first: the hbm tier lets its arena go */
  assert_int_equal(stats(hbm).pinned_arenas, 2);
  tz_tier_destroy(hbm); /* the hbm tier goes first: the host arena is pageable again */
  assert_int_equal(mem_type(bp), cudaMemoryTypeUnregistered);
  TZ_ASSERT_OK(make_hbm(rt, "hbm-again", 0, 16 << 20, &hbm));
  assert_int_equal(mem_type(bp), cudaMemoryTypeHost);
  tz_runtime_destroy(rt);
}

/* A host arena registered in 1 MiB pieces: copies that cross pieces are split, and stay fast.
 * The piece from the tier's settings, or (by_env) from TZ_HBM_PIN_PIECE. */
static void copies_split_at_pieces(int by_env) {
  if (by_env)
    setenv("TZ_HBM_PIN_PIECE", "1MiB", 1);
  tz_runtime *rt;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt));
  tz_tier *host, *hbm;
  TZ_ASSERT_OK(make_host(rt, "host", 16 << 20, &host));
  TZ_ASSERT_OK(make_hbm_with(rt, "hbm", 0, 16 << 20, by_env ? NULL : "pin_piece=1MiB", &hbm));
  unsetenv("TZ_HBM_PIN_PIECE");
  tz_extent hx, gx;
  const uint64_t n = 5 * (1 << 20) + 8192;
  TZ_ASSERT_OK(tz_tier_alloc(host, 12 << 20, &hx));
  TZ_ASSERT_OK(tz_tier_alloc(hbm, 12 << 20, &gx));
  unsigned char *p = tz_tier_host_ptr(host, hx.offset);
  unsigned char *w = malloc(n);
  tz_test_fill(w, n, 77);
  memcpy(p + (512 << 10), w, n); /* starts in the middle of a piece, crosses five boundaries */
  tz_fence *f;
  TZ_ASSERT_OK(tz_transfer(rt, &gx, 4096, &hx, 512 << 10, n, &f));
  TZ_ASSERT_OK(wait_release(f));
  memset(p, 0, 12 << 20);
  TZ_ASSERT_OK(tz_transfer(rt, &hx, (3 << 20) + 4096, &gx, 4096, n, &f));
  TZ_ASSERT_OK(wait_release(f));
  assert_memory_equal(p + (3 << 20) + 4096, w, n);
  assert_int_equal(stats(hbm).pageable_copies, 0);
  free(w);
  tz_runtime_destroy(rt);
}

static void test_copies_split_at_pieces(void **state) {
  (void)state;
  copies_split_at_pieces(1);
  copies_split_at_pieces(0);
}

/* The tier's settings are checked before anything is made, each refusal naming the setting; a
 * tier without settings refuses any. */
static void test_settings_refused(void **state) {
  (void)state;
  tz_runtime *rt;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt));
  static const struct {
    const char *settings, *msg;
  } bad[] = {
      {"pin_piece=3000", "pin_piece"},      /* not a multiple of 4096 */
      {"pin_piece=128GiB", "pin_piece"},    /* more than cudaHostRegister takes */
      {"pin_piece=2 parsecs", "pin_piece"}, /* not a size */
      {"gds=maybe", "gds"},
      {"colour=red", "no setting \"colour\""},
  };
  tz_tier *t = NULL;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(make_hbm_with(rt, "hbm", 0, 1 << 20, bad[i].settings, &t), TZ_ECONFIG);
    if (!strstr(tz_err_msg(), bad[i].msg))
      fail_msg("%s: %s", bad[i].settings, tz_err_msg());
  }
  setenv("TZ_GDS", "perhaps", 1);
  assert_int_equal(make_hbm(rt, "hbm", 0, 1 << 20, &t), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "TZ_GDS"));
  unsetenv("TZ_GDS");
  assert_int_equal(tz_tier_settings_check("hbm", "gds=off,pin_piece=2MiB"), 0);
  assert_int_equal(tz_tier_settings_check("host", "gds=off"), TZ_ECONFIG);
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.capacity = 1 << 20;
  p.settings = "gds=off";
  assert_int_equal(tz_tier_create(rt, "host", &p, &t), TZ_ECONFIG);
  TZ_ASSERT_OK(make_hbm_with(rt, "hbm", 0, 1 << 20, "gds=off,pin_piece=2MiB", &t));
  tz_runtime_destroy(rt);
}

/* Pageable buffers work, and are counted as the slow path they are. */
static void test_pageable_counted(void **state) {
  struct env *e = *state;
  const uint64_t n = 3 << 20;
  tz_extent gx;
  TZ_ASSERT_OK(tz_tier_alloc(e->hbm, n, &gx));
  unsigned char *w = malloc(n), *r = malloc(n);
  tz_test_fill(w, n, 8);
  memset(r, 0, n);
  struct tz_hbm_stats s0 = stats(e->hbm);
  TZ_ASSERT_OK(tz_tier_write_sync(&gx, 0, w, n));
  TZ_ASSERT_OK(tz_tier_read_sync(&gx, 0, r, n));
  assert_memory_equal(r, w, n);
  assert_int_equal(stats(e->hbm).pageable_copies - s0.pageable_copies, 2);
  free(w);
  free(r);
  tz_tier_free(&gx);
}

/* hbm->hbm goes direct (a device copy), never staged, within a GPU and between two. */
static void check_d2d(struct env *e, tz_tier *other) {
  const uint64_t n = 6 << 20;
  tz_extent a, b, hx;
  TZ_ASSERT_OK(tz_tier_alloc(e->hbm, n, &a));
  TZ_ASSERT_OK(tz_tier_alloc(other, n, &b));
  TZ_ASSERT_OK(tz_tier_alloc(e->before, n, &hx));
  unsigned char *p = tz_tier_host_ptr(e->before, hx.offset);
  tz_test_fill(p, n, 31);
  unsigned char *w = malloc(n);
  memcpy(w, p, n);
  TZ_ASSERT_OK(tz_tier_write_sync(&a, 0, p, n));
  struct tz_pair_stats ps[64];
  int np = tz_runtime_pair_stats(e->rt, ps, 64);
  uint64_t staged0 = 0;
  for (int i = 0; i < np; i++)
    staged0 += ps[i].staged;
  uint64_t d2d0 = stats(other).d2d_copies;
  tz_fence *f;
  TZ_ASSERT_OK(tz_transfer(e->rt, &b, 0, &a, 0, n, &f));
  TZ_ASSERT_OK(wait_release(f));
  memset(p, 0, n);
  TZ_ASSERT_OK(tz_tier_read_sync(&b, 0, p, n));
  assert_memory_equal(p, w, n);
  assert_int_equal(stats(other).d2d_copies - d2d0, 1);
  np = tz_runtime_pair_stats(e->rt, ps, 64);
  uint64_t staged1 = 0;
  for (int i = 0; i < np; i++)
    staged1 += ps[i].staged;
  assert_int_equal(staged1, staged0);
  free(w);
  tz_tier_free(&a);
  tz_tier_free(&b);
  tz_tier_free(&hx);
}

static void test_hbm_to_hbm(void **state) {
  struct env *e = *state;
  check_d2d(e, e->hbm); /* within one tier */
  tz_tier *second;
  TZ_ASSERT_OK(make_hbm(e->rt, "hbm-second", 0, 16 << 20, &second));
  check_d2d(e, second);
  tz_tier_destroy(second);
  if (n_gpus < 2) {
    print_message("one GPU: the peer copy is not tested\n");
    return;
  }
  tz_tier *peer;
  TZ_ASSERT_OK(make_hbm(e->rt, "hbm-gpu1", 1, 16 << 20, &peer));
  /* The host arenas were page-locked by GPU 0's tier; GPU 1's shares that registration. */
  struct tz_hbm_stats s = stats(peer);
  assert_int_equal(s.pinned_arenas, 3);
  assert_int_equal(s.pinned_bytes, 0);
  check_d2d(e, peer);
  tz_tier_destroy(peer);
  assert_int_equal(mem_type(tz_tier_host_ptr(e->before, 0)), cudaMemoryTypeHost);
}

/* Host functions on the lanes' streams: the first sleeps, then sets the flag; the second, on the
 * other stream after tz_lane_order, reads it. */
static volatile int g_flag, g_seen = -1;
static void CUDART_CB set_late(void *arg) {
  (void)arg;
  struct timespec ts = {0, 100 * 1000 * 1000};
  nanosleep(&ts, NULL);
  g_flag = 1;
}
static void CUDART_CB read_flag(void *arg) {
  (void)arg;
  g_seen = g_flag;
}

/* Two device lanes of the hbm tier, one on its own stream and one on the caller's: tz_lane_order
 * makes the second wait on the device for the first (both ways), without a host fence; timing
 * marks read the time of the first's sleep; the registry refuses a host tier. */
static void test_device_lanes(void **state) {
  struct env *e = *state;
  cudaStream_t mine;
  CUDA_OK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  tz_lane *a = NULL, *b = NULL;
  TZ_ASSERT_OK(tz_lane_create_device(e->hbm, NULL, NULL, &a));
  TZ_ASSERT_OK(tz_lane_create_device(e->hbm, mine, "comm", &b));
  assert_string_equal(tz_lane_name(a), "compute:0");
  assert_string_equal(tz_lane_name(b), "comm");
  assert_ptr_equal(tz_lane_native(b), (void *)mine);
  assert_ptr_not_equal(tz_lane_native(a), (void *)mine);
  tz_lane_timer *t = NULL;
  TZ_ASSERT_OK(tz_lane_timer_create(a, 2, &t));
  struct tz_lane_stats s0, s1;
  tz_lane_stats(b, &s0);
  for (int dir = 0; dir < 2; dir++) {
    tz_lane *from = dir ? b : a, *to = dir ? a : b;
    g_flag = 0;
    g_seen = -1;
    if (!dir)
      TZ_ASSERT_OK(tz_lane_timer_mark(t, 0));
    CUDA_OK(cudaLaunchHostFunc(tz_lane_native(from), set_late, NULL));
    if (!dir)
      TZ_ASSERT_OK(tz_lane_timer_mark(t, 1));
    TZ_ASSERT_OK(tz_lane_order(from, to));
    CUDA_OK(cudaLaunchHostFunc(tz_lane_native(to), read_flag, NULL));
    CUDA_OK(cudaStreamSynchronize(tz_lane_native(to)));
    assert_int_equal(g_seen, 1);
  }
  CUDA_OK(cudaStreamSynchronize(tz_lane_native(a)));
  tz_lane_stats(b, &s1);
  assert_int_equal(s1.waits, s0.waits); /* ordered on the device: no wait measured */
  double sec = 0;
  TZ_ASSERT_OK(tz_lane_timer_elapsed(t, 0, 1, &sec));
  assert_true(sec >= 0.09 && sec < 10);
  assert_int_equal(tz_lane_timer_mark(t, 2), TZ_EINVAL);
  tz_lane_timer_destroy(t);
  tz_lane_destroy(a);
  tz_lane_destroy(b);
  CUDA_OK(cudaStreamDestroy(mine));
  assert_int_equal(tz_lane_create_device(e->before, NULL, NULL, &a), TZ_ENOTSUP);
  assert_null(a);
}

int main(void) {
  char why[256];
  if (tz_tier_probe("hbm", why, sizeof why) < 0)
    tz_test_skip("%s", why);
  if (cudaGetDeviceCount(&n_gpus) != cudaSuccess || n_gpus < 1)
    tz_test_skip("hbm: no CUDA device");
  if (cudaSetDevice(0) != cudaSuccess)
    tz_test_skip("hbm: cudaSetDevice(0) failed");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_stream_wait_orders_copies, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stream_wait_host_fences, setup, teardown),
      cmocka_unit_test_setup_teardown(test_event_pool_reused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pinning_reported, setup, teardown),
      cmocka_unit_test(test_registration_lifecycle),
      cmocka_unit_test(test_copies_split_at_pieces),
      cmocka_unit_test(test_settings_refused),
      cmocka_unit_test_setup_teardown(test_pageable_counted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hbm_to_hbm, setup, teardown),
      cmocka_unit_test_setup_teardown(test_device_lanes, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
