/* safetensors and Hugging Face Llama import/export: bit-exact round trips (F32, BF16, F16 read),
 * the HF tensor names and config.json fields, sharded checkpoints, and clear errors for bad files
 * (truncated, bad JSON, offsets out of range, wrong dtype or shape) naming tensor and offset; a
 * tensor holding NaN or inf refused, naming the file, the tensor and the element. Reads shared by
 * threads give the bits, the first non-finite index and the error of one thread. */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "kernels/compute.h"
#include "core/dtype.h"
#include "testlib.h"
#include "trainer/model/hf.h"
#include "trainer/model/model.h"
#include "trainer/model/safetensors.h"

static struct tz_model_config cfg_small(int tie) {
  struct tz_model_config c = {.d_model = 32,
                              .n_layer = 2,
                              .n_head = 4,
                              .n_kv_head = 2,
                              .ffn_dim = 40,
                              .vocab = 37,
                              .max_seq = 16,
                              .rope_theta = 500000.0,
                              .norm_eps = 1e-6,
                              .tie_embeddings = tie};
  return c;
}

struct blocks {
  const struct tz_model_config *cfg;
  float **b;
};

static struct blocks make_blocks(const struct tz_model_config *cfg, uint64_t seed) {
  struct blocks s = {.cfg = cfg, .b = calloc((size_t)tz_model_n_blocks(cfg), sizeof(float *))};
  for (int i = 0; i < tz_model_n_blocks(cfg); i++) {
    uint64_t n = tz_model_block_numel(cfg, i);
    s.b[i] = malloc(sizeof(float) * n);
    TZ_ASSERT_OK(tz_model_init_block(cfg, i, seed, 0, n, s.b[i]));
  }
  return s;
}

static void free_blocks(struct blocks *s) {
  for (int i = 0; i < tz_model_n_blocks(s->cfg); i++)
    free(s->b[i]);
  free(s->b);
}

static int get_block(void *arg, int b, float *buf) {
  struct blocks *s = arg;
  memcpy(buf, s->b[b], sizeof(float) * tz_model_block_numel(s->cfg, b));
  return 0;
}

/* tz_hf_export storing dtype dt, everything else by default. */
static int export_as(const char *dir, const struct tz_model_config *cfg, enum tz_dtype dt,
                     int (*get)(void *, int, float *), void *arg) {
  struct tz_hf_export_opts o;
  tz_hf_export_opts_init(&o);
  o.dtype = dt;
  return tz_hf_export(dir, cfg, &o, get, arg);
}

static char *path_in(const char *dir, const char *name) {
  char *p;
  assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
  return p;
}

static void round_trip(int tie, enum tz_dtype dt) {
  struct tz_model_config cfg = cfg_small(tie);
  struct blocks src = make_blocks(&cfg, 42);
  char *dir = tz_test_mkdtemp("st");
  TZ_ASSERT_OK(export_as(dir, &cfg, dt, get_block, &src));
  tz_hf_model *m;
  TZ_ASSERT_OK(tz_hf_open(dir, &m));
  const struct tz_model_config *c2 = tz_hf_config(m);
  assert_int_equal(c2->d_model, cfg.d_model);
  assert_int_equal(c2->n_layer, cfg.n_layer);
  assert_int_equal(c2->n_head, cfg.n_head);
  assert_int_equal(c2->n_kv_head, cfg.n_kv_head);
  assert_int_equal(c2->ffn_dim, cfg.ffn_dim);
  assert_int_equal(c2->vocab, cfg.vocab);
  assert_int_equal(c2->max_seq, cfg.max_seq);
  assert_true(c2->rope_theta == cfg.rope_theta);
  assert_true(c2->norm_eps == cfg.norm_eps);
  assert_int_equal(c2->tie_embeddings, cfg.tie_embeddings);
  for (int b = 0; b < tz_model_n_blocks(&cfg); b++) {
    uint64_t n = tz_model_block_numel(&cfg, b);
    float *got = malloc(sizeof(float) * n);
    TZ_ASSERT_OK(tz_hf_read_block(m, b, got));
    for (uint64_t e = 0; e < n; e++) {
      float want = dt == TZ_F32    ? src.b[b][e]
                   : dt == TZ_BF16 ? tz_bf16_to_f32(tz_f32_to_bf16(src.b[b][e]))
                                   : tz_f16_to_f32(tz_f32_to_f16(src.b[b][e]));
      if (memcmp(&got[e], &want, 4) != 0)
        fail_msg("block %d element %llu: %a after the round trip, want %a", b,
                 (unsigned long long)e, (double)got[e], (double)want);
    }
    free(got);
  }
  tz_hf_close(m);

  /* The file holds exactly the HF names, with the stored dtype and "format": "pt". */
  char *st = path_in(dir, "model.safetensors");
  tz_st_file *f;
  TZ_ASSERT_OK(tz_st_open(st, &f));
  assert_int_equal(tz_st_count(f), 1 + 9 * cfg.n_layer + 1 + (tie ? 0 : 1));
  assert_string_equal(tz_st_metadata(f, "format"), "pt");
  const char *names[] = {"model.embed_tokens.weight",
                         "model.layers.0.input_layernorm.weight",
                         "model.layers.1.self_attn.q_proj.weight",
                         "model.layers.1.self_attn.k_proj.weight",
                         "model.layers.1.self_attn.v_proj.weight",
                         "model.layers.1.self_attn.o_proj.weight",
                         "model.layers.0.post_attention_layernorm.weight",
                         "model.layers.1.mlp.gate_proj.weight",
                         "model.layers.1.mlp.up_proj.weight",
                         "model.layers.1.mlp.down_proj.weight",
                         "model.norm.weight"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const struct tz_st_tensor *t = tz_st_find(f, names[i]);
    if (!t)
      fail_msg("missing %s", names[i]);
    assert_string_equal(t->dtype, dt == TZ_F32 ? "F32" : dt == TZ_BF16 ? "BF16" : "F16");
  }
  const struct tz_st_tensor *k = tz_st_find(f, "model.layers.1.self_attn.k_proj.weight");
  assert_int_equal(k->ndim, 2);
  assert_int_equal(k->shape[0], 16); /* Hkv * D = 2 * 8 */
  assert_int_equal(k->shape[1], 32);
  const struct tz_st_tensor *dn = tz_st_find(f, "model.layers.1.mlp.down_proj.weight");
  assert_int_equal(dn->shape[0], 32);
  assert_int_equal(dn->shape[1], 40);
  assert_true((tz_st_find(f, "lm_head.weight") != NULL) == !tie);
  tz_st_close(f);
  free(st);

  /* config.json carries LlamaForCausalLM's fields. */
  char *cj = path_in(dir, "config.json");
  json_error_t jerr;
  json_t *root = json_load_file(cj, 0, &jerr);
  assert_non_null(root);
  assert_string_equal(json_string_value(json_array_get(json_object_get(root, "architectures"), 0)),
                      "LlamaForCausalLM");
  assert_string_equal(json_string_value(json_object_get(root, "model_type")), "llama");
  assert_int_equal(json_integer_value(json_object_get(root, "num_key_value_heads")), 2);
  assert_true(json_number_value(json_object_get(root, "rope_theta")) == 500000.0);
  assert_true(json_number_value(json_object_get(root, "rms_norm_eps")) == 1e-6);
  assert_true(json_is_boolean(json_object_get(root, "tie_word_embeddings")));
  assert_string_equal(json_string_value(json_object_get(root, "torch_dtype")),
                      dt == TZ_F32    ? "float32"
                      : dt == TZ_BF16 ? "bfloat16"
                                      : "float16");
  json_decref(root);
  free(cj);
  tz_test_rmdir(dir);
  free_blocks(&src);
}

