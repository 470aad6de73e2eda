/* CPU Adam: the scalar path against a float64 reference; AVX2 and AVX-512 bit-identical to the
 * scalar path over many steps and every dtype pair; results independent of threads, alignment,
 * the caller's FTZ/DAZ mode and thread binding; the ceiling kernel's moves; argument errors. */
#define _GNU_SOURCE
#include "testlib.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adam_cases.h"
#include "core/error.h"
#include "kernels/adam.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define GUARD 16 /* sentinel elements after each array, checked untouched */
#define SENTINEL 0xa5

/* One optimizer state with its gradient and copy, each array followed by a sentinel guard and
 * starting `off` elements into its allocation (to test unaligned pointers). */
struct state {
  size_t n;
  enum tz_dtype gdt, cdt;
  int has_copy;
  float *p, *m, *v;
  void *g, *copy;
  void *base[5];
  size_t bytes[5]; /* allocation sizes, for the guard check */
  size_t off[5];
};

static void *alloc_guarded(size_t n, size_t esize, size_t off, void **base, size_t *bytes) {
  *bytes = (off + n + GUARD) * esize;
  *base = malloc(*bytes);
  assert_non_null(*base);
  memset(*base, SENTINEL, *bytes);
  return (char *)*base + off * esize;
}

static void state_init(struct state *s, size_t n, enum tz_dtype gdt, int has_copy,
                       enum tz_dtype cdt, const size_t off[5]) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->gdt = gdt;
  s->cdt = cdt;
  s->has_copy = has_copy;
  for (int k = 0; k < 5; k++)
    s->off[k] = off ? off[k] : 0;
  s->p = alloc_guarded(n, 4, s->off[0], &s->base[0], &s->bytes[0]);
  s->m = alloc_guarded(n, 4, s->off[1], &s->base[1], &s->bytes[1]);
  s->v = alloc_guarded(n, 4, s->off[2], &s->base[2], &s->bytes[2]);
  s->g = alloc_guarded(n, tz_dtype_size(gdt), s->off[3], &s->base[3], &s->bytes[3]);
  s->copy =
      has_copy ? alloc_guarded(n, tz_dtype_size(cdt), s->off[4], &s->base[4], &s->bytes[4]) : NULL;
}

static void state_free(struct state *s) {
  for (int k = 0; k < 5; k++)
    free(s->base[k]);
}

static void state_check_guards(const struct state *s) {
  const size_t es[5] = {4, 4, 4, tz_dtype_size(s->gdt), tz_dtype_size(s->cdt)};
  for (int k = 0; k < 5; k++) {
    if (!s->base[k])
      continue;
    const unsigned char *b = s->base[k];
    for (size_t i = 0; i < s->off[k] * es[k]; i++)
      assert_int_equal(b[i], SENTINEL);
    for (size_t i = (s->off[k] + s->n) * es[k]; i < s->bytes[k]; i++)
      assert_int_equal(b[i], SENTINEL);
  }
}

static void state_copy_from(struct state *d, const struct state *s) {
  memcpy(d->p, s->p, s->n * 4);
  memcpy(d->m, s->m, s->n * 4);
  memcpy(d->v, s->v, s->n * 4);
  memcpy(d->g, s->g, s->n * tz_dtype_size(s->gdt));
  if (s->has_copy)
    memcpy(d->copy, s->copy, s->n * tz_dtype_size(s->cdt));
}

static void state_fill(struct state *s, uint64_t *rng, int kinds) {
  adam_case_fill(s->p, s->n, rng, 0, kinds);
  adam_case_fill(s->m, s->n, rng, 0, kinds);
  adam_case_fill(s->v, s->n, rng, 1, kinds);
  if (s->has_copy)
    memset(s->copy, 0, s->n * tz_dtype_size(s->cdt));
}

static void assert_same_bits(const void *a, const void *b, size_t n, size_t esize, const char *what,
                             const char *ctx) {
  if (memcmp(a, b, n * esize) == 0)
    return;
  for (size_t i = 0; i < n; i++) {
    if (memcmp((const char *)a + i * esize, (const char *)b + i * esize, esize) == 0)
      continue;
    uint32_t x = 0, y = 0;
    memcpy(&x, (const char *)a + i * esize, esize);
    memcpy(&y, (const char *)b + i * esize, esize);
    print_error("%s: %s differs at %zu of %zu: 0x%08x vs 0x%08x\n", ctx, what, i, n, x, y);
    break;
  }
  fail();
}

