/* Hugging Face checkpoints of every family (llama with llama3 RoPE and a tied head, mistral with
 * an independent head_dim, qwen2 with q/k/v biases, qwen3 with q/k norms): a config.json and
 * safetensors written here by hand from the family's definition (names and shapes not taken from
 * our layout) are imported equal, exported as save_pretrained does (keys of the family, token
 * ids, generation_config.json, tokenizer files, shards and index) and imported again equal; and
 * every bad config or checkpoint is refused naming the file, the key or tensor and the value. */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/compute.h"
#include "testlib.h"
#include "trainer/model/hf.h"
#include "trainer/model/model.h"
#include "trainer/model/safetensors.h"

static char *path_in(const char *dir, const char *name) {
  char *p;
  assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
  return p;
}

static void write_text(const char *dir, const char *name, const char *text) {
  char *p = path_in(dir, name);
  FILE *fp = fopen(p, "w");
  assert_non_null(fp);
  fputs(text, fp);
  fclose(fp);
  free(p);
}

static char *read_text(const char *dir, const char *name) {
  char *p = path_in(dir, name);
  FILE *fp = fopen(p, "rb");
  free(p);
  if (!fp)
    return NULL;
  char *buf = calloc(1, 1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, fp);
  buf[n] = 0;
  fclose(fp);
  return buf;
}

static int exists(const char *dir, const char *name) {
  char *p = path_in(dir, name);
  struct stat sb;
  int r = stat(p, &sb) == 0;
  free(p);
  return r;
}

/* ---- the families' checkpoints, by hand ---- */

struct fam {
  const char *name;
  const char *config; /* config.json as the hub has it */
  int C, L, H, KV, D, F, V, tie, qkv_bias, qk_norm;
};

static const struct fam fams[] = {
    {"llama",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 32,"
     " \"intermediate_size\": 48, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
     " \"num_key_value_heads\": 2, \"head_dim\": 8, \"vocab_size\": 50, \"hidden_act\": \"silu\","
     " \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0,"
     " \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0,"
     " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
     " \"attention_bias\": false, \"mlp_bias\": false, \"tie_word_embeddings\": true,"
     " \"initializer_range\": 0.02, \"bos_token_id\": 40, \"eos_token_id\": [41, 42, 43],"
     " \"torch_dtype\": \"bfloat16\", \"pretraining_tp\": 1, \"use_cache\": true}",
     32, 2, 4, 2, 8, 48, 50, 1, 0, 0},
    {"mistral",
     "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", \"hidden_size\":"
     " 32, \"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
     " \"num_key_value_heads\": 1, \"head_dim\": 12, \"vocab_size\": 45, \"hidden_act\": \"silu\","
     " \"max_position_embeddings\": 1024000, \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0,"
     " \"sliding_window\": null, \"tie_word_embeddings\": false, \"bos_token_id\": 1,"
     " \"eos_token_id\": 2, \"torch_dtype\": \"bfloat16\"}",
     32, 2, 4, 1, 12, 40, 45, 0, 0, 0},
    {"qwen2",
     "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": 32,"
     " \"intermediate_size\": 56, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
     " \"num_key_value_heads\": 2, \"vocab_size\": 60, \"hidden_act\": \"silu\","
     " \"max_position_embeddings\": 32768, \"max_window_layers\": 21, \"rms_norm_eps\": 1e-06,"
     " \"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"use_sliding_window\": false,"
     " \"tie_word_embeddings\": true, \"bos_token_id\": 50, \"eos_token_id\": 51,"
     " \"torch_dtype\": \"bfloat16\", \"use_cache\": true}",
     32, 3, 4, 2, 8, 56, 60, 1, 1, 0},
    {"qwen3",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"hidden_size\": 32,"
     " \"intermediate_size\": 48, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
     " \"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 64, \"hidden_act\": \"silu\","
     " \"max_position_embeddings\": 40960, \"rms_norm_eps\": 1e-06, \"attention_bias\": false,"
     " \"attention_dropout\": 0.0, \"max_window_layers\": 28, \"sliding_window\": null,"
     " \"use_sliding_window\": false, \"tie_word_embeddings\": false, \"bos_token_id\": 60,"
     " \"eos_token_id\": 61, \"pad_token_id\": 62, \"dtype\": \"bfloat16\","
     " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0},"
     " \"layer_types\": [\"full_attention\", \"full_attention\"]}",
     32, 2, 4, 2, 16, 48, 64, 0, 0, 1},
};
#define N_FAMS ((int)(sizeof fams / sizeof fams[0]))

struct hf_tensor {
  char name[96];
  int ndim;
  int64_t shape[2];
};

