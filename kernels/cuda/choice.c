/* The cuda backend's settings and its choice of attention kernels (kernels/cuda/choice.h). */
#include "kernels/cuda/choice.h"

#include <stddef.h>

static const char *const attention_names[] = {"auto",     "simple", "one-pass",
                                              "two-pass", "wgmma",  NULL};
static const char *const matmul_names[] = {"cublaslt", "plain", NULL};
static const char *const norm_bwd_names[] = {"two-pass", "one-pass", NULL};

const char *const tz_cuda_tile_names[TZ_CUDA_TILES + 1] = {"4x32", "8x64", NULL};

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
    [TZ_CUDA_SET_ATTENTION_TILES] = {.name = "attention_tiles",
                                     .kind = TZ_SETTING_ENUM,
                                     .values = tz_cuda_tile_names,
                                     .help = "the one-pass backward's tiles with attention "
                                             "one-pass (warps x query rows; tz-bench layer "
                                             "times each)"},
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
};

const char *tz_cuda_attention_kernel_name(enum tz_cuda_attention_kernel k) {
  static const char *const names[] = {"plain", "mma", "one-pass", "wgmma"};
  return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* mma.sync (attention_mma.cu, and the one-pass kernels built on it): 16-bit storage, D a
 * multiple of 4 up to 128, every tensor 8-byte aligned (the padded widths' copies; 16 bytes
 * and D 32, 64 or 128 take the exact widths, the kernels' own business). */
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

/* Where auto runs the one-pass backward: measured on the H200 (tz-bench layer, every shape of
 * tools/gpu-check.sh attnshapes; docs/cuda-kernels.md), in its 8x64 tiles it is faster than the
 * two-pass kernels for bf16 at head dim 128, with a kv head per query head (3.35 ms against 3.96
 * for attention at T 2048, 11.85 against 13.43 at 8192, even at 128) and with grouped kv heads
 * since each query head has a block of its own (Qwen2-7B's 28/4: 3.09 against 4.42; 32/8: 3.42
 * against 3.97), and at head dim 96 with grouped kv heads (32/8: 2.98 against 3.19); at 64 it is
 * slower (32/8: 2.29 against 2.16), and at 80 and at 96 with a kv head per head it was not
 * measured in these tiles (at 80, 4x32: 3.61 against 2.53). The index is tz_cuda_tile_names'. */
int tz_cuda_attention_onepass_tiles(const struct tz_cuda_attention_call *c) {
  if (c->S != TZ_BF16 || !tz_cuda_attention_mma_takes(c))
    return -1;
  return c->D == 128 || (c->D == 96 && c->Hkv < c->H) ? 1 : -1;
}

struct tz_cuda_attention_choice tz_cuda_attention_choose(enum tz_cuda_attention_mode mode,
                                                         int tiles,
                                                         const struct tz_cuda_attention_call *c) {
  struct tz_cuda_attention_choice ch = {TZ_CUDA_KERNEL_PLAIN, TZ_CUDA_KERNEL_PLAIN, -1};
  if (mode == TZ_CUDA_ATTENTION_SIMPLE)
    return ch;
  int mma = tz_cuda_attention_mma_takes(c);
  /* auto's kernels are the wgmma ones where they take the shape, at every head dim they build:
   * at Llama-7B's layer (128) the forward 1.41x and the backward 1.40x the mma.sync ones; at 64,
   * 80 and 96 attention forward + backward 1.62x, 1.37x and 1.42x (H200, 2026-12-05:
   * docs/cuda-kernels.md) */
  int wgmma = (mode == TZ_CUDA_ATTENTION_AUTO || mode == TZ_CUDA_ATTENTION_WGMMA) &&
              tz_cuda_attention_wgmma_takes(c, 1);
  if (wgmma) {
    ch.fwd = ch.bwd = TZ_CUDA_KERNEL_WGMMA;
    return ch;
  }
  if (!mma)
    return ch;
  ch.fwd = mode == TZ_CUDA_ATTENTION_ONE_PASS ? TZ_CUDA_KERNEL_ONE_PASS : TZ_CUDA_KERNEL_MMA;
  ch.tiles = mode == TZ_CUDA_ATTENTION_ONE_PASS   ? tiles
             : mode == TZ_CUDA_ATTENTION_TWO_PASS ? -1
                                                  : tz_cuda_attention_onepass_tiles(c);
  ch.bwd = ch.tiles >= 0 ? TZ_CUDA_KERNEL_ONE_PASS : TZ_CUDA_KERNEL_MMA;
  return ch;
}
