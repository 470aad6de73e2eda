/* Hugging Face Llama import and export (hf.h). */
#define _GNU_SOURCE
#include "trainer/hf.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "trainer/safetensors.h"
#include "util/file.h"

int tz_hf_tensor_name(const struct tz_model_config *cfg, int block, int tensor, char *buf,
                      size_t len) {
  static const char *const layer_names[TZ_L_COUNT] = {
      [TZ_L_ATTN_NORM] = "input_layernorm", [TZ_L_WQ] = "self_attn.q_proj",
      [TZ_L_WK] = "self_attn.k_proj",       [TZ_L_WV] = "self_attn.v_proj",
      [TZ_L_WO] = "self_attn.o_proj",       [TZ_L_MLP_NORM] = "post_attention_layernorm",
      [TZ_L_WG] = "mlp.gate_proj",          [TZ_L_WU] = "mlp.up_proj",
      [TZ_L_WD] = "mlp.down_proj"};
  int nb = tz_model_n_blocks(cfg), n;
  if (block == 0 && tensor == TZ_E_WTE)
    n = snprintf(buf, len, "model.embed_tokens.weight");
  else if (block == nb - 1 && tensor == TZ_H_NORM)
    n = snprintf(buf, len, "model.norm.weight");
  else if (block == nb - 1 && tensor == TZ_H_LM && !cfg->tie_embeddings)
    n = snprintf(buf, len, "lm_head.weight");
  else if (block > 0 && block < nb - 1 && tensor >= 0 && tensor < TZ_L_COUNT)
    n = snprintf(buf, len, "model.layers.%d.%s.weight", block - 1, layer_names[tensor]);
  else
    return tz_err_set(TZ_EINVAL, "hf: no tensor %d in block %d", tensor, block);
  if (n < 0 || (size_t)n >= len)
    return tz_err_set(TZ_EINVAL, "hf: name buffer of %zu bytes too short", len);
  return 0;
}

/* ---- config.json ---- */

static int get_int(json_t *root, const char *path, const char *key, int required, int dflt,
                   int *out) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) {
    if (required)
      return tz_err_set(TZ_ECONFIG, "%s: missing \"%s\"", path, key);
    *out = dflt;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" must be a non-negative integer", path, key);
  *out = (int)json_integer_value(v);
  return 0;
}

static int get_num(json_t *root, const char *path, const char *key, double dflt, double *out) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) {
    *out = dflt;
    return 0;
  }
  if (!json_is_number(v))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" must be a number", path, key);
  *out = json_number_value(v);
  return 0;
}

static char *join(const char *dir, const char *name) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", dir, name) < 0)
    return NULL;
  return p;
}