/* The family's tensors, from its modeling code: names, shapes, state_dict order. */
static int hf_tensors(const struct fam *f, struct hf_tensor *t) {
  int n = 0;
#define T(nd, r, c, ...)                                                                           \
  do {                                                                                             \
    snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__);                                            \
    t[n].ndim = nd;                                                                                \
    t[n].shape[0] = r;                                                                             \
    t[n].shape[1] = c;                                                                             \
    n++;                                                                                           \
  } while (0)
  T(2, f->V, f->C, "model.embed_tokens.weight");
  for (int l = 0; l < f->L; l++) {
    T(1, f->C, 0, "model.layers.%d.input_layernorm.weight", l);
    T(2, f->H * f->D, f->C, "model.layers.%d.self_attn.q_proj.weight", l);
    if (f->qkv_bias)
      T(1, f->H * f->D, 0, "model.layers.%d.self_attn.q_proj.bias", l);
    T(2, f->KV * f->D, f->C, "model.layers.%d.self_attn.k_proj.weight", l);
    if (f->qkv_bias)
      T(1, f->KV * f->D, 0, "model.layers.%d.self_attn.k_proj.bias", l);
    T(2, f->KV * f->D, f->C, "model.layers.%d.self_attn.v_proj.weight", l);
    if (f->qkv_bias)
      T(1, f->KV * f->D, 0, "model.layers.%d.self_attn.v_proj.bias", l);
    T(2, f->C, f->H * f->D, "model.layers.%d.self_attn.o_proj.weight", l);
    if (f->qk_norm) {
      T(1, f->D, 0, "model.layers.%d.self_attn.q_norm.weight", l);
      T(1, f->D, 0, "model.layers.%d.self_attn.k_norm.weight", l);
    }
    T(1, f->C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
    T(2, f->F, f->C, "model.layers.%d.mlp.gate_proj.weight", l);
    T(2, f->F, f->C, "model.layers.%d.mlp.up_proj.weight", l);
    T(2, f->C, f->F, "model.layers.%d.mlp.down_proj.weight", l);
  }
  T(1, f->C, 0, "model.norm.weight");
  if (!f->tie)
    T(2, f->V, f->C, "lm_head.weight");
#undef T
  return n;
}

static uint64_t numel_of(const struct hf_tensor *t) {
  return (uint64_t)t->shape[0] * (t->ndim == 2 ? (uint64_t)t->shape[1] : 1);
}

/* Element e of tensor `name`: a multiple of 1/64 in [-2, 2), exact in bf16 and f16. */
static float value(const char *name, uint64_t e) {
  uint64_t h = 1469598103934665603ull;
  for (const char *p = name; *p; p++)
    h = (h ^ (uint8_t)*p) * 1099511628211ull;
  uint64_t s = h ^ (e * 0x9e3779b97f4a7c15ull);
  return (float)((int)(tz_test_rand(&s) % 256) - 128) / 64.0f;
}

/* Writes the tensors t[0..n) into `shards` files (and an index when more than one) of dtype dt. */
static void write_weights(const char *dir, const struct hf_tensor *t, int n, enum tz_dtype dt,
                          int shards) {
  json_t *wm = json_object();
  for (int s = 0; s < shards; s++) {
    int lo = n * s / shards, hi = n * (s + 1) / shards;
    struct tz_st_entry *e = calloc((size_t)(hi - lo), sizeof *e);
    for (int i = lo; i < hi; i++)
      e[i - lo] = (struct tz_st_entry){.name = t[i].name,
                                       .dtype = dt,
                                       .ndim = t[i].ndim,
                                       .shape = {t[i].shape[0], t[i].shape[1]}};
    char file[64];
    if (shards == 1)
      snprintf(file, sizeof file, "model.safetensors");
    else
      snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, shards);
    char *p = path_in(dir, file);
    tz_st_writer *w;
    TZ_ASSERT_OK(tz_st_writer_open(p, e, hi - lo, NULL, &w));
    for (int i = lo; i < hi; i++) {
      uint64_t k = numel_of(&t[i]);
      float *v = malloc(sizeof(float) * k);
      for (uint64_t j = 0; j < k; j++)
        v[j] = value(t[i].name, j);
      TZ_ASSERT_OK(tz_st_writer_put(w, v, k));
      free(v);
      json_object_set_new(wm, t[i].name, json_string(file));
    }
    TZ_ASSERT_OK(tz_st_writer_close(w, 1));
    free(p);
    free(e);
  }
  if (shards > 1) {
    json_t *idx = json_pack("{s:{s:i},s:o}", "metadata", "total_size", 0, "weight_map", wm);
    char *ip = path_in(dir, "model.safetensors.index.json");
    assert_int_equal(json_dump_file(idx, ip, 0), 0);
    json_decref(idx);
    free(ip);
  } else {
    json_decref(wm);
  }
}

/* Every block read from m equals the values by name; every tensor of the family is a tensor of
 * our layout. */
