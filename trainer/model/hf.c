/* Hugging Face import and export of the decoder families (hf.h). */
#define _GNU_SOURCE
#include "trainer/model/hf.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/error.h"
#include "trainer/model/family.h"
#include "trainer/model/hf_internal.h"
#include "trainer/model/safetensors.h"
#include "util/file.h"
#include "util/input.h"

static const char *const layer_names[TZ_L_COUNT] = {
    [TZ_L_ATTN_NORM] = "input_layernorm.weight",
    [TZ_L_WQ] = "self_attn.q_proj.weight",
    [TZ_L_WK] = "self_attn.k_proj.weight",
    [TZ_L_WV] = "self_attn.v_proj.weight",
    [TZ_L_WO] = "self_attn.o_proj.weight",
    [TZ_L_MLP_NORM] = "post_attention_layernorm.weight",
    [TZ_L_WG] = "mlp.gate_proj.weight",
    [TZ_L_WU] = "mlp.up_proj.weight",
    [TZ_L_WD] = "mlp.down_proj.weight",
    [TZ_L_BQ] = "self_attn.q_proj.bias",
    [TZ_L_BK] = "self_attn.k_proj.bias",
    [TZ_L_BV] = "self_attn.v_proj.bias",
    [TZ_L_QNORM] = "self_attn.q_norm.weight",
    [TZ_L_KNORM] = "self_attn.k_norm.weight",
    /* the names of OLMo 2 (whose layers have no attn_norm or mlp_norm, so no name is two
     * tensors' in one config) */
    [TZ_L_ATTN_POST_NORM] = "post_attention_layernorm.weight",
    [TZ_L_MLP_POST_NORM] = "post_feedforward_layernorm.weight",
};

int tz_hf_fused_part(const struct tz_model_config *cfg, int tensor, struct tz_hf_fused *out) {
  const struct tz_family *fam = tz_family_of(cfg->family);
  if (!fam || !fam->fused_proj)
    return 0;
  int64_t D = tz_model_head_dim(cfg), HD = cfg->n_head * D, KD = cfg->n_kv_head * D;
  int64_t F = cfg->ffn_dim;
  switch (tensor) {
  case TZ_L_WQ:
    *out = (struct tz_hf_fused){"self_attn.qkv_proj.weight", 0, 0, HD + 2 * KD, 3};
    break;
  case TZ_L_WK:
    *out = (struct tz_hf_fused){"self_attn.qkv_proj.weight", 1, HD, HD + 2 * KD, 3};
    break;
  case TZ_L_WV:
    *out = (struct tz_hf_fused){"self_attn.qkv_proj.weight", 2, HD + KD, HD + 2 * KD, 3};
    break;
  case TZ_L_WG: *out = (struct tz_hf_fused){"mlp.gate_up_proj.weight", 0, 0, 2 * F, 2}; break;
  case TZ_L_WU: *out = (struct tz_hf_fused){"mlp.gate_up_proj.weight", 1, F, 2 * F, 2}; break;
  default: return 0;
  }
  return 1;
}

int tz_hf_pieces(const struct tz_model_config *cfg, int block, int tensor) {
  int expert = tensor == TZ_L_WG || tensor == TZ_L_WU || tensor == TZ_L_WD;
  return tz_model_moe(cfg) && tz_model_block_layer(cfg, block) >= 0 && expert ? cfg->n_expert : 1;
}

int tz_hf_piece_name(const struct tz_model_config *cfg, int block, int tensor, int piece, char *buf,
                     size_t len) {
  int pieces = tz_hf_pieces(cfg, block, tensor);
  if (piece < 0 || piece >= pieces)
    return tz_err_set(TZ_EINVAL, "hf: no piece %d of tensor %d in block %d", piece, tensor, block);
  if (pieces == 1)
    return tz_hf_tensor_name(cfg, block, tensor, buf, len);
  const struct tz_family *fam = tz_family_of(cfg->family);
  int which = tensor == TZ_L_WG ? 0 : tensor == TZ_L_WU ? 1 : 2;
  int n =
      snprintf(buf, len, "model.layers.%d.%s.experts.%d.%s.weight",
               tz_model_block_layer(cfg, block), fam->moe_module, piece, fam->expert_proj[which]);
  if (n < 0 || (size_t)n >= len)
    return tz_err_set(TZ_EINVAL, "hf: name buffer of %zu bytes too short", len);
  return 0;
}

int tz_hf_tensor_name(const struct tz_model_config *cfg, int block, int tensor, char *buf,
                      size_t len) {
  int nb = tz_model_n_blocks(cfg), n, ly = tz_model_block_layer(cfg, block);
  struct tz_hf_fused fu;
  static const char *const shared[] = {"shared_expert.gate_proj", "shared_expert.up_proj",
                                       "shared_expert.down_proj", "shared_expert_gate"};
  if (ly >= 0 && tensor >= TZ_L_SWG && tensor <= TZ_L_SGATE)
    n = snprintf(buf, len, "model.layers.%d.%s.%s.weight", ly,
                 tz_model_moe(cfg) ? tz_family_of(cfg->family)->moe_module : "mlp",
                 shared[tensor - TZ_L_SWG]);
  else if (ly >= 0 && tensor == TZ_L_ROUTER)
    n = snprintf(buf, len, "model.layers.%d.%s.gate.weight", ly,
                 tz_model_moe(cfg) ? tz_family_of(cfg->family)->moe_module : "mlp");
  else if (ly >= 0 && tz_hf_fused_part(cfg, tensor, &fu))
    n = snprintf(buf, len, "model.layers.%d.%s", ly, fu.name);
  else if (block == 0 && tensor == TZ_E_WTE)
    n = snprintf(buf, len, "model.embed_tokens.weight");
  else if (block == nb - 1 && tensor == TZ_H_NORM)
    n = snprintf(buf, len, "model.norm.weight");
  else if (block == nb - 1 && tensor == TZ_H_LM && !cfg->tie_embeddings)
    n = snprintf(buf, len, "lm_head.weight");
  else if (ly >= 0 && tensor == TZ_L_MLP_NORM &&
           cfg->norm_place == TZ_NORM_BOTH) /* Gemma's: post_attention_layernorm is on the output */
    n = snprintf(buf, len, "model.layers.%d.pre_feedforward_layernorm.weight", ly);
  else if (ly >= 0 && tensor >= 0 && tensor < TZ_L_COUNT)
    n = snprintf(buf, len, "model.layers.%d.%s", ly, layer_names[tensor]);
  else
    return tz_err_set(TZ_EINVAL, "hf: no tensor %d in block %d", tensor, block);
  if (n < 0 || (size_t)n >= len)
    return tz_err_set(TZ_EINVAL, "hf: name buffer of %zu bytes too short", len);
  return 0;
}

