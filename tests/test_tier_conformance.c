/* The tier conformance suite: every tier backend, and the pairs it forms with the others, must
 * pass the same tests. argv[1] names the tier under test (host, nvme, nvme-striped, fault-nvme,
 * hbm), argv[2] the directory for nvme files. Every wait has a timeout: a hang is a failure. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/runtime.h"
#include "core/tier.h"
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_NS (30ll * 1000000000ll)
#define CAPACITY (64ull << 20)

static const char *kind;
static char *dir;

struct env {
  tz_runtime *rt;
  tz_tier *t;     /* the tier under test */
  tz_tier *base;  /* fault-nvme: the nvme tier the fault tier wraps */
  tz_tier *host;  /* a host tier beside it */
  tz_tier *nvme2; /* another nvme tier, so that transfers to it are staged */
};

static int make_tier(struct env *e, const char *faults) {
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.chunk_bytes = 1 << 20;
  rp.staging_bytes = 8 << 20;
  int rc = tz_runtime_create(&rp, &e->rt);
  if (rc < 0)
    return rc;
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.capacity = CAPACITY;
  p.name = "under-test";
  if (strcmp(kind, "host") == 0) {
    rc = tz_tier_create(e->rt, "host", &p, &e->t);
  } else if (strcmp(kind, "hbm") == 0) {
    rc = tz_tier_create(e->rt, "hbm", &p, &e->t);
  } else {
    p.paths[0] = dir;
    p.n_paths = 1;
    if (strcmp(kind, "nvme-striped") == 0) {
      p.paths[1] = dir; /* two files, as for two drives */
      p.n_paths = 2;
      p.stripe_bytes = 256 << 10;
    }
    p.faults = faults;
    if (strcmp(kind, "fault-nvme") == 0) {
      tz_tier *base;
      p.name = "base";
      rc = tz_tier_create(e->rt, "nvme", &p, &base);
      struct tz_tier_params fp;
      tz_tier_params_init(&fp);
      fp.name = "under-test";
      fp.base = base;
      fp.faults = faults;
      if (rc == 0)
        rc = tz_tier_create(e->rt, "fault", &fp, &e->t);
      e->base = base;
    } else {
      rc = tz_tier_create(e->rt, "nvme", &p, &e->t);
    }
  }
  if (rc < 0)
    return rc;
  tz_tier_params_init(&p);
  p.capacity = CAPACITY;
  p.name = "host-beside";
  rc = tz_tier_create(e->rt, "host", &p, &e->host);
  if (rc < 0)
    return rc;
  p.name = "nvme-beside";
  p.paths[0] = "/var/tmp";
  p.n_paths = 1;
  return tz_tier_create(e->rt, "nvme", &p, &e->nvme2);
}

