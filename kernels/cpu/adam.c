/* CPU Adam: a scalar path and AVX2 / AVX-512 paths chosen at run time, all following the one
 * definition in kernels/adam.h so that they give the same bits. The vector paths are compiled
 * with target attributes, so the library needs no global -mavx flag. Every path finishes a
 * range's last partial vector with the scalar element function, which is the definition itself.
 * Bit-identity rests on the build's -ffp-contract=off: the vector intrinsics for + and * are
 * plain vector arithmetic to GCC and would otherwise be fused. */
#define _GNU_SOURCE
#include "kernels/adam.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include "core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define TZ_ADAM_X86 1
#endif

#define CANON_NAN 0x7fc00000u
/* copy dtype when there is no parameter copy */
#define COPY_NONE (-1)

/* The per-call constants of the definition, computed once in float. */
struct adam_consts {
  float grad_scale, wd, beta1, omb1, beta2, omb2, bc1, bc2, eps, nlr;
  int decoupled;
};

typedef void (*range_fn)(const struct adam_consts *c, float *p, float *m, float *v, const void *g,
                         int gdt, void *copy, int cdt, size_t b, size_t e);

#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE float canon(float x) { return isnan(x) ? tz_f32_from_bits(CANON_NAN) : x; }

static ALWAYS_INLINE float grad_at(const void *g, int gdt, size_t i) {
  if (gdt == TZ_BF16)
    return tz_bf16_to_f32(((const uint16_t *)g)[i]);
  if (gdt == TZ_F16)
    return tz_f16_to_f32(((const uint16_t *)g)[i]);
  return ((const float *)g)[i];
}

static ALWAYS_INLINE void copy_at(void *copy, int cdt, size_t i, float x) {
  if (cdt == TZ_F32)
    ((float *)copy)[i] = x;
  else if (cdt == TZ_BF16)
    ((uint16_t *)copy)[i] = tz_f32_to_bf16(x);
  else if (cdt == TZ_F16)
    ((uint16_t *)copy)[i] = tz_f32_to_f16(x);
}

/* One element, exactly as kernels/adam.h defines it. */
static ALWAYS_INLINE void adam_one(const struct adam_consts *c, float *p, float *m, float *v,
                                   const void *g, int gdt, void *copy, int cdt, size_t i) {
  float p0 = p[i];
  float gr = grad_at(g, gdt, i) * c->grad_scale;
  if (!c->decoupled)
    gr = fmaf(c->wd, p0, gr);
  float m1 = fmaf(c->beta1, m[i], c->omb1 * gr);
  float v1 = fmaf(c->beta2, v[i], c->omb2 * (gr * gr));
  float mhat = m1 * c->bc1;
  float vhat = v1 * c->bc2;
  float den = sqrtf(vhat) + c->eps;
  float upd = mhat / den;
  if (c->decoupled)
    upd = fmaf(c->wd, p0, upd);
  float p1 = canon(fmaf(c->nlr, upd, p0));
  p[i] = p1;
  m[i] = canon(m1);
  v[i] = canon(v1);
  copy_at(copy, cdt, i, p1);
}

/* Where the ceiling kernel's gradient bits go when there is no parameter copy to write them to,
 * so that the gradient loads cannot be dropped: one OR per range. */
static uint32_t ceiling_sink;

static void sink(uint32_t bits) { __atomic_fetch_or(&ceiling_sink, bits, __ATOMIC_RELAXED); }

/* The ceiling's element: Adam's loads and stores, no arithmetic. The state arrays rotate, so
 * their values stay what they were (valid Adam state, no NaN or subnormal) for later runs. */
static ALWAYS_INLINE uint32_t move_one(float *p, float *m, float *v, const void *g, int gdt,
                                       void *copy, int cdt, size_t i) {
  uint32_t gb =
      gdt == TZ_F32 ? tz_f32_bits(((const float *)g)[i]) : (uint32_t)((const uint16_t *)g)[i] << 16;
  float p0 = p[i];
  p[i] = m[i];
  m[i] = v[i];
  v[i] = p0;
  if (cdt == TZ_F32)
    ((float *)copy)[i] = tz_f32_from_bits(gb);
  else if (cdt != COPY_NONE)
    ((uint16_t *)copy)[i] = (uint16_t)(gb >> 16);
  return gb;
}