/* ---- reading ---- */

/* Where each tensor the model reads is: file and header entry, by (block * TZ_L_COUNT + index) *
 * n_pieces + piece (tz_hf_pieces: an expert's projection is a piece of the experts' stacked
 * tensor). A part of a fused tensor (tz_hf_fused_part) is its rows as a tensor of their own:
 * `part`, the header entry with its data range and shape cut to them, which the reader reads as
 * any. */
struct loc {
  int file; /* -1: the tensor has numel 0 in this config */
  const struct tz_st_tensor *t;
  struct tz_st_tensor part;
};

/* A shard as an index of tierzero's names it: its size and the crc32c of the whole file. */
struct shard_expect {
  int has;
  uint64_t bytes;
  uint32_t crc;
};

struct tz_hf_model {
  char *dir;
  struct tz_model_config cfg;
  struct tz_hf_info info;
  int n_files;
  char **names;       /* file names (within dir) */
  tz_st_file **files; /* every one opened by tz_hf_open */
  struct loc *loc;
  int n_pieces;                /* the most pieces of one tensor (n_expert with experts, else 1) */
  struct shard_expect *expect; /* per file: metadata.tierzero_shards' entry (tierzero's
                                  exports), or NULL */
};

static struct loc *loc_of(const tz_hf_model *m, int block, int tensor, int piece) {
  return &m->loc[((size_t)block * TZ_L_COUNT + (size_t)tensor) * (size_t)m->n_pieces +
                 (size_t)piece];
}

void tz_hf_close(tz_hf_model *m) {
  if (!m)
    return;
  for (int i = 0; i < m->n_files; i++) {
    tz_st_close(m->files[i]);
    free(m->names[i]);
  }
  free(m->files);
  free(m->names);
  free(m->loc);
  free(m->expect);
  free(m->dir);
  free(m);
}

static int add_file(tz_hf_model *m, const char *index, const char *name) {
  for (int i = 0; i < m->n_files; i++)
    if (strcmp(m->names[i], name) == 0)
      return i;
  char **nn = realloc(m->names, sizeof *nn * (size_t)(m->n_files + 1));
  if (!nn)
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  m->names = nn;
  tz_st_file **nf = realloc(m->files, sizeof *nf * (size_t)(m->n_files + 1));
  if (!nf)
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  m->files = nf;
  if (!*name || strchr(name, '/') || strcmp(name, "..") == 0)
    return tz_err_set(TZ_EFORMAT, "%s: shard file name '%s' is not a file of the directory", index,
                      name);
  if (!(m->names[m->n_files] = strdup(name)))
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  m->files[m->n_files] = NULL;
  return m->n_files++;
}