static int setup(void **state) {
  struct env *e = calloc(1, sizeof *e);
  int rc = make_tier(e, NULL);
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

static void *buf_alloc(uint64_t n) {
  void *p = NULL;
  assert_int_equal(posix_memalign(&p, 4096, n ? n : 1), 0);
  return p;
}

static int wait_release(tz_fence *f) {
  int rc = tz_fence_wait(f, WAIT_NS);
  tz_fence_release(f);
  return rc;
}

static void test_alloc_alignment(void **state) {
  struct env *e = *state;
  uint64_t a = tz_tier_alignment(e->t);
  assert_true(a >= 256 && (a & (a - 1)) == 0);
  tz_extent x[16];
  for (int i = 0; i < 16; i++) {
    TZ_ASSERT_OK(tz_tier_alloc(e->t, 1000 + (uint64_t)i * 4097, &x[i]));
    assert_int_equal(x[i].offset % a, 0);
    assert_true(x[i].bytes >= 1000 + (uint64_t)i * 4097);
    assert_int_equal(x[i].bytes % a, 0);
    for (int j = 0; j < i; j++) /* no overlap */
      assert_true(x[i].offset >= x[j].offset + x[j].bytes ||
                  x[j].offset >= x[i].offset + x[i].bytes);
  }
  struct tz_arena_stats st;
  tz_tier_arena_stats(e->t, &st);
  assert_int_equal(st.n_extents, 16);
  for (int i = 0; i < 16; i++)
    tz_tier_free(&x[i]);
  tz_tier_arena_stats(e->t, &st);
  assert_int_equal(st.used, 0);
  assert_int_equal(st.n_free_ranges, 1);
  assert_true(st.fragmentation == 0.0);
}

static void test_capacity_exhausted(void **state) {
  struct env *e = *state;
  uint64_t cap = tz_tier_capacity(e->t);
  tz_extent big, more;
  assert_int_equal(tz_tier_alloc(e->t, cap + 1, &big), TZ_ENOMEM);
  assert_non_null(strstr(tz_err_msg(), "under-test"));
  TZ_ASSERT_OK(tz_tier_alloc(e->t, cap, &big));
  assert_int_equal(tz_tier_alloc(e->t, 1, &more), TZ_ENOMEM);
  assert_non_null(strstr(tz_err_msg(), "cannot allocate 1 bytes"));
  tz_tier_free(&big);
  TZ_ASSERT_OK(tz_tier_alloc(e->t, 1, &more));
  tz_tier_free(&more);
}

static void test_read_write_random(void **state) {
  struct env *e = *state;
  const uint64_t n = 8 << 20;
  tz_extent x;
  TZ_ASSERT_OK(tz_tier_alloc(e->t, n, &x));
  unsigned char *w = buf_alloc(n), *r = buf_alloc(n);
  tz_test_fill(w, n, 42);
  tz_fence *f;
  TZ_ASSERT_OK(tz_tier_write(&x, 0, w, n, &f));
  TZ_ASSERT_OK(wait_release(f));
  memset(r, 0, n);
  TZ_ASSERT_OK(tz_tier_read(&x, 0, r, n, &f));
  TZ_ASSERT_OK(wait_release(f));
  assert_memory_equal(r, w, n);
  /* Pieces at assorted aligned offsets and lengths, overwriting parts of the extent. */
  uint64_t s = 7, a = 4096;
  for (int i = 0; i < 50; i++) {
    uint64_t off = tz_test_rand(&s) % (n / a) * a;
    uint64_t len = (1 + tz_test_rand(&s) % 64) * a;
    if (off + len > n)
      len = n - off;
    tz_test_fill(w + off, len, 100 + (uint64_t)i);
    TZ_ASSERT_OK(tz_tier_write_sync(&x, off, w + off, len));
    uint64_t roff = tz_test_rand(&s) % (n / a) * a, rlen = (1 + tz_test_rand(&s) % 64) * a;
    if (roff + rlen > n)
      rlen = n - roff;
    TZ_ASSERT_OK(tz_tier_read_sync(&x, roff, r, rlen));
    assert_memory_equal(r, w + roff, rlen);
  }
  /* Out of range and misaligned requests are refused with a message, and move nothing. */
  assert_int_equal(tz_tier_read(&x, n - a, r, 2 * a, &f), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "outside the extent"));
  free(w);
  free(r);
  tz_tier_free(&x);
}

static void test_many_in_flight(void **state) {
  struct env *e = *state;
  enum { N = 256 };
  const uint64_t piece = 64 << 10;
  tz_extent x;
  TZ_ASSERT_OK(tz_tier_alloc(e->t, N * piece, &x));
  unsigned char *w = buf_alloc(N * piece), *r = buf_alloc(N * piece);
  tz_test_fill(w, N * piece, 9);
  memset(r, 0xa5, N * piece);
  tz_fence *f[N];
  for (int i = 0; i < N; i++)
    TZ_ASSERT_OK(tz_tier_write(&x, (uint64_t)i * piece, w + (uint64_t)i * piece, piece, &f[i]));
  tz_fence *all = tz_fence_all(f, N);
  TZ_ASSERT_OK(wait_release(all));
  for (int i = 0; i < N; i++)
    tz_fence_release(f[i]);
  for (int i = N - 1; i >= 0; i--) /* reversed, so completion order differs from submission */
    TZ_ASSERT_OK(tz_tier_read(&x, (uint64_t)i * piece, r + (uint64_t)i * piece, piece, &f[i]));
  for (int i = 0; i < N; i++)
    TZ_ASSERT_OK(wait_release(f[i]));
  assert_memory_equal(r, w, N * piece);
  free(w);
  free(r);
  tz_tier_free(&x);
}

