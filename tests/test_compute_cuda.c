/* The cuda compute backend against the cpu backend, op by op on fresh random inputs at several
 * shapes (odd sequence lengths, grouped-query ratios, head dims on both attention paths), then
 * the whole tiny model: loss and every parameter's gradient. Only the public tz_compute API of
 * the two backends is used, and the CUDA runtime only to lend an instance its stream and to queue
 * transfers beside it.
 *
 * How each op is checked:
 *   - both backends get the same inputs: random values rounded to the cuda instance's storage
 *     dtype, so the cpu backend (float32) sees exactly the numbers the cuda one stores;
 *   - the cuda outputs are filled with NaN before every launch, so an element a kernel fails to
 *     write fails the comparison;
 *   - every cuda op runs twice from the same inputs and the two results must be the same bits;
 *   - the cuda result is compared norm-wise, err = ||cuda - cpu|| / ||cpu||, with the tolerance
 *     tol(S, r, K) = r * u_S + 2^-20 * sqrt(K), where
 *       u_S is the unit roundoff of the storage dtype (2^-8 bf16, 2^-11 fp16, 2^-24 f32): each
 *           rounding of a value to S moves it by at most u_S of itself, so r roundings on the way
 *           from the (shared, exact) inputs to an output move the output by at most about r u_S
 *           norm-wise; r counts the output's rounding plus any intermediate the kernel keeps in
 *           S (attention's probabilities and score gradients on tensor cores: bf16's 2^-8 with
 *           sqrt(K) growth over a K-term sum is the worst case, but norm-wise over many rows the
 *           per-term errors add in quadrature against a sum that grows the same way, so one u_S
 *           per rounding stage is the right scale and r grows by one per stage);
 *       2^-20 sqrt(K) covers float32 sums of K terms taken in another order than the cpu's
 *           (a random walk of 2^-24 per addition, with a factor 16 to spare);
 *     ops whose arithmetic is specified exactly (the sums, casts, the elementwise ops with
 *     explicit dtypes) must match the cpu backend bit for bit instead;
 *   - a negative control perturbs one input of the cuda side by a relative 1e-2 (random signs)
 *     and the same check must then fail, for a matmul and for an RMSNorm.
 * The lines printed for each check (err and tol) are the record of a run on the GPU machine.
 *
 * Exits 77 (skipped) where the build has no CUDA or the machine no CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TZ_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "core/error.h"
#include "kernels/adam.h"
#include "kernels/compute.h"
#include "refmodel.h"
#include "testlib.h"
#include "trainer/model/model.h"

static tz_compute *g_cpu; /* the reference, shared by every test */
static int g_failures;    /* checks failed in the current test */
static uint64_t g_seed = 12345;

/* ---- values and dtypes ---- */

static double unit_roundoff(enum tz_dtype dt) {
  return dt == TZ_BF16 ? 0x1p-8 : dt == TZ_F16 ? 0x1p-11 : 0x1p-24;
}

static double tol_of(enum tz_dtype dt, double r, double K) {
  return r * unit_roundoff(dt) + 0x1p-20 * sqrt(K < 1 ? 1 : K);
}

static float round_to(enum tz_dtype dt, float x) {
  if (dt == TZ_BF16)
    return tz_bf16_to_f32(tz_f32_to_bf16(x));
  if (dt == TZ_F16)
    return tz_f16_to_f32(tz_f32_to_f16(x));
  return x;
}

/* Uniform in [-scale, scale). */
static float urand(float scale) {
  return scale * (float)(2.0 * (double)(tz_test_rand(&g_seed) >> 11) * 0x1.0p-53 - 1.0);
}

static float *randv(size_t n, float scale) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++)
    v[i] = urand(scale);
  return v;
}

/* ||got - ref|| / ||ref|| in double; NaN propagates. Where the reference is exactly zero (attention
 * with T = 1: p = 1 and dp = delta, so ds = 0 exactly on the cpu, while the cuda side forms dp
 * and delta in different orders and keeps a residue of float rounding), the error is taken
 * against unit scale instead, the RMS of got: the test's inputs are of order one. */
static double rel_err(const float *got, const float *ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * (double)ref[i];
  }
  if (den == 0)
    return n ? sqrt(num / (double)n) : 0;
  return sqrt(num / den);
}

/* Prints the check and counts it when it fails (NaN fails). Returns whether it passed. */
static int check(const char *what, const float *got, const float *ref, size_t n, double tol) {
  double e = rel_err(got, ref, n);
  int ok = e <= tol;
  printf("  %-58s err %9.3e  tol %9.3e  %s\n", what, e, tol, ok ? "ok" : "FAIL");
  if (!ok)
    g_failures++;
  return ok;
}

static void check_bits(const char *what, const void *a, const void *b, size_t bytes) {
  int ok = memcmp(a, b, bytes) == 0;
  if (!ok) {
    printf("  %-58s differ bit for bit: FAIL\n", what);
    g_failures++;
  }
}

/* ---- a tensor on both backends ---- */

struct env {
  tz_compute *gpu;
  enum tz_dtype S, G;
  int mm_plain;         /* created with TZ_CUDA_MATMUL=plain */
  const char *attn_bwd; /* the attention backward's name in op names: "two-pass", "wgmma",
                           or NULL (the instance's default) */
};

struct buf {
  size_t n;
  enum tz_dtype cdt, gdt; /* dtype on the cpu side and on the cuda side */
  void *c, *g;
  float *host; /* the values last set, already rounded to gdt */
};

static void buf_init(struct env *e, struct buf *b, size_t n, enum tz_dtype cdt, enum tz_dtype gdt) {
  memset(b, 0, sizeof *b);
  b->n = n;
  b->cdt = cdt;
  b->gdt = gdt;
  TZ_ASSERT_OK(tz_compute_alloc(g_cpu, n * tz_dtype_size(cdt), &b->c));
  TZ_ASSERT_OK(tz_compute_alloc(e->gpu, n * tz_dtype_size(gdt), &b->g));
  b->host = calloc(n ? n : 1, sizeof(float));
  assert_non_null(b->host);
}

static void buf_fini(struct env *e, struct buf *b) {
  tz_compute_free(g_cpu, b->c);
  tz_compute_free(e->gpu, b->g);
  free(b->host);
  memset(b, 0, sizeof *b);
}

static void *pack(const float *v, size_t n, enum tz_dtype dt) {
  void *p = malloc((n ? n : 1) * tz_dtype_size(dt));
  assert_non_null(p);
  for (size_t i = 0; i < n; i++) {
    if (dt == TZ_F32)
      ((float *)p)[i] = v[i];
    else if (dt == TZ_BF16)
      ((uint16_t *)p)[i] = tz_f32_to_bf16(v[i]);
    else
      ((uint16_t *)p)[i] = tz_f32_to_f16(v[i]);
  }
  return p;
}

static void unpack(float *out, const void *p, size_t n, enum tz_dtype dt) {
  for (size_t i = 0; i < n; i++)
    out[i] = dt == TZ_F32    ? ((const float *)p)[i]
             : dt == TZ_BF16 ? tz_bf16_to_f32(((const uint16_t *)p)[i])
                             : tz_f16_to_f32(((const uint16_t *)p)[i]);
}

static void upload(tz_compute *cm, void *dst, const float *v, size_t n, enum tz_dtype dt) {
  void *p = pack(v, n, dt);
  TZ_ASSERT_OK(tz_compute_copy_in(cm, dst, p, n * tz_dtype_size(dt)));
  free(p);
}

static void download(tz_compute *cm, float *out, const void *src, size_t n, enum tz_dtype dt) {
  void *p = malloc((n ? n : 1) * tz_dtype_size(dt));
  assert_non_null(p);
  TZ_ASSERT_OK(tz_compute_sync(cm));
  TZ_ASSERT_OK(tz_compute_copy_out(cm, p, src, n * tz_dtype_size(dt)));
  unpack(out, p, n, dt);
  free(p);
}

/* Rounds v to the cuda side's dtype (and the cpu side's, when narrower) and puts it on both. */
static void buf_set(struct buf *b, struct env *e, const float *v) {
  for (size_t i = 0; i < b->n; i++)
    b->host[i] = round_to(b->cdt, round_to(b->gdt, v[i]));
  upload(g_cpu, b->c, b->host, b->n, b->cdt);
  upload(e->gpu, b->g, b->host, b->n, b->gdt);
}

/* Puts back the values last set, on the cuda side only (before a repeated launch). */
static void buf_restore_gpu(struct buf *b, struct env *e) {
  upload(e->gpu, b->g, b->host, b->n, b->gdt);
}

static void buf_poison(struct buf *b, struct env *e) {
  TZ_ASSERT_OK(tz_compute_fill(e->gpu, b->gdt, b->g, NAN, b->n));
}

static float *buf_get_gpu(struct buf *b, struct env *e) {
  float *v = malloc((b->n ? b->n : 1) * sizeof *v);
  assert_non_null(v);
  download(e->gpu, v, b->g, b->n, b->gdt);
  return v;
}

static float *buf_get_cpu(struct buf *b) {
  float *v = malloc((b->n ? b->n : 1) * sizeof *v);
  assert_non_null(v);
  download(g_cpu, v, b->c, b->n, b->cdt);
  return v;
}

/* int32 tokens on both sides */
struct ibuf {
  void *c, *g;
};

static void ibuf_init(struct env *e, struct ibuf *b, const int32_t *v, int n) {
  TZ_ASSERT_OK(tz_compute_alloc(g_cpu, (size_t)n * 4, &b->c));
  TZ_ASSERT_OK(tz_compute_alloc(e->gpu, (size_t)n * 4, &b->g));
  TZ_ASSERT_OK(tz_compute_copy_in(g_cpu, b->c, v, (size_t)n * 4));
  TZ_ASSERT_OK(tz_compute_copy_in(e->gpu, b->g, v, (size_t)n * 4));
}

static void ibuf_fini(struct env *e, struct ibuf *b) {
  tz_compute_free(g_cpu, b->c);
  tz_compute_free(e->gpu, b->g);
}

#define SIDE(b, gpu) ((gpu) ? (b)->g : (b)->c)

/* ---- one op, both backends ----
 * launch(cm, gpu, args) runs the op on one side. outs are compared against the cpu with tols;
 * keep are tensors the op updates in place or accumulates into: they are put back to their set
 * values before each cuda run instead of being poisoned. */
struct op {
  const char *name;
  int (*launch)(tz_compute *cm, int gpu, void *args);
  void *args;
  struct buf *outs[6];
  const char *out_names[6];
  double tols[6];
  int n_outs;
  struct buf *keep[6];
  int n_keep;
};

static int is_kept(const struct op *op, const struct buf *b) {
  for (int i = 0; i < op->n_keep; i++)
    if (op->keep[i] == b)
      return 1;
  return 0;
}

/* Runs op on both sides and checks it; returns the number of failed checks. With perturb set,
 * the cuda side's copy of that tensor is perturbed by a relative 1e-2 first (negative control)
 * and nothing is printed as a failure: the caller asserts the failure. */
static int run_op(struct env *e, struct op *op, struct buf *perturb) {
  int before = g_failures;
  TZ_ASSERT_OK(op->launch(g_cpu, 0, op->args));
  TZ_ASSERT_OK(tz_compute_sync(g_cpu));
  float *ref[6], *got[2][6];
  for (int i = 0; i < op->n_outs; i++)
    ref[i] = buf_get_cpu(op->outs[i]);
  if (perturb) {
    float *v = malloc(perturb->n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < perturb->n; i++)
      v[i] = perturb->host[i] * (tz_test_rand(&g_seed) & 1 ? 1.01f : 0.99f);
    upload(e->gpu, perturb->g, v, perturb->n, perturb->gdt);
    free(v);
  }
  for (int rep = 0; rep < 2; rep++) {
    for (int i = 0; i < op->n_keep; i++)
      buf_restore_gpu(op->keep[i], e);
    for (int i = 0; i < op->n_outs; i++)
      if (!is_kept(op, op->outs[i]))
        buf_poison(op->outs[i], e);
    TZ_ASSERT_OK(op->launch(e->gpu, 1, op->args));
    TZ_ASSERT_OK(tz_compute_sync(e->gpu));
    for (int i = 0; i < op->n_outs; i++)
      got[rep][i] = buf_get_gpu(op->outs[i], e);
  }
  char what[160];
  for (int i = 0; i < op->n_outs; i++) {
    snprintf(what, sizeof what, "%s %s", op->name, op->out_names[i]);
    check_bits(what, got[0][i], got[1][i], op->outs[i]->n * sizeof(float));
    check(what, got[0][i], ref[i], op->outs[i]->n, op->tols[i]);
  }
  for (int i = 0; i < op->n_outs; i++) {
    free(ref[i]);
    free(got[0][i]);
    free(got[1][i]);
  }
  return g_failures - before;
}

static void add_out(struct op *op, struct buf *b, const char *name, double tol) {
  op->outs[op->n_outs] = b;
  op->out_names[op->n_outs] = name;
  op->tols[op->n_outs] = tol;
  op->n_outs++;
}

/* ---- environments ---- */

/* An instance of storage S, gradients G, and the backend's settings (kernels/cuda/choice.c:
 * the attention kernels; NULL: as the environment says, else auto's);
 * attn_bwd names them in the checks' lines. */
static int env_open_with(struct env *e, enum tz_dtype S, enum tz_dtype G, const char *settings,
                         const char *attn_bwd) {
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  p.dtype = S;
  p.grad_dtype = G;
  p.settings = settings;
  e->S = S;
  e->G = G;
  const char *mm = getenv("TZ_CUDA_MATMUL");
  e->mm_plain = mm && strcmp(mm, "plain") == 0;
  e->attn_bwd = attn_bwd;
  return tz_compute_create("cuda", &p, &e->gpu);
}

/* The default instance: the kernels TZ_CUDA_ATTENTION and TZ_CUDA_MATMUL say, else auto's. */
static int env_open(struct env *e, enum tz_dtype S, enum tz_dtype G) {
  return env_open_with(e, S, G, NULL, NULL);
}

/* An instance whose attention backward is the two-pass one for every shape, f32 gradients. */
static int env_open_twopass(struct env *e, enum tz_dtype S) {
  return env_open_with(e, S, TZ_F32, "attention=two-pass", "two-pass");
}

static void env_close(struct env *e) {
  tz_compute_destroy(e->gpu);
  e->gpu = NULL;
}

static const enum tz_dtype storage_dtypes[] = {TZ_BF16, TZ_F16, TZ_F32};

/* ---- basics ---- */

static void test_basics(void **state) {
  (void)state;
  struct env e;
  TZ_ASSERT_OK(env_open(&e, TZ_BF16, TZ_F32));
  assert_string_equal(tz_compute_backend(e.gpu), "cuda");
  assert_int_equal(tz_compute_dtype(e.gpu), TZ_BF16);
  assert_int_equal(tz_compute_grad_dtype(e.gpu), TZ_F32);
  assert_non_null(tz_compute_stream(e.gpu));
  void *p;
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, 1000, &p));
  assert_true(((uintptr_t)p & 255) == 0);
  unsigned char in[1000], out[1000];
  tz_test_fill(in, sizeof in, 7);
  TZ_ASSERT_OK(tz_compute_copy_in(e.gpu, p, in, sizeof in));
  TZ_ASSERT_OK(tz_compute_copy_out(e.gpu, out, p, sizeof out));
  assert_memory_equal(in, out, sizeof in);
  TZ_ASSERT_OK(tz_compute_zero(e.gpu, p, 500));
  TZ_ASSERT_OK(tz_compute_copy_out(e.gpu, out, p, sizeof out));
  for (int i = 0; i < 500; i++)
    assert_int_equal(out[i], 0);
  assert_memory_equal(in + 500, out + 500, 500);
  tz_compute_free(e.gpu, p);

  /* A bad token is found on the device and reported by the next sync, once. */
  int32_t tok[3] = {1, 99, 2};
  void *dtok, *wte, *x;
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, sizeof tok, &dtok));
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, 10 * 4 * 2, &wte));
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, 3 * 4 * 2, &x));
  TZ_ASSERT_OK(tz_compute_copy_in(e.gpu, dtok, tok, sizeof tok));
  TZ_ASSERT_OK(tz_compute_embedding_fwd(e.gpu, x, dtok, wte, 3, 4, 10));
  assert_int_equal(tz_compute_sync(e.gpu), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "99"));
  TZ_ASSERT_OK(tz_compute_sync(e.gpu));
  float *losses;
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, 3 * sizeof(float), (void **)&losses));
  TZ_ASSERT_OK(tz_compute_xent(e.gpu, losses, NULL, wte, dtok, 3, 10, 1.0f, 0.0f));
  assert_int_equal(tz_compute_sync(e.gpu), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "target"));
  TZ_ASSERT_OK(tz_compute_sync(e.gpu));
  tz_compute_free(e.gpu, losses);
  tz_compute_free(e.gpu, dtok);
  tz_compute_free(e.gpu, wte);
  tz_compute_free(e.gpu, x);
  env_close(&e);

  /* Gradients must be f32 or the storage dtype. */
  tz_compute *bad;
  struct tz_compute_params pp;
  tz_compute_params_init(&pp);
  pp.dtype = TZ_BF16;
  pp.grad_dtype = TZ_F16;
  assert_int_equal(tz_compute_create("cuda", &pp, &bad), TZ_ENOTSUP);
}

