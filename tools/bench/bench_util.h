/* The leaf of `tpflex bench` (bench_util.c): the clock, median and quantile, allocator accounting
 * and the report (tables on stdout and in the CSV/JSON files, notes, the progress line). It knows
 * nothing of groups, backends or sections. */
#ifndef TPF_BENCH_UTIL_H
#define TPF_BENCH_UTIL_H

#include "tpflex/tpflex.h"

#include <stdio.h>

/* ---- report ---- */

/* Starts a table: id (CSV/JSON name), a title line, and `ncols` column headers. Rows follow with
 * bench_cell_* and bench_row_end; each row is printed as soon as it is complete. */
void bench_table(const char *id, const char *title, int ncols, const char *const *cols);
void bench_cell_s(const char *s);
void bench_cell_i(long long v);
void bench_cell_f(double v, int prec); /* NaN prints "n/a" (JSON null) */
void bench_row_end(void);
/* A comment line under the current table ("# ..."), kept in the JSON as a note. */
void bench_note(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* The progress line on stderr (overwritten in place on a terminal). */
void bench_progress(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
void bench_progress_done(void);
/* The run's description (command, date, shape), the first line of the CSV and the JSON "meta". */
void bench_report_set_meta(const char *line);
/* Every table so far into an open file (CSV, JSON); the caller checks the writes and closes it
 * (tools/cmd_bench.c, cli_finish_output). */
void bench_report_write_csv(FILE *f);
void bench_report_write_json(FILE *f);
/* Frees every table. */
void bench_report_free(void);

/* ---- statistics and the clock ---- */
double bench_now_ns(void);
double bench_median(double *v, int n);             /* sorts v */
double bench_quantile(double *v, int n, double q); /* v sorted */

/* ---- allocator accounting ---- */
/* Installs counting allocator hooks (tpf_set_allocator): only before any tpflex object exists. */
tpf_status bench_alloc_count_start(void);
/* Allocations made through tpflex's allocator hooks since start (malloc, calloc, realloc). */
long long bench_alloc_calls(void);

#endif /* TPF_BENCH_UTIL_H */