/* Calls BODY(gdt, cdt) with both as constants for the dtype pair given, so that each pair gets
 * its own inlined loop. */
#define DISPATCH_DTYPES(gdt, cdt, BODY)                                                            \
  do {                                                                                             \
    if ((gdt) == TZ_F32) {                                                                         \
      DISPATCH_COPY(TZ_F32, cdt, BODY);                                                            \
    } else if ((gdt) == TZ_BF16) {                                                                 \
      DISPATCH_COPY(TZ_BF16, cdt, BODY);                                                           \
    } else {                                                                                       \
      DISPATCH_COPY(TZ_F16, cdt, BODY);                                                            \
    }                                                                                              \
  } while (0)
#define DISPATCH_COPY(G, cdt, BODY)                                                                \
  do {                                                                                             \
    if ((cdt) == TZ_F32)                                                                           \
      BODY(G, TZ_F32);                                                                             \
    else if ((cdt) == TZ_BF16)                                                                     \
      BODY(G, TZ_BF16);                                                                            \
    else if ((cdt) == TZ_F16)                                                                      \
      BODY(G, TZ_F16);                                                                             \
    else                                                                                           \
      BODY(G, COPY_NONE);                                                                          \
  } while (0)

/* ---- scalar ---------------------------------------------------------------------------------- */

static void adam_scalar(const struct adam_consts *c, float *p, float *m, float *v, const void *g,
                        int gdt, void *copy, int cdt, size_t b, size_t e) {
#define BODY(G, C)                                                                                 \
  for (size_t i = b; i < e; i++)                                                                   \
  adam_one(c, p, m, v, g, G, copy, C, i)
  DISPATCH_DTYPES(gdt, cdt, BODY);
#undef BODY
}

static void move_scalar(const struct adam_consts *c, float *p, float *m, float *v, const void *g,
                        int gdt, void *copy, int cdt, size_t b, size_t e) {
  (void)c;
  uint32_t acc = 0;
#define BODY(G, C)                                                                                 \
  for (size_t i = b; i < e; i++)                                                                   \
  acc |= move_one(p, m, v, g, G, copy, C, i)
  DISPATCH_DTYPES(gdt, cdt, BODY);
#undef BODY
  if (cdt == COPY_NONE)
    sink(acc);
}

#if TZ_ADAM_X86

/* ---- AVX-512: 16 lanes ----------------------------------------------------------------------- */

#define AVX512 __attribute__((target("avx512f")))

AVX512 static ALWAYS_INLINE __m512 canon16(__m512 x) {
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, x, _mm512_castsi512_ps(_mm512_set1_epi32((int)CANON_NAN)));
}

AVX512 static ALWAYS_INLINE __m512i grad_bits16(const void *g, int gdt, size_t i) {
  if (gdt == TZ_F32)
    return _mm512_loadu_si512((const float *)g + i);
  __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
  return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}

AVX512 static ALWAYS_INLINE __m512 grad16(const void *g, int gdt, size_t i) {
  if (gdt == TZ_F16)
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i)));
  return _mm512_castsi512_ps(grad_bits16(g, gdt, i));
}