/* ---- elementwise ops with explicit dtypes: the same arithmetic as the cpu, bit for bit ---- */

struct ew_args {
  struct buf *x, *y, *out;
  enum tz_dtype dt, dt2;
  int which;
  size_t n;
};

static int ew_launch(tz_compute *cm, int gpu, void *p) {
  struct ew_args *a = p;
  switch (a->which) {
  case 0: return tz_compute_fill(cm, a->dt, SIDE(a->out, gpu), -1.75f, a->n);
  case 1: return tz_compute_scale(cm, a->dt, SIDE(a->out, gpu), 0.3f, a->n);
  case 2: return tz_compute_axpy(cm, a->dt, SIDE(a->out, gpu), -0.7f, SIDE(a->x, gpu), a->n);
  case 3:
    return tz_compute_add(cm, a->dt, SIDE(a->out, gpu), SIDE(a->x, gpu), SIDE(a->y, gpu), a->n);
  default: return tz_compute_cast(cm, SIDE(a->out, gpu), a->dt2, SIDE(a->x, gpu), a->dt, a->n);
  }
}

static void test_elementwise(void **state) {
  (void)state;
  g_failures = 0;
  struct env e;
  TZ_ASSERT_OK(env_open(&e, TZ_BF16, TZ_F32));
  static const size_t sizes[] = {1, 1000, (1u << 20) + 3};
  static const char *names[] = {"fill", "scale", "axpy", "add", "cast"};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    size_t n = sizes[si];
    for (int d = 0; d < 3; d++) {
      enum tz_dtype dt = storage_dtypes[d];
      for (int which = 0; which < 5; which++) {
        for (int d2 = 0; d2 < (which == 4 ? 3 : 1); d2++) {
          enum tz_dtype dt2 = which == 4 ? storage_dtypes[d2] : dt;
          struct buf x, y, out;
          buf_init(&e, &x, n, dt, dt);
          buf_init(&e, &y, n, dt, dt);
          buf_init(&e, &out, n, dt2, dt2);
          float *vx = randv(n, 3.0f), *vy = randv(n, 3.0f), *vo = randv(n, 3.0f);
          buf_set(&x, &e, vx);
          buf_set(&y, &e, vy);
          buf_set(&out, &e, vo);
          struct ew_args a = {
              .x = &x, .y = &y, .out = &out, .dt = dt, .dt2 = dt2, .which = which, .n = n};
          char name[96];
          snprintf(name, sizeof name, "%s %s->%s n=%zu", names[which], tz_dtype_name(dt),
                   tz_dtype_name(dt2), n);
          struct op op = {.name = name, .launch = ew_launch, .args = &a};
          /* exact: tolerance 0 */
          add_out(&op, &out, "out", 0.0);
          if (which == 1 || which == 2) /* in place */
            op.keep[op.n_keep++] = &out;
          run_op(&e, &op, NULL);
          free(vx), free(vy), free(vo);
          buf_fini(&e, &x), buf_fini(&e, &y), buf_fini(&e, &out);
        }
      }
    }
  }
  env_close(&e);
  assert_int_equal(g_failures, 0);
}

/* ---- tz_compute_sum: the order compute.h fixes, so the same bits as the cpu ---- */

struct sum_args {
  struct buf *x, *out;
  size_t n;
  int square, accumulate;
};

static int sum_launch(tz_compute *cm, int gpu, void *p) {
  struct sum_args *a = p;
  return a->square ? tz_compute_sumsq(cm, SIDE(a->out, gpu), a->x->gdt, SIDE(a->x, gpu), a->n,
                                      a->accumulate)
                   : tz_compute_sum(cm, SIDE(a->out, gpu), a->x->gdt, SIDE(a->x, gpu), a->n,
                                    a->accumulate);
}

static void test_sum(void **state) {
  (void)state;
  g_failures = 0;
  struct env e;
  TZ_ASSERT_OK(env_open(&e, TZ_BF16, TZ_F32));
  /* one chunk, a short last chunk, two levels, three levels (more than 1024^2 elements) */
  static const size_t sizes[] = {0, 1, 33, 1024, 1025, 40000, (1u << 20) + 1000};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
    for (int d = 0; d < 3; d++)
      for (int square = 0; square < 2; square++)
        for (int acc = 0; acc < 2; acc++) {
          size_t n = sizes[si];
          enum tz_dtype dt = storage_dtypes[d];
          struct buf x, out;
          buf_init(&e, &x, n, dt, dt);
          buf_init(&e, &out, 1, TZ_F32, TZ_F32);
          float *v = randv(n, 2.0f), start = 0.375f;
          buf_set(&x, &e, v);
          buf_set(&out, &e, &start);
          struct sum_args a = {.x = &x, .out = &out, .n = n, .square = square, .accumulate = acc};
          char name[96];
          snprintf(name, sizeof name, "%s %s n=%zu acc=%d", square ? "sumsq" : "sum",
                   tz_dtype_name(dt), n, acc);
          struct op op = {.name = name, .launch = sum_launch, .args = &a};
          add_out(&op, &out, "out", 0.0);
          op.keep[op.n_keep++] = &out;
          run_op(&e, &op, NULL);
          free(v);
          buf_fini(&e, &x), buf_fini(&e, &out);
        }
  env_close(&e);
  assert_int_equal(g_failures, 0);
}

/* ---- tz_compute_sumsq_segments: each segment the bits of tz_compute_sumsq on it ---- */

/* One shape: the cuda segments against the cuda per-segment calls and against the cpu backend's
 * segments (which test_compute_cpu shows equal its per-segment calls), all bit for bit, and the
 * same bits when run again. Values span 2^-emax .. 2^emax so that the order shows in the bits. */
static void segments_case(struct env *e, enum tz_dtype dt, size_t L, size_t S) {
  size_t n = L * S, esz = tz_dtype_size(dt);
  struct buf x, seg, per;
  buf_init(e, &x, n, dt, dt);
  buf_init(e, &seg, S, TZ_F32, TZ_F32);
  buf_init(e, &per, S, TZ_F32, TZ_F32);
  int emax = dt == TZ_F16 ? 6 : 30; /* f16 squares and sums stay finite */
  float *v = malloc((n ? n : 1) * sizeof *v);
  assert_non_null(v);
  for (size_t i = 0; i < n; i++)
    v[i] = ldexpf(urand(1.0f), (int)(tz_test_rand(&g_seed) % (uint64_t)(2 * emax + 1)) - emax);
  buf_set(&x, e, v);
  TZ_ASSERT_OK(tz_compute_sumsq_segments(g_cpu, seg.c, dt, x.c, L, S));
  float *ref = buf_get_cpu(&seg);
  buf_poison(&per, e);
  for (size_t j = 0; j < S; j++)
    TZ_ASSERT_OK(
        tz_compute_sumsq(e->gpu, (float *)per.g + j, dt, (const char *)x.g + j * L * esz, L, 0));
  float *one = buf_get_gpu(&per, e);
  float *got[2];
  for (int rep = 0; rep < 2; rep++) {
    buf_poison(&seg, e);
    TZ_ASSERT_OK(tz_compute_sumsq_segments(e->gpu, seg.g, dt, x.g, L, S));
    got[rep] = buf_get_gpu(&seg, e);
  }
  char what[128];
  snprintf(what, sizeof what, "sumsq_segments %s seg_len=%zu n_seg=%zu", tz_dtype_name(dt), L, S);
  check(what, got[0], ref, S, 0.0);
  check_bits(what, got[0], got[1], S * sizeof(float));
  snprintf(what, sizeof what, "sumsq_segments %s seg_len=%zu n_seg=%zu vs cuda sumsq",
           tz_dtype_name(dt), L, S);
  check_bits(what, got[0], one, S * sizeof(float));
  snprintf(what, sizeof what, "sumsq_segments %s seg_len=%zu n_seg=%zu vs cpu", tz_dtype_name(dt),
           L, S);
  check_bits(what, got[0], ref, S * sizeof(float));
  free(v), free(ref), free(one), free(got[0]), free(got[1]);
  buf_fini(e, &x), buf_fini(e, &seg), buf_fini(e, &per);
}

static void test_sumsq_segments(void **state) {
  (void)state;
  g_failures = 0;
  struct env e;
  TZ_ASSERT_OK(env_open(&e, TZ_BF16, TZ_F32));
  /* whole chunks, a short last chunk, one chunk, one element, empty segments */
  static const size_t lens[] = {16384, 1000, 1024, 3000, 1, 0};
  static const size_t segs[] = {1, 7};
  for (int d = 0; d < 3; d++)
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
      for (size_t si = 0; si < sizeof segs / sizeof segs[0]; si++)
        segments_case(&e, storage_dtypes[d], lens[li], segs[si]);
  /* the trainer's shape (a layer shard of a large model), many blocks at once */
  segments_case(&e, TZ_BF16, 16384, 2000);
  segments_case(&e, TZ_F32, 16384, 2000);
  /* more than TZ_SUM_CHUNK^2 elements a segment: three levels, kept in global scratch */
  segments_case(&e, TZ_BF16, 1024 * 1024 + 5, 3);
  /* no segments: nothing is written */
  struct buf out;
  buf_init(&e, &out, 2, TZ_F32, TZ_F32);
  float seven[2] = {7.0f, 7.0f};
  buf_set(&out, &e, seven);
  TZ_ASSERT_OK(tz_compute_sumsq_segments(e.gpu, out.g, TZ_BF16, NULL, 16384, 0));
  float *back = buf_get_gpu(&out, &e);
  assert_true(back[0] == 7.0f && back[1] == 7.0f);
  free(back);
  buf_fini(&e, &out);
  env_close(&e);
  assert_int_equal(g_failures, 0);
}

/* ---- matmul ---- */

struct mm_args {
  int ta, tb, M, N, K, lda, ldb, ldc;
  float alpha, beta;
  enum tz_dtype c_dt;
  struct buf *A, *B, *C;
};

static int mm_launch(tz_compute *cm, int gpu, void *p) {
  struct mm_args *a = p;
  return tz_compute_matmul(cm, a->ta, a->tb, a->M, a->N, a->K, a->alpha,
                           a->K ? SIDE(a->A, gpu) : NULL, a->lda, a->K ? SIDE(a->B, gpu) : NULL,
                           a->ldb, a->beta, SIDE(a->C, gpu), gpu ? a->c_dt : TZ_F32, a->ldc);
}

/* Sets up one matmul; returns the number of failed checks. With negative != 0 perturbs A. */
static int matmul_case(struct env *e, int ta, int tb, int M, int N, int K, int pad, float alpha,
                       float beta, enum tz_dtype c_dt, int negative) {
  struct mm_args a = {
      .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta, .c_dt = c_dt};
  a.lda = (ta ? M : K) + pad;
  a.ldb = (tb ? K : N) + pad;
  a.ldc = N + pad;
  if (a.lda < 1)
    a.lda = 1;
  if (a.ldb < 1)
    a.ldb = 1;
  size_t na = (size_t)(ta ? K : M) * a.lda, nb = (size_t)(tb ? N : K) * a.ldb;
  size_t nc = (size_t)M * a.ldc;
  struct buf A, B, C;
  buf_init(e, &A, na, TZ_F32, e->S);
  buf_init(e, &B, nb, TZ_F32, e->S);
  buf_init(e, &C, nc, TZ_F32, c_dt);
  float *va = randv(na, 1.0f), *vb = randv(nb, 1.0f), *vc = randv(nc, 1.0f);
  /* beta == 0 must ignore C, NaN included: the part of C the op writes starts as NaN, on both
   * sides (this is the poisoning; the padding columns keep values and must keep them) */
  if (beta == 0.0f)
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++)
        vc[(size_t)i * a.ldc + j] = NAN;
  buf_set(&A, e, va);
  buf_set(&B, e, vb);
  buf_set(&C, e, vc);
  a.A = &A, a.B = &B, a.C = &C;
  char name[128];
  snprintf(name, sizeof name, "matmul%s %s %c%c %dx%dx%d pad=%d a=%g b=%g ->%s%s",
           e->mm_plain ? " plain" : "", tz_dtype_name(e->S), ta ? 'T' : 'N', tb ? 'T' : 'N', M, N,
           K, pad, (double)alpha, (double)beta, tz_dtype_name(c_dt),
           negative ? " (perturbed)" : "");
  struct op op = {.name = name, .launch = mm_launch, .args = &a};
  /* C rounds once to c_dt; K products summed in float. C is put back before each run rather
   * than poisoned as a whole, since its padding columns must come back untouched. */
  add_out(&op, &C, "C", tol_of(c_dt, 1, K));
  op.keep[op.n_keep++] = &C;
  int failed = run_op(e, &op, negative ? &A : NULL);
  free(va), free(vb), free(vc);
  buf_fini(e, &A), buf_fini(e, &B), buf_fini(e, &C);
  return failed;
}

static void test_matmul(void **state) {
  (void)state;
  g_failures = 0;
  static const int shapes[][3] = {
      {1, 1, 1}, {17, 33, 65}, {64, 128, 256}, {130, 96, 200}, {8, 16, 0}};
  /* cuBLASLt for each storage dtype, then (TZ_CUDA_MATMUL=plain, read at create) the plain
   * kernel that takes the shapes cuBLASLt declines, for bf16 */
  const char *env = getenv("TZ_CUDA_MATMUL");
  for (int d = 0; d < 4; d++) {
    struct env e;
    if (d == 3)
      setenv("TZ_CUDA_MATMUL", "plain", 1);
    int rc = env_open(&e, storage_dtypes[d < 3 ? d : 0], TZ_F32);
    if (d == 3 && !env)
      unsetenv("TZ_CUDA_MATMUL");
    TZ_ASSERT_OK(rc);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int t = 0; t < 4; t++)
        for (int acc = 0; acc < 2; acc++)
          for (int cf = 0; cf < 2; cf++) {
            int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            enum tz_dtype c_dt = cf ? TZ_F32 : e.S;
            int pad = s == 2 ? 8 : 0;
            matmul_case(&e, t & 1, t >> 1, M, N, K, pad, acc ? 1.0f : 0.5f, acc ? 1.0f : 0.0f, c_dt,
                        0);
          }
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* ---- embedding ---- */

struct emb_args {
  struct buf *out, *wte, *dout, *dwte;
  struct ibuf *tok;
  int N, C, V, bwd;
};

static int emb_launch(tz_compute *cm, int gpu, void *p) {
  struct emb_args *a = p;
  if (a->bwd)
    return tz_compute_embedding_bwd(cm, SIDE(a->dwte, gpu), SIDE(a->dout, gpu), SIDE(a->tok, gpu),
                                    a->N, a->C, a->V);
  return tz_compute_embedding_fwd(cm, SIDE(a->out, gpu), SIDE(a->tok, gpu), SIDE(a->wte, gpu), a->N,
                                  a->C, a->V);
}

static void test_embedding(void **state) {
  (void)state;
  g_failures = 0;
  static const int shapes[][3] = {{1, 8, 3}, {300, 64, 50}, {257, 300, 1000}};
  for (int d = 0; d < 3; d++)
    for (int gf = 0; gf < 2; gf++) {
      struct env e;
      enum tz_dtype S = storage_dtypes[d];
      TZ_ASSERT_OK(env_open(&e, S, gf ? TZ_F32 : S));
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], C = shapes[s][1], V = shapes[s][2];
        int32_t *tok = malloc(sizeof(int32_t) * N);
        for (int n = 0; n < N; n++) /* repeats: a small range for half of them */
          tok[n] = (int32_t)(tz_test_rand(&g_seed) % (uint64_t)(n % 2 ? V : (V + 3) / 4));
        struct ibuf ti;
        ibuf_init(&e, &ti, tok, N);
        struct buf out, wte, dout, dwte;
        buf_init(&e, &out, (size_t)N * C, TZ_F32, S);
        buf_init(&e, &wte, (size_t)V * C, TZ_F32, S);
        buf_init(&e, &dout, (size_t)N * C, TZ_F32, S);
        buf_init(&e, &dwte, (size_t)V * C, TZ_F32, e.G);
        float *v1 = randv((size_t)V * C, 1.0f), *v2 = randv((size_t)N * C, 1.0f),
              *v3 = randv((size_t)V * C, 1.0f);
        buf_set(&wte, &e, v1);
        buf_set(&dout, &e, v2);
        buf_set(&dwte, &e, v3);
        struct emb_args a = {.out = &out,
                             .wte = &wte,
                             .dout = &dout,
                             .dwte = &dwte,
                             .tok = &ti,
                             .N = N,
                             .C = C,
                             .V = V};
        char name[96];
        snprintf(name, sizeof name, "embedding_fwd %s N=%d C=%d V=%d", tz_dtype_name(S), N, C, V);
        struct op fwd = {.name = name, .launch = emb_launch, .args = &a};
        add_out(&fwd, &out, "out", 0.0); /* a copy */
        run_op(&e, &fwd, NULL);
        a.bwd = 1;
        char name2[96];
        snprintf(name2, sizeof name2, "embedding_bwd %s G=%s N=%d C=%d V=%d", tz_dtype_name(S),
                 tz_dtype_name(e.G), N, C, V);
        struct op bwd = {.name = name2, .launch = emb_launch, .args = &a};
        /* repeats of a token summed in float (same order as the cpu), added once, one rounding */
        add_out(&bwd, &dwte, "dwte", tol_of(e.G, 1, N));
        bwd.keep[bwd.n_keep++] = &dwte;
        run_op(&e, &bwd, NULL);
        free(v1), free(v2), free(v3), free(tok);
        buf_fini(&e, &out), buf_fini(&e, &wte), buf_fini(&e, &dout), buf_fini(&e, &dwte);
        ibuf_fini(&e, &ti);
      }
      env_close(&e);
    }
  assert_int_equal(g_failures, 0);
}