static void test_round_trip_f32_untied(void **state) {
  (void)state;
  round_trip(0, TZ_F32);
}
static void test_round_trip_f32_tied(void **state) {
  (void)state;
  round_trip(1, TZ_F32);
}
static void test_round_trip_bf16(void **state) {
  (void)state;
  round_trip(0, TZ_BF16);
}
static void test_round_trip_f16(void **state) {
  (void)state;
  round_trip(1, TZ_F16);
}

/* Export from backend memory, import into backend memory: the model computes the same loss. */
static void test_model_through_files(void **state) {
  (void)state;
  struct tz_model_config cfg = cfg_small(0);
  tz_compute *cm;
  TZ_ASSERT_OK(tz_compute_create("cpu", NULL, &cm));
  void **a, **b;
  TZ_ASSERT_OK(tz_model_blocks_alloc(cm, &cfg, &a));
  TZ_ASSERT_OK(tz_model_blocks_alloc(cm, &cfg, &b));
  TZ_ASSERT_OK(tz_model_blocks_init(cm, &cfg, 9, a));
  char *dir = tz_test_mkdtemp("st");
  struct tz_hf_export_opts o;
  tz_hf_export_opts_init(&o);
  o.dtype = TZ_F32;
  TZ_ASSERT_OK(tz_hf_export_compute(dir, &cfg, &o, cm, a));
  tz_hf_model *m;
  TZ_ASSERT_OK(tz_hf_open(dir, &m));
  TZ_ASSERT_OK(tz_hf_load(m, cm, b));
  tz_model_runner *r;
  TZ_ASSERT_OK(tz_model_runner_create(cm, &cfg, 2, 5, 1, &r));
  int32_t tok[10] = {1, 5, 9, 2, 30, 36, 0, 7, 7, 3}, tgt[10] = {5, 9, 2, 30, 36, 0, 7, 7, 3, 1};
  float la, lb;
  TZ_ASSERT_OK(tz_model_runner_step(r, a, NULL, tok, tgt, 0, &la));
  TZ_ASSERT_OK(tz_model_runner_step(r, b, NULL, tok, tgt, 0, &lb));
  assert_memory_equal(&la, &lb, 4);
  assert_true(fabsf(la - logf(37.0f)) < 0.1f); /* small init: near uniform */
  tz_model_runner_destroy(r);
  tz_hf_close(m);
  tz_test_rmdir(dir);
  tz_model_blocks_free(cm, &cfg, a);
  tz_model_blocks_free(cm, &cfg, b);
  tz_compute_destroy(cm);
}

/* get_block failing from block 3 on: an export that stops part way (a killed one). */
static int get_block_failing(void *arg, int b, float *buf) {
  if (b >= 3)
    return tz_err_set(TZ_EIO, "test: block %d not readable", b);
  return get_block(arg, b, buf);
}

/* Block b of the export in dir equals src's block b, bit for bit (f32). */
static void check_export(const char *dir, const struct tz_model_config *cfg,
                         const struct blocks *src) {
  tz_hf_model *m;
  TZ_ASSERT_OK(tz_hf_open(dir, &m));
  for (int b = 0; b < tz_model_n_blocks(cfg); b++) {
    uint64_t n = tz_model_block_numel(cfg, b);
    float *got = malloc(sizeof(float) * n);
    TZ_ASSERT_OK(tz_hf_read_block(m, b, got));
    assert_memory_equal(got, src->b[b], sizeof(float) * n);
    free(got);
  }
  tz_hf_close(m);
}

