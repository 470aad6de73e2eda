/* Fuzz target: the Hugging Face config.json reader (trainer/model/hf.h, tz_hf_config_read_info)
 * and the export's writer of it.
 *
 * An input is the text of a config.json, written to a file and read as tz-train --model reads one.
 * Besides memory errors and undefined behaviour, it checks what the reader promises:
 * - a refusal has a message, and the message names the file;
 * - a config it accepts passes tz_model_config_check, and what the trainer computes from the
 *   config alone (parameter counts, blocks and their sizes, the layer's layout, each layer's
 *   window and RoPE) runs without overflow;
 * - the config.json the export writes for it (tz_hf_config_write_info) reads back to the same
 *   model config, dtype and window: what a run trained is what transformers and a later import
 *   get. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "tests/fuzz/fuzz_files.h"
#include "trainer/model/hf.h"
#include "trainer/model/hf_internal.h"
#include "trainer/model/model.h"

static char root[256], in_path[300], out_dir[300], out_json[320];

static void cleanup(void) {
  unlink(in_path);
  unlink(out_json);
  rmdir(out_dir);
  rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  tz_log_set_level(TZ_LOG_ERROR);
  fuzz_tmpdir(root, sizeof root, "hfcfg");
  snprintf(in_path, sizeof in_path, "%s/in.json", root);
  snprintf(out_dir, sizeof out_dir, "%s/out", root);
  snprintf(out_json, sizeof out_json, "%s/config.json", out_dir);
  if (mkdir(out_dir, 0755) < 0)
    abort();
  atexit(cleanup);
  return 0;
}

static void fail(const char *what, const char *text) {
  fprintf(stderr, "fuzz_hf_config: %s: %s\n", what, text ? text : "");
  abort();
}

/* What the trainer derives from the config alone, with every result used so that nothing is
 * left out by the compiler. */
static void derive(const struct tz_model_config *cfg) {
  uint64_t sum = tz_model_n_params(cfg) + tz_model_n_active_params(cfg);
  int nb = tz_model_n_blocks(cfg);
  if (nb < 2)
    fail("blocks", "fewer than the embedding and the head");
  for (int b = 0; b < nb; b++)
    sum += tz_model_block_numel(cfg, b) + (uint64_t)tz_model_block_parts(cfg, b) +
           (uint64_t)tz_model_block_layer(cfg, b);
  struct tz_block_layout lay;
  if (tz_model_layer_layout(cfg, &lay) < 0)
    fail("layer layout", tz_err_msg());
  sum += tz_model_layer_numel(cfg);
  int T = cfg->max_seq < 4096 ? cfg->max_seq : 4096;
  for (int l = 0; l<cfg->n_layer; l += cfg->n_layer> 1 ? cfg->n_layer - 1 : 1) {
    struct tz_rope r;
    tz_model_layer_rope(cfg, l, T, &r);
    sum += (uint64_t)tz_model_layer_window(cfg, l) + (uint64_t)tz_model_block_of_layer(cfg, l);
  }
  sum += (uint64_t)tz_model_head_dim(cfg) + (uint64_t)tz_model_rope_dims(cfg);
  const char *variant = tz_model_variant(cfg, T);
  sum += variant ? strlen(variant) : 0;
  if (sum == 0)
    fail("derived sizes", "all zero");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_put(in_path, data, size);
  struct tz_model_config cfg;
  enum tz_dtype dt;
  struct tz_hf_info info;
  tz_err_clear();
  if (tz_hf_config_read_info(in_path, &cfg, &dt, &info) < 0) {
    const char *msg = tz_err_msg();
    if (!msg || !*msg)
      fail("a refusal without a message", in_path);
    if (!strstr(msg, in_path))
      fail("a refusal that does not name the file", msg);
    return 0;
  }
  if (tz_model_config_check(&cfg) < 0)
    fail("an accepted config that the model refuses", tz_err_msg());
  derive(&cfg);

  /* The export's config.json, read back */
  unlink(out_json);
  if (tz_hf_config_write_info(out_dir, &cfg, dt, &info) < 0)
    fail("writing the config back", tz_err_msg());
  struct tz_model_config back;
  enum tz_dtype dt2;
  struct tz_hf_info info2;
  if (tz_hf_config_read_info(out_json, &back, &dt2, &info2) < 0)
    fail("the written config.json is refused", tz_err_msg());
  if (memcmp(&back, &cfg, sizeof cfg) != 0)
    fail("the written config.json reads back to another model config", out_json);
  if (dt2 != dt)
    fail("the written config.json reads back to another dtype", out_json);
  if (info2.sliding_window != info.sliding_window || info2.n_eos != info.n_eos ||
      memcmp(info2.eos, info.eos, sizeof info.eos) != 0)
    fail("the written config.json reads back to another window or eos list", out_json);
  return 0;
}
