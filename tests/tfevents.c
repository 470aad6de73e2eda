/* The tests' reader of TensorBoard event files (tfevents.h). */
#include "tfevents.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/crc32c.h"

/* TFRecord's masked CRC32C. */
static uint32_t masked(const void *p, size_t n) {
  uint32_t c = tz_crc32c(0, p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

struct pb {
  const unsigned char *p, *end;
};

static uint64_t varint(struct pb *b) {
  uint64_t v = 0;
  for (int shift = 0; b->p < b->end && shift < 64; shift += 7) {
    unsigned char c = *b->p++;
    v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80))
      return v;
  }
  fail_msg("truncated varint");
  return 0;
}

static void parse_value(struct pb b, struct tfev *e) {
  assert_true(e->n < TFEV_MAX_VALUES);
  int has_tag = 0, has_value = 0;
  while (b.p < b.end) {
    uint64_t key = varint(&b);
    if (key == (1 << 3 | 2)) {
      uint64_t len = varint(&b);
      assert_true(len <= TFEV_MAX_TAG && len <= (uint64_t)(b.end - b.p));
      memcpy(e->tag[e->n], b.p, len);
      e->tag[e->n][len] = 0;
      b.p += len;
      has_tag = 1;
    } else if (key == (2 << 3 | 5)) {
      assert_true(b.end - b.p >= 4);
      memcpy(&e->value[e->n], b.p, 4);
      b.p += 4;
      has_value = 1;
    } else {
      fail_msg("unexpected field key %llu in a Summary.Value", (unsigned long long)key);
    }
  }
  assert_true(has_tag && has_value);
  e->n++;
}

static void parse_event(const unsigned char *p, size_t n, struct tfev *e) {
  memset(e, 0, sizeof *e);
  struct pb b = {p, p + n};
  while (b.p < b.end) {
    uint64_t key = varint(&b);
    if (key == (1 << 3 | 1)) {
      assert_true(b.end - b.p >= 8);
      memcpy(&e->wall, b.p, 8);
      b.p += 8;
    } else if (key == (2 << 3 | 0)) {
      e->has_step = 1;
      e->step = (int64_t)varint(&b);
    } else if (key == (3 << 3 | 2)) {
      uint64_t len = varint(&b);
      assert_true(len < sizeof e->version && len <= (uint64_t)(b.end - b.p));
      memcpy(e->version, b.p, len);
      b.p += len;
    } else if (key == (5 << 3 | 2)) {
      uint64_t len = varint(&b);
      assert_true(len <= (uint64_t)(b.end - b.p));
      struct pb s = {b.p, b.p + len};
      while (s.p < s.end) {
        assert_int_equal(varint(&s), 1 << 3 | 2);
        uint64_t vl = varint(&s);
        assert_true(vl <= (uint64_t)(s.end - s.p));
        parse_value((struct pb){s.p, s.p + vl}, e);
        s.p += vl;
      }
      b.p += len;
    } else {
      fail_msg("unexpected field key %llu in an Event", (unsigned long long)key);
    }
  }
}

/* Reads every record of path into ev[0..max), checking both CRCs of each and that the file ends
 * at a record's end; returns the count. */
int tfev_read(const char *path, struct tfev *ev, int max) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  int n = 0;
  unsigned char head[12];
  size_t got;
  while ((got = fread(head, 1, 12, f)) == 12) {
    uint64_t len = 0;
    uint32_t crc = 0;
    for (int i = 7; i >= 0; i--)
      len = len << 8 | head[i];
    for (int i = 11; i >= 8; i--)
      crc = crc << 8 | head[i];
    assert_int_equal(crc, masked(head, 8));
    assert_true(len < 1 << 20);
    unsigned char *data = malloc(len + 4);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, len + 4, f), len + 4);
    crc = (uint32_t)data[len] | (uint32_t)data[len + 1] << 8 | (uint32_t)data[len + 2] << 16 |
          (uint32_t)data[len + 3] << 24;
    assert_int_equal(crc, masked(data, len));
    assert_true(n < max);
    parse_event(data, len, &ev[n++]);
    free(data);
  }
  assert_int_equal(got, 0); /* no partial record */
  fclose(f);
  return n;
}

float tfev_scalar(const struct tfev *e, const char *tag) {
  for (int i = 0; i < e->n; i++)
    if (strcmp(e->tag[i], tag) == 0)
      return e->value[i];
  print_error("the event at %lld has no scalar %s\n", (long long)e->step, tag);
  fail();
  return 0;
}

int tfev_has(const struct tfev *e, const char *tag) {
  for (int i = 0; i < e->n; i++)
    if (strcmp(e->tag[i], tag) == 0)
      return 1;
  return 0;
}