static void assert_states_equal(const struct state *a, const struct state *b, const char *ctx) {
  assert_same_bits(a->p, b->p, a->n, 4, "master", ctx);
  assert_same_bits(a->m, b->m, a->n, 4, "m", ctx);
  assert_same_bits(a->v, b->v, a->n, 4, "v", ctx);
  if (a->has_copy)
    assert_same_bits(a->copy, b->copy, a->n, tz_dtype_size(a->cdt), "copy", ctx);
}

static int run(const struct tz_adam_params *p, struct state *s, enum tz_adam_cpu_path path,
               int threads) {
  struct tz_adam_cpu_opts o = {.threads = threads, .path = path};
  return tz_adam_cpu(p, s->p, s->m, s->v, s->g, s->gdt, s->copy, s->cdt, s->n, &o);
}

static const enum tz_adam_cpu_path vector_paths[] = {TZ_ADAM_CPU_AVX2, TZ_ADAM_CPU_AVX512};

/* ---- hyperparameters ------------------------------------------------------------------------ */

static void test_params(void **state) {
  (void)state;
  struct tz_adam_params p = {
      .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .grad_scale = 1.0f};
  TZ_ASSERT_OK(tz_adam_params_for_step(&p, 1));
  assert_true(p.bias_corr1 == (float)(1.0 / (1.0 - (double)0.9f)));
  assert_true(p.bias_corr2 == (float)(1.0 / (1.0 - (double)0.999f)));
  TZ_ASSERT_OK(tz_adam_params_for_step(&p, 10));
  assert_true(p.bias_corr1 == (float)(1.0 / (1.0 - pow((double)0.9f, 10))));
  assert_true(p.bias_corr2 == (float)(1.0 / (1.0 - pow((double)0.999f, 10))));
  TZ_ASSERT_OK(tz_adam_params_for_step(&p, 1000000));
  assert_true(p.bias_corr1 == 1.0f);
  assert_true(p.bias_corr2 == 1.0f);

  assert_int_equal(tz_adam_params_for_step(&p, 0), TZ_EINVAL);
  struct tz_adam_params q = p;
  q.beta1 = 1.0f;
  assert_int_equal(tz_adam_params_for_step(&q, 1), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "beta1"));
  q = p;
  q.lr = NAN;
  assert_int_equal(tz_adam_params_check(&q), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "lr"));
  q = p;
  q.eps = -1.0f;
  assert_int_equal(tz_adam_params_check(&q), TZ_EINVAL);
  q = p;
  q.decoupled = 2;
  assert_int_equal(tz_adam_params_check(&q), TZ_EINVAL);
  assert_int_equal(tz_adam_params_check(NULL), TZ_EINVAL);
}

/* ---- float64 reference ---------------------------------------------------------------------- */

static double grad_f64(const struct state *s, size_t i) {
  if (s->gdt == TZ_BF16)
    return tz_bf16_to_f32(((const uint16_t *)s->g)[i]);
  if (s->gdt == TZ_F16)
    return tz_f16_to_f32(((const uint16_t *)s->g)[i]);
  return ((const float *)s->g)[i];
}

/* The definition in kernels/adam.h evaluated in double from the same float inputs; each output
 * must be within TOL of it relative to the magnitude of the terms that formed it (the float path
 * rounds about ten times, so its error is a few units of 2^-24 of that magnitude). */
#define TOL 2e-6
static double worst_seen;