/* ---- RMSNorm ---- */

/* The backward's residual: added onto dx (dres = dx), none (NULL), or another tensor's */
enum { RES_ONTO_DX, RES_NONE, RES_OTHER, RES_MODES };
static const char *const res_names[RES_MODES] = {"dres=dx", "dres=NULL", "dres=other"};

struct rms_args {
  struct buf *x, *w, *out, *rstd, *dout, *dx, *dw, *dres;
  int N, C, bwd, res;
  float w_offset; /* 0, or Gemma's 1 (test_variants_ops) */
};

static int rms_launch(tz_compute *cm, int gpu, void *p) {
  struct rms_args *a = p;
  if (a->bwd) {
    const void *dres = a->res == RES_ONTO_DX ? SIDE(a->dx, gpu)
                       : a->res == RES_OTHER ? SIDE(a->dres, gpu)
                                             : NULL;
    return tz_compute_rmsnorm_bwd(cm, SIDE(a->dx, gpu), dres, SIDE(a->dw, gpu), SIDE(a->dout, gpu),
                                  SIDE(a->x, gpu), SIDE(a->w, gpu), SIDE(a->rstd, gpu), a->N, a->C,
                                  a->w_offset);
  }
  return tz_compute_rmsnorm_fwd(cm, SIDE(a->out, gpu), SIDE(a->rstd, gpu), SIDE(a->x, gpu),
                                SIDE(a->w, gpu), a->N, a->C, 1e-5f, a->w_offset);
}

/* Forward, then backward in each residual mode, with the weight offset w_offset (0, or 1 with
 * weights near 0 as Gemma stores them); negative: the forward alone on a perturbed x. */
static int rmsnorm_case(struct env *e, int N, int C, int negative, float w_offset) {
  int before = g_failures;
  struct buf x, w, out, rstd, dout, dx, dw, dres;
  size_t NC = (size_t)N * C;
  buf_init(e, &x, NC, TZ_F32, e->S);
  buf_init(e, &w, C, TZ_F32, e->S);
  buf_init(e, &out, NC, TZ_F32, e->S);
  buf_init(e, &rstd, N, TZ_F32, TZ_F32);
  buf_init(e, &dout, NC, TZ_F32, e->S);
  buf_init(e, &dx, NC, TZ_F32, e->S);
  buf_init(e, &dw, C, TZ_F32, e->G);
  buf_init(e, &dres, NC, TZ_F32, e->S);
  float *vx = randv(NC, 2.0f), *vw = randv(C, w_offset != 0.0f ? 0.1f : 1.0f),
        *vd = randv(NC, 1.0f), *vdx = randv(NC, 1.0f), *vdw = randv(C, 1.0f),
        *vres = randv(NC, 1.0f);
  buf_set(&x, e, vx);
  buf_set(&w, e, vw);
  buf_set(&dout, e, vd);
  buf_set(&dx, e, vdx);
  buf_set(&dw, e, vdw);
  buf_set(&dres, e, vres);
  struct rms_args a = {.x = &x,
                       .dres = &dres,
                       .w = &w,
                       .out = &out,
                       .rstd = &rstd,
                       .dout = &dout,
                       .dx = &dx,
                       .dw = &dw,
                       .N = N,
                       .C = C,
                       .w_offset = w_offset};
  char name[96], off[24] = "";
  if (w_offset != 0.0f)
    snprintf(off, sizeof off, " w_offset=%g", (double)w_offset);
  snprintf(name, sizeof name, "rmsnorm_fwd %s N=%d C=%d%s%s", tz_dtype_name(e->S), N, C, off,
           negative ? " (perturbed)" : "");
  struct op fwd = {.name = name, .launch = rms_launch, .args = &a};
  add_out(&fwd, &out, "out", tol_of(e->S, 1, C));
  add_out(&fwd, &rstd, "rstd", tol_of(TZ_F32, 0, C));
  run_op(e, &fwd, negative ? &x : NULL);
  if (!negative) {
    /* backward from the cpu's rstd on both sides, so the inputs are the same */
    float *r = buf_get_cpu(&rstd);
    buf_set(&rstd, e, r);
    free(r);
    a.bwd = 1;
    for (a.res = 0; a.res < RES_MODES; a.res++) {
      buf_set(&dx, e, vdx);
      buf_set(&dw, e, vdw);
      snprintf(name, sizeof name, "rmsnorm_bwd %s G=%s N=%d C=%d%s %s", tz_dtype_name(e->S),
               tz_dtype_name(e->G), N, C, off, res_names[a.res]);
      struct op bwd = {.name = name, .launch = rms_launch, .args = &a};
      /* dx: the float result added onto the residual and rounded once; dw: N products summed
       * in float. Without the residual onto dx, dx is an output alone: poisoned before each
       * cuda run, so a kernel that read it would fail. */
      add_out(&bwd, &dx, "dx", tol_of(e->S, 1, C));
      add_out(&bwd, &dw, "dw", tol_of(e->G, 1, N));
      if (a.res == RES_ONTO_DX)
        bwd.keep[bwd.n_keep++] = &dx;
      bwd.keep[bwd.n_keep++] = &dw;
      run_op(e, &bwd, NULL);
    }
  }
  free(vx), free(vw), free(vd), free(vdx), free(vdw), free(vres);
  buf_fini(e, &x), buf_fini(e, &w), buf_fini(e, &out), buf_fini(e, &rstd);
  buf_fini(e, &dout), buf_fini(e, &dx), buf_fini(e, &dw), buf_fini(e, &dres);
  return g_failures - before;
}

static void test_rmsnorm(void **state) {
  (void)state;
  g_failures = 0;
  /* the backward's both kernels (the setting norm_bwd): every shape through each */
  static const char *const norm_bwd[] = {"norm_bwd=two-pass", "norm_bwd=one-pass"};
  /* besides the model widths, the q/k norms of Qwen3 (one row per token and head: N*H rows of
   * the head dim), more rows than one part of the weight gradient's sums holds; rows of one, two
   * and four chunks a thread (2056: two, the last chunk of a row short of a thread) and past the
   * chunks a thread keeps (9000, read again), and 13B's 5120 */
  static const int shapes[][2] = {{1, 8},           {37, 300},     {200, 4096},    {37 * 14, 64},
                                  {1, 80},          {65 * 16, 80}, {130 * 14, 96}, {8 * 16, 128},
                                  {4096 * 16, 128}, {3, 2056},     {70, 5120},     {5, 9000}};
  for (int m = 0; m < 2; m++)
    for (int d = 0; d < 3; d++)
      for (int gf = 0; gf < 2; gf++) {
        struct env e;
        enum tz_dtype S = storage_dtypes[d];
        TZ_ASSERT_OK(env_open_with(&e, S, gf ? TZ_F32 : S, norm_bwd[m], NULL));
        printf("  (%s)\n", norm_bwd[m]);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
          rmsnorm_case(&e, shapes[s][0], shapes[s][1], 0, 0.0f);
        env_close(&e);
      }
  assert_int_equal(g_failures, 0);
}

/* ---- RoPE ---- */

struct rope_args {
  struct buf *x;
  int B, T, nh, D, inverse;
  struct tz_rope rope;
  struct ibuf *pos; /* packed documents' positions, or NULL */
};

static int rope_launch(tz_compute *cm, int gpu, void *p) {
  struct rope_args *a = p;
  const int32_t *pos = a->pos ? SIDE(a->pos, gpu) : NULL;
  return a->inverse
             ? tz_compute_rope_bwd(cm, SIDE(a->x, gpu), a->B, a->T, a->nh, a->D, &a->rope, pos)
             : tz_compute_rope_fwd(cm, SIDE(a->x, gpu), a->B, a->T, a->nh, a->D, &a->rope, pos);
}

/* One rope call of a's shape and direction on random x, against the cpu backend; what names
 * the rope's kind in the check's line. */
static void rope_case(struct env *e, struct rope_args *a, const char *what) {
  size_t n = (size_t)a->B * a->T * a->nh * a->D;
  struct buf x;
  buf_init(e, &x, n, TZ_F32, e->S);
  float *v = randv(n, 2.0f);
  buf_set(&x, e, v);
  a->x = &x;
  char name[160];
  snprintf(name, sizeof name, "rope_%s %s B=%d T=%d nh=%d D=%d %s", a->inverse ? "bwd" : "fwd",
           tz_dtype_name(e->S), a->B, a->T, a->nh, a->D, what);
  struct op op = {.name = name, .launch = rope_launch, .args = a};
  add_out(&op, &x, "x", tol_of(e->S, 1, 2));
  op.keep[op.n_keep++] = &x;
  run_op(e, &op, NULL);
  free(v);
  buf_fini(e, &x);
}

/* Default RoPE at two bases, and Llama 3.1's llama3 scaling (theta 500000, factor 8, low 1,
 * high 4, original 8192) up to T = 8192 at the head dims of Llama 3 (128) and 3.2 1B (64). For
 * each shape the kinds alternate on one instance with the same (T, D), so a cos/sin table kept
 * from the previous kind would fail the check. */