static void check_blocks(tz_hf_model *m, const struct fam *f) {
  const struct tz_model_config *cfg = tz_hf_config(m);
  struct hf_tensor want[128];
  int n = hf_tensors(f, want), seen = 0;
  for (int b = 0; b < tz_model_n_blocks(cfg); b++) {
    struct tz_block_layout l;
    TZ_ASSERT_OK(tz_model_block_layout(cfg, b, &l));
    float *got = malloc(sizeof(float) * l.numel);
    TZ_ASSERT_OK(tz_hf_read_block(m, b, got));
    for (int i = 0; i < l.n; i++) {
      if (!l.t[i].numel)
        continue;
      char name[128];
      TZ_ASSERT_OK(tz_hf_tensor_name(cfg, b, i, name, sizeof name));
      int k = 0;
      while (k < n && strcmp(want[k].name, name))
        k++;
      if (k == n)
        fail_msg("%s: our tensor %s is not one of the family's", f->name, name);
      assert_int_equal(l.t[i].numel, numel_of(&want[k]));
      for (uint64_t e = 0; e < l.t[i].numel; e++)
        if (got[l.t[i].offset + e] != value(name, e))
          fail_msg("%s: %s element %llu is %g, want %g", f->name, name, (unsigned long long)e,
                   (double)got[l.t[i].offset + e], (double)value(name, e));
      seen++;
    }
    free(got);
  }
  assert_int_equal(seen, n);
}

static int get_from(void *arg, int b, float *buf) { return tz_hf_read_block(arg, b, buf); }

static json_t *load_json(const char *dir, const char *name) {
  char *p = path_in(dir, name);
  json_error_t jerr;
  json_t *r = json_load_file(p, 0, &jerr);
  if (!r)
    fail_msg("%s: %s", p, jerr.text);
  free(p);
  return r;
}

static json_int_t jint(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  if (!json_is_integer(v))
    fail_msg("key %s is not an integer", k);
  return json_integer_value(v);
}

