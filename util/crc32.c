/* crc32 (util/crc32.h): slicing by 8, eight tables of the reflected polynomial 0xedb88320. */
#include "util/crc32.h"

#include <pthread.h>
#include <string.h>

static uint32_t tab[8][256];
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void tab_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++)
      c = c & 1 ? (c >> 1) ^ 0xedb88320u : c >> 1;
    tab[0][i] = c;
  }
  for (int t = 1; t < 8; t++)
    for (int i = 0; i < 256; i++)
      tab[t][i] = (tab[t - 1][i] >> 8) ^ tab[0][tab[t - 1][i] & 0xff];
}

uint32_t tz_crc32(uint32_t crc, const void *buf, size_t n) {
  pthread_once(&tab_once, tab_init);
  const unsigned char *p = buf;
  uint32_t c = ~crc;
  while (n >= 8) { /* little-endian: the first byte in the low bits */
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = tab[7][lo & 0xff] ^ tab[6][(lo >> 8) & 0xff] ^ tab[5][(lo >> 16) & 0xff] ^
        tab[4][lo >> 24] ^ tab[3][hi & 0xff] ^ tab[2][(hi >> 8) & 0xff] ^
        tab[1][(hi >> 16) & 0xff] ^ tab[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--)
    c = tab[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}