static int parse_config(json_t *root, const char *path, struct tz_model_config *cfg,
                        enum tz_dtype *dtype) {
  if (!json_is_object(root))
    return tz_err_set(TZ_ECONFIG, "%s: not a JSON object", path);
  json_t *mt = json_object_get(root, "model_type");
  if (mt && (!json_is_string(mt) || strcmp(json_string_value(mt), "llama") != 0))
    return tz_err_set(TZ_ENOTSUP, "%s: model_type \"%s\" is not \"llama\"", path,
                      json_is_string(mt) ? json_string_value(mt) : "?");
  json_t *act = json_object_get(root, "hidden_act");
  if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
    return tz_err_set(TZ_ENOTSUP, "%s: hidden_act must be \"silu\"", path);
  /* Plain RoPE only. Newer transformers write {"rope_type": "default", "rope_theta": ...} under
   * rope_parameters (or rope_scaling) instead of a top-level rope_theta. */
  double theta_nested = 0;
  const char *rope_keys[] = {"rope_scaling", "rope_parameters"};
  for (int i = 0; i < 2; i++) {
    json_t *rs = json_object_get(root, rope_keys[i]);
    if (!rs || json_is_null(rs))
      continue;
    json_t *type = json_object_get(rs, "rope_type");
    if (!type)
      type = json_object_get(rs, "type");
    if (!json_is_object(rs) || !json_is_string(type) ||
        strcmp(json_string_value(type), "default") != 0)
      return tz_err_set(TZ_ENOTSUP,
                        "%s: %s other than plain RoPE (rope_type \"default\") is "
                        "not supported",
                        path, rope_keys[i]);
    json_t *th = json_object_get(rs, "rope_theta");
    if (th && !json_is_number(th))
      return tz_err_set(TZ_ECONFIG, "%s: %s.rope_theta must be a number", path, rope_keys[i]);
    if (th)
      theta_nested = json_number_value(th);
  }
  const char *bias_keys[] = {"attention_bias", "mlp_bias"};
  for (int i = 0; i < 2; i++) {
    json_t *b = json_object_get(root, bias_keys[i]);
    if (b && !json_is_false(b))
      return tz_err_set(TZ_ENOTSUP, "%s: %s must be false (the model has no biases)", path,
                        bias_keys[i]);
  }
  memset(cfg, 0, sizeof *cfg);
  TZ_CHECK(get_int(root, path, "hidden_size", 1, 0, &cfg->d_model));
  TZ_CHECK(get_int(root, path, "num_hidden_layers", 1, 0, &cfg->n_layer));
  TZ_CHECK(get_int(root, path, "num_attention_heads", 1, 0, &cfg->n_head));
  TZ_CHECK(get_int(root, path, "num_key_value_heads", 0, cfg->n_head, &cfg->n_kv_head));
  TZ_CHECK(get_int(root, path, "intermediate_size", 1, 0, &cfg->ffn_dim));
  TZ_CHECK(get_int(root, path, "vocab_size", 1, 0, &cfg->vocab));
  TZ_CHECK(get_int(root, path, "max_position_embeddings", 0, 2048, &cfg->max_seq));
  TZ_CHECK(get_num(root, path, "rope_theta", theta_nested > 0 ? theta_nested : 10000.0,
                   &cfg->rope_theta));
  TZ_CHECK(get_num(root, path, "rms_norm_eps", 1e-6, &cfg->norm_eps));
  json_t *tie = json_object_get(root, "tie_word_embeddings");
  if (tie && !json_is_boolean(tie))
    return tz_err_set(TZ_ECONFIG, "%s: \"tie_word_embeddings\" must be true or false", path);
  cfg->tie_embeddings = tie ? json_is_true(tie) : 0; /* LlamaConfig's default is false */
  int head_dim = 0;
  TZ_CHECK(get_int(root, path, "head_dim", 0, 0, &head_dim));
  if (head_dim && cfg->n_head && head_dim * cfg->n_head != cfg->d_model)
    return tz_err_set(TZ_ENOTSUP, "%s: head_dim %d is not hidden_size / num_attention_heads", path,
                      head_dim);
  if (dtype) {
    *dtype = TZ_F32;
    json_t *dt = json_object_get(root, "torch_dtype");
    if (!dt)
      dt = json_object_get(root, "dtype");
    if (dt && json_is_string(dt) && tz_dtype_parse(json_string_value(dt), dtype) < 0)
      return tz_err_set(TZ_ECONFIG, "%s: torch_dtype \"%s\" is not float32, bfloat16 or float16",
                        path, json_string_value(dt));
  }
  int rc = tz_model_config_check(cfg);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(rc, "%s: %s", path, why);
  }
  return 0;
}

int tz_hf_config_read(const char *dir, struct tz_model_config *cfg, enum tz_dtype *dtype) {
  char *path = join(dir, "config.json");
  if (!path)
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  json_error_t jerr;
  json_t *root = json_load_file(path, 0, &jerr);
  int rc;
  if (!root) {
    rc = access(path, R_OK) != 0 ? tz_err_errno(errno, "hf: cannot read %s", path)
                                 : tz_err_set(TZ_ECONFIG, "%s: line %d column %d: %s", path,
                                              jerr.line, jerr.column, jerr.text);
  } else {
    rc = parse_config(root, path, cfg, dtype);
  }
  json_decref(root);
  free(path);
  return rc;
}