/* tz_f32_to_bf16 on 16 lanes. */
AVX512 static ALWAYS_INLINE __m256i bf16x16(__m512 x) {
  __m512i u = _mm512_castps_si512(x);
  __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i bias =
      _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

AVX512 static ALWAYS_INLINE void copy16(void *copy, int cdt, size_t i, __m512 x) {
  if (cdt == TZ_F32)
    _mm512_storeu_ps((float *)copy + i, x);
  else if (cdt == TZ_BF16)
    _mm256_storeu_si256((__m256i *)((uint16_t *)copy + i), bf16x16(x));
  else if (cdt == TZ_F16) /* VCVTPS2PH rounds to nearest even and quiets NaN as tz_f32_to_f16 */
    _mm256_storeu_si256((__m256i *)((uint16_t *)copy + i),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

AVX512 static ALWAYS_INLINE void adam_body16(const struct adam_consts *c, float *p, float *m,
                                             float *v, const void *g, int gdt, void *copy, int cdt,
                                             size_t b, size_t e) {
  const __m512 gs = _mm512_set1_ps(c->grad_scale), wd = _mm512_set1_ps(c->wd);
  const __m512 b1 = _mm512_set1_ps(c->beta1), omb1 = _mm512_set1_ps(c->omb1);
  const __m512 b2 = _mm512_set1_ps(c->beta2), omb2 = _mm512_set1_ps(c->omb2);
  const __m512 bc1 = _mm512_set1_ps(c->bc1), bc2 = _mm512_set1_ps(c->bc2);
  const __m512 eps = _mm512_set1_ps(c->eps), nlr = _mm512_set1_ps(c->nlr);
  size_t i = b;
  for (; i + 16 <= e; i += 16) {
    __m512 p0 = _mm512_loadu_ps(p + i);
    __m512 gr = _mm512_mul_ps(grad16(g, gdt, i), gs);
    if (!c->decoupled)
      gr = _mm512_fmadd_ps(wd, p0, gr);
    __m512 m1 = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(omb1, gr));
    __m512 v1 =
        _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(omb2, _mm512_mul_ps(gr, gr)));
    __m512 mhat = _mm512_mul_ps(m1, bc1);
    __m512 vhat = _mm512_mul_ps(v1, bc2);
    __m512 den = _mm512_add_ps(_mm512_sqrt_ps(vhat), eps);
    __m512 upd = _mm512_div_ps(mhat, den);
    if (c->decoupled)
      upd = _mm512_fmadd_ps(wd, p0, upd);
    __m512 p1 = canon16(_mm512_fmadd_ps(nlr, upd, p0));
    _mm512_storeu_ps(p + i, p1);
    _mm512_storeu_ps(m + i, canon16(m1));
    _mm512_storeu_ps(v + i, canon16(v1));
    copy16(copy, cdt, i, p1);
  }
  for (; i < e; i++)
    adam_one(c, p, m, v, g, gdt, copy, cdt, i);
}

AVX512 static ALWAYS_INLINE void move_body16(float *p, float *m, float *v, const void *g, int gdt,
                                             void *copy, int cdt, size_t b, size_t e) {
  __m512i acc = _mm512_setzero_si512();
  size_t i = b;
  for (; i + 16 <= e; i += 16) {
    __m512i gb = grad_bits16(g, gdt, i);
    __m512i p0 = _mm512_loadu_si512(p + i);
    _mm512_storeu_si512(p + i, _mm512_loadu_si512(m + i));
    _mm512_storeu_si512(m + i, _mm512_loadu_si512(v + i));
    _mm512_storeu_si512(v + i, p0);
    if (cdt == TZ_F32)
      _mm512_storeu_si512((float *)copy + i, gb);
    else if (cdt != COPY_NONE)
      _mm256_storeu_si256((__m256i *)((uint16_t *)copy + i),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(gb, 16)));
    else
      acc = _mm512_or_si512(acc, gb);
  }
  uint32_t tail = 0;
  for (; i < e; i++)
    tail |= move_one(p, m, v, g, gdt, copy, cdt, i);
  if (cdt == COPY_NONE)
    sink(tail | (uint32_t)_mm512_reduce_or_epi32(acc));
}

AVX512 static void adam_avx512(const struct adam_consts *c, float *p, float *m, float *v,
                               const void *g, int gdt, void *copy, int cdt, size_t b, size_t e) {
#define BODY(G, C) adam_body16(c, p, m, v, g, G, copy, C, b, e)
  DISPATCH_DTYPES(gdt, cdt, BODY);
#undef BODY
}

AVX512 static void move_avx512(const struct adam_consts *c, float *p, float *m, float *v,
                               const void *g, int gdt, void *copy, int cdt, size_t b, size_t e) {
  (void)c;
#define BODY(G, C) move_body16(p, m, v, g, G, copy, C, b, e)
  DISPATCH_DTYPES(gdt, cdt, BODY);
#undef BODY
}

