/* Private to trainer/hf.c and trainer/hf_config.c: the pieces of an export and of a path that
 * both use. */
#ifndef TZ_TRAINER_HF_INTERNAL_H
#define TZ_TRAINER_HF_INTERNAL_H

#include <jansson.h>

#include "core/dtype.h"
#include "trainer/hf.h"
#include "trainer/model.h"

/* "dir/name", malloc'ed; NULL without memory. */
char *tz_hf_join(const char *dir, const char *name);
/* dir/name = r as JSON with the fewest digits that read back the same, written atomically. */
int tz_hf_write_json(const char *dir, const char *name, json_t *r);
/* config.json of cfg in dir (tz_hf_config_write), with what the source config said beyond cfg
 * (info, may be NULL). */
int tz_hf_config_write_info(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype,
                            const struct tz_hf_info *info);
/* generation_config.json: src_dir's, if it has one, with cfg's token ids. */
int tz_hf_generation_write(const char *dir, const struct tz_model_config *cfg,
                           const struct tz_hf_info *info, const char *src_dir);
/* The tokenizer's files of src copied into dir (those src has). */
int tz_hf_copy_tokenizer(const char *dir, const char *src);
/* 1 when name is one of the tokenizer files tz_hf_copy_tokenizer copies. */
int tz_hf_is_tokenizer_file(const char *name);

#endif