static int write_file_atomic(const char *path, const char *text) {
  return tz_atomic_write_file(path, text, strlen(text), &(struct tz_atomic_params){.what = "hf"});
}

int tz_hf_config_write(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype) {
  TZ_CHECK(tz_model_config_check(cfg));
  json_t *r = json_object(), *arch = json_array();
  json_array_append_new(arch, json_string("LlamaForCausalLM"));
  json_object_set_new(r, "architectures", arch);
  json_object_set_new(r, "model_type", json_string("llama"));
  json_object_set_new(r, "hidden_size", json_integer(cfg->d_model));
  json_object_set_new(r, "intermediate_size", json_integer(cfg->ffn_dim));
  json_object_set_new(r, "num_hidden_layers", json_integer(cfg->n_layer));
  json_object_set_new(r, "num_attention_heads", json_integer(cfg->n_head));
  json_object_set_new(r, "num_key_value_heads", json_integer(cfg->n_kv_head));
  json_object_set_new(r, "head_dim", json_integer(tz_model_head_dim(cfg)));
  json_object_set_new(r, "vocab_size", json_integer(cfg->vocab));
  json_object_set_new(r, "max_position_embeddings", json_integer(cfg->max_seq));
  json_object_set_new(r, "rope_theta", json_real(cfg->rope_theta));
  json_object_set_new(r, "rope_scaling", json_null());
  json_object_set_new(r, "rms_norm_eps", json_real(cfg->norm_eps));
  json_object_set_new(r, "tie_word_embeddings", json_boolean(cfg->tie_embeddings));
  json_object_set_new(r, "hidden_act", json_string("silu"));
  json_object_set_new(r, "attention_bias", json_false());
  json_object_set_new(r, "mlp_bias", json_false());
  json_object_set_new(r, "attention_dropout", json_real(0.0));
  json_object_set_new(r, "initializer_range", json_real(0.02));
  json_object_set_new(r, "pretraining_tp", json_integer(1));
  json_object_set_new(r, "use_cache", json_true());
  json_object_set_new(r, "torch_dtype",
                      json_string(dtype == TZ_BF16  ? "bfloat16"
                                  : dtype == TZ_F16 ? "float16"
                                                    : "float32"));
  char *text = json_dumps(r, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
  json_decref(r);
  char *path = join(dir, "config.json"), *line = NULL;
  int rc;
  if (text && path && (line = malloc(strlen(text) + 2)))
    sprintf(line, "%s\n", text);
  if (!line)
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
  else
    rc = write_file_atomic(path, line);
  free(line);
  free(text);
  free(path);
  return rc;
}

/* ---- reading ---- */

struct tz_hf_model {
  char *dir;
  struct tz_model_config cfg;
  json_t *weight_map; /* name -> shard file name, or NULL for one model.safetensors */
  int n_files;
  char **names;       /* file names (within dir) */
  tz_st_file **files; /* opened on first use */
};

void tz_hf_close(tz_hf_model *m) {
  if (!m)
    return;
  for (int i = 0; i < m->n_files; i++) {
    tz_st_close(m->files[i]);
    free(m->names[i]);
  }
  free(m->files);
  free(m->names);
  json_decref(m->weight_map);
  free(m->dir);
  free(m);
}

static int add_file(tz_hf_model *m, const char *name) {
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
  if (strchr(name, '/') || !(m->names[m->n_files] = strdup(name)))
    return tz_err_set(TZ_EFORMAT, "hf: bad shard file name '%s'", name);
  m->files[m->n_files] = NULL;
  return m->n_files++;
}

int tz_hf_open(const char *dir, tz_hf_model **out) {
  *out = NULL;
  tz_hf_model *m = calloc(1, sizeof *m);
  if (!m || !(m->dir = strdup(dir))) {
    free(m);
    return tz_err_set(TZ_ENOMEM, "hf: out of memory");
  }
  int rc;
  TZ_CHECK_GOTO(tz_hf_config_read(dir, &m->cfg, NULL), rc, fail);
  char *single = join(dir, "model.safetensors"), *index = join(dir, "model.safetensors.index.json");
  if (!single || !index) {
    free(single);
    free(index);
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
    goto fail;
  }
  if (access(single, R_OK) == 0) {
    rc = add_file(m, "model.safetensors");
  } else if (access(index, R_OK) == 0) {
    json_error_t jerr;
    json_t *root = json_load_file(index, 0, &jerr);
    json_t *wm = root ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
      rc = tz_err_set(TZ_EFORMAT, "%s: %s", index, root ? "no \"weight_map\" object" : jerr.text);
    } else {
      m->weight_map = json_incref(wm);
      rc = 0;
      const char *k;
      json_t *v;
      json_object_foreach(wm, k, v) {
        if (!json_is_string(v)) {
          rc = tz_err_set(TZ_EFORMAT, "%s: weight_map[\"%s\"] is not a file name", index, k);
          break;
        }
        if ((rc = add_file(m, json_string_value(v))) < 0)
          break;
      }
      rc = rc < 0 ? rc : 0;
    }
    json_decref(root);
  } else {
    rc = tz_err_set(TZ_ENOENT,
                    "hf: %s has neither model.safetensors nor "
                    "model.safetensors.index.json",
                    dir);
  }
  free(single);
  free(index);
  if (rc < 0)
    goto fail;
  *out = m;
  return 0;
fail:
  tz_hf_close(m);
  return rc;
}