/* ---- AVX2: 8 lanes --------------------------------------------------------------------------- */

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static ALWAYS_INLINE __m256 canon8(__m256 x) {
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)CANON_NAN)), nan);
}

AVX2 static ALWAYS_INLINE __m256i grad_bits8(const void *g, int gdt, size_t i) {
  if (gdt == TZ_F32)
    return _mm256_loadu_si256((const __m256i *)((const float *)g + i));
  __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)g + i));
  return _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
}

AVX2 static ALWAYS_INLINE __m256 grad8(const void *g, int gdt, size_t i) {
  if (gdt == TZ_F16)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)g + i)));
  return _mm256_castsi256_ps(grad_bits8(g, gdt, i));
}

/* Eight 32-bit lanes, each holding a value < 2^16, narrowed to 16 bits in order. */
AVX2 static ALWAYS_INLINE __m128i narrow8(__m256i r) {
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* tz_f32_to_bf16 on 8 lanes. */
AVX2 static ALWAYS_INLINE __m128i bf16x8(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i hi = _mm256_srli_epi32(u, 16);
  __m256i bias =
      _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  /* both sides are below 2^31, so the signed compare is the unsigned one */
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                   _mm256_set1_epi32(0x7f800000));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  return narrow8(r);
}

AVX2 static ALWAYS_INLINE void copy8(void *copy, int cdt, size_t i, __m256 x) {
  if (cdt == TZ_F32)
    _mm256_storeu_ps((float *)copy + i, x);
  else if (cdt == TZ_BF16)
    _mm_storeu_si128((__m128i *)((uint16_t *)copy + i), bf16x8(x));
  else if (cdt == TZ_F16)
    _mm_storeu_si128((__m128i *)((uint16_t *)copy + i),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

AVX2 static ALWAYS_INLINE void adam_body8(const struct adam_consts *c, float *p, float *m, float *v,
                                          const void *g, int gdt, void *copy, int cdt, size_t b,
                                          size_t e) {
  const __m256 gs = _mm256_set1_ps(c->grad_scale), wd = _mm256_set1_ps(c->wd);
  const __m256 b1 = _mm256_set1_ps(c->beta1), omb1 = _mm256_set1_ps(c->omb1);
  const __m256 b2 = _mm256_set1_ps(c->beta2), omb2 = _mm256_set1_ps(c->omb2);
  const __m256 bc1 = _mm256_set1_ps(c->bc1), bc2 = _mm256_set1_ps(c->bc2);
  const __m256 eps = _mm256_set1_ps(c->eps), nlr = _mm256_set1_ps(c->nlr);
  size_t i = b;
  for (; i + 8 <= e; i += 8) {
    __m256 p0 = _mm256_loadu_ps(p + i);
    __m256 gr = _mm256_mul_ps(grad8(g, gdt, i), gs);
    if (!c->decoupled)
      gr = _mm256_fmadd_ps(wd, p0, gr);
    __m256 m1 = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(omb1, gr));
    __m256 v1 =
        _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(omb2, _mm256_mul_ps(gr, gr)));
    __m256 mhat = _mm256_mul_ps(m1, bc1);
    __m256 vhat = _mm256_mul_ps(v1, bc2);
    __m256 den = _mm256_add_ps(_mm256_sqrt_ps(vhat), eps);
    __m256 upd = _mm256_div_ps(mhat, den);
    if (c->decoupled)
      upd = _mm256_fmadd_ps(wd, p0, upd);
    __m256 p1 = canon8(_mm256_fmadd_ps(nlr, upd, p0));
    _mm256_storeu_ps(p + i, p1);
    _mm256_storeu_ps(m + i, canon8(m1));
    _mm256_storeu_ps(v + i, canon8(v1));
    copy8(copy, cdt, i, p1);
  }
  for (; i < e; i++)
    adam_one(c, p, m, v, g, gdt, copy, cdt, i);
}