static void check_transfer(struct env *e, tz_tier *other, int expect_staged) {
  const uint64_t n = 5 * (1 << 20) + 3 * 4096; /* not a multiple of the chunk */
  tz_extent a, b, h;
  TZ_ASSERT_OK(tz_tier_alloc(e->t, n, &a));
  TZ_ASSERT_OK(tz_tier_alloc(other, n, &b));
  TZ_ASSERT_OK(tz_tier_alloc(e->host, n, &h));
  unsigned char *w = buf_alloc(n), *r = buf_alloc(n);
  tz_test_fill(w, n, 1234);
  TZ_ASSERT_OK(tz_tier_write_sync(&a, 0, w, n));
  struct tz_pair_stats before[64], after[64];
  int nb = tz_runtime_pair_stats(e->rt, before, 64);
  tz_fence *f;
  TZ_ASSERT_OK(tz_transfer(e->rt, &b, 0, &a, 0, n, &f));
  TZ_ASSERT_OK(wait_release(f));
  TZ_ASSERT_OK(tz_tier_read_sync(&b, 0, r, n));
  assert_memory_equal(r, w, n);
  /* and back, at an offset */
  tz_test_fill(w, n, 99);
  TZ_ASSERT_OK(tz_tier_write_sync(&b, 0, w, n));
  TZ_ASSERT_OK(tz_transfer(e->rt, &a, 0, &b, 0, n - 4096, &f));
  TZ_ASSERT_OK(wait_release(f));
  TZ_ASSERT_OK(tz_tier_read_sync(&a, 0, r, n - 4096));
  assert_memory_equal(r, w, n - 4096);
  int na = tz_runtime_pair_stats(e->rt, after, 64);
  uint64_t staged_before = 0, staged_after = 0, bytes_after = 0, bytes_before = 0;
  for (int i = 0; i < nb; i++)
    staged_before += before[i].staged, bytes_before += before[i].bytes;
  for (int i = 0; i < na; i++)
    staged_after += after[i].staged, bytes_after += after[i].bytes;
  assert_int_equal(bytes_after - bytes_before, 2 * n - 4096);
  assert_int_equal(staged_after - staged_before, expect_staged ? 2 : 0);
  free(w);
  free(r);
  tz_tier_free(&a);
  tz_tier_free(&b);
  tz_tier_free(&h);
}

static void test_transfer_with_host(void **state) {
  struct env *e = *state;
  check_transfer(e, e->host, 0);
}

static void test_transfer_staged(void **state) {
  struct env *e = *state;
  /* Between two tiers neither of which the CPU addresses the runtime stages through pinned
   * chunks; a host tier under test goes direct. */
  check_transfer(e, e->nvme2, tz_tier_host_ptr(e->t, 0) == NULL);
}

static void test_many_transfers_share_staging(void **state) {
  struct env *e = *state;
  enum { N = 12 };
  const uint64_t n = 3 << 20;
  tz_extent a[N], b[N];
  unsigned char *w = buf_alloc(n * N), *r = buf_alloc(n);
  tz_test_fill(w, n * N, 5);
  tz_fence *f[N];
  for (int i = 0; i < N; i++) {
    TZ_ASSERT_OK(tz_tier_alloc(e->t, n, &a[i]));
    TZ_ASSERT_OK(tz_tier_alloc(e->nvme2, n, &b[i]));
    TZ_ASSERT_OK(tz_tier_write_sync(&a[i], 0, w + (uint64_t)i * n, n));
  }
  /* 12 transfers of 3 chunks against 8 staging slots: some wait for slots. */
  for (int i = 0; i < N; i++)
    TZ_ASSERT_OK(tz_transfer(e->rt, &b[i], 0, &a[i], 0, n, &f[i]));
  for (int i = 0; i < N; i++)
    TZ_ASSERT_OK(wait_release(f[i]));
  for (int i = 0; i < N; i++) {
    TZ_ASSERT_OK(tz_tier_read_sync(&b[i], 0, r, n));
    assert_memory_equal(r, w + (uint64_t)i * n, n);
    tz_tier_free(&a[i]);
    tz_tier_free(&b[i]);
  }
  free(w);
  free(r);
}

