/* A trainer's parameters to and from Hugging Face Llama checkpoints (trainer/hf.h): every block
 * gathered from or scattered to the ranks' shards. */
#ifndef TZ_TRAINER_EXPORT_H
#define TZ_TRAINER_EXPORT_H

#include "core/dtype.h"
#include "trainer/hf.h"
#include "trainer/model.h"
#include "trainer/train.h"

/* Every block of the checkpoint into the trainer's master and parameter shards (before training,
 * tz_trainer_param_store). mc is the trainer's model, the checkpoint's shape. */
int tz_export_import(tz_trainer *tr, tz_hf_model *hm, const struct tz_model_config *mc);

/* The fp32 master weights to dir (created with its missing parents), stored as dtype (collective:
 * rank 0 writes while the others take part in the same gathers, block by block). Syncs first. */
int tz_export_write(tz_trainer *tr, const struct tz_model_config *mc, const char *dir,
                    enum tz_dtype dtype, int rank);

#endif