static void check_against_f64(const struct tz_adam_params *hp, const struct state *before,
                              const struct state *after) {
  const double b1 = hp->beta1, b2 = hp->beta2, omb1 = 1.0f - hp->beta1, omb2 = 1.0f - hp->beta2;
  const double wd = hp->weight_decay, lr = hp->lr, bc1 = hp->bias_corr1, bc2 = hp->bias_corr2;
  for (size_t i = 0; i < before->n; i++) {
    double p = before->p[i], m = before->m[i], v = before->v[i];
    double g = grad_f64(before, i) * (double)hp->grad_scale;
    double sg = fabs(g) + (hp->decoupled ? 0 : fabs(wd * p)); /* scale of the gradient term */
    if (!hp->decoupled)
      g += wd * p;
    double m1 = b1 * m + omb1 * g, sm = fabs(b1 * m) + omb1 * sg;
    double v1 = b2 * v + omb2 * g * g, sv = b2 * v + omb2 * sg * sg;
    double den = sqrt(v1 * bc2) + hp->eps;
    double upd = m1 * bc1 / den;
    /* the update's scale: numerator's and denominator's errors carried through the division */
    double su = bc1 * sm / den + fabs(upd) * (sqrt(sv * bc2) / den + 1.0);
    if (hp->decoupled) {
      upd += wd * p;
      su += fabs(wd * p);
    }
    double p1 = p - lr * upd, sp = fabs(p) + lr * su;
    const double got[3] = {after->p[i], after->m[i], after->v[i]};
    const double want[3] = {p1, m1, v1}, scale[3] = {sp, sm, sv};
    for (int k = 0; k < 3; k++) {
      /* within two steps of the subnormal grid float cannot do better: each rounding of a
       * subnormal intermediate may add half a step */
      double diff = fabs(got[k] - want[k]);
      if (diff <= 0x1p-148)
        continue;
      double err = diff / (scale[k] + DBL_MIN);
      if (err > worst_seen)
        worst_seen = err;
      if (!(err <= TOL)) {
        print_error("element %zu output %d: %.9g, float64 %.9g (scale %.3g, p %.9g m %.9g v "
                    "%.9g g %.9g)\n",
                    i, k, got[k], want[k], scale[k], p, m, v, grad_f64(before, i));
        fail();
      }
    }
    if (after->has_copy && after->cdt == TZ_BF16)
      assert_int_equal(((uint16_t *)after->copy)[i], tz_f32_to_bf16(after->p[i]));
  }
}

static void test_reference_f64(void **state) {
  (void)state;
  const enum tz_dtype gdts[] = {TZ_F32, TZ_BF16, TZ_F16};
  uint64_t rng = 1234;
  for (size_t d = 0; d < 3; d++) {
    struct state s, before;
    state_init(&s, 20011, gdts[d], 1, TZ_BF16, NULL);
    state_init(&before, 20011, gdts[d], 1, TZ_BF16, NULL);
    state_fill(&s, &rng, ADAM_CASE_MODERATE);
    for (int t = 1; t <= 12; t++) {
      struct tz_adam_params hp;
      TZ_ASSERT_OK(adam_case_params(&hp, &rng, t));
      /* with eps 0 or subnormal, an update can hinge on g*g underflowing in float, which float64
       * does not share; the bit-identity tests cover those eps */
      if (hp.eps < 1e-8f)
        hp.eps = 1e-8f;
      adam_case_fill_grad(s.g, s.gdt, s.n, &rng, ADAM_CASE_MODERATE);
      state_copy_from(&before, &s);
      TZ_ASSERT_OK(run(&hp, &s, TZ_ADAM_CPU_SCALAR, 1));
      check_against_f64(&hp, &before, &s);
    }
    state_check_guards(&s);
    state_free(&s);
    state_free(&before);
  }
  printf("note: worst error relative to the terms' magnitude: %.3g (2^-24 = %.3g)\n", worst_seen,
         0x1p-24);
}

/* The textbook AdamW step on plain numbers, as a check that the definition is Adam at all. */
static void test_textbook_step(void **state) {
  (void)state;
  struct tz_adam_params hp = {.lr = 0.1f,
                              .beta1 = 0.9f,
                              .beta2 = 0.999f,
                              .eps = 1e-8f,
                              .weight_decay = 0.5f,
                              .decoupled = 1,
                              .grad_scale = 0.5f};
  TZ_ASSERT_OK(tz_adam_params_for_step(&hp, 1));
  float p = 2.0f, m = 0.0f, v = 0.0f, g = 4.0f; /* scaled gradient 2 */
  uint16_t copy = 0;
  TZ_ASSERT_OK(tz_adam_cpu(&hp, &p, &m, &v, &g, TZ_F32, &copy, TZ_BF16, 1, NULL));
  /* m = 0.2, v = 0.004, mhat = 2, vhat = 4, upd = 2/(2 + 1e-8) + 0.5*2 ~= 2, p = 2 - 0.2 = 1.8;
   * (1 - beta) is a float, 0.00099998713 for beta2, hence the tolerances */
  assert_float_equal(m, 0.2f, 1e-6);
  assert_float_equal(v, 0.004f, 1e-7);
  assert_float_equal(p, 1.8f, 1e-6);
  assert_int_equal(copy, tz_f32_to_bf16(p));
}

