/* Private to trainer/model/hf.c, hf_config.c, hf_json.c and hf_rope.c: the pieces of an export and
 * of a path that they share, and config.json's reading helpers. */
#ifndef TZ_TRAINER_HF_INTERNAL_H
#define TZ_TRAINER_HF_INTERNAL_H

#include <jansson.h>

#include "core/dtype.h"
#include "trainer/model/family.h"
#include "trainer/model/hf.h"
#include "trainer/model/model.h"

/* config.json being read: its root object, its path for messages, and partial_rotary_factor once
 * the rope keys are read (1: the whole head). */
struct tz_hf_cfgp {
  json_t *root;
  const char *path;
  double partial;
};
/* v as JSON text, for messages (at most 80 characters kept). */
const char *tz_hf_jtext(json_t *v, char *buf, size_t len);
/* The root's key, NULL when absent or null. */
json_t *tz_hf_jget(const struct tz_hf_cfgp *p, const char *key);
/* A finite number key of object obj (named in messages as where.key); absent or null: dflt
 * unless required. */
int tz_hf_num_of(const struct tz_hf_cfgp *p, json_t *obj, const char *where, const char *key,
                 int required, double dflt, double *out);
/* hf_rope.c: the rope keys into cfg (rope_type and its numbers, rope_theta, Gemma 3's local
 * rope, partial_rotary_factor), each refusal naming its key; and written into the config object
 * r in both transformers' spellings. */
int tz_hf_rope_read(struct tz_hf_cfgp *p, const struct tz_family *fam, struct tz_model_config *cfg);
int tz_hf_rope_write(json_t *r, const struct tz_model_config *cfg);

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