/* An export replaces the one in its directory whole (issue 48: a killed sharded export left
 * shards of two exports, which import read as one): written beside it and swapped in, so a
 * failed one leaves the earlier export as it was, a new one leaves none of the earlier's files,
 * and a directory holding files an export does not write is refused, untouched. */
static void test_export_replaced_whole(void **state) {
  (void)state;
  struct tz_model_config cfg = cfg_small(0);
  struct blocks a = make_blocks(&cfg, 1), b = make_blocks(&cfg, 2);
  char *root = tz_test_mkdtemp("st-swap");
  char *dir = path_in(root, "exp"), *tmp = path_in(root, "exp.tmp-export");
  TZ_ASSERT_OK(export_as(dir, &cfg, TZ_F32, get_block, &a)); /* one model.safetensors */
  struct tz_hf_export_opts o;
  tz_hf_export_opts_init(&o);
  o.dtype = TZ_F32;
  o.shard_bytes = 8192; /* many shards */
  assert_int_equal(tz_hf_export(dir, &cfg, &o, get_block_failing, &b), TZ_EIO);
  check_export(dir, &cfg, &a);
  char *shard1 = path_in(dir, "model-00001-of-00002.safetensors");
  assert_int_not_equal(access(tmp, F_OK), 0);
  TZ_ASSERT_OK(tz_hf_export(dir, &cfg, &o, get_block, &b));
  check_export(dir, &cfg, &b);
  char *single = path_in(dir, "model.safetensors");
  assert_int_not_equal(access(single, F_OK), 0); /* the earlier export's file is gone */
  assert_int_not_equal(access(tmp, F_OK), 0);
  /* a directory with a file of the user's */
  char *other = path_in(root, "other"), *readme = path_in(other, "README.md");
  assert_int_equal(mkdir(other, 0755), 0);
  FILE *f = fopen(readme, "w");
  assert_non_null(f);
  fputs("notes\n", f);
  fclose(f);
  assert_int_equal(export_as(other, &cfg, TZ_F32, get_block, &a), TZ_EEXIST);
  assert_non_null(strstr(tz_err_msg(), "README.md"));
  assert_int_equal(access(readme, F_OK), 0);
  unlink(readme);
  free(readme);
  free(other);
  free(single);
  free(shard1);
  free(tmp);
  free(dir);
  tz_test_rmdir(root);
  free_blocks(&a);
  free_blocks(&b);
}

/* Bytes of file path from offset off (a negative off counts from the end) into buf, or buf's
 * bytes written there (put). */
static void file_bytes(const char *path, long off, void *buf, size_t n, int put) {
  FILE *f = fopen(path, put ? "r+b" : "rb");
  assert_non_null(f);
  assert_int_equal(fseek(f, off, off < 0 ? SEEK_END : SEEK_SET), 0);
  assert_int_equal(put ? fwrite(buf, 1, n, f) : fread(buf, 1, n, f), n);
  fclose(f);
}

/* Copies file a over file b. */
static void copy_file(const char *a, const char *b) {
  FILE *in = fopen(a, "rb"), *out = fopen(b, "wb");
  assert_non_null(in);
  assert_non_null(out);
  char buf[4096];
  for (size_t got; (got = fread(buf, 1, sizeof buf, in)) > 0;)
    assert_int_equal(fwrite(buf, 1, got, out), got);
  fclose(in);
  fclose(out);
}

static void expect_refused(const char *dir, const char *a, const char *b) {
  tz_hf_model *m = NULL;
  assert_int_equal(tz_hf_open(dir, &m), TZ_EFORMAT);
  assert_null(m);
  if (!strstr(tz_err_msg(), a) || !strstr(tz_err_msg(), b))
    fail_msg("message \"%s\" lacks \"%s\" or \"%s\"", tz_err_msg(), a, b);
}

/* A sharded export's index gives each shard's size and crc32c: import refuses a shard of another
 * export put in its place (same name, same tensors), one byte changed, and a shard cut short,
 * naming the shard (issue 48: a killed export into an earlier one's directory used to leave
 * shards of both, read as one model). The same model exported twice gives the same files. */
