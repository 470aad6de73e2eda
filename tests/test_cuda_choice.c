/* The cuda backend's choice of attention kernels, without a GPU: each of tierzero.cuda_attention's
 * names, set through the config, reaches the backend as its setting (the trainer's string,
 * tz_train_compute_settings) and picks the kernels that name promises for a shape; a name the
 * backend lacks is refused naming the key; and tz_cuda_attention_choose only ever gives a kernel
 * that takes the call (each kernel file's predicate), over a sweep of shapes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/error.h"
#include "core/settings.h"
#include "kernels/compute.h"
#include "kernels/cuda/choice.h"
#include "testlib.h"
#include "trainer/step/train.h"

/* The backend's settings as tz-train hands them over for config c: parsed as the backend parses
 * them at create. */
static int settings_of(const struct tz_config *c, int64_t *v) {
  char s[256];
  int rc = tz_train_compute_settings(c, "cuda", s, sizeof s);
  if (rc < 0)
    return rc;
  return tz_settings_parse("compute cuda", tz_cuda_settings, TZ_CUDA_N_SETTINGS, s, v);
}

/* Every name of tierzero.cuda_attention, through the config (--set, as a file's key is read the
 * same way), to the kernels a bf16 head-dim-128 call on an H200 and a head-dim-64 one run, and a
 * head-dim-128 one with packed documents or variants (masked). */
static void test_each_name_reaches_its_kernels(void **state) {
  (void)state;
  unsetenv("TZ_CUDA_ATTENTION");
  unsetenv("TZ_CUDA_MATMUL");
  static const struct {
    const char *name;
    enum tz_cuda_attention_mode mode;
    enum tz_cuda_attention_kernel fwd128, bwd128, fwd64, bwd64, masked128;
  } want[] = {
      {"auto", TZ_CUDA_ATTENTION_AUTO, TZ_CUDA_KERNEL_WGMMA, TZ_CUDA_KERNEL_WGMMA,
       TZ_CUDA_KERNEL_WGMMA, TZ_CUDA_KERNEL_WGMMA, TZ_CUDA_KERNEL_WGMMA},
      {"simple", TZ_CUDA_ATTENTION_SIMPLE, TZ_CUDA_KERNEL_PLAIN, TZ_CUDA_KERNEL_PLAIN,
       TZ_CUDA_KERNEL_PLAIN, TZ_CUDA_KERNEL_PLAIN, TZ_CUDA_KERNEL_PLAIN},
      {"two-pass", TZ_CUDA_ATTENTION_TWO_PASS, TZ_CUDA_KERNEL_MMA, TZ_CUDA_KERNEL_MMA,
       TZ_CUDA_KERNEL_MMA, TZ_CUDA_KERNEL_MMA, TZ_CUDA_KERNEL_MMA},
      {"wgmma", TZ_CUDA_ATTENTION_WGMMA, TZ_CUDA_KERNEL_WGMMA, TZ_CUDA_KERNEL_WGMMA,
       TZ_CUDA_KERNEL_WGMMA, TZ_CUDA_KERNEL_WGMMA, TZ_CUDA_KERNEL_WGMMA},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    struct tz_config c;
    tz_config_defaults(&c);
    TZ_ASSERT_OK(tz_config_set(&c, "tierzero.cuda_attention", want[i].name));
    int64_t v[TZ_CUDA_N_SETTINGS];
    TZ_ASSERT_OK(settings_of(&c, v));
    tz_config_free(&c);
    if (v[TZ_CUDA_SET_ATTENTION] != want[i].mode)
      print_error("%s: mode %lld, want %d\n", want[i].name, (long long)v[TZ_CUDA_SET_ATTENTION],
                  (int)want[i].mode);
    assert_int_equal(v[TZ_CUDA_SET_ATTENTION], want[i].mode);
    struct tz_cuda_attention_call d128 = {TZ_BF16, 1, 32, 8, 128, 256, 0};
    struct tz_cuda_attention_call d64 = {TZ_BF16, 1, 32, 8, 64, 256, 0};
    struct tz_cuda_attention_call m128 = {TZ_BF16, 1, 32, 8, 128, 256, 1};
    struct tz_cuda_attention_choice a =
        tz_cuda_attention_choose((enum tz_cuda_attention_mode)v[TZ_CUDA_SET_ATTENTION], &d128);
    struct tz_cuda_attention_choice b =
        tz_cuda_attention_choose((enum tz_cuda_attention_mode)v[TZ_CUDA_SET_ATTENTION], &d64);
    printf("%-9s d128 %s/%s  d64 %s/%s\n", want[i].name, tz_cuda_attention_kernel_name(a.fwd),
           tz_cuda_attention_kernel_name(a.bwd), tz_cuda_attention_kernel_name(b.fwd),
           tz_cuda_attention_kernel_name(b.bwd));
    assert_int_equal(a.fwd, want[i].fwd128);
    assert_int_equal(a.bwd, want[i].bwd128);
    assert_int_equal(b.fwd, want[i].fwd64);
    assert_int_equal(b.bwd, want[i].bwd64);
    struct tz_cuda_attention_choice m =
        tz_cuda_attention_choose((enum tz_cuda_attention_mode)v[TZ_CUDA_SET_ATTENTION], &m128);
    assert_int_equal(m.fwd, want[i].masked128);
    assert_int_equal(m.bwd, want[i].masked128);
  }
  /* auto and wgmma on another GPU (not sm_90), at every head dim the mma.sync kernels take, with
   * grouped kv heads or not, masked or not: the mma.sync kernels, forward and two-pass backward */
  static const int dims[] = {64, 80, 96, 128};
  for (int m = 0; m < 4; m++)
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
      for (int hkv = 8; hkv <= 32; hkv *= 4) {
        struct tz_cuda_attention_call a100 = {TZ_BF16, 0, 32, hkv, dims[i], 256, m / 2};
        struct tz_cuda_attention_choice a = tz_cuda_attention_choose(
            m % 2 ? TZ_CUDA_ATTENTION_WGMMA : TZ_CUDA_ATTENTION_AUTO, &a100);
        assert_int_equal(a.fwd, TZ_CUDA_KERNEL_MMA);
        assert_int_equal(a.bwd, TZ_CUDA_KERNEL_MMA);
      }
}