static void test_rope(void **state) {
  (void)state;
  g_failures = 0;
  static const int shapes[][4] = {{2, 17, 3, 8},    {1, 130, 4, 64},   {2, 64, 2, 128},
                                  {1, 8192, 2, 64}, {1, 8192, 1, 128}, {2, 1000, 3, 128}};
  static const struct tz_rope ropes[] = {
      {.theta = 10000.0},
      {.theta = 500000.0},
      {.theta = 500000.0,
       .type = TZ_ROPE_LLAMA3,
       .factor = 8.0,
       .low_freq_factor = 1.0,
       .high_freq_factor = 4.0,
       .original_max_pos = 8192},
      /* a small original context, so that T = 130 already spans all three frequency bands */
      {.theta = 10000.0,
       .type = TZ_ROPE_LLAMA3,
       .factor = 4.0,
       .low_freq_factor = 1.0,
       .high_freq_factor = 4.0,
       .original_max_pos = 64},
  };
  for (int d = 0; d < 3; d++) {
    struct env e;
    TZ_ASSERT_OK(env_open(&e, storage_dtypes[d], TZ_F32));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (size_t ri = 0; ri < sizeof ropes / sizeof ropes[0]; ri++)
        for (int inv = 0; inv < 2; inv++) {
          struct rope_args a = {.B = shapes[s][0],
                                .T = shapes[s][1],
                                .nh = shapes[s][2],
                                .D = shapes[s][3],
                                .inverse = inv,
                                .rope = ropes[ri]};
          char what[64];
          snprintf(what, sizeof what, "theta=%g %s", a.rope.theta,
                   a.rope.type == TZ_ROPE_LLAMA3 ? "llama3" : "default");
          rope_case(&e, &a, what);
        }
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* Partial rotary with its cos and sin factor (the setting variants=on): Phi-4-mini's 96 of 128
 * dims with longrope's attention factor, 12 of 16, and 24 of 64 (a rotated half not a multiple
 * of the 16-byte kernel's 8: the plain kernel), against the cpu backend; the dims past R must
 * come back as they went (the check covers every element). */
static void test_rope_partial(void **state) {
  (void)state;
  g_failures = 0;
  static const int shapes[][5] = {{2, 70, 3, 128, 96}, {1, 33, 4, 16, 12}, {2, 40, 2, 64, 24}};
  static const double mscales[] = {0.0, 1.19};
  for (int d = 0; d < 3; d++) {
    struct env e;
    TZ_ASSERT_OK(env_open_with(&e, storage_dtypes[d], TZ_F32, "variants=on", NULL));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int m = 0; m < 2; m++)
        for (int inv = 0; inv < 2; inv++) {
          struct rope_args a = {
              .B = shapes[s][0],
              .T = shapes[s][1],
              .nh = shapes[s][2],
              .D = shapes[s][3],
              .inverse = inv,
              .rope = {.theta = 10000.0, .rot = shapes[s][4], .mscale = mscales[m]}};
          char what[64];
          snprintf(what, sizeof what, "R=%d mscale=%g", a.rope.rot, a.rope.mscale);
          rope_case(&e, &a, what);
        }
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* ---- bias ---- */

struct bias_args {
  struct buf *x, *b, *dy, *db;
  int N, n, grad;
};

static int bias_launch(tz_compute *cm, int gpu, void *p) {
  struct bias_args *a = p;
  if (a->grad)
    return tz_compute_bias_grad(cm, SIDE(a->db, gpu), SIDE(a->dy, gpu), a->N, a->n);
  return tz_compute_bias_add(cm, SIDE(a->x, gpu), SIDE(a->b, gpu), a->N, a->n);
}

/* One (N, n): add against the cpu, and bit for bit against the cpu's float result rounded to S
 * (one float addition, one rounding on both sides); grad against the cpu, onto a non-zero db.
 * Then both again on the cuda side from tensors that start one element past a 16-byte boundary
 * (the kernels' one-element path): the same bits as from aligned ones (the vector path, where n
 * allows it), since which columns a thread owns does not change any column's order. */
static void bias_case(struct env *e, int N, int n) {
  size_t Nn = (size_t)N * n, es = tz_dtype_size(e->S);
  struct buf x, b, dy, db;
  buf_init(e, &x, Nn, TZ_F32, e->S);
  buf_init(e, &b, n, TZ_F32, e->S);
  buf_init(e, &dy, Nn, TZ_F32, e->S);
  buf_init(e, &db, n, TZ_F32, e->G);
  float *vx = randv(Nn, 2.0f), *vb = randv(n, 1.0f), *vdy = randv(Nn, 1.0f), *vdb = randv(n, 4.0f);
  buf_set(&x, e, vx);
  buf_set(&b, e, vb);
  buf_set(&dy, e, vdy);
  buf_set(&db, e, vdb);
  struct bias_args a = {.x = &x, .b = &b, .dy = &dy, .db = &db, .N = N, .n = n};
  char name[128];
  snprintf(name, sizeof name, "bias_add %s N=%d n=%d", tz_dtype_name(e->S), N, n);
  struct op add = {.name = name, .launch = bias_launch, .args = &a};
  add_out(&add, &x, "x", tol_of(e->S, 1, 1));
  add.keep[add.n_keep++] = &x;
  run_op(e, &add, NULL);
  float *ref = buf_get_cpu(&x), *gx = buf_get_gpu(&x, e);
  for (size_t i = 0; i < Nn; i++)
    ref[i] = round_to(e->S, ref[i]);
  snprintf(name, sizeof name, "bias_add %s N=%d n=%d vs cpu rounded to S", tz_dtype_name(e->S), N,
           n);
  check_bits(name, gx, ref, Nn * sizeof(float));

  a.grad = 1;
  snprintf(name, sizeof name, "bias_grad %s G=%s N=%d n=%d", tz_dtype_name(e->S),
           tz_dtype_name(e->G), N, n);
  struct op grad = {.name = name, .launch = bias_launch, .args = &a};
  /* N values summed in float in another order than the cpu's, added onto db, one rounding */
  add_out(&grad, &db, "db", tol_of(e->G, 1, N));
  grad.keep[grad.n_keep++] = &db;
  run_op(e, &grad, NULL);
  float *gdb = buf_get_gpu(&db, e);

  /* the unaligned tensors: the same values one element into fresh buffers */
  void *xu, *dyu;
  TZ_ASSERT_OK(tz_compute_alloc(e->gpu, (Nn + 1) * es, &xu));
  TZ_ASSERT_OK(tz_compute_alloc(e->gpu, (Nn + 1) * es, &dyu));
  upload(e->gpu, (char *)xu + es, x.host, Nn, e->S);
  upload(e->gpu, (char *)dyu + es, dy.host, Nn, e->S);
  TZ_ASSERT_OK(tz_compute_bias_add(e->gpu, (char *)xu + es, b.g, N, n));
  float *ux = malloc((Nn ? Nn : 1) * sizeof *ux);
  assert_non_null(ux);
  download(e->gpu, ux, (char *)xu + es, Nn, e->S);
  snprintf(name, sizeof name, "bias_add %s N=%d n=%d unaligned vs aligned", tz_dtype_name(e->S), N,
           n);
  check_bits(name, ux, gx, Nn * sizeof(float));
  buf_restore_gpu(&db, e);
  TZ_ASSERT_OK(tz_compute_bias_grad(e->gpu, db.g, (char *)dyu + es, N, n));
  float *udb = buf_get_gpu(&db, e);
  snprintf(name, sizeof name, "bias_grad %s G=%s N=%d n=%d unaligned vs aligned",
           tz_dtype_name(e->S), tz_dtype_name(e->G), N, n);
  check_bits(name, udb, gdb, (size_t)n * sizeof(float));
  tz_compute_free(e->gpu, xu);
  tz_compute_free(e->gpu, dyu);
  free(ref), free(gx), free(gdb), free(ux), free(udb);
  free(vx), free(vb), free(vdy), free(vdb);
  buf_fini(e, &x), buf_fini(e, &b), buf_fini(e, &dy), buf_fini(e, &db);
}

/* bias_grad of Qwen2.5-7B's q projection over 8192 tokens (N = 8192, n = 3584, bf16): the best
 * of 10 calls must take under 0.1 ms (bias.cu derives a floor of 12 us from the bandwidth). */
static void bias_grad_speed(struct env *e) {
#ifdef TZ_HAVE_CUDA
  enum { N = 8192, n = 3584 };
  void *dy, *db;
  TZ_ASSERT_OK(tz_compute_alloc(e->gpu, (size_t)N * n * 2, &dy));
  TZ_ASSERT_OK(tz_compute_alloc(e->gpu, (size_t)n * 4, &db));
  TZ_ASSERT_OK(tz_compute_fill(e->gpu, TZ_BF16, dy, 0.25f, (size_t)N * n));
  TZ_ASSERT_OK(tz_compute_zero(e->gpu, db, (size_t)n * 4));
  cudaStream_t st = (cudaStream_t)tz_compute_stream(e->gpu);
  cudaEvent_t ev[2];
  assert_int_equal(cudaEventCreate(&ev[0]), cudaSuccess);
  assert_int_equal(cudaEventCreate(&ev[1]), cudaSuccess);
  float best = INFINITY;
  for (int rep = 0; rep < 11; rep++) {
    assert_int_equal(cudaEventRecord(ev[0], st), cudaSuccess);
    TZ_ASSERT_OK(tz_compute_bias_grad(e->gpu, db, dy, N, n));
    assert_int_equal(cudaEventRecord(ev[1], st), cudaSuccess);
    TZ_ASSERT_OK(tz_compute_sync(e->gpu));
    float ms = 0;
    assert_int_equal(cudaEventElapsedTime(&ms, ev[0], ev[1]), cudaSuccess);
    if (rep > 0 && ms < best) /* the first call grows the scratch */
      best = ms;
  }
  printf("  bias_grad bf16 N=%d n=%d: best of 10 %.1f us (floor 12.2 us at 4.8 TB/s)\n", N, n,
         1000.0 * best);
  if (!(best < 0.1f)) {
    printf("  bias_grad takes %.3f ms, more than 0.1: FAIL\n", (double)best);
    g_failures++;
  }
  /* every call added 8192 values of 0.25 to each column (all exact in float): 11 x 2048 */
  float *h = malloc((size_t)n * 4);
  assert_non_null(h);
  TZ_ASSERT_OK(tz_compute_copy_out(e->gpu, h, db, (size_t)n * 4));
  for (int j = 0; j < n; j++)
    if (h[j] != 11 * 2048.0f) {
      printf("  bias_grad speed run: db[%d] = %g, not %g: FAIL\n", j, (double)h[j], 11 * 2048.0);
      g_failures++;
      break;
    }
  free(h);
  cudaEventDestroy(ev[0]);
  cudaEventDestroy(ev[1]);
  tz_compute_free(e->gpu, dy);
  tz_compute_free(e->gpu, db);
#else
  (void)e;
#endif
}

static void test_bias(void **state) {
  (void)state;
  g_failures = 0;
  /* (N, n): one row, one column, n odd and not a multiple of 8 (one-element path), multiples of
   * 8 (vector path), rows below, at and past a part of the gradient's sums (256) and its warps'
   * unrolled groups (64), Qwen2.5's q and k widths */
  static const int shapes[][2] = {{1, 1},    {1, 7},      {1, 8},     {3, 5},
                                  {37, 100}, {64, 24},    {255, 33},  {256, 1536},
                                  {257, 40}, {1000, 999}, {513, 256}, {2049, 3584}};
  for (int d = 0; d < 3; d++)
    for (int gf = 0; gf < 2; gf++) {
      struct env e;
      enum tz_dtype S = storage_dtypes[d];
      TZ_ASSERT_OK(env_open(&e, S, gf ? TZ_F32 : S));
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        bias_case(&e, shapes[s][0], shapes[s][1]);
      if (S == TZ_BF16 && gf)
        bias_grad_speed(&e);
      env_close(&e);
    }
  assert_int_equal(g_failures, 0);
}

/* ---- attention ---- */

struct attn_args {
  struct buf *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv, *delta;
  int B, T, H, Hkv, D, bwd;
  struct ibuf *pos;               /* packed documents' positions, or NULL */
  const struct tz_attn_opts *opt; /* the variants, or NULL */
};

static int attn_launch(tz_compute *cm, int gpu, void *p) {
  struct attn_args *a = p;
  if (a->bwd)
    return tz_compute_attention_bwd(cm, SIDE(a->dq, gpu), SIDE(a->dk, gpu), SIDE(a->dv, gpu),
                                    SIDE(a->delta, gpu), SIDE(a->dout, gpu), SIDE(a->q, gpu),
                                    SIDE(a->k, gpu), SIDE(a->v, gpu), SIDE(a->out, gpu),
                                    SIDE(a->lse, gpu), a->B, a->T, a->H, a->Hkv, a->D,
                                    a->pos ? SIDE(a->pos, gpu) : NULL, a->opt);
  return tz_compute_attention_fwd(cm, SIDE(a->out, gpu), SIDE(a->lse, gpu), SIDE(a->q, gpu),
                                  SIDE(a->k, gpu), SIDE(a->v, gpu), a->B, a->T, a->H, a->Hkv, a->D,
                                  a->pos ? SIDE(a->pos, gpu) : NULL, a->opt);
}

/* Whether the cuda instance runs this shape on tensor cores (attention_mma.cu: 16-bit storage,
 * D a multiple of 4 up to 128, D = 32, 64, 128 at their exact width and the others padded), which
 * keeps probabilities and score gradients in S: one more rounding stage. */
static int on_tensor_cores(const struct env *e, int D, int simple) {
  return !simple && e->S != TZ_F32 && D % 4 == 0 && D <= 128;
}

static void attention_case_opt(struct env *e, int B, int T, int H, int Hkv, int D, int simple,
                               const int32_t *pos, const struct tz_attn_opts *opt);
static void attention_case(struct env *e, int B, int T, int H, int Hkv, int D, int simple) {
  attention_case_opt(e, B, T, H, Hkv, D, simple, NULL, NULL);
}
static void attention_case_pos(struct env *e, int B, int T, int H, int Hkv, int D, int simple,
                               const int32_t *pos) {
  attention_case_opt(e, B, T, H, Hkv, D, simple, pos, NULL);
}

/* One forward and backward against the cpu backend; pos: packed documents (NULL: none); opt:
 * the variants (NULL: none), named in the lines as scale/cap/window. */
static void attention_case_opt(struct env *e, int B, int T, int H, int Hkv, int D, int simple,
                               const int32_t *pos, const struct tz_attn_opts *opt) {
  size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * H * T;
  struct buf q, k, v, out, lse, dout, dq, dk, dv, delta;
  buf_init(e, &q, nq, TZ_F32, e->S);
  buf_init(e, &k, nk, TZ_F32, e->S);
  buf_init(e, &v, nk, TZ_F32, e->S);
  buf_init(e, &out, nq, TZ_F32, e->S);
  buf_init(e, &lse, nl, TZ_F32, TZ_F32);
  buf_init(e, &dout, nq, TZ_F32, e->S);
  buf_init(e, &dq, nq, TZ_F32, e->S);
  buf_init(e, &dk, nk, TZ_F32, e->S);
  buf_init(e, &dv, nk, TZ_F32, e->S);
  buf_init(e, &delta, nl, TZ_F32, TZ_F32);
  /* scores of order one: q and k entries of 1.5 / D^(1/4) */
  float sc = 1.5f / sqrtf(sqrtf((float)D));
  float *vq = randv(nq, sc), *vk = randv(nk, sc), *vv = randv(nk, 1.0f), *vd = randv(nq, 1.0f);
  buf_set(&q, e, vq);
  buf_set(&k, e, vk);
  buf_set(&v, e, vv);
  buf_set(&dout, e, vd);
  struct attn_args a = {.q = &q,
                        .k = &k,
                        .v = &v,
                        .out = &out,
                        .lse = &lse,
                        .dout = &dout,
                        .dq = &dq,
                        .dk = &dk,
                        .dv = &dv,
                        .delta = &delta,
                        .B = B,
                        .T = T,
                        .H = H,
                        .Hkv = Hkv,
                        .D = D,
                        .opt = opt};
  struct ibuf pb;
  if (pos) {
    ibuf_init(e, &pb, pos, B * T);
    a.pos = &pb;
  }
  /* on the tensor cores (auto's: warpgroup MMA on sm_90, else mma.sync), else the plain ones */
  int tc = on_tensor_cores(e, D, simple);
  const char *path = pos ? (tc ? "packed mma" : "packed plain") : tc ? "mma" : "plain";
  char var[64] = "";
  if (opt)
    snprintf(var, sizeof var, " scale=%g cap=%g window=%d", (double)opt->scale,
             (double)opt->softcap, opt->window);
  char name[160];
  snprintf(name, sizeof name, "attention_fwd %s %s B=%d T=%d H=%d Hkv=%d D=%d%s", path,
           tz_dtype_name(e->S), B, T, H, Hkv, D, var);
  struct op fwd = {.name = name, .launch = attn_launch, .args = &a};
  add_out(&fwd, &out, "out", tol_of(e->S, tc ? 2 : 1, T));
  add_out(&fwd, &lse, "lse", tol_of(TZ_F32, 0, D * (double)T));
  run_op(e, &fwd, NULL);
  /* backward from the cpu's out and lse on both sides */
  float *o = buf_get_cpu(&out), *l = buf_get_cpu(&lse);
  buf_set(&out, e, o);
  buf_set(&lse, e, l);
  free(o), free(l);
  a.bwd = 1;
  snprintf(name, sizeof name, "attention_bwd %s %s B=%d T=%d H=%d Hkv=%d D=%d%s",
           tc && e->attn_bwd ? e->attn_bwd : path, tz_dtype_name(e->S), B, T, H, Hkv, D, var);
  struct op bwd = {.name = name, .launch = attn_launch, .args = &a};
  double K = (double)T * (H / Hkv);
  add_out(&bwd, &dq, "dq", tol_of(e->S, tc ? 3 : 1, K));
  add_out(&bwd, &dk, "dk", tol_of(e->S, tc ? 3 : 1, K));
  add_out(&bwd, &dv, "dv", tol_of(e->S, tc ? 2 : 1, K));
  add_out(&bwd, &delta, "delta", tol_of(TZ_F32, 0, D));
  run_op(e, &bwd, NULL);
  free(vq), free(vk), free(vv), free(vd);
  buf_fini(e, &q), buf_fini(e, &k), buf_fini(e, &v), buf_fini(e, &out), buf_fini(e, &lse);
  buf_fini(e, &dout), buf_fini(e, &dq), buf_fini(e, &dk), buf_fini(e, &dv);
  buf_fini(e, &delta);
  if (pos)
    ibuf_fini(e, &pb);
}

/* Packed documents (kernels/compute.h): attention confined to each document and RoPE by
 * position in it, against the cpu backend, at head dims 64 to 128 with grouped-query ratios to
 * 7:1, rows of documents of 1 token to the whole row (and a row of single tokens); bf16 on auto's
 * kernels (on sm_90 the warpgroup-MMA ones), on the mma.sync ones by name (two-pass) and on the
 * plain ones (TZ_CUDA_ATTENTION=simple), f32 on the plain ones. RoPE at the same positions. */
static void test_attention_packed(void **state) {
  (void)state;
  g_failures = 0;
  enum { B = 3, T = 200 };
  static const int docs[B][8] = {{1, 5, 37, 64, 93}, {200}, {31, 1, 1, 33, 2, 132}};
  int32_t pos[B * T];
  for (int b = 0; b < B; b++)
    for (int i = 0, t = 0; docs[b][i]; i++)
      for (int j = 0; j < docs[b][i]; j++)
        pos[b * T + t++] = j;
  int32_t ones[70];
  memset(ones, 0, sizeof ones); /* 70 documents of one token */
  static const int shapes[][3] = {{8, 8, 64}, {8, 2, 80}, {7, 1, 96}, {8, 4, 128}, {4, 1, 64}};
  static const enum tz_dtype dts[] = {TZ_BF16, TZ_BF16, TZ_F32, TZ_BF16};
  const char *env_was = getenv("TZ_CUDA_ATTENTION");
  for (int d = 0; d < 4; d++) {
    struct env e;
    int simple = d == 1 || (env_was && strcmp(env_was, "simple") == 0);
    if (d == 1)
      setenv("TZ_CUDA_ATTENTION", "simple", 1);
    /* d 3: the mma.sync kernels by name, which auto leaves for the warpgroup-MMA ones on sm_90 */
    int rc = d == 3 ? env_open_twopass(&e, dts[d]) : env_open(&e, dts[d], TZ_F32);
    if (d == 1 && !env_was)
      unsetenv("TZ_CUDA_ATTENTION");
    TZ_ASSERT_OK(rc);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      attention_case_pos(&e, B, T, shapes[s][0], shapes[s][1], shapes[s][2], simple, pos);
    attention_case_pos(&e, 1, 70, 4, 2, 64, simple, ones);
    for (int inv = 0; inv < 2; inv++) {
      struct ibuf pb;
      ibuf_init(&e, &pb, pos, B * T);
      struct rope_args a = {.B = B,
                            .T = T,
                            .nh = 4,
                            .D = 128,
                            .inverse = inv,
                            .rope = {.theta = 500000.0},
                            .pos = &pb};
      size_t n = (size_t)B * T * 4 * 128;
      struct buf x;
      buf_init(&e, &x, n, TZ_F32, e.S);
      float *v = randv(n, 2.0f);
      buf_set(&x, &e, v);
      a.x = &x;
      char name[96];
      snprintf(name, sizeof name, "rope_%s packed %s B=%d T=%d", inv ? "bwd" : "fwd",
               tz_dtype_name(e.S), B, T);
      struct op op = {.name = name, .launch = rope_launch, .args = &a};
      add_out(&op, &x, "x", tol_of(e.S, 1, 2));
      op.keep[op.n_keep++] = &x;
      run_op(&e, &op, NULL);
      free(v);
      buf_fini(&e, &x);
      ibuf_fini(&e, &pb);
    }
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

static void test_attention(void **state) {
  (void)state;
  g_failures = 0;
  /* (B, T, H, Hkv, D): T of one row, below, at and past a tile (64) and not a multiple of it;
   * GQA groups of 1, 2, 3, 4 and 6; head dims at an exact tensor-core width (32, 64, 128) and
   * padded (8, 24, 40: widths 32 and 64); test_attention_padded has the other widths, and the
   * head dims the tensor cores do not take. */
  static const int shapes[][5] = {{1, 1, 1, 1, 32},    {2, 65, 4, 2, 32},  {1, 130, 6, 2, 64},
                                  {1, 200, 4, 4, 128}, {1, 64, 8, 2, 128}, {2, 100, 4, 1, 24},
                                  {1, 77, 2, 2, 8},    {1, 150, 6, 1, 64}, {1, 33, 3, 1, 40}};
  /* TZ_CUDA_ATTENTION=simple, read when an instance is created, selects the plain kernels: set
   * here for the second instance of each 16-bit dtype, and honoured when the caller sets it. */
  const char *env = getenv("TZ_CUDA_ATTENTION");
  int forced = env && strcmp(env, "simple") == 0;
  for (int d = 0; d < 3; d++)
    for (int simple = 0; simple < (storage_dtypes[d] == TZ_F32 ? 1 : 2); simple++) {
      struct env e;
      if (simple)
        setenv("TZ_CUDA_ATTENTION", "simple", 1);
      int rc = env_open(&e, storage_dtypes[d], TZ_F32);
      if (simple && !forced)
        unsetenv("TZ_CUDA_ATTENTION");
      TZ_ASSERT_OK(rc);
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        attention_case(&e, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                       simple || forced);
      env_close(&e);
    }
  /* the mma.sync kernels by name (two-pass), which auto leaves for the warpgroup-MMA ones at
   * bf16 on an sm_90 device, for both 16-bit dtypes */
  for (int d = 0; d < 2; d++) {
    struct env e;
    TZ_ASSERT_OK(env_open_twopass(&e, storage_dtypes[d]));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      attention_case(&e, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                     forced);
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* Head dims the tensor-core kernels pad to a width of 16k (columns D..DP-1 zero): D = 100 (the
 * OpenLLaMA-3B shape: 3200 / 32 heads, rows only 8-byte aligned, width 112), 80, 96, 112, 120,
 * 52 and 20; and head dims they do not take, which go to the plain kernels: 18 (not a multiple
 * of 4) and 144 (above 128). 16-bit storage only (f32 always runs the plain kernels, which
 * test_attention covers); same checks and tolerances as test_attention. */
static void test_attention_padded(void **state) {
  (void)state;
  g_failures = 0;
  static const int ts[] = {1, 37, 128, 200};
  /* (B, T, H, Hkv, D) besides the D = 100 and 80 matrices below */
  static const int shapes[][5] = {{2, 37, 4, 2, 96},   {2, 200, 4, 4, 96},  {2, 128, 4, 2, 112},
                                  {1, 200, 4, 4, 112}, {1, 130, 4, 2, 120}, {2, 65, 4, 1, 52},
                                  {1, 70, 2, 2, 20},   {1, 50, 4, 2, 18},   {1, 66, 2, 1, 144}};
  const char *env = getenv("TZ_CUDA_ATTENTION");
  int forced = env && strcmp(env, "simple") == 0;
  for (int d = 0; d < 4; d++) {
    struct env e;
    /* auto's kernels, then the mma.sync ones by name (two-pass: auto's are the warpgroup-MMA
     * ones at bf16 on an sm_90 device), for each 16-bit dtype */
    if (d < 2)
      TZ_ASSERT_OK(env_open(&e, storage_dtypes[d], TZ_F32));
    else
      TZ_ASSERT_OK(env_open_twopass(&e, storage_dtypes[d - 2]));
    for (int dim = 0; dim < 2; dim++)
      for (int t = 0; t < 4; t++)
        for (int hkv = 4; hkv >= 2; hkv /= 2)
          attention_case(&e, 2, ts[t], 4, hkv, dim == 0 ? 100 : 80, forced);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      attention_case(&e, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                     forced);
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* The head dims and grouped-query ratios of the model families: D = 64 (Llama 3.2 1B, Qwen2.5
 * 0.5B), 80, 96 (padded tensor-core widths), 128 (Llama 3 8B, Qwen2.5 1.5B and 7B, Qwen3,
 * Mistral-Nemo); groups of 7 (Qwen2.5: 14 or 28 query heads on 2 or 4) and 8 (Llama 3 70B,
 * 16 on 2), at T of one row, within and past a tile. bf16 on auto's kernels, on the mma.sync
 * ones by name (two-pass) and on the plain ones, fp16 on tensor cores, f32 on the plain kernels. */
static void test_attention_families(void **state) {
  (void)state;
  g_failures = 0;
  static const int dims[] = {64, 80, 96, 128};
  static const int groups[][2] = {{14, 2}, {16, 2}, {28, 4}};
  static const int ts[] = {1, 77, 130};
  const char *env = getenv("TZ_CUDA_ATTENTION");
  int forced = env && strcmp(env, "simple") == 0;
  static const struct {
    enum tz_dtype S;
    int simple, twopass; /* twopass: the mma.sync kernels by name (bf16's auto on sm_90: wgmma) */
  } modes[] = {{TZ_BF16, 0, 0}, {TZ_BF16, 1, 0}, {TZ_F16, 0, 0}, {TZ_F32, 0, 0}, {TZ_BF16, 0, 1}};
  for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
    struct env e;
    if (modes[m].simple)
      setenv("TZ_CUDA_ATTENTION", "simple", 1);
    int rc = modes[m].twopass ? env_open_twopass(&e, modes[m].S) : env_open(&e, modes[m].S, TZ_F32);
    if (modes[m].simple && !forced)
      unsetenv("TZ_CUDA_ATTENTION");
    TZ_ASSERT_OK(rc);
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
      for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
        for (size_t t = 0; t < sizeof ts / sizeof ts[0]; t++) {
          if (groups[g][0] == 28 && ts[t] != 77)
            continue; /* the 7:1 ratio at two kv heads covers the rest */
          attention_case(&e, 1 + (int)(t == 1), ts[t], groups[g][0], groups[g][1], dims[di],
                         modes[m].simple || forced);
        }
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* The families' variants (kernels/compute.h, struct tz_attn_opts; the setting variants=on):
 * Gemma's scale, softcapped scores (a cap of 2 at scores of order one, where tanh bends them),
 * sliding windows of 1, 7, 64 and 100 keys (within a tile, at one, across tiles; a window past
 * T is none), windows inside packed documents, and all at once; head dims 64, 96 and 128 on auto's
 * kernels (on sm_90 the warpgroup-MMA ones), the mma.sync ones by name (two-pass) and the plain
 * ones, 256 (Gemma's) on the plain ones, grouped-query ratios up to 4:1. Against the cpu backend,
 * bf16 on every path and f32 on the plain kernels. An instance without the setting refuses each
 * variant by name. */
static void test_attention_variants(void **state) {
  (void)state;
  g_failures = 0;
  enum { B = 2, T = 200 };
  static const struct tz_attn_opts opts[] = {
      {.scale = 0.2f}, {.softcap = 2.0f},
      {.window = 1},   {.window = 7},
      {.window = 64},  {.window = 100},
      {.window = 300}, {.scale = 0.0625f, .softcap = 2.0f, .window = 37},
  };
  static const int shapes[][3] = {{4, 2, 64}, {4, 4, 96}, {4, 1, 128}};
  int32_t pos[B * T]; /* documents of 90 and 110 tokens, then of 13, 150 and 37 */
  static const int docs[B][4] = {{90, 110}, {13, 150, 37}};
  for (int b = 0; b < B; b++)
    for (int i = 0, t = 0; i < 4 && docs[b][i]; i++)
      for (int j = 0; j < docs[b][i]; j++)
        pos[b * T + t++] = j;
  const char *env_was = getenv("TZ_CUDA_ATTENTION");
  static const enum tz_dtype dts[] = {TZ_BF16, TZ_BF16, TZ_F32, TZ_BF16};
  for (int d = 0; d < 4; d++) {
    struct env e;
    int simple = d == 1 || (env_was && strcmp(env_was, "simple") == 0);
    if (d == 1)
      setenv("TZ_CUDA_ATTENTION", "simple", 1);
    /* d 3: the mma.sync kernels by name, which auto leaves for the warpgroup-MMA ones on sm_90 */
    int rc = d == 3
                 ? env_open_with(&e, dts[d], TZ_F32, "variants=on,attention=two-pass", "two-pass")
                 : env_open_with(&e, dts[d], TZ_F32, "variants=on", NULL);
    if (d == 1 && !env_was)
      unsetenv("TZ_CUDA_ATTENTION");
    TZ_ASSERT_OK(rc);
    for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++)
      for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        attention_case_opt(&e, B, T, shapes[s][0], shapes[s][1], shapes[s][2], simple, NULL,
                           &opts[o]);
    /* windows inside documents; Gemma's head dim on the plain kernels */
    static const struct tz_attn_opts in_docs[] = {
        {.window = 7}, {.window = 100}, {.softcap = 2.0f}};
    for (size_t o = 0; o < sizeof in_docs / sizeof in_docs[0]; o++)
      attention_case_opt(&e, B, T, 4, 2, 64, simple, pos, &in_docs[o]);
    attention_case_opt(&e, 1, 70, 2, 1, 256, simple, NULL, &opts[7]);
    env_close(&e);
  }
  /* with the setting off (TZ_CUDA_VARIANTS, which would win, cleared): refused by name, nothing
   * run */
  const char *var_env = getenv("TZ_CUDA_VARIANTS");
  char var_was[16] = "";
  if (var_env)
    snprintf(var_was, sizeof var_was, "%s", var_env);
  unsetenv("TZ_CUDA_VARIANTS");
  struct env e;
  TZ_ASSERT_OK(env_open_with(&e, TZ_BF16, TZ_F32, "variants=off", NULL));
  struct buf q, lse;
  buf_init(&e, &q, (size_t)64 * 4 * 64, TZ_F32, e.S);
  buf_init(&e, &lse, (size_t)64 * 4, TZ_F32, TZ_F32);
  for (size_t o = 0; o < 3; o++) {
    int rc =
        tz_compute_attention_fwd(e.gpu, q.g, lse.g, q.g, q.g, q.g, 1, 64, 4, 4, 64, NULL, &opts[o]);
    assert_int_equal(rc, TZ_ENOTSUP);
    assert_non_null(strstr(tz_err_msg(), "attention_fwd with"));
  }
  buf_fini(&e, &q), buf_fini(&e, &lse);
  env_close(&e);
  if (var_env)
    setenv("TZ_CUDA_VARIANTS", var_was, 1);
  assert_int_equal(g_failures, 0);
}

/* tierzero.cuda_attention wgmma: the forward and backward on Hopper's warpgroup MMA
 * (attention_wgmma.cu) at bf16, head dims 128, 64 (tiles of 64 columns) and 80 and 96 (padded
 * to 128), against the float64 reference and twice to the same bits: one row, within, at and past
 * a key tile of 64, many tiles with a partial last one, grouped-query heads up to 7:1; and fp16,
 * which it declines and the other kernels run. On a device other than sm_90 every call
 * declines. */
static void test_attention_wgmma(void **state) {
  (void)state;
  g_failures = 0;
  /* head dim 128, and by name (tierzero.cuda_attention wgmma) 64 exactly and 80 and 96 padded to
   * 128, with grouped-query ratios up to 7:1 and sequences short of, at and past a tile */
  static const int shapes[][5] = {{1, 1, 2, 2, 128},    {2, 63, 4, 2, 128},   {1, 64, 4, 4, 128},
                                  {2, 65, 4, 1, 128},   {1, 200, 8, 8, 128},  {1, 1030, 4, 2, 128},
                                  {1, 130, 28, 4, 128}, {1, 130, 14, 2, 128}, {1, 77, 4, 2, 64},
                                  {1, 1, 2, 2, 64},     {2, 65, 4, 1, 64},    {1, 1030, 14, 2, 64},
                                  {1, 63, 8, 8, 80},    {2, 130, 14, 2, 80},  {1, 1, 4, 4, 96},
                                  {1, 200, 28, 4, 96},  {2, 1030, 8, 2, 96}};
  const char *env = getenv("TZ_CUDA_ATTENTION");
  int forced = env && strcmp(env, "simple") == 0;
  for (int d = 0; d < 2; d++) {
    struct env e;
    TZ_ASSERT_OK(env_open_with(&e, storage_dtypes[d], TZ_F32, "attention=wgmma", "wgmma"));
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
      attention_case(&e, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][4],
                     forced);
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* tierzero.cuda_attention wgmma with packed documents and the variants (the masked calls, auto's
 * on sm_90 too): documents of 1 token to the whole row and a row of
 * single tokens, the scale, a softcap, windows within a tile, at one, across tiles and past T,
 * windows inside documents, all at once; head dims 64, 80, 96 and 128 with grouped-query ratios
 * to 7:1; and at T 1030, where the blocks past the first documents' and windows' tiles start
 * their keys late (the first key tile past 0) and mask the tiles a window cuts. Against the cpu
 * backend, bf16 (the kernels' only dtype); on a device other than sm_90 the choice gives these
 * calls the mma.sync kernels. */
static void test_attention_wgmma_masked(void **state) {
  (void)state;
  g_failures = 0;
  enum { B = 3, T = 200, TL = 1030 };
  static const int docs[B][8] = {{1, 5, 37, 64, 93}, {200}, {31, 1, 1, 33, 2, 132}};
  static const int docs_long[2][8] = {{70, 500, 1, 129, 330}, {1030}};
  int32_t pos[B * T], pos_long[2 * TL], ones[70];
  for (int b = 0; b < B; b++)
    for (int i = 0, t = 0; docs[b][i]; i++)
      for (int j = 0; j < docs[b][i]; j++)
        pos[b * T + t++] = j;
  for (int b = 0; b < 2; b++)
    for (int i = 0, t = 0; docs_long[b][i]; i++)
      for (int j = 0; j < docs_long[b][i]; j++)
        pos_long[b * TL + t++] = j;
  memset(ones, 0, sizeof ones); /* 70 documents of one token */
  static const struct tz_attn_opts opts[] = {
      {.scale = 0.2f}, {.softcap = 2.0f},
      {.window = 1},   {.window = 7},
      {.window = 64},  {.window = 100},
      {.window = 300}, {.scale = 0.0625f, .softcap = 2.0f, .window = 37},
  };
  static const int shapes[][3] = {{8, 8, 64}, {8, 2, 80}, {7, 1, 96}, {8, 4, 128}, {4, 1, 64}};
  const char *env = getenv("TZ_CUDA_ATTENTION");
  int forced = env && strcmp(env, "simple") == 0;
  struct env e;
  TZ_ASSERT_OK(env_open_with(&e, TZ_BF16, TZ_F32, "attention=wgmma,variants=on", "wgmma"));
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    attention_case_pos(&e, B, T, shapes[s][0], shapes[s][1], shapes[s][2], forced, pos);
  attention_case_pos(&e, 1, 70, 4, 2, 64, forced, ones);
  for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++)
    for (size_t s = 1; s < 4; s++)
      attention_case_opt(&e, 2, T, shapes[s][0], shapes[s][1], shapes[s][2], forced, NULL,
                         &opts[o]);
  static const struct tz_attn_opts in_docs[] = {{.window = 7}, {.window = 100}, {.softcap = 2.0f}};
  for (size_t o = 0; o < sizeof in_docs / sizeof in_docs[0]; o++)
    attention_case_opt(&e, B, T, 4, 2, 64, forced, pos, &in_docs[o]);
  /* long rows: documents across many tiles, windows that start the blocks' keys late */
  attention_case_pos(&e, 2, TL, 4, 2, 128, forced, pos_long);
  attention_case_opt(&e, 2, TL, 4, 1, 128, forced, NULL, &opts[5]);
  attention_case_opt(&e, 2, TL, 4, 2, 96, forced, pos_long, &opts[6]);
  attention_case_opt(&e, 1, TL, 4, 4, 64, forced, NULL, &opts[7]);
  env_close(&e);
  assert_int_equal(g_failures, 0);
}

/* ---- SwiGLU ---- */

struct swiglu_args {
  struct buf *g, *u, *out, *dout, *dg, *du;
  size_t n;
  int bwd, rebuild; /* rebuild: the backward writes the forward's out too */
  enum tz_glu act;  /* TZ_GLU_SILU (0), or TZ_GLU_GELU_TANH (test_variants_ops) */
};

static int swiglu_launch(tz_compute *cm, int gpu, void *p) {
  struct swiglu_args *a = p;
  if (a->bwd)
    return tz_compute_glu_bwd(cm, a->act, SIDE(a->dg, gpu), SIDE(a->du, gpu),
                              a->rebuild ? SIDE(a->out, gpu) : NULL, SIDE(a->dout, gpu),
                              SIDE(a->g, gpu), SIDE(a->u, gpu), a->n);
  return tz_compute_glu_fwd(cm, a->act, SIDE(a->out, gpu), SIDE(a->g, gpu), SIDE(a->u, gpu), a->n);
}

/* act's forward, its backward, and the backward that rebuilds out (the forward's bits exactly),
 * on n elements */
static void glu_case(struct env *e, enum tz_glu act, size_t n) {
  const char *act_name = act == TZ_GLU_GELU_TANH ? "geglu" : "swiglu";
  struct buf g, u, out, dout, dg, du;
  buf_init(e, &g, n, TZ_F32, e->S);
  buf_init(e, &u, n, TZ_F32, e->S);
  buf_init(e, &out, n, TZ_F32, e->S);
  buf_init(e, &dout, n, TZ_F32, e->S);
  buf_init(e, &dg, n, TZ_F32, e->S);
  buf_init(e, &du, n, TZ_F32, e->S);
  float *v1 = randv(n, 6.0f), *v2 = randv(n, 2.0f), *v3 = randv(n, 1.0f);
  buf_set(&g, e, v1);
  buf_set(&u, e, v2);
  buf_set(&dout, e, v3);
  struct swiglu_args a = {
      .g = &g, .u = &u, .out = &out, .dout = &dout, .dg = &dg, .du = &du, .n = n, .act = act};
  char name[96];
  snprintf(name, sizeof name, "%s_fwd %s n=%zu", act_name, tz_dtype_name(e->S), n);
  struct op fwd = {.name = name, .launch = swiglu_launch, .args = &a};
  add_out(&fwd, &out, "out", tol_of(e->S, 1, 1));
  run_op(e, &fwd, NULL);
  a.bwd = 1;
  snprintf(name, sizeof name, "%s_bwd %s n=%zu", act_name, tz_dtype_name(e->S), n);
  struct op bwd = {.name = name, .launch = swiglu_launch, .args = &a};
  add_out(&bwd, &dg, "dg", tol_of(e->S, 1, 1));
  add_out(&bwd, &du, "du", tol_of(e->S, 1, 1));
  run_op(e, &bwd, NULL);
  /* the backward that rebuilds out: out the forward's bits exactly */
  float *fwd_out = buf_get_gpu(&out, e);
  a.rebuild = 1;
  snprintf(name, sizeof name, "%s_bwd+out %s n=%zu", act_name, tz_dtype_name(e->S), n);
  struct op bwd2 = {.name = name, .launch = swiglu_launch, .args = &a};
  add_out(&bwd2, &dg, "dg", tol_of(e->S, 1, 1));
  add_out(&bwd2, &du, "du", tol_of(e->S, 1, 1));
  add_out(&bwd2, &out, "out", tol_of(e->S, 1, 1));
  run_op(e, &bwd2, NULL);
  float *bwd_out = buf_get_gpu(&out, e);
  snprintf(name, sizeof name, "%s_bwd+out out against %s_fwd", act_name, act_name);
  check_bits(name, bwd_out, fwd_out, n * sizeof(float));
  free(fwd_out), free(bwd_out);
  free(v1), free(v2), free(v3);
  buf_fini(e, &g), buf_fini(e, &u), buf_fini(e, &out);
  buf_fini(e, &dout), buf_fini(e, &dg), buf_fini(e, &du);
}

static void test_swiglu(void **state) {
  (void)state;
  g_failures = 0;
  static const size_t sizes[] = {1, 999, 300000};
  for (int d = 0; d < 3; d++) {
    struct env e;
    TZ_ASSERT_OK(env_open(&e, storage_dtypes[d], TZ_F32));
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
      glu_case(&e, TZ_GLU_SILU, sizes[s]);
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* ---- 16-byte vectors or single elements: alignment changes no bit ----
 * The elementwise ops, RoPE and RMSNorm take 16 bytes at a time where every tensor (every row)
 * starts on 16 bytes, one element at a time elsewhere. Each op runs on tensors at an aligned
 * address and again on the same values one element further on, and the two results must be the
 * same bits. */

/* n values of dt on the gpu, one element past base's start when shifted (base: what to free) */
static void *put_shifted(tz_compute *cm, const float *v, size_t n, enum tz_dtype dt, int shifted,
                         void **base) {
  size_t es = tz_dtype_size(dt);
  TZ_ASSERT_OK(tz_compute_alloc(cm, (n + 1) * es, base));
  char *p = (char *)*base + (shifted ? es : 0);
  upload(cm, p, v, n, dt);
  return p;
}

#define SHIFT_MAX 8
struct shifted_op {
  const char *name;
  int n_in, n_out; /* tensors: inputs first, then outputs */
  size_t n[SHIFT_MAX];
  enum tz_dtype dt[SHIFT_MAX];
  int (*launch)(tz_compute *cm, void *const *t, const struct shifted_op *op);
  int B, T, H, D; /* shapes for rope and rmsnorm */
};

static int sh_add(tz_compute *cm, void *const *t, const struct shifted_op *op) {
  return tz_compute_add(cm, op->dt[0], t[2], t[0], t[1], op->n[0]);
}
static int sh_axpy(tz_compute *cm, void *const *t, const struct shifted_op *op) {
  return tz_compute_axpy(cm, op->dt[0], t[1], -0.7f, t[0], op->n[0]);
}
static int sh_swiglu_fwd(tz_compute *cm, void *const *t, const struct shifted_op *op) {
  return tz_compute_glu_fwd(cm, TZ_GLU_SILU, t[2], t[0], t[1], op->n[0]);
}
static int sh_swiglu_bwd(tz_compute *cm, void *const *t, const struct shifted_op *op) {
  return tz_compute_glu_bwd(cm, TZ_GLU_SILU, t[3], t[4], t[5], t[0], t[1], t[2], op->n[0]);
}
static int sh_rope(tz_compute *cm, void *const *t, const struct shifted_op *op) {
  struct tz_rope r = {.theta = 10000.0, .type = TZ_ROPE_DEFAULT};
  return tz_compute_rope_fwd(cm, t[0], op->B, op->T, op->H, op->D, &r, NULL);
}
/* t: x, w, dout, dres, out, rstd, dx, dw */
static int sh_rmsnorm(tz_compute *cm, void *const *t, const struct shifted_op *op) {
  int N = op->B, C = op->D;
  TZ_CHECK(tz_compute_rmsnorm_fwd(cm, t[4], t[5], t[0], t[1], N, C, 1e-5f, 0.0f));
  return tz_compute_rmsnorm_bwd(cm, t[6], t[3], t[7], t[2], t[0], t[1], t[5], N, C, 0.0f);
}

static void shifted_case(struct env *e, const struct shifted_op *op) {
  int nt = op->n_in + op->n_out;
  float *in[SHIFT_MAX] = {0}, *got[2][SHIFT_MAX] = {{0}};
  for (int i = 0; i < nt; i++)
    in[i] = randv(op->n[i], 2.0f);
  for (int shifted = 0; shifted < 2; shifted++) {
    void *base[SHIFT_MAX], *t[SHIFT_MAX];
    for (int i = 0; i < nt; i++)
      t[i] = put_shifted(e->gpu, in[i], op->n[i], op->dt[i], shifted, &base[i]);
    TZ_ASSERT_OK(op->launch(e->gpu, t, op));
    for (int i = op->n_in; i < nt; i++) {
      got[shifted][i] = malloc(op->n[i] * sizeof(float));
      assert_non_null(got[shifted][i]);
      download(e->gpu, got[shifted][i], t[i], op->n[i], op->dt[i]);
    }
    for (int i = 0; i < nt; i++)
      tz_compute_free(e->gpu, base[i]);
  }
  for (int i = op->n_in; i < nt; i++) {
    char what[96];
    snprintf(what, sizeof what, "%s %s output %d, shifted", op->name, tz_dtype_name(e->S), i);
    check_bits(what, got[1][i], got[0][i], op->n[i] * sizeof(float));
    free(got[0][i]), free(got[1][i]);
  }
  for (int i = 0; i < nt; i++)
    free(in[i]);
}

static void test_unaligned_same_bits(void **state) {
  (void)state;
  g_failures = 0;
  for (int d = 0; d < 3; d++) {
    struct env e;
    enum tz_dtype S = storage_dtypes[d], F = TZ_F32;
    TZ_ASSERT_OK(env_open(&e, S, TZ_F32));
    size_t n = 100003;
    struct shifted_op ops[] = {
        {"add", 2, 1, {n, n, n}, {S, S, S}, sh_add, 0, 0, 0, 0},
        {"axpy", 1, 1, {n, n}, {S, S}, sh_axpy, 0, 0, 0, 0},
        {"swiglu_fwd", 2, 1, {n, n, n}, {S, S, S}, sh_swiglu_fwd, 0, 0, 0, 0},
        {"swiglu_bwd+out", 3, 3, {n, n, n, n, n, n}, {S, S, S, S, S, S}, sh_swiglu_bwd, 0, 0, 0, 0},
        {"rope", 0, 1, {(size_t)2 * 33 * 4 * 128}, {S}, sh_rope, 2, 33, 4, 128},
        {"rmsnorm",
         4,
         4,
         {(size_t)37 * 4096, 4096, (size_t)37 * 4096, (size_t)37 * 4096, (size_t)37 * 4096, 37,
          (size_t)37 * 4096, 4096},
         {S, S, S, S, S, F, S, F},
         sh_rmsnorm,
         37,
         0,
         0,
         4096},
        {"rmsnorm (warp rows)",
         4,
         4,
         {(size_t)300 * 128, 128, (size_t)300 * 128, (size_t)300 * 128, (size_t)300 * 128, 300,
          (size_t)300 * 128, 128},
         {S, S, S, S, S, F, S, F},
         sh_rmsnorm,
         300,
         0,
         0,
         128},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
      shifted_case(&e, &ops[i]);
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* ---- cross-entropy ---- */

struct xent_args {
  struct buf *logits, *losses, *dlogits; /* dlogits NULL: forward only; == logits: in place */
  struct ibuf *tgt;
  int N, V;
  float dscale;
  float softcap; /* 0, or Gemma 2's final logit softcap (test_variants_ops) */
};

static int xent_launch(tz_compute *cm, int gpu, void *p) {
  struct xent_args *a = p;
  return tz_compute_xent(cm, SIDE(a->losses, gpu), a->dlogits ? SIDE(a->dlogits, gpu) : NULL,
                         SIDE(a->logits, gpu), SIDE(a->tgt, gpu), a->N, a->V, a->dscale,
                         a->softcap);
}

/* One cross-entropy on (N, V) logits uniform in [-scale, scale), through the softcap unless 0;
 * mode 0 the forward only, 1 with separate dlogits, 2 in place. Every fifth row has no target. */
static void xent_case(struct env *e, int N, int V, int mode, float softcap, float scale) {
  int32_t *tgt = malloc(sizeof(int32_t) * N);
  assert_non_null(tgt);
  for (int n = 0; n < N; n++) /* every fifth row no target (TZ_TARGET_IGNORE) */
    tgt[n] = n % 5 == 3 ? TZ_TARGET_IGNORE : (int32_t)(tz_test_rand(&g_seed) % (uint64_t)V);
  struct ibuf ti;
  ibuf_init(e, &ti, tgt, N);
  struct buf logits, losses, dl;
  buf_init(e, &logits, (size_t)N * V, TZ_F32, e->S);
  buf_init(e, &losses, N, TZ_F32, TZ_F32);
  buf_init(e, &dl, (size_t)N * V, TZ_F32, e->S);
  float *v = randv((size_t)N * V, scale);
  buf_set(&logits, e, v);
  struct xent_args a = {.logits = &logits,
                        .losses = &losses,
                        .tgt = &ti,
                        .N = N,
                        .V = V,
                        .dscale = 0.5f,
                        .softcap = softcap};
  a.dlogits = mode == 0 ? NULL : mode == 1 ? &dl : &logits;
  char name[96], cap[24] = "";
  if (softcap > 0.0f)
    snprintf(cap, sizeof cap, " softcap=%g", (double)softcap);
  snprintf(name, sizeof name, "xent %s N=%d V=%d%s %s", tz_dtype_name(e->S), N, V, cap,
           mode == 0   ? "fwd"
           : mode == 1 ? "fwd+bwd"
                       : "in place");
  struct op op = {.name = name, .launch = xent_launch, .args = &a};
  add_out(&op, &losses, "losses", tol_of(TZ_F32, 0, V));
  if (mode == 1)
    add_out(&op, &dl, "dlogits", tol_of(e->S, 1, V));
  if (mode == 2) {
    add_out(&op, &logits, "dlogits", tol_of(e->S, 1, V));
    op.keep[op.n_keep++] = &logits;
  }
  run_op(e, &op, NULL);
  free(v), free(tgt);
  buf_fini(e, &logits), buf_fini(e, &losses), buf_fini(e, &dl);
  ibuf_fini(e, &ti);
}

static void test_xent(void **state) {
  (void)state;
  g_failures = 0;
  static const int shapes[][2] = {{1, 1}, {7, 1000}, {5, 32003}, {3, 128256}};
  for (int d = 0; d < 3; d++) {
    struct env e;
    TZ_ASSERT_OK(env_open(&e, storage_dtypes[d], TZ_F32));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      for (int mode = 0; mode < 3; mode++) /* forward only, separate dlogits, in place */
        xent_case(&e, shapes[s][0], shapes[s][1], mode, 0.0f, 8.0f);
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

/* ---- the families' variants (Gemma's math) ----
 * On an instance with the setting variants=on, at bf16 and f32 storage, against the cpu backend:
 * RMSNorm with the weight offset 1 (weights near 0, as Gemma stores them), GeGLU (gelu with tanh)
 * forward and backward, cross-entropy through a softcap of 30 on logits up to 50 (so the cap
 * bends them), and the softcap op at 50 on logits up to 100. An instance without the setting
 * refuses the offset by name. TZ_CUDA_VARIANTS would win over the settings, so the test clears it
 * while it runs and puts it back. */

struct softcap_args {
  struct buf *logits;
  size_t n;
  float cap;
};

static int softcap_launch(tz_compute *cm, int gpu, void *p) {
  struct softcap_args *a = p;
  return tz_compute_softcap(cm, SIDE(a->logits, gpu), a->n, a->cap);
}

static void test_variants_ops(void **state) {
  (void)state;
  g_failures = 0;
  const char *env = getenv("TZ_CUDA_VARIANTS");
  char *saved = env ? strdup(env) : NULL;
  unsetenv("TZ_CUDA_VARIANTS");
  /* the warp per row with a short last chunk and whole ones, the block per row with one, two
   * and more chunks a thread than it keeps */
  static const int rms_shapes[][2] = {{37, 300}, {8 * 16, 128}, {70, 4096}, {3, 2056}, {5, 9000}};
  static const size_t glu_sizes[] = {1, 999, 300000};
  static const int xent_shapes[][2] = {{7, 1000}, {5, 32003}};
  static const enum tz_dtype dts[] = {TZ_BF16, TZ_F32};
  for (int d = 0; d < 2; d++) {
    struct env e;
    TZ_ASSERT_OK(env_open_with(&e, dts[d], TZ_F32, "variants=on", NULL));
    for (size_t s = 0; s < sizeof rms_shapes / sizeof rms_shapes[0]; s++)
      rmsnorm_case(&e, rms_shapes[s][0], rms_shapes[s][1], 0, 1.0f);
    for (size_t s = 0; s < sizeof glu_sizes / sizeof glu_sizes[0]; s++)
      glu_case(&e, TZ_GLU_GELU_TANH, glu_sizes[s]);
    for (size_t s = 0; s < sizeof xent_shapes / sizeof xent_shapes[0]; s++)
      for (int mode = 0; mode < 3; mode++)
        xent_case(&e, xent_shapes[s][0], xent_shapes[s][1], mode, 30.0f, 50.0f);
    for (size_t s = 0; s < sizeof glu_sizes / sizeof glu_sizes[0]; s++) {
      size_t n = glu_sizes[s];
      struct buf l;
      buf_init(&e, &l, n, TZ_F32, e.S);
      float *v = randv(n, 100.0f);
      buf_set(&l, &e, v);
      struct softcap_args a = {.logits = &l, .n = n, .cap = 50.0f};
      char name[96];
      snprintf(name, sizeof name, "softcap=50 %s n=%zu", tz_dtype_name(e.S), n);
      struct op op = {.name = name, .launch = softcap_launch, .args = &a};
      add_out(&op, &l, "logits", tol_of(e.S, 1, 1));
      op.keep[op.n_keep++] = &l; /* in place */
      run_op(&e, &op, NULL);
      free(v);
      buf_fini(&e, &l);
    }
    env_close(&e);
  }
  /* without the setting: the offset refused by name before anything runs */
  struct env e;
  TZ_ASSERT_OK(env_open_with(&e, TZ_BF16, TZ_F32, "variants=off", NULL));
  void *x, *w, *out, *rstd;
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, 8 * tz_dtype_size(TZ_BF16), &x));
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, 8 * tz_dtype_size(TZ_BF16), &w));
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, 8 * tz_dtype_size(TZ_BF16), &out));
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, sizeof(float), &rstd));
  assert_int_equal(tz_compute_rmsnorm_fwd(e.gpu, out, rstd, x, w, 1, 8, 1e-5f, 1.0f), TZ_ENOTSUP);
  assert_non_null(strstr(tz_err_msg(), "offset"));
  tz_compute_free(e.gpu, x), tz_compute_free(e.gpu, w);
  tz_compute_free(e.gpu, out), tz_compute_free(e.gpu, rstd);
  env_close(&e);
  if (saved) {
    setenv("TZ_CUDA_VARIANTS", saved, 1);
    free(saved);
  }
  assert_int_equal(g_failures, 0);
}

/* ---- the negative control: the same checks must fail on perturbed input ---- */

static void test_negative_control(void **state) {
  (void)state;
  struct env e;
  TZ_ASSERT_OK(env_open(&e, TZ_BF16, TZ_F32));
  printf("  (the two checks below must FAIL: one input of the cuda side is perturbed by 1e-2)\n");
  g_failures = 0;
  int failed = matmul_case(&e, 0, 1, 64, 128, 256, 8, 1.0f, 0.0f, TZ_BF16, 1);
  assert_true(failed > 0);
  failed = rmsnorm_case(&e, 37, 300, 1, 0.0f);
  assert_true(failed > 0);
  g_failures = 0;
  env_close(&e);
}

/* ---- the whole tiny model ---- */

/* Loss and every gradient of the tiny model (grouped-query attention, tied embeddings, odd T)
 * on cuda with storage S against the cpu backend. Every activation is rounded to S on the cuda
 * side, layer after layer, forward and backward, so the tolerance grows with depth: tol_loss and
 * tol_grad are stated by the caller. Also: a second step gives the same bits, and the
 * checkpointed (recomputing) backward gives the same bits as the stored-activation one. */
static void model_case(enum tz_dtype S, int B, int T, double tol_loss, double tol_grad) {
  struct tz_model_config cfg;
  TZ_ASSERT_OK(tz_model_preset("tiny", &cfg));
  struct env e;
  TZ_ASSERT_OK(env_open(&e, S, TZ_F32));
  int nb = tz_model_n_blocks(&cfg), N = B * T;
  int32_t *tok = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
  for (int n = 0; n < N; n++) {
    tok[n] = (int32_t)(tz_test_rand(&g_seed) % (uint64_t)cfg.vocab);
    tgt[n] = (int32_t)(tz_test_rand(&g_seed) % (uint64_t)cfg.vocab);
  }
  /* parameters: the reference test's distribution, rounded to S for both sides */
  double **P = ref_blocks_alloc(&cfg);
  assert_non_null(P);
  ref_blocks_randomize(&cfg, P, 99, 0.1);
  void **cp = calloc(nb, sizeof *cp), **gp = calloc(nb, sizeof *gp);
  void **cg = calloc(nb, sizeof *cg), **gg = calloc(nb, sizeof *gg);
  float **host = calloc(nb, sizeof *host);
  for (int b = 0; b < nb; b++) {
    uint64_t n = tz_model_block_numel(&cfg, b);
    host[b] = malloc(n * sizeof(float));
    for (uint64_t i = 0; i < n; i++)
      host[b][i] = round_to(S, (float)P[b][i]);
    TZ_ASSERT_OK(tz_compute_alloc(g_cpu, n * 4, &cp[b]));
    TZ_ASSERT_OK(tz_compute_alloc(g_cpu, n * 4, &cg[b]));
    TZ_ASSERT_OK(tz_compute_alloc(e.gpu, n * tz_dtype_size(S), &gp[b]));
    TZ_ASSERT_OK(tz_compute_alloc(e.gpu, n * 4, &gg[b]));
    upload(g_cpu, cp[b], host[b], n, TZ_F32);
    upload(e.gpu, gp[b], host[b], n, S);
    TZ_ASSERT_OK(tz_compute_zero(g_cpu, cg[b], n * 4));
  }
  tz_model_runner *rc_, *rg, *rg_ck;
  TZ_ASSERT_OK(tz_model_runner_create(g_cpu, &cfg, B, T, 0, &rc_));
  TZ_ASSERT_OK(tz_model_runner_create(e.gpu, &cfg, B, T, 0, &rg));
  TZ_ASSERT_OK(tz_model_runner_create(e.gpu, &cfg, B, T, 1, &rg_ck));
  float loss_c, loss_g[3];
  TZ_ASSERT_OK(tz_model_runner_step(rc_, cp, cg, tok, tgt, 0.0f, &loss_c));
  float **grads[3];
  for (int run = 0; run < 3; run++) {
    for (int b = 0; b < nb; b++)
      TZ_ASSERT_OK(tz_compute_zero(e.gpu, gg[b], tz_model_block_numel(&cfg, b) * 4));
    TZ_ASSERT_OK(tz_model_runner_step(run == 2 ? rg_ck : rg, gp, gg, tok, tgt, 0.0f, &loss_g[run]));
    grads[run] = calloc(nb, sizeof(float *));
    for (int b = 0; b < nb; b++) {
      uint64_t n = tz_model_block_numel(&cfg, b);
      grads[run][b] = malloc(n * sizeof(float));
      download(e.gpu, grads[run][b], gg[b], n, TZ_F32);
    }
  }
  char what[128];
  snprintf(what, sizeof what, "model %s B=%d T=%d loss (cpu %.6f cuda %.6f)", tz_dtype_name(S), B,
           T, (double)loss_c, (double)loss_g[0]);
  check(what, &loss_g[0], &loss_c, 1, tol_loss);
  for (int b = 0; b < nb; b++) {
    uint64_t n = tz_model_block_numel(&cfg, b);
    float *ref = malloc(n * sizeof(float));
    download(g_cpu, ref, cg[b], n, TZ_F32);
    struct tz_block_layout l;
    TZ_ASSERT_OK(tz_model_block_layout(&cfg, b, &l));
    for (int t = 0; t < l.n; t++) {
      snprintf(what, sizeof what, "model %s block %d grad %s", tz_dtype_name(S), b, l.t[t].name);
      check(what, grads[0][b] + l.t[t].offset, ref + l.t[t].offset, l.t[t].numel, tol_grad);
    }
    snprintf(what, sizeof what, "model %s block %d grads, second run", tz_dtype_name(S), b);
    check_bits(what, grads[0][b], grads[1][b], n * sizeof(float));
    snprintf(what, sizeof what, "model %s block %d grads, checkpointed", tz_dtype_name(S), b);
    check_bits(what, grads[0][b], grads[2][b], n * sizeof(float));
    free(ref);
  }
  check_bits("model loss, second run", &loss_g[0], &loss_g[1], sizeof(float));
  check_bits("model loss, checkpointed", &loss_g[0], &loss_g[2], sizeof(float));
  for (int run = 0; run < 3; run++) {
    for (int b = 0; b < nb; b++)
      free(grads[run][b]);
    free(grads[run]);
  }
  tz_model_runner_destroy(rc_);
  tz_model_runner_destroy(rg);
  tz_model_runner_destroy(rg_ck);
  for (int b = 0; b < nb; b++) {
    tz_compute_free(g_cpu, cp[b]);
    tz_compute_free(g_cpu, cg[b]);
    tz_compute_free(e.gpu, gp[b]);
    tz_compute_free(e.gpu, gg[b]);
    free(host[b]);
  }
  free(cp), free(gp), free(cg), free(gg), free(host);
  ref_blocks_free(&cfg, P);
  free(tok), free(tgt);
  env_close(&e);
}

static void test_model(void **state) {
  (void)state;
  g_failures = 0;
  /* f32 storage: only the order of float sums differs from the cpu; 2^-20 sqrt(K) with K up to
   * a few thousand terms per sum, times the handful of sums on a gradient's path. */
  model_case(TZ_F32, 2, 100, 1e-5, 1e-4);
  /* bf16 storage: a parameter gradient of the first layer sits at the end of about 40 roundings
   * to bf16 (each layer rounds ~10 activations forward and backward, plus the head), each
   * ~u/sqrt(3) RMS and independent, so sqrt(40) * 2^-8 / sqrt(3) ~ 0.014 norm-wise. The cpu
   * backend with every storage output rounded to bf16 (an emulation of this test's setup, three
   * seeds) gives 0.008 to 0.018 per tensor and loss errors below 1e-4. The tolerances keep a
   * margin of 3 to 4 over that: 2^-4 for gradients, 2^-10 for the loss. A wrong kernel moves a
   * gradient by O(1). */
  model_case(TZ_BF16, 2, 100, 0x1p-10, 0x1p-4);
  assert_int_equal(g_failures, 0);
}

/* ---- params.stream: the instance works on the caller's stream and leaves it alive ---- */

static void test_stream(void **state) {
  (void)state;
#ifdef TZ_HAVE_CUDA
  cudaStream_t s;
  assert_int_equal(cudaStreamCreate(&s), cudaSuccess);
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  p.dtype = TZ_BF16;
  p.stream = s;
  tz_compute *gpu;
  TZ_ASSERT_OK(tz_compute_create("cuda", &p, &gpu));
  assert_ptr_equal(tz_compute_stream(gpu), (void *)s);
  /* C (M,N) f32 = A (M,K) B (K,N) bf16, small integers: every product and sum is exact */
  enum { M = 64, N = 48, K = 80 };
  float *a = malloc(M * K * sizeof *a), *b = malloc(K * N * sizeof *b);
  float *c = malloc(M * N * sizeof *c);
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  for (int i = 0; i < M * K; i++)
    a[i] = (float)(i % 3 - 1);
  for (int i = 0; i < K * N; i++)
    b[i] = (float)(i % 5 - 2);
  void *da, *db, *dc;
  TZ_ASSERT_OK(tz_compute_alloc(gpu, M * K * 2, &da));
  TZ_ASSERT_OK(tz_compute_alloc(gpu, K * N * 2, &db));
  TZ_ASSERT_OK(tz_compute_alloc(gpu, M * N * 4, &dc));
  upload(gpu, da, a, M * K, TZ_BF16);
  upload(gpu, db, b, K * N, TZ_BF16);
  TZ_ASSERT_OK(tz_compute_matmul(gpu, 0, 0, M, N, K, 1.0f, da, K, db, N, 0.0f, dc, TZ_F32, N));
  TZ_ASSERT_OK(tz_compute_copy_out(gpu, c, dc, M * N * 4));
  TZ_ASSERT_OK(tz_compute_sync(gpu));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float want = 0.0f;
      for (int k = 0; k < K; k++)
        want += a[i * K + k] * b[k * N + j];
      assert_true(c[i * N + j] == want);
    }
  tz_compute_free(gpu, da);
  tz_compute_free(gpu, db);
  tz_compute_free(gpu, dc);
  tz_compute_destroy(gpu);
  /* still the caller's: it takes and completes work after the instance is gone */
  void *d;
  assert_int_equal(cudaMalloc(&d, 4096), cudaSuccess);
  assert_int_equal(cudaMemsetAsync(d, 0, 4096, s), cudaSuccess);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_int_equal(cudaFree(d), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
  free(a), free(b), free(c);
#endif
}

/* Copies between the host and the device, of every size around the small-copy limit (4 MiB,
 * kernels/cuda/compute.cu) and at odd offsets, come back byte for byte; and the small ones (a
 * step's tokens, a loss, a sync's error record) complete while gigabytes queued on another stream
 * are still moving in the same direction: a copy engine would have taken them after those. */
static void test_small_copies_pass_queued_transfers(void **state) {
  (void)state;
#ifdef TZ_HAVE_CUDA
  struct env e;
  TZ_ASSERT_OK(env_open(&e, TZ_BF16, TZ_F32));
  const size_t link = 4u << 20, cap = 9u << 20;
  unsigned char *in = malloc(cap + 1), *out = malloc(cap + 1);
  assert_non_null(in);
  assert_non_null(out);
  tz_test_fill(in, cap + 1, 11);
  void *d;
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, cap + 1, &d));
  const size_t sizes[] = {1, 15, 16, 17, 4095, 65539, link - 1, link, link + 1, cap};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
    for (size_t off = 0; off < 2; off++) {
      size_t n = sizes[i];
      memset(out, 0, n);
      TZ_ASSERT_OK(tz_compute_copy_in(e.gpu, (unsigned char *)d + off, in + off, n));
      TZ_ASSERT_OK(tz_compute_copy_out(e.gpu, out, (unsigned char *)d + off, n));
      if (memcmp(in + off, out, n) != 0)
        fail_msg("a copy of %zu bytes at offset %zu came back different", n, off);
    }

  /* 6 GiB each way queued on a stream of the caller's (some 100 ms at the link's 50-55 GB/s). */
  const size_t big = 1u << 30;
  void *hbig, *dbig;
  assert_int_equal(cudaHostAlloc(&hbig, big, cudaHostAllocDefault), cudaSuccess);
  assert_int_equal(cudaMalloc(&dbig, big), cudaSuccess);
  cudaStream_t other;
  cudaEvent_t done;
  assert_int_equal(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  for (int dir = 0; dir < 2; dir++) {
    for (int k = 0; k < 6; k++)
      assert_int_equal(dir ? cudaMemcpyAsync(hbig, dbig, big, cudaMemcpyDeviceToHost, other)
                           : cudaMemcpyAsync(dbig, hbig, big, cudaMemcpyHostToDevice, other),
                       cudaSuccess);
    assert_int_equal(cudaEventRecord(done, other), cudaSuccess);
    size_t n = dir ? 8 : 256u << 10; /* a loss and a norm out; a step's tokens in */
    if (dir)
      TZ_ASSERT_OK(tz_compute_copy_out(e.gpu, out, d, n));
    else
      TZ_ASSERT_OK(tz_compute_copy_in(e.gpu, d, in, n));
    TZ_ASSERT_OK(tz_compute_sync(e.gpu));
    cudaError_t q = cudaEventQuery(done);
    if (q != cudaErrorNotReady)
      fail_msg("a %zu-byte copy %s and a sync waited for 6 GiB queued before them on another "
               "stream (%s)",
               n, dir ? "out" : "in", cudaGetErrorString(q));
    assert_int_equal(cudaEventSynchronize(done), cudaSuccess);
  }
  if (memcmp(in, out, 8) != 0)
    fail_msg("the small copy out beside the queued ones came back different");
  assert_int_equal(cudaEventDestroy(done), cudaSuccess);
  assert_int_equal(cudaStreamDestroy(other), cudaSuccess);
  assert_int_equal(cudaFree(dbig), cudaSuccess);
  assert_int_equal(cudaFreeHost(hbig), cudaSuccess);
  tz_compute_free(e.gpu, d);
  env_close(&e);
  free(in);
  free(out);
#endif
}

/* tz_compute_adam on the cuda backend gives the cpu backend's bits (kernels/adam.h), Adam and
 * AdamW, with a bf16 parameter copy; and the device query answers for the instance's GPU. */
static void test_adam_op(void **state) {
  (void)state;
  struct env e;
  TZ_ASSERT_OK(env_open(&e, TZ_BF16, TZ_F32));
  enum { n = 100003 };
  size_t sb = sizeof(float) * 4 * n;
  float *a = malloc(sb), *b = malloc(sb);
  uint16_t *ca = malloc(2 * n), *cb = malloc(2 * n);
  assert_non_null(a && b && ca && cb);
  void *ds, *dc;
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, sb, &ds));
  TZ_ASSERT_OK(tz_compute_alloc(e.gpu, 2 * n, &dc));
  for (int decoupled = 0; decoupled < 2; decoupled++) {
    for (int i = 0; i < 4 * n; i++)
      a[i] = urand(1.0f);
    for (int i = 0; i < n; i++)
      a[2 * n + i] = fabsf(a[2 * n + i]);
    memcpy(b, a, sb);
    struct tz_adam_params p = {.lr = 1e-3f,
                               .beta1 = 0.9f,
                               .beta2 = 0.95f,
                               .eps = 1e-8f,
                               .weight_decay = 0.1f,
                               .decoupled = decoupled,
                               .grad_scale = 0.25f};
    TZ_ASSERT_OK(tz_adam_params_for_step(&p, 5));
    float *d = ds;
    TZ_ASSERT_OK(tz_compute_copy_in(e.gpu, d, a, sb));
    TZ_ASSERT_OK(
        tz_compute_adam(e.gpu, &p, d, d + n, d + 2 * n, d + 3 * n, TZ_F32, dc, TZ_BF16, n));
    TZ_ASSERT_OK(tz_compute_copy_out(e.gpu, a, d, sb));
    TZ_ASSERT_OK(tz_compute_copy_out(e.gpu, ca, dc, 2 * n));
    TZ_ASSERT_OK(tz_compute_sync(e.gpu));
    TZ_ASSERT_OK(
        tz_compute_adam(g_cpu, &p, b, b + n, b + 2 * n, b + 3 * n, TZ_F32, cb, TZ_BF16, n));
    assert_memory_equal(a, b, sb);
    assert_memory_equal(ca, cb, 2 * n);
  }
  tz_compute_free(e.gpu, ds);
  tz_compute_free(e.gpu, dc);
  env_close(&e);
  struct tz_compute_device dev;
  TZ_ASSERT_OK(tz_compute_device_info("cuda", 0, &dev));
  assert_int_equal(dev.index, 0);
  assert_true(dev.name[0] != '\0');
  TZ_ASSERT_OK(tz_compute_device_info("cuda", -1, &dev));
  assert_true(dev.index >= 0);
  uint64_t fr = 0, tot = 0;
  TZ_ASSERT_OK(tz_compute_device_memory("cuda", 0, &fr, &tot));
  assert_true(tot > 0 && fr <= tot);
  assert_true(tz_compute_device_memory("cuda", 1 << 20, &fr, &tot) < 0);
  free(a);
  free(b);
  free(ca);
  free(cb);
}

static int group_setup(void **state) {
  (void)state;
  struct tz_compute_params p;
  tz_compute_params_init(&p);
  return tz_compute_create("cpu", &p, &g_cpu) < 0 ? -1 : 0;
}

static int group_teardown(void **state) {
  (void)state;
  tz_compute_destroy(g_cpu);
  return 0;
}

/* ---- mixture of experts ----
 * The experts' ops against the cpu backend on the same inputs (kernels/compute.h, "Mixture of
 * experts"), at f32 and bf16 storage: the routing's probabilities, weights and statistics within
 * float rounding, its choice and grouping (idx, offsets, rows, slot) equal (the logits on a grid
 * of 1/64, so that ties are exact and near-ties absent); gather equal; combine
 * (with a residual), scatter, combine_bwd and route_bwd within the storage's rounding; the shared
 * expert's gate (gate_fwd onto a residual, gate_bwd) likewise. */
static void *moe_alloc(tz_compute *cm, size_t bytes) {
  void *p = NULL;
  TZ_ASSERT_OK(tz_compute_alloc(cm, bytes ? bytes : 4, &p));
  return p;
}

static void moe_gpu_case(struct env *e, int N, int E, int k, int norm) {
  enum tz_dtype S = e->S;
  int M = N * k, C = 40;
  uint64_t st = 1000 + (uint64_t)N * 31 + (uint64_t)E * 7 + (uint64_t)k;
  float *lg = malloc(sizeof(float) * N * E), *x = malloc(sizeof(float) * N * C);
  float *y = malloc(sizeof(float) * M * C), *g = malloc(sizeof(float) * N * C);
  float *sg = malloc(sizeof(float) * N);
  for (int i = 0; i < N * E; i++)
    /* multiples of 1/64: two logits are equal (ties go to the lower expert on both sides) or
     * 1/64 apart, beyond any difference of the two sides' exp */
    lg[i] = (float)((int)(tz_test_rand(&st) % 385) - 192) / 64.0f;
  for (int i = 0; i < N * C; i++) {
    x[i] = round_to(S, (float)(tz_test_rand(&st) >> 40) / 16777216.0f - 0.5f);
    g[i] = round_to(S, (float)(tz_test_rand(&st) >> 40) / 16777216.0f - 0.5f);
  }
  for (int i = 0; i < M * C; i++)
    y[i] = round_to(S, (float)(tz_test_rand(&st) >> 40) / 16777216.0f - 0.5f);
  for (int i = 0; i < N; i++) /* the gate's logits, over the sigmoid's bend */
    sg[i] = round_to(S, 8.0f * ((float)(tz_test_rand(&st) >> 40) / 16777216.0f - 0.5f));
  /* both sides' buffers: [0] cpu, [1] gpu */
  tz_compute *cm[2] = {g_cpu, e->gpu};
  enum tz_dtype dt[2] = {TZ_F32, S};
  void *L[2], *X[2], *Y[2], *G[2], *XS[2], *OUT[2], *DX[2], *DY[2], *DL[2];
  void *SG[2], *GO[2], *GDY[2], *GDS[2];
  float *probs[2], *w[2], *stats[2], *dw[2], *daux[2];
  int32_t *idx[2], *off[2], *rows[2], *slot[2];
  float daux_h[64];
  for (int q = 0; q < E; q++)
    daux_h[q] = 0.01f * (float)(q % 5) - 0.02f;
  for (int s = 0; s < 2; s++) {
    size_t es = tz_dtype_size(dt[s]);
    L[s] = moe_alloc(cm[s], (size_t)N * E * es);
    X[s] = moe_alloc(cm[s], (size_t)N * C * es);
    Y[s] = moe_alloc(cm[s], (size_t)M * C * es);
    G[s] = moe_alloc(cm[s], (size_t)N * C * es);
    XS[s] = moe_alloc(cm[s], (size_t)M * C * es);
    OUT[s] = moe_alloc(cm[s], (size_t)N * C * es);
    DX[s] = moe_alloc(cm[s], (size_t)N * C * es);
    DY[s] = moe_alloc(cm[s], (size_t)M * C * es);
    DL[s] = moe_alloc(cm[s], (size_t)N * E * es);
    probs[s] = moe_alloc(cm[s], (size_t)N * E * 4);
    w[s] = moe_alloc(cm[s], (size_t)M * 4);
    stats[s] = moe_alloc(cm[s], 2 * (size_t)E * 4);
    dw[s] = moe_alloc(cm[s], (size_t)M * 4);
    daux[s] = moe_alloc(cm[s], (size_t)E * 4);
    idx[s] = moe_alloc(cm[s], (size_t)M * 4);
    off[s] = moe_alloc(cm[s], (size_t)(E + 1) * 4);
    rows[s] = moe_alloc(cm[s], (size_t)M * 4);
    slot[s] = moe_alloc(cm[s], (size_t)M * 4);
    SG[s] = moe_alloc(cm[s], (size_t)N * es);
    GO[s] = moe_alloc(cm[s], (size_t)N * C * es);
    GDY[s] = moe_alloc(cm[s], (size_t)N * C * es);
    GDS[s] = moe_alloc(cm[s], (size_t)N * es);
    upload(cm[s], SG[s], sg, (size_t)N, dt[s]);
    upload(cm[s], L[s], lg, (size_t)N * E, dt[s]);
    upload(cm[s], X[s], x, (size_t)N * C, dt[s]);
    upload(cm[s], Y[s], y, (size_t)M * C, dt[s]);
    upload(cm[s], G[s], g, (size_t)N * C, dt[s]);
    TZ_ASSERT_OK(tz_compute_zero(cm[s], stats[s], 2 * (size_t)E * 4));
    TZ_ASSERT_OK(tz_compute_copy_in(cm[s], daux[s], daux_h, (size_t)E * 4));
    struct tz_moe_route r = {probs[s], idx[s], w[s], off[s], rows[s], slot[s]};
    TZ_ASSERT_OK(tz_compute_moe_route(cm[s], &r, stats[s], L[s], N, E, k, norm));
    TZ_ASSERT_OK(tz_compute_moe_gather(cm[s], XS[s], X[s], rows[s], M, C));
    TZ_ASSERT_OK(tz_compute_moe_combine(cm[s], OUT[s], X[s], Y[s], w[s], slot[s], N, k, C));
    TZ_ASSERT_OK(tz_compute_moe_scatter(cm[s], DX[s], Y[s], slot[s], N, k, C));
    TZ_ASSERT_OK(
        tz_compute_moe_combine_bwd(cm[s], DY[s], dw[s], G[s], Y[s], w[s], slot[s], N, k, C));
    TZ_ASSERT_OK(tz_compute_moe_route_bwd(cm[s], DL[s], &r, dw[s], daux[s], N, E, k, norm));
    TZ_ASSERT_OK(tz_compute_moe_gate_fwd(cm[s], GO[s], X[s], G[s], SG[s], N, C));
    TZ_ASSERT_OK(tz_compute_moe_gate_bwd(cm[s], GDY[s], GDS[s], G[s], X[s], SG[s], N, C));
    TZ_ASSERT_OK(tz_compute_sync(cm[s]));
  }
  char what[96];
  /* the choice and grouping: integers, equal */
  int32_t *hi[2][4];
  for (int s = 0; s < 2; s++) {
    int32_t *src[4] = {idx[s], off[s], rows[s], slot[s]};
    size_t n[4] = {(size_t)M, (size_t)E + 1, (size_t)M, (size_t)M};
    for (int t = 0; t < 4; t++) {
      hi[s][t] = malloc(n[t] * 4 + 4);
      TZ_ASSERT_OK(tz_compute_copy_out(cm[s], hi[s][t], src[t], n[t] * 4));
    }
  }
  static const char *const inames[4] = {"idx", "offsets", "rows", "slot"};
  size_t in[4] = {(size_t)M, (size_t)E + 1, (size_t)M, (size_t)M};
  for (int t = 0; t < 4; t++) {
    int same = memcmp(hi[0][t], hi[1][t], in[t] * 4) == 0;
    printf("  moe_route %s N=%d E=%d k=%d norm=%d %-10s %s\n", tz_dtype_name(S), N, E, k, norm,
           inames[t], same ? "equal ok" : "FAIL");
    g_failures += !same;
  }
  for (int s = 0; s < 2; s++)
    for (int t = 0; t < 4; t++)
      free(hi[s][t]);
  /* the floats */
  struct {
    const char *name;
    void *p[2];
    size_t n;
    int f32;
    double tol;
  } outs[] = {{"probs", {probs[0], probs[1]}, (size_t)N * E, 1, 1e-6},
              {"w", {w[0], w[1]}, (size_t)M, 1, S == TZ_F32 ? 1e-6 : 8e-3},
              {"stats", {stats[0], stats[1]}, 2 * (size_t)E, 1, 1e-6},
              {"gather", {XS[0], XS[1]}, (size_t)M * C, 0, 0.0},
              {"combine", {OUT[0], OUT[1]}, (size_t)N * C, 0, S == TZ_F32 ? 1e-6 : 8e-3},
              {"scatter", {DX[0], DX[1]}, (size_t)N * C, 0, S == TZ_F32 ? 1e-6 : 8e-3},
              {"combine_bwd dy", {DY[0], DY[1]}, (size_t)M * C, 0, S == TZ_F32 ? 1e-6 : 8e-3},
              {"combine_bwd dw", {dw[0], dw[1]}, (size_t)M, 1, S == TZ_F32 ? 1e-5 : 2e-2},
              {"route_bwd", {DL[0], DL[1]}, (size_t)N * E, 0, S == TZ_F32 ? 1e-5 : 2e-2},
              {"gate_fwd", {GO[0], GO[1]}, (size_t)N * C, 0, S == TZ_F32 ? 1e-6 : 8e-3},
              {"gate_bwd dy", {GDY[0], GDY[1]}, (size_t)N * C, 0, S == TZ_F32 ? 1e-6 : 8e-3},
              {"gate_bwd ds", {GDS[0], GDS[1]}, (size_t)N, 0, S == TZ_F32 ? 1e-5 : 2e-2}};
  for (size_t o = 0; o < sizeof outs / sizeof outs[0]; o++) {
    float *a = malloc(outs[o].n * 4 + 4), *b = malloc(outs[o].n * 4 + 4);
    download(g_cpu, a, outs[o].p[0], outs[o].n, TZ_F32);
    download(e->gpu, b, outs[o].p[1], outs[o].n, outs[o].f32 ? TZ_F32 : S);
    snprintf(what, sizeof what, "moe %s %s N=%d E=%d k=%d norm=%d", outs[o].name, tz_dtype_name(S),
             N, E, k, norm);
    check(what, b, a, outs[o].n, outs[o].tol);
    free(a), free(b);
  }
  for (int s = 0; s < 2; s++) {
    void *all[] = {L[s],    X[s],     Y[s],  G[s],     XS[s],  OUT[s],  DX[s],  DY[s],
                   DL[s],   probs[s], w[s],  stats[s], dw[s],  daux[s], idx[s], off[s],
                   rows[s], slot[s],  SG[s], GO[s],    GDY[s], GDS[s]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      tz_compute_free(cm[s], all[i]);
  }
  free(lg), free(x), free(y), free(g), free(sg);
}

/* matmul_many as the experts run it (trainer/model/model_moe.c): each expert's forward (x W^T,
 * bf16 out) and weight gradient (dy^T x accumulated in f32) over rows of 0 to 600, the calls of
 * a round together, twice: the same bits as the calls one by one, and every product done before
 * the next op on the instance's stream (the read back right after) and after the op before it
 * (the gradients put back just before are what the first round accumulates onto). With the
 * backend built with TZ_CUDA_MM_STREAMS the calls run side by side on its side streams; without,
 * one after the other (the wrapper's loop). */
static void test_matmul_many(void **state) {
  (void)state;
  g_failures = 0;
  struct env e;
  TZ_ASSERT_OK(env_open(&e, TZ_BF16, TZ_F32));
  tz_compute *cm = e.gpu;
  enum { E = 9, C = 192, F = 128 };
  static const int rows[E] = {600, 1, 0, 7, 64, 130, 333, 2, 512};
  int off[E + 1] = {0};
  for (int x = 0; x < E; x++)
    off[x + 1] = off[x] + rows[x];
  const int M = off[E];
  size_t nx = (size_t)M * C, nw = (size_t)E * F * C, ny = (size_t)M * F;
  float *vx = randv(nx, 1.0f), *vw = randv(nw, 0.1f), *vd = randv(ny, 1.0f), *vg = randv(nw, 1.0f);
  void *px = pack(vx, nx, TZ_BF16), *pw = pack(vw, nw, TZ_BF16), *pd = pack(vd, ny, TZ_BF16);
  void *X = moe_alloc(cm, nx * 2), *W = moe_alloc(cm, nw * 2), *D = moe_alloc(cm, ny * 2);
  void *Y[2], *G[2];
  for (int r = 0; r < 2; r++) {
    Y[r] = moe_alloc(cm, ny * 2);
    G[r] = moe_alloc(cm, nw * 4);
  }
  TZ_ASSERT_OK(tz_compute_copy_in(cm, X, px, nx * 2));
  TZ_ASSERT_OK(tz_compute_copy_in(cm, W, pw, nw * 2));
  TZ_ASSERT_OK(tz_compute_copy_in(cm, D, pd, ny * 2));
  struct tz_matmul_call calls[2][2 * E];
  int n = 0;
  for (int x = 0; x < E; x++) {
    if (!rows[x])
      continue;
    for (int r = 0; r < 2; r++) {
      const char *xs = (const char *)X + (size_t)off[x] * C * 2;
      const char *w = (const char *)W + (size_t)x * F * C * 2;
      calls[r][n] = (struct tz_matmul_call){.trans_b = 1,
                                            .M = rows[x],
                                            .N = F,
                                            .K = C,
                                            .alpha = 1.0f,
                                            .A = xs,
                                            .lda = C,
                                            .B = w,
                                            .ldb = C,
                                            .C = (char *)Y[r] + (size_t)off[x] * F * 2,
                                            .c_dt = TZ_BF16,
                                            .ldc = F};
      calls[r][n + 1] = (struct tz_matmul_call){.trans_a = 1,
                                                .M = F,
                                                .N = C,
                                                .K = rows[x],
                                                .alpha = 1.0f,
                                                .A = (const char *)D + (size_t)off[x] * F * 2,
                                                .lda = F,
                                                .B = xs,
                                                .ldb = C,
                                                .beta = 1.0f,
                                                .C = (char *)G[r] + (size_t)x * F * C * 4,
                                                .c_dt = TZ_F32,
                                                .ldc = C};
    }
    n += 2;
  }
  for (int r = 0; r < 2; r++)
    TZ_ASSERT_OK(tz_compute_copy_in(cm, G[r], vg, nw * 4));
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < n; i++) {
      struct tz_matmul_call m = calls[0][i];
      TZ_ASSERT_OK(tz_compute_matmul(cm, m.trans_a, m.trans_b, m.M, m.N, m.K, m.alpha, m.A, m.lda,
                                     m.B, m.ldb, m.beta, m.C, m.c_dt, m.ldc));
    }
    TZ_ASSERT_OK(tz_compute_matmul_many(cm, n, calls[1]));
    void *hy[2], *hg[2];
    for (int r = 0; r < 2; r++) {
      hy[r] = malloc(ny * 2), hg[r] = malloc(nw * 4);
      assert_true(hy[r] && hg[r]);
      TZ_ASSERT_OK(tz_compute_copy_out(cm, hy[r], Y[r], ny * 2));
      TZ_ASSERT_OK(tz_compute_copy_out(cm, hg[r], G[r], nw * 4));
    }
    check_bits(round ? "matmul_many: the experts' outputs, again"
                     : "matmul_many: the experts' outputs",
               hy[0], hy[1], ny * 2);
    check_bits(round ? "matmul_many: the weights' gradients, accumulated again"
                     : "matmul_many: the weights' gradients",
               hg[0], hg[1], nw * 4);
    /* one product against float64: row 3 of expert 6, column 5 */
    float y[1];
    unpack(y, (const char *)hy[1] + ((size_t)(off[6] + 3) * F + 5) * 2, 1, TZ_BF16);
    double ref = 0;
    for (int c = 0; c < C; c++)
      ref += (double)round_to(TZ_BF16, vx[(size_t)(off[6] + 3) * C + c]) *
             round_to(TZ_BF16, vw[((size_t)6 * F + 5) * C + c]);
    if (fabs(y[0] - ref) > 1e-2 * (1 + fabs(ref))) {
      printf("  matmul_many: expert 6 row 3 col 5 %g, float64 %g: FAIL\n", (double)y[0], ref);
      g_failures++;
    }
    for (int r = 0; r < 2; r++)
      free(hy[r]), free(hg[r]);
  }
  for (int r = 0; r < 2; r++)
    tz_compute_free(cm, Y[r]), tz_compute_free(cm, G[r]);
  tz_compute_free(cm, X), tz_compute_free(cm, W), tz_compute_free(cm, D);
  free(vx), free(vw), free(vd), free(vg), free(px), free(pw), free(pd);
  env_close(&e);
  assert_int_equal(g_failures, 0);
}

static void test_moe_ops(void **state) {
  (void)state;
  g_failures = 0;
  static const enum tz_dtype dts[] = {TZ_F32, TZ_BF16};
  for (int d = 0; d < 2; d++) {
    struct env e;
    TZ_ASSERT_OK(env_open(&e, dts[d], TZ_F32));
    moe_gpu_case(&e, 1, 4, 2, 1);
    moe_gpu_case(&e, 37, 8, 2, 1);
    moe_gpu_case(&e, 300, 16, 4, 0);
    moe_gpu_case(&e, 1000, 64, 8, 1);
    moe_gpu_case(&e, 513, 3, 1, 0);
    env_close(&e);
  }
  assert_int_equal(g_failures, 0);
}

int main(void) {
  char why[256];
  if (tz_compute_probe("cuda", why, sizeof why) < 0)
    tz_test_skip("%s", why);
  tz_compute *probe;
  int rc = tz_compute_create("cuda", NULL, &probe);
  if (rc == TZ_ENOTSUP)
    tz_test_skip("%s", tz_err_msg());
  if (rc == 0)
    tz_compute_destroy(probe);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_basics),
      cmocka_unit_test(test_elementwise),
      cmocka_unit_test(test_sum),
      cmocka_unit_test(test_sumsq_segments),
      cmocka_unit_test(test_stream),
      cmocka_unit_test(test_small_copies_pass_queued_transfers),
      cmocka_unit_test(test_matmul),
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_rope),
      cmocka_unit_test(test_rope_partial),
      cmocka_unit_test(test_bias),
      cmocka_unit_test(test_attention_packed),
      cmocka_unit_test(test_attention),
      cmocka_unit_test(test_attention_padded),
      cmocka_unit_test(test_attention_families),
      cmocka_unit_test(test_attention_variants),
      cmocka_unit_test(test_attention_wgmma),
      cmocka_unit_test(test_attention_wgmma_masked),
      cmocka_unit_test(test_swiglu),
      cmocka_unit_test(test_variants_ops),
      cmocka_unit_test(test_unaligned_same_bits),
      cmocka_unit_test(test_xent),
      cmocka_unit_test(test_negative_control),
      cmocka_unit_test(test_model),
      cmocka_unit_test(test_adam_op),
      cmocka_unit_test(test_moe_ops),
      cmocka_unit_test(test_matmul_many),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
