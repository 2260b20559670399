/* `tpflex bench`'s leaf: the clock, median and quantile, allocator accounting and the report
 * (aligned tables on stdout, nccl-tests style, kept for the CSV and JSON files; notes; the progress
 * line on stderr). It calls no other bench file.
 *
 * Output conventions follow nccl-tests (doc/PERFORMANCE.md): size is the whole array of the
 * collective in bytes (T*H*e), time is the median over the timed repetitions in microseconds,
 * algbw = size / time, busbw = algbw * (P-1)/P for all-gather and reduce-scatter, and #wrong
 * counts result elements outside the SPEC §7 tolerance, checked in the same run. */
#define _POSIX_C_SOURCE 200809L
#include "bench_util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- allocator accounting ----------------------------------------------------------------- */

static atomic_llong alloc_count;
static void *count_malloc(size_t n) {
  atomic_fetch_add(&alloc_count, 1);
  return malloc(n);
}
static void *count_calloc(size_t c, size_t n) {
  atomic_fetch_add(&alloc_count, 1);
  return calloc(c, n);
}
static void *count_realloc(void *p, size_t n) {
  atomic_fetch_add(&alloc_count, 1);
  return realloc(p, n);
}
static void count_free(void *p) {
  free(p);
}
tpf_status bench_alloc_count_start(void) {
  return tpf_set_allocator(count_malloc, count_calloc, count_realloc, count_free);
}
long long bench_alloc_calls(void) {
  return atomic_load(&alloc_count);
}

/* ---- helpers ------------------------------------------------------------------------------- */