static int open_files(tz_hf_model *m, const char *index) {
  for (int i = 0; i < m->n_files; i++) {
    char *path = tz_hf_join(m->dir, m->names[i]);
    if (!path)
      return tz_err_set(TZ_ENOMEM, "hf: out of memory");
    int rc = access(path, F_OK) != 0 && index
                 ? tz_err_errno(errno, "%s names shard %s, which cannot be opened", index, path)
                 : tz_st_open(path, &m->files[i]);
    free(path);
    TZ_CHECK(rc);
  }
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Buffers of the attention that transformers derives from the config and skips on load. */
static int derived_buffer(const char *name) {
  size_t n = strlen(name), k = strlen("rotary_emb.inv_freq");
  return n >= k && strcmp(name + n - k, "rotary_emb.inv_freq") == 0;
}

/* The families with a feature (a flag of their row, by its offset in struct tz_family), for
 * messages: "qwen2" or "qwen2 and qwen3". */
static const char *families_with(size_t flag, char *buf, size_t len) {
  size_t at = 0;
  int n = 0;
  buf[0] = '\0';
  for (int f = 0; f < TZ_FAMILY_COUNT && at < len; f++)
    if (*(const int *)((const char *)&tz_families[f] + flag))
      at +=
          (size_t)snprintf(buf + at, len - at, "%s%s", n++ ? ", " : "", tz_families[f].model_type);
  return n ? buf : "no family";
}

/* Why a tensor the model does not read might be in a checkpoint, for the refusal (buf holds the
 * text where it is built). */
static const char *unread_hint(const struct tz_model_config *cfg, const char *name, char *buf,
                               size_t len) {
  char fams[128];
  if (strcmp(name, "lm_head.weight") == 0 && cfg->tie_embeddings)
    return "tie_word_embeddings is true, so the head is the embedding: a separate lm_head would "
           "be dropped";
  if (strstr(name, "_proj.bias")) {
    snprintf(buf, len, "this family's projections have no biases here (q, k and v have them in %s)",
             families_with(offsetof(struct tz_family, qkv_bias), fams, sizeof fams));
    return buf;
  }
  if (strstr(name, "qkv_proj") || strstr(name, "gate_up_proj")) {
    snprintf(buf, len, "fused projections are the checkpoints of %s only",
             families_with(offsetof(struct tz_family, fused_proj), fams, sizeof fams));
    return buf;
  }
  if (tz_family_of(cfg->family)->fused_proj &&
      (strstr(name, "_proj.weight") && !strstr(name, "o_proj") && !strstr(name, "down_proj"))) {
    snprintf(buf, len,
             "model_type %s holds q, k and v as one self_attn.qkv_proj and gate and up "
             "as one mlp.gate_up_proj",
             tz_model_family_name(cfg->family));
    return buf;
  }
  if (strstr(name, "_norm.weight") && strstr(name, "self_attn")) {
    snprintf(buf, len, "q/k norms belong to %s only",
             families_with(offsetof(struct tz_family, qk_norm), fams, sizeof fams));
    return buf;
  }
  return "it would be dropped silently: is the config that of these weights?";
}

/* Every tensor the model reads: present where the index says, with its shape and a dtype read;
 * and nothing else in the files or the index. */
static int check_tensors(tz_hf_model *m, json_t *weight_map, const char *index) {
  const struct tz_model_config *cfg = &m->cfg;
  int nb = tz_model_n_blocks(cfg), n = 0, rc = 0;
  char hint[256];
  m->n_pieces = tz_model_moe(cfg) ? cfg->n_expert : 1;
  size_t slots = (size_t)nb * TZ_L_COUNT * (size_t)m->n_pieces;
  char(*names)[128] = calloc(slots, sizeof *names);
  const char **sorted = calloc(slots, sizeof *sorted);
  m->loc = calloc(slots, sizeof *m->loc);
  if (!names || !sorted || !m->loc) {
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
    goto out;
  }
  for (size_t k = 0; k < slots; k++)
    m->loc[k].file = -1;
  for (int b = 0; b < nb; b++) {
    struct tz_block_layout l;
    TZ_CHECK_GOTO(tz_model_block_layout(cfg, b, &l), rc, out);
    for (int i = 0; i < l.n; i++) {
      if (!l.t[i].numel)
        continue;
      for (int pc = 0; pc < tz_hf_pieces(cfg, b, i); pc++) {
        char *name = names[n];
        TZ_CHECK_GOTO(tz_hf_piece_name(cfg, b, i, pc, name, sizeof names[n]), rc, out);
        sorted[n++] = name;
        int fi = 0;
        if (weight_map) {
          json_t *v = json_object_get(weight_map, name);
          if (!v) {
            rc = tz_err_set(TZ_ENOENT, "%s: tensor '%s' is not in the weight map", index, name);
            goto out;
          }
          for (fi = 0; fi < m->n_files && strcmp(m->names[fi], json_string_value(v)); fi++)
            ;
        }
        const struct tz_st_tensor *t = tz_st_find(m->files[fi], name);
        const char *path = tz_st_path(m->files[fi]);
        if (!t) {
          rc = tz_err_set(TZ_ENOENT, "%s: no tensor '%s'%s", path, name,
                          weight_map ? " (the index names this file for it)" : "");
          goto out;
        }
        int64_t want[2] = {l.t[i].shape[0] / tz_hf_pieces(cfg, b, i), l.t[i].shape[1]};
        struct tz_hf_fused fu;
        int fused = l.kind == TZ_BLOCK_LAYER && tz_hf_fused_part(cfg, i, &fu);
        if (fused) {
          want[0] = fu.rows;
          if (fu.part > 0)
            n--; /* named once, with its first part */
        }
        int same = t->ndim == l.t[i].ndim && t->shape[0] == want[0] &&
                   (t->ndim == 1 || t->shape[1] == want[1]);
        if (!same) {
          char a[128], s[128];
          tz_st_shape_text(a, sizeof a, t->ndim, t->shape);
          tz_st_shape_text(s, sizeof s, l.t[i].ndim, want);
          rc = tz_err_set(TZ_EFORMAT, "%s: tensor '%s' has shape %s, the config makes it %s", path,
                          name, a, s);
          goto out;
        }
        if (strcmp(t->dtype, "F32") && strcmp(t->dtype, "BF16") && strcmp(t->dtype, "F16")) {
          rc = tz_err_set(TZ_ENOTSUP, "%s: tensor '%s' has dtype %s (F32, BF16 and F16 are read)",
                          path, name, t->dtype);
          goto out;
        }
        struct loc *lc = loc_of(m, b, i, pc);
        *lc = (struct loc){.file = fi, .t = t};
        if (fused) { /* rows [first, first + this part's) of the fused tensor */
          uint64_t row = (t->end - t->begin) / (uint64_t)t->shape[0];
          lc->part = *t;
          lc->part.begin = t->begin + (uint64_t)fu.first * row;
          lc->part.end = lc->part.begin + (uint64_t)l.t[i].shape[0] * row;
          lc->part.shape[0] = l.t[i].shape[0];
          lc->part.numel = l.t[i].numel;
          lc->t = &lc->part;
        }
      }
    }
  }
  qsort(sorted, (size_t)n, sizeof *sorted, cmp_str);
  for (int fi = 0; fi < m->n_files; fi++)
    for (int k = 0; k < tz_st_count(m->files[fi]); k++) {
      const char *name = tz_st_get(m->files[fi], k)->name;
      const char *path = tz_st_path(m->files[fi]);
      if (derived_buffer(name))
        continue;
      if (!bsearch(&name, sorted, (size_t)n, sizeof *sorted, cmp_str)) {
        rc = tz_err_set(TZ_EFORMAT, "%s: tensor '%s' is not read by this model (model_type %s): %s",
                        path, name, tz_model_family_name(cfg->family),
                        unread_hint(cfg, name, hint, sizeof hint));
        goto out;
      }
      json_t *v = weight_map ? json_object_get(weight_map, name) : NULL;
      if (weight_map && (!v || strcmp(json_string_value(v), m->names[fi]) != 0)) {
        rc = tz_err_set(TZ_EFORMAT, "%s: tensor '%s' is here, but %s maps it to %s", path, name,
                        index, v ? json_string_value(v) : "no file");
        goto out;
      }
    }
  if (weight_map) {
    const char *k;
    json_t *v;
    json_object_foreach(weight_map, k, v) {
      if (!derived_buffer(k) && !bsearch(&k, sorted, (size_t)n, sizeof *sorted, cmp_str)) {
        rc = tz_err_set(TZ_EFORMAT, "%s: tensor '%s' is not read by this model (model_type %s): %s",
                        index, k, tz_model_family_name(cfg->family),
                        unread_hint(cfg, k, hint, sizeof hint));
        goto out;
      }
    }
  }
out:
  free(names);
  free(sorted);
  return rc;
}

/* metadata.tierzero_shards of an index tierzero wrote (index_write): each shard's size and
 * crc32c, kept for verify_shards. Indexes without it (save_pretrained's) are taken as they are. */
static int read_export_meta(tz_hf_model *m, const char *index, json_t *meta) {
  json_t *ss = json_is_object(meta) ? json_object_get(meta, "tierzero_shards") : NULL;
  if (!ss)
    return 0;
  if (!json_is_object(ss))
    return tz_err_set(TZ_EFORMAT, "%s: metadata.tierzero_shards is not an object", index);
  if (!(m->expect = calloc((size_t)m->n_files + 1, sizeof *m->expect)))
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  const char *f;
  json_t *v;
  json_object_foreach(ss, f, v) {
    int i = 0;
    while (i < m->n_files && strcmp(m->names[i], f) != 0)
      i++;
    json_t *b = json_object_get(v, "bytes"), *c = json_object_get(v, "crc32c");
    unsigned crc;
    int end = 0;
    if (i == m->n_files)
      return tz_err_set(TZ_EFORMAT,
                        "%s: metadata.tierzero_shards names %s, which the weight map does not",
                        index, f);
    if (!json_is_integer(b) || json_integer_value(b) < 0 || !json_is_string(c) ||
        sscanf(json_string_value(c), "%8x%n", &crc, &end) != 1 || end != 8 ||
        json_string_value(c)[8])
      return tz_err_set(TZ_EFORMAT,
                        "%s: metadata.tierzero_shards[\"%s\"]: want {\"bytes\": N, \"crc32c\": "
                        "8 hex digits}",
                        index, f);
    m->expect[i] = (struct shard_expect){1, (uint64_t)json_integer_value(b), crc};
  }
  return 0;
}

/* With an index of tierzero's: every shard of the size and crc32c the index gives, so that a
 * shard of another export (the directory mixing two exports' files), or one changed or cut since,
 * is refused by name rather than read as one model. The size is checked first: the file is then
 * mapped whole (a file cut between the two would end the process with SIGBUS). */
static int verify_shards(tz_hf_model *m, const char *index) {
  if (!m->expect)
    return 0;
  for (int i = 0; i < m->n_files; i++) {
    if (!m->expect[i].has)
      return tz_err_set(TZ_EFORMAT, "%s: metadata.tierzero_shards does not name shard %s", index,
                        m->names[i]);
    char *path = tz_hf_join(m->dir, m->names[i]);
    if (!path)
      return tz_err_set(TZ_ENOMEM, "hf: out of memory");
    struct stat st;
    uint32_t crc = 0;
    int e = 0, rc = 0;
    if (stat(path, &st) != 0)
      rc = tz_err_errno(errno, "hf: cannot stat %s", path);
    else if ((uint64_t)st.st_size != m->expect[i].bytes)
      rc = tz_err_set(TZ_EFORMAT, "%s: shard %s has %llu bytes, the index says %llu", index,
                      m->names[i], (unsigned long long)st.st_size,
                      (unsigned long long)m->expect[i].bytes);
    else if ((e = tz_file_crc32c(path, m->expect[i].bytes, &crc)) != 0)
      rc = tz_err_errno(e, "hf: cannot read %s", path);
    free(path);
    TZ_CHECK(rc);
    if (crc != m->expect[i].crc)
      return tz_err_set(TZ_EFORMAT,
                        "%s: shard %s has crc32c %08x, the index says %08x: not the file this "
                        "index was written with (another export's, or changed since)",
                        index, m->names[i], (unsigned)crc, (unsigned)m->expect[i].crc);
  }
  return 0;
}

static int read_index(tz_hf_model *m, const char *index, json_t **wm_out) {
  json_error_t jerr;
  json_t *root = tz_input_json(index, 0, &jerr);
  json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
  int rc = 0;
  if (!root)
    rc = tz_err_set(TZ_EFORMAT, "%s: line %d column %d: %s", index, jerr.line, jerr.column,
                    jerr.text);
  else if (!json_is_object(wm))
    rc = tz_err_set(TZ_EFORMAT, "%s: no \"weight_map\" object", index);
  const char *k;
  json_t *v;
  if (!rc)
    json_object_foreach(wm, k, v) {
      if (!json_is_string(v)) {
        rc = tz_err_set(TZ_EFORMAT, "%s: weight_map[\"%s\"] is not a file name", index, k);
        break;
      }
      if ((rc = add_file(m, index, json_string_value(v))) < 0)
        break;
      rc = 0;
    }
  if (!rc)
    rc = read_export_meta(m, index, json_object_get(root, "metadata"));
  if (!rc)
    *wm_out = json_incref(wm);
  json_decref(root);
  return rc;
}

int tz_hf_open(const char *dir, tz_hf_model **out) {
  *out = NULL;
  tz_hf_model *m = calloc(1, sizeof *m);
  if (!m || !(m->dir = strdup(dir))) {
    free(m);
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  }
  int rc;
  json_t *wm = NULL;
  char *single = tz_hf_join(dir, "model.safetensors"),
       *index = tz_hf_join(dir, "model.safetensors.index.json");
  if (!single || !index) {
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
    goto fail;
  }
  TZ_CHECK_GOTO(tz_hf_config_read_info(dir, &m->cfg, NULL, &m->info), rc, fail);
  /* As transformers: one model.safetensors first, else the index. */
  if (access(single, F_OK) == 0) {
    rc = add_file(m, single, "model.safetensors");
  } else if (access(index, F_OK) == 0) {
    rc = read_index(m, index, &wm);
  } else {
    rc = tz_err_set(TZ_ENOENT,
                    "hf: %s has neither model.safetensors nor model.safetensors.index.json", dir);
  }
  if (rc < 0)
    goto fail;
  if (m->n_files == 0) {
    rc = tz_err_set(TZ_EFORMAT, "%s: the weight map is empty", index);
    goto fail;
  }
  TZ_CHECK_GOTO(open_files(m, wm ? index : NULL), rc, fail);
  TZ_CHECK_GOTO(verify_shards(m, index), rc, fail);
  TZ_CHECK_GOTO(check_tensors(m, wm, index), rc, fail);
  json_decref(wm);
  free(single);
  free(index);
  *out = m;
  return 0;
fail:
  json_decref(wm);
  free(single);
  free(index);
  tz_hf_close(m);
  return rc;
}

const struct tz_model_config *tz_hf_config(const tz_hf_model *m) { return &m->cfg; }
const struct tz_hf_info *tz_hf_info(const tz_hf_model *m) { return &m->info; }

int tz_hf_read_block(tz_hf_model *m, int block, float *out) {
  struct tz_block_layout l;
  TZ_CHECK(tz_model_block_layout(&m->cfg, block, &l));
  /* Only the alignment padding between tensors needs zeros: the tensors are read over. */
  uint64_t at = 0;
  for (int i = 0; i < l.n; i++) {
    if (!l.t[i].numel)
      continue;
    memset(out + at, 0, sizeof(float) * (l.t[i].offset - at));
    at = l.t[i].offset + l.t[i].numel;
  }
  memset(out + at, 0, sizeof(float) * (l.numel - at));
  /* The block's tensors in one read, whose threads share them all (an expert's projections each
   * a piece of the experts' stacked tensor). */
  size_t most = (size_t)TZ_L_COUNT * (size_t)m->n_pieces;
  struct tz_st_read *rd = calloc(most, sizeof *rd);
  const struct loc **of = calloc(most, sizeof *of);
  int n = 0, rc = 0;
  if (!rd || !of) {
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
    goto out;
  }
  for (int i = 0; i < l.n; i++) {
    if (!l.t[i].numel)
      continue;
    int pieces = tz_hf_pieces(&m->cfg, block, i);
    uint64_t each = l.t[i].numel / (uint64_t)pieces;
    for (int pc = 0; pc < pieces; pc++) {
      const struct loc *w = loc_of(m, block, i, pc);
      if (w->file < 0) {
        rc = tz_err_set(TZ_EINVAL, "hf: block %d tensor %d was not checked at open", block, i);
        goto out;
      }
      of[n] = w;
      rd[n++] = (struct tz_st_read){
          .f = m->files[w->file], .t = w->t, .out = out + l.t[i].offset + (uint64_t)pc * each};
    }
  }
  TZ_CHECK_GOTO(tz_st_read_tensors_f32(rd, n, 0), rc, out);
  for (int k = 0; k < n && !rc; k++) {
    int64_t bad = rd[k].nonfinite;
    const float *t = rd[k].out;
    if (bad >= 0)
      rc = tz_err_set(TZ_EFORMAT,
                      "%s/%s: tensor '%s' element %lld is %s: weights must be finite (is it the "
                      "checkpoint of a run that diverged?)",
                      m->dir, m->names[of[k]->file], of[k]->t->name, (long long)bad,
                      isnan(t[bad]) ? "nan"
                      : t[bad] > 0  ? "inf"
                                    : "-inf");
  }
out:
  free(rd);
  free(of);
  return rc;
}

int tz_hf_load(tz_hf_model *m, tz_compute *cm, void *const *blocks) {
  uint64_t most = 0;
  for (int b = 0; b < tz_model_n_blocks(&m->cfg); b++)
    if (tz_model_block_numel(&m->cfg, b) > most)
      most = tz_model_block_numel(&m->cfg, b);
  float *buf = malloc(sizeof(float) * most);
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "hf: cannot allocate a block (%llu floats)",
                      (unsigned long long)most);
  int rc = 0;
  for (int b = 0; b < tz_model_n_blocks(&m->cfg) && !rc; b++) {
    rc = tz_hf_read_block(m, b, buf);
    if (!rc)
      rc = tz_model_block_upload(cm, blocks[b], buf, tz_model_block_numel(&m->cfg, b));
  }
  free(buf);
  return rc;
}