AVX2 static ALWAYS_INLINE void move_body8(float *p, float *m, float *v, const void *g, int gdt,
                                          void *copy, int cdt, size_t b, size_t e) {
  __m256i acc = _mm256_setzero_si256();
  size_t i = b;
  for (; i + 8 <= e; i += 8) {
    __m256i gb = grad_bits8(g, gdt, i);
    __m256i p0 = _mm256_loadu_si256((const __m256i *)(p + i));
    _mm256_storeu_si256((__m256i *)(p + i), _mm256_loadu_si256((const __m256i *)(m + i)));
    _mm256_storeu_si256((__m256i *)(m + i), _mm256_loadu_si256((const __m256i *)(v + i)));
    _mm256_storeu_si256((__m256i *)(v + i), p0);
    if (cdt == TZ_F32)
      _mm256_storeu_si256((__m256i *)((float *)copy + i), gb);
    else if (cdt != COPY_NONE)
      _mm_storeu_si128((__m128i *)((uint16_t *)copy + i), narrow8(_mm256_srli_epi32(gb, 16)));
    else
      acc = _mm256_or_si256(acc, gb);
  }
  uint32_t tail = 0;
  for (; i < e; i++)
    tail |= move_one(p, m, v, g, gdt, copy, cdt, i);
  if (cdt == COPY_NONE) {
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, acc);
    for (int k = 0; k < 8; k++)
      tail |= lanes[k];
    sink(tail);
  }
}

AVX2 static void adam_avx2(const struct adam_consts *c, float *p, float *m, float *v, const void *g,
                           int gdt, void *copy, int cdt, size_t b, size_t e) {
#define BODY(G, C) adam_body8(c, p, m, v, g, G, copy, C, b, e)
  DISPATCH_DTYPES(gdt, cdt, BODY);
#undef BODY
}

AVX2 static void move_avx2(const struct adam_consts *c, float *p, float *m, float *v, const void *g,
                           int gdt, void *copy, int cdt, size_t b, size_t e) {
  (void)c;
#define BODY(G, C) move_body8(p, m, v, g, G, copy, C, b, e)
  DISPATCH_DTYPES(gdt, cdt, BODY);
#undef BODY
}

/* IEEE defaults for the call: round to nearest, no flush-to-zero, no denormals-are-zero (a
 * library linked with -ffast-math may have set FTZ/DAZ for the whole process). */
static unsigned fp_env_enter(void) {
  unsigned saved = _mm_getcsr();
  _mm_setcsr(saved & ~(0x8000u /* FTZ */ | 0x0040u /* DAZ */ | 0x6000u /* rounding */));
  return saved;
}
static void fp_env_leave(unsigned saved) { _mm_setcsr(saved); }

#endif /* TZ_ADAM_X86 */

/* ---- dispatch and threads -------------------------------------------------------------------- */

int tz_adam_cpu_path_supported(enum tz_adam_cpu_path path) {
  switch (path) {
  case TZ_ADAM_CPU_AUTO:
  case TZ_ADAM_CPU_SCALAR: return 1;
#if TZ_ADAM_X86
  case TZ_ADAM_CPU_AVX2:
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  case TZ_ADAM_CPU_AVX512: __builtin_cpu_init(); return __builtin_cpu_supports("avx512f");
#endif
  default: return 0;
  }
}

enum tz_adam_cpu_path tz_adam_cpu_path_best(void) {
  if (tz_adam_cpu_path_supported(TZ_ADAM_CPU_AVX512))
    return TZ_ADAM_CPU_AVX512;
  if (tz_adam_cpu_path_supported(TZ_ADAM_CPU_AVX2))
    return TZ_ADAM_CPU_AVX2;
  return TZ_ADAM_CPU_SCALAR;
}

const char *tz_adam_cpu_path_name(enum tz_adam_cpu_path path) {
  switch (path) {
  case TZ_ADAM_CPU_AUTO: return "auto";
  case TZ_ADAM_CPU_SCALAR: return "scalar";
  case TZ_ADAM_CPU_AVX2: return "avx2";
  case TZ_ADAM_CPU_AVX512: return "avx512";
  }
  return "?";
}

/* The cpu this thread was last bound to by us, so that a pool thread is bound once. */
static _Thread_local int bound_cpu = -1;