double bench_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
double bench_median(double *v, int n) {
  if (n <= 0) return NAN;
  qsort(v, (size_t)n, sizeof(double), cmp_double);
  return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double bench_quantile(double *v, int n, double q) {
  if (n <= 0) return NAN;
  int i = (int)(q * (n - 1) + 0.5);
  return v[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}

/* ---- report ------------------------------------------------------------------------------- */

#define BENCH_MAX_COLS 20
typedef struct {
  int kind; /* 0 string, 1 integer, 2 float */
  long long i;
  double f;
  int prec;
  char s[80];
} cell_value;
typedef struct {
  char id[32];
  char title[200];
  int ncols;
  char cols[BENCH_MAX_COLS][24];
  int width[BENCH_MAX_COLS];
  cell_value *cells; /* rows * ncols */
  int nrows, cap_rows;
  char **notes;
  int nnotes;
} table;

static table *tables;
static int ntables;
static cell_value row_cells[BENCH_MAX_COLS];
static int ncells;
static bool progress_live;
static char meta[2048];

static void progress_clear(void) {
  if (progress_live) {
    fprintf(stderr, "\r%-100s\r", "");
    progress_live = false;
  }
}

void bench_table(const char *id, const char *title, int ncols, const char *const *cols) {
  progress_clear();
  tables = realloc(tables, (size_t)(ntables + 1) * sizeof(*tables));
  table *t = &tables[ntables++];
  memset(t, 0, sizeof(*t));
  snprintf(t->id, sizeof(t->id), "%s", id);
  snprintf(t->title, sizeof(t->title), "%s", title);
  t->ncols = ncols > BENCH_MAX_COLS ? BENCH_MAX_COLS : ncols;
  printf("\n# %s\n#", title);
  for (int c = 0; c < t->ncols; c++) {
    snprintf(t->cols[c], sizeof(t->cols[c]), "%s", cols[c]);
    int w = (int)strlen(cols[c]) + 1;
    t->width[c] = c == 0 ? 28 : (w < 9 ? 9 : w);
    if (c == 0)
      printf("%-*s", t->width[c] - 1, cols[c]);
    else
      printf(" %*s", t->width[c], cols[c]);
  }
  printf("\n");
  fflush(stdout);
  ncells = 0;
}

static cell_value *next_cell(void) {
  if (ncells >= BENCH_MAX_COLS) ncells = BENCH_MAX_COLS - 1;
  cell_value *c = &row_cells[ncells++];
  memset(c, 0, sizeof(*c));
  return c;
}
void bench_cell_s(const char *s) {
  cell_value *c = next_cell();
  c->kind = 0;
  snprintf(c->s, sizeof(c->s), "%s", s);
}
void bench_cell_i(long long v) {
  cell_value *c = next_cell();
  c->kind = 1;
  c->i = v;
}
void bench_cell_f(double v, int prec) {
  cell_value *c = next_cell();
  c->kind = 2;
  c->f = v;
  c->prec = prec;
}

static void cell_text(const cell_value *c, char *buf, size_t len) {
  if (c->kind == 0)
    snprintf(buf, len, "%s", c->s);
  else if (c->kind == 1)
    snprintf(buf, len, "%lld", c->i);
  else if (isnan(c->f))
    snprintf(buf, len, "n/a");
  else
    snprintf(buf, len, "%.*f", c->prec, c->f);
}

void bench_row_end(void) {
  if (ntables == 0) return;
  progress_clear();
  table *t = &tables[ntables - 1];
  if (t->nrows == t->cap_rows) {
    t->cap_rows = t->cap_rows ? 2 * t->cap_rows : 16;
    t->cells = realloc(t->cells, (size_t)t->cap_rows * (size_t)t->ncols * sizeof(cell_value));
  }
  for (int c = 0; c < t->ncols; c++) {
    cell_value v;
    if (c < ncells)
      v = row_cells[c];
    else {
      memset(&v, 0, sizeof(v));
      v.kind = 0;
    }
    t->cells[(size_t)t->nrows * (size_t)t->ncols + (size_t)c] = v;
    char buf[96];
    cell_text(&v, buf, sizeof(buf));
    if (c == 0)
      printf("%-*s", t->width[c], buf);
    else if (v.kind == 0 && c == t->ncols - 1)
      printf(" %s", buf);
    else
      printf(" %*s", t->width[c], buf);
  }
  printf("\n");
  fflush(stdout);
  t->nrows++;
  ncells = 0;
}

uint64_t bench_sim_arena_mib = 1024;

void bench_note(const char *fmt, ...) {
  /* Any length: a legend is one line however long it is (a fixed 512-byte buffer cut them). */
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  /* The simulator names its own knob (tpf_sim_config.arena_bytes); bench's is --arena-mib. */
  const size_t cap = (size_t)n + 128;
  char *buf = malloc(cap);
  if (!buf) return;
  va_start(ap, fmt);
  vsnprintf(buf, cap, fmt, ap);
  va_end(ap);
  if (strstr(buf, "simulator arena") != NULL)
    snprintf(buf + n, cap - (size_t)n, " -- tpflex bench: raise it with --arena-mib, now %llu",
             (unsigned long long)bench_sim_arena_mib);
  progress_clear();
  printf("# %s\n", buf);
  fflush(stdout);
  if (ntables == 0) {
    free(buf);
    return;
  }
  table *t = &tables[ntables - 1];
  t->notes = realloc(t->notes, (size_t)(t->nnotes + 1) * sizeof(char *));
  t->notes[t->nnotes++] = buf;
}

void bench_progress(const char *fmt, ...) {
  char buf[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (isatty(2)) {
    fprintf(stderr, "\r%-100.100s", buf);
    progress_live = true;
  } else {
    fprintf(stderr, "%s\n", buf);
  }
  fflush(stderr);
}
void bench_progress_done(void) {
  progress_clear();
}

void bench_report_set_meta(const char *line) {
  snprintf(meta, sizeof(meta), "%s", line);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      fprintf(f, "\\u%04x", (unsigned char)*s);
    else
      fputc(*s, f);
  }
  fputc('"', f);
}

/* One CSV field: as is, or quoted (RFC 4180) when it holds a comma, a quote or a line break, as
 * the operation names "serial_ag,gemm" and "serial_gemm,rs" do. */
static void csv_field(FILE *f, const char *s) {
  if (!strpbrk(s, ",\"\r\n")) {
    fprintf(f, ",%s", s);
    return;
  }
  fputs(",\"", f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

void bench_report_write_csv(FILE *f) {
  fprintf(f, "# %s\n", meta);
  for (int i = 0; i < ntables; i++) {
    table *t = &tables[i];
    fprintf(f, "table");
    for (int c = 0; c < t->ncols; c++)
      csv_field(f, t->cols[c]);
    fprintf(f, "\n");
    for (int r = 0; r < t->nrows; r++) {
      fprintf(f, "%s", t->id);
      for (int c = 0; c < t->ncols; c++) {
        char buf[96];
        cell_text(&t->cells[(size_t)r * (size_t)t->ncols + (size_t)c], buf, sizeof(buf));
        csv_field(f, buf);
      }
      fprintf(f, "\n");
    }
  }
}

void bench_report_write_json(FILE *f) {
  fprintf(f, "{\n  \"tool\": \"tpflex bench\",\n  \"meta\": ");
  json_str(f, meta);
  fprintf(f, ",\n  \"tables\": [");
  for (int i = 0; i < ntables; i++) {
    table *t = &tables[i];
    fprintf(f, "%s\n    {\"id\": ", i ? "," : "");
    json_str(f, t->id);
    fprintf(f, ", \"title\": ");
    json_str(f, t->title);
    fprintf(f, ",\n     \"columns\": [");
    for (int c = 0; c < t->ncols; c++) {
      fprintf(f, "%s", c ? ", " : "");
      json_str(f, t->cols[c]);
    }
    fprintf(f, "],\n     \"rows\": [");
    for (int r = 0; r < t->nrows; r++) {
      fprintf(f, "%s\n       [", r ? "," : "");
      for (int c = 0; c < t->ncols; c++) {
        const cell_value *v = &t->cells[(size_t)r * (size_t)t->ncols + (size_t)c];
        fprintf(f, "%s", c ? ", " : "");
        if (v->kind == 0)
          json_str(f, v->s);
        else if (v->kind == 1)
          fprintf(f, "%lld", v->i);
        else if (isnan(v->f) || isinf(v->f))
          fprintf(f, "null");
        else
          fprintf(f, "%.*f", v->prec, v->f);
      }
      fprintf(f, "]");
    }
    fprintf(f, "],\n     \"notes\": [");
    for (int n = 0; n < t->nnotes; n++) {
      fprintf(f, "%s", n ? ", " : "");
      json_str(f, t->notes[n]);
    }
    fprintf(f, "]}");
  }
  fprintf(f, "\n  ]\n}\n");
}

void bench_report_free(void) {
  for (int i = 0; i < ntables; i++) {
    free(tables[i].cells);
    for (int n = 0; n < tables[i].nnotes; n++)
      free(tables[i].notes[n]);
    free(tables[i].notes);
  }
  free(tables);
  tables = NULL;
  ntables = 0;
}
