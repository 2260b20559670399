/* Chrome trace JSON for the demo (the "Trace Event Format": complete events with ph "X", times
 * in microseconds, pid/tid metadata events naming the tracks). Spans arrive from many threads at
 * once (every stream worker of every rank), so the collector appends under a mutex and writes
 * everything at the end. */
#define _POSIX_C_SOURCE 200809L
#include "trace.h"

#include "tpflex/tpflex_backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int rank, tid;
  char name[48];
  char cat[40];
  uint64_t t0_ns, t1_ns, bytes, seq;
} trace_span;

struct tpf_trace {
  pthread_mutex_t mu;
  trace_span *spans;
  size_t count, cap;
  uint64_t dropped;
};

tpf_status tpf_trace_create(tpf_trace **out) {
  tpf_trace *t = calloc(1, sizeof *t);
  if (!t) return tpf_set_error(TPF_ENOMEM, "trace collector");
  pthread_mutex_init(&t->mu, NULL);
  *out = t;
  return TPF_OK;
}

void tpf_trace_destroy(tpf_trace *t) {
  if (!t) return;
  pthread_mutex_destroy(&t->mu);
  free(t->spans);
  free(t);
}

void tpf_trace_span(tpf_trace *t, int rank, int tid, const char *name, const char *cat,
                    uint64_t t0_ns, uint64_t t1_ns, uint64_t bytes, uint64_t seq) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  if (t->count == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 4096;
    trace_span *p = realloc(t->spans, cap * sizeof *p);
    if (!p) {
      t->dropped++;
      pthread_mutex_unlock(&t->mu);
      return;
    }
    t->spans = p;
    t->cap = cap;
  }
  trace_span *s = &t->spans[t->count++];
  s->rank = rank;
  s->tid = tid;
  snprintf(s->name, sizeof s->name, "%s", name ? name : "");
  snprintf(s->cat, sizeof s->cat, "%s", cat ? cat : "");
  s->t0_ns = t0_ns;
  s->t1_ns = t1_ns > t0_ns ? t1_ns : t0_ns;
  s->bytes = bytes;
  s->seq = seq;
  pthread_mutex_unlock(&t->mu);
}

#ifdef TPF_HAVE_SIM
void tpf_trace_sim_event(void *ctx, const tpf_sim_trace_event *ev) {
  char name[48];
  const char *k = tpf_step_kind_name(ev->kind);
  switch (ev->kind) {
  case TPF_STEP_SEND:
    snprintf(name, sizeof name, "%s c%d -> r%d", k, ev->chunk, ev->peer);
    break;
  case TPF_STEP_RECV:
    snprintf(name, sizeof name, "%s c%d <- r%d", k, ev->chunk, ev->peer);
    break;
  case TPF_STEP_BARRIER:
    snprintf(name, sizeof name, "%s %u", k, (unsigned)ev->tag);
    break;
  case TPF_STEP_HANDSHAKE:
    snprintf(name, sizeof name, "%s", k);
    break;
  default:
    snprintf(name, sizeof name, "%s c%d", k, ev->chunk);
    break;
  }
  tpf_trace_span((tpf_trace *)ctx, ev->rank, ev->stream, name, ev->comm, ev->t0_ns, ev->t1_ns,
                 ev->bytes, ev->seq);
}
#endif

uint64_t tpf_trace_count(const tpf_trace *t) {
  if (!t) return 0;
  pthread_mutex_lock((pthread_mutex_t *)&t->mu);
  uint64_t n = t->count;
  pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
  return n;
}

/* Names are ours (communicator and step names), but escape anyway: a JSON file must parse. */
static void put_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

/* The host track follows the stream tracks, which carry the core's stream names
 * (tpf_stream_name: "compute0" .. "compute2", "comm", "recv"; "?" outside them). */
_Static_assert(TPF_TRACE_HOST_TID == TPF_NUM_STREAMS, "the host track follows the streams");
static const char *track_name(int tid) {
  return tid == TPF_TRACE_HOST_TID ? "host" : tpf_stream_name(tid);
}

tpf_status tpf_trace_write(tpf_trace *t, const char *path, int tp_size) {
  if (!t || !path)
    return tpf_set_error(TPF_EINVAL, "tpf_trace_write: NULL %s", t ? "path" : "trace");
  FILE *f = fopen(path, "w");
  if (!f)
    return tpf_set_error(TPF_EBACKEND, "cannot open trace file '%s': %s", path, strerror(errno));
  pthread_mutex_lock(&t->mu);
  fprintf(f, "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
  bool first = true;
  for (int r = 0; r < tp_size; r++) {
    fprintf(f,
            "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
            first ? "" : ",\n", r, r);
    first = false;
    fprintf(
        f,
        ",\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}}",
        r, r);
    for (int tid = 0; tid <= TPF_TRACE_HOST_TID; tid++) {
      /* Host first, then the streams in their CUDA order. */
      int order = tid == TPF_TRACE_HOST_TID ? 0 : tid + 1;
      fprintf(f,
              ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":"
              "\"%s\"}}",
              r, tid, track_name(tid));
      fprintf(f,
              ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{"
              "\"sort_index\":%d}}",
              r, tid, order);
    }
  }
  for (size_t i = 0; i < t->count; i++) {
    const trace_span *s = &t->spans[i];
    fprintf(f, "%s{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":",
            first ? "" : ",\n", s->rank, s->tid, (double)s->t0_ns / 1000.0,
            (double)(s->t1_ns - s->t0_ns) / 1000.0);
    first = false;
    put_json_string(f, s->name);
    fprintf(f, ",\"cat\":");
    put_json_string(f, s->cat[0] ? s->cat : "tpflex");
    fprintf(f, ",\"args\":{\"comm\":");
    put_json_string(f, s->cat);
    fprintf(f, ",\"seq\":%llu,\"bytes\":%llu}}", (unsigned long long)s->seq,
            (unsigned long long)s->bytes);
  }
  fprintf(f, "\n]}\n");
  pthread_mutex_unlock(&t->mu);
  /* A write that failed earlier may have dropped its bytes; ferror remembers it. */
  const bool earlier = ferror(f) != 0;
  if (fclose(f) != 0)
    return tpf_set_error(TPF_EBACKEND, "writing trace file '%s': %s", path, strerror(errno));
  if (earlier)
    return tpf_set_error(TPF_EBACKEND, "writing trace file '%s': a write to it failed", path);
  return TPF_OK;
}
