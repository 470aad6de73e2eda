/* A trainer's parameters to and from Hugging Face checkpoints (trainer/model/hf.h): every block
 * gathered from or scattered to the ranks' shards. */
#ifndef TZ_TRAINER_EXPORT_H
#define TZ_TRAINER_EXPORT_H

#include "core/dtype.h"
#include "trainer/model/hf.h"
#include "trainer/model/model.h"
#include "trainer/step/train.h"

/* Every block of the checkpoint into the trainer's master and parameter shards (before training,
 * tz_trainer_param_store). mc is the trainer's model, the checkpoint's shape. */
int tz_export_import(tz_trainer *tr, tz_hf_model *hm, const struct tz_model_config *mc);

/* The fp32 master weights to dir (created with its missing parents) as tz_hf_export writes them
 * with o (NULL: tz_hf_export_opts_init's): stored dtype, shard size, tokenizer files (collective:
 * rank 0 writes while the others take part in the same gathers, every block in order, also after
 * a failure on rank 0). Syncs first. */
int tz_export_write(tz_trainer *tr, const struct tz_model_config *mc, const char *dir,
                    const struct tz_hf_export_opts *o, int rank);

#endif
