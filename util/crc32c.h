/* crc32c (Castagnoli): the checksum of checkpoint files and of verified tier reads. */
#ifndef TZ_UTIL_CRC32C_H
#define TZ_UTIL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes of buf; hardware-accelerated where the CPU has SSE4.2,
 * with the same result as the table for every input. Thread-safe. */
uint32_t tz_crc32c(uint32_t crc, const void *buf, size_t n);

#endif