/* ---- bit identity across paths, threads, alignment ------------------------------------------ */

static void run_path_matrix(enum tz_adam_cpu_path path, int kinds) {
  const enum tz_dtype dts[] = {TZ_F32, TZ_BF16, TZ_F16};
  const size_t ns[] = {1, 7, 15, 16, 17, 45, 1000, 2 * TZ_ADAM_CPU_CHUNK + 13};
  uint64_t rng = 99 + (uint64_t)kinds;
  for (int gi = 0; gi < 3; gi++)
    for (int ci = -1; ci < 3; ci++)
      for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
        struct state ref, got;
        enum tz_dtype cdt = ci < 0 ? TZ_F32 : dts[ci];
        state_init(&ref, ns[ni], dts[gi], ci >= 0, cdt, NULL);
        state_init(&got, ns[ni], dts[gi], ci >= 0, cdt, NULL);
        state_fill(&ref, &rng, kinds);
        state_copy_from(&got, &ref);
        char ctx[128];
        for (int t = 1; t <= 6; t++) {
          struct tz_adam_params hp;
          TZ_ASSERT_OK(adam_case_params(&hp, &rng, t));
          adam_case_fill_grad(ref.g, ref.gdt, ref.n, &rng, kinds);
          memcpy(got.g, ref.g, ref.n * tz_dtype_size(ref.gdt));
          TZ_ASSERT_OK(run(&hp, &ref, TZ_ADAM_CPU_SCALAR, 1));
          TZ_ASSERT_OK(run(&hp, &got, path, 2));
          snprintf(ctx, sizeof ctx, "%s vs scalar, grad %s, copy %s, n %zu, step %d%s",
                   tz_adam_cpu_path_name(path), tz_dtype_name(dts[gi]),
                   ci < 0 ? "none" : tz_dtype_name(cdt), ns[ni], t,
                   kinds == ADAM_CASE_SPECIAL ? ", with inf and NaN" : "");
          assert_states_equal(&ref, &got, ctx);
        }
        state_check_guards(&ref);
        state_check_guards(&got);
        state_free(&ref);
        state_free(&got);
      }
}

static void test_paths_identical(void **state) {
  (void)state;
  int ran = 0;
  for (size_t k = 0; k < sizeof vector_paths / sizeof vector_paths[0]; k++) {
    if (!tz_adam_cpu_path_supported(vector_paths[k])) {
      printf("note: this CPU lacks the %s path; not compared\n",
             tz_adam_cpu_path_name(vector_paths[k]));
      continue;
    }
    run_path_matrix(vector_paths[k], ADAM_CASE_HUGE);
    run_path_matrix(vector_paths[k], ADAM_CASE_SPECIAL);
    printf("note: %s bit-identical to scalar\n", tz_adam_cpu_path_name(vector_paths[k]));
    ran++;
  }
  /* the scalar path against itself still checks the matrix runs with 2 threads */
  if (!ran)
    run_path_matrix(TZ_ADAM_CPU_SCALAR, ADAM_CASE_SPECIAL);
}

static void test_threads_identical(void **state) {
  (void)state;
  const size_t n = 5 * TZ_ADAM_CPU_CHUNK + 77;
  struct state a, b, c;
  state_init(&a, n, TZ_BF16, 1, TZ_BF16, NULL);
  state_init(&b, n, TZ_BF16, 1, TZ_BF16, NULL);
  state_init(&c, n, TZ_BF16, 1, TZ_BF16, NULL);
  uint64_t rng = 5;
  state_fill(&a, &rng, ADAM_CASE_SPECIAL);
  state_copy_from(&b, &a);
  state_copy_from(&c, &a);
  for (int t = 1; t <= 4; t++) {
    struct tz_adam_params hp;
    TZ_ASSERT_OK(adam_case_params(&hp, &rng, t));
    adam_case_fill_grad(a.g, a.gdt, n, &rng, ADAM_CASE_SPECIAL);
    memcpy(b.g, a.g, n * 2);
    memcpy(c.g, a.g, n * 2);
    TZ_ASSERT_OK(run(&hp, &a, TZ_ADAM_CPU_AUTO, 1));
    TZ_ASSERT_OK(run(&hp, &b, TZ_ADAM_CPU_AUTO, 2));
    TZ_ASSERT_OK(run(&hp, &c, TZ_ADAM_CPU_AUTO, 3));
    assert_states_equal(&a, &b, "1 vs 2 threads");
    assert_states_equal(&a, &c, "1 vs 3 threads");
  }
  state_free(&a);
  state_free(&b);
  state_free(&c);
}