static void test_export_shards_verified(void **state) {
  (void)state;
  struct tz_model_config cfg = cfg_small(0);
  struct blocks a = make_blocks(&cfg, 1), b = make_blocks(&cfg, 2);
  char *root = tz_test_mkdtemp("st-verify");
  char *da = path_in(root, "a"), *db = path_in(root, "b");
  struct tz_hf_export_opts o;
  tz_hf_export_opts_init(&o);
  o.dtype = TZ_F32;
  o.shard_bytes = 8192; /* several shards */
  TZ_ASSERT_OK(tz_hf_export(da, &cfg, &o, get_block, &a));
  TZ_ASSERT_OK(tz_hf_export(db, &cfg, &o, get_block, &b));
  check_export(da, &cfg, &a);
  char *ip = path_in(da, "model.safetensors.index.json");
  json_t *idx = json_load_file(ip, 0, NULL);
  assert_non_null(idx);
  json_t *meta = json_object_get(idx, "metadata");
  /* the shard of the final norm (the last), in both exports (the same shapes, the same shards) */
  char shard[64];
  snprintf(
      shard, sizeof shard, "%s",
      json_string_value(json_object_get(json_object_get(idx, "weight_map"), "model.norm.weight")));
  assert_int_equal(strncmp(shard, "model-", 6), 0);
  json_t *s2 = json_object_get(json_object_get(meta, "tierzero_shards"), shard);
  assert_true(json_is_integer(json_object_get(s2, "bytes")));
  assert_true(json_is_string(json_object_get(s2, "crc32c")));
  json_decref(idx);
  char *dc = path_in(root, "c"); /* a again: the same bytes, index included */
  TZ_ASSERT_OK(tz_hf_export(dc, &cfg, &o, get_block, &a));
  for (int k = 0; k < 2; k++) {
    const char *f = k ? "model.safetensors.index.json" : shard;
    char *x = path_in(da, f), *y = path_in(dc, f);
    struct stat sx, sy;
    assert_int_equal(stat(x, &sx), 0);
    assert_int_equal(stat(y, &sy), 0);
    assert_int_equal(sx.st_size, sy.st_size);
    unsigned char *bx = malloc((size_t)sx.st_size), *by = malloc((size_t)sy.st_size);
    file_bytes(x, 0, bx, (size_t)sx.st_size, 0);
    file_bytes(y, 0, by, (size_t)sy.st_size, 0);
    assert_memory_equal(bx, by, (size_t)sx.st_size);
    free(bx), free(by), free(x), free(y);
  }
  free(dc);
  char *sa = path_in(da, shard), *sb = path_in(db, shard), *keep = path_in(root, "keep");
  copy_file(sa, keep);
  /* b's shard 2 in a's place: the same tensors, another export */
  copy_file(sb, sa);
  expect_refused(da, shard, "another export's");
  /* one byte of the data changed */
  copy_file(keep, sa);
  check_export(da, &cfg, &a);
  unsigned char c;
  file_bytes(sa, -5, &c, 1, 0);
  c ^= 0x10;
  file_bytes(sa, -5, &c, 1, 1);
  expect_refused(da, shard, "crc32c");
  /* cut short */
  copy_file(keep, sa);
  struct stat st;
  assert_int_equal(stat(sa, &st), 0);
  assert_int_equal(truncate(sa, st.st_size - 4), 0);
  expect_refused(da, shard, "bytes");
  copy_file(keep, sa);
  check_export(da, &cfg, &a);
  unlink(keep);
  free(keep);
  free(sa);
  free(sb);
  free(ip);
  free(da);
  free(db);
  tz_test_rmdir(root);
  free_blocks(&a);
  free_blocks(&b);
}

/* A checkpoint in two shards with model.safetensors.index.json, as transformers writes large
 * models. */
static void test_sharded(void **state) {
  (void)state;
  struct tz_model_config cfg = cfg_small(0);
  struct blocks src = make_blocks(&cfg, 5);
  char *dir = tz_test_mkdtemp("st");
  TZ_ASSERT_OK(tz_hf_config_write(dir, &cfg, TZ_F32));
  json_t *wm = json_object();
  /* shard 1: the embedding and layer 0; shard 2: the rest */
  for (int shard = 0; shard < 2; shard++) {
    int b0 = shard ? 2 : 0, b1 = shard ? tz_model_n_blocks(&cfg) : 2;
    struct tz_st_entry e[32];
    char names[32][128];
    const float *data[32];
    int n = 0;
    for (int b = b0; b < b1; b++) {
      struct tz_block_layout l;
      TZ_ASSERT_OK(tz_model_block_layout(&cfg, b, &l));
      for (int i = 0; i < l.n; i++) {
        if (!l.t[i].numel)
          continue;
        TZ_ASSERT_OK(tz_hf_tensor_name(&cfg, b, i, names[n], sizeof names[n]));
        e[n] = (struct tz_st_entry){.name = names[n],
                                    .dtype = TZ_F32,
                                    .ndim = l.t[i].ndim,
                                    .shape = {l.t[i].shape[0], l.t[i].shape[1]}};
        data[n] = src.b[b] + l.t[i].offset;
        n++;
      }
    }
    char file[64];
    snprintf(file, sizeof file, "model-0000%d-of-00002.safetensors", shard + 1);
    char *p = path_in(dir, file);
    tz_st_writer *w;
    TZ_ASSERT_OK(tz_st_writer_open(p, e, n, NULL, &w));
    for (int i = 0; i < n; i++) {
      uint64_t numel = (uint64_t)e[i].shape[0] * (e[i].ndim == 2 ? (uint64_t)e[i].shape[1] : 1);
      TZ_ASSERT_OK(tz_st_writer_put(w, data[i], numel));
      json_object_set_new(wm, names[i], json_string(file));
    }
    TZ_ASSERT_OK(tz_st_writer_close(w, 1));
    free(p);
  }
  json_t *idx = json_object();
  json_object_set_new(idx, "metadata", json_object());
  json_object_set_new(idx, "weight_map", wm);
  char *ip = path_in(dir, "model.safetensors.index.json");
  assert_int_equal(json_dump_file(idx, ip, 0), 0);
  json_decref(idx);
  free(ip);
  tz_hf_model *m;
  TZ_ASSERT_OK(tz_hf_open(dir, &m));
  for (int b = 0; b < tz_model_n_blocks(&cfg); b++) {
    uint64_t n = tz_model_block_numel(&cfg, b);
    float *got = malloc(sizeof(float) * n);
    TZ_ASSERT_OK(tz_hf_read_block(m, b, got));
    assert_memory_equal(got, src.b[b], sizeof(float) * n);
    free(got);
  }
  tz_hf_close(m);
  tz_test_rmdir(dir);
  free_blocks(&src);
}

/* ---- bad files ---- */