static int bind_self(int cpu) {
  if (bound_cpu == cpu)
    return 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  int e = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (e == 0)
    bound_cpu = cpu;
  return e;
}

static int check_call(float *master, float *m, float *v, const void *grad, int gdt, void *copy,
                      int cdt, size_t n, const struct tz_adam_cpu_opts *o) {
  if (n && (!master || !m || !v || !grad))
    return tz_err_set(TZ_EINVAL,
                      "adam: NULL array (master %p, m %p, v %p, grad %p) for %zu "
                      "elements",
                      (void *)master, (void *)m, (void *)v, grad, n);
  if (gdt != TZ_F32 && gdt != TZ_BF16 && gdt != TZ_F16)
    return tz_err_set(TZ_EINVAL, "adam: gradient dtype %d is not f32, bf16 or f16", gdt);
  if (copy && cdt != TZ_F32 && cdt != TZ_BF16 && cdt != TZ_F16)
    return tz_err_set(TZ_EINVAL, "adam: parameter copy dtype %d is not f32, bf16 or f16", cdt);
  if (o->threads < 0)
    return tz_err_set(TZ_EINVAL, "adam: %d threads", o->threads);
  if (o->cpus) {
    if (o->ncpus <= 0)
      return tz_err_set(TZ_EINVAL, "adam: cpu list given with %d entries", o->ncpus);
    for (int i = 0; i < o->ncpus; i++)
      if (o->cpus[i] < 0 || o->cpus[i] >= CPU_SETSIZE)
        return tz_err_set(TZ_EINVAL, "adam: cpu list entry %d is %d, outside [0, %d)", i,
                          o->cpus[i], CPU_SETSIZE);
  }
  if (!tz_adam_cpu_path_supported(o->path))
    return tz_err_set(TZ_ENOTSUP, "adam: the %s path needs CPU features this machine lacks",
                      tz_adam_cpu_path_name(o->path));
  return 0;
}

static enum tz_adam_cpu_path resolve_path(enum tz_adam_cpu_path want) {
  return want == TZ_ADAM_CPU_AUTO ? tz_adam_cpu_path_best() : want;
}

static int team_size(const struct tz_adam_cpu_opts *o) {
  return o->threads > 0 ? o->threads : o->cpus ? o->ncpus : omp_get_max_threads();
}

/* Binds the calling team member to its cpu; on failure records the first error for the caller. */
static void bind_member(const struct tz_adam_cpu_opts *o, int *bind_err, int *bind_cpu) {
  if (!o->cpus)
    return;
  int cpu = o->cpus[omp_get_thread_num() % o->ncpus];
  int e = bind_self(cpu);
  if (e) {
#pragma omp critical(tz_adam_bind)
    if (!*bind_err) {
      *bind_err = e;
      *bind_cpu = cpu;
    }
  }
}

/* Runs fn over fixed chunks of [0, n) on the OpenMP team, each thread bound first when a cpu
 * list is given. Chunk boundaries do not depend on the thread count, nor on which thread takes a
 * chunk: the team takes them as each member comes free (dynamic), so that a member the machine
 * descheduled holds up only its chunk in hand. Beside a GPU the team is every core but two and
 * the process's other threads (those waiting on the GPU, the scheduler's pump) take cores from it
 * at times: with each member's share fixed up front (schedule static) the homes of a llama-3b step
 * took 1.15-1.19x the plan's time, taking chunks as they come free 1.06-1.07x, and the step 0.87
 * s against 0.82 (docs/benchmarks-history.md, "Issue 26 on the H200, 2026-12-04"). */