static void test_family(const struct fam *f) {
  char *src = tz_test_mkdtemp("hf-src"), *out = tz_test_mkdtemp("hf-out");
  write_text(src, "config.json", f->config);
  write_text(src, "tokenizer.json", "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n");
  write_text(src, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}\n");
  write_text(src, "generation_config.json", "{\"temperature\": 0.6, \"top_p\": 0.9}\n");
  struct hf_tensor t[128];
  int n = hf_tensors(f, t);
  int fi = (int)(f - fams);
  /* bf16 in one file, f16 and f32 sharded, as the hub has them */
  write_weights(src, t, n, fi == 0 ? TZ_BF16 : fi == 1 ? TZ_F16 : TZ_F32, fi < 2 ? 1 : 3);

  tz_hf_model *m;
  TZ_ASSERT_OK(tz_hf_open(src, &m));
  const struct tz_model_config *c = tz_hf_config(m);
  assert_string_equal(tz_model_family_name(c->family), f->name);
  assert_int_equal(tz_model_head_dim(c), f->D);
  assert_int_equal(c->head_dim, f->C / f->H == f->D ? 0 : f->D);
  assert_int_equal(c->n_kv_head, f->KV);
  assert_int_equal(c->tie_embeddings, f->tie);
  assert_int_equal(c->qkv_bias, f->qkv_bias);
  assert_int_equal(c->qk_norm, f->qk_norm);
  assert_int_equal(c->has_bos, 1);
  assert_int_equal(c->has_eos, 1);
  assert_true(c->init_std == 0.02);
  check_blocks(m, f);
  if (fi == 0) {
    assert_int_equal(c->rope_type, TZ_ROPE_LLAMA3);
    assert_true(c->rope_factor == 32.0 && c->rope_low_freq_factor == 1.0 &&
                c->rope_high_freq_factor == 4.0 && c->rope_original_max_pos == 8192);
    assert_true(c->rope_theta == 500000.0 && c->norm_eps == 1e-5);
    assert_int_equal(c->eos_id, 41);
    assert_int_equal(tz_hf_info(m)->n_eos, 3);
  } else {
    assert_int_equal(c->rope_type, TZ_ROPE_DEFAULT);
    assert_true(c->rope_theta == 1000000.0);
  }
  assert_int_equal(c->has_pad, fi == 3);
  /* sliding_window null (mistral) or unused (qwen2's use_sliding_window false): no window */
  assert_int_equal(tz_hf_info(m)->sliding_window, 0);
  assert_int_equal(c->sliding_window, 0);

  /* Export: f32 so that the second import compares exactly; shards of at most three layers'
   * worth for the families written sharded. */
  struct tz_hf_export_opts o;
  tz_hf_export_opts_init(&o);
  assert_int_equal(o.dtype, TZ_BF16);
  assert_true(o.shard_bytes == 5000000000ull);
  assert_null(o.tokenizer_dir);
  o.dtype = TZ_F32;
  o.tokenizer_dir = src;
  uint64_t layer_bytes =
      4ull * (2 * f->C + 2 * (uint64_t)(f->H + f->KV) * f->D * f->C + 3ull * f->F * f->C);
  if (fi >= 2)
    o.shard_bytes = layer_bytes;
  TZ_ASSERT_OK(tz_hf_export(out, c, &o, get_from, m));
  tz_hf_model *m2;
  TZ_ASSERT_OK(tz_hf_open(out, &m2));
  const struct tz_model_config *c2 = tz_hf_config(m2);
  assert_memory_equal(c2, c, sizeof *c);
  check_blocks(m2, f);
  tz_hf_close(m2);

  json_t *cj = load_json(out, "config.json");
  assert_string_equal(json_string_value(json_object_get(cj, "model_type")), f->name);
  assert_string_equal(json_string_value(json_array_get(json_object_get(cj, "architectures"), 0)),
                      tz_model_family_architecture(c->family));
  assert_int_equal(jint(cj, "head_dim"), f->D);
  assert_string_equal(json_string_value(json_object_get(cj, "torch_dtype")), "float32");
  assert_string_equal(json_string_value(json_object_get(cj, "dtype")), "float32");
  assert_int_equal(jint(cj, "bos_token_id"), c->bos_id);
  assert_true(json_is_boolean(json_object_get(cj, "tie_word_embeddings")));
  json_t *rp = json_object_get(cj, "rope_parameters");
  assert_string_equal(json_string_value(json_object_get(rp, "rope_type")),
                      fi == 0 ? "llama3" : "default");
  if (fi == 0) {
    json_t *rs = json_object_get(cj, "rope_scaling");
    assert_true(json_number_value(json_object_get(rs, "factor")) == 32.0);
    assert_int_equal(jint(rs, "original_max_position_embeddings"), 8192);
    /* the list of eos ids of the source stays */
    assert_int_equal(json_array_size(json_object_get(cj, "eos_token_id")), 3);
    assert_true(json_is_false(json_object_get(cj, "attention_bias")));
    assert_true(json_is_false(json_object_get(cj, "mlp_bias")));
  } else {
    assert_true(json_is_null(json_object_get(cj, "rope_scaling")));
    assert_int_equal(jint(cj, "eos_token_id"), c->eos_id);
  }
  if (fi == 1)
    assert_true(json_is_null(json_object_get(cj, "sliding_window")));
  if (fi >= 2) {
    assert_true(json_is_false(json_object_get(cj, "use_sliding_window")));
    assert_int_equal(json_array_size(json_object_get(cj, "layer_types")), (size_t)f->L);
  }
  if (fi == 3)
    assert_true(json_is_false(json_object_get(cj, "attention_bias")));
  if (fi == 2)
    assert_null(json_object_get(cj, "attention_bias")); /* Qwen2Config has none */
  if (fi == 3)
    assert_int_equal(jint(cj, "pad_token_id"), 62);
  else
    assert_true(json_is_null(json_object_get(cj, "pad_token_id")));
  json_decref(cj);

  json_t *gc = load_json(out, "generation_config.json");
  assert_int_equal(jint(gc, "bos_token_id"), c->bos_id);
  assert_true(json_number_value(json_object_get(gc, "temperature")) == 0.6);
  if (fi == 3)
    assert_int_equal(jint(gc, "pad_token_id"), 62);
  json_decref(gc);
  /* tokenizer files byte for byte */
  for (int k = 0; k < 2; k++) {
    const char *name = k ? "tokenizer_config.json" : "tokenizer.json";
    char *a = read_text(src, name), *b = read_text(out, name);
    assert_non_null(b);
    assert_string_equal(a, b);
    free(a);
    free(b);
  }
  assert_false(exists(out, "tokenizer.model")); /* only what the source has */

  /* Sharding: one model.safetensors, or the shards and an index whose total_size is the sum. */
  uint64_t total = 0;
  for (int i = 0; i < n; i++)
    total += 4 * numel_of(&t[i]);
  if (fi < 2) {
    assert_true(exists(out, "model.safetensors"));
    assert_false(exists(out, "model.safetensors.index.json"));
  } else {
    assert_false(exists(out, "model.safetensors"));
    json_t *ix = load_json(out, "model.safetensors.index.json");
    assert_int_equal(jint(json_object_get(ix, "metadata"), "total_size"), (json_int_t)total);
    json_t *wm = json_object_get(ix, "weight_map");
    assert_int_equal(json_object_size(wm), (size_t)n);
    char last[64]; /* a copy: ix is released before the last use */
    snprintf(last, sizeof last, "%s", json_string_value(json_object_get(wm, t[n - 1].name)));
    int k, nshards;
    assert_int_equal(sscanf(last, "model-%5d-of-%5d.safetensors", &k, &nshards), 2);
    assert_int_equal(k, nshards);
    assert_true(nshards >= f->L);
    /* each shard at most shard_bytes unless it is one tensor */
    for (int s = 1; s <= nshards; s++) {
      char name[64];
      snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s, nshards);
      char *p = path_in(out, name);
      tz_st_file *sf;
      TZ_ASSERT_OK(tz_st_open(p, &sf));
      uint64_t bytes = 0;
      for (int i = 0; i < tz_st_count(sf); i++)
        bytes += tz_st_get(sf, i)->end - tz_st_get(sf, i)->begin;
      assert_true(bytes <= o.shard_bytes || tz_st_count(sf) == 1);
      assert_string_equal(tz_st_metadata(sf, "format"), "pt");
      tz_st_close(sf);
      free(p);
    }
    json_decref(ix);
    /* Exported again into one file over the shards: the shards and the index go. */
    o.shard_bytes = 5000000000ull;
    o.dtype = TZ_BF16;
    TZ_ASSERT_OK(tz_hf_export(out, c, &o, get_from, m));
    assert_true(exists(out, "model.safetensors"));
    assert_false(exists(out, "model.safetensors.index.json"));
    assert_false(exists(out, last));
    TZ_ASSERT_OK(tz_hf_open(out, &m2));
    check_blocks(m2, f); /* the values are exact in bf16 */
    tz_hf_close(m2);
    char *st = path_in(out, "model.safetensors");
    tz_st_file *sf;
    TZ_ASSERT_OK(tz_st_open(st, &sf));
    assert_string_equal(tz_st_get(sf, 0)->dtype, "BF16");
    tz_st_close(sf);
    free(st);
  }
  tz_hf_close(m);
  tz_test_rmdir(src);
  tz_test_rmdir(out);
}