static char *write_raw(const char *dir, const char *name, uint64_t hlen, const char *hdr,
                       size_t data_bytes, size_t cut) {
  char *p = path_in(dir, name);
  FILE *fp = fopen(p, "wb");
  assert_non_null(fp);
  size_t total = 8 + strlen(hdr) + data_bytes;
  uint8_t *buf = calloc(1, total);
  for (int i = 0; i < 8; i++)
    buf[i] = (uint8_t)(hlen >> (8 * i));
  memcpy(buf + 8, hdr, strlen(hdr));
  for (size_t i = 0; i < data_bytes; i++)
    buf[8 + strlen(hdr) + i] = (uint8_t)i;
  assert_int_equal(fwrite(buf, 1, total - cut, fp), total - cut);
  fclose(fp);
  free(buf);
  return p;
}

static void expect_open_error(const char *dir, const char *hdr, size_t data, size_t cut,
                              int64_t hlen_override, int code, const char *const *needles) {
  uint64_t hlen = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(hdr);
  char *p = write_raw(dir, "bad.safetensors", hlen, hdr, data, cut);
  tz_st_file *f = NULL;
  int rc = tz_st_open(p, &f);
  if (rc != code)
    fail_msg("header %s: got %d (%s), want %d", hdr, rc, tz_err_msg(), code);
  assert_null(f);
  for (int i = 0; needles[i]; i++)
    if (!strstr(tz_err_msg(), needles[i]))
      fail_msg("message \"%s\" lacks \"%s\"", tz_err_msg(), needles[i]);
  free(p);
}

static void test_bad_files(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("st");
  const char *ok = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
  /* a good file, for contrast */
  char *p = write_raw(dir, "good.safetensors", strlen(ok), ok, 24, 0);
  tz_st_file *f;
  TZ_ASSERT_OK(tz_st_open(p, &f));
  float out[6];
  int64_t shape[2] = {2, 3}, wrong[2] = {3, 2};
  TZ_ASSERT_OK(tz_st_read_f32(f, "w", 2, shape, out));
  uint32_t first = (0u) | (1u << 8) | (2u << 16) | (3u << 24);
  assert_memory_equal(&out[0], &first, 4);
  assert_int_equal(tz_st_read_f32(f, "w", 2, wrong, out), TZ_EFORMAT);
  assert_non_null(strstr(tz_err_msg(), "'w' has shape [2, 3], expected [3, 2]"));
  assert_int_equal(tz_st_read_f32(f, "v", 0, NULL, out), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), "'v'"));
  tz_st_close(f);
  free(p);

  /* truncated: shorter than the length prefix; header running past the end; data cut off */
  expect_open_error(dir, "", 0, 5, 0, TZ_EFORMAT, (const char *const[]){"truncated", NULL});
  expect_open_error(dir, ok, 24, 0, 1000, TZ_EFORMAT,
                    (const char *const[]){"header length 1000", "past the end", NULL});
  expect_open_error(dir, ok, 24, 10, -1, TZ_EFORMAT,
                    (const char *const[]){"'w'", "[0, 24]", "outside the 14 bytes", NULL});
  /* bad JSON */
  expect_open_error(dir, "{\"w\": {\"dtype\": \"F32\",, }", 0, 0, -1, TZ_EFORMAT,
                    (const char *const[]){"header JSON at byte", NULL});
  expect_open_error(dir, "[1, 2]", 0, 0, -1, TZ_EFORMAT,
                    (const char *const[]){"not an object", NULL});
  /* offsets out of range, reversed, or not matching the shape */
  expect_open_error(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]}}", 24,
                    0, -1, TZ_EFORMAT, (const char *const[]){"'w'", "[8, 32]", NULL});
  expect_open_error(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,0]}}", 24,
                    0, -1, TZ_EFORMAT, (const char *const[]){"'w'", "[24, 0]", NULL});
  expect_open_error(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,24]}}", 24,
                    0, -1, TZ_EFORMAT, (const char *const[]){"'w'", "needs 16", NULL});
  /* dtype and shape */
  expect_open_error(dir, "{\"w\":{\"dtype\":\"F33\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
                    0, -1, TZ_EFORMAT, (const char *const[]){"'w'", "F33", NULL});
  expect_open_error(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,24]}}", 24,
                    0, -1, TZ_EFORMAT, (const char *const[]){"'w'", "shape[1]", NULL});
  expect_open_error(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[6]}}", 24, 0, -1, TZ_EFORMAT,
                    (const char *const[]){"'w'", "data_offsets", NULL});
  /* overlapping tensors */
  expect_open_error(dir,
                    "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                    24, 0, -1, TZ_EFORMAT, (const char *const[]){"'b'", "overlaps", NULL});

  /* a dtype that parses but is not read */
  const char *i64 = "{\"w\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]}}";
  p = write_raw(dir, "i64.safetensors", strlen(i64), i64, 24, 0);
  TZ_ASSERT_OK(tz_st_open(p, &f));
  assert_int_equal(tz_st_read_f32(f, "w", 0, NULL, out), TZ_ENOTSUP);
  assert_non_null(strstr(tz_err_msg(), "I64"));
  tz_st_close(f);
  free(p);

  assert_int_equal(tz_st_open("/nonexistent/x.safetensors", &f), TZ_ENOENT);
  tz_test_rmdir(dir);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char *p = path_in(dir, name);
  FILE *fp = fopen(p, "w");
  assert_non_null(fp);
  fputs(text, fp);
  fclose(fp);
  free(p);
}