static int run_chunks(const struct tz_adam_cpu_opts *o, range_fn fn, const struct adam_consts *c,
                      float *p, float *m, float *v, const void *g, int gdt, void *copy, int cdt,
                      size_t n) {
  size_t nchunks = (n + TZ_ADAM_CPU_CHUNK - 1) / TZ_ADAM_CPU_CHUNK;
  int nt = team_size(o);
  if ((size_t)nt > nchunks)
    nt = (int)nchunks;
  int bind_err = 0, bind_cpu = -1;
#pragma omp parallel num_threads(nt)
  {
    bind_member(o, &bind_err, &bind_cpu);
    /* after the barrier every thread sees the same bind_err, so all or none enter the loop */
#pragma omp barrier
    if (!bind_err) {
#if TZ_ADAM_X86
      unsigned csr = fp_env_enter();
#endif
#pragma omp for schedule(dynamic)
      for (size_t k = 0; k < nchunks; k++) {
        size_t b = k * TZ_ADAM_CPU_CHUNK;
        size_t e = n - b < TZ_ADAM_CPU_CHUNK ? n : b + TZ_ADAM_CPU_CHUNK;
        fn(c, p, m, v, g, gdt, copy, cdt, b, e);
      }
#if TZ_ADAM_X86
      fp_env_leave(csr);
#endif
    }
  }
  if (bind_err)
    return tz_err_errno(bind_err, "adam: binding an OpenMP thread to cpu %d", bind_cpu);
  return 0;
}

int tz_adam_cpu_bind(const struct tz_adam_cpu_opts *o) {
  if (!o)
    return tz_err_set(TZ_EINVAL, "adam: bind without options");
  TZ_CHECK(check_call(NULL, NULL, NULL, NULL, TZ_F32, NULL, TZ_F32, 0, o));
  if (!o->cpus)
    return 0;
  int bind_err = 0, bind_cpu = -1;
#pragma omp parallel num_threads(team_size(o))
  bind_member(o, &bind_err, &bind_cpu);
  if (bind_err)
    return tz_err_errno(bind_err, "adam: binding an OpenMP thread to cpu %d", bind_cpu);
  return 0;
}

static range_fn pick(enum tz_adam_cpu_path path, int ceiling) {
#if TZ_ADAM_X86
  if (path == TZ_ADAM_CPU_AVX512)
    return ceiling ? move_avx512 : adam_avx512;
  if (path == TZ_ADAM_CPU_AVX2)
    return ceiling ? move_avx2 : adam_avx2;
#else
  (void)path;
#endif
  return ceiling ? move_scalar : adam_scalar;
}

int tz_adam_cpu(const struct tz_adam_params *p, float *master, float *m, float *v, const void *grad,
                enum tz_dtype grad_dtype, void *param_copy, enum tz_dtype copy_dtype, size_t n,
                const struct tz_adam_cpu_opts *o) {
  const struct tz_adam_cpu_opts defaults = {0};
  if (!o)
    o = &defaults;
  TZ_CHECK(tz_adam_params_check(p));
  TZ_CHECK(check_call(master, m, v, grad, grad_dtype, param_copy, copy_dtype, n, o));
  if (n == 0)
    return 0;
  const struct adam_consts c = {
      .grad_scale = p->grad_scale,
      .wd = p->weight_decay,
      .beta1 = p->beta1,
      .omb1 = 1.0f - p->beta1,
      .beta2 = p->beta2,
      .omb2 = 1.0f - p->beta2,
      .bc1 = p->bias_corr1,
      .bc2 = p->bias_corr2,
      .eps = p->eps,
      .nlr = -p->lr,
      .decoupled = p->decoupled,
  };
  return run_chunks(o, pick(resolve_path(o->path), 0), &c, master, m, v, grad, (int)grad_dtype,
                    param_copy, param_copy ? (int)copy_dtype : COPY_NONE, n);
}

int tz_adam_cpu_ceiling(float *master, float *m, float *v, const void *grad,
                        enum tz_dtype grad_dtype, void *param_copy, enum tz_dtype copy_dtype,
                        size_t n, const struct tz_adam_cpu_opts *o) {
  const struct tz_adam_cpu_opts defaults = {0};
  if (!o)
    o = &defaults;
  TZ_CHECK(check_call(master, m, v, grad, grad_dtype, param_copy, copy_dtype, n, o));
  if (n == 0)
    return 0;
  return run_chunks(o, pick(resolve_path(o->path), 1), NULL, master, m, v, grad, (int)grad_dtype,
                    param_copy, param_copy ? (int)copy_dtype : COPY_NONE, n);
}
