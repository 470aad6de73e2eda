/* The cuda backend's choices, in one place: its settings (tz_compute_params.settings), and the one
 * function that decides which attention kernels serve a call. Plain C with no CUDA type, so that
 * the choice is tested on machines without a GPU (tests/test_cuda_choice.c); the layers above the
 * registry do not link this target and cannot include it. */
#ifndef TZ_KERNELS_CUDA_CHOICE_H
#define TZ_KERNELS_CUDA_CHOICE_H

#include "core/dtype.h"
#include "core/settings.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's settings, in this order (docs/config.md, tierzero.cuda_*). */
enum {
  TZ_CUDA_SET_ATTENTION,    /* enum tz_cuda_attention_mode */
  TZ_CUDA_SET_MATMUL,       /* 0 cuBLASLt, 1 the plain kernel */
  TZ_CUDA_SET_VARIANTS,     /* 0 off, 1 on: the families' variants (compute_impl.h) */
  TZ_CUDA_SET_NORM_BWD,     /* 0 two-pass, 1 one-pass: RMSNorm's backward (rmsnorm.cu) */
  TZ_CUDA_SET_SOFTCAP_TANH, /* 0 exact (within 3e-7), 1 approx (tanh.approx.f32): softcaps */
  TZ_CUDA_N_SETTINGS
};
extern const struct tz_setting tz_cuda_settings[TZ_CUDA_N_SETTINGS];

/* The setting "attention": what the user asks for, in its values' order (choice.c's
 * attention_names). */
enum tz_cuda_attention_mode {
  TZ_CUDA_ATTENTION_AUTO,     /* the fastest measured kernels that take the shape */
  TZ_CUDA_ATTENTION_SIMPLE,   /* the plain kernels for every shape (to test them) */
  TZ_CUDA_ATTENTION_TWO_PASS, /* the mma.sync kernels, the backward in two passes */
  TZ_CUDA_ATTENTION_WGMMA,    /* the same as auto (which takes warpgroup MMA wherever it builds) */
};

/* The kernels a call can run on. */
enum tz_cuda_attention_kernel {
  TZ_CUDA_KERNEL_PLAIN, /* attention.cu: any shape and dtype */
  TZ_CUDA_KERNEL_MMA,   /* attention_mma.cu: mma.sync, forward and two-pass backward */
  TZ_CUDA_KERNEL_WGMMA, /* attention_wgmma.cu: warpgroup MMA, sm_90 only */
};
const char *tz_cuda_attention_kernel_name(enum tz_cuda_attention_kernel k);

/* What the choice depends on: the instance's dtype and device, the call's shape, the least
 * alignment in bytes of the call's tensors (a power of two, 256 at most), and whether it has
 * packed documents or variants (a window, a softcap, a scale: compute.h, struct tz_attn_opts). */
struct tz_cuda_attention_call {
  enum tz_dtype S;
  int sm90; /* the device is sm_90 (the wgmma kernels are built for sm_90a) */
  int H, Hkv, D;
  unsigned align;
  int masked;
};

struct tz_cuda_attention_choice {
  enum tz_cuda_attention_kernel fwd, bwd;
};

/* The kernels mode runs call on. Every kernel chosen takes the call: the choice asks each kernel
 * file's own predicate. */
struct tz_cuda_attention_choice tz_cuda_attention_choose(enum tz_cuda_attention_mode mode,
                                                         const struct tz_cuda_attention_call *c);

/* Each kernel file's predicate: whether it takes a call (the choice's only inputs). */
int tz_cuda_attention_mma_takes(const struct tz_cuda_attention_call *c);
int tz_cuda_attention_wgmma_takes(const struct tz_cuda_attention_call *c, int every_head_dim);

#ifdef __cplusplus
}
#endif

#endif