static void test_bad_config(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("st");
  struct tz_model_config c;
  write_text(dir, "config.json", "{\"num_hidden_layers\": 2}");
  assert_int_equal(tz_hf_config_read(dir, &c, NULL), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "hidden_size"));
  write_text(dir, "config.json",
             "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
             " \"intermediate_size\": 128, \"vocab_size\": 100, \"rope_scaling\": {\"type\": "
             "\"mrope\", \"factor\": 2.0}}");
  assert_int_equal(tz_hf_config_read(dir, &c, NULL), TZ_ENOTSUP);
  assert_non_null(strstr(tz_err_msg(), "rope_scaling"));
  write_text(dir, "config.json",
             "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
             " \"num_key_value_heads\": 3, \"intermediate_size\": 128, \"vocab_size\": 100}");
  assert_int_equal(tz_hf_config_read(dir, &c, NULL), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "num_key_value_heads\" 3"));
  write_text(dir, "config.json",
             "{\"hidden_size\": 64, \"num_hidden_layers\": \"2\", \"num_attention_heads\": 4,"
             " \"intermediate_size\": 128, \"vocab_size\": 100}");
  assert_int_equal(tz_hf_config_read(dir, &c, NULL), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "num_hidden_layers"));
  write_text(dir, "config.json", "{\"hidden_size\": 64,");
  assert_int_equal(tz_hf_config_read(dir, &c, NULL), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "line 1"));
  /* The nested form of newer transformers. */
  write_text(dir, "config.json",
             "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
             " \"intermediate_size\": 128, \"vocab_size\": 100, \"rope_parameters\": "
             "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}, \"dtype\": \"float16\"}");
  enum tz_dtype dt;
  TZ_ASSERT_OK(tz_hf_config_read(dir, &c, &dt));
  assert_true(c.rope_theta == 500000.0);
  assert_int_equal(dt, TZ_F16);
  /* Defaults of LlamaConfig where keys are absent; torch_dtype read. */
  write_text(dir, "config.json",
             "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
             " \"intermediate_size\": 128, \"vocab_size\": 100, \"torch_dtype\": \"bfloat16\"}");
  TZ_ASSERT_OK(tz_hf_config_read(dir, &c, &dt));
  assert_int_equal(c.n_kv_head, 4);
  assert_int_equal(c.tie_embeddings, 0);
  assert_true(c.rope_theta == 10000.0 && c.norm_eps == 1e-6 && c.max_seq == 2048);
  assert_int_equal(dt, TZ_BF16);
  /* A config without weights, then weights missing a tensor. */
  tz_hf_model *m;
  assert_int_equal(tz_hf_open(dir, &m), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), "model.safetensors"));
  struct tz_model_config small = cfg_small(0);
  TZ_ASSERT_OK(tz_hf_config_write(dir, &small, TZ_F32));
  struct tz_st_entry e = {
      .name = "model.embed_tokens.weight", .dtype = TZ_F32, .ndim = 2, .shape = {37, 32}};
  float *wte = calloc(37 * 32, sizeof(float));
  char *p = path_in(dir, "model.safetensors");
  tz_st_writer *w;
  TZ_ASSERT_OK(tz_st_writer_open(p, &e, 1, NULL, &w));
  assert_int_equal(tz_st_writer_put(w, wte, 5), TZ_EINVAL); /* wrong size */
  TZ_ASSERT_OK(tz_st_writer_put(w, wte, 37 * 32));
  TZ_ASSERT_OK(tz_st_writer_close(w, 1));
  free(p);
  /* refused at open, before any tensor is read */
  assert_int_equal(tz_hf_open(dir, &m), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), "model.layers.0.input_layernorm.weight"));
  assert_non_null(strstr(tz_err_msg(), "model.safetensors"));
  free(wte);
  tz_test_rmdir(dir);
}

/* A checkpoint whose one tensor holds one NaN (then one +inf) is refused when read, naming the
 * tensor, the file and the value. */
static void test_nonfinite_weight_refused(void **state) {
  (void)state;
  struct tz_model_config cfg = cfg_small(0);
  static const float bad[2] = {NAN, INFINITY};
  static const char *const said[2] = {"nan", "inf"};
  static const enum tz_dtype dts[3] = {TZ_F32, TZ_BF16, TZ_F16};
  /* element 3 lies before the vectorised part of a cast, 203 inside it */
  static const int at[2] = {3, 203};
  for (int k = 0; k < 2; k++)
    for (int d = 0; d < 3; d++)
      for (int a = 0; a < 2; a++) {
        struct blocks src = make_blocks(&cfg, 42);
        struct tz_block_layout l;
        TZ_ASSERT_OK(tz_model_block_layout(&cfg, 1, &l));
        src.b[1][l.t[2].offset + at[a]] = bad[k];
        char name[128];
        TZ_ASSERT_OK(tz_hf_tensor_name(&cfg, 1, 2, name, sizeof name));
        char *dir = tz_test_mkdtemp("st-nan");
        TZ_ASSERT_OK(export_as(dir, &cfg, dts[d], get_block, &src));
        tz_hf_model *m;
        TZ_ASSERT_OK(tz_hf_open(dir, &m));
        float *buf = malloc(sizeof(float) * tz_model_block_numel(&cfg, 1));
        TZ_ASSERT_OK(tz_hf_read_block(m, 0, buf)); /* the other blocks are finite */
        assert_int_equal(tz_hf_read_block(m, 1, buf), TZ_EFORMAT);
        const char *msg = tz_err_msg();
        char *file = path_in(dir, "model.safetensors");
        assert_non_null(strstr(msg, file));
        char quoted[140], elem[32];
        snprintf(quoted, sizeof quoted, "'%s'", name);
        snprintf(elem, sizeof elem, "element %d is", at[a]);
        assert_non_null(strstr(msg, quoted));
        assert_non_null(strstr(msg, said[k]));
        if (!strstr(msg, elem))
          fail_msg("%s: no \"%s\"", msg, elem);
        free(file);
        free(buf);
        tz_hf_close(m);
        free_blocks(&src);
        tz_test_rmdir(dir);
      }
}