/* Pointers 0..3 elements past an aligned address, each array differently, so the vector loads
 * and stores are unaligned and the arrays are out of phase with each other. */
static void test_unaligned(void **state) {
  (void)state;
  const size_t offs[][5] = {{1, 1, 1, 1, 1}, {1, 2, 3, 0, 3}, {3, 0, 2, 1, 2}};
  for (size_t k = 0; k < sizeof vector_paths / sizeof vector_paths[0]; k++) {
    if (!tz_adam_cpu_path_supported(vector_paths[k]))
      continue;
    for (size_t o = 0; o < 3; o++) {
      struct state ref, got;
      const size_t n = 1000 + o;
      state_init(&ref, n, TZ_BF16, 1, TZ_BF16, NULL);
      state_init(&got, n, TZ_BF16, 1, TZ_BF16, offs[o]);
      uint64_t rng = 77 + o;
      state_fill(&ref, &rng, ADAM_CASE_SPECIAL);
      state_copy_from(&got, &ref);
      for (int t = 1; t <= 3; t++) {
        struct tz_adam_params hp;
        TZ_ASSERT_OK(adam_case_params(&hp, &rng, t));
        adam_case_fill_grad(ref.g, ref.gdt, n, &rng, ADAM_CASE_SPECIAL);
        memcpy(got.g, ref.g, n * 2);
        TZ_ASSERT_OK(run(&hp, &ref, TZ_ADAM_CPU_SCALAR, 1));
        TZ_ASSERT_OK(run(&hp, &got, vector_paths[k], 1));
        assert_states_equal(&ref, &got, tz_adam_cpu_path_name(vector_paths[k]));
      }
      state_check_guards(&got);
      state_free(&ref);
      state_free(&got);
    }
  }
}

#if defined(__x86_64__)
/* A caller running with FTZ and DAZ set (as after loading a -ffast-math library) gets the same
 * bits, subnormals included, and its MXCSR back. */
static void test_caller_ftz(void **state) {
  (void)state;
  const size_t n = 4096;
  struct state a, b;
  state_init(&a, n, TZ_F32, 1, TZ_BF16, NULL);
  state_init(&b, n, TZ_F32, 1, TZ_BF16, NULL);
  uint64_t rng = 3;
  state_fill(&a, &rng, ADAM_CASE_MODERATE);
  for (size_t i = 0; i < n; i += 2) /* many subnormal inputs and results */
    a.v[i] = 0x1p-140f * (float)(i % 100);
  struct tz_adam_params hp;
  TZ_ASSERT_OK(adam_case_params(&hp, &rng, 1));
  hp.eps = 1e-40f;
  adam_case_fill_grad(a.g, a.gdt, n, &rng, ADAM_CASE_MODERATE);
  for (size_t i = 1; i < n; i += 4)
    ((float *)a.g)[i] = 0x1p-130f;
  state_copy_from(&b, &a);
  for (int k = 0; k < 2; k++) {
    enum tz_adam_cpu_path path = k ? tz_adam_cpu_path_best() : TZ_ADAM_CPU_SCALAR;
    state_copy_from(&b, &a);
    struct state ref;
    state_init(&ref, n, TZ_F32, 1, TZ_BF16, NULL);
    state_copy_from(&ref, &a);
    TZ_ASSERT_OK(run(&hp, &ref, path, 1));
    unsigned saved = _mm_getcsr();
    unsigned ftz = saved | 0x8040u;
    _mm_setcsr(ftz);
    int rc = run(&hp, &b, path, 1); /* one thread: the caller's own MXCSR is in effect */
    unsigned after = _mm_getcsr();
    _mm_setcsr(saved);
    assert_int_equal(rc, 0);
    assert_int_equal(after, ftz);
    assert_states_equal(&ref, &b, "FTZ/DAZ caller");
    state_free(&ref);
  }
  state_free(&a);
  state_free(&b);
}
#endif

