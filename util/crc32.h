/* crc32 (IEEE 802.3, zlib's crc32): the checksum of tools/tz-data's mask files, which Python's
 * zlib.crc32 computes on the writing side. (Checkpoints and tier reads use crc32c.) */
#ifndef TZ_UTIL_CRC32_H
#define TZ_UTIL_CRC32_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes of buf: zlib's crc32(crc, buf, n). Thread-safe. */
uint32_t tz_crc32(uint32_t crc, const void *buf, size_t n);

#endif