/* ---- reads shared by threads ---- */

/* One tensor "w" of n elements stored as dt into dir/name; values drawn from seed, finite except
 * for bad[0..nbad) (NaN, then +inf, then -inf). Returns the path. */
static char *write_big(const char *dir, const char *name, enum tz_dtype dt, uint64_t n,
                       const uint64_t *bad, int nbad) {
  char *p = path_in(dir, name);
  float *v = malloc(sizeof(float) * n);
  assert_non_null(v);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint64_t i = 0; i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = (float)((int64_t)(x >> 33) - (1ll << 30)) * 0x1p-30f; /* in [-1, 1) */
  }
  static const float nf[3] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < nbad; i++)
    v[bad[i]] = nf[i % 3];
  struct tz_st_entry e = {.name = "w", .dtype = dt, .ndim = 2, .shape = {(int64_t)(n / 8), 8}};
  assert_int_equal(n % 8, 0);
  tz_st_writer *w;
  TZ_ASSERT_OK(tz_st_writer_open(p, &e, 1, NULL, &w));
  TZ_ASSERT_OK(tz_st_writer_put(w, v, n));
  TZ_ASSERT_OK(tz_st_writer_close(w, 1));
  free(v);
  return p;
}

/* tensor "w" of p read with nt threads into a fresh buffer; *nonfinite as the reader says. */
static float *read_with(const char *p, int nt, int64_t *nonfinite) {
  tz_st_file *f;
  TZ_ASSERT_OK(tz_st_open(p, &f));
  tz_st_set_threads(f, nt);
  const struct tz_st_tensor *t = tz_st_find(f, "w");
  assert_non_null(t);
  float *out = malloc(sizeof(float) * t->numel);
  assert_non_null(out);
  TZ_ASSERT_OK(tz_st_read_tensor_f32(f, t, out, nonfinite));
  tz_st_close(f);
  return out;
}

/* A tensor of many read chunks (512 KiB for 2-byte dtypes, 4 MiB for F32), read by 1, 2, 3 and
 * 8 threads: the floats are bit for bit the same, and the first non-finite element reported is
 * the smallest index, in a later chunk, whichever thread read it; a second one further on, in a
 * chunk that may be read earlier, does not hide it. The same for three such tensors of three
 * files read as one batch. */
static void test_threads_same_result(void **state) {
  (void)state;
  static const enum tz_dtype dts[3] = {TZ_BF16, TZ_F16, TZ_F32};
  char *dir = tz_test_mkdtemp("st-threads");
  for (int d = 0; d < 3; d++) {
    uint64_t chunk = dts[d] == TZ_F32 ? (4u << 20) / 4 : (512u << 10) / 2; /* elements */
    uint64_t n = 6 * chunk + 1000;                                         /* 7 chunks */
    /* in chunk 4 (0-based) past its vectorised start, then in chunks 5 and 1 of a second file */
    const uint64_t one[2] = {4 * chunk + 77, 5 * chunk + 3}, two[2] = {5 * chunk + 9, chunk + 5};
    char *clean = write_big(dir, "clean.safetensors", dts[d], n, NULL, 0);
    char *bad1 = write_big(dir, "bad1.safetensors", dts[d], n, one, 2);
    char *bad2 = write_big(dir, "bad2.safetensors", dts[d], n, two, 2);
    int64_t nf;
    float *ref = read_with(clean, 1, &nf);
    assert_int_equal(nf, -1);
    static const int nts[4] = {1, 2, 3, 8};
    for (int k = 0; k < 4; k++) {
      float *got = read_with(clean, nts[k], &nf);
      assert_int_equal(nf, -1);
      for (uint64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], 4) != 0)
          fail_msg("dtype %d, %d threads: element %llu is %a, one thread read %a", d, nts[k],
                   (unsigned long long)i, (double)got[i], (double)ref[i]);
      free(got);
      got = read_with(bad1, nts[k], &nf);
      if (nf != (int64_t)one[0])
        fail_msg("dtype %d, %d threads: first non-finite %lld, want %llu", d, nts[k], (long long)nf,
                 (unsigned long long)one[0]);
      assert_true(isnan(got[one[0]]) && isinf(got[one[1]]));
      free(got);
      got = read_with(bad2, nts[k], &nf);
      if (nf != (int64_t)two[1])
        fail_msg("dtype %d, %d threads: first non-finite %lld, want %llu", d, nts[k], (long long)nf,
                 (unsigned long long)two[1]);
      free(got);
      /* the three as one batch, their chunks shared by the threads */
      const char *paths[3] = {bad1, clean, bad2};
      const int64_t want[3] = {(int64_t)one[0], -1, (int64_t)two[1]};
      tz_st_file *f[3];
      struct tz_st_read r[3];
      for (int i = 0; i < 3; i++) {
        TZ_ASSERT_OK(tz_st_open(paths[i], &f[i]));
        r[i] = (struct tz_st_read){.f = f[i], .t = tz_st_find(f[i], "w")};
        r[i].out = malloc(sizeof(float) * n);
      }
      TZ_ASSERT_OK(tz_st_read_tensors_f32(r, 3, nts[k]));
      for (int i = 0; i < 3; i++) {
        if (r[i].nonfinite != want[i])
          fail_msg("dtype %d, %d threads, batch: tensor %d's first non-finite %lld, want %lld", d,
                   nts[k], i, (long long)r[i].nonfinite, (long long)want[i]);
        tz_st_close(f[i]);
      }
      assert_memory_equal(r[1].out, ref, sizeof(float) * n);
      for (int i = 0; i < 3; i++)
        free(r[i].out);
    }
    free(ref);
    free(clean);
    free(bad1);
    free(bad2);
  }
  tz_test_rmdir(dir);
}

