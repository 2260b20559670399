/* tpflex backend support: what a backend needs beside tpflex_backend.h, for backends inside the
 * tree (backend_sim/, backend_cuda/) and outside it alike. A backend includes only public
 * headers: this one, tpflex_backend.h and its own.
 *
 * - Error helpers (macros): propagate a status, or record a detail for tpf_last_error() and
 *   return a status, in one line.
 * - Checked arithmetic (static inline): byte counts that cannot wrap.
 * - The library's allocator (exported by libtpflex): every allocation goes through the hooks of
 *   tpf_set_allocator and counts as live, so a backend's memory is accounted as the core's is
 *   (tpf_set_allocator refuses while any allocation is live) and a test's failure budget reaches
 *   the backend too.
 * - Versioned option structs (exported): the check of a `size` field against released layouts.
 * - The live-object table (exported): a backend's objects handed to users (the simulator's world)
 *   are entered at creation and removed at destroy, so a call on a destroyed one is TPF_EINVAL
 *   naming it instead of a use-after-free.
 *
 * Every function here is thread-safe. examples/loopback_backend/ is a backend built outside the
 * tree against the installed headers and library. */
#ifndef TPFLEX_BACKEND_SUPPORT_H
#define TPFLEX_BACKEND_SUPPORT_H

#include "tpflex_backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TPF_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Return a non-OK status of `expr` from the calling function. */
#define TPF_CHECK(expr)                                                                            \
  do {                                                                                             \
    tpf_status tpf_check_rc_ = (expr);                                                             \
    if (tpf_check_rc_ != TPF_OK) return tpf_check_rc_;                                             \
  } while (0)

/* Store the status of `expr` in rc and jump to the cleanup label when it is not TPF_OK. */
#define TPF_CHECK_GOTO(expr, rc, label)                                                            \
  do {                                                                                             \
    (rc) = (expr);                                                                                 \
    if ((rc) != TPF_OK) goto label;                                                                \
  } while (0)

/* When `cond` holds: record the printf-style detail (tpf_set_error) and return `code`. */
#define TPF_RETURN_IF(cond, code, ...)                                                             \
  do {                                                                                             \
    if (cond) return tpf_set_error((code), __VA_ARGS__);                                           \
  } while (0)

/* Checked arithmetic: true and *out = the result, or false with *out untouched on overflow. */
static inline bool tpf_add_u64(uint64_t a, uint64_t b, uint64_t *out) {
  if (a > UINT64_MAX - b) return false;
  *out = a + b;
  return true;
}
static inline bool tpf_mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}
static inline bool tpf_mul3_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t *out) {
  uint64_t ab;
  return tpf_mul_u64(a, b, &ab) && tpf_mul_u64(ab, c, out);
}

/* The library's allocator: the tpf_set_allocator hooks (the C library's by default), counted as
 * live until tpf_free. A size or count of 0 allocates 1 byte (never NULL for success). NULL on
 * failure, with no detail recorded: the caller names what it allocated (TPF_ENOMEM).
 * tpf_realloc(NULL, n) is tpf_malloc(n); tpf_free(NULL) does nothing. Memory from these must be
 * freed with tpf_free, never free(). */
TPF_API void *tpf_malloc(size_t n);
TPF_API void *tpf_calloc(size_t count, size_t n);
TPF_API void *tpf_realloc(void *p, size_t n);
TPF_API void tpf_free(void *p);

/* A versioned struct's `size` field (e.g. tpf_sim_config.size): TPF_OK when it is 0 (the
 * caller's header is the library's) or one of the `n` sizes of released layouts in `released`
 * (oldest first, the last is this header's); else TPF_EINVAL naming `who` (the call), `what` (the
 * argument, "options"), `type` (its struct, "tpf_sim_config"), the size and the accepted ones. */
TPF_API tpf_status tpf_check_struct_size(const char *who, const char *what, const char *type,
                                         size_t size, const size_t *released, size_t n);

/* The live-object table. Kinds name the object in messages; the core uses the first two, the
 * simulator and the fault wrapper the next two; any other value is named "object". */
enum { TPF_HANDLE_COMM = 1, TPF_HANDLE_MANAGER, TPF_HANDLE_WORLD, TPF_HANDLE_FAULT };
/* Enters a new object p of that kind: TPF_EINVAL for NULL, TPF_ENOMEM when the table cannot grow
 * (the object must then be destroyed: it is not live). */
TPF_API tpf_status tpf_handle_add(const void *p, int kind);
/* Removes p at destroy; `name` (may be NULL) is remembered for the messages of later calls on it
 * ("simulator world 'w0' (0x...) was destroyed"). Removing an absent p does nothing. */
TPF_API void tpf_handle_remove(const void *p, const char *name);
/* True when p is a live object of that kind. Reads nothing of *p. */
TPF_API bool tpf_handle_live(const void *p, int kind);
/* TPF_OK for a live object of that kind; else TPF_EINVAL naming `call` and why: NULL, destroyed
 * (with its name), or never created. Reads nothing of *p, so a destroyed p is safe to pass. */
TPF_API tpf_status tpf_handle_check(const void *p, int kind, const char *call);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_BACKEND_SUPPORT_H */
