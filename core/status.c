/* Status names, meanings and the thread-local failure detail. The three tables come from
 * TPF_STATUS_MAP so they cannot drift from the enum. */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The detail of the last failure on this thread. Thread-local, so ranks running as threads
 * (simulator, in-process CUDA) never see each other's messages. */
static _Thread_local char tpf_last_error_buf[512];

const char *tpf_status_name(tpf_status s) {
  switch (s) {
#define TPF_STATUS_NAME_(name, value, text)                                                        \
  case TPF_##name:                                                                                 \
    return "TPF_" #name;
    TPF_STATUS_MAP(TPF_STATUS_NAME_)
#undef TPF_STATUS_NAME_
  case TPF_STATUS_COUNT:
    break;
  }
  return "TPF_UNKNOWN";
}

const char *tpf_strerror(tpf_status s) {
  switch (s) {
#define TPF_STATUS_TEXT_(name, value, text)                                                        \
  case TPF_##name:                                                                                 \
    return text;
    TPF_STATUS_MAP(TPF_STATUS_TEXT_)
#undef TPF_STATUS_TEXT_
  case TPF_STATUS_COUNT:
    break;
  }
  return "unknown status";
}

const char *tpf_last_error(void) {
  return tpf_last_error_buf;
}

void tpf__clear_error(void) {
  tpf_last_error_buf[0] = '\0';
}

tpf_status tpf_set_error(tpf_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  /* vsnprintf formats into memory only; the core does no I/O. */
  (void)vsnprintf(tpf_last_error_buf, sizeof tpf_last_error_buf, fmt, ap);
  va_end(ap);
  return s;
}

tpf_status tpf_prefix_error(tpf_status s, const char *fmt, ...) {
  char prefix[sizeof tpf_last_error_buf];
  va_list ap;
  va_start(ap, fmt);
  const int k = vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  if (k <= 0) return s;
  const size_t n = (size_t)k < sizeof prefix ? (size_t)k : sizeof prefix - 1;
  if (strncmp(tpf_last_error_buf, prefix, n) == 0) return s; /* already there */
  const size_t room = sizeof tpf_last_error_buf - 1;
  size_t len = strlen(tpf_last_error_buf);
  if (n + len > room) len = room - n; /* the tail of the detail goes, not the prefix */
  memmove(tpf_last_error_buf + n, tpf_last_error_buf, len);
  memcpy(tpf_last_error_buf, prefix, n);
  tpf_last_error_buf[n + len] = '\0';
  return s;
}

tpf_status tpf_check_struct_size(const char *who, const char *what, const char *type, size_t size,
                                 const size_t *released, size_t n) {
  if (size == 0) return TPF_OK;
  for (size_t i = 0; i < n; i++)
    if (size == released[i]) return TPF_OK;
  char list[160];
  size_t used = 0;
  for (size_t i = 0; i < n && used < sizeof list; i++) {
    int k = snprintf(list + used, sizeof list - used, "%s%zu", i ? ", " : "", released[i]);
    if (k < 0) break;
    used += (size_t)k;
  }
  return tpf_set_error(TPF_EINVAL,
                       "%s: %s size %zu is not the size of a released %s layout (this library "
                       "knows %zu bytes); accepted sizes: 0 (this header's layout) or %s (start "
                       "from the _INIT macro)",
                       who, what, size, type, n ? released[n - 1] : (size_t)0, list);
}