static void test_llama(void **state) {
  (void)state;
  test_family(&fams[0]);
}
static void test_mistral(void **state) {
  (void)state;
  test_family(&fams[1]);
}
static void test_qwen2(void **state) {
  (void)state;
  test_family(&fams[2]);
}
static void test_qwen3(void **state) {
  (void)state;
  test_family(&fams[3]);
}

/* ---- bad configs ---- */

/* The family's config with key set to the JSON value (NULL: removed), refused with code and a
 * message naming the file and holding every needle. */
static void refused(const char *dir, int fam, const char *key, const char *val, int code,
                    const char *const *needles) {
  json_t *r = json_loads(fams[fam].config, 0, NULL);
  assert_non_null(r);
  if (val) {
    json_t *v = json_loads(val, JSON_DECODE_ANY, NULL);
    assert_non_null(v);
    json_object_set_new(r, key, v);
  } else {
    json_object_del(r, key);
  }
  char *p = path_in(dir, "config.json");
  assert_int_equal(json_dump_file(r, p, 0), 0);
  json_decref(r);
  struct tz_model_config c;
  int rc = tz_hf_config_read(dir, &c, NULL);
  if (rc != code)
    fail_msg("%s %s=%s: got %d (%s), want %d", fams[fam].name, key, val ? val : "(absent)", rc,
             tz_err_msg(), code);
  if (!strstr(tz_err_msg(), p))
    fail_msg("%s=%s: message \"%s\" does not name %s", key, val, tz_err_msg(), p);
  for (int i = 0; needles[i]; i++)
    if (!strstr(tz_err_msg(), needles[i]))
      fail_msg("%s=%s: message \"%s\" lacks \"%s\"", key, val, tz_err_msg(), needles[i]);
  free(p);
}

#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

static void accepted(const char *dir, int fam, const char *key, const char *val,
                     struct tz_model_config *c, struct tz_hf_info *info) {
  json_t *r = json_loads(fams[fam].config, 0, NULL);
  if (val)
    json_object_set_new(r, key, json_loads(val, JSON_DECODE_ANY, NULL));
  else
    json_object_del(r, key);
  char *p = path_in(dir, "config.json");
  assert_int_equal(json_dump_file(r, p, 0), 0);
  json_decref(r);
  free(p);
  TZ_ASSERT_OK(tz_hf_config_read_info(dir, c, NULL, info));
}

