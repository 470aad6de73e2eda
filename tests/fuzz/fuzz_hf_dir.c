/* Fuzz target: a Hugging Face model directory (trainer/model/hf.h, tz_hf_open and
 * tz_hf_read_block), as tz-train --import-safetensors and --model DIR read one.
 *
 * The directory is tierzero's own export of a tiny Llama (2 layers, float32, shards of at most
 * 600 bytes: twelve safetensors files and model.safetensors.index.json, whose metadata gives
 * each shard's size and crc32c), made once; each input then changes it.
 *
 * Input: u8 flags, then bytes; by flags & 3:
 * - 0: the index is the input's bytes;
 * - 1: config.json is (the tensors the shards hold then need not be those it asks for);
 * - 2: the export's index without metadata.tierzero_shards (as save_pretrained writes it: no
 *   sizes or checksums to check the shards against), and the input's bytes (u16 offset, then
 *   data) written over shard (flags >> 4) % 12 from that offset, so that mutations reach the
 *   safetensors headers and tensors;
 * - 3: the same under the export's index, whose checksums refuse the changed shard.
 *
 * Besides memory errors and undefined behaviour, it checks: a refusal names a file of the
 * directory; a directory that opens has the export's config; and when no shard was changed,
 * every block reads back to the bits exported (the values given, the layout's padding zero).
 * TZ_FUZZ_SEEDS=DIR writes the export's index and config.json into DIR as inputs (modes 0 and 1;
 * tests/fuzz/corpus/hf_dir/index_export, config_export). */
#define _GNU_SOURCE
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "tests/fuzz/fuzz_files.h"
#include "trainer/model/hf.h"
#include "trainer/model/model.h"

#define MAX_FILES 24

static char root[256], dir[300];
static struct tz_model_config cfg;
static struct {
  char path[400];
  uint8_t *data;
  size_t n;
} files[MAX_FILES];
static int n_files, shard_of[MAX_FILES], n_shards, index_file = -1, config_file = -1;
static uint8_t *bare_index; /* the index without metadata.tierzero_shards */
static size_t bare_n;
static float *ref[64]; /* each block as the pristine directory reads */

static float value(int block, size_t i) {
  return (float)((int)((block * 131 + (int)(i % 1009) * 7) % 97) - 48) / 64.0f;
}

static int get_block(void *arg, int block, float *buf) {
  (void)arg;
  for (uint64_t i = 0; i < tz_model_block_numel(&cfg, block); i++)
    buf[i] = value(block, i);
  return 0;
}

static void cleanup(void) {
  for (int i = 0; i < n_files; i++)
    unlink(files[i].path);
  rmdir(dir);
  rmdir(root);
}