const struct tz_model_config *tz_hf_config(const tz_hf_model *m) { return &m->cfg; }

static int file_for(tz_hf_model *m, const char *name, tz_st_file **f) {
  int i = 0;
  if (m->weight_map) {
    json_t *v = json_object_get(m->weight_map, name);
    if (!v)
      return tz_err_set(TZ_ENOENT, "hf: %s: tensor '%s' is not in the weight map", m->dir, name);
    i = add_file(m, json_string_value(v));
    if (i < 0)
      return i;
  }
  if (!m->files[i]) {
    char *path = join(m->dir, m->names[i]);
    if (!path)
      return tz_err_set(TZ_ENOMEM, "hf: out of memory");
    int rc = tz_st_open(path, &m->files[i]);
    free(path);
    TZ_CHECK(rc);
  }
  *f = m->files[i];
  return 0;
}

/* The index of the first element of t (n floats) that is not finite, or -1. */
static int64_t first_nonfinite(const float *t, uint64_t n) {
  for (uint64_t i = 0; i < n; i++)
    if (!isfinite(t[i]))
      return (int64_t)i;
  return -1;
}

/* The refusal of tensor `name` of file f, whose element at holds v (not finite): training from it
 * would give non-finite losses from the first step. */
static int nonfinite_weight(const tz_hf_model *m, const tz_st_file *f, const char *name, int64_t at,
                            float v) {
  const char *file = m->names[0];
  for (int i = 0; i < m->n_files; i++)
    if (m->files[i] == f)
      file = m->names[i];
  return tz_err_set(TZ_EFORMAT,
                    "%s/%s: tensor '%s' element %lld is %s: weights must be finite (is it the "
                    "checkpoint of a run that diverged?)",
                    m->dir, file, name, (long long)at,
                    isnan(v) ? "nan"
                    : v > 0  ? "inf"
                             : "-inf");
}

int tz_hf_read_block(tz_hf_model *m, int block, float *out) {
  struct tz_block_layout l;
  TZ_CHECK(tz_model_block_layout(&m->cfg, block, &l));
  memset(out, 0, sizeof(float) * l.numel);
  for (int i = 0; i < l.n; i++) {
    if (l.t[i].numel == 0)
      continue; /* a tensor this config does not have */
    char name[128];
    TZ_CHECK(tz_hf_tensor_name(&m->cfg, block, i, name, sizeof name));
    tz_st_file *f = NULL;
    TZ_CHECK(file_for(m, name, &f));
    float *t = out + l.t[i].offset;
    TZ_CHECK(tz_st_read_f32(f, name, l.t[i].ndim, l.t[i].shape, t));
    int64_t at = first_nonfinite(t, l.t[i].numel);
    if (at >= 0)
      return nonfinite_weight(m, f, name, at, t[at]);
  }
  return 0;
}