/* ---- faults: only the fault tier ---- */

struct fault_case {
  const char *spec;
  int expect_rc;      /* of the faulted operation; 0 means a transparent retry */
  const char *expect; /* in the message */
  int op;             /* which operation of write(1), write(2), read(3), read(4) is hit */
  /* What the tiers had to do again, the fault tier and its nvme base together: a fault that
   * shortens a transfer must be completed by a resubmission, one that refuses a request with
   * -EAGAIN by a retry; none may be counted where no fault asked for one. */
  uint64_t resubmits, retries;
  int min_ms; /* the four operations take at least this long (delay) */
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void run_fault_case(const struct fault_case *c) {
  struct env e = {0};
  TZ_ASSERT_OK(make_tier(&e, c->spec));
  double t0 = now_ms();
  const uint64_t n = 1 << 20;
  tz_extent x;
  TZ_ASSERT_OK(tz_tier_alloc(e.t, 2 * n, &x));
  unsigned char *w = buf_alloc(2 * n), *r = buf_alloc(2 * n);
  tz_test_fill(w, 2 * n, 77);
  int rc[4];
  rc[0] = tz_tier_write_sync(&x, 0, w, n);
  rc[1] = tz_tier_write_sync(&x, n, w + n, n);
  memset(r, 0, 2 * n);
  rc[2] = tz_tier_read_sync(&x, 0, r, n);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", rc[2] < 0 ? tz_err_msg() : "");
  rc[3] = tz_tier_read_sync(&x, n, r + n, n);
  if (rc[3] < 0)
    snprintf(msg, sizeof msg, "%s", tz_err_msg());
  double ms = now_ms() - t0;
  if (rc[0] < 0 || rc[1] < 0)
    snprintf(msg, sizeof msg, "%s", "write failed");
  struct tz_tier_io_stats st, bst;
  tz_tier_io_stats(e.t, &st);
  tz_tier_io_stats(e.base, &bst);
  if (st.resubmits + bst.resubmits != c->resubmits || st.retries + bst.retries != c->retries)
    print_error("%s: %llu resubmits and %llu retries, expected %llu and %llu\n", c->spec,
                (unsigned long long)(st.resubmits + bst.resubmits),
                (unsigned long long)(st.retries + bst.retries), (unsigned long long)c->resubmits,
                (unsigned long long)c->retries);
  assert_int_equal(st.resubmits + bst.resubmits, c->resubmits);
  assert_int_equal(st.retries + bst.retries, c->retries);
  if (ms < c->min_ms)
    print_error("%s: the operations took %.1f ms, expected at least %d\n", c->spec, ms, c->min_ms);
  assert_true(ms >= c->min_ms);
  for (int i = 0; i < 4; i++) {
    if (i + 1 == c->op && c->expect_rc) {
      if (rc[i] != c->expect_rc)
        print_error("%s: operation %d returned %d, expected %d\n", c->spec, i + 1, rc[i],
                    c->expect_rc);
      assert_int_equal(rc[i], c->expect_rc);
    } else if (c->expect_rc && (c->op == 1 || c->op == 2) && i == c->op + 1) {
      /* Reading back what a failed write left: its old checksum no longer matches. */
      assert_true(rc[i] == 0 || rc[i] == TZ_ECHECKSUM);
    } else if (!(c->expect_rc == TZ_ECHECKSUM && i == 2)) {
      if (rc[i] != 0)
        print_error("%s: operation %d: %s\n", c->spec, i + 1, tz_err_msg());
      assert_int_equal(rc[i], 0);
    }
  }
  if (c->expect) {
    if (!strstr(msg, c->expect) && c->op > 2)
      print_error("%s: message \"%s\" lacks \"%s\"\n", c->spec, msg, c->expect);
    if (c->op > 2)
      assert_non_null(strstr(msg, c->expect));
  }
  /* Data that no faulted operation touched is intact. */
  if (c->expect_rc == 0) {
    assert_memory_equal(r, w, 2 * n);
  } else if (c->op == 1 || c->op == 2) {
    uint64_t good = c->op == 1 ? n : 0;
    TZ_ASSERT_OK(tz_tier_read_sync(&x, good, r, n));
    assert_memory_equal(r, w + good, n);
  } else {
    assert_memory_equal(r + (c->op == 3 ? n : 0), w + (c->op == 3 ? n : 0), n);
  }
  free(w);
  free(r);
  tz_runtime_destroy(e.rt);
}

static void test_faults(void **state) {
  (void)state;
  if (strcmp(kind, "fault-nvme") != 0)
    skip();
  /* Each rule has a case that turns red when the code handling it is broken (the table in
   * docs/architecture.md, Tiers). With 1 MiB operations and 1 MiB stripes, each operation is one
   * nvme request; nvme-short@N and nvme-eagain@N count the requests put on the ring,
   * resubmissions and retries included. */
  static const struct fault_case cases[] = {
      {"eio@3", TZ_EIO, "injected EIO at operation 3", 3, 0, 0, 0},
      {"eio@1", TZ_EIO, NULL, 1, 0, 0, 0},
      {"eio-read@3", TZ_EIO, "injected EIO at operation 3", 3, 0, 0, 0},
      {"eio-read@1,eio-read@2", 0, NULL, 0, 0, 0, 0}, /* writes are not hit */
      {"eio-write@2", TZ_EIO, NULL, 2, 0, 0, 0},
      {"eio-write@3,eio-write@4,enospc@3,enospc@4", 0, NULL, 0, 0, 0, 0}, /* reads are not */
      {"enospc@2", TZ_ENOSPC, NULL, 2, 0, 0, 0},
      {"short@1,short@3", 0, NULL, 0, 2, 0, 0},
      {"nvme-short@1,nvme-short@4", 0, NULL, 0, 2, 0, 0},
      {"nvme-short@2,nvme-eagain@3", 0, NULL, 0, 1, 1, 0}, /* the resubmission refused */
      {"nvme-eagain@1,nvme-eagain@4", 0, NULL, 0, 0, 2, 0},
      {"nvme-eagain@2,nvme-eagain@3", 0, NULL, 0, 0, 2, 0}, /* the retry refused again */
      {"delay=20000", 0, NULL, 0, 0, 0, 80},
      {"flip@3", TZ_ECHECKSUM, "checksum mismatch", 3, 0, 0, 0},
      {"flip@4", TZ_ECHECKSUM, "checksum mismatch", 4, 0, 0, 0},
      {"flip@1", TZ_ECHECKSUM, "tierzero-", 3, 0, 0, 0}, /* corrupted on write, caught on read */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    run_fault_case(&cases[i]);
}

static void test_every_flipped_bit_caught(void **state) {
  (void)state;
  if (strcmp(kind, "fault-nvme") != 0)
    skip();
  struct env e = {0};
  /* 10% of operations flip a bit: every one must end in TZ_ECHECKSUM, never in wrong bytes. */
  TZ_ASSERT_OK(make_tier(&e, "flip%10,seed=3"));
  const uint64_t n = 64 << 10;
  tz_extent x;
  TZ_ASSERT_OK(tz_tier_alloc(e.t, n, &x));
  unsigned char *w = buf_alloc(n), *r = buf_alloc(n);
  int caught = 0;
  for (int i = 0; i < 200; i++) {
    tz_test_fill(w, n, (uint64_t)i);
    int rc = tz_tier_write_sync(&x, 0, w, n);
    assert_int_equal(rc, 0);
    rc = tz_tier_read_sync(&x, 0, r, n);
    if (rc == 0) {
      assert_memory_equal(r, w, n);
    } else {
      assert_int_equal(rc, TZ_ECHECKSUM);
      caught++;
    }
  }
  assert_true(caught >= 10); /* about 36 expected: P(write or read flipped) = 0.19 */
  free(w);
  free(r);
  tz_runtime_destroy(e.rt);
}

/* A backend without settings of its own refuses any (tz_tier_params.settings), naming the one
 * given, before anything is made. */
static void test_settings_refused_without_table(void **state) {
  (void)state;
  if (strcmp(kind, "host") != 0)
    skip();
  tz_runtime *rt;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt));
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.capacity = 1 << 20;
  p.settings = "gds=off";
  tz_tier *t = NULL;
  assert_int_equal(tz_tier_create(rt, "host", &p, &t), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "no setting \"gds\""));
  assert_null(t);
  p.settings = "";
  TZ_ASSERT_OK(tz_tier_create(rt, "host", &p, &t));
  tz_runtime_destroy(rt);
}

