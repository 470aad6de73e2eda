/* The on-disk layout of a checkpoint rank file and manifest (docs/checkpoints.md), shared by
 * checkpoint.c and the tests and fuzz target that build or damage files on purpose. Every integer
 * is little-endian.
 *
 * rank-NNNNN.bin:
 *   [0, 4096)            header: magic "TZCKPT01", u32 version (that of the manifest), u32 rank,
 * u32 world, u32 alignment (4096), u64 step, u32 crc32c of bytes [0, 32); zeros sections each
 * payload starts at a multiple of 4096; zeros pad the gaps index                at index_offset (a
 * multiple of 4096): per section, in write order, u64 offset, u64 bytes, u32 crc32c of the payload,
 * u16 kind, u16 name length, the name (no NUL) trailer              the file's last 64 bytes: magic
 * "TZCKIDX1", u64 index_offset, u64 index_bytes, u32 sections, u32 crc32c of the index, u64 step,
 *                        u32 rank, u32 world, u64 file bytes, u32 zero, u32 crc32c of [0, 60)
 *
 * manifest: one line "tierzero-checkpoint <version> <body bytes> <crc32c of body, 8 hex>\n",
 * then the body: JSON {"step": N, "world": W, "ranks": [{"file": "rank-00000.bin", "bytes": B,
 * "index_crc32c": C}, ...]}. */
#ifndef TZ_TRAINER_CHECKPOINT_FORMAT_H
#define TZ_TRAINER_CHECKPOINT_FORMAT_H

#include <stdint.h>
#include <string.h>

#define TZ_CKPT_MAGIC "TZCKPT01"
#define TZ_CKPT_INDEX_MAGIC "TZCKIDX1"
/* 2: the "state" section records the model and the weight-decay exclusion
 * (trainer/checkpoint/resume.h); the files' layout is that of 1, which still loads. */
#define TZ_CKPT_VERSION 2
#define TZ_CKPT_VERSION_MIN 1
#define TZ_CKPT_ALIGN 4096u
#define TZ_CKPT_HEADER_BYTES 4096u
#define TZ_CKPT_HEADER_CRC_AT 32 /* the header's crc covers [0, 32) and sits here */
#define TZ_CKPT_TRAILER_BYTES 64u
#define TZ_CKPT_TRAILER_CRC_AT 60 /* the trailer's crc covers [0, 60) */
#define TZ_CKPT_TRAILER_INDEX_CRC_AT 28
#define TZ_CKPT_ENTRY_FIXED 24u /* an index entry without its name */
#define TZ_CKPT_MANIFEST "manifest"
#define TZ_CKPT_MANIFEST_TAG "tierzero-checkpoint"
#define TZ_CKPT_LATEST "latest"

enum { TZ_CKPT_KIND_BYTES = 0, TZ_CKPT_KIND_JSON = 1 };

static inline void tz_ckpt_put_le(uint8_t *p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t tz_ckpt_get_le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

#endif