int tz_hf_load(tz_hf_model *m, tz_compute *cm, void *const *blocks) {
  int rc = 0;
  for (int b = 0; b < tz_model_n_blocks(&m->cfg) && !rc; b++) {
    uint64_t n = tz_model_block_numel(&m->cfg, b);
    float *buf = malloc(sizeof(float) * n);
    if (!buf)
      return tz_err_set(TZ_ENOMEM, "hf: cannot allocate block %d (%llu floats)", b,
                        (unsigned long long)n);
    rc = tz_hf_read_block(m, b, buf);
    if (!rc)
      rc = tz_model_block_upload(cm, blocks[b], buf, n);
    free(buf);
  }
  return rc;
}

/* ---- writing ---- */

int tz_hf_export(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype,
                 int (*get_block)(void *arg, int block, float *buf), void *arg) {
  TZ_CHECK(tz_model_config_check(cfg));
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return tz_err_errno(errno, "hf: cannot create %s", dir);
  int nb = tz_model_n_blocks(cfg), nt = 0;
  struct tz_st_entry *e = calloc((size_t)nb * TZ_L_COUNT, sizeof *e);
  char(*names)[128] = calloc((size_t)nb * TZ_L_COUNT, sizeof *names);
  uint64_t maxn = 0;
  int rc = 0;
  if (!e || !names) {
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
    goto out;
  }
  for (int b = 0; b < nb; b++) {
    struct tz_block_layout l;
    TZ_CHECK_GOTO(tz_model_block_layout(cfg, b, &l), rc, out);
    maxn = l.numel > maxn ? l.numel : maxn;
    for (int i = 0; i < l.n; i++) {
      if (l.t[i].numel == 0)
        continue;
      TZ_CHECK_GOTO(tz_hf_tensor_name(cfg, b, i, names[nt], sizeof names[nt]), rc, out);
      e[nt].name = names[nt];
      e[nt].dtype = dtype;
      e[nt].ndim = l.t[i].ndim;
      e[nt].shape[0] = l.t[i].shape[0];
      e[nt].shape[1] = l.t[i].shape[1];
      nt++;
    }
  }
  char *path = join(dir, "model.safetensors");
  if (!path) {
    rc = tz_err_set(TZ_ENOMEM, "hf: out of memory");
    goto out;
  }
  static const char *const meta[] = {"format", "pt", NULL};
  tz_st_writer *w = NULL;
  rc = tz_st_writer_open(path, e, nt, meta, &w);
  free(path);
  if (rc < 0)
    goto out;
  float *buf = malloc(sizeof(float) * maxn);
  if (!buf)
    rc = tz_err_set(TZ_ENOMEM, "hf: cannot allocate %llu floats", (unsigned long long)maxn);
  for (int b = 0; b < nb && !rc; b++) {
    struct tz_block_layout l;
    tz_model_block_layout(cfg, b, &l);
    rc = get_block(arg, b, buf);
    for (int i = 0; i < l.n && !rc; i++)
      if (l.t[i].numel)
        rc = tz_st_writer_put(w, buf + l.t[i].offset, l.t[i].numel);
  }
  free(buf);
  int crc = tz_st_writer_close(w, rc == 0);
  rc = rc ? rc : crc;
  if (!rc)
    rc = tz_hf_config_write(dir, cfg, dtype);
out:
  free(e);
  free(names);
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

int tz_hf_export_compute(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dtype,
                         tz_compute *cm, void *const *blocks) {
  struct compute_src s = {.cm = cm, .cfg = cfg, .blocks = blocks};
  return tz_hf_export(dir, cfg, dtype, get_compute_block, &s);
}
