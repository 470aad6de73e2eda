/* The cuda backend's settings and its choice of attention kernels (kernels/cuda/choice.h). */
#include "kernels/cuda/choice.h"

#include <stddef.h>

/* In enum tz_cuda_attention_mode's order. A value removed with its kernels is refused like any
 * other the table lacks (docs/cuda-kernels.md, "Which kernels serve a call"). */
static const char *const attention_names[] = {"auto", "simple", "two-pass", "wgmma", NULL};
static const char *const matmul_names[] = {"cublaslt", "plain", NULL};
static const char *const norm_bwd_names[] = {"two-pass", "one-pass", NULL};
static const char *const softcap_tanh_names[] = {"exact", "approx", NULL};

const struct tz_setting tz_cuda_settings[TZ_CUDA_N_SETTINGS] = {
    [TZ_CUDA_SET_ATTENTION] = {.name = "attention",
                               .kind = TZ_SETTING_ENUM,
                               .values = attention_names,
                               .env = "TZ_CUDA_ATTENTION",
                               .help = "the attention kernels (tierzero.cuda_attention)"},
    [TZ_CUDA_SET_MATMUL] = {.name = "matmul",
                            .kind = TZ_SETTING_ENUM,
                            .values = matmul_names,
                            .env = "TZ_CUDA_MATMUL",
                            .help = "the matmul: cuBLASLt, or the plain kernel for every call "
                                    "(tierzero.cuda_matmul)"},
    [TZ_CUDA_SET_VARIANTS] = {.name = "variants",
                              .kind = TZ_SETTING_BOOL,
                              .env = "TZ_CUDA_VARIANTS",
                              .def = 1,
                              .help = "the families' variants on this backend (Gemma's weight "
                                      "offset, GeGLU, softcaps, attention scale and windows; on: "
                                      "their GPU checks passed, docs/cuda-kernels.md)"},
    [TZ_CUDA_SET_NORM_BWD] = {.name = "norm_bwd",
                              .kind = TZ_SETTING_ENUM,
                              .values = norm_bwd_names,
                              .env = "TZ_CUDA_NORM_BWD",
                              .def = 1,
                              .help = "RMSNorm's backward: dx, then the weight gradient's partial "
                                      "sums reading dout and x again (two-pass), or both from one "
                                      "read (one-pass; docs/cuda-kernels.md)"},
    [TZ_CUDA_SET_SOFTCAP_TANH] = {.name = "softcap_tanh",
                                  .kind = TZ_SETTING_ENUM,
                                  .values = softcap_tanh_names,
                                  .env = "TZ_CUDA_SOFTCAP_TANH",
                                  .help = "the attention softcap's tanh: exact (within 3e-7), "
                                          "or the hardware's tanh.approx.f32 (approx: one "
                                          "instruction, about 2^-11 relative error)"},
};

const char *tz_cuda_attention_kernel_name(enum tz_cuda_attention_kernel k) {
  static const char *const names[] = {"plain", "mma", "wgmma"};
  return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* mma.sync (attention_mma.cu): 16-bit storage, D a multiple of 4 up to 128, every tensor 8-byte
 * aligned (the padded widths' copies; 16 bytes and D 32, 64 or 128 take the exact widths, the
 * kernels' own business). */
int tz_cuda_attention_mma_takes(const struct tz_cuda_attention_call *c) {
  return (c->S == TZ_BF16 || c->S == TZ_F16) && c->D > 0 && c->D % 4 == 0 && c->D <= 128 &&
         c->align >= 8;
}

/* Warpgroup MMA (attention_wgmma.cu): bf16 on an sm_90 device, 16-byte aligned tensors, head
 * dim 128, and by name 64 exactly and the multiples of 8 between padded to 128. */
int tz_cuda_attention_wgmma_takes(const struct tz_cuda_attention_call *c, int every_head_dim) {
  if (c->S != TZ_BF16 || !c->sm90 || c->align < 16)
    return 0;
  return c->D == 128 || (every_head_dim && c->D % 8 == 0 && c->D >= 64 && c->D <= 128);
}

/* auto: the wgmma kernels where they take the call, at every head dim they build, as measured on
 * sm_90 (H100 and H200, the only GPUs measured): at Llama-7B's layer (128) the forward 1.43x and
 * the backward 1.55x the mma.sync two-pass ones (0.817 -> 0.573 ms, 2.906 -> 1.876; H200,
 * 2026-12-03), at 64, 80 and 96 attention forward + backward 1.62x, 1.37x and 1.42x (H200,
 * 2026-12-05; docs/cuda-kernels.md). Elsewhere (fp16, a head dim wgmma does not build, tensors
 * not 16-byte aligned, a GPU other than sm_90) the mma.sync kernels where they take the call,
 * else the plain ones. Masked calls (packed documents or variants) too: at llama-7b's layer on an
 * H100 (2026-12-06, tools/gpu-check.sh wgmasks) attention forward + backward 1.40x the mma.sync
 * kernels with documents of mean 512 tokens (1.17x at 128), 1.52x with a window of 512, 1.58x
 * softcapped, 1.56x at 8192 tokens with a window of 4096. */
struct tz_cuda_attention_choice tz_cuda_attention_choose(enum tz_cuda_attention_mode mode,
                                                         const struct tz_cuda_attention_call *c) {
  struct tz_cuda_attention_choice ch = {TZ_CUDA_KERNEL_PLAIN, TZ_CUDA_KERNEL_PLAIN};
  if (mode == TZ_CUDA_ATTENTION_SIMPLE)
    return ch;
  if ((mode == TZ_CUDA_ATTENTION_AUTO || mode == TZ_CUDA_ATTENTION_WGMMA) &&
      tz_cuda_attention_wgmma_takes(c, 1))
    ch.fwd = ch.bwd = TZ_CUDA_KERNEL_WGMMA;
  else if (tz_cuda_attention_mma_takes(c))
    ch.fwd = ch.bwd = TZ_CUDA_KERNEL_MMA;
  return ch;
}
