/* crc32c (util/crc32c.h): the SSE4.2 instruction where the CPU has it, else a table. */
#include "util/crc32c.h"

#include <pthread.h>
#include <string.h>

/* Software table for machines without SSE4.2 (reflected polynomial 0x82f63b78). */
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_hw;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    crc_table[i] = c;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n) {
  while (n--)
    crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw64(uint32_t crc, const unsigned char *p,
                                                           size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = (uint32_t)c;
  while (n--)
    c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}
#endif

uint32_t tz_crc32c(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&crc_once, crc_init);
  crc = ~crc;
#if defined(__x86_64__)
  if (crc_hw)
    return ~crc_hw64(crc, buf, n);
#endif
  return ~crc_sw(crc, buf, n);
}