/* ---- writing ---- */

void tz_hf_export_opts_init(struct tz_hf_export_opts *o) {
  *o = (struct tz_hf_export_opts){
      .dtype = TZ_BF16, .shard_bytes = 5000000000ull, .tokenizer_dir = NULL};
}

/* One tensor of the export, in the order of the blocks. */
struct out_tensor {
  struct tz_st_entry e;
  char name[128];
  int block;
  uint64_t offset, numel, bytes;
  int shard;
  /* A fused tensor (tz_hf_fused_part): its parts' places in the block, in its row order; offset
   * and numel above are then unused. */
  int n_parts;
  uint64_t part_offset[3], part_numel[3];
};

/* Shards as huggingface_hub's split_state_dict_into_shards (save_pretrained): tensors in order;
 * one larger than the limit alone in its own shard; otherwise a new shard begins when the next
 * tensor would take the current one over the limit. Returns the number of shards. */
static int assign_shards(struct out_tensor *t, int n, uint64_t limit) {
  int shards = 0, cur = -1;
  uint64_t size = 0;
  for (int i = 0; i < n; i++) {
    if (t[i].bytes > limit) {
      t[i].shard = shards++;
      continue;
    }
    if (cur < 0 || size + t[i].bytes > limit) {
      cur = shards++;
      size = 0;
    }
    t[i].shard = cur;
    size += t[i].bytes;
  }
  return shards;
}