static uint8_t *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f)
    abort();
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  rewind(f);
  uint8_t *b = malloc(len > 0 ? (size_t)len : 1);
  if (!b || (len > 0 && fread(b, 1, (size_t)len, f) != (size_t)len))
    abort();
  fclose(f);
  *n = (size_t)len;
  return b;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  tz_log_set_level(TZ_LOG_ERROR);
  fuzz_tmpdir(root, sizeof root, "hfdir");
  snprintf(dir, sizeof dir, "%s/model", root);
  cfg = (struct tz_model_config){.d_model = 8,
                                 .n_layer = 2,
                                 .n_head = 2,
                                 .n_kv_head = 1,
                                 .ffn_dim = 16,
                                 .vocab = 32,
                                 .max_seq = 16,
                                 .rope_theta = 10000,
                                 .norm_eps = 1e-5,
                                 .family = TZ_FAMILY_LLAMA};
  struct tz_hf_export_opts o;
  tz_hf_export_opts_init(&o);
  o.dtype = TZ_F32;
  o.shard_bytes = 600;
  if (tz_hf_export(dir, &cfg, &o, get_block, NULL) < 0) {
    fprintf(stderr, "fuzz_hf_dir: export: %s\n", tz_err_msg());
    abort();
  }
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort);
  for (int i = 0; i < n; i++) {
    if (names[i]->d_name[0] != '.') {
      if (n_files == MAX_FILES)
        abort();
      snprintf(files[n_files].path, sizeof files[n_files].path, "%s/%s", dir, names[i]->d_name);
      files[n_files].data = slurp(files[n_files].path, &files[n_files].n);
      if (strstr(names[i]->d_name, ".safetensors.index.json"))
        index_file = n_files;
      else if (strstr(names[i]->d_name, ".safetensors"))
        shard_of[n_shards++] = n_files;
      else if (strcmp(names[i]->d_name, "config.json") == 0)
        config_file = n_files;
      n_files++;
    }
    free(names[i]);
  }
  free(names);
  if (index_file < 0 || config_file < 0 || n_shards < 2)
    abort();
  /* the index as save_pretrained writes it: "metadata" with total_size only */
  json_t *ix = json_loadb((const char *)files[index_file].data, files[index_file].n, 0, NULL);
  json_t *meta = ix ? json_object_get(ix, "metadata") : NULL;
  if (!meta || json_object_del(meta, "tierzero_shards") < 0)
    abort();
  char *text = json_dumps(ix, JSON_INDENT(2));
  if (!text)
    abort();
  bare_index = (uint8_t *)text;
  bare_n = strlen(text);
  json_decref(ix);
  atexit(cleanup);
  /* TZ_FUZZ_SEEDS=DIR: the export's index and config.json as inputs, for the corpus */
  const char *seeds = getenv("TZ_FUZZ_SEEDS");
  for (int k = 0; seeds && k < 2; k++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", seeds, k ? "config_export" : "index_export");
    uint8_t mode = (uint8_t)k;
    int f = k ? config_file : index_file;
    fuzz_put2(path, &mode, 1, files[f].data, files[f].n);
  }
  /* the blocks as the export reads back: the values given, padding zero */
  tz_hf_model *m = NULL;
  if (tz_model_n_blocks(&cfg) > 64 || tz_hf_open(dir, &m) < 0)
    abort();
  for (int b = 0; b < tz_model_n_blocks(&cfg); b++) {
    uint64_t numel = tz_model_block_numel(&cfg, b), nonzero = 0;
    ref[b] = malloc(numel * sizeof *ref[b]);
    if (!ref[b] || tz_hf_read_block(m, b, ref[b]) < 0)
      abort();
    for (uint64_t i = 0; i < numel; i++) {
      if (ref[b][i] != value(b, i) && ref[b][i] != 0.0f)
        abort();
      nonzero += ref[b][i] != 0.0f;
    }
    if (nonzero == 0)
      abort();
  }
  tz_hf_close(m);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const int flags = data[0];
  data++, size--;
  for (int i = 0; i < n_files; i++)
    fuzz_put(files[i].path, files[i].data, files[i].n);
  int shards_changed = 0;
  switch (flags & 3) {
  case 0: fuzz_put(files[index_file].path, data, size); break;
  case 1: fuzz_put(files[config_file].path, data, size); break;
  default: /* a shard patched from the input's offset, under either index */
    if (size < 2)
      return 0;
    if ((flags & 3) == 2)
      fuzz_put(files[index_file].path, bare_index, bare_n);
    int f = shard_of[(flags >> 4) % n_shards];
    size_t off = ((size_t)data[0] | (size_t)data[1] << 8) % (files[f].n + 1);
    size_t n = off + size - 2 > files[f].n ? off + size - 2 : files[f].n;
    uint8_t *b = malloc(n);
    if (!b)
      abort();
    memcpy(b, files[f].data, files[f].n < n ? files[f].n : n);
    memcpy(b + off, data + 2, size - 2);
    fuzz_put(files[f].path, b, n);
    free(b);
    shards_changed = 1;
  }
  tz_hf_model *m = NULL;
  tz_err_clear();
  if (tz_hf_open(dir, &m) < 0) {
    const char *msg = tz_err_msg();
    if (!msg || !*msg || !strstr(msg, dir)) {
      fprintf(stderr, "fuzz_hf_dir: a refusal that names no file of the directory: %s\n",
              msg ? msg : "");
      abort();
    }
    return 0;
  }
  const struct tz_model_config *got = tz_hf_config(m);
  if ((flags & 3) == 1) { /* another config: its blocks are read, not compared */
    for (int b = 0; b < tz_model_n_blocks(got); b++) {
      float *buf = malloc(tz_model_block_numel(got, b) * sizeof *buf);
      if (!buf)
        abort();
      if (tz_hf_read_block(m, b, buf) < 0 && !strstr(tz_err_msg(), dir)) {
        fprintf(stderr, "fuzz_hf_dir: block %d: %s\n", b, tz_err_msg());
        abort();
      }
      free(buf);
    }
    tz_hf_close(m);
    return 0;
  }
  if (got->d_model != cfg.d_model || got->n_layer != cfg.n_layer || got->vocab != cfg.vocab ||
      got->ffn_dim != cfg.ffn_dim || got->n_kv_head != cfg.n_kv_head)
    abort();
  for (int b = 0; b < tz_model_n_blocks(&cfg); b++) {
    uint64_t numel = tz_model_block_numel(&cfg, b);
    float *buf = malloc(numel * sizeof *buf);
    if (!buf)
      abort();
    int rc = tz_hf_read_block(m, b, buf);
    if (rc < 0 && (shards_changed == 0 || !strstr(tz_err_msg(), dir))) {
      fprintf(stderr, "fuzz_hf_dir: block %d: %s\n", b, tz_err_msg());
      abort();
    }
    if (rc == 0 && !shards_changed && memcmp(buf, ref[b], numel * sizeof *buf) != 0) {
      fprintf(stderr, "fuzz_hf_dir: block %d reads other bits than exported\n", b);
      abort();
    }
    free(buf);
  }
  tz_hf_close(m);
  return 0;
}