static void test_bad_configs(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("hf-bad");
  int NS = TZ_ENOTSUP, CF = TZ_ECONFIG;
  refused(dir, 0, "rope_scaling", "{\"rope_type\": \"mrope\", \"factor\": 4.0}", NS,
          NEEDLES("\"rope_scaling.rope_type\"", "mrope"));
  refused(dir, 0, "rope_scaling", "{\"rope_type\": \"dynamic\"}", CF,
          NEEDLES("rope_scaling", "factor"));
  /* yarn's factor must be positive, its truncate a boolean */
  refused(dir, 0, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": -1.0}", CF,
          NEEDLES("rope_scaling", "factor -1"));
  refused(dir, 0, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 2.0, \"truncate\": 1}", CF,
          NEEDLES("\"rope_scaling.truncate\""));
  /* linear is read (its factor required); longrope too, its factor lists required */
  refused(dir, 0, "rope_scaling", "{\"type\": \"linear\"}", CF, NEEDLES("rope_scaling", "factor"));
  refused(dir, 0, "rope_scaling", "{\"type\": \"longrope\", \"factor\": 2.0}", CF,
          NEEDLES("\"rope_scaling.short_factor\"", "rotated dims / 2 (4)"));
  refused(dir, 3, "rope_parameters", "{\"rope_type\": \"mrope\", \"rope_theta\": 10000.0}", NS,
          NEEDLES("\"rope_parameters.rope_type\"", "mrope"));
  refused(dir, 0, "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"high_freq_factor\": 4.0,"
          " \"original_max_position_embeddings\": 8192}",
          CF, NEEDLES("rope_scaling.low_freq_factor"));
  refused(dir, 0, "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}", CF,
          NEEDLES("\"rope_scaling\" and \"rope_parameters\" disagree"));
  refused(dir, 3, "rope_theta", "10000.0", CF, NEEDLES("rope_theta", "1e+06", "10000"));
  refused(dir, 1, "hidden_act", "\"gelu\"", NS, NEEDLES("\"hidden_act\"", "gelu"));
  refused(dir, 0, "mlp_bias", "true", NS, NEEDLES("\"mlp_bias\"", "true"));
  refused(dir, 0, "attention_bias", "true", NS, NEEDLES("\"attention_bias\"", "llama"));
  refused(dir, 3, "attention_bias", "true", NS, NEEDLES("\"attention_bias\"", "qwen3"));
  refused(dir, 1, "num_local_experts", "8", NS, NEEDLES("\"num_local_experts\"", "8"));
  refused(dir, 3, "num_experts", "128", NS, NEEDLES("\"num_experts\"", "128"));
  refused(dir, 3, "layer_types", "[\"full_attention\", \"sliding_attention\"]", NS,
          NEEDLES("\"layer_types\"[1]", "sliding_attention"));
  refused(dir, 3, "layer_types", "[\"full_attention\"]", CF,
          NEEDLES("\"layer_types\"", "num_hidden_layers (2)"));
  refused(dir, 0, "partial_rotary_factor", "0.5", NS, NEEDLES("\"partial_rotary_factor\"", "0.5"));
  refused(dir, 1, "final_logit_softcapping", "30.0", NS,
          NEEDLES("\"final_logit_softcapping\"", "30"));
  refused(dir, 1, "attn_logit_softcapping", "50.0", NS,
          NEEDLES("\"attn_logit_softcapping\"", "50"));
  refused(dir, 2, "use_sliding_window", "\"yes\"", CF, NEEDLES("\"use_sliding_window\"", "yes"));
  refused(dir, 3, "head_dim", "15", CF, NEEDLES("\"head_dim\" 15 is odd"));
  refused(dir, 2, "hidden_size", "30", CF,
          NEEDLES("\"hidden_size\" 30", "\"num_attention_heads\" 4", "head_dim"));
  refused(dir, 0, "num_key_value_heads", "3", CF,
          NEEDLES("\"num_attention_heads\" 4", "\"num_key_value_heads\" 3"));
  refused(dir, 0, "num_hidden_layers", "1099511627776", CF,
          NEEDLES("\"num_hidden_layers\"", "1099511627776", "65536"));
  refused(dir, 2, "vocab_size", NULL, CF, NEEDLES("missing \"vocab_size\""));
  refused(dir, 2, "intermediate_size", "\"56\"", CF,
          NEEDLES("\"intermediate_size\" must be an integer", "\"56\""));
  refused(dir, 0, "model_type", "\"gemma\"", NS, NEEDLES("\"model_type\"", "gemma"));
  refused(dir, 0, "architectures", "[\"MistralForCausalLM\"]", NS,
          NEEDLES("\"architectures\"", "MistralForCausalLM", "LlamaForCausalLM"));
  refused(dir, 1, "eos_token_id", "1000", CF, NEEDLES("\"eos_token_id\" 1000", "vocab_size"));
  refused(dir, 3, "pad_token_id", "-1", CF, NEEDLES("\"pad_token_id\" -1"));
  refused(dir, 0, "tie_word_embeddings", "\"yes\"", CF, NEEDLES("\"tie_word_embeddings\""));
  refused(dir, 0, "torch_dtype", "\"int8\"", CF, NEEDLES("\"torch_dtype\"", "int8"));
  refused(dir, 1, "sliding_window", "\"4096\"", CF, NEEDLES("\"sliding_window\""));

  /* Accepted: qwen2's window without use_sliding_window; mistral's window is every layer's (the
   * cpu backend computes it at any length; another backend is refused at a sequence longer than
   * it, tz_model_variant); its absence is 4096 as in transformers' MistralConfig. */
  struct tz_model_config c;
  struct tz_hf_info info;
  accepted(dir, 2, "sliding_window", "4096", &c, &info);
  assert_int_equal(info.sliding_window, 0);
  assert_int_equal(c.sliding_window, 0);
  /* opted into: the window from max_window_layers (the fixture's 21) on, none of its 3 layers */
  accepted(dir, 2, "use_sliding_window", "true", &c, &info);
  assert_true(c.sliding_window == 32768 && c.window_from == 21);
  assert_int_equal(tz_model_layer_window(&c, 2), 0);
  assert_int_equal(c.qkv_bias, 1);
  accepted(dir, 1, "sliding_window", "8", &c, &info);
  assert_int_equal(info.sliding_window, 8);
  assert_true(c.sliding_window == 8 && c.window_pattern == 0);
  assert_int_equal(tz_model_layer_window(&c, 0), 8);
  assert_null(tz_model_variant(&c, 8)); /* a window of the whole sequence is none */
  assert_string_equal(tz_model_variant(&c, 16), "sliding-window attention");
  accepted(dir, 1, "sliding_window", NULL, &c, &info);
  assert_true(info.sliding_window == 4096 && c.sliding_window == 4096);
  /* head_dim null: hidden / heads; a config file named directly */
  accepted(dir, 3, "head_dim", "null", &c, &info);
  assert_int_equal(tz_model_head_dim(&c), 8);
  assert_int_equal(c.head_dim, 0);
  char *p = path_in(dir, "config.json");
  TZ_ASSERT_OK(tz_hf_config_read(p, &c, NULL));
  free(p);
  tz_test_rmdir(dir);
}

/* ---- bad checkpoints ---- */