static void shard_name(char *buf, size_t len, int k, int n) {
  if (n == 1)
    snprintf(buf, len, "model.safetensors");
  else
    snprintf(buf, len, "model-%05d-of-%05d.safetensors", k + 1, n);
}

/* Removes the weight files of an earlier export that this one (n shards) does not have: a
 * model.safetensors would shadow a new index for transformers, an old index a new single file
 * for nothing, and old shards of another count would only take room. */
/* 1 when name is a file an export writes (so that replacing a directory of them loses nothing). */
static int export_file(const char *name) {
  int k, of, end = 0;
  return strcmp(name, "config.json") == 0 || strcmp(name, "generation_config.json") == 0 ||
         strcmp(name, "model.safetensors") == 0 ||
         strcmp(name, "model.safetensors.index.json") == 0 ||
         (sscanf(name, "model-%5d-of-%5d.safetensors%n", &k, &of, &end) == 2 && !name[end]) ||
         tz_hf_is_tokenizer_file(name);
}

/* The directory's export files removed, then the directory (what a replaced export leaves, or a
 * killed one's temporary directory); files of another kind are left, and so is the directory. */
static int remove_export_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? 0 : tz_err_errno(errno, "hf: cannot list %s", dir);
  struct dirent *de;
  int rc = 0;
  while (!rc && (de = readdir(d))) {
    if (!export_file(de->d_name))
      continue;
    char *p = tz_hf_join(dir, de->d_name);
    if (!p || (unlink(p) != 0 && errno != ENOENT))
      rc = p ? tz_err_errno(errno, "hf: cannot remove %s", p)
             : tz_err_set(TZ_ENOMEM, "hf: out of memory");
    free(p);
  }
  closedir(d);
  if (!rc && rmdir(dir) != 0 && errno != ENOENT && errno != ENOTEMPTY)
    rc = tz_err_errno(errno, "hf: cannot remove %s", dir);
  return rc;
}