/* A name the backend lacks is refused before anything runs, naming the key and the names it
 * takes (one-pass among them: its kernels left the build); so is a matmul it lacks, and the
 * variable's bad value, naming the variable. */
static void test_unknown_names_refused(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.cuda_attention", "fancy"));
  int64_t v[TZ_CUDA_N_SETTINGS];
  assert_int_equal(settings_of(&c, v), TZ_ECONFIG);
  printf("%s\n", tz_err_msg());
  assert_non_null(strstr(tz_err_msg(), "tierzero.cuda_attention"));
  assert_non_null(strstr(tz_err_msg(), "one of auto, simple, two-pass, wgmma"));
  tz_config_free(&c);
  /* one-pass, a name until its kernels were removed: refused the same way, by the config's key
   * and by the variable */
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.cuda_attention", "one-pass"));
  assert_int_equal(settings_of(&c, v), TZ_ECONFIG);
  printf("%s\n", tz_err_msg());
  assert_non_null(strstr(tz_err_msg(), "tierzero.cuda_attention"));
  assert_non_null(strstr(tz_err_msg(), "\"one-pass\" is not one of auto, simple, two-pass, wgmma"));
  tz_config_free(&c);
  setenv("TZ_CUDA_ATTENTION", "one-pass", 1);
  assert_int_equal(tz_settings_parse("compute cuda", tz_cuda_settings, TZ_CUDA_N_SETTINGS, NULL, v),
                   TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "TZ_CUDA_ATTENTION \"one-pass\" is not one of auto"));
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_apply_env(&c));
  unsetenv("TZ_CUDA_ATTENTION");
  assert_int_equal(settings_of(&c, v), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "tierzero.cuda_attention"));
  tz_config_free(&c);
  assert_int_equal(tz_compute_settings_check("cuda", "attention=one-pass"), TZ_ECONFIG);
  assert_int_equal(tz_compute_settings_check("cuda", "attention_tiles=8x64"), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "no setting \"attention_tiles\""));
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.cuda_matmul", "cublas"));
  assert_int_equal(settings_of(&c, v), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "tierzero.cuda_matmul"));
  tz_config_free(&c);
  /* the hbm tier's settings are checked at the same time, by the tier's table */
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.gds", "maybe"));
  assert_int_equal(settings_of(&c, v), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "tierzero.gds"));
  tz_config_free(&c);
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.hbm_pin_piece", "2 parsecs"));
  assert_int_equal(settings_of(&c, v), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "tierzero.hbm_pin_piece"));
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.hbm_pin_piece", "2MiB"));
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.gds", "off"));
  TZ_ASSERT_OK(settings_of(&c, v)); /* and handed to the cuda backend: none of them its own */
  tz_config_free(&c);
  /* checked even where the run's backend is the cpu */
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.cuda_attention", "fancy"));
  char s[64];
  assert_int_equal(tz_train_compute_settings(&c, "cpu", s, sizeof s), TZ_ECONFIG);
  tz_config_free(&c);
  /* a program without a config: the variable, where the string leaves the setting out */
  setenv("TZ_CUDA_ATTENTION", "two-pass", 1);
  TZ_ASSERT_OK(tz_settings_parse("compute cuda", tz_cuda_settings, TZ_CUDA_N_SETTINGS, NULL, v));
  assert_int_equal(v[TZ_CUDA_SET_ATTENTION], TZ_CUDA_ATTENTION_TWO_PASS);
  TZ_ASSERT_OK(tz_settings_parse("compute cuda", tz_cuda_settings, TZ_CUDA_N_SETTINGS,
                                 "attention=simple", v));
  assert_int_equal(v[TZ_CUDA_SET_ATTENTION], TZ_CUDA_ATTENTION_SIMPLE);
  setenv("TZ_CUDA_ATTENTION", "fast", 1);
  assert_int_equal(tz_settings_parse("compute cuda", tz_cuda_settings, TZ_CUDA_N_SETTINGS, NULL, v),
                   TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "TZ_CUDA_ATTENTION"));
  unsetenv("TZ_CUDA_ATTENTION");
  /* a setting named nowhere takes its table's default, an enum's too (norm_bwd: one-pass) */
  unsetenv("TZ_CUDA_MATMUL");
  unsetenv("TZ_CUDA_VARIANTS");
  unsetenv("TZ_CUDA_NORM_BWD");
  TZ_ASSERT_OK(tz_settings_parse("compute cuda", tz_cuda_settings, TZ_CUDA_N_SETTINGS, NULL, v));
  for (int i = 0; i < TZ_CUDA_N_SETTINGS; i++)
    assert_int_equal(v[i], tz_cuda_settings[i].def);
  assert_string_equal(tz_cuda_settings[TZ_CUDA_SET_NORM_BWD].values[v[TZ_CUDA_SET_NORM_BWD]],
                      "one-pass");
  assert_int_equal(v[TZ_CUDA_SET_ATTENTION], TZ_CUDA_ATTENTION_AUTO);
  assert_int_equal(tz_compute_settings_check("cuda", "attention=auto,kernels=all"), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "no setting \"kernels\""));
  assert_int_equal(tz_compute_settings_check("cpu", "attention=auto"), TZ_ECONFIG);
}