static void open_refused(const char *dir, int code, const char *const *needles) {
  tz_hf_model *m = NULL;
  int rc = tz_hf_open(dir, &m);
  if (rc != code)
    fail_msg("open: got %d (%s), want %d", rc, tz_err_msg(), code);
  assert_null(m);
  for (int i = 0; needles[i]; i++)
    if (!strstr(tz_err_msg(), needles[i]))
      fail_msg("message \"%s\" lacks \"%s\"", tz_err_msg(), needles[i]);
}

static void test_bad_checkpoints(void **state) {
  (void)state;
  struct hf_tensor t[130];
  char *dir = tz_test_mkdtemp("hf-badck");
  /* llama: an o_proj bias the model would not read */
  write_text(dir, "config.json", fams[0].config);
  int n = hf_tensors(&fams[0], t);
  t[n] = (struct hf_tensor){
      .name = "model.layers.1.self_attn.o_proj.bias", .ndim = 1, .shape = {32, 0}};
  write_weights(dir, t, n + 1, TZ_BF16, 1);
  open_refused(dir, TZ_EFORMAT,
               NEEDLES("model.safetensors", "'model.layers.1.self_attn.o_proj.bias'", "not read"));
  /* a tied model with an lm_head */
  t[n] = (struct hf_tensor){.name = "lm_head.weight", .ndim = 2, .shape = {50, 32}};
  write_weights(dir, t, n + 1, TZ_BF16, 1);
  open_refused(dir, TZ_EFORMAT, NEEDLES("'lm_head.weight'", "tie_word_embeddings"));
  /* the buffers of old checkpoints are skipped, as transformers does */
  t[n] = (struct hf_tensor){
      .name = "model.layers.0.self_attn.rotary_emb.inv_freq", .ndim = 1, .shape = {4, 0}};
  write_weights(dir, t, n + 1, TZ_F32, 1);
  tz_hf_model *m;
  TZ_ASSERT_OK(tz_hf_open(dir, &m));
  tz_hf_close(m);
  /* a wrong shape: both named */
  struct hf_tensor k = t[3];
  assert_string_equal(k.name, "model.layers.0.self_attn.k_proj.weight");
  t[3].shape[0] = 32;
  write_weights(dir, t, n, TZ_F32, 1);
  open_refused(dir, TZ_EFORMAT,
               NEEDLES("'model.layers.0.self_attn.k_proj.weight'", "[32, 32]", "[16, 32]",
                       "model.safetensors"));
  t[3] = k;
  /* a missing tensor */
  write_weights(dir, t, n - 1, TZ_F32, 1);
  open_refused(dir, TZ_ENOENT, NEEDLES("'model.norm.weight'", "model.safetensors"));

  /* qwen2 without its biases */
  char *d2 = tz_test_mkdtemp("hf-badck2");
  write_text(d2, "config.json", fams[2].config);
  struct hf_tensor q[130];
  int nq = 0;
  struct hf_tensor all[130];
  int na = hf_tensors(&fams[2], all);
  for (int i = 0; i < na; i++)
    if (!strstr(all[i].name, "bias"))
      q[nq++] = all[i];
  write_weights(d2, q, nq, TZ_F32, 1);
  open_refused(d2, TZ_ENOENT, NEEDLES("'model.layers.0.self_attn.q_proj.bias'"));

  /* sharded: a shard the index names is not there; the index lacks a tensor; it names one the
   * model does not read; a dtype that is not read */
  write_weights(d2, all, na, TZ_F32, 3);
  char *single = path_in(d2, "model.safetensors");
  remove(single);
  free(single);
  TZ_ASSERT_OK(tz_hf_open(d2, &m));
  tz_hf_close(m);
  char *s2 = path_in(d2, "model-00002-of-00003.safetensors");
  char *s2b = path_in(d2, "moved.safetensors");
  assert_int_equal(rename(s2, s2b), 0);
  open_refused(d2, TZ_ENOENT,
               NEEDLES("model.safetensors.index.json", "model-00002-of-00003.safetensors"));
  assert_int_equal(rename(s2b, s2), 0);
  free(s2);
  free(s2b);
  json_t *ix = load_json(d2, "model.safetensors.index.json");
  json_t *wm = json_object_get(ix, "weight_map");
  json_object_del(wm, "model.norm.weight");
  char *ip = path_in(d2, "model.safetensors.index.json");
  assert_int_equal(json_dump_file(ix, ip, 0), 0);
  open_refused(d2, TZ_ENOENT, NEEDLES("model.safetensors.index.json", "'model.norm.weight'"));
  json_object_set_new(wm, "model.norm.weight", json_string("model-00003-of-00003.safetensors"));
  json_object_set_new(wm, "model.layers.0.mlp.experts.0.weight",
                      json_string("model-00003-of-00003.safetensors"));
  assert_int_equal(json_dump_file(ix, ip, 0), 0);
  open_refused(d2, TZ_EFORMAT,
               NEEDLES("model.safetensors.index.json", "'model.layers.0.mlp.experts.0.weight'"));
  json_decref(ix);
  free(ip);
  /* I32 norm weights: the header of a good file edited in place (F32 -> I32, same size) */
  n = hf_tensors(&fams[0], t);
  write_weights(dir, t, n, TZ_F32, 1);
  char *st = path_in(dir, "model.safetensors");
  FILE *fp = fopen(st, "r+b");
  static char head[1 << 16];
  size_t got = fread(head, 1, sizeof head - 1, fp);
  head[got] = 0;
  char *at = strstr(head + 8, "\"model.norm.weight\":{\"dtype\":\"F32\"");
  assert_non_null(at);
  fseek(fp, (long)(at - head) + (long)strlen("\"model.norm.weight\":{\"dtype\":\""), SEEK_SET);
  fputc('I', fp);
  fclose(fp);
  free(st);
  open_refused(dir, TZ_ENOTSUP, NEEDLES("'model.norm.weight'", "I32", "model.safetensors"));
  tz_test_rmdir(d2);
  tz_test_rmdir(dir);
}

