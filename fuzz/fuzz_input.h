/* Shared helpers of the fuzz targets: a data producer that turns the fuzzer's bytes into typed
 * parameters, and assertion macros that abort (so libFuzzer, AFL++ and the replay driver all see
 * an invariant violation as a crash).
 *
 * Every target is one .c file that defines only LLVMFuzzerTestOneInput (zstd's shape). The same
 * file builds three ways (see fuzz/CMakeLists.txt and fuzz/README.md):
 *  - libFuzzer: clang -fsanitize=fuzzer,address,undefined;
 *  - AFL++: afl-clang-fast -fsanitize=fuzzer (AFL's driver provides main);
 *  - replay: linked with fuzz_driver.c, a plain main() that CTest runs over fuzz/corpus/<target>.
 *
 * The producer reads parameters from the front of the input. When the bytes run out every
 * request returns its minimum, so any input (the empty one included) is a valid, deterministic
 * test case and short seeds stay meaningful when the fuzzer appends bytes. No state survives
 * between calls of LLVMFuzzerTestOneInput.
 */
#ifndef TPF_FUZZ_INPUT_H
#define TPF_FUZZ_INPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts with file:line, the failed condition and a formatted explanation. */
#define FUZZ_ASSERT_MSG(cond, ...)                                                                 \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: invariant failed: %s\n  ", __FILE__, __LINE__, #cond);               \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)
#define FUZZ_ASSERT(cond) FUZZ_ASSERT_MSG(cond, "(no detail)")

/* Asserts that a tpf_status expression equals `want`, naming both and the library's detail. */
#define FUZZ_ASSERT_STATUS(expr, want)                                                             \
  do {                                                                                             \
    tpf_status fuzz_got_ = (expr);                                                                 \
    tpf_status fuzz_want_ = (want);                                                                \
    FUZZ_ASSERT_MSG(fuzz_got_ == fuzz_want_, "%s returned %s, expected %s (detail: %s)", #expr,    \
                    tpf_status_name(fuzz_got_), tpf_status_name(fuzz_want_), tpf_last_error());    \
  } while (0)

typedef struct {
  const uint8_t *data;
  size_t size; /* bytes left */
} tpf_fuzz_input;

static inline void tpf_fuzz_init(tpf_fuzz_input *in, const uint8_t *data, size_t size) {
  in->data = data;
  in->size = data ? size : 0;
}

static inline bool tpf_fuzz_empty(const tpf_fuzz_input *in) {
  return in->size == 0;
}

/* The next `nbytes` (<= 8) bytes, little endian; missing bytes read as 0. */
static inline uint64_t tpf_fuzz_bytes(tpf_fuzz_input *in, unsigned nbytes) {
  uint64_t v = 0;
  for (unsigned i = 0; i < nbytes && in->size > 0; i++) {
    v |= (uint64_t)in->data[0] << (8 * i);
    in->data++;
    in->size--;
  }
  return v;
}

/* A value in [min, max] (inclusive), consuming as few bytes as the range needs. */
static inline uint64_t tpf_fuzz_range(tpf_fuzz_input *in, uint64_t min, uint64_t max) {
  if (max <= min) return min;
  uint64_t span = max - min;
  unsigned nbytes = 0;
  for (uint64_t s = span; s != 0; s >>= 8)
    nbytes++;
  uint64_t v = tpf_fuzz_bytes(in, nbytes);
  if (span == UINT64_MAX) return v;
  return min + v % (span + 1);
}

static inline int tpf_fuzz_int(tpf_fuzz_input *in, int min, int max) {
  return (int)((int64_t)min + (int64_t)tpf_fuzz_range(in, 0, (uint64_t)((int64_t)max - min)));
}

static inline bool tpf_fuzz_bool(tpf_fuzz_input *in) {
  return (tpf_fuzz_bytes(in, 1) & 1) != 0;
}

/* A dimension drawn from the values that break size arithmetic: zero and small values, powers
 * of two and their neighbours, multiples of `unit`, values near 2^40 (the ready word's rows
 * limit) and near 2^64 / k. `unit` biases towards divisible shapes (pass P). */
static inline uint64_t tpf_fuzz_dim(tpf_fuzz_input *in, uint64_t unit) {
  if (unit == 0) unit = 1;
  unsigned mode = (unsigned)tpf_fuzz_bytes(in, 1) % 10;
  switch (mode) {
  case 0:
  case 1:
  case 2: /* a small multiple of unit: the common, valid case */
    return unit * tpf_fuzz_range(in, 1, 16);
  case 3:
    return tpf_fuzz_range(in, 0, 255);
  case 4:
    return tpf_fuzz_range(in, 0, 65535);
  case 5: { /* 2^k - 1, 2^k, 2^k + 1 */
    unsigned k = (unsigned)tpf_fuzz_range(in, 0, 63);
    int d = tpf_fuzz_int(in, -1, 1);
    return (1ull << k) + (uint64_t)(int64_t)d;
  }
  case 6: { /* near the 40-bit rows limit of the ready word */
    int d = tpf_fuzz_int(in, -2, 2);
    return (1ull << 40) + (uint64_t)(int64_t)d;
  }
  case 7: /* near 2^64 / k: overflows once multiplied by a few more factors */
    return UINT64_MAX / tpf_fuzz_range(in, 1, 4096);
  case 8:
    return unit * tpf_fuzz_range(in, 1, 1u << 20);
  default:
    return tpf_fuzz_bytes(in, 8);
  }
}

/* A deterministic generator for choices once the input ran out (xorshift64*). */
typedef struct {
  uint64_t s;
} tpf_fuzz_rng;

static inline void tpf_fuzz_rng_seed(tpf_fuzz_rng *g, const uint8_t *data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the whole input */
  for (size_t i = 0; i < size; i++)
    h = (h ^ data[i]) * 0x100000001b3ull;
  g->s = h ? h : 0x9e3779b97f4a7c15ull;
}

static inline uint64_t tpf_fuzz_rng_next(tpf_fuzz_rng *g) {
  g->s ^= g->s >> 12;
  g->s ^= g->s << 25;
  g->s ^= g->s >> 27;
  return g->s * 0x2545f4914f6cdd1dull;
}

/* A choice in [0, n): from the input while it lasts, then from the generator. */
static inline unsigned tpf_fuzz_choose(tpf_fuzz_input *in, tpf_fuzz_rng *g, unsigned n) {
  if (n <= 1) return 0;
  if (!tpf_fuzz_empty(in)) return (unsigned)tpf_fuzz_range(in, 0, n - 1);
  return (unsigned)(tpf_fuzz_rng_next(g) % n);
}

#endif /* TPF_FUZZ_INPUT_H */