/* Whatever the mode, the kernel chosen takes the call by its file's own predicate: simple is
 * plain everywhere; wgmma wherever the predicate takes it, masked calls (packed documents or
 * variants) included; two-pass never wgmma. auto is wgmma where that takes the call, masked or
 * not, else mma.sync where that takes it, else plain; the forward and the backward are always
 * the same kernels. */
static void test_choice_takes_the_call(void **state) {
  (void)state;
  static const enum tz_dtype dts[] = {TZ_F32, TZ_BF16, TZ_F16};
  static const unsigned aligns[] = {2, 4, 8, 16, 256};
  int n = 0;
  for (int mode = TZ_CUDA_ATTENTION_AUTO; mode <= TZ_CUDA_ATTENTION_WGMMA; mode++)
    for (int dt = 0; dt < 3; dt++)
      for (int sm90 = 0; sm90 < 2; sm90++)
        for (int D = 1; D <= 160; D++)
          for (int a = 0; a < 5; a++)
            for (int g = 1; g <= 4; g *= 2)
              for (int masked = 0; masked < 2; masked++) {
                struct tz_cuda_attention_call c = {dts[dt], sm90, 8, 8 / g, D, aligns[a], masked};
                struct tz_cuda_attention_choice ch =
                    tz_cuda_attention_choose((enum tz_cuda_attention_mode)mode, &c);
                enum tz_cuda_attention_kernel ks[2] = {ch.fwd, ch.bwd};
                for (int i = 0; i < 2; i++) {
                  if (ks[i] == TZ_CUDA_KERNEL_WGMMA)
                    assert_true(tz_cuda_attention_wgmma_takes(&c, 1));
                  if (ks[i] == TZ_CUDA_KERNEL_MMA)
                    assert_true(tz_cuda_attention_mma_takes(&c));
                  if (mode == TZ_CUDA_ATTENTION_SIMPLE)
                    assert_int_equal(ks[i], TZ_CUDA_KERNEL_PLAIN);
                  if (mode == TZ_CUDA_ATTENTION_TWO_PASS)
                    assert_int_not_equal(ks[i], TZ_CUDA_KERNEL_WGMMA);
                  if (mode == TZ_CUDA_ATTENTION_WGMMA && tz_cuda_attention_wgmma_takes(&c, 1))
                    assert_int_equal(ks[i], TZ_CUDA_KERNEL_WGMMA);
                }
                assert_int_equal(ch.fwd, ch.bwd);
                /* auto takes wgmma wherever it builds, as measured (64 to 128, masked or not),
                 * else mma.sync wherever that takes the call */
                if (mode == TZ_CUDA_ATTENTION_AUTO) {
                  enum tz_cuda_attention_kernel want = TZ_CUDA_KERNEL_PLAIN;
                  if (tz_cuda_attention_wgmma_takes(&c, 1))
                    want = TZ_CUDA_KERNEL_WGMMA;
                  else if (tz_cuda_attention_mma_takes(&c))
                    want = TZ_CUDA_KERNEL_MMA;
                  assert_int_equal(ch.fwd, want);
                }
                n++;
              }
  printf("%d calls chosen\n", n);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_name_reaches_its_kernels),
      cmocka_unit_test(test_unknown_names_refused),
      cmocka_unit_test(test_choice_takes_the_call),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
