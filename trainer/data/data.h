/* Training data: token streams from raw text, llm.c token shards or the built-in corpus, cut
 * into windows of T+1 tokens, and served in an order that is a pure function of (seed, global
 * sample index), so every world size and every resume point sees the same samples.
 *
 * Sources (the spec given to tz_data_open):
 *   NULL or "builtin"   the built-in corpus (trainer/data/corpus.h), byte tokens
 *   "text:PATH"         PATH read as raw bytes, one token per byte
 *   "PATH"              an llm.c shard when PATH ends in ".bin" or starts with the shard magic,
 *                       otherwise raw text
 *   "DIR/x_*.bin"       a glob (any of * ? [): every match, in sorted order, must be a shard
 * An llm.c shard is a header of 256 little-endian int32 ([0] magic 20240520, [1] version, [2]
 * number of tokens), then the tokens: version 1 holds uint16 (GPT-2), version 7 uint32 (Llama-3).
 * Files are memory-mapped; every token is checked against the vocabulary when the data is opened.
 *
 * Sidecars: tools/tz-data writes beside each shard PATH a JSON file PATH.json naming the
 * tokenizer that made it (the sha256 of its tokenizer.json, its vocabulary size, its bos, eos
 * and pad ids) and what the shard holds (documents, tokens). When a shard has one, it is read
 * and checked at open: a tokenizer vocabulary larger than the model's is refused, so is a
 * tokenizer.json other than tz_data_params.tokenizer (by hash, naming both files), so are two
 * shards of one data set made by different tokenizers. docs/data.md has the format.
 *
 * Windows: a file of n tokens holds (n - 1) / T windows; window w is tokens [w*T, w*T + T + 1)
 * of its file (inputs are the first T, targets the last T). Windows never cross files. All
 * windows of all files, in file order, are numbered 0..N-1; the last n_val of them are the
 * validation split and the rest the training split.
 *
 * Order: training sample i (a global index over all ranks and steps) is window
 * perm(seed, epoch = i / n_train)(i % n_train) of the training split, perm being a bijection on
 * [0, n_train) computed by a keyed Feistel network with cycle walking (tz_data_permute).
 * Validation sample i is validation window i % n_val, in order. Rank r of a world of W at step s,
 * micro-batch a of A, micro-batch size B reads the B consecutive global indices starting at
 * tz_data_sample_index(s, A, a, W, r, B) = ((s*A + a)*W + r)*B: the ranks of one micro-batch
 * read disjoint samples, and together the same ones a single rank with a micro-batch of W*B
 * reads. docs/data.md has the details. */
#ifndef TZ_TRAINER_DATA_H
#define TZ_TRAINER_DATA_H

#include <stdint.h>

#define TZ_DATA_SHARD_MAGIC 20240520
#define TZ_DATA_SHARD_HEADER_INTS 256
#define TZ_DATA_SHARD_HEADER_BYTES (TZ_DATA_SHARD_HEADER_INTS * 4)
/* Mask files (PATH.mask beside shard PATH, tools/tz-data's for fine-tuning data): the shard's
 * header size, [0] this magic, [1] version 1, [2] the shard's token count, [3] the zlib crc32 of
 * the shard's token bytes, [4] that of the mask bytes, [5] targets, [6] documents; then a byte a
 * token. docs/data.md has the format. */
#define TZ_DATA_MASK_MAGIC 20261205
#define TZ_DATA_MASK_TARGET 1 /* the token is a target: trained to be predicted */
#define TZ_DATA_MASK_START 2  /* a document starts at the token */

typedef struct tz_data tz_data;

enum tz_data_split {
  TZ_DATA_TRAIN, /* shuffled, epoch after epoch */
  TZ_DATA_VAL,   /* the held-out windows, in order */
};

struct tz_data_params {
  int seq_len;           /* T >= 1: a sample is T+1 tokens */
  double val_fraction;   /* in [0, 1): share of the windows held out (rounded up), when val_tokens
                            is 0 and val_spec NULL */
  uint64_t val_tokens;   /* > 0: hold out ceil(val_tokens / T) windows instead */
  const char *val_spec;  /* non-NULL: the validation split is this source instead (all of its
                            windows), and nothing of spec is held out */
  uint64_t seed;         /* the order of the training split is a function of it */
  const char *tokenizer; /* non-NULL: the tokenizer.json every sidecar must name (its sha256) */
  int split_long;        /* packed documents longer than T + 1 tokens: 0 cut to their first T + 1
                            (the rest is not trained on), 1 split into pieces of T + 1 that share
                            a token, each a document of its own (positions restart) */
};

/* What the sidecars of the data say about the tokenizer that made it. */
struct tz_data_tokenizer {
  int known;       /* 0: no shard has a sidecar, and nothing below is set */
  char sha256[65]; /* of its tokenizer.json, lowercase hex */
  char path[256];  /* the sidecar it was read from (the first one) */
  int vocab;       /* the tokenizer's vocabulary size */
  int has_bos, has_eos, has_pad;
  int bos_id, eos_id, pad_id;
};