/* An export that fails part-way (a block cannot be had) leaves the previous export as it was and
 * no temporary file. */
struct failing {
  tz_hf_model *m;
  int fail_at;
};

static int get_failing(void *arg, int b, float *buf) {
  struct failing *f = arg;
  if (b == f->fail_at)
    return tz_err_set(TZ_EIO, "test: block %d is not there", b);
  return tz_hf_read_block(f->m, b, buf);
}

static void test_failed_export_keeps_previous(void **state) {
  (void)state;
  char *src = tz_test_mkdtemp("hf-fsrc"), *out = tz_test_mkdtemp("hf-fout");
  write_text(src, "config.json", fams[0].config);
  struct hf_tensor t[128];
  int n = hf_tensors(&fams[0], t);
  write_weights(src, t, n, TZ_BF16, 1);
  tz_hf_model *m;
  TZ_ASSERT_OK(tz_hf_open(src, &m));
  TZ_ASSERT_OK(tz_hf_export(out, tz_hf_config(m), NULL, get_from, m));
  char *before = read_text(out, "model.safetensors");
  struct failing f = {.m = m, .fail_at = 2};
  assert_int_equal(tz_hf_export(out, tz_hf_config(m), NULL, get_failing, &f), TZ_EIO);
  assert_non_null(strstr(tz_err_msg(), "block 2"));
  char *after = read_text(out, "model.safetensors");
  assert_memory_equal(before, after, 1 << 16);
  DIR *d = opendir(out);
  struct dirent *de;
  int files = 0;
  while ((de = readdir(d)))
    if (de->d_name[0] != '.') {
      if (strstr(de->d_name, "tmp"))
        fail_msg("a temporary file is left: %s", de->d_name);
      files++;
    }
  closedir(d);
  assert_int_equal(files, 3); /* config.json, generation_config.json, model.safetensors */
  tz_hf_close(m);
  TZ_ASSERT_OK(tz_hf_open(out, &m)); /* and the previous export still opens */
  free(before);
  free(after);
  tz_hf_close(m);
  tz_test_rmdir(src);
  tz_test_rmdir(out);
}

/* The released configs of tests/data/hf, read as a user's download is: the head tied where the
 * file says so, or, where it says nothing, where the family's config class ties it by default
 * (Gemma's: their configs leave the key out, and tz-train read them as untied, a separate head
 * the checkpoint does not have); the parameter counts the model cards publish. */
static void test_released_configs(void **state) {
  (void)state;
  const char *data = getenv("TZ_TEST_DATA");
  if (!data)
    tz_test_skip("TZ_TEST_DATA is not set (the source tree's tests/data, as ctest sets it)");
  static const struct {
    const char *file;
    int tied;
    uint64_t params; /* the model card's, 0: not checked */
  } want[] = {
      {"gemma-2-2b.json", 1, 2614341888ull},      {"gemma-3-1b-pt.json", 1, 999885952ull},
      {"llama-3.2-1b.json", 1, 1235814400ull},    {"qwen2.5-1.5b.json", 1, 1543714304ull},
      {"mistral-7b-v0.3.json", 0, 7248023552ull}, {"olmo-2-0425-1b.json", 0, 0},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    char *p = path_in(data, "hf");
    char *f = path_in(p, want[i].file);
    struct tz_model_config c;
    enum tz_dtype dt;
    if (tz_hf_config_read(f, &c, &dt) < 0)
      fail_msg("%s: %s", f, tz_err_msg());
    if (c.tie_embeddings != want[i].tied)
      fail_msg("%s: tie_embeddings %d, want %d", want[i].file, c.tie_embeddings, want[i].tied);
    if (want[i].params && tz_model_n_params(&c) != want[i].params)
      fail_msg("%s: %llu parameters, the model card's %llu", want[i].file,
               (unsigned long long)tz_model_n_params(&c), (unsigned long long)want[i].params);
    free(f);
    free(p);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_llama),           cmocka_unit_test(test_mistral),
      cmocka_unit_test(test_qwen2),           cmocka_unit_test(test_qwen3),
      cmocka_unit_test(test_bad_configs),     cmocka_unit_test(test_released_configs),
      cmocka_unit_test(test_bad_checkpoints), cmocka_unit_test(test_failed_export_keeps_previous),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