static void test_bad_fault_spec(void **state) {
  (void)state;
  if (strcmp(kind, "fault-nvme") != 0)
    skip();
  struct env e = {0};
  int rc = make_tier(&e, "eio@x");
  assert_int_equal(rc, TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "bad fault item \"eio@x\""));
  tz_runtime_destroy(e.rt);
  struct env e2 = {0};
  rc = make_tier(&e2, "nvme-short@1,nvme-short@x");
  assert_int_equal(rc, TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "bad fault item \"nvme-short@x\""));
  tz_runtime_destroy(e2.rt);
  /* Numbers out of range are refused naming the key, the item and the range: a delay of 27
   * hours per operation (wrapped to 20 minutes in an unsigned) hung the run. */
  static const struct {
    const char *spec, *says;
  } bad[] = {
      {"delay=99999999999", "delay is in microseconds, 0 to 10000000"},
      {"delay=-1", "delay is in microseconds, 0 to 10000000"},
      {"delay=5ms", "delay is in microseconds, 0 to 10000000"},
      {"eio%150", "a percentage above 0 and at most 100"},
      {"flip%0", "a percentage above 0 and at most 100"},
      {"eio@1.5", "an operation number, a whole number from 1"},
      {"short@0", "an operation number, a whole number from 1"},
      {"seed=x", "seed=S takes a whole number"},
      {"nvme-eagain@99999999999999999999999", "nvme-eagain@N with N from 1"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct env e3 = {0};
    rc = make_tier(&e3, bad[i].spec);
    if (rc != TZ_EINVAL || !strstr(tz_err_msg(), bad[i].says) ||
        !strstr(tz_err_msg(), bad[i].spec) || !strstr(tz_err_msg(), "tierzero.faults"))
      print_error("%s -> %d: %s\n", bad[i].spec, rc, tz_err_msg());
    assert_int_equal(rc, TZ_EINVAL);
    assert_non_null(strstr(tz_err_msg(), bad[i].says));
    assert_non_null(strstr(tz_err_msg(), "tierzero.faults"));
    tz_runtime_destroy(e3.rt);
  }
  struct env e4 = {0};
  TZ_ASSERT_OK(make_tier(&e4, "delay=10000000,seed=7,eio%100,short@3"));
  tz_runtime_destroy(e4.rt);
}