/* Opens the source named by spec (see above) for a model with vocabulary vocab. *out owns its
 * mappings; free with tz_data_destroy. Errors, each with the file named:
 *   TZ_ENOENT  no such file, or a glob that matches nothing
 *   TZ_EFORMAT a malformed shard (bad magic, unknown version, a size that disagrees with the
 *              header: "file X: header says N tokens (M bytes) but the file has K bytes after the
 *              header"), or a token >= vocab ("file X: token 300 at byte offset 1040 (token 8) is
 *              not below the vocabulary size 256")
 *   TZ_ECONFIG a sidecar that cannot be read or disagrees: with the model's vocabulary (a
 *              larger tokenizer vocabulary), with params' tokenizer (another sha256, both
 *              files named), with its shard (another token count), or with another sidecar
 *   TZ_EINVAL  bad params, or too few tokens for one training window (or one validation window
 *              when a validation split is asked for)
 *   TZ_EIO/TZ_EPERM  the file cannot be read or mapped */
int tz_data_open(const char *spec, int vocab, const struct tz_data_params *p, tz_data **out);
void tz_data_destroy(tz_data *d); /* NULL is a no-op */

int tz_data_seq_len(const tz_data *d);                              /* T */
uint64_t tz_data_n_samples(const tz_data *d, enum tz_data_split s); /* windows in the split */
uint64_t tz_data_n_tokens(const tz_data *d);                        /* tokens of every file */
int tz_data_n_files(const tz_data *d);
/* The tokenizer of the data (the first sidecar's; every sidecar of the training and the
 * validation sets agrees). Valid while d lives. */
const struct tz_data_tokenizer *tz_data_tokenizer(const tz_data *d);
/* The SHA-256 of the file at path as 64 lowercase hex digits into hex. TZ_EIO (errno's code)
 * naming the file when it cannot be read. */
int tz_data_file_sha256(const char *path, char hex[65]);
/* One line for the log: "2 llm.c shards (v1), 1048576 tokens; 4000 train + 40 val windows of
 * 257 tokens". Valid while d lives. */
const char *tz_data_describe(const tz_data *d);

/* The first global sample index of micro-batch a (of A) of rank r (of W) at step s, B samples
 * per micro-batch: ((s*A + a)*W + r)*B. */
uint64_t tz_data_sample_index(uint64_t step, int A, int a, int W, int r, int B);

/* Samples first .. first+B-1 of the split into tokens (B, T+1), row b the T+1 tokens of sample
 * first+b. TZ_EINVAL for the validation split when there is none. d is only read: several
 * threads may fetch batches at once (a loader thread ahead of the step, say); the first touch of
 * a page of a file on disk is a page fault, which such a thread keeps off the training loop. */
int tz_data_batch(const tz_data *d, enum tz_data_split s, uint64_t first, int B, int32_t *tokens);
/* The same, split into the model's inputs (B, T) and next-token targets (B, T). */
int tz_data_batch_io(const tz_data *d, enum tz_data_split s, uint64_t first, int B, int32_t *inputs,
                     int32_t *targets);
/* inputs, targets and pos (B, T) each; pos may be NULL. Packed rows: each row's documents one
 * after the other, a target TZ_TARGET_IGNORE (-1) where the next token is not one (a prompt's,
 * padding), pos each token's position in its document (kernels/compute.h, "Packed documents");
 * the padding after them is token 0, never a target, and a document of its own. Windows: as
 * tz_data_batch_io, pos 0..T-1. */
int tz_data_batch_docs(const tz_data *d, enum tz_data_split s, uint64_t first, int B,
                       int32_t *inputs, int32_t *targets, int32_t *pos);
/* 1 when the samples are packed rows of documents: the shards have mask files (tools/tz-data's
 * fine-tuning data), and every split's rows are built by best-fit decreasing at open
 * (trainer/data/pack.h) from the documents the masks delimit. Each row is T predictions, so
 * tz_data_n_samples counts rows; the order of rows is that of windows (below). */
int tz_data_packed(const tz_data *d);
/* The targets in samples first .. first+n-1 of the split: n * T for windows, the targets of the
 * rows for packed data (the loss's divisor of a step: tz_step_docs). */
uint64_t tz_data_targets(const tz_data *d, enum tz_data_split s, uint64_t first, uint64_t n);
/* For packed data one line for the log: documents, rows, the targets' share of the row tokens,
 * how many were cut or split and how many had no target; "" otherwise. */
const char *tz_data_pack_describe(const tz_data *d);
/* The window a sample reads: its index among all windows (0..N-1, file order), for tests and
 * for logging what a step saw. */
uint64_t tz_data_window(const tz_data *d, enum tz_data_split s, uint64_t sample);

/* The permutation of [0, n) for (seed, epoch): a bijection, a pure function of its arguments.
 * i must be < n. */
uint64_t tz_data_permute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t i);

#endif