/* A file cut short after it was opened, at the start of chunk 3 of 8 or inside it: every
 * thread count fails with the error of chunk 3, naming the file, the tensor and the offset where
 * the file ends, though the chunks after it fail too, and may fail first (read many times over,
 * so that an order that hides chunk 3's error would show); alone, or in a batch after a whole
 * tensor of another file. */
static void test_threads_short_file(void **state) {
  (void)state;
  enum { READS = 32 };
  char *dir = tz_test_mkdtemp("st-threads");
  uint64_t chunk = (512u << 10) / 2, n = 8 * chunk;
  char *other = write_big(dir, "whole.safetensors", TZ_BF16, n, NULL, 0);
  tz_st_file *whole;
  TZ_ASSERT_OK(tz_st_open(other, &whole));
  float *out2 = malloc(sizeof(float) * n);
  static const int nts[4] = {1, 2, 3, 8};
  for (int k = 0; k < 4; k++)
    for (int inside = 0; inside < 2; inside++) {
      char *p = write_big(dir, "w.safetensors", TZ_BF16, n, NULL, 0);
      tz_st_file *f[READS];
      for (int r = 0; r < READS; r++) {
        TZ_ASSERT_OK(tz_st_open(p, &f[r]));
        tz_st_set_threads(f[r], nts[k]);
      }
      struct stat sb;
      assert_int_equal(stat(p, &sb), 0);
      uint64_t cut = (uint64_t)sb.st_size - 2 * n + 2 * (3 * chunk) + (inside ? 1000 : 0);
      assert_int_equal(truncate(p, (off_t)cut), 0);
      char want[64];
      snprintf(want, sizeof want, "file ends at offset %llu", (unsigned long long)cut);
      float *out = malloc(sizeof(float) * n);
      for (int r = 0; r < READS; r++) {
        int64_t nf;
        /* odd reads alone, even ones in a batch after a tensor of another file read whole */
        struct tz_st_read batch[2] = {{.f = whole, .t = tz_st_find(whole, "w"), .out = out2},
                                      {.f = f[r], .t = tz_st_find(f[r], "w"), .out = out}};
        int rc = r % 2 ? tz_st_read_tensor_f32(f[r], batch[1].t, out, &nf)
                       : tz_st_read_tensors_f32(batch, 2, nts[k]);
        assert_int_equal(rc, TZ_EIO);
        const char *msg = tz_err_msg();
        if (!strstr(msg, p) || !strstr(msg, "tensor 'w'") || !strstr(msg, want))
          fail_msg("%d threads: \"%s\" lacks the file, the tensor or \"%s\"", nts[k], msg, want);
        tz_st_close(f[r]);
      }
      free(out);
      free(p);
    }
  free(out2);
  tz_st_close(whole);
  free(other);
  tz_test_rmdir(dir);
}

/* Through the import: a block tensor of several chunks with a NaN in a later chunk is refused,
 * naming the tensor and the element's exact index (the reader's default threads). */
static void test_nonfinite_later_chunk_refused(void **state) {
  (void)state;
  struct tz_model_config cfg = cfg_small(1);
  cfg.vocab = 40000; /* the embedding, 40000 x 32 in bf16: 2.4 MiB, 5 chunks of 512 KiB */
  struct blocks src = make_blocks(&cfg, 42);
  uint64_t at = 4 * 262144 + 4321; /* in the last chunk */
  src.b[0][at] = NAN;
  src.b[0][at + 100000] = INFINITY; /* after it, in no earlier chunk: not the one reported */
  char *dir = tz_test_mkdtemp("st-nan");
  TZ_ASSERT_OK(export_as(dir, &cfg, TZ_BF16, get_block, &src));
  tz_hf_model *m;
  TZ_ASSERT_OK(tz_hf_open(dir, &m));
  float *buf = malloc(sizeof(float) * tz_model_block_numel(&cfg, 0));
  assert_int_equal(tz_hf_read_block(m, 0, buf), TZ_EFORMAT);
  char want[64];
  snprintf(want, sizeof want, "element %llu is nan", (unsigned long long)at);
  const char *msg = tz_err_msg();
  if (!strstr(msg, "'model.embed_tokens.weight'") || !strstr(msg, want))
    fail_msg("\"%s\" lacks the tensor or \"%s\"", msg, want);
  free(buf);
  tz_hf_close(m);
  free_blocks(&src);
  tz_test_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_f32_untied),
      cmocka_unit_test(test_round_trip_f32_tied),
      cmocka_unit_test(test_round_trip_bf16),
      cmocka_unit_test(test_round_trip_f16),
      cmocka_unit_test(test_model_through_files),
      cmocka_unit_test(test_sharded),
      cmocka_unit_test(test_export_replaced_whole),
      cmocka_unit_test(test_export_shards_verified),
      cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_bad_config),
      cmocka_unit_test(test_nonfinite_weight_refused),
      cmocka_unit_test(test_threads_same_result),
      cmocka_unit_test(test_threads_short_file),
      cmocka_unit_test(test_nonfinite_later_chunk_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
