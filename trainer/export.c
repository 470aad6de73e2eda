/* Parameters to and from Hugging Face checkpoints (trainer/export.h). */
#include "trainer/export.h"

#include "core/error.h"
#include "core/plan.h"
#include "util/file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A buffer for the largest block of mc, or NULL. */
static float *block_buffer(const struct tz_model_config *mc) {
  uint64_t most = 0;
  for (int b = 0; b < tz_model_n_blocks(mc); b++)
    if (tz_model_block_numel(mc, b) > most)
      most = tz_model_block_numel(mc, b);
  return malloc(most * sizeof(float));
}

int tz_export_import(tz_trainer *tr, tz_hf_model *hm, const struct tz_model_config *mc) {
  float *buf = block_buffer(mc);
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "tz-train: no memory to import a block");
  int rc = 0;
  for (int b = 0; b < tz_model_n_blocks(mc) && rc == 0; b++) {
    rc = tz_hf_read_block(hm, b, buf);
    if (rc == 0)
      rc = tz_trainer_param_store(tr, b, buf);
  }
  free(buf);
  return rc;
}

static int export_block(void *arg, int block, float *buf) {
  return tz_trainer_param_load(arg, block, TZ_PLAN_MASTER, buf);
}

int tz_export_write(tz_trainer *tr, const struct tz_model_config *mc, const char *dir,
                    const struct tz_hf_export_opts *o, int rank) {
  TZ_CHECK(tz_trainer_sync(tr));
  if (rank == 0) {
    /* tz_hf_export creates dir itself; its missing parents first. */
    int e = tz_file_mkdir_p(NULL, dir, TZ_MKDIR_PARENTS);
    if (e)
      return tz_err_errno(e, "--export-safetensors: cannot create the directories above %s", dir);
    return tz_hf_export(dir, mc, o, export_block, tr);
  }
  float *buf = block_buffer(mc);
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "tz-train: no memory to export a block");
  int rc = 0;
  for (int b = 0; b < tz_model_n_blocks(mc) && rc == 0; b++)
    rc = export_block(tr, b, buf);
  free(buf);
  return rc;
}
