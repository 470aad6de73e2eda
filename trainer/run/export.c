/* Parameters to and from Hugging Face checkpoints (trainer/run/export.h). */
#include "trainer/run/export.h"

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

/* Rank 0's source of blocks for tz_hf_export, counting the blocks it has gathered. */
struct gather {
  tz_trainer *tr;
  int next;
};

static int gather_block(void *arg, int block, float *buf) {
  struct gather *g = arg;
  g->next = block + 1;
  return export_block(g->tr, block, buf);
}

int tz_export_write(tz_trainer *tr, const struct tz_model_config *mc, const char *dir,
                    const struct tz_hf_export_opts *o, int rank) {
  TZ_CHECK(tz_trainer_sync(tr));
  int rc = 0, nb = tz_model_n_blocks(mc);
  struct gather g = {.tr = tr, .next = 0};
  if (rank == 0) {
    /* tz_hf_export creates dir itself; its missing parents first. */
    int e = tz_file_mkdir_p(NULL, dir, TZ_MKDIR_PARENTS);
    rc = e ? tz_err_errno(e, "--export-safetensors: cannot create the directories above %s", dir)
           : tz_hf_export(dir, mc, o, gather_block, &g);
  }
  if (rank == 0 && rc == 0)
    return 0;
  /* The other ranks take part in every block's gather; so does rank 0 after a failure, for the
   * blocks it had not reached, so that no rank waits for it. */
  float *buf = block_buffer(mc);
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "tz-train: no memory to export a block");
  if (rc < 0) {
    char why[1024];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    for (int b = g.next; b < nb; b++)
      (void)export_block(tr, b, buf);
    rc = tz_err_set(rc, "%s", why);
  }
  for (int b = 0; rank != 0 && b < nb && rc == 0; b++)
    rc = export_block(tr, b, buf);
  free(buf);
  return rc;
}