/* The first file of dir an export does not write (into name), 1; 0 when there is none or no
 * dir. */
static int foreign_file(const char *dir, char *name, size_t len) {
  DIR *d = opendir(dir);
  if (!d)
    return 0;
  struct dirent *de;
  int found = 0;
  while (!found && (de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && !export_file(de->d_name)) {
      snprintf(name, len, "%s", de->d_name);
      found = 1;
    }
  closedir(d);
  return found;
}

/* A shard as written: the crc32c and the size of the whole file. */
struct shard_sum {
  uint32_t crc;
  uint64_t bytes;
};

/* The index (transformers reads metadata.total_size and weight_map); its metadata also gives each
 * shard's size and the crc32c of the whole file (tierzero_shards), which tz_hf_open checks. A
 * shard is identified by its bytes, not by a name of the export: the same model exported twice
 * gives the same files, and a shard of another export differs in its crc. */
static int index_write(const char *dir, const struct out_tensor *t, int n, int shards,
                       const struct shard_sum *sums) {
  json_t *r = json_object(), *meta = json_object(), *wm = json_object(), *ss = json_object();
  for (int k = 0; k < shards; k++) {
    char f[64], crc[16];
    shard_name(f, sizeof f, k, shards);
    snprintf(crc, sizeof crc, "%08x", (unsigned)sums[k].crc);
    json_t *s = json_object();
    json_object_set_new(s, "bytes", json_integer((json_int_t)sums[k].bytes));
    json_object_set_new(s, "crc32c", json_string(crc));
    json_object_set_new(ss, f, s);
  }
  uint64_t total = 0, params = 0;
  for (int i = 0; i < n; i++) {
    char f[64];
    shard_name(f, sizeof f, t[i].shard, shards);
    json_object_set_new(wm, t[i].name, json_string(f));
    total += t[i].bytes;
    params += t[i].numel;
  }
  json_object_set_new(meta, "total_parameters", json_integer((json_int_t)params));
  json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
  json_object_set_new(meta, "tierzero_shards", ss);
  json_object_set_new(r, "metadata", meta);
  json_object_set_new(r, "weight_map", wm);
  int rc = tz_hf_write_json(dir, "model.safetensors.index.json", r);
  json_decref(r);
  return rc;
}

/* The tensors of every shard, written as the blocks come (each block fetched once, in order). */
static int shards_write(const char *dir, const struct tz_model_config *cfg, struct out_tensor *t,
                        int n, int shards, struct shard_sum *sums,
                        int (*get_block)(void *, int, float *), void *arg) {
  uint64_t most = 0;
  for (int b = 0; b < tz_model_n_blocks(cfg); b++)
    if (tz_model_block_numel(cfg, b) > most)
      most = tz_model_block_numel(cfg, b);
  uint64_t most_fused = 0; /* the largest fused tensor, staged whole */
  for (int i = 0; i < n; i++)
    if (t[i].n_parts && t[i].numel > most_fused)
      most_fused = t[i].numel;
  float *buf = malloc(sizeof(float) * (most ? most : 1));
  float *fused = most_fused ? malloc(sizeof(float) * most_fused) : NULL;
  struct tz_st_entry *e = calloc(n > 0 ? (size_t)n : 1, sizeof *e);
  if (!buf || !e || (most_fused && !fused)) {
    free(buf);
    free(fused);
    free(e);
    return tz_err_set(TZ_ENOMEM, "hf: cannot allocate a block of %llu floats",
                      (unsigned long long)most);
  }
  static const char *const meta[] = {"format", "pt", NULL};
  tz_st_writer *w = NULL;
  int rc = 0, block = -1;
  for (int i = 0; i < n && !rc; i++) {
    if (!w) {
      int k = 0;
      while (i + k < n && t[i + k].shard == t[i].shard) {
        e[k] = t[i + k].e;
        k++;
      }
      char f[64];
      shard_name(f, sizeof f, t[i].shard, shards);
      char *path = tz_hf_join(dir, f);
      rc = path ? tz_st_writer_open(path, e, k, meta, &w)
                : tz_err_set(TZ_ENOMEM, "hf: out of memory");
      free(path);
      if (rc)
        break;
    }
    if (t[i].block != block) {
      block = t[i].block;
      if ((rc = get_block(arg, block, buf)) < 0)
        break;
    }
    const float *data = buf + t[i].offset;
    if (t[i].n_parts) { /* the parts one after another, as the checkpoint holds them */
      uint64_t at = 0;
      for (int k = 0; k < t[i].n_parts; k++) {
        memcpy(fused + at, buf + t[i].part_offset[k], sizeof(float) * t[i].part_numel[k]);
        at += t[i].part_numel[k];
      }
      data = fused;
    }
    if ((rc = tz_st_writer_put(w, data, t[i].numel)) < 0)
      break;
    if (i + 1 == n || t[i + 1].shard != t[i].shard) {
      tz_st_writer_sum(w, &sums[t[i].shard].crc, &sums[t[i].shard].bytes);
      rc = tz_st_writer_close(w, 1);
      w = NULL;
    }
  }
  tz_st_writer_close(w, 0);
  free(buf);
  free(fused);
  free(e);
  return rc;
}

static int export_into(const char *dir, const struct tz_model_config *cfg,
                       const struct tz_hf_export_opts *op,
                       int (*get_block)(void *arg, int block, float *buf), void *arg);

int tz_hf_export_check_dir(const char *dir) {
  char other[256];
  if (foreign_file(dir, other, sizeof other))
    return tz_err_set(TZ_EEXIST,
                      "hf: %s holds %s, which an export does not write: export into a new or "
                      "empty directory, or one holding an earlier export (replaced whole)",
                      dir, other);
  return 0;
}

int tz_hf_export(const char *dir, const struct tz_model_config *cfg,
                 const struct tz_hf_export_opts *opts,
                 int (*get_block)(void *arg, int block, float *buf), void *arg) {
  int rc0 = 0;
  struct tz_hf_export_opts o;
  if (opts)
    o = *opts;
  else
    tz_hf_export_opts_init(&o);
  TZ_CHECK(tz_model_config_check(cfg));
  if (o.dtype != TZ_F32 && o.dtype != TZ_BF16 && o.dtype != TZ_F16)
    return tz_err_set(TZ_EINVAL, "hf: export dtype %d is none of f32, bf16, f16", (int)o.dtype);
  if (!o.shard_bytes)
    return tz_err_set(TZ_EINVAL, "hf: the shard size must be positive");
  /* Written whole into a temporary directory beside dir, then swapped into place: a killed export
   * leaves the earlier one as it was, never shards of both (issue 48). dir may hold an earlier
   * export only (it is replaced whole). */
  TZ_CHECK(tz_hf_export_check_dir(dir));
  char *tmp = NULL;
  size_t dl = strlen(dir);
  while (dl > 1 && dir[dl - 1] == '/') /* "out/": the sibling is out.tmp-export, not inside */
    dl--;
  if (asprintf(&tmp, "%.*s.tmp-export", (int)dl, dir) < 0)
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  TZ_CHECK_GOTO(remove_export_dir(tmp), rc0, out0); /* one a killed export left */
  if (mkdir(tmp, 0777) != 0) {
    rc0 = tz_err_errno(errno, "hf: cannot create %s", tmp);
    goto out0;
  }
  rc0 = export_into(tmp, cfg, &o, get_block, arg);
  if (rc0 == 0 && (rc0 = tz_file_fsync_dir(NULL, tmp)))
    rc0 = tz_err_errno(rc0, "hf: cannot fsync %s", tmp);
  if (rc0 == 0) {
    struct stat st;
    int e = stat(dir, &st) == 0 ? tz_file_exchange(NULL, tmp, dir) : tz_file_rename(NULL, tmp, dir);
    if (e)
      rc0 = tz_err_errno(e, "hf: cannot move %s into place as %s", tmp, dir);
  }
  if (rc0 == 0) {
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash)
      *slash = 0;
    int e = tz_file_fsync_dir(NULL, slash ? (*parent ? parent : "/") : ".");
    if (e)
      rc0 = tz_err_errno(e, "hf: cannot fsync the directory of %s", dir);
  }
  /* the earlier export, now under the temporary name (or the failed new one) */
  int rc1 = remove_export_dir(tmp);
  if (rc0 == 0)
    rc0 = rc1;
out0:
  free(tmp);
  return rc0;
}