/* Bound threads give the same result; a cpu that cannot be bound fails before anything is
 * computed; the caller's affinity is the bound cpu afterwards (documented), restored here. */
static void test_binding(void **state) {
  (void)state;
  cpu_set_t orig;
  assert_int_equal(pthread_getaffinity_np(pthread_self(), sizeof orig, &orig), 0);
  int cpu = -1;
  for (int c = 0; c < CPU_SETSIZE && cpu < 0; c++)
    if (CPU_ISSET(c, &orig))
      cpu = c;
  assert_true(cpu >= 0);

  const size_t n = 3 * TZ_ADAM_CPU_CHUNK + 5;
  struct state a, b;
  state_init(&a, n, TZ_F32, 1, TZ_BF16, NULL);
  state_init(&b, n, TZ_F32, 1, TZ_BF16, NULL);
  uint64_t rng = 11;
  state_fill(&a, &rng, ADAM_CASE_HUGE);
  adam_case_fill_grad(a.g, a.gdt, n, &rng, ADAM_CASE_HUGE);
  state_copy_from(&b, &a);
  struct tz_adam_params hp;
  TZ_ASSERT_OK(adam_case_params(&hp, &rng, 1));
  TZ_ASSERT_OK(run(&hp, &a, TZ_ADAM_CPU_AUTO, 2));
  const int cpus[] = {cpu};
  struct tz_adam_cpu_opts o = {.threads = 2, .cpus = cpus, .ncpus = 1};
  TZ_ASSERT_OK(tz_adam_cpu(&hp, b.p, b.m, b.v, b.g, b.gdt, b.copy, b.cdt, n, &o));
  assert_states_equal(&a, &b, "bound threads");
  cpu_set_t now;
  assert_int_equal(pthread_getaffinity_np(pthread_self(), sizeof now, &now), 0);
  assert_int_equal(CPU_COUNT(&now), 1);
  assert_true(CPU_ISSET(cpu, &now));

  /* a cpu outside the machine: an error naming it, and the arrays untouched */
  struct state c;
  state_init(&c, n, TZ_F32, 1, TZ_BF16, NULL);
  state_copy_from(&c, &b);
  const int bad[] = {CPU_SETSIZE - 1};
  o.cpus = bad;
  int rc = tz_adam_cpu(&hp, c.p, c.m, c.v, c.g, c.gdt, c.copy, c.cdt, n, &o);
  assert_true(rc < 0);
  assert_non_null(strstr(tz_err_msg(), "cpu 1023"));
  assert_states_equal(&b, &c, "failed binding");

  assert_int_equal(pthread_setaffinity_np(pthread_self(), sizeof orig, &orig), 0);
  state_free(&a);
  state_free(&b);
  state_free(&c);
}

/* ---- the ceiling kernel --------------------------------------------------------------------- */

static void test_ceiling_moves(void **state) {
  (void)state;
  const enum tz_adam_cpu_path paths[] = {TZ_ADAM_CPU_SCALAR, TZ_ADAM_CPU_AVX2, TZ_ADAM_CPU_AVX512};
  const enum tz_dtype dts[] = {TZ_F32, TZ_BF16, TZ_F16};
  for (size_t k = 0; k < 3; k++) {
    if (!tz_adam_cpu_path_supported(paths[k]))
      continue;
    for (int gi = 0; gi < 3; gi++)
      for (int ci = -1; ci < 3; ci++) {
        const size_t n = TZ_ADAM_CPU_CHUNK + 21;
        enum tz_dtype cdt = ci < 0 ? TZ_F32 : dts[ci];
        struct state s, before;
        state_init(&s, n, dts[gi], ci >= 0, cdt, NULL);
        state_init(&before, n, dts[gi], ci >= 0, cdt, NULL);
        tz_test_fill(s.p, n * 4, 1);
        tz_test_fill(s.m, n * 4, 2);
        tz_test_fill(s.v, n * 4, 3);
        tz_test_fill(s.g, n * tz_dtype_size(s.gdt), 4);
        state_copy_from(&before, &s);
        struct tz_adam_cpu_opts o = {.threads = 2, .path = paths[k]};
        TZ_ASSERT_OK(tz_adam_cpu_ceiling(s.p, s.m, s.v, s.g, s.gdt, s.copy, s.cdt, n, &o));
        for (size_t i = 0; i < n; i++) {
          uint32_t gb = s.gdt == TZ_F32 ? tz_f32_bits(((float *)before.g)[i])
                                        : (uint32_t)((uint16_t *)before.g)[i] << 16;
          assert_int_equal(tz_f32_bits(s.p[i]), tz_f32_bits(before.m[i]));
          assert_int_equal(tz_f32_bits(s.m[i]), tz_f32_bits(before.v[i]));
          assert_int_equal(tz_f32_bits(s.v[i]), tz_f32_bits(before.p[i]));
          if (ci >= 0 && cdt == TZ_F32)
            assert_int_equal(tz_f32_bits(((float *)s.copy)[i]), gb);
          else if (ci >= 0)
            assert_int_equal(((uint16_t *)s.copy)[i], gb >> 16);
        }
        state_check_guards(&s);
        state_free(&s);
        state_free(&before);
      }
  }
}