int main(int argc, char **argv) {
  if (argc < 2)
    tz_test_skip("usage: test_tier_conformance TIER [DIR]");
  kind = argv[1];
  char why[256];
  const char *backend = strcmp(kind, "host") == 0  ? "host"
                        : strcmp(kind, "hbm") == 0 ? "hbm"
                                                   : "nvme";
  if (tz_tier_probe(backend, why, sizeof why) < 0)
    tz_test_skip("%s", why);
  if (strcmp(backend, "nvme") == 0) {
    if (argc < 3 || access(argv[2], W_OK) != 0)
      tz_test_skip("no writable directory %s for nvme files", argc < 3 ? "(none given)" : argv[2]);
    dir = argv[2];
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_alloc_alignment, setup, teardown),
      cmocka_unit_test_setup_teardown(test_capacity_exhausted, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_write_random, setup, teardown),
      cmocka_unit_test_setup_teardown(test_many_in_flight, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transfer_with_host, setup, teardown),
      cmocka_unit_test_setup_teardown(test_transfer_staged, setup, teardown),
      cmocka_unit_test_setup_teardown(test_many_transfers_share_staging, setup, teardown),
      cmocka_unit_test(test_faults),
      cmocka_unit_test(test_every_flipped_bit_caught),
      cmocka_unit_test(test_bad_fault_spec),
      cmocka_unit_test(test_settings_refused_without_table),
  };
  return cmocka_run_group_tests_name(kind, tests, NULL, NULL);
}