/* The export's files into dir, which exists and is empty. */
static int export_into(const char *dir, const struct tz_model_config *cfg,
                       const struct tz_hf_export_opts *op,
                       int (*get_block)(void *arg, int block, float *buf), void *arg) {
  struct tz_hf_export_opts o = *op;
  int nb = tz_model_n_blocks(cfg), n = 0, rc = 0;
  struct shard_sum *sums = NULL;
  struct out_tensor *t =
      calloc((size_t)nb * TZ_L_COUNT * (size_t)(tz_model_moe(cfg) ? cfg->n_expert : 1), sizeof *t);
  if (!t)
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  for (int b = 0; b < nb && !rc; b++) {
    struct tz_block_layout l;
    TZ_CHECK_GOTO(tz_model_block_layout(cfg, b, &l), rc, out);
    for (int i = 0; i < l.n; i++) {
      if (!l.t[i].numel)
        continue;
      struct tz_hf_fused fu;
      if (l.kind == TZ_BLOCK_LAYER && tz_hf_fused_part(cfg, i, &fu)) {
        /* one tensor of fu.rows rows: its first part opens it, the others join it */
        struct out_tensor *x = fu.part == 0 ? &t[n++] : &t[n - 1];
        if (fu.part == 0) {
          TZ_CHECK_GOTO(tz_hf_tensor_name(cfg, b, i, x->name, sizeof x->name), rc, out);
          x->e = (struct tz_st_entry){.name = x->name, .dtype = o.dtype, .ndim = 2};
          x->e.shape[0] = fu.rows;
          x->e.shape[1] = l.t[i].shape[1];
          x->block = b;
          x->numel = (uint64_t)fu.rows * (uint64_t)l.t[i].shape[1];
          x->bytes = x->numel * tz_dtype_size(o.dtype);
        }
        x->part_offset[x->n_parts] = l.t[i].offset;
        x->part_numel[x->n_parts++] = l.t[i].numel;
        continue;
      }
      int pieces = tz_hf_pieces(cfg, b, i); /* each expert's projection a tensor */
      for (int pc = 0; pc < pieces; pc++) {
        struct out_tensor *x = &t[n++];
        TZ_CHECK_GOTO(tz_hf_piece_name(cfg, b, i, pc, x->name, sizeof x->name), rc, out);
        x->e = (struct tz_st_entry){.name = x->name, .dtype = o.dtype, .ndim = l.t[i].ndim};
        x->e.shape[0] = l.t[i].shape[0] / pieces;
        x->e.shape[1] = l.t[i].shape[1];
        x->block = b;
        x->numel = l.t[i].numel / (uint64_t)pieces;
        x->offset = l.t[i].offset + (uint64_t)pc * x->numel;
        x->bytes = x->numel * tz_dtype_size(o.dtype);
      }
    }
  }
  /* What the source config says beyond cfg, when the tokenizer comes from a model of the family. */
  struct tz_hf_info info, *src = NULL;
  struct tz_model_config sc;
  if (o.tokenizer_dir) {
    char *p = tz_hf_join(o.tokenizer_dir, "config.json");
    if (p && access(p, F_OK) == 0 && tz_hf_config_read_info(p, &sc, NULL, &info) == 0 &&
        sc.family == cfg->family)
      src = &info;
    free(p);
  }
  int shards = assign_shards(t, n, o.shard_bytes);
  sums = calloc((size_t)shards, sizeof *sums);
  if (!sums) {
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
    goto out;
  }
  TZ_CHECK_GOTO(shards_write(dir, cfg, t, n, shards, sums, get_block, arg), rc, out);
  /* The index last among the weights: it names only files already in place. */
  if (shards > 1)
    TZ_CHECK_GOTO(index_write(dir, t, n, shards, sums), rc, out);
  TZ_CHECK_GOTO(tz_hf_config_write_info(dir, cfg, o.dtype, src), rc, out);
  TZ_CHECK_GOTO(tz_hf_generation_write(dir, cfg, src, o.tokenizer_dir), rc, out);
  if (o.tokenizer_dir)
    TZ_CHECK_GOTO(tz_hf_copy_tokenizer(dir, o.tokenizer_dir), rc, out);
out:
  free(sums);
  free(t);
  return rc;
}

struct compute_src {
  tz_compute *cm;
  const struct tz_model_config *cfg;
  void *const *blocks;
};

static int get_compute_block(void *arg, int b, float *buf) {
  struct compute_src *s = arg;
  return tz_model_block_download(s->cm, buf, s->blocks[b], tz_model_block_numel(s->cfg, b));
}

int tz_hf_export_compute(const char *dir, const struct tz_model_config *cfg,
                         const struct tz_hf_export_opts *o, tz_compute *cm, void *const *blocks) {
  struct compute_src s = {.cm = cm, .cfg = cfg, .blocks = blocks};
  return tz_hf_export(dir, cfg, o, get_compute_block, &s);
}