/* ---- errors --------------------------------------------------------------------------------- */

static void test_errors(void **state) {
  (void)state;
  struct tz_adam_params hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .grad_scale = 1.0f};
  TZ_ASSERT_OK(tz_adam_params_for_step(&hp, 1));
  float p[4] = {0}, m[4] = {0}, v[4] = {0}, g[4] = {0};
  uint16_t copy[4];
  assert_int_equal(tz_adam_cpu(&hp, p, m, v, g, (enum tz_dtype)9, NULL, TZ_F32, 4, NULL),
                   TZ_EINVAL);
  assert_int_equal(tz_adam_cpu(&hp, p, m, v, g, TZ_F32, copy, (enum tz_dtype)9, 4, NULL),
                   TZ_EINVAL);
  assert_int_equal(tz_adam_cpu(&hp, p, NULL, v, g, TZ_F32, NULL, TZ_F32, 4, NULL), TZ_EINVAL);
  TZ_ASSERT_OK(tz_adam_cpu(&hp, NULL, NULL, NULL, NULL, TZ_F32, NULL, TZ_F32, 0, NULL));
  struct tz_adam_cpu_opts o = {.threads = -1};
  assert_int_equal(tz_adam_cpu(&hp, p, m, v, g, TZ_F32, NULL, TZ_F32, 4, &o), TZ_EINVAL);
  const int cpus[] = {0};
  o = (struct tz_adam_cpu_opts){.cpus = cpus, .ncpus = 0};
  assert_int_equal(tz_adam_cpu(&hp, p, m, v, g, TZ_F32, NULL, TZ_F32, 4, &o), TZ_EINVAL);
  o = (struct tz_adam_cpu_opts){.path = (enum tz_adam_cpu_path)42};
  assert_int_equal(tz_adam_cpu(&hp, p, m, v, g, TZ_F32, NULL, TZ_F32, 4, &o), TZ_ENOTSUP);
  hp.beta2 = 1.5f;
  assert_int_equal(tz_adam_cpu(&hp, p, m, v, g, TZ_F32, NULL, TZ_F32, 4, NULL), TZ_EINVAL);
  assert_int_equal(tz_adam_cpu_ceiling(p, m, v, g, TZ_F32, copy, (enum tz_dtype)9, 4, NULL),
                   TZ_EINVAL);
  assert_string_equal(tz_adam_cpu_path_name(TZ_ADAM_CPU_AVX512), "avx512");
  assert_true(tz_adam_cpu_path_supported(tz_adam_cpu_path_best()));
}

int main(void) {
  printf("note: best CPU path here is %s\n", tz_adam_cpu_path_name(tz_adam_cpu_path_best()));
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_params),
    cmocka_unit_test(test_textbook_step),
    cmocka_unit_test(test_reference_f64),
    cmocka_unit_test(test_paths_identical),
    cmocka_unit_test(test_threads_identical),
    cmocka_unit_test(test_unaligned),
#if defined(__x86_64__)
    cmocka_unit_test(test_caller_ftz),
#endif
    cmocka_unit_test(test_binding),
    cmocka_unit_test(test_ceiling_moves),
    cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
